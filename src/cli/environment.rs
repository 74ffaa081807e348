//! `tunelab devices`, `doctor` and `config`: what tunelab finds on this
//! machine, and where the worker's Python package is.

use std::path::PathBuf;

use super::args::GlobalArgs;
use super::Failure;
use crate::backend::python::PROTOCOL_VERSION;
use crate::config::{self, Settings};
use crate::device;
use crate::exit;

/// Where the workers import tunelab's Python package (`tunelab.worker`) from.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum WorkerPackage {
    /// `python/` of a tunelab checkout, put first on the workers' PYTHONPATH.
    Checkout(PathBuf),
    /// Installed in the workers' Python (the wheel `pip install .` makes):
    /// the runner adds nothing to PYTHONPATH.
    Installed,
}

impl WorkerPackage {
    /// The directory the runner puts first on the workers' PYTHONPATH, if any.
    pub(super) fn dir(&self) -> Option<&PathBuf> {
        match self {
            WorkerPackage::Checkout(dir) => Some(dir),
            WorkerPackage::Installed => None,
        }
    }
}

/// Where workers started with `python` find tunelab's Python package. When
/// `python` is the interpreter tunelab is installed in, its own installed
/// package, which comes from the same build as the runner. Otherwise
/// `python/` of a checkout: next to the working directory, above the binary
/// (target/release/tunelab), or the one this was built from. With no
/// checkout in sight, the package must be installed in `python`.
pub(super) fn worker_package(python: &str) -> WorkerPackage {
    if config::installed_python() == Some(python) {
        return WorkerPackage::Installed;
    }
    let mut candidates = vec![PathBuf::from(".")];
    candidates.extend(config::checkout_root());
    candidates.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    candidates
        .into_iter()
        .find(|dir| config::is_checkout(dir))
        .map(|dir| {
            let python = dir.join("python");
            WorkerPackage::Checkout(python.canonicalize().unwrap_or(python))
        })
        .unwrap_or(WorkerPackage::Installed)
}

/// The folders workers started with `python` import from: tunelab's own
/// package when it comes from a checkout (none when it is installed in
/// `python`), then the manifest's `python_path:`. A package that is in
/// neither place makes the first worker fail to start, which says so.
pub(super) fn worker_python_path(exp: &crate::manifest::Experiment, python: &str) -> Vec<PathBuf> {
    worker_package(python)
        .dir()
        .cloned()
        .into_iter()
        .chain(exp.python_path.iter().cloned())
        .collect()
}

pub(super) fn config(global: &GlobalArgs) -> Result<i32, Failure> {
    let layered = config::load(global.config.as_ref(), &super::flags(global))
        .map_err(super::settings_error)?;
    for (key, value, origin) in layered.explain() {
        say!("{key:<16} = {value:<24} # {origin}");
    }
    Ok(exit::OK)
}

pub(super) fn devices(json: bool) -> Result<i32, Failure> {
    let found = device::discover();
    if json {
        say!(
            "{}",
            serde_json::to_string_pretty(&found.devices).expect("devices serialise")
        );
        return Ok(exit::OK);
    }
    for (i, d) in found.devices.iter().enumerate() {
        say!(
            "{i}: {} ({}, {} SMs, L2 {} MiB, smem/block {} KiB, {:.0} GB/s peak, driver {})",
            d.name,
            d.arch,
            d.sm_count,
            d.l2_bytes >> 20,
            d.smem_bytes >> 10,
            d.peak_gbs,
            d.driver.as_deref().unwrap_or("?")
        );
        say!(
            "   vLLM name {}, memory {} GiB, memory clock {} MHz x {} bit",
            d.vllm_name,
            d.mem_bytes >> 30,
            d.mem_clock_khz / 1000,
            d.bus_width_bits
        );
    }
    if found.devices.is_empty() {
        say!("no GPU found; `tunelab run` will use Triton's interpreter on the CPU");
    }
    for note in &found.notes {
        say!("note: {note}");
    }
    if let Some(advice) = hip_advice(&found) {
        say!("note: {advice}");
    }
    Ok(exit::OK)
}

pub(super) fn doctor(settings: &Settings) -> Result<i32, Failure> {
    let mut problems = 0;
    // Where kernels would run, once torch has said.
    let mut mode: Option<String> = None;
    say!("python      {}", settings.python);
    let probe = "import json, sys\nout = {'python': sys.version.split()[0]}\ntry:\n    import torch; out['torch'] = torch.__version__; out['cuda'] = torch.cuda.is_available(); out['gpu'] = torch.cuda.get_device_name() if out['cuda'] else None\nexcept Exception as e: out['torch_error'] = str(e)\ntry:\n    import triton; out['triton'] = triton.__version__\nexcept Exception as e: out['triton_error'] = str(e)\ntry:\n    import tunelab.worker; out['worker'] = tunelab.worker.__file__; out['protocol'] = tunelab.PROTOCOL_VERSION\nexcept Exception as e: out['worker_error'] = str(e)\nprint(json.dumps(out))";
    let package = worker_package(&settings.python);
    let mut command = std::process::Command::new(&settings.python);
    command.args(["-c", probe]);
    if let WorkerPackage::Checkout(dir) = &package {
        // As the runner starts its workers.
        let mut path = dir.as_os_str().to_owned();
        if let Some(existing) = std::env::var_os("PYTHONPATH") {
            path.push(":");
            path.push(existing);
        }
        command.env("PYTHONPATH", path);
    }
    match command.output() {
        Err(e) => {
            problems += 1;
            say!("  missing: cannot run `{}` ({e})", settings.python);
            say!("  fix: install Python 3.10+ or point tunelab at one: --python PATH, TUNELAB_PYTHON=PATH, or `python = \"PATH\"` in tunelab.toml");
        }
        Ok(out) => {
            let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            say!("  version   {}", facts["python"].as_str().unwrap_or("?"));
            let mut missing = Vec::new();
            for (pkg, key) in [("torch", "torch_error"), ("triton", "triton_error")] {
                match facts[pkg].as_str() {
                    Some(v) => say!("  {pkg:<9} {v}"),
                    None => {
                        problems += 1;
                        missing.push(pkg);
                        say!(
                            "  {pkg:<9} missing ({})",
                            facts[key].as_str().unwrap_or("not importable")
                        );
                    }
                }
            }
            if !missing.is_empty() {
                say!(
                    "  fix: {} -m pip install {}",
                    settings.python,
                    missing.join(" ")
                );
            }
            match (facts["torch"].as_str(), facts["gpu"].as_str()) {
                (Some(_), Some(gpu)) => {
                    mode = Some(format!("on the GPU ({gpu})"));
                    say!("  mode      GPU ({gpu})");
                }
                (Some(_), None) => {
                    mode = Some("in Triton's interpreter on the CPU (torch sees no GPU)".into());
                    say!("  mode      interpreter (torch sees no GPU; kernels run in Triton's interpreter on the CPU)");
                }
                (None, _) => say!("  mode      not known until torch imports"),
            }
            let from = match &package {
                WorkerPackage::Checkout(dir) => format!("the checkout's {}", dir.display()),
                WorkerPackage::Installed => "installed in this Python".to_string(),
            };
            let speaks = facts["protocol"].as_u64();
            match facts["worker"].as_str() {
                Some(file) if speaks != Some(PROTOCOL_VERSION.into()) => {
                    problems += 1;
                    say!(
                        "worker      {file} ({from}) speaks worker protocol {}, this tunelab {PROTOCOL_VERSION}",
                        speaks.map_or("?".to_string(), |v| v.to_string())
                    );
                    say!("  fix: the package and this binary come from different versions of tunelab: run the binary from the same checkout, or reinstall (`pip install .`)");
                }
                Some(file) => say!("worker      {file} ({from})"),
                None => {
                    problems += 1;
                    say!(
                        "worker      missing: {} cannot import tunelab.worker ({})",
                        settings.python,
                        facts["worker_error"].as_str().unwrap_or("not importable")
                    );
                    say!("  fix: {} -m pip install PATH/TO/tunelab (the checkout), or run tunelab from a checkout", settings.python);
                }
            }
        }
    }
    let found = device::discover();
    for d in &found.devices {
        say!("device      {} ({})", d.name, d.source);
    }
    for n in &found.notes {
        say!("device      {n}");
    }
    if let Some(advice) = hip_advice(&found) {
        say!("  {advice}");
    }
    // The last line, whatever happened above: the verdict.
    match (problems, mode) {
        (0, Some(mode)) => {
            say!("verdict     ready: `tunelab run` runs kernels {mode}");
            Ok(exit::OK)
        }
        (0, None) => {
            say!("verdict     ready");
            Ok(exit::OK)
        }
        (n, _) => {
            say!(
                "verdict     not ready: {} above; fix {} and run `tunelab doctor` again",
                crate::emit::num::count(n as u64, "problem", "problems"),
                if n == 1 { "it" } else { "them" }
            );
            Ok(exit::ENVIRONMENT)
        }
    }
}

/// How this tunelab was installed: the wheel's entry point (`pip install .`)
/// or the standalone binary (`cargo build`). Advice names what the reader
/// can do with what they have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Install {
    Wheel,
    Binary,
}

pub(super) fn install() -> Install {
    if config::installed_python().is_some() {
        Install::Wheel
    } else {
        Install::Binary
    }
}

/// What a user without AMD discovery can do about it, when no GPU was
/// found and this build lacks the `hip` feature: rebuild the standalone
/// binary with it. The wheel has no such build option; it says nothing.
pub(super) fn hip_advice(found: &device::Discovery) -> Option<&'static str> {
    if cfg!(feature = "hip") || !found.devices.is_empty() || install() == Install::Wheel {
        return None;
    }
    Some("for AMD GPUs: build the binary with `cargo build --release --features hip` (HIP headers needed)")
}
