//! An A/B run's verdicts and its report (`tunelab ab`, docs/ab.md), worked
//! out from its journal alone: the last A/B setup, and its pair records.
//!
//! A pair's verdict: the 95 % t-interval of the mean log ratio B / A over
//! its A/B rounds, against an equivalence margin of the larger of the
//! setup's threshold and what its A/A rounds measured (how far apart A and
//! a second preparation of A came out); FAST / SAME / SLOW / AMBIGUOUS
//! (`measure::paired`). The report is for a pull request: the headline, the
//! noise floor, the machine, the pairs that are not SAME, within 100 lines;
//! every pair in a fold after it.

use std::fmt::Write;

use super::compare::pct;
use super::machine::Machine;
use super::num::{compact_config, count, json_text};
use crate::manifest::OutputFormat;
use crate::measure::paired::{
    apparent_difference, equivalence, ratio_interval, round_spread, RatioInterval,
};
use crate::measure::{geomean, Verdict};
use crate::store::{AbPair, AbSetup, AbSide, PicksSource, Results, RunHeader};

/// One pair judged.
#[derive(Debug, Clone)]
pub struct Judged<'a> {
    pub pair: &'a AbPair,
    /// B / A over the A/B rounds; none without two rounds.
    pub interval: Option<RatioInterval>,
    /// How far apart A and its second preparation came out (A/A rounds).
    pub aa: Option<f64>,
    /// The equivalence margin: the larger of the threshold and `aa`.
    pub margin: f64,
    /// How much one round's B / A moved.
    pub spread: Option<f64>,
    /// None where the pair failed or has too few rounds.
    pub verdict: Option<Verdict>,
}

impl Judged<'_> {
    /// B's time over A's, as a fraction: +0.03 is B 3 % slower.
    pub fn change(&self) -> Option<f64> {
        self.interval.map(|i| i.ratio - 1.0)
    }
}

/// Every pair of an A/B, judged.
#[derive(Debug, Clone)]
pub struct AbOutcome<'a> {
    pub header: &'a RunHeader,
    pub setup: &'a AbSetup,
    pub pairs: Vec<Judged<'a>>,
}

/// Judges one pair at `threshold`.
pub fn judge(pair: &AbPair, threshold: f64) -> Judged<'_> {
    let logs: Vec<f64> = pair.rounds.iter().map(|r| r.log_ratio()).collect();
    let aa_logs: Vec<f64> = pair.aa.iter().map(|r| r.log_ratio()).collect();
    let interval = ratio_interval(&logs);
    let aa = apparent_difference(&aa_logs);
    let margin = threshold.max(aa.unwrap_or(0.0));
    Judged {
        pair,
        interval,
        aa,
        margin,
        spread: round_spread(&logs),
        verdict: interval
            .filter(|_| pair.failure.is_none())
            .map(|i| equivalence(&i, margin)),
    }
}

impl<'a> AbOutcome<'a> {
    /// The last A/B of a journal, its pairs in journal order; none where
    /// the journal holds no A/B.
    pub fn of(results: &'a Results) -> Option<AbOutcome<'a>> {
        let header = results.header.as_ref()?;
        let setup = results.ab_setups.last()?;
        let pairs = results
            .ab_pairs
            .iter()
            .filter(|p| p.setup == setup.id)
            .map(|p| judge(p, setup.threshold))
            .collect();
        Some(AbOutcome {
            header,
            setup,
            pairs,
        })
    }

    pub fn count(&self, v: Verdict) -> usize {
        self.pairs.iter().filter(|p| p.verdict == Some(v)).count()
    }

    /// Pairs that failed or have no verdict.
    pub fn failed(&self) -> Vec<&Judged<'a>> {
        self.pairs.iter().filter(|p| p.verdict.is_none()).collect()
    }

    /// The geometric mean of B / A over the judged pairs.
    pub fn geomean_ratio(&self) -> Option<f64> {
        geomean(
            self.pairs
                .iter()
                .filter_map(|p| p.interval)
                .map(|i| i.ratio),
        )
    }

    /// SLOW pairs whose B is more than `threshold` slower, worst first: what
    /// a gate fails on.
    pub fn regressions(&self, threshold: f64) -> Vec<&Judged<'a>> {
        let mut out: Vec<&Judged<'a>> = self
            .pairs
            .iter()
            .filter(|p| p.verdict == Some(Verdict::Slow) && p.change() > Some(threshold))
            .collect();
        out.sort_by(|a, b| b.change().partial_cmp(&a.change()).expect("finite"));
        out
    }

    /// `B against A over 74 pairs: 70 SAME, 3 AMBIGUOUS, 1 SLOW, 0 FAST; B/A 1.002× geomean`.
    pub fn headline(&self) -> String {
        let failed = match self.failed().len() {
            0 => String::new(),
            n => format!(", {n} without a verdict"),
        };
        let geomean = self
            .geomean_ratio()
            .map(|g| format!("; B/A {g:.3}× geomean ({:+.1} %)", (g - 1.0) * 100.0))
            .unwrap_or_default();
        format!(
            "B against A over {}: {} SAME, {} AMBIGUOUS, {} SLOW, {} FAST{failed}{geomean}",
            count(self.pairs.len() as u64, "pair", "pairs"),
            self.count(Verdict::Same),
            self.count(Verdict::Ambiguous),
            self.count(Verdict::Slow),
            self.count(Verdict::Fast),
        )
    }

    fn machine(&self) -> Machine {
        Machine::of(
            self.header,
            self.pairs
                .iter()
                .flat_map(|p| [p.pair.a_stats.as_ref(), p.pair.b_stats.as_ref()])
                .flatten(),
        )
    }
}

/// Rows of pairs shown before the details fold: with the lines around
/// them, the report stays within 100 lines there.
const SHOWN: usize = 40;

/// The report of the last A/B of `results` (`report.md` of its results
/// directory), or none where the journal holds no A/B.
pub fn render(results: &Results) -> Option<super::Rendered> {
    let o = AbOutcome::of(results)?;
    Some(super::Rendered {
        format: OutputFormat::Report,
        path: "report.md".into(),
        contents: markdown(&o),
    })
}

fn side(label: &str, s: &AbSide) -> String {
    let picks = match s.source {
        PicksSource::Results => format!("the picks of `{}`", s.picks),
        PicksSource::Shipped => format!("the configs of the shipped `{}`", s.picks),
    };
    let code = if s.code.is_empty() {
        "the working tree's code".to_string()
    } else {
        s.code
            .iter()
            .map(|c| {
                format!(
                    "`{}` from `{}` (BLAKE3 {})",
                    c.module,
                    c.from,
                    &c.blake3[..12]
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("- **{label}**: {picks}, run with {code}.")
}

/// Quantile `q` of `xs` (sorted here), for the noise floor's lines.
fn quantile(mut xs: Vec<f64>, q: f64) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    (!xs.is_empty()).then(|| crate::measure::quantile(&xs, q))
}

/// The report's markdown.
pub fn markdown(o: &AbOutcome<'_>) -> String {
    let mut out = String::new();
    let h = o.header;
    let s = o.setup;
    let _ = writeln!(
        out,
        "# A/B: {} on {}\n",
        h.experiment.trim_end_matches("-ab"),
        h.device.name
    );
    let _ = writeln!(out, "**{}**\n", o.headline());
    if h.mode == crate::plan::Mode::Interpreter {
        let _ = writeln!(out, "Timed in Triton's interpreter on the CPU: these timings check the pipeline, they measure nothing.\n");
    }
    let _ = writeln!(out, "{}", side("A", &s.a));
    let _ = writeln!(out, "{}", side("B", &s.b));
    if s.plant > 0.0 {
        let _ = writeln!(
            out,
            "- **B carries a planted slowdown** (a testing knob): a spin of {} of A's median in the A/A rounds after each of B's launches, inside the timed region.",
            pct(s.plant)
        );
    }
    let p = &h.protocol;
    let flush = match p.timing {
        crate::measure::Timing::Cold if p.flush != crate::measure::L2Flush::Off => {
            format!(", L2 flushed ({}) before each sample", p.flush.as_str())
        }
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "- Each pair: {} rounds of A against a second preparation of A (the noise of this run), then {} rounds of A against B, A B then B A and so on; a round is one batch of {} samples of each side, {} timing{flush}, on the same inputs, in one process.",
        s.aa_rounds,
        s.rounds,
        s.batch,
        p.timing.as_str()
    );
    let _ = writeln!(
        out,
        "- Verdict: the 95 % t-interval of the mean of the rounds' log(B / A), against a margin of the larger of the {} threshold and how far apart the A/A rounds put A and its copy: SAME within it, SLOW or FAST wholly outside, AMBIGUOUS across its edge (docs/ab.md).\n",
        pct(s.threshold)
    );

    let _ = writeln!(out, "## Noise floor\n");
    let aa: Vec<f64> = o.pairs.iter().filter_map(|p| p.aa).collect();
    let spreads: Vec<f64> = o.pairs.iter().filter_map(|p| p.spread).collect();
    let widened = o
        .pairs
        .iter()
        .filter(|p| p.aa.is_some_and(|a| a > s.threshold))
        .count();
    match (
        quantile(aa.clone(), 0.5),
        quantile(aa.clone(), 0.95),
        quantile(aa, 1.0),
    ) {
        (Some(m), Some(p95), Some(max)) => {
            let _ = writeln!(
                out,
                "- A against itself (A/A rounds): {} apart at the median pair, {} at the 95th percentile, {} at most; {} had a margin wider than the threshold.",
                pct2(m),
                pct2(p95),
                pct2(max),
                count(widened as u64, "pair", "pairs")
            );
        }
        _ => {
            let _ = writeln!(out, "- No A/A round completed.");
        }
    }
    if let (Some(m), Some(max)) = (quantile(spreads.clone(), 0.5), quantile(spreads, 1.0)) {
        let _ = writeln!(
            out,
            "- One round's B / A moved by {} (standard deviation, median pair), {} at most.",
            pct2(m),
            pct2(max)
        );
    }
    let lost: u32 = o.pairs.iter().map(|p| p.pair.lost_rounds).sum();
    if lost > 0 {
        let _ = writeln!(
            out,
            "- {} lost a side's batch (a failed call) and count for nothing.",
            count(u64::from(lost), "round", "rounds")
        );
    }
    let _ = writeln!(out, "\n## Machine\n");
    let m = o.machine();
    let _ = writeln!(out, "- {}.", m.describe());
    if let Some(c) = &m.commit {
        let _ = writeln!(out, "- Commit {c}.");
    }
    let _ = writeln!(out, "- {}.", m.clocks());
    let _ = writeln!(out);

    let labels = ShapeLabels::new(o.pairs.iter().map(|p| &p.pair.shape));
    if let Some(common) = labels.common() {
        let _ = writeln!(out, "Every pair's shape has {common}.\n");
    }
    let mut shown: Vec<&Judged<'_>> = o
        .pairs
        .iter()
        .filter(|p| p.verdict != Some(Verdict::Same))
        .collect();
    shown.sort_by_key(|p| rank(p.verdict));
    let same = o.count(Verdict::Same);
    if shown.is_empty() {
        let _ = writeln!(
            out,
            "Every pair is SAME: all of them are in the details below.\n"
        );
    } else {
        let _ = writeln!(
            out,
            "## Pairs that are not SAME\n\n{} (SLOW, FAST, AMBIGUOUS, then without a verdict){}:\n",
            count(shown.len() as u64, "pair", "pairs"),
            match same {
                0 => String::new(),
                1 => "; the one SAME pair is in the details".into(),
                n => format!("; the {n} SAME pairs are in the details"),
            }
        );
        table(&mut out, &labels, &shown[..shown.len().min(SHOWN)]);
        if shown.len() > SHOWN {
            let _ = writeln!(out, "And {} more in the details.\n", shown.len() - SHOWN);
        }
    }
    let _ = writeln!(
        out,
        "<details><summary>All {}</summary>\n",
        count(o.pairs.len() as u64, "pair", "pairs")
    );
    table(&mut out, &labels, &o.pairs.iter().collect::<Vec<_>>());
    for j in o.failed() {
        let why = j
            .pair
            .failure
            .as_ref()
            .map(|f| format!("{}: {}", f.class.as_str(), f.message))
            .unwrap_or_else(|| "fewer than two A/B rounds".into());
        let _ = writeln!(
            out,
            "- {} {}: {why}",
            labels.label(&j.pair.shape),
            j.pair.method
        );
    }
    let _ = writeln!(out, "</details>");
    out
}

/// `0.12 %` (two decimals: noise figures are small).
fn pct2(fraction: f64) -> String {
    format!("{:.2} %", fraction * 100.0)
}

/// Order of the pairs shown first.
fn rank(v: Option<Verdict>) -> u8 {
    match v {
        Some(Verdict::Slow) => 0,
        Some(Verdict::Fast) => 1,
        Some(Verdict::Ambiguous) => 2,
        None => 3,
        Some(Verdict::Same) => 4,
    }
}

fn table(out: &mut String, labels: &ShapeLabels, rows: &[&Judged<'_>]) {
    let _ = writeln!(
        out,
        "| shape | method | A µs | B µs | B / A | 95 % interval | margin | verdict | A config | B config |"
    );
    let _ = writeln!(
        out,
        "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- | --- |"
    );
    for j in rows {
        let p = j.pair;
        let us = |s: &Option<crate::measure::Stats>| {
            s.as_ref()
                .map_or("—".to_string(), |s| super::num::us(s.median_us))
        };
        let (ratio, interval) = match j.interval {
            Some(i) => (
                format!("{:.3}×", i.ratio),
                format!(
                    "{:+.2} to {:+.2} %",
                    (i.low - 1.0) * 100.0,
                    (i.high - 1.0) * 100.0
                ),
            ),
            None => ("—".into(), "—".into()),
        };
        let verdict = j.verdict.map_or("—", Verdict::as_str);
        let config = |c: &indexmap::IndexMap<String, serde_json::Value>| {
            if c.is_empty() {
                "—".to_string()
            } else {
                compact_config(c)
            }
        };
        let b_config = if p.b.config == p.a.config {
            "same".to_string()
        } else {
            config(&p.b.config)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {ratio} | {interval} | {} | {verdict} | {} | {b_config} |",
            labels.label(&p.shape),
            p.method,
            us(&p.a_stats),
            us(&p.b_stats),
            pct2(j.margin),
            config(&p.a.config),
        );
    }
    out.push('\n');
}

/// Shape labels with only the fields that vary between the pairs.
struct ShapeLabels {
    varying: Vec<String>,
    common: Vec<(String, String)>,
}

impl ShapeLabels {
    fn new<'s>(
        shapes: impl Iterator<Item = &'s indexmap::IndexMap<String, serde_json::Value>>,
    ) -> Self {
        let shapes: Vec<_> = shapes.collect();
        let mut varying = Vec::new();
        let mut common = Vec::new();
        if let Some(first) = shapes.first() {
            for (k, v) in first.iter() {
                if shapes.iter().all(|s| s.get(k) == Some(v)) {
                    common.push((k.clone(), json_text(v)));
                } else {
                    varying.push(k.clone());
                }
            }
        }
        // A field some shape lacks varies too.
        for s in &shapes {
            for k in s.keys() {
                if !varying.contains(k) && !common.iter().any(|(c, _)| c == k) {
                    varying.push(k.clone());
                }
            }
        }
        ShapeLabels { varying, common }
    }

    fn common(&self) -> Option<String> {
        (!self.common.is_empty()).then(|| {
            self.common
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
    }

    fn label(&self, shape: &indexmap::IndexMap<String, serde_json::Value>) -> String {
        let parts: Vec<String> = self
            .varying
            .iter()
            .filter_map(|k| shape.get(k).map(|v| format!("{k}={}", json_text(v))))
            .collect();
        if parts.is_empty() {
            "(one shape)".into()
        } else {
            parts.join(" ")
        }
    }
}
