#!/usr/bin/env python3
"""Where a fused-MoE call spends its time at decode sizes, on one GPU.

For each shape (default: gpt-oss-120b, E=128 N=2880, M = 1, 2, 4, 8) and its
tuned config (from a vLLM config file written by `just tune gptoss`, else
vLLM's default), this times:

- tunelab's whole call as it runs by default, and the plain four-kernel call
  (alignment, GEMM 1, GEMM 2, top-k sum, no dependent launches) with each of
  its kernels alone;
- a plain streaming read of exactly the expert weights the call must read
  (the selected experts' w1 and w2): the bandwidth this GPU delivers to a
  kernel that does nothing else, the practical ceiling for the GEMMs;
- each of these under three L2 states before every sample: after a memset of
  the flush buffer (`flush_with: memset`: L2 full of dirty lines that must be
  written back while the kernel runs), after a read of it (the runner's
  default: L2 full of clean lines) and with no flush at all;
- the call replayed back to back in a CUDA graph (hot, launch gaps hidden).

Byte counts use the experts this routing actually selects, not the expected
number. Peak bandwidth: 3350 GB/s (H100 SXM) or 4800 GB/s (H200).

    PYTHONPATH=python python3 bench/moe_breakdown.py [--M 1,2,4,8] [--E 128] [--N 2880]
        [--configs results/gptoss/<device>/vllm] [--samples 300]

Writes results/bench/<device>/moe_breakdown.{md,json} and prints the markdown.
"""

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tunelab.kernels.fused_moe import FusedMoELaunch, make_plan  # noqa: E402
from tunelab.problems.moe import CONFIG_KEYS, FusedMoE, vllm_default_config  # noqa: E402
from tunelab.worker import CudaEventTimer  # noqa: E402

PEAK_GBS = {"H100": 3350.0, "H200": 4800.0}
FLUSH_MODES = ("memset", "read", "none")
KERNELS = ("align", "gemm1", "gemm2", "sum")


@triton.jit
def stream_read_kernel(
    base_ptr, experts_ptr, expert_stride, per_expert, out_ptr, BLOCK: tl.constexpr, ITERS: tl.constexpr
):
    # One program reads BLOCK * ITERS contiguous elements of one selected expert.
    e = tl.load(experts_ptr + tl.program_id(0)).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk.to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(base_ptr + e * expert_stride + offs, mask=offs < per_expert, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0) * tl.num_programs(1) + chunk, tl.sum(acc, 0))


def stream_read(weights, experts, block=1024, iters=16):
    """A launch that reads weights[e] for every e in `experts` (contiguous per expert)."""
    per_expert = weights[0].numel()
    chunks = triton.cdiv(per_expert, block * iters)
    out = torch.empty(len(experts) * chunks, dtype=torch.float32, device=weights.device)
    grid = (len(experts), chunks)
    return lambda: stream_read_kernel[grid](
        weights, experts, weights.stride(0), per_expert, out, BLOCK=block, ITERS=iters, num_warps=8
    )


class ColdTimer:
    """Medians of the runner's own timer (tunelab.worker.CudaEventTimer: events
    around each launch, batches of 32 behind a spin kernel so the host never
    paces the GPU), under a chosen L2 treatment before every sample."""

    BATCH = 32

    def __init__(self, l2_bytes):
        self.timer = CudaEventTimer(torch)
        self.flush_bytes = max(2 * l2_bytes, 32 << 20)

    def time(self, fn, mode, samples):
        flush_bytes = 0 if mode == "none" else self.flush_bytes
        flush_with = "read" if mode == "none" else mode
        self.timer.warmup(fn, 5, 5.0)
        times = []
        while len(times) < samples:
            us, _ = self.timer.sample(fn, min(self.BATCH, samples - len(times)), flush_bytes, flush_with)
            times += us
        return statistics.median(times)


def graph_time(fn, replays=20, samples=30):
    """Median µs per call of `fn` captured `replays` times in one CUDA graph (hot L2)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(replays):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / replays)
    return statistics.median(times)


def tuned_config(config_dir, M, E, N, device_name):
    if config_dir:
        path = Path(config_dir) / f"E={E},N={N},device_name={device_name}.json"
        if path.exists():
            table = {int(k): v for k, v in json.loads(path.read_text()).items() if k.isdigit()}
            key = min(table, key=lambda k: abs(k - M))
            return {k: table[key][k] for k in CONFIG_KEYS}, f"tuned ({path.name}, M={key})"
    return vllm_default_config(M, E), "vLLM default"


def measure(shape, config, timer, samples, peak):
    problem = FusedMoE(shape)
    inputs = problem.inputs(seed=0, device="cuda")
    # tunelab's call as it runs by default, and the plain four-kernel call
    # (alignment, GEMM 1, GEMM 2, sum; no dependent launches) whose kernels
    # are also timed one by one.
    launch = FusedMoELaunch(make_plan(problem, config), inputs)
    four = FusedMoELaunch(make_plan(problem, config, self_align_max=0, pdl=False), inputs)
    for call in (launch, four):
        call()
    torch.cuda.synchronize()
    experts = torch.unique(inputs["topk_ids"].reshape(-1)).to(torch.int32)
    distinct = experts.numel()
    es = inputs["x"].element_size()
    act_bytes = 2 * problem.M * problem.K * es
    w1_bytes = distinct * inputs["w1"][0].numel() * es
    w2_bytes = distinct * inputs["w2"][0].numel() * es
    total = w1_bytes + w2_bytes + act_bytes

    read1, read2 = stream_read(inputs["w1"], experts), stream_read(inputs["w2"], experts)

    def read_both():
        read1()
        read2()

    parts = dict(zip(KERNELS, four._runners))
    rows = {}
    for mode in FLUSH_MODES:
        row = {"call": timer.time(launch, mode, samples), "four": timer.time(four, mode, samples)}
        for name, run in parts.items():
            row[name] = timer.time(run, mode, samples)
        row["read_w1"] = timer.time(read1, mode, samples)
        row["read_w2"] = timer.time(read2, mode, samples)
        row["read_both"] = timer.time(read_both, mode, samples)
        rows[mode] = row
    hot = graph_time(launch)
    result = {
        "shape": shape,
        "config": config,
        "distinct_experts": distinct,
        "expected_distinct_experts": problem.expected_distinct_experts(),
        "bytes": total,
        "w1_bytes": w1_bytes,
        "w2_bytes": w2_bytes,
        "bound_us": total / peak / 1e3,
        "plan": {"kernels": len(launch._runners), "pdl": launch.plan.pdl, "self_align": bool(launch.plan.self_align)},
        "times_us": rows,
        "graph_us": hot,
    }
    del launch, inputs
    torch.cuda.empty_cache()
    return result


def markdown(results, meta):
    peak = meta["peak_gbs"]
    out = [f"# Fused MoE at decode sizes: where the time goes ({meta['device']})", ""]
    out.append(
        f"Measured {meta['date']} on {meta['device']} (torch {meta['torch']}, Triton {meta['triton']}), "
        f"`{meta['command']}`. Medians of {meta['samples']} samples, µs. Peak bandwidth used: {peak:.0f} GB/s."
    )
    out.append(
        "Bytes: the experts this routing selects (w1 + w2) plus the activations in and out. "
        "L2 before each sample: *memset* = after a memset of 2×L2 (`flush_with: memset`, the protocol before 2026-11-22), "
        "*read* = after a read of 2×L2 (clean lines; the runner's default), *none* = no flush."
    )
    out.append("")
    for r in results:
        s, c = r["shape"], r["config"]
        cfg = " ".join(f"{k}={c[k]}" for k in CONFIG_KEYS)
        out.append(
            f"## M={s['M']} E={s['E']} N={s['N']}: {r['distinct_experts']} experts selected "
            f"(expected {r['expected_distinct_experts']:.2f}), {r['bytes'] / 1e6:.1f} MB, "
            f"bound {r['bound_us']:.1f} µs"
        )
        out.append("")
        plan = r["plan"]
        parts = [
            "alignment in the GEMMs" if plan["self_align"] else "alignment kernel",
            "dependent launches" if plan["pdl"] else "plain launches",
        ]
        out.append(
            f"Config ({r['config_source']}): {cfg}. tunelab's call: {plan['kernels']} kernels "
            f"({', '.join(parts)}); in a CUDA graph, hot: {r['graph_us']:.1f} µs "
            f"({100 * r['bound_us'] / r['graph_us']:.1f} % of bound)."
        )
        out.append("")
        out.append(
            "| L2 before | call | % of bound | 4-kernel call | align | gemm1 | gemm2 | sum | read w1 | read w2 "
            "| read both | read GB/s |"
        )
        out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for mode in FLUSH_MODES:
            t = r["times_us"][mode]
            read_gbs = (r["w1_bytes"] + r["w2_bytes"]) / t["read_both"] / 1e3
            out.append(
                f"| {mode} | {t['call']:.1f} | {100 * r['bound_us'] / t['call']:.1f} | {t['four']:.1f} | "
                f"{t['align']:.1f} | {t['gemm1']:.1f} | {t['gemm2']:.1f} | {t['sum']:.1f} | "
                f"{t['read_w1']:.1f} | {t['read_w2']:.1f} | {t['read_both']:.1f} | {read_gbs:.0f} |"
            )
        out.append("")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", default="1,2,4,8")
    ap.add_argument("--E", type=int, default=128)
    ap.add_argument("--N", type=int, default=2880)
    ap.add_argument("--configs", help="folder of vLLM config files (default: results/gptoss/<device>/vllm)")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--out", help="folder for moe_breakdown.md/json (default results/bench/<device>)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("moe_breakdown: no CUDA GPU visible")
    name = torch.cuda.get_device_name()
    device_name = "NVIDIA_H200" if "H200" in name else name.replace(" ", "_")
    peak = next((v for k, v in PEAK_GBS.items() if k in name), None)
    if peak is None:
        sys.exit(f"moe_breakdown: no peak bandwidth known for {name!r} (known: {sorted(PEAK_GBS)})")
    config_dir = args.configs or REPO / "results" / "gptoss" / device_name / "vllm"
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    timer = ColdTimer(l2)
    results = []
    for M in (int(m) for m in args.M.split(",")):
        shape = {"M": M, "E": args.E, "topk": 4, "K": 2880, "N": args.N, "dtype": "bf16", "activation": "silu"}
        config, source = tuned_config(config_dir, M, args.E, args.N, device_name)
        r = measure(shape, config, timer, args.samples, peak)
        r["config_source"] = source
        results.append(r)
        print(
            f"M={M}: call {r['times_us']['memset']['call']:.1f} µs (memset) "
            f"{r['times_us']['read']['call']:.1f} µs (read)",
            file=sys.stderr,
            flush=True,
        )
    meta = {
        "device": name,
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "samples": args.samples,
        "peak_gbs": peak,
        "command": "python3 bench/moe_breakdown.py " + " ".join(sys.argv[1:]),
    }
    text = markdown(results, meta)
    out_dir = Path(args.out) if args.out else REPO / "results" / "bench" / device_name
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "moe_breakdown.md").write_text(text)
    (out_dir / "moe_breakdown.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
