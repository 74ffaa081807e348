//! The charts: per sweep, latency, speedup over the reference and % of the
//! roofline bound against M (log scale), one line per method, written as
//! SVG files beside the report (`crate::emit::svg`).

use super::*;
use crate::emit::svg::{LineChart, Series, YScale};

/// One chart file, and how the report links it.
pub(super) struct ChartFile {
    /// The sweep it belongs to.
    pub(super) slug: String,
    pub(super) alt: String,
    /// Relative to the report.
    pub(super) link: String,
    /// Relative to the results directory.
    pub(super) path: PathBuf,
    pub(super) svg: String,
}

/// Fields equal to M in every shape (`N`, `K` of square GEMMs).
fn equal_to_m(shapes: &[&ShapeOutcome<'_>]) -> Vec<String> {
    let Some(first) = shapes.first() else {
        return Vec::new();
    };
    first
        .shape
        .keys()
        .filter(|k| *k != "M")
        .filter(|k| {
            shapes
                .iter()
                .all(|s| s.m().is_some() && s.shape.get(*k).and_then(select_int) == s.m())
        })
        .cloned()
        .collect()
}

fn select_int(v: &Json) -> Option<i64> {
    crate::emit::select::json_int(v)
}

pub(super) fn charts(a: &Analysis<'_, '_, '_>, paths: &Paths) -> Vec<ChartFile> {
    let mut out = Vec::new();
    for sweep in &a.sweeps {
        let ms: Vec<Option<i64>> = sweep.shapes.iter().map(|s| s.m()).collect();
        let distinct_ms = distinct(ms.iter().copied());
        if ms.iter().any(Option::is_none) || distinct_ms.len() != ms.len() || ms.len() < 2 {
            continue;
        }
        let x_label = if sweep.by_m {
            "M".to_string()
        } else {
            let eq = equal_to_m(&sweep.shapes);
            if eq.is_empty() {
                "M (the shapes differ in other fields too)".to_string()
            } else {
                format!("M (= {})", eq.join(" = "))
            }
        };
        let xs: Vec<f64> = ms.iter().map(|m| m.unwrap_or(0) as f64).collect();
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
        let line = |m: &str, f: &dyn Fn(&ShapeOutcome<'_>) -> Option<f64>| Series {
            name: m.to_string(),
            color: a.color(m).to_string(),
            dashed: false,
            points: xs
                .iter()
                .zip(&sweep.shapes)
                .map(|(x, s)| (*x, f(s)))
                .collect(),
        };
        let mut push = |kind: &str, what: &str, chart: LineChart| {
            let (path, link) = paths.chart(&sweep.slug, kind);
            out.push(ChartFile {
                slug: sweep.slug.clone(),
                alt: format!("{}: {what} vs M", sweep.title),
                link,
                path,
                svg: chart.render(),
            });
        };

        // Latency.
        let mut series: Vec<Series> = methods
            .iter()
            .map(|m| {
                line(m, &|s| {
                    s.method(m).and_then(|o| o.best).map(|b| b.time_us())
                })
            })
            .collect();
        if let Reference::Baseline(b) = a.reference {
            let mut base = line(b, &|s| a.reference_at(s).map(|t| t.time_us()));
            base.name = if a.methods_with_baseline().len() > 1 {
                format!("{b}'s baseline")
            } else {
                "baseline".into()
            };
            base.color = BASELINE_COLOR.into();
            base.dashed = true;
            series.push(base);
        }
        push(
            "latency",
            "latency",
            LineChart {
                title: format!("{}: latency vs M", sweep.title),
                x_label: x_label.clone(),
                y_label: "best median µs".into(),
                y_scale: YScale::Auto,
                y_include: Vec::new(),
                series,
                reference: None,
                floor: None,
            },
        );

        // Speedup over the reference.
        if a.reference != Reference::None {
            let name = a.reference_name();
            let series: Vec<Series> = methods
                .iter()
                .filter(|m| a.reference != Reference::Method(m))
                .map(|m| {
                    line(m, &|s| {
                        ratio(a.reference_at(s), s.method(m).and_then(|o| o.best))
                    })
                })
                .collect();
            if !series.is_empty() {
                push(
                    "speedup",
                    "speedup",
                    LineChart {
                        title: format!("{}: speedup over {name}", sweep.title),
                        x_label: x_label.clone(),
                        y_label: format!("{name} µs / method µs"),
                        y_scale: YScale::Auto,
                        y_include: vec![1.0],
                        series,
                        reference: Some((1.0, name)),
                        // An untuned method 10× slower would flatten the rest.
                        floor: Some(0.25),
                    },
                );
            }
        }

        // % of the roofline bound.
        if a.gpu {
            let series: Vec<Series> = methods
                .iter()
                .map(|m| {
                    line(m, &|s| {
                        s.method(m)
                            .and_then(|o| o.best)
                            .and_then(|b| b.roofline_pct())
                    })
                })
                .filter(|s| s.points.iter().any(|p| p.1.is_some()))
                .collect();
            if !series.is_empty() {
                push(
                    "bound",
                    "% of bound",
                    LineChart {
                        title: format!("{}: % of roofline bound", sweep.title),
                        x_label,
                        y_label: "% of bound".into(),
                        y_scale: YScale::Linear,
                        y_include: vec![0.0, 100.0],
                        series,
                        reference: None,
                        floor: None,
                    },
                );
            }
        }
    }
    out
}
