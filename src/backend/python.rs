//! The Python backend: jobs run in a `tunelab.worker` process, restarted
//! whenever it crashes, hangs or faults.

use std::time::Duration;

use serde_json::{json, Value as Json};

use super::worker::{CallError, Worker, WorkerSpec};
use super::{Backend, Flush, JobFailure, SampleBatch};
use crate::manifest::model::ToleranceFor;
use crate::plan::Job;
use crate::store::{CheckResult, FailureClass};

/// How long a new worker may take to import torch and Triton and answer `hello`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

pub struct PythonBackend {
    spec: WorkerSpec,
    worker: Option<Worker>,
    problem: String,
    timeout: Duration,
}

impl PythonBackend {
    pub fn new(spec: WorkerSpec, problem: &str, timeout: Duration) -> PythonBackend {
        PythonBackend {
            spec,
            worker: None,
            problem: problem.to_string(),
            timeout,
        }
    }

    fn worker(&mut self) -> Result<&mut Worker, JobFailure> {
        if self.worker.is_none() {
            let started = std::time::Instant::now();
            let mut w = Worker::spawn(&self.spec).map_err(|e| {
                JobFailure::new(
                    FailureClass::Crash,
                    format!("cannot start {}: {e}", self.spec.python),
                )
            })?;
            // Importing torch and Triton takes seconds, more on a loaded machine:
            // wait for the worker to be ready so start-up never eats a job's timeout.
            if let Err(e) = w.call("hello", serde_json::json!({}), STARTUP_TIMEOUT) {
                w.kill();
                return Err(JobFailure::new(
                    FailureClass::Crash,
                    format!("worker did not start: {e:?}"),
                ));
            }
            crate::trace::span(w.name(), "start-up", started, json!({"pid": w.pid()}));
            self.worker = Some(w);
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
                    CallError::Crash(m) => JobFailure::new(FailureClass::Crash, m),
                    CallError::Protocol(m) => {
                        JobFailure::new(FailureClass::Crash, format!("protocol error: {m}"))
                    }
                });
            }
        };
        if response.get("ok").and_then(Json::as_bool) == Some(true) {
            return Ok(response);
        }
        let class = match response.get("class").and_then(Json::as_str).unwrap_or("") {
            "compile_error" => FailureClass::CompileError,
            "out_of_resources" => FailureClass::OutOfResources,
            "launch_error" => FailureClass::LaunchError,
            "mismatch" => FailureClass::Mismatch,
            "nan" => FailureClass::Nan,
            _ => FailureClass::ProblemError,
        };
        if class == FailureClass::LaunchError {
            // The CUDA context may be poisoned: never reuse this worker.
            if let Some(mut w) = self.worker.take() {
                w.kill();
            }
        }
        let message = response
            .get("message")
            .and_then(Json::as_str)
            .unwrap_or("no message")
            .to_string();
        Err(JobFailure::new(class, message))
    }

    fn job_json(&self, job: &Job, kernel: &str, kind: &str) -> Json {
        json!({
            "job_id": job.id,
            "problem": self.problem,
            "shape": job.shape,
            "method": {"name": job.method, "kind": kind, "kernel": kernel},
            "config": job.config,
        })
    }

    pub fn hello(&mut self) -> Result<Json, JobFailure> {
        self.call("hello", json!({}), Duration::from_secs(120))
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
    fn describe(&mut self, shape: &Json, seed: u64) -> Result<(f64, f64), JobFailure> {
        let r = self.call(
            "describe",
            json!({"problem": self.problem, "shape": shape, "seed": seed}),
            self.timeout,
        )?;
        Ok((
            r["flops"].as_f64().unwrap_or(0.0),
            r["bytes"].as_f64().unwrap_or(0.0),
        ))
    }

    fn compile(&mut self, job: &Job, kernel: &str, kind: &str) -> Result<f64, JobFailure> {
        let body = json!({"job": self.job_json(job, kernel, kind)});
        let r = self.call("compile", body, self.timeout)?;
        Ok(r["seconds"].as_f64().unwrap_or(0.0))
    }

    fn check(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        tol: ToleranceFor,
        seed: u64,
    ) -> Result<CheckResult, JobFailure> {
        let body = json!({
            "job": self.job_json(job, kernel, kind),
            "seed": seed,
            "tolerance": {"atol": tol.atol, "rtol": tol.rtol, "max_mismatch": tol.max_mismatch},
        });
        let r = self.call("check", body, self.timeout)?;
        Ok(CheckResult {
            passed: r["passed"].as_bool().unwrap_or(false),
            max_abs_err: r["max_abs_err"].as_f64(),
            max_rel_err: r["max_rel_err"].as_f64(),
            mismatch_frac: r["mismatch_frac"].as_f64().unwrap_or(1.0),
            nan_count: r["nan_count"].as_u64().unwrap_or(0),
            inf_count: r["inf_count"].as_u64().unwrap_or(0),
            elements: r["elements"].as_u64().unwrap_or(0),
        })
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
        flush: Flush,
    ) -> Result<SampleBatch, JobFailure> {
        let r = self.call(
            "sample",
            json!({
                "job_id": job_id,
                "count": count,
                "flush_bytes": flush.bytes,
                "flush_with": flush.with.as_str(),
            }),
            self.timeout,
        )?;
        let us: Vec<f64> = r["us"]
            .as_array()
            .map(|a| a.iter().filter_map(Json::as_f64).collect())
            .unwrap_or_default();
        Ok(SampleBatch {
            us,
            timer: r["timer"].as_str().unwrap_or("unknown").to_string(),
            sm_clock_mhz: r["sm_clock_mhz"].as_f64(),
        })
    }
}
