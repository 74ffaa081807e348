//! Command-line interface (clap).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tunelab",
    version,
    about = "Tune and benchmark GPU kernels from YAML manifests",
    after_help = "Examples:\n  tunelab validate experiments/*.yaml\n  tunelab plan experiments/gptoss.yaml --only E=32,N=2880\n  tunelab run experiments/quickstart.yaml\n  tunelab config\n\nExit codes: 0 ok, 1 internal error, 2 bad input, 3 some jobs failed, 4 environment unusable, 130 interrupted."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: GlobalArgs,
}

#[derive(Debug, Args, Clone, Default)]
pub struct GlobalArgs {
    /// Settings file (default: ./tunelab.toml if present).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Python interpreter for workers [settings: python, env: TUNELAB_PYTHON].
    #[arg(long, global = true, value_name = "PATH")]
    pub python: Option<String>,
    /// Results directory [settings: results_dir, env: TUNELAB_RESULTS_DIR].
    #[arg(long, global = true, value_name = "DIR")]
    pub results_dir: Option<PathBuf>,
    /// Device profile for planning without a GPU: h100, h200, cpu [settings: device_profile].
    #[arg(long, global = true, value_name = "NAME")]
    pub device: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check manifests: syntax, keys, types, expressions, shapes, constraints.
    #[command(after_help = "Example:\n  tunelab validate experiments/*.yaml")]
    Validate {
        #[arg(required = true)]
        manifests: Vec<PathBuf>,
        #[command(flatten)]
        manifest: ManifestArgs,
    },
    /// Expand a manifest into jobs and print counts per method (or the jobs).
    #[command(after_help = "Examples:\n  tunelab plan experiments/gptoss.yaml\n  tunelab plan experiments/gptoss.yaml --only E=32,N=2880 --json\n  tunelab plan experiments/quickstart.yaml --jobs | head")]
    Plan {
        manifest: PathBuf,
        #[command(flatten)]
        manifest_args: ManifestArgs,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        /// Print every job as a JSON line instead of the summary.
        #[arg(long, conflicts_with = "json")]
        jobs: bool,
        /// Plan what interpreter mode (no GPU) would run.
        #[arg(long)]
        interpret: bool,
    },
    /// Print the manifest JSON schema.
    Schema,
    /// Print the effective settings and where each came from.
    Config,
}

#[derive(Debug, Args, Clone, Default)]
pub struct ManifestArgs {
    /// Override a manifest field: --set protocol.min_samples=50 (repeatable).
    #[arg(long = "set", value_name = "KEY.PATH=VALUE")]
    pub set: Vec<String>,
    /// Only these shapes/methods/params: --only E=32,N=2880,method=triton.
    #[arg(long, value_name = "KEY=VALUE,...")]
    pub only: Option<String>,
}
