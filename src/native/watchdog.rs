//! A worker ends itself when the runner that started it is gone.
//!
//! A runner stopped by SIGKILL cannot stop its workers, and a native worker
//! inside a kernel that hangs never reads its closed pipe: it would run on,
//! orphaned, holding its GPU. The runner names itself in
//! [`RUNNER_PID_VAR`] when it starts a worker (the Python worker reads the
//! same variable, `tunelab.worker_io._die_with_runner`), and a thread of the
//! worker checks twice a second that the runner is still its parent.

use std::time::Duration;

/// The environment variable that carries the runner's process id.
pub const RUNNER_PID_VAR: &str = "TUNELAB_RUNNER_PID";

/// Starts the watch, if the variable names this process's parent. (Started
/// by hand, or through a program that is not the runner, nothing is watched.)
pub fn die_with_runner() {
    let Some(runner) = std::env::var(RUNNER_PID_VAR)
        .ok()
        .and_then(|v| v.parse::<libc::pid_t>().ok())
    else {
        return;
    };
    // SAFETY: getppid has no preconditions and cannot fail.
    let parent = || unsafe { libc::getppid() };
    if parent() != runner {
        return;
    }
    std::thread::Builder::new()
        .name("runner-watch".into())
        .spawn(move || {
            while parent() == runner {
                std::thread::sleep(Duration::from_millis(500));
            }
            // The runner is gone: nothing this worker does can be recorded.
            std::process::exit(1);
        })
        .ok();
}
