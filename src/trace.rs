//! A timeline of one run, for `tunelab run --trace FILE`.
//!
//! Every worker call (its round trip, and the time the worker itself says it
//! spent), every job in a lane, every compile and every journal append becomes
//! one span on a named track. The file is Chrome's trace-event JSON, so
//! Perfetto (ui.perfetto.dev) or chrome://tracing shows it as a timeline;
//! `bench/tuning_speed.py` reads it to split a run's wall time into start-up,
//! compile, GPU and runner overhead.
//!
//! Off unless enabled: then a call costs one atomic load.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};

static ENABLED: AtomicBool = AtomicBool::new(false);
static TRACE: OnceLock<Trace> = OnceLock::new();

struct Span {
    track: String,
    name: String,
    start_us: f64,
    dur_us: f64,
    args: Json,
}

struct Trace {
    origin: Instant,
    /// `origin` on the host's monotonic clock ([`monotonic_ns`]), to place
    /// the times workers report on that clock on this trace's.
    origin_monotonic_ns: u64,
    spans: Mutex<Vec<Span>>,
}

/// Start recording; time zero is now.
pub fn enable() {
    TRACE.get_or_init(|| Trace {
        origin: Instant::now(),
        origin_monotonic_ns: monotonic_ns(),
        spans: Mutex::new(Vec::new()),
    });
    ENABLED.store(true, Ordering::Relaxed);
}

/// Now on the host's monotonic clock (`CLOCK_MONOTONIC`), in nanoseconds:
/// one clock for every process on the host (Python's `time.monotonic_ns`
/// reads it too), unlike an `Instant`, which cannot leave its process. A
/// worker says when it read each request on it (`at_ns`), so the trace
/// shows where the worker's own time lies inside a call's round trip.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// A time on the host's monotonic clock (a worker's `at_ns`) as an
/// `Instant` of this process, which reads the same clock.
pub fn instant_of(monotonic: u64) -> Instant {
    let (now, now_ns) = (Instant::now(), monotonic_ns());
    if monotonic <= now_ns {
        let ago = Duration::from_nanos(now_ns - monotonic);
        now.checked_sub(ago).unwrap_or(now)
    } else {
        now + Duration::from_nanos(monotonic - now_ns)
    }
}

/// A time on the host's monotonic clock as this trace's microseconds (what
/// spans' `ts` count), or `None` when not tracing.
pub fn trace_us(monotonic: u64) -> Option<f64> {
    let trace = TRACE.get()?;
    // Subtracted as integers: exact, where two f64s of ~1e18 ns would not be.
    Some((monotonic as i64 - trace.origin_monotonic_ns as i64) as f64 / 1e3)
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Record a span on `track` that began at `start` and ends now.
pub fn span(track: &str, name: &str, start: Instant, args: Json) {
    span_to(track, name, start, Instant::now(), args);
}

/// A span that ended at `end` rather than now.
pub fn span_to(track: &str, name: &str, start: Instant, end: Instant, args: Json) {
    if !enabled() {
        return;
    }
    let Some(trace) = TRACE.get() else { return };
    let start_us = start.saturating_duration_since(trace.origin).as_secs_f64() * 1e6;
    let dur_us = end.saturating_duration_since(start).as_secs_f64() * 1e6;
    trace.spans.lock().expect("trace").push(Span {
        track: track.to_string(),
        name: name.to_string(),
        start_us,
        dur_us,
        args,
    });
}

/// Write everything recorded so far as Chrome trace-event JSON.
pub fn write(path: &Path) -> std::io::Result<usize> {
    let Some(trace) = TRACE.get() else {
        return Ok(0);
    };
    let spans = trace.spans.lock().expect("trace");
    // One thread id per track, numbered in order of first appearance, each named.
    let mut tracks: Vec<&str> = Vec::new();
    let mut events = Vec::with_capacity(spans.len() + 16);
    for s in spans.iter() {
        let tid = match tracks.iter().position(|t| *t == s.track) {
            Some(i) => i,
            None => {
                tracks.push(&s.track);
                events.push(json!({
                    "name": "thread_name", "ph": "M", "pid": 1, "tid": tracks.len() - 1,
                    "args": {"name": s.track},
                }));
                tracks.len() - 1
            }
        };
        events.push(json!({
            "name": s.name, "ph": "X", "pid": 1, "tid": tid,
            "ts": (s.start_us * 10.0).round() / 10.0,
            "dur": (s.dur_us * 10.0).round() / 10.0,
            "args": s.args,
        }));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let doc = json!({"traceEvents": events, "displayTimeUnit": "ms"});
    std::fs::write(path, serde_json::to_vec(&doc).expect("trace serialises"))?;
    Ok(spans.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_land_on_named_tracks_in_chrome_format() {
        enable();
        let t = Instant::now();
        span("lane0", "check", t, json!({"job": "abc"}));
        span("compile1", "compile", t, json!({}));
        span("lane0", "sample", t, json!({}));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        assert!(write(&path).unwrap() >= 3);
        let doc: Json = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let events = doc["traceEvents"].as_array().unwrap();
        let tid_of = |track: &str| {
            events
                .iter()
                .find(|e| e["ph"] == "M" && e["args"]["name"] == track)
                .map(|e| e["tid"].as_u64().unwrap())
                .unwrap()
        };
        let lane = tid_of("lane0");
        assert_ne!(lane, tid_of("compile1"));
        let on_lane: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["tid"].as_u64() == Some(lane))
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert!(on_lane.contains(&"check") && on_lane.contains(&"sample"));
        assert!(events
            .iter()
            .filter(|e| e["ph"] == "X")
            .all(|e| e["dur"].as_f64().unwrap() >= 0.0));
    }

    #[test]
    fn a_monotonic_time_becomes_the_instant_of_that_moment() {
        let (before, ns, after) = (Instant::now(), monotonic_ns(), Instant::now());
        let at = instant_of(ns);
        // Two readings of one clock, a few microseconds apart at most.
        let slack = Duration::from_millis(1);
        assert!(at + slack >= before && at <= after + slack);
        let earlier = instant_of(ns - 5_000_000);
        let gap = at.duration_since(earlier);
        assert!(gap.abs_diff(Duration::from_millis(5)) < slack, "{gap:?}");
    }
}
