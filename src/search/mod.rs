//! Search strategies: which configs of a (shape, method) group are measured,
//! and how deeply. A lane hands a strategy the group's candidates and a
//! [`Trials`] handle; the strategy asks for measurements through it and never
//! touches a backend, a journal or a compile pool itself.
//!
//! Every candidate ends as exactly one journal record (measured, failed,
//! pruned or skipped), unless the run is interrupted: then what is not yet
//! recorded stays unrecorded and runs on resume.
//!
//! Adding a strategy: a file here implementing [`Strategy`], a variant of
//! [`SearchKind`] with its parameters, its arm in [`Search::strategy`], and
//! its manifest spelling in `manifest/raw.rs`.

mod gp;
mod grid;
mod halving;
mod random;
mod surrogate;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

pub use grid::Grid;
pub use halving::Halving;
pub use random::Random;
pub use surrogate::Surrogate;

/// The search a manifest asks for, resolved: the strategy with its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Search {
    pub kind: SearchKind,
    /// Seeds random draws, the surrogate's first pick and the interpreter's sample.
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "strategy", rename_all = "lowercase")]
pub enum SearchKind {
    /// Every config that passes the constraints, each measured fully.
    Grid,
    /// `budget` configs per group drawn without replacement, each measured fully.
    Random { budget: u64 },
    /// Successive halving: every config gets one sample batch, the best 1/eta
    /// get eta times more, until the finalists remain; those are measured fully.
    Halving { eta: u32 },
    /// A Gaussian-process model of log latency picks each next config by
    /// expected improvement until `budget` configs are measured (default: 30 %
    /// of each group, at least 8).
    Surrogate { budget: Option<u64> },
}

/// The strategy's name, as manifests and journals spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StrategyName {
    Grid,
    Random,
    Halving,
    Surrogate,
}

impl SearchKind {
    pub fn name(&self) -> StrategyName {
        match self {
            SearchKind::Grid => StrategyName::Grid,
            SearchKind::Random { .. } => StrategyName::Random,
            SearchKind::Halving { .. } => StrategyName::Halving,
            SearchKind::Surrogate { .. } => StrategyName::Surrogate,
        }
    }
}

impl Search {
    /// The strategy that runs this search. `finalists` is the protocol's
    /// count of configs re-timed at the end, which halving keeps at least.
    pub fn strategy(&self, finalists: u32) -> Box<dyn Strategy> {
        match self.kind {
            SearchKind::Grid => Box::new(Grid),
            SearchKind::Random { budget } => Box::new(Random {
                budget,
                seed: self.seed,
            }),
            SearchKind::Halving { eta } => Box::new(Halving {
                eta,
                keep_at_least: finalists.max(1),
            }),
            SearchKind::Surrogate { budget } => Box::new(Surrogate {
                budget,
                seed: self.seed,
            }),
        }
    }

    /// The parameters as a journal header records them (budget, eta, seed).
    pub fn params(&self) -> IndexMap<String, u64> {
        let mut p = IndexMap::new();
        match self.kind {
            SearchKind::Grid => {}
            SearchKind::Random { budget } => {
                p.insert("budget".into(), budget);
                p.insert("seed".into(), self.seed);
            }
            SearchKind::Halving { eta } => {
                p.insert("eta".into(), u64::from(eta));
            }
            SearchKind::Surrogate { budget } => {
                if let Some(b) = budget {
                    p.insert("budget".into(), b);
                }
                p.insert("seed".into(), self.seed);
            }
        }
        p
    }
}

/// How a run's search is described in plan summaries and reports:
/// `halving (eta 3)`, `random (budget 9, seed 0)`, ...
pub fn describe(name: StrategyName, params: &IndexMap<String, u64>) -> String {
    let get = |k: &str| params.get(k).copied();
    match name {
        StrategyName::Grid => "grid".into(),
        StrategyName::Random => match (get("budget"), get("seed")) {
            (Some(b), Some(s)) => format!("random (budget {b}, seed {s})"),
            _ => "random".into(),
        },
        StrategyName::Halving => match get("eta") {
            Some(eta) => format!("halving (eta {eta})"),
            None => "halving".into(),
        },
        StrategyName::Surrogate => match get("budget") {
            Some(b) => format!("surrogate (budget {b} per group)"),
            None if get("seed").is_some() => {
                "surrogate (budget 30 % of each group, at least 8)".into()
            }
            None => "surrogate".into(),
        },
    }
}

/// A config of the group, as a strategy sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub id: &'a str,
    pub config: &'a IndexMap<String, Json>,
    /// The method's baseline: always measured, never pruned.
    pub baseline: bool,
}

/// A config an earlier run measured (or saw fail) in the same group.
#[derive(Debug, Clone)]
pub struct PriorObservation {
    pub config: IndexMap<String, Json>,
    /// ln of the median time in µs; None for a failure.
    pub ln_median_us: Option<f64>,
}

/// What a strategy may ask of the lane running it. `i` indexes the
/// candidates the strategy was given; each call that ends a candidate
/// writes its record, so a strategy never records anything itself.
pub trait Trials {
    /// Check, warm up and time candidate `i` with the full protocol, from
    /// fresh samples (screening samples are dropped). Its record is written
    /// (ok or failed); returns the median in µs when it passed.
    fn measure(&mut self, i: usize) -> Option<f64>;
    /// `measure` of each of `order`, in that order, until interrupted:
    /// (candidate, median) of each that passed, in `order`. A lane may have
    /// the next candidates under way while it records one, so a strategy
    /// hands it every candidate it will measure regardless of the results.
    fn measure_each(&mut self, order: &[usize]) -> Vec<(usize, f64)> {
        let mut passed = Vec::new();
        for &i in order {
            if self.interrupted() {
                break;
            }
            if let Some(median) = self.measure(i) {
                passed.push((i, median));
            }
        }
        passed
    }
    /// Check, warm up and take `batches` more sample batches of `i`, for
    /// screening. Returns its median so far; on failure its record is
    /// written and None is returned.
    fn screen(&mut self, i: usize, batches: usize) -> Option<f64>;
    /// `screen` of each of `order` with `batches` batches, in that order,
    /// until interrupted: (candidate, median so far) of each that passed,
    /// in `order`. A lane may have the next screenings under way while it
    /// reads one, so a strategy hands it a whole round at once.
    fn screen_each(&mut self, order: &[usize], batches: usize) -> Vec<(usize, f64)> {
        let mut passed = Vec::new();
        for &i in order {
            if self.interrupted() {
                break;
            }
            if let Some(median) = self.screen(i, batches) {
                passed.push((i, median));
            }
        }
        passed
    }
    /// End a screened candidate: recorded as pruned with its screening statistics.
    fn prune(&mut self, i: usize);
    /// End an unmeasured candidate: recorded as skipped, never run.
    fn skip(&mut self, i: usize);
    /// Ctrl-C: stop, leaving unrecorded candidates for the resumed run.
    fn interrupted(&self) -> bool;
    /// What earlier runs measured in this group, for a search that continues.
    fn prior(&self) -> &[PriorObservation];
}

/// The strategy of each method of a run: the experiment's, or a method's own
/// (`methods.X.search`).
pub struct Strategies {
    default: Box<dyn Strategy>,
    by_method: std::collections::HashMap<String, Box<dyn Strategy>>,
}

impl Strategies {
    pub fn new(
        default: Box<dyn Strategy>,
        by_method: std::collections::HashMap<String, Box<dyn Strategy>>,
    ) -> Strategies {
        Strategies { default, by_method }
    }

    /// One strategy for every method.
    pub fn single(strategy: Box<dyn Strategy>) -> Strategies {
        Strategies::new(strategy, Default::default())
    }

    pub fn for_method(&self, method: &str) -> &dyn Strategy {
        self.by_method.get(method).unwrap_or(&self.default).as_ref()
    }

    /// Whether any method's strategy learns from earlier runs.
    pub fn any_learns(&self) -> bool {
        std::iter::once(&self.default)
            .chain(self.by_method.values())
            .any(|s| s.learns_from_earlier_runs())
    }
}

/// One search strategy. See the module documentation.
pub trait Strategy: Send + Sync {
    /// At plan time: draw this many configs per group, seeded, and plan only
    /// those (random search). `None`: every valid config becomes a job.
    fn sample_per_group(&self) -> Option<(u64, u64)> {
        None
    }
    /// Whether a config this strategy left unmeasured in an earlier run
    /// (recorded as skipped) stays unmeasured on resume. Other strategies
    /// run such configs.
    fn keeps_skipped(&self) -> bool {
        false
    }
    /// Whether a resumed run hands this strategy what earlier runs measured.
    fn learns_from_earlier_runs(&self) -> bool {
        false
    }
    /// Measure the group's candidates (tune mode).
    fn search(&self, candidates: &[Candidate<'_>], trials: &mut dyn Trials);
}

#[cfg(test)]
pub(crate) mod testing {
    //! A fake lane for strategy tests: a candidate's time is a function of its config.

    use super::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Outcome {
        Measured,
        Failed,
        Pruned,
        Skipped,
    }

    pub struct FakeTrials<'a> {
        pub time: &'a dyn Fn(&IndexMap<String, Json>) -> Option<f64>,
        pub configs: Vec<IndexMap<String, Json>>,
        pub screened: HashMap<usize, (f64, usize)>,
        pub outcome: HashMap<usize, Outcome>,
        pub calls: Vec<(usize, &'static str)>,
        pub prior: Vec<PriorObservation>,
        /// Each `measure_each` call's order.
        pub handed: Vec<Vec<usize>>,
    }

    impl<'a> FakeTrials<'a> {
        pub fn new(
            configs: Vec<IndexMap<String, Json>>,
            time: &'a dyn Fn(&IndexMap<String, Json>) -> Option<f64>,
        ) -> Self {
            FakeTrials {
                time,
                configs,
                screened: HashMap::new(),
                outcome: HashMap::new(),
                calls: Vec::new(),
                prior: Vec::new(),
                handed: Vec::new(),
            }
        }

        fn end(&mut self, i: usize, o: Outcome) {
            let before = self.outcome.insert(i, o);
            assert!(before.is_none(), "candidate {i} recorded twice");
        }

        pub fn count(&self, o: Outcome) -> usize {
            self.outcome.values().filter(|x| **x == o).count()
        }
    }

    impl Trials for FakeTrials<'_> {
        fn measure(&mut self, i: usize) -> Option<f64> {
            self.calls.push((i, "measure"));
            self.screened.remove(&i);
            match (self.time)(&self.configs[i]) {
                Some(t) => {
                    self.end(i, Outcome::Measured);
                    Some(t)
                }
                None => {
                    self.end(i, Outcome::Failed);
                    None
                }
            }
        }
        fn measure_each(&mut self, order: &[usize]) -> Vec<(usize, f64)> {
            self.handed.push(order.to_vec());
            order
                .iter()
                .filter_map(|&i| self.measure(i).map(|t| (i, t)))
                .collect()
        }
        fn screen(&mut self, i: usize, batches: usize) -> Option<f64> {
            self.calls.push((i, "screen"));
            match (self.time)(&self.configs[i]) {
                Some(t) => {
                    self.screened.entry(i).or_insert((t, 0)).1 += batches;
                    Some(t)
                }
                None => {
                    self.end(i, Outcome::Failed);
                    None
                }
            }
        }
        fn prune(&mut self, i: usize) {
            assert!(self.screened.remove(&i).is_some(), "pruned unscreened {i}");
            self.end(i, Outcome::Pruned);
        }
        fn skip(&mut self, i: usize) {
            self.end(i, Outcome::Skipped);
        }
        fn interrupted(&self) -> bool {
            false
        }
        fn prior(&self) -> &[PriorObservation] {
            &self.prior
        }
    }

    /// Candidates B = 0..n with B = `baseline` the baseline; time |B - 5| * 10 + 100, B = 9 fails.
    pub fn bowl(n: i64) -> Vec<IndexMap<String, Json>> {
        (0..n)
            .map(|b| {
                let mut c = IndexMap::new();
                c.insert("B".to_string(), Json::from(b));
                c
            })
            .collect()
    }

    pub fn bowl_time(c: &IndexMap<String, Json>) -> Option<f64> {
        let b = c["B"].as_f64().unwrap();
        (b != 9.0).then(|| (b - 5.0).abs() * 10.0 + 100.0)
    }

    pub fn candidates<'a>(
        configs: &'a [IndexMap<String, Json>],
        ids: &'a [String],
        baseline: usize,
    ) -> Vec<Candidate<'a>> {
        configs
            .iter()
            .zip(ids)
            .enumerate()
            .map(|(i, (config, id))| Candidate {
                id,
                config,
                baseline: i == baseline,
            })
            .collect()
    }
}
