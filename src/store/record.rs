//! What the journal holds, format 5: one header per run, one record per
//! finished job, one record per finalist re-timing, and for an A/B run its
//! setup and one record per pair (`store/ab.rs`). Every output and the
//! report are made from these records alone (`tunelab report` regenerates
//! them).
//!
//! These types are the on-disk format. Every field is written out (no serde
//! defaults), so a changed default elsewhere cannot change what a journal
//! says; a change to any of these types is a new format: bump
//! [`FORMAT_VERSION`], keep the old reader in its own module (as `v1.rs`) and
//! migrate (`v1.rs` reads format 1, `v2.rs` format 2, `v3.rs` format 3,
//! `v4.rs` format 4). `tests/journal_format.rs`
//! pins the serialised form.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::device::DeviceInfo;
pub use crate::manifest::Compared;
use crate::manifest::{MethodKind, OutputFormat, Tolerance};
use crate::measure::{Protocol, Stats, Timing};
use crate::plan::{Mode, RunMode};
use crate::search::{Search, StrategyName};

/// The journal format this build writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 5;

/// Why a job has no timing. Failed jobs are never chosen as best.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    CompileError,
    OutOfResources,
    LaunchError,
    Mismatch,
    Nan,
    Timeout,
    Crash,
    /// The worker rejected the request or the problem could not be built.
    ProblemError,
    /// The method cannot run in this worker (a library that is not
    /// installed, a GPU it does not support); its jobs are skipped.
    Unavailable,
}

impl FailureClass {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::CompileError => "compile_error",
            FailureClass::OutOfResources => "out_of_resources",
            FailureClass::LaunchError => "launch_error",
            FailureClass::Mismatch => "mismatch",
            FailureClass::Nan => "nan",
            FailureClass::Timeout => "timeout",
            FailureClass::Crash => "crash",
            FailureClass::ProblemError => "problem_error",
            FailureClass::Unavailable => "unavailable",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    pub class: FailureClass,
    pub message: String,
}

/// The correctness gate's findings.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CheckResult {
    pub passed: bool,
    pub max_abs_err: Option<f64>,
    pub max_rel_err: Option<f64>,
    pub mismatch_frac: f64,
    pub nan_count: u64,
    pub inf_count: u64,
    pub elements: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Checked and timed.
    Ok,
    /// Checked only (`--mode check`).
    Checked,
    /// Failed; see `failure`.
    Failed,
    /// Timed briefly and dropped by successive halving.
    Pruned,
    /// Never run: the search strategy (surrogate) spent its budget elsewhere.
    Skipped,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Ok => "ok",
            JobStatus::Checked => "checked",
            JobStatus::Failed => "failed",
            JobStatus::Pruned => "pruned",
            JobStatus::Skipped => "skipped",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobRecord {
    pub job_id: String,
    pub method: String,
    pub kind: MethodKind,
    pub kernel: String,
    pub shape: IndexMap<String, Json>,
    pub config: IndexMap<String, Json>,
    /// This config is the method's baseline (e.g. vLLM's default) for the shape.
    pub baseline: bool,
    pub status: JobStatus,
    pub failure: Option<Failure>,
    pub check: Option<CheckResult>,
    pub stats: Option<Stats>,
    pub flops: Option<f64>,
    pub bytes: Option<f64>,
    pub tflops: Option<f64>,
    pub gbs: Option<f64>,
    /// max(flops / peak flops, bytes / peak bandwidth) / time, in percent.
    pub roofline_pct: Option<f64>,
    pub compile_s: Option<f64>,
    /// What the compiler made of each kernel the job launched, in launch
    /// order: registers, spills, shared memory. Empty where nothing was
    /// compiled (a torch method, the interpreter) or the job failed before
    /// its check compiled anything.
    pub kernels: Vec<KernelResources>,
    /// Wall time from the job's start to its record.
    pub duration_s: f64,
    pub lane: u32,
    /// RFC 3339 UTC time the record was written.
    pub finished_at: String,
}

impl JobRecord {
    /// The most registers per thread any of the job's kernels uses.
    pub fn max_regs(&self) -> Option<u32> {
        self.kernels.iter().filter_map(|k| k.n_regs).max()
    }

    /// Registers spilled per thread, summed over the job's kernels; `None`
    /// when no kernel's count is known.
    pub fn spills(&self) -> Option<u32> {
        let known: Vec<u32> = self.kernels.iter().filter_map(|k| k.n_spills).collect();
        (!known.is_empty()).then(|| known.iter().sum())
    }

    /// The most shared memory per block any of the job's kernels uses, in bytes.
    pub fn max_shared(&self) -> Option<u64> {
        self.kernels.iter().map(|k| k.shared).max()
    }
}

/// One compiled kernel of a job, as its compile metadata and the driver
/// describe it (docs/workbench.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KernelResources {
    /// The compiled kernel's name (`matmul_kernel`).
    pub name: String,
    /// Registers per thread: the driver's count once loaded on a GPU, else
    /// the cubin's (cuobjdump), which agree; `None` where neither was read.
    pub n_regs: Option<u32>,
    /// Registers spilled per thread: local memory bytes / 4, Triton's count.
    pub n_spills: Option<u32>,
    /// Shared memory per block, bytes (Triton's `metadata.shared`).
    pub shared: u64,
    pub num_warps: u32,
    pub num_stages: u32,
}

/// A finalist re-timed interleaved with the other finalists of its shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FinalRecord {
    pub job_id: String,
    /// How it was re-timed: the run's timing, or one of its `retime_with`.
    pub timing: Timing,
    pub stats: Stats,
    /// Finalists whose medians are within the measured noise of the best.
    pub tied_with_best: bool,
}

/// Everything about a run that outputs need and that is not in a job record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunHeader {
    /// The format of this header and of the records after it.
    pub format: u32,
    pub experiment: String,
    pub description: Option<String>,
    pub problem: String,
    pub mode: Mode,
    pub run_mode: RunMode,
    pub device: DeviceInfo,
    pub outputs: Vec<OutputSpec>,
    /// The protocol the run's samples were taken under, resolved.
    pub protocol: Protocol,
    pub search: SearchRecord,
    pub tolerance: Tolerance,
    /// Each method of the run: what it is, what ran, what its baseline means.
    pub methods: Vec<MethodRecord>,
    /// Consumers' tuned files timed as methods of their own (`--compare-to`).
    pub compared: Vec<Compared>,
    pub fingerprint: Fingerprint,
    pub started_at: String,
    pub planned_jobs: u64,
}

/// A method as the run header records it: enough for a report to say what
/// was timed and what its baseline is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MethodRecord {
    pub name: String,
    pub kind: MethodKind,
    pub kernel: String,
    /// What the problem says the method is (its documentation's first line).
    pub description: Option<String>,
    /// The baseline rule's name (`vllm_moe_default`), `baseline` for one the
    /// manifest writes out, or none.
    pub baseline: Option<String>,
    /// The method's own search; `None`: the run's.
    pub search: Option<SearchRecord>,
}

/// How a run searched: the strategy, and its parameters as the run used them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SearchRecord {
    pub strategy: StrategyName,
    /// budget, eta, seed: whichever the strategy has. Journals of format 1
    /// recorded the strategy alone, so theirs are empty (or hold the eta
    /// where the format-1 text named it).
    pub params: IndexMap<String, u64>,
}

impl From<&Search> for SearchRecord {
    fn from(s: &Search) -> Self {
        SearchRecord {
            strategy: s.kind.name(),
            params: s.params(),
        }
    }
}

impl SearchRecord {
    /// `grid`, `halving (eta 3)`, `random (budget 9, seed 0)`, ...
    pub fn label(&self) -> String {
        crate::search::describe(self.strategy, &self.params)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    pub format: OutputFormat,
    pub path: String,
    pub method: Option<String>,
    pub legacy_keys: bool,
}

/// What a result depends on besides the job itself; a change is reported on resume.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Fingerprint {
    pub tunelab: String,
    pub git_commit: Option<String>,
    pub manifest_hash: String,
    pub gpu: String,
    pub driver: Option<String>,
    pub cuda: Option<String>,
    pub python: Option<String>,
    pub torch: Option<String>,
    pub triton: Option<String>,
}

/// A lane the run stopped using: its GPU faulted or its worker kept dying
/// (docs/scaling.md, the retirement rule). Added to format 2 after the first
/// format-2 journals: older ones simply hold none.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LaneRetired {
    pub lane: u32,
    /// The lane's device as its worker saw it named (`CUDA_VISIBLE_DEVICES`
    /// or `HIP_VISIBLE_DEVICES` value); none for an interpreter lane.
    pub device: Option<String>,
    pub reason: String,
    /// The consecutive crash / launch_error failures that led to it: they
    /// were handed back to run on another lane, and their later records
    /// replace these.
    pub failed_jobs: Vec<String>,
    /// Jobs handed back to the other lanes (those failures included).
    pub requeued_jobs: u64,
    /// RFC 3339 UTC time.
    pub at: String,
}

/// One line of `journal.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Entry {
    Run(Box<RunHeader>),
    Job(Box<JobRecord>),
    Final(FinalRecord),
    LaneRetired(LaneRetired),
    /// An A/B run's setup, after its header (format 5).
    AbSetup(Box<super::ab::AbSetup>),
    /// One pair an A/B run timed (format 5).
    AbPair(Box<super::ab::AbPair>),
}

/// A journal read back: the last header, the latest record per job id, the finals.
#[derive(Debug, Clone, Default)]
pub struct Results {
    pub header: Option<RunHeader>,
    pub runs: Vec<RunHeader>,
    pub jobs: Vec<JobRecord>,
    pub finals: Vec<FinalRecord>,
    /// Lanes retired during the runs, in journal order.
    pub retired: Vec<LaneRetired>,
    /// `tunelab profile` wrote `profile/summary.md` beside the journal (the
    /// report links it). Not in the journal: read from the directory.
    pub profile_summary: bool,
    /// A/B setups, each once, in the order last written (a resumed A/B
    /// writes its setup again): the last is the journal's latest A/B.
    pub ab_setups: Vec<super::ab::AbSetup>,
    /// The latest record of each A/B pair (by setup and B's job id), in
    /// journal order.
    pub ab_pairs: Vec<super::ab::AbPair>,
    /// By job id: the failures of its records that a later record of the
    /// same job replaced (a job run again after a crash), oldest first.
    pub replaced_failures: std::collections::HashMap<String, Vec<FailureClass>>,
}

impl Results {
    /// How often a job crashed or timed out, over all of its records.
    pub fn crashes(&self, job: &JobRecord) -> usize {
        let crashed = |c: &FailureClass| matches!(c, FailureClass::Crash | FailureClass::Timeout);
        let earlier = self
            .replaced_failures
            .get(&job.job_id)
            .map_or(0, |f| f.iter().filter(|c| crashed(c)).count());
        earlier + usize::from(job.failure.as_ref().is_some_and(|f| crashed(&f.class)))
    }
}
