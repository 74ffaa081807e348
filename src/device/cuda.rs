//! NVIDIA device discovery through the CUDA driver API (cudarc).
//!
//! libcuda is loaded at run time: on a machine without it, discovery finds no
//! device and tunelab runs Triton's interpreter instead.

use cudarc::driver::sys::{self, CUdevice_attribute as Attr, CUresult};

use super::profile::{vllm_device_name, DeviceInfo};

/// Every CUDA device the driver reports, or an empty list (with the reason) when none can be used.
pub fn discover() -> Result<Vec<DeviceInfo>, String> {
    // SAFETY: is_culib_present only tries to dlopen candidate library names.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) found".into());
    }
    // SAFETY: the driver library is present; these calls only read device facts.
    unsafe {
        check(sys::cuInit(0), "cuInit")?;
        let mut driver = 0;
        check(sys::cuDriverGetVersion(&mut driver), "cuDriverGetVersion")?;
        let mut count = 0;
        check(sys::cuDeviceGetCount(&mut count), "cuDeviceGetCount")?;
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let mut dev = 0;
            check(sys::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
            let mut name = [0 as std::ffi::c_char; 256];
            check(
                sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev),
                "cuDeviceGetName",
            )?;
            let name = std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned();
            let attr = |a: Attr| -> Result<i64, String> {
                let mut v = 0;
                check(
                    sys::cuDeviceGetAttribute(&mut v, a, dev),
                    "cuDeviceGetAttribute",
                )?;
                Ok(v as i64)
            };
            let mut mem = 0usize;
            check(sys::cuDeviceTotalMem_v2(&mut mem, dev), "cuDeviceTotalMem")?;
            let cc_major = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32;
            let cc_minor = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32;
            let mem_clock_khz = attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? as u64;
            let bus_width_bits = attr(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)? as u32;
            let (bf16, fp8, fp32) = published_peaks(&name);
            devices.push(DeviceInfo {
                vllm_name: vllm_device_name(&name),
                backend: "cuda".into(),
                arch: format!("sm_{cc_major}{cc_minor}"),
                cc_major,
                cc_minor,
                sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
                l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
                smem_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                    as u64,
                mem_bytes: mem as u64,
                mem_clock_khz,
                bus_width_bits,
                peak_gbs: peak_bandwidth_gbs(&name, mem_clock_khz, bus_width_bits),
                peak_tflops_bf16: bf16,
                peak_tflops_fp16: bf16,
                peak_tflops_fp8: fp8,
                peak_tflops_fp32: fp32,
                warp_size: attr(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE)? as u32,
                driver: Some(format!("{}.{}", driver / 1000, (driver % 1000) / 10)),
                source: format!("discovered (CUDA device {ordinal})"),
                name,
            });
        }
        Ok(devices)
    }
}

fn check(r: CUresult, call: &str) -> Result<(), String> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}"))
    }
}

/// Peak DRAM bandwidth. The driver's memory clock and bus width give
/// 2 x clock x width (double data rate); for HBM3 parts the published figure
/// is used where we know it, since the attribute reports a rounded clock.
pub fn peak_bandwidth_gbs(name: &str, mem_clock_khz: u64, bus_width_bits: u32) -> f64 {
    if name.contains("H200") {
        return 4800.0;
    }
    if name.contains("H100") && (name.contains("HBM3") || name.contains("SXM")) {
        return 3350.0;
    }
    2.0 * mem_clock_khz as f64 * 1e3 * bus_width_bits as f64 / 8.0 / 1e9
}

/// Dense peak TFLOP/s (bf16, fp8, fp32) as published for the part; 0 when unknown.
fn published_peaks(name: &str) -> (f64, f64, f64) {
    if name.contains("H100") || name.contains("H200") {
        if name.contains("PCIe") {
            return (756.0, 1513.0, 51.2);
        }
        return (989.4, 1978.9, 66.9);
    }
    if name.contains("A100") {
        return (312.0, 0.0, 19.5);
    }
    (0.0, 0.0, 0.0)
}
