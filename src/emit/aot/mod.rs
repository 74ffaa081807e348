//! `aot`: the winners as a C library, ahead of time.
//!
//! For one rendered path (a folder), the winning configs of `kind: cuda`
//! methods and of Triton methods become *specialisations*: a compiled image
//! (cubin) with its kernel symbol and the launch the manifest describes
//! (grid, block, shared memory, arguments) translated to C ([`cexpr`]).
//! The folder gets:
//!
//! - `<prefix>.h`, `<prefix>.c`: one launcher per specialisation, a
//!   dispatcher, and the images embedded as byte arrays, loaded through the
//!   CUDA driver API (`cuModuleLoadData`) on first use in the current context;
//! - `<prefix>_<n>.cubin`: each image as a file too;
//! - `index.md`: the buckets, each specialisation (method, config, the shape
//!   it won at, its median, the conditions it needs) and the winners left out
//!   with the reason; `index.json`: the same for programs.
//!
//! `<prefix>` is a C identifier made of the experiment's name and the
//! folder's last component (`quickstart_sm_90`).
//!
//! # The dispatcher
//!
//! `<prefix>_choose(tensors..., ints...)` picks a specialisation by the rule
//! the `triton_mbucket` output's consumers look a config up with (aiter's
//! `get_gemm_config`): the tuned shapes' winners are put in M buckets
//! ([`super::triton_mbucket::buckets`]: `M_LEQ_x` for the smallest standard
//! bound x >= M, the largest tuned M of a bucket winning; `M_GEQ_8192`;
//! `any` for the largest tuned M), and a call's M takes the first `M_LEQ_x`
//! with M <= x in ascending x, else `M_GEQ_8192` when M >= 8192, else `any`.
//! The bucket's specialisation is used when its conditions hold for the
//! call's arguments; otherwise the bucket's other candidates (the same
//! config compiled for other shapes) are tried in order. None fitting:
//! `-1` from `_choose`, `CUDA_ERROR_NOT_FOUND` from `_launch`.
//!
//! Conditions are what the image was compiled for: Triton's specialisation
//! of the tuned shape's arguments (an integer or pointer it assumed divisible
//! by 16, an integer it folded in because it was 1), a scalar that must fit
//! its 32-bit type, a template argument or define computed from a shape
//! field that must come out the same. The writer of the folder
//! (`crate::workbench::aot`) gathers the images; this module only renders.
//!
//! # Rendering
//!
//! The header, source and index.md are minijinja templates (`templates/`)
//! that hold the files' layout; [`context`] gives them every string in its
//! final form (C expressions from [`cexpr`], C string literals, comments and
//! markdown cells escaped, numbers formatted, the image bytes as rows of C).
//! `tests/fixtures/aot/render/` holds what two libraries render to, byte for
//! byte (`tests/aot.rs`).

pub mod cexpr;
mod context;

use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value as Json;

use super::EmitError;

const HEADER_TEMPLATE: &str = include_str!("templates/header.h.j2");
const SOURCE_TEMPLATE: &str = include_str!("templates/source.c.j2");
const INDEX_TEMPLATE: &str = include_str!("templates/index.md.j2");

/// The C interface every specialisation of one dispatcher shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Interface {
    /// The C identifier prefix of every symbol.
    pub prefix: String,
    /// Device pointers, by the problem's tensor names, in order.
    pub tensors: Vec<String>,
    /// `int64_t` parameters: the integer shape fields, in shape order.
    pub ints: Vec<String>,
}

/// One argument of a specialisation's kernel, in the kernel's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// What it is called (the manifest's text or the Triton parameter's name).
    pub name: String,
    /// Its C type (`CUdeviceptr`, `int32_t`, `float`...).
    pub c_type: String,
    /// C code of its value.
    pub value: String,
}

/// A condition a specialisation needs, in C and in words.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub c: String,
    pub text: String,
    /// Triton's specialisation of the tuned shape's arguments (divisible by
    /// 16, folded because it was 1): an image compiled at another shape
    /// may not need it.
    pub specialisation: bool,
}

/// One specialisation: an image and how to launch it.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub method: String,
    /// `cuda`, `triton`.
    pub kind: String,
    pub job_id: String,
    pub config: IndexMap<String, Json>,
    /// The shape the image was compiled at (the tuned shape, or a variant).
    pub compiled_at: IndexMap<String, Json>,
    /// The tuned shape whose winner this is.
    pub won_at: IndexMap<String, Json>,
    pub median_us: Option<f64>,
    pub image: Vec<u8>,
    pub symbol: String,
    /// C code of `int64_t` values.
    pub grid: [String; 3],
    pub block: [String; 3],
    pub shared: String,
    pub params: Vec<Param>,
    pub conditions: Vec<Condition>,
}

/// A winner that could not be exported, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct LeftOut {
    pub shape: IndexMap<String, Json>,
    pub method: String,
    pub job_id: String,
    pub reason: String,
}

/// One dispatcher's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Library {
    pub interface: Interface,
    pub specs: Vec<Spec>,
    /// Bucket key (`M_LEQ_64`, `M_GEQ_8192`, `any`) -> candidate
    /// specialisations, in the order they are tried.
    pub buckets: IndexMap<String, Vec<usize>>,
    pub left_out: Vec<LeftOut>,
    /// What made it: experiment, device, tunelab version.
    pub about: String,
}

/// A file of the folder: name and bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct File {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// A C identifier from free text: other characters become `_`, runs of `_`
/// collapse, a leading digit gets a `_` before it.
pub fn c_identifier(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let c = if c.is_ascii_alphanumeric() { c } else { '_' };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    let out = out.trim_matches('_').to_string();
    match out.chars().next() {
        None => "aot".into(),
        Some(c) if c.is_ascii_digit() => format!("_{out}"),
        Some(_) => out,
    }
}

/// The dispatcher's prefix for an experiment and an output folder.
pub fn prefix(experiment: &str, folder: &str) -> String {
    let last = std::path::Path::new(folder)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    c_identifier(&format!("{experiment}_{last}"))
}

/// The folder's files: header, source, images, index.
pub fn render(lib: &Library) -> Result<Vec<File>, EmitError> {
    // One image per distinct byte string.
    let mut images: Vec<&[u8]> = Vec::new();
    let spec_image: Vec<usize> = lib
        .specs
        .iter()
        .map(
            |s| match images.iter().position(|i| *i == s.image.as_slice()) {
                Some(i) => i,
                None => {
                    images.push(&s.image);
                    images.len() - 1
                }
            },
        )
        .collect();
    let p = &lib.interface.prefix;
    let header = context::header(lib);
    let source = context::source(lib, &images, &spec_image);
    let mut files = vec![
        File {
            name: format!("{p}.h"),
            bytes: render_template(HEADER_TEMPLATE, &header)?.into_bytes(),
        },
        File {
            name: format!("{p}.c"),
            bytes: render_template(SOURCE_TEMPLATE, &source)?.into_bytes(),
        },
    ];
    for (i, image) in images.iter().enumerate() {
        files.push(File {
            name: format!("{p}_{i}.cubin"),
            bytes: image.to_vec(),
        });
    }
    let index = context::index(lib, &spec_image);
    files.push(File {
        name: "index.md".into(),
        bytes: render_template(INDEX_TEMPLATE, &index)?.into_bytes(),
    });
    files.push(File {
        name: "index.json".into(),
        bytes: (serde_json::to_string_pretty(&index_json(lib, &spec_image)).expect("json") + "\n")
            .into_bytes(),
    });
    Ok(files)
}

/// The template's text as it renders: no auto-escaping (C and markdown),
/// a block tag's line gone (`trim_blocks`, `lstrip_blocks`), the final
/// newline kept, an undefined name an error.
fn render_template(template: &str, ctx: &impl Serialize) -> Result<String, EmitError> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(true);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    let error = |e: minijinja::Error| EmitError::Template {
        name: "aot",
        message: format!("{e:#}"),
    };
    env.add_template("t", template).map_err(error)?;
    env.get_template("t")
        .and_then(|t| t.render(ctx))
        .map_err(error)
}

/// What index.md says, for programs: the interface, buckets, each
/// specialisation and the winners left out.
fn index_json(lib: &Library, spec_image: &[usize]) -> Json {
    let i = &lib.interface;
    serde_json::json!({
        "prefix": i.prefix,
        "tensors": i.tensors,
        "ints": i.ints,
        "buckets": lib.buckets,
        "specs": lib.specs.iter().enumerate().map(|(n, s)| serde_json::json!({
            "method": s.method,
            "kind": s.kind,
            "job_id": s.job_id,
            "config": s.config,
            "won_at": s.won_at,
            "compiled_at": s.compiled_at,
            "median_us": s.median_us,
            "image": format!("{}_{}.cubin", i.prefix, spec_image[n]),
            "symbol": s.symbol,
            "conditions": s.conditions.iter().map(|c| &c.text).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "left_out": lib.left_out.iter().map(|l| serde_json::json!({
            "shape": l.shape, "method": l.method, "job_id": l.job_id, "reason": l.reason,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_c() {
        assert_eq!(
            c_identifier("quickstart_sm_90-N=4096"),
            "quickstart_sm_90_N_4096"
        );
        assert_eq!(c_identifier("9lives"), "_9lives");
        assert_eq!(c_identifier("--"), "aot");
        assert_eq!(prefix("quickstart", "aot/sm_90"), "quickstart_sm_90");
    }
}
