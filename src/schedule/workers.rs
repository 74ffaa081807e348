//! Starting a run's workers: the compile pool and every lane's worker (a
//! Python worker, with a native one where the experiment has native
//! methods), all at once and none waited for here; and what a worker is told
//! of its GPU (the visible-devices variable, the compile target).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::native::{
    LaneBackend, NativeCompiler, NativeProcess, NativeSetup, NativeSpawn,
};
use crate::backend::python::Hello;
use crate::backend::{JobFailure, PythonBackend, WorkerSpec};
use crate::device::DeviceInfo;
use crate::manifest::{InputSource, LaunchPath, MethodKind};
use crate::plan::{Mode, RunMode};

use super::{compile, RunOptions};

/// A lane's worker, starting on a thread of its own (importing torch takes seconds).
pub(super) type Starting = std::thread::JoinHandle<(LaneBackend, Result<Hello, JobFailure>)>;

/// One lane: its number (journals and traces), its device, its worker.
pub(super) struct LaneStart {
    pub(super) number: u32,
    pub(super) device: Option<String>,
    pub(super) worker: Starting,
}

/// The Python workers of a run: a compile pool, and every lane's worker,
/// all starting at once.
pub(super) struct Workers {
    pub(super) pool: Option<compile::CompilePool>,
    pub(super) lanes: Vec<LaneStart>,
    /// The pool compiles native methods.
    pub(super) native_compiles: bool,
}

impl Workers {
    /// Starts the compile pool first (its workers import Triton while the
    /// lanes' workers import torch), and every lane's worker; none is
    /// waited for here.
    pub(super) fn start(
        opts: &RunOptions<'_>,
        dir: &Path,
        timeout: Duration,
        native_planned: bool,
        seed: u64,
    ) -> Workers {
        let exp = opts.exp;
        let devices: Vec<Option<String>> = if opts.mode == Mode::Interpreter || opts.gpus.is_empty()
        {
            vec![None; opts.interpreter_lanes.max(1)]
        } else {
            opts.gpus.iter().cloned().map(Some).collect()
        };
        let logs = dir.join("logs");
        let native_logs = logs.clone();
        let triton_cache = dir.join(".cache").join("triton");
        let (python, python_path) = (opts.python.clone(), opts.python_path.clone());
        let interpret = opts.mode == Mode::Interpreter;
        let visible_var = visible_devices_var(&opts.device);
        let spec = move |role: &str, device: Option<String>, name: String| WorkerSpec {
            python: python.clone(),
            python_path: python_path.clone(),
            role: role.to_string(),
            interpret,
            visible_device: device,
            visible_var,
            target: None,
            triton_cache: Some(triton_cache.clone()),
            log: logs.join(name),
            background: false,
        };
        let native = native_setup(opts, dir);
        let mut native_compiles = false;
        let native_program = native_worker_program();
        let use_pool =
            opts.mode == Mode::Gpu && opts.compile_workers > 0 && opts.run_mode != RunMode::Check;
        let pool = use_pool.then(|| {
            // Only tunelab's own problems are known to compile without torch; a
            // user's problem gets compile workers that see the GPU, as lanes do.
            let target = compile_target(&opts.device).filter(|_| exp.builtin_problem());
            let workers = (0..opts.compile_workers)
                .map(|i| {
                    let mut s = spec("compile", devices[0].clone(), format!("compile{i}.log"));
                    s.target = target.clone();
                    s.background = opts.compile_priority == crate::config::CompilePriority::Idle;
                    PythonBackend::new(s, &exp.problem, timeout).with_ir_files(exp.ir_files())
                })
                .collect();
            let native_pool = native
                .as_ref()
                .filter(|n| n.unavailable.is_none())
                .map(|n| compile::NativePool {
                    compiler: Arc::clone(&n.compiler),
                    methods: Arc::new(
                        n.methods
                            .iter()
                            .filter(|(_, m)| m.kind.is_native())
                            .map(|(k, m)| (k.clone(), crate::manifest::Method::clone(m)))
                            .collect(),
                    ),
                    threads: opts.compile_workers,
                });
            native_compiles = native_pool.is_some();
            // `inputs: native`: the compile workers compile for the lane's
            // target without torch, as its worker does, so they make each
            // Triton job's native recipe too, over the same described data.
            let recipes = native
                .as_ref()
                .filter(|n| n.lane_target.is_some() && target.is_some())
                .map(|n| compile::RecipeAsk {
                    methods: n
                        .methods
                        .values()
                        .filter(|m| m.kind == MethodKind::Triton)
                        .map(|m| m.name.clone())
                        .collect(),
                    ask: serde_json::json!({"seed": seed, "cache_dir": n.cache_dir()}),
                });
            let pool = compile::CompilePool::start(workers, native_pool, recipes);
            pool.board().set_width(devices.len());
            pool
        });
        let lanes = devices
            .into_iter()
            .enumerate()
            .map(|(i, device)| {
                let number = opts.first_lane + i as u32;
                let mut lane_spec = spec("lane", device.clone(), format!("lane{number}.log"));
                // `inputs: native`: a worker without torch or a GPU (recipes only).
                lane_spec.target = native.as_ref().and_then(|n| n.lane_target.clone());
                let python = PythonBackend::new(lane_spec, &exp.problem, timeout)
                    .with_ir_files(exp.ir_files());
                let mut backend = match &native {
                    Some(setup) => {
                        let spawn = NativeSpawn {
                            program: native_program.clone(),
                            backend: if opts.device.backend == "hip" {
                                "hip"
                            } else {
                                "cuda"
                            },
                            visible_var,
                            visible_device: device.clone(),
                            log: native_logs.join(format!("native{number}.log")),
                        };
                        LaneBackend::with_native(
                            python,
                            Arc::clone(setup),
                            NativeProcess::new(spawn, timeout),
                        )
                    }
                    None => LaneBackend::python(python),
                };
                LaneStart {
                    number,
                    device,
                    worker: std::thread::spawn(move || {
                        let hello = backend.start(native_planned);
                        (backend, hello)
                    }),
                }
            })
            .collect();
        Workers {
            pool,
            lanes,
            native_compiles,
        }
    }
}

/// What the lanes share to launch native methods, when the experiment has
/// any: the methods, their compiler (images under `.cache/native/` of the
/// results directory), and why they cannot run in this run, if so.
fn native_setup(opts: &RunOptions<'_>, dir: &Path) -> Option<Arc<NativeSetup>> {
    let exp = opts.exp;
    if !exp.methods.iter().any(|m| m.launch == LaunchPath::Native) {
        return None;
    }
    let cache = dir.join(".cache").join("native");
    let compiler = Arc::new(NativeCompiler::new(
        &opts.device,
        Some(Path::new(&opts.python)),
        cache.clone(),
    ));
    let unavailable = (opts.mode == Mode::Interpreter)
        .then(|| "they need a GPU, and this run uses Triton's interpreter".to_string());
    let mut setup = NativeSetup::new(
        &exp.problem,
        &exp.methods,
        compiler,
        &opts.device,
        cache,
        unavailable,
    );
    if exp.inputs == InputSource::Native && opts.mode == Mode::Gpu {
        // The lane's Python worker then runs without torch, compiling for
        // the lane's GPU from its description alone, as compile workers do.
        match (&setup.unavailable, compile_target(&opts.device)) {
            (None, Some(target)) => setup.lane_target = Some(target),
            (Some(why), _) => eprintln!(
                "warning: `inputs: native` falls back to python (the lane's Python worker builds the data): {why}"
            ),
            (None, None) => eprintln!(
                "warning: `inputs: native` falls back to python: the lane's worker cannot compile for a {} GPU without seeing it",
                opts.device.backend
            ),
        }
    }
    if let Some(why) = &setup.unavailable {
        for m in exp
            .methods
            .iter()
            .filter(|m| m.kind == MethodKind::Triton && m.launch == LaunchPath::Native)
        {
            if opts.mode == Mode::Gpu {
                eprintln!(
                    "warning: method `{}` (launch: native) is launched by its Python worker: {why}",
                    m.name
                );
            }
        }
    }
    Some(Arc::new(setup))
}

/// The program a lane starts as its native worker: this binary, or
/// `TUNELAB_NATIVE_WORKER` (a tunelab binary) where this process is not one
/// (the Python package's entry point).
fn native_worker_program() -> PathBuf {
    if let Some(p) = std::env::var_os("TUNELAB_NATIVE_WORKER").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("tunelab"))
}

/// The variable that names a lane's GPU to its worker.
pub fn visible_devices_var(device: &DeviceInfo) -> &'static str {
    match device.backend.as_str() {
        "hip" => "HIP_VISIBLE_DEVICES",
        _ => "CUDA_VISIBLE_DEVICES",
    }
}

/// What a compile worker compiles for, in `tunelab.target`'s syntax: the
/// lane GPU's backend, architecture and warp size, so the worker needs no GPU.
pub fn compile_target(device: &DeviceInfo) -> Option<String> {
    match device.backend.as_str() {
        "cuda" if device.cc_major > 0 => Some(format!(
            "cuda:{}{}:{}",
            device.cc_major, device.cc_minor, device.warp_size
        )),
        // Not HIP yet: Triton's HIP specialisation asks each pointer for its
        // allocation's range (buffer ops), which pointer stand-ins cannot
        // answer, so the keys would differ from the lane's. HIP compile
        // workers see the GPU instead.
        _ => None,
    }
}
