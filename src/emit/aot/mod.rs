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

pub mod cexpr;

use std::fmt::Write;

use indexmap::IndexMap;
use serde_json::Value as Json;

use super::num::compact_config;
use crate::manifest::shape_label;

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

/// The condition of one bucket key, in C over `M`; `None` for `any`.
fn bucket_test(key: &str, m: &str) -> Option<String> {
    if let Some(x) = key.strip_prefix("M_LEQ_") {
        return Some(format!("{m} <= INT64_C({x})"));
    }
    key.strip_prefix("M_GEQ_")
        .map(|x| format!("{m} >= INT64_C({x})"))
}

/// The folder's files: header, source, images, index.
pub fn render(lib: &Library) -> Vec<File> {
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
    let mut files = vec![
        File {
            name: format!("{p}.h"),
            bytes: header(lib).into_bytes(),
        },
        File {
            name: format!("{p}.c"),
            bytes: source(lib, &images, &spec_image).into_bytes(),
        },
    ];
    for (i, image) in images.iter().enumerate() {
        files.push(File {
            name: format!("{p}_{i}.cubin"),
            bytes: image.to_vec(),
        });
    }
    files.push(File {
        name: "index.md".into(),
        bytes: index(lib, &spec_image).into_bytes(),
    });
    files.push(File {
        name: "index.json".into(),
        bytes: (serde_json::to_string_pretty(&index_json(lib, &spec_image)).expect("json") + "\n")
            .into_bytes(),
    });
    files
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

/// `CUdeviceptr a, CUdeviceptr b, ..., int64_t M, ...`
fn arguments(i: &Interface) -> String {
    i.tensors
        .iter()
        .map(|t| format!("CUdeviceptr {t}"))
        .chain(i.ints.iter().map(|n| format!("int64_t {n}")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `a, b, ..., M, ...`
fn names(i: &Interface) -> String {
    i.tensors
        .iter()
        .chain(i.ints.iter())
        .cloned()
        .collect::<Vec<_>>()
        .join(", ")
}

fn header(lib: &Library) -> String {
    let i = &lib.interface;
    let p = &i.prefix;
    let guard = format!("{}_H", p.to_uppercase());
    let args = arguments(i);
    let mut h = String::new();
    let w = &mut h;
    let _ = writeln!(
        w,
        "/* Generated by tunelab (the `aot` output): {}. */",
        lib.about
    );
    let _ = writeln!(
        w,
        "/* Do not edit; regenerate with `tunelab run` on the manifest. */"
    );
    let _ = writeln!(w, "#ifndef {guard}\n#define {guard}\n");
    let _ = writeln!(w, "#include <stdint.h>\n#include <cuda.h>\n");
    let _ = writeln!(w, "#ifdef __cplusplus\nextern \"C\" {{\n#endif\n");
    let _ = writeln!(w, "/* Specialisations in this library (see index.md). */");
    let _ = writeln!(
        w,
        "#define {}_SPECS {}\n",
        p.to_uppercase(),
        lib.specs.len()
    );
    let _ = writeln!(
        w,
        "/* Loads every image into the current context. Launchers load what they\n   \
         need on first use; neither is thread-safe before the first load. */"
    );
    let _ = writeln!(w, "CUresult {p}_load(void);");
    let _ = writeln!(
        w,
        "/* Unloads the images (from the context they were loaded in). */"
    );
    let _ = writeln!(w, "void {p}_unload(void);\n");
    let _ = writeln!(
        w,
        "/* The specialisation the dispatcher picks for these arguments (M bucket,\n   \
         then its conditions), or -1 when none fits. */"
    );
    let _ = writeln!(w, "int {p}_choose({args});");
    let _ = writeln!(
        w,
        "/* Launches the chosen specialisation on `stream`; CUDA_ERROR_NOT_FOUND when\n   \
         none fits, CUDA_ERROR_INVALID_VALUE for a grid or block out of range. */"
    );
    let _ = writeln!(w, "CUresult {p}_launch(CUstream stream, {args});\n");
    let _ = writeln!(
        w,
        "/* A specialisation's name (method, config, the shape it won at). */"
    );
    let _ = writeln!(w, "const char *{p}_name(int spec);");
    let _ = writeln!(
        w,
        "/* Whether a specialisation's conditions hold for these arguments. */"
    );
    let _ = writeln!(w, "int {p}_fits(int spec, {args});");
    let _ = writeln!(
        w,
        "/* Launches one specialisation, whether or not its conditions hold. */"
    );
    let _ = writeln!(
        w,
        "CUresult {p}_launch_spec(int spec, CUstream stream, {args});\n"
    );
    for (n, s) in lib.specs.iter().enumerate() {
        let _ = writeln!(w, "/* {n}: {} */", describe(s));
        let _ = writeln!(w, "CUresult {p}_{n}_launch(CUstream stream, {args});");
        let _ = writeln!(w, "int {p}_{n}_fits({args});");
    }
    let _ = writeln!(w, "\n#ifdef __cplusplus\n}}\n#endif\n\n#endif");
    h
}

/// `triton BLOCK_SIZE_M=128, ... (won at M=4096, N=..., K=...)`
fn describe(s: &Spec) -> String {
    let mut text = format!(
        "{} ({}) {}, won at {}",
        s.method,
        s.kind,
        compact_config(&s.config),
        shape_label(&s.won_at)
    );
    if s.compiled_at != s.won_at {
        let _ = write!(text, ", compiled at {}", shape_label(&s.compiled_at));
    }
    text.replace("*/", "* /")
}

fn c_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "\\{b:03o}");
                }
            }
        }
    }
    out.push('"');
    out
}

fn source(lib: &Library, images: &[&[u8]], spec_image: &[usize]) -> String {
    let i = &lib.interface;
    let p = &i.prefix;
    let args = arguments(i);
    let call = names(i);
    let mut c = String::new();
    let w = &mut c;
    let _ = writeln!(
        w,
        "/* Generated by tunelab (the `aot` output): {}. */",
        lib.about
    );
    let _ = writeln!(w, "#include \"{p}.h\"\n#include <stddef.h>\n");
    for (n, image) in images.iter().enumerate() {
        let _ = writeln!(
            w,
            "static _Alignas(16) const unsigned char {p}_image_{n}[{}] = {{",
            image.len()
        );
        for chunk in image.chunks(16) {
            let line: Vec<String> = chunk.iter().map(|b| format!("0x{b:02x}")).collect();
            let _ = writeln!(w, "    {},", line.join(", "));
        }
        let _ = writeln!(w, "}};");
    }
    let _ = writeln!(
        w,
        "\nstatic const unsigned char *const {p}_images[{}] = {{{}}};",
        images.len().max(1),
        if images.is_empty() {
            "NULL".to_string()
        } else {
            (0..images.len())
                .map(|n| format!("{p}_image_{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    let _ = writeln!(w, "static CUmodule {p}_modules[{}];", images.len().max(1));
    let specs = lib.specs.len().max(1);
    let _ = writeln!(w, "static CUfunction {p}_functions[{specs}];");
    let _ = writeln!(w, "/* Dynamic shared memory each function is allowed. */");
    let _ = writeln!(w, "static int64_t {p}_shared_allowed[{specs}];");
    let _ = writeln!(
        w,
        "static const int {p}_spec_image[{specs}] = {{{}}};",
        if spec_image.is_empty() {
            "0".to_string()
        } else {
            spec_image
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    let _ = writeln!(
        w,
        "static const char *const {p}_symbols[{specs}] = {{{}}};",
        if lib.specs.is_empty() {
            "NULL".to_string()
        } else {
            lib.specs
                .iter()
                .map(|s| c_string(&s.symbol))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    let _ = writeln!(
        w,
        "static const char *const {p}_names[{specs}] = {{{}}};\n",
        if lib.specs.is_empty() {
            "NULL".to_string()
        } else {
            lib.specs
                .iter()
                .map(|s| c_string(&describe(s)))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    w.push_str(&cexpr::helpers(p));
    let _ = writeln!(
        w,
        "\nstatic CUresult {p}_function(int spec, CUfunction *f) {{\n    \
         if ({p}_functions[spec] == NULL) {{\n        \
         int image = {p}_spec_image[spec];\n        \
         if ({p}_modules[image] == NULL) {{\n            \
         CUresult r = cuModuleLoadData(&{p}_modules[image], {p}_images[image]);\n            \
         if (r != CUDA_SUCCESS) return r;\n        \
         }}\n        \
         CUresult r = cuModuleGetFunction(&{p}_functions[spec], {p}_modules[image], {p}_symbols[spec]);\n        \
         if (r != CUDA_SUCCESS) return r;\n    \
         }}\n    \
         *f = {p}_functions[spec];\n    \
         return CUDA_SUCCESS;\n}}\n"
    );
    let _ = writeln!(
        w,
        "CUresult {p}_load(void) {{\n    \
         for (int spec = 0; spec < {}; spec++) {{\n        \
         CUfunction f;\n        \
         CUresult r = {p}_function(spec, &f);\n        \
         if (r != CUDA_SUCCESS) return r;\n    \
         }}\n    \
         return CUDA_SUCCESS;\n}}\n",
        lib.specs.len()
    );
    let _ = writeln!(
        w,
        "void {p}_unload(void) {{\n    \
         for (int spec = 0; spec < {specs}; spec++) {{\n        \
         {p}_functions[spec] = NULL;\n        \
         {p}_shared_allowed[spec] = 0;\n    \
         }}\n    \
         for (int image = 0; image < {}; image++) {{\n        \
         if ({p}_modules[image] != NULL) cuModuleUnload({p}_modules[image]);\n        \
         {p}_modules[image] = NULL;\n    \
         }}\n}}\n",
        images.len()
    );
    let _ = writeln!(
        w,
        "const char *{p}_name(int spec) {{\n    \
         return spec >= 0 && spec < {} ? {p}_names[spec] : NULL;\n}}\n",
        lib.specs.len()
    );
    let unused: String = i
        .tensors
        .iter()
        .chain(i.ints.iter())
        .map(|n| format!("    (void){n};\n"))
        .collect();
    for (n, s) in lib.specs.iter().enumerate() {
        let _ = writeln!(w, "/* {n}: {} */", describe(s));
        // Conditions.
        let _ = writeln!(w, "int {p}_{n}_fits({args}) {{");
        w.push_str(&unused);
        if s.conditions.is_empty() {
            let _ = writeln!(w, "    return 1;");
        } else {
            for cond in &s.conditions {
                let _ = writeln!(
                    w,
                    "    if (!({})) return 0; /* {} */",
                    cond.c,
                    cond.text.replace("*/", "* /")
                );
            }
            let _ = writeln!(w, "    return 1;");
        }
        let _ = writeln!(w, "}}\n");
        // Launcher.
        let _ = writeln!(w, "CUresult {p}_{n}_launch(CUstream stream, {args}) {{");
        w.push_str(&unused);
        let _ = writeln!(w, "    CUfunction f;");
        let _ = writeln!(w, "    CUresult r = {p}_function({n}, &f);");
        let _ = writeln!(w, "    if (r != CUDA_SUCCESS) return r;");
        let _ = writeln!(
            w,
            "    const int64_t grid[3] = {{{}, {}, {}}};",
            s.grid[0], s.grid[1], s.grid[2]
        );
        let _ = writeln!(
            w,
            "    const int64_t block[3] = {{{}, {}, {}}};",
            s.block[0], s.block[1], s.block[2]
        );
        let _ = writeln!(w, "    const int64_t shared = {};", s.shared);
        let _ = writeln!(
            w,
            "    for (int d = 0; d < 3; d++)\n        \
             if (grid[d] < 1 || grid[d] > INT64_C(0xffffffff) || block[d] < 1 || block[d] > INT64_C(1024))\n            \
             return CUDA_ERROR_INVALID_VALUE;"
        );
        let _ = writeln!(
            w,
            "    if (shared < 0 || shared > INT64_C(0xffffffff)) return CUDA_ERROR_INVALID_VALUE;"
        );
        let _ = writeln!(
            w,
            "    if (shared > INT64_C(49152) && shared > {p}_shared_allowed[{n}]) {{\n        \
             r = cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)shared);\n        \
             if (r != CUDA_SUCCESS) return r;\n        \
             {p}_shared_allowed[{n}] = shared;\n    \
             }}"
        );
        for (k, param) in s.params.iter().enumerate() {
            let _ = writeln!(
                w,
                "    {} p{k} = ({})({}); /* {} */",
                param.c_type,
                param.c_type,
                param.value,
                param.name.replace("*/", "* /")
            );
        }
        if s.params.is_empty() {
            let _ = writeln!(w, "    void **params = NULL;");
        } else {
            let refs: Vec<String> = (0..s.params.len()).map(|k| format!("&p{k}")).collect();
            let _ = writeln!(w, "    void *params[] = {{{}}};", refs.join(", "));
        }
        let _ = writeln!(
            w,
            "    return cuLaunchKernel(f, (unsigned int)grid[0], (unsigned int)grid[1], (unsigned int)grid[2],\n        \
             (unsigned int)block[0], (unsigned int)block[1], (unsigned int)block[2],\n        \
             (unsigned int)shared, stream, params, NULL);\n}}\n"
        );
    }
    // Per-spec tables of function pointers.
    let _ = writeln!(w, "int {p}_fits(int spec, {args}) {{");
    let _ = writeln!(w, "    switch (spec) {{");
    for n in 0..lib.specs.len() {
        let _ = writeln!(w, "    case {n}: return {p}_{n}_fits({call});");
    }
    let _ = writeln!(
        w,
        "    default:\n{}        return 0;\n    }}\n}}\n",
        unused.replace("    (void)", "        (void)")
    );
    let _ = writeln!(
        w,
        "CUresult {p}_launch_spec(int spec, CUstream stream, {args}) {{"
    );
    let _ = writeln!(w, "    switch (spec) {{");
    for n in 0..lib.specs.len() {
        let _ = writeln!(w, "    case {n}: return {p}_{n}_launch(stream, {call});");
    }
    let _ = writeln!(
        w,
        "    default:\n        (void)stream;\n{}        return CUDA_ERROR_NOT_FOUND;\n    }}\n}}\n",
        unused.replace("    (void)", "        (void)")
    );
    // The dispatcher.
    let _ = writeln!(
        w,
        "/* The M buckets of the tuned table, and each one's candidates in order. */"
    );
    let mut arrays = Vec::new();
    for (b, (key, cands)) in lib.buckets.iter().enumerate() {
        let name = format!("{p}_bucket_{b}");
        let _ = writeln!(
            w,
            "static const int {name}[{}] = {{{}}}; /* {key} */",
            cands.len().max(1),
            if cands.is_empty() {
                "-1".to_string()
            } else {
                cands
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        arrays.push((key.as_str(), name, cands.len()));
    }
    let m = i.ints.iter().find(|n| *n == "M").cloned();
    let _ = writeln!(w, "\nint {p}_choose({args}) {{");
    let _ = writeln!(w, "    const int *candidates = NULL;\n    int count = 0;");
    // M_LEQ ascending (file order), then M_GEQ, then any.
    let mut first = true;
    let ordered = arrays
        .iter()
        .filter(|(k, _, _)| k.starts_with("M_LEQ_"))
        .chain(arrays.iter().filter(|(k, _, _)| k.starts_with("M_GEQ_")));
    for (key, name, len) in ordered {
        let Some(test) = m.as_deref().and_then(|m| bucket_test(key, m)) else {
            continue;
        };
        let _ = writeln!(
            w,
            "    {}if ({test}) {{ candidates = {name}; count = {len}; }}",
            if first { "" } else { "else " }
        );
        first = false;
    }
    if let Some((_, name, len)) = arrays.iter().find(|(k, _, _)| *k == "any") {
        let _ = writeln!(
            w,
            "    {}{{ candidates = {name}; count = {len}; }}",
            if first { "" } else { "else " }
        );
    }
    if m.is_none() {
        let _ = writeln!(w, "{unused}");
    }
    let _ = writeln!(
        w,
        "    for (int k = 0; k < count; k++)\n        \
         if ({p}_fits(candidates[k], {call})) return candidates[k];\n    \
         return -1;\n}}\n"
    );
    let _ = writeln!(
        w,
        "CUresult {p}_launch(CUstream stream, {args}) {{\n    \
         int spec = {p}_choose({call});\n    \
         if (spec < 0) return CUDA_ERROR_NOT_FOUND;\n    \
         return {p}_launch_spec(spec, stream, {call});\n}}"
    );
    c
}

fn index(lib: &Library, spec_image: &[usize]) -> String {
    let i = &lib.interface;
    let p = &i.prefix;
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "# AOT export: `{p}`\n");
    let _ = writeln!(w, "Generated by tunelab from {}.\n", lib.about);
    let _ = writeln!(
        w,
        "`{p}.h` / `{p}.c`: `CUresult {p}_launch(CUstream stream, {})` picks a \
         specialisation by M bucket (the `triton_mbucket` rule) and launches it; \
         `{p}_choose` says which, `{p}_<n>_launch` launches one. Images are \
         embedded in `{p}.c` and loaded with `cuModuleLoadData` in the current \
         context; they are also here as `{p}_<n>.cubin`. Build: \
         `cc -c {p}.c -I<dir of cuda.h>`, link with `-lcuda`.\n",
        arguments(i)
    );
    let _ = writeln!(w, "## Buckets\n");
    let _ = writeln!(w, "| bucket | candidates, in order |");
    let _ = writeln!(w, "| --- | --- |");
    for (key, cands) in &lib.buckets {
        let list: Vec<String> = cands.iter().map(|c| c.to_string()).collect();
        let _ = writeln!(w, "| `{key}` | {} |", list.join(", "));
    }
    let _ = writeln!(w, "\n## Specialisations\n");
    let _ = writeln!(
        w,
        "| # | method | config | won at | compiled at | median µs | image | symbol | conditions |"
    );
    let _ = writeln!(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (n, s) in lib.specs.iter().enumerate() {
        let conds: Vec<String> = s.conditions.iter().map(|c| c.text.clone()).collect();
        let _ = writeln!(
            w,
            "| {n} | {} ({}) | `{}` | {} | {} | {} | `{p}_{}.cubin` | `{}` | {} |",
            s.method,
            s.kind,
            compact_config(&s.config),
            shape_label(&s.won_at),
            shape_label(&s.compiled_at),
            s.median_us.map_or("—".into(), |m| format!("{m:.2}")),
            spec_image[n],
            s.symbol,
            if conds.is_empty() {
                "none".into()
            } else {
                conds.join("; ").replace('|', "\\|")
            }
        );
    }
    if !lib.left_out.is_empty() {
        let _ = writeln!(w, "\n## Left out\n");
        let _ = writeln!(w, "| shape | method | job | why |");
        let _ = writeln!(w, "| --- | --- | --- | --- |");
        for l in &lib.left_out {
            let _ = writeln!(
                w,
                "| {} | {} | `{}` | {} |",
                shape_label(&l.shape),
                l.method,
                l.job_id,
                l.reason.replace('|', "\\|").replace('\n', " ")
            );
        }
    }
    out
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

    #[test]
    fn bucket_tests_follow_the_keys() {
        assert_eq!(bucket_test("M_LEQ_64", "M").unwrap(), "M <= INT64_C(64)");
        assert_eq!(
            bucket_test("M_GEQ_8192", "M").unwrap(),
            "M >= INT64_C(8192)"
        );
        assert!(bucket_test("any", "M").is_none());
    }

    #[test]
    fn strings_are_escaped_for_c() {
        assert_eq!(c_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(c_string("µ"), "\"\\302\\265\"");
    }
}
