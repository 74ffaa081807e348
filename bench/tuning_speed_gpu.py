"""What bench/tuning_speed.py runs on the GPU: its utilisation, sampled
through NVML or nvidia-smi, and the child processes' steps (`--child`:
triton.autotune over the same configs, the re-timing of every winner with
one timer, the host cost of a launch), each with a fresh Triton cache.

Only a child imports torch and Triton (tuning_speed.py's parent never
does). Moved out of tuning_speed.py, whose `--child` runs `child_main`.
"""

import ctypes
import json
import math
import shutil
import statistics
import subprocess
import sys
import threading
import time

from tuning_speed_contenders import CONFIG_KEYS

# Host launch cost: launches queued back to back without a sync. A small
# problem keeps each kernel shorter than its host launch cost, so the GPU never
# falls behind; at 4096^3 (~190 us a kernel) the launch queue would fill and
# the loop would measure GPU time instead. Same dtype and 16-divisible sizes,
# so Triton picks the same specialisation as for 4096^3.
LAUNCH_COST_SIZE = 256
LAUNCH_COST_N = 1000
LAUNCH_COST_REPEATS = 5


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
    out = subprocess.run(
        ["nvidia-smi", "-i", str(gpu), f"--query-gpu={field}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
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
    retimed = [
        {"config": w, "us": statistics.median(r[i] for r in rounds), "rounds_us": [r[i] for r in rounds]}
        for i, w in enumerate(winners)
    ]
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
        result = host_us_per_launch(lambda: runner(*form_args), sync)  # noqa: B023 - called before the loop goes on
        return {"reachable": True, "form": form, **result}
    return {"reachable": False, "why": "; ".join(errors)}
