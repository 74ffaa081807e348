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
    shape_field_list_of_strings,
    "shape_value_list_of_strings.yaml",
    "shape_value_list_of_strings.yaml:5:"
);

bad_input!(
    ir_on_a_torch_method,
    "ir_on_torch.yaml",
    "ir_on_torch.yaml:6:50"
);
bad_input!(missing_ir_file, "ir_missing.yaml", "ir_missing.yaml:9:9");

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
        stderr.contains("worker protocol 99") && stderr.contains("this tunelab speaks protocol"),
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

// ---------------------------------------------------------------------------
// `tunelab run` refuses before its first job, and writes nothing.

/// The Python that has torch and triton, if the test run names one.
fn test_python() -> Option<String> {
    std::env::var("TUNELAB_TEST_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
}

/// Runs `tunelab run ARGS` from the repository root in interpreter mode,
/// expects `code`, and checks that the results directory was never created.
fn run_refused(args: &[&str], python: &str, code: i32) -> String {
    let base = tempfile::tempdir().unwrap();
    let results = base.path().join("results");
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("run")
        .args(args)
        .args([
            "--interpret",
            "--quiet",
            "--python",
            python,
            "--results-dir",
        ])
        .arg(&results)
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}:\n{stderr}");
    assert!(
        !results.exists(),
        "{args:?}: a refused run must leave nothing behind, found {:?}",
        std::fs::read_dir(&results).map(|d| d.count())
    );
    stderr
}

#[test]
fn an_only_filter_matching_nothing_names_what_there_is() {
    // The README's quick run, on a machine without a GPU.
    let stderr = run_refused(
        &["experiments/gptoss.yaml", "--only", "E=32,N=2880"],
        "python3",
        2,
    );
    assert!(
        stderr.contains("`--only E=32,N=2880` leaves no jobs"),
        "{stderr}"
    );
    assert!(stderr.contains("E in {8}, N in {32}"), "{stderr}");
    let stderr = run_refused(
        &["experiments/quickstart.yaml", "--only", "M=7"],
        "python3",
        2,
    );
    assert!(stderr.contains("M in {32, 48}"), "{stderr}");
}

#[test]
fn a_bad_only_key_at_run_writes_nothing() {
    let stderr = run_refused(
        &["experiments/quickstart.yaml", "--only", "MM=32"],
        "python3",
        2,
    );
    assert!(stderr.contains("did you mean `M`?"), "{stderr}");
}

#[test]
fn a_mixed_type_space_value_at_run_is_refused_at_its_place() {
    let stderr = run_refused(
        &[
            "experiments/quickstart.yaml",
            "--set",
            "methods.triton.space.num_warps=[4, \"x\"]",
        ],
        "python3",
        2,
    );
    assert!(stderr.contains("num_warps=[4, \"x\"]:1:5"), "{stderr}");
}

#[test]
fn a_missing_python_path_folder_is_refused_at_its_place() {
    let stderr = run_refused(
        &["tests/fixtures/bad/run/missing_python_path.yaml"],
        "python3",
        2,
    );
    assert!(stderr.contains("missing_python_path.yaml:4:15"), "{stderr}");
    assert!(
        stderr.contains("`python_path` folder `no_such_folder` not found"),
        "{stderr}"
    );
}

#[test]
fn bench_mode_without_baselines_says_what_it_runs() {
    let stderr = run_refused(
        &["tests/fixtures/bad/run/no_baseline.yaml", "--mode", "bench"],
        "python3",
        2,
    );
    assert!(stderr.contains("no method here has one"), "{stderr}");
}

#[test]
fn a_worker_that_cannot_start_is_exit_4_and_writes_nothing() {
    let stderr = run_refused(&["experiments/quickstart.yaml"], "/nonexistent/python3", 4);
    assert!(
        stderr.contains("cannot run `/nonexistent/python3`"),
        "{stderr}"
    );
    assert!(stderr.contains("--python PATH"), "{stderr}");
    let protocol99 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/workers/protocol99"
    );
    let stderr = run_refused(&["experiments/quickstart.yaml"], protocol99, 4);
    assert!(stderr.contains("worker protocol 99"), "{stderr}");
}

#[test]
fn an_unimportable_problem_stops_the_run_at_the_manifest_line() {
    let Some(py) = test_python() else { return };
    let stderr = run_refused(&["tests/fixtures/bad/run/unimportable.yaml"], &py, 2);
    assert!(stderr.contains("unimportable.yaml:3:10"), "{stderr}");
    assert!(
        stderr.contains("No module named 'nonexistent_module_for_tunelab_tests'"),
        "{stderr}"
    );
    assert!(stderr.contains("python_path:"), "{stderr}");
    // `validate` asks a worker too, for a user's problem.
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "validate",
            "tests/fixtures/bad/run/unimportable.yaml",
            "--python",
            &py,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unimportable.yaml:3:10"));
}

#[test]
fn a_problem_found_through_python_path_checks_its_method_names() {
    let Some(py) = test_python() else { return };
    let stderr = run_refused(&["tests/fixtures/bad/run/python_path.yaml"], &py, 2);
    assert!(
        stderr.contains("problem `flaky:Flaky` has no method `okk`")
            && stderr.contains("python_path.yaml:12:13"),
        "{stderr}"
    );
    assert!(stderr.contains("one it has: ok,"), "{stderr}");
}

#[test]
fn a_value_of_the_wrong_declared_type_is_refused_at_its_place() {
    let Some(py) = test_python() else { return };
    let stderr = run_refused(&["tests/fixtures/bad/run/wrong_declared_type.yaml"], &py, 2);
    assert!(
        stderr.contains("wrong_declared_type.yaml:15:22")
            && stderr.contains("`num_warps` of method `triton` must be an integer, found 2.5"),
        "{stderr}"
    );
}

bad_input!(
    native_method_source_missing,
    "native_missing_source.yaml",
    "native_missing_source.yaml:9:13"
);
bad_input!(
    native_grid_expression_unknown_name,
    "native_grid_unknown.yaml",
    "native_grid_unknown.yaml:11:31"
);
bad_input!(
    native_field_on_a_triton_method,
    "native_field_on_triton.yaml",
    "native_field_on_triton.yaml:10:12"
);
bad_input!(
    native_argument_type_unknown,
    "native_needs_args.yaml",
    "native_needs_args.yaml:12:16"
);
bad_input!(
    native_inputs_with_a_python_launch,
    "native_inputs_python_launch.yaml",
    "native_inputs_python_launch.yaml:3:9"
);
bad_input!(
    aot_method_without_launch,
    "aot_triton_without_args.yaml",
    "aot_triton_without_args.yaml:15:38"
);
bad_input!(
    aot_with_nothing_to_export,
    "aot_torch_only.yaml",
    "aot_torch_only.yaml:11:25"
);
bad_input!(
    aot_triton_argument_type_unknown,
    "aot_triton_args_type.yaml",
    "aot_triton_args_type.yaml:11:45"
);

/// A `kind: cuda` method without a grid is refused at the method, naming
/// what it needs.
#[test]
fn a_native_method_needs_a_grid() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::write(
        dir.path().join("m.yaml"),
        format!(
            "experiment: x\nproblem: gemm\nshapes: {{list: [{{M: 16, N: 16, K: 16}}]}}\nmethods:\n  cuda:\n    kind: cuda\n    kernel: k\n    source: {}\n    block: [32]\n    args: [out]\n",
            repo.join("experiments/kernels/gemm_mma.cu").display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(dir.path())
        .args(["validate", "m.yaml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("m.yaml:5:3") && stderr.contains("needs `grid:`"),
        "{stderr}"
    );
}

bad_input!(
    protocol_cap_not_positive,
    "protocol_cap.yaml",
    "protocol_cap.yaml:11:16"
);

bad_input!(
    protocol_race_out_of_range,
    "protocol_race.yaml",
    "protocol_race.yaml:11:9"
);
