//! A lane's health: the retirement rule for a lane whose GPU faults or whose
//! worker keeps dying (docs/scaling.md). A lane watches its own records
//! ([`HealthWatch`]); after [`RETIRE_AFTER`] crash or launch_error failures in
//! a row it runs a health check, and on its verdict goes on or retires, its
//! unfinished jobs handed to the other lanes (`schedule::drain`).

use std::cell::RefCell;
use std::sync::Mutex;
use std::time::Instant;

use crate::manifest::{shape_dtype, MethodKind};
use crate::plan::Job;
use crate::store::{FailureClass, JobStatus};

use super::{Lane, Measured};

/// Consecutive crash or launch_error failures after which a lane checks its
/// own health (docs/scaling.md).
pub const RETIRE_AFTER: usize = 3;

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

impl Lane<'_, '_> {
    /// The retirement rule (see [`HealthWatch`]), after each record.
    pub(super) fn watch(&mut self, m: &Measured, status: JobStatus, class: Option<FailureClass>) {
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
}
