//! Merging vLLM fused-MoE config files: one name (E, N, device, dtype,
//! block shape), keyed by M.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Map, Value as Json};

use super::journals::{measured, Journals};
use super::{decide, read, Candidate, MergeError, Merged};
use crate::emit::select::json_int;
use crate::emit::vllm::{device_name, to_json_indent4, FileKey, OPTIONAL, REQUIRED};
use crate::store::{JobRecord, Results};

/// One input file, read.
struct File {
    triton_version: Option<Json>,
    /// M -> config, in file order.
    configs: Vec<(i64, Map<String, Json>)>,
}

fn parse(path: &std::path::Path, text: &str) -> Result<File, MergeError> {
    let doc: Map<String, Json> = serde_json::from_str(text).map_err(|e| {
        MergeError::input(
            path,
            format!("is not a JSON object of configs keyed by M: {e}"),
        )
    })?;
    let mut file = File {
        triton_version: None,
        configs: Vec::new(),
    };
    for (key, value) in doc {
        if key == "triton_version" {
            file.triton_version = Some(value);
            continue;
        }
        let m: i64 = key
            .parse()
            .ok()
            .filter(|m: &i64| *m > 0 && m.to_string() == key)
            .ok_or_else(|| {
                MergeError::input(
                    path,
                    format!("key `{key}` is not a batch size M (a positive decimal integer) or `triton_version`"),
                )
            })?;
        let Json::Object(config) = value else {
            return Err(MergeError::input(
                path,
                format!("the entry of M={m} is {value}, not a config object"),
            ));
        };
        file.configs.push((m, config));
    }
    Ok(file)
}

/// Whether `job`'s config is the one a vLLM writer writes as `config`.
fn same_config(job: &JobRecord, config: &Map<String, Json>) -> bool {
    let same = |a: &Json, b: &Json| match (json_int(a), json_int(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    };
    config
        .iter()
        .all(|(k, v)| job.config.get(k).is_some_and(|j| same(j, v)))
        && REQUIRED
            .iter()
            .chain(OPTIONAL.iter())
            .all(|f| !job.config.contains_key(*f) || config.contains_key(*f))
}

/// The time of the job an entry of a file of `key` was written from.
fn time(results: &Results, key: &FileKey, m: i64, config: &Map<String, Json>) -> Option<f64> {
    let header = results.header.as_ref()?;
    if device_name(&header.device) != key.device_name {
        return None;
    }
    measured(results, |job| {
        job.shape.get("M").and_then(json_int) == Some(m)
            && FileKey::for_shape(&job.shape, &key.device_name).as_ref() == Ok(key)
            && same_config(job, config)
    })
}

pub(super) fn merge(
    inputs: &[PathBuf],
    journals: &mut Journals,
) -> Result<(String, Merged), MergeError> {
    let mut key: Option<FileKey> = None;
    let mut files = Vec::new();
    for path in inputs {
        let name = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let this = FileKey::parse(&name).ok_or_else(|| {
            MergeError::input(
                path,
                "is not named as vLLM names its fused-MoE configs (E={E},N={N},device_name={device}[,dtype=..][,block_shape=[..]].json), so vLLM never reads it",
            )
        })?;
        match &key {
            None => key = Some(this),
            Some(k) if *k != this => {
                return Err(MergeError::input(
                    path,
                    format!(
                        "is `{this}`, and {} is `{k}`: vLLM reads each from its own name; merge files of one E, N, device, dtype and block shape",
                        inputs[0].display()
                    ),
                ))
            }
            Some(_) => {}
        }
        files.push(parse(path, &read(path)?)?);
    }
    let key = key.expect("at least one input");

    let mut notes = Vec::new();
    let versions: Vec<&Json> = files
        .iter()
        .filter_map(|f| f.triton_version.as_ref())
        .collect();
    if versions.iter().any(|v| *v != versions[0]) {
        notes.push(format!(
            "the inputs were tuned with different Triton versions ({}); the merged file says {}, the first input's",
            versions
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            versions[0]
        ));
    }

    let mut by_m: BTreeMap<i64, Vec<Candidate<&Map<String, Json>>>> = BTreeMap::new();
    for (input, (path, file)) in inputs.iter().zip(&files).enumerate() {
        let results = journals.of(path);
        for (m, config) in &file.configs {
            let time = results.as_deref().and_then(|r| time(r, &key, *m, config));
            by_m.entry(*m).or_default().push(Candidate {
                input,
                value: config,
                time,
            });
        }
    }

    let mut doc = Map::new();
    if let Some(v) = versions.first() {
        doc.insert("triton_version".into(), (*v).clone());
    }
    let mut conflicts = Vec::new();
    for (m, candidates) in &by_m {
        let (winner, conflict) = decide(&format!("M={m}"), candidates);
        conflicts.extend(conflict);
        doc.insert(
            m.to_string(),
            Json::Object(candidates[winner].value.clone()),
        );
    }
    let merged = Merged {
        contents: to_json_indent4(&Json::Object(doc)) + "\n",
        keys: by_m.len(),
        conflicts,
        notes,
    };
    Ok((key.to_string(), merged))
}
