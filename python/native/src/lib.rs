//! `tunelab._native`: the Rust core of tunelab, for Python.
//!
//! Every function here calls the runner's own code (`tunelab::manifest`,
//! `tunelab::plan`, `tunelab::store`, `tunelab::cli`); nothing is
//! re-implemented. Values cross as JSON: Rust serialises with the types'
//! own serde forms (the forms `tunelab plan --json` prints and the journal
//! holds) and Python's `json` module builds the objects. The friendly
//! signatures and documentation are in `python/tunelab/api.py`; the types
//! Python sees are in `python/tunelab/_native.pyi`.
//!
//! The GIL is released whenever Rust works: loading, planning, reading a
//! journal, and the whole of a run. Python is re-entered only to build
//! results and to call a run's `on_job` callback.

mod run;

use std::ffi::OsString;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyValueError};
use pyo3::prelude::*;
use serde_json::{json, Value as Json};

use tunelab::config::{self, FlagSettings, Settings};
use tunelab::device::{self, DeviceInfo};
use tunelab::diag::{Diagnostic, Diagnostics};
use tunelab::manifest::{self, BaselineValue, Experiment};
use tunelab::plan::{self, Filter, Mode, PlanOptions};
use tunelab::store::{self, SearchRecord, StoreError};

pyo3::create_exception!(
    tunelab,
    ManifestError,
    PyValueError,
    "A manifest (or an --only/--set argument) is wrong. The message is the text `tunelab validate` prints: each error with its file:line:column, the line quoted, and a hint."
);

pyo3::create_exception!(
    tunelab,
    SettingsError,
    PyValueError,
    "tunelab.toml, a TUNELAB_* variable or a device profile name is wrong."
);

/// The layered settings, as the command line loads them.
fn layered(config_file: Option<PathBuf>, flags: &FlagSettings) -> PyResult<config::Layered> {
    config::load(config_file.as_ref(), flags).map_err(|e| {
        SettingsError::new_err(format!(
            "error: invalid settings: {e}\n  = help: check tunelab.toml and TUNELAB_* variables"
        ))
    })
}

fn settings(config_file: Option<PathBuf>, flags: &FlagSettings) -> PyResult<Settings> {
    layered(config_file, flags).map(|l| l.settings)
}

/// The device facts `validate` plans for: the settings' device profile (no
/// GPU is touched).
fn validation_device(settings: &Settings) -> PyResult<DeviceInfo> {
    plan::target::named(&settings.device_profile).map_err(SettingsError::new_err)
}

fn manifest_error(d: Diagnostics) -> PyErr {
    ManifestError::new_err(d.to_string())
}

fn diagnostic_error(d: Diagnostic) -> PyErr {
    ManifestError::new_err(d.to_string())
}

/// A JSON text as Python objects (dicts keep their order).
fn from_json(py: Python<'_>, text: &str) -> PyResult<Py<PyAny>> {
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

fn to_py(py: Python<'_>, value: &Json) -> PyResult<Py<PyAny>> {
    from_json(py, &value.to_string())
}

/// The flags the Python API passes, in the command line's terms.
fn flags(device_profile: Option<String>, results_dir: Option<PathBuf>) -> FlagSettings {
    FlagSettings {
        device_profile,
        results_dir,
        ..Default::default()
    }
}

/// A validated experiment, as plain data.
fn experiment_json(exp: &Experiment) -> Json {
    let methods: Vec<Json> = exp
        .methods
        .iter()
        .map(|m| {
            let space: serde_json::Map<String, Json> = m
                .axes
                .iter()
                .map(|a| (a.name.clone(), Json::Array(a.values.clone())))
                .collect();
            let derived: serde_json::Map<String, Json> = m
                .derived
                .iter()
                .map(|(name, e)| (name.clone(), Json::String(e.source.clone())))
                .collect();
            let baseline = m.baseline.as_ref().map(|b| {
                let values: serde_json::Map<String, Json> = b
                    .values
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            BaselineValue::Literal(value) => value.clone(),
                            BaselineValue::Expr(e) => json!({ "expr": e.source }),
                        };
                        (k.clone(), v)
                    })
                    .collect();
                json!({ "name": b.name, "values": values })
            });
            json!({
                "name": m.name,
                "kind": m.kind,
                "kernel": m.kernel,
                "params": m.params,
                "space": space,
                "constraints": m.constraints.iter().map(|c| c.source.clone()).collect::<Vec<_>>(),
                "derived": derived,
                "baseline": baseline,
            })
        })
        .collect();
    let outputs: Vec<Json> = exp
        .outputs
        .iter()
        .map(|o| json!({ "format": o.format, "path": o.path, "method": o.method }))
        .collect();
    json!({
        "name": exp.name,
        "description": exp.description,
        "problem": exp.problem,
        "manifest_path": exp.manifest_path,
        "manifest_hash": exp.manifest_hash,
        "shapes": exp.shapes,
        "methods": methods,
        "tolerance": exp.tolerance,
        "protocol": exp.protocol,
        "search": SearchRecord::from(&exp.search),
        "outputs": outputs,
        "interpreter": exp.interpreter.as_ref().map(|i| json!({
            "shapes": i.shapes,
            "max_configs": i.max_configs,
            "tolerance": i.tolerance,
        })),
        "companions": exp.companions,
    })
}

/// Reads, merges and validates a manifest: `tunelab validate` without the planning.
#[pyfunction]
#[pyo3(signature = (path, set=Vec::new(), device=None, config=None))]
fn load(
    py: Python<'_>,
    path: PathBuf,
    set: Vec<String>,
    device: Option<String>,
    config: Option<PathBuf>,
) -> PyResult<Py<PyAny>> {
    let settings = settings(config, &flags(device, None))?;
    let device = validation_device(&settings)?;
    let exp = py
        .detach(|| manifest::load(&path, &set, &device))
        .map_err(manifest_error)?;
    to_py(py, &experiment_json(&exp))
}

/// Loads and plans a manifest: the summary `tunelab plan --json` prints, and
/// with `jobs` every job as `tunelab plan --jobs` prints it, under "job_list";
/// planned as the command plans (`plan::target`: what `run` would run here,
/// unless a device profile is named), the `--only` filter applied.
#[pyfunction]
#[pyo3(name = "plan", signature = (path, set=Vec::new(), only=None, device=None, config=None, interpret=false, jobs=false))]
#[allow(clippy::too_many_arguments)]
fn plan_manifest(
    py: Python<'_>,
    path: PathBuf,
    set: Vec<String>,
    only: Option<String>,
    device: Option<String>,
    config: Option<PathBuf>,
    interpret: bool,
    jobs: bool,
) -> PyResult<Py<PyAny>> {
    let layered = layered(config, &flags(device, None))?;
    // As `tunelab plan`: what `run` would run here unless a profile is named.
    let profile = layered
        .chosen("device_profile")
        .then_some(layered.settings.device_profile.as_str());
    let target = plan::target::for_plan(profile, interpret).map_err(SettingsError::new_err)?;
    let text = py.detach(|| -> PyResult<String> {
        let device = &target.device;
        let exp = manifest::load(&path, &set, device).map_err(manifest_error)?;
        let filter = Filter::parse(only.as_deref().unwrap_or("")).map_err(diagnostic_error)?;
        let opts = PlanOptions {
            device,
            filter: &filter,
            mode: target.mode,
        };
        let mut listed: Vec<Json> = Vec::new();
        let summary = plan::plan(&exp, &opts, &mut |job| {
            if jobs {
                listed.push(serde_json::to_value(&job).expect("jobs serialise"));
            }
            ControlFlow::Continue(())
        })
        .map_err(diagnostic_error)?;
        let mut out = serde_json::to_value(&summary).expect("summaries serialise");
        if jobs {
            out["job_list"] = Json::Array(listed);
        }
        Ok(out.to_string())
    })?;
    from_json(py, &text)
}

fn store_error(e: StoreError) -> PyErr {
    match e {
        StoreError::Missing(_) => PyFileNotFoundError::new_err(format!("error: {e}")),
        StoreError::NewerFormat { .. } => PyValueError::new_err(format!("error: {e}")),
        _ => PyOSError::new_err(format!("error: {e}")),
    }
}

/// Reads a results directory's journal (packed, live or both), or one
/// journal file, as `tunelab report` does: the run headers, the latest record
/// of every job, the finalists' re-timings, what was skipped, and the ids of
/// the jobs a later definition of their method superseded (no output ranks
/// them: `tunelab::emit::select::split_superseded`).
#[pyfunction]
fn read_journal(py: Python<'_>, path: PathBuf) -> PyResult<Py<PyAny>> {
    let text = py.detach(|| -> Result<String, StoreError> {
        let (results, warnings) = if path.is_dir() {
            store::journal::read(&path)?
        } else {
            store::journal::read_file(&path)?
        };
        let superseded = tunelab::emit::select::superseded_ids(&results.jobs);
        Ok(json!({
            "runs": results.runs,
            "jobs": results.jobs,
            "finals": results.finals,
            "warnings": warnings,
            "superseded": superseded,
        })
        .to_string())
    });
    from_json(py, &text.map_err(store_error)?)
}

/// BASE against NEW as `tunelab compare` takes them (results directories,
/// journals, or BASE a shipped vLLM JSON that NEW's run timed): the rows with
/// their verdicts, the geometric-mean speedup and the markdown the command
/// prints. A threshold (0.02 for 2 %) also lists the regressions beyond it.
#[pyfunction]
#[pyo3(signature = (base, new, fail_on_slower=None, run_spread=None))]
fn compare(
    py: Python<'_>,
    base: PathBuf,
    new: PathBuf,
    fail_on_slower: Option<f64>,
    run_spread: Option<f64>,
) -> PyResult<Py<PyAny>> {
    let text = py.detach(|| -> Result<String, String> {
        let mut options = tunelab::emit::compare::Options::default();
        if let Some(spread) = run_spread {
            if !(0.0..1.0).contains(&spread) {
                return Err(format!("run_spread must be a fraction in [0, 1), got {spread}"));
            }
            options.spread = spread;
        }
        let (cmp, warnings) = tunelab::emit::compare::from_paths(&base, &new, &options)?;
        let rows: Vec<Json> = cmp
            .rows
            .iter()
            .map(|r| {
                json!({
                    "shape": r.shape,
                    "base_method": r.base_method,
                    "new_method": r.new_method,
                    "base_us": r.base.median_us,
                    "new_us": r.new.median_us,
                    "speedup": r.speedup(),
                    "verdict": r.verdict.as_str(),
                    "base_config": r.base_config,
                    "new_config": r.new_config,
                })
            })
            .collect();
        let regressions: Vec<Json> = fail_on_slower
            .map(|t| {
                cmp.regressions(t)
                    .iter()
                    .map(|r| json!({"shape": r.shape, "method": r.new_method, "speedup": r.speedup()}))
                    .collect()
            })
            .unwrap_or_default();
        Ok(json!({
            "base": cmp.base_name,
            "new": cmp.new_name,
            "rows": rows,
            "geomean_speedup": cmp.geomean_speedup(),
            "notes": cmp.notes,
            "regressions": regressions,
            "markdown": cmp.markdown(fail_on_slower),
            "warnings": warnings,
        })
        .to_string())
    });
    from_json(
        py,
        &text.map_err(|why| PyValueError::new_err(format!("error: {why}")))?,
    )
}

/// The manifest JSON schema (`tunelab schema`).
#[pyfunction]
fn schema() -> String {
    manifest::json_schema()
}

/// The Python that workers run in by default, and where it was found
/// (`tunelab config`'s words).
#[pyfunction]
fn default_python() -> (String, String) {
    let found = config::default_python();
    (found.python, found.origin)
}

/// Runs the command line in this process, as the standalone binary does:
/// same output on the same file descriptors, same exit code (a panic is
/// 101, as a Rust program's). The GIL is released throughout. The caller
/// (the `tunelab` entry point) restores the default SIGINT action first, so
/// Ctrl-C acts as it does on the binary.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> i32 {
    py.detach(|| run::cli_in_process(argv))
}

/// The results directories a run of `path` writes: its own, then its
/// companions'. The device is found as `tunelab run` finds it.
fn results_dirs(
    path: &Path,
    set: &[String],
    settings: &Settings,
    interpret: bool,
) -> Result<Vec<PathBuf>, Diagnostics> {
    let interpret = interpret || settings.interpret;
    let (device, mode) = match (!interpret)
        .then(|| device::discover().devices.into_iter().next())
        .flatten()
    {
        Some(gpu) => (gpu, Mode::Gpu),
        None => (
            device::profile("cpu").expect("cpu profile"),
            Mode::Interpreter,
        ),
    };
    let exp = manifest::load(path, set, &device)?;
    let mut dirs = vec![tunelab::schedule::results_dir(
        &settings.results_dir,
        &exp,
        &device,
        mode,
    )];
    for companion in &exp.companions {
        // One that does not load (a --set meant for the main manifest) is
        // left out by the run too.
        if let Ok(c) = manifest::load(companion, set, &device) {
            dirs.push(tunelab::schedule::results_dir(
                &settings.results_dir,
                &c,
                &device,
                mode,
            ));
        }
    }
    Ok(dirs)
}

/// Starts `tunelab run` (the command line `argv`) in this process and
/// calls `on_job` with every job record the run journals, in this thread,
/// as the run goes. `path`, `set`, `results_dir`, `config` and `interpret`
/// must say what `argv` says: they name the journals to follow. Returns
/// (exit code, records delivered, whether the run was interrupted, the
/// results directories followed).
#[pyfunction]
#[pyo3(signature = (argv, path, set=Vec::new(), results_dir=None, config=None, interpret=false, on_job=None))]
#[allow(clippy::too_many_arguments)]
fn run_cli(
    py: Python<'_>,
    argv: Vec<OsString>,
    path: PathBuf,
    set: Vec<String>,
    results_dir: Option<PathBuf>,
    config: Option<PathBuf>,
    interpret: bool,
    on_job: Option<Py<PyAny>>,
) -> PyResult<(i32, u64, bool, Vec<PathBuf>)> {
    let settings = settings(config, &flags(None, results_dir))?;
    let dirs = py
        .detach(|| results_dirs(&path, &set, &settings, interpret))
        .map_err(manifest_error)?;
    let (code, delivered, interrupted) = run::run_following(py, argv, &dirs, on_job)?;
    Ok((code, delivered, interrupted, dirs))
}

// The place for `compare` (two results side by side, `tunelab compare`): a
// wrapper here like `plan_manifest`, over `tunelab::emit::compare::between`
// on two `store::journal::read`s, its rows as dicts; and a `compare` beside
// `plan` in python/tunelab/api.py. Not written yet: the comparison has no
// serde form of its own to hand over.

#[pymodule]
mod _native {
    use pyo3::prelude::*;

    #[pymodule_export]
    use super::{
        cli_main, compare, default_python, load, plan_manifest, read_journal, run_cli, schema,
        ManifestError, SettingsError,
    };

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        // The interpreter that imports tunelab is the one it is installed
        // in: workers default to it.
        let executable: Option<String> = m.py().import("sys")?.getattr("executable")?.extract()?;
        if let Some(python) = executable.filter(|p| !p.is_empty()) {
            super::config::set_installed_python(python);
        }
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("JOURNAL", super::store::JOURNAL)?;
        Ok(())
    }
}

/// Flushes Rust's stdout, which a process that is not a Rust program does not do at exit.
fn flush_stdout() {
    let _ = std::io::stdout().flush();
}
