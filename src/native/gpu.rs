//! The driver calls the native worker makes, behind one trait with a CUDA
//! implementation (cudarc's driver API, `cuda.rs`) and a HIP one
//! (hip-runtime-sys, `hip.rs`, feature `hip`). Handles are plain integers;
//! every call runs on the worker's one stream of its one device.

use std::ffi::c_void;

/// A device address.
pub type Ptr = u64;

/// What a failed call means for the job that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The image does not load (not for this GPU, corrupt): the compiler's failure.
    Image,
    /// More registers, threads or shared memory than the GPU gives.
    Resources,
    /// The kernel faulted; the context is unusable from now on.
    Fault,
    /// Anything else.
    Other,
}

#[derive(Debug, Clone)]
pub struct GpuError {
    pub call: &'static str,
    /// The driver's name for the error (`CUDA_ERROR_ILLEGAL_ADDRESS`).
    pub code: String,
    pub class: ErrorClass,
}

impl std::fmt::Display for GpuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.call, self.code)
    }
}

/// The device a worker runs on.
#[derive(Debug, Clone)]
pub struct Facts {
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-...` as nvidia-smi and torch name it; empty where unknown.
    pub uuid: String,
    pub driver: String,
    /// "cuda" or "hip".
    pub backend: &'static str,
}

/// What a loaded function takes of the GPU, per thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub registers: u32,
    pub local_bytes: u32,
}

/// One device, one stream.
pub trait Gpu {
    fn facts(&self) -> &Facts;
    fn load_module(&mut self, image: &[u8]) -> Result<u64, GpuError>;
    fn unload_module(&mut self, module: u64);
    fn function(&mut self, module: u64, symbol: &str) -> Result<u64, GpuError>;
    /// The most threads per block the function launches with (its registers decide).
    fn max_threads(&self, function: u64) -> Result<u32, GpuError>;
    /// Static shared memory the function declares.
    fn static_shared(&self, function: u64) -> Result<u32, GpuError>;
    /// Registers per thread and local (spill) memory per thread, in bytes,
    /// as the loaded function reports them.
    fn usage(&self, function: u64) -> Result<Usage, GpuError>;
    /// The most dynamic shared memory a block of this device may opt in to.
    fn max_shared_optin(&self) -> u32;
    /// Lets the function take `bytes` of dynamic shared memory (above 48 KiB needs this).
    fn allow_shared(&self, function: u64, bytes: u32) -> Result<(), GpuError>;
    /// Queues one launch.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a value of
    /// that parameter's size, valid until the call returns.
    unsafe fn launch(
        &self,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        params: *mut *mut c_void,
    ) -> Result<(), GpuError>;
    fn synchronize(&self) -> Result<(), GpuError>;
    fn alloc(&mut self, bytes: usize) -> Result<Ptr, GpuError>;
    fn free(&mut self, ptr: Ptr);
    /// Fills `elements` elements of `pattern.len()` (1, 2 or 4) bytes each, on the stream.
    fn fill(&self, ptr: Ptr, pattern: &[u8], elements: usize) -> Result<(), GpuError>;
    /// Copies host bytes to the device, synchronously.
    fn upload(&self, ptr: Ptr, bytes: &[u8]) -> Result<(), GpuError>;
    /// Copies device bytes to the host after the stream's work so far, synchronously.
    fn download(&self, ptr: Ptr, bytes: &mut [u8]) -> Result<(), GpuError>;
    /// Maps another process's allocation by its IPC handle.
    fn ipc_open(&mut self, handle: &[u8]) -> Result<Ptr, GpuError>;
    fn ipc_close(&mut self, ptr: Ptr);
    fn new_event(&mut self) -> Result<u64, GpuError>;
    fn record(&self, event: u64) -> Result<(), GpuError>;
    fn elapsed_ms(&self, start: u64, end: u64) -> Result<f32, GpuError>;
    /// Starts capturing the stream's work into a graph.
    fn begin_capture(&self) -> Result<(), GpuError>;
    /// Ends the capture and instantiates the graph.
    fn end_capture(&mut self) -> Result<u64, GpuError>;
    fn launch_graph(&self, graph: u64) -> Result<(), GpuError>;
    fn destroy_graph(&mut self, graph: u64);
}
