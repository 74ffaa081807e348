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

/// `tunelab native-worker` (CUDA) with `env` set, its stdin and stdout piped.
fn native_worker(env: &[(&str, &str)]) -> std::process::Child {
    use std::process::{Command, Stdio};
    Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .args(["native-worker", "--backend", "cuda"])
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the native worker starts")
}

/// Drives `tunelab native-worker` over its pipes as a lane does. Without a
/// GPU it still answers every request (a `problem_error` saying why), so
/// the transport is tested on any machine.
fn native_worker_session(env: &[(&str, &str)], input: &[&[u8]]) -> Vec<serde_json::Value> {
    use std::io::{BufRead, BufReader, Write};
    let mut child = native_worker(env);
    let mut stdin = child.stdin.take().unwrap();
    for part in input {
        stdin.write_all(part).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    drop(stdin);
    let replies: Vec<serde_json::Value> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| {
            let l = l.unwrap();
            assert!(
                l.starts_with('{') && l.ends_with('}'),
                "one JSON object a line: {l}"
            );
            serde_json::from_str(&l).unwrap()
        })
        .collect();
    assert!(child.wait().unwrap().success());
    replies
}

#[test]
fn the_native_worker_answers_each_request_with_its_time_last() {
    let before = tunelab::trace::monotonic_ns();
    let replies = native_worker_session(
        &[],
        &[
            b"{\"id\":1,\"op\":\"release\"}\n\n",
            b"not json\n",
            b"{\"id\":3,\"op\":\"shutdown\"}\n",
        ],
    );
    assert_eq!(replies.len(), 3, "{replies:?}");
    let ids: Vec<&serde_json::Value> = replies.iter().map(|r| &r["id"]).collect();
    assert_eq!(
        ids,
        [
            &serde_json::json!(1),
            &serde_json::Value::Null,
            &serde_json::json!(3)
        ]
    );
    assert_eq!(replies[1]["class"], "bad_request");
    assert_eq!(replies[2]["ok"], true);
    for r in &replies {
        let obj = r.as_object().unwrap();
        assert_eq!(
            obj.keys().next_back().map(String::as_str),
            Some("worker_us"),
            "{r}"
        );
        assert!(r["worker_us"].as_f64().is_some_and(|us| us >= 0.0), "{r}");
    }
    // When it read each request, on the clock this process reads too: inside
    // the session and in order. (Not "30 ms apart" as the writes are: on a
    // loaded machine a read comes late, and the next one sooner after it.)
    let after = tunelab::trace::monotonic_ns();
    let read_at: Vec<u64> = replies
        .iter()
        .map(|r| r["at_ns"].as_u64().unwrap_or_else(|| panic!("{r}")))
        .collect();
    assert!(
        read_at.iter().all(|t| (before..after).contains(t)),
        "{read_at:?} not in {before}..{after}"
    );
    assert!(read_at.windows(2).all(|p| p[0] < p[1]), "{read_at:?}");
    // How long it waited since its last answer, from its second on: a part
    // of the time between its reads (the rest is its own work and the
    // answer's trip), however late a loaded machine woke it.
    assert!(replies[0].get("idle_us").is_none(), "{:?}", replies[0]);
    for (k, r) in replies.iter().enumerate().skip(1) {
        let idle = r["idle_us"].as_f64().unwrap_or_else(|| panic!("{r}"));
        let between_reads_us = (read_at[k] - read_at[k - 1]) as f64 / 1e3;
        let before_us = replies[k - 1]["worker_us"].as_f64().unwrap_or(0.0);
        assert!(
            idle > 0.0 && idle <= between_reads_us,
            "{r}: {between_reads_us} us between reads"
        );
        assert!(
            idle + before_us <= between_reads_us + 1.0,
            "{r}: {between_reads_us} us between reads"
        );
    }
}

#[test]
fn a_request_split_across_writes_is_one_request_spinning_or_not() {
    for spin in ["20000", "0"] {
        let replies = native_worker_session(
            &[("TUNELAB_SPIN_US", spin)],
            &[
                b"{\"id\":1,",
                b"\"op\":\"release\"}\n{\"id\":2,\"op\"",
                b":\"shutdown\"}\n",
            ],
        );
        let ids: Vec<u64> = replies.iter().filter_map(|r| r["id"].as_u64()).collect();
        assert_eq!(ids, [1, 2], "TUNELAB_SPIN_US={spin}: {replies:?}");
    }
}

#[test]
fn the_native_worker_says_how_it_met_each_request() {
    use std::io::{BufRead, BufReader, Write};
    for (spin, waited) in [("5000000", "spinning"), ("0", "asleep")] {
        let mut child = native_worker(&[("TUNELAB_SPIN_US", spin)]);
        let mut stdin = child.stdin.take().unwrap();
        let mut replies = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut met = |stdin: &mut std::process::ChildStdin, requests: &[u8], answers: usize| {
            stdin.write_all(requests).unwrap();
            stdin.flush().unwrap();
            (0..answers)
                .map(|_| {
                    let reply: serde_json::Value =
                        serde_json::from_str(&replies.next().unwrap().unwrap()).unwrap();
                    reply["met"].as_str().unwrap().to_string()
                })
                .collect::<Vec<_>>()
        };
        // Once it has answered, it waits for the next request: spinning (or,
        // on a crowded host, asleep), or asleep. A request in the pipe when
        // it looks, the second of one write, is met ready.
        met(&mut stdin, b"{\"id\":1,\"op\":\"release\"}\n", 1);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let two = met(
            &mut stdin,
            b"{\"id\":2,\"op\":\"release\"}\n{\"id\":3,\"op\":\"release\"}\n",
            2,
        );
        assert!(two[0] == waited || two[0] == "asleep", "{two:?}");
        assert_eq!(two[1], "ready", "{two:?}");
        drop(stdin);
        assert!(child.wait().unwrap().success());
    }
}
