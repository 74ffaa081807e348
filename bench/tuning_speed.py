#!/usr/bin/env python3
"""Tuning speed: triton.autotune vs tunelab (grid, successive halving; Python and native launches), one GPU.

Every contender searches the same 48 configs of tunelab's Triton matmul
(python/tunelab/kernels/matmul.py) for one bf16 4096^3 GEMM, each from a cold
Triton cache. The config list comes from `tunelab plan --jobs
experiments/bench-gemm.yaml`, so triton.autotune gets exactly the points
tunelab runs. For each contender the script records wall time, mean GPU
utilisation, the winning config and its time; then it re-times every winner
in one process with one timer (so "gap to grid winner" compares like with
like) and measures the host cost of one launch through Triton's JIT dispatch,
through the compiled kernel's launcher and through torch.matmul.

Contenders: `autotune` (triton.autotune), `grid` and `halving` (`tunelab run`
with that search strategy; the Python worker launches and times each
kernel), `native-grid` and `native-halving` (the same runs with
`--set methods.triton.launch=native`: the Python compile pool compiles as
before, tunelab's native worker (Rust, cudarc) launches and times the cubins,
docs/native-backend.md; the manifest file is not changed or copied), and
`native-inputs-grid` / `native-inputs-halving` (also `--set inputs=native`:
the native worker builds the inputs and the reference itself, so the lane's
Python worker never imports torch; docs/native-backend.md, "Inputs built
natively"), and `native-inputs-raced-grid` (also `--set protocol.race=0.05`:
racing, docs/manifest.md's protocol table).

What the native contenders need at run time, all of it found by tunelab
itself (nothing to pass, no build feature: the default `cargo build
--release` / `just gpu-bin` binary has the CUDA native worker):
- the native worker is the tunelab binary itself (`tunelab native-worker`);
  `TUNELAB_NATIVE_WORKER` overrides it (for the Python package's entry point);
- NVRTC, to compile tunelab's helper kernels (spin, L2 flush): `TUNELAB_NVRTC`,
  else the pip wheel in the workers' Python (torch installs it:
  site-packages/nvidia/cu13/lib/libnvrtc.so.13), else the CUDA toolkit;
- libcuda from the driver, and the GPU that the lane's Python worker uses.
Where it cannot start, tunelab quietly launches the Triton method from Python
instead: the script therefore checks in each native run's trace that the
native worker checked every job, and fails that contender otherwise.

    TUNELAB_PYTHON=/path/to/python /path/to/python bench/tuning_speed.py [--tunelab PATH] [--contenders LIST]
    python3 bench/tuning_speed.py --dry-run     # no GPU needed: checks and prints the plan

Writes results/bench/<device>/tuning_speed.md and tuning_speed.json and prints
the markdown. Exit codes: 0 done, 1 a contender failed (what finished is still
written), 2 bad input or no GPU.

The parent process never imports torch or Triton: every GPU step runs in a
child process (this file with --child) with its own fresh TRITON_CACHE_DIR, set
before Triton is imported, so no contender inherits another's compiled kernels.
"""

import argparse
import ctypes
import datetime
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trace_breakdown  # noqa: E402  (bench/, next to this file)

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "experiments" / "bench-gemm.yaml"
# tunelab's helper kernels, which a native lane compiles with NVRTC before its first launch.
HELPERS_SOURCE = REPO / "src" / "native" / "helpers.cu"
EXPECTED_CONFIGS = 48
HOPPER_SMEM_BYTES = 227 * 1024  # the per-block opt-in maximum on H100/H200
CONTENDERS = ("autotune", "grid", "halving", "native-grid", "native-halving", "native-inputs-grid",
              "native-inputs-halving", "native-inputs-raced-grid")
# Contenders launched natively (every name after the first three), and those whose inputs are built natively too.
NATIVE_CONTENDERS = CONTENDERS[3:]
NATIVE_INPUTS_PREFIX = "native-inputs-"
NATIVE_INPUTS_OVERRIDE = "inputs=native"
# A contender named native-<strategy> is that strategy with the Triton method launched natively.
NATIVE_PREFIX = "native-"
NATIVE_OVERRIDE = "methods.triton.launch=native"
# A contender with -raced- in its name also races (protocol.race, docs/manifest.md): a config clearly slower than the best
# so far stops sampling at min_samples.
RACED_INFIX = "-raced-"
RACE_OVERRIDE = "protocol.race=0.05"
LABELS = {"autotune": "triton.autotune", "grid": "tunelab grid", "halving": "tunelab halving",
          "native-grid": "tunelab grid, native launches", "native-halving": "tunelab halving, native launches",
          "native-inputs-grid": "tunelab grid, native launches and inputs",
          "native-inputs-halving": "tunelab halving, native launches and inputs",
          "native-inputs-raced-grid": "tunelab grid, native launches and inputs, racing"}
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")

# Host launch cost: launches queued back to back without a sync. A small
# problem keeps each kernel shorter than its host launch cost, so the GPU never
# falls behind; at 4096^3 (~190 us a kernel) the launch queue would fill and
# the loop would measure GPU time instead. Same dtype and 16-divisible sizes,
# so Triton picks the same specialisation as for 4096^3.
LAUNCH_COST_SIZE = 256
LAUNCH_COST_N = 1000
LAUNCH_COST_REPEATS = 5

# A step that runs longer than this has hung (the whole benchmark takes a few minutes).
STEP_TIMEOUT_S = 900

GOALS = [
    "tunelab grid is at least 8x faster than triton.autotune, with the same winner or one within 1 %",
    "GPU busy at least 80 % of tunelab's wall time",
    "successive halving's winner within 2 % of the exhaustive (grid) best",
    "runner overhead per job (scheduling, protocol, journal) under 1 ms",
    "the whole tunelab process with native launches is at least 8x faster than triton.autotune, "
    "with the same winner or one within 1 %",
    "runner overhead per job on the native path <= 0.2 ms",
]


class BenchError(Exception):
    """A failure to report as a message with an exit code, not a traceback."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------
# Command line, the tunelab binary, the config space (no GPU needed)
# ---------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tunelab", type=Path, help="tunelab binary (default: .bin/tunelab, else target/release/tunelab)")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated subset of {','.join(CONTENDERS)}")
    p.add_argument("--out-dir", type=Path, default=REPO / "results" / "bench", help="outputs go to OUT_DIR/<device>/")
    p.add_argument("--keep-work", action="store_true", help="keep the temporary caches and tunelab results")
    p.add_argument("--dry-run", action="store_true", help="check arguments, binary and space; print the plan; no GPU")
    # Internal: run one GPU step in a fresh process (see run_child).
    p.add_argument("--child", choices=("env", "autotune", "verify"), help=argparse.SUPPRESS)
    p.add_argument("--child-spec", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CONTENDERS]
    if unknown or not chosen:
        p.error(f"--contenders: unknown {unknown}; choose from {', '.join(CONTENDERS)}")
    args.contenders = [c for c in CONTENDERS if c in chosen]  # fixed order: autotune first
    return args


def find_tunelab(explicit):
    """The binary to run: --tunelab, else the prebuilt .bin/tunelab, else the cargo build."""
    candidates = [explicit] if explicit else [REPO / ".bin" / "tunelab", REPO / "target" / "release" / "tunelab"]
    for path in candidates:
        path = Path(path)
        if not path.is_absolute():
            path = Path.cwd() / path
        if path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise BenchError(f"no tunelab binary (tried {tried}); build it with `cargo build --release` or pass --tunelab PATH", 2)


def worker_python():
    """The Python that runs tunelab's workers; the autotune child uses the same one, for the same torch and Triton."""
    return os.environ.get("TUNELAB_PYTHON") or sys.executable


def config_key(config):
    """A config as a hashable tuple of its six tunables (other keys ignored)."""
    return tuple(int(config[k]) for k in CONFIG_KEYS)


def config_label(config):
    c = {k: int(config[k]) for k in CONFIG_KEYS}
    return (f"{c['BLOCK_SIZE_M']}x{c['BLOCK_SIZE_N']}x{c['BLOCK_SIZE_K']} "
            f"g{c['GROUP_SIZE_M']} w{c['num_warps']} s{c['num_stages']}")


def is_native(name):
    return name.startswith(NATIVE_PREFIX)


def has_native_inputs(name):
    return name.startswith(NATIVE_INPUTS_PREFIX)


def is_raced(name):
    return RACED_INFIX in name


def strategy_of(name):
    """The search strategy of a tunelab contender: grid for grid, native-grid and native-inputs-grid."""
    return name.rsplit("-", 1)[-1]


def plan_jobs(tunelab, overrides=(), device=None):
    cmd = [str(tunelab), "plan", str(MANIFEST), "--jobs"]
    if device:
        cmd += ["--device", device]
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"`{shlex.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr.strip()}", 2)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def plan_configs(tunelab, native=False, device=None):
    """The shape and the configs tunelab will run, from `tunelab plan --jobs`.

    Taking the list from tunelab itself (rather than re-reading the YAML) is
    what makes triton.autotune search exactly the same points. With `native`,
    the manifest with the native override must plan the very same jobs (the
    override is accepted, and changes how they are launched, not which).
    `device`: a device profile to plan for (a dry run on a machine without a
    GPU, where `tunelab plan` would show the interpreter's plan); None plans
    for the GPU found.
    """
    jobs = plan_jobs(tunelab, device=device)
    if native:
        native_jobs = plan_jobs(tunelab, [NATIVE_OVERRIDE], device=device)
        if [(j["shape"], j["config"]) for j in native_jobs] != [(j["shape"], j["config"]) for j in jobs]:
            raise BenchError(f"`--set {NATIVE_OVERRIDE}` plans other jobs than {MANIFEST.name}", 2)
    shapes = {json.dumps(j["shape"], sort_keys=True) for j in jobs}
    if len(shapes) != 1:
        raise BenchError(f"{MANIFEST.name} must have exactly one shape, has {len(shapes)}", 2)
    configs = [{k: int(j["config"][k]) for k in CONFIG_KEYS} for j in jobs]
    check_space(configs)
    return jobs[0]["shape"], configs


def smem_bytes(config):
    """Shared memory for the bf16 A and B tiles of every pipeline stage."""
    return (config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"]) * config["BLOCK_SIZE_K"] * 2 * config["num_stages"]


def check_space(configs):
    if len(configs) != EXPECTED_CONFIGS:
        raise BenchError(f"{MANIFEST.name} plans {len(configs)} configs, expected {EXPECTED_CONFIGS}", 2)
    if len({config_key(c) for c in configs}) != len(configs):
        raise BenchError(f"{MANIFEST.name} plans duplicate configs", 2)
    too_big = [config_label(c) for c in configs if smem_bytes(c) > HOPPER_SMEM_BYTES]
    if too_big:
        raise BenchError(f"configs over Hopper's {HOPPER_SMEM_BYTES} B of shared memory: {too_big}", 2)


# ---------------------------------------------------------------------------
# GPU utilisation sampling
# ---------------------------------------------------------------------------


class Nvml:
    """The few NVML calls needed, through ctypes: libnvidia-ml ships with the driver, pynvml may not be installed."""

    class _Utilization(ctypes.Structure):
        _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

    def __init__(self, gpu):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._ok(self.lib.nvmlInit_v2())
        self.handle = ctypes.c_void_p()
        if str(gpu).startswith("GPU-"):
            self._ok(self.lib.nvmlDeviceGetHandleByUUID(str(gpu).encode(), ctypes.byref(self.handle)))
        else:
            self._ok(self.lib.nvmlDeviceGetHandleByIndex_v2(int(gpu), ctypes.byref(self.handle)))

    @staticmethod
    def _ok(rc):
        if rc != 0:
            raise OSError(f"NVML error {rc}")

    def utilization(self):
        u = self._Utilization()
        self._ok(self.lib.nvmlDeviceGetUtilizationRates(self.handle, ctypes.byref(u)))
        return u.gpu

    def driver_version(self):
        buf = ctypes.create_string_buffer(96)
        self._ok(self.lib.nvmlSystemGetDriverVersion(buf, 96))
        return buf.value.decode()


def nvidia_smi_query(gpu, field):
    out = subprocess.run(["nvidia-smi", "-i", str(gpu), f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip().splitlines()[0].strip()


def utilization_reader(gpu):
    """A function returning the GPU's utilisation in percent, and the name of its source.

    `gpu` is the UUID torch reported (exact) or an index; index 0 is the fallback,
    the GPU the benchmark pins every process to.
    """
    for candidate in dict.fromkeys((str(gpu), "0")):
        try:
            nvml = Nvml(candidate)
            nvml.utilization()
            return nvml.utilization, "NVML"
        except (OSError, AttributeError):
            pass
    if shutil.which("nvidia-smi"):
        return (lambda: float(nvidia_smi_query(gpu, "utilization.gpu"))), "nvidia-smi"
    return None, None


class UtilSampler:
    """Mean GPU utilisation over a `with` block, sampled every ~50 ms in a thread.

    NVML's figure is the share of its own sample period (1/6 s to 1 s) in which
    any kernel ran, so it says the GPU was busy, not how well it was used; the
    tunelab rows add the timed-kernel fraction for that.
    """

    def __init__(self, gpu, interval_s=0.05):
        self.read, self.source = utilization_reader(gpu)
        self.interval_s = interval_s
        self.samples = []
        self._stop = threading.Event()
        self._thread = None

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.samples.append(float(self.read()))
            except Exception:  # a missed sample is not worth failing the benchmark for
                pass
            self._stop.wait(self.interval_s)

    def __enter__(self):
        if self.read:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join()

    def result(self):
        if not self.samples:
            return {"mean": None, "samples": 0, "source": self.source}
        return {"mean": statistics.fmean(self.samples) / 100.0, "samples": len(self.samples), "source": self.source}


# ---------------------------------------------------------------------------
# Child processes (run with --child; import torch and Triton)
# ---------------------------------------------------------------------------


def child_main(args):
    spec = json.loads(args.child_spec.read_text()) if args.child_spec else {}
    result = {"env": child_env, "autotune": child_autotune, "verify": child_verify}[args.child](spec)
    args.child_out.write_text(json.dumps(result, indent=1))
    return 0


def child_env(spec):
    """Facts about the GPU and software; exit 2 when there is no CUDA GPU."""
    import torch
    import triton

    if not torch.cuda.is_available():
        print("tuning_speed: no CUDA GPU visible to torch; this benchmark needs one (try --dry-run)", file=sys.stderr)
        sys.exit(2)
    props = torch.cuda.get_device_properties(0)
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid and not uuid.startswith("GPU-"):
        uuid = "GPU-" + uuid  # NVML and nvidia-smi spell it with the prefix
    return {
        "gpu": torch.cuda.get_device_name(0),
        "uuid": uuid or None,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


def kernel_args(a, b, c):
    """matmul_kernel's runtime arguments, as tunelab's make_launcher passes them."""
    M, K = a.shape
    N = b.shape[1]
    return (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))


def gemm_operands(shape, seed=0):
    """Inputs and an output buffer from tunelab's own gemm problem, so the data matches tunelab's jobs."""
    from tunelab.problems.gemm import Gemm

    problem = Gemm(shape)
    inputs = problem.inputs(seed, "cuda")
    return problem, inputs["a"], inputs["b"], problem.new_output(inputs)


def median_ms(fn):
    """Median time of fn in ms, with triton.testing.do_bench (L2 flushed before each run)."""
    from triton.testing import do_bench

    return float(do_bench(fn, return_mode="median"))


def check_output(problem, a, b, c):
    """The same correctness test tunelab's workers apply, so a wrong winner cannot pass unnoticed."""
    from tunelab.compare import compare

    ref = problem.reference({"a": a, "b": b})
    return compare(c, ref, atol=1e-2, rtol=1e-2, max_mismatch=0.001)


def child_autotune(spec):
    """triton.autotune over the 48 configs: time the first (tuning) call from a cold cache, then the winner."""
    import torch
    import triton
    from tunelab.kernels import matmul

    problem, a, b, c = gemm_operands(spec["shape"])
    M, N = c.shape
    configs = []
    for cfg in spec["configs"]:
        constexprs, options = matmul.split_config(cfg)
        configs.append(triton.Config(constexprs, num_warps=options["num_warps"], num_stages=options["num_stages"]))
    # Wrap tunelab's kernel rather than copying it: the same JIT function, tuned by Triton.
    tuned = triton.autotune(configs=configs, key=["M", "N", "K"])(matmul.matmul_kernel)

    def launch_grid(meta):
        return matmul.grid(M, N, meta)

    args = kernel_args(a, b, c)
    torch.cuda.synchronize()
    with UtilSampler(spec["gpu"]) as util:
        start = time.perf_counter()
        tuned[launch_grid](*args)  # compiles and benchmarks all 48 configs, then launches the best
        torch.cuda.synchronize()
        wall_s = time.perf_counter() - start

    best = tuned.best_config
    winner = {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}
    timings = getattr(tuned, "configs_timings", {}) or {}
    failed = sum(1 for t in timings.values() if not math.isfinite(_first(t)))  # inf: did not compile or fit
    check = check_output(problem, a, b, c)  # c holds the winner's output from the tuning call
    launcher = matmul.make_launcher(a, b, c, winner)
    return {
        "wall_s": wall_s,
        "bench_time_s": getattr(tuned, "bench_time", None),
        "util": util.result(),
        "winner": {k: int(winner[k]) for k in CONFIG_KEYS},
        "winner_us": median_ms(launcher) * 1e3,
        "winner_us_autotuner": _first(timings[best]) * 1e3 if best in timings else None,
        # None: this Triton version does not expose the per-config timings.
        "configs_timed": len(timings) - failed if timings else None,
        "configs_failed": failed,
        "check": {k: check[k] for k in ("passed", "max_abs_err", "mismatch_frac")},
    }


def _first(t):
    """Autotuner timings are a list of quantiles (median first) or one number, by Triton version."""
    return float(t[0] if isinstance(t, (list, tuple)) else t)


def child_verify(spec):
    """Re-time every contender's winner with one timer, then the host cost of a launch."""
    import torch
    from tunelab.kernels import matmul

    _, a, b, c = gemm_operands(spec["shape"])
    winners = [dict(w) for w in spec["winners"]]
    launchers = [matmul.make_launcher(a, b, c, w) for w in winners]
    for launch in launchers:  # compile and warm up outside the timed rounds
        launch()
    torch.cuda.synchronize()
    # Interleaved rounds: slow drift (clocks, temperature) hits every winner alike.
    rounds = [[median_ms(launch) * 1e3 for launch in launchers] for _ in range(5)]
    retimed = [{"config": w, "us": statistics.median(r[i] for r in rounds), "rounds_us": [r[i] for r in rounds]}
               for i, w in enumerate(winners)]
    return {"retimed": retimed, "launch_cost": launch_cost(spec["launch_config"])}


def host_us_per_launch(launch, sync):
    """Median over repeats of host µs per launch, N launches back to back, no sync inside the loop.

    Also the launched kernel's own GPU time (do_bench): the loop measured the
    host, as intended, only while that is below the host figure; otherwise the
    GPU fell behind and the queue may have slowed the host down.
    """
    for _ in range(100):  # warm-up: first-launch work, caches, clocks
        launch()
    sync()
    host = []
    for _ in range(LAUNCH_COST_REPEATS):
        start = time.perf_counter()
        for _ in range(LAUNCH_COST_N):
            launch()
        host.append((time.perf_counter() - start) / LAUNCH_COST_N * 1e6)
        sync()
    return {"host_us": statistics.median(host), "kernel_us": median_ms(launch) * 1e3}


def launch_cost(config):
    """Host µs per launch of the winning config: (a) JIT dispatch, (b) compiled launcher, (c) torch.matmul."""
    import torch
    from tunelab.kernels import matmul

    size = LAUNCH_COST_SIZE
    _, a, b, c = gemm_operands({"M": size, "N": size, "K": size, "dtype": "bf16"})
    constexprs, options = matmul.split_config(config)
    grid = matmul.grid(size, size, constexprs)
    args = kernel_args(a, b, c)
    sync = torch.cuda.synchronize
    out = {"size": size, "n": LAUNCH_COST_N, "repeats": LAUNCH_COST_REPEATS, "config": config}

    # (a) what kernel[grid](...) costs: bind args, compute the specialisation key, look up the cache, launch.
    compiled = matmul.matmul_kernel[grid](*args, **constexprs, **options)
    sync()
    reference_out = c.clone()
    out["jit"] = host_us_per_launch(lambda: matmul.matmul_kernel[grid](*args, **constexprs, **options), sync)

    # (b) the CompiledKernel that launch returned, launched directly: no binding, no cache lookup.
    out["compiled"] = compiled_launch_cost(compiled, grid, args, constexprs, c, reference_out, sync)

    # (c) torch.matmul (cuBLAS) into the same preallocated output, for reference.
    out["torch"] = host_us_per_launch(lambda: torch.matmul(a, b, out=c), sync)
    return out


def compiled_launch_cost(compiled, grid, args, constexprs, c, reference_out, sync):
    """Launch the CompiledKernel through compiled[grid](...), if this Triton version allows it.

    Newer Triton's launchers take every kernel argument, constexprs included
    (ignored); older ones only the runtime arguments. Try both; a wrong arity is
    rejected by the launcher before anything reaches the GPU. The output is
    compared with the JIT path's, so a form that launches but computes
    something else is not reported as working.
    """
    if not hasattr(compiled, "__getitem__"):
        return {"reachable": False, "why": f"{type(compiled).__name__} has no [grid] launcher in this Triton version"}
    grid3 = tuple(grid) + (1,) * (3 - len(grid))
    forms = {"all arguments": args + tuple(constexprs.values()), "runtime arguments": args}
    errors = []
    for form, form_args in forms.items():
        try:
            runner = compiled[grid3]
            c.zero_()
            runner(*form_args)
            sync()
        except Exception as e:  # each form is an attempt; the errors are reported if none works
            errors.append(f"{form}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        if not bool((c == reference_out).all()):
            errors.append(f"{form}: launched but the output differs from the JIT launch's")
            continue
        result = host_us_per_launch(lambda: runner(*form_args), sync)
        return {"reachable": True, "form": form, **result}
    return {"reachable": False, "why": "; ".join(errors)}


# ---------------------------------------------------------------------------
# Parent: running the contenders
# ---------------------------------------------------------------------------


def child_env_vars(cache_dir):
    """Environment for every GPU process: a fresh Triton cache, tunelab's package, one GPU.

    The benchmark is about one GPU. tunelab runs one lane per visible GPU and
    points each lane at CUDA_VISIBLE_DEVICES=<index among the visible ones>, so
    only GPU 0 is a choice that means the same GPU to every process; PCI bus
    order makes CUDA's index 0 NVML's too.
    """
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "python"), env.get("PYTHONPATH")) if p)
    env["CUDA_VISIBLE_DEVICES"] = "0"
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def run_child(kind, spec, work):
    """Run this file with --child KIND in a fresh process and cache; return what it wrote, and its wall time."""
    cache = Path(tempfile.mkdtemp(prefix=f"triton-cache-{kind}-", dir=work))
    spec_path, out_path = work / f"{kind}.spec.json", work / f"{kind}.out.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [worker_python(), str(Path(__file__).resolve()), "--child", kind,
           "--child-spec", str(spec_path), "--child-out", str(out_path)]
    start = time.perf_counter()
    try:
        # The child's stdout goes to our stderr: our stdout carries only the final markdown.
        proc = subprocess.run(cmd, cwd=REPO, env=child_env_vars(cache), stdout=sys.stderr, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BenchError(f"the {kind} step ran past {STEP_TIMEOUT_S} s and was stopped") from None
    wall_s = time.perf_counter() - start
    if kind == "env" and proc.returncode != 0:
        # Without a GPU (2), or without torch/Triton in this Python: nothing can run.
        what = "no usable CUDA GPU" if proc.returncode == 2 else f"{worker_python()} cannot run torch and Triton"
        raise BenchError(f"{what} (see the message above); nothing was run", 2)
    if proc.returncode != 0 or not out_path.exists():
        raise BenchError(f"the {kind} step failed (exit {proc.returncode}); its output is above")
    result = json.loads(out_path.read_text())
    result["process_s"] = wall_s
    return result


def tunelab_command(tunelab, name, results_dir):
    """`tunelab run` for contender `name`: grid, halving or one of NATIVE_CONTENDERS."""
    cmd = [str(tunelab), "run", str(MANIFEST.relative_to(REPO)), "--results-dir", str(results_dir), "--quiet",
           "--python", worker_python(), "--trace", str(results_dir / "trace.json")]
    strategy = strategy_of(name)
    if strategy != "grid":
        cmd += ["--set", f"search.strategy={strategy}"]
    if is_native(name):
        cmd += ["--set", NATIVE_OVERRIDE]
    if has_native_inputs(name):
        cmd += ["--set", NATIVE_INPUTS_OVERRIDE]
    if is_raced(name):
        cmd += ["--set", RACE_OVERRIDE]
    return cmd


def run_tunelab(tunelab, name, work, gpu):
    """`tunelab run` in a fresh results directory (so a fresh Triton cache under its .cache); wall time around it."""
    results_dir = work / f"tunelab-{name}"
    cmd = tunelab_command(tunelab, name, results_dir)
    print(f"tuning_speed: {name}: {shlex.join(cmd)}", file=sys.stderr)
    env = child_env_vars(Path(tempfile.mkdtemp(prefix=f"triton-cache-{name}-", dir=work)))
    with UtilSampler(gpu) as util:
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BenchError(f"tunelab {name} ran past {STEP_TIMEOUT_S} s and was stopped") from None
        wall_s = time.perf_counter() - start
    log = (proc.stdout + proc.stderr).strip()
    # 3: the run finished but some configs failed; they are in the journal and counted below.
    if proc.returncode not in (0, 3):
        raise BenchError(f"tunelab {name} failed (exit {proc.returncode}; worker logs in {results_dir}, "
                         f"kept with --keep-work):\n{log[-3000:]}")
    journal = find_journal(results_dir)
    summary = summarize_journal(journal)
    trace_path = results_dir / "trace.json"
    if trace_path.exists():
        summary.update(overhead_from_trace(trace_breakdown.breakdown(trace_path)))
        summary["trace"] = str(trace_path)
    if is_native(name):
        check_native_ran(name, summary.get("breakdown"), log, results_dir)
    summary.update({
        "command": shlex.join(cmd),
        "exit_code": proc.returncode,
        "wall_s": wall_s,
        "util": util.result(),
        "timed_kernel_fraction": summary["gpu_ms_jobs"] / 1e3 / wall_s,
        "timed_kernel_fraction_with_finals": (summary["gpu_ms_jobs"] + summary["gpu_ms_finals"]) / 1e3 / wall_s,
        "tunelab_log_tail": log.splitlines()[-3:],
        "journal": str(journal),
    })
    return summary


def overhead_from_trace(b):
    """The trace's breakdown, and runner overhead per job: bench/trace_breakdown.py's plus the journal append.

    trace_breakdown counts, per job of the lane: lane time inside groups that is
    in no worker call (Python's or the native worker's), no wait for a compile and
    no native worker start-up; plus round trip minus worker time of every call but
    hello and shutdown, on both workers (for a check sent ahead, the native
    worker's own wait before it, as the request was queued in its pipe):
    `lane_overhead_ms_per_job`, what the native goal counts. The journal's
    append (fsync) runs on the writer thread, off the lane's path;
    `overhead_ms_per_job` adds its mean (the goal "under 1 ms" counts it), and
    `overhead_parts_ms` names each part. `gpu_waited_ms_per_job`: the time the
    worker that times sat idle while a compiled job was ready for it (traces
    from runners since 2026-11-24), what the GPU waited for the runner: a
    different measure from the lane's (it counts the worker's own waits for a
    core, and leaves out lane work done while the worker was busy).
    """
    lane_ms = trace_breakdown.overhead_per_job_ms(b)
    out = {"breakdown": b, "breakdown_text": trace_breakdown.render(b),
           # On the lane's path: between calls + protocol (trace_breakdown's figure).
           "lane_overhead_ms_per_job": lane_ms,
           # What the GPU waited for the runner (None for older traces).
           "gpu_waited_ms_per_job": trace_breakdown.gpu_waited_ms_per_job(b),
           # With the journal append: what the goal "under 1 ms" counts.
           "overhead_ms_per_job": lane_ms, "overhead_parts_ms": None}
    lane = next(iter(b["lanes"].values()), None)
    if out["overhead_ms_per_job"] is not None:
        journal_ms = b["journal"]["ms_mean"] if b["journal"] else 0.0
        out["overhead_ms_per_job"] += journal_ms
        nat = lane.get("native") or {}
        python_ms = (lane.get("python_protocol_us_per_call") or 0.0) * (lane.get("python_calls_per_job") or 0.0) / 1e3
        native_ms = (nat.get("protocol_us_per_call") or 0.0) * (nat.get("calls_per_job") or 0.0) / 1e3
        out["overhead_parts_ms"] = {"between_calls": lane["runner_ms_per_job"], "protocol_python": python_ms,
                                    "protocol_native": native_ms, "journal": journal_ms}
    return out


def check_native_ran(name, breakdown, log, results_dir):
    """A native contender must have had every job checked (so launched and timed) by the native worker.

    tunelab launches a `launch: native` Triton method from Python when native
    launches cannot run (no NVRTC, a native worker that does not start); that
    run would be timed as a Python one, so it is an error here.
    """
    if breakdown is None:
        raise BenchError(f"tunelab {name}: no trace, so no way to tell that its launches were native")
    lane = next(iter(breakdown["lanes"].values()), None)
    native = (lane or {}).get("native")
    done = native["jobs"] if native else 0
    total = lane["jobs"] if lane else 0
    if not total or done != total:
        warnings = [line for line in log.splitlines() if "warning" in line.lower()]
        logs = sorted(results_dir.glob("*/*/logs/native*.log"))
        tail = logs[0].read_text(errors="replace").strip().splitlines()[-5:] if logs else []
        raise BenchError(f"tunelab {name}: the native worker checked {done} of {total} jobs, so the others were "
                         f"launched by Python (no NVRTC: set TUNELAB_NVRTC; or a native worker that did not start)"
                         + (f"; tunelab said: {' | '.join(warnings)}" if warnings else "")
                         + (f"; {logs[0].name} ends: {' | '.join(tail)}" if tail else "; no native worker log"))


def nvrtc_check(tunelab, arch):
    """Compile tunelab's helper kernels (spin, L2 flush) with NVRTC, as a native lane's first job does.

    `tunelab native-compile` finds NVRTC the way a run does (TUNELAB_NVRTC, the
    workers' Python's wheels, the toolkit). Without it the native contenders
    would be launched by Python; returns the compiler tunelab found.
    """
    out = Path(tempfile.mkdtemp(prefix="tunelab-nvrtc-"))
    cmd = [str(tunelab), "native-compile", str(HELPERS_SOURCE), "--kernel", "tunelab_spin", "--out", str(out),
           "--arch", arch, "--python", worker_python()]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise BenchError(f"`{shlex.join(cmd)}` ran past 120 s", 2) from None
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        raise BenchError(f"the native contenders cannot launch natively: `{shlex.join(cmd)}` failed "
                         f"({proc.returncode}): {proc.stderr.strip()[-1500:]}\n  = help: point TUNELAB_NVRTC at "
                         "libnvrtc.so, or install the NVRTC wheel into the workers' Python", 2)
    try:
        return json.loads(proc.stdout)["compiler"]
    except (ValueError, KeyError):
        return proc.stdout.strip()


def find_journal(results_dir):
    """results/<experiment>/<device>/journal.jsonl: the device directory is tunelab's naming, so search for it."""
    found = sorted(results_dir.glob("*/*/journal.jsonl"))
    if len(found) != 1:
        raise BenchError(f"expected one journal under {results_dir}, found {[str(f) for f in found]}")
    return found[0]


def summarize_journal(path):
    """Winner, status counts and timed GPU time from a tunelab journal.

    A job's time is its finalist re-timing (the "final" record) when it has one,
    else its own median: finalists are re-timed interleaved, which is what
    tunelab itself ranks by. Only status "ok" Triton jobs can win.
    """
    jobs, finals, job_lines = {}, {}, []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("type") == "job":
            jobs[rec["job_id"]] = rec  # a later record of a job replaces an earlier one
            job_lines.append(rec)
        elif rec.get("type") == "final":
            finals[rec["job_id"]] = rec

    def time_us(job):
        final = finals.get(job["job_id"])
        return (final or job)["stats"]["median_us"]

    # Only the Triton method's jobs compete (bench-gemm has no other; a torch job has no tile config).
    ok = [j for j in jobs.values() if j["status"] == "ok" and j.get("stats") and j.get("kind") == "triton"]
    if not ok:
        raise BenchError(f"no job finished ok in {path}")
    winner = min(ok, key=time_us)
    counts = {}
    for job in jobs.values():
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    return {
        "winner": {k: int(winner["config"][k]) for k in CONFIG_KEYS},
        "winner_us": time_us(winner),
        "winner_from_final": winner["job_id"] in finals,
        "counts": counts,
        "failures": sorted({(j.get("failure") or {}).get("class", "?") for j in jobs.values() if j["status"] == "failed"}),
        # Every job line is sampling time spent; pruned jobs keep their screening samples.
        "gpu_ms_jobs": sum(j["stats"]["gpu_ms"] for j in job_lines if j.get("stats")),
        "gpu_ms_finals": sum(f["stats"]["gpu_ms"] for f in finals.values()),
    }


# ---------------------------------------------------------------------------
# Parent: putting the facts together
# ---------------------------------------------------------------------------


def device_dir(gpu_name):
    """Directory name for the GPU: its name with '_' for spaces; every H200 variant is NVIDIA_H200."""
    if "H200" in gpu_name:
        return "NVIDIA_H200"
    return gpu_name.strip().replace(" ", "_")


def tflops(shape, us):
    return 2.0 * shape["M"] * shape["N"] * shape["K"] / (us * 1e-6) / 1e12


def driver_version(gpu):
    try:
        return Nvml(gpu).driver_version()
    except (OSError, AttributeError):
        pass
    try:
        return nvidia_smi_query(gpu, "driver_version")
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def assemble(shape, configs, env, results, verify, commands, errors):
    """One dict with every fact; the JSON file is this, the markdown is rendered from it."""
    rows = {}
    reference = grid_reference(results)
    grid_key = config_key(results[reference]["winner"]) if reference else None
    retimed = {config_key(r["config"]): r["us"] for r in (verify or {}).get("retimed", [])}
    autotune_wall = results.get("autotune", {}).get("wall_s")
    autotune_process = results.get("autotune", {}).get("process_s")
    for name, r in results.items():
        key = config_key(r["winner"])
        row = {
            "wall_s": r["wall_s"],
            "speedup_vs_autotune": autotune_wall / r["wall_s"] if autotune_wall else None,
            # Against autotune's whole child process (interpreter, imports, inputs, tuning call, output
            # check, one do_bench of the winner); not given for autotune itself.
            "speedup_vs_autotune_process": (autotune_process / r["wall_s"]
                                            if autotune_process and name != "autotune" else None),
            "native": is_native(name),
            # tunelab's wall after its lane worker answered hello: what autotune's figure measures
            # too (autotune's clock starts in a process that has imported torch already).
            "after_startup_s": after_startup(r),
            "gpu_util": r["util"]["mean"],
            "winner": r["winner"],
            "winner_label": config_label(r["winner"]),
            "winner_us": r["winner_us"],
            "winner_tflops": tflops(shape, r["winner_us"]),
            "winner_retimed_us": retimed.get(key),
            "same_winner_as_grid": key == grid_key if grid_key else None,
            # Same config: 0 by definition, not re-timing noise. Else both re-timed with one timer in one process.
            "gap_to_grid_pct": gap_pct(key, grid_key, retimed),
        }
        row["speedup_after_startup"] = (autotune_wall / row["after_startup_s"]
                                        if autotune_wall and row["after_startup_s"] else None)
        if name == "autotune":
            row.update({"configs_ok": r["configs_timed"], "configs_pruned": 0, "configs_failed": r["configs_failed"],
                        "process_s": r["process_s"], "bench_time_s": r["bench_time_s"], "check": r["check"],
                        "winner_us_autotuner": r["winner_us_autotuner"]})
        else:
            row.update({"configs_ok": r["counts"].get("ok", 0), "configs_pruned": r["counts"].get("pruned", 0),
                        "configs_failed": r["counts"].get("failed", 0), "failures": r["failures"],
                        "timed_kernel_fraction": r["timed_kernel_fraction"],
                        "timed_kernel_fraction_with_finals": r["timed_kernel_fraction_with_finals"],
                        "winner_from_final": r["winner_from_final"], "exit_code": r["exit_code"],
                        "tunelab_log_tail": r["tunelab_log_tail"],
                        "overhead_ms_per_job": r.get("overhead_ms_per_job"),
                        "lane_overhead_ms_per_job": r.get("lane_overhead_ms_per_job"),
                        "gpu_waited_ms_per_job": r.get("gpu_waited_ms_per_job"),
                        "overhead_parts_ms": r.get("overhead_parts_ms"),
                        "breakdown": r.get("breakdown"), "breakdown_text": r.get("breakdown_text")})
        row["util_samples"], row["util_source"] = r["util"]["samples"], r["util"]["source"]
        rows[name] = row
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": commands["self"],
        "contender_commands": commands["contenders"],
        "environment": env,
        "problem": {**shape, "configs": len(configs), "manifest": str(MANIFEST.relative_to(REPO))},
        "native_override": NATIVE_OVERRIDE,
        "grid_reference": reference,
        "contenders": rows,
        "launch_cost": (verify or {}).get("launch_cost"),
        "goals": goal_status(rows),
        "errors": errors,
    }


def grid_reference(rows):
    """The exhaustive run the gaps are taken against: grid, else native-grid (same space, same search)."""
    return next((n for n in ("grid", "native-grid") if n in rows), None)


def after_startup(result):
    """Wall time from the lane worker's first answer to the end of the run (from the trace)."""
    if "wall_s" in result and "breakdown" not in result:
        return result["wall_s"]  # autotune: its clock already starts after the imports
    lane = next(iter((result["breakdown"] or {}).get("lanes", {}).values()), None)
    if not lane or lane["ready_s"] is None:
        return None
    return result["wall_s"] - lane["ready_s"]


def gap_pct(key, grid_key, retimed):
    if grid_key is None:
        return None
    if key == grid_key:
        return 0.0
    if key in retimed and grid_key in retimed:
        return (retimed[key] / retimed[grid_key] - 1.0) * 100.0
    return None


def winner_gap_pct(row, other):
    """row's winner re-timed against other's, in %: 0 when it is the same config, None when not re-timed."""
    if config_key(row["winner"]) == config_key(other["winner"]):
        return 0.0
    a, b = row.get("winner_retimed_us"), other.get("winner_retimed_us")
    return (a / b - 1.0) * 100.0 if a and b else None


def autotune_winner_verdict(auto, row):
    """Whether autotune's winner is row's, or no more than 1 % faster than it (re-timed), and the words for it.

    gap: autotune's winner re-timed against row's. Positive means tunelab found the
    faster config; only autotune winning by more than 1 % counts against tunelab.
    """
    gap = winner_gap_pct(auto, row)
    same = config_key(auto["winner"]) == config_key(row["winner"])
    good = same or (gap is not None and gap >= -1.0)
    text = "is the same config" if same else f"differs and is {fmt(gap, '{:+.2f} %')} vs tunelab's (re-timed)"
    return good, text


def goal_status(rows):
    """Each goal with the measured value and whether it was met (stated, never asserted)."""
    grid, auto = rows.get("grid"), rows.get("autotune")
    reference = grid_reference(rows)
    out = []
    if grid and auto:
        good_winner, winner_text = autotune_winner_verdict(auto, grid)
        met = grid["speedup_vs_autotune"] >= 8 and good_winner
        out.append({"goal": GOALS[0] + " (whole tunelab process)", "met": met,
                    "measured": f"{grid['speedup_vs_autotune']:.1f}x; autotune's winner {winner_text}"})
        if grid.get("speedup_after_startup"):
            out.append({"goal": GOALS[0] + " (after worker start-up, as autotune's figure is)",
                        "met": grid["speedup_after_startup"] >= 8 and good_winner,
                        "measured": f"{grid['speedup_after_startup']:.1f}x ({grid['after_startup_s']:.1f} s)"})
    for name in NATIVE_CONTENDERS:
        native = rows.get(name)
        if not (native and auto):
            continue
        good_winner, winner_text = autotune_winner_verdict(auto, native)
        against = [("speedup_vs_autotune", f"against autotune's tuning call, {auto['wall_s']:.1f} s")]
        if native.get("speedup_vs_autotune_process"):
            against.append(("speedup_vs_autotune_process",
                            f"against autotune's whole process, {auto['process_s']:.1f} s"))
        for key, label in against:
            out.append({"goal": f"{GOALS[4]} ({name}, {native['wall_s']:.1f} s; {label})",
                        "met": native[key] >= 8 and good_winner,
                        "measured": f"{native[key]:.1f}x; autotune's winner {winner_text}"})
    for name in ("grid", "halving") + NATIVE_CONTENDERS:
        if rows.get(name) and rows[name]["gpu_util"] is not None:
            out.append({"goal": f"{GOALS[1]} ({name})", "met": rows[name]["gpu_util"] >= 0.8,
                        "measured": f"{rows[name]['gpu_util'] * 100:.0f} % NVML utilisation"})
    for name in ("halving", "native-halving", "native-inputs-halving"):
        if reference and rows.get(name):
            gap = rows[name]["gap_to_grid_pct"]
            label = GOALS[2] if name == "halving" and reference == "grid" else f"{GOALS[2]} ({name} vs {reference})"
            out.append({"goal": label, "met": gap is not None and gap <= 2.0, "measured": fmt(gap, "{:+.2f} %")})
    for name in ("grid", "halving"):
        overhead = (rows.get(name) or {}).get("overhead_ms_per_job")
        if overhead is not None:
            out.append({"goal": f"{GOALS[3]} ({name})", "met": overhead < 1.0,
                        "measured": f"{overhead:.3f} ms per job"})
    for name in NATIVE_CONTENDERS:
        # What the GPU waited for the runner: the native worker idle while a compiled job was ready for
        # it (trace_breakdown's `gpu_waited_ms_per_job`). The lane's side, between calls + protocol of
        # both workers' calls, is shown beside it (another measure, not a bound); for traces from older
        # runners, whose workers did not say when they read each request, it is the figure counted,
        # and the goal says so.
        # The journal append runs on the writer thread; it is shown, not counted.
        row = rows.get(name) or {}
        lane = row.get("lane_overhead_ms_per_job")
        waited = row.get("gpu_waited_ms_per_job")
        parts = overhead_parts_text(row.get("overhead_parts_ms"))
        if waited is not None:
            out.append({"goal": f"{GOALS[5]} ({name}; what the GPU waited for the runner: the native worker "
                                f"idle while a compiled job was ready for it)",
                        "met": waited <= 0.2,
                        "measured": f"{waited:.3f} ms per job; the lane's side, another measure: {lane:.3f} "
                                    f"({parts})"})
        elif lane is not None:
            out.append({"goal": f"{GOALS[5]} ({name}; between calls + protocol, the lane's side: the trace does "
                                f"not say when the workers began each request)",
                        "met": lane <= 0.2,
                        "measured": f"{lane:.3f} ms per job ({parts})"})
    return out


def overhead_parts_text(parts):
    if not parts:
        return "parts not known"
    return (f"between calls {parts['between_calls']:.3f} + protocol of the Python worker's calls "
            f"{parts['protocol_python']:.3f} + of the native worker's {parts['protocol_native']:.3f}; not counted: "
            f"the journal append, {parts['journal']:.3f} on the writer thread")


def fmt(value, pattern):
    return "—" if value is None else pattern.format(value)


def render_markdown(f):
    env, lines = f["environment"], []
    add = lines.append
    add(f"# Tuning speed: triton.autotune vs tunelab, {env['gpu']}")
    add("")
    p = f["problem"]
    add(f"Same {p['configs']}-config space (`{p['manifest']}`) for tunelab's Triton matmul, "
        f"{p['M']}x{p['N']}x{p['K']} {p['dtype']}, each contender from a cold Triton cache, one GPU.")
    add("")
    add("| contender | wall s | speedup vs autotune | vs autotune's whole process | wall after start-up s | speedup "
        "| GPU util | winner | winner µs | TFLOP/s | gap to grid winner | winner re-timed µs | timed-kernel fraction "
        "| configs ok / pruned / failed |")
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, r in f["contenders"].items():
        add(f"| {LABELS[name]} | {r['wall_s']:.1f} | {fmt(r['speedup_vs_autotune'], '{:.1f}x')} "
            f"| {fmt(r.get('speedup_vs_autotune_process'), '{:.1f}x')} "
            f"| {fmt(r.get('after_startup_s'), '{:.1f}')} | {fmt(r.get('speedup_after_startup'), '{:.1f}x')} "
            f"| {fmt(r['gpu_util'], '{:.0%}')} | `{r['winner_label']}` | {r['winner_us']:.1f} "
            f"| {r['winner_tflops']:.1f} | {fmt(r['gap_to_grid_pct'], '{:+.2f} %')} "
            f"| {fmt(r['winner_retimed_us'], '{:.1f}')} | {fmt(r.get('timed_kernel_fraction'), '{:.0%}')} "
            f"| {fmt(r['configs_ok'], '{}')} / {r['configs_pruned']} / {r['configs_failed']} |")
    add("")
    add("- wall s: triton.autotune, the first (tuning) call, synchronised, in a process that had already imported "
        "torch and built the inputs"
        + (f" (whole process: {f['contenders']['autotune']['process_s']:.1f} s)" if "autotune" in f["contenders"] else "")
        + "; tunelab, the whole `tunelab run` process: start-up, workers, compile pool, checks, timing, finalists, outputs.")
    add("- speedup vs autotune: autotune's wall s (its tuning call) / this wall s. vs autotune's whole process: "
        "the wall time of autotune's whole child process (interpreter start, imports, inputs, the tuning call, the "
        "output check, one `do_bench` of the winner) / this wall s.")
    if any(r.get("native") for r in f["contenders"].values()):
        override = f.get("native_override", NATIVE_OVERRIDE)
        add(f"- native launches: `tunelab run` of the same manifest with `--set {override}` "
            "(an override on the command line; no derived manifest): Triton compiles in the Python compile pool as "
            "before, the runner's native worker (Rust, cudarc) loads each cubin and launches and times it; the "
            "lane's Python worker builds inputs and reference, shares them over CUDA IPC and answers `recipe`; "
            "the native worker compares each job's output with the shared reference (a `compare` call to the "
            "Python worker where the reference cannot be shared). The script checked in each such run's trace that the native worker "
            "checked every job (none fell back to Python's launch).")
    if any(has_native_inputs(n) for n in f["contenders"]):
        add(f"- native launches and inputs: also `--set {NATIVE_INPUTS_OVERRIDE}`: the lane's Python worker imports "
            "no torch and sees no GPU (it describes the shape's data and answers `recipe` over stand-in tensors); "
            "the native worker builds the inputs with its seeded generator and the fp32 reference with its own "
            "matmul kernel (`build`), then compares each job's output with it.")
    if any(is_raced(n) for n in f["contenders"]):
        add(f"- racing: also `--set {RACE_OVERRIDE}`: a config whose median is, with 95 % confidence, more than 5 % "
            "slower than the best its run has recorded so far stops sampling at `min_samples` (flagged OUTPACED) "
            "instead of refining its figure to ±0.5 %; it keeps its median and can still be a finalist.")
    add("- wall after start-up: tunelab's wall time from its lane worker's first answer (torch imported, CUDA "
        "up; for native inputs, no torch) to the end of the run, from the trace; the same starting point as "
        "autotune's figure. For autotune the two columns are the same figure.")
    add("- GPU util: mean NVML utilisation (share of time any kernel ran) sampled every ~50 ms over that wall time.")
    add("- winner µs: each contender's own timer (autotune: `triton.testing.do_bench` median; tunelab: its journal, "
        "the finalist re-timing where there is one). winner re-timed µs: every winner again in one process, "
        "do_bench median of 5 interleaved rounds; the gap column uses these (0 when the config is the grid's)"
        + (f"; grid here is `{f['grid_reference']}`" if f.get("grid_reference") not in (None, "grid") else "")
        + ".")
    add("- timed-kernel fraction: sum of the journal's job `stats.gpu_ms` / wall (finalist re-timings not included; "
        "for halving, survivors' screening samples are not in the journal either).")
    add("")
    add_breakdown(add, f["contenders"])
    add_launch_cost(add, f.get("launch_cost"))
    add("## Goals (stated, not asserted)")
    add("")
    for g in f["goals"]:
        add(f"- {'met' if g['met'] else 'NOT met'}: {g['goal']}: {g['measured']}")
    if not f["goals"]:
        add("- not evaluated (contenders missing)")
    if f["errors"]:
        add("")
        add("## Errors")
        add("")
        for e in f["errors"]:
            add(f"- {e}")
    add("")
    add("## Environment")
    add("")
    add(f"- GPU: {env['gpu']} (sm {env['capability']}, {env['sm_count']} SMs), driver {env.get('driver') or '?'}, "
        f"CUDA {env['cuda']}")
    add(f"- torch {env['torch']}, Triton {env['triton']}, Python {env['python']}; host CPUs: {env['cpus']}")
    add(f"- GPU utilisation before the runs (idle check): {fmt(env.get('idle_util_before'), '{:.0%}')}")
    add(f"- tunelab: `{env['tunelab']}` ({env['tunelab_version']})")
    if env.get("nvrtc"):
        add(f"- NVRTC (native contenders' helper kernels): {env['nvrtc']}")
    add(f"- date (UTC): {f['date_utc']}")
    add(f"- command: `{f['command']}`")
    for name, cmd in f["contender_commands"].items():
        add(f"- {name}: `{cmd}`")
    return "\n".join(lines) + "\n"


def add_breakdown(add, contenders):
    """Each tunelab run's wall time taken apart from its trace (bench/trace_breakdown.py)."""
    traced = {name: r for name, r in contenders.items() if r.get("breakdown_text")}
    if not traced:
        return
    add("## Where tunelab's wall time goes")
    add("")
    add("From each run's `--trace` (kept as `journals/<contender>.trace.json`; open it in ui.perfetto.dev). "
        "Runner overhead per job: lane time inside a group that is not a worker call, plus each call's round "
        "trip minus the worker's own time, plus the journal append (fsync) on the writer thread.")
    if any(r.get("native") for r in traced.values()):
        add("")
        add("Native launches: a job is `recipe` and `compare` on the lane's Python worker (track `lane0`), "
            "`check`, `warmup` and `sample` on the native worker (track `native0`); `share` and `import` once "
            "per shape; `describe` once per group. Runner overhead per job there: lane time inside groups in no "
            "call of either worker, no wait for a compile, and not the native worker's start-up (tunelab's "
            "helper kernels compiled with NVRTC, the process started, its GPU opened, `hello`: once per run, "
            "while the lane's Python worker starts, reported on its own line); plus round trip minus worker time of every "
            "call of both workers but `hello` and `shutdown`; divided by the lane's jobs (each counted once, by "
            "its `check`); plus the journal append's mean. What the GPU waited for the runner (traces from "
            "runners since 2026-11-24, whose workers say when they read each request): time inside groups that "
            "the native worker sat idle while a job was ready for it (compiled and not yet begun, or, once every "
            "job had begun, anything but the protocol's rests), per job; lane work while the worker was busy, or "
            "while no compiled job waited, delays nothing and is not in it.")
    add("")
    for name, r in traced.items():
        add(f"**{LABELS[name]}**")
        add("")
        add("```")
        add(r["breakdown_text"])
        add("```")
        add("")


def add_launch_cost(add, lc):
    add("## Host cost of one launch")
    add("")
    if not lc:
        add("Not measured.")
        add("")
        return
    add(f"Winning config `{config_label(lc['config'])}` at {lc['size']}^3 bf16 (a kernel shorter than its launch, "
        f"so the host is the limit), {lc['n']} launches back to back without a sync after a warm-up, median of "
        f"{lc['repeats']} repeats. Kernel µs: the launched kernel's own GPU time (do_bench median); the host "
        "figure is the host's cost only where it is the larger of the two.")
    add("")
    add("| launch path | host µs / launch | kernel µs |")
    add("| --- | ---: | ---: |")
    add(f"| (a) JIT dispatch `matmul_kernel[grid](...)` | {lc['jit']['host_us']:.2f} | {lc['jit']['kernel_us']:.2f} |")
    comp = lc["compiled"]
    if comp["reachable"]:
        add(f"| (b) compiled launcher `compiled[grid](...)` ({comp['form']}) | {comp['host_us']:.2f} "
            f"| {comp['kernel_us']:.2f} |")
    else:
        add(f"| (b) compiled launcher `compiled[grid](...)` | not reachable: {comp['why']} | — |")
    add(f"| (c) `torch.matmul(a, b, out=c)` | {lc['torch']['host_us']:.2f} | {lc['torch']['kernel_us']:.2f} |")
    add("")


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def print_plan(args, tunelab, shape, configs):
    out = ["tuning_speed dry run: nothing will run on a GPU",
           f"  tunelab:   {tunelab} ({tunelab_version(tunelab)})",
           f"  python:    {worker_python()} (workers and GPU children)",
           f"  problem:   {shape}, {len(configs)} configs from `tunelab plan --jobs {MANIFEST.relative_to(REPO)}`, "
           f"max smem {max(smem_bytes(c) for c in configs)} B <= {HOPPER_SMEM_BYTES} B",
           "  contenders (in this order, each with a fresh TRITON_CACHE_DIR, CUDA_VISIBLE_DEVICES=0):"]
    for name in args.contenders:
        if name == "autotune":
            out.append("    autotune: triton.autotune(configs=<48>, key=['M','N','K'])(tunelab matmul_kernel), "
                       "first call timed, winner timed with do_bench")
        else:
            out.append(f"    {name}: {shlex.join(tunelab_command(tunelab, name, Path('<tmp>') / f'tunelab-{name}'))}")
    if any(is_native(n) for n in args.contenders):
        worker = os.environ.get("TUNELAB_NATIVE_WORKER") or tunelab
        out.append(f"    native-*: `--set {NATIVE_OVERRIDE}` accepted, same {len(configs)} jobs planned; "
                   f"native worker: {worker} native-worker; NVRTC (helper kernels "
                   f"compiled for sm_90 here): {args.nvrtc}; each run's trace must show every job checked by "
                   "the native worker")
    out.append("    verify: re-time the winners in one process; host µs per launch: JIT, compiled launcher, torch.matmul")
    out.append(f"  outputs:   {args.out_dir}/<device>/tuning_speed.md, tuning_speed.json")
    out.append(f"  triton.Config list: {triton_config_summary(configs)}")
    out.append("  configs:")
    out.extend(f"    {i:2d} {config_label(c)}  smem {smem_bytes(c)} B" for i, c in enumerate(configs))
    print("\n".join(out))


def triton_config_summary(configs):
    """Build the triton.Config list the autotune child will build, when Triton is importable here (no GPU needed)."""
    try:
        sys.path.insert(0, str(REPO / "python"))
        import triton
        from tunelab.kernels import matmul
    except Exception as e:  # torch or triton missing here is fine for a dry run
        return f"not built (Triton not importable here: {type(e).__name__}: {e})"
    built = []
    for cfg in configs:
        constexprs, options = matmul.split_config(cfg)
        built.append(triton.Config(constexprs, num_warps=options["num_warps"], num_stages=options["num_stages"]))
    distinct = len({str(c) for c in built})
    return f"{len(built)} triton.Config objects ({distinct} distinct), Triton {triton.__version__}; first: {built[0]}"


def tunelab_version(tunelab):
    try:
        return subprocess.run([str(tunelab), "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def run_benchmark(args, tunelab, shape, configs):
    errors, results, verify = [], {}, None
    commands = {"self": self_command(), "contenders": {}}
    work = Path(tempfile.mkdtemp(prefix="tunelab-bench-"))
    try:
        env = run_child("env", {}, work)
        gpu = env.get("uuid") or "0"
        env.update({"driver": driver_version(gpu), "cpus": os.cpu_count(), "tunelab": str(tunelab),
                    "tunelab_version": tunelab_version(tunelab), "worker_python": worker_python()})
        print(f"tuning_speed: {env['gpu']}, torch {env['torch']}, Triton {env['triton']}", file=sys.stderr)
        env["idle_util_before"] = idle_utilization(gpu)
        native_blocked = None
        if any(is_native(n) for n in args.contenders):
            try:
                env["nvrtc"] = nvrtc_check(tunelab, "sm_" + env["capability"].replace(".", ""))
            except BenchError as e:
                native_blocked = str(e)
        for name in args.contenders:
            try:
                if is_native(name) and native_blocked:
                    raise BenchError(f"not run: {native_blocked}")
                if name == "autotune":
                    print("tuning_speed: autotune: triton.autotune over the same configs (cold cache)", file=sys.stderr)
                    commands["contenders"][name] = "triton.autotune in `--child autotune` (this script)"
                    results[name] = run_child("autotune", {"shape": shape, "configs": configs, "gpu": gpu}, work)
                else:
                    results[name] = run_tunelab(tunelab, name, work, gpu)
                    commands["contenders"][name] = results[name]["command"]
                    keep_journal(results[name], args.out_dir / device_dir(env["gpu"]), name)
            except BenchError as e:
                errors.append(f"{name}: {e}")
                print(f"tuning_speed: {name} failed: {e}", file=sys.stderr)
        if results:
            verify = run_verify(results, shape, work, errors)
    finally:
        if args.keep_work:
            print(f"tuning_speed: work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    facts = assemble(shape, configs, env, results, verify, commands, errors)
    write_outputs(args.out_dir / device_dir(env["gpu"]), facts)
    return 1 if errors else 0


def idle_utilization(gpu, seconds=2.0):
    """GPU utilisation with nothing of ours running; well above 0 means another job shares the GPU."""
    with UtilSampler(gpu) as util:
        time.sleep(seconds)
    idle = util.result()["mean"]
    if idle is not None and idle > 0.05:
        print(f"tuning_speed: warning: the GPU is {idle:.0%} busy before the benchmark starts; "
              "another process is using it and the figures will be off", file=sys.stderr)
    return idle


def run_verify(results, shape, work, errors):
    """Re-time the distinct winners together and measure launch cost with the grid's winner (else any)."""
    winners = []
    for r in results.values():
        if r["winner"] not in winners:
            winners.append(r["winner"])
    launch_config = results.get("grid", next(iter(results.values())))["winner"]
    print(f"tuning_speed: verify: re-timing {len(winners)} winner(s), launch cost", file=sys.stderr)
    try:
        return run_child("verify", {"shape": shape, "winners": winners, "launch_config": launch_config}, work)
    except BenchError as e:
        errors.append(f"verify: {e}")
        return None


def keep_journal(result, out_dir, name):
    """A copy of each tunelab journal (and its trace) next to the results, so every number can be traced."""
    dest = out_dir / "journals"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result["journal"], dest / f"{name}.journal.jsonl")
    if result.get("trace"):
        shutil.copyfile(result["trace"], dest / f"{name}.trace.json")


def self_command():
    prefix = f"TUNELAB_PYTHON={shlex.quote(os.environ['TUNELAB_PYTHON'])} " if os.environ.get("TUNELAB_PYTHON") else ""
    return prefix + shlex.join([sys.executable, *sys.argv])


def write_outputs(out_dir, facts):
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(facts)
    (out_dir / "tuning_speed.md").write_text(markdown)
    (out_dir / "tuning_speed.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(markdown)
    print(f"tuning_speed: wrote {out_dir / 'tuning_speed.md'} and tuning_speed.json", file=sys.stderr)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child_main(args)
    try:
        tunelab = find_tunelab(args.tunelab)
        native = any(is_native(n) for n in args.contenders)
        # A dry run plans for a Hopper GPU wherever it runs (the benchmark's
        # space is sized for one; see HOPPER_SMEM_BYTES).
        shape, configs = plan_configs(tunelab, native=native, device="h100" if args.dry_run else None)
        if args.dry_run:
            args.nvrtc = None
            if native:
                try:
                    args.nvrtc = nvrtc_check(tunelab, "sm_90")
                except BenchError as e:  # this machine may not be the GPU host: say so, plan anyway
                    args.nvrtc = f"NOT FOUND here, the native contenders would not run: {e}"
            print_plan(args, tunelab, shape, configs)
            return 0
        return run_benchmark(args, tunelab, shape, configs)
    except BenchError as e:
        print(f"tuning_speed: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
