//! The measurement protocol a run uses, fully resolved: every knob has its
//! value, none means "whatever the default was". The manifest resolves its
//! `protocol:` section into this type; lanes, workers and the journal header
//! use it as it is.

use serde::{Deserialize, Serialize};

/// How every job is timed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocol {
    /// Launches before the first sample, at least.
    pub warmup_launches: u32,
    /// GPU time spent warming up before the first sample, at least.
    pub warmup_ms: f64,
    /// How every job is timed, and so ranked.
    pub timing: Timing,
    /// Calls captured in one CUDA graph and replayed per sample, for graph timing.
    pub graph_calls: u32,
    /// Other timings the finalists of each group are re-timed under, so a
    /// report can show where their winner differs (`[graph]`: as vLLM's
    /// benchmark and its decode steps run).
    pub retime_with: Vec<Timing>,
    /// How L2 is evicted before each cold sample.
    pub flush: L2Flush,
    /// Size of the buffer that evicts L2; `None`: max(2 × the device's L2, 32 MiB).
    pub flush_bytes: Option<u64>,
    /// Samples queued per host synchronisation.
    pub batch: u32,
    pub min_samples: u32,
    pub max_samples: u32,
    /// Stop once the 95 % confidence interval of the median is within this fraction of it.
    pub target_ci: f64,
    /// Cap on summed kernel time per job.
    pub max_gpu_ms: f64,
    /// Cap on wall time spent sampling one job.
    pub max_wall_ms: f64,
    /// Racing: a job whose median is, with 95 % confidence, more than this
    /// fraction slower than the best median its group has measured so far
    /// stops sampling at `min_samples` (flagged `OUTPACED`) instead of
    /// refining a figure that cannot win. 0: off, every job samples to
    /// `target_ci`. It never drops a config: an outpaced job keeps its
    /// median, and is a finalist if that median ranks it one.
    pub race: f64,
    /// Best configs per shape re-timed interleaved at the end.
    pub finalists: u32,
    /// In the finalists' re-timing, the GPU idles after each batch for this
    /// many times the batch's kernel time, so that the power cap does not pull
    /// the clock down in the middle of the comparison (0: back to back, as
    /// journals of format 2 re-timed, and read as).
    pub retime_rest: f64,
    /// Seconds a job may take (compile, check or sampling) before its worker is killed.
    pub timeout_s: f64,
    /// Seed for inputs.
    pub seed: u64,
}

/// How the L2 flush before each cold sample evicts the cache.
///
/// A memset leaves L2 full of dirty lines, and writing them back to memory
/// competes with the timed kernel's own traffic: on an H100 (2026-11-22,
/// bench/moe_breakdown.py) it added about 10 µs to every memory-bound fused-MoE
/// call, 96.4 against 86.7 µs at M=1. A read of the same buffer leaves the cache
/// just as cold but clean, which is the state a kernel meets in a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum L2Flush {
    /// No flush: samples see whatever the previous launch left in L2.
    Off,
    /// Read the flush buffer (a max-reduction): L2 ends up holding clean lines.
    Read,
    /// Write the flush buffer (a memset), as triton.testing.do_bench does.
    Memset,
}

/// How a sample is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Timing {
    /// Events around each launch, L2 evicted before each (the protocol's flush).
    Cold,
    /// Events around each launch, L2 left as the previous launch left it.
    Hot,
    /// `graph_calls` back-to-back launches captured in one CUDA graph,
    /// replayed between two events; a sample is the replay's time per call.
    /// No flush: the consumer's decode conditions (vLLM's benchmark times so).
    Graph,
}

impl Timing {
    pub fn as_str(self) -> &'static str {
        match self {
            Timing::Cold => "cold",
            Timing::Hot => "hot",
            Timing::Graph => "graph",
        }
    }
}

impl L2Flush {
    pub fn as_str(self) -> &'static str {
        match self {
            L2Flush::Off => "off",
            L2Flush::Read => "read",
            L2Flush::Memset => "memset",
        }
    }
}

impl Protocol {
    /// When a job has enough samples.
    pub fn stop_rule(&self) -> super::StopRule {
        super::StopRule {
            min_samples: self.min_samples,
            max_samples: self.max_samples,
            target_ci: self.target_ci,
            max_gpu_ms: self.max_gpu_ms,
            max_wall_ms: self.max_wall_ms,
            outpaced_above_us: None,
        }
    }

    /// The stopping rule of a job whose group has measured `best_us` as its
    /// best median so far: with racing on, it also stops once the job is
    /// outpaced (see [`Protocol::race`]).
    pub fn racing_rule(&self, best_us: Option<f64>) -> super::StopRule {
        super::StopRule {
            outpaced_above_us: best_us
                .filter(|b| self.race > 0.0 && b.is_finite() && *b > 0.0)
                .map(|b| b * (1.0 + self.race)),
            ..self.stop_rule()
        }
    }

    /// The flush buffer's size on a device with `l2_bytes` of L2; 0 when off.
    pub fn flush_bytes_for(&self, l2_bytes: u64) -> u64 {
        match self.flush {
            L2Flush::Off => 0,
            L2Flush::Read | L2Flush::Memset => {
                self.flush_bytes.unwrap_or((2 * l2_bytes).max(32 << 20))
            }
        }
    }

    /// The protocol an interpreter run uses instead: its timings mean nothing
    /// and each launch takes seconds, so two samples, no flush, no finalists,
    /// and no warm-up (the check has launched the kernel, and the interpreter
    /// compiles nothing).
    pub fn for_interpreter(&self) -> Protocol {
        Protocol {
            warmup_launches: 0,
            warmup_ms: 0.0,
            retime_with: Vec::new(),
            flush: L2Flush::Off,
            batch: 2,
            min_samples: 2,
            max_samples: 2,
            finalists: 0,
            retime_rest: 0.0,
            ..self.clone()
        }
    }
}
