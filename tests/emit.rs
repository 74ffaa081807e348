//! Output writers from fixture journals: file names, exact bytes of the
//! formats other tools load, the selection rule, and report snapshots.
//! No GPU, no Python: everything comes from `tests/fixtures/journals/`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde_json::Value as Json;

use tunelab::emit::{self, triton_mbucket, Rendered};
use tunelab::store::{JobStatus, Results};

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

/// vLLM's lookup: drop `triton_version`, turn keys into ints, take the key nearest to M
/// (Python's `min` keeps the first of equals, and the keys come in file order).
fn vllm_lookup(file: &str, m: i64) -> (i64, serde_json::Map<String, Json>) {
    let mut doc: serde_json::Map<String, Json> = serde_json::from_str(file).unwrap();
    doc.shift_remove("triton_version")
        .expect("triton_version is present");
    let configs: Vec<(i64, Json)> = doc
        .into_iter()
        .map(|(k, v)| (k.parse::<i64>().expect("every other key is an integer"), v))
        .collect();
    let mut best = &configs[0];
    for c in &configs[1..] {
        if (c.0 - m).abs() < (best.0 - m).abs() {
            best = c;
        }
    }
    (best.0, best.1.as_object().unwrap().clone())
}

#[test]
fn vllm_nearest_m_lookup_returns_the_tuned_config() {
    let results = load("moe.jsonl");
    let out = render(&results);
    let bests = emit::best_per_shape(&results);
    for (file, e, n) in [
        ("vllm/E=32,N=2880,device_name=NVIDIA_H200.json", 32, 2880),
        ("vllm/E=128,N=1440,device_name=NVIDIA_H200.json", 128, 1440),
    ] {
        for (m, nearest) in [
            (1, 1),
            (2, 1),
            (3, 4),
            (10, 4),
            (12, 16),
            (40, 16),
            (41, 64),
            (100, 64),
            (200, 256),
            (700, 1024),
            (5000, 1024),
        ] {
            let (key, config) = vllm_lookup(&out[file], m);
            assert_eq!(key, nearest, "{file}: M={m}");
            let tuned = best_of(
                &bests,
                "triton",
                &[("E", e.into()), ("N", n.into()), ("M", nearest.into())],
            );
            let expected: serde_json::Map<String, Json> = tuned
                .config
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(config, expected, "{file}: M={m}");
        }
    }
}

// ---------------------------------------------------------------- aiter

#[test]
fn aiter_csv_has_the_exact_header_and_rows() {
    let out = render(&load("moe.jsonl"));
    let csv = &out["aiter/tuned_fmoe.csv"];
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,tflops,bw,_tag"
    );
    assert_eq!(lines.clone().count(), 24, "one row per shape");
    let row = lines
        .find(|l| l.starts_with("132,16,2880,2880,32,4,"))
        .unwrap();
    assert_eq!(row, AITER_ROW_E32_N2880_M16);
    assert!(csv.ends_with('\n') && !csv.contains('\r'));
}

const AITER_ROW_E32_N2880_M16: &str = "132,16,2880,2880,32,4,ActivationType.Silu,torch.bfloat16,torch.bfloat16,torch.bfloat16,QuantType.No,1,0,16,0,380.0553,tunelab_fused_moe_BM16_BN64_BK128_GM32_w4_s4,0.1%,0,,0.0%,380.0553,1,8.38,3696.0,";

// ---------------------------------------------------------------- Triton M buckets

#[test]
fn triton_mbucket_keys_follow_both_schemes() {
    let results = load("gemm.jsonl");
    let out = render(&results);
    let keys = |path: &str| -> Vec<String> {
        let doc: serde_json::Map<String, Json> = serde_json::from_str(&out[path]).unwrap();
        doc.keys().cloned().collect()
    };
    assert_eq!(
        keys("triton/sm_90-GEMM-quickstart-N=4096-K=4096.json"),
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
        keys("triton/sm_90-GEMM-quickstart-N=1024-K=1024.json"),
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
        keys("triton-legacy/sm_90-GEMM-quickstart-N=4096-K=4096.json"),
        legacy
    );
    assert_eq!(
        keys("triton-legacy/sm_90-GEMM-quickstart-N=1024-K=1024.json"),
        legacy
    );

    // Values: the best config of the M each bucket holds, all fields, integers as integers.
    let bests = emit::best_per_shape(&results);
    let doc: serde_json::Map<String, Json> =
        serde_json::from_str(&out["triton/sm_90-GEMM-quickstart-N=4096-K=4096.json"]).unwrap();
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
        serde_json::from_str(&out["triton-legacy/sm_90-GEMM-quickstart-N=4096-K=4096.json"])
            .unwrap();
    assert_eq!(legacy["small"], cfg(16));
    assert_eq!(legacy["medium_M64"], cfg(64));
    assert_eq!(legacy["xlarge"], cfg(12288));

    assert_eq!(triton_mbucket::current_key(8193), "M_GEQ_8192");
    assert_eq!(triton_mbucket::legacy_key(96), "medium_M128");
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

// ---------------------------------------------------------------- CSV and JSON layouts

#[test]
fn csv_columns_are_documented_names() {
    let out = render(&load("gemm.jsonl"));
    let header = out["jobs.csv"].lines().next().unwrap();
    assert_eq!(
        header,
        "job_id,method,kind,kernel,M,N,K,dtype,cfg.GROUP_SIZE_M,cfg.BLOCK_SIZE_M,cfg.BLOCK_SIZE_N,cfg.BLOCK_SIZE_K,cfg.num_warps,cfg.num_stages,\
baseline,status,failure_class,failure_message,passed,max_abs_err,max_rel_err,mismatch_frac,nan_count,n,median_us,ci_low_us,ci_high_us,min_us,q1_us,q3_us,mean_us,cv,\
flags,timer,sm_clock_mhz,tflops,gbs,roofline_pct,compile_s,final_median_us,final_ci_low_us,final_ci_high_us,tied_with_best,time_us,flops,bytes,gpu_ms,wall_ms,duration_s,lane,finished_at"
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
    assert_eq!(written.len(), 4 + 1 + 1 + 1);
    for p in &written {
        assert!(p.starts_with(dir.path()) && p.is_file(), "{}", p.display());
    }
    let first: Vec<Vec<u8>> = written.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let again = emit::write_outputs(&results, dir.path()).unwrap();
    assert_eq!(again, written);
    let second: Vec<Vec<u8>> = again.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert_eq!(first, second);
    assert!(!dir.path().join("report.md.tmp").exists());
}

#[test]
fn a_run_with_no_jobs_still_gets_a_report_and_no_empty_config_files() {
    let mut results = load("moe.jsonl");
    results.jobs.clear();
    results.finals.clear();
    let out = render(&results);
    let names: Vec<&str> = out.keys().map(String::as_str).collect();
    // Paths that need shape fields have no shape to be rendered for.
    assert_eq!(names, ["aiter/tuned_fmoe.csv", "best.csv", "report.md"]);
    assert!(out["report.md"].contains("No jobs recorded."));
    assert_eq!(out["aiter/tuned_fmoe.csv"].lines().count(), 1);
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
fn interpreter_mode_report_carries_the_warning() {
    let mut results = load("gemm.jsonl");
    let gpu = render(&results)["report.md"].clone();
    assert!(!gpu.contains("[!WARNING]"));
    results.header.as_mut().unwrap().mode = tunelab::plan::Mode::Interpreter;
    let report = render(&results)["report.md"].clone();
    assert!(report.contains("> [!WARNING]"));
    assert!(report.contains("timings are interpreted wall-clock, not GPU timings; tuned files are for format checks only"));
}

#[test]
fn interpreter_report_on_the_cpu_profile_shows_dashes_not_figures() {
    let mut results = load("moe.jsonl");
    let header = results.header.as_mut().unwrap();
    header.mode = tunelab::plan::Mode::Interpreter;
    header.device = tunelab::device::profile("cpu").unwrap();
    for j in &mut results.jobs {
        if let Some(s) = &mut j.stats {
            s.timer = tunelab::measure::Timer::Wall;
        }
    }
    let out = render(&results);
    let report = &out["report.md"];
    assert!(report.contains("> [!WARNING]"));
    assert!(report.contains("| Peak memory bandwidth | — |"));
    assert!(report.contains("has no peak bandwidth figure"));
    assert!(report.contains("wall-clock"));
    // Tuned files are still written, for format checks, under the cpu device name.
    assert!(out.contains_key("vllm/E=32,N=2880,device_name=cpu.json"));
}

#[test]
fn a_best_config_without_a_vllm_field_is_an_error_that_names_it() {
    let mut results = load("moe.jsonl");
    for j in &mut results.jobs {
        if j.method == "triton" {
            j.config.shift_remove("num_stages");
        }
    }
    let err = emit::render_outputs(&results).unwrap_err().to_string();
    assert!(
        err.contains("vllm_moe_json") && err.contains("num_stages"),
        "{err}"
    );
}

#[test]
fn best_job_ids_hold_winners_and_baselines() {
    let results = load("moe.jsonl");
    let ids = emit::best_job_ids(&results);
    for b in emit::best_per_shape(&results) {
        assert!(ids.contains(&b.job_id));
    }
    assert!(results
        .jobs
        .iter()
        .filter(|j| j.baseline)
        .all(|j| ids.contains(&j.job_id)));
    assert!(results
        .jobs
        .iter()
        .filter(|j| j.status == JobStatus::Pruned)
        .all(|j| !ids.contains(&j.job_id)));
}

#[test]
fn the_report_says_how_l2_was_flushed() {
    use tunelab::measure::L2Flush;
    // The fixture journals are of format 1, from before `flush_with`: their
    // runs flushed with a memset, and reading them says so.
    let mut results = load("gemm.jsonl");
    assert!(render(&results)["report.md"]
        .contains("| L2 flush | before every sample, a memset of max(2 × L2, 32 MiB)"));
    results.header.as_mut().unwrap().protocol.flush = L2Flush::Read;
    assert!(render(&results)["report.md"]
        .contains("| L2 flush | before every sample, a read of max(2 × L2, 32 MiB)"));
    let header = results.header.as_mut().unwrap();
    header.protocol.flush = L2Flush::Off;
    assert!(render(&results)["report.md"].contains("| L2 flush | off (warm-cache samples) |"));
}
