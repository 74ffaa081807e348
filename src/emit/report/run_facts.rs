//! What the run was: environment, measurement protocol, job counts and time spent.

use super::*;

pub(super) fn opt(v: &Option<String>) -> String {
    v.clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DASH.into())
}

pub(super) fn bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if n == 0 {
        return DASH.into();
    }
    if n as f64 >= 1024.0 * MIB {
        format!("{:.1} GiB", n as f64 / (1024.0 * MIB))
    } else {
        format!("{:.0} MiB", n as f64 / MIB)
    }
}

pub(super) fn environment(group: &Group<'_, '_>) -> Vec<Row> {
    let h = group.header;
    let d = &h.device;
    let fp = &h.fingerprint;
    let mut dtypes: Vec<String> = Vec::new();
    for s in &group.shapes {
        if let Some(Json::String(dt)) = s.shape.get("dtype") {
            if !dtypes.contains(dt) {
                dtypes.push(dt.clone());
            }
        }
    }
    if dtypes.is_empty() {
        dtypes.push("bf16".into());
    }
    let mut any_peak = false;
    let peaks: Vec<String> = dtypes
        .iter()
        .map(|dt| {
            let peak = match dt.as_str() {
                "bf16" => Some(d.peak_tflops_bf16),
                "fp16" => Some(d.peak_tflops_fp16),
                "fp8" => Some(d.peak_tflops_fp8),
                // MXFP4 weights are dequantised to the 16-bit activations: bf16 tensor cores.
                "mxfp4" => Some(d.peak_tflops_bf16),
                "fp32" => Some(d.peak_tflops_fp32),
                _ => None,
            };
            match peak.filter(|p| *p > 0.0) {
                Some(p) => {
                    any_peak = true;
                    format!("{dt}: {} TFLOP/s", num::fixed(Some(p), 1))
                }
                None => format!("{dt}: {DASH}"),
            }
        })
        .collect();
    let label = if d.source.starts_with("profile:") {
        format!(
            "dense, published for the part; device facts from {}",
            d.source
        )
    } else {
        "dense, published for the part".to_string()
    };
    let mode = match h.mode {
        Mode::Interpreter => "interpreter (Triton's TRITON_INTERPRET=1 on the CPU)".to_string(),
        Mode::Gpu => "gpu".to_string(),
    };
    vec![
        row("Device", d.name.clone()),
        row("Backend", d.backend.clone()),
        row(
            "Architecture",
            if d.cc_major > 0 {
                format!(
                    "{} (compute capability {}.{})",
                    d.arch, d.cc_major, d.cc_minor
                )
            } else {
                d.arch.clone()
            },
        ),
        row("SMs / CUs", d.sm_count.to_string()),
        row("L2 cache", bytes(d.l2_bytes)),
        row(
            "Peak memory bandwidth",
            if d.peak_gbs > 0.0 {
                format!("{} GB/s", num::rate(Some(d.peak_gbs)))
            } else {
                DASH.into()
            },
        ),
        row(
            "Peak compute used for roofline",
            if any_peak {
                format!("{} ({label})", peaks.join(", "))
            } else {
                peaks.join(", ")
            },
        ),
        row(
            "Driver",
            opt(&d.driver.clone().or_else(|| fp.driver.clone())),
        ),
        row("CUDA", opt(&fp.cuda)),
        row(
            "tunelab",
            if fp.tunelab.is_empty() {
                DASH.into()
            } else {
                fp.tunelab.clone()
            },
        ),
        row("git commit", opt(&fp.git_commit)),
        row("Python", opt(&fp.python)),
        row("torch", opt(&fp.torch)),
        row("Triton", opt(&fp.triton)),
        row("Mode", mode),
        row("Run mode", h.run_mode.as_str()),
        row("Search", h.search.label()),
        row("Problem", h.problem.clone()),
        row(
            "Manifest hash",
            if fp.manifest_hash.is_empty() {
                DASH.into()
            } else {
                format!("`{}`", fp.manifest_hash)
            },
        ),
        row("Started", h.started_at.clone()),
        row(
            "Runs in the journal",
            group.results.runs.len().max(1).to_string(),
        ),
    ]
}

pub(super) fn protocol(group: &Group<'_, '_>) -> Vec<Row> {
    let h = group.header;
    let p = &h.protocol;
    let with = match p.flush {
        L2Flush::Read => Some("a read of"),
        L2Flush::Memset => Some("a memset of"),
        L2Flush::Off => None,
    };
    let flush = if let Some(with) = with {
        match p.flush_bytes {
            Some(b) => format!("before every sample, {with} {}", bytes(b)),
            None => {
                let b = (2 * h.device.l2_bytes).max(32 << 20);
                format!(
                    "before every sample, {with} max(2 × L2, 32 MiB) = {}",
                    bytes(b)
                )
            }
        }
    } else {
        "off (warm-cache samples)".to_string()
    };
    vec![
        row(
            "Warm-up",
            format!(
                "at least {} and {} ms",
                num::count(p.warmup_launches, "launch", "launches"),
                trim_float(p.warmup_ms)
            ),
        ),
        row("L2 flush", flush),
        row(
            "Batch",
            format!("{} samples per host synchronisation", p.batch),
        ),
        row("Samples", format!("{} to {}", p.min_samples, p.max_samples)),
        row(
            "Stop when",
            format!(
                "the 95 % CI of the median is within ±{} % of it",
                trim_float(p.target_ci * 100.0)
            ),
        ),
        row(
            "Caps per job",
            format!(
                "{} ms of GPU time, {} ms of wall time (capped jobs are flagged CAP_HIT)",
                trim_float(p.max_gpu_ms),
                trim_float(p.max_wall_ms)
            ),
        ),
        row(
            "Finalists",
            if p.finalists > 0 {
                format!(
                    "top {} per (shape, method) re-timed interleaved",
                    p.finalists
                )
            } else {
                "none".into()
            },
        ),
        row("Hot number", "off"),
        row("Timeout", format!("{} s per job", trim_float(p.timeout_s))),
        row("Seed", p.seed.to_string()),
        row("Tolerance", tolerance(&h.tolerance)),
    ]
}

pub(super) fn trim_float(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

pub(super) fn tolerance(t: &Tolerance) -> String {
    let t = serde_json::to_value(t).expect("tolerance serialises");
    pub(super) fn flat(prefix: &str, v: &Json, out: &mut Vec<String>) {
        match v {
            Json::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    flat(&key, v, out);
                }
            }
            Json::Null => {}
            other => out.push(format!("{prefix}={}", json_text(other))),
        }
    }
    let mut parts = Vec::new();
    flat("", &t, &mut parts);
    if parts.is_empty() {
        DASH.into()
    } else {
        parts.join(", ")
    }
}

pub(super) fn duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds <= 0.0 {
        return "0 s".into();
    }
    if seconds < 60.0 {
        return format!("{seconds:.1} s");
    }
    let total = seconds.round() as u64;
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    if h > 0 {
        format!("{h} h {m:02} min")
    } else {
        format!("{m} min {s:02} s")
    }
}

/// Seconds since the epoch of an RFC 3339 UTC time as the journal writes it (`2026-11-21T21:40:00Z`).
pub(super) fn rfc3339_seconds(t: &str) -> Option<i64> {
    let num = |r: std::ops::Range<usize>| t.get(r).and_then(|x| x.parse::<i64>().ok());
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from civil (H. Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (mo + if mo > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some((era * 146_097 + doe - 719_468) * 86_400 + h * 3600 + mi * 60 + se)
}

/// Wall time of every run: from its start to the last job recorded before the next run started.
pub(super) fn run_wall_seconds(runs: &[crate::store::RunHeader], jobs: &[&JobRecord]) -> f64 {
    let mut starts: Vec<i64> = runs
        .iter()
        .filter_map(|r| rfc3339_seconds(&r.started_at))
        .collect();
    starts.sort_unstable();
    let mut last_in_run = vec![None::<i64>; starts.len()];
    for j in jobs {
        let Some(t) = rfc3339_seconds(&j.finished_at) else {
            continue;
        };
        if let Some(i) = starts.iter().rposition(|s| *s <= t) {
            last_in_run[i] = Some(last_in_run[i].map_or(t, |x: i64| x.max(t)));
        }
    }
    starts
        .iter()
        .zip(last_in_run)
        .filter_map(|(s, end)| end.map(|e| (e - s) as f64))
        .sum()
}

pub(super) fn counts(group: &Group<'_, '_>, jobs: &[&JobRecord]) -> Vec<Row> {
    let count = |s: JobStatus| jobs.iter().filter(|j| j.status == s).count();
    let measured = run_wall_seconds(&group.results.runs, jobs);
    let job_ids: HashSet<&str> = jobs.iter().map(|j| j.job_id.as_str()).collect();
    let gpu_ms: f64 = jobs
        .iter()
        .filter_map(|j| j.stats.as_ref())
        .map(|s| s.gpu_ms)
        .filter(|g| g.is_finite())
        .sum::<f64>()
        + group
            .results
            .finals
            .iter()
            .filter(|f| job_ids.contains(f.job_id.as_str()))
            // every re-timing took GPU time, whichever way it timed
            .map(|f| f.stats.gpu_ms)
            .filter(|g| g.is_finite())
            .sum::<f64>();
    let finalists = jobs
        .iter()
        .filter(|j| group.sel.final_of(&j.job_id).is_some())
        .count();
    // A resumed run plans only what is left; the first run planned everything.
    let planned = group
        .results
        .runs
        .iter()
        .map(|r| r.planned_jobs)
        .max()
        .unwrap_or(group.header.planned_jobs);
    let mut rows = vec![
        row("Planned", planned.to_string()),
        row(
            "Recorded",
            format!(
                "{}{}",
                jobs.len(),
                if (jobs.len() as u64) < planned {
                    format!(" ({} not run)", planned - jobs.len() as u64)
                } else {
                    String::new()
                }
            ),
        ),
        row("Ok (timed)", count(JobStatus::Ok).to_string()),
        row("Checked only", count(JobStatus::Checked).to_string()),
        row("Failed", count(JobStatus::Failed).to_string()),
        row("Pruned", count(JobStatus::Pruned).to_string()),
        row(
            "Skipped (surrogate budget spent)",
            count(JobStatus::Skipped).to_string(),
        ),
        row("Finalists re-timed", finalists.to_string()),
        row(
            "Run wall time (all runs, start to last record)",
            duration(measured),
        ),
        row("GPU time in timed samples", duration(gpu_ms / 1000.0)),
    ];
    if !group.results.retired.is_empty() {
        let lanes: Vec<String> = group
            .results
            .retired
            .iter()
            .map(|r| {
                let device = r
                    .device
                    .as_ref()
                    .map(|d| format!(" (GPU {d})"))
                    .unwrap_or_default();
                format!(
                    "lane {}{device}: {}; {} jobs run on the other lanes",
                    r.lane, r.reason, r.requeued_jobs
                )
            })
            .collect();
        rows.push(row("Lanes retired", lanes.join(" · ")));
    }
    rows
}

#[cfg(test)]
mod time_tests {
    use super::rfc3339_seconds;

    #[test]
    pub(super) fn rfc3339_times_convert_to_epoch_seconds() {
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_seconds("2026-11-21T21:40:00Z"), Some(1_795_297_200));
        assert_eq!(
            rfc3339_seconds("2024-03-01T00:00:01Z").unwrap()
                - rfc3339_seconds("2024-02-28T00:00:01Z").unwrap(),
            2 * 86_400
        );
        assert_eq!(rfc3339_seconds("garbage"), None);
    }
}
