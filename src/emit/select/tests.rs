//! The selection rule's tests (`emit::select`).

use super::*;
use serde_json::json;

/// An ok job of one (shape, method) with `config`, timed at `median` µs ±`half`.
fn job(id: &str, config: Json, median: f64, half: f64) -> JobRecord {
    let stats = json!({
        "n": 32, "median_us": median, "ci_low_us": median - half, "ci_high_us": median + half,
        "min_us": median - half, "q1_us": median, "q3_us": median, "mean_us": median,
        "cv": 0.01, "flags": [], "timer": "cuda_event", "sm_clock_mhz": null,
        "gpu_ms": 1.0, "wall_ms": 1.0
    });
    serde_json::from_value(json!({
        "job_id": id, "method": "triton", "kind": "triton", "kernel": "k",
        "shape": {"M": 64}, "config": config, "baseline": false, "status": "ok",
        "failure": null, "check": null, "stats": stats, "flops": null, "bytes": null,
        "tflops": null, "gbs": null, "roofline_pct": null, "compile_s": null,
        "kernels": [], "duration_s": 1.0, "lane": 0, "finished_at": "2026-12-02T00:00:00Z"
    }))
    .unwrap()
}

fn best_config(jobs: Vec<JobRecord>) -> Json {
    let results = Results {
        jobs,
        ..Default::default()
    };
    let sel = Selection::new(&results);
    let best = sel.shapes[0].method("triton").unwrap().best.unwrap();
    serde_json::to_value(&best.job.config).unwrap()
}

#[test]
fn of_configs_tied_within_noise_the_first_in_config_order_is_picked() {
    let small = json!({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "num_warps": 4});
    let large = json!({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "num_warps": 4});
    // Their intervals overlap: whichever came out faster, the smaller
    // BLOCK_SIZE_M (the first key) is picked.
    for (a, b) in [(100.0, 100.6), (100.6, 100.0)] {
        let jobs = vec![
            job("x", large.clone(), a, 0.5),
            job("y", small.clone(), b, 0.5),
        ];
        assert_eq!(best_config(jobs), small, "times {a} and {b}");
    }
    // Apart beyond noise and beyond the margin: the fastest, whatever its config.
    let jobs = vec![
        job("x", large.clone(), 98.0, 0.5),
        job("y", small.clone(), 100.0, 0.5),
    ];
    assert_eq!(best_config(jobs), large);
    // Apart beyond their (narrow) noise but within PICK_MARGIN: a tie.
    let jobs = vec![
        job("x", large.clone(), 99.6, 0.05),
        job("y", small.clone(), 100.0, 0.05),
    ];
    assert_eq!(best_config(jobs), small);
    // Just past the margin, as narrow: the fastest.
    let jobs = vec![
        job("x", large.clone(), 99.4, 0.05),
        job("y", small.clone(), 100.0, 0.05),
    ];
    assert_eq!(best_config(jobs), large);
    // Equal up to a later key: that key decides (fewer warps first).
    let eight = json!({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "num_warps": 8});
    let jobs = vec![
        job("a", eight.clone(), 99.9, 0.5),
        job("b", small.clone(), 100.2, 0.5),
    ];
    assert_eq!(best_config(jobs), small);
}

#[test]
fn a_tie_is_only_among_jobs_timed_the_same_way() {
    // The finalist (re-timed) is the fastest; a job that was never
    // re-timed overlaps it on its own samples but is not its tie.
    let small = json!({"BLOCK_SIZE_M": 16});
    let large = json!({"BLOCK_SIZE_M": 128});
    let jobs = vec![
        job("fin", large.clone(), 120.0, 0.5),
        job("own", small, 100.2, 0.5),
    ];
    let finals = vec![FinalRecord {
        job_id: "fin".into(),
        timing: Timing::Cold,
        stats: jobs[0]
            .stats
            .clone()
            .map(|s| Stats {
                median_us: 100.0,
                ci_low_us: 99.5,
                ci_high_us: 100.5,
                ..s
            })
            .unwrap(),
        tied_with_best: true,
    }];
    let results = Results {
        jobs,
        finals,
        ..Default::default()
    };
    let sel = Selection::new(&results);
    let best = sel.shapes[0].method("triton").unwrap().best.unwrap();
    assert_eq!(best.job.job_id, "fin");
    assert!(best.is_final());
}

/// `job` as a finalist whose re-timing under `timing` came out at `median`.
fn retimed(job_id: &str, timing: Timing, median: f64) -> FinalRecord {
    FinalRecord {
        job_id: job_id.into(),
        timing,
        stats: Stats {
            median_us: median,
            ci_low_us: median - 0.5,
            ci_high_us: median + 0.5,
            ..crate::measure::summarize(&[median], crate::measure::Timer::CudaGraph)
        },
        tied_with_best: false,
    }
}

#[test]
fn a_tie_is_narrowed_by_the_other_timings_then_goes_to_the_baseline() {
    let small = json!({"BLOCK_SIZE_M": 64});
    let large = json!({"BLOCK_SIZE_M": 128});
    let jobs = [
        job("s", small, 100.3, 0.5),
        job("l", large.clone(), 100.0, 0.5),
    ];
    let timed: Vec<Timed<'_>> = jobs.iter().filter_map(|j| eligible(j, None)).collect();
    // Tied cold; under graph replay the larger tile is clearly faster:
    // it is picked, though the smaller comes first in config order.
    let graph = [
        retimed("s", Timing::Graph, 90.0),
        retimed("l", Timing::Graph, 80.0),
    ];
    let under = |id: &str, t: Timing| graph.iter().find(|f| f.job_id == id && f.timing == t);
    let p = pick(&timed, &[Timing::Graph], under).unwrap();
    assert_eq!(p.job.job_id, "l");
    // Without the graph re-timing (or where it ties too): config order.
    assert_eq!(pick(&timed, &[], under).unwrap().job.job_id, "s");
    let tied_graph = [
        retimed("s", Timing::Graph, 80.2),
        retimed("l", Timing::Graph, 80.0),
    ];
    let under = |id: &str, t: Timing| tied_graph.iter().find(|f| f.job_id == id && f.timing == t);
    assert_eq!(
        pick(&timed, &[Timing::Graph], under).unwrap().job.job_id,
        "s"
    );
    // Under graph replay 0.3 % apart, with intervals too narrow to
    // overlap: tied by the margin, so config order decides.
    let narrow = |id: &str, median: f64| FinalRecord {
        stats: Stats {
            ci_low_us: median - 0.05,
            ci_high_us: median + 0.05,
            ..retimed(id, Timing::Graph, median).stats
        },
        ..retimed(id, Timing::Graph, median)
    };
    let margin_graph = [narrow("s", 80.24), narrow("l", 80.0)];
    let under = |id: &str, t: Timing| {
        margin_graph
            .iter()
            .find(|f| f.job_id == id && f.timing == t)
    };
    assert!(!crate::measure::indistinguishable(
        &margin_graph[0].stats,
        &margin_graph[1].stats
    ));
    assert_eq!(
        pick(&timed, &[Timing::Graph], under).unwrap().job.job_id,
        "s"
    );
    // A re-timing with a zero median is no timing: config order again.
    let broken = [
        retimed("s", Timing::Graph, 0.0),
        retimed("l", Timing::Graph, 80.0),
    ];
    let under = |id: &str, t: Timing| broken.iter().find(|f| f.job_id == id && f.timing == t);
    assert_eq!(
        pick(&timed, &[Timing::Graph], under).unwrap().job.job_id,
        "s"
    );
    // A job the graph did not re-time leaves that timing out of it.
    let partial = [retimed("l", Timing::Graph, 80.0)];
    let under = |id: &str, t: Timing| partial.iter().find(|f| f.job_id == id && f.timing == t);
    assert_eq!(
        pick(&timed, &[Timing::Graph], under).unwrap().job.job_id,
        "s"
    );

    // The baseline config, tied with the fastest, is picked over config order.
    let mut base = job("b", large, 100.4, 0.5);
    base.baseline = true;
    let jobs = [jobs[0].clone(), jobs[1].clone(), base];
    let timed: Vec<Timed<'_>> = jobs.iter().filter_map(|j| eligible(j, None)).collect();
    let none = |_: &str, _: Timing| None;
    assert_eq!(pick(&timed, &[], none).unwrap().job.job_id, "b");
    // A baseline not in the tie (0.8 % behind, beyond noise and margin)
    // still bounds it: no pick slower than it, though `s` ties by its noise.
    let mut base = job("b", json!({"BLOCK_SIZE_M": 256}), 99.8, 0.05);
    base.baseline = true;
    let jobs = [
        job("s", json!({"BLOCK_SIZE_M": 64}), 100.2, 1.5),
        job("l", json!({"BLOCK_SIZE_M": 128}), 99.0, 0.05),
        base,
    ];
    let timed: Vec<Timed<'_>> = jobs.iter().filter_map(|j| eligible(j, None)).collect();
    assert!(!tied_for_pick(timed[2].stats, timed[1].stats));
    assert!(tied_for_pick(timed[0].stats, timed[1].stats));
    assert_eq!(pick(&timed, &[], none).unwrap().job.job_id, "l");
}

#[test]
fn config_order_compares_values_in_the_given_key_order_then_the_rest() {
    let c = |v: Json| -> IndexMap<String, Json> { serde_json::from_value(v).unwrap() };
    let order = ["N", "M"];
    let (a, b) = (c(json!({"M": 1, "N": 2})), c(json!({"M": 2, "N": 1})));
    assert_eq!(config_order(&order, &a, &b), Ordering::Greater, "N first");
    let (a, b) = (c(json!({"N": 1, "x": "a"})), c(json!({"N": 1, "x": "b"})));
    assert_eq!(
        config_order(&order, &a, &b),
        Ordering::Less,
        "then the rest"
    );
    assert_eq!(config_order(&order, &a, &a), Ordering::Equal);
}
