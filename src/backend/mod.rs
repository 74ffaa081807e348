//! Backends run jobs behind one trait. Today every method runs in a Python
//! worker process (Triton, torch, user problems); a native CUDA or HIP
//! backend implements the same trait.

pub mod python;
pub mod worker;

pub use python::{Probe, PythonBackend};
pub use worker::{CallError, Worker, WorkerSpec};

use crate::manifest::ToleranceFor;
use crate::measure::{L2Flush, Timer};
use crate::plan::Job;
use crate::store::{CheckResult, FailureClass};

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

/// Raw timings of one batch of launches.
#[derive(Debug, Clone)]
pub struct SampleBatch {
    pub us: Vec<f64>,
    pub timer: Timer,
    pub sm_clock_mhz: Option<f64>,
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

/// What the scheduler asks of a backend. The backend never decides how many
/// samples to take; the scheduler does (see `measure`).
pub trait Backend {
    /// (flops, bytes) of the problem at a shape, each unknown where the
    /// problem's count is not a finite number. A lane backend also builds
    /// the shape's inputs and reference for `seed` here, ahead of its first check.
    fn describe(
        &mut self,
        shape: &serde_json::Value,
        seed: u64,
    ) -> Result<(Option<f64>, Option<f64>), JobFailure>;
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
    fn warmup(&mut self, job_id: &str, launches: u32, ms: f64) -> Result<(), JobFailure>;
    fn sample(&mut self, job_id: &str, count: u32, flush: Flush)
        -> Result<SampleBatch, JobFailure>;
}
