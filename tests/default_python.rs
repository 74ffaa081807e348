//! The standalone binary's default Python, without --python, TUNELAB_PYTHON
//! or a settings file: `.venv/bin/python` in the working directory, then in
//! the checkout the binary was built in, then `python3`; `tunelab config`
//! says which. (The installed entry point's default, the Python tunelab is
//! installed in, is tested in python/tests/api.)

use std::path::Path;
use std::process::Command;

fn config_line(cwd: &Path, envs: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunelab"));
    cmd.current_dir(cwd)
        .arg("config")
        .env_remove("TUNELAB_PYTHON");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .find(|l| l.starts_with("python "))
        .unwrap_or_else(|| panic!("no python line in:\n{text}"))
        .to_string()
}

fn fake_venv(dir: &Path) -> std::path::PathBuf {
    let bin = dir.join(".venv").join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let python = bin.join("python");
    std::fs::write(&python, "").unwrap();
    python
}

#[test]
fn a_venv_in_the_working_directory_is_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let python = fake_venv(dir.path());
    let line = config_line(dir.path(), &[]);
    // As found, symlinks and all: a venv's python only works through its own path.
    let shown = std::path::absolute(dir.path().join(".venv/bin/python")).unwrap();
    assert!(python.is_file());
    assert!(
        line.contains(&format!("= {}", shown.display())),
        "{line} names {}",
        shown.display()
    );
    assert!(
        line.ends_with(&format!("# default: the .venv in {}", dir.path().display())),
        "{line}"
    );
}

#[test]
fn without_a_venv_the_checkouts_then_python3() {
    let dir = tempfile::tempdir().unwrap();
    let line = config_line(dir.path(), &[]);
    // The test binary lives in this checkout's target/: its .venv, when `just setup` made one.
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"));
    if checkout.join(".venv/bin/python").is_file() {
        assert!(line.contains(".venv/bin/python"), "{line}");
        assert!(
            line.ends_with(&format!("# default: the .venv in {}", checkout.display()))
                || line.contains("# default: the .venv in"),
            "{line}"
        );
    } else {
        assert!(line.contains("= python3 "), "{line}");
        assert!(line.ends_with("# default: python3 on PATH"), "{line}");
    }
}

#[test]
fn the_environment_variable_and_the_settings_file_still_win() {
    let dir = tempfile::tempdir().unwrap();
    fake_venv(dir.path());
    std::fs::write(
        dir.path().join("tunelab.toml"),
        "python = \"/from/settings\"\n",
    )
    .unwrap();
    let line = config_line(dir.path(), &[]);
    assert!(
        line.contains("/from/settings") && line.contains("tunelab.toml"),
        "{line}"
    );
    let line = config_line(dir.path(), &[("TUNELAB_PYTHON", "/from/env")]);
    assert!(
        line.contains("/from/env") && line.contains("TUNELAB_PYTHON"),
        "{line}"
    );
}
