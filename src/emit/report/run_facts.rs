//! What the runs were: one line of facts under the title; the runs table,
//! whose counts add up across resumed runs; the environment and protocol
//! tables of the details file; durations.

use super::*;
use crate::measure::{L2Flush, Protocol, Timing};
use crate::store::RunHeader;

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

/// A duration for people: `0.4 s`, `12.0 s` below a minute (never `0 s`),
/// `13 min 18 s`, `2 h 05 min`.
pub(super) fn duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.05 {
        return "< 0.1 s".into();
    }
    if seconds < 59.95 {
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

/// One run of the journal as the runs table shows it.
pub(super) struct RunRow {
    pub(super) started: String,
    /// Jobs recorded by earlier runs.
    pub(super) already: usize,
    /// Jobs the run set out to run (its header's `planned_jobs`).
    pub(super) planned: u64,
    /// Jobs whose (latest) record this run wrote.
    pub(super) recorded: usize,
    /// Start to last record (whole seconds; below two, the busiest lane's
    /// summed job time, kept within a second of that span); the start is
    /// the command's for runs since 2026-12 (when its header was written
    /// before). `None` for a run that recorded no job: the journal does not
    /// say when it ended.
    pub(super) wall_s: Option<f64>,
}

impl RunRow {
    pub(super) fn not_run(&self) -> u64 {
        self.planned.saturating_sub(self.recorded as u64)
    }
}

/// Every job the runs recorded (latest record per id), superseded ones included:
/// a run's counts say what it did, whatever later runs replaced.
fn recorded<'a>(a: &Analysis<'_, '_, 'a>) -> Vec<&'a JobRecord> {
    let mut jobs = a.jobs.clone();
    jobs.extend(a.group.superseded());
    jobs
}

/// Every run, each job counted in the run that wrote its latest record.
pub(super) fn runs(runs: &[RunHeader], jobs: &[&JobRecord]) -> Vec<RunRow> {
    let starts: Vec<Option<i64>> = runs
        .iter()
        .map(|r| rfc3339_seconds(&r.started_at))
        .collect();
    let mut recorded = vec![0usize; runs.len()];
    let mut last = vec![None::<i64>; runs.len()];
    let mut lanes: Vec<HashMap<u32, f64>> = vec![HashMap::new(); runs.len()];
    for j in jobs {
        let t = rfc3339_seconds(&j.finished_at);
        let i = t
            .and_then(|t| starts.iter().rposition(|s| s.is_some_and(|s| s <= t)))
            .unwrap_or(0);
        if i >= runs.len() {
            continue;
        }
        recorded[i] += 1;
        if let Some(t) = t {
            last[i] = Some(last[i].map_or(t, |x: i64| x.max(t)));
        }
        if j.duration_s.is_finite() {
            *lanes[i].entry(j.lane).or_default() += j.duration_s;
        }
    }
    let mut already = 0;
    runs.iter()
        .enumerate()
        .map(|(i, r)| {
            let span = match (starts[i], last[i]) {
                (Some(s), Some(e)) if e >= s => (e - s) as f64,
                _ => 0.0,
            };
            // Whole seconds: a run shorter than two of them is timed by
            // its busiest lane's jobs, within a second of the span.
            let busiest = lanes[i].values().copied().fold(0.0, f64::max);
            let wall = if span >= 2.0 {
                span
            } else {
                busiest.clamp((span - 1.0).max(0.0), span + 1.0)
            };
            let row = RunRow {
                started: r
                    .started_at
                    .replace('T', " ")
                    .trim_end_matches('Z')
                    .to_string(),
                already,
                planned: r.planned_jobs,
                recorded: recorded[i],
                wall_s: (recorded[i] > 0).then_some(wall),
            };
            already += recorded[i];
            row
        })
        .collect()
}

pub(super) fn runs_table(a: &Analysis<'_, '_, '_>) -> Table {
    let rows = runs(&a.group.results.runs, &recorded(a));
    let mut out: Vec<Vec<String>> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            vec![
                (i + 1).to_string(),
                r.started.clone(),
                r.already.to_string(),
                r.planned.to_string(),
                r.recorded.to_string(),
                r.not_run().to_string(),
                r.wall_s.map_or_else(|| DASH.to_string(), duration),
            ]
        })
        .collect();
    if rows.len() > 1 {
        let wall: f64 = rows.iter().filter_map(|r| r.wall_s).sum();
        let recorded: usize = rows.iter().map(|r| r.recorded).sum();
        out.push(vec![
            "all".into(),
            String::new(),
            String::new(),
            String::new(),
            format!("**{recorded}**"),
            rows.last().map_or(0, RunRow::not_run).to_string(),
            duration(wall),
        ]);
    }
    Table::new(
        [
            "Run",
            "Started (UTC)",
            "Already done",
            "Planned (not in the journal yet)",
            "Recorded",
            "Not run (left to the next run)",
            "Wall time",
        ]
        .map(String::from)
        .to_vec(),
        out,
        &[0, 1],
    )
}

/// What the runs table means, the time spent, and the jobs by status.
pub(super) fn run_notes(a: &Analysis<'_, '_, '_>) -> Vec<String> {
    let rows = runs(&a.group.results.runs, &recorded(a));
    let mut notes = Vec::new();
    if let Some(last) = rows.last().filter(|r| r.not_run() > 0) {
        notes.push(format!(
            "**{} planned jobs were never recorded**: the last run stopped before them; run it again to finish.",
            last.not_run()
        ));
    }
    let superseded = a.group.superseded();
    if !superseded.is_empty() {
        let mut methods: Vec<&str> = superseded.iter().map(|j| j.method.as_str()).collect();
        methods.sort_unstable();
        methods.dedup();
        notes.push(format!(
            "**{} superseded** ({}): a later run recorded the same method and shape under new job ids \
             (the same config under a new id, or configs with other parameters), so the method's \
             definition (its kernel source, launch or space) changed in between. The older records stay \
             in the journal and count in the runs table; no other table or output here uses them.",
            num::count(superseded.len() as u64, "job was", "jobs were"),
            methods.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "),
        ));
    }
    let job_ids = id_set(&a.jobs);
    let sample_ms: f64 = a
        .jobs
        .iter()
        .filter_map(|j| j.stats.as_ref())
        .map(|s| s.gpu_ms)
        .filter(|g| g.is_finite())
        .sum::<f64>()
        + a.group
            .results
            .finals
            .iter()
            .filter(|f| job_ids.contains(f.job_id.as_str()))
            // every re-timing took sample time, whichever way it timed
            .map(|f| f.stats.gpu_ms)
            .filter(|g| g.is_finite())
            .sum::<f64>();
    let finalists = a
        .jobs
        .iter()
        .filter(|j| a.group.sel.final_of(&j.job_id).is_some())
        .count();
    for r in &a.group.results.retired {
        let device = r
            .device
            .as_ref()
            .map(|d| format!(" (GPU {d})"))
            .unwrap_or_default();
        notes.push(format!(
            "**Lane {}{device} retired**: {}; {} of its jobs ran on the other lanes.",
            r.lane, r.reason, r.requeued_jobs
        ));
    }
    let besides = match superseded.len() {
        0 => String::new(),
        n => format!(" (and {n} superseded)"),
    };
    notes.push(format!(
        "{} recorded{besides}: {}. {} in timed samples{}; {} re-timed as finalists. \
         Wall time: from a run's start (its command's; before 2026-12, its journal header's, \
         written once its workers had started) to its last record.",
        num::count(a.jobs.len() as u64, "job", "jobs"),
        status_counts(&a.jobs),
        duration(sample_ms / 1000.0),
        if a.gpu { " (GPU)" } else { " (wall-clock)" },
        num::count(finalists as u64, "job", "jobs"),
    ));
    notes
}

/// The line under the title: device, shapes, methods, jobs, runs, time, search.
pub(super) fn facts_line(a: &Analysis<'_, '_, '_>) -> String {
    let h = a.group.header;
    let rows = runs(&a.group.results.runs, &recorded(a));
    let wall: f64 = rows.iter().filter_map(|r| r.wall_s).sum();
    let device = if a.gpu {
        format!("**{}**", h.device.name)
    } else {
        "**Triton interpreter on the CPU**".to_string()
    };
    format!(
        "{device} · {} · {} · {} in {} ({}) · {} search · {}",
        num::count(a.group.shapes.len() as u64, "shape", "shapes"),
        num::count(a.methods.len() as u64, "method", "methods"),
        num::count(a.jobs.len() as u64, "job", "jobs"),
        num::count(rows.len().max(1) as u64, "run", "runs"),
        duration(wall),
        h.search.label(),
        if a.gpu {
            format!("{} timing", h.protocol.timing.as_str())
        } else {
            "wall-clock timing".to_string()
        },
    )
}

pub(super) fn environment(a: &Analysis<'_, '_, '_>) -> Vec<Row> {
    let h = a.group.header;
    let d = &h.device;
    let fp = &h.fingerprint;
    let mut dtypes: Vec<String> = Vec::new();
    for s in &a.group.shapes {
        if let Some(Json::String(dt)) = s.shape.get("dtype") {
            if !dtypes.contains(dt) {
                dtypes.push(dt.clone());
            }
        }
    }
    if dtypes.is_empty() {
        dtypes.push("bf16".into());
    }
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
                Some(p) => format!("{dt}: {} TFLOP/s", num::fixed(Some(p), 1)),
                None => format!("{dt}: {DASH}"),
            }
        })
        .collect();
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
            "Peak compute used for the bound",
            format!("{} (dense, published for the part)", peaks.join(", ")),
        ),
        row("Device facts", d.source.clone()),
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
        row("Last run started", h.started_at.clone()),
    ]
}

/// How the L2 flush before each cold sample is made, in words.
pub(super) fn flush_text(p: &Protocol, l2_bytes: u64) -> String {
    let with = match p.flush {
        L2Flush::Read => "a read of",
        L2Flush::Memset => "a memset of",
        L2Flush::Off => return "off (warm-cache samples)".into(),
    };
    match p.flush_bytes {
        Some(b) => format!("before every sample, {with} {}", bytes(b)),
        None => format!(
            "before every sample, {with} max(2 × L2, 32 MiB) = {}",
            bytes((2 * l2_bytes).max(32 << 20))
        ),
    }
}

/// A timing in words.
pub(super) fn timing_text(t: Timing, p: &Protocol, l2_bytes: u64) -> String {
    match t {
        Timing::Cold => format!("cold: one launch per sample, L2 flushed {}", {
            let f = flush_text(p, l2_bytes);
            f.strip_prefix("before every sample, ")
                .map(|x| format!("by {x}"))
                .unwrap_or(f)
        }),
        Timing::Hot => "hot: one launch per sample, L2 as the previous launch left it".into(),
        Timing::Graph => format!(
            "graph: {} launches captured in one CUDA graph and replayed, a sample is the time per launch (no flush)",
            p.graph_calls
        ),
    }
}

pub(super) fn protocol(a: &Analysis<'_, '_, '_>) -> Vec<Row> {
    let h = a.group.header;
    let p = &h.protocol;
    let l2 = h.device.l2_bytes;
    vec![
        row("Timing", timing_text(p.timing, p, l2)),
        row(
            "Finalists also re-timed",
            if p.retime_with.is_empty() {
                "no".to_string()
            } else {
                p.retime_with
                    .iter()
                    .map(|t| timing_text(*t, p, l2))
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        ),
        row(
            "Warm-up",
            format!(
                "at least {} and {} ms",
                num::count(p.warmup_launches, "launch", "launches"),
                trim_float(p.warmup_ms)
            ),
        ),
        row("L2 flush", flush_text(p, l2)),
        row(
            "Batch",
            format!("{} samples per host synchronisation", p.batch),
        ),
        row("Samples", format!("{} to {}", p.min_samples, p.max_samples)),
        row(
            "Stop when",
            format!(
                "the 95 % CI of the median is within ±{} % of it{}",
                trim_float(p.target_ci * 100.0),
                race_text(p.race)
            ),
        ),
        row(
            "Caps per job",
            format!(
                "{} ms of GPU time, {} ms of wall time{}",
                trim_float(p.max_gpu_ms),
                trim_float(p.max_wall_ms),
                if a.gpu {
                    " (capped jobs are flagged CAP_HIT)"
                } else {
                    ""
                }
            ),
        ),
        row(
            "Finalists",
            if p.finalists > 0 {
                format!(
                    "top {} per (shape, method) re-timed interleaved{}",
                    p.finalists,
                    rest_text(p.retime_rest)
                )
            } else {
                "none".into()
            },
        ),
        row("Timeout", format!("{} s per job", trim_float(p.timeout_s))),
        row("Seed", p.seed.to_string()),
        row("Tolerance", tolerance(&h.tolerance)),
    ]
}

pub(super) fn trim_float(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

pub(super) fn tolerance(t: &crate::manifest::Tolerance) -> String {
    let t = serde_json::to_value(t).expect("tolerance serialises");
    fn flat(prefix: &str, v: &Json, out: &mut Vec<String>) {
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

/// Racing's rule (`protocol.race`); empty when off, as every run before
/// 2026-11-24 was.
pub fn race_text(race: f64) -> String {
    if race > 0.0 {
        format!(
            ", or (racing) at the minimum once it lies wholly over {} % above the best median so far: OUTPACED",
            trim_float(race * 100.0)
        )
    } else {
        String::new()
    }
}

/// How the finalists' re-timing rested the GPU (`protocol.retime_rest`);
/// empty for back to back, as every run before 2026-11-24 re-timed.
pub fn rest_text(rest: f64) -> String {
    if rest > 0.0 {
        format!(
            ", the GPU idle {}× each batch's kernel time after it",
            trim_float(rest)
        )
    } else {
        String::new()
    }
}

#[cfg(test)]
mod time_tests {
    use super::{duration, rfc3339_seconds};

    #[test]
    fn rfc3339_times_convert_to_epoch_seconds() {
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_seconds("2026-11-21T21:40:00Z"), Some(1_795_297_200));
        assert_eq!(
            rfc3339_seconds("2024-03-01T00:00:01Z").unwrap()
                - rfc3339_seconds("2024-02-28T00:00:01Z").unwrap(),
            2 * 86_400
        );
        assert_eq!(rfc3339_seconds("garbage"), None);
    }

    #[test]
    fn short_durations_keep_a_decimal() {
        assert_eq!(duration(0.0), "< 0.1 s");
        assert_eq!(duration(0.44), "0.4 s");
        assert_eq!(duration(12.04), "12.0 s");
        assert_eq!(duration(59.97), "1 min 00 s");
        assert_eq!(duration(798.0), "13 min 18 s");
        assert_eq!(duration(7500.0), "2 h 05 min");
    }
}
