//! The details file beside the report: every (shape, method) with its best
//! and baseline, noise flags per sweep and method with every flagged best
//! and baseline by job id, every failure grouped by message, every skip,
//! every re-timing disagreement, every compared file's rows, the runs, the
//! environment and the protocol. Small enough to commit: one row per
//! (shape, method), not per job; each job's own record is in the journal.

use super::*;
use crate::emit::compare::compared_in_run;

#[derive(Serialize)]
pub(super) struct DetailsCtx {
    title: String,
    report_link: String,
    interpreter: bool,
    sweeps: Vec<DetailSweep>,
    flags: Option<Table>,
    flagged: Option<Table>,
    failures: Option<Table>,
    skipped: Vec<String>,
    retime: Option<Table>,
    retime_note: Option<String>,
    compared: Vec<String>,
    runs: Table,
    run_notes: Vec<String>,
    environment: Vec<Row>,
    protocol: Vec<Row>,
}

#[derive(Serialize)]
struct DetailSweep {
    title: String,
    table: Table,
}

pub(super) fn context(a: &Analysis<'_, '_, '_>, paths: &Paths) -> DetailsCtx {
    let (all, _) = retime::disagreements(a);
    let rank = a.group.header.protocol.timing.as_str();
    let (_, retime_note) = retime::table(a, usize::MAX, &paths.details_link);
    DetailsCtx {
        title: a.group.header.experiment.clone(),
        report_link: paths.report_link.clone(),
        interpreter: !a.gpu,
        sweeps: a
            .sweeps
            .iter()
            .map(|s| DetailSweep {
                title: s.title.clone(),
                table: sweep_table(a, s),
            })
            .collect(),
        flags: flags_by_sweep(a),
        flagged: flagged(a),
        failures: failures(a),
        skipped: failures::skipped_lines(a),
        retime: (!all.is_empty()).then(|| {
            retime::disagreement_table(
                all.iter().map(|d| retime::disagreement_row(a, d)).collect(),
                rank,
            )
        }),
        retime_note,
        compared: compared_in_run(a.group.results)
            .into_iter()
            .map(|(_, c)| c.markdown(None))
            .collect(),
        runs: run_facts::runs_table(a),
        run_notes: run_facts::run_notes(a),
        environment: run_facts::environment(a),
        protocol: run_facts::protocol(a),
    }
}

fn notes(a: &Analysis<'_, '_, '_>, o: &MethodOutcome<'_>) -> String {
    let mut notes: Vec<String> = Vec::new();
    if let Some(b) = o.best {
        if b.job.baseline {
            notes.push("best = baseline".into());
        }
        if b.is_final() {
            let ties = o
                .jobs
                .iter()
                .filter(|j| {
                    j.job_id != b.job.job_id
                        && a.group
                            .sel
                            .final_of(&j.job_id)
                            .is_some_and(|f| f.tied_with_best)
                })
                .count();
            notes.push(if ties > 0 {
                format!("finalist, {ties} tied within noise")
            } else {
                "finalist".into()
            });
        }
        notes.extend(
            b.stats
                .flags
                .iter()
                .filter(|f| a.shows_flag(**f))
                .map(|f| f.as_str().to_string()),
        );
    }
    if o.baseline_missing {
        let job = o.jobs.iter().copied().find(|j| j.baseline);
        notes.push(match job.map(|j| (j.status, &j.failure)) {
            Some((JobStatus::Failed, Some(f))) => format!("baseline failed: {}", f.class.as_str()),
            Some((status, _)) => format!("baseline {}", status.as_str()),
            None => "baseline missing".into(),
        });
    }
    notes.join(", ")
}

fn sweep_table(a: &Analysis<'_, '_, '_>, sweep: &Sweep<'_, '_>) -> Table {
    let mut columns: Vec<String> = [
        if sweep.by_m { "M" } else { "Shape" },
        "Method",
        "Jobs",
        "Best config",
        "µs",
        "95 % CI µs",
        "n",
    ]
    .map(String::from)
    .to_vec();
    if a.gpu {
        columns.extend(["TFLOP/s", "GB/s", "% of bound"].map(String::from));
    }
    columns.extend(["Baseline config", "Baseline µs", "Notes"].map(String::from));
    let n = columns.len();
    let mut rows = Vec::new();
    for s in &sweep.shapes {
        let label = if sweep.by_m {
            s.m().map(|m| m.to_string()).unwrap_or_else(|| DASH.into())
        } else {
            cell(&a.shape_label(s))
        };
        for o in &s.methods {
            let b = o.best;
            let mut r = vec![
                label.clone(),
                cell(o.method),
                status_counts(&o.jobs),
                b.map(|b| cell(&config_text(&b.job.config)))
                    .unwrap_or_else(|| DASH.into()),
                b.map(|b| num::us(b.time_us()))
                    .unwrap_or_else(|| DASH.into()),
                b.map(|b| ci(b.stats)).unwrap_or_else(|| DASH.into()),
                b.map(|b| b.stats.n.to_string())
                    .unwrap_or_else(|| DASH.into()),
            ];
            if a.gpu {
                r.push(num::rate(b.and_then(|b| b.tflops())));
                r.push(num::rate(b.and_then(|b| b.gbs())));
                r.push(num::fixed(b.and_then(|b| b.roofline_pct()), 1));
            }
            r.push(
                o.baseline
                    .map(|t| cell(&config_text(&t.job.config)))
                    .unwrap_or_else(|| DASH.into()),
            );
            r.push(
                o.baseline
                    .map(|t| num::us(t.time_us()))
                    .unwrap_or_else(|| DASH.into()),
            );
            r.push(cell(&notes(a, o)));
            rows.push(r);
        }
    }
    let mut text = vec![1, 2, 3, n - 3, n - 1];
    if !sweep.by_m {
        text.push(0);
    }
    Table::new(columns, rows, &text)
}

pub(super) fn ci(s: &Stats) -> String {
    if s.ci_low_us.is_finite() && s.ci_high_us.is_finite() && s.ci_high_us > 0.0 {
        format!("{} – {}", num::us(s.ci_low_us), num::us(s.ci_high_us))
    } else {
        DASH.into()
    }
}

/// Flags per sweep and method.
fn flags_by_sweep(a: &Analysis<'_, '_, '_>) -> Option<Table> {
    let flags: Vec<Flag> = distinct(
        a.jobs
            .iter()
            .filter_map(|j| a.stats_of(j))
            .flat_map(|s| s.flags.iter().copied())
            .filter(|f| a.shows_flag(*f)),
    );
    if flags.is_empty() {
        return None;
    }
    let mut flags = flags;
    flags.sort();
    let mut columns = vec!["Shapes".to_string(), "Method".into(), "Timed".into()];
    columns.extend(flags.iter().map(|f| f.as_str().to_string()));
    let mut rows = Vec::new();
    for sweep in &a.sweeps {
        let keys: HashSet<&str> = sweep.shapes.iter().map(|s| s.key.as_str()).collect();
        for (m, _) in &a.methods {
            let stats: Vec<&Stats> = a
                .jobs
                .iter()
                .filter(|j| j.method == *m && keys.contains(shape_key(&j.shape).as_str()))
                .filter_map(|j| a.stats_of(j))
                .collect();
            if stats.is_empty() {
                continue;
            }
            let mut r = vec![cell(&sweep.title), cell(m), stats.len().to_string()];
            for f in &flags {
                r.push(
                    stats
                        .iter()
                        .filter(|s| s.flags.contains(f))
                        .count()
                        .to_string(),
                );
            }
            rows.push(r);
        }
    }
    Some(Table::new(columns, rows, &[0, 1]))
}

/// Every flagged best and baseline: the numbers the report rests on.
fn flagged(a: &Analysis<'_, '_, '_>) -> Option<Table> {
    let mut rows = Vec::new();
    for s in &a.group.shapes {
        for o in &s.methods {
            let mut roles: Vec<(&str, Timed<'_>)> = Vec::new();
            if let Some(b) = o.best {
                roles.push((
                    if b.job.baseline {
                        "best = baseline"
                    } else {
                        "best"
                    },
                    b,
                ));
            }
            if let Some(base) = o.baseline {
                if o.best.map_or(true, |b| b.job.job_id != base.job.job_id) {
                    roles.push(("baseline", base));
                }
            }
            for (role, t) in roles {
                let flags: Vec<&str> = t
                    .stats
                    .flags
                    .iter()
                    .filter(|f| a.shows_flag(**f))
                    .map(|f| f.as_str())
                    .collect();
                if flags.is_empty() {
                    continue;
                }
                rows.push(vec![
                    cell(&a.labels.label(s.shape)),
                    cell(o.method),
                    role.to_string(),
                    format!("`{}`", t.job.job_id),
                    num::us(t.time_us()),
                    ci(t.stats),
                    flags.join(", "),
                ]);
            }
        }
    }
    (!rows.is_empty()).then(|| {
        Table::new(
            [
                "Shape",
                "Method",
                "Role",
                "Job",
                "µs",
                "95 % CI µs",
                "Flags",
            ]
            .map(String::from)
            .to_vec(),
            rows,
            &[0, 1, 2, 3, 6],
        )
    })
}

/// Every failure, grouped by method, class and message.
fn failures(a: &Analysis<'_, '_, '_>) -> Option<Table> {
    let mut groups: Vec<((String, String, String), usize, &JobRecord)> = Vec::new();
    for j in a.jobs.iter().filter(|j| j.status == JobStatus::Failed) {
        let key = (
            j.method.clone(),
            j.failure
                .as_ref()
                .map(|f| f.class.as_str())
                .unwrap_or("unclassified")
                .to_string(),
            j.failure
                .as_ref()
                .map(|f| truncate(&f.message, failures::MAX_MESSAGE))
                .unwrap_or_default(),
        );
        match groups.iter_mut().find(|(k, _, _)| *k == key) {
            Some(g) => g.1 += 1,
            None => groups.push((key, 1, j)),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let rows = groups
        .into_iter()
        .map(|((method, class, message), n, j)| {
            vec![
                cell(&method),
                class,
                cell(&message),
                n.to_string(),
                format!("`{}`", j.job_id),
                cell(&format!(
                    "{}, {}",
                    a.labels.label(&j.shape),
                    config_text(&j.config)
                )),
            ]
        })
        .collect();
    Some(Table::new(
        [
            "Method",
            "Class",
            "Message",
            "Jobs",
            "Example job",
            "Its shape, config",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        &[0, 1, 2, 4, 5],
    ))
}
