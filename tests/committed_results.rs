//! Committed results are evidence: every results directory under `results/`
//! regenerates its committed outputs byte for byte from its journal alone,
//! and holds what docs/architecture.md ("Results") says a commit holds.

use std::path::{Path, PathBuf};

use tunelab::manifest::OutputFormat;
use tunelab::store::{self, journal};

fn results_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("results")
}

/// Every directory under `results/` that holds a journal.
fn journal_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if journal::exists(dir) {
        out.push(dir.to_path_buf());
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && !path.ends_with("cpu-interpreter") {
            journal_dirs(&path, out);
        }
    }
}

/// The files of a results directory that an output could have written:
/// everything but the journal, traces, worker logs, caches, the files that
/// are never committed (jobs.csv, jobs.json), and the evidence the workbench
/// writes beside the outputs: kept IR (a folder per winner, holding its
/// `job.json`) and profiles (`profile/`, see docs/workbench.md).
fn files_under(root: &Path, dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let kept_ir = path.join("job.json").is_file();
            if !kept_ir && !matches!(name.as_str(), "traces" | "logs" | ".cache" | "profile") {
                out.extend(files_under(root, &path));
            }
        } else if !matches!(
            name.as_str(),
            "journal.jsonl" | "journal.jsonl.gz" | "jobs.csv" | "jobs.json" | ".lock"
        ) {
            out.push(path.strip_prefix(root).unwrap().to_path_buf());
        }
    }
    out
}

/// One results directory's check (see the test below); returns how many
/// committed outputs it compared.
fn regenerates(dir: &Path) -> usize {
    let shown = dir.strip_prefix(results_root()).unwrap().display();
    let (results, warnings) = journal::read(dir).unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(warnings.is_empty(), "{shown}: {warnings:?}");
    assert!(
        !dir.join(store::JOURNAL).exists(),
        "{shown}: commit the journal packed (`tunelab pack {shown}`)"
    );
    // Benchmark evidence (results/bench/) keeps journals the benchmark's
    // own tables were made from; only experiment results commit outputs.
    if dir.starts_with(results_root().join("bench")) {
        return 0;
    }
    let rendered = tunelab::emit::render_outputs(&results).unwrap();
    for file in files_under(dir, dir) {
        assert!(
            rendered.iter().any(|r| r.path == file),
            "{shown}/{}: no output of the journal produces this file; remove it (git rm) or regenerate",
            file.display()
        );
    }
    let mut checked = 0;
    for out in rendered {
        let committed = dir.join(&out.path);
        match out.format {
            // Restate the journal; regenerated on demand, never committed.
            OutputFormat::JobsCsv | OutputFormat::JobsJson => continue,
            _ => {}
        }
        let on_disk = std::fs::read_to_string(&committed).unwrap_or_else(|e| {
            panic!(
                "{shown}/{}: committed output missing ({e})",
                out.path.display()
            )
        });
        assert!(
            on_disk == out.contents,
            "{shown}/{}: differs from what `tunelab report` regenerates; run it and commit the result",
            out.path.display()
        );
        checked += 1;
    }
    checked
}

#[test]
fn every_committed_results_directory_regenerates_byte_for_byte() {
    let mut dirs = Vec::new();
    journal_dirs(&results_root(), &mut dirs);
    assert!(!dirs.is_empty(), "results/ holds committed runs");
    // The directories on every core (each one reads and renders alone).
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let checked: usize = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut checked = 0;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(dir) = dirs.get(i) else { break };
                        checked += regenerates(dir);
                    }
                    checked
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .sum()
    });
    assert!(checked > 0);
}
