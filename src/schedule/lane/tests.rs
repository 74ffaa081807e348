//! The lane against a fake backend whose kernel time is a function of the
//! config, running the real strategies.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use super::ahead::UNDER_WAY;
use super::retime::rest_after;
use super::*;
use crate::backend::{Checked, Compiled, FirstBatch, Received, SampleBatch, SentAhead};
use crate::manifest::ToleranceFor;
use crate::measure::{Decision, Timer};
use crate::search::{Halving, Surrogate};
use crate::store::{CheckResult, FinalRecord};
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
        && j.failure.as_ref().is_some_and(
            |f| f.class == FailureClass::Unavailable && f.message == "vLLM is not installed"
        )));
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
    let (jobs, finals, log, _) = run_pipelined_on(strategy, pipelines, dies_once, needs_idle, None);
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
        let (plain, plain_finals, plain_log) = run_pipelined(strategy(), false, None, |_| false);
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
    let (ahead, finals, log, calls) = run_pipelined_on(Box::new(Grid), true, None, |_| false, None);
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
    let ids: std::collections::BTreeSet<&str> = ahead.iter().map(|j| j.job_id.as_str()).collect();
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
