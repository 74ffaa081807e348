//! Raw manifest -> validated [`Experiment`]: every cross-field rule is checked
//! here, with errors pointing at the manifest line that needs changing.
//!
//! Independent parts (the name, the problem, the shape set, each method, the
//! tolerance, the protocol, the search, each output, each companion) are
//! checked one after another and every error found is reported together;
//! within one part, the first error stops that part, since what follows
//! usually depends on it.

use std::path::Path;

use super::de::{place, Spanned};
use super::files::{Access, Files};
use super::measurement::{protocol, search, tolerance};
use super::methods::method;
use super::model::{
    Experiment, InputSource, InterpreterPlan, LaunchPath, MethodKind, Output, BUILTIN_PROBLEMS,
};
use super::outputs::{check_aot_output, check_output_path, ClaimedPaths};
use super::raw::{RawInterpreter, RawKeys, RawManifest};
use super::shapes;
use super::values::unknown;
use crate::device::DeviceInfo;
use crate::diag::{Diagnostic, Diagnostics, Span};
use crate::expr;
use crate::measure::Protocol;

/// Checks a raw manifest against itself and the device facts. `root` is the
/// manifest's first line: where an error about a value nobody wrote (a
/// default) points.
pub fn validate(
    raw: RawManifest,
    root: Span,
    manifest_path: &Path,
    access: &Access,
    device: &DeviceInfo,
) -> Result<Experiment, Diagnostics> {
    let mut found = Found::default();
    let files = Files {
        base_dir: manifest_path.parent().unwrap_or(Path::new(".")),
        access,
    };
    let env = expr::environment();

    found.take(check_name(&raw.experiment));
    found.take(check_problem(&raw.problem));
    let shapes = found.take(shapes::expand(&raw.shapes, &files));
    let interpreter = raw
        .interpreter
        .as_ref()
        .and_then(|i| found.take(interpreter_plan(i, &files, root)));
    let tolerance = found.take(tolerance(&raw.tolerance, root));
    let protocol = found.take(protocol(&raw.protocol, root));
    let search = found.take(search(&raw.search, root));

    let mut methods = Vec::new();
    if raw.methods.is_empty() {
        found.push(
            Diagnostic::at(place(raw.methods.span, root), "`methods` is empty")
                .help("declare at least one method, e.g. `triton: {kind: triton, kernel: matmul}`"),
        );
    }
    if let Some(shapes) = &shapes {
        let shape_fields: Vec<String> = shapes[0].keys().cloned().collect();
        for (name, m) in raw.methods.iter() {
            if let Some(method) = found.take(method(name, m, &shape_fields, &env, device, &files)) {
                methods.push(method);
            }
        }
    }

    let method_names: Vec<&str> = raw.methods.keys().map(|k| k.as_str()).collect();
    let mut outputs = Vec::new();
    let mut claimed = ClaimedPaths::default();
    for o in &raw.outputs {
        let checked = (|| {
            if let Some(m) = &o.method {
                if !method_names.contains(&m.as_str()) {
                    return Err(unknown(m.span, "method", m, &method_names));
                }
            }
            if o.format == super::model::OutputFormat::Ir
                && (o.path.contains("{{") || o.path.contains("{%"))
            {
                return Err(Diagnostic::at(
                    o.path.span,
                    "an `ir` output names one folder, not a template",
                )
                .help("write a plain folder such as `ir`: each winner gets a folder per shape and method in it"));
            }
            // (When a method failed, its error says enough.)
            if o.format == super::model::OutputFormat::Aot && methods.len() == raw.methods.len() {
                check_aot_output(o, &methods)?;
            }
            let shape_sets = [
                shapes.as_deref(),
                interpreter.as_ref().map(|i| &i.shapes[..]),
            ];
            for shapes in shape_sets.into_iter().flatten() {
                for path in check_output_path(&o.path, shapes, device)? {
                    claimed.claim(path, &o.path)?;
                }
            }
            Ok(Output {
                format: o.format,
                path: o.path.value.clone(),
                method: o.method.as_ref().map(|m| m.value.clone()),
                legacy_keys: o.keys == Some(RawKeys::Legacy),
                span: o.path.span,
            })
        })();
        if let Some(out) = found.take(checked) {
            outputs.push(out);
        }
    }

    let mut companions = Vec::new();
    for c in &raw.companions {
        let path = match files.resolve(c, "companions") {
            Ok(path) => path,
            Err(d) => {
                found.push(d);
                continue;
            }
        };
        if !path.is_file() {
            found.push(
                Diagnostic::at(
                    c.span,
                    format!("companion manifest `{}` not found", c.value),
                )
                .help(format!(
                    "paths are relative to this manifest: looked for {}",
                    path.display()
                )),
            );
        } else if path.canonicalize().ok() == manifest_path.canonicalize().ok() {
            found.push(Diagnostic::at(
                c.span,
                "a manifest cannot be its own companion",
            ));
        } else {
            companions.push(path);
        }
    }

    let mut python_path = Vec::new();
    for dir in &raw.python_path {
        let path = match files.resolve(dir, "python_path") {
            Ok(path) => path,
            Err(d) => {
                found.push(d);
                continue;
            }
        };
        match path.canonicalize() {
            Ok(p) if p.is_dir() => python_path.push(p),
            _ => found.push(
                Diagnostic::at(
                    dir.span,
                    format!("`python_path` folder `{}` not found", dir.value),
                )
                .help(format!(
                    "folders are relative to this manifest: looked for {}",
                    path.display()
                )),
            ),
        }
    }

    if let Some(inputs) = raw
        .inputs
        .as_ref()
        .filter(|i| i.value == InputSource::Native)
    {
        // Every method's data comes from the native worker, so only what it
        // launches can use it.
        for m in methods.iter().filter(|m| m.launch != LaunchPath::Native) {
            found.push(
                Diagnostic::at(
                    inputs.span,
                    format!(
                        "`inputs: native` has the native worker build the data, which only native launches read; method `{}` is launched by its Python worker",
                        m.name
                    ),
                )
                .help(if m.kind == MethodKind::Triton {
                    format!(
                        "give `{}` `launch: native`, or leave `inputs:` out (the Python worker builds the data)",
                        m.name
                    )
                } else {
                    format!(
                        "a `kind: {}` method runs in Python: move `{}` to a manifest of its own, or leave `inputs:` out (the Python worker builds the data)",
                        m.kind.as_str(),
                        m.name
                    )
                }),
            );
        }
    }

    if !found.errors.is_empty() {
        // In the order a reader meets them in the file.
        found
            .errors
            .sort_by_key(|d| d.span.map(|s| (s.file.raw(), s.line, s.col)));
        return Err(Diagnostics(found.errors));
    }
    let (Some(shapes), Some(tolerance), Some(protocol), Some(search)) =
        (shapes, tolerance, protocol, search)
    else {
        unreachable!("a part that failed left an error");
    };
    let canonical = serde_json::to_string(&raw).expect("manifest serialises");
    Ok(Experiment {
        name: raw.experiment.value.clone(),
        description: raw.description.clone(),
        problem: raw.problem.value.clone(),
        problem_span: raw.problem.span,
        manifest_path: manifest_path.to_path_buf(),
        manifest_hash: blake3::hash(canonical.as_bytes()).to_hex()[..16].to_string(),
        shapes,
        shapes_span: raw.shapes.span,
        methods,
        tolerance,
        protocol,
        search,
        outputs,
        interpreter,
        companions,
        python_path,
        compared: Vec::new(),
        inputs: raw.inputs.as_ref().map_or(InputSource::Python, |i| i.value),
    })
}

/// The errors found so far.
#[derive(Default)]
struct Found {
    errors: Vec<Diagnostic>,
}

impl Found {
    fn take<T>(&mut self, r: Result<T, Diagnostic>) -> Option<T> {
        r.map_err(|e| self.errors.push(e)).ok()
    }

    fn push(&mut self, d: Diagnostic) {
        self.errors.push(d);
    }
}

/// The resolved protocol when the manifest says nothing: the defaults.
pub fn default_protocol() -> Protocol {
    protocol(&Spanned::default(), Span::default()).expect("the defaults are valid")
}

fn check_name(name: &Spanned<String>) -> Result<(), Diagnostic> {
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if plain {
        return Ok(());
    }
    Err(Diagnostic::at(
        name.span,
        format!("experiment name `{}` is not a plain name", name.value),
    )
    .help("use letters, digits, `-` and `_` only; it names the results directory"))
}

fn check_problem(problem: &Spanned<String>) -> Result<(), Diagnostic> {
    if BUILTIN_PROBLEMS.contains(&problem.as_str()) {
        return Ok(());
    }
    if let Some((module, class)) = problem.split_once(':') {
        let ident = |s: &str| {
            !s.is_empty()
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !s.starts_with(|c: char| c.is_ascii_digit())
        };
        if module.split('.').all(ident) && ident(class) {
            return Ok(());
        }
    }
    Err(
        unknown(problem.span, "problem", problem, BUILTIN_PROBLEMS).help(format!(
            "use a builtin ({}) or a Python class as \"module.path:ClassName\"",
            BUILTIN_PROBLEMS.join(", ")
        )),
    )
}

fn interpreter_plan(
    i: &RawInterpreter,
    files: &Files<'_>,
    root: Span,
) -> Result<InterpreterPlan, Diagnostic> {
    Ok(InterpreterPlan {
        shapes: shapes::expand(&i.shapes, files)?,
        max_configs: i.max_configs.max(1),
        tolerance: i
            .tolerance
            .as_ref()
            .map(|t| tolerance(t, root))
            .transpose()?,
    })
}

// ---------------------------------------------------------------------------
// Tolerance, protocol, search, outputs
