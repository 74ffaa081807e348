//! How long the `aot` output takes to render a library whose image is a
//! cubin-sized 500 KB (the embedded byte array is most of the C source).
//! A measurement, not a test: it prints figures and never fails on speed.
//! Run with `just bench-aot` (cargo bench --bench aot_render).

use std::time::Instant;

use indexmap::IndexMap;
use serde_json::json;

use tunelab::emit::aot::{self, Interface, Library, Param, Spec};

const IMAGE_BYTES: usize = 500 * 1024;
const ROUNDS: usize = 21;

/// Bytes with no pattern a renderer could shortcut (xorshift).
fn image(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn library() -> Library {
    let shape: IndexMap<String, serde_json::Value> = IndexMap::from_iter([
        ("M".to_string(), json!(128)),
        ("N".to_string(), json!(4096)),
    ]);
    let spec = Spec {
        method: "triton".into(),
        kind: "triton".into(),
        job_id: "bench".into(),
        config: IndexMap::from_iter([("num_warps".to_string(), json!(4))]),
        compiled_at: shape.clone(),
        won_at: shape,
        median_us: Some(10.0),
        image: image(IMAGE_BYTES),
        symbol: "matmul_kernel".into(),
        grid: [
            "INT64_C(1)".into(),
            "INT64_C(1)".into(),
            "INT64_C(1)".into(),
        ],
        block: [
            "INT64_C(128)".into(),
            "INT64_C(1)".into(),
            "INT64_C(1)".into(),
        ],
        shared: "INT64_C(0)".into(),
        params: vec![Param {
            name: "a_ptr".into(),
            c_type: "CUdeviceptr".into(),
            value: "a".into(),
        }],
        conditions: vec![],
    };
    Library {
        interface: Interface {
            prefix: "bench".into(),
            tensors: vec!["a".into()],
            ints: vec!["M".into(), "N".into()],
        },
        specs: vec![spec],
        buckets: IndexMap::from_iter([("any".to_string(), vec![0])]),
        left_out: vec![],
        about: "bench".into(),
    }
}

fn main() {
    // `cargo test --all-targets` also runs bench targets, without `--bench`:
    // measure only when asked to (`cargo bench`).
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let lib = library();
    let mut times = Vec::with_capacity(ROUNDS);
    let mut source_bytes = 0;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let files = aot::render(&lib).unwrap();
        times.push(start.elapsed().as_secs_f64() * 1e3);
        source_bytes = files
            .iter()
            .find(|f| f.name.ends_with(".c"))
            .map_or(0, |f| f.bytes.len());
    }
    times.sort_by(f64::total_cmp);
    println!("image:        {} KiB", IMAGE_BYTES / 1024);
    println!("C source:     {:.2} MB", source_bytes as f64 / 1e6);
    println!(
        "render, ms:   median {:.1}, min {:.1}, max {:.1} ({ROUNDS} rounds)",
        times[ROUNDS / 2],
        times[0],
        times[ROUNDS - 1]
    );
}
