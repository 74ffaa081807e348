//! `tunelab compare BASE NEW`: markdown for a pull request, and an exit
//! status a CI job can fail on.

use std::path::Path;

use super::Failure;
use crate::emit::compare::{against_shipped, between, Comparison};
use crate::exit;
use crate::store::{journal, Results};

pub(super) fn compare(
    base: &Path,
    new: &Path,
    fail_on_slower: Option<&str>,
    out: Option<&Path>,
) -> Result<i32, Failure> {
    let threshold = fail_on_slower.map(threshold).transpose()?;
    let new_results = results(new)?;
    let comparison: Comparison = if is_tuned_file(base) {
        let shipped = crate::emit::shipped::read(base)
            .map_err(|why| Failure::bad_input(format!("error: {}: {why}", base.display())))?;
        against_shipped(&shipped, &new_results, &new.display().to_string())
            .map_err(|why| Failure::bad_input(format!("error: {why}")))?
    } else {
        let base_results = results(base)?;
        between(
            &base_results,
            &new_results,
            &base.display().to_string(),
            &new.display().to_string(),
        )
    };
    if comparison.rows.is_empty() {
        return Err(Failure::bad_input(format!(
            "error: {} and {} have no (shape, method) in common",
            base.display(),
            new.display()
        )));
    }
    let text = comparison.markdown(threshold);
    print!("{text}");
    if let Some(path) = out {
        std::fs::write(path, &text).map_err(|e| {
            Failure::internal(format!("error: cannot write {}: {e}", path.display()))
        })?;
    }
    Ok(match threshold {
        Some(t) if !comparison.regressions(t).is_empty() => exit::REGRESSION,
        _ => exit::OK,
    })
}

/// A tuned file a consumer loads (today: a vLLM fused-MoE JSON), not a journal.
fn is_tuned_file(path: &Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e == "json")
}

/// A results directory or a journal file, read.
fn results(path: &Path) -> Result<Results, Failure> {
    let read = if path.is_dir() {
        journal::read(path)
    } else {
        journal::read_file(path)
    };
    let (results, warnings) =
        read.map_err(|e| Failure::bad_input(format!("error: {}: {e}", path.display())))?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    Ok(results)
}

/// `2%` or `0.02` -> 0.02.
fn threshold(text: &str) -> Result<f64, Failure> {
    let t = text.trim();
    let value = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => t.parse::<f64>(),
    };
    match value {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(Failure::bad_input(format!(
            "error: --fail-on-slower {text}: expected a percentage such as `2%` (or a fraction, 0.02)"
        ))),
    }
}
