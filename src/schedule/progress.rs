//! The progress display: jobs done of total, failures, ETA and the current
//! best per shape, redrawn on one terminal line. Silent when stderr is not a
//! terminal (CI logs get the final summary only).

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::Instant;

use crate::manifest::shape_label;
use crate::store::{JobRecord, JobStatus};

pub struct Progress {
    total: u64,
    done: u64,
    failed: u64,
    started: Instant,
    enabled: bool,
    best: HashMap<String, (f64, String)>,
    last_shape: String,
}

impl Progress {
    pub fn new(total: u64, wanted: bool) -> Progress {
        Progress {
            total,
            done: 0,
            failed: 0,
            started: Instant::now(),
            enabled: wanted && std::io::stderr().is_terminal(),
            best: HashMap::new(),
            last_shape: String::new(),
        }
    }

    pub fn job(&mut self, r: &JobRecord) {
        self.done += 1;
        if r.status == JobStatus::Failed {
            self.failed += 1;
        }
        let shape = shape_label(&r.shape);
        if let (JobStatus::Ok, Some(s)) = (r.status, &r.stats) {
            let entry = self
                .best
                .entry(format!("{shape} {}", r.method))
                .or_insert((f64::INFINITY, String::new()));
            if s.median_us < entry.0 {
                *entry = (s.median_us, r.method.clone());
            }
        }
        self.last_shape = format!("{shape} {}", r.method);
        if !self.enabled {
            return;
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let eta = if self.done > 0 {
            elapsed / self.done as f64 * self.total.saturating_sub(self.done) as f64
        } else {
            0.0
        };
        let best = self
            .best
            .get(&self.last_shape)
            .map(|(us, _)| format!("best {us:.1} us"))
            .unwrap_or_default();
        let line = format!(
            "[{}/{}] failed {}  ETA {:.0}s  {}  {}",
            self.done, self.total, self.failed, eta, self.last_shape, best
        );
        let width = 118;
        let shown: String = line.chars().take(width).collect();
        let mut err = std::io::stderr();
        let _ = write!(err, "\r{shown:<width$}");
        let _ = err.flush();
    }

    /// A line of its own (a warning), above the progress line.
    pub fn note(&mut self, line: &str) {
        if self.enabled {
            eprint!("\r{:<118}\r", "");
        }
        eprintln!("{line}");
    }

    pub fn finish(&mut self) {
        if self.enabled {
            eprintln!();
        }
    }
}
