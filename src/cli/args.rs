//! The command line: clap definitions of every command and flag.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tunelab",
    version,
    about = "Tune and benchmark GPU kernels from YAML manifests",
    after_help = "Examples:\n  tunelab validate experiments/*.yaml\n  tunelab plan experiments/gptoss.yaml --only E=32,N=2880\n  tunelab run experiments/quickstart.yaml\n  tunelab config\n\nExit codes: 0 ok, 1 internal error, 2 bad input (nothing written), 3 some jobs failed (they are in the journal), 4 environment unusable, 5 `compare --fail-on-slower` found a shape slower than allowed, 130 interrupted (run again to resume)."
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
    /// Device profile to plan and validate for instead of this machine's GPU (or the interpreter): h100, h200, cpu [settings: device_profile].
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
        /// CPU compile workers (0 = the cores the lanes leave, 1 to 64) [settings: compile_workers].
        #[arg(long, value_name = "N")]
        compile_workers: Option<usize>,
        /// Run again a job that crashed or timed out in an earlier run, up to N times in all (default 1) [settings: retries].
        #[arg(long, value_name = "N")]
        retries: Option<u32>,
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
        /// After the run, keep compiled kernels' IR (ttir, ttgir, llir, ptx, cubin,
        /// sass, metadata) under the results directory's `ir/`, one folder per shape
        /// and method: of each winner (the default), or of every job (`--keep-ir=all`).
        /// An `ir` output in the manifest keeps the winners' without this flag.
        #[arg(long, value_enum, value_name = "WHICH", num_args = 0..=1, require_equals = true, default_missing_value = "winners")]
        keep_ir: Option<KeepIrArg>,
        /// The GPU to compile kept IR for (cuda:90:32, hip:gfx942:64); needed
        /// in the interpreter, which compiles nothing. Default: the run's GPU.
        #[arg(long, value_name = "TARGET")]
        ir_target: Option<String>,
    },
    /// Compare NEW against BASE per shape: FAST / SAME / SLOW / AMBIGUOUS
    /// against the run-to-run spread, the geometric-mean speedup, the worst
    /// shapes, the machines' differences, as markdown.
    #[command(
        after_help = "BASE and NEW are results directories or journals of two separate runs: verdicts are\nagainst a margin of the run-to-run spread (setting run_spread, default 5 %, docs/ab.md);\nto time both in one run, use `tunelab ab`. BASE may also be a consumer's shipped file\n(a vLLM fused-MoE JSON) whose configs NEW's run timed (run --compare-to).\n\nExamples:\n  tunelab compare results-main/gptoss/NVIDIA_H100_80GB_HBM3 results/gptoss/NVIDIA_H100_80GB_HBM3\n  tunelab compare experiments/shipped/vllm/E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json results/gptoss/NVIDIA_H100_80GB_HBM3\n  tunelab compare OLD NEW --fail-on-slower 2%   # exit 5 when a pair is SLOW by over 2 %"
    )]
    Compare {
        /// The base: a results directory, a journal, or a shipped tuned file.
        base: PathBuf,
        /// The new results: a results directory or a journal.
        new: PathBuf,
        /// Exit 5 when a shape is SLOW by more than this: `2%` or `0.02`.
        #[arg(long, value_name = "PERCENT")]
        fail_on_slower: Option<String>,
        /// How far apart separate runs of one config come out: `5%` or
        /// `0.05` [settings: run_spread, env: TUNELAB_RUN_SPREAD].
        #[arg(long, value_name = "PERCENT")]
        run_spread: Option<String>,
        /// Write the markdown here as well as to standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Time two sides' configs of each (shape, method) against each other in
    /// one run, after an A/A round that measures the run's noise: verdicts
    /// with a noise model, a report for a pull request, a gate.
    #[command(
        long_about = "Time two sides against each other in one run (docs/ab.md). For each (shape, method) of MANIFEST (after --only) that both sides have a config for, one lane per GPU prepares side A's config twice and side B's, on the same inputs, and times A against its copy in --aa-rounds rounds (how far apart identical sides come out in this run), then A against B in --rounds rounds, A B then B A and so on; a round is one batch of --batch samples a side, the sides taking turns sample by sample (--interleave samples, the default) or a batch of one side, then of the other (--interleave batches). Nothing is tuned: each side's pick is timed.\n\n\
A side is a results directory (its pick per shape and method, by the selection rule of every output), a journal, or a consumer's shipped file (a vLLM fused-MoE JSON, run in the method that writes that format, as run --compare-to does). --a-code and --b-code give a side other code: REV (every kernel module of the worker's package, python/tunelab/kernels/*.py, that differs at git revision REV) or FILE=REPLACEMENT (the module at FILE run from REPLACEMENT, a path or REV:PATH).\n\n\
Each pair's verdict: the 95 % t-interval of the mean of its rounds' log(B / A), against a margin of the larger of --threshold and how far apart its A/A rounds put A and its copy: SAME within, SLOW or FAST wholly outside, AMBIGUOUS across an edge. The run is journaled in RESULTS_DIR/<experiment>-ab/<device>/, and its report (report.md there) regenerates with tunelab report; running the same command again times only the pairs it has not recorded.",
        after_help = "Examples:\n  tunelab ab experiments/gptoss.yaml --only E=32,N=2880                     # the committed picks against themselves: the noise floor\n  tunelab ab experiments/gptoss.yaml --a results-main/gptoss/NVIDIA_H200 --b results/gptoss/NVIDIA_H200 --fail-on-slower 2%\n  tunelab ab experiments/gptoss.yaml --only E=32,N=2880 --a-code main      # main's kernels against the working tree's, same configs\n  tunelab ab experiments/gptoss.yaml --a experiments/shipped/vllm/E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json\n  tunelab ab experiments/gptoss.yaml --only E=32,N=2880 --plant-slowdown 3%   # testing knob: B made 3 % slower\n\nExit codes: 0 done, 2 bad input, 3 some pairs have no verdict, 4 environment unusable, 5 a pair is SLOW beyond --fail-on-slower, 130 interrupted."
    )]
    Ab {
        /// The experiment's manifest: its methods and shapes (--only narrows them).
        manifest: PathBuf,
        #[command(flatten)]
        manifest_args: ManifestArgs,
        /// Side A: a results directory, a journal or a shipped vLLM JSON.
        /// Default: this experiment's results directory for the device.
        #[arg(long, value_name = "SIDE")]
        a: Option<PathBuf>,
        /// Side B, as --a. Default: A's configs (with --b-code, or
        /// --plant-slowdown, what makes B differ).
        #[arg(long, value_name = "SIDE")]
        b: Option<PathBuf>,
        /// Code side A runs instead of the working tree's: REV or
        /// FILE=REPLACEMENT (repeatable).
        #[arg(long = "a-code", value_name = "CODE")]
        a_code: Vec<String>,
        /// Code side B runs instead of the working tree's, as --a-code.
        #[arg(long = "b-code", value_name = "CODE")]
        b_code: Vec<String>,
        /// Rounds of A against a copy of itself per pair, first.
        #[arg(long, value_name = "N", default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=1000))]
        aa_rounds: u32,
        /// Rounds of A against B per pair.
        #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..=1000))]
        rounds: u32,
        /// Samples of each side in a round (default: 16, or the run's protocol batch where smaller: 2 under the interpreter); under graph timing, N / graph_calls rounded up, at least 4.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..=100_000))]
        batch: Option<u32>,
        /// Rounds added, once, to a pair whose verdict after --rounds is AMBIGUOUS (0, the default: none; docs/ab.md says why).
        #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
        extra_rounds: u32,
        /// How a round times A and B: `samples` (one batch, the sides taking turns sample by sample, the default) or `batches` (a batch of one, then of the other); docs/ab.md, "Taking turns".
        #[arg(long, value_name = "HOW", default_value = "samples", value_parser = ["samples", "batches"])]
        interleave: String,
        /// The smallest change a verdict calls FAST or SLOW: `1%` (the default) or `0.01`.
        #[arg(long, value_name = "PERCENT")]
        threshold: Option<String>,
        /// Exit 5 when a pair is SLOW with B more than this slower: `2%` or `0.02`.
        #[arg(long, value_name = "PERCENT")]
        fail_on_slower: Option<String>,
        /// Testing knob: each of B's launches followed by a spin of this
        /// share of A's median (`3%`), inside the timed region: a known
        /// slowdown the A/B should find (docs/ab.md).
        #[arg(long, value_name = "PERCENT")]
        plant_slowdown: Option<String>,
        /// Run Triton's interpreter on the CPU even if a GPU is present [settings: interpret].
        #[arg(long)]
        interpret: bool,
        /// The GPUs to run on, as `tunelab devices` numbers them: one lane each, one model.
        #[arg(long, value_name = "I,J,...", value_delimiter = ',')]
        gpus: Option<Vec<usize>>,
        /// At most N lanes (interpreter: N CPU lanes, default 1).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        lanes: Option<u32>,
        /// CPU compile workers (0 = the cores the lanes leave) [settings: compile_workers].
        #[arg(long, value_name = "N")]
        compile_workers: Option<usize>,
        /// No line per pair.
        #[arg(long)]
        quiet: bool,
        /// Write a timeline of the A/B (worker calls, pairs, compiles, journal
        /// writes) to FILE as Chrome trace-event JSON; open it in ui.perfetto.dev.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
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
    /// Apply passes of Triton's own pipeline to an IR file (.ttir, .ttgir) and
    /// write the new IR and a diff.
    #[command(
        name = "ir-pass",
        long_about = "Apply passes of Triton's own pipeline to an IR file (.ttir or .ttgir, e.g. one `run --keep-ir` wrote) and write the new IR (FILE.after.EXT, or --out) and a diff of the two modules without locations (OUT.diff).

The passes, their order and their arguments are read from Triton: its backend's stage functions are run with recording stand-ins at the file's target and options, so `--list` shows exactly the pipeline Triton runs from the file's stage, and `--pass NAME` applies a pass with the arguments Triton gives it there (`NAME#2` for its second occurrence). A pass outside the pipeline is looked up among Triton's bindings and takes its arguments written out: `--pass 'ttgpuir.pipeline(4, false)'`. Needs no GPU.",
        after_help = "Examples:
  tunelab ir-pass results/x/NVIDIA_H100_80GB_HBM3/ir/M=64,N=2880,K=4096,dtype=bf16/triton/matmul_kernel.ttgir --list
  tunelab ir-pass kernel.ttgir --pass remove_layout_conversions --pass reorder_instructions --compile
  tunelab ir-pass kernel.ttir --pass convert_to_ttgpuir --pass coalesce --option num_warps=8 --out coalesced.ttgir

Exit codes: 0 written, 2 a file or pass that cannot be used, 4 no Python with Triton."
    )]
    IrPass {
        /// The IR file: .ttir or .ttgir.
        file: PathBuf,
        /// A pass to apply, in order (repeatable): NAME, NAME#N or NAME(ARGS).
        #[arg(long = "pass", value_name = "NAME")]
        passes: Vec<String>,
        /// Print the pipeline Triton runs from this file's stage, with each pass's arguments.
        #[arg(long)]
        list: bool,
        /// BACKEND:ARCH:WARP_SIZE (default: the module's ttg.target, else cuda:90:32).
        #[arg(long, value_name = "TARGET")]
        target: Option<String>,
        /// A compile option the pipeline depends on (num_stages=4, maxnreg=128), repeatable.
        #[arg(long = "option", value_name = "KEY=VALUE")]
        options: Vec<String>,
        /// Where to write the new IR (default: FILE.after.EXT beside FILE).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Also compile FILE and the result for the target and print each one's
        /// registers, spills and shared memory.
        #[arg(long)]
        compile: bool,
    },
    /// Re-run a results directory's winners under Proton (and Nsight Compute
    /// when `ncu` is on PATH); write the profiles and a summary beside the results.
    #[command(
        long_about = "Re-run a results directory's winners under Proton, Triton's profiler: each job checked again, warmed up, then launched --calls times inside a Proton scope named shape/method with its flops and bytes, one child per kernel launch with its GPU time. When `ncu` (Nsight Compute) is on PATH, each job is also launched once under it (speed of light, launch statistics, occupancy, memory workload). Writes DIR/profile/: proton.hatchet, ncu/*.ncu-rep, summary.json and summary.md (per job: GPU time per call against the journal's median, achieved bytes/s and FLOP/s, each kernel's share and, from ncu, its duration, throughput and occupancy). The report links summary.md.

Needs a GPU (the one the results were measured on) and the worker's Python.",
        after_help = "Examples:
  tunelab profile results/gptoss/NVIDIA_H100_80GB_HBM3
  tunelab profile results/gptoss/NVIDIA_H100_80GB_HBM3 --top 3 --only M=1
  tunelab profile results/edits/NVIDIA_H100_80GB_HBM3 --manifest experiments/edits.yaml   # ir: methods

Exit codes: 0 written, 2 no journal or nothing to profile, 3 some jobs could not be profiled, 4 no GPU or no Proton."
    )]
    Profile {
        /// A results directory (holding journal.jsonl or journal.jsonl.gz).
        results: PathBuf,
        /// Profile the K fastest timed jobs of every shape and method (default 1: the winners).
        #[arg(long, value_name = "K", default_value_t = 1)]
        top: usize,
        /// Launches of each job inside its Proton scope.
        #[arg(long, value_name = "N", default_value_t = 20)]
        calls: u32,
        /// Only the jobs of these shapes/methods: --only M=1,method=triton.
        #[arg(long, value_name = "KEY=VALUE,...")]
        only: Option<String>,
        /// The manifest the results came from: its `ir:` methods run from their IR files.
        #[arg(long, value_name = "MANIFEST")]
        manifest: Option<PathBuf>,
        /// Skip Nsight Compute even when `ncu` is on PATH.
        #[arg(long)]
        no_ncu: bool,
    },
    /// List the GPUs tunelab can see, with the facts it uses.
    Devices {
        #[arg(long)]
        json: bool,
    },
    /// Check the Python, torch, Triton and GPU setup, and say how to fix what is missing.
    Doctor,
    /// Print the manifest JSON schema (or, with --worker-protocol, the worker protocol's).
    Schema {
        /// The JSON schema of the worker protocol's messages instead
        /// (schemas/worker-protocol.schema.json).
        #[arg(long)]
        worker_protocol: bool,
    },
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
        after_help = "Example:\n  tunelab native-compile experiments/kernels/gemm_mma.cu --kernel 'gemm_mma<128, 128, 32, 2, 2, 3, 0>' --out /tmp/k --arch sm_90\n  tunelab native-compile --helpers --out /tmp/k"
    )]
    NativeCompile {
        /// The source file.
        #[arg(required_unless_present = "helpers")]
        source: Option<PathBuf>,
        /// The kernel, with its template arguments: `gemm_mma<128, 128, 32, 2, 2, 3, 0>`.
        #[arg(long, required_unless_present = "helpers")]
        kernel: Option<String>,
        /// Compile tunelab's own helper kernels (the spin, the L2 flush, the
        /// comparison) as a run compiles them for its native workers.
        #[arg(long, conflicts_with_all = ["source", "kernel"])]
        helpers: bool,
        /// Where the image goes.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The architecture (sm_90, gfx942); default: the first GPU found.
        #[arg(long)]
        arch: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeepIrArg {
    /// The best job of each shape and Triton method.
    Winners,
    /// Every job that compiled and passed its check.
    All,
}

impl From<KeepIrArg> for crate::workbench::Which {
    fn from(k: KeepIrArg) -> Self {
        match k {
            KeepIrArg::Winners => crate::workbench::Which::Winners,
            KeepIrArg::All => crate::workbench::Which::All,
        }
    }
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
    /// Let the manifest read files in this folder too (repeatable). Without
    /// it, what a manifest names (`include`, `extends`, `csv`, `source`,
    /// `ir`, `python_path`) must be in the repository that holds it.
    #[arg(long = "allow-read", value_name = "DIR")]
    pub allow_read: Vec<std::path::PathBuf>,
    /// The folders `allow_read` in a settings file allows, and that file:
    /// not for a manifest of the repository the file lies in.
    #[arg(skip)]
    pub allowed_by_file: Option<(std::path::PathBuf, Vec<std::path::PathBuf>)>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn help_lists_every_exit_code() {
        let help = Cli::command().render_long_help().to_string();
        let listed = help
            .split("Exit codes:")
            .nth(1)
            .expect("--help has an exit-code line");
        for code in crate::exit::ALL {
            assert!(
                listed.contains(&format!(" {code} ")),
                "exit code {code} is missing from --help: {listed}"
            );
        }
    }
}
