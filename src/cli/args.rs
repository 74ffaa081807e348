//! The command line: clap definitions of every command and flag.

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
        /// Manifests to check (YAML), e.g. experiments/*.yaml.
        #[arg(required = true, value_name = "MANIFEST")]
        manifests: Vec<PathBuf>,
        #[command(flatten)]
        manifest: ManifestArgs,
    },
    /// Expand a manifest into jobs and print counts per method (or the jobs).
    #[command(
        after_help = "Examples:\n  tunelab plan experiments/gptoss.yaml\n  tunelab plan experiments/gptoss.yaml --only E=32,N=2880 --json\n  tunelab plan experiments/quickstart.yaml --jobs | head"
    )]
    Plan {
        /// The experiment's manifest (YAML), e.g. experiments/gptoss.yaml.
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
        /// Only the K-th of N balanced shares of the plan's (shape, method)
        /// groups, as `run --shard K/N` takes them.
        #[arg(long, value_name = "K/N")]
        shard: Option<crate::plan::Shard>,
    },
    /// Run an experiment: compile, check, time and record every job, then write outputs.
    #[command(
        after_help = "Examples:\n  tunelab run experiments/quickstart.yaml\n  tunelab run experiments/gptoss.yaml --only E=32,N=2880\n  tunelab run experiments/gptoss.yaml --mode bench --use-best results/gptoss/NVIDIA_H100_80GB_HBM3\n\nRunning again resumes: finished jobs are skipped."
    )]
    Run {
        /// The experiment's manifest (YAML), e.g. experiments/quickstart.yaml. Its
        /// results go to RESULTS_DIR/<experiment>/<device>/; running it again resumes there.
        manifest: PathBuf,
        #[command(flatten)]
        manifest_args: ManifestArgs,
        /// tune (search the space), bench (each method at its baseline or best config), check (correctness only).
        #[arg(long, value_enum, default_value = "tune")]
        mode: ModeArg,
        /// Re-run the best configs recorded in this results directory (plus baselines).
        #[arg(long, value_name = "RESULTS_DIR")]
        use_best: Option<PathBuf>,
        /// Run Triton's interpreter on the CPU even if a GPU is present [settings: interpret].
        #[arg(long)]
        interpret: bool,
        /// CPU compile workers (0 = the cores the lanes leave, 1 to 16) [settings: compile_workers].
        #[arg(long, value_name = "N")]
        compile_workers: Option<usize>,
        /// No progress line.
        #[arg(long)]
        quiet: bool,
        /// Write a timeline of the run (worker calls, jobs, compiles, journal
        /// writes) to FILE as Chrome trace-event JSON; open it in ui.perfetto.dev.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// Also time the configs of a consumer's tuned file (a vLLM fused-MoE
        /// JSON), as a method of its own in the same run, beside the tuned
        /// method that writes that format (repeatable).
        #[arg(long = "compare-to", value_name = "FILE")]
        compare_to: Vec<PathBuf>,
        /// The GPUs to run on, as `tunelab devices` numbers them (within
        /// CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES): one lane each. Default:
        /// every GPU visible; GPUs of different models write to their own
        /// results directories, at the same time.
        #[arg(long, value_name = "I,J,...", value_delimiter = ',')]
        gpus: Option<Vec<usize>>,
        /// At most N lanes: the first N of the GPUs chosen; in interpreter
        /// mode, N lanes of Triton's interpreter on the CPU (default 1).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        lanes: Option<u32>,
        /// Only the K-th of N balanced shares of the plan's (shape, method)
        /// groups, for running one experiment over N hosts (then `tunelab
        /// merge`). Every shard must be run with the same manifest and flags.
        #[arg(long, value_name = "K/N")]
        shard: Option<crate::plan::Shard>,
    },
    /// Compare NEW against BASE per shape: FAST / SAME / SLOW by confidence
    /// intervals, the geometric-mean speedup, the worst shapes, as markdown.
    #[command(
        after_help = "BASE and NEW are results directories or journals; BASE may also be a consumer's\nshipped file (a vLLM fused-MoE JSON) whose configs NEW's run timed (run --compare-to).\n\nExamples:\n  tunelab compare results-main/gptoss/NVIDIA_H100_80GB_HBM3 results/gptoss/NVIDIA_H100_80GB_HBM3\n  tunelab compare experiments/shipped/vllm/E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json results/gptoss/NVIDIA_H100_80GB_HBM3\n  tunelab compare OLD NEW --fail-on-slower 2%   # exit 5 when a shape is over 2 % slower"
    )]
    Compare {
        /// The base: a results directory, a journal, or a shipped tuned file.
        base: PathBuf,
        /// The new results: a results directory or a journal.
        new: PathBuf,
        /// Exit 5 when a shape is SLOW by more than this: `2%` or `0.02`.
        #[arg(long, value_name = "PERCENT")]
        fail_on_slower: Option<String>,
        /// Write the markdown here as well as to standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Regenerate every output and the report of a results directory from its journal.
    #[command(after_help = "Example:\n  tunelab report results/quickstart/NVIDIA_H100_80GB_HBM3")]
    Report {
        /// A results directory (holding journal.jsonl or journal.jsonl.gz).
        results: PathBuf,
    },
    /// Compress a results directory's journal for committing (journal.jsonl -> journal.jsonl.gz).
    #[command(
        after_help = "Example:\n  tunelab pack results/gptoss/NVIDIA_H100_80GB_HBM3\n\nEvery command reads packed journals; a run that resumes in a packed directory\nappends to a new journal.jsonl beside the packed one. Packing again merges them."
    )]
    Pack {
        /// Results directories.
        #[arg(required = true)]
        results: Vec<PathBuf>,
    },
    /// Merge results directories of one experiment into one (journals, then
    /// every output), or tuned files of one consumer format into one: vLLM
    /// fused-MoE JSON files (same E, N, device) or aiter tuned_fmoe.csv tables.
    #[command(
        long_about = "Merge tuned files of one consumer format into one: vLLM fused-MoE config files \
(.json; all of one E, N, device, dtype and block shape, keyed by M) or aiter tuned_fmoe.csv tables \
(.csv; one header, keyed by aiter's lookup key).\n\n\
Per key, where the inputs' entries differ, the faster one wins when every one of them has a \
measurement in the journal of the results directory its file lies in (the nearest ancestor \
directory holding journal.jsonl or journal.jsonl.gz); otherwise the first input's entry is kept. \
Every such conflict is listed with the times found. OUT is written atomically, in the consumer's \
exact format.\n\n\
Given results directories (each holding journal.jsonl or journal.jsonl.gz), merges their journals \
into OUT's (created if need be): one experiment, one device model; runs whose environment \
fingerprints differ are refused unless --force, naming what differs. A job recorded in several \
inputs keeps the record of the first input that has it (OUT's own first). Every output of the \
merged journal is then regenerated. Merging the same inputs again adds nothing.",
        after_help = "Examples:\n  tunelab merge --into configs/E=32,N=2880,device_name=NVIDIA_H200.json \\\n      results/a/NVIDIA_H200/vllm/E=32,N=2880,device_name=NVIDIA_H200.json \\\n      results/b/NVIDIA_H200/vllm/E=32,N=2880,device_name=NVIDIA_H200.json\n  tunelab merge --into tuned_fmoe.csv aiter/configs/tuned_fmoe.csv results/x/AMD_Instinct_MI300X/aiter/tuned_fmoe.csv\n  tunelab merge shard1/gptoss/NVIDIA_H200 shard2/gptoss/NVIDIA_H200 --into results/gptoss/NVIDIA_H200\n\nExit codes: 0 merged, 2 inputs that cannot be merged (nothing written), 1 OUT could not be written."
    )]
    Merge {
        /// The merged file (or a directory, existing or ending in /: the file
        /// keeps the inputs' name); for results directories, the results
        /// directory to merge into.
        #[arg(long, value_name = "OUT")]
        into: PathBuf,
        /// Tuned files (two or more), or results directories, in priority order
        /// (the first wins a conflict nothing measured).
        #[arg(value_name = "INPUT", required = true, num_args = 1..)]
        files: Vec<PathBuf>,
        /// Merge results directories whose environment fingerprints differ.
        #[arg(long)]
        force: bool,
    },
    /// List the GPUs tunelab can see, with the facts it uses.
    Devices {
        #[arg(long)]
        json: bool,
    },
    /// Check the Python, torch, Triton and GPU setup, and say how to fix what is missing.
    Doctor,
    /// Print the manifest JSON schema.
    Schema,
    /// Print the effective settings and where each came from.
    Config,
    /// The native worker a run starts for each GPU that runs native methods
    /// (internal: it speaks JSON lines on stdin and stdout, docs/native-backend.md).
    #[command(hide = true)]
    NativeWorker {
        /// The GPU driver API: cuda or hip.
        #[arg(long, default_value = "cuda")]
        backend: String,
    },
    /// Compile one CUDA (HIP) source with the runtime compiler a run uses and
    /// print the image's path and kernel symbol as JSON (docs/native-backend.md).
    #[command(
        hide = true,
        after_help = "Example:\n  tunelab native-compile experiments/kernels/gemm_mma.cu --kernel 'gemm_mma<128, 128, 32, 2, 2, 3, 0>' --out /tmp/k --arch sm_90"
    )]
    NativeCompile {
        /// The source file.
        source: PathBuf,
        /// The kernel, with its template arguments: `gemm_mma<128, 128, 32, 2, 2, 3, 0>`.
        #[arg(long)]
        kernel: String,
        /// Where the image goes.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The architecture (sm_90, gfx942); default: the first GPU found.
        #[arg(long)]
        arch: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    Tune,
    Bench,
    Check,
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

impl From<ModeArg> for crate::plan::RunMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Tune => crate::plan::RunMode::Tune,
            ModeArg::Bench => crate::plan::RunMode::Bench,
            ModeArg::Check => crate::plan::RunMode::Check,
        }
    }
}
