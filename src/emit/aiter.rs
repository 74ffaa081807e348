//! `aiter_fmoe_csv`: rows of aiter's `tuned_fmoe.csv`.
//!
//! Header (aiter's own column order):
//! `cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,tflops,bw,_tag`.
//! (Newer aiter versions also have an `xbf16` column between `run_1stage` and
//! `tflops`; aiter reads files without it.)
//!
//! One row per shape with a best, in shape order:
//!
//! | column | value |
//! | --- | --- |
//! | `cu_num` | the device's SM/CU count |
//! | `token`, `model_dim`, `inter_dim`, `expert`, `topk` | shape fields `M`, `K`, `N`, `E`, `topk` |
//! | `act_type` | shape field `activation`: silu → `ActivationType.Silu`, gelu → `ActivationType.Gelu`, swiglu / swiglu_oai → `ActivationType.Swiglu`; no field → Silu |
//! | `dtype`, `q_dtype_a`, `q_dtype_w` | shape `dtype`: bf16 → `torch.bfloat16`, fp16 → `torch.float16`, fp32 → `torch.float32` (no field → bf16); the same in all three (no quantisation) |
//! | `q_type` | `QuantType.No` |
//! | `use_g1u1`, `doweight_stage1` | 1, 0 |
//! | `block_m` | the config's `BLOCK_SIZE_M` (0 without one) |
//! | `ksplit` | 0 |
//! | `us1`, `us` | the best time in µs, 4 decimals |
//! | `kernelName1` | `tunelab_<kernel>_<config>`, e.g. `tunelab_fused_moe_BM16_BN64_BK128_GM1_w4_s4` |
//! | `err1`, `err2` | mismatch fraction of the correctness gate as a percent, `0.0%` |
//! | `us2`, `kernelName2` | 0, empty (one fused stage) |
//! | `run_1stage` | 1 |
//! | `tflops` | TFLOP/s, 2 decimals |
//! | `bw` | GB/s, 2 decimals: aiter's fmoe tuner computes `round(bytes / (us * 1e-6) / 1e9, 2)` |
//! | `_tag` | empty |
//!
//! fp8 shapes are refused: the row would need a quantisation scheme
//! (`q_type`, scale layout) that tunelab's moe problem does not record.

use super::csv_out::{csv_error, finish};
use super::num::{config_ident, json_text, py_float};
use super::select::json_int;
use super::{EmitError, Group};

pub const HEADER: &str = "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,tflops,bw,_tag";

/// Config fields a method needs to feed this format when no method is named.
pub const REQUIRED: [&str; 0] = [];

pub fn render(group: &Group<'_, '_>) -> Result<String, EmitError> {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    w.write_record(HEADER.split(','))
        .map_err(|e| csv_error(group, e))?;
    let cu_num = group.header.device.sm_count.to_string();
    for shape in &group.shapes {
        let Some((_, best)) = shape.overall_best() else {
            continue;
        };
        let int = |field: &str| -> Result<String, EmitError> {
            shape
                .shape
                .get(field)
                .and_then(json_int)
                .map(|v| v.to_string())
                .ok_or_else(|| {
                    group.data_error(format!(
                        "shape {} has no integer field `{field}`",
                        shape.key
                    ))
                })
        };
        let text = |field: &str| shape.shape.get(field).map(json_text);
        let act = match text("activation").as_deref() {
            None | Some("silu") => "ActivationType.Silu",
            Some("gelu") => "ActivationType.Gelu",
            Some("swiglu" | "swiglu_oai") => "ActivationType.Swiglu",
            Some(other) => {
                return Err(group.data_error(format!(
                "activation `{other}` has no aiter ActivationType (silu, gelu, swiglu, swiglu_oai)"
            )))
            }
        };
        let dtype = match text("dtype").as_deref() {
            None | Some("bf16") => "torch.bfloat16",
            Some("fp16") => "torch.float16",
            Some("fp32") => "torch.float32",
            Some(other) => {
                return Err(group.data_error(format!("dtype `{other}` needs a quantisation scheme the aiter row cannot be given; use bf16, fp16 or fp32 shapes")))
            }
        };
        let block_m = best
            .job
            .config
            .get("BLOCK_SIZE_M")
            .and_then(json_int)
            .unwrap_or(0);
        let us = py_float(best.time_us(), 4);
        let kernel = match config_ident(&best.job.config) {
            c if c.is_empty() => format!("tunelab_{}", best.job.kernel),
            c => format!("tunelab_{}_{c}", best.job.kernel),
        };
        let err = best
            .job
            .check
            .as_ref()
            .map(|c| c.mismatch_frac)
            .unwrap_or(0.0);
        let row: Vec<String> = vec![
            cu_num.clone(),
            int("M")?,
            int("K")?,
            int("N")?,
            int("E")?,
            int("topk")?,
            act.into(),
            dtype.into(),
            dtype.into(),
            dtype.into(),
            "QuantType.No".into(),
            "1".into(),
            "0".into(),
            block_m.to_string(),
            "0".into(),
            us.clone(),
            kernel,
            percent(err),
            "0".into(),
            String::new(),
            "0.0%".into(),
            us,
            "1".into(),
            py_float(best.tflops().unwrap_or(0.0), 2),
            py_float(best.gbs().unwrap_or(0.0), 2),
            String::new(),
        ];
        w.write_record(&row).map_err(|e| csv_error(group, e))?;
    }
    finish(group, w)
}

/// A fraction as aiter spells errors: Python's `f"{x:.1%}"`.
fn percent(frac: f64) -> String {
    if frac.is_finite() {
        format!("{:.1}%", frac * 100.0)
    } else {
        "100.0%".into()
    }
}
