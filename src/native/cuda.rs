//! [`Gpu`] through the CUDA driver API (cudarc, loaded at run time): the
//! primary context of device 0 (the lane's GPU, as `CUDA_VISIBLE_DEVICES`
//! names it to the worker), one non-blocking stream.

use std::ffi::{c_void, CStr, CString};

use cudarc::driver::sys::{self, CUfunction_attribute as FnAttr, CUresult};

use super::gpu::{ErrorClass, Facts, Gpu, GpuError, Ptr, Usage};

pub struct Cuda {
    facts: Facts,
    stream: sys::CUstream,
    max_shared_optin: u32,
}

fn error(call: &'static str, r: CUresult) -> GpuError {
    use CUresult::*;
    let class = match r {
        CUDA_ERROR_INVALID_IMAGE
        | CUDA_ERROR_NO_BINARY_FOR_GPU
        | CUDA_ERROR_INVALID_PTX
        | CUDA_ERROR_UNSUPPORTED_PTX_VERSION
        | CUDA_ERROR_NOT_FOUND
        | CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND => ErrorClass::Image,
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES | CUDA_ERROR_OUT_OF_MEMORY => ErrorClass::Resources,
        CUDA_ERROR_ILLEGAL_ADDRESS
        | CUDA_ERROR_LAUNCH_FAILED
        | CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUDA_ERROR_MISALIGNED_ADDRESS
        | CUDA_ERROR_INVALID_ADDRESS_SPACE
        | CUDA_ERROR_INVALID_PC
        | CUDA_ERROR_ASSERT
        | CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUDA_ERROR_LAUNCH_TIMEOUT
        | CUDA_ERROR_ECC_UNCORRECTABLE => ErrorClass::Fault,
        _ => ErrorClass::Other,
    };
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver returns a static string for any code it knows.
    let code = if unsafe { sys::cuGetErrorName(r, &mut name) } == CUresult::CUDA_SUCCESS
        && !name.is_null()
    {
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("{r:?}")
    };
    GpuError { call, code, class }
}

fn ok(call: &'static str, r: CUresult) -> Result<(), GpuError> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(error(call, r))
    }
}

impl Cuda {
    /// Device 0's primary context, current on this thread, and a stream on it.
    pub fn open() -> Result<Cuda, String> {
        // SAFETY: probing for the library only dlopens candidate names.
        if !unsafe { sys::is_culib_present() } {
            return Err("no CUDA driver library (libcuda.so) found".into());
        }
        let fail = |e: GpuError| e.to_string();
        // SAFETY: plain driver calls with valid out-pointers, in the order the API requires.
        unsafe {
            ok("cuInit", sys::cuInit(0)).map_err(fail)?;
            let mut dev = 0;
            ok("cuDeviceGet", sys::cuDeviceGet(&mut dev, 0)).map_err(fail)?;
            let mut ctx = std::ptr::null_mut();
            ok(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )
            .map_err(fail)?;
            ok("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx)).map_err(fail)?;
            let mut stream = std::ptr::null_mut();
            ok(
                "cuStreamCreate",
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                ),
            )
            .map_err(fail)?;
            let mut name = [0 as std::ffi::c_char; 256];
            ok(
                "cuDeviceGetName",
                sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev),
            )
            .map_err(fail)?;
            let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let mut uuid: sys::CUuuid = std::mem::zeroed();
            let uuid = if sys::cuDeviceGetUuid(&mut uuid, dev) == CUresult::CUDA_SUCCESS {
                format_uuid(&uuid.bytes.map(|b| b as u8))
            } else {
                String::new()
            };
            let mut driver = 0;
            let _ = sys::cuDriverGetVersion(&mut driver);
            let mut optin = 0;
            let _ = sys::cuDeviceGetAttribute(
                &mut optin,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                dev,
            );
            Ok(Cuda {
                facts: Facts {
                    name,
                    uuid,
                    driver: format!("{}.{}", driver / 1000, (driver % 1000) / 10),
                    backend: "cuda",
                },
                stream,
                max_shared_optin: optin.max(0) as u32,
            })
        }
    }
}

/// 16 UUID bytes as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl Gpu for Cuda {
    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn load_module(&mut self, image: &[u8]) -> Result<u64, GpuError> {
        let mut m = std::ptr::null_mut();
        // SAFETY: `image` is a whole cubin (or PTX, NUL-terminated) that outlives the call.
        ok("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut m, image.as_ptr().cast())
        })?;
        Ok(m as u64)
    }

    fn unload_module(&mut self, module: u64) {
        // SAFETY: a module this worker loaded, unloaded once.
        unsafe { sys::cuModuleUnload(module as sys::CUmodule) };
    }

    fn function(&mut self, module: u64, symbol: &str) -> Result<u64, GpuError> {
        let name = CString::new(symbol).map_err(|_| GpuError {
            call: "cuModuleGetFunction",
            code: "symbol holds a NUL byte".into(),
            class: ErrorClass::Image,
        })?;
        let mut f = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        ok("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, module as sys::CUmodule, name.as_ptr())
        })?;
        Ok(f as u64)
    }

    fn max_threads(&self, function: u64) -> Result<u32, GpuError> {
        let mut v = 0;
        // SAFETY: a live function handle.
        ok("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(
                &mut v,
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                function as sys::CUfunction,
            )
        })?;
        Ok(v.max(0) as u32)
    }

    fn static_shared(&self, function: u64) -> Result<u32, GpuError> {
        let mut v = 0;
        // SAFETY: a live function handle.
        ok("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(
                &mut v,
                FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                function as sys::CUfunction,
            )
        })?;
        Ok(v.max(0) as u32)
    }

    fn usage(&self, function: u64) -> Result<Usage, GpuError> {
        let attr = |which| {
            let mut v = 0;
            // SAFETY: a live function handle.
            ok("cuFuncGetAttribute", unsafe {
                sys::cuFuncGetAttribute(&mut v, which, function as sys::CUfunction)
            })
            .map(|()| v.max(0) as u32)
        };
        Ok(Usage {
            registers: attr(FnAttr::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: attr(FnAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        })
    }

    fn max_shared_optin(&self) -> u32 {
        self.max_shared_optin
    }

    fn allow_shared(&self, function: u64, bytes: u32) -> Result<(), GpuError> {
        // SAFETY: a live function handle.
        ok("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(
                function as sys::CUfunction,
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        })
    }

    unsafe fn launch(
        &self,
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        params: *mut *mut c_void,
    ) -> Result<(), GpuError> {
        // SAFETY: the caller vouches for `params`; the rest are live handles.
        ok("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                function as sys::CUfunction,
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
        ok("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }

    fn alloc(&mut self, bytes: usize) -> Result<Ptr, GpuError> {
        let mut p = 0;
        // SAFETY: a valid out-pointer; the context is current.
        ok("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut p, bytes.max(1))
        })?;
        Ok(p)
    }

    fn free(&mut self, ptr: Ptr) {
        // SAFETY: memory this worker allocated, freed once.
        unsafe { sys::cuMemFree_v2(ptr) };
    }

    fn fill(&self, ptr: Ptr, pattern: &[u8], elements: usize) -> Result<(), GpuError> {
        // SAFETY: the caller names memory of at least `elements` such elements.
        unsafe {
            match *pattern {
                [b] => ok(
                    "cuMemsetD8Async",
                    sys::cuMemsetD8Async(ptr, b, elements, self.stream),
                ),
                [a, b] => ok(
                    "cuMemsetD16Async",
                    sys::cuMemsetD16Async(ptr, u16::from_le_bytes([a, b]), elements, self.stream),
                ),
                [a, b, c, d] => ok(
                    "cuMemsetD32Async",
                    sys::cuMemsetD32Async(
                        ptr,
                        u32::from_le_bytes([a, b, c, d]),
                        elements,
                        self.stream,
                    ),
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
        // SAFETY: the caller names device memory of at least `bytes.len()` bytes.
        unsafe {
            ok(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(ptr, bytes.as_ptr().cast(), bytes.len(), self.stream),
            )?;
        }
        self.synchronize()
    }

    fn download(&self, ptr: Ptr, bytes: &mut [u8]) -> Result<(), GpuError> {
        // SAFETY: the caller names device memory of at least `bytes.len()` bytes.
        unsafe {
            ok(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(bytes.as_mut_ptr().cast(), ptr, bytes.len(), self.stream),
            )?;
        }
        self.synchronize()
    }

    fn ipc_open(&mut self, handle: &[u8]) -> Result<Ptr, GpuError> {
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        if handle.len() != h.reserved.len() {
            return Err(GpuError {
                call: "cuIpcOpenMemHandle",
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
        let mut p = 0;
        // SAFETY: a handle another process exported; a valid out-pointer.
        ok("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut p,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(p)
    }

    fn ipc_close(&mut self, ptr: Ptr) {
        // SAFETY: a mapping this worker opened, closed once.
        unsafe { sys::cuIpcCloseMemHandle(ptr) };
    }

    fn new_event(&mut self) -> Result<u64, GpuError> {
        let mut e = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; timing events (default flags).
        ok("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
        })?;
        Ok(e as u64)
    }

    fn record(&self, event: u64) -> Result<(), GpuError> {
        // SAFETY: an event this worker created.
        ok("cuEventRecord", unsafe {
            sys::cuEventRecord(event as sys::CUevent, self.stream)
        })
    }

    fn elapsed_ms(&self, start: u64, end: u64) -> Result<f32, GpuError> {
        let mut ms = 0f32;
        // SAFETY: two recorded events of this worker.
        ok("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime(&mut ms, start as sys::CUevent, end as sys::CUevent)
        })?;
        Ok(ms)
    }

    fn begin_capture(&self) -> Result<(), GpuError> {
        // SAFETY: the worker's own stream, not capturing.
        ok("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(
                self.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    fn end_capture(&mut self) -> Result<u64, GpuError> {
        let mut graph = std::ptr::null_mut();
        // SAFETY: a capture this thread began on this stream.
        ok("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(self.stream, &mut graph)
        })?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: the graph just captured; destroyed once instantiated.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        unsafe { sys::cuGraphDestroy(graph) };
        ok("cuGraphInstantiate", r)?;
        Ok(exec as u64)
    }

    fn launch_graph(&self, graph: u64) -> Result<(), GpuError> {
        // SAFETY: an instantiated graph of this worker.
        ok("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(graph as sys::CUgraphExec, self.stream)
        })
    }

    fn destroy_graph(&mut self, graph: u64) {
        // SAFETY: destroyed once.
        unsafe { sys::cuGraphExecDestroy(graph as sys::CUgraphExec) };
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: the stream and the primary context retained in `open`.
        unsafe {
            sys::cuStreamDestroy_v2(self.stream);
            let mut dev = 0;
            if sys::cuCtxGetDevice(&mut dev) == CUresult::CUDA_SUCCESS {
                sys::cuDevicePrimaryCtxRelease_v2(dev);
            }
        }
    }
}
