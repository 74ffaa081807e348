//! `halving`: successive halving. Every config gets one sample batch; each
//! round keeps the best 1/eta (never the baseline, which every result is
//! compared with), giving survivors eta times more batches, until the
//! finalists remain; those are then measured with the full protocol from
//! fresh samples. Dropped configs are recorded as pruned with their
//! screening statistics.

use super::{Candidate, Strategy, Trials};

/// Screening batches per survivor grow as eta^round, up to this many.
const MAX_SCREEN_BATCHES: usize = 16;

pub struct Halving {
    pub eta: u32,
    /// Rounds stop once this many (plus the baselines) remain: the protocol's finalists.
    pub keep_at_least: u32,
}

impl Strategy for Halving {
    fn search(&self, candidates: &[Candidate<'_>], trials: &mut dyn Trials) {
        // (candidate, median of its screening samples so far)
        let all: Vec<usize> = (0..candidates.len()).collect();
        let mut alive = trials.screen_each(&all, 1);
        if trials.interrupted() {
            return;
        }
        let keep_at_least = self.keep_at_least as usize;
        let eta = self.eta as usize;
        let baselines = alive
            .iter()
            .filter(|(i, _)| candidates[*i].baseline)
            .count();
        let mut round = 1u32;
        while alive.len() > keep_at_least + baselines {
            if trials.interrupted() {
                return;
            }
            alive.sort_by(|a, b| a.1.total_cmp(&b.1));
            let keep = alive.len().div_ceil(eta).max(keep_at_least);
            let (survivors, dropped): (Vec<_>, Vec<_>) = alive
                .into_iter()
                .enumerate()
                .partition(|(rank, (i, _))| *rank < keep || candidates[*i].baseline);
            for (_, (i, _)) in dropped {
                trials.prune(i);
            }
            alive = survivors.into_iter().map(|(_, c)| c).collect();
            if alive.len() <= keep_at_least + baselines {
                break;
            }
            round += 1;
            let batches = eta.pow(round - 1).min(MAX_SCREEN_BATCHES);
            let round_order: Vec<usize> = alive.iter().map(|(i, _)| *i).collect();
            alive = trials.screen_each(&round_order, batches);
        }
        let finalists: Vec<usize> = alive.into_iter().map(|(i, _)| i).collect();
        trials.measure_each(&finalists);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn halving_keeps_the_best_measures_finalists_fully_and_never_prunes_the_baseline() {
        let configs = bowl(10);
        let ids: Vec<String> = (0..10).map(|i| format!("j{i}")).collect();
        let mut trials = FakeTrials::new(configs.clone(), &bowl_time);
        let halving = Halving {
            eta: 3,
            keep_at_least: 3,
        };
        // B = 0, the slowest, is the baseline.
        halving.search(&candidates(&configs, &ids, 0), &mut trials);
        assert_eq!(trials.outcome.len(), 10, "every candidate recorded once");
        assert_eq!(
            trials.outcome[&5],
            Outcome::Measured,
            "the best is measured fully"
        );
        assert_eq!(
            trials.outcome[&0],
            Outcome::Measured,
            "the baseline is never pruned"
        );
        assert_eq!(trials.outcome[&9], Outcome::Failed);
        assert!(trials.count(Outcome::Measured) <= 3 + 1);
        assert!(trials.count(Outcome::Pruned) >= 5);
    }
}
