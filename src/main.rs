//! tunelab's entry point: parse arguments, run the stage functions, map errors to exit codes.

use std::ops::ControlFlow;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

use tunelab::cli::{Cli, Command, GlobalArgs, ManifestArgs};
use tunelab::config::{self, FlagSettings, Settings};
use tunelab::device::{self, DeviceInfo};
use tunelab::diag::Diagnostic;
use tunelab::exit;
use tunelab::manifest::{self, Experiment};
use tunelab::plan::{self, Filter, Mode, PlanOptions, PlanSummary};

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
        Failure { code: exit::BAD_INPUT, message: d.to_string() }
    }
}

fn run(cli: Cli) -> Result<i32, Failure> {
    let settings = load_settings(&cli.global)?;
    match cli.command {
        Command::Validate { manifests, manifest: args } => validate(&manifests, &args, &settings),
        Command::Plan { manifest, manifest_args, json, jobs, interpret } => {
            plan_command(&manifest, &manifest_args, &settings, json, jobs, interpret)
        }
        Command::Schema => {
            print!("{}", manifest::json_schema());
            Ok(exit::OK)
        }
        Command::Config => {
            let layered = config::load(cli.global.config.as_ref(), &flags(&cli.global)).map_err(settings_error)?;
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

fn settings_error(e: figment::Error) -> Failure {
    Failure { code: exit::BAD_INPUT, message: format!("error: invalid settings: {e}\n  = help: check tunelab.toml and TUNELAB_* variables") }
}

fn load_settings(global: &GlobalArgs) -> Result<Settings, Failure> {
    Ok(config::load(global.config.as_ref(), &flags(global)).map_err(settings_error)?.settings)
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

fn load_experiment(path: &Path, args: &ManifestArgs, device: &DeviceInfo) -> Result<Experiment, Failure> {
    Ok(manifest::load(path, &args.set, device)?)
}

fn validate(paths: &[std::path::PathBuf], args: &ManifestArgs, settings: &Settings) -> Result<i32, Failure> {
    let device = planning_device(settings)?;
    let filter = Filter::parse(args.only.as_deref().unwrap_or(""))?;
    let mut failed = 0;
    for path in paths {
        // Validation includes planning: a constraint set that rejects everything is an input error.
        let result = load_experiment(path, args, &device).and_then(|exp| {
            let opts = PlanOptions { device: &device, filter: &filter, mode: Mode::Gpu };
            let summary = plan::plan(&exp, &opts, &mut |_| ControlFlow::Continue(()))?;
            Ok(summary)
        });
        match result {
            Ok(summary) => println!("ok  {}  ({} shapes, {} jobs)", path.display(), summary.shapes, summary.jobs),
            Err(f) => {
                failed += 1;
                eprint!("{}", f.message);
            }
        }
    }
    Ok(if failed > 0 { exit::BAD_INPUT } else { exit::OK })
}

fn plan_command(path: &Path, args: &ManifestArgs, settings: &Settings, json: bool, jobs: bool, interpret: bool) -> Result<i32, Failure> {
    let device = if interpret { device::profile("cpu").expect("cpu profile") } else { planning_device(settings)? };
    let exp = load_experiment(path, args, &device)?;
    let filter = Filter::parse(args.only.as_deref().unwrap_or(""))?;
    let mode = if interpret { Mode::Interpreter } else { Mode::Gpu };
    let opts = PlanOptions { device: &device, filter: &filter, mode };
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
        println!("{}", serde_json::to_string_pretty(&summary).expect("summary serialises"));
    } else {
        print!("{}", render_summary(&summary, &device));
    }
    Ok(exit::OK)
}

fn render_summary(s: &PlanSummary, device: &DeviceInfo) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "experiment {}  ·  device {} ({})  ·  search {}", s.experiment, device.name, device.source, s.strategy);
    for m in &s.methods {
        let _ = writeln!(out, "\nmethod {}: {} shapes x {} points = {} points", m.method, m.shapes, m.space_points, m.points);
        for (constraint, removed) in &m.removed {
            let _ = writeln!(out, "  - {removed:>10}  removed by `{constraint}`");
        }
        let _ = writeln!(out, "  = {:>10}  valid", m.valid);
        let _ = writeln!(out, "  jobs: {} ({} baseline)", m.jobs, m.baseline_jobs);
    }
    let _ = writeln!(out, "\ntotal: {} jobs over {} shapes", s.jobs, s.shapes);
    out
}
