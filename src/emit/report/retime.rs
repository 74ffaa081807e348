//! Finalists re-timed another way (`protocol.retime_with`, e.g. CUDA-graph
//! replay): where that timing's winner differs from the ranking's winner,
//! with both winners and both timings of each.

use super::*;
use crate::emit::select::{tied_for_pick, PICK_MARGIN};
use crate::measure::{tied, Timing};
use crate::store::FinalRecord;

/// One (shape, method, timing) whose re-timed winner is another config.
pub(super) struct Disagreement<'s, 'a> {
    pub(super) shape: &'s ShapeOutcome<'a>,
    pub(super) method: &'a str,
    pub(super) timing: Timing,
    /// The ranking's winner and its re-timing.
    pub(super) ranked: (Timed<'a>, Option<&'a FinalRecord>),
    /// The re-timing's winner and its ranking time.
    pub(super) other: (&'a JobRecord, Option<&'a Stats>, &'a FinalRecord),
}

impl Disagreement<'_, '_> {
    /// The ranking winner's re-timed time / the re-timing winner's.
    pub(super) fn gain(&self) -> Option<f64> {
        let r = self.ranked.1?.stats.median_us;
        let o = self.other.2.stats.median_us;
        (o > 0.0).then(|| r / o)
    }

    /// The two re-timings' confidence intervals overlap.
    pub(super) fn within_noise(&self) -> bool {
        self.ranked
            .1
            .is_some_and(|r| tied(&r.stats, &self.other.2.stats))
    }
}

/// Every disagreement, and how many (shape, method, timing) had re-timings.
pub(super) fn disagreements<'s, 'a>(
    a: &Analysis<'_, 's, 'a>,
) -> (Vec<Disagreement<'s, 'a>>, usize) {
    let sel = a.group.sel;
    let mut out = Vec::new();
    let mut compared = 0;
    for &timing in &a.group.header.protocol.retime_with {
        for s in &a.group.shapes {
            for o in &s.methods {
                let Some(best) = o.best else { continue };
                let retimed: Vec<(&JobRecord, &FinalRecord)> = o
                    .jobs
                    .iter()
                    .filter(|j| sel.final_of(&j.job_id).is_some())
                    .filter_map(|j| sel.retimed_under(&j.job_id, timing).map(|f| (*j, f)))
                    .filter(|(_, f)| f.stats.median_us.is_finite() && f.stats.median_us > 0.0)
                    .collect();
                let Some(&(winner, wf)) = retimed.iter().min_by(|x, y| {
                    x.1.stats
                        .median_us
                        .total_cmp(&y.1.stats.median_us)
                        .then_with(|| x.0.job_id.cmp(&y.0.job_id))
                }) else {
                    continue;
                };
                compared += 1;
                if winner.job_id == best.job.job_id {
                    continue;
                }
                out.push(Disagreement {
                    shape: s,
                    method: o.method,
                    timing,
                    ranked: (best, sel.retimed_under(&best.job.job_id, timing)),
                    other: (
                        winner,
                        sel.final_of(&winner.job_id)
                            .map(|f| &f.stats)
                            .or(winner.stats.as_ref()),
                        wf,
                    ),
                });
            }
        }
    }
    out.sort_by(|x, y| {
        y.gain()
            .unwrap_or(0.0)
            .total_cmp(&x.gain().unwrap_or(0.0))
            .then_with(|| x.shape.key.cmp(&y.shape.key))
    });
    (out, compared)
}

fn winner_cell(
    config: &indexmap::IndexMap<String, Json>,
    rank: Option<f64>,
    other: Option<f64>,
) -> String {
    let us = |x: Option<f64>| x.map(num::us).unwrap_or_else(|| DASH.into());
    cell(&format!(
        "{} ({} / {})",
        config_text(config),
        us(rank),
        us(other)
    ))
}

/// The `limit` largest disagreements as a table, and a sentence on all of them.
pub(super) fn table(
    a: &Analysis<'_, '_, '_>,
    limit: usize,
    details_link: &str,
) -> (Option<Table>, Option<String>) {
    let timings = &a.group.header.protocol.retime_with;
    if timings.is_empty() {
        return (None, None);
    }
    let (all, compared) = disagreements(a);
    let rank = a.group.header.protocol.timing.as_str();
    let names = timings
        .iter()
        .map(|t| t.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if compared == 0 {
        return (
            None,
            Some(format!(
                "Finalists were to be re-timed under {names}, but the journal holds no such re-timing."
            )),
        );
    }
    if all.is_empty() {
        return (
            None,
            Some(format!(
                "Finalists re-timed under {names}: the same winner as the {rank} ranking at all {compared} (shape, method) pairs."
            )),
        );
    }
    let beyond = all.iter().filter(|d| !d.within_noise()).count();
    // The pick's own test of a tie (emit::select: within the noise of the
    // difference or PICK_MARGIN): a re-timed winner it ties is no reason to differ.
    let past_margin = all
        .iter()
        .filter(|d| {
            d.ranked
                .1
                .is_some_and(|r| !tied_for_pick(&r.stats, &d.other.2.stats))
        })
        .count();
    let note = format!(
        "Finalists re-timed under {names}: another winner at {} of {compared} (shape, method) pairs, {beyond} of them beyond noise (CIs apart), {past_margin} apart by the pick's own test (beyond the noise of the difference and {} %){}. Cells: config ({rank} µs / re-timed µs); gain = the {rank} winner's re-timed µs / the other winner's.",
        all.len(),
        PICK_MARGIN * 100.0,
        if all.len() > limit {
            format!("; the {limit} largest here, all in [the details]({details_link})")
        } else {
            String::new()
        }
    );
    let rows = all
        .iter()
        .take(limit)
        .map(|d| disagreement_row(a, d))
        .collect();
    (Some(disagreement_table(rows, rank)), Some(note))
}

pub(super) fn disagreement_row(a: &Analysis<'_, '_, '_>, d: &Disagreement<'_, '_>) -> Vec<String> {
    let (best, ranked_re) = d.ranked;
    let (other, other_rank, other_re) = d.other;
    vec![
        cell(&a.labels.label(d.shape.shape)),
        cell(d.method),
        d.timing.as_str().to_string(),
        winner_cell(
            &best.job.config,
            Some(best.time_us()),
            ranked_re.map(|f| f.stats.median_us),
        ),
        winner_cell(
            &other.config,
            other_rank.map(|s| s.median_us),
            Some(other_re.stats.median_us),
        ),
        match d.gain() {
            Some(g) if d.within_noise() => format!("{g:.3}× (noise)"),
            Some(g) => format!("{g:.3}×"),
            None => DASH.into(),
        },
    ]
}

pub(super) fn disagreement_table(rows: Vec<Vec<String>>, rank: &str) -> Table {
    Table::new(
        vec![
            "Shape".into(),
            "Method".into(),
            "Re-timed".into(),
            format!("{rank} winner"),
            "re-timed winner".into(),
            "gain".into(),
        ],
        rows,
        &[0, 1, 2, 3, 4],
    )
}
