//! Tensor sharing: a shape's data made available to the native worker
//! once per shape and seed, and again after either worker restarts. The
//! Python worker builds inputs and reference and exports them (`share`,
//! CUDA IPC handles), the native worker maps them (`import`); with
//! `inputs: native` the Python worker, without torch, only describes them
//! (`native_data`) and the native worker builds them (`build`).

use crate::backend::wire::unfit;
use crate::backend::JobFailure;
use crate::manifest::Shape;
use crate::protocol::native::{self as message, ImportedTensor};
use crate::protocol::python::{ShapeData, ShareAnswer};
use crate::protocol::Answered;
use crate::store::FailureClass;

use super::{LaneBackend, NativeLane};

/// The shape whose tensors the native worker has mapped (or built), for
/// the workers of these generations.
pub(super) struct Shared {
    pub(super) key: String,
    pub(super) python_generation: u64,
    pub(super) native_generation: u64,
    pub(super) reply: ShareAnswer,
}

/// Which shape and inputs a sharing is of.
pub(super) fn share_key(shape: &Shape, seed: u64) -> String {
    format!(
        "{}\u{1}{}",
        serde_json::to_string(shape).expect("shape"),
        seed
    )
}

impl NativeLane {
    /// The shape the native worker now holds (mapped or built), for the
    /// workers of these generations. Recipes name its tensors by index:
    /// another shape, new recipes.
    pub(super) fn hold(&mut self, key: String, python_generation: u64, reply: ShareAnswer) {
        self.recipes.clear();
        self.shared = Some(Shared {
            key,
            python_generation,
            native_generation: self.process.generation(),
            reply,
        });
    }

    /// Whether the shape shared is `key`'s, with both workers that shared it.
    pub(super) fn holds(&self, key: &str, python_generation: u64) -> bool {
        self.shared.as_ref().is_some_and(|s| {
            s.key == key
                && s.python_generation == python_generation
                && s.native_generation == self.process.generation()
        })
    }
}

impl LaneBackend {
    /// Makes the shape's tensors shared with, and mapped by, the native
    /// worker (again after either worker restarted).
    pub(super) fn share(&mut self, shape: &Shape, seed: u64) -> Result<(), JobFailure> {
        let key = share_key(shape, seed);
        let py_gen = self.python.generation();
        let n = self.native.as_mut().expect("a native lane");
        if n.holds(&key, py_gen) {
            return Ok(());
        }
        n.shared = None;
        if n.setup.lane_target.is_some() {
            return self.build(shape, seed, key);
        }
        let problem = self.python.problem().to_string();
        let body = ShapeData {
            problem: &problem,
            shape,
            seed,
        };
        let reply = self.python.request("share", &body)?;
        let py_gen = self.python.generation();
        let reply: ShareAnswer = serde_json::from_value(reply)
            .map_err(|e| unfit("the worker's answer to `share`", e))?;
        let n = self.native.as_mut().expect("a native lane");
        let hello = n.process.start()?;
        let (theirs, ours) = (
            reply.uuid.trim_start_matches("GPU-"),
            hello.uuid.trim_start_matches("GPU-"),
        );
        if !theirs.is_empty() && !ours.is_empty() && theirs != ours {
            return Err(JobFailure::new(
                FailureClass::ProblemError,
                format!("the Python worker runs on GPU {theirs} and the native worker on {ours}: they must share one GPU"),
            ));
        }
        let import = message::Import {
            tensors: reply
                .tensors
                .iter()
                .map(|t| ImportedTensor {
                    handle: t.handle.clone(),
                    offset: t.offset,
                    bytes: t.bytes,
                })
                .collect(),
        };
        n.process
            .call::<Answered<message::ImportAnswer>>("import", &import)?;
        n.hold(key, py_gen, reply);
        Ok(())
    }

    /// `share` for `inputs: native`: the Python worker describes the shape's
    /// data (`native_data`, no torch) and the native worker builds it
    /// (`build`: allocations, the seeded generator, the reference operator).
    fn build(&mut self, shape: &Shape, seed: u64, key: String) -> Result<(), JobFailure> {
        let problem = self.python.problem().to_string();
        let body = ShapeData {
            problem: &problem,
            shape,
            seed,
        };
        let described = self.python.request("native_data", &body)?;
        let py_gen = self.python.generation();
        let reply: ShareAnswer = serde_json::from_value(described)
            .map_err(|e| unfit("the worker's answer to `native_data`", e))?;
        let n = self.native.as_mut().expect("a native lane");
        n.process.start()?;
        n.process
            .call::<Answered<message::BuildAnswer>>("build", &build_request(&reply, seed))?;
        n.hold(key, py_gen, reply);
        Ok(())
    }
}

/// The native worker's `build` of a shape the Python worker described
/// (`native_data`): each tensor's size, type and fill in the described
/// order, and the reference operator over their indices.
pub(super) fn build_request(described: &ShareAnswer, seed: u64) -> message::Build {
    message::Build {
        tensors: described.tensors.iter().map(|t| t.to_build()).collect(),
        seed,
        reference: described.reference_op,
    }
}
