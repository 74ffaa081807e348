//! Careless and hostile input (a manifest of a few hundred bytes that asks
//! for gigabytes, a manifest that names files outside its repository, an
//! output that names the journal): every case exits 2 with the place and
//! the limit, writes nothing, and stays bounded. Each command runs under an
//! address-space cap and a time guard, so a case that runs away fails its
//! test instead of taking the machine (the figures themselves are measured
//! with `/usr/bin/time`, not asserted: see docs/manifest.md, "Limits").

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn hostile() -> PathBuf {
    repo().join("tests/fixtures/hostile")
}

/// Address space a command may take: far above what refusing needs (tens of
/// megabytes), far below what the runaway cases took (gigabytes).
const ADDRESS_SPACE: u64 = 2 << 30;
/// Far above what refusing takes (milliseconds), far below "forever".
const GUARD: Duration = Duration::from_secs(60);

/// Runs tunelab with `args` in `dir`, capped and guarded; results go to a
/// fresh folder, returned with the output so a test can check it is empty.
fn tunelab_in(dir: &Path, args: &[&str]) -> (Output, tempfile::TempDir) {
    let results = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunelab"));
    cmd.current_dir(dir)
        .args(args)
        .arg("--results-dir")
        .arg(results.path())
        .env_remove("TUNELAB_PYTHON")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: one async-signal-safe call on the child alone.
    unsafe {
        cmd.pre_exec(|| {
            let cap = libc::rlimit {
                rlim_cur: ADDRESS_SPACE,
                rlim_max: ADDRESS_SPACE,
            };
            libc::setrlimit(libc::RLIMIT_AS, &cap);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > GUARD {
            child.kill().unwrap();
            panic!("tunelab {args:?} ran past {GUARD:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (child.wait_with_output().unwrap(), results)
}

/// Asserts exit 2, nothing on stdout, nothing written, and each of `wanted`
/// in the message; returns the message.
fn refused(dir: &Path, args: &[&str], wanted: &[&str]) -> String {
    let (out, results) = tunelab_in(dir, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}:\n{stderr}");
    assert!(out.stdout.is_empty(), "{args:?}: stdout not empty");
    assert_eq!(
        std::fs::read_dir(results.path()).unwrap().count(),
        0,
        "{args:?}: nothing may be written"
    );
    for w in wanted {
        assert!(stderr.contains(w), "{args:?}: expected `{w}` in:\n{stderr}");
    }
    stderr
}

/// The case is refused by `validate` and by `plan` alike.
fn refused_everywhere(file: &str, wanted: &[&str]) -> String {
    let dir = hostile();
    refused(&dir, &["plan", file], wanted);
    refused(&dir, &["validate", file], wanted)
}

#[test]
fn yaml_aliases_that_multiply_are_counted_before_they_are_copied() {
    refused_everywhere(
        "aliases.yaml",
        &[
            "aliases.yaml:9:12",
            "more than 250000 values",
            "alias repeats its anchor",
        ],
    );
}

/// A path template is text and `{{ field }}`s: Jinja's loops (which printed
/// gigabytes, or ran for hours printing nothing) are refused at their line
/// before anything renders.
#[test]
fn a_path_template_with_a_loop_is_refused_before_it_runs() {
    for (fixture, at) in [
        ("template_prints.yaml", "template_prints.yaml:9:28"),
        ("template_loops.yaml", "template_loops.yaml:9:28"),
    ] {
        refused_everywhere(
            fixture,
            &[at, "`{%` statements and `{#` comments are not allowed"],
        );
    }
}

/// Expressions are evaluated by tunelab's own evaluator: what Jinja could
/// grow without bound (filters, `range`, string repetition and
/// concatenation) is refused at validation, at the expression's line.
#[test]
fn expressions_outside_the_language_are_refused_at_their_line() {
    let dir = tempfile::tempdir().unwrap();
    for (i, constraint) in [
        "(range(100000) | list | length) > 0",
        "('x' * 99999999 ~ 'x' * 99999999) != ''",
        "[1] * 99999999 != []",
        "M is odd",
    ]
    .iter()
    .enumerate()
    {
        let name = format!("c{i}.yaml");
        std::fs::write(
            dir.path().join(&name),
            format!(
                "experiment: c\nproblem: gemm\nshapes:\n  list: [{{M: 64, N: 64, K: 64, dtype: fp16}}]\nmethods:\n  triton:\n    kind: triton\n    kernel: matmul\n    params: {{GROUP_SIZE_M: 8, BLOCK_SIZE_N: 64, BLOCK_SIZE_K: 32, num_warps: 4, num_stages: 3}}\n    space: {{BLOCK_SIZE_M: [16, 32]}}\n    constraints: [\"{constraint}\"]\n    grid: [\"ceil_div(M, BLOCK_SIZE_M) * ceil_div(N, BLOCK_SIZE_N)\"]\n    args: [a, b, out, M, N, K, K, 1, N, 1, N, 1]\n"
            ),
        )
        .unwrap();
        refused(
            dir.path(),
            &["validate", &name],
            &[
                &format!("{name}:11:19"),
                "is not an expression of tunelab's language",
            ],
        );
    }
}

/// A journal is input too: `report` renders its output paths with the same
/// bounded renderer, and refuses a loop in one.
#[test]
fn a_journal_whose_output_path_loops_is_refused_by_report() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("tests/fixtures/journals/moe.jsonl")).unwrap();
    let mut lines = text.lines();
    let looping = "{% for i in range(30000) %}{% endfor %}{{M}}.csv";
    let mut journal = lines.next().unwrap().replacen(
        "\"path\":\"best.csv\"",
        &format!("\"path\":\"{looping}\""),
        1,
    ) + "\n";
    let job: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    for m in 1..=100 {
        let mut job = job.clone();
        job["job_id"] = format!("{m:016x}").into();
        job["shape"]["M"] = m.into();
        journal.push_str(&format!("{job}\n"));
    }
    std::fs::write(dir.path().join("journal.jsonl"), journal).unwrap();
    let (out, _results) = tunelab_in(dir.path(), &["report", "."]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`{%` statements and `{#` comments are not allowed"),
        "{stderr}"
    );
}

#[test]
fn a_huge_range_is_counted_not_built() {
    refused_everywhere(
        "huge_range.yaml",
        &[
            "huge_range.yaml:11:21",
            "9223372036854775792 values",
            "100000 an axis may hold",
        ],
    );
}

#[test]
fn a_space_of_a_trillion_points_is_refused_before_any_walk() {
    refused_everywhere(
        "huge_space.yaml",
        &[
            "huge_space.yaml:7:3",
            "1000000000000 points before constraints",
            "fewer values",
        ],
    );
}

#[test]
fn a_product_of_a_billion_shapes_is_refused_before_it_is_built() {
    refused_everywhere(
        "huge_shapes.yaml",
        &["huge_shapes.yaml:6:6", "1000000000 shapes"],
    );
}

#[test]
fn an_alias_of_a_long_text_is_counted_by_its_bytes() {
    // 100 kB of text, repeated 50 times by a 150-byte line: 5 MB once
    // copied (the count of values alone let 20,000 such aliases take 2 GB).
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "experiment: long\nproblem: gemm\ndescription: &d '{}'\nx: [{}]\n",
        "a".repeat(100_000),
        vec!["*d"; 50].join(", ")
    );
    std::fs::write(dir.path().join("long.yaml"), text).unwrap();
    let stderr = refused(
        dir.path(),
        &["validate", "long.yaml"],
        &["long.yaml:4:", "more than 4194304 bytes", "alias"],
    );
    assert!(!stderr.contains("aaaaaaaaaa"), "no contents: {stderr}");
}

#[test]
fn included_files_count_each_time_they_are_included() {
    // Twenty files, each including the next twice: 2^20 loads of a few
    // bytes (without a count across files, still running at 20 s).
    let dir = tempfile::tempdir().unwrap();
    for i in 1..20 {
        let next = i + 1;
        std::fs::write(
            dir.path().join(format!("l{i}.yaml")),
            format!("a: {{include: l{next}.yaml}}\nb: {{include: l{next}.yaml}}\n"),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("l20.yaml"), "x: 1\n").unwrap();
    let manifest = "experiment: diamond\nproblem: gemm\nshapes:\n  list: [{M: 64, N: 64, K: 64}]\nmethods:\n  torch: {kind: torch, kernel: torch_matmul, params: {include: l1.yaml}}\n";
    std::fs::write(dir.path().join("m.yaml"), manifest).unwrap();
    refused(
        dir.path(),
        &["validate", "m.yaml"],
        &["more than 256 files", "each time it is included"],
    );

    // One large file, included twice: its bytes count twice.
    std::fs::write(
        dir.path().join("big.yaml"),
        format!("x: '{}'\n", "b".repeat(3 << 20)),
    )
    .unwrap();
    let manifest = "experiment: twice\nproblem: gemm\nshapes:\n  list: [{M: 64, N: 64, K: 64}]\nmethods:\n  torch: {kind: torch, kernel: torch_matmul}\ndescription:\n  include: [big.yaml, big.yaml]\n";
    std::fs::write(dir.path().join("twice.yaml"), manifest).unwrap();
    refused(
        dir.path(),
        &["validate", "twice.yaml"],
        &["twice.yaml:8:23", "more than 4194304 bytes together"],
    );
}

#[test]
fn a_long_chain_of_signs_or_nots_is_refused_before_any_parser_recurses_on_it() {
    // 5,000 `not`s (20 kB) overflowed the stack in minijinja's parser: the
    // process aborted (SIGABRT), with no message and no place.
    let experiments = repo().join("experiments");
    let nots = format!("{}BLOCK_SIZE_M", "not ".repeat(5000));
    let signs = format!("{}BLOCK_SIZE_M > 0", "-".repeat(5000));
    for expr in [&nots, &signs] {
        let set = format!("methods.triton.constraints=[\"{expr}\"]");
        for command in ["validate", "plan"] {
            refused(
                &experiments,
                &[command, "quickstart.yaml", "--set", &set],
                &["--set", "more than the 500 an expression may have"],
            );
        }
    }
    let set = format!(
        "outputs=[{{format: report, path: \"{{{{ {}M }}}}.md\"}}]",
        "-".repeat(5000)
    );
    refused(
        &experiments,
        &["validate", "quickstart.yaml", "--set", &set],
        &["more than the 500 a path template may have"],
    );

    // A journal's output paths are templates too (`report` renders them).
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("tests/fixtures/journals/moe.jsonl")).unwrap();
    let long = format!("{{{{ {}E }}}}.json", "not ".repeat(5000));
    let text = text.replacen("\"path\":\"best.csv\"", &format!("\"path\":\"{long}\""), 1);
    std::fs::write(dir.path().join("journal.jsonl"), text).unwrap();
    let (out, _results) = tunelab_in(dir.path(), &["report", "."]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("more than the 500"), "{stderr}");
}

#[test]
fn a_manifest_over_the_size_limit_is_not_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("experiment: big\nproblem: gemm\nshapes:\n  list:\n");
    while text.len() < 5 << 20 {
        text.push_str("    - {M: 64, N: 64, K: 64}\n");
    }
    std::fs::write(dir.path().join("big.yaml"), text).unwrap();
    let stderr = refused(
        dir.path(),
        &["validate", "big.yaml"],
        &["big.yaml", "more than the 4194304"],
    );
    assert!(!stderr.contains("M: 64"), "no contents: {stderr}");
}

#[test]
fn a_mapping_of_forty_thousand_keys_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from(
        "experiment: keys\nproblem: gemm\nshapes:\n  list: [{M: 64, N: 64, K: 64}]\nmethods:\n  triton:\n    kind: triton\n    kernel: matmul\n    params:\n",
    );
    for i in 0..40_000 {
        text.push_str(&format!("      k{i}: {i}\n"));
    }
    std::fs::write(dir.path().join("keys.yaml"), text).unwrap();
    let (out, _results) = tunelab_in(dir.path(), &["validate", "keys.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn outputs_that_name_what_the_runner_keeps_are_refused_at_their_line() {
    refused_everywhere(
        "output_is_journal.yaml",
        &[
            "output_is_journal.yaml:9:30",
            "would write over `journal.jsonl`",
        ],
    );
    refused_everywhere(
        "output_in_logs.yaml",
        &["output_in_logs.yaml:8:30", "would write over `logs`"],
    );
    refused_everywhere(
        "outputs_share_a_path.yaml",
        &[
            "outputs_share_a_path.yaml:9:30",
            "`best.csv` is also written by the output at line 8",
        ],
    );
    // The same through --set, and for a run (before anything starts).
    let quickstart = repo().join("experiments");
    for set in [
        "outputs=[{format: best_csv, path: journal.jsonl}]",
        "outputs=[{format: best_csv, path: .lock}]",
        "outputs=[{format: best_csv, path: journal.jsonl.gz}]",
        "outputs=[{format: best_csv, path: a.csv}, {format: jobs_csv, path: a.csv}]",
    ] {
        refused(
            &quickstart,
            &["validate", "quickstart.yaml", "--set", set],
            &["--set"],
        );
        refused(
            &quickstart,
            &[
                "run",
                "quickstart.yaml",
                "--interpret",
                "--python",
                "/nonexistent/python",
                "--set",
                set,
            ],
            &["--set"],
        );
    }
}

#[test]
fn integer_overflow_in_an_expression_is_an_error_at_its_place() {
    refused_everywhere(
        "overflow.yaml",
        &[
            "overflow.yaml:12:7",
            "integer overflow in -9223372036854775808 // -1",
        ],
    );
    let experiments = repo().join("experiments");
    for (set, wanted) in [
        (
            r#"methods.triton.constraints=["(-9223372036854775807 - 1) % -1 == 0"]"#,
            "integer overflow in -9223372036854775808 % -1",
        ),
        (
            r#"methods.triton.constraints=["abs(-9223372036854775807 - 1) > 0"]"#,
            "integer overflow in abs(-9223372036854775808)",
        ),
        (
            r#"methods.triton.derived={X: "ceil_div(9223372036854775807, 2)"}"#,
            "integer overflow in ceil_div(9223372036854775807, 2)",
        ),
        // Inside a membership test, as anywhere.
        (
            r#"methods.triton.constraints=["(-9223372036854775807 - 1) // -1 in [1]"]"#,
            "integer overflow in -9223372036854775808 // -1",
        ),
    ] {
        refused(
            &experiments,
            &["validate", "quickstart.yaml", "--set", set],
            &[wanted],
        );
    }
}

#[test]
fn numbers_at_the_edges_are_errors_at_their_place_never_a_panic() {
    let experiments = repo().join("experiments");
    // A range whose values fit but whose steps do not (values.rs panicked
    // on `i * step`, or wrapped in a release build).
    refused(
        &experiments,
        &[
            "plan",
            "quickstart.yaml",
            "--set",
            "methods.triton.space.BLOCK_SIZE_M={range: [-9223372036854775808, 9223372036854775807, 9223372036854775807]}",
        ],
        &["integer overflow in -9223372036854775808 * 64"],
    );
    // Times that no `Duration` holds (the run panicked making one).
    for (set, wanted) in [
        ("protocol.timeout_s=.inf", "found inf"),
        ("protocol.timeout_s=1e300", "found 1e300"),
        ("protocol.max_wall_ms=1e300", "found 1e300"),
    ] {
        refused(
            &experiments,
            &[
                "run",
                "quickstart.yaml",
                "--interpret",
                "--python",
                "/nonexistent/python",
                "--set",
                set,
            ],
            &["--set", wanted],
        );
    }
}

#[test]
fn files_outside_the_repository_are_refused_and_never_quoted() {
    let stderr = refused_everywhere(
        "include_environ.yaml",
        &["include_environ.yaml:4:12", "outside", "--allow-read"],
    );
    // Nothing of the environment is echoed.
    assert!(!stderr.contains("PATH="), "{stderr}");

    // A link inside the manifest's folder that leads out of it.
    let base = tempfile::tempdir().unwrap();
    let (inside, outside) = (base.path().join("exp"), base.path().join("secrets"));
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(
        outside.join("token.env"),
        "list: [{M: 64, N: 64, K: 64}]\nsecret_token: hunter2\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.join("token.env"), inside.join("shapes.yaml")).unwrap();
    std::fs::write(
        inside.join("m.yaml"),
        "experiment: linked\nproblem: gemm\nshapes:\n  include: shapes.yaml\nmethods:\n  torch: {kind: torch, kernel: torch_matmul}\n",
    )
    .unwrap();
    let stderr = refused(
        &inside,
        &["validate", "m.yaml"],
        &["m.yaml:4:12", "outside"],
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");

    // A tunelab.toml in the manifest's own repository (here, its folder) is
    // the repository's word, not that of the person running tunelab there:
    // its `allow_read` is not used (it let an error quote a line of a file
    // anywhere on the machine).
    std::fs::write(
        inside.join("tunelab.toml"),
        format!("allow_read = [\"{}\"]\n", outside.display()),
    )
    .unwrap();
    let stderr = refused(
        &inside,
        &["validate", "m.yaml"],
        &["m.yaml:4:12", "outside", "tunelab.toml is not used"],
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
    std::fs::remove_file(inside.join("tunelab.toml")).unwrap();

    // Allowed by the person running it, the file is read, and an error in
    // it (an unknown key) names the place without quoting it: it is no
    // manifest (.yaml), whatever the link to it is called.
    let allow = outside.to_str().unwrap();
    let stderr = refused(
        &inside,
        &["validate", "m.yaml", "--allow-read", allow],
        &["secret_token", "shapes.yaml:2:1"],
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
    // So is a settings file of the person's own, outside the repository.
    let own = base.path().join("own.toml");
    std::fs::write(&own, format!("allow_read = [\"{allow}\"]\n")).unwrap();
    refused(
        &inside,
        &["validate", "m.yaml", "--config", own.to_str().unwrap()],
        &["secret_token", "shapes.yaml:2:1"],
    );

    // A shape CSV outside is refused the same way; one inside is never quoted.
    std::fs::write(outside.join("s.csv"), "M,N,K\n64,64,64\n").unwrap();
    std::fs::write(
        inside.join("csv.yaml"),
        format!(
            "experiment: c\nproblem: gemm\nshapes:\n  csv: {{path: {}}}\nmethods:\n  torch: {{kind: torch, kernel: torch_matmul}}\n",
            outside.join("s.csv").display()
        ),
    )
    .unwrap();
    refused(
        &inside,
        &["validate", "csv.yaml"],
        &["csv.yaml:4:", "outside"],
    );
    std::fs::write(inside.join("bad.csv"), "M,N,K\n64,password123\n").unwrap();
    std::fs::write(
        inside.join("csv2.yaml"),
        "experiment: c\nproblem: gemm\nshapes:\n  csv: {path: bad.csv}\nmethods:\n  torch: {kind: torch, kernel: torch_matmul}\n",
    )
    .unwrap();
    let stderr = refused(&inside, &["validate", "csv2.yaml"], &["bad.csv:2:"]);
    assert!(!stderr.contains("password123"), "{stderr}");

    // A file that is no CSV, its first line taken for a header: a column
    // it lacks is reported without listing what the line holds.
    std::fs::write(inside.join("notes.txt"), "password hunter2 token_abc\n1\n").unwrap();
    std::fs::write(
        inside.join("csv3.yaml"),
        "experiment: c\nproblem: gemm\nshapes:\n  csv: {path: notes.txt, columns: {M: m}}\nmethods:\n  torch: {kind: torch, kernel: torch_matmul}\n",
    )
    .unwrap();
    let stderr = refused(
        &inside,
        &["validate", "csv3.yaml"],
        &["csv3.yaml:4:", "no column `m`", "has 1 column"],
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[test]
fn a_byte_order_mark_is_not_part_of_the_first_key() {
    let (out, results) = tunelab_in(&hostile(), &["validate", "bom.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(std::fs::read_dir(results.path()).unwrap().count(), 0);
}

/// A failed write to standard output fails the command; a reader that
/// stopped reading ends it quietly.
#[test]
fn a_full_standard_output_is_an_error_never_a_success_or_a_panic() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("no /dev/full here: skipped");
        return;
    };
    for args in [
        &["plan", "gptoss.yaml", "--jobs"][..],
        &["plan", "gptoss.yaml", "--json"],
        &["plan", "gptoss.yaml"],
        &["schema"],
        &["validate", "gptoss.yaml"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
            .current_dir(repo().join("experiments"))
            .args(args)
            .stdout(full.try_clone().unwrap())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("cannot write to standard output"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // `| head`: the reader closes the pipe; the command stops quietly: no
    // error and no panic (a machine without a GPU gets a note saying which
    // device the plan is for, which is not an error).
    let mut child = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .current_dir(repo().join("experiments"))
        .args(["plan", "gptoss.yaml", "--jobs"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for bad in ["error", "panicked", "Broken pipe"] {
        assert!(!stderr.contains(bad), "{stderr}");
    }
    assert!(stderr.lines().all(|l| l.starts_with("note: ")), "{stderr}");
}

/// The manifest loader and the expression evaluator over many mutations of
/// the committed manifests: never a panic, never a hang, always an answer
/// (a fixed budget of cases, seeded, so a failure reproduces).
#[test]
fn mutated_manifests_are_answered_never_crashed_on() {
    // A copy of experiments/, so that includes and sources resolve.
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&repo().join("experiments"), dir.path());
    let mut originals = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            originals.push(std::fs::read(&path).unwrap());
        }
    }
    originals.sort();
    // Pieces a mutation splices in: YAML syntax, hostile numbers, templates.
    let pieces: [&[u8]; 16] = [
        b"&a [x]",
        b"*a",
        b"{range: [0, 9223372036854775807, 1]}",
        b"-9223372036854775808",
        b"\"{% for i in range(99999) %}{% endfor %}\"",
        b"\"(-9223372036854775807 - 1) // -1\"",
        b"[[[[[[[[[[[[",
        b"]]]]",
        b": :",
        b"\t",
        b"\xff\xfe",
        b"\xef\xbb\xbf",
        b"include: /etc/passwd",
        b"extends: ../../../../etc/hostname",
        b"{{ device.nope }}",
        b"abs(-9223372036854775807 - 1)",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let cases = 60;
    for case in 0..cases {
        let mut text = originals[(next() as usize) % originals.len()].clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % text.len().max(1);
            match next() % 3 {
                0 => {
                    let p = pieces[(next() as usize) % pieces.len()];
                    text.splice(at..at, p.iter().copied());
                }
                1 => {
                    let end = (at + (next() as usize) % 40).min(text.len());
                    text.drain(at..end);
                }
                _ => {
                    if let Some(b) = text.get_mut(at) {
                        *b ^= 1 << (next() % 8);
                    }
                }
            }
        }
        let file = format!("case{case}.yaml");
        std::fs::write(dir.path().join(&file), &text).unwrap();
        let (out, results) = tunelab_in(dir.path(), &["validate", &file]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(0 | 2)),
            "case {case}: {:?}\n{stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "case {case}: {stderr}");
        assert_eq!(std::fs::read_dir(results.path()).unwrap().count(), 0);
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
