//! Settings layering: defaults < tunelab.toml < TUNELAB_* < flags, and `tunelab config` names each origin.

use std::process::Command;

#[test]
fn each_layer_overrides_the_one_below_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tunelab.toml"),
        "python = \"/opt/py/bin/python3\"\ndevice_profile = \"h100\"\ncompile_workers = 2\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(dir.path())
        .args(["config", "--device", "h200"])
        .env("TUNELAB_COMPILE_WORKERS", "6")
        .env_remove("TUNELAB_PYTHON")
        .env_remove("TUNELAB_RESULTS_DIR")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("{key} in:\n{text}"))
            .to_string()
    };
    assert!(
        line("python").contains("/opt/py/bin/python3") && line("python").contains("tunelab.toml"),
        "{text}"
    );
    assert!(
        line("compile_workers").contains("= 6")
            && line("compile_workers").contains("TUNELAB_COMPILE_WORKERS"),
        "{text}"
    );
    assert!(
        line("device_profile").contains("h200")
            && line("device_profile").contains("command-line flag"),
        "{text}"
    );
    assert!(line("results_dir").contains("built-in default"), "{text}");
    assert!(
        line("compile_priority").contains("idle")
            && line("compile_priority").contains("built-in default"),
        "{text}"
    );
}

#[test]
fn compile_priority_is_idle_or_normal() {
    let dir = tempfile::tempdir().unwrap();
    let config = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_tunelab"))
            .current_dir(dir.path())
            .arg("config")
            .env("TUNELAB_COMPILE_PRIORITY", value)
            .output()
            .unwrap()
    };
    let out = config("normal");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines().any(|l| l.starts_with("compile_priority")
            && l.contains("normal")
            && l.contains("TUNELAB_COMPILE_PRIORITY")),
        "{text}"
    );
    let out = config("low");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("COMPILE_PRIORITY") && err.contains("`idle` or `normal`"),
        "{err}"
    );
}

#[test]
fn a_bad_settings_file_is_an_input_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tunelab.toml"),
        "compile_workers = \"many\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(dir.path())
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("compile_workers"));
}
