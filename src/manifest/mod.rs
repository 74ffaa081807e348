//! Manifests: YAML with spans -> raw serde mirror -> validated [`Experiment`].
//!
//! - `yaml.rs` parses text into a tree of nodes that remember file:line:column;
//! - `load.rs` merges `extends`, `include` and `--set` on that tree;
//! - `de.rs` deserialises the raw mirror (`raw.rs`) from the tree, handing
//!   spans to [`Spanned`](de::Spanned) fields;
//! - `validate.rs` checks it and resolves it into the types of `model.rs`,
//!   which is all the rest of the program sees: the shape set (`shapes.rs`),
//!   each method (`methods.rs`), tolerance, protocol and search
//!   (`measurement.rs`), the outputs (`outputs.rs`), axis values
//!   (`values.rs`);
//! - `files.rs` reads what a manifest names, only from where it may, and
//!   `limits.rs` says how much a manifest may ask for (docs/limits.md).

mod de;
mod files;
pub mod limits;
mod load;
mod measurement;
mod methods;
mod model;
mod outputs;
mod raw;
mod shapes;
mod validate;
mod values;
mod yaml;

use std::path::{Path, PathBuf};

pub use files::repository_of;
pub use model::*;
pub use validate::default_protocol;

use crate::device::DeviceInfo;
use crate::diag::Diagnostics;

/// Reads, merges, deserialises and validates one manifest. Every
/// independent error is reported at once. The files it names must be in
/// its repository (`files.rs`).
pub fn load(
    path: &Path,
    overrides: &[String],
    device: &DeviceInfo,
) -> Result<Experiment, Diagnostics> {
    load_allowing(path, overrides, &[], device)
}

/// [`load`], also letting the manifest read files in the folders `allow_read`.
pub fn load_allowing(
    path: &Path,
    overrides: &[String],
    allow_read: &[PathBuf],
    device: &DeviceInfo,
) -> Result<Experiment, Diagnostics> {
    let access = files::Access::for_manifest(path, allow_read);
    let tree = load::load_tree(path, overrides, &access)?;
    let raw: raw::RawManifest = de::from_node(&tree)?;
    validate::validate(raw, tree.span, path, &access, device)
}

/// The JSON schema of a manifest, for editors and `schemas/manifest.schema.json`.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(raw::RawManifest);
    serde_json::to_string_pretty(&schema).expect("schema serialises") + "\n"
}
