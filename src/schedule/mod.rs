//! Scheduling a run: the planner streams (shape, method) groups to one lane per
//! GPU, a compile pool works ahead of the lanes, and every finished job comes
//! back as an event that the journal, the progress display and the final
//! outputs consume. Timed work on one GPU never overlaps; CPU work does.
//!
//! [`run`] reads as its phases:
//! 1. [`Resume::read`]: what the results directory already holds;
//! 2. [`count_plan`]: the jobs to run (a bad `--only` or manifest, or a plan
//!    with nothing to run, stops here);
//! 3. [`Workers::start`]: the compile pool and the first lane's worker, which
//!    must answer before anything is written; then
//!    [`preflight::check_problem`]: the problem imports, has its methods, and
//!    its space values have the types they declare;
//! 4. [`Journal::open`]: the results directory and its lock, the run header.
//!    Until here a refused run leaves nothing behind ([`preflight::CreatedDirs`]);
//! 5. [`drain`]: planner, lanes and the journal's single writer until done;
//! 6. the outputs, regenerated from the journal.

pub mod compile;
pub mod lane;
pub mod preflight;
pub mod progress;

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::python::Hello;
use crate::backend::{Backend, Flush, JobFailure, PythonBackend, SampleMode, WorkerSpec};
use crate::device::DeviceInfo;
use crate::diag::Diagnostic;
use crate::manifest::{Experiment, MethodKind, Shape, Tolerance};
use crate::measure::{L2Flush, Protocol};
use crate::plan::{self, Filter, Job, Mode, PlanOptions, RunMode};
use crate::search::{PriorObservation, Strategies};
use crate::store::{
    Entry, FinalRecord, Fingerprint, JobRecord, JobStatus, Journal, MethodRecord, OutputSpec,
    Results, RunHeader, SearchRecord, StoreError, FORMAT_VERSION,
};

/// Groups the planner may queue ahead of the lanes (and so the compile pool
/// ahead of the GPU): enough to keep 16 compile workers busy on spaces of a
/// few dozen configs, few enough to hold in memory on any plan.
const GROUPS_AHEAD: usize = 16;

/// All jobs of one method at one shape: the unit a lane takes.
pub struct Group {
    pub shape: Shape,
    pub method: String,
    pub kernel: String,
    pub kind: MethodKind,
    pub jobs: Vec<Job>,
}

pub enum Event {
    Job(Box<JobRecord>),
    Final(FinalRecord),
}

pub struct RunOptions<'a> {
    pub exp: &'a Experiment,
    pub device: DeviceInfo,
    /// CUDA_VISIBLE_DEVICES values, one lane each; empty in interpreter mode.
    pub gpus: Vec<String>,
    pub mode: Mode,
    pub run_mode: RunMode,
    pub filter: Filter,
    pub python: String,
    /// Folders put first on the workers' PYTHONPATH.
    pub python_path: Vec<PathBuf>,
    pub results_dir: PathBuf,
    pub compile_workers: usize,
    /// Only these job ids (from `--use-best`), besides baselines.
    pub only_jobs: Option<HashSet<String>>,
    pub progress: bool,
}

#[derive(Debug, Default)]
pub struct RunOutcome {
    pub dir: PathBuf,
    pub planned: u64,
    pub skipped: u64,
    pub ok: u64,
    pub failed: u64,
    pub pruned: u64,
    /// Never run: the surrogate spent its budget on other configs.
    pub skipped_by_search: u64,
    /// Never run: the method cannot run here (vLLM not installed, say).
    pub unavailable: u64,
    pub checked: u64,
    pub interrupted: bool,
    pub fingerprint_changes: Vec<String>,
    pub wall_s: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Input(crate::diag::Diagnostics),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Environment(String),
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Ctrl-C finishes the job in flight, records it, and stops.
fn install_interrupt_handler() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
}

/// The directory a run writes: `results/<experiment>/<device>/`.
pub fn results_dir(base: &Path, exp: &Experiment, device: &DeviceInfo, mode: Mode) -> PathBuf {
    let device_dir = match mode {
        Mode::Interpreter => "cpu-interpreter".to_string(),
        Mode::Gpu => device.vllm_name.clone(),
    };
    base.join(&exp.name).join(device_dir)
}

/// The protocol a run actually uses: the interpreter gets a token one, since
/// its timings mean nothing and each launch takes seconds.
pub fn effective_protocol(p: &Protocol, mode: Mode) -> Protocol {
    match mode {
        Mode::Gpu => p.clone(),
        Mode::Interpreter => p.for_interpreter(),
    }
}

pub fn run(opts: RunOptions<'_>, fingerprint_base: Fingerprint) -> Result<RunOutcome, RunError> {
    let started = Instant::now();
    install_interrupt_handler();
    let exp = opts.exp;
    let protocol = effective_protocol(&exp.protocol, opts.mode);
    // Halving keeps at least the finalists of the protocol this run uses.
    let strategies = exp.strategies(protocol.finalists);
    let dir = results_dir(&opts.results_dir, exp, &opts.device, opts.mode);
    let mut created = preflight::CreatedDirs::before(&dir);

    // A directory that holds results is locked and repaired before it is
    // read, so what is read is what this run appends to and no other run
    // starts workers against it. A new one is made only once the run starts.
    let existing = if dir.exists() {
        Some(open_journal(&dir)?)
    } else {
        None
    };
    let resume = Resume::read(&dir, &strategies, opts.run_mode, &protocol, exp)?;
    let select = Selection {
        done: &resume.done,
        run_mode: opts.run_mode,
        only: opts.only_jobs.as_ref(),
    };
    let plan_opts = PlanOptions {
        device: &opts.device,
        filter: &opts.filter,
        mode: opts.mode,
    };
    let (planned, skipped, first_shape) = count_plan(exp, &plan_opts, &select)?;
    let Some(first_shape) = first_shape else {
        let use_best = opts.only_jobs.is_some();
        return Err(RunError::Input(
            preflight::no_jobs(exp, &opts.filter, opts.mode, opts.run_mode, use_best).into(),
        ));
    };

    let timeout = Duration::from_secs_f64(protocol.timeout_s);
    let workers = Workers::start(&opts, &dir, timeout);
    let tolerance = match (opts.mode, &exp.interpreter) {
        (Mode::Interpreter, Some(i)) => {
            i.tolerance.clone().unwrap_or_else(|| exp.tolerance.clone())
        }
        _ => exp.tolerance.clone(),
    };
    let run = Drain {
        opts: &opts,
        protocol,
        tolerance,
        strategies: &strategies,
        prior: &resume.prior,
        select: &select,
        plan_opts: &plan_opts,
    };
    let mut outcome = RunOutcome {
        dir: dir.clone(),
        planned,
        skipped,
        ..Default::default()
    };
    let opening = Opening {
        dir: &dir,
        existing,
        created: &mut created,
        first_shape: &first_shape,
        previous: resume.previous.header.as_ref(),
        fingerprint: fingerprint_base,
    };
    drain(&run, workers, opening, &mut outcome)?;
    outcome.interrupted = interrupted();
    outcome.wall_s = started.elapsed().as_secs_f64();
    Ok(outcome)
}

/// Locks and opens a results directory's journal, saying at once what it repaired.
fn open_journal(dir: &Path) -> Result<Journal, RunError> {
    let (journal, repaired) = Journal::open(dir)?;
    if let Some(notice) = repaired {
        eprintln!("warning: {notice}");
    }
    Ok(journal)
}

/// What a results directory already holds, read before anything is written.
struct Resume {
    previous: Results,
    /// Jobs this run need not run again.
    done: HashSet<String>,
    /// What earlier runs measured, by group, for a strategy that learns from it.
    prior: HashMap<String, Vec<PriorObservation>>,
}

impl Resume {
    fn read(
        dir: &Path,
        strategies: &Strategies,
        run_mode: RunMode,
        protocol: &Protocol,
        exp: &Experiment,
    ) -> Result<Resume, RunError> {
        // A first run has no journal yet.
        let (previous, warnings) = if crate::store::journal::exists(dir) {
            crate::store::journal::read(dir)?
        } else {
            Default::default()
        };
        for w in &warnings {
            eprintln!("warning: {w}");
        }
        if let Some(h) = &previous.header {
            if h.protocol.timing != protocol.timing && run_mode != RunMode::Check {
                return Err(RunError::Input(
                    Diagnostic::in_file(
                        &exp.manifest_path,
                        format!(
                            "the journal's jobs were timed {} and this run would time them {}: one ranking would mix the two",
                            h.protocol.timing.as_str(),
                            protocol.timing.as_str()
                        ),
                    )
                    .help(format!(
                        "set `protocol: {{timing: {}}}` to go on with {}, time the other way in `retime_with:`, or pass a fresh --results-dir",
                        h.protocol.timing.as_str(),
                        dir.display()
                    ))
                    .into(),
                ));
            }
            if let Some(message) = flush_conflict(h.protocol.flush, protocol.flush) {
                return Err(RunError::Input(
                    Diagnostic::in_file(&exp.manifest_path, message)
                        .help(format!(
                            "set `protocol: {{flush_with: {}}}` to go on with {}, or pass a fresh --results-dir",
                            h.protocol.flush.as_str(),
                            dir.display()
                        ))
                        .into(),
                ));
            }
        }
        let done = previous
            .jobs
            .iter()
            .filter(|r| match run_mode {
                RunMode::Check => r.status != JobStatus::Skipped,
                // A config a strategy skipped was never run: only a strategy
                // that keeps its skips leaves it unrun.
                _ if r.status == JobStatus::Skipped => {
                    run_mode == RunMode::Tune
                        && r.failure.is_none()
                        && strategies.for_method(&r.method).keeps_skipped()
                }
                _ => r.status != JobStatus::Checked,
            })
            .map(|r| r.job_id.clone())
            .collect();
        let prior = if strategies.any_learns() && run_mode == RunMode::Tune {
            lane::prior_observations(&previous.jobs)
        } else {
            HashMap::new()
        };
        Ok(Resume {
            previous,
            done,
            prior,
        })
    }
}

/// Plans once to count the jobs to run and those already done, so progress
/// has a total and a bad filter or space stops the run before it starts.
/// Also returns the first selected job's shape, if any job is selected.
fn count_plan(
    exp: &Experiment,
    plan_opts: &PlanOptions<'_>,
    select: &Selection<'_>,
) -> Result<(u64, u64, Option<Shape>), RunError> {
    let (mut planned, mut skipped, mut first) = (0u64, 0u64, None);
    plan::plan(exp, plan_opts, &mut |job| {
        match select.keep(&job, exp) {
            Keep::Run => planned += 1,
            Keep::Done => skipped += 1,
            Keep::No => return ControlFlow::Continue(()),
        }
        if first.is_none() {
            first = Some(job.shape);
        }
        ControlFlow::Continue(())
    })
    .map_err(|d| RunError::Input(d.into()))?;
    Ok((planned, skipped, first))
}

/// How a worker of a role, for a device, logging to a file, is started.
type SpecFor = dyn Fn(&str, Option<String>, String) -> WorkerSpec;

/// The Python workers of a run: a compile pool, and the first lane's worker
/// starting on a thread of its own (importing torch takes seconds).
struct Workers {
    pool: Option<compile::CompilePool>,
    first_lane: std::thread::JoinHandle<(PythonBackend, Result<Hello, JobFailure>)>,
    /// Starts the worker of every further lane.
    spec: Box<SpecFor>,
    lanes: Vec<Option<String>>,
    timeout: Duration,
}

impl Workers {
    /// Starts the compile pool first (its workers import Triton while the
    /// lane's worker imports torch), and the first lane's worker; neither
    /// is waited for here.
    fn start(opts: &RunOptions<'_>, dir: &Path, timeout: Duration) -> Workers {
        let exp = opts.exp;
        let lanes: Vec<Option<String>> = if opts.mode == Mode::Interpreter || opts.gpus.is_empty() {
            vec![None]
        } else {
            opts.gpus.iter().cloned().map(Some).collect()
        };
        let logs = dir.join("logs");
        let triton_cache = dir.join(".cache").join("triton");
        let (python, python_path) = (opts.python.clone(), opts.python_path.clone());
        let interpret = opts.mode == Mode::Interpreter;
        let spec = move |role: &str, device: Option<String>, name: String| WorkerSpec {
            python: python.clone(),
            python_path: python_path.clone(),
            role: role.to_string(),
            interpret,
            visible_device: device,
            target: None,
            triton_cache: Some(triton_cache.clone()),
            log: logs.join(name),
        };
        let use_pool =
            opts.mode == Mode::Gpu && opts.compile_workers > 0 && opts.run_mode != RunMode::Check;
        let pool = use_pool.then(|| {
            // Only tunelab's own problems are known to compile without torch; a
            // user's problem gets compile workers that see the GPU, as lanes do.
            let target = compile_target(&opts.device).filter(|_| exp.builtin_problem());
            let workers = (0..opts.compile_workers)
                .map(|i| {
                    let mut s = spec("compile", lanes[0].clone(), format!("compile{i}.log"));
                    s.target = target.clone();
                    PythonBackend::new(s, &exp.problem, timeout)
                })
                .collect();
            compile::CompilePool::start(workers)
        });
        let mut first = PythonBackend::new(
            spec("lane", lanes[0].clone(), "lane0.log".into()),
            &exp.problem,
            timeout,
        );
        let first_lane = std::thread::spawn(move || {
            let hello = first.hello();
            (first, hello)
        });
        Workers {
            pool,
            first_lane,
            spec: Box::new(spec),
            lanes,
            timeout,
        }
    }
}

/// What the run needs to open its journal once its first worker answered.
struct Opening<'a> {
    dir: &'a Path,
    /// The journal of a directory that already held results, locked.
    existing: Option<Journal>,
    created: &'a mut preflight::CreatedDirs,
    first_shape: &'a Shape,
    /// The journal's last run header, to report what changed since.
    previous: Option<&'a RunHeader>,
    fingerprint: Fingerprint,
}

/// The journal header of this run.
fn run_header(
    opts: &RunOptions<'_>,
    protocol: &Protocol,
    tolerance: &Tolerance,
    descriptions: &HashMap<String, String>,
    fingerprint: Fingerprint,
    planned: u64,
) -> RunHeader {
    let exp = opts.exp;
    RunHeader {
        format: FORMAT_VERSION,
        experiment: exp.name.clone(),
        description: exp.description.clone(),
        problem: exp.problem.clone(),
        mode: opts.mode,
        run_mode: opts.run_mode,
        device: opts.device.clone(),
        outputs: exp
            .outputs
            .iter()
            .map(|o| OutputSpec {
                format: o.format,
                path: o.path.clone(),
                method: o.method.clone(),
                legacy_keys: o.legacy_keys,
            })
            .collect(),
        protocol: protocol.clone(),
        search: SearchRecord::from(&exp.search),
        tolerance: tolerance.clone(),
        methods: exp
            .methods
            .iter()
            .map(|m| MethodRecord {
                name: m.name.clone(),
                kind: m.kind,
                kernel: m.kernel.clone(),
                description: descriptions.get(&m.kernel).cloned(),
                baseline: m.baseline.as_ref().map(|b| b.name.clone()),
                search: m.search.as_ref().map(SearchRecord::from),
            })
            .collect(),
        compared: exp.compared.clone(),
        fingerprint,
        started_at: now_rfc3339(),
        planned_jobs: planned,
    }
}

/// Everything the drain phase shares with its threads.
struct Drain<'a> {
    opts: &'a RunOptions<'a>,
    protocol: Protocol,
    tolerance: Tolerance,
    strategies: &'a Strategies,
    prior: &'a HashMap<String, Vec<PriorObservation>>,
    select: &'a Selection<'a>,
    plan_opts: &'a PlanOptions<'a>,
}

/// Runs the plan to the end (or to Ctrl-C). The planner starts at once,
/// feeding the compile pool while the first lane's worker imports torch;
/// then the worker must answer and the problem load (else the run stops,
/// having written nothing), the journal opens with the run's header, the
/// lanes start, and this thread becomes the journal's single writer: every
/// record is on disk before the next is read.
fn drain(
    run: &Drain<'_>,
    workers: Workers,
    opening: Opening<'_>,
    outcome: &mut RunOutcome,
) -> Result<(), RunError> {
    let opts = run.opts;
    let Workers {
        pool,
        first_lane,
        spec,
        lanes,
        timeout,
    } = workers;
    let flush = match (opts.mode, run.protocol.flush) {
        (Mode::Gpu, L2Flush::Read | L2Flush::Memset) => Flush {
            with: run.protocol.flush,
            bytes: run.protocol.flush_bytes_for(opts.device.l2_bytes),
        },
        _ => Flush::NONE,
    };
    let unused_board = compile::CompileBoard::default();
    let board = pool.as_ref().map_or(&unused_board, |p| p.board());
    let use_pool = pool.is_some();
    let peak = |dtype: Option<&str>| -> f64 {
        match dtype {
            Some("fp32") => opts.device.peak_tflops_fp32,
            Some("fp8") => opts.device.peak_tflops_fp8,
            Some("fp16") => opts.device.peak_tflops_fp16,
            _ => opts.device.peak_tflops_bf16,
        }
    };
    let lane_opts = LaneOptions {
        run,
        sampling: SampleMode {
            timing: run.protocol.timing,
            flush,
            graph_calls: run.protocol.graph_calls,
        },
        peak: &peak,
        board: use_pool.then_some(board),
    };
    let result = std::thread::scope(|scope| -> Result<(), RunError> {
        // Groups queued ahead of the lanes; the compile pool sees their jobs
        // as soon as they are queued, so this is also how far ahead it
        // compiles. The queue lives in this closure: whatever ends it drops
        // the queue, and the planner, finding no reader, stops.
        let (group_tx, group_rx) = mpsc::sync_channel::<Group>(GROUPS_AHEAD);
        let group_rx = Arc::new(Mutex::new(group_rx));
        let planner = spawn_planner(scope, run, group_tx, use_pool.then_some(board));

        let (mut first, hello) = first_lane.join().expect("lane start-up thread");
        // The failure's message says what to do.
        let hello = hello.map_err(|f| RunError::Environment(f.message))?;
        let descriptions =
            preflight::check_problem(opts.exp, &mut first, opening.first_shape, &opts.python)
                .map_err(RunError::Input)?;
        let mut journal = match opening.existing {
            Some(journal) => journal,
            None => open_journal(opening.dir)?,
        };
        opening.created.keep();
        let mut fingerprint = opening.fingerprint;
        fingerprint.python = Some(hello.python.clone());
        fingerprint.torch = hello.torch.clone();
        fingerprint.triton = hello.triton.clone();
        fingerprint.cuda = hello.cuda.clone();
        outcome.fingerprint_changes = opening
            .previous
            .map(|h| diff_fingerprint(&h.fingerprint, &fingerprint))
            .unwrap_or_default();
        journal.append(&Entry::Run(Box::new(run_header(
            opts,
            &run.protocol,
            &run.tolerance,
            &descriptions,
            fingerprint,
            outcome.planned,
        ))))?;

        let (event_tx, event_rx) = mpsc::channel::<Event>();
        spawn_lanes(
            scope, &lane_opts, first, &spec, &lanes, timeout, &group_rx, &event_tx,
        );
        drop((event_tx, group_rx));
        let mut display = progress::Progress::new(outcome.planned, opts.progress);
        for event in event_rx {
            match event {
                Event::Job(record) => {
                    match record.status {
                        JobStatus::Ok => outcome.ok += 1,
                        JobStatus::Failed => outcome.failed += 1,
                        JobStatus::Pruned => outcome.pruned += 1,
                        JobStatus::Skipped if record.failure.is_some() => outcome.unavailable += 1,
                        JobStatus::Skipped => outcome.skipped_by_search += 1,
                        JobStatus::Checked => outcome.checked += 1,
                    }
                    display.job(&record);
                    let appended = Instant::now();
                    journal.append(&Entry::Job(record))?;
                    crate::trace::span("journal", "append", appended, serde_json::json!({}));
                }
                Event::Final(f) => journal.append(&Entry::Final(f))?,
            }
        }
        display.finish();
        planner
            .join()
            .expect("planner thread")
            .map_err(|d| RunError::Input(d.into()))
    });
    // The compile workers have drained their queue by now; wait for them to exit.
    drop(pool);
    result
}

/// What every lane of a run shares.
struct LaneOptions<'a> {
    run: &'a Drain<'a>,
    sampling: SampleMode,
    peak: &'a (dyn Fn(Option<&str>) -> f64 + Sync),
    board: Option<&'a compile::CompileBoard>,
}

/// One thread per lane, each owning one GPU's worker: it takes groups from
/// the queue until the queue closes, the run is interrupted or the journal's
/// writer is gone, then shuts its worker down.
#[allow(clippy::too_many_arguments)]
fn spawn_lanes<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    o: &'scope LaneOptions<'env>,
    first_lane: PythonBackend,
    spec: &SpecFor,
    lanes: &[Option<String>],
    timeout: Duration,
    group_rx: &Arc<Mutex<mpsc::Receiver<Group>>>,
    event_tx: &mpsc::Sender<Event>,
) {
    let run = o.run;
    let mut first = Some(first_lane);
    for (i, device) in lanes.iter().enumerate() {
        let mut backend = first.take().unwrap_or_else(|| {
            PythonBackend::new(
                spec("lane", device.clone(), format!("lane{i}.log")),
                &run.opts.exp.problem,
                timeout,
            )
        });
        let rx = Arc::clone(group_rx);
        let events = event_tx.clone();
        let ctx = lane::LaneContext {
            protocol: run.protocol.clone(),
            tolerance: run.tolerance.clone(),
            strategies: run.strategies,
            run_mode: run.opts.run_mode,
            sampling: o.sampling,
            peak_gbs: run.opts.device.peak_gbs,
            peak_tflops: o.peak,
            compile: o.board,
            lane: i as u32,
            prior: run.prior,
        };
        scope.spawn(move || {
            loop {
                let group = match rx.lock().expect("group queue").recv() {
                    Ok(g) => g,
                    Err(_) => break,
                };
                // The journal's writer stops at its first failed write; a
                // result nobody can record is not worth measuring.
                let mut writer_gone = false;
                lane::run_group(&ctx, &mut backend as &mut dyn Backend, group, &mut |e| {
                    writer_gone |= events.send(e).is_err();
                });
                if interrupted() || writer_gone {
                    break;
                }
            }
            backend.shutdown();
        });
    }
}

/// The planner thread: jobs in plan order, grouped by (shape, method), to the
/// lanes and (Triton jobs) to the compile pool.
fn spawn_planner<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    run: &'env Drain<'env>,
    group_tx: mpsc::SyncSender<Group>,
    board: Option<&'env compile::CompileBoard>,
) -> std::thread::ScopedJoinHandle<'scope, Result<(), Diagnostic>> {
    let exp = run.opts.exp;
    scope.spawn(move || {
        let mut current: Option<Group> = None;
        // Lanes stop taking groups once interrupted: never block on a full queue then.
        let send = |mut g: Group| loop {
            match group_tx.try_send(g) {
                Ok(()) => return true,
                Err(mpsc::TrySendError::Disconnected(_)) => return false,
                Err(mpsc::TrySendError::Full(back)) => {
                    if interrupted() {
                        return false;
                    }
                    g = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        };
        let plan_started = Instant::now();
        let result = plan::plan(exp, run.plan_opts, &mut |job| {
            if interrupted() {
                return ControlFlow::Break(());
            }
            if run.select.keep(&job, exp) != Keep::Run {
                return ControlFlow::Continue(());
            }
            let method = exp.method(&job.method).expect("planned method exists");
            let same = current
                .as_ref()
                .is_some_and(|g| g.method == job.method && g.shape == job.shape);
            if !same {
                if let Some(g) = current.take() {
                    if !send(g) {
                        return ControlFlow::Break(());
                    }
                }
                current = Some(Group {
                    shape: job.shape.clone(),
                    method: job.method.clone(),
                    kernel: method.kernel.clone(),
                    kind: method.kind,
                    jobs: Vec::new(),
                });
            }
            if let (Some(board), MethodKind::Triton) = (board, method.kind) {
                board.push(job.clone(), &method.kernel, method.kind.as_str());
            }
            current.as_mut().expect("group").jobs.push(job);
            ControlFlow::Continue(())
        });
        if let Some(g) = current.take() {
            send(g);
        }
        if let Some(board) = board {
            board.close();
        }
        crate::trace::span("planner", "plan", plan_started, serde_json::json!({}));
        result.map(|_| ())
    })
}

/// What a compile worker compiles for, in `tunelab.target`'s syntax: the
/// lane GPU's backend, architecture and warp size, so the worker needs no GPU.
fn compile_target(device: &DeviceInfo) -> Option<String> {
    match device.backend.as_str() {
        "cuda" if device.cc_major > 0 => Some(format!(
            "cuda:{}{}:{}",
            device.cc_major, device.cc_minor, device.warp_size
        )),
        // Not HIP yet: Triton's HIP specialisation asks each pointer for its
        // allocation's range (buffer ops), which pointer stand-ins cannot
        // answer, so the keys would differ from the lane's. HIP compile
        // workers see the GPU instead.
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    Run,
    Done,
    No,
}

/// Which planned jobs this run runs.
struct Selection<'a> {
    done: &'a HashSet<String>,
    run_mode: RunMode,
    only: Option<&'a HashSet<String>>,
}

impl Selection<'_> {
    fn keep(&self, job: &Job, exp: &Experiment) -> Keep {
        let wanted = match (self.run_mode, self.only) {
            (_, Some(ids)) => job.baseline || ids.contains(&job.id),
            (RunMode::Bench, None) => {
                // A method's one config: its baseline, or the single point of a method without a space.
                job.baseline || exp.method(&job.method).is_some_and(|m| m.axes.is_empty())
            }
            _ => true,
        };
        if !wanted {
            Keep::No
        } else if self.done.contains(&job.id) {
            Keep::Done
        } else {
            Keep::Run
        }
    }
}

/// Why a run must not add samples to a journal whose samples were taken after
/// another kind of L2 flush (a memset's write-back costs a memory-bound kernel
/// about 10 %), or None. A run without a flush suits any journal.
fn flush_conflict(before: L2Flush, now: L2Flush) -> Option<String> {
    if before == L2Flush::Off || now == L2Flush::Off || before == now {
        return None;
    }
    Some(format!(
        "the journal's jobs were timed after a {} flush of L2 and this run would flush with a {}: \
         one report would mix the two",
        before.as_str(),
        now.as_str()
    ))
}

fn diff_fingerprint(old: &Fingerprint, new: &Fingerprint) -> Vec<String> {
    let a = serde_json::to_value(old).expect("fingerprint");
    let b = serde_json::to_value(new).expect("fingerprint");
    let mut changes = Vec::new();
    if let (Some(a), Some(b)) = (a.as_object(), b.as_object()) {
        for (k, v) in b {
            let before = a.get(k).cloned().unwrap_or_default();
            if before != *v {
                changes.push(format!("{k}: {before} -> {v}"));
            }
        }
    }
    changes
}

/// UTC time as RFC 3339, without a date crate: civil-from-days (H. Hinnant's algorithm).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_does_not_mix_flushes_in_one_journal() {
        let message = flush_conflict(L2Flush::Memset, L2Flush::Read).expect("memset then read");
        assert!(
            message.contains("memset") && message.contains("read"),
            "{message}"
        );
        assert_eq!(flush_conflict(L2Flush::Memset, L2Flush::Memset), None);
        assert_eq!(flush_conflict(L2Flush::Read, L2Flush::Read), None);
        assert!(flush_conflict(L2Flush::Read, L2Flush::Memset).is_some());
        // An interpreter run flushes nothing, so any journal suits it.
        assert_eq!(flush_conflict(L2Flush::Memset, L2Flush::Off), None);
        assert_eq!(flush_conflict(L2Flush::Off, L2Flush::Read), None);
    }

    #[test]
    fn the_interpreter_never_flushes() {
        let p = crate::manifest::default_protocol();
        assert_eq!(
            p.flush,
            L2Flush::Read,
            "a GPU run reads to flush by default"
        );
        assert_eq!(effective_protocol(&p, Mode::Gpu), p);
        assert_eq!(
            effective_protocol(&p, Mode::Interpreter).flush,
            L2Flush::Off
        );
    }
}
