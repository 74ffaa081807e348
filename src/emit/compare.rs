//! Comparisons: NEW against BASE, per shape and method, as markdown for a
//! pull request; `tunelab compare` and the report's summary use it.
//!
//! Three ways to get the two sides, and what their verdicts can say:
//! - [`between`]: two separate runs of one experiment, best against best
//!   per (shape, method). Separate runs differ by more than either run's
//!   noise (docs/ab.md, "Separate runs"), so a verdict is against a margin
//!   of the larger of the threshold and the run-to-run spread
//!   (`run_spread`), on the interval of the ratio of the two medians,
//!   widened where a run ran under the power cap by the clock's headroom;
//!   FAST / SAME / SLOW / AMBIGUOUS (`measure::paired::equivalence`). The
//!   machines' differences are named.
//! - [`against_shipped`]: a consumer's shipped file against a run that timed
//!   its configs (`run --compare-to`), in the same run and kernel;
//! - [`compared_in_run`]: every file a run timed, as the report shows them.
//!
//! The last two compare timings of one run, taken one after the other, not
//! interleaved: FAST / SAME / SLOW by the overlap of the two medians' 95 %
//! confidence intervals (`measure::verdict`). `tunelab ab` times two sides
//! interleaved, with a noise model (`emit::ab`).

use std::fmt::Write;

use indexmap::IndexMap;
use serde_json::Value as Json;

use super::machine::{differences, Machine};
use super::num::{compact_config, count, json_text};
use super::select::{eligible, fastest, shape_key, Selection, ShapeFields};
use super::shipped::ShippedFile;
use crate::measure::paired::{equivalence, RatioInterval};
use crate::measure::{geomean, verdict, Stats, Verdict};
use crate::store::{JobStatus, Results};

pub use crate::measure::paired::{DEFAULT_RUN_SPREAD, DEFAULT_THRESHOLD};

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
    /// New time / base time with the interval the verdict was judged on
    /// (separate runs); none where the verdict is by interval overlap.
    pub interval: Option<RatioInterval>,
    /// Either side ran under its run's power cap (`machine::CAPPED_BELOW`).
    pub capped: bool,
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

/// What a comparison's verdicts are judged on.
#[derive(Debug, Clone, PartialEq)]
pub enum Basis {
    /// Two separate runs: a margin of the larger of `threshold` and
    /// `spread`, on intervals widened by the clock headroom of capped pairs.
    SeparateRuns {
        threshold: f64,
        spread: f64,
        /// Each run's machine, where its results have a header.
        machines: Option<Box<(Machine, Machine)>>,
    },
    /// Two methods' timings in one run: interval overlap.
    OneRun,
}

/// How separate runs are judged (`tunelab compare`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// The smallest change called FAST or SLOW.
    pub threshold: f64,
    /// How far apart separate runs of one config come out (`run_spread`).
    pub spread: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            threshold: DEFAULT_THRESHOLD,
            spread: DEFAULT_RUN_SPREAD,
        }
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
    pub basis: Basis,
    /// Pairs whose two runs picked the same config, and how many would
    /// have by the fastest alone (`select::fastest`), of those compared.
    pub picks_agree: Option<(usize, usize)>,
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

    /// One line: `1.04× geomean over 18 shapes: 5 FAST, 12 SAME, 1 SLOW`
    /// (and the AMBIGUOUS, where the basis has them).
    pub fn headline(&self) -> String {
        match self.geomean_speedup() {
            None => "nothing to compare".into(),
            Some(g) => {
                let ambiguous = match self.count(Verdict::Ambiguous) {
                    0 => String::new(),
                    n => format!(", {n} AMBIGUOUS"),
                };
                format!(
                    "{g:.3}× geomean speedup over {}: {} FAST, {} SAME, {} SLOW{ambiguous}",
                    count(self.rows.len() as u64, "shape", "shapes"),
                    self.count(Verdict::Fast),
                    self.count(Verdict::Same),
                    self.count(Verdict::Slow),
                )
            }
        }
    }

    /// Markdown for a pull request: the headline, what the verdicts mean,
    /// the machines' differences, the regressions beyond `threshold` (when
    /// given) or the worst rows, and every row in a collapsed table.
    pub fn markdown(&self, threshold: Option<f64>) -> String {
        let mut out = String::new();
        let separate = matches!(self.basis, Basis::SeparateRuns { .. });
        let _ = writeln!(
            out,
            "### tunelab compare: `{}` → `{}`{}\n",
            self.base_name,
            self.new_name,
            if separate { " (separate runs)" } else { "" }
        );
        let _ = writeln!(out, "**{}**\n", self.headline());
        match &self.basis {
            Basis::SeparateRuns {
                threshold: floor,
                spread,
                machines,
            } => {
                let _ = writeln!(
                    out,
                    "These verdicts compare two separate runs, which differ by more than either run's own noise. SAME: the 95 % interval of new time / base time lies within ±{} (the larger of the {} threshold and the run-to-run spread, `run_spread`, set by `--run-spread`); FAST or SLOW: wholly outside it; AMBIGUOUS: across its edge. A pair that ran under the power cap in either run has its interval widened by the clock's headroom. For verdicts a smaller change can reach, time both sides in one run: `tunelab ab MANIFEST --a BASE --b NEW` (docs/ab.md).\n",
                    pct(floor.max(*spread)),
                    pct(*floor)
                );
                if let Some(m) = machines {
                    machine_lines(&mut out, &m.0, &m.1);
                }
                let capped = self.rows.iter().filter(|r| r.capped).count();
                if capped > 0 {
                    let _ = writeln!(
                        out,
                        "- {} ran under the power cap in one run or both: their intervals are widened by how much faster they could have run at the peak clock.",
                        count(capped as u64, "pair", "pairs")
                    );
                }
                if let Some((same, fastest)) = self.picks_agree {
                    let _ = writeln!(
                        out,
                        "- Picks: {same} of {} pairs picked the same config in both runs ({fastest} by the fastest alone, before ties went by a fixed rule).",
                        self.rows.len()
                    );
                }
                out.push('\n');
            }
            Basis::OneRun => {
                let _ = writeln!(
                    out,
                    "Timed in one run, one after the other: FAST and SLOW where the 95 % confidence intervals of the two medians do not overlap; speedup = base time / new time.\n"
                );
            }
        }
        if let Some(t) = threshold {
            let bad = self.regressions(t);
            if bad.is_empty() {
                let _ = writeln!(out, "No pair is SLOW by more than {}.\n", pct(t));
            } else {
                let _ = writeln!(
                    out,
                    "**{} SLOW by more than {}:**\n",
                    count(bad.len() as u64, "pair is", "pairs are"),
                    pct(t)
                );
                table(&mut out, &bad[..bad.len().min(WORST)]);
            }
        }
        let worst: Vec<&Row> = self.worst_first().into_iter().take(5).collect();
        if threshold.is_none() && !worst.is_empty() {
            let _ = writeln!(out, "Worst pairs:\n");
            table(&mut out, &worst);
        }
        for note in &self.notes {
            let _ = writeln!(out, "- {note}");
        }
        if !self.notes.is_empty() {
            out.push('\n');
        }
        if !self.rows.is_empty() {
            let _ = writeln!(
                out,
                "<details><summary>All {}</summary>\n",
                count(self.rows.len() as u64, "row", "rows")
            );
            table(&mut out, &self.rows.iter().collect::<Vec<_>>());
            let _ = writeln!(out, "</details>");
        }
        out.trim_end().to_string() + "\n"
    }
}

/// Rows shown before the details fold: with the lines around them, a
/// comparison's markdown stays within 100 lines there.
const WORST: usize = 40;

fn machine_lines(out: &mut String, base: &Machine, new: &Machine) {
    let diffs = differences(base, new);
    if diffs.is_empty() {
        let _ = writeln!(out, "- Machine (both runs): {}.", base.describe());
    } else {
        let _ = writeln!(out, "- Base machine: {}.", base.describe());
        let _ = writeln!(out, "- New machine: {}.", new.describe());
        for d in diffs {
            let _ = writeln!(out, "- {d}");
        }
    }
    if let (Some(a), Some(b)) = (&base.commit, &new.commit) {
        let _ = writeln!(out, "- Commits: {a} (base), {b} (new).");
    }
    let _ = writeln!(out, "- Base clocks: {}.", base.clocks());
    let _ = writeln!(out, "- New clocks: {}.", new.clocks());
}

/// `2 %`, `2.5 %`.
pub fn pct(fraction: f64) -> String {
    let p = fraction * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0} %")
    } else {
        format!("{p:.1} %")
    }
}

fn table(out: &mut String, rows: &[&Row]) {
    let methods_differ = rows.iter().any(|r| r.base_method != r.new_method);
    let with_interval = rows.iter().any(|r| r.interval.is_some());
    let _ = writeln!(
        out,
        "| shape | {}base µs | new µs | change | {}speedup | verdict | base config | new config |",
        if methods_differ { "" } else { "method | " },
        if with_interval { "interval | " } else { "" }
    );
    let _ = writeln!(
        out,
        "| --- | {}---: | ---: | ---: | {}---: | --- | --- | --- |",
        if methods_differ { "" } else { "--- | " },
        if with_interval { "--- | " } else { "" }
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
        let interval = match (&r.interval, with_interval) {
            (Some(i), _) => format!(
                "{:+.1} to {:+.1} %{} | ",
                (i.low - 1.0) * 100.0,
                (i.high - 1.0) * 100.0,
                if r.capped { " (capped)" } else { "" }
            ),
            (None, true) => "— | ".into(),
            (None, false) => String::new(),
        };
        let new_config = if r.new_config == r.base_config {
            "same".to_string()
        } else {
            compact_config(&r.new_config)
        };
        let _ = writeln!(
            out,
            "| {} | {method}{:.2} | {:.2} | {:+.1} % | {interval}{:.3}× | {} | {} | {new_config} |",
            shape.join(" "),
            r.base.median_us,
            r.new.median_us,
            r.change() * 100.0,
            r.speedup(),
            r.verdict.as_str(),
            compact_config(&r.base_config),
        );
    }
    out.push('\n');
}

/// The verdict of separate runs' timings: the interval of new / base from
/// the two medians' 95 % intervals (the root sum of squares of their
/// half-widths, on the log scale), widened by `headroom`, against a margin
/// of the larger of `threshold` and `spread`.
pub fn separate_runs_verdict(
    base: &Stats,
    new: &Stats,
    headroom: f64,
    o: &Options,
) -> (Verdict, RatioInterval) {
    let half = |s: &Stats| (s.ci_high_us.ln() - s.ci_low_us.ln()).abs() / 2.0;
    let centre = (new.median_us / base.median_us).ln();
    let w = (half(base).powi(2) + half(new).powi(2)).sqrt();
    let interval = RatioInterval::from_log(centre, w).widened(headroom);
    (equivalence(&interval, o.threshold.max(o.spread)), interval)
}

/// Every timing a run's selection ranks, for its machine's clocks.
fn timings<'a>(sel: &Selection<'a>) -> Vec<&'a Stats> {
    sel.shapes
        .iter()
        .flat_map(|s| s.methods.iter())
        .filter_map(|m| m.best)
        .map(|b| b.stats)
        .collect()
}

/// Two separate runs of one experiment: per (shape, method) with a best on
/// both sides, best against best, judged as `o` says.
pub fn between(
    base: &Results,
    new: &Results,
    base_name: &str,
    new_name: &str,
    o: &Options,
) -> Comparison {
    let (b, n) = (Selection::new(base), Selection::new(new));
    let machines = base
        .header
        .as_ref()
        .zip(new.header.as_ref())
        .map(|(hb, hn)| (Machine::of(hb, timings(&b)), Machine::of(hn, timings(&n))));
    let mut rows = Vec::new();
    let mut only_base = 0;
    let (mut same_pick, mut same_fastest) = (0, 0);
    for bs in &b.shapes {
        let Some(ns) = n.shapes.iter().find(|s| s.key == bs.key) else {
            only_base += 1;
            continue;
        };
        for bm in &bs.methods {
            let Some(nm) = ns.method(bm.method) else {
                continue;
            };
            let (Some(bb), Some(nb)) = (bm.best, nm.best) else {
                continue;
            };
            let (headroom, capped) = match &machines {
                Some((mb, mn)) => (
                    mb.headroom(bb.stats.sm_clock_mhz)
                        .max(mn.headroom(nb.stats.sm_clock_mhz)),
                    mb.capped_at(bb.stats.sm_clock_mhz) || mn.capped_at(nb.stats.sm_clock_mhz),
                ),
                None => (0.0, false),
            };
            let (v, interval) = separate_runs_verdict(bb.stats, nb.stats, headroom, o);
            same_pick += usize::from(bb.job.config == nb.job.config);
            let fastest_config = |sel: &Selection<'_>, m: &super::select::MethodOutcome<'_>| {
                fastest(
                    m.jobs
                        .iter()
                        .filter_map(|j| eligible(j, sel.final_of(&j.job_id))),
                )
                .map(|t| t.job.config.clone())
            };
            same_fastest += usize::from(fastest_config(&b, bm) == fastest_config(&n, nm));
            rows.push(Row {
                shape: bs.shape.clone(),
                base_method: bm.method.to_string(),
                new_method: bm.method.to_string(),
                base: bb.stats.clone(),
                new: nb.stats.clone(),
                base_config: bb.job.config.clone(),
                new_config: nb.job.config.clone(),
                verdict: v,
                interval: Some(interval),
                capped,
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
        basis: Basis::SeparateRuns {
            threshold: o.threshold,
            spread: o.spread,
            machines: machines.map(Box::new),
        },
        picks_agree: Some((same_pick, same_fastest)),
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
            interval: None,
            capped: false,
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
        basis: Basis::OneRun,
        picks_agree: None,
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
                interval: None,
                capped: false,
            });
        }
        out.push((
            c.file.clone(),
            Comparison {
                base_name: c.file.clone(),
                new_name: c.against.clone(),
                rows,
                notes: Vec::new(),
                basis: Basis::OneRun,
                picks_agree: None,
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
    o: &Options,
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
            o,
        )
    };
    Ok((comparison, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(median: f64, half: f64) -> Stats {
        Stats {
            median_us: median,
            ci_low_us: median - half,
            ci_high_us: median + half,
            ..crate::measure::summarize(&[median], crate::measure::Timer::CudaEvent)
        }
    }

    #[test]
    fn separate_runs_are_judged_against_the_run_to_run_spread() {
        let o = Options::default();
        // 3 % apart, tight intervals: within the 5 % spread.
        let (v, i) = separate_runs_verdict(&stats(100.0, 0.5), &stats(103.0, 0.5), 0.0, &o);
        assert_eq!(v, Verdict::Same, "{i:?}");
        // 8 % apart: beyond it.
        let (v, _) = separate_runs_verdict(&stats(100.0, 0.5), &stats(108.0, 0.5), 0.0, &o);
        assert_eq!(v, Verdict::Slow);
        let (v, _) = separate_runs_verdict(&stats(100.0, 0.5), &stats(92.0, 0.5), 0.0, &o);
        assert_eq!(v, Verdict::Fast);
        // Near the edge: ambiguous.
        let (v, _) = separate_runs_verdict(&stats(100.0, 0.5), &stats(105.0, 0.5), 0.0, &o);
        assert_eq!(v, Verdict::Ambiguous);
        // A capped run's headroom widens the interval: 8 % is no longer SLOW.
        let (v, i) = separate_runs_verdict(&stats(100.0, 0.5), &stats(108.0, 0.5), 0.3, &o);
        assert_eq!(v, Verdict::Ambiguous, "{i:?}");
        // Without the spread (--run-spread 0) the threshold is the margin.
        let tight = Options { spread: 0.0, ..o };
        let (v, _) = separate_runs_verdict(&stats(100.0, 0.2), &stats(103.0, 0.2), 0.0, &tight);
        assert_eq!(v, Verdict::Slow);
    }
}
