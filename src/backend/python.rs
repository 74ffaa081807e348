//! The Python backend: jobs run in a `tunelab.worker` process, restarted
//! whenever it crashes, hangs or faults.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value as Json};

use super::wire::{batch_of, batches_of, failure_from, sample_body, then_body, unfit};
use super::worker::{CallError, Worker, WorkerSpec};
use super::{
    Backend, Checked, Compiled, FirstBatch, JobFailure, SampleBatch, SampleMode, ShapeFacts,
    TimedBatch,
};
use indexmap::IndexMap;

use crate::manifest::{ConfigType, MethodKind, ToleranceFor};
use crate::plan::Job;
use crate::protocol::python::{self as message, ValueType};
use crate::protocol::{Answer, Empty, JobSample, JobWarmup, JobsTurns, SampleAnswer, TurnsAnswer};
use crate::store::{CheckResult, FailureClass, KernelResources};

/// The worker protocol this runner speaks (docs/worker-protocol.md). A worker
/// that answers `hello` with another version is refused at start-up.
pub const PROTOCOL_VERSION: u32 = message::VERSION;

/// How long a new worker may take to import torch and Triton and answer `hello`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

/// A worker's answer to `hello`: what it runs on.
pub type Hello = message::HelloAnswer;

/// A kernel whose IR a worker wrote (`keep_ir`): its resources and files.
pub type KeptKernel = message::KeptKernel;

/// A worker's answer to `probe`: whether the problem has each method, and
/// the config types each declares.
#[derive(Debug, Clone)]
pub struct Probe {
    pub methods: IndexMap<String, ProbedMethod>,
    /// Every method the problem has.
    pub available: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct ProbedMethod {
    pub found: bool,
    /// `None`: the method declares no types.
    pub config_types: Option<IndexMap<String, ConfigType>>,
    /// The first line of the method's documentation, if it has one.
    pub description: Option<String>,
}

impl From<message::ProbeAnswer> for Probe {
    fn from(a: message::ProbeAnswer) -> Probe {
        let config_type = |t: ValueType| match t {
            ValueType::Int => ConfigType::Int,
            ValueType::Float => ConfigType::Float,
            ValueType::Str => ConfigType::Str,
            ValueType::Bool => ConfigType::Bool,
        };
        Probe {
            methods: a
                .methods
                .into_iter()
                .map(|(name, m)| {
                    let method = ProbedMethod {
                        found: m.found,
                        config_types: m.config_types.map(|types| {
                            types
                                .into_iter()
                                .map(|(k, t)| (k, config_type(t)))
                                .collect()
                        }),
                        description: m.description,
                    };
                    (name, method)
                })
                .collect(),
            available: a.available,
        }
    }
}

/// The failure a worker's `ok: false` answer reports (its class and message).
pub fn failure_of(response: &Json) -> JobFailure {
    failure_from(response.class(), response.message())
}

/// A `check` answer's `then`: the first batches, their failure, or `None`
/// where the worker did not go on (the check failed, or it left the rest to
/// calls of their own). It is taken out of `reply`, whose rest is read after.
pub(crate) fn then_reply(
    reply: &mut Json,
    count: u32,
) -> Option<Result<Vec<TimedBatch>, JobFailure>> {
    let then = reply
        .get_mut("then")
        .map(Json::take)
        .filter(|t| !t.is_null())?;
    Some(batches_of(serde_json::from_value(then), count))
}

pub struct PythonBackend {
    spec: WorkerSpec,
    worker: Option<Worker>,
    generation: u64,
    /// The kernels the last check compiled, until the lane takes them.
    kernels: Vec<KernelResources>,
    /// The IR file of each method that runs from one, by method name.
    ir_files: std::collections::HashMap<String, std::path::PathBuf>,
    /// The last started worker's `hello`.
    hello: Option<Hello>,
    problem: String,
    timeout: Duration,
}

impl PythonBackend {
    pub fn new(spec: WorkerSpec, problem: &str, timeout: Duration) -> PythonBackend {
        PythonBackend {
            spec,
            worker: None,
            generation: 0,
            kernels: Vec::new(),
            ir_files: Default::default(),
            hello: None,
            problem: problem.to_string(),
            timeout,
        }
    }

    fn worker(&mut self) -> Result<&mut Worker, JobFailure> {
        if self.worker.is_none() {
            let started = std::time::Instant::now();
            let python = &self.spec.python;
            let point_elsewhere = "point tunelab at a Python that has torch and triton: \
                --python PATH, TUNELAB_PYTHON=PATH, or `python = \"PATH\"` in tunelab.toml; \
                `tunelab doctor` checks the set-up";
            let mut w = Worker::spawn(&self.spec).map_err(|e| {
                JobFailure::new(
                    FailureClass::Crash,
                    format!("cannot run `{python}`: {e}\n  = help: {point_elsewhere}"),
                )
            })?;
            // Importing torch and Triton takes seconds, more on a loaded machine:
            // wait for the worker to be ready so start-up never eats a job's timeout.
            let hello = match w.call_as::<Json>("hello", &Empty {}, None, STARTUP_TIMEOUT) {
                // A start-up that fails ends in a Python exception: its last
                // line says why (`No module named 'torch'`).
                Err(CallError::Crash { status, stderr }) => Err(format!(
                    "it {status}: {}\n  = help: install what it lacks into that Python \
                     (`{python} -m pip install torch triton`), or {point_elsewhere}",
                    stderr.last().map_or("(nothing on stderr)", |l| l.trim())
                )),
                Err(other) => Err(format!("{other}\n  = help: {point_elsewhere}")),
                Ok(reply) => match serde_json::from_value::<Hello>(reply) {
                    Err(e) => Err(format!(
                        "its answer to `hello` is not understood ({e})\n  = help: {point_elsewhere}"
                    )),
                    Ok(h) if h.protocol != PROTOCOL_VERSION => Err(format!(
                        "it speaks worker protocol {}, and this tunelab speaks protocol {PROTOCOL_VERSION}\n  \
                         = help: the Python package `tunelab` it imports and this binary come from different \
                         versions of tunelab: run the binary from the same checkout, or reinstall the package (`pip install .`)",
                        h.protocol
                    )),
                    Ok(h) => Ok(h),
                },
            };
            match hello {
                Ok(h) => self.hello = Some(h),
                Err(why) => {
                    w.kill();
                    return Err(JobFailure::new(
                        FailureClass::Crash,
                        format!("`{python} -m tunelab.worker` did not start: {why}"),
                    ));
                }
            }
            crate::trace::span(w.name(), "start-up", started, json!({"pid": w.pid()}));
            self.worker = Some(w);
            self.generation += 1;
        }
        Ok(self.worker.as_mut().expect("just started"))
    }

    /// One call; a dead or hung worker is discarded so the next call starts
    /// a new one. `job` names the job in the trace.
    fn call<B: Serialize>(
        &mut self,
        op: &str,
        body: &B,
        job: Option<&str>,
        timeout: Duration,
    ) -> Result<Json, JobFailure> {
        let result = self.worker()?.call_as::<Json>(op, body, job, timeout);
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                if let Some(mut w) = self.worker.take() {
                    w.kill();
                }
                return Err(match e {
                    CallError::Timeout(s) => JobFailure::new(
                        FailureClass::Timeout,
                        format!("no answer to `{op}` within {s:.0} s; worker killed"),
                    ),
                    e => JobFailure::new(FailureClass::Crash, e.to_string()),
                });
            }
        };
        if response.get("ok").and_then(Json::as_bool) == Some(true) {
            return Ok(response);
        }
        let failure = failure_of(&response);
        self.after_failure(&failure);
        Err(failure)
    }

    /// What a failed request leaves: after a launch error the CUDA context
    /// may be poisoned, and a worker that answered out of protocol (a crash
    /// the runner found in its answer) is not trusted: neither is reused.
    pub(crate) fn after_failure(&mut self, failure: &JobFailure) {
        if matches!(
            failure.class,
            FailureClass::LaunchError | FailureClass::Crash
        ) {
            if let Some(mut w) = self.worker.take() {
                w.kill();
            }
        }
    }

    fn check_body<'a>(
        &'a self,
        job: &'a Job,
        kernel: &'a str,
        kind: &'a str,
        tol: ToleranceFor,
        seed: u64,
    ) -> message::Check<'a> {
        message::Check {
            job: self.job_message(job, kernel, kind),
            seed,
            tolerance: tolerance(tol),
            then: None,
            reuse: false,
        }
    }

    /// How many worker processes this backend has started: a restart frees
    /// whatever the previous one had allocated (tensors it shared, say).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// One call of an op outside the [`Backend`] trait (the native path's
    /// `share`, `compare`, `recipe`), with this backend's timeout.
    pub fn request<B: Serialize>(&mut self, op: &str, body: &B) -> Result<Json, JobFailure> {
        self.call(op, body, None, self.timeout)
    }

    /// [`PythonBackend::request`] whose answer must have the fields of `T`.
    pub fn request_as<B: Serialize, T: DeserializeOwned>(
        &mut self,
        op: &str,
        body: &B,
    ) -> Result<T, JobFailure> {
        self.call_for(op, body, None, self.timeout)
    }

    /// A compile worker's `compile` of a Triton job that also makes the
    /// job's native launch recipe (`ask`: `{seed, cache_dir}`, as the lane
    /// asks `recipes`). Only a worker compiling for a target makes one.
    pub fn compile_with_recipe(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        ask: &Json,
    ) -> Result<Compiled, JobFailure> {
        let body = json_of(&message::Compile {
            job: self.job_message(job, kernel, kind),
            recipe: Some(ask),
        });
        let r: message::CompileAnswer =
            self.call_for("compile", &body, Some(&job.id), self.timeout)?;
        Ok(Compiled {
            seconds: r.seconds,
            recipe: r.recipe,
        })
    }

    /// The problem this backend's worker builds.
    pub fn problem(&self) -> &str {
        &self.problem
    }

    /// The IR files methods run from (`ir:`), by method name: their jobs
    /// carry the file to the worker.
    pub fn with_ir_files(
        mut self,
        ir_files: std::collections::HashMap<String, std::path::PathBuf>,
    ) -> Self {
        self.ir_files = ir_files;
        self
    }

    /// A job as the worker takes it, running the problem's `kernel` of `kind`.
    pub fn job_message<'a>(
        &'a self,
        job: &'a Job,
        kernel: &'a str,
        kind: &'a str,
    ) -> message::Job<'a> {
        let variant = job.variant.as_deref();
        message::Job {
            job_id: &job.id,
            problem: &self.problem,
            shape: &job.shape,
            method: message::JobMethod {
                name: &job.method,
                kind,
                kernel,
                ir: self
                    .ir_files
                    .get(&job.method)
                    .map(|ir| ir.display().to_string()),
                modules: variant.filter(|v| !v.modules.is_empty()).map(|v| {
                    v.modules
                        .iter()
                        .map(|(name, file)| (name.clone(), file.display().to_string()))
                        .collect()
                }),
            },
            config: &job.config,
            plant_us: variant.map(|v| v.plant_us).filter(|us| *us > 0.0),
        }
    }

    /// Starts the worker (if needed) and returns its `hello`: what it runs on.
    pub fn hello(&mut self) -> Result<Hello, JobFailure> {
        self.worker()?;
        Ok(self.hello.clone().expect("a started worker said hello"))
    }

    /// Imports and constructs the problem at `shape` and looks up `methods`
    /// (kernel names, each with its kind: a Triton method's declared types
    /// come back with the compile options the worker passes to its kernels),
    /// building nothing else.
    pub fn probe(
        &mut self,
        shape: &Json,
        methods: &[(&str, MethodKind)],
    ) -> Result<Probe, JobFailure> {
        let problem = self.problem.clone();
        let body = message::Probe {
            problem: &problem,
            shape,
            methods: methods.iter().map(|(n, _)| *n).collect(),
            kinds: methods.iter().map(|(n, k)| (*n, k.as_str())).collect(),
        };
        let answer: message::ProbeAnswer = self.call_for("probe", &body, None, self.timeout)?;
        Ok(answer.into())
    }

    /// One call whose reply must have the fields of `T`: a missing or
    /// mistyped field is the worker's failure, never a zero.
    fn call_for<B: Serialize, T: DeserializeOwned>(
        &mut self,
        op: &str,
        body: &B,
        job: Option<&str>,
        timeout: Duration,
    ) -> Result<T, JobFailure> {
        let reply = self.call(op, body, job, timeout)?;
        self.parse(op, reply)
    }

    /// A reply read as `T`; one that does not fit discards the worker.
    fn parse<T: DeserializeOwned>(&mut self, op: &str, reply: Json) -> Result<T, JobFailure> {
        serde_json::from_value(reply).map_err(|e| {
            // A worker that answers out of protocol is not trusted with the next job.
            if let Some(mut w) = self.worker.take() {
                w.kill();
            }
            unfit(&format!("the worker's answer to `{op}`"), e)
        })
    }

    /// Compiles one job (or finds it in Triton's cache) and writes its
    /// kernels' IR and metadata under `dir` (worker op `keep_ir`).
    pub fn keep_ir(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        dir: &std::path::Path,
    ) -> Result<Vec<KeptKernel>, JobFailure> {
        let body = json_of(&message::KeepIr {
            job: self.job_message(job, kernel, kind),
            dir: dir.display().to_string(),
        });
        let r: message::KeepIrAnswer =
            self.call_for("keep_ir", &body, Some(&job.id), self.timeout)?;
        Ok(r.kernels)
    }

    /// Start the worker process now (it answers `hello` before this returns),
    /// rather than at the first job.
    pub fn start(&mut self) -> Result<(), JobFailure> {
        self.worker().map(|_| ())
    }

    pub fn shutdown(&mut self) {
        if let Some(w) = self.worker.take() {
            w.shutdown();
        }
    }
}

/// A request that borrows from the backend, detached from it for the call.
fn json_of(body: &impl Serialize) -> Json {
    serde_json::to_value(body).expect("a request serialises")
}

/// A lane's tolerance as the worker takes it.
pub(crate) fn tolerance(tol: ToleranceFor) -> message::Tolerance {
    message::Tolerance {
        atol: tol.atol,
        rtol: tol.rtol,
        max_mismatch: tol.max_mismatch,
    }
}

impl Backend for PythonBackend {
    fn describe(&mut self, shape: &Json, seed: u64) -> Result<ShapeFacts, JobFailure> {
        let problem = self.problem.clone();
        let body = message::Describe {
            problem: &problem,
            shape,
            seed: Some(seed),
        };
        let r: message::DescribeAnswer = self.call_for("describe", &body, None, self.timeout)?;
        Ok(ShapeFacts {
            flops: r.flops,
            bytes: r.bytes,
            unavailable: r.unavailable,
        })
    }

    fn compile(&mut self, job: &Job, kernel: &str, kind: &str) -> Result<f64, JobFailure> {
        let body = json_of(&message::Compile {
            job: self.job_message(job, kernel, kind),
            recipe: None,
        });
        let r: message::CompileAnswer =
            self.call_for("compile", &body, Some(&job.id), self.timeout)?;
        Ok(r.seconds)
    }

    fn check(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        tol: ToleranceFor,
        seed: u64,
    ) -> Result<CheckResult, JobFailure> {
        self.kernels.clear();
        let reply = {
            let body = self.check_body(job, kernel, kind, tol, seed);
            let body = json_of(&body);
            self.call("check", &body, Some(&job.id), self.timeout)?
        };
        let r: message::CheckAnswer = self.parse("check", reply)?;
        self.kernels = r.kernels.into_iter().map(KernelResources::from).collect();
        Ok(r.comparison.into())
    }

    fn check_then_sample(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        tol: ToleranceFor,
        seed: u64,
        first: FirstBatch,
    ) -> Result<Checked, JobFailure> {
        self.kernels.clear();
        let mut reply = {
            let mut body = self.check_body(job, kernel, kind, tol, seed);
            body.then = Some(then_body(&first));
            body.reuse = first.reuse_check;
            let body = json_of(&body);
            self.call("check", &body, Some(&job.id), self.timeout)?
        };
        let batch = then_reply(&mut reply, first.count);
        let r: message::CheckAnswer = self.parse("check", reply)?;
        self.kernels = r.kernels.into_iter().map(KernelResources::from).collect();
        if let Some(Err(f)) = &batch {
            self.after_failure(f);
        }
        Ok(Checked {
            check: r.comparison.into(),
            first: batch,
        })
    }

    fn take_kernels(&mut self) -> Vec<KernelResources> {
        std::mem::take(&mut self.kernels)
    }

    fn last_done(&self) -> Option<std::time::Instant> {
        self.worker.as_ref().and_then(Worker::last_done)
    }

    fn warmup(&mut self, job_id: &str, launches: u32, ms: f64) -> Result<(), JobFailure> {
        let body = JobWarmup {
            job_id: job_id.to_string(),
            warmup: crate::protocol::Warmup {
                min_launches: launches as u64,
                min_ms: ms,
            },
        };
        self.call("warmup", &body, Some(job_id), self.timeout)?;
        Ok(())
    }

    fn sample(
        &mut self,
        job_id: &str,
        count: u32,
        mode: SampleMode,
    ) -> Result<SampleBatch, JobFailure> {
        let body = JobSample {
            job_id: job_id.to_string(),
            sample: sample_body(count, mode),
        };
        let r: SampleAnswer = self.call_for("sample", &body, Some(job_id), self.timeout)?;
        batch_of(r, count)
    }

    fn sample_turns(
        &mut self,
        job_ids: &[&str],
        (launches, ms): (u32, f64),
        count: u32,
        mode: SampleMode,
    ) -> Result<Option<Vec<SampleBatch>>, JobFailure> {
        let body = JobsTurns {
            job_ids: job_ids.iter().map(|j| j.to_string()).collect(),
            warmup: crate::protocol::Warmup {
                min_launches: launches as u64,
                min_ms: ms,
            },
            sample: sample_body(count, mode),
        };
        let r: TurnsAnswer = self.call_for(
            "sample_turns",
            &body,
            job_ids.first().copied(),
            self.timeout,
        )?;
        if r.us.len() != job_ids.len() {
            return Err(JobFailure::new(
                FailureClass::Crash,
                format!(
                    "protocol error: sample_turns of {} jobs answered {} batches",
                    job_ids.len(),
                    r.us.len()
                ),
            ));
        }
        r.us.into_iter()
            .map(|us| {
                let answer = SampleAnswer {
                    us,
                    timer: r.timer,
                    sm_clock_mhz: r.sm_clock_mhz,
                };
                batch_of(answer, count)
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}
