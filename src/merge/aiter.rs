//! Merging aiter `tuned_fmoe.csv` tables: one header, keyed by aiter's
//! lookup key.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;

use super::journals::{measured, Journals};
use super::{decide, read, Candidate, MergeError, Merged};
use crate::emit::aiter::{dispatch_cells, key_cells, KEY_COLUMNS};
use crate::store::Results;

/// One table, read.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

fn parse(path: &Path, text: &str) -> Result<Table, MergeError> {
    let mut rdr = csv::ReaderBuilder::new().from_reader(text.as_bytes());
    let header: Vec<String> = rdr
        .headers()
        .map_err(|e| MergeError::input(path, format!("cannot read the header: {e}")))?
        .iter()
        .map(str::to_string)
        .collect();
    let missing: Vec<&str> = KEY_COLUMNS
        .iter()
        .copied()
        .filter(|c| !header.iter().any(|h| h == c))
        .collect();
    if !missing.is_empty() {
        return Err(MergeError::input(
            path,
            format!(
                "is not an aiter tuned_fmoe.csv table: it has no {} column(s), which aiter finds rows by",
                missing.join(", ")
            ),
        ));
    }
    let mut rows = Vec::new();
    for (i, record) in rdr.records().enumerate() {
        let record = record.map_err(|e| MergeError::input(path, format!("row {}: {e}", i + 2)))?;
        rows.push(record.iter().map(str::to_string).collect());
    }
    Ok(Table { header, rows })
}

/// A cell as aiter's pandas index compares it: integers as integers.
fn norm(cell: &str) -> String {
    let t = cell.trim();
    match t.parse::<i64>() {
        Ok(i) => i.to_string(),
        Err(_) => t.to_string(),
    }
}

/// The key columns' positions: `gfx` first where the table has it, then [`KEY_COLUMNS`].
fn key_positions(header: &[String]) -> Vec<usize> {
    let pos = |c: &str| header.iter().position(|h| h == c);
    pos("gfx")
        .into_iter()
        .chain(
            KEY_COLUMNS
                .iter()
                .map(|c| pos(c).expect("checked at parse")),
        )
        .collect()
}

/// The time of the job a row was written from, from `results`' journal.
fn time(results: &Results, header: &[String], row: &[String]) -> Option<f64> {
    let run = results.header.as_ref()?;
    let device = &run.device;
    let cell = |c: &str| header.iter().position(|h| h == c).map(|i| norm(&row[i]));
    if let Some(gfx) = cell("gfx") {
        if device.arch.split(':').next() != Some(gfx.as_str()) {
            return None;
        }
    }
    let key: Vec<String> = KEY_COLUMNS.iter().map(|c| cell(c).unwrap()).collect();
    let dispatch: Vec<String> = ["kernelName1", "kernelName2", "block_m", "ksplit"]
        .iter()
        .map(|c| cell(c).unwrap_or_default())
        .collect();
    measured(results, |job| {
        matches!(key_cells(device, &job.shape), Ok(Ok(cells)) if cells.iter().map(|c| norm(c)).eq(key.iter().cloned()))
            && dispatch_cells(job)
                .is_some_and(|d| d.iter().map(|c| norm(c)).eq(dispatch.iter().cloned()))
    })
}

pub(super) fn merge(
    inputs: &[PathBuf],
    journals: &mut Journals,
) -> Result<(String, Merged), MergeError> {
    let mut tables = Vec::new();
    for path in inputs {
        let table = parse(path, &read(path)?)?;
        if let Some(first) = tables.first() {
            let first: &Table = first;
            if first.header != table.header {
                let only = |a: &[String], b: &[String]| -> Vec<String> {
                    a.iter().filter(|c| !b.contains(c)).cloned().collect()
                };
                let (extra, lacking) = (
                    only(&table.header, &first.header),
                    only(&first.header, &table.header),
                );
                let what = if extra.is_empty() && lacking.is_empty() {
                    "the same columns in another order".to_string()
                } else {
                    format!(
                        "columns {} that {} has not, and lacks {}",
                        if extra.is_empty() {
                            "-".into()
                        } else {
                            extra.join(", ")
                        },
                        inputs[0].display(),
                        if lacking.is_empty() {
                            "-".into()
                        } else {
                            lacking.join(", ")
                        }
                    )
                };
                return Err(MergeError::input(
                    path,
                    format!("has {what}; merge tables with one header (write them with one aiter or tunelab version)"),
                ));
            }
        }
        tables.push(table);
    }
    let header = tables[0].header.clone();
    let positions = key_positions(&header);

    let mut notes = Vec::new();
    // Key -> candidates in input order; keys in order of first appearance.
    let mut by_key: IndexMap<Vec<String>, Vec<Candidate<&Vec<String>>>> = IndexMap::new();
    for (input, (path, table)) in inputs.iter().zip(&tables).enumerate() {
        let results = journals.of(path);
        let mut seen: HashMap<Vec<String>, usize> = HashMap::new();
        let mut duplicates = 0;
        for row in &table.rows {
            let key: Vec<String> = positions.iter().map(|&i| norm(&row[i])).collect();
            if seen.insert(key.clone(), 1).is_some() {
                duplicates += 1;
                continue;
            }
            let time = results.as_deref().and_then(|r| time(r, &header, row));
            by_key.entry(key).or_default().push(Candidate {
                input,
                value: row,
                time,
            });
        }
        if duplicates > 0 {
            notes.push(format!(
                "{}: {duplicates} row(s) repeat a key of an earlier row of the same table; aiter reads the first, and so does the merge",
                path.display()
            ));
        }
    }

    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    let write_err = |e: csv::Error| MergeError::input(&inputs[0], e.to_string());
    w.write_record(&header).map_err(write_err)?;
    let mut conflicts = Vec::new();
    for (key, candidates) in &by_key {
        let (winner, conflict) = decide(&key.join(","), candidates);
        conflicts.extend(conflict);
        w.write_record(candidates[winner].value)
            .map_err(write_err)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| MergeError::input(&inputs[0], e.to_string()))?;
    let contents = String::from_utf8(bytes).expect("the inputs were UTF-8");
    let name = inputs[0]
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tuned_fmoe.csv".into());
    Ok((
        name,
        Merged {
            contents,
            keys: by_key.len(),
            conflicts,
            notes,
        },
    ))
}
