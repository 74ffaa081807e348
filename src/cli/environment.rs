//! `tunelab devices`, `doctor` and `config`: what tunelab finds on this
//! machine, and where the worker's Python package is.

use std::path::PathBuf;

use super::args::GlobalArgs;
use super::Failure;
use crate::config::{self, Settings};
use crate::device;
use crate::exit;

/// Where `python/tunelab` lives: next to the working directory, next to the
/// binary (target/release/tunelab in a checkout), or where it was built.
pub(super) fn python_package_dir() -> Option<PathBuf> {
    let mut candidates = vec![PathBuf::from("python")];
    if let Ok(exe) = std::env::current_exe() {
        for up in exe.ancestors().skip(1).take(4) {
            candidates.push(up.join("python"));
        }
    }
    candidates.push(PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/python"
    )));
    candidates
        .into_iter()
        .find(|c| c.join("tunelab").join("worker.py").is_file())
        .map(|c| c.canonicalize().unwrap_or(c))
}

/// The folders workers import from: tunelab's own package (in a checkout)
/// and the manifest's `python_path:`.
pub(super) fn worker_python_path(
    exp: &crate::manifest::Experiment,
) -> Result<Vec<PathBuf>, Failure> {
    let package = python_package_dir().ok_or_else(|| {
        Failure::environment(
            "error: cannot find tunelab's Python package (python/tunelab)\n  = help: run tunelab from the repository root",
        )
    })?;
    Ok(std::iter::once(package)
        .chain(exp.python_path.iter().cloned())
        .collect())
}

pub(super) fn config(global: &GlobalArgs) -> Result<i32, Failure> {
    let layered = config::load(global.config.as_ref(), &super::flags(global))
        .map_err(super::settings_error)?;
    for (key, value, origin) in layered.explain() {
        println!("{key:<16} = {value:<24} # {origin}");
    }
    Ok(exit::OK)
}

pub(super) fn devices(json: bool) -> Result<i32, Failure> {
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

pub(super) fn doctor(settings: &Settings) -> Result<i32, Failure> {
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
