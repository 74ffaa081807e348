//! `tunelab native-compile`: one CUDA (or HIP) source compiled by the runtime
//! compiler a run would use, for this machine's GPU or a named architecture.
//! A tool for checking a kernel by hand and for GPU tests that run without
//! cargo (bench/native_gpu_check.sh); runs use the compile pool instead.

use std::path::{Path, PathBuf};

use super::Failure;
use crate::backend::native::NativeCompiler;
use crate::config::Settings;
use crate::exit;

/// What `native-compile` compiles.
pub enum Compile {
    /// One source file, for one kernel (with its template arguments).
    Source { source: PathBuf, kernel: String },
    /// tunelab's own helper kernels, as runs compile them.
    Helpers,
}

pub fn native_compile(
    what: Compile,
    out: &Path,
    arch: Option<&str>,
    settings: &Settings,
) -> Result<i32, Failure> {
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
    let compiled = match &what {
        Compile::Helpers => compiler.compile_helpers(),
        Compile::Source { source, kernel } => {
            let text = std::fs::read_to_string(source).map_err(|e| {
                Failure::bad_input(format!("error: cannot read {}: {e}", source.display()))
            })?;
            let name = source
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| "kernel.cu".into());
            compiler.compile_source(&name, &text, kernel)
        }
    };
    match compiled {
        Ok(a) => {
            let mut json = serde_json::to_value(&a).expect("artifact serialises");
            json["seconds"] = serde_json::json!(a.seconds);
            say!("{json}");
            Ok(exit::OK)
        }
        Err(f) => Err(Failure {
            code: exit::BAD_INPUT,
            message: format!("error: {}: {}", f.class.as_str(), f.message),
        }),
    }
}
