//! Device facts used in expressions (`device.smem_bytes`), throughput and
//! roofline figures. Discovered from the GPU at run time, or taken from a
//! named profile when planning on a machine without one.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Name as the driver reports it ("NVIDIA H100 80GB HBM3").
    pub name: String,
    /// The name vLLM puts in config file names ("NVIDIA_H100_80GB_HBM3",
    /// "NVIDIA_H200"): [`vllm_device_name`] of `name` on NVIDIA.
    pub vllm_name: String,
    /// "cuda", "hip" or "cpu" (Triton's interpreter).
    pub backend: String,
    /// "sm_90" on NVIDIA, gcnArchName ("gfx942") on AMD, "cpu" for the interpreter.
    pub arch: String,
    pub cc_major: u32,
    pub cc_minor: u32,
    /// SMs on NVIDIA, CUs on AMD (aiter's cu_num).
    pub sm_count: u32,
    pub l2_bytes: u64,
    /// Shared memory one block may use (opt-in maximum).
    pub smem_bytes: u64,
    pub mem_bytes: u64,
    pub mem_clock_khz: u64,
    pub bus_width_bits: u32,
    /// Peak DRAM bandwidth in GB/s.
    pub peak_gbs: f64,
    /// Dense peak TFLOP/s by dtype, as published for the part.
    pub peak_tflops_bf16: f64,
    pub peak_tflops_fp16: f64,
    pub peak_tflops_fp8: f64,
    pub peak_tflops_fp32: f64,
    pub warp_size: u32,
    pub driver: Option<String>,
    /// Where these facts came from: "discovered" or "profile:NAME".
    pub source: String,
}

pub const PROFILE_NAMES: &[&str] = &["h100", "h200", "cpu"];

/// Builtin profiles for planning without a GPU. Figures are the published
/// ones for the SXM parts (dense, no sparsity).
pub fn profile(name: &str) -> Option<DeviceInfo> {
    let hopper =
        |name: &str, vllm: &str, l2: u64, mem: u64, mem_clock_khz: u64, bus: u32, gbs: f64| {
            DeviceInfo {
                name: name.into(),
                vllm_name: vllm.into(),
                backend: "cuda".into(),
                arch: "sm_90".into(),
                cc_major: 9,
                cc_minor: 0,
                sm_count: 132,
                l2_bytes: l2,
                smem_bytes: 232_448,
                mem_bytes: mem,
                mem_clock_khz,
                bus_width_bits: bus,
                peak_gbs: gbs,
                peak_tflops_bf16: 989.4,
                peak_tflops_fp16: 989.4,
                peak_tflops_fp8: 1978.9,
                peak_tflops_fp32: 66.9,
                warp_size: 32,
                driver: None,
                source: String::new(),
            }
        };
    let mut info = match name {
        "h100" => hopper(
            "NVIDIA H100 80GB HBM3",
            "NVIDIA_H100_80GB_HBM3",
            50 << 20,
            80 << 30,
            2_619_000,
            5120,
            3350.0,
        ),
        "h200" => hopper(
            "NVIDIA H200",
            "NVIDIA_H200",
            60 << 20,
            141 << 30,
            3_201_000,
            6144,
            4800.0,
        ),
        "cpu" => DeviceInfo {
            name: "cpu (Triton interpreter)".into(),
            vllm_name: "cpu".into(),
            backend: "cpu".into(),
            arch: "cpu".into(),
            cc_major: 0,
            cc_minor: 0,
            sm_count: 1,
            l2_bytes: 0,
            // Interpreter mode has no shared memory limit; keep the Hopper figure so
            // constraints written for a GPU prune the same way.
            smem_bytes: 232_448,
            mem_bytes: 0,
            mem_clock_khz: 0,
            bus_width_bits: 0,
            peak_gbs: 0.0,
            peak_tflops_bf16: 0.0,
            peak_tflops_fp16: 0.0,
            peak_tflops_fp8: 0.0,
            peak_tflops_fp32: 0.0,
            warp_size: 32,
            driver: None,
            source: String::new(),
        },
        _ => return None,
    };
    info.source = format!("profile:{name}");
    Some(info)
}

/// The device name vLLM puts in its fused-MoE config file names, from the
/// name the driver reports (the name `torch.cuda.get_device_name()` returns).
///
/// vLLM's rule (`get_config_file_name` in
/// `vllm/model_executor/layers/fused_moe/fused_moe.py`): replace every space
/// with `_`; then, if `H200` is one of the `_`-separated words, the name is
/// `NVIDIA_H200`. Only spaces are replaced (`NVIDIA A100-SXM4-80GB` becomes
/// `NVIDIA_A100-SXM4-80GB`), and only the whole word `H200` counts: a GH200
/// keeps its own name.
pub fn vllm_device_name(name: &str) -> String {
    let name = name.replace(' ', "_");
    if name.split('_').any(|word| word == "H200") {
        return "NVIDIA_H200".into();
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_names_follow_vllm_rules() {
        assert_eq!(
            vllm_device_name("NVIDIA H100 80GB HBM3"),
            "NVIDIA_H100_80GB_HBM3"
        );
        assert_eq!(vllm_device_name("NVIDIA H200 NVL"), "NVIDIA_H200");
        assert_eq!(vllm_device_name("NVIDIA H200"), "NVIDIA_H200");
        assert_eq!(vllm_device_name("NVIDIA H200 141GB HBM3e"), "NVIDIA_H200");
        // A GH200's words are NVIDIA, GH200, 480GB: none is H200.
        assert_eq!(vllm_device_name("NVIDIA GH200 480GB"), "NVIDIA_GH200_480GB");
        assert_eq!(vllm_device_name("NVIDIA H100 NVL"), "NVIDIA_H100_NVL");
        // Hyphens stay, and a word that only starts with H200 is not H200.
        assert_eq!(
            vllm_device_name("NVIDIA A100-SXM4-80GB"),
            "NVIDIA_A100-SXM4-80GB"
        );
        assert_eq!(vllm_device_name("NVIDIA H200-SXM"), "NVIDIA_H200-SXM");
        assert_eq!(vllm_device_name("NVIDIA_H200"), "NVIDIA_H200");
    }

    #[test]
    fn every_named_profile_exists() {
        for name in PROFILE_NAMES {
            assert_eq!(profile(name).unwrap().source, format!("profile:{name}"));
        }
        assert!(profile("a100").is_none());
    }
}
