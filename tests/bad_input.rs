//! Every kind of bad input gets a short error naming file:line:column and what
//! to change, exit code 2, and nothing written. Messages are snapshot-tested.

use std::path::Path;
use std::process::Command;

fn fixtures() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bad"))
}

/// Runs `tunelab validate FILE` in the fixtures directory; returns stderr.
fn validate_fails(file: &str) -> String {
    let results = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(fixtures())
        .args(["validate", file, "--results-dir"])
        .arg(results.path())
        .env_remove("TUNELAB_PYTHON")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{file}: expected exit code 2, stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "{file}: nothing should be printed on stdout"
    );
    assert_eq!(
        std::fs::read_dir(results.path()).unwrap().count(),
        0,
        "{file}: nothing may be written"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("error: "), "{file}: {stderr}");
    stderr
}

macro_rules! bad_input {
    ($name:ident, $file:expr, $place:expr) => {
        #[test]
        fn $name() {
            let stderr = validate_fails($file);
            assert!(
                stderr.contains($place),
                "{}: expected location {} in:\n{stderr}",
                $file,
                $place
            );
            insta::assert_snapshot!(stringify!($name), stderr);
        }
    };
}

bad_input!(
    yaml_syntax_error,
    "yaml_syntax.yaml",
    "yaml_syntax.yaml:5:1"
);
bad_input!(
    unknown_key_suggests_the_right_one,
    "unknown_key.yaml",
    "unknown_key.yaml:9:5"
);
bad_input!(
    wrong_type_says_what_was_expected,
    "wrong_type.yaml",
    "wrong_type.yaml:8:16"
);
bad_input!(empty_axis, "empty_axis.yaml", "empty_axis.yaml:6:8");
bad_input!(
    constraints_rejecting_everything_are_counted,
    "rejects_all.yaml",
    "rejects_all.yaml:14:7"
);
bad_input!(
    expression_syntax_error,
    "expr_syntax.yaml",
    "expr_syntax.yaml:11:9"
);
bad_input!(
    expression_unknown_variable,
    "expr_unknown_var.yaml",
    "expr_unknown_var.yaml:11:9"
);
bad_input!(include_cycle, "cycle_a.yaml", "cycle_c.yaml:1:10");
bad_input!(
    missing_include_file,
    "missing_include.yaml",
    "missing_include.yaml:4:12"
);
bad_input!(
    missing_csv_file,
    "missing_csv.yaml",
    "missing_csv.yaml:4:15"
);
bad_input!(
    csv_missing_column,
    "csv_missing_column.yaml",
    "csv_missing_column.yaml:6:56"
);
bad_input!(
    csv_non_numeric_value_names_row_and_column,
    "csv_not_numeric.yaml",
    "bad_value.csv:3:9"
);
bad_input!(
    duplicate_method_name,
    "duplicate_method.yaml",
    "duplicate_method.yaml:8:3"
);
bad_input!(
    output_path_escaping_results,
    "output_escape.yaml",
    "output_escape.yaml:8:28"
);
bad_input!(
    unknown_enum_value_suggests,
    "unknown_value.yaml",
    "unknown_value.yaml:7:20"
);

bad_input!(
    missing_companion_manifest,
    "missing_companion.yaml",
    "missing_companion.yaml:8:"
);

/// Independent errors are all reported in one pass, each at its own place.
#[test]
fn independent_errors_are_reported_together() {
    let stderr = validate_fails("several_errors.yaml");
    for place in [
        "several_errors.yaml:11:26",
        "several_errors.yaml:13:19",
        "several_errors.yaml:14:34",
    ] {
        assert!(stderr.contains(place), "expected {place} in:\n{stderr}");
    }
    assert!(stderr.contains("3 errors"), "{stderr}");
    insta::assert_snapshot!("independent_errors_are_reported_together", stderr);
}

/// A worker from another version of tunelab is refused at start-up: exit 4,
/// naming both protocol versions.
#[test]
fn a_worker_speaking_another_protocol_is_refused() {
    let results = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(repo)
        .args([
            "run",
            "experiments/quickstart.yaml",
            "--interpret",
            "--quiet",
        ])
        .arg("--python")
        .arg(repo.join("tests/fixtures/workers/protocol99"))
        .arg("--results-dir")
        .arg(results.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("worker protocol 99") && stderr.contains("protocol 1"),
        "{stderr}"
    );
}

#[test]
fn bad_set_override_is_an_input_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/experiments"))
        .args([
            "validate",
            "quickstart.yaml",
            "--set",
            "protocol.min_samples=lots",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("--set protocol.min_samples=lots:1:1"),
        "{stderr}"
    );
}

#[test]
fn unknown_only_key_is_an_input_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/experiments"))
        .args(["plan", "gptoss.yaml", "--only", "EE=32"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("unknown filter key `EE`") && stderr.contains("did you mean `E`?"),
        "{stderr}"
    );
}
