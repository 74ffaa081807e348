//! What one worker call costs beyond the worker's own time: the round trip
//! as a lane sees it (`Worker::call`, the span `--trace` records) minus the
//! `worker_us` the worker reports, which is what `bench/trace_breakdown.py`
//! calls a call's "protocol". A measurement, not a test: it prints figures
//! and never fails on speed.
//!
//!     TUNELAB_PYTHON=.venv/bin/python cargo bench --bench protocol_latency [-- --calls N --gap-us G]
//!
//! Workers, as a run starts them:
//! - a Python lane worker (`python -m tunelab.worker`, Triton's interpreter
//!   when there is no GPU): `release` (a cheap call, a few µs of work), and
//!   `sample` of one launch of a checked 32x32x32 fp16 GEMM (a call of
//!   milliseconds: in the interpreter, a launch; the lane sleeps on the
//!   pipe for that long);
//! - the native worker (`tunelab native-worker`): `release`. Without a GPU it
//!   still starts and answers every call (a `problem_error` saying it has no
//!   GPU) through the same read, dispatch and reply path, so its protocol
//!   cost shows; its GPU calls (check, warmup, sample) need a GPU.
//!
//! `--gap-us G` spends G µs in the caller between calls (busy, as the
//! runner's own work between calls is), default 0: the longer a worker has
//! waited, the deeper its CPU has gone idle. `TUNELAB_SPIN_US=0` makes the
//! caller and the workers sleep in every wait, as before the spin-then-sleep
//! waits (docs/worker-protocol.md, "Waiting for a line").

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use tunelab::backend::{Worker, WorkerSpec};

const TIMEOUT: Duration = Duration::from_secs(120);

fn python() -> String {
    if let Ok(p) = std::env::var("TUNELAB_PYTHON") {
        return p;
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if venv.exists() {
        return venv.display().to_string();
    }
    "python3".into()
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Figures {
    rt: Vec<f64>,
    worker: Vec<f64>,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

impl Figures {
    fn row(&self, what: &str) -> String {
        let mut rt = self.rt.clone();
        let mut w = self.worker.clone();
        let mut p: Vec<f64> = self
            .rt
            .iter()
            .zip(&self.worker)
            .map(|(a, b)| a - b)
            .collect();
        for v in [&mut rt, &mut w, &mut p] {
            v.sort_by(f64::total_cmp);
        }
        let mean = p.iter().sum::<f64>() / p.len() as f64;
        format!(
            "| {what} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} |",
            p.len(),
            quantile(&rt, 0.5),
            quantile(&rt, 0.9),
            quantile(&w, 0.5),
            quantile(&p, 0.5),
            quantile(&p, 0.9),
            mean,
        )
    }
}

fn busy(us: u64) {
    let until = Instant::now() + Duration::from_micros(us);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// `calls` round trips of `op`, after 5 unmeasured ones.
fn measure(w: &mut Worker, op: &str, body: &Json, calls: u64, gap_us: u64) -> Figures {
    let mut f = Figures {
        rt: Vec::new(),
        worker: Vec::new(),
    };
    for i in 0..calls + 5 {
        busy(gap_us);
        let t = Instant::now();
        let reply = w
            .call(op, body.clone(), TIMEOUT)
            .expect("the worker answers");
        let rt = t.elapsed().as_secs_f64() * 1e6;
        let worker = reply["worker_us"].as_f64().expect("worker_us");
        if i >= 5 {
            f.rt.push(rt);
            f.worker.push(worker);
        }
    }
    f
}

fn main() {
    // `cargo test --all-targets` also runs bench targets, without `--bench`:
    // measure only when asked to (`cargo bench`).
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let calls = arg("--calls", 500);
    let gap_us = arg("--gap-us", 0);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let logs = tempfile::tempdir().expect("a temporary folder");
    let mut rows = Vec::new();

    let spec = WorkerSpec {
        python: python(),
        python_path: vec![root.join("python")],
        role: "lane".into(),
        interpret: std::env::var_os("TUNELAB_BENCH_GPU").is_none(),
        visible_device: None,
        visible_var: "CUDA_VISIBLE_DEVICES",
        target: None,
        triton_cache: Some(logs.path().join("triton")),
        log: logs.path().join("lane0.log"),
        background: false,
    };
    let mut w = Worker::spawn(&spec).expect("the Python worker starts");
    let hello = w.call("hello", json!({}), TIMEOUT).expect("hello");
    assert_eq!(hello["ok"], true, "{hello}");
    rows.push(measure(&mut w, "release", &json!({}), calls, gap_us).row("Python `release`"));
    let job = json!({
        "job_id": "bench",
        "problem": "gemm",
        "shape": {"M": 32, "N": 32, "K": 32, "dtype": "fp16"},
        "method": {"name": "triton", "kind": "triton", "kernel": "matmul"},
        "config": {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16,
                   "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2},
    });
    let tolerance = json!({"atol": 1e-2, "rtol": 1e-2, "max_mismatch": 0.0});
    let check = w
        .call(
            "check",
            json!({"job": job, "seed": 0, "tolerance": tolerance}),
            TIMEOUT,
        )
        .expect("check");
    assert_eq!(check["passed"], true, "{check}");
    let sample = json!({"job_id": "bench", "count": 1, "timing": "hot"});
    let sample_calls = (calls / 5).max(20);
    let f = measure(&mut w, "sample", &sample, sample_calls, gap_us);
    rows.push(f.row("Python `sample` (1 launch)"));
    w.shutdown();

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunelab"));
    cmd.args(["native-worker", "--backend", "cuda"]);
    let mut n = Worker::start(cmd, &logs.path().join("native0.log"), "native0".into())
        .expect("the native worker starts");
    let hello = n.call("hello", json!({}), TIMEOUT).expect("hello");
    let gpu = hello["ok"] == true;
    rows.push(
        measure(&mut n, "release", &json!({}), calls, gap_us).row(if gpu {
            "native `release`"
        } else {
            "native `release` (no GPU: answered problem_error)"
        }),
    );
    n.shutdown();

    println!(
        "protocol latency: {calls} calls each (sample: {sample_calls}), {gap_us} µs between calls"
    );
    println!("| call | n | round trip p50 µs | p90 µs | worker p50 µs | protocol p50 µs | p90 µs | mean µs |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        println!("{r}");
    }
}
