//! `surrogate`: model-based search. Baselines are measured first; then a
//! seeded first pick and a maximin design cover the space, and after that a
//! Gaussian-process model of log latency (`gp.rs`) picks each next config by
//! expected improvement, each measured fully, until the budget is spent. The
//! rest are recorded as skipped. A resumed search counts what earlier runs
//! measured in the group against its budget and feeds it to the model.
//!
//! The first pick and the design depend on no measurement, so they are
//! handed to the lane in one `measure_each`, which may send the next ones
//! ahead while it records one (docs/worker-protocol.md, "Sent ahead"); each
//! pick by expected improvement waits for the measurement before it.

use indexmap::IndexMap;
use serde_json::Value as Json;

use super::{gp, Candidate, PriorObservation, Strategy, Trials};
use crate::rng::{hash_str, SplitMix64};

pub struct Surrogate {
    /// Configs per group; `None`: 30 % of the group, at least 8.
    pub budget: Option<u64>,
    pub seed: u64,
}

impl Strategy for Surrogate {
    fn keeps_skipped(&self) -> bool {
        true
    }

    fn learns_from_earlier_runs(&self) -> bool {
        true
    }

    fn search(&self, candidates: &[Candidate<'_>], trials: &mut dyn Trials) {
        for (i, c) in candidates.iter().enumerate() {
            if c.baseline {
                if trials.interrupted() {
                    return;
                }
                trials.measure(i);
            }
        }
        let pool: Vec<usize> = (0..candidates.len())
            .filter(|&i| !candidates[i].baseline)
            .collect();
        if pool.is_empty() {
            return;
        }
        let prior: Vec<PriorObservation> = trials.prior().to_vec();
        // Points of the model: the pool first, then the earlier runs' configs.
        let configs: Vec<&IndexMap<String, Json>> = pool
            .iter()
            .map(|&i| candidates[i].config)
            .chain(prior.iter().map(|p| &p.config))
            .collect();
        let x = gp::features(&configs);
        let group_size = pool.len() + prior.len();
        let budget = self
            .budget
            .map(|b| b as usize)
            .unwrap_or_else(|| gp::default_budget(group_size))
            .min(group_size);
        let design = gp::initial_design_size(budget);
        let n = pool.len();
        let mut rest: Vec<usize> = (0..n).collect();
        let mut chosen: Vec<usize> = (n..group_size).collect();
        // (point, ln median µs); failures get a penalty when the model is fitted.
        let mut seen: Vec<(usize, Option<f64>)> = prior
            .iter()
            .enumerate()
            .map(|(k, p)| (n + k, p.ln_median_us))
            .collect();
        // Seeded per group (by its first candidate), so groups do not all start alike.
        let mut rng = SplitMix64::new(self.seed ^ hash_str(candidates[pool[0]].id));
        let mut picks = Vec::new();
        while chosen.len() < budget.min(design) {
            let next = if chosen.is_empty() {
                rest[rng.below(rest.len() as u64) as usize]
            } else {
                gp::farthest(&x, &chosen, &rest).expect("candidates left")
            };
            rest.retain(|&i| i != next);
            chosen.push(next);
            picks.push(next);
        }
        let order: Vec<usize> = picks.iter().map(|&p| pool[p]).collect();
        let passed: std::collections::HashMap<usize, f64> =
            trials.measure_each(&order).into_iter().collect();
        if trials.interrupted() {
            return; // unmeasured configs stay unrecorded and run on resume
        }
        for p in picks {
            seen.push((p, ln_time(passed.get(&pool[p]).copied())));
        }
        while chosen.len() < budget && !trials.interrupted() {
            let next = {
                let worst = seen
                    .iter()
                    .filter_map(|(_, y)| *y)
                    .fold(f64::NEG_INFINITY, f64::max);
                let penalty = if worst.is_finite() { worst + 1.0 } else { 0.0 };
                let observed: Vec<(usize, f64)> = seen
                    .iter()
                    .map(|(i, y)| (*i, y.unwrap_or(penalty)))
                    .collect();
                gp::next_by_ei(&x, &observed, &rest).expect("candidates left")
            };
            rest.retain(|&i| i != next);
            chosen.push(next);
            seen.push((next, ln_time(trials.measure(pool[next]))));
        }
        if trials.interrupted() {
            return; // unmeasured configs stay unrecorded and run on resume
        }
        for i in rest {
            trials.skip(pool[i]);
        }
    }
}

/// The model's observation of a measured median: its log, or none for a
/// failure (or a median that is not a positive time, which says nothing
/// about speed).
fn ln_time(median_us: Option<f64>) -> Option<f64> {
    median_us.filter(|t| t.is_finite() && *t > 0.0).map(f64::ln)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn surrogate_measures_its_budget_finds_the_best_and_skips_the_rest() {
        let configs = bowl(10);
        let ids: Vec<String> = (0..10).map(|i| format!("job{i}")).collect();
        let mut trials = FakeTrials::new(configs.clone(), &bowl_time);
        let s = Surrogate {
            budget: Some(6),
            seed: 0,
        };
        s.search(&candidates(&configs, &ids, 0), &mut trials);
        assert_eq!(trials.outcome.len(), 10, "every candidate recorded once");
        assert_eq!(trials.outcome[&0], Outcome::Measured, "the baseline always");
        let measured = (1..10)
            .filter(|i| trials.outcome[i] != Outcome::Skipped)
            .count();
        assert_eq!(measured, 6, "exactly the budget besides the baseline");
        assert_eq!(trials.count(Outcome::Skipped), 3);
        assert_eq!(
            trials.outcome[&5],
            Outcome::Measured,
            "the model found the minimum"
        );
    }

    #[test]
    fn the_first_pick_and_the_design_are_handed_over_at_once() {
        let configs = bowl(12);
        let ids: Vec<String> = (0..12).map(|i| format!("job{i}")).collect();
        let mut trials = FakeTrials::new(configs.clone(), &bowl_time);
        let s = Surrogate {
            budget: Some(9),
            seed: 3,
        };
        s.search(&candidates(&configs, &ids, 0), &mut trials);
        // The baseline alone first, then the design (9 / 3 = 3 configs) in one
        // call, then each pick by expected improvement on its own.
        assert_eq!(trials.handed.len(), 1);
        let design = &trials.handed[0];
        assert_eq!(design.len(), gp::initial_design_size(9));
        let measured: Vec<usize> = trials
            .calls
            .iter()
            .filter(|(_, what)| *what == "measure")
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(measured[0], 0, "the baseline");
        assert_eq!(&measured[1..1 + design.len()], design.as_slice());
        assert_eq!(measured.len(), 1 + 9, "the baseline and the budget");
    }

    #[test]
    fn a_resumed_surrogate_spends_only_what_is_left_of_its_budget() {
        let all = bowl(10);
        // B = 1, 2, 3 were measured by an earlier run: they are not candidates now.
        let configs: Vec<_> = all
            .iter()
            .filter(|c| !matches!(c["B"].as_i64(), Some(1..=3)))
            .cloned()
            .collect();
        let ids: Vec<String> = (0..configs.len()).map(|i| format!("job{i}")).collect();
        let mut trials = FakeTrials::new(configs.clone(), &bowl_time);
        trials.prior = all[1..4]
            .iter()
            .map(|c| PriorObservation {
                config: c.clone(),
                ln_median_us: bowl_time(c).map(f64::ln),
            })
            .collect();
        let s = Surrogate {
            budget: Some(6),
            seed: 0,
        };
        s.search(&candidates(&configs, &ids, 0), &mut trials);
        let measured = trials
            .outcome
            .iter()
            .filter(|(i, o)| **i != 0 && **o != Outcome::Skipped)
            .count();
        assert_eq!(measured, 3, "6 in the budget, 3 already measured");
        assert_eq!(trials.outcome.len(), configs.len());
    }
}
