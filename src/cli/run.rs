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
    /// Consumers' tuned files to time beside the tuned method (`--compare-to`).
    pub compare_to: &'a [std::path::PathBuf],
}

/// Runs, and writes the timeline to `trace` if asked, even when the run
/// failed or was interrupted: that is when a timeline helps most.
pub(super) fn run_traced(request: &Request<'_>, trace: Option<&Path>) -> Result<i32, Failure> {
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

fn run(request: &Request<'_>) -> Result<i32, Failure> {
    let target = target(request.settings);
    let exp = load_experiment(request.manifest, request.args, &target.device)?;
    let exp = with_compared(exp, request.compare_to)?;
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
        if !request.compare_to.is_empty() {
            eprintln!("note: --compare-to files are timed in {} only", exp.name);
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
    request: &Request<'_>,
    target: &Target,
    use_best: Option<&Path>,
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
    let run = outcome.ok + outcome.failed + outcome.pruned + outcome.checked;
    println!(
        "{} [{}]: {} run ({} ok, {} failed, {} pruned, {} checked){}, {} already done, {}",
        exp.name,
        match target.mode {
            Mode::Interpreter => "interpreter",
            Mode::Gpu => target.device.name.as_str(),
        },
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

/// A wall time as people read it: `0.4 s`, `12.5 s`, `3 min 05 s`.
fn seconds(s: f64) -> String {
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
