//! `tunelab compare`: verdicts from confidence intervals, the geometric mean,
//! and the exit status a CI job fails on.

use std::path::{Path, PathBuf};
use std::process::Command;

use tunelab::emit::compare::between;
use tunelab::measure::Verdict;
use tunelab::store::{journal, Entry, Results};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/journals/gemm.jsonl")
}

fn load() -> Results {
    journal::read_file(&fixture()).unwrap().0
}

/// A copy of the fixture journal whose `method`'s timings (and finalist
/// re-timings) are scaled by `factor`.
fn scaled(dir: &Path, method: &str, factor: f64) -> PathBuf {
    let mut results = load();
    let ids: Vec<String> = results
        .jobs
        .iter()
        .filter(|j| j.method == method)
        .map(|j| j.job_id.clone())
        .collect();
    let scale = |s: &mut tunelab::measure::Stats| {
        for v in [
            &mut s.median_us,
            &mut s.ci_low_us,
            &mut s.ci_high_us,
            &mut s.min_us,
            &mut s.q1_us,
            &mut s.q3_us,
            &mut s.mean_us,
        ] {
            *v *= factor;
        }
    };
    for j in results.jobs.iter_mut().filter(|j| j.method == method) {
        if let Some(s) = &mut j.stats {
            scale(s);
        }
    }
    for f in results
        .finals
        .iter_mut()
        .filter(|f| ids.contains(&f.job_id))
    {
        scale(&mut f.stats);
    }
    let path = dir.join("journal.jsonl");
    let mut lines =
        vec![
            serde_json::to_string(&Entry::Run(Box::new(results.header.clone().unwrap()))).unwrap(),
        ];
    lines.extend(
        results
            .jobs
            .iter()
            .map(|j| serde_json::to_string(&Entry::Job(Box::new(j.clone()))).unwrap()),
    );
    lines.extend(
        results
            .finals
            .iter()
            .map(|f| serde_json::to_string(&Entry::Final(f.clone())).unwrap()),
    );
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn a_run_against_itself_is_the_same_everywhere() {
    let r = load();
    let c = between(&r, &r, "a", "b");
    assert!(!c.rows.is_empty());
    assert!(c.rows.iter().all(|row| row.verdict == Verdict::Same));
    assert!((c.geomean_speedup().unwrap() - 1.0).abs() < 1e-12);
    assert!(c.regressions(0.0).is_empty());
}

#[test]
fn a_ten_percent_slowdown_is_slow_and_fails_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let slower = scaled(dir.path(), "triton", 1.10);
    let c = between(&load(), &journal::read_file(&slower).unwrap().0, "a", "b");
    let triton: Vec<_> = c.rows.iter().filter(|r| r.new_method == "triton").collect();
    assert!(
        triton.iter().all(|r| r.verdict == Verdict::Slow),
        "{triton:?}"
    );
    assert!(c
        .rows
        .iter()
        .filter(|r| r.new_method != "triton")
        .all(|r| r.verdict == Verdict::Same));

    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tunelab"))
            .arg("compare")
            .arg(fixture())
            .arg(&slower)
            .args(extra)
            .output()
            .unwrap()
    };
    let gated = run(&["--fail-on-slower", "2%"]);
    let text = String::from_utf8_lossy(&gated.stdout);
    assert_eq!(gated.status.code(), Some(5), "{text}");
    assert!(
        text.contains("more than 2 % slower") && text.contains("SLOW"),
        "{text}"
    );
    assert!(text.contains("+10.0 %"), "{text}");
    // The same slowdown under a looser gate passes.
    assert_eq!(run(&["--fail-on-slower", "15%"]).status.code(), Some(0));
    assert_eq!(run(&[]).status.code(), Some(0));
    let bad = run(&["--fail-on-slower", "two"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn a_shipped_file_the_run_did_not_time_is_refused_with_the_fix() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/compare/E=8,N=32,device_name=cpu.json");
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .arg("compare")
        .arg(&file)
        .arg(fixture())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--compare-to"), "{stderr}");
}
