//! Groups as units of work: what one (method, shape) group is estimated to
//! cost, and `--shard K/N`, a deterministic, balanced share of the groups.
//!
//! The estimate from the plan alone, in *job units*:
//!
//! ```text
//! cost = (jobs + GROUP_OVERHEAD_JOBS) * (1 + M / 1024)
//! ```
//!
//! `jobs` is the group's job count; `GROUP_OVERHEAD_JOBS` stands for what a
//! group costs besides its jobs (the shape's inputs and reference, the
//! finalists' re-timing); `M` is the shape's `M` field where it has a
//! numeric one (0 otherwise), since a job's time grows with the kernel's,
//! which grows with the tokens a shape carries. On the committed gpt-oss H200
//! run (one lane, `results/gptoss/NVIDIA_H200`, its traces) a 20-job group at
//! small M took 0.8 to 1.2 s (0.04 to 0.06 s a job with the group's own
//! overhead, about 8 jobs' worth) and a job at M = 2048..4096 took about 3x a
//! small-M one; the formula gives those ratios. A scheduler refines this with
//! measured times where a journal has them (`schedule::cost`); a shard never
//! does, so that its share does not depend on what is already done.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::str::FromStr;

use crate::diag::Diagnostic;
use crate::manifest::{Experiment, Shape};

use super::{plan, PlanOptions};

/// What a group costs besides its jobs, in jobs.
pub const GROUP_OVERHEAD_JOBS: f64 = 8.0;

/// The plan's estimate of a group: see the module documentation.
pub fn plan_cost(shape: &Shape, jobs: u64) -> f64 {
    (jobs as f64 + GROUP_OVERHEAD_JOBS) * size_factor(shape)
}

/// How much longer a job of this shape takes than one at small M.
pub fn size_factor(shape: &Shape) -> f64 {
    let m = shape
        .get("M")
        .and_then(serde_json::Value::as_f64)
        .filter(|m| m.is_finite() && *m > 0.0)
        .unwrap_or(0.0);
    1.0 + m / 1024.0
}

/// `--shard K/N`: the K-th of N shares, K counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("`{s}` is not K/N with 1 <= K <= N (e.g. --shard 2/4)");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = k.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if index == 0 || count == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// One (method, shape) group of a plan, with its job count.
#[derive(Debug, Clone)]
pub struct GroupCost {
    pub method: String,
    pub shape_index: usize,
    pub shape: Shape,
    pub jobs: u64,
}

impl GroupCost {
    pub fn plan_cost(&self) -> f64 {
        plan_cost(&self.shape, self.jobs)
    }
}

/// Every group of the plan, in plan order, with its job count.
pub fn groups(exp: &Experiment, opts: &PlanOptions<'_>) -> Result<Vec<GroupCost>, Diagnostic> {
    let mut out: Vec<GroupCost> = Vec::new();
    plan(exp, opts, &mut |job| {
        match out.last_mut() {
            Some(g) if g.method == job.method && g.shape_index == job.shape_index => g.jobs += 1,
            _ => out.push(GroupCost {
                method: job.method,
                shape_index: job.shape_index,
                shape: job.shape,
                jobs: 1,
            }),
        }
        ControlFlow::Continue(())
    })?;
    Ok(out)
}

/// The shard (0-based) of each group: greedy longest-first, each group in
/// turn, largest plan cost first (ties in plan order), to the shard with the
/// least cost so far (ties: the lowest). Depends only on the plan, so every
/// host computes the same assignment and a resumed shard keeps its share.
pub fn assign(groups: &[GroupCost], count: u32) -> Vec<u32> {
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|&a, &b| {
        groups[b]
            .plan_cost()
            .total_cmp(&groups[a].plan_cost())
            .then(a.cmp(&b))
    });
    let mut load = vec![0.0f64; count.max(1) as usize];
    let mut shard_of = vec![0u32; groups.len()];
    for i in order {
        let (k, _) = load
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(&b.0)))
            .expect("at least one shard");
        load[k] += groups[i].plan_cost();
        shard_of[i] = k as u32;
    }
    shard_of
}

/// The groups (method, shape index) of `shard`.
pub fn select(
    exp: &Experiment,
    opts: &PlanOptions<'_>,
    shard: Shard,
) -> Result<HashSet<(String, usize)>, Diagnostic> {
    let all = groups(exp, opts)?;
    let shard_of = assign(&all, shard.count);
    Ok(all
        .into_iter()
        .zip(shard_of)
        .filter(|(_, k)| *k + 1 == shard.index)
        .map(|(g, _)| (g.method, g.shape_index))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn group(i: usize, m: u64, jobs: u64) -> GroupCost {
        let mut shape = Shape::new();
        shape.insert("M".into(), json!(m));
        GroupCost {
            method: "m".into(),
            shape_index: i,
            shape,
            jobs,
        }
    }

    #[test]
    fn shards_parse_as_k_of_n() {
        assert_eq!("2/4".parse::<Shard>(), Ok(Shard { index: 2, count: 4 }));
        for bad in ["0/4", "5/4", "1", "a/b", "1/0"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn larger_m_and_more_jobs_cost_more() {
        let small = group(0, 1, 20).plan_cost();
        assert!(group(1, 4096, 20).plan_cost() > 4.0 * small);
        assert!(group(2, 1, 40).plan_cost() > small);
        assert_eq!(
            plan_cost(&Shape::new(), 2),
            2.0 + GROUP_OVERHEAD_JOBS,
            "no M: jobs only"
        );
    }

    #[test]
    fn shards_are_disjoint_cover_everything_and_balance() {
        let groups: Vec<GroupCost> = (0..40)
            .map(|i| group(i, [1, 64, 512, 4096][i % 4], 10 + (i as u64 * 7) % 30))
            .collect();
        for n in 1..=5u32 {
            let shard_of = assign(&groups, n);
            assert!(shard_of.iter().all(|k| *k < n));
            let mut load = vec![0.0; n as usize];
            for (g, k) in groups.iter().zip(&shard_of) {
                load[*k as usize] += g.plan_cost();
            }
            let max = load.iter().cloned().fold(0.0, f64::max);
            let min = load.iter().cloned().fold(f64::INFINITY, f64::min);
            let largest = groups.iter().map(GroupCost::plan_cost).fold(0.0, f64::max);
            assert!(max - min <= largest, "n={n}: {load:?}");
            assert_eq!(shard_of, assign(&groups, n), "deterministic");
        }
    }
}
