//! `tunelab merge DIR... --into DIR`: the journals of several results
//! directories of one experiment (the shards of a run over several hosts)
//! into one, from which every output is then regenerated.
//!
//! Rules:
//! - every journal must be of one experiment, one device model and one mode
//!   (GPU or interpreter); runs whose environment fingerprints (tunelab,
//!   commit, manifest, driver, CUDA, Python, torch, Triton) or measurement
//!   protocols differ are refused unless `--force`, naming what differs;
//! - OUT's own journal, if it has one, comes first; then each input in
//!   order. A job recorded in several of them keeps the records of the
//!   first that has it (within one journal, its latest record counts, as
//!   everywhere); its finalist re-timings come with it;
//! - what OUT already holds is not appended again (run headers, records and
//!   lane retirements compare whole), so merging the same inputs twice adds
//!   nothing;
//! - entries are appended to OUT's live journal, after its lock is taken,
//!   with one sync at the end; a refused merge writes nothing.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::MergeError;
use crate::store::{journal, Entry, Fingerprint, Journal, RunHeader, FORMAT_VERSION};

/// What merging journals did.
#[derive(Debug, Default)]
pub struct JournalMerge {
    /// Jobs whose records were appended.
    pub added_jobs: usize,
    /// Jobs OUT (or an earlier input) already had, left out.
    pub duplicate_jobs: usize,
    /// Jobs in the merged journal.
    pub total_jobs: usize,
    pub notes: Vec<String>,
}

/// One journal to merge: where it is, its entries.
struct Source {
    dir: PathBuf,
    entries: Vec<Entry>,
    last: Option<RunHeader>,
}

fn read(dir: &Path, notes: &mut Vec<String>) -> Result<Source, MergeError> {
    if !journal::exists(dir) {
        return Err(MergeError::input(
            dir,
            "holds no journal (journal.jsonl or journal.jsonl.gz): pass results directories, e.g. results/gptoss/NVIDIA_H200",
        ));
    }
    let (entries, results, warnings) =
        journal::read_entries(dir).map_err(|e| MergeError::input(dir, e.to_string()))?;
    notes.extend(warnings);
    refuse_ab(dir, &entries)?;
    Ok(Source {
        dir: dir.to_path_buf(),
        entries,
        last: results.header,
    })
}

/// An A/B run's journal is not merged: its pairs are timed in one process
/// per GPU, and `tunelab ab` runs on one host, so there are no shards of it.
fn refuse_ab(dir: &Path, entries: &[Entry]) -> Result<(), MergeError> {
    if entries
        .iter()
        .any(|e| matches!(e, Entry::AbSetup(_) | Entry::AbPair(_)))
    {
        return Err(MergeError::input(
            dir,
            "holds an A/B run (`tunelab ab`), which is not merged: its report is `tunelab report` of its own directory",
        ));
    }
    Ok(())
}

/// Merges the journals of `inputs` into the results directory `into`.
pub fn merge(inputs: &[PathBuf], into: &Path, force: bool) -> Result<JournalMerge, MergeError> {
    let mut out = JournalMerge::default();
    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    let mut sources = Vec::new();
    for dir in inputs {
        if same(dir, into) {
            out.notes.push(format!(
                "{} is the directory merged into: its journal is kept, not read twice",
                dir.display()
            ));
            continue;
        }
        sources.push(read(dir, &mut out.notes)?);
    }
    let base_exists = journal::exists(into);
    if base_exists {
        let base = read(into, &mut out.notes)?;
        check(&base, &sources, force)?;
    } else if let Some((first, rest)) = sources.split_first() {
        check(first, rest, force)?;
    }
    if sources.is_empty() {
        return Err(MergeError::input(into, "nothing to merge into it"));
    }

    // Under the lock, OUT's journal as it is now.
    let (mut journal, repaired) = Journal::open(into).map_err(|e| write_error(into, e))?;
    out.notes.extend(repaired);
    let base = if base_exists {
        journal::read_entries(into)
            .map_err(|e| MergeError::input(into, e.to_string()))?
            .0
    } else {
        Vec::new()
    };
    refuse_ab(into, &base)?;
    let mut headers: Vec<RunHeader> = Vec::new();
    let mut retired = Vec::new();
    // Which journal each job's records come from: usize::MAX for OUT's own.
    let mut owner: HashMap<String, usize> = HashMap::new();
    let mut finals: HashSet<String> = HashSet::new();
    for e in &base {
        match e {
            Entry::Run(h) => headers.push(normalised(h)),
            Entry::Job(j) => {
                owner.insert(j.job_id.clone(), usize::MAX);
            }
            Entry::Final(f) => {
                finals.insert(serde_json::to_string(f).expect("final serialises"));
            }
            Entry::LaneRetired(r) => retired.push(r.clone()),
            Entry::AbSetup(_) | Entry::AbPair(_) => unreachable!("refused above"),
        }
    }
    let mut appended: Vec<Entry> = Vec::new();
    let mut duplicates: HashSet<String> = HashSet::new();
    for (i, source) in sources.iter().enumerate() {
        // A header goes in before the first record after it that goes in.
        let mut header: Option<RunHeader> = None;
        let mut push =
            |entry: Entry, header: &mut Option<RunHeader>, headers: &mut Vec<RunHeader>| {
                if let Some(h) = header.take() {
                    headers.push(h.clone());
                    appended.push(Entry::Run(Box::new(h)));
                }
                appended.push(entry);
            };
        for e in &source.entries {
            match e {
                Entry::Run(h) => {
                    let h = normalised(h);
                    header = (!headers.contains(&h)).then_some(h);
                }
                Entry::Job(j) => match owner.get(&j.job_id) {
                    Some(&o) if o != i => {
                        duplicates.insert(j.job_id.clone());
                    }
                    _ => {
                        if owner.insert(j.job_id.clone(), i).is_none() {
                            out.added_jobs += 1;
                        }
                        push(e.clone(), &mut header, &mut headers);
                    }
                },
                Entry::Final(f) => {
                    let key = serde_json::to_string(f).expect("final serialises");
                    if owner.get(&f.job_id) == Some(&i) && finals.insert(key) {
                        push(e.clone(), &mut header, &mut headers);
                    }
                }
                Entry::LaneRetired(r) => {
                    if !retired.contains(r) {
                        retired.push(r.clone());
                        push(e.clone(), &mut header, &mut headers);
                    }
                }
                Entry::AbSetup(_) | Entry::AbPair(_) => unreachable!("refused when read"),
            }
        }
    }
    journal
        .append_all(&appended)
        .map_err(|e| write_error(into, e))?;
    out.duplicate_jobs = duplicates.len();
    out.total_jobs = owner.len();
    Ok(out)
}

fn write_error(into: &Path, e: crate::store::StoreError) -> MergeError {
    MergeError::Write {
        path: into.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    }
}

/// A header as this build writes it (a migrated format-1 header becomes format 2).
fn normalised(h: &RunHeader) -> RunHeader {
    RunHeader {
        format: FORMAT_VERSION,
        ..h.clone()
    }
}

/// Refuses journals that are not of one experiment, device model and mode,
/// and, unless forced, those whose last runs' environments or protocols
/// differ from the first's.
fn check(first: &Source, rest: &[Source], force: bool) -> Result<(), MergeError> {
    let Some(a) = &first.last else {
        return Err(MergeError::input(&first.dir, "its journal holds no run"));
    };
    for other in rest {
        let Some(b) = &other.last else {
            return Err(MergeError::input(&other.dir, "its journal holds no run"));
        };
        let hard = [
            ("experiment", a.experiment.clone(), b.experiment.clone()),
            ("device", a.device.name.clone(), b.device.name.clone()),
            (
                "mode",
                a.mode.as_str().to_string(),
                b.mode.as_str().to_string(),
            ),
        ];
        for (what, x, y) in hard {
            if x != y {
                return Err(MergeError::input(
                    &other.dir,
                    format!(
                        "is of {what} `{y}` and {} of {what} `{x}`: merge journals of one experiment, device model and mode",
                        first.dir.display()
                    ),
                ));
            }
        }
        if force {
            continue;
        }
        let mut diffs = fingerprint_diff(&a.fingerprint, &b.fingerprint);
        diffs.extend(json_diff(
            "protocol.",
            &serde_json::to_value(&a.protocol).expect("protocol"),
            &serde_json::to_value(&b.protocol).expect("protocol"),
        ));
        if !diffs.is_empty() {
            return Err(MergeError::input(
                &other.dir,
                format!(
                    "its last run differs from {}'s: {}\n  = help: run every shard in one environment, or pass --force to merge anyway",
                    first.dir.display(),
                    diffs.join("; ")
                ),
            ));
        }
    }
    Ok(())
}

fn fingerprint_diff(a: &Fingerprint, b: &Fingerprint) -> Vec<String> {
    json_diff(
        "",
        &serde_json::to_value(a).expect("fingerprint"),
        &serde_json::to_value(b).expect("fingerprint"),
    )
}

/// `key: a -> b` for each top-level field that differs.
fn json_diff(prefix: &str, a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return Vec::new();
    };
    a.iter()
        .filter_map(|(k, v)| {
            let w = b.get(k).cloned().unwrap_or_default();
            (*v != w).then(|| format!("{prefix}{k}: {v} vs {w}"))
        })
        .collect()
}
