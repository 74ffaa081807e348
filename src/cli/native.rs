//! `tunelab native-compile`: one CUDA (or HIP) source compiled by the runtime
//! compiler a run would use, for this machine's GPU or a named architecture.
//! A tool for checking a kernel by hand and for GPU tests that run without
//! cargo (bench/native_gpu_check.sh); runs use the compile pool instead.

use std::path::Path;

use super::Failure;
use crate::backend::native::NativeCompiler;
use crate::config::Settings;
use crate::exit;

pub fn native_compile(
    source: &Path,
    kernel: &str,
    out: &Path,
    arch: Option<&str>,
    settings: &Settings,
) -> Result<i32, Failure> {
    let text = std::fs::read_to_string(source)
        .map_err(|e| Failure::bad_input(format!("error: cannot read {}: {e}", source.display())))?;
    let mut device = match arch {
        Some(_) => crate::device::profile("h100").expect("a builtin profile"),
        None => crate::device::discover()
            .devices
            .into_iter()
            .next()
            .ok_or_else(|| Failure::environment("error: no GPU found to compile for\n  = help: name one: --arch sm_90 (or gfx942)"))?,
    };
    if let Some(a) = arch {
        device.arch = a.to_string();
        device.backend = if a.starts_with("gfx") { "hip" } else { "cuda" }.into();
    }
    let compiler = NativeCompiler::new(
        &device,
        Some(Path::new(&settings.python)),
        out.to_path_buf(),
    );
    compiler
        .rtc()
        .map_err(|e| Failure::environment(format!("error: {e}")))?;
    let name = source
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "kernel.cu".into());
    match compiler.compile_source(&name, &text, kernel) {
        Ok(a) => {
            let mut json = serde_json::to_value(&a).expect("artifact serialises");
            json["seconds"] = serde_json::json!(a.seconds);
            println!("{json}");
            Ok(exit::OK)
        }
        Err(f) => Err(Failure {
            code: exit::BAD_INPUT,
            message: format!("error: {}: {}", f.class.as_str(), f.message),
        }),
    }
}
