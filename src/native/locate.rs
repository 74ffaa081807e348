//! Where the runtime compiler's library is: an explicit path
//! (`TUNELAB_NVRTC`, `TUNELAB_HIPRTC`), the pip wheel in the workers' Python
//! environment (torch installs NVRTC there: `nvidia/cu13/lib/libnvrtc.so.13`,
//! `nvidia/cuda_nvrtc/lib/libnvrtc.so.12`), the CUDA toolkit or ROCm, then
//! whatever name the system's linker resolves.

use std::path::{Path, PathBuf};

use super::rtc::Flavor;

/// The places looked at, in order, for `flavor`'s library; `python` is the
/// workers' interpreter (its environment's wheels come first).
pub fn candidates(flavor: Flavor, python: Option<&Path>) -> Vec<PathBuf> {
    let (env_var, stem) = match flavor {
        Flavor::Nvrtc => ("TUNELAB_NVRTC", "libnvrtc.so"),
        Flavor::Hiprtc => ("TUNELAB_HIPRTC", "libhiprtc.so"),
    };
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        out.push(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if flavor == Flavor::Nvrtc {
        for site in python.map(site_packages).unwrap_or_default() {
            // cu13 wheels: nvidia/cu13/lib; cu12 and older: nvidia/cuda_nvrtc/lib.
            let versioned = |name: &str| {
                name.strip_prefix("cu")
                    .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
            };
            dirs.extend(
                sorted_dirs(&site.join("nvidia"), versioned)
                    .into_iter()
                    .map(|d| d.join("lib")),
            );
            dirs.push(site.join("nvidia").join("cuda_nvrtc").join("lib"));
        }
        for var in ["CUDA_HOME", "CUDA_PATH"] {
            if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                dirs.push(PathBuf::from(&root).join("lib64"));
                dirs.push(PathBuf::from(&root).join("lib"));
            }
        }
        dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
        dirs.extend(
            sorted_dirs(Path::new("/usr/local"), |n| n.starts_with("cuda-"))
                .into_iter()
                .map(|d| d.join("lib64")),
        );
    } else {
        for var in ["ROCM_PATH", "HIP_PATH"] {
            if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                dirs.push(PathBuf::from(&root).join("lib"));
            }
        }
        dirs.push(PathBuf::from("/opt/rocm/lib"));
        dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    }
    for dir in dirs {
        for found in versions_in(&dir, stem) {
            if !out.contains(&found) {
                out.push(found);
            }
        }
    }
    // Last, names the dynamic linker resolves by itself (ld.so.cache, LD_LIBRARY_PATH).
    for suffix in ["", ".13", ".12", ".11.2", ".7", ".6"] {
        out.push(PathBuf::from(format!("{stem}{suffix}")));
    }
    out
}

/// `dir`'s children whose names pass `keep`, newest name first.
fn sorted_dirs(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(&keep))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(version_key(p)));
    found
}

/// Files in `dir` named `stem` or `stem.N...`, the highest version first.
fn versions_in(dir: &Path, stem: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n == stem
                    || n.strip_prefix(stem)
                        .and_then(|r| r.strip_prefix('.'))
                        .is_some_and(|v| {
                            !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.')
                        })
            })
        })
        .map(|e| e.path())
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(version_key(p)));
    found
}

/// The numbers in a file or folder name, for "newest first" ordering.
fn version_key(p: &Path) -> Vec<u64> {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The site-packages folders of the environment `python` belongs to: from
/// its path (`<prefix>/bin/python3` -> `<prefix>/lib/python3.*/site-packages`),
/// never running it. A venv's `bin/python` is a link to the base
/// interpreter; the link's own place names the environment.
pub fn site_packages(python: &Path) -> Vec<PathBuf> {
    let python = if python.components().count() == 1 {
        // A bare name: where PATH finds it.
        match find_on_path(python) {
            Some(p) => p,
            None => return Vec::new(),
        }
    } else {
        python.to_path_buf()
    };
    let Some(prefix) = python.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        for dir in sorted_dirs(&prefix.join(lib), |n| n.starts_with("python3")) {
            for sub in ["site-packages", "dist-packages"] {
                if dir.join(sub).is_dir() {
                    out.push(dir.join(sub));
                }
            }
        }
    }
    out
}

fn find_on_path(name: &Path) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Opens the first candidate that loads; the error lists what was tried.
pub fn open(flavor: Flavor, python: Option<&Path>) -> Result<super::rtc::Rtc, String> {
    let mut tried = Vec::new();
    for candidate in candidates(flavor, python) {
        let is_path = candidate.components().count() > 1;
        if is_path && !candidate.exists() {
            continue;
        }
        // An absolute path: the compiler's description is part of every image's cache key.
        let candidate = if is_path {
            std::path::absolute(&candidate).unwrap_or(candidate)
        } else {
            candidate
        };
        match super::rtc::Rtc::open(flavor, &candidate) {
            Ok(rtc) => return Ok(rtc),
            Err(e) if is_path => tried.push(e),
            Err(_) => tried.push(format!("{} (not found by the linker)", candidate.display())),
        }
    }
    let hint = match flavor {
        Flavor::Nvrtc => "install the NVRTC wheel into the workers' Python (`pip install nvidia-cuda-nvrtc-cu12`), install the CUDA toolkit, or set TUNELAB_NVRTC=/path/to/libnvrtc.so",
        Flavor::Hiprtc => "install ROCm's hiprtc (libhiprtc.so), or set TUNELAB_HIPRTC=/path/to/libhiprtc.so",
    };
    Err(format!(
        "no {} library found (tried: {}); {hint}",
        flavor.name(),
        tried.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_venv_python_names_its_own_site_packages_and_wheels_come_first() {
        let root = tempfile::tempdir().unwrap();
        let site = root.path().join("venv/lib/python3.12/site-packages");
        let cu13 = site.join("nvidia/cu13/lib");
        let cu12 = site.join("nvidia/cuda_nvrtc/lib");
        std::fs::create_dir_all(&cu13).unwrap();
        std::fs::create_dir_all(&cu12).unwrap();
        std::fs::create_dir_all(root.path().join("venv/bin")).unwrap();
        for f in [
            cu13.join("libnvrtc.so.13"),
            cu13.join("libnvrtc-builtins.so.13.2"),
            cu12.join("libnvrtc.so.12"),
            cu12.join("libnvrtc.so.11.2"),
        ] {
            std::fs::write(f, b"").unwrap();
        }
        let python = root.path().join("venv/bin/python3");
        assert_eq!(site_packages(&python), vec![site.clone()]);
        let found = candidates(Flavor::Nvrtc, Some(&python));
        let files: Vec<&PathBuf> = found
            .iter()
            .filter(|p| p.starts_with(root.path()))
            .collect();
        assert_eq!(
            files,
            [
                &cu13.join("libnvrtc.so.13"),
                &cu12.join("libnvrtc.so.12"),
                &cu12.join("libnvrtc.so.11.2")
            ],
            "the builtins library is not NVRTC; newer versions first"
        );
        // Then the toolkit, then the linker's names.
        assert!(found.last().unwrap().components().count() == 1);
    }
}
