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
//! 4. [`Journal::open_claimed`]: the journal and the run header. The results
//!    directory was claimed (locked) before phase 1; until here a refused
//!    run leaves nothing behind ([`Claim`]);
//! 5. [`drain`]: planner, lanes and the journal's single writer until done;
//! 6. the outputs, regenerated from the journal.

pub mod ab;
pub mod compile;
pub mod deal;
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

use crate::backend::native::{
    LaneBackend, NativeCompiler, NativeProcess, NativeSetup, NativeSpawn,
};
use crate::backend::python::Hello;
use crate::backend::{Backend, Flush, JobFailure, PythonBackend, SampleMode, WorkerSpec};
use crate::device::DeviceInfo;
use crate::diag::Diagnostic;
use crate::manifest::{Experiment, InputSource, LaunchPath, MethodKind, Shape, Tolerance};
use crate::measure::{L2Flush, Protocol};
use crate::plan::{self, Filter, Job, Mode, PlanOptions, RunMode, Shard};
use crate::search::{PriorObservation, Strategies};
use crate::store::lock::Claim;
use crate::store::{
    Entry, FailureClass, FinalRecord, Fingerprint, JobRecord, JobStatus, Journal, LaneRetired,
    MethodRecord, OutputSpec, Results, RunHeader, SearchRecord, StoreError, FORMAT_VERSION,
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
    /// Why the runner knows the method cannot run in this run (an `ir:`
    /// method in the interpreter); its jobs are recorded as skipped.
    pub unavailable: Option<String>,
}

pub enum Event {
    Job(Box<JobRecord>),
    Final(FinalRecord),
    Retired(LaneRetired),
    /// A pair an A/B run timed (`RunMode::Ab`).
    AbPair(Box<crate::store::AbPair>),
}

pub struct RunOptions<'a> {
    pub exp: &'a Experiment,
    pub device: DeviceInfo,
    /// The GPUs' ids in the visible-devices variable of their backend
    /// (`CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`), one lane each; empty
    /// in interpreter mode.
    pub gpus: Vec<String>,
    /// Lanes in interpreter mode (each a CPU worker); ignored on a GPU.
    pub interpreter_lanes: usize,
    /// The number of this run's first lane, as journals and traces name lanes
    /// (runs of several GPU models at once number their lanes apart).
    pub first_lane: u32,
    /// Only this share of the plan's groups (`--shard K/N`).
    pub shard: Option<Shard>,
    pub mode: Mode,
    pub run_mode: RunMode,
    pub filter: Filter,
    pub python: String,
    /// Folders put first on the workers' PYTHONPATH.
    pub python_path: Vec<PathBuf>,
    pub results_dir: PathBuf,
    pub compile_workers: usize,
    /// How the compile pool's workers are scheduled (settings: `compile_priority`).
    pub compile_priority: crate::config::CompilePriority,
    /// Only these job ids (from `--use-best`), besides baselines.
    pub only_jobs: Option<HashSet<String>>,
    pub progress: bool,
    /// How many times a later run tries a job again that crashed or timed
    /// out (settings: `retries`).
    pub retries: u32,
    /// An A/B run (`RunMode::Ab`): its pairs, planned by `tunelab ab`
    /// instead of from the experiment's spaces.
    pub ab: Option<&'a ab::AbPlan>,
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
    /// Lanes retired during the run.
    pub retired: Vec<LaneRetired>,
    /// Lanes the run used.
    pub lanes: usize,
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
    let started_at = now_rfc3339();
    install_interrupt_handler();
    let exp = opts.exp;
    let protocol = effective_protocol(&exp.protocol, opts.mode);
    // Halving keeps at least the finalists of the protocol this run uses.
    let strategies = exp.strategies(protocol.finalists);
    let dir = results_dir(&opts.results_dir, exp, &opts.device, opts.mode);

    // The directory is claimed first, before anything is read or started:
    // of two runs on one experiment, the second stops here, naming the
    // first, having touched nothing. Its journal is repaired before it is
    // read, so what is read is what this run appends to. If the run does
    // not start, the claim removes what it made (`store::lock`).
    let claim = Claim::take(&dir)?;
    let live = dir.join(crate::store::JOURNAL);
    if live.exists() {
        if let Some(notice) = crate::store::journal::repair_live(&live)? {
            eprintln!("warning: {notice}");
        }
    }
    let mut resume = Resume::read(
        &dir,
        &strategies,
        opts.run_mode,
        &protocol,
        exp,
        opts.retries,
    )?;
    if let Some(plan) = opts.ab {
        resume.done = ab::recorded(&resume.previous, &plan.setup.id);
    }
    // The run header says when the command started, so a report's wall time
    // counts the workers' start-up as the command's does. A report tells
    // runs apart by time (whole seconds): a resume in the same second as
    // the journal's last record takes its start from when its header is
    // written instead, as runs before 2026-12 all did.
    let last_record = resume
        .previous
        .jobs
        .iter()
        .map(|r| r.finished_at.as_str())
        .max();
    let started_at =
        (last_record.map_or(true, |last| started_at.as_str() > last)).then_some(started_at);
    let select = Selection {
        done: &resume.done,
        unavailable: &resume.unavailable,
        run_mode: opts.run_mode,
        only: opts.only_jobs.as_ref(),
    };
    let plan_opts = PlanOptions {
        device: &opts.device,
        filter: &opts.filter,
        mode: opts.mode,
    };
    let shard = match opts.shard {
        Some(shard) => Some(
            plan::shard::select(exp, &plan_opts, shard).map_err(|d| RunError::Input(d.into()))?,
        ),
        None => None,
    };
    let in_shard = |method: &str, shape_index: usize| {
        shard
            .as_ref()
            .map_or(true, |s| s.contains(&(method.to_string(), shape_index)))
    };
    let in_shard: Option<plan::GroupFilter<'_>> = shard.as_ref().map(|_| &in_shard as _);
    let counted = match opts.ab {
        Some(plan) => count_pairs(plan, &resume.done),
        None => count_plan(exp, &plan_opts, &select, in_shard)?,
    };
    let (planned, skipped) = (counted.planned, counted.skipped);
    let unavailable_before = counted.unavailable_before;
    let Some(first_shape) = counted.first_shape else {
        let use_best = opts.only_jobs.is_some();
        return Err(RunError::Input(
            preflight::no_jobs(exp, &opts.filter, opts.mode, opts.run_mode, use_best).into(),
        ));
    };

    let timeout = Duration::from_secs_f64(protocol.timeout_s);
    // A native worker starts with the lane when this run has native jobs to
    // run; otherwise (a filter, a shard or a resume left none) only if a job
    // turns out to need one.
    let native_planned = counted.groups.iter().any(|g| {
        exp.method(&g.method)
            .is_some_and(|m| m.launch == LaunchPath::Native)
    });
    let workers = Workers::start(&opts, &dir, timeout, native_planned, protocol.seed);
    let tolerance = match (opts.mode, &exp.interpreter) {
        (Mode::Interpreter, Some(i)) => {
            i.tolerance.clone().unwrap_or_else(|| exp.tolerance.clone())
        }
        _ => exp.tolerance.clone(),
    };
    let groups = deal::order(
        counted.groups,
        &deal::Measured::from_records(&resume.previous.jobs),
    );
    let run = Drain {
        opts: &opts,
        protocol,
        tolerance,
        strategies: &strategies,
        prior: &resume.prior,
        select: &select,
        plan_opts: &plan_opts,
        groups,
        unavailable_before,
        started,
        started_at,
        native_compiles: workers.native_compiles,
    };
    let mut outcome = RunOutcome {
        dir: dir.clone(),
        planned,
        skipped,
        ..Default::default()
    };
    let opening = Opening {
        claim,
        first_shape: &first_shape,
        previous: resume.previous.header.as_ref(),
        fingerprint: fingerprint_base,
    };
    drain(&run, workers, opening, &mut outcome)?;
    outcome.interrupted = interrupted();
    outcome.wall_s = started.elapsed().as_secs_f64();
    Ok(outcome)
}

/// What a results directory already holds, read before anything is written.
struct Resume {
    previous: Results,
    /// Jobs this run need not run again.
    done: HashSet<String>,
    /// Jobs whose current record says their method could not run, and why:
    /// a run asks again, and records them again only if the answer changed.
    unavailable: HashMap<String, String>,
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
        retries: u32,
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
        // A planned job whose record a later definition of its method
        // superseded (an edit reverted) runs again, so that its new record is
        // the current one.
        let superseded = crate::emit::select::superseded_ids(&previous.jobs);
        // A crash or a timeout may be the machine's fault (a worker killed,
        // a GPU that hung once), not the config's: such a job runs again, up
        // to `retries` times over all runs.
        let retry = |r: &JobRecord| {
            r.status == JobStatus::Failed
                && r.failure
                    .as_ref()
                    .is_some_and(|f| matches!(f.class, FailureClass::Crash | FailureClass::Timeout))
                && previous.crashes(r) <= retries as usize
        };
        let done = previous
            .jobs
            .iter()
            .filter(|r| !superseded.contains(r.job_id.as_str()))
            .filter(|r| match run_mode {
                RunMode::Check => r.status != JobStatus::Skipped,
                // A config a strategy skipped was never run: only a strategy
                // that keeps its skips leaves it unrun.
                _ if r.status == JobStatus::Skipped => {
                    run_mode == RunMode::Tune
                        && r.failure.is_none()
                        && strategies.for_method(&r.method).keeps_skipped()
                }
                _ => r.status != JobStatus::Checked && !retry(r),
            })
            .map(|r| r.job_id.clone())
            .collect();
        let unavailable = previous
            .jobs
            .iter()
            .filter(|r| !superseded.contains(r.job_id.as_str()))
            .filter(|r| r.status == JobStatus::Skipped)
            .filter_map(|r| {
                let f = r.failure.as_ref()?;
                (f.class == FailureClass::Unavailable)
                    .then(|| (r.job_id.clone(), f.message.clone()))
            })
            .collect();
        let prior = if strategies.any_learns() && run_mode == RunMode::Tune {
            lane::prior_observations(
                previous
                    .jobs
                    .iter()
                    .filter(|r| !superseded.contains(r.job_id.as_str())),
            )
        } else {
            HashMap::new()
        };
        Ok(Resume {
            previous,
            done,
            unavailable,
            prior,
        })
    }
}

/// What planning once, to count, found.
struct Counted {
    planned: u64,
    /// Of those, jobs the journal records as unavailable: asked again, not
    /// new to the journal.
    unavailable_before: u64,
    skipped: u64,
    /// The first selected job's shape, if any job is selected.
    first_shape: Option<Shape>,
    /// The groups with jobs to run, in plan order (their costs not yet estimated).
    groups: Vec<deal::Pending>,
}

/// Plans once to count the jobs to run and those already done, so progress
/// has a total and a bad filter or space stops the run before it starts;
/// also lists the groups with jobs to run, for dealing.
fn count_plan(
    exp: &Experiment,
    plan_opts: &PlanOptions<'_>,
    select: &Selection<'_>,
    in_shard: Option<plan::GroupFilter<'_>>,
) -> Result<Counted, RunError> {
    let mut c = Counted {
        planned: 0,
        unavailable_before: 0,
        skipped: 0,
        first_shape: None,
        groups: Vec::new(),
    };
    plan::plan_groups(exp, plan_opts, in_shard, &mut |job| {
        match select.keep(&job, exp) {
            Keep::Run => {
                c.planned += 1;
                if select.unavailable.contains_key(&job.id) {
                    c.unavailable_before += 1;
                }
                match c.groups.last_mut() {
                    Some(g) if g.method == job.method && g.shape_index == job.shape_index => {
                        g.jobs += 1
                    }
                    _ => c.groups.push(deal::Pending {
                        method: job.method.clone(),
                        shape_index: job.shape_index,
                        shape: job.shape.clone(),
                        jobs: 1,
                        cost: 0.0,
                    }),
                }
            }
            Keep::Done => c.skipped += 1,
            Keep::No => return ControlFlow::Continue(()),
        }
        if c.first_shape.is_none() {
            c.first_shape = Some(job.shape);
        }
        ControlFlow::Continue(())
    })
    .map_err(|d| RunError::Input(d.into()))?;
    Ok(c)
}

/// An A/B run's pairs counted as `count_plan` counts a plan's jobs: a pair
/// of three jobs, recorded or to run.
fn count_pairs(plan: &ab::AbPlan, done: &HashSet<String>) -> Counted {
    let groups = plan.pending(done);
    Counted {
        planned: groups.len() as u64,
        skipped: (plan.pairs.len() - groups.len()) as u64,
        first_shape: groups.first().map(|g| g.shape.clone()),
        groups,
        // An A/B's jobs are timed, never skipped as unavailable beforehand.
        unavailable_before: 0,
    }
}

/// A lane's worker, starting on a thread of its own (importing torch takes seconds).
type Starting = std::thread::JoinHandle<(LaneBackend, Result<Hello, JobFailure>)>;

/// One lane: its number (journals and traces), its device, its worker.
struct LaneStart {
    number: u32,
    device: Option<String>,
    worker: Starting,
}

/// The Python workers of a run: a compile pool, and every lane's worker,
/// all starting at once.
struct Workers {
    pool: Option<compile::CompilePool>,
    lanes: Vec<LaneStart>,
    /// The pool compiles native methods.
    native_compiles: bool,
}

impl Workers {
    /// Starts the compile pool first (its workers import Triton while the
    /// lanes' workers import torch), and every lane's worker; none is
    /// waited for here.
    fn start(
        opts: &RunOptions<'_>,
        dir: &Path,
        timeout: Duration,
        native_planned: bool,
        seed: u64,
    ) -> Workers {
        let exp = opts.exp;
        let devices: Vec<Option<String>> = if opts.mode == Mode::Interpreter || opts.gpus.is_empty()
        {
            vec![None; opts.interpreter_lanes.max(1)]
        } else {
            opts.gpus.iter().cloned().map(Some).collect()
        };
        let logs = dir.join("logs");
        let native_logs = logs.clone();
        let triton_cache = dir.join(".cache").join("triton");
        let (python, python_path) = (opts.python.clone(), opts.python_path.clone());
        let interpret = opts.mode == Mode::Interpreter;
        let visible_var = visible_devices_var(&opts.device);
        let spec = move |role: &str, device: Option<String>, name: String| WorkerSpec {
            python: python.clone(),
            python_path: python_path.clone(),
            role: role.to_string(),
            interpret,
            visible_device: device,
            visible_var,
            target: None,
            triton_cache: Some(triton_cache.clone()),
            log: logs.join(name),
            background: false,
        };
        let native = native_setup(opts, dir);
        let mut native_compiles = false;
        let native_program = native_worker_program();
        let use_pool =
            opts.mode == Mode::Gpu && opts.compile_workers > 0 && opts.run_mode != RunMode::Check;
        let pool = use_pool.then(|| {
            // Only tunelab's own problems are known to compile without torch; a
            // user's problem gets compile workers that see the GPU, as lanes do.
            let target = compile_target(&opts.device).filter(|_| exp.builtin_problem());
            let workers = (0..opts.compile_workers)
                .map(|i| {
                    let mut s = spec("compile", devices[0].clone(), format!("compile{i}.log"));
                    s.target = target.clone();
                    s.background = opts.compile_priority == crate::config::CompilePriority::Idle;
                    PythonBackend::new(s, &exp.problem, timeout).with_ir_files(exp.ir_files())
                })
                .collect();
            let native_pool = native
                .as_ref()
                .filter(|n| n.unavailable.is_none())
                .map(|n| compile::NativePool {
                    compiler: Arc::clone(&n.compiler),
                    methods: Arc::new(
                        n.methods
                            .iter()
                            .filter(|(_, m)| m.kind.is_native())
                            .map(|(k, m)| (k.clone(), crate::manifest::Method::clone(m)))
                            .collect(),
                    ),
                    threads: opts.compile_workers,
                });
            native_compiles = native_pool.is_some();
            // `inputs: native`: the compile workers compile for the lane's
            // target without torch, as its worker does, so they make each
            // Triton job's native recipe too, over the same described data.
            let recipes = native
                .as_ref()
                .filter(|n| n.lane_target.is_some() && target.is_some())
                .map(|n| compile::RecipeAsk {
                    methods: n
                        .methods
                        .values()
                        .filter(|m| m.kind == MethodKind::Triton)
                        .map(|m| m.name.clone())
                        .collect(),
                    ask: serde_json::json!({"seed": seed, "cache_dir": n.cache_dir()}),
                });
            let pool = compile::CompilePool::start(workers, native_pool, recipes);
            pool.board().set_width(devices.len());
            pool
        });
        let lanes = devices
            .into_iter()
            .enumerate()
            .map(|(i, device)| {
                let number = opts.first_lane + i as u32;
                let mut lane_spec = spec("lane", device.clone(), format!("lane{number}.log"));
                // `inputs: native`: a worker without torch or a GPU (recipes only).
                lane_spec.target = native.as_ref().and_then(|n| n.lane_target.clone());
                let python = PythonBackend::new(lane_spec, &exp.problem, timeout)
                    .with_ir_files(exp.ir_files());
                let mut backend = match &native {
                    Some(setup) => {
                        let spawn = NativeSpawn {
                            program: native_program.clone(),
                            backend: if opts.device.backend == "hip" {
                                "hip"
                            } else {
                                "cuda"
                            },
                            visible_var,
                            visible_device: device.clone(),
                            log: native_logs.join(format!("native{number}.log")),
                        };
                        LaneBackend::with_native(
                            python,
                            Arc::clone(setup),
                            NativeProcess::new(spawn, timeout),
                        )
                    }
                    None => LaneBackend::python(python),
                };
                LaneStart {
                    number,
                    device,
                    worker: std::thread::spawn(move || {
                        let hello = backend.start(native_planned);
                        (backend, hello)
                    }),
                }
            })
            .collect();
        Workers {
            pool,
            lanes,
            native_compiles,
        }
    }
}

/// What the lanes share to launch native methods, when the experiment has
/// any: the methods, their compiler (images under `.cache/native/` of the
/// results directory), and why they cannot run in this run, if so.
fn native_setup(opts: &RunOptions<'_>, dir: &Path) -> Option<Arc<NativeSetup>> {
    let exp = opts.exp;
    if !exp.methods.iter().any(|m| m.launch == LaunchPath::Native) {
        return None;
    }
    let cache = dir.join(".cache").join("native");
    let compiler = Arc::new(NativeCompiler::new(
        &opts.device,
        Some(Path::new(&opts.python)),
        cache.clone(),
    ));
    let unavailable = (opts.mode == Mode::Interpreter)
        .then(|| "they need a GPU, and this run uses Triton's interpreter".to_string());
    let mut setup = NativeSetup::new(
        &exp.problem,
        &exp.methods,
        compiler,
        &opts.device,
        cache,
        unavailable,
    );
    if exp.inputs == InputSource::Native && opts.mode == Mode::Gpu {
        // The lane's Python worker then runs without torch, compiling for
        // the lane's GPU from its description alone, as compile workers do.
        match (&setup.unavailable, compile_target(&opts.device)) {
            (None, Some(target)) => setup.lane_target = Some(target),
            (Some(why), _) => eprintln!(
                "warning: `inputs: native` falls back to python (the lane's Python worker builds the data): {why}"
            ),
            (None, None) => eprintln!(
                "warning: `inputs: native` falls back to python: the lane's worker cannot compile for a {} GPU without seeing it",
                opts.device.backend
            ),
        }
    }
    if let Some(why) = &setup.unavailable {
        for m in exp
            .methods
            .iter()
            .filter(|m| m.kind == MethodKind::Triton && m.launch == LaunchPath::Native)
        {
            if opts.mode == Mode::Gpu {
                eprintln!(
                    "warning: method `{}` (launch: native) is launched by its Python worker: {why}",
                    m.name
                );
            }
        }
    }
    Some(Arc::new(setup))
}

/// The program a lane starts as its native worker: this binary, or
/// `TUNELAB_NATIVE_WORKER` (a tunelab binary) where this process is not one
/// (the Python package's entry point).
fn native_worker_program() -> PathBuf {
    if let Some(p) = std::env::var_os("TUNELAB_NATIVE_WORKER").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("tunelab"))
}

/// The variable that names a lane's GPU to its worker.
pub fn visible_devices_var(device: &DeviceInfo) -> &'static str {
    match device.backend.as_str() {
        "hip" => "HIP_VISIBLE_DEVICES",
        _ => "CUDA_VISIBLE_DEVICES",
    }
}

/// What the run needs to open its journal once its first worker answered.
struct Opening<'a> {
    /// The results directory, locked since the run began.
    claim: Claim,
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
    started_at: String,
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
        started_at,
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
    /// The groups to run, in dealing order.
    groups: Vec<deal::Pending>,
    /// Planned jobs the journal records as unavailable (`Counted`): the run
    /// header's planned jobs leave them out, since the journal has them.
    unavailable_before: u64,
    /// When the run started, for the progress display's elapsed time.
    started: Instant,
    /// When the command started (RFC 3339), for the run header; `None`: when
    /// the header is written (`run` says why).
    started_at: Option<String>,
    /// The compile pool compiles native methods too.
    native_compiles: bool,
}

/// Runs the plan to the end (or to Ctrl-C). The planner starts at once,
/// feeding the compile pool while the lanes' workers import torch; then the
/// first lane's worker must answer and the problem load (else the run stops,
/// having written nothing), the journal opens with the run's header, the
/// lanes start taking groups, and this thread becomes the journal's single
/// writer: every record is on disk before the next is read.
fn drain(
    run: &Drain<'_>,
    workers: Workers,
    opening: Opening<'_>,
    outcome: &mut RunOutcome,
) -> Result<(), RunError> {
    let opts = run.opts;
    let Workers {
        pool, mut lanes, ..
    } = workers;
    outcome.lanes = lanes.len();
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
            // bf16, and mxfp4: its weights are dequantised to 16-bit activations.
            _ => opts.device.peak_tflops_bf16,
        }
    };
    let dealer = deal::Dealer::new(GROUPS_AHEAD, lanes.len());
    let last_good = Mutex::new(None);
    let retire = || {
        let granted = dealer.retire();
        if granted && use_pool {
            board.set_width(dealer.alive());
        }
        granted
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
        dealer: &dealer,
        last_good: &last_good,
        retire: &retire,
    };
    let result = std::thread::scope(|scope| -> Result<(), RunError> {
        // Whatever ends this closure abandons the queue, so the planner and
        // idle lanes stop.
        struct Abandon<'d>(&'d deal::Dealer);
        impl Drop for Abandon<'_> {
            fn drop(&mut self) {
                self.0.abandon();
            }
        }
        let _abandon = Abandon(&dealer);
        let planner = spawn_planner(scope, run, &dealer, use_pool.then_some(board));

        let first = lanes.remove(0);
        let (mut first_backend, hello) = first.worker.join().expect("lane start-up thread");
        // The failure's message says what to do.
        let hello = hello.map_err(|f| RunError::Environment(f.message))?;
        let descriptions = preflight::check_problem(
            opts.exp,
            &mut first_backend.python,
            opening.first_shape,
            &opts.python,
        )
        .map_err(RunError::Input)?;
        let (mut journal, repaired) = Journal::open_claimed(opening.claim)?;
        if let Some(notice) = repaired {
            eprintln!("warning: {notice}");
        }
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
            outcome.planned - run.unavailable_before,
            run.started_at.clone().unwrap_or_else(now_rfc3339),
        ))))?;
        if let Some(plan) = opts.ab {
            journal.append(&Entry::AbSetup(Box::new(plan.setup.clone())))?;
        }

        let (event_tx, event_rx) = mpsc::channel::<Event>();
        let started = std::iter::once((first.number, first.device, first_backend, Ok(()))).chain(
            lanes.into_iter().map(|l| {
                let (backend, hello) = l.worker.join().expect("lane start-up thread");
                (l.number, l.device, backend, hello.map(|_| ()))
            }),
        );
        for (number, device, backend, hello) in started {
            spawn_lane(scope, &lane_opts, number, device, backend, hello, &event_tx);
        }
        drop(event_tx);
        let mut display = progress::Progress::new(outcome.planned, opts.progress, run.started);
        if opts.ab.is_some() {
            display = display.of_pairs();
        }
        loop {
            // A second without an event lets the display say the run goes on.
            let event = match event_rx.recv_timeout(Duration::from_secs(1)) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    display.tick();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
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
                    if run.select.repeats(&record) {
                        continue;
                    }
                    let appended = Instant::now();
                    journal.append(&Entry::Job(record))?;
                    crate::trace::span("journal", "append", appended, serde_json::json!({}));
                }
                Event::Final(f) => journal.append(&Entry::Final(f))?,
                Event::AbPair(p) => {
                    if opts.progress {
                        display.note(&ab::progress_line(
                            &p,
                            outcome.ok + outcome.failed,
                            outcome.planned,
                        ));
                    }
                    if p.failure.is_some() {
                        outcome.failed += 1;
                    } else {
                        outcome.ok += 1;
                    }
                    display.pair(p.failure.is_some());
                    journal.append(&Entry::AbPair(p))?;
                }
                Event::Retired(r) => {
                    display.note(&format!(
                        "warning: lane {}{} retired: {}; {} handed to the other lanes",
                        r.lane,
                        r.device
                            .as_ref()
                            .map(|d| format!(" (GPU {d})"))
                            .unwrap_or_default(),
                        r.reason,
                        crate::emit::num::count(r.requeued_jobs, "job", "jobs"),
                    ));
                    // Failures that led to it run again: not failures of this run.
                    outcome.failed = outcome.failed.saturating_sub(r.failed_jobs.len() as u64);
                    journal.append(&Entry::LaneRetired(r.clone()))?;
                    outcome.retired.push(r);
                }
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
    dealer: &'a deal::Dealer,
    last_good: &'a Mutex<Option<lane::JobRef>>,
    retire: &'a (dyn Fn() -> bool + Sync),
}

/// One lane's thread, owning one GPU's worker: it takes groups as it frees
/// up until all are dealt, the run is interrupted, the journal's writer is
/// gone or the lane retires, then shuts its worker down. A lane whose worker
/// could not start retires at once (unless it is the last).
fn spawn_lane<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    o: &'scope LaneOptions<'env>,
    number: u32,
    device: Option<String>,
    mut backend: LaneBackend,
    hello: Result<(), JobFailure>,
    event_tx: &mpsc::Sender<Event>,
) {
    let run = o.run;
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
        lane: number,
        prior: run.prior,
        health: Some(lane::HealthWatch {
            state: Default::default(),
            last_good: o.last_good,
            retire: o.retire,
        }),
        ab: run.opts.ab.map(|plan| &plan.timing),
    };
    scope.spawn(move || {
        let retired = |reason: String, failed: &[lane::JobRef], requeued: u64| {
            Event::Retired(LaneRetired {
                lane: number,
                device: device.clone(),
                reason,
                failed_jobs: failed.iter().map(|f| f.job.id.clone()).collect(),
                requeued_jobs: requeued,
                at: now_rfc3339(),
            })
        };
        if let Err(f) = hello {
            // The last lane goes on: a start is tried again at each job, whose
            // record says why it failed.
            if (o.retire)() {
                let why = f.message.lines().next().unwrap_or("").to_string();
                let _ = events.send(retired(format!("its worker did not start: {why}"), &[], 0));
                return;
            }
        }
        while let Some(group) = o.dealer.take() {
            // The journal's writer stops at its first failed write; a
            // result nobody can record is not worth measuring.
            let mut writer_gone = false;
            let rest = lane::run_group(&ctx, &mut backend as &mut dyn Backend, group, &mut |e| {
                writer_gone |= events.send(e).is_err();
            });
            if let Some(rest) = rest {
                let health = ctx.health.as_ref().expect("a retired lane has health");
                let state = health.state.borrow();
                let handed = hand_back(rest, &state.streak);
                let jobs: u64 = handed.iter().map(|g| g.jobs.len() as u64).sum();
                let reason = state.retired.clone().unwrap_or_default();
                let _ = events.send(retired(reason, &state.streak, jobs));
                o.dealer.hand_back(handed);
                o.dealer.done();
                break;
            }
            o.dealer.done();
            if writer_gone {
                o.dealer.abandon();
            }
            if interrupted() || writer_gone {
                break;
            }
        }
        backend.shutdown();
    });
}

/// What a retiring lane hands back: its group's unrecorded jobs and the
/// failures that led to the retirement, grouped by (method, shape), the
/// failures first.
fn hand_back(rest: Group, failed: &[lane::JobRef]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for f in failed {
        let same = |g: &Group| g.method == f.job.method && g.shape == f.job.shape;
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.jobs.push(f.job.clone()),
            None => groups.push(Group {
                shape: f.job.shape.clone(),
                method: f.job.method.clone(),
                kernel: f.kernel.clone(),
                kind: f.kind,
                jobs: vec![f.job.clone()],
                unavailable: None,
            }),
        }
    }
    match groups
        .iter_mut()
        .find(|g| g.method == rest.method && g.shape == rest.shape)
    {
        Some(g) => g.jobs.extend(rest.jobs),
        None if !rest.jobs.is_empty() => groups.push(rest),
        None => {}
    }
    groups
}

/// The planner thread: the groups in dealing order, each planned in full
/// when its turn comes, to the lanes and (Triton jobs) to the compile pool,
/// which so sees jobs in the order the lanes will take them.
fn spawn_planner<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    run: &'env Drain<'env>,
    dealer: &'env deal::Dealer,
    board: Option<&'env compile::CompileBoard>,
) -> std::thread::ScopedJoinHandle<'scope, Result<(), Diagnostic>> {
    let exp = run.opts.exp;
    scope.spawn(move || {
        let plan_started = Instant::now();
        let mut result = Ok(());
        for pending in &run.groups {
            if interrupted() {
                break;
            }
            let Some(method) = exp.method(&pending.method) else {
                continue;
            };
            let mut group = Group {
                shape: pending.shape.clone(),
                method: pending.method.clone(),
                kernel: method.kernel.clone(),
                kind: method.kind,
                jobs: Vec::new(),
                unavailable: unavailable_here(method, run.opts.mode),
            };
            if let Some(ab) = run.opts.ab {
                // An A/B pair's jobs come from its plan, not the method's space.
                match ab.group(&pending.method, pending.shape_index) {
                    Some(pair) => {
                        group = Group {
                            unavailable: pair.unavailable.or(group.unavailable),
                            ..pair
                        }
                    }
                    None => continue,
                }
            } else {
                let this = |m: &str, i: usize| m == pending.method && i == pending.shape_index;
                let planned = plan::plan_groups(exp, run.plan_opts, Some(&this), &mut |job| {
                    if run.select.keep(&job, exp) == Keep::Run {
                        group.jobs.push(job);
                    }
                    ControlFlow::Continue(())
                });
                if let Err(d) = planned {
                    result = Err(d);
                    break;
                }
            }
            if group.jobs.is_empty() {
                continue;
            }
            let compiled_ahead = match method.kind {
                MethodKind::Triton => true,
                MethodKind::Cuda | MethodKind::Hip => run.native_compiles,
                _ => false,
            };
            if let (Some(board), true) = (board, compiled_ahead) {
                board.begin_group();
                // A strategy that measures what it was planned takes its jobs
                // as they compile: cheap ones first, then the longest first
                // (`compile_order`). The surrogate picks its jobs one by one,
                // in no order a compile cost can foresee: plan order.
                let measures_all = !matches!(
                    exp.search_for(method).kind,
                    crate::search::SearchKind::Surrogate { .. }
                );
                let queued: Vec<&plan::Job> = if method.kind == MethodKind::Triton && measures_all {
                    compile::compile_order(&group.jobs, run.opts.compile_workers)
                } else {
                    group.jobs.iter().collect()
                };
                for job in queued {
                    board.push(job.clone(), &method.kernel, method.kind.as_str());
                }
            }
            if !dealer.push(group) {
                break;
            }
        }
        dealer.close();
        if let Some(board) = board {
            board.close();
        }
        crate::trace::span("planner", "plan", plan_started, serde_json::json!({}));
        result
    })
}

/// Why a method cannot run in this mode, when the runner knows it ahead: an
/// `ir:` method has no Python source the interpreter could run.
fn unavailable_here(method: &crate::manifest::Method, mode: Mode) -> Option<String> {
    match (&method.ir, mode) {
        (Some(ir), Mode::Interpreter) => Some(format!(
            "runs from IR ({}), which needs a GPU: the interpreter runs the kernel's Python source",
            ir.file_name().map_or_else(
                || ir.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            )
        )),
        _ => None,
    }
}

/// What a compile worker compiles for, in `tunelab.target`'s syntax: the
/// lane GPU's backend, architecture and warp size, so the worker needs no GPU.
pub fn compile_target(device: &DeviceInfo) -> Option<String> {
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
    /// Jobs recorded as unavailable, with the reason (`Resume::unavailable`).
    unavailable: &'a HashMap<String, String>,
    run_mode: RunMode,
    only: Option<&'a HashSet<String>>,
}

impl Selection<'_> {
    /// Whether `record` says again what the journal already holds for its
    /// job: unavailable, for the same reason. It is not written again, so
    /// the runs table still counts the job in the run that first recorded it.
    fn repeats(&self, record: &JobRecord) -> bool {
        record.status == JobStatus::Skipped
            && record.failure.as_ref().is_some_and(|f| {
                f.class == FailureClass::Unavailable
                    && self.unavailable.get(&record.job_id) == Some(&f.message)
            })
    }

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
