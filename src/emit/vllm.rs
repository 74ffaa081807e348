//! `vllm_moe_json`: vLLM fused-MoE config files.
//!
//! # File name
//!
//! vLLM opens exactly one name per (E, N, device, quantisation) and reads
//! nothing else (vLLM `vllm/model_executor/layers/fused_moe/fused_moe.py`:
//! `get_config_file_name`, `get_moe_configs`, `try_get_optimal_moe_config`;
//! `_get_config_dtype_str` in `fused_moe/config.py`):
//!
//! `E={E},N={N},device_name={device}[,dtype={dtype}][,block_shape=[{bn},{bk}]].json`
//!
//! - `E` is the expert count, `N` the intermediate size per shard (the
//!   shape's `E` and `N`; vLLM takes it from the down projection's weight).
//! - `device` is the device's vLLM name, [`device_name`]: on NVIDIA the
//!   driver's name with spaces replaced by `_`, and `NVIDIA_H200` for any
//!   name with the word `H200` ([`crate::device::vllm_device_name`]).
//! - `dtype` from the shape's `dtype` field: none for `bf16`, `fp16` or no
//!   field; `float32` for `fp32`; `fp8_w8a8` for `fp8` (fp8 weights and
//!   activations); vLLM's own spellings `fp8_w8a8`, `fp8_w8a16`, `int8_w8a16`,
//!   `int4_w4a16` as they are. `int8_w8a8` is refused: vLLM looks those configs
//!   up under the unquantised name, where they would replace bf16's.
//! - `block_shape` from the shape's optional `block_shape` field, a list of two
//!   positive integers `[block_n, block_k]` (block-wise quantisation), written
//!   without spaces as vLLM writes it. It needs a quantised `dtype`. An
//!   optional `weight_quant` field (`per_tensor`, `per_channel`, `block`) is
//!   checked against it: `block` needs `block_shape`, the others forbid it.
//!
//! So a quantised moe shape reads, e.g., `{dtype: fp8, weight_quant: block,
//! block_shape: [128, 128]}`, and its file is
//! `E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json`.
//!
//! The path template decides where the file goes; its rendered file name
//! must be vLLM's name for the shapes in it, or rendering fails with the name
//! to use (the usual template is
//! `vllm/E={{E}},N={{N}},device_name={{device.vllm_name}}.json`, plus the
//! literal `,dtype=...` and `,block_shape=[...]` parts for quantised shapes).
//! All shapes of one file must give the same name.
//!
//! # Content
//!
//! As vLLM's `benchmarks/kernels/benchmark_moe.py` writes it
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
//! vLLM picks the key nearest to the batch's M (`min(keys, key=|k - M|)`,
//! the first in file order on a tie). Every tuned M is a key, so each is
//! found exactly. Two shapes of one file with the same M (a path template
//! that leaves out a field that differs) are an error, not a silent choice.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value as Json;

use super::num::json_text;
use super::select::{json_int, ShapeFields};
use super::{EmitError, Group};
use crate::device::DeviceInfo;

/// What vLLM's config file name is made of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub e: i64,
    pub n: i64,
    pub device_name: String,
    /// vLLM's dtype string (`fp8_w8a8`, ...); `None` for bf16 and fp16.
    pub dtype: Option<String>,
    /// `[block_n, block_k]` of block-wise quantisation.
    pub block_shape: Option<[i64; 2]>,
}

impl fmt::Display for FileKey {
    /// The file name, as `get_config_file_name` makes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "E={},N={},device_name={}",
            self.e, self.n, self.device_name
        )?;
        if let Some(d) = &self.dtype {
            write!(f, ",dtype={d}")?;
        }
        if let Some([bn, bk]) = self.block_shape {
            write!(f, ",block_shape=[{bn},{bk}]")?;
        }
        f.write_str(".json")
    }
}

impl FileKey {
    /// The key of a vLLM config file name; `None` for a name vLLM would never make.
    pub fn parse(file_name: &str) -> Option<FileKey> {
        let rest = file_name.strip_suffix(".json")?.strip_prefix("E=")?;
        let (e, rest) = rest.split_once(",N=")?;
        let (n, rest) = rest.split_once(",device_name=")?;
        let (rest, block_shape) = match rest.rfind(",block_shape=[") {
            Some(i) => {
                let inner = rest[i + ",block_shape=[".len()..].strip_suffix(']')?;
                let (bn, bk) = inner.split_once(',')?;
                (&rest[..i], Some([bn.parse().ok()?, bk.parse().ok()?]))
            }
            None => (rest, None),
        };
        let (device_name, dtype) = match rest.rfind(",dtype=") {
            Some(i) => (&rest[..i], Some(rest[i + ",dtype=".len()..].to_string())),
            None => (rest, None),
        };
        let key = FileKey {
            e: e.parse().ok()?,
            n: n.parse().ok()?,
            device_name: device_name.to_string(),
            dtype,
            block_shape,
        };
        (!key.device_name.is_empty() && key.to_string() == file_name).then_some(key)
    }

    /// The file vLLM reads the configs of `shape` from on a device of this vLLM name.
    pub fn for_shape(shape: &ShapeFields, device_name: &str) -> Result<FileKey, String> {
        let int = |field: &str| {
            shape
                .get(field)
                .and_then(json_int)
                .ok_or_else(|| format!("no integer field `{field}`"))
        };
        let dtype_field = shape.get("dtype").map(json_text);
        let dtype = config_dtype(dtype_field.as_deref())?;
        let block_shape = match shape.get("block_shape") {
            None | Some(Json::Null) => None,
            Some(v) => Some(block_shape(v)?),
        };
        match shape.get("weight_quant").map(json_text).as_deref() {
            None => {}
            Some("block") if block_shape.is_none() => {
                return Err("`weight_quant: block` needs `block_shape: [block_n, block_k]`".into())
            }
            Some("per_tensor" | "per_channel") if block_shape.is_some() => return Err(
                "`block_shape` is for `weight_quant: block`, not per-tensor or per-channel scales"
                    .into(),
            ),
            Some("block" | "per_tensor" | "per_channel") => {}
            Some(other) => {
                return Err(format!(
                    "`weight_quant: {other}` is not one of per_tensor, per_channel, block"
                ))
            }
        }
        if block_shape.is_some() && !dtype.is_some_and(|d| d != "float32") {
            return Err(format!(
                "`block_shape` needs a quantised `dtype` (fp8, int8_w8a16, int4_w4a16), not {}",
                dtype_field.as_deref().unwrap_or("none")
            ));
        }
        Ok(FileKey {
            e: int("E")?,
            n: int("N")?,
            device_name: device_name.to_string(),
            dtype: dtype.map(str::to_string),
            block_shape,
        })
    }
}

/// vLLM's dtype string for a shape's `dtype` field (`_get_config_dtype_str`).
pub fn config_dtype(dtype: Option<&str>) -> Result<Option<&'static str>, String> {
    Ok(match dtype {
        None | Some("bf16" | "fp16") => None,
        Some("fp32") => Some("float32"),
        Some("fp8" | "fp8_w8a8") => Some("fp8_w8a8"),
        Some("fp8_w8a16") => Some("fp8_w8a16"),
        Some("int8_w8a16") => Some("int8_w8a16"),
        Some("int4_w4a16") => Some("int4_w4a16"),
        Some("int8_w8a8") => {
            return Err("vLLM looks int8_w8a8 configs up under the unquantised file name, where they would replace the bf16/fp16 configs; tunelab does not write them".into())
        }
        Some(other) => {
            return Err(format!(
                "dtype `{other}` has no vLLM config name (bf16, fp16, fp32, fp8, fp8_w8a8, fp8_w8a16, int8_w8a16, int4_w4a16)"
            ))
        }
    })
}

fn block_shape(v: &Json) -> Result<[i64; 2], String> {
    let bad =
        || format!("`block_shape` is {v}, not a list of two positive integers [block_n, block_k]");
    let items = v.as_array().ok_or_else(bad)?;
    match items.as_slice() {
        [a, b] => match (json_int(a), json_int(b)) {
            (Some(a), Some(b)) if a > 0 && b > 0 => Ok([a, b]),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The device name vLLM puts in file names on `device`: on NVIDIA vLLM's
/// rule applied to the driver's name (so a journal written before the rule
/// was fixed is checked against today's rule), elsewhere the name discovery
/// recorded.
pub fn device_name(device: &DeviceInfo) -> String {
    if device.backend == "cuda" {
        crate::device::vllm_device_name(&device.name)
    } else {
        device.vllm_name.clone()
    }
}

/// Checks that vLLM would open the group's file for its shapes.
fn check_file_name(group: &Group<'_, '_>) -> Result<(), EmitError> {
    let device = &group.header.device;
    let vllm_name = device_name(device);
    let mut expected: Option<(FileKey, &str)> = None;
    for shape in &group.shapes {
        let key = FileKey::for_shape(shape.shape, &vllm_name)
            .map_err(|m| group.data_error(format!("shape {}: {m}", shape.key)))?;
        match &expected {
            None => expected = Some((key, shape.key.as_str())),
            Some((first, first_shape)) if *first != key => {
                return Err(group.data_error(format!(
                    "shapes {first_shape} and {} belong in different vLLM files ({first} and {key}); put the fields that differ in the path",
                    shape.key
                )))
            }
            Some(_) => {}
        }
    }
    let Some((key, _)) = expected else {
        return Ok(());
    };
    let file = std::path::Path::new(&group.path)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = key.to_string();
    if file == name {
        return Ok(());
    }
    let mut template = "E={{E}},N={{N}},device_name={{device.vllm_name}}".to_string();
    if let Some(d) = &key.dtype {
        template.push_str(&format!(",dtype={d}"));
    }
    if let Some([bn, bk]) = key.block_shape {
        template.push_str(&format!(",block_shape=[{bn},{bk}]"));
    }
    let mut message = format!(
        "vLLM reads the configs of these shapes from `{name}` (E, N, the device's vLLM name, dtype and block shape, as get_config_file_name makes it) and never opens `{file}`; end the path with `{template}.json`"
    );
    if device.vllm_name != vllm_name {
        message.push_str(&format!(
            " (this journal recorded the device's vLLM name as `{}`, by an older rule; vLLM uses `{vllm_name}`)",
            device.vllm_name
        ));
    }
    Err(group.data_error(message))
}

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
pub const OPTIONAL: [&str; 3] = ["waves_per_eu", "matrix_instr_nonkdim", "kpack"];

pub fn render(group: &Group<'_, '_>) -> Result<Option<String>, EmitError> {
    check_file_name(group)?;
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
