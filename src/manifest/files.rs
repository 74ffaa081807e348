//! Files a manifest reads (`extends`, `include`, `shapes.csv`, a method's
//! `source` and `ir`, `python_path`) and where they may be.
//!
//! A manifest is code someone else may have written: checked into a
//! repository, sent in a pull request. What it names is read by the runner
//! and quoted in its errors, so it may only name files inside the repository
//! that holds it (the nearest folder above it with a `.git`), or inside its
//! own folder when it is in no repository, unless the person running
//! tunelab allows more (`--allow-read DIR`, or `allow_read` in
//! `tunelab.toml`). Every read is of a regular file of bounded size, so a
//! FIFO, a device or a huge file cannot stall or exhaust the runner.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::de::Spanned;
use crate::diag::{Diagnostic, Span};

/// Where a manifest's relative paths start, and where they may lead.
pub struct Files<'a> {
    /// The manifest's folder.
    pub base_dir: &'a Path,
    pub access: &'a Access,
}

impl Files<'_> {
    /// The path `named` (relative to the manifest) under `key`, once
    /// [`Access`] allows it.
    pub fn resolve(&self, named: &Spanned<String>, key: &str) -> Result<PathBuf, Diagnostic> {
        let path = self.base_dir.join(named.as_str());
        self.access.check(&path, named.span, key)?;
        Ok(path)
    }

    /// Reads the file `named` under `key` (at most `limit` bytes; `what`
    /// names it in errors, which point at the name in the manifest).
    pub fn read(
        &self,
        named: &Spanned<String>,
        key: &str,
        what: &str,
        limit: u64,
    ) -> Result<(PathBuf, Vec<u8>), Diagnostic> {
        let path = self.resolve(named, key)?;
        let bytes = read_bounded(&path, limit, what).map_err(|mut d| {
            d.span = Some(named.span);
            d.path = None;
            d.help = Some(
                d.help
                    .unwrap_or_else(|| "paths are relative to the manifest".into()),
            );
            d
        })?;
        Ok((path, bytes))
    }
}

/// The folders a manifest's files may be in.
#[derive(Debug, Clone)]
pub struct Access {
    roots: Vec<PathBuf>,
}

impl Access {
    /// The manifest's repository (or its folder), and `allowed` besides.
    /// Folders that do not exist are left out: they hold nothing to read.
    pub fn for_manifest(manifest: &Path, allowed: &[PathBuf]) -> Access {
        let mut roots = vec![repository_of(manifest)];
        roots.extend(allowed.iter().filter_map(|p| p.canonicalize().ok()));
        Access { roots }
    }

    /// Whether `path` (resolved, symbolic links followed) lies in an allowed
    /// folder. A path that does not resolve is let through: the caller's own
    /// "not found" error says more than this one would.
    pub fn check(&self, path: &Path, span: Span, key: &str) -> Result<(), Diagnostic> {
        let Ok(resolved) = path.canonicalize() else {
            return Ok(());
        };
        if self.roots.iter().any(|root| resolved.starts_with(root)) {
            return Ok(());
        }
        Err(Diagnostic::at(
            span,
            format!(
                "`{key}` names {}, which is outside {}",
                resolved.display(),
                self.roots[0].display()
            ),
        )
        .help(
            "a manifest reads files only inside the repository that holds it (or its own folder); \
             to allow another folder, pass --allow-read DIR or add it to `allow_read` in tunelab.toml",
        ))
    }
}

/// The folder a manifest's files may be in unallowed: the repository that
/// holds it (the nearest folder above it with a `.git`), or its own folder
/// when it is in no repository; links resolved.
pub fn repository_of(manifest: &Path) -> PathBuf {
    let dir = manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    dir.ancestors()
        .find(|p| p.join(".git").exists())
        .unwrap_or(&dir)
        .to_path_buf()
}

/// Reads a regular file of at most `limit` bytes. `what` names it in errors,
/// which give the path and the problem, never the file's contents.
pub fn read_bounded(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>, Diagnostic> {
    let cannot = |e: std::io::Error| {
        Diagnostic::in_file(path, format!("cannot read {what} {}: {e}", path.display()))
    };
    let meta = std::fs::metadata(path).map_err(cannot)?;
    if !meta.is_file() {
        return Err(Diagnostic::in_file(
            path,
            format!("{what} {} is not a regular file", path.display()),
        )
        .help("name a file, not a folder, a device or a pipe"));
    }
    let too_big = |size: u64| {
        Diagnostic::in_file(
            path,
            format!(
                "{what} {} has {size} bytes, more than the {limit} a {what} may have",
                path.display()
            ),
        )
    };
    if meta.len() > limit {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)
        .map_err(cannot)?
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    // It grew while being read.
    if bytes.len() as u64 > limit {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span() -> Span {
        Span::default()
    }

    #[test]
    fn files_outside_the_repository_are_refused_and_named() {
        let base = tempfile::tempdir().unwrap();
        let repo = base.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(repo.join("experiments/shapes")).unwrap();
        std::fs::write(repo.join("experiments/shapes/a.yaml"), "a: 1\n").unwrap();
        std::fs::write(base.path().join("secret.yaml"), "s: 1\n").unwrap();
        let access = Access::for_manifest(&repo.join("experiments/m.yaml"), &[]);

        access
            .check(&repo.join("experiments/shapes/a.yaml"), span(), "include")
            .unwrap();
        // `..` that stays in the repository is fine.
        access
            .check(
                &repo.join("experiments/../experiments/shapes/a.yaml"),
                span(),
                "include",
            )
            .unwrap();
        let err = access
            .check(&repo.join("../secret.yaml"), span(), "include")
            .unwrap_err();
        assert!(err.message.contains("secret.yaml"), "{}", err.message);
        assert!(err.message.contains("outside"), "{}", err.message);
        assert!(err.help.unwrap().contains("--allow-read"));
        access
            .check(Path::new("/proc/self/environ"), span(), "include")
            .unwrap_err();

        let allowed = Access::for_manifest(&repo.join("experiments/m.yaml"), &[base.path().into()]);
        allowed
            .check(&base.path().join("secret.yaml"), span(), "include")
            .unwrap();
    }

    #[test]
    fn a_symlink_out_of_the_repository_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let repo = base.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::write(base.path().join("outside.yaml"), "s: 1\n").unwrap();
        std::os::unix::fs::symlink(base.path().join("outside.yaml"), repo.join("in.yaml")).unwrap();
        // No .git: the manifest's own folder is the root.
        let access = Access::for_manifest(&repo.join("m.yaml"), &[]);
        access
            .check(&repo.join("in.yaml"), span(), "include")
            .unwrap_err();
    }

    #[test]
    fn reads_are_bounded_and_of_regular_files_only() {
        let base = tempfile::tempdir().unwrap();
        let big = base.path().join("big.yaml");
        std::fs::write(&big, vec![b'a'; 100]).unwrap();
        assert_eq!(read_bounded(&big, 100, "manifest file").unwrap().len(), 100);
        let err = read_bounded(&big, 99, "manifest file").unwrap_err();
        assert!(err.message.contains("100 bytes"), "{}", err.message);
        assert!(!err.message.contains("aaaa"));
        let err = read_bounded(base.path(), 99, "manifest file").unwrap_err();
        assert!(
            err.message.contains("not a regular file"),
            "{}",
            err.message
        );
        let err = read_bounded(Path::new("/dev/zero"), 99, "manifest file").unwrap_err();
        assert!(
            err.message.contains("not a regular file"),
            "{}",
            err.message
        );
    }
}
