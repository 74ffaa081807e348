//! Where an input file's measurements come from: the journal of the
//! results directory it lies in.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::emit::{eligible, select::shape_key};
use crate::store::{journal, FinalRecord, JobRecord, Results};

/// The results directory a tuned file lies in: the nearest ancestor
/// directory of the file (its own directory first) holding `journal.jsonl`
/// or `journal.jsonl.gz`.
pub fn results_dir(file: &Path) -> Option<PathBuf> {
    let file = std::fs::canonicalize(file).ok()?;
    file.parent()?
        .ancestors()
        .find(|dir| journal::exists(dir))
        .map(Path::to_path_buf)
}

/// Journals read so far, by results directory.
#[derive(Default)]
pub(super) struct Journals {
    read: HashMap<PathBuf, Option<Rc<Results>>>,
    /// Journals that could not be read, and the like.
    pub notes: Vec<String>,
}

impl Journals {
    /// When the journals read were measured under different protocols: which
    /// settings differ, for the reader to weigh times taken under each.
    pub fn protocol_note(&self) -> Option<String> {
        let mut protocols: Vec<(&PathBuf, serde_json::Value)> = self
            .read
            .iter()
            .filter_map(|(dir, r)| {
                let header = r.as_ref()?.header.as_ref()?;
                Some((dir, serde_json::to_value(&header.protocol).ok()?))
            })
            .collect();
        protocols.sort_by(|a, b| a.0.cmp(b.0));
        let (first_dir, first) = protocols.first()?;
        let mut fields: Vec<String> = Vec::new();
        for (_, p) in &protocols[1..] {
            if let (Some(a), Some(b)) = (first.as_object(), p.as_object()) {
                for (k, v) in a {
                    if b.get(k) != Some(v) && !fields.contains(k) {
                        fields.push(k.clone());
                    }
                }
            }
        }
        (!fields.is_empty()).then(|| {
            format!(
                "the inputs' journals were measured under different protocols (settings that differ from {}'s: {}); times compared across them carry that difference",
                first_dir.display(),
                fields.join(", ")
            )
        })
    }
}

impl Journals {
    /// The journal of the results directory `file` lies in, if any.
    pub fn of(&mut self, file: &Path) -> Option<Rc<Results>> {
        let dir = results_dir(file)?;
        if let Some(r) = self.read.get(&dir) {
            return r.clone();
        }
        let results = match journal::read(&dir) {
            Ok((results, _)) => Some(Rc::new(results)),
            Err(e) => {
                self.notes.push(format!(
                    "{}: {e}; its entries count as unmeasured",
                    dir.display()
                ));
                None
            }
        };
        self.read.insert(dir, results.clone());
        results
    }
}

/// The selection time, in µs, of the current eligible jobs of `results` that
/// `matches` accepts (the fastest of them); `None` when there is none, or
/// when they are of more than one shape (the entry cannot say which it is).
pub(super) fn measured(results: &Results, matches: impl Fn(&JobRecord) -> bool) -> Option<f64> {
    let finals: HashMap<&str, &FinalRecord> = results
        .finals
        .iter()
        .map(|f| (f.job_id.as_str(), f))
        .collect();
    let superseded = crate::emit::select::superseded_ids(&results.jobs);
    let mut shape: Option<String> = None;
    let mut best: Option<f64> = None;
    for job in results
        .jobs
        .iter()
        .filter(|j| !superseded.contains(j.job_id.as_str()) && matches(j))
    {
        let Some(timed) = eligible(job, finals.get(job.job_id.as_str()).copied()) else {
            continue;
        };
        let key = shape_key(&job.shape);
        match &shape {
            Some(s) if *s != key => return None,
            _ => shape = Some(key),
        }
        let t = timed.time_us();
        best = Some(best.map_or(t, |b: f64| b.min(t)));
    }
    best
}
