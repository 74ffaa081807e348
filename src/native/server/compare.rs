//! The comparison of an output with its reference on the GPU
//! (`tunelab_compare`, src/native/helpers.cu), with `tunelab.compare`'s
//! rule and figures (python/tunelab/compare.py), so that a check whose
//! reference is shared needs no Python round trip.

use std::ffi::c_void;

use super::{Failure, Server};
use crate::native::gpu::Ptr;
use crate::protocol::native::{Compare, Comparison};

/// tunelab_compare's block: its shared-memory reduction is sized for
/// TUNELAB_COMPARE_THREADS (src/native/helpers.cu), which this must equal.
const COMPARE_THREADS: u32 = 256;
/// tunelab_compare's blocks at most: a grid-stride loop covers the rest.
const COMPARE_MAX_BLOCKS: u64 = 4096;

/// tunelab_compare's code for an element type, and its size in bytes.
pub(super) fn element_kind(dtype: &str) -> Option<(i32, u64)> {
    match dtype {
        "float32" => Some((0, 4)),
        "float16" => Some((1, 2)),
        "bfloat16" => Some((2, 2)),
        _ => None,
    }
}

/// compare()'s answer from tunelab_compare's counters: NaN outputs,
/// infinite outputs, elements within tolerance, finite pairs, the largest
/// absolute error's fp32 bits and the largest relative error's fp64 bits.
fn compare_figures(words: [u64; 6], elements: u64, max_mismatch: f64) -> Comparison {
    let [nan, inf, within, finite, abs_bits, rel_bits] = words;
    let (max_abs, max_rel) = if finite > 0 {
        (
            f32::from_bits(abs_bits as u32) as f64,
            f64::from_bits(rel_bits),
        )
    } else {
        (0.0, 0.0)
    };
    let mismatch = elements.saturating_sub(within);
    let frac = if elements > 0 {
        mismatch as f64 / elements as f64
    } else {
        0.0
    };
    Comparison {
        passed: nan + inf == 0 && frac <= max_mismatch,
        max_abs_err: Some(max_abs),
        max_rel_err: Some(max_rel),
        mismatch_frac: frac,
        nan_count: nan,
        inf_count: inf,
        elements,
    }
}

impl Server {
    /// The tolerance check of python/tunelab/compare.py, on the GPU
    /// (tunelab_compare), with the same figures: an element mismatches when
    /// |out - ref| > atol + rtol * |ref| in fp32 (NaN always does); it passes
    /// with no NaN or infinite output and at most `max_mismatch` of the
    /// elements mismatching; the error maxima are over pairs finite on both
    /// sides (0 where there are none), the relative one in fp64.
    pub(super) fn compare(&mut self, c: &Compare<'_>) -> Result<Comparison, Failure> {
        let function = self.helpers.as_ref().map(|h| h.compare).ok_or_else(|| {
            Failure::bad("compare needs tunelab's helper kernels (hello's `helpers`)")
        })?;
        let tensor = |i: usize, dtype: &str, what: &str| -> Result<(Ptr, i32), Failure> {
            let (kind, size) = element_kind(dtype).ok_or_else(|| {
                Failure::bad(format!(
                    "compare: {what} is {dtype}; float32, float16 or bfloat16 only"
                ))
            })?;
            let (ptr, bytes) = *self.tensors.get(i).ok_or_else(|| {
                Failure::bad(format!(
                    "compare: tensor {i} was not imported ({} are)",
                    self.tensors.len()
                ))
            })?;
            if c.elements.saturating_mul(size) > bytes {
                return Err(Failure::bad(format!(
                    "compare: {} {dtype} elements do not fit the {what}'s {bytes} bytes",
                    c.elements
                )));
            }
            Ok((ptr, kind))
        };
        let (mut out, mut out_kind) = tensor(c.out, &c.out_dtype, "output")?;
        let (mut reference, mut reference_kind) =
            tensor(c.reference, &c.reference_dtype, "reference")?;
        let result = match self.compare_result {
            Some(p) => p,
            None => {
                let p = self.gpu.alloc(48)?;
                self.compare_result = Some(p);
                p
            }
        };
        self.gpu.fill(result, &[0, 0, 0, 0], 12)?;
        // torch computes with the tolerances as fp32 scalars.
        let (mut n, mut atol, mut rtol, mut result_ptr) =
            (c.elements, c.atol as f32, c.rtol as f32, result);
        let mut params = [
            (&mut out as *mut u64).cast::<c_void>(),
            (&mut out_kind as *mut i32).cast::<c_void>(),
            (&mut reference as *mut u64).cast::<c_void>(),
            (&mut reference_kind as *mut i32).cast::<c_void>(),
            (&mut n as *mut u64).cast::<c_void>(),
            (&mut atol as *mut f32).cast::<c_void>(),
            (&mut rtol as *mut f32).cast::<c_void>(),
            (&mut result_ptr as *mut u64).cast::<c_void>(),
        ];
        let blocks = c
            .elements
            .div_ceil(COMPARE_THREADS as u64)
            .clamp(1, COMPARE_MAX_BLOCKS) as u32;
        // SAFETY: tunelab_compare(const void*, int, const void*, int, unsigned long long,
        // float, float, unsigned long long*), each parameter pointing at a value of its size.
        unsafe {
            self.gpu.launch(
                function,
                [blocks, 1, 1],
                [COMPARE_THREADS, 1, 1],
                0,
                params.as_mut_ptr(),
            )?
        };
        let mut raw = [0u8; 48];
        self.gpu.download(result, &mut raw)?;
        let word =
            |i: usize| u64::from_le_bytes(raw[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        Ok(compare_figures(
            [word(0), word(1), word(2), word(3), word(4), word(5)],
            c.elements,
            c.max_mismatch,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_figures_follow_python_compare() {
        // 1000 elements, 990 within tolerance, no NaN or infinity: passes at 1 %, not at 0.5 %.
        let abs = 0.25f32.to_bits() as u64;
        let rel = 3.5f64.to_bits();
        let fig = compare_figures([0, 0, 990, 1000, abs, rel], 1000, 0.01);
        assert!(fig.passed);
        assert_eq!(fig.mismatch_frac, 0.01);
        assert_eq!(fig.max_abs_err, Some(0.25));
        assert_eq!(fig.max_rel_err, Some(3.5));
        assert!(!compare_figures([0, 0, 990, 1000, abs, rel], 1000, 0.005).passed);
        // A NaN output fails whatever the mismatch allowance.
        let fig = compare_figures([1, 0, 999, 999, abs, rel], 1000, 1.0);
        assert!(!fig.passed);
        assert_eq!(fig.nan_count, 1);
        // No pair finite on both sides: the maxima are 0, as compare() reports them.
        let fig = compare_figures([0, 4, 0, 0, u64::MAX, u64::MAX], 4, 1.0);
        assert_eq!(fig.max_abs_err, Some(0.0));
        assert_eq!(fig.max_rel_err, Some(0.0));
        assert!(!fig.passed);
        // No elements: nothing mismatches.
        assert_eq!(compare_figures([0; 6], 0, 0.0).mismatch_frac, 0.0);
    }

    #[test]
    fn compare_threads_match_the_kernel() {
        let source = include_str!("../helpers.cu");
        let define = format!("#define TUNELAB_COMPARE_THREADS {COMPARE_THREADS}\n");
        assert!(source.contains(&define), "helpers.cu must say {define:?}");
    }

    #[test]
    fn compare_knows_three_element_types() {
        assert_eq!(element_kind("float32"), Some((0, 4)));
        assert_eq!(element_kind("float16"), Some((1, 2)));
        assert_eq!(element_kind("bfloat16"), Some((2, 2)));
        assert_eq!(element_kind("float8_e4m3fn"), None);
    }
}
