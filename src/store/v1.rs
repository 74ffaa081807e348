//! Reading journals of format 1 (tunelab before 2026-11-23): run headers
//! without a `format` field. Frozen: these types describe files that exist
//! and never change again. Job records of format 1 are format 2's without
//! `kernels` (format 1 did not record what the compiler made of a job's
//! kernels: they read as none), and final records lack `timing`; the header
//! is migrated field by field.
//!
//! What changed in the header:
//! - `mode`, `run_mode`: free strings -> enums (same spellings);
//! - `search`: a label (`"halving"`, `"halving (eta 3)"`) -> strategy + parameters;
//! - `protocol`: `flush_l2` + optional `flush_with` (absent meant a memset:
//!   the option came later) + an unused `hot` -> one `flush` mode;
//! - `tolerance`: free JSON with per-dtype triples -> a typed record.
//!
//! And in finalist records, which follow their header's format: format 1
//! re-timed finalists one way only, cold, and did not say so.

use indexmap::IndexMap;
use serde::Deserialize;

use super::record::{Fingerprint, JobRecord, OutputSpec, RunHeader, SearchRecord};
use crate::device::DeviceInfo;
use crate::manifest::{DtypeOverride, Tolerance};
use crate::measure::{L2Flush, Protocol, Stats, Timing};
use crate::plan::{Mode, RunMode};
use crate::search::StrategyName;

#[derive(Debug, Deserialize)]
pub struct RunHeaderV1 {
    experiment: String,
    description: Option<String>,
    problem: String,
    mode: String,
    run_mode: String,
    device: DeviceInfo,
    outputs: Vec<OutputSpec>,
    protocol: ProtocolV1,
    search: String,
    tolerance: ToleranceV1,
    fingerprint: Fingerprint,
    started_at: String,
    planned_jobs: u64,
}

#[derive(Debug, Deserialize)]
struct ProtocolV1 {
    warmup_launches: u32,
    warmup_ms: f64,
    flush_l2: bool,
    flush_bytes: Option<u64>,
    #[serde(default)]
    flush_with: Option<String>,
    batch: u32,
    min_samples: u32,
    max_samples: u32,
    target_ci: f64,
    max_gpu_ms: f64,
    max_wall_ms: f64,
    finalists: u32,
    #[allow(dead_code)] // never true in a format-1 journal: the runner refused it
    hot: bool,
    timeout_s: f64,
    seed: u64,
}

#[derive(Debug, Deserialize)]
struct ToleranceV1 {
    atol: f64,
    rtol: f64,
    max_mismatch: f64,
    /// (atol, rtol, max_mismatch) overrides by dtype. Format 1 kept the
    /// tolerance as free JSON, and hand-written journals leave this out.
    #[serde(default)]
    per_dtype: IndexMap<String, OverrideV1>,
}

/// (atol, rtol, max_mismatch); `None` keeps the general value.
type OverrideV1 = (Option<f64>, Option<f64>, Option<f64>);

/// Why a format-1 header cannot be migrated.
#[derive(Debug)]
pub struct MigrationError(pub String);

impl RunHeaderV1 {
    /// The same header in format 2.
    pub fn migrate(self) -> Result<RunHeader, MigrationError> {
        let bad = |what: &str, v: &str| MigrationError(format!("unknown {what} `{v}`"));
        let mode = match self.mode.as_str() {
            "gpu" => Mode::Gpu,
            "interpreter" => Mode::Interpreter,
            other => return Err(bad("mode", other)),
        };
        let run_mode = match self.run_mode.as_str() {
            "tune" => RunMode::Tune,
            "bench" => RunMode::Bench,
            "check" => RunMode::Check,
            other => return Err(bad("run mode", other)),
        };
        let p = self.protocol;
        let flush = match (p.flush_l2, p.flush_with.as_deref()) {
            (false, _) => L2Flush::Off,
            (true, None | Some("memset")) => L2Flush::Memset,
            (true, Some("read")) => L2Flush::Read,
            (true, Some(other)) => return Err(bad("flush", other)),
        };
        let protocol = Protocol {
            warmup_launches: p.warmup_launches,
            warmup_ms: p.warmup_ms,
            timing: Timing::Cold,
            graph_calls: 10,
            retime_with: Vec::new(),
            flush,
            flush_bytes: p.flush_bytes,
            batch: p.batch,
            min_samples: p.min_samples,
            max_samples: p.max_samples,
            target_ci: p.target_ci,
            max_gpu_ms: p.max_gpu_ms,
            max_wall_ms: p.max_wall_ms,
            finalists: p.finalists,
            retime_rest: 0.0,
            race: 0.0,
            timeout_s: p.timeout_s,
            seed: p.seed,
        };
        let t = self.tolerance;
        let tolerance = Tolerance {
            atol: t.atol,
            rtol: t.rtol,
            max_mismatch: t.max_mismatch,
            per_dtype: t
                .per_dtype
                .into_iter()
                .map(|(dtype, (atol, rtol, max_mismatch))| {
                    (
                        dtype,
                        DtypeOverride {
                            atol,
                            rtol,
                            max_mismatch,
                        },
                    )
                })
                .collect(),
        };
        Ok(RunHeader {
            format: super::record::FORMAT_VERSION,
            experiment: self.experiment,
            description: self.description,
            problem: self.problem,
            mode,
            run_mode,
            device: self.device,
            outputs: self.outputs,
            protocol,
            search: search(&self.search).ok_or_else(|| bad("search", &self.search))?,
            tolerance,
            methods: Vec::new(),
            compared: Vec::new(),
            fingerprint: self.fingerprint,
            started_at: self.started_at,
            planned_jobs: self.planned_jobs,
        })
    }
}

/// A finalist re-timing of format 1: no `timing` (they were all cold).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinalRecordV1 {
    #[serde(rename = "type")]
    _type: String,
    job_id: String,
    stats: Stats,
    tied_with_best: bool,
}

impl FinalRecordV1 {
    pub fn migrate(self) -> super::record::FinalRecord {
        super::record::FinalRecord {
            job_id: self.job_id,
            timing: Timing::Cold,
            stats: self.stats,
            tied_with_best: self.tied_with_best,
        }
    }
}

/// A job record of format 1, read as format 2's with no `kernels`; `None`
/// when the line is not a job record lacking them.
pub fn job_record(line: &str) -> Option<Result<JobRecord, serde_json::Error>> {
    let mut value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = value.as_object_mut()?;
    if fields.get("type")?.as_str()? != "job" || fields.contains_key("kernels") {
        return None;
    }
    fields.remove("type");
    fields.insert("kernels".into(), serde_json::Value::Array(Vec::new()));
    Some(serde_json::from_value(value))
}

/// A format-1 search label: the strategy's name, with `(eta N)` after
/// `halving` in journals written by early builds.
fn search(label: &str) -> Option<SearchRecord> {
    let (name, rest) = label.split_once(' ').unwrap_or((label, ""));
    let strategy = match name {
        "grid" => StrategyName::Grid,
        "random" => StrategyName::Random,
        "halving" => StrategyName::Halving,
        "surrogate" => StrategyName::Surrogate,
        _ => return None,
    };
    let mut params = IndexMap::new();
    if let Some(eta) = rest.strip_prefix("(eta ").and_then(|r| r.strip_suffix(')')) {
        params.insert("eta".to_string(), eta.parse().ok()?);
    } else if !rest.is_empty() {
        return None;
    }
    Some(SearchRecord { strategy, params })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_1_search_labels_become_records() {
        let halving = search("halving (eta 3)").unwrap();
        assert_eq!(halving.strategy, StrategyName::Halving);
        assert_eq!(halving.params.get("eta"), Some(&3));
        assert_eq!(halving.label(), "halving (eta 3)");
        let grid = search("grid").unwrap();
        assert_eq!((grid.strategy, grid.params.len()), (StrategyName::Grid, 0));
        assert_eq!(search("random").unwrap().label(), "random");
        assert!(search("bogus").is_none());
        assert!(search("halving (eta x)").is_none());
    }
}
