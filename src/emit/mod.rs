//! Output writers: one per format, all fed from the journal's records
//! ([`Results`]), so `tunelab report` regenerates every file byte for byte.
//!
//! [`write_outputs`] writes every output of the run header under the results
//! directory. An output's `path` is a minijinja template rendered per shape
//! with the shape's fields and `device` (every [`DeviceInfo`](crate::device::DeviceInfo)
//! field); shapes whose paths coincide share one file. That is how one vLLM
//! file per (E, N) and one Triton file per (N, K) arise, and how `jobs.csv`
//! holds every shape.
//!
//! Which jobs feed an output (`OutputSpec.method`):
//! - `jobs_csv`, `jobs_json`, `best_csv`, `report`: the named method, or every method.
//! - `vllm_moe_json`, `aiter_fmoe_csv`, `triton_mbucket`, `triton_kernels_json`
//!   (tuned configs): the named method (a best config without a field the
//!   format needs is an error); without a method, every method whose kind is
//!   not `torch` and whose configs carry the fields the format needs (for
//!   `triton_kernels_json`, any `w1_`/`w2_` constraint), and per shape the
//!   fastest of those methods' bests.
//!
//! The selection rule (time, eligibility, best, baseline, speedup) lives in
//! [`select`]; every writer uses it. Shapes with no eligible job are left out
//! of tuned-config files and show as `—` in the report. A tuned-config JSON
//! file that would hold no shape is not written; CSV files and the report
//! always are (a header-only CSV, a report that says what is missing).
//!
//! Public API: [`write_outputs`] (files on disk), [`render_outputs`] /
//! [`render_output`] (the same in memory), and the selection helpers
//! [`best_per_shape`] (the runner's "current best"), [`best_job_ids`]
//! (`run --use-best`), [`job_time`], [`eligible`] and [`Selection`].
//!
//! The report writes several files: the report, a details file beside it
//! and its SVG charts in a folder named after it ([`report`]); each is a
//! [`Rendered`] of format `report`, so `tunelab report` regenerates them all.
//!
//! Formats and their columns are described in each writer's module:
//! [`csv_out`] (jobs_csv, jobs_json, best_csv), [`vllm`], [`aiter`],
//! [`triton_mbucket`], [`triton_kernels`], [`report`], [`aot`] (whose files the run writes:
//! they need the manifest and the compiled images, not only the journal).

pub mod ab;
pub mod aiter;
pub mod aot;
pub mod compare;
pub mod csv_out;
pub mod ir_index;
pub mod machine;
pub mod num;
pub mod report;
pub mod select;
pub mod shipped;
pub mod svg;
pub mod triton_kernels;
pub mod triton_mbucket;
pub mod vllm;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde_json::Value as Json;

use crate::manifest::{MethodKind, OutputFormat};
use crate::store::{JobRecord, OutputSpec, Results, RunHeader};

pub use select::{
    best_job_ids, best_per_shape, eligible, job_time, Best, MethodOutcome, Selection, ShapeOutcome,
    Timed,
};

#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    #[error("the journal has no run header, so there is nothing to write outputs for")]
    NoHeader,
    #[error("output path template `{template}` cannot be rendered: {message}")]
    PathTemplate { template: String, message: String },
    #[error("output path `{path}` leaves the results directory")]
    PathEscapes { path: String },
    #[error("outputs `{first}` and `{second}` both write `{path}`")]
    SamePath {
        path: String,
        first: &'static str,
        second: &'static str,
    },
    #[error("{format} output `{path}`: {message}")]
    Data {
        format: &'static str,
        path: String,
        message: String,
    },
    /// A template of `report` or `aot` that does not render.
    #[error("{name} template: {message}")]
    Template { name: &'static str, message: String },
    #[error("output path `{path}` would write over `{owned}`, which the runner keeps in the results directory")]
    RunnerOwned { path: String, owned: &'static str },
    #[error(transparent)]
    Write(#[from] crate::store::results_dir::WriteError),
}

/// One rendered output file: where it goes (relative to the results directory) and its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub format: OutputFormat,
    pub path: PathBuf,
    pub contents: String,
}

/// Writes every output the run header lists under `dir` (the run's results
/// directory), creating subdirectories; returns the paths written. Each file
/// is written to a temporary name and renamed, so readers never see half a file.
pub fn write_outputs(results: &Results, dir: &Path) -> Result<Vec<PathBuf>, EmitError> {
    let rendered = render_outputs(results)?;
    let mut written = Vec::with_capacity(rendered.len());
    for out in rendered {
        let path = crate::store::results_dir::write_file(dir, &out.path, out.contents.as_bytes())?;
        written.push(path);
    }
    Ok(written)
}

/// Every output of the run header, rendered in memory.
pub fn render_outputs(results: &Results) -> Result<Vec<Rendered>, EmitError> {
    let header = results.header.as_ref().ok_or(EmitError::NoHeader)?;
    if header.run_mode == crate::plan::RunMode::Ab {
        // An A/B run's one output: its report (`emit::ab`).
        return Ok(ab::render(results).into_iter().collect());
    }
    let mut out: Vec<Rendered> = Vec::new();
    let mut seen: IndexMap<PathBuf, OutputFormat> = IndexMap::new();
    for spec in &header.outputs {
        for r in render_output(results, header, spec)? {
            if let Some(first) = seen.insert(r.path.clone(), r.format) {
                return Err(EmitError::SamePath {
                    path: r.path.display().to_string(),
                    first: first.name(),
                    second: r.format.name(),
                });
            }
            out.push(r);
        }
    }
    Ok(out)
}

/// One output spec, rendered: one entry per distinct rendered path.
pub fn render_output(
    results: &Results,
    header: &RunHeader,
    spec: &OutputSpec,
) -> Result<Vec<Rendered>, EmitError> {
    let sel = Selection::build(results, |j| feeds(spec, j));
    let groups = group_by_path(header, spec, &sel)?;
    let mut out = Vec::new();
    for (path, shapes) in groups {
        let group = Group {
            results,
            header,
            spec,
            sel: &sel,
            shapes,
            path,
        };
        let contents = match spec.format {
            OutputFormat::JobsCsv => Some(csv_out::jobs_csv(&group)?),
            OutputFormat::JobsJson => Some(csv_out::jobs_json(&group)?),
            OutputFormat::BestCsv => Some(csv_out::best_csv(&group)?),
            OutputFormat::VllmMoeJson => vllm::render(&group)?,
            OutputFormat::AiterFmoeCsv => aiter::render(&group)?,
            OutputFormat::TritonKernelsJson => triton_kernels::render(&group)?,
            OutputFormat::TritonMbucket => triton_mbucket::render(&group)?,
            // The report, its details file and its charts: several files.
            OutputFormat::Report => {
                for r in report::render(&group)? {
                    check_relative(&r.path.to_string_lossy())?;
                    out.push(r);
                }
                continue;
            }
            OutputFormat::Ir => Some(ir_index::render(&group)?),
            // Its files need the manifest's launches and the compiled
            // images: the run writes them after its last job (`aot`).
            OutputFormat::Aot => None,
        };
        if let Some(contents) = contents {
            // An `ir` output's path is its folder; the index lies in it.
            let path = match spec.format {
                OutputFormat::Ir => PathBuf::from(&group.path).join(ir_index::INDEX),
                _ => PathBuf::from(&group.path),
            };
            out.push(Rendered {
                format: spec.format,
                path,
                contents,
            });
        }
    }
    Ok(out)
}

/// Whether a job feeds an output, by the rule in the module documentation.
fn feeds(spec: &OutputSpec, job: &JobRecord) -> bool {
    if let Some(m) = &spec.method {
        return &job.method == m;
    }
    let needs: &[&str] = match spec.format {
        OutputFormat::JobsCsv
        | OutputFormat::JobsJson
        | OutputFormat::BestCsv
        | OutputFormat::Report => return true,
        OutputFormat::Ir => return job.kind == MethodKind::Triton,
        OutputFormat::Aot => {
            return matches!(
                job.kind,
                MethodKind::Triton | MethodKind::Cuda | MethodKind::Hip
            )
        }
        OutputFormat::VllmMoeJson => &vllm::REQUIRED,
        OutputFormat::AiterFmoeCsv => &aiter::REQUIRED,
        OutputFormat::TritonKernelsJson => {
            return job.kind != MethodKind::Torch
                && triton_kernels::is_constraint_config(&job.config)
        }
        OutputFormat::TritonMbucket => &[],
    };
    job.kind != MethodKind::Torch && needs.iter().all(|f| job.config.contains_key(*f))
}

/// What one writer gets: the shapes of one rendered path, and everything around them.
pub struct Group<'s, 'a> {
    pub results: &'a Results,
    pub header: &'a RunHeader,
    pub spec: &'a OutputSpec,
    pub sel: &'s Selection<'a>,
    /// In selection order.
    pub shapes: Vec<&'s ShapeOutcome<'a>>,
    /// Relative to the results directory.
    pub path: String,
}

impl<'s, 'a> Group<'s, 'a> {
    /// The group's jobs, in journal order.
    pub fn jobs(&self) -> Vec<&'a JobRecord> {
        self.of_group(&self.sel.jobs)
    }

    /// The group's superseded jobs (`Selection::superseded`), in journal order.
    pub fn superseded(&self) -> Vec<&'a JobRecord> {
        self.of_group(&self.sel.superseded)
    }

    fn of_group(&self, jobs: &[&'a JobRecord]) -> Vec<&'a JobRecord> {
        let keys: HashSet<&str> = self.shapes.iter().map(|s| s.key.as_str()).collect();
        jobs.iter()
            .copied()
            .filter(|j| keys.contains(select::shape_key(&j.shape).as_str()))
            .collect()
    }

    pub fn data_error(&self, message: impl Into<String>) -> EmitError {
        EmitError::Data {
            format: self.spec.format.name(),
            path: self.path.clone(),
            message: message.into(),
        }
    }

    /// Each shape's overall best, keyed by its `M`: what the M-keyed config
    /// formats (vLLM, Triton M buckets) write. Shapes without a best are left
    /// out; two shapes with one M in a file are an error.
    pub fn bests_by_m(
        &self,
    ) -> Result<std::collections::BTreeMap<i64, (&'s ShapeOutcome<'a>, Timed<'a>)>, EmitError> {
        let mut by_m = std::collections::BTreeMap::new();
        for &shape in &self.shapes {
            let Some((_, best)) = shape.overall_best() else {
                continue;
            };
            let m = shape.m().ok_or_else(|| {
                self.data_error(format!("shape {} has no integer field `M`", shape.key))
            })?;
            if let Some((other, _)) = by_m.insert(m, (shape, best)) {
                return Err(self.data_error(format!(
                    "shapes {} and {} both have M={m}; put the field that tells them apart in the path template",
                    other.key, shape.key
                )));
            }
        }
        Ok(by_m)
    }
}

/// Renders the path template per shape and groups shapes by the result, in shape order.
pub(crate) fn group_by_path<'s, 'a>(
    header: &RunHeader,
    spec: &OutputSpec,
    sel: &'s Selection<'a>,
) -> Result<IndexMap<String, Vec<&'s ShapeOutcome<'a>>>, EmitError> {
    // A journal is input too (committed, or sent): its templates are
    // rendered as a manifest's are, by tunelab's bounded evaluator.
    crate::expr::check_length(&spec.path, "a path template").map_err(|message| {
        EmitError::PathTemplate {
            template: spec.path.chars().take(80).collect(),
            message,
        }
    })?;
    let device = Json::Object(crate::manifest::device_fields(&header.device));
    let render = |shape: Option<&select::ShapeFields>| -> Result<String, EmitError> {
        let mut ctx = serde_json::Map::new();
        if let Some(shape) = shape {
            ctx.extend(shape.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        ctx.insert("device".into(), device.clone());
        let path = crate::expr::render_path(&spec.path, &ctx).map_err(|message| {
            EmitError::PathTemplate {
                template: spec.path.clone(),
                message,
            }
        })?;
        check_relative(&path)?;
        Ok(path)
    };

    let mut groups: IndexMap<String, Vec<&ShapeOutcome<'_>>> = IndexMap::new();
    if sel.shapes.is_empty() {
        // Nothing recorded: a path that needs no shape field still gets its
        // (empty) file; one that does has no shape to be rendered for.
        if let Ok(path) = render(None) {
            groups.insert(path, Vec::new());
        }
        return Ok(groups);
    }
    for shape in &sel.shapes {
        groups
            .entry(render(Some(shape.shape))?)
            .or_default()
            .push(shape);
    }
    Ok(groups)
}

/// A rendered path stays inside the results directory and off what the
/// runner keeps there (validation refuses both first; a journal written by
/// an older build may still name such a path).
fn check_relative(path: &str) -> Result<(), EmitError> {
    if path.trim().is_empty() || crate::manifest::escapes(Path::new(path)) {
        return Err(EmitError::PathEscapes {
            path: path.to_string(),
        });
    }
    if let Some(owned) = crate::manifest::runner_owned(Path::new(path)) {
        return Err(EmitError::RunnerOwned {
            path: path.to_string(),
            owned,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_results_directory() {
        assert!(check_relative("vllm/E=8,N=32,device_name=cpu.json").is_ok());
        assert!(check_relative("a/../b.csv").is_ok());
        assert!(check_relative("../x.csv").is_err());
        assert!(check_relative("a/../../x.csv").is_err());
        assert!(check_relative("/etc/x").is_err());
        assert!(check_relative("").is_err());
        assert!(check_relative("a/..").is_err());
        assert!(check_relative("journal.jsonl").is_err());
        assert!(check_relative("x/../journal.jsonl.gz").is_err());
        assert!(check_relative("logs/a.csv").is_err());
        assert!(check_relative(".lock").is_err());
        assert!(check_relative("logs.csv").is_ok());
    }
}
