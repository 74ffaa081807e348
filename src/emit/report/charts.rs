//! Latency-vs-M charts (mermaid `xychart-beta`), one per group of shapes
//! that differ only in M.

use super::*;

/// Line colours of the charts, and their names for the legend.
pub(super) const PALETTE: &[(&str, &str)] = &[
    ("#2563eb", "blue"),
    ("#dc2626", "red"),
    ("#16a34a", "green"),
    ("#9333ea", "purple"),
    ("#ea580c", "orange"),
    ("#0891b2", "cyan"),
    ("#4b5563", "grey"),
    ("#ca8a04", "yellow"),
];

#[derive(Serialize)]
pub(super) struct Chart {
    pub(super) title: String,
    pub(super) x: String,
    pub(super) lines: Vec<String>,
    pub(super) palette: String,
    pub(super) legend: String,
    pub(super) note: Option<String>,
}

/// Shapes that differ only in M, each group with its label; in shape order.
pub(super) fn chart_groups<'s, 'a>(
    shapes: &[&'s ShapeOutcome<'a>],
) -> Vec<(ShapeFields, Vec<&'s ShapeOutcome<'a>>)> {
    let mut groups: Vec<(String, ShapeFields, Vec<&ShapeOutcome<'_>>)> = Vec::new();
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

pub(super) fn charts(group: &Group<'_, '_>, labels: &ShapeLabels, moe: bool) -> Vec<Chart> {
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
            let outcomes: Vec<Option<&crate::emit::MethodOutcome<'_>>> =
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

pub(super) fn chart_value(x: f64) -> String {
    let s = num::us(x);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}
