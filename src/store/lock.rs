//! Claiming a results directory: one run (or `pack`, or `merge`) at a time.
//!
//! A run claims its results directory before it does anything else: it
//! makes the folders it lacks, then creates `.lock` exclusively, locks it
//! (`flock`, held until the claim ends, and by the kernel no longer than
//! the process lives) and writes its process id and start time. A second
//! run that finds the lock held by a live tunelab exits (exit 4) naming it,
//! having created and touched nothing. A lock whose process is gone, or
//! whose process id now belongs to another program (the start time
//! differs), is stale and taken over: by one claimant only, the one that
//! holds its `flock` while it removes it. (Without the `flock`, two runs
//! started at once both ran one time in six: one read the other's lock
//! before its process id was in it, took it for stale and removed it.)
//!
//! A claim that is dropped before the run starts (bad input found late, a
//! worker that does not start) removes what it made: the lock, the `logs/`
//! and `.cache/` folders if this claim saw them appear, and the folders it
//! created if they are empty. It removes nothing it did not create, and
//! nothing another run wrote.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::journal::{StoreError, JOURNAL, PACKED_JOURNAL};
use super::results_dir::{self, WriteError};

pub(crate) const LOCK: &str = ".lock";

/// Folders a run's start fills that the claim removes again if the run
/// never starts and they were not there before.
const START_FOLDERS: [&str; 2] = ["logs", ".cache"];

/// What a run writes into by name, its workers and compilers too (logs,
/// the Triton, native and AOT caches, which Triton and the compilers write
/// with plain opens): none of it may lead out of the directory.
pub(crate) const WRITTEN_BY_NAME: [&str; 7] = [
    "logs",
    ".cache",
    ".cache/triton",
    ".cache/native",
    ".cache/aot",
    JOURNAL,
    PACKED_JOURNAL,
];

/// A results directory with its lock held.
pub struct Claim {
    dir: PathBuf,
    lock: PathBuf,
    /// Folders this claim created, outermost first.
    created: Vec<PathBuf>,
    /// Which of [`START_FOLDERS`] existed when the claim was taken.
    had: [bool; 2],
    /// The run started: on drop, only the lock goes.
    kept: bool,
    /// The lock, open and `flock`ed: closed (and so unlocked) after it is
    /// removed, when the claim drops.
    _held: File,
}

impl Claim {
    /// Makes `dir` (and any missing folder above it) and takes its lock.
    pub fn take(dir: &Path) -> Result<Claim, StoreError> {
        let created: Vec<PathBuf> = {
            let mut missing: Vec<PathBuf> = dir
                .ancestors()
                .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
                .map(Path::to_path_buf)
                .collect();
            missing.reverse();
            missing
        };
        let mut made = Vec::new();
        for folder in &created {
            match std::fs::create_dir(folder) {
                Ok(()) => made.push(folder.clone()),
                // Another process made it first: it is not ours to remove.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    remove_empty(&made);
                    return Err(StoreError::Io {
                        path: folder.clone(),
                        source: e,
                    });
                }
            }
        }
        let had = START_FOLDERS.map(|f| std::fs::symlink_metadata(dir.join(f)).is_ok());
        let lock = dir.join(LOCK);
        let held = match acquire(&lock, dir) {
            Ok(held) => held,
            Err(e) => {
                remove_empty(&made);
                return Err(e);
            }
        };
        let claim = Claim {
            dir: dir.to_path_buf(),
            lock,
            created: made,
            had,
            kept: false,
            _held: held,
        };
        for name in WRITTEN_BY_NAME {
            results_dir::refuse_link(&dir.join(name))?;
        }
        Ok(claim)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The run started: what it created stays.
    pub fn keep(&mut self) {
        self.kept = true;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.kept {
            for (folder, had) in START_FOLDERS.iter().zip(self.had) {
                let path = self.dir.join(folder);
                let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
                if !had && is_dir {
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
        let _ = std::fs::remove_file(&self.lock);
        if !self.kept {
            remove_empty(&self.created);
        }
    }
}

/// Removes the folders (outermost first) that are empty, deepest first.
fn remove_empty(folders: &[PathBuf]) {
    for folder in folders.iter().rev() {
        // Fails on a folder that holds anything: then it is not only ours.
        let _ = std::fs::remove_dir(folder);
    }
}

/// Attempts at taking a lock that another claimant is creating or taking
/// over at the same moment, [`WAIT`] apart.
const ATTEMPTS: usize = 40;
const WAIT: Duration = Duration::from_millis(25);

/// Takes `lock` by creating it exclusively; a stale one is taken over.
/// Returns the lock, open and `flock`ed.
pub(crate) fn acquire(lock: &Path, dir: &Path) -> Result<File, StoreError> {
    let locked = |pid| StoreError::Locked {
        pid,
        dir: dir.to_path_buf(),
    };
    for _ in 0..ATTEMPTS {
        match results_dir::create_new(lock) {
            Ok(mut f) => {
                // Locked before anything is in it: a claimant that looked in
                // between (and found it empty, so stale) may have removed it,
                // so it must still be the file named `lock`.
                flock(&f, true).map_err(|e| io_error(lock, e))?;
                if !names(lock, &f) {
                    continue;
                }
                let _ = write!(f, "{}", Holder::me().to_line());
                let _ = f.sync_all();
                return Ok(f);
            }
            Err(WriteError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
        results_dir::refuse_link(lock)?;
        let mut file = match File::open(lock) {
            Ok(f) => f,
            // Removed since: try again.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(lock, e)),
        };
        let lock_state = flock(&file, false).map_err(|e| io_error(lock, e))?;
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        let holder = Holder::parse(&text);
        if let Some(holder) = holder.filter(Holder::is_live_tunelab) {
            // Held, or written by a tunelab that does not `flock`.
            return Err(locked(holder.pid));
        }
        match lock_state {
            // Another claimant holds it, and its process id is not (yet)
            // in it: it is being created, or being taken over.
            Flock::Held => std::thread::sleep(WAIT),
            // The run that held it is gone (or never wrote it whole): stale.
            // Only the holder of its `flock` removes it, and only while it
            // is the file named `lock`.
            Flock::Got if names(lock, &file) => {
                let _ = std::fs::remove_file(lock);
            }
            Flock::Got => {}
            // A filesystem without `flock`: its process id alone decides.
            Flock::Unsupported => {
                let _ = std::fs::remove_file(lock);
            }
        }
    }
    Err(locked(holder_pid(lock)))
}

fn io_error(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The process id in `lock`, or 0.
fn holder_pid(lock: &Path) -> u32 {
    std::fs::read_to_string(lock)
        .ok()
        .and_then(|s| Holder::parse(&s))
        .map_or(0, |h| h.pid)
}

/// Whether `path` names the file `file` has open.
fn names(path: &Path, file: &File) -> bool {
    match (std::fs::symlink_metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

enum Flock {
    Got,
    /// Another open of the file holds it.
    Held,
    /// The filesystem has no `flock`.
    Unsupported,
}

/// An exclusive `flock` on `file`, waited for or not.
fn flock(file: &File, wait: bool) -> std::io::Result<Flock> {
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: flock on a descriptor `file` owns and keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(Flock::Got);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(Flock::Held),
            Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => {
                return Ok(Flock::Unsupported)
            }
            _ => return Err(e),
        }
    }
}

/// Who holds a lock: a process id and, where the system tells, when that
/// process started (clock ticks since boot), which a reused id does not share.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Holder {
    pid: u32,
    started: Option<u64>,
}

impl Holder {
    fn me() -> Holder {
        let pid = std::process::id();
        Holder {
            pid,
            started: start_time(pid),
        }
    }

    fn to_line(self) -> String {
        match self.started {
            Some(t) => format!("{} {t}\n", self.pid),
            None => format!("{}\n", self.pid),
        }
    }

    /// `pid` or `pid start`; older runs wrote the process id alone.
    fn parse(text: &str) -> Option<Holder> {
        let mut words = text.split_whitespace();
        let pid = words.next()?.parse().ok()?;
        let started = words.next().and_then(|w| w.parse().ok());
        Some(Holder { pid, started })
    }

    /// The process is alive and is the one that wrote the lock: its start
    /// time matches, or (a lock without one) its command line names tunelab.
    fn is_live_tunelab(&self) -> bool {
        if self.pid == 0 || !alive(self.pid) {
            return false;
        }
        match (self.started, start_time(self.pid)) {
            (Some(written), Some(now)) => written == now,
            (None, _) => std::fs::read(format!("/proc/{}/cmdline", self.pid))
                .map_or(true, |cmd| cmd.windows(7).any(|w| w == b"tunelab")),
            // No /proc to ask: the process id is all there is.
            (Some(_), None) => true,
        }
    }
}

fn alive(pid: u32) -> bool {
    // A larger number is no process id (and as a pid_t would name a group).
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat`,
/// field 22), where Linux tells.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 on; the start time is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_a_failed_start_created_is_removed() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("exp/device");
        {
            let _claim = Claim::take(&dir).unwrap();
            std::fs::create_dir_all(dir.join("logs")).unwrap();
            std::fs::write(dir.join("logs/lane0.log"), "x").unwrap();
        }
        assert!(
            !base.path().join("exp").exists(),
            "a failed start leaves nothing"
        );

        std::fs::create_dir_all(dir.join("logs")).unwrap();
        std::fs::write(dir.join("journal.jsonl"), "kept\n").unwrap();
        std::fs::write(dir.join("logs/old.log"), "kept\n").unwrap();
        {
            let _claim = Claim::take(&dir).unwrap();
            std::fs::create_dir_all(dir.join(".cache/triton")).unwrap();
        }
        assert!(dir.join("journal.jsonl").exists(), "results stay");
        assert!(dir.join("logs/old.log").exists(), "folders it found stay");
        assert!(!dir.join(".cache").exists(), "folders it made go");
        assert!(!dir.join(LOCK).exists());

        {
            let mut claim = Claim::take(&base.path().join("other/device")).unwrap();
            std::fs::create_dir_all(base.path().join("other/device/logs")).unwrap();
            claim.keep();
        }
        assert!(base.path().join("other/device/logs").exists());
        assert!(!base.path().join("other/device").join(LOCK).exists());
    }

    #[test]
    fn a_second_claim_fails_and_removes_nothing_of_the_first() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("exp/device");
        let first = Claim::take(&dir).unwrap();
        std::fs::write(dir.join("journal.jsonl"), "first run's jobs\n").unwrap();
        match Claim::take(&dir) {
            Err(StoreError::Locked { pid, .. }) => assert_eq!(pid, std::process::id()),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("two claims on one directory"),
        }
        assert!(dir.join("journal.jsonl").exists());
        assert!(dir.join(LOCK).exists(), "the first claim still holds");
        drop(first);
        assert!(dir.join("journal.jsonl").exists());
    }

    #[test]
    fn a_lock_whose_process_id_was_reused_is_stale() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path();
        // This process is alive, but started at another time than written.
        let me = Holder::me();
        let other = Holder {
            pid: me.pid,
            started: me.started.map(|t| t + 1),
        };
        if me.started.is_some() {
            std::fs::write(dir.join(LOCK), other.to_line()).unwrap();
            let claim = Claim::take(dir).expect("a reused process id is not a holder");
            drop(claim);
        }
        // A process that is gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        std::fs::write(dir.join(LOCK), format!("{} 1\n", child.id())).unwrap();
        Claim::take(dir).expect("a dead holder is stale");
        // An old lock of a live process that is not tunelab (pid 1, init).
        std::fs::write(dir.join(LOCK), "1\n").unwrap();
        if std::fs::read("/proc/1/cmdline").is_ok_and(|c| !c.windows(7).any(|w| w == b"tunelab")) {
            Claim::take(dir).expect("init holds no results directory");
        }
    }

    #[test]
    fn of_two_claims_at_once_exactly_one_holds_the_lock() {
        // Two claimants at the same moment, on a fresh directory and over a
        // stale lock. Before the `flock`, both held it in 331 and 72 of
        // 2,000 such rounds: one read the other's lock before its process
        // id was in it (or both judged one stale lock) and removed it.
        use std::sync::{Arc, Barrier};
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join(LOCK);
        for round in 0..200 {
            if round % 2 == 1 {
                std::fs::write(&lock, "999999999 1\n").unwrap();
            }
            let barrier = Arc::new(Barrier::new(2));
            let claimants: Vec<_> = (0..2)
                .map(|_| {
                    let (barrier, lock) = (barrier.clone(), lock.clone());
                    let dir = dir.path().to_path_buf();
                    std::thread::spawn(move || {
                        barrier.wait();
                        acquire(&lock, &dir).ok()
                    })
                })
                .collect();
            let held: Vec<Option<File>> =
                claimants.into_iter().map(|c| c.join().unwrap()).collect();
            assert_eq!(
                held.iter().filter(|h| h.is_some()).count(),
                1,
                "round {round}"
            );
            std::fs::remove_file(&lock).unwrap();
        }
    }

    #[test]
    fn a_live_holder_is_named() {
        let base = tempfile::tempdir().unwrap();
        std::fs::write(base.path().join(LOCK), Holder::me().to_line()).unwrap();
        let err = Claim::take(base.path()).err().expect("held");
        assert!(err.to_string().contains(&std::process::id().to_string()));
    }
}
