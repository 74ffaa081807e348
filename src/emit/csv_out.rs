//! `jobs_csv`, `jobs_json` and `best_csv`: the raw record of a run, and the
//! winners, for people with pandas.
//!
//! `jobs_csv`: one row per job (the latest record per job id), in journal
//! order; every candidate, like aiter's `--profile_file`. Columns:
//!
//! | column | meaning |
//! | --- | --- |
//! | `job_id`, `method`, `kind`, `kernel` | the job |
//! | one column per shape field (`M`, `N`, `K`, `dtype`, ...) | named as the field; a field whose name is one of the fixed columns is written `shape.<name>` |
//! | `cfg.<name>` per config field | config fields, union over the file's jobs in first-seen order; empty where a job has no such field |
//! | `baseline` | 1 for the method's baseline config, else 0 |
//! | `status` | ok, checked, failed, pruned |
//! | `failure_class`, `failure_message` | empty unless failed |
//! | `passed`, `max_abs_err`, `max_rel_err`, `mismatch_frac`, `nan_count` | correctness gate; empty when not checked |
//! | `n`, `median_us`, `ci_low_us`, `ci_high_us`, `min_us`, `q1_us`, `q3_us`, `mean_us`, `cv` | the job's own timing statistics |
//! | `flags` | noise flags joined with `\|` |
//! | `timer`, `sm_clock_mhz` | `cuda_event` or `wall`; SM clock during sampling |
//! | `tflops`, `gbs`, `roofline_pct` | throughput from the job's own median |
//! | `compile_s` | compile time |
//! | `n_regs`, `n_spills`, `shared_bytes` | what the compiler made of the job's kernels: the most registers per thread, the registers spilled per thread summed over them, the most shared memory per block; empty where nothing was compiled |
//! | `kernels` | each kernel as `name regs/spills/shared` (`matmul_kernel 168r/0s/49152B`), joined with `\|` |
//! | `final_median_us`, `final_ci_low_us`, `final_ci_high_us`, `tied_with_best` | finalist re-timing, empty if not a finalist |
//! | `time_us` | the time the selection rule uses (final median, else own median) |
//! | `flops`, `bytes`, `gpu_ms`, `wall_ms`, `duration_s`, `lane`, `finished_at` | bookkeeping |
//!
//! Booleans are 1/0; floats are written losslessly (shortest round-trip form);
//! JSON values of shape and config fields are written bare (strings without
//! quotes, lists as JSON).
//!
//! `jobs_json`: a JSON array of the job records as the journal holds them
//! (2-space indent, trailing newline).
//!
//! `best_csv`: one row per (shape, method) that has a best, in shape then method order:
//! shape fields, `method`, `kind`, `job_id`, `config` (compact JSON object),
//! `median_us`, `ci_low_us`, `ci_high_us`, `n` (from the statistics the time
//! came from), `finalist` (1 when the time is the finalist re-timing),
//! `tflops`, `gbs`, `roofline_pct` (at that time), `baseline_job_id`,
//! `baseline_us`, `speedup_vs_baseline`, `flags`.

use indexmap::IndexSet;

use super::num::{exact, exact_opt, json_cell};
use super::{EmitError, Group};
use crate::store::JobStatus;

const JOB_FIXED: &[&str] = &[
    "job_id",
    "method",
    "kind",
    "kernel",
    "baseline",
    "status",
    "failure_class",
    "failure_message",
    "passed",
    "max_abs_err",
    "max_rel_err",
    "mismatch_frac",
    "nan_count",
    "n",
    "median_us",
    "ci_low_us",
    "ci_high_us",
    "min_us",
    "q1_us",
    "q3_us",
    "mean_us",
    "cv",
    "flags",
    "timer",
    "sm_clock_mhz",
    "tflops",
    "gbs",
    "roofline_pct",
    "compile_s",
    "n_regs",
    "n_spills",
    "shared_bytes",
    "kernels",
    "final_median_us",
    "final_ci_low_us",
    "final_ci_high_us",
    "tied_with_best",
    "time_us",
    "flops",
    "bytes",
    "gpu_ms",
    "wall_ms",
    "duration_s",
    "lane",
    "finished_at",
];

const BEST_FIXED: &[&str] = &[
    "method",
    "kind",
    "job_id",
    "config",
    "median_us",
    "ci_low_us",
    "ci_high_us",
    "n",
    "finalist",
    "tflops",
    "gbs",
    "roofline_pct",
    "baseline_job_id",
    "baseline_us",
    "speedup_vs_baseline",
    "flags",
];

fn shape_column(name: &str, fixed: &[&str]) -> String {
    if fixed.contains(&name) {
        format!("shape.{name}")
    } else {
        name.to_string()
    }
}

fn bit(b: bool) -> String {
    if b { "1" } else { "0" }.into()
}

fn status_name(s: JobStatus) -> &'static str {
    match s {
        JobStatus::Ok => "ok",
        JobStatus::Checked => "checked",
        JobStatus::Failed => "failed",
        JobStatus::Pruned => "pruned",
        JobStatus::Skipped => "skipped",
    }
}

fn writer() -> csv::Writer<Vec<u8>> {
    csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new())
}

pub(crate) fn finish(group: &Group<'_, '_>, w: csv::Writer<Vec<u8>>) -> Result<String, EmitError> {
    let bytes = w
        .into_inner()
        .map_err(|e| group.data_error(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| group.data_error(e.to_string()))
}

pub(crate) fn csv_error(group: &Group<'_, '_>, e: csv::Error) -> EmitError {
    group.data_error(e.to_string())
}

pub fn jobs_csv(group: &Group<'_, '_>) -> Result<String, EmitError> {
    let jobs = group.jobs();
    let mut shape_fields: IndexSet<&str> = IndexSet::new();
    let mut config_fields: IndexSet<&str> = IndexSet::new();
    for j in &jobs {
        shape_fields.extend(j.shape.keys().map(String::as_str));
        config_fields.extend(j.config.keys().map(String::as_str));
    }

    let mut header: Vec<String> = JOB_FIXED[..4].iter().map(|s| s.to_string()).collect();
    header.extend(shape_fields.iter().map(|f| shape_column(f, JOB_FIXED)));
    header.extend(config_fields.iter().map(|f| format!("cfg.{f}")));
    header.extend(JOB_FIXED[4..].iter().map(|s| s.to_string()));

    let mut w = writer();
    w.write_record(&header).map_err(|e| csv_error(group, e))?;
    for j in jobs {
        let fin = group.sel.final_of(&j.job_id);
        let mut row: Vec<String> = vec![
            j.job_id.clone(),
            j.method.clone(),
            j.kind.as_str().to_string(),
            j.kernel.clone(),
        ];
        row.extend(
            shape_fields
                .iter()
                .map(|f| j.shape.get(*f).map(json_cell).unwrap_or_default()),
        );
        row.extend(
            config_fields
                .iter()
                .map(|f| j.config.get(*f).map(json_cell).unwrap_or_default()),
        );
        row.push(bit(j.baseline));
        row.push(status_name(j.status).into());
        row.push(
            j.failure
                .as_ref()
                .map(|f| f.class.as_str().to_string())
                .unwrap_or_default(),
        );
        row.push(
            j.failure
                .as_ref()
                .map(|f| f.message.clone())
                .unwrap_or_default(),
        );
        match &j.check {
            Some(c) => {
                row.push(bit(c.passed));
                row.push(exact_opt(c.max_abs_err));
                row.push(exact_opt(c.max_rel_err));
                row.push(exact(c.mismatch_frac));
                row.push(c.nan_count.to_string());
            }
            None => row.resize(row.len() + 5, String::new()),
        }
        match &j.stats {
            Some(s) => {
                row.push(s.n.to_string());
                for v in [
                    s.median_us,
                    s.ci_low_us,
                    s.ci_high_us,
                    s.min_us,
                    s.q1_us,
                    s.q3_us,
                    s.mean_us,
                    s.cv,
                ] {
                    row.push(exact(v));
                }
                row.push(flag_text(&s.flags));
                row.push(s.timer.as_str().to_string());
                row.push(exact_opt(s.sm_clock_mhz));
            }
            None => row.resize(row.len() + 12, String::new()),
        }
        row.push(exact_opt(j.tflops));
        row.push(exact_opt(j.gbs));
        row.push(exact_opt(j.roofline_pct));
        row.push(exact_opt(j.compile_s));
        row.push(j.max_regs().map(|n| n.to_string()).unwrap_or_default());
        row.push(j.spills().map(|n| n.to_string()).unwrap_or_default());
        row.push(j.max_shared().map(|n| n.to_string()).unwrap_or_default());
        row.push(kernel_text(&j.kernels));
        match fin {
            Some(f) => {
                row.push(exact(f.stats.median_us));
                row.push(exact(f.stats.ci_low_us));
                row.push(exact(f.stats.ci_high_us));
                row.push(bit(f.tied_with_best));
            }
            None => row.resize(row.len() + 4, String::new()),
        }
        row.push(exact_opt(group.sel.time_of(j)));
        row.push(exact_opt(j.flops));
        row.push(exact_opt(j.bytes));
        row.push(
            j.stats
                .as_ref()
                .map(|s| exact(s.gpu_ms))
                .unwrap_or_default(),
        );
        row.push(
            j.stats
                .as_ref()
                .map(|s| exact(s.wall_ms))
                .unwrap_or_default(),
        );
        row.push(exact(j.duration_s));
        row.push(j.lane.to_string());
        row.push(j.finished_at.clone());
        w.write_record(&row).map_err(|e| csv_error(group, e))?;
    }
    finish(group, w)
}

pub fn jobs_json(group: &Group<'_, '_>) -> Result<String, EmitError> {
    let jobs = group.jobs();
    let text = serde_json::to_string_pretty(&jobs).map_err(|e| group.data_error(e.to_string()))?;
    Ok(text + "\n")
}

pub fn best_csv(group: &Group<'_, '_>) -> Result<String, EmitError> {
    let mut shape_fields: IndexSet<&str> = IndexSet::new();
    for s in &group.shapes {
        shape_fields.extend(s.shape.keys().map(String::as_str));
    }
    let mut header: Vec<String> = shape_fields
        .iter()
        .map(|f| shape_column(f, BEST_FIXED))
        .collect();
    header.extend(BEST_FIXED.iter().map(|s| s.to_string()));

    let mut w = writer();
    w.write_record(&header).map_err(|e| csv_error(group, e))?;
    for s in &group.shapes {
        for m in &s.methods {
            let Some(b) = m.best else { continue };
            let mut row: Vec<String> = shape_fields
                .iter()
                .map(|f| s.shape.get(*f).map(json_cell).unwrap_or_default())
                .collect();
            row.push(m.method.to_string());
            row.push(m.kind.as_str().to_string());
            row.push(b.job.job_id.clone());
            row.push(
                serde_json::to_string(&b.job.config)
                    .map_err(|e| group.data_error(e.to_string()))?,
            );
            row.push(exact(b.stats.median_us));
            row.push(exact(b.stats.ci_low_us));
            row.push(exact(b.stats.ci_high_us));
            row.push(b.stats.n.to_string());
            row.push(bit(b.is_final()));
            row.push(exact_opt(b.tflops()));
            row.push(exact_opt(b.gbs()));
            row.push(exact_opt(b.roofline_pct()));
            row.push(m.baseline.map(|t| t.job.job_id.clone()).unwrap_or_default());
            row.push(exact_opt(m.baseline.map(|t| t.time_us())));
            row.push(exact_opt(m.speedup()));
            row.push(flag_text(&b.stats.flags));
            w.write_record(&row).map_err(|e| csv_error(group, e))?;
        }
    }
    finish(group, w)
}

/// Flags as CSV cells write them: `NOISY|DRIFT`.
fn flag_text(flags: &[crate::measure::Flag]) -> String {
    flags
        .iter()
        .map(|f| f.as_str())
        .collect::<Vec<_>>()
        .join("|")
}

/// Kernels as a CSV cell writes them: `name 168r/0s/49152B|...`, `?` for an
/// unknown count.
fn kernel_text(kernels: &[crate::store::KernelResources]) -> String {
    let n = |v: Option<u32>| v.map_or("?".to_string(), |v| v.to_string());
    kernels
        .iter()
        .map(|k| {
            format!(
                "{} {}r/{}s/{}B",
                k.name,
                n(k.n_regs),
                n(k.n_spills),
                k.shared
            )
        })
        .collect::<Vec<_>>()
        .join("|")
}
