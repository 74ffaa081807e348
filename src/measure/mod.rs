//! Measurement: the resolved protocol every job is timed under, the
//! statistics of its samples and the rule that says when it has enough.
//! One implementation for every backend: the Python worker only returns
//! samples, and the native worker, which goes on sampling within a call,
//! runs this same rule (`StopRule`, `Sampling::decide_by`). Verdicts with a
//! noise model (paired rounds, equivalence margins) are in `paired`.

pub mod paired;
mod protocol;
mod stats;

pub use protocol::{L2Flush, Protocol, Timing};
pub use stats::{
    geomean, indistinguishable, median_ci, quantile, sorted, summarize, tied, verdict, Decision,
    Flag, Sampling, Stats, StopRule, Timer, Verdict,
};
