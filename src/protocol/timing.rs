//! The timing messages both workers serve alike (`warmup`, `sample`, a
//! check's `then`), and the rules of the timing loop both implement: the
//! Python worker's `CudaEventTimer` (python/tunelab/worker.py) and the
//! native worker's (`src/native/server/timing.rs`). The limits and defaults
//! here are the ones both apply; the generated schema carries them, and the
//! transcript test (tests/protocol_transcript.rs) holds both workers to them.
//!
//! The stopping rule a check's `then.until` carries is `measure::StopRule`,
//! evaluated by `measure::Sampling::decide_by`: the runner's own rule, which
//! the native worker runs to go on sampling within a call.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::measure::{StopRule, Timer, Timing};

/// The most samples one batch (and launches one warm-up) may ask for.
pub const MAX_SAMPLES: u64 = 1_000_000;
/// The most launches one CUDA graph may hold (`graph_calls`).
pub const MAX_GRAPH_CALLS: u64 = 10_000;
/// Launches one warm-up batch queues at most between its event pair.
pub const MAX_WARMUP_BATCH: u64 = 4096;
/// The spin kernel ahead of a batch is sized to outlast the host's queueing
/// of the batch (1.5 × the last queueing time per sample × count), and held
/// to this many microseconds at most. A batch the host needs longer than
/// that to queue goes in chunks, each behind its own spin (the Python
/// worker's `tunelab.timers`: a Python library call such as triton_kernels'
/// costs about a millisecond of host time a launch; a native launch queues
/// in microseconds, far within the cap).
pub const MAX_SPIN_US: f64 = 20_000.0;

fn three() -> u64 {
    3
}

fn five_ms() -> f64 {
    5.0
}

fn ten() -> u64 {
    10
}

/// A warm-up: launch the prepared job until both limits are met.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Warmup {
    /// Launches at least (default 3).
    #[serde(default = "three")]
    #[schemars(range(max = 1_000_000))]
    pub min_launches: u64,
    /// GPU time at least, in milliseconds (default 5.0): a finite number >= 0.
    #[serde(default = "five_ms")]
    #[schemars(range(min = 0))]
    pub min_ms: f64,
}

impl Warmup {
    /// Whether the request is within the protocol's limits (its message when not).
    pub fn check(&self) -> Result<(), String> {
        in_range("min_launches", self.min_launches, 0, MAX_SAMPLES)?;
        if !(self.min_ms.is_finite() && self.min_ms >= 0.0) {
            return Err("`min_ms` must be a finite number >= 0".into());
        }
        Ok(())
    }
}

/// How the L2 flush buffer is touched before each cold sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FlushWith {
    /// Read it (a reduction): L2 left holding clean lines.
    #[default]
    Read,
    /// Write it (a memset): L2 left holding dirty lines.
    Memset,
}

impl FlushWith {
    pub fn as_str(self) -> &'static str {
        match self {
            FlushWith::Read => "read",
            FlushWith::Memset => "memset",
        }
    }
}

fn cold() -> Timing {
    Timing::Cold
}

/// A batch of timed samples of the prepared job.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Sample {
    /// Samples in the batch: all queued, one host synchronisation.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub count: u64,
    /// The L2 flush buffer's size before each cold sample; 0: no flush.
    #[serde(default)]
    pub flush_bytes: u64,
    #[serde(default)]
    pub flush_with: FlushWith,
    /// `cold` (default): a flush before each launch, an event pair around
    /// it; `hot`: no flush; `graph`: `graph_calls` launches in one CUDA
    /// graph, a sample its replay's time / `graph_calls`.
    #[serde(default = "cold")]
    pub timing: Timing,
    /// Launches per CUDA graph, for `graph` timing (default 10).
    #[serde(default = "ten")]
    #[schemars(range(min = 1, max = 10_000))]
    pub graph_calls: u64,
}

impl Sample {
    /// Whether the request is within the protocol's limits (its message when not).
    pub fn check(&self) -> Result<(), String> {
        in_range("count", self.count, 1, MAX_SAMPLES)?;
        in_range("graph_calls", self.graph_calls, 1, MAX_GRAPH_CALLS)
    }
}

fn in_range(key: &str, v: u64, min: u64, max: u64) -> Result<(), String> {
    if v < min || v > max {
        return Err(format!("`{key}` must be in {min}..={max}, got {v}"));
    }
    Ok(())
}

/// `warmup` of the prepared job `job_id`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct JobWarmup {
    pub job_id: String,
    #[serde(flatten)]
    pub warmup: Warmup,
}

/// `sample` of the prepared job `job_id`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct JobSample {
    pub job_id: String,
    #[serde(flatten)]
    pub sample: Sample,
}

/// `sample_turns`: a warm-up of each prepared job named, then one batch of
/// `count` samples of each, the jobs taking turns sample by sample (an A/B
/// round, docs/ab.md "Taking turns"): each job meets the clock the others
/// meet, which two batches one after the other do not.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct JobsTurns {
    /// 2 to 8 distinct prepared jobs, in the order of their turns (the
    /// Python worker refuses others).
    #[schemars(length(min = 2, max = 8))]
    pub job_ids: Vec<String>,
    pub warmup: Warmup,
    /// `count` is per job.
    #[serde(flatten)]
    pub sample: Sample,
}

/// The answer to `sample_turns`: each job's samples in microseconds, in the
/// order of `job_ids`, what timed them, the SM clock read once after the batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnsAnswer {
    pub us: Vec<Vec<f64>>,
    pub timer: Timer,
    pub sm_clock_mhz: Option<f64>,
}

/// What a check that passes goes on to in the same call (`check`'s `then`):
/// the bodies of a `warmup` and a `sample` request, and with `until` the
/// batches after the first until the rule says enough (the native worker;
/// the Python worker answers one batch).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Then {
    pub warmup: Warmup,
    pub sample: Sample,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<StopRule>,
}

/// The answer to `warmup`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WarmupAnswer {
    pub launches: u64,
    /// GPU time from the first launch's start to the last one's end (the
    /// interpreter: wall time), in milliseconds.
    pub ms: f64,
}

/// The answer to `sample`: the batch's samples in microseconds, what timed
/// them, and the SM clock read once after the batch (null where unknown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SampleAnswer {
    pub us: Vec<f64>,
    pub timer: Timer,
    pub sm_clock_mhz: Option<f64>,
}

/// A batch a worker took after the first under `until`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MoreBatch {
    pub sample: SampleAnswer,
    /// The batch's own wall time, in milliseconds.
    pub wall_ms: f64,
}

/// A check's `then` answered: the warm-up and the first batch (and, from a
/// worker that went on under `until`, the batches after it in `more`), or
/// why they failed (`"ok": false`, `class`, `message`); the check's verdict
/// stands either way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ThenAnswer {
    #[serde(default)]
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<WarmupAnswer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleAnswer>,
    /// The first batch's own wall time, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub more: Option<Vec<MoreBatch>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<super::FailureKind>")]
    pub class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sample_request_takes_the_protocols_defaults_and_limits() {
        let s: Sample = serde_json::from_value(json!({"count": 4})).unwrap();
        assert_eq!(
            (s.flush_bytes, s.flush_with, s.timing, s.graph_calls),
            (0, FlushWith::Read, Timing::Cold, 10)
        );
        assert!(s.check().is_ok());
        for bad in [
            json!({"count": 0}),
            json!({"count": 1, "graph_calls": 10_001}),
        ] {
            let s: Sample = serde_json::from_value(bad).unwrap();
            assert!(s.check().is_err(), "{s:?}");
        }
        for unknown in [
            json!({"count": 1, "timing": "warm"}),
            json!({"count": 1, "flush_with": "dma"}),
            json!({"count": 1.5}),
        ] {
            assert!(serde_json::from_value::<Sample>(unknown).is_err());
        }
        let w: Warmup = serde_json::from_value(json!({})).unwrap();
        assert_eq!((w.min_launches, w.min_ms), (3, 5.0));
        let w = Warmup {
            min_launches: 1,
            min_ms: -1.0,
        };
        assert!(w.check().is_err());
    }

    #[test]
    fn a_failed_then_is_its_class_and_message_alone() {
        let failed = ThenAnswer {
            class: Some("launch_error".into()),
            message: Some("fault".into()),
            ..ThenAnswer::default()
        };
        assert_eq!(
            serde_json::to_value(&failed).unwrap(),
            json!({"ok": false, "class": "launch_error", "message": "fault"})
        );
    }
}
