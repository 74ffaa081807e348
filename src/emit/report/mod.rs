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
//!
//! One file per section: `summary.rs`, `winners.rs`, `tables.rs` (methods
//! side by side, % of the bandwidth bound), `charts.rs`, `failures.rs`
//! (failures and noise flags), `run_facts.rs` (environment, protocol,
//! counts). This file holds the context the template reads and the helpers
//! every section shares (cells, shape labels, tables).

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

mod charts;
mod failures;
mod run_facts;
mod summary;
mod tables;
mod winners;

use charts::Chart;
use failures::{FailureRow, FlagRow};
use winners::Winner;

const TEMPLATE: &str = include_str!("templates/report.md.j2");

/// The banner an interpreter-mode report opens with.
pub const INTERPRETER_WARNING: &str =
    "timings are interpreted wall-clock, not GPU timings; tuned files are for format checks only";

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

pub fn render(group: &Group<'_, '_>) -> Result<String, EmitError> {
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
    fn new(shapes: &[&ShapeOutcome<'_>]) -> Self {
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

fn context(group: &Group<'_, '_>) -> Ctx {
    let h = group.header;
    let shapes = &group.shapes;
    let labels = ShapeLabels::new(shapes);
    let moe = h.problem == "moe";
    let jobs = group.jobs();

    let mut winners = Vec::new();
    for s in shapes {
        for m in &s.methods {
            winners.push(winners::winner(group, &labels, s, m));
        }
    }
    let config_legend = shapes.iter().flat_map(|s| &s.methods).any(|m| {
        m.best
            .is_some_and(|b| b.job.config.keys().any(|k| num::abbreviation(k).is_some()))
    });

    let methods = group.sel.methods();
    let comparison =
        (methods.len() > 1).then(|| tables::comparison_table(&labels, shapes, &methods));

    let (bandwidth, bandwidth_note) = if moe {
        tables::bandwidth_table(group, &labels, &methods)
    } else {
        (None, None)
    };

    Ctx {
        title: h.experiment.clone(),
        description: h.description.clone().filter(|d| !d.trim().is_empty()),
        interpreter: h.mode == Mode::Interpreter,
        interpreter_warning: INTERPRETER_WARNING,
        summary: summary::summary(group, &methods),
        fixed_fields: labels.fixed_text(),
        has_shapes: !shapes.is_empty(),
        winners,
        config_legend,
        comparison,
        bandwidth,
        bandwidth_note,
        charts: charts::charts(group, &labels, moe),
        failures: failures::failures(&labels, &jobs),
        flags: failures::flags(group, &jobs),
        environment: run_facts::environment(group),
        protocol: run_facts::protocol(group),
        counts: run_facts::counts(group, &jobs),
    }
}
