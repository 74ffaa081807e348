//! Output writers from fixture journals: file names, exact bytes of the
//! formats other tools load, the selection rule, and report snapshots.
//! No GPU, no Python: everything comes from `tests/fixtures/journals/`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde_json::Value as Json;

use tunelab::emit::{self, triton_mbucket, Rendered};
use tunelab::store::{JobStatus, Results};

mod consumers;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/journals")
        .join(name)
}

/// Reads a fixture journal with the store's own reader (they are of format 1).
fn load(name: &str) -> Results {
    let (results, warnings) = tunelab::store::journal::read_file(&fixture(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(warnings.is_empty(), "{name}: {warnings:?}");
    results
}

fn render(results: &Results) -> IndexMap<String, String> {
    emit::render_outputs(results)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|Rendered { path, contents, .. }| (path.display().to_string(), contents))
        .collect()
}

fn shape_is(shape: &IndexMap<String, Json>, fields: &[(&str, Json)]) -> bool {
    fields.iter().all(|(k, v)| shape.get(*k) == Some(v))
}

fn best_of<'a>(bests: &'a [emit::Best], method: &str, fields: &[(&str, Json)]) -> &'a emit::Best {
    bests
        .iter()
        .find(|b| b.method == method && shape_is(&b.shape, fields))
        .unwrap_or_else(|| panic!("no best for {method} at {fields:?}"))
}

// ---------------------------------------------------------------- vLLM

#[test]
fn vllm_files_are_named_per_e_and_n_from_the_template() {
    let out = render(&load("moe.jsonl"));
    let names: Vec<&str> = out
        .keys()
        .map(String::as_str)
        .filter(|p| p.starts_with("vllm/"))
        .collect();
    assert_eq!(
        names,
        [
            "vllm/E=32,N=1440,device_name=NVIDIA_H200.json",
            "vllm/E=32,N=2880,device_name=NVIDIA_H200.json",
            "vllm/E=128,N=1440,device_name=NVIDIA_H200.json",
            "vllm/E=128,N=2880,device_name=NVIDIA_H200.json",
        ]
    );
}

const VLLM_E32_N2880: &str = r#"{
    "triton_version": "3.4.0",
    "1": {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 4
    },
    "4": {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 16,
        "num_warps": 4,
        "num_stages": 4
    },
    "16": {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 32,
        "num_warps": 4,
        "num_stages": 4
    },
    "64": {
        "BLOCK_SIZE_M": 32,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 64,
        "num_warps": 4,
        "num_stages": 3
    },
    "256": {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 8,
        "num_stages": 3
    },
    "1024": {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 16,
        "num_warps": 8,
        "num_stages": 3
    }
}
"#;

#[test]
fn vllm_file_bytes_are_exact() {
    let out = render(&load("moe.jsonl"));
    assert_eq!(
        out["vllm/E=32,N=2880,device_name=NVIDIA_H200.json"],
        VLLM_E32_N2880
    );
}

/// Every tuned shape of `results` (best of `method`), looked up as vLLM
/// looks it up, finds its tuned config, in the files `out` holds.
fn assert_vllm_finds_every_tuned_shape(
    results: &Results,
    out: &IndexMap<String, String>,
    method: &str,
    quant: Option<&'static str>,
    block_shape: Option<[i64; 2]>,
) -> usize {
    let files = basenames(out, "vllm/");
    let torch_name = &results.header.as_ref().unwrap().device.name;
    let mut found = 0;
    for b in emit::best_per_shape(results)
        .iter()
        .filter(|b| b.method == method)
    {
        let int = |f: &str| b.shape[f].as_i64().unwrap();
        let fp32 = b.shape.get("dtype") == Some(&Json::from("fp32"));
        let dtype = consumers::vllm::dtype_str(quant, fp32);
        let m = int("M");
        let (key, config) = consumers::vllm::lookup(
            &files,
            torch_name,
            int("E"),
            int("N"),
            dtype,
            block_shape,
            m,
        )
        .unwrap_or_else(|| panic!("vLLM finds no file for {:?}", b.shape));
        assert_eq!(key, m, "every tuned M is a key: {:?}", b.shape);
        let expected: serde_json::Map<String, Json> = b
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(config, expected, "{:?}", b.shape);
        found += 1;
    }
    found
}

/// The files of `out` under `dir`, by file name: what a consumer opens.
fn basenames(out: &IndexMap<String, String>, dir: &str) -> consumers::Files {
    out.iter()
        .filter_map(|(p, c)| p.strip_prefix(dir).map(|n| (n.to_string(), c.clone())))
        .collect()
}

#[test]
fn vllm_finds_every_tuned_shape_and_the_nearest_key_between_them() {
    let results = load("moe.jsonl");
    let out = render(&results);
    assert_eq!(
        assert_vllm_finds_every_tuned_shape(&results, &out, "triton", None, None),
        24
    );
    // Between tuned Ms vLLM takes the nearest key (the smaller on a tie).
    let files = basenames(&out, "vllm/");
    let bests = emit::best_per_shape(&results);
    for (m, nearest) in [
        (2, 1),
        (3, 4),
        (10, 4),
        (12, 16),
        (40, 16),
        (41, 64),
        (200, 256),
        (700, 1024),
        (5000, 1024),
    ] {
        let (key, config) =
            consumers::vllm::lookup(&files, "NVIDIA H200", 128, 1440, None, None, m).unwrap();
        assert_eq!(key, nearest, "M={m}");
        let tuned = best_of(
            &bests,
            "triton",
            &[("E", 128.into()), ("N", 1440.into()), ("M", nearest.into())],
        );
        assert_eq!(
            Json::Object(config),
            serde_json::to_value(&tuned.config).unwrap()
        );
    }
}

#[test]
fn vllm_device_names_follow_vllm_and_a_stale_recorded_name_is_caught() {
    // A GH200 is not an H200: vLLM keeps its own name.
    let mut results = load("moe.jsonl");
    let device = &mut results.header.as_mut().unwrap().device;
    device.name = "NVIDIA GH200 480GB".into();
    device.vllm_name = tunelab::device::vllm_device_name(&device.name);
    assert_eq!(device.vllm_name, "NVIDIA_GH200_480GB");
    let out = render(&results);
    assert!(out.contains_key("vllm/E=32,N=2880,device_name=NVIDIA_GH200_480GB.json"));
    assert_vllm_finds_every_tuned_shape(&results, &out, "triton", None, None);

    // A journal that recorded the old rule's name renders a file vLLM never opens: an error.
    results.header.as_mut().unwrap().device.vllm_name = "NVIDIA_H200".into();
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("E=32,N=1440,device_name=NVIDIA_GH200_480GB.json")
            && err.contains("older rule"),
        "{err}"
    );
}

#[test]
fn a_path_vllm_never_opens_is_an_error_that_gives_the_name() {
    let mut results = load("moe.jsonl");
    let spec = &mut results.header.as_mut().unwrap().outputs[0];
    assert_eq!(spec.format.name(), "vllm_moe_json");
    spec.path = "vllm/E={{E}},N={{N}}.json".into();
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("`E=32,N=1440,device_name=NVIDIA_H200.json`")
            && err.contains("E={{E}},N={{N}},device_name={{device.vllm_name}}.json"),
        "{err}"
    );
    // Shapes of two files in one: also an error.
    results.header.as_mut().unwrap().outputs[0].path =
        "vllm/E={{E}},device_name={{device.vllm_name}}.json".into();
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(err.contains("belong in different vLLM files"), "{err}");
}

/// The moe fixture as a block-quantised fp8 run.
fn fp8_block(results: &mut Results) {
    for j in &mut results.jobs {
        j.shape.insert("dtype".into(), "fp8".into());
        j.shape.insert("weight_quant".into(), "block".into());
        j.shape
            .insert("block_shape".into(), serde_json::json!([128, 128]));
    }
}

#[test]
fn quantised_shapes_get_vllms_dtype_and_block_shape_suffixes() {
    let mut results = load("moe.jsonl");
    fp8_block(&mut results);
    // The plain template names the bf16 file: refused, with the name to use.
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains(
            "`E=32,N=1440,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json`"
        ) && err.contains(",dtype=fp8_w8a8,block_shape=[128,128].json`"),
        "{err}"
    );
    results.header.as_mut().unwrap().outputs[0].path =
        "vllm/E={{E}},N={{N}},device_name={{device.vllm_name}},dtype=fp8_w8a8,block_shape=[128,128].json"
            .into();
    let out = render(&results);
    assert!(out.contains_key(
        "vllm/E=128,N=2880,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    ));
    assert_eq!(
        assert_vllm_finds_every_tuned_shape(
            &results,
            &out,
            "triton",
            Some("fp8_w8a8"),
            Some([128, 128])
        ),
        24
    );

    // Per-tensor fp8: the dtype suffix alone.
    let mut results = load("moe.jsonl");
    for j in &mut results.jobs {
        j.shape.insert("dtype".into(), "fp8".into());
        j.shape.insert("weight_quant".into(), "per_tensor".into());
    }
    results.header.as_mut().unwrap().outputs[0].path =
        "vllm/E={{E}},N={{N}},device_name={{device.vllm_name}},dtype=fp8_w8a8.json".into();
    let out = render(&results);
    assert_vllm_finds_every_tuned_shape(&results, &out, "triton", Some("fp8_w8a8"), None);

    // fp32: vLLM's `float32` configs.
    let mut results = load("moe.jsonl");
    for j in &mut results.jobs {
        j.shape.insert("dtype".into(), "fp32".into());
    }
    results.header.as_mut().unwrap().outputs[0].path =
        "vllm/E={{E}},N={{N}},device_name={{device.vllm_name}},dtype=float32.json".into();
    let out = render(&results);
    assert_vllm_finds_every_tuned_shape(&results, &out, "triton", None, None);
}

#[test]
fn inconsistent_quantisation_fields_are_errors() {
    let cases: [(&[(&str, Json)], &str); 4] = [
        (&[("weight_quant", "block".into())], "needs `block_shape"),
        (
            &[("block_shape", serde_json::json!([128, 128]))],
            "needs a quantised `dtype`",
        ),
        (&[("dtype", "int8_w8a8".into())], "unquantised file name"),
        (
            &[
                ("dtype", "fp8".into()),
                ("block_shape", serde_json::json!([128])),
            ],
            "not a list of two positive integers",
        ),
    ];
    for (fields, message) in cases {
        let mut results = load("moe.jsonl");
        for j in &mut results.jobs {
            for (k, v) in fields {
                j.shape.insert(k.to_string(), v.clone());
            }
        }
        let err = emit::render_outputs(&results).unwrap_err().to_string();
        assert!(err.contains(message), "{fields:?}: {err}");
    }
}

#[test]
fn vllm_file_names_parse_back() {
    use tunelab::emit::vllm::FileKey;
    for name in [
        "E=32,N=2880,device_name=NVIDIA_H200.json",
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        "E=8,N=14336,device_name=NVIDIA_A100-SXM4-80GB,dtype=int8_w8a16.json",
        "E=64,N=1536,device_name=AMD_Instinct_MI300X,dtype=float32.json",
    ] {
        let key = FileKey::parse(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(key.to_string(), name);
    }
    let key = FileKey::parse(
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
    )
    .unwrap();
    assert_eq!(
        (key.e, key.n, key.dtype.as_deref(), key.block_shape),
        (256, 256, Some("fp8_w8a8"), Some([128, 128]))
    );
    for bad in [
        "E=32,N=2880.json",
        "E=32,N=2880,device_name=X,block_shape=[128, 128].json",
        "N=1,E=2,device_name=X.json",
        "tuned_fmoe.csv",
    ] {
        assert_eq!(FileKey::parse(bad), None, "{bad}");
    }
}

/// The committed gpt-oss runs, regenerated: vLLM finds every tuned shape.
#[test]
fn committed_gptoss_vllm_files_hold_every_tuned_shape() {
    for device in ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"] {
        let Some(run) = committed_rendered("gptoss", device) else {
            continue;
        };
        let (results, out) = &*run;
        assert_eq!(
            assert_vllm_finds_every_tuned_shape(results, out, "triton_vllm", None, None),
            144,
            "{device}"
        );
    }
}

/// A committed run and its outputs as rendered now, read and rendered once
/// for the tests of this file that look at it (several render the same
/// gpt-oss journals: each takes seconds), or `None` when it moved.
fn committed_rendered(
    experiment: &str,
    device: &str,
) -> Option<std::sync::Arc<(Results, IndexMap<String, String>)>> {
    type Cache = std::collections::HashMap<
        (String, String),
        Option<std::sync::Arc<(Results, IndexMap<String, String>)>>,
    >;
    static CACHE: std::sync::OnceLock<std::sync::Mutex<Cache>> = std::sync::OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    cache
        .entry((experiment.to_string(), device.to_string()))
        .or_insert_with(|| {
            let results = committed(experiment, device)?;
            let out = render(&results);
            Some(std::sync::Arc::new((results, out)))
        })
        .clone()
}

/// A committed results directory's journal, or `None` (with a notice) when it moved.
fn committed(experiment: &str, device: &str) -> Option<Results> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("results")
        .join(experiment)
        .join(device);
    if !tunelab::store::journal::exists(&dir) {
        eprintln!("{}: no journal, skipped", dir.display());
        return None;
    }
    Some(tunelab::store::journal::read(&dir).unwrap().0)
}

// ---------------------------------------------------------------- AMD devices

/// An MI300X as HIP discovery describes it.
fn mi300x() -> tunelab::device::DeviceInfo {
    let mut d = tunelab::device::profile("h100").unwrap();
    d.name = "AMD Instinct MI300X".into();
    d.vllm_name = "AMD_Instinct_MI300X".into();
    d.backend = "hip".into();
    d.arch = "gfx942".into();
    d.sm_count = 304;
    d.warp_size = 64;
    d.source = "test".into();
    d
}

fn on_mi300x(results: &mut Results) {
    results.header.as_mut().unwrap().device = mi300x();
}

// ---------------------------------------------------------------- aiter fused MoE

#[test]
fn aiter_rows_are_not_written_off_amd_gpus_and_a_note_says_why() {
    for results in [load("moe.jsonl"), {
        let mut r = load("moe.jsonl");
        r.header.as_mut().unwrap().device = tunelab::device::profile("cpu").unwrap();
        r.header.as_mut().unwrap().mode = tunelab::plan::Mode::Interpreter;
        r
    }] {
        let out = render(&results);
        assert!(
            !out.keys().any(|p| p.starts_with("aiter/")),
            "{:?}",
            out.keys()
        );
        // Everything else is still written.
        assert!(out.contains_key("report.md") && out.contains_key("best.csv"));
        let notes = emit::aiter::notes(&results);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with(
                "aiter_fmoe_csv `aiter/tuned_fmoe.csv` not written: aiter runs on AMD GPUs"
            ),
            "{}",
            notes[0]
        );
    }
}

#[test]
fn tunelab_triton_kernels_get_no_aiter_row_even_on_amd() {
    let mut results = load("moe.jsonl");
    on_mi300x(&mut results);
    let out = render(&results);
    assert!(!out.contains_key("aiter/tuned_fmoe.csv"));
    let notes = emit::aiter::notes(&results);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("not written: no row aiter could use")
            && notes[0].contains("24 shape(s) whose best config names no aiter kernel (`fused_moe` of method `triton`)"),
        "{}",
        notes[0]
    );
}

/// The moe fixture plus a method `aiter` that timed aiter's own two-stage
/// CK fused MoE with forced configs, at the triton method's times.
fn with_aiter_method(results: &mut Results) {
    let mut extra = Vec::new();
    for j in results.jobs.iter().filter(|j| j.method == "triton") {
        let mut a = j.clone();
        a.job_id = format!("a{}", j.job_id);
        a.method = "aiter".into();
        a.kind = tunelab::manifest::MethodKind::Python;
        a.kernel = "aiter_fused_moe".into();
        a.baseline = false;
        let bm = j.config["BLOCK_SIZE_M"].as_i64().unwrap().max(32);
        let bn = j.config["BLOCK_SIZE_N"].as_i64().unwrap();
        a.config = IndexMap::from([
            (
                "kernelName1".to_string(),
                Json::from(format!("moe_ck2stages_gemm1_256x{bm}x{bn}x64_1x4_B16")),
            ),
            (
                "kernelName2".to_string(),
                Json::from(format!("moe_ck2stages_gemm2_256x{bm}x{bn}x64_1x4_B16")),
            ),
            ("block_m".to_string(), Json::from(bm)),
            ("ksplit".to_string(), Json::from(0)),
        ]);
        extra.push(a);
    }
    // Triton configs that differ only in fields aiter's config lacks map to one
    // aiter config: keep the fastest of each, as one run would have recorded
    // it once (a second id for one config would be a superseded job).
    let time = |a: &tunelab::store::JobRecord| {
        let own = a.job_id.strip_prefix('a').unwrap();
        let final_us = results.finals.iter().find(|f| f.job_id == own);
        match (a.status, final_us, &a.stats) {
            (JobStatus::Ok, Some(f), _) => f.stats.median_us,
            (JobStatus::Ok, None, Some(s)) => s.median_us,
            _ => f64::INFINITY,
        }
    };
    let mut fastest: HashMap<String, usize> = HashMap::new();
    for (i, a) in extra.iter().enumerate() {
        let key = format!("{:?}{:?}", a.shape, a.config);
        let slot = fastest.entry(key).or_insert(i);
        if time(a) < time(&extra[*slot]) {
            *slot = i;
        }
    }
    let kept: std::collections::HashSet<usize> = fastest.into_values().collect();
    let extra: Vec<_> = extra
        .into_iter()
        .enumerate()
        .filter(|(i, _)| kept.contains(i))
        .map(|(_, a)| a)
        .collect();
    let finals: Vec<_> = results
        .finals
        .iter()
        .filter(|f| extra.iter().any(|a| a.job_id == format!("a{}", f.job_id)))
        .map(|f| {
            let mut f = f.clone();
            f.job_id = format!("a{}", f.job_id);
            f
        })
        .collect();
    results.jobs.extend(extra);
    results.finals.extend(finals);
    let header = results.header.as_mut().unwrap();
    for o in &mut header.outputs {
        if o.format.name() == "aiter_fmoe_csv" {
            o.method = Some("aiter".into());
        }
    }
}

/// What aiter's `fused_moe` finds for a tuned shape of the moe fixture on the MI300X.
fn aiter_query<'a>(shape: &IndexMap<String, Json>, m: i64) -> consumers::aiter_fmoe::Query<'a> {
    let int = |f: &str| shape[f].as_i64().unwrap();
    consumers::aiter_fmoe::Query {
        gfx: "gfx942",
        cu_num: 304,
        m,
        model_dim: int("K"),
        inter_dim: int("N"),
        expert: int("E"),
        topk: int("topk"),
        act_type: "ActivationType.Silu",
        dtype: "torch.bfloat16",
        q_dtype_a: "torch.bfloat16",
        q_dtype_w: "torch.bfloat16",
        q_type: "QuantType.No",
        use_g1u1: true,
        doweight_stage1: false,
    }
}

#[test]
fn aiter_finds_every_tuned_shape_with_the_kernels_it_was_tuned_with() {
    let mut results = load("moe.jsonl");
    on_mi300x(&mut results);
    with_aiter_method(&mut results);
    let out = render(&results);
    let csv = &out["aiter/tuned_fmoe.csv"];
    assert_eq!(csv.lines().next().unwrap(), tunelab::emit::aiter::HEADER);
    assert_eq!(csv.lines().count(), 1 + 24, "one row per shape");
    assert!(csv.ends_with('\n') && !csv.contains('\r'));
    let bests = emit::best_per_shape(&results);
    for b in bests.iter().filter(|b| b.method == "aiter") {
        let m = b.shape["M"].as_i64().unwrap();
        let row = consumers::aiter_fmoe::lookup(csv, &aiter_query(&b.shape, m))
            .unwrap_or_else(|| panic!("aiter finds no row for {:?}", b.shape));
        let cfg = |f: &str| match &b.config[f] {
            Json::String(s) => s.clone(),
            other => other.to_string(),
        };
        assert_eq!(row["token"], m.to_string());
        for (column, field) in [
            ("kernelName1", "kernelName1"),
            ("kernelName2", "kernelName2"),
            ("block_m", "block_m"),
            ("ksplit", "ksplit"),
        ] {
            assert_eq!(row[column], cfg(field), "{column} of {:?}", b.shape);
        }
        assert_eq!(row["run_1stage"], "0");
        let us: f64 = row["us"].parse().unwrap();
        assert!((us - b.time_us).abs() < 1e-4, "{us} vs {}", b.time_us);
    }
    // aiter rounds a batch of 3 tokens up to 4: the M=4 row.
    let b4 = best_of(
        &bests,
        "aiter",
        &[("E", 32.into()), ("N", 2880.into()), ("M", 4.into())],
    );
    let row = consumers::aiter_fmoe::lookup(csv, &aiter_query(&b4.shape, 3)).unwrap();
    assert_eq!(row["token"], "4");
    assert!(emit::aiter::notes(&results).is_empty());
    insta::assert_snapshot!("aiter_rows_mi300x", csv);
}

#[test]
fn tuned_m_that_aiter_never_looks_up_are_left_out_and_noted() {
    let mut results = load("moe.jsonl");
    on_mi300x(&mut results);
    with_aiter_method(&mut results);
    // Retag M=64 as M=48: a batch of 48 tokens is looked up as 64.
    for j in &mut results.jobs {
        if j.shape["M"] == 64 {
            j.shape.insert("M".into(), 48.into());
        }
    }
    let out = render(&results);
    let csv = &out["aiter/tuned_fmoe.csv"];
    assert_eq!(csv.lines().count(), 1 + 20);
    assert!(!csv
        .lines()
        .any(|l| l.starts_with("304,48,") || l.starts_with("304,64,")));
    let shape = &results
        .jobs
        .iter()
        .find(|j| j.method == "aiter")
        .unwrap()
        .shape;
    assert_eq!(
        consumers::aiter_fmoe::lookup(csv, &aiter_query(shape, 48)),
        None
    );
    let notes = emit::aiter::notes(&results);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("aiter_fmoe_csv `aiter/tuned_fmoe.csv`: 20 row(s) written; left out M=48 (looked up as 64)"),
        "{}",
        notes[0]
    );
}

#[test]
fn one_stage_configs_get_no_row_for_bf16() {
    let mut results = load("moe.jsonl");
    on_mi300x(&mut results);
    with_aiter_method(&mut results);
    for j in &mut results.jobs {
        if j.method == "aiter" && j.shape["M"] == 1 {
            j.config.shift_remove("kernelName2");
            j.config.insert(
                "kernelName1".into(),
                "_ZN5aiter30fmoe_g1u1_silu_32x64E".into(),
            );
        }
    }
    let out = render(&results);
    assert_eq!(out["aiter/tuned_fmoe.csv"].lines().count(), 1 + 20);
    let notes = emit::aiter::notes(&results);
    assert!(
        notes[0].contains("4 shape(s) whose best config is aiter's one-stage path (`_ZN5aiter30fmoe_g1u1_silu_32x64E`)"),
        "{notes:?}"
    );
}

#[test]
fn aiter_rows_need_a_bf16_or_fp16_shape_and_well_formed_kernel_fields() {
    let mut results = load("moe.jsonl");
    on_mi300x(&mut results);
    with_aiter_method(&mut results);
    for j in &mut results.jobs {
        if j.shape["N"] == 1440 {
            j.shape.insert("dtype".into(), "fp8".into());
        }
    }
    // fp8 shapes have no vLLM file under the plain template either; keep only aiter's output.
    results
        .header
        .as_mut()
        .unwrap()
        .outputs
        .retain(|o| o.format.name() == "aiter_fmoe_csv");
    let out = render(&results);
    assert_eq!(out["aiter/tuned_fmoe.csv"].lines().count(), 1 + 12);
    let notes = emit::aiter::notes(&results);
    assert!(notes[0].contains("12 shape(s) of dtype fp8"), "{notes:?}");

    let mut results = load("moe.jsonl");
    on_mi300x(&mut results);
    with_aiter_method(&mut results);
    for j in &mut results.jobs {
        if j.method == "aiter" {
            j.config.shift_remove("block_m");
        }
    }
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("aiter_fmoe_csv") && err.contains("no `block_m`"),
        "{err}"
    );
}

// ---------------------------------------------------------------- Triton M buckets (aiter GEMM)

/// The gemm fixture on an MI300X, with the manifests' aiter templates.
fn gemm_on_mi300x() -> Results {
    let mut results = load("gemm.jsonl");
    on_mi300x(&mut results);
    for o in &mut results.header.as_mut().unwrap().outputs {
        if o.format.name() == "triton_mbucket" {
            o.path = if o.legacy_keys {
                "triton-legacy/MI300X-GEMM-A16W16-N={{N}}-K={{K}}.json".into()
            } else {
                "triton/{{device.arch}}-GEMM-A16W16-N={{N}}-K={{K}}.json".into()
            };
        }
    }
    results
}

/// Every tuned shape, looked up as aiter's `get_gemm_config` looks it up,
/// finds the config of the largest tuned M of its bucket: its own when it
/// is the largest (every power of two is). Returns how many found their own.
fn assert_aiter_gemm_finds_every_tuned_shape(
    results: &Results,
    out: &IndexMap<String, String>,
) -> usize {
    let files = basenames(out, "triton/");
    let bests: Vec<emit::Best> = emit::best_per_shape(results)
        .into_iter()
        .filter(|b| b.method == "triton")
        .collect();
    let bucket = |m: i64| consumers::aiter_gemm::BOUNDS.iter().position(|b| m <= *b);
    let mut own = 0;
    for b in &bests {
        let int = |s: &IndexMap<String, Json>, f: &str| s[f].as_i64().unwrap();
        let (m, n, k) = (int(&b.shape, "M"), int(&b.shape, "N"), int(&b.shape, "K"));
        let got = consumers::aiter_gemm::lookup(&files, "gfx942", "GEMM-A16W16", m, n, k)
            .unwrap_or_else(|| panic!("aiter opens no file for {:?}", b.shape));
        let edge = bests
            .iter()
            .filter(|o| int(&o.shape, "N") == n && int(&o.shape, "K") == k)
            .filter(|o| bucket(int(&o.shape, "M")) == bucket(m))
            .max_by_key(|o| int(&o.shape, "M"))
            .unwrap();
        assert_eq!(
            got,
            serde_json::to_value(&edge.config).unwrap(),
            "{:?}",
            b.shape
        );
        if edge.job_id == b.job_id || edge.config == b.config {
            own += 1;
        }
    }
    own
}

#[test]
fn triton_mbucket_files_are_named_and_keyed_as_aiter_loads_them() {
    let results = gemm_on_mi300x();
    let out = render(&results);
    let keys = |path: &str| -> Vec<String> {
        let doc: serde_json::Map<String, Json> = serde_json::from_str(&out[path]).unwrap();
        doc.keys().cloned().collect()
    };
    assert_eq!(
        keys("triton/gfx942-GEMM-A16W16-N=4096-K=4096.json"),
        [
            "M_LEQ_16",
            "M_LEQ_64",
            "M_LEQ_512",
            "M_LEQ_4096",
            "M_GEQ_8192",
            "any"
        ]
    );
    assert_eq!(
        keys("triton/gfx942-GEMM-A16W16-N=1024-K=1024.json"),
        ["M_LEQ_32", "M_LEQ_128", "any"]
    );
    let legacy = [
        "small",
        "medium_M32",
        "medium_M64",
        "medium_M128",
        "large",
        "xlarge",
        "any",
    ];
    assert_eq!(
        keys("triton-legacy/MI300X-GEMM-A16W16-N=4096-K=4096.json"),
        legacy
    );
    assert_eq!(
        keys("triton-legacy/MI300X-GEMM-A16W16-N=1024-K=1024.json"),
        legacy
    );
    // Every tuned M (all powers of two or beyond 8192 here) finds its own config.
    assert_eq!(assert_aiter_gemm_finds_every_tuned_shape(&results, &out), 7);

    // Values: the best config of the M each bucket holds, all fields, integers as integers.
    let bests = emit::best_per_shape(&results);
    let doc: serde_json::Map<String, Json> =
        serde_json::from_str(&out["triton/gfx942-GEMM-A16W16-N=4096-K=4096.json"]).unwrap();
    let cfg = |m: i64| -> Json {
        serde_json::to_value(
            &best_of(&bests, "triton", &[("N", 4096.into()), ("M", m.into())]).config,
        )
        .unwrap()
    };
    assert_eq!(doc["M_LEQ_512"], cfg(512));
    assert_eq!(doc["M_GEQ_8192"], cfg(12288));
    assert_eq!(doc["any"], cfg(12288));
    assert!(doc["M_LEQ_16"]["BLOCK_SIZE_M"].is_u64());
    let legacy: serde_json::Map<String, Json> =
        serde_json::from_str(&out["triton-legacy/MI300X-GEMM-A16W16-N=4096-K=4096.json"]).unwrap();
    assert_eq!(legacy["small"], cfg(16));
    assert_eq!(legacy["medium_M64"], cfg(64));
    assert_eq!(legacy["xlarge"], cfg(12288));

    assert_eq!(triton_mbucket::current_key(8193), "M_GEQ_8192");
    assert_eq!(triton_mbucket::legacy_key(96), "medium_M128");
}

#[test]
fn a_tuned_m_below_its_buckets_edge_is_served_the_edges_config() {
    let mut results = gemm_on_mi300x();
    // Add M=24 at N=K=1024 (aiter's M_LEQ_32 bucket, with M=32), its configs
    // those of M=128 so that they differ from M=32's.
    let extra: Vec<_> = results
        .jobs
        .iter()
        .filter(|j| j.shape["N"] == 1024 && j.shape["M"] == 128)
        .map(|j| {
            let mut j = j.clone();
            j.job_id = format!("m24{}", j.job_id);
            j.shape.insert("M".into(), 24.into());
            j
        })
        .collect();
    results.jobs.extend(extra);
    let out = render(&results);
    assert_eq!(assert_aiter_gemm_finds_every_tuned_shape(&results, &out), 7);
    let bests = emit::best_per_shape(&results);
    let m24 = best_of(&bests, "triton", &[("N", 1024.into()), ("M", 24.into())]);
    let m32 = best_of(&bests, "triton", &[("N", 1024.into()), ("M", 32.into())]);
    assert_ne!(m24.config, m32.config);
    let files = basenames(&out, "triton/");
    assert_eq!(
        consumers::aiter_gemm::lookup(&files, "gfx942", "GEMM-A16W16", 24, 1024, 1024),
        Some(serde_json::to_value(&m32.config).unwrap())
    );
}

/// Off AMD GPUs the M-bucket files are written where the manifest says, for
/// the user's own Triton code: aiter's naming and field rules do not apply.
#[test]
fn triton_mbucket_files_off_amd_gpus_are_written_as_the_path_says() {
    let results = load("gemm.jsonl");
    let out = render(&results);
    let triton: Vec<&String> = out.keys().filter(|p| p.starts_with("triton")).collect();
    assert_eq!(
        triton.len(),
        4,
        "both key schemes, two (N, K) each: {triton:?}"
    );
    assert!(
        emit::aiter::notes(&results).is_empty(),
        "no note: nothing was left out"
    );
}

#[test]
fn a_triton_path_aiter_never_opens_is_an_error() {
    // The old manifests' tag: aiter opens GEMM-A16W16 files only.
    let mut results = gemm_on_mi300x();
    results.header.as_mut().unwrap().outputs[3].path =
        "triton/{{device.arch}}-GEMM-quickstart-N={{N}}-K={{K}}.json".into();
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("aiter opens `gfx942-GEMM-A16W16-N=1024-K=1024.json`")
            && err.contains("never `gfx942-GEMM-quickstart-N=1024-K=1024.json`"),
        "{err}"
    );
    // A suffixed arch is not the one aiter names files by.
    let mut results = gemm_on_mi300x();
    results.header.as_mut().unwrap().device.arch = "gfx942:sramecc+:xnack-".into();
    results.header.as_mut().unwrap().outputs[3].path =
        "triton/gfx942:sramecc+:xnack--GEMM-A16W16-N={{N}}-K={{K}}.json".into();
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("aiter opens `gfx942-GEMM-A16W16-N=1024-K=1024.json`"),
        "{err}"
    );
    // fp32 GEMMs have no aiter family.
    let mut results = gemm_on_mi300x();
    for j in &mut results.jobs {
        j.shape.insert("dtype".into(), "fp32".into());
    }
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("dtype `fp32` has no aiter GEMM config family"),
        "{err}"
    );
    // A config field aiter's kernel does not take would fail there.
    let mut results = gemm_on_mi300x();
    for j in &mut results.jobs {
        if j.method == "triton" {
            j.config.insert("SPLIT_K".into(), 1.into());
        }
    }
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("has `SPLIT_K`, which aiter's GEMM kernel does not take"),
        "{err}"
    );
}

/// The gemm fixture as an fp8 block-scale GEMM (dtype fp8, 128 x 128 scale
/// blocks) tuned on an MI300X, written where aiter's gemm_a8w8_blockscale looks.
fn a8w8_on_mi300x() -> Results {
    let mut results = gemm_on_mi300x();
    for o in &mut results.header.as_mut().unwrap().outputs {
        o.path = o.path.replace("A16W16", "A8W8_BLOCKSCALE");
    }
    for j in &mut results.jobs {
        j.shape.insert("dtype".into(), "fp8".into());
        j.shape
            .insert("block_shape".into(), serde_json::json!([128, 128]));
        if j.method == "triton" {
            j.config.insert("BLOCK_SIZE_K".into(), 128.into());
            j.config.insert("NUM_KSPLIT".into(), 1.into());
        }
    }
    results
}

#[test]
fn fp8_block_scale_gemms_go_to_aiters_a8w8_blockscale_files() {
    let results = a8w8_on_mi300x();
    let out = render(&results);
    let files = basenames(&out, "triton/");
    assert!(
        files.contains_key("gfx942-GEMM-A8W8_BLOCKSCALE-N=4096-K=4096.json"),
        "{:?}",
        files.keys()
    );
    let got =
        consumers::aiter_gemm::lookup(&files, "gfx942", "GEMM-A8W8_BLOCKSCALE", 4096, 4096, 4096)
            .expect("aiter finds the tuned file");
    assert_eq!(got["NUM_KSPLIT"], 1);
    assert_eq!(got["BLOCK_SIZE_K"], 128);

    // The A16W16 name is not the file aiter opens for fp8 GEMMs.
    let mut results = a8w8_on_mi300x();
    results.header.as_mut().unwrap().outputs[3].path =
        "triton/{{device.arch}}-GEMM-A16W16-N={{N}}-K={{K}}.json".into();
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("aiter opens `gfx942-GEMM-A8W8_BLOCKSCALE-N=1024-K=1024.json`")
            && err.contains("GEMM-A8W8_BLOCKSCALE-N={{N}}-K={{K}}.json`"),
        "{err}"
    );
    // gemm_a8w8_blockscale reads NUM_KSPLIT from every config...
    let mut results = a8w8_on_mi300x();
    for j in &mut results.jobs {
        j.config.shift_remove("NUM_KSPLIT");
    }
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(err.contains("has no `NUM_KSPLIT`"), "{err}");
    // ... and asserts that BLOCK_SIZE_K is the scale block's K.
    let mut results = a8w8_on_mi300x();
    for j in &mut results.jobs {
        if j.method == "triton" {
            j.config.insert("BLOCK_SIZE_K".into(), 64.into());
        }
    }
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("has BLOCK_SIZE_K 64") && err.contains("equals the scale block's K (128)"),
        "{err}"
    );
}

/// The committed gpt-oss attention runs, as if on an MI300X: every tuned M
/// (24, 48, 96, 1536, 3072 included) is served the config of its bucket's edge.
#[test]
fn committed_gptoss_attention_configs_as_aiter_finds_them() {
    for device in ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"] {
        let Some(mut results) = committed("gptoss-attention", device) else {
            continue;
        };
        on_mi300x(&mut results);
        for o in &mut results.header.as_mut().unwrap().outputs {
            if o.format.name() == "triton_mbucket" {
                o.path = "triton/{{device.arch}}-GEMM-A16W16-N={{N}}-K={{K}}.json".into();
            }
        }
        let out = render(&results);
        assert_eq!(
            basenames(&out, "triton/").len(),
            2,
            "{device}: one file per projection"
        );
        // 36 shapes; the 24 whose M is the largest of its bucket find their
        // own config, the 12 others (M = 2, 24, 48, 96, 1536, 3072) their
        // bucket edge's, which may be the same.
        let own = assert_aiter_gemm_finds_every_tuned_shape(&results, &out);
        assert!((24..=36).contains(&own), "{device}: {own}");
    }
}

// ---------------------------------------------------------------- selection

#[test]
fn failed_and_pruned_jobs_are_never_chosen() {
    for name in ["gemm.jsonl", "moe.jsonl"] {
        let results = load(name);
        let bests = emit::best_per_shape(&results);
        let status: HashMap<&str, JobStatus> = results
            .jobs
            .iter()
            .map(|j| (j.job_id.as_str(), j.status))
            .collect();
        for b in &bests {
            assert_eq!(
                status[b.job_id.as_str()],
                JobStatus::Ok,
                "{name}: {} chosen",
                b.job_id
            );
            if let Some(id) = &b.baseline_job_id {
                assert_eq!(status[id.as_str()], JobStatus::Ok);
            }
        }
    }
    // The traps at M=512 are faster than every ok job there.
    let results = load("gemm.jsonl");
    let shape512 = |j: &&tunelab::store::JobRecord| j.shape["M"] == 512 && j.method == "triton";
    let fastest_ok = results
        .jobs
        .iter()
        .filter(shape512)
        .filter(|j| j.status == JobStatus::Ok)
        .map(|j| j.stats.as_ref().unwrap().median_us)
        .fold(f64::INFINITY, f64::min);
    let traps: Vec<_> = results
        .jobs
        .iter()
        .filter(shape512)
        .filter(|j| j.status != JobStatus::Ok && j.stats.is_some())
        .collect();
    assert_eq!(
        traps.len(),
        2,
        "a failed mismatch job and a pruned job carry statistics"
    );
    assert!(traps
        .iter()
        .all(|j| j.stats.as_ref().unwrap().median_us < fastest_ok));
    let bests = emit::best_per_shape(&results);
    let best = best_of(&bests, "triton", &[("M", 512.into())]);
    assert_eq!(best.time_us, fastest_ok);
    let out = render(&results);
    for t in traps {
        assert!(!out["best.csv"].contains(&t.job_id));
    }
}

#[test]
fn finalist_statistics_override_the_jobs_own() {
    let results = load("gemm.jsonl");
    let bests = emit::best_per_shape(&results);
    let best = best_of(&bests, "triton", &[("M", 4096.into()), ("N", 4096.into())]);
    assert!(best.finalist);
    let job = results
        .jobs
        .iter()
        .find(|j| j.job_id == best.job_id)
        .unwrap();
    let fin = results
        .finals
        .iter()
        .find(|f| f.job_id == best.job_id)
        .unwrap();
    assert_eq!(best.time_us, fin.stats.median_us);
    // On its own samples another job was faster; the interleaved re-timing decides.
    let own_fastest = results
        .jobs
        .iter()
        .filter(|j| j.method == "triton" && j.shape == job.shape && j.status == JobStatus::Ok)
        .min_by(|a, b| {
            a.stats
                .as_ref()
                .unwrap()
                .median_us
                .total_cmp(&b.stats.as_ref().unwrap().median_us)
        })
        .unwrap();
    assert_ne!(own_fastest.job_id, best.job_id);
    // Throughput follows the chosen time.
    let flops = job.flops.unwrap();
    assert!((best.tflops.unwrap() - flops / best.time_us / 1e6).abs() < 1e-9);
    assert_eq!(emit::job_time(job, Some(fin)), Some(fin.stats.median_us));
    assert_eq!(
        emit::job_time(job, None),
        Some(job.stats.as_ref().unwrap().median_us)
    );

    let moe = load("moe.jsonl");
    let moe_bests = emit::best_per_shape(&moe);
    let b = best_of(
        &moe_bests,
        "triton",
        &[("E", 32.into()), ("N", 2880.into()), ("M", 64.into())],
    );
    assert!(b.finalist);
    assert_eq!(b.config["GROUP_SIZE_M"], 64);
}

#[test]
fn baselines_and_speedups() {
    let results = load("moe.jsonl");
    let bests = emit::best_per_shape(&results);
    let b = best_of(
        &bests,
        "triton",
        &[("E", 32.into()), ("N", 1440.into()), ("M", 256.into())],
    );
    let speedup = b.baseline_us.unwrap() / b.time_us;
    assert!((b.speedup.unwrap() - speedup).abs() < 1e-12);
    assert!(speedup > 1.0);
    // A failed baseline leaves no baseline and no speedup, and the report shows dashes.
    let failed = best_of(
        &bests,
        "triton",
        &[("E", 128.into()), ("N", 1440.into()), ("M", 1024.into())],
    );
    assert_eq!((failed.baseline_us, failed.speedup), (None, None));
    // torch has no baseline anywhere.
    assert!(bests
        .iter()
        .filter(|b| b.method == "torch")
        .all(|b| b.baseline_us.is_none()));
}

#[test]
fn latest_record_per_job_wins() {
    let results = load("gemm.jsonl");
    let out = render(&results);
    let jobs: Vec<Json> = serde_json::from_str(&out["jobs.json"]).unwrap();
    assert_eq!(jobs.len(), results.jobs.len());
    let mut rdr = csv::Reader::from_reader(out["jobs.csv"].as_bytes());
    let headers = rdr.headers().unwrap().clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name}"))
    };
    let rows: Vec<csv::StringRecord> = rdr.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), results.jobs.len());
    let timeouts = rows
        .iter()
        .filter(|r| &r[col("failure_class")] == "timeout")
        .count();
    assert_eq!(
        timeouts, 0,
        "the resumed job's ok record replaces its timeout"
    );
    let finals = rows
        .iter()
        .filter(|r| !r[col("final_median_us")].is_empty())
        .count();
    assert_eq!(finals, 3);
}

#[test]
fn a_job_recorded_again_under_a_new_id_supersedes_the_old_one() {
    // A kernel's source edited between two runs: the same method, shape and
    // config get a new job id (it hashes the method's definition), and only
    // the later record may rank. The first is made the fastest job anywhere,
    // so any output that still read it would show it.
    let mut results = load("gemm.jsonl");
    let old = results
        .jobs
        .iter()
        .position(|j| j.method == "triton" && j.status == JobStatus::Ok && !j.baseline)
        .unwrap();
    results.jobs[old].stats.as_mut().unwrap().median_us = 1e-3;
    let mut again = results.jobs[old].clone();
    again.job_id = "feedfacefeedface".into();
    again.stats.as_mut().unwrap().median_us = 1e6;
    results.jobs.push(again);
    let old_id = results.jobs[old].job_id.clone();

    let out = render(&results);
    assert!(!out["best.csv"].contains(&old_id));
    assert!(!out["jobs.csv"].contains(&old_id));
    assert!(out["jobs.csv"].contains("feedfacefeedface"));
    assert!(emit::best_per_shape(&results)
        .iter()
        .all(|b| b.job_id != old_id));
    let report = &out["report.md"];
    assert!(
        report.contains("**1 job was superseded** (`triton`)"),
        "the report says what it left out:\n{report}"
    );
    // A space that gained a parameter: every job of that method and shape
    // recorded before, with configs of the old parameters, is superseded.
    let mut widened = results.jobs[old].clone();
    widened.job_id = "abcdefabcdefabcd".into();
    widened.config.insert("NEW_PARAM".into(), 1.into());
    widened.finished_at = "2099-01-01T00:00:00Z".into(); // after every fixture job
    let shape = widened.shape.clone();
    results.jobs.push(widened);
    let out = render(&results);
    let before = |id: &str| {
        results
            .jobs
            .iter()
            .any(|j| j.job_id == id && j.method == "triton" && !j.baseline && j.shape == shape)
    };
    let listed: Vec<&str> = out["jobs.csv"]
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap())
        .filter(|id| before(id))
        .collect();
    assert_eq!(
        listed,
        ["abcdefabcdefabcd"],
        "only the widened config is current"
    );
    results.jobs.pop();

    // "Later" is by finish time, not place in the journal (a merged journal
    // holds its inputs one after the other): a record placed last but
    // finished earlier is the superseded one.
    let mut earlier = results.jobs[old].clone();
    earlier.job_id = "0000000000000001".into();
    earlier.finished_at = "2000-01-01T00:00:00Z".into();
    results.jobs.push(earlier);
    let out = render(&results);
    assert!(!out["jobs.csv"].contains("0000000000000001"));
    assert!(out["jobs.csv"].contains("feedfacefeedface"));
    assert!(out["report.md"].contains("**2 jobs were superseded** (`triton`)"));
    results.jobs.pop();

    // The same config as a baseline is another job, never superseded by it.
    let baseline = results.jobs.iter().find(|j| j.baseline).unwrap().clone();
    let mut as_searched = baseline.clone();
    as_searched.job_id = "0123456789abcdef".into();
    as_searched.baseline = false;
    results.jobs.push(as_searched);
    let out = render(&results);
    assert!(out["jobs.csv"].contains(&baseline.job_id));
    assert!(out["jobs.csv"].contains("0123456789abcdef"));
}

// ---------------------------------------------------------------- CSV and JSON layouts

#[test]
fn csv_columns_are_documented_names() {
    let out = render(&load("gemm.jsonl"));
    let header = out["jobs.csv"].lines().next().unwrap();
    assert_eq!(
        header,
        "job_id,method,kind,kernel,M,N,K,dtype,cfg.GROUP_SIZE_M,cfg.BLOCK_SIZE_M,cfg.BLOCK_SIZE_N,cfg.BLOCK_SIZE_K,cfg.num_warps,cfg.num_stages,\
baseline,status,failure_class,failure_message,passed,max_abs_err,max_rel_err,mismatch_frac,nan_count,n,median_us,ci_low_us,ci_high_us,min_us,q1_us,q3_us,mean_us,cv,\
flags,timer,sm_clock_mhz,tflops,gbs,roofline_pct,compile_s,n_regs,n_spills,shared_bytes,kernels,final_median_us,final_ci_low_us,final_ci_high_us,tied_with_best,time_us,flops,bytes,gpu_ms,wall_ms,duration_s,lane,finished_at"
    );
    assert_eq!(
        out["best.csv"].lines().next().unwrap(),
        "M,N,K,dtype,method,kind,job_id,config,median_us,ci_low_us,ci_high_us,n,finalist,tflops,gbs,roofline_pct,baseline_job_id,baseline_us,speedup_vs_baseline,flags"
    );
    // 7 shapes x 2 methods.
    assert_eq!(out["best.csv"].lines().count(), 1 + 14);
    let json = &out["jobs.json"];
    assert!(json.starts_with("[\n  {\n    \"job_id\""));
    assert!(json.ends_with("}\n]\n"));
}

// ---------------------------------------------------------------- files on disk

#[test]
fn write_outputs_writes_every_file_and_is_deterministic() {
    let results = load("moe.jsonl");
    let dir = tempfile::tempdir().unwrap();
    let written = emit::write_outputs(&results, dir.path()).unwrap();
    // Four vLLM files, best.csv, the report with its details file and three
    // charts for each of its four (E, N); no aiter table off an AMD GPU.
    assert_eq!(written.len(), 4 + 1 + 2 + 4 * 3);
    for p in &written {
        assert!(p.starts_with(dir.path()) && p.is_file(), "{}", p.display());
    }
    let first: Vec<Vec<u8>> = written.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let again = emit::write_outputs(&results, dir.path()).unwrap();
    assert_eq!(again, written);
    let second: Vec<Vec<u8>> = again.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert_eq!(first, second);
    assert!(!dir.path().join("report.md.tmp").exists());
    assert!(dir.path().join("report/E=128,N=2880-latency.svg").is_file());
}

#[test]
fn a_run_with_no_jobs_still_gets_a_report_and_no_empty_config_files() {
    let mut results = load("moe.jsonl");
    results.jobs.clear();
    results.finals.clear();
    let out = render(&results);
    let names: Vec<&str> = out.keys().map(String::as_str).collect();
    // Paths that need shape fields have no shape to be rendered for; an
    // aiter table with no row is not written.
    assert_eq!(names, ["best.csv", "report.md", "report-details.md"]);
    assert!(out["report.md"].contains("No jobs recorded."));
}

#[test]
fn no_header_is_an_error() {
    let results = Results::default();
    assert!(matches!(
        emit::render_outputs(&results),
        Err(emit::EmitError::NoHeader)
    ));
}

// ---------------------------------------------------------------- report

#[test]
fn report_gemm() {
    let out = render(&load("gemm.jsonl"));
    insta::assert_snapshot!("report_gemm", out["report.md"]);
}

#[test]
fn report_moe() {
    let out = render(&load("moe.jsonl"));
    insta::assert_snapshot!("report_moe", out["report.md"]);
}

#[test]
fn report_moe_details() {
    let out = render(&load("moe.jsonl"));
    insta::assert_snapshot!("report_moe_details", out["report-details.md"]);
}

/// The SVG files of rendered outputs.
fn svgs(out: &IndexMap<String, String>) -> Vec<(&String, &String)> {
    out.iter().filter(|(p, _)| p.ends_with(".svg")).collect()
}

/// A small XML well-formedness check: one root element, every tag closed in
/// order, attributes quoted, only the predefined entities or character
/// references. Returns the element names in document order.
fn parse_xml(text: &str) -> Result<Vec<String>, String> {
    let mut stack: Vec<String> = Vec::new();
    let mut names = Vec::new();
    let mut roots = 0;
    let mut rest = text.trim_start();
    let check_text = |t: &str| -> Result<(), String> {
        let mut parts = t.split('&');
        parts.next();
        for p in parts {
            let entity = p.split(';').next().unwrap_or("");
            let ok = matches!(entity, "amp" | "lt" | "gt" | "quot" | "apos")
                || (entity.starts_with('#') && entity[1..].chars().all(|c| c.is_ascii_digit()));
            if !ok || !p.contains(';') {
                return Err(format!("bad entity near `&{}`", &p[..p.len().min(12)]));
            }
        }
        if t.contains('>') {
            return Err("a bare `>` in text".into());
        }
        Ok(())
    };
    while !rest.is_empty() {
        let Some(open) = rest.find('<') else {
            check_text(rest)?;
            if !rest.trim().is_empty() {
                return Err("text after the root element".into());
            }
            break;
        };
        let text_part = &rest[..open];
        check_text(text_part)?;
        if stack.is_empty() && !text_part.trim().is_empty() {
            return Err("text outside the root element".into());
        }
        rest = &rest[open..];
        let close = rest.find('>').ok_or("an unclosed tag")?;
        let tag = &rest[1..close];
        rest = &rest[close + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let top = stack.pop().ok_or("a closing tag without an opening one")?;
            if top != name.trim() {
                return Err(format!("`</{name}>` closes `<{top}>`"));
            }
            continue;
        }
        let self_closing = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let name: String = body.chars().take_while(|c| !c.is_whitespace()).collect();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':')
        {
            return Err(format!("bad element name in `<{tag}>`"));
        }
        // Attributes: name="value" pairs, values without `<` or a raw `&`.
        let mut attrs = body[name.len()..].trim();
        while !attrs.is_empty() {
            let eq = attrs
                .find('=')
                .ok_or(format!("attribute without a value in `<{tag}>`"))?;
            let key = attrs[..eq].trim();
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(format!("bad attribute `{key}` in `<{tag}>`"));
            }
            let after = &attrs[eq + 1..];
            let quote = after.chars().next().ok_or("attribute value missing")?;
            if quote != '"' && quote != '\'' {
                return Err(format!("unquoted attribute `{key}`"));
            }
            let end = after[1..]
                .find(quote)
                .ok_or("unterminated attribute value")?;
            let value = &after[1..1 + end];
            if value.contains('<') {
                return Err(format!("`<` in attribute `{key}`"));
            }
            check_text(&value.replace('>', ""))?;
            attrs = after[end + 2..].trim_start();
        }
        if stack.is_empty() {
            roots += 1;
        }
        names.push(name.clone());
        if !self_closing {
            stack.push(name);
        }
    }
    if !stack.is_empty() {
        return Err(format!("unclosed elements: {stack:?}"));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(names)
}

#[test]
fn the_xml_check_catches_what_it_should() {
    assert!(parse_xml(r#"<svg a="1"><g><text>x &amp; y</text></g><line/></svg>"#).is_ok());
    for bad in [
        "<svg><g></svg>",
        "<svg a=1></svg>",
        "<svg>x & y</svg>",
        "<svg></svg><svg></svg>",
        "<svg><text>a</g></svg>",
    ] {
        assert!(parse_xml(bad).is_err(), "{bad}");
    }
}

#[test]
fn charts_are_well_formed_svg_linked_from_the_report() {
    for name in ["moe.jsonl", "gemm.jsonl"] {
        let out = render(&load(name));
        let charts = svgs(&out);
        assert!(!charts.is_empty(), "{name}: charts written");
        for (path, svg) in &charts {
            assert!(path.starts_with("report/"), "{path}");
            let names = parse_xml(svg).unwrap_or_else(|e| panic!("{name}: {path}: {e}"));
            assert_eq!(names[0], "svg", "{path}");
            assert!(svg.contains("xmlns=\"http://www.w3.org/2000/svg\""));
            assert!(names.iter().any(|n| n == "polyline"), "{path}: a line");
            assert!(
                names.iter().filter(|n| *n == "text").count() > 5,
                "{path}: labels"
            );
            // Linked from the report, by the path relative to it.
            assert!(
                out["report.md"].contains(&format!("]({path})")),
                "{name}: {path} is not linked"
            );
        }
        // Every chart the report links is written.
        for link in out["report.md"].split("](").skip(1) {
            let target = link.split(')').next().unwrap();
            if target.ends_with(".svg") {
                assert!(
                    out.contains_key(target),
                    "{name}: {target} linked, not written"
                );
            }
        }
    }
    // One set per (E, N), each with latency, speedup and % of bound.
    let out = render(&load("moe.jsonl"));
    let mut files: Vec<&str> = svgs(&out).iter().map(|(p, _)| p.as_str()).collect();
    files.sort();
    assert_eq!(files.len(), 12);
    assert!(files.contains(&"report/E=128,N=2880-latency.svg"));
    assert!(files.contains(&"report/E=32,N=1440-speedup.svg"));
    assert!(files.contains(&"report/E=32,N=1440-bound.svg"));
    // Deterministic.
    assert_eq!(render(&load("moe.jsonl")), out);
}

#[test]
fn the_report_names_what_was_timed() {
    let mut results = load("moe.jsonl");
    let report = render(&results)["report.md"].clone();
    // A journal without method records: the rule is inferred from the configs.
    assert!(report.contains("`vllm_moe_default` (inferred)"), "{report}");
    assert!(report.contains("the same from vLLM v0.17.0 to v0.33.0"));
    assert!(report.contains("not recorded (older journal)"));
    let header = results.header.as_mut().unwrap();
    header.methods = vec![
        tunelab::store::MethodRecord {
            name: "triton".into(),
            kind: tunelab::manifest::MethodKind::Triton,
            kernel: "fused_moe_vllm".into(),
            description: Some("vLLM's call: alignment, GEMM 1, activation, GEMM 2, sum".into()),
            baseline: Some("vllm_moe_default".into()),
            search: None,
        },
        tunelab::store::MethodRecord {
            name: "torch".into(),
            kind: tunelab::manifest::MethodKind::Torch,
            kernel: "torch".into(),
            description: Some("torch's grouped GEMM".into()),
            baseline: None,
            search: None,
        },
    ];
    let report = render(&results)["report.md"].clone();
    // A short name in the table, the whole description once below it.
    assert!(report.contains(
        "| **triton** (tuned files) | `fused_moe_vllm` (triton) | vLLM's call | `vllm_moe_default` | halving (eta 3) | 71 ok, 2 failed, 24 pruned |"
    ), "{report}");
    assert!(report.contains("| torch | `torch` (torch) | torch's grouped GEMM | — |"));
    assert!(
        report.contains(
            "- **What the kernels are**: `fused_moe_vllm`: vLLM's call: alignment, GEMM 1, activation, GEMM 2, sum. `torch`: torch's grouped GEMM."
        ),
        "{report}"
    );
    assert!(!report.contains("(inferred)"));
    assert!(report.contains("**Timing**: cold: one launch per sample"));
    assert!(report.contains("**Device**: NVIDIA H200 (sm_90, 132 SMs"));
}

#[test]
fn interpreter_mode_report_carries_the_warning() {
    let mut results = load("gemm.jsonl");
    let gpu = render(&results)["report.md"].clone();
    assert!(!gpu.contains("[!WARNING]"));
    results.header.as_mut().unwrap().mode = tunelab::plan::Mode::Interpreter;
    let report = render(&results)["report.md"].clone();
    assert!(report.contains("> [!WARNING]"));
    assert!(report.contains("timings are interpreted wall-clock, not GPU timings; tuned files are for format checks only"));
}

/// The moe fixture as an interpreter run would record it: CPU device, wall
/// timers, GPU-only flags the interpreter sets anyway, a run of 0.4 s.
fn moe_in_the_interpreter() -> Results {
    use tunelab::measure::{Flag, Timer};
    let mut results = load("moe.jsonl");
    let header = results.header.as_mut().unwrap();
    header.mode = tunelab::plan::Mode::Interpreter;
    header.device = tunelab::device::profile("cpu").unwrap();
    let start = header.started_at.clone();
    for r in &mut results.runs {
        r.mode = tunelab::plan::Mode::Interpreter;
    }
    for j in &mut results.jobs {
        j.finished_at = start.clone();
        j.duration_s = 0.003;
        j.lane = 0;
        if let Some(s) = &mut j.stats {
            s.timer = Timer::Wall;
            s.flags = vec![
                Flag::CapHit,
                Flag::Throttled,
                Flag::TimerLimited,
                Flag::Noisy,
            ];
        }
    }
    for f in &mut results.finals {
        f.stats.timer = Timer::Wall;
        f.stats.flags = vec![Flag::CapHit, Flag::Noisy];
    }
    results
}

#[test]
fn interpreter_reports_leave_out_gpu_only_figures_and_flags() {
    let out = render(&moe_in_the_interpreter());
    let report = &out["report.md"];
    let details = &out["report-details.md"];
    assert!(report.contains("> [!WARNING]"));
    for text in [report, details] {
        for gpu_only in [
            "% of bound",
            "TFLOP/s",
            "GB/s",
            "CAP_HIT",
            "THROTTLED",
            "TIMER_LIMITED",
        ] {
            assert!(!text.contains(gpu_only), "{gpu_only} in\n{text}");
        }
        // A noise flag that means something in the interpreter stays.
        assert!(text.contains("NOISY"));
    }
    assert!(report.contains("**Triton interpreter on the CPU**"));
    // 121 jobs of 3 ms on one lane, recorded within the run's first second.
    assert!(report.contains("in 1 run (0.4 s)"), "{report}");
    assert!(!report.contains("| 0 s |") && !report.contains("(0 s)"));
    assert!(report.contains("| 0.4 s |"));
    // Latency and speedup charts, no % of bound.
    assert!(svgs(&out).iter().all(|(p, _)| !p.ends_with("-bound.svg")));
    assert!(out.contains_key("report/E=32,N=1440-latency.svg"));
    // Tuned files are still written, for format checks, under the cpu device name.
    assert!(out.contains_key("vllm/E=32,N=2880,device_name=cpu.json"));
}

#[test]
fn the_summary_compares_the_shipped_file_the_run_timed() {
    use tunelab::manifest::{Compared, OutputFormat};
    let mut results = load("moe.jsonl");
    results.header.as_mut().unwrap().compared.push(Compared {
        method: "shipped".into(),
        file: "/somewhere/vllm/E=32,N=2880,device_name=NVIDIA_H200.json".into(),
        format: OutputFormat::VllmMoeJson,
        against: "triton".into(),
    });
    // The shipped configs, timed as their own method at E=32 N=2880: 25 %
    // slower than tunelab's best, except at M=64 where they are 10 % faster.
    let shipped: Vec<tunelab::store::JobRecord> = results
        .jobs
        .iter()
        .filter(|j| {
            j.method == "triton" && j.baseline && j.shape["E"] == 32 && j.shape["N"] == 2880
        })
        .map(|j| {
            let mut s = j.clone();
            s.method = "shipped".into();
            s.job_id = format!("s{}", &j.job_id[1..]);
            s.baseline = false;
            s
        })
        .collect();
    let bests = emit::best_per_shape(&results);
    let mut shipped = shipped;
    for s in &mut shipped {
        let best = best_of(
            &bests,
            "triton",
            &[
                ("E", 32.into()),
                ("N", 2880.into()),
                ("M", s.shape["M"].clone()),
            ],
        );
        let factor = if s.shape["M"] == 64 { 0.9 } else { 1.25 };
        let st = s.stats.as_mut().unwrap();
        st.median_us = best.time_us * factor;
        st.ci_low_us = st.median_us * 0.998;
        st.ci_high_us = st.median_us * 1.002;
    }
    assert_eq!(shipped.len(), 6);
    results.jobs.extend(shipped);
    let report = render(&results)["report.md"].clone();
    let line = report
        .lines()
        .find(|l| l.starts_with("- Against the shipped"))
        .unwrap_or_else(|| panic!("no compared line in\n{report}"));
    assert!(
        line.starts_with(
            "- Against the shipped `E=32,N=2880,device_name=NVIDIA_H200.json` (its configs timed as shipped): **triton** is **"
        ),
        "{line}"
    );
    assert!(
        line.contains("geomean over 6 shapes (5 FAST, 0 SAME, **1 SLOW** by 95 % CI overlap); worst: M=64 E=32 N=2880 +11.1 % (SLOW)"),
        "{line}"
    );
    // The summary comes first, before the tables.
    assert!(
        report.find("Against the shipped").unwrap() < report.find("## What was timed").unwrap()
    );
    // Its rows in full in the details file.
    let details = &render(&results)["report-details.md"];
    assert!(details.contains(
        "### tunelab compare: `/somewhere/vllm/E=32,N=2880,device_name=NVIDIA_H200.json` → `triton`"
    ));
}

#[test]
fn graph_retiming_shows_where_its_winner_differs() {
    use tunelab::measure::Timing;
    let mut results = load("moe.jsonl");
    results.header.as_mut().unwrap().protocol.retime_with = vec![Timing::Graph];
    // The finalists of one (shape, method), and the winner the ranking picked.
    let bests = emit::best_per_shape(&results);
    let ranked = bests
        .iter()
        .find(|b| b.finalist && b.method == "triton")
        .expect("a finalist best");
    let shape = ranked.shape.clone();
    let finalists: Vec<String> = results
        .finals
        .iter()
        .map(|f| f.job_id.clone())
        .filter(|id| {
            results
                .jobs
                .iter()
                .any(|j| &j.job_id == id && j.shape == shape && j.method == "triton")
        })
        .collect();
    assert!(finalists.len() >= 2, "{finalists:?}");
    let other = finalists
        .iter()
        .find(|id| **id != ranked.job_id)
        .unwrap()
        .clone();
    // Under graph replay every finalist runs 20 % faster, except that the
    // ranking's runner-up beats its winner by 10 %.
    let mut graph = Vec::new();
    for f in &results.finals {
        let mut g = f.clone();
        g.timing = Timing::Graph;
        let factor = if g.job_id == ranked.job_id {
            0.8
        } else if g.job_id == other {
            0.72
        } else {
            0.8
        };
        let ranked_final = results
            .finals
            .iter()
            .find(|x| x.job_id == ranked.job_id)
            .unwrap();
        let base = if g.job_id == other {
            ranked_final.stats.median_us
        } else {
            g.stats.median_us
        };
        g.stats.median_us = base * factor;
        g.stats.ci_low_us = g.stats.median_us * 0.995;
        g.stats.ci_high_us = g.stats.median_us * 1.005;
        graph.push(g);
    }
    results.finals.extend(graph);
    let out = render(&results);
    let report = &out["report.md"];
    let note = report
        .lines()
        .find(|l| l.contains("Finalists re-timed under graph"))
        .unwrap_or_else(|| panic!("no re-timing note in\n{report}"));
    assert!(note.contains("another winner at 1 of "), "{note}");
    assert!(note.contains("1 of them beyond noise"), "{note}");
    let config = |id: &str| {
        let job = results.jobs.iter().find(|j| j.job_id == id).unwrap();
        job.config
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_string()))
            .collect::<HashMap<_, _>>()
    };
    let (a, b) = (config(&ranked.job_id), config(&other));
    let tile = |c: &HashMap<&str, String>| {
        format!(
            "{}×{}×{}",
            c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"], c["BLOCK_SIZE_K"]
        )
    };
    let row = report
        .lines()
        .find(|l| l.starts_with("| M=") && l.contains("| graph |"))
        .unwrap_or_else(|| panic!("no re-timing row in\n{report}"));
    assert!(row.contains(&tile(&a)) && row.contains(&tile(&b)), "{row}");
    assert!(row.contains("| 1.111× |"), "{row}");
    // The details file lists it too.
    assert!(out["report-details.md"].contains(row));
    // Without the re-timings: no section, no note.
    results
        .header
        .as_mut()
        .unwrap()
        .protocol
        .retime_with
        .clear();
    assert!(!render(&results)["report.md"].contains("re-timed under graph"));
}

#[test]
fn the_report_says_how_l2_was_flushed() {
    use tunelab::measure::L2Flush;
    // The fixture journals are of format 1, from before `flush_with`: their
    // runs flushed with a memset, and reading them says so.
    let mut results = load("gemm.jsonl");
    let details = |r: &Results| render(r)["report-details.md"].clone();
    assert!(details(&results)
        .contains("| L2 flush | before every sample, a memset of max(2 × L2, 32 MiB)"));
    assert!(render(&results)["report.md"].contains("L2 flushed by a memset of"));
    results.header.as_mut().unwrap().protocol.flush = L2Flush::Read;
    assert!(details(&results)
        .contains("| L2 flush | before every sample, a read of max(2 × L2, 32 MiB)"));
    let header = results.header.as_mut().unwrap();
    header.protocol.flush = L2Flush::Off;
    assert!(details(&results).contains("| L2 flush | off (warm-cache samples) |"));
}

/// The committed gpt-oss runs: the report fits a reviewer's minute (at most
/// 250 lines for a run resumed once; each further resume adds its row to the
/// Runs table, and nothing else), and its run counts add up across the
/// resumed runs.
#[test]
fn committed_gptoss_reports_fit_in_250_lines_and_their_counts_add_up() {
    for device in ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"] {
        let Some(run) = committed_rendered("gptoss", device) else {
            continue;
        };
        let (results, out) = &*run;
        let report = &out["report.md"];
        let lines = report.lines().count();
        let budget = 250 + results.runs.len().saturating_sub(2);
        assert!(
            lines <= budget,
            "{device}: {lines} lines, {} runs",
            results.runs.len()
        );
        // Every (E, N) has its table and its three charts.
        for e in [32, 128] {
            for n in [360, 720, 1440, 2880] {
                assert!(
                    report.contains(&format!("\n## E={e} N={n} · ")),
                    "{device}: E={e} N={n}"
                );
                for kind in ["latency", "speedup", "bound"] {
                    assert!(out.contains_key(&format!("report/E={e},N={n}-{kind}.svg")));
                }
            }
        }
        // The methods with no baseline share one summary line, and the shipped
        // file's method is summarised by its comparison alone.
        let untuned: Vec<&str> = report
            .lines()
            .filter(|l| l.contains("the fastest method's time"))
            .collect();
        assert_eq!(untuned.len(), 1, "{device}: {untuned:?}");
        for m in ["persistent", "persistent_gemv", "torch"] {
            assert!(
                untuned[0].contains(&format!("**{m}**: fastest at")),
                "{device}: {m}"
            );
        }
        assert!(!untuned[0].contains("shipped"), "{device}");
        // No row per (shape, method), no job ids.
        assert!(!report.contains("| M=1 E=32 N=360 | torch |"));
        let job_ids = report
            .split('`')
            .filter(|w| w.len() == 16 && w.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(job_ids.count(), 0, "{device}: job ids in the report");
        // Runs: already done + planned covers what the journal holds; the
        // recorded jobs add up to every job.
        let rows: Vec<Vec<&str>> = report
            .lines()
            .skip_while(|l| !l.starts_with("| Run |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
            .collect();
        let (runs, total) = rows.split_at(rows.len() - 1);
        let total = &total[0];
        assert_eq!(runs.len(), results.runs.len(), "{device}");
        let mut already = 0;
        for r in runs {
            assert_eq!(r[2].parse::<usize>().unwrap(), already, "{device}: {r:?}");
            let (planned, recorded, not_run): (usize, usize, usize) = (
                r[3].parse().unwrap(),
                r[4].parse().unwrap(),
                r[5].parse().unwrap(),
            );
            assert_eq!(planned, recorded + not_run, "{device}: {r:?}");
            already += recorded;
        }
        assert_eq!(total[4], format!("**{}**", results.jobs.len()));
        assert_eq!(already, results.jobs.len());
        assert_eq!(total[5], "0", "{device}: the last run finished");
    }
}

// ---------------------------------------------------------------- compiled kernels

/// Registers, spills and shared memory per job reach jobs.csv, and a winner
/// whose kernels spill is named in the report's summary.
#[test]
fn kernel_resources_reach_jobs_csv_and_spilling_winners_the_report() {
    let mut results = load("gemm.jsonl");
    let plain = render(&results);
    assert!(!plain["report.md"].contains("spill"));
    let winner = emit::best_per_shape(&results)
        .into_iter()
        .find(|b| b.method == "triton")
        .expect("a triton winner");
    let kernel = |name: &str, regs, spills, shared| tunelab::store::KernelResources {
        name: name.into(),
        n_regs: Some(regs),
        n_spills: Some(spills),
        shared,
        num_warps: 8,
        num_stages: 3,
    };
    let job = results
        .jobs
        .iter_mut()
        .find(|j| j.job_id == winner.job_id)
        .unwrap();
    job.kernels = vec![
        kernel("matmul_kernel", 255, 24, 98304),
        kernel("epilogue", 40, 2, 0),
    ];
    let out = render(&results);
    let mut rdr = csv::Reader::from_reader(out["jobs.csv"].as_bytes());
    let header = rdr.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let row = rdr
        .records()
        .map(|r| r.unwrap())
        .find(|r| r[col("job_id")] == winner.job_id)
        .unwrap();
    assert_eq!(&row[col("n_regs")], "255");
    assert_eq!(&row[col("n_spills")], "26");
    assert_eq!(&row[col("shared_bytes")], "98304");
    assert_eq!(
        &row[col("kernels")],
        "matmul_kernel 255r/24s/98304B|epilogue 40r/2s/0B"
    );
    let other = rdr_rows_without_kernels(&out["jobs.csv"], &winner.job_id);
    assert!(other, "jobs without kernels leave the columns empty");
    let report = &out["report.md"];
    let line = report
        .lines()
        .find(|l| l.contains("Winners that spill registers"))
        .expect("the summary names the spilling winner");
    assert!(
        line.contains("triton (26 registers spilled per thread)"),
        "{line}"
    );
}

fn rdr_rows_without_kernels(csv_text: &str, except: &str) -> bool {
    let mut rdr = csv::Reader::from_reader(csv_text.as_bytes());
    let header = rdr.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    rdr.records().map(|r| r.unwrap()).all(|r| {
        &r[col("job_id")] == except
            || (r[col("n_regs")].is_empty()
                && r[col("n_spills")].is_empty()
                && r[col("kernels")].is_empty())
    })
}

// ---------------------------------------------------------------- triton_kernels constraints

/// The moe fixture with a `triton_kernels` method whose configs are opt_flags
/// constraints made from the triton method's (its times, so its bests at the
/// same shapes), and a `triton_kernels_json` output of it.
fn with_triton_kernels_method(results: &mut Results, path: &str) {
    let extra: Vec<_> = results
        .jobs
        .iter()
        .filter(|j| j.method == "triton")
        .map(|j| {
            let mut t = j.clone();
            t.job_id = format!("k{}", j.job_id);
            t.method = "triton_kernels".into();
            t.kind = tunelab::manifest::MethodKind::Python;
            t.kernel = "triton_kernels".into();
            // One constraint config per triton config (a config recorded
            // twice under two ids would supersede the first), of any values.
            t.config = IndexMap::from([
                ("w1_block_m".to_string(), j.config["BLOCK_SIZE_M"].clone()),
                ("w1_block_k".to_string(), j.config["BLOCK_SIZE_K"].clone()),
                ("w1_num_stages".to_string(), j.config["num_stages"].clone()),
                ("w1_split_k".to_string(), Json::from(0)),
                ("w2_block_m".to_string(), j.config["BLOCK_SIZE_N"].clone()),
                ("w2_num_stages".to_string(), j.config["num_warps"].clone()),
                (
                    "w2_epilogue_subtile".to_string(),
                    j.config["GROUP_SIZE_M"].clone(),
                ),
                ("w2_split_k".to_string(), Json::from(1)),
            ]);
            t
        })
        .collect();
    let finals: Vec<_> = results
        .finals
        .iter()
        .filter(|f| extra.iter().any(|t| t.job_id == format!("k{}", f.job_id)))
        .map(|f| {
            let mut f = f.clone();
            f.job_id = format!("k{}", f.job_id);
            f
        })
        .collect();
    results.jobs.extend(extra);
    results.finals.extend(finals);
    let header = results.header.as_mut().unwrap();
    header.methods.push(tunelab::store::MethodRecord {
        name: "triton_kernels".into(),
        kind: tunelab::manifest::MethodKind::Python,
        kernel: "triton_kernels".into(),
        description: Some(
            "OpenAI's triton_kernels matmul_ogs MoE (triton_kernels 3.5.1 API)".into(),
        ),
        baseline: None,
        search: None,
    });
    let mut spec = header.outputs[0].clone();
    spec.format = serde_json::from_value(Json::from("triton_kernels_json")).unwrap();
    spec.path = path.into();
    spec.method = Some("triton_kernels".into());
    header.outputs = vec![spec];
}

const TK_PATH: &str = "triton_kernels/E={{E}},N={{N}},device_name={{device.vllm_name}}.json";

#[test]
fn triton_kernels_constraints_are_written_per_shape_and_m() {
    let mut results = load("moe.jsonl");
    with_triton_kernels_method(&mut results, TK_PATH);
    let out = render(&results);
    let names: Vec<&str> = out.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "triton_kernels/E=32,N=1440,device_name=NVIDIA_H200.json",
            "triton_kernels/E=32,N=2880,device_name=NVIDIA_H200.json",
            "triton_kernels/E=128,N=1440,device_name=NVIDIA_H200.json",
            "triton_kernels/E=128,N=2880,device_name=NVIDIA_H200.json",
        ]
    );
    let text = &out["triton_kernels/E=32,N=2880,device_name=NVIDIA_H200.json"];
    // The bytes the Python applier's test reads (tunelab.triton_kernels_constraints).
    let committed = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/triton_kernels_constraints.json"),
    )
    .unwrap();
    assert_eq!(text, &committed);
    let doc: Json = serde_json::from_str(text).unwrap();
    assert_eq!(doc["format"], "tunelab_triton_kernels_constraints");
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["device_name"], "NVIDIA_H200");
    assert!(doc["triton_kernels"]
        .as_str()
        .unwrap()
        .contains("3.5.1 API"));
    assert!(doc["shape"].get("M").is_none());
    assert_eq!(doc["shape"]["E"], 32);
    let bests = emit::best_per_shape(&results);
    let entries = doc["M"].as_object().unwrap();
    let ms: Vec<i64> = entries.keys().map(|k| k.parse().unwrap()).collect();
    assert!(ms.windows(2).all(|w| w[0] < w[1]), "{ms:?}");
    for (m, entry) in entries {
        let m: i64 = m.parse().unwrap();
        let fields = [("E", 32.into()), ("N", 2880.into()), ("M", m.into())];
        let triton = best_of(&bests, "triton", &fields);
        let tk = best_of(&bests, "triton_kernels", &fields);
        let c = &triton.config;
        // A 0 is no constraint: left out (w1_split_k).
        assert_eq!(
            entry["w1"],
            serde_json::json!({"block_m": c["BLOCK_SIZE_M"], "block_k": c["BLOCK_SIZE_K"],
                               "num_stages": c["num_stages"]})
        );
        assert_eq!(
            entry["w2"],
            serde_json::json!({"block_m": c["BLOCK_SIZE_N"], "num_stages": c["num_warps"],
                               "epilogue_subtile": c["GROUP_SIZE_M"], "split_k": 1})
        );
        assert!((entry["us"].as_f64().unwrap() - tk.time_us).abs() < 1e-3);
    }
}

#[test]
fn a_triton_kernels_file_holds_one_shape_but_m() {
    let mut results = load("moe.jsonl");
    with_triton_kernels_method(&mut results, TK_PATH);
    for j in results
        .jobs
        .iter_mut()
        .filter(|j| j.method == "triton_kernels")
    {
        if j.shape["E"] == 32 && j.shape["N"] == 2880 && j.shape["M"] == 4 {
            j.shape.insert("topk".into(), Json::from(8));
        }
    }
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(err.contains("differ in more than M"), "{err}");
    assert!(
        err.contains("put the fields that differ in the path"),
        "{err}"
    );
}

#[test]
fn vllm_files_never_carry_a_key_vllm_rejects() {
    // vLLM 0.33 passes every key of a config but BLOCK_SIZE_K to its kernel
    // as a keyword (an unknown one raises, SWAP_AB twice raises) and
    // overwrites SPLIT_K: tunelab's own keys must never reach its files.
    let mut results = load("moe.jsonl");
    for j in results.jobs.iter_mut().filter(|j| j.method == "triton") {
        for key in [
            "SWAP_AB",
            "GEMV",
            "DOT_SCALED",
            "MX_PTX",
            "SPLIT_K",
            "maxnreg",
        ] {
            j.config.insert(key.to_string(), Json::from(1));
        }
    }
    let out = render(&results);
    let mut files = 0;
    for (path, text) in out.iter().filter(|(p, _)| p.starts_with("vllm/")) {
        let doc: Json = serde_json::from_str(text).unwrap();
        for (m, config) in doc.as_object().unwrap() {
            if m == "triton_version" {
                continue;
            }
            let keys: Vec<&str> = config
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(
                keys,
                [
                    "BLOCK_SIZE_M",
                    "BLOCK_SIZE_N",
                    "BLOCK_SIZE_K",
                    "GROUP_SIZE_M",
                    "num_warps",
                    "num_stages"
                ],
                "{path} M={m}"
            );
        }
        files += 1;
    }
    assert_eq!(files, 4);
}

/// aiter's rules as its source has them (docs/consumer-formats.md): since its
/// change #4394 the key's act_type never matches, so the first row of a shape
/// wins whatever its activation; duplicate keys make it rewrite its tables
/// and raise. tunelab's table has one row per key with act_type left out,
/// and a run whose shapes would give two is refused.
#[test]
fn aiter_tables_have_one_row_per_shape_whatever_the_activation() {
    let mut results = load("moe.jsonl");
    on_mi300x(&mut results);
    with_aiter_method(&mut results);
    let out = render(&results);
    let csv = &out["aiter/tuned_fmoe.csv"];
    let mut keys = std::collections::HashSet::new();
    for line in csv.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').take(13).collect();
        let without_act: Vec<&str> = cells
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 6)
            .map(|(_, c)| *c)
            .collect();
        assert!(keys.insert(without_act), "two rows of one shape: {line}");
    }
    assert_eq!(keys.len(), 24);

    // The same shapes again with the other activation: aiter could not tell the rows apart.
    let extra: Vec<_> = results
        .jobs
        .iter()
        .filter(|j| j.method == "aiter" && j.shape["E"] == 32 && j.shape["N"] == 2880)
        .map(|j| {
            let mut t = j.clone();
            t.job_id = format!("s{}", j.job_id);
            t.shape
                .insert("activation".into(), Json::from("swiglu_oai"));
            t
        })
        .collect();
    let finals: Vec<_> = results
        .finals
        .iter()
        .filter(|f| extra.iter().any(|t| t.job_id == format!("s{}", f.job_id)))
        .map(|f| {
            let mut f = f.clone();
            f.job_id = format!("s{}", f.job_id);
            f
        })
        .collect();
    assert!(!extra.is_empty());
    results.jobs.extend(extra);
    results.finals.extend(finals);
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(err.contains("give aiter one lookup key"), "{err}");
    assert!(err.contains("takes the first row of a shape"), "{err}");
}

/// The report's headline compares against what vLLM runs where the report's
/// method is vLLM's call with vLLM's own setting as its baseline: the
/// committed H200 MXFP4 run (triton_kernels with split_k 1), naming the
/// fastest method per shape; never where the baseline is the same config in
/// tunelab's own kernel (the H100 MXFP4 run), nor where the baseline jobs
/// predate vLLM 0.33's rule (the fp8 runs of 2026-11).
#[test]
fn the_headline_is_against_what_vllm_runs_only_where_the_baseline_is_that() {
    let summary = |experiment: &str, device: &str| {
        let report = committed_rendered(experiment, device)?.1["report.md"].clone();
        Some(
            report
                .split("## Summary")
                .nth(1)?
                .lines()
                .take(3)
                .collect::<Vec<_>>()
                .join("\n"),
        )
    };
    if let Some(s) = summary("gptoss-mxfp4", "NVIDIA_H200") {
        assert!(
            s.contains("- **Against what vLLM 0.33 runs for MXFP4 experts on sm_90 (triton_kernels' heuristic with split_k 1)** (triton_kernels's baseline)"),
            "{s}"
        );
        assert!(
            s.contains("geomean over 24 shapes") && s.contains("slower at none"),
            "{s}"
        );
        assert!(
            s.contains("fastest: cuda_gemv at 2 (2.56×–2.59×), triton_kernels at 20"),
            "{s}"
        );
        assert!(
            s.contains("Kernels other than triton_kernels's: their fastest is 0.71× as fast"),
            "{s}"
        );
    }
    // The fp8 companion re-run on the H200 (2026-12-02) has vLLM 0.33's fp8
    // default config as its baseline; the H100's older run another.
    for (experiment, device) in [("gptoss", "NVIDIA_H200"), ("gptoss-fp8", "NVIDIA_H200")] {
        if let Some(s) = summary(experiment, device) {
            assert!(s.contains("**Against what vLLM 0.33 runs without a tuned file (its default config)** (triton_vllm's baseline)"), "{experiment} {device}: {s}");
        }
    }
    for (experiment, device) in [
        ("gptoss-mxfp4", "NVIDIA_H100_80GB_HBM3"),
        ("gptoss-fp8", "NVIDIA_H100_80GB_HBM3"),
    ] {
        if let Some(s) = summary(experiment, device) {
            assert!(
                !s.contains("Against what vLLM"),
                "{experiment} {device}: {s}"
            );
        }
    }
}
