//! The raw mirror of a manifest file: what serde reads, before cross-checks.
//! Private to `manifest/`: the rest of the program sees the resolved
//! [`Experiment`](super::Experiment).
//!
//! These types are also the source of `schemas/manifest.schema.json`. Values
//! that errors point at are [`Spanned`]; fields whose YAML can take several
//! forms (space values, baselines, shape values) stay as spanned YAML
//! [`Node`]s and are interpreted, spans and all, in `validate.rs`.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::de::Spanned;
use super::model::{InputSource, LaunchPath, MethodKind, OutputFormat};
use super::yaml::Node;
use crate::measure::Timing;

/// One experiment: which problem, at which shapes, with which methods and
/// search spaces, checked against which tolerance, timed how, written where.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawManifest {
    /// Name of the experiment; names the results directory. Letters, digits, `-` and `_`.
    pub experiment: Spanned<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Manifests this one builds on, merged first (later wins; mappings merge key by key, lists are replaced).
    #[serde(default)]
    #[schemars(schema_with = "one_or_many_strings")]
    pub extends: Option<Node>,
    /// A builtin problem (`gemm`, `moe`) or a Python class as `"module.path:ClassName"`.
    pub problem: Spanned<String>,
    pub shapes: Spanned<RawShapes>,
    /// Implementations of the problem, by name.
    pub methods: Spanned<IndexMap<Spanned<String>, Spanned<RawMethod>>>,
    #[serde(default)]
    pub tolerance: Spanned<RawTolerance>,
    #[serde(default)]
    pub protocol: Spanned<RawProtocol>,
    #[serde(default)]
    pub search: Spanned<RawSearch>,
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
    pub companions: Vec<Spanned<String>>,
    /// Folders (relative to this manifest) put first on the workers'
    /// `PYTHONPATH`, so a problem module beside the manifest imports with no
    /// environment variable.
    #[serde(default)]
    pub python_path: Vec<Spanned<String>>,
    /// Who builds each shape's inputs and reference: `python` (the lane's
    /// Python worker, with torch: the default) or `native` (the runner's
    /// native worker, from the problem's `native_data()`: the lane imports no
    /// torch; every method must be launched natively).
    #[serde(default)]
    pub inputs: Option<Spanned<InputSource>>,
}

/// A mapping of field to value, names and values with their places.
pub type RawFields = IndexMap<Spanned<String>, Node>;

/// The shape set: the union of `list`, the `product` of axes and the `csv`
/// rows, each completed with `fixed`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawShapes {
    /// YAML files whose mapping is merged under this one (shared shape sets).
    #[serde(default)]
    #[schemars(schema_with = "one_or_many_strings")]
    pub include: Option<Node>,
    /// Explicit shapes, each a mapping of field to value (a number, string,
    /// boolean, or a list of integers such as `block_shape: [128, 128]`).
    #[serde(default)]
    #[schemars(schema_with = "shape_map_list")]
    pub list: Option<Vec<Spanned<RawFields>>>,
    /// Axes whose cartesian product gives shapes. An axis is a list of values,
    /// a list of records (mappings whose fields all join the shape), `{range: [start, end, step]}`
    /// (end inclusive) or `{pow2: [from, to]}`.
    #[serde(default)]
    #[schemars(schema_with = "axis_map")]
    pub product: Option<Spanned<IndexMap<Spanned<String>, Node>>>,
    /// Fields added to every shape.
    #[serde(default)]
    #[schemars(schema_with = "shape_map")]
    pub fixed: Option<IndexMap<Spanned<String>, Node>>,
    /// Shapes read from a CSV file (an aiter untuned CSV works).
    #[serde(default)]
    pub csv: Option<RawCsvShapes>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCsvShapes {
    /// Path relative to the manifest.
    pub path: Spanned<String>,
    /// Shape field -> CSV column name. Fields not listed are read from the column of the same name.
    #[serde(default)]
    pub columns: IndexMap<String, Spanned<String>>,
    /// Shape fields to take from the CSV; default: every key of `columns`.
    #[serde(default)]
    pub fields: Option<Vec<String>>,
}

/// One implementation of the problem and, optionally, the space to tune it over.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMethod {
    /// YAML files whose mapping is merged under this method (shared spaces).
    #[serde(default)]
    #[schemars(schema_with = "one_or_many_strings")]
    pub include: Option<Node>,
    pub kind: MethodKind,
    /// The kernel or function the problem exposes under this name.
    pub kernel: Spanned<String>,
    /// Source file of the kernel (relative to the manifest); its hash is part of every job id.
    #[serde(default)]
    pub source: Option<Spanned<String>>,
    /// An IR file (relative to the manifest; `.ttir`, `.ttgir`, `.llir` or `.ptx`, e.g. one
    /// `run --keep-ir` wrote) whose kernel is compiled from it instead of from its source;
    /// `params` is the config it was compiled under. Its contents are part of every job id.
    /// Triton methods only; needs a GPU.
    #[serde(default)]
    pub ir: Option<Spanned<String>>,
    /// Bump to give this method's jobs new ids (for code tunelab cannot hash).
    #[serde(default)]
    pub version: Option<String>,
    /// How a Triton method's kernel is launched: `python` (its worker calls
    /// it, the default) or `native` (the runner launches its compiled binary).
    /// `kind: cuda` and `kind: hip` methods are always launched natively.
    #[serde(default)]
    pub launch: Option<Spanned<LaunchPath>>,
    /// The launch grid (x, y, z): one to three expressions over shape fields,
    /// the config and `device.*`. Required for `kind: cuda|hip`; a Triton
    /// method may give it for the `aot` output.
    #[serde(default)]
    pub grid: Option<Spanned<Vec<Spanned<String>>>>,
    /// `kind: cuda|hip`: threads per block (x, y, z), one to three expressions.
    #[serde(default)]
    pub block: Option<Spanned<Vec<Spanned<String>>>>,
    /// `kind: cuda|hip`: dynamic shared memory per block in bytes, an expression (default 0).
    #[serde(default)]
    pub shared_mem: Option<Spanned<String>>,
    /// `kind: cuda|hip`: the kernel's arguments in order. A name the
    /// problem's inputs or output carry (`a`, `out`) passes that tensor's
    /// device pointer; any other entry is an expression passed as a 32-bit
    /// int, or `{i64|u32|u64|f32|f64: expression}` for another type. A
    /// Triton method may give them (its kernel's parameters that are not
    /// `tl.constexpr`, in order; their types are the compiled kernel's) for
    /// the `aot` output.
    #[serde(default)]
    #[schemars(schema_with = "kernel_args")]
    pub args: Option<Spanned<Vec<Node>>>,
    /// `kind: cuda|hip`: template arguments of `kernel`, expressions over
    /// the config and shape fields (`kernel<128, 64>` is what is compiled).
    #[serde(default)]
    pub template: Option<Spanned<Vec<Spanned<String>>>>,
    /// `kind: cuda|hip`: preprocessor defines, name -> expression (`-DNAME=value`).
    #[serde(default)]
    pub defines: IndexMap<Spanned<String>, Spanned<String>>,
    /// `kind: cuda|hip`: extra compiler options (`-use_fast_math`).
    #[serde(default)]
    pub compile_options: Vec<Spanned<String>>,
    /// Fixed parameters passed with every config.
    #[serde(default)]
    #[schemars(schema_with = "scalar_map")]
    pub params: IndexMap<Spanned<String>, Node>,
    /// Tunable parameters: a list, `{range: [start, end, step]}` or `{pow2: [from, to]}` each.
    #[serde(default)]
    #[schemars(schema_with = "axis_map")]
    pub space: IndexMap<Spanned<String>, Node>,
    /// Expressions over shape fields, parameters, derived values and `device.*`; a config is kept when all are true.
    #[serde(default)]
    pub constraints: Spanned<Vec<Spanned<String>>>,
    /// Parameters computed from others by expression, in order.
    #[serde(default)]
    pub derived: IndexMap<Spanned<String>, Spanned<String>>,
    /// This method's own search, instead of the experiment's `search:`.
    #[serde(default)]
    pub search: Option<Spanned<RawSearch>>,
    /// The config to compare with: a builtin rule name (`vllm_moe_default`) or a mapping of
    /// parameter to value or expression. It is run as an extra job per shape.
    #[serde(default)]
    #[schemars(schema_with = "baseline_schema")]
    pub baseline: Option<Node>,
}

/// Numerical tolerance: an element mismatches when |out - ref| > atol + rtol * |ref|.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTolerance {
    #[serde(default = "default_atol")]
    pub atol: Spanned<f64>,
    #[serde(default = "default_rtol")]
    pub rtol: Spanned<f64>,
    /// Fraction of elements allowed to mismatch (0 = none).
    #[serde(default = "default_max_mismatch")]
    pub max_mismatch: Spanned<f64>,
    /// Overrides by shape dtype, e.g. `{fp32: {atol: 1e-4}}`.
    #[serde(default)]
    pub per_dtype: IndexMap<Spanned<String>, RawToleranceOverride>,
}

impl Default for RawTolerance {
    fn default() -> Self {
        RawTolerance {
            atol: default_atol(),
            rtol: default_rtol(),
            max_mismatch: default_max_mismatch(),
            per_dtype: IndexMap::new(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawToleranceOverride {
    pub atol: Option<Spanned<f64>>,
    pub rtol: Option<Spanned<f64>>,
    pub max_mismatch: Option<Spanned<f64>>,
}

/// How the L2 flush before each cold sample evicts the cache.
///
/// A memset leaves L2 full of dirty lines, and writing them back to memory
/// competes with the timed kernel's own traffic: on an H100 (2026-11-22,
/// bench/moe_breakdown.py) it added about 10 µs to every memory-bound
/// fused-MoE call. A read of the same buffer leaves the cache just as cold
/// but clean, which is the state a kernel meets in a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FlushWith {
    /// Read the flush buffer (a max-reduction): L2 ends up holding clean lines.
    #[default]
    Read,
    /// Write the flush buffer (a memset), as triton.testing.do_bench does.
    Memset,
}

/// How every job is timed. The defaults are the protocol `README.md` describes.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawProtocol {
    #[serde(default = "d_warmup_launches")]
    pub warmup_launches: u32,
    #[serde(default = "d_warmup_ms")]
    pub warmup_ms: Spanned<f64>,
    /// Cold samples: evict L2 before every sample.
    #[serde(default = "d_true")]
    pub flush_l2: bool,
    /// Size of the buffer that evicts L2; default max(2 x L2 size, 32 MiB).
    #[serde(default)]
    pub flush_bytes: Option<u64>,
    /// How the flush evicts L2: `read` (default) or `memset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_with: Option<FlushWith>,
    /// Samples queued per host synchronisation.
    #[serde(default = "d_batch")]
    pub batch: Spanned<u32>,
    #[serde(default = "d_min_samples")]
    pub min_samples: Spanned<u32>,
    #[serde(default = "d_max_samples")]
    pub max_samples: u32,
    /// Stop once the 95 % confidence interval of the median is within this fraction of it.
    #[serde(default = "d_target_ci")]
    pub target_ci: Spanned<f64>,
    /// Cap on summed kernel time per job.
    #[serde(default = "d_max_gpu_ms")]
    pub max_gpu_ms: Spanned<f64>,
    /// Cap on wall time spent sampling one job.
    #[serde(default = "d_max_wall_ms")]
    pub max_wall_ms: Spanned<f64>,
    /// Racing: a job whose median is, with 95 % confidence, more than this
    /// fraction slower than the best its group has measured so far stops
    /// sampling at `min_samples` (flagged OUTPACED). 0 (the default): off.
    /// Left out of the canonical form when off, so that manifests written
    /// before it keep their hash.
    #[serde(default = "d_race", skip_serializing_if = "is_off")]
    pub race: Spanned<f64>,
    /// Best configs per shape re-timed interleaved at the end.
    #[serde(default = "d_finalists")]
    pub finalists: u32,
    /// In the finalists' re-timing, the GPU idles after each batch for this
    /// many times the batch's kernel time (0 to 100; default 1: it runs half
    /// the time), so that the power cap does not pull the clock down in the
    /// middle of the comparison. 0 re-times back to back.
    #[serde(default = "d_retime_rest")]
    pub retime_rest: Spanned<f64>,
    /// How every job is timed and ranked: `cold` (L2 flushed before each
    /// sample; the default), `hot` (no flush), or `graph` (`graph_calls`
    /// back-to-back launches captured in one CUDA graph, timed per call, as
    /// vLLM's benchmark and its decode steps run).
    #[serde(default = "d_timing")]
    pub timing: Timing,
    /// Launches per CUDA graph for graph timing.
    #[serde(default = "d_graph_calls")]
    pub graph_calls: Spanned<u32>,
    /// Other timings to re-time each group's finalists under, so the report
    /// shows where their winner differs: `[graph]`.
    #[serde(default)]
    pub retime_with: Vec<Spanned<Timing>>,
    /// Seconds a job may take (compile, check or sampling) before its worker is killed.
    #[serde(default = "d_timeout_s")]
    pub timeout_s: Spanned<f64>,
    /// Seed for inputs and random search.
    #[serde(default)]
    pub seed: u64,
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
            race: d_race(),
            finalists: d_finalists(),
            retime_rest: d_retime_rest(),
            timing: d_timing(),
            graph_calls: d_graph_calls(),
            retime_with: Vec::new(),
            timeout_s: d_timeout_s(),
            seed: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(rename = "Strategy")]
pub enum RawStrategy {
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
    pub strategy: Spanned<RawStrategy>,
    /// Configs per (shape, method) measured by `random` (required) and
    /// `surrogate` (optional); ignored by grid and halving.
    #[serde(default)]
    pub budget: Option<Spanned<u64>>,
    #[serde(default)]
    pub seed: u64,
    /// Halving keeps 1/eta of the configs each round.
    #[serde(default = "d_eta")]
    pub eta: Spanned<u32>,
}

impl Default for RawSearch {
    fn default() -> Self {
        RawSearch {
            strategy: d_strategy(),
            budget: None,
            seed: 0,
            eta: d_eta(),
        }
    }
}

/// M-bucket key scheme of `triton_mbucket` files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(rename = "MbucketKeys")]
pub enum RawKeys {
    /// `M_LEQ_x`, `M_GEQ_x`, `any` (aiter's current keys).
    Current,
    /// `small`, `medium_M32`, ..., `any` (the older scheme).
    Legacy,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOutput {
    pub format: OutputFormat,
    /// minijinja template relative to the results directory; shape fields and `device.*` are available.
    pub path: Spanned<String>,
    /// Only results of this method (default: every tuned method).
    #[serde(default)]
    pub method: Option<Spanned<String>>,
    /// M-bucket key scheme for `triton_mbucket`: `current` (M_LEQ_x) or `legacy` (small, medium_M32, ...).
    #[serde(default)]
    pub keys: Option<RawKeys>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawInterpreter {
    /// Shapes to run in interpreter mode instead of `shapes`.
    pub shapes: Spanned<RawShapes>,
    /// At most this many configs per (shape, method), chosen by the search seed.
    #[serde(default = "d_interp_configs")]
    pub max_configs: u64,
    /// Tolerance used in interpreter mode instead of `tolerance`.
    #[serde(default)]
    pub tolerance: Option<Spanned<RawTolerance>>,
}

/// A default value: it was not written, so it has no place in the file
/// (validation points at the enclosing section instead).
fn unspanned<T>(value: T) -> Spanned<T> {
    Spanned {
        value,
        span: crate::diag::Span::default(),
    }
}

impl<T: Default> Default for Spanned<T> {
    fn default() -> Self {
        unspanned(T::default())
    }
}

fn default_atol() -> Spanned<f64> {
    unspanned(1e-2)
}
fn default_max_mismatch() -> Spanned<f64> {
    unspanned(0.0)
}
fn default_rtol() -> Spanned<f64> {
    unspanned(1e-2)
}
fn d_warmup_launches() -> u32 {
    3
}
fn d_warmup_ms() -> Spanned<f64> {
    unspanned(5.0)
}
fn d_true() -> bool {
    true
}
fn d_batch() -> Spanned<u32> {
    unspanned(32)
}
fn d_min_samples() -> Spanned<u32> {
    unspanned(20)
}
fn d_max_samples() -> u32 {
    2000
}
fn d_target_ci() -> Spanned<f64> {
    unspanned(0.005)
}
fn d_max_gpu_ms() -> Spanned<f64> {
    unspanned(100.0)
}
fn d_max_wall_ms() -> Spanned<f64> {
    unspanned(1500.0)
}
fn d_finalists() -> u32 {
    5
}
fn d_race() -> Spanned<f64> {
    unspanned(0.0)
}
fn is_off(race: &Spanned<f64>) -> bool {
    race.value == 0.0
}
fn d_retime_rest() -> Spanned<f64> {
    unspanned(1.0)
}
fn d_timing() -> Timing {
    Timing::Cold
}
fn d_graph_calls() -> Spanned<u32> {
    unspanned(10)
}
fn d_timeout_s() -> Spanned<f64> {
    unspanned(60.0)
}
fn d_strategy() -> Spanned<RawStrategy> {
    unspanned(RawStrategy::Grid)
}
fn d_eta() -> Spanned<u32> {
    unspanned(3)
}
fn d_interp_configs() -> u64 {
    4
}

fn kernel_args(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
    serde_json::from_value(serde_json::json!({
        "type": "array",
        "items": {"anyOf": [
            {"type": ["string", "integer"]},
            {"type": "object", "minProperties": 1, "maxProperties": 1,
             "properties": {
                "i32": {"type": ["string", "integer"]}, "i64": {"type": ["string", "integer"]},
                "u32": {"type": ["string", "integer"]}, "u64": {"type": ["string", "integer"]},
                "f32": {"type": ["string", "number"]}, "f64": {"type": ["string", "number"]}
             },
             "additionalProperties": false}
        ]}
    }))
    .expect("static schema")
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

fn scalar_map(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
    serde_json::from_value(serde_json::json!({
        "type": "object",
        "additionalProperties": {"type": ["string", "number", "boolean"]}
    }))
    .expect("static schema")
}

/// Shape fields: scalars, or lists of integers (`block_shape: [128, 128]`).
fn shape_map(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
    serde_json::from_value(serde_json::json!({
        "type": "object",
        "additionalProperties": {"anyOf": [
            {"type": ["string", "number", "boolean"]},
            {"type": "array", "items": {"type": "integer"}, "minItems": 1}
        ]}
    }))
    .expect("static schema")
}

fn shape_map_list(gen: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
    serde_json::from_value(serde_json::json!({
        "type": "array",
        "items": shape_map(gen)
    }))
    .expect("static schema")
}

fn baseline_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
    serde_json::from_value(serde_json::json!({
        "anyOf": [{"type": "string"}, {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}]
    }))
    .expect("static schema")
}
