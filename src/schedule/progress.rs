//! The progress display: jobs done of total, failures, ETA. On a terminal,
//! one line redrawn after every job, with the current best of its shape and
//! method. Elsewhere (a log file, a pipe, CI), plain lines without control
//! characters: one every [`PLAIN_EVERY`] while the run goes on, and one each
//! time another tenth of the jobs is done, then a last one when the run ends.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::manifest::shape_label;
use crate::store::{JobRecord, JobStatus};

/// The longest a log goes without a progress line while a run is under way.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// Where progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// `--quiet`, or a run that shares the terminal with others.
    Off,
    /// stderr is a terminal: one line, redrawn.
    Terminal,
    /// stderr is a file or a pipe: plain lines.
    Plain,
}

pub struct Progress {
    total: u64,
    done: u64,
    failed: u64,
    /// When the run started (the command's figure counts from there too).
    started: Instant,
    /// When the lanes began: the job rate, and so the ETA, counts from here,
    /// past the workers' start-up.
    jobs_began: Instant,
    style: Style,
    best: HashMap<String, (f64, String)>,
    last_shape: String,
    /// When the last plain line was written.
    last_line: Instant,
    /// The tenth of the total whose completion writes the next plain line.
    next_tenth: u64,
    /// What is counted: "jobs", or an A/B's "pairs".
    unit: &'static str,
}

impl Progress {
    pub fn new(total: u64, wanted: bool, started: Instant) -> Progress {
        let style = if !wanted {
            Style::Off
        } else if std::io::stderr().is_terminal() {
            Style::Terminal
        } else {
            Style::Plain
        };
        let now = Instant::now();
        Progress {
            total,
            done: 0,
            failed: 0,
            started,
            jobs_began: now,
            style,
            best: HashMap::new(),
            last_shape: String::new(),
            last_line: now,
            next_tenth: 1,
            unit: "jobs",
        }
    }

    /// The display of an A/B run: it counts pairs.
    pub fn of_pairs(mut self) -> Progress {
        self.unit = "pairs";
        self
    }

    /// An A/B pair is done (its own line was written above with `note`).
    pub fn pair(&mut self, failed: bool) {
        self.done += 1;
        self.failed += u64::from(failed);
        self.count_done();
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
        self.count_done();
    }

    /// After each job or pair: the terminal line redrawn, a plain line when due.
    fn count_done(&mut self) {
        match self.style {
            Style::Off => {}
            Style::Terminal => self.redraw(),
            Style::Plain => {
                let tenth = tenths(self.done, self.total);
                if tenth >= self.next_tenth || self.last_line.elapsed() >= PLAIN_EVERY {
                    self.next_tenth = tenth + 1;
                    self.plain();
                }
            }
        }
    }

    /// Called while no job finishes: a plain line when one is due.
    pub fn tick(&mut self) {
        if self.style == Style::Plain && self.last_line.elapsed() >= PLAIN_EVERY {
            self.plain();
        }
    }

    /// A line of its own (a warning), above the progress line.
    pub fn note(&mut self, line: &str) {
        if self.style == Style::Terminal {
            eprint!("\r{:<118}\r", "");
        }
        eprintln!("{line}");
    }

    pub fn finish(&mut self) {
        match self.style {
            Style::Off => {}
            Style::Terminal => eprintln!(),
            Style::Plain => eprintln!(
                "{}",
                final_line(self.done, self.total, self.failed, self.elapsed()).replacen(
                    " jobs done",
                    &format!(" {} done", self.unit),
                    1
                )
            ),
        }
    }

    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Seconds left at the rate jobs have gone so far, once one is done.
    fn eta(&self) -> Option<f64> {
        let spent = self.jobs_began.elapsed().as_secs_f64();
        (self.done > 0)
            .then(|| spent / self.done as f64 * self.total.saturating_sub(self.done) as f64)
    }

    fn plain(&mut self) {
        self.last_line = Instant::now();
        eprintln!("{}", self.plain_text());
    }

    /// The plain line as of now, in this display's unit.
    fn plain_text(&self) -> String {
        plain_line(
            self.done,
            self.total,
            self.failed,
            self.elapsed(),
            self.eta(),
        )
        .replacen(" jobs done", &format!(" {} done", self.unit), 1)
    }

    fn redraw(&self) {
        let eta = self.eta().unwrap_or(0.0);
        let best = self
            .best
            .get(&self.last_shape)
            .map(|(us, _)| format!("best {us:.1} us"))
            .unwrap_or_default();
        let line = format!(
            "[{}/{} {}] failed {}  ETA {:.0}s  {}  {}",
            self.done, self.total, self.unit, self.failed, eta, self.last_shape, best
        );
        let width = 118;
        let shown: String = line.chars().take(width).collect();
        let mut err = std::io::stderr();
        let _ = write!(err, "\r{shown:<width$}");
        let _ = err.flush();
    }
}

/// How many whole tenths of `total` `done` is.
fn tenths(done: u64, total: u64) -> u64 {
    done.saturating_mul(10).checked_div(total).unwrap_or(10)
}

/// `progress: 12/37 jobs done (32 %), 0 failed, 41.0 s elapsed, ETA 1 min 25 s`.
fn plain_line(done: u64, total: u64, failed: u64, elapsed_s: f64, eta_s: Option<f64>) -> String {
    let percent = done.saturating_mul(100).checked_div(total).unwrap_or(100);
    let eta = match eta_s {
        Some(left) => format!("ETA {}", duration(left)),
        None => "ETA not known yet".to_string(),
    };
    format!(
        "progress: {done}/{total} jobs done ({percent} %), {failed} failed, {} elapsed, {eta}",
        duration(elapsed_s)
    )
}

/// The last line: `progress: 37/37 jobs done, 0 failed, in 1 min 03 s`.
fn final_line(done: u64, total: u64, failed: u64, elapsed_s: f64) -> String {
    let stopped = if done < total {
        " (stopped before the rest)"
    } else {
        ""
    };
    format!(
        "progress: {done}/{total} jobs done{stopped}, {failed} failed, in {}",
        duration(elapsed_s)
    )
}

/// `0.4 s`, `41.0 s`, `1 min 27 s`, `2 h 05 min`.
fn duration(s: f64) -> String {
    if !s.is_finite() || s < 59.95 {
        return format!("{:.1} s", s.max(0.0));
    }
    let total = s.round() as u64;
    let (h, m, sec) = (total / 3600, (total % 3600) / 60, total % 60);
    if h > 0 {
        format!("{h} h {m:02} min")
    } else {
        format!("{m} min {sec:02} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An A/B run counts its pairs (a log showed `0/74 jobs done` to the end).
    #[test]
    fn an_ab_display_counts_pairs_done_and_failed() {
        let mut p = Progress::new(74, false, Instant::now()).of_pairs();
        p.pair(false);
        p.pair(true);
        let line = p.plain_text();
        assert!(
            line.starts_with("progress: 2/74 pairs done (2 %), 1 failed"),
            "{line}"
        );
        assert!(!line.contains("ETA not known"), "{line}");
    }

    #[test]
    fn plain_lines_say_done_failed_elapsed_and_eta_without_control_characters() {
        assert_eq!(
            plain_line(12, 37, 1, 41.0, Some(85.4)),
            "progress: 12/37 jobs done (32 %), 1 failed, 41.0 s elapsed, ETA 1 min 25 s"
        );
        assert_eq!(
            plain_line(0, 8520, 0, 3.2, None),
            "progress: 0/8520 jobs done (0 %), 0 failed, 3.2 s elapsed, ETA not known yet"
        );
        assert_eq!(
            final_line(37, 37, 0, 63.4),
            "progress: 37/37 jobs done, 0 failed, in 1 min 03 s"
        );
        assert_eq!(
            final_line(5, 37, 0, 7200.0),
            "progress: 5/37 jobs done (stopped before the rest), 0 failed, in 2 h 00 min"
        );
        for line in [
            plain_line(3, 4, 0, 1.0, Some(0.3)),
            final_line(4, 4, 0, 2.0),
        ] {
            assert!(line.chars().all(|c| !c.is_control()), "{line:?}");
        }
    }

    #[test]
    fn a_plain_line_comes_at_each_tenth_of_the_jobs() {
        // 37 jobs: the tenths end at jobs 4, 8, 12, ..., 37.
        let at: Vec<u64> = (1..=37u64)
            .scan(1u64, |next, done| {
                let t = tenths(done, 37);
                Some(if t >= *next {
                    *next = t + 1;
                    Some(done)
                } else {
                    None
                })
            })
            .flatten()
            .collect();
        assert_eq!(at, vec![4, 8, 12, 15, 19, 23, 26, 30, 34, 37]);
        // Fewer jobs than tenths: a line for each.
        assert_eq!(tenths(1, 3), 3);
        assert_eq!(tenths(0, 0), 10);
    }
}
