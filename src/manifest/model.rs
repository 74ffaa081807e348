//! The validated model of an experiment: every cross-field rule is checked
//! here, with errors pointing at the manifest line that needs changing.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value as Json;

use super::raw::{
    MethodKind, OutputFormat, RawManifest, RawProtocol, RawSearch, RawShapes, RawTolerance,
    Strategy,
};
use super::yaml::Node;
use crate::device::DeviceInfo;
use crate::diag::{did_you_mean, Diagnostic, Span};
use crate::expr;

pub const BUILTIN_PROBLEMS: &[&str] = &["gemm", "moe"];
pub const DTYPES: &[&str] = &["fp16", "bf16", "fp32", "fp8"];

/// One point of the problem's parameters, fields in a stable order.
pub type Shape = IndexMap<String, Json>;

#[derive(Debug, Clone)]
pub struct Experiment {
    pub name: String,
    pub description: Option<String>,
    pub problem: String,
    pub manifest_path: PathBuf,
    /// Hash of the merged manifest (includes and overrides applied).
    pub manifest_hash: String,
    pub shapes: Vec<Shape>,
    pub shapes_span: Span,
    pub methods: Vec<Method>,
    pub tolerance: Tolerance,
    pub protocol: RawProtocol,
    pub search: RawSearch,
    pub outputs: Vec<Output>,
    pub interpreter: Option<InterpreterPlan>,
    /// Manifests run after this one (`companions:`), resolved and checked to exist.
    pub companions: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct InterpreterPlan {
    pub shapes: Vec<Shape>,
    pub max_configs: u64,
    pub tolerance: Option<Tolerance>,
}

/// An expression and where it was written.
#[derive(Debug, Clone, Serialize)]
pub struct Expr {
    pub source: String,
    #[serde(skip)]
    pub span: Span,
}

#[derive(Debug, Clone)]
pub struct Axis {
    pub name: String,
    pub values: Vec<Json>,
}

#[derive(Debug, Clone)]
pub enum BaselineValue {
    Literal(Json),
    Expr(Expr),
}

#[derive(Debug, Clone)]
pub struct Baseline {
    /// "vllm_moe_default" for a builtin rule, "baseline" for one written out.
    pub name: String,
    pub values: Vec<(String, BaselineValue)>,
}

#[derive(Debug, Clone)]
pub struct Method {
    pub name: String,
    pub kind: MethodKind,
    pub kernel: String,
    /// Hash of what defines the method's code: kind, kernel, source file contents, version.
    pub identity: String,
    pub params: IndexMap<String, Json>,
    pub axes: Vec<Axis>,
    pub constraints: Vec<Expr>,
    pub derived: Vec<(String, Expr)>,
    pub baseline: Option<Baseline>,
    pub span: Span,
    pub constraints_span: Span,
}

#[derive(Debug, Clone, Serialize)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
    pub max_mismatch: f64,
    pub per_dtype: IndexMap<String, DtypeOverride>,
}

/// Overrides of (atol, rtol, max_mismatch) for one dtype.
pub type DtypeOverride = (Option<f64>, Option<f64>, Option<f64>);

/// The tolerance that applies to one dtype.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ToleranceFor {
    pub atol: f64,
    pub rtol: f64,
    pub max_mismatch: f64,
}

impl Tolerance {
    pub fn for_dtype(&self, dtype: Option<&str>) -> ToleranceFor {
        let mut t = ToleranceFor {
            atol: self.atol,
            rtol: self.rtol,
            max_mismatch: self.max_mismatch,
        };
        if let Some((a, r, m)) = dtype.and_then(|d| self.per_dtype.get(d)) {
            t.atol = a.unwrap_or(t.atol);
            t.rtol = r.unwrap_or(t.rtol);
            t.max_mismatch = m.unwrap_or(t.max_mismatch);
        }
        t
    }
}

#[derive(Debug, Clone)]
pub struct Output {
    pub format: OutputFormat,
    pub path: String,
    pub method: Option<String>,
    pub legacy_keys: bool,
    pub span: Span,
}

/// Builtin baseline rules, written as expressions so they are shown and
/// evaluated like any other. vLLM's default fused-MoE config for bf16/fp16.
pub fn builtin_baseline(name: &str) -> Option<Vec<(&'static str, &'static str)>> {
    match name {
        "vllm_moe_default" => Some(vec![
            (
                "BLOCK_SIZE_M",
                "16 if M <= 32 else (32 if M <= 96 else (64 if M <= 512 else 128))",
            ),
            ("BLOCK_SIZE_N", "64 if M <= 64 else 128"),
            ("BLOCK_SIZE_K", "128 if M <= 64 else 64"),
            ("GROUP_SIZE_M", "16 if M // E > 128 else 1"),
            ("num_warps", "4 if M <= 128 else 8"),
            ("num_stages", "4 if M <= 32 else 3"),
        ]),
        _ => None,
    }
}

const BUILTIN_BASELINES: &[&str] = &["vllm_moe_default"];

/// Checks a raw manifest against its own tree (for spans) and the device facts.
pub fn validate(
    raw: RawManifest,
    tree: &Node,
    manifest_path: &Path,
    device: &DeviceInfo,
) -> Result<Experiment, Diagnostic> {
    let span = |path: &str| tree.at_path(path).map(|n| n.span).unwrap_or(tree.span);

    if raw.experiment.is_empty()
        || !raw
            .experiment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(Diagnostic::at(
            span("experiment"),
            format!("experiment name `{}` is not a plain name", raw.experiment),
        )
        .help("use letters, digits, `-` and `_` only; it names the results directory"));
    }
    check_problem(&raw.problem, span("problem"))?;

    let base_dir = manifest_path.parent().unwrap_or(Path::new("."));
    let shapes_node = tree.get("shapes").unwrap_or(tree);
    let shapes = expand_shapes(&raw.shapes, shapes_node, base_dir)?;
    let interpreter = match &raw.interpreter {
        None => None,
        Some(i) => {
            let node = tree.at_path("interpreter.shapes").unwrap_or(tree);
            let shapes = expand_shapes(&i.shapes, node, base_dir)?;
            let tolerance = match &i.tolerance {
                Some(t) => Some(tolerance(
                    t,
                    tree.at_path("interpreter.tolerance").unwrap_or(tree),
                )?),
                None => None,
            };
            Some(InterpreterPlan {
                shapes,
                max_configs: i.max_configs.max(1),
                tolerance,
            })
        }
    };
    let shape_fields: Vec<String> = shapes[0].keys().cloned().collect();

    if raw.methods.is_empty() {
        return Err(Diagnostic::at(span("methods"), "`methods` is empty")
            .help("declare at least one method, e.g. `triton: {kind: triton, kernel: matmul}`"));
    }
    let env = expr::environment();
    let mut methods = Vec::new();
    for (name, m) in &raw.methods {
        let node = tree.at_path(&format!("methods.{name}")).unwrap_or(tree);
        methods.push(method(
            name,
            m,
            node,
            &shape_fields,
            &env,
            device,
            base_dir,
        )?);
    }

    let tolerance = tolerance(&raw.tolerance, tree.get("tolerance").unwrap_or(tree))?;
    check_protocol(&raw.protocol, tree)?;
    check_search(&raw.search, tree)?;

    let mut outputs = Vec::new();
    for (i, o) in raw.outputs.iter().enumerate() {
        let out_span = span(&format!("outputs[{i}].path"));
        if let Some(m) = &o.method {
            if !raw.methods.contains_key(m) {
                let names: Vec<&str> = raw.methods.keys().map(String::as_str).collect();
                return Err(unknown(
                    span(&format!("outputs[{i}].method")),
                    "method",
                    m,
                    &names,
                ));
            }
        }
        let legacy_keys = match o.keys.as_deref() {
            None | Some("current") => false,
            Some("legacy") => true,
            Some(other) => {
                return Err(Diagnostic::at(
                    span(&format!("outputs[{i}].keys")),
                    format!("unknown key scheme `{other}`"),
                )
                .help("use `current` (M_LEQ_x) or `legacy` (small, medium_M32, ...)"))
            }
        };
        check_output_path(&o.path, out_span, &env, &shapes, device)?;
        outputs.push(Output {
            format: o.format,
            path: o.path.clone(),
            method: o.method.clone(),
            legacy_keys,
            span: out_span,
        });
    }

    let base = manifest_path.parent().unwrap_or(Path::new("."));
    let mut companions = Vec::new();
    for (i, c) in raw.companions.iter().enumerate() {
        let at = span(&format!("companions[{i}]"));
        let path = base.join(c);
        if !path.is_file() {
            return Err(
                Diagnostic::at(at, format!("companion manifest `{c}` not found")).help(format!(
                    "paths are relative to this manifest: looked for {}",
                    path.display()
                )),
            );
        }
        if path.canonicalize().ok() == manifest_path.canonicalize().ok() {
            return Err(Diagnostic::at(at, "a manifest cannot be its own companion"));
        }
        companions.push(path);
    }

    let canonical = serde_json::to_string(&raw).expect("manifest serialises");
    Ok(Experiment {
        name: raw.experiment.clone(),
        description: raw.description.clone(),
        problem: raw.problem.clone(),
        manifest_path: manifest_path.to_path_buf(),
        manifest_hash: blake3::hash(canonical.as_bytes()).to_hex()[..16].to_string(),
        shapes,
        shapes_span: span("shapes"),
        methods,
        tolerance,
        protocol: raw.protocol,
        search: raw.search,
        outputs,
        interpreter,
        companions,
    })
}

fn unknown(span: Span, what: &str, name: &str, known: &[&str]) -> Diagnostic {
    let help = match did_you_mean(name, known.iter().copied()) {
        Some(s) => format!("did you mean `{s}`?"),
        None => format!("known {what}s: {}", known.join(", ")),
    };
    Diagnostic::at(span, format!("unknown {what} `{name}`")).help(help)
}

fn check_problem(problem: &str, span: Span) -> Result<(), Diagnostic> {
    if BUILTIN_PROBLEMS.contains(&problem) {
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
        unknown(span, "problem", problem, BUILTIN_PROBLEMS).help(format!(
            "use a builtin ({}) or a Python class as \"module.path:ClassName\"",
            BUILTIN_PROBLEMS.join(", ")
        )),
    )
}

// ---------------------------------------------------------------------------
// Shapes

fn scalar_ok(v: &Json) -> bool {
    matches!(v, Json::Number(_) | Json::String(_) | Json::Bool(_))
}

/// Values of one axis or space parameter: a list, `{range: [a, b, step]}` or `{pow2: [lo, hi]}`.
pub fn axis_values(
    value: &Json,
    span: Span,
    name: &str,
    allow_records: bool,
) -> Result<Vec<Json>, Diagnostic> {
    let values = match value {
        Json::Array(items) => items.clone(),
        Json::Object(map) if map.len() == 1 && map.contains_key("range") => {
            let r = int_list(&map["range"], span, name, "range", 3)?;
            let (start, end, step) = (r[0], r[1], r[2]);
            if step <= 0 {
                return Err(Diagnostic::at(span, format!("`{name}`: range step must be positive, found {step}")).help("write {range: [start, end, step]} with step > 0"));
            }
            (0..).map(|i| start + i * step).take_while(|v| *v <= end).map(Json::from).collect()
        }
        Json::Object(map) if map.len() == 1 && map.contains_key("pow2") => {
            let r = int_list(&map["pow2"], span, name, "pow2", 2)?;
            let (lo, hi) = (r[0], r[1]);
            let pow2 = |x: i64| x > 0 && x & (x - 1) == 0;
            if !pow2(lo) || !pow2(hi) {
                return Err(Diagnostic::at(span, format!("`{name}`: pow2 bounds must be powers of two, found [{lo}, {hi}]")).help("write {pow2: [16, 256]}"));
            }
            std::iter::successors(Some(lo), |v| v.checked_mul(2)).take_while(|v| *v <= hi).map(Json::from).collect()
        }
        other => {
            return Err(Diagnostic::at(span, format!("`{name}` must be a list of values, {{range: [start, end, step]}} or {{pow2: [from, to]}}, found {}", json_kind(other)))
                .help(format!("for a single value write `{name}: [{other}]`")))
        }
    };
    if values.is_empty() {
        return Err(Diagnostic::at(span, format!("`{name}` has no values"))
            .help("give at least one value, or remove the axis"));
    }
    for v in &values {
        let ok = scalar_ok(v)
            || (allow_records
                && v.as_object()
                    .is_some_and(|m| !m.is_empty() && m.values().all(scalar_ok)));
        if !ok {
            let what = if allow_records {
                "numbers, strings, booleans or records of them"
            } else {
                "numbers, strings or booleans"
            };
            return Err(Diagnostic::at(
                span,
                format!("`{name}` holds {}, expected {what}", json_kind(v)),
            ));
        }
    }
    Ok(values)
}

fn int_list(
    v: &Json,
    span: Span,
    name: &str,
    form: &str,
    len: usize,
) -> Result<Vec<i64>, Diagnostic> {
    let items: Option<Vec<i64>> = v
        .as_array()
        .filter(|a| a.len() == len)
        .map(|a| a.iter().filter_map(Json::as_i64).collect());
    match items {
        Some(items) if items.len() == len => Ok(items),
        _ => Err(Diagnostic::at(
            span,
            format!("`{name}`: `{form}` takes {len} integers"),
        )),
    }
}

fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "a mapping",
    }
}

fn expand_shapes(raw: &RawShapes, node: &Node, base_dir: &Path) -> Result<Vec<Shape>, Diagnostic> {
    let span = |path: &str| node.at_path(path).map(|n| n.span).unwrap_or(node.span);
    let mut shapes: Vec<(Shape, Span)> = Vec::new();

    if let Some(list) = &raw.list {
        for (i, entry) in list.iter().enumerate() {
            let s = span(&format!("list[{i}]"));
            for (k, v) in entry {
                if !scalar_ok(v) {
                    return Err(Diagnostic::at(
                        span(&format!("list[{i}].{k}")),
                        format!(
                            "shape field `{k}` must be a number, string or boolean, found {}",
                            json_kind(v)
                        ),
                    ));
                }
            }
            shapes.push((entry.clone(), s));
        }
    }
    if let Some(product) = &raw.product {
        let mut axes = Vec::new();
        for (name, value) in product {
            axes.push((
                name.as_str(),
                axis_values(value, span(&format!("product.{name}")), name, true)?,
            ));
        }
        let mut partial: Vec<Shape> = vec![Shape::new()];
        for (name, values) in &axes {
            let mut next = Vec::with_capacity(partial.len() * values.len());
            for base in &partial {
                for v in values {
                    let mut s = base.clone();
                    match v {
                        Json::Object(record) => {
                            for (k, rv) in record {
                                s.insert(k.clone(), rv.clone());
                            }
                        }
                        other => {
                            s.insert(name.to_string(), other.clone());
                        }
                    }
                    next.push(s);
                }
            }
            partial = next;
        }
        let s = span("product");
        shapes.extend(partial.into_iter().map(|shape| (shape, s)));
    }
    if let Some(csv) = &raw.csv {
        shapes.extend(super::csv_shapes::read(
            csv,
            node.get("csv").unwrap_or(node),
            base_dir,
        )?);
    }
    if shapes.is_empty() {
        return Err(Diagnostic::at(node.span, "the shape set is empty")
            .help("add `list:`, `product:` or `csv:` under `shapes`"));
    }
    if let Some(fixed) = &raw.fixed {
        for (k, v) in fixed {
            if !scalar_ok(v) {
                return Err(Diagnostic::at(
                    span(&format!("fixed.{k}")),
                    format!("fixed field `{k}` must be a number, string or boolean"),
                ));
            }
        }
        for (shape, _) in &mut shapes {
            for (k, v) in fixed {
                shape.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    let (first, first_span) = &shapes[0];
    let first_keys: HashSet<&String> = first.keys().collect();
    for (shape, s) in &shapes[1..] {
        let keys: HashSet<&String> = shape.keys().collect();
        if keys != first_keys {
            let mut missing: Vec<&str> = first_keys
                .symmetric_difference(&keys)
                .map(|k| k.as_str())
                .collect();
            missing.sort();
            return Err(Diagnostic::at(
                *s,
                format!(
                    "this shape's fields differ from the first shape's (line {}): {}",
                    first_span.line,
                    missing.join(", ")
                ),
            )
            .help("every shape needs the same fields; put common ones under `fixed:`"));
        }
    }
    if let Some(dtype) = first.get("dtype") {
        let _ = dtype;
        for (shape, s) in &shapes {
            if let Some(d) = shape.get("dtype").and_then(Json::as_str) {
                if !DTYPES.contains(&d) {
                    return Err(unknown(*s, "dtype", d, DTYPES));
                }
            }
        }
    }
    let mut seen = HashSet::new();
    Ok(shapes
        .into_iter()
        .map(|(s, _)| s)
        .filter(|s| seen.insert(serde_json::to_string(s).expect("shape serialises")))
        .collect())
}

// ---------------------------------------------------------------------------
// Methods and expressions

fn method(
    name: &str,
    m: &super::raw::RawMethod,
    node: &Node,
    shape_fields: &[String],
    env: &minijinja::Environment<'static>,
    device: &DeviceInfo,
    base_dir: &Path,
) -> Result<Method, Diagnostic> {
    let span = |path: &str| node.at_path(path).map(|n| n.span).unwrap_or(node.span);
    let key_span = |section: &str, key: &str| {
        node.get(section)
            .and_then(|n| n.key_span(key))
            .unwrap_or(node.span)
    };

    // Every name a config can carry, with where it was declared, to catch clashes.
    let mut declared: IndexMap<String, (Span, &'static str)> = IndexMap::new();
    for f in shape_fields {
        declared.insert(f.clone(), (node.span, "shape field"));
    }
    let mut params = IndexMap::new();
    for (k, v) in &m.params {
        declare(&mut declared, k, key_span("params", k), "parameter")?;
        if !scalar_ok(v) {
            return Err(Diagnostic::at(
                span(&format!("params.{k}")),
                format!("parameter `{k}` must be a number, string or boolean"),
            ));
        }
        params.insert(k.clone(), v.clone());
    }
    let mut axes = Vec::new();
    for (k, v) in &m.space {
        declare(&mut declared, k, key_span("space", k), "space parameter")?;
        axes.push(Axis {
            name: k.clone(),
            values: axis_values(v, span(&format!("space.{k}")), k, false)?,
        });
    }

    let mut derived = Vec::new();
    for (k, source) in &m.derived {
        let e = Expr {
            source: source.clone(),
            span: span(&format!("derived.{k}")),
        };
        derived.push((k.clone(), e));
    }
    let mut known: Vec<String> = declared.keys().cloned().collect();
    for (k, e) in &derived {
        check_expr(e, env, &known, device)?;
        declare(&mut declared, k, key_span("derived", k), "derived value")?;
        known.push(k.clone());
    }
    let mut constraints = Vec::new();
    for (i, source) in m.constraints.iter().enumerate() {
        let e = Expr {
            source: source.clone(),
            span: span(&format!("constraints[{i}]")),
        };
        check_expr(&e, env, &known, device)?;
        constraints.push(e);
    }

    let baseline = match &m.baseline {
        None => None,
        Some(Json::String(rule)) => {
            let Some(rule_exprs) = builtin_baseline(rule) else {
                return Err(unknown(
                    span("baseline"),
                    "baseline rule",
                    rule,
                    BUILTIN_BASELINES,
                ));
            };
            let values = rule_exprs
                .into_iter()
                .map(|(k, src)| {
                    (
                        k.to_string(),
                        BaselineValue::Expr(Expr {
                            source: src.to_string(),
                            span: span("baseline"),
                        }),
                    )
                })
                .collect();
            Some(Baseline {
                name: rule.clone(),
                values,
            })
        }
        Some(Json::Object(map)) => {
            let mut values = Vec::new();
            for (k, v) in map {
                let s = span(&format!("baseline.{k}"));
                let value = match v {
                    Json::String(src) => {
                        let e = Expr {
                            source: src.clone(),
                            span: s,
                        };
                        check_expr(&e, env, &known, device)?;
                        BaselineValue::Expr(e)
                    }
                    v if scalar_ok(v) => BaselineValue::Literal(v.clone()),
                    other => {
                        return Err(Diagnostic::at(
                            s,
                            format!(
                            "baseline value for `{k}` must be a value or an expression, found {}",
                            json_kind(other)
                        ),
                        ))
                    }
                };
                values.push((k.clone(), value));
            }
            Some(Baseline {
                name: "baseline".into(),
                values,
            })
        }
        Some(other) => {
            return Err(Diagnostic::at(
                span("baseline"),
                format!(
                    "`baseline` must be a rule name or a mapping, found {}",
                    json_kind(other)
                ),
            )
            .help(format!("builtin rules: {}", BUILTIN_BASELINES.join(", "))))
        }
    };
    if let Some(b) = &baseline {
        let tunable: HashSet<&str> = m.space.keys().map(String::as_str).collect();
        for (k, _) in &b.values {
            if !tunable.contains(k.as_str()) && !m.params.contains_key(k) {
                return Err(Diagnostic::at(
                    span("baseline"),
                    format!("baseline sets `{k}`, which is not a parameter of method `{name}`"),
                )
                .help("a baseline gives values for the method's space parameters"));
            }
        }
    }

    let mut identity = blake3::Hasher::new();
    identity.update(
        format!(
            "{:?}\0{}\0{}\0",
            m.kind,
            m.kernel,
            m.version.as_deref().unwrap_or("")
        )
        .as_bytes(),
    );
    if let Some(source) = &m.source {
        let path = base_dir.join(source);
        let bytes = std::fs::read(&path).map_err(|e| {
            Diagnostic::at(
                span("source"),
                format!("cannot read method source {}: {e}", path.display()),
            )
            .help("paths are relative to the manifest")
        })?;
        identity.update(&bytes);
    }
    Ok(Method {
        name: name.to_string(),
        kind: m.kind,
        kernel: m.kernel.clone(),
        identity: identity.finalize().to_hex()[..16].to_string(),
        params,
        axes,
        constraints,
        derived,
        baseline,
        span: node.span,
        constraints_span: span("constraints"),
    })
}

/// Records a config name, refusing one that is already a shape field, parameter or derived value.
fn declare(
    declared: &mut IndexMap<String, (Span, &'static str)>,
    n: &str,
    s: Span,
    what: &'static str,
) -> Result<(), Diagnostic> {
    if n == "device" {
        return Err(
            Diagnostic::at(s, "`device` is reserved for device properties")
                .help("rename the parameter"),
        );
    }
    if let Some((_, other)) = declared.get(n) {
        return Err(
            Diagnostic::at(s, format!("`{n}` is already a {other}")).help(
                "each name may be a shape field, a parameter or a derived value, not two of them",
            ),
        );
    }
    declared.insert(n.to_string(), (s, what));
    Ok(())
}

/// Compiles an expression with minijinja and checks every name it reads.
fn check_expr(
    e: &Expr,
    env: &minijinja::Environment<'static>,
    known: &[String],
    device: &DeviceInfo,
) -> Result<(), Diagnostic> {
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

/// `device.*` as expression constants.
pub fn device_fields(device: &DeviceInfo) -> serde_json::Map<String, Json> {
    match serde_json::to_value(device).expect("device serialises") {
        Json::Object(map) => map,
        _ => unreachable!("DeviceInfo is a struct"),
    }
}

fn tolerance(t: &RawTolerance, node: &Node) -> Result<Tolerance, Diagnostic> {
    let span = |p: &str| node.at_path(p).map(|n| n.span).unwrap_or(node.span);
    let check = |v: f64, p: &str, max: Option<f64>| -> Result<(), Diagnostic> {
        if v.is_nan() || v < 0.0 || max.is_some_and(|m| v > m) {
            let range = if max.is_some() {
                "between 0 and 1"
            } else {
                "zero or positive"
            };
            return Err(Diagnostic::at(
                span(p),
                format!("`{p}` must be {range}, found {v}"),
            ));
        }
        Ok(())
    };
    check(t.atol, "atol", None)?;
    check(t.rtol, "rtol", None)?;
    check(t.max_mismatch, "max_mismatch", Some(1.0))?;
    let mut per_dtype = IndexMap::new();
    for (dtype, o) in &t.per_dtype {
        if !DTYPES.contains(&dtype.as_str()) {
            let s = node
                .get("per_dtype")
                .and_then(|n| n.key_span(dtype))
                .unwrap_or(node.span);
            return Err(unknown(s, "dtype", dtype, DTYPES));
        }
        per_dtype.insert(dtype.clone(), (o.atol, o.rtol, o.max_mismatch));
    }
    Ok(Tolerance {
        atol: t.atol,
        rtol: t.rtol,
        max_mismatch: t.max_mismatch,
        per_dtype,
    })
}

fn check_protocol(p: &RawProtocol, tree: &Node) -> Result<(), Diagnostic> {
    let span = |k: &str| {
        tree.at_path(&format!("protocol.{k}"))
            .map(|n| n.span)
            .unwrap_or(tree.span)
    };
    if p.hot {
        return Err(Diagnostic::at(span("hot"), "`hot: true` (CUDA-graph timing) is not implemented yet")
            .help("remove `hot` or set it to false; cold, L2-flushed samples are what tunelab measures today"));
    }
    if p.batch == 0 {
        return Err(Diagnostic::at(span("batch"), "`batch` must be at least 1"));
    }
    if p.min_samples == 0 || p.min_samples > p.max_samples {
        return Err(Diagnostic::at(
            span("min_samples"),
            format!(
                "`min_samples` ({}) must be between 1 and `max_samples` ({})",
                p.min_samples, p.max_samples
            ),
        ));
    }
    if !(p.target_ci > 0.0 && p.target_ci < 1.0) {
        return Err(Diagnostic::at(
            span("target_ci"),
            format!(
                "`target_ci` is a fraction of the median, between 0 and 1; found {}",
                p.target_ci
            ),
        )
        .help("0.005 means within 0.5 %"));
    }
    if p.timeout_s.is_nan() || p.timeout_s <= 0.0 {
        return Err(Diagnostic::at(
            span("timeout_s"),
            "`timeout_s` must be positive",
        ));
    }
    Ok(())
}

fn check_search(s: &RawSearch, tree: &Node) -> Result<(), Diagnostic> {
    let span = |k: &str| {
        tree.at_path(&format!("search.{k}"))
            .map(|n| n.span)
            .unwrap_or(tree.span)
    };
    if s.strategy == Strategy::Random && s.budget.unwrap_or(0) == 0 {
        return Err(
            Diagnostic::at(span("strategy"), "random search needs a budget")
                .help("add `budget: 64` (configs per shape and method) under `search`"),
        );
    }
    if s.strategy == Strategy::Surrogate && s.budget == Some(0) {
        return Err(Diagnostic::at(
            span("budget"),
            "a surrogate search needs a budget of at least 1",
        )
        .help("give configs per shape and method, or leave `budget` out for 30 % of each group"));
    }
    if s.eta < 2 {
        return Err(Diagnostic::at(
            span("eta"),
            format!("`eta` must be at least 2, found {}", s.eta),
        ));
    }
    Ok(())
}

/// Output paths are templates; a rendered path must stay inside the results directory.
fn check_output_path(
    template: &str,
    span: Span,
    env: &minijinja::Environment<'static>,
    shapes: &[Shape],
    device: &DeviceInfo,
) -> Result<(), Diagnostic> {
    let tmpl = env.template_from_str(template).map_err(|e| {
        Diagnostic::at(
            span,
            format!(
                "invalid path template `{template}`: {}",
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
        let rendered = tmpl.render(&ctx).map_err(|e| {
            Diagnostic::at(
                span,
                format!(
                    "path template `{template}` cannot be rendered: {}",
                    e.detail().unwrap_or("unknown error")
                ),
            )
            .help(format!(
                "templates may use shape fields ({}) and device.*",
                shape.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        if !rendered_paths.insert(rendered.clone()) {
            continue;
        }
        if escapes(Path::new(&rendered)) {
            return Err(Diagnostic::at(
                span,
                format!("output path `{rendered}` leaves the results directory"),
            )
            .help("write a relative path without `..`, such as `report.md` or `vllm/{{E}}.json`"));
        }
    }
    Ok(())
}

/// Whether a relative output path leaves (or is) the results directory itself.
pub fn escapes(path: &Path) -> bool {
    let mut depth: i64 = 0;
    for c in path.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            Component::RootDir | Component::Prefix(_) => return true,
        }
    }
    depth == 0
}

/// The dtype spelled in a shape, if any.
pub fn shape_dtype(shape: &Shape) -> Option<&str> {
    shape.get("dtype").and_then(Json::as_str)
}

/// `E=32,N=2880,M=1` style label of a shape, fields in order.
pub fn shape_label(shape: &Shape) -> String {
    shape
        .iter()
        .map(|(k, v)| format!("{k}={}", scalar_text(v)))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn scalar_text(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}
