//! The worker protocol, defined once on the runner's side: the messages the
//! runner and its workers exchange as plain serde types (`python.rs`: the
//! Python worker's, docs/worker-protocol.md; `native.rs`: the native
//! worker's, docs/native-backend.md; `timing.rs`: the timing messages both
//! serve and the rules of the timing loop both implement), what every
//! answer carries (`envelope.rs`), the transport both sides read lines
//! with (`lines.rs`: spin-then-sleep waits), and the JSON schema generated
//! from the types (`schema.rs`, `schemas/worker-protocol.schema.json`).
//!
//! A leaf below the runner's backends and the native worker: it imports
//! only `measure`, for the stopping rule a check carries (`StopRule`, whose
//! evaluation `Sampling::decide_by` both the lane and the native worker
//! run) and the timers a sample names. `backend` (the runner's side) and
//! `native` (the native worker) import it; it imports neither.

pub mod envelope;
pub mod lines;
pub mod native;
pub mod python;
pub mod schema;
pub mod timing;

pub use envelope::{Answer, Answered, Deferred, Empty, Envelope, FailureKind};
pub use schema::json_schema;
pub use timing::{
    FlushWith, JobSample, JobWarmup, JobsTurns, MoreBatch, Sample, SampleAnswer, StopRule, Then,
    ThenAnswer, Timer, Timing, TurnsAnswer, Warmup, WarmupAnswer,
};
