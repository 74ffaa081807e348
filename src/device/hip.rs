//! AMD device discovery through the HIP runtime (hip-runtime-sys), behind the
//! `hip` cargo feature.

use hip_runtime_sys::*;

use super::profile::DeviceInfo;

pub fn discover() -> Result<Vec<DeviceInfo>, String> {
    // SAFETY: plain queries of device properties through the HIP runtime.
    unsafe {
        let mut count = 0;
        if hipGetDeviceCount(&mut count) != hipError_t::hipSuccess {
            return Err("hipGetDeviceCount failed (no AMD GPU or no driver)".into());
        }
        let mut driver = 0;
        let _ = hipDriverGetVersion(&mut driver);
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let mut props: hipDeviceProp_t = std::mem::zeroed();
            if hipGetDeviceProperties(&mut props, ordinal) != hipError_t::hipSuccess {
                return Err(format!("hipGetDeviceProperties({ordinal}) failed"));
            }
            let name = std::ffi::CStr::from_ptr(props.name.as_ptr())
                .to_string_lossy()
                .into_owned();
            let arch = std::ffi::CStr::from_ptr(props.gcnArchName.as_ptr())
                .to_string_lossy()
                .into_owned();
            let arch = arch.split(':').next().unwrap_or("").to_string();
            let mem_clock_khz = props.memoryClockRate as u64;
            let bus_width_bits = props.memoryBusWidth as u32;
            devices.push(DeviceInfo {
                vllm_name: name.replace(' ', "_"),
                backend: "hip".into(),
                arch,
                cc_major: props.major as u32,
                cc_minor: props.minor as u32,
                sm_count: props.multiProcessorCount as u32,
                l2_bytes: props.l2CacheSize as u64,
                smem_bytes: props.sharedMemPerBlock as u64,
                mem_bytes: props.totalGlobalMem as u64,
                mem_clock_khz,
                bus_width_bits,
                peak_gbs: 2.0 * mem_clock_khz as f64 * 1e3 * bus_width_bits as f64 / 8.0 / 1e9,
                peak_tflops_bf16: 0.0,
                peak_tflops_fp16: 0.0,
                peak_tflops_fp8: 0.0,
                peak_tflops_fp32: 0.0,
                warp_size: props.warpSize as u32,
                driver: Some(driver.to_string()),
                source: format!("discovered (HIP device {ordinal})"),
                name,
            });
        }
        Ok(devices)
    }
}
