//! Raw manifest -> validated [`Experiment`]: every cross-field rule is checked
//! here, with errors pointing at the manifest line that needs changing.
//!
//! Independent parts (the name, the problem, the shape set, each method, the
//! tolerance, the protocol, the search, each output, each companion) are
//! checked one after another and every error found is reported together;
//! within one part, the first error stops that part, since what follows
//! usually depends on it.

use std::collections::HashSet;
use std::path::Path;

use indexmap::IndexMap;
use serde_json::Value as Json;

use super::de::Spanned;
use super::files::{Access, Files};
use super::limits;
use super::model::{
    builtin_baseline, device_fields, escapes, normal_components, runner_owned, Axis, Baseline,
    BaselineValue, DtypeOverride, Experiment, Expr, InputSource, InterpreterPlan, KernelArg,
    LaunchPath, Method, MethodKind, NativeSpec, Output, ScalarType, Shape, Tolerance,
    BUILTIN_BASELINES, BUILTIN_PROBLEMS, DTYPES, IR_EXTENSIONS, RUNNER_OWNED,
};
use super::raw::{
    FlushWith, RawInterpreter, RawKeys, RawManifest, RawMethod, RawProtocol, RawSearch,
    RawStrategy, RawTolerance,
};
use super::shapes;
use super::values::{axis_value_spans, axis_values, check_one_type, unknown};
use super::yaml::{Node, Value};
use crate::device::DeviceInfo;
use crate::diag::{did_you_mean, Diagnostic, Diagnostics, Span};
use crate::expr;
use crate::measure::{L2Flush, Protocol, Timing};
use crate::search::{Search, SearchKind};

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
    let mut fuel_left = expr::TOTAL_FUEL;
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
                for path in check_output_path(&o.path, &env, shapes, device, &mut fuel_left)? {
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

/// A span, or `fallback` for a value that was not written (a default).
fn place(span: Span, fallback: Span) -> Span {
    if span.line == 0 {
        fallback
    } else {
        span
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
// Methods and expressions

fn method(
    name: &Spanned<String>,
    m: &Spanned<RawMethod>,
    shape_fields: &[String],
    env: &minijinja::Environment<'static>,
    device: &DeviceInfo,
    files: &Files<'_>,
) -> Result<Method, Diagnostic> {
    // Every name a config can carry, with where it was declared, to catch clashes.
    let mut declared: IndexMap<String, (Span, &'static str)> = IndexMap::new();
    for f in shape_fields {
        declared.insert(f.clone(), (m.span, "shape field"));
    }
    let mut key_spans = IndexMap::new();
    for k in m.params.keys() {
        declare(&mut declared, k, "parameter")?;
        key_spans.insert(k.value.clone(), k.span);
    }
    let params = shapes::scalar_fields(&m.params, "parameter")?;
    let param_spans = m
        .params
        .iter()
        .map(|(k, v)| (k.value.clone(), v.span))
        .collect();
    let mut axes = Vec::new();
    for (k, v) in &m.space {
        declare(&mut declared, k, "space parameter")?;
        key_spans.insert(k.value.clone(), k.span);
        let values = axis_values(v, k, false)?;
        check_one_type(v, k)?;
        axes.push(Axis {
            name: k.value.clone(),
            value_spans: axis_value_spans(v, values.len()),
            values,
        });
    }
    check_space_size(name, &axes)?;

    let mut known: Vec<String> = declared.keys().cloned().collect();
    let mut derived = Vec::new();
    for (k, source) in &m.derived {
        let e = Expr {
            source: source.value.clone(),
            span: source.span,
        };
        check_expr(&e, env, &known, device)?;
        declare(&mut declared, k, "derived value")?;
        key_spans.insert(k.value.clone(), k.span);
        known.push(k.value.clone());
        derived.push((k.value.clone(), e));
    }
    let mut constraints = Vec::new();
    for source in m.constraints.iter() {
        let e = Expr {
            source: source.value.clone(),
            span: source.span,
        };
        check_expr(&e, env, &known, device)?;
        constraints.push(e);
    }

    let baseline = match &m.baseline {
        None => None,
        Some(node) => Some(baseline(node, &known, env, device)?),
    };
    let own_search = m.search.as_ref().map(|s| search(s, m.span)).transpose()?;
    if let (Some(b), Some(node)) = (&baseline, &m.baseline) {
        for (k, _) in &b.values {
            let tunable = m.space.keys().any(|s| s.value == *k);
            if !tunable && !params.contains_key(k) {
                let at = match &node.value {
                    Value::Map(entries) => entries
                        .iter()
                        .find(|(key, _)| key.name == *k)
                        .map_or(node.span, |(key, _)| key.span),
                    _ => node.span,
                };
                return Err(Diagnostic::at(
                    at,
                    format!(
                        "baseline sets `{k}`, which is not a parameter of method `{}`",
                        name.value
                    ),
                )
                .help("a baseline gives values for the method's space parameters"));
            }
        }
    }

    let (launch, grid, native, triton_args) = native_parts(name, m, &known, env, device, files)?;
    let mut identity = blake3::Hasher::new();
    identity.update(
        format!(
            "{:?}\0{}\0{}\0",
            m.kind,
            m.kernel.value,
            m.version.as_deref().unwrap_or("")
        )
        .as_bytes(),
    );
    if native.is_some() {
        // What is compiled and how it is launched define the method's code too.
        identity.update(native_identity(m).as_bytes());
    }
    let ir = match &m.ir {
        None => None,
        Some(file) => {
            let (path, bytes) = ir_file(file, m.kind, files)?;
            identity.update(b"\0ir\0");
            identity.update(&bytes);
            Some(path)
        }
    };
    if let Some(source) = &m.source {
        let (_, bytes) = files.read(
            source,
            "source",
            "method source",
            limits::MAX_METHOD_FILE_BYTES,
        )?;
        identity.update(&bytes);
    }
    Ok(Method {
        name: name.value.clone(),
        kind: m.kind,
        kernel: m.kernel.value.clone(),
        kernel_span: m.kernel.span,
        identity: identity.finalize().to_hex()[..16].to_string(),
        params,
        axes,
        constraints,
        derived,
        baseline,
        search: own_search,
        span: m.span,
        constraints_span: place(m.constraints.span, m.span),
        key_spans,
        param_spans,
        launch,
        grid,
        native,
        triton_args,
        ir,
        fixed: None,
    })
}

/// An `aot` output takes `kind: cuda` methods and Triton methods that say
/// how their kernel is launched (`grid:`, `args:`); a method it names must
/// be one, and without a name there must be one.
fn check_aot_output(o: &super::raw::RawOutput, methods: &[Method]) -> Result<(), Diagnostic> {
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

/// The text of a native method's compile and launch fields, for its identity.
fn native_identity(m: &RawMethod) -> String {
    let list = |v: &Option<Spanned<Vec<Spanned<String>>>>| {
        v.as_ref()
            .map(|l| {
                l.iter()
                    .map(|e| e.value.as_str())
                    .collect::<Vec<_>>()
                    .join("\u{1}")
            })
            .unwrap_or_default()
    };
    let args = m
        .args
        .as_ref()
        .map(|a| {
            a.iter()
                .map(|n| n.to_json().to_string())
                .collect::<Vec<_>>()
                .join("\u{1}")
        })
        .unwrap_or_default();
    let defines: Vec<String> = m
        .defines
        .iter()
        .map(|(k, v)| format!("{}={}", k.value, v.value))
        .collect();
    let options: Vec<&str> = m.compile_options.iter().map(|o| o.as_str()).collect();
    format!(
        "{}\0{}\0{}\0{}\0{}\0{}\0{}\0{}",
        list(&m.grid),
        list(&m.block),
        m.shared_mem.as_ref().map_or("", |s| s.as_str()),
        args,
        list(&m.template),
        defines.join("\u{1}"),
        options.join("\u{1}"),
        m.source.as_ref().map_or("", |s| s.as_str()),
    )
}

/// A method's launch path, grid, native spec and Triton arguments.
type LaunchParts = (LaunchPath, Vec<Expr>, Option<NativeSpec>, Vec<KernelArg>);

/// The launch path, grid, native spec and Triton arguments of a method,
/// checked: `kind: cuda|hip` needs a source, a grid, a block and arguments;
/// the compile and launch fields belong to those kinds only (a Triton method
/// may give a grid and arguments, for the `aot` output).
fn native_parts(
    name: &Spanned<String>,
    m: &Spanned<RawMethod>,
    known: &[String],
    env: &minijinja::Environment<'static>,
    device: &DeviceInfo,
    files: &Files<'_>,
) -> Result<LaunchParts, Diagnostic> {
    let kind = m.kind;
    let exprs = |list: &Spanned<Vec<Spanned<String>>>| -> Result<Vec<Expr>, Diagnostic> {
        list.iter()
            .map(|s| {
                let e = Expr {
                    source: s.value.clone(),
                    span: s.span,
                };
                check_expr(&e, env, known, device).map(|_| e)
            })
            .collect()
    };
    let dims =
        |field: &str, list: &Spanned<Vec<Spanned<String>>>| -> Result<Vec<Expr>, Diagnostic> {
            if list.is_empty() || list.len() > 3 {
                return Err(Diagnostic::at(
                    place(list.span, m.span),
                    format!(
                        "`{field}` takes one to three expressions (x, y, z), found {}",
                        list.len()
                    ),
                )
                .help(format!(
                    "e.g. `{field}: [\"ceil_div(N, BLOCK_N)\", \"ceil_div(M, BLOCK_M)\"]`"
                )));
            }
            exprs(list)
        };
    let launch = m.launch.as_ref().map(|l| (l.value, l.span));
    if !kind.is_native() {
        // Fields that only a natively compiled method has.
        let only_native: [(&str, Option<Span>); 7] = [
            ("block", m.block.as_ref().map(|b| b.span)),
            ("shared_mem", m.shared_mem.as_ref().map(|b| b.span)),
            (
                "args",
                m.args
                    .as_ref()
                    .filter(|_| kind != MethodKind::Triton)
                    .map(|b| b.span),
            ),
            ("template", m.template.as_ref().map(|b| b.span)),
            ("defines", m.defines.keys().next().map(|k| k.span)),
            ("compile_options", m.compile_options.first().map(|o| o.span)),
            (
                "grid",
                m.grid
                    .as_ref()
                    .filter(|_| kind != MethodKind::Triton)
                    .map(|g| g.span),
            ),
        ];
        if let Some((field, span)) = only_native.iter().find(|(_, s)| s.is_some()) {
            return Err(Diagnostic::at(
                place(span.expect("found"), m.span),
                format!(
                    "`{field}` is for methods of `kind: cuda` or `kind: hip`; method `{}` is `kind: {}`",
                    name.value,
                    kind.as_str()
                ),
            )
            .help("remove it, or make the method `kind: cuda` with its `source:` file"));
        }
        if let Some((LaunchPath::Native, span)) = launch {
            if kind != MethodKind::Triton {
                return Err(Diagnostic::at(
                    span,
                    format!(
                        "`launch: native` is for Triton methods; method `{}` is `kind: {}`",
                        name.value,
                        kind.as_str()
                    ),
                )
                .help("its Python worker launches it: remove `launch:`"));
            }
        }
        let grid = m.grid.as_ref().map(|g| dims("grid", g)).transpose()?;
        let mut args = Vec::new();
        for node in m.args.iter().flat_map(|a| a.iter()) {
            args.push(kernel_arg(node, known, env, device)?);
        }
        return Ok((
            launch.map_or(LaunchPath::Python, |l| l.0),
            grid.unwrap_or_default(),
            None,
            args,
        ));
    }
    if let Some((LaunchPath::Python, span)) = launch {
        return Err(Diagnostic::at(
            span,
            format!(
                "a `kind: {}` method is always launched natively; `launch: python` does not apply",
                kind.as_str()
            ),
        )
        .help("remove `launch:`"));
    }
    let needs = |field: &str, what: &str| {
        Diagnostic::at(
            name.span,
            format!(
                "method `{}` (`kind: {}`) needs `{field}:`",
                name.value,
                kind.as_str()
            ),
        )
        .help(what.to_string())
    };
    let Some(source) = &m.source else {
        return Err(needs(
            "source",
            "the file (relative to this manifest) that defines the kernel, e.g. `source: kernels/gemm.cu`",
        ));
    };
    let ident = |s: &str| {
        !s.is_empty()
            && s.split("::").all(|p| {
                !p.is_empty()
                    && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !p.starts_with(|c: char| c.is_ascii_digit())
            })
    };
    if !ident(&m.kernel.value) {
        return Err(Diagnostic::at(
            m.kernel.span,
            format!("`kernel: {}` is not a C++ function name", m.kernel.value),
        )
        .help("name the `__global__` function; its template arguments go in `template:`"));
    }
    let grid = match &m.grid {
        Some(g) => dims("grid", g)?,
        None => return Err(needs(
            "grid",
            "blocks per grid, e.g. `grid: [\"ceil_div(N, BLOCK_N)\", \"ceil_div(M, BLOCK_M)\"]`",
        )),
    };
    let block = match &m.block {
        Some(b) => dims("block", b)?,
        None => {
            return Err(needs(
                "block",
                "threads per block, e.g. `block: [\"32 * WARPS\"]`",
            ))
        }
    };
    let Some(raw_args) = &m.args else {
        return Err(needs(
            "args",
            "the kernel's arguments in order: tensors by name, scalars as expressions, e.g. `args: [a, b, out, M, N, K]`",
        ));
    };
    let mut args = Vec::new();
    for node in raw_args.iter() {
        args.push(kernel_arg(node, known, env, device)?);
    }
    let shared_mem = match &m.shared_mem {
        Some(s) => {
            let e = Expr {
                source: s.value.clone(),
                span: s.span,
            };
            check_expr(&e, env, known, device)?;
            Some(e)
        }
        None => None,
    };
    let template = m
        .template
        .as_ref()
        .map(exprs)
        .transpose()?
        .unwrap_or_default();
    let mut defines = Vec::new();
    for (k, v) in &m.defines {
        if !ident(&k.value) || k.value.contains("::") {
            return Err(
                Diagnostic::at(k.span, format!("`{}` is not a macro name", k.value))
                    .help("defines are `NAME: expression`, passed as -DNAME=value"),
            );
        }
        let e = Expr {
            source: v.value.clone(),
            span: v.span,
        };
        check_expr(&e, env, known, device)?;
        defines.push((k.value.clone(), e));
    }
    let path = files.resolve(source, "source")?;
    let path = std::path::absolute(&path).unwrap_or(path);
    Ok((
        LaunchPath::Native,
        grid,
        Some(NativeSpec {
            source: path,
            source_span: source.span,
            template,
            defines,
            options: m.compile_options.iter().map(|o| o.value.clone()).collect(),
            block,
            shared_mem,
            args,
        }),
        Vec::new(),
    ))
}

/// One entry of `args:`: a bare name no config or shape field carries is a
/// tensor; anything else an expression, typed by a one-key mapping.
fn kernel_arg(
    node: &Node,
    known: &[String],
    env: &minijinja::Environment<'static>,
    device: &DeviceInfo,
) -> Result<KernelArg, Diagnostic> {
    let (ty, text, span) = match &node.value {
        Value::Str(s) => (None, s.clone(), node.span),
        Value::Int(i) => (None, i.to_string(), node.span),
        Value::Float(f) => (Some(ScalarType::F32), f.to_string(), node.span),
        Value::Map(entries) if entries.len() == 1 => {
            let (key, value) = &entries[0];
            let Some(ty) = ScalarType::parse(&key.name) else {
                let names: Vec<&str> = ScalarType::ALL.iter().map(|t| t.as_str()).collect();
                return Err(unknown(key.span, "argument type", &key.name, &names));
            };
            let text = match &value.value {
                Value::Str(s) => s.clone(),
                Value::Int(i) => i.to_string(),
                Value::Float(f) => f.to_string(),
                _ => {
                    return Err(Diagnostic::at(
                        value.span,
                        format!("`{}:` takes an expression, found {}", key.name, value.kind()),
                    ))
                }
            };
            (Some(ty), text, value.span)
        }
        _ => {
            return Err(Diagnostic::at(
                node.span,
                format!("a kernel argument is a name or an expression, found {}", node.kind()),
            )
            .help("write a tensor's name (`a`, `out`), an expression (`M`, `K * 2`), or `{i64: expression}`"))
        }
    };
    let bare = !text.is_empty()
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !text.starts_with(|c: char| c.is_ascii_digit());
    if ty.is_none() && bare && !known.contains(&text) {
        return Ok(KernelArg::Tensor { name: text, span });
    }
    let e = Expr { source: text, span };
    check_expr(&e, env, known, device)?;
    Ok(KernelArg::Scalar {
        ty: ty.unwrap_or(ScalarType::I32),
        expr: e,
    })
}

/// An `ir:` file: a Triton method's, of a stage Triton compiles from, readable.
/// Returns its absolute path and contents (hashed into the method's identity).
fn ir_file(
    file: &Spanned<String>,
    kind: MethodKind,
    files: &Files<'_>,
) -> Result<(std::path::PathBuf, Vec<u8>), Diagnostic> {
    if kind != MethodKind::Triton {
        return Err(Diagnostic::at(
            file.span,
            format!("`ir:` is for Triton methods; this one is {}", kind.as_str()),
        )
        .help("an IR file stands in for a Triton kernel's compiled stages: set `kind: triton`"));
    }
    let path = files.base_dir.join(file.as_str());
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if !IR_EXTENSIONS.contains(&ext) {
        return Err(Diagnostic::at(
            file.span,
            format!(
                "IR file `{}` is not of a stage Triton compiles from",
                file.value
            ),
        )
        .help(format!(
            "name a .{} file (the extension names the stage)",
            IR_EXTENSIONS.join(", .")
        )));
    }
    let (path, bytes) = files
        .read(file, "ir", "IR file", limits::MAX_METHOD_FILE_BYTES)
        .map_err(|d| {
            d.help("paths are relative to the manifest; `tunelab run --keep-ir` writes IR files")
        })?;
    let path = path.canonicalize().unwrap_or(path);
    Ok((path, bytes))
}

fn baseline(
    node: &Node,
    known: &[String],
    env: &minijinja::Environment<'static>,
    device: &DeviceInfo,
) -> Result<Baseline, Diagnostic> {
    match &node.value {
        Value::Str(rule) => {
            let Some(rule_exprs) = builtin_baseline(rule) else {
                return Err(unknown(node.span, "baseline rule", rule, BUILTIN_BASELINES));
            };
            let values = rule_exprs
                .into_iter()
                .map(|(k, src)| {
                    let e = Expr {
                        source: src.to_string(),
                        span: node.span,
                    };
                    (k.to_string(), BaselineValue::Expr(e))
                })
                .collect();
            Ok(Baseline {
                name: rule.clone(),
                values,
            })
        }
        Value::Map(entries) => {
            let mut values = Vec::new();
            for (k, v) in entries {
                let value = match &v.value {
                    Value::Str(src) => {
                        let e = Expr {
                            source: src.clone(),
                            span: v.span,
                        };
                        check_expr(&e, env, known, device)?;
                        BaselineValue::Expr(e)
                    }
                    _ if v.is_scalar() => BaselineValue::Literal(v.to_json()),
                    _ => {
                        return Err(Diagnostic::at(
                            v.span,
                            format!(
                            "baseline value for `{}` must be a value or an expression, found {}",
                            k.name,
                            v.kind()
                        ),
                        ))
                    }
                };
                values.push((k.name.clone(), value));
            }
            Ok(Baseline {
                name: "baseline".into(),
                values,
            })
        }
        _ => Err(Diagnostic::at(
            node.span,
            format!(
                "`baseline` must be a rule name or a mapping, found {}",
                node.kind()
            ),
        )
        .help(format!("builtin rules: {}", BUILTIN_BASELINES.join(", ")))),
    }
}

/// Records a config name, refusing one that is already a shape field, parameter or derived value.
fn declare(
    declared: &mut IndexMap<String, (Span, &'static str)>,
    name: &Spanned<String>,
    what: &'static str,
) -> Result<(), Diagnostic> {
    if name.as_str() == "device" {
        return Err(
            Diagnostic::at(name.span, "`device` is reserved for device properties")
                .help("rename the parameter"),
        );
    }
    if let Some((_, other)) = declared.get(name.as_str()) {
        return Err(
            Diagnostic::at(name.span, format!("`{}` is already a {other}", name.value)).help(
                "each name may be a shape field, a parameter or a derived value, not two of them",
            ),
        );
    }
    declared.insert(name.value.clone(), (name.span, what));
    Ok(())
}

/// Compiles an expression with minijinja and checks every name it reads.
fn check_expr(
    e: &Expr,
    env: &minijinja::Environment<'static>,
    known: &[String],
    device: &DeviceInfo,
) -> Result<(), Diagnostic> {
    // Before any parser: and not quoted, being long.
    expr::check_length(&e.source, "an expression").map_err(|why| {
        Diagnostic::at(e.span, format!("invalid expression: {why}"))
            .help("write a shorter expression: a derived value can hold a part of it")
    })?;
    let vars = expr::variables(env, &e.source).map_err(|err| {
        let detail = err.detail().map(str::to_string).unwrap_or_else(|| err.to_string());
        Diagnostic::at(e.span, format!("invalid expression `{}`: {detail}", e.source)).help("expressions use Jinja syntax: `BLOCK_SIZE_M * 2 <= device.smem_bytes`, `a if cond else b`")
    })?;
    let device_fields = device_fields(device);
    let functions = [
        "min",
        "max",
        "abs",
        "ceil_div",
        "log2",
        "is_pow2",
        "range",
        "dict",
        "namespace",
    ];
    let mut names: Vec<&String> = vars.iter().collect();
    names.sort();
    for var in names {
        if let Some(field) = var.strip_prefix("device.") {
            if !device_fields.contains_key(field) {
                let fields: Vec<&str> = device_fields.keys().map(String::as_str).collect();
                return Err(unknown(e.span, "device property", field, &fields));
            }
        } else if var != "device" && !known.contains(var) && !functions.contains(&var.as_str()) {
            let candidates: Vec<&str> = known.iter().map(String::as_str).collect();
            let help = match did_you_mean(var, candidates.iter().copied()) {
                Some(s) => format!("did you mean `{s}`?"),
                None => format!("names available here: {}, device.*", candidates.join(", ")),
            };
            return Err(Diagnostic::at(
                e.span,
                format!(
                    "expression `{}` reads `{var}`, which is not defined",
                    e.source
                ),
            )
            .help(help));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Tolerance, protocol, search, outputs

fn tolerance(t: &Spanned<RawTolerance>, root: Span) -> Result<Tolerance, Diagnostic> {
    let section = place(t.span, root);
    let check = |v: &Spanned<f64>, name: &str, max: Option<f64>| -> Result<f64, Diagnostic> {
        if v.is_nan() || v.value < 0.0 || max.is_some_and(|m| v.value > m) {
            let range = if max.is_some() {
                "between 0 and 1"
            } else {
                "zero or positive"
            };
            return Err(Diagnostic::at(
                place(v.span, section),
                format!("`{name}` must be {range}, found {}", v.value),
            ));
        }
        Ok(v.value)
    };
    let atol = check(&t.atol, "atol", None)?;
    let rtol = check(&t.rtol, "rtol", None)?;
    let max_mismatch = check(&t.max_mismatch, "max_mismatch", Some(1.0))?;
    let mut per_dtype = IndexMap::new();
    for (dtype, o) in &t.per_dtype {
        if !DTYPES.contains(&dtype.as_str()) {
            return Err(unknown(dtype.span, "dtype", dtype, DTYPES));
        }
        let field = |v: &Option<Spanned<f64>>, name: &str, max| {
            v.as_ref().map(|v| check(v, name, max)).transpose()
        };
        per_dtype.insert(
            dtype.value.clone(),
            DtypeOverride {
                atol: field(&o.atol, "atol", None)?,
                rtol: field(&o.rtol, "rtol", None)?,
                max_mismatch: field(&o.max_mismatch, "max_mismatch", Some(1.0))?,
            },
        );
    }
    Ok(Tolerance {
        atol,
        rtol,
        max_mismatch,
        per_dtype,
    })
}

/// The longest a timeout or a time cap may be: a run waits this long at
/// most, and every such time becomes a `Duration` added to an `Instant`.
const MAX_SECONDS: f64 = 1e6;

fn protocol(p: &Spanned<RawProtocol>, root: Span) -> Result<Protocol, Diagnostic> {
    let section = place(p.span, root);
    let at = |s: Span| place(s, section);
    if p.graph_calls.value == 0 || p.graph_calls.value > 10_000 {
        return Err(Diagnostic::at(
            at(p.graph_calls.span),
            format!(
                "`graph_calls` must be between 1 and 10000, found {}",
                p.graph_calls.value
            ),
        ));
    }
    let mut retime_with: Vec<Timing> = Vec::new();
    for t in &p.retime_with {
        if t.value == p.timing || retime_with.contains(&t.value) {
            return Err(Diagnostic::at(
                at(t.span),
                format!(
                    "`retime_with` names `{}` twice, or the run's own `timing`",
                    t.value.as_str()
                ),
            )
            .help("list other timings only: the finalists are timed the run's way already"));
        }
        retime_with.push(t.value);
    }
    if p.batch.value == 0 {
        return Err(Diagnostic::at(
            at(p.batch.span),
            "`batch` must be at least 1",
        ));
    }
    if p.min_samples.value == 0 || p.min_samples.value > p.max_samples {
        return Err(Diagnostic::at(
            at(p.min_samples.span),
            format!(
                "`min_samples` ({}) must be between 1 and `max_samples` ({})",
                p.min_samples.value, p.max_samples
            ),
        ));
    }
    if !(p.target_ci.value > 0.0 && p.target_ci.value < 1.0) {
        return Err(Diagnostic::at(
            at(p.target_ci.span),
            format!(
                "`target_ci` is a fraction of the median, between 0 and 1; found {}",
                p.target_ci.value
            ),
        )
        .help("0.005 means within 0.5 %"));
    }
    for (cap, name) in [
        (&p.max_gpu_ms, "max_gpu_ms"),
        (&p.max_wall_ms, "max_wall_ms"),
    ] {
        if cap.is_nan() || cap.value <= 0.0 {
            return Err(Diagnostic::at(
                at(cap.span),
                format!("`{name}` must be positive; found {}", cap.value),
            )
            .help(".inf for no cap"));
        }
        // A finite cap becomes a `Duration`, which a number this large
        // cannot be (1e300 made the run panic).
        if cap.value.is_finite() && cap.value / 1e3 > MAX_SECONDS {
            return Err(Diagnostic::at(
                at(cap.span),
                format!(
                    "`{name}` must be at most {} (ms); found {:?}",
                    MAX_SECONDS * 1e3,
                    cap.value
                ),
            )
            .help(".inf for no cap"));
        }
    }
    if p.timeout_s.is_nan() || p.timeout_s.value <= 0.0 {
        return Err(Diagnostic::at(
            at(p.timeout_s.span),
            "`timeout_s` must be positive",
        ));
    }
    if p.timeout_s.value > MAX_SECONDS {
        return Err(Diagnostic::at(
            at(p.timeout_s.span),
            format!(
                "`timeout_s` must be at most {MAX_SECONDS} (about 11 days); found {:?}",
                p.timeout_s.value
            ),
        ));
    }
    if !(0.0..=100.0).contains(&p.retime_rest.value) {
        return Err(Diagnostic::at(
            at(p.retime_rest.span),
            format!(
                "`retime_rest` must be between 0 and 100, found {}",
                p.retime_rest.value
            ),
        )
        .help("1 rests as long as each batch ran; 0 re-times back to back"));
    }
    if !(0.0..=10.0).contains(&p.race.value) {
        return Err(Diagnostic::at(
            at(p.race.span),
            format!(
                "`race` is a fraction of the best median so far, between 0 and 10; found {}",
                p.race.value
            ),
        )
        .help("0.05 stops refining a config once it is clearly over 5 % slower than the best so far; 0 turns racing off"));
    }
    if p.warmup_ms.is_nan() || p.warmup_ms.value < 0.0 {
        return Err(Diagnostic::at(
            at(p.warmup_ms.span),
            "`warmup_ms` must be zero or positive",
        ));
    }
    let flush = match (p.flush_l2, p.flush_with.unwrap_or_default()) {
        (false, _) => L2Flush::Off,
        (true, FlushWith::Read) => L2Flush::Read,
        (true, FlushWith::Memset) => L2Flush::Memset,
    };
    Ok(Protocol {
        warmup_launches: p.warmup_launches,
        warmup_ms: p.warmup_ms.value,
        timing: p.timing,
        graph_calls: p.graph_calls.value,
        retime_with,
        flush,
        flush_bytes: p.flush_bytes,
        batch: p.batch.value,
        min_samples: p.min_samples.value,
        max_samples: p.max_samples,
        target_ci: p.target_ci.value,
        max_gpu_ms: p.max_gpu_ms.value,
        max_wall_ms: p.max_wall_ms.value,
        race: p.race.value,
        finalists: p.finalists,
        retime_rest: p.retime_rest.value,
        timeout_s: p.timeout_s.value,
        seed: p.seed,
    })
}

fn search(s: &Spanned<RawSearch>, root: Span) -> Result<Search, Diagnostic> {
    let section = place(s.span, root);
    let at = |sp: Span| place(sp, section);
    if s.eta.value < 2 {
        return Err(Diagnostic::at(
            at(s.eta.span),
            format!("`eta` must be at least 2, found {}", s.eta.value),
        ));
    }
    let kind = match s.strategy.value {
        RawStrategy::Grid => SearchKind::Grid,
        RawStrategy::Random => match s.budget.as_ref().map(|b| b.value) {
            Some(budget) if budget > 0 => SearchKind::Random { budget },
            _ => {
                return Err(
                    Diagnostic::at(at(s.strategy.span), "random search needs a budget")
                        .help("add `budget: 64` (configs per shape and method) under `search`"),
                )
            }
        },
        RawStrategy::Halving => SearchKind::Halving { eta: s.eta.value },
        RawStrategy::Surrogate => match &s.budget {
            Some(b) if b.value == 0 => return Err(Diagnostic::at(
                at(b.span),
                "a surrogate search needs a budget of at least 1",
            )
            .help(
                "give configs per shape and method, or leave `budget` out for 30 % of each group",
            )),
            budget => SearchKind::Surrogate {
                budget: budget.as_ref().map(|b| b.value),
            },
        },
    };
    Ok(Search { kind, seed: s.seed })
}

/// Every strategy walks a method's whole space at each shape (random and
/// the surrogate choose from what the walk finds), so its size is counted
/// from the axes before anything is walked.
fn check_space_size(name: &Spanned<String>, axes: &[Axis]) -> Result<(), Diagnostic> {
    let points = axes
        .iter()
        .try_fold(1u64, |n, a| n.checked_mul(a.values.len() as u64));
    match points {
        Some(points) if points <= limits::MAX_SPACE_POINTS => Ok(()),
        _ => {
            let sizes: Vec<String> = axes
                .iter()
                .map(|a| format!("{} {}", a.name, a.values.len()))
                .collect();
            Err(Diagnostic::at(
                name.span,
                format!(
                    "the space of method `{}` has {} points before constraints ({}), more than the {} tunelab walks at each shape",
                    name.value,
                    points.map_or_else(|| "over 2^64".to_string(), |p| p.to_string()),
                    sizes.join(" x "),
                    limits::MAX_SPACE_POINTS
                ),
            )
            .help("every strategy walks the space to find the configs the constraints allow: give the parameters fewer values, or split the method in two"))
        }
    }
}

/// The paths outputs render to, by which output (its path's place): two
/// outputs may not write one file, nor one write inside the other's file.
#[derive(Default)]
struct ClaimedPaths {
    /// Each rendered path (components joined by `/`) and its output's span.
    files: std::collections::HashMap<String, Span>,
    /// Every folder above a rendered path, and the output that needs it.
    folders: std::collections::HashMap<String, Span>,
}

impl ClaimedPaths {
    fn claim(&mut self, parts: Vec<String>, output: &Spanned<String>) -> Result<(), Diagnostic> {
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
/// `fuel_left`: what the renders of the manifest's output paths may still
/// run, all shapes and outputs together ([`expr::TOTAL_FUEL`]).
fn check_output_path(
    template: &Spanned<String>,
    env: &minijinja::Environment<'static>,
    shapes: &[Shape],
    device: &DeviceInfo,
    fuel_left: &mut u64,
) -> Result<Vec<Vec<String>>, Diagnostic> {
    let span = template.span;
    expr::check_length(template, "a path template").map_err(|why| {
        Diagnostic::at(span, format!("invalid path template: {why}"))
            .help("path templates name a file: `vllm/E={{E}},N={{N}}.json`")
    })?;
    let tmpl = env.template_from_str(template).map_err(|e| {
        Diagnostic::at(
            span,
            format!(
                "invalid path template `{}`: {}",
                template.value,
                e.detail().unwrap_or("syntax error")
            ),
        )
        .help("path templates use Jinja syntax: `vllm/E={{E}},N={{N}}.json`")
    })?;
    let mut rendered_paths = HashSet::new();
    for shape in shapes {
        let mut ctx: serde_json::Map<String, Json> =
            shape.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        ctx.insert("device".into(), Json::Object(device_fields(device)));
        let (rendered, ran) = expr::render_bounded(&tmpl, &ctx).map_err(|why| {
            Diagnostic::at(
                span,
                format!(
                    "path template `{}` cannot be rendered: {why}",
                    template.value,
                ),
            )
            .help(format!(
                "templates may use shape fields ({}) and device.*",
                shape.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        *fuel_left = fuel_left.checked_sub(ran).ok_or_else(|| {
            Diagnostic::at(
                span,
                format!(
                    "the output paths run more than {} template instructions over all shapes: this one runs {ran} at each",
                    expr::TOTAL_FUEL
                ),
            )
            .help(format!(
                "a path template names a file: write it with shape fields and device.* (`vllm/E={{{{E}}}},N={{{{N}}}}.json`), without loops; there are {} shapes",
                shapes.len()
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
