//! A lane's backend when the run has native methods: its Python worker for
//! everything Python does (inputs, reference, comparison, Triton's and
//! torch's methods), and a native worker on the same GPU that launches and
//! times `kind: cuda|hip` methods and Triton methods with `launch: native`.
//!
//! A native job's check: compile (the pool usually has), share the shape's
//! tensors once (`sharing.rs`: the Python worker exports them, the native
//! worker maps them; with `inputs: native` the Python worker, without
//! torch, only describes them and the native worker builds them), resolve
//! the launch (`recipes.rs`: from the method's expressions, or a Triton
//! job's recipe), launch once into the poisoned shared output, compare with
//! the reference under the same tolerance rule as every method, then
//! warm up and sample (`checks.rs`), in the same protocol the Python worker
//! answers, so the lane's measurement is unchanged. What every lane shares
//! is `setup.rs`'s; this file holds the lane's state and the `Backend`
//! that sends each job to the worker its method runs on.
//!
//! Where the native worker compares itself (the reference is shared) a job's
//! whole measurement is one `check` call, and the lane sends the next job's
//! before it reads the last one's answer (`Backend::send_measurement`): the
//! worker goes from one job to the next without waiting while the lane
//! records. Nothing else is asked of either worker while checks are under
//! way: a job that needs the Python worker first (its recipe, sharing a
//! shape) waits until they are answered, so no other process touches the
//! GPU while the native worker times.

mod checks;
mod recipes;
mod setup;
mod sharing;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::client::NativeProcess;
use crate::backend::python::Hello;
use crate::backend::wire::batch_of;
use crate::backend::{
    Backend, Checked, FirstBatch, JobFailure, PythonBackend, Received, SampleBatch, SampleMode,
    SentAhead, ShapeFacts,
};
use crate::manifest::{Method, Shape, ToleranceFor};
use crate::plan::Job;
use crate::protocol::{Answered, JobSample, JobWarmup, SampleAnswer, Warmup, WarmupAnswer};
use crate::store::{CheckResult, KernelResources};

use checks::UnderWay;
pub use recipes::Launch;
use recipes::{TritonRecipe, RECIPE_BATCH};
pub use setup::NativeSetup;
use sharing::Shared;

/// The lane's native side: its worker, the shape it holds, the recipes read.
struct NativeLane {
    setup: Arc<NativeSetup>,
    process: NativeProcess,
    shared: Option<Shared>,
    /// Triton recipes of the shared shape by job id, read once and kept for
    /// the finalists' checks (cleared when the shape is shared again).
    recipes: HashMap<String, Arc<TritonRecipe>>,
    /// Triton recipes the compile pool made (`inputs: native`), by job id:
    /// over the data the native worker builds from the job's shape and the
    /// run's seed, the same tensors whenever it is built, so kept across shapes.
    from_pool: HashMap<String, Arc<TritonRecipe>>,
    /// The jobs likely to follow a check (the job's id, then the jobs), whose
    /// recipes come with its own.
    ahead: Option<(String, Vec<Job>)>,
    /// Why this lane's native worker cannot run (it failed to start).
    broken: Option<String>,
    /// Checks sent ahead whose answers are still to be read, oldest first.
    under_way: VecDeque<UnderWay>,
}

impl NativeLane {
    /// Whether the job's Triton recipe is at hand: read, or made by the pool.
    fn has_recipe(&self, job_id: &str) -> bool {
        self.recipes.contains_key(job_id) || self.from_pool.contains_key(job_id)
    }

    /// Starts the native worker unless it runs, cannot run in this run, or
    /// would not start before (then `broken` says why).
    fn start(&mut self) {
        if self.setup.unavailable.is_some()
            || self.broken.is_some()
            || self.process.hello().is_some()
        {
            return;
        }
        let started = std::time::Instant::now();
        let helpers = self.setup.helpers();
        // Once per run (the first lane compiles, the others wait for it):
        // traced so that it is not taken for per-job overhead.
        crate::trace::span(
            &self.process.track(),
            "helper kernels",
            started,
            json!({"ok": helpers.is_ok()}),
        );
        match helpers {
            Ok(h) => self.process.set_helpers(h),
            Err(why) => {
                self.broken = Some(format!("tunelab's helper kernels do not compile: {why}"));
                return;
            }
        }
        if let Err(f) = self.process.start() {
            self.broken = Some(f.message.lines().next().unwrap_or("").to_string());
        }
    }
}

/// A lane's backend: Python for everything, native launches beside it.
pub struct LaneBackend {
    pub python: PythonBackend,
    native: Option<NativeLane>,
    /// The prepared job is the native worker's.
    native_prepared: bool,
    /// The kernel the last native check launched, until the lane takes it.
    native_kernels: Vec<KernelResources>,
}

impl LaneBackend {
    /// A lane with only its Python worker.
    pub fn python(python: PythonBackend) -> LaneBackend {
        LaneBackend {
            python,
            native: None,
            native_prepared: false,
            native_kernels: Vec::new(),
        }
    }

    /// A lane that launches `setup`'s methods through `process`.
    pub fn with_native(
        python: PythonBackend,
        setup: Arc<NativeSetup>,
        process: NativeProcess,
    ) -> LaneBackend {
        LaneBackend {
            python,
            native: Some(NativeLane {
                setup,
                process,
                shared: None,
                recipes: HashMap::new(),
                from_pool: HashMap::new(),
                ahead: None,
                broken: None,
                under_way: VecDeque::new(),
            }),
            native_prepared: false,
            native_kernels: Vec::new(),
        }
    }

    pub fn shutdown(&mut self) {
        if let Some(n) = &mut self.native {
            n.process.shutdown();
        }
        self.python.shutdown();
    }

    /// Starts the lane's workers: the Python worker's `hello` on this thread
    /// and, with `native_too` (the run has native jobs to run), the native
    /// worker meanwhile on a thread of its own (helper kernels, process, GPU,
    /// `hello`), so that neither start waits for the other. The Python worker
    /// imports torch for seconds; the native worker took 0.15-0.55 s on an
    /// H200 and used to start inside the first native group, after the Python
    /// worker was up. Without `native_too` it starts when the first group of
    /// a natively launched method begins (`begin_group`). A native worker
    /// that cannot start is this lane's reason, reported at the jobs that
    /// need it.
    pub fn start(&mut self, native_too: bool) -> Result<Hello, JobFailure> {
        let LaneBackend { python, native, .. } = self;
        std::thread::scope(|scope| {
            if let Some(n) = native.as_mut().filter(|_| native_too) {
                scope.spawn(|| n.start());
            }
            python.hello()
        })
    }

    /// Why native launches cannot run on this lane, if they cannot: the
    /// run's reason, or this lane's worker that would not start.
    fn native_reason(&mut self) -> Option<String> {
        let n = self.native.as_mut()?;
        n.start();
        n.setup.unavailable.clone().or_else(|| n.broken.clone())
    }

    /// The native method a job runs as, when it is launched natively here.
    fn native_method(&mut self, job: &Job) -> Option<Arc<Method>> {
        let method = self
            .native
            .as_ref()?
            .setup
            .methods
            .get(&job.method)?
            .clone();
        if self.native_reason().is_some() {
            // A Triton method falls back to its Python launch; a CUDA one was
            // reported unavailable at `describe`. With `inputs: native` the
            // Python worker has no data to launch on: the job is unavailable.
            let native_inputs = self
                .native
                .as_ref()
                .is_some_and(|n| n.setup.lane_target.is_some());
            return (method.kind.is_native() || native_inputs).then_some(method);
        }
        Some(method)
    }

    /// A job's check on the worker its method runs on, going on to `first`'s
    /// batch where given; the prepared job is that worker's from here on.
    fn check_on_either(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        tol: ToleranceFor,
        seed: u64,
        first: Option<FirstBatch>,
    ) -> Result<Checked, JobFailure> {
        self.native_prepared = false;
        self.native_kernels.clear();
        match (self.native_method(job), first) {
            (Some(m), first) => self.check_native(&m, job, tol, seed, first),
            (None, Some(first)) => self
                .python
                .check_then_sample(job, kernel, kind, tol, seed, first),
            (None, None) => self
                .python
                .check(job, kernel, kind, tol, seed)
                .map(|check| Checked { check, first: None }),
        }
    }
}

impl Backend for LaneBackend {
    fn describe(&mut self, shape: &Json, seed: u64) -> Result<ShapeFacts, JobFailure> {
        let mut facts = self.python.describe(shape, seed)?;
        let kernels: Vec<String> = match &self.native {
            Some(n) => n
                .setup
                .methods
                .values()
                .filter(|m| m.kind.is_native())
                .map(|m| m.kernel.clone())
                .collect(),
            None => Vec::new(),
        };
        if !kernels.is_empty() {
            if let Some(why) = self.native_reason() {
                for k in kernels {
                    facts
                        .unavailable
                        .insert(k, format!("native methods cannot run here: {why}"));
                }
            }
        }
        Ok(facts)
    }

    fn begin_group(&mut self, method: &str, shape: &Shape, seed: u64) {
        // The shape's data shared with (or built by) the native worker now,
        // while the lane waits for the group's first compile, rather than at
        // the first job's turn with the compiled jobs waiting: the first
        // check began 9.2 ms after the first compile had ended, 8.6 of them
        // the native worker's `build` (H200 trace, 2026-11-24,
        // results/bench/NVIDIA_H200/native-idle-56a495b).
        let launched_here = self
            .native
            .as_ref()
            .is_some_and(|n| n.setup.methods.contains_key(method));
        if launched_here && self.native_reason().is_none() {
            // A failure is met again, and recorded, at the first job's share.
            let _ = self.share(shape, seed);
        }
    }

    fn compile(&mut self, job: &Job, kernel: &str, kind: &str) -> Result<f64, JobFailure> {
        match self.native.as_ref().and_then(|n| {
            n.setup
                .methods
                .get(&job.method)
                .filter(|m| m.kind.is_native())
        }) {
            Some(m) => {
                let m = m.clone();
                let n = self.native.as_ref().expect("a native lane");
                n.setup.compiler.compile(&m, job).map(|a| a.seconds)
            }
            None => self.python.compile(job, kernel, kind),
        }
    }

    fn check(
        &mut self,
        job: &Job,
        kernel: &str,
        kind: &str,
        tol: ToleranceFor,
        seed: u64,
    ) -> Result<CheckResult, JobFailure> {
        self.check_on_either(job, kernel, kind, tol, seed, None)
            .map(|c| c.check)
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
        self.check_on_either(job, kernel, kind, tol, seed, Some(first))
    }

    fn send_measurement(
        &mut self,
        job: &Job,
        _kernel: &str,
        _kind: &str,
        tol: ToleranceFor,
        seed: u64,
        first: FirstBatch,
    ) -> Result<SentAhead, JobFailure> {
        self.native_prepared = false;
        self.native_kernels.clear();
        self.send_native(job, tol, seed, first)
    }

    fn receive_measurement(&mut self) -> Received {
        self.receive_native()
    }

    fn look_ahead(&mut self, job: &Job, ahead: &mut dyn FnMut(usize) -> Vec<Job>) {
        let triton_native = self
            .native
            .as_ref()
            .and_then(|n| n.setup.methods.get(&job.method))
            .is_some_and(|m| !m.kind.is_native());
        let Some(n) = self.native.as_mut() else {
            return;
        };
        n.ahead = None;
        if triton_native && n.broken.is_none() && !n.has_recipe(&job.id) {
            n.ahead = Some((job.id.clone(), ahead(RECIPE_BATCH - 1)));
        }
    }

    fn offer_recipe(&mut self, job_id: &str, recipe: Json) {
        // Only where the lane's worker would make the same one: over the
        // data the native worker builds, not tensors a Python worker shares.
        let Some(n) = self
            .native
            .as_mut()
            .filter(|n| n.setup.lane_target.is_some())
        else {
            return;
        };
        if let Ok(r) = TritonRecipe::read(recipe) {
            n.from_pool.insert(job_id.to_string(), Arc::new(r));
        }
    }

    fn take_kernels(&mut self) -> Vec<KernelResources> {
        if self.native_prepared {
            std::mem::take(&mut self.native_kernels)
        } else {
            self.python.take_kernels()
        }
    }

    fn last_done(&self) -> Option<std::time::Instant> {
        match &self.native {
            Some(n) if self.native_prepared => n.process.last_done(),
            _ => self.python.last_done(),
        }
    }

    fn warmup(&mut self, job_id: &str, launches: u32, ms: f64) -> Result<(), JobFailure> {
        if !self.native_prepared {
            return self.python.warmup(job_id, launches, ms);
        }
        let n = self.native.as_mut().expect("a native lane");
        let body = JobWarmup {
            job_id: job_id.to_string(),
            warmup: Warmup {
                min_launches: launches as u64,
                min_ms: ms,
            },
        };
        n.process
            .call_as::<Answered<WarmupAnswer>>("warmup", &body, Some(job_id))?;
        Ok(())
    }

    fn sample(
        &mut self,
        job_id: &str,
        count: u32,
        mode: SampleMode,
    ) -> Result<SampleBatch, JobFailure> {
        if !self.native_prepared {
            return self.python.sample(job_id, count, mode);
        }
        let n = self.native.as_mut().expect("a native lane");
        let body = JobSample {
            job_id: job_id.to_string(),
            sample: crate::backend::wire::sample_body(count, mode),
        };
        let answer: Answered<SampleAnswer> = n.process.call_as("sample", &body, Some(job_id))?;
        batch_of(
            answer.into_body().expect("an ok answer has its body"),
            count,
        )
    }

    /// The Python worker's jobs take turns; the native worker's cannot
    /// (it serves no `sample_turns`), so an A/B of a native method times
    /// its rounds a batch a side. The jobs of one call are of one method.
    fn sample_turns(
        &mut self,
        job_ids: &[&str],
        warmup: (u32, f64),
        count: u32,
        mode: SampleMode,
    ) -> Result<Option<Vec<SampleBatch>>, JobFailure> {
        if self.native_prepared {
            return Ok(None);
        }
        self.python.sample_turns(job_ids, warmup, count, mode)
    }
}
