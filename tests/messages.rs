//! What the commands tell the user in front of them: `plan` plans what
//! `run` would run here (or says on its first line that it does not), a
//! missing results folder is named as missing, `doctor` ends with a verdict
//! whatever it found. (`--help`'s exit codes: `cli::args`'s unit test.)

use std::path::Path;
use std::process::{Command, Output};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The binary as a user without a GPU runs it: no GPU visible, no device
/// profile chosen by a variable.
fn tunelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(repo())
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("HIP_VISIBLE_DEVICES", "")
        .env_remove("TUNELAB_DEVICE_PROFILE")
        .env_remove("TUNELAB_INTERPRET")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn planned_jobs(out: &Output) -> u64 {
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "plan --json prints JSON ({e}): {}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    summary["jobs"].as_u64().expect("a job count")
}

#[test]
fn plan_without_a_gpu_plans_what_run_runs_and_says_so_first() {
    let default = tunelab(&["plan", "experiments/gptoss.yaml", "--json"]);
    assert!(default.status.success(), "{}", text(&default.stderr));
    let note = text(&default.stderr);
    assert!(
        note.lines()
            .next()
            .is_some_and(|l| l.starts_with("note: no GPU found here")
                && l.contains("`tunelab plan --device h100`")),
        "the first line says what the plan is for: {note}"
    );
    let interpreter = tunelab(&["plan", "experiments/gptoss.yaml", "--json", "--interpret"]);
    assert!(
        interpreter.status.success(),
        "{}",
        text(&interpreter.stderr)
    );
    assert!(
        text(&interpreter.stderr).is_empty(),
        "asked for the interpreter: nothing to warn of"
    );
    assert_eq!(planned_jobs(&default), planned_jobs(&interpreter));

    // A device profile asked for: its plan, and the first line says it is
    // not what `run` would run here.
    let h100 = tunelab(&[
        "plan",
        "experiments/gptoss.yaml",
        "--json",
        "--device",
        "h100",
    ]);
    assert!(h100.status.success(), "{}", text(&h100.stderr));
    let note = text(&h100.stderr);
    assert!(
        note.lines().next().is_some_and(|l| l.starts_with(
            "note: this plan is for a NVIDIA H100 80GB HBM3 (device profile `h100`); `tunelab run` would run in Triton's interpreter"
        )),
        "{note}"
    );
    assert!(
        planned_jobs(&h100) > 50 * planned_jobs(&default),
        "the GPU's shapes, not the interpreter's"
    );

    // The text summary names the device it planned for.
    let shown = tunelab(&["plan", "experiments/quickstart.yaml"]);
    assert!(shown.status.success());
    assert!(
        text(&shown.stdout)
            .lines()
            .next()
            .is_some_and(|l| l.contains("device cpu")),
        "{}",
        text(&shown.stdout)
    );
}

#[test]
fn a_missing_results_folder_is_named_as_missing() {
    let out = tunelab(&["report", "/nonexistent/results/dir"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: no such folder: /nonexistent/results/dir"),
        "{err}"
    );
    let empty = tempfile::tempdir().unwrap();
    let out = tunelab(&["report", empty.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no journal in"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
    let file = empty.path().join("journal.txt");
    std::fs::write(&file, "").unwrap();
    let out = tunelab(&["pack", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("is a file, not a results folder"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn doctor_ends_with_a_verdict_even_without_torch() {
    // A Python that sees neither torch, Triton nor tunelab's package: its
    // isolated mode, without site-packages.
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("python");
    std::fs::write(&python, "#!/bin/sh\nexec python3 -I -S \"$@\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(dir.path())
        .args(["doctor", "--python", python.to_str().unwrap()])
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{stdout}");
    assert!(
        stdout.contains("torch     missing")
            && stdout.contains("mode      not known until torch imports"),
        "{stdout}"
    );
    let last = stdout.lines().last().unwrap_or("");
    assert!(
        last.starts_with("verdict     not ready: 3 problems above; fix them"),
        "the last line is the verdict: {stdout}"
    );
}
