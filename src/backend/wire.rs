//! The protocol's messages (`crate::protocol`) as the backends' values and
//! back: the timing requests both workers take built from what the lane
//! asks for, the answers they send read into samples, checks, kernels and
//! failures. Shared by the Python backend and the native lane, so both
//! workers' answers are read by one code.

use crate::measure::L2Flush;
use crate::protocol::native::Comparison;
use crate::protocol::python::Kernel;
use crate::protocol::{FlushWith, Sample, SampleAnswer, Then, ThenAnswer, Warmup};
use crate::store::{CheckResult, FailureClass, KernelResources};

use super::{FirstBatch, JobFailure, SampleBatch, SampleMode, TimedBatch};

/// The failure a worker's answer names by its `class` and `message`.
pub fn failure_from(class: Option<&str>, message: Option<&str>) -> JobFailure {
    let class = match class.unwrap_or("") {
        "compile_error" => FailureClass::CompileError,
        "out_of_resources" => FailureClass::OutOfResources,
        "launch_error" => FailureClass::LaunchError,
        "mismatch" => FailureClass::Mismatch,
        "nan" => FailureClass::Nan,
        _ => FailureClass::ProblemError,
    };
    JobFailure::new(class, message.unwrap_or("no message").to_string())
}

/// An answer that does not fit its message: the worker is out of protocol.
pub fn unfit(what: &str, e: impl std::fmt::Display) -> JobFailure {
    JobFailure::new(
        FailureClass::Crash,
        format!("protocol error: {what} does not fit ({e})"),
    )
}

/// The body of a `sample` request (both workers take it): the protocol
/// knows a read and a memset; no flush is a size of zero.
pub fn sample_body(count: u32, mode: SampleMode) -> Sample {
    let flush = mode.flush;
    let (flush_bytes, flush_with) = match flush.with {
        L2Flush::Off => (0, FlushWith::Read),
        L2Flush::Read => (flush.bytes, FlushWith::Read),
        L2Flush::Memset => (flush.bytes, FlushWith::Memset),
    };
    Sample {
        count: count as u64,
        flush_bytes,
        flush_with,
        timing: mode.timing,
        graph_calls: mode.graph_calls as u64,
    }
}

/// The `then` of a `check` request (both workers take it): what to do
/// after a passing check, in the same call.
pub fn then_body(first: &FirstBatch) -> Then {
    Then {
        warmup: Warmup {
            min_launches: first.warmup_launches as u64,
            min_ms: first.warmup_ms,
        },
        sample: sample_body(first.count, first.mode),
        until: first.until,
    }
}

/// A `sample` answer as a batch, if the worker sent as many samples as it
/// was asked for.
pub fn batch_of(answer: SampleAnswer, count: u32) -> Result<SampleBatch, JobFailure> {
    if answer.us.len() != count as usize {
        return Err(JobFailure::new(
            FailureClass::Crash,
            format!(
                "protocol error: asked for {count} samples, got {}",
                answer.us.len()
            ),
        ));
    }
    Ok(SampleBatch {
        us: answer.us,
        timer: answer.timer,
        sm_clock_mhz: answer.sm_clock_mhz,
    })
}

/// A check answer's `then`, as parsed from either worker's answer: its
/// batches in order, or the failure that it does not fit, that the worker
/// reports, or that a batch holds other than the `count` samples asked for.
pub fn batches_of(
    parsed: serde_json::Result<ThenAnswer>,
    count: u32,
) -> Result<Vec<TimedBatch>, JobFailure> {
    let then = parsed.map_err(|e| unfit("the `then` of the answer to `check`", e))?;
    if !then.ok {
        return Err(failure_from(then.class.as_deref(), then.message.as_deref()));
    }
    let (Some(first), Some(wall_ms)) = (then.sample, then.wall_ms) else {
        return Err(JobFailure::new(
            FailureClass::Crash,
            "protocol error: the `then` of the answer to `check` has no `sample` or `wall_ms`",
        ));
    };
    std::iter::once((first, wall_ms))
        .chain(
            then.more
                .unwrap_or_default()
                .into_iter()
                .map(|b| (b.sample, b.wall_ms)),
        )
        .map(|(sample, wall_ms)| batch_of(sample, count).map(|batch| TimedBatch { batch, wall_ms }))
        .collect()
}

impl From<Comparison> for CheckResult {
    fn from(r: Comparison) -> CheckResult {
        CheckResult {
            passed: r.passed,
            max_abs_err: r.max_abs_err,
            max_rel_err: r.max_rel_err,
            mismatch_frac: r.mismatch_frac,
            nan_count: r.nan_count,
            inf_count: r.inf_count,
            elements: r.elements,
        }
    }
}

impl From<Kernel> for KernelResources {
    fn from(k: Kernel) -> KernelResources {
        KernelResources {
            name: k.name,
            n_regs: k.n_regs,
            n_spills: k.n_spills,
            shared: k.shared,
            num_warps: k.num_warps,
            num_stages: k.num_stages,
        }
    }
}

impl From<crate::protocol::native::LoadedKernel> for KernelResources {
    /// Spills counted as Triton counts them (local bytes / 4), warps from the
    /// block size; stages do not apply (0).
    fn from(k: crate::protocol::native::LoadedKernel) -> KernelResources {
        KernelResources {
            name: k.name,
            n_regs: k.n_regs.map(|v| v as u32),
            n_spills: k.local_bytes.map(|v| (v / 4) as u32),
            shared: k.shared,
            num_warps: k.threads.map_or(0, |t| t.div_ceil(32) as u32),
            num_stages: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn batches_taken_until_the_rule_come_back_in_order() {
        let then = serde_json::from_value(json!({"ok": true,
            "warmup": {"launches": 3, "ms": 5.0},
            "sample": {"us": [1.0, 2.0], "timer": "cuda_event", "sm_clock_mhz": null},
            "wall_ms": 0.5, "more": [
                {"sample": {"us": [3.0, 4.0], "timer": "cuda_event", "sm_clock_mhz": 1500.0},
                 "wall_ms": 0.6},
                {"sample": {"us": [5.0, 6.0], "timer": "cuda_event", "sm_clock_mhz": 1900.0},
                 "wall_ms": 0.7}]}));
        let batches = batches_of(then, 2).unwrap();
        let us: Vec<f64> = batches.iter().flat_map(|b| b.batch.us.clone()).collect();
        assert_eq!(us, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let clocks: Vec<Option<f64>> = batches.iter().map(|b| b.batch.sm_clock_mhz).collect();
        assert_eq!(
            clocks,
            vec![None, Some(1500.0), Some(1900.0)],
            "each batch its clock"
        );
        let walls: Vec<f64> = batches.iter().map(|b| b.wall_ms).collect();
        assert_eq!(walls, vec![0.5, 0.6, 0.7]);
        // A later batch short of samples is a protocol error, as a first one is.
        let short = serde_json::from_value(json!({"ok": true,
            "sample": {"us": [1.0, 2.0], "timer": "cuda_event", "sm_clock_mhz": null},
            "wall_ms": 0.5,
            "more": [{"sample": {"us": [3.0], "timer": "cuda_event", "sm_clock_mhz": null},
                      "wall_ms": 0.6}]}));
        assert_eq!(batches_of(short, 2).unwrap_err().class, FailureClass::Crash);
        // A failure is its class and message.
        let failed = serde_json::from_value(
            json!({"ok": false, "class": "launch_error", "message": "illegal address"}),
        );
        let f = batches_of(failed, 2).unwrap_err();
        assert_eq!(
            (f.class, f.message.as_str()),
            (FailureClass::LaunchError, "illegal address")
        );
    }

    #[test]
    fn a_sample_body_spells_the_flush_as_the_workers_take_it() {
        use crate::backend::Flush;
        use crate::measure::Timing;
        let mode = SampleMode {
            timing: Timing::Cold,
            flush: Flush {
                with: L2Flush::Memset,
                bytes: 64,
            },
            graph_calls: 10,
        };
        assert_eq!(
            serde_json::to_value(sample_body(32, mode)).unwrap(),
            json!({"count": 32, "flush_bytes": 64, "flush_with": "memset",
                   "timing": "cold", "graph_calls": 10})
        );
        let off = SampleMode {
            flush: Flush::NONE,
            ..mode
        };
        assert_eq!(
            serde_json::to_value(sample_body(2, off)).unwrap()["flush_with"],
            "read",
            "no flush is a size of zero"
        );
    }
}
