//! Reading a consumer's shipped tuned file, to time its configs beside
//! tunelab's (`run --compare-to`) and compare against it (`tunelab compare`).
//!
//! vLLM fused-MoE files: named
//! `E={E},N={N},device_name={device}[,dtype={d}][,block_shape=[bn,bk]].json`,
//! holding an object keyed by M (decimal strings), each a config of
//! BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps and
//! num_stages, plus an optional top-level `triton_version`. vLLM uses, for a
//! given M, the entry whose key is nearest to it (the first of equals).

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde_json::Value as Json;

use crate::manifest::{FixedConfigs, OutputFormat};

/// A consumer's tuned file, read.
#[derive(Debug, Clone)]
pub struct ShippedFile {
    pub path: PathBuf,
    pub format: OutputFormat,
    /// What its name says: E, N, the device name, the dtype suffix if any.
    pub experts: i64,
    pub n: i64,
    pub device_name: String,
    pub dtype: Option<String>,
    /// Configs by M, in the file's order.
    pub by_m: Vec<(i64, IndexMap<String, Json>)>,
}

impl ShippedFile {
    /// The configs as a method's fixed configs: shapes with the file's E and N.
    pub fn fixed_configs(&self) -> FixedConfigs {
        let mut matches = IndexMap::new();
        matches.insert("E".to_string(), Json::from(self.experts));
        matches.insert("N".to_string(), Json::from(self.n));
        FixedConfigs {
            matches,
            by_m: self.by_m.clone(),
        }
    }

    /// `E=128,N=2880`: what a method timing this file is called after.
    pub fn short_name(&self) -> String {
        format!("E={},N={}", self.experts, self.n)
    }
}

/// Reads a vLLM fused-MoE config file; the error says what is wrong with it.
pub fn read(path: &Path) -> Result<ShippedFile, String> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".json"))
        .ok_or("a vLLM fused-MoE file name ends in .json")?;
    let fields = name_fields(name)?;
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let int = |key: &str| -> Result<i64, String> {
        get(key)
            .ok_or(format!("its name has no `{key}=`"))?
            .parse()
            .map_err(|_| format!("`{key}=` in its name is not a whole number"))
    };
    let (experts, n) = (int("E")?, int("N")?);
    let device_name = get("device_name").ok_or("its name has no `device_name=`")?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let json: Json = serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
    let object = json
        .as_object()
        .ok_or("it must hold an object keyed by M")?;
    let mut by_m = Vec::new();
    for (key, value) in object {
        if key == "triton_version" {
            continue;
        }
        let m: i64 = key
            .parse()
            .map_err(|_| format!("key `{key}` is not an M (a whole number)"))?;
        let entry = value
            .as_object()
            .ok_or(format!("the entry for M={m} is not an object"))?;
        let mut config = IndexMap::new();
        for k in super::vllm::REQUIRED {
            let v = entry
                .get(k)
                .and_then(Json::as_i64)
                .ok_or(format!("the entry for M={m} has no whole-number `{k}`"))?;
            config.insert(k.to_string(), Json::from(v));
        }
        by_m.push((m, config));
    }
    if by_m.is_empty() {
        return Err("it holds no configs".into());
    }
    Ok(ShippedFile {
        path: path.to_path_buf(),
        format: OutputFormat::VllmMoeJson,
        experts,
        n,
        device_name,
        dtype: get("dtype"),
        by_m,
    })
}

/// `E=128,N=2880,device_name=X,block_shape=[128,128]` -> (key, value) pairs;
/// the comma inside `block_shape=[...]` does not split.
fn name_fields(name: &str) -> Result<Vec<(String, String)>, String> {
    let mut fields = Vec::new();
    let mut rest = name;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once('=')
            .ok_or(format!("`{rest}` in its name is not key=value"))?;
        let end = if after.starts_with('[') {
            after.find(']').map(|i| i + 1).unwrap_or(after.len())
        } else {
            after.find(',').unwrap_or(after.len())
        };
        fields.push((key.to_string(), after[..end].to_string()));
        rest = after[end..].strip_prefix(',').unwrap_or(&after[end..]);
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_on_commas_outside_block_shapes() {
        let f =
            name_fields("E=8,N=64,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]")
                .unwrap();
        assert_eq!(f[3], ("dtype".to_string(), "fp8_w8a8".to_string()));
        assert_eq!(f[4], ("block_shape".to_string(), "[128,128]".to_string()));
    }

    #[test]
    fn the_shipped_h100_tune_reads_and_looks_up_like_vllm() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("experiments/shipped/vllm/E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json");
        let f = read(&path).unwrap();
        assert_eq!(
            (f.experts, f.n, f.device_name.as_str()),
            (128, 2880, "NVIDIA_H100_80GB_HBM3")
        );
        assert_eq!(f.by_m.len(), 18);
        let fixed = f.fixed_configs();
        let shape = |m: i64, e: i64| -> crate::manifest::Shape {
            serde_json::from_value(serde_json::json!({"M": m, "E": e, "N": 2880})).unwrap()
        };
        // M=3 is as near 2 as 4: the first of equals (2) wins, as in vLLM.
        assert_eq!(
            fixed.config_for(&shape(3, 128)),
            fixed.config_for(&shape(2, 128))
        );
        assert_eq!(
            fixed.config_for(&shape(5000, 128)),
            fixed.config_for(&shape(4096, 128))
        );
        assert!(
            fixed.config_for(&shape(1, 32)).is_none(),
            "another E is not this file's"
        );
    }
}
