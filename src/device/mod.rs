//! What we run on: device facts from discovery or from a named profile.

pub mod profile;

pub use profile::{profile, vllm_device_name, DeviceInfo, PROFILE_NAMES};
