//! `tunelab merge`: several tuned files of one consumer format into one, per
//! key the faster entry, written in the consumer's exact format.
//!
//! Formats, told apart by extension:
//! - `.json`: vLLM fused-MoE config files ([`vllm`]). All inputs must carry
//!   the same vLLM file name (same E, N, device, dtype, block shape: the
//!   name is all vLLM looks them up by), and so must the output. Key: M.
//! - `.csv`: aiter `tuned_fmoe.csv` tables ([`aiter`]). All inputs must have
//!   the same header. Key: aiter's lookup key, the columns
//!   [`crate::emit::aiter::KEY_COLUMNS`] (plus `gfx` where the tables have
//!   it), compared as aiter compares them (integers as integers).
//!
//! Per key:
//! - held by one input, or by several with identical entries: taken as is;
//! - held by several inputs with different entries: a conflict. When every
//!   differing entry has a measurement, the fastest wins (equal times: the
//!   earlier input). Otherwise the first input's entry is kept. Either way
//!   the conflict is listed with the times found.
//!
//! A measurement comes from the journal of the results directory an input
//! file lies in: the nearest ancestor directory of the file holding
//! `journal.jsonl` or `journal.jsonl.gz`, read with
//! [`crate::store::journal::read`]. The entry's time is the selection time
//! (finalist median, else own median) of the eligible job whose shape and
//! config the entry was written from, by the writer's own rules; none when
//! no such job exists, or when jobs of more than one shape match. aiter's
//! own tuner merges tables the same way, by its `us` column
//! (`aiter/jit/core.py`, `update_config_files`); this merge trusts only
//! journal measurements, never a number a file states.
//!
//! Output: keys in the order of first appearance across inputs (vLLM: M
//! ascending, as its tuner writes), each with the winning entry as the input
//! had it, written atomically (a temporary file renamed over `OUT`).
//! Results directories as inputs (merging journals) are not supported yet.

mod aiter;
mod journals;
mod vllm;

use std::path::{Path, PathBuf};

pub use journals::results_dir;

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// The inputs cannot be merged as given; nothing was written.
    #[error("{}: {message}", path.display())]
    Input { path: PathBuf, message: String },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl MergeError {
    pub(crate) fn input(path: &Path, message: impl Into<String>) -> MergeError {
        MergeError::Input {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }
}

/// A key held by inputs with different entries, and how it was decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    /// `M=16` (vLLM), the key's cells as in the table (aiter).
    pub key: String,
    /// Every input holding the key (its index in the inputs) and the time
    /// measured for its entry, in µs.
    pub entries: Vec<(usize, Option<f64>)>,
    /// The input whose entry was kept.
    pub kept: usize,
    /// Whether the kept entry won on measured time (else: the first input's
    /// entry, for want of a measurement of every differing entry).
    pub by_time: bool,
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `vllm_moe_json` or `aiter_fmoe_csv`.
    pub format: &'static str,
    /// The file written.
    pub written: PathBuf,
    /// Keys written.
    pub keys: usize,
    pub conflicts: Vec<Conflict>,
    /// Things worth knowing that did not stop the merge.
    pub notes: Vec<String>,
}

/// Merges `inputs` into `into` (a file, or a directory, existing or ending
/// in `/`, to write the inputs' file name in). See the module documentation for the rules.
pub fn merge(inputs: &[PathBuf], into: &Path) -> Result<Outcome, MergeError> {
    let first = inputs
        .first()
        .ok_or_else(|| MergeError::input(into, "no input files to merge"))?;
    let kind = kind_of(first)?;
    for path in &inputs[1..] {
        let other = kind_of(path)?;
        if other != kind {
            return Err(MergeError::input(
                path,
                format!(
                    "is {} and {} is {}; merge files of one format",
                    other.describe(),
                    first.display(),
                    kind.describe()
                ),
            ));
        }
    }
    let mut journals = journals::Journals::default();
    let (format, out_name, merged) = match kind {
        Kind::Vllm => {
            let (name, merged) = vllm::merge(inputs, &mut journals)?;
            ("vllm_moe_json", name, merged)
        }
        Kind::Aiter => {
            let (name, merged) = aiter::merge(inputs, &mut journals)?;
            ("aiter_fmoe_csv", name, merged)
        }
    };
    let names_a_dir = into
        .as_os_str()
        .to_string_lossy()
        .ends_with(std::path::MAIN_SEPARATOR);
    let written = if into.is_dir() || names_a_dir {
        into.join(&out_name)
    } else {
        into.to_path_buf()
    };
    if kind == Kind::Vllm {
        let file = written
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if file != out_name {
            return Err(MergeError::input(
                into,
                format!(
                    "vLLM reads these configs only from a file named `{out_name}`; name the output so (or give a directory)"
                ),
            ));
        }
    }
    write_atomic(&written, merged.contents.as_bytes())?;
    let mut notes = journals.notes.clone();
    notes.extend(journals.protocol_note());
    notes.extend(merged.notes);
    Ok(Outcome {
        format,
        written,
        keys: merged.keys,
        conflicts: merged.conflicts,
        notes,
    })
}

/// What one format's merge produced.
struct Merged {
    contents: String,
    keys: usize,
    conflicts: Vec<Conflict>,
    notes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Vllm,
    Aiter,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Vllm => "a vLLM fused-MoE config file (.json)",
            Kind::Aiter => "an aiter tuned_fmoe.csv table (.csv)",
        }
    }
}

fn kind_of(path: &Path) -> Result<Kind, MergeError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => Ok(Kind::Vllm),
        Some("csv") => Ok(Kind::Aiter),
        _ => Err(MergeError::input(
            path,
            "is neither a vLLM fused-MoE config file (.json) nor an aiter tuned_fmoe.csv table (.csv)",
        )),
    }
}

fn read(path: &Path) -> Result<String, MergeError> {
    std::fs::read_to_string(path).map_err(|e| MergeError::input(path, format!("cannot read: {e}")))
}

/// One input's entry for a key.
struct Candidate<T> {
    input: usize,
    value: T,
    time: Option<f64>,
}

/// Decides one key among the inputs holding it (in input order): the
/// winning candidate's index and, when entries differ, the conflict.
fn decide<T: PartialEq>(key: &str, candidates: &[Candidate<T>]) -> (usize, Option<Conflict>) {
    // Identical entries are one entry, measured by the best time any of its inputs has.
    let mut groups: Vec<(usize, Option<f64>)> = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        match groups
            .iter_mut()
            .find(|(g, _)| candidates[*g].value == c.value)
        {
            Some((_, t)) => {
                *t = match (*t, c.time) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
            None => groups.push((i, c.time)),
        }
    }
    if groups.len() == 1 {
        return (0, None);
    }
    let all_timed = groups.iter().all(|(_, t)| t.is_some());
    let winner = if all_timed {
        let mut best = groups[0];
        for g in &groups[1..] {
            if g.1.unwrap() < best.1.unwrap() {
                best = *g;
            }
        }
        best.0
    } else {
        0
    };
    let conflict = Conflict {
        key: key.to_string(),
        entries: candidates.iter().map(|c| (c.input, c.time)).collect(),
        kept: candidates[winner].input,
        by_time: all_timed,
    };
    (winner, Some(conflict))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), MergeError> {
    let err = |source| MergeError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(input: usize, value: i32, time: Option<f64>) -> Candidate<i32> {
        Candidate { input, value, time }
    }

    #[test]
    fn the_faster_entry_wins_when_every_entry_is_measured() {
        let (w, conflict) = decide("M=1", &[c(0, 1, Some(20.0)), c(1, 2, Some(10.0))]);
        assert_eq!(w, 1);
        let conflict = conflict.unwrap();
        assert_eq!((conflict.kept, conflict.by_time), (1, true));
        // Equal times: the earlier input.
        let (w, _) = decide("M=1", &[c(0, 1, Some(10.0)), c(1, 2, Some(10.0))]);
        assert_eq!(w, 0);
    }

    #[test]
    fn without_every_measurement_the_first_inputs_entry_is_kept() {
        let (w, conflict) = decide("M=1", &[c(0, 1, None), c(1, 2, Some(10.0))]);
        assert_eq!(w, 0);
        let conflict = conflict.unwrap();
        assert_eq!((conflict.kept, conflict.by_time), (0, false));
        assert_eq!(conflict.entries, vec![(0, None), (1, Some(10.0))]);
    }

    #[test]
    fn identical_entries_are_no_conflict_and_share_their_measurement() {
        assert_eq!(decide("M=1", &[c(0, 1, None), c(1, 1, None)]).1, None);
        // Inputs 0 and 2 hold the same entry; 2's measurement speaks for it.
        let (w, conflict) = decide(
            "M=1",
            &[c(0, 1, None), c(1, 2, Some(10.0)), c(2, 1, Some(5.0))],
        );
        assert_eq!(w, 0);
        assert!(conflict.unwrap().by_time);
    }
}
