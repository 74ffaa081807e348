//! The summary: what changed against the shipped files a run timed, each
//! method's speedup over its baseline with the shapes that gained least, the
//! untuned methods against the fastest, which method wins where, % of the
//! roofline bound with the lowest shapes, and failures or skips worth a
//! reviewer's eye. The re-timing table follows it (`retime.rs`).

use super::timed::{baseline_rule, BaselineRule};
use super::*;
use crate::emit::compare::{compared_in_run, Row as CompareRow};
use crate::measure::{geomean, verdict, Verdict};
use crate::store::FailureClass;

fn verdicts(pairs: impl IntoIterator<Item = Verdict>) -> String {
    let (mut fast, mut same, mut slow, mut ambiguous) = (0, 0, 0, 0);
    for v in pairs {
        match v {
            Verdict::Fast => fast += 1,
            Verdict::Same => same += 1,
            Verdict::Slow => slow += 1,
            Verdict::Ambiguous => ambiguous += 1,
        }
    }
    let mut parts = vec![format!("{fast} FAST"), format!("{same} SAME")];
    if ambiguous > 0 {
        parts.push(format!("{ambiguous} AMBIGUOUS"));
    }
    if slow > 0 {
        parts.push(format!("**{slow} SLOW**"));
    }
    format!("{} by 95 % CI overlap", parts.join(", "))
}

/// The lowest of a sorted list, as a summary names them: three when there
/// are more than three shapes, the one lowest when there are two or three,
/// none for a single shape (the geomean is its figure). A list that named
/// every shape would point at nothing.
fn lowest(sorted: &[(f64, String)]) -> Option<String> {
    let n = match sorted.len() {
        0 | 1 => return None,
        2 | 3 => 1,
        _ => 3,
    };
    Some(
        sorted
            .iter()
            .take(n)
            .map(|(x, l)| format!("{l} {}", num::times(*x)))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

fn compared(a: &Analysis<'_, '_, '_>) -> Vec<String> {
    let h = a.group.header;
    let mut out = Vec::new();
    for (i, (file, cmp)) in compared_in_run(a.group.results).into_iter().enumerate() {
        let c = &h.compared[i];
        let name = std::path::Path::new(&file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(file.clone());
        let Some(g) = cmp.geomean_speedup() else {
            out.push(format!(
                "Shipped `{name}` (timed as {}): no shape has timings of both it and {}.",
                c.method, c.against
            ));
            continue;
        };
        let mut worst: Vec<&CompareRow> = cmp.rows.iter().collect();
        worst.sort_by(|x, y| y.change().total_cmp(&x.change()));
        // As `lowest` names them: never every shape.
        let named = match worst.len() {
            0 | 1 => 0,
            2 | 3 => 1,
            _ => 3,
        };
        let worst: Vec<String> = worst
            .iter()
            .take(named)
            .map(|r| {
                format!(
                    "{} {:+.1} % ({})",
                    a.labels.label(&r.shape),
                    r.change() * 100.0,
                    r.verdict.as_str()
                )
            })
            .collect();
        out.push(format!(
            "Against the shipped `{name}` (its configs timed as {}): **{}** is **{g:.3}×** as fast, geomean over {} ({}){}.",
            c.method,
            c.against,
            num::count(cmp.rows.len() as u64, "shape", "shapes"),
            verdicts(cmp.rows.iter().map(|r| r.verdict)),
            if worst.is_empty() {
                String::new()
            } else {
                format!("; worst: {}", worst.join(", "))
            }
        ));
    }
    out
}

fn over_baseline(a: &Analysis<'_, '_, '_>, m: &str, rule: &BaselineRule) -> Option<String> {
    let pairs: Vec<(&ShapeOutcome<'_>, Timed<'_>, Timed<'_>)> = a
        .group
        .shapes
        .iter()
        .filter_map(|s| {
            let o = s.method(m)?;
            Some((*s, o.best?, o.baseline?))
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let speedups: Vec<f64> = pairs
        .iter()
        .map(|(_, b, base)| base.time_us() / b.time_us())
        .collect();
    let g = geomean(speedups.iter().copied())?;
    let kept = pairs.iter().filter(|(_, b, _)| b.job.baseline).count();
    let missing = a
        .group
        .shapes
        .iter()
        .filter_map(|s| s.method(m))
        .filter(|o| o.best.is_some() && o.baseline.is_none())
        .count();
    let mut least: Vec<(f64, String)> = pairs
        .iter()
        .zip(&speedups)
        .map(|((s, _, _), x)| (*x, a.labels.label(s.shape)))
        .collect();
    least.sort_by(|x, y| x.0.total_cmp(&y.0).then_with(|| x.1.cmp(&y.1)));
    let mut text = format!(
        "**{m}** over its baseline ({}): **{}** geomean across {} ({}",
        rule.phrase(),
        num::times(g),
        num::count(pairs.len() as u64, "shape", "shapes"),
        verdicts(
            pairs
                .iter()
                .map(|(_, b, base)| verdict(base.stats, b.stats))
        )
    );
    if kept > 0 {
        text.push_str(&format!("; the baseline config is the best at {kept}"));
    }
    if missing > 0 {
        text.push_str(&format!("; no timed baseline at {missing}"));
    }
    text.push(')');
    match lowest(&least) {
        Some(l) => text.push_str(&format!("; least gained: {l}.")),
        None => text.push('.'),
    }
    Some(text)
}

fn against_method(a: &Analysis<'_, '_, '_>, m: &str, r: &str) -> Option<String> {
    let pairs: Vec<(&ShapeOutcome<'_>, Timed<'_>, Timed<'_>)> = a
        .group
        .shapes
        .iter()
        .filter_map(|s| Some((*s, s.method(m)?.best?, s.method(r)?.best?)))
        .collect();
    let g = geomean(
        pairs
            .iter()
            .map(|(_, b, base)| base.time_us() / b.time_us()),
    )?;
    let mut worst: Vec<(f64, String)> = pairs
        .iter()
        .map(|(s, b, base)| (base.time_us() / b.time_us(), a.labels.label(s.shape)))
        .collect();
    worst.sort_by(|x, y| x.0.total_cmp(&y.0).then_with(|| x.1.cmp(&y.1)));
    Some(format!(
        "**{m}** against {r}: **{}** geomean across {} ({}){}.",
        num::times(g),
        num::count(pairs.len() as u64, "shape", "shapes"),
        verdicts(
            pairs
                .iter()
                .map(|(_, b, base)| verdict(base.stats, b.stats))
        ),
        lowest(&worst)
            .map(|w| format!("; worst: {w}"))
            .unwrap_or_default()
    ))
}

/// A method with no baseline: how often it wins, how far from the fastest
/// (no closing period: `untuned` joins them).
fn untuned_part(a: &Analysis<'_, '_, '_>, m: &str) -> Option<String> {
    let bests = bests(&a.group.shapes, m);
    if bests.is_empty() {
        return None;
    }
    let wins = bests
        .iter()
        .filter(|(s, _, _)| s.overall_best().is_some_and(|(o, _)| o.method == m))
        .count();
    let slower = geomean(bests.iter().filter_map(|(s, _, b)| {
        let (o, fastest) = s.overall_best()?;
        (o.method != m).then(|| b.time_us() / fastest.time_us())
    }));
    let mut text = match slower {
        None => format!(
            "**{m}**: the fastest method at every shape ({})",
            bests.len()
        ),
        Some(x) if wins == 0 => format!(
            "**{m}**: fastest at none of {}, {} the fastest method's time (geomean)",
            num::count(bests.len() as u64, "shape", "shapes"),
            num::times(x)
        ),
        Some(x) => format!(
            "**{m}**: fastest at {wins} of {}, {} the fastest method's time at the others (geomean)",
            num::count(bests.len() as u64, "shape", "shapes"),
            num::times(x)
        ),
    };
    if a.gpu {
        let capped = bests
            .iter()
            .filter(|(_, _, b)| b.stats.flags.contains(&Flag::CapHit))
            .count();
        if capped > 0 {
            text.push_str(&format!(
                ", {capped} of these timings hit a cap before converging (CAP_HIT)"
            ));
        }
    }
    Some(text)
}

/// The methods with no baseline, in one line: a report that compares many
/// methods keeps a summary a reviewer reads in a minute.
fn untuned(a: &Analysis<'_, '_, '_>, methods: &[&str]) -> Option<String> {
    let parts: Vec<String> = methods.iter().filter_map(|m| untuned_part(a, m)).collect();
    (!parts.is_empty()).then(|| format!("{}.", parts.join("; ")))
}

fn fastest_per_shape(a: &Analysis<'_, '_, '_>) -> Option<String> {
    if a.methods.len() < 2 {
        return None;
    }
    let mut wins: Vec<(&str, usize)> = a.methods.iter().map(|(m, _)| (*m, 0)).collect();
    let mut total = 0;
    for s in &a.group.shapes {
        if let Some((o, _)) = s.overall_best() {
            total += 1;
            if let Some(w) = wins.iter_mut().find(|(m, _)| *m == o.method) {
                w.1 += 1;
            }
        }
    }
    if total == 0 {
        return None;
    }
    let text: Vec<String> = wins
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(m, n)| format!("{m} at {n}"))
        .collect();
    Some(format!(
        "Fastest method per shape: {} (of {total}).",
        text.join(", ")
    ))
}

fn bound(a: &Analysis<'_, '_, '_>) -> Option<String> {
    if !a.gpu {
        return None;
    }
    let p = a.primary?;
    let mut pcts: Vec<(f64, String, Option<&'static str>)> = bests(&a.group.shapes, p)
        .into_iter()
        .filter_map(|(s, _, b)| {
            Some((
                b.roofline_pct()?,
                a.labels.label(s.shape),
                bound_kind(b.job, &a.group.header.device),
            ))
        })
        .collect();
    if pcts.is_empty() {
        return None;
    }
    pcts.sort_by(|x, y| x.0.total_cmp(&y.0).then_with(|| x.1.cmp(&y.1)));
    let n = pcts.len();
    let median = if n % 2 == 1 {
        pcts[n / 2].0
    } else {
        (pcts[n / 2 - 1].0 + pcts[n / 2].0) / 2.0
    };
    let compute = pcts.iter().filter(|x| x.2 == Some("compute")).count();
    let bandwidth = pcts.iter().filter(|x| x.2 == Some("bandwidth")).count();
    let mut text = if n <= 3 {
        format!(
            "% of the roofline bound ({p}'s best): {}",
            pcts.iter()
                .map(|(x, l, _)| format!("{l} {x:.1} %"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        format!(
            "% of the roofline bound ({p}'s best): median {median:.1} %, highest {:.1} % at {}; lowest: {}",
            pcts[n - 1].0,
            pcts[n - 1].1,
            pcts.iter()
                .take(3)
                .map(|(x, l, _)| format!("{l} {x:.1} %"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    if compute + bandwidth > 0 {
        text.push_str(&format!(
            " (bandwidth-bound at {bandwidth}, compute-bound at {compute})"
        ));
    }
    text.push('.');
    Some(text)
}

fn problems(a: &Analysis<'_, '_, '_>) -> Option<String> {
    let failed = a
        .jobs
        .iter()
        .filter(|j| j.status == JobStatus::Failed)
        .count();
    let unavailable = distinct(
        a.jobs
            .iter()
            .filter(|j| {
                j.failure
                    .as_ref()
                    .is_some_and(|f| f.class == FailureClass::Unavailable)
            })
            .map(|j| j.method.as_str()),
    );
    let mut parts = Vec::new();
    if failed > 0 {
        parts.push(format!(
            "{} failed (by class below)",
            num::count(failed as u64, "job", "jobs")
        ));
    }
    if !unavailable.is_empty() {
        parts.push(format!(
            "{} could not run here (below)",
            unavailable.join(", ")
        ));
    }
    (!parts.is_empty()).then(|| format!("{}.", parts.join("; ")))
}

/// The headline where the report's method has a baseline that is what a
/// consumer runs (vLLM's default config, vLLM's triton_kernels setting):
/// the fastest method the run found at each shape against it, which method
/// that is, and the same without the method's own tuned configs (what
/// tunelab's other kernels do against it).
/// Returns the line and how many shapes it covers.
fn against_what_users_run(a: &Analysis<'_, '_, '_>) -> Option<(String, usize)> {
    let m = a.primary?;
    // The method's kernel (recorded in the run header) says whether its
    // baseline is the consumer's call; the methods of that kernel (its bare
    // heuristic, say) are not tunelab's kernels.
    let kernel_of =
        |method: &str| super::timed::record_in(a.group.header, method).map(|r| r.kernel.clone());
    let rule = super::timed::baseline_rule_name(a, m)?;
    let kernel = kernel_of(m)?;
    let what = crate::manifest::consumer_runs(&rule, &kernel)?;
    // Only where the baseline jobs are the rule as vLLM has it now: a
    // journal from before the rule changed timed something else.
    if !super::timed::baseline_follows(a, m, &rule) {
        return None;
    }
    let mut ratios: Vec<f64> = Vec::new();
    let mut verdicts_seen = Vec::new();
    let mut winners: Vec<(&str, Vec<f64>)> = Vec::new();
    let mut others: Vec<(f64, String)> = Vec::new();
    for s in &a.group.shapes {
        let Some(base) = s.method(m).and_then(|o| o.baseline) else {
            continue;
        };
        let Some((o, best)) = s.overall_best() else {
            continue;
        };
        let r = base.time_us() / best.time_us();
        ratios.push(r);
        verdicts_seen.push(verdict(base.stats, best.stats));
        match winners.iter_mut().find(|(w, _)| *w == o.method) {
            Some((_, rs)) => rs.push(r),
            None => winners.push((o.method, vec![r])),
        }
        let other = s
            .methods
            .iter()
            .filter(|x| kernel_of(x.method) != kernel_of(m))
            .filter_map(|x| x.best)
            .map(|b| b.time_us())
            .min_by(f64::total_cmp);
        if let Some(t) = other {
            others.push((base.time_us() / t, a.labels.label(s.shape)));
        }
    }
    let g = geomean(ratios.iter().copied())?;
    let slower = verdicts_seen
        .iter()
        .filter(|v| **v == Verdict::Slow)
        .count();
    let range = |rs: &[f64]| {
        let lo = rs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = rs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = (num::times(lo), num::times(hi));
        if lo == hi {
            lo
        } else {
            format!("{lo}–{hi}")
        }
    };
    let fastest: Vec<String> = winners
        .iter()
        .map(|(w, rs)| format!("{w} at {} ({})", rs.len(), range(rs)))
        .collect();
    let mut text = format!(
        "**Against {what}** ({m}'s baseline): the fastest method at each shape is **{}** as fast, geomean over {} ({}{}); fastest: {}.",
        num::times(g),
        num::count(ratios.len() as u64, "shape", "shapes"),
        verdicts(verdicts_seen.iter().copied()),
        if slower > 0 { "" } else { "; slower at none" },
        fastest.join(", ")
    );
    if let Some(og) = geomean(others.iter().map(|(r, _)| *r)) {
        let ahead = others.iter().filter(|(r, _)| *r >= 1.0).count();
        others.sort_by(|x, y| x.0.total_cmp(&y.0).then_with(|| x.1.cmp(&y.1)));
        text.push_str(&format!(
            " Kernels other than {m}'s: their fastest is {} as fast (geomean), ahead at {ahead} of {}{}.",
            num::times(og),
            others.len(),
            lowest(&others)
                .map(|l| format!("; furthest behind: {l}"))
                .unwrap_or_default()
        ));
    }
    Some((text, ratios.len()))
}

pub(super) fn summary(a: &Analysis<'_, '_, '_>) -> Vec<String> {
    let mut lines = compared(a);
    let headline = against_what_users_run(a);
    // Which method is fastest where: the headline names them when it
    // covers every shape with a timing.
    let timed_shapes = a
        .group
        .shapes
        .iter()
        .filter(|s| s.overall_best().is_some())
        .count();
    let winners_named = headline.as_ref().is_some_and(|(_, n)| *n == timed_shapes);
    lines.extend(headline.map(|(text, _)| text));
    let mut ordered: Vec<&str> = a.methods.iter().map(|(m, _)| *m).collect();
    if let Some(p) = a.primary {
        ordered.retain(|m| *m != p);
        ordered.insert(0, p);
    }
    // A shipped file's method is summarised by the comparison above.
    let shipped: Vec<&str> = a
        .group
        .header
        .compared
        .iter()
        .map(|c| c.method.as_str())
        .collect();
    ordered.retain(|m| !shipped.contains(m));
    // The methods with no baseline share one line, where the first of them would be.
    let mut no_baseline: Vec<&str> = Vec::new();
    let mut no_baseline_at = None;
    for m in &ordered {
        let rule = baseline_rule(a, m);
        let has_baseline = a
            .group
            .shapes
            .iter()
            .any(|s| s.method(m).is_some_and(|o| o.baseline.is_some()));
        if has_baseline {
            lines.extend(over_baseline(a, m, &rule));
        } else if let Reference::Method(r) = a.reference {
            if *m != r && Some(*m) == a.primary {
                lines.extend(against_method(a, m, r));
                continue;
            }
            no_baseline_at.get_or_insert(lines.len());
            no_baseline.push(m);
        } else {
            no_baseline_at.get_or_insert(lines.len());
            no_baseline.push(m);
        }
    }
    if let (Some(at), Some(line)) = (no_baseline_at, untuned(a, &no_baseline)) {
        lines.insert(at, line);
    }
    if !winners_named {
        lines.extend(fastest_per_shape(a));
    }
    lines.extend(bound(a));
    lines.extend(problems(a));
    if lines.is_empty() {
        lines.push("No job has a timed result.".into());
    }
    // Spilling winners are worth a look in `tunelab profile`; jobs.csv has
    // every job's registers, spills and shared memory.
    let labels = &a.labels;
    let spilling: Vec<String> = a
        .group
        .shapes
        .iter()
        .flat_map(|s| {
            s.methods.iter().filter_map(move |m| {
                let n = m.best?.job.spills().filter(|n| *n > 0)?;
                Some(format!(
                    "{} {} ({n} registers spilled per thread)",
                    labels.label(s.shape),
                    m.method
                ))
            })
        })
        .collect();
    // A few name the pattern; the jobs file lists every one.
    const SPILLS_SHOWN: usize = 5;
    if !spilling.is_empty() {
        let more = spilling.len().saturating_sub(SPILLS_SHOWN);
        lines.push(format!(
            "Winners that spill registers to local memory: {}{}.",
            spilling[..spilling.len().min(SPILLS_SHOWN)].join("; "),
            if more > 0 {
                format!("; and {more} more (every job's registers and spills are in the jobs file)")
            } else {
                String::new()
            }
        ));
    }
    if a.group.results.profile_summary {
        // Relative to the report, wherever its path puts it.
        let up = "../".repeat(
            std::path::Path::new(&a.group.path)
                .components()
                .count()
                .saturating_sub(1),
        );
        lines.push(format!(
            "Profiles of the winners (Proton, Nsight Compute): [profile/summary.md]({up}profile/summary.md)."
        ));
    }
    lines
}
