//! Manifests: YAML with spans -> raw serde mirror -> validated [`Experiment`].
//!
//! - `yaml.rs` parses text into a tree of nodes that remember file:line:column;
//! - `load.rs` merges `extends`, `include` and `--set` on that tree;
//! - `de.rs` deserialises the raw mirror (`raw.rs`) from the tree, handing
//!   spans to [`Spanned`](de::Spanned) fields;
//! - `validate.rs` (with `shapes.rs` and `values.rs`) checks it and resolves
//!   it into the types of `model.rs`, which is all the rest of the program sees.

mod de;
mod load;
mod model;
mod raw;
mod shapes;
mod validate;
mod values;
mod yaml;

use std::path::Path;

pub use model::*;
pub use validate::default_protocol;

use crate::device::DeviceInfo;
use crate::diag::Diagnostics;

/// Reads, merges, deserialises and validates one manifest. Every
/// independent error is reported at once.
pub fn load(
    path: &Path,
    overrides: &[String],
    device: &DeviceInfo,
) -> Result<Experiment, Diagnostics> {
    let tree = load::load_tree(path, overrides)?;
    let raw: raw::RawManifest = de::from_node(&tree)?;
    validate::validate(raw, tree.span, path, device)
}

/// The JSON schema of a manifest, for editors and `schemas/manifest.schema.json`.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(raw::RawManifest);
    serde_json::to_string_pretty(&schema).expect("schema serialises") + "\n"
}
