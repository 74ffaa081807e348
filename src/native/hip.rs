//! [`Gpu`] through the HIP runtime (hip-runtime-sys, feature `hip`): device 0
//! (the lane's GPU, as `HIP_VISIBLE_DEVICES` names it), one non-blocking
//! stream. Built and linted in CI; it has not run on an AMD GPU.

use std::ffi::{c_void, CStr, CString};

use hip_runtime_sys::*;

use super::gpu::{ErrorClass, Facts, Gpu, GpuError, Ptr, Usage};

pub struct Hip {
    facts: Facts,
    stream: hipStream_t,
    max_shared: u32,
}

fn error(call: &'static str, r: hipError_t) -> GpuError {
    use hipError_t::*;
    let class = match r {
        hipErrorInvalidImage
        | hipErrorNoBinaryForGpu
        | hipErrorNotFound
        | hipErrorSharedObjectSymbolNotFound => ErrorClass::Image,
        hipErrorLaunchOutOfResources | hipErrorOutOfMemory => ErrorClass::Resources,
        hipErrorIllegalAddress | hipErrorLaunchFailure | hipErrorAssert | hipErrorIllegalState => {
            ErrorClass::Fault
        }
        _ => ErrorClass::Other,
    };
    // SAFETY: returns a static string for any code.
    let name = unsafe { hipGetErrorName(r) };
    let code = if name.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    GpuError { call, code, class }
}

fn ok(call: &'static str, r: hipError_t) -> Result<(), GpuError> {
    if r == hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(error(call, r))
    }
}

impl Hip {
    pub fn open() -> Result<Hip, String> {
        let fail = |e: GpuError| e.to_string();
        // SAFETY: plain runtime calls with valid out-pointers.
        unsafe {
            ok("hipInit", hipInit(0)).map_err(fail)?;
            ok("hipSetDevice", hipSetDevice(0)).map_err(fail)?;
            let mut stream = std::ptr::null_mut();
            ok(
                "hipStreamCreateWithFlags",
                hipStreamCreateWithFlags(&mut stream, hipStreamNonBlocking),
            )
            .map_err(fail)?;
            let mut name = [0 as std::ffi::c_char; 256];
            ok(
                "hipDeviceGetName",
                hipDeviceGetName(name.as_mut_ptr(), 256, 0),
            )
            .map_err(fail)?;
            let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let mut uuid: hipUUID = std::mem::zeroed();
            let uuid = if hipDeviceGetUuid(&mut uuid, 0) == hipError_t::hipSuccess {
                super::cuda::format_uuid(&uuid.bytes.map(|b| b as u8))
            } else {
                String::new()
            };
            let mut driver = 0;
            let _ = hipDriverGetVersion(&mut driver);
            let mut smem = 0;
            let _ = hipDeviceGetAttribute(
                &mut smem,
                hipDeviceAttribute_t::hipDeviceAttributeMaxSharedMemoryPerBlock,
                0,
            );
            Ok(Hip {
                facts: Facts {
                    name,
                    uuid,
                    driver: driver.to_string(),
                    backend: "hip",
                },
                stream,
                max_shared: smem.max(0) as u32,
            })
        }
    }
}

impl Gpu for Hip {
    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn load_module(&mut self, image: &[u8]) -> Result<u64, GpuError> {
        let mut m = std::ptr::null_mut();
        // SAFETY: a whole code object that outlives the call.
        ok("hipModuleLoadData", unsafe {
            hipModuleLoadData(&mut m, image.as_ptr().cast())
        })?;
        Ok(m as u64)
    }

    fn unload_module(&mut self, module: u64) {
        // SAFETY: a module this worker loaded, unloaded once.
        unsafe { hipModuleUnload(module as hipModule_t) };
    }

    fn function(&mut self, module: u64, symbol: &str) -> Result<u64, GpuError> {
        let name = CString::new(symbol).map_err(|_| GpuError {
            call: "hipModuleGetFunction",
            code: "symbol holds a NUL byte".into(),
            class: ErrorClass::Image,
        })?;
        let mut f = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        ok("hipModuleGetFunction", unsafe {
            hipModuleGetFunction(&mut f, module as hipModule_t, name.as_ptr())
        })?;
        Ok(f as u64)
    }

    fn max_threads(&self, function: u64) -> Result<u32, GpuError> {
        let mut v = 0;
        // SAFETY: a live function handle.
        ok("hipFuncGetAttribute", unsafe {
            hipFuncGetAttribute(
                &mut v,
                hipFunction_attribute::HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                function as hipFunction_t,
            )
        })?;
        Ok(v.max(0) as u32)
    }

    fn static_shared(&self, function: u64) -> Result<u32, GpuError> {
        let mut v = 0;
        // SAFETY: a live function handle.
        ok("hipFuncGetAttribute", unsafe {
            hipFuncGetAttribute(
                &mut v,
                hipFunction_attribute::HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                function as hipFunction_t,
            )
        })?;
        Ok(v.max(0) as u32)
    }

    fn usage(&self, function: u64) -> Result<Usage, GpuError> {
        let attr = |which| {
            let mut v = 0;
            // SAFETY: a live function handle.
            ok("hipFuncGetAttribute", unsafe {
                hipFuncGetAttribute(&mut v, which, function as hipFunction_t)
            })
            .map(|()| v.max(0) as u32)
        };
        Ok(Usage {
            registers: attr(hipFunction_attribute::HIP_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: attr(hipFunction_attribute::HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        })
    }

    fn max_shared_optin(&self) -> u32 {
        self.max_shared
    }

    fn allow_shared(&self, _function: u64, bytes: u32) -> Result<(), GpuError> {
        // AMD GPUs give a block its whole LDS without opting in.
        if self.max_shared > 0 && bytes > self.max_shared {
            return Err(GpuError {
                call: "allow_shared",
                code: format!(
                    "{bytes} bytes of shared memory; a block has {}",
                    self.max_shared
                ),
                class: ErrorClass::Resources,
            });
        }
        Ok(())
    }

    unsafe fn launch(
        &self,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        params: *mut *mut c_void,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller vouches for `params`.
        ok("hipModuleLaunchKernel", unsafe {
            hipModuleLaunchKernel(
                function as hipFunction_t,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                self.stream,
                params,
                std::ptr::null_mut(),
            )
        })
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        // SAFETY: the worker's own stream.
        ok("hipStreamSynchronize", unsafe {
            hipStreamSynchronize(self.stream)
        })
    }

    fn alloc(&mut self, bytes: usize) -> Result<Ptr, GpuError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        ok("hipMalloc", unsafe { hipMalloc(&mut p, bytes.max(1)) })?;
        Ok(p as Ptr)
    }

    fn free(&mut self, ptr: Ptr) {
        // SAFETY: memory this worker allocated, freed once.
        unsafe { hipFree(ptr as *mut c_void) };
    }

    fn fill(&self, ptr: Ptr, pattern: &[u8], elements: usize) -> Result<(), GpuError> {
        let dst = ptr as hipDeviceptr_t;
        // SAFETY: the caller names memory of at least `elements` such elements.
        unsafe {
            match *pattern {
                [b] => ok(
                    "hipMemsetD8Async",
                    hipMemsetD8Async(dst, b, elements, self.stream),
                ),
                [a, b] => ok(
                    "hipMemsetD16Async",
                    hipMemsetD16Async(dst, u16::from_le_bytes([a, b]), elements, self.stream),
                ),
                [a, b, c, d] => ok(
                    "hipMemsetD32Async",
                    hipMemsetD32Async(dst, i32::from_le_bytes([a, b, c, d]), elements, self.stream),
                ),
                _ => Err(GpuError {
                    call: "fill",
                    code: format!("no memset of {}-byte elements", pattern.len()),
                    class: ErrorClass::Other,
                }),
            }
        }
    }

    fn upload(&self, ptr: Ptr, bytes: &[u8]) -> Result<(), GpuError> {
        // SAFETY: the caller names device memory of at least `bytes.len()` bytes; the
        // runtime only reads the host buffer.
        unsafe {
            ok(
                "hipMemcpyHtoDAsync",
                hipMemcpyHtoDAsync(
                    ptr as hipDeviceptr_t,
                    bytes.as_ptr() as *mut c_void,
                    bytes.len(),
                    self.stream,
                ),
            )?;
        }
        self.synchronize()
    }

    fn download(&self, ptr: Ptr, bytes: &mut [u8]) -> Result<(), GpuError> {
        // SAFETY: the caller names device memory of at least `bytes.len()` bytes.
        unsafe {
            ok(
                "hipMemcpyDtoHAsync",
                hipMemcpyDtoHAsync(
                    bytes.as_mut_ptr() as *mut c_void,
                    ptr as hipDeviceptr_t,
                    bytes.len(),
                    self.stream,
                ),
            )?;
        }
        self.synchronize()
    }

    fn ipc_open(&mut self, handle: &[u8]) -> Result<Ptr, GpuError> {
        let mut h: hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
        if handle.len() != h.reserved.len() {
            return Err(GpuError {
                call: "hipIpcOpenMemHandle",
                code: format!(
                    "an IPC handle is {} bytes, got {}",
                    h.reserved.len(),
                    handle.len()
                ),
                class: ErrorClass::Other,
            });
        }
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as std::ffi::c_char;
        }
        let mut p = std::ptr::null_mut();
        // SAFETY: a handle another process exported; a valid out-pointer.
        ok("hipIpcOpenMemHandle", unsafe {
            hipIpcOpenMemHandle(&mut p, h, hipIpcMemLazyEnablePeerAccess)
        })?;
        Ok(p as Ptr)
    }

    fn ipc_close(&mut self, ptr: Ptr) {
        // SAFETY: a mapping this worker opened, closed once.
        unsafe { hipIpcCloseMemHandle(ptr as *mut c_void) };
    }

    fn new_event(&mut self) -> Result<u64, GpuError> {
        let mut e = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        ok("hipEventCreate", unsafe { hipEventCreate(&mut e) })?;
        Ok(e as u64)
    }

    fn record(&self, event: u64) -> Result<(), GpuError> {
        // SAFETY: an event this worker created.
        ok("hipEventRecord", unsafe {
            hipEventRecord(event as hipEvent_t, self.stream)
        })
    }

    fn elapsed_ms(&self, start: u64, end: u64) -> Result<f32, GpuError> {
        let mut ms = 0f32;
        // SAFETY: two recorded events of this worker.
        ok("hipEventElapsedTime", unsafe {
            hipEventElapsedTime(&mut ms, start as hipEvent_t, end as hipEvent_t)
        })?;
        Ok(ms)
    }

    fn begin_capture(&self) -> Result<(), GpuError> {
        // SAFETY: the worker's own stream, not capturing.
        ok("hipStreamBeginCapture", unsafe {
            hipStreamBeginCapture(
                self.stream,
                hipStreamCaptureMode::hipStreamCaptureModeThreadLocal,
            )
        })
    }

    fn end_capture(&mut self) -> Result<u64, GpuError> {
        let mut graph = std::ptr::null_mut();
        // SAFETY: a capture this thread began on this stream.
        ok("hipStreamEndCapture", unsafe {
            hipStreamEndCapture(self.stream, &mut graph)
        })?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: the graph just captured; destroyed once instantiated.
        let r = unsafe {
            hipGraphInstantiate(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        unsafe { hipGraphDestroy(graph) };
        ok("hipGraphInstantiate", r)?;
        Ok(exec as u64)
    }

    fn launch_graph(&self, graph: u64) -> Result<(), GpuError> {
        // SAFETY: an instantiated graph of this worker.
        ok("hipGraphLaunch", unsafe {
            hipGraphLaunch(graph as hipGraphExec_t, self.stream)
        })
    }

    fn destroy_graph(&mut self, graph: u64) {
        // SAFETY: destroyed once.
        unsafe { hipGraphExecDestroy(graph as hipGraphExec_t) };
    }
}

impl Drop for Hip {
    fn drop(&mut self) {
        // SAFETY: the stream created in `open`.
        unsafe { hipStreamDestroy(self.stream) };
    }
}
