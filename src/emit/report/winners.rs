//! The winners table: per (shape, method) the best config, its time and
//! confidence interval, throughput, the baseline and the speedup over it.

use super::*;

#[derive(Serialize)]
pub(super) struct Winner {
    pub(super) shape: String,
    pub(super) method: String,
    pub(super) config: String,
    pub(super) median: String,
    pub(super) ci: String,
    pub(super) tflops: String,
    pub(super) gbs: String,
    pub(super) roofline: String,
    pub(super) baseline: String,
    pub(super) speedup: String,
    pub(super) notes: String,
}

pub(super) fn winner(
    group: &Group<'_, '_>,
    labels: &ShapeLabels,
    s: &ShapeOutcome<'_>,
    m: &crate::emit::MethodOutcome<'_>,
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

pub(super) fn baseline_status(job: Option<&JobRecord>) -> String {
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

pub(super) fn status_summary(jobs: &[&JobRecord]) -> String {
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

pub(super) fn ci(s: &Stats) -> String {
    if s.ci_low_us.is_finite() && s.ci_high_us.is_finite() && s.ci_high_us > 0.0 {
        format!("{} – {}", num::us(s.ci_low_us), num::us(s.ci_high_us))
    } else {
        DASH.into()
    }
}
