//! An A/B run's pairs on a lane (`tunelab ab`, docs/ab.md). A pair is one
//! (shape, method) and three jobs: side A's config, a second preparation of
//! it (A's other side in the A/A rounds) and side B's. The lane checks A
//! and its copy, times them against each other in a few rounds (the noise
//! of this run), checks B (with its planted slowdown, if asked, sized from
//! A's time in those rounds), then times A against B in rounds, A B then B
//! A and so on. Each round is a round of the finalists' re-timing
//! (`lane::retime_round`): a check that reuses the verdict the job's
//! worker holds, a warm-up and one batch, for each side in turn. The pair
//! becomes one record; verdicts are worked out from the records
//! (`emit::ab`).

use std::collections::HashSet;
use std::time::Instant;

use crate::backend::{Backend, JobFailure};
use crate::manifest::{MethodKind, Shape};
use crate::measure::{self, Sampling};
use crate::plan::Job;
use crate::store::{AbJob, AbPair, AbRound, AbSetup, Failure, FailureClass, Interleave};

use super::lane::{self, LaneContext, Measured};
use super::{deal, now_rfc3339, Event, Group};

/// How an A/B run's lanes time each pair.
#[derive(Debug, Clone, PartialEq)]
pub struct AbTiming {
    /// The setup's id, which every pair record carries.
    pub setup: String,
    pub aa_rounds: u32,
    pub rounds: u32,
    /// Samples of each side a round (already divided under graph timing,
    /// as the setup records it).
    pub batch: u32,
    /// Rounds added, once, to a pair whose verdict after `rounds` is
    /// AMBIGUOUS (0: none).
    pub extra_rounds: u32,
    /// The smallest change a verdict calls FAST or SLOW (a fraction): the
    /// verdict that decides on the extra rounds is taken against it.
    pub threshold: f64,
    /// B's planted slowdown as a fraction of A's median in the A/A rounds.
    pub plant: f64,
    /// How a round times its two sides.
    pub interleave: Interleave,
}

/// One pair to time: its (shape, method) and its three jobs.
#[derive(Debug, Clone)]
pub struct AbPairPlan {
    /// The shape's number among the A/B's shapes (dealing and compile order).
    pub shape_index: usize,
    pub shape: Shape,
    pub method: String,
    pub kernel: String,
    pub kind: MethodKind,
    pub a: Job,
    /// A's second preparation: A's config and code under another id.
    pub a2: Job,
    pub b: Job,
    /// Why the runner knows the pair cannot run here, if it does.
    pub unavailable: Option<String>,
}

/// What `tunelab ab` hands the run: the setup (journaled after the header),
/// how pairs are timed, and the pairs.
#[derive(Debug, Clone)]
pub struct AbPlan {
    pub setup: AbSetup,
    pub timing: AbTiming,
    pub pairs: Vec<AbPairPlan>,
}

impl AbPlan {
    /// The pairs a journal has not recorded for this setup, as groups to
    /// deal (three jobs each), in the pairs' order.
    pub(super) fn pending(&self, done: &HashSet<String>) -> Vec<deal::Pending> {
        self.pairs
            .iter()
            .filter(|p| !done.contains(&p.b.id))
            .map(|p| deal::Pending {
                method: p.method.clone(),
                shape_index: p.shape_index,
                shape: p.shape.clone(),
                jobs: 3,
                cost: 0.0,
            })
            .collect()
    }

    /// The group of the pending pair of `method` at `shape_index`: its jobs
    /// A, A's second preparation and B, in that order.
    pub(super) fn group(&self, method: &str, shape_index: usize) -> Option<Group> {
        let p = self
            .pairs
            .iter()
            .find(|p| p.method == method && p.shape_index == shape_index)?;
        Some(Group {
            shape: p.shape.clone(),
            method: p.method.clone(),
            kernel: p.kernel.clone(),
            kind: p.kind,
            jobs: vec![p.a.clone(), p.a2.clone(), p.b.clone()],
            unavailable: p.unavailable.clone(),
        })
    }
}

/// The pairs of `setup` a journal already recorded, by B's job id: a
/// resumed A/B times only the others.
pub fn recorded(results: &crate::store::Results, setup: &str) -> HashSet<String> {
    results
        .ab_pairs
        .iter()
        .filter(|p| p.setup == setup && p.failure.is_none())
        .map(|p| p.b.job_id.clone())
        .collect()
}

/// An A/B pair's progress line: `ab 12/74: M=64 E=32 ... triton: B/A 1.003`.
pub(super) fn progress_line(p: &crate::store::AbPair, before: u64, planned: u64) -> String {
    let shape = crate::manifest::shape_label(&p.shape);
    let what = match (&p.failure, p.rounds.is_empty()) {
        (Some(f), _) => format!("failed ({}): {}", f.class.as_str(), f.message),
        (None, true) => "no rounds".into(),
        (None, false) => {
            let logs: Vec<f64> = p.rounds.iter().map(|r| r.log_ratio()).collect();
            let mean = logs.iter().sum::<f64>() / logs.len() as f64;
            format!("B/A {:.3} over {} rounds", mean.exp(), logs.len())
        }
    };
    format!("ab {}/{planned}: {shape} {}: {what}", before + 1, p.method)
}

const A: usize = 0;
const A2: usize = 1;
const B: usize = 2;

/// Times one pair (a group of jobs A, A's second preparation, B) and
/// emits its record. Returns the group, whole, when the lane retired
/// during it (another lane times it again); `None` otherwise. An
/// interrupted pair is not recorded: a resume times it again.
pub(super) fn run_pair(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    group: Group,
    emit: &mut dyn FnMut(Event),
) -> Option<Group> {
    let timing = ctx
        .ab
        .expect("an A/B run's lanes know how to time its pairs");
    let started = Instant::now();
    let track = format!("lane{} jobs", ctx.lane);
    assert_eq!(group.jobs.len(), 3, "an A/B pair is A, A again and B");
    let mut sides: Vec<Measured> = group
        .jobs
        .iter()
        .map(|j| Measured::new(j.clone(), ctx.protocol.stop_rule()))
        .collect();
    let mut record = AbPair {
        setup: timing.setup.clone(),
        shape: group.shape.clone(),
        method: group.method.clone(),
        kind: group.kind,
        kernel: group.kernel.clone(),
        a: ab_job(&sides[A]),
        b: ab_job(&sides[B]),
        aa_job_id: sides[A2].job.id.clone(),
        plant_us: 0.0,
        aa: Vec::new(),
        rounds: Vec::new(),
        lost_rounds: 0,
        extra_rounds: 0,
        a_stats: None,
        b_stats: None,
        failure: None,
        lane: ctx.lane,
        duration_s: 0.0,
        finished_at: String::new(),
    };
    let shape = serde_json::to_value(&group.shape).expect("shape");
    let facts = backend
        .describe(&shape, ctx.protocol.seed)
        .unwrap_or_default();
    let timed = (|| -> Result<(), Failure> {
        if let Some(why) = group
            .unavailable
            .as_ref()
            .or(facts.unavailable.get(&group.kernel))
        {
            return Err(failed("", JobFailure::new(FailureClass::Unavailable, why)));
        }
        backend.begin_group(&group.method, &group.shape, ctx.protocol.seed);
        let kernel = group.kernel.as_str();
        let mode = ctx.sampling;
        let count = timing.batch;
        for i in [A, A2] {
            ready(ctx, backend, &track, kernel, group.kind, &mut sides[i])
                .map_err(|f| failed("A", f))?;
        }
        let mut a_in_aa = Sampling::default();
        for r in 0..timing.aa_rounds {
            if ctx.stopping() {
                return Ok(());
            }
            let got = rounds(
                ctx,
                backend,
                &track,
                &group,
                &mut sides,
                (A, A2),
                r,
                mode,
                count,
            );
            match got {
                Some((round, a, _)) => {
                    record.aa.push(round);
                    pool(&mut a_in_aa, a);
                }
                None => record.lost_rounds += 1,
            }
        }
        if timing.plant > 0.0 {
            let a_us = measure::quantile(&measure::sorted(&a_in_aa.samples_us), 0.5);
            if !(a_us.is_finite() && a_us > 0.0) {
                return Err(failed(
                    "A",
                    JobFailure::new(
                        FailureClass::ProblemError,
                        "no A/A round completed, so nothing sizes B's planted slowdown",
                    ),
                ));
            }
            record.plant_us = timing.plant * a_us;
            let variant = sides[B].job.variant.get_or_insert_with(Default::default);
            variant.plant_us = record.plant_us;
        }
        ready(ctx, backend, &track, kernel, group.kind, &mut sides[B])
            .map_err(|f| failed("B", f))?;
        record.b = ab_job(&sides[B]);
        let (mut a_all, mut b_all) = (Sampling::default(), Sampling::default());
        let mut planned = timing.rounds;
        let mut r = 0;
        while r < planned {
            if ctx.stopping() {
                return Ok(());
            }
            match rounds(
                ctx,
                backend,
                &track,
                &group,
                &mut sides,
                (A, B),
                r,
                mode,
                count,
            ) {
                Some((round, a, b)) => {
                    record.rounds.push(round);
                    pool(&mut a_all, a);
                    pool(&mut b_all, b);
                }
                None => record.lost_rounds += 1,
            }
            r += 1;
            if r == timing.rounds && timing.extra_rounds > 0 && ambiguous(&record, timing.threshold)
            {
                // Once, so that the verdict is looked at twice at most
                // (docs/ab.md, "The verdict").
                planned += timing.extra_rounds;
                record.extra_rounds = timing.extra_rounds;
            }
        }
        if record.rounds.is_empty() {
            return Err(failed(
                "",
                JobFailure::new(
                    FailureClass::ProblemError,
                    "no A/B round completed: every round lost a side's batch (the lane's log says why)",
                ),
            ));
        }
        record.a_stats = Some(a_all.stats());
        record.b_stats = Some(b_all.stats());
        Ok(())
    })();
    record.a = AbJob {
        check: sides[A].check.clone(),
        kernels: sides[A].kernels.clone(),
        ..record.a
    };
    record.b = AbJob {
        check: sides[B].check.clone(),
        kernels: sides[B].kernels.clone(),
        ..record.b
    };
    crate::trace::span(
        &track,
        "ab pair",
        started,
        serde_json::json!({"shape": group.shape, "method": group.method}),
    );
    if ctx.retired() {
        return Some(group);
    }
    if super::interrupted() {
        return None;
    }
    record.failure = timed.err();
    record.duration_s = started.elapsed().as_secs_f64();
    record.finished_at = now_rfc3339();
    emit(Event::AbPair(Box::new(record)));
    None
}

/// Whether a pair's rounds so far leave its verdict AMBIGUOUS.
fn ambiguous(record: &AbPair, threshold: f64) -> bool {
    let logs = |rounds: &[AbRound]| rounds.iter().map(AbRound::log_ratio).collect::<Vec<f64>>();
    crate::measure::paired::verdict(&logs(&record.aa), &logs(&record.rounds), threshold)
        == Some(crate::measure::Verdict::Ambiguous)
}

/// A side's job as its record names it, before or after its check.
fn ab_job(m: &Measured) -> AbJob {
    AbJob {
        job_id: m.job.id.clone(),
        config: m.job.config.clone(),
        check: m.check.clone(),
        kernels: m.kernels.clone(),
    }
}

/// A side's failure as the pair records it, naming the side.
fn failed(side: &str, f: JobFailure) -> Failure {
    let message = if side.is_empty() {
        f.message
    } else {
        format!("side {side}: {}", f.message)
    };
    Failure {
        class: f.class,
        message,
    }
}

/// A side ready for its rounds: compiled (the pool's result waited for),
/// checked against the reference, warmed up.
fn ready(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    track: &str,
    kernel: &str,
    kind: MethodKind,
    m: &mut Measured,
) -> Result<(), JobFailure> {
    lane::wait_for_compile(ctx, backend, track, m)?;
    lane::prepare(ctx, backend, kernel, kind, m, None, None, false).map(|_| ())
}

/// Round `r` of two sides (`x` is A, `y` the other): `y` first in odd
/// rounds. The sides take turns sample by sample in one batch where the
/// A/B asks for it and the backend can (`Backend::sample_turns`); else
/// each takes a round of the finalists' re-timing (a check that reuses
/// its verdict, a warm-up, a batch). Returns the round and each side's
/// batch, or `None` where a side's batch is missing (its call failed).
#[allow(clippy::too_many_arguments)]
fn rounds(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    track: &str,
    group: &Group,
    sides: &mut [Measured],
    (x, y): (usize, usize),
    r: u32,
    mode: crate::backend::SampleMode,
    count: u32,
) -> Option<(AbRound, Sampling, Sampling)> {
    let y_first = r % 2 == 1;
    let order = if y_first { [y, x] } else { [x, y] };
    let interleave = ctx.ab.map(|t| t.interleave).unwrap_or_default();
    let turned = match interleave {
        Interleave::Samples => take_turns(ctx, backend, track, group, sides, order, mode, count),
        Interleave::Batches => Turned::Cannot,
    };
    let (turns, mut got) = match turned {
        Turned::Took(got) => (true, got),
        Turned::Lost => return None,
        Turned::Cannot => (
            false,
            lane::retime_round(
                ctx,
                backend,
                &group.kernel,
                group.kind,
                sides,
                &order,
                mode,
                count,
                track,
            ),
        ),
    };
    let mut take = |i: usize| {
        got.iter()
            .position(|(j, _)| *j == i)
            .map(|p| got.swap_remove(p).1)
    };
    let (a, b) = (take(x)?, take(y)?);
    let median = |s: &Sampling| measure::quantile(&measure::sorted(&s.samples_us), 0.5);
    let round = AbRound {
        b_first: y_first,
        a_us: median(&a),
        b_us: median(&b),
        a_clock_mhz: a.clocks_mhz.first().copied(),
        b_clock_mhz: b.clocks_mhz.first().copied(),
        turns,
    };
    (round.a_us > 0.0 && round.b_us > 0.0).then_some((round, a, b))
}

/// What became of a round the sides were to take in turns.
enum Turned {
    /// Each side's batch, by side.
    Took(Vec<(usize, Sampling)>),
    /// The call failed: the round is lost (the sides are made ready again
    /// for the next, in case their worker lost them).
    Lost,
    /// The backend cannot take turns: the round takes a batch a side.
    Cannot,
}

/// The sides of `order` warmed up and timed in one batch, taking turns
/// sample by sample. They are prepared already (checked before the
/// rounds), so no check comes first; a warm-up as a re-timing's.
#[allow(clippy::too_many_arguments)]
fn take_turns(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    track: &str,
    group: &Group,
    sides: &mut [Measured],
    order: [usize; 2],
    mode: crate::backend::SampleMode,
    count: u32,
) -> Turned {
    let ids: Vec<&str> = order.iter().map(|&i| sides[i].job.id.as_str()).collect();
    let warmup = (ctx.protocol.warmup_launches, lane::retime_warmup_ms(ctx));
    let started = Instant::now();
    match backend.sample_turns(&ids, warmup, count, mode) {
        Ok(None) => Turned::Cannot,
        Ok(Some(batches)) => {
            let wall_ms = started.elapsed().as_secs_f64() * 1e3 / batches.len() as f64;
            Turned::Took(
                order
                    .iter()
                    .zip(batches)
                    .map(|(&i, batch)| {
                        let sampling = Sampling {
                            clocks_mhz: batch.sm_clock_mhz.into_iter().collect(),
                            samples_us: batch.us,
                            wall_ms,
                            timer: Some(batch.timer),
                        };
                        (i, sampling)
                    })
                    .collect(),
            )
        }
        Err(f) => {
            crate::trace::span(
                track,
                "turns lost",
                started,
                serde_json::json!({"why": f.message}),
            );
            for &i in &order {
                if ready(
                    ctx,
                    backend,
                    track,
                    &group.kernel,
                    group.kind,
                    &mut sides[i],
                )
                .is_err()
                {
                    break;
                }
            }
            Turned::Lost
        }
    }
}

/// A round's batch into a side's pooled samples.
fn pool(into: &mut Sampling, batch: Sampling) {
    into.samples_us.extend(batch.samples_us);
    into.clocks_mhz.extend(batch.clocks_mhz);
    into.wall_ms += batch.wall_ms;
    into.timer = batch.timer.or(into.timer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{SampleBatch, SampleMode};
    use crate::manifest::{Tolerance, ToleranceFor};
    use crate::measure::Timer;
    use crate::plan::RunMode;
    use crate::search::Strategies;
    use crate::store::CheckResult;
    use indexmap::IndexMap;
    use serde_json::json;
    use std::collections::HashMap;

    /// A config's time is its `us`, plus the job's planted spin, and with
    /// `wobble` (a fraction) that much above and below it on alternate
    /// batches of the lane (as a power-capped GPU's clock moves from one
    /// batch to the next); a config with `fails` fails its check. Logs
    /// each check and sample by job id. With `turns`, it takes turns
    /// (`sample_turns`): the jobs of one batch meet the same wobble; the
    /// `turns_fail`-th call fails (its jobs lost, as by a restarted worker).
    #[derive(Default)]
    struct Fake {
        prepared: HashMap<String, Job>,
        log: Vec<String>,
        batches: usize,
        turns: bool,
        turns_calls: usize,
        turns_fail: Option<usize>,
    }

    impl Fake {
        fn time_of(&self, id: &str, nth: usize) -> f64 {
            let job = &self.prepared[id];
            let wobble = job
                .config
                .get("wobble")
                .and_then(|w| w.as_f64())
                .unwrap_or(0.0);
            let sign = if nth % 2 == 0 { 1.0 } else { -1.0 };
            (job.config["us"].as_f64().unwrap() + job.variant.as_ref().map_or(0.0, |v| v.plant_us))
                * (1.0 + sign * wobble)
        }
    }

    impl Backend for Fake {
        fn describe(
            &mut self,
            _: &serde_json::Value,
            _: u64,
        ) -> Result<crate::backend::ShapeFacts, JobFailure> {
            Ok(Default::default())
        }
        fn compile(&mut self, _: &Job, _: &str, _: &str) -> Result<f64, JobFailure> {
            Ok(0.0)
        }
        fn check(
            &mut self,
            job: &Job,
            _: &str,
            _: &str,
            _: ToleranceFor,
            _: u64,
        ) -> Result<CheckResult, JobFailure> {
            self.log.push(format!("check {}", job.id));
            if job.config.contains_key("fails") {
                return Ok(CheckResult {
                    passed: false,
                    elements: 1,
                    mismatch_frac: 1.0,
                    ..Default::default()
                });
            }
            self.prepared.insert(job.id.clone(), job.clone());
            Ok(CheckResult {
                passed: true,
                elements: 1,
                ..Default::default()
            })
        }
        fn warmup(&mut self, _: &str, _: u32, _: f64) -> Result<(), JobFailure> {
            Ok(())
        }
        fn sample(
            &mut self,
            id: &str,
            count: u32,
            _: SampleMode,
        ) -> Result<SampleBatch, JobFailure> {
            self.log.push(format!("sample {id}"));
            self.batches += 1;
            Ok(batch_at(self.time_of(id, self.batches), count))
        }
        fn sample_turns(
            &mut self,
            ids: &[&str],
            _: (u32, f64),
            count: u32,
            _: SampleMode,
        ) -> Result<Option<Vec<SampleBatch>>, JobFailure> {
            if !self.turns {
                return Ok(None);
            }
            self.turns_calls += 1;
            self.log.push(format!("turns {}", ids.join(",")));
            if self.turns_fail == Some(self.turns_calls) {
                self.prepared.clear();
                return Err(JobFailure::new(FailureClass::Crash, "the worker went away"));
            }
            self.batches += 1;
            Ok(Some(
                ids.iter()
                    .map(|id| batch_at(self.time_of(id, self.batches), count))
                    .collect(),
            ))
        }
    }

    fn batch_at(us: f64, count: u32) -> SampleBatch {
        SampleBatch {
            us: (0..count)
                .map(|k| us * (1.0 + 0.001 * (k % 3) as f64))
                .collect(),
            timer: Timer::CudaEvent,
            sm_clock_mhz: Some(1980.0),
        }
    }

    fn job(id: &str, config: serde_json::Value) -> Job {
        Job {
            id: id.into(),
            shape_index: 0,
            method: "m".into(),
            shape: serde_json::from_value(json!({"M": 1})).unwrap(),
            config: serde_json::from_value(config).unwrap(),
            baseline: false,
            variant: None,
        }
    }

    /// Runs one pair, A at 100 µs, B as `b` says, with `plant`, a batch a
    /// side; returns its record and the backend's log.
    fn pair(b: serde_json::Value, plant: f64) -> (AbPair, Vec<String>) {
        pair_on(
            Fake::default(),
            Interleave::Batches,
            json!({"us": 100.0}),
            b,
            plant,
        )
    }

    /// Runs one pair on `backend`, A and B as `a` and `b` say.
    fn pair_on(
        mut backend: Fake,
        interleave: Interleave,
        a: serde_json::Value,
        b: serde_json::Value,
        plant: f64,
    ) -> (AbPair, Vec<String>) {
        let strategies = Strategies::single(Box::new(crate::search::Grid));
        let prior = HashMap::new();
        let timing = AbTiming {
            setup: "s".into(),
            aa_rounds: 2,
            rounds: 4,
            batch: 4,
            extra_rounds: 3,
            threshold: 0.01,
            plant,
            interleave,
        };
        let peak = |_: Option<&str>| 1000.0;
        let mut protocol = crate::manifest::default_protocol();
        protocol.batch = 4;
        let ctx = LaneContext {
            protocol,
            tolerance: Tolerance {
                atol: 0.0,
                rtol: 0.0,
                max_mismatch: 0.0,
                per_dtype: IndexMap::new(),
            },
            strategies: &strategies,
            run_mode: RunMode::Ab,
            sampling: SampleMode::PLAIN,
            peak_gbs: 1000.0,
            peak_tflops: &peak,
            compile: None,
            lane: 0,
            prior: &prior,
            health: None,
            ab: Some(&timing),
        };
        let group = Group {
            shape: serde_json::from_value(json!({"M": 1})).unwrap(),
            method: "m".into(),
            kernel: "k".into(),
            kind: MethodKind::Triton,
            jobs: vec![job("a", a.clone()), job("a2", a), job("b", b)],
            unavailable: None,
        };
        let mut records = Vec::new();
        let rest = lane::run_group(&ctx, &mut backend, group, &mut |e| match e {
            Event::AbPair(p) => records.push(*p),
            _ => unreachable!("an A/B lane records pairs only"),
        });
        assert!(rest.is_none());
        assert_eq!(records.len(), 1, "one record a pair");
        (records.remove(0), backend.log)
    }

    #[test]
    fn a_pair_is_a_a_rounds_then_a_b_rounds_in_alternating_order() {
        let (p, log) = pair(json!({"us": 100.0}), 0.0);
        assert!(p.failure.is_none(), "{:?}", p.failure);
        assert_eq!((p.aa.len(), p.rounds.len(), p.lost_rounds), (2, 4, 0));
        let firsts: Vec<bool> = p.rounds.iter().map(|r| r.b_first).collect();
        assert_eq!(firsts, [false, true, false, true], "A B, B A, A B, B A");
        assert!(p.rounds.iter().all(|r| (r.log_ratio()).abs() < 1e-12));
        assert_eq!(
            (
                p.a.job_id.as_str(),
                p.b.job_id.as_str(),
                p.aa_job_id.as_str()
            ),
            ("a", "b", "a2")
        );
        assert!(p.a.check.as_ref().is_some_and(|c| c.passed));
        // B is checked only after the A/A rounds (its plant is sized by them).
        let b_check = log.iter().position(|l| l == "check b").unwrap();
        let a2_samples = log.iter().filter(|l| *l == "sample a2").count();
        assert_eq!(a2_samples, 2);
        assert!(log[..b_check].iter().filter(|l| *l == "sample a2").count() == 2);
        // Every side's samples of the A/B rounds are pooled.
        assert_eq!(p.a_stats.as_ref().unwrap().n, 16);
        assert_eq!(p.b_stats.as_ref().unwrap().n, 16);
    }

    #[test]
    fn sides_that_take_turns_share_the_clock_a_batch_each_does_not() {
        // Every batch 2 % off either way, as a power-capped GPU's clock
        // moves; B 1.5 % slower. A batch a side: the wobble lands on one
        // side at a time and the verdict stays AMBIGUOUS (extra rounds
        // run). Taking turns: both sides meet each batch's wobble, and the
        // four rounds read 1.015 exactly.
        let noisy = json!({"us": 100.0, "wobble": 0.02});
        let slower = json!({"us": 101.5, "wobble": 0.02});
        let batches = Fake::default();
        let (p, _) = pair_on(
            batches,
            Interleave::Samples,
            noisy.clone(),
            slower.clone(),
            0.0,
        );
        assert!(
            p.rounds.iter().all(|r| !r.turns),
            "no sample_turns: a batch a side"
        );
        assert_eq!(p.extra_rounds, 3);
        let turns = Fake {
            turns: true,
            ..Default::default()
        };
        let (p, log) = pair_on(turns, Interleave::Samples, noisy, slower, 0.0);
        assert!(p.failure.is_none(), "{:?}", p.failure);
        assert!(p.aa.iter().chain(&p.rounds).all(|r| r.turns));
        assert_eq!((p.rounds.len(), p.extra_rounds, p.lost_rounds), (4, 0, 0));
        for r in &p.rounds {
            assert!((r.b_us / r.a_us - 1.015).abs() < 1e-9, "{r:?}");
        }
        // A/A rounds A with its copy, then A with B, the order alternating;
        // no sample calls, and B checked after the A/A rounds.
        let turned: Vec<&str> = log
            .iter()
            .filter(|l| l.starts_with("turns"))
            .map(String::as_str)
            .collect();
        assert_eq!(
            turned,
            [
                "turns a,a2",
                "turns a2,a",
                "turns a,b",
                "turns b,a",
                "turns a,b",
                "turns b,a"
            ]
        );
        assert!(!log.iter().any(|l| l.starts_with("sample")));
        let b_check = log.iter().position(|l| l == "check b").unwrap();
        assert_eq!(log[b_check + 1], "turns a,b");
    }

    #[test]
    fn a_failed_turn_loses_its_round_and_the_sides_are_checked_again() {
        let turns = Fake {
            turns: true,
            turns_fail: Some(3),
            ..Default::default()
        };
        let (p, log) = pair_on(
            turns,
            Interleave::Samples,
            json!({"us": 100.0}),
            json!({"us": 100.0}),
            0.0,
        );
        assert!(p.failure.is_none(), "{:?}", p.failure);
        assert_eq!((p.aa.len(), p.rounds.len(), p.lost_rounds), (2, 3, 1));
        let lost = log.iter().position(|l| l == "turns a,b").unwrap();
        assert_eq!(log[lost + 1..lost + 4], ["check a", "check b", "turns b,a"]);
    }

    #[test]
    fn a_planted_slowdown_is_sized_from_a_in_the_a_a_rounds() {
        let (p, _) = pair(json!({"us": 100.0}), 0.10);
        // A's median in the A/A rounds is 100.1 µs (samples 100, 100.1, 100.2, 100).
        assert!((p.plant_us - 10.01).abs() < 0.01, "{}", p.plant_us);
        let ratio = (p.rounds.iter().map(|r| r.log_ratio()).sum::<f64>() / 4.0).exp();
        assert!((ratio - 1.1).abs() < 0.002, "{ratio}");
    }

    #[test]
    fn only_a_pair_left_ambiguous_takes_the_extra_rounds_once() {
        // B 1.5 % slower, each batch 2 % off either way: four rounds leave
        // the interval across the 1 % margin, so three more run, once.
        let (p, _) = pair(json!({"us": 101.5, "wobble": 0.02}), 0.0);
        assert_eq!((p.rounds.len(), p.extra_rounds), (7, 3));
        let firsts: Vec<bool> = p.rounds.iter().map(|r| r.b_first).collect();
        assert_eq!(firsts, [false, true, false, true, false, true, false]);
        // Clearly slower, and the same: decided after four.
        for b in [json!({"us": 110.0}), json!({"us": 100.0})] {
            let (p, _) = pair(b, 0.0);
            assert_eq!((p.rounds.len(), p.extra_rounds), (4, 0));
        }
    }

    #[test]
    fn a_side_that_fails_its_check_leaves_the_pair_without_rounds() {
        let (p, _) = pair(json!({"us": 100.0, "fails": true}), 0.0);
        let f = p.failure.expect("a failure");
        assert!(f.message.starts_with("side B:"), "{}", f.message);
        assert!(p.rounds.is_empty() && p.b_stats.is_none());
        assert_eq!(p.aa.len(), 2, "the A/A rounds ran before B's check");
    }
}
