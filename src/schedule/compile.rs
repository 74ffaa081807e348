//! The compile pool: CPU-side workers that compile jobs ahead of the GPU lane,
//! in the order the lane will need them, into one shared Triton cache.
//!
//! The board records each job's compile state. A lane that reaches a job
//! whose compile is under way waits for it rather than compiling it twice; a
//! job no compile worker has reached yet is claimed by the lane, which then
//! compiles it as part of its check.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::backend::{Backend, JobFailure, PythonBackend};
use crate::plan::Job;

/// Compile workers, started as soon as a run begins so that their start-up
/// (importing torch and Triton) overlaps the lane worker's, each on its own
/// thread taking jobs from the board in lane order.
pub struct CompilePool {
    board: Arc<CompileBoard>,
    threads: Vec<JoinHandle<()>>,
}

impl CompilePool {
    pub fn start(workers: Vec<PythonBackend>) -> CompilePool {
        let board = Arc::new(CompileBoard::default());
        let threads = workers
            .into_iter()
            .map(|mut backend| {
                let board = Arc::clone(&board);
                std::thread::spawn(move || {
                    // A worker that cannot start is retried at its first job,
                    // where the failure is recorded against that job.
                    let _ = backend.start();
                    while let Some((job, kernel, kind)) = board.next() {
                        if super::interrupted() {
                            // Hand it back: a lane that still reaches it compiles it itself.
                            board.requeue(&job.id);
                            break;
                        }
                        let result = backend.compile(&job, &kernel, &kind);
                        board.finish(&job.id, result);
                    }
                    backend.shutdown();
                })
            })
            .collect();
        CompilePool { board, threads }
    }

    pub fn board(&self) -> &CompileBoard {
        &self.board
    }
}

impl Drop for CompilePool {
    /// Whatever ended the run, nothing queued is compiled any more: the
    /// workers finish the compile in hand and exit.
    fn drop(&mut self) {
        self.board.abandon();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

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

    /// Drop everything still queued and close: for the end of a run.
    pub fn abandon(&self) {
        let mut inner = self.inner.lock().expect("compile board");
        inner.queue.clear();
        inner.closed = true;
        self.changed.notify_all();
    }

    /// The lane will not run this job (a search strategy skipped it): the
    /// pool need not compile it.
    pub fn cancel(&self, job_id: &str) {
        let mut inner = self.inner.lock().expect("compile board");
        if matches!(inner.states.get(job_id), Some(State::Queued)) {
            inner.states.insert(job_id.to_string(), State::Claimed);
        }
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

    /// A job taken by `next` that will not be compiled after all.
    pub fn requeue(&self, job_id: &str) {
        let mut inner = self.inner.lock().expect("compile board");
        inner.states.insert(job_id.to_string(), State::Queued);
        self.changed.notify_all();
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

#[cfg(test)]
mod tests {
    use super::*;
    use indexmap::IndexMap;

    fn job(id: &str) -> Job {
        Job {
            id: id.into(),
            shape_index: 0,
            method: "m".into(),
            shape: IndexMap::new(),
            config: IndexMap::new(),
            baseline: false,
        }
    }

    #[test]
    fn cancelled_jobs_are_not_compiled_and_abandon_drops_the_queue() {
        let board = CompileBoard::default();
        for id in ["a", "b", "c", "d"] {
            board.push(job(id), "k", "triton");
        }
        board.cancel("b");
        assert_eq!(board.next().map(|j| j.0.id), Some("a".into()));
        assert_eq!(
            board.next().map(|j| j.0.id),
            Some("c".into()),
            "b was cancelled"
        );
        board.abandon();
        assert!(board.next().is_none(), "d was dropped with the queue");
        // The lane still gets an answer for every job: compile it yourself.
        assert!(board.wait("d").is_none());
    }

    #[test]
    fn a_requeued_job_goes_back_to_the_lane() {
        let board = CompileBoard::default();
        board.push(job("a"), "k", "triton");
        let (taken, _, _) = board.next().unwrap();
        board.requeue(&taken.id);
        assert!(board.wait("a").is_none(), "the lane claims it");
    }
}
