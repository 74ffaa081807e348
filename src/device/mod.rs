//! What we run on: device facts from discovery (CUDA, HIP) or from a named profile.

pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;
pub mod profile;

pub use profile::{profile, vllm_device_name, DeviceInfo, PROFILE_NAMES};

/// What discovery found on this machine.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    pub devices: Vec<DeviceInfo>,
    /// Why each backend found nothing ("no CUDA driver library found", "AMD GPUs not looked for").
    pub notes: Vec<String>,
}

pub fn discover() -> Discovery {
    let mut found = Discovery::default();
    match cuda::discover() {
        Ok(devices) => found.devices.extend(devices),
        Err(why) => found.notes.push(format!("cuda: {why}")),
    }
    #[cfg(feature = "hip")]
    match hip::discover() {
        Ok(devices) => found.devices.extend(devices),
        Err(why) => found.notes.push(format!("hip: {why}")),
    }
    #[cfg(not(feature = "hip"))]
    found
        .notes
        .push("hip: AMD GPUs not looked for (this build has no `hip` feature)".into());
    found
}
