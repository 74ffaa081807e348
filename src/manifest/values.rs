//! Reading values a manifest writes in several forms: axes (a list,
//! `{range: ...}` or `{pow2: ...}`) and names looked up among known ones.
//! Shared by the shape set (`shapes.rs`) and the methods (`validate.rs`).

use serde_json::Value as Json;

use super::limits;
use super::yaml::{Node, Value};
use crate::diag::{did_you_mean, Diagnostic, Span};

/// "unknown X `name`", with the closest known name or the list of them.
pub(super) fn unknown(span: Span, what: &str, name: &str, known: &[&str]) -> Diagnostic {
    let help = match did_you_mean(name, known.iter().copied()) {
        Some(s) => format!("did you mean `{s}`?"),
        None => format!("known {what}s: {}", known.join(", ")),
    };
    Diagnostic::at(span, format!("unknown {what} `{name}`")).help(help)
}

/// The rough type of a value, for messages and for checking that one axis
/// holds values of one type.
fn value_kind(v: &Node) -> &'static str {
    match v.value {
        Value::Int(_) | Value::Float(_) => "a number",
        Value::Str(_) => "a string",
        Value::Bool(_) => "a boolean",
        _ => v.kind(),
    }
}

/// Values of one axis or space parameter: a list, `{range: [a, b, step]}` or
/// `{pow2: [lo, hi]}`. `allow_records`: list items may be mappings of
/// scalars (shape product axes).
pub(super) fn axis_values(
    node: &Node,
    name: &str,
    allow_records: bool,
) -> Result<Vec<Json>, Diagnostic> {
    let single = |key: &str| match &node.value {
        Value::Map(entries) if entries.len() == 1 && entries[0].0.name == key => {
            Some(&entries[0].1)
        }
        _ => None,
    };
    let values: Vec<Json> = if let Value::Seq(items) = &node.value {
        for item in items {
            let record_ok = allow_records
                && matches!(&item.value, Value::Map(e) if !e.is_empty() && e.iter().all(|(_, v)| v.is_shape_value()));
            if !item.is_scalar() && !record_ok {
                let what = if allow_records {
                    "numbers, strings, booleans or records of them (a record's field may also be a list of integers)"
                } else {
                    "numbers, strings or booleans"
                };
                return Err(Diagnostic::at(
                    item.span,
                    format!("`{name}` holds {}, expected {what}", item.kind()),
                ));
            }
        }
        items.iter().map(Node::to_json).collect()
    } else if let Some(r) = single("range") {
        let r = int_list(r, name, "range", 3)?;
        let (start, end, step) = (r[0], r[1], r[2]);
        if step <= 0 {
            return Err(Diagnostic::at(
                node.span,
                format!("`{name}`: range step must be positive, found {step}"),
            )
            .help("write {range: [start, end, step]} with step > 0"));
        }
        // Counted before it is built: [16, 2^63 - 1, 1] is a few bytes
        // of YAML and 2^63 values.
        let count = if end < start {
            0
        } else {
            (end as i128 - start as i128) / step as i128 + 1
        };
        if count > limits::MAX_AXIS_VALUES as i128 {
            return Err(Diagnostic::at(
                node.span,
                format!(
                    "`{name}`: range [{start}, {end}, {step}] has {count} values, more than the {} an axis may hold",
                    limits::MAX_AXIS_VALUES
                ),
            )
            .help("narrow the range or take a larger step; `{pow2: [from, to]}` gives powers of two"));
        }
        // Each value lies between `start` and `end`, but `i * step` alone
        // may not fit: [-2^63, 2^63 - 1, 2^63 - 1] has three values.
        (0..count)
            .map(|i| (start as i128 + i * step as i128) as i64)
            .map(Json::from)
            .collect()
    } else if let Some(r) = single("pow2") {
        let r = int_list(r, name, "pow2", 2)?;
        let (lo, hi) = (r[0], r[1]);
        let pow2 = |x: i64| x > 0 && x & (x - 1) == 0;
        if !pow2(lo) || !pow2(hi) {
            return Err(Diagnostic::at(
                node.span,
                format!("`{name}`: pow2 bounds must be powers of two, found [{lo}, {hi}]"),
            )
            .help("write {pow2: [16, 256]}"));
        }
        std::iter::successors(Some(lo), |v| v.checked_mul(2))
            .take_while(|v| *v <= hi)
            .map(Json::from)
            .collect()
    } else {
        let written = node.to_json();
        return Err(Diagnostic::at(
            node.span,
            format!(
                "`{name}` must be a list of values, {{range: [start, end, step]}} or {{pow2: [from, to]}}, found {}",
                node.kind()
            ),
        )
        .help(format!("for a single value write `{name}: [{written}]`")));
    };
    if values.len() as u64 > limits::MAX_AXIS_VALUES {
        return Err(Diagnostic::at(
            node.span,
            format!(
                "`{name}` has {} values, more than the {} an axis may hold",
                values.len(),
                limits::MAX_AXIS_VALUES
            ),
        ));
    }
    if values.is_empty() {
        return Err(Diagnostic::at(node.span, format!("`{name}` has no values"))
            .help("give at least one value, or remove the axis"));
    }
    Ok(values)
}

/// A space parameter's values all share one type (numbers, strings or
/// booleans): a stray `"x"` among numbers is a typo, and found here it
/// points at its own line instead of failing jobs at run time.
pub(super) fn check_one_type(node: &Node, name: &str) -> Result<(), Diagnostic> {
    let Value::Seq(items) = &node.value else {
        return Ok(()); // range and pow2 are integers
    };
    let Some(first) = items.first() else {
        return Ok(());
    };
    for item in &items[1..] {
        if value_kind(item) != value_kind(first) {
            return Err(Diagnostic::at(
                item.span,
                format!(
                    "`{name}` mixes types: this value is {}, the first ({}) is {}",
                    value_kind(item),
                    first.to_json(),
                    value_kind(first)
                ),
            )
            .help("every value of one parameter has the same type; quote all or none"));
        }
    }
    Ok(())
}

fn int_list(node: &Node, name: &str, form: &str, len: usize) -> Result<Vec<i64>, Diagnostic> {
    let items: Option<Vec<i64>> = match &node.value {
        Value::Seq(items) if items.len() == len => items
            .iter()
            .map(|i| match i.value {
                Value::Int(v) => Some(v),
                _ => None,
            })
            .collect(),
        _ => None,
    };
    items.ok_or_else(|| {
        Diagnostic::at(
            node.span,
            format!("`{name}`: `{form}` takes {len} integers"),
        )
    })
}

/// Where each value of an axis was written: its own place for a list item,
/// the axis' place for `{range: ...}` and `{pow2: ...}`.
pub(super) fn axis_value_spans(node: &Node, count: usize) -> Vec<Span> {
    match &node.value {
        Value::Seq(items) => items.iter().map(|i| i.span).collect(),
        _ => vec![node.span; count],
    }
}
