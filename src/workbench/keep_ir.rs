//! Keeping the winners' IR: after a run, one worker compiles each chosen job
//! again (a hit in Triton's cache: the run compiled it) and writes its
//! kernels' stages and metadata into `<results>/<folder>/<shape>/<method>/`
//! (`emit::ir_index::folder`), with a `job.json` saying which job, config and
//! IR file they are of. A worker started with `--target` needs no GPU, so the
//! interpreter's winners can be kept for a GPU named on the command line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::backend::{PythonBackend, WorkerSpec};
use crate::emit::{ir_index, Selection};
use crate::manifest::MethodKind;
use crate::plan::Job;
use crate::store::{JobRecord, JobStatus, Results};

/// Which jobs' IR a run keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The best job of each (shape, Triton method).
    Winners,
    /// Every job of a Triton method that compiled and passed its check.
    All,
}

/// Where and how to keep IR.
pub struct KeepIr<'a> {
    /// The run's results directory.
    pub dir: &'a Path,
    /// The `ir` folder, relative to `dir`.
    pub folder: &'a str,
    pub which: Which,
    /// How the worker that compiles is started (a compile role, with a target
    /// where one is known).
    pub spec: WorkerSpec,
    pub problem: &'a str,
    /// The IR file of each method that runs from one.
    pub ir_files: HashMap<String, PathBuf>,
    pub timeout: Duration,
}

/// What was kept.
#[derive(Debug, Default)]
pub struct Kept {
    pub jobs: usize,
    pub files: usize,
    /// Jobs whose IR could not be written, and why.
    pub failed: Vec<(String, String)>,
}

/// The jobs whose IR is kept, in journal order.
pub fn jobs_to_keep(results: &Results, which: Which) -> Vec<&JobRecord> {
    let sel = Selection::new(results);
    let triton = |j: &&JobRecord| j.kind == MethodKind::Triton;
    match which {
        Which::Winners => {
            let best: std::collections::HashSet<&str> = sel
                .shapes
                .iter()
                .flat_map(|s| s.methods.iter())
                .filter_map(|m| m.best.map(|b| b.job.job_id.as_str()))
                .collect();
            sel.jobs
                .iter()
                .copied()
                .filter(triton)
                .filter(|j| best.contains(j.job_id.as_str()))
                .collect()
        }
        Which::All => sel
            .jobs
            .iter()
            .copied()
            .filter(triton)
            .filter(|j| {
                matches!(
                    j.status,
                    JobStatus::Ok | JobStatus::Pruned | JobStatus::Checked
                )
            })
            .collect(),
    }
}

/// Compiles each chosen job and writes its IR; a job that fails is listed
/// and the others go on. Errs only when no worker starts.
pub fn keep_ir(k: KeepIr<'_>, results: &Results) -> Result<Kept, String> {
    let jobs = jobs_to_keep(results, k.which);
    let mut kept = Kept::default();
    if jobs.is_empty() {
        return Ok(kept);
    }
    let mut worker =
        PythonBackend::new(k.spec.clone(), k.problem, k.timeout).with_ir_files(k.ir_files.clone());
    worker.start().map_err(|f| f.message)?;
    for record in jobs {
        let folder = ir_index::folder(record, k.which == Which::All);
        let rel = Path::new(k.folder).join(&folder);
        // The folder is this job's alone: what an earlier winner left goes
        // (a link is removed, not followed), and it is made afresh, never
        // through a link, before the worker writes into it. A link above it
        // is refused before anything is removed: through `ir/<shape>` ->
        // elsewhere, the removal would reach outside the results directory.
        let dir = match crate::store::results_dir::replace_dir(k.dir, &rel) {
            Ok(dir) => dir,
            Err(e) => {
                kept.failed.push((folder, e.to_string()));
                continue;
            }
        };
        let job = Job {
            id: record.job_id.clone(),
            shape_index: 0,
            method: record.method.clone(),
            shape: record.shape.clone(),
            config: record.config.clone(),
            baseline: record.baseline,
            variant: None,
        };
        let written = worker.keep_ir(&job, &record.kernel, record.kind.as_str(), &dir);
        match written {
            Ok(kernels) => {
                let about = json!({
                    "job_id": record.job_id,
                    "method": record.method,
                    "kernel": record.kernel,
                    "shape": record.shape,
                    "config": record.config,
                    "ir": k.ir_files.get(&record.method).map(|p| p.display().to_string()),
                    "median_us": record.stats.as_ref().map(|s| s.median_us),
                    "kernels": kernels,
                });
                let text = serde_json::to_string_pretty(&about).expect("json") + "\n";
                if let Err(e) = crate::store::results_dir::write_file(
                    &dir,
                    Path::new("job.json"),
                    text.as_bytes(),
                ) {
                    kept.failed.push((folder, e.to_string()));
                    continue;
                }
                kept.jobs += 1;
                kept.files += 1 + kernels.iter().map(|k| k.files.len()).sum::<usize>();
            }
            Err(f) => kept.failed.push((folder, f.message)),
        }
    }
    worker.shutdown();
    Ok(kept)
}
