//! `tunelab run`: pick the devices, run the experiment and its companions,
//! write their outputs, say what happened.

use std::path::Path;

use super::args::ManifestArgs;
use super::inspect::load_experiment;
use super::results::write_outputs;
use super::Failure;
use crate::config::Settings;
use crate::device::{self, DeviceInfo};
use crate::emit::num::count;
use crate::exit;
use crate::manifest::Experiment;
use crate::plan::{self, Filter, Mode, PlanOptions, RunMode, Shard};
use crate::schedule::{self, RunError, RunOptions};
use crate::store::{self, Fingerprint};

/// What the command line asked `run` to do.
pub struct Request<'a> {
    pub manifest: &'a Path,
    pub args: &'a ManifestArgs,
    pub settings: &'a Settings,
    pub run_mode: RunMode,
    pub use_best: Option<&'a Path>,
    pub progress: bool,
    /// Consumers' tuned files to time beside the tuned method (`--compare-to`).
    pub compare_to: &'a [std::path::PathBuf],
    /// `--gpus`: indices of `tunelab devices`.
    pub gpus: Option<&'a [usize]>,
    /// `--lanes`: at most this many lanes (interpreter: exactly).
    pub lanes: Option<usize>,
    pub shard: Option<Shard>,
    /// Keep IR after the run (`--keep-ir`): whose.
    pub keep_ir: Option<crate::workbench::Which>,
    /// The GPU kept IR is compiled for (`--ir-target`).
    pub ir_target: Option<&'a str>,
}

/// Runs, and writes the timeline to `trace` if asked, even when the run
/// failed or was interrupted: that is when a timeline helps most.
pub(super) fn run_traced(request: &Request<'_>, trace: Option<&Path>) -> Result<i32, Failure> {
    traced(trace, || run(request))
}

/// Runs `body` (a run or an A/B), writing the timeline to `trace` if asked,
/// whatever `body` returned.
pub(super) fn traced(
    trace: Option<&Path>,
    body: impl FnOnce() -> Result<i32, Failure>,
) -> Result<i32, Failure> {
    // Refused before the run, which would otherwise end by replacing the
    // journal it just appended to with the timeline.
    if let Some(why) = trace.and_then(store::results_dir::runner_file) {
        return Err(Failure::bad_input(format!(
            "error: --trace: {why}\nnothing was written"
        )));
    }
    if trace.is_some() {
        crate::trace::enable();
    }
    let result = body();
    if let Some(path) = trace {
        match crate::trace::write(path) {
            Ok(n) => eprintln!("trace: {} ({n} spans)", path.display()),
            Err(e) => eprintln!("warning: cannot write trace {}: {e}", path.display()),
        }
    }
    result
}

/// Where a run executes: GPUs of one model, or the interpreter.
pub(super) struct Target {
    pub(super) device: DeviceInfo,
    pub(super) mode: Mode,
    /// The GPUs' ids in their backend's visible-devices variable, one lane each.
    pub(super) gpus: Vec<String>,
    /// Interpreter lanes.
    pub(super) lanes: usize,
    /// The number of the first lane (lanes are numbered across models).
    pub(super) first_lane: u32,
    /// GPU lanes on this host over every model run at once.
    pub(super) host_lanes: usize,
}

/// The GPUs chosen (`--gpus`, else every visible one; at most `--lanes`),
/// one target per model, each writing its own results directory; or the
/// interpreter when there is no GPU or it is asked for.
pub(super) fn targets(
    settings: &Settings,
    gpus: Option<&[usize]>,
    lanes: Option<usize>,
) -> Result<Vec<Target>, Failure> {
    let discovery = device::discover();
    if !settings.interpret && !discovery.devices.is_empty() {
        let chosen: Vec<usize> = match gpus {
            Some(list) => {
                for &i in list {
                    if i >= discovery.devices.len() {
                        return Err(Failure::bad_input(format!(
                            "error: --gpus {i}: there are {} GPUs here, numbered 0 to {} (`tunelab devices` lists them)",
                            discovery.devices.len(),
                            discovery.devices.len() - 1
                        )));
                    }
                }
                let mut seen = Vec::new();
                for &i in list {
                    if !seen.contains(&i) {
                        seen.push(i);
                    }
                }
                seen
            }
            None => (0..discovery.devices.len()).collect(),
        };
        let chosen: Vec<usize> = chosen
            .into_iter()
            .take(lanes.unwrap_or(usize::MAX))
            .collect();
        let mut out: Vec<Target> = Vec::new();
        for i in chosen {
            let d = &discovery.devices[i];
            let id = visible_id(&discovery.devices, i);
            match out.iter_mut().find(|t| t.device.name == d.name) {
                Some(t) => t.gpus.push(id),
                None => out.push(Target {
                    device: d.clone(),
                    mode: Mode::Gpu,
                    gpus: vec![id],
                    lanes: 0,
                    first_lane: 0,
                    host_lanes: 0,
                }),
            }
        }
        // Lanes of one model are numbered one after the other.
        let mut next = 0u32;
        let host_lanes = out.iter().map(|t| t.gpus.len()).sum();
        for t in &mut out {
            t.first_lane = next;
            t.host_lanes = host_lanes;
            next += t.gpus.len() as u32;
        }
        return Ok(out);
    }
    if gpus.is_some() {
        return Err(Failure::bad_input(
            "error: --gpus names GPUs, and this run uses Triton's interpreter on the CPU\n  = help: use --lanes N for N interpreter lanes",
        ));
    }
    let why = if settings.interpret {
        "interpreter mode requested".to_string()
    } else {
        format!("no GPU found ({})", discovery.notes.join("; "))
    };
    eprintln!("tunelab: {why}: running Triton's interpreter on the CPU. Timings are interpreted wall-clock, not GPU timings, and the manifest's `interpreter:` shapes are used.");
    Ok(vec![Target {
        device: device::profile("cpu").expect("cpu profile"),
        mode: Mode::Interpreter,
        gpus: Vec::new(),
        lanes: lanes.unwrap_or(1),
        first_lane: 0,
        host_lanes: 0,
    }])
}

/// The id that names discovered device `i` to a worker: its entry in the
/// parent's visible-devices variable of its backend (which may hold UUIDs),
/// else its ordinal among that backend's devices. Discovery numbers the
/// devices each backend lets us see, CUDA's first.
fn visible_id(devices: &[DeviceInfo], i: usize) -> String {
    let backend = devices[i].backend.as_str();
    let ordinal = devices[..i].iter().filter(|d| d.backend == backend).count();
    let var = if backend == "hip" {
        "HIP_VISIBLE_DEVICES"
    } else {
        "CUDA_VISIBLE_DEVICES"
    };
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .map(|s| s.trim().to_string())
            .nth(ordinal)
            .unwrap_or_else(|| ordinal.to_string()),
        _ => ordinal.to_string(),
    }
}

fn run(request: &Request<'_>) -> Result<i32, Failure> {
    let targets = targets(request.settings, request.gpus, request.lanes)?;
    if targets.len() == 1 {
        return run_target(request, &targets[0], request.progress);
    }
    // GPUs of several models: one run per model at once, each into its own
    // results directory. The progress line is left out: it would mix them.
    let names: Vec<String> = targets
        .iter()
        .map(|t| format!("{} x {}", t.gpus.len(), t.device.name))
        .collect();
    eprintln!(
        "tunelab: GPUs of {} models ({}): one run each, at the same time",
        targets.len(),
        names.join(", ")
    );
    let results: Vec<Result<i32, Failure>> = std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .map(|t| scope.spawn(move || run_target(request, t, false)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("run thread"))
            .collect()
    });
    let mut code = exit::OK;
    let mut failure: Option<Failure> = None;
    for r in results {
        match r {
            Ok(c) => code = code.max(c),
            Err(f) => {
                if let Some(earlier) = failure.take() {
                    eprint!("{}", earlier.message);
                }
                failure = Some(f);
            }
        }
    }
    match failure {
        Some(f) => Err(f),
        None => Ok(code),
    }
}

/// The experiment and its companions on one target.
fn run_target(request: &Request<'_>, target: &Target, progress: bool) -> Result<i32, Failure> {
    let exp = load_experiment(request.manifest, request.args, &target.device)?;
    let exp = with_compared(exp, request.compare_to)?;
    let mut code = run_experiment(&exp, request, target, request.use_best, progress)?;
    for companion in &exp.companions {
        if code == exit::INTERRUPTED {
            break;
        }
        let shown = companion.display();
        if request.use_best.is_some() {
            eprintln!(
                "note: companion {shown} not run: --use-best names this experiment's results only"
            );
            continue;
        }
        let companion_exp = match load_experiment(companion, request.args, &target.device) {
            Ok(e) => e,
            // An override written for the main experiment may not fit a
            // companion; a companion that is broken on its own is an error.
            Err(err) if !request.args.set.is_empty() => {
                let plain = ManifestArgs {
                    set: Vec::new(),
                    ..request.args.clone()
                };
                load_experiment(companion, &plain, &target.device)?;
                eprintln!(
                    "note: companion {shown} not run: a --set override does not apply to it ({})",
                    err.message.lines().next().unwrap_or("")
                );
                continue;
            }
            Err(err) => return Err(err),
        };
        let filter = Filter::parse(request.args.only.as_deref().unwrap_or(""))?;
        let opts = PlanOptions {
            device: &target.device,
            filter: &filter,
            mode: target.mode,
        };
        if !plan::filter_applies(&companion_exp, &opts) {
            eprintln!("note: companion {shown} not run: --only names fields it does not have");
            continue;
        }
        if !filter.is_empty() && !plan::has_jobs(&companion_exp, &opts)? {
            eprintln!(
                "note: companion {shown} not run: `--only {}` leaves none of its jobs",
                request.args.only.as_deref().unwrap_or("")
            );
            continue;
        }
        if !request.compare_to.is_empty() {
            eprintln!("note: --compare-to files are timed in {} only", exp.name);
        }
        eprintln!("tunelab: companion {shown}");
        let next = run_experiment(&companion_exp, request, target, None, progress)?;
        code = code.max(next);
    }
    Ok(code)
}

/// Run one experiment on the chosen devices, then write its outputs.
fn run_experiment(
    exp: &Experiment,
    request: &Request<'_>,
    target: &Target,
    use_best: Option<&Path>,
    progress: bool,
) -> Result<i32, Failure> {
    let settings = request.settings;
    if target.mode == Mode::Interpreter && exp.interpreter.is_none() {
        eprintln!("warning: {} has no `interpreter:` section; running its full shape set in the interpreter will be slow", exp.manifest_path.display());
    }
    let filter = Filter::parse(request.args.only.as_deref().unwrap_or(""))?;
    let python_path = super::environment::worker_python_path(exp, &settings.python);
    let only_jobs = match use_best {
        None => None,
        Some(dir) => {
            let (results, _) = store::journal::read(dir)
                .map_err(|e| Failure::bad_input(format!("error: --use-best: {e}")))?;
            Some(crate::emit::best_job_ids(&results))
        }
    };
    let compile_workers = compile_workers(settings, target);
    let fingerprint = fingerprint(exp, target);
    let opts = RunOptions {
        exp,
        device: target.device.clone(),
        gpus: target.gpus.clone(),
        interpreter_lanes: target.lanes,
        first_lane: target.first_lane,
        shard: request.shard,
        mode: target.mode,
        run_mode: request.run_mode,
        filter,
        python: settings.python.clone(),
        python_path,
        results_dir: settings.results_dir.clone(),
        compile_workers,
        compile_priority: settings.compile_priority,
        only_jobs,
        progress,
        retries: settings.retries,
        ab: None,
    };
    let outcome = schedule::run(opts, fingerprint).map_err(run_failure)?;
    for change in &outcome.fingerprint_changes {
        eprintln!("note: environment changed since the journal's last run: {change}");
    }
    if !outcome.interrupted {
        keep_ir(exp, request, target, &outcome.dir, &settings.python)?;
        export_aot(exp, target, &outcome.dir, &settings.python)?;
    }
    let outputs_started = std::time::Instant::now();
    let written = write_outputs(&outcome.dir)?;
    crate::trace::span(
        "runner",
        "write outputs",
        outputs_started,
        serde_json::json!({}),
    );
    let run = outcome.ok + outcome.failed + outcome.pruned + outcome.checked;
    let lanes = match (target.mode, outcome.lanes) {
        (Mode::Interpreter, 1) => "interpreter".to_string(),
        (Mode::Interpreter, n) => format!("interpreter, {n} lanes"),
        (Mode::Gpu, 1) => target.device.name.clone(),
        (Mode::Gpu, n) => format!("{n} x {}", target.device.name),
    };
    let shard = request
        .shard
        .map(|s| format!(" shard {s}"))
        .unwrap_or_default();
    let retired = match outcome.retired.len() {
        0 => String::new(),
        n => format!(", {} retired", count(n as u64, "lane", "lanes")),
    };
    say!(
        "{}{shard} [{lanes}{retired}]: {} run ({} ok, {} failed, {} pruned, {} checked){}, {} already done, {}",
        exp.name,
        count(run, "job", "jobs"),
        outcome.ok,
        outcome.failed,
        outcome.pruned,
        outcome.checked,
        [
            (
                outcome.skipped_by_search,
                "left unmeasured by the surrogate search"
            ),
            (outcome.unavailable, "skipped: their method cannot run here"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!(", {n} {what}"))
        .collect::<String>(),
        outcome.skipped,
        seconds(outcome.wall_s)
    );
    if outcome.interrupted {
        eprintln!(
            "interrupted: {} recorded; run the same command to resume",
            count(run + outcome.skipped_by_search, "job", "jobs")
        );
    }
    say!("results: {}", outcome.dir.display());
    for p in written {
        say!("  {}", p.display());
    }
    Ok(if outcome.interrupted {
        exit::INTERRUPTED
    } else if outcome.failed > 0 {
        exit::JOBS_FAILED
    } else {
        exit::OK
    })
}

/// The compile pool's size (`compile_workers`; 0: the cores the lanes
/// leave). A lane's worker keeps one core busy launching and timing, and a
/// compile competing for it would show in its timings. Models running at
/// once share the cores by lanes.
pub(super) fn compile_workers(settings: &Settings, target: &Target) -> usize {
    match settings.compile_workers {
        0 => {
            let cores = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
            let lanes = target.gpus.len();
            let share = cores * lanes / target.host_lanes.max(lanes).max(1);
            // At most 64: compiles are per config, not per shape, so a run
            // over many lanes meets the same compiles sooner (a 4-GPU host
            // of 64 cores compiling gpt-oss's ~2000 kernels with 16 workers
            // would be compile-bound), and a compile worker imports only
            // Triton (about 150 MB).
            share.saturating_sub(lanes).clamp(1, 64)
        }
        n => n,
    }
}

/// What a run's results depend on that the runner knows before its worker says hello.
pub(super) fn fingerprint(exp: &Experiment, target: &Target) -> Fingerprint {
    Fingerprint {
        tunelab: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: option_env!("TUNELAB_GIT_COMMIT").map(str::to_string),
        manifest_hash: exp.manifest_hash.clone(),
        gpu: target.device.name.clone(),
        driver: target.device.driver.clone(),
        ..Default::default()
    }
}

/// What went wrong in a run, as the command reports it.
pub(super) fn run_failure(e: RunError) -> Failure {
    match e {
        RunError::Input(d) => Failure::from(d),
        RunError::Store(e) => Failure::environment(format!("error: {e}")),
        RunError::Environment(m) => Failure::environment(format!("error: {m}")),
    }
}

/// `--keep-ir`, or an `ir` output: the winners' (or every job's) kernels
/// compiled once more and written under the results directory. Failing to
/// keep IR never fails the run: what went wrong is said and the outputs follow.
fn keep_ir(
    exp: &Experiment,
    request: &Request<'_>,
    target: &Target,
    dir: &Path,
    python: &str,
) -> Result<(), Failure> {
    use crate::manifest::OutputFormat;
    let output = exp.outputs.iter().find(|o| o.format == OutputFormat::Ir);
    let which = match (request.keep_ir, output) {
        (Some(w), _) => w,
        (None, Some(_)) => crate::workbench::Which::Winners,
        (None, None) => return Ok(()),
    };
    let folder = output.map_or("ir", |o| o.path.as_str());
    let compile_target = match (request.ir_target, target.mode) {
        (Some(t), _) => Some(t.to_string()),
        (None, Mode::Gpu) => {
            crate::schedule::compile_target(&target.device).filter(|_| exp.builtin_problem())
        }
        (None, Mode::Interpreter) => {
            eprintln!(
                "note: IR not kept: the interpreter compiles nothing; pass --ir-target cuda:90:32 (or the GPU you tune for) to compile the winners for it"
            );
            return Ok(());
        }
    };
    let (results, _) =
        store::journal::read(dir).map_err(|e| Failure::environment(format!("error: {e}")))?;
    let spec = crate::backend::WorkerSpec {
        python: python.to_string(),
        python_path: super::environment::worker_python_path(exp, python),
        role: "compile".into(),
        interpret: false,
        visible_device: target.gpus.first().cloned(),
        visible_var: crate::schedule::visible_devices_var(&target.device),
        target: compile_target,
        triton_cache: Some(dir.join(".cache").join("triton")),
        log: dir.join("logs").join("keep-ir.log"),
        background: false,
    };
    let started = std::time::Instant::now();
    let kept = crate::workbench::keep_ir(
        crate::workbench::KeepIr {
            dir,
            folder,
            which,
            spec,
            problem: &exp.problem,
            ir_files: exp.ir_files(),
            timeout: std::time::Duration::from_secs_f64(exp.protocol.timeout_s.max(120.0)),
        },
        &results,
    );
    match kept {
        Ok(k) => {
            let (one, many) = match which {
                crate::workbench::Which::Winners => ("winner", "winners"),
                crate::workbench::Which::All => ("job", "jobs"),
            };
            say!(
                "ir: kept the kernels of {} in {} ({} files, {})",
                count(k.jobs as u64, one, many),
                dir.join(folder).display(),
                k.files,
                seconds(started.elapsed().as_secs_f64())
            );
            for (folder, why) in k.failed {
                eprintln!(
                    "warning: IR of {folder} not kept: {}",
                    why.lines().next().unwrap_or("")
                );
            }
        }
        Err(why) => eprintln!("warning: IR not kept: no worker to compile it ({why})"),
    }
    crate::trace::span("runner", "keep ir", started, serde_json::json!({}));
    Ok(())
}

/// The `aot` outputs: the winners' images and a C dispatcher per folder
/// (`crate::workbench::aot`). Failing to export never fails the run: what
/// went wrong is said and the other outputs follow.
fn export_aot(exp: &Experiment, target: &Target, dir: &Path, python: &str) -> Result<(), Failure> {
    use crate::manifest::OutputFormat;
    if !exp.outputs.iter().any(|o| o.format == OutputFormat::Aot) {
        return Ok(());
    }
    if target.mode == Mode::Interpreter {
        eprintln!(
            "note: aot not written: the interpreter's winners were not timed on a GPU, and native methods did not run"
        );
        return Ok(());
    }
    let started = std::time::Instant::now();
    let (results, _) =
        store::journal::read(dir).map_err(|e| Failure::environment(format!("error: {e}")))?;
    let native = crate::backend::native::NativeCompiler::new(
        &target.device,
        Some(Path::new(python)),
        dir.join(".cache").join("native"),
    );
    let needs_triton = exp.methods.iter().any(|m| {
        m.kind == crate::manifest::MethodKind::Triton
            && !m.grid.is_empty()
            && !m.triton_args.is_empty()
    });
    let mut images = if needs_triton {
        let spec = crate::backend::WorkerSpec {
            python: python.to_string(),
            python_path: super::environment::worker_python_path(exp, python),
            role: "compile".into(),
            interpret: false,
            visible_device: target.gpus.first().cloned(),
            visible_var: crate::schedule::visible_devices_var(&target.device),
            target: crate::schedule::compile_target(&target.device)
                .filter(|_| exp.builtin_problem()),
            triton_cache: Some(dir.join(".cache").join("triton")),
            log: dir.join("logs").join("aot.log"),
            background: false,
        };
        let timeout = std::time::Duration::from_secs_f64(exp.protocol.timeout_s.max(120.0));
        let worker = crate::backend::PythonBackend::new(spec, &exp.problem, timeout)
            .with_ir_files(exp.ir_files());
        Some(crate::workbench::aot::WorkerImages::new(
            worker,
            dir.join(".cache").join("aot"),
        ))
    } else {
        None
    };
    let exported = crate::workbench::aot::export(
        exp,
        &results,
        dir,
        Some(&native),
        images
            .as_mut()
            .map(|i| i as &mut dyn crate::workbench::aot::TritonImages),
    );
    if let Some(i) = &mut images {
        i.shutdown();
    }
    for (folder, lib) in &exported.folders {
        say!(
            "aot: {} in {} ({})",
            count(lib.specs.len() as u64, "specialisation", "specialisations"),
            folder.display(),
            seconds(started.elapsed().as_secs_f64())
        );
    }
    for l in &exported.left_out {
        eprintln!("note: aot left out {l}");
    }
    for f in &exported.failed {
        eprintln!("warning: aot not written: {f}");
    }
    crate::trace::span("runner", "aot export", started, serde_json::json!({}));
    Ok(())
}

/// A wall time as people read it: `0.4 s`, `12.5 s`, `3 min 05 s`.
pub(super) fn seconds(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.1} s")
    } else {
        let total = s.round() as u64;
        format!("{} min {:02} s", total / 60, total % 60)
    }
}

/// Adds a method for each `--compare-to` file: the configs of a consumer's
/// tuned file, one per shape as the consumer looks them up, run in the same
/// kernel and call as the tuned method that writes that format.
fn with_compared(mut exp: Experiment, files: &[std::path::PathBuf]) -> Result<Experiment, Failure> {
    for file in files {
        let bad = |why: String| {
            Failure::bad_input(format!("error: --compare-to {}: {why}", file.display()))
        };
        let shipped = crate::emit::shipped::read(file).map_err(bad)?;
        let writer = exp
            .outputs
            .iter()
            .find(|o| o.format == shipped.format)
            .ok_or_else(|| {
                bad(format!(
                    "this experiment writes no {} output, so no method of it runs such configs",
                    shipped.format.name()
                ))
            })?;
        let against = match &writer.method {
            Some(m) => exp.method(m).cloned(),
            None => exp
                .methods
                .iter()
                .find(|m| m.kind == crate::manifest::MethodKind::Triton)
                .cloned(),
        }
        .ok_or_else(|| bad("no method of this experiment writes that format".into()))?;
        let name = format!("shipped {}", shipped.short_name());
        if exp.method(&name).is_some() {
            return Err(bad(format!("two files would both be method `{name}`")));
        }
        let mut identity = blake3::Hasher::new();
        identity.update(against.identity.as_bytes());
        identity.update(&std::fs::read(file).map_err(|e| bad(e.to_string()))?);
        exp.compared.push(crate::manifest::Compared {
            method: name.clone(),
            file: file.display().to_string(),
            format: shipped.format,
            against: against.name.clone(),
        });
        exp.methods.push(crate::manifest::Method {
            name,
            identity: identity.finalize().to_hex()[..16].to_string(),
            params: Default::default(),
            axes: Vec::new(),
            constraints: Vec::new(),
            derived: Vec::new(),
            baseline: None,
            search: None,
            key_spans: Default::default(),
            param_spans: Default::default(),
            fixed: Some(shipped.fixed_configs()),
            ..against
        });
    }
    Ok(exp)
}
