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
use crate::emit::select::{shape_key, Selection};
use crate::exit;
use crate::manifest::{Experiment, FixedConfigs, LaunchPath, Method, Shape};
use crate::plan::{Filter, Job, RunMode, Variant};
use crate::schedule::ab::{AbPairPlan, AbPlan, AbTiming};
use crate::schedule::{self, RunOptions};
use crate::store::{AbCode, AbSetup, AbSide, PicksSource};

use indexmap::IndexMap;
use serde_json::Value as Json;

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

/// The pairs of the two sides over the experiment's selected shapes and
/// methods, in plan order: (shape index, shape, method, A's config, B's).
type Pair<'e> = (
    usize,
    &'e Shape,
    &'e Method,
    IndexMap<String, Json>,
    IndexMap<String, Json>,
);

pub(super) fn ab(r: &Request<'_>) -> Result<i32, Failure> {
    let threshold = r
        .threshold
        .map(|t| percentage("--threshold", t))
        .transpose()?
        .unwrap_or(crate::measure::paired::DEFAULT_THRESHOLD);
    let gate = r
        .fail_on_slower
        .map(|t| percentage("--fail-on-slower", t))
        .transpose()?;
    let plant = r
        .plant
        .map(|t| percentage("--plant-slowdown", t))
        .transpose()?
        .unwrap_or(0.0);
    let targets = run::targets(r.settings, r.gpus, r.lanes)?;
    if targets.len() > 1 {
        return Err(bad(format!(
            "this host has GPUs of {} models, and an A/B times both sides on one model: choose its GPUs with --gpus",
            targets.len()
        )));
    }
    let target = &targets[0];
    let exp = load_experiment(r.manifest, r.args, &target.device)?;
    let filter = Filter::parse(r.args.only.as_deref().unwrap_or(""))?;
    let shapes = crate::plan::shapes_for(&exp, target.mode);
    filter.check_keys(&exp, shapes)?;

    let own = schedule::results_dir(&r.settings.results_dir, &exp, &target.device, target.mode);
    let a_path = r.a.map_or(own, Path::to_path_buf);
    let b_path = r.b.map_or_else(|| a_path.clone(), Path::to_path_buf);
    let a = read_picks("--a", &a_path, &exp)?;
    let b = if b_path == a_path {
        read_picks("--a", &a_path, &exp)?
    } else {
        read_picks("--b", &b_path, &exp)?
    };
    let roots = super::environment::worker_python_path(&exp, &r.settings.python);
    let a_code = read_code("--a-code", r.a_code, &roots)?;
    let b_code = read_code("--b-code", r.b_code, &roots)?;

    let mut pairs: Vec<Pair<'_>> = Vec::new();
    let mut one_sided = 0;
    for (i, shape) in shapes.iter().enumerate() {
        if !filter.keeps_shape(shape) {
            continue;
        }
        for method in exp.methods.iter().filter(|m| filter.keeps_method(&m.name)) {
            let kept = |c: &IndexMap<String, Json>| c.iter().all(|(k, v)| filter.keeps_value(k, v));
            match (a.config(shape, &method.name), b.config(shape, &method.name)) {
                (Some(ca), Some(cb)) if kept(&ca) && kept(&cb) => {
                    pairs.push((i, shape, method, ca, cb))
                }
                (Some(_), None) | (None, Some(_))
                    if a.covers(&method.name) && b.covers(&method.name) =>
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
            a_path.display(),
            b_path.display(),
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
            crate::emit::num::count(
                one_sided as u64,
                "(shape, method) pair",
                "(shape, method) pairs"
            )
        );
    }
    for (_, _, method, _, _) in &pairs {
        let native = method.launch == LaunchPath::Native;
        let changed = !a_code.is_empty() || !b_code.is_empty() || plant > 0.0;
        if native && changed {
            return Err(bad(format!(
                "method `{}` is launched natively: code sides and --plant-slowdown apply to methods their Python worker launches; leave it out with --only method=...",
                method.name
            )));
        }
    }

    let protocol = schedule::effective_protocol(&exp.protocol, target.mode);
    let mode_timing = crate::backend::SampleMode {
        timing: protocol.timing,
        flush: crate::backend::Flush::NONE,
        graph_calls: protocol.graph_calls,
    };
    let batch = schedule::lane::retime_count(&protocol, mode_timing);
    let side = |path: &Path, picks: &Picks, code: Vec<AbCode>| AbSide {
        picks: path.display().to_string(),
        source: picks.source(),
        code,
    };
    let mut setup = AbSetup {
        id: String::new(),
        a: side(&a_path, &a, a_code.iter().map(Replaced::record).collect()),
        b: side(&b_path, &b, b_code.iter().map(Replaced::record).collect()),
        aa_rounds: r.aa_rounds,
        rounds: r.rounds,
        batch,
        threshold,
        plant,
    };
    let mut identity = serde_json::to_string(&setup).expect("setup serialises");
    identity.push_str(&exp.manifest_hash);
    for (_, shape, method, ca, cb) in &pairs {
        identity.push_str(&format!(
            "{}{}{}{}{}",
            shape_key(shape),
            method.name,
            method.identity,
            serde_json::to_string(ca).expect("config"),
            serde_json::to_string(cb).expect("config")
        ));
    }
    setup.id = hash_id(&[&identity, protocol.timing.as_str()]);
    let cache = r.settings.results_dir.join(".cache").join("ab");
    let a_modules = write_code(&a_code, &cache)?;
    let b_modules = write_code(&b_code, &cache)?;

    let variant = |modules: &[(String, PathBuf)]| {
        (!modules.is_empty()).then(|| {
            Box::new(Variant {
                modules: modules.to_vec(),
                plant_us: 0.0,
            })
        })
    };
    let job = |side: &str,
               i: usize,
               shape: &Shape,
               method: &Method,
               config: &IndexMap<String, Json>,
               modules: &[(String, PathBuf)]| Job {
        id: hash_id(&[&setup.id, side, &shape_key(shape), &method.name]),
        shape_index: i,
        method: method.name.clone(),
        shape: shape.clone(),
        config: config.clone(),
        baseline: false,
        variant: variant(modules),
    };
    let plan = AbPlan {
        timing: AbTiming {
            setup: setup.id.clone(),
            aa_rounds: r.aa_rounds,
            rounds: r.rounds,
            plant,
        },
        pairs: pairs
            .iter()
            .map(|(i, shape, method, ca, cb)| AbPairPlan {
                shape_index: *i,
                shape: (*shape).clone(),
                method: method.name.clone(),
                kernel: method.kernel.clone(),
                kind: method.kind,
                a: job("a", *i, shape, method, ca, &a_modules),
                a2: job("a2", *i, shape, method, ca, &a_modules),
                b: job("b", *i, shape, method, cb, &b_modules),
                unavailable: None,
            })
            .collect(),
        setup,
    };
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
    let done = if crate::store::journal::exists(&dir) {
        let (results, _) = crate::store::journal::read(&dir)
            .map_err(|e| Failure::environment(format!("error: {e}")))?;
        schedule::ab::recorded(&results, &plan.setup.id)
    } else {
        Default::default()
    };
    let mut interrupted = false;
    if plan.pairs.iter().all(|p| done.contains(&p.b.id)) {
        eprintln!(
            "tunelab ab: every pair of this A/B is recorded in {}; its report follows",
            dir.display()
        );
    } else {
        eprintln!(
            "tunelab ab: {} (A: {}, B: {}), {} A/A and {} A/B rounds each",
            crate::emit::num::count(plan.pairs.len() as u64, "pair", "pairs"),
            a_path.display(),
            b_path.display(),
            r.aa_rounds,
            r.rounds
        );
        let opts = RunOptions {
            exp: &ab_exp,
            device: target.device.clone(),
            gpus: target.gpus.clone(),
            interpreter_lanes: target.lanes,
            first_lane: target.first_lane,
            shard: None,
            mode: target.mode,
            run_mode: RunMode::Ab,
            filter,
            python: r.settings.python.clone(),
            python_path: roots.clone(),
            results_dir: r.settings.results_dir.clone(),
            compile_workers: run::compile_workers(r.settings, target),
            compile_priority: r.settings.compile_priority,
            only_jobs: None,
            progress: r.progress,
            ab: Some(&plan),
        };
        let outcome =
            schedule::run(opts, run::fingerprint(&ab_exp, target)).map_err(run::run_failure)?;
        interrupted = outcome.interrupted;
        eprintln!(
            "tunelab ab: {} in {}",
            dir.display(),
            run::seconds(outcome.wall_s)
        );
    }
    let written = super::results::write_outputs(&dir)?;
    let (results, _) = crate::store::journal::read(&dir)
        .map_err(|e| Failure::environment(format!("error: {e}")))?;
    let outcome = crate::emit::ab::AbOutcome::of(&results)
        .ok_or_else(|| Failure::internal("error: the A/B's journal holds no A/B"))?;
    println!("{}", outcome.headline());
    for p in written {
        println!("report: {}", p.display());
    }
    if interrupted {
        eprintln!("interrupted: run the same command to time the pairs left");
        return Ok(exit::INTERRUPTED);
    }
    if let Some(t) = gate {
        let bad = outcome.regressions(t);
        if bad.is_empty() {
            println!(
                "gate: no pair is SLOW by more than {}",
                crate::emit::compare::pct(t)
            );
        } else {
            println!(
                "gate: {} SLOW by more than {}",
                crate::emit::num::count(bad.len() as u64, "pair is", "pairs are"),
                crate::emit::compare::pct(t)
            );
            return Ok(exit::REGRESSION);
        }
    }
    Ok(if outcome.failed().is_empty() {
        exit::OK
    } else {
        exit::JOBS_FAILED
    })
}
