//! Before a run starts: what its results directory already holds
//! ([`Resume`]), which planned jobs it runs ([`Selection`]), and how many
//! ([`count_plan`], [`count_pairs`]), so that progress has a total and a bad
//! filter, a plan with nothing to run or a journal timed another way stops
//! the run before anything is written.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::path::Path;

use crate::diag::Diagnostic;
use crate::manifest::{Experiment, Shape};
use crate::measure::{L2Flush, Protocol};
use crate::plan::{self, Job, PlanOptions, RunMode};
use crate::search::{PriorObservation, Strategies};
use crate::store::{FailureClass, JobRecord, JobStatus, Results};

use super::{ab, deal, lane, RunError};

/// What a results directory already holds, read before anything is written.
pub(super) struct Resume {
    pub(super) previous: Results,
    /// Jobs this run need not run again.
    pub(super) done: HashSet<String>,
    /// Jobs whose current record says their method could not run, and why:
    /// a run asks again, and records them again only if the answer changed.
    pub(super) unavailable: HashMap<String, String>,
    /// What earlier runs measured, by group, for a strategy that learns from it.
    pub(super) prior: HashMap<String, Vec<PriorObservation>>,
}

impl Resume {
    pub(super) fn read(
        dir: &Path,
        strategies: &Strategies,
        run_mode: RunMode,
        protocol: &Protocol,
        exp: &Experiment,
        retries: u32,
    ) -> Result<Resume, RunError> {
        // A first run has no journal yet.
        let (previous, warnings) = if crate::store::journal::exists(dir) {
            crate::store::journal::read(dir)?
        } else {
            Default::default()
        };
        for w in &warnings {
            eprintln!("warning: {w}");
        }
        if let Some(h) = &previous.header {
            if h.protocol.timing != protocol.timing && run_mode != RunMode::Check {
                return Err(RunError::Input(
                    Diagnostic::in_file(
                        &exp.manifest_path,
                        format!(
                            "the journal's jobs were timed {} and this run would time them {}: one ranking would mix the two",
                            h.protocol.timing.as_str(),
                            protocol.timing.as_str()
                        ),
                    )
                    .help(format!(
                        "set `protocol: {{timing: {}}}` to go on with {}, time the other way in `retime_with:`, or pass a fresh --results-dir",
                        h.protocol.timing.as_str(),
                        dir.display()
                    ))
                    .into(),
                ));
            }
            if let Some(message) = flush_conflict(h.protocol.flush, protocol.flush) {
                return Err(RunError::Input(
                    Diagnostic::in_file(&exp.manifest_path, message)
                        .help(format!(
                            "set `protocol: {{flush_with: {}}}` to go on with {}, or pass a fresh --results-dir",
                            h.protocol.flush.as_str(),
                            dir.display()
                        ))
                        .into(),
                ));
            }
        }
        // A planned job whose record a later definition of its method
        // superseded (an edit reverted) runs again, so that its new record is
        // the current one.
        let superseded = crate::emit::select::superseded_ids(&previous.jobs);
        // A crash or a timeout may be the machine's fault (a worker killed,
        // a GPU that hung once), not the config's: such a job runs again, up
        // to `retries` times over all runs.
        let retry = |r: &JobRecord| {
            r.status == JobStatus::Failed
                && r.failure
                    .as_ref()
                    .is_some_and(|f| matches!(f.class, FailureClass::Crash | FailureClass::Timeout))
                && previous.crashes(r) <= retries as usize
        };
        let done = previous
            .jobs
            .iter()
            .filter(|r| !superseded.contains(r.job_id.as_str()))
            .filter(|r| match run_mode {
                RunMode::Check => r.status != JobStatus::Skipped,
                // A config a strategy skipped was never run: only a strategy
                // that keeps its skips leaves it unrun.
                _ if r.status == JobStatus::Skipped => {
                    run_mode == RunMode::Tune
                        && r.failure.is_none()
                        && strategies.for_method(&r.method).keeps_skipped()
                }
                _ => r.status != JobStatus::Checked && !retry(r),
            })
            .map(|r| r.job_id.clone())
            .collect();
        let unavailable = previous
            .jobs
            .iter()
            .filter(|r| !superseded.contains(r.job_id.as_str()))
            .filter(|r| r.status == JobStatus::Skipped)
            .filter_map(|r| {
                let f = r.failure.as_ref()?;
                (f.class == FailureClass::Unavailable)
                    .then(|| (r.job_id.clone(), f.message.clone()))
            })
            .collect();
        let prior = if strategies.any_learns() && run_mode == RunMode::Tune {
            lane::prior_observations(
                previous
                    .jobs
                    .iter()
                    .filter(|r| !superseded.contains(r.job_id.as_str())),
            )
        } else {
            HashMap::new()
        };
        Ok(Resume {
            previous,
            done,
            unavailable,
            prior,
        })
    }
}

/// What planning once, to count, found.
pub(super) struct Counted {
    pub(super) planned: u64,
    /// Of those, jobs the journal records as unavailable: asked again, not
    /// new to the journal.
    pub(super) unavailable_before: u64,
    pub(super) skipped: u64,
    /// The first selected job's shape, if any job is selected.
    pub(super) first_shape: Option<Shape>,
    /// The groups with jobs to run, in plan order (their costs not yet estimated).
    pub(super) groups: Vec<deal::Pending>,
}

/// Plans once to count the jobs to run and those already done, so progress
/// has a total and a bad filter or space stops the run before it starts;
/// also lists the groups with jobs to run, for dealing.
pub(super) fn count_plan(
    exp: &Experiment,
    plan_opts: &PlanOptions<'_>,
    select: &Selection<'_>,
    in_shard: Option<plan::GroupFilter<'_>>,
) -> Result<Counted, RunError> {
    let mut c = Counted {
        planned: 0,
        unavailable_before: 0,
        skipped: 0,
        first_shape: None,
        groups: Vec::new(),
    };
    plan::plan_groups(exp, plan_opts, in_shard, &mut |job| {
        match select.keep(&job, exp) {
            Keep::Run => {
                c.planned += 1;
                if select.unavailable.contains_key(&job.id) {
                    c.unavailable_before += 1;
                }
                match c.groups.last_mut() {
                    Some(g) if g.method == job.method && g.shape_index == job.shape_index => {
                        g.jobs += 1
                    }
                    _ => c.groups.push(deal::Pending {
                        method: job.method.clone(),
                        shape_index: job.shape_index,
                        shape: job.shape.clone(),
                        jobs: 1,
                        cost: 0.0,
                    }),
                }
            }
            Keep::Done => c.skipped += 1,
            Keep::No => return ControlFlow::Continue(()),
        }
        if c.first_shape.is_none() {
            c.first_shape = Some(job.shape);
        }
        ControlFlow::Continue(())
    })
    .map_err(|d| RunError::Input(d.into()))?;
    Ok(c)
}

/// An A/B run's pairs counted as `count_plan` counts a plan's jobs: a pair
/// of three jobs, recorded or to run.
pub(super) fn count_pairs(plan: &ab::AbPlan, done: &HashSet<String>) -> Counted {
    let groups = plan.pending(done);
    Counted {
        planned: groups.len() as u64,
        skipped: (plan.pairs.len() - groups.len()) as u64,
        first_shape: groups.first().map(|g| g.shape.clone()),
        groups,
        // An A/B's jobs are timed, never skipped as unavailable beforehand.
        unavailable_before: 0,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    Run,
    Done,
    No,
}

/// Which planned jobs this run runs.
pub(super) struct Selection<'a> {
    pub(super) done: &'a HashSet<String>,
    /// Jobs recorded as unavailable, with the reason (`Resume::unavailable`).
    pub(super) unavailable: &'a HashMap<String, String>,
    pub(super) run_mode: RunMode,
    pub(super) only: Option<&'a HashSet<String>>,
}

impl Selection<'_> {
    /// Whether `record` says again what the journal already holds for its
    /// job: unavailable, for the same reason. It is not written again, so
    /// the runs table still counts the job in the run that first recorded it.
    pub(super) fn repeats(&self, record: &JobRecord) -> bool {
        record.status == JobStatus::Skipped
            && record.failure.as_ref().is_some_and(|f| {
                f.class == FailureClass::Unavailable
                    && self.unavailable.get(&record.job_id) == Some(&f.message)
            })
    }

    pub(super) fn keep(&self, job: &Job, exp: &Experiment) -> Keep {
        let wanted = match (self.run_mode, self.only) {
            (_, Some(ids)) => job.baseline || ids.contains(&job.id),
            (RunMode::Bench, None) => {
                // A method's one config: its baseline, or the single point of a method without a space.
                job.baseline || exp.method(&job.method).is_some_and(|m| m.axes.is_empty())
            }
            _ => true,
        };
        if !wanted {
            Keep::No
        } else if self.done.contains(&job.id) {
            Keep::Done
        } else {
            Keep::Run
        }
    }
}

/// Why a run must not add samples to a journal whose samples were taken after
/// another kind of L2 flush (a memset's write-back costs a memory-bound kernel
/// about 10 %), or None. A run without a flush suits any journal.
fn flush_conflict(before: L2Flush, now: L2Flush) -> Option<String> {
    if before == L2Flush::Off || now == L2Flush::Off || before == now {
        return None;
    }
    Some(format!(
        "the journal's jobs were timed after a {} flush of L2 and this run would flush with a {}: \
         one report would mix the two",
        before.as_str(),
        now.as_str()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_does_not_mix_flushes_in_one_journal() {
        let message = flush_conflict(L2Flush::Memset, L2Flush::Read).expect("memset then read");
        assert!(
            message.contains("memset") && message.contains("read"),
            "{message}"
        );
        assert_eq!(flush_conflict(L2Flush::Memset, L2Flush::Memset), None);
        assert_eq!(flush_conflict(L2Flush::Read, L2Flush::Read), None);
        assert!(flush_conflict(L2Flush::Read, L2Flush::Memset).is_some());
        // An interpreter run flushes nothing, so any journal suits it.
        assert_eq!(flush_conflict(L2Flush::Memset, L2Flush::Off), None);
        assert_eq!(flush_conflict(L2Flush::Off, L2Flush::Read), None);
    }
}
