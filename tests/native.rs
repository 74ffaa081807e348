//! Native methods without a GPU: compiling `kind: cuda` sources with NVRTC
//! (which needs no GPU), the compile cache, compile errors.
//!
//! NVRTC is found as a run finds it: beside the packages of the workers'
//! Python (`TUNELAB_TEST_PYTHON`; torch's CUDA wheels install it), then the
//! toolkit. Without `TUNELAB_TEST_PYTHON` these tests say so and pass.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use tunelab::backend::native::NativeCompiler;
use tunelab::device;
use tunelab::manifest::{self, Experiment};
use tunelab::plan::{self, Filter, Job, Mode, PlanOptions};
use tunelab::store::FailureClass;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The workers' Python, or None (the test is then skipped, with a note).
fn test_python() -> Option<PathBuf> {
    match std::env::var_os("TUNELAB_TEST_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("skipped: set TUNELAB_TEST_PYTHON to a Python whose torch installed NVRTC");
            None
        }
    }
}

fn load(path: &Path) -> Experiment {
    manifest::load(path, &[], &device::profile("h100").unwrap()).unwrap_or_else(|d| panic!("{d}"))
}

fn jobs(exp: &Experiment, method: &str, only: &str) -> Vec<Job> {
    let dev = device::profile("h100").unwrap();
    let filter = Filter::parse(only).unwrap();
    let mut out = Vec::new();
    plan::plan(
        exp,
        &PlanOptions {
            device: &dev,
            filter: &filter,
            mode: Mode::Gpu,
        },
        &mut |j| {
            if j.method == method {
                out.push(j);
            }
            ControlFlow::Continue(())
        },
    )
    .unwrap_or_else(|d| panic!("{d}"));
    out
}

fn compiler(python: &Path, cache: &Path) -> NativeCompiler {
    let c = NativeCompiler::new(
        &device::profile("h100").unwrap(),
        Some(python),
        cache.to_path_buf(),
    );
    if let Err(e) = c.rtc() {
        panic!("TUNELAB_TEST_PYTHON is set, so NVRTC must be found: {e}");
    }
    c
}

/// The quickstart's CUDA GEMM compiles for sm_90 at its configs, each config
/// to its own template instance; a second request of a config is the first
/// one's image, compiled once.
#[test]
fn the_quickstart_cuda_gemm_compiles_for_hopper() {
    let Some(python) = test_python() else { return };
    let cache = tempfile::tempdir().unwrap();
    let nvrtc = compiler(&python, cache.path());
    let exp = load(&repo().join("experiments/quickstart.yaml"));
    let method = exp.method("cuda").unwrap();
    let all = jobs(&exp, "cuda", "M=1024");
    assert_eq!(all.len(), 48);
    let picked: Vec<&Job> = [0usize, 17, 47].iter().map(|&i| &all[i]).collect();
    let mut symbols = Vec::new();
    for job in &picked {
        let a = nvrtc
            .compile(method, job)
            .unwrap_or_else(|f| panic!("{}: {}", f.class.as_str(), f.message));
        let image = std::fs::read(&a.image).unwrap();
        assert_eq!(&image[..4], b"\x7fELF", "a cubin is an ELF image");
        let c = &job.config;
        let expr = format!(
            "gemm_mma<{}, {}, {}, {}, {}, {}, 0>",
            c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["WARPS_M"], c["WARPS_N"], c["STAGES"]
        );
        assert_eq!(a.name_expression, expr);
        assert!(a.symbol.starts_with("_Z8gemm_mma"), "{}", a.symbol);
        assert!(a.options.contains(&"-arch=sm_90".to_string()));
        symbols.push(a.symbol);
    }
    symbols.dedup();
    assert_eq!(symbols.len(), 3, "each config is its own instance");
    // Asked again, from another compiler over the same cache: found on disk.
    let again = compiler(&python, cache.path());
    let started = std::time::Instant::now();
    let a = again.compile(method, picked[0]).unwrap();
    assert_eq!(a.seconds, 0.0, "not compiled again");
    assert!(started.elapsed().as_secs_f64() < 0.5);
}

/// A source that does not compile, and a config its templates reject, are
/// compile errors with the compiler's message, naming the file and line.
#[test]
fn compile_errors_carry_the_compilers_message() {
    let Some(python) = test_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("broken.cu"),
        "template <int B>\n__global__ void k(float* x) {\n  x[threadIdx.x] = B +;\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("m.yaml"),
        "experiment: broken\nproblem: gemm\nshapes: {list: [{M: 16, N: 16, K: 16, dtype: bf16}]}\n\
         methods:\n  cuda:\n    kind: cuda\n    kernel: k\n    source: broken.cu\n    template: [B]\n\
         \x20   space: {B: [1]}\n    grid: [1]\n    block: [32]\n    args: [out]\n",
    )
    .unwrap();
    let exp = load(&dir.path().join("m.yaml"));
    let nvrtc = compiler(&python, &dir.path().join("cache"));
    let job = &jobs(&exp, "cuda", "")[0];
    let f = nvrtc.compile(exp.method("cuda").unwrap(), job).unwrap_err();
    assert_eq!(f.class, FailureClass::CompileError);
    assert!(
        f.message.contains("broken.cu(3)") && f.message.contains("error"),
        "{}",
        f.message
    );
    assert!(
        !dir.path().join("cache").exists()
            || std::fs::read_dir(dir.path().join("cache")).unwrap().count() == 0,
        "a failed compile leaves no image"
    );

    // The GEMM's static_assert refuses a BLOCK_K that is not a multiple of 16.
    let exp = load(&repo().join("experiments/quickstart.yaml"));
    let mut job = jobs(&exp, "cuda", "M=1024").remove(0);
    job.config.insert("BLOCK_K".into(), 24.into());
    let f = nvrtc
        .compile(exp.method("cuda").unwrap(), &job)
        .unwrap_err();
    assert_eq!(f.class, FailureClass::CompileError);
    assert!(
        f.message.contains("BLOCK_K is a multiple of the k16 step"),
        "{}",
        f.message
    );
}
