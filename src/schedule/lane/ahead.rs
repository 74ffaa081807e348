//! Requests sent ahead: where the backend can take a candidate's request
//! before it has answered the last (`Backend::send_measurement`), a lane
//! keeps two under way, so the worker goes from one candidate to the next
//! without waiting for the lane to read and record the answer. Answers are
//! read in order; one lost with its worker, or cut short, is asked again,
//! waited for, once nothing is under way.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::backend::{Backend, JobFailure, Received, SentAhead};
use crate::manifest::shape_dtype;
use crate::measure::{Decision, Sampling};
use crate::plan::RunMode;
use crate::store::JobStatus;

use super::measured::{first_batch, first_count, read_check, screening_rule};
use super::{Lane, LaneContext, Measured, Slot};

/// An answer to a request sent ahead, read into the job: how many batches
/// came, or its failure; `None` where the request was lost with its worker.
type AnswerRead = Option<Result<usize, JobFailure>>;

/// Requests a lane keeps sent ahead to a backend that can take them
/// (`Backend::send_measurement`): the one the worker runs and the next,
/// waiting in its pipe, so the worker starts it the moment it answers.
pub(super) const UNDER_WAY: usize = 2;

/// What a candidate's request asks for: its full measurement, or a set
/// number of screening batches (halving).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ask {
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

/// The requests of one `Lane::ask_each`: under way, to make again, and
/// the screenings that passed, by candidate.
#[derive(Default)]
struct Each {
    under_way: VecDeque<SentJob>,
    again: Vec<Again>,
    passed: HashMap<usize, f64>,
}

impl Lane<'_, '_> {
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
    pub(super) fn ask_each(&mut self, order: &[usize], ask: Ask) -> HashMap<usize, f64> {
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
}

/// The oldest answer sent ahead, read into `m`: how many batches came, the
/// job's failure, or `None` where the request was lost with its worker.
pub(super) fn read_received(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    m: &mut Measured,
) -> AnswerRead {
    match backend.receive_measurement() {
        Received::Lost => None,
        Received::Answer { checked, kernels } => {
            let tol = ctx.tolerance.for_dtype(shape_dtype(&m.job.shape));
            Some(read_check(m, checked, kernels, tol, true))
        }
    }
}
