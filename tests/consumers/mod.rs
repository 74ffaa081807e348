//! How each consumer of tunelab's tuned files finds a config, reimplemented
//! from the consumer's own source for tests to check tunelab's files against.
//! Written independently of tunelab's writers on purpose: a writer and its
//! test must not share a rule. Each function names the code it follows.

#![allow(dead_code)]

use std::collections::HashMap;

use serde_json::{Map, Value as Json};

/// A set of files by name: what a consumer opens.
pub type Files = HashMap<String, String>;

/// vLLM's fused-MoE config lookup.
pub mod vllm {
    use super::*;

    /// `get_config_file_name` (vllm/model_executor/layers/fused_moe/fused_moe.py):
    /// `current_platform.get_device_name().replace(" ", "_")`, then
    /// `NVIDIA_H200` if `"H200" in device_name.split("_")`.
    pub fn device_name(torch_name: &str) -> String {
        let name = torch_name.replace(' ', "_");
        if name.split('_').any(|w| w == "H200") {
            "NVIDIA_H200".to_string()
        } else {
            name
        }
    }

    /// `_get_config_dtype_str` (fused_moe/config.py): the quantisation's
    /// string, else `float32` for an fp32 MoE, else None.
    pub fn dtype_str(quant: Option<&'static str>, fp32: bool) -> Option<&'static str> {
        quant.or(fp32.then_some("float32"))
    }

    /// Python's `str([a, b])`: `[a, b]`.
    fn py_list(b: [i64; 2]) -> String {
        format!("[{}, {}]", b[0], b[1])
    }

    /// `get_config_file_name(E, N, dtype, block_shape)`.
    pub fn file_name(
        e: i64,
        n: i64,
        torch_name: &str,
        dtype: Option<&str>,
        block_shape: Option<[i64; 2]>,
    ) -> String {
        let dtype_selector = dtype.map(|d| format!(",dtype={d}")).unwrap_or_default();
        // `"" if not block_shape or not all(block_shape) else f",block_shape={block_shape}"`,
        // then `.replace(" ", "")`.
        let block_shape_selector = match block_shape {
            Some(b) if b.iter().all(|x| *x != 0) => {
                format!(",block_shape={}", py_list(b)).replace(' ', "")
            }
            _ => String::new(),
        };
        format!(
            "E={e},N={n},device_name={}{dtype_selector}{block_shape_selector}.json",
            device_name(torch_name)
        )
    }

    /// `get_moe_configs` + `try_get_optimal_moe_config`: open the file by its
    /// name, drop `triton_version`, turn keys into ints, take
    /// `configs[min(configs.keys(), key=lambda x: abs(x - M))]` (the first of
    /// equally near keys, in file order). `None`: no file, vLLM's defaults.
    pub fn lookup(
        files: &Files,
        torch_name: &str,
        e: i64,
        n: i64,
        dtype: Option<&str>,
        block_shape: Option<[i64; 2]>,
        m: i64,
    ) -> Option<(i64, Map<String, Json>)> {
        let text = files.get(&file_name(e, n, torch_name, dtype, block_shape))?;
        let mut doc: Map<String, Json> = serde_json::from_str(text).expect("vLLM json.load");
        doc.shift_remove("triton_version");
        let configs: Vec<(i64, Map<String, Json>)> = doc
            .into_iter()
            .map(|(k, v)| {
                (
                    k.parse().expect("int(key)"),
                    v.as_object().expect("a config").clone(),
                )
            })
            .collect();
        let mut best = configs.first()?;
        for c in &configs[1..] {
            if (c.0 - m).abs() < (best.0 - m).abs() {
                best = c;
            }
        }
        Some(best.clone())
    }
}

/// aiter's fused-MoE tuned-table lookup.
pub mod aiter_fmoe {
    use super::*;

    /// `nextPow2` and `get_padded_M` with `_PADDED_M_TIERS = [32768, 131072]`
    /// (aiter/fused_moe.py).
    pub fn padded_m(m: i64) -> i64 {
        const TIERS: [i64; 2] = [32768, 131072];
        if m < TIERS[0] {
            if m <= 1 {
                return 1;
            }
            let mut p = 1;
            while p < m {
                p *= 2;
            }
            return p;
        }
        for tier in TIERS.iter().rev() {
            if m >= *tier {
                return *tier;
            }
        }
        TIERS[0]
    }

    /// `gfx_from_cu_num` (aiter/jit/utils/chip_info.py): the arch of a row
    /// of a table without a `gfx` column.
    pub fn gfx_from_cu_num(cu_num: &str, running_gfx: &str) -> String {
        match cu_num.trim().parse::<i64>() {
            Ok(256) => "gfx950".into(),
            Ok(80) | Ok(304) => "gfx942".into(),
            _ => running_gfx.into(),
        }
    }

    /// What `fused_moe` asks the table for.
    pub struct Query<'a> {
        pub gfx: &'a str,
        pub cu_num: i64,
        /// The batch's token count, before padding.
        pub m: i64,
        pub model_dim: i64,
        pub inter_dim: i64,
        pub expert: i64,
        pub topk: i64,
        pub act_type: &'a str,
        pub dtype: &'a str,
        pub q_dtype_a: &'a str,
        pub q_dtype_w: &'a str,
        pub q_type: &'a str,
        pub use_g1u1: bool,
        pub doweight_stage1: bool,
    }

    /// A cell as pandas reads it for the index: integers compare as integers.
    fn cell(v: &str) -> String {
        match v.trim().parse::<i64>() {
            Ok(i) => i.to_string(),
            Err(_) => v.trim().to_string(),
        }
    }

    /// `get_2stage_cfgs` (aiter/fused_moe.py): read the CSV (pandas), give
    /// rows without `gfx` one from `cu_num`, drop `_tag == "flydsl_fallback"`,
    /// index by (gfx, cu_num, token, model_dim, inter_dim, expert, topk,
    /// act_type, dtype, q_dtype_a, q_dtype_w, q_type, use_g1u1,
    /// doweight_stage1) keeping the first of duplicates; look the padded
    /// token up exactly, then with act_type ignored, then (above 32768)
    /// smaller tiers. `None`: aiter's default heuristics.
    pub fn lookup(csv_text: &str, q: &Query<'_>) -> Option<HashMap<String, String>> {
        let mut rdr = csv::Reader::from_reader(csv_text.as_bytes());
        let headers: Vec<String> = rdr
            .headers()
            .expect("a header")
            .iter()
            .map(str::to_string)
            .collect();
        let rows: Vec<HashMap<String, String>> = rdr
            .records()
            .map(|r| {
                headers
                    .iter()
                    .cloned()
                    .zip(r.expect("a row").iter().map(str::to_string))
                    .collect()
            })
            .filter(|row: &HashMap<String, String>| {
                row.get("_tag").map(String::as_str) != Some("flydsl_fallback")
            })
            .collect();
        let key = |row: &HashMap<String, String>, with_act: bool| -> Vec<String> {
            let gfx = match row.get("gfx").map(|g| g.trim()) {
                Some(g) if !["", "0", "nan", "None"].contains(&g) => g.to_string(),
                _ => gfx_from_cu_num(&row["cu_num"], q.gfx),
            };
            let mut k = vec![gfx];
            for c in [
                "cu_num",
                "token",
                "model_dim",
                "inter_dim",
                "expert",
                "topk",
                "act_type",
                "dtype",
                "q_dtype_a",
                "q_dtype_w",
                "q_type",
                "use_g1u1",
                "doweight_stage1",
            ] {
                if c == "act_type" && !with_act {
                    k.push("__ignore__".into());
                } else {
                    k.push(cell(&row[c]));
                }
            }
            k
        };
        let wanted = |token: i64, with_act: bool| -> Vec<String> {
            vec![
                q.gfx.to_string(),
                q.cu_num.to_string(),
                token.to_string(),
                q.model_dim.to_string(),
                q.inter_dim.to_string(),
                q.expert.to_string(),
                q.topk.to_string(),
                if with_act {
                    q.act_type.to_string()
                } else {
                    "__ignore__".into()
                },
                q.dtype.to_string(),
                q.q_dtype_a.to_string(),
                q.q_dtype_w.to_string(),
                q.q_type.to_string(),
                (q.use_g1u1 as i64).to_string(),
                (q.doweight_stage1 as i64).to_string(),
            ]
        };
        let find = |token: i64| {
            rows.iter()
                .find(|r| key(r, true) == wanted(token, true))
                .or_else(|| rows.iter().find(|r| key(r, false) == wanted(token, false)))
        };
        let token = padded_m(q.m);
        if let Some(r) = find(token) {
            return Some(r.clone());
        }
        if token > 32768 {
            return find(32768).cloned();
        }
        None
    }
}

/// aiter's Triton GEMM config lookup.
pub mod aiter_gemm {
    use super::*;

    /// `STANDARD_M_BOUNDS` (aiter/ops/triton/utils/gemm_config_utils.py, since 2026-08).
    pub const BOUNDS: [i64; 13] = [1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];

    /// `get_gemm_config(config_name, M, N, K)`: the specialised file
    /// `{arch}-{config_name}-N={N}-K={K}.json` when it exists (then only it
    /// is searched); `M_LEQ_x` ascending, `M_GEQ_x` descending, `any`.
    /// `None`: no such file (aiter would use its default file).
    pub fn lookup(
        files: &Files,
        arch: &str,
        config_name: &str,
        m: i64,
        n: i64,
        k: i64,
    ) -> Option<Json> {
        let text = files.get(&format!("{arch}-{config_name}-N={n}-K={k}.json"))?;
        let dict: Map<String, Json> = serde_json::from_str(text).expect("json.load");
        for bound in BOUNDS {
            if m <= bound {
                if let Some(c) = dict.get(&format!("M_LEQ_{bound}")) {
                    return Some(c.clone());
                }
            }
        }
        for bound in BOUNDS.iter().rev() {
            if m >= *bound {
                if let Some(c) = dict.get(&format!("M_GEQ_{bound}")) {
                    return Some(c.clone());
                }
            }
        }
        dict.get("any").cloned()
    }
}
