//! `tunelab validate` and `tunelab plan`: everything about a manifest that
//! needs no GPU and runs nothing.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use std::time::Duration;

use super::args::ManifestArgs;
use super::Failure;
use crate::backend::{PythonBackend, WorkerSpec};
use crate::config::Settings;
use crate::device::DeviceInfo;
use crate::emit::num::count;
use crate::exit;
use crate::manifest::{self, Experiment};
use crate::plan::target::PlanTarget;
use crate::plan::{self, Filter, Mode, PlanOptions, PlanSummary};

/// The device facts `validate` plans for, without touching a GPU: the
/// settings' device profile.
pub(super) fn planning_device(settings: &Settings) -> Result<DeviceInfo, Failure> {
    plan::target::named(&settings.device_profile).map_err(Failure::bad_input)
}

pub(super) fn load_experiment(
    path: &Path,
    args: &ManifestArgs,
    device: &DeviceInfo,
) -> Result<Experiment, Failure> {
    let mut allowed = args.allow_read.clone();
    if let Some((file, dirs)) = &args.allowed_by_file {
        // A repository's own tunelab.toml is the repository's word, not
        // that of the person running tunelab in it: it may not let its
        // manifests read outside it.
        let file = file.canonicalize().unwrap_or_else(|_| file.clone());
        let home = manifest::repository_of(path);
        if file.starts_with(&home) {
            eprintln!(
                "warning: `allow_read` in {} is not used for {}: a settings file inside a manifest's repository cannot let it read outside it; pass --allow-read DIR (or TUNELAB_ALLOW_READ)",
                file.display(),
                path.display()
            );
        } else {
            allowed.extend(dirs.iter().cloned());
        }
    }
    Ok(manifest::load_allowing(path, &args.set, &allowed, device)?)
}

pub(super) fn validate(
    paths: &[PathBuf],
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
            Ok((exp, summary))
        });
        let result = result.and_then(|(exp, summary)| {
            let note = probe_user_problem(&exp, settings)?;
            Ok((summary, note))
        });
        match result {
            Ok((summary, note)) => {
                say!(
                    "ok  {}  ({}, {})",
                    path.display(),
                    count(summary.shapes, "shape", "shapes"),
                    count(summary.jobs, "job", "jobs")
                );
                if let Some(note) = note {
                    eprintln!("note: {note}");
                }
            }
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

/// How `plan` prints: the summary as text or JSON, or every job.
pub(super) struct PlanOutput {
    pub json: bool,
    pub jobs: bool,
}

/// What `plan` was asked to plan for.
pub(super) struct PlanFor {
    /// `--interpret`, or the `interpret` setting.
    pub interpret: bool,
    /// A device profile was named (`--device`, a variable, a settings file).
    pub device_chosen: bool,
}

/// What `plan` plans for: `plan::target`'s rule, with the profile the
/// settings name when one was chosen.
fn plan_target(settings: &Settings, asked: &PlanFor) -> Result<PlanTarget, Failure> {
    let profile = asked
        .device_chosen
        .then_some(settings.device_profile.as_str());
    plan::target::for_plan(profile, asked.interpret).map_err(Failure::bad_input)
}

pub(super) fn plan(
    path: &Path,
    args: &ManifestArgs,
    settings: &Settings,
    output: PlanOutput,
    asked: PlanFor,
    shard: Option<crate::plan::Shard>,
) -> Result<i32, Failure> {
    let PlanOutput { json, jobs } = output;
    let PlanTarget { device, mode, note } = plan_target(settings, &asked)?;
    let exp = load_experiment(path, args, &device)?;
    let filter = Filter::parse(args.only.as_deref().unwrap_or(""))?;
    let opts = PlanOptions {
        device: &device,
        filter: &filter,
        mode,
    };
    // First, before any of the plan: what it is for, when that is not what
    // `run` would run here (on stderr, so `--json` and `--jobs` stay data).
    if let Some(note) = &note {
        eprintln!("{note}");
    }
    let share = match shard {
        Some(shard) => Some(plan::shard::select(&exp, &opts, shard)?),
        None => None,
    };
    let in_share = |method: &str, shape_index: usize| {
        share
            .as_ref()
            .map_or(true, |s| s.contains(&(method.to_string(), shape_index)))
    };
    let keep: Option<plan::GroupFilter<'_>> = share.as_ref().map(|_| &in_share as _);
    if jobs {
        use std::io::Write;
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        let mut failed = None;
        plan::plan_groups(&exp, &opts, keep, &mut |job| {
            let line = serde_json::to_string(&job).expect("job serialises");
            match writeln!(out, "{line}") {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    failed = Some(e);
                    ControlFlow::Break(())
                }
            }
        })?;
        // A closed pipe (`| head`) ends the stream quietly; a full disk does not.
        match failed.map_or_else(|| out.flush(), Err) {
            Ok(()) => return Ok(exit::OK),
            Err(e) => return Err(super::stdout_failed(e)),
        }
    }
    let summary = plan::plan_groups(&exp, &opts, keep, &mut |_| ControlFlow::Continue(()))?;
    if let (Some(shard), false) = (shard, json) {
        say!(
            "shard {shard}: {} of the plan's (shape, method) groups",
            share.as_ref().map_or(0, |s| s.len())
        );
    }
    if json {
        say!(
            "{}",
            serde_json::to_string_pretty(&summary).expect("summary serialises")
        );
    } else {
        say_raw!("{}", render_summary(&summary, &device));
    }
    Ok(exit::OK)
}

/// For a user's problem, `validate` asks a worker to import and construct
/// it and look up its methods (the builtin problems ship with tunelab). A
/// worker that cannot start costs only the check: a note says so.
fn probe_user_problem(exp: &Experiment, settings: &Settings) -> Result<Option<String>, Failure> {
    if exp.builtin_problem() {
        return Ok(None);
    }
    let python_path = super::environment::worker_python_path(exp, &settings.python);
    let log = std::env::temp_dir().join(format!("tunelab-validate-{}.log", std::process::id()));
    let spec = WorkerSpec {
        python: settings.python.clone(),
        python_path,
        role: "lane".into(),
        // Import and construct only: no GPU is touched.
        interpret: true,
        visible_device: Some(String::new()),
        visible_var: "CUDA_VISIBLE_DEVICES",
        target: None,
        triton_cache: None,
        log: log.clone(),
        background: false,
    };
    let mut worker = PythonBackend::new(spec, &exp.problem, Duration::from_secs(120));
    let result = match worker.hello() {
        Err(f) => Ok(Some(format!(
            "{}: problem `{}` not imported: no worker Python ({})",
            exp.manifest_path.display(),
            exp.problem,
            f.message.lines().next().unwrap_or("")
        ))),
        Ok(_) => crate::schedule::preflight::check_problem(
            exp,
            &mut worker,
            &exp.shapes[0],
            &settings.python,
        )
        .map(|_| None)
        .map_err(Failure::from),
    };
    worker.shutdown();
    let _ = std::fs::remove_file(&log);
    result
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
            "\nmethod {}: {} x {} = {}",
            m.method,
            count(m.shapes, "shape", "shapes"),
            count(m.space_points, "point", "points"),
            count(m.points, "point", "points")
        );
        if let Some(search) = &m.search {
            let _ = writeln!(out, "  search: {search}");
        }
        for (constraint, removed) in &m.removed {
            let _ = writeln!(out, "  - {removed:>10}  removed by `{constraint}`");
        }
        let _ = writeln!(out, "  = {:>10}  valid", m.valid);
        let _ = writeln!(out, "  jobs: {} ({} baseline)", m.jobs, m.baseline_jobs);
    }
    let _ = writeln!(
        out,
        "\ntotal: {} over {}",
        count(s.jobs, "job", "jobs"),
        count(s.shapes, "shape", "shapes")
    );
    out
}
