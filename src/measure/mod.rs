//! Statistics and the stopping rule: one implementation for every backend.
//! Workers only return samples; this module decides when a job has enough.

use crate::manifest::raw::RawProtocol;
use crate::store::Stats;

/// Samples below this many microseconds sit near the event timer's resolution
/// and overhead (about 1.3 us for an event pair on Hopper).
const TIMER_LIMIT_US: f64 = 5.0;

/// What the sampling loop knows about one job so far.
#[derive(Debug, Clone, Default)]
pub struct Sampling {
    pub samples_us: Vec<f64>,
    pub clocks_mhz: Vec<f64>,
    pub wall_ms: f64,
    pub timer: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take another batch.
    Continue,
    /// The confidence interval of the median is tight enough.
    Converged,
    /// A cap (samples, GPU time, wall time) was reached first.
    Capped,
}

impl Sampling {
    pub fn gpu_ms(&self) -> f64 {
        self.samples_us.iter().sum::<f64>() / 1e3
    }

    /// The runner's stopping rule (DESIGN.md): at least `min_samples`, then stop
    /// when the 95 % CI of the median is within `target_ci` of it; cap samples,
    /// GPU time and wall time.
    pub fn decide(&self, p: &RawProtocol) -> Decision {
        let n = self.samples_us.len();
        if n >= p.min_samples as usize {
            let (median, lo, hi) = median_ci(&sorted(&self.samples_us));
            if median > 0.0 && (hi - lo) / 2.0 <= p.target_ci * median {
                return Decision::Converged;
            }
        }
        if n >= p.max_samples as usize
            || self.gpu_ms() >= p.max_gpu_ms
            || self.wall_ms >= p.max_wall_ms
        {
            return Decision::Capped;
        }
        Decision::Continue
    }

    pub fn stats(&self, capped: bool) -> Stats {
        let mut stats = summarize(&self.samples_us);
        stats.timer = self.timer.clone();
        stats.wall_ms = self.wall_ms;
        stats.sm_clock_mhz = self.clocks_mhz.iter().cloned().reduce(f64::min);
        if capped && !stats.flags.iter().any(|f| f == "CAP_HIT") {
            stats.flags.push("CAP_HIT".into());
        }
        if let (Some(lo), Some(hi)) = (
            self.clocks_mhz.iter().cloned().reduce(f64::min),
            self.clocks_mhz.iter().cloned().reduce(f64::max),
        ) {
            // Power capping pulls the SM clock down under sustained load.
            if lo < 0.92 * hi {
                stats.flags.push("THROTTLED".into());
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
pub fn summarize(samples: &[f64]) -> Stats {
    let s = sorted(samples);
    let n = s.len();
    if n == 0 {
        return Stats::default();
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
        flags.push("NOISY".to_string());
    }
    let fence = q3 + 3.0 * (q3 - q1);
    let outliers = s.iter().filter(|x| **x > fence).count();
    if outliers * 100 >= n.max(20) {
        flags.push("OUTLIERS".into());
    }
    if n >= 20 {
        // In time order: a slow first tenth, or a trend from the first third to the last.
        let head = n / 10;
        let first = sorted(&samples[..head.max(2)]);
        let rest = sorted(&samples[head.max(2)..]);
        if quantile(&first, 0.5) > 1.05 * quantile(&rest, 0.5) {
            flags.push("SLOW_START".into());
        }
        let third = n / 3;
        let early = quantile(&sorted(&samples[head..head + third.min(n - head)]), 0.5);
        let late = quantile(&sorted(&samples[n - third..]), 0.5);
        if (late - early).abs() > 0.03 * median {
            flags.push("DRIFT".into());
        }
    }
    if median < TIMER_LIMIT_US {
        flags.push("TIMER_LIMITED".into());
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
        timer: String::new(),
        sm_clock_mhz: None,
        gpu_ms: s.iter().sum::<f64>() / 1e3,
        wall_ms: 0.0,
    }
}

/// Two timings are a tie when their confidence intervals overlap.
pub fn tied(a: &Stats, b: &Stats) -> bool {
    a.ci_low_us <= b.ci_high_us && b.ci_low_us <= a.ci_high_us
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_quartiles_of_known_data() {
        let s = summarize(&[5.0, 1.0, 3.0, 2.0, 4.0]);
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
    fn stops_when_converged_and_caps_otherwise() {
        let p = RawProtocol::default();
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

    #[test]
    fn flags_slow_start_drift_and_timer_limit() {
        let mut warm: Vec<f64> = vec![200.0; 5];
        warm.extend(vec![100.0; 95]);
        assert!(summarize(&warm).flags.contains(&"SLOW_START".to_string()));
        let drift: Vec<f64> = (0..90).map(|i| 100.0 + i as f64 * 0.2).collect();
        assert!(summarize(&drift).flags.contains(&"DRIFT".to_string()));
        assert!(summarize(&[3.0; 30])
            .flags
            .contains(&"TIMER_LIMITED".to_string()));
        assert!(summarize(&[100.0; 30]).flags.is_empty());
    }

    #[test]
    fn overlapping_intervals_tie() {
        let a = Stats {
            ci_low_us: 10.0,
            ci_high_us: 11.0,
            ..Default::default()
        };
        let b = Stats {
            ci_low_us: 10.9,
            ci_high_us: 12.0,
            ..Default::default()
        };
        let c = Stats {
            ci_low_us: 11.1,
            ci_high_us: 12.0,
            ..Default::default()
        };
        assert!(tied(&a, &b) && !tied(&a, &c));
    }
}
