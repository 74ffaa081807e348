//! Comparisons: NEW against BASE, per shape. A row is FAST, SAME or SLOW by
//! the overlap of the two medians' 95 % confidence intervals
//! (`measure::verdict`); the summary is the geometric mean of the speedups
//! (base time / new time) and the worst regressions. Rendered as markdown
//! ready to paste into a pull request; `tunelab compare` and the report's
//! summary both use it.
//!
//! Three ways to get the two sides:
//! - [`between`]: two results (two runs of one experiment): per (shape,
//!   method) found in both, the best of each;
//! - [`against_shipped`]: a consumer's shipped file (a vLLM JSON) against a
//!   run that timed its configs (`run --compare-to`): per shape, the tuned
//!   method's best against the shipped config, in the same run and kernel;
//! - [`compared_in_run`]: every file a run timed, as the report shows them.

use std::fmt::Write;

use indexmap::IndexMap;
use serde_json::Value as Json;

use super::num::{compact_config, json_text};
use super::select::{shape_key, Selection, ShapeFields};
use super::shipped::ShippedFile;
use crate::measure::{geomean, verdict, Stats, Verdict};
use crate::store::{JobStatus, Results};

/// One shape (and method) compared.
#[derive(Debug, Clone)]
pub struct Row {
    pub shape: ShapeFields,
    /// What was compared: the method on each side.
    pub base_method: String,
    pub new_method: String,
    pub base: Stats,
    pub new: Stats,
    pub base_config: IndexMap<String, Json>,
    pub new_config: IndexMap<String, Json>,
    pub verdict: Verdict,
}

impl Row {
    /// Base time / new time: above 1 is faster.
    pub fn speedup(&self) -> f64 {
        self.base.median_us / self.new.median_us
    }

    /// New time against base time, as a fraction: +0.03 is 3 % slower.
    pub fn change(&self) -> f64 {
        self.new.median_us / self.base.median_us - 1.0
    }
}

/// NEW against BASE, row by row.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub base_name: String,
    pub new_name: String,
    pub rows: Vec<Row>,
    /// What could not be compared, in words (shapes on one side only, ...).
    pub notes: Vec<String>,
}

impl Comparison {
    pub fn geomean_speedup(&self) -> Option<f64> {
        geomean(self.rows.iter().map(Row::speedup))
    }

    pub fn count(&self, v: Verdict) -> usize {
        self.rows.iter().filter(|r| r.verdict == v).count()
    }

    /// SLOW rows more than `threshold` (a fraction) slower, worst first.
    pub fn regressions(&self, threshold: f64) -> Vec<&Row> {
        let mut rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.verdict == Verdict::Slow && r.change() > threshold)
            .collect();
        rows.sort_by(|a, b| b.change().total_cmp(&a.change()));
        rows
    }

    /// The rows, worst change first.
    fn worst_first(&self) -> Vec<&Row> {
        let mut rows: Vec<&Row> = self.rows.iter().collect();
        rows.sort_by(|a, b| b.change().total_cmp(&a.change()));
        rows
    }

    /// One line: `1.04× geomean over 18 shapes: 5 FAST, 12 SAME, 1 SLOW`.
    pub fn headline(&self) -> String {
        match self.geomean_speedup() {
            None => "nothing to compare".into(),
            Some(g) => format!(
                "{g:.3}× geomean speedup over {}: {} FAST, {} SAME, {} SLOW",
                super::num::count(self.rows.len() as u64, "shape", "shapes"),
                self.count(Verdict::Fast),
                self.count(Verdict::Same),
                self.count(Verdict::Slow)
            ),
        }
    }

    /// Markdown for a pull request: the headline, the regressions beyond
    /// `threshold` (when given), and every row in a collapsed table.
    pub fn markdown(&self, threshold: Option<f64>) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "### tunelab compare: `{}` → `{}`\n",
            self.base_name, self.new_name
        );
        let _ = writeln!(out, "**{}**\n", self.headline());
        let _ = writeln!(
            out,
            "FAST and SLOW: the 95 % confidence intervals of the two medians do not overlap; speedup = base time / new time.\n"
        );
        if let Some(t) = threshold {
            let bad = self.regressions(t);
            if bad.is_empty() {
                let _ = writeln!(out, "No shape is more than {} slower.\n", pct(t));
            } else {
                let _ = writeln!(
                    out,
                    "**{} more than {} slower:**\n",
                    super::num::count(bad.len() as u64, "shape is", "shapes are"),
                    pct(t)
                );
                table(&mut out, &bad);
            }
        }
        let worst: Vec<&Row> = self.worst_first().into_iter().take(5).collect();
        if threshold.is_none() && !worst.is_empty() {
            let _ = writeln!(out, "Worst shapes:\n");
            table(&mut out, &worst);
        }
        if !self.rows.is_empty() {
            let _ = writeln!(
                out,
                "<details><summary>All {}</summary>\n",
                super::num::count(self.rows.len() as u64, "row", "rows")
            );
            table(&mut out, &self.rows.iter().collect::<Vec<_>>());
            let _ = writeln!(out, "</details>\n");
        }
        for note in &self.notes {
            let _ = writeln!(out, "- {note}");
        }
        out.trim_end().to_string() + "\n"
    }
}

fn pct(fraction: f64) -> String {
    let p = fraction * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0} %")
    } else {
        format!("{p:.1} %")
    }
}

fn table(out: &mut String, rows: &[&Row]) {
    let methods_differ = rows.iter().any(|r| r.base_method != r.new_method);
    let _ = writeln!(
        out,
        "| shape | {}base µs | new µs | change | speedup | verdict | base config | new config |",
        if methods_differ { "" } else { "method | " }
    );
    let _ = writeln!(
        out,
        "| --- | {}---: | ---: | ---: | ---: | --- | --- | --- |",
        if methods_differ { "" } else { "--- | " }
    );
    for r in rows {
        let shape: Vec<String> = r
            .shape
            .iter()
            .map(|(k, v)| format!("{k}={}", json_text(v)))
            .collect();
        let method = if methods_differ {
            String::new()
        } else {
            format!("{} | ", r.new_method)
        };
        let _ = writeln!(
            out,
            "| {} | {method}{:.2} | {:.2} | {:+.1} % | {:.3}× | {} | {} | {} |",
            shape.join(" "),
            r.base.median_us,
            r.new.median_us,
            r.change() * 100.0,
            r.speedup(),
            r.verdict.as_str(),
            compact_config(&r.base_config),
            compact_config(&r.new_config)
        );
    }
    out.push('\n');
}

/// Two runs of one experiment: per (shape, method) with a best on both
/// sides, best against best.
pub fn between(base: &Results, new: &Results, base_name: &str, new_name: &str) -> Comparison {
    let (b, n) = (Selection::new(base), Selection::new(new));
    let mut rows = Vec::new();
    let mut only_base = 0;
    for bs in &b.shapes {
        let Some(ns) = n.shapes.iter().find(|s| s.key == bs.key) else {
            only_base += 1;
            continue;
        };
        for bm in &bs.methods {
            let (Some(bb), Some(nb)) = (bm.best, ns.method(bm.method).and_then(|m| m.best)) else {
                continue;
            };
            rows.push(Row {
                shape: bs.shape.clone(),
                base_method: bm.method.to_string(),
                new_method: bm.method.to_string(),
                base: bb.stats.clone(),
                new: nb.stats.clone(),
                base_config: bb.job.config.clone(),
                new_config: nb.job.config.clone(),
                verdict: verdict(bb.stats, nb.stats),
            });
        }
    }
    let only_new = n
        .shapes
        .iter()
        .filter(|s| !b.shapes.iter().any(|x| x.key == s.key))
        .count();
    let mut notes = Vec::new();
    if only_base > 0 {
        notes.push(format!(
            "{only_base} shapes are only in the base and not compared."
        ));
    }
    if only_new > 0 {
        notes.push(format!(
            "{only_new} shapes are only in the new results and not compared."
        ));
    }
    Comparison {
        base_name: base_name.into(),
        new_name: new_name.into(),
        rows,
        notes,
    }
}

/// A consumer's shipped file against the run that timed its configs: per
/// shape of the file, the tuned method's best against the shipped config's
/// job. The configs are found in the run's `--compare-to` method for the
/// file, else among the tuned method's own jobs (a grid that covered them).
pub fn against_shipped(
    file: &ShippedFile,
    new: &Results,
    new_name: &str,
) -> Result<Comparison, String> {
    let header = new
        .header
        .as_ref()
        .ok_or("the results have no run header")?;
    let file_name = file
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let compared = header.compared.iter().find(|c| {
        std::path::Path::new(&c.file)
            .file_name()
            .is_some_and(|n| n.to_string_lossy() == file_name)
    });
    let tuned = match compared {
        Some(c) => c.against.clone(),
        None => header
            .outputs
            .iter()
            .find(|o| o.format == file.format)
            .and_then(|o| o.method.clone())
            .ok_or(format!(
                "the run did not time {file_name}'s configs and names no method for its format: re-run with --compare-to {}",
                file.path.display()
            ))?,
    };
    let sel = Selection::new(new);
    let fixed = file.fixed_configs();
    let mut rows = Vec::new();
    let mut missing = Vec::new();
    for s in &sel.shapes {
        let Some(config) = fixed.config_for(s.shape) else {
            continue;
        };
        let Some(best) = s.method(&tuned).and_then(|m| m.best) else {
            continue;
        };
        // The shipped config's timing: the compared method's job, or a job of
        // the tuned method with exactly that config.
        let shipped = s
            .methods
            .iter()
            .filter(|m| compared.is_some_and(|c| c.method == m.method) || m.method == tuned)
            .flat_map(|m| m.jobs.iter())
            .find(|j| {
                j.status == JobStatus::Ok
                    && j.stats.is_some()
                    && config.iter().all(|(k, v)| j.config.get(k) == Some(v))
            });
        let Some(shipped) = shipped else {
            missing.push(shape_key(s.shape));
            continue;
        };
        let base_stats = sel
            .final_of(&shipped.job_id)
            .map(|f| f.stats.clone())
            .or_else(|| shipped.stats.clone())
            .expect("filtered on stats");
        rows.push(Row {
            shape: s.shape.clone(),
            base_method: shipped.method.clone(),
            new_method: tuned.clone(),
            verdict: verdict(&base_stats, best.stats),
            base: base_stats,
            new: best.stats.clone(),
            base_config: config.clone(),
            new_config: best.job.config.clone(),
        });
    }
    if rows.is_empty() {
        return Err(format!(
            "no shape of the run has both a timed `{tuned}` and {file_name}'s config: re-run with --compare-to {}",
            file.path.display()
        ));
    }
    let mut notes = Vec::new();
    if !missing.is_empty() {
        notes.push(format!(
            "{} of the file's shapes have no timing of its config in this run.",
            missing.len()
        ));
    }
    if file.device_name != header.device.vllm_name {
        notes.push(format!(
            "The file was tuned for {}; this run timed it on {}.",
            file.device_name, header.device.vllm_name
        ));
    }
    Ok(Comparison {
        base_name: file_name,
        new_name: new_name.into(),
        rows,
        notes,
    })
}

/// Every file a run timed with `--compare-to`, each against the tuned method
/// it ran beside: what the report's summary shows.
pub fn compared_in_run(results: &Results) -> Vec<(String, Comparison)> {
    let Some(header) = &results.header else {
        return Vec::new();
    };
    let sel = Selection::new(results);
    let mut out = Vec::new();
    for c in &header.compared {
        let mut rows = Vec::new();
        for s in &sel.shapes {
            let (Some(base), Some(new)) = (
                s.method(&c.method).and_then(|m| m.best),
                s.method(&c.against).and_then(|m| m.best),
            ) else {
                continue;
            };
            rows.push(Row {
                shape: s.shape.clone(),
                base_method: c.method.clone(),
                new_method: c.against.clone(),
                verdict: verdict(base.stats, new.stats),
                base: base.stats.clone(),
                new: new.stats.clone(),
                base_config: base.job.config.clone(),
                new_config: new.job.config.clone(),
            });
        }
        out.push((
            c.file.clone(),
            Comparison {
                base_name: c.file.clone(),
                new_name: c.against.clone(),
                rows,
                notes: Vec::new(),
            },
        ));
    }
    out
}

/// BASE against NEW as `tunelab compare` takes them: each a results directory
/// or a journal file, or BASE a consumer's shipped file (a `.json`) whose
/// configs NEW's run timed (`run --compare-to`). Also returns the warnings
/// of reading the journals; the error says which path and why.
pub fn from_paths(
    base: &std::path::Path,
    new: &std::path::Path,
) -> Result<(Comparison, Vec<String>), String> {
    let mut warnings = Vec::new();
    let mut read = |path: &std::path::Path| -> Result<Results, String> {
        let read = if path.is_dir() {
            crate::store::journal::read(path)
        } else {
            crate::store::journal::read_file(path)
        };
        let (results, w) = read.map_err(|e| format!("{}: {e}", path.display()))?;
        warnings.extend(w.into_iter().map(|w| w.to_string()));
        Ok(results)
    };
    let new_results = read(new)?;
    let is_shipped = base.is_file() && base.extension().is_some_and(|e| e == "json");
    let comparison = if is_shipped {
        let shipped =
            super::shipped::read(base).map_err(|why| format!("{}: {why}", base.display()))?;
        against_shipped(&shipped, &new_results, &new.display().to_string())?
    } else {
        let base_results = read(base)?;
        between(
            &base_results,
            &new_results,
            &base.display().to_string(),
            &new.display().to_string(),
        )
    };
    Ok((comparison, warnings))
}
