//! A native job's check and measurement. The native worker launches the
//! job once into its poisoned output and, where the reference is shared,
//! compares it in the same call and goes on to the warm-up and the batches
//! (`then`, `until`); else the Python worker compares. A full measurement
//! (or a screening round) is then one `check` call, and the lane sends the
//! next job's before it reads the last one's answer
//! (`Backend::send_measurement`): the worker goes from one job to the next
//! while the lane records.

use std::time::Duration;

use crate::backend::python::tolerance;
use crate::backend::wire::{batches_of, then_body};
use crate::backend::{Checked, FirstBatch, JobFailure, Received, SentAhead, TimedBatch};
use crate::manifest::{Method, ToleranceFor};
use crate::plan::Job;
use crate::protocol::native::{self as message, CheckAnswer, Comparison, Poison};
use crate::protocol::python::{self as py, ShareAnswer};
use crate::protocol::{Answered, Deferred, ThenAnswer};
use crate::store::{FailureClass, KernelResources};

use super::super::client::SentAhead as SentRequest;
use super::recipes::Launch;
use super::LaneBackend;

/// A check sent ahead (`Backend::send_measurement`), as its answer is read.
pub(super) struct UnderWay {
    sent: SentRequest,
    job_id: String,
    first: FirstBatch,
    /// What Triton compiled, from the job's recipe (empty for a native method).
    kernels: Vec<KernelResources>,
}

/// How much longer than one call's timeout a check may take: a check that
/// samples until the rule, up to the rule's wall cap.
fn sampling_time(first: Option<&FirstBatch>) -> Duration {
    match first {
        Some(FirstBatch {
            until: Some(rule), ..
        }) if rule.max_wall_ms.is_finite() => Duration::from_secs_f64(rule.max_wall_ms / 1e3),
        _ => Duration::ZERO,
    }
}

/// The native worker's `check` of `launch` for `job_id` over the shared
/// tensors: the output poisoned first, compared with the shared reference
/// in the same call where there is one (sparing the Python worker's round
/// trip) and, with `first`, going on to the batches.
pub(super) fn native_check_request<'a>(
    shared: &'a ShareAnswer,
    launch: &'a Launch,
    job_id: &'a str,
    tol: ToleranceFor,
    first: Option<&FirstBatch>,
) -> message::Check<'a> {
    let compare = shared.reference.map(|reference| message::Compare {
        out: shared.out,
        out_dtype: shared.tensors[shared.out].dtype.as_str().into(),
        reference,
        reference_dtype: shared.tensors[reference].dtype.as_str().into(),
        elements: shared.elements,
        atol: tol.atol,
        rtol: tol.rtol,
        max_mismatch: tol.max_mismatch,
    });
    let then = match (&compare, first) {
        (Some(_), Some(first)) => Some(then_body(first)),
        _ => None,
    };
    let poison = Poison {
        tensor: shared.out,
        pattern: shared.poison.as_str().into(),
        elements: shared.elements,
    };
    launch.check_request(job_id, poison, compare, then)
}

/// A native check answer's `then` (kept as its text, read here): the first
/// batches, their failure, or `None` where the worker did not go on.
pub(super) fn then_of(
    then: Option<Deferred<ThenAnswer>>,
    count: u32,
) -> Option<Result<Vec<TimedBatch>, JobFailure>> {
    // A `null` then arrives as `None` (serde reads null into an Option).
    let then = then?;
    Some(batches_of(then.read(), count))
}

impl LaneBackend {
    /// A native job's check; with `first`, the native worker goes on to the
    /// warm-up and the first batch in the same call where it compares itself.
    pub(super) fn check_native(
        &mut self,
        method: &Method,
        job: &Job,
        tol: ToleranceFor,
        seed: u64,
        first: Option<FirstBatch>,
    ) -> Result<Checked, JobFailure> {
        debug_assert!(
            !self
                .native
                .as_ref()
                .is_some_and(|n| !n.under_way.is_empty()),
            "a call waited for while checks are under way would read their answers"
        );
        if let Some(why) = self.native_reason() {
            return Err(JobFailure::new(FailureClass::Unavailable, why));
        }
        let ready = self.ready_launch(method, job, seed)?;
        let n = self.native.as_mut().expect("a native lane");
        let shared = &n.shared.as_ref().expect("shared").reply;
        let request = native_check_request(shared, ready.launch(), &job.id, tol, first.as_ref());
        let checked: Answered<CheckAnswer> = n.process.call_as_longer(
            "check",
            &request,
            Some(&job.id),
            sampling_time(first.as_ref()),
        )?;
        let checked = checked.into_body().expect("an ok answer has its body");
        let (compared, batch) = self.read_answer(checked, first.as_ref(), ready.kernels());
        let r: Comparison = match compared {
            Some(c) => c,
            None => self.python_compare(job, seed, tol)?,
        };
        Ok(Checked {
            check: r.into(),
            first: batch,
        })
    }

    /// A native check's answer, read: its comparison (`None`: the Python
    /// worker is to compare) and its batches (a failure of theirs leaves the
    /// worker as any failure does); the kernels it launched are kept for
    /// `take_kernels` (a Triton recipe's, which say what Triton compiled, or
    /// what the native worker loaded).
    fn read_answer(
        &mut self,
        answer: CheckAnswer,
        first: Option<&FirstBatch>,
        recipe_kernels: Vec<KernelResources>,
    ) -> (
        Option<Comparison>,
        Option<Result<Vec<TimedBatch>, JobFailure>>,
    ) {
        let n = self.native.as_mut().expect("a native lane");
        let batch = first.and_then(|f| then_of(answer.then, f.count));
        if let Some(Err(f)) = &batch {
            n.process.after_failure(f);
        }
        self.native_kernels = if recipe_kernels.is_empty() {
            vec![KernelResources::from(answer.kernel)]
        } else {
            recipe_kernels
        };
        self.native_prepared = true;
        (answer.compared, batch)
    }

    /// `Backend::send_measurement` for a native job whose reference is
    /// shared (the native worker compares, and the Python worker has nothing
    /// to do with its output): the request written, its answer read later.
    pub(super) fn send_native(
        &mut self,
        job: &Job,
        tol: ToleranceFor,
        seed: u64,
        first: FirstBatch,
    ) -> Result<SentAhead, JobFailure> {
        let Some(method) = self.native_method(job) else {
            return Ok(SentAhead::Declined);
        };
        if first.until.is_none() || self.native_reason().is_some() {
            return Ok(SentAhead::Declined);
        }
        let busy = !self
            .native
            .as_ref()
            .expect("a native lane")
            .under_way
            .is_empty();
        if busy && !self.ready_without_calls(&method, job, seed) {
            return Ok(SentAhead::WhenIdle);
        }
        let ready = self.ready_launch(&method, job, seed)?;
        let n = self.native.as_mut().expect("a native lane");
        let shared = &n.shared.as_ref().expect("shared").reply;
        if shared.reference.is_none() {
            // The Python worker compares, reading the output the next job
            // would overwrite: this job is measured the usual way.
            return Ok(SentAhead::Declined);
        }
        let request = native_check_request(shared, ready.launch(), &job.id, tol, Some(&first));
        let sent = match n.process.send("check", &request) {
            Ok(sent) => sent,
            // The worker died under a check still under way, whose answer
            // says how: this job is sent again once that one is read.
            Err(_) if busy => return Ok(SentAhead::WhenIdle),
            Err(f) => return Err(f),
        };
        n.under_way.push_back(UnderWay {
            sent,
            job_id: job.id.clone(),
            first,
            kernels: ready.kernels(),
        });
        Ok(SentAhead::Sent)
    }

    /// `Backend::receive_measurement`: the oldest check under way.
    pub(super) fn receive_native(&mut self) -> Received {
        let n = self.native.as_mut().expect("a native lane");
        let u = n
            .under_way
            .pop_front()
            .expect("a measurement under way to receive");
        let answer = n.process.receive_as_longer::<Answered<CheckAnswer>>(
            &u.sent,
            Some(&u.job_id),
            sampling_time(Some(&u.first)),
        );
        let answer = match answer {
            None => return Received::Lost,
            Some(Err(f)) => {
                return Received::Answer {
                    checked: Err(f),
                    kernels: Vec::new(),
                }
            }
            Some(Ok(a)) => a.into_body().expect("an ok answer has its body"),
        };
        let (compared, batch) = self.read_answer(answer, Some(&u.first), u.kernels);
        let kernels = std::mem::take(&mut self.native_kernels);
        let checked = match compared {
            Some(c) => Ok(Checked {
                check: c.into(),
                first: batch,
            }),
            None => {
                // It was sent with a comparison to make: an answer without
                // one is out of protocol, and the worker is not trusted.
                let f = JobFailure::new(
                    FailureClass::Crash,
                    "protocol error: the native worker's check answer has no comparison",
                );
                let n = self.native.as_mut().expect("a native lane");
                n.process.after_failure(&f);
                Err(f)
            }
        };
        Received::Answer { checked, kernels }
    }

    /// The Python worker's comparison of the shared output with the reference.
    fn python_compare(
        &mut self,
        job: &Job,
        seed: u64,
        tol: ToleranceFor,
    ) -> Result<Comparison, JobFailure> {
        let problem = self.python.problem().to_string();
        let body = py::Compare {
            problem: &problem,
            shape: &job.shape,
            seed,
            tolerance: tolerance(tol),
        };
        self.python.request_as("compare", &body)
    }
}
