//! One table per sweep (shapes that differ only in M): M down, one column
//! per method (its best µs, the fastest in bold), the baseline, the primary
//! method's speedup over it, its % of the roofline bound and its config.
//! The heading sums the sweep up and the charts sit under it.

use super::charts::ChartFile;
use super::*;
use crate::measure::geomean;

#[derive(Serialize)]
pub(super) struct SweepTable {
    title: String,
    charts: String,
    table: Table,
}

/// `bandwidth-bound`, `compute-bound from M=1024`, ...: which bound binds
/// the primary method's bests across a sweep.
fn bound_description(kinds: &[(Option<i64>, &'static str)], by_m: bool) -> Option<String> {
    if kinds.is_empty() {
        return None;
    }
    let all = |k: &str| kinds.iter().all(|(_, x)| *x == k);
    if all("bandwidth") {
        return Some("bandwidth-bound".into());
    }
    if all("compute") {
        return Some("compute-bound".into());
    }
    let first_compute = kinds.iter().position(|(_, k)| *k == "compute")?;
    let switches_once = kinds[first_compute..].iter().all(|(_, k)| *k == "compute");
    match (by_m, switches_once, kinds[first_compute].0) {
        (true, true, Some(m)) => Some(format!("compute-bound from M={m}")),
        _ => Some(format!(
            "compute-bound at {} of {}",
            kinds.iter().filter(|(_, k)| *k == "compute").count(),
            kinds.len()
        )),
    }
}

fn title(a: &Analysis<'_, '_, '_>, sweep: &Sweep<'_, '_>) -> String {
    let mut parts = vec![sweep.title.clone()];
    let Some(p) = a.primary else {
        return sweep.title.clone();
    };
    let speedups: Vec<f64> = sweep
        .shapes
        .iter()
        .filter_map(|s| ratio(a.reference_at(s), s.method(p).and_then(|o| o.best)))
        .collect();
    if a.reference != Reference::Method(p) {
        if let Some(g) = geomean(speedups.iter().copied()) {
            parts.push(format!("{p} {} over {}", num::times(g), a.reference_name()));
        }
    }
    if a.gpu {
        let bests = bests(&sweep.shapes, p);
        let pcts: Vec<f64> = bests
            .iter()
            .filter_map(|(_, _, b)| b.roofline_pct())
            .collect();
        if let (Some(lo), Some(hi)) = (
            pcts.iter().copied().reduce(f64::min),
            pcts.iter().copied().reduce(f64::max),
        ) {
            let kinds: Vec<(Option<i64>, &'static str)> = bests
                .iter()
                .filter_map(|(s, _, b)| Some((s.m(), bound_kind(b.job, &a.group.header.device)?)))
                .collect();
            let mut text = if (hi - lo).abs() < 0.05 {
                format!("{lo:.1} % of bound")
            } else {
                format!("{lo:.1}–{hi:.1} % of bound")
            };
            if let Some(d) = bound_description(&kinds, sweep.by_m) {
                text.push_str(&format!(" ({d})"));
            }
            parts.push(text);
        }
    }
    parts.join(" · ")
}

pub(super) fn sweep_tables(a: &Analysis<'_, '_, '_>, charts: &[ChartFile]) -> Vec<SweepTable> {
    a.sweeps
        .iter()
        .map(|sweep| SweepTable {
            title: title(a, sweep),
            charts: charts
                .iter()
                .filter(|c| c.slug == sweep.slug)
                .map(|c| format!("![{}]({})", c.alt, c.link))
                .collect::<Vec<_>>()
                .join(" "),
            table: table(a, sweep),
        })
        .collect()
}

fn table(a: &Analysis<'_, '_, '_>, sweep: &Sweep<'_, '_>) -> Table {
    let methods: Vec<&str> = a
        .methods
        .iter()
        .map(|(m, _)| *m)
        .filter(|m| {
            sweep
                .shapes
                .iter()
                .any(|s| s.method(m).is_some_and(|o| o.best.is_some()))
        })
        .collect();
    let primary = a.primary;
    let baseline_col = matches!(a.reference, Reference::Baseline(_));
    let speedup_col = primary.is_some()
        && match a.reference {
            Reference::Baseline(_) => true,
            Reference::Method(m) => Some(m) != primary,
            Reference::None => false,
        };
    let bound_col = a.gpu && primary.is_some();

    let mut columns = vec![if sweep.by_m { "M" } else { "Shape" }.to_string()];
    columns.extend(methods.iter().map(|m| format!("{} µs", cell(m))));
    if baseline_col {
        columns.push("baseline µs".into());
    }
    if speedup_col {
        columns.push(match a.reference {
            Reference::Method(m) => format!("vs {}", cell(m)),
            _ => "speedup".into(),
        });
    }
    if bound_col {
        columns.push("% of bound".into());
    }
    if let Some(p) = primary {
        columns.push(format!("{} config", cell(p)));
    }
    let mut text_cols = Vec::new();
    if !sweep.by_m {
        text_cols.push(0);
    }
    if primary.is_some() {
        text_cols.push(columns.len() - 1);
    }

    let rows = sweep
        .shapes
        .iter()
        .map(|s| {
            let mut r = vec![if sweep.by_m {
                s.m().map(|m| m.to_string()).unwrap_or_else(|| DASH.into())
            } else {
                cell(&a.shape_label(s))
            }];
            let fastest = methods
                .iter()
                .filter_map(|m| s.method(m).and_then(|o| o.best).map(|b| b.time_us()))
                .reduce(f64::min);
            for m in &methods {
                r.push(match s.method(m).and_then(|o| o.best) {
                    Some(b) if Some(b.time_us()) == fastest && methods.len() > 1 => {
                        format!("**{}**", num::us(b.time_us()))
                    }
                    Some(b) => num::us(b.time_us()),
                    None => DASH.into(),
                });
            }
            let best = primary.and_then(|p| s.method(p)).and_then(|o| o.best);
            if baseline_col {
                r.push(
                    a.reference_at(s)
                        .map(|t| num::us(t.time_us()))
                        .unwrap_or_else(|| DASH.into()),
                );
            }
            if speedup_col {
                r.push(num::speedup(ratio(a.reference_at(s), best)));
            }
            if bound_col {
                r.push(num::fixed(best.and_then(|b| b.roofline_pct()), 1));
            }
            if let Some(p) = primary {
                r.push(match (best, s.method(p)) {
                    (Some(b), _) if b.job.baseline => "= baseline".into(),
                    (Some(b), _) => cell(&config_text(&b.job.config)),
                    (None, Some(o)) if !o.jobs.is_empty() => {
                        format!("no timed job ({})", status_counts(&o.jobs))
                    }
                    _ => DASH.into(),
                });
            }
            r
        })
        .collect();
    Table::new(columns, rows, &text_cols)
}

#[cfg(test)]
mod tests {
    use super::bound_description;

    #[test]
    fn bounds_are_described_by_where_they_switch() {
        let bw = "bandwidth";
        let co = "compute";
        assert_eq!(
            bound_description(&[(Some(1), bw), (Some(2), bw)], true).as_deref(),
            Some("bandwidth-bound")
        );
        assert_eq!(
            bound_description(&[(Some(1), bw), (Some(1024), co), (Some(4096), co)], true)
                .as_deref(),
            Some("compute-bound from M=1024")
        );
        assert_eq!(
            bound_description(&[(Some(1), co), (Some(2), bw), (Some(4), co)], true).as_deref(),
            Some("compute-bound at 2 of 3")
        );
        assert_eq!(bound_description(&[], true), None);
    }
}
