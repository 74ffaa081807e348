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

use super::record::{Entry, Results, RunHeader, FORMAT_VERSION};
use super::v1::{FinalRecordV1, RunHeaderV1};

/// The live journal.
pub const JOURNAL: &str = "journal.jsonl";
/// The packed journal: the same lines, gzip-compressed.
pub const PACKED_JOURNAL: &str = "journal.jsonl.gz";
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

/// An open journal with its lock held.
pub struct Journal {
    file: File,
    path: PathBuf,
    lock: PathBuf,
}

impl Journal {
    /// Creates the directory if needed, takes the lock, repairs a torn last
    /// line, opens for appending. Returns the journal and a notice when it
    /// repaired something.
    pub fn open(dir: &Path) -> Result<(Journal, Option<String>), StoreError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let lock = dir.join(LOCK);
        acquire(&lock, dir)?;
        let path = dir.join(JOURNAL);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)
            .map_err(io(&path))?;
        let mut journal = Journal { file, path, lock };
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

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lock);
    }
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
    let mut sources: Vec<(PathBuf, Box<dyn Read>)> = Vec::new();
    let packed = dir.join(PACKED_JOURNAL);
    if packed.is_file() {
        let f = File::open(&packed).map_err(read_err(&packed))?;
        sources.push((packed, Box::new(flate2::read::MultiGzDecoder::new(f))));
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
    let f = File::open(path).map_err(read_err(path))?;
    let source: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::MultiGzDecoder::new(f))
    } else {
        Box::new(f)
    };
    let mut reader = Reader::default();
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
                Some(&i) => self.results.jobs[i] = *j,
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

/// Compresses a results directory's journal for committing: the packed and
/// live entries, in order, into a new `journal.jsonl.gz` (written beside and
/// renamed into place), then removes `journal.jsonl`. Returns the bytes
/// before and after. Refuses while a run holds the lock.
pub fn pack(dir: &Path) -> Result<(u64, u64), StoreError> {
    let lock = dir.join(LOCK);
    acquire(&lock, dir)?;
    let result = pack_locked(dir);
    let _ = std::fs::remove_file(&lock);
    result
}

fn pack_locked(dir: &Path) -> Result<(u64, u64), StoreError> {
    let packed = dir.join(PACKED_JOURNAL);
    let live = dir.join(JOURNAL);
    if live.is_file() {
        // A torn tail must not be frozen into the packed file, where no
        // repair reaches it.
        let mut file = OpenOptions::new()
            .append(true)
            .read(true)
            .open(&live)
            .map_err(io(&live))?;
        if let Some(notice) = repair_tail(&mut file, &live)? {
            eprintln!("warning: {notice}");
        }
    }
    if !live.is_file() {
        return match packed.metadata() {
            Ok(m) => Ok((m.len(), m.len())),
            Err(_) => Err(StoreError::Missing(dir.to_path_buf())),
        };
    }
    let mut text = Vec::new();
    if packed.is_file() {
        let f = File::open(&packed).map_err(read_err(&packed))?;
        flate2::read::MultiGzDecoder::new(f)
            .read_to_end(&mut text)
            .map_err(read_err(&packed))?;
        if !text.is_empty() && text.last() != Some(&b'\n') {
            text.push(b'\n');
        }
    }
    let live_text = std::fs::read(&live).map_err(read_err(&live))?;
    text.extend_from_slice(&live_text);
    let tmp = dir.join(format!("{PACKED_JOURNAL}.tmp"));
    {
        let f = File::create(&tmp).map_err(io(&tmp))?;
        let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::best());
        gz.write_all(&text).map_err(io(&tmp))?;
        let f = gz.finish().map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, &packed).map_err(io(&packed))?;
    // Only now, with every entry safely in the packed file, is the live one removed.
    std::fs::remove_file(&live).map_err(io(&live))?;
    let after = packed.metadata().map_err(read_err(&packed))?.len();
    Ok((text.len() as u64, after))
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
