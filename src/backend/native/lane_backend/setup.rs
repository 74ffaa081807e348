//! What every lane's native side shares: the methods launched natively,
//! the compiler, the device their expressions read, why native launches
//! cannot run in this run (if they cannot), and tunelab's helper kernels.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::Value as Json;

use super::super::images::NativeCompiler;
use crate::manifest::{LaunchPath, Method};

/// What every lane's native side shares.
pub struct NativeSetup {
    pub problem: String,
    /// The methods launched natively, by name (shared: a lane looks one up
    /// at every check).
    pub methods: HashMap<String, Arc<Method>>,
    pub compiler: Arc<NativeCompiler>,
    pub(super) device: Json,
    /// Why no native launch can run in this run; `None` when they can.
    pub unavailable: Option<String>,
    /// Where Triton methods' cubins go for native launches.
    pub(super) cache_dir: PathBuf,
    /// `inputs: native` in effect: the native worker builds each shape's
    /// data (`build`) and the lane's Python worker, started with this
    /// compile target, has no torch and no GPU (it answers `native_data` and
    /// recipes over stand-ins). `None`: the Python worker builds and shares.
    pub lane_target: Option<String>,
    helpers: OnceLock<Result<PathBuf, String>>,
}

impl NativeSetup {
    /// `methods`: the experiment's methods (those launched natively are kept);
    /// `unavailable`: why this run cannot launch natively at all (interpreter mode).
    pub fn new(
        problem: &str,
        methods: &[Method],
        compiler: Arc<NativeCompiler>,
        device: &crate::device::DeviceInfo,
        cache_dir: PathBuf,
        unavailable: Option<String>,
    ) -> NativeSetup {
        let methods: HashMap<String, Arc<Method>> = methods
            .iter()
            .filter(|m| m.launch == LaunchPath::Native)
            .map(|m| (m.name.clone(), Arc::new(m.clone())))
            .collect();
        // Without the runtime compiler neither kind: it compiles the helper kernels too.
        let unavailable = unavailable.or_else(|| {
            if device.backend == "hip" && !cfg!(feature = "hip") {
                return Some("this tunelab was built without the `hip` feature".into());
            }
            compiler.rtc().err()
        });
        NativeSetup {
            problem: problem.to_string(),
            methods,
            compiler,
            device: Json::Object(crate::manifest::device_fields(device)),
            unavailable,
            cache_dir,
            lane_target: None,
            helpers: OnceLock::new(),
        }
    }

    /// Whether any method of the run is launched natively.
    pub fn any(&self) -> bool {
        !self.methods.is_empty()
    }

    /// Where Triton methods' cubins go for native launches.
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// The helper kernels' image, compiled once.
    pub(super) fn helpers(&self) -> Result<PathBuf, String> {
        self.helpers
            .get_or_init(|| {
                self.compiler
                    .compile_helpers()
                    .map(|a| a.image)
                    .map_err(|f| f.message)
            })
            .clone()
    }
}
