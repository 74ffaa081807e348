//! tunelab's entry point: parse arguments, run the stage functions, map errors to exit codes.

use std::ops::ControlFlow;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

use tunelab::cli::{Cli, Command, GlobalArgs, ManifestArgs, ModeArg};
use tunelab::config::{self, FlagSettings, Settings};
use tunelab::device::{self, DeviceInfo};
use tunelab::diag::Diagnostic;
use tunelab::exit;
use tunelab::manifest::{self, Experiment};
use tunelab::plan::{self, Filter, Mode, PlanOptions, PlanSummary};
use tunelab::schedule::{self, RunError, RunMode, RunOptions};
use tunelab::store::{self, Fingerprint};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(failure) => {
            eprint!("{}", failure.message);
            if !failure.message.ends_with('\n') {
                eprintln!();
            }
            failure.code
        }
    };
    ExitCode::from(code as u8)
}

/// An error on its way out, with the exit code it maps to.
struct Failure {
    code: i32,
    message: String,
}

impl From<Diagnostic> for Failure {
    fn from(d: Diagnostic) -> Self {
        Failure {
            code: exit::BAD_INPUT,
            message: d.to_string(),
        }
    }
}

fn run(cli: Cli) -> Result<i32, Failure> {
    let settings = load_settings(&cli.global)?;
    match cli.command {
        Command::Validate {
            manifests,
            manifest: args,
        } => validate(&manifests, &args, &settings),
        Command::Plan {
            manifest,
            manifest_args,
            json,
            jobs,
            interpret,
        } => plan_command(&manifest, &manifest_args, &settings, json, jobs, interpret),
        Command::Run {
            manifest,
            manifest_args,
            mode,
            use_best,
            interpret,
            compile_workers,
            quiet,
            trace,
        } => {
            let mut settings = settings;
            if interpret {
                settings.interpret = true;
            }
            if let Some(n) = compile_workers {
                settings.compile_workers = n;
            }
            let run_mode = match mode {
                ModeArg::Tune => RunMode::Tune,
                ModeArg::Bench => RunMode::Bench,
                ModeArg::Check => RunMode::Check,
            };
            if trace.is_some() {
                tunelab::trace::enable();
            }
            let result = run_command(
                &manifest,
                &manifest_args,
                &settings,
                run_mode,
                use_best.as_deref(),
                !quiet,
            );
            if let Some(path) = &trace {
                // Written even when the run failed or was interrupted: that is
                // when a timeline helps most.
                match tunelab::trace::write(path) {
                    Ok(n) => eprintln!("trace: {} ({n} spans)", path.display()),
                    Err(e) => eprintln!("warning: cannot write trace {}: {e}", path.display()),
                }
            }
            result
        }
        Command::Report { results } => report_command(&results),
        Command::Devices { json } => devices_command(json),
        Command::Doctor => doctor_command(&settings),
        Command::Schema => {
            print!("{}", manifest::json_schema());
            Ok(exit::OK)
        }
        Command::Config => {
            let layered = config::load(cli.global.config.as_ref(), &flags(&cli.global))
                .map_err(settings_error)?;
            for (key, value, origin) in layered.explain() {
                println!("{key:<16} = {value:<24} # {origin}");
            }
            Ok(exit::OK)
        }
    }
}

fn flags(global: &GlobalArgs) -> FlagSettings {
    FlagSettings {
        python: global.python.clone(),
        results_dir: global.results_dir.clone(),
        device_profile: global.device.clone(),
        ..Default::default()
    }
}

fn settings_error(e: Box<figment::Error>) -> Failure {
    Failure {
        code: exit::BAD_INPUT,
        message: format!(
            "error: invalid settings: {e}\n  = help: check tunelab.toml and TUNELAB_* variables"
        ),
    }
}

fn load_settings(global: &GlobalArgs) -> Result<Settings, Failure> {
    Ok(config::load(global.config.as_ref(), &flags(global))
        .map_err(settings_error)?
        .settings)
}

/// The device facts used to plan without touching a GPU.
fn planning_device(settings: &Settings) -> Result<DeviceInfo, Failure> {
    device::profile(&settings.device_profile).ok_or_else(|| Failure {
        code: exit::BAD_INPUT,
        message: format!(
            "error: unknown device profile `{}`\n  = help: use one of: {}",
            settings.device_profile,
            device::PROFILE_NAMES.join(", ")
        ),
    })
}

fn load_experiment(
    path: &Path,
    args: &ManifestArgs,
    device: &DeviceInfo,
) -> Result<Experiment, Failure> {
    Ok(manifest::load(path, &args.set, device)?)
}

fn validate(
    paths: &[std::path::PathBuf],
    args: &ManifestArgs,
    settings: &Settings,
) -> Result<i32, Failure> {
    let device = planning_device(settings)?;
    let filter = Filter::parse(args.only.as_deref().unwrap_or(""))?;
    let mut failed = 0;
    for path in paths {
        // Validation includes planning: a constraint set that rejects everything is an input error.
        let result = load_experiment(path, args, &device).and_then(|exp| {
            let opts = PlanOptions {
                device: &device,
                filter: &filter,
                mode: Mode::Gpu,
            };
            let summary = plan::plan(&exp, &opts, &mut |_| ControlFlow::Continue(()))?;
            Ok(summary)
        });
        match result {
            Ok(summary) => println!(
                "ok  {}  ({} shapes, {} jobs)",
                path.display(),
                summary.shapes,
                summary.jobs
            ),
            Err(f) => {
                failed += 1;
                eprint!("{}", f.message);
            }
        }
    }
    Ok(if failed > 0 {
        exit::BAD_INPUT
    } else {
        exit::OK
    })
}

fn plan_command(
    path: &Path,
    args: &ManifestArgs,
    settings: &Settings,
    json: bool,
    jobs: bool,
    interpret: bool,
) -> Result<i32, Failure> {
    let device = if interpret {
        device::profile("cpu").expect("cpu profile")
    } else {
        planning_device(settings)?
    };
    let exp = load_experiment(path, args, &device)?;
    let filter = Filter::parse(args.only.as_deref().unwrap_or(""))?;
    let mode = if interpret {
        Mode::Interpreter
    } else {
        Mode::Gpu
    };
    let opts = PlanOptions {
        device: &device,
        filter: &filter,
        mode,
    };
    if jobs {
        use std::io::Write;
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        plan::plan(&exp, &opts, &mut |job| {
            let line = serde_json::to_string(&job).expect("job serialises");
            // A closed pipe (`| head`) ends the stream quietly.
            match writeln!(out, "{line}") {
                Ok(()) => ControlFlow::Continue(()),
                Err(_) => ControlFlow::Break(()),
            }
        })?;
        let _ = out.flush();
        return Ok(exit::OK);
    }
    let summary = plan::plan(&exp, &opts, &mut |_| ControlFlow::Continue(()))?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).expect("summary serialises")
        );
    } else {
        print!("{}", render_summary(&summary, &device));
    }
    Ok(exit::OK)
}

fn render_summary(s: &PlanSummary, device: &DeviceInfo) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "experiment {}  ·  device {} ({})  ·  search {}",
        s.experiment, device.name, device.source, s.strategy
    );
    for m in &s.methods {
        let _ = writeln!(
            out,
            "\nmethod {}: {} shapes x {} points = {} points",
            m.method, m.shapes, m.space_points, m.points
        );
        for (constraint, removed) in &m.removed {
            let _ = writeln!(out, "  - {removed:>10}  removed by `{constraint}`");
        }
        let _ = writeln!(out, "  = {:>10}  valid", m.valid);
        let _ = writeln!(out, "  jobs: {} ({} baseline)", m.jobs, m.baseline_jobs);
    }
    let _ = writeln!(out, "\ntotal: {} jobs over {} shapes", s.jobs, s.shapes);
    out
}

/// Where `python/tunelab` lives: next to the working directory, next to the
/// binary (target/release/tunelab in a checkout), or where it was built.
fn python_package_dir() -> Option<std::path::PathBuf> {
    let mut candidates = vec![std::path::PathBuf::from("python")];
    if let Ok(exe) = std::env::current_exe() {
        for up in exe.ancestors().skip(1).take(4) {
            candidates.push(up.join("python"));
        }
    }
    candidates.push(std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/python"
    )));
    candidates
        .into_iter()
        .find(|c| c.join("tunelab").join("worker.py").is_file())
        .map(|c| c.canonicalize().unwrap_or(c))
}

fn environment_failure(message: String) -> Failure {
    Failure {
        code: exit::ENVIRONMENT,
        message,
    }
}

fn run_command(
    path: &Path,
    args: &ManifestArgs,
    settings: &Settings,
    run_mode: RunMode,
    use_best: Option<&Path>,
    progress: bool,
) -> Result<i32, Failure> {
    let discovery = device::discover();
    let gpu = (!settings.interpret)
        .then(|| discovery.devices.first().cloned())
        .flatten();
    let (device, mode, gpus) = match gpu {
        Some(d) => {
            // One lane per GPU of the same model as the first.
            // Discovery numbers the devices CUDA lets us see; a lane's
            // CUDA_VISIBLE_DEVICES must name the same device in the parent's terms.
            let visible: Vec<String> = match std::env::var("CUDA_VISIBLE_DEVICES") {
                Ok(v) if !v.trim().is_empty() => {
                    v.split(',').map(|s| s.trim().to_string()).collect()
                }
                _ => (0..discovery.devices.len())
                    .map(|i| i.to_string())
                    .collect(),
            };
            let gpus: Vec<String> = discovery
                .devices
                .iter()
                .zip(visible)
                .filter(|(x, _)| x.name == d.name)
                .map(|(_, id)| id)
                .collect();
            (d, Mode::Gpu, gpus)
        }
        None => {
            let why = if settings.interpret {
                "interpreter mode requested".to_string()
            } else {
                format!("no GPU found ({})", discovery.notes.join("; "))
            };
            eprintln!("tunelab: {why}: running Triton's interpreter on the CPU. Timings are interpreted wall-clock, not GPU timings, and the manifest's `interpreter:` shapes are used.");
            (
                device::profile("cpu").expect("cpu profile"),
                Mode::Interpreter,
                Vec::new(),
            )
        }
    };
    let exp = load_experiment(path, args, &device)?;
    let mut code = run_experiment(
        &exp, path, args, settings, &device, mode, &gpus, run_mode, use_best, progress,
    )?;
    for companion in &exp.companions {
        if code == exit::INTERRUPTED {
            break;
        }
        let shown = companion.display();
        if use_best.is_some() {
            eprintln!(
                "note: companion {shown} not run: --use-best names this experiment's results only"
            );
            continue;
        }
        let companion_exp = match load_experiment(companion, args, &device) {
            Ok(e) => e,
            // An override written for the main experiment may not fit a
            // companion; a companion that is broken on its own is an error.
            Err(err) if !args.set.is_empty() => {
                let plain = ManifestArgs {
                    set: Vec::new(),
                    ..args.clone()
                };
                load_experiment(companion, &plain, &device)?;
                eprintln!(
                    "note: companion {shown} not run: a --set override does not apply to it ({})",
                    err.message.lines().next().unwrap_or("")
                );
                continue;
            }
            Err(err) => return Err(err),
        };
        let filter = Filter::parse(args.only.as_deref().unwrap_or(""))?;
        let opts = PlanOptions {
            device: &device,
            filter: &filter,
            mode,
        };
        if !plan::filter_applies(&companion_exp, &opts) {
            eprintln!("note: companion {shown} not run: --only names fields it does not have");
            continue;
        }
        eprintln!("tunelab: companion {shown}");
        let next = run_experiment(
            &companion_exp,
            companion,
            args,
            settings,
            &device,
            mode,
            &gpus,
            run_mode,
            None,
            progress,
        )?;
        code = code.max(next);
    }
    Ok(code)
}

/// Run one experiment on the chosen devices, then write its outputs.
#[allow(clippy::too_many_arguments)]
fn run_experiment(
    exp: &tunelab::manifest::Experiment,
    path: &Path,
    args: &ManifestArgs,
    settings: &Settings,
    device: &DeviceInfo,
    mode: Mode,
    gpus: &[String],
    run_mode: RunMode,
    use_best: Option<&Path>,
    progress: bool,
) -> Result<i32, Failure> {
    let device = device.clone();
    let gpus = gpus.to_vec();
    if mode == Mode::Interpreter && exp.interpreter.is_none() {
        eprintln!("warning: {} has no `interpreter:` section; running its full shape set in the interpreter will be slow", path.display());
    }
    let filter = Filter::parse(args.only.as_deref().unwrap_or(""))?;
    let python_path = python_package_dir()
        .ok_or_else(|| environment_failure("error: cannot find tunelab's Python package (python/tunelab)\n  = help: run tunelab from the repository root".into()))?;
    let only_jobs = match use_best {
        None => None,
        Some(dir) => {
            let (results, _) = store::journal::read(dir).map_err(|e| Failure {
                code: exit::BAD_INPUT,
                message: format!("error: --use-best: {e}"),
            })?;
            Some(tunelab::emit::best_job_ids(&results))
        }
    };
    let compile_workers = match settings.compile_workers {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(16),
        n => n,
    };
    let fingerprint = Fingerprint {
        tunelab: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: option_env!("TUNELAB_GIT_COMMIT").map(str::to_string),
        manifest_hash: exp.manifest_hash.clone(),
        gpu: device.name.clone(),
        driver: device.driver.clone(),
        ..Default::default()
    };
    let opts = RunOptions {
        exp,
        device: device.clone(),
        gpus,
        mode,
        run_mode,
        filter,
        python: settings.python.clone(),
        python_path,
        results_dir: settings.results_dir.clone(),
        compile_workers,
        only_jobs,
        progress,
    };
    let outcome = schedule::run(opts, fingerprint).map_err(|e| match e {
        RunError::Input(d) => Failure::from(d),
        RunError::Store(e) => environment_failure(format!("error: {e}")),
        RunError::Environment(m) => environment_failure(format!("error: {m}")),
    })?;
    for change in &outcome.fingerprint_changes {
        eprintln!("note: environment changed since the journal's last run: {change}");
    }
    let outputs_started = std::time::Instant::now();
    let written = write_outputs(&outcome.dir)?;
    tunelab::trace::span(
        "runner",
        "write outputs",
        outputs_started,
        serde_json::json!({}),
    );
    println!(
        "{} [{}]: {} jobs run ({} ok, {} failed, {} pruned, {} checked){}, {} already done, {:.1} s",
        exp.name,
        if mode == Mode::Interpreter {
            "interpreter"
        } else {
            device.name.as_str()
        },
        outcome.ok + outcome.failed + outcome.pruned + outcome.checked,
        outcome.ok,
        outcome.failed,
        outcome.pruned,
        outcome.checked,
        match outcome.skipped_by_search {
            0 => String::new(),
            n => format!(", {n} left unmeasured by the surrogate search"),
        },
        outcome.skipped,
        outcome.wall_s
    );
    println!("results: {}", outcome.dir.display());
    for p in written {
        println!("  {}", p.display());
    }
    Ok(if outcome.interrupted {
        exit::INTERRUPTED
    } else if outcome.failed > 0 {
        exit::JOBS_FAILED
    } else {
        exit::OK
    })
}

fn write_outputs(dir: &Path) -> Result<Vec<std::path::PathBuf>, Failure> {
    let (results, warnings) =
        store::journal::read(dir).map_err(|e| environment_failure(format!("error: {e}")))?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    tunelab::emit::write_outputs(&results, dir).map_err(|e| Failure {
        code: exit::INTERNAL,
        message: format!("error: writing outputs: {e}"),
    })
}

fn report_command(dir: &Path) -> Result<i32, Failure> {
    if !dir.join(store::JOURNAL).is_file() {
        return Err(Failure {
            code: exit::BAD_INPUT,
            message: format!("error: no journal in {}\n  = help: pass a results directory such as results/quickstart/NVIDIA_H100_80GB_HBM3", dir.display()),
        });
    }
    for p in write_outputs(dir)? {
        println!("{}", p.display());
    }
    Ok(exit::OK)
}

fn devices_command(json: bool) -> Result<i32, Failure> {
    let found = device::discover();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&found.devices).expect("devices serialise")
        );
        return Ok(exit::OK);
    }
    for (i, d) in found.devices.iter().enumerate() {
        println!(
            "{i}: {} ({}, {} SMs, L2 {} MiB, smem/block {} KiB, {:.0} GB/s peak, driver {})",
            d.name,
            d.arch,
            d.sm_count,
            d.l2_bytes >> 20,
            d.smem_bytes >> 10,
            d.peak_gbs,
            d.driver.as_deref().unwrap_or("?")
        );
        println!(
            "   vLLM name {}, memory {} GiB, memory clock {} MHz x {} bit",
            d.vllm_name,
            d.mem_bytes >> 30,
            d.mem_clock_khz / 1000,
            d.bus_width_bits
        );
    }
    if found.devices.is_empty() {
        println!("no GPU found; `tunelab run` will use Triton's interpreter on the CPU");
    }
    for note in &found.notes {
        println!("note: {note}");
    }
    Ok(exit::OK)
}

fn doctor_command(settings: &Settings) -> Result<i32, Failure> {
    let mut problems = 0;
    println!("python      {}", settings.python);
    let probe = "import json, sys\nout = {'python': sys.version.split()[0]}\ntry:\n    import torch; out['torch'] = torch.__version__; out['cuda'] = torch.cuda.is_available(); out['gpu'] = torch.cuda.get_device_name() if out['cuda'] else None\nexcept Exception as e: out['torch_error'] = str(e)\ntry:\n    import triton; out['triton'] = triton.__version__\nexcept Exception as e: out['triton_error'] = str(e)\nprint(json.dumps(out))";
    match std::process::Command::new(&settings.python)
        .args(["-c", probe])
        .output()
    {
        Err(e) => {
            problems += 1;
            println!("  missing: cannot run `{}` ({e})", settings.python);
            println!("  fix: install Python 3.10+ or point tunelab at one: --python PATH, TUNELAB_PYTHON=PATH, or `python = \"PATH\"` in tunelab.toml");
        }
        Ok(out) => {
            let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            println!("  version   {}", facts["python"].as_str().unwrap_or("?"));
            for (pkg, key) in [("torch", "torch_error"), ("triton", "triton_error")] {
                match facts[pkg].as_str() {
                    Some(v) => println!("  {pkg:<9} {v}"),
                    None => {
                        problems += 1;
                        println!(
                            "  {pkg:<9} missing ({})",
                            facts[key].as_str().unwrap_or("not importable")
                        );
                        println!("  fix: {} -m pip install torch triton", settings.python);
                    }
                }
            }
            match facts["gpu"].as_str() {
                Some(gpu) => println!("  mode      GPU ({gpu})"),
                None => println!("  mode      interpreter (torch sees no GPU; kernels run in Triton's interpreter on the CPU)"),
            }
        }
    }
    match python_package_dir() {
        Some(p) => println!("worker      {}", p.join("tunelab").display()),
        None => {
            problems += 1;
            println!("worker      missing: python/tunelab not found; run tunelab from the repository root");
        }
    }
    let found = device::discover();
    for d in &found.devices {
        println!("device      {} ({})", d.name, d.source);
    }
    for n in &found.notes {
        println!("device      {n}");
    }
    if problems == 0 {
        println!("ok");
        Ok(exit::OK)
    } else {
        Ok(exit::ENVIRONMENT)
    }
}
