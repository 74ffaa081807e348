//! Manifests: YAML with spans -> raw serde mirror -> validated [`Experiment`].

pub mod csv_shapes;
pub mod de;
pub mod load;
pub mod model;
pub mod raw;
pub mod yaml;

use std::path::Path;

pub use model::{Experiment, Method, Shape};
pub use raw::RawManifest;

use crate::device::DeviceInfo;
use crate::diag::Diagnostic;

/// Reads, merges, deserialises and validates one manifest.
pub fn load(
    path: &Path,
    overrides: &[String],
    device: &DeviceInfo,
) -> Result<Experiment, Diagnostic> {
    let tree = load::load_tree(path, overrides)?;
    let raw: RawManifest = de::from_node(&tree)?;
    model::validate(raw, &tree, path, device)
}

/// The JSON schema of a manifest, for editors and `schemas/manifest.schema.json`.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(RawManifest);
    serde_json::to_string_pretty(&schema).expect("schema serialises") + "\n"
}
