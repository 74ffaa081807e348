//! The native worker's messages (`tunelab native-worker`,
//! docs/native-backend.md, "The native worker protocol"): what the native
//! lane sends (`src/backend/native/lane_backend/`) and the native worker
//! reads (`src/native/server/`), one type for both. Requests that the
//! runner writes and the worker reads borrow where the runner has the
//! values already (`Cow`): the runner writes a `check` for every job.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::envelope::{Deferred, Empty};
use super::timing::{JobSample, JobWarmup, SampleAnswer, Then, ThenAnswer, WarmupAnswer};

/// The native worker protocol's version (`hello`'s `protocol`).
pub const VERSION: u32 = 1;

/// `hello`: opens the GPU; loads tunelab's helper kernels where given.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "NativeHello")]
pub struct Hello {
    /// The helper image (spin, flush, compare, fill, reference;
    /// `tunelab native-compile --helpers` builds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helpers: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "NativeHelloAnswer")]
pub struct HelloAnswer {
    pub protocol: u32,
    /// "cuda" or "hip".
    pub backend: String,
    pub device: String,
    /// `GPU-xxxxxxxx-...` as nvidia-smi names it; empty where unknown.
    pub uuid: String,
    pub driver: String,
    /// The tunelab build's version.
    pub version: String,
}

/// One tensor another process shares: where it lives in which allocation.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ImportedTensor {
    /// The allocation's IPC handle, hex (64 bytes).
    pub handle: String,
    /// Where the tensor starts in it.
    pub offset: u64,
    pub bytes: u64,
}

/// `import`: maps a shape's shared tensors, replacing the previous shape's.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Import {
    pub tensors: Vec<ImportedTensor>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ImportAnswer {
    pub tensors: usize,
    /// Allocations mapped (tensors share them).
    pub allocations: usize,
}

/// How a built tensor is filled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Fill {
    /// std * N(0, 1) draws from the generator's stream `stream`.
    Normal {
        std: f32,
        stream: u64,
    },
    Zeros,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BuiltTensor {
    pub bytes: u64,
    /// torch's name for the element type (float32, float16, bfloat16, ...).
    pub dtype: String,
    /// How it is filled; none: left as allocated (an output, poisoned
    /// before each launch).
    #[serde(default)]
    pub fill: Option<Fill>,
}

/// The reference operators the native worker computes (src/native/helpers.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ReferenceOp {
    /// out [m, n] fp32 = a [m, k] @ b [k, n], all row-major and contiguous.
    Matmul {
        a: usize,
        b: usize,
        out: usize,
        m: u32,
        n: u32,
        k: u32,
    },
}

/// `build`: a shape's tensors allocated and filled by the native worker
/// (`inputs: native`), replacing the previous shape's, indexed as `import`
/// indexes them.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Build {
    pub tensors: Vec<BuiltTensor>,
    /// The generator's seed: the same seed gives the same bits.
    pub seed: u64,
    /// The operator whose fp32 result fills the reference tensor.
    #[serde(default)]
    pub reference: Option<ReferenceOp>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BuildAnswer {
    pub tensors: usize,
    pub build_ms: f64,
}

/// `fetch`: a tensor's bytes (64 MiB at most; for tests).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Fetch {
    #[serde(default)]
    pub tensor: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FetchAnswer {
    pub bytes: u64,
    pub hex: String,
}

/// One kernel argument, as the runner resolved it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Arg {
    /// The device pointer of shared (or built) tensor `i`.
    Tensor(usize),
    I32(i32),
    I64(i64),
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
    /// A scratch buffer of this many bytes per program, which the worker
    /// allocates (null when 0), as Triton's launcher sizes global scratch.
    Scratch(u64),
}

impl Arg {
    /// The argument kinds a recipe names (the enum's spellings).
    pub const KINDS: [&'static str; 8] = [
        "tensor", "i32", "i64", "u32", "u64", "f32", "f64", "scratch",
    ];
}

/// The pattern the output is filled with before a check's launch.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Poison<'a> {
    pub tensor: usize,
    /// One element's bytes, hex (1, 2, 4 or 8 bytes).
    pub pattern: Cow<'a, str>,
    pub elements: u64,
}

/// `compare`: an output tensor against a reference, both shared or built,
/// under `tunelab.compare`'s tolerance rule (python/tunelab/compare.py).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "NativeCompare")]
pub struct Compare<'a> {
    pub out: usize,
    /// torch's name for the element type: float32, float16 or bfloat16.
    pub out_dtype: Cow<'a, str>,
    pub reference: usize,
    pub reference_dtype: Cow<'a, str>,
    pub elements: u64,
    pub atol: f64,
    pub rtol: f64,
    #[serde(default)]
    pub max_mismatch: f64,
}

/// `check`: prepares a job and launches it once into its poisoned output;
/// with `compare`, compares it with the reference in the same call, and
/// with `then` (and `compare`), goes on to the warm-up and batches.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "NativeCheck")]
pub struct Check<'a> {
    pub job_id: Cow<'a, str>,
    /// The compiled image (a cubin, an hsaco).
    pub image: Cow<'a, Path>,
    pub symbol: Cow<'a, str>,
    /// One to three dimensions each.
    pub grid: Cow<'a, [u64]>,
    pub block: Cow<'a, [u64]>,
    /// Dynamic shared memory, bytes.
    #[serde(default)]
    pub shared: u64,
    pub args: Cow<'a, [Arg]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poison: Option<Poison<'a>>,
    /// Compare the output with the reference after the launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compare: Option<Compare<'a>>,
    /// After a comparison that passes, the warm-up and the first batch in
    /// the same call, and with `until` the batches after it until the
    /// runner's stopping rule says enough. Ignored without `compare` (the
    /// verdict is then the Python worker's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then: Option<Then>,
}

/// `compare`'s answer, and a check's comparison: `tunelab.compare`'s
/// figures (the Python worker's `check` answers the same fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Comparison {
    pub passed: bool,
    /// Over elements finite on both sides (0 where none are); null where
    /// not a finite number.
    pub max_abs_err: Option<f64>,
    pub max_rel_err: Option<f64>,
    pub mismatch_frac: f64,
    pub nan_count: u64,
    pub inf_count: u64,
    pub elements: u64,
}

/// The kernel a check loaded, as the driver reports the function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoadedKernel {
    pub name: String,
    /// Registers per thread.
    pub n_regs: Option<u64>,
    /// Local (spill) memory per thread, bytes.
    pub local_bytes: Option<u64>,
    /// Shared memory per block, static and dynamic, bytes.
    #[serde(default)]
    pub shared: u64,
    /// Threads per block.
    pub threads: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "NativeCheckAnswer")]
pub struct CheckAnswer {
    /// The comparison, where the check asked for one (null: the Python
    /// worker compares).
    pub compared: Option<Comparison>,
    /// Where the comparison passed and `then` was asked for: the batches or
    /// their failure. Read after the rest: a `then` that does not fit fails
    /// the batches, and the check's verdict stands.
    pub then: Option<Deferred<ThenAnswer>>,
    /// The check's one launch, host time to its synchronisation.
    pub launch_us: f64,
    pub kernel: LoadedKernel,
}

/// `launch_cost`: the host cost of launching the prepared job.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct LaunchCost {
    pub job_id: String,
    /// Launches, in batches of 100 queued behind a spin (default 10000).
    #[serde(default = "ten_thousand")]
    #[schemars(range(min = 100, max = 1_000_000))]
    pub count: u64,
}

fn ten_thousand() -> u64 {
    10_000
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct LaunchCostAnswer {
    pub launches: u64,
    /// Per launch, over batches of 100.
    pub mean_us: f64,
    pub median_us: f64,
    pub wall_s: f64,
}

/// Every op the native worker serves: its name, its request's and its
/// answer's schema. The schema document and the transcript test list ops
/// from here; the worker's dispatch (`src/native/server/mod.rs`) serves
/// each.
pub fn ops() -> Vec<super::schema::Op> {
    use super::schema::Op;
    vec![
        Op::of::<Hello, HelloAnswer>("hello"),
        Op::of::<Import, ImportAnswer>("import"),
        Op::of::<Build, BuildAnswer>("build"),
        Op::of::<Fetch, FetchAnswer>("fetch"),
        Op::of::<Check<'static>, CheckAnswer>("check"),
        Op::of::<JobWarmup, WarmupAnswer>("warmup"),
        Op::of::<JobSample, SampleAnswer>("sample"),
        Op::of::<Compare<'static>, Comparison>("compare"),
        Op::of::<LaunchCost, LaunchCostAnswer>("launch_cost"),
        Op::of::<Empty, Empty>("release"),
        Op::of::<Empty, Empty>("shutdown"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_build_request_reads_each_fill_and_the_reference() {
        let r: Build = serde_json::from_value(json!({
            "tensors": [
                {"bytes": 8, "dtype": "float16", "fill": {"normal": {"std": 0.5, "stream": 1}}},
                {"bytes": 8, "dtype": "float32", "fill": "zeros"},
                {"bytes": 8, "dtype": "bfloat16", "fill": null},
                {"bytes": 8, "dtype": "float32"},
            ],
            "seed": 3,
            "reference": {"op": "matmul", "a": 0, "b": 1, "out": 3, "m": 2, "n": 1, "k": 2},
        }))
        .unwrap();
        assert_eq!(
            r.tensors[0].fill,
            Some(Fill::Normal {
                std: 0.5,
                stream: 1
            })
        );
        assert_eq!(r.tensors[1].fill, Some(Fill::Zeros));
        assert!(r.tensors[2].fill.is_none() && r.tensors[3].fill.is_none());
        assert_eq!(
            r.reference,
            Some(ReferenceOp::Matmul {
                a: 0,
                b: 1,
                out: 3,
                m: 2,
                n: 1,
                k: 2
            })
        );
        // An operator the worker does not know is refused, not ignored.
        let unknown = json!({"tensors": [], "seed": 0, "reference": {"op": "conv", "a": 0}});
        assert!(serde_json::from_value::<Build>(unknown).is_err());
    }

    #[test]
    fn arguments_are_spelled_by_their_kind() {
        let args = [Arg::Tensor(0), Arg::I32(64), Arg::F32(2.0), Arg::Scratch(0)];
        assert_eq!(
            serde_json::to_value(args).unwrap(),
            json!([{"tensor": 0}, {"i32": 64}, {"f32": 2.0}, {"scratch": 0}])
        );
        for kind in Arg::KINDS {
            let arg: Arg = serde_json::from_value(json!({ kind: 1 })).unwrap();
            assert_eq!(
                serde_json::to_value(arg).unwrap()[kind].as_f64(),
                Some(1.0),
                "{kind}"
            );
        }
    }
}
