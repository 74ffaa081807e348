//! The raw mirror of a manifest file: what serde reads, before cross-checks.
//!
//! These types are also the source of `schemas/manifest.schema.json`. Fields
//! whose YAML can take several forms (space values, baselines, shape values)
//! stay as JSON values here and are interpreted, with spans, in `model.rs`.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// One experiment: which problem, at which shapes, with which methods and
/// search spaces, checked against which tolerance, timed how, written where.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawManifest {
    /// Name of the experiment; names the results directory. Letters, digits, `-` and `_`.
    pub experiment: String,
    #[serde(default)]
    pub description: Option<String>,
    /// Manifests this one builds on, merged first (later wins; mappings merge key by key, lists are replaced).
    #[serde(default)]
    #[schemars(schema_with = "one_or_many_strings")]
    pub extends: Option<Json>,
    /// A builtin problem (`gemm`, `moe`) or a Python class as `"module.path:ClassName"`.
    pub problem: String,
    pub shapes: RawShapes,
    /// Implementations of the problem, by name.
    pub methods: IndexMap<String, RawMethod>,
    #[serde(default)]
    pub tolerance: RawTolerance,
    #[serde(default)]
    pub protocol: RawProtocol,
    #[serde(default)]
    pub search: RawSearch,
    #[serde(default)]
    pub outputs: Vec<RawOutput>,
    /// What to run instead when no GPU is found (Triton's interpreter on the CPU).
    #[serde(default)]
    pub interpreter: Option<RawInterpreter>,
    /// Manifests `tunelab run` runs after this one, each into its own results
    /// directory (paths relative to this file): experiments of another problem
    /// that belong to the same job, such as a model's attention GEMMs next to
    /// its MoE. `--only` and `--set` reach a companion only where they fit it.
    #[serde(default)]
    pub companions: Vec<String>,
}

/// The shape set: the union of `list`, the `product` of axes and the `csv`
/// rows, each completed with `fixed`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawShapes {
    /// YAML files whose mapping is merged under this one (shared shape sets).
    #[serde(default)]
    #[schemars(schema_with = "one_or_many_strings")]
    pub include: Option<Json>,
    /// Explicit shapes, each a mapping of field to value.
    #[serde(default)]
    pub list: Option<Vec<IndexMap<String, Json>>>,
    /// Axes whose cartesian product gives shapes. An axis is a list of values,
    /// a list of records (mappings whose fields all join the shape), `{range: [start, end, step]}`
    /// (end inclusive) or `{pow2: [from, to]}`.
    #[serde(default)]
    #[schemars(schema_with = "axis_map")]
    pub product: Option<IndexMap<String, Json>>,
    /// Fields added to every shape.
    #[serde(default)]
    pub fixed: Option<IndexMap<String, Json>>,
    /// Shapes read from a CSV file (an aiter untuned CSV works).
    #[serde(default)]
    pub csv: Option<RawCsvShapes>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCsvShapes {
    /// Path relative to the manifest.
    pub path: String,
    /// Shape field -> CSV column name. Fields not listed are read from the column of the same name.
    #[serde(default)]
    pub columns: IndexMap<String, String>,
    /// Shape fields to take from the CSV; default: every key of `columns`.
    #[serde(default)]
    pub fields: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MethodKind {
    Triton,
    Torch,
    Cuda,
    Hip,
    Python,
}

/// One implementation of the problem and, optionally, the space to tune it over.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMethod {
    /// YAML files whose mapping is merged under this method (shared spaces).
    #[serde(default)]
    #[schemars(schema_with = "one_or_many_strings")]
    pub include: Option<Json>,
    pub kind: MethodKind,
    /// The kernel or function the problem exposes under this name.
    pub kernel: String,
    /// Source file of the kernel (relative to the manifest); its hash is part of every job id.
    #[serde(default)]
    pub source: Option<String>,
    /// Bump to give this method's jobs new ids (for code tunelab cannot hash).
    #[serde(default)]
    pub version: Option<String>,
    /// Fixed parameters passed with every config.
    #[serde(default)]
    pub params: IndexMap<String, Json>,
    /// Tunable parameters: a list, `{range: [start, end, step]}` or `{pow2: [from, to]}` each.
    #[serde(default)]
    #[schemars(schema_with = "axis_map")]
    pub space: IndexMap<String, Json>,
    /// Expressions over shape fields, parameters, derived values and `device.*`; a config is kept when all are true.
    #[serde(default)]
    pub constraints: Vec<String>,
    /// Parameters computed from others by expression, in order.
    #[serde(default)]
    pub derived: IndexMap<String, String>,
    /// The config to compare with: a builtin rule name (`vllm_moe_default`) or a mapping of
    /// parameter to value or expression. It is run as an extra job per shape.
    #[serde(default)]
    #[schemars(schema_with = "baseline_schema")]
    pub baseline: Option<Json>,
}

/// Numerical tolerance: an element mismatches when |out - ref| > atol + rtol * |ref|.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTolerance {
    #[serde(default = "default_atol")]
    pub atol: f64,
    #[serde(default = "default_rtol")]
    pub rtol: f64,
    /// Fraction of elements allowed to mismatch (0 = none).
    #[serde(default)]
    pub max_mismatch: f64,
    /// Overrides by shape dtype, e.g. `{fp32: {atol: 1e-4}}`.
    #[serde(default)]
    pub per_dtype: IndexMap<String, RawToleranceOverride>,
}

impl Default for RawTolerance {
    fn default() -> Self {
        RawTolerance {
            atol: default_atol(),
            rtol: default_rtol(),
            max_mismatch: 0.0,
            per_dtype: IndexMap::new(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawToleranceOverride {
    pub atol: Option<f64>,
    pub rtol: Option<f64>,
    pub max_mismatch: Option<f64>,
}

/// How the L2 flush before each cold sample evicts the cache.
///
/// A memset leaves L2 full of dirty lines, and writing them back to memory
/// competes with the timed kernel's own traffic: on an H100 (2026-11-22,
/// bench/moe_breakdown.py) it added about 10 µs to every memory-bound fused-MoE
/// call, 96.4 against 86.7 µs at M=1. A read of the same buffer leaves the cache
/// just as cold but clean, which is the state a kernel meets in a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FlushWith {
    /// Read the flush buffer (a max-reduction): L2 ends up holding clean lines.
    #[default]
    Read,
    /// Write the flush buffer (a memset), as triton.testing.do_bench does.
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

/// How every job is timed. Defaults follow DESIGN.md's measurement protocol.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawProtocol {
    #[serde(default = "d_warmup_launches")]
    pub warmup_launches: u32,
    #[serde(default = "d_warmup_ms")]
    pub warmup_ms: f64,
    /// Cold samples: evict L2 before every sample.
    #[serde(default = "d_true")]
    pub flush_l2: bool,
    /// Size of the buffer that evicts L2; default max(2 x L2 size, 32 MiB).
    #[serde(default)]
    pub flush_bytes: Option<u64>,
    /// How the flush evicts L2: `read` (default) or `memset`. A journal
    /// header without it comes from a run that flushed with a memset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_with: Option<FlushWith>,
    /// Samples queued per host synchronisation.
    #[serde(default = "d_batch")]
    pub batch: u32,
    #[serde(default = "d_min_samples")]
    pub min_samples: u32,
    #[serde(default = "d_max_samples")]
    pub max_samples: u32,
    /// Stop once the 95 % confidence interval of the median is within this fraction of it.
    #[serde(default = "d_target_ci")]
    pub target_ci: f64,
    /// Cap on summed kernel time per job.
    #[serde(default = "d_max_gpu_ms")]
    pub max_gpu_ms: f64,
    /// Cap on wall time spent sampling one job.
    #[serde(default = "d_max_wall_ms")]
    pub max_wall_ms: f64,
    /// Best configs per shape re-timed interleaved at the end.
    #[serde(default = "d_finalists")]
    pub finalists: u32,
    /// Reserved: timing back-to-back launches in a CUDA graph ("hot"). Not implemented; `true` is refused.
    #[serde(default)]
    pub hot: bool,
    /// Seconds a job may take (compile, check or sampling) before its worker is killed.
    #[serde(default = "d_timeout_s")]
    pub timeout_s: f64,
    /// Seed for inputs and random search.
    #[serde(default)]
    pub seed: u64,
}

impl RawProtocol {
    /// How the run this protocol was recorded for flushed L2: a journal header
    /// from before `flush_with` existed is from a memset run.
    pub fn recorded_flush(&self) -> FlushWith {
        self.flush_with.unwrap_or(FlushWith::Memset)
    }
}

impl Default for RawProtocol {
    fn default() -> Self {
        RawProtocol {
            warmup_launches: d_warmup_launches(),
            warmup_ms: d_warmup_ms(),
            flush_l2: true,
            flush_bytes: None,
            flush_with: None,
            batch: d_batch(),
            min_samples: d_min_samples(),
            max_samples: d_max_samples(),
            target_ci: d_target_ci(),
            max_gpu_ms: d_max_gpu_ms(),
            max_wall_ms: d_max_wall_ms(),
            finalists: d_finalists(),
            hot: false,
            timeout_s: d_timeout_s(),
            seed: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Every config that passes the constraints.
    Grid,
    /// `budget` configs drawn without replacement, seeded.
    Random,
    /// Successive halving: time every config briefly, keep the best 1/eta, repeat with more samples.
    Halving,
    /// Model-based: a Gaussian-process surrogate of log latency picks each next
    /// config by expected improvement, until `budget` configs are measured
    /// (default: 30 % of each (shape, method) group, at least 8).
    Surrogate,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSearch {
    #[serde(default = "d_strategy")]
    pub strategy: Strategy,
    /// Configs per (shape, method) measured by `random` (required) and
    /// `surrogate` (optional); ignored by grid and halving.
    #[serde(default)]
    pub budget: Option<u64>,
    #[serde(default)]
    pub seed: u64,
    /// Halving keeps 1/eta of the configs each round.
    #[serde(default = "d_eta")]
    pub eta: u32,
}

impl Default for RawSearch {
    fn default() -> Self {
        RawSearch {
            strategy: Strategy::Grid,
            budget: None,
            seed: 0,
            eta: d_eta(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// Every job: config, check result, timing statistics (like aiter's --profile_file).
    JobsCsv,
    /// Every job as JSON.
    JobsJson,
    /// The best config per (shape, method).
    BestCsv,
    /// Triton configs keyed by M bucket, one file per (N, K).
    TritonMbucket,
    /// vLLM fused-MoE config files, one per (E, N).
    VllmMoeJson,
    /// aiter tuned_fmoe.csv rows.
    AiterFmoeCsv,
    /// Markdown report.
    Report,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOutput {
    pub format: OutputFormat,
    /// minijinja template relative to the results directory; shape fields and `device.*` are available.
    pub path: String,
    /// Only results of this method (default: every tuned method).
    #[serde(default)]
    pub method: Option<String>,
    /// M-bucket key scheme for `triton_mbucket`: `current` (M_LEQ_x) or `legacy` (small, medium_M32, ...).
    #[serde(default)]
    pub keys: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawInterpreter {
    /// Shapes to run in interpreter mode instead of `shapes`.
    pub shapes: RawShapes,
    /// At most this many configs per (shape, method), chosen by the search seed.
    #[serde(default = "d_interp_configs")]
    pub max_configs: u64,
    /// Tolerance used in interpreter mode instead of `tolerance`.
    #[serde(default)]
    pub tolerance: Option<RawTolerance>,
}

fn default_atol() -> f64 {
    1e-2
}
fn default_rtol() -> f64 {
    1e-2
}
fn d_warmup_launches() -> u32 {
    3
}
fn d_warmup_ms() -> f64 {
    5.0
}
fn d_true() -> bool {
    true
}
fn d_batch() -> u32 {
    32
}
fn d_min_samples() -> u32 {
    20
}
fn d_max_samples() -> u32 {
    2000
}
fn d_target_ci() -> f64 {
    0.005
}
fn d_max_gpu_ms() -> f64 {
    100.0
}
fn d_max_wall_ms() -> f64 {
    1500.0
}
fn d_finalists() -> u32 {
    5
}
fn d_timeout_s() -> f64 {
    60.0
}
fn d_strategy() -> Strategy {
    Strategy::Grid
}
fn d_eta() -> u32 {
    3
}
fn d_interp_configs() -> u64 {
    4
}

fn one_or_many_strings(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
    serde_json::from_value(serde_json::json!({
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
    }))
    .expect("static schema")
}

fn axis_map(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
    serde_json::from_value(serde_json::json!({
        "type": "object",
        "additionalProperties": {
            "anyOf": [
                {"type": "array", "minItems": 1},
                {"type": "object", "properties": {"range": {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3}},
                 "required": ["range"], "additionalProperties": false},
                {"type": "object", "properties": {"pow2": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}},
                 "required": ["pow2"], "additionalProperties": false}
            ]
        }
    }))
    .expect("static schema")
}

fn baseline_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
    serde_json::from_value(serde_json::json!({
        "anyOf": [{"type": "string"}, {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}]
    }))
    .expect("static schema")
}
