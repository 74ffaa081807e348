//! Shapes from a CSV file, such as aiter's `untuned_fmoe.csv`.

use std::path::Path;

use serde_json::Value as Json;

use super::model::Shape;
use super::raw::RawCsvShapes;
use super::yaml::Node;
use crate::diag::{add_source, Diagnostic, Span};

/// Reads one shape per row. Shape fields come from `columns` (field -> column)
/// or from the column of the same name; numbers stay numbers.
pub fn read(
    spec: &RawCsvShapes,
    node: &Node,
    base_dir: &Path,
) -> Result<Vec<(Shape, Span)>, Diagnostic> {
    let path_span = node.get("path").map(|n| n.span).unwrap_or(node.span);
    let path = base_dir.join(&spec.path);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Diagnostic::at(
            path_span,
            format!("cannot read shape CSV {}: {e}", path.display()),
        )
        .help("paths are relative to the manifest")
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
            .cloned()
            .unwrap_or_else(|| field.clone());
        let Some(index) = headers.iter().position(|h| *h == column) else {
            let field_span = node
                .get("columns")
                .and_then(|c| c.get(field))
                .map(|n| n.span)
                .unwrap_or(path_span);
            let near = crate::diag::did_you_mean(&column, headers.iter().map(String::as_str));
            let help = match near {
                Some(n) => format!(
                    "did you mean `{n}`? columns in the file: {}",
                    headers.join(", ")
                ),
                None => format!("columns in the file: {}", headers.join(", ")),
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
        let record = record.map_err(|e| {
            Diagnostic::at(Span { file, line, col: 1 }, format!("bad CSV row: {e}"))
        })?;
        let mut shape = Shape::new();
        for (field, index) in &picks {
            let cell = record.get(*index).unwrap_or("");
            let col = column_offset(&text, line, *index);
            let value = parse_cell(cell).ok_or_else(|| {
                Diagnostic::at(Span { file, line, col }, format!("row {line}, column `{}`: `{cell}` is not a number", headers[*index]))
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
