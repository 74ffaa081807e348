//! The native worker: `tunelab native-worker [--backend cuda|hip]`, one
//! process per lane GPU, serving the runner over JSON lines on stdin/stdout
//! the way a Python worker does (docs/native-backend.md has the protocol,
//! `crate::protocol::native` its messages). It maps the shape's tensors
//! that the lane's Python worker shares (CUDA IPC) or builds them
//! (`tensors.rs`), loads compiled images and launches them with the
//! arguments the runner resolved (`launch.rs`), compares an output with
//! the reference on the GPU (`compare.rs`), and times launches the way the
//! Python worker's `CudaEventTimer` does (`timing.rs`): an event pair
//! around each launch, one host synchronisation per batch, a spin kernel
//! holding the GPU while the batch is queued, L2 evicted before each cold
//! sample, CUDA graphs for graph timing. It returns raw samples; how many
//! is the runner's stopping rule, which a check's `then` may hand it
//! (`until`) to run itself, so a job's batches need no round trip each.
//! This file reads requests and writes answers, and holds the worker's
//! state on its GPU.
//!
//! A kernel that faults poisons this process's context: the runner kills the
//! worker after any `launch_error`, as it does a Python worker, and starts a
//! new one for the next job.

mod compare;
mod launch;
mod tensors;
mod timing;

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value as Json};

use super::gpu::{ErrorClass, Gpu, GpuError, Ptr};
use crate::protocol::lines::{self, LineReader, Wait};
use crate::protocol::native::{self as message, HelloAnswer};
use crate::protocol::{Empty, FailureKind, JobSample, JobWarmup};

use launch::Prepared;

/// The native worker protocol this build speaks.
pub const PROTOCOL: u32 = message::VERSION;

/// A failure with its protocol class.
#[derive(Debug)]
struct Failure {
    class: FailureKind,
    message: String,
}

impl Failure {
    fn new(class: FailureKind, message: impl Into<String>) -> Failure {
        Failure {
            class,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Failure {
        Failure::new(FailureKind::BadRequest, message)
    }
}

impl From<GpuError> for Failure {
    fn from(e: GpuError) -> Failure {
        let class = match e.class {
            ErrorClass::Image => FailureKind::CompileError,
            ErrorClass::Resources => FailureKind::OutOfResources,
            ErrorClass::Fault | ErrorClass::Other => FailureKind::LaunchError,
        };
        Failure::new(class, e.to_string())
    }
}

/// An answer's body, serialised: the text of a JSON object, to which the
/// envelope's fields are added.
type Reply = Result<String, Failure>;

/// An answer's body as the line carries it, serialised once from its type
/// (with no JSON tree in between: a check's `then` may hold thousands of
/// samples, and the worker serialises it while the next job waits).
fn answer(body: impl Serialize) -> Reply {
    Ok(serde_json::to_string(&body).expect("an answer serialises"))
}

/// The answer's line: the body's fields (or a failure's class and
/// message), then `id` and `ok`; the caller adds the worker's own fields,
/// `worker_us` last.
fn answer_line(id: &Json, response: Reply) -> String {
    let id = serde_json::to_string(id).expect("an id serialises");
    match response {
        Ok(mut text) => {
            debug_assert!(text.starts_with('{') && text.ends_with('}'), "{text}");
            text.pop(); // the object's closing brace
            if text.len() > 1 {
                text.push(',');
            }
            text.push_str(&format!("\"id\":{id},\"ok\":true"));
            text
        }
        Err(f) => {
            let failure = json!({"ok": false, "class": f.class, "message": f.message});
            let mut text = serde_json::to_string(&failure).expect("a failure serialises");
            text.pop();
            text.push_str(&format!(",\"id\":{id}"));
            text
        }
    }
}

/// A request, read and checked against the protocol's limits before the
/// GPU is asked anything: a bad request is `bad_request` with or without a
/// GPU.
enum Request {
    Hello(message::Hello),
    Import(message::Import),
    Build(message::Build),
    Fetch(message::Fetch),
    Check(Box<message::Check<'static>>),
    Warmup(JobWarmup),
    Sample(JobSample),
    Compare(message::Compare<'static>),
    LaunchCost(message::LaunchCost),
    Release,
    Shutdown,
}

fn body<T: DeserializeOwned>(op: &str, request: Json) -> Result<T, Failure> {
    serde_json::from_value(request).map_err(|e| Failure::bad(format!("{op}: {e}")))
}

impl Request {
    /// The request `op` of this line (`line`: the whole request).
    fn read(op: &str, line: Json) -> Result<Request, Failure> {
        Ok(match op {
            "hello" => Request::Hello(body(op, line)?),
            "import" => Request::Import(body(op, line)?),
            "build" => Request::Build(body(op, line)?),
            "fetch" => Request::Fetch(body(op, line)?),
            "check" => Request::Check(Box::new(body(op, line)?)),
            "warmup" => {
                let r: JobWarmup = body(op, line)?;
                r.warmup.check().map_err(Failure::bad)?;
                Request::Warmup(r)
            }
            "sample" => {
                let r: JobSample = body(op, line)?;
                r.sample.check().map_err(Failure::bad)?;
                Request::Sample(r)
            }
            "compare" => Request::Compare(body(op, line)?),
            "launch_cost" => {
                let r: message::LaunchCost = body(op, line)?;
                if !(100..=crate::protocol::timing::MAX_SAMPLES).contains(&r.count) {
                    return Err(Failure::bad(format!(
                        "`count` must be in 100..={}, got {}",
                        crate::protocol::timing::MAX_SAMPLES,
                        r.count
                    )));
                }
                Request::LaunchCost(r)
            }
            "release" => Request::Release,
            "shutdown" => Request::Shutdown,
            other => return Err(Failure::bad(format!("unknown op `{other}`"))),
        })
    }
}

struct Helpers {
    spin: u64,
    flush_read: u64,
    compare: u64,
    fill_normal: u64,
    matmul_reference: u64,
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
            // An answer repeats an integer id; a line without one is
            // answered with a null id, as the Python worker answers it.
            Ok(request)
                if !request
                    .get("id")
                    .is_some_and(|id| id.is_i64() || id.is_u64()) =>
            {
                (
                    Json::Null,
                    Err(Failure::bad(format!(
                        "a request is a JSON object with an integer `id`; this one's is {}",
                        match request.get("id") {
                            None => "missing",
                            Some(Json::String(_)) => "a string",
                            Some(Json::Number(_)) => "not a whole number",
                            Some(_) => "not a number",
                        }
                    ))),
                )
            }
            Ok(request) => {
                let id = request.get("id").cloned().unwrap_or(Json::Null);
                let op = request
                    .get("op")
                    .and_then(Json::as_str)
                    .unwrap_or("")
                    .to_string();
                stopping = op == "shutdown";
                let reply = Request::read(&op, request).and_then(|request| match &mut server {
                    Ok(s) => s.handle(request),
                    Err(_) if matches!(request, Request::Shutdown) => answer(Empty {}),
                    Err(why) => Err(Failure::new(
                        FailureKind::ProblemError,
                        format!("the native worker cannot use its GPU: {why}"),
                    )),
                });
                (id, reply)
            }
            Err(e) => (
                Json::Null,
                Err(Failure::bad(format!("not a JSON request: {e}"))),
            ),
        };
        // The worker's time runs until its answer is text: serialising it is
        // the worker's work, not the pipe's.
        let mut text = answer_line(&id, response);
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

    fn handle(&mut self, request: Request) -> Reply {
        match request {
            Request::Hello(r) => self.hello(&r),
            Request::Import(r) => self.import(&r),
            Request::Build(r) => self.build(&r),
            Request::Fetch(r) => self.fetch(&r),
            Request::Check(r) => self.check(&r),
            Request::Warmup(r) => answer(self.warmup(&r.job_id, &r.warmup)?),
            Request::Sample(r) => answer(self.sample(&r.job_id, &r.sample)?),
            Request::Compare(r) => answer(self.compare(&r)?),
            Request::LaunchCost(r) => self.launch_cost(&r),
            Request::Release => {
                self.release();
                answer(Empty {})
            }
            Request::Shutdown => answer(Empty {}),
        }
    }

    fn hello(&mut self, r: &message::Hello) -> Reply {
        if let Some(path) = &r.helpers {
            let image = std::fs::read(path).map_err(|e| {
                Failure::new(
                    FailureKind::ProblemError,
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
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
        answer(HelloAnswer {
            protocol: PROTOCOL,
            backend: f.backend.to_string(),
            device: f.name.clone(),
            uuid: f.uuid.clone(),
            driver: f.driver.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        })
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
    fn an_answer_line_is_its_body_then_its_id_and_ok() {
        let line = answer_line(&json!(7), answer(json!({"launches": 3, "ms": 5.0})));
        assert_eq!(line, r#"{"launches":3,"ms":5.0,"id":7,"ok":true"#);
        assert_eq!(
            answer_line(&json!(8), answer(Empty {})),
            r#"{"id":8,"ok":true"#
        );
        let failed = answer_line(&Json::Null, Err(Failure::bad("unknown op `x`")));
        assert_eq!(
            failed,
            r#"{"ok":false,"class":"bad_request","message":"unknown op `x`","id":null"#
        );
    }

    #[test]
    fn a_request_is_read_and_held_to_the_protocols_limits_before_any_gpu_call() {
        let read = |line: Json| {
            let op = line["op"].as_str().unwrap().to_string();
            Request::read(&op, line)
        };
        assert!(matches!(
            read(json!({"id": 1, "op": "sample", "job_id": "j", "count": 4})),
            Ok(Request::Sample(_))
        ));
        for bad in [
            json!({"id": 1, "op": "sample", "job_id": "j", "count": 0}),
            json!({"id": 1, "op": "sample", "job_id": "j", "count": 1, "graph_calls": 10_001}),
            json!({"id": 1, "op": "sample", "job_id": "j", "count": 1, "timing": "warm"}),
            json!({"id": 1, "op": "warmup", "job_id": "j", "min_ms": -1.0}),
            json!({"id": 1, "op": "launch_cost", "job_id": "j", "count": 10}),
            json!({"id": 1, "op": "check", "job_id": "j"}),
            json!({"id": 1, "op": "teleport"}),
        ] {
            match read(bad.clone()) {
                Err(f) => assert_eq!(f.class, FailureKind::BadRequest, "{bad}"),
                Ok(_) => panic!("{bad} was read"),
            }
        }
    }
}
