//! `tunelab ir-pass` and `tunelab profile`: the kernel workbench's commands
//! (docs/workbench.md). Both are Python at heart (Triton's pass bindings,
//! Proton): the runner checks the input, writes what the Python side needs,
//! runs `python -m tunelab.workbench.<module>` with the worker's package on
//! its path, and maps its exit status to tunelab's codes.

use std::path::Path;
use std::process::Command;

use super::args::ManifestArgs;
use super::Failure;
use crate::config::Settings;
use crate::exit;
use crate::plan::Filter;
use crate::store;
use crate::workbench::profile;

pub(super) struct IrPassArgs<'a> {
    pub file: &'a Path,
    pub passes: &'a [String],
    pub list: bool,
    pub target: Option<&'a str>,
    pub options: &'a [String],
    pub out: Option<&'a Path>,
    pub compile: bool,
}

pub(super) fn ir_pass(settings: &Settings, a: &IrPassArgs<'_>) -> Result<i32, Failure> {
    if !a.file.is_file() {
        return Err(Failure::bad_input(format!(
            "error: no IR file {}\n  = help: `tunelab run --keep-ir` keeps the winners' IR under the results directory's ir/",
            a.file.display()
        )));
    }
    if let Some(why) = a.out.and_then(store::results_dir::runner_file) {
        return Err(Failure::bad_input(format!("error: --out: {why}")));
    }
    let ext = a.file.extension().and_then(|e| e.to_str()).unwrap_or("");
    if !matches!(ext, "ttir" | "ttgir") {
        return Err(Failure::bad_input(format!(
            "error: {}: passes run on MLIR modules, a .ttir or .ttgir file, not .{ext}",
            a.file.display()
        )));
    }
    if !a.list && a.passes.is_empty() {
        return Err(Failure::bad_input(
            "error: name at least one --pass\n  = help: `--list` prints the pipeline Triton runs on this file's stage",
        ));
    }
    let mut cmd = python_module(settings, "tunelab.workbench.passes", &[])?;
    cmd.arg(a.file);
    for p in a.passes {
        cmd.args(["--pass", p]);
    }
    if a.list {
        cmd.arg("--list");
    }
    if let Some(t) = a.target {
        cmd.args(["--target", t]);
    }
    for o in a.options {
        cmd.args(["--option", o]);
    }
    if let Some(out) = a.out {
        cmd.arg("--out").arg(out);
    }
    if a.compile {
        cmd.arg("--compile");
    }
    run_child(cmd, &settings.python)
}

pub(super) struct ProfileArgs<'a> {
    pub dir: &'a Path,
    pub top: usize,
    pub calls: u32,
    pub only: Option<&'a str>,
    pub manifest: Option<&'a Path>,
    pub ncu: bool,
}

pub(super) fn profile(settings: &Settings, a: &ProfileArgs<'_>) -> Result<i32, Failure> {
    if !store::journal::exists(a.dir) {
        return Err(Failure::bad_input(format!(
            "error: no journal in {}\n  = help: pass a results directory such as results/gptoss/NVIDIA_H100_80GB_HBM3",
            a.dir.display()
        )));
    }
    let (results, warnings) =
        store::journal::read(a.dir).map_err(|e| Failure::environment(format!("error: {e}")))?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    if let Some(h) = results
        .header
        .as_ref()
        .filter(|h| h.mode == crate::plan::Mode::Interpreter)
    {
        return Err(Failure::bad_input(format!(
            "error: {} holds interpreter results ({}): there is nothing on a GPU to profile
  = help: profile the results of a GPU run",
            a.dir.display(),
            h.experiment
        )));
    }
    let (ir_files, extra_path) = match a.manifest {
        Some(m) => {
            let device = super::inspect::planning_device(settings)?;
            let exp = super::inspect::load_experiment(m, &ManifestArgs::default(), &device)?;
            let path = super::environment::worker_python_path(&exp, &settings.python);
            (exp.ir_files(), path)
        }
        None => {
            for shared in profile::shared_kernels(&results) {
                eprintln!(
                    "note: methods {shared} run one kernel: if one runs from an IR file (`ir:`), \
                     pass --manifest so it is profiled from its IR"
                );
            }
            Default::default()
        }
    };
    let filter = Filter::parse(a.only.unwrap_or(""))?;
    let mut request = profile::choose(&results, a.top, a.calls.max(1), &ir_files)
        .ok_or_else(|| Failure::bad_input("error: the journal has no run header"))?;
    request.jobs.retain(|j| {
        let shape: crate::manifest::Shape = serde_json::from_value(j.job["shape"].clone())
            .expect("a shape serialised from the journal");
        let method = j.job["method"]["name"].as_str().unwrap_or("");
        filter.keeps_shape(&shape) && filter.keeps_method(method)
    });
    if request.jobs.is_empty() {
        return Err(Failure::bad_input(format!(
            "error: nothing to profile in {}: no timed job{}",
            a.dir.display(),
            if a.only.is_some() {
                " matches --only"
            } else {
                ""
            }
        )));
    }
    // Nothing is written through a link inside the results directory: the
    // folder and the request are made here without following one, and what
    // the profiler (Python, Triton) then writes by name must not be one.
    let link_error =
        |e: store::results_dir::WriteError| Failure::environment(format!("error: {e}"));
    let out =
        store::results_dir::create_dirs(a.dir, Path::new(profile::FOLDER)).map_err(link_error)?;
    for name in profile::WRITTEN {
        store::results_dir::refuse_link(&out.join(name)).map_err(link_error)?;
    }
    for name in [".cache", ".cache/triton"] {
        store::results_dir::refuse_link(&a.dir.join(name)).map_err(link_error)?;
    }
    let text = serde_json::to_string_pretty(&request).expect("request serialises") + "\n";
    let request_path =
        store::results_dir::write_file(&out, Path::new("request.json"), text.as_bytes())
            .map_err(link_error)?;
    eprintln!(
        "tunelab: profiling {} on {}",
        crate::emit::num::count(request.jobs.len() as u64, "job", "jobs"),
        request.device
    );
    let mut cmd = python_module(settings, "tunelab.profiler", &extra_path)?;
    cmd.arg(&request_path).arg("--out").arg(&out);
    if !a.ncu {
        cmd.arg("--no-ncu");
    }
    // The run's cache: the winners' binaries are there already.
    cmd.env("TRITON_CACHE_DIR", a.dir.join(".cache").join("triton"));
    let code = run_child(cmd, &settings.python)?;
    let summary = out.join(profile::SUMMARY);
    if summary.is_file() {
        // The report links the summary once it exists.
        super::results::write_outputs(a.dir)?;
        say!("profile: {}", summary.display());
    }
    Ok(code)
}

/// `python -m MODULE` with tunelab's package (and `extra` folders) first on
/// PYTHONPATH, outside the interpreter.
fn python_module(
    settings: &Settings,
    module: &str,
    extra: &[std::path::PathBuf],
) -> Result<Command, Failure> {
    // As the runner starts its workers: a checkout's python/ first, nothing
    // when tunelab is installed in this Python.
    let package = super::environment::worker_package(&settings.python);
    let mut parts: Vec<std::path::PathBuf> = package.dir().cloned().into_iter().collect();
    parts.extend(extra.iter().cloned());
    if let Some(existing) = std::env::var_os("PYTHONPATH") {
        parts.extend(std::env::split_paths(&existing));
    }
    let path = std::env::join_paths(parts).map_err(|e| Failure::environment(e.to_string()))?;
    let mut cmd = Command::new(&settings.python);
    cmd.args(["-m", module])
        .env("PYTHONPATH", path)
        .env_remove("TRITON_INTERPRET");
    Ok(cmd)
}

/// Runs the child with this process's streams; its status becomes ours:
/// 0 ok, 3 some jobs failed, 4 unusable environment, anything else bad input
/// (the child said why on stderr).
fn run_child(mut cmd: Command, python: &str) -> Result<i32, Failure> {
    let status = cmd.status().map_err(|e| {
        Failure::environment(format!(
            "error: cannot run `{python}`: {e}\n  = help: point tunelab at a Python with triton: --python PATH or TUNELAB_PYTHON"
        ))
    })?;
    Ok(match status.code() {
        Some(0) => exit::OK,
        Some(3) => exit::JOBS_FAILED,
        Some(4) => exit::ENVIRONMENT,
        _ => exit::BAD_INPUT,
    })
}
