//! The SM clock through NVML (libnvidia-ml, opened at run time), read once
//! after each batch as the Python worker reads it through torch. Where NVML
//! is missing, or the device is not NVIDIA's, the clock is unknown (`null`).

use std::ffi::{c_char, c_uint, c_void, CString};

type InitFn = unsafe extern "C" fn() -> c_uint;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_uint;
type ClockFn = unsafe extern "C" fn(*mut c_void, c_uint, *mut c_uint) -> c_uint;

/// NVML_CLOCK_SM
const CLOCK_SM: c_uint = 1;

pub struct SmClock {
    read: Option<(ClockFn, *mut c_void)>,
    _lib: Option<libloading::Library>,
}

impl SmClock {
    /// NVML's handle of the device with this UUID (`GPU-...`); reads nothing
    /// when any step fails.
    pub fn open(uuid: &str) -> SmClock {
        let none = SmClock {
            read: None,
            _lib: None,
        };
        if uuid.is_empty() {
            return none;
        }
        // SAFETY: loading NVML runs no code with preconditions.
        let Ok(lib) = (unsafe { libloading::Library::new("libnvidia-ml.so.1") }) else {
            return none;
        };
        // SAFETY: the documented signatures of these NVML calls.
        let read = unsafe {
            let init: Option<libloading::Symbol<'_, InitFn>> = lib.get(b"nvmlInit_v2\0").ok();
            let by_uuid: Option<libloading::Symbol<'_, ByUuidFn>> =
                lib.get(b"nvmlDeviceGetHandleByUUID\0").ok();
            let clock: Option<libloading::Symbol<'_, ClockFn>> =
                lib.get(b"nvmlDeviceGetClockInfo\0").ok();
            match (init, by_uuid, clock, CString::new(uuid)) {
                (Some(init), Some(by_uuid), Some(clock), Ok(id)) if init() == 0 => {
                    let mut device = std::ptr::null_mut();
                    (by_uuid(id.as_ptr(), &mut device) == 0).then_some((*clock, device))
                }
                _ => None,
            }
        };
        SmClock {
            read,
            _lib: Some(lib),
        }
    }

    pub fn read(&self) -> Option<f64> {
        let (clock, device) = self.read?;
        let mut mhz: c_uint = 0;
        // SAFETY: a handle NVML gave; a valid out-pointer.
        (unsafe { clock(device, CLOCK_SM, &mut mhz) } == 0 && mhz > 0).then_some(mhz as f64)
    }
}
