//! `tunelab run`: pick the devices, run the experiment and its companions,
//! write their outputs, say what happened.

use std::path::Path;

use super::args::ManifestArgs;
use super::inspect::load_experiment;
use super::results::write_outputs;
use super::Failure;
use crate::config::Settings;
use crate::device::{self, DeviceInfo};
use crate::exit;
use crate::manifest::Experiment;
use crate::plan::{self, Filter, Mode, PlanOptions, RunMode};
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
}

/// Runs, and writes the timeline to `trace` if asked, even when the run
/// failed or was interrupted: that is when a timeline helps most.
pub(super) fn run_traced(request: &Request, trace: Option<&Path>) -> Result<i32, Failure> {
    if trace.is_some() {
        crate::trace::enable();
    }
    let result = run(request);
    if let Some(path) = trace {
        match crate::trace::write(path) {
            Ok(n) => eprintln!("trace: {} ({n} spans)", path.display()),
            Err(e) => eprintln!("warning: cannot write trace {}: {e}", path.display()),
        }
    }
    result
}

/// Where a run executes: the GPUs of the first GPU's model, or the interpreter.
struct Target {
    device: DeviceInfo,
    mode: Mode,
    /// CUDA_VISIBLE_DEVICES values, one lane each.
    gpus: Vec<String>,
}

fn target(settings: &Settings) -> Target {
    let discovery = device::discover();
    let gpu = (!settings.interpret)
        .then(|| discovery.devices.first().cloned())
        .flatten();
    match gpu {
        Some(d) => {
            // One lane per GPU of the same model as the first. Discovery
            // numbers the devices CUDA lets us see; a lane's
            // CUDA_VISIBLE_DEVICES must name the same device in the parent's terms.
            let visible: Vec<String> = match std::env::var("CUDA_VISIBLE_DEVICES") {
                Ok(v) if !v.trim().is_empty() => {
                    v.split(',').map(|s| s.trim().to_string()).collect()
                }
                _ => (0..discovery.devices.len())
                    .map(|i| i.to_string())
                    .collect(),
            };
            let gpus = discovery
                .devices
                .iter()
                .zip(visible)
                .filter(|(x, _)| x.name == d.name)
                .map(|(_, id)| id)
                .collect();
            Target {
                device: d,
                mode: Mode::Gpu,
                gpus,
            }
        }
        None => {
            let why = if settings.interpret {
                "interpreter mode requested".to_string()
            } else {
                format!("no GPU found ({})", discovery.notes.join("; "))
            };
            eprintln!("tunelab: {why}: running Triton's interpreter on the CPU. Timings are interpreted wall-clock, not GPU timings, and the manifest's `interpreter:` shapes are used.");
            Target {
                device: device::profile("cpu").expect("cpu profile"),
                mode: Mode::Interpreter,
                gpus: Vec::new(),
            }
        }
    }
}

fn run(request: &Request) -> Result<i32, Failure> {
    let target = target(request.settings);
    let exp = load_experiment(request.manifest, request.args, &target.device)?;
    let mut code = run_experiment(&exp, request, &target, request.use_best)?;
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
        eprintln!("tunelab: companion {shown}");
        let next = run_experiment(&companion_exp, request, &target, None)?;
        code = code.max(next);
    }
    Ok(code)
}

/// Run one experiment on the chosen devices, then write its outputs.
fn run_experiment(
    exp: &Experiment,
    request: &Request,
    target: &Target,
    use_best: Option<&Path>,
) -> Result<i32, Failure> {
    let settings = request.settings;
    if target.mode == Mode::Interpreter && exp.interpreter.is_none() {
        eprintln!("warning: {} has no `interpreter:` section; running its full shape set in the interpreter will be slow", exp.manifest_path.display());
    }
    let filter = Filter::parse(request.args.only.as_deref().unwrap_or(""))?;
    // A package that is in neither place makes the first worker fail to
    // start, which says so and points at `tunelab doctor`.
    let python_path = super::environment::worker_package(&settings.python).python_path();
    let only_jobs = match use_best {
        None => None,
        Some(dir) => {
            let (results, _) = store::journal::read(dir)
                .map_err(|e| Failure::bad_input(format!("error: --use-best: {e}")))?;
            Some(crate::emit::best_job_ids(&results))
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
        gpu: target.device.name.clone(),
        driver: target.device.driver.clone(),
        ..Default::default()
    };
    let opts = RunOptions {
        exp,
        device: target.device.clone(),
        gpus: target.gpus.clone(),
        mode: target.mode,
        run_mode: request.run_mode,
        filter,
        python: settings.python.clone(),
        python_path,
        results_dir: settings.results_dir.clone(),
        compile_workers,
        only_jobs,
        progress: request.progress,
    };
    let outcome = schedule::run(opts, fingerprint).map_err(|e| match e {
        RunError::Input(d) => Failure::from(d),
        RunError::Store(e) => Failure::environment(format!("error: {e}")),
        RunError::Environment(m) => Failure::environment(format!("error: {m}")),
    })?;
    for notice in &outcome.notices {
        eprintln!("warning: {notice}");
    }
    for change in &outcome.fingerprint_changes {
        eprintln!("note: environment changed since the journal's last run: {change}");
    }
    let outputs_started = std::time::Instant::now();
    let written = write_outputs(&outcome.dir)?;
    crate::trace::span(
        "runner",
        "write outputs",
        outputs_started,
        serde_json::json!({}),
    );
    println!(
        "{} [{}]: {} jobs run ({} ok, {} failed, {} pruned, {} checked){}, {} already done, {:.1} s",
        exp.name,
        match target.mode {
            Mode::Interpreter => "interpreter",
            Mode::Gpu => target.device.name.as_str(),
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
