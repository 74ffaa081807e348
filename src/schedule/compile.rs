//! The compile pool: CPU-side workers that compile jobs ahead of the GPU lane,
//! in the order the lane will need them, into one shared Triton cache.
//!
//! The board records each job's compile state. A lane that reaches a job
//! whose compile is under way waits for it rather than compiling it twice; a
//! job no compile worker has reached yet is claimed by the lane, which then
//! compiles it as part of its check.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};

use crate::backend::JobFailure;
use crate::plan::Job;

enum State {
    Queued,
    Compiling,
    Done(Result<f64, JobFailure>),
    /// The lane got there first.
    Claimed,
}

#[derive(Default)]
struct Inner {
    queue: VecDeque<(Job, String, String)>,
    states: HashMap<String, State>,
    closed: bool,
}

#[derive(Default)]
pub struct CompileBoard {
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl CompileBoard {
    pub fn push(&self, job: Job, kernel: &str, kind: &str) {
        let mut inner = self.inner.lock().expect("compile board");
        inner.states.insert(job.id.clone(), State::Queued);
        inner
            .queue
            .push_back((job, kernel.to_string(), kind.to_string()));
        self.changed.notify_all();
    }

    /// No more jobs will be pushed; idle compile workers may exit.
    pub fn close(&self) {
        self.inner.lock().expect("compile board").closed = true;
        self.changed.notify_all();
    }

    /// The next job to compile, in lane order; `None` once closed and drained.
    pub fn next(&self) -> Option<(Job, String, String)> {
        let mut inner = self.inner.lock().expect("compile board");
        loop {
            while let Some((job, kernel, kind)) = inner.queue.pop_front() {
                if matches!(inner.states.get(&job.id), Some(State::Queued)) {
                    inner.states.insert(job.id.clone(), State::Compiling);
                    return Some((job, kernel, kind));
                }
            }
            if inner.closed {
                return None;
            }
            inner = self.changed.wait(inner).expect("compile board");
        }
    }

    pub fn finish(&self, job_id: &str, result: Result<f64, JobFailure>) {
        let mut inner = self.inner.lock().expect("compile board");
        inner.states.insert(job_id.to_string(), State::Done(result));
        self.changed.notify_all();
    }

    /// For the lane: the compile result if the pool compiled it (waiting while
    /// it is being compiled), or `None` after claiming a job the pool had not reached.
    pub fn wait(&self, job_id: &str) -> Option<Result<f64, JobFailure>> {
        let mut inner = self.inner.lock().expect("compile board");
        loop {
            match inner.states.get(job_id) {
                Some(State::Done(r)) => return Some(r.clone()),
                Some(State::Compiling) => inner = self.changed.wait(inner).expect("compile board"),
                Some(State::Queued) | None => {
                    inner.states.insert(job_id.to_string(), State::Claimed);
                    return None;
                }
                Some(State::Claimed) => return None,
            }
        }
    }
}
