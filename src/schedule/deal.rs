//! Dealing groups to lanes: the order (largest estimated cost first) and the
//! queue lanes take from as they free up, into which a retired lane hands
//! its unfinished work back.
//!
//! The estimate ([`estimate`]): the plan's ([`crate::plan::shard::plan_cost`],
//! job count and the shape's M) unless the results directory's journal has
//! measured the group or its method, in which case it is in seconds:
//! - a group with recorded jobs: (jobs left + the group overhead) x its
//!   measured mean seconds per job;
//! - a group without: its plan cost x the median seconds per plan unit of
//!   its method's measured groups (of all measured groups when its method
//!   has none).
//!
//! Longest first is the classic rule for list scheduling on identical
//! machines: the run's wall time is at most 4/3 of the best possible (Graham,
//! 1969), and the last groups to finish are the small ones, so lanes idle
//! little at the end.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::manifest::Shape;
use crate::plan::shard::{plan_cost, size_factor, GROUP_OVERHEAD_JOBS};
use crate::store::{JobRecord, JobStatus};

use super::lane::group_key;
use super::Group;

/// A group of the plan that has jobs to run, before it is planned in full.
#[derive(Debug, Clone)]
pub struct Pending {
    pub method: String,
    pub shape_index: usize,
    pub shape: Shape,
    /// Jobs this run will run.
    pub jobs: u64,
    /// The estimate it is dealt by.
    pub cost: f64,
}

/// Measured seconds per job, by group, from earlier records.
pub struct Measured {
    per_job: HashMap<String, f64>,
    /// Seconds per plan unit: by method, and over all groups.
    per_unit: HashMap<String, f64>,
    per_unit_all: Option<f64>,
}

impl Measured {
    /// From a journal's job records: every job that ran (not one a strategy
    /// skipped, whose record took no time).
    pub fn from_records(records: &[JobRecord]) -> Measured {
        let mut sums: HashMap<String, (String, Shape, f64, u64)> = HashMap::new();
        for r in records.iter().filter(|r| r.status != JobStatus::Skipped) {
            let e = sums
                .entry(group_key(&r.method, &r.shape))
                .or_insert_with(|| (r.method.clone(), r.shape.clone(), 0.0, 0));
            e.2 += r.duration_s.max(0.0);
            e.3 += 1;
        }
        let mut per_job = HashMap::new();
        let mut units: HashMap<String, Vec<f64>> = HashMap::new();
        let mut all = Vec::new();
        for (key, (method, shape, seconds, n)) in sums {
            let s = seconds / n as f64;
            per_job.insert(key, s);
            let unit = s / size_factor(&shape);
            units.entry(method).or_default().push(unit);
            all.push(unit);
        }
        Measured {
            per_job,
            per_unit: units
                .into_iter()
                .map(|(m, mut v)| (m, median(&mut v)))
                .collect(),
            per_unit_all: (!all.is_empty()).then(|| median(&mut all)),
        }
    }

    fn is_empty(&self) -> bool {
        self.per_job.is_empty()
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The estimated cost of running `jobs` jobs of the group (see the module
/// documentation): seconds when anything was measured, plan units otherwise.
pub fn estimate(method: &str, shape: &Shape, jobs: u64, measured: &Measured) -> f64 {
    if measured.is_empty() {
        return plan_cost(shape, jobs);
    }
    if let Some(s) = measured.per_job.get(&group_key(method, shape)) {
        return (jobs as f64 + GROUP_OVERHEAD_JOBS) * s;
    }
    let unit = measured
        .per_unit
        .get(method)
        .copied()
        .or(measured.per_unit_all)
        .unwrap_or(1.0);
    plan_cost(shape, jobs) * unit
}

/// The groups in dealing order: largest estimate first, ties in plan order.
pub fn order(mut groups: Vec<Pending>, measured: &Measured) -> Vec<Pending> {
    for g in &mut groups {
        g.cost = estimate(&g.method, &g.shape, g.jobs, measured);
    }
    // A stable sort keeps plan order among equal estimates.
    groups.sort_by(|a, b| b.cost.total_cmp(&a.cost));
    groups
}

/// The queue between the planner and the lanes.
pub struct Dealer {
    inner: Mutex<Inner>,
    changed: Condvar,
    /// Groups the planner may queue ahead of the lanes.
    ahead: usize,
}

struct Inner {
    queue: VecDeque<Group>,
    /// The planner has queued every group.
    closed: bool,
    /// Nobody will take more groups (the journal's writer is gone).
    abandoned: bool,
    /// Lanes running a group, which they may hand back in part.
    busy: usize,
    /// Lanes not retired.
    alive: usize,
}

impl Dealer {
    pub fn new(ahead: usize, lanes: usize) -> Dealer {
        Dealer {
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                closed: false,
                abandoned: false,
                busy: 0,
                alive: lanes,
            }),
            changed: Condvar::new(),
            ahead: ahead.max(1),
        }
    }

    /// For the planner: queues a group once there is room, or returns false
    /// when nobody will take it (interrupted, or abandoned).
    pub fn push(&self, group: Group) -> bool {
        let mut inner = self.inner.lock().expect("dealer");
        loop {
            if inner.abandoned || super::interrupted() {
                return false;
            }
            if inner.queue.len() < self.ahead {
                inner.queue.push_back(group);
                self.changed.notify_all();
                return true;
            }
            inner = self
                .changed
                .wait_timeout(inner, Duration::from_millis(50))
                .expect("dealer")
                .0;
        }
    }

    /// For the planner: every group is queued.
    pub fn close(&self) {
        self.inner.lock().expect("dealer").closed = true;
        self.changed.notify_all();
    }

    /// Nothing more will be taken: the planner stops, idle lanes leave.
    pub fn abandon(&self) {
        let mut inner = self.inner.lock().expect("dealer");
        inner.abandoned = true;
        inner.queue.clear();
        self.changed.notify_all();
    }

    /// For a lane: the next group, waiting while the queue is empty but the
    /// planner or a busy lane may still add one; `None` when all is dealt
    /// (or the run is interrupted). Call [`done`](Self::done) after it.
    pub fn take(&self) -> Option<Group> {
        let mut inner = self.inner.lock().expect("dealer");
        loop {
            if inner.abandoned || super::interrupted() {
                return None;
            }
            if let Some(g) = inner.queue.pop_front() {
                inner.busy += 1;
                self.changed.notify_all();
                return Some(g);
            }
            if inner.closed && inner.busy == 0 {
                return None;
            }
            inner = self
                .changed
                .wait_timeout(inner, Duration::from_millis(100))
                .expect("dealer")
                .0;
        }
    }

    /// For a lane: the group it took is finished (or handed back).
    pub fn done(&self) {
        let mut inner = self.inner.lock().expect("dealer");
        inner.busy = inner.busy.saturating_sub(1);
        self.changed.notify_all();
    }

    /// For a retiring lane: unfinished groups go to the front of the queue,
    /// the next taken. Call before [`done`](Self::done), so no idle lane
    /// leaves in between.
    pub fn hand_back(&self, groups: Vec<Group>) {
        let mut inner = self.inner.lock().expect("dealer");
        for g in groups.into_iter().rev() {
            inner.queue.push_front(g);
        }
        self.changed.notify_all();
    }

    /// A lane asks to retire: granted unless it is the last lane.
    pub fn retire(&self) -> bool {
        let mut inner = self.inner.lock().expect("dealer");
        if inner.alive <= 1 {
            return false;
        }
        inner.alive -= 1;
        true
    }

    pub fn alive(&self) -> usize {
        self.inner.lock().expect("dealer").alive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::MethodKind;
    use serde_json::json;

    fn shape(m: u64) -> Shape {
        let mut s = Shape::new();
        s.insert("M".into(), json!(m));
        s
    }

    fn pending(method: &str, m: u64, jobs: u64) -> Pending {
        Pending {
            method: method.into(),
            shape_index: m as usize,
            shape: shape(m),
            jobs,
            cost: 0.0,
        }
    }

    fn record(method: &str, m: u64, seconds: f64) -> JobRecord {
        serde_json::from_value(json!({
            "job_id": format!("{method}{m}{seconds}"), "method": method, "kind": "triton",
            "kernel": "k", "shape": {"M": m}, "config": {}, "baseline": false,
            "status": "ok", "failure": null, "check": null, "stats": null, "flops": null,
            "bytes": null, "tflops": null, "gbs": null, "roofline_pct": null,
            "compile_s": null, "duration_s": seconds, "lane": 0, "kernels": [],
            "finished_at": "2026-11-23T00:00:00Z"
        }))
        .unwrap()
    }

    #[test]
    fn from_the_plan_alone_more_jobs_and_larger_m_go_first() {
        let none = Measured::from_records(&[]);
        let dealt = order(
            vec![
                pending("a", 1, 20),
                pending("a", 4096, 20),
                pending("a", 2, 100),
            ],
            &none,
        );
        let ms: Vec<usize> = dealt.iter().map(|g| g.shape_index).collect();
        assert_eq!(ms, [4096, 2, 1]);
    }

    #[test]
    fn measured_times_override_the_plan_and_calibrate_unmeasured_groups() {
        // The journal says M=1 of method a is slow (1 s a job) and b's jobs fast.
        let measured = Measured::from_records(&[
            record("a", 1, 1.0),
            record("a", 1, 1.0),
            record("b", 4096, 0.01),
        ]);
        let a1 = estimate("a", &shape(1), 10, &measured);
        assert_eq!(a1, (10.0 + GROUP_OVERHEAD_JOBS) * 1.0);
        // An unmeasured group of a: a's seconds per plan unit (1 / 1.0009765625).
        let a2 = estimate("a", &shape(2), 10, &measured);
        assert!((a2 - plan_cost(&shape(2), 10) / size_factor(&shape(1))).abs() < 1e-9);
        let b = estimate("b", &shape(4096), 10, &measured);
        assert!(b < a1 / 10.0, "b's measured jobs are fast: {b}");
    }

    fn group(name: &str) -> Group {
        Group {
            shape: Shape::new(),
            method: name.into(),
            kernel: "k".into(),
            kind: MethodKind::Triton,
            jobs: Vec::new(),
            unavailable: None,
        }
    }

    #[test]
    fn handed_back_work_is_taken_next_and_the_last_lane_never_retires() {
        let dealer = Dealer::new(4, 2);
        assert!(dealer.push(group("a")));
        assert!(dealer.push(group("b")));
        dealer.close();
        let a = dealer.take().unwrap();
        assert_eq!(a.method, "a");
        assert!(dealer.retire(), "one of two lanes may retire");
        dealer.hand_back(vec![group("a rest")]);
        dealer.done();
        assert_eq!(dealer.take().unwrap().method, "a rest");
        assert!(!dealer.retire(), "the last lane stays");
        dealer.done();
        assert_eq!(dealer.take().unwrap().method, "b");
        dealer.done();
        assert!(dealer.take().is_none(), "all dealt");
    }
}
