//! One GPU lane: a backend that owns one device, taking (shape, method)
//! groups and turning every job into a record. Timed work on a device never
//! overlaps, because one lane owns it.

use std::collections::HashMap;

use indexmap::IndexMap;
use std::time::Instant;

use crate::backend::{Backend, Flush, JobFailure};
use crate::manifest::model::{shape_dtype, Tolerance};
use crate::manifest::raw::{RawProtocol, Strategy};
use crate::measure::{self, Decision, Sampling};
use crate::plan::Job;
use crate::store::{FailureClass, FinalRecord, JobRecord, JobStatus, Stats};

use super::compile::CompileBoard;
use super::{now_rfc3339, Event, Group, RunMode};

pub struct LaneContext<'a> {
    pub protocol: RawProtocol,
    pub tolerance: Tolerance,
    pub strategy: Strategy,
    pub eta: u32,
    pub run_mode: RunMode,
    pub flush: Flush,
    pub peak_gbs: f64,
    pub peak_tflops: &'a dyn Fn(Option<&str>) -> f64,
    pub compile: Option<&'a CompileBoard>,
    pub lane: u32,
    /// `search.budget`: configs per group for the surrogate search.
    pub budget: Option<u64>,
    /// `search.seed`: the surrogate's first pick.
    pub search_seed: u64,
    /// What earlier runs measured, by `group_key`: a resumed surrogate search
    /// counts those against its budget and learns from them.
    pub prior: Option<&'a HashMap<String, Vec<PriorObservation>>>,
}

/// A config an earlier run measured (or saw fail) in the same group.
pub struct PriorObservation {
    pub config: IndexMap<String, serde_json::Value>,
    /// ln of the median time in µs; None for a failure.
    pub ln_median_us: Option<f64>,
}

/// What an earlier run of a surrogate search measured, by group: every
/// measured or failed non-baseline job of `records`.
pub fn prior_observations(records: &[JobRecord]) -> HashMap<String, Vec<PriorObservation>> {
    let mut map: HashMap<String, Vec<PriorObservation>> = HashMap::new();
    for r in records.iter().filter(|r| !r.baseline) {
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
pub fn group_key(method: &str, shape: &crate::manifest::Shape) -> String {
    format!(
        "{method}\u{1}{}",
        serde_json::to_string(shape).expect("shape serialises")
    )
}

/// A job's progress through the lane before it becomes a record.
struct Measured {
    job: Job,
    kernel: String,
    kind: String,
    sampling: Sampling,
    check: Option<crate::store::CheckResult>,
    compile_s: Option<f64>,
    started: Instant,
}

impl Measured {
    fn new(job: Job, kernel: &str, kind: &str) -> Measured {
        Measured {
            job,
            kernel: kernel.to_string(),
            kind: kind.to_string(),
            sampling: Sampling::default(),
            check: None,
            compile_s: None,
            started: Instant::now(),
        }
    }
}

pub fn run_group(
    ctx: &LaneContext,
    backend: &mut dyn Backend,
    group: Group,
    emit: &mut dyn FnMut(Event),
) {
    let group_started = Instant::now();
    let track = format!("lane{} jobs", ctx.lane);
    let group_args = serde_json::json!({
        "shape": group.shape, "method": group.method, "jobs": group.jobs.len(),
    });
    run_group_inner(ctx, backend, group, &track, emit);
    crate::trace::span(&track, "group", group_started, group_args);
}

fn run_group_inner(
    ctx: &LaneContext,
    backend: &mut dyn Backend,
    group: Group,
    track: &str,
    emit: &mut dyn FnMut(Event),
) {
    let shape = serde_json::to_value(&group.shape).expect("shape");
    let (flops, bytes) = match backend.describe(&shape, ctx.protocol.seed) {
        Ok(fb) => (Some(fb.0), Some(fb.1)),
        Err(_) => (None, None),
    };
    let record = |m: &Measured,
                  status: JobStatus,
                  failure: Option<JobFailure>,
                  stats: Option<Stats>|
     -> JobRecord {
        let time_s = stats
            .as_ref()
            .map(|s| s.median_us * 1e-6)
            .filter(|t| *t > 0.0);
        let dtype = shape_dtype(&m.job.shape);
        let peak_flops = (ctx.peak_tflops)(dtype) * 1e12;
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
            kind: m.kind.clone(),
            kernel: m.kernel.clone(),
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
            duration_s: m.started.elapsed().as_secs_f64(),
            lane: ctx.lane,
            finished_at: now_rfc3339(),
        }
    };

    // Every job ends as exactly one record, sent to the journal's writer.
    let mut finish =
        |m: &Measured, status: JobStatus, failure: Option<JobFailure>, stats: Option<Stats>| {
            emit(Event::Job(Box::new(record(m, status, failure, stats))))
        };
    let mut alive: Vec<Measured> = Vec::new();
    let surrogate = ctx.strategy == Strategy::Surrogate && ctx.run_mode == RunMode::Tune;
    let jobs = if surrogate {
        alive = surrogate_search(
            ctx,
            backend,
            group.jobs,
            &group.kernel,
            &group.kind,
            track,
            &mut finish,
        );
        Vec::new()
    } else {
        group.jobs
    };
    for job in jobs {
        if super::interrupted() {
            return;
        }
        let mut m = Measured::new(job, &group.kernel, &group.kind);
        if let Err(f) = wait_for_compile(ctx, &mut m, track) {
            finish(&m, JobStatus::Failed, Some(f), None);
            continue;
        }
        if let Err(f) = prepare(ctx, backend, &mut m) {
            finish(&m, JobStatus::Failed, Some(f), None);
            continue;
        }
        if ctx.run_mode == RunMode::Check {
            finish(&m, JobStatus::Checked, None, None);
            continue;
        }
        let screening = ctx.strategy == Strategy::Halving && ctx.run_mode == RunMode::Tune;
        let result = if screening {
            sample_batches(ctx, backend, &mut m, 1)
        } else {
            sample_adaptive(ctx, backend, &mut m)
        };
        match result {
            Err(f) => finish(&m, JobStatus::Failed, Some(f), None),
            Ok(capped) if !screening => {
                let stats = m.sampling.stats(capped);
                finish(&m, JobStatus::Ok, None, Some(stats));
                alive.push(m);
            }
            Ok(_) => alive.push(m),
        }
    }

    if ctx.strategy == Strategy::Halving && ctx.run_mode == RunMode::Tune {
        // Successive halving: keep the best 1/eta each round, giving survivors
        // eta times more samples, until only the finalists remain; those are
        // then measured with the full protocol.
        let keep_at_least = (ctx.protocol.finalists as usize).max(1);
        let mut round = 1u32;
        let baselines = alive.iter().filter(|m| m.job.baseline).count();
        while alive.len() > keep_at_least + baselines {
            if super::interrupted() {
                return;
            }
            alive.sort_by(|a, b| median(&a.sampling).total_cmp(&median(&b.sampling)));
            let keep = alive.len().div_ceil(ctx.eta as usize).max(keep_at_least);
            // The baseline is what every result is compared with: it is never pruned.
            let ranked: Vec<(usize, Measured)> = alive.drain(..).enumerate().collect();
            let (survivors, dropped): (Vec<_>, Vec<_>) = ranked
                .into_iter()
                .partition(|(rank, m)| *rank < keep || m.job.baseline);
            alive = survivors.into_iter().map(|(_, m)| m).collect();
            for (_, m) in dropped {
                let stats = m.sampling.stats(false);
                finish(&m, JobStatus::Pruned, None, Some(stats));
            }
            if alive.len() <= keep_at_least + baselines {
                break;
            }
            round += 1;
            let batches = (ctx.eta as usize).pow(round - 1).min(16);
            let mut next = Vec::new();
            for mut m in alive.drain(..) {
                match prepare(ctx, backend, &mut m)
                    .and_then(|_| sample_batches(ctx, backend, &mut m, batches))
                {
                    Ok(_) => next.push(m),
                    Err(f) => finish(&m, JobStatus::Failed, Some(f), None),
                }
            }
            alive = next;
        }
        let mut done = Vec::new();
        for mut m in alive.drain(..) {
            m.sampling = Sampling::default();
            match prepare(ctx, backend, &mut m).and_then(|_| sample_adaptive(ctx, backend, &mut m))
            {
                Ok(capped) => {
                    let stats = m.sampling.stats(capped);
                    finish(&m, JobStatus::Ok, None, Some(stats));
                    done.push(m);
                }
                Err(f) => finish(&m, JobStatus::Failed, Some(f), None),
            }
        }
        alive = done;
    }

    if ctx.run_mode == RunMode::Tune
        && alive.len() >= 2
        && ctx.protocol.finalists >= 2
        && !super::interrupted()
    {
        retime_finalists(ctx, backend, alive, emit);
    }
}

/// Turns a job's outcome into its record and sends it on.
type RecordJob<'a> = dyn FnMut(&Measured, JobStatus, Option<JobFailure>, Option<Stats>) + 'a;

/// The model-based search over one group: baselines first, then a maximin
/// initial design, then one config at a time by expected improvement under a
/// Gaussian-process surrogate (see `crate::search`), each measured fully,
/// until the budget is spent. The rest are recorded as skipped. Returns the
/// jobs measured successfully, for the finalists' re-timing.
fn surrogate_search(
    ctx: &LaneContext,
    backend: &mut dyn Backend,
    jobs: Vec<Job>,
    kernel: &str,
    kind: &str,
    track: &str,
    finish: &mut RecordJob,
) -> Vec<Measured> {
    let new = |job: Job| Measured::new(job, kernel, kind);
    let mut alive = Vec::new();
    let (baselines, candidates): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| j.baseline);
    for job in baselines {
        if super::interrupted() {
            return alive;
        }
        let mut m = new(job);
        match measure_fully(ctx, backend, &mut m, track) {
            Ok(capped) => {
                finish(&m, JobStatus::Ok, None, Some(m.sampling.stats(capped)));
                alive.push(m);
            }
            Err(f) => finish(&m, JobStatus::Failed, Some(f), None),
        }
    }
    if candidates.is_empty() {
        return alive;
    }
    // Configs an earlier run of this group measured: resuming continues the
    // same search rather than starting a new one with a fresh budget.
    let prior: &[PriorObservation] = ctx
        .prior
        .and_then(|p| p.get(&group_key(&candidates[0].method, &candidates[0].shape)))
        .map_or(&[], Vec::as_slice);
    let configs: Vec<&IndexMap<String, serde_json::Value>> = candidates
        .iter()
        .map(|j| &j.config)
        .chain(prior.iter().map(|p| &p.config))
        .collect();
    let x = crate::search::features(&configs);
    let group_size = candidates.len() + prior.len();
    let budget = ctx
        .budget
        .map(|b| b as usize)
        .unwrap_or_else(|| crate::search::default_budget(group_size))
        .min(group_size);
    let design = crate::search::initial_design_size(budget);
    let n_candidates = candidates.len();
    let mut slots: Vec<Option<Job>> = candidates.into_iter().map(Some).collect();
    let mut rest: Vec<usize> = (0..n_candidates).collect();
    // Indices into `x`: candidates first, then the earlier run's configs.
    let mut chosen: Vec<usize> = (n_candidates..group_size).collect();
    // (index, ln median µs) of measured configs; failures get a penalty when the model is fitted.
    let mut seen: Vec<(usize, Option<f64>)> = prior
        .iter()
        .enumerate()
        .map(|(i, p)| (n_candidates + i, p.ln_median_us))
        .collect();
    // Seeded per group (by its first candidate's id), so groups do not all start alike.
    let first_id = slots[0].as_ref().map(|j| j.id.clone()).unwrap_or_default();
    let mut rng = crate::plan::SplitMix64::new(ctx.search_seed ^ crate::plan::hash_str(&first_id));
    while chosen.len() < budget && !super::interrupted() {
        let next = if chosen.is_empty() {
            rest[rng.below(rest.len() as u64) as usize]
        } else if chosen.len() < design {
            crate::search::farthest(&x, &chosen, &rest).expect("candidates left")
        } else {
            let worst = seen
                .iter()
                .filter_map(|(_, y)| *y)
                .fold(f64::NEG_INFINITY, f64::max);
            let penalty = if worst.is_finite() { worst + 1.0 } else { 0.0 };
            let observed: Vec<(usize, f64)> = seen
                .iter()
                .map(|(i, y)| (*i, y.unwrap_or(penalty)))
                .collect();
            crate::search::next_by_ei(&x, &observed, &rest).expect("candidates left")
        };
        rest.retain(|&i| i != next);
        chosen.push(next);
        let mut m = new(slots[next].take().expect("each config is picked once"));
        match measure_fully(ctx, backend, &mut m, track) {
            Ok(capped) => {
                let stats = m.sampling.stats(capped);
                // A median that is not a positive time says nothing about speed.
                let y = (stats.median_us.is_finite() && stats.median_us > 0.0)
                    .then(|| stats.median_us.ln());
                seen.push((next, y));
                finish(&m, JobStatus::Ok, None, Some(stats));
                alive.push(m);
            }
            Err(f) => {
                seen.push((next, None));
                finish(&m, JobStatus::Failed, Some(f), None);
            }
        }
    }
    if super::interrupted() {
        return alive; // unmeasured configs stay unrecorded and run on resume
    }
    for job in slots.into_iter().flatten() {
        if let Some(board) = ctx.compile {
            board.cancel(&job.id);
        }
        finish(&new(job), JobStatus::Skipped, None, None);
    }
    alive
}

/// Wait for the job's compile, check, warm up and time it with the full protocol.
fn measure_fully(
    ctx: &LaneContext,
    backend: &mut dyn Backend,
    m: &mut Measured,
    track: &str,
) -> Result<bool, JobFailure> {
    wait_for_compile(ctx, m, track)?;
    prepare(ctx, backend, m)?;
    sample_adaptive(ctx, backend, m)
}

/// The compile pool's result for the job (waiting while it compiles); a job
/// the pool has not reached is left for `prepare` to compile in the lane.
fn wait_for_compile(ctx: &LaneContext, m: &mut Measured, track: &str) -> Result<(), JobFailure> {
    let Some(board) = ctx.compile else {
        return Ok(());
    };
    let waited = Instant::now();
    let compiled = board.wait(&m.job.id);
    crate::trace::span(
        track,
        "wait for compile",
        waited,
        serde_json::json!({"job": m.job.id}),
    );
    match compiled {
        Some(Ok(s)) => {
            m.compile_s = Some(s);
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

fn median(s: &Sampling) -> f64 {
    measure::quantile(&measure::sorted(&s.samples_us), 0.5)
}

/// Check (fresh inputs, poisoned output, compare) and warm up.
fn prepare(
    ctx: &LaneContext,
    backend: &mut dyn Backend,
    m: &mut Measured,
) -> Result<(), JobFailure> {
    let tol = ctx.tolerance.for_dtype(shape_dtype(&m.job.shape));
    let check = backend.check(&m.job, &m.kernel, &m.kind, tol, ctx.protocol.seed)?;
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
    if ctx.run_mode != RunMode::Check {
        backend.warmup(
            &m.job.id,
            ctx.protocol.warmup_launches,
            ctx.protocol.warmup_ms,
        )?;
    }
    Ok(())
}

fn take_batch(
    ctx: &LaneContext,
    backend: &mut dyn Backend,
    m: &mut Measured,
) -> Result<(), JobFailure> {
    let start = Instant::now();
    let batch = backend.sample(&m.job.id, ctx.protocol.batch, ctx.flush)?;
    m.sampling.wall_ms += start.elapsed().as_secs_f64() * 1e3;
    m.sampling.samples_us.extend(batch.us);
    m.sampling.timer = batch.timer;
    if let Some(c) = batch.sm_clock_mhz {
        m.sampling.clocks_mhz.push(c);
    }
    Ok(())
}

fn sample_batches(
    ctx: &LaneContext,
    backend: &mut dyn Backend,
    m: &mut Measured,
    batches: usize,
) -> Result<bool, JobFailure> {
    for _ in 0..batches {
        take_batch(ctx, backend, m)?;
    }
    Ok(false)
}

/// Batches until the stopping rule says enough; returns whether a cap stopped it.
fn sample_adaptive(
    ctx: &LaneContext,
    backend: &mut dyn Backend,
    m: &mut Measured,
) -> Result<bool, JobFailure> {
    loop {
        take_batch(ctx, backend, m)?;
        match m.sampling.decide(&ctx.protocol) {
            Decision::Continue => {}
            Decision::Converged => return Ok(false),
            Decision::Capped => return Ok(true),
        }
    }
}

/// The best few configs of a group, re-timed interleaved in shuffled order so
/// that clock and thermal drift hit them alike.
fn retime_finalists(
    ctx: &LaneContext,
    backend: &mut dyn Backend,
    mut alive: Vec<Measured>,
    emit: &mut dyn FnMut(Event),
) {
    alive.sort_by(|a, b| median(&a.sampling).total_cmp(&median(&b.sampling)));
    alive.truncate(ctx.protocol.finalists as usize);
    let mut samples: HashMap<String, Sampling> = HashMap::new();
    let mut rng = crate::plan::SplitMix64::new(ctx.protocol.seed ^ 0x5eed);
    const ROUNDS: usize = 3;
    for _ in 0..ROUNDS {
        let mut order: Vec<usize> = (0..alive.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for &i in &order {
            let m = &mut alive[i];
            let before = std::mem::take(&mut m.sampling);
            let ok = prepare(ctx, backend, m).and_then(|_| take_batch(ctx, backend, m));
            let got = std::mem::replace(&mut m.sampling, before);
            if ok.is_ok() {
                let acc = samples.entry(m.job.id.clone()).or_default();
                acc.samples_us.extend(got.samples_us);
                acc.clocks_mhz.extend(got.clocks_mhz);
                acc.wall_ms += got.wall_ms;
                acc.timer = got.timer;
            }
        }
    }
    let stats: Vec<(String, Stats)> = alive
        .iter()
        .filter_map(|m| {
            samples
                .get(&m.job.id)
                .map(|s| (m.job.id.clone(), s.stats(false)))
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
            stats: s,
            tied_with_best,
        }));
    }
}

#[cfg(test)]
mod tests {
    //! The lane against a fake backend whose kernel time is a function of the config.

    use super::*;
    use crate::backend::SampleBatch;
    use crate::manifest::model::ToleranceFor;
    use crate::store::CheckResult;
    use indexmap::IndexMap;
    use serde_json::json;

    /// Time of a config: |B - 5| * 10 + 100 us, so B = 5 is best.
    struct Fake {
        prepared: Option<Job>,
        checks: usize,
    }

    impl Backend for Fake {
        fn describe(&mut self, _: &serde_json::Value, _: u64) -> Result<(f64, f64), JobFailure> {
            Ok((1e9, 1e6))
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
            self.checks += 1;
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
        fn warmup(&mut self, _: &str, _: u32, _: f64) -> Result<(), JobFailure> {
            Ok(())
        }
        fn sample(
            &mut self,
            job_id: &str,
            count: u32,
            _: Flush,
        ) -> Result<SampleBatch, JobFailure> {
            let job = self
                .prepared
                .as_ref()
                .filter(|j| j.id == job_id)
                .expect("sampled job is prepared");
            let b = job.config["B"].as_f64().unwrap();
            let t = (b - 5.0).abs() * 10.0 + 100.0;
            Ok(SampleBatch {
                us: vec![t; count as usize],
                timer: "cuda_event".into(),
                sm_clock_mhz: None,
            })
        }
    }

    fn group(baseline_b: i64) -> Group {
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
                    baseline: b == baseline_b,
                }
            })
            .collect();
        Group {
            shape: IndexMap::new(),
            method: "m".into(),
            kernel: "k".into(),
            kind: "triton".into(),
            jobs,
        }
    }

    fn run(strategy: Strategy) -> (Vec<JobRecord>, Vec<FinalRecord>) {
        run_with_budget(strategy, None)
    }

    fn run_with_budget(
        strategy: Strategy,
        budget: Option<u64>,
    ) -> (Vec<JobRecord>, Vec<FinalRecord>) {
        run_full(strategy, budget, None, None, group(0))
    }

    fn run_full(
        strategy: Strategy,
        budget: Option<u64>,
        compile: Option<&CompileBoard>,
        prior: Option<&HashMap<String, Vec<PriorObservation>>>,
        group: Group,
    ) -> (Vec<JobRecord>, Vec<FinalRecord>) {
        let peak = |_: Option<&str>| 1000.0;
        let tolerance = Tolerance {
            atol: 0.0,
            rtol: 0.0,
            max_mismatch: 0.0,
            per_dtype: IndexMap::new(),
        };
        let ctx = LaneContext {
            protocol: RawProtocol {
                finalists: 2,
                ..RawProtocol::default()
            },
            tolerance,
            strategy,
            eta: 3,
            run_mode: RunMode::Tune,
            flush: Flush::NONE,
            peak_gbs: 1000.0,
            peak_tflops: &peak,
            compile,
            lane: 0,
            budget,
            search_seed: 0,
            prior,
        };
        let mut backend = Fake {
            prepared: None,
            checks: 0,
        };
        let (mut jobs, mut finals) = (Vec::new(), Vec::new());
        run_group(&ctx, &mut backend, group, &mut |e| match e {
            Event::Job(r) => jobs.push(*r),
            Event::Final(f) => finals.push(f),
        });
        (jobs, finals)
    }

    #[test]
    fn grid_records_every_job_and_retimes_finalists() {
        let (jobs, finals) = run(Strategy::Grid);
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
            .filter(|j| j.stats.is_some())
            .min_by(|a, b| {
                a.stats
                    .as_ref()
                    .unwrap()
                    .median_us
                    .total_cmp(&b.stats.as_ref().unwrap().median_us)
            })
            .unwrap();
        assert_eq!(best.config["B"], 5);
        assert_eq!(finals.len(), 2, "the best two are re-timed");
        assert!(finals.iter().any(|f| f.job_id == "job5"));
    }

    #[test]
    fn halving_keeps_the_best_and_never_prunes_the_baseline() {
        let (jobs, _) = run(Strategy::Halving);
        assert_eq!(jobs.len(), 10, "every job gets exactly one record");
        let status = |id: &str| jobs.iter().find(|j| j.job_id == id).unwrap().status;
        assert_eq!(
            status("job5"),
            JobStatus::Ok,
            "the best config is fully measured"
        );
        assert_eq!(
            status("job0"),
            JobStatus::Ok,
            "the baseline (the slowest here) is measured, not pruned"
        );
        let full = jobs.iter().filter(|j| j.status == JobStatus::Ok).count();
        assert!(
            full <= 3 + 1,
            "at most the finalists plus the baseline are measured fully, got {full}"
        );
        assert!(
            jobs.iter()
                .filter(|j| j.status == JobStatus::Pruned)
                .all(|j| j.stats.is_some()),
            "pruned jobs keep their screening statistics"
        );
    }

    #[test]
    fn surrogate_measures_its_budget_finds_the_best_and_records_the_rest_as_skipped() {
        let (jobs, finals) = run_with_budget(Strategy::Surrogate, Some(6));
        assert_eq!(jobs.len(), 10, "every job gets exactly one record");
        let status = |id: &str| jobs.iter().find(|j| j.job_id == id).unwrap().status;
        assert_eq!(
            status("job0"),
            JobStatus::Ok,
            "the baseline is always measured"
        );
        let measured = jobs
            .iter()
            .filter(|j| !j.baseline && j.status != JobStatus::Skipped)
            .count();
        assert_eq!(measured, 6, "exactly the budget, besides the baseline");
        assert_eq!(
            jobs.iter()
                .filter(|j| j.status == JobStatus::Skipped)
                .count(),
            3
        );
        assert!(jobs
            .iter()
            .filter(|j| j.status == JobStatus::Skipped)
            .all(|j| j.stats.is_none() && j.check.is_none()));
        assert_eq!(status("job5"), JobStatus::Ok, "the model found the minimum");
        assert!(finals.iter().any(|f| f.job_id == "job5"));
    }

    /// The compiler's verdict from the pool is the job's; a compile worker
    /// that crashed says nothing about the job, which the lane then compiles.
    #[test]
    fn a_pool_crash_is_not_the_jobs_failure_but_a_compile_error_is() {
        let board = CompileBoard::default();
        for job in group(0).jobs {
            board.push(job, "k", "triton");
        }
        board.close();
        while let Some((job, _, _)) = board.next() {
            let result = match job.id.as_str() {
                "job3" => Err(JobFailure::new(FailureClass::Crash, "worker died")),
                "job4" => Err(JobFailure::new(FailureClass::CompileError, "ptxas said no")),
                _ => Ok(0.1),
            };
            board.finish(&job.id, result);
        }
        let (jobs, _) = run_full(Strategy::Grid, None, Some(&board), None, group(0));
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

    /// A resumed surrogate search counts what the earlier run measured
    /// against its budget instead of starting over.
    #[test]
    fn a_resumed_surrogate_search_spends_only_what_is_left_of_its_budget() {
        let mut g = group(0);
        let done: Vec<Job> = g
            .jobs
            .iter()
            .filter(|j| ["job1", "job2", "job3"].contains(&j.id.as_str()))
            .cloned()
            .collect();
        g.jobs
            .retain(|j| !["job1", "job2", "job3"].contains(&j.id.as_str()));
        let observations = done
            .iter()
            .map(|j| PriorObservation {
                config: j.config.clone(),
                ln_median_us: Some(
                    ((j.config["B"].as_f64().unwrap() - 5.0).abs() * 10.0 + 100.0).ln(),
                ),
            })
            .collect();
        let mut prior = HashMap::new();
        prior.insert(group_key("m", &IndexMap::new()), observations);
        let (jobs, _) = run_full(Strategy::Surrogate, Some(6), None, Some(&prior), g);
        let measured = jobs
            .iter()
            .filter(|j| !j.baseline && j.status != JobStatus::Skipped)
            .count();
        assert_eq!(measured, 3, "6 in the budget, 3 already measured");
        assert_eq!(jobs.len(), 7, "every job of this run gets one record");
    }
}
