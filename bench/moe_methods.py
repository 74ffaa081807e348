#!/usr/bin/env python3
"""tunelab's MoE methods against each other on one GPU, cold and under graph timing.

A benchmark, not a test. For each shape (default: gpt-oss, K=2880, topk=4,
bf16, SiLU-and-mul; E=128 N=360 M in {1, 8, 64} and E=128 N=2880 M in {1, 64})
it times:

- `fused_moe`: tunelab's call (dependent launches, self-alignment at a few
  tokens) with vLLM's default config;
- `fused_moe_vllm`: the same kernels in vLLM's call structure (five plain
  launches), vLLM's default config;
- `fused_moe_persistent`: the one-launch kernel, over a small sweep of its own
  configs, or for the --search shapes a coordinate descent over them (the
  best per timing is reported, every config tried is in the JSON);
- `fused_moe_persistent_gemv`: the same method's GEMV schedule (`GEMV: 1`),
  over experiments/gptoss.yaml's `persistent_gemv` space, at shapes of at
  most 8 (token, expert) slots (that method's constraints; none above);
- `torch`: torch's grouped GEMM (or its batched fallback; the path is named).

Each method's output is first checked against the problem's reference (the
tolerance of experiments/gptoss.yaml); only passing methods are timed, with
the worker's own timers (tunelab.worker.CudaEventTimer):

- cold: an event pair around each launch, L2 flushed by reading 2x its size
  before every sample (the runner's default `flush_with: read`), batches of
  32 behind a spin kernel; the median is reported;
- graph: GRAPH_CALLS launches captured in one CUDA graph, each sample one
  replay / GRAPH_CALLS, no flush (the worker's `timing: graph`, how vLLM's
  benchmark times a config); the median is reported.

% of bound: the bytes the routing's selected experts and the activations
take (`FusedMoE.bytes_for`) at the peak bandwidth (--peak GB/s; 3350 for an
H100 SXM, 4800 for an H200 by default), over the time.

Triton kernels are compiled first by compile workers (`python -m
tunelab.worker --role compile --target ...`, a pool of --compile-jobs kept
for the run, no GPU), as tunelab's runner does; the timed process finds them
in Triton's cache.

    PYTHONPATH=python python3 bench/moe_methods.py --out moe_methods.json
        [--shapes 128:360:1,128:2880:64] [--peak 3350] [--samples 64] [--graph-calls 10]
        [--sweep quick|one] [--search 128:360:1] [--compile-jobs 16]

Writes the JSON to --out (after every shape, so a run cut short keeps what it
measured) and the markdown next to it (same name, .md); prints the markdown.
"""

import argparse
import datetime
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402
import triton  # noqa: E402

from tunelab.compare import compare  # noqa: E402
from tunelab.kernels.fused_moe import PERSISTENT_CONFIG_KEYS, persistent_default_config  # noqa: E402
from tunelab.problems.moe import FusedMoE, vllm_default_config  # noqa: E402
from tunelab.worker import CudaEventTimer, Prepared  # noqa: E402

PEAK_GBS = {"H100": 3350.0, "H200": 4800.0}
TOLERANCE = {"atol": 2e-2, "rtol": 2e-2, "max_mismatch": 0.005}  # experiments/gptoss.yaml
BATCH = 32
DEFAULT_SHAPES = "128:360:1,128:360:8,128:360:64,128:2880:1,128:2880:64"


def persistent_sweep(M: int, N: int, kind: str) -> list:
    """The persistent configs tried for one shape (quick): the default and
    one-key variations of it (tile widths, K slices, programs per SM,
    prefetch, warps); or the default alone (one)."""
    base = persistent_default_config(M, N)
    if kind == "one":
        return [base]
    variations = [
        {},
        {"BLOCK_SIZE_N": 32},
        {"BLOCK_SIZE_N": 128},
        {"BLOCK_SIZE_K": 64},
        {"BLOCK_SIZE_N2": 32},
        {"BLOCK_SIZE_N2": 128},
        {"SPLIT_K": 1},
        {"SPLIT_K": 2},
        {"PROGRAMS_PER_SM": 2},
        {"PROGRAMS_PER_SM": 4},
        {"PREFETCH_W2": 1 - base["PREFETCH_W2"]},
        {"num_warps": 8},
    ]
    if M >= 64:
        variations += [{"BLOCK_SIZE_M": 64, "num_warps": 8}, {"BLOCK_SIZE_M": 16}]
    return _unique(dict(base, **change) for change in variations)


# experiments/gptoss.yaml's persistent_gemv method: its space, params and constraints.
GEMV_SPACE = {"BLOCK_SIZE_N": (4, 8, 16), "BLOCK_SIZE_N2": (2, 4, 8, 16), "num_warps": (4, 8)}


def gemv_sweep(M: int, N: int, K: int, topk: int) -> list:
    """The GEMV schedule's configs for one shape (the manifest's, so the bench
    and a `tunelab run` rank the same set); [] above 8 slots."""
    if M * topk > 8:
        return []
    out = []
    for bn in GEMV_SPACE["BLOCK_SIZE_N"]:
        for bn2 in GEMV_SPACE["BLOCK_SIZE_N2"]:
            for warps in GEMV_SPACE["num_warps"]:
                if bn * K <= 6144 * warps and bn2 * N <= 6144:
                    out.append(
                        dict(
                            persistent_default_config(M, N),
                            GEMV=1,
                            PROGRAMS_PER_SM=8,
                            BLOCK_SIZE_N=bn,
                            BLOCK_SIZE_N2=bn2,
                            num_warps=warps,
                        )
                    )
    return out


# The bench's rows that run another method's kernel: (method, what it binds).
BINDS = {"fused_moe_persistent_gemv": "fused_moe_persistent"}
SWEPT = ("fused_moe_persistent", "fused_moe_persistent_gemv")


def _unique(configs) -> list:
    out = []
    for config in configs:
        if config not in out:
            out.append(config)
    return out


# Coordinate descent (--search): each round tries every value of one group of
# keys with the others at the best so far, and keeps the best by cold + graph.
SEARCH_ROUNDS = [
    ("BLOCK_SIZE_N", "SPLIT_K"),
    ("BLOCK_SIZE_K", "num_stages"),
    ("BLOCK_SIZE_N2", "BLOCK_SIZE_K2"),
    ("PROGRAMS_PER_SM",),
    ("PREFETCH_W2", "num_warps"),
    ("BLOCK_SIZE_N", "SPLIT_K"),
]
SEARCH_VALUES = {
    # Tile width and K slices together: they set how many GEMM 1 items there are, and how big.
    ("BLOCK_SIZE_N", "SPLIT_K"): [(n, k) for n in (16, 32, 64, 128) for k in (1, 2, 3, 4, 6)],
    ("BLOCK_SIZE_K", "num_stages"): [(64, 4), (64, 6), (128, 3), (128, 4), (128, 6), (256, 3)],
    ("BLOCK_SIZE_N2", "BLOCK_SIZE_K2"): [(32, 64), (64, 64), (64, 128), (128, 64), (32, 128)],
    ("PROGRAMS_PER_SM",): [(1,), (2,), (3,), (4,)],
    ("PREFETCH_W2", "num_warps"): [(0, 4), (1, 4), (1, 8), (0, 8)],
}


# --------------------------------------------------------------------------
# compiling ahead, as the runner's compile pool does


class CompileWorker:
    """One `python -m tunelab.worker --role compile --target T` child."""

    def __init__(self, target: str):
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"), CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
        env.pop("TRITON_INTERPRET", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tunelab.worker", "--role", "compile", "--target", target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.next_id = 0

    def compile(self, job: dict) -> dict:
        self.next_id += 1
        self.proc.stdin.write((json.dumps({"id": self.next_id, "op": "compile", "job": job}) + "\n").encode())
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"ok": False, "message": "compile worker exited"}

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - best effort at exit
            self.proc.kill()


class Compiler:
    """Compile jobs ahead with a pool of compile workers kept for the whole run
    (none when workers=0: each job then compiles on first use, in the lane)."""

    def __init__(self, workers: int, target: str):
        self.target = target
        self.pool = [CompileWorker(target) for _ in range(max(0, workers))]
        self.seconds, self.failures, self.jobs = 0.0, [], 0

    def __call__(self, shape: dict, method: str, configs: list):
        if not self.pool or method == "torch" or not configs:
            return
        started = time.perf_counter()
        todo = queue.Queue()
        for config in configs:
            self.jobs += 1
            todo.put(
                {
                    "job_id": f"{method}-{self.jobs}",
                    "problem": "moe",
                    "shape": shape,
                    "method": {"name": method, "kernel": BINDS.get(method, method)},
                    "config": config,
                }
            )

        def serve(worker):
            while True:
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                response = worker.compile(job)
                if not response.get("ok"):
                    self.failures.append((job["job_id"], job["config"], response.get("message")))

        threads = [threading.Thread(target=serve, args=(w,)) for w in self.pool[: len(configs)]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.seconds += time.perf_counter() - started

    def close(self):
        for worker in self.pool:
            worker.close()


# --------------------------------------------------------------------------
# timing


class Timing:
    def __init__(self, flush_bytes: int, samples: int, graph_calls: int):
        self.timer = CudaEventTimer(torch)
        self.flush_bytes = flush_bytes
        self.samples = samples
        self.graph_calls = graph_calls

    def cold(self, launch) -> float:
        self.timer.warmup(launch, 5, 5.0)
        times = []
        while len(times) < self.samples:
            us, _ = self.timer.sample(launch, min(BATCH, self.samples - len(times)), self.flush_bytes, "read")
            times += us
        return statistics.median(times)

    def graph(self, prepared) -> float:
        times = []
        while len(times) < self.samples:
            us, _ = self.timer.sample_graph(prepared, min(BATCH, self.samples - len(times)), self.graph_calls)
            times += us
        return statistics.median(times)


def run_one(problem, inputs, expected, method: str, config: dict, timing: Timing) -> dict:
    """Bind, check, time one method and config. Never raises: failures are recorded."""
    row = {"config": config}
    try:
        launch = problem.methods()[BINDS.get(method, method)].bind(problem, inputs, config)
        launch.out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        result = compare(launch.out, expected, **TOLERANCE)
        row["check"] = {k: result[k] for k in ("passed", "max_abs_err", "mismatch_frac", "nan_count")}
        for attr in ("path", "path_reason", "grid", "n_regs", "shared", "driver_resident"):
            if getattr(launch, attr, None) is not None:
                row[attr] = getattr(launch, attr)
        if hasattr(launch, "timed_out") and launch.timed_out():
            row["error"] = "an in-kernel wait timed out"
            return row
        if not result["passed"]:
            return row
        row["cold_us"] = timing.cold(launch)
        row["graph_us"] = timing.graph(Prepared(f"{method}", problem, inputs, launch))
        if hasattr(launch, "workspace_clear"):
            row["workspace_clear"] = launch.workspace_clear()
    except Exception as exc:  # noqa: BLE001 - a benchmark reports and moves on
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    finally:
        torch.cuda.synchronize()
    return row


def best(rows: list, key: str):
    timed = [r for r in rows if key in r]
    return min(timed, key=lambda r: r[key]) if timed else None


def search(problem, inputs, expected, shape, timing: Timing, compiler: Compiler) -> list:
    """Coordinate descent over the persistent configs (SEARCH_ROUNDS), from the
    default; every row tried is returned, each with its round."""
    method = "fused_moe_persistent"
    score = lambda r: r["cold_us"] + r["graph_us"]  # noqa: E731
    current = persistent_default_config(shape["M"], shape["N"])
    # The default first: the report's "default config" row is the sweep's first.
    compiler(shape, method, [current])
    first = run_one(problem, inputs, expected, method, current, timing)
    first["round"] = "default"
    rows, seen = [first], {json.dumps(current, sort_keys=True): first}
    for number, keys in enumerate(SEARCH_ROUNDS):
        candidates = _unique(dict(current, **dict(zip(keys, values))) for values in SEARCH_VALUES[keys])
        fresh = [c for c in candidates if json.dumps(c, sort_keys=True) not in seen]
        compiler(shape, method, fresh)
        for config in fresh:
            row = run_one(problem, inputs, expected, method, config, timing)
            row["round"] = number
            rows.append(row)
            seen[json.dumps(config, sort_keys=True)] = row
        timed = [seen[json.dumps(c, sort_keys=True)] for c in candidates]
        timed = [r for r in timed if "cold_us" in r]
        if timed:
            current = dict(min(timed, key=score)["config"])
        print(f"  search round {number} {keys}: best {current}", file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------
# report


def fmt(us, bound_us):
    return ("-", "-") if us is None else (f"{us:.1f}", f"{100 * bound_us / us:.1f}")


def markdown(report: dict) -> str:
    meta = report["meta"]
    out = [f"# tunelab MoE methods on {meta['device']}", ""]
    out.append(
        f"Measured {meta['date']} on {meta['device']} (torch {meta['torch']}, Triton {meta['triton']}), "
        f"`{meta['command']}`. Medians of {meta['samples']} samples, µs per call. "
        f"cold: L2 flushed by a read of {meta['flush_bytes'] / 2**20:.0f} MiB before each sample; "
        f"graph: {meta['graph_calls']} calls in one CUDA graph, no flush. % of bound: the selected experts' "
        f"bytes and the activations at {meta['peak_gbs']:.0f} GB/s. fused_moe and fused_moe_vllm run vLLM's "
        "default config; fused_moe_persistent has two rows: its default config (what a job naming no "
        "config runs), and the best of its sweep or search for each timing; fused_moe_persistent_gemv "
        "(its GEMV schedule) the best of its sweep for each timing (configs under the table)."
    )
    out.append("")
    out.append("| shape | bound µs | method | cold µs | % bound | graph µs | % bound | max abs err |")
    out.append("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    notes = []
    for entry in report["shapes"]:
        s, bound = entry["shape"], entry["bound_us"]
        label = f"E={s['E']} N={s['N']} M={s['M']}"
        for method, result in entry["methods"].items():
            if method in SWEPT:
                if method == "fused_moe_persistent":
                    default = result["sweep"][0]  # the first config tried is always the default
                    c, cp = fmt(default.get("cold_us"), bound)
                    g, gp = fmt(default.get("graph_us"), bound)
                    err = default.get("check", {}).get("max_abs_err")
                    out.append(
                        f"| {label} | {bound:.1f} | {method} (default config) | {c} | {cp} | {g} | {gp} | "
                        f"{'-' if err is None else f'{err:.3g}'} |"
                    )
                method = f"{method} (best of {len(result['sweep'])})"
                cold_row, graph_row = result["best_cold"], result["best_graph"]
                cold = cold_row["cold_us"] if cold_row else None
                graph = graph_row["graph_us"] if graph_row else None
                err = cold_row["check"]["max_abs_err"] if cold_row else None
                if cold_row:
                    cfg = " ".join(f"{k}={cold_row['config'][k]}" for k in PERSISTENT_CONFIG_KEYS)
                    notes.append(
                        f"- {label} {method}: best cold config {cfg} (grid {cold_row.get('grid')}, "
                        f"{cold_row.get('n_regs')} registers); best graph config "
                        + " ".join(f"{k}={graph_row['config'][k]}" for k in PERSISTENT_CONFIG_KEYS)
                    )
                failed = [r for r in result["sweep"] if "cold_us" not in r]
                if failed:
                    notes.append(
                        f"- {label}: {len(failed)} {method} configs not timed: "
                        + "; ".join(r.get("error") or f"check failed {r.get('check')}" for r in failed[:3])
                    )
            else:
                cold, graph = result.get("cold_us"), result.get("graph_us")
                err = result.get("check", {}).get("max_abs_err")
                if "error" in result or not result.get("check", {}).get("passed", False):
                    notes.append(
                        f"- {label} {method}: {result.get('error') or 'check failed ' + str(result.get('check'))}"
                    )
            name = method + (f" ({result['path']})" if method == "torch" and "path" in result else "")
            c, cp = fmt(cold, bound)
            g, gp = fmt(graph, bound)
            out.append(
                f"| {label} | {bound:.1f} | {name} | {c} | {cp} | {g} | {gp} | {'-' if err is None else f'{err:.3g}'} |"
            )
    out.append("")
    if notes:
        out += notes + [""]
    return "\n".join(out) + "\n"


def write(report: dict, out: Path):
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="E:N:M,... (default %(default)s)")
    ap.add_argument("--K", type=int, default=2880)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--activation", default="silu")
    ap.add_argument("--peak", type=float, help="peak bandwidth in GB/s (default: by device name)")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--graph-calls", type=int, default=10)
    ap.add_argument(
        "--sweep",
        choices=("quick", "one"),
        default="quick",
        help="persistent configs: one-key variations of the default (quick) or the default only",
    )
    ap.add_argument(
        "--methods", default="fused_moe,fused_moe_vllm,fused_moe_persistent,fused_moe_persistent_gemv,torch"
    )
    ap.add_argument(
        "--search",
        default="",
        help="E:N:M,... shapes whose persistent configs are searched by coordinate descent "
        "(SEARCH_ROUNDS) instead of the --sweep list",
    )
    ap.add_argument(
        "--compile-jobs",
        type=int,
        default=min(16, os.cpu_count() or 1),
        help="compile workers ahead of timing (0: compile in this process, on first use)",
    )
    ap.add_argument("--out", required=True, help="JSON path; the markdown goes next to it (.md)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("moe_methods: no CUDA GPU visible")
    name = torch.cuda.get_device_name()
    peak = args.peak or next((v for k, v in PEAK_GBS.items() if k in name), None)
    if peak is None:
        sys.exit(f"moe_methods: no peak bandwidth known for {name!r}; pass --peak GB/s")
    props = torch.cuda.get_device_properties(0)
    flush_bytes = max(2 * getattr(props, "L2_cache_size", 50 << 20), 32 << 20)
    methods = args.methods.split(",")

    shapes = []
    for item in args.shapes.split(","):
        E, N, M = (int(v) for v in item.split(":"))
        shapes.append(
            {"M": M, "E": E, "topk": args.topk, "K": args.K, "N": N, "dtype": args.dtype, "activation": args.activation}
        )

    def configs_for(method, shape):
        if method in ("fused_moe", "fused_moe_vllm"):
            return [vllm_default_config(shape["M"], shape["E"])]
        if method == "fused_moe_persistent":
            return persistent_sweep(shape["M"], shape["N"], args.sweep)
        if method == "fused_moe_persistent_gemv":
            return gemv_sweep(shape["M"], shape["N"], shape["K"], shape["topk"])
        return [{}]

    major, minor = torch.cuda.get_device_capability()
    compiler = Compiler(args.compile_jobs, f"cuda:{major}{minor}:{props.warp_size}")
    searched = {tuple(int(v) for v in item.split(":")) for item in args.search.split(",") if item}

    report = {
        "meta": {
            "device": name,
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "peak_gbs": peak,
            "samples": args.samples,
            "graph_calls": args.graph_calls,
            "flush_bytes": flush_bytes,
            "sm_count": props.multi_processor_count,
            "compile_s": None,
            "compile_failures": None,
            "command": "python3 bench/moe_methods.py " + " ".join(sys.argv[1:]),
        },
        "shapes": [],
    }
    timing = Timing(flush_bytes, args.samples, args.graph_calls)
    out = Path(args.out)
    for shape in shapes:
        started = time.perf_counter()
        problem = FusedMoE(shape)
        inputs = problem.inputs(0, "cuda")
        expected = problem.reference(inputs)
        nbytes = problem.bytes_for(inputs)
        entry = {"shape": shape, "bytes": nbytes, "bound_us": nbytes / (peak * 1e9) * 1e6, "methods": {}}
        for method in methods:
            if method == "fused_moe_persistent" and (shape["E"], shape["N"], shape["M"]) in searched:
                rows = search(problem, inputs, expected, shape, timing, compiler)
            else:
                compiler(shape, method, configs_for(method, shape))
                rows = [
                    run_one(problem, inputs, expected, method, config, timing) for config in configs_for(method, shape)
                ]
            if method == "fused_moe_persistent_gemv" and not rows:
                continue  # more slots than the GEMV schedule is meant for
            if method in SWEPT:
                entry["methods"][method] = {
                    "best_cold": best(rows, "cold_us"),
                    "best_graph": best(rows, "graph_us"),
                    "sweep": rows,
                }
            else:
                entry["methods"][method] = rows[0]
            torch.cuda.empty_cache()
        entry["seconds"] = time.perf_counter() - started
        report["shapes"].append(entry)
        report["meta"].update(
            compile_s=compiler.seconds, compile_jobs=compiler.jobs, compile_failures=compiler.failures
        )
        write(report, out)
        print(
            f"{shape['E']}:{shape['N']}:{shape['M']} done in {entry['seconds']:.1f} s "
            f"(compiling so far {compiler.seconds:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
        del inputs, expected
        torch.cuda.empty_cache()
    compiler.close()
    print(markdown(report))


if __name__ == "__main__":
    main()
