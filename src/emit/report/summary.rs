//! The summary bullets at the top of the report.

use super::*;

pub(super) fn median(values: &mut [f64]) -> Option<f64> {
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

pub(super) fn summary(group: &Group<'_, '_>, methods: &[(&str, MethodKind)]) -> Vec<String> {
    let mut lines = Vec::new();
    let n_shapes = group.shapes.len();
    let with_best = group
        .shapes
        .iter()
        .filter(|s| s.overall_best().is_some())
        .count();
    lines.push(format!(
        "{with_best} of {} have a timed result; methods: {}.",
        num::count(n_shapes as u64, "shape", "shapes"),
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
