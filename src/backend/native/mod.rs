//! Native methods on the runner's side: compiling them (`compile.rs`), the
//! lane's native worker process (`client.rs`) and the lane backend that puts
//! it beside the Python worker (`lane.rs`).

pub mod client;
pub mod compile;
pub mod lane;

pub use client::{NativeProcess, NativeSpawn};
pub use compile::{Artifact, NativeCompiler};
pub use lane::{LaneBackend, NativeSetup};
