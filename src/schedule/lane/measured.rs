//! The measured path: one job through the lane, waited for. Its compile
//! (the pool's result, or the lane's own), its check (fresh inputs, poisoned
//! output, compared with the reference), warm-up and batches until its
//! stopping rule says enough, or a set number of screening batches; and the
//! [`FirstBatch`] a check goes on to in the same call, which requests sent
//! ahead (`ahead`) and the finalists' re-timing (`retime`) use too.

use std::time::Instant;

use crate::backend::{Backend, Checked, FirstBatch, JobFailure, SampleBatch, SampleMode};
use crate::manifest::{shape_dtype, MethodKind};
use crate::measure::{Decision, Sampling, StopRule};
use crate::plan::RunMode;
use crate::store::{FailureClass, JobStatus};

use super::{Lane, LaneContext, Measured, Slot};

impl Lane<'_, '_> {
    /// The compile pool's result for the job (waiting while it compiles); a job
    /// the pool has not reached is left for `prepare` to compile in the lane.
    pub(super) fn wait_for_compile(&mut self, m: &mut Measured) -> Result<(), JobFailure> {
        wait_for_compile(self.ctx, self.backend, self.track, m)
    }

    /// Check (fresh inputs, poisoned output, compare) and, unless only
    /// checking, warm up and take the first batch (for a full measurement,
    /// `until` the stopping rule, where the backend can); returns whether it
    /// was taken (the backend may leave it to a call of its own).
    pub(super) fn prepare(
        &mut self,
        m: &mut Measured,
        first: FirstBatches,
    ) -> Result<bool, JobFailure> {
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

    fn take_batch(&mut self, m: &mut Measured) -> Result<(), JobFailure> {
        take_batch(self.ctx, self.backend, m)
    }

    /// A candidate's full measurement, waited for: checked (its compile
    /// done), batches until the stopping rule, recorded.
    pub(super) fn measure_now(&mut self, mut m: Measured) -> Option<f64> {
        let result = (|| {
            let have_first = self.prepare(&mut m, FirstBatches::UntilStopped)?;
            self.sample_adaptive(&mut m, have_first)
        })();
        self.conclude(m, result)
    }

    /// A full measurement's record: ok with its statistics (`stopped`: what
    /// stopped its sampling), or its failure. Returns the median of one that
    /// passed.
    pub(super) fn conclude(
        &mut self,
        m: Measured,
        result: Result<Decision, JobFailure>,
    ) -> Option<f64> {
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

    /// Screening batches of a candidate, waited for: checked, warmed up,
    /// `batches` more batches. Screened with its median so far, or recorded
    /// as failed.
    pub(super) fn screen_now(&mut self, i: usize, mut m: Measured, batches: usize) -> Option<f64> {
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
    pub(super) fn start_measurement(&self, m: &mut Measured) {
        m.sampling = Sampling::default();
        m.rule = if m.job.baseline {
            self.ctx.protocol.stop_rule()
        } else {
            self.ctx.protocol.racing_rule(self.best_us)
        };
    }
}

/// The compile pool's result for the job (waiting while it compiles); a job
/// the pool has not reached is left for `prepare` to compile in the lane.
pub(in crate::schedule) fn wait_for_compile(
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
pub(super) enum FirstBatches {
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
pub(in crate::schedule) fn prepare(
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
pub(super) fn first_count(ctx: &LaneContext<'_>, rule: &StopRule) -> u32 {
    let batch = ctx.protocol.batch;
    if rule.outpaced_above_us.is_some() {
        batch.min(rule.min_samples.max(1))
    } else {
        batch
    }
}

/// The warm-up and first batch a check goes on to, as the protocol says.
pub(super) fn first_batch(
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
pub(super) fn retiming_batch(
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

/// A re-timing round's warm-up `warmup_ms` (see `retiming_batch`).
pub(in crate::schedule) fn retime_warmup_ms(ctx: &LaneContext<'_>) -> f64 {
    warmup_ms(ctx, true)
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
pub(super) fn read_check(
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
pub(super) fn screening_rule(batches: usize, batch: u32, max_wall_ms: f64) -> StopRule {
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

fn take_batch(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    m: &mut Measured,
) -> Result<(), JobFailure> {
    take_batch_as(backend, m, ctx.sampling, ctx.protocol.batch)
}

/// One batch of `count` samples, timed as `mode` says.
pub(super) fn take_batch_as(
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
