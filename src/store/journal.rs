//! The append-only journal, its lock, and reading it back.
//!
//! A live run appends to `journal.jsonl`: each entry one JSON line, written
//! and synced to disk before the next job starts, so a run killed at any
//! moment loses at most the job in flight. A torn last line (the process died
//! mid-write) is cut off when the next run opens the journal, with a notice.
//!
//! Committed results keep their journal compressed as `journal.jsonl.gz`
//! (`tunelab pack DIR`). A directory may hold both: the compressed journal
//! holds the earlier entries and `journal.jsonl` those appended since, and
//! readers read them in that order. Nothing is ever rewritten in place.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};

use std::path::{Path, PathBuf};

use super::lock::Claim;
use super::record::{Entry, Results, RunHeader, FORMAT_VERSION};
use super::results_dir::{self, WriteError};
use super::v1::{FinalRecordV1, RunHeaderV1};

/// The live journal.
pub const JOURNAL: &str = "journal.jsonl";
/// The packed journal: the same lines, gzip-compressed.
pub const PACKED_JOURNAL: &str = "journal.jsonl.gz";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("another tunelab run (pid {pid}) is writing {dir}; wait for it to finish or stop it")]
    Locked { pid: u32, dir: PathBuf },
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: journal format {found} is newer than this tunelab reads (format {FORMAT_VERSION}); upgrade tunelab to read it")]
    NewerFormat {
        path: PathBuf,
        line: usize,
        found: u32,
    },
    #[error("no journal in {0} (journal.jsonl or journal.jsonl.gz)")]
    Missing(PathBuf),
    #[error("{0} does not exist, or is not a folder")]
    NoFolder(PathBuf),
    #[error(transparent)]
    Write(#[from] WriteError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `dir` holds a journal, live or packed.
pub fn exists(dir: &Path) -> bool {
    dir.join(JOURNAL).is_file() || dir.join(PACKED_JOURNAL).is_file()
}

/// An open journal with its directory's lock held.
pub struct Journal {
    file: File,
    path: PathBuf,
    /// Released when the journal is dropped.
    _claim: Claim,
}

impl Journal {
    /// Claims the directory (making it if needed), repairs a torn last
    /// line, opens for appending. Returns the journal and a notice when it
    /// repaired something.
    pub fn open(dir: &Path) -> Result<(Journal, Option<String>), StoreError> {
        Journal::open_claimed(Claim::take(dir)?)
    }

    /// [`Journal::open`] on a directory already claimed; the claim is kept
    /// (what it made stays) and its lock is held until the journal drops.
    pub fn open_claimed(mut claim: Claim) -> Result<(Journal, Option<String>), StoreError> {
        let path = claim.dir().join(JOURNAL);
        let file = open_live(&path, true)?;
        claim.keep();
        let mut journal = Journal {
            file,
            path,
            _claim: claim,
        };
        let notice = journal.repair_torn_line()?;
        Ok((journal, notice))
    }

    /// A run that died mid-write can leave a last line without its newline.
    /// If that line is a whole entry, only the newline is missing: it is
    /// added. Otherwise the entry was never whole: it is cut off, so every
    /// later reader sees only whole entries and the next one starts on its
    /// own line.
    fn repair_torn_line(&mut self) -> Result<Option<String>, StoreError> {
        repair_tail(&mut self.file, &self.path)
    }

    /// Appends several entries with one sync at the end (for merging).
    pub fn append_all(&mut self, entries: &[Entry]) -> Result<(), StoreError> {
        let mut text = String::new();
        for entry in entries {
            text.push_str(&serde_json::to_string(entry).expect("journal entries serialise"));
            text.push('\n');
        }
        self.file
            .write_all(text.as_bytes())
            .map_err(io(&self.path))?;
        self.file.sync_data().map_err(io(&self.path))
    }

    pub fn append(&mut self, entry: &Entry) -> Result<(), StoreError> {
        let mut line = serde_json::to_string(entry).expect("journal entries serialise");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(io(&self.path))?;
        self.file.sync_data().map_err(io(&self.path))
    }
}

/// Opens the live journal for appending and reading, never through a link
/// (symbolic or hard: what is appended or cut off would change a file
/// outside the results directory, or a backup made of it with hard links).
pub(crate) fn open_live(path: &Path, create: bool) -> Result<File, StoreError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    results_dir::refuse_link(path)?;
    let file = OpenOptions::new()
        .create(create)
        .append(true)
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match results_dir::refuse_link(path) {
            Err(link) => StoreError::from(link),
            Ok(()) => io(path)(e),
        })?;
    let links = file.metadata().map_err(io(path))?.nlink();
    if links > 1 {
        return Err(WriteError::HardLinked {
            path: path.to_path_buf(),
            links,
        }
        .into());
    }
    Ok(file)
}

/// Repairs the live journal at `path` (see [`Journal::repair_torn_line`]),
/// for a command that holds the directory's lock but no [`Journal`].
pub(crate) fn repair_live(path: &Path) -> Result<Option<String>, StoreError> {
    let mut file = open_live(path, false)?;
    repair_tail(&mut file, path)
}

/// See [`Journal::repair_torn_line`]; `file` is the live journal, open for appending.
fn repair_tail(file: &mut File, path: &Path) -> Result<Option<String>, StoreError> {
    let text = std::fs::read(path).map_err(io(path))?;
    if text.is_empty() || text.last() == Some(&b'\n') {
        return Ok(None);
    }
    let keep = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let line = text[..keep].iter().filter(|&&b| b == b'\n').count() + 1;
    // Any complete JSON value is a whole entry (of whatever format).
    if serde_json::from_slice::<serde_json::Value>(&text[keep..]).is_ok() {
        file.write_all(b"\n").map_err(io(path))?;
        file.sync_data().map_err(io(path))?;
        return Ok(None);
    }
    file.set_len(keep as u64).map_err(io(path))?;
    file.sync_data().map_err(io(path))?;
    Ok(Some(format!(
        "{}:{line}: removed a torn last entry ({} bytes) left by a run that stopped mid-write; every whole entry is kept",
        path.display(),
        text.len() - keep
    )))
}

/// Reads a journal: the packed entries, then the live ones. Later records of
/// a job id replace earlier ones; unreadable lines are skipped and counted in
/// the returned warnings; a header of a newer format is an error.
pub fn read(dir: &Path) -> Result<(Results, Vec<String>), StoreError> {
    let reader = read_dir(dir, false)?;
    Ok((reader.results, reader.warnings))
}

/// Every entry of a results directory's journal in order (packed, then
/// live), older formats migrated, as well as what [`read`] returns: for
/// merging journals entry by entry.
pub fn read_entries(dir: &Path) -> Result<(Vec<Entry>, Results, Vec<String>), StoreError> {
    let reader = read_dir(dir, true)?;
    Ok((
        reader.entries.unwrap_or_default(),
        reader.results,
        reader.warnings,
    ))
}

fn read_dir(dir: &Path, keep_entries: bool) -> Result<Reader, StoreError> {
    if !dir.is_dir() {
        return Err(StoreError::NoFolder(dir.to_path_buf()));
    }
    let mut sources: Vec<(PathBuf, Box<dyn Read>)> = Vec::new();
    let mut damage = Vec::new();
    let packed = dir.join(PACKED_JOURNAL);
    if packed.is_file() {
        let (reader, skipped) = super::packed::open(&packed)?;
        damage = skipped;
        sources.push((packed, reader));
    }
    let live = dir.join(JOURNAL);
    if live.is_file() {
        let f = File::open(&live).map_err(read_err(&live))?;
        sources.push((live, Box::new(f)));
    }
    if sources.is_empty() {
        return Err(StoreError::Missing(dir.to_path_buf()));
    }
    let mut reader = Reader {
        entries: keep_entries.then(Vec::new),
        warnings: damage,
        ..Reader::default()
    };
    for (path, source) in sources {
        reader.read(&path, source)?;
    }
    reader.results.profile_summary = dir.join("profile").join("summary.md").is_file();
    Ok(reader)
}

/// Reads one journal file, packed (`.gz`) or not, as [`read`] does a directory.
pub fn read_file(path: &Path) -> Result<(Results, Vec<String>), StoreError> {
    let mut reader = Reader::default();
    let source: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        let (source, damage) = super::packed::open(path)?;
        reader.warnings = damage;
        source
    } else {
        Box::new(File::open(path).map_err(read_err(path))?)
    };
    reader.read(path, source)?;
    Ok((reader.results, reader.warnings))
}

#[derive(Default)]
struct Reader {
    results: Results,
    warnings: Vec<String>,
    index: std::collections::HashMap<String, usize>,
    /// The format the last header was written in: the records after it follow it.
    format: u32,
    /// Every entry in journal order, migrated, when asked for ([`read_entries`]).
    entries: Option<Vec<Entry>>,
}

impl Reader {
    fn read(&mut self, path: &Path, source: Box<dyn Read>) -> Result<(), StoreError> {
        // Split on bytes: a torn line may end inside a character, and one bad
        // line must not make the whole journal unreadable.
        for (n, line) in BufReader::new(source).split(b'\n').enumerate() {
            let line = line.map_err(read_err(path))?;
            match std::str::from_utf8(&line) {
                Ok(text) => self.line(path, n + 1, text)?,
                Err(_) => self.warn(path, n + 1, "not UTF-8 text"),
            }
        }
        Ok(())
    }

    fn line(&mut self, path: &Path, n: usize, line: &str) -> Result<(), StoreError> {
        if line.trim().is_empty() {
            return Ok(());
        }
        if self.format == 1 {
            if let Ok(f) = serde_json::from_str::<FinalRecordV1>(line) {
                self.add(Entry::Final(f.migrate()));
                return Ok(());
            }
            match super::v1::job_record(line) {
                Some(Ok(j)) => {
                    self.add(Entry::Job(Box::new(j)));
                    return Ok(());
                }
                Some(Err(e)) => {
                    self.warn(path, n, &e.to_string());
                    return Ok(());
                }
                None => {}
            }
        }
        let parsed = serde_json::from_str::<Entry>(line);
        // A header of an older format that parses as this one (format 4's
        // does: format 5 only added records) is migrated all the same.
        let older = matches!(&parsed, Ok(Entry::Run(h)) if h.format < FORMAT_VERSION);
        let entry = match parsed {
            Ok(Entry::Run(h)) if h.format > FORMAT_VERSION => {
                return Err(StoreError::NewerFormat {
                    path: path.to_path_buf(),
                    line: n,
                    found: h.format,
                })
            }
            Ok(e) if !older => e,
            parsed => match older_header(line) {
                Some(Ok((h, format))) => {
                    self.add(Entry::Run(Box::new(h)));
                    self.format = format;
                    return Ok(());
                }
                Some(Err(why)) => {
                    self.warn(path, n, &why);
                    return Ok(());
                }
                None => {
                    if let Some(found) = newer_format(line) {
                        return Err(StoreError::NewerFormat {
                            path: path.to_path_buf(),
                            line: n,
                            found,
                        });
                    }
                    let why = parsed.err().map_or_else(
                        || "a run header of an older format".to_string(),
                        |e| e.to_string(),
                    );
                    self.warn(path, n, &why);
                    return Ok(());
                }
            },
        };
        if let Entry::Run(h) = &entry {
            self.format = h.format;
        }
        self.add(entry);
        Ok(())
    }

    fn add(&mut self, entry: Entry) {
        if let Some(entries) = &mut self.entries {
            entries.push(entry.clone());
        }
        match entry {
            Entry::Run(h) => {
                self.results.runs.push((*h).clone());
                let mut header = *h;
                if let Some(earlier) = self.results.header.take() {
                    keep_earlier_records(&mut header, earlier);
                }
                self.results.header = Some(header);
            }
            Entry::Job(j) => match self.index.get(&j.job_id) {
                Some(&i) => {
                    let replaced = std::mem::replace(&mut self.results.jobs[i], *j);
                    if let Some(f) = replaced.failure {
                        self.results
                            .replaced_failures
                            .entry(replaced.job_id)
                            .or_default()
                            .push(f.class);
                    }
                }
                None => {
                    self.index.insert(j.job_id.clone(), self.results.jobs.len());
                    self.results.jobs.push(*j);
                }
            },
            Entry::Final(f) => {
                self.results
                    .finals
                    .retain(|x| !(x.job_id == f.job_id && x.timing == f.timing));
                self.results.finals.push(f);
            }
            Entry::LaneRetired(r) => self.results.retired.push(r),
            Entry::AbSetup(s) => {
                // The last written is the last A/B, a resumed one's too.
                self.results.ab_setups.retain(|x| x.id != s.id);
                self.results.ab_setups.push(*s);
            }
            Entry::AbPair(p) => {
                let pairs = &mut self.results.ab_pairs;
                pairs.retain(|x| !(x.setup == p.setup && x.b.job_id == p.b.job_id));
                pairs.push(*p);
            }
        }
    }

    fn warn(&mut self, path: &Path, n: usize, why: &str) {
        self.warnings.push(format!(
            "{}:{n}: skipped an unreadable entry ({why})",
            path.display()
        ));
    }
}

/// A run header of an older format (1: no `format` field; 2; 3; 4), migrated,
/// with the format the records after it follow; or the reason it cannot be.
/// `None`: not such a header.
fn older_header(line: &str) -> Option<Result<(super::record::RunHeader, u32), String>> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    if value.get("type")?.as_str()? != "run" {
        return None;
    }
    match value.get("format").map(|f| f.as_u64()) {
        None => {}
        Some(Some(2)) => return Some(super::v2::migrate_header(value).map(|h| (h, 2))),
        Some(Some(3)) => return Some(super::v3::migrate_header(value).map(|h| (h, 3))),
        Some(Some(4)) => return Some(super::v4::migrate_header(value).map(|h| (h, 4))),
        Some(_) => return None,
    }
    let v1: RunHeaderV1 = match serde_json::from_value(value) {
        Ok(h) => h,
        Err(e) => return Some(Err(format!("a format-1 run header: {e}"))),
    };
    Some(
        v1.migrate()
            .map(|h| (h, 1))
            .map_err(|e| format!("a format-1 run header: {}", e.0)),
    )
}

/// The format of a run header this build cannot read, if it is newer.
fn newer_format(line: &str) -> Option<u32> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let format = value.get("format")?.as_u64()? as u32;
    (value.get("type")?.as_str()? == "run" && format > FORMAT_VERSION).then_some(format)
}

/// The header a journal's outputs are written from is its last run's, plus
/// what an earlier run recorded and the last one does not name: a file timed
/// with `--compare-to` by an earlier run (a resume without the flag), a
/// method the manifest has since dropped. Their jobs are still in the
/// journal, and the report must still say what they were.
fn keep_earlier_records(header: &mut RunHeader, earlier: RunHeader) {
    for compared in earlier.compared {
        if !header.compared.iter().any(|c| c.method == compared.method) {
            header.compared.push(compared);
        }
    }
    for method in earlier.methods {
        if !header.methods.iter().any(|m| m.name == method.name) {
            header.methods.push(method);
        }
    }
}
