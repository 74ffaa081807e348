//! How much a manifest may ask for. A manifest of a few hundred bytes can
//! describe gigabytes (YAML aliases that repeat each other, a range with a
//! huge end, loops in a template, a product of many axes), so every stage
//! that expands something counts what it would make before making it, and
//! refuses past these limits with the place and the limit that was hit.
//!
//! Each limit is far above what a tuning experiment uses (the gpt-oss
//! manifests: a few kilobytes, a few hundred values, 144 shapes, spaces of
//! thousands of points) and low enough that refusing takes milliseconds and
//! a few megabytes. docs/manifest.md lists them.

/// Bytes of one manifest file (the manifest, an `extends` parent or an
/// `include`d file) and of a shape CSV.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Bytes of one manifest's text: its files together (the manifest, its
/// `extends` parents, its `include`d files, each time one is named), and
/// the text its YAML aliases repeat, counted each time.
pub const MAX_MANIFEST_BYTES: u64 = MAX_FILE_BYTES;

/// Files one manifest reads: its `extends` parents and `include`d files,
/// each time one is named.
pub const MAX_MANIFEST_FILES: usize = 256;

/// Bytes of a file a method reads (`source`, `ir`): kernels, not data.
pub const MAX_METHOD_FILE_BYTES: u64 = 16 << 20;

/// Values (scalars, lists and mappings) in one manifest after its YAML
/// aliases are expanded, over all its files (each included file counted
/// each time it is included).
pub const MAX_NODES: usize = 250_000;

/// Lists and mappings nested inside each other.
pub const MAX_DEPTH: usize = 64;

/// Values one axis (`{range: ...}`, a list) may hold.
pub const MAX_AXIS_VALUES: u64 = 100_000;

/// Shapes in one shape set, counted before the product is expanded.
pub const MAX_SHAPES: u64 = 100_000;

/// Points of one method's space at one shape before constraints, which is
/// what every strategy walks (random and the surrogate sample from the walk).
pub const MAX_SPACE_POINTS: u64 = 100_000_000;

// Templates and expressions are bounded where they are run:
// `crate::expr::FUEL` and `crate::expr::MAX_RENDERED_BYTES`.
