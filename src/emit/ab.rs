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
use crate::measure::{geomean, paired, Verdict};
use crate::store::{AbPair, AbSetup, AbSide, Interleave, PicksSource, Results, RunHeader};

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
    let margin = paired::margin(&aa_logs, threshold);
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
            "- **B carries a planted slowdown** (a testing knob): kernels that keep the GPU busy (the interpreter: the host) for {} of A's median in the A/A rounds after each of B's launches, inside the timed region.",
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
    if s.interleave == Interleave::Samples {
        let rounds = |p: &AbPair| p.aa.len() + p.rounds.len();
        let all: usize = o.pairs.iter().map(|p| rounds(p.pair)).sum();
        let turned: usize = o
            .pairs
            .iter()
            .map(|p| {
                p.pair
                    .aa
                    .iter()
                    .chain(&p.pair.rounds)
                    .filter(|r| r.turns)
                    .count()
            })
            .sum();
        let _ = writeln!(
            out,
            "- The two sides of a round take turns sample by sample in that one batch, so that both meet the same clock (docs/ab.md, \"Taking turns\"): {turned} of {all} rounds did{}.",
            if turned < all {
                "; the others (a worker that cannot: the native worker) took a batch of each side, one after the other"
            } else {
                ""
            }
        );
    }
    if s.extra_rounds > 0 {
        let extended = o.pairs.iter().filter(|p| p.pair.extra_rounds > 0).count();
        let _ = writeln!(
            out,
            "- A pair whose verdict after those rounds was AMBIGUOUS took {} more, once, and was judged on all of them: {} here.",
            s.extra_rounds,
            count(extended as u64, "pair", "pairs")
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AbJob, AbRound, RunHeader};
    use serde_json::json;

    fn header() -> RunHeader {
        let line = include_str!("../../tests/fixtures/journals/format_4_run_header.json");
        let mut h: serde_json::Value = serde_json::from_str(line).unwrap();
        h.as_object_mut().unwrap().remove("type");
        h["format"] = json!(crate::store::FORMAT_VERSION);
        h["run_mode"] = json!("ab");
        h["experiment"] = json!("gptoss-ab");
        serde_json::from_value(h).unwrap()
    }

    /// A pair at M = `m` whose B is `slower` (a fraction) over A, rounds
    /// carrying a deterministic wobble of ±`noise`.
    fn pair(m: i64, slower: f64, noise: f64) -> AbPair {
        let round = |i: usize, b_over_a: f64| {
            let wobble = 1.0 + noise * ((i * 7 % 5) as f64 / 2.0 - 1.0);
            AbRound {
                b_first: i % 2 == 1,
                a_us: 100.0,
                b_us: 100.0 * b_over_a * wobble,
                a_clock_mhz: Some(1980.0),
                b_clock_mhz: Some(1980.0),
                turns: false,
            }
        };
        let job = |id: &str| AbJob {
            job_id: id.into(),
            config: serde_json::from_value(json!({"BLOCK_SIZE_M": 16})).unwrap(),
            check: None,
            kernels: Vec::new(),
        };
        AbPair {
            setup: "s".into(),
            shape: serde_json::from_value(json!({"M": m, "E": 32, "N": 2880})).unwrap(),
            method: "triton".into(),
            kind: crate::manifest::MethodKind::Triton,
            kernel: "fused_moe".into(),
            a: job(&format!("a{m}")),
            b: job(&format!("b{m}")),
            aa_job_id: format!("a2{m}"),
            plant_us: 0.0,
            aa: (0..6).map(|i| round(i, 1.0)).collect(),
            rounds: (0..16).map(|i| round(i, 1.0 + slower)).collect(),
            lost_rounds: 0,
            extra_rounds: 0,
            a_stats: None,
            b_stats: None,
            failure: None,
            lane: 0,
            duration_s: 1.0,
            finished_at: "2026-12-02T00:00:00Z".into(),
        }
    }

    fn results(pairs: Vec<AbPair>) -> Results {
        Results {
            header: Some(header()),
            ab_setups: vec![AbSetup {
                id: "s".into(),
                a: AbSide {
                    picks: "results/gptoss/NVIDIA_H200".into(),
                    source: PicksSource::Results,
                    code: Vec::new(),
                },
                b: AbSide {
                    picks: "results/gptoss/NVIDIA_H200".into(),
                    source: PicksSource::Results,
                    code: Vec::new(),
                },
                aa_rounds: 6,
                rounds: 16,
                batch: 32,
                threshold: 0.01,
                extra_rounds: 0,
                plant: 0.0,
                interleave: Default::default(),
            }],
            ab_pairs: pairs,
            ..Default::default()
        }
    }

    #[test]
    fn pairs_are_judged_against_the_larger_of_the_threshold_and_the_a_a_round() {
        let (p1, p2) = (pair(1, 0.0, 0.002), pair(2, 0.05, 0.002));
        let same = judge(&p1, 0.01);
        assert_eq!(same.verdict, Some(Verdict::Same));
        assert_eq!(same.margin, 0.01);
        let slow = judge(&p2, 0.01);
        assert_eq!(slow.verdict, Some(Verdict::Slow));
        assert!((slow.change().unwrap() - 0.05).abs() < 0.002);
        // A/A rounds 4 % apart widen the margin: 3 % is within the noise.
        let mut noisy = pair(3, 0.03, 0.002);
        for r in &mut noisy.aa {
            r.b_us *= 1.04;
        }
        let j = judge(&noisy, 0.01);
        assert!((j.margin - 0.04).abs() < 1e-3, "{}", j.margin);
        assert_eq!(j.verdict, Some(Verdict::Same));
        // A failed pair has no verdict.
        let failed = AbPair {
            failure: Some(crate::store::Failure {
                class: crate::store::FailureClass::Mismatch,
                message: "side B: wrong".into(),
            }),
            ..pair(4, 0.0, 0.0)
        };
        assert_eq!(judge(&failed, 0.01).verdict, None);
    }

    #[test]
    fn the_report_puts_what_is_not_same_within_100_lines_and_every_pair_in_the_fold() {
        // 74 pairs: 60 SAME, 10 SLOW by 5 %, 4 AMBIGUOUS (too noisy to tell).
        let mut pairs: Vec<AbPair> = (0..60).map(|m| pair(m, 0.0, 0.001)).collect();
        pairs.extend((60..70).map(|m| pair(m, 0.05, 0.001)));
        pairs.extend((70..74).map(|m| pair(m, 0.0, 0.05)));
        let r = results(pairs);
        let o = AbOutcome::of(&r).unwrap();
        assert_eq!(
            (
                o.count(Verdict::Same),
                o.count(Verdict::Slow),
                o.count(Verdict::Ambiguous)
            ),
            (60, 10, 4)
        );
        assert_eq!(o.regressions(0.02).len(), 10);
        assert!(
            o.regressions(0.10).is_empty(),
            "SLOW by 5 % passes a 10 % gate"
        );
        let text = markdown(&o);
        let before = text.split("<details>").next().unwrap();
        assert!(
            before.lines().count() <= 100,
            "{} lines",
            before.lines().count()
        );
        assert!(
            text.starts_with("# A/B: gptoss on NVIDIA H100 80GB HBM3\n"),
            "{text}"
        );
        assert!(
            before.contains("**B against A over 74 pairs: 60 SAME, 4 AMBIGUOUS, 10 SLOW, 0 FAST")
        );
        assert!(before.contains("## Noise floor") && before.contains("## Machine"));
        assert!(
            before.contains("Every pair's shape has E=32 N=2880."),
            "{before}"
        );
        // The SLOW first, then the AMBIGUOUS; the SAME only in the fold.
        let shown: Vec<&str> = before.lines().filter(|l| l.starts_with("| M=")).collect();
        assert_eq!(shown.len(), 14);
        assert!(shown[..10].iter().all(|l| l.contains("| SLOW |")));
        let fold = text.split("<details>").nth(1).unwrap();
        assert_eq!(fold.lines().filter(|l| l.starts_with("| M=")).count(), 74);
        // As `tunelab report` writes it.
        let rendered = render(&r).unwrap();
        assert_eq!(rendered.path, std::path::PathBuf::from("report.md"));
        assert_eq!(rendered.contents, text);
    }
}
