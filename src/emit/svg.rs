//! A small SVG line-chart writer for the report's charts: a log2 x axis (M),
//! a linear or log10 y axis, a legend below the plot, axis labels, and an
//! optional horizontal reference line. The output is self-contained SVG 1.1
//! (white background, no scripts, no external fonts), so GitHub renders it
//! as an image, and byte-for-byte deterministic for a given chart.

use std::fmt::Write;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    /// A CSS colour (`#2563eb`).
    pub color: String,
    pub dashed: bool,
    /// (x, y) in x order; a `None` y breaks the line there.
    pub points: Vec<(f64, Option<f64>)>,
}

/// How the y axis is scaled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum YScale {
    Linear,
    Log,
    /// Log when the values span a factor of 4 or more, else linear.
    Auto,
}

#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub y_scale: YScale,
    /// Values the y axis must include (0 for a percentage, 1 for a speedup).
    pub y_include: Vec<f64>,
    pub series: Vec<Series>,
    /// A dashed horizontal line at this y, with its label.
    pub reference: Option<(f64, String)>,
    /// Series whose every value lies below this are left off the plot, so
    /// they do not squash the others; the legend gives their range.
    pub floor: Option<f64>,
}

const WIDTH: f64 = 460.0;
const PLOT_HEIGHT: f64 = 210.0;
const LEFT: f64 = 58.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 34.0;
const FONT: &str = "Helvetica, Arial, sans-serif";
const LEGEND_ROW: f64 = 17.0;

/// Axis ticks and the mapping of values onto it.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    ticks: Vec<f64>,
}

impl Axis {
    /// 0 at `lo`, 1 at `hi`.
    fn frac(&self, v: f64) -> f64 {
        if self.log {
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }
}

/// The x axis: log2, ticks at powers of two (thinned to at most 7), or at
/// the data's ends when fewer than two powers of two fall in the range.
fn x_axis(xs: &[f64]) -> Axis {
    let (mut lo, mut hi) = min_max(xs).unwrap_or((1.0, 2.0));
    if lo <= 0.0 {
        lo = hi.max(1.0) / 2.0;
    }
    if hi <= lo {
        lo /= 2.0;
        hi *= 2.0;
    }
    let (a, b) = (lo.log2().ceil() as i32, hi.log2().floor() as i32);
    let count = (b - a + 1).max(0);
    let mut step = 1;
    while count / step > 6 {
        step += 1;
    }
    let mut ticks: Vec<f64> = (a..=b)
        .filter(|e| (e - a) % step == 0)
        .map(|e| 2f64.powi(e))
        .collect();
    if ticks.len() < 2 {
        ticks = vec![lo, hi];
        ticks.dedup();
    }
    // A little room either side of the first and last point.
    let pad = 2f64.powf(((hi / lo).log2() * 0.04).max(0.05));
    Axis {
        lo: lo / pad,
        hi: hi * pad,
        log: true,
        ticks,
    }
}

fn y_axis(values: &[f64], include: &[f64], scale: YScale) -> Axis {
    let all: Vec<f64> = values.iter().chain(include).copied().collect();
    let (lo, hi) = min_max(&all).unwrap_or((0.0, 1.0));
    let positive = lo > 0.0;
    let log = match scale {
        YScale::Log => positive,
        YScale::Linear => false,
        YScale::Auto => positive && hi / lo >= 4.0,
    };
    if log {
        if let Some(axis) = log_axis(lo, hi) {
            return axis;
        }
    }
    linear_axis(lo, hi)
}

fn log_axis(lo: f64, hi: f64) -> Option<Axis> {
    let (lo, hi) = (lo / 1.12, hi * 1.12);
    let candidates = |mantissas: &[f64]| -> Vec<f64> {
        let mut out = Vec::new();
        for e in (lo.log10().floor() as i32)..=(hi.log10().ceil() as i32) {
            for m in mantissas {
                let v = m * 10f64.powi(e);
                if v >= lo && v <= hi {
                    out.push(v);
                }
            }
        }
        out
    };
    // Round values, as many as read well: 1-2-5, else 1-3, else decades,
    // else every integer mantissa for a narrow range.
    let mut ticks = Vec::new();
    for mantissas in [&[1.0, 2.0, 5.0][..], &[1.0, 3.0], &[1.0]] {
        ticks = candidates(mantissas);
        if (3..=8).contains(&ticks.len()) {
            break;
        }
    }
    if ticks.len() < 2 {
        ticks = candidates(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    }
    (ticks.len() >= 2).then_some(Axis {
        lo,
        hi,
        log: true,
        ticks,
    })
}

fn linear_axis(lo: f64, hi: f64) -> Axis {
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, hi + 0.5)
    };
    let raw = (hi - lo) / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let start = (lo / step).floor() * step;
    let end = (hi / step).ceil() * step;
    let n = ((end - start) / step).round() as i64;
    let ticks = (0..=n).map(|i| start + i as f64 * step).collect();
    Axis {
        lo: start,
        hi: end,
        log: false,
        ticks,
    }
}

fn min_max(xs: &[f64]) -> Option<(f64, f64)> {
    let finite = xs.iter().copied().filter(|x| x.is_finite());
    let lo = finite.clone().reduce(f64::min)?;
    let hi = finite.reduce(f64::max)?;
    Some((lo, hi))
}

/// A tick label: at most three significant digits, no trailing zeros.
pub fn tick_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let decimals = if a >= 100.0 {
        0
    } else {
        (2 - a.log10().floor() as i32).clamp(0, 6) as usize
    };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Rounded to two significant digits.
fn two_digits(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(1 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// Text safe inside an XML element or attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

/// A coordinate, rounded for a stable and short file.
fn c(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

/// Approximate width of `text` at `size` px in a sans-serif face.
fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.56
}

impl LineChart {
    /// The chart as an SVG document.
    pub fn render(&self) -> String {
        let values = |s: &Series| -> Vec<f64> {
            s.points
                .iter()
                .filter_map(|p| p.1)
                .filter(|y| y.is_finite())
                .collect()
        };
        let below = |s: &Series| {
            self.floor.is_some_and(|f| {
                let v = values(s);
                !v.is_empty() && v.iter().all(|y| *y < f)
            })
        };
        let legend_name = |s: &Series| {
            let v = values(s);
            match (below(s), min_max(&v)) {
                (true, Some((lo, hi))) => {
                    format!(
                        "{} ({}–{}, below the chart)",
                        s.name,
                        tick_label(two_digits(lo)),
                        tick_label(two_digits(hi))
                    )
                }
                _ => s.name.clone(),
            }
        };
        let drawn: Vec<&Series> = self.series.iter().filter(|s| !below(s)).collect();
        let xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        let ys: Vec<f64> = drawn
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|p| p.1))
            .filter(|y| y.is_finite())
            .collect();
        let mut include = self.y_include.clone();
        if let Some((r, _)) = &self.reference {
            include.push(*r);
        }
        let x = x_axis(&xs);
        let y = y_axis(&ys, &include, self.y_scale);

        // The legend: entries flow left to right, wrapping at the width.
        let mut legend: Vec<(f64, f64, &Series, String)> = Vec::new();
        let (mut lx, mut row) = (LEFT, 0usize);
        for s in &self.series {
            let name = legend_name(s);
            let w = 26.0 + text_width(&name, 11.0) + 14.0;
            if lx + w > WIDTH - RIGHT && lx > LEFT {
                lx = LEFT;
                row += 1;
            }
            legend.push((lx, row as f64, s, name));
            lx += w;
        }
        let plot_bottom = TOP + PLOT_HEIGHT;
        let legend_top = plot_bottom + 48.0;
        let height = if self.series.is_empty() {
            plot_bottom + 40.0
        } else {
            legend_top + row as f64 * LEGEND_ROW + 8.0
        };
        let plot_w = WIDTH - LEFT - RIGHT;
        let px = |v: f64| LEFT + x.frac(v) * plot_w;
        let py = |v: f64| plot_bottom - y.frac(v) * PLOT_HEIGHT;

        let mut o = String::new();
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT}" role="img">"#,
            w = c(WIDTH),
            h = c(height)
        );
        let _ = writeln!(o, "<title>{}</title>", escape(&self.title));
        let _ = writeln!(
            o,
            r##"<rect x="0" y="0" width="{}" height="{}" fill="#ffffff"/>"##,
            c(WIDTH),
            c(height)
        );
        let _ = writeln!(
            o,
            r##"<text x="{}" y="20" font-size="13" font-weight="bold" fill="#111827">{}</text>"##,
            c(LEFT),
            escape(&self.title)
        );
        // Grid and ticks.
        for t in &y.ticks {
            let yy = py(*t);
            let _ = writeln!(
                o,
                r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#e5e7eb" stroke-width="1"/>"##,
                c(LEFT),
                c(yy),
                c(WIDTH - RIGHT),
                c(yy)
            );
            let _ = writeln!(
                o,
                r##"<text x="{}" y="{}" font-size="10" fill="#374151" text-anchor="end">{}</text>"##,
                c(LEFT - 5.0),
                c(yy + 3.5),
                tick_label(*t)
            );
        }
        for t in &x.ticks {
            let xx = px(*t);
            let _ = writeln!(
                o,
                r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#f3f4f6" stroke-width="1"/>"##,
                c(xx),
                c(TOP),
                c(xx),
                c(plot_bottom)
            );
            let _ = writeln!(
                o,
                r##"<text x="{}" y="{}" font-size="10" fill="#374151" text-anchor="middle">{}</text>"##,
                c(xx),
                c(plot_bottom + 14.0),
                tick_label(*t)
            );
        }
        let _ = writeln!(
            o,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#9ca3af" stroke-width="1"/>"##,
            c(LEFT),
            c(TOP),
            c(plot_w),
            c(PLOT_HEIGHT)
        );
        let _ = writeln!(
            o,
            r##"<text x="{}" y="{}" font-size="11" fill="#111827" text-anchor="middle">{}</text>"##,
            c(LEFT + plot_w / 2.0),
            c(plot_bottom + 30.0),
            escape(&self.x_label)
        );
        let _ = writeln!(
            o,
            r##"<text x="14" y="{y}" font-size="11" fill="#111827" text-anchor="middle" transform="rotate(-90 14 {y})">{}</text>"##,
            escape(&self.y_label),
            y = c(TOP + PLOT_HEIGHT / 2.0)
        );
        if let Some((r, label)) = &self.reference {
            let yy = py(*r);
            let _ = writeln!(
                o,
                r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#6b7280" stroke-width="1" stroke-dasharray="2 3"/>"##,
                c(LEFT),
                c(yy),
                c(WIDTH - RIGHT),
                c(yy)
            );
            let _ = writeln!(
                o,
                r##"<text x="{}" y="{}" font-size="9" fill="#6b7280">{}</text>"##,
                c(LEFT + 4.0),
                // Under the line, unless that is the plot's bottom edge.
                c(if yy > plot_bottom - 14.0 {
                    yy - 3.0
                } else {
                    yy + 11.0
                }),
                escape(label)
            );
        }
        // The lines, each broken where a value is missing, with a marker per point.
        for s in &drawn {
            let dash = if s.dashed {
                r#" stroke-dasharray="6 3""#
            } else {
                ""
            };
            let color = escape(&s.color);
            let mut run: Vec<String> = Vec::new();
            let flush = |run: &mut Vec<String>, o: &mut String| {
                if run.len() > 1 {
                    let _ = writeln!(
                        o,
                        r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
                        run.join(" ")
                    );
                }
                run.clear();
            };
            for (xv, yv) in &s.points {
                match yv.filter(|v| v.is_finite() && (!y.log || *v > 0.0)) {
                    Some(v) => run.push(format!("{},{}", c(px(*xv)), c(py(v)))),
                    None => flush(&mut run, &mut o),
                }
            }
            flush(&mut run, &mut o);
            for (xv, yv) in &s.points {
                if let Some(v) = yv.filter(|v| v.is_finite() && (!y.log || *v > 0.0)) {
                    let _ = writeln!(
                        o,
                        r#"<circle cx="{}" cy="{}" r="2.5" fill="{color}"/>"#,
                        c(px(*xv)),
                        c(py(v))
                    );
                }
            }
        }
        for (lx, row, s, name) in legend {
            let ly = legend_top + row * LEGEND_ROW;
            let dash = if s.dashed {
                r#" stroke-dasharray="6 3""#
            } else {
                ""
            };
            let _ = writeln!(
                o,
                r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2"{dash}/>"#,
                c(lx),
                c(ly - 4.0),
                c(lx + 20.0),
                c(ly - 4.0),
                escape(&s.color)
            );
            let _ = writeln!(
                o,
                r##"<text x="{}" y="{}" font-size="11" fill="#111827">{}</text>"##,
                c(lx + 26.0),
                c(ly),
                escape(&name)
            );
        }
        o.push_str("</svg>\n");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(points: Vec<(f64, Option<f64>)>) -> LineChart {
        LineChart {
            title: "E=128 N=2880: latency vs M".into(),
            x_label: "M (tokens)".into(),
            y_label: "µs".into(),
            y_scale: YScale::Auto,
            y_include: Vec::new(),
            series: vec![Series {
                name: "a <b> & 'c'".into(),
                color: "#2563eb".into(),
                dashed: false,
                points,
            }],
            reference: Some((1.0, "baseline".into())),
            floor: None,
        }
    }

    #[test]
    fn powers_of_two_label_the_m_axis() {
        let xs: Vec<f64> = [
            1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 4096,
        ]
        .iter()
        .map(|&m| m as f64)
        .collect();
        let ticks: Vec<String> = x_axis(&xs).ticks.iter().map(|t| tick_label(*t)).collect();
        assert_eq!(ticks, ["1", "4", "16", "64", "256", "1024", "4096"]);
        // Two points between powers of two: their own values.
        let ticks: Vec<String> = x_axis(&[24.0, 48.0])
            .ticks
            .iter()
            .map(|t| tick_label(*t))
            .collect();
        assert_eq!(ticks, ["24", "48"]);
    }

    #[test]
    fn log_and_linear_axes_pick_round_ticks() {
        let y = y_axis(&[28.0, 2400.0], &[], YScale::Auto);
        assert!(y.log);
        assert_eq!(
            y.ticks.iter().map(|t| tick_label(*t)).collect::<Vec<_>>(),
            ["50", "100", "200", "500", "1000", "2000"]
        );
        let y = y_axis(&[12.3, 91.7], &[0.0], YScale::Linear);
        assert!(!y.log);
        assert_eq!((y.lo, y.hi), (0.0, 100.0));
        assert_eq!(tick_label(0.05), "0.05");
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(1000.0), "1000");
    }

    #[test]
    fn text_is_escaped_and_missing_points_break_the_line() {
        let svg = chart(vec![
            (1.0, Some(30.0)),
            (2.0, Some(40.0)),
            (4.0, None),
            (8.0, Some(90.0)),
            (16.0, Some(120.0)),
        ])
        .render();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.contains("a &lt;b&gt; &amp; &apos;c&apos;"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.ends_with("</svg>\n"));
    }
}
