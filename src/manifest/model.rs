//! The validated experiment: what the rest of the program receives from
//! `manifest::load`. Every value is resolved (defaults applied, forms
//! interpreted, cross-checks passed) and keeps the span it came from where a
//! later stage may still point an error at it.

use std::path::PathBuf;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::diag::Span;
use crate::measure::Protocol;
use crate::search::Search;

/// One point of the problem's parameters, fields in a stable order.
pub type Shape = IndexMap<String, Json>;

#[derive(Debug, Clone)]
pub struct Experiment {
    pub name: String,
    pub description: Option<String>,
    /// A builtin problem (`gemm`, `moe`) or `"module.path:ClassName"`.
    pub problem: String,
    pub problem_span: Span,
    pub manifest_path: PathBuf,
    /// Hash of the merged manifest (includes and overrides applied).
    pub manifest_hash: String,
    pub shapes: Vec<Shape>,
    pub shapes_span: Span,
    pub methods: Vec<Method>,
    pub tolerance: Tolerance,
    pub protocol: Protocol,
    pub search: Search,
    pub outputs: Vec<Output>,
    pub interpreter: Option<InterpreterPlan>,
    /// Manifests run after this one (`companions:`), resolved and checked to exist.
    pub companions: Vec<PathBuf>,
    /// Folders the workers import problems from (`python_path:`), absolute.
    pub python_path: Vec<PathBuf>,
    /// Consumers' tuned files whose configs run as methods of their own
    /// (`run --compare-to`), beside the tuned ones.
    pub compared: Vec<Compared>,
    /// Who builds each shape's inputs and reference.
    pub inputs: InputSource,
}

/// A consumer's tuned file timed as a method (`run --compare-to FILE`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compared {
    /// The method its configs run as.
    pub method: String,
    /// The file, as named on the command line.
    pub file: String,
    /// Its format.
    pub format: OutputFormat,
    /// The tuned method whose kernel and call the file's configs run in.
    pub against: String,
}

impl Experiment {
    pub fn method(&self, name: &str) -> Option<&Method> {
        self.methods.iter().find(|m| m.name == name)
    }

    /// How a method is searched: its own `search:`, else the experiment's.
    pub fn search_for<'a>(&'a self, method: &'a Method) -> &'a Search {
        method.search.as_ref().unwrap_or(&self.search)
    }

    /// The strategy of every method, for a run whose protocol keeps `finalists`.
    pub fn strategies(&self, finalists: u32) -> crate::search::Strategies {
        crate::search::Strategies::new(
            self.search.strategy(finalists),
            self.methods
                .iter()
                .filter_map(|m| {
                    m.search
                        .as_ref()
                        .map(|s| (m.name.clone(), s.strategy(finalists)))
                })
                .collect(),
        )
    }

    /// The IR file of each method that runs from one (`ir:`), by method name.
    pub fn ir_files(&self) -> std::collections::HashMap<String, PathBuf> {
        self.methods
            .iter()
            .filter_map(|m| m.ir.clone().map(|p| (m.name.clone(), p)))
            .collect()
    }

    /// Whether tunelab's own Python package provides the problem.
    pub fn builtin_problem(&self) -> bool {
        BUILTIN_PROBLEMS.contains(&self.problem.as_str())
    }
}

pub const BUILTIN_PROBLEMS: &[&str] = &["gemm", "moe"];
/// What an `ir:` file may be: the stages Triton's `ir_override` compiles from.
pub const IR_EXTENSIONS: &[&str] = &["ttir", "ttgir", "llir", "ptx"];
/// Shape dtypes: plain ones, and the quantised formats (`fp8`: fp8 weights and
/// activations; `mxfp4`: MXFP4 weights with 16-bit activations).
pub const DTYPES: &[&str] = &["fp16", "bf16", "fp32", "fp8", "mxfp4"];

/// What to run when no GPU is found.
#[derive(Debug, Clone)]
pub struct InterpreterPlan {
    pub shapes: Vec<Shape>,
    pub max_configs: u64,
    pub tolerance: Option<Tolerance>,
}

/// What kind of code a method runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MethodKind {
    Triton,
    Torch,
    Cuda,
    Hip,
    Python,
}

impl MethodKind {
    /// Compiled from a source file by tunelab and launched natively.
    pub fn is_native(self) -> bool {
        matches!(self, MethodKind::Cuda | MethodKind::Hip)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MethodKind::Triton => "triton",
            MethodKind::Torch => "torch",
            MethodKind::Cuda => "cuda",
            MethodKind::Hip => "hip",
            MethodKind::Python => "python",
        }
    }
}

/// Who builds a shape's inputs and reference (a manifest's `inputs:`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InputSource {
    /// The problem's `inputs()` and `reference()`, in the lane's Python worker (torch).
    #[default]
    Python,
    /// The native worker, from the problem's `native_data()` description: no
    /// torch in the lane (docs/native-backend.md, "Inputs built natively").
    Native,
}

impl InputSource {
    pub fn as_str(self) -> &'static str {
        match self {
            InputSource::Python => "python",
            InputSource::Native => "native",
        }
    }
}

/// How a Triton method's kernel is launched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LaunchPath {
    /// Its Python worker launches it (Triton's launcher).
    #[default]
    Python,
    /// The runner's native worker launches the compiled binary: no Python per launch.
    Native,
}

impl LaunchPath {
    pub fn as_str(self) -> &'static str {
        match self {
            LaunchPath::Python => "python",
            LaunchPath::Native => "native",
        }
    }
}

/// A scalar kernel argument's C type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScalarType {
    I32,
    I64,
    U32,
    U64,
    F32,
    F64,
}

impl ScalarType {
    pub const ALL: [ScalarType; 6] = [
        ScalarType::I32,
        ScalarType::I64,
        ScalarType::U32,
        ScalarType::U64,
        ScalarType::F32,
        ScalarType::F64,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ScalarType::I32 => "i32",
            ScalarType::I64 => "i64",
            ScalarType::U32 => "u32",
            ScalarType::U64 => "u64",
            ScalarType::F32 => "f32",
            ScalarType::F64 => "f64",
        }
    }

    pub fn parse(s: &str) -> Option<ScalarType> {
        ScalarType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Its C spelling, for generated launchers.
    pub fn c_type(self) -> &'static str {
        match self {
            ScalarType::I32 => "int32_t",
            ScalarType::I64 => "int64_t",
            ScalarType::U32 => "uint32_t",
            ScalarType::U64 => "uint64_t",
            ScalarType::F32 => "float",
            ScalarType::F64 => "double",
        }
    }
}

/// One argument of a native kernel, in the order the kernel takes them.
#[derive(Debug, Clone)]
pub enum KernelArg {
    /// A tensor of the problem's inputs or its output, by name: its device pointer.
    Tensor { name: String, span: Span },
    /// A value computed per job.
    Scalar { ty: ScalarType, expr: Expr },
}

/// How a `kind: cuda` or `kind: hip` method is compiled and launched.
#[derive(Debug, Clone)]
pub struct NativeSpec {
    /// The source file, absolute.
    pub source: PathBuf,
    pub source_span: Span,
    /// Template arguments of the kernel, in order.
    pub template: Vec<Expr>,
    /// `-DNAME=value` defines.
    pub defines: Vec<(String, Expr)>,
    /// Extra compiler options.
    pub options: Vec<String>,
    /// Threads per block (x, y, z); one to three.
    pub block: Vec<Expr>,
    /// Dynamic shared memory in bytes; none: 0.
    pub shared_mem: Option<Expr>,
    pub args: Vec<KernelArg>,
}

/// An expression and where it was written.
#[derive(Debug, Clone, Serialize)]
pub struct Expr {
    pub source: String,
    #[serde(skip)]
    pub span: Span,
}

/// A tunable parameter and its values, in the order written.
#[derive(Debug, Clone)]
pub struct Axis {
    pub name: String,
    pub values: Vec<Json>,
    /// Where each value was written (`{range: ...}` values share the range's place).
    pub value_spans: Vec<Span>,
}

#[derive(Debug, Clone)]
pub enum BaselineValue {
    Literal(Json),
    Expr(Expr),
}

#[derive(Debug, Clone)]
pub struct Baseline {
    /// "vllm_moe_default" for a builtin rule, "baseline" for one written out.
    pub name: String,
    pub values: Vec<(String, BaselineValue)>,
}

#[derive(Debug, Clone)]
pub struct Method {
    pub name: String,
    pub kind: MethodKind,
    pub kernel: String,
    pub kernel_span: Span,
    /// Hash of what defines the method's code: kind, kernel, source file contents, version.
    pub identity: String,
    pub params: IndexMap<String, Json>,
    pub axes: Vec<Axis>,
    pub constraints: Vec<Expr>,
    pub derived: Vec<(String, Expr)>,
    pub baseline: Option<Baseline>,
    /// The method's own search (`methods.X.search`); `None`: the experiment's.
    pub search: Option<Search>,
    pub span: Span,
    pub constraints_span: Span,
    /// Where each config name (parameter, space parameter, derived value) was declared.
    pub key_spans: IndexMap<String, Span>,
    /// Where each fixed parameter's value was written.
    pub param_spans: IndexMap<String, Span>,
    /// How the kernel is launched: natively for `kind: cuda|hip` and for a
    /// Triton method with `launch: native`, else by its Python worker.
    pub launch: LaunchPath,
    /// The launch grid (x, y, z), as written; empty when not given.
    pub grid: Vec<Expr>,
    /// A Triton method's kernel arguments (`args:`), for the `aot` output;
    /// empty when not given. A native method's are in `native`.
    pub triton_args: Vec<KernelArg>,
    /// Source and launch of a `kind: cuda|hip` method.
    pub native: Option<NativeSpec>,
    /// The IR file the method's kernel is compiled from (`ir:`), absolute.
    pub ir: Option<PathBuf>,
    /// Configs read from a consumer's tuned file (`run --compare-to`): the
    /// method runs one config per shape, looked up as the consumer does, and
    /// searches nothing.
    pub fixed: Option<FixedConfigs>,
}

/// One config per shape, by the shape's `M`, from a consumer's tuned file.
#[derive(Debug, Clone)]
pub struct FixedConfigs {
    /// Shape fields a shape must have these values of to get a config (the
    /// file's `E` and `N`, say).
    pub matches: IndexMap<String, Json>,
    /// Configs by M, in the file's order; a shape takes the one whose M is
    /// nearest its own, the first of equals (vLLM's rule).
    pub by_m: Vec<(i64, IndexMap<String, Json>)>,
}

impl FixedConfigs {
    /// The config for a shape, or `None` when the shape is not the file's.
    pub fn config_for(&self, shape: &Shape) -> Option<&IndexMap<String, Json>> {
        if !self.matches.iter().all(|(k, v)| shape.get(k) == Some(v)) {
            return None;
        }
        let m = shape.get("M").and_then(Json::as_i64)?;
        let mut best: Option<&(i64, IndexMap<String, Json>)> = None;
        for entry in &self.by_m {
            if best.map_or(true, |b| (entry.0 - m).abs() < (b.0 - m).abs()) {
                best = Some(entry);
            }
        }
        best.map(|(_, c)| c)
    }
}

/// The type of a config value, as a method declares it (`config_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigType {
    Int,
    Float,
    Str,
    Bool,
}

impl ConfigType {
    fn accepts(self, v: &Json) -> bool {
        match self {
            ConfigType::Int => v.is_i64() || v.is_u64(),
            ConfigType::Float => v.is_number(),
            ConfigType::Str => v.is_string(),
            ConfigType::Bool => v.is_boolean(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            ConfigType::Int => "an integer",
            ConfigType::Float => "a number",
            ConfigType::Str => "a string",
            ConfigType::Bool => "true or false",
        }
    }
}

impl Method {
    /// Checks the names and values this method's configs carry against the
    /// types its implementation declares (`config_types`): an unknown name
    /// or a wrong-typed value, each at its own line.
    pub fn check_config_types(
        &self,
        declared: &IndexMap<String, ConfigType>,
    ) -> Vec<crate::diag::Diagnostic> {
        use crate::diag::{did_you_mean, Diagnostic};
        let mut errors = Vec::new();
        for (name, span) in &self.key_spans {
            let Some(kind) = declared.get(name) else {
                let known: Vec<&str> = declared.keys().map(String::as_str).collect();
                let help = match did_you_mean(name, known.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None if known.is_empty() => "it takes no parameters: remove them".to_string(),
                    None => format!("it takes: {}", known.join(", ")),
                };
                errors.push(
                    Diagnostic::at(
                        *span,
                        format!(
                            "method `{}` (kernel `{}`) takes no parameter `{name}`",
                            self.name, self.kernel
                        ),
                    )
                    .help(help),
                );
                continue;
            };
            let values: Vec<(&Json, Span)> =
                if let Some(axis) = self.axes.iter().find(|a| &a.name == name) {
                    axis.values
                        .iter()
                        .zip(axis.value_spans.iter().copied())
                        .collect()
                } else if let Some(v) = self.params.get(name) {
                    vec![(v, self.param_spans.get(name).copied().unwrap_or(*span))]
                } else {
                    Vec::new() // a derived value: its type shows when it is evaluated
                };
            for (v, at) in values {
                if !kind.accepts(v) {
                    errors.push(
                        Diagnostic::at(
                            at,
                            format!(
                                "`{name}` of method `{}` must be {}, found {v}",
                                self.name,
                                kind.name()
                            ),
                        )
                        .help(format!(
                            "the kernel `{}` declares `{name}` as {}",
                            self.kernel,
                            kind.name()
                        )),
                    );
                }
            }
        }
        errors
    }
}

/// Numerical tolerance: an element mismatches when |out - ref| > atol + rtol·|ref|.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
    /// Fraction of elements allowed to mismatch.
    pub max_mismatch: f64,
    /// Overrides by shape dtype.
    pub per_dtype: IndexMap<String, DtypeOverride>,
}

/// Overrides of a tolerance for one dtype; `None` keeps the general value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DtypeOverride {
    pub atol: Option<f64>,
    pub rtol: Option<f64>,
    pub max_mismatch: Option<f64>,
}

/// The tolerance that applies to one dtype.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ToleranceFor {
    pub atol: f64,
    pub rtol: f64,
    pub max_mismatch: f64,
}

impl Tolerance {
    pub fn for_dtype(&self, dtype: Option<&str>) -> ToleranceFor {
        let mut t = ToleranceFor {
            atol: self.atol,
            rtol: self.rtol,
            max_mismatch: self.max_mismatch,
        };
        if let Some(o) = dtype.and_then(|d| self.per_dtype.get(d)) {
            t.atol = o.atol.unwrap_or(t.atol);
            t.rtol = o.rtol.unwrap_or(t.rtol);
            t.max_mismatch = o.max_mismatch.unwrap_or(t.max_mismatch);
        }
        t
    }
}

/// An output file format. One writer per format in `emit/`.
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
    /// triton_kernels' best opt_flags constraints per M, one file per shape but M.
    TritonKernelsJson,
    /// Markdown report.
    Report,
    /// Each winner's compiled kernels (ttir, ttgir, llir, ptx, cubin and
    /// metadata), kept by every run in the folder `path`, with an index of
    /// their registers, spills and shared memory (`path/index.md`).
    Ir,
    /// Ahead-of-time export: the winners' cubins of `kind: cuda` methods and
    /// of Triton methods with `grid:` and `args:`, with a C source and header
    /// holding one launcher per specialisation and a dispatcher that picks
    /// one by the M buckets of `triton_mbucket`, in the folder `path`.
    Aot,
}

impl OutputFormat {
    /// The format's name as manifests spell it.
    pub fn name(self) -> &'static str {
        match self {
            OutputFormat::JobsCsv => "jobs_csv",
            OutputFormat::JobsJson => "jobs_json",
            OutputFormat::BestCsv => "best_csv",
            OutputFormat::TritonMbucket => "triton_mbucket",
            OutputFormat::VllmMoeJson => "vllm_moe_json",
            OutputFormat::AiterFmoeCsv => "aiter_fmoe_csv",
            OutputFormat::TritonKernelsJson => "triton_kernels_json",
            OutputFormat::Report => "report",
            OutputFormat::Ir => "ir",
            OutputFormat::Aot => "aot",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Output {
    pub format: OutputFormat,
    /// A minijinja template relative to the results directory.
    pub path: String,
    /// Only this method's results (default: every eligible method).
    pub method: Option<String>,
    /// `triton_mbucket` with the older key scheme (small, medium_M32, ...).
    pub legacy_keys: bool,
    pub span: Span,
}

/// Builtin baseline rules, written as expressions so they are shown and
/// evaluated like any other. `vllm_moe_default`: vLLM 0.33's default
/// fused-MoE config (`get_default_config`) for bf16/fp16 and per-tensor fp8
/// weights (fp8 takes BLOCK_SIZE_K 128 at every M); block-quantised fp8 has
/// a rule of its own there, which the moe problem's `vllm_default_config`
/// (Python) applies.
pub fn builtin_baseline(name: &str) -> Option<Vec<(&'static str, &'static str)>> {
    match name {
        "vllm_moe_default" => Some(vec![
            (
                "BLOCK_SIZE_M",
                "16 if M <= 32 else (32 if M <= 96 else (64 if M <= 512 else 128))",
            ),
            ("BLOCK_SIZE_N", "64 if M <= 64 else 128"),
            (
                "BLOCK_SIZE_K",
                "128 if M <= 64 or (dtype is defined and dtype == 'fp8') else 64",
            ),
            ("GROUP_SIZE_M", "16 if M // E > 128 else 1"),
            ("num_warps", "4 if M <= 128 else 8"),
            ("num_stages", "4 if M <= 32 else 3"),
        ]),
        // What vLLM 0.33 runs for gpt-oss's MXFP4 experts on sm_90: OpenAI's
        // triton_kernels with its own heuristic's tiles under the one
        // constraint vLLM sets there, split_k 1 (docs/peers.md); the
        // triton_kernels method's keys, 0 leaving a key to the heuristic.
        "vllm_triton_kernels_sm90" => Some(vec![
            ("w1_block_m", "0"),
            ("w2_block_m", "0"),
            ("w1_split_k", "1"),
            ("w2_split_k", "1"),
            ("w1_num_stages", "0"),
            ("w2_num_stages", "0"),
        ]),
        _ => None,
    }
}

pub const BUILTIN_BASELINES: &[&str] = &["vllm_moe_default", "vllm_triton_kernels_sm90"];

/// What a builtin rule run in a kernel is in a consumer's terms, where that
/// is what the consumer runs: vLLM's default config in vLLM's own call
/// structure (`fused_moe_vllm`, tunelab's mirror held to vLLM's kernel, or
/// the `vllm` method), vLLM's triton_kernels setting in triton_kernels. The
/// same config in another kernel is not what vLLM runs. The report's
/// headline compares against it.
pub fn consumer_runs(rule: &str, kernel: &str) -> Option<&'static str> {
    match (rule, kernel) {
        ("vllm_moe_default", "fused_moe_vllm" | "vllm") => {
            Some("what vLLM 0.33 runs without a tuned file (its default config)")
        }
        ("vllm_triton_kernels_sm90", "triton_kernels") => Some(
            "what vLLM 0.33 runs for MXFP4 experts on sm_90 (triton_kernels' heuristic with split_k 1)",
        ),
        _ => None,
    }
}

/// The dtype spelled in a shape, if any.
pub fn shape_dtype(shape: &Shape) -> Option<&str> {
    shape.get("dtype").and_then(Json::as_str)
}

/// `E=32,N=2880,M=1` style label of a shape, fields in order.
pub fn shape_label(shape: &Shape) -> String {
    shape
        .iter()
        .map(|(k, v)| format!("{k}={}", scalar_text(v)))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn scalar_text(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `device.*` as expression constants.
pub fn device_fields(device: &crate::device::DeviceInfo) -> serde_json::Map<String, Json> {
    match serde_json::to_value(device).expect("device serialises") {
        Json::Object(map) => map,
        _ => unreachable!("DeviceInfo is a struct"),
    }
}

/// What the runner keeps at the top of a results directory: no output may
/// be, or be inside, one of these; nor have a name that starts with
/// `journal.jsonl` (the journal, its packed form, the files they are
/// written through).
pub const RUNNER_OWNED: [&str; 5] = ["journal.jsonl", ".lock", "logs", ".cache", "profile"];

/// The runner's name `path` (relative to the results directory, `.` and
/// `..` resolved) would write over or into, if any.
pub fn runner_owned(path: &std::path::Path) -> Option<&'static str> {
    let first = normal_components(path).into_iter().next()?;
    if first.starts_with("journal.jsonl") {
        return Some("journal.jsonl");
    }
    RUNNER_OWNED.iter().copied().find(|name| *name == first)
}

/// A relative path's components with `.` dropped and `..` applied.
pub fn normal_components(path: &std::path::Path) -> Vec<String> {
    use std::path::Component;
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    parts
}

/// Whether a relative output path leaves (or is) the results directory itself.
pub fn escapes(path: &std::path::Path) -> bool {
    use std::path::Component;
    let mut depth: i64 = 0;
    for c in path.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            Component::RootDir | Component::Prefix(_) => return true,
        }
    }
    depth == 0
}
