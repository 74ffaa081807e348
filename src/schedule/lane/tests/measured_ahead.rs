//! A check that takes the first batch or goes on until the stopping rule,
//! measurements and screening rounds sent ahead, racing, and the finalists'
//! re-timing, against the `Folding` fake.

use super::*;

#[test]
fn a_check_that_takes_the_first_batch_spares_the_calls_and_not_the_samples() {
    for strategy in [
        || -> Box<dyn Strategy> { Box::new(Grid) },
        || -> Box<dyn Strategy> {
            Box::new(Halving {
                eta: 3,
                keep_at_least: 3,
            })
        },
    ] {
        let (plain, plain_finals, plain_calls, _) = run_folding(strategy(), false, false, None);
        let (folded, folded_finals, calls, _) = run_folding(strategy(), true, false, None);
        // The same records, sample for sample.
        type Taken = (String, JobStatus, Option<(u64, f64, f64)>);
        let samples = |jobs: &[JobRecord]| -> Vec<Taken> {
            jobs.iter()
                .map(|j| {
                    let s = j.stats.as_ref().map(|s| (s.n, s.median_us, s.mean_us));
                    (j.job_id.clone(), j.status, s)
                })
                .collect()
        };
        assert_eq!(samples(&plain), samples(&folded));
        let finals = |f: &[FinalRecord]| -> Vec<(String, u64)> {
            f.iter().map(|f| (f.job_id.clone(), f.stats.n)).collect()
        };
        assert_eq!(finals(&plain_finals), finals(&folded_finals));
        // Every check went on by itself: no warm-up call and no plain
        // check; each passing check (one warm-up each, unfolded) spared
        // a batch's call.
        let count = |c: &HashMap<&str, usize>, k: &str| c.get(k).copied().unwrap_or(0);
        assert_eq!(count(&calls, "warmup"), 0, "{calls:?}");
        assert_eq!(count(&calls, "check"), 0, "{calls:?}");
        assert_eq!(
            count(&calls, "check_then_sample"),
            count(&plain_calls, "check"),
            "{calls:?} {plain_calls:?}"
        );
        let passing = count(&plain_calls, "warmup");
        assert!(passing >= 9, "{plain_calls:?}");
        assert_eq!(
            count(&calls, "sample") + passing,
            count(&plain_calls, "sample"),
            "{calls:?} {plain_calls:?}"
        );
    }
}

#[test]
fn a_check_that_goes_on_until_the_rule_spares_every_sample_call_of_a_measurement() {
    type Taken = (String, JobStatus, Option<(u64, f64, f64, bool)>);
    let samples = |jobs: &[JobRecord]| -> Vec<Taken> {
        jobs.iter()
            .map(|j| {
                let s = j.stats.as_ref().map(|s| {
                    (
                        s.n,
                        s.median_us,
                        s.mean_us,
                        s.flags.contains(&measure::Flag::CapHit),
                    )
                });
                (j.job_id.clone(), j.status, s)
            })
            .collect()
    };
    let count = |c: &HashMap<&str, usize>, k: &str| c.get(k).copied().unwrap_or(0);
    // Batches of 8 against the protocol's 20 samples at least: a job
    // takes three batches.
    let run = |strategy: Box<dyn Strategy>, goes_on: bool| {
        run_folding_on(strategy, true, goes_on, false, None, Some(8))
    };
    // Grid: every job a full measurement, so no `sample` call at all
    // (the finalists' re-timing takes its one batch with the check).
    let (plain, plain_finals, plain_calls, _) = run(Box::new(Grid), false);
    let (on, on_finals, calls, _) = run(Box::new(Grid), true);
    assert_eq!(
        samples(&plain),
        samples(&on),
        "the same samples, decided alike"
    );
    assert_eq!(plain_finals.len(), on_finals.len());
    assert!(count(&plain_calls, "sample") > 0, "{plain_calls:?}");
    assert_eq!(count(&calls, "sample"), 0, "{calls:?}");
    // Halving: the survivors' full measurements go on; screening takes
    // its set number of batches, as before.
    let halving = || -> Box<dyn Strategy> {
        Box::new(Halving {
            eta: 3,
            keep_at_least: 3,
        })
    };
    let (plain, _, plain_calls, _) = run(halving(), false);
    let (on, _, calls, _) = run(halving(), true);
    assert_eq!(samples(&plain), samples(&on));
    assert!(
        count(&calls, "sample") < count(&plain_calls, "sample"),
        "{calls:?} {plain_calls:?}"
    );
}

#[test]
fn a_first_batch_that_fails_fails_the_job_and_keeps_its_check() {
    let (jobs, finals, _, _) = run_folding(Box::new(Grid), true, true, None);
    assert!(finals.is_empty());
    for j in &jobs {
        assert_eq!(j.status, JobStatus::Failed, "{}", j.job_id);
        if j.config["B"] == 9 {
            assert_eq!(
                j.failure.as_ref().unwrap().class,
                FailureClass::CompileError
            );
            assert!(j.check.is_none());
        } else {
            assert_eq!(j.failure.as_ref().unwrap().class, FailureClass::LaunchError);
            assert!(j.check.as_ref().is_some_and(|c| c.passed), "{}", j.job_id);
            assert!(j.stats.is_none());
        }
    }
}

#[test]
fn a_lane_measures_the_jobs_compiled_first_rather_than_wait_in_order() {
    let board = std::sync::Arc::new(CompileBoard::default());
    for job in group().jobs {
        board.push(job, "k", "triton");
    }
    board.close();
    // job2 takes long to compile; every other job is compiled already.
    let mut slow = None;
    while let Some((job, _, _)) = board.next() {
        if job.id == "job2" {
            slow = Some(job.id);
        } else {
            board.finish(&job.id, Ok(Compiled::in_seconds(0.1)));
        }
    }
    let finisher = {
        let board = std::sync::Arc::clone(&board);
        let slow = slow.expect("job2 was queued");
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            board.finish(&slow, Ok(Compiled::in_seconds(2.0)));
        })
    };
    let (jobs, _) = run(Box::new(Grid), Some(&board));
    finisher.join().unwrap();
    let order: Vec<&str> = jobs.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(
        order,
        ["job0", "job1", "job3", "job4", "job5", "job6", "job7", "job8", "job9", "job2"]
    );
    let two = jobs.iter().find(|j| j.job_id == "job2").unwrap();
    assert_eq!((two.status, two.compile_s), (JobStatus::Ok, Some(2.0)));
}

/// The backend also gets, before each job's check, the recipe the pool
/// made with its compile (two jobs here; a third's failed), and nothing
/// for the others; those two are not among the jobs it may prepare ahead.
#[test]
fn a_backend_looks_ahead_at_the_jobs_the_pool_compiled() {
    let board = CompileBoard::default();
    for job in group().jobs {
        board.push(job, "k", "triton");
    }
    board.close();
    while let Some((job, _, _)) = board.next() {
        let result = match job.id.as_str() {
            "job3" => Err(JobFailure::new(FailureClass::Crash, "worker died")),
            "job4" => Err(JobFailure::new(FailureClass::CompileError, "ptxas said no")),
            "job1" | "job6" => Ok(Compiled {
                seconds: 0.1,
                recipe: Some(json!({"ok": true, "for": job.id})),
            }),
            // A recipe the pool could not make: neither offered nor kept from look-ahead.
            "job7" => Ok(Compiled {
                seconds: 0.1,
                recipe: Some(json!({"ok": false, "class": "problem_error"})),
            }),
            _ => Ok(Compiled::in_seconds(0.1)),
        };
        board.finish(&job.id, result);
    }
    let (_, _, calls, looked) = run_folding(Box::new(Grid), true, false, Some(&board));
    assert_eq!(calls.get("offer_recipe"), Some(&2));
    let after = |id: &str| -> Vec<&str> {
        let (_, seen) = looked.iter().find(|(j, _)| j == id).expect(id);
        seen.iter().map(String::as_str).collect()
    };
    // Jobs not started, in the group's order, that compiled without error.
    // Not job1 and job6: they bring the pool's recipe at their own turn.
    assert_eq!(after("job0"), ["job2", "job5", "job7"]);
    assert_eq!(after("job2"), ["job5", "job7", "job8"]);
    assert_eq!(after("job8"), ["job9"]);
    assert!(after("job9").is_empty());
    // The compile error fails before its check: it looks at nothing.
    assert!(looked.iter().all(|(j, _)| j != "job4"));
    // Without a pool the lane compiles each job at its turn: nothing ahead.
    let (_, _, _, looked) = run_folding(Box::new(Grid), true, false, None);
    assert!(looked.iter().all(|(_, seen)| seen.is_empty()));
}

/// The group measured by a folding backend that goes on until the rule
/// (batches of 8), sending measurements ahead where `pipelines`; returns
/// the records, the finalists' records and the backend's log.
fn run_pipelined(
    strategy: Box<dyn Strategy>,
    pipelines: bool,
    dies_once: Option<&str>,
    needs_idle: fn(&Job) -> bool,
) -> (Vec<JobRecord>, Vec<FinalRecord>, Vec<String>) {
    let (jobs, finals, log, _) = run_pipelined_on(strategy, pipelines, dies_once, needs_idle, None);
    (jobs, finals, log)
}

/// `run_pipelined` with the protocol's wall cap at `max_wall_ms` where
/// given (the fake's batches take 1 ms each); also returns the calls.
/// What a pipelining run gives: its job records, finalist records, the
/// backend's log and its count of calls by kind.
type PipelinedRun = (
    Vec<JobRecord>,
    Vec<FinalRecord>,
    Vec<String>,
    HashMap<&'static str, usize>,
);

/// `run_pipelined_with`, re-timing back to back (no rest).
fn run_pipelined_on(
    strategy: Box<dyn Strategy>,
    pipelines: bool,
    dies_once: Option<&str>,
    needs_idle: fn(&Job) -> bool,
    max_wall_ms: Option<f64>,
) -> PipelinedRun {
    run_pipelined_with(strategy, pipelines, dies_once, needs_idle, max_wall_ms, 0.0)
}

fn run_pipelined_with(
    strategy: Box<dyn Strategy>,
    pipelines: bool,
    dies_once: Option<&str>,
    needs_idle: fn(&Job) -> bool,
    max_wall_ms: Option<f64>,
    retime_rest: f64,
) -> PipelinedRun {
    let strategies = Strategies::single(strategy);
    let prior = HashMap::new();
    let mut ctx = context(&strategies, &prior, None, 2);
    ctx.protocol.batch = 8;
    ctx.protocol.retime_rest = retime_rest;
    if let Some(cap) = max_wall_ms {
        ctx.protocol.max_wall_ms = cap;
    }
    let mut backend = Folding {
        dies_once: dies_once.map(str::to_string),
        needs_idle,
        ..Folding::going_on(
            Fake {
                prepared: None,
                spread: 0.0,
                taken: 0,
                unavailable: IndexMap::new(),
            },
            pipelines,
        )
    };
    let (mut jobs, mut finals) = (Vec::new(), Vec::new());
    run_group(&ctx, &mut backend, group(), &mut |e| match e {
        Event::Job(r) => jobs.push(*r),
        Event::Final(f) => finals.push(f),
        Event::Retired(_) | Event::AbPair(_) => unreachable!(),
    });
    assert!(backend.under_way.is_empty(), "everything sent was received");
    (jobs, finals, backend.log, backend.calls)
}

type Outcome = (JobStatus, Option<(u64, f64, f64, bool)>, usize);

/// Each job's status, samples and kernels, by job.
fn outcomes(jobs: &[JobRecord]) -> std::collections::BTreeMap<String, Outcome> {
    jobs.iter()
        .map(|j| {
            let s = j.stats.as_ref().map(|s| {
                (
                    s.n,
                    s.median_us,
                    s.mean_us,
                    s.flags.contains(&measure::Flag::CapHit),
                )
            });
            (j.job_id.clone(), (j.status, s, j.kernels.len()))
        })
        .collect()
}

/// The group under racing (5 %), its samples spread ±3 % so that an
/// unraced job needs over a hundred to converge: measured by the plain
/// fake (each call waited for), or by a folding one that goes on until
/// the rule and takes measurements sent ahead (`pipelines`). Returns
/// the records by job: samples, and whether flagged OUTPACED.
fn run_raced(folding: Option<bool>) -> std::collections::BTreeMap<String, (u64, bool)> {
    let strategies = Strategies::single(Box::new(Grid));
    let prior = HashMap::new();
    let mut ctx = context(&strategies, &prior, None, 2);
    ctx.protocol.race = 0.05;
    let inner = Fake {
        prepared: None,
        spread: 0.03,
        taken: 0,
        unavailable: IndexMap::new(),
    };
    let mut plain;
    let mut folded;
    let backend: &mut dyn Backend = match folding {
        None => {
            plain = inner;
            &mut plain
        }
        Some(pipelines) => {
            ctx.protocol.batch = 8;
            folded = Folding::going_on(inner, pipelines);
            &mut folded
        }
    };
    let mut jobs = Vec::new();
    run_group(&ctx, backend, group(), &mut |e| {
        if let Event::Job(r) = e {
            jobs.push(*r);
        }
    });
    jobs.iter()
        .filter_map(|j| {
            let s = j.stats.as_ref()?;
            Some((
                j.job_id.clone(),
                (s.n, s.flags.contains(&measure::Flag::Outpaced)),
            ))
        })
        .collect()
}

#[test]
fn racing_stops_jobs_clearly_slower_than_the_best_so_far_at_min_samples() {
    let outpaced = |runs: &std::collections::BTreeMap<String, (u64, bool)>| -> Vec<String> {
        runs.iter()
            .filter(|(_, (_, o))| *o)
            .map(|(id, _)| id.clone())
            .collect()
    };
    // Each call waited for: the grid meets B = 5 (100 us) before 6, 7
    // and 8 (110 to 130 us, over 105), which stop at min_samples (20,
    // the first batch under racing). The baseline (B = 0, 150 us) is never
    // raced, and 1 to 4 were each the best so far, or within 5 % of it.
    let waited = run_raced(None);
    assert_eq!(outpaced(&waited), ["job6", "job7", "job8"]);
    for (id, (n, o)) in &waited {
        if *o {
            assert_eq!(*n, 20, "{id}");
        } else {
            assert!(*n > 50, "{id} converged on its own: {n} samples");
        }
    }
    // A worker that goes on by the rule (batches of 8) stops where the
    // lane would, at the first batch past min_samples.
    let folded = run_raced(Some(false));
    assert_eq!(outpaced(&folded), ["job6", "job7", "job8"]);
    assert!(folded.values().all(|(n, o)| !*o || *n == 24), "{folded:?}");
    // Sent ahead, a job races against what was read before it was sent:
    // job6 went before job5's answer (B = 4's 110 us the best then, and
    // job6 within 5 % of it); job7 and job8 after.
    let ahead = run_raced(Some(true));
    assert_eq!(outpaced(&ahead), ["job7", "job8"]);
    assert!(ahead["job6"].0 > 50);
}

#[test]
fn a_lane_sends_the_next_measurement_before_it_records_the_last() {
    for strategy in [
        || -> Box<dyn Strategy> { Box::new(Grid) },
        || -> Box<dyn Strategy> {
            Box::new(Halving {
                eta: 3,
                keep_at_least: 3,
            })
        },
    ] {
        let (plain, plain_finals, plain_log) = run_pipelined(strategy(), false, None, |_| false);
        let (ahead, ahead_finals, log) = run_pipelined(strategy(), true, None, |_| false);
        assert!(plain_log.is_empty());
        assert_eq!(outcomes(&plain), outcomes(&ahead), "the same records");
        assert_eq!(plain.len(), ahead.len(), "each job recorded once");
        let final_samples = |f: &[FinalRecord]| -> Vec<(String, u64)> {
            f.iter().map(|f| (f.job_id.clone(), f.stats.n)).collect()
        };
        assert_eq!(final_samples(&plain_finals), final_samples(&ahead_finals));
        // Each job's request went out before the one before it was
        // received, and never more than two were under way.
        let mut under_way = 0usize;
        let mut most = 0;
        for entry in &log {
            if entry.starts_with("send") {
                under_way += 1;
            } else {
                under_way -= 1;
            }
            most = most.max(under_way);
        }
        assert_eq!(most, UNDER_WAY, "{log:?}");
        let sends = log.iter().filter(|e| e.starts_with("send")).count();
        assert!(sends >= 3, "{log:?}");
    }
}

/// Halving that screens the group's ten jobs in three rounds (1, 2 and
/// 4 batches) before its finalists.
fn halving() -> Box<dyn Strategy> {
    Box::new(Halving {
        eta: 2,
        keep_at_least: 2,
    })
}

#[test]
fn halving_sends_its_screening_rounds_ahead() {
    let (plain, _, _) = run_pipelined(halving(), false, None, |_| false);
    let (ahead, _, log) = run_pipelined(halving(), true, None, |_| false);
    assert_eq!(outcomes(&plain), outcomes(&ahead), "the same records");
    // Every job screened went out ahead, the pruned ones included (a
    // screening request takes its set number of batches in one call).
    let pruned: Vec<&str> = ahead
        .iter()
        .filter(|j| j.status == JobStatus::Pruned)
        .map(|j| j.job_id.as_str())
        .collect();
    assert!(pruned.len() >= 3, "{ahead:?}");
    for id in &pruned {
        assert!(log.contains(&format!("send {id}")), "{id}: {log:?}");
    }
    // Survivors of the first round are screened again, ahead.
    let sends = |id: &str| log.iter().filter(|e| **e == format!("send {id}")).count();
    let finalists: Vec<&str> = ahead
        .iter()
        .filter(|j| j.status == JobStatus::Ok)
        .map(|j| j.job_id.as_str())
        .collect();
    assert!(!finalists.is_empty());
    for id in finalists {
        assert!(
            sends(id) >= 4,
            "{id}: screened three times and measured: {log:?}"
        );
    }
}

/// Three re-timing checks per finalist offered to reuse the verdict,
/// and `by_launches` of them warmed up by launches alone (`Folding`'s
/// counts).
fn assert_retiming_calls(
    calls: &HashMap<&'static str, usize>,
    finalists: usize,
    by_launches: usize,
) {
    let count = |k: &str| calls.get(k).copied().unwrap_or(0);
    assert_eq!(
        count("offering to reuse the check"),
        3 * finalists,
        "{calls:?}"
    );
    assert_eq!(
        count("re-timing warmed up by launches alone"),
        by_launches,
        "{calls:?}"
    );
}

/// Each finalist's (job, samples, median), by job.
fn final_samples(f: &[FinalRecord]) -> Vec<(String, u64, f64)> {
    let mut v: Vec<_> = f
        .iter()
        .map(|f| (f.job_id.clone(), f.stats.n, f.stats.median_us))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn the_finalists_re_timing_is_sent_ahead_too() {
    let (plain, plain_finals, _, _) =
        run_pipelined_on(Box::new(Grid), false, None, |_| false, None);
    let (ahead, finals, log, calls) = run_pipelined_on(Box::new(Grid), true, None, |_| false, None);
    assert_eq!(outcomes(&plain), outcomes(&ahead));
    assert!(!finals.is_empty());
    assert_eq!(final_samples(&plain_finals), final_samples(&finals));
    // No call waited for: each finalist's three re-timing checks went
    // out ahead, after its measurement.
    let count = |k: &str| calls.get(k).copied().unwrap_or(0);
    assert_eq!(count("check_then_sample waited for"), 0, "{calls:?}");
    for f in &finals {
        let sends = log
            .iter()
            .filter(|e| **e == format!("send {}", f.job_id))
            .count();
        assert_eq!(sends, 1 + 3, "{}: {log:?}", f.job_id);
    }
    // The re-timing checks, and only they, offer to reuse the verdict
    // of the finalist's first check; back to back, they warm up by
    // launches alone.
    assert_retiming_calls(&calls, finals.len(), 3 * finals.len());
}

#[test]
fn a_rested_re_timing_waits_for_each_batch_and_idles_after_it() {
    let (_, plain_finals, _, _) = run_pipelined_on(Box::new(Grid), true, None, |_| false, None);
    let started = Instant::now();
    let (_, finals, log, calls) =
        run_pipelined_with(Box::new(Grid), true, None, |_| false, None, 2.0);
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    assert!(!finals.is_empty());
    assert_eq!(
        final_samples(&plain_finals),
        final_samples(&finals),
        "the same batches"
    );
    // Each finalist's three re-timing checks were waited for, none sent
    // ahead, and the lane idled twice each batch's kernel time after it.
    let count = |k: &str| calls.get(k).copied().unwrap_or(0);
    assert_eq!(
        count("check_then_sample waited for"),
        3 * finals.len(),
        "{calls:?}"
    );
    for f in &finals {
        let sends = log
            .iter()
            .filter(|e| **e == format!("send {}", f.job_id))
            .count();
        assert_eq!(
            sends, 1,
            "{}: measured ahead, re-timed waited for: {log:?}",
            f.job_id
        );
    }
    // Each waited-for re-timing check, and no other, offers to reuse
    // the verdict of the finalist's first check; resting after each
    // batch, each keeps the whole warm-up.
    assert_retiming_calls(&calls, finals.len(), 0);
    let kernel_ms: f64 = finals
        .iter()
        .map(|f| f.stats.mean_us * f.stats.n as f64 / 1e3)
        .sum();
    assert!(kernel_ms > 1.0, "{kernel_ms}");
    assert!(
        elapsed_ms >= 2.0 * kernel_ms,
        "{elapsed_ms} ms against {kernel_ms} ms of kernels"
    );
}

#[test]
fn screening_cut_short_by_the_wall_cap_takes_the_rest_itself() {
    // A 1.5 ms cap stops the worker after two of the fake's 1 ms
    // batches; the third round asks for four.
    let cap = Some(1.5);
    let (plain, _, _, plain_calls) = run_pipelined_on(halving(), false, None, |_| false, cap);
    let (ahead, _, log, calls) = run_pipelined_on(halving(), true, None, |_| false, cap);
    assert_eq!(outcomes(&plain), outcomes(&ahead), "the same samples");
    // The short screenings were sent ahead as without the cap, then
    // topped up.
    let (_, _, uncapped_log, _) = run_pipelined_on(halving(), true, None, |_| false, None);
    let sends = |log: &[String]| log.iter().filter(|e| e.starts_with("send")).count();
    assert_eq!(sends(&log), sends(&uncapped_log), "{log:?}");
    let count = |c: &HashMap<&str, usize>, k: &str| c.get(k).copied().unwrap_or(0);
    let waited = count(&calls, "check_then_sample waited for");
    // The third round's screenings came back two batches short: each
    // was asked again, waited for, for the batches left (the
    // finalists' re-timing waits for its calls too).
    let (_, _, _, uncapped) = run_pipelined_on(halving(), true, None, |_| false, None);
    let waited_uncapped = count(&uncapped, "check_then_sample waited for");
    assert!(waited > waited_uncapped, "{calls:?} {uncapped:?} {log:?}");
    assert!(count(&plain_calls, "check_then_sample waited for") > waited);
}

#[test]
fn a_screening_lost_with_its_worker_is_screened_again() {
    // job3's first screening kills the worker while job4's waits in
    // its pipe; waited for, job3's check kills it alone.
    let (plain, _, _) = run_pipelined(halving(), false, Some("job3"), |_| false);
    let (ahead, _, log) = run_pipelined(halving(), true, Some("job3"), |_| false);
    let send4 = log.iter().position(|e| e == "send job4").unwrap();
    let receive3 = log.iter().position(|e| e == "receive job3").unwrap();
    assert!(send4 < receive3, "{log:?}");
    let ids: std::collections::BTreeSet<&str> = ahead.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!((ahead.len(), ids.len()), (10, 10), "each job recorded once");
    let job3 = ahead.iter().find(|j| j.job_id == "job3").unwrap();
    assert_eq!(job3.failure.as_ref().unwrap().class, FailureClass::Crash);
    // job4 went with the worker: screened again, waited for, after the
    // rest of the round, and kept in its place in the round's order, so
    // halving ranks and prunes exactly as when every call is waited for
    // (job3 aside: which kernels a crashed check reports is the fake's).
    let (mut plain, mut ahead) = (outcomes(&plain), outcomes(&ahead));
    assert_eq!(plain.remove("job3").unwrap().0, JobStatus::Failed);
    ahead.remove("job3");
    assert_eq!(plain, ahead);
}

#[test]
fn a_measurement_lost_with_its_worker_is_measured_again() {
    let (plain, _, _) = run_pipelined(Box::new(Grid), false, None, |_| false);
    // job3's check kills the worker while job4's request waits for it.
    let (ahead, _, log) = run_pipelined(Box::new(Grid), true, Some("job3"), |_| false);
    let send4 = log.iter().position(|e| e == "send job4").unwrap();
    let receive3 = log.iter().position(|e| e == "receive job3").unwrap();
    assert!(send4 < receive3, "{log:?}");
    assert_eq!(ahead.len(), 10, "each job recorded once");
    let job3 = ahead.iter().find(|j| j.job_id == "job3").unwrap();
    assert_eq!(job3.status, JobStatus::Failed);
    assert_eq!(job3.failure.as_ref().unwrap().class, FailureClass::Crash);
    // job4 went with the worker: measured again, last, waited for, with
    // the samples it would have had.
    assert_eq!(ahead.last().unwrap().job_id, "job4");
    let mut want = outcomes(&plain);
    want.remove("job3");
    let mut got = outcomes(&ahead);
    got.remove("job3");
    assert_eq!(want, got);
    // job3's record came before those of the answers read after it.
    let at = |id: &str| ahead.iter().position(|j| j.job_id == id).unwrap();
    assert!(at("job3") < at("job5"));
    // The lane went on sending ahead after the loss: job6 before job5's
    // answer was read.
    let at_log = |e: &str| log.iter().position(|x| x == e).unwrap();
    assert!(at_log("receive job4") < at_log("send job5"), "{log:?}");
    assert!(at_log("send job6") < at_log("receive job5"), "{log:?}");
}

#[test]
fn a_job_that_needs_calls_of_its_own_is_sent_with_nothing_under_way() {
    let (plain, _, _) = run_pipelined(Box::new(Grid), false, None, |_| false);
    // Every fourth job needs its recipe first, as a batch of recipes does.
    let needs = |j: &Job| j.config["B"].as_u64().unwrap() % 4 == 0;
    let (ahead, _, log) = run_pipelined(Box::new(Grid), true, None, needs);
    assert_eq!(outcomes(&plain), outcomes(&ahead), "the same records");
    let mut under_way = 0usize;
    for entry in &log {
        match entry.strip_prefix("send ") {
            Some(id) => {
                let b: u64 = id.trim_start_matches("job").parse().unwrap();
                if b % 4 == 0 {
                    assert_eq!(under_way, 0, "{id} sent with others under way: {log:?}");
                }
                under_way += 1;
            }
            None => under_way -= 1,
        }
    }
    // And the jobs between were sent ahead.
    let at_log = |e: &str| log.iter().position(|x| x == e).unwrap();
    assert!(at_log("send job2") < at_log("receive job1"), "{log:?}");
}
