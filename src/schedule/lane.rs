//! One GPU lane: a backend that owns one device, taking (shape, method)
//! groups and turning every job into a record. Timed work on a device never
//! overlaps, because one lane owns it.
//!
//! A lane does not know which search strategy it runs: it hands the group's
//! candidates to the strategy with itself as the [`Trials`], and the
//! strategy asks for checks, screening batches and full measurements.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indexmap::IndexMap;

use crate::backend::{
    Backend, Checked, FirstBatch, JobFailure, Received, SampleBatch, SampleMode, SentAhead,
};
use crate::manifest::{shape_dtype, MethodKind, Shape, Tolerance};
use crate::measure::{self, Decision, Protocol, Sampling, Stats, StopRule, Timing};
use crate::plan::{Job, RunMode};
use crate::search::{Candidate, Grid, PriorObservation, Strategies, Strategy, Trials};
use crate::store::{FailureClass, FinalRecord, JobRecord, JobStatus};

use super::compile::CompileBoard;
use super::{now_rfc3339, Event, Group};

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

/// Consecutive crash or launch_error failures after which a lane checks its
/// own health (docs/scaling.md).
pub const RETIRE_AFTER: usize = 3;

/// An answer to a request sent ahead, read into the job: how many batches
/// came, or its failure; `None` where the request was lost with its worker.
type AnswerRead = Option<Result<usize, JobFailure>>;

/// Requests a lane keeps sent ahead to a backend that can take them
/// (`Backend::send_measurement`): the one the worker runs and the next,
/// waiting in its pipe, so the worker starts it the moment it answers.
const UNDER_WAY: usize = 2;

/// What a candidate's request asks for: its full measurement, or a set
/// number of screening batches (halving).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    Measure,
    Screen(usize),
}

/// A request sent ahead: the candidate and its progress (screening adds to
/// what earlier rounds took).
struct SentJob {
    i: usize,
    m: Measured,
}

/// A candidate whose request sent ahead must be made again, waited for,
/// once nothing is under way: lost with its worker, answered with no
/// batches, or (screening) with fewer batches than asked (a wall cap
/// stopped the worker); `ask` is what is still to take.
struct Again {
    i: usize,
    m: Measured,
    ask: Ask,
}

/// A job and what runs it: enough to run its check again.
#[derive(Debug, Clone)]
pub struct JobRef {
    pub job: Job,
    pub kernel: String,
    pub kind: MethodKind,
}

/// One lane's health, across the groups it runs.
#[derive(Debug, Default)]
pub struct Health {
    /// The consecutive crash / launch_error failures, latest last.
    pub streak: Vec<JobRef>,
    /// Why the lane is retired, once it is.
    pub retired: Option<String>,
}

/// The retirement rule's state for one lane. A lane whose jobs fail
/// [`RETIRE_AFTER`] times in a row with `crash` or `launch_error` (any other
/// result of a job its worker ran resets the count; skipped jobs and
/// timeouts leave it as it is) checks its health: it runs the check of the
/// last job that passed on any lane. If that passes, the failures were the
/// kernels' and the lane goes on; if it fails, the GPU or its worker is at
/// fault and the lane asks to retire, which is granted unless it is the last
/// lane. A retired lane stops at once; its unfinished jobs, and the failures
/// that led to it, run again on the other lanes.
pub struct HealthWatch<'a> {
    pub state: RefCell<Health>,
    /// The last job that passed its check on any lane.
    pub last_good: &'a Mutex<Option<JobRef>>,
    /// Asks to retire this lane; false for the last lane.
    pub retire: &'a (dyn Fn() -> bool + Sync),
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

    /// The retirement rule (see [`HealthWatch`]), after each record.
    fn watch(&mut self, m: &Measured, status: JobStatus, class: Option<FailureClass>) {
        let Some(health) = &self.ctx.health else {
            return;
        };
        let this = || JobRef {
            job: m.job.clone(),
            kernel: self.kernel.clone(),
            kind: self.kind,
        };
        match (status, class) {
            (JobStatus::Failed, Some(FailureClass::Crash | FailureClass::LaunchError)) => {
                let due = {
                    let mut state = health.state.borrow_mut();
                    state.streak.push(this());
                    state.streak.len() >= RETIRE_AFTER && state.retired.is_none()
                };
                if due {
                    self.health_check();
                }
            }
            (JobStatus::Skipped, _) | (JobStatus::Failed, Some(FailureClass::Timeout)) => {}
            (status, _) => {
                health.state.borrow_mut().streak.clear();
                if matches!(
                    status,
                    JobStatus::Ok | JobStatus::Checked | JobStatus::Pruned
                ) {
                    *health.last_good.lock().expect("last good job") = Some(this());
                }
            }
        }
    }

    /// Runs the check of the last job that passed on any lane again, on this
    /// lane: it tells a faulty GPU (or worker) from kernels that crash.
    fn health_check(&mut self) {
        let Some(health) = &self.ctx.health else {
            return;
        };
        // Nothing has passed anywhere yet: nothing tells the GPU from the kernels.
        let Some(good) = health.last_good.lock().expect("last good job").clone() else {
            return;
        };
        let started = Instant::now();
        let tol = self.ctx.tolerance.for_dtype(shape_dtype(&good.job.shape));
        let verdict = match self.backend.check(
            &good.job,
            &good.kernel,
            good.kind.as_str(),
            tol,
            self.ctx.protocol.seed,
        ) {
            Ok(c) if c.passed => Ok(()),
            Ok(_) => Err("its output no longer matches the reference".to_string()),
            Err(f) => Err(format!(
                "{}: {}",
                f.class.as_str(),
                f.message.lines().next().unwrap_or("")
            )),
        };
        crate::trace::span(
            self.track,
            "health check",
            started,
            serde_json::json!({"job": good.job.id, "healthy": verdict.is_ok()}),
        );
        let mut state = health.state.borrow_mut();
        match verdict {
            // The failures were the kernels'.
            Ok(()) => state.streak.clear(),
            Err(why) if (health.retire)() => {
                state.retired = Some(format!(
                    "{} consecutive crash/launch_error failures, then job {} (which had passed) failed again on this lane: {why}",
                    state.streak.len(),
                    good.job.id
                ));
            }
            // The last lane goes on, recording what fails.
            Err(_) => state.streak.clear(),
        }
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

    /// The compile pool's result for the job (waiting while it compiles); a job
    /// the pool has not reached is left for `prepare` to compile in the lane.
    fn wait_for_compile(&mut self, m: &mut Measured) -> Result<(), JobFailure> {
        wait_for_compile(self.ctx, self.backend, self.track, m)
    }

    /// Check (fresh inputs, poisoned output, compare) and, unless only
    /// checking, warm up and take the first batch (for a full measurement,
    /// `until` the stopping rule, where the backend can); returns whether it
    /// was taken (the backend may leave it to a call of its own).
    fn prepare(&mut self, m: &mut Measured, first: FirstBatches) -> Result<bool, JobFailure> {
        let (with_first, until) = match first {
            FirstBatches::None => (false, None),
            FirstBatches::One => (true, None),
            // With no wall cap a worker's sampling would have no time bound
            // the call's timeout could be stretched by: the lane drives it.
            FirstBatches::UntilStopped => {
                (true, Some(m.rule).filter(|r| r.max_wall_ms.is_finite()))
            }
        };
        let count = match first {
            FirstBatches::UntilStopped => first_count(self.ctx, &m.rule),
            FirstBatches::None | FirstBatches::One => self.ctx.protocol.batch,
        };
        let first = with_first.then_some((self.ctx.sampling, count));
        prepare(
            self.ctx,
            self.backend,
            &self.kernel,
            self.kind,
            m,
            first,
            until,
            false,
        )
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

    fn take_batch(&mut self, m: &mut Measured) -> Result<(), JobFailure> {
        take_batch(self.ctx, self.backend, m)
    }

    /// A candidate's full measurement, waited for: checked (its compile
    /// done), batches until the stopping rule, recorded.
    fn measure_now(&mut self, mut m: Measured) -> Option<f64> {
        let result = (|| {
            let have_first = self.prepare(&mut m, FirstBatches::UntilStopped)?;
            self.sample_adaptive(&mut m, have_first)
        })();
        self.conclude(m, result)
    }

    /// A full measurement's record: ok with its statistics (`stopped`: what
    /// stopped its sampling), or its failure. Returns the median of one that
    /// passed.
    fn conclude(&mut self, m: Measured, result: Result<Decision, JobFailure>) -> Option<f64> {
        match result {
            Ok(stopped) => {
                let stats = m.sampling.stats_stopped_by(stopped);
                let median = stats.median_us;
                self.finish(&m, JobStatus::Ok, None, Some(stats));
                self.measured.push(m);
                self.best_us = Some(self.best_us.map_or(median, |b| b.min(median)));
                Some(median)
            }
            Err(f) => {
                self.finish(&m, JobStatus::Failed, Some(f), None);
                None
            }
        }
    }

    /// A candidate's request sent ahead, where the backend can: its full
    /// measurement (batches until the stopping rule), or its screening
    /// batches (a rule that only counts samples). Either needs the
    /// protocol's wall cap to bound the call, as `prepare` says.
    fn send_ahead(&mut self, m: &Measured, ask: Ask) -> Result<SentAhead, JobFailure> {
        let ctx = self.ctx;
        let (rule, count) = match ask {
            Ask::Measure => (m.rule, first_count(ctx, &m.rule)),
            Ask::Screen(0) => return Ok(SentAhead::Declined),
            Ask::Screen(batches) => (
                screening_rule(batches, ctx.protocol.batch, ctx.protocol.max_wall_ms),
                ctx.protocol.batch,
            ),
        };
        if ctx.run_mode == RunMode::Check || !rule.max_wall_ms.is_finite() {
            return Ok(SentAhead::Declined);
        }
        let first = first_batch(ctx, ctx.sampling, count, Some(rule));
        let tol = ctx.tolerance.for_dtype(shape_dtype(&m.job.shape));
        self.backend.send_measurement(
            &m.job,
            &self.kernel,
            self.kind.as_str(),
            tol,
            ctx.protocol.seed,
            first,
        )
    }

    /// The answer to the oldest request under way, recorded. After a
    /// failure the answers still under way are taken first (the worker may
    /// be gone with them, and the failure's record may run a health check,
    /// which must find nothing under way), and recorded after it, in order.
    fn receive_one(&mut self, ask: Ask, each: &mut Each) {
        let Some(mut sent) = each.under_way.pop_front() else {
            return;
        };
        let read = read_received(self.ctx, self.backend, &mut sent.m);
        let rest: Vec<(SentJob, AnswerRead)> = if matches!(read, Some(Err(_))) {
            each.under_way
                .drain(..)
                .map(|mut other| {
                    let r = read_received(self.ctx, self.backend, &mut other.m);
                    (other, r)
                })
                .collect()
        } else {
            Vec::new()
        };
        self.record_received(sent, read, ask, each);
        for (other, r) in rest {
            self.record_received(other, r, ask, each);
        }
    }

    /// A request sent ahead, as its answer was read: recorded (a
    /// measurement, or a failure), screened, or left to be made again,
    /// waited for (see [`Again`]).
    fn record_received(&mut self, sent: SentJob, read: AnswerRead, ask: Ask, each: &mut Each) {
        let SentJob { i, m } = sent;
        if let Ask::Screen(batches) = ask {
            match read {
                Some(Err(f)) => {
                    self.finish(&m, JobStatus::Failed, Some(f), None);
                }
                Some(Ok(taken)) => {
                    if taken >= batches {
                        let median = m.median();
                        self.slots[i] = Slot::Screened(Box::new(m));
                        each.passed.insert(i, median);
                    } else {
                        self.ask_again(each, i, m, Ask::Screen(batches - taken));
                    }
                }
                None => self.ask_again(each, i, m, ask),
            }
            return;
        }
        match read {
            // The worker ran the lane's own stopping rule: its decision
            // stands, even where a sample one unit in the last place off
            // would have the lane take one batch more (the next job is
            // already under way, so none can be asked for); the trace
            // counts such disagreements.
            Some(Ok(taken)) if taken > 0 => {
                let decision = m.sampling.decide_by(&m.rule);
                if decision == Decision::Continue {
                    crate::trace::span(
                        self.track,
                        "rule disagreed",
                        Instant::now(),
                        serde_json::json!({"job": m.job.id, "samples": m.sampling.samples_us.len()}),
                    );
                }
                let stopped = match decision {
                    Decision::Continue => Decision::Converged,
                    d => d,
                };
                self.conclude(m, Ok(stopped));
            }
            Some(Err(f)) => {
                self.conclude(m, Err(f));
            }
            None | Some(Ok(_)) => self.ask_again(each, i, m, ask),
        }
    }

    fn receive_all(&mut self, ask: Ask, each: &mut Each) {
        while !each.under_way.is_empty() {
            self.receive_one(ask, each);
        }
    }

    /// A candidate's request made and answered now, waited for.
    fn ask_now(&mut self, i: usize, m: Measured, ask: Ask, each: &mut Each) {
        match ask {
            Ask::Measure => {
                self.measure_now(m);
            }
            Ask::Screen(batches) => {
                if let Some(median) = self.screen_now(i, m, batches) {
                    each.passed.insert(i, median);
                }
            }
        }
    }

    /// Each of `order` asked `ask`, in that order, until the lane stops:
    /// sent ahead where the backend can (two under way, so the worker goes
    /// from one candidate to the next without waiting for the lane),
    /// waited for where not. Returns the medians of the screenings that
    /// passed (none for full measurements, which are recorded).
    fn ask_each(&mut self, order: &[usize], ask: Ask) -> HashMap<usize, f64> {
        let mut each = Each::default();
        let mut pending: Vec<usize> = order.to_vec();
        while !pending.is_empty() {
            if self.ctx.stopping() || self.ctx.retired() {
                break;
            }
            let i = pending.remove(self.next_ready(&pending));
            // The wait for a compile may have outlasted the run (an interrupt).
            if self.ctx.stopping() || self.ctx.retired() {
                break;
            }
            let (mut m, fresh) = self.take(i);
            if ask == Ask::Measure {
                self.start_measurement(&mut m);
            }
            if fresh {
                if let Err(f) = self.wait_for_compile(&mut m) {
                    self.finish(&m, JobStatus::Failed, Some(f), None);
                    continue;
                }
            }
            self.look_ahead(&m.job, i);
            let sent = loop {
                match self.send_ahead(&m, ask) {
                    Ok(SentAhead::WhenIdle) if !each.under_way.is_empty() => {
                        self.receive_all(ask, &mut each);
                        if self.ctx.stopping() || self.ctx.retired() {
                            break None;
                        }
                    }
                    other => break Some(other),
                }
            };
            // A record read meanwhile may have retired the lane (its health
            // check judged the GPU faulty): this candidate is handed back
            // rather than run there.
            let Some(sent) = sent else {
                self.put_back(i, m, ask);
                break;
            };
            match sent {
                Ok(SentAhead::Sent) => each.under_way.push_back(SentJob { i, m }),
                Ok(SentAhead::Declined | SentAhead::WhenIdle) => {
                    self.receive_all(ask, &mut each);
                    if self.ctx.stopping() || self.ctx.retired() {
                        self.put_back(i, m, ask);
                        break;
                    }
                    self.ask_now(i, m, ask, &mut each);
                }
                // Recorded after what is under way, which its record's
                // health check must not find there.
                Err(f) => {
                    self.receive_all(ask, &mut each);
                    self.finish(&m, JobStatus::Failed, Some(f), None);
                }
            }
            while each.under_way.len() >= UNDER_WAY {
                self.receive_one(ask, &mut each);
            }
        }
        self.receive_all(ask, &mut each);
        for Again { i, mut m, ask } in std::mem::take(&mut each.again) {
            if self.ctx.stopping() || self.ctx.retired() {
                self.put_back(i, m, ask);
                continue;
            }
            // Its stand-in (see `ask_again`) goes: the candidate is taken again.
            self.slots[i] = Slot::Done;
            if ask == Ask::Measure {
                m.sampling = Sampling::default();
            }
            self.look_ahead(&m.job, i);
            self.ask_now(i, m, ask, &mut each);
        }
        each.passed
    }

    /// Which of `pending` (candidates in the strategy's order) to ask next:
    /// with a compile pool, the first whose compile has finished, waiting
    /// for one only when none has (`CompileBoard::first_ready`); else the
    /// first. The strategy gets every answer whatever the order.
    fn next_ready(&self, pending: &[usize]) -> usize {
        let Some(board) = self.ctx.compile else {
            return 0;
        };
        let ids: Vec<&str> = pending
            .iter()
            .map(|&i| match &self.slots[i] {
                Slot::Waiting(job) => job.id.as_str(),
                Slot::Screened(m) => m.job.id.as_str(),
                Slot::Done => "",
            })
            .collect();
        let waited = Instant::now();
        let next = board.first_ready(&ids);
        // A wait for the pool, not the runner's time (bench/trace_breakdown.py
        // counts these spans apart); a pick that found one ready is not traced.
        if waited.elapsed() > std::time::Duration::from_micros(100) {
            crate::trace::span(
                self.track,
                "wait for compile",
                waited,
                serde_json::json!({"job": null, "any_of": ids.len()}),
            );
        }
        next
    }

    /// A candidate left unrecorded when the lane stops or retires: the
    /// resumed run, or another lane, takes it (with its screening so far,
    /// where it has one and was being screened).
    fn put_back(&mut self, i: usize, m: Measured, ask: Ask) {
        self.slots[i] = if m.sampling.samples_us.is_empty() || ask == Ask::Measure {
            Slot::Waiting(Box::new(m.job))
        } else {
            Slot::Screened(Box::new(m))
        };
    }

    /// A request to make again once nothing is under way (see [`Again`]).
    /// Its slot holds a stand-in meanwhile, so that `look_ahead` still sees
    /// the job among those to come (its recipe asked for with the others').
    fn ask_again(&mut self, each: &mut Each, i: usize, m: Measured, ask: Ask) {
        self.slots[i] = Slot::Waiting(Box::new(m.job.clone()));
        each.again.push(Again { i, m, ask });
    }

    /// Screening batches of a candidate, waited for: checked, warmed up,
    /// `batches` more batches. Screened with its median so far, or recorded
    /// as failed.
    fn screen_now(&mut self, i: usize, mut m: Measured, batches: usize) -> Option<f64> {
        let result = (|| {
            let first = if batches > 0 {
                FirstBatches::One
            } else {
                FirstBatches::None
            };
            let have_first = self.prepare(&mut m, first)?;
            for _ in usize::from(have_first)..batches {
                self.take_batch(&mut m)?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                let median = m.median();
                self.slots[i] = Slot::Screened(Box::new(m));
                Some(median)
            }
            Err(f) => {
                self.finish(&m, JobStatus::Failed, Some(f), None);
                None
            }
        }
    }

    /// Batches until the job's stopping rule says enough, the first already
    /// taken when `have_first`; returns what stopped it.
    fn sample_adaptive(
        &mut self,
        m: &mut Measured,
        have_first: bool,
    ) -> Result<Decision, JobFailure> {
        if !have_first {
            let count = first_count(self.ctx, &m.rule);
            take_batch_as(self.backend, m, self.ctx.sampling, count)?;
        }
        loop {
            match m.sampling.decide_by(&m.rule) {
                Decision::Continue => self.take_batch(m)?,
                stopped => return Ok(stopped),
            }
        }
    }

    /// A full measurement starts from fresh samples, whatever screening
    /// took, under a stopping rule that races against the best median the
    /// group has recorded so far (`protocol.race`). A baseline is never
    /// raced: every result is compared with it.
    fn start_measurement(&self, m: &mut Measured) {
        m.sampling = Sampling::default();
        m.rule = if m.job.baseline {
            self.ctx.protocol.stop_rule()
        } else {
            self.ctx.protocol.racing_rule(self.best_us)
        };
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

/// The compile pool's result for the job (waiting while it compiles); a job
/// the pool has not reached is left for `prepare` to compile in the lane.
pub(super) fn wait_for_compile(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    track: &str,
    m: &mut Measured,
) -> Result<(), JobFailure> {
    let Some(board) = ctx.compile else {
        return Ok(());
    };
    let waited = Instant::now();
    let compiled = board.wait(&m.job.id);
    let recipe = matches!(&compiled, Some(Ok(c)) if c.has_recipe());
    crate::trace::span(
        track,
        "wait for compile",
        waited,
        serde_json::json!({"job": m.job.id, "recipe": recipe}),
    );
    match compiled {
        Some(Ok(c)) => {
            m.compile_s = Some(c.seconds);
            // One the pool could not make is the backend's to ask for
            // (its failure is then recorded at the check).
            if let (true, Some(r)) = (recipe, c.recipe) {
                backend.offer_recipe(&m.job.id, r);
            }
            Ok(())
        }
        // The compiler's verdict is the job's. Anything else (a compile worker
        // that crashed, hung or could not start) says nothing about the job:
        // the lane compiles it itself in `prepare`.
        Some(Err(f))
            if matches!(
                f.class,
                FailureClass::CompileError | FailureClass::OutOfResources
            ) =>
        {
            Err(f)
        }
        Some(Err(_)) | None => Ok(()),
    }
}

/// The batches a job's check goes on to in the same call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstBatches {
    /// None: only the check (and the warm-up, separately).
    None,
    /// The first batch (screening takes a set number of batches).
    One,
    /// The first batch and, where the backend can, more until the protocol's
    /// stopping rule says enough (a full measurement).
    UntilStopped,
}

/// Check (fresh inputs, poisoned output, compare) and, unless only
/// checking, warm up and take `first` batch (`count` samples, timed as
/// `mode` says) where one is asked for, and more `until` the stopping rule
/// where given and the backend can: the backend does it all in one round
/// trip where it can. Returns whether the first batch was taken.
/// `retiming`: a finalist's re-timing round (`retiming_batch`).
#[allow(clippy::too_many_arguments)]
pub(super) fn prepare(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    kernel: &str,
    kind: MethodKind,
    m: &mut Measured,
    first: Option<(SampleMode, u32)>,
    until: Option<StopRule>,
    retiming: bool,
) -> Result<bool, JobFailure> {
    let tol = ctx.tolerance.for_dtype(shape_dtype(&m.job.shape));
    let timed = ctx.run_mode != RunMode::Check;
    let checked = match first.filter(|_| timed) {
        Some((mode, count)) => {
            let first = if retiming {
                retiming_batch(ctx, mode, count, until)
            } else {
                first_batch(ctx, mode, count, until)
            };
            backend.check_then_sample(&m.job, kernel, kind.as_str(), tol, ctx.protocol.seed, first)
        }
        None => backend
            .check(&m.job, kernel, kind.as_str(), tol, ctx.protocol.seed)
            .map(|check| Checked { check, first: None }),
    };
    let kernels = backend.take_kernels();
    if read_check(m, checked, kernels, tol, timed)? > 0 {
        return Ok(true);
    }
    if timed {
        let warmup_ms = warmup_ms(ctx, retiming);
        backend.warmup(&m.job.id, ctx.protocol.warmup_launches, warmup_ms)?;
    }
    Ok(false)
}

/// Samples in the first batch of a full measurement stopped by `rule`:
/// the protocol's batch, or where racing may stop it, `min_samples` (so
/// that an outpaced job stops there rather than at a whole batch).
fn first_count(ctx: &LaneContext<'_>, rule: &StopRule) -> u32 {
    let batch = ctx.protocol.batch;
    if rule.outpaced_above_us.is_some() {
        batch.min(rule.min_samples.max(1))
    } else {
        batch
    }
}

/// The warm-up and first batch a check goes on to, as the protocol says.
fn first_batch(
    ctx: &LaneContext<'_>,
    mode: SampleMode,
    count: u32,
    until: Option<StopRule>,
) -> FirstBatch {
    FirstBatch {
        warmup_launches: ctx.protocol.warmup_launches,
        warmup_ms: ctx.protocol.warmup_ms,
        count,
        mode,
        until,
        reuse_check: false,
    }
}

/// The warm-up and batch of a finalist's re-timing round. The finalist
/// passed its check when it was measured, so a worker that still holds it
/// prepared may give that verdict again (`reuse_check`). Back to back
/// (`protocol.retime_rest` 0) it warms up with `protocol.warmup_launches`
/// alone, not `warmup_ms` too: it was warmed up and measured in this group,
/// and the GPU has been running the group's other finalists since, so the
/// batch meets neither a first launch nor an idle GPU's clocks. `warmup_ms`
/// (5 ms) would cost each of the 30 re-timing calls of a group's 5
/// finalists 5-6 ms of wall time (an H100 gptoss-mxfp4 run, 2026-11-25).
/// With rests the GPU idles after every batch on purpose, so the whole
/// warm-up stays.
fn retiming_batch(
    ctx: &LaneContext<'_>,
    mode: SampleMode,
    count: u32,
    until: Option<StopRule>,
) -> FirstBatch {
    FirstBatch {
        warmup_ms: warmup_ms(ctx, true),
        reuse_check: true,
        ..first_batch(ctx, mode, count, until)
    }
}

/// The warm-up's `warmup_ms`: the protocol's, but none for a re-timing
/// round back to back (see `retiming_batch`).
fn warmup_ms(ctx: &LaneContext<'_>, retiming: bool) -> f64 {
    if retiming && ctx.protocol.retime_rest == 0.0 {
        0.0
    } else {
        ctx.protocol.warmup_ms
    }
}

/// A check's answer into the job: the kernels it launched, its comparison
/// (a failed one is the job's failure) and, when `timed`, the batches that
/// came with it. Returns how many batches came.
fn read_check(
    m: &mut Measured,
    checked: Result<Checked, JobFailure>,
    kernels: Vec<crate::store::KernelResources>,
    tol: crate::manifest::ToleranceFor,
    timed: bool,
) -> Result<usize, JobFailure> {
    if !kernels.is_empty() {
        m.kernels = kernels;
    }
    let checked = checked?;
    let check = checked.check;
    let passed = check.passed;
    let bad_values = check.nan_count + check.inf_count;
    let frac = check.mismatch_frac;
    m.check = Some(check);
    if !passed {
        return Err(if bad_values > 0 {
            JobFailure::new(
                FailureClass::Nan,
                format!("{bad_values} NaN/Inf values in the output"),
            )
        } else {
            JobFailure::new(
                FailureClass::Mismatch,
                format!(
                    "{:.4} % of elements outside atol {} + rtol {}",
                    frac * 100.0,
                    tol.atol,
                    tol.rtol
                ),
            )
        });
    }
    if !timed {
        return Ok(0);
    }
    let Some(taken) = checked.first else {
        return Ok(0);
    };
    let taken = taken?;
    let batches = taken.len();
    for t in taken {
        add_batch(m, t.batch, t.wall_ms);
    }
    Ok(batches)
}

/// Screening's stopping rule, for a worker that takes batches until a rule
/// says enough: exactly `batches` batches of `batch` samples (at that many
/// samples the rule stops whether or not it calls them converged), or
/// fewer where the protocol's wall cap comes first (the lane then takes
/// the rest itself).
fn screening_rule(batches: usize, batch: u32, max_wall_ms: f64) -> StopRule {
    let samples = u32::try_from(batches)
        .unwrap_or(u32::MAX)
        .saturating_mul(batch);
    StopRule {
        min_samples: samples,
        max_samples: samples,
        target_ci: 0.0,
        max_gpu_ms: f64::INFINITY,
        max_wall_ms,
        outpaced_above_us: None,
    }
}

/// The requests of one `Lane::ask_each`: under way, to make again, and
/// the screenings that passed, by candidate.
#[derive(Default)]
struct Each {
    under_way: VecDeque<SentJob>,
    again: Vec<Again>,
    passed: HashMap<usize, f64>,
}

fn take_batch(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    m: &mut Measured,
) -> Result<(), JobFailure> {
    take_batch_as(backend, m, ctx.sampling, ctx.protocol.batch)
}

/// One batch of `count` samples, timed as `mode` says.
fn take_batch_as(
    backend: &mut dyn Backend,
    m: &mut Measured,
    mode: SampleMode,
    count: u32,
) -> Result<(), JobFailure> {
    let start = Instant::now();
    let batch = backend.sample(&m.job.id, count, mode)?;
    add_batch(m, batch, start.elapsed().as_secs_f64() * 1e3);
    Ok(())
}

/// A batch into the job's samples; `wall_ms`: what taking it cost.
fn add_batch(m: &mut Measured, batch: SampleBatch, wall_ms: f64) {
    m.sampling.wall_ms += wall_ms;
    m.sampling.samples_us.extend(batch.us);
    m.sampling.timer = Some(batch.timer);
    if let Some(c) = batch.sm_clock_mhz {
        m.sampling.clocks_mhz.push(c);
    }
}

/// The best few configs of a group, re-timed interleaved in shuffled order so
/// that clock and thermal drift hit them alike: the run's own way, then each
/// way of `protocol.retime_with`, each recorded as a finalist record of its
/// timing. `track`: the lane's trace track, where the GPU's rests go.
fn retime_finalists(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    kernel: &str,
    kind: MethodKind,
    measured: Vec<Measured>,
    track: &str,
    emit: &mut dyn FnMut(Event),
) {
    // Each median once, not a sort of a job's samples in every comparison
    // (some 500 for 48 jobs): the GPU is idle from the last job's answer
    // to the first re-timing check (0.59 ms before this, 0.36 ms after, in
    // two H200 runs: results/bench/NVIDIA_H200/native-idle-56a495b).
    let mut by_median: Vec<(f64, Measured)> =
        measured.into_iter().map(|m| (m.median(), m)).collect();
    by_median.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut alive: Vec<Measured> = by_median
        .into_iter()
        .take(ctx.protocol.finalists as usize)
        .map(|(_, m)| m)
        .collect();
    let timings =
        std::iter::once(ctx.protocol.timing).chain(ctx.protocol.retime_with.iter().copied());
    for timing in timings {
        if ctx.stopping() {
            return;
        }
        retime(ctx, backend, kernel, kind, &mut alive, timing, track, emit);
    }
}

/// One round of a re-timing: a check and one batch of each finalist of
/// `order`, in that order; the batches that came, by finalist (a failed
/// check or batch gives none). With `protocol.retime_rest` the GPU rests
/// after each batch (`rest_after`), so each is waited for; else they are
/// sent ahead where the backend can (two under way, as `Lane::ask_each`
/// does), with a rule that counts one batch; answers lost with their
/// worker, or that came without a batch, are asked again after the round's
/// last, waited for.
#[allow(clippy::too_many_arguments)]
pub(super) fn retime_round(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    kernel: &str,
    kind: MethodKind,
    alive: &mut [Measured],
    order: &[usize],
    mode: SampleMode,
    count: u32,
    track: &str,
) -> Vec<(usize, Sampling)> {
    let max_wall_ms = ctx.protocol.stop_rule().max_wall_ms;
    let rest = ctx.protocol.retime_rest;
    let ahead = max_wall_ms.is_finite() && rest == 0.0;
    let first = retiming_batch(
        ctx,
        mode,
        count,
        Some(screening_rule(1, count, max_wall_ms)),
    );
    let mut got = Vec::new();
    let mut under_way: VecDeque<usize> = VecDeque::new();
    let mut again: Vec<usize> = Vec::new();
    for &i in order {
        // Cloned: answers read while it waits to be sent update the other finalists.
        let job = alive[i].job.clone();
        let sent = if ahead {
            let tol = ctx.tolerance.for_dtype(shape_dtype(&job.shape));
            loop {
                match backend.send_measurement(
                    &job,
                    kernel,
                    kind.as_str(),
                    tol,
                    ctx.protocol.seed,
                    first,
                ) {
                    Ok(SentAhead::WhenIdle) if !under_way.is_empty() => {
                        while let Some(j) = under_way.pop_front() {
                            receive_retimed(ctx, backend, &mut alive[j], j, &mut got, &mut again);
                        }
                    }
                    other => break other,
                }
            }
        } else {
            Ok(SentAhead::Declined)
        };
        match sent {
            Ok(SentAhead::Sent) => under_way.push_back(i),
            Ok(SentAhead::Declined | SentAhead::WhenIdle) => {
                while let Some(j) = under_way.pop_front() {
                    receive_retimed(ctx, backend, &mut alive[j], j, &mut got, &mut again);
                }
                if let Some(sampling) =
                    retime_now(ctx, backend, kernel, kind, &mut alive[i], mode, count)
                {
                    rest_after(&sampling, mode, rest, track, backend.last_done());
                    got.push((i, sampling));
                }
            }
            // This finalist's batch is missing from the round, as a failed check's is.
            Err(_) => {}
        }
        while under_way.len() >= UNDER_WAY {
            let j = under_way.pop_front().expect("under way");
            receive_retimed(ctx, backend, &mut alive[j], j, &mut got, &mut again);
        }
    }
    while let Some(j) = under_way.pop_front() {
        receive_retimed(ctx, backend, &mut alive[j], j, &mut got, &mut again);
    }
    for i in again {
        if let Some(sampling) = retime_now(ctx, backend, kernel, kind, &mut alive[i], mode, count) {
            rest_after(&sampling, mode, rest, track, backend.last_done());
            got.push((i, sampling));
        }
    }
    got
}

/// Leaves the GPU idle for `rest` times the kernel time of a re-timing
/// batch just taken. Back to back, a long kernel's finalists run the GPU
/// into its power cap: on an H100 (2026-11-24) the bench GEMM's re-timing
/// ran at 1560-1680 MHz where its first pass had run at 1965, and the two
/// best configs, 3 % apart there, came out within 1 % and in either order;
/// resting as long as each batch ran kept 1770-1920 MHz and their order
/// (results/bench/NVIDIA_H100_80GB_HBM3/retime_rest/README.md).
///
/// The rest counts from `done`, when the worker finished the batch (the
/// GPU has been idle since), not from when the lane read the answer, and
/// its last [`REST_SPUN`] is spun, not slept: in H200 and H100 traces
/// (2026-11-24, commit ca31224) the lane began resting 70-77 µs after the
/// worker had finished, and the sleep's wake-up made each rest 72-138 µs
/// longer than asked (results/bench/NVIDIA_H200/native-idle-56a495b).
fn rest_after(
    sampling: &Sampling,
    mode: SampleMode,
    rest: f64,
    track: &str,
    done: Option<Instant>,
) {
    if rest <= 0.0 {
        return;
    }
    let calls = if mode.timing == Timing::Graph {
        mode.graph_calls.max(1) as f64
    } else {
        1.0
    };
    let kernel_ms = sampling.samples_us.iter().sum::<f64>() * calls / 1e3;
    let now = Instant::now();
    let started = done.filter(|d| *d <= now).unwrap_or(now);
    let until = started + Duration::from_secs_f64(rest * kernel_ms / 1e3);
    if let Some(sleep) = until
        .checked_duration_since(now)
        .and_then(|left| left.checked_sub(REST_SPUN))
    {
        std::thread::sleep(sleep);
    }
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    // The rest is the protocol's up to `until`; the GPU's idle past it (the
    // lane read the answer later, or woke late) is the runner's, and the
    // trace shows it so.
    crate::trace::span_to(
        track,
        "rest",
        started,
        until,
        serde_json::json!({"kernel_ms": kernel_ms}),
    );
}

/// The end of a rest, spun rather than slept: a sleeping thread wakes up to
/// Linux's timer slack (50 µs by default) late, plus its wake-up.
const REST_SPUN: Duration = Duration::from_micros(200);

/// The oldest re-timing answer under way, finalist `i`'s, into the round:
/// its batch, or `i` to ask again; a failure gives nothing.
fn receive_retimed(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    m: &mut Measured,
    i: usize,
    got: &mut Vec<(usize, Sampling)>,
    again: &mut Vec<usize>,
) {
    match read_retimed(ctx, backend, m) {
        Some(Ok(Some(sampling))) => got.push((i, sampling)),
        Some(Ok(None)) | None => again.push(i),
        Some(Err(())) => {}
    }
}

/// The answer to a re-timing check sent ahead: `Ok(Some)` its batch,
/// `Ok(None)` passed with no batch (to ask again), `Err` failed, `None`
/// lost with its worker (to ask again). The finalist's own samples are
/// left as they were.
fn read_retimed(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    m: &mut Measured,
) -> Option<Result<Option<Sampling>, ()>> {
    let before = std::mem::take(&mut m.sampling);
    let read = read_received(ctx, backend, m);
    let got = std::mem::replace(&mut m.sampling, before);
    Some(match read? {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some(got)),
        Err(_) => Err(()),
    })
}

/// The oldest answer sent ahead, read into `m`: how many batches came, the
/// job's failure, or `None` where the request was lost with its worker.
fn read_received(ctx: &LaneContext<'_>, backend: &mut dyn Backend, m: &mut Measured) -> AnswerRead {
    match backend.receive_measurement() {
        Received::Lost => None,
        Received::Answer { checked, kernels } => {
            let tol = ctx.tolerance.for_dtype(shape_dtype(&m.job.shape));
            Some(read_check(m, checked, kernels, tol, true))
        }
    }
}

/// A finalist's re-timing check and batch, waited for: the batch, or `None`
/// where the check or the batch failed. Its own samples are left as they were.
fn retime_now(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    kernel: &str,
    kind: MethodKind,
    m: &mut Measured,
    mode: SampleMode,
    count: u32,
) -> Option<Sampling> {
    let before = std::mem::take(&mut m.sampling);
    // A re-timing: see `retiming_batch`.
    let ok = prepare(
        ctx,
        backend,
        kernel,
        kind,
        m,
        Some((mode, count)),
        None,
        true,
    )
    .and_then(|taken| {
        if taken {
            Ok(())
        } else {
            take_batch_as(backend, m, mode, count)
        }
    });
    let got = std::mem::replace(&mut m.sampling, before);
    ok.ok().map(|()| got)
}

/// The samples of a re-timing batch timed as `mode` says: the protocol's
/// batch, or under graph timing (each sample already the mean of
/// `graph_calls` launches) that many times fewer, at least 4.
pub fn retime_count(protocol: &Protocol, mode: SampleMode) -> u32 {
    match mode.timing {
        Timing::Graph => protocol.batch.div_ceil(mode.graph_calls.max(1)).max(4),
        Timing::Cold | Timing::Hot => protocol.batch,
    }
}

/// One interleaved re-timing of the finalists under `timing`. A graph sample
/// is already the mean of `graph_calls` launches, so a graph batch holds
/// that many times fewer samples (at least 4): the same launches timed.
#[allow(clippy::too_many_arguments)]
fn retime(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    kernel: &str,
    kind: MethodKind,
    alive: &mut [Measured],
    timing: Timing,
    track: &str,
    emit: &mut dyn FnMut(Event),
) {
    let mode = ctx.sampling.with_timing(timing);
    let count = retime_count(&ctx.protocol, mode);
    let mut samples: HashMap<String, Sampling> = HashMap::new();
    let mut rng = crate::rng::SplitMix64::new(ctx.protocol.seed ^ 0x5eed);
    const ROUNDS: usize = 3;
    for _ in 0..ROUNDS {
        let mut order: Vec<usize> = (0..alive.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for (i, got) in retime_round(
            ctx, backend, kernel, kind, alive, &order, mode, count, track,
        ) {
            let acc = samples.entry(alive[i].job.id.clone()).or_default();
            acc.samples_us.extend(got.samples_us);
            acc.clocks_mhz.extend(got.clocks_mhz);
            acc.wall_ms += got.wall_ms;
            acc.timer = got.timer;
        }
    }
    let stats: Vec<(String, Stats)> = alive
        .iter()
        .filter_map(|m| {
            samples
                .get(&m.job.id)
                .map(|s| (m.job.id.clone(), s.stats()))
        })
        .collect();
    let Some(best) = stats
        .iter()
        .min_by(|a, b| a.1.median_us.total_cmp(&b.1.median_us))
        .map(|b| b.1.clone())
    else {
        return;
    };
    for (job_id, s) in stats {
        let tied_with_best = measure::tied(&s, &best);
        emit(Event::Final(FinalRecord {
            job_id,
            timing,
            stats: s,
            tied_with_best,
        }));
    }
}

#[cfg(test)]
mod tests {
    //! The lane against a fake backend whose kernel time is a function of the
    //! config, running the real strategies.

    use super::*;
    use crate::backend::{Compiled, SampleBatch};
    use crate::manifest::ToleranceFor;
    use crate::measure::Timer;
    use crate::search::{Halving, Surrogate};
    use crate::store::CheckResult;
    use serde_json::json;

    /// Time of a config: |B - 5| * 10 + 100 us, so B = 5 is best; B = 9 does not compile.
    /// With a `spread`, samples cycle through 13 values within ± that
    /// fraction of it, so that a job needs many to converge.
    #[derive(Default)]
    struct Fake {
        prepared: Option<Job>,
        unavailable: IndexMap<String, String>,
        spread: f64,
        /// Samples taken so far, across jobs: where the cycle stands.
        taken: usize,
    }

    /// A worker that dies on every check of a job `dies` picks; `log` has
    /// each `begin_group` and check, in order.
    struct Dying<F: Fn(&Job) -> bool> {
        inner: Fake,
        dies: F,
        log: Vec<String>,
    }

    impl<F: Fn(&Job) -> bool> Backend for Dying<F> {
        fn describe(
            &mut self,
            shape: &serde_json::Value,
            seed: u64,
        ) -> Result<crate::backend::ShapeFacts, JobFailure> {
            self.inner.describe(shape, seed)
        }
        fn compile(&mut self, job: &Job, k: &str, kind: &str) -> Result<f64, JobFailure> {
            self.inner.compile(job, k, kind)
        }
        fn check(
            &mut self,
            job: &Job,
            k: &str,
            kind: &str,
            tol: ToleranceFor,
            seed: u64,
        ) -> Result<CheckResult, JobFailure> {
            self.log.push("check".into());
            if (self.dies)(job) {
                return Err(JobFailure::new(FailureClass::Crash, "worker died"));
            }
            self.inner.check(job, k, kind, tol, seed)
        }
        fn begin_group(&mut self, method: &str, _: &crate::manifest::Shape, seed: u64) {
            self.log.push(format!("begin {method} {seed}"));
        }
        fn warmup(&mut self, id: &str, n: u32, ms: f64) -> Result<(), JobFailure> {
            self.inner.warmup(id, n, ms)
        }
        fn sample(
            &mut self,
            id: &str,
            count: u32,
            mode: SampleMode,
        ) -> Result<SampleBatch, JobFailure> {
            self.inner.sample(id, count, mode)
        }
    }

    /// Runs the group on a lane that may retire, `good` having passed on
    /// some lane before; returns the records and what was handed back.
    fn run_watched(
        dies: impl Fn(&Job) -> bool,
        good: Option<Job>,
        may_retire: bool,
    ) -> (Vec<JobRecord>, Option<Group>, Health) {
        let peak = |_: Option<&str>| 1000.0;
        let prior = HashMap::new();
        let last_good = Mutex::new(good.map(|job| JobRef {
            job,
            kernel: "k".into(),
            kind: MethodKind::Triton,
        }));
        let retire = move || may_retire;
        let mut protocol = crate::manifest::default_protocol();
        protocol.finalists = 0;
        let ctx = LaneContext {
            protocol,
            tolerance: Tolerance {
                atol: 0.0,
                rtol: 0.0,
                max_mismatch: 0.0,
                per_dtype: IndexMap::new(),
            },
            strategies: &Strategies::single(Box::new(Grid)),
            run_mode: RunMode::Tune,
            sampling: SampleMode::PLAIN,
            peak_gbs: 1000.0,
            peak_tflops: &peak,
            compile: None,
            lane: 1,
            prior: &prior,
            health: Some(HealthWatch {
                state: Default::default(),
                last_good: &last_good,
                retire: &retire,
            }),
            ab: None,
        };
        let mut backend = Dying {
            inner: Fake {
                prepared: None,
                spread: 0.0,
                taken: 0,
                unavailable: IndexMap::new(),
            },
            dies,
            log: Vec::new(),
        };
        let mut jobs = Vec::new();
        let rest = run_group(&ctx, &mut backend, group(), &mut |e| {
            if let Event::Job(r) = e {
                jobs.push(*r)
            }
        });
        let health = ctx.health.unwrap().state.into_inner();
        (jobs, rest, health)
    }

    fn good_job() -> Job {
        let mut job = group().jobs.remove(5);
        job.id = "good".into();
        job
    }

    #[test]
    fn a_lane_whose_gpu_fails_a_job_that_passed_before_retires() {
        // Every check dies, the known-good job's too: the GPU is at fault.
        let (jobs, rest, health) = run_watched(|_| true, Some(good_job()), true);
        assert_eq!(jobs.len(), RETIRE_AFTER, "it stops at the third failure");
        assert!(health.retired.as_deref().unwrap().contains("job good"));
        assert_eq!(health.streak.len(), RETIRE_AFTER);
        let rest = rest.expect("the unrecorded jobs are handed back");
        assert_eq!(rest.jobs.len(), 10 - RETIRE_AFTER);
    }

    #[test]
    fn kernels_that_crash_on_a_healthy_gpu_do_not_retire_a_lane() {
        // Every config but the known-good one dies: the kernels are at fault.
        let (jobs, rest, health) = run_watched(|j| j.id != "good", Some(good_job()), true);
        assert_eq!(jobs.len(), 10, "the group runs to its end");
        assert!(rest.is_none() && health.retired.is_none());
        // Nothing passed anywhere yet: nothing tells GPU from kernels.
        let (jobs, rest, _) = run_watched(|_| true, None, true);
        assert_eq!((jobs.len(), rest.is_none()), (10, true));
        // The last lane never retires.
        let (jobs, rest, _) = run_watched(|_| true, Some(good_job()), false);
        assert_eq!((jobs.len(), rest.is_none()), (10, true));
    }

    impl Backend for Fake {
        fn describe(
            &mut self,
            _: &serde_json::Value,
            _: u64,
        ) -> Result<crate::backend::ShapeFacts, JobFailure> {
            Ok(crate::backend::ShapeFacts {
                flops: Some(1e9),
                bytes: Some(1e6),
                unavailable: self.unavailable.clone(),
            })
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
            self.prepared = None;
            if job.config["B"] == 9 {
                return Err(JobFailure::new(
                    FailureClass::CompileError,
                    "B=9 does not compile",
                ));
            }
            self.prepared = Some(job.clone());
            Ok(CheckResult {
                passed: true,
                elements: 1,
                ..Default::default()
            })
        }
        fn take_kernels(&mut self) -> Vec<crate::store::KernelResources> {
            // The kernel of the config just checked: B registers more than 64.
            let Some(job) = &self.prepared else {
                return Vec::new();
            };
            vec![crate::store::KernelResources {
                name: "k".into(),
                n_regs: Some(64 + job.config["B"].as_u64().unwrap() as u32),
                n_spills: Some(0),
                shared: 1024,
                num_warps: 4,
                num_stages: 2,
            }]
        }
        fn warmup(&mut self, _: &str, _: u32, _: f64) -> Result<(), JobFailure> {
            Ok(())
        }
        fn sample(
            &mut self,
            job_id: &str,
            count: u32,
            _: SampleMode,
        ) -> Result<SampleBatch, JobFailure> {
            let job = self
                .prepared
                .as_ref()
                .filter(|j| j.id == job_id)
                .expect("sampled job is prepared");
            let b = job.config["B"].as_f64().unwrap();
            let time = (b - 5.0).abs() * 10.0 + 100.0;
            let spread = self.spread;
            let first = self.taken;
            self.taken += count as usize;
            Ok(SampleBatch {
                us: (first..self.taken)
                    .map(|k| time * (1.0 + spread * ((k * 7 % 13) as f64 / 6.0 - 1.0)))
                    .collect(),
                timer: Timer::CudaEvent,
                sm_clock_mhz: None,
            })
        }
    }

    fn surrogate() -> Surrogate {
        Surrogate {
            budget: Some(6),
            seed: 0,
        }
    }

    fn group() -> Group {
        let jobs = (0..10)
            .map(|b| {
                let mut config = IndexMap::new();
                config.insert("B".to_string(), json!(b));
                Job {
                    id: format!("job{b}"),
                    shape_index: 0,
                    method: "m".into(),
                    shape: IndexMap::new(),
                    config,
                    baseline: b == 0,
                    variant: None,
                }
            })
            .collect();
        Group {
            shape: IndexMap::new(),
            method: "m".into(),
            kernel: "k".into(),
            kind: MethodKind::Triton,
            jobs,
            unavailable: None,
        }
    }

    fn peak(_: Option<&str>) -> f64 {
        1000.0
    }

    /// A lane context for the fake: tune mode, exact tolerance, no flush.
    fn context<'a>(
        strategies: &'a Strategies,
        prior: &'a HashMap<String, Vec<PriorObservation>>,
        compile: Option<&'a CompileBoard>,
        finalists: u32,
    ) -> LaneContext<'a> {
        let mut protocol = crate::manifest::default_protocol();
        protocol.finalists = finalists;
        LaneContext {
            protocol,
            tolerance: Tolerance {
                atol: 0.0,
                rtol: 0.0,
                max_mismatch: 0.0,
                per_dtype: IndexMap::new(),
            },
            strategies,
            run_mode: RunMode::Tune,
            sampling: SampleMode::PLAIN,
            peak_gbs: 1000.0,
            peak_tflops: &peak,
            compile,
            lane: 0,
            prior,
            health: None,
            ab: None,
        }
    }

    fn run(
        strategy: Box<dyn Strategy>,
        compile: Option<&CompileBoard>,
    ) -> (Vec<JobRecord>, Vec<FinalRecord>) {
        let strategies = Strategies::single(strategy);
        let prior = HashMap::new();
        let ctx = context(&strategies, &prior, compile, 2);
        let mut backend = Fake {
            prepared: None,
            spread: 0.0,
            taken: 0,
            unavailable: IndexMap::new(),
        };
        let (mut jobs, mut finals) = (Vec::new(), Vec::new());
        run_group(&ctx, &mut backend, group(), &mut |e| match e {
            Event::Job(r) => jobs.push(*r),
            Event::Final(f) => finals.push(f),
            Event::Retired(_) | Event::AbPair(_) => {
                unreachable!("lanes report their retirement themselves; no A/B here")
            }
        });
        (jobs, finals)
    }

    #[test]
    fn grid_records_every_job_once_and_retimes_the_finalists() {
        let (jobs, finals) = run(Box::new(Grid), None);
        assert_eq!(jobs.len(), 10);
        let failed: Vec<_> = jobs
            .iter()
            .filter(|j| j.status == JobStatus::Failed)
            .collect();
        assert_eq!(failed.len(), 1);
        assert_eq!(
            failed[0].failure.as_ref().unwrap().class,
            FailureClass::CompileError
        );
        assert!(failed[0].stats.is_none(), "failures are never timed");
        let best = jobs
            .iter()
            .filter_map(|j| j.stats.as_ref().map(|s| (j, s.median_us)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        assert_eq!(best.0.config["B"], 5);
        assert_eq!(finals.len(), 2, "the best two are re-timed");
        assert!(finals.iter().any(|f| f.job_id == "job5"));
        // Each checked job records the kernels its check compiled; a job that
        // failed to compile records none.
        for j in &jobs {
            let b = j.config["B"].as_u64().unwrap() as u32;
            if j.status == JobStatus::Failed {
                assert!(j.kernels.is_empty());
            } else {
                assert_eq!(j.max_regs(), Some(64 + b), "{}", j.job_id);
            }
        }
    }

    #[test]
    fn halving_in_a_lane_keeps_screening_statistics_of_what_it_prunes() {
        let halving = Halving {
            eta: 3,
            keep_at_least: 3,
        };
        let (jobs, _) = run(Box::new(halving), None);
        assert_eq!(jobs.len(), 10, "every job gets exactly one record");
        let status = |id: &str| jobs.iter().find(|j| j.job_id == id).unwrap().status;
        assert_eq!(status("job5"), JobStatus::Ok, "the best is measured fully");
        assert_eq!(
            status("job0"),
            JobStatus::Ok,
            "the baseline is never pruned"
        );
        let pruned: Vec<_> = jobs
            .iter()
            .filter(|j| j.status == JobStatus::Pruned)
            .collect();
        assert!(!pruned.is_empty());
        assert!(
            pruned
                .iter()
                .all(|j| j.stats.as_ref().is_some_and(|s| s.n > 0) && j.check.is_some()),
            "pruned jobs keep their check and screening statistics"
        );
    }

    #[test]
    fn surrogate_in_a_lane_records_skipped_configs_without_statistics() {
        let (jobs, _) = run(Box::new(surrogate()), None);
        assert_eq!(jobs.len(), 10);
        let skipped: Vec<_> = jobs
            .iter()
            .filter(|j| j.status == JobStatus::Skipped)
            .collect();
        assert_eq!(skipped.len(), 3);
        assert!(skipped
            .iter()
            .all(|j| j.stats.is_none() && j.check.is_none()));
    }

    /// A resumed surrogate search finds what the earlier run measured in its
    /// group (the keys `prior_observations` builds are the ones a lane looks
    /// up) and spends only what is left of its budget.
    #[test]
    fn a_resumed_surrogate_in_a_lane_finds_its_earlier_measurements() {
        let (first, _) = run(Box::new(surrogate()), None);
        // The earlier run measured three configs of the group.
        let earlier: Vec<JobRecord> = first
            .iter()
            .filter(|j| !j.baseline && j.status == JobStatus::Ok)
            .take(3)
            .cloned()
            .collect();
        assert_eq!(earlier.len(), 3);
        let prior = prior_observations(earlier.iter());
        assert_eq!(prior.values().map(Vec::len).sum::<usize>(), 3);
        let mut g = group();
        g.jobs.retain(|j| !earlier.iter().any(|e| e.job_id == j.id));
        let strategies = Strategies::single(Box::new(surrogate()));
        let ctx = context(&strategies, &prior, None, 0);
        let mut jobs = Vec::new();
        run_group(
            &ctx,
            &mut Fake {
                prepared: None,
                spread: 0.0,
                taken: 0,
                unavailable: IndexMap::new(),
            },
            g,
            &mut |e| {
                if let Event::Job(r) = e {
                    jobs.push(*r)
                }
            },
        );
        let measured = jobs
            .iter()
            .filter(|j| !j.baseline && j.status != JobStatus::Skipped)
            .count();
        assert_eq!(measured, 3, "6 in the budget, 3 measured before");
    }

    /// A method its worker says cannot run here (a library not installed):
    /// every job is recorded as skipped, with the reason, none is checked.
    #[test]
    fn an_unavailable_method_is_skipped_with_its_reason() {
        let strategies = Strategies::single(Box::new(Grid));
        let prior = HashMap::new();
        let ctx = context(&strategies, &prior, None, 5);
        let mut unavailable = IndexMap::new();
        unavailable.insert("k".to_string(), "vLLM is not installed".to_string());
        let mut backend = Fake {
            prepared: None,
            spread: 0.0,
            taken: 0,
            unavailable,
        };
        let mut jobs = Vec::new();
        run_group(&ctx, &mut backend, group(), &mut |e| {
            if let Event::Job(r) = e {
                jobs.push(*r)
            }
        });
        assert_eq!(jobs.len(), 10);
        assert!(jobs.iter().all(|j| j.status == JobStatus::Skipped
            && j.check.is_none()
            && j.failure
                .as_ref()
                .is_some_and(|f| f.class == FailureClass::Unavailable
                    && f.message == "vLLM is not installed")));
        assert!(backend.prepared.is_none(), "nothing was checked");
    }

    /// The backend hears of a group once, before its first check (the
    /// native lane builds the shape's data then, while the first compile
    /// runs), and not at all for a method that cannot run here.
    #[test]
    fn a_group_begins_once_before_its_first_check_unless_it_cannot_run() {
        let strategies = Strategies::single(Box::new(Grid));
        let prior = HashMap::new();
        let ctx = context(&strategies, &prior, None, 2);
        for unavailable in [false, true] {
            let mut backend = Dying {
                inner: Fake::default(),
                dies: |_: &Job| false,
                log: Vec::new(),
            };
            if unavailable {
                backend
                    .inner
                    .unavailable
                    .insert("k".into(), "not here".into());
            }
            run_group(&ctx, &mut backend, group(), &mut |_| {});
            if unavailable {
                assert!(backend.log.is_empty(), "{:?}", backend.log);
            } else {
                let seed = ctx.protocol.seed;
                assert_eq!(backend.log[0], format!("begin m {seed}"));
                assert_eq!(
                    backend
                        .log
                        .iter()
                        .filter(|l| l.starts_with("begin"))
                        .count(),
                    1
                );
                assert!(backend.log.len() > 10, "every job was checked after it");
            }
        }
    }

    /// A finalist's rest counts from when the worker finished its batch,
    /// not from when the lane read the answer.
    #[test]
    fn a_rest_counts_from_when_the_worker_finished_the_batch() {
        // One 50 ms sample: a rest of 1 lasts 50 ms.
        let sampling = Sampling {
            samples_us: vec![50_000.0],
            ..Sampling::default()
        };
        let ms = Duration::from_millis;
        let rest = |done: Option<Duration>| {
            let now = Instant::now();
            rest_after(
                &sampling,
                SampleMode::PLAIN,
                1.0,
                "t",
                done.map(|ago| now - ago),
            );
            now.elapsed()
        };
        assert!(rest(None) >= ms(50));
        // Finished 20 ms ago: 30 ms more.
        let left = rest(Some(ms(20)));
        assert!(left >= ms(30), "{left:?}");
        // Finished 50 ms ago: the rest is over (else it would last 50 ms more).
        assert!(rest(Some(ms(50))) < ms(50));
        // No rest asked for: none.
        let now = Instant::now();
        rest_after(&sampling, SampleMode::PLAIN, 0.0, "t", None);
        assert!(now.elapsed() < ms(50));
    }

    /// The compiler's verdict from the pool is the job's; a compile worker
    /// that crashed says nothing about the job, which the lane then compiles.
    #[test]
    fn a_pool_crash_is_not_the_jobs_failure_but_a_compile_error_is() {
        let board = CompileBoard::default();
        for job in group().jobs {
            board.push(job, "k", "triton");
        }
        board.close();
        while let Some((job, _, _)) = board.next() {
            let result = match job.id.as_str() {
                "job3" => Err(JobFailure::new(FailureClass::Crash, "worker died")),
                "job4" => Err(JobFailure::new(FailureClass::CompileError, "ptxas said no")),
                _ => Ok(Compiled::in_seconds(0.1)),
            };
            board.finish(&job.id, result);
        }
        let (jobs, _) = run(Box::new(Grid), Some(&board));
        let get = |id: &str| jobs.iter().find(|j| j.job_id == id).unwrap();
        assert_eq!(
            get("job3").status,
            JobStatus::Ok,
            "the lane compiled it itself"
        );
        assert_eq!(get("job4").status, JobStatus::Failed);
        assert_eq!(
            get("job4").failure.as_ref().unwrap().message,
            "ptxas said no"
        );
        assert_eq!(get("job5").compile_s, Some(0.1));
    }

    /// The fake, counting its calls; with `fold`, folding the warm-up and
    /// the first batch into its check as the workers do (`then_fails` fails
    /// that batch).
    struct Folding {
        inner: Fake,
        fold: bool,
        then_fails: bool,
        /// Goes on taking batches under `until` in the same call, as the
        /// native worker does.
        goes_on: bool,
        calls: HashMap<&'static str, usize>,
        /// Each check's job and the three jobs `look_ahead` saw after it.
        looked_ahead: Vec<(String, Vec<String>)>,
        /// Takes measurements sent ahead, as the native lane does.
        pipelines: bool,
        /// The job whose first check kills the worker, with what was sent after it
        /// (waited for, the check alone).
        dies_once: Option<String>,
        /// Jobs that need calls of their own before they are sent (as a
        /// recipe does): sent only with nothing under way.
        needs_idle: fn(&Job) -> bool,
        /// Sent and not yet received.
        under_way: VecDeque<SentToFake>,
        /// "send jobN" and "receive jobN", in order.
        log: Vec<String>,
    }

    /// A measurement sent to `Folding`: the job, its answer, its kernels,
    /// and whether it went with a worker that died.
    type SentToFake = (
        String,
        Result<Checked, JobFailure>,
        Vec<crate::store::KernelResources>,
        bool,
    );

    impl Folding {
        /// A worker that checks, then goes on until the rule in the same
        /// call, as the native worker does; taking measurements sent ahead
        /// where `pipelines`.
        fn going_on(inner: Fake, pipelines: bool) -> Folding {
            Folding {
                inner,
                fold: true,
                then_fails: false,
                goes_on: true,
                calls: HashMap::new(),
                looked_ahead: Vec::new(),
                pipelines,
                dies_once: None,
                needs_idle: |_| false,
                under_way: VecDeque::new(),
                log: Vec::new(),
            }
        }

        /// `check_then_sample`'s answer, as the fake worker gives it.
        fn answer(
            &mut self,
            job: &Job,
            k: &str,
            kind: &str,
            tol: ToleranceFor,
            seed: u64,
            first: FirstBatch,
        ) -> Result<Checked, JobFailure> {
            if !self.fold {
                let check = self.check(job, k, kind, tol, seed)?;
                return Ok(Checked { check, first: None });
            }
            *self.calls.entry("check_then_sample").or_default() += 1;
            let check = self.inner.check(job, k, kind, tol, seed)?;
            let mut take = || {
                self.inner
                    .sample(&job.id, first.count, first.mode)
                    .map(|batch| crate::backend::TimedBatch {
                        batch,
                        wall_ms: 1.0,
                    })
            };
            let batches = if self.then_fails {
                Err(JobFailure::new(
                    FailureClass::LaunchError,
                    "faulted while timing",
                ))
            } else {
                (|| {
                    let mut taken = vec![take()?];
                    // As the native worker goes on: the rule on what it took.
                    if let (true, Some(rule)) = (self.goes_on, first.until) {
                        let mut so_far = Sampling::default();
                        so_far.samples_us.extend(&taken[0].batch.us);
                        so_far.wall_ms += taken[0].wall_ms;
                        while so_far.decide_by(&rule) == Decision::Continue {
                            let t = take()?;
                            so_far.samples_us.extend(&t.batch.us);
                            so_far.wall_ms += t.wall_ms;
                            taken.push(t);
                        }
                    }
                    Ok(taken)
                })()
            };
            Ok(Checked {
                check,
                first: Some(batches),
            })
        }
    }

    impl Folding {
        /// Counts a re-timing's offer to reuse its check and its warm-up by
        /// launches alone; a first measurement warms up by time too (the
        /// protocol's 5 ms).
        fn count_warmup(&mut self, job: &Job, first: &FirstBatch) {
            assert!(first.reuse_check || first.warmup_ms > 0.0, "{}", job.id);
            if first.reuse_check {
                *self.calls.entry("offering to reuse the check").or_default() += 1;
                if first.warmup_ms == 0.0 {
                    *self
                        .calls
                        .entry("re-timing warmed up by launches alone")
                        .or_default() += 1;
                }
            }
        }
    }

    impl Backend for Folding {
        fn describe(
            &mut self,
            shape: &serde_json::Value,
            seed: u64,
        ) -> Result<crate::backend::ShapeFacts, JobFailure> {
            self.inner.describe(shape, seed)
        }
        fn compile(&mut self, job: &Job, k: &str, kind: &str) -> Result<f64, JobFailure> {
            self.inner.compile(job, k, kind)
        }
        fn check(
            &mut self,
            job: &Job,
            k: &str,
            kind: &str,
            tol: ToleranceFor,
            seed: u64,
        ) -> Result<CheckResult, JobFailure> {
            assert!(
                self.under_way.is_empty(),
                "a call waited for while sent ahead"
            );
            *self.calls.entry("check").or_default() += 1;
            self.inner.check(job, k, kind, tol, seed)
        }
        fn check_then_sample(
            &mut self,
            job: &Job,
            k: &str,
            kind: &str,
            tol: ToleranceFor,
            seed: u64,
            first: FirstBatch,
        ) -> Result<Checked, JobFailure> {
            assert!(
                self.under_way.is_empty(),
                "a call waited for while sent ahead"
            );
            *self
                .calls
                .entry("check_then_sample waited for")
                .or_default() += 1;
            self.count_warmup(job, &first);
            if self.dies_once.as_deref() == Some(job.id.as_str()) {
                self.dies_once = None;
                return Err(JobFailure::new(FailureClass::Crash, "worker died"));
            }
            self.answer(job, k, kind, tol, seed, first)
        }
        fn take_kernels(&mut self) -> Vec<crate::store::KernelResources> {
            self.inner.take_kernels()
        }
        fn send_measurement(
            &mut self,
            job: &Job,
            k: &str,
            kind: &str,
            tol: ToleranceFor,
            seed: u64,
            first: FirstBatch,
        ) -> Result<SentAhead, JobFailure> {
            if !self.pipelines {
                return Ok(SentAhead::Declined);
            }
            assert!(
                first.until.is_some(),
                "only requests with a rule that ends them are sent ahead"
            );
            if !self.under_way.is_empty() && (self.needs_idle)(job) {
                return Ok(SentAhead::WhenIdle);
            }
            self.log.push(format!("send {}", job.id));
            self.count_warmup(job, &first);
            let answer = if self.dies_once.as_deref() == Some(job.id.as_str()) {
                self.dies_once = None;
                Err(JobFailure::new(FailureClass::Crash, "worker died"))
            } else {
                self.answer(job, k, kind, tol, seed, first)
            };
            // What the check launched (none where the worker died first).
            let kernels = match &answer {
                Err(_) => Vec::new(),
                Ok(_) => self.inner.take_kernels(),
            };
            self.under_way
                .push_back((job.id.clone(), answer, kernels, false));
            Ok(SentAhead::Sent)
        }
        fn receive_measurement(&mut self) -> Received {
            let (id, checked, kernels, lost) = self.under_way.pop_front().expect("sent");
            self.log.push(format!("receive {id}"));
            if lost {
                return Received::Lost;
            }
            if matches!(&checked, Err(f) if f.class == FailureClass::Crash) {
                // The worker is gone, and what was sent to it after this job.
                for u in &mut self.under_way {
                    u.3 = true;
                }
            }
            Received::Answer { checked, kernels }
        }
        fn look_ahead(&mut self, job: &Job, ahead: &mut dyn FnMut(usize) -> Vec<Job>) {
            let seen = ahead(3).into_iter().map(|j| j.id).collect();
            self.looked_ahead.push((job.id.clone(), seen));
        }
        fn offer_recipe(&mut self, job_id: &str, recipe: serde_json::Value) {
            assert_eq!(recipe, json!({"ok": true, "for": job_id}));
            assert!(
                self.inner.prepared.as_ref().map(|j| j.id.as_str()) != Some(job_id),
                "a recipe offered after its job's check"
            );
            *self.calls.entry("offer_recipe").or_default() += 1;
        }
        fn warmup(&mut self, id: &str, n: u32, ms: f64) -> Result<(), JobFailure> {
            assert!(
                self.under_way.is_empty(),
                "a call waited for while sent ahead"
            );
            *self.calls.entry("warmup").or_default() += 1;
            self.inner.warmup(id, n, ms)
        }
        fn sample(
            &mut self,
            id: &str,
            count: u32,
            mode: SampleMode,
        ) -> Result<SampleBatch, JobFailure> {
            assert!(
                self.under_way.is_empty(),
                "a call waited for while sent ahead"
            );
            *self.calls.entry("sample").or_default() += 1;
            self.inner.sample(id, count, mode)
        }
    }

    type Folded = (
        Vec<JobRecord>,
        Vec<FinalRecord>,
        HashMap<&'static str, usize>,
        Vec<(String, Vec<String>)>,
    );

    fn run_folding(
        strategy: Box<dyn Strategy>,
        fold: bool,
        then_fails: bool,
        compile: Option<&CompileBoard>,
    ) -> Folded {
        run_folding_on(strategy, fold, false, then_fails, compile, None)
    }

    /// `batch`: samples a batch, where not the default protocol's.
    fn run_folding_on(
        strategy: Box<dyn Strategy>,
        fold: bool,
        goes_on: bool,
        then_fails: bool,
        compile: Option<&CompileBoard>,
        batch: Option<u32>,
    ) -> Folded {
        let strategies = Strategies::single(strategy);
        let prior = HashMap::new();
        let mut ctx = context(&strategies, &prior, compile, 2);
        if let Some(b) = batch {
            ctx.protocol.batch = b;
        }
        let mut backend = Folding {
            inner: Fake {
                prepared: None,
                spread: 0.0,
                taken: 0,
                unavailable: IndexMap::new(),
            },
            fold,
            then_fails,
            goes_on,
            calls: HashMap::new(),
            looked_ahead: Vec::new(),
            pipelines: false,
            dies_once: None,
            needs_idle: |_| false,
            under_way: VecDeque::new(),
            log: Vec::new(),
        };
        let (mut jobs, mut finals) = (Vec::new(), Vec::new());
        run_group(&ctx, &mut backend, group(), &mut |e| match e {
            Event::Job(r) => jobs.push(*r),
            Event::Final(f) => finals.push(f),
            Event::Retired(_) | Event::AbPair(_) => unreachable!(),
        });
        (jobs, finals, backend.calls, backend.looked_ahead)
    }

    #[test]
    fn a_check_that_takes_the_first_batch_spares_the_calls_and_not_the_samples() {
        for strategy in [
            || -> Box<dyn Strategy> { Box::new(Grid) },
            || -> Box<dyn Strategy> {
                Box::new(Halving {
                    eta: 3,
                    keep_at_least: 3,
                })
            },
        ] {
            let (plain, plain_finals, plain_calls, _) = run_folding(strategy(), false, false, None);
            let (folded, folded_finals, calls, _) = run_folding(strategy(), true, false, None);
            // The same records, sample for sample.
            type Taken = (String, JobStatus, Option<(u64, f64, f64)>);
            let samples = |jobs: &[JobRecord]| -> Vec<Taken> {
                jobs.iter()
                    .map(|j| {
                        let s = j.stats.as_ref().map(|s| (s.n, s.median_us, s.mean_us));
                        (j.job_id.clone(), j.status, s)
                    })
                    .collect()
            };
            assert_eq!(samples(&plain), samples(&folded));
            let finals = |f: &[FinalRecord]| -> Vec<(String, u64)> {
                f.iter().map(|f| (f.job_id.clone(), f.stats.n)).collect()
            };
            assert_eq!(finals(&plain_finals), finals(&folded_finals));
            // Every check went on by itself: no warm-up call and no plain
            // check; each passing check (one warm-up each, unfolded) spared
            // a batch's call.
            let count = |c: &HashMap<&str, usize>, k: &str| c.get(k).copied().unwrap_or(0);
            assert_eq!(count(&calls, "warmup"), 0, "{calls:?}");
            assert_eq!(count(&calls, "check"), 0, "{calls:?}");
            assert_eq!(
                count(&calls, "check_then_sample"),
                count(&plain_calls, "check"),
                "{calls:?} {plain_calls:?}"
            );
            let passing = count(&plain_calls, "warmup");
            assert!(passing >= 9, "{plain_calls:?}");
            assert_eq!(
                count(&calls, "sample") + passing,
                count(&plain_calls, "sample"),
                "{calls:?} {plain_calls:?}"
            );
        }
    }

    #[test]
    fn a_check_that_goes_on_until_the_rule_spares_every_sample_call_of_a_measurement() {
        type Taken = (String, JobStatus, Option<(u64, f64, f64, bool)>);
        let samples = |jobs: &[JobRecord]| -> Vec<Taken> {
            jobs.iter()
                .map(|j| {
                    let s = j.stats.as_ref().map(|s| {
                        (
                            s.n,
                            s.median_us,
                            s.mean_us,
                            s.flags.contains(&measure::Flag::CapHit),
                        )
                    });
                    (j.job_id.clone(), j.status, s)
                })
                .collect()
        };
        let count = |c: &HashMap<&str, usize>, k: &str| c.get(k).copied().unwrap_or(0);
        // Batches of 8 against the protocol's 20 samples at least: a job
        // takes three batches.
        let run = |strategy: Box<dyn Strategy>, goes_on: bool| {
            run_folding_on(strategy, true, goes_on, false, None, Some(8))
        };
        // Grid: every job a full measurement, so no `sample` call at all
        // (the finalists' re-timing takes its one batch with the check).
        let (plain, plain_finals, plain_calls, _) = run(Box::new(Grid), false);
        let (on, on_finals, calls, _) = run(Box::new(Grid), true);
        assert_eq!(
            samples(&plain),
            samples(&on),
            "the same samples, decided alike"
        );
        assert_eq!(plain_finals.len(), on_finals.len());
        assert!(count(&plain_calls, "sample") > 0, "{plain_calls:?}");
        assert_eq!(count(&calls, "sample"), 0, "{calls:?}");
        // Halving: the survivors' full measurements go on; screening takes
        // its set number of batches, as before.
        let halving = || -> Box<dyn Strategy> {
            Box::new(Halving {
                eta: 3,
                keep_at_least: 3,
            })
        };
        let (plain, _, plain_calls, _) = run(halving(), false);
        let (on, _, calls, _) = run(halving(), true);
        assert_eq!(samples(&plain), samples(&on));
        assert!(
            count(&calls, "sample") < count(&plain_calls, "sample"),
            "{calls:?} {plain_calls:?}"
        );
    }

    #[test]
    fn a_first_batch_that_fails_fails_the_job_and_keeps_its_check() {
        let (jobs, finals, _, _) = run_folding(Box::new(Grid), true, true, None);
        assert!(finals.is_empty());
        for j in &jobs {
            assert_eq!(j.status, JobStatus::Failed, "{}", j.job_id);
            if j.config["B"] == 9 {
                assert_eq!(
                    j.failure.as_ref().unwrap().class,
                    FailureClass::CompileError
                );
                assert!(j.check.is_none());
            } else {
                assert_eq!(j.failure.as_ref().unwrap().class, FailureClass::LaunchError);
                assert!(j.check.as_ref().is_some_and(|c| c.passed), "{}", j.job_id);
                assert!(j.stats.is_none());
            }
        }
    }

    #[test]
    fn a_lane_measures_the_jobs_compiled_first_rather_than_wait_in_order() {
        let board = std::sync::Arc::new(CompileBoard::default());
        for job in group().jobs {
            board.push(job, "k", "triton");
        }
        board.close();
        // job2 takes long to compile; every other job is compiled already.
        let mut slow = None;
        while let Some((job, _, _)) = board.next() {
            if job.id == "job2" {
                slow = Some(job.id);
            } else {
                board.finish(&job.id, Ok(Compiled::in_seconds(0.1)));
            }
        }
        let finisher = {
            let board = std::sync::Arc::clone(&board);
            let slow = slow.expect("job2 was queued");
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                board.finish(&slow, Ok(Compiled::in_seconds(2.0)));
            })
        };
        let (jobs, _) = run(Box::new(Grid), Some(&board));
        finisher.join().unwrap();
        let order: Vec<&str> = jobs.iter().map(|j| j.job_id.as_str()).collect();
        assert_eq!(
            order,
            ["job0", "job1", "job3", "job4", "job5", "job6", "job7", "job8", "job9", "job2"]
        );
        let two = jobs.iter().find(|j| j.job_id == "job2").unwrap();
        assert_eq!((two.status, two.compile_s), (JobStatus::Ok, Some(2.0)));
    }

    /// The backend also gets, before each job's check, the recipe the pool
    /// made with its compile (two jobs here; a third's failed), and nothing
    /// for the others; those two are not among the jobs it may prepare ahead.
    #[test]
    fn a_backend_looks_ahead_at_the_jobs_the_pool_compiled() {
        let board = CompileBoard::default();
        for job in group().jobs {
            board.push(job, "k", "triton");
        }
        board.close();
        while let Some((job, _, _)) = board.next() {
            let result = match job.id.as_str() {
                "job3" => Err(JobFailure::new(FailureClass::Crash, "worker died")),
                "job4" => Err(JobFailure::new(FailureClass::CompileError, "ptxas said no")),
                "job1" | "job6" => Ok(Compiled {
                    seconds: 0.1,
                    recipe: Some(json!({"ok": true, "for": job.id})),
                }),
                // A recipe the pool could not make: neither offered nor kept from look-ahead.
                "job7" => Ok(Compiled {
                    seconds: 0.1,
                    recipe: Some(json!({"ok": false, "class": "problem_error"})),
                }),
                _ => Ok(Compiled::in_seconds(0.1)),
            };
            board.finish(&job.id, result);
        }
        let (_, _, calls, looked) = run_folding(Box::new(Grid), true, false, Some(&board));
        assert_eq!(calls.get("offer_recipe"), Some(&2));
        let after = |id: &str| -> Vec<&str> {
            let (_, seen) = looked.iter().find(|(j, _)| j == id).expect(id);
            seen.iter().map(String::as_str).collect()
        };
        // Jobs not started, in the group's order, that compiled without error.
        // Not job1 and job6: they bring the pool's recipe at their own turn.
        assert_eq!(after("job0"), ["job2", "job5", "job7"]);
        assert_eq!(after("job2"), ["job5", "job7", "job8"]);
        assert_eq!(after("job8"), ["job9"]);
        assert!(after("job9").is_empty());
        // The compile error fails before its check: it looks at nothing.
        assert!(looked.iter().all(|(j, _)| j != "job4"));
        // Without a pool the lane compiles each job at its turn: nothing ahead.
        let (_, _, _, looked) = run_folding(Box::new(Grid), true, false, None);
        assert!(looked.iter().all(|(_, seen)| seen.is_empty()));
    }

    /// The group measured by a folding backend that goes on until the rule
    /// (batches of 8), sending measurements ahead where `pipelines`; returns
    /// the records, the finalists' records and the backend's log.
    fn run_pipelined(
        strategy: Box<dyn Strategy>,
        pipelines: bool,
        dies_once: Option<&str>,
        needs_idle: fn(&Job) -> bool,
    ) -> (Vec<JobRecord>, Vec<FinalRecord>, Vec<String>) {
        let (jobs, finals, log, _) =
            run_pipelined_on(strategy, pipelines, dies_once, needs_idle, None);
        (jobs, finals, log)
    }

    /// `run_pipelined` with the protocol's wall cap at `max_wall_ms` where
    /// given (the fake's batches take 1 ms each); also returns the calls.
    /// What a pipelining run gives: its job records, finalist records, the
    /// backend's log and its count of calls by kind.
    type PipelinedRun = (
        Vec<JobRecord>,
        Vec<FinalRecord>,
        Vec<String>,
        HashMap<&'static str, usize>,
    );

    /// `run_pipelined_with`, re-timing back to back (no rest).
    fn run_pipelined_on(
        strategy: Box<dyn Strategy>,
        pipelines: bool,
        dies_once: Option<&str>,
        needs_idle: fn(&Job) -> bool,
        max_wall_ms: Option<f64>,
    ) -> PipelinedRun {
        run_pipelined_with(strategy, pipelines, dies_once, needs_idle, max_wall_ms, 0.0)
    }

    fn run_pipelined_with(
        strategy: Box<dyn Strategy>,
        pipelines: bool,
        dies_once: Option<&str>,
        needs_idle: fn(&Job) -> bool,
        max_wall_ms: Option<f64>,
        retime_rest: f64,
    ) -> PipelinedRun {
        let strategies = Strategies::single(strategy);
        let prior = HashMap::new();
        let mut ctx = context(&strategies, &prior, None, 2);
        ctx.protocol.batch = 8;
        ctx.protocol.retime_rest = retime_rest;
        if let Some(cap) = max_wall_ms {
            ctx.protocol.max_wall_ms = cap;
        }
        let mut backend = Folding {
            dies_once: dies_once.map(str::to_string),
            needs_idle,
            ..Folding::going_on(
                Fake {
                    prepared: None,
                    spread: 0.0,
                    taken: 0,
                    unavailable: IndexMap::new(),
                },
                pipelines,
            )
        };
        let (mut jobs, mut finals) = (Vec::new(), Vec::new());
        run_group(&ctx, &mut backend, group(), &mut |e| match e {
            Event::Job(r) => jobs.push(*r),
            Event::Final(f) => finals.push(f),
            Event::Retired(_) | Event::AbPair(_) => unreachable!(),
        });
        assert!(backend.under_way.is_empty(), "everything sent was received");
        (jobs, finals, backend.log, backend.calls)
    }

    type Outcome = (JobStatus, Option<(u64, f64, f64, bool)>, usize);

    /// Each job's status, samples and kernels, by job.
    fn outcomes(jobs: &[JobRecord]) -> std::collections::BTreeMap<String, Outcome> {
        jobs.iter()
            .map(|j| {
                let s = j.stats.as_ref().map(|s| {
                    (
                        s.n,
                        s.median_us,
                        s.mean_us,
                        s.flags.contains(&measure::Flag::CapHit),
                    )
                });
                (j.job_id.clone(), (j.status, s, j.kernels.len()))
            })
            .collect()
    }

    /// The group under racing (5 %), its samples spread ±3 % so that an
    /// unraced job needs over a hundred to converge: measured by the plain
    /// fake (each call waited for), or by a folding one that goes on until
    /// the rule and takes measurements sent ahead (`pipelines`). Returns
    /// the records by job: samples, and whether flagged OUTPACED.
    fn run_raced(folding: Option<bool>) -> std::collections::BTreeMap<String, (u64, bool)> {
        let strategies = Strategies::single(Box::new(Grid));
        let prior = HashMap::new();
        let mut ctx = context(&strategies, &prior, None, 2);
        ctx.protocol.race = 0.05;
        let inner = Fake {
            prepared: None,
            spread: 0.03,
            taken: 0,
            unavailable: IndexMap::new(),
        };
        let mut plain;
        let mut folded;
        let backend: &mut dyn Backend = match folding {
            None => {
                plain = inner;
                &mut plain
            }
            Some(pipelines) => {
                ctx.protocol.batch = 8;
                folded = Folding::going_on(inner, pipelines);
                &mut folded
            }
        };
        let mut jobs = Vec::new();
        run_group(&ctx, backend, group(), &mut |e| {
            if let Event::Job(r) = e {
                jobs.push(*r);
            }
        });
        jobs.iter()
            .filter_map(|j| {
                let s = j.stats.as_ref()?;
                Some((
                    j.job_id.clone(),
                    (s.n, s.flags.contains(&measure::Flag::Outpaced)),
                ))
            })
            .collect()
    }

    #[test]
    fn racing_stops_jobs_clearly_slower_than_the_best_so_far_at_min_samples() {
        let outpaced = |runs: &std::collections::BTreeMap<String, (u64, bool)>| -> Vec<String> {
            runs.iter()
                .filter(|(_, (_, o))| *o)
                .map(|(id, _)| id.clone())
                .collect()
        };
        // Each call waited for: the grid meets B = 5 (100 us) before 6, 7
        // and 8 (110 to 130 us, over 105), which stop at min_samples (20,
        // the first batch under racing). The baseline (B = 0, 150 us) is never
        // raced, and 1 to 4 were each the best so far, or within 5 % of it.
        let waited = run_raced(None);
        assert_eq!(outpaced(&waited), ["job6", "job7", "job8"]);
        for (id, (n, o)) in &waited {
            if *o {
                assert_eq!(*n, 20, "{id}");
            } else {
                assert!(*n > 50, "{id} converged on its own: {n} samples");
            }
        }
        // A worker that goes on by the rule (batches of 8) stops where the
        // lane would, at the first batch past min_samples.
        let folded = run_raced(Some(false));
        assert_eq!(outpaced(&folded), ["job6", "job7", "job8"]);
        assert!(folded.values().all(|(n, o)| !*o || *n == 24), "{folded:?}");
        // Sent ahead, a job races against what was read before it was sent:
        // job6 went before job5's answer (B = 4's 110 us the best then, and
        // job6 within 5 % of it); job7 and job8 after.
        let ahead = run_raced(Some(true));
        assert_eq!(outpaced(&ahead), ["job7", "job8"]);
        assert!(ahead["job6"].0 > 50);
    }

    #[test]
    fn a_lane_sends_the_next_measurement_before_it_records_the_last() {
        for strategy in [
            || -> Box<dyn Strategy> { Box::new(Grid) },
            || -> Box<dyn Strategy> {
                Box::new(Halving {
                    eta: 3,
                    keep_at_least: 3,
                })
            },
        ] {
            let (plain, plain_finals, plain_log) =
                run_pipelined(strategy(), false, None, |_| false);
            let (ahead, ahead_finals, log) = run_pipelined(strategy(), true, None, |_| false);
            assert!(plain_log.is_empty());
            assert_eq!(outcomes(&plain), outcomes(&ahead), "the same records");
            assert_eq!(plain.len(), ahead.len(), "each job recorded once");
            let final_samples = |f: &[FinalRecord]| -> Vec<(String, u64)> {
                f.iter().map(|f| (f.job_id.clone(), f.stats.n)).collect()
            };
            assert_eq!(final_samples(&plain_finals), final_samples(&ahead_finals));
            // Each job's request went out before the one before it was
            // received, and never more than two were under way.
            let mut under_way = 0usize;
            let mut most = 0;
            for entry in &log {
                if entry.starts_with("send") {
                    under_way += 1;
                } else {
                    under_way -= 1;
                }
                most = most.max(under_way);
            }
            assert_eq!(most, UNDER_WAY, "{log:?}");
            let sends = log.iter().filter(|e| e.starts_with("send")).count();
            assert!(sends >= 3, "{log:?}");
        }
    }

    /// Halving that screens the group's ten jobs in three rounds (1, 2 and
    /// 4 batches) before its finalists.
    fn halving() -> Box<dyn Strategy> {
        Box::new(Halving {
            eta: 2,
            keep_at_least: 2,
        })
    }

    #[test]
    fn halving_sends_its_screening_rounds_ahead() {
        let (plain, _, _) = run_pipelined(halving(), false, None, |_| false);
        let (ahead, _, log) = run_pipelined(halving(), true, None, |_| false);
        assert_eq!(outcomes(&plain), outcomes(&ahead), "the same records");
        // Every job screened went out ahead, the pruned ones included (a
        // screening request takes its set number of batches in one call).
        let pruned: Vec<&str> = ahead
            .iter()
            .filter(|j| j.status == JobStatus::Pruned)
            .map(|j| j.job_id.as_str())
            .collect();
        assert!(pruned.len() >= 3, "{ahead:?}");
        for id in &pruned {
            assert!(log.contains(&format!("send {id}")), "{id}: {log:?}");
        }
        // Survivors of the first round are screened again, ahead.
        let sends = |id: &str| log.iter().filter(|e| **e == format!("send {id}")).count();
        let finalists: Vec<&str> = ahead
            .iter()
            .filter(|j| j.status == JobStatus::Ok)
            .map(|j| j.job_id.as_str())
            .collect();
        assert!(!finalists.is_empty());
        for id in finalists {
            assert!(
                sends(id) >= 4,
                "{id}: screened three times and measured: {log:?}"
            );
        }
    }

    /// Three re-timing checks per finalist offered to reuse the verdict,
    /// and `by_launches` of them warmed up by launches alone (`Folding`'s
    /// counts).
    fn assert_retiming_calls(
        calls: &HashMap<&'static str, usize>,
        finalists: usize,
        by_launches: usize,
    ) {
        let count = |k: &str| calls.get(k).copied().unwrap_or(0);
        assert_eq!(
            count("offering to reuse the check"),
            3 * finalists,
            "{calls:?}"
        );
        assert_eq!(
            count("re-timing warmed up by launches alone"),
            by_launches,
            "{calls:?}"
        );
    }

    /// Each finalist's (job, samples, median), by job.
    fn final_samples(f: &[FinalRecord]) -> Vec<(String, u64, f64)> {
        let mut v: Vec<_> = f
            .iter()
            .map(|f| (f.job_id.clone(), f.stats.n, f.stats.median_us))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[test]
    fn the_finalists_re_timing_is_sent_ahead_too() {
        let (plain, plain_finals, _, _) =
            run_pipelined_on(Box::new(Grid), false, None, |_| false, None);
        let (ahead, finals, log, calls) =
            run_pipelined_on(Box::new(Grid), true, None, |_| false, None);
        assert_eq!(outcomes(&plain), outcomes(&ahead));
        assert!(!finals.is_empty());
        assert_eq!(final_samples(&plain_finals), final_samples(&finals));
        // No call waited for: each finalist's three re-timing checks went
        // out ahead, after its measurement.
        let count = |k: &str| calls.get(k).copied().unwrap_or(0);
        assert_eq!(count("check_then_sample waited for"), 0, "{calls:?}");
        for f in &finals {
            let sends = log
                .iter()
                .filter(|e| **e == format!("send {}", f.job_id))
                .count();
            assert_eq!(sends, 1 + 3, "{}: {log:?}", f.job_id);
        }
        // The re-timing checks, and only they, offer to reuse the verdict
        // of the finalist's first check; back to back, they warm up by
        // launches alone.
        assert_retiming_calls(&calls, finals.len(), 3 * finals.len());
    }

    #[test]
    fn a_rested_re_timing_waits_for_each_batch_and_idles_after_it() {
        let (_, plain_finals, _, _) = run_pipelined_on(Box::new(Grid), true, None, |_| false, None);
        let started = Instant::now();
        let (_, finals, log, calls) =
            run_pipelined_with(Box::new(Grid), true, None, |_| false, None, 2.0);
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        assert!(!finals.is_empty());
        assert_eq!(
            final_samples(&plain_finals),
            final_samples(&finals),
            "the same batches"
        );
        // Each finalist's three re-timing checks were waited for, none sent
        // ahead, and the lane idled twice each batch's kernel time after it.
        let count = |k: &str| calls.get(k).copied().unwrap_or(0);
        assert_eq!(
            count("check_then_sample waited for"),
            3 * finals.len(),
            "{calls:?}"
        );
        for f in &finals {
            let sends = log
                .iter()
                .filter(|e| **e == format!("send {}", f.job_id))
                .count();
            assert_eq!(
                sends, 1,
                "{}: measured ahead, re-timed waited for: {log:?}",
                f.job_id
            );
        }
        // Each waited-for re-timing check, and no other, offers to reuse
        // the verdict of the finalist's first check; resting after each
        // batch, each keeps the whole warm-up.
        assert_retiming_calls(&calls, finals.len(), 0);
        let kernel_ms: f64 = finals
            .iter()
            .map(|f| f.stats.mean_us * f.stats.n as f64 / 1e3)
            .sum();
        assert!(kernel_ms > 1.0, "{kernel_ms}");
        assert!(
            elapsed_ms >= 2.0 * kernel_ms,
            "{elapsed_ms} ms against {kernel_ms} ms of kernels"
        );
    }

    #[test]
    fn screening_cut_short_by_the_wall_cap_takes_the_rest_itself() {
        // A 1.5 ms cap stops the worker after two of the fake's 1 ms
        // batches; the third round asks for four.
        let cap = Some(1.5);
        let (plain, _, _, plain_calls) = run_pipelined_on(halving(), false, None, |_| false, cap);
        let (ahead, _, log, calls) = run_pipelined_on(halving(), true, None, |_| false, cap);
        assert_eq!(outcomes(&plain), outcomes(&ahead), "the same samples");
        // The short screenings were sent ahead as without the cap, then
        // topped up.
        let (_, _, uncapped_log, _) = run_pipelined_on(halving(), true, None, |_| false, None);
        let sends = |log: &[String]| log.iter().filter(|e| e.starts_with("send")).count();
        assert_eq!(sends(&log), sends(&uncapped_log), "{log:?}");
        let count = |c: &HashMap<&str, usize>, k: &str| c.get(k).copied().unwrap_or(0);
        let waited = count(&calls, "check_then_sample waited for");
        // The third round's screenings came back two batches short: each
        // was asked again, waited for, for the batches left (the
        // finalists' re-timing waits for its calls too).
        let (_, _, _, uncapped) = run_pipelined_on(halving(), true, None, |_| false, None);
        let waited_uncapped = count(&uncapped, "check_then_sample waited for");
        assert!(waited > waited_uncapped, "{calls:?} {uncapped:?} {log:?}");
        assert!(count(&plain_calls, "check_then_sample waited for") > waited);
    }

    #[test]
    fn a_screening_lost_with_its_worker_is_screened_again() {
        // job3's first screening kills the worker while job4's waits in
        // its pipe; waited for, job3's check kills it alone.
        let (plain, _, _) = run_pipelined(halving(), false, Some("job3"), |_| false);
        let (ahead, _, log) = run_pipelined(halving(), true, Some("job3"), |_| false);
        let send4 = log.iter().position(|e| e == "send job4").unwrap();
        let receive3 = log.iter().position(|e| e == "receive job3").unwrap();
        assert!(send4 < receive3, "{log:?}");
        let ids: std::collections::BTreeSet<&str> =
            ahead.iter().map(|j| j.job_id.as_str()).collect();
        assert_eq!((ahead.len(), ids.len()), (10, 10), "each job recorded once");
        let job3 = ahead.iter().find(|j| j.job_id == "job3").unwrap();
        assert_eq!(job3.failure.as_ref().unwrap().class, FailureClass::Crash);
        // job4 went with the worker: screened again, waited for, after the
        // rest of the round, and kept in its place in the round's order, so
        // halving ranks and prunes exactly as when every call is waited for
        // (job3 aside: which kernels a crashed check reports is the fake's).
        let (mut plain, mut ahead) = (outcomes(&plain), outcomes(&ahead));
        assert_eq!(plain.remove("job3").unwrap().0, JobStatus::Failed);
        ahead.remove("job3");
        assert_eq!(plain, ahead);
    }

    #[test]
    fn a_measurement_lost_with_its_worker_is_measured_again() {
        let (plain, _, _) = run_pipelined(Box::new(Grid), false, None, |_| false);
        // job3's check kills the worker while job4's request waits for it.
        let (ahead, _, log) = run_pipelined(Box::new(Grid), true, Some("job3"), |_| false);
        let send4 = log.iter().position(|e| e == "send job4").unwrap();
        let receive3 = log.iter().position(|e| e == "receive job3").unwrap();
        assert!(send4 < receive3, "{log:?}");
        assert_eq!(ahead.len(), 10, "each job recorded once");
        let job3 = ahead.iter().find(|j| j.job_id == "job3").unwrap();
        assert_eq!(job3.status, JobStatus::Failed);
        assert_eq!(job3.failure.as_ref().unwrap().class, FailureClass::Crash);
        // job4 went with the worker: measured again, last, waited for, with
        // the samples it would have had.
        assert_eq!(ahead.last().unwrap().job_id, "job4");
        let mut want = outcomes(&plain);
        want.remove("job3");
        let mut got = outcomes(&ahead);
        got.remove("job3");
        assert_eq!(want, got);
        // job3's record came before those of the answers read after it.
        let at = |id: &str| ahead.iter().position(|j| j.job_id == id).unwrap();
        assert!(at("job3") < at("job5"));
        // The lane went on sending ahead after the loss: job6 before job5's
        // answer was read.
        let at_log = |e: &str| log.iter().position(|x| x == e).unwrap();
        assert!(at_log("receive job4") < at_log("send job5"), "{log:?}");
        assert!(at_log("send job6") < at_log("receive job5"), "{log:?}");
    }

    #[test]
    fn a_job_that_needs_calls_of_its_own_is_sent_with_nothing_under_way() {
        let (plain, _, _) = run_pipelined(Box::new(Grid), false, None, |_| false);
        // Every fourth job needs its recipe first, as a batch of recipes does.
        let needs = |j: &Job| j.config["B"].as_u64().unwrap() % 4 == 0;
        let (ahead, _, log) = run_pipelined(Box::new(Grid), true, None, needs);
        assert_eq!(outcomes(&plain), outcomes(&ahead), "the same records");
        let mut under_way = 0usize;
        for entry in &log {
            match entry.strip_prefix("send ") {
                Some(id) => {
                    let b: u64 = id.trim_start_matches("job").parse().unwrap();
                    if b % 4 == 0 {
                        assert_eq!(under_way, 0, "{id} sent with others under way: {log:?}");
                    }
                    under_way += 1;
                }
                None => under_way -= 1,
            }
        }
        // And the jobs between were sent ahead.
        let at_log = |e: &str| log.iter().position(|x| x == e).unwrap();
        assert!(at_log("send job2") < at_log("receive job1"), "{log:?}");
    }
}
