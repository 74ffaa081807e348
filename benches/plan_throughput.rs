//! Planner throughput on a 10^7-point space, one thread: jobs per second and
//! peak resident memory. A measurement, not a test: it prints figures and
//! never fails on speed. Run with `just bench-plan` (cargo bench --bench plan_throughput).

use std::ops::ControlFlow;
use std::time::Instant;

use tunelab::device;
use tunelab::manifest;
use tunelab::plan::{self, Filter, Mode, PlanOptions};

const MANIFEST: &str = r#"
experiment: plan-bench
problem: gemm
shapes:
  list: [{M: 4096, N: 4096, K: 4096, dtype: bf16}]
methods:
  triton:
    kind: triton
    kernel: matmul
    space:
      BLOCK_SIZE_M: [16, 32, 48, 64, 80, 96, 112, 128, 192, 256]
      BLOCK_SIZE_N: [16, 32, 48, 64, 80, 96, 112, 128, 192, 256]
      BLOCK_SIZE_K: [16, 32, 48, 64, 80, 96, 112, 128, 192, 256]
      GROUP_SIZE_M: [1, 2, 4, 8, 16, 24, 32, 48, 64, 128]
      num_warps: [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]
      num_stages: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
      split_k: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    constraints:
      - "(BLOCK_SIZE_M + BLOCK_SIZE_N) * BLOCK_SIZE_K * 2 * num_stages <= device.smem_bytes"
      - "num_warps * 32 <= BLOCK_SIZE_M * BLOCK_SIZE_N // 16"
"#;

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() {
    // `cargo test --all-targets` also runs bench targets, without `--bench`:
    // measure only when asked to (`cargo bench`).
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tunelab-plan-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bench.yaml");
    std::fs::write(&path, MANIFEST).unwrap();
    let dev = device::profile("h100").unwrap();
    let exp = manifest::load(&path, &[], &dev).unwrap_or_else(|d| panic!("{d}"));
    let filter = Filter::default();
    let opts = PlanOptions {
        device: &dev,
        filter: &filter,
        mode: Mode::Gpu,
    };

    // Counts and job ids only: the planner's own cost.
    let start = Instant::now();
    let (summary, checksum) = plan::count_with_ids(&exp, &opts).unwrap();
    let secs = start.elapsed().as_secs_f64();
    let m = &summary.methods[0];
    println!("space points:            {}", m.points);
    for (c, n) in &m.removed {
        println!("removed by `{c}`: {n}");
    }
    println!(
        "valid jobs (with ids):   {}  (id checksum {checksum:016x})",
        m.valid
    );
    println!("points/s:                {:.0}", m.points as f64 / secs);
    println!("jobs with ids/s:         {:.0}", m.valid as f64 / secs);
    println!("wall:                    {secs:.2} s");

    // Full Job values streamed to a sink, as `tunelab plan --jobs` and the runner see them.
    let start = Instant::now();
    let mut n = 0u64;
    plan::plan(&exp, &opts, &mut |job| {
        n += job.config.len() as u64 / job.config.len().max(1) as u64;
        ControlFlow::Continue(())
    })
    .unwrap();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "streamed Job values/s:   {:.0}  ({n} jobs in {secs:.2} s)",
        n as f64 / secs
    );
    println!("peak RSS:                {:.1} MB", peak_rss_mb());
    let _ = std::fs::remove_dir_all(&dir);
}
