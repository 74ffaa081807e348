//! `tunelab ab MANIFEST --a SIDE --b SIDE`: each (shape, method) both sides
//! have a config for, the two configs timed against each other in one run,
//! after an A/A round that measures the run's noise; verdicts with a noise
//! model, a report for a pull request, and a gate (docs/ab.md).
//!
//! This file resolves the sides (picks, shipped files, code at another
//! revision) into pairs of jobs (`schedule::ab::AbPlan`); the schedule times
//! them (`schedule::ab`), `emit::ab` judges them and writes the report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::args::ManifestArgs;
use super::compare::percentage;
use super::inspect::load_experiment;
use super::{run, Failure};
use crate::config::Settings;
use crate::emit::compare::pct;
use crate::emit::num::count;
use crate::emit::select::{shape_key, Selection};
use crate::exit;
use crate::manifest::{Experiment, FixedConfigs, LaunchPath, Method, Shape};
use crate::plan::{Filter, Job, RunMode, Variant};
use crate::schedule::ab::{AbPairPlan, AbPlan, AbTiming};
use crate::schedule::{self, RunOptions};
use crate::store::{AbCode, AbSetup, AbSide, Interleave, PicksSource};

use indexmap::IndexMap;
use serde_json::Value as Json;

/// Samples of each side a round unless `--batch` says otherwise (or the
/// run's protocol batch is smaller: the interpreter's is 2).
pub const AB_BATCH: u32 = 16;

/// What the command line asked `ab` to do.
pub struct Request<'a> {
    pub manifest: &'a Path,
    pub args: &'a ManifestArgs,
    pub settings: &'a Settings,
    pub a: Option<&'a Path>,
    pub b: Option<&'a Path>,
    pub a_code: &'a [String],
    pub b_code: &'a [String],
    pub aa_rounds: u32,
    pub rounds: u32,
    /// Samples of each side a round (`--batch`; None: [`AB_BATCH`]).
    pub batch: Option<u32>,
    pub extra_rounds: u32,
    pub interleave: Interleave,
    pub threshold: Option<&'a str>,
    pub fail_on_slower: Option<&'a str>,
    pub plant: Option<&'a str>,
    pub gpus: Option<&'a [usize]>,
    pub lanes: Option<usize>,
    pub progress: bool,
}

/// One side's configs by (shape key, method).
enum Picks {
    /// A results directory's picks (`emit::select`).
    Results(HashMap<(String, String), IndexMap<String, Json>>),
    /// A shipped file's configs, run in `method` (the one writing its format).
    Shipped { method: String, fixed: FixedConfigs },
}

impl Picks {
    fn config(&self, shape: &Shape, method: &str) -> Option<IndexMap<String, Json>> {
        match self {
            Picks::Results(map) => map.get(&(shape_key(shape), method.to_string())).cloned(),
            Picks::Shipped { method: m, fixed } if m == method => fixed.config_for(shape).cloned(),
            Picks::Shipped { .. } => None,
        }
    }

    /// Whether the side can have configs of `method` (a shipped file has
    /// its method's only).
    fn covers(&self, method: &str) -> bool {
        match self {
            Picks::Results(_) => true,
            Picks::Shipped { method: m, .. } => m == method,
        }
    }

    fn source(&self) -> PicksSource {
        match self {
            Picks::Results(_) => PicksSource::Results,
            Picks::Shipped { .. } => PicksSource::Shipped,
        }
    }
}

fn bad(why: String) -> Failure {
    Failure::bad_input(format!("error: {why}"))
}

/// A side's picks: a results directory (or a journal) and its pick per
/// (shape, method), or a shipped vLLM JSON run in the method that writes
/// that format, as `run --compare-to` runs it.
fn read_picks(flag: &str, path: &Path, exp: &Experiment) -> Result<Picks, Failure> {
    if path.is_file() && path.extension().is_some_and(|e| e == "json") {
        let shipped = crate::emit::shipped::read(path)
            .map_err(|why| bad(format!("{flag} {}: {why}", path.display())))?;
        let writer = exp
            .outputs
            .iter()
            .find(|o| o.format == shipped.format)
            .and_then(|o| o.method.clone())
            .or_else(|| {
                exp.methods
                    .iter()
                    .find(|m| m.kind == crate::manifest::MethodKind::Triton)
                    .map(|m| m.name.clone())
            })
            .ok_or_else(|| {
                bad(format!(
                    "{flag} {}: this experiment has no method that runs {} configs",
                    path.display(),
                    shipped.format.name()
                ))
            })?;
        return Ok(Picks::Shipped {
            method: writer,
            fixed: shipped.fixed_configs(),
        });
    }
    let read = if path.is_dir() {
        crate::store::journal::read(path)
    } else {
        crate::store::journal::read_file(path)
    };
    let (results, warnings) = read.map_err(|e| {
        bad(format!(
            "{flag} {}: {e}\n  = help: a side is a results directory (its picks), a journal, or a shipped vLLM fused-MoE JSON",
            path.display()
        ))
    })?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let sel = Selection::new(&results);
    let mut map = HashMap::new();
    for s in &sel.shapes {
        for m in &s.methods {
            if let Some(best) = m.best {
                map.insert(
                    (s.key.clone(), m.method.to_string()),
                    best.job.config.clone(),
                );
            }
        }
    }
    Ok(Picks::Results(map))
}

/// A file's BLAKE3, hex.
fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// The dotted name of the module `file` is under one of `roots` (the
/// folders the workers import from).
fn module_name(file: &Path, roots: &[PathBuf]) -> Option<String> {
    let file = file.canonicalize().ok()?;
    roots.iter().find_map(|root| {
        let root = root.canonicalize().ok()?;
        let rel = file.strip_prefix(&root).ok()?;
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let last = parts.pop()?;
        let stem = last.strip_suffix(".py")?;
        if stem != "__init__" {
            parts.push(stem.to_string());
        }
        (!parts.is_empty()).then(|| parts.join("."))
    })
}

/// `git -C dir ARGS`'s standard output, or why it failed.
fn git(dir: &Path, args: &[&str]) -> Result<Vec<u8>, String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr)
            .lines()
            .next()
            .unwrap_or("git failed")
            .to_string())
    }
}

/// A module a side runs from another file, read but not yet written.
struct Replaced {
    module: String,
    /// Where it came from: `REV:PATH` or a path.
    from: String,
    /// The file's name (tracebacks and Triton's messages show it).
    name: String,
    bytes: Vec<u8>,
}

impl Replaced {
    fn record(&self) -> AbCode {
        AbCode {
            module: self.module.clone(),
            from: self.from.clone(),
            blake3: digest(&self.bytes),
        }
    }
}

/// Modules run from other files: (dotted name, file), as the worker takes them.
type Modules = Vec<(String, PathBuf)>;

/// Writes a side's replaced modules under `cache`, one folder per content,
/// each file keeping its name: done once the A/B is known to run, so bad
/// input writes nothing.
fn write_code(code: &[Replaced], cache: &Path) -> Result<Modules, Failure> {
    code.iter()
        .map(|r| {
            let dir = cache.join(&digest(&r.bytes)[..16]);
            std::fs::create_dir_all(&dir).map_err(|e| {
                Failure::internal(format!("error: cannot create {}: {e}", dir.display()))
            })?;
            let path = dir.join(&r.name);
            std::fs::write(&path, &r.bytes).map_err(|e| {
                Failure::internal(format!("error: cannot write {}: {e}", path.display()))
            })?;
            Ok((r.module.clone(), path))
        })
        .collect()
}

/// A side's code: the modules it runs from other files. Each spec is
/// `REV` (every kernel module of the worker's package,
/// `python/tunelab/kernels`, that differs at git revision REV) or
/// `FILE=REPLACEMENT` (the module at FILE, under the worker's Python path,
/// from REPLACEMENT: a path, or `REV:PATH` of git). A later spec for the
/// same module wins.
fn read_code(flag: &str, specs: &[String], roots: &[PathBuf]) -> Result<Vec<Replaced>, Failure> {
    let mut out: Vec<Replaced> = Vec::new();
    let checkout = roots
        .first()
        .and_then(|p| p.parent())
        .map(Path::to_path_buf);
    let mut add = |r: Replaced| {
        out.retain(|x| x.module != r.module);
        out.push(r);
    };
    for spec in specs {
        let need_git = || {
            checkout.clone().ok_or_else(|| {
                bad(format!(
                    "{flag} {spec}: a git revision needs the checkout the workers import tunelab from, and they import an installed package"
                ))
            })
        };
        match spec.split_once('=') {
            None => {
                let root = need_git()?;
                let rev = String::from_utf8_lossy(
                    &git(
                        &root,
                        &["rev-parse", "--verify", &format!("{spec}^{{commit}}")],
                    )
                    .map_err(|why| bad(format!("{flag} {spec}: not a git revision here: {why}")))?,
                )
                .trim()
                .to_string();
                let listed = git(
                    &root,
                    &[
                        "ls-tree",
                        "-r",
                        "--name-only",
                        &rev,
                        "--",
                        "python/tunelab/kernels",
                    ],
                )
                .map_err(|why| bad(format!("{flag} {spec}: {why}")))?;
                let mut found = 0;
                for path in String::from_utf8_lossy(&listed).lines() {
                    let Some(name) = path.rsplit('/').next().filter(|n| n.ends_with(".py")) else {
                        continue;
                    };
                    let here = root.join(path);
                    let Some(module) = module_name(&here, roots) else {
                        continue;
                    };
                    let then = git(&root, &["show", &format!("{rev}:{path}")])
                        .map_err(|why| bad(format!("{flag} {spec}: {why}")))?;
                    if std::fs::read(&here).ok().as_deref() == Some(&then[..]) {
                        continue;
                    }
                    found += 1;
                    add(Replaced {
                        module,
                        from: format!("{}:{path}", &rev[..12]),
                        name: name.to_string(),
                        bytes: then,
                    });
                }
                if found == 0 {
                    eprintln!(
                        "note: {flag} {spec}: no kernel module (python/tunelab/kernels) differs at {}; that side runs the working tree's code",
                        &rev[..12]
                    );
                }
            }
            Some((file, replacement)) => {
                let module = module_name(Path::new(file), roots).ok_or_else(|| {
                    bad(format!(
                        "{flag} {spec}: {file} is not a Python module the workers import (under {})",
                        roots
                            .iter()
                            .map(|r| r.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
                let name = Path::new(file)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let bytes = match std::fs::read(replacement) {
                    Ok(bytes) => bytes,
                    Err(e) => match replacement.split_once(':') {
                        Some((rev, path)) => {
                            let root = need_git()?;
                            git(&root, &["show", &format!("{rev}:{path}")]).map_err(|why| {
                                bad(format!("{flag} {spec}: {replacement}: {why}"))
                            })?
                        }
                        None => {
                            return Err(bad(format!(
                                "{flag} {spec}: cannot read {replacement}: {e}"
                            )))
                        }
                    },
                };
                add(Replaced {
                    module,
                    from: replacement.to_string(),
                    name,
                    bytes,
                });
            }
        }
    }
    Ok(out)
}

/// A 16-hex-digit id from `parts`.
fn hash_id(parts: &[&str]) -> String {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(b"\0");
    }
    h.finalize().to_hex()[..16].to_string()
}

/// A (shape, method) both sides have a config for, in plan order.
struct Pair<'e> {
    shape_index: usize,
    shape: &'e Shape,
    method: &'e Method,
    a: IndexMap<String, Json>,
    b: IndexMap<String, Json>,
}

/// The two sides as the command line gave them, read.
struct Sides {
    a_path: PathBuf,
    b_path: PathBuf,
    a: Picks,
    b: Picks,
    a_code: Vec<Replaced>,
    b_code: Vec<Replaced>,
}

/// How the verdicts and the gate judge, and B's plant (fractions).
struct Judging {
    threshold: f64,
    gate: Option<f64>,
    plant: f64,
}

/// `tunelab ab`, phase by phase: what to judge by, where it runs, the two
/// sides, their pairs, the plan of jobs, the run, the report and the gate.
pub(super) fn ab(r: &Request<'_>) -> Result<i32, Failure> {
    let judging = judging(r)?;
    let target = one_target(r)?;
    let exp = load_experiment(r.manifest, r.args, &target.device)?;
    let filter = Filter::parse(r.args.only.as_deref().unwrap_or(""))?;
    let roots = super::environment::worker_python_path(&exp, &r.settings.python);
    let sides = read_sides(r, &exp, &target, &roots)?;
    let pairs = pairs(r, &exp, &target, &filter, &sides)?;
    refuse_native_variants(&pairs, &sides, judging.plant)?;
    let plan = plan(r, &exp, &target, &sides, &pairs, &judging)?;
    let ab_exp = Experiment {
        name: format!("{}-ab", exp.name),
        outputs: Vec::new(),
        companions: Vec::new(),
        compared: Vec::new(),
        ..exp.clone()
    };
    let dir = schedule::results_dir(
        &r.settings.results_dir,
        &ab_exp,
        &target.device,
        target.mode,
    );
    let interrupted = time_pairs(r, &ab_exp, &target, filter, roots, &plan, &sides, &dir)?;
    report_and_gate(&dir, judging.gate, interrupted)
}

fn judging(r: &Request<'_>) -> Result<Judging, Failure> {
    let parse = |flag: &str, v: Option<&str>| v.map(|t| percentage(flag, t)).transpose();
    Ok(Judging {
        threshold: parse("--threshold", r.threshold)?
            .unwrap_or(crate::measure::paired::DEFAULT_THRESHOLD),
        gate: parse("--fail-on-slower", r.fail_on_slower)?,
        plant: parse("--plant-slowdown", r.plant)?.unwrap_or(0.0),
    })
}

/// The GPUs an A/B runs on: one model (or the interpreter).
fn one_target(r: &Request<'_>) -> Result<run::Target, Failure> {
    let mut targets = run::targets(r.settings, r.gpus, r.lanes)?;
    if targets.len() > 1 {
        return Err(bad(format!(
            "this host has GPUs of {} models, and an A/B times both sides on one model: choose its GPUs with --gpus",
            targets.len()
        )));
    }
    Ok(targets.remove(0))
}

/// Side A (by default the experiment's own results for this device) and
/// side B (by default A's configs), with their code.
fn read_sides(
    r: &Request<'_>,
    exp: &Experiment,
    target: &run::Target,
    roots: &[PathBuf],
) -> Result<Sides, Failure> {
    let own = schedule::results_dir(&r.settings.results_dir, exp, &target.device, target.mode);
    let a_path = r.a.map_or(own, Path::to_path_buf);
    let b_path = r.b.map_or_else(|| a_path.clone(), Path::to_path_buf);
    let a = read_picks("--a", &a_path, exp)?;
    let b = if b_path == a_path {
        read_picks("--a", &a_path, exp)?
    } else {
        read_picks("--b", &b_path, exp)?
    };
    Ok(Sides {
        a_code: read_code("--a-code", r.a_code, roots)?,
        b_code: read_code("--b-code", r.b_code, roots)?,
        a_path,
        b_path,
        a,
        b,
    })
}

/// The (shape, method) pairs of the selected shapes and methods that both
/// sides have a config for (and whose configs `--only` keeps).
fn pairs<'e>(
    r: &Request<'_>,
    exp: &'e Experiment,
    target: &run::Target,
    filter: &Filter,
    s: &Sides,
) -> Result<Vec<Pair<'e>>, Failure> {
    let shapes = crate::plan::shapes_for(exp, target.mode);
    filter.check_keys(exp, shapes)?;
    let kept = |c: &IndexMap<String, Json>| c.iter().all(|(k, v)| filter.keeps_value(k, v));
    let mut pairs = Vec::new();
    let mut one_sided = 0;
    for (shape_index, shape) in shapes.iter().enumerate() {
        if !filter.keeps_shape(shape) {
            continue;
        }
        for method in exp.methods.iter().filter(|m| filter.keeps_method(&m.name)) {
            match (
                s.a.config(shape, &method.name),
                s.b.config(shape, &method.name),
            ) {
                (Some(a), Some(b)) if kept(&a) && kept(&b) => pairs.push(Pair {
                    shape_index,
                    shape,
                    method,
                    a,
                    b,
                }),
                (Some(_), None) | (None, Some(_))
                    if s.a.covers(&method.name) && s.b.covers(&method.name) =>
                {
                    one_sided += 1
                }
                _ => {}
            }
        }
    }
    if pairs.is_empty() {
        return Err(bad(format!(
            "{} and {} have no (shape, method) of {} in common{}",
            s.a_path.display(),
            s.b_path.display(),
            exp.name,
            r.args
                .only
                .as_deref()
                .map(|o| format!(" with --only {o}"))
                .unwrap_or_default()
        )));
    }
    if one_sided > 0 {
        eprintln!(
            "note: {} with a config on one side only are not timed",
            count(
                one_sided as u64,
                "(shape, method) pair",
                "(shape, method) pairs"
            )
        );
    }
    Ok(pairs)
}

/// A natively launched method runs no Python module: code sides and a
/// planted slowdown cannot reach it.
fn refuse_native_variants(pairs: &[Pair<'_>], s: &Sides, plant: f64) -> Result<(), Failure> {
    let changed = !s.a_code.is_empty() || !s.b_code.is_empty() || plant > 0.0;
    match pairs.iter().find(|p| p.method.launch == LaunchPath::Native) {
        Some(p) if changed => Err(bad(format!(
            "method `{}` is launched natively: code sides and --plant-slowdown apply to methods their Python worker launches; leave it out with --only method=...",
            p.method.name
        ))),
        _ => Ok(()),
    }
}

/// The setup and the jobs of every pair: A, A's second preparation, B,
/// each with its side's code; a side's code files are written here, once
/// the A/B is known to run.
fn plan(
    r: &Request<'_>,
    exp: &Experiment,
    target: &run::Target,
    s: &Sides,
    pairs: &[Pair<'_>],
    j: &Judging,
) -> Result<AbPlan, Failure> {
    let mut protocol = schedule::effective_protocol(&exp.protocol, target.mode);
    // A round's batch is the A/B's own, not the tuning protocol's: taking
    // turns, 16 samples a side found what 32 did in half the time
    // (docs/ab.md, "The goals").
    protocol.batch = r.batch.unwrap_or(AB_BATCH.min(protocol.batch));
    let timed_as = crate::backend::SampleMode {
        timing: protocol.timing,
        flush: crate::backend::Flush::NONE,
        graph_calls: protocol.graph_calls,
    };
    let side = |path: &Path, picks: &Picks, code: &[Replaced]| AbSide {
        picks: path.display().to_string(),
        source: picks.source(),
        code: code.iter().map(Replaced::record).collect(),
    };
    let mut setup = AbSetup {
        id: String::new(),
        a: side(&s.a_path, &s.a, &s.a_code),
        b: side(&s.b_path, &s.b, &s.b_code),
        aa_rounds: r.aa_rounds,
        rounds: r.rounds,
        batch: schedule::lane::retime_count(&protocol, timed_as),
        threshold: j.threshold,
        extra_rounds: r.extra_rounds,
        plant: j.plant,
        interleave: r.interleave,
    };
    // The setup's id: the sides, how they are timed, every pair's configs
    // and method definitions, and the manifest (its protocol).
    let mut identity = serde_json::to_string(&setup).expect("setup serialises");
    identity.push_str(&exp.manifest_hash);
    for p in pairs {
        identity.push_str(&format!(
            "{}{}{}{}{}",
            shape_key(p.shape),
            p.method.name,
            p.method.identity,
            serde_json::to_string(&p.a).expect("config"),
            serde_json::to_string(&p.b).expect("config")
        ));
    }
    setup.id = hash_id(&[&identity, protocol.timing.as_str()]);
    let cache = r.settings.results_dir.join(".cache").join("ab");
    let a_modules = write_code(&s.a_code, &cache)?;
    let b_modules = write_code(&s.b_code, &cache)?;
    let job = |side: &str, p: &Pair<'_>, config: &IndexMap<String, Json>, modules: &Modules| Job {
        id: hash_id(&[&setup.id, side, &shape_key(p.shape), &p.method.name]),
        shape_index: p.shape_index,
        method: p.method.name.clone(),
        shape: p.shape.clone(),
        config: config.clone(),
        baseline: false,
        variant: (!modules.is_empty()).then(|| {
            Box::new(Variant {
                modules: modules.clone(),
                plant_us: 0.0,
            })
        }),
    };
    let pairs = pairs
        .iter()
        .map(|p| AbPairPlan {
            shape_index: p.shape_index,
            shape: p.shape.clone(),
            method: p.method.name.clone(),
            kernel: p.method.kernel.clone(),
            kind: p.method.kind,
            a: job("a", p, &p.a, &a_modules),
            a2: job("a2", p, &p.a, &a_modules),
            b: job("b", p, &p.b, &b_modules),
            unavailable: None,
        })
        .collect();
    Ok(AbPlan {
        timing: AbTiming {
            setup: setup.id.clone(),
            aa_rounds: r.aa_rounds,
            rounds: r.rounds,
            batch: setup.batch,
            extra_rounds: r.extra_rounds,
            threshold: j.threshold,
            plant: j.plant,
            interleave: r.interleave,
        },
        pairs,
        setup,
    })
}

/// Times the pairs `dir`'s journal has not recorded for this setup;
/// returns whether the run was interrupted.
#[allow(clippy::too_many_arguments)]
fn time_pairs(
    r: &Request<'_>,
    ab_exp: &Experiment,
    target: &run::Target,
    filter: Filter,
    roots: Vec<PathBuf>,
    plan: &AbPlan,
    s: &Sides,
    dir: &Path,
) -> Result<bool, Failure> {
    let done = if crate::store::journal::exists(dir) {
        let (results, _) = crate::store::journal::read(dir)
            .map_err(|e| Failure::environment(format!("error: {e}")))?;
        schedule::ab::recorded(&results, &plan.setup.id)
    } else {
        Default::default()
    };
    if plan.pairs.iter().all(|p| done.contains(&p.b.id)) {
        eprintln!(
            "tunelab ab: every pair of this A/B is recorded in {}; its report follows",
            dir.display()
        );
        return Ok(false);
    }
    eprintln!(
        "tunelab ab: {} (A: {}, B: {}), {} A/A and {} A/B rounds each{}, {}",
        count(plan.pairs.len() as u64, "pair", "pairs"),
        s.a_path.display(),
        s.b_path.display(),
        r.aa_rounds,
        r.rounds,
        if r.extra_rounds > 0 {
            format!(" ({} more where the verdict is AMBIGUOUS)", r.extra_rounds)
        } else {
            String::new()
        },
        match r.interleave {
            Interleave::Samples => "the sides taking turns sample by sample",
            Interleave::Batches => "a batch of one side, then of the other",
        }
    );
    let opts = RunOptions {
        exp: ab_exp,
        device: target.device.clone(),
        gpus: target.gpus.clone(),
        interpreter_lanes: target.lanes,
        first_lane: target.first_lane,
        shard: None,
        mode: target.mode,
        run_mode: RunMode::Ab,
        filter,
        python: r.settings.python.clone(),
        python_path: roots,
        results_dir: r.settings.results_dir.clone(),
        compile_workers: run::compile_workers(r.settings, target),
        compile_priority: r.settings.compile_priority,
        only_jobs: None,
        progress: r.progress,
        retries: r.settings.retries,
        ab: Some(plan),
    };
    let outcome =
        schedule::run(opts, run::fingerprint(ab_exp, target)).map_err(run::run_failure)?;
    eprintln!(
        "tunelab ab: {} in {}",
        dir.display(),
        run::seconds(outcome.wall_s)
    );
    Ok(outcome.interrupted)
}

/// Writes the report from the journal, prints its headline and the
/// gate's result; the exit status.
fn report_and_gate(dir: &Path, gate: Option<f64>, interrupted: bool) -> Result<i32, Failure> {
    let written = super::results::write_outputs(dir)?;
    let (results, _) = crate::store::journal::read(dir)
        .map_err(|e| Failure::environment(format!("error: {e}")))?;
    let outcome = crate::emit::ab::AbOutcome::of(&results)
        .ok_or_else(|| Failure::internal("error: the A/B's journal holds no A/B"))?;
    say!("{}", outcome.headline());
    for p in written {
        say!("report: {}", p.display());
    }
    if interrupted {
        eprintln!("interrupted: run the same command to time the pairs left");
        return Ok(exit::INTERRUPTED);
    }
    if let Some(t) = gate {
        let bad = outcome.regressions(t);
        if !bad.is_empty() {
            say!(
                "gate: {} SLOW by more than {}",
                count(bad.len() as u64, "pair is", "pairs are"),
                pct(t)
            );
            return Ok(exit::REGRESSION);
        }
        say!("gate: no pair is SLOW by more than {}", pct(t));
    }
    Ok(if outcome.failed().is_empty() {
        exit::OK
    } else {
        exit::JOBS_FAILED
    })
}
