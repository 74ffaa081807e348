//! Backends run jobs behind one trait. Today every method runs in a Python
//! worker process (Triton, torch, user problems); a native CUDA or HIP
//! backend implements the same trait.

pub mod native;
pub mod python;
pub mod wire;
pub mod worker;

pub use python::{Probe, PythonBackend};

pub use worker::{CallError, Worker, WorkerSpec};

use crate::manifest::ToleranceFor;
use crate::measure::{L2Flush, StopRule, Timer, Timing};
use crate::plan::Job;
use crate::store::{CheckResult, FailureClass, KernelResources};

/// A job failed; the class says why.
#[derive(Debug, Clone)]
pub struct JobFailure {
    pub class: FailureClass,
    pub message: String,
}

impl JobFailure {
    pub fn new(class: FailureClass, message: impl Into<String>) -> Self {
        JobFailure {
            class,
            message: message.into(),
        }
    }
}

/// A compile worker's answer for one job.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub seconds: f64,
    /// The job's native launch recipe (a Triton job under `inputs: native`)
    /// as `recipes` answers one: `ok` and the recipe, or why not. Made by
    /// the compile worker that compiled the job, so the lane's worker is not
    /// asked for it (`Backend::offer_recipe`).
    pub recipe: Option<serde_json::Value>,
}

impl Compiled {
    pub fn in_seconds(seconds: f64) -> Compiled {
        Compiled {
            seconds,
            recipe: None,
        }
    }

    /// Whether the compile worker made the job's recipe (not only tried).
    pub fn has_recipe(&self) -> bool {
        self.recipe
            .as_ref()
            .and_then(|r| r.get("ok"))
            .and_then(serde_json::Value::as_bool)
            == Some(true)
    }
}

/// The problem at one shape, as a worker describes it.
#[derive(Debug, Clone, Default)]
pub struct ShapeFacts {
    /// Useful floating-point operations; unknown when the problem's count is not finite.
    pub flops: Option<f64>,
    /// Minimal bytes moved; likewise.
    pub bytes: Option<f64>,
    /// Methods (by kernel name) that cannot run in this worker, and why.
    pub unavailable: indexmap::IndexMap<String, String>,
}

/// Raw timings of one batch of launches.
#[derive(Debug, Clone)]
pub struct SampleBatch {
    pub us: Vec<f64>,
    pub timer: Timer,
    pub sm_clock_mhz: Option<f64>,
}

/// What a lane asks to follow a passing check in the same round trip
/// (`Backend::check_then_sample`): the warm-up and the first batch, as the
/// separate `warmup` and `sample` calls would take them.
#[derive(Debug, Clone, Copy)]
pub struct FirstBatch {
    pub warmup_launches: u32,
    pub warmup_ms: f64,
    pub count: u32,
    pub mode: SampleMode,
    /// For a full measurement: the stopping rule under which a worker may go
    /// on taking batches of `count` after the first, in the same call (the
    /// native worker does; it runs the runner's own rule); for a screening
    /// sent ahead, a rule that counts the round's batches. A worker that
    /// does not answers one batch, and the lane takes the rest.
    pub until: Option<StopRule>,
    /// The job passed its check earlier in this group (a finalist's
    /// re-timing): a worker that still holds it prepared may answer that
    /// verdict again rather than bind, launch and compare anew, and keep
    /// the CUDA graphs it captured for it (docs/worker-protocol.md, `check`).
    pub reuse_check: bool,
}

/// A batch and the wall time its taking cost, in milliseconds (the worker's
/// own when the batch came with a check: the round trip was the check's).
#[derive(Debug, Clone)]
pub struct TimedBatch {
    pub batch: SampleBatch,
    pub wall_ms: f64,
}

/// A check's answer and, when one was asked for, the first batches.
#[derive(Debug)]
pub struct Checked {
    pub check: CheckResult,
    /// `None`: the check failed, or this backend did not go on (the lane warms
    /// up and samples itself). `Some(Ok)`: the first batch, and those taken
    /// after it under `FirstBatch::until`, in order. `Some(Err)`: the warm-up
    /// or a batch failed after a passing check; the check stands.
    pub first: Option<Result<Vec<TimedBatch>, JobFailure>>,
}

/// What became of a measurement a lane asked a backend to send ahead
/// ([`Backend::send_measurement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentAhead {
    /// Under way: its answer comes from [`Backend::receive_measurement`],
    /// in the order the measurements were sent.
    Sent,
    /// Not while others are under way: sending it needs calls of their own
    /// first (the Python worker's recipes, which touch the GPU, or sharing
    /// the shape). Send it again when nothing is under way.
    WhenIdle,
    /// This backend does not send this job ahead: ask it the usual way,
    /// waited for.
    Declined,
}

/// The answer to a request sent ahead (a measurement or a screening).
#[derive(Debug)]
pub enum Received {
    /// The check's answer and its batches, as `check_then_sample` gives
    /// them, and the kernels it launched.
    Answer {
        checked: Result<Checked, JobFailure>,
        kernels: Vec<KernelResources>,
    },
    /// The request went with its worker, which an earlier answer's failure
    /// discarded: it never ran (or its answer is not trusted), and the job
    /// is to be asked again.
    Lost,
}

/// The L2 flush before every sample of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flush {
    pub with: L2Flush,
    /// Size of the buffer it reads or writes; 0 when off.
    pub bytes: u64,
}

impl Flush {
    pub const NONE: Flush = Flush {
        with: L2Flush::Off,
        bytes: 0,
    };
}

/// How a batch of samples is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleMode {
    pub timing: Timing,
    /// Before each sample, for cold timing only.
    pub flush: Flush,
    /// Launches per CUDA graph, for graph timing.
    pub graph_calls: u32,
}

impl SampleMode {
    /// Cold samples with no flush: what the interpreter and tests take.
    pub const PLAIN: SampleMode = SampleMode {
        timing: Timing::Cold,
        flush: Flush::NONE,
        graph_calls: 1,
    };

    /// The same, timed another way (the flush applies to cold samples only).
    pub fn with_timing(self, timing: Timing) -> SampleMode {
        SampleMode { timing, ..self }
    }
}

/// What the scheduler asks of a backend. The backend never decides how many
/// samples to take; the scheduler does (see `measure`).
pub trait Backend {
    /// What the problem is at a shape: flops, bytes, methods that cannot run
    /// here. A lane backend also builds the shape's inputs and reference for
    /// `seed` here, ahead of its first check.
    fn describe(&mut self, shape: &serde_json::Value, seed: u64) -> Result<ShapeFacts, JobFailure>;
    /// A group of `method` at `shape` begins, its jobs not yet compiled: a
    /// backend may make ready what all of them need while the lane waits for
    /// the first compile (the native lane's data for `shape`, shared with or
    /// built by the native worker). Its failure is not the group's: the
    /// first job tries again and records its own failure (one that does not
    /// recur shows only in the trace, as a failed or lost call). The
    /// default does nothing.
    fn begin_group(&mut self, method: &str, shape: &crate::manifest::Shape, seed: u64) {
        let _ = (method, shape, seed);
    }
    /// Compile without timing; returns seconds spent.
    fn compile(&mut self, job: &Job, kernel: &str, kind: &str) -> Result<f64, JobFailure>;
    /// Correctness gate; on success the job stays prepared for warmup and sampling.
    fn check(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        tol: ToleranceFor,
        seed: u64,
    ) -> Result<CheckResult, JobFailure>;
    /// What the compiler made of the kernels the last `check` launched
    /// (registers, spills, shared memory), taken once; empty where the
    /// backend cannot tell or nothing was compiled.
    fn take_kernels(&mut self) -> Vec<KernelResources> {
        Vec::new()
    }
    /// `check`, then, when it passes, the warm-up and `first`'s batch, in
    /// one round trip where the backend can: the worker knows the verdict,
    /// so it goes on without waiting to be asked. The default checks only.
    fn check_then_sample(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        tol: ToleranceFor,
        seed: u64,
        first: FirstBatch,
    ) -> Result<Checked, JobFailure> {
        let _ = first;
        let check = self.check(job, kernel, kind, tol, seed)?;
        Ok(Checked { check, first: None })
    }
    /// Before `job`'s check: a backend that prepares jobs in batches (the
    /// native lane's Triton recipes) may take the jobs likely to follow it,
    /// `ahead(n)`: up to `n` of the group's jobs not yet started whose
    /// compile is done, in the group's order. The default takes none.
    fn look_ahead(&mut self, job: &Job, ahead: &mut dyn FnMut(usize) -> Vec<Job>) {
        let _ = (job, ahead);
    }
    /// The job's native launch recipe as the compile pool made it
    /// ([`Compiled::recipe`], only one made: [`Compiled::has_recipe`]),
    /// before its check: a backend that launches Triton jobs natively keeps
    /// it rather than ask its own worker. The default has no use for it.
    fn offer_recipe(&mut self, job_id: &str, recipe: serde_json::Value) {
        let _ = (job_id, recipe);
    }
    /// A full measurement or a screening (`check_then_sample` with
    /// `first.until` set) sent without waiting for its answer, where the
    /// backend can: the lane sends the next job while the worker still
    /// measures the last,
    /// so that the GPU goes from one job to the next without waiting for
    /// the lane to record. A job's own failure before anything was sent
    /// (a compile error, its recipe) is `Err`. The default declines.
    fn send_measurement(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        tol: ToleranceFor,
        seed: u64,
        first: FirstBatch,
    ) -> Result<SentAhead, JobFailure> {
        let _ = (job, kernel, kind, tol, seed, first);
        Ok(SentAhead::Declined)
    }
    /// The answer to the oldest request sent ahead and not yet received.
    /// Only called after a `send_measurement` that answered `Sent`.
    fn receive_measurement(&mut self) -> Received {
        unreachable!("a backend that sends nothing ahead has nothing to receive")
    }
    /// When the worker that took the last batch finished its answer, on this
    /// process's clock ([`worker::Worker::last_done`]): the GPU has been idle
    /// since, so a rest after a batch counts from it. `None` where the
    /// backend cannot tell (the rest then counts from when it begins).
    fn last_done(&self) -> Option<std::time::Instant> {
        None
    }
    fn warmup(&mut self, job_id: &str, launches: u32, ms: f64) -> Result<(), JobFailure>;
    fn sample(
        &mut self,
        job_id: &str,
        count: u32,
        mode: SampleMode,
    ) -> Result<SampleBatch, JobFailure>;
    /// A warm-up of each prepared job (`launches`, `ms` as [`Backend::warmup`]),
    /// then one batch of `count` samples of each, the jobs taking turns
    /// sample by sample (`sample_turns`, docs/ab.md "Taking turns"): one
    /// batch per job, in the order of `job_ids`. `Ok(None)` where the
    /// backend cannot (the native worker): the caller times the jobs one
    /// batch after the other. The default cannot.
    fn sample_turns(
        &mut self,
        job_ids: &[&str],
        warmup: (u32, f64),
        count: u32,
        mode: SampleMode,
    ) -> Result<Option<Vec<SampleBatch>>, JobFailure> {
        let _ = (job_ids, warmup, count, mode);
        Ok(None)
    }
}
