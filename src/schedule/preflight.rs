//! What a run checks before it writes anything: that the plan holds jobs,
//! that the problem imports and has its methods, that the space values are
//! of the types the methods declare. Any failure here is bad input (exit 2)
//! and leaves nothing behind: the run's `store::lock::Claim` removes what
//! its start made.

use std::collections::HashMap;
use std::path::Path;

use crate::backend::{JobFailure, PythonBackend};
use crate::diag::{Diagnostic, Diagnostics};
use crate::manifest::{Experiment, Shape};
use crate::plan::{Filter, Mode, RunMode};

/// Why a run has nothing to do: an `--only` that matches nothing (naming
/// what there is), a bench run with no baselines, or `--use-best` naming
/// none of this experiment's jobs.
pub fn no_jobs(
    exp: &Experiment,
    filter: &Filter,
    mode: Mode,
    run_mode: RunMode,
    use_best: bool,
) -> Diagnostic {
    let shapes = match (mode, &exp.interpreter) {
        (Mode::Interpreter, Some(i)) => &i.shapes,
        _ => &exp.shapes,
    };
    if !filter.is_empty() {
        let set = match (mode, &exp.interpreter) {
            (Mode::Interpreter, Some(_)) => {
                "without a GPU the experiment runs its `interpreter:` shapes, and "
            }
            _ => "",
        };
        return Diagnostic::in_file(
            Path::new(&filter.origin()),
            format!("`{}` leaves no jobs to run", filter.origin()),
        )
        .help(format!(
            "{set}its jobs have {}",
            filter.choices(exp, shapes)
        ));
    }
    if use_best {
        return Diagnostic::in_file(
            &exp.manifest_path,
            "--use-best names no job of this experiment",
        )
        .help("pass the results directory of a run of this manifest");
    }
    match run_mode {
        RunMode::Bench => Diagnostic::in_file(
            &exp.manifest_path,
            "bench mode runs each method's baseline, and no method here has one",
        )
        .help("add `baseline:` to a method, or pass --use-best DIR"),
        _ => Diagnostic::in_file(&exp.manifest_path, "the plan has no jobs"),
    }
}

/// Asks the first lane's worker to import and construct the problem at the
/// first planned shape and look up every method; then checks each method's
/// configs against the types its implementation declares. Returns each
/// method's description, by kernel name.
pub fn check_problem(
    exp: &Experiment,
    worker: &mut PythonBackend,
    shape: &Shape,
    python: &str,
) -> Result<HashMap<String, String>, Diagnostics> {
    // Native methods are compiled from their source, not looked up in the problem.
    let kernels: Vec<(&str, crate::manifest::MethodKind)> = exp
        .methods
        .iter()
        .filter(|m| !m.kind.is_native())
        .map(|m| (m.kernel.as_str(), m.kind))
        .collect();
    let shape_json = serde_json::to_value(shape).expect("shape serialises");
    let probe = worker
        .probe(&shape_json, &kernels)
        .map_err(|f| Diagnostics::from(unloadable(exp, &f, python)))?;
    let mut errors = Vec::new();
    for method in &exp.methods {
        let Some(found) = probe.methods.get(&method.kernel) else {
            continue;
        };
        if !found.found {
            errors.push(
                Diagnostic::at(
                    method.kernel_span,
                    format!(
                        "method `{}`: problem `{}` has no method `{}`",
                        method.name, exp.problem, method.kernel
                    ),
                )
                .help(format!(
                    "set `kernel:` to one it has: {}",
                    probe.available.join(", ")
                )),
            );
            continue;
        }
        if let Some(types) = &found.config_types {
            errors.extend(method.check_config_types(types));
        }
    }
    if errors.is_empty() {
        let mut descriptions: HashMap<String, String> = probe
            .methods
            .into_iter()
            .filter_map(|(kernel, m)| m.description.map(|d| (kernel, d)))
            .collect();
        for m in &exp.methods {
            if let Some(spec) = &m.native {
                let file = spec
                    .source
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let compiler = if m.kind == crate::manifest::MethodKind::Hip {
                    "hiprtc"
                } else {
                    "NVRTC"
                };
                descriptions.insert(
                    m.kernel.clone(),
                    format!(
                        "{} kernel `{}` ({file}), compiled with {compiler} and launched natively",
                        m.kind.as_str().to_uppercase(),
                        m.kernel
                    ),
                );
            } else if m.launch == crate::manifest::LaunchPath::Native {
                if let Some(d) = descriptions.get_mut(&m.kernel) {
                    d.push_str(" (launched natively)");
                }
            }
        }
        if exp.inputs == crate::manifest::InputSource::Native {
            for d in descriptions.values_mut() {
                d.push_str("; inputs and reference built by the native worker (`inputs: native`)");
            }
        }
        Ok(descriptions)
    } else {
        Err(Diagnostics(errors))
    }
}

fn unloadable(exp: &Experiment, f: &JobFailure, python: &str) -> Diagnostic {
    let module = exp
        .problem
        .split_once(':')
        .map_or(exp.problem.as_str(), |(m, _)| m);
    let last_line = f.message.lines().last().unwrap_or("").trim();
    Diagnostic::at(
        exp.problem_span,
        format!("problem `{}` cannot be loaded: {last_line}", exp.problem),
    )
    .help(if exp.builtin_problem() {
        format!("the workers' Python ({python}) must have torch and triton: run `tunelab doctor`")
    } else {
        format!(
            "the workers' Python ({python}) must import `{module}`: install it there, or name its folder in `python_path:` (relative to this manifest)"
        )
    })
}
