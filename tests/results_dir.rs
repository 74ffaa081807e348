//! A results directory is never damaged by what happens beside it: two runs
//! started at once, a run that fails at start-up, links placed inside it, a
//! runner killed outright, a job that crashed or hung. Real runs in Triton's
//! interpreter (named by TUNELAB_TEST_PYTHON, which `just test` sets;
//! without it those tests say so and pass vacuously); the others need no
//! Python.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod interpreter;
use interpreter::{python, repo, show, tunelab};

fn journal(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("journal lines are JSON"))
        .collect()
}

fn job_ids(dir: &Path) -> Vec<String> {
    journal(dir)
        .iter()
        .filter(|e| e["type"] == "job")
        .map(|e| e["job_id"].as_str().unwrap().to_string())
        .collect()
}

/// This process's start time as the lock records it (`/proc/PID/stat`).
fn lock_line(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    format!("{pid} {}\n", rest.split_whitespace().nth(19).unwrap())
}

/// Every entry below `dir`, relative, sorted: what a command left behind.
fn tree(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            out.push(e.path().strip_prefix(root).unwrap().to_path_buf());
            if e.file_type().unwrap().is_dir() {
                walk(root, &e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn of_two_runs_started_at_once_one_runs_and_the_other_names_it_and_touches_nothing() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let dir = results.path().join("slow/cpu-interpreter");
    let start = || {
        tunelab(
            &py,
            results.path(),
            &["run", "tests/fixtures/runs/slow.yaml"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (start(), start());
    let pids = [a.id(), b.id()];
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let codes: Vec<Option<i32>> = outs.iter().map(|o| o.status.code()).collect();
    let (winner, loser) = match codes[..] {
        [Some(0), Some(4)] => (0, 1),
        [Some(4), Some(0)] => (1, 0),
        _ => panic!("{}\n{}", show(&outs[0]), show(&outs[1])),
    };
    let said = String::from_utf8_lossy(&outs[loser].stderr);
    assert!(
        said.contains(&format!("another tunelab run (pid {})", pids[winner])),
        "{said}"
    );
    assert_eq!(
        job_ids(&dir).len(),
        6,
        "the run that ran recorded every job"
    );
    assert!(!dir.join(".lock").exists());
}

#[test]
fn a_live_holder_is_named_and_a_stale_lock_is_taken_over() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let dir = results.path().join("slow/cpu-interpreter");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("journal.jsonl"), "").unwrap();
    // A live tunelab holds it: this test process, as the lock records it.
    std::fs::write(dir.join(".lock"), lock_line(std::process::id())).unwrap();
    let out = tunelab(
        &py,
        results.path(),
        &["run", "tests/fixtures/runs/slow.yaml"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another tunelab run"));
    assert_eq!(tree(&dir), [PathBuf::from(".lock"), "journal.jsonl".into()]);

    // The same process id, started at another time: a process id reused
    // since. And a process that is gone. Neither holds the directory: the
    // run goes on (here it stops at a Python that does not exist, exit 4,
    // having taken the lock and given it back).
    let line = lock_line(std::process::id());
    let (pid, started) = line.trim().split_once(' ').unwrap();
    let reused = format!("{pid} {}\n", started.parse::<u64>().unwrap() + 7);
    for stale in [reused, "999999999\n".to_string()] {
        std::fs::write(dir.join(".lock"), &stale).unwrap();
        let out = tunelab(
            "/nonexistent/python",
            results.path(),
            &["run", "tests/fixtures/runs/slow.yaml"],
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{stderr}");
        assert!(!stderr.contains("another tunelab run"), "{stderr}");
        assert_eq!(
            tree(&dir),
            [PathBuf::from("journal.jsonl")],
            "the stale lock was taken and given back, nothing else left"
        );
    }
}

#[test]
fn a_run_that_fails_at_start_up_removes_only_what_it_made() {
    let results = tempfile::tempdir().unwrap();
    // A fresh directory: nothing at all is left.
    let out = tunelab(
        "/nonexistent/python",
        results.path(),
        &["run", "tests/fixtures/runs/slow.yaml"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", show(&out));
    assert_eq!(tree(results.path()), Vec::<PathBuf>::new());

    // A directory with results: they stay, and so do its logs.
    let dir = results.path().join("slow/cpu-interpreter");
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    std::fs::write(dir.join("journal.jsonl"), "").unwrap();
    std::fs::write(dir.join("logs/lane0.log"), "an earlier run's log\n").unwrap();
    let before = tree(&dir);
    let out = tunelab(
        "/nonexistent/python",
        results.path(),
        &["run", "tests/fixtures/runs/slow.yaml"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", show(&out));
    assert_eq!(tree(&dir), before);
}

#[test]
fn nothing_is_written_through_a_link_inside_a_results_directory() {
    let base = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("notes.txt");
    std::fs::write(&victim, "precious").unwrap();

    // `report`: an output folder that is a link.
    let dir = base.path().join("moe");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/fixtures/journals/moe.jsonl"),
        dir.join("journal.jsonl"),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.join("vllm")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .args(["report"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("vllm") && stderr.contains("symbolic link"),
        "{stderr}"
    );
    assert_eq!(tree(outside.path()), [PathBuf::from("notes.txt")]);

    // A run: a journal that is a link (refused before anything starts).
    let results = base.path().join("results");
    let run_dir = results.join("slow/cpu-interpreter");
    std::fs::create_dir_all(&run_dir).unwrap();
    std::os::unix::fs::symlink(&victim, run_dir.join("journal.jsonl")).unwrap();
    let out = tunelab(
        "/nonexistent/python",
        &results,
        &["run", "tests/fixtures/runs/slow.yaml"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("journal.jsonl") && stderr.contains("symbolic link"),
        "{stderr}"
    );

    // `pack`: neither truncated nor replaced.
    let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
        .arg("pack")
        .arg(&run_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", show(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(run_dir.join("journal.jsonl").is_symlink());

    // A run: a journal that is a hard link (a backup made with `cp -l`):
    // neither its torn-looking last line cut off nor anything appended.
    std::fs::remove_file(run_dir.join("journal.jsonl")).unwrap();
    std::fs::hard_link(&victim, run_dir.join("journal.jsonl")).unwrap();
    let out = tunelab(
        "/nonexistent/python",
        &results,
        &["run", "tests/fixtures/runs/slow.yaml"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("hard links"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");

    // A run: a compile cache that is a link (Triton and the native compiler
    // write into it with plain opens). Refused before anything starts.
    std::fs::remove_file(run_dir.join("journal.jsonl")).unwrap();
    for cache in [".cache/triton", ".cache/native", ".cache/aot"] {
        std::fs::create_dir_all(run_dir.join(".cache")).unwrap();
        std::os::unix::fs::symlink(outside.path(), run_dir.join(cache)).unwrap();
        let out = tunelab(
            "/nonexistent/python",
            &results,
            &["run", "tests/fixtures/runs/slow.yaml"],
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{stderr}");
        assert!(
            stderr.contains(cache) && stderr.contains("symbolic link"),
            "{stderr}"
        );
        std::fs::remove_file(run_dir.join(cache)).unwrap();
    }
    assert_eq!(tree(outside.path()), [PathBuf::from("notes.txt")]);

    // `profile`: its request (written before any GPU is looked for) and
    // what the profiler writes by name, through a link.
    for (name, link) in [
        ("request.json", "profile/request.json"),
        ("summary.md", "profile/summary.md"),
        ("profile", "profile"),
    ] {
        std::fs::create_dir_all(dir.join("profile")).unwrap();
        if link == "profile" {
            std::fs::remove_dir_all(dir.join("profile")).unwrap();
        }
        std::os::unix::fs::symlink(&victim, dir.join(link)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
            .args(["--python", "/nonexistent/python", "profile"])
            .arg(&dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{stderr}");
        assert!(
            stderr.contains(name) && stderr.contains("symbolic link"),
            "{stderr}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        std::fs::remove_file(dir.join(link)).unwrap();
    }
}

/// The process ids of `parent`'s children.
fn children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn workers_end_with_a_runner_that_was_killed_outright() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let hanging = results.path().join("hanging");
    let mut runner = tunelab(
        &py,
        results.path(),
        &[
            "run",
            "tests/fixtures/runs/crashy.yaml",
            "--only",
            "method=hang",
            "--set",
            "protocol.timeout_s=600",
        ],
    )
    .env("TUNELAB_TEST_HANG_FILE", &hanging)
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // Until the worker is inside the call that never returns, where only
    // its own watch can end it (a closed pipe is never read).
    let deadline = Instant::now() + Duration::from_secs(90);
    while !hanging.exists() {
        assert!(
            Instant::now() < deadline,
            "the worker never reached the hang"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let workers = children(runner.id());
    assert!(!workers.is_empty());
    runner.kill().unwrap();
    runner.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    for pid in workers {
        while Path::new(&format!("/proc/{pid}")).exists() {
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'));
            if zombie {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "worker {pid} outlived its runner by 20 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_job_that_crashed_or_hung_is_tried_again_once_and_the_report_says_so() {
    let Some(py) = python() else { return };
    let results = tempfile::tempdir().unwrap();
    let dir = results.path().join("crashy/cpu-interpreter");
    let run = || {
        tunelab(
            &py,
            results.path(),
            &["run", "tests/fixtures/runs/crashy.yaml"],
        )
        .output()
        .unwrap()
    };
    let first = run();
    assert_eq!(first.status.code(), Some(3), "{}", show(&first));
    let after_first = job_ids(&dir);
    assert_eq!(after_first.len(), 3);

    // The crash and the timeout run again (and fail again); the job that
    // passed does not.
    let second = run();
    assert_eq!(second.status.code(), Some(3), "{}", show(&second));
    let entries = journal(&dir);
    let records = |method: &str| {
        entries
            .iter()
            .filter(|e| e["type"] == "job" && e["method"] == method)
            .count()
    };
    assert_eq!(
        (records("ok"), records("crash"), records("hang")),
        (1, 2, 2)
    );

    // Tried once again: that was all.
    let third = run();
    assert_eq!(third.status.code(), Some(0), "{}", show(&third));
    assert_eq!(job_ids(&dir).len(), 5);
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains(
            "2 jobs crashed or timed out in an earlier run and ran again (0 then passed)"
        ),
        "{report}"
    );
}

#[test]
fn a_trace_or_out_file_that_is_the_journal_is_refused_before_anything_runs() {
    let results = tempfile::tempdir().unwrap();
    let dir = results.path().join("slow/cpu-interpreter");
    std::fs::create_dir_all(&dir).unwrap();
    let journal = dir.join("journal.jsonl");
    let recorded =
        std::fs::read_to_string(repo().join("tests/fixtures/journals/moe.jsonl")).unwrap();
    std::fs::write(&journal, &recorded).unwrap();
    // By its name, and through a link whose name says nothing.
    let link = results.path().join("trace.json");
    std::os::unix::fs::symlink(&journal, &link).unwrap();
    for named in [&journal, &link] {
        let named = named.to_str().unwrap();
        let out = tunelab(
            "/nonexistent/python",
            results.path(),
            &["run", "tests/fixtures/runs/slow.yaml", "--trace", named],
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("--trace") && stderr.contains("journal"),
            "{stderr}"
        );

        let fixture = repo().join("tests/fixtures/journals/moe.jsonl");
        let out = Command::new(env!("CARGO_BIN_EXE_tunelab"))
            .arg("compare")
            .args([&fixture, &fixture])
            .args(["--out", named])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    }
    assert_eq!(std::fs::read_to_string(&journal).unwrap(), recorded);
    assert_eq!(tree(&dir), [PathBuf::from("journal.jsonl")]);
}
