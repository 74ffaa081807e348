//! Several lanes on one host and shards over several, in interpreter mode:
//! real workers, real journals. Each run's job set is compared with a
//! one-process run's, and no job may run twice.
//!
//! Needs TUNELAB_TEST_PYTHON, as `tests/run_interpreter.rs` does; without it
//! these tests say so and pass vacuously.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod interpreter;
use interpreter::{python, repo, show, tunelab};

fn ok(out: Output) -> Output {
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    out
}

/// Every job record's (job id, lane) in a results directory, live and packed.
fn records(dir: &Path) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(dir.join("journal.jsonl")).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON lines"))
        .filter(|e| e["type"] == "job")
        .map(|e| {
            (
                e["job_id"].as_str().unwrap().to_string(),
                e["lane"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn ids(dir: &Path) -> BTreeSet<String> {
    let all = records(dir);
    let unique: BTreeSet<String> = all.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(
        unique.len(),
        all.len(),
        "no job ran twice in {}",
        dir.display()
    );
    unique
}

/// What one process on one lane runs.
fn reference(py: &str, manifest: &str) -> (tempfile::TempDir, BTreeSet<String>) {
    let results = tempfile::tempdir().unwrap();
    ok(tunelab(py, results.path(), &["run", manifest])
        .output()
        .unwrap());
    let dir = only_results_dir(results.path());
    let set = ids(&dir);
    (results, set)
}

/// The one `<experiment>/<device>` directory under `base`.
fn only_results_dir(base: &Path) -> PathBuf {
    let exp = std::fs::read_dir(base)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    exp.join("cpu-interpreter")
}

#[test]
fn two_interpreter_lanes_run_the_plan_once_between_them() {
    let Some(py) = python() else { return };
    let manifest = "tests/fixtures/runs/two_lanes.yaml";
    let (_one, want) = reference(&py, manifest);
    let results = tempfile::tempdir().unwrap();
    // Each worker's first call waits there for the other's: without that, on
    // a loaded machine one lane can finish the plan before the other is up.
    let meet = tempfile::tempdir().unwrap();
    let out = ok(
        tunelab(&py, results.path(), &["run", manifest, "--lanes", "2"])
            .env("TUNELAB_TEST_MEET_DIR", meet.path())
            .output()
            .unwrap(),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("interpreter, 2 lanes"),
        "{}",
        show(&out)
    );
    let dir = results.path().join("two-lanes/cpu-interpreter");
    assert_eq!(ids(&dir), want, "the same jobs as one lane");
    let lanes: HashSet<u64> = records(&dir).into_iter().map(|(_, l)| l).collect();
    assert_eq!(lanes, HashSet::from([0, 1]), "both lanes took groups");
    assert!(dir.join("report.md").is_file());
}

#[test]
fn shards_are_disjoint_cover_the_plan_and_merge_into_one_runs_results() {
    let Some(py) = python() else { return };
    let manifest = "tests/fixtures/runs/slow_groups.yaml";
    let (_one, want) = reference(&py, manifest);

    // `plan --shard` lists what `run --shard` runs.
    let planned = |shard: &str| -> BTreeSet<String> {
        let out = ok(Command::new(env!("CARGO_BIN_EXE_tunelab"))
            .current_dir(repo())
            .args(["plan", manifest, "--interpret", "--jobs", "--shard", shard])
            .output()
            .unwrap());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let (p1, p2) = (planned("1/2"), planned("2/2"));
    assert!(p1.is_disjoint(&p2) && !p1.is_empty() && !p2.is_empty());
    assert_eq!(p1.union(&p2).cloned().collect::<BTreeSet<_>>(), want);

    let shards: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    for (k, base) in shards.iter().enumerate() {
        let shard = format!("{}/2", k + 1);
        ok(
            tunelab(&py, base.path(), &["run", manifest, "--shard", &shard])
                .output()
                .unwrap(),
        );
        let got = ids(&base.path().join("slow-groups/cpu-interpreter"));
        assert_eq!(
            got,
            if k == 0 { p1.clone() } else { p2.clone() },
            "shard {shard}"
        );
    }

    let merged = tempfile::tempdir().unwrap();
    let into = merged.path().join("slow-groups/cpu-interpreter");
    let merge = |force: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunelab"));
        cmd.arg("merge");
        for base in &shards {
            cmd.arg(base.path().join("slow-groups/cpu-interpreter"));
        }
        cmd.arg("--into").arg(&into);
        if force {
            cmd.arg("--force");
        }
        cmd.output().unwrap()
    };
    ok(merge(false));
    assert_eq!(ids(&into), want, "the merged job set is one run's");
    assert!(into.join("report.md").is_file() && into.join("jobs.csv").is_file());
    // Merging again adds nothing.
    let again = ok(merge(false));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("0 jobs added"),
        "{}",
        show(&again)
    );
    assert_eq!(ids(&into), want);
}

#[test]
fn journals_of_different_environments_are_refused_unless_forced() {
    let Some(py) = python() else { return };
    let manifest = "tests/fixtures/runs/slow_groups.yaml";
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    for (base, shard) in [(&a, "1/2"), (&b, "2/2")] {
        ok(
            tunelab(&py, base.path(), &["run", manifest, "--shard", shard])
                .output()
                .unwrap(),
        );
    }
    // Shard 2 ran under another torch, as far as its journal says.
    let journal = b.path().join("slow-groups/cpu-interpreter/journal.jsonl");
    let text = std::fs::read_to_string(&journal).unwrap();
    let edited: Vec<String> = text
        .lines()
        .map(|l| {
            let mut e: serde_json::Value = serde_json::from_str(l).unwrap();
            if e["type"] == "run" {
                e["fingerprint"]["torch"] = serde_json::json!("0.0-other");
            }
            e.to_string()
        })
        .collect();
    std::fs::write(&journal, edited.join("\n") + "\n").unwrap();
    let into = tempfile::tempdir().unwrap();
    let out_dir = into.path().join("merged");
    let merge = |force: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunelab"));
        cmd.arg("merge")
            .arg(a.path().join("slow-groups/cpu-interpreter"))
            .arg(b.path().join("slow-groups/cpu-interpreter"))
            .arg("--into")
            .arg(&out_dir);
        if force {
            cmd.arg("--force");
        }
        cmd.output().unwrap()
    };
    let refused = merge(false);
    assert_eq!(refused.status.code(), Some(2), "{}", show(&refused));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("torch") && stderr.contains("0.0-other") && stderr.contains("--force"),
        "{stderr}"
    );
    assert!(!out_dir.exists(), "a refused merge writes nothing");
    ok(merge(true));
    assert_eq!(ids(&out_dir).len(), 12);
}

#[test]
fn a_shard_killed_mid_run_resumes_losing_nothing() {
    let Some(py) = python() else { return };
    let manifest = "tests/fixtures/runs/slow_groups.yaml";
    let results = tempfile::tempdir().unwrap();
    let dir = results.path().join("slow-groups/cpu-interpreter");
    let mut child = tunelab(&py, results.path(), &["run", manifest, "--shard", "1/2"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while records(&dir).len() < 2 {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = records(&dir);
    assert!(before.len() < 6, "killed mid-run: {}", before.len());
    ok(
        tunelab(&py, results.path(), &["run", manifest, "--shard", "1/2"])
            .output()
            .unwrap(),
    );
    let after = records(&dir);
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "recorded jobs are kept"
    );
    let out = ok(Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(repo())
        .args(["plan", manifest, "--interpret", "--jobs", "--shard", "1/2"])
        .output()
        .unwrap());
    let planned: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids(&dir), planned, "the shard's whole share, each job once");
}
