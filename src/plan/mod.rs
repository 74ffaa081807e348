//! Planning: shapes x methods x space -> jobs, streamed.
//!
//! A space is enumerated as nested loops over its axes, in manifest order.
//! Each constraint is evaluated as soon as the axes it reads are bound, so a
//! rejected prefix prunes its whole subtree; the points removed are still
//! counted exactly (the subtree's size). No list of points is ever built, so a
//! ten-million-point space plans in constant memory.

pub mod filter;
pub mod shard;
pub mod target;

use std::collections::HashMap;
use std::ops::ControlFlow;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::device::DeviceInfo;
use crate::diag::Diagnostic;
use crate::expr::{self, Compiled, Scope, Val};
use crate::manifest::{shape_label, BaselineValue, Experiment, Expr, Method, Shape};
use crate::rng;
pub use filter::Filter;
pub use shard::{GroupCost, Shard};

/// One unit of work: a config of a method at a shape.
#[derive(Debug, Clone, Serialize)]
pub struct Job {
    pub id: String,
    pub shape_index: usize,
    pub method: String,
    pub shape: Shape,
    /// Parameters, space point and derived values, in that order.
    pub config: IndexMap<String, Json>,
    /// The method's baseline config for this shape (also a regular job when the space contains it).
    pub baseline: bool,
    /// How the job runs other than its method says: one side of an A/B
    /// run (`tunelab ab`); none for every job a manifest plans.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<Box<Variant>>,
}

/// What one side of an A/B run changes about how its jobs run
/// (docs/ab.md): the worker gets both in the job (docs/worker-protocol.md,
/// "JOB"; `tunelab.variant`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Variant {
    /// Python modules run from other files: (the module's dotted name, the
    /// file, absolute), so a side runs a method's kernel at another git
    /// revision, or from a second source file.
    pub modules: Vec<(String, std::path::PathBuf)>,
    /// Microseconds of spin after each launch, inside the timed region: a
    /// testing knob that plants a known slowdown (0: none).
    pub plant_us: f64,
}

/// What planning one method produced, before and after each constraint.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MethodCounts {
    pub method: String,
    pub shapes: u64,
    /// Points per shape in the unconstrained space.
    pub space_points: u64,
    /// All points over all shapes.
    pub points: u64,
    /// (constraint, points it removed): each point is charged to the first constraint that rejects it.
    pub removed: Vec<(String, u64)>,
    /// Points that pass every constraint.
    pub valid: u64,
    /// Jobs the search strategy will run (plus baselines).
    pub jobs: u64,
    /// The method's own search, when it has one (`methods.X.search`).
    pub search: Option<String>,
    pub baseline_jobs: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PlanSummary {
    pub experiment: String,
    pub device: String,
    pub strategy: String,
    pub shapes: u64,
    pub methods: Vec<MethodCounts>,
    pub jobs: u64,
}

/// Where a run executes, which decides its shapes and configs: the
/// manifest's on a GPU, the `interpreter:` section's in Triton's interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Gpu,
    Interpreter,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Gpu => "gpu",
            Mode::Interpreter => "interpreter",
        }
    }
}

/// What a run does with each job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunMode {
    /// Search each method's space (the default).
    Tune,
    /// Each method at its baseline or best-known config: the method comparison.
    Bench,
    /// Correctness only, no timing.
    Check,
    /// Two sides' configs timed against each other in rounds (`tunelab ab`,
    /// docs/ab.md); planned by the A/B, not from a manifest's spaces.
    Ab,
}

impl RunMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RunMode::Tune => "tune",
            RunMode::Bench => "bench",
            RunMode::Check => "check",
            RunMode::Ab => "ab",
        }
    }
}

pub struct PlanOptions<'a> {
    pub device: &'a DeviceInfo,
    pub filter: &'a Filter,
    pub mode: Mode,
}

/// Whether every `--only` key names something the experiment has (a shape
/// field, `method`, a space parameter): a companion experiment runs only then.
pub fn filter_applies(exp: &Experiment, opts: &PlanOptions<'_>) -> bool {
    opts.filter
        .check_keys(exp, shapes_for(exp, opts.mode))
        .is_ok()
}

/// Whether the plan holds at least one job (it stops at the first): a
/// companion that `--only` leaves empty is not run.
pub fn has_jobs(exp: &Experiment, opts: &PlanOptions<'_>) -> Result<bool, Diagnostic> {
    let mut any = false;
    plan(exp, opts, &mut |_| {
        any = true;
        ControlFlow::Break(())
    })?;
    Ok(any)
}

/// The shapes a mode runs: the interpreter's own set when there is one.
/// The shapes a plan in `mode` runs: the manifest's, or its `interpreter:` ones.
pub fn shapes_for(exp: &Experiment, mode: Mode) -> &[Shape] {
    match (mode, &exp.interpreter) {
        (Mode::Interpreter, Some(i)) => &i.shapes,
        _ => &exp.shapes,
    }
}

/// Streams every job to `sink`; returns the counts. `sink` may stop early.
pub fn plan(
    exp: &Experiment,
    opts: &PlanOptions<'_>,
    sink: &mut dyn FnMut(Job) -> ControlFlow<()>,
) -> Result<PlanSummary, Diagnostic> {
    plan_groups(exp, opts, None, sink)
}

/// Which (method, shape index) groups a plan keeps: a shard's share, or the
/// one group a scheduler deals next.
pub type GroupFilter<'f> = &'f dyn Fn(&str, usize) -> bool;

/// [`plan`], restricted to the groups `keep` accepts (all when `None`). A
/// group's jobs and ids do not depend on which other groups are planned, so
/// planning group by group, in any order, gives the same jobs as one plan.
/// The counts are the kept groups' only; a method whose constraints reject
/// every point is an error only when every group is planned.
pub fn plan_groups(
    exp: &Experiment,
    opts: &PlanOptions<'_>,
    keep: Option<GroupFilter<'_>>,
    sink: &mut dyn FnMut(Job) -> ControlFlow<()>,
) -> Result<PlanSummary, Diagnostic> {
    let shapes = shapes_for(exp, opts.mode);
    opts.filter.check_keys(exp, shapes)?;
    let filtered: Vec<(usize, &Shape)> = shapes
        .iter()
        .enumerate()
        .filter(|(_, s)| opts.filter.keeps_shape(s))
        .collect();
    let kept_shape = |i: usize| {
        keep.map_or(true, |k| {
            exp.methods
                .iter()
                .filter(|m| opts.filter.keeps_method(&m.name))
                .any(|m| k(&m.name, i))
        })
    };
    let selected: Vec<(usize, &Shape)> = filtered
        .iter()
        .copied()
        .filter(|(i, _)| kept_shape(*i))
        .collect();
    let strategy = exp.search.strategy(exp.protocol.finalists);
    // Random search draws its sample here; the interpreter takes a few configs.
    let sample = match opts.mode {
        Mode::Interpreter => Some((
            exp.interpreter.as_ref().map_or(4, |i| i.max_configs),
            exp.search.seed,
        )),
        Mode::Gpu => strategy.sample_per_group(),
    };
    let strategy = match opts.mode {
        Mode::Interpreter => format!(
            "interpreter sample ({} configs per shape)",
            sample.map_or(4, |(n, _)| n)
        ),
        Mode::Gpu => crate::search::describe(exp.search.kind.name(), &exp.search.params()),
    };
    let mut summary = PlanSummary {
        experiment: exp.name.clone(),
        device: opts.device.name.clone(),
        strategy,
        shapes: selected.len() as u64,
        ..Default::default()
    };
    let constants = device_constants(opts.device);
    let env = expr::environment();
    let mut stopped = false;
    for method in exp
        .methods
        .iter()
        .filter(|m| opts.filter.keeps_method(&m.name))
    {
        let selected: Vec<(usize, &Shape)> = selected
            .iter()
            .copied()
            .filter(|(i, _)| keep.map_or(true, |k| k(&method.name, *i)))
            .collect();
        let mut counts = MethodCounts {
            method: method.name.clone(),
            search: method
                .search
                .as_ref()
                .map(|s| crate::search::describe(s.kind.name(), &s.params())),
            shapes: selected.len() as u64,
            space_points: method.axes.iter().map(|a| a.values.len() as u64).product(),
            removed: method
                .constraints
                .iter()
                .map(|c| (c.source.clone(), 0))
                .collect(),
            ..Default::default()
        };
        let sample = match opts.mode {
            Mode::Interpreter => sample,
            Mode::Gpu => exp
                .search_for(method)
                .strategy(exp.protocol.finalists)
                .sample_per_group(),
        };
        if let Some(fixed) = &method.fixed {
            stopped = plan_fixed(exp, method, fixed, &selected, &mut counts, sink);
            summary.jobs += counts.jobs;
            summary.methods.push(counts);
            if stopped {
                break;
            }
            continue;
        }
        for (shape_index, shape) in &selected {
            if stopped {
                break;
            }
            let space = SpacePlan::new(exp, method, shape, &constants, &env, opts.filter)?;
            let mut emit = |job: Job| -> ControlFlow<()> {
                let flow = sink(job);
                if flow.is_break() {
                    stopped = true;
                }
                flow
            };
            let mut baseline_id = None;
            if let Some(job) = space.baseline_job(*shape_index)? {
                counts.baseline_jobs += 1;
                counts.jobs += 1;
                baseline_id = Some(job.id.clone());
                if emit(job).is_break() {
                    break;
                }
            }
            match sample {
                None => {
                    // Every valid point becomes a job: past the limit the
                    // plan stops and says how to measure a sample instead.
                    let mut group_jobs = 0u64;
                    space.walk(&mut counts, &mut |job_slots| {
                        group_jobs += 1;
                        if group_jobs > MAX_GROUP_JOBS {
                            return (ControlFlow::Break(()), false);
                        }
                        counts_job_skip(
                            &space,
                            job_slots,
                            *shape_index,
                            baseline_id.as_deref(),
                            &mut emit,
                        )
                    })?;
                    if group_jobs > MAX_GROUP_JOBS {
                        return Err(too_many_jobs(method, shape));
                    }
                }
                Some((budget, seed)) => {
                    // Seeded reservoir sample: `budget` configs drawn uniformly, without keeping the space.
                    let seed =
                        seed ^ rng::hash_str(&shape_label(shape)) ^ rng::hash_str(&method.name);
                    let mut rng = rng::SplitMix64::new(seed);
                    let mut reservoir: Vec<Vec<Val>> = Vec::new();
                    let mut seen = 0u64;
                    space.walk(&mut counts, &mut |slots| {
                        seen += 1;
                        if (reservoir.len() as u64) < budget {
                            reservoir.push(slots.to_vec());
                        } else {
                            let j = rng.below(seen);
                            if j < budget {
                                reservoir[j as usize] = slots.to_vec();
                            }
                        }
                        (ControlFlow::Continue(()), false)
                    })?;
                    for slots in reservoir {
                        let (flow, counted) = counts_job_skip(
                            &space,
                            &slots,
                            *shape_index,
                            baseline_id.as_deref(),
                            &mut emit,
                        );
                        if counted {
                            counts.jobs += 1;
                        }
                        if flow.is_break() {
                            break;
                        }
                    }
                }
            }
        }
        summary.jobs += counts.jobs;
        if keep.is_none() && counts.valid == 0 && !method.axes.is_empty() && counts.points > 0 {
            return Err(reject_all(method, &counts));
        }
        summary.methods.push(counts);
    }
    Ok(summary)
}

/// A method with one config per shape from a consumer's file: a job for
/// each selected shape the file has a config for. Returns whether the sink
/// stopped the plan.
fn plan_fixed(
    exp: &Experiment,
    method: &Method,
    fixed: &crate::manifest::FixedConfigs,
    selected: &[(usize, &Shape)],
    counts: &mut MethodCounts,
    sink: &mut dyn FnMut(Job) -> ControlFlow<()>,
) -> bool {
    counts.space_points = 1;
    for (shape_index, shape) in selected {
        let Some(config) = fixed.config_for(shape) else {
            continue;
        };
        counts.points += 1;
        counts.valid += 1;
        counts.jobs += 1;
        let mut hasher = blake3::Hasher::new();
        for part in [
            exp.problem.as_str(),
            &serde_json::to_string(shape).expect("shape serialises"),
            &method.name,
            &method.identity,
            &serde_json::to_string(config).expect("config serialises"),
        ] {
            hasher.update(part.as_bytes());
            hasher.update(b"\0");
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&hasher.finalize().as_bytes()[..8]);
        let job = Job {
            id: hex16(id),
            shape_index: *shape_index,
            method: method.name.clone(),
            shape: (*shape).clone(),
            config: config.clone(),
            baseline: false,
            variant: None,
        };
        if sink(job).is_break() {
            return true;
        }
    }
    false
}

/// Emits one job unless it is the baseline already emitted. Returns (flow, whether it was emitted).
fn counts_job_skip(
    space: &SpacePlan<'_>,
    slots: &[Val],
    shape_index: usize,
    baseline_id: Option<&str>,
    emit: &mut dyn FnMut(Job) -> ControlFlow<()>,
) -> (ControlFlow<()>, bool) {
    let job = space.job(slots, shape_index, false);
    if Some(job.id.as_str()) == baseline_id {
        return (ControlFlow::Continue(()), false);
    }
    (emit(job), true)
}

fn push_int(buf: &mut Vec<u8>, v: i64) {
    if v < 0 {
        buf.push(b'-');
    }
    let mut n = v.unsigned_abs();
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

fn hex16(bytes: [u8; 8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(16);
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    out
}

/// Jobs one (shape, method) group may have under a strategy that measures
/// every config it plans (grid, halving): at tens of milliseconds a job,
/// more would take days.
pub const MAX_GROUP_JOBS: u64 = 100_000;

fn too_many_jobs(method: &Method, shape: &Shape) -> Diagnostic {
    Diagnostic::at(
        method.span,
        format!(
            "method `{}` has more than {MAX_GROUP_JOBS} configs its constraints allow at shape {}, and its strategy measures every one",
            method.name,
            shape_label(shape)
        ),
    )
    .help("measure a sample: `search: {strategy: random, budget: 200}` or `{strategy: surrogate, budget: 64}` (under the method or the experiment), or narrow the space")
}

fn reject_all(method: &Method, counts: &MethodCounts) -> Diagnostic {
    let detail: Vec<String> = counts
        .removed
        .iter()
        .map(|(src, n)| format!("`{src}` removed {n} of {}", counts.points))
        .collect();
    let worst = counts
        .removed
        .iter()
        .max_by_key(|(_, n)| *n)
        .map(|(s, _)| s.clone())
        .unwrap_or_default();
    Diagnostic::at(
        method.constraints_span,
        format!(
            "the constraints of method `{}` reject every point of its space: {}",
            method.name,
            detail.join("; ")
        ),
    )
    .help(format!("loosen `{worst}` or widen the space"))
}

pub fn device_constants(device: &DeviceInfo) -> HashMap<String, Val> {
    crate::manifest::device_fields(device)
        .into_iter()
        .map(|(k, v)| (format!("device.{k}"), Val::from_json(&v)))
        .collect()
}

/// Called with each valid point's slots; returns (flow, whether it became a job).
type Visit<'v> = dyn FnMut(&[Val]) -> (ControlFlow<()>, bool) + 'v;

/// A compiled expression: against this plan's slots, or (an expression the
/// slots do not cover) evaluated on a context built from them.
enum Check<'e> {
    Fast(Compiled),
    Reference(&'e Expr),
}

/// Everything needed to enumerate one method's space at one shape.
struct SpacePlan<'a> {
    method: &'a Method,
    shape: &'a Shape,
    device_json: Json,
    /// Slot names: shape fields, params, axes, derived.
    names: Vec<String>,
    base: Vec<Val>,
    first_axis_slot: usize,
    /// Axis values, with filter restrictions applied.
    axes: Vec<Vec<Val>>,
    /// Constraints by the level (number of bound axes) at which they can run: (index in manifest, check).
    by_level: Vec<Vec<(usize, Check<'a>)>>,
    derived: Vec<Check<'a>>,
    /// Hash of everything a job id shares within this (shape, method).
    prefix_digest: [u8; 32],
    /// `name=` for each space and derived slot, in slot order.
    keys: Vec<Vec<u8>>,
}

impl<'a> SpacePlan<'a> {
    fn new(
        exp: &'a Experiment,
        method: &'a Method,
        shape: &'a Shape,
        constants: &HashMap<String, Val>,
        env: &'a minijinja::Environment<'static>,
        filter: &Filter,
    ) -> Result<Self, Diagnostic> {
        let mut names = Vec::new();
        let mut base = Vec::new();
        for (k, v) in shape.iter().chain(method.params.iter()) {
            names.push(k.clone());
            base.push(Val::from_json(v));
        }
        let first_axis_slot = names.len();
        let mut axes = Vec::new();
        for axis in &method.axes {
            names.push(axis.name.clone());
            base.push(Val::None);
            axes.push(
                axis.values
                    .iter()
                    .filter(|v| filter.keeps_value(&axis.name, v))
                    .map(Val::from_json)
                    .collect(),
            );
        }
        for (k, _) in &method.derived {
            names.push(k.clone());
            base.push(Val::None);
        }
        let slots: HashMap<String, usize> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let scope = Scope {
            slots: &slots,
            constants,
        };
        let compile = |e: &'a Expr| match expr::compile_fast(&e.source, &scope) {
            Some(c) => Check::Fast(c),
            None => Check::Reference(e),
        };
        let level_of = |e: &Expr| -> usize {
            let vars = expr::variables(env, &e.source).unwrap_or_default();
            let mut level = 0;
            for v in vars {
                if let Some(&slot) = slots.get(&v) {
                    if slot >= first_axis_slot {
                        level = level.max((slot - first_axis_slot + 1).min(method.axes.len()));
                        if slot >= first_axis_slot + method.axes.len() {
                            level = method.axes.len();
                        }
                    }
                }
            }
            level
        };
        let mut by_level: Vec<Vec<(usize, Check<'_>)>> =
            (0..=method.axes.len()).map(|_| Vec::new()).collect();
        for (i, c) in method.constraints.iter().enumerate() {
            let uses_derived = {
                let vars = expr::variables(env, &c.source).unwrap_or_default();
                method.derived.iter().any(|(d, _)| vars.contains(d))
            };
            let level = if uses_derived {
                method.axes.len()
            } else {
                level_of(c)
            };
            by_level[level].push((i, compile(c)));
        }
        let derived = method.derived.iter().map(|(_, e)| compile(e)).collect();

        let mut hasher = blake3::Hasher::new();
        hasher.update(exp.problem.as_bytes());
        hasher.update(b"\0");
        hasher.update(
            serde_json::to_string(shape)
                .expect("shape serialises")
                .as_bytes(),
        );
        hasher.update(b"\0");
        hasher.update(method.name.as_bytes());
        hasher.update(b"\0");
        hasher.update(method.identity.as_bytes());
        hasher.update(b"\0");
        for (k, v) in &method.params {
            hasher.update(format!("{k}={v};").as_bytes());
        }
        let prefix_digest = *hasher.finalize().as_bytes();
        let device_json = Json::Object(
            constants
                .iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix("device.")
                        .map(|f| (f.to_string(), v.to_json()))
                })
                .collect(),
        );
        Ok(SpacePlan {
            method,
            shape,
            device_json,
            keys: names[first_axis_slot..]
                .iter()
                .map(|n| format!("{n}=").into_bytes())
                .collect(),
            names,
            base,
            first_axis_slot,
            axes,
            by_level,
            derived,
            prefix_digest,
        })
    }

    fn eval(&self, check: &Check<'_>, slots: &[Val]) -> Result<Val, Diagnostic> {
        match check {
            Check::Fast(c) => c.eval(slots).map_err(|e| self.eval_error(None, slots, e)),
            Check::Reference(e) => {
                let mut ctx = serde_json::Map::new();
                for (name, v) in self.names.iter().zip(slots) {
                    ctx.insert(name.clone(), v.to_json());
                }
                ctx.insert("device".into(), self.device_json.clone());
                expr::evaluate(&e.source, &ctx).map_err(|err| self.eval_error(Some(e), slots, err))
            }
        }
    }

    fn eval_error(&self, e: Option<&Expr>, slots: &[Val], err: String) -> Diagnostic {
        let point: Vec<String> = self
            .names
            .iter()
            .zip(slots)
            .filter(|(_, v)| **v != Val::None)
            .map(|(n, v)| format!("{n}={}", v.to_json()))
            .collect();
        let span = e.map(|e| e.span).unwrap_or(self.method.constraints_span);
        Diagnostic::at(
            span,
            format!("expression failed at {}: {err}", point.join(", ")),
        )
        .help("guard the expression, e.g. `b != 0 and a // b > 1`, or narrow the space")
    }

    /// Visits every valid point; `visit` gets the full slot vector and returns
    /// (flow, counted) where `counted` says whether it became a job.
    fn walk(&self, counts: &mut MethodCounts, visit: &mut Visit<'_>) -> Result<(), Diagnostic> {
        let mut slots = self.base.clone();
        let total: u64 = self.axes.iter().map(|a| a.len() as u64).product();
        counts.points += total;
        // suffix[l] = points under one binding of the first l axes.
        let mut suffix = vec![1u64; self.axes.len() + 1];
        for l in (0..self.axes.len()).rev() {
            suffix[l] = suffix[l + 1] * self.axes[l].len() as u64;
        }
        let mut flow = ControlFlow::Continue(());
        self.descend(0, &mut slots, counts, &suffix, visit, &mut flow)
    }

    fn passes(
        &self,
        level: usize,
        slots: &[Val],
        counts: &mut MethodCounts,
        subtree: u64,
    ) -> Result<bool, Diagnostic> {
        for (i, check) in &self.by_level[level] {
            if !self.eval(check, slots)?.truthy() {
                counts.removed[*i].1 += subtree;
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn descend(
        &self,
        level: usize,
        slots: &mut Vec<Val>,
        counts: &mut MethodCounts,
        suffix: &[u64],
        visit: &mut Visit<'_>,
        flow: &mut ControlFlow<()>,
    ) -> Result<(), Diagnostic> {
        if level == self.axes.len() {
            let derived_base = self.first_axis_slot + self.axes.len();
            for (i, d) in self.derived.iter().enumerate() {
                slots[derived_base + i] = self.eval(d, slots)?;
            }
            if !self.passes(level, slots, counts, 1)? {
                return Ok(());
            }
            counts.valid += 1;
            let (f, counted) = visit(slots);
            if counted {
                counts.jobs += 1;
            }
            *flow = f;
            return Ok(());
        }
        if level == 0 && !self.passes(0, slots, counts, suffix[0])? {
            return Ok(());
        }
        for value in &self.axes[level] {
            slots[self.first_axis_slot + level] = value.clone();
            if level + 1 < self.axes.len()
                && !self.passes(level + 1, slots, counts, suffix[level + 1])?
            {
                continue;
            }
            self.descend(level + 1, slots, counts, suffix, visit, flow)?;
            if flow.is_break() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The canonical bytes of a point (space values, then derived values) that
    /// its job id hashes: `name=value;` for each, values in a fixed text form.
    fn encode_point(&self, slots: &[Val], buf: &mut Vec<u8>) {
        use std::io::Write;
        buf.clear();
        buf.extend_from_slice(&self.prefix_digest);
        for (i, key) in self.keys.iter().enumerate() {
            buf.extend_from_slice(key);
            match &slots[self.first_axis_slot + i] {
                // Integers are nearly every value; format them without fmt's machinery.
                Val::Int(v) => push_int(buf, *v),
                Val::None => buf.extend_from_slice(b"none"),
                Val::Bool(b) => buf.extend_from_slice(if *b { b"true" } else { b"false" }),
                Val::Float(v) => {
                    let _ = write!(buf, "{v:?}");
                }
                Val::Str(v) => {
                    let _ = write!(buf, "{:?}", &**v);
                }
            }
            buf.push(b';');
        }
    }

    fn id_of(&self, slots: &[Val], buf: &mut Vec<u8>) -> [u8; 8] {
        self.encode_point(slots, buf);
        let hash = blake3::hash(buf);
        let mut out = [0u8; 8];
        out.copy_from_slice(&hash.as_bytes()[..8]);
        out
    }

    /// Builds the job for a full slot vector. The id hashes problem, shape,
    /// method identity, params, space point and derived values.
    fn job(&self, slots: &[Val], shape_index: usize, baseline: bool) -> Job {
        let mut buf = Vec::with_capacity(128);
        let id = hex16(self.id_of(slots, &mut buf));
        let mut config: IndexMap<String, Json> = self.method.params.clone();
        for (i, name) in self.names.iter().enumerate().skip(self.first_axis_slot) {
            config.insert(name.clone(), slots[i].to_json());
        }
        Job {
            id,
            shape_index,
            method: self.method.name.clone(),
            shape: self.shape.clone(),
            config,
            baseline,
            variant: None,
        }
    }

    fn baseline_job(&self, shape_index: usize) -> Result<Option<Job>, Diagnostic> {
        let Some(baseline) = &self.method.baseline else {
            return Ok(None);
        };
        let mut slots = self.base.clone();
        for (name, value) in &baseline.values {
            let v = match value {
                BaselineValue::Literal(j) => Val::from_json(j),
                BaselineValue::Expr(e) => self.eval(&Check::Reference(e), &slots)?,
            };
            if let Some(i) = self.names.iter().position(|n| n == name) {
                slots[i] = v;
            }
        }
        if let Some((i, _)) = self
            .axes
            .iter()
            .enumerate()
            .find(|(i, _)| slots[self.first_axis_slot + i] == Val::None)
        {
            let missing = &self.method.axes[i].name;
            return Err(Diagnostic::at(
                self.method.span,
                format!(
                    "the baseline of method `{}` gives no value for `{missing}`",
                    self.method.name
                ),
            )
            .help("set every space parameter in `baseline`"));
        }
        let derived_base = self.first_axis_slot + self.axes.len();
        for (i, d) in self.derived.iter().enumerate() {
            slots[derived_base + i] = self.eval(d, &slots)?;
        }
        Ok(Some(self.job(&slots, shape_index, true)))
    }
}

/// Plans without building jobs: counts and job ids only, for throughput
/// benchmarks. Returns (summary, xor of all ids) so the work cannot be skipped.
pub fn count_with_ids(
    exp: &Experiment,
    opts: &PlanOptions<'_>,
) -> Result<(PlanSummary, u64), Diagnostic> {
    let constants = device_constants(opts.device);
    let env = expr::environment();
    let mut summary = PlanSummary {
        experiment: exp.name.clone(),
        device: opts.device.name.clone(),
        strategy: "grid".into(),
        shapes: exp.shapes.len() as u64,
        ..Default::default()
    };
    let mut acc = 0u64;
    for method in &exp.methods {
        let mut counts = MethodCounts {
            method: method.name.clone(),
            removed: method
                .constraints
                .iter()
                .map(|c| (c.source.clone(), 0))
                .collect(),
            ..Default::default()
        };
        for shape in &exp.shapes {
            let space = SpacePlan::new(exp, method, shape, &constants, &env, opts.filter)?;
            let mut buf = Vec::with_capacity(128);
            space.walk(&mut counts, &mut |slots| {
                acc ^= u64::from_le_bytes(space.id_of(slots, &mut buf));
                (ControlFlow::Continue(()), true)
            })?;
        }
        summary.jobs += counts.jobs;
        summary.methods.push(counts);
    }
    Ok((summary, acc))
}
