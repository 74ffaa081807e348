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
//! 5. [`drain()`]: planner, lanes and the journal's single writer until done;
//! 6. the outputs, regenerated from the journal.
//!
//! This file holds the run's options, outcome and events and [`run`]
//! itself; its phases live apart: what a results directory holds and which
//! jobs run (`resume.rs`), starting the workers (`workers.rs`), and the
//! drain, with the planner's and lanes' threads (`drain.rs`).
//!
//! [`Journal::open_claimed`]: crate::store::Journal::open_claimed

pub mod ab;
pub mod compile;
pub mod deal;
mod drain;
pub mod lane;
pub mod preflight;
pub mod progress;
mod resume;
mod workers;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::device::DeviceInfo;
use crate::manifest::{Experiment, LaunchPath, MethodKind, Shape};
use crate::measure::Protocol;
use crate::plan::{self, Filter, Job, Mode, PlanOptions, RunMode, Shard};
use crate::store::lock::Claim;
use crate::store::{FinalRecord, Fingerprint, JobRecord, LaneRetired, StoreError};

use drain::{drain, Drain, Opening};
use resume::{count_pairs, count_plan, Resume, Selection};
use workers::Workers;
pub use workers::{compile_target, visible_devices_var};

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
    use crate::measure::L2Flush;

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
