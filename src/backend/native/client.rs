//! The runner's side of a native worker (`tunelab native-worker`): starting
//! it on a lane's GPU, its `hello`, and calls with deadlines. A worker that
//! times out, exits or reports a `launch_error` is killed and replaced at the
//! next call, as a Python worker is; whatever it had mapped is gone with it.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use crate::backend::wire::{failure_from, unfit};
use crate::backend::worker::{CallError, Sent, Worker};
use crate::backend::JobFailure;
use crate::protocol::native::{self as message, VERSION as PROTOCOL};
use crate::protocol::{Answer, Answered};
use crate::store::FailureClass;

/// How long a native worker may take to open its GPU and answer `hello`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How to start a lane's native worker.
#[derive(Debug, Clone)]
pub struct NativeSpawn {
    /// The program and the arguments before `native-worker` (the tunelab binary).
    pub program: PathBuf,
    pub backend: &'static str,
    /// `CUDA_VISIBLE_DEVICES` or `HIP_VISIBLE_DEVICES`, and the lane's GPU in it.
    pub visible_var: &'static str,
    pub visible_device: Option<String>,
    /// Its stderr.
    pub log: PathBuf,
}

/// A native worker's answer to `hello`.
pub type NativeHello = message::HelloAnswer;

/// A request sent ahead to a native worker, and which of its processes got it.
#[derive(Debug)]
pub struct SentAhead {
    sent: Sent,
    generation: u64,
}

pub struct NativeProcess {
    spawn: NativeSpawn,
    /// The helper kernels' image (spin, flush), loaded at `hello`.
    helpers: Option<PathBuf>,
    worker: Option<Worker>,
    hello: Option<NativeHello>,
    timeout: Duration,
    /// Starts so far: each new process has mapped nothing yet.
    generation: u64,
}

impl NativeProcess {
    pub fn new(spawn: NativeSpawn, timeout: Duration) -> NativeProcess {
        NativeProcess {
            spawn,
            helpers: None,
            worker: None,
            hello: None,
            timeout,
            generation: 0,
        }
    }

    /// The helper image the next start loads.
    pub fn set_helpers(&mut self, image: PathBuf) {
        self.helpers = Some(image);
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// When the running worker finished its last answer (`Worker::last_done`).
    pub fn last_done(&self) -> Option<std::time::Instant> {
        self.worker.as_ref().and_then(Worker::last_done)
    }

    pub fn hello(&self) -> Option<&NativeHello> {
        self.hello.as_ref()
    }

    /// The trace track of this worker's calls: its log's file stem ("native0").
    pub fn track(&self) -> String {
        self.spawn
            .log
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "native".into())
    }

    fn worker(&mut self) -> Result<&mut Worker, JobFailure> {
        if self.worker.is_none() {
            let started = Instant::now();
            let name = self.track();
            let s = &self.spawn;
            let mut cmd = Command::new(&s.program);
            cmd.args(["native-worker", "--backend", s.backend]);
            if let Some(dev) = &s.visible_device {
                cmd.env(s.visible_var, dev);
            }
            let mut w = Worker::start(cmd, &s.log, name).map_err(|e| {
                JobFailure::new(
                    FailureClass::Crash,
                    format!(
                        "cannot start the native worker `{} native-worker`: {e}",
                        s.program.display()
                    ),
                )
            })?;
            let body = message::Hello {
                helpers: self.helpers.clone(),
            };
            let hello =
                match w.call_as::<Answered<NativeHello>>("hello", &body, None, STARTUP_TIMEOUT) {
                    Ok(r) if r.ok() => Ok(r.into_body().expect("an ok answer has its body")),
                    Ok(r) => Err(failure_from(r.class(), r.message())),
                    Err(CallError::Protocol(e)) => Err(unfit("the native worker's hello", e)),
                    Err(e) => Err(JobFailure::new(
                        FailureClass::Crash,
                        format!("the native worker did not start: {e}"),
                    )),
                };
            let hello = match hello {
                Ok(h) if h.protocol != PROTOCOL => Err(JobFailure::new(
                    FailureClass::Crash,
                    format!(
                        "the native worker speaks protocol {}, this runner {PROTOCOL}: run the binary of one build",
                        h.protocol
                    ),
                )),
                other => other,
            };
            match hello {
                Ok(h) => self.hello = Some(h),
                Err(f) => {
                    w.kill();
                    return Err(f);
                }
            }
            // Process start, opening the GPU and `hello`, as a Python worker's start-up
            // is traced: `bench/trace_breakdown.py` keeps it out of the per-job overhead.
            crate::trace::span(w.name(), "start-up", started, json!({"pid": w.pid()}));
            self.worker = Some(w);
            self.generation += 1;
        }
        Ok(self.worker.as_mut().expect("just started"))
    }

    /// Starts the worker now (answers `hello`), or says why it cannot.
    pub fn start(&mut self) -> Result<&NativeHello, JobFailure> {
        self.worker()?;
        Ok(self.hello.as_ref().expect("a started worker said hello"))
    }

    /// One call whose answer is read as `A` (an [`Answered`] message, or a
    /// JSON tree); a worker that fails to answer, or reports a fault, is
    /// discarded so the next call starts a fresh one.
    pub fn call<A: Answer>(&mut self, op: &str, body: &impl Serialize) -> Result<A, JobFailure> {
        self.call_as(op, body, None)
    }

    /// [`NativeProcess::call`] with the request and answer typed (see
    /// [`Worker::call_as`]): the calls a job makes.
    pub fn call_as<A: Answer>(
        &mut self,
        op: &str,
        body: &impl Serialize,
        job: Option<&str>,
    ) -> Result<A, JobFailure> {
        self.call_as_longer(op, body, job, Duration::ZERO)
    }

    /// [`NativeProcess::call_as`] for a call that may take `longer` than the
    /// protocol's timeout for one call (a check that goes on sampling).
    pub fn call_as_longer<A: Answer>(
        &mut self,
        op: &str,
        body: &impl Serialize,
        job: Option<&str>,
        longer: Duration,
    ) -> Result<A, JobFailure> {
        let timeout = self.timeout + longer;
        let result = self.worker()?.call_as::<A>(op, body, job, timeout);
        self.answered(op, result)
    }

    /// A call's answer as the job's result: a worker that did not answer is
    /// discarded, and a failed answer leaves what `after_failure` says.
    fn answered<A: Answer>(
        &mut self,
        op: &str,
        result: Result<A, CallError>,
    ) -> Result<A, JobFailure> {
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                self.discard();
                return Err(match e {
                    CallError::Timeout(s) => JobFailure::new(
                        FailureClass::Timeout,
                        format!("no answer to `{op}` from the native worker within {s:.0} s; worker killed"),
                    ),
                    e => JobFailure::new(FailureClass::Crash, format!("native worker: {e}")),
                });
            }
        };
        if response.ok() {
            return Ok(response);
        }
        let failure = failure_from(response.class(), response.message());
        self.after_failure(&failure);
        Err(failure)
    }

    /// Writes a request whose answer [`NativeProcess::receive_as_longer`]
    /// reads later, starting the worker if it is not running: a lane sends
    /// the next job's check while the worker still runs the last one.
    /// A write that fails is a worker that died: with requests still under
    /// way, under one of them, whose answer then says how (the worker is
    /// left for it to be read); with none, it is discarded.
    pub fn send(&mut self, op: &str, body: &impl Serialize) -> Result<SentAhead, JobFailure> {
        let worker = self.worker()?;
        let earlier = worker.pending();
        match worker.send(op, body) {
            Ok(sent) => Ok(SentAhead {
                sent,
                generation: self.generation,
            }),
            Err(e) => {
                if earlier == 0 {
                    self.discard();
                }
                Err(JobFailure::new(
                    FailureClass::Crash,
                    format!("native worker: {e}"),
                ))
            }
        }
    }

    /// The answer to `sent`, read as [`NativeProcess::call_as_longer`] reads
    /// one, or `None` when the process it was sent to is gone (discarded
    /// after an earlier answer's failure): the request never ran, or its
    /// answer cannot be trusted, and the job is to be sent again.
    pub fn receive_as_longer<A: Answer>(
        &mut self,
        sent: &SentAhead,
        job: Option<&str>,
        longer: Duration,
    ) -> Option<Result<A, JobFailure>> {
        if sent.generation != self.generation {
            return None;
        }
        let timeout = self.timeout + longer;
        let worker = self.worker.as_mut()?;
        let result = worker.receive_as::<A>(&sent.sent, job, timeout);
        Some(self.answered(sent.sent.op(), result))
    }

    /// What a failed request leaves: a fault leaves the context unusable,
    /// and an answer out of protocol (a crash the runner found in it) the
    /// worker untrusted: either way it is discarded.
    pub fn after_failure(&mut self, failure: &JobFailure) {
        if matches!(
            failure.class,
            FailureClass::LaunchError | FailureClass::Crash
        ) {
            self.discard();
        }
    }

    /// Kills the worker; the next call starts a new one. What it had mapped
    /// and the requests under way go with it: a new generation starts here,
    /// so nothing kept for the old one (shared tensors, requests sent ahead)
    /// is taken for the next one's.
    fn discard(&mut self) {
        if let Some(mut w) = self.worker.take() {
            w.kill();
            self.generation += 1;
        }
    }

    pub fn shutdown(&mut self) {
        if let Some(w) = self.worker.take() {
            w.shutdown();
        }
    }
}
