//! A manifest's outputs: rendered paths that stay inside the results
//! directory and off what the runner keeps there, no two outputs on one
//! path, and an `aot` output's methods. Called from `validate.rs`.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value as Json;

use super::de::Spanned;
use super::model::{
    device_fields, escapes, normal_components, runner_owned, Method, MethodKind, Shape,
    RUNNER_OWNED,
};
use crate::device::DeviceInfo;
use crate::diag::{Diagnostic, Span};
use crate::expr;

/// An `aot` output takes `kind: cuda` methods and Triton methods that say
/// how their kernel is launched (`grid:`, `args:`); a method it names must
/// be one, and without a name there must be one.
pub(super) fn check_aot_output(
    o: &super::raw::RawOutput,
    methods: &[Method],
) -> Result<(), Diagnostic> {
    if o.keys.is_some() {
        return Err(Diagnostic::at(
            o.path.span,
            "`keys` is for `triton_mbucket` outputs; an `aot` dispatcher uses the current M buckets",
        )
        .help("remove `keys:`"));
    }
    let why_not = |m: &Method| -> Option<String> {
        match m.kind {
            MethodKind::Cuda => None,
            MethodKind::Triton if m.grid.is_empty() || m.triton_args.is_empty() => Some(format!(
                "Triton method `{}` needs `grid:` and `args:` (its kernel's parameters that are not constexpr, in order) to be exported",
                m.name
            )),
            MethodKind::Triton => None,
            MethodKind::Hip => Some(format!(
                "method `{}` is `kind: hip`; the aot output loads cubins through the CUDA driver (HIP export is not done)",
                m.name
            )),
            other => Some(format!(
                "method `{}` is `kind: {}`; the aot output exports compiled kernels (`kind: cuda`, Triton)",
                m.name,
                other.as_str()
            )),
        }
    };
    match &o.method {
        Some(name) => match methods.iter().find(|m| m.name == name.value) {
            Some(m) => match why_not(m) {
                Some(why) => Err(Diagnostic::at(name.span, why)
                    .help("e.g. `grid: [\"ceil_div(M, BLOCK_SIZE_M) * ceil_div(N, BLOCK_SIZE_N)\"]` and `args: [a, b, out, M, N, K, ...]`")),
                None => Ok(()),
            },
            // An unknown name is reported by the caller's check.
            None => Ok(()),
        },
        None if methods.iter().all(|m| why_not(m).is_some()) => Err(Diagnostic::at(
            o.path.span,
            "no method of this manifest can be exported by the `aot` output",
        )
        .help("it takes `kind: cuda` methods and Triton methods with `grid:` and `args:`")),
        None => Ok(()),
    }
}

/// The paths outputs render to, by which output (its path's place): two
/// outputs may not write one file, nor one write inside the other's file.
#[derive(Default)]
pub(super) struct ClaimedPaths {
    /// Each rendered path (components joined by `/`) and its output's span.
    files: std::collections::HashMap<String, Span>,
    /// Every folder above a rendered path, and the output that needs it.
    folders: std::collections::HashMap<String, Span>,
}

impl ClaimedPaths {
    pub(super) fn claim(
        &mut self,
        parts: Vec<String>,
        output: &Spanned<String>,
    ) -> Result<(), Diagnostic> {
        let path = parts.join("/");
        let clash = |other: Span, what: &str| {
            Diagnostic::at(
                output.span,
                format!(
                    "output path `{path}` {what} the output at line {}",
                    other.line
                ),
            )
            .help("give each output a path of its own")
        };
        match self.files.get(&path) {
            Some(other) if *other != output.span => {
                return Err(clash(*other, "is also written by"))
            }
            _ => {}
        }
        if let Some(other) = self.folders.get(&path) {
            if *other != output.span {
                return Err(clash(*other, "is a folder of a file written by"));
            }
        }
        for end in 1..parts.len() {
            let folder = parts[..end].join("/");
            if let Some(other) = self.files.get(&folder) {
                return Err(clash(*other, "lies inside a file written by"));
            }
            self.folders.entry(folder).or_insert(output.span);
        }
        self.files.entry(path).or_insert(output.span);
        Ok(())
    }
}

/// Output paths are templates; a rendered path must stay inside the results
/// directory, away from what the runner keeps there. Returns the distinct
/// rendered paths, as components.
pub(super) fn check_output_path(
    template: &Spanned<String>,
    shapes: &[Shape],
    device: &DeviceInfo,
) -> Result<Vec<Vec<String>>, Diagnostic> {
    let span = template.span;
    let mut rendered_paths = HashSet::new();
    for shape in shapes {
        let mut ctx: serde_json::Map<String, Json> =
            shape.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        ctx.insert("device".into(), Json::Object(device_fields(device)));
        let rendered = expr::render_path(template, &ctx).map_err(|why| {
            let shown: String = template.value.chars().take(120).collect();
            Diagnostic::at(span, format!("path template `{shown}` cannot be rendered: {why}"))
                .help(format!(
                    "a path template is text and `{{{{ field }}}}`s: shape fields ({}), device.*, `name[i]` of a list, or an expression of them (`vllm/E={{{{E}}}},N={{{{N}}}}.json`)",
                    shape.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
        })?;
        if !rendered_paths.insert(rendered.clone()) {
            continue;
        }
        if rendered.trim().is_empty() || escapes(Path::new(&rendered)) {
            return Err(Diagnostic::at(
                span,
                format!("output path `{rendered}` leaves the results directory"),
            )
            .help("write a relative path without `..`, such as `report.md` or `vllm/{{E}}.json`"));
        }
        if let Some(owned) = runner_owned(Path::new(&rendered)) {
            return Err(Diagnostic::at(
                span,
                format!("output path `{rendered}` would write over `{owned}`, which the runner keeps in the results directory"),
            )
            .help(format!(
                "the runner owns {} (and every name that starts with `journal.jsonl`); name the output something else, such as `report.md`",
                RUNNER_OWNED.join(", ")
            )));
        }
    }
    Ok(rendered_paths
        .iter()
        .map(|p| normal_components(Path::new(p)))
        .collect())
}
