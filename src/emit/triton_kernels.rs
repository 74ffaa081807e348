//! `triton_kernels_json`: the best opt_flags constraints of OpenAI's
//! triton_kernels MoE (the moe problem's `triton_kernels` method), per M.
//!
//! triton_kernels reads no tuned file: its heuristic (`opt_flags`) picks each
//! matmul's tiles at call time, within the constraints a process sets with
//! `update_opt_flags_constraints`. This file holds the constraints a run
//! found best, and `tunelab.triton_kernels_constraints` (Python) sets them
//! in a vLLM process before each of vLLM's two `matmul_ogs` calls
//! (docs/peers.md).
//!
//! # File
//!
//! One file per rendered path; every shape of a file must have the same
//! fields but `M` (the usual template
//! `triton_kernels/E={{E}},N={{N}},device_name={{device.vllm_name}},dtype={{dtype}}.json`).
//! Its content, 4-space indented with a trailing newline:
//!
//! ```json
//! {
//!     "format": "tunelab_triton_kernels_constraints",
//!     "version": 1,
//!     "device_name": "NVIDIA_H200",
//!     "triton_kernels": "the method's description as the run recorded it",
//!     "shape": {"E": 128, "topk": 4, "K": 2880, "N": 2880, "dtype": "mxfp4", ...},
//!     "M": {
//!         "1": {"w1": {"split_k": 1}, "w2": {"split_k": 1}, "us": 61.2},
//!         ...
//!     }
//! }
//! ```
//!
//! `M` keys are the tuned M values, sorted numerically. `w1` holds the
//! gate/up matmul's constraints, `w2` the down matmul's: the config's
//! nonzero `w1_<key>` and `w2_<key>` values for the keys triton_kernels
//! takes ([`CONSTRAINTS`]); 0 (no constraint, the heuristic's choice) is
//! left out, so `{}` means the bare heuristic. `us` is the time the run
//! ranked the config by (for the reader; the applier ignores it). A
//! consumer takes the key nearest to its batch's M, the first in file
//! order on a tie, as vLLM does with its fused-MoE files.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use super::select::json_int;
use super::vllm::{device_name, to_json_indent4};
use super::{EmitError, Group};

/// The version of the file's layout.
pub const VERSION: i64 = 1;
/// The matmuls of the call: gate/up, then down (config key prefixes).
pub const MATMULS: [&str; 2] = ["w1", "w2"];
/// The opt_flags constraints the method's configs may carry per matmul, as
/// `tunelab.problems.moe_triton_kernels.CONSTRAINTS` lists them.
pub const CONSTRAINTS: [&str; 5] = [
    "block_m",
    "block_k",
    "split_k",
    "num_stages",
    "epilogue_subtile",
];

/// Whether a config holds triton_kernels constraints (feeds this output
/// when the output names no method).
pub fn is_constraint_config(config: &indexmap::IndexMap<String, Json>) -> bool {
    config.keys().any(|k| constraint_key(k).is_some())
}

/// (matmul, constraint) of a config key such as `w1_block_m`.
fn constraint_key(key: &str) -> Option<(&'static str, &'static str)> {
    let (prefix, rest) = key.split_once('_')?;
    let matmul = MATMULS.iter().find(|m| **m == prefix)?;
    let name = CONSTRAINTS.iter().find(|c| **c == rest)?;
    Some((matmul, name))
}

pub fn render(group: &Group<'_, '_>) -> Result<Option<String>, EmitError> {
    let by_m = group.bests_by_m()?;
    let Some((first_shape, _)) = by_m.values().next() else {
        return Ok(None);
    };
    let mut shape = first_shape.shape.clone();
    shape.shift_remove("M");
    for (other, _) in by_m.values() {
        let mut fields = other.shape.clone();
        fields.shift_remove("M");
        if fields != shape {
            return Err(group.data_error(format!(
                "shapes {} and {} differ in more than M; one file holds the constraints of one shape at every M: put the fields that differ in the path",
                first_shape.key, other.key
            )));
        }
    }
    let mut entries = serde_json::Map::new();
    for (m, (shape_outcome, best)) in &by_m {
        let mut per_matmul: BTreeMap<&str, serde_json::Map<String, Json>> = MATMULS
            .iter()
            .map(|m| (*m, serde_json::Map::new()))
            .collect();
        for (key, value) in &best.job.config {
            let Some((matmul, name)) = constraint_key(key) else {
                continue;
            };
            let v = json_int(value).ok_or_else(|| {
                group.data_error(format!(
                    "`{key}` of job {} (shape {}) is {value}, not an integer",
                    best.job.job_id, shape_outcome.key
                ))
            })?;
            if v < 0 {
                return Err(group.data_error(format!(
                    "`{key}` of job {} is {v}; constraints are 0 (none) or positive",
                    best.job.job_id
                )));
            }
            if v > 0 {
                per_matmul
                    .get_mut(matmul)
                    .expect("every matmul has an entry")
                    .insert(name.to_string(), Json::from(v));
            }
        }
        let mut entry = serde_json::Map::new();
        for matmul in MATMULS {
            entry.insert(matmul.to_string(), Json::Object(per_matmul[matmul].clone()));
        }
        entry.insert("us".into(), Json::from(round3(best.time_us())));
        entries.insert(m.to_string(), Json::Object(entry));
    }
    let description = best_method_description(group, &by_m);
    let mut doc = serde_json::Map::new();
    doc.insert(
        "format".into(),
        Json::from("tunelab_triton_kernels_constraints"),
    );
    doc.insert("version".into(), Json::from(VERSION));
    doc.insert(
        "device_name".into(),
        Json::from(device_name(&group.header.device)),
    );
    doc.insert(
        "triton_kernels".into(),
        description.map_or(Json::Null, Json::from),
    );
    doc.insert("shape".into(), Json::Object(shape.into_iter().collect()));
    doc.insert("M".into(), Json::Object(entries));
    Ok(Some(to_json_indent4(&Json::Object(doc)) + "\n"))
}

/// The recorded description of the method whose configs the file holds
/// (which triton_kernels ran), when one method gave every entry.
fn best_method_description<T>(
    group: &Group<'_, '_>,
    by_m: &BTreeMap<i64, (T, super::Timed<'_>)>,
) -> Option<String> {
    let mut methods = by_m.values().map(|(_, best)| best.job.method.as_str());
    let first = methods.next()?;
    if methods.any(|m| m != first) {
        return None;
    }
    group
        .header
        .methods
        .iter()
        .find(|m| m.name == first)
        .and_then(|m| m.description.clone())
}

/// Microseconds to three decimals, so the file does not carry float noise.
fn round3(us: f64) -> f64 {
    (us * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraint_keys_are_prefixed_by_their_matmul() {
        assert_eq!(constraint_key("w1_block_m"), Some(("w1", "block_m")));
        assert_eq!(
            constraint_key("w2_epilogue_subtile"),
            Some(("w2", "epilogue_subtile"))
        );
        assert_eq!(constraint_key("w3_block_m"), None);
        assert_eq!(constraint_key("w1_block_n"), None);
        assert_eq!(constraint_key("BLOCK_SIZE_M"), None);
        let config = indexmap::IndexMap::from([
            ("BLOCK_SIZE_M".to_string(), Json::from(16)),
            ("num_warps".to_string(), Json::from(4)),
        ]);
        assert!(!is_constraint_config(&config));
        let config = indexmap::IndexMap::from([("w2_split_k".to_string(), Json::from(0))]);
        assert!(is_constraint_config(&config));
    }

    #[test]
    fn times_keep_three_decimals() {
        assert_eq!(round3(61.23456), 61.235);
        assert_eq!(round3(2.0), 2.0);
    }
}
