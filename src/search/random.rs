//! `random`: `budget` configs per group, drawn without replacement by a
//! seeded reservoir sample when the run is planned, so `tunelab plan` shows
//! exactly the jobs that will run; each is measured fully.

use super::{Candidate, Strategy, Trials};

pub struct Random {
    pub budget: u64,
    pub seed: u64,
}

impl Strategy for Random {
    fn sample_per_group(&self) -> Option<(u64, u64)> {
        Some((self.budget, self.seed))
    }

    fn search(&self, candidates: &[Candidate<'_>], trials: &mut dyn Trials) {
        super::grid::measure_all(candidates, trials);
    }
}
