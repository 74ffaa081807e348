//! `report`: the markdown report, rendered from `templates/report.md.j2`
//! with minijinja. This module computes every figure and formats it; the
//! template only lays it out. Missing data shows as `—`.
//!
//! Sections: title and description; a warning banner in interpreter mode;
//! summary (speedup over baseline per method: median, min, max across
//! shapes); winners per (shape, method); a method comparison per shape when
//! several methods ran; for `moe`, % of the bandwidth bound per shape
//! (bytes / peak bandwidth / time, the roofline when the kernel is
//! bandwidth-bound); latency-vs-M charts (mermaid `xychart-beta`, one per
//! group of shapes that differ only in M; for `moe` the tuned best and the
//! baseline of each tuned method, otherwise every method's best and each
//! baseline); failures by class; noise flags; environment; measurement
//! protocol; job counts and time spent.
//!
//! Noise flags are counted on the statistics each job's time comes from
//! (finalist re-timing when there is one).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use serde_json::Value as Json;

use super::num::{self, compact_config, json_text, DASH};
use super::select::{shape_key, ShapeFields, ShapeOutcome, Timed};
use super::{EmitError, Group};
use crate::manifest::{MethodKind, Tolerance};
use crate::measure::Stats;
use crate::measure::{Flag, L2Flush, Timer};
use crate::plan::Mode;
use crate::store::{FailureClass, JobRecord, JobStatus};

const TEMPLATE: &str = include_str!("templates/report.md.j2");

/// The banner an interpreter-mode report opens with.
pub const INTERPRETER_WARNING: &str =
    "timings are interpreted wall-clock, not GPU timings; tuned files are for format checks only";

/// Line colours of the charts, and their names for the legend.
const PALETTE: &[(&str, &str)] = &[
    ("#2563eb", "blue"),
    ("#dc2626", "red"),
    ("#16a34a", "green"),
    ("#9333ea", "purple"),
    ("#ea580c", "orange"),
    ("#0891b2", "cyan"),
    ("#4b5563", "grey"),
    ("#ca8a04", "yellow"),
];
const MAX_FLAG_JOBS: usize = 10;
const MAX_MESSAGE: usize = 240;

#[derive(Serialize)]
struct Ctx {
    title: String,
    description: Option<String>,
    interpreter: bool,
    interpreter_warning: &'static str,
    summary: Vec<String>,
    fixed_fields: String,
    has_shapes: bool,
    winners: Vec<Winner>,
    config_legend: bool,
    comparison: Option<Table>,
    bandwidth: Option<Table>,
    bandwidth_note: Option<String>,
    charts: Vec<Chart>,
    failures: Vec<FailureRow>,
    flags: Vec<FlagRow>,
    environment: Vec<Row>,
    protocol: Vec<Row>,
    counts: Vec<Row>,
}

#[derive(Serialize)]
struct Row {
    label: String,
    value: String,
}

fn row(label: &str, value: impl Into<String>) -> Row {
    Row {
        label: label.into(),
        value: cell(&value.into()),
    }
}

#[derive(Serialize)]
struct Winner {
    shape: String,
    method: String,
    config: String,
    median: String,
    ci: String,
    tflops: String,
    gbs: String,
    roofline: String,
    baseline: String,
    speedup: String,
    notes: String,
}

#[derive(Serialize)]
struct Table {
    columns: Vec<String>,
    /// `| --- | ---: | ...`: the first column left-aligned, figures right-aligned.
    separator: String,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// `text_last`: the last column holds words, not figures.
    fn new(columns: Vec<String>, rows: Vec<Vec<String>>, text_last: bool) -> Self {
        let n = columns.len();
        let separator = (0..n)
            .map(|i| {
                if i == 0 || (text_last && i + 1 == n) {
                    "| --- "
                } else {
                    "| ---: "
                }
            })
            .collect::<String>()
            + "|";
        Table {
            columns,
            separator,
            rows,
        }
    }
}

#[derive(Serialize)]
struct Chart {
    title: String,
    x: String,
    lines: Vec<String>,
    palette: String,
    legend: String,
    note: Option<String>,
}

#[derive(Serialize)]
struct FailureRow {
    class: String,
    count: usize,
    example: String,
}

#[derive(Serialize)]
struct FlagRow {
    flag: String,
    count: usize,
    jobs: String,
}

pub fn render(group: &Group) -> Result<String, EmitError> {
    let ctx = context(group);
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(true);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.add_template("report.md", TEMPLATE)
        .map_err(|e| EmitError::Template(e.to_string()))?;
    let text = env
        .get_template("report.md")
        .and_then(|t| t.render(&ctx))
        .map_err(|e| EmitError::Template(format!("{e:#}")))?;
    Ok(tidy(&text))
}

/// At most one blank line in a row, one trailing newline.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Text safe inside a markdown table cell.
fn cell(text: &str) -> String {
    text.replace('\r', "")
        .replace('\n', " ")
        .replace('|', "\\|")
}

/// One line of at most `max` characters, runs of whitespace collapsed.
fn truncate(text: &str, max: usize) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}…")
}

/// Which shape fields vary across the group's shapes (all of them for one shape).
struct ShapeLabels {
    varying: Vec<String>,
    fixed: Vec<(String, Json)>,
}

impl ShapeLabels {
    fn new(shapes: &[&ShapeOutcome]) -> Self {
        let mut fields: Vec<String> = Vec::new();
        for s in shapes {
            for k in s.shape.keys() {
                if !fields.contains(k) {
                    fields.push(k.clone());
                }
            }
        }
        let mut varying = Vec::new();
        let mut fixed = Vec::new();
        for f in fields {
            let first = shapes.first().and_then(|s| s.shape.get(&f));
            if shapes.len() > 1 && shapes.iter().all(|s| s.shape.get(&f) == first) {
                fixed.push((f, first.cloned().unwrap_or(Json::Null)));
            } else {
                varying.push(f);
            }
        }
        ShapeLabels { varying, fixed }
    }

    fn label(&self, shape: &ShapeFields) -> String {
        self.label_of(shape, &self.varying)
    }

    fn label_of(&self, shape: &ShapeFields, fields: &[String]) -> String {
        let parts: Vec<String> = fields
            .iter()
            .filter_map(|f| shape.get(f).map(|v| format!("{f}={}", json_text(v))))
            .collect();
        parts.join(" ")
    }

    fn fixed_text(&self) -> String {
        self.fixed
            .iter()
            .map(|(k, v)| format!("{k}={}", json_text(v)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn context(group: &Group) -> Ctx {
    let h = group.header;
    let shapes = &group.shapes;
    let labels = ShapeLabels::new(shapes);
    let moe = h.problem == "moe";
    let jobs = group.jobs();

    let mut winners = Vec::new();
    for s in shapes {
        for m in &s.methods {
            winners.push(winner(group, &labels, s, m));
        }
    }
    let config_legend = shapes.iter().flat_map(|s| &s.methods).any(|m| {
        m.best
            .is_some_and(|b| b.job.config.keys().any(|k| num::abbreviation(k).is_some()))
    });

    let methods = group.sel.methods();
    let comparison = (methods.len() > 1).then(|| comparison_table(&labels, shapes, &methods));

    let (bandwidth, bandwidth_note) = if moe {
        bandwidth_table(group, &labels, &methods)
    } else {
        (None, None)
    };

    Ctx {
        title: h.experiment.clone(),
        description: h.description.clone().filter(|d| !d.trim().is_empty()),
        interpreter: h.mode == Mode::Interpreter,
        interpreter_warning: INTERPRETER_WARNING,
        summary: summary(group, &methods),
        fixed_fields: labels.fixed_text(),
        has_shapes: !shapes.is_empty(),
        winners,
        config_legend,
        comparison,
        bandwidth,
        bandwidth_note,
        charts: charts(group, &labels, moe),
        failures: failures(&labels, &jobs),
        flags: flags(group, &jobs),
        environment: environment(group),
        protocol: protocol(group),
        counts: counts(group, &jobs),
    }
}

fn winner(
    group: &Group,
    labels: &ShapeLabels,
    s: &ShapeOutcome,
    m: &super::MethodOutcome,
) -> Winner {
    let shape = cell(&labels.label(s.shape));
    let method = cell(m.method);
    let Some(b) = m.best else {
        let why = if m.jobs.is_empty() {
            "no jobs".to_string()
        } else {
            format!("no timed job ({})", status_summary(&m.jobs))
        };
        return Winner {
            shape,
            method,
            config: DASH.into(),
            median: DASH.into(),
            ci: DASH.into(),
            tflops: DASH.into(),
            gbs: DASH.into(),
            roofline: DASH.into(),
            baseline: m
                .baseline
                .map(|t| num::us(t.time_us()))
                .unwrap_or_else(|| DASH.into()),
            speedup: DASH.into(),
            notes: why,
        };
    };
    let mut notes: Vec<String> = Vec::new();
    if b.job.baseline {
        notes.push("baseline".into());
    }
    if b.is_final() {
        notes.push("finalist re-timing".into());
        let ties = m
            .jobs
            .iter()
            .filter(|j| {
                j.job_id != b.job.job_id
                    && group
                        .sel
                        .final_of(&j.job_id)
                        .is_some_and(|f| f.tied_with_best)
            })
            .count();
        if ties > 0 {
            notes.push(format!("{ties} tied within noise"));
        }
    }
    if m.baseline_missing {
        notes.push(format!(
            "baseline {}",
            baseline_status(m.jobs.iter().copied().find(|j| j.baseline))
        ));
    }
    notes.extend(b.stats.flags.iter().map(|f| f.as_str().to_string()));
    if b.stats.timer == Timer::Wall {
        notes.push("wall-clock".into());
    }
    let config = if b.job.config.is_empty() {
        DASH.to_string()
    } else {
        compact_config(&b.job.config)
    };
    Winner {
        shape,
        method,
        config: cell(&config),
        median: num::us(b.time_us()),
        ci: ci(b.stats),
        tflops: num::rate(b.tflops()),
        gbs: num::rate(b.gbs()),
        roofline: num::fixed(b.roofline_pct(), 1),
        baseline: m
            .baseline
            .map(|t| num::us(t.time_us()))
            .unwrap_or_else(|| DASH.into()),
        speedup: num::speedup(m.speedup()),
        notes: cell(&notes.join(", ")),
    }
}

fn baseline_status(job: Option<&JobRecord>) -> String {
    match job {
        Some(j) => match (&j.status, &j.failure) {
            (JobStatus::Failed, Some(f)) => format!("failed: {}", f.class.as_str()),
            (JobStatus::Failed, None) => "failed".into(),
            (JobStatus::Pruned, _) => "pruned".into(),
            (JobStatus::Skipped, _) => "skipped".into(),
            (JobStatus::Checked, _) => "checked only".into(),
            (JobStatus::Ok, _) => "not timed".into(),
        },
        None => "missing".into(),
    }
}

fn status_summary(jobs: &[&JobRecord]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for j in jobs {
        let s = match j.status {
            JobStatus::Ok => "ok without statistics",
            JobStatus::Checked => "checked",
            JobStatus::Failed => "failed",
            JobStatus::Pruned => "pruned",
            JobStatus::Skipped => "skipped",
        };
        *counts.entry(s).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ci(s: &Stats) -> String {
    if s.ci_low_us.is_finite() && s.ci_high_us.is_finite() && s.ci_high_us > 0.0 {
        format!("{} – {}", num::us(s.ci_low_us), num::us(s.ci_high_us))
    } else {
        DASH.into()
    }
}

fn comparison_table(
    labels: &ShapeLabels,
    shapes: &[&ShapeOutcome],
    methods: &[(&str, MethodKind)],
) -> Table {
    let mut columns = vec!["Shape".to_string()];
    columns.extend(methods.iter().map(|(m, _)| format!("{} µs", cell(m))));
    columns.push("Fastest".into());
    let rows = shapes
        .iter()
        .map(|s| {
            let mut r = vec![cell(&labels.label(s.shape))];
            for (m, _) in methods {
                r.push(
                    s.method(m)
                        .and_then(|o| o.best)
                        .map(|b| num::us(b.time_us()))
                        .unwrap_or_else(|| DASH.into()),
                );
            }
            r.push(
                s.overall_best()
                    .map(|(m, _)| cell(m.method))
                    .unwrap_or_else(|| DASH.into()),
            );
            r
        })
        .collect();
    Table::new(columns, rows, true)
}

fn bandwidth_table(
    group: &Group,
    labels: &ShapeLabels,
    methods: &[(&str, MethodKind)],
) -> (Option<Table>, Option<String>) {
    let peak = group.header.device.peak_gbs;
    if peak.is_nan() || peak <= 0.0 {
        return (
            None,
            Some(format!(
                "The device ({}) has no peak bandwidth figure, so no bandwidth bound is given.",
                group.header.device.name
            )),
        );
    }
    let pct = |t: Option<Timed>| t.and_then(|t| t.gbs()).map(|g| g / peak * 100.0);
    // Per method its best, and its baseline when it has one somewhere.
    let mut cols: Vec<(&str, bool)> = Vec::new();
    for (m, _) in methods {
        cols.push((m, false));
        if group
            .shapes
            .iter()
            .any(|s| s.method(m).is_some_and(|o| o.baseline.is_some()))
        {
            cols.push((m, true));
        }
    }
    let mut columns = vec!["Shape".to_string()];
    columns.extend(cols.iter().map(|(m, base)| {
        if *base {
            format!("{} baseline", cell(m))
        } else {
            cell(m)
        }
    }));
    let rows = group
        .shapes
        .iter()
        .map(|s| {
            let mut r = vec![cell(&labels.label(s.shape))];
            for (m, base) in &cols {
                let o = s.method(m);
                let t = o.and_then(|o| if *base { o.baseline } else { o.best });
                r.push(
                    pct(t)
                        .map(|p| format!("{p:.1} %"))
                        .unwrap_or_else(|| DASH.into()),
                );
            }
            r
        })
        .collect();
    let note = format!(
        "Percent of the bandwidth bound: the problem's minimal bytes / {} GB/s peak / time.",
        num::rate(Some(peak))
    );
    (Some(Table::new(columns, rows, false)), Some(note))
}

fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

fn summary(group: &Group, methods: &[(&str, MethodKind)]) -> Vec<String> {
    let mut lines = Vec::new();
    let n_shapes = group.shapes.len();
    let with_best = group
        .shapes
        .iter()
        .filter(|s| s.overall_best().is_some())
        .count();
    lines.push(format!(
        "{with_best} of {n_shapes} shapes have a timed result; methods: {}.",
        if methods.is_empty() {
            DASH.to_string()
        } else {
            methods
                .iter()
                .map(|(m, _)| *m)
                .collect::<Vec<_>>()
                .join(", ")
        }
    ));
    if methods.len() > 1 && with_best > 0 {
        let mut wins: Vec<(&str, usize)> = methods.iter().map(|(m, _)| (*m, 0)).collect();
        for s in &group.shapes {
            if let Some((o, _)) = s.overall_best() {
                if let Some(w) = wins.iter_mut().find(|(m, _)| *m == o.method) {
                    w.1 += 1;
                }
            }
        }
        let text: Vec<String> = wins
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(m, n)| format!("{m} at {n}"))
            .collect();
        lines.push(format!("Fastest method per shape: {}.", text.join(", ")));
    }
    for (m, _) in methods {
        let mut speedups: Vec<f64> = group
            .shapes
            .iter()
            .filter_map(|s| s.method(m))
            .filter_map(|o| o.speedup())
            .collect();
        let has_baseline_jobs = group
            .shapes
            .iter()
            .filter_map(|s| s.method(m))
            .any(|o| o.jobs.iter().any(|j| j.baseline));
        if speedups.is_empty() {
            if has_baseline_jobs {
                lines.push(format!(
                    "{m}: no shape has both a timed best and a timed baseline."
                ));
            }
            continue;
        }
        let n = speedups.len();
        let kept = group
            .shapes
            .iter()
            .filter_map(|s| s.method(m))
            .filter(|o| o.best.is_some_and(|b| b.job.baseline))
            .count();
        let med = median(&mut speedups).unwrap_or(f64::NAN);
        let (lo, hi) = (speedups[0], speedups[n - 1]);
        let mut line = format!(
            "{m}: median speedup over baseline **{}** across {n} shape{} (min {}, max {})",
            num::speedup(Some(med)),
            if n == 1 { "" } else { "s" },
            num::speedup(Some(lo)),
            num::speedup(Some(hi))
        );
        if kept > 0 {
            line.push_str(&format!("; the baseline is already the best at {kept}"));
        }
        line.push('.');
        lines.push(line);
    }
    lines
}

/// Shapes that differ only in M, each group with its label; in shape order.
fn chart_groups<'s, 'a>(
    shapes: &[&'s ShapeOutcome<'a>],
) -> Vec<(ShapeFields, Vec<&'s ShapeOutcome<'a>>)> {
    let mut groups: Vec<(String, ShapeFields, Vec<&ShapeOutcome>)> = Vec::new();
    for s in shapes {
        if s.m().is_none() {
            continue;
        }
        let mut rest = s.shape.clone();
        rest.shift_remove("M");
        let key = shape_key(&rest);
        match groups.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, _, v)) => v.push(s),
            None => groups.push((key, rest, vec![s])),
        }
    }
    groups.into_iter().map(|(_, rest, v)| (rest, v)).collect()
}

fn charts(group: &Group, labels: &ShapeLabels, moe: bool) -> Vec<Chart> {
    let methods = group.sel.methods();
    let title_fields: Vec<String> = labels
        .varying
        .iter()
        .filter(|f| *f != "M")
        .cloned()
        .collect();
    let mut out = Vec::new();
    for (rest, shapes) in chart_groups(&group.shapes) {
        // Series: (label, per-shape time).
        let mut series: Vec<(String, Vec<Option<f64>>)> = Vec::new();
        for (m, kind) in &methods {
            if moe && *kind == MethodKind::Torch {
                continue;
            }
            let outcomes: Vec<Option<&super::MethodOutcome>> =
                shapes.iter().map(|s| s.method(m)).collect();
            let best: Vec<Option<f64>> = outcomes
                .iter()
                .map(|o| o.and_then(|o| o.best).map(|t| t.time_us()))
                .collect();
            let base: Vec<Option<f64>> = outcomes
                .iter()
                .map(|o| o.and_then(|o| o.baseline).map(|t| t.time_us()))
                .collect();
            let has_base = base.iter().any(Option::is_some);
            if best.iter().any(Option::is_some) {
                series.push((
                    if has_base || moe {
                        format!("{m} tuned")
                    } else {
                        m.to_string()
                    },
                    best,
                ));
            }
            if has_base {
                series.push((format!("{m} baseline"), base));
            }
        }
        series.truncate(PALETTE.len());
        if series.is_empty() {
            continue;
        }
        let points: Vec<usize> = (0..shapes.len())
            .filter(|&i| series.iter().all(|(_, v)| v[i].is_some()))
            .collect();
        if points.len() < 2 {
            continue;
        }
        let dropped: Vec<String> = (0..shapes.len())
            .filter(|i| !points.contains(i))
            .filter_map(|i| shapes[i].m())
            .map(|m| m.to_string())
            .collect();
        let label = labels.label_of(&rest, &title_fields);
        let title = if label.is_empty() {
            format!("{}: latency vs M", group.header.experiment)
        } else {
            format!("{label}: latency vs M")
        };
        let x = points
            .iter()
            .filter_map(|&i| shapes[i].m())
            .map(|m| format!("\"{m}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let lines = series
            .iter()
            .map(|(_, v)| {
                points
                    .iter()
                    .map(|&i| chart_value(v[i].unwrap_or(0.0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .collect();
        let palette = PALETTE[..series.len()]
            .iter()
            .map(|(c, _)| *c)
            .collect::<Vec<_>>()
            .join(", ");
        let legend = series
            .iter()
            .zip(PALETTE)
            .map(|((name, _), (_, colour))| format!("{colour}: {name}"))
            .collect::<Vec<_>>()
            .join("; ");
        out.push(Chart {
            title: title.replace('"', "'"),
            x,
            lines,
            palette,
            legend,
            note: (!dropped.is_empty()).then(|| {
                format!(
                    "M = {} left out: not every line has a time there.",
                    dropped.join(", ")
                )
            }),
        });
    }
    out
}

fn chart_value(x: f64) -> String {
    let s = num::us(x);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn failures(labels: &ShapeLabels, jobs: &[&JobRecord]) -> Vec<FailureRow> {
    let mut by_class: HashMap<FailureClass, (usize, &JobRecord)> = HashMap::new();
    let mut unclassified: Option<(usize, &JobRecord)> = None;
    for j in jobs.iter().filter(|j| j.status == JobStatus::Failed) {
        match &j.failure {
            Some(f) => by_class.entry(f.class).or_insert((0, j)).0 += 1,
            None => unclassified.get_or_insert((0, j)).0 += 1,
        }
    }
    let example = |j: &JobRecord| {
        let msg = j
            .failure
            .as_ref()
            .map(|f| truncate(&f.message, MAX_MESSAGE))
            .unwrap_or_default();
        let shape = labels.label(&j.shape);
        cell(&format!("`{}` ({}, {shape}): {msg}", j.job_id, j.method))
    };
    let mut rows: Vec<FailureRow> = by_class
        .into_iter()
        .map(|(c, (n, j))| FailureRow {
            class: c.as_str().into(),
            count: n,
            example: example(j),
        })
        .collect();
    if let Some((n, j)) = unclassified {
        rows.push(FailureRow {
            class: "unclassified".into(),
            count: n,
            example: example(j),
        });
    }
    rows.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.class.cmp(&b.class)));
    rows
}

fn flags(group: &Group, jobs: &[&JobRecord]) -> Vec<FlagRow> {
    // Flags order themselves as reports list them (`Flag::ALL`).
    let mut by_flag: BTreeMap<Flag, Vec<&str>> = BTreeMap::new();
    for j in jobs {
        let stats = group
            .sel
            .final_of(&j.job_id)
            .map(|f| &f.stats)
            .or(j.stats.as_ref());
        let Some(stats) = stats else { continue };
        let mut seen = HashSet::new();
        for f in &stats.flags {
            if seen.insert(*f) {
                by_flag.entry(*f).or_default().push(&j.job_id);
            }
        }
    }
    by_flag
        .into_iter()
        .map(|(flag, ids)| {
            let mut shown: Vec<String> = ids
                .iter()
                .take(MAX_FLAG_JOBS)
                .map(|id| format!("`{id}`"))
                .collect();
            if ids.len() > MAX_FLAG_JOBS {
                shown.push(format!("… and {} more", ids.len() - MAX_FLAG_JOBS));
            }
            FlagRow {
                flag: flag.as_str().to_string(),
                count: ids.len(),
                jobs: shown.join(", "),
            }
        })
        .collect()
}

fn opt(v: &Option<String>) -> String {
    v.clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DASH.into())
}

fn bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if n == 0 {
        return DASH.into();
    }
    if n as f64 >= 1024.0 * MIB {
        format!("{:.1} GiB", n as f64 / (1024.0 * MIB))
    } else {
        format!("{:.0} MiB", n as f64 / MIB)
    }
}

fn environment(group: &Group) -> Vec<Row> {
    let h = group.header;
    let d = &h.device;
    let fp = &h.fingerprint;
    let mut dtypes: Vec<String> = Vec::new();
    for s in &group.shapes {
        if let Some(Json::String(dt)) = s.shape.get("dtype") {
            if !dtypes.contains(dt) {
                dtypes.push(dt.clone());
            }
        }
    }
    if dtypes.is_empty() {
        dtypes.push("bf16".into());
    }
    let mut any_peak = false;
    let peaks: Vec<String> = dtypes
        .iter()
        .map(|dt| {
            let peak = match dt.as_str() {
                "bf16" => Some(d.peak_tflops_bf16),
                "fp16" => Some(d.peak_tflops_fp16),
                "fp8" => Some(d.peak_tflops_fp8),
                "fp32" => Some(d.peak_tflops_fp32),
                _ => None,
            };
            match peak.filter(|p| *p > 0.0) {
                Some(p) => {
                    any_peak = true;
                    format!("{dt}: {} TFLOP/s", num::fixed(Some(p), 1))
                }
                None => format!("{dt}: {DASH}"),
            }
        })
        .collect();
    let label = if d.source.starts_with("profile:") {
        format!(
            "dense, published for the part; device facts from {}",
            d.source
        )
    } else {
        "dense, published for the part".to_string()
    };
    let mode = match h.mode {
        Mode::Interpreter => "interpreter (Triton's TRITON_INTERPRET=1 on the CPU)".to_string(),
        Mode::Gpu => "gpu".to_string(),
    };
    vec![
        row("Device", d.name.clone()),
        row("Backend", d.backend.clone()),
        row(
            "Architecture",
            if d.cc_major > 0 {
                format!(
                    "{} (compute capability {}.{})",
                    d.arch, d.cc_major, d.cc_minor
                )
            } else {
                d.arch.clone()
            },
        ),
        row("SMs / CUs", d.sm_count.to_string()),
        row("L2 cache", bytes(d.l2_bytes)),
        row(
            "Peak memory bandwidth",
            if d.peak_gbs > 0.0 {
                format!("{} GB/s", num::rate(Some(d.peak_gbs)))
            } else {
                DASH.into()
            },
        ),
        row(
            "Peak compute used for roofline",
            if any_peak {
                format!("{} ({label})", peaks.join(", "))
            } else {
                peaks.join(", ")
            },
        ),
        row(
            "Driver",
            opt(&d.driver.clone().or_else(|| fp.driver.clone())),
        ),
        row("CUDA", opt(&fp.cuda)),
        row(
            "tunelab",
            if fp.tunelab.is_empty() {
                DASH.into()
            } else {
                fp.tunelab.clone()
            },
        ),
        row("git commit", opt(&fp.git_commit)),
        row("Python", opt(&fp.python)),
        row("torch", opt(&fp.torch)),
        row("Triton", opt(&fp.triton)),
        row("Mode", mode),
        row("Run mode", h.run_mode.as_str()),
        row("Search", h.search.label()),
        row("Problem", h.problem.clone()),
        row(
            "Manifest hash",
            if fp.manifest_hash.is_empty() {
                DASH.into()
            } else {
                format!("`{}`", fp.manifest_hash)
            },
        ),
        row("Started", h.started_at.clone()),
        row(
            "Runs in the journal",
            group.results.runs.len().max(1).to_string(),
        ),
    ]
}

fn protocol(group: &Group) -> Vec<Row> {
    let h = group.header;
    let p = &h.protocol;
    let with = match p.flush {
        L2Flush::Read => Some("a read of"),
        L2Flush::Memset => Some("a memset of"),
        L2Flush::Off => None,
    };
    let flush = if let Some(with) = with {
        match p.flush_bytes {
            Some(b) => format!("before every sample, {with} {}", bytes(b)),
            None => {
                let b = (2 * h.device.l2_bytes).max(32 << 20);
                format!(
                    "before every sample, {with} max(2 × L2, 32 MiB) = {}",
                    bytes(b)
                )
            }
        }
    } else {
        "off (warm-cache samples)".to_string()
    };
    vec![
        row(
            "Warm-up",
            format!(
                "at least {} launches and {} ms",
                p.warmup_launches,
                trim_float(p.warmup_ms)
            ),
        ),
        row("L2 flush", flush),
        row(
            "Batch",
            format!("{} samples per host synchronisation", p.batch),
        ),
        row("Samples", format!("{} to {}", p.min_samples, p.max_samples)),
        row(
            "Stop when",
            format!(
                "the 95 % CI of the median is within ±{} % of it",
                trim_float(p.target_ci * 100.0)
            ),
        ),
        row(
            "Caps per job",
            format!(
                "{} ms of GPU time, {} ms of wall time (capped jobs are flagged CAP_HIT)",
                trim_float(p.max_gpu_ms),
                trim_float(p.max_wall_ms)
            ),
        ),
        row(
            "Finalists",
            if p.finalists > 0 {
                format!(
                    "top {} per (shape, method) re-timed interleaved",
                    p.finalists
                )
            } else {
                "none".into()
            },
        ),
        row("Hot number", "off"),
        row("Timeout", format!("{} s per job", trim_float(p.timeout_s))),
        row("Seed", p.seed.to_string()),
        row("Tolerance", tolerance(&h.tolerance)),
    ]
}

fn trim_float(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn tolerance(t: &Tolerance) -> String {
    let t = serde_json::to_value(t).expect("tolerance serialises");
    fn flat(prefix: &str, v: &Json, out: &mut Vec<String>) {
        match v {
            Json::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    flat(&key, v, out);
                }
            }
            Json::Null => {}
            other => out.push(format!("{prefix}={}", json_text(other))),
        }
    }
    let mut parts = Vec::new();
    flat("", &t, &mut parts);
    if parts.is_empty() {
        DASH.into()
    } else {
        parts.join(", ")
    }
}

fn duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds <= 0.0 {
        return "0 s".into();
    }
    if seconds < 60.0 {
        return format!("{seconds:.1} s");
    }
    let total = seconds.round() as u64;
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    if h > 0 {
        format!("{h} h {m:02} min")
    } else {
        format!("{m} min {s:02} s")
    }
}

/// Seconds since the epoch of an RFC 3339 UTC time as the journal writes it (`2026-11-21T21:40:00Z`).
fn rfc3339_seconds(t: &str) -> Option<i64> {
    let num = |r: std::ops::Range<usize>| t.get(r).and_then(|x| x.parse::<i64>().ok());
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from civil (H. Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (mo + if mo > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some((era * 146_097 + doe - 719_468) * 86_400 + h * 3600 + mi * 60 + se)
}

/// Wall time of every run: from its start to the last job recorded before the next run started.
fn run_wall_seconds(runs: &[crate::store::RunHeader], jobs: &[&JobRecord]) -> f64 {
    let mut starts: Vec<i64> = runs
        .iter()
        .filter_map(|r| rfc3339_seconds(&r.started_at))
        .collect();
    starts.sort_unstable();
    let mut last_in_run = vec![None::<i64>; starts.len()];
    for j in jobs {
        let Some(t) = rfc3339_seconds(&j.finished_at) else {
            continue;
        };
        if let Some(i) = starts.iter().rposition(|s| *s <= t) {
            last_in_run[i] = Some(last_in_run[i].map_or(t, |x: i64| x.max(t)));
        }
    }
    starts
        .iter()
        .zip(last_in_run)
        .filter_map(|(s, end)| end.map(|e| (e - s) as f64))
        .sum()
}

fn counts(group: &Group, jobs: &[&JobRecord]) -> Vec<Row> {
    let count = |s: JobStatus| jobs.iter().filter(|j| j.status == s).count();
    let measured = run_wall_seconds(&group.results.runs, jobs);
    let job_ids: HashSet<&str> = jobs.iter().map(|j| j.job_id.as_str()).collect();
    let gpu_ms: f64 = jobs
        .iter()
        .filter_map(|j| j.stats.as_ref())
        .map(|s| s.gpu_ms)
        .filter(|g| g.is_finite())
        .sum::<f64>()
        + group
            .results
            .finals
            .iter()
            .filter(|f| job_ids.contains(f.job_id.as_str()))
            .map(|f| f.stats.gpu_ms)
            .filter(|g| g.is_finite())
            .sum::<f64>();
    let finalists = jobs
        .iter()
        .filter(|j| group.sel.final_of(&j.job_id).is_some())
        .count();
    // A resumed run plans only what is left; the first run planned everything.
    let planned = group
        .results
        .runs
        .iter()
        .map(|r| r.planned_jobs)
        .max()
        .unwrap_or(group.header.planned_jobs);
    vec![
        row("Planned", planned.to_string()),
        row(
            "Recorded",
            format!(
                "{}{}",
                jobs.len(),
                if (jobs.len() as u64) < planned {
                    format!(" ({} not run)", planned - jobs.len() as u64)
                } else {
                    String::new()
                }
            ),
        ),
        row("Ok (timed)", count(JobStatus::Ok).to_string()),
        row("Checked only", count(JobStatus::Checked).to_string()),
        row("Failed", count(JobStatus::Failed).to_string()),
        row("Pruned", count(JobStatus::Pruned).to_string()),
        row(
            "Skipped (surrogate budget spent)",
            count(JobStatus::Skipped).to_string(),
        ),
        row("Finalists re-timed", finalists.to_string()),
        row(
            "Run wall time (all runs, start to last record)",
            duration(measured),
        ),
        row("GPU time in timed samples", duration(gpu_ms / 1000.0)),
    ]
}

#[cfg(test)]
mod time_tests {
    use super::rfc3339_seconds;

    #[test]
    fn rfc3339_times_convert_to_epoch_seconds() {
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_seconds("2026-11-21T21:40:00Z"), Some(1_795_297_200));
        assert_eq!(
            rfc3339_seconds("2024-03-01T00:00:01Z").unwrap()
                - rfc3339_seconds("2024-02-28T00:00:01Z").unwrap(),
            2 * 86_400
        );
        assert_eq!(rfc3339_seconds("garbage"), None);
    }
}
