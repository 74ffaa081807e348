//! `report`: a markdown report a reviewer reads in a minute, an SVG chart
//! set per model or shard, and a details file beside them. Every figure is
//! computed here; the minijinja templates (`templates/`) only lay it out.
//! Missing data shows as `—`.
//!
//! Files, for a report at `DIR/NAME.md`:
//! - `DIR/NAME.md`: the report;
//! - `DIR/NAME-details.md`: every shape and method, every flagged best,
//!   every failure, skip and re-timing, environment and protocol in full;
//! - `DIR/NAME/<sweep>-{latency,speedup,bound}.svg`: per sweep (shapes that
//!   differ only in M, e.g. gpt-oss E=128 N=2880) latency, speedup over the
//!   baseline and % of the roofline bound against M (log scale), one line
//!   per method. Linked from the report by relative paths.
//!
//! The report's sections, one file each:
//! - `summary.rs`: what changed against shipped files (`run --compare-to`),
//!   each method's speedup over its baseline, the worst shapes, % of bound,
//!   where a `retime_with` timing picks another winner (`retime.rs`);
//! - `timed.rs`: what was timed: each method's kernel, description,
//!   baseline rule (and the vLLM release the builtin rule follows), search
//!   and jobs; the protocol and the device;
//! - `tables.rs`: one table per sweep (M down, one column per method);
//! - `charts.rs`: the SVG charts;
//! - `failures.rs`: noise flags counted per flag and method, failures by
//!   class with one example, skipped and pruned jobs counted;
//! - `run_facts.rs`: runs (planned, already done, recorded, not run: they
//!   add up across resumed runs), environment and protocol tables;
//! - `details.rs`: the details file.
//!
//! Interpreter runs: no % of bound, no GPU-only flags (CAP_HIT, THROTTLED,
//! TIMER_LIMITED), wall times below a minute with one decimal.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value as Json;

use super::num::{self, json_text, DASH};
use super::select::{shape_key, MethodOutcome, ShapeFields, ShapeOutcome, Timed};
use super::{EmitError, Group, Rendered};
use crate::manifest::{MethodKind, OutputFormat};
use crate::measure::{Flag, Stats};
use crate::plan::Mode;
use crate::store::{JobRecord, JobStatus};

mod charts;
mod details;
mod failures;
mod retime;
mod run_facts;
mod summary;
mod tables;
mod timed;

const TEMPLATE: &str = include_str!("templates/report.md.j2");
const DETAILS_TEMPLATE: &str = include_str!("templates/details.md.j2");

/// The banner an interpreter-mode report opens with.
pub const INTERPRETER_WARNING: &str =
    "timings are interpreted wall-clock, not GPU timings; tuned files are for format checks only";

/// Line colours, one per method in display order.
pub(super) const PALETTE: &[&str] = &[
    "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
];

/// The colour of the baseline's line.
pub(super) const BASELINE_COLOR: &str = "#4b5563";

#[derive(Serialize)]
struct Ctx {
    title: String,
    description: Option<String>,
    facts: String,
    details_link: String,
    interpreter: bool,
    interpreter_warning: &'static str,
    has_shapes: bool,
    summary: Vec<String>,
    retime: Option<Table>,
    retime_note: Option<String>,
    timed: timed::Timed,
    sweeps: Vec<tables::SweepTable>,
    flags: Option<Table>,
    failures: Option<Table>,
    /// What the flag counts mean; no failure; skipped and pruned jobs.
    problem_notes: Vec<String>,
    runs: Table,
    run_notes: Vec<String>,
}

#[derive(Serialize)]
pub(super) struct Row {
    label: String,
    value: String,
}

pub(super) fn row(label: &str, value: impl Into<String>) -> Row {
    Row {
        label: label.into(),
        value: cell(&value.into()),
    }
}

#[derive(Serialize)]
pub(super) struct Table {
    columns: Vec<String>,
    /// `| --- | ---: | ...`: text columns left-aligned, figures right-aligned.
    separator: String,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// `text`: which columns hold words (left-aligned); the rest are figures.
    pub(super) fn new(columns: Vec<String>, rows: Vec<Vec<String>>, text: &[usize]) -> Self {
        let separator = (0..columns.len())
            .map(|i| {
                if text.contains(&i) {
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

/// The report and its companions, rendered.
pub fn render(group: &Group<'_, '_>) -> Result<Vec<Rendered>, EmitError> {
    let paths = Paths::of(&group.path);
    let a = Analysis::new(group);
    let charts = charts::charts(&a, &paths);
    let ctx = context(&a, &paths, &charts);
    let details_ctx = details::context(&a, &paths);
    let mut out = vec![
        Rendered {
            format: OutputFormat::Report,
            path: PathBuf::from(&group.path),
            contents: render_template(TEMPLATE, &ctx)?,
        },
        Rendered {
            format: OutputFormat::Report,
            path: paths.details.clone(),
            contents: render_template(DETAILS_TEMPLATE, &details_ctx)?,
        },
    ];
    out.extend(charts.into_iter().map(|c| Rendered {
        format: OutputFormat::Report,
        path: c.path,
        contents: c.svg,
    }));
    Ok(out)
}

fn render_template(template: &str, ctx: &impl Serialize) -> Result<String, EmitError> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(true);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.add_template("t", template)
        .map_err(|e| EmitError::Template {
            name: "report",
            message: e.to_string(),
        })?;
    let text = env
        .get_template("t")
        .and_then(|t| t.render(ctx))
        .map_err(|e| EmitError::Template {
            name: "report",
            message: format!("{e:#}"),
        })?;
    Ok(tidy(&text))
}

/// Where a report's companions go, relative to the results directory, and
/// the links to them relative to the report.
pub(super) struct Paths {
    pub(super) details: PathBuf,
    pub(super) details_link: String,
    /// The charts' folder.
    charts_dir: PathBuf,
    charts_link: String,
    report_link: String,
}

impl Paths {
    fn of(report: &str) -> Self {
        let path = Path::new(report);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "report.md".into());
        let stem = match name.rsplit_once('.') {
            Some((stem, _)) if !stem.is_empty() => stem.to_string(),
            _ => format!("{name}-charts"),
        };
        let parent = path.parent().unwrap_or(Path::new(""));
        let details_name = format!("{stem}-details.md");
        Paths {
            details: parent.join(&details_name),
            details_link: details_name,
            charts_dir: parent.join(&stem),
            charts_link: stem,
            report_link: name,
        }
    }

    /// A chart's path under the results directory and its link from the report.
    pub(super) fn chart(&self, slug: &str, kind: &str) -> (PathBuf, String) {
        let file = format!("{slug}-{kind}.svg");
        (
            self.charts_dir.join(&file),
            format!("{}/{file}", self.charts_link),
        )
    }
}

/// What a speedup is measured against in the tables and charts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Reference<'a> {
    /// A method's baseline job (vLLM's default config, a config the manifest gives).
    Baseline(&'a str),
    /// Another method's best (torch's, where no method has a baseline).
    Method(&'a str),
    None,
}

/// Shapes that differ only in M, as one table and one chart set; or the
/// shapes that are alone in theirs, together.
pub(super) struct Sweep<'s, 'a> {
    /// `E=128 N=2880`, `All shapes`, `Other shapes`.
    pub(super) title: String,
    /// For file names: `E=128,N=2880`, `all`, `shapes`.
    pub(super) slug: String,
    pub(super) shapes: Vec<&'s ShapeOutcome<'a>>,
    /// The shapes differ only in M; else each row is its own shape.
    pub(super) by_m: bool,
}

/// The figures every section shares.
pub(super) struct Analysis<'g, 's, 'a> {
    pub(super) group: &'g Group<'s, 'a>,
    pub(super) labels: ShapeLabels,
    pub(super) methods: Vec<(&'a str, MethodKind)>,
    /// The method the report centres on: the one whose configs ship.
    pub(super) primary: Option<&'a str>,
    pub(super) reference: Reference<'a>,
    pub(super) gpu: bool,
    pub(super) sweeps: Vec<Sweep<'s, 'a>>,
    pub(super) jobs: Vec<&'a JobRecord>,
}

impl<'g, 's, 'a> Analysis<'g, 's, 'a> {
    fn new(group: &'g Group<'s, 'a>) -> Self {
        let labels = ShapeLabels::new(&group.shapes);
        let methods = group.sel.methods();
        let has_baseline = |m: &str| {
            group
                .shapes
                .iter()
                .any(|s| s.method(m).is_some_and(|o| o.baseline.is_some()))
        };
        let shipped = group
            .header
            .outputs
            .iter()
            .filter(|o| {
                matches!(
                    o.format,
                    OutputFormat::VllmMoeJson
                        | OutputFormat::AiterFmoeCsv
                        | OutputFormat::TritonKernelsJson
                        | OutputFormat::TritonMbucket
                )
            })
            .filter_map(|o| o.method.as_deref())
            .find_map(|m| methods.iter().find(|(n, _)| *n == m).map(|(n, _)| *n));
        let primary = shipped
            .or_else(|| methods.iter().map(|(m, _)| *m).find(|m| has_baseline(m)))
            .or_else(|| {
                methods
                    .iter()
                    .find(|(_, k)| *k != MethodKind::Torch)
                    .map(|(m, _)| *m)
            })
            .or_else(|| methods.first().map(|(m, _)| *m));
        let reference = match primary {
            Some(p) if has_baseline(p) => Reference::Baseline(p),
            _ => match methods.iter().map(|(m, _)| *m).find(|m| has_baseline(m)) {
                Some(m) => Reference::Baseline(m),
                None => match methods
                    .iter()
                    .find(|(m, k)| *k == MethodKind::Torch && Some(*m) != primary)
                {
                    Some((m, _)) => Reference::Method(m),
                    None => Reference::None,
                },
            },
        };
        let sweeps = sweeps(&group.shapes, &labels);
        Analysis {
            group,
            labels,
            methods,
            primary,
            reference,
            gpu: group.header.mode != Mode::Interpreter,
            sweeps,
            jobs: group.jobs(),
        }
    }

    /// The reference's time at a shape.
    pub(super) fn reference_at(&self, s: &ShapeOutcome<'a>) -> Option<Timed<'a>> {
        match self.reference {
            Reference::Baseline(m) => s.method(m).and_then(|o| o.baseline),
            Reference::Method(m) => s.method(m).and_then(|o| o.best),
            Reference::None => None,
        }
    }

    /// `baseline`, `torch`: what the speedup column and chart are over.
    pub(super) fn reference_name(&self) -> String {
        match self.reference {
            Reference::Baseline(m) if self.methods_with_baseline().len() > 1 => {
                format!("{m}'s baseline")
            }
            Reference::Baseline(_) => "baseline".into(),
            Reference::Method(m) => m.to_string(),
            Reference::None => DASH.into(),
        }
    }

    pub(super) fn methods_with_baseline(&self) -> Vec<&'a str> {
        self.methods
            .iter()
            .map(|(m, _)| *m)
            .filter(|m| {
                self.group
                    .shapes
                    .iter()
                    .any(|s| s.method(m).is_some_and(|o| o.baseline.is_some()))
            })
            .collect()
    }

    /// The colour of a method's lines.
    pub(super) fn color(&self, method: &str) -> &'static str {
        let i = self
            .methods
            .iter()
            .position(|(m, _)| *m == method)
            .unwrap_or(0);
        PALETTE[i % PALETTE.len()]
    }

    /// Whether a flag means anything in this run's mode.
    pub(super) fn shows_flag(&self, f: Flag) -> bool {
        self.gpu || !matches!(f, Flag::CapHit | Flag::Throttled | Flag::TimerLimited)
    }

    /// The shape's label within its sweep's table (`M=64`, or the whole
    /// varying label where rows are shapes of their own).
    pub(super) fn shape_label(&self, s: &ShapeOutcome<'_>) -> String {
        self.labels.label(s.shape)
    }

    /// The statistics a job's time comes from: its finalist re-timing, else its own.
    pub(super) fn stats_of(&self, j: &'a JobRecord) -> Option<&'a Stats> {
        self.group
            .sel
            .final_of(&j.job_id)
            .map(|f| &f.stats)
            .or(j.stats.as_ref())
    }
}

/// Groups shapes that differ only in M; shapes alone in their group (or
/// without an integer M) go together at the end.
fn sweeps<'s, 'a>(shapes: &[&'s ShapeOutcome<'a>], labels: &ShapeLabels) -> Vec<Sweep<'s, 'a>> {
    let mut groups: Vec<(String, ShapeFields, Vec<&'s ShapeOutcome<'a>>)> = Vec::new();
    let mut loose: Vec<&'s ShapeOutcome<'a>> = Vec::new();
    for s in shapes {
        if s.m().is_none() {
            loose.push(s);
            continue;
        }
        let mut rest = s.shape.clone();
        rest.shift_remove("M");
        let key = shape_key(&rest);
        match groups.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, _, v)) => v.push(s),
            None => groups.push((key, rest, vec![*s])),
        }
    }
    let title_fields: Vec<String> = labels
        .varying
        .iter()
        .filter(|f| *f != "M")
        .cloned()
        .collect();
    let mut out: Vec<Sweep<'s, 'a>> = Vec::new();
    for (_, rest, v) in groups {
        if v.len() < 2 {
            loose.extend(v);
            continue;
        }
        let title = labels.label_of(&rest, &title_fields);
        // Two values that differ only in characters a file name drops must
        // not share a chart.
        let mut slug = slug(&rest, &title_fields);
        let base = slug.clone();
        let mut n = 1;
        while out.iter().any(|s| s.slug == slug) {
            n += 1;
            slug = format!("{base}-{n}");
        }
        out.push(Sweep {
            slug,
            title,
            shapes: v,
            by_m: true,
        });
    }
    if out.len() == 1 && out[0].title.is_empty() {
        out[0].title = "All shapes".into();
        out[0].slug = "all".into();
    }
    if !loose.is_empty() {
        // Keep selection order.
        loose.sort_by_key(|s| shapes.iter().position(|x| x.key == s.key));
        out.push(Sweep {
            title: if out.is_empty() {
                "All shapes".into()
            } else {
                "Other shapes".into()
            },
            slug: "shapes".into(),
            shapes: loose,
            by_m: false,
        });
    }
    out
}

/// A file-name part for a sweep: `E=128,N=2880`, only characters safe in a
/// URL path and on every file system.
fn slug(rest: &ShapeFields, fields: &[String]) -> String {
    let parts: Vec<String> = fields
        .iter()
        .filter_map(|f| rest.get(f).map(|v| format!("{f}={}", json_text(v))))
        .collect();
    let s: String = parts
        .join(",")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '=' | ',' | '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "all".into()
    } else {
        s
    }
}

/// Finalists whose re-timing picked another winner, shown in the report.
const RETIMED_SHOWN: usize = 3;

fn context(a: &Analysis<'_, '_, '_>, paths: &Paths, charts: &[charts::ChartFile]) -> Ctx {
    let h = a.group.header;
    // The report shows the largest few; the details file lists them all.
    let (retime, retime_note) = retime::table(a, RETIMED_SHOWN, &paths.details_link);
    let (flags, flags_note) = failures::flags_table(a, &paths.details_link);
    let mut failures = failures::failures_table(a);
    let mut problem_notes = vec![flags_note];
    let skipped = !failures::skipped_lines(a).is_empty();
    // What did not happen ends the flags' note (a line of its own would
    // cost the report's line budget for nothing).
    let none = match (failures.is_none(), skipped) {
        (true, false) => Some("No job failed, was skipped or pruned."),
        (true, true) => Some("No job failed."),
        (false, false) => Some("No job was skipped or pruned."),
        (false, true) => None,
    };
    if let Some(none) = none {
        problem_notes[0].push(' ');
        problem_notes[0].push_str(none);
    }
    // One class of failure reads as a sentence; several as a table.
    if let Some(line) = failures.as_ref().and_then(failures::single_class_line) {
        problem_notes.push(line);
        failures = None;
    }
    problem_notes.extend(failures::retried_line(a));
    if skipped {
        // "What was timed" counts them per method; the details say why.
        problem_notes[0].push_str(
            " Skipped and pruned jobs are counted per method under What was timed, and why in the details.",
        );
    }
    Ctx {
        title: h.experiment.clone(),
        description: h.description.clone().filter(|d| !d.trim().is_empty()),
        facts: run_facts::facts_line(a),
        details_link: paths.details_link.clone(),
        interpreter: !a.gpu,
        interpreter_warning: INTERPRETER_WARNING,
        has_shapes: !a.group.shapes.is_empty(),
        summary: summary::summary(a),
        retime,
        retime_note,
        timed: timed::timed(a),
        sweeps: tables::sweep_tables(a, charts),
        flags,
        failures,
        problem_notes,
        runs: run_facts::runs_table(a),
        run_notes: run_facts::run_notes(a),
    }
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
pub(super) fn cell(text: &str) -> String {
    text.replace('\r', "")
        .replace('\n', " ")
        .replace('|', "\\|")
}

/// One line of at most `max` characters, runs of whitespace collapsed.
pub(super) fn truncate(text: &str, max: usize) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}…")
}

/// Which shape fields vary across the group's shapes (all of them for one shape).
pub(super) struct ShapeLabels {
    pub(super) varying: Vec<String>,
    pub(super) fixed: Vec<(String, Json)>,
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

    pub(super) fn label(&self, shape: &ShapeFields) -> String {
        self.label_of(shape, &self.varying)
    }

    pub(super) fn label_of(&self, shape: &ShapeFields, fields: &[String]) -> String {
        let parts: Vec<String> = fields
            .iter()
            .filter_map(|f| shape.get(f).map(|v| format!("{f}={}", json_text(v))))
            .collect();
        parts.join(" ")
    }

    pub(super) fn fixed_text(&self) -> String {
        self.fixed
            .iter()
            .map(|(k, v)| format!("{k}={}", json_text(v)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A config in the tables' notation: `16×64×128 GM1 w4 s4` (BM×BN×BK when a
/// config has all three), other fields as `compact_config` writes them.
pub(super) fn config_text(config: &indexmap::IndexMap<String, Json>) -> String {
    if config.is_empty() {
        return DASH.into();
    }
    let tile = ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"];
    if tile.iter().all(|k| config.contains_key(*k)) {
        let head = tile
            .iter()
            .map(|k| json_text(&config[*k]))
            .collect::<Vec<_>>()
            .join("×");
        let mut rest = config.clone();
        for k in tile {
            rest.shift_remove(k);
        }
        if rest.is_empty() {
            head
        } else {
            format!("{head} {}", num::compact_config(&rest))
        }
    } else {
        num::compact_config(config)
    }
}

/// The speedup of `new` over `base` (base time / new time).
pub(super) fn ratio(base: Option<Timed<'_>>, new: Option<Timed<'_>>) -> Option<f64> {
    let (b, n) = (base?.time_us(), new?.time_us());
    (b > 0.0 && n > 0.0).then(|| b / n)
}

/// Status counts of some jobs, largest first: `7568 ok, 2 failed`.
pub(super) fn status_counts(jobs: &[&JobRecord]) -> String {
    let mut counts: BTreeMap<u8, (usize, &str)> = BTreeMap::new();
    for j in jobs {
        let (order, name) = match j.status {
            JobStatus::Ok => (0, "ok"),
            JobStatus::Checked => (1, "checked"),
            JobStatus::Failed => (2, "failed"),
            JobStatus::Pruned => (3, "pruned"),
            JobStatus::Skipped => (4, "skipped"),
        };
        counts.entry(order).or_insert((0, name)).0 += 1;
    }
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .values()
        .map(|(n, name)| format!("{n} {name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Bests of a method across shapes, with their shapes.
pub(super) fn bests<'s, 'a>(
    shapes: &[&'s ShapeOutcome<'a>],
    method: &str,
) -> Vec<(&'s ShapeOutcome<'a>, &'s MethodOutcome<'a>, Timed<'a>)> {
    shapes
        .iter()
        .filter_map(|s| {
            let o = s.method(method)?;
            o.best.map(|b| (*s, o, b))
        })
        .collect()
}

/// Which bound binds a job: `bandwidth` or `compute`, when the problem
/// declared both its bytes and its flops and the device has both peaks.
pub(super) fn bound_kind(
    job: &JobRecord,
    device: &crate::device::DeviceInfo,
) -> Option<&'static str> {
    let (flops, bytes) = (job.flops?, job.bytes?);
    let dtype = job
        .shape
        .get("dtype")
        .and_then(Json::as_str)
        .unwrap_or("bf16");
    let peak = match dtype {
        "fp16" => device.peak_tflops_fp16,
        "fp8" => device.peak_tflops_fp8,
        "fp32" => device.peak_tflops_fp32,
        _ => device.peak_tflops_bf16,
    };
    if peak <= 0.0 || device.peak_gbs <= 0.0 {
        return None;
    }
    let compute_s = flops / (peak * 1e12);
    let memory_s = bytes / (device.peak_gbs * 1e9);
    Some(if compute_s > memory_s {
        "compute"
    } else {
        "bandwidth"
    })
}

/// Distinct values, in first-seen order.
pub(super) fn distinct<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// Job ids as a set, for membership tests.
pub(super) fn id_set<'a>(jobs: &[&'a JobRecord]) -> HashSet<&'a str> {
    jobs.iter().map(|j| j.job_id.as_str()).collect()
}

/// Jobs per method, in journal order.
pub(super) fn by_method<'a>(jobs: &[&'a JobRecord]) -> HashMap<&'a str, Vec<&'a JobRecord>> {
    let mut out: HashMap<&str, Vec<&JobRecord>> = HashMap::new();
    for j in jobs {
        out.entry(j.method.as_str()).or_default().push(j);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companions_sit_beside_the_report() {
        let p = Paths::of("report.md");
        assert_eq!(p.details, PathBuf::from("report-details.md"));
        assert_eq!(p.details_link, "report-details.md");
        let (path, link) = p.chart("E=128,N=2880", "latency");
        assert_eq!(path, PathBuf::from("report/E=128,N=2880-latency.svg"));
        assert_eq!(link, "report/E=128,N=2880-latency.svg");
        let p = Paths::of("out/summary.md");
        assert_eq!(p.details, PathBuf::from("out/summary-details.md"));
        assert_eq!(p.details_link, "summary-details.md");
        assert_eq!(
            p.chart("all", "bound").0,
            PathBuf::from("out/summary/all-bound.svg")
        );
        // No extension: the charts' folder must not be the report's own name.
        assert_eq!(
            Paths::of("REPORT").chart("all", "bound").0,
            PathBuf::from("REPORT-charts/all-bound.svg")
        );
    }

    #[test]
    fn slugs_keep_only_safe_characters() {
        let mut rest = ShapeFields::new();
        rest.insert("E".into(), Json::from(128));
        rest.insert("name".into(), Json::from("a b/c"));
        assert_eq!(
            slug(&rest, &["E".to_string(), "name".to_string()]),
            "E=128,name=a_b_c"
        );
        assert_eq!(slug(&rest, &[]), "all");
    }

    #[test]
    fn configs_use_the_tile_notation() {
        let mut c = indexmap::IndexMap::new();
        for (k, v) in [
            ("BLOCK_SIZE_M", 16),
            ("BLOCK_SIZE_N", 64),
            ("BLOCK_SIZE_K", 128),
            ("GROUP_SIZE_M", 1),
            ("num_warps", 4),
        ] {
            c.insert(k.to_string(), Json::from(v));
        }
        assert_eq!(config_text(&c), "16×64×128 GM1 w4");
        c.shift_remove("BLOCK_SIZE_K");
        assert_eq!(config_text(&c), "BM16 BN64 GM1 w4");
        assert_eq!(config_text(&indexmap::IndexMap::new()), DASH);
    }
}
