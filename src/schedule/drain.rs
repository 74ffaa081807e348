//! The drain phase of a run: the planner's thread deals groups to the lanes
//! (and their jobs to the compile pool), one thread per lane runs them, and
//! the calling thread is the journal's single writer, counting every event
//! into the run's outcome and the progress display. Also the run header the
//! journal opens with, and what a retiring lane hands back.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backend::native::LaneBackend;
use crate::backend::{Backend, Flush, JobFailure, SampleMode};
use crate::diag::Diagnostic;
use crate::manifest::{MethodKind, Shape, Tolerance};
use crate::measure::{L2Flush, Protocol};
use crate::plan::{self, Mode, PlanOptions};
use crate::search::{PriorObservation, Strategies};
use crate::store::lock::Claim;
use crate::store::{
    Entry, Fingerprint, JobStatus, Journal, LaneRetired, MethodRecord, OutputSpec, RunHeader,
    SearchRecord, FORMAT_VERSION,
};

use super::resume::{Keep, Selection};
use super::workers::Workers;
use super::{
    ab, compile, deal, interrupted, lane, now_rfc3339, preflight, progress, Event, Group, RunError,
    RunOptions, RunOutcome,
};

/// Groups the planner may queue ahead of the lanes (and so the compile pool
/// ahead of the GPU): enough to keep 16 compile workers busy on spaces of a
/// few dozen configs, few enough to hold in memory on any plan.
const GROUPS_AHEAD: usize = 16;

/// What the run needs to open its journal once its first worker answered.
pub(super) struct Opening<'a> {
    /// The results directory, locked since the run began.
    pub(super) claim: Claim,
    pub(super) first_shape: &'a Shape,
    /// The journal's last run header, to report what changed since.
    pub(super) previous: Option<&'a RunHeader>,
    pub(super) fingerprint: Fingerprint,
}

/// The journal header of this run.
fn run_header(
    opts: &RunOptions<'_>,
    protocol: &Protocol,
    tolerance: &Tolerance,
    descriptions: &HashMap<String, String>,
    fingerprint: Fingerprint,
    planned: u64,
    started_at: String,
) -> RunHeader {
    let exp = opts.exp;
    RunHeader {
        format: FORMAT_VERSION,
        experiment: exp.name.clone(),
        description: exp.description.clone(),
        problem: exp.problem.clone(),
        mode: opts.mode,
        run_mode: opts.run_mode,
        device: opts.device.clone(),
        outputs: exp
            .outputs
            .iter()
            .map(|o| OutputSpec {
                format: o.format,
                path: o.path.clone(),
                method: o.method.clone(),
                legacy_keys: o.legacy_keys,
            })
            .collect(),
        protocol: protocol.clone(),
        search: SearchRecord::from(&exp.search),
        tolerance: tolerance.clone(),
        methods: exp
            .methods
            .iter()
            .map(|m| MethodRecord {
                name: m.name.clone(),
                kind: m.kind,
                kernel: m.kernel.clone(),
                description: descriptions.get(&m.kernel).cloned(),
                baseline: m.baseline.as_ref().map(|b| b.name.clone()),
                search: m.search.as_ref().map(SearchRecord::from),
            })
            .collect(),
        compared: exp.compared.clone(),
        fingerprint,
        started_at,
        planned_jobs: planned,
    }
}

/// Everything the drain phase shares with its threads.
pub(super) struct Drain<'a> {
    pub(super) opts: &'a RunOptions<'a>,
    pub(super) protocol: Protocol,
    pub(super) tolerance: Tolerance,
    pub(super) strategies: &'a Strategies,
    pub(super) prior: &'a HashMap<String, Vec<PriorObservation>>,
    pub(super) select: &'a Selection<'a>,
    pub(super) plan_opts: &'a PlanOptions<'a>,
    /// The groups to run, in dealing order.
    pub(super) groups: Vec<deal::Pending>,
    /// Planned jobs the journal records as unavailable (`Counted`): the run
    /// header's planned jobs leave them out, since the journal has them.
    pub(super) unavailable_before: u64,
    /// When the run started, for the progress display's elapsed time.
    pub(super) started: Instant,
    /// When the command started (RFC 3339), for the run header; `None`: when
    /// the header is written (`run` says why).
    pub(super) started_at: Option<String>,
    /// The compile pool compiles native methods too.
    pub(super) native_compiles: bool,
}

/// Runs the plan to the end (or to Ctrl-C). The planner starts at once,
/// feeding the compile pool while the lanes' workers import torch; then the
/// first lane's worker must answer and the problem load (else the run stops,
/// having written nothing), the journal opens with the run's header, the
/// lanes start taking groups, and this thread becomes the journal's single
/// writer: every record is on disk before the next is read.
pub(super) fn drain(
    run: &Drain<'_>,
    workers: Workers,
    opening: Opening<'_>,
    outcome: &mut RunOutcome,
) -> Result<(), RunError> {
    let opts = run.opts;
    let Workers {
        pool, mut lanes, ..
    } = workers;
    outcome.lanes = lanes.len();
    let flush = match (opts.mode, run.protocol.flush) {
        (Mode::Gpu, L2Flush::Read | L2Flush::Memset) => Flush {
            with: run.protocol.flush,
            bytes: run.protocol.flush_bytes_for(opts.device.l2_bytes),
        },
        _ => Flush::NONE,
    };
    let unused_board = compile::CompileBoard::default();
    let board = pool.as_ref().map_or(&unused_board, |p| p.board());
    let use_pool = pool.is_some();
    let peak = |dtype: Option<&str>| -> f64 {
        match dtype {
            Some("fp32") => opts.device.peak_tflops_fp32,
            Some("fp8") => opts.device.peak_tflops_fp8,
            Some("fp16") => opts.device.peak_tflops_fp16,
            // bf16, and mxfp4: its weights are dequantised to 16-bit activations.
            _ => opts.device.peak_tflops_bf16,
        }
    };
    let dealer = deal::Dealer::new(GROUPS_AHEAD, lanes.len());
    let last_good = Mutex::new(None);
    let retire = || {
        let granted = dealer.retire();
        if granted && use_pool {
            board.set_width(dealer.alive());
        }
        granted
    };
    let lane_opts = LaneOptions {
        run,
        sampling: SampleMode {
            timing: run.protocol.timing,
            flush,
            graph_calls: run.protocol.graph_calls,
        },
        peak: &peak,
        board: use_pool.then_some(board),
        dealer: &dealer,
        last_good: &last_good,
        retire: &retire,
    };
    let result = std::thread::scope(|scope| -> Result<(), RunError> {
        // Whatever ends this closure abandons the queue, so the planner and
        // idle lanes stop.
        struct Abandon<'d>(&'d deal::Dealer);
        impl Drop for Abandon<'_> {
            fn drop(&mut self) {
                self.0.abandon();
            }
        }
        let _abandon = Abandon(&dealer);
        let planner = spawn_planner(scope, run, &dealer, use_pool.then_some(board));

        let first = lanes.remove(0);
        let (mut first_backend, hello) = first.worker.join().expect("lane start-up thread");
        // The failure's message says what to do.
        let hello = hello.map_err(|f| RunError::Environment(f.message))?;
        let descriptions = preflight::check_problem(
            opts.exp,
            &mut first_backend.python,
            opening.first_shape,
            &opts.python,
        )
        .map_err(RunError::Input)?;
        let (mut journal, repaired) = Journal::open_claimed(opening.claim)?;
        if let Some(notice) = repaired {
            eprintln!("warning: {notice}");
        }
        let mut fingerprint = opening.fingerprint;
        fingerprint.python = Some(hello.python.clone());
        fingerprint.torch = hello.torch.clone();
        fingerprint.triton = hello.triton.clone();
        fingerprint.cuda = hello.cuda.clone();
        outcome.fingerprint_changes = opening
            .previous
            .map(|h| diff_fingerprint(&h.fingerprint, &fingerprint))
            .unwrap_or_default();
        journal.append(&Entry::Run(Box::new(run_header(
            opts,
            &run.protocol,
            &run.tolerance,
            &descriptions,
            fingerprint,
            outcome.planned - run.unavailable_before,
            run.started_at.clone().unwrap_or_else(now_rfc3339),
        ))))?;
        if let Some(plan) = opts.ab {
            journal.append(&Entry::AbSetup(Box::new(plan.setup.clone())))?;
        }

        let (event_tx, event_rx) = mpsc::channel::<Event>();
        let started = std::iter::once((first.number, first.device, first_backend, Ok(()))).chain(
            lanes.into_iter().map(|l| {
                let (backend, hello) = l.worker.join().expect("lane start-up thread");
                (l.number, l.device, backend, hello.map(|_| ()))
            }),
        );
        for (number, device, backend, hello) in started {
            spawn_lane(scope, &lane_opts, number, device, backend, hello, &event_tx);
        }
        drop(event_tx);
        let mut display = progress::Progress::new(outcome.planned, opts.progress, run.started);
        if opts.ab.is_some() {
            display = display.of_pairs();
        }
        loop {
            // A second without an event lets the display say the run goes on.
            let event = match event_rx.recv_timeout(Duration::from_secs(1)) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    display.tick();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            match event {
                Event::Job(record) => {
                    match record.status {
                        JobStatus::Ok => outcome.ok += 1,
                        JobStatus::Failed => outcome.failed += 1,
                        JobStatus::Pruned => outcome.pruned += 1,
                        JobStatus::Skipped if record.failure.is_some() => outcome.unavailable += 1,
                        JobStatus::Skipped => outcome.skipped_by_search += 1,
                        JobStatus::Checked => outcome.checked += 1,
                    }
                    display.job(&record);
                    if run.select.repeats(&record) {
                        continue;
                    }
                    let appended = Instant::now();
                    journal.append(&Entry::Job(record))?;
                    crate::trace::span("journal", "append", appended, serde_json::json!({}));
                }
                Event::Final(f) => journal.append(&Entry::Final(f))?,
                Event::AbPair(p) => {
                    if opts.progress {
                        display.note(&ab::progress_line(
                            &p,
                            outcome.ok + outcome.failed,
                            outcome.planned,
                        ));
                    }
                    if p.failure.is_some() {
                        outcome.failed += 1;
                    } else {
                        outcome.ok += 1;
                    }
                    display.pair(p.failure.is_some());
                    journal.append(&Entry::AbPair(p))?;
                }
                Event::Retired(r) => {
                    display.note(&format!(
                        "warning: lane {}{} retired: {}; {} handed to the other lanes",
                        r.lane,
                        r.device
                            .as_ref()
                            .map(|d| format!(" (GPU {d})"))
                            .unwrap_or_default(),
                        r.reason,
                        crate::emit::num::count(r.requeued_jobs, "job", "jobs"),
                    ));
                    // Failures that led to it run again: not failures of this run.
                    outcome.failed = outcome.failed.saturating_sub(r.failed_jobs.len() as u64);
                    journal.append(&Entry::LaneRetired(r.clone()))?;
                    outcome.retired.push(r);
                }
            }
        }
        display.finish();
        planner
            .join()
            .expect("planner thread")
            .map_err(|d| RunError::Input(d.into()))
    });
    // The compile workers have drained their queue by now; wait for them to exit.
    drop(pool);
    result
}

/// What every lane of a run shares.
struct LaneOptions<'a> {
    run: &'a Drain<'a>,
    sampling: SampleMode,
    peak: &'a (dyn Fn(Option<&str>) -> f64 + Sync),
    board: Option<&'a compile::CompileBoard>,
    dealer: &'a deal::Dealer,
    last_good: &'a Mutex<Option<lane::JobRef>>,
    retire: &'a (dyn Fn() -> bool + Sync),
}

/// One lane's thread, owning one GPU's worker: it takes groups as it frees
/// up until all are dealt, the run is interrupted, the journal's writer is
/// gone or the lane retires, then shuts its worker down. A lane whose worker
/// could not start retires at once (unless it is the last).
fn spawn_lane<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    o: &'scope LaneOptions<'env>,
    number: u32,
    device: Option<String>,
    mut backend: LaneBackend,
    hello: Result<(), JobFailure>,
    event_tx: &mpsc::Sender<Event>,
) {
    let run = o.run;
    let events = event_tx.clone();
    let ctx = lane::LaneContext {
        protocol: run.protocol.clone(),
        tolerance: run.tolerance.clone(),
        strategies: run.strategies,
        run_mode: run.opts.run_mode,
        sampling: o.sampling,
        peak_gbs: run.opts.device.peak_gbs,
        peak_tflops: o.peak,
        compile: o.board,
        lane: number,
        prior: run.prior,
        health: Some(lane::HealthWatch {
            state: Default::default(),
            last_good: o.last_good,
            retire: o.retire,
        }),
        ab: run.opts.ab.map(|plan| &plan.timing),
    };
    scope.spawn(move || {
        let retired = |reason: String, failed: &[lane::JobRef], requeued: u64| {
            Event::Retired(LaneRetired {
                lane: number,
                device: device.clone(),
                reason,
                failed_jobs: failed.iter().map(|f| f.job.id.clone()).collect(),
                requeued_jobs: requeued,
                at: now_rfc3339(),
            })
        };
        if let Err(f) = hello {
            // The last lane goes on: a start is tried again at each job, whose
            // record says why it failed.
            if (o.retire)() {
                let why = f.message.lines().next().unwrap_or("").to_string();
                let _ = events.send(retired(format!("its worker did not start: {why}"), &[], 0));
                return;
            }
        }
        while let Some(group) = o.dealer.take() {
            // The journal's writer stops at its first failed write; a
            // result nobody can record is not worth measuring.
            let mut writer_gone = false;
            let rest = lane::run_group(&ctx, &mut backend as &mut dyn Backend, group, &mut |e| {
                writer_gone |= events.send(e).is_err();
            });
            if let Some(rest) = rest {
                let health = ctx.health.as_ref().expect("a retired lane has health");
                let state = health.state.borrow();
                let handed = hand_back(rest, &state.streak);
                let jobs: u64 = handed.iter().map(|g| g.jobs.len() as u64).sum();
                let reason = state.retired.clone().unwrap_or_default();
                let _ = events.send(retired(reason, &state.streak, jobs));
                o.dealer.hand_back(handed);
                o.dealer.done();
                break;
            }
            o.dealer.done();
            if writer_gone {
                o.dealer.abandon();
            }
            if interrupted() || writer_gone {
                break;
            }
        }
        backend.shutdown();
    });
}

/// What a retiring lane hands back: its group's unrecorded jobs and the
/// failures that led to the retirement, grouped by (method, shape), the
/// failures first.
fn hand_back(rest: Group, failed: &[lane::JobRef]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for f in failed {
        let same = |g: &Group| g.method == f.job.method && g.shape == f.job.shape;
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.jobs.push(f.job.clone()),
            None => groups.push(Group {
                shape: f.job.shape.clone(),
                method: f.job.method.clone(),
                kernel: f.kernel.clone(),
                kind: f.kind,
                jobs: vec![f.job.clone()],
                unavailable: None,
            }),
        }
    }
    match groups
        .iter_mut()
        .find(|g| g.method == rest.method && g.shape == rest.shape)
    {
        Some(g) => g.jobs.extend(rest.jobs),
        None if !rest.jobs.is_empty() => groups.push(rest),
        None => {}
    }
    groups
}

/// The planner thread: the groups in dealing order, each planned in full
/// when its turn comes, to the lanes and (Triton jobs) to the compile pool,
/// which so sees jobs in the order the lanes will take them.
fn spawn_planner<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    run: &'env Drain<'env>,
    dealer: &'env deal::Dealer,
    board: Option<&'env compile::CompileBoard>,
) -> std::thread::ScopedJoinHandle<'scope, Result<(), Diagnostic>> {
    let exp = run.opts.exp;
    scope.spawn(move || {
        let plan_started = Instant::now();
        let mut result = Ok(());
        for pending in &run.groups {
            if interrupted() {
                break;
            }
            let Some(method) = exp.method(&pending.method) else {
                continue;
            };
            let mut group = Group {
                shape: pending.shape.clone(),
                method: pending.method.clone(),
                kernel: method.kernel.clone(),
                kind: method.kind,
                jobs: Vec::new(),
                unavailable: unavailable_here(method, run.opts.mode),
            };
            if let Some(ab) = run.opts.ab {
                // An A/B pair's jobs come from its plan, not the method's space.
                match ab.group(&pending.method, pending.shape_index) {
                    Some(pair) => {
                        group = Group {
                            unavailable: pair.unavailable.or(group.unavailable),
                            ..pair
                        }
                    }
                    None => continue,
                }
            } else {
                let this = |m: &str, i: usize| m == pending.method && i == pending.shape_index;
                let planned = plan::plan_groups(exp, run.plan_opts, Some(&this), &mut |job| {
                    if run.select.keep(&job, exp) == Keep::Run {
                        group.jobs.push(job);
                    }
                    ControlFlow::Continue(())
                });
                if let Err(d) = planned {
                    result = Err(d);
                    break;
                }
            }
            if group.jobs.is_empty() {
                continue;
            }
            let compiled_ahead = match method.kind {
                MethodKind::Triton => true,
                MethodKind::Cuda | MethodKind::Hip => run.native_compiles,
                _ => false,
            };
            if let (Some(board), true) = (board, compiled_ahead) {
                board.begin_group();
                // A strategy that measures what it was planned takes its jobs
                // as they compile: cheap ones first, then the longest first
                // (`compile_order`). The surrogate picks its jobs one by one,
                // in no order a compile cost can foresee: plan order.
                let measures_all = !matches!(
                    exp.search_for(method).kind,
                    crate::search::SearchKind::Surrogate { .. }
                );
                let queued: Vec<&plan::Job> = if method.kind == MethodKind::Triton && measures_all {
                    compile::compile_order(&group.jobs, run.opts.compile_workers)
                } else {
                    group.jobs.iter().collect()
                };
                for job in queued {
                    board.push(job.clone(), &method.kernel, method.kind.as_str());
                }
            }
            if !dealer.push(group) {
                break;
            }
        }
        dealer.close();
        if let Some(board) = board {
            board.close();
        }
        crate::trace::span("planner", "plan", plan_started, serde_json::json!({}));
        result
    })
}

/// Why a method cannot run in this mode, when the runner knows it ahead: an
/// `ir:` method has no Python source the interpreter could run.
fn unavailable_here(method: &crate::manifest::Method, mode: Mode) -> Option<String> {
    match (&method.ir, mode) {
        (Some(ir), Mode::Interpreter) => Some(format!(
            "runs from IR ({}), which needs a GPU: the interpreter runs the kernel's Python source",
            ir.file_name().map_or_else(
                || ir.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            )
        )),
        _ => None,
    }
}

fn diff_fingerprint(old: &Fingerprint, new: &Fingerprint) -> Vec<String> {
    let a = serde_json::to_value(old).expect("fingerprint");
    let b = serde_json::to_value(new).expect("fingerprint");
    let mut changes = Vec::new();
    if let (Some(a), Some(b)) = (a.as_object(), b.as_object()) {
        for (k, v) in b {
            let before = a.get(k).cloned().unwrap_or_default();
            if before != *v {
                changes.push(format!("{k}: {before} -> {v}"));
            }
        }
    }
    changes
}
