//! The compile pool: CPU-side workers that compile jobs ahead of the GPU lane,
//! in the order the lane will need them, into one shared Triton cache.
//!
//! The board records each job's compile state. A lane that reaches a job
//! whose compile is under way waits for it rather than compiling it twice; a
//! job no compile worker has reached yet is claimed by the lane, which then
//! compiles it as part of its check.
//!
//! A lane asked for several jobs at once (a grid, a screening round) takes
//! whichever of them the pool has finished first (`first_ready`), so it
//! never idles on one slow compile while later jobs are ready.
//!
//! Jobs are queued by group, in the order the lanes are dealt the groups.
//! With several lanes, the first groups of the queue run at the same time,
//! one on each lane, so the workers take jobs round-robin from the first
//! [`CompileBoard::set_width`] groups that still have jobs queued: each lane
//! finds its next jobs compiled, rather than one lane's whole group first.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::backend::native::NativeCompiler;
use crate::backend::{Backend, Compiled, JobFailure, PythonBackend};
use crate::manifest::{Method, MethodKind};
use crate::plan::Job;

/// Compile workers, started as soon as a run begins so that their start-up
/// (importing torch and Triton) overlaps the lane worker's, each on its own
/// thread taking jobs from the board in lane order.
pub struct CompilePool {
    board: Arc<CompileBoard>,
    threads: Vec<JoinHandle<()>>,
}

/// The native half of the pool: compiles `kind: cuda|hip` jobs with the
/// runtime compiler, on a rayon pool of its own.
pub struct NativePool {
    pub compiler: Arc<NativeCompiler>,
    /// The native methods, by name.
    pub methods: Arc<HashMap<String, Method>>,
    pub threads: usize,
}

/// Triton methods launched natively over data the native worker builds
/// (`inputs: native`): their compile workers make each job's launch recipe
/// as they compile it, so the lane's own worker is not asked (a call per
/// batch of jobs on the lane's path, each finding the kernel in the cache
/// again).
pub struct RecipeAsk {
    pub methods: HashSet<String>,
    /// `{seed, cache_dir}`, as the lane asks for `recipes`.
    pub ask: serde_json::Value,
}

impl CompilePool {
    pub fn start(
        workers: Vec<PythonBackend>,
        native: Option<NativePool>,
        recipes: Option<RecipeAsk>,
    ) -> CompilePool {
        let board = Arc::new(CompileBoard::default());
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        if let Some(native) = native {
            // Its threads take only native jobs, in lane order, and compile in
            // this process: NVRTC needs no worker and no GPU.
            let board = Arc::clone(&board);
            threads.push(std::thread::spawn(move || {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(native.threads.max(1))
                    .thread_name(|i| format!("tunelab-nvrtc-{i}"))
                    .build();
                let Ok(pool) = pool else { return };
                pool.broadcast(|_| {
                    while let Some((job, _, _)) = board.next_where(true) {
                        if super::interrupted() {
                            board.requeue(&job.id);
                            break;
                        }
                        let result = match native.methods.get(&job.method) {
                            Some(m) => native
                                .compiler
                                .compile(m, &job)
                                .map(|a| Compiled::in_seconds(a.seconds)),
                            None => Err(JobFailure::new(
                                crate::store::FailureClass::ProblemError,
                                format!("no native method `{}`", job.method),
                            )),
                        };
                        board.finish(&job.id, result);
                    }
                });
            }));
        }
        let recipes = recipes.map(Arc::new);
        threads.extend(workers.into_iter().map(|mut backend| {
            let board = Arc::clone(&board);
            let recipes = recipes.clone();
            std::thread::spawn(move || {
                // A worker that cannot start is retried at its first job,
                // where the failure is recorded against that job.
                let _ = backend.start();
                while let Some((job, kernel, kind)) = board.next_where(false) {
                    if super::interrupted() {
                        // Hand it back: a lane that still reaches it compiles it itself.
                        board.requeue(&job.id);
                        break;
                    }
                    let result = match recipes.as_deref() {
                        Some(r) if r.methods.contains(&job.method) => {
                            backend.compile_with_recipe(&job, &kernel, &kind, &r.ask)
                        }
                        _ => backend
                            .compile(&job, &kernel, &kind)
                            .map(Compiled::in_seconds),
                    };
                    board.finish(&job.id, result);
                }
                backend.shutdown();
            })
        }));
        CompilePool { board, threads }
    }

    pub fn board(&self) -> &CompileBoard {
        &self.board
    }
}

impl Drop for CompilePool {
    /// Whatever ended the run, nothing queued is compiled any more: the
    /// workers finish the compile in hand and exit.
    fn drop(&mut self) {
        self.board.abandon();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Config values that are Triton's launch options, not the kernel's
/// compile-time sizes.
const TRITON_OPTIONS: [&str; 8] = [
    "num_warps",
    "num_stages",
    "num_ctas",
    "maxnreg",
    "waves_per_eu",
    "matrix_instr_nonkdim",
    "kpack",
    "num_buffers_warp_spec",
];

/// A Triton config's compile cost, relative to others of its space: the
/// product of its integer constexprs (its tile sizes) times `num_stages`,
/// over `num_warps`, which is the work each warp's code is unrolled over.
/// On the tuning-speed GEMM's 48 configs its log follows the log of the
/// measured compile time with correlation 0.90 to 0.94 (H100 hosts,
/// 2026-11-24; the times range from 0.23 to 1.8 s).
fn compile_cost(job: &Job) -> f64 {
    let number = |name: &str, default: f64| {
        job.config
            .get(name)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(default)
    };
    let sizes: f64 = job
        .config
        .iter()
        .filter(|(name, _)| !TRITON_OPTIONS.contains(&name.as_str()))
        .filter_map(|(_, v)| v.as_u64())
        .map(|v| v.max(1) as f64)
        .product();
    sizes * number("num_stages", 1.0).max(1.0) / number("num_warps", 4.0).max(1.0)
}

/// The order a group's Triton jobs go to the compile pool: the
/// `first_wave` cheapest first (one for each worker, so the lane has jobs
/// to time soon), then the rest from the most costly down (longest first,
/// so the last compiles to finish are short ones, not a long one started
/// late). Ties keep plan order. The lane takes them as they finish
/// ([`CompileBoard::first_ready`]). In plan order, the tuning-speed GEMM's
/// slowest compiles (128x256 tiles over 4 warps, 1.2 to 1.8 s) came last and
/// the pool's last compile ended 1.2 s after the average worker's (H100,
/// 2026-11-24).
pub fn compile_order(jobs: &[Job], first_wave: usize) -> Vec<&Job> {
    let mut by_cost: Vec<(f64, &Job)> = jobs.iter().map(|j| (compile_cost(j), j)).collect();
    by_cost.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut rest = by_cost.split_off(first_wave.min(by_cost.len()));
    rest.sort_by(|a, b| b.0.total_cmp(&a.0));
    by_cost.into_iter().chain(rest).map(|(_, j)| j).collect()
}

enum State {
    Queued,
    Compiling,
    Done(Result<Compiled, JobFailure>),
    /// The lane got there first.
    Claimed,
}

type Queued = (Job, String, String);

/// Whether a kind (as the board holds it) is compiled natively.
fn is_native(kind: &str) -> bool {
    kind == MethodKind::Cuda.as_str() || kind == MethodKind::Hip.as_str()
}

#[derive(Default)]
struct Inner {
    /// Queued jobs, by group, in dealing order.
    groups: VecDeque<VecDeque<Queued>>,
    /// Whether the next push starts a new group.
    new_group: bool,
    states: HashMap<String, State>,
    closed: bool,
    /// How many groups at the front are served round-robin: the lanes.
    width: usize,
    turn: usize,
}

impl Inner {
    /// Drops jobs no longer queued (claimed or cancelled) from the front of
    /// each group, and groups left empty.
    fn tidy(&mut self) {
        let states = &self.states;
        for g in self.groups.iter_mut() {
            while g
                .front()
                .is_some_and(|(j, _, _)| !matches!(states.get(&j.id), Some(State::Queued)))
            {
                g.pop_front();
            }
        }
        self.groups.retain(|g| !g.is_empty());
    }
}

#[derive(Default)]
pub struct CompileBoard {
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl CompileBoard {
    /// Queues a job in the current group (see [`begin_group`](Self::begin_group)).
    pub fn push(&self, job: Job, kernel: &str, kind: &str) {
        let mut inner = self.inner.lock().expect("compile board");
        inner.states.insert(job.id.clone(), State::Queued);
        if inner.new_group || inner.groups.is_empty() {
            inner.groups.push_back(VecDeque::new());
            inner.new_group = false;
        }
        inner.groups.back_mut().expect("a group").push_back((
            job,
            kernel.to_string(),
            kind.to_string(),
        ));
        self.changed.notify_all();
    }

    /// The jobs pushed from now on belong to the next group a lane will take.
    pub fn begin_group(&self) {
        self.inner.lock().expect("compile board").new_group = true;
    }

    /// How many lanes take groups at once (at least 1).
    pub fn set_width(&self, lanes: usize) {
        self.inner.lock().expect("compile board").width = lanes.max(1);
    }

    /// Drop everything still queued and close: for the end of a run.
    pub fn abandon(&self) {
        let mut inner = self.inner.lock().expect("compile board");
        inner.groups.clear();
        inner.closed = true;
        self.changed.notify_all();
    }

    /// The lane will not run this job (a search strategy skipped it): the
    /// pool need not compile it.
    pub fn cancel(&self, job_id: &str) {
        let mut inner = self.inner.lock().expect("compile board");
        if matches!(inner.states.get(job_id), Some(State::Queued)) {
            inner.states.insert(job_id.to_string(), State::Claimed);
        }
    }

    /// No more jobs will be pushed; idle compile workers may exit.
    pub fn close(&self) {
        self.inner.lock().expect("compile board").closed = true;
        self.changed.notify_all();
    }

    /// The next job to compile, in lane order; `None` once closed and drained.
    pub fn next(&self) -> Option<(Job, String, String)> {
        self.next_of(|_| true)
    }

    /// The next job of a native method (`native`), or of any other, in lane
    /// order; `None` once closed and none of that sort is left.
    pub fn next_where(&self, native: bool) -> Option<(Job, String, String)> {
        self.next_of(|kind| is_native(kind) == native)
    }

    fn next_of(&self, wanted: impl Fn(&str) -> bool) -> Option<(Job, String, String)> {
        let mut inner = self.inner.lock().expect("compile board");
        loop {
            inner.tidy();
            // The groups this sort of worker serves; a group holds one method, so one kind.
            let open: Vec<usize> = (0..inner.groups.len())
                .filter(|&g| {
                    inner.groups[g]
                        .front()
                        .is_some_and(|(_, _, kind)| wanted(kind))
                })
                .collect();
            if !open.is_empty() {
                // Round-robin over the first groups the lanes run at once.
                let width = inner.width.clamp(1, inner.groups.len());
                let among: Vec<usize> = open.iter().copied().filter(|&g| g < width).collect();
                let k = if among.is_empty() {
                    open[0]
                } else {
                    among[inner.turn % among.len()]
                };
                inner.turn = inner.turn.wrapping_add(1);
                let (job, kernel, kind) = inner.groups[k].pop_front().expect("tidied");
                inner.states.insert(job.id.clone(), State::Compiling);
                return Some((job, kernel, kind));
            }
            if inner.closed {
                return None;
            }
            inner = self.changed.wait(inner).expect("compile board");
        }
    }

    /// A job taken by `next` that will not be compiled after all.
    pub fn requeue(&self, job_id: &str) {
        let mut inner = self.inner.lock().expect("compile board");
        inner.states.insert(job_id.to_string(), State::Queued);
        self.changed.notify_all();
    }

    pub fn finish(&self, job_id: &str, result: Result<Compiled, JobFailure>) {
        let mut inner = self.inner.lock().expect("compile board");
        inner.states.insert(job_id.to_string(), State::Done(result));
        self.changed.notify_all();
    }

    /// The first `n` of `jobs` that the pool has compiled without error and
    /// made no launch recipe for: those a backend may prepare ahead (a job
    /// with the pool's recipe gets it at its own turn, `Compiled::recipe`).
    pub fn compiled<'j>(&self, jobs: impl Iterator<Item = &'j Job>, n: usize) -> Vec<Job> {
        let inner = self.inner.lock().expect("compile board");
        jobs.filter(|j| match inner.states.get(&j.id) {
            Some(State::Done(Ok(c))) => !c.has_recipe(),
            _ => false,
        })
        .take(n)
        .cloned()
        .collect()
    }

    /// Which of `jobs` (in the lane's order) the lane takes next: the first
    /// whose compile has finished; else, while the pool compiles any of
    /// them, waiting until one finishes; else the first (the lane then
    /// compiles it itself, as `wait` says). So a lane never idles on a slow
    /// compile while a later job is ready, and never compiles a job itself
    /// while the pool is busy with its others (the pool's order is not the
    /// lane's: see [`compile_order`]).
    pub fn first_ready(&self, jobs: &[&str]) -> usize {
        let mut inner = self.inner.lock().expect("compile board");
        loop {
            let state = |id: &&str| inner.states.get(*id);
            if let Some(k) = jobs
                .iter()
                .position(|id| matches!(state(id), Some(State::Done(_))))
            {
                return k;
            }
            if !jobs
                .iter()
                .any(|id| matches!(state(id), Some(State::Compiling)))
            {
                return 0;
            }
            inner = self.changed.wait(inner).expect("compile board");
        }
    }

    /// For the lane: the compile result if the pool compiled it (waiting while
    /// it is being compiled), or `None` after claiming a job the pool had not reached.
    pub fn wait(&self, job_id: &str) -> Option<Result<Compiled, JobFailure>> {
        let mut inner = self.inner.lock().expect("compile board");
        loop {
            match inner.states.get(job_id) {
                Some(State::Done(r)) => return Some(r.clone()),
                Some(State::Compiling) => inner = self.changed.wait(inner).expect("compile board"),
                Some(State::Queued) | None => {
                    inner.states.insert(job_id.to_string(), State::Claimed);
                    return None;
                }
                Some(State::Claimed) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use indexmap::IndexMap;

    fn job(id: &str) -> Job {
        Job {
            id: id.into(),
            shape_index: 0,
            method: "m".into(),
            shape: IndexMap::new(),
            config: IndexMap::new(),
            baseline: false,
            variant: None,
        }
    }

    #[test]
    fn the_lane_takes_the_first_job_compiled_and_waits_only_when_none_is() {
        let board = Arc::new(CompileBoard::default());
        for id in ["a", "b", "c"] {
            board.push(job(id), "k", "triton");
        }
        // Nothing taken by the pool: the lane starts on the first itself.
        assert_eq!(board.first_ready(&["a", "b", "c"]), 0);
        let (a, b) = (board.next().unwrap().0, board.next().unwrap().0);
        board.finish(&b.id, Ok(Compiled::in_seconds(0.1)));
        // a is still compiling and b is done: b first.
        assert_eq!(board.first_ready(&["a", "b", "c"]), 1);
        // c is queued and a compiling: the lane waits for a rather than
        // compile c itself beside the pool.
        let finisher = {
            let board = Arc::clone(&board);
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                board.finish(
                    &a.id,
                    Err(JobFailure::new(
                        crate::store::FailureClass::CompileError,
                        "no",
                    )),
                );
            })
        };
        let waited = std::time::Instant::now();
        assert_eq!(
            board.first_ready(&["c", "a"]),
            1,
            "a failed compile is finished too"
        );
        assert!(waited.elapsed() >= std::time::Duration::from_millis(40));
        finisher.join().unwrap();
        // Nothing of its own compiling: the lane takes c, to compile itself.
        assert_eq!(board.first_ready(&["c"]), 0);
    }

    fn config_job(id: &str, m: u64, n: u64, warps: u64, stages: u64) -> Job {
        let mut j = job(id);
        for (k, v) in [
            ("BLOCK_SIZE_M", m),
            ("BLOCK_SIZE_N", n),
            ("GROUP_SIZE_M", 8),
            ("num_warps", warps),
            ("num_stages", stages),
        ] {
            j.config.insert(k.into(), serde_json::json!(v));
        }
        j.config.insert("EVEN_K".into(), serde_json::json!(false));
        j
    }

    #[test]
    fn the_pool_compiles_a_cheap_first_wave_then_the_costliest_first() {
        let jobs = vec![
            config_job("small", 64, 64, 4, 3),     // 64*64*8 * 3/4 = 24576
            config_job("big-w4", 128, 256, 4, 4),  // 262144 * 4/4 = 262144
            config_job("big-w8", 128, 256, 8, 4),  // 131072
            config_job("mid", 64, 128, 4, 3),      // 49152
            config_job("small-w8", 64, 64, 8, 3),  // 12288
            config_job("mid-twin", 128, 64, 4, 3), // 49152, a tie with mid
            config_job("biggest", 256, 256, 4, 4), // 524288
        ];
        let ids = |order: Vec<&Job>| order.into_iter().map(|j| j.id.clone()).collect::<Vec<_>>();
        assert_eq!(
            ids(compile_order(&jobs, 2)),
            ["small-w8", "small", "biggest", "big-w4", "big-w8", "mid", "mid-twin"]
        );
        // No first wave: longest first throughout; a wave as large as the group: cheapest first.
        assert_eq!(ids(compile_order(&jobs, 0))[0], "biggest");
        assert_eq!(ids(compile_order(&jobs, 99))[0], "small-w8");
        assert_eq!(compile_order(&jobs, 99).len(), jobs.len());
    }

    #[test]
    fn cancelled_jobs_are_not_compiled_and_abandon_drops_the_queue() {
        let board = CompileBoard::default();
        for id in ["a", "b", "c", "d"] {
            board.push(job(id), "k", "triton");
        }
        board.cancel("b");
        assert_eq!(board.next().map(|j| j.0.id), Some("a".into()));
        assert_eq!(
            board.next().map(|j| j.0.id),
            Some("c".into()),
            "b was cancelled"
        );
        board.abandon();
        assert!(board.next().is_none(), "d was dropped with the queue");
        // The lane still gets an answer for every job: compile it yourself.
        assert!(board.wait("d").is_none());
    }

    /// Two lanes run the first two groups at once: their jobs are compiled
    /// alternately; when the first is all compiled, the third takes its turn.
    #[test]
    fn with_two_lanes_the_first_two_groups_are_compiled_in_turn() {
        let board = CompileBoard::default();
        board.set_width(2);
        for group in [["a1", "a2", "a3"], ["b1", "b2", "b3"], ["c1", "c2", "c3"]] {
            board.begin_group();
            for id in group {
                board.push(job(id), "k", "triton");
            }
        }
        board.cancel("a2");
        board.close();
        let order: Vec<String> = std::iter::from_fn(|| board.next().map(|j| j.0.id)).collect();
        assert_eq!(order, ["a1", "b1", "a3", "c1", "b2", "c2", "b3", "c3"]);
    }

    #[test]
    fn a_requeued_job_goes_back_to_the_lane() {
        let board = CompileBoard::default();
        board.push(job("a"), "k", "triton");
        let (taken, _, _) = board.next().unwrap();
        board.requeue(&taken.id);
        assert!(board.wait("a").is_none(), "the lane claims it");
    }
}
