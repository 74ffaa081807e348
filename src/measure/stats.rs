//! Statistics, noise flags and the stopping rule: one implementation for
//! every backend. Workers only return samples; this module decides when a job
//! has enough and summarises what it got.

use serde::{Deserialize, Serialize};

use super::protocol::Protocol;

/// Timing statistics of one job, in microseconds. Part of the journal's
/// format (`store::record`): a change here is a new format.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Stats {
    pub n: u64,
    pub median_us: f64,
    /// 95 % confidence interval of the median (order statistics).
    pub ci_low_us: f64,
    pub ci_high_us: f64,
    pub min_us: f64,
    pub q1_us: f64,
    pub q3_us: f64,
    pub mean_us: f64,
    /// Coefficient of variation (stddev / mean).
    pub cv: f64,
    pub flags: Vec<Flag>,
    pub timer: Timer,
    pub sm_clock_mhz: Option<f64>,
    /// Sum of the timed samples.
    pub gpu_ms: f64,
    /// Wall time spent sampling.
    pub wall_ms: f64,
}

/// What the samples of one job say about how far to trust them. Declared in
/// the order reports list them (`Ord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Flag {
    /// The median's confidence interval is wider than ±2 %.
    Noisy,
    /// At least 1 % of samples lie beyond Q3 + 3 IQR.
    Outliers,
    /// The first tenth of the samples is more than 5 % slower than the rest.
    SlowStart,
    /// The median moved more than 3 % from the first third to the last.
    Drift,
    /// The SM clock fell more than 8 % below its peak during sampling.
    Throttled,
    /// The median is within a few µs of the event timer's own overhead.
    TimerLimited,
    /// A cap (samples, GPU time, wall time) stopped sampling before the median converged.
    CapHit,
    /// Racing (`protocol.race`) stopped sampling at `min_samples`: the job
    /// was clearly slower than its group's best so far, and its median's
    /// confidence interval may be wider than `target_ci`.
    Outpaced,
}

impl Flag {
    pub fn as_str(self) -> &'static str {
        match self {
            Flag::Noisy => "NOISY",
            Flag::Outliers => "OUTLIERS",
            Flag::SlowStart => "SLOW_START",
            Flag::Drift => "DRIFT",
            Flag::Throttled => "THROTTLED",
            Flag::TimerLimited => "TIMER_LIMITED",
            Flag::CapHit => "CAP_HIT",
            Flag::Outpaced => "OUTPACED",
        }
    }
}

impl std::fmt::Display for Flag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What measured a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Timer {
    /// A CUDA (or HIP) event pair around each launch.
    CudaEvent,
    /// Host wall-clock around each launch: the interpreter. Never written as tuned configs.
    Wall,
    /// CUDA events around the replay of a CUDA graph of back-to-back launches, per launch.
    CudaGraph,
}

impl Timer {
    pub fn as_str(self) -> &'static str {
        match self {
            Timer::CudaEvent => "cuda_event",
            Timer::Wall => "wall",
            Timer::CudaGraph => "cuda_graph",
        }
    }
}

/// Samples below this many microseconds sit near the event timer's resolution
/// and overhead (about 1.3 us for an event pair on Hopper).
const TIMER_LIMIT_US: f64 = 5.0;

/// The part of a protocol that says when a job has enough samples: what a
/// native worker that takes a job's batches itself (a `check`'s
/// `then.until`) is given, so that it stops where the runner would.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopRule {
    pub min_samples: u32,
    pub max_samples: u32,
    pub target_ci: f64,
    /// A cap; `.inf` in a manifest (no cap) travels as `null`, which JSON has
    /// where it has no infinity.
    #[serde(with = "cap")]
    #[schemars(with = "Option<f64>")]
    pub max_gpu_ms: f64,
    #[serde(with = "cap")]
    #[schemars(with = "Option<f64>")]
    pub max_wall_ms: f64,
    /// Racing's threshold: once there are `min_samples`, stop when the lower
    /// end of the median's 95 % confidence interval is above this
    /// (microseconds; `Protocol::racing_rule`). None: no racing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outpaced_above_us: Option<f64>,
}

/// A cap as JSON carries it: a number, or `null` for none (infinity).
mod cap {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(cap: &f64, s: S) -> Result<S::Ok, S::Error> {
        if cap.is_finite() {
            s.serialize_f64(*cap)
        } else {
            s.serialize_none()
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
    }
}

/// What the sampling loop knows about one job so far.
#[derive(Debug, Clone, Default)]
pub struct Sampling {
    pub samples_us: Vec<f64>,
    pub clocks_mhz: Vec<f64>,
    pub wall_ms: f64,
    /// Set by the first batch.
    pub timer: Option<Timer>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take another batch.
    Continue,
    /// The confidence interval of the median is tight enough.
    Converged,
    /// A cap (samples, GPU time, wall time) was reached first.
    Capped,
    /// Clearly slower than the group's best so far (racing): no need to
    /// refine its figure.
    Outpaced,
}

impl Sampling {
    pub fn gpu_ms(&self) -> f64 {
        self.samples_us.iter().sum::<f64>() / 1e3
    }

    /// The stopping rule of protocol `p` (see [`StopRule`]).
    pub fn decide(&self, p: &Protocol) -> Decision {
        self.decide_by(&p.stop_rule())
    }

    /// The stopping rule: at least `min_samples`, then stop when the 95 % CI
    /// of the median is within `target_ci` of it, or (racing) lies wholly
    /// above `outpaced_above_us`; cap samples, GPU time and wall time.
    pub fn decide_by(&self, rule: &StopRule) -> Decision {
        let n = self.samples_us.len();
        if n >= rule.min_samples as usize {
            let (median, lo, hi) = median_ci(&sorted(&self.samples_us));
            if median > 0.0 && (hi - lo) / 2.0 <= rule.target_ci * median {
                return Decision::Converged;
            }
            if rule.outpaced_above_us.is_some_and(|above| lo > above) {
                return Decision::Outpaced;
            }
        }
        if n >= rule.max_samples as usize
            || self.gpu_ms() >= rule.max_gpu_ms
            || self.wall_ms >= rule.max_wall_ms
        {
            return Decision::Capped;
        }
        Decision::Continue
    }

    /// The statistics of a full measurement, flagged with what stopped its
    /// sampling where that was a cap or racing.
    pub fn stats_stopped_by(&self, stopped: Decision) -> Stats {
        let mut stats = self.stats();
        let flag = match stopped {
            Decision::Capped => Some(Flag::CapHit),
            Decision::Outpaced => Some(Flag::Outpaced),
            Decision::Continue | Decision::Converged => None,
        };
        if let Some(flag) = flag.filter(|f| !stats.flags.contains(f)) {
            stats.flags.push(flag);
        }
        stats
    }

    /// The statistics of what was sampled.
    pub fn stats(&self) -> Stats {
        let mut stats = summarize(&self.samples_us, self.timer.unwrap_or(Timer::CudaEvent));
        stats.wall_ms = self.wall_ms;
        stats.sm_clock_mhz = self.clocks_mhz.iter().cloned().reduce(f64::min);
        if let (Some(lo), Some(hi)) = (
            self.clocks_mhz.iter().cloned().reduce(f64::min),
            self.clocks_mhz.iter().cloned().reduce(f64::max),
        ) {
            // Power capping pulls the SM clock down under sustained load.
            if lo < 0.92 * hi {
                stats.flags.push(Flag::Throttled);
            }
        }
        stats
    }
}

pub fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// Linear-interpolated quantile of sorted data.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Median and its distribution-free 95 % confidence interval from order
/// statistics: ranks n/2 -+ 1.96 sqrt(n)/2 (normal approximation to the binomial).
pub fn median_ci(sorted: &[f64]) -> (f64, f64, f64) {
    let n = sorted.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let median = quantile(sorted, 0.5);
    let half = 1.96 * (n as f64).sqrt() / 2.0;
    let lo = ((n as f64 / 2.0 - half).floor().max(1.0) as usize).min(n) - 1;
    let hi = ((n as f64 / 2.0 + half).ceil() as usize).clamp(1, n) - 1;
    (median, sorted[lo], sorted[hi])
}

/// Statistics and noise flags of a sample set (microseconds).
pub fn summarize(samples: &[f64], timer: Timer) -> Stats {
    let s = sorted(samples);
    let n = s.len();
    if n == 0 {
        return Stats {
            n: 0,
            median_us: f64::NAN,
            ci_low_us: f64::NAN,
            ci_high_us: f64::NAN,
            min_us: f64::NAN,
            q1_us: f64::NAN,
            q3_us: f64::NAN,
            mean_us: f64::NAN,
            cv: 0.0,
            flags: Vec::new(),
            timer,
            sm_clock_mhz: None,
            gpu_ms: 0.0,
            wall_ms: 0.0,
        };
    }
    let (median, ci_low, ci_high) = median_ci(&s);
    let mean = s.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    let (q1, q3) = (quantile(&s, 0.25), quantile(&s, 0.75));
    let mut flags = Vec::new();
    let cv = if mean > 0.0 { var.sqrt() / mean } else { 0.0 };
    if median > 0.0 && (ci_high - ci_low) / 2.0 > 0.02 * median {
        flags.push(Flag::Noisy);
    }
    let fence = q3 + 3.0 * (q3 - q1);
    let outliers = s.iter().filter(|x| **x > fence).count();
    if outliers * 100 >= n.max(20) {
        flags.push(Flag::Outliers);
    }
    if n >= 20 {
        // In time order: a slow first tenth, or a trend from the first third to the last.
        let head = n / 10;
        let first = sorted(&samples[..head.max(2)]);
        let rest = sorted(&samples[head.max(2)..]);
        if quantile(&first, 0.5) > 1.05 * quantile(&rest, 0.5) {
            flags.push(Flag::SlowStart);
        }
        let third = n / 3;
        let early = quantile(&sorted(&samples[head..head + third.min(n - head)]), 0.5);
        let late = quantile(&sorted(&samples[n - third..]), 0.5);
        if (late - early).abs() > 0.03 * median {
            flags.push(Flag::Drift);
        }
    }
    if median < TIMER_LIMIT_US {
        flags.push(Flag::TimerLimited);
    }
    Stats {
        n: n as u64,
        median_us: median,
        ci_low_us: ci_low,
        ci_high_us: ci_high,
        min_us: s[0],
        q1_us: q1,
        q3_us: q3,
        mean_us: mean,
        cv,
        flags,
        timer,
        sm_clock_mhz: None,
        gpu_ms: s.iter().sum::<f64>() / 1e3,
        wall_ms: 0.0,
    }
}

/// Two timings are a tie when their confidence intervals overlap.
pub fn tied(a: &Stats, b: &Stats) -> bool {
    a.ci_low_us <= b.ci_high_us && b.ci_low_us <= a.ci_high_us
}

/// Two timings whose medians differ by no more than the noise of that
/// difference: the log ratio of the medians lies within its 95 % interval,
/// taken as the root sum of squares of the two medians' half-widths (on
/// the log scale; independent measurements). Stricter than [`tied`], whose
/// intervals may overlap where the difference is clear (two half-widths
/// side by side): the selection's ties (`emit::select`) use this one.
pub fn indistinguishable(a: &Stats, b: &Stats) -> bool {
    let half = |s: &Stats| (s.ci_high_us.ln() - s.ci_low_us.ln()) / 2.0;
    let (ha, hb) = (half(a), half(b));
    let gap = (a.median_us.ln() - b.median_us.ln()).abs();
    gap.is_finite() && ha.is_finite() && hb.is_finite() && gap <= (ha * ha + hb * hb).sqrt()
}

/// How a new timing stands against a base one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// Faster, beyond the noise of both timings.
    Fast,
    /// The confidence intervals of the medians overlap.
    Same,
    /// Slower, beyond the noise of both timings.
    Slow,
    /// The interval straddles an edge of the equivalence margin: neither
    /// the same nor a change can be told (`measure::paired`; never from
    /// interval overlap).
    Ambiguous,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Fast => "FAST",
            Verdict::Same => "SAME",
            Verdict::Slow => "SLOW",
            Verdict::Ambiguous => "AMBIGUOUS",
        }
    }
}

/// FAST / SAME / SLOW of `new` against `base`: the same when their 95 %
/// confidence intervals overlap, else by the medians.
pub fn verdict(base: &Stats, new: &Stats) -> Verdict {
    if tied(base, new) {
        Verdict::Same
    } else if new.median_us < base.median_us {
        Verdict::Fast
    } else {
        Verdict::Slow
    }
}

/// Geometric mean of positive ratios (speedups); `None` for none.
pub fn geomean(ratios: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (mut log_sum, mut n) = (0.0, 0usize);
    for r in ratios.into_iter().filter(|r| r.is_finite() && *r > 0.0) {
        log_sum += r.ln();
        n += 1;
    }
    (n > 0).then(|| (log_sum / n as f64).exp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::L2Flush;

    fn protocol() -> Protocol {
        Protocol {
            warmup_launches: 3,
            warmup_ms: 5.0,
            timing: crate::measure::Timing::Cold,
            graph_calls: 10,
            retime_with: Vec::new(),
            flush: L2Flush::Read,
            flush_bytes: None,
            batch: 32,
            min_samples: 20,
            max_samples: 2000,
            target_ci: 0.005,
            max_gpu_ms: 100.0,
            max_wall_ms: 1500.0,
            finalists: 5,
            retime_rest: 1.0,
            race: 0.0,
            timeout_s: 60.0,
            seed: 0,
        }
    }

    fn summary(samples: &[f64]) -> Stats {
        summarize(samples, Timer::CudaEvent)
    }

    #[test]
    fn median_and_quartiles_of_known_data() {
        let s = summary(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(
            (s.median_us, s.q1_us, s.q3_us, s.min_us, s.mean_us),
            (3.0, 2.0, 4.0, 1.0, 3.0)
        );
    }

    #[test]
    fn ci_narrows_with_more_samples() {
        let noisy: Vec<f64> = (0..400).map(|i| 100.0 + ((i * 37) % 11) as f64).collect();
        let (m1, lo1, hi1) = median_ci(&sorted(&noisy[..40]));
        let (m2, lo2, hi2) = median_ci(&sorted(&noisy));
        assert!(lo1 <= m1 && m1 <= hi1 && lo2 <= m2 && m2 <= hi2);
        assert!(hi2 - lo2 <= hi1 - lo1);
    }

    #[test]
    fn a_stop_rule_with_no_cap_travels_as_null_and_comes_back_infinite() {
        let rule = StopRule {
            min_samples: 20,
            max_samples: 2000,
            target_ci: 0.005,
            max_gpu_ms: f64::INFINITY,
            max_wall_ms: 1500.0,
            outpaced_above_us: None,
        };
        let text = serde_json::to_string(&rule).unwrap();
        assert!(!text.contains("outpaced"), "no racing, no field: {text}");
        assert!(text.contains(r#""max_gpu_ms":null"#), "{text}");
        let back: StopRule = serde_json::from_str(&text).unwrap();
        assert_eq!(back, rule);
        assert!(serde_json::from_str::<StopRule>(r#"{"min_samples":1}"#).is_err());
    }

    #[test]
    fn stops_when_converged_and_caps_otherwise() {
        let p = protocol();
        let steady = Sampling {
            samples_us: vec![100.0; 20],
            ..Default::default()
        };
        assert_eq!(steady.decide(&p), Decision::Converged);
        let few = Sampling {
            samples_us: vec![100.0; 10],
            ..Default::default()
        };
        assert_eq!(few.decide(&p), Decision::Continue, "min_samples first");
        let wild: Vec<f64> = (0..2000)
            .map(|i| if i % 2 == 0 { 50.0 } else { 150.0 })
            .collect();
        let capped = Sampling {
            samples_us: wild,
            ..Default::default()
        };
        assert_eq!(capped.decide(&p), Decision::Capped);
        let long = Sampling {
            samples_us: vec![60_000.0, 50_000.0],
            ..Default::default()
        };
        assert_eq!(
            long.decide(&p),
            Decision::Capped,
            "100 ms of GPU time caps a slow kernel"
        );
    }

    /// 20 samples spread ±4 % around `centre`: too wide for a 0.5 % target.
    fn spread(centre: f64) -> Sampling {
        Sampling {
            samples_us: (0..20)
                .map(|i| centre * (0.96 + 0.08 * f64::from(i) / 19.0))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn racing_stops_a_job_whose_interval_lies_wholly_above_the_threshold() {
        let mut p = protocol();
        assert_eq!(
            p.racing_rule(Some(100.0)).outpaced_above_us,
            None,
            "race 0: off"
        );
        p.race = 0.05;
        let rule = p.racing_rule(Some(100.0));
        assert_eq!(rule.outpaced_above_us, Some(105.0));
        assert_eq!(
            p.racing_rule(None).outpaced_above_us,
            None,
            "nothing to race"
        );
        // Its CI's low end (about 1.5 % under 120) is above 105: outpaced.
        let slow = spread(120.0);
        assert_eq!(slow.decide_by(&p.stop_rule()), Decision::Continue);
        assert_eq!(slow.decide_by(&rule), Decision::Outpaced);
        // Over 5 % slower at the median, but its CI reaches below 105: go on.
        assert_eq!(spread(106.0).decide_by(&rule), Decision::Continue);
        // Never before min_samples.
        let early = Sampling {
            samples_us: slow.samples_us[..10].to_vec(),
            ..Default::default()
        };
        assert_eq!(early.decide_by(&rule), Decision::Continue);
        // A converged job is converged, however slow.
        let steady = Sampling {
            samples_us: vec![200.0; 20],
            ..Default::default()
        };
        assert_eq!(steady.decide_by(&rule), Decision::Converged);
        // The rule travels to a native worker with its threshold.
        let back: StopRule = serde_json::from_str(&serde_json::to_string(&rule).unwrap()).unwrap();
        assert_eq!(back, rule);
        // Its statistics say so.
        let stats = slow.stats_stopped_by(Decision::Outpaced);
        assert!(stats.flags.contains(&Flag::Outpaced), "{:?}", stats.flags);
        assert!(!slow.stats().flags.contains(&Flag::Outpaced));
    }

    #[test]
    fn flags_slow_start_drift_and_timer_limit() {
        let mut warm: Vec<f64> = vec![200.0; 5];
        warm.extend(vec![100.0; 95]);
        assert!(summary(&warm).flags.contains(&Flag::SlowStart));
        let drift: Vec<f64> = (0..90).map(|i| 100.0 + i as f64 * 0.2).collect();
        assert!(summary(&drift).flags.contains(&Flag::Drift));
        assert!(summary(&[3.0; 30]).flags.contains(&Flag::TimerLimited));
        assert!(summary(&[100.0; 30]).flags.is_empty());
    }

    #[test]
    fn verdicts_come_from_interval_overlap_and_geomean_multiplies() {
        let with_ci = |median: f64, half: f64| Stats {
            median_us: median,
            ci_low_us: median - half,
            ci_high_us: median + half,
            ..summary(&[median])
        };
        assert_eq!(
            verdict(&with_ci(100.0, 1.0), &with_ci(101.5, 1.0)),
            Verdict::Same
        );
        assert_eq!(
            verdict(&with_ci(100.0, 1.0), &with_ci(95.0, 1.0)),
            Verdict::Fast
        );
        assert_eq!(
            verdict(&with_ci(100.0, 1.0), &with_ci(105.0, 1.0)),
            Verdict::Slow
        );
        let g = geomean([2.0, 0.5, 4.0]).unwrap();
        assert!(
            (g - 4f64.powf(1.0 / 3.0)).abs() < 1e-12,
            "the cube root of 2 * 0.5 * 4"
        );
        assert_eq!(geomean([]), None);
    }

    #[test]
    fn indistinguishable_means_within_the_noise_of_the_difference() {
        let with_ci = |median: f64, half: f64| Stats {
            median_us: median,
            ci_low_us: median - half,
            ci_high_us: median + half,
            ..summary(&[median])
        };
        // ±0.5 % each: the difference's noise is about 0.71 %.
        assert!(indistinguishable(
            &with_ci(100.0, 0.5),
            &with_ci(100.6, 0.5)
        ));
        assert!(!indistinguishable(
            &with_ci(100.0, 0.5),
            &with_ci(100.9, 0.5)
        ));
        // Those intervals overlap, so `tied` calls them a tie.
        assert!(tied(&with_ci(100.0, 0.5), &with_ci(100.9, 0.5)));
        assert!(!indistinguishable(
            &with_ci(100.0, 0.5),
            &with_ci(f64::NAN, 0.5)
        ));
    }

    #[test]
    fn overlapping_intervals_tie() {
        let with_ci = |lo: f64, hi: f64| Stats {
            ci_low_us: lo,
            ci_high_us: hi,
            ..summary(&[lo, hi])
        };
        let (a, b, c) = (
            with_ci(10.0, 11.0),
            with_ci(10.9, 12.0),
            with_ci(11.1, 12.0),
        );
        assert!(tied(&a, &b) && !tied(&a, &c));
    }
}
