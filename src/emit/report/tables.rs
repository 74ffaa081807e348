//! Tables across methods: the best median of every method per shape, and
//! (moe) the % of the bandwidth bound.

use super::*;

pub(super) fn comparison_table(
    labels: &ShapeLabels,
    shapes: &[&ShapeOutcome<'_>],
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

pub(super) fn bandwidth_table(
    group: &Group<'_, '_>,
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
    let pct = |t: Option<Timed<'_>>| t.and_then(|t| t.gbs()).map(|g| g / peak * 100.0);
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
