//! The kernel workbench, runner side (docs/workbench.md): what is done with
//! a results directory's winners besides timing them.
//!
//! - [`keep_ir`]: after a run (`run --keep-ir`, or an `ir` output in the
//!   manifest), each winner compiled once more by a worker that writes its
//!   kernels' IR and metadata under the results directory;
//! - [`profile`]: what `tunelab profile` re-runs, as the request its Python
//!   side (`tunelab.profiler`) reads;
//! - [`aot`]: the `aot` output, the winners' images with a C dispatcher.
//!
//! Imports `store`, `emit`, `plan` and `backend`: it sits beside `schedule`.

pub mod aot;
pub mod keep_ir;
pub mod profile;

pub use keep_ir::{jobs_to_keep, keep_ir, KeepIr, Kept, Which};
