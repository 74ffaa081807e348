//! `tunelab report` and `tunelab pack`: what is done with a results
//! directory after its runs.

use std::path::{Path, PathBuf};

use super::Failure;
use crate::exit;
use crate::store;

/// Reads a results directory's journal and writes every output it lists.
pub(super) fn write_outputs(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let (results, warnings) =
        store::journal::read(dir).map_err(|e| Failure::environment(format!("error: {e}")))?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let written = crate::emit::write_outputs(&results, dir).map_err(|e| match e {
        // The results directory is not fit to write in: the environment's fault.
        crate::emit::EmitError::Write(crate::store::results_dir::WriteError::Link { .. }) => {
            Failure::environment(format!("error: writing outputs: {e}"))
        }
        e => Failure::internal(format!("error: writing outputs: {e}")),
    })?;
    for note in crate::emit::aiter::notes(&results) {
        eprintln!("note: {note}");
    }
    Ok(written)
}

fn require_journal(dir: &Path) -> Result<(), Failure> {
    if store::journal::exists(dir) {
        return Ok(());
    }
    let what = if !dir.exists() {
        format!("no such folder: {}", dir.display())
    } else if !dir.is_dir() {
        format!("{} is a file, not a results folder", dir.display())
    } else {
        format!(
            "no journal in {} (a results folder holds {} or {})",
            dir.display(),
            store::JOURNAL,
            store::PACKED_JOURNAL
        )
    };
    Err(Failure::bad_input(format!(
        "error: {what}\n  = help: pass a results folder such as results/quickstart/NVIDIA_H100_80GB_HBM3"
    )))
}

pub(super) fn report(dir: &Path) -> Result<i32, Failure> {
    require_journal(dir)?;
    for p in write_outputs(dir)? {
        say!("{}", p.display());
    }
    Ok(exit::OK)
}

pub(super) fn pack(dirs: &[PathBuf]) -> Result<i32, Failure> {
    for dir in dirs {
        require_journal(dir)?;
    }
    for dir in dirs {
        let (before, after) =
            store::packed::pack(dir).map_err(|e| Failure::environment(format!("error: {e}")))?;
        say!(
            "{}: {} -> {} ({:.1} MB -> {:.1} MB)",
            dir.display(),
            store::JOURNAL,
            store::PACKED_JOURNAL,
            before as f64 / 1e6,
            after as f64 / 1e6
        );
    }
    Ok(exit::OK)
}
