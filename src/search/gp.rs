//! The surrogate strategy's model (`search.strategy: surrogate`, see
//! `surrogate.rs`): a Gaussian process of log latency over a group's configs
//! that picks which config to measure next by expected improvement, so a
//! budget of a third of a space is spent mostly near its fast corner.
//! Everything here is pure arithmetic on small matrices (a group has tens of
//! configs, a budget tens of measurements); the lane owns the measuring.
//!
//! - Features: each config key becomes one coordinate in [0, 1]: log2 of the
//!   value when every value of that key is a positive number (tile sizes and
//!   stage counts are geometric), the value itself for other numbers, and the
//!   rank of the value among the key's distinct values otherwise.
//! - Initial design: a seeded first point, then farthest-point (maximin)
//!   picks, so the first measurements cover the space.
//! - Model: zero-mean GP on standardised log latency, squared-exponential
//!   kernel, length scale picked from a small ladder by marginal likelihood,
//!   a small fixed noise. Failed configs enter as a bad observation (the worst
//!   seen plus one e-fold), so the model steers away from their region.
//! - Acquisition: expected improvement over the best observation.

use indexmap::IndexMap;
use serde_json::Value as Json;

/// Length scales tried when fitting, in units of the [0, 1] feature range.
const LENGTH_SCALES: [f64; 5] = [0.1, 0.2, 0.35, 0.6, 1.0];
/// Observation noise variance, relative to the standardised signal.
const NOISE: f64 = 1e-3;

/// One coordinate vector per config, in the configs' order.
pub fn features(configs: &[&IndexMap<String, Json>]) -> Vec<Vec<f64>> {
    let mut keys: Vec<&String> = configs.iter().flat_map(|c| c.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut columns: Vec<Vec<f64>> = Vec::with_capacity(keys.len());
    for key in keys {
        let values: Vec<Option<&Json>> = configs.iter().map(|c| c.get(key)).collect();
        let numbers: Option<Vec<f64>> = values.iter().map(|v| v.and_then(Json::as_f64)).collect();
        let raw: Vec<f64> = match numbers {
            Some(n) if n.iter().all(|x| *x > 0.0) => n.iter().map(|x| x.log2()).collect(),
            Some(n) => n,
            None => {
                // Rank among the distinct values (missing sorts first).
                let mut distinct: Vec<String> = values
                    .iter()
                    .map(|v| v.map(Json::to_string).unwrap_or_default())
                    .collect();
                distinct.sort();
                distinct.dedup();
                values
                    .iter()
                    .map(|v| {
                        let s = v.map(Json::to_string).unwrap_or_default();
                        distinct.iter().position(|d| *d == s).unwrap_or(0) as f64
                    })
                    .collect()
            }
        };
        let (lo, hi) = raw
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(*x), b.max(*x))
            });
        if hi > lo {
            columns.push(raw.iter().map(|x| (x - lo) / (hi - lo)).collect());
        }
        // A key with one value carries no information: left out.
    }
    (0..configs.len())
        .map(|i| columns.iter().map(|c| c[i]).collect())
        .collect()
}

fn dist2(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// The next point of a maximin design: the candidate farthest from every chosen point.
pub fn farthest(x: &[Vec<f64>], chosen: &[usize], candidates: &[usize]) -> Option<usize> {
    candidates.iter().copied().max_by(|&a, &b| {
        let da = chosen
            .iter()
            .map(|&c| dist2(&x[a], &x[c]))
            .fold(f64::INFINITY, f64::min);
        let db = chosen
            .iter()
            .map(|&c| dist2(&x[b], &x[c]))
            .fold(f64::INFINITY, f64::min);
        da.total_cmp(&db).then(b.cmp(&a)) // ties: the earlier candidate
    })
}

/// A fitted Gaussian process.
pub struct Gp {
    x: Vec<Vec<f64>>,
    chol: Vec<Vec<f64>>,
    alpha: Vec<f64>,
    length: f64,
    y_mean: f64,
    y_std: f64,
}

fn kernel(a: &[f64], b: &[f64], length: f64) -> f64 {
    (-dist2(a, b) / (2.0 * length * length)).exp()
}

/// Lower-triangular L with L Lᵀ = A, or None if A is not positive definite.
fn cholesky(a: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let n = a.len();
    let mut l = vec![vec![0.0; n]; n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i][k] * l[j][k]).sum();
            if i == j {
                let d = a[i][i] - s;
                if d <= 0.0 {
                    return None;
                }
                l[i][j] = d.sqrt();
            } else {
                l[i][j] = (a[i][j] - s) / l[j][j];
            }
        }
    }
    Some(l)
}

/// Solve L z = b (forward), then Lᵀ w = z if `transpose_too`.
fn solve_lower(l: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let n = b.len();
    let mut z = vec![0.0; n];
    for i in 0..n {
        let s: f64 = (0..i).map(|k| l[i][k] * z[k]).sum();
        z[i] = (b[i] - s) / l[i][i];
    }
    z
}

fn solve_upper_t(l: &[Vec<f64>], z: &[f64]) -> Vec<f64> {
    let n = z.len();
    let mut w = vec![0.0; n];
    for i in (0..n).rev() {
        let s: f64 = (i + 1..n).map(|k| l[k][i] * w[k]).sum();
        w[i] = (z[i] - s) / l[i][i];
    }
    w
}

impl Gp {
    /// Fit to observations `y` at points `x` (at least one).
    pub fn fit(x: Vec<Vec<f64>>, y: &[f64]) -> Gp {
        let n = y.len();
        let y_mean = y.iter().sum::<f64>() / n as f64;
        let var = y.iter().map(|v| (v - y_mean).powi(2)).sum::<f64>() / n as f64;
        let y_std = if var > 1e-18 { var.sqrt() } else { 1.0 };
        let ys: Vec<f64> = y.iter().map(|v| (v - y_mean) / y_std).collect();
        let mut best: Option<(f64, Gp)> = None;
        for &length in &LENGTH_SCALES {
            let k: Vec<Vec<f64>> = (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| kernel(&x[i], &x[j], length) + if i == j { NOISE } else { 0.0 })
                        .collect()
                })
                .collect();
            let Some(chol) = cholesky(&k) else { continue };
            let alpha = solve_upper_t(&chol, &solve_lower(&chol, &ys));
            let fit: f64 = ys.iter().zip(&alpha).map(|(a, b)| a * b).sum::<f64>();
            let log_det: f64 = (0..n).map(|i| chol[i][i].ln()).sum();
            let log_ml = -0.5 * fit - log_det;
            if best.as_ref().map_or(true, |(b, _)| log_ml > *b) {
                best = Some((
                    log_ml,
                    Gp {
                        x: x.clone(),
                        chol,
                        alpha,
                        length,
                        y_mean,
                        y_std,
                    },
                ));
            }
        }
        best.map(|(_, gp)| gp)
            .expect("the noise term keeps K positive definite")
    }

    /// Posterior mean and standard deviation at `p`, in the units of `y`.
    pub fn predict(&self, p: &[f64]) -> (f64, f64) {
        let k: Vec<f64> = self.x.iter().map(|xi| kernel(xi, p, self.length)).collect();
        let mean: f64 = k.iter().zip(&self.alpha).map(|(a, b)| a * b).sum();
        let v = solve_lower(&self.chol, &k);
        let var = (1.0 - v.iter().map(|x| x * x).sum::<f64>()).max(1e-12);
        (self.y_mean + mean * self.y_std, var.sqrt() * self.y_std)
    }
}

/// Expected improvement below `best` of a normal prediction (minimising).
pub fn expected_improvement(mean: f64, sd: f64, best: f64) -> f64 {
    if sd <= 0.0 {
        return (best - mean).max(0.0);
    }
    let z = (best - mean) / sd;
    (best - mean) * normal_cdf(z) + sd * normal_pdf(z)
}

fn normal_pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

fn normal_cdf(z: f64) -> f64 {
    0.5 * (1.0 + erf(z / std::f64::consts::SQRT_2))
}

/// erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7).
fn erf(x: f64) -> f64 {
    let sign = if x < 0.0 { -1.0 } else { 1.0 };
    let x = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    sign * (1.0 - poly * (-x * x).exp())
}

/// The surrogate's next pick among `candidates`, given measured points and
/// their observations (log latency; failures already penalised).
pub fn next_by_ei(
    x: &[Vec<f64>],
    measured: &[(usize, f64)],
    candidates: &[usize],
) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    if measured.is_empty() {
        return candidates.first().copied();
    }
    let gp = Gp::fit(
        measured.iter().map(|(i, _)| x[*i].clone()).collect(),
        &measured.iter().map(|(_, y)| *y).collect::<Vec<_>>(),
    );
    let best = measured
        .iter()
        .map(|(_, y)| *y)
        .fold(f64::INFINITY, f64::min);
    candidates.iter().copied().max_by(|&a, &b| {
        let (ma, sa) = gp.predict(&x[a]);
        let (mb, sb) = gp.predict(&x[b]);
        expected_improvement(ma, sa, best)
            .total_cmp(&expected_improvement(mb, sb, best))
            .then(b.cmp(&a))
    })
}

/// Configs measured before the model takes over: a third of the budget, at least 2.
pub fn initial_design_size(budget: usize) -> usize {
    (budget / 3).max(2).min(budget)
}

/// The budget when the manifest gives none: 30 % of the group, at least 8.
pub fn default_budget(group_size: usize) -> usize {
    (group_size * 3).div_ceil(10).max(8).min(group_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grid(n: usize) -> Vec<Vec<f64>> {
        let mut x = Vec::new();
        for i in 0..n {
            for j in 0..n {
                x.push(vec![i as f64 / (n - 1) as f64, j as f64 / (n - 1) as f64]);
            }
        }
        x
    }

    #[test]
    fn features_are_log2_scaled_to_unit_range_and_constant_keys_dropped() {
        let a = json!({"BLOCK": 16, "w": 4, "kind": "a"});
        let b = json!({"BLOCK": 64, "w": 4, "kind": "b"});
        let c = json!({"BLOCK": 256, "w": 4, "kind": "a"});
        let maps: Vec<IndexMap<String, Json>> = [a, b, c]
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
        let f = features(&maps.iter().collect::<Vec<_>>());
        // keys sorted: BLOCK, kind (w is constant and dropped)
        assert_eq!(f[0], vec![0.0, 0.0]);
        assert_eq!(f[1], vec![0.5, 1.0]); // log2 64 is halfway between log2 16 and log2 256
        assert_eq!(f[2], vec![1.0, 0.0]);
    }

    #[test]
    fn the_gp_interpolates_what_it_saw_and_is_unsure_far_away() {
        let x = vec![vec![0.0], vec![0.5], vec![1.0]];
        let y = [3.0, 1.0, 2.0];
        let gp = Gp::fit(x, &y);
        for (p, want) in [(0.0, 3.0), (0.5, 1.0), (1.0, 2.0)] {
            let (m, s) = gp.predict(&[p]);
            assert!((m - want).abs() < 0.05, "mean {m} at {p}, want {want}");
            assert!(s < 0.1, "sd {s} at an observed point");
        }
        let (_, far) = gp.predict(&[5.0]);
        assert!(far > 0.5, "sd {far} far from the data");
    }

    #[test]
    fn expected_improvement_prefers_low_means_and_high_uncertainty() {
        assert!(expected_improvement(0.0, 0.1, 1.0) > expected_improvement(2.0, 0.1, 1.0));
        assert!(expected_improvement(1.0, 1.0, 1.0) > expected_improvement(1.0, 0.1, 1.0));
        assert!(expected_improvement(5.0, 0.0, 1.0) == 0.0);
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-9 && (normal_cdf(1.96) - 0.975).abs() < 1e-3);
    }

    /// On a smooth bowl over an 8x8 grid, a 16-point budget (a quarter of the
    /// space) finds the minimum; the initial design alone does not.
    #[test]
    fn surrogate_search_finds_the_minimum_of_a_bowl_within_a_quarter_of_the_space() {
        let x = grid(8);
        let truth = |p: &[f64]| ((p[0] - 0.71).powi(2) + 2.0 * (p[1] - 0.29).powi(2)).ln_1p();
        let argmin = (0..x.len())
            .min_by(|&a, &b| truth(&x[a]).total_cmp(&truth(&x[b])))
            .unwrap();
        let budget = 16;
        let mut chosen = vec![0usize];
        let mut rest: Vec<usize> = (1..x.len()).collect();
        while chosen.len() < initial_design_size(budget) {
            let next = farthest(&x, &chosen, &rest).unwrap();
            rest.retain(|&i| i != next);
            chosen.push(next);
        }
        assert!(
            !chosen.contains(&argmin),
            "the design should not hit it by luck"
        );
        let mut measured: Vec<(usize, f64)> = chosen.iter().map(|&i| (i, truth(&x[i]))).collect();
        while measured.len() < budget {
            let next = next_by_ei(&x, &measured, &rest).unwrap();
            rest.retain(|&i| i != next);
            measured.push((next, truth(&x[next])));
        }
        assert!(
            measured.iter().any(|(i, _)| *i == argmin),
            "picked {measured:?}"
        );
    }

    #[test]
    fn budgets() {
        assert_eq!(default_budget(54), 17);
        assert_eq!(default_budget(5), 5);
        assert_eq!(default_budget(20), 8);
        assert_eq!(initial_design_size(17), 5);
        assert_eq!(initial_design_size(2), 2);
    }
}
