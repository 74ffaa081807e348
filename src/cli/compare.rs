//! `tunelab compare BASE NEW`: markdown for a pull request, and an exit
//! status a CI job can fail on.

use std::path::Path;

use super::Failure;
use crate::exit;

pub(super) fn compare(
    base: &Path,
    new: &Path,
    fail_on_slower: Option<&str>,
    out: Option<&Path>,
    settings: &crate::config::Settings,
) -> Result<i32, Failure> {
    let threshold = fail_on_slower
        .map(|t| percentage("--fail-on-slower", t))
        .transpose()?;
    if let Some(why) = out.and_then(crate::store::results_dir::runner_file) {
        return Err(Failure::bad_input(format!("error: --out: {why}")));
    }
    if !(settings.run_spread.is_finite() && settings.run_spread >= 0.0) {
        return Err(Failure::bad_input(format!(
            "error: run_spread {}: expected a fraction of 0 or more (0.05 is 5 %)",
            settings.run_spread
        )));
    }
    let options = crate::emit::compare::Options {
        spread: settings.run_spread,
        ..Default::default()
    };
    let (comparison, warnings) = crate::emit::compare::from_paths(base, new, &options)
        .map_err(|why| Failure::bad_input(format!("error: {why}")))?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    if comparison.rows.is_empty() {
        return Err(Failure::bad_input(format!(
            "error: {} and {} have no (shape, method) in common",
            base.display(),
            new.display()
        )));
    }
    let text = comparison.markdown(threshold);
    say_raw!("{text}");
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

/// `2%` or `0.02` -> 0.02; `flag` names the flag in the error.
pub(super) fn percentage(flag: &str, text: &str) -> Result<f64, Failure> {
    let t = text.trim();
    let value = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => t.parse::<f64>(),
    };
    match value {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(Failure::bad_input(format!(
            "error: {flag} {text}: expected a percentage such as `2%` (or a fraction, 0.02)"
        ))),
    }
}
