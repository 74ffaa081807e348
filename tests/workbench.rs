//! The kernel workbench's commands and choices (docs/workbench.md): what
//! `tunelab profile` profiles, and what `tunelab ir-pass` and `profile` refuse.
//! Keeping IR end to end is in run_interpreter.rs; the Python halves are
//! tested in python/tests/test_workbench.py.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use tunelab::store::journal;
use tunelab::workbench::profile;

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/journals")
        .join(name)
}

#[test]
fn profile_takes_the_k_fastest_timed_jobs_of_each_shape_and_method() {
    let (results, _) = journal::read_file(&fixture("gemm.jsonl")).unwrap();
    let winners = profile::choose(&results, 1, 20, &HashMap::new()).unwrap();
    let sel = tunelab::emit::Selection::new(&results);
    let groups = sel
        .shapes
        .iter()
        .flat_map(|s| &s.methods)
        .filter(|m| m.best.is_some())
        .count();
    assert_eq!(winners.jobs.len(), groups);
    assert!(winners.jobs.iter().all(|j| j.rank == 1));
    // Each is its group's best, and carries what a worker needs.
    let bests = tunelab::emit::best_job_ids(&results);
    for j in &winners.jobs {
        assert!(bests.contains(j.job["job_id"].as_str().unwrap()));
        assert_eq!(j.job["problem"], "gemm");
        assert!(j.job["method"]["ir"].is_null());
        assert!(j.tolerance["atol"].is_number());
    }
    assert_eq!(
        winners.jobs.iter().filter(|j| j.winner_of_shape).count(),
        sel.shapes
            .iter()
            .filter(|s| s.overall_best().is_some())
            .count()
    );
    let top3 = profile::choose(&results, 3, 20, &HashMap::new()).unwrap();
    assert!(top3.jobs.len() > winners.jobs.len());
    let second = top3.jobs.iter().find(|j| j.rank == 2).expect("a runner-up");
    assert!(second.label.ends_with("#2"), "{}", second.label);
    // Fastest first within a group.
    for pair in top3.jobs.windows(2) {
        if pair[1].rank > 1 {
            assert!(pair[0].median_us <= pair[1].median_us);
        }
    }
    // An ir: method's jobs carry its file.
    let mut files = HashMap::new();
    files.insert("triton".to_string(), Path::new("/x/k.ttgir").to_path_buf());
    let with_ir = profile::choose(&results, 1, 20, &files).unwrap();
    assert!(with_ir
        .jobs
        .iter()
        .filter(|j| j.job["method"]["name"] == "triton")
        .all(|j| j.job["method"]["ir"] == "/x/k.ttgir"));
}

fn tunelab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn ir_pass_refuses_what_it_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let ptx = dir.path().join("k.ptx");
    std::fs::write(&ptx, ".visible .entry k()\n").unwrap();
    let out = tunelab(&["ir-pass", ptx.to_str().unwrap(), "--pass", "coalesce"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a .ttir or .ttgir file, not .ptx"));
    let ttgir = dir.path().join("k.ttgir");
    std::fs::write(&ttgir, "module {}\n").unwrap();
    let out = tunelab(&["ir-pass", ttgir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("name at least one --pass"));
    let out = tunelab(&["ir-pass", "missing.ttgir", "--pass", "coalesce"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn profile_refuses_a_directory_without_gpu_results() {
    let dir = tempfile::tempdir().unwrap();
    let out = tunelab(&["profile", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no journal"));
    // An interpreter run's journal: nothing was measured on a GPU.
    let text = std::fs::read_to_string(fixture("gemm.jsonl"))
        .unwrap()
        .replace(r#""mode":"gpu""#, r#""mode":"interpreter""#);
    std::fs::write(dir.path().join("journal.jsonl"), text).unwrap();
    let out = tunelab(&["profile", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interpreter results"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// With a worker Python but no GPU, profile writes its request and says in
/// one line that it needs a GPU (exit 4).
#[test]
fn profile_without_a_gpu_says_so() {
    let Ok(python) = std::env::var("TUNELAB_TEST_PYTHON") else {
        eprintln!("TUNELAB_TEST_PYTHON is not set: skipping");
        return;
    };
    if Command::new(&python)
        .args([
            "-c",
            "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)",
        ])
        .status()
        .is_ok_and(|s| s.success())
    {
        return; // a GPU machine profiles for real: bench/workbench_gpu.py
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("gemm.jsonl"), dir.path().join("journal.jsonl")).unwrap();
    let out = tunelab(&[
        "profile",
        dir.path().to_str().unwrap(),
        "--python",
        &python,
        "--only",
        "M=32",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("needs a GPU"), "{stderr}");
    let request: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("profile/request.json")).unwrap(),
    )
    .unwrap();
    assert!(request["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|j| j["job"]["shape"]["M"] == 32));
}

#[test]
fn the_report_links_a_profile_summary_beside_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("gemm.jsonl"), dir.path().join("journal.jsonl")).unwrap();
    let report = |dir: &Path| {
        let (results, _) = journal::read(dir).unwrap();
        tunelab::emit::render_outputs(&results)
            .unwrap()
            .into_iter()
            .find(|r| r.path == Path::new("report.md"))
            .unwrap()
            .contents
    };
    assert!(!report(dir.path()).contains("profile/summary.md"));
    std::fs::create_dir(dir.path().join("profile")).unwrap();
    std::fs::write(dir.path().join("profile/summary.md"), "# profiles\n").unwrap();
    assert!(report(dir.path())
        .contains("Profiles of the winners (Proton, Nsight Compute): [profile/summary.md](profile/summary.md)."));
}

/// `--keep-ir` takes its value only after `=`: a manifest after the flag is
/// the manifest.
#[test]
fn keep_ir_reads_its_value_only_after_an_equals_sign() {
    use clap::Parser;
    use tunelab::cli::args::{Cli, Command, KeepIrArg};
    let parse = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
        Command::Run {
            manifest, keep_ir, ..
        } => (manifest, keep_ir),
        _ => unreachable!(),
    };
    let (manifest, keep) = parse(&["tunelab", "run", "--keep-ir", "x.yaml"]);
    assert_eq!(
        (manifest.to_str().unwrap(), keep),
        ("x.yaml", Some(KeepIrArg::Winners))
    );
    let (_, keep) = parse(&["tunelab", "run", "x.yaml", "--keep-ir=all"]);
    assert_eq!(keep, Some(KeepIrArg::All));
    let (_, keep) = parse(&["tunelab", "run", "x.yaml"]);
    assert_eq!(keep, None);
}
