//! `tunelab ab`: two sides timed against each other in one run, in Triton's
//! interpreter with real workers (timings mean nothing there; the pipeline,
//! the records, the report and the gate are what is tested), and its bad
//! input, which needs no worker.
//!
//! The interpreter tests need a Python with torch and triton, named by
//! TUNELAB_TEST_PYTHON (`just test` sets it); without one they say so and
//! pass vacuously.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

fn of_type<'a>(entries: &'a [serde_json::Value], t: &str) -> Vec<&'a serde_json::Value> {
    entries.iter().filter(|e| e["type"] == t).collect()
}

/// Only the Triton GEMM, on one of the interpreter's shapes: one pair,
/// and the fewest rounds (one more where the interpreter's wall-clock noise
/// leaves the verdict AMBIGUOUS).
const ONLY: &[&str] = &[
    "--only",
    "method=triton,M=32",
    "--aa-rounds",
    "1",
    "--rounds",
    "2",
    "--extra-rounds",
    "1",
];

fn ab(py: &str, results: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["ab", "experiments/quickstart.yaml"];
    args.extend_from_slice(ONLY);
    args.extend_from_slice(extra);
    tunelab(py, results, &args).output().unwrap()
}

#[test]
fn an_a_b_in_the_interpreter_is_journaled_reported_resumed_planted_and_swapped() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    // The picks: a run of the experiment (its results directory is side A's
    // and B's default).
    let run = tunelab(
        &py,
        results.path(),
        &[
            "run",
            "experiments/quickstart.yaml",
            "--only",
            "method=triton,M=32",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", show(&run));

    // The picks against themselves, with a timeline.
    let trace = results.path().join("ab-trace.json");
    let out = ab(
        &py,
        results.path(),
        &[
            "--fail-on-slower",
            "1000%",
            "--batch",
            "3",
            "--trace",
            trace.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let timeline: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let names: Vec<&str> = timeline["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    for span in ["ab pair", "check", "sample_turns"] {
        assert!(names.contains(&span), "no `{span}` span in {names:?}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("B against A over 1 pair"), "{stdout}");
    assert!(
        stdout.contains("gate: no pair is SLOW by more than 1000 %"),
        "{stdout}"
    );
    let dir: PathBuf = results.path().join("quickstart-ab/cpu-interpreter");
    let entries = journal(&dir);
    assert_eq!(entries[0]["type"], "run");
    assert_eq!(entries[0]["run_mode"], "ab");
    assert_eq!(entries[0]["format"], 5);
    let setup = &entries[1];
    assert_eq!(setup["type"], "ab_setup");
    assert_eq!(
        (
            setup["aa_rounds"].as_u64(),
            setup["rounds"].as_u64(),
            setup["extra_rounds"].as_u64()
        ),
        (Some(1), Some(2), Some(1))
    );
    assert_eq!(setup["interleave"], "samples", "the default");
    assert_eq!(setup["batch"], 3, "--batch");
    let pairs = of_type(&entries, "ab_pair");
    assert_eq!(pairs.len(), 1);
    for p in &pairs {
        assert_eq!(p["setup"], setup["id"]);
        assert!(p["failure"].is_null(), "{p}");
        assert_eq!(p["aa"].as_array().unwrap().len(), 1);
        // Two rounds, and the extra one only where they left it AMBIGUOUS.
        let extra = p["extra_rounds"].as_u64().unwrap_or(0);
        assert!(extra <= 1, "{p}");
        assert_eq!(p["rounds"].as_array().unwrap().len() as u64, 2 + extra);
        // Each round, 3 samples a side.
        assert_eq!(p["a_stats"]["n"].as_u64(), Some(3 * (2 + extra)), "{p}");
        // The Python worker takes turns (sample_turns) in every round.
        for r in p["aa"]
            .as_array()
            .unwrap()
            .iter()
            .chain(p["rounds"].as_array().unwrap())
        {
            assert_eq!(r["turns"], true, "{r}");
        }
        assert_eq!(
            p["a"]["config"], p["b"]["config"],
            "one pick against itself"
        );
        assert_ne!(p["a"]["job_id"], p["b"]["job_id"], "prepared apart");
        assert_eq!(p["b"]["check"]["passed"], true);
        assert!(p["a_stats"]["median_us"].as_f64().unwrap() > 0.0);
    }
    // The report regenerates from the journal alone.
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.starts_with("# A/B: quickstart on cpu"), "{report}");
    assert!(report.contains("## Noise floor") && report.contains("## Machine"));
    assert!(
        report.contains("take turns sample by sample")
            && !report.contains("took a batch of each side"),
        "{report}"
    );
    assert!(
        report.contains("they measure nothing"),
        "says it is the interpreter"
    );
    std::fs::remove_file(dir.join("report.md")).unwrap();
    let regenerated = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .arg("report")
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(regenerated.status.code(), Some(0), "{}", show(&regenerated));
    assert_eq!(
        std::fs::read_to_string(dir.join("report.md")).unwrap(),
        report
    );

    // Again: every pair is recorded, nothing is timed again.
    let again = ab(&py, results.path(), &["--batch", "3"]);
    assert_eq!(again.status.code(), Some(0), "{}", show(&again));
    assert!(String::from_utf8_lossy(&again.stderr).contains("every pair of this A/B is recorded"));
    assert_eq!(of_type(&journal(&dir), "ab_pair").len(), 1);

    // A planted slowdown: B's launches each carry a busy wait of the plant,
    // so every B batch's median is at least the plant (A's median in the A/A
    // rounds, here 100 % of it). With it, where the checkout is a git
    // repository, A's GEMM module as committed at HEAD.
    let git_head = Command::new("git")
        .current_dir(repo())
        .args(["cat-file", "-e", "HEAD:python/tunelab/kernels/matmul.py"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut extra = vec!["--plant-slowdown", "100%", "--interleave", "batches"];
    if git_head {
        extra.extend([
            "--a-code",
            "python/tunelab/kernels/matmul.py=HEAD:python/tunelab/kernels/matmul.py",
        ]);
    }
    let planted = ab(&py, results.path(), &extra);
    assert_eq!(planted.status.code(), Some(0), "{}", show(&planted));
    let entries = journal(&dir);
    let setups = of_type(&entries, "ab_setup");
    let last = setups.last().unwrap();
    assert_eq!(last["plant"], 1.0);
    assert_eq!(
        last["interleave"].as_str(),
        None,
        "batches: the record's default"
    );
    if git_head {
        assert_eq!(last["a"]["code"][0]["module"], "tunelab.kernels.matmul");
        assert_eq!(
            last["a"]["code"][0]["from"],
            "HEAD:python/tunelab/kernels/matmul.py"
        );
    }
    let pairs: Vec<_> = of_type(&entries, "ab_pair")
        .into_iter()
        .filter(|p| p["setup"] == last["id"])
        .collect();
    assert_eq!(pairs.len(), 1, "a new A/B: its own pair");
    for p in &pairs {
        let plant = p["plant_us"].as_f64().unwrap();
        assert!(plant > 0.0, "{p}");
        for r in p["rounds"].as_array().unwrap() {
            assert!(r.get("turns").is_none(), "a batch a side: {r}");
            assert!(
                r["b_us"].as_f64().unwrap() >= plant,
                "{r} under the plant {plant}"
            );
        }
    }
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("B carries a planted slowdown"),
        "the last A/B's report"
    );

    // B's kernel module from another file: a copy that doubles the GEMM's
    // output fails B's check, so the copy is what ran.
    let source = std::fs::read_to_string(repo().join("python/tunelab/kernels/matmul.py")).unwrap();
    let doubled = results.path().join("matmul_doubled.py");
    std::fs::write(
        &doubled,
        source
            + "\n\n_make = make_launcher\n\n\ndef make_launcher(a, b, out, config):\n    run = _make(a, b, out, config)\n\n    def doubled():\n        run()\n        out.mul_(2)\n\n    return doubled\n",
    )
    .unwrap();
    let code = format!("python/tunelab/kernels/matmul.py={}", doubled.display());
    let swapped = ab(&py, results.path(), &["--b-code", &code]);
    assert_eq!(swapped.status.code(), Some(3), "{}", show(&swapped));
    let entries = journal(&dir);
    let last = *of_type(&entries, "ab_setup").last().unwrap();
    assert_eq!(last["b"]["code"][0]["module"], "tunelab.kernels.matmul");
    assert_eq!(last["a"]["code"].as_array().unwrap().len(), 0);
    for p in of_type(&entries, "ab_pair")
        .into_iter()
        .filter(|p| p["setup"] == last["id"])
    {
        assert_eq!(p["failure"]["class"], "mismatch", "{p}");
        assert!(p["failure"]["message"]
            .as_str()
            .unwrap()
            .starts_with("side B:"));
        assert_eq!(
            p["a"]["check"]["passed"], true,
            "A ran the module's own file"
        );
    }
}

#[test]
fn a_side_that_is_not_results_is_bad_input_and_writes_nothing() {
    let results = tempfile::tempdir().unwrap();
    let out = tunelab(
        "python3",
        results.path(),
        &["ab", "experiments/quickstart.yaml", "--a", "no/such/dir"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--a no/such/dir") && stderr.contains("help: a side is"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(results.path()).unwrap().count(),
        0,
        "nothing written"
    );

    // A code side whose file is not a module the workers import.
    let picks = results.path().join("picks");
    let fixture = repo().join("tests/fixtures/journals/gemm.jsonl");
    std::fs::create_dir_all(&picks).unwrap();
    std::fs::copy(&fixture, picks.join("journal.jsonl")).unwrap();
    let out = tunelab(
        "python3",
        results.path(),
        &[
            "ab",
            "experiments/quickstart.yaml",
            "--a",
            picks.to_str().unwrap(),
            "--b-code",
            "README.md=README.md",
        ],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is not a Python module the workers import"),
        "{stderr}"
    );
}
