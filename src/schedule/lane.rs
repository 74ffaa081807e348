//! One GPU lane: a backend that owns one device, taking (shape, method)
//! groups and turning every job into a record. Timed work on a device never
//! overlaps, because one lane owns it.
//!
//! A lane does not know which search strategy it runs: it hands the group's
//! candidates to the strategy with itself as the [`Trials`], and the
//! strategy asks for checks, screening batches and full measurements.
//!
//! This file holds the lane itself (its context, a group run to its end, the
//! [`Trials`] a strategy runs against, and each job's record); the rest lives
//! in `lane/`, one concern a file:
//! - `measured`: one job's path through the lane, waited for: its compile,
//!   its check, warm-up and batches, and its full measurement or screening;
//! - `ahead`: requests sent ahead to a backend that can take them, so the
//!   worker goes from one candidate to the next without waiting for the lane;
//! - `retime`: the finalists' interleaved re-timing after a group;
//! - `health`: the retirement rule for a lane whose GPU or worker fails;
//! - `tests`: the lane against fake backends.

mod ahead;
mod health;
mod measured;
mod retime;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::Instant;

use indexmap::IndexMap;

use crate::backend::{Backend, JobFailure, SampleMode};
use crate::manifest::{shape_dtype, MethodKind, Shape, Tolerance};
use crate::measure::{self, Protocol, Sampling, Stats, StopRule};
use crate::plan::{Job, RunMode};
use crate::search::{Candidate, Grid, PriorObservation, Strategies, Strategy, Trials};
use crate::store::{FailureClass, JobRecord, JobStatus};

use super::compile::CompileBoard;
use super::{now_rfc3339, Event, Group};

use ahead::Ask;
pub use health::{Health, HealthWatch, JobRef, RETIRE_AFTER};
use measured::FirstBatches;
pub(super) use measured::{prepare, retime_warmup_ms, wait_for_compile};
pub use retime::retime_count;
use retime::retime_finalists;
pub(super) use retime::retime_round;

pub struct LaneContext<'a> {
    pub protocol: Protocol,
    pub tolerance: Tolerance,
    /// Each method's search strategy.
    pub strategies: &'a Strategies,
    pub run_mode: RunMode,
    /// How the run's own samples are taken.
    pub sampling: SampleMode,
    pub peak_gbs: f64,
    pub peak_tflops: &'a (dyn Fn(Option<&str>) -> f64 + Sync),
    pub compile: Option<&'a CompileBoard>,
    pub lane: u32,
    /// What earlier runs measured, by [`group_key`], for a strategy that
    /// learns from them (a resumed surrogate search).
    pub prior: &'a HashMap<String, Vec<PriorObservation>>,
    /// Watches for a faulty GPU or a worker that keeps dying; none: never retire.
    pub health: Option<HealthWatch<'a>>,
    /// An A/B run's rounds (`RunMode::Ab`).
    pub ab: Option<&'a super::ab::AbTiming>,
}

impl LaneContext<'_> {
    pub(super) fn retired(&self) -> bool {
        self.health
            .as_ref()
            .is_some_and(|h| h.state.borrow().retired.is_some())
    }

    /// Interrupted, or this lane retired: stop taking jobs.
    pub(super) fn stopping(&self) -> bool {
        super::interrupted() || self.retired()
    }
}

/// What an earlier run measured, by group: every measured or failed
/// non-baseline job of `records` (the current ones: superseded jobs timed
/// another version of their method).
pub fn prior_observations<'a>(
    records: impl Iterator<Item = &'a JobRecord>,
) -> HashMap<String, Vec<PriorObservation>> {
    let mut map: HashMap<String, Vec<PriorObservation>> = HashMap::new();
    for r in records.filter(|r| !r.baseline) {
        let ln_median_us = match (r.status, &r.stats) {
            (JobStatus::Ok, Some(st)) if st.median_us.is_finite() && st.median_us > 0.0 => {
                Some(st.median_us.ln())
            }
            (JobStatus::Failed, _) => None,
            _ => continue,
        };
        map.entry(group_key(&r.method, &r.shape))
            .or_default()
            .push(PriorObservation {
                config: r.config.clone(),
                ln_median_us,
            });
    }
    map
}

/// The (method, shape) a job belongs to, as a map key.
pub fn group_key(method: &str, shape: &Shape) -> String {
    format!(
        "{method}\u{1}{}",
        serde_json::to_string(shape).expect("shape serialises")
    )
}

/// A job's progress through the lane before it becomes a record.
pub(super) struct Measured {
    pub(super) job: Job,
    pub(super) sampling: Sampling,
    pub(super) check: Option<crate::store::CheckResult>,
    compile_s: Option<f64>,
    /// What the compiler made of the job's kernels, from its check.
    pub(super) kernels: Vec<crate::store::KernelResources>,
    started: Instant,
    /// When its full measurement has enough samples: the protocol's rule,
    /// with racing's threshold as it stood when the measurement began (the
    /// worker that takes its batches is given the same rule).
    rule: StopRule,
}

impl Measured {
    pub(super) fn new(job: Job, rule: StopRule) -> Measured {
        Measured {
            job,
            sampling: Sampling::default(),
            check: None,
            compile_s: None,
            kernels: Vec::new(),
            started: Instant::now(),
            rule,
        }
    }

    fn median(&self) -> f64 {
        measure::quantile(&measure::sorted(&self.sampling.samples_us), 0.5)
    }
}

/// Where a candidate of the group stands.
enum Slot {
    /// Not started.
    Waiting(Box<Job>),
    /// Checked and screened (halving), not yet recorded.
    Screened(Box<Measured>),
    /// Recorded.
    Done,
}

/// Runs a group to its end. Returns the jobs left unrecorded when the lane
/// retired during the group, as a group of their own; `None` otherwise.
pub fn run_group(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    group: Group,
    emit: &mut dyn FnMut(Event),
) -> Option<Group> {
    if ctx.run_mode == RunMode::Ab {
        return super::ab::run_pair(ctx, backend, group, emit);
    }
    let group_started = Instant::now();
    let track = format!("lane{} jobs", ctx.lane);
    let group_args = serde_json::json!({
        "shape": group.shape, "method": group.method, "jobs": group.jobs.len(),
    });
    let shape = serde_json::to_value(&group.shape).expect("shape");
    let facts = backend
        .describe(&shape, ctx.protocol.seed)
        .unwrap_or_default();

    let (flops, bytes) = (facts.flops, facts.bytes);
    let prior = ctx
        .prior
        .get(&group_key(&group.method, &group.shape))
        .map_or(&[][..], Vec::as_slice);
    let jobs: Vec<Job> = group.jobs;
    let configs: Vec<IndexMap<String, serde_json::Value>> =
        jobs.iter().map(|j| j.config.clone()).collect();
    let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
    let candidates: Vec<Candidate<'_>> = jobs
        .iter()
        .zip(&configs)
        .zip(&ids)
        .map(|((j, config), id)| Candidate {
            id,
            config,
            baseline: j.baseline,
        })
        .collect();
    let mut lane = Lane {
        ctx,
        backend,
        kernel: group.kernel,
        kind: group.kind,
        flops,
        bytes,
        slots: jobs
            .into_iter()
            .map(|j| Slot::Waiting(Box::new(j)))
            .collect(),
        measured: Vec::new(),
        best_us: None,
        prior,
        track: &track,
        emit,
    };
    if let Some(why) = group
        .unavailable
        .as_ref()
        .or(facts.unavailable.get(&lane.kernel))
    {
        // The method cannot run here: every job is recorded as skipped,
        // with the reason, and runs again on a later resume.
        lane.skip_all(why);
    } else if !ctx.stopping() {
        lane.backend
            .begin_group(&group.method, &group.shape, ctx.protocol.seed);
    }
    match ctx.run_mode {
        _ if lane.slots.iter().all(|s| matches!(s, Slot::Done)) => {}
        RunMode::Check => lane.check_all(),
        RunMode::Bench => Grid.search(&candidates, &mut lane),
        RunMode::Tune => ctx
            .strategies
            .for_method(&group.method)
            .search(&candidates, &mut lane),
        RunMode::Ab => unreachable!("an A/B pair runs in ab::run_pair"),
    }
    let Lane {
        backend,
        measured,
        emit,
        kernel,
        kind,
        slots,
        ..
    } = lane;
    if ctx.retired() {
        crate::trace::span(&track, "group", group_started, group_args);
        let jobs: Vec<Job> = slots
            .into_iter()
            .filter_map(|s| match s {
                Slot::Waiting(job) => Some(*job),
                Slot::Screened(m) => Some(m.job),
                Slot::Done => None,
            })
            .collect();
        return Some(Group {
            shape: group.shape,
            method: group.method,
            kernel,
            kind,
            jobs,
            unavailable: group.unavailable,
        });
    }
    if ctx.run_mode == RunMode::Tune
        && measured.len() >= 2
        && ctx.protocol.finalists >= 2
        && !ctx.stopping()
    {
        retime_finalists(ctx, backend, &kernel, kind, measured, &track, emit);
    }
    crate::trace::span(&track, "group", group_started, group_args);
    None
}

/// A group in a lane: the [`Trials`] a strategy runs against.
struct Lane<'l, 'c> {
    ctx: &'l LaneContext<'c>,
    backend: &'l mut dyn Backend,
    kernel: String,
    kind: MethodKind,
    flops: Option<f64>,
    bytes: Option<f64>,
    slots: Vec<Slot>,
    /// Measured fully and recorded ok: the finalists are chosen among these.
    measured: Vec<Measured>,
    /// The best median among `measured`: what racing measures against.
    best_us: Option<f64>,
    prior: &'l [PriorObservation],
    track: &'l str,
    emit: &'l mut dyn FnMut(Event),
}

impl Lane<'_, '_> {
    /// The candidate's progress so far, taking it out of its slot: its
    /// screening, or a fresh start (`true` when it has not been compiled,
    /// checked or sampled yet).
    fn take(&mut self, i: usize) -> (Measured, bool) {
        match std::mem::replace(&mut self.slots[i], Slot::Done) {
            Slot::Waiting(job) => (Measured::new(*job, self.ctx.protocol.stop_rule()), true),
            Slot::Screened(m) => (*m, false),
            Slot::Done => panic!("candidate {i} was already recorded"),
        }
    }

    /// Every job ends as exactly one record, sent to the journal's writer.
    fn finish(
        &mut self,
        m: &Measured,
        status: JobStatus,
        failure: Option<JobFailure>,
        stats: Option<Stats>,
    ) {
        let class = failure.as_ref().map(|f| f.class);
        let record = self.record(m, status, failure, stats);
        (self.emit)(Event::Job(Box::new(record)));
        self.watch(m, status, class);
    }

    fn record(
        &self,
        m: &Measured,
        status: JobStatus,
        failure: Option<JobFailure>,
        stats: Option<Stats>,
    ) -> JobRecord {
        let ctx = self.ctx;
        let (flops, bytes) = (self.flops, self.bytes);
        let time_s = stats
            .as_ref()
            .map(|s| s.median_us * 1e-6)
            .filter(|t| *t > 0.0);
        let peak_flops = (ctx.peak_tflops)(shape_dtype(&m.job.shape)) * 1e12;
        let tflops = flops.zip(time_s).map(|(f, t)| f / t / 1e12);
        let gbs = bytes.zip(time_s).map(|(b, t)| b / t / 1e9);
        let roofline_pct = match (flops, bytes, time_s) {
            (Some(f), Some(b), Some(t)) if peak_flops > 0.0 && ctx.peak_gbs > 0.0 => {
                Some((f / peak_flops).max(b / (ctx.peak_gbs * 1e9)) / t * 100.0)
            }
            _ => None,
        };
        JobRecord {
            job_id: m.job.id.clone(),
            method: m.job.method.clone(),
            kind: self.kind,
            kernel: self.kernel.clone(),
            shape: m.job.shape.clone(),
            config: m.job.config.clone(),
            baseline: m.job.baseline,
            status,
            failure: failure.map(|f| crate::store::Failure {
                class: f.class,
                message: f.message,
            }),
            check: m.check.clone(),
            stats,
            flops,
            bytes,
            tflops,
            gbs,
            roofline_pct,
            compile_s: m.compile_s,
            kernels: m.kernels.clone(),
            duration_s: m.started.elapsed().as_secs_f64(),
            lane: ctx.lane,
            finished_at: now_rfc3339(),
        }
    }

    /// Every job recorded as skipped because the method cannot run here.
    fn skip_all(&mut self, why: &str) {
        for i in 0..self.slots.len() {
            let (m, _) = self.take(i);
            if let Some(board) = self.ctx.compile {
                board.cancel(&m.job.id);
            }
            let failure = JobFailure::new(FailureClass::Unavailable, why);
            self.finish(&m, JobStatus::Skipped, Some(failure), None);
        }
    }

    /// `--mode check`: every job checked once, none timed.
    fn check_all(&mut self) {
        for i in 0..self.slots.len() {
            if self.ctx.stopping() {
                return;
            }
            let (mut m, _) = self.take(i);
            let result = self
                .wait_for_compile(&mut m)
                .and_then(|_| self.prepare(&mut m, FirstBatches::None));
            match result {
                Ok(_) => self.finish(&m, JobStatus::Checked, None, None),
                Err(f) => self.finish(&m, JobStatus::Failed, Some(f), None),
            }
        }
    }

    /// Lets the backend see the jobs after candidate `i` (in the group's
    /// order, wrapping round) that the compile pool has compiled.
    fn look_ahead(&mut self, job: &Job, i: usize) {
        let Lane {
            backend,
            slots,
            ctx,
            ..
        } = self;
        let mut ahead = |n: usize| -> Vec<Job> {
            // Without a pool the lane compiles each job itself, at its turn.
            let Some(board) = ctx.compile else {
                return Vec::new();
            };
            let waiting = slots[i + 1..]
                .iter()
                .chain(&slots[..i])
                .filter_map(|s| match s {
                    Slot::Waiting(j) => Some(&**j),
                    _ => None,
                });
            board.compiled(waiting, n)
        };
        backend.look_ahead(job, &mut ahead);
    }
}

impl Trials for Lane<'_, '_> {
    fn measure(&mut self, i: usize) -> Option<f64> {
        let (mut m, fresh) = self.take(i);
        self.start_measurement(&mut m);
        if fresh {
            if let Err(f) = self.wait_for_compile(&mut m) {
                self.finish(&m, JobStatus::Failed, Some(f), None);
                return None;
            }
        }
        self.look_ahead(&m.job, i);
        self.measure_now(m)
    }

    fn measure_each(&mut self, order: &[usize]) -> Vec<(usize, f64)> {
        let passed = self.ask_each(order, Ask::Measure);
        order
            .iter()
            .filter_map(|i| passed.get(i).map(|median| (*i, *median)))
            .collect()
    }

    fn screen(&mut self, i: usize, batches: usize) -> Option<f64> {
        let (mut m, fresh) = self.take(i);
        if fresh {
            if let Err(f) = self.wait_for_compile(&mut m) {
                self.finish(&m, JobStatus::Failed, Some(f), None);
                return None;
            }
        }
        self.look_ahead(&m.job, i);
        self.screen_now(i, m, batches)
    }

    fn screen_each(&mut self, order: &[usize], batches: usize) -> Vec<(usize, f64)> {
        let passed = self.ask_each(order, Ask::Screen(batches));
        order
            .iter()
            .filter_map(|i| passed.get(i).map(|median| (*i, *median)))
            .collect()
    }

    fn prune(&mut self, i: usize) {
        let (m, fresh) = self.take(i);
        assert!(!fresh, "candidate {i} was pruned without being screened");
        let stats = m.sampling.stats();
        self.finish(&m, JobStatus::Pruned, None, Some(stats));
    }

    fn skip(&mut self, i: usize) {
        let (m, _) = self.take(i);
        if let Some(board) = self.ctx.compile {
            board.cancel(&m.job.id);
        }
        self.finish(&m, JobStatus::Skipped, None, None);
    }

    fn interrupted(&self) -> bool {
        self.ctx.stopping()
    }

    fn prior(&self) -> &[PriorObservation] {
        self.prior
    }
}
