//! What a plan is made for, without touching a GPU to run anything: by
//! default what `tunelab run` would run here (the first GPU discovery finds,
//! else Triton's interpreter on the manifest's `interpreter:` shapes), or a
//! device profile the user named. `tunelab plan` and the Python API's
//! `plan` both ask here, so they agree with `run` and with each other.

use super::Mode;
use crate::device::{self, DeviceInfo};

/// The device and mode a plan is for, and a note for its first line when
/// that is not what `tunelab run` would run on this machine.
#[derive(Debug, Clone)]
pub struct PlanTarget {
    pub device: DeviceInfo,
    pub mode: Mode,
    pub note: Option<String>,
}

/// `profile`: a device profile the user named (a flag, a variable, a
/// settings file), else `None`; `interpret`: the interpreter asked for.
/// An unknown profile is an error naming the known ones.
pub fn for_plan(profile: Option<&str>, interpret: bool) -> Result<PlanTarget, String> {
    let interpreter = || PlanTarget {
        device: device::profile("cpu").expect("cpu profile"),
        mode: Mode::Interpreter,
        note: None,
    };
    if interpret {
        return Ok(interpreter());
    }
    let found = device::discover().devices;
    if let Some(name) = profile {
        let device = named(name)?;
        let here = match found.first() {
            Some(gpu) if gpu.name == device.name => None,
            Some(gpu) => Some(format!("on this machine's {}", gpu.name)),
            None => Some("in Triton's interpreter (no GPU found here)".to_string()),
        };
        return Ok(PlanTarget {
            note: here.map(|here| {
                format!(
                    "note: this plan is for a {} (device profile `{name}`); `tunelab run` would run {here}: \
                     `tunelab plan` without --device (and without TUNELAB_DEVICE_PROFILE or device_profile \
                     in tunelab.toml) shows that plan",
                    device.name
                )
            }),
            device,
            mode: Mode::Gpu,
        });
    }
    Ok(match found.into_iter().next() {
        Some(gpu) => PlanTarget {
            device: gpu,
            mode: Mode::Gpu,
            note: None,
        },
        None => PlanTarget {
            note: Some(
                "note: no GPU found here, so this is the plan `tunelab run` runs here: Triton's interpreter \
                 on the manifest's `interpreter:` shapes; `tunelab plan --device h100` plans for an H100"
                    .to_string(),
            ),
            ..interpreter()
        },
    })
}

/// A device profile by name, or an error that lists the names.
pub fn named(name: &str) -> Result<DeviceInfo, String> {
    device::profile(name).ok_or_else(|| {
        format!(
            "error: unknown device profile `{name}`\n  = help: use one of: {}",
            device::PROFILE_NAMES.join(", ")
        )
    })
}
