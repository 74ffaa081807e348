//! Output path templates: text and `{{ expression }}` fields, rendered by
//! the expression evaluator (never a template engine: a path names a file).

use super::{
    check_length, compile_fast, flatten, outside_language, Scope, Val, MAX_RENDERED_BYTES,
};
use serde_json::Value as Json;

/// A value as Jinja prints it: integers as digits, a whole float with `.0`,
/// booleans and none in lower case.
fn render_value(v: &Val) -> String {
    match v {
        Val::None => "none".into(),
        Val::Bool(b) => b.to_string(),
        Val::Int(i) => i.to_string(),
        Val::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 => format!("{f:.1}"),
        Val::Float(f) => f.to_string(),
        Val::Str(s) => s.to_string(),
    }
}

/// Renders an output path template: text and `{{ expression }}` fields
/// (`vllm/E={{E}},N={{N}},device_name={{device.vllm_name}}.json`,
/// `block_shape=[{{block_shape[0]}},{{block_shape[1]}}]`), into at most
/// [`MAX_RENDERED_BYTES`]. Jinja's statements and comments (`{% %}`,
/// `{# #}`) are refused: a path names a file, and a loop could print for
/// hours.
pub fn render_path(template: &str, ctx: &serde_json::Map<String, Json>) -> Result<String, String> {
    check_length(template, "a path template")?;
    if template.contains("{%") || template.contains("{#") {
        return Err("`{%` statements and `{#` comments are not allowed: a path template holds text and `{{ field }}`s".into());
    }
    let flat = flatten(ctx);
    let scope = Scope {
        slots: &flat.slots,
        constants: &flat.constants,
    };
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or("a `{{` is not closed by `}}`")?;
        let source = after[..close].trim();
        let compiled = compile_fast(source, &scope).ok_or_else(|| outside_language(source))?;
        out.push_str(&render_value(&compiled.eval(&flat.values)?));
        if out.len() > MAX_RENDERED_BYTES {
            return Err(format!(
                "it renders to more than {MAX_RENDERED_BYTES} bytes"
            ));
        }
        rest = &after[close + 2..];
    }
    if rest.contains("}}") {
        return Err("a `}}` has no `{{` before it".into());
    }
    out.push_str(rest);
    if out.len() > MAX_RENDERED_BYTES {
        return Err(format!(
            "it renders to more than {MAX_RENDERED_BYTES} bytes"
        ));
    }
    Ok(out)
}
