//! Failures by class, and noise flags with the jobs that carry them.

use super::*;

pub(super) const MAX_FLAG_JOBS: usize = 10;

pub(super) const MAX_MESSAGE: usize = 240;

#[derive(Serialize)]
pub(super) struct FailureRow {
    pub(super) class: String,
    pub(super) count: usize,
    pub(super) example: String,
}

#[derive(Serialize)]
pub(super) struct FlagRow {
    pub(super) flag: String,
    pub(super) count: usize,
    pub(super) jobs: String,
}

pub(super) fn failures(labels: &ShapeLabels, jobs: &[&JobRecord]) -> Vec<FailureRow> {
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

pub(super) fn flags(group: &Group<'_, '_>, jobs: &[&JobRecord]) -> Vec<FlagRow> {
    // Flags order themselves as reports list them.
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
