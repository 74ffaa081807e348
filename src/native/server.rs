//! The native worker: `tunelab native-worker [--backend cuda|hip]`, one
//! process per lane GPU, serving the runner over JSON lines on stdin/stdout
//! the way a Python worker does (docs/native-backend.md has the protocol). It
//! maps the shape's tensors that the lane's Python worker shares (CUDA IPC),
//! loads compiled images, launches them with the arguments the runner
//! resolved, and times them the way the Python worker's `CudaEventTimer`
//! does: an event pair around each launch, one host synchronisation per
//! batch, a spin kernel holding the GPU while the batch is queued, L2 evicted
//! before each cold sample, CUDA graphs for graph timing. It returns raw
//! samples; how many is the runner's stopping rule, which a check's `then`
//! may hand it (`until`) to run itself, so a job's batches need no round
//! trip each.
//!
//! A kernel that faults poisons this process's context: the runner kills the
//! worker after any `launch_error`, as it does a Python worker, and starts a
//! new one for the next job.

use std::collections::HashMap;
use std::ffi::c_void;
use std::io::Write;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value as Json};

use super::gpu::{ErrorClass, Gpu, GpuError, Ptr};
use crate::backend::lines::{self, LineReader, Wait};
use crate::measure::{Decision, Sampling, StopRule};

/// The native worker protocol this build speaks.
pub const PROTOCOL: u32 = 1;

/// Cap on launches one warm-up batch queues (as the Python worker).
const MAX_WARMUP_BATCH: u64 = 4096;
/// Spin cycles per microsecond: at or above the SM clock of the GPUs tunelab
/// targets, so a spin lasts at least as long as asked.
const SPIN_CYCLES_PER_US: f64 = 2000.0;
const MAX_SPIN_US: f64 = 20_000.0;
const MAX_SAMPLES: u64 = 1_000_000;
const MAX_GRAPH_CALLS: u64 = 10_000;
/// Loaded images kept before the oldest are unloaded.
const MAX_MODULES: usize = 256;
/// tunelab_compare's block: its shared-memory reduction is sized for
/// TUNELAB_COMPARE_THREADS (src/native/helpers.cu), which this must equal.
const COMPARE_THREADS: u32 = 256;
/// tunelab_compare's blocks at most: a grid-stride loop covers the rest.
const COMPARE_MAX_BLOCKS: u64 = 4096;

/// A failure with its protocol class.
#[derive(Debug)]
struct Failure {
    class: &'static str,
    message: String,
}

impl Failure {
    fn new(class: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            class,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Failure {
        Failure::new("bad_request", message)
    }
}

impl From<GpuError> for Failure {
    fn from(e: GpuError) -> Failure {
        let class = match e.class {
            ErrorClass::Image => "compile_error",
            ErrorClass::Resources => "out_of_resources",
            ErrorClass::Fault | ErrorClass::Other => "launch_error",
        };
        Failure::new(class, e.to_string())
    }
}

type Reply = Result<Json, Failure>;

/// One kernel argument, as the runner resolved it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Arg {
    /// The device pointer of imported tensor `i`.
    Tensor(usize),
    I32(i32),
    I64(i64),
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
    /// A scratch buffer of this many bytes this worker allocates (null when 0).
    Scratch(u64),
}

#[derive(Debug, Deserialize)]
struct ImportedTensor {
    /// The allocation's IPC handle, hex.
    handle: String,
    /// Where the tensor starts in it.
    offset: u64,
    bytes: u64,
}

#[derive(Debug, Deserialize)]
struct Poison {
    tensor: usize,
    /// One element's bytes, hex (1, 2, 4 or 8 bytes).
    pattern: String,
    elements: u64,
}

#[derive(Debug, Deserialize)]
struct CheckRequest {
    job_id: String,
    image: std::path::PathBuf,
    symbol: String,
    grid: Vec<u64>,
    block: Vec<u64>,
    #[serde(default)]
    shared: u64,
    args: Vec<Arg>,
    poison: Option<Poison>,
    /// Compare the output with the reference after the launch (see `compare`).
    compare: Option<CompareRequest>,
    /// After a comparison that passes, the warm-up and the first batch in the
    /// same call: `{"warmup": {...}, "sample": {...}}`, the bodies of those
    /// requests without `job_id`, and with `until` the batches after it
    /// until the runner's stopping rule says enough. Ignored without
    /// `compare` (the verdict is then the Python worker's).
    then: Option<Then>,
}

#[derive(Debug, Deserialize)]
struct Then {
    warmup: serde_json::Map<String, Json>,
    sample: serde_json::Map<String, Json>,
    /// Go on taking batches like the first until this rule, the runner's
    /// own, says enough; the batches after the first come back in `more`.
    until: Option<StopRule>,
}

/// `compare`: an output tensor against a reference, both imported, under
/// compare()'s tolerance rule (python/tunelab/compare.py).
#[derive(Debug, Deserialize)]
struct CompareRequest {
    out: usize,
    /// torch's name for the element type: float32, float16 or bfloat16.
    out_dtype: String,
    reference: usize,
    reference_dtype: String,
    elements: u64,
    atol: f64,
    rtol: f64,
    #[serde(default)]
    max_mismatch: f64,
}

/// tunelab_compare's code for an element type, and its size in bytes.
fn element_kind(dtype: &str) -> Option<(i32, u64)> {
    match dtype {
        "float32" => Some((0, 4)),
        "float16" => Some((1, 2)),
        "bfloat16" => Some((2, 2)),
        _ => None,
    }
}

/// A job ready to launch again and again.
struct Prepared {
    job_id: String,
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    /// One 8-byte slot per argument; the driver reads each parameter's own size from it.
    _values: Box<[u64]>,
    params: Vec<*mut c_void>,
    scratch: Vec<Ptr>,
    /// Instantiated graphs by launches per graph.
    graphs: HashMap<u64, u64>,
}

impl Prepared {
    fn launch(&mut self, gpu: &dyn Gpu) -> Result<(), GpuError> {
        // SAFETY: `params` points into `_values`, one slot per kernel
        // parameter, alive as long as `self`.
        unsafe {
            gpu.launch(
                self.function,
                self.grid,
                self.block,
                self.shared,
                self.params.as_mut_ptr(),
            )
        }
    }
}

struct Helpers {
    spin: u64,
    flush_read: u64,
    compare: u64,
    fill_normal: u64,
    matmul_reference: u64,
}

/// `build`: a shape's tensors allocated by this worker and filled here, with
/// no Python process involved (a manifest's `inputs: native`).
#[derive(Debug, Deserialize)]
struct BuildRequest {
    tensors: Vec<BuiltTensor>,
    /// The generator's seed: the same seed gives the same bits.
    seed: u64,
    /// The operator whose fp32 result fills the reference tensor.
    reference: Option<ReferenceOp>,
}

#[derive(Debug, Deserialize)]
struct BuiltTensor {
    bytes: u64,
    /// torch's name for the element type (float32, float16, bfloat16, ...).
    dtype: String,
    /// How it is filled; none: left as allocated (an output, poisoned before each launch).
    #[serde(default)]
    fill: Option<Fill>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Fill {
    /// std * N(0, 1) draws from the generator's stream `stream`.
    Normal {
        std: f32,
        stream: u64,
    },
    Zeros,
}

/// The reference operators this worker computes (src/native/helpers.cu).
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum ReferenceOp {
    /// out [m, n] fp32 = a [m, k] @ b [k, n], all row-major and contiguous.
    Matmul {
        a: usize,
        b: usize,
        out: usize,
        m: u32,
        n: u32,
        k: u32,
    },
}

/// The worker's state on its GPU.
struct Server {
    gpu: Box<dyn Gpu>,
    helpers: Option<Helpers>,
    /// Imported allocations (base pointers), and each tensor's pointer.
    mapped: Vec<Ptr>,
    /// Allocations `build` made for the shape's tensors (freed with the shape).
    owned: Vec<Ptr>,
    tensors: Vec<(Ptr, u64)>,
    modules: HashMap<std::path::PathBuf, u64>,
    module_order: Vec<std::path::PathBuf>,
    prepared: Option<Prepared>,
    starts: Vec<u64>,
    ends: Vec<u64>,
    flush: Option<(Ptr, u64)>,
    sink: Option<Ptr>,
    /// tunelab_compare's six counters, allocated on first use.
    compare_result: Option<Ptr>,
    /// Host time to queue one sample, refined after each batch; sizes the spin.
    enqueue_us: f64,
    clock: Option<super::nvml::SmClock>,
}

/// Runs the worker until `shutdown` or end of input; returns the exit code.
pub fn main(backend: &str) -> i32 {
    super::watchdog::die_with_runner();
    let mut protocol = match claim_stdout() {
        Ok(out) => out,
        Err(e) => {
            eprintln!("native worker: cannot set up its output: {e}");
            return 1;
        }
    };
    let opened: Result<Box<dyn Gpu>, String> = match backend {
        "cuda" => super::cuda::Cuda::open().map(|g| Box::new(g) as Box<dyn Gpu>),
        #[cfg(feature = "hip")]
        "hip" => super::hip::Hip::open().map(|g| Box::new(g) as Box<dyn Gpu>),
        #[cfg(not(feature = "hip"))]
        "hip" => Err("this tunelab was built without the `hip` feature".into()),
        other => Err(format!("unknown backend `{other}` (cuda, hip)")),
    };
    let mut server = opened.map(Server::new);
    // Its own descriptor for the requests, read without std's buffering so
    // that `poll` sees every byte not yet taken.
    let requests = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => {
            eprintln!("native worker: cannot read its input: {e}");
            return 1;
        }
    };
    let mut requests = LineReader::new(requests);
    // After each answer, spin for the next request before sleeping
    // (docs/worker-protocol.md, "Waiting for a line"; TUNELAB_SPIN_US in its
    // environment sets how long, 0 always sleeps).
    let spin = lines::spin_from_env(lines::WORKER_SPIN);
    let forever = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let mut stopping = false;
    // When the last answer was written: the wait from there to the next
    // request's line is reported with that request's answer (`idle_us`).
    let mut answered: Option<Instant> = None;
    while let Ok(Some(line)) = requests.next_line(Wait::spin_then_sleep(spin, forever)) {
        if line.trim().is_empty() {
            continue;
        }
        let started = Instant::now();
        let started_at_ns = crate::trace::monotonic_ns();
        let idle_us = answered.map(|a| started.duration_since(a).as_secs_f64() * 1e6);
        let (id, response) = match serde_json::from_str::<Json>(&line) {
            Ok(request) => {
                let id = request.get("id").cloned().unwrap_or(Json::Null);
                let op = request
                    .get("op")
                    .and_then(Json::as_str)
                    .unwrap_or("")
                    .to_string();
                stopping = op == "shutdown";
                let reply = match &mut server {
                    Ok(s) => s.handle(&op, &request),
                    Err(why) if op == "shutdown" => {
                        let _ = why;
                        Ok(json!({}))
                    }
                    Err(why) => Err(Failure::new(
                        "problem_error",
                        format!("the native worker cannot use its GPU: {why}"),
                    )),
                };
                (id, reply)
            }
            Err(e) => (
                Json::Null,
                Err(Failure::bad(format!("not a JSON request: {e}"))),
            ),
        };
        let mut body = match response {
            Ok(Json::Object(m)) => Json::Object(m),
            Ok(other) => json!({"value": other}),
            Err(f) => json!({"ok": false, "class": f.class, "message": f.message}),
        };
        body["id"] = id;
        if body.get("ok").is_none() {
            body["ok"] = json!(true);
        }
        // The worker's time runs until its answer is text: serialising it is
        // the worker's work, not the pipe's.
        let mut text = serde_json::to_string(&body).expect("response serialises");
        text.pop(); // the object's closing brace
        if let Some(idle) = idle_us {
            text.push_str(&format!(",\"idle_us\":{idle:.1}"));
        }
        text.push_str(&format!(",\"at_ns\":{started_at_ns}"));
        let met = requests.met().as_str();
        let us = started.elapsed().as_secs_f64() * 1e6;
        text.push_str(&format!(",\"met\":\"{met}\",\"worker_us\":{us:.1}}}\n"));
        if protocol
            .write_all(text.as_bytes())
            .and_then(|_| protocol.flush())
            .is_err()
        {
            return 1;
        }
        answered = Some(Instant::now());
        if stopping {
            break;
        }
    }
    if let Ok(s) = &mut server {
        s.release_all();
    }
    0
}

/// Keeps the real stdout for the protocol and points file descriptor 1 at
/// stderr, so that a kernel's `printf` (which the driver writes to fd 1)
/// cannot corrupt a response.
fn claim_stdout() -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    std::io::stdout().flush()?;
    // SAFETY: duplicating and redirecting this process's own descriptors.
    unsafe {
        let fd = libc::dup(1);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::dup2(2, 1) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(std::fs::File::from_raw_fd(fd))
    }
}

/// compare()'s answer from tunelab_compare's counters: NaN outputs,
/// infinite outputs, elements within tolerance, finite pairs, the largest
/// absolute error's fp32 bits and the largest relative error's fp64 bits.
fn compare_figures(words: [u64; 6], elements: u64, max_mismatch: f64) -> Json {
    let [nan, inf, within, finite, abs_bits, rel_bits] = words;
    let (max_abs, max_rel) = if finite > 0 {
        (
            f32::from_bits(abs_bits as u32) as f64,
            f64::from_bits(rel_bits),
        )
    } else {
        (0.0, 0.0)
    };
    let mismatch = elements.saturating_sub(within);
    let frac = if elements > 0 {
        mismatch as f64 / elements as f64
    } else {
        0.0
    };
    json!({
        "passed": nan + inf == 0 && frac <= max_mismatch,
        "max_abs_err": max_abs,
        "max_rel_err": max_rel,
        "mismatch_frac": frac,
        "nan_count": nan,
        "inf_count": inf,
        "elements": elements,
    })
}

fn field<'a, T: Deserialize<'a>>(request: &'a Json, key: &str) -> Result<T, Failure> {
    let v = request
        .get(key)
        .ok_or_else(|| Failure::bad(format!("missing `{key}`")))?;
    T::deserialize(v).map_err(|e| Failure::bad(format!("`{key}`: {e}")))
}

fn int_field(request: &Json, key: &str, default: u64, min: u64, max: u64) -> Result<u64, Failure> {
    let v = match request.get(key) {
        None => default,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| Failure::bad(format!("`{key}` must be an integer >= 0, got {v}")))?,
    };
    if v < min || v > max {
        return Err(Failure::bad(format!(
            "`{key}` must be in {min}..={max}, got {v}"
        )));
    }
    Ok(v)
}

/// A `sample` answer's samples and the batch's wall time into `so_far`.
fn add_batch(so_far: &mut Sampling, sampled: &Json, wall_ms: f64) {
    let us = sampled.get("us").and_then(Json::as_array);
    // A sample that is not a number (a NaN is written as null) still counts
    // towards `max_samples`, which bounds the loop.
    so_far.samples_us.extend(
        us.into_iter()
            .flatten()
            .map(|v| v.as_f64().unwrap_or(f64::NAN)),
    );
    so_far.wall_ms += wall_ms;
}

fn hex(s: &str) -> Result<Vec<u8>, Failure> {
    if s.len() % 2 != 0 {
        return Err(Failure::bad("odd-length hex"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| Failure::bad(format!("not hex: {s}")))
        })
        .collect()
}

fn dims(v: &[u64], what: &str) -> Result<[u32; 3], Failure> {
    if v.is_empty() || v.len() > 3 {
        return Err(Failure::bad(format!(
            "`{what}` has 1 to 3 dimensions, got {}",
            v.len()
        )));
    }
    let mut out = [1u32; 3];
    for (i, &x) in v.iter().enumerate() {
        if x == 0 || x > u32::MAX as u64 {
            return Err(Failure::new(
                "launch_error",
                format!(
                    "{what} dimension {} is {x}: it must be between 1 and 2^32 - 1",
                    ["x", "y", "z"][i]
                ),
            ));
        }
        out[i] = x as u32;
    }
    Ok(out)
}

impl Server {
    fn new(gpu: Box<dyn Gpu>) -> Server {
        Server {
            gpu,
            helpers: None,
            mapped: Vec::new(),
            owned: Vec::new(),
            tensors: Vec::new(),
            modules: HashMap::new(),
            module_order: Vec::new(),
            prepared: None,
            starts: Vec::new(),
            ends: Vec::new(),
            flush: None,
            sink: None,
            compare_result: None,
            enqueue_us: 50.0,
            clock: None,
        }
    }

    fn handle(&mut self, op: &str, r: &Json) -> Reply {
        match op {
            "hello" => self.hello(r),
            "import" => self.import(r),
            "build" => {
                let req: BuildRequest = serde_json::from_value(r.clone())
                    .map_err(|e| Failure::bad(format!("build: {e}")))?;
                self.build(&req)
            }
            "fetch" => self.fetch(r),
            "check" => self.check(r),
            "warmup" => self.warmup(r),
            "sample" => self.sample(r),
            "compare" => {
                let req: CompareRequest = serde_json::from_value(r.clone())
                    .map_err(|e| Failure::bad(format!("compare: {e}")))?;
                self.compare(&req)
            }
            "launch_cost" => self.launch_cost(r),
            "release" => {
                self.release();
                Ok(json!({}))
            }
            "shutdown" => Ok(json!({})),
            other => Err(Failure::bad(format!("unknown op `{other}`"))),
        }
    }

    fn hello(&mut self, r: &Json) -> Reply {
        if let Some(path) = r.get("helpers").and_then(Json::as_str) {
            let image = std::fs::read(path)
                .map_err(|e| Failure::new("problem_error", format!("cannot read {path}: {e}")))?;
            let module = self.gpu.load_module(&image)?;
            self.helpers = Some(Helpers {
                spin: self.gpu.function(module, "tunelab_spin")?,
                flush_read: self.gpu.function(module, "tunelab_flush_read")?,
                compare: self.gpu.function(module, "tunelab_compare")?,
                fill_normal: self.gpu.function(module, "tunelab_fill_normal")?,
                matmul_reference: self.gpu.function(module, "tunelab_matmul_reference")?,
            });
        }
        let f = self.gpu.facts();
        Ok(json!({
            "protocol": PROTOCOL,
            "backend": f.backend,
            "device": f.name,
            "uuid": f.uuid,
            "driver": f.driver,
            "version": env!("CARGO_PKG_VERSION"),
        }))
    }

    /// Maps the tensors of a shape, replacing the previous shape's.
    fn import(&mut self, r: &Json) -> Reply {
        let tensors: Vec<ImportedTensor> = field(r, "tensors")?;
        self.release();
        self.unmap();
        let mut by_handle: HashMap<String, Ptr> = HashMap::new();
        for t in &tensors {
            let base = match by_handle.get(&t.handle) {
                Some(&b) => b,
                None => {
                    // An allocation is mapped once per process, however many tensors live in it.
                    let b = self.gpu.ipc_open(&hex(&t.handle)?).map_err(|e| {
                        Failure::new(
                            "problem_error",
                            format!("cannot map a shared tensor: {e} (the lane's GPU must be the one the Python worker allocated on)"),
                        )
                    })?;
                    self.mapped.push(b);
                    by_handle.insert(t.handle.clone(), b);
                    b
                }
            };
            self.tensors.push((base + t.offset, t.bytes));
        }
        Ok(json!({"tensors": self.tensors.len(), "allocations": self.mapped.len()}))
    }

    fn unmap(&mut self) {
        for p in self.mapped.drain(..) {
            self.gpu.ipc_close(p);
        }
        if !self.owned.is_empty() {
            // A launch still running may read them.
            let _ = self.gpu.synchronize();
            for p in self.owned.drain(..) {
                self.gpu.free(p);
            }
        }
        self.tensors.clear();
    }

    /// Allocates and fills a shape's tensors here, replacing the previous
    /// shape's (imported or built): the inputs from the seeded generator, the
    /// reference by its operator. Tensors are indexed as `import` indexes them.
    fn build(&mut self, req: &BuildRequest) -> Reply {
        let (fill_normal, matmul_reference) = match &self.helpers {
            Some(h) => (h.fill_normal, h.matmul_reference),
            None => {
                return Err(Failure::bad(
                    "build needs tunelab's helper kernels (hello's `helpers`)",
                ))
            }
        };
        let started = Instant::now();
        self.release();
        self.unmap();
        let mut kinds = Vec::with_capacity(req.tensors.len());
        for t in &req.tensors {
            let ptr = self.gpu.alloc(t.bytes as usize)?;
            self.owned.push(ptr);
            self.tensors.push((ptr, t.bytes));
            kinds.push(element_kind(&t.dtype));
        }
        for (i, t) in req.tensors.iter().enumerate() {
            let ptr = self.tensors[i].0;
            match &t.fill {
                None => {}
                Some(Fill::Zeros) => self.gpu.fill(ptr, &[0], t.bytes as usize)?,
                Some(Fill::Normal { std, stream }) => {
                    let (mut kind, size) = kinds[i].ok_or_else(|| {
                        Failure::bad(format!(
                            "build: tensor {i} is {}; normal draws are float32, float16 or bfloat16",
                            t.dtype
                        ))
                    })?;
                    let (mut out, mut n, mut seed, mut stream, mut std) =
                        (ptr, t.bytes / size, req.seed, *stream, *std);
                    let mut params = [
                        (&mut out as *mut u64).cast::<c_void>(),
                        (&mut kind as *mut i32).cast::<c_void>(),
                        (&mut n as *mut u64).cast::<c_void>(),
                        (&mut seed as *mut u64).cast::<c_void>(),
                        (&mut stream as *mut u64).cast::<c_void>(),
                        (&mut std as *mut f32).cast::<c_void>(),
                    ];
                    let blocks = n.div_ceil(256).clamp(1, 8192) as u32;
                    // SAFETY: tunelab_fill_normal(void*, int, unsigned long long,
                    // unsigned long long, unsigned long long, float), each parameter
                    // pointing at a value of its size; `out` holds `n` elements.
                    unsafe {
                        self.gpu.launch(
                            fill_normal,
                            [blocks, 1, 1],
                            [256, 1, 1],
                            0,
                            params.as_mut_ptr(),
                        )?
                    };
                }
            }
        }
        if let Some(ReferenceOp::Matmul { a, b, out, m, n, k }) = req.reference {
            let operand = |i: usize, elements: u64, what: &str| -> Result<(Ptr, i32), Failure> {
                let t = req.tensors.get(i).ok_or_else(|| {
                    Failure::bad(format!(
                        "build: the matmul's {what} is tensor {i}, which is not built"
                    ))
                })?;
                let (kind, size) = kinds[i].ok_or_else(|| {
                    Failure::bad(format!(
                        "build: the matmul's {what} is {}; float32, float16 or bfloat16 only",
                        t.dtype
                    ))
                })?;
                if t.bytes < elements * size {
                    return Err(Failure::bad(format!(
                        "build: the matmul's {what} holds {} bytes, fewer than its {elements} elements",
                        t.bytes
                    )));
                }
                Ok((self.tensors[i].0, kind))
            };
            let (m64, n64, k64) = (m as u64, n as u64, k as u64);
            let (mut pa, mut ka) = operand(a, m64 * k64, "a")?;
            let (mut pb, mut kb) = operand(b, k64 * n64, "b")?;
            let (mut pc, kc) = operand(out, m64 * n64, "out")?;
            if kc != 0 {
                return Err(Failure::bad("build: the matmul's out must be float32"));
            }
            let (mut mi, mut ni, mut ki) = (m as i32, n as i32, k as i32);
            if mi < 0 || ni < 0 || ki < 0 {
                return Err(Failure::bad(
                    "build: the matmul's m, n and k must be below 2^31",
                ));
            }
            let mut params = [
                (&mut pa as *mut u64).cast::<c_void>(),
                (&mut ka as *mut i32).cast::<c_void>(),
                (&mut pb as *mut u64).cast::<c_void>(),
                (&mut kb as *mut i32).cast::<c_void>(),
                (&mut pc as *mut u64).cast::<c_void>(),
                (&mut mi as *mut i32).cast::<c_void>(),
                (&mut ni as *mut i32).cast::<c_void>(),
                (&mut ki as *mut i32).cast::<c_void>(),
            ];
            let grid = dims(&[n64.div_ceil(64).max(1), m64.div_ceil(64).max(1)], "grid")?;
            // SAFETY: tunelab_matmul_reference(const void*, int, const void*, int,
            // float*, int, int, int), each parameter pointing at a value of its
            // size; the three tensors hold their elements (checked above).
            unsafe {
                self.gpu
                    .launch(matmul_reference, grid, [256, 1, 1], 0, params.as_mut_ptr())?
            };
        }
        self.gpu.synchronize()?;
        Ok(json!({
            "tensors": self.tensors.len(),
            "build_ms": started.elapsed().as_secs_f64() * 1e3,
        }))
    }

    /// A tensor's bytes, hex (for tests and debugging; at most 64 MiB).
    fn fetch(&mut self, r: &Json) -> Reply {
        let i = int_field(r, "tensor", 0, 0, u32::MAX as u64)? as usize;
        let &(ptr, bytes) = self.tensors.get(i).ok_or_else(|| {
            Failure::bad(format!(
                "fetch: tensor {i} is not there ({} are)",
                self.tensors.len()
            ))
        })?;
        if bytes > 64 << 20 {
            return Err(Failure::bad(format!(
                "fetch: tensor {i} has {bytes} bytes; 64 MiB at most"
            )));
        }
        self.gpu.synchronize()?;
        let mut raw = vec![0u8; bytes as usize];
        self.gpu.download(ptr, &mut raw)?;
        let text: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Ok(json!({"bytes": bytes, "hex": text}))
    }

    fn module(&mut self, image: &std::path::Path) -> Result<u64, Failure> {
        if let Some(&m) = self.modules.get(image) {
            return Ok(m);
        }
        if self.module_order.len() >= MAX_MODULES {
            let old = self.module_order.remove(0);
            if let Some(m) = self.modules.remove(&old) {
                self.gpu.unload_module(m);
            }
        }
        let bytes = std::fs::read(image).map_err(|e| {
            Failure::new(
                "compile_error",
                format!("cannot read the image {}: {e}", image.display()),
            )
        })?;
        let m = self.gpu.load_module(&bytes)?;
        self.modules.insert(image.to_path_buf(), m);
        self.module_order.push(image.to_path_buf());
        Ok(m)
    }

    /// Prepares a job and launches it once into its poisoned output; the
    /// runner then asks the Python worker to compare.
    fn check(&mut self, r: &Json) -> Reply {
        let req: CheckRequest =
            serde_json::from_value(r.clone()).map_err(|e| Failure::bad(format!("check: {e}")))?;
        self.release();
        let module = self.module(&req.image)?;
        let function = self.gpu.function(module, &req.symbol)?;
        let grid = dims(&req.grid, "grid")?;
        let block = dims(&req.block, "block")?;
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        let limit = self.gpu.max_threads(function)? as u64;
        if threads > limit {
            return Err(Failure::new(
                "out_of_resources",
                format!("a block of {threads} threads; this kernel launches with at most {limit} (its registers decide)"),
            ));
        }
        let shared = u32::try_from(req.shared).map_err(|_| {
            Failure::new(
                "out_of_resources",
                format!("{} bytes of shared memory", req.shared),
            )
        })?;
        let static_shared = self.gpu.static_shared(function)?;
        let usage = self.gpu.usage(function)?;
        let optin = self.gpu.max_shared_optin();
        if optin > 0 && shared as u64 + static_shared as u64 > optin as u64 {
            return Err(Failure::new(
                "out_of_resources",
                format!(
                    "{shared} bytes of dynamic and {static_shared} of static shared memory; a block may have {optin}"
                ),
            ));
        }
        if shared > 48 * 1024 {
            self.gpu.allow_shared(function, shared)?;
        }
        let grid_blocks = grid.iter().map(|&g| g as u64).product::<u64>();
        let mut values = vec![0u64; req.args.len()].into_boxed_slice();
        let mut scratch = Vec::new();
        for (slot, arg) in values.iter_mut().zip(&req.args) {
            *slot = match *arg {
                Arg::Tensor(i) => {
                    self.tensors
                        .get(i)
                        .ok_or_else(|| {
                            Failure::bad(format!(
                                "tensor {i} was not imported ({} are)",
                                self.tensors.len()
                            ))
                        })?
                        .0
                }
                Arg::I32(v) => v as u32 as u64,
                Arg::U32(v) => v as u64,
                Arg::I64(v) => v as u64,
                Arg::U64(v) => v,
                Arg::F32(v) => v.to_bits() as u64,
                Arg::F64(v) => v.to_bits(),
                Arg::Scratch(0) => 0,
                Arg::Scratch(bytes) => {
                    // Per program, as Triton's launcher sizes global scratch.
                    let total = bytes.checked_mul(grid_blocks).ok_or_else(|| {
                        Failure::new("out_of_resources", "scratch size overflows")
                    })?;
                    let p = self.gpu.alloc(total as usize)?;
                    scratch.push(p);
                    p
                }
            };
        }
        let params: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        let mut prepared = Prepared {
            job_id: req.job_id.clone(),
            function,
            grid,
            block,
            shared,
            _values: values,
            params,
            scratch,
            graphs: HashMap::new(),
        };
        if let Some(p) = &req.poison {
            let (ptr, bytes) = *self.tensors.get(p.tensor).ok_or_else(|| {
                Failure::bad(format!("poison: tensor {} was not imported", p.tensor))
            })?;
            let pattern = hex(&p.pattern)?;
            if pattern.is_empty() || p.elements.saturating_mul(pattern.len() as u64) > bytes {
                return Err(Failure::bad("poison: the pattern does not fit the tensor"));
            }
            self.poison(ptr, &pattern, p.elements)?;
        }
        let started = Instant::now();
        prepared.launch(self.gpu.as_ref())?;
        self.gpu.synchronize()?;
        let us = started.elapsed().as_secs_f64() * 1e6;
        self.prepared = Some(prepared);
        let compared = match &req.compare {
            Some(c) => self.compare(c)?,
            None => Json::Null,
        };
        let passed = compared.get("passed").and_then(Json::as_bool) == Some(true);
        let then = match &req.then {
            Some(then) if passed => self.then(&req.job_id, then),
            _ => Json::Null,
        };
        Ok(json!({
            "compared": compared,
            "then": then,
            "launch_us": us,
            "kernel": {
                "name": req.symbol,
                "n_regs": usage.registers,
                "local_bytes": usage.local_bytes,
                "shared": static_shared as u64 + shared as u64,
                "threads": threads,
            },
        }))
    }

    /// A passing check's `then`: the warm-up and the first batch (and under
    /// `until` the later ones, in `more`), or why they failed (the check's
    /// verdict stands either way).
    fn then(&mut self, job_id: &str, then: &Then) -> Json {
        let with_id = |fields: &serde_json::Map<String, Json>| {
            let mut r = Json::Object(fields.clone());
            r["job_id"] = json!(job_id);
            r
        };
        let result = self.warmup(&with_id(&then.warmup)).and_then(|warmed| {
            let sample = with_id(&then.sample);
            let mut batch = || -> Result<(Json, f64), Failure> {
                let started = Instant::now();
                let sampled = self.sample(&sample)?;
                Ok((sampled, started.elapsed().as_secs_f64() * 1e3))
            };
            let (sampled, wall_ms) = batch()?;
            let mut more = Vec::new();
            if let Some(rule) = &then.until {
                // The runner's own rule on what the runner will hold: the
                // samples and each batch's wall time, as this answer gives them.
                let mut so_far = Sampling::default();
                add_batch(&mut so_far, &sampled, wall_ms);
                while so_far.decide_by(rule) == Decision::Continue {
                    let (sampled, wall_ms) = batch()?;
                    add_batch(&mut so_far, &sampled, wall_ms);
                    more.push(json!({"sample": sampled, "wall_ms": wall_ms}));
                }
            }
            Ok(
                json!({"ok": true, "warmup": warmed, "sample": sampled, "wall_ms": wall_ms,
                      "more": more}),
            )
        });
        result.unwrap_or_else(|f| json!({"ok": false, "class": f.class, "message": f.message}))
    }

    /// The tolerance check of python/tunelab/compare.py, on the GPU
    /// (tunelab_compare), with the same figures: an element mismatches when
    /// |out - ref| > atol + rtol * |ref| in fp32 (NaN always does); it passes
    /// with no NaN or infinite output and at most `max_mismatch` of the
    /// elements mismatching; the error maxima are over pairs finite on both
    /// sides (0 where there are none), the relative one in fp64.
    fn compare(&mut self, c: &CompareRequest) -> Reply {
        let function = self.helpers.as_ref().map(|h| h.compare).ok_or_else(|| {
            Failure::bad("compare needs tunelab's helper kernels (hello's `helpers`)")
        })?;
        let tensor = |i: usize, dtype: &str, what: &str| -> Result<(Ptr, i32), Failure> {
            let (kind, size) = element_kind(dtype).ok_or_else(|| {
                Failure::bad(format!(
                    "compare: {what} is {dtype}; float32, float16 or bfloat16 only"
                ))
            })?;
            let (ptr, bytes) = *self.tensors.get(i).ok_or_else(|| {
                Failure::bad(format!(
                    "compare: tensor {i} was not imported ({} are)",
                    self.tensors.len()
                ))
            })?;
            if c.elements.saturating_mul(size) > bytes {
                return Err(Failure::bad(format!(
                    "compare: {} {dtype} elements do not fit the {what}'s {bytes} bytes",
                    c.elements
                )));
            }
            Ok((ptr, kind))
        };
        let (mut out, mut out_kind) = tensor(c.out, &c.out_dtype, "output")?;
        let (mut reference, mut reference_kind) =
            tensor(c.reference, &c.reference_dtype, "reference")?;
        let result = match self.compare_result {
            Some(p) => p,
            None => {
                let p = self.gpu.alloc(48)?;
                self.compare_result = Some(p);
                p
            }
        };
        self.gpu.fill(result, &[0, 0, 0, 0], 12)?;
        // torch computes with the tolerances as fp32 scalars.
        let (mut n, mut atol, mut rtol, mut result_ptr) =
            (c.elements, c.atol as f32, c.rtol as f32, result);
        let mut params = [
            (&mut out as *mut u64).cast::<c_void>(),
            (&mut out_kind as *mut i32).cast::<c_void>(),
            (&mut reference as *mut u64).cast::<c_void>(),
            (&mut reference_kind as *mut i32).cast::<c_void>(),
            (&mut n as *mut u64).cast::<c_void>(),
            (&mut atol as *mut f32).cast::<c_void>(),
            (&mut rtol as *mut f32).cast::<c_void>(),
            (&mut result_ptr as *mut u64).cast::<c_void>(),
        ];
        let blocks = c
            .elements
            .div_ceil(COMPARE_THREADS as u64)
            .clamp(1, COMPARE_MAX_BLOCKS) as u32;
        // SAFETY: tunelab_compare(const void*, int, const void*, int, unsigned long long,
        // float, float, unsigned long long*), each parameter pointing at a value of its size.
        unsafe {
            self.gpu.launch(
                function,
                [blocks, 1, 1],
                [COMPARE_THREADS, 1, 1],
                0,
                params.as_mut_ptr(),
            )?
        };
        let mut raw = [0u8; 48];
        self.gpu.download(result, &mut raw)?;
        let word =
            |i: usize| u64::from_le_bytes(raw[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        Ok(compare_figures(
            [word(0), word(1), word(2), word(3), word(4), word(5)],
            c.elements,
            c.max_mismatch,
        ))
    }

    fn poison(&mut self, ptr: Ptr, pattern: &[u8], elements: u64) -> Result<(), Failure> {
        match pattern.len() {
            1 | 2 | 4 => self.gpu.fill(ptr, pattern, elements as usize)?,
            8 if pattern[..4] == pattern[4..] => {
                self.gpu.fill(ptr, &pattern[..4], 2 * elements as usize)?
            }
            _ => {
                let bytes: Vec<u8> = pattern
                    .iter()
                    .copied()
                    .cycle()
                    .take(pattern.len() * elements as usize)
                    .collect();
                self.gpu.upload(ptr, &bytes)?;
            }
        }
        self.gpu.synchronize()?;
        Ok(())
    }

    /// Fails unless `r`'s job is the prepared one.
    fn prepared(&self, r: &Json) -> Result<(), Failure> {
        let id = r.get("job_id").and_then(Json::as_str).unwrap_or("");
        match &self.prepared {
            Some(p) if p.job_id == id => Ok(()),
            other => Err(Failure::bad(format!(
                "job {id:?} is not prepared (prepared: {}); send a check first",
                other.as_ref().map_or("none", |p| p.job_id.as_str())
            ))),
        }
    }

    fn events(&mut self, count: usize) -> Result<(), Failure> {
        while self.starts.len() < count {
            let s = self.gpu.new_event()?;
            let e = self.gpu.new_event()?;
            self.starts.push(s);
            self.ends.push(e);
        }
        Ok(())
    }

    fn warmup(&mut self, r: &Json) -> Reply {
        let min_launches = int_field(r, "min_launches", 3, 0, MAX_SAMPLES)?;
        let min_ms = r.get("min_ms").and_then(Json::as_f64).unwrap_or(5.0);
        if !(min_ms.is_finite() && min_ms >= 0.0) {
            return Err(Failure::bad("`min_ms` must be a finite number >= 0"));
        }
        self.prepared(r)?;
        self.events(1)?;
        let (start, end) = (self.starts[0], self.ends[0]);
        let mut prepared = self.prepared.take();
        let p = prepared.as_mut().expect("checked above");
        let gpu = self.gpu.as_ref();
        let result = (|| -> Result<(u64, f64), Failure> {
            let (mut launches, mut ms) = (0u64, 0.0f64);
            let mut batch = min_launches.max(1);
            loop {
                gpu.record(start)?;
                for _ in 0..batch {
                    p.launch(gpu)?;
                }
                gpu.record(end)?;
                gpu.synchronize()?;
                launches += batch;
                ms += gpu.elapsed_ms(start, end)? as f64;
                if launches >= min_launches && ms >= min_ms {
                    return Ok((launches, ms));
                }
                // The next batch from the time per launch so far, at most 4x larger.
                let per = ms / launches as f64;
                let needed = if per > 0.0 {
                    ((min_ms - ms) / per).ceil().max(1.0) as u64
                } else {
                    2 * batch
                };
                batch = needed.min(4 * batch).clamp(1, MAX_WARMUP_BATCH);
            }
        })();
        self.prepared = prepared;
        let (launches, ms) = result?;
        Ok(json!({"launches": launches, "ms": ms}))
    }

    /// Queues the spin kernel for about `us` microseconds.
    fn hold_gpu(&self, us: f64) -> Result<(), Failure> {
        let Some(h) = &self.helpers else {
            return Ok(());
        };
        let mut cycles: i64 = (us.min(MAX_SPIN_US) * SPIN_CYCLES_PER_US) as i64;
        let mut params = [(&mut cycles as *mut i64).cast::<c_void>()];
        // SAFETY: tunelab_spin takes one 8-byte integer.
        unsafe {
            self.gpu
                .launch(h.spin, [1, 1, 1], [1, 1, 1], 0, params.as_mut_ptr())?
        };
        Ok(())
    }

    /// The flush buffer of `bytes` (zeroed once), allocated or grown on demand.
    fn flush_buffer(&mut self, bytes: u64) -> Result<Option<(Ptr, u64)>, Failure> {
        if bytes == 0 {
            return Ok(None);
        }
        let bytes = bytes.div_ceil(16) * 16;
        match self.flush {
            Some((p, n)) if n >= bytes => return Ok(Some((p, bytes))),
            Some((p, _)) => {
                self.gpu.free(p);
                self.flush = None;
            }
            None => {}
        }
        let p = self.gpu.alloc(bytes as usize)?;
        self.gpu.fill(p, &[0, 0, 0, 0], (bytes / 4) as usize)?;
        self.gpu.synchronize()?;
        self.flush = Some((p, bytes));
        if self.sink.is_none() {
            self.sink = Some(self.gpu.alloc(16)?);
        }
        Ok(Some((p, bytes)))
    }

    fn evict(&self, buf: (Ptr, u64), with: &str) -> Result<(), Failure> {
        match (with, &self.helpers) {
            ("read", Some(h)) => {
                let (mut ptr, mut chunks, mut sink) = (buf.0, buf.1 / 16, self.sink.unwrap_or(0));
                let mut params = [
                    (&mut ptr as *mut u64).cast::<c_void>(),
                    (&mut chunks as *mut u64).cast::<c_void>(),
                    (&mut sink as *mut u64).cast::<c_void>(),
                ];
                // SAFETY: tunelab_flush_read(const uint4*, unsigned long long, unsigned*).
                unsafe {
                    self.gpu.launch(
                        h.flush_read,
                        [1024, 1, 1],
                        [256, 1, 1],
                        0,
                        params.as_mut_ptr(),
                    )?
                };
            }
            // A memset, or a read with no helper kernel to do it.
            _ => self.gpu.fill(buf.0, &[0, 0, 0, 0], (buf.1 / 4) as usize)?,
        }
        Ok(())
    }

    fn sample(&mut self, r: &Json) -> Reply {
        let count = int_field(r, "count", 0, 1, MAX_SAMPLES)? as usize;
        let flush_bytes = int_field(r, "flush_bytes", 0, 0, u64::MAX)?;
        let flush_with = r.get("flush_with").and_then(Json::as_str).unwrap_or("read");
        if !["read", "memset"].contains(&flush_with) {
            return Err(Failure::bad(format!(
                "flush_with must be read or memset, got {flush_with:?}"
            )));
        }
        let timing = r.get("timing").and_then(Json::as_str).unwrap_or("cold");
        let graph_calls = int_field(r, "graph_calls", 10, 1, MAX_GRAPH_CALLS)?;
        self.prepared(r)?;
        self.events(count)?;
        let (us, timer) = match timing {
            "cold" | "hot" => {
                let flush = if timing == "cold" {
                    self.flush_buffer(flush_bytes)?
                } else {
                    None
                };
                (
                    self.sample_launches(count, flush, flush_with)?,
                    "cuda_event",
                )
            }
            "graph" => (self.sample_graph(count, graph_calls)?, "cuda_graph"),
            other => {
                return Err(Failure::bad(format!(
                    "timing must be cold, hot or graph, got {other:?}"
                )))
            }
        };
        let clock = self.sm_clock();
        Ok(json!({"us": us, "timer": timer, "sm_clock_mhz": clock}))
    }

    fn sample_launches(
        &mut self,
        count: usize,
        flush: Option<(Ptr, u64)>,
        with: &str,
    ) -> Result<Vec<f64>, Failure> {
        self.hold_gpu(1.5 * self.enqueue_us * count as f64)?;
        let mut p = self.prepared.take().expect("checked by the caller");
        let queued = (|| -> Result<f64, Failure> {
            let queued_at = Instant::now();
            for i in 0..count {
                if let Some(buf) = flush {
                    self.evict(buf, with)?;
                }
                self.gpu.record(self.starts[i])?;
                p.launch(self.gpu.as_ref())?;
                self.gpu.record(self.ends[i])?;
            }
            Ok(queued_at.elapsed().as_secs_f64() * 1e6 / count as f64)
        })();
        self.prepared = Some(p);
        self.enqueue_us = queued?;
        self.gpu.synchronize()?;
        (0..count)
            .map(|i| Ok(self.gpu.elapsed_ms(self.starts[i], self.ends[i])? as f64 * 1e3))
            .collect()
    }

    fn sample_graph(&mut self, count: usize, calls: u64) -> Result<Vec<f64>, Failure> {
        let mut p = self.prepared.take().expect("checked by the caller");
        let graph = match p.graphs.get(&calls) {
            Some(&g) => Ok(g),
            None => {
                (|| -> Result<u64, Failure> {
                    // One launch outside the capture, as the Python worker does.
                    p.launch(self.gpu.as_ref())?;
                    self.gpu.synchronize()?;
                    self.gpu.begin_capture()?;
                    let mut captured = Ok(());
                    for _ in 0..calls {
                        captured = p.launch(self.gpu.as_ref());
                        if captured.is_err() {
                            break;
                        }
                    }
                    // The capture ends whatever happened, so the stream is usable again.
                    let ended = self.gpu.end_capture();
                    captured.map_err(|e| {
                    Failure::new("launch_error", format!("timing 'graph': this launch cannot be captured in a CUDA graph ({e})"))
                })?;
                    let g = ended?;
                    p.graphs.insert(calls, g);
                    Ok(g)
                })()
            }
        };
        let result = graph.and_then(|g| {
            self.hold_gpu(1.5 * self.enqueue_us * count as f64)?;
            let queued_at = Instant::now();
            for i in 0..count {
                self.gpu.record(self.starts[i])?;
                self.gpu.launch_graph(g)?;
                self.gpu.record(self.ends[i])?;
            }
            self.enqueue_us = queued_at.elapsed().as_secs_f64() * 1e6 / count as f64;
            self.gpu.synchronize()?;
            (0..count)
                .map(|i| {
                    Ok(
                        self.gpu.elapsed_ms(self.starts[i], self.ends[i])? as f64 * 1e3
                            / calls as f64,
                    )
                })
                .collect()
        });
        self.prepared = Some(p);
        result
    }

    /// Host cost of launching the prepared job: `count` launches queued
    /// behind a spin (so the queue never fills), timed on the host, then one
    /// synchronisation. Answers the mean and the median of per-launch times
    /// over batches of 100, in microseconds.
    fn launch_cost(&mut self, r: &Json) -> Reply {
        let count = int_field(r, "count", 10_000, 100, MAX_SAMPLES)?;
        self.prepared(r)?;
        let mut p = self.prepared.take().expect("just checked");
        let result = (|| -> Result<Json, Failure> {
            let mut per_batch = Vec::new();
            let started = Instant::now();
            let mut done = 0;
            while done < count {
                let n = (count - done).min(100);
                // Enough spin for the batch: launches are then queued, never blocked on a full queue.
                self.hold_gpu(n as f64 * 20.0)?;
                let t = Instant::now();
                for _ in 0..n {
                    p.launch(self.gpu.as_ref())?;
                }
                per_batch.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
                self.gpu.synchronize()?;
                done += n;
            }
            let total = started.elapsed().as_secs_f64();
            per_batch.sort_by(f64::total_cmp);
            Ok(json!({
                "launches": count,
                "mean_us": per_batch.iter().sum::<f64>() / per_batch.len() as f64,
                "median_us": per_batch[per_batch.len() / 2],
                "wall_s": total,
            }))
        })();
        self.prepared = Some(p);
        result
    }

    fn sm_clock(&mut self) -> Option<f64> {
        let uuid = self.gpu.facts().uuid.clone();
        if self.clock.is_none() {
            self.clock = Some(super::nvml::SmClock::open(&uuid));
        }
        self.clock.as_ref().and_then(|c| c.read())
    }

    fn release(&mut self) {
        if let Some(mut p) = self.prepared.take() {
            for (_, g) in p.graphs.drain() {
                self.gpu.destroy_graph(g);
            }
            for s in p.scratch.drain(..) {
                self.gpu.free(s);
            }
        }
    }

    fn release_all(&mut self) {
        self.release();
        self.unmap();
        let _ = self.gpu.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_request_reads_each_fill_and_the_reference() {
        let r: BuildRequest = serde_json::from_value(json!({
            "tensors": [
                {"bytes": 8, "dtype": "float16", "fill": {"normal": {"std": 0.5, "stream": 1}}},
                {"bytes": 8, "dtype": "float32", "fill": "zeros"},
                {"bytes": 8, "dtype": "bfloat16", "fill": null},
                {"bytes": 8, "dtype": "float32"},
            ],
            "seed": 3,
            "reference": {"op": "matmul", "a": 0, "b": 1, "out": 3, "m": 2, "n": 1, "k": 2},
        }))
        .unwrap();
        assert!(matches!(
            r.tensors[0].fill,
            Some(Fill::Normal { std, stream: 1 }) if std == 0.5
        ));
        assert!(matches!(r.tensors[1].fill, Some(Fill::Zeros)));
        assert!(r.tensors[2].fill.is_none() && r.tensors[3].fill.is_none());
        assert!(matches!(
            r.reference,
            Some(ReferenceOp::Matmul {
                a: 0,
                b: 1,
                out: 3,
                m: 2,
                n: 1,
                k: 2
            })
        ));
        // An operator the worker does not know is refused, not ignored.
        let unknown = json!({"tensors": [], "seed": 0, "reference": {"op": "conv", "a": 0}});
        assert!(serde_json::from_value::<BuildRequest>(unknown).is_err());
    }

    #[test]
    fn compare_figures_follow_python_compare() {
        // 1000 elements, 990 within tolerance, no NaN or infinity: passes at 1 %, not at 0.5 %.
        let abs = 0.25f32.to_bits() as u64;
        let rel = 3.5f64.to_bits();
        let fig = compare_figures([0, 0, 990, 1000, abs, rel], 1000, 0.01);
        assert_eq!(fig["passed"], true);
        assert_eq!(fig["mismatch_frac"], 0.01);
        assert_eq!(fig["max_abs_err"], 0.25);
        assert_eq!(fig["max_rel_err"], 3.5);
        assert_eq!(
            compare_figures([0, 0, 990, 1000, abs, rel], 1000, 0.005)["passed"],
            false
        );
        // A NaN output fails whatever the mismatch allowance.
        let fig = compare_figures([1, 0, 999, 999, abs, rel], 1000, 1.0);
        assert_eq!(fig["passed"], false);
        assert_eq!(fig["nan_count"], 1);
        // No pair finite on both sides: the maxima are 0, as compare() reports them.
        let fig = compare_figures([0, 4, 0, 0, u64::MAX, u64::MAX], 4, 1.0);
        assert_eq!(fig["max_abs_err"], 0.0);
        assert_eq!(fig["max_rel_err"], 0.0);
        assert_eq!(fig["passed"], false);
        // No elements: nothing mismatches.
        assert_eq!(compare_figures([0; 6], 0, 0.0)["mismatch_frac"], 0.0);
    }

    #[test]
    fn compare_threads_match_the_kernel() {
        let source = include_str!("helpers.cu");
        let define = format!("#define TUNELAB_COMPARE_THREADS {COMPARE_THREADS}\n");
        assert!(source.contains(&define), "helpers.cu must say {define:?}");
    }

    #[test]
    fn compare_knows_three_element_types() {
        assert_eq!(element_kind("float32"), Some((0, 4)));
        assert_eq!(element_kind("float16"), Some((1, 2)));
        assert_eq!(element_kind("bfloat16"), Some((2, 2)));
        assert_eq!(element_kind("float8_e4m3fn"), None);
    }
}
