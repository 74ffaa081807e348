//! The append-only journal (`journal.jsonl`), its lock, and reading it back.
//!
//! Each entry is one JSON line, written and synced to disk before the next job
//! starts, so a run killed at any moment loses at most the job in flight. A
//! torn last line (the process died mid-write) is ignored on reading and
//! overwritten by nothing: new entries start on a fresh line.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use super::record::{Entry, Results};

pub const JOURNAL: &str = "journal.jsonl";
const LOCK: &str = ".lock";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("another tunelab run (pid {pid}) is writing {dir}; wait for it to finish or stop it")]
    Locked { pid: u32, dir: PathBuf },
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// An open journal with its lock held.
pub struct Journal {
    file: File,
    path: PathBuf,
    lock: PathBuf,
}

impl Journal {
    /// Creates the directory if needed, takes the lock, opens for appending.
    pub fn open(dir: &Path) -> Result<Journal, StoreError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let lock = dir.join(LOCK);
        acquire(&lock, dir)?;
        let path = dir.join(JOURNAL);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)
            .map_err(io(&path))?;
        // If the last run died mid-line, start ours on a new line.
        let len = file.metadata().map_err(io(&path))?.len();
        if len > 0 {
            let text = std::fs::read(&path).map_err(io(&path))?;
            if text.last() != Some(&b'\n') {
                file.write_all(b"\n").map_err(io(&path))?;
            }
        }
        Ok(Journal { file, path, lock })
    }

    pub fn append(&mut self, entry: &Entry) -> Result<(), StoreError> {
        let mut line = serde_json::to_string(entry).expect("journal entries serialise");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(io(&self.path))?;
        self.file.sync_data().map_err(io(&self.path))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lock);
    }
}

fn acquire(lock: &Path, dir: &Path) -> Result<(), StoreError> {
    for _ in 0..2 {
        match OpenOptions::new().write(true).create_new(true).open(lock) {
            Ok(mut f) => {
                let _ = write!(f, "{}", std::process::id());
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let pid: u32 = std::fs::read_to_string(lock)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                if pid != 0 && alive(pid) {
                    return Err(StoreError::Locked {
                        pid,
                        dir: dir.to_path_buf(),
                    });
                }
                // The run that held it is gone: the lock is stale.
                let _ = std::fs::remove_file(lock);
            }
            Err(e) => return Err(io(lock)(e)),
        }
    }
    Err(StoreError::Locked {
        pid: 0,
        dir: dir.to_path_buf(),
    })
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Reads a journal. Later records of a job id replace earlier ones; unreadable
/// lines are skipped and counted in the returned warnings.
pub fn read(dir: &Path) -> Result<(Results, Vec<String>), StoreError> {
    let path = dir.join(JOURNAL);
    let file = File::open(&path).map_err(io(&path))?;
    let mut results = Results::default();
    let mut warnings = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io(&path))?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Entry>(&line) {
            Ok(Entry::Run(h)) => {
                results.runs.push((*h).clone());
                results.header = Some(*h);
            }
            Ok(Entry::Job(j)) => match index.get(&j.job_id) {
                Some(&i) => results.jobs[i] = *j,
                None => {
                    index.insert(j.job_id.clone(), results.jobs.len());
                    results.jobs.push(*j);
                }
            },
            Ok(Entry::Final(f)) => {
                results.finals.retain(|x| x.job_id != f.job_id);
                results.finals.push(f);
            }
            Err(e) => warnings.push(format!(
                "{}:{}: skipped an unreadable entry ({e})",
                path.display(),
                n + 1
            )),
        }
    }
    Ok((results, warnings))
}
