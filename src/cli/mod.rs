//! The `tunelab` command: parse the arguments, load the layered settings, run
//! one command, map what went wrong to a documented exit code (`exit.rs`).
//! `src/main.rs` only calls [`main`]; so does the Python package's console
//! entry point, through the extension module.
//!
//! One file per group of commands:
//! - `run.rs`: `run` (with companions);
//! - `inspect.rs`: `validate`, `plan`;
//! - `results.rs`: `report`, `pack`;
//! - `compare.rs`: `compare`;
//! - `ab.rs`: `ab`, an A/B of two sides in one run (docs/ab.md);
//! - `environment.rs`: `devices`, `doctor`, `config`, `schema`, and where the
//!   worker's Python package is;
//! - `workbench.rs`: `ir-pass`, `profile` (their Python halves in
//!   `tunelab.workbench`).

/// `println!` for a command's output: a failed write to standard output is
/// the command's failure (exit 1, said on stderr), never a panic and never
/// exit 0; a reader that stopped reading (`| head`) ends it quietly.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err($crate::cli::stdout_failed)?;
    }};
}

/// `print!` for a command's output, as [`say!`].
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout();
        write!(out, $($arg)*)
            .and_then(|()| out.flush())
            .map_err($crate::cli::stdout_failed)?;
    }};
}

mod ab;
pub mod args;
mod compare;
mod environment;
mod inspect;
mod merge;
mod native;
mod results;
mod run;
mod workbench;

use std::ffi::OsString;

use clap::Parser;

use crate::config::{self, FlagSettings};
use crate::diag::{Diagnostic, Diagnostics};
use crate::exit;
use args::{Cli, Command, GlobalArgs};

/// Runs the command line `args` (program name first) and returns the exit code.
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print and succeed; a usage error is bad input.
            let _ = e.print();
            return if e.use_stderr() {
                exit::BAD_INPUT
            } else {
                exit::OK
            };
        }
    };
    if let Command::NativeWorker { backend } = &cli.command {
        // Reads no settings: the runner that started it has.
        return crate::native::server::main(backend);
    }
    match dispatch(cli) {
        Ok(code) => code,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprint!("{}", failure.message);
                if !failure.message.ends_with('\n') {
                    eprintln!();
                }
            }
            failure.code
        }
    }
}

fn dispatch(cli: Cli) -> Result<i32, Failure> {
    let layered =
        config::load(cli.global.config.as_ref(), &flags(&cli.global)).map_err(settings_error)?;
    // `plan` plans for what `run` would run here unless a profile is asked for.
    let device_chosen = layered.chosen("device_profile");
    let settings = layered.settings.clone();
    // The folders the settings allow, besides those given with --allow-read:
    // from the environment, for every manifest; from a settings file, for a
    // manifest outside the repository the file lies in (`load_experiment`).
    let allowed = settings.allow_read.clone();
    let allowed_file = layered.file_of("allow_read");
    let with_settings = |mut args: args::ManifestArgs| {
        match &allowed_file {
            Some(file) => args.allowed_by_file = Some((file.clone(), allowed.clone())),
            None => args.allow_read.extend(allowed.iter().cloned()),
        }
        args
    };
    match cli.command {
        Command::Validate {
            manifests,
            manifest: args,
        } => inspect::validate(&manifests, &with_settings(args), &settings),
        Command::Plan {
            manifest,
            manifest_args,
            json,
            jobs,
            interpret,
            shard,
        } => inspect::plan(
            &manifest,
            &with_settings(manifest_args),
            &settings,
            inspect::PlanOutput { json, jobs },
            inspect::PlanFor {
                interpret,
                device_chosen,
            },
            shard,
        ),
        Command::Run {
            manifest,
            manifest_args,
            mode,
            use_best,
            interpret,
            compile_workers,
            retries,
            quiet,
            trace,
            compare_to,
            gpus,
            lanes,
            shard,
            keep_ir,
            ir_target,
        } => {
            let mut settings = settings;
            settings.interpret |= interpret;
            if let Some(n) = compile_workers {
                settings.compile_workers = n;
            }
            if let Some(n) = retries {
                settings.retries = n;
            }
            let manifest_args = with_settings(manifest_args);
            let request = run::Request {
                manifest: &manifest,
                args: &manifest_args,
                settings: &settings,
                run_mode: mode.into(),
                use_best: use_best.as_deref(),
                progress: !quiet,
                compare_to: &compare_to,
                gpus: gpus.as_deref(),
                lanes: lanes.map(|n| n as usize),
                shard,
                keep_ir: keep_ir.map(Into::into),
                ir_target: ir_target.as_deref(),
            };
            run::run_traced(&request, trace.as_deref())
        }
        Command::Ab {
            manifest,
            manifest_args,
            a,
            b,
            a_code,
            b_code,
            aa_rounds,
            rounds,
            batch,
            extra_rounds,
            interleave,
            threshold,
            fail_on_slower,
            plant_slowdown,
            interpret,
            gpus,
            lanes,
            compile_workers,
            quiet,
            trace,
        } => {
            let mut settings = settings;
            settings.interpret |= interpret;
            if let Some(n) = compile_workers {
                settings.compile_workers = n;
            }
            let request = ab::Request {
                manifest: &manifest,
                args: &manifest_args,
                settings: &settings,
                a: a.as_deref(),
                b: b.as_deref(),
                a_code: &a_code,
                b_code: &b_code,
                aa_rounds,
                rounds,
                batch,
                extra_rounds,
                interleave: if interleave == "batches" {
                    crate::store::Interleave::Batches
                } else {
                    crate::store::Interleave::Samples
                },
                threshold: threshold.as_deref(),
                fail_on_slower: fail_on_slower.as_deref(),
                plant: plant_slowdown.as_deref(),
                gpus: gpus.as_deref(),
                lanes: lanes.map(|n| n as usize),
                progress: !quiet,
            };
            run::traced(trace.as_deref(), || ab::ab(&request))
        }
        Command::Report { results } => results::report(&results),
        Command::Compare {
            base,
            new,
            fail_on_slower,
            run_spread,
            out,
        } => {
            let mut settings = settings;
            if let Some(spread) = run_spread {
                settings.run_spread = compare::percentage("--run-spread", &spread)?;
            }
            compare::compare(
                &base,
                &new,
                fail_on_slower.as_deref(),
                out.as_deref(),
                &settings,
            )
        }
        Command::Pack { results } => results::pack(&results),
        Command::Merge { into, files, force } => merge::merge(&into, &files, force),
        Command::IrPass {
            file,
            passes,
            list,
            target,
            options,
            out,
            compile,
        } => workbench::ir_pass(
            &settings,
            &workbench::IrPassArgs {
                file: &file,
                passes: &passes,
                list,
                target: target.as_deref(),
                options: &options,
                out: out.as_deref(),
                compile,
            },
        ),
        Command::Profile {
            results,
            top,
            calls,
            only,
            manifest,
            no_ncu,
        } => workbench::profile(
            &settings,
            &workbench::ProfileArgs {
                dir: &results,
                top,
                calls,
                only: only.as_deref(),
                manifest: manifest.as_deref(),
                ncu: !no_ncu,
            },
        ),
        Command::Devices { json } => environment::devices(json),
        Command::Doctor => environment::doctor(&settings),
        Command::Schema { worker_protocol } => {
            if worker_protocol {
                say_raw!("{}", crate::protocol::json_schema());
            } else {
                say_raw!("{}", crate::manifest::json_schema());
            }
            Ok(exit::OK)
        }
        Command::Config => environment::config(&cli.global),
        Command::NativeWorker { .. } => unreachable!("served before dispatch"),
        Command::NativeCompile {
            source,
            kernel,
            helpers,
            out,
            arch,
        } => {
            let what = match (helpers, source, kernel) {
                (true, _, _) => native::Compile::Helpers,
                (false, Some(source), Some(kernel)) => native::Compile::Source { source, kernel },
                _ => unreachable!("clap requires a source and a kernel without --helpers"),
            };
            native::native_compile(what, &out, arch.as_deref(), &settings)
        }
    }
}

/// What a failed write to standard output means: a closed pipe (the reader
/// has what it wanted) ends the command quietly; anything else (a full disk,
/// an I/O error) fails it.
pub(crate) fn stdout_failed(e: std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return Failure {
            code: exit::OK,
            message: String::new(),
        };
    }
    Failure::internal(format!("error: cannot write to standard output: {e}"))
}

/// An error on its way out, with the exit code it maps to.
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn bad_input(message: impl Into<String>) -> Failure {
        Failure {
            code: exit::BAD_INPUT,
            message: message.into(),
        }
    }

    pub fn environment(message: impl Into<String>) -> Failure {
        Failure {
            code: exit::ENVIRONMENT,
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Failure {
        Failure {
            code: exit::INTERNAL,
            message: message.into(),
        }
    }
}

impl From<Diagnostic> for Failure {
    fn from(d: Diagnostic) -> Self {
        Failure::bad_input(d.to_string())
    }
}

impl From<Diagnostics> for Failure {
    fn from(d: Diagnostics) -> Self {
        let mut message = d.to_string();
        if d.0.len() > 1 {
            message.push_str(&format!("\n{} errors\n", d.0.len()));
        }
        Failure::bad_input(message)
    }
}

fn flags(global: &GlobalArgs) -> FlagSettings {
    FlagSettings {
        python: global.python.clone(),
        results_dir: global.results_dir.clone(),
        device_profile: global.device.clone(),
        ..Default::default()
    }
}

fn settings_error(e: Box<figment::Error>) -> Failure {
    Failure::bad_input(format!(
        "error: invalid settings: {e}\n  = help: check tunelab.toml and TUNELAB_* variables"
    ))
}
