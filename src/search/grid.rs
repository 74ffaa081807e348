//! `grid`: every config that passes the constraints, each measured with the
//! full protocol, asked for in plan order (a lane with a compile pool takes
//! them as their compiles finish). Adaptive stopping makes this cheap: most
//! configs converge in one sample batch.

use super::{Candidate, Strategy, Trials};

pub struct Grid;

impl Strategy for Grid {
    fn search(&self, candidates: &[Candidate<'_>], trials: &mut dyn Trials) {
        measure_all(candidates, trials);
    }
}

/// Measure every candidate fully, in order: grid's search, and random's on
/// the sample the planner drew.
pub(super) fn measure_all(candidates: &[Candidate<'_>], trials: &mut dyn Trials) {
    let order: Vec<usize> = (0..candidates.len()).collect();
    trials.measure_each(&order);
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn grid_measures_every_candidate_once_in_order() {
        let configs = bowl(10);
        let ids: Vec<String> = (0..10).map(|i| format!("j{i}")).collect();
        let mut trials = FakeTrials::new(configs.clone(), &bowl_time);
        Grid.search(&candidates(&configs, &ids, 0), &mut trials);
        assert_eq!(trials.count(Outcome::Measured), 9);
        assert_eq!(
            trials.count(Outcome::Failed),
            1,
            "B=9 fails and is recorded"
        );
        let order: Vec<usize> = trials.calls.iter().map(|(i, _)| *i).collect();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
    }
}
