//! Reading a peer's JSON lines with a deadline, without paying for waking an
//! idle CPU each time a line arrives.
//!
//! A worker call is two hand-offs through a pipe: the request wakes the
//! worker, the response wakes the lane. A side that sleeps in `poll` until its
//! line comes lets its CPU go idle, and the write that ends the wait must then
//! wake that CPU: on a host whose cores idle in deep states, or a virtual
//! machine whose idle vCPUs halt, that costs tens to hundreds of microseconds
//! per hand-off, the longer the sleep the more, while the bytes themselves
//! take a few. So a waiting side spins for a bounded window when its line is
//! due: it polls without sleeping, and sleeps outside the window, or as soon
//! as another thread wants a CPU (docs/worker-protocol.md, "Waiting for a
//! line").

use std::io::Read;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// `TUNELAB_SPIN_US`: how long a waiting side spins, in microseconds, where
/// the runner and its lane workers read it; 0 never spins (every wait sleeps).
pub const SPIN_VAR: &str = "TUNELAB_SPIN_US";

/// How long a lane spins for a reply it cannot predict, and the least window
/// around one it can.
pub const LANE_SPIN: Duration = Duration::from_millis(2);

/// The most a lane spins around a predicted reply.
pub const LANE_SPIN_MAX: Duration = Duration::from_millis(20);

/// How long a lane worker (Python or native) spins for its next request
/// after answering one: the runner's own work between two calls is tens of
/// microseconds, but on a native lane a worker waits while the other worker
/// answers: the Python worker 17 ms (median; 36 ms p90) from a job's
/// `compare` to the next job's `recipe` in the H200's native grid run.
pub const WORKER_SPIN: Duration = Duration::from_millis(50);

/// A spin step (a poll) that takes longer than this was preempted: another
/// thread wanted the CPU, and the wait sleeps for the rest of it.
pub const CONTENDED: Duration = Duration::from_micros(50);

/// How often a spin looks whether the host is [`crowded`].
pub const CROWD_LOOK: Duration = Duration::from_micros(100);

/// Whether more threads are runnable than the host has CPUs online
/// (`/proc/loadavg`; never where there is none): one of them waits for a
/// CPU, and a spin would keep it waiting, since the scheduler places a woken
/// thread on an idle CPU and a spinning one does not look idle. The waiting
/// side sleeps instead; its CPU, wanted, will not idle.
pub fn crowded() -> bool {
    use std::os::unix::fs::FileExt;
    use std::sync::OnceLock;
    static LOADAVG: OnceLock<Option<(std::fs::File, u64)>> = OnceLock::new();
    let Some((file, cpus)) = LOADAVG.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let file = std::fs::File::open("/proc/loadavg").ok()?;
        (cpus > 0).then_some((file, cpus as u64))
    }) else {
        return false;
    };
    let mut buf = [0u8; 128];
    let Ok(n) = file.read_at(&mut buf, 0) else {
        return false;
    };
    runnable(&buf[..n]).is_some_and(|r| r > *cpus)
}

/// The runnable threads `/proc/loadavg` counts ("0.20 0.18 0.12 2/81 1234": 2).
fn runnable(loadavg: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(loadavg).ok()?;
    let field = text.split_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

/// The spin `TUNELAB_SPIN_US` asks for, else `default`.
pub fn spin_from_env(default: Duration) -> Duration {
    std::env::var(SPIN_VAR)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(default, Duration::from_micros)
}

/// How to wait for the next line: asleep until `wake` (unless the line comes
/// first), then spinning until `spin_until`, then asleep until `deadline`,
/// which without a line is a timeout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Wait {
    pub wake: Instant,
    pub spin_until: Instant,
    pub deadline: Instant,
}

impl Wait {
    /// Spin from now for `spin`, then sleep until `deadline`.
    pub fn spin_then_sleep(spin: Duration, deadline: Instant) -> Wait {
        let now = Instant::now();
        Wait {
            wake: now,
            spin_until: now + spin,
            deadline,
        }
    }

    /// For a reply expected `expected` after `started`: asleep through the
    /// first part of the call, spinning through a window around when it
    /// should end (from half to one and a half times the expected time, at
    /// least `spin` long, at most [`LANE_SPIN_MAX`]), asleep again after it. Without an expectation,
    /// spinning from the start for `spin`. A zero `spin` never spins.
    pub fn around(
        started: Instant,
        expected: Option<Duration>,
        spin: Duration,
        deadline: Instant,
    ) -> Wait {
        if spin.is_zero() {
            return Wait {
                wake: started,
                spin_until: started,
                deadline,
            };
        }
        let Some(expected) = expected else {
            return Wait {
                wake: started,
                spin_until: started + spin,
                deadline,
            };
        };
        let window = expected.clamp(spin, LANE_SPIN_MAX.max(spin));
        // Centred on the expected end; one that would start before the call
        // did starts with it, and lasts at least `spin`.
        let wake = started + expected.saturating_sub(window / 2);
        Wait {
            wake,
            spin_until: (started + expected + window / 2).max(wake + spin),
            deadline,
        }
    }
}

pub enum ReadError {
    Timeout,
    /// Reading failed: treated like the peer exiting.
    Io,
}

/// Lines from a pipe, read in the calling thread with a deadline.
///
/// `poll` waits for data, so a line reaches the waiting thread without a
/// hand-off through a reader thread: on a host whose cores are all busy
/// compiling, each such hand-off is a scheduler wake-up, and a lane makes
/// several calls per job.
pub struct LineReader<R> {
    src: R,
    buf: Vec<u8>,
    /// Where each read lands, made once: zeroing 64 KiB on the stack at
    /// every line was a few of the 9-14 µs a native worker took from
    /// writing an answer to looking for its next request (H100 trace,
    /// 2026-11-24).
    chunk: Box<[u8]>,
    met: Met,
}

/// How the last line was met: what the reader was doing when its last byte
/// came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Met {
    /// It was there when the reader looked.
    Ready,
    /// The reader was spinning: no CPU to wake.
    Spinning,
    /// The reader was asleep (before its window, after it, or never spinning).
    Asleep,
}

impl Met {
    pub fn as_str(self) -> &'static str {
        match self {
            Met::Ready => "ready",
            Met::Spinning => "spinning",
            Met::Asleep => "asleep",
        }
    }
}

impl<R: Read + AsRawFd> LineReader<R> {
    pub fn new(src: R) -> LineReader<R> {
        LineReader {
            src,
            buf: Vec::with_capacity(64 * 1024),
            chunk: vec![0u8; 64 * 1024].into_boxed_slice(),
            met: Met::Ready,
        }
    }

    /// How the last line [`LineReader::next_line`] returned was met.
    pub fn met(&self) -> Met {
        self.met
    }

    /// The next line without its newline; `None` at end of file (a last
    /// line without a newline comes first, as `BufRead::lines` gives it).
    pub fn next_line(&mut self, wait: Wait) -> Result<Option<String>, ReadError> {
        self.met = Met::Ready;
        let mut spin_until = wait.spin_until;
        let mut next_look = wait.wake;
        // A deadline that passed while the reader was busy elsewhere (a lane
        // that sent a request ahead and then waited for a compile) is not
        // the peer's lateness: the pipe gets one look before it times out.
        let mut looked_at_deadline = false;
        // The first look polls without waiting and without asking whether
        // the host is crowded: a line already in the pipe (a request sent
        // ahead, met `ready`) is read at once. The crowd check reads
        // /proc/loadavg, and it was about 10 µs of the 11-16 µs a native
        // worker took from looking for such a request to finding it (H100
        // trace, 2026-11-24).
        let mut first_look = true;
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return Ok(Some(
                    String::from_utf8_lossy(&line[..line.len() - 1]).into_owned(),
                ));
            }
            let now = Instant::now();
            let at_deadline = now >= wait.deadline;
            if at_deadline && looked_at_deadline {
                return Err(ReadError::Timeout);
            }
            looked_at_deadline |= at_deadline;
            let spinning = at_deadline || (now >= wait.wake && now < spin_until);
            if spinning && !at_deadline && !first_look && now >= next_look {
                next_look = now + CROWD_LOOK;
                if crowded() {
                    spin_until = now;
                    continue;
                }
            }
            let wait_ms = if spinning || first_look {
                0
            } else if now < wait.wake {
                // Round down: waking a little early only spins a little longer.
                let until = wait.wake.min(wait.deadline);
                until.saturating_duration_since(now).as_millis() as libc::c_int
            } else {
                // Round up, so a deadline less than a millisecond away still waits.
                let left = wait.deadline.saturating_duration_since(now);
                left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int
            };
            let mut fds = libc::pollfd {
                fd: self.src.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd that lives across the call.
            let ready = unsafe { libc::poll(&mut fds, 1, wait_ms) };
            if ready < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue; // Ctrl-C: the runner finishes this call first
                }
                return Err(ReadError::Io);
            }
            let looked_first = std::mem::replace(&mut first_look, false);
            if ready > 0 {
                self.met = if looked_first {
                    Met::Ready
                } else if wait_ms == 0 {
                    Met::Spinning
                } else {
                    Met::Asleep
                };
            }
            if ready == 0 {
                if wait_ms == 0 && spinning {
                    // No yield: a yield hands the CPU to whatever else is
                    // runnable on it for a whole slice (milliseconds), and a
                    // reply coming meanwhile waits that long. Others get
                    // the CPU when the host is crowded (above), or by
                    // preempting the spin, which ends it.
                    std::hint::spin_loop();
                    if now.elapsed() > CONTENDED {
                        // Preempted: this CPU is wanted, so it will not
                        // idle, and sleeping costs no wake-up from idle.
                        spin_until = now;
                    }
                }
                continue; // the deadline is checked at the top
            }
            match self.src.read(&mut self.chunk) {
                Ok(0) => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    let line = std::mem::take(&mut self.buf);
                    return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
                }
                Ok(n) => self.buf.extend_from_slice(&self.chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(ReadError::Io),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_runnable_threads_are_read_from_loadavg() {
        assert_eq!(runnable(b"0.20 0.18 0.12 2/81 1234\n"), Some(2));
        assert_eq!(runnable(b"garbage"), None);
        // Whatever the host's load, asking is safe.
        let _ = crowded();
    }

    #[test]
    fn a_wait_without_an_expectation_spins_first() {
        let t = Instant::now();
        let w = Wait::around(t, None, ms(2), t + ms(100));
        assert_eq!((w.wake, w.spin_until), (t, t + ms(2)));
        // Zero spin: the old behaviour, asleep the whole call.
        let w = Wait::around(t, Some(ms(10)), Duration::ZERO, t + ms(100));
        assert_eq!((w.wake, w.spin_until), (t, t));
    }

    #[test]
    fn a_predicted_reply_is_met_by_a_window_around_it() {
        let t = Instant::now();
        // 14 ms expected: from 7 ms to 21 ms.
        let w = Wait::around(t, Some(ms(14)), ms(2), t + ms(1000));
        assert_eq!((w.wake - t, w.spin_until - t), (ms(7), ms(21)));
        // A short call: the window starts with it.
        let w = Wait::around(t, Some(Duration::from_micros(300)), ms(2), t + ms(1000));
        assert_eq!(w.wake, t);
        assert_eq!(w.spin_until - t, ms(2));
        // A long one: at most LANE_SPIN_MAX wide.
        let w = Wait::around(t, Some(ms(1000)), ms(2), t + ms(5000));
        assert_eq!(w.spin_until - w.wake, LANE_SPIN_MAX);
    }

    #[test]
    fn a_line_waiting_in_the_pipe_is_read_though_its_deadline_passed() {
        let (mut tx, rx) = UnixStream::pair().unwrap();
        let mut lines = LineReader::new(rx);
        tx.write_all(b"done\n").unwrap();
        let past = Instant::now() - ms(10);
        let wait = Wait {
            wake: past,
            spin_until: past,
            deadline: past,
        };
        assert_eq!(
            lines.next_line(wait).ok().flatten().as_deref(),
            Some("done")
        );
        // Nothing there: a timeout after that one look, at once.
        let t = Instant::now();
        assert!(matches!(lines.next_line(wait), Err(ReadError::Timeout)));
        assert!(t.elapsed() < ms(1000));
    }

    #[test]
    fn a_line_already_in_the_pipe_is_met_ready_whatever_the_wait() {
        let (mut tx, rx) = UnixStream::pair().unwrap();
        let mut lines = LineReader::new(rx);
        let t = Instant::now();
        // Spinning from the start, asleep until its window, never spinning.
        for wait in [
            Wait::spin_then_sleep(ms(50), t + ms(5000)),
            Wait::around(t, Some(ms(1000)), ms(2), t + ms(5000)),
            Wait::around(t, None, Duration::ZERO, t + ms(5000)),
        ] {
            tx.write_all(b"queued\n").unwrap();
            assert_eq!(
                lines.next_line(wait).ok().flatten().as_deref(),
                Some("queued")
            );
            assert_eq!(lines.met(), Met::Ready);
        }
        // The window's sleep was not waited out: the line was there.
        assert!(t.elapsed() < ms(400));
    }

    #[test]
    fn lines_arrive_whole_through_sleep_spin_and_timeout() {
        let (mut tx, rx) = UnixStream::pair().unwrap();
        let mut lines = LineReader::new(rx);
        tx.write_all(b"one\ntwo\nthr").unwrap();
        let soon = || Wait::spin_then_sleep(ms(1), Instant::now() + ms(500));
        assert_eq!(
            lines.next_line(soon()).ok().flatten().as_deref(),
            Some("one")
        );
        assert_eq!(
            lines.next_line(soon()).ok().flatten().as_deref(),
            Some("two")
        );
        // Nothing more within the deadline: a timeout, the partial line kept.
        let t = Instant::now();
        let late = Wait::around(t, Some(ms(20)), ms(2), t + ms(40));
        assert!(matches!(lines.next_line(late), Err(ReadError::Timeout)));
        assert!(t.elapsed() >= ms(40));
        // A line written while the reader sleeps, then spins.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(ms(30));
            tx.write_all(b"ee\n").unwrap();
            tx.write_all(b"last").unwrap();
        });
        let t = Instant::now();
        let w = Wait::around(t, Some(ms(30)), ms(2), t + ms(5000));
        assert_eq!(lines.next_line(w).ok().flatten().as_deref(), Some("three"));
        writer.join().unwrap();
        assert_ne!(lines.met(), Met::Ready);
        // End of file: the last line without a newline, then None.
        assert_eq!(
            lines.next_line(soon()).ok().flatten().as_deref(),
            Some("last")
        );
        assert!(matches!(lines.next_line(soon()), Ok(None)));
        // Never spinning: met asleep.
        let (mut tx, rx) = UnixStream::pair().unwrap();
        let mut lines = LineReader::new(rx);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(ms(5));
            tx.write_all(b"x\n").unwrap();
        });
        let t = Instant::now();
        let w = Wait::around(t, None, Duration::ZERO, t + ms(5000));
        assert_eq!(lines.next_line(w).ok().flatten().as_deref(), Some("x"));
        assert_eq!(lines.met(), Met::Asleep);
        writer.join().unwrap();
    }
}
