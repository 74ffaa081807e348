//! Launch recipes: what the native worker launches for a job. A `kind:
//! cuda|hip` job's grid, block, shared memory and arguments are resolved
//! here from the method's expressions over its shape, config and device; a
//! Triton job's come from a recipe the Python worker (or the compile pool's
//! worker) made from the kernel Triton compiled, asked for in batches of
//! the jobs ahead of it and kept for the shape.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value as Json;

use super::super::images::{context, eval};
use super::sharing::share_key;
use super::LaneBackend;
use crate::backend::python::failure_of;
use crate::backend::wire::unfit;
use crate::backend::JobFailure;
use crate::manifest::{KernelArg, Method, ScalarType};
use crate::plan::Job;
use crate::protocol::native::{self as message, Arg, Compare, Poison};
use crate::protocol::python::{self as py, RecipeAnswer, ShareAnswer};
use crate::protocol::Then;
use crate::store::{FailureClass, KernelResources};

/// Triton recipes asked for in one Python call at most: the job about to be
/// checked and the next compiled jobs of its group.
pub(super) const RECIPE_BATCH: usize = 16;

/// A resolved launch, as the native worker's `check` takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub image: PathBuf,
    pub symbol: String,
    pub grid: Vec<u64>,
    pub block: Vec<u64>,
    pub shared: u64,
    pub args: Vec<Arg>,
}

impl Launch {
    /// The native worker's `check` of this launch for `job_id`.
    pub(super) fn check_request<'a>(
        &'a self,
        job_id: &'a str,
        poison: Poison<'a>,
        compare: Option<Compare<'a>>,
        then: Option<Then>,
    ) -> message::Check<'a> {
        message::Check {
            job_id: job_id.into(),
            image: self.image.as_path().into(),
            symbol: self.symbol.as_str().into(),
            grid: self.grid.as_slice().into(),
            block: self.block.as_slice().into(),
            shared: self.shared,
            args: self.args.as_slice().into(),
            poison: Some(poison),
            compare,
            then,
        }
    }

    fn with_image(mut self, image: PathBuf, symbol: String) -> Launch {
        self.image = image;
        self.symbol = symbol;
        self
    }

    /// A Triton job's recipe (the Python worker's `recipe` answer).
    pub(super) fn from_recipe(r: Json) -> Result<Launch, JobFailure> {
        let r: RecipeAnswer =
            serde_json::from_value(r).map_err(|e| unfit("the worker's answer to `recipe`", e))?;
        Ok(Launch {
            image: r.image,
            symbol: r.symbol,
            grid: r.grid,
            block: r.block,
            shared: r.shared,
            // The recipe names and types each argument; the worker takes the value alone.
            args: r.args.into_iter().map(|a| a.value).collect(),
        })
    }
}

/// A Triton job's recipe, as read from the Python worker's answer.
pub(super) struct TritonRecipe {
    pub(super) launch: Launch,
    /// What Triton compiled (stages included), as a Python check reports it.
    pub(super) kernels: Vec<KernelResources>,
}

impl TritonRecipe {
    pub(super) fn read(mut answer: Json) -> Result<TritonRecipe, JobFailure> {
        let kernels = answer
            .get_mut("kernels")
            .map(Json::take)
            .and_then(|k| serde_json::from_value::<Vec<py::Kernel>>(k).ok())
            .unwrap_or_default()
            .into_iter()
            .map(KernelResources::from)
            .collect();
        Ok(TritonRecipe {
            launch: Launch::from_recipe(answer)?,
            kernels,
        })
    }
}

/// A native job's launch, as `ready_launch` made it.
pub(super) enum ReadyLaunch {
    Resolved(Launch),
    Recipe(Arc<TritonRecipe>),
}

impl ReadyLaunch {
    pub(super) fn launch(&self) -> &Launch {
        match self {
            ReadyLaunch::Resolved(l) => l,
            ReadyLaunch::Recipe(r) => &r.launch,
        }
    }

    /// What Triton compiled, from a recipe (stages included); empty for a
    /// native method, whose kernel the worker describes in its answer.
    pub(super) fn kernels(&self) -> Vec<KernelResources> {
        match self {
            ReadyLaunch::Resolved(_) => Vec::new(),
            ReadyLaunch::Recipe(r) => r.kernels.clone(),
        }
    }
}

impl LaneBackend {
    /// A native job's launch, ready to send: compiled and resolved from its
    /// method's expressions (CUDA C++, HIP), or a Triton job's recipe; the
    /// shape's tensors shared with the native worker either way.
    pub(super) fn ready_launch(
        &mut self,
        method: &Method,
        job: &Job,
        seed: u64,
    ) -> Result<ReadyLaunch, JobFailure> {
        if method.kind.is_native() {
            let n = self.native.as_ref().expect("a native lane");
            let artifact = n.setup.compiler.compile(method, job)?;
            self.share(&job.shape, seed)?;
            let n = self.native.as_ref().expect("a native lane");
            let shared = &n.shared.as_ref().expect("shared").reply;
            let launch = resolve(method, job, shared, &n.setup.device)?
                .with_image(artifact.image, artifact.symbol);
            return Ok(ReadyLaunch::Resolved(launch));
        }
        self.share(&job.shape, seed)?;
        let cache = self
            .native
            .as_ref()
            .expect("a native lane")
            .setup
            .cache_dir
            .clone();
        Ok(ReadyLaunch::Recipe(self.recipe(method, job, seed, cache)?))
    }

    /// Whether `ready_launch` would make no call to either worker: the
    /// shape is shared with the running native worker and, for a Triton
    /// job, its recipe was read.
    pub(super) fn ready_without_calls(&self, method: &Method, job: &Job, seed: u64) -> bool {
        let Some(n) = self.native.as_ref() else {
            return false;
        };
        let shared = n.holds(&share_key(&job.shape, seed), self.python.generation());
        shared && (method.kind.is_native() || n.has_recipe(&job.id))
    }

    /// A Triton job's recipe: kept from an earlier batch, or asked for with
    /// the recipes of the jobs ahead of it (`look_ahead`) in one call.
    fn recipe(
        &mut self,
        method: &Method,
        job: &Job,
        seed: u64,
        cache: PathBuf,
    ) -> Result<Arc<TritonRecipe>, JobFailure> {
        let n = self.native.as_mut().expect("a native lane");
        if let Some(r) = n.recipes.get(&job.id).or_else(|| n.from_pool.get(&job.id)) {
            return Ok(r.clone());
        }
        // Offered for this job only: a check that stopped before its recipe
        // leaves its list to no one.
        let ahead = match n.ahead.take() {
            Some((for_job, jobs)) if for_job == job.id => jobs,
            _ => Vec::new(),
        };
        let batch: Vec<&Job> = std::iter::once(job)
            .chain(
                ahead
                    .iter()
                    .filter(|j| j.method == job.method && j.id != job.id && !n.has_recipe(&j.id)),
            )
            .take(RECIPE_BATCH)
            .collect();
        let body = serde_json::to_value(py::Recipes {
            jobs: batch
                .iter()
                .map(|j| {
                    self.python
                        .job_message(j, &method.kernel, method.kind.as_str())
                })
                .collect(),
            seed,
            cache_dir: &cache,
        })
        .expect("a request serialises");
        let reply = match self.python.request("recipes", &body) {
            Ok(r) => r,
            // A worker that predates `recipes` (or a batch that went wrong as
            // a whole): this job's recipe alone, as before.
            Err(f) if !matches!(f.class, FailureClass::Crash | FailureClass::Timeout) => {
                return self.recipe_alone(method, job, seed, cache);
            }
            Err(f) => return Err(f),
        };
        let mut reply = reply;
        let answers = reply
            .get_mut("recipes")
            .map(Json::take)
            .and_then(|a| match a {
                Json::Array(a) => Some(a),
                _ => None,
            })
            .filter(|a| a.len() == batch.len());
        let Some(answers) = answers else {
            // A worker that answers out of protocol is not trusted with the next job.
            let f = JobFailure::new(
                FailureClass::Crash,
                format!(
                    "protocol error: the answer to `recipes` does not hold {} recipes",
                    batch.len()
                ),
            );
            self.python.after_failure(&f);
            return Err(f);
        };
        let fault = batch.iter().zip(&answers).find_map(|(j, a)| {
            let failed = a.get("ok").and_then(Json::as_bool) != Some(true);
            let f = failure_of(a);
            (failed && f.class == FailureClass::LaunchError).then_some((j.id.clone(), f))
        });
        if let Some((at, fault)) = fault {
            // A fault may have poisoned the worker's CUDA context: it is not
            // used again, and the tensors it shared go with it.
            self.python.after_failure(&fault);
            if at == job.id {
                return Err(fault);
            }
            // Another job's fault is that job's, at its own check: this one
            // is shared again (with a new worker) and asked for alone.
            self.native.as_mut().expect("a native lane").shared = None;
            self.share(&job.shape, seed)?;
            return self.recipe_alone(method, job, seed, cache);
        }
        let n = self.native.as_mut().expect("a native lane");
        let mut own = None;
        for (j, answer) in batch.iter().zip(answers) {
            let ok = answer.get("ok").and_then(Json::as_bool) == Some(true);
            if j.id == job.id {
                own = Some(if ok {
                    TritonRecipe::read(answer).map(Arc::new)
                } else {
                    Err(failure_of(&answer))
                });
            } else if ok {
                // Another job's failure (or unreadable recipe) is asked for
                // again at its own check.
                if let Ok(r) = TritonRecipe::read(answer) {
                    n.recipes.insert(j.id.clone(), Arc::new(r));
                }
            }
        }
        let own = own.expect("the job leads its batch")?;
        n.recipes.insert(job.id.clone(), own.clone());
        Ok(own)
    }

    /// One job's recipe in a call of its own (`recipe`), kept.
    fn recipe_alone(
        &mut self,
        method: &Method,
        job: &Job,
        seed: u64,
        cache: PathBuf,
    ) -> Result<Arc<TritonRecipe>, JobFailure> {
        let body = serde_json::to_value(py::Recipe {
            job: self
                .python
                .job_message(job, &method.kernel, method.kind.as_str()),
            seed,
            cache_dir: &cache,
        })
        .expect("a request serialises");
        let answer = self.python.request("recipe", &body)?;
        let recipe = Arc::new(TritonRecipe::read(answer)?);
        let n = self.native.as_mut().expect("a native lane");
        n.recipes.insert(job.id.clone(), recipe.clone());
        Ok(recipe)
    }
}

/// A `kind: cuda|hip` job's grid, block, shared memory and arguments, from
/// the method's expressions over its shape, config and device.
pub(super) fn resolve(
    method: &Method,
    job: &Job,
    shared: &ShareAnswer,
    device: &Json,
) -> Result<Launch, JobFailure> {
    let spec = method.native.as_ref().expect("a native method");
    let ctx = context(job, device);
    let problem = |m: String| JobFailure::new(FailureClass::ProblemError, m);
    let count = |e: &crate::manifest::Expr, what: &str| -> Result<u64, JobFailure> {
        let v = eval(e, &ctx)?;
        v.as_u64().ok_or_else(|| {
            problem(format!(
                "{what} `{}` (at {}) is {v}: it must be a whole number >= 0",
                e.source, e.span
            ))
        })
    };
    let grid = method
        .grid
        .iter()
        .map(|e| count(e, "grid"))
        .collect::<Result<Vec<_>, _>>()?;
    let block = spec
        .block
        .iter()
        .map(|e| count(e, "block"))
        .collect::<Result<Vec<_>, _>>()?;
    let shared_bytes = spec
        .shared_mem
        .as_ref()
        .map(|e| count(e, "shared_mem"))
        .transpose()?
        .unwrap_or(0);
    let names: Vec<&str> = shared.tensors.iter().map(|t| t.name.as_str()).collect();
    let mut args = Vec::new();
    for arg in &spec.args {
        args.push(match arg {
            KernelArg::Tensor { name, span } => {
                let i = names.iter().position(|n| n == name).ok_or_else(|| {
                    problem(format!(
                        "argument `{name}` (at {span}) names no tensor of the problem: it shares {}",
                        names.join(", ")
                    ))
                })?;
                Arg::Tensor(i)
            }
            KernelArg::Scalar { ty, expr } => {
                let v = eval(expr, &ctx)?;
                scalar(*ty, &v).ok_or_else(|| {
                    problem(format!(
                        "argument `{}` (at {}) is {v}, which is not a {}",
                        expr.source,
                        expr.span,
                        ty.as_str()
                    ))
                })?
            }
        });
    }
    Ok(Launch {
        image: PathBuf::new(),
        symbol: String::new(),
        grid,
        block,
        shared: shared_bytes,
        args,
    })
}

/// A value as a typed argument, when it fits the type.
pub(super) fn scalar(ty: ScalarType, v: &Json) -> Option<Arg> {
    Some(match ty {
        ScalarType::I32 => Arg::I32(i32::try_from(v.as_i64()?).ok()?),
        ScalarType::I64 => Arg::I64(v.as_i64()?),
        ScalarType::U32 => Arg::U32(u32::try_from(v.as_u64()?).ok()?),
        ScalarType::U64 => Arg::U64(v.as_u64()?),
        ScalarType::F32 => Arg::F32(v.as_f64()? as f32),
        ScalarType::F64 => Arg::F64(v.as_f64()?),
    })
}
