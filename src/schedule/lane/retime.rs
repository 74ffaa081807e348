//! The finalists' re-timing: after a tuned group, its best few configs
//! timed again in interleaved rounds of shuffled order, so that clock and
//! thermal drift hit them alike, under the run's timing and each of
//! `protocol.retime_with`; each is recorded as a finalist record. An A/B
//! pair (`schedule::ab`) is timed in the same rounds ([`retime_round`]).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::backend::{Backend, SampleMode, SentAhead};
use crate::manifest::{shape_dtype, MethodKind};
use crate::measure::{self, Protocol, Sampling, Stats, Timing};
use crate::schedule::Event;
use crate::store::FinalRecord;

use super::ahead::{read_received, UNDER_WAY};
use super::measured::{prepare, retiming_batch, screening_rule, take_batch_as};
use super::{LaneContext, Measured};

/// The best few configs of a group, re-timed interleaved in shuffled order so
/// that clock and thermal drift hit them alike: the run's own way, then each
/// way of `protocol.retime_with`, each recorded as a finalist record of its
/// timing. `track`: the lane's trace track, where the GPU's rests go.
pub(super) fn retime_finalists(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    kernel: &str,
    kind: MethodKind,
    measured: Vec<Measured>,
    track: &str,
    emit: &mut dyn FnMut(Event),
) {
    // Each median once, not a sort of a job's samples in every comparison
    // (some 500 for 48 jobs): the GPU is idle from the last job's answer
    // to the first re-timing check (0.59 ms before this, 0.36 ms after, in
    // two H200 runs: results/bench/NVIDIA_H200/native-idle-56a495b).
    let mut by_median: Vec<(f64, Measured)> =
        measured.into_iter().map(|m| (m.median(), m)).collect();
    by_median.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut alive: Vec<Measured> = by_median
        .into_iter()
        .take(ctx.protocol.finalists as usize)
        .map(|(_, m)| m)
        .collect();
    let timings =
        std::iter::once(ctx.protocol.timing).chain(ctx.protocol.retime_with.iter().copied());
    for timing in timings {
        if ctx.stopping() {
            return;
        }
        retime(ctx, backend, kernel, kind, &mut alive, timing, track, emit);
    }
}

/// One round of a re-timing: a check and one batch of each finalist of
/// `order`, in that order; the batches that came, by finalist (a failed
/// check or batch gives none). With `protocol.retime_rest` the GPU rests
/// after each batch (`rest_after`), so each is waited for; else they are
/// sent ahead where the backend can (two under way, as `Lane::ask_each`
/// does), with a rule that counts one batch; answers lost with their
/// worker, or that came without a batch, are asked again after the round's
/// last, waited for.
#[allow(clippy::too_many_arguments)]
pub(in crate::schedule) fn retime_round(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    kernel: &str,
    kind: MethodKind,
    alive: &mut [Measured],
    order: &[usize],
    mode: SampleMode,
    count: u32,
    track: &str,
) -> Vec<(usize, Sampling)> {
    let max_wall_ms = ctx.protocol.stop_rule().max_wall_ms;
    let rest = ctx.protocol.retime_rest;
    let ahead = max_wall_ms.is_finite() && rest == 0.0;
    let first = retiming_batch(
        ctx,
        mode,
        count,
        Some(screening_rule(1, count, max_wall_ms)),
    );
    let mut got = Vec::new();
    let mut under_way: VecDeque<usize> = VecDeque::new();
    let mut again: Vec<usize> = Vec::new();
    for &i in order {
        // Cloned: answers read while it waits to be sent update the other finalists.
        let job = alive[i].job.clone();
        let sent = if ahead {
            let tol = ctx.tolerance.for_dtype(shape_dtype(&job.shape));
            loop {
                match backend.send_measurement(
                    &job,
                    kernel,
                    kind.as_str(),
                    tol,
                    ctx.protocol.seed,
                    first,
                ) {
                    Ok(SentAhead::WhenIdle) if !under_way.is_empty() => {
                        while let Some(j) = under_way.pop_front() {
                            receive_retimed(ctx, backend, &mut alive[j], j, &mut got, &mut again);
                        }
                    }
                    other => break other,
                }
            }
        } else {
            Ok(SentAhead::Declined)
        };
        match sent {
            Ok(SentAhead::Sent) => under_way.push_back(i),
            Ok(SentAhead::Declined | SentAhead::WhenIdle) => {
                while let Some(j) = under_way.pop_front() {
                    receive_retimed(ctx, backend, &mut alive[j], j, &mut got, &mut again);
                }
                if let Some(sampling) =
                    retime_now(ctx, backend, kernel, kind, &mut alive[i], mode, count)
                {
                    rest_after(&sampling, mode, rest, track, backend.last_done());
                    got.push((i, sampling));
                }
            }
            // This finalist's batch is missing from the round, as a failed check's is.
            Err(_) => {}
        }
        while under_way.len() >= UNDER_WAY {
            let j = under_way.pop_front().expect("under way");
            receive_retimed(ctx, backend, &mut alive[j], j, &mut got, &mut again);
        }
    }
    while let Some(j) = under_way.pop_front() {
        receive_retimed(ctx, backend, &mut alive[j], j, &mut got, &mut again);
    }
    for i in again {
        if let Some(sampling) = retime_now(ctx, backend, kernel, kind, &mut alive[i], mode, count) {
            rest_after(&sampling, mode, rest, track, backend.last_done());
            got.push((i, sampling));
        }
    }
    got
}

/// Leaves the GPU idle for `rest` times the kernel time of a re-timing
/// batch just taken. Back to back, a long kernel's finalists run the GPU
/// into its power cap: on an H100 (2026-11-24) the bench GEMM's re-timing
/// ran at 1560-1680 MHz where its first pass had run at 1965, and the two
/// best configs, 3 % apart there, came out within 1 % and in either order;
/// resting as long as each batch ran kept 1770-1920 MHz and their order
/// (results/bench/NVIDIA_H100_80GB_HBM3/retime_rest/README.md).
///
/// The rest counts from `done`, when the worker finished the batch (the
/// GPU has been idle since), not from when the lane read the answer, and
/// its last [`REST_SPUN`] is spun, not slept: in H200 and H100 traces
/// (2026-11-24, commit ca31224) the lane began resting 70-77 µs after the
/// worker had finished, and the sleep's wake-up made each rest 72-138 µs
/// longer than asked (results/bench/NVIDIA_H200/native-idle-56a495b).
pub(super) fn rest_after(
    sampling: &Sampling,
    mode: SampleMode,
    rest: f64,
    track: &str,
    done: Option<Instant>,
) {
    if rest <= 0.0 {
        return;
    }
    let calls = if mode.timing == Timing::Graph {
        mode.graph_calls.max(1) as f64
    } else {
        1.0
    };
    let kernel_ms = sampling.samples_us.iter().sum::<f64>() * calls / 1e3;
    let now = Instant::now();
    let started = done.filter(|d| *d <= now).unwrap_or(now);
    let until = started + Duration::from_secs_f64(rest * kernel_ms / 1e3);
    if let Some(sleep) = until
        .checked_duration_since(now)
        .and_then(|left| left.checked_sub(REST_SPUN))
    {
        std::thread::sleep(sleep);
    }
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    // The rest is the protocol's up to `until`; the GPU's idle past it (the
    // lane read the answer later, or woke late) is the runner's, and the
    // trace shows it so.
    crate::trace::span_to(
        track,
        "rest",
        started,
        until,
        serde_json::json!({"kernel_ms": kernel_ms}),
    );
}

/// The end of a rest, spun rather than slept: a sleeping thread wakes up to
/// Linux's timer slack (50 µs by default) late, plus its wake-up.
const REST_SPUN: Duration = Duration::from_micros(200);

/// The oldest re-timing answer under way, finalist `i`'s, into the round:
/// its batch, or `i` to ask again; a failure gives nothing.
fn receive_retimed(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    m: &mut Measured,
    i: usize,
    got: &mut Vec<(usize, Sampling)>,
    again: &mut Vec<usize>,
) {
    match read_retimed(ctx, backend, m) {
        Some(Ok(Some(sampling))) => got.push((i, sampling)),
        Some(Ok(None)) | None => again.push(i),
        Some(Err(())) => {}
    }
}

/// The answer to a re-timing check sent ahead: `Ok(Some)` its batch,
/// `Ok(None)` passed with no batch (to ask again), `Err` failed, `None`
/// lost with its worker (to ask again). The finalist's own samples are
/// left as they were.
fn read_retimed(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    m: &mut Measured,
) -> Option<Result<Option<Sampling>, ()>> {
    let before = std::mem::take(&mut m.sampling);
    let read = read_received(ctx, backend, m);
    let got = std::mem::replace(&mut m.sampling, before);
    Some(match read? {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some(got)),
        Err(_) => Err(()),
    })
}

/// A finalist's re-timing check and batch, waited for: the batch, or `None`
/// where the check or the batch failed. Its own samples are left as they were.
fn retime_now(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    kernel: &str,
    kind: MethodKind,
    m: &mut Measured,
    mode: SampleMode,
    count: u32,
) -> Option<Sampling> {
    let before = std::mem::take(&mut m.sampling);
    // A re-timing: see `retiming_batch`.
    let ok = prepare(
        ctx,
        backend,
        kernel,
        kind,
        m,
        Some((mode, count)),
        None,
        true,
    )
    .and_then(|taken| {
        if taken {
            Ok(())
        } else {
            take_batch_as(backend, m, mode, count)
        }
    });
    let got = std::mem::replace(&mut m.sampling, before);
    ok.ok().map(|()| got)
}

/// The samples of a re-timing batch timed as `mode` says: the protocol's
/// batch, or under graph timing (each sample already the mean of
/// `graph_calls` launches) that many times fewer, at least 4.
pub fn retime_count(protocol: &Protocol, mode: SampleMode) -> u32 {
    match mode.timing {
        Timing::Graph => protocol.batch.div_ceil(mode.graph_calls.max(1)).max(4),
        Timing::Cold | Timing::Hot => protocol.batch,
    }
}

/// One interleaved re-timing of the finalists under `timing`. A graph sample
/// is already the mean of `graph_calls` launches, so a graph batch holds
/// that many times fewer samples (at least 4): the same launches timed.
#[allow(clippy::too_many_arguments)]
fn retime(
    ctx: &LaneContext<'_>,
    backend: &mut dyn Backend,
    kernel: &str,
    kind: MethodKind,
    alive: &mut [Measured],
    timing: Timing,
    track: &str,
    emit: &mut dyn FnMut(Event),
) {
    let mode = ctx.sampling.with_timing(timing);
    let count = retime_count(&ctx.protocol, mode);
    let mut samples: HashMap<String, Sampling> = HashMap::new();
    let mut rng = crate::rng::SplitMix64::new(ctx.protocol.seed ^ 0x5eed);
    const ROUNDS: usize = 3;
    for _ in 0..ROUNDS {
        let mut order: Vec<usize> = (0..alive.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for (i, got) in retime_round(
            ctx, backend, kernel, kind, alive, &order, mode, count, track,
        ) {
            let acc = samples.entry(alive[i].job.id.clone()).or_default();
            acc.samples_us.extend(got.samples_us);
            acc.clocks_mhz.extend(got.clocks_mhz);
            acc.wall_ms += got.wall_ms;
            acc.timer = got.timer;
        }
    }
    let stats: Vec<(String, Stats)> = alive
        .iter()
        .filter_map(|m| {
            samples
                .get(&m.job.id)
                .map(|s| (m.job.id.clone(), s.stats()))
        })
        .collect();
    let Some(best) = stats
        .iter()
        .min_by(|a, b| a.1.median_us.total_cmp(&b.1.median_us))
        .map(|b| b.1.clone())
    else {
        return;
    };
    for (job_id, s) in stats {
        let tied_with_best = measure::tied(&s, &best);
        emit(Event::Final(FinalRecord {
            job_id,
            timing,
            stats: s,
            tied_with_best,
        }));
    }
}
