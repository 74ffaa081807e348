//! What an A/B run records (`tunelab ab`, docs/ab.md), added by format 5:
//! its setup once after its run header, and one record per (shape, method)
//! pair it timed. Records hold measurements only: the verdicts, the noise
//! floor and the gate are worked out from them (`emit::ab`), so the report
//! regenerates from the journal alone.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::record::{CheckResult, Failure, KernelResources};
use crate::manifest::MethodKind;
use crate::measure::Stats;

/// An A/B run's two sides and how their pairs are timed, written after
/// each of its run headers (a resumed A/B writes the same setup again).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AbSetup {
    /// Names this A/B: a hash of its sides and how they are timed. Its pair
    /// records carry it, so a journal may hold several A/Bs.
    pub id: String,
    pub a: AbSide,
    pub b: AbSide,
    /// Rounds of A against a second preparation of A, per pair, before the
    /// A/B rounds: what this run's noise is.
    pub aa_rounds: u32,
    /// Rounds of A against B per pair (A B, then B A, ...).
    pub rounds: u32,
    /// Samples in each side's batch of a round.
    pub batch: u32,
    /// The smallest change a verdict calls FAST or SLOW (a fraction).
    pub threshold: f64,
    /// Rounds added, once, to a pair whose verdict after `rounds` is
    /// AMBIGUOUS (0, and absent from the record: none; A/Bs before it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub extra_rounds: u32,
    /// B's planted slowdown as a fraction of A's median in the A/A rounds
    /// (a testing knob; 0: none).
    pub plant: f64,
    /// How a round times its two sides (absent from the record: `batches`,
    /// A/Bs before the choice).
    #[serde(default, skip_serializing_if = "Interleave::is_batches")]
    pub interleave: Interleave,
}

/// How a round of an A/B times its two sides (docs/ab.md, "Taking turns").
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Interleave {
    /// One batch, the sides taking turns sample by sample: both meet the
    /// same clock. A worker that cannot (the native worker) times the
    /// pair's rounds as `batches`, and its record says so.
    Samples,
    /// A warm-up and a batch of one side, then of the other.
    #[default]
    Batches,
}

impl Interleave {
    fn is_batches(&self) -> bool {
        *self == Interleave::Batches
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Interleave::Samples => "samples",
            Interleave::Batches => "batches",
        }
    }
}

/// One side of an A/B: where its configs came from and what code it ran.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AbSide {
    /// What the command line named: a results directory, a shipped file.
    pub picks: String,
    pub source: PicksSource,
    /// Modules this side ran from other files than the working tree's.
    pub code: Vec<AbCode>,
}

/// Where a side's configs came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PicksSource {
    /// A results directory's journal: the pick per (shape, method) (`emit::select`).
    Results,
    /// A consumer's shipped file (a vLLM fused-MoE JSON), in the method that writes that format.
    Shipped,
}

/// A module a side ran from another file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AbCode {
    /// The module's dotted name (`tunelab.kernels.fused_moe`).
    pub module: String,
    /// Where the file came from: `REV:PATH` (a git revision) or a path.
    pub from: String,
    /// The file's BLAKE3, hex.
    pub blake3: String,
}

/// One (shape, method) timed A against B in rounds, after the A/A rounds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AbPair {
    /// The `AbSetup` this pair belongs to.
    pub setup: String,
    pub shape: IndexMap<String, Json>,
    pub method: String,
    pub kind: MethodKind,
    pub kernel: String,
    pub a: AbJob,
    pub b: AbJob,
    /// The id of A's second preparation, A's other side in the A/A rounds.
    pub aa_job_id: String,
    /// Microseconds of spin B's launches were given (the plant asked for;
    /// 0: none).
    pub plant_us: f64,
    /// The A/A rounds: `a` is A, `b` A's second preparation.
    pub aa: Vec<AbRound>,
    /// The A/B rounds.
    pub rounds: Vec<AbRound>,
    /// Rounds that lost a side's batch (a failed call) and count for nothing.
    pub lost_rounds: u32,
    /// Rounds added because the verdict after the setup's `rounds` was
    /// AMBIGUOUS (0, and absent from the record: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub extra_rounds: u32,
    /// Every sample of each side in the A/B rounds, summarised.
    pub a_stats: Option<Stats>,
    pub b_stats: Option<Stats>,
    /// Why the pair has no rounds (a side that failed its check, say).
    pub failure: Option<Failure>,
    pub lane: u32,
    /// Wall time from the pair's start to its record.
    pub duration_s: f64,
    /// RFC 3339 UTC time the record was written.
    pub finished_at: String,
}

/// A side's job in a pair.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AbJob {
    pub job_id: String,
    pub config: IndexMap<String, Json>,
    /// Its correctness check, where it got that far.
    pub check: Option<CheckResult>,
    pub kernels: Vec<KernelResources>,
}

/// One round: one batch of each side, back to back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AbRound {
    /// B's batch ran first (A B, then B A, ...).
    pub b_first: bool,
    /// Each batch's median, microseconds.
    pub a_us: f64,
    pub b_us: f64,
    /// The SM clock read after each batch, MHz (none without NVML).
    pub a_clock_mhz: Option<f64>,
    pub b_clock_mhz: Option<f64>,
    /// The sides took turns sample by sample in one batch (the setup's
    /// `interleave: samples`); absent: a batch each, one after the other.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub turns: bool,
}

impl AbRound {
    /// ln(B / A): what the verdict averages.
    pub fn log_ratio(&self) -> f64 {
        (self.b_us / self.a_us).ln()
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
