//! The Python worker's messages (`python -m tunelab.worker`,
//! docs/worker-protocol.md): what the runner sends (`src/backend/python.rs`,
//! the native lane's `share`, `compare`, `recipes`) and reads back. The
//! worker itself is Python (python/tunelab/worker.py); these types are its
//! description on the runner's side, and the schema generated from them,
//! with the transcript test, holds the worker to it.
//!
//! Requests borrow what the runner holds (a job's shape and config);
//! answers are read leniently where a worker that predates a field leaves
//! it out.

use std::path::Path;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::envelope::Empty;
use super::native::{Arg, BuiltTensor, Comparison, ReferenceOp};
use super::timing::{
    JobSample, JobWarmup, JobsTurns, SampleAnswer, Then, TurnsAnswer, WarmupAnswer,
};

/// The Python worker protocol's version (`hello`'s `protocol`): a worker of
/// another version is refused at start-up.
pub const VERSION: u32 = 4;

/// A shape's fields, or a job's config: names to JSON values.
pub type Fields = IndexMap<String, Json>;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[schemars(rename = "PythonHelloAnswer")]
pub struct HelloAnswer {
    pub protocol: u32,
    pub python: String,
    pub torch: Option<String>,
    pub triton: Option<String>,
    /// torch's CUDA version; null without one.
    pub cuda: Option<String>,
    /// "gpu" or "interpreter".
    pub mode: Option<String>,
    pub device: Option<String>,
}

/// `probe`: import and construct the problem at one shape, look up methods
/// by name (each with its kind), building nothing else.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Probe<'a> {
    pub problem: &'a str,
    #[schemars(with = "Fields")]
    pub shape: &'a Json,
    pub methods: Vec<&'a str>,
    /// Method name -> kind: a Triton method's config types then include the
    /// compile options the worker passes to its kernels.
    pub kinds: IndexMap<&'a str, &'a str>,
}

/// The type of a config value, as a method declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    Int,
    Float,
    Str,
    Bool,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ProbedMethod {
    pub found: bool,
    /// `None`: the method declares no types.
    pub config_types: Option<IndexMap<String, ValueType>>,
    /// The first line of the method's documentation, if it has one.
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ProbeAnswer {
    pub methods: IndexMap<String, ProbedMethod>,
    /// Every method the problem has.
    pub available: Vec<String>,
}

/// `describe`: problem facts at one shape; with `seed` (a lane worker), the
/// shape's inputs and reference built too.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Describe<'a> {
    pub problem: &'a str,
    #[schemars(with = "Fields")]
    pub shape: &'a Json,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct DescribeAnswer {
    /// Null where the problem's count is not a finite number.
    pub flops: Option<f64>,
    pub bytes: Option<f64>,
    #[serde(default)]
    pub methods: Vec<String>,
    /// Methods that cannot run in this worker, and why; a compile worker
    /// with `--target` cannot tell and leaves it out.
    #[serde(default)]
    pub unavailable: IndexMap<String, String>,
    /// Seconds the inputs took to build (with `seed`).
    #[serde(default)]
    pub inputs_s: Option<f64>,
}

/// A job's method as the worker looks it up.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct JobMethod<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    /// The entry of the problem's `methods()` to run.
    pub kernel: &'a str,
    /// The IR file the method's kernel is compiled from (`ir:` methods).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ir: Option<String>,
    /// An A/B side's variant: modules of tunelab's kernels to load from
    /// these files instead (module name -> file; docs/ab.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modules: Option<IndexMap<String, String>>,
}

/// A job: one method at one shape and config.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Job<'a> {
    pub job_id: &'a str,
    /// A builtin's name, or "module.path:ClassName".
    pub problem: &'a str,
    pub shape: &'a Fields,
    pub method: JobMethod<'a>,
    /// The method's parameters, space point and derived values, merged.
    pub config: &'a Fields,
    /// A planted slowdown (an A/B testing knob, docs/ab.md): microseconds
    /// of spin after each of the job's launches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plant_us: Option<f64>,
}

/// The recipe a compile worker makes with its compile (`inputs: native`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecipeAsk {
    #[serde(default)]
    pub seed: u64,
    /// Where the cubin goes.
    pub cache_dir: std::path::PathBuf,
}

/// `compile`: compile one job's kernels without timing them.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Compile<'a> {
    pub job: Job<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<RecipeAsk>")]
    pub recipe: Option<&'a Json>,
}

/// What the compiler made of one kernel (registers and spills as the
/// driver, or the cubin, states them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Kernel {
    pub name: String,
    pub n_regs: Option<u32>,
    pub n_spills: Option<u32>,
    /// Dynamic shared memory per block, bytes.
    pub shared: u64,
    pub num_warps: u32,
    pub num_stages: u32,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct CompileAnswer {
    /// False: nothing to compile, or the interpreter.
    #[serde(default)]
    pub compiled: bool,
    /// Wall time of the method's compile.
    pub seconds: f64,
    #[serde(default)]
    pub kernels: Vec<Kernel>,
    /// The job's recipe where it was asked for (`ok` and the recipe, or the
    /// failure to make one), as `recipes` answers each.
    #[serde(default)]
    #[schemars(with = "Option<RecipeOutcome>")]
    pub recipe: Option<Json>,
}

/// The tolerance a comparison applies: an element mismatches when
/// |out - ref| > atol + rtol * |ref|.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
    #[serde(default)]
    pub max_mismatch: f64,
}

/// `check`: the correctness gate; a passing job stays prepared.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[schemars(rename = "PythonCheck")]
pub struct Check<'a> {
    pub job: Job<'a>,
    pub seed: u64,
    pub tolerance: Tolerance,
    /// After a check that passes, the warm-up and first batch in the same call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub then: Option<Then>,
    /// The job passed its check earlier in this group: a worker that holds
    /// it prepared may answer that verdict again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reuse: bool,
}

/// The answer to `check` (and to `compare`, without `kernels`): the
/// comparison's figures, the kernels compiled, and, where asked for and
/// the check passed, `then`'s answer (read apart, as both workers send it).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[schemars(rename = "PythonCheckAnswer")]
pub struct CheckAnswer {
    #[serde(flatten)]
    pub comparison: Comparison,
    /// The kernels the check compiled and launched (absent from a worker
    /// that predates the field).
    #[serde(default)]
    pub kernels: Vec<Kernel>,
    /// A verdict kept from the job's earlier check (`reuse`).
    #[serde(default)]
    pub reused: bool,
    #[serde(default)]
    #[schemars(with = "Option<super::timing::ThenAnswer>")]
    pub then: Option<Json>,
}

/// `keep_ir`: compile one job and write its kernels' IR under `dir`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KeepIr<'a> {
    pub job: Job<'a>,
    pub dir: String,
}

/// A kernel whose IR a worker wrote: its resources and files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KeptKernel {
    pub name: String,
    pub n_regs: Option<u32>,
    pub n_spills: Option<u32>,
    pub shared: u64,
    pub num_warps: u32,
    pub num_stages: u32,
    /// File names written, in the job's folder.
    pub files: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct KeepIrAnswer {
    pub kernels: Vec<KeptKernel>,
}

/// A shape's data for one seed (`share`, `digest`, `native_data`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ShapeData<'a> {
    pub problem: &'a str,
    pub shape: &'a Fields,
    pub seed: u64,
}

/// One tensor of a shape's data, shared (`share`) or described for the
/// native worker to build (`native_data`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SharedTensor {
    pub name: String,
    /// torch's name for the element type (float32, bfloat16, ...).
    #[serde(default)]
    pub dtype: String,
    /// The allocation's IPC handle, hex (empty for a tensor the native
    /// worker builds).
    #[serde(default)]
    pub handle: String,
    /// Where the tensor starts in its allocation.
    #[serde(default)]
    pub offset: u64,
    pub bytes: u64,
    /// How the native worker fills it (`native_data`), as `build` takes it.
    #[serde(default)]
    pub fill: Option<super::native::Fill>,
}

impl SharedTensor {
    /// The tensor as the native worker's `build` makes it.
    pub fn to_build(&self) -> BuiltTensor {
        BuiltTensor {
            bytes: self.bytes,
            dtype: self.dtype.clone(),
            fill: self.fill,
        }
    }
}

/// The answer to `share` (and, with `seed` and `reference_op`, to
/// `native_data`): every tensor of the shape, the output's and the
/// reference's index, the output's poison and element count, the GPU.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ShareAnswer {
    pub tensors: Vec<SharedTensor>,
    pub out: usize,
    /// The reference's tensor, where the native worker can compare with it
    /// (float32/16 or bfloat16, contiguous); else null: the Python worker
    /// compares.
    #[serde(default)]
    pub reference: Option<usize>,
    /// One element of the output's poison, hex.
    pub poison: String,
    pub elements: u64,
    /// The GPU's UUID (empty from a worker without one).
    pub uuid: String,
    /// `native_data`: the operator computing the reference.
    #[serde(default)]
    pub reference_op: Option<ReferenceOp>,
}

/// `compare`: the shared output against the reference, as `check` compares.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[schemars(rename = "PythonCompare")]
pub struct Compare<'a> {
    pub problem: &'a str,
    pub shape: &'a Fields,
    pub seed: u64,
    pub tolerance: Tolerance,
}

/// `recipe`: one Triton job's native launch.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Recipe<'a> {
    pub job: Job<'a>,
    pub seed: u64,
    pub cache_dir: &'a Path,
}

/// `recipes`: `recipe` for each job of one shape, in one call.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Recipes<'a> {
    pub jobs: Vec<Job<'a>>,
    pub seed: u64,
    pub cache_dir: &'a Path,
}

/// A recipe's argument: its value as the native worker takes it
/// (`{"tensor": 0}`, `{"i32": 64}`, ...), with its parameter's name and
/// Triton type.
#[derive(Debug, Clone, Deserialize)]
pub struct RecipeArg {
    #[serde(flatten)]
    pub value: Arg,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, rename = "type")]
    pub triton_type: Option<String>,
}

impl JsonSchema for RecipeArg {
    fn schema_name() -> String {
        "RecipeArg".into()
    }

    /// One of `Arg`'s kinds as a key (exactly one), beside `name` and `type`.
    fn json_schema(gen: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        let mut properties = serde_json::Map::new();
        properties.insert("name".into(), serde_json::json!({"type": "string"}));
        properties.insert("type".into(), serde_json::json!({"type": "string"}));
        let kinds = [
            ("tensor", gen.subschema_for::<usize>()),
            ("i32", gen.subschema_for::<i32>()),
            ("i64", gen.subschema_for::<i64>()),
            ("u32", gen.subschema_for::<u32>()),
            ("u64", gen.subschema_for::<u64>()),
            ("f32", gen.subschema_for::<f32>()),
            ("f64", gen.subschema_for::<f64>()),
            ("scratch", gen.subschema_for::<u64>()),
        ];
        debug_assert!(kinds.iter().map(|(k, _)| *k).eq(Arg::KINDS));
        let one_of: Vec<Json> = kinds
            .iter()
            .map(|(k, _)| serde_json::json!({"required": [k]}))
            .collect();
        for (k, schema) in kinds {
            properties.insert(k.into(), serde_json::to_value(schema).expect("schema"));
        }
        let schema = serde_json::json!({
            "description": "A recipe's argument: exactly one kind (tensor, i32, i64, u32, u64, f32, f64, scratch) with its value, and the parameter's name and Triton type.",
            "type": "object",
            "properties": properties,
            "oneOf": one_of,
        });
        serde_json::from_value(schema).expect("a schema")
    }
}

/// A Triton job's native launch: the image and symbol, grid, block, shared
/// memory and arguments, and what Triton compiled.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RecipeAnswer {
    pub image: std::path::PathBuf,
    pub symbol: String,
    pub grid: Vec<u64>,
    pub block: Vec<u64>,
    pub shared: u64,
    pub args: Vec<RecipeArg>,
    /// Absent from a worker without torch (`inputs: native`).
    #[serde(default)]
    pub kernels: Vec<Kernel>,
}

/// One job's recipe in `recipes` (and a `compile`'s `recipe`): the recipe
/// with `"ok": true`, or that job's failure (`"ok": false`, `class`,
/// `message`). The runner reads each on its own (a recipe that does not fit
/// is that job's failure), so this type only describes it.
#[derive(Debug, Clone, JsonSchema)]
pub struct RecipeOutcome {
    pub ok: bool,
    pub class: Option<super::FailureKind>,
    pub message: Option<String>,
    #[serde(flatten)]
    pub recipe: Option<RecipeAnswer>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RecipesAnswer {
    /// One per job, in order ([`RecipeOutcome`]).
    #[schemars(with = "Vec<RecipeOutcome>")]
    pub recipes: Vec<Json>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct DigestAnswer {
    pub sha256: String,
    pub bytes: u64,
}

/// Every op the Python worker serves: its name, its request's and its
/// answer's schema (the schema document and the transcript test list them
/// from here).
pub fn ops() -> Vec<super::schema::Op> {
    use super::schema::Op;
    vec![
        Op::of::<Empty, HelloAnswer>("hello"),
        Op::of::<Probe<'static>, ProbeAnswer>("probe"),
        Op::of::<Describe<'static>, DescribeAnswer>("describe"),
        Op::of::<Compile<'static>, CompileAnswer>("compile"),
        Op::of::<Check<'static>, CheckAnswer>("check"),
        Op::of::<JobWarmup, WarmupAnswer>("warmup"),
        Op::of::<JobSample, SampleAnswer>("sample"),
        Op::of::<JobsTurns, TurnsAnswer>("sample_turns"),
        Op::of::<KeepIr<'static>, KeepIrAnswer>("keep_ir"),
        Op::of::<ShapeData<'static>, ShareAnswer>("share"),
        Op::of::<Compare<'static>, Comparison>("compare"),
        Op::of::<Recipe<'static>, RecipeAnswer>("recipe"),
        Op::of::<Recipes<'static>, RecipesAnswer>("recipes"),
        Op::of::<ShapeData<'static>, DigestAnswer>("digest"),
        Op::of::<ShapeData<'static>, ShareAnswer>("native_data"),
        Op::of::<Empty, Empty>("release"),
        Op::of::<Empty, Empty>("shutdown"),
    ]
}
