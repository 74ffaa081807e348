//! A Python worker process and the JSON-lines conversation with it.
//!
//! Every call has a deadline. A worker that does not answer in time is killed
//! (SIGTERM, then SIGKILL after a grace period); one that exits is a crash.
//! Either way the caller records the job's failure class and starts a fresh
//! worker: nothing a kernel does can take the runner down.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value as Json};

use crate::protocol::lines::{self, LineReader, ReadError, Wait};
use crate::protocol::Answer;

/// One request's line: `id` and `op` first, then the body's own fields
/// (an object's), spliced in as serialised rather than inserted into it.
fn request_line(id: u64, op: &str, body: &impl Serialize) -> String {
    let fields = serde_json::to_string(body).expect("request serialises");
    let op = serde_json::to_string(op).expect("a string serialises");
    let rest = fields
        .strip_prefix('{')
        .expect("a request body is a JSON object");
    debug_assert!(
        serde_json::from_str::<serde_json::Map<String, Json>>(&fields)
            .is_ok_and(|m| !m.contains_key("id") && !m.contains_key("op")),
        "a request body names no id or op of its own: {fields}"
    );
    let sep = if rest.starts_with('}') { "" } else { "," };
    format!("{{\"id\":{id},\"op\":{op}{sep}{rest}\n")
}

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub python: String,
    /// Folders put first on PYTHONPATH, in order: the checkout's `python/`
    /// (when tunelab runs from a checkout) and the manifest's `python_path:`.
    pub python_path: Vec<PathBuf>,
    /// "lane" or "compile".
    pub role: String,
    pub interpret: bool,
    /// The device a lane owns, as `visible_var` names it to the worker.
    pub visible_device: Option<String>,
    /// `CUDA_VISIBLE_DEVICES`, or `HIP_VISIBLE_DEVICES` for an AMD GPU.
    pub visible_var: &'static str,
    /// For a compile worker: the GPU to compile for ("cuda:90:32"). The worker
    /// then sees no GPU at all and compiles from this alone.
    pub target: Option<String>,
    pub triton_cache: Option<PathBuf>,
    /// Worker stderr goes here (appended), so a crash can be explained.
    pub log: PathBuf,
    /// Run under `SCHED_IDLE` (a compile pool's worker beside timing lanes,
    /// `compile_priority: idle`): any other thread that wakes takes its CPU.
    pub background: bool,
}

#[derive(Debug)]
pub enum CallError {
    /// No answer before the deadline; the worker was killed.
    Timeout(f64),
    /// The worker exited (how, e.g. "exited with code 1"), and the last
    /// lines of its stderr, oldest first.
    Crash { status: String, stderr: Vec<String> },
    /// An answer that is not a protocol response.
    Protocol(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Timeout(s) => write!(f, "no answer within {s:.0} s"),
            CallError::Crash { status, stderr } => {
                write!(f, "worker {status}; stderr: {}", stderr.join(" | "))
            }
            CallError::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

/// A request written to a worker whose answer is still to be read
/// ([`Worker::send`], [`Worker::receive_as`]).
#[derive(Debug)]
pub struct Sent {
    id: u64,
    op: String,
    at: Instant,
}

impl Sent {
    /// The request's op.
    pub fn op(&self) -> &str {
        &self.op
    }
}

pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: LineReader<ChildStdout>,
    /// How long this side spins for a reply (zero: it sleeps until one comes).
    spin: Duration,
    /// The worker's own time for its last successful answer to each op: the
    /// next call of the op is waited for around when it should end.
    expected: HashMap<String, Duration>,
    next_id: u64,
    /// When the last answer was read: a request sent before it could not
    /// start before it.
    last_answer: Option<Instant>,
    /// When the worker finished its last answer (see [`Worker::last_done`]).
    last_done: Option<Instant>,
    /// Requests sent whose answers have not been read.
    pending: usize,
    log: PathBuf,
    /// The trace track: the log's file stem ("lane0", "compile3").
    name: String,
}

/// The grace period between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_millis(500);

impl Worker {
    pub fn spawn(spec: &WorkerSpec) -> std::io::Result<Worker> {
        let mut parts: Vec<PathBuf> = spec.python_path.clone();
        if let Some(existing) = std::env::var_os("PYTHONPATH") {
            parts.extend(std::env::split_paths(&existing));
        }
        let python_path = std::env::join_paths(parts).map_err(std::io::Error::other)?;
        let mut cmd = Command::new(&spec.python);
        cmd.args(["-u", "-m", "tunelab.worker", "--role", &spec.role]);
        if let Some(target) = &spec.target {
            cmd.args(["--target", target]);
        }
        if spec.role == "lane" && !spec.interpret && spec.target.is_none() {
            // This run found the lane's GPU: the worker stops if its torch
            // sees none, and so can start Triton's work before torch is up.
            cmd.args(["--mode", "gpu"]);
        }
        cmd.env("PYTHONPATH", python_path);
        if spec.interpret {
            cmd.env("TRITON_INTERPRET", "1");
        } else {
            cmd.env_remove("TRITON_INTERPRET");
        }
        if spec.target.is_some() {
            // Compiling for a named target needs no GPU; hiding them guarantees
            // the worker never creates a context or takes device memory.
            cmd.env("CUDA_VISIBLE_DEVICES", "");
        } else if let Some(dev) = &spec.visible_device {
            cmd.env(spec.visible_var, dev);
        }
        if let Some(cache) = &spec.triton_cache {
            cmd.env("TRITON_CACHE_DIR", cache);
        }
        // A compile takes hundreds of milliseconds: waking for its answer costs
        // nothing that shows, and the pool's cores are better left to compiling.
        let compile = spec.role == "compile";
        if compile {
            cmd.env(lines::SPIN_VAR, "0");
        }
        if spec.background {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec, one async-signal-safe system call
            // on this process alone. Lowering one's own policy needs no
            // privilege; where it is refused the worker runs as before.
            unsafe {
                cmd.pre_exec(|| {
                    let param = libc::sched_param { sched_priority: 0 };
                    libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
                    Ok(())
                });
            }
        }
        let name = spec
            .log
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.role.clone());
        let mut worker = Worker::start(cmd, &spec.log, name)?;
        if compile {
            worker.spin = Duration::ZERO;
        }
        Ok(worker)
    }

    /// Starts `cmd` (its arguments and environment set) as a worker speaking
    /// JSON lines, stderr appended to `log`; `name` is its trace track.
    pub fn start(mut cmd: Command, log: &Path, name: String) -> std::io::Result<Worker> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)?;
            // A results directory's `logs/` that is a link would put the
            // log (appended to, not replaced) wherever it points.
            if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(std::io::Error::other(format!(
                    "{} is a symbolic link: tunelab writes no log through a link",
                    dir.display()
                )));
            }
        }
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(log)?;
        // The worker ends itself if this process dies without stopping it.
        cmd.env(
            crate::native::watchdog::RUNNER_PID_VAR,
            std::process::id().to_string(),
        );
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        // Its own process group: a Ctrl-C (SIGINT to the terminal's group) reaches
        // only the runner, which finishes the job in flight and stops the workers.
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        Ok(Worker {
            child,
            stdin,
            lines: LineReader::new(stdout),
            spin: lines::spin_from_env(lines::LANE_SPIN),
            expected: HashMap::new(),
            next_id: 1,
            last_answer: None,
            last_done: None,
            pending: 0,
            log: log.to_path_buf(),
            name,
        })
    }

    /// When the worker finished its last answer: when it read the request
    /// (`at_ns`) plus its own time, for workers that say both; else when the
    /// answer was read. The GPU has been idle since (a rest counts from it).
    pub fn last_done(&self) -> Option<Instant> {
        self.last_done
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Requests sent whose answers have not been read.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Its trace track ("lane0", "native0").
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends one request and waits for its response, at most `timeout`.
    /// Traced as one span: the round trip, with the worker's own time in it.
    pub fn call(&mut self, op: &str, body: Json, timeout: Duration) -> Result<Json, CallError> {
        // Only a traced run pays for naming the job.
        let job = crate::trace::enabled()
            .then(|| {
                body.get("job_id")
                    .or_else(|| body.get("job").and_then(|j| j.get("job_id")))
                    .and_then(Json::as_str)
                    .map(str::to_string)
            })
            .flatten();
        self.call_as(op, &body, job.as_deref(), timeout)
    }

    /// [`Worker::call`] with the request and its answer typed: `body` is
    /// serialised as it is and the answer read straight into `A`, with no
    /// JSON tree in between (the native worker's calls, which come once or
    /// twice a job). `job` names the job in the trace.
    pub fn call_as<A: Answer>(
        &mut self,
        op: &str,
        body: &impl Serialize,
        job: Option<&str>,
        timeout: Duration,
    ) -> Result<A, CallError> {
        let started = Instant::now();
        let result = self.round_trip::<A>(op, body, timeout);
        self.trace_call(op, started, job, result.as_ref().ok(), false);
        result
    }

    fn round_trip<A: Answer>(
        &mut self,
        op: &str,
        body: &impl Serialize,
        timeout: Duration,
    ) -> Result<A, CallError> {
        let sent = self.send(op, body)?;
        self.receive(&sent, timeout)
    }

    /// Writes one request and returns at once: its answer is read by
    /// [`Worker::receive_as`], in the order the requests were sent. A lane
    /// sends the next job's request before it reads the last one's answer,
    /// so that the worker goes from one to the next without waiting.
    pub fn send(&mut self, op: &str, body: &impl Serialize) -> Result<Sent, CallError> {
        let at = Instant::now();
        let id = self.next_id;
        self.next_id += 1;
        let line = request_line(id, op, body);
        if self
            .stdin
            .write_all(line.as_bytes())
            .and_then(|_| self.stdin.flush())
            .is_err()
        {
            return Err(self.crashed());
        }
        self.pending += 1;
        Ok(Sent {
            id,
            op: op.to_string(),
            at,
        })
    }

    /// The answer to a request [`Worker::send`] wrote, at most `timeout`
    /// after the worker could start on it (when it was sent, or when the
    /// answer before it was read, whichever is later). Traced as a span from
    /// that moment, so that a request sent ahead is not counted twice.
    pub fn receive_as<A: Answer>(
        &mut self,
        sent: &Sent,
        job: Option<&str>,
        timeout: Duration,
    ) -> Result<A, CallError> {
        let from = self.could_start(sent);
        let result = self.receive::<A>(sent, timeout);
        self.trace_call(&sent.op, from, job, result.as_ref().ok(), sent.at < from);
        result
    }

    /// A call's trace span, from `from`: the round trip, with the worker's
    /// own time and wait in it (an answer of `None`: lost).
    fn trace_call<A: Answer>(
        &self,
        op: &str,
        from: Instant,
        job: Option<&str>,
        answer: Option<&A>,
        sent_ahead: bool,
    ) {
        if !crate::trace::enabled() {
            return;
        }
        let outcome = match answer {
            Some(a) if a.ok() => "ok",
            Some(_) => "failed",
            None => "lost",
        };
        crate::trace::span(
            &self.name,
            op,
            from,
            json!({"job": job, "worker_us": answer.and_then(Answer::worker_us),
                   "outcome": outcome, "sent_ahead": sent_ahead,
                   "met": answer.is_some().then(|| self.lines.met().as_str()),
                   // How the worker met the request (workers that say).
                   "worker_met": answer.and_then(Answer::worker_met),
                   "worker_idle_us": answer.and_then(Answer::worker_idle_us),
                   // Where the worker's own time began, on this trace's clock.
                   "worker_at_us": answer.and_then(Answer::worker_at_ns).and_then(crate::trace::trace_us)}),
        );
    }

    /// When the worker could start on `sent`: a request that was sent while
    /// an earlier one was under way waits for that one's answer.
    fn could_start(&self, sent: &Sent) -> Instant {
        self.last_answer.map_or(sent.at, |read| read.max(sent.at))
    }

    fn receive<A: Answer>(&mut self, sent: &Sent, timeout: Duration) -> Result<A, CallError> {
        let (id, op) = (sent.id, sent.op.as_str());
        let started = self.could_start(sent);
        let wait = Wait::around(
            started,
            self.expected.get(op).copied(),
            self.spin,
            started + timeout,
        );
        let read = self.lines.next_line(wait);
        self.last_answer = Some(Instant::now());
        self.last_done = self.last_answer;
        self.pending = self.pending.saturating_sub(1);
        match read {
            Ok(Some(text)) => {
                let response = A::parse(&text).map_err(|e| {
                    CallError::Protocol(format!("not an answer to `{op}` ({e}): {text}"))
                })?;
                // We kill a worker on timeout, so a late answer to an earlier
                // request cannot arrive, and answers come in the order their
                // requests were sent: any other id is a protocol error.
                match response.id() {
                    Some(got) if got == id => {
                        if let (Some(at), Some(us)) =
                            (response.worker_at_ns(), response.worker_us())
                        {
                            if us.is_finite() && us >= 0.0 {
                                let done =
                                    crate::trace::instant_of(at.saturating_add((us * 1e3) as u64));
                                // Not before the worker could start on the request, nor
                                // after its answer was read: a worker on another clock
                                // (a wrapper in another time namespace) cannot cut a rest
                                // short or stretch it.
                                self.last_done = self
                                    .last_answer
                                    .map(|read| done.clamp(started.min(read), read));
                            }
                        }
                        if let (true, Some(us)) = (response.ok(), response.worker_us()) {
                            if us.is_finite() && us >= 0.0 && us < timeout.as_secs_f64() * 1e6 {
                                let us = Duration::from_secs_f64(us / 1e6);
                                match self.expected.get_mut(op) {
                                    Some(e) => *e = us,
                                    None => {
                                        self.expected.insert(op.to_string(), us);
                                    }
                                }
                            }
                        }
                        Ok(response)
                    }
                    _ => Err(CallError::Protocol(format!(
                        "response for another request: {text}"
                    ))),
                }
            }
            Ok(None) | Err(ReadError::Io) => Err(self.crashed()),
            Err(ReadError::Timeout) => {
                self.kill();
                Err(CallError::Timeout(timeout.as_secs_f64()))
            }
        }
    }

    fn crashed(&mut self) -> CallError {
        // Give the process a moment to finish exiting so the status is known.
        let status = wait_for_exit(&mut self.child, Duration::from_millis(500));
        let status = match status {
            Some(s) => describe_exit(s),
            None => {
                self.kill();
                "stopped answering".into()
            }
        };
        CallError::Crash {
            status,
            stderr: tail(&self.log, 6),
        }
    }

    /// SIGTERM, a grace period, then SIGKILL.
    pub fn kill(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signalling our own child process.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        if wait_for_exit(&mut self.child, KILL_GRACE).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Asks the worker to exit; kills it if it does not.
    pub fn shutdown(mut self) {
        if self
            .call("shutdown", json!({}), Duration::from_secs(5))
            .is_err()
        {
            return;
        }
        if wait_for_exit(&mut self.child, Duration::from_secs(2)).is_none() {
            self.kill();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn wait_for_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "exited".into(),
    }
}

/// The last `n` non-empty lines of a log file.
pub fn tail(path: &Path, n: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scheduling policy of process `pid` (/proc/PID/stat, field 41).
    fn policy(pid: u32) -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // The command name (field 2) is in parentheses and may hold spaces.
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(41 - 3).unwrap().parse().unwrap()
    }

    #[test]
    fn a_background_worker_runs_under_sched_idle_and_a_lane_does_not() {
        let dir = tempfile::tempdir().unwrap();
        for background in [true, false] {
            let spec = WorkerSpec {
                python: "python3".into(),
                python_path: vec![],
                role: "compile".into(),
                interpret: false,
                visible_device: None,
                visible_var: "CUDA_VISIBLE_DEVICES",
                target: Some("cuda:90:32".into()),
                triton_cache: None,
                log: dir.path().join("worker.log"),
                background,
            };
            // The policy is set before exec, so it holds from the first
            // instruction (the worker need not even import).
            let worker = Worker::spawn(&spec).unwrap();
            let expected = if background {
                libc::SCHED_IDLE
            } else {
                libc::SCHED_OTHER
            };
            assert_eq!(policy(worker.pid()), expected, "background: {background}");
        }
    }

    #[test]
    fn a_request_line_leads_with_its_id_and_op() {
        let line = request_line(7, "check", &json!({"job_id": "j", "args": [{"i32": 1}]}));
        assert_eq!(
            line,
            "{\"id\":7,\"op\":\"check\",\"job_id\":\"j\",\"args\":[{\"i32\":1}]}\n"
        );
        assert_eq!(
            request_line(8, "shutdown", &json!({})),
            "{\"id\":8,\"op\":\"shutdown\"}\n"
        );
        let back: Json =
            serde_json::from_str(&request_line(9, "sample", &json!({"count": 3}))).unwrap();
        assert_eq!(back, json!({"id": 9, "op": "sample", "count": 3}));
    }

    /// A worker that answers each request line after `sleep` seconds, in
    /// order, with the request's id and op.
    fn echo_worker(sleep: f64, dir: &Path) -> Worker {
        let script = format!(
            "import json, sys, time\nfor line in sys.stdin:\n    r = json.loads(line)\n    time.sleep({sleep})\n    print(json.dumps({{'id': r['id'], 'ok': True, 'op': r['op'], 'worker_us': {sleep} * 1e6}}), flush=True)\n"
        );
        let mut cmd = Command::new("python3");
        cmd.args(["-c", &script]);
        Worker::start(cmd, &dir.join("echo.log"), "echo".into()).expect("python3 starts")
    }

    #[test]
    fn requests_sent_ahead_are_answered_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = echo_worker(0.02, dir.path());
        let timeout = Duration::from_secs(10);
        let first = w.send("check", &json!({"job_id": "a"})).unwrap();
        let second = w.send("check", &json!({"job_id": "b"})).unwrap();
        assert_eq!(second.op(), "check");
        assert_eq!(w.pending(), 2);
        // Before the first answer is read, the second counts from when it
        // was sent; after, from that answer: it could not start before.
        assert_eq!(w.could_start(&second), second.at);
        let a: Json = w.receive_as(&first, Some("a"), timeout).unwrap();
        assert!(w.could_start(&second) > second.at);
        assert_eq!(w.pending(), 1);
        let b: Json = w.receive_as(&second, Some("b"), timeout).unwrap();
        assert_eq!(
            (a["id"].as_u64(), b["id"].as_u64()),
            (Some(first.id), Some(second.id))
        );
        // An answer read for the wrong request is a protocol error.
        let third = w.send("check", &json!({})).unwrap();
        let fourth = w.send("check", &json!({})).unwrap();
        match w.receive_as::<Json>(&fourth, None, timeout) {
            Err(CallError::Protocol(m)) => assert!(m.contains("another request"), "{m}"),
            other => panic!("{other:?}"),
        }
        let _ = third;
    }

    #[test]
    fn last_done_is_when_the_worker_finished_its_answer_where_it_says() {
        let dir = tempfile::tempdir().unwrap();
        // Reads the request, says it worked 30 ms (its `worker_us`), and
        // answers 100 ms after reading it: it finished about 70 ms before the
        // lane read the answer.
        let script = "import json, sys, time\nfor line in sys.stdin:\n    at = time.monotonic_ns()\n    r = json.loads(line)\n    time.sleep(0.1)\n    print(json.dumps({'id': r['id'], 'ok': True, 'at_ns': at, 'worker_us': 30000.0}), flush=True)\n";
        let mut cmd = Command::new("python3");
        cmd.args(["-c", script]);
        let mut w = Worker::start(cmd, &dir.path().join("w.log"), "w".into()).unwrap();
        assert_eq!(w.last_done(), None);
        let sent = Instant::now();
        let _: Json = w.call("check", json!({}), Duration::from_secs(10)).unwrap();
        let read = Instant::now();
        let done = w.last_done().unwrap();
        // Its own 30 ms counted from when it read the request.
        assert!(
            done >= sent + Duration::from_millis(30),
            "{:?}",
            done - sent
        );
        assert!(
            done + Duration::from_millis(50) < read,
            "done {:?} before the answer was read",
            read - done
        );
        // A worker that does not say when it read the request: done when read.
        let mut echo = echo_worker(0.05, dir.path());
        let before = Instant::now();
        let _: Json = echo
            .call("check", json!({}), Duration::from_secs(10))
            .unwrap();
        assert!(echo.last_done().unwrap() >= before + Duration::from_millis(50));
    }
}
