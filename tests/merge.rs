//! `tunelab merge`: results directories made from the fixture journals,
//! their tuned files merged; winners by measured time, conflicts kept from
//! the first input, refusals that name the file, and the merged files read
//! back as vLLM and aiter read them.

use std::path::{Path, PathBuf};
use std::process::Command;

use indexmap::IndexMap;
use serde_json::Value as Json;

use tunelab::emit;
use tunelab::merge::{self, MergeError};
use tunelab::store::{Entry, Results};

mod consumers;

fn load(name: &str) -> Results {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/journals")
        .join(name);
    tunelab::store::journal::read_file(&path).unwrap().0
}

/// A results directory: the journal of `results` and every output it lists.
fn results_dir(dir: &Path, results: &Results) {
    std::fs::create_dir_all(dir).unwrap();
    let mut lines = String::new();
    let mut push = |e: Entry| {
        lines.push_str(&serde_json::to_string(&e).unwrap());
        lines.push('\n');
    };
    push(Entry::Run(Box::new(results.header.clone().unwrap())));
    for j in &results.jobs {
        push(Entry::Job(Box::new(j.clone())));
    }
    for f in &results.finals {
        push(Entry::Final(f.clone()));
    }
    std::fs::write(dir.join("journal.jsonl"), lines).unwrap();
    emit::write_outputs(results, dir).unwrap();
}

/// Every job of `method` at shape `fields` gets config field `field` = `value`
/// and its times multiplied by `scale`: another run that found another config.
fn retune(
    results: &mut Results,
    method: &str,
    fields: &[(&str, Json)],
    field: &str,
    value: Json,
    scale: f64,
) {
    let mut ids = Vec::new();
    for j in &mut results.jobs {
        if j.method == method && fields.iter().all(|(k, v)| j.shape.get(*k) == Some(v)) {
            j.config.insert(field.into(), value.clone());
            j.job_id = format!("r{}", j.job_id);
            if let Some(s) = &mut j.stats {
                s.median_us *= scale;
            }
            ids.push(j.job_id.clone());
        }
    }
    for f in &mut results.finals {
        if ids.contains(&format!("r{}", f.job_id)) {
            f.job_id = format!("r{}", f.job_id);
            f.stats.median_us *= scale;
        }
    }
}

const VLLM: &str = "vllm/E=32,N=2880,device_name=NVIDIA_H200.json";
const VLLM_NAME: &str = "E=32,N=2880,device_name=NVIDIA_H200.json";

fn at(e: i64, n: i64, m: i64) -> [(&'static str, Json); 3] {
    [("E", e.into()), ("N", n.into()), ("M", m.into())]
}

/// Run A (the fixture) and run B, which found a faster config at M=16 and a
/// slower one at M=64 (E=32, N=2880).
fn two_runs(root: &Path) -> (PathBuf, PathBuf) {
    let a = load("moe.jsonl");
    let mut b = load("moe.jsonl");
    retune(
        &mut b,
        "triton",
        &at(32, 2880, 16),
        "GROUP_SIZE_M",
        7.into(),
        0.5,
    );
    retune(
        &mut b,
        "triton",
        &at(32, 2880, 64),
        "GROUP_SIZE_M",
        9.into(),
        2.0,
    );
    results_dir(&root.join("a/NVIDIA_H200"), &a);
    results_dir(&root.join("b/NVIDIA_H200"), &b);
    (
        root.join("a/NVIDIA_H200").join(VLLM),
        root.join("b/NVIDIA_H200").join(VLLM),
    )
}

fn lookup(path: &Path, m: i64) -> serde_json::Map<String, Json> {
    let files = consumers::Files::from([(
        path.file_name().unwrap().to_string_lossy().into_owned(),
        std::fs::read_to_string(path).unwrap(),
    )]);
    consumers::vllm::lookup(&files, "NVIDIA H200", 32, 2880, None, None, m)
        .unwrap()
        .1
}

#[test]
fn per_m_the_faster_measured_entry_wins() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = two_runs(root.path());
    let out_dir = root.path().join("merged");
    let outcome = merge::merge(&[a.clone(), b.clone()], &out_dir.join(VLLM_NAME)).unwrap();
    assert_eq!(outcome.format, "vllm_moe_json");
    assert_eq!(outcome.keys, 6);
    let keys: Vec<&str> = outcome.conflicts.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(keys, ["M=16", "M=64"]);
    assert!(outcome.conflicts.iter().all(|c| c.by_time));
    assert_eq!(outcome.conflicts[0].kept, 1, "B is twice as fast at M=16");
    assert_eq!(outcome.conflicts[1].kept, 0, "A is twice as fast at M=64");
    let (ta, tb) = (
        outcome.conflicts[0].entries[0].1.unwrap(),
        outcome.conflicts[0].entries[1].1.unwrap(),
    );
    assert!((tb / ta - 0.5).abs() < 1e-9, "{ta} {tb}");

    let merged = &outcome.written;
    assert_eq!(merged, &out_dir.join(VLLM_NAME));
    assert_eq!(lookup(merged, 16)["GROUP_SIZE_M"], 7);
    assert_eq!(lookup(merged, 64), lookup(&a, 64));
    assert_eq!(lookup(merged, 1024), lookup(&a, 1024));
    // vLLM's exact format: the writer's bytes where nothing was replaced.
    let merged_a = merge::merge(&[a.clone(), a.clone()], &out_dir.join("again/")).unwrap();
    assert!(merged_a.conflicts.is_empty());
    assert_eq!(
        std::fs::read_to_string(&merged_a.written).unwrap(),
        std::fs::read_to_string(&a).unwrap()
    );
    assert!(!std::fs::read_dir(&out_dir).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(".tmp")));
}

#[test]
fn an_entry_without_a_measurement_keeps_the_first_inputs_and_is_listed() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = two_runs(root.path());
    // B's file, away from its journal: nothing measures its entries.
    let loose = root.path().join("loose").join(VLLM_NAME);
    std::fs::create_dir_all(loose.parent().unwrap()).unwrap();
    std::fs::copy(&b, &loose).unwrap();
    let out = root.path().join("out/");
    let outcome = merge::merge(&[a.clone(), loose.clone()], &out).unwrap();
    assert_eq!(outcome.conflicts.len(), 2);
    for c in &outcome.conflicts {
        assert_eq!((c.kept, c.by_time), (0, false), "{c:?}");
        assert!(c.entries[0].1.is_some() && c.entries[1].1.is_none());
    }
    assert_eq!(lookup(&outcome.written, 16), lookup(&a, 16));
    // The other order: the loose file is first, and kept.
    let outcome = merge::merge(&[loose.clone(), a.clone()], &out).unwrap();
    assert!(outcome.conflicts.iter().all(|c| c.kept == 0 && !c.by_time));
    assert_eq!(lookup(&outcome.written, 16)["GROUP_SIZE_M"], 7);
}

#[test]
fn files_that_cannot_be_merged_are_refused_with_the_file_and_the_fix() {
    let root = tempfile::tempdir().unwrap();
    let (a, _) = two_runs(root.path());
    let other_n = root
        .path()
        .join("a/NVIDIA_H200/vllm/E=32,N=1440,device_name=NVIDIA_H200.json");
    let input_error = |inputs: &[PathBuf], into: &Path| -> (PathBuf, String) {
        match merge::merge(inputs, into) {
            Err(MergeError::Input { path, message }) => (path, message),
            other => panic!("{other:?}"),
        }
    };
    let into = root.path().join("x").join(VLLM_NAME);

    let (path, message) = input_error(&[a.clone(), other_n.clone()], &into);
    assert_eq!(path, other_n);
    assert!(
        message.contains("merge files of one E, N, device"),
        "{message}"
    );

    let csv = root.path().join("a/NVIDIA_H200/best.csv");
    let (path, message) = input_error(&[a.clone(), csv.clone()], &into);
    assert_eq!(path, csv);
    assert!(message.contains("merge files of one format"), "{message}");

    let missing = root.path().join(VLLM_NAME);
    let (path, message) = input_error(&[a.clone(), missing.clone()], &into);
    assert_eq!(path, missing);
    assert!(message.starts_with("cannot read"), "{message}");

    let misnamed = root.path().join("configs.json");
    std::fs::copy(&a, &misnamed).unwrap();
    let (path, message) = input_error(&[misnamed.clone(), a.clone()], &into);
    assert_eq!(path, misnamed);
    assert!(message.contains("vLLM never reads it"), "{message}");

    let bad = root.path().join("bad").join(VLLM_NAME);
    std::fs::create_dir_all(bad.parent().unwrap()).unwrap();
    std::fs::write(&bad, r#"{"triton_version": "3.4.0", "one": {}}"#).unwrap();
    let (path, message) = input_error(&[a.clone(), bad.clone()], &into);
    assert_eq!(path, bad);
    assert!(message.contains("key `one`"), "{message}");

    let wrong_out = root.path().join("merged.json");
    let (path, message) = input_error(&[a.clone(), a.clone()], &wrong_out);
    assert_eq!(path, wrong_out);
    assert!(
        message.contains(&format!("named `{VLLM_NAME}`")),
        "{message}"
    );
    assert!(!wrong_out.exists() && !into.exists(), "nothing was written");
}

/// The moe fixture on an MI300X with a method that timed aiter's own CK
/// two-stage kernels: rows aiter can read. `kernels` names the kernels.
fn aiter_run(kernel_tag: &str) -> Results {
    let mut r = load("moe.jsonl");
    let header = r.header.as_mut().unwrap();
    let mut d = tunelab::device::profile("h100").unwrap();
    d.name = "AMD Instinct MI300X".into();
    d.vllm_name = "AMD_Instinct_MI300X".into();
    d.backend = "hip".into();
    d.arch = "gfx942".into();
    d.sm_count = 304;
    header.device = d;
    header
        .outputs
        .retain(|o| o.format.name() == "aiter_fmoe_csv");
    header.outputs[0].method = Some("triton".into());
    for j in &mut r.jobs {
        if j.method != "triton" {
            continue;
        }
        let bm = j.config["BLOCK_SIZE_M"].as_i64().unwrap().max(32);
        let bn = j.config["BLOCK_SIZE_N"].as_i64().unwrap();
        j.kind = tunelab::manifest::MethodKind::Python;
        j.config = IndexMap::from([
            (
                "kernelName1".to_string(),
                Json::from(format!("moe_ck2stages_gemm1_256x{bm}x{bn}_{kernel_tag}")),
            ),
            (
                "kernelName2".to_string(),
                Json::from(format!("moe_ck2stages_gemm2_256x{bm}x{bn}_{kernel_tag}")),
            ),
            ("block_m".to_string(), Json::from(bm)),
            ("ksplit".to_string(), Json::from(0)),
        ]);
    }
    r
}

#[test]
fn aiter_tables_merge_by_aiters_key_and_the_faster_row_wins() {
    let root = tempfile::tempdir().unwrap();
    let a = aiter_run("v1");
    let mut b = aiter_run("v1");
    // B: other kernels at E=128 N=1440 M=256, faster; at M=1 slower.
    retune(
        &mut b,
        "triton",
        &at(128, 1440, 256),
        "kernelName2",
        "moe_ck2stages_gemm2_B".into(),
        0.8,
    );
    retune(
        &mut b,
        "triton",
        &at(128, 1440, 1),
        "kernelName2",
        "moe_ck2stages_gemm2_C".into(),
        1.25,
    );
    // Shapes only B tuned: E=128 N=1440 M=4 retagged to M=8.
    for j in &mut b.jobs {
        if j.shape["E"] == 128 && j.shape["N"] == 1440 && j.shape["M"] == 4 {
            j.shape.insert("M".into(), 8.into());
        }
    }
    results_dir(&root.path().join("a/AMD_Instinct_MI300X"), &a);
    results_dir(&root.path().join("b/AMD_Instinct_MI300X"), &b);
    let fa = root
        .path()
        .join("a/AMD_Instinct_MI300X/aiter/tuned_fmoe.csv");
    let fb = root
        .path()
        .join("b/AMD_Instinct_MI300X/aiter/tuned_fmoe.csv");
    let out = root.path().join("tuned_fmoe.csv");
    let outcome = merge::merge(&[fa.clone(), fb.clone()], &out).unwrap();
    assert_eq!(outcome.format, "aiter_fmoe_csv");
    assert_eq!(outcome.keys, 25, "A's 24 keys and B's M=8");
    assert_eq!(outcome.conflicts.len(), 2, "{:?}", outcome.conflicts);
    let by_token = |token: &str| {
        outcome
            .conflicts
            .iter()
            .find(|c| c.key.split(',').nth(1) == Some(token))
            .unwrap()
    };
    assert_eq!((by_token("256").kept, by_token("256").by_time), (1, true));
    assert_eq!((by_token("1").kept, by_token("1").by_time), (0, true));
    assert!(by_token("256")
        .key
        .starts_with("304,256,2880,1440,128,4,ActivationType.Silu,"));

    // Read back as aiter reads it.
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().next().unwrap(), emit::aiter::HEADER);
    let query = |m: i64| consumers::aiter_fmoe::Query {
        gfx: "gfx942",
        cu_num: 304,
        m,
        model_dim: 2880,
        inter_dim: 1440,
        expert: 128,
        topk: 4,
        act_type: "ActivationType.Silu",
        dtype: "torch.bfloat16",
        q_dtype_a: "torch.bfloat16",
        q_dtype_w: "torch.bfloat16",
        q_type: "QuantType.No",
        use_g1u1: true,
        doweight_stage1: false,
    };
    let row = |m| consumers::aiter_fmoe::lookup(&text, &query(m)).unwrap();
    assert_eq!(row(256)["kernelName2"], "moe_ck2stages_gemm2_B");
    assert!(row(1)["kernelName2"].ends_with("_v1"));
    assert_eq!(row(8)["token"], "8");
    assert_eq!(row(4)["token"], "4");

    // A table without a journal (aiter's own, say): its rows are unmeasured.
    let shipped = root.path().join("shipped/tuned_fmoe.csv");
    std::fs::create_dir_all(shipped.parent().unwrap()).unwrap();
    let theirs = text
        .lines()
        .take(2)
        .map(|l| l.replace("_v1", "_theirs") + "\n")
        .collect::<String>();
    std::fs::write(&shipped, &theirs).unwrap();
    let outcome =
        merge::merge(&[shipped.clone(), fa.clone()], &root.path().join("m2.csv")).unwrap();
    assert_eq!(outcome.conflicts.len(), 1);
    let c = &outcome.conflicts[0];
    assert_eq!((c.kept, c.by_time), (0, false));
    assert_eq!(c.entries[0].1, None);
    assert!(c.entries[1].1.is_some());
}

#[test]
fn aiter_tables_of_different_headers_are_refused() {
    let root = tempfile::tempdir().unwrap();
    results_dir(&root.path().join("a/AMD_Instinct_MI300X"), &aiter_run("v1"));
    let fa = root
        .path()
        .join("a/AMD_Instinct_MI300X/aiter/tuned_fmoe.csv");
    let text = std::fs::read_to_string(&fa).unwrap();
    let newer = root.path().join("newer.csv");
    // A newer aiter's header (an `xbf16` column), no rows.
    let header = text
        .lines()
        .next()
        .unwrap()
        .replace("run_1stage,tflops", "run_1stage,xbf16,tflops");
    std::fs::write(&newer, header + "\n").unwrap();
    match merge::merge(&[fa.clone(), newer.clone()], &root.path().join("m.csv")) {
        Err(MergeError::Input { path, message }) => {
            assert_eq!(path, newer);
            assert!(
                message.contains("xbf16") && message.contains("one header"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    let not_aiter = root.path().join("best.csv");
    std::fs::write(&not_aiter, "M,N,K\n1,2,3\n").unwrap();
    match merge::merge(&[fa, not_aiter.clone()], &root.path().join("m.csv")) {
        Err(MergeError::Input { path, message }) => {
            assert_eq!(path, not_aiter);
            assert!(
                message.contains("is not an aiter tuned_fmoe.csv table"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_command_prints_the_conflicts_and_exits_2_on_bad_input() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = two_runs(root.path());
    let run = |args: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_tunelab"))
            .arg("merge")
            .args(args)
            .output()
            .unwrap()
    };
    let into = root.path().join("out/");
    let out = run(&[
        "--into".as_ref(),
        into.as_os_str(),
        a.as_os_str(),
        b.as_os_str(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("2 conflict(s):"), "{stdout}");
    let m16 = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("M=16 "))
        .unwrap();
    assert!(m16.contains("[2]") && m16.contains("faster"), "{m16}");
    assert!(stdout.contains("6 key(s) from 2 file(s) (vllm_moe_json), 2 conflict(s): 2 decided by measured time, 0 kept from the first input"), "{stdout}");
    assert!(into.join(VLLM_NAME).is_file());

    let csv = root.path().join("a/NVIDIA_H200/best.csv");
    let out = run(&[
        "--into".as_ref(),
        into.as_os_str(),
        a.as_os_str(),
        csv.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("error: {}: is an aiter", csv.display())),
        "{stderr}"
    );
    assert!(stderr.contains("nothing was written"), "{stderr}");

    // One file is a usage error.
    let out = run(&["--into".as_ref(), into.as_os_str(), a.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    // --help says it takes files only.
    let out = run(&["--help".as_ref()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Takes files only"));
}
