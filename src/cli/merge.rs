//! `tunelab merge`: tuned files of one format into one ([`crate::merge`]),
//! with a table of the keys the inputs disagreed on.

use std::path::{Path, PathBuf};

use super::Failure;
use crate::emit::num::us;
use crate::exit;
use crate::merge::{self, MergeError, Outcome};

pub(super) fn merge(into: &Path, inputs: &[PathBuf], force: bool) -> Result<i32, Failure> {
    let dirs = inputs.iter().filter(|p| p.is_dir()).count();
    if dirs > 0 {
        if dirs < inputs.len() {
            return Err(Failure::bad_input(
                "error: merge takes results directories or tuned files, not both\nnothing was written",
            ));
        }
        return merge_results(into, inputs, force);
    }
    if inputs.len() < 2 {
        return Err(Failure::bad_input(
            "error: merging tuned files takes two or more\nnothing was written",
        ));
    }
    if let Some(why) = crate::store::results_dir::runner_file(into) {
        return Err(Failure::bad_input(format!(
            "error: --out: {why}\nnothing was written"
        )));
    }
    let files = inputs;
    let outcome = merge::merge(files, into).map_err(|e| match e {
        MergeError::Input { .. } => Failure::bad_input(format!("error: {e}\nnothing was written")),
        MergeError::Write { .. } => Failure::internal(format!("error: {e}")),
    })?;
    for note in &outcome.notes {
        eprintln!("note: {note}");
    }
    say_raw!("{}", table(&outcome, files));
    Ok(exit::OK)
}

/// Results directories: their journals into OUT's, then OUT's outputs.
fn merge_results(into: &Path, dirs: &[PathBuf], force: bool) -> Result<i32, Failure> {
    let outcome = merge::results::merge(dirs, into, force).map_err(|e| match e {
        MergeError::Input { .. } => Failure::bad_input(format!("error: {e}\nnothing was written")),
        MergeError::Write { .. } => Failure::internal(format!("error: {e}")),
    })?;
    for note in &outcome.notes {
        eprintln!("note: {note}");
    }
    let written = super::results::write_outputs(into)?;
    say!(
        "{}: {} from {} ({} already there, left out); {} in all",
        into.display(),
        crate::emit::num::count(outcome.added_jobs as u64, "job added", "jobs added"),
        crate::emit::num::count(dirs.len() as u64, "directory", "directories"),
        outcome.duplicate_jobs,
        crate::emit::num::count(outcome.total_jobs as u64, "job", "jobs"),
    );
    for p in written {
        say!("  {}", p.display());
    }
    Ok(exit::OK)
}

/// The conflicts as a table, then one line on what was written.
fn table(outcome: &Outcome, files: &[PathBuf]) -> String {
    let mut out = String::new();
    if !outcome.conflicts.is_empty() {
        out.push_str("inputs:\n");
        for (i, f) in files.iter().enumerate() {
            out.push_str(&format!("  [{}] {}\n", i + 1, f.display()));
        }
        let rows: Vec<[String; 4]> = outcome
            .conflicts
            .iter()
            .map(|c| {
                [
                    c.key.clone(),
                    format!("[{}]", c.kept + 1),
                    if c.by_time {
                        "faster".into()
                    } else {
                        "first input (not all measured)".into()
                    },
                    c.entries
                        .iter()
                        .map(|(i, t)| {
                            format!("[{}] {}", i + 1, t.map(us).unwrap_or_else(|| "—".into()))
                        })
                        .collect::<Vec<_>>()
                        .join("  "),
                ]
            })
            .collect();
        let head = ["key", "kept", "why", "time (µs) per input"];
        let width = |i: usize| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([head[i].chars().count()])
                .max()
                .unwrap_or(0)
        };
        let widths = [width(0), width(1), width(2)];
        let line = |cells: [&str; 4]| {
            let mut l = String::from(" ");
            for (i, w) in widths.iter().enumerate() {
                let pad = w - cells[i].chars().count();
                l.push_str(&format!(" {}{}  ", cells[i], " ".repeat(pad)));
            }
            l.push_str(cells[3]);
            l.trim_end().to_string() + "\n"
        };
        out.push_str(&format!("{} conflict(s):\n", outcome.conflicts.len()));
        out.push_str(&line(head));
        for r in &rows {
            out.push_str(&line([&r[0], &r[1], &r[2], &r[3]]));
        }
    }
    let decided = outcome.conflicts.iter().filter(|c| c.by_time).count();
    out.push_str(&format!(
        "{}: {} key(s) from {} file(s) ({}), {} conflict(s): {} decided by measured time, {} kept from the first input\n",
        outcome.written.display(),
        outcome.keys,
        files.len(),
        outcome.format,
        outcome.conflicts.len(),
        decided,
        outcome.conflicts.len() - decided
    ));
    out
}
