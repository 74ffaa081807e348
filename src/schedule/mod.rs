//! Scheduling a run: the planner streams (shape, method) groups to one lane per
//! GPU, a compile pool works ahead of the lanes, and every finished job comes
//! back as an event that the journal, the progress display and the final
//! outputs consume. Timed work on one GPU never overlaps; CPU work does.

pub mod compile;
pub mod lane;
pub mod progress;

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{Backend, Flush, PythonBackend, WorkerSpec};
use crate::device::DeviceInfo;
use crate::diag::Diagnostic;
use crate::manifest::raw::{MethodKind, RawProtocol, Strategy};
use crate::manifest::{Experiment, Shape};
use crate::plan::{self, Filter, Job, Mode, PlanOptions};
use crate::store::{
    Entry, FinalRecord, Fingerprint, JobRecord, JobStatus, Journal, OutputSpec, RunHeader,
    StoreError,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    /// Search each method's space (the default).
    Tune,
    /// Each method at its baseline or best-known config: the method comparison.
    Bench,
    /// Correctness only, no timing.
    Check,
}

impl RunMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RunMode::Tune => "tune",
            RunMode::Bench => "bench",
            RunMode::Check => "check",
        }
    }
}

/// Groups the planner may queue ahead of the lanes (and so the compile pool
/// ahead of the GPU): enough to keep 16 compile workers busy on spaces of a
/// few dozen configs, few enough to hold in memory on any plan.
const GROUPS_AHEAD: usize = 16;

/// All jobs of one method at one shape: the unit a lane takes.
pub struct Group {
    pub shape: Shape,
    pub method: String,
    pub kernel: String,
    pub kind: String,
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
    pub python_path: PathBuf,
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
    pub checked: u64,
    pub interrupted: bool,
    pub fingerprint_changes: Vec<String>,
    pub wall_s: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Input(Diagnostic),
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
pub fn results_dir(
    base: &std::path::Path,
    exp: &Experiment,
    device: &DeviceInfo,
    mode: Mode,
) -> PathBuf {
    let device_dir = match mode {
        Mode::Interpreter => "cpu-interpreter".to_string(),
        Mode::Gpu => device.vllm_name.clone(),
    };
    base.join(&exp.name).join(device_dir)
}

/// The protocol actually used: the interpreter gets a token one, since its
/// timings mean nothing and each launch takes seconds.
pub fn effective_protocol(p: &RawProtocol, mode: Mode) -> RawProtocol {
    match mode {
        // Resolved here so the journal header says how this run flushed.
        Mode::Gpu => RawProtocol {
            flush_with: Some(p.flush_with.unwrap_or_default()),
            ..p.clone()
        },
        Mode::Interpreter => RawProtocol {
            warmup_launches: 1,
            warmup_ms: 0.0,
            flush_l2: false,
            batch: 2,
            min_samples: 2,
            max_samples: 2,
            finalists: 0,
            ..p.clone()
        },
    }
}

pub fn run(opts: RunOptions, fingerprint_base: Fingerprint) -> Result<RunOutcome, RunError> {
    let started = Instant::now();
    install_interrupt_handler();
    let exp = opts.exp;
    let dir = results_dir(&opts.results_dir, exp, &opts.device, opts.mode);
    let mut journal = Journal::open(&dir)?;
    // A missing journal is a first run.
    let (previous, warnings) = crate::store::journal::read(&dir).unwrap_or_default();
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let done: HashSet<String> = previous
        .jobs
        .iter()
        .filter(|r| match opts.run_mode {
            RunMode::Check => r.status != JobStatus::Skipped,
            // A config the surrogate skipped was never run: only another
            // surrogate search may leave it unrun.
            _ if r.status == JobStatus::Skipped => {
                opts.run_mode == RunMode::Tune && exp.search.strategy == Strategy::Surrogate
            }
            _ => r.status != JobStatus::Checked,
        })
        .map(|r| r.job_id.clone())
        .collect();

    // A resumed surrogate search learns from what earlier runs measured.
    let prior = if exp.search.strategy == Strategy::Surrogate && opts.run_mode == RunMode::Tune {
        lane::prior_observations(&previous.jobs)
    } else {
        Default::default()
    };
    let protocol = effective_protocol(&exp.protocol, opts.mode);
    if let Some(h) = &previous.header {
        if let Some(message) = flush_conflict(&h.protocol, &protocol) {
            return Err(RunError::Input(
                Diagnostic::in_file(&exp.manifest_path, message).help(format!(
                    "set `protocol: {{flush_with: {}}}` to go on with {}, or pass a fresh --results-dir",
                    h.protocol.recorded_flush().as_str(),
                    dir.display()
                )),
            ));
        }
    }
    let tolerance = match (opts.mode, &exp.interpreter) {
        (Mode::Interpreter, Some(i)) => {
            i.tolerance.clone().unwrap_or_else(|| exp.tolerance.clone())
        }
        _ => exp.tolerance.clone(),
    };
    let lanes = if opts.mode == Mode::Interpreter || opts.gpus.is_empty() {
        vec![None]
    } else {
        opts.gpus.iter().cloned().map(Some).collect()
    };
    let logs = dir.join("logs");
    let triton_cache = dir.join(".cache").join("triton");
    let spec = |role: &str, device: Option<String>, name: String| WorkerSpec {
        python: opts.python.clone(),
        python_path: opts.python_path.clone(),
        role: role.to_string(),
        interpret: opts.mode == Mode::Interpreter,
        visible_device: device,
        target: None,
        triton_cache: Some(triton_cache.clone()),
        log: logs.join(name),
    };
    let timeout = Duration::from_secs_f64(protocol.timeout_s);

    // The compile pool starts first: its workers import torch and Triton
    // while the lane's worker does the same, instead of after it.
    let use_pool =
        opts.mode == Mode::Gpu && opts.compile_workers > 0 && opts.run_mode != RunMode::Check;
    let pool = use_pool.then(|| {
        // Only tunelab's own problems are known to compile without torch; a
        // user's problem gets compile workers that see the GPU, as lanes do.
        let builtin = matches!(exp.problem.as_str(), "gemm" | "moe");
        let target = compile_target(&opts.device).filter(|_| builtin);
        let workers = (0..opts.compile_workers)
            .map(|i| {
                let mut spec = spec("compile", lanes[0].clone(), format!("compile{i}.log"));
                spec.target = target.clone();
                PythonBackend::new(spec, &exp.problem, timeout)
            })
            .collect();
        compile::CompilePool::start(workers)
    });

    // The first lane's worker starts now (importing torch takes seconds) and
    // says what it runs on; meanwhile the plan is counted and the compile
    // pool is fed. Nothing is recorded before its answer.
    let probe = {
        let mut backend = PythonBackend::new(
            spec("lane", lanes[0].clone(), "lane0.log".into()),
            &exp.problem,
            timeout,
        );
        std::thread::spawn(move || {
            let hello = backend.hello();
            (backend, hello)
        })
    };

    // Count first, so progress has a total; then stream.
    let select = Selection {
        done: &done,
        run_mode: opts.run_mode,
        only: opts.only_jobs.as_ref(),
    };
    let plan_opts = PlanOptions {
        device: &opts.device,
        filter: &opts.filter,
        mode: opts.mode,
    };
    let (mut planned, mut skipped) = (0u64, 0u64);
    plan::plan(exp, &plan_opts, &mut |job| {
        match select.keep(&job, exp) {
            Keep::Run => planned += 1,
            Keep::Done => skipped += 1,
            Keep::No => {}
        }
        ControlFlow::Continue(())
    })
    .map_err(RunError::Input)?;

    let flush = if protocol.flush_l2 && opts.mode == Mode::Gpu {
        Flush {
            bytes: protocol
                .flush_bytes
                .unwrap_or((2 * opts.device.l2_bytes).max(32 << 20)),
            with: protocol.flush_with.unwrap_or_default(),
        }
    } else {
        Flush::NONE
    };
    let unused_board = compile::CompileBoard::default();
    let compile_board = pool.as_ref().map_or(&unused_board, |p| p.board());
    // Groups queued ahead of the lanes; the compile pool sees their jobs as
    // soon as they are queued, so this is also how far ahead it can compile.
    let (group_tx, group_rx) = mpsc::sync_channel::<Group>(GROUPS_AHEAD);
    let group_rx = Arc::new(Mutex::new(group_rx));
    let (event_tx, event_rx) = mpsc::channel::<Event>();
    let peak = |dtype: Option<&str>| -> f64 {
        match dtype {
            Some("fp32") => opts.device.peak_tflops_fp32,
            Some("fp8") => opts.device.peak_tflops_fp8,
            Some("fp16") => opts.device.peak_tflops_fp16,
            _ => opts.device.peak_tflops_bf16,
        }
    };
    let mut outcome = RunOutcome {
        dir: dir.clone(),
        planned,
        skipped,
        ..Default::default()
    };
    let mut display = progress::Progress::new(planned, opts.progress);

    std::thread::scope(|scope| -> Result<(), RunError> {
        // The planner: groups in plan order, to the lanes and the compile pool.
        let board = compile_board;
        let select = &select;
        let plan_opts = &plan_opts;
        let planner = scope.spawn(move || -> Result<(), Diagnostic> {
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
            let result = plan::plan(exp, plan_opts, &mut |job| {
                if interrupted() {
                    return ControlFlow::Break(());
                }
                if select.keep(&job, exp) != Keep::Run {
                    return ControlFlow::Continue(());
                }
                let method = exp
                    .methods
                    .iter()
                    .find(|m| m.name == job.method)
                    .expect("planned method exists");
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
                        kind: format!("{:?}", method.kind).to_lowercase(),
                        jobs: Vec::new(),
                    });
                }
                if use_pool && method.kind == MethodKind::Triton {
                    board.push(job.clone(), &method.kernel, "triton");
                }
                current.as_mut().expect("group").jobs.push(job);
                ControlFlow::Continue(())
            });
            if let Some(g) = current.take() {
                send(g);
            }
            board.close();
            crate::trace::span("planner", "plan", plan_started, serde_json::json!({}));
            result.map(|_| ())
        });

        let (probe, hello) = probe.join().expect("lane start-up thread");
        let hello = match hello {
            Ok(h) => h,
            Err(f) => {
                // Unblock and stop the planner before leaving the scope.
                drop(group_rx);
                let _ = planner.join();
                return Err(RunError::Environment(format!(
                    "the Python worker did not start ({}): {}\n  = help: run `tunelab doctor`",
                    f.class.as_str(),
                    f.message
                )));
            }
        };
        let mut fingerprint = fingerprint_base;
        fingerprint.python = hello["python"].as_str().map(str::to_string);
        fingerprint.torch = hello["torch"].as_str().map(str::to_string);
        fingerprint.triton = hello["triton"].as_str().map(str::to_string);
        fingerprint.cuda = hello["cuda"].as_str().map(str::to_string);
        outcome.fingerprint_changes = previous
            .header
            .as_ref()
            .map(|h| diff_fingerprint(&h.fingerprint, &fingerprint))
            .unwrap_or_default();

        let header = RunHeader {
            experiment: exp.name.clone(),
            description: exp.description.clone(),
            problem: exp.problem.clone(),
            mode: if opts.mode == Mode::Interpreter {
                "interpreter".into()
            } else {
                "gpu".into()
            },
            run_mode: opts.run_mode.as_str().into(),
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
            search: format!("{:?}", exp.search.strategy).to_lowercase(),
            tolerance: serde_json::to_value(&tolerance).expect("tolerance serialises"),
            fingerprint,
            started_at: now_rfc3339(),
            planned_jobs: planned,
        };
        journal.append(&Entry::Run(Box::new(header)))?;

        let mut probe = Some(probe);
        for (i, device) in lanes.iter().enumerate() {
            let rx = Arc::clone(&group_rx);
            let events = event_tx.clone();
            let mut backend = match (i, probe.take()) {
                (0, Some(p)) => p,
                _ => PythonBackend::new(
                    spec("lane", device.clone(), format!("lane{i}.log")),
                    &exp.problem,
                    timeout,
                ),
            };
            let protocol = protocol.clone();
            let tolerance = tolerance.clone();
            let peak = &peak;
            let board = if use_pool { Some(board) } else { None };
            let strategy = exp.search.strategy;
            let eta = exp.search.eta;
            let budget = exp.search.budget;
            let search_seed = exp.search.seed;
            let prior = &prior;
            let run_mode = opts.run_mode;
            let peak_gbs = opts.device.peak_gbs;
            scope.spawn(move || {
                let ctx = lane::LaneContext {
                    protocol,
                    tolerance,
                    strategy,
                    eta,
                    run_mode,
                    flush,
                    peak_gbs,
                    peak_tflops: peak,
                    compile: board,
                    lane: i as u32,
                    budget,
                    search_seed,
                    prior: Some(prior),
                };
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
        drop(event_tx);

        // The journal's single writer: every event is on disk before the next is read.
        for event in event_rx {
            match event {
                Event::Job(record) => {
                    match record.status {
                        JobStatus::Ok => outcome.ok += 1,
                        JobStatus::Failed => outcome.failed += 1,
                        JobStatus::Pruned => outcome.pruned += 1,
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
            .map_err(RunError::Input)?;
        Ok(())
    })?;
    // The compile workers have drained their queue by now; wait for them to exit.
    drop(pool);
    outcome.interrupted = interrupted();
    outcome.wall_s = started.elapsed().as_secs_f64();
    Ok(outcome)
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
                let method = exp.methods.iter().find(|m| m.name == job.method);
                job.baseline || method.is_some_and(|m| m.axes.is_empty())
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
/// about 10 %), or None. A header without `flush_with` is from a memset run.
fn flush_conflict(before: &RawProtocol, now: &RawProtocol) -> Option<String> {
    if !(before.flush_l2 && now.flush_l2) {
        return None;
    }
    let (was, is) = (before.recorded_flush(), now.flush_with.unwrap_or_default());
    (was != is).then(|| {
        format!(
            "the journal's jobs were timed after a {} flush of L2 and this run would flush with a {}: \
             one report would mix the two",
            was.as_str(),
            is.as_str()
        )
    })
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
    use crate::manifest::raw::FlushWith;

    #[test]
    fn a_run_does_not_mix_flushes_in_one_journal() {
        let old_journal = RawProtocol::default(); // no flush_with: a memset run
        let now = effective_protocol(&RawProtocol::default(), Mode::Gpu);
        let message = flush_conflict(&old_journal, &now).expect("memset journal, read run");
        assert!(
            message.contains("memset") && message.contains("read"),
            "{message}"
        );
        let memset = effective_protocol(
            &RawProtocol {
                flush_with: Some(FlushWith::Memset),
                ..RawProtocol::default()
            },
            Mode::Gpu,
        );
        assert_eq!(flush_conflict(&old_journal, &memset), None);
        assert_eq!(flush_conflict(&now, &now), None);
        assert!(flush_conflict(&now, &memset).is_some());
        // An interpreter run flushes nothing, so any journal suits it.
        let interp = effective_protocol(&RawProtocol::default(), Mode::Interpreter);
        assert_eq!(flush_conflict(&old_journal, &interp), None);
    }

    #[test]
    fn a_gpu_run_records_how_it_flushes() {
        let unset = RawProtocol::default();
        assert_eq!(unset.flush_with, None);
        let gpu = effective_protocol(&unset, Mode::Gpu);
        assert_eq!(gpu.flush_with, Some(FlushWith::Read));
        let memset = RawProtocol {
            flush_with: Some(FlushWith::Memset),
            ..RawProtocol::default()
        };
        assert_eq!(
            effective_protocol(&memset, Mode::Gpu).flush_with,
            Some(FlushWith::Memset)
        );
        // The interpreter never flushes.
        assert!(!effective_protocol(&unset, Mode::Interpreter).flush_l2);
    }
}
