//! A shape's tensors on the worker's GPU: mapped from the allocations the
//! lane's Python worker shares (`import`, CUDA IPC handles), or allocated
//! and filled here (`build`: the seeded generator and the reference
//! operator, `inputs: native`), and read back for tests (`fetch`).
//! Tensors are indexed in the order the request lists them; launches name
//! them by index.

use std::collections::HashMap;
use std::ffi::c_void;
use std::time::Instant;

use super::compare::element_kind;
use super::launch::dims;
use super::{answer, hex, Failure, Reply, Server};
use crate::native::gpu::Ptr;
use crate::protocol::native::{
    Build, BuildAnswer, Fetch, FetchAnswer, Fill, Import, ImportAnswer, ReferenceOp,
};
use crate::protocol::FailureKind;

impl Server {
    /// Maps the tensors of a shape, replacing the previous shape's.
    pub(super) fn import(&mut self, r: &Import) -> Reply {
        let tensors = &r.tensors;
        self.release();
        self.unmap();
        let mut by_handle: HashMap<String, Ptr> = HashMap::new();
        for t in tensors {
            let base = match by_handle.get(&t.handle) {
                Some(&b) => b,
                None => {
                    // An allocation is mapped once per process, however many tensors live in it.
                    let b = self.gpu.ipc_open(&hex(&t.handle)?).map_err(|e| {
                        Failure::new(
                            FailureKind::ProblemError,
                            format!("cannot map a shared tensor: {e} (the lane's GPU must be the one the Python worker allocated on)"),
                        )
                    })?;
                    self.mapped.push(b);
                    by_handle.insert(t.handle.clone(), b);
                    b
                }
            };
            self.tensors.push((base + t.offset, t.bytes));
        }
        answer(ImportAnswer {
            tensors: self.tensors.len(),
            allocations: self.mapped.len(),
        })
    }

    pub(super) fn unmap(&mut self) {
        for p in self.mapped.drain(..) {
            self.gpu.ipc_close(p);
        }
        if !self.owned.is_empty() {
            // A launch still running may read them.
            let _ = self.gpu.synchronize();
            for p in self.owned.drain(..) {
                self.gpu.free(p);
            }
        }
        self.tensors.clear();
    }

    /// Allocates and fills a shape's tensors here, replacing the previous
    /// shape's (imported or built): the inputs from the seeded generator, the
    /// reference by its operator. Tensors are indexed as `import` indexes them.
    pub(super) fn build(&mut self, req: &Build) -> Reply {
        let (fill_normal, matmul_reference) = match &self.helpers {
            Some(h) => (h.fill_normal, h.matmul_reference),
            None => {
                return Err(Failure::bad(
                    "build needs tunelab's helper kernels (hello's `helpers`)",
                ))
            }
        };
        let started = Instant::now();
        self.release();
        self.unmap();
        let mut kinds = Vec::with_capacity(req.tensors.len());
        for t in &req.tensors {
            let ptr = self.gpu.alloc(t.bytes as usize)?;
            self.owned.push(ptr);
            self.tensors.push((ptr, t.bytes));
            kinds.push(element_kind(&t.dtype));
        }
        for (i, t) in req.tensors.iter().enumerate() {
            let ptr = self.tensors[i].0;
            match &t.fill {
                None => {}
                Some(Fill::Zeros) => self.gpu.fill(ptr, &[0], t.bytes as usize)?,
                Some(Fill::Normal { std, stream }) => {
                    let (mut kind, size) = kinds[i].ok_or_else(|| {
                        Failure::bad(format!(
                            "build: tensor {i} is {}; normal draws are float32, float16 or bfloat16",
                            t.dtype
                        ))
                    })?;
                    let (mut out, mut n, mut seed, mut stream, mut std) =
                        (ptr, t.bytes / size, req.seed, *stream, *std);
                    let mut params = [
                        (&mut out as *mut u64).cast::<c_void>(),
                        (&mut kind as *mut i32).cast::<c_void>(),
                        (&mut n as *mut u64).cast::<c_void>(),
                        (&mut seed as *mut u64).cast::<c_void>(),
                        (&mut stream as *mut u64).cast::<c_void>(),
                        (&mut std as *mut f32).cast::<c_void>(),
                    ];
                    let blocks = n.div_ceil(256).clamp(1, 8192) as u32;
                    // SAFETY: tunelab_fill_normal(void*, int, unsigned long long,
                    // unsigned long long, unsigned long long, float), each parameter
                    // pointing at a value of its size; `out` holds `n` elements.
                    unsafe {
                        self.gpu.launch(
                            fill_normal,
                            [blocks, 1, 1],
                            [256, 1, 1],
                            0,
                            params.as_mut_ptr(),
                        )?
                    };
                }
            }
        }
        if let Some(ReferenceOp::Matmul { a, b, out, m, n, k }) = req.reference {
            let operand = |i: usize, elements: u64, what: &str| -> Result<(Ptr, i32), Failure> {
                let t = req.tensors.get(i).ok_or_else(|| {
                    Failure::bad(format!(
                        "build: the matmul's {what} is tensor {i}, which is not built"
                    ))
                })?;
                let (kind, size) = kinds[i].ok_or_else(|| {
                    Failure::bad(format!(
                        "build: the matmul's {what} is {}; float32, float16 or bfloat16 only",
                        t.dtype
                    ))
                })?;
                if t.bytes < elements * size {
                    return Err(Failure::bad(format!(
                        "build: the matmul's {what} holds {} bytes, fewer than its {elements} elements",
                        t.bytes
                    )));
                }
                Ok((self.tensors[i].0, kind))
            };
            let (m64, n64, k64) = (m as u64, n as u64, k as u64);
            let (mut pa, mut ka) = operand(a, m64 * k64, "a")?;
            let (mut pb, mut kb) = operand(b, k64 * n64, "b")?;
            let (mut pc, kc) = operand(out, m64 * n64, "out")?;
            if kc != 0 {
                return Err(Failure::bad("build: the matmul's out must be float32"));
            }
            let (mut mi, mut ni, mut ki) = (m as i32, n as i32, k as i32);
            if mi < 0 || ni < 0 || ki < 0 {
                return Err(Failure::bad(
                    "build: the matmul's m, n and k must be below 2^31",
                ));
            }
            let mut params = [
                (&mut pa as *mut u64).cast::<c_void>(),
                (&mut ka as *mut i32).cast::<c_void>(),
                (&mut pb as *mut u64).cast::<c_void>(),
                (&mut kb as *mut i32).cast::<c_void>(),
                (&mut pc as *mut u64).cast::<c_void>(),
                (&mut mi as *mut i32).cast::<c_void>(),
                (&mut ni as *mut i32).cast::<c_void>(),
                (&mut ki as *mut i32).cast::<c_void>(),
            ];
            let grid = dims(&[n64.div_ceil(64).max(1), m64.div_ceil(64).max(1)], "grid")?;
            // SAFETY: tunelab_matmul_reference(const void*, int, const void*, int,
            // float*, int, int, int), each parameter pointing at a value of its
            // size; the three tensors hold their elements (checked above).
            unsafe {
                self.gpu
                    .launch(matmul_reference, grid, [256, 1, 1], 0, params.as_mut_ptr())?
            };
        }
        self.gpu.synchronize()?;
        answer(BuildAnswer {
            tensors: self.tensors.len(),
            build_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// A tensor's bytes, hex (for tests and debugging; at most 64 MiB).
    pub(super) fn fetch(&mut self, r: &Fetch) -> Reply {
        let i = r.tensor as usize;
        let &(ptr, bytes) = self.tensors.get(i).ok_or_else(|| {
            Failure::bad(format!(
                "fetch: tensor {i} is not there ({} are)",
                self.tensors.len()
            ))
        })?;
        if bytes > 64 << 20 {
            return Err(Failure::bad(format!(
                "fetch: tensor {i} has {bytes} bytes; 64 MiB at most"
            )));
        }
        self.gpu.synchronize()?;
        let mut raw = vec![0u8; bytes as usize];
        self.gpu.download(ptr, &mut raw)?;
        let text: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        answer(FetchAnswer { bytes, hex: text })
    }
}
