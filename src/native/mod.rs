//! The native side of tunelab: runtime compilers (NVRTC, hiprtc) opened from
//! wherever they are installed, and the native worker that launches and times
//! compiled kernels on one GPU through the driver API (docs/native-backend.md).
//! Nothing here knows manifests or jobs: the runner resolves those into
//! images, symbols and launch arguments first.

pub mod cuda;
pub mod gpu;
#[cfg(feature = "hip")]
pub mod hip;
pub mod locate;
pub mod nvml;
pub mod rtc;
pub mod server;
pub mod watchdog;
