//! A lane's backend when the run has native methods: its Python worker for
//! everything Python does (inputs, reference, comparison, Triton's and
//! torch's methods), and a native worker on the same GPU that launches and
//! times `kind: cuda|hip` methods and Triton methods with `launch: native`.
//!
//! A native job's check: compile (the pool usually has), share the shape's
//! tensors once (the Python worker exports them, the native worker maps them;
//! with `inputs: native` the Python worker, without torch, only describes
//! them and the native worker builds them),
//! launch once into the poisoned shared output, then the Python worker
//! compares it with the reference under the same tolerance rule as every
//! method. Warm-up and samples then go to the native worker, in the same
//! protocol the Python worker answers, so the lane's measurement is unchanged.
//!
//! Where the native worker compares itself (the reference is shared) a job's
//! whole measurement is one `check` call, and the lane sends the next job's
//! before it reads the last one's answer (`Backend::send_measurement`): the
//! worker goes from one job to the next without waiting while the lane
//! records. Nothing else is asked of either worker while checks are under
//! way: a job that needs the Python worker first (its recipe, sharing a
//! shape) waits until they are answered, so no other process touches the
//! GPU while the native worker times.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};

use super::client::{NativeProcess, SentAhead as SentRequest};
use super::compile::{context, eval, NativeCompiler};
use crate::backend::python::{
    sample_request, then_request, CheckReply, Hello, SampleReply, ThenAnswer,
};
use crate::backend::{
    Backend, Checked, FirstBatch, JobFailure, PythonBackend, Received, SampleBatch, SampleMode,
    SentAhead, ShapeFacts, TimedBatch,
};
use crate::manifest::{KernelArg, LaunchPath, Method, ScalarType, Shape, ToleranceFor};
use crate::plan::Job;
use crate::store::{CheckResult, FailureClass, KernelResources};

/// What every lane's native side shares.
pub struct NativeSetup {
    pub problem: String,
    /// The methods launched natively, by name (shared: a lane looks one up
    /// at every check).
    pub methods: HashMap<String, Arc<Method>>,
    pub compiler: Arc<NativeCompiler>,
    device: Json,
    /// Why no native launch can run in this run; `None` when they can.
    pub unavailable: Option<String>,
    /// Where Triton methods' cubins go for native launches.
    cache_dir: PathBuf,
    /// `inputs: native` in effect: the native worker builds each shape's
    /// data (`build`) and the lane's Python worker, started with this
    /// compile target, has no torch and no GPU (it answers `native_data` and
    /// recipes over stand-ins). `None`: the Python worker builds and shares.
    pub lane_target: Option<String>,
    helpers: OnceLock<Result<PathBuf, String>>,
}

impl NativeSetup {
    /// `methods`: the experiment's methods (those launched natively are kept);
    /// `unavailable`: why this run cannot launch natively at all (interpreter mode).
    pub fn new(
        problem: &str,
        methods: &[Method],
        compiler: Arc<NativeCompiler>,
        device: &crate::device::DeviceInfo,
        cache_dir: PathBuf,
        unavailable: Option<String>,
    ) -> NativeSetup {
        let methods: HashMap<String, Arc<Method>> = methods
            .iter()
            .filter(|m| m.launch == LaunchPath::Native)
            .map(|m| (m.name.clone(), Arc::new(m.clone())))
            .collect();
        // Without the runtime compiler neither kind: it compiles the helper kernels too.
        let unavailable = unavailable.or_else(|| {
            if device.backend == "hip" && !cfg!(feature = "hip") {
                return Some("this tunelab was built without the `hip` feature".into());
            }
            compiler.rtc().err()
        });
        NativeSetup {
            problem: problem.to_string(),
            methods,
            compiler,
            device: Json::Object(crate::manifest::device_fields(device)),
            unavailable,
            cache_dir,
            lane_target: None,
            helpers: OnceLock::new(),
        }
    }

    /// Whether any method of the run is launched natively.
    pub fn any(&self) -> bool {
        !self.methods.is_empty()
    }

    /// Where Triton methods' cubins go for native launches.
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// The helper kernels' image, compiled once.
    fn helpers(&self) -> Result<PathBuf, String> {
        self.helpers
            .get_or_init(|| {
                self.compiler
                    .compile_helpers()
                    .map(|a| a.image)
                    .map_err(|f| f.message)
            })
            .clone()
    }
}

#[derive(Debug, Clone, Deserialize)]
struct SharedTensor {
    name: String,
    /// torch's name for the element type (float32, bfloat16, ...).
    #[serde(default)]
    dtype: String,
    /// The allocation's IPC handle (empty for a tensor the native worker built).
    #[serde(default)]
    handle: String,
    #[serde(default)]
    offset: u64,
    bytes: u64,
    /// How the native worker fills it (`inputs: native`), as `build` takes it.
    #[serde(default)]
    fill: Json,
}

#[derive(Debug, Clone, Deserialize)]
struct ShareReply {
    tensors: Vec<SharedTensor>,
    out: usize,
    /// The reference's tensor, where the native worker can compare with it
    /// (float32/16 or bfloat16, contiguous); else the Python worker compares.
    #[serde(default)]
    reference: Option<usize>,
    poison: String,
    elements: u64,
    uuid: String,
}

/// The shape whose tensors the native worker has mapped.
struct Shared {
    key: String,
    python_generation: u64,
    native_generation: u64,
    reply: ShareReply,
}

/// A Triton job's recipe, as read from the Python worker's answer.
struct TritonRecipe {
    launch: Launch,
    /// What Triton compiled (stages included), as a Python check reports it.
    kernels: Vec<KernelResources>,
}

impl TritonRecipe {
    fn read(mut answer: Json) -> Result<TritonRecipe, JobFailure> {
        let kernels = answer
            .get_mut("kernels")
            .map(Json::take)
            .and_then(|k| serde_json::from_value(k).ok())
            .unwrap_or_default();
        Ok(TritonRecipe {
            launch: Launch::from_recipe(answer)?,
            kernels,
        })
    }
}

/// Triton recipes asked for in one Python call at most: the job about to be
/// checked and the next compiled jobs of its group.
const RECIPE_BATCH: usize = 16;

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

/// A check sent ahead (`Backend::send_measurement`), as its answer is read.
struct UnderWay {
    sent: SentRequest,
    job_id: String,
    first: FirstBatch,
    /// What Triton compiled, from the job's recipe (empty for a native method).
    kernels: Vec<KernelResources>,
}

/// A native job's launch, as `ready_launch` made it.
enum ReadyLaunch {
    Resolved(Launch),
    Recipe(Arc<TritonRecipe>),
}

impl ReadyLaunch {
    fn launch(&self) -> &Launch {
        match self {
            ReadyLaunch::Resolved(l) => l,
            ReadyLaunch::Recipe(r) => &r.launch,
        }
    }

    /// What Triton compiled, from a recipe (stages included); empty for a
    /// native method, whose kernel the worker describes in its answer.
    fn kernels(&self) -> Vec<KernelResources> {
        match self {
            ReadyLaunch::Resolved(_) => Vec::new(),
            ReadyLaunch::Recipe(r) => r.kernels.clone(),
        }
    }
}

/// Which shape and inputs a sharing is of.
fn share_key(shape: &Shape, seed: u64) -> String {
    format!(
        "{}\u{1}{}",
        serde_json::to_string(shape).expect("shape"),
        seed
    )
}

/// How much longer than one call's timeout a check may take: a check that
/// samples until the rule, up to the rule's wall cap.
fn sampling_time(first: Option<&FirstBatch>) -> std::time::Duration {
    match first {
        Some(FirstBatch {
            until: Some(rule), ..
        }) if rule.max_wall_ms.is_finite() => {
            std::time::Duration::from_secs_f64(rule.max_wall_ms / 1e3)
        }
        _ => std::time::Duration::ZERO,
    }
}

/// The native worker's `check` of `launch` for `job_id` over the shared
/// tensors: the output poisoned first, compared with the shared reference
/// in the same call where there is one (sparing the Python worker's round
/// trip) and, with `first`, going on to the batches.
fn native_check_request<'a>(
    shared: &'a ShareReply,
    launch: &'a Launch,
    job_id: &'a str,
    tol: ToleranceFor,
    first: Option<&FirstBatch>,
) -> CheckRequest<'a> {
    let compare = shared.reference.map(|reference| CompareRequest {
        out: shared.out,
        out_dtype: &shared.tensors[shared.out].dtype,
        reference,
        reference_dtype: &shared.tensors[reference].dtype,
        elements: shared.elements,
        atol: tol.atol,
        rtol: tol.rtol,
        max_mismatch: tol.max_mismatch,
    });
    let then = match (&compare, first) {
        (Some(_), Some(first)) => Some(then_request(first)),
        _ => None,
    };
    let poison = Poison {
        tensor: shared.out,
        pattern: &shared.poison,
        elements: shared.elements,
    };
    launch.check_request(job_id, poison, compare, then)
}

impl NativeLane {
    /// Whether the job's Triton recipe is at hand: read, or made by the pool.
    fn has_recipe(&self, job_id: &str) -> bool {
        self.recipes.contains_key(job_id) || self.from_pool.contains_key(job_id)
    }

    /// The shape the native worker now holds (mapped or built), for the
    /// workers of these generations. Recipes name its tensors by index:
    /// another shape, new recipes.
    fn hold(&mut self, key: String, python_generation: u64, reply: ShareReply) {
        self.recipes.clear();
        self.shared = Some(Shared {
            key,
            python_generation,
            native_generation: self.process.generation(),
            reply,
        });
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

/// The kernel a native worker's `check` answer describes: registers and
/// local memory as the driver reports them for the loaded function, shared
/// memory per block (static and dynamic), and the block's threads.
#[derive(Deserialize)]
struct NativeKernel {
    name: String,
    n_regs: Option<u64>,
    local_bytes: Option<u64>,
    #[serde(default)]
    shared: u64,
    threads: Option<u64>,
}

impl From<NativeKernel> for KernelResources {
    /// Spills counted as Triton counts them (local bytes / 4), warps from the
    /// block size; stages do not apply (0).
    fn from(k: NativeKernel) -> KernelResources {
        KernelResources {
            name: k.name,
            n_regs: k.n_regs.map(|v| v as u32),
            n_spills: k.local_bytes.map(|v| (v / 4) as u32),
            shared: k.shared,
            num_warps: k.threads.map_or(0, |t| t.div_ceil(32) as u32),
            num_stages: 0,
        }
    }
}

crate::answer_envelope! {
    /// The native worker's answer to `check`, read as it comes: the
    /// comparison where it made one (`null`: the Python worker compares),
    /// the first batch where asked for, and the kernel.
    struct CheckAnswer {
        compared: Option<CheckReply>,
        /// Read after the rest (`then_of`): a `then` that does not fit is a
        /// failure of the batches, and the check's verdict stands.
        then: Option<Box<serde_json::value::RawValue>>,
        kernel: Option<NativeKernel>,
    }
}

/// A native check answer's `then` (kept as its text, read here): the first
/// batches, their failure, or `None` where the worker did not go on.
fn then_of(
    then: Option<Box<serde_json::value::RawValue>>,
    count: u32,
) -> Option<Result<Vec<TimedBatch>, JobFailure>> {
    // A `null` then arrives as `None` (serde reads null into an Option).
    let then = then?;
    Some(ThenAnswer::read(serde_json::from_str(then.get()), count))
}

crate::answer_envelope! {
    /// The native worker's answer to `sample`.
    struct SampleAnswer {
        us: Option<Vec<f64>>,
        timer: Option<crate::measure::Timer>,
        sm_clock_mhz: Option<f64>,
    }
}

/// The native worker's `check` request, serialised as it stands (one a job).
#[derive(Serialize)]
struct CheckRequest<'a> {
    job_id: &'a str,
    image: &'a std::path::Path,
    symbol: &'a str,
    grid: &'a [u64],
    block: &'a [u64],
    shared: u64,
    args: &'a [Json],
    poison: Poison<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compare: Option<CompareRequest<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    then: Option<Json>,
}

/// The pattern the output is filled with before the check's launch.
#[derive(Serialize)]
struct Poison<'a> {
    tensor: usize,
    pattern: &'a str,
    elements: u64,
}

/// The comparison the native worker makes with the shared reference.
#[derive(Serialize)]
struct CompareRequest<'a> {
    out: usize,
    out_dtype: &'a str,
    reference: usize,
    reference_dtype: &'a str,
    elements: u64,
    atol: f64,
    rtol: f64,
    max_mismatch: f64,
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

    /// A native job's check; with `first`, the native worker goes on to the
    /// warm-up and the first batch in the same call where it compares itself.
    fn check_native(
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
        let checked: CheckAnswer = n.process.call_as_longer(
            "check",
            &request,
            Some(&job.id),
            sampling_time(first.as_ref()),
        )?;
        let (compared, batch) = self.read_answer(checked, first.as_ref(), ready.kernels());
        let r: CheckReply = match compared {
            Some(c) => c,
            None => {
                let compared = self.python_compare(job, seed, tol)?;
                serde_json::from_value(compared).map_err(|e| {
                    JobFailure::new(
                        FailureClass::Crash,
                        format!("protocol error: the answer to `compare` does not fit ({e})"),
                    )
                })?
            }
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
        Option<CheckReply>,
        Option<Result<Vec<TimedBatch>, JobFailure>>,
    ) {
        let n = self.native.as_mut().expect("a native lane");
        let batch = first.and_then(|f| then_of(answer.then, f.count));
        if let Some(Err(f)) = &batch {
            n.process.after_failure(f);
        }
        self.native_kernels = if recipe_kernels.is_empty() {
            answer
                .kernel
                .map(KernelResources::from)
                .into_iter()
                .collect()
        } else {
            recipe_kernels
        };
        self.native_prepared = true;
        (answer.compared, batch)
    }

    /// A native job's launch, ready to send: compiled and resolved from its
    /// method's expressions (CUDA C++, HIP), or a Triton job's recipe; the
    /// shape's tensors shared with the native worker either way.
    fn ready_launch(
        &mut self,
        method: &Method,
        job: &Job,
        seed: u64,
    ) -> Result<ReadyLaunch, JobFailure> {
        if method.kind.is_native() {
            let n = self.native.as_ref().expect("a native lane");
            let artifact = n.setup.compiler.compile(method, job)?;
            self.share(&job.shape, seed)?;
            let n = self.native.as_ref().expect("a native lane");
            let shared = &n.shared.as_ref().expect("shared").reply;
            let launch = resolve(method, job, shared, &n.setup.device)?
                .with_image(artifact.image, artifact.symbol);
            return Ok(ReadyLaunch::Resolved(launch));
        }
        self.share(&job.shape, seed)?;
        let cache = self
            .native
            .as_ref()
            .expect("a native lane")
            .setup
            .cache_dir
            .clone();
        Ok(ReadyLaunch::Recipe(self.recipe(method, job, seed, cache)?))
    }

    /// Whether `ready_launch` would make no call to either worker: the
    /// shape is shared with the running native worker and, for a Triton
    /// job, its recipe was read.
    fn ready_without_calls(&self, method: &Method, job: &Job, seed: u64) -> bool {
        let Some(n) = self.native.as_ref() else {
            return false;
        };
        let shared = n.shared.as_ref().is_some_and(|s| {
            s.key == share_key(&job.shape, seed)
                && s.python_generation == self.python.generation()
                && s.native_generation == n.process.generation()
        });
        shared && (method.kind.is_native() || n.has_recipe(&job.id))
    }

    /// `Backend::send_measurement` for a native job whose reference is
    /// shared (the native worker compares, and the Python worker has nothing
    /// to do with its output): the request written, its answer read later.
    fn send_native(
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
    fn receive_native(&mut self) -> Received {
        let n = self.native.as_mut().expect("a native lane");
        let u = n
            .under_way
            .pop_front()
            .expect("a measurement under way to receive");
        let answer = n.process.receive_as_longer::<CheckAnswer>(
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
            Some(Ok(a)) => a,
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

    /// A Triton job's recipe: kept from an earlier batch, or asked for with
    /// the recipes of the jobs ahead of it (`look_ahead`) in one call.
    fn recipe(
        &mut self,
        method: &Method,
        job: &Job,
        seed: u64,
        cache: PathBuf,
    ) -> Result<Arc<TritonRecipe>, JobFailure> {
        let n = self.native.as_mut().expect("a native lane");
        if let Some(r) = n.recipes.get(&job.id).or_else(|| n.from_pool.get(&job.id)) {
            return Ok(r.clone());
        }
        // Offered for this job only: a check that stopped before its recipe
        // leaves its list to no one.
        let ahead = match n.ahead.take() {
            Some((for_job, jobs)) if for_job == job.id => jobs,
            _ => Vec::new(),
        };
        let batch: Vec<&Job> = std::iter::once(job)
            .chain(
                ahead
                    .iter()
                    .filter(|j| j.method == job.method && j.id != job.id && !n.has_recipe(&j.id)),
            )
            .take(RECIPE_BATCH)
            .collect();
        let jobs: Vec<Json> = batch
            .iter()
            .map(|j| {
                self.python
                    .job_json(j, &method.kernel, method.kind.as_str())
            })
            .collect();
        let body = json!({"jobs": jobs, "seed": seed, "cache_dir": cache});
        let reply = match self.python.request("recipes", body) {
            Ok(r) => r,
            // A worker that predates `recipes` (or a batch that went wrong as
            // a whole): this job's recipe alone, as before.
            Err(f) if !matches!(f.class, FailureClass::Crash | FailureClass::Timeout) => {
                return self.recipe_alone(method, job, seed, cache);
            }
            Err(f) => return Err(f),
        };
        let mut reply = reply;
        let answers = reply
            .get_mut("recipes")
            .map(Json::take)
            .and_then(|a| match a {
                Json::Array(a) => Some(a),
                _ => None,
            })
            .filter(|a| a.len() == batch.len());
        let Some(answers) = answers else {
            // A worker that answers out of protocol is not trusted with the next job.
            let f = JobFailure::new(
                FailureClass::Crash,
                format!(
                    "protocol error: the answer to `recipes` does not hold {} recipes",
                    batch.len()
                ),
            );
            self.python.after_failure(&f);
            return Err(f);
        };
        let fault = batch.iter().zip(&answers).find_map(|(j, a)| {
            let failed = a.get("ok").and_then(Json::as_bool) != Some(true);
            let f = crate::backend::python::failure_of(a);
            (failed && f.class == FailureClass::LaunchError).then_some((j.id.clone(), f))
        });
        if let Some((at, fault)) = fault {
            // A fault may have poisoned the worker's CUDA context: it is not
            // used again, and the tensors it shared go with it.
            self.python.after_failure(&fault);
            if at == job.id {
                return Err(fault);
            }
            // Another job's fault is that job's, at its own check: this one
            // is shared again (with a new worker) and asked for alone.
            self.native.as_mut().expect("a native lane").shared = None;
            self.share(&job.shape, seed)?;
            return self.recipe_alone(method, job, seed, cache);
        }
        let n = self.native.as_mut().expect("a native lane");
        let mut own = None;
        for (j, answer) in batch.iter().zip(answers) {
            let ok = answer.get("ok").and_then(Json::as_bool) == Some(true);
            if j.id == job.id {
                own = Some(if ok {
                    TritonRecipe::read(answer).map(Arc::new)
                } else {
                    Err(crate::backend::python::failure_of(&answer))
                });
            } else if ok {
                // Another job's failure (or unreadable recipe) is asked for
                // again at its own check.
                if let Ok(r) = TritonRecipe::read(answer) {
                    n.recipes.insert(j.id.clone(), Arc::new(r));
                }
            }
        }
        let own = own.expect("the job leads its batch")?;
        n.recipes.insert(job.id.clone(), own.clone());
        Ok(own)
    }

    /// One job's recipe in a call of its own (`recipe`), kept.
    fn recipe_alone(
        &mut self,
        method: &Method,
        job: &Job,
        seed: u64,
        cache: PathBuf,
    ) -> Result<Arc<TritonRecipe>, JobFailure> {
        let body = json!({
            "job": self.python.job_json(job, &method.kernel, method.kind.as_str()),
            "seed": seed,
            "cache_dir": cache,
        });
        let answer = self.python.request("recipe", body)?;
        let recipe = Arc::new(TritonRecipe::read(answer)?);
        let n = self.native.as_mut().expect("a native lane");
        n.recipes.insert(job.id.clone(), recipe.clone());
        Ok(recipe)
    }

    /// The Python worker's comparison of the shared output with the reference.
    fn python_compare(
        &mut self,
        job: &Job,
        seed: u64,
        tol: ToleranceFor,
    ) -> Result<Json, JobFailure> {
        self.python.request(
            "compare",
            json!({
                "problem": self.python.problem(),
                "shape": job.shape,
                "seed": seed,
                "tolerance": {"atol": tol.atol, "rtol": tol.rtol, "max_mismatch": tol.max_mismatch},
            }),
        )
    }

    /// Makes the shape's tensors shared with, and mapped by, the native
    /// worker (again after either worker restarted).
    fn share(&mut self, shape: &Shape, seed: u64) -> Result<(), JobFailure> {
        let key = share_key(shape, seed);
        let py_gen = self.python.generation();
        let n = self.native.as_mut().expect("a native lane");
        let current = n.shared.as_ref().is_some_and(|s| {
            s.key == key
                && s.python_generation == py_gen
                && s.native_generation == n.process.generation()
        });
        if current {
            return Ok(());
        }
        n.shared = None;
        if n.setup.lane_target.is_some() {
            return self.build(shape, seed, key);
        }
        let reply = self.python.request(
            "share",
            json!({"problem": self.python.problem(), "shape": shape, "seed": seed}),
        )?;
        let py_gen = self.python.generation();
        let reply: ShareReply = serde_json::from_value(reply).map_err(|e| {
            JobFailure::new(
                FailureClass::Crash,
                format!("protocol error: the worker's answer to `share` does not fit ({e})"),
            )
        })?;
        let n = self.native.as_mut().expect("a native lane");
        let hello = n.process.start()?;
        let (theirs, ours) = (
            reply.uuid.trim_start_matches("GPU-"),
            hello.uuid.trim_start_matches("GPU-"),
        );
        if !theirs.is_empty() && !ours.is_empty() && theirs != ours {
            return Err(JobFailure::new(
                FailureClass::ProblemError,
                format!("the Python worker runs on GPU {theirs} and the native worker on {ours}: they must share one GPU"),
            ));
        }
        let tensors: Vec<Json> = reply
            .tensors
            .iter()
            .map(|t| json!({"handle": t.handle, "offset": t.offset, "bytes": t.bytes}))
            .collect();
        n.process.call("import", json!({"tensors": tensors}))?;
        n.hold(key, py_gen, reply);
        Ok(())
    }

    /// `share` for `inputs: native`: the Python worker describes the shape's
    /// data (`native_data`, no torch) and the native worker builds it
    /// (`build`: allocations, the seeded generator, the reference operator).
    fn build(&mut self, shape: &Shape, seed: u64, key: String) -> Result<(), JobFailure> {
        let mut described = self.python.request(
            "native_data",
            json!({"problem": self.python.problem(), "shape": shape, "seed": seed}),
        )?;
        let py_gen = self.python.generation();
        let reference = described.get_mut("reference_op").map(Json::take);
        let reply: ShareReply = serde_json::from_value(described).map_err(|e| {
            JobFailure::new(
                FailureClass::Crash,
                format!("protocol error: the worker's answer to `native_data` does not fit ({e})"),
            )
        })?;
        let n = self.native.as_mut().expect("a native lane");
        n.process.start()?;
        n.process
            .call("build", build_request(&reply, reference, seed))?;
        n.hold(key, py_gen, reply);
        Ok(())
    }
}

/// The native worker's `build` of a shape the Python worker described
/// (`native_data`): each tensor's size, type and fill in the described
/// order, and the reference operator over their indices.
fn build_request(described: &ShareReply, reference: Option<Json>, seed: u64) -> Json {
    let tensors: Vec<Json> = described
        .tensors
        .iter()
        .map(|t| json!({"bytes": t.bytes, "dtype": t.dtype, "fill": t.fill}))
        .collect();
    json!({"tensors": tensors, "seed": seed, "reference": reference})
}

/// A resolved launch, as the native worker's `check` takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub image: PathBuf,
    pub symbol: String,
    pub grid: Vec<u64>,
    pub block: Vec<u64>,
    pub shared: u64,
    /// Each argument as the protocol spells it: `{"tensor": 0}`, `{"i32": 64}`, `{"scratch": 0}`.
    pub args: Vec<Json>,
}

impl Launch {
    /// The native worker's `check` of this launch for `job_id`.
    fn check_request<'a>(
        &'a self,
        job_id: &'a str,
        poison: Poison<'a>,
        compare: Option<CompareRequest<'a>>,
        then: Option<Json>,
    ) -> CheckRequest<'a> {
        CheckRequest {
            job_id,
            image: &self.image,
            symbol: &self.symbol,
            grid: &self.grid,
            block: &self.block,
            shared: self.shared,
            args: &self.args,
            poison,
            compare,
            then,
        }
    }

    fn with_image(mut self, image: PathBuf, symbol: String) -> Launch {
        self.image = image;
        self.symbol = symbol;
        self
    }

    /// A Triton job's recipe (the Python worker's `recipe` answer).
    fn from_recipe(r: Json) -> Result<Launch, JobFailure> {
        #[derive(Deserialize)]
        struct Recipe {
            image: PathBuf,
            symbol: String,
            grid: Vec<u64>,
            block: Vec<u64>,
            shared: u64,
            args: Vec<serde_json::Map<String, Json>>,
        }
        let r: Recipe = serde_json::from_value(r).map_err(|e| {
            JobFailure::new(
                FailureClass::Crash,
                format!("protocol error: the worker's answer to `recipe` does not fit ({e})"),
            )
        })?;
        const KINDS: [&str; 8] = [
            "tensor", "i32", "i64", "u32", "u64", "f32", "f64", "scratch",
        ];
        let args = r
            .args
            .into_iter()
            .map(|mut a| {
                // The recipe names and types each argument; the worker takes the value alone.
                let kind = a.keys().find(|k| KINDS.contains(&k.as_str())).cloned();
                match kind {
                    Some(k) => {
                        let v = a.remove(&k).expect("a key just found");
                        Ok(json!({ k: v }))
                    }
                    None => Err(JobFailure::new(
                        FailureClass::Crash,
                        format!("protocol error: recipe argument {a:?}"),
                    )),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Launch {
            image: r.image,
            symbol: r.symbol,
            grid: r.grid,
            block: r.block,
            shared: r.shared,
            args,
        })
    }
}

/// A `kind: cuda|hip` job's grid, block, shared memory and arguments, from
/// the method's expressions over its shape, config and device.
fn resolve(
    method: &Method,
    job: &Job,
    shared: &ShareReply,
    device: &Json,
) -> Result<Launch, JobFailure> {
    let spec = method.native.as_ref().expect("a native method");
    let ctx = context(job, device);
    let problem = |m: String| JobFailure::new(FailureClass::ProblemError, m);
    let count = |e: &crate::manifest::Expr, what: &str| -> Result<u64, JobFailure> {
        let v = eval(e, &ctx)?;
        v.as_u64().ok_or_else(|| {
            problem(format!(
                "{what} `{}` (at {}) is {v}: it must be a whole number >= 0",
                e.source, e.span
            ))
        })
    };
    let grid = method
        .grid
        .iter()
        .map(|e| count(e, "grid"))
        .collect::<Result<Vec<_>, _>>()?;
    let block = spec
        .block
        .iter()
        .map(|e| count(e, "block"))
        .collect::<Result<Vec<_>, _>>()?;
    let shared_bytes = spec
        .shared_mem
        .as_ref()
        .map(|e| count(e, "shared_mem"))
        .transpose()?
        .unwrap_or(0);
    let names: Vec<&str> = shared.tensors.iter().map(|t| t.name.as_str()).collect();
    let mut args = Vec::new();
    for arg in &spec.args {
        args.push(match arg {
            KernelArg::Tensor { name, span } => {
                let i = names.iter().position(|n| n == name).ok_or_else(|| {
                    problem(format!(
                        "argument `{name}` (at {span}) names no tensor of the problem: it shares {}",
                        names.join(", ")
                    ))
                })?;
                json!({"tensor": i})
            }
            KernelArg::Scalar { ty, expr } => {
                let v = eval(expr, &ctx)?;
                scalar(*ty, &v).ok_or_else(|| {
                    problem(format!(
                        "argument `{}` (at {}) is {v}, which is not a {}",
                        expr.source,
                        expr.span,
                        ty.as_str()
                    ))
                })?
            }
        });
    }
    Ok(Launch {
        image: PathBuf::new(),
        symbol: String::new(),
        grid,
        block,
        shared: shared_bytes,
        args,
    })
}

/// A value as a typed argument, when it fits the type.
fn scalar(ty: ScalarType, v: &Json) -> Option<Json> {
    let value = match ty {
        ScalarType::I32 => json!(i32::try_from(v.as_i64()?).ok()?),
        ScalarType::I64 => json!(v.as_i64()?),
        ScalarType::U32 => json!(u32::try_from(v.as_u64()?).ok()?),
        ScalarType::U64 => json!(v.as_u64()?),
        ScalarType::F32 | ScalarType::F64 => json!(v.as_f64()?),
    };
    Some(json!({ ty.as_str(): value }))
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
        n.process.call(
            "warmup",
            json!({"job_id": job_id, "min_launches": launches, "min_ms": ms}),
        )?;
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
        let answer: SampleAnswer =
            n.process
                .call_as("sample", &sample_request(job_id, count, mode), Some(job_id))?;
        match (answer.us, answer.timer) {
            (Some(us), Some(timer)) => SampleReply {
                us,
                timer,
                sm_clock_mhz: answer.sm_clock_mhz,
            }
            .into_batch(count),
            _ => Err(JobFailure::new(
                FailureClass::Crash,
                "protocol error: the native worker's answer to `sample` has no `us` or `timer`",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_native_check_reports_the_kernels_resources() {
        let answer: CheckAnswer = serde_json::from_value(json!({"id": 3, "ok": true,
            "compared": null, "then": null, "launch_us": 12.0, "kernel": {
            "name": "gemm_mma<128, 64>", "n_regs": 168, "local_bytes": 24,
            "shared": 49152, "threads": 200}, "met": "ready", "worker_us": 40.5}))
        .unwrap();
        let k = KernelResources::from(answer.kernel.expect("a kernel"));
        assert_eq!(k.name, "gemm_mma<128, 64>");
        assert_eq!(k.n_regs, Some(168));
        assert_eq!(k.n_spills, Some(6));
        assert_eq!(k.shared, 49152);
        assert_eq!(k.num_warps, 7);
        assert_eq!(k.num_stages, 0);
        assert!(answer.compared.is_none() && answer.then.is_none());
        let bare: CheckAnswer = serde_json::from_value(json!({"id": 1, "ok": true})).unwrap();
        assert!(bare.kernel.is_none());
    }

    #[test]
    fn a_native_check_answer_reads_its_comparison_and_first_batch() {
        use crate::backend::worker::Answer;
        let line = r#"{"id":7,"ok":true,"compared":{"passed":true,"max_abs_err":0.5,
            "max_rel_err":null,"mismatch_frac":0.0,"nan_count":0,"inf_count":0,"elements":64},
            "then":{"ok":true,"warmup":{"launches":3},"sample":{"us":[2.0,3.0],
            "timer":"cuda_event","sm_clock_mhz":1980.0},"wall_ms":1.5},
            "launch_us":9.0,"met":"spinning","worker_us":120.0}"#;
        let answer: CheckAnswer = serde_json::from_str(line).unwrap();
        assert_eq!(answer.id(), Some(7));
        assert!(answer.ok());
        assert_eq!(answer.worker_us(), Some(120.0));
        assert_eq!(answer.worker_met(), Some("spinning"));
        let check: CheckResult = answer.compared.expect("compared").into();
        assert!(check.passed);
        assert_eq!(check.max_abs_err, Some(0.5));
        assert_eq!(check.max_rel_err, None);
        assert_eq!(check.elements, 64);
        let first = then_of(answer.then, 2).expect("then").expect("a batch");
        assert_eq!(first.len(), 1, "no `more`: the first batch alone");
        assert_eq!(first[0].batch.us, vec![2.0, 3.0]);
        assert_eq!(first[0].batch.sm_clock_mhz, Some(1980.0));
        assert_eq!(first[0].wall_ms, 1.5);

        // Fewer samples than asked for is the worker's protocol error.
        let answer: CheckAnswer = serde_json::from_str(line).unwrap();
        let short = then_of(answer.then, 3).expect("then").unwrap_err();
        assert_eq!(short.class, FailureClass::Crash);

        // A failed warm-up or batch is its failure; the check stands.
        let answer: CheckAnswer = serde_json::from_value(json!({"id": 8, "ok": true,
            "compared": {"passed": true, "max_abs_err": 0.0, "max_rel_err": 0.0,
                "mismatch_frac": 0.0, "nan_count": 0, "inf_count": 0, "elements": 4},
            "then": {"ok": false, "class": "launch_error", "message": "illegal address"}}))
        .unwrap();
        let failed = then_of(answer.then, 2).expect("then").unwrap_err();
        assert_eq!(failed.class, FailureClass::LaunchError);
        assert_eq!(failed.message, "illegal address");

        // A `then` that does not fit fails the batches; the answer, and with
        // it the check's verdict, is still read.
        let answer: CheckAnswer = serde_json::from_value(json!({"id": 9, "ok": true,
            "compared": {"passed": true, "max_abs_err": 0.0, "max_rel_err": 0.0,
                "mismatch_frac": 0.0, "nan_count": 0, "inf_count": 0, "elements": 4},
            "then": {"ok": true, "sample": "not a batch", "wall_ms": 1.0}}))
        .unwrap();
        assert!(answer.compared.is_some());
        let unfit = then_of(answer.then, 2).expect("then").unwrap_err();
        assert_eq!(unfit.class, FailureClass::Crash);
        // No `then` (null, or absent), no batches.
        for no_then in [
            json!({"id": 1, "ok": true, "then": null}),
            json!({"id": 1, "ok": true}),
        ] {
            let answer: CheckAnswer = serde_json::from_value(no_then).unwrap();
            assert!(then_of(answer.then, 2).is_none());
        }
    }

    #[test]
    fn batches_taken_until_the_rule_come_back_in_order() {
        let then: ThenAnswer = serde_json::from_value(json!({"ok": true,
            "warmup": {"launches": 3}, "sample": {"us": [1.0, 2.0], "timer": "cuda_event"},
            "wall_ms": 0.5, "more": [
                {"sample": {"us": [3.0, 4.0], "timer": "cuda_event", "sm_clock_mhz": 1500.0},
                 "wall_ms": 0.6},
                {"sample": {"us": [5.0, 6.0], "timer": "cuda_event", "sm_clock_mhz": 1900.0},
                 "wall_ms": 0.7}]}))
        .unwrap();
        let batches = then.into_batches(2).unwrap();
        let us: Vec<f64> = batches.iter().flat_map(|b| b.batch.us.clone()).collect();
        assert_eq!(us, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let clocks: Vec<Option<f64>> = batches.iter().map(|b| b.batch.sm_clock_mhz).collect();
        assert_eq!(
            clocks,
            vec![None, Some(1500.0), Some(1900.0)],
            "each batch its clock"
        );
        let walls: Vec<f64> = batches.iter().map(|b| b.wall_ms).collect();
        assert_eq!(walls, vec![0.5, 0.6, 0.7]);
        // A later batch short of samples is a protocol error, as a first one is.
        let short: ThenAnswer = serde_json::from_value(json!({"ok": true,
            "sample": {"us": [1.0, 2.0], "timer": "cuda_event"}, "wall_ms": 0.5,
            "more": [{"sample": {"us": [3.0], "timer": "cuda_event"}, "wall_ms": 0.6}]}))
        .unwrap();
        assert_eq!(
            short.into_batches(2).unwrap_err().class,
            FailureClass::Crash
        );
    }

    #[test]
    fn a_failed_native_answer_names_its_failure() {
        use crate::backend::worker::Answer;
        let answer: SampleAnswer = serde_json::from_value(json!({"id": 9, "ok": false,
            "class": "launch_error", "message": "unspecified launch failure", "worker_us": 5.0}))
        .unwrap();
        assert!(!answer.ok());
        let f = crate::backend::python::failure_from(answer.class(), answer.message());
        assert_eq!(f.class, FailureClass::LaunchError);
        assert_eq!(f.message, "unspecified launch failure");
        assert!(answer.us.is_none() && answer.timer.is_none());
        // An answer with no `ok` is not a success.
        let bare: SampleAnswer = serde_json::from_value(json!({"id": 9})).unwrap();
        assert!(!bare.ok());
    }

    #[test]
    fn the_check_request_is_what_the_worker_reads() {
        let launch = Launch {
            image: PathBuf::from("/cache/k.cubin"),
            symbol: "k".into(),
            grid: vec![4, 1, 1],
            block: vec![128, 1, 1],
            shared: 1024,
            args: vec![json!({"tensor": 0}), json!({"i32": 64})],
        };
        let poison = Poison {
            tensor: 2,
            pattern: "c07f",
            elements: 16,
        };
        let request = launch.check_request("j1", poison, None, None);
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"job_id": "j1", "image": "/cache/k.cubin", "symbol": "k",
                   "grid": [4, 1, 1], "block": [128, 1, 1], "shared": 1024,
                   "args": [{"tensor": 0}, {"i32": 64}],
                   "poison": {"tensor": 2, "pattern": "c07f", "elements": 16}}),
            "no compare or then where there is none"
        );
    }

    #[test]
    fn scalars_are_typed_and_range_checked() {
        assert_eq!(
            scalar(ScalarType::I32, &json!(64)),
            Some(json!({"i32": 64}))
        );
        assert_eq!(
            scalar(ScalarType::I32, &json!(1i64 << 31)),
            None,
            "past i32"
        );
        assert_eq!(
            scalar(ScalarType::I64, &json!(1i64 << 40)),
            Some(json!({"i64": 1i64 << 40}))
        );
        assert_eq!(scalar(ScalarType::U32, &json!(-1)), None);
        assert_eq!(
            scalar(ScalarType::I32, &json!(1.5)),
            None,
            "an int argument takes no fraction"
        );
        assert_eq!(
            scalar(ScalarType::F32, &json!(2)),
            Some(json!({"f32": 2.0}))
        );
    }

    /// The quickstart's CUDA method at its baseline: grid, block, shared
    /// memory and arguments from its expressions, tensors by the names the
    /// Python worker shares them under.
    #[test]
    fn the_quickstart_cuda_launch_resolves_from_its_expressions() {
        let device = crate::device::profile("h100").unwrap();
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/quickstart.yaml");
        let exp = crate::manifest::load(&path, &[], &device).unwrap();
        let method = exp.method("cuda").unwrap();
        let filter = crate::plan::Filter::parse("M=1024").unwrap();
        let mut baseline = None;
        crate::plan::plan(
            &exp,
            &crate::plan::PlanOptions {
                device: &device,
                filter: &filter,
                mode: crate::plan::Mode::Gpu,
            },
            &mut |j| {
                if j.method == "cuda" && j.baseline {
                    baseline = Some(j);
                }
                std::ops::ControlFlow::Continue(())
            },
        )
        .unwrap();
        let job = baseline.unwrap();
        let tensor = |name: &str| SharedTensor {
            name: name.into(),
            dtype: "float16".into(),
            handle: String::new(),
            offset: 0,
            bytes: 0,
            fill: Json::Null,
        };
        let shared = ShareReply {
            tensors: vec![tensor("a"), tensor("b"), tensor("out")],
            out: 2,
            reference: None,
            poison: "c07f".into(),
            elements: 1024 * 1024,
            uuid: String::new(),
        };
        let dev = Json::Object(crate::manifest::device_fields(&device));
        let l = resolve(method, &job, &shared, &dev).unwrap();
        // BLOCK 128 x 128 x 32, 2 x 2 warps, 3 stages.
        assert_eq!(l.grid, vec![8, 8]);
        assert_eq!(l.block, vec![128]);
        assert_eq!(l.shared, 3 * (128 * 40 + 32 * 136) * 2);
        assert_eq!(
            l.args,
            vec![
                json!({"tensor": 0}),
                json!({"tensor": 1}),
                json!({"tensor": 2}),
                json!({"i32": 1024}),
                json!({"i32": 1024}),
                json!({"i32": 1024}),
            ]
        );
        // A tensor the problem does not share is named, with where it was written.
        let mut only_ab = shared.clone();
        only_ab.tensors.truncate(2);
        let f = resolve(method, &job, &only_ab, &dev).unwrap_err();
        assert!(
            f.message.contains("`out` (at ") && f.message.contains("quickstart.yaml:"),
            "{}",
            f.message
        );
    }

    #[test]
    fn a_described_shape_becomes_the_native_workers_build() {
        // What `native_data` answers for gemm M=96 N=80 K=64 bf16, seed 7
        // (python/tests/test_worker.py checks the Python side of it).
        let mut answer = json!({
            "tensors": [
                {"name": "a", "dtype": "bfloat16", "shape": [96, 64], "bytes": 12288,
                 "fill": {"normal": {"std": 0.35355339059327373, "stream": 0}}},
                {"name": "b", "dtype": "bfloat16", "shape": [64, 80], "bytes": 10240,
                 "fill": {"normal": {"std": 0.35355339059327373, "stream": 1}}},
                {"name": "out", "dtype": "bfloat16", "shape": [96, 80], "bytes": 15360, "fill": null},
                {"name": "reference", "dtype": "float32", "shape": [96, 80], "bytes": 30720, "fill": null},
            ],
            "out": 2, "reference": 3, "poison": "c07f", "elements": 7680, "uuid": "", "seed": 7,
            "reference_op": {"op": "matmul", "a": 0, "b": 1, "out": 3, "m": 96, "n": 80, "k": 64},
        });
        let reference = answer.get_mut("reference_op").map(Json::take);
        let reply: ShareReply = serde_json::from_value(answer).unwrap();
        assert_eq!((reply.out, reply.reference), (2, Some(3)));
        assert!(reply
            .tensors
            .iter()
            .all(|t| t.handle.is_empty() && t.offset == 0));
        let request = build_request(&reply, reference, 7);
        assert_eq!(
            request,
            json!({
                "tensors": [
                    {"bytes": 12288, "dtype": "bfloat16",
                     "fill": {"normal": {"std": 0.35355339059327373, "stream": 0}}},
                    {"bytes": 10240, "dtype": "bfloat16",
                     "fill": {"normal": {"std": 0.35355339059327373, "stream": 1}}},
                    {"bytes": 15360, "dtype": "bfloat16", "fill": null},
                    {"bytes": 30720, "dtype": "float32", "fill": null},
                ],
                "seed": 7,
                "reference": {"op": "matmul", "a": 0, "b": 1, "out": 3, "m": 96, "n": 80, "k": 64},
            })
        );
    }

    #[test]
    fn a_recipe_becomes_the_workers_arguments() {
        let recipe = json!({
            "image": "/c/triton-ab.cubin", "symbol": "matmul_kernel", "grid": [12, 1, 1],
            "block": [128, 1, 1], "shared": 32768,
            "args": [
                {"tensor": 0, "name": "a_ptr", "type": "*bf16"},
                {"i32": 64, "name": "M", "type": "i32"},
                {"scratch": 0, "name": "global_scratch", "type": "*i8"},
            ],
        });
        let l = Launch::from_recipe(recipe).unwrap();
        assert_eq!(
            l.args,
            vec![
                json!({"tensor": 0}),
                json!({"i32": 64}),
                json!({"scratch": 0})
            ]
        );
        assert_eq!(
            (l.symbol.as_str(), l.shared, l.grid.clone()),
            ("matmul_kernel", 32768, vec![12, 1, 1])
        );
        let bad = json!({"image": "x", "symbol": "k", "grid": [1], "block": [1], "shared": 0, "args": [{"name": "x"}]});
        assert!(Launch::from_recipe(bad).is_err());
    }
}
