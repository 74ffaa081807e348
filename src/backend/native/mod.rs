//! Native methods on the runner's side: compiling them into images and
//! keeping those in the cache (`images.rs`), the lane's native worker
//! process (`client.rs`), and the lane's backend that runs native methods
//! on it beside the Python worker (`lane_backend/`).

pub mod client;
pub mod images;
pub mod lane_backend;

pub use client::{NativeProcess, NativeSpawn};
pub use images::{Artifact, NativeCompiler};
pub use lane_backend::{LaneBackend, NativeSetup};
