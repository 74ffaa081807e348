//! A manifest's methods: their spaces (with the size limit), derived
//! values, constraints and baselines, the expressions in them, native and
//! AOT launch parts, `ir:` files. Called from `validate.rs`, one method at
//! a time.

use indexmap::IndexMap;

use super::de::{place, Spanned};
use super::files::Files;
use super::limits;
use super::measurement::search;
use super::model::{
    builtin_baseline, device_fields, Axis, Baseline, BaselineValue, Expr, KernelArg, LaunchPath,
    Method, MethodKind, NativeSpec, ScalarType, BUILTIN_BASELINES, IR_EXTENSIONS,
};
use super::raw::RawMethod;
use super::shapes;
use super::values::{axis_value_spans, axis_values, check_one_type, unknown};
use super::yaml::{Node, Value};
use crate::device::DeviceInfo;
use crate::diag::{did_you_mean, Diagnostic, Span};
use crate::expr;

pub(super) fn method(
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

/// The text of a native method's compile and launch fields, for its identity.
pub(super) fn native_identity(m: &RawMethod) -> String {
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
pub(super) fn native_parts(
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
pub(super) fn kernel_arg(
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
pub(super) fn ir_file(
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

pub(super) fn baseline(
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
pub(super) fn declare(
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

/// Checks an expression: its length, that it is in tunelab's language, and
/// every name it reads (as minijinja parses it).
pub(super) fn check_expr(
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
    // Jinja's syntax, tunelab's language: what tunelab does not evaluate
    // (filters, `range`, string repetition and concatenation, chained
    // comparisons) is refused first, before minijinja parses it (minijinja
    // folds constants as it parses: `'x' * 99999999` is 100 MB).
    let slots: std::collections::HashMap<String, usize> = known
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i))
        .collect();
    let constants: std::collections::HashMap<String, expr::Val> = device_fields(device)
        .iter()
        .map(|(k, v)| (format!("device.{k}"), expr::Val::from_json(v)))
        .collect();
    let scope = expr::Scope {
        slots: &slots,
        constants: &constants,
    };
    if expr::compile_fast(&e.source, &scope).is_none() {
        return Err(Diagnostic::at(e.span, expr::explain_refusal(&e.source, &scope)).help(
            "write it with those: `BLOCK_SIZE_M * 2 <= device.smem_bytes`, `dtype in ['bf16', 'fp16']`, `a if cond else b`",
        ));
    }
    let vars = expr::variables(env, &e.source).map_err(|err| {
        let detail = err.detail().map(str::to_string).unwrap_or_else(|| err.to_string());
        Diagnostic::at(e.span, format!("invalid expression `{}`: {detail}", e.source)).help("expressions use Jinja syntax: `BLOCK_SIZE_M * 2 <= device.smem_bytes`, `a if cond else b`")
    })?;
    let device_fields = device_fields(device);
    let functions = ["min", "max", "abs", "ceil_div", "log2", "is_pow2"];
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

/// Every strategy walks a method's whole space at each shape (random and
/// the surrogate choose from what the walk finds), so its size is counted
/// from the axes before anything is walked.
pub(super) fn check_space_size(name: &Spanned<String>, axes: &[Axis]) -> Result<(), Diagnostic> {
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
