//! What the tests that run real workers in Triton's interpreter share: the
//! Python they run (TUNELAB_TEST_PYTHON, which `just test` sets; without it
//! a test says so and passes vacuously, so `cargo test` works on a bare
//! machine), the command that runs tunelab in the interpreter against a
//! results folder, and how a failed command is shown.

use std::path::Path;
use std::process::{Command, Output};

/// The workers' Python, or None (then the caller skips, saying so once).
pub fn python() -> Option<String> {
    match std::env::var("TUNELAB_TEST_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            eprintln!("TUNELAB_TEST_PYTHON is not set: skipping (run `just test`)");
            None
        }
    }
}

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `tunelab ARGS --results-dir RESULTS --python PYTHON --interpret --quiet`
/// from the repository root, with the fixture problems importable.
pub fn tunelab(python: &str, results: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunelab"));
    cmd.current_dir(repo())
        .args(args)
        .arg("--results-dir")
        .arg(results)
        .args(["--python", python, "--interpret", "--quiet"])
        .env("PYTHONPATH", repo().join("tests/fixtures/problems"));
    cmd
}

/// A command's status and output, for an assertion's message.
pub fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
