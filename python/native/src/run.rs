//! The command line in this process, and a run followed from Python.
//!
//! Progress comes from the journal: the run appends each finished job to
//! `journal.jsonl` (synced to disk before the next job starts); this thread
//! reads what was appended every [`POLL`] without the GIL, and calls Python's
//! `on_job` with the GIL for each new job record. That is the same record, in
//! the same form, as `read_journal` returns later.

use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use tunelab::store::{Entry, JOURNAL};

/// How often a followed run's journals are read.
const POLL: Duration = Duration::from_millis(100);

/// `tunelab::cli::main` as `src/main.rs` runs it: the exit code as the
/// process would report it, a panic as 101, stdout flushed.
pub fn cli_in_process(argv: Vec<OsString>) -> i32 {
    let outcome = std::panic::catch_unwind(|| tunelab::cli::main(argv));
    super::flush_stdout();
    match outcome {
        Ok(code) => u8::try_from(code).map_or(1, i32::from),
        // The panic hook has printed the message, as it does in the binary.
        Err(_) => 101,
    }
}

pub fn run_following(
    py: Python<'_>,
    argv: Vec<OsString>,
    dirs: &[PathBuf],
    on_job: Option<Py<PyAny>>,
) -> PyResult<(i32, u64, bool)> {
    if tunelab::schedule::interrupted() {
        // The runner's Ctrl-C flag is process-wide and never cleared.
        return Err(PyRuntimeError::new_err(
            "a tunelab run in this Python process was interrupted (Ctrl-C); another run here would stop at once: start a new Python process to run again",
        ));
    }
    let mut tails: Vec<Tail> = dirs.iter().map(|d| Tail::new(&d.join(JOURNAL))).collect();
    let mut sigint = SigintGuard::install();
    let runner = std::thread::Builder::new()
        .name("tunelab run".into())
        .spawn(move || cli_in_process(argv))
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the run's thread: {e}")))?;
    let mut delivered = 0u64;
    let mut callback_error: Option<PyErr> = None;
    loop {
        let finished = runner.is_finished();
        sigint.forward();
        // After the run's thread ends, one last read finds every record:
        // each is on disk before the run goes on.
        let records = py.detach(|| {
            let mut records = Vec::new();
            for tail in &mut tails {
                tail.read_jobs(&mut records);
            }
            records
        });
        for record in records {
            delivered += 1;
            if let (Some(callback), None) = (&on_job, &callback_error) {
                let result = super::from_json(py, &record)
                    .and_then(|value| callback.call1(py, (value,)).map(drop));
                // The run goes on; the error is raised once it has stopped.
                callback_error = result.err();
            }
        }
        if finished {
            break;
        }
        py.detach(|| std::thread::sleep(POLL));
    }
    let code = runner.join().unwrap_or(101);
    let interrupted = sigint.caught() || tunelab::schedule::interrupted() || code == 130;
    drop(sigint);
    match callback_error {
        Some(e) => Err(e),
        None => Ok((code, delivered, interrupted)),
    }
}

/// New job records appended to one journal file since it was first seen.
struct Tail {
    path: PathBuf,
    /// Bytes already read: always at a line's end.
    offset: u64,
}

impl Tail {
    /// Starts after the last whole line already there: a resumed run's old
    /// records are not new, and a torn last line (which the run cuts off
    /// when it opens the journal) never was a record.
    fn new(path: &Path) -> Tail {
        let offset = std::fs::read(path)
            .ok()
            .and_then(|text| text.iter().rposition(|&b| b == b'\n'))
            .map_or(0, |i| i as u64 + 1);
        Tail {
            path: path.to_path_buf(),
            offset,
        }
    }

    /// Appends the job records (as JSON) of every whole line written since
    /// the last call; a line still being written waits for the next.
    fn read_jobs(&mut self, out: &mut Vec<String>) {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            // Cut by someone else (never by a run): start again from its end.
            self.offset = len;
            return;
        }
        let mut text = Vec::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() || file.read_to_end(&mut text).is_err()
        {
            return;
        }
        let Some(end) = text.iter().rposition(|&b| b == b'\n') else {
            return;
        };
        self.offset += end as u64 + 1;
        for line in text[..end].split(|&b| b == b'\n') {
            let Ok(line) = std::str::from_utf8(line) else {
                continue;
            };
            if let Ok(Entry::Job(record)) = serde_json::from_str::<Entry>(line) {
                out.push(serde_json::to_string(&record).expect("job records serialise"));
            }
        }
    }
}

/// A Ctrl-C that arrives before the runner has put its own SIGINT handler
/// in place (while the manifest loads and the workers start) is noted here
/// instead of raising KeyboardInterrupt in a Python thread that is only
/// waiting, and handed to the runner once its handler is in place: the run
/// then stops as the binary's does, after the job in flight. Dropping the
/// guard restores the handler that was there before (Python's).
struct SigintGuard {
    previous: libc::sigaction,
    forwarded: bool,
}

static PENDING: AtomicBool = AtomicBool::new(false);

extern "C" fn note_sigint(_: libc::c_int) {
    PENDING.store(true, Ordering::SeqCst);
}

fn handler_address() -> libc::sighandler_t {
    note_sigint as *const () as libc::sighandler_t
}

impl SigintGuard {
    fn install() -> SigintGuard {
        PENDING.store(false, Ordering::SeqCst);
        // SAFETY: plain sigaction calls with zeroed, then filled, structs;
        // the handler only stores to an atomic.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler_address();
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = libc::SA_RESTART;
            let mut previous: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGINT, &action, &mut previous);
            SigintGuard {
                previous,
                forwarded: false,
            }
        }
    }

    /// Hands a noted Ctrl-C to the runner once SIGINT is no longer ours.
    fn forward(&mut self) {
        if !PENDING.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: reads the current action only.
        let current = unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGINT, std::ptr::null(), &mut current);
            current.sa_sigaction
        };
        if current != handler_address() {
            PENDING.store(false, Ordering::SeqCst);
            self.forwarded = true;
            // SAFETY: raises SIGINT in this thread, for the runner's handler.
            unsafe {
                libc::raise(libc::SIGINT);
            }
        }
    }

    /// Whether a Ctrl-C reached this guard.
    fn caught(&self) -> bool {
        self.forwarded || PENDING.load(Ordering::SeqCst)
    }
}

impl Drop for SigintGuard {
    fn drop(&mut self) {
        // SAFETY: puts back the action saved by `install`.
        unsafe {
            libc::sigaction(libc::SIGINT, &self.previous, std::ptr::null_mut());
        }
    }
}
