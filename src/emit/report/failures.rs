//! Noise flags counted per flag and method, failures by class with one
//! example each, skipped and pruned jobs counted. Job ids stay out of the
//! report: the details file lists the flagged bests and every failure.

use super::*;
use crate::store::FailureClass;

pub(super) const MAX_MESSAGE: usize = 160;

/// What a flag says, in a few words.
pub(super) fn meaning(f: Flag) -> &'static str {
    match f {
        Flag::Noisy => "the median's 95 % CI is wider than ±2 %",
        Flag::Outliers => "1 % or more of the samples lie beyond Q3 + 3 IQR",
        Flag::SlowStart => "the first tenth of the samples is over 5 % slower",
        Flag::Drift => "the median moved over 3 % from the first third to the last",
        Flag::Throttled => "the SM clock fell over 8 % below its peak",
        Flag::TimerLimited => "the median is within a few µs of the timer's overhead",
        Flag::CapHit => "a cap stopped sampling before the median converged",
        Flag::Outpaced => "racing stopped sampling: clearly slower than the best so far",
    }
}

/// Per flag, per method: flagged jobs, and how many of them are bests.
pub(super) struct FlagCounts<'a> {
    pub(super) methods: Vec<(&'a str, usize)>,
    /// flag -> method -> (jobs, bests)
    pub(super) counts: BTreeMap<Flag, HashMap<&'a str, (usize, usize)>>,
}

pub(super) fn flag_counts<'a>(a: &Analysis<'_, '_, 'a>) -> FlagCounts<'a> {
    let best_ids: HashSet<&str> = a
        .group
        .shapes
        .iter()
        .flat_map(|s| s.methods.iter())
        .filter_map(|m| m.best.map(|b| b.job.job_id.as_str()))
        .collect();
    let mut timed: Vec<(&str, usize)> = a.methods.iter().map(|(m, _)| (*m, 0)).collect();
    let mut counts: BTreeMap<Flag, HashMap<&str, (usize, usize)>> = BTreeMap::new();
    for j in &a.jobs {
        let Some(stats) = a.stats_of(j) else { continue };
        if let Some(t) = timed.iter_mut().find(|(m, _)| *m == j.method) {
            t.1 += 1;
        }
        for f in distinct(stats.flags.iter().copied()) {
            if !a.shows_flag(f) {
                continue;
            }
            let e = counts
                .entry(f)
                .or_default()
                .entry(j.method.as_str())
                .or_default();
            e.0 += 1;
            if best_ids.contains(j.job_id.as_str()) {
                e.1 += 1;
            }
        }
    }
    timed.retain(|(_, n)| *n > 0);
    FlagCounts {
        methods: timed,
        counts,
    }
}

pub(super) fn flags_table(a: &Analysis<'_, '_, '_>, details_link: &str) -> (Option<Table>, String) {
    let fc = flag_counts(a);
    if fc.counts.is_empty() {
        return (None, "No timed job was flagged.".into());
    }
    let mut columns = vec!["Flag".to_string(), "Meaning".to_string()];
    columns.extend(
        fc.methods
            .iter()
            .map(|(m, n)| format!("{} ({n} timed)", cell(m))),
    );
    let rows = fc
        .counts
        .iter()
        .map(|(f, per)| {
            let mut r = vec![f.as_str().to_string(), meaning(*f).to_string()];
            for (m, _) in &fc.methods {
                r.push(match per.get(m) {
                    Some((n, 0)) => n.to_string(),
                    Some((n, b)) => format!("{n} ({b} best)"),
                    None => "0".into(),
                });
            }
            r
        })
        .collect();
    (
        Some(Table::new(columns, rows, &[0, 1])),
        format!("Flagged jobs, counted on the statistics each job's time comes from (its finalist re-timing where it has one); \"(k best)\": k of them are times the tables show, each listed in [the details]({details_link})."),
    )
}

/// A failures table of one class as one sentence, or `None`.
pub(super) fn single_class_line(table: &Table) -> Option<String> {
    let [row] = table.rows.as_slice() else {
        return None;
    };
    let [class, jobs, example] = row.as_slice() else {
        return None;
    };
    let n: u64 = jobs.parse().ok()?;
    Some(format!(
        "{} failed, all `{class}`; {}: {example}.",
        num::count(n, "job", "jobs"),
        if n == 1 { "it was" } else { "for example" }
    ))
}

pub(super) fn failures_table(a: &Analysis<'_, '_, '_>) -> Option<Table> {
    let mut by_class: Vec<(String, usize, &JobRecord)> = Vec::new();
    for j in a.jobs.iter().filter(|j| j.status == JobStatus::Failed) {
        let class = j
            .failure
            .as_ref()
            .map(|f| f.class.as_str())
            .unwrap_or("unclassified")
            .to_string();
        match by_class.iter_mut().find(|(c, _, _)| *c == class) {
            Some(e) => e.1 += 1,
            None => by_class.push((class, 1, j)),
        }
    }
    if by_class.is_empty() {
        return None;
    }
    by_class.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    let rows = by_class
        .into_iter()
        .map(|(class, n, j)| {
            let msg = j
                .failure
                .as_ref()
                .map(|f| truncate(&f.message, MAX_MESSAGE))
                .unwrap_or_default();
            vec![
                class,
                n.to_string(),
                cell(&format!(
                    "{}, {}, {}: {msg}",
                    j.method,
                    a.labels.label(&j.shape),
                    config_text(&j.config)
                )),
            ]
        })
        .collect();
    Some(Table::new(
        ["Class", "Jobs", "Example (method, shape, config: message)"]
            .map(String::from)
            .to_vec(),
        rows,
        &[0, 2],
    ))
}

/// Jobs that a later run tried again after a crash or a timeout: how many,
/// how they ended, and the first few by name.
pub(super) fn retried_line(a: &Analysis<'_, '_, '_>) -> Option<String> {
    const NAMED: usize = 3;
    let retried: Vec<&&JobRecord> = a
        .jobs
        .iter()
        .filter(|j| {
            a.group
                .results
                .replaced_failures
                .get(&j.job_id)
                .is_some_and(|f| {
                    f.iter()
                        .any(|c| matches!(c, FailureClass::Crash | FailureClass::Timeout))
                })
        })
        .collect();
    if retried.is_empty() {
        return None;
    }
    let passed = retried
        .iter()
        .filter(|j| j.status != JobStatus::Failed)
        .count();
    let named: Vec<String> = retried
        .iter()
        .take(NAMED)
        .map(|j| {
            let now = match &j.failure {
                Some(f) => f.class.as_str(),
                None => j.status.as_str(),
            };
            format!(
                "{}, {}, {} (now {now})",
                j.method,
                a.labels.label(&j.shape),
                config_text(&j.config)
            )
        })
        .collect();
    Some(format!(
        "{} crashed or timed out in an earlier run and ran again ({passed} then passed): {}{}.",
        num::count(retried.len() as u64, "job", "jobs"),
        named.join("; "),
        if retried.len() > NAMED { "; ..." } else { "" }
    ))
}

/// Skipped, pruned and checked-only jobs, counted per method and reason.
pub(super) fn skipped_lines(a: &Analysis<'_, '_, '_>) -> Vec<String> {
    let per = by_method(&a.jobs);
    let mut out = Vec::new();
    for (m, _) in &a.methods {
        let Some(jobs) = per.get(m) else { continue };
        let unavailable: Vec<&&JobRecord> = jobs
            .iter()
            .filter(|j| {
                j.status == JobStatus::Skipped
                    && j.failure
                        .as_ref()
                        .is_some_and(|f| f.class == FailureClass::Unavailable)
            })
            .collect();
        if !unavailable.is_empty() {
            let reasons = distinct(
                unavailable
                    .iter()
                    .filter_map(|j| j.failure.as_ref())
                    .map(|f| truncate(&f.message, MAX_MESSAGE)),
            );
            out.push(format!(
                "{m}: {} skipped, the method cannot run here ({}).",
                num::count(unavailable.len() as u64, "job", "jobs"),
                reasons.join("; ")
            ));
        }
        let budget = jobs
            .iter()
            .filter(|j| j.status == JobStatus::Skipped && j.failure.is_none())
            .count();
        if budget > 0 {
            out.push(format!(
                "{m}: {} skipped, the surrogate search spent its budget on others.",
                num::count(budget as u64, "config", "configs")
            ));
        }
        let pruned = jobs
            .iter()
            .filter(|j| j.status == JobStatus::Pruned)
            .count();
        if pruned > 0 {
            out.push(format!(
                "{m}: {} pruned by successive halving after screening.",
                num::count(pruned as u64, "config", "configs")
            ));
        }
        let checked = jobs
            .iter()
            .filter(|j| j.status == JobStatus::Checked)
            .count();
        if checked > 0 {
            out.push(format!(
                "{m}: {} checked only, not timed.",
                num::count(checked as u64, "job", "jobs")
            ));
        }
    }
    out
}
