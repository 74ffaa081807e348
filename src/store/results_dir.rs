//! Writing inside a results directory without following symbolic links.
//!
//! A results directory is shared: several runs, `report`, `pack`, a person
//! with an editor. A link placed inside it (`vllm -> /etc`, `journal.jsonl ->
//! ~/notes`) would let a run or a command write, append to or truncate a file
//! outside it. So every folder and file the runner makes in it is made one
//! component at a time, refusing any that is a link, and files are written
//! to a name created afresh (`O_CREAT | O_EXCL`, which never follows a link)
//! and renamed into place. The results directory itself may be a link
//! (`results -> /scratch/results`): only what lies inside it is checked.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{} is a symbolic link: tunelab writes nothing through a link inside a results directory; replace it with a real folder or file", path.display())]
    Link { path: PathBuf },
    #[error("{} has {links} hard links: tunelab appends to the journal and repairs it in place, which would change every other name of that file (a copy made with `ln` or `cp -l`); give it a file of its own (cp it to a new name and move that over it)", path.display())]
    HardLinked { path: PathBuf, links: u64 },
    #[error("cannot write {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WriteError + '_ {
    move |source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Why `path`, a file a person named for a command to write (`--trace`,
/// `--out`), must not be written: it is named as a results directory's
/// journal or lock are (itself, or the file a link there points at), and
/// writing it would replace recorded results. `None`: it may be written.
pub fn runner_file(path: &Path) -> Option<String> {
    let resolved = std::fs::canonicalize(path).ok();
    for p in std::iter::once(path).chain(resolved.as_deref()) {
        let name = p.file_name()?.to_string_lossy();
        if name.starts_with(super::journal::JOURNAL) || name == super::lock::LOCK {
            return Some(format!(
                "{} is named as a results directory's journal or lock are (`journal.jsonl...`, `.lock`): writing it would replace recorded results; name another file",
                p.display()
            ));
        }
    }
    None
}

/// Refuses `path` if it is a symbolic link; fine if it does not exist.
pub fn refuse_link(path: &Path) -> Result<(), WriteError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(WriteError::Link {
            path: path.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

/// Creates the folder `rel` (relative, inside `dir`) and any folder above
/// it, refusing links on the way; returns its path.
pub fn create_dirs(dir: &Path, rel: &Path) -> Result<PathBuf, WriteError> {
    let mut path = dir.to_path_buf();
    for part in rel.components() {
        match part {
            Component::Normal(name) => path.push(name),
            Component::CurDir => continue,
            // Callers pass paths checked to stay inside `dir`.
            _ => {
                return Err(WriteError::Io {
                    path: dir.join(rel),
                    source: std::io::Error::other("the path leaves the results directory"),
                })
            }
        }
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => return Err(WriteError::Link { path }),
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(WriteError::Io {
                    source: std::io::Error::other("a file stands where a folder is needed"),
                    path,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match std::fs::create_dir(&path) {
                    Ok(()) => {}
                    // Another writer made it in between: check it again.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => refuse_link(&path)?,
                    Err(e) => return Err(io(&path)(e)),
                }
            }
            Err(e) => return Err(io(&path)(e)),
        }
    }
    Ok(path)
}

/// Makes the folder `rel` inside `dir` afresh and empty: what was there
/// goes (a link there is removed, not followed). The folders above it are
/// made or checked first, as [`create_dirs`] does, so the removal never
/// reaches through a link to a folder outside `dir`.
pub fn replace_dir(dir: &Path, rel: &Path) -> Result<PathBuf, WriteError> {
    let parent = create_dirs(dir, rel.parent().unwrap_or(Path::new("")))?;
    let name = rel.file_name().ok_or_else(|| WriteError::Io {
        path: dir.join(rel),
        source: std::io::Error::other("the path names no folder"),
    })?;
    let path = parent.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path).map_err(io(&path))?,
        Ok(_) => std::fs::remove_file(&path).map_err(io(&path))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&path)(e)),
    }
    create_dirs(&parent, Path::new(name))
}

/// Opens a file that did not exist, for writing; never follows a link.
pub fn create_new(path: &Path) -> Result<File, WriteError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match refuse_link(path) {
            Err(link) => link,
            Ok(()) => io(path)(e),
        })
}

/// Writes `bytes` to `rel` inside `dir`: to `<rel>.tmp`, synced, then
/// renamed over `rel`, so readers never see half a file. A leftover
/// `.tmp` from a run that died is replaced; a link at either name is refused.
pub fn write_file(dir: &Path, rel: &Path, bytes: &[u8]) -> Result<PathBuf, WriteError> {
    let parent = create_dirs(dir, rel.parent().unwrap_or(Path::new("")))?;
    let name = rel.file_name().ok_or_else(|| WriteError::Io {
        path: dir.join(rel),
        source: std::io::Error::other("the path names no file"),
    })?;
    let path = parent.join(name);
    let mut tmp_name = name.to_owned();
    tmp_name.push(".tmp");
    let tmp = parent.join(tmp_name);
    refuse_link(&path)?;
    refuse_link(&tmp)?;
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&tmp)(e)),
    }
    let mut f = create_new(&tmp)?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn files_are_written_in_place_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_file(dir.path(), Path::new("vllm/a.json"), b"one").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        // A leftover temporary file of a run that died is no obstacle.
        std::fs::write(dir.path().join("vllm/a.json.tmp"), "stale").unwrap();
        write_file(dir.path(), Path::new("vllm/a.json"), b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!dir.path().join("vllm/a.json.tmp").exists());
    }

    #[test]
    fn links_inside_the_results_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim"), "keep").unwrap();

        // A linked folder.
        symlink(outside.path(), dir.path().join("vllm")).unwrap();
        let err = write_file(dir.path(), Path::new("vllm/a.json"), b"x").unwrap_err();
        assert!(matches!(err, WriteError::Link { .. }), "{err}");
        assert!(!outside.path().join("a.json").exists());

        // A linked file, and a linked temporary name.
        symlink(outside.path().join("victim"), dir.path().join("report.md")).unwrap();
        let err = write_file(dir.path(), Path::new("report.md"), b"x").unwrap_err();
        assert!(matches!(err, WriteError::Link { .. }), "{err}");
        symlink(
            outside.path().join("victim"),
            dir.path().join("best.csv.tmp"),
        )
        .unwrap();
        let err = write_file(dir.path(), Path::new("best.csv"), b"x").unwrap_err();
        assert!(matches!(err, WriteError::Link { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(outside.path().join("victim")).unwrap(),
            "keep"
        );
        assert!(err.to_string().contains("best.csv.tmp"));
    }

    #[test]
    fn a_folder_made_afresh_removes_nothing_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outside.path().join("triton")).unwrap();
        std::fs::write(outside.path().join("triton/precious"), "keep").unwrap();

        // What an earlier winner left goes.
        std::fs::create_dir_all(dir.path().join("ir/M=1/triton")).unwrap();
        std::fs::write(dir.path().join("ir/M=1/triton/old.ttir"), "old").unwrap();
        let made = replace_dir(dir.path(), Path::new("ir/M=1/triton")).unwrap();
        assert_eq!(std::fs::read_dir(&made).unwrap().count(), 0);

        // A shape's folder that is a link to a folder holding `triton/`:
        // refused, and what lies behind it stays.
        symlink(outside.path(), dir.path().join("ir/M=2")).unwrap();
        let err = replace_dir(dir.path(), Path::new("ir/M=2/triton")).unwrap_err();
        assert!(matches!(err, WriteError::Link { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(outside.path().join("triton/precious")).unwrap(),
            "keep"
        );

        // The folder itself a link: the link goes, not what it points at.
        symlink(
            outside.path().join("triton"),
            dir.path().join("ir/M=1/cuda"),
        )
        .unwrap();
        let made = replace_dir(dir.path(), Path::new("ir/M=1/cuda")).unwrap();
        assert!(!made.is_symlink() && made.is_dir());
        assert!(outside.path().join("triton/precious").exists());
    }

    #[test]
    fn a_file_named_for_a_command_may_not_be_a_journal_or_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("journal.jsonl");
        std::fs::write(&journal, "{}\n").unwrap();
        assert!(runner_file(&journal).is_some());
        assert!(runner_file(&dir.path().join("journal.jsonl.gz")).is_some());
        assert!(runner_file(&dir.path().join(".lock")).is_some());
        // Through a link whose own name says nothing.
        symlink(&journal, dir.path().join("trace.json")).unwrap();
        let why = runner_file(&dir.path().join("trace.json")).unwrap();
        assert!(why.contains("journal.jsonl"), "{why}");
        assert_eq!(runner_file(&dir.path().join("run.trace.json")), None);
        assert_eq!(runner_file(Path::new("trace.json")), None);
    }

    #[test]
    fn the_results_directory_itself_may_be_a_link() {
        let real = tempfile::tempdir().unwrap();
        let base = tempfile::tempdir().unwrap();
        symlink(real.path(), base.path().join("results")).unwrap();
        write_file(&base.path().join("results"), Path::new("a/b.md"), b"x").unwrap();
        assert!(real.path().join("a/b.md").is_file());
    }
}
