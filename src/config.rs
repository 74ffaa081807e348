//! Settings, layered with figment: built-in defaults < `tunelab.toml` <
//! `TUNELAB_*` environment variables < command-line flags.
//!
//! The built-in default of `python` is found, not fixed: see [`default_python`].

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    /// Python interpreter that runs workers (needs torch and triton).
    pub python: String,
    /// Where results directories are written.
    pub results_dir: PathBuf,
    /// Device profile used to plan when no GPU is queried (plan, validate).
    pub device_profile: String,
    /// CPU compile workers; 0 = the cores the lanes leave, 1 to 64.
    pub compile_workers: usize,
    /// How the compile workers are scheduled beside the lanes.
    pub compile_priority: CompilePriority,
    /// Force interpreter mode even when a GPU is present.
    pub interpret: bool,
    /// Folders outside a manifest's repository that manifests may read
    /// files from (`--allow-read` adds more).
    pub allow_read: Vec<PathBuf>,
    /// Times a later run tries again a job that crashed or timed out.
    pub retries: u32,
    /// How far apart separate runs of one config come out, as a fraction:
    /// `tunelab compare`'s verdicts of two runs are against at least this
    /// margin (docs/ab.md, "Separate runs").
    pub run_spread: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            python: default_python().python,
            results_dir: PathBuf::from("results"),
            device_profile: "h100".into(),
            compile_workers: 0,
            compile_priority: CompilePriority::Idle,
            interpret: false,
            allow_read: Vec::new(),
            retries: 1,
            run_spread: crate::measure::paired::DEFAULT_RUN_SPREAD,
        }
    }
}

/// How the compile workers are scheduled (`compile_priority`).
///
/// With `idle` (the default) they run under Linux's `SCHED_IDLE` policy: they
/// take whatever CPU the lanes leave, and a lane's worker or the runner, when
/// it wakes, takes a CPU from them at once. At `normal` priority, with as many
/// compile workers as free cores, a native worker woken for its next job waited
/// for a core: up to 4 ms, and 0.47-0.68 ms a job over a run, of GPU idle with
/// a compiled job ready (H100, 2026-11-24,
/// results/bench/NVIDIA_H100_80GB_HBM3/compile-priority/README.md).
/// Only the Python compile workers: the NVRTC threads that compile CUDA C++
/// methods run at the runner's priority. `normal` leaves them at the runner's
/// priority too, for a host where other work keeps the CPUs busy: there
/// idle-class compiles get little CPU and could run past `protocol.timeout_s`,
/// and be recorded as timeouts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CompilePriority {
    Idle,
    Normal,
}

/// The Python of the environment tunelab is installed in: set by the
/// extension module (`tunelab._native`) to `sys.executable` when the Python
/// package loads it, so the `tunelab` entry point and the Python API know it.
/// The standalone binary never sets it.
static INSTALLED_PYTHON: OnceLock<String> = OnceLock::new();

/// Records the interpreter tunelab is installed in; the first call wins.
pub fn set_installed_python(python: impl Into<String>) {
    let _ = INSTALLED_PYTHON.set(python.into());
}

/// The interpreter tunelab is installed in, when it runs inside one.
pub fn installed_python() -> Option<&'static str> {
    INSTALLED_PYTHON.get().map(String::as_str)
}

/// The default Python and where it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct DefaultPython {
    pub python: String,
    /// Said by `tunelab config`: "default: ...".
    pub origin: String,
}

/// The Python workers run in when neither `--python`, `TUNELAB_PYTHON` nor a
/// settings file names one, first found of:
/// 1. the interpreter of the environment tunelab is installed in (`pip
///    install .` and the `tunelab` entry point, or `import tunelab`);
/// 2. `.venv/bin/python` in the working directory, then in the checkout the
///    binary was built in (`target/release/tunelab` of a checkout with `just
///    setup`'s `.venv`);
/// 3. `python3` on PATH.
pub fn default_python() -> DefaultPython {
    if let Some(python) = installed_python() {
        return DefaultPython {
            python: python.to_string(),
            origin: "default: the Python tunelab is installed in".into(),
        };
    }
    let cwd = std::env::current_dir().ok();
    for dir in cwd.into_iter().chain(checkout_root()) {
        let venv = dir.join(".venv").join("bin").join("python");
        if venv.is_file() {
            // Absolute, but symlinks kept: a venv's python is a symlink whose
            // target is the base interpreter, without the venv's packages.
            let shown = std::path::absolute(&venv).unwrap_or(venv);
            return DefaultPython {
                python: shown.display().to_string(),
                origin: format!("default: the .venv in {}", dir.display()),
            };
        }
    }
    DefaultPython {
        python: "python3".into(),
        origin: "default: python3 on PATH".into(),
    }
}

/// The tunelab checkout the running binary was built in: the nearest
/// ancestor of the executable (`target/release/tunelab`) that holds
/// `python/tunelab/worker.py`.
pub fn checkout_root() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(4)
        .find(|dir| is_checkout(dir))
        .map(Path::to_path_buf)
}

/// Whether `dir` is a tunelab checkout (holds the worker package's sources).
pub fn is_checkout(dir: &Path) -> bool {
    dir.join("python")
        .join("tunelab")
        .join("worker.py")
        .is_file()
}

/// Values given on the command line; `None` leaves the lower layers in force.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FlagSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub results_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_profile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpret: Option<bool>,
}

pub struct Layered {
    pub figment: Figment,
    pub settings: Settings,
}

pub fn load(
    config_file: Option<&PathBuf>,
    flags: &FlagSettings,
) -> Result<Layered, Box<figment::Error>> {
    let file = config_file
        .cloned()
        .unwrap_or_else(|| PathBuf::from("tunelab.toml"));
    let figment = Figment::from(Serialized::defaults(Settings::default()))
        .merge(Toml::file(file))
        .merge(Env::prefixed("TUNELAB_"))
        .merge(Serialized::globals(flags));
    let settings = figment.extract().map_err(Box::new)?;
    Ok(Layered { figment, settings })
}

impl Layered {
    /// Whether `key` was set by a settings file, a variable or a flag rather
    /// than left at its built-in default.
    pub fn chosen(&self, key: &str) -> bool {
        match self.figment.find_metadata(key) {
            None => false,
            Some(meta) => {
                let name = meta.name.to_string();
                name.ends_with("FlagSettings") || !name.ends_with("Settings")
            }
        }
    }

    /// The settings file a setting's value came from, if it came from one.
    pub fn file_of(&self, key: &str) -> Option<PathBuf> {
        match self.figment.find_metadata(key)?.source.as_ref()? {
            figment::Source::File(path) => Some(path.clone()),
            _ => None,
        }
    }

    /// Each setting with its value and the layer it came from.
    pub fn explain(&self) -> Vec<(String, String, String)> {
        let value = serde_json::to_value(&self.settings).expect("settings serialise");
        let map = value.as_object().expect("settings are a struct");
        map.iter()
            .map(|(key, v)| {
                let default = || {
                    if key == "python" {
                        default_python().origin
                    } else {
                        "built-in default".to_string()
                    }
                };
                let origin = match self.figment.find_metadata(key) {
                    None => default(),
                    Some(meta) => {
                        let name = meta.name.to_string();
                        if name.ends_with("FlagSettings") {
                            "command-line flag".to_string()
                        } else if name.ends_with("Settings") {
                            default()
                        } else if name.contains("environment") {
                            format!("environment variable TUNELAB_{}", key.to_uppercase())
                        } else {
                            match &meta.source {
                                Some(figment::Source::File(path)) => format!("{}", path.display()),
                                Some(source) => format!("{} ({source})", meta.name),
                                None => meta.name.to_string(),
                            }
                        }
                    }
                };
                let shown = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (key.clone(), shown, origin)
            })
            .collect()
    }
}
