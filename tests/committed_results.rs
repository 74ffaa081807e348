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

#[test]
fn every_committed_results_directory_regenerates_byte_for_byte() {
    let mut dirs = Vec::new();
    journal_dirs(&results_root(), &mut dirs);
    assert!(!dirs.is_empty(), "results/ holds committed runs");
    let mut checked = 0;
    for dir in &dirs {
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
            continue;
        }
        for out in tunelab::emit::render_outputs(&results).unwrap() {
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
    }
    assert!(checked > 0);
}
