#!/usr/bin/env python3
"""Quantised fused MoE against its bandwidth bound on one GPU (a measurement, not a test).

The goals of issue 13 (docs/quantisation.md, "Bandwidth bounds and goals"):

- MXFP4 (gpt-oss's own weights, bf16 activations, SwiGLU with biases),
  E=128 N=2880 M=1: at least 70 % of the bandwidth bound on an H200;
- fp8 w8a8 (per-tensor weight scales, per-token activation scales, SiLU),
  E=128 N=2880, 8 <= M <= 256: at least 80 % of the bound.

Each shape (K=2880, topk=4, as gpt-oss-120b) runs a sweep of configs in
tunelab's call (`fused_moe`): the configs of experiments/spaces/fused-moe.yaml
its constraints allow at that M (SPACE and sweep() below), for MXFP4 with
both dequantisations (DOT_SCALED 0 and 1), vLLM's default config first.
Every output is checked against the problem's reference (the tolerances of
experiments/gptoss-fp8.yaml and gptoss-mxfp4.yaml) before it is timed. For
fp8, vLLM's default and the best configs also run in vLLM's call structure
(`fused_moe_vllm`, what the shipped fp8 files are ranked in); last, if time
is left, bf16 weights at the same shapes with vLLM's default config.

Timing follows the runner's protocol (docs/manifest.md, "Measurement protocol") with
the worker's own timer (tunelab.worker.CudaEventTimer):
- cold: a warm-up of at least 3 launches and 5 ms; an event pair around each
  launch, L2 flushed by reading max(2 x L2, 32 MiB) before every sample, 32
  samples per host sync; sampling stops once the 95 % confidence interval of
  the median is within +-0.5 % of it (at least 20 samples), or at 2000
  samples, 100 ms of GPU time or 1.5 s (flagged CAP_HIT). Every config.
- graph: 10 launches in one CUDA graph replayed between two events, per
  launch, no flush (how vLLM's benchmark times configs), the same stopping
  rule. vLLM's default and the GRAPH_TOP best cold configs of each shape.
% of bound: the bytes of the experts the routing selects (packed values and
scales: MXFP4 0.5 + 1/32 bytes a weight, fp8 1 byte plus its scales, biases)
plus activations in and out (`FusedMoE.bytes_for`), at the part's peak
bandwidth (src/device/cuda.rs's table: H200 4800 GB/s, H100 SXM 3350 GB/s),
over the median. The goals are judged on cold times: graph replays keep
whatever of the weights L2 holds from the call before.

The run stops starting work after --budget-s seconds (default 390, so it
ends within 8 minutes): each shape gets a share of what is left, in
proportion to its number of configs (twice that for a goal shape), and a
shape's sweep stops at its share; what was cut is listed in the report.
Kernels are compiled ahead, COMPILE_BATCH at a time within the shape's
share, by a pool of --compile-jobs compile workers (bench/moe_methods.py's
Compiler).

    python3 bench/quant_moe.py --out DIR [--mxfp4-m 1,4,16,64]
        [--fp8-m 8,16,32,64,128,256] [--no-bf16] [--budget-s 390]
        [--peak GB/s] [--compile-jobs 16]

Writes DIR/quant_moe.json (after every shape, so a run cut short keeps what it
measured) and DIR/quant_moe.md (device, date, command, tables, goals);
progress goes to stderr. DIR defaults to results/bench/<vLLM device name>/.

--smoke runs the same code on the CPU under Triton's interpreter with tiny
shapes (E=8 topk=2 K=64 N=32, fp16 activations, a few configs, wall-clock
timing, no compile pool): python/tests/test_bench_quant_moe.py runs it.
"""

import os
import sys

SMOKE = "--smoke" in sys.argv[1:]
if SMOKE:
    # Before triton is imported: Triton reads it when a kernel is decorated.
    os.environ["TRITON_INTERPRET"] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO / "python", REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402
import triton  # noqa: E402

from tunelab import interpreter  # noqa: E402
from tunelab.compare import compare  # noqa: E402
from tunelab.problems.moe import FusedMoE, vllm_default_config  # noqa: E402
from tunelab.worker import CudaEventTimer, Prepared, WallTimer  # noqa: E402
from quant_moe_report import GOALS, best_by, cold_us, fmt_pct, fmt_us, graph_us, markdown, pct, shape_label, write  # noqa: E402

TOLERANCE = {
    "fp8": {"atol": 5e-2, "rtol": 5e-2, "max_mismatch": 0.005},  # experiments/gptoss-fp8.yaml (per_dtype fp8)
    "mxfp4": {"atol": 2e-2, "rtol": 2e-2, "max_mismatch": 0.005},  # experiments/gptoss-mxfp4.yaml
    "plain": {"atol": 2e-2, "rtol": 2e-2, "max_mismatch": 0.005},  # experiments/gptoss.yaml
}
GRAPH_TOP = 3  # best cold configs per shape also timed under graph replay (besides vLLM's default)
VLLM_TOP = 3  # best cold fp8 configs also run in vLLM's call structure (besides vLLM's default)
# Configs compiled ahead at a time (by the pool), then timed, before the next batch.
COMPILE_BATCH = 96
SM90_SMEM = 232_448  # src/device/cuda.rs's profile for sm_90, when torch does not say

# experiments/spaces/fused-moe.yaml (a test keeps them equal); its constraints are in allowed().
SPACE = {
    "BLOCK_SIZE_M": [16, 32, 64, 128],
    "BLOCK_SIZE_N": [32, 64, 128, 256],
    "BLOCK_SIZE_K": [64, 128, 256],
    "GROUP_SIZE_M": [1],
    "num_warps": [4, 8],
    "num_stages": [3, 4],
}
# K split over programs (SPLIT_K, tunelab's call only): swept where a call has at most
# SPLIT_K_MAX_SLOTS routed tokens (M * topk), the decode sizes where a GEMM has the
# fewest tiles. Measured on an H200 (2026-11-23, E=128 N=2880): at MXFP4 M=4 and fp8 M=8
# (16 and 32 slots) every split was slower than one, so larger calls run one split.
SPLIT_K_VALUES = [1, 2, 4, 8]
SMOKE_SPLIT_K_VALUES = [1, 2]
SPLIT_K_MAX_SLOTS = 8
# The one-token MXFP4 kernel (GEMV=1: BLOCK_SIZE_M 1, CUDA cores, no MMA; GEMV=2 the same in
# packed f16), swept where SPLIT_K is (M * topk <= SPLIT_K_MAX_SLOTS), first after vLLM's
# default: its own tiles, K splits and no pipeline (num_stages 1: its loads go straight to
# registers).
GEMV_SPACE = {
    "BLOCK_SIZE_M": [1],
    "BLOCK_SIZE_N": [32, 64, 128, 256],
    "BLOCK_SIZE_K": [128, 256, 512],
    "GROUP_SIZE_M": [1],
    "num_warps": [4, 8],
    "num_stages": [1],
    "SPLIT_K": [1, 2, 4, 8],
    # Last, so that the two alternate tile by tile: a sweep cut short by its budget has tried both.
    "GEMV": [1, 2],
}
SMOKE_GEMV_SPACE = dict(GEMV_SPACE, BLOCK_SIZE_N=[16], BLOCK_SIZE_K=[32], num_warps=[4], SPLIT_K=[1, 2])
# --smoke: a few configs the interpreter runs in seconds at K=64, N=32.
SMOKE_SPACE = {
    "BLOCK_SIZE_M": [16],
    "BLOCK_SIZE_N": [32],
    "BLOCK_SIZE_K": [64],
    "GROUP_SIZE_M": [1],
    "num_warps": [4],
    "num_stages": [2],
}


class Rule:
    """The runner's stopping rule (src/measure/stats.rs; defaults of src/measure/protocol.rs)."""

    def __init__(
        self,
        batch=32,
        min_samples=20,
        max_samples=2000,
        target_ci=0.005,
        max_gpu_ms=100.0,
        max_wall_s=1.5,
        warmup_launches=3,
        warmup_ms=5.0,
        graph_calls=10,
    ):
        self.batch, self.min_samples, self.max_samples = batch, min_samples, max_samples
        self.target_ci, self.max_gpu_ms, self.max_wall_s = target_ci, max_gpu_ms, max_wall_s
        self.warmup_launches, self.warmup_ms, self.graph_calls = warmup_launches, warmup_ms, graph_calls


GPU_RULE = Rule()
# The interpreter takes about half a second a launch: two samples, no CI target.
SMOKE_RULE = Rule(
    batch=2, min_samples=2, max_samples=2, max_wall_s=60.0, warmup_launches=0, warmup_ms=0.0, graph_calls=1
)


def peak_bandwidth_gbs(name: str, mem_clock_khz=None, bus_width_bits=None):
    """src/device/cuda.rs's peak_bandwidth_gbs: the published figure for the
    HBM3 parts, else 2 x memory clock x bus width; None when neither is known."""
    if "H200" in name:
        return 4800.0
    if "H100" in name and ("HBM3" in name or "SXM" in name):
        return 3350.0
    if mem_clock_khz and bus_width_bits:
        return 2.0 * mem_clock_khz * 1e3 * bus_width_bits / 8.0 / 1e9
    return None


def vllm_device_name(name: str) -> str:
    """vLLM's device name: spaces to '_', and NVIDIA_H200 for a name with the word H200."""
    name = name.replace(" ", "_")
    return "NVIDIA_H200" if "H200" in name.split("_") else name


# --------------------------------------------------------------------------
# statistics: the runner's median and stopping rule


def median_ci(samples):
    """(median, low, high): the distribution-free 95 % interval of the median
    (ranks n/2 -+ 1.96 sqrt(n)/2, 1-based), as src/measure/stats.rs computes it."""
    xs = sorted(samples)
    n = len(xs)
    med = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    half = 1.96 * math.sqrt(n) / 2
    lo = min(max(int(math.floor(n / 2 - half)), 1), n) - 1
    hi = min(max(int(math.ceil(n / 2 + half)), 1), n) - 1
    return med, xs[lo], xs[hi]


def until_precise(take_batch, rule: Rule, clock=time.perf_counter):
    """Take batches of samples (µs) until the median's 95 % CI is within
    rule.target_ci of it, or a cap (flagged CAP_HIT)."""
    samples, started, flags = [], clock(), []
    while True:
        samples += take_batch()
        med, lo, hi = median_ci(samples)
        if len(samples) >= rule.min_samples and med > 0 and (hi - lo) / 2 <= rule.target_ci * med:
            break
        if len(samples) >= rule.max_samples:
            if rule.max_samples > rule.min_samples:
                flags.append("CAP_HIT")
            break
        if sum(samples) / 1e3 >= rule.max_gpu_ms or clock() - started > rule.max_wall_s:
            flags.append("CAP_HIT")
            break
    return {"median_us": med, "ci_us": [lo, hi], "n": len(samples), "flags": flags}


class Timing:
    """Cold and graph timing of a bound launch, with the worker's timers."""

    def __init__(self, gpu: bool, flush_bytes: int, rule: Rule):
        self.gpu, self.flush_bytes, self.rule = gpu, flush_bytes, rule
        self.timer = CudaEventTimer(torch) if gpu else WallTimer()

    def sync(self):
        if self.gpu:
            torch.cuda.synchronize()

    def cold(self, launch):
        r = self.rule
        self.timer.warmup(launch, r.warmup_launches, r.warmup_ms)
        clocks = []

        def batch():
            us, clock = self.timer.sample(launch, r.batch, self.flush_bytes, "read")
            clocks.append(clock)
            return us

        out = until_precise(batch, r)
        seen = [c for c in clocks if c]
        out["sm_clock_mhz"] = seen[-1] if seen else None
        return out

    def graph(self, prepared):
        r = self.rule
        return until_precise(lambda: self.timer.sample_graph(prepared, r.batch, r.graph_calls)[0], r)


# --------------------------------------------------------------------------
# configs


def allowed(config: dict, M: int, topk: int, E: int, smem_bytes: int) -> bool:
    """experiments/spaces/fused-moe.yaml's constraints; with SWAP_AB=1, eight
    warps also where the weights' side alone is 128 rows or more (the MMA's
    long side is then BLOCK_SIZE_N: two warp groups of 64 rows each)."""
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    swapped = config.get("SWAP_AB", 0) == 1
    return (
        (bm + bn) * bk * 2 * config["num_stages"] <= smem_bytes
        and bm <= max(16, 2 * M * topk // E)
        and (config["num_warps"] == 4 or bm * bn >= 8192 or (swapped and bn >= 128))
        and (bm >= 64 or M < 1024)
        and (bn >= 64 or M <= 128)
        and (config["num_warps"] == 8 or M < 2048 or bm * bn < 8192)
    )


def sweep(fmt: str, M: int, topk: int, E: int, smem_bytes: int, space=None, split_ks=None, gemv_space=None) -> list:
    """The configs of `space` (default SPACE) its constraints allow at this M,
    each with both operand orders (SWAP_AB 0 and 1) and, at decode sizes
    (M * topk <= SPLIT_K_MAX_SLOTS), each of `split_ks` (default
    SPLIT_K_VALUES); MXFP4 also with each dequantisation (DOT_SCALED=0 with
    MX_PTX 0 and 1, DOT_SCALED=1). Ordered by how many keys differ from
    vLLM's default config, so a sweep cut short by the time budget has tried
    the configs nearest the default. MXFP4 at decode sizes puts the one-token
    kernel's configs (`gemv_space`, default GEMV_SPACE) first."""
    space = dict(space or SPACE)
    space["SWAP_AB"] = [0, 1]
    space["SPLIT_K"] = list(split_ks or SPLIT_K_VALUES) if M * topk <= SPLIT_K_MAX_SLOTS else [1]
    configs = [c for c in _product(space) if allowed(c, M, topk, E, smem_bytes)]
    if fmt == "mxfp4":
        configs = [dict(c, DOT_SCALED=ds, MX_PTX=px, GEMV=0) for c in configs for ds, px in ((0, 0), (1, 0), (0, 1))]
    default = default_config(fmt, M, E)
    configs = sorted(configs, key=lambda c: sum(c.get(k) != v for k, v in default.items()))
    if fmt == "mxfp4" and M * topk <= SPLIT_K_MAX_SLOTS:
        # At most 32 weight words (256 codes) a thread a K step: more spills registers (ptxas for sm_90).
        gemv = [
            dict(c, SWAP_AB=0, DOT_SCALED=0, MX_PTX=0)
            for c in _product(gemv_space or GEMV_SPACE)
            if c["BLOCK_SIZE_N"] * c["BLOCK_SIZE_K"] // 8 <= 32 * 32 * c["num_warps"]
        ]
        # In the default's key order, as every other config: the report's config text reads alike.
        configs = [{k: c[k] for k in default} for c in gemv] + configs
    return configs


def _product(space: dict) -> list:
    """Every config of a space (key -> values), in the space's key order."""
    keys = list(space)
    return [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]


def default_config(fmt: str, M: int, E: int) -> dict:
    config = dict(vllm_default_config(M, E), SWAP_AB=0, SPLIT_K=1)
    return dict(config, DOT_SCALED=0, MX_PTX=0, GEMV=0) if fmt == "mxfp4" else config


def with_default_first(fmt: str, M: int, E: int, configs: list) -> list:
    default = default_config(fmt, M, E)
    return [default] + [c for c in configs if c != default]


# --------------------------------------------------------------------------
# runs


class Budget:
    """The run's time budget, shared out between shapes as they start."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.seconds - self.elapsed()


def run_one(problem, inputs, expected, method, config, tol, timing: Timing, cold=True, graph=False):
    """Bind, check and time (cold and/or graph, as asked) one method and config.
    Never raises: an error or a failed check is recorded in the row."""
    row = {"method": method, "config": config}
    started = time.perf_counter()
    try:
        launch = problem.methods()[method].bind(problem, inputs, config)
        launch.out.fill_(float("nan"))  # the worker poisons the output before the check
        launch()
        timing.sync()
        # Bind and first launch: seconds here mean the kernels were compiled in this process.
        row["first_s"] = round(time.perf_counter() - started, 3)
        result = compare(launch.out, expected, **tol)
        row["check"] = {k: result[k] for k in ("passed", "max_abs_err", "mismatch_frac", "nan_count")}
        if not result["passed"]:
            return row
        if cold:
            row["cold"] = timing.cold(launch)
        if graph:
            row["graph"] = timing.graph(Prepared(method, problem, inputs, launch))
    except Exception as exc:  # noqa: BLE001 - a benchmark records and goes on
        text = str(exc).strip()
        row["error"] = f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"
    finally:
        try:
            timing.sync()
        except Exception as exc:  # noqa: BLE001 - a fault in the kernel surfaces here
            row.setdefault("error", f"{type(exc).__name__} at synchronize: {str(exc)[:300]}")
    return row


def measure_shape(shape, fmt, configs, ctx, deadline) -> dict:
    """The sweep of one shape in tunelab's call (vLLM's default config first),
    graph retimes of the best, and for fp8 vLLM's call structure."""
    started = time.perf_counter()
    problem = FusedMoE(shape)
    inputs = problem.inputs(0, ctx["device"])
    expected = problem.reference(inputs)
    ctx["timing"].sync()
    nbytes = float(problem.bytes_for(inputs))
    bound_us = nbytes / (ctx["peak_gbs"] * 1e9) * 1e6
    tol = TOLERANCE[fmt]
    entry = {
        "format": fmt,
        "shape": shape,
        "bytes": nbytes,
        "bound_us": bound_us,
        "configs": len(configs),
        "data_s": round(time.perf_counter() - started, 2),
    }
    entry["compile_s"] = 0.0
    rows = []
    for i, config in enumerate(configs):
        if i > 0 and time.perf_counter() > deadline:  # vLLM's default always runs
            break
        if ctx["compiler"] is not None and i % COMPILE_BATCH == 0:
            # In batches, so that compiling counts against the shape's share as timing does.
            t0 = time.perf_counter()
            ctx["compiler"](shape, "fused_moe", configs[i : i + COMPILE_BATCH])
            entry["compile_s"] = round(entry["compile_s"] + time.perf_counter() - t0, 2)
        rows.append(run_one(problem, inputs, expected, "fused_moe", config, tol, ctx["timing"]))
        if (i + 1) % 10 == 0:
            best = best_by(rows, cold_us)
            progress(
                ctx, f"  {i + 1}/{len(configs)} configs, best cold {'-' if best is None else f'{cold_us(best):.1f}'} µs"
            )
    rows[0]["role"] = "vLLM's default config"
    entry["rows"] = rows
    entry["cut_by_budget"] = len(configs) - len(rows)
    # Graph retimes: vLLM's default and the best cold configs (bound again: launches are not kept).
    ranked = sorted((r for r in rows if cold_us(r) is not None), key=cold_us)
    retime = _unique(([rows[0]] if cold_us(rows[0]) is not None else []) + ranked[:GRAPH_TOP])
    for row in retime:
        if time.perf_counter() > deadline and row is not rows[0] and row is not ranked[0]:
            continue  # past the shape's share: only the default and the best
        again = run_one(
            problem, inputs, expected, "fused_moe", row["config"], tol, ctx["timing"], cold=False, graph=True
        )
        row["graph"] = again.get("graph") or {"error": again.get("error") or "check failed on the retime"}
    entry["best_cold"] = ranked[0] if ranked else None
    entry["best_graph"] = best_by(rows, graph_us)
    if fmt == "fp8":
        # vLLM's call has no operand swap and no K split: its configs are the tiles alone.
        keys = [k for k in rows[0]["config"] if k not in ("SWAP_AB", "SPLIT_K")]
        top = 1 if ctx["smoke"] else VLLM_TOP
        vcfgs = _unique([{k: r["config"][k] for k in keys} for r in [rows[0]] + ranked[:top]])
        if ctx["compiler"] is not None:
            ctx["compiler"](shape, "fused_moe_vllm", vcfgs)
        entry["vllm_structure"] = []
        for j, config in enumerate(vcfgs):
            if j > 1 and time.perf_counter() > deadline:  # the default and the best always run
                break
            entry["vllm_structure"].append(
                run_one(problem, inputs, expected, "fused_moe_vllm", config, tol, ctx["timing"], graph=True)
            )
    entry["seconds"] = round(time.perf_counter() - started, 2)
    del inputs, expected
    if ctx["gpu"]:
        torch.cuda.empty_cache()
    return entry


def measure_plain(shape, ctx) -> dict:
    """The same shape with unquantised weights in the activation dtype, vLLM's default config."""
    started = time.perf_counter()
    problem = FusedMoE(shape)
    inputs = problem.inputs(0, ctx["device"])
    expected = problem.reference(inputs)
    nbytes = float(problem.bytes_for(inputs))
    bound_us = nbytes / (ctx["peak_gbs"] * 1e9) * 1e6
    config = vllm_default_config(shape["M"], shape["E"])
    if ctx["compiler"] is not None:
        ctx["compiler"](shape, "fused_moe", [config])
    row = run_one(problem, inputs, expected, "fused_moe", config, TOLERANCE["plain"], ctx["timing"], graph=True)
    del inputs, expected
    if ctx["gpu"]:
        torch.cuda.empty_cache()
    return {
        "shape": shape,
        "bytes": nbytes,
        "bound_us": bound_us,
        "row": row,
        "seconds": round(time.perf_counter() - started, 2),
    }


def _unique(items):
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def progress(ctx, text):
    print(f"[{ctx['budget'].elapsed():6.1f} s] {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# main


def parse_ms(text: str) -> list:
    return [int(v) for v in text.split(",") if v.strip()]


def plan_shapes(args) -> list:
    """[(format, shape, weight)] in the order they run: the goal shapes first
    (MXFP4 at M=1, then fp8), then MXFP4's other M; weight: 2 for a goal
    shape, else 1 (a shape's share of the time budget is its weight times
    its number of configs, relative to the shapes still to run)."""
    base = {"E": args.E, "topk": args.topk, "K": args.K, "N": args.N, "act_dtype": args.act_dtype}
    mx = [("mxfp4", dict(base, M=m, dtype="mxfp4", activation="swiglu_oai")) for m in parse_ms(args.mxfp4_m)]
    fp8 = [
        ("fp8", dict(base, M=m, dtype="fp8", weight_quant="per_tensor", activation="silu"))
        for m in parse_ms(args.fp8_m)
    ]
    first = [s for s in mx if s[1]["M"] == 1]
    rest = [s for s in mx if s[1]["M"] != 1]
    out = []
    for fmt, shape in first + fp8 + rest:
        lo, hi = GOALS[fmt][1]
        out.append((fmt, shape, 2.0 if lo <= shape["M"] <= hi else 1.0))
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output directory (default results/bench/<device>/)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CPU smoke run under Triton's interpreter: tiny shapes, a few configs, fp16",
    )
    ap.add_argument("--E", type=int)
    ap.add_argument("--N", type=int)
    ap.add_argument("--K", type=int)
    ap.add_argument("--topk", type=int)
    ap.add_argument("--act-dtype", help="activation dtype: bf16 (default) or fp16 (--smoke's default)")
    ap.add_argument("--mxfp4-m", help="M values of the MXFP4 shapes (default 1,4,16,64; --smoke 1)")
    ap.add_argument("--fp8-m", help="M values of the fp8 shapes (default 8,16,32,64,128,256; --smoke 2)")
    ap.add_argument(
        "--no-bf16", dest="plain", action="store_false", help="skip the unquantised weights (run last, if time is left)"
    )
    ap.add_argument(
        "--budget-s", type=float, default=390.0, help="start no new work after this many seconds (default %(default)s)"
    )
    ap.add_argument("--peak", type=float, help="peak bandwidth in GB/s (default: by device name)")
    ap.add_argument(
        "--compile-jobs",
        type=int,
        default=min(16, os.cpu_count() or 1),
        help="compile workers ahead of timing (0: compile in this process on first use)",
    )
    args = ap.parse_args(argv)
    smoke = {"E": 8, "N": 32, "K": 64, "topk": 2, "act_dtype": "fp16", "mxfp4_m": "1", "fp8_m": "2"}
    full = {
        "E": 128,
        "N": 2880,
        "K": 2880,
        "topk": 4,
        "act_dtype": "bf16",
        "mxfp4_m": "1,4,16,64",
        "fp8_m": "8,16,32,64,128,256",
    }
    for key, value in (smoke if args.smoke else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.smoke and args.act_dtype == "bf16":
        ap.error("--smoke runs Triton's interpreter, whose bf16 can be wrong: use fp16 (or fp32 with --mxfp4-m '')")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        gpu = False
        interpreter.install()  # as tunelab's workers run the interpreter
        device, name = torch.device("cpu"), "CPU (Triton interpreter)"
        peak = args.peak or 10.0  # nominal: the smoke run's % of bound only exercises the arithmetic
        flush_bytes, rule, compiler, sm_count = 0, SMOKE_RULE, None, None
        smem, space, split_ks, gemv_space = SM90_SMEM, SMOKE_SPACE, SMOKE_SPLIT_K_VALUES, SMOKE_GEMV_SPACE
    else:
        if os.environ.get("TRITON_INTERPRET", "0") == "1":
            sys.exit("quant_moe: TRITON_INTERPRET=1 is set; unset it, or pass --smoke for the CPU run")
        if not torch.cuda.is_available():
            sys.exit("quant_moe: no CUDA GPU visible (--smoke runs on the CPU)")
        gpu, device = True, torch.device("cuda")
        name = torch.cuda.get_device_name()
        props = torch.cuda.get_device_properties(0)
        peak = args.peak or peak_bandwidth_gbs(
            name, getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None)
        )
        if peak is None:
            sys.exit(f"quant_moe: no peak bandwidth known for {name!r}; pass --peak GB/s")
        flush_bytes = max(2 * getattr(props, "L2_cache_size", 50 << 20), 32 << 20)
        smem = getattr(props, "shared_memory_per_block_optin", 0) or SM90_SMEM
        rule, space, sm_count, split_ks = GPU_RULE, SPACE, props.multi_processor_count, SPLIT_K_VALUES
        gemv_space = GEMV_SPACE
        compiler = None
        if args.compile_jobs > 0:
            from moe_methods import Compiler  # bench/moe_methods.py: the runner's compile pool, in small

            major, minor = torch.cuda.get_device_capability()
            compiler = Compiler(args.compile_jobs, f"cuda:{major}{minor}:{props.warp_size}")
    out_dir = Path(args.out) if args.out else REPO / "results" / "bench" / vllm_device_name(name)
    budget = Budget(args.budget_s)
    ctx = {
        "device": device,
        "gpu": gpu,
        "smoke": args.smoke,
        "peak_gbs": peak,
        "timing": Timing(gpu, flush_bytes, rule),
        "compiler": compiler,
        "budget": budget,
    }
    report = {
        "meta": {
            "device": name,
            "date": datetime.date.today().isoformat(),
            "smoke": args.smoke,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "peak_gbs": peak,
            "flush_bytes": flush_bytes,
            "graph_calls": rule.graph_calls,
            "sm_count": sm_count,
            "smem_bytes": smem,
            "K": args.K,
            "topk": args.topk,
            "act_dtype": args.act_dtype,
            "budget_s": args.budget_s,
            "wall_s": 0.0,
            "compile_jobs": args.compile_jobs if gpu else 0,
            "command": "python3 bench/quant_moe.py " + " ".join(sys.argv[1:] if argv is None else argv),
        },
        "shapes": [],
        "plain": [],
        "skipped": [],
    }
    plan = plan_shapes(args)
    progress(
        ctx,
        f"{name}: {len(plan)} quantised shapes, peak {peak:.0f} GB/s, budget {args.budget_s:.0f} s, writing {out_dir}",
    )
    # Each shape's claim on the budget: its weight times its number of configs.
    sweeps = [
        with_default_first(
            fmt,
            shape["M"],
            shape["E"],
            sweep(fmt, shape["M"], shape["topk"], shape["E"], smem, space, split_ks, gemv_space),
        )
        for fmt, shape, _ in plan
    ]
    if args.smoke:
        # The interpreter runs MX_PTX=1 as MX_PTX=0 and GEMV=2 as GEMV=1 (PTX
        # does not run there): timing them would run the same arithmetic twice.
        sweeps = [[c for c in configs if not c.get("MX_PTX") and c.get("GEMV", 0) != 2] for configs in sweeps]
    claims = [weight * len(configs) for (_, _, weight), configs in zip(plan, sweeps)]
    for i, ((fmt, shape, _), configs) in enumerate(zip(plan, sweeps)):
        label = f"{fmt} {shape_label(shape)}"
        left = budget.left()
        if left <= 0:
            report["skipped"].append(label)
            progress(ctx, f"{label}: skipped, time budget spent")
            continue
        share = left * claims[i] / sum(claims[i:])
        progress(ctx, f"{label}: {len(configs)} configs, up to {share:.0f} s")
        try:
            entry = measure_shape(shape, fmt, configs, ctx, time.perf_counter() + share)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory building the inputs; the rest still runs
            report["skipped"].append(f"{label} ({type(exc).__name__}: {str(exc).strip()[:200]})")
            progress(ctx, f"{label}: failed: {type(exc).__name__}: {exc}")
            continue
        report["shapes"].append(entry)
        report["meta"]["wall_s"] = budget.elapsed()
        if compiler is not None:
            report["meta"].update(compile_s=compiler.seconds, compile_failures=compiler.failures[:20])
        write(report, out_dir)
        best = entry["best_cold"]
        progress(
            ctx,
            f"{label}: {len(entry['rows'])} of {len(configs)} configs in {entry['seconds']:.1f} s; best "
            f"cold {fmt_us(cold_us(best))} µs, {fmt_pct(pct(entry['bound_us'], cold_us(best)))} % of "
            f"{entry['bound_us']:.1f} µs",
        )
    if args.plain:
        pairs = _unique([(shape["M"], shape["activation"]) for _, shape, _ in plan])
        for M, activation in pairs:
            shape = {
                "M": M,
                "E": args.E,
                "topk": args.topk,
                "K": args.K,
                "N": args.N,
                "dtype": args.act_dtype,
                "activation": activation,
            }
            label = f"unquantised {shape_label(shape)} {activation}"
            if budget.left() <= 0:
                report["skipped"].append(label)
                continue
            try:
                p = measure_plain(shape, ctx)
            except Exception as exc:  # noqa: BLE001
                report["skipped"].append(f"{label} ({type(exc).__name__}: {str(exc).strip()[:200]})")
                continue
            report["plain"].append(p)
            report["meta"]["wall_s"] = budget.elapsed()
            write(report, out_dir)
            progress(
                ctx,
                f"{label}: cold {fmt_us(cold_us(p['row']))} µs, "
                f"{fmt_pct(pct(p['bound_us'], cold_us(p['row'])))} % of {p['bound_us']:.1f} µs",
            )
    if compiler is not None:
        compiler.close()
        report["meta"].update(compile_s=compiler.seconds, compile_failures=compiler.failures[:20])
    report["meta"]["wall_s"] = budget.elapsed()
    write(report, out_dir)
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
