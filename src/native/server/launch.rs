//! A job's launch: its image loaded (a few hundred kept, the oldest
//! unloaded first), its arguments laid out once for the driver, checked
//! against what the function and the device allow, its output poisoned,
//! launched once (`check`) and kept prepared for the warm-up and samples;
//! a passing comparison goes on to them in the same call (`then`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::time::Instant;

use super::{answer, hex, Failure, Reply, Server};
use crate::native::gpu::{Gpu, GpuError, Ptr};
use crate::protocol::native::{Arg, Check, CheckAnswer, LoadedKernel};
use crate::protocol::{Deferred, FailureKind};

/// Loaded images kept before the oldest are unloaded.
const MAX_MODULES: usize = 256;

/// A job ready to launch again and again.
pub(super) struct Prepared {
    pub(super) job_id: String,
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    /// One 8-byte slot per argument; the driver reads each parameter's own size from it.
    _values: Box<[u64]>,
    params: Vec<*mut c_void>,
    pub(super) scratch: Vec<Ptr>,
    /// Instantiated graphs by launches per graph.
    pub(super) graphs: HashMap<u64, u64>,
}

impl Prepared {
    pub(super) fn launch(&mut self, gpu: &dyn Gpu) -> Result<(), GpuError> {
        // SAFETY: `params` points into `_values`, one slot per kernel
        // parameter, alive as long as `self`.
        unsafe {
            gpu.launch(
                self.function,
                self.grid,
                self.block,
                self.shared,
                self.params.as_mut_ptr(),
            )
        }
    }
}

/// A grid's or block's dimensions (one to three, x first), each between 1
/// and 2^32 - 1.
pub(super) fn dims(v: &[u64], what: &str) -> Result<[u32; 3], Failure> {
    if v.is_empty() || v.len() > 3 {
        return Err(Failure::bad(format!(
            "`{what}` has 1 to 3 dimensions, got {}",
            v.len()
        )));
    }
    let mut out = [1u32; 3];
    for (i, &x) in v.iter().enumerate() {
        if x == 0 || x > u32::MAX as u64 {
            return Err(Failure::new(
                FailureKind::LaunchError,
                format!(
                    "{what} dimension {} is {x}: it must be between 1 and 2^32 - 1",
                    ["x", "y", "z"][i]
                ),
            ));
        }
        out[i] = x as u32;
    }
    Ok(out)
}

impl Server {
    pub(super) fn module(&mut self, image: &std::path::Path) -> Result<u64, Failure> {
        if let Some(&m) = self.modules.get(image) {
            return Ok(m);
        }
        if self.module_order.len() >= MAX_MODULES {
            let old = self.module_order.remove(0);
            if let Some(m) = self.modules.remove(&old) {
                self.gpu.unload_module(m);
            }
        }
        let bytes = std::fs::read(image).map_err(|e| {
            Failure::new(
                FailureKind::CompileError,
                format!("cannot read the image {}: {e}", image.display()),
            )
        })?;
        let m = self.gpu.load_module(&bytes)?;
        self.modules.insert(image.to_path_buf(), m);
        self.module_order.push(image.to_path_buf());
        Ok(m)
    }

    /// Prepares a job and launches it once into its poisoned output; with
    /// `compare`, compares it with the reference (else the runner asks the
    /// Python worker to), and with `then` goes on to the batches.
    pub(super) fn check(&mut self, req: &Check<'_>) -> Reply {
        self.release();
        let module = self.module(&req.image)?;
        let function = self.gpu.function(module, &req.symbol)?;
        let grid = dims(&req.grid, "grid")?;
        let block = dims(&req.block, "block")?;
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        let limit = self.gpu.max_threads(function)? as u64;
        if threads > limit {
            return Err(Failure::new(
                FailureKind::OutOfResources,
                format!("a block of {threads} threads; this kernel launches with at most {limit} (its registers decide)"),
            ));
        }
        let shared = u32::try_from(req.shared).map_err(|_| {
            Failure::new(
                FailureKind::OutOfResources,
                format!("{} bytes of shared memory", req.shared),
            )
        })?;
        let static_shared = self.gpu.static_shared(function)?;
        let usage = self.gpu.usage(function)?;
        let optin = self.gpu.max_shared_optin();
        if optin > 0 && shared as u64 + static_shared as u64 > optin as u64 {
            return Err(Failure::new(
                FailureKind::OutOfResources,
                format!(
                    "{shared} bytes of dynamic and {static_shared} of static shared memory; a block may have {optin}"
                ),
            ));
        }
        if shared > 48 * 1024 {
            self.gpu.allow_shared(function, shared)?;
        }
        let grid_blocks = grid.iter().map(|&g| g as u64).product::<u64>();
        let mut values = vec![0u64; req.args.len()].into_boxed_slice();
        let mut scratch = Vec::new();
        for (slot, arg) in values.iter_mut().zip(req.args.iter()) {
            *slot = match *arg {
                Arg::Tensor(i) => {
                    self.tensors
                        .get(i)
                        .ok_or_else(|| {
                            Failure::bad(format!(
                                "tensor {i} was not imported ({} are)",
                                self.tensors.len()
                            ))
                        })?
                        .0
                }
                Arg::I32(v) => v as u32 as u64,
                Arg::U32(v) => v as u64,
                Arg::I64(v) => v as u64,
                Arg::U64(v) => v,
                Arg::F32(v) => v.to_bits() as u64,
                Arg::F64(v) => v.to_bits(),
                Arg::Scratch(0) => 0,
                Arg::Scratch(bytes) => {
                    // Per program, as Triton's launcher sizes global scratch.
                    let total = bytes.checked_mul(grid_blocks).ok_or_else(|| {
                        Failure::new(FailureKind::OutOfResources, "scratch size overflows")
                    })?;
                    let p = self.gpu.alloc(total as usize)?;
                    scratch.push(p);
                    p
                }
            };
        }
        let params: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        let mut prepared = Prepared {
            job_id: req.job_id.to_string(),
            function,
            grid,
            block,
            shared,
            _values: values,
            params,
            scratch,
            graphs: HashMap::new(),
        };
        if let Some(p) = &req.poison {
            let (ptr, bytes) = *self.tensors.get(p.tensor).ok_or_else(|| {
                Failure::bad(format!("poison: tensor {} was not imported", p.tensor))
            })?;
            let pattern = hex(&p.pattern)?;
            if pattern.is_empty() || p.elements.saturating_mul(pattern.len() as u64) > bytes {
                return Err(Failure::bad("poison: the pattern does not fit the tensor"));
            }
            self.poison(ptr, &pattern, p.elements)?;
        }
        let started = Instant::now();
        prepared.launch(self.gpu.as_ref())?;
        self.gpu.synchronize()?;
        let us = started.elapsed().as_secs_f64() * 1e6;
        self.prepared = Some(prepared);
        let compared = match &req.compare {
            Some(c) => Some(self.compare(c)?),
            None => None,
        };
        let passed = compared.as_ref().is_some_and(|c| c.passed);
        let then = match &req.then {
            Some(then) if passed => Some(Deferred::new(&self.then(&req.job_id, then))),
            _ => None,
        };
        answer(CheckAnswer {
            compared,
            then,
            launch_us: us,
            kernel: LoadedKernel {
                name: req.symbol.to_string(),
                n_regs: Some(usage.registers as u64),
                local_bytes: Some(usage.local_bytes as u64),
                shared: static_shared as u64 + shared as u64,
                threads: Some(threads),
            },
        })
    }

    fn poison(&mut self, ptr: Ptr, pattern: &[u8], elements: u64) -> Result<(), Failure> {
        match pattern.len() {
            1 | 2 | 4 => self.gpu.fill(ptr, pattern, elements as usize)?,
            8 if pattern[..4] == pattern[4..] => {
                self.gpu.fill(ptr, &pattern[..4], 2 * elements as usize)?
            }
            _ => {
                let bytes: Vec<u8> = pattern
                    .iter()
                    .copied()
                    .cycle()
                    .take(pattern.len() * elements as usize)
                    .collect();
                self.gpu.upload(ptr, &bytes)?;
            }
        }
        self.gpu.synchronize()?;
        Ok(())
    }

    /// Fails unless job `id` is the prepared one.
    pub(super) fn prepared(&self, id: &str) -> Result<(), Failure> {
        match &self.prepared {
            Some(p) if p.job_id == id => Ok(()),
            other => Err(Failure::bad(format!(
                "job {id:?} is not prepared (prepared: {}); send a check first",
                other.as_ref().map_or("none", |p| p.job_id.as_str())
            ))),
        }
    }
}
