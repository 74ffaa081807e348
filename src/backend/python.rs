//! The Python backend: jobs run in a `tunelab.worker` process, restarted
//! whenever it crashes, hangs or faults.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value as Json};

use super::worker::{Answer, CallError, Worker, WorkerSpec};
use super::{
    Backend, Checked, Compiled, FirstBatch, JobFailure, SampleBatch, SampleMode, ShapeFacts,
    TimedBatch,
};
use indexmap::IndexMap;

use crate::manifest::{ConfigType, MethodKind, ToleranceFor};
use crate::measure::{L2Flush, Timer};
use crate::plan::Job;
use crate::store::{CheckResult, FailureClass, KernelResources};

/// The worker protocol this runner speaks (docs/worker-protocol.md). A worker
/// that answers `hello` with another version is refused at start-up.
pub const PROTOCOL_VERSION: u32 = 3;

/// How long a new worker may take to import torch and Triton and answer `hello`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

/// A worker's answer to `hello`: what it runs on.
#[derive(Debug, Clone, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub python: String,
    pub torch: Option<String>,
    pub triton: Option<String>,
    pub cuda: Option<String>,
}

/// A worker's answer to `probe`: whether the problem has each method, and
/// the config types each declares.
#[derive(Debug, Clone, Deserialize)]
pub struct Probe {
    pub methods: IndexMap<String, ProbedMethod>,
    /// Every method the problem has.
    pub available: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ProbedMethod {
    pub found: bool,
    /// `None`: the method declares no types.
    pub config_types: Option<IndexMap<String, ConfigType>>,
    /// The first line of the method's documentation, if it has one.
    #[serde(default)]
    pub description: Option<String>,
}

/// The failure a worker's `ok: false` answer reports (its class and message).
pub fn failure_of(response: &Json) -> JobFailure {
    failure_from(response.class(), response.message())
}

/// The failure a worker's answer names by its `class` and `message`.
pub fn failure_from(class: Option<&str>, message: Option<&str>) -> JobFailure {
    let class = match class.unwrap_or("") {
        "compile_error" => FailureClass::CompileError,
        "out_of_resources" => FailureClass::OutOfResources,
        "launch_error" => FailureClass::LaunchError,
        "mismatch" => FailureClass::Mismatch,
        "nan" => FailureClass::Nan,
        _ => FailureClass::ProblemError,
    };
    JobFailure::new(class, message.unwrap_or("no message").to_string())
}

/// A kernel whose IR a worker wrote (`keep_ir`): its resources and files.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
pub struct KeptKernel {
    pub name: String,
    pub n_regs: Option<u32>,
    pub n_spills: Option<u32>,
    pub shared: u64,
    pub num_warps: u32,
    pub num_stages: u32,
    /// File names written, in the job's folder.
    pub files: Vec<String>,
}

/// `null` where a problem's count is not a finite number (JSON has no NaN).
#[derive(Deserialize)]
struct DescribeReply {
    flops: Option<f64>,
    bytes: Option<f64>,
    /// Methods that cannot run in this worker; a compile worker cannot tell
    /// and leaves it out.
    #[serde(default)]
    unavailable: IndexMap<String, String>,
}

#[derive(Deserialize)]
struct CompileReply {
    seconds: f64,
    /// Only when asked for (`compile_with_recipe`).
    #[serde(default)]
    recipe: Option<Json>,
}

#[derive(Deserialize)]
pub(crate) struct CheckReply {
    /// The kernels the check compiled and launched (absent from a worker
    /// that predates the field).
    #[serde(default)]
    pub(crate) kernels: Vec<KernelResources>,
    passed: bool,
    max_abs_err: Option<f64>,
    max_rel_err: Option<f64>,
    mismatch_frac: f64,
    nan_count: u64,
    inf_count: u64,
    elements: u64,
}

impl From<CheckReply> for CheckResult {
    fn from(r: CheckReply) -> CheckResult {
        CheckResult {
            passed: r.passed,
            max_abs_err: r.max_abs_err,
            max_rel_err: r.max_rel_err,
            mismatch_frac: r.mismatch_frac,
            nan_count: r.nan_count,
            inf_count: r.inf_count,
            elements: r.elements,
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct SampleReply {
    pub us: Vec<f64>,
    pub timer: Timer,
    pub sm_clock_mhz: Option<f64>,
}

impl SampleReply {
    /// The batch, if the worker sent as many samples as it was asked for.
    pub(crate) fn into_batch(self, count: u32) -> Result<SampleBatch, JobFailure> {
        if self.us.len() != count as usize {
            return Err(JobFailure::new(
                FailureClass::Crash,
                format!(
                    "protocol error: asked for {count} samples, got {}",
                    self.us.len()
                ),
            ));
        }
        Ok(SampleBatch {
            us: self.us,
            timer: self.timer,
            sm_clock_mhz: self.sm_clock_mhz,
        })
    }
}

/// The `sample` request both workers take (Python's and the native one).
pub(crate) fn sample_request(job_id: &str, count: u32, mode: SampleMode) -> serde_json::Value {
    // The protocol knows a read and a memset; no flush is a size of zero.
    let flush = mode.flush;
    let (bytes, with) = match flush.with {
        L2Flush::Off => (0, "read"),
        L2Flush::Read => (flush.bytes, "read"),
        L2Flush::Memset => (flush.bytes, "memset"),
    };
    json!({
        "job_id": job_id,
        "count": count,
        "flush_bytes": bytes,
        "flush_with": with,
        "timing": mode.timing.as_str(),
        "graph_calls": mode.graph_calls,
    })
}

/// The `then` of a `check` request (both workers take it): what to do
/// after a passing check, in the same call.
pub(crate) fn then_request(first: &FirstBatch) -> Json {
    let mut sample = sample_request("", first.count, first.mode);
    if let Some(fields) = sample.as_object_mut() {
        fields.remove("job_id");
    }
    let mut then = json!({
        "warmup": {"min_launches": first.warmup_launches, "min_ms": first.warmup_ms},
        "sample": sample,
    });
    if let Some(until) = &first.until {
        then["until"] = json!(until);
    }
    then
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
    Some(ThenAnswer::read(serde_json::from_value(then), count))
}

/// A `check` answer's `then`, as both workers send it: the warm-up and the
/// first batch (and, from a worker that went on under `until`, the batches
/// after it in `more`), or why they failed.
#[derive(Deserialize)]
pub(crate) struct ThenAnswer {
    #[serde(default)]
    ok: bool,
    sample: Option<SampleReply>,
    wall_ms: Option<f64>,
    #[serde(default)]
    more: Vec<MoreBatch>,
    class: Option<String>,
    message: Option<String>,
}

/// A batch a worker took after the first under `until`.
#[derive(Deserialize)]
pub(crate) struct MoreBatch {
    sample: SampleReply,
    wall_ms: f64,
}

impl ThenAnswer {
    /// A `then` as parsed, from either worker's answer: its batches, or the
    /// failure that it does not fit.
    pub(crate) fn read(
        parsed: serde_json::Result<ThenAnswer>,
        count: u32,
    ) -> Result<Vec<TimedBatch>, JobFailure> {
        match parsed {
            Ok(then) => then.into_batches(count),
            Err(e) => Err(JobFailure::new(
                FailureClass::Crash,
                format!("protocol error: the `then` of the answer to `check` does not fit ({e})"),
            )),
        }
    }

    /// The batches in order, if they went well and each holds the `count`
    /// samples asked for.
    pub(crate) fn into_batches(self, count: u32) -> Result<Vec<TimedBatch>, JobFailure> {
        if !self.ok {
            return Err(failure_from(self.class.as_deref(), self.message.as_deref()));
        }
        let (Some(first), Some(wall_ms)) = (self.sample, self.wall_ms) else {
            return Err(JobFailure::new(
                FailureClass::Crash,
                "protocol error: the `then` of the answer to `check` has no `sample` or `wall_ms`",
            ));
        };
        std::iter::once(MoreBatch {
            sample: first,
            wall_ms,
        })
        .chain(self.more)
        .map(|b| {
            b.sample.into_batch(count).map(|batch| TimedBatch {
                batch,
                wall_ms: b.wall_ms,
            })
        })
        .collect()
    }
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
            let hello = match w.call("hello", serde_json::json!({}), STARTUP_TIMEOUT) {
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

    /// One call; a dead or hung worker is discarded so the next call starts a new one.
    fn call(&mut self, op: &str, body: Json, timeout: Duration) -> Result<Json, JobFailure> {
        let result = self.worker()?.call(op, body, timeout);
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

    fn check_body(
        &self,
        job: &Job,
        kernel: &str,
        kind: &str,
        tol: ToleranceFor,
        seed: u64,
    ) -> Json {
        json!({
            "job": self.job_json(job, kernel, kind),
            "seed": seed,
            "tolerance": {"atol": tol.atol, "rtol": tol.rtol, "max_mismatch": tol.max_mismatch},
        })
    }

    /// How many worker processes this backend has started: a restart frees
    /// whatever the previous one had allocated (tensors it shared, say).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// One call of an op outside the [`Backend`] trait (the native path's
    /// `share`, `compare`, `recipe`), with this backend's timeout.
    pub fn request(&mut self, op: &str, body: Json) -> Result<Json, JobFailure> {
        self.call(op, body, self.timeout)
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
        let body = json!({"job": self.job_json(job, kernel, kind), "recipe": ask});
        let r: CompileReply = self.call_for("compile", body, self.timeout)?;
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

    pub fn job_json(&self, job: &Job, kernel: &str, kind: &str) -> Json {
        let mut method = json!({"name": job.method, "kind": kind, "kernel": kernel});
        if let Some(ir) = self.ir_files.get(&job.method) {
            method["ir"] = json!(ir.display().to_string());
        }
        let variant = job.variant.as_deref();
        if let Some(v) = variant.filter(|v| !v.modules.is_empty()) {
            let modules: serde_json::Map<String, Json> = v
                .modules
                .iter()
                .map(|(name, file)| (name.clone(), json!(file.display().to_string())))
                .collect();
            method["modules"] = Json::Object(modules);
        }
        let mut body = json!({
            "job_id": job.id,
            "problem": self.problem,
            "shape": job.shape,
            "method": method,
            "config": job.config,
        });
        if let Some(v) = variant.filter(|v| v.plant_us > 0.0) {
            body["plant_us"] = json!(v.plant_us);
        }
        body
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
        let names: Vec<&str> = methods.iter().map(|(n, _)| *n).collect();
        let kinds: serde_json::Map<String, Json> = methods
            .iter()
            .map(|(n, k)| (n.to_string(), json!(k.as_str())))
            .collect();
        self.call_for(
            "probe",
            json!({"problem": self.problem, "shape": shape, "methods": names, "kinds": kinds}),
            self.timeout,
        )
    }

    /// One call whose reply must have the fields of `T`: a missing or
    /// mistyped field is the worker's failure, never a zero.
    fn call_for<T: DeserializeOwned>(
        &mut self,
        op: &str,
        body: Json,
        timeout: Duration,
    ) -> Result<T, JobFailure> {
        let reply = self.call(op, body, timeout)?;
        self.parse(op, reply)
    }

    /// A reply read as `T`; one that does not fit discards the worker.
    fn parse<T: DeserializeOwned>(&mut self, op: &str, reply: Json) -> Result<T, JobFailure> {
        serde_json::from_value(reply).map_err(|e| {
            // A worker that answers out of protocol is not trusted with the next job.
            if let Some(mut w) = self.worker.take() {
                w.kill();
            }
            JobFailure::new(
                FailureClass::Crash,
                format!("protocol error: the worker's answer to `{op}` does not fit ({e})"),
            )
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
        #[derive(Deserialize)]
        struct Reply {
            kernels: Vec<KeptKernel>,
        }
        let body =
            json!({"job": self.job_json(job, kernel, kind), "dir": dir.display().to_string()});
        let r: Reply = self.call_for("keep_ir", body, self.timeout)?;
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

impl Backend for PythonBackend {
    fn describe(&mut self, shape: &Json, seed: u64) -> Result<ShapeFacts, JobFailure> {
        let r: DescribeReply = self.call_for(
            "describe",
            json!({"problem": self.problem, "shape": shape, "seed": seed}),
            self.timeout,
        )?;
        Ok(ShapeFacts {
            flops: r.flops,
            bytes: r.bytes,
            unavailable: r.unavailable,
        })
    }

    fn compile(&mut self, job: &Job, kernel: &str, kind: &str) -> Result<f64, JobFailure> {
        let body = json!({"job": self.job_json(job, kernel, kind)});
        let r: CompileReply = self.call_for("compile", body, self.timeout)?;
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
        let body = self.check_body(job, kernel, kind, tol, seed);
        self.kernels.clear();
        let mut r: CheckReply = self.call_for("check", body, self.timeout)?;
        self.kernels = std::mem::take(&mut r.kernels);
        Ok(r.into())
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
        let mut body = self.check_body(job, kernel, kind, tol, seed);
        body["then"] = then_request(&first);
        if first.reuse_check {
            body["reuse"] = Json::Bool(true);
        }
        self.kernels.clear();
        let mut reply = self.call("check", body, self.timeout)?;
        let batch = then_reply(&mut reply, first.count);
        let mut r: CheckReply = self.parse("check", reply)?;
        self.kernels = std::mem::take(&mut r.kernels);
        if let Some(Err(f)) = &batch {
            self.after_failure(f);
        }
        Ok(Checked {
            check: r.into(),
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
        self.call(
            "warmup",
            json!({"job_id": job_id, "min_launches": launches, "min_ms": ms}),
            self.timeout,
        )?;
        Ok(())
    }

    fn sample(
        &mut self,
        job_id: &str,
        count: u32,
        mode: SampleMode,
    ) -> Result<SampleBatch, JobFailure> {
        let r: SampleReply =
            self.call_for("sample", sample_request(job_id, count, mode), self.timeout)?;
        r.into_batch(count)
    }
}
