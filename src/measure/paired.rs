//! The statistics of a verdict with a noise model (docs/ab.md): an interval
//! for the ratio of two timings, an equivalence margin no tighter than the
//! noise measured, and FAST / SAME / SLOW / AMBIGUOUS from where the interval
//! lies against that margin.
//!
//! An A/B run times two sides in rounds, each round one batch of each side
//! back to back (A then B, then B then A, ...). A round's ratio is B's batch
//! median over A's; its logarithm is what is averaged. Rounds are taken to be
//! independent given the sides, with a log ratio of constant mean (what B
//! costs over A) and spread; the drift of clocks and temperature between two
//! adjacent batches is part of that spread, and alternating the order makes
//! a steady drift cancel in the mean. The interval is Student's t-interval of
//! the mean log ratio (95 %), returned as ratios.

use super::Verdict;

/// Confidence of every interval here.
pub const CONFIDENCE: f64 = 0.95;

/// The smallest change a verdict calls FAST or SLOW, unless a noise
/// measurement (an A/A round, the run-to-run spread) says more: 1 %.
pub const DEFAULT_THRESHOLD: f64 = 0.01;

/// How far apart separate runs of one config come out, as a fraction: the
/// default of the `run_spread` setting (`tunelab compare`). Measured on an
/// H200, the committed gpt-oss run of 2026-11-23 against a whole run of
/// 2026-11-25 on another instance: over the 385 (shape, method) pairs that
/// picked the same config in both and were timed at full clock, the
/// medians differed by 1.35 % (median), 2.9 % (p95), 4.9 % at most
/// (docs/ab.md, "Separate runs").
pub const DEFAULT_RUN_SPREAD: f64 = 0.05;

/// A ratio (B over A, new over base) and its 95 % interval: 1.03 is 3 %
/// slower.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatioInterval {
    /// The geometric mean of the rounds' ratios.
    pub ratio: f64,
    pub low: f64,
    pub high: f64,
}

impl RatioInterval {
    /// An interval from its log-scale centre and half-width.
    pub fn from_log(centre: f64, half_width: f64) -> RatioInterval {
        RatioInterval {
            ratio: centre.exp(),
            low: (centre - half_width).exp(),
            high: (centre + half_width).exp(),
        }
    }

    /// The same interval, each side moved out by `by` (a fraction, on the
    /// log scale): more uncertainty than its own rounds show.
    pub fn widened(&self, by: f64) -> RatioInterval {
        let w = (1.0 + by.max(0.0)).ln();
        RatioInterval {
            ratio: self.ratio,
            low: self.low * (-w).exp(),
            high: self.high * w.exp(),
        }
    }

    /// How far the interval reaches from a ratio of 1, as a fraction: the
    /// largest difference it admits.
    pub fn reach(&self) -> f64 {
        (self.high.ln().abs().max(self.low.ln().abs())).exp() - 1.0
    }
}

/// Student's t quantile for a two-sided 95 % interval with `df` degrees of
/// freedom: exact to three decimals up to 30 (the standard table), then the
/// Cornish-Fisher expansion about the normal quantile (within 1e-4 there).
pub fn t975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => TABLE[df - 1],
        _ => {
            let z: f64 = 1.959_963_984_540_054;
            let v = df as f64;
            let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
            z + (z3 + z) / (4.0 * v)
                + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * v * v)
                + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * v * v * v)
        }
    }
}

/// Mean and sample standard deviation.
fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// The 95 % t-interval of the mean of `log_ratios` (one per round), as
/// ratios; `None` with fewer than two rounds or a non-finite one.
pub fn ratio_interval(log_ratios: &[f64]) -> Option<RatioInterval> {
    if log_ratios.len() < 2 || log_ratios.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let (mean, sd) = mean_sd(log_ratios);
    let n = log_ratios.len();
    Some(RatioInterval::from_log(
        mean,
        t975(n - 1) * sd / (n as f64).sqrt(),
    ))
}

/// The standard deviation of the rounds' log ratios: how much one round's
/// ratio moves, as a fraction (0.005 is half a per cent). `None` with fewer
/// than two rounds.
pub fn round_spread(log_ratios: &[f64]) -> Option<f64> {
    (log_ratios.len() >= 2).then(|| mean_sd(log_ratios).1.exp() - 1.0)
}

/// What an A/A set of rounds (one side against a second preparation of
/// itself) measured: how far apart two identical sides came out, the
/// geometric mean of their ratios as a difference from 1 (0.004: 0.4 %).
/// `None` with no round.
pub fn apparent_difference(aa_log_ratios: &[f64]) -> Option<f64> {
    if aa_log_ratios.is_empty() || aa_log_ratios.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let mean = aa_log_ratios.iter().sum::<f64>() / aa_log_ratios.len() as f64;
    Some(mean.abs().exp() - 1.0)
}

/// A pair's equivalence margin: the larger of `threshold` and how far
/// apart its A/A rounds put A and its copy (their log ratios).
pub fn margin(aa_log_ratios: &[f64], threshold: f64) -> f64 {
    threshold.max(apparent_difference(aa_log_ratios).unwrap_or(0.0))
}

/// A pair's verdict from its A/A and A/B rounds' log ratios: the A/B
/// rounds' interval against [`margin`]. `None` with fewer than two A/B
/// rounds. The report judges by it, and an A/B lane by it decides whether
/// a pair takes its extra rounds.
pub fn verdict(aa_log_ratios: &[f64], ab_log_ratios: &[f64], threshold: f64) -> Option<Verdict> {
    ratio_interval(ab_log_ratios).map(|i| equivalence(&i, margin(aa_log_ratios, threshold)))
}

/// FAST / SAME / SLOW / AMBIGUOUS of a ratio (B over A, new over base)
/// against an equivalence margin (a fraction): SAME when the interval lies
/// within [1/(1+margin), 1+margin], SLOW when it lies wholly above it, FAST
/// wholly below, AMBIGUOUS otherwise (it straddles an edge: the rounds
/// cannot tell).
pub fn equivalence(interval: &RatioInterval, margin: f64) -> Verdict {
    let m = (1.0 + margin.max(0.0)).ln();
    let (lo, hi) = (interval.low.ln(), interval.high.ln());
    if lo > m {
        Verdict::Slow
    } else if hi < -m {
        Verdict::Fast
    } else if lo >= -m && hi <= m {
        Verdict::Same
    } else {
        Verdict::Ambiguous
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// A standard normal draw (Box-Muller).
    fn normal(rng: &mut SplitMix64) -> f64 {
        let u = |rng: &mut SplitMix64| ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let (a, b) = (u(rng), u(rng));
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }

    /// One simulated pair of an A/B run: `aa` A/A rounds and `rounds` A/B
    /// rounds in alternating order, B slower than A by `planted` (a
    /// fraction). Each batch median carries its own noise (`batch_sd`, as a
    /// fraction) and the GPU's clock drifts between batches (a random walk
    /// of `drift_sd` a batch, which alternating orders cancel only on
    /// average). Returns the verdict against margin max(`threshold`, A/A).
    fn simulate(
        rng: &mut SplitMix64,
        planted: f64,
        threshold: f64,
        batch_sd: f64,
        drift_sd: f64,
        aa: usize,
        rounds: usize,
    ) -> Verdict {
        let mut clock = 0.0;
        let mut batch = |rng: &mut SplitMix64, slower: f64| {
            clock += drift_sd * normal(rng);
            clock + batch_sd * normal(rng) + (1.0 + slower).ln()
        };
        let mut pairs = |rng: &mut SplitMix64, n: usize, slower: f64| -> Vec<f64> {
            (0..n)
                .map(|i| {
                    if i % 2 == 0 {
                        let a = batch(rng, 0.0);
                        batch(rng, slower) - a
                    } else {
                        let b = batch(rng, slower);
                        b - batch(rng, 0.0)
                    }
                })
                .collect()
        };
        let aa_ratios = pairs(rng, aa, 0.0);
        let ab_ratios = pairs(rng, rounds, planted);
        let margin = threshold.max(apparent_difference(&aa_ratios).unwrap());
        equivalence(&ratio_interval(&ab_ratios).unwrap(), margin)
    }

    /// Verdict counts over `n` simulated pairs.
    fn tally(n: usize, mut one: impl FnMut(&mut SplitMix64) -> Verdict) -> [usize; 4] {
        let mut rng = SplitMix64::new(48);
        let mut counts = [0; 4];
        for _ in 0..n {
            let i = match one(&mut rng) {
                Verdict::Fast => 0,
                Verdict::Same => 1,
                Verdict::Slow => 2,
                Verdict::Ambiguous => 3,
            };
            counts[i] += 1;
        }
        counts
    }

    #[test]
    fn the_t_quantile_matches_the_table_and_tends_to_the_normal() {
        assert_eq!(t975(1), 12.706);
        assert_eq!(t975(15), 2.131);
        // The expansion beyond the table: 2.021 at 40, 2.000 at 60, 1.980 at 120.
        assert!((t975(40) - 2.021).abs() < 5e-4, "{}", t975(40));
        assert!((t975(60) - 2.000).abs() < 5e-4, "{}", t975(60));
        assert!((t975(120) - 1.980).abs() < 5e-4, "{}", t975(120));
        // It joins the table without a step and falls towards 1.96.
        assert!((t975(31) - 2.040).abs() < 5e-4 && t975(31) < t975(30));
        assert!(t975(10_000) > 1.96 && t975(10_000) < 1.961);
    }

    #[test]
    fn an_interval_is_the_t_interval_of_the_mean_log_ratio() {
        let logs = [0.01, 0.03, 0.02, 0.02];
        let i = ratio_interval(&logs).unwrap();
        let sd = (0.0002f64 / 3.0).sqrt();
        let half = 3.182 * sd / 2.0;
        assert!((i.ratio - 0.02f64.exp()).abs() < 1e-12);
        assert!((i.low - (0.02 - half).exp()).abs() < 1e-12);
        assert!((i.high - (0.02 + half).exp()).abs() < 1e-12);
        assert_eq!(ratio_interval(&[0.01]), None, "one round has no spread");
        assert_eq!(ratio_interval(&[0.01, f64::NAN]), None);
    }

    #[test]
    fn verdicts_come_from_where_the_interval_lies_against_the_margin() {
        let at = |lo: f64, hi: f64| RatioInterval {
            ratio: (lo * hi).sqrt(),
            low: lo,
            high: hi,
        };
        assert_eq!(equivalence(&at(0.995, 1.008), 0.01), Verdict::Same);
        assert_eq!(equivalence(&at(1.02, 1.04), 0.01), Verdict::Slow);
        assert_eq!(equivalence(&at(0.95, 0.97), 0.01), Verdict::Fast);
        // Straddling an edge: the rounds cannot tell.
        assert_eq!(equivalence(&at(1.005, 1.02), 0.01), Verdict::Ambiguous);
        assert_eq!(equivalence(&at(0.97, 1.03), 0.01), Verdict::Ambiguous);
        // A wider margin turns a small slowdown into SAME.
        assert_eq!(equivalence(&at(1.02, 1.04), 0.05), Verdict::Same);
        // The margin is symmetric on the log scale.
        assert_eq!(equivalence(&at(1.0 / 1.0099, 1.0), 0.01), Verdict::Same);
    }

    #[test]
    fn widening_moves_both_ends_out_on_the_log_scale() {
        let i = RatioInterval::from_log(0.0, 0.01).widened(0.05);
        assert!((i.high - (0.01f64.exp() * 1.05)).abs() < 1e-12);
        assert!((i.low - ((-0.01f64).exp() / 1.05)).abs() < 1e-12);
        assert!((i.reach() - (0.01f64.exp() * 1.05 - 1.0)).abs() < 1e-12);
    }

    #[test]
    fn an_a_a_round_measures_how_far_apart_identical_sides_came_out() {
        let d = apparent_difference(&[0.004, -0.002, 0.004]).unwrap();
        assert!((d - 0.002f64.exp() + 1.0).abs() < 1e-12);
        assert_eq!(apparent_difference(&[]), None);
        assert!(round_spread(&[0.01, -0.01]).unwrap() > 0.0);
    }

    // Synthetic A/B runs with the defaults (6 A/A rounds, 16 A/B rounds,
    // threshold 1 %): a batch median's own noise 0.4 %, and a clock drift
    // of 0.3 % a batch (an H200 under the power cap moves its clock by
    // tens of MHz between batches).

    #[test]
    fn no_change_is_same_or_ambiguous_in_at_least_95_per_cent_of_pairs() {
        let [fast, same, slow, ambiguous] =
            tally(2000, |r| simulate(r, 0.0, 0.01, 0.004, 0.003, 6, 16));
        assert!(
            (same + ambiguous) * 100 >= 95 * 2000,
            "FAST {fast}, SAME {same}, SLOW {slow}, AMBIGUOUS {ambiguous}"
        );
        assert!(same > ambiguous, "mostly SAME: {same} against {ambiguous}");
        // A noisier run says AMBIGUOUS more, and still not FAST or SLOW.
        let [fast, _, slow, _] = tally(2000, |r| simulate(r, 0.0, 0.01, 0.02, 0.01, 6, 16));
        assert!((fast + slow) * 100 <= 5 * 2000, "FAST {fast}, SLOW {slow}");
    }

    #[test]
    fn a_planted_slowdown_is_found_slow() {
        let [_, same, slow, ambiguous] =
            tally(2000, |r| simulate(r, 0.03, 0.01, 0.004, 0.003, 6, 16));
        assert!(
            slow * 100 >= 90 * 2000,
            "3 %: SLOW {slow}, SAME {same}, AMBIGUOUS {ambiguous}"
        );
        let [fast, same, slow, ambiguous] =
            tally(2000, |r| simulate(r, 0.10, 0.01, 0.004, 0.003, 6, 16));
        assert_eq!(
            slow, 2000,
            "10 %: FAST {fast}, SAME {same}, AMBIGUOUS {ambiguous}"
        );
        // A gate threshold of 2 % still finds 3 % SLOW at this noise.
        let [_, _, slow, _] = tally(2000, |r| simulate(r, 0.03, 0.02, 0.004, 0.003, 6, 16));
        assert!(
            slow * 100 >= 90 * 2000,
            "3 % at a 2 % threshold: SLOW {slow}"
        );
    }

    #[test]
    fn a_noisy_a_a_round_widens_the_margin() {
        // Identical sides that came out 4 % apart: a 3 % difference is then
        // within what this run can tell from nothing.
        let i = RatioInterval::from_log(1.03f64.ln(), 0.002);
        assert_eq!(equivalence(&i, 0.01), Verdict::Slow);
        assert_eq!(equivalence(&i, 0.01f64.max(0.04)), Verdict::Same);
    }
}
