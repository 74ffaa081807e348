//! The lane backend's native side without a GPU: the answers it reads,
//! the requests it writes, launches resolved from a manifest's expressions
//! and from recipes.

use std::path::PathBuf;

use serde_json::{json, Value as Json};

use super::checks::then_of;
use super::recipes::{resolve, scalar, Launch};
use super::sharing::build_request;
use crate::manifest::ScalarType;
use crate::protocol::native::{Arg, CheckAnswer, Poison};
use crate::protocol::python::{ShareAnswer, SharedTensor};
use crate::protocol::{Answer, Answered, SampleAnswer};
use crate::store::{CheckResult, FailureClass, KernelResources};

/// A native worker's answer line read as the lane reads it.
fn answered(answer: Json) -> Answered<CheckAnswer> {
    Answered::parse(&answer.to_string()).expect("an answer")
}

/// A loaded kernel as the native worker describes it in a check's answer.
fn kernel() -> Json {
    json!({"name": "gemm_mma<128, 64>", "n_regs": 168, "local_bytes": 24,
           "shared": 49152, "threads": 200})
}

#[test]
fn a_native_check_reports_the_kernels_resources() {
    let answer = answered(json!({"id": 3, "ok": true, "compared": null, "then": null,
        "launch_us": 12.0, "kernel": kernel(), "met": "ready", "worker_us": 40.5}));
    let answer = answer.into_body().unwrap();
    let k = KernelResources::from(answer.kernel);
    assert_eq!(k.name, "gemm_mma<128, 64>");
    assert_eq!(k.n_regs, Some(168));
    assert_eq!(k.n_spills, Some(6));
    assert_eq!(k.shared, 49152);
    assert_eq!(k.num_warps, 7);
    assert_eq!(k.num_stages, 0);
    assert!(answer.compared.is_none() && answer.then.is_none());
    // An ok answer without its kernel is not a check's answer.
    assert!(Answered::<CheckAnswer>::parse(r#"{"id":1,"ok":true,"launch_us":1.0}"#).is_err());
}

#[test]
fn a_native_check_answer_reads_its_comparison_and_first_batch() {
    let compared = json!({"passed": true, "max_abs_err": 0.5, "max_rel_err": null,
        "mismatch_frac": 0.0, "nan_count": 0, "inf_count": 0, "elements": 64});
    let line = json!({"id": 7, "ok": true, "compared": compared,
        "then": {"ok": true, "warmup": {"launches": 3, "ms": 5.0},
                 "sample": {"us": [2.0, 3.0], "timer": "cuda_event", "sm_clock_mhz": 1980.0},
                 "wall_ms": 1.5},
        "launch_us": 9.0, "kernel": kernel(), "met": "spinning", "worker_us": 120.0});
    let answer = answered(line.clone());
    assert_eq!(answer.id(), Some(7));
    assert!(answer.ok());
    assert_eq!(answer.worker_us(), Some(120.0));
    assert_eq!(answer.worker_met(), Some("spinning"));
    let answer = answer.into_body().unwrap();
    let check: CheckResult = answer.compared.expect("compared").into();
    assert!(check.passed);
    assert_eq!(check.max_abs_err, Some(0.5));
    assert_eq!(check.max_rel_err, None);
    assert_eq!(check.elements, 64);
    let first = then_of(answer.then, 2).expect("then").expect("a batch");
    assert_eq!(first.len(), 1, "no `more`: the first batch alone");
    assert_eq!(first[0].batch.us, vec![2.0, 3.0]);
    assert_eq!(first[0].batch.sm_clock_mhz, Some(1980.0));
    assert_eq!(first[0].wall_ms, 1.5);

    // Fewer samples than asked for is the worker's protocol error.
    let answer = answered(line.clone()).into_body().unwrap();
    let short = then_of(answer.then, 3).expect("then").unwrap_err();
    assert_eq!(short.class, FailureClass::Crash);

    // A failed warm-up or batch is its failure; the check stands.
    let mut failed = line.clone();
    failed["then"] = json!({"ok": false, "class": "launch_error", "message": "illegal address"});
    let answer = answered(failed).into_body().unwrap();
    let f = then_of(answer.then, 2).expect("then").unwrap_err();
    assert_eq!(f.class, FailureClass::LaunchError);
    assert_eq!(f.message, "illegal address");

    // A `then` that does not fit fails the batches; the answer, and with
    // it the check's verdict, is still read.
    let mut unfit = line.clone();
    unfit["then"] = json!({"ok": true, "sample": "not a batch", "wall_ms": 1.0});
    let answer = answered(unfit).into_body().unwrap();
    assert!(answer.compared.is_some());
    let f = then_of(answer.then, 2).expect("then").unwrap_err();
    assert_eq!(f.class, FailureClass::Crash);
    // No `then` (null, or absent), no batches.
    let mut null = line.clone();
    null["then"] = Json::Null;
    let mut absent = line;
    absent.as_object_mut().unwrap().remove("then");
    for no_then in [null, absent] {
        let answer = answered(no_then).into_body().unwrap();
        assert!(then_of(answer.then, 2).is_none());
    }
}

#[test]
fn a_failed_native_answer_names_its_failure() {
    let line = r#"{"id":9,"ok":false,"class":"launch_error","message":"unspecified launch failure","worker_us":5.0}"#;
    let answer = Answered::<SampleAnswer>::parse(line).unwrap();
    assert!(!answer.ok());
    let f = crate::backend::wire::failure_from(answer.class(), answer.message());
    assert_eq!(f.class, FailureClass::LaunchError);
    assert_eq!(f.message, "unspecified launch failure");
    assert!(answer.into_body().is_none());
    // An answer with no `ok` is not a success.
    let bare = Answered::<SampleAnswer>::parse(r#"{"id":9}"#).unwrap();
    assert!(!bare.ok());
}

#[test]
fn the_check_request_is_what_the_worker_reads() {
    let launch = Launch {
        image: PathBuf::from("/cache/k.cubin"),
        symbol: "k".into(),
        grid: vec![4, 1, 1],
        block: vec![128, 1, 1],
        shared: 1024,
        args: vec![Arg::Tensor(0), Arg::I32(64)],
    };
    let poison = Poison {
        tensor: 2,
        pattern: "c07f".into(),
        elements: 16,
    };
    let request = launch.check_request("j1", poison, None, None);
    assert_eq!(
        serde_json::to_value(&request).unwrap(),
        json!({"job_id": "j1", "image": "/cache/k.cubin", "symbol": "k",
               "grid": [4, 1, 1], "block": [128, 1, 1], "shared": 1024,
               "args": [{"tensor": 0}, {"i32": 64}],
               "poison": {"tensor": 2, "pattern": "c07f", "elements": 16}}),
        "no compare or then where there is none"
    );
}

#[test]
fn scalars_are_typed_and_range_checked() {
    assert_eq!(scalar(ScalarType::I32, &json!(64)), Some(Arg::I32(64)));
    assert_eq!(
        scalar(ScalarType::I32, &json!(1i64 << 31)),
        None,
        "past i32"
    );
    assert_eq!(
        scalar(ScalarType::I64, &json!(1i64 << 40)),
        Some(Arg::I64(1i64 << 40))
    );
    assert_eq!(scalar(ScalarType::U32, &json!(-1)), None);
    assert_eq!(
        scalar(ScalarType::I32, &json!(1.5)),
        None,
        "an int argument takes no fraction"
    );
    assert_eq!(scalar(ScalarType::F32, &json!(2)), Some(Arg::F32(2.0)));
    // An f32 argument is the value rounded once to f32, as the worker reads it.
    assert_eq!(scalar(ScalarType::F32, &json!(0.1)), Some(Arg::F32(0.1)));
}

/// The quickstart's CUDA method at its baseline: grid, block, shared
/// memory and arguments from its expressions, tensors by the names the
/// Python worker shares them under.
#[test]
fn the_quickstart_cuda_launch_resolves_from_its_expressions() {
    let device = crate::device::profile("h100").unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/quickstart.yaml");
    let exp = crate::manifest::load(&path, &[], &device).unwrap();
    let method = exp.method("cuda").unwrap();
    let filter = crate::plan::Filter::parse("M=1024").unwrap();
    let mut baseline = None;
    crate::plan::plan(
        &exp,
        &crate::plan::PlanOptions {
            device: &device,
            filter: &filter,
            mode: crate::plan::Mode::Gpu,
        },
        &mut |j| {
            if j.method == "cuda" && j.baseline {
                baseline = Some(j);
            }
            std::ops::ControlFlow::Continue(())
        },
    )
    .unwrap();
    let job = baseline.unwrap();
    let tensor = |name: &str| SharedTensor {
        name: name.into(),
        dtype: "float16".into(),
        handle: String::new(),
        offset: 0,
        bytes: 0,
        fill: None,
    };
    let shared = ShareAnswer {
        tensors: vec![tensor("a"), tensor("b"), tensor("out")],
        out: 2,
        reference: None,
        poison: "c07f".into(),
        elements: 1024 * 1024,
        uuid: String::new(),
        reference_op: None,
    };
    let dev = Json::Object(crate::manifest::device_fields(&device));
    let l = resolve(method, &job, &shared, &dev).unwrap();
    // BLOCK 128 x 128 x 32, 2 x 2 warps, 3 stages.
    assert_eq!(l.grid, vec![8, 8]);
    assert_eq!(l.block, vec![128]);
    assert_eq!(l.shared, 3 * (128 * 40 + 32 * 136) * 2);
    assert_eq!(
        l.args,
        vec![
            Arg::Tensor(0),
            Arg::Tensor(1),
            Arg::Tensor(2),
            Arg::I32(1024),
            Arg::I32(1024),
            Arg::I32(1024),
        ]
    );
    // A tensor the problem does not share is named, with where it was written.
    let mut only_ab = shared.clone();
    only_ab.tensors.truncate(2);
    let f = resolve(method, &job, &only_ab, &dev).unwrap_err();
    assert!(
        f.message.contains("`out` (at ") && f.message.contains("quickstart.yaml:"),
        "{}",
        f.message
    );
}

#[test]
fn a_described_shape_becomes_the_native_workers_build() {
    // What `native_data` answers for gemm M=96 N=80 K=64 bf16, seed 7
    // (python/tests/test_worker.py checks the Python side of it).
    let answer = json!({
        "tensors": [
            {"name": "a", "dtype": "bfloat16", "shape": [96, 64], "bytes": 12288,
             "fill": {"normal": {"std": 0.35355339059327373, "stream": 0}}},
            {"name": "b", "dtype": "bfloat16", "shape": [64, 80], "bytes": 10240,
             "fill": {"normal": {"std": 0.35355339059327373, "stream": 1}}},
            {"name": "out", "dtype": "bfloat16", "shape": [96, 80], "bytes": 15360, "fill": null},
            {"name": "reference", "dtype": "float32", "shape": [96, 80], "bytes": 30720, "fill": null},
        ],
        "out": 2, "reference": 3, "poison": "c07f", "elements": 7680, "uuid": "", "seed": 7,
        "reference_op": {"op": "matmul", "a": 0, "b": 1, "out": 3, "m": 96, "n": 80, "k": 64},
    });
    let reply: ShareAnswer = serde_json::from_value(answer).unwrap();
    assert_eq!((reply.out, reply.reference), (2, Some(3)));
    assert!(reply
        .tensors
        .iter()
        .all(|t| t.handle.is_empty() && t.offset == 0));
    let request = build_request(&reply, 7);
    // The worker draws with an fp32 std: the lane sends it rounded once.
    let std = 0.35355339059327373_f64 as f32;
    assert_eq!(
        serde_json::to_value(request).unwrap(),
        json!({
            "tensors": [
                {"bytes": 12288, "dtype": "bfloat16",
                 "fill": {"normal": {"std": std, "stream": 0}}},
                {"bytes": 10240, "dtype": "bfloat16",
                 "fill": {"normal": {"std": std, "stream": 1}}},
                {"bytes": 15360, "dtype": "bfloat16", "fill": null},
                {"bytes": 30720, "dtype": "float32", "fill": null},
            ],
            "seed": 7,
            "reference": {"op": "matmul", "a": 0, "b": 1, "out": 3, "m": 96, "n": 80, "k": 64},
        })
    );
}

#[test]
fn a_recipe_becomes_the_workers_arguments() {
    let recipe = json!({
        "image": "/c/triton-ab.cubin", "symbol": "matmul_kernel", "grid": [12, 1, 1],
        "block": [128, 1, 1], "shared": 32768,
        "args": [
            {"tensor": 0, "name": "a_ptr", "type": "*bf16"},
            {"i32": 64, "name": "M", "type": "i32"},
            {"scratch": 0, "name": "global_scratch", "type": "*i8"},
        ],
    });
    let l = Launch::from_recipe(recipe).unwrap();
    assert_eq!(l.args, vec![Arg::Tensor(0), Arg::I32(64), Arg::Scratch(0)]);
    assert_eq!(
        (l.symbol.as_str(), l.shared, l.grid.clone()),
        ("matmul_kernel", 32768, vec![12, 1, 1])
    );
    let bad = json!({"image": "x", "symbol": "k", "grid": [1], "block": [1], "shared": 0, "args": [{"name": "x"}]});
    assert!(Launch::from_recipe(bad).is_err());
}
