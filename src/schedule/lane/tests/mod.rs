//! The lane against a fake backend whose kernel time is a function of the
//! config, running the real strategies: the fakes (`Fake`, and `Folding`,
//! which folds warm-up and first batch into the check as the workers do)
//! and the measured path's tests here; a lane's retirement in `health.rs`;
//! checks that take batches, measurements sent ahead, racing and
//! re-timing in `measured_ahead.rs`.

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

mod health;
mod measured_ahead;
