//! `tunelab profile`: which jobs of a results directory are profiled, and
//! the request its Python side reads (`python -m tunelab.profiler`,
//! which re-runs them under Proton, and under Nsight Compute when `ncu` is
//! on PATH, and writes `profile/summary.md`).
//!
//! The request holds each job exactly as a worker takes it (problem, shape,
//! method with its IR file, config), the seed and tolerance its check ran
//! with, and what the journal measured, so the summary can set the profile
//! beside the tuning's own median.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::emit::Selection;
use crate::manifest::shape_label;
use crate::store::{JobRecord, Results};

/// The profile folder inside a results directory, and its summary.
pub const FOLDER: &str = "profile";
pub const SUMMARY: &str = "summary.md";

/// What the profiler (`tunelab.profiler`) writes by name in the
/// folder, with plain opens that would follow a link.
pub const WRITTEN: [&str; 4] = ["proton.hatchet", "ncu", "summary.json", SUMMARY];

/// One job to profile.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileJob {
    /// `shape/method` (and `#2`, ... below the winner): the Proton scope's name.
    pub label: String,
    /// 1 for the (shape, method)'s winner, 2 for the next, ...
    pub rank: usize,
    pub job: Json,
    /// The tolerance of the job's dtype, as the run checked it.
    pub tolerance: Json,
    pub median_us: Option<f64>,
    pub flops: Option<f64>,
    pub bytes: Option<f64>,
    pub winner_of_shape: bool,
}

/// The request the Python side reads.
#[derive(Debug, Clone, Serialize)]
pub struct Request {
    pub experiment: String,
    pub problem: String,
    pub device: String,
    pub seed: u64,
    /// Launches per job inside the profiled region.
    pub calls: u32,
    pub jobs: Vec<ProfileJob>,
}

/// The `top` fastest timed jobs of every (shape, method), fastest first,
/// shapes and methods in the report's order; methods of `kind: cuda|hip`
/// are left out (their kernels are launched by the native worker, which the
/// profiler's Python side does not drive).
pub fn choose(
    results: &Results,
    top: usize,
    calls: u32,
    ir_files: &HashMap<String, PathBuf>,
) -> Option<Request> {
    let header = results.header.as_ref()?;
    let sel = Selection::new(results);
    let mut jobs = Vec::new();
    for s in &sel.shapes {
        let overall = s.overall_best().map(|(_, b)| b.job.job_id.clone());
        for m in &s.methods {
            let mut timed: Vec<(&JobRecord, f64)> = m
                .jobs
                .iter()
                // Proton and the Python side launch Triton and Python
                // methods; a `kind: cuda|hip` kernel is the native worker's.
                .filter(|j| !j.kind.is_native())
                .filter_map(|j| {
                    crate::emit::eligible(j, sel.final_of(&j.job_id)).map(|t| (*j, t.time_us()))
                })
                .collect();
            timed.sort_by(|a, b| a.1.total_cmp(&b.1));
            for (rank, (j, time)) in timed.into_iter().take(top.max(1)).enumerate() {
                let mut label = format!("{}/{}", shape_label(s.shape), m.method);
                if rank > 0 {
                    label.push_str(&format!("#{}", rank + 1));
                }
                let mut method =
                    json!({"name": j.method, "kind": j.kind.as_str(), "kernel": j.kernel});
                if let Some(ir) = ir_files.get(&j.method) {
                    method["ir"] = json!(ir.display().to_string());
                }
                let tol = header
                    .tolerance
                    .for_dtype(crate::manifest::shape_dtype(&j.shape));
                jobs.push(ProfileJob {
                    label,
                    rank: rank + 1,
                    job: json!({
                        "job_id": j.job_id,
                        "problem": header.problem,
                        "shape": j.shape,
                        "method": method,
                        "config": j.config,
                    }),
                    tolerance: json!({"atol": tol.atol, "rtol": tol.rtol, "max_mismatch": tol.max_mismatch}),
                    median_us: Some(time),
                    flops: j.flops,
                    bytes: j.bytes,
                    winner_of_shape: overall.as_deref() == Some(j.job_id.as_str()),
                });
            }
        }
    }
    Some(Request {
        experiment: header.experiment.clone(),
        problem: header.problem.clone(),
        device: header.device.name.clone(),
        seed: header.protocol.seed,
        calls,
        jobs,
    })
}

/// Methods of the journal that run one kernel between them: one may run
/// from an IR file, which only the manifest says (`--manifest`).
pub fn shared_kernels(results: &Results) -> Vec<String> {
    let Some(h) = &results.header else {
        return Vec::new();
    };
    let mut by_kernel: indexmap::IndexMap<&str, Vec<&str>> = indexmap::IndexMap::new();
    for m in &h.methods {
        by_kernel.entry(&m.kernel).or_default().push(&m.name);
    }
    by_kernel
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(kernel, names)| format!("{} (kernel {kernel})", names.join(", ")))
        .collect()
}
