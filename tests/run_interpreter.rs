//! The whole pipeline in interpreter mode: real workers, real kernels in
//! Triton's interpreter, journal, resume, failure classes, outputs.
//!
//! Needs a Python with torch and triton, named by TUNELAB_TEST_PYTHON
//! (`just test` sets it). Without one these tests say so and pass vacuously,
//! so `cargo test` still works on a bare machine; CI always sets it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod interpreter;
use interpreter::{python, repo, show, tunelab};

fn journal(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("journal lines are JSON"))
        .collect()
}

fn jobs(entries: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    entries.iter().filter(|e| e["type"] == "job").collect()
}

#[test]
fn quickstart_runs_end_to_end_and_resumes_without_redoing_work() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let out = tunelab(&py, results.path(), &["run", "experiments/quickstart.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interpreter"),
        "says it runs the interpreter"
    );

    let dir: PathBuf = results.path().join("quickstart/cpu-interpreter");
    let entries = journal(&dir);
    assert_eq!(entries[0]["type"], "run");
    assert_eq!(entries[0]["mode"], "interpreter");
    let planned = entries[0]["planned_jobs"].as_u64().unwrap();
    let done = jobs(&entries);
    assert_eq!(done.len() as u64, planned);
    // The CUDA C++ method needs a GPU: its jobs are skipped, saying so.
    let (native, done): (Vec<_>, Vec<_>) = done.into_iter().partition(|j| j["method"] == "cuda");
    assert!(!native.is_empty());
    for j in &native {
        assert_eq!(j["status"], "skipped", "{j}");
        assert_eq!(j["failure"]["class"], "unavailable", "{j}");
        assert!(
            j["failure"]["message"]
                .as_str()
                .unwrap()
                .contains("need a GPU"),
            "{j}"
        );
    }
    for j in &done {
        assert_eq!(j["status"], "ok", "{j}");
        assert_eq!(j["check"]["passed"], true);
        assert_eq!(j["stats"]["timer"], "wall");
        assert!(j["stats"]["median_us"].as_f64().unwrap() > 0.0);
    }
    for file in ["jobs.csv", "jobs.json", "best.csv", "report.md"] {
        assert!(dir.join(file).is_file(), "{file} written");
    }
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.to_lowercase().contains("interpret"),
        "the report says the timings are interpreted"
    );

    // Resume: nothing left to do, nothing redone, nothing lost; what could not
    // run is tried again (and is still unavailable).
    let again = tunelab(&py, results.path(), &["run", "experiments/quickstart.yaml"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", show(&again));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains(&format!(
            "0 jobs run (0 ok, 0 failed, 0 pruned, 0 checked), {} skipped: their method cannot run here, {} already done",
            native.len(),
            done.len()
        )),
        "{}",
        show(&again)
    );
    // The unavailable jobs were asked again and said the same: not recorded
    // again, so the runs table still counts them in the first run.
    assert_eq!(jobs(&journal(&dir)).len(), done.len() + native.len());
    let runs: Vec<serde_json::Value> = journal(&dir)
        .into_iter()
        .filter(|e| e["type"] == "run")
        .collect();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        runs[1]["planned_jobs"], 0,
        "the journal holds every job the resume planned"
    );
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        !report.contains("never recorded"),
        "a resume that re-asked unavailable jobs left none unrecorded:\n{report}"
    );

    // A later definition of one job's method recorded it under another id
    // (as if its kernel had been edited and run); going back to this
    // definition, that job is superseded, so a resume runs it again and its
    // new record is the current one.
    let original = done[0];
    let mut later = original.clone();
    later["job_id"] = "feedfacefeedface".into();
    let mut text = std::fs::read_to_string(dir.join("journal.jsonl")).unwrap();
    text.push_str(&format!("{later}\n"));
    std::fs::write(dir.join("journal.jsonl"), text).unwrap();
    // Records carry whole seconds: the re-run's must be the later one.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let back = tunelab(&py, results.path(), &["run", "experiments/quickstart.yaml"])
        .output()
        .unwrap();
    assert_eq!(back.status.code(), Some(0), "{}", show(&back));
    assert!(
        String::from_utf8_lossy(&back.stdout).contains("1 job run (1 ok"),
        "the superseded job runs again: {}",
        show(&back)
    );
    let rerun: Vec<_> = jobs(&journal(&dir))
        .into_iter()
        .filter(|j| j["job_id"] == original["job_id"])
        .cloned()
        .collect();
    assert_eq!(rerun.len(), 2, "both records of the job are kept");
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains(&format!(
            "**1 job was superseded** (`{}`)",
            original["method"].as_str().unwrap()
        )),
        "the other definition's record is now the superseded one:\n{report}"
    );
    let best = std::fs::read_to_string(dir.join("best.csv")).unwrap();
    assert!(!best.contains("feedfacefeedface"));

    // The report is regenerated from the journal alone.
    std::fs::remove_file(dir.join("report.md")).unwrap();
    let report = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .arg("report")
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(report.status.code(), Some(0), "{}", show(&report));
    assert!(dir.join("report.md").is_file());
}

#[test]
fn crashes_hangs_and_wrong_answers_are_recorded_and_the_run_goes_on() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let out = tunelab(
        &py,
        results.path(),
        &["run", "tests/fixtures/runs/flaky.yaml"],
    )
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "some jobs failed: exit 3\n{}",
        show(&out)
    );
    let entries = journal(&results.path().join("flaky/cpu-interpreter"));
    let by_method: HashMap<String, Vec<&serde_json::Value>> =
        jobs(&entries).into_iter().fold(HashMap::new(), |mut m, j| {
            m.entry(j["method"].as_str().unwrap().to_string())
                .or_default()
                .push(j);
            m
        });
    let classes = |method: &str| -> Vec<String> {
        by_method[method]
            .iter()
            .map(|j| j["failure"]["class"].as_str().unwrap_or("none").to_string())
            .collect()
    };
    assert_eq!(
        classes("crash"),
        vec!["crash", "crash"],
        "a worker that dies is a crash, once per shape"
    );
    assert_eq!(
        classes("hang"),
        vec!["timeout", "timeout"],
        "a worker that hangs is killed at the timeout"
    );
    assert_eq!(classes("wrong"), vec!["mismatch", "mismatch"]);
    // Jobs after each failure still ran, on a fresh worker.
    assert_eq!(by_method["ok"].len(), 4);
    assert!(by_method["ok"].iter().all(|j| j["status"] == "ok"));
    assert!(start.elapsed() < Duration::from_secs(120));
}

#[test]
fn a_killed_runner_resumes_losing_nothing_and_redoing_nothing() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let dir = results.path().join("slow/cpu-interpreter");
    let mut child = tunelab(
        &py,
        results.path(),
        &["run", "tests/fixtures/runs/slow.yaml"],
    )
    .spawn()
    .unwrap();
    // Wait for two finished jobs, then kill the runner outright.
    let deadline = Instant::now() + Duration::from_secs(90);
    while jobs(&journal(&dir)).len() < 2 {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before: Vec<String> = jobs(&journal(&dir))
        .iter()
        .map(|j| j["job_id"].as_str().unwrap().to_string())
        .collect();
    assert!(before.len() < 6, "killed mid-run");

    let out = tunelab(
        &py,
        results.path(),
        &["run", "tests/fixtures/runs/slow.yaml"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let after: Vec<String> = jobs(&journal(&dir))
        .iter()
        .map(|j| j["job_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "recorded jobs are kept"
    );
    let unique: HashSet<&String> = after.iter().collect();
    assert_eq!(unique.len(), after.len(), "no job ran twice");
    assert_eq!(after.len(), 6, "every job done");
}

#[test]
fn gptoss_moe_in_the_interpreter_writes_vllm_files_and_notes_the_aiter_table() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    // Two lanes: the flagship and its three companions are the longest run
    // here, and the last test to finish; a second lane takes the core the
    // other tests have left by then.
    let out = tunelab(
        &py,
        results.path(),
        &["run", "experiments/gptoss.yaml", "--lanes", "2"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let dir = results.path().join("gptoss/cpu-interpreter");

    // vLLM: E={E},N={N},device_name={name}.json, "triton_version" then M keys, six ints in order.
    let path = dir.join("vllm/E=8,N=32,device_name=cpu.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        text.ends_with("}\n") && text.contains("\n    \"triton_version\": "),
        "4-space indent, trailing newline:\n{text}"
    );
    let json: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(
        json.keys().next().map(String::as_str),
        Some("triton_version")
    );
    let ms: Vec<i64> = json
        .keys()
        .skip(1)
        .map(|k| k.parse().expect("M keys are decimal strings"))
        .collect();
    assert_eq!(ms, vec![1, 4, 16]);
    for (_, config) in json.iter().skip(1) {
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
            ]
        );
        assert!(config.as_object().unwrap().values().all(|v| v.is_i64()));
    }
    // vLLM's loader takes the key nearest to M.
    let nearest = |m: i64| *ms.iter().min_by_key(|k| (*k - m).abs()).unwrap();
    assert_eq!((nearest(2), nearest(11), nearest(4096)), (1, 16, 16));

    // aiter: no table off an AMD GPU (aiter finds rows by the GPU's CU count
    // and arch); the run says so in one line and writes everything else.
    assert!(!dir.join("aiter/tuned_fmoe.csv").exists());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "note: aiter_fmoe_csv `aiter/tuned_fmoe.csv` not written: aiter runs on AMD GPUs"
        ),
        "{}",
        show(&out)
    );

    // The companion experiment (the attention GEMMs) ran next, into its own directory.
    let attention = results.path().join("gptoss-attention/cpu-interpreter");
    assert!(attention.join("report.md").is_file(), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("companion"));

    // Then the quantised MoE: fp8 configs go to vLLM's fp8 file name, MXFP4's to the report only.
    let fp8 = results.path().join("gptoss-fp8/cpu-interpreter");
    let text =
        std::fs::read_to_string(fp8.join("vllm/E=8,N=32,device_name=cpu,dtype=fp8_w8a8.json"))
            .unwrap_or_else(|e| panic!("{e}\n{}", show(&out)));
    let json: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(json.keys().skip(1).collect::<Vec<_>>(), ["1", "4", "16"]);
    let mxfp4 = results.path().join("gptoss-mxfp4/cpu-interpreter");
    let best = std::fs::read_to_string(mxfp4.join("best.csv")).unwrap();
    // One best per shape (M = 1, 4, 16) and method: the method is the 9th column.
    for method in ["triton", "triton_dot_scaled"] {
        let rows = best.lines().filter(|l| l.split(',').nth(8) == Some(method));
        assert_eq!(rows.count(), 3, "{best}");
    }
    // K split over programs only at decode sizes: M * topk <= 8 is M = 1 and 4 here (topk 2).
    let split = best
        .lines()
        .filter(|l| l.split(',').nth(8) == Some("triton_ptx_split"));
    assert_eq!(split.count(), 2, "{best}");
    // The one-token kernel likewise, with one-slot blocks (the config is JSON in a quoted CSV field).
    let gemv: Vec<&str> = best
        .lines()
        .filter(|l| l.split(',').nth(8) == Some("triton_gemv"))
        .collect();
    assert_eq!(gemv.len(), 2, "{best}");
    // GEMV 1 or 2 (under the interpreter, 2 runs 1's arithmetic: PTX does not run there).
    assert!(
        gemv.iter().all(
            |l| (l.contains(r#""GEMV"":1"#) || l.contains(r#""GEMV"":2"#))
                && l.contains(r#""BLOCK_SIZE_M"":1,"#)
        ),
        "{best}"
    );
    assert!(!mxfp4.join("vllm").exists());
}

#[test]
fn quantised_configs_go_to_files_named_with_their_block_shapes() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let out = tunelab(
        &py,
        results.path(),
        &["run", "tests/fixtures/runs/fp8_block_moe.yaml"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let dir = results.path().join("fp8-block-moe/cpu-interpreter/vllm");
    let text = std::fs::read_to_string(
        dir.join("E=4,N=128,device_name=cpu,dtype=fp8_w8a8,block_shape=[128,128].json"),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", show(&out)));
    let json: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(json.keys().skip(1).collect::<Vec<_>>(), ["1", "6"]);

    // The a8w8 block-scale GEMM's M buckets, in the file aiter's gemm_a8w8_blockscale opens.
    let out = tunelab(&py, results.path(), &["run", "experiments/gemm-a8w8.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let path = results
        .path()
        .join("gemm-a8w8/cpu-interpreter/triton/cpu-GEMM-A8W8_BLOCKSCALE-N=96-K=256.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}\n{}", show(&out)));
    let json: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(
        json.keys().collect::<Vec<_>>(),
        ["M_LEQ_1", "M_LEQ_16", "any"]
    );
    assert!(json
        .values()
        .all(|c| c["NUM_KSPLIT"].is_i64() && c["BLOCK_SIZE_K"] == 128));
}

#[test]
fn an_only_filter_for_moe_fields_leaves_the_attention_companion_out() {
    let Some(py) = python() else { return };
    let check_only = |filter: &str| {
        let results = tempfile::tempdir().unwrap();
        let out = tunelab(
            &py,
            results.path(),
            &[
                "run",
                "experiments/gptoss.yaml",
                "--only",
                filter,
                "--mode",
                "check",
            ],
        )
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", show(&out));
        (results, out)
    };

    // Each filter names a method too (torch, which the flagship and the
    // attention companion have): what is asserted is which companions run,
    // and the quantised companions' kernels take the interpreter a minute.
    // M is a field of both: the companion runs too.
    let (results, _) = check_only("M=1,method=torch");
    assert!(results
        .path()
        .join("gptoss-attention/cpu-interpreter")
        .is_dir());

    // M=4 is a shape of the MoE only: the companion would have no job.
    let (results, out) = check_only("M=4,method=torch");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "gptoss-attention.yaml not run: `--only M=4,method=torch` leaves none of its jobs"
        ),
        "{}",
        show(&out)
    );
    assert!(!results.path().join("gptoss-attention").exists());

    let (results, out) = check_only("E=8,method=torch");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("gptoss-attention.yaml not run: --only names fields it does not have"),
        "{}",
        show(&out)
    );
    assert!(!results.path().join("gptoss-attention").exists());
}

#[test]
fn check_and_bench_modes_and_use_best() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let dir = results.path().join("quickstart/cpu-interpreter");

    let out = tunelab(
        &py,
        results.path(),
        &["run", "experiments/quickstart.yaml", "--mode", "check"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let checked = jobs(&journal(&dir)).len();
    assert!(jobs(&journal(&dir))
        .iter()
        .filter(|j| j["method"] != "cuda")
        .all(|j| j["status"] == "checked" && j["stats"].is_null() && j["check"]["passed"] == true));

    // Bench: each method once per shape (the triton baseline, torch's one config).
    let out = tunelab(
        &py,
        results.path(),
        &["run", "experiments/quickstart.yaml", "--mode", "bench"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let timed: Vec<serde_json::Value> = jobs(&journal(&dir))
        .into_iter()
        .skip(checked)
        .filter(|j| j["method"] != "cuda")
        .cloned()
        .collect();
    assert_eq!(timed.len(), 4, "2 shapes x (triton baseline + torch)");
    assert!(timed
        .iter()
        .all(|j| j["status"] == "ok" && (j["baseline"] == true || j["method"] == "torch")));

    // Tune, then re-run only the recorded bests elsewhere.
    let out = tunelab(&py, results.path(), &["run", "experiments/quickstart.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let elsewhere = tempfile::tempdir().unwrap();
    let out = tunelab(
        &py,
        elsewhere.path(),
        &[
            "run",
            "experiments/quickstart.yaml",
            "--use-best",
            dir.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let rerun = jobs(&journal(
        &elsewhere.path().join("quickstart/cpu-interpreter"),
    ))
    .iter()
    .filter(|j| j["method"] != "cuda")
    .count();
    assert!(
        (2..=6).contains(&rerun),
        "bests and baselines only, got {rerun}"
    );
}

/// A surrogate search records the configs it did not measure as skipped; a
/// later grid run measures exactly those, and a later surrogate run does not.
#[test]
fn configs_the_surrogate_skipped_run_under_grid_later() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let dir = results.path().join("quickstart/cpu-interpreter");
    let run = |strategy: &str| {
        let set = format!("search.strategy={strategy}");
        let out = tunelab(
            &py,
            results.path(),
            &[
                "run",
                "experiments/quickstart.yaml",
                "--set",
                &set,
                "--set",
                "search.budget=1",
            ],
        )
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", show(&out));
        // The CUDA method's jobs (unavailable without a GPU) are tried at every run: left out.
        journal(&dir)
            .into_iter()
            .filter(|r| r["type"] == "job" && r["method"] != "cuda")
            .collect::<Vec<_>>()
    };
    let first = run("surrogate");
    let skipped: Vec<&serde_json::Value> =
        first.iter().filter(|r| r["status"] == "skipped").collect();
    assert!(!skipped.is_empty(), "budget 1 leaves configs unmeasured");
    assert!(skipped
        .iter()
        .all(|r| r["stats"].is_null() && r["check"].is_null()));

    assert_eq!(
        run("surrogate").len(),
        first.len(),
        "nothing new for the surrogate"
    );

    let after_grid = run("grid");
    for s in &skipped {
        let id = &s["job_id"];
        let last = after_grid
            .iter()
            .rev()
            .find(|r| &r["job_id"] == id)
            .unwrap();
        assert_eq!(last["status"], "ok", "grid measured the skipped job {id}");
    }
}

/// A journal that cannot be written (the disk is full) ends the run with an
/// error and its lock released; it must not hang.
#[test]
fn a_failed_journal_write_ends_the_run() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_tunelab");
    let started = Instant::now();
    // 4 KiB of file size: the header and a few jobs fit, the rest do not.
    let script = format!(
        "trap '' XFSZ; ulimit -f 4; exec '{bin}' run experiments/quickstart.yaml --results-dir '{}' --python '{py}' --interpret --quiet",
        results.path().display()
    );
    let mut child = Command::new("bash")
        .args(["-c", &script])
        .current_dir(repo())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the run hung after its journal stopped taking writes");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("cannot write"), "{stderr}");
    let dir = results.path().join("quickstart/cpu-interpreter");
    assert!(!dir.join(".lock").exists(), "the lock is released");
}

/// `run --compare-to FILE` times a consumer's shipped configs as a method of
/// their own, in the tuned method's kernel, one config per shape by the
/// consumer's nearest-M rule; `tunelab compare FILE DIR` then compares.
#[test]
fn a_shipped_file_is_timed_beside_the_tuned_method_and_compared() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let file = repo().join("tests/fixtures/compare/E=8,N=32,device_name=cpu.json");
    let out = tunelab(
        &py,
        results.path(),
        &["run", "tests/fixtures/runs/compare_to.yaml"],
    )
    .arg("--compare-to")
    .arg(&file)
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let dir = results.path().join("compare-to/cpu-interpreter");
    let entries = journal(&dir);
    assert_eq!(entries[0]["compared"][0]["method"], "shipped E=8,N=32");
    assert_eq!(entries[0]["compared"][0]["against"], "triton_vllm");
    let shipped: Vec<_> = jobs(&entries)
        .into_iter()
        .filter(|j| j["method"] == "shipped E=8,N=32")
        .collect();
    assert_eq!(shipped.len(), 2, "one job per shape");
    for j in &shipped {
        assert_eq!(
            j["kernel"], "fused_moe_vllm",
            "run in the kernel and call of the method that writes vLLM files"
        );
        assert_eq!(j["status"], "ok", "{j}");
        // M=1 takes the file's "1" entry, M=16 its "16" entry (BLOCK_SIZE_K 64 and 32).
        let want = if j["shape"]["M"] == 1 { 64 } else { 32 };
        assert_eq!(j["config"]["BLOCK_SIZE_K"], want, "{j}");
    }
    let compare = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .arg("compare")
        .arg(&file)
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&compare.stdout);
    assert_eq!(compare.status.code(), Some(0), "{}", show(&compare));
    assert!(text.contains("geomean speedup over 2 shapes"), "{text}");
}

/// The workbench without a GPU: an `ir` output keeps the winners' kernels,
/// compiled for the GPU `--ir-target` names, with an index made from the
/// journal; an `ir:` method is skipped with its reason (the interpreter has
/// no IR to run), and the run still succeeds.
#[test]
fn ir_is_kept_for_a_named_gpu_and_ir_methods_are_skipped_in_the_interpreter() {
    let Some(py) = python() else { return };
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        work.path().join("matmul_kernel.ttgir"),
        "module {\n  tt.func public @matmul_kernel() {\n    tt.return\n  }\n}\n",
    )
    .unwrap();
    let manifest = work.path().join("workbench.yaml");
    std::fs::write(
        &manifest,
        r#"
experiment: workbench
problem: gemm
shapes:
  list: [{M: 32, N: 32, K: 32, dtype: fp16}]
methods:
  triton:
    kind: triton
    kernel: matmul
    params: {BLOCK_SIZE_M: 32, BLOCK_SIZE_N: 32, BLOCK_SIZE_K: 16, GROUP_SIZE_M: 1, num_stages: 2}
    space: {num_warps: [4, 8], maxnreg: [96, 128]}
  edited:
    kind: triton
    kernel: matmul
    ir: matmul_kernel.ttgir
    params: {BLOCK_SIZE_M: 32, BLOCK_SIZE_N: 32, BLOCK_SIZE_K: 16, GROUP_SIZE_M: 1, num_warps: 4, num_stages: 2}
search: {strategy: grid}
outputs:
  - {format: jobs_csv, path: jobs.csv}
  - {format: ir, path: kernels}
  - {format: report, path: report.md}
"#,
    )
    .unwrap();
    let results = work.path().join("results");
    let out = tunelab(
        &py,
        &results,
        &[
            "run",
            manifest.to_str().unwrap(),
            "--ir-target",
            "cuda:90:32",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let dir = results.join("workbench/cpu-interpreter");
    let entries = journal(&dir);
    let edited: Vec<_> = jobs(&entries)
        .into_iter()
        .filter(|j| j["method"] == "edited")
        .collect();
    assert_eq!(edited.len(), 1);
    assert_eq!(edited[0]["status"], "skipped");
    assert!(
        edited[0]["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("runs from IR (matmul_kernel.ttgir), which needs a GPU"),
        "{}",
        edited[0]
    );
    // The interpreter compiles nothing: its jobs record no kernels.
    assert!(jobs(&entries)
        .iter()
        .all(|j| j["kernels"] == serde_json::json!([])));

    let kept = dir.join("kernels/M=32,N=32,K=32,dtype=fp16/triton");
    for file in [
        "job.json",
        "matmul_kernel.ttgir",
        "matmul_kernel.ptx",
        "matmul_kernel.cubin",
        "matmul_kernel.json",
    ] {
        assert!(kept.join(file).is_file(), "{file}: {}", show(&out));
    }
    let about: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(kept.join("job.json")).unwrap()).unwrap();
    assert_eq!(about["method"], "triton");
    assert!(about["kernels"][0]["n_regs"].as_u64().unwrap() > 0);
    assert!(std::fs::read_to_string(kept.join("matmul_kernel.ptx"))
        .unwrap()
        .contains(".target sm_90a"));
    // A compile option in the space (maxnreg) is a config value the worker
    // passes to Triton: the kept binary was compiled under the winner's.
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(kept.join("matmul_kernel.json")).unwrap())
            .unwrap();
    assert_eq!(meta["metadata"]["maxnreg"], about["config"]["maxnreg"]);
    assert!(
        std::fs::read_to_string(kept.join("matmul_kernel.ptx"))
            .unwrap()
            .contains(&format!(".maxnreg {}", about["config"]["maxnreg"])),
        "the PTX carries the register cap"
    );
    let index = std::fs::read_to_string(dir.join("kernels/index.md")).unwrap();
    assert!(
        index.contains("[M=32,N=32,K=32,dtype=fp16/triton](M=32,N=32,K=32,dtype=fp16/triton/)"),
        "{index}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ir: kept the kernels of 1 winner"));
}

#[test]
fn progress_goes_to_a_log_as_plain_lines_when_stderr_is_not_a_terminal() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    // As `nohup tunelab run ... > log 2>&1` would: both streams to pipes,
    // no --quiet.
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(repo())
        .args(["run", "tests/fixtures/runs/slow.yaml", "--results-dir"])
        .arg(results.path())
        .args(["--python", &py, "--interpret"])
        .env("PYTHONPATH", repo().join("tests/fixtures/problems"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("progress: "))
        .collect();
    // Six jobs: a line at each tenth of them (every job here), and the last.
    assert!(lines.len() >= 6, "progress lines:\n{stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("3/6 jobs done (50 %), 0 failed") && l.contains("ETA ")),
        "{stderr}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("progress: 6/6 jobs done, 0 failed, in ")),
        "a final summary line:\n{stderr}"
    );
    for text in [&out.stdout, &out.stderr] {
        let text = String::from_utf8_lossy(text);
        assert!(
            text.chars().all(|c| c == '\n' || !c.is_control()),
            "no control characters (escape codes, carriage returns) in a log:\n{text:?}"
        );
    }
}
