//! `vllm_moe_json`: vLLM fused-MoE config files.
//!
//! One file per rendered path (the usual template
//! `vllm/E={{E}},N={{N}},device_name={{device.vllm_name}}.json` gives one per
//! (E, N)). Content, as vLLM's `benchmarks/kernels/benchmark_moe.py` writes it
//! (`json.dump({"triton_version": triton.__version__, **configs}, f, indent=4)`
//! then a newline):
//!
//! - `"triton_version"` first (from the run's fingerprint; `"unknown"` when
//!   the worker did not report one: vLLM's loader pops the key whatever its value);
//! - then one entry per shape with a best, keyed by the shape's `M` as a
//!   decimal string, sorted numerically, each holding `BLOCK_SIZE_M`,
//!   `BLOCK_SIZE_N`, `BLOCK_SIZE_K`, `GROUP_SIZE_M`, `num_warps`, `num_stages`
//!   in that order as integers, followed by `waves_per_eu`,
//!   `matrix_instr_nonkdim` and `kpack` only where the config has them (ROCm
//!   spaces; vLLM's tuner appends them the same way);
//! - 4-space indentation, `": "` between key and value, a trailing newline.
//!
//! vLLM picks the key nearest to the batch's M (`min(keys, key=|k - M|)`).
//! Two shapes of one file with the same M (a path template that leaves out a
//! field that differs) are an error, not a silent choice.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value as Json;

use super::select::json_int;
use super::{EmitError, Group};

/// Config fields every vLLM MoE config has, in vLLM's order.
pub const REQUIRED: [&str; 6] = [
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
];
/// Fields vLLM's tuner appends when present (ROCm).
const OPTIONAL: [&str; 3] = ["waves_per_eu", "matrix_instr_nonkdim", "kpack"];

pub fn render(group: &Group<'_, '_>) -> Result<Option<String>, EmitError> {
    let mut by_m: BTreeMap<i64, serde_json::Map<String, Json>> = BTreeMap::new();
    for (m, (shape, best)) in group.bests_by_m()? {
        let mut config = serde_json::Map::new();
        for field in REQUIRED.iter().chain(OPTIONAL.iter()) {
            let value = match best.job.config.get(*field) {
                Some(v) => v,
                None if OPTIONAL.contains(field) => continue,
                None => {
                    return Err(group.data_error(format!(
                        "the best config of shape {} (job {}) has no `{field}`",
                        shape.key, best.job.job_id
                    )))
                }
            };
            let int = json_int(value).ok_or_else(|| {
                group.data_error(format!(
                    "`{field}` of job {} is {value}, not an integer",
                    best.job.job_id
                ))
            })?;
            config.insert(field.to_string(), Json::from(int));
        }
        by_m.insert(m, config);
    }
    if by_m.is_empty() {
        return Ok(None);
    }

    let mut doc = serde_json::Map::new();
    let triton = group
        .header
        .fingerprint
        .triton
        .clone()
        .unwrap_or_else(|| "unknown".into());
    doc.insert("triton_version".into(), Json::String(triton));
    for (m, config) in by_m {
        doc.insert(m.to_string(), Json::Object(config));
    }
    Ok(Some(to_json_indent4(&Json::Object(doc)) + "\n"))
}

/// JSON with 4-space indentation, as Python's `json.dump(..., indent=4)` writes it.
pub fn to_json_indent4(value: &Json) -> String {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    value.serialize(&mut ser).expect("a JSON value serialises");
    String::from_utf8(buf).expect("serde_json writes UTF-8")
}
