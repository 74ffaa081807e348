//! The shape set: `list`, the `product` of axes and `csv` rows (such as
//! aiter's `untuned_fmoe.csv`), each completed with `fixed`.

use std::collections::HashSet;

use indexmap::IndexMap;
use serde_json::Value as Json;

use super::de::Spanned;
use super::files::Files;
use super::limits;
use super::model::{Shape, DTYPES};
use super::raw::{RawCsvShapes, RawShapes};
use super::values::{axis_values, unknown};
use super::yaml::Node;
use crate::diag::{add_source, Diagnostic, Span};

/// Expands a shape set: every shape with the same fields, duplicates removed,
/// in the order written.
pub fn expand(raw: &Spanned<RawShapes>, files: &Files<'_>) -> Result<Vec<Shape>, Diagnostic> {
    let mut shapes: Vec<(Shape, Span)> = Vec::new();
    if let Some(list) = &raw.list {
        for entry in list {
            let mut shape = Shape::new();
            for (k, v) in entry.iter() {
                if !v.is_shape_value() {
                    return Err(Diagnostic::at(
                        v.span,
                        format!(
                            "shape field `{}` must be {SHAPE_VALUE}, found {}",
                            k.value,
                            v.kind()
                        ),
                    ));
                }
                shape.insert(k.value.clone(), v.to_json());
            }
            shapes.push((shape, entry.span));
        }
    }
    if let Some(product) = &raw.product {
        let mut axes = Vec::new();
        for (name, value) in product.iter() {
            axes.push((name.as_str(), axis_values(value, name, true)?));
        }
        // Counted before it is built.
        let count = axes
            .iter()
            .try_fold(1u64, |n, (_, values)| n.checked_mul(values.len() as u64))
            .unwrap_or(u64::MAX);
        if count > limits::MAX_SHAPES {
            return Err(Diagnostic::at(
                product.span,
                format!(
                    "this product makes {count} shapes, more than the {} a shape set may hold",
                    limits::MAX_SHAPES
                ),
            )
            .help("tune fewer shapes at once: split the product, or narrow it with `--only`"));
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
        shapes.extend(partial.into_iter().map(|shape| (shape, product.span)));
    }
    if let Some(csv) = &raw.csv {
        shapes.extend(read_csv(csv, files)?);
    }
    if shapes.is_empty() {
        return Err(Diagnostic::at(raw.span, "the shape set is empty")
            .help("add `list:`, `product:` or `csv:` under `shapes`"));
    }
    if let Some(fixed) = &raw.fixed {
        let fields = shape_fields(fixed)?;
        for (shape, _) in &mut shapes {
            for (k, v) in &fields {
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
    for (shape, s) in &shapes {
        if let Some(d) = shape.get("dtype").and_then(Json::as_str) {
            if !DTYPES.contains(&d) {
                return Err(unknown(*s, "dtype", d, DTYPES));
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

/// What a shape field's value may be, for messages.
pub(super) const SHAPE_VALUE: &str = "a number, string, boolean or list of integers";

/// `fixed:` shape fields, as JSON: scalars, or lists of integers (`block_shape: [128, 128]`).
fn shape_fields(
    map: &IndexMap<Spanned<String>, Node>,
) -> Result<IndexMap<String, Json>, Diagnostic> {
    let mut out = IndexMap::new();
    for (k, v) in map {
        if !v.is_shape_value() {
            return Err(Diagnostic::at(
                v.span,
                format!(
                    "fixed field `{}` must be {SHAPE_VALUE}, found {}",
                    k.value,
                    v.kind()
                ),
            ));
        }
        out.insert(k.value.clone(), v.to_json());
    }
    Ok(out)
}

/// A mapping of scalar values (`params:`), as JSON.
pub fn scalar_fields(
    map: &IndexMap<Spanned<String>, Node>,
    what: &str,
) -> Result<IndexMap<String, Json>, Diagnostic> {
    let mut out = IndexMap::new();
    for (k, v) in map {
        if !v.is_scalar() {
            return Err(Diagnostic::at(
                v.span,
                format!(
                    "{what} `{}` must be a number, string or boolean, found {}",
                    k.value,
                    v.kind()
                ),
            ));
        }
        out.insert(k.value.clone(), v.to_json());
    }
    Ok(out)
}

/// Reads one shape per row. Shape fields come from `columns` (field -> column)
/// or from the column of the same name; numbers stay numbers.
fn read_csv(spec: &RawCsvShapes, files: &Files<'_>) -> Result<Vec<(Shape, Span)>, Diagnostic> {
    let path_span = spec.path.span;
    let (path, bytes) = files.read(&spec.path, "csv", "shape CSV", limits::MAX_FILE_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|_| {
        Diagnostic::at(
            path_span,
            format!("shape CSV {} is not UTF-8 text", path.display()),
        )
    })?;
    let file = add_source(&path, text.clone());
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers: Vec<String> = reader
        .headers()
        .map_err(|e| {
            Diagnostic::at(
                Span {
                    file,
                    line: 1,
                    col: 1,
                },
                format!("cannot read CSV header: {e}"),
            )
        })?
        .iter()
        .map(str::to_string)
        .collect();

    let fields: Vec<String> = match &spec.fields {
        Some(f) => f.clone(),
        None if !spec.columns.is_empty() => spec.columns.keys().cloned().collect(),
        None => headers.clone(),
    };
    let mut picks = Vec::new();
    for field in &fields {
        let column = spec
            .columns
            .get(field)
            .map(|c| c.value.clone())
            .unwrap_or_else(|| field.clone());
        let Some(index) = headers.iter().position(|h| *h == column) else {
            let field_span = spec.columns.get(field).map_or(path_span, |c| c.span);
            // The header is the file's first line: it is pointed at, not
            // listed (a file that is no CSV would have its first line
            // printed). A column close to the name asked for is named.
            let near = crate::diag::did_you_mean(&column, headers.iter().map(String::as_str));
            let n = headers.len();
            let columns = format!(
                "the file's header (its line 1) has {n} column{}",
                if n == 1 { "" } else { "s" }
            );
            let help = match near {
                Some(n) => format!("did you mean `{n}`? {columns}"),
                None => columns,
            };
            return Err(Diagnostic::at(
                field_span,
                format!(
                    "{} has no column `{column}` (for shape field `{field}`)",
                    path.display()
                ),
            )
            .help(help));
        };
        picks.push((field.clone(), index));
    }

    let mut shapes = Vec::new();
    for (row_index, record) in reader.records().enumerate() {
        let line = row_index + 2;
        if row_index as u64 >= limits::MAX_SHAPES {
            return Err(Diagnostic::at(
                path_span,
                format!(
                    "{} has more than {} rows, the most shapes a shape set may hold",
                    path.display(),
                    limits::MAX_SHAPES
                ),
            )
            .help("tune fewer shapes at once: split the file"));
        }
        let record = record.map_err(|e| {
            Diagnostic::at(Span { file, line, col: 1 }, format!("bad CSV row: {e}"))
        })?;
        let mut shape = Shape::new();
        for (field, index) in &picks {
            let cell = record.get(*index).unwrap_or("");
            let col = column_offset(&text, line, *index);
            let value = parse_cell(cell).ok_or_else(|| {
                Diagnostic::at(Span { file, line, col }, format!("row {line}, column `{}` is not a number", headers[*index]))
                    .help("shape fields read from CSV must be numbers unless they name a dtype, activation or similar word")
            })?;
            shape.insert(field.clone(), value);
        }
        shapes.push((shape, Span { file, line, col: 1 }));
    }
    if shapes.is_empty() {
        return Err(Diagnostic::at(
            path_span,
            format!("{} has a header but no rows", path.display()),
        ));
    }
    Ok(shapes)
}

/// Numbers become numbers; words that are plainly labels (`torch.bfloat16`,
/// `ActivationType.Silu`, `bf16`) stay strings; empty or numeric-looking
/// garbage is rejected.
fn parse_cell(cell: &str) -> Option<Json> {
    if let Ok(i) = cell.parse::<i64>() {
        return Some(Json::from(i));
    }
    if let Ok(f) = cell.parse::<f64>() {
        if f.is_finite() {
            return Some(Json::from(f));
        }
    }
    let is_word = cell.starts_with(|c: char| c.is_ascii_alphabetic())
        && cell
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    is_word.then(|| Json::String(cell.to_string()))
}

/// 1-based character column where field `index` starts on `line`.
fn column_offset(text: &str, line: usize, index: usize) -> usize {
    let Some(row) = text.lines().nth(line - 1) else {
        return 1;
    };
    let mut col = 1;
    for (i, part) in row.split(',').enumerate() {
        if i == index {
            return col;
        }
        col += part.chars().count() + 1;
    }
    1
}
