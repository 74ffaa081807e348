#!/usr/bin/env python3
"""The fastest a one-launch kernel can move a MoE call's bytes under tunelab's timers (a measurement, not a test).

A bandwidth goal such as "MXFP4 MoE E=128 N=2880 at M=1 >= 70 % of its
bound" is met or missed under a timing protocol. This measures, for each
shape's bandwidth-bound bytes (`tunelab.problems.moe`'s `bytes()`: the
selected experts' weights once, packed bytes and scales, plus the
activations), what a kernel that does nothing but read those bytes takes:

- `no-op`: a one-element add, the launch and timer floor;
- `stream`: the bytes read once as one contiguous buffer, 16 bytes a
  thread, XOR-folded into one word a program so no load is dropped; the
  best of a few block sizes, warp counts and grid sizes (one tile a
  program, or a grid-stride loop over 2, 4 or 8 programs an SM);
- `routed stream` (--routed): the same bytes as a MoE kernel must find
  them. The selected experts' weights lie in a buffer of all E experts
  (each expert's bytes contiguous, the most favourable layout), and each
  program first reads its slot's expert id from `topk_ids` (flushed from
  L2 like everything else) and only then loads its tile. No MoE kernel
  can ask for a weight before it knows which expert it belongs to, so the
  fastest configuration is the floor we take for any of them (a real
  kernel does this and its work besides); the difference from `stream` is
  that one dependent read. (The activations, a few KB, are left out,
  which only favours the floor.)

Each is timed three ways, as the runner times jobs:
- cold, L2 flushed by a write (`flush.fill_`) before each launch, an event
  pair around the launch (the median of --samples);
- cold, L2 flushed by a read (a kernel summing the flush buffer);
- graph: --graph-calls launches captured in one CUDA graph, replayed
  between events, the time divided by the calls (no flush between them).

% of bound = the shape's bytes at the device's peak bandwidth (--peak-gbs,
else the figure tunelab's device profile gives this GPU) / the stream's
time: the most any kernel moving those bytes in one launch could score
under that timer.

    python3 bench/cold_stream_floor.py --shapes mxfp4:128:2880:1,bf16:128:360:1 [--samples 50] [--routed --select-by read]

Prints markdown (device, date and command first).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tunelab.problems import resolve  # noqa: E402

# tunelab's device profiles (src/device/profile.rs), GB/s.
PEAK_GBS = {"NVIDIA H100 80GB HBM3": 3350.0, "NVIDIA H200": 4800.0}


@triton.jit
def stream_kernel(src, out, n_words, BLOCK: tl.constexpr, TILES_PER_PROGRAM: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(TILES_PER_PROGRAM):
        offs = (pid + i * programs) * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(src + offs, mask=offs < n_words, other=0, cache_modifier=".cg")
    tl.store(out + pid, tl.xor_sum(acc, axis=0))


@triton.jit
def routed_stream_kernel(
    topk_ids,
    experts,
    out,
    words_per_expert,
    tiles_per_slot,
    n_tiles,
    BLOCK: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(TILES_PER_PROGRAM):
        tile = pid + i * programs
        # The expert id first: the weights' address depends on it.
        expert = tl.load(topk_ids + tile // tiles_per_slot, mask=tile < n_tiles, other=0).to(tl.int64)
        offs = (tile % tiles_per_slot) * BLOCK + tl.arange(0, BLOCK)
        words = tl.where(tile < n_tiles, words_per_expert, 0)  # a grid-stride loop's last round may run past
        acc ^= tl.load(experts + expert * words_per_expert + offs, mask=offs < words, other=0, cache_modifier=".cg")
    tl.store(out + pid, tl.xor_sum(acc, axis=0))


@triton.jit
def add_one(x):
    tl.store(x, tl.load(x) + 1)


@triton.jit
def read_flush_kernel(src, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + tl.program_id(0), tl.sum(tl.load(src + offs, mask=offs < n, other=0), axis=0))


def shape_problem(text: str):
    """`mxfp4:E:N:M` or `bf16:E:N:M` (gpt-oss: K=2880, topk=4) -> (label, the moe problem)."""
    dtype, e, n, m = text.split(":")
    shape = {"M": int(m), "E": int(e), "topk": 4, "K": 2880, "N": int(n), "dtype": dtype}
    if dtype == "mxfp4":
        shape.update(act_dtype="bf16", activation="swiglu_oai")
    else:
        shape.update(activation="silu")
    return f"{dtype} E={e} N={n} M={m}", resolve("moe")(shape)


class Timer:
    def __init__(self, samples: int, graph_calls: int):
        self.samples = samples
        self.graph_calls = graph_calls
        self.flush = torch.empty(256 << 20, dtype=torch.int32, device="cuda")
        self.flush_out = torch.empty(triton.cdiv(self.flush.numel(), 4096), dtype=torch.int32, device="cuda")

    def _read_flush(self):
        read_flush_kernel[(self.flush_out.numel(),)](self.flush, self.flush_out, self.flush.numel(), BLOCK=4096)

    def cold(self, launch, flush_by: str) -> float:
        times = []
        for _ in range(self.samples):
            if flush_by == "write":
                self.flush.fill_(1)
            else:
                self._read_flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        return statistics.median(times)

    def graph(self, launch) -> float:
        launch()
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(self.graph_calls):
                    launch()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.samples):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / self.graph_calls)
        return statistics.median(times)


def grids(tiles: int, sm_count: int) -> list[tuple[int, int]]:
    """(programs, tiles a program) tried for `tiles` tiles: one tile a
    program, or a grid-stride loop over 2, 4 or 8 programs an SM."""
    return [(tiles, 1)] + [(sm_count * per_sm, triton.cdiv(tiles, sm_count * per_sm)) for per_sm in (2, 4, 8)]


def stream_launches(buffer: torch.Tensor, sm_count: int):
    """(label, launch) for each stream configuration tried."""
    n_words = buffer.numel()
    for block in (1024, 2048, 4096):
        for warps in (4, 8):
            tiles = triton.cdiv(n_words, block)
            for programs, per_program in grids(tiles, sm_count):
                out = torch.empty(programs, dtype=torch.int32, device="cuda")

                def launch(programs=programs, per_program=per_program, block=block, warps=warps, out=out):
                    stream_kernel[(programs,)](
                        buffer, out, n_words, BLOCK=block, TILES_PER_PROGRAM=per_program, num_warps=warps
                    )

                yield f"BLOCK {block * 4} B, {warps} warps, {programs} programs x {per_program} tiles", launch


def routed_launches(experts: torch.Tensor, topk_ids: torch.Tensor, sm_count: int):
    """(label, launch) for each routed-stream configuration tried: the grids of
    `stream_launches`, over the selected experts' tiles."""
    words_per_expert = experts.shape[1]
    slots = topk_ids.numel()
    for block in (1024, 2048, 4096):
        for warps in (4, 8):
            tiles_per_slot = triton.cdiv(words_per_expert, block)
            n_tiles = slots * tiles_per_slot
            for programs, per_program in grids(n_tiles, sm_count):
                out = torch.empty(programs, dtype=torch.int32, device="cuda")

                def launch(
                    programs=programs,
                    per_program=per_program,
                    block=block,
                    warps=warps,
                    out=out,
                    tiles_per_slot=tiles_per_slot,
                    n_tiles=n_tiles,
                ):
                    routed_stream_kernel[(programs,)](
                        topk_ids,
                        experts,
                        out,
                        words_per_expert,
                        tiles_per_slot,
                        n_tiles,
                        BLOCK=block,
                        TILES_PER_PROGRAM=per_program,
                        num_warps=warps,
                    )

                yield f"BLOCK {block * 4} B, {warps} warps, {programs} programs x {per_program} tiles", launch


def routed_buffers(problem, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """All E experts' bytes ([E, words], each expert contiguous) and distinct
    expert ids for the call's M * topk slots, as many as the bound counts."""
    distinct = round(problem.expected_distinct_experts())
    if distinct != problem.M * problem.topk:
        raise SystemExit(
            f"--routed takes shapes whose slots select distinct experts (M * topk <= E at M=1); "
            f"M={problem.M} topk={problem.topk} E={problem.E} expects {problem.expected_distinct_experts():.2f}"
        )
    words = triton.cdiv(int(problem.expert_bytes()), 4)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    experts = torch.randint(-(2**31), 2**31 - 1, (problem.E, words), dtype=torch.int32, device="cuda", generator=gen)
    topk_ids = torch.randperm(problem.E, device="cuda", generator=gen)[:distinct].to(torch.int32)
    return experts, topk_ids


def best_of(timer: "Timer", launches, select_by: str):
    """(cold µs under `select_by`, config, launch) of the fastest launch."""
    best = None
    for config, launch in launches:
        t = timer.cold(launch, select_by)
        if best is None or t < best[0]:
            best = (t, config, launch)
    assert best is not None
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shapes",
        default="mxfp4:128:2880:1,bf16:128:360:1",
        help="dtype:E:N:M,... (gpt-oss: K=2880, topk=4; dtype mxfp4 or bf16)",
    )
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--graph-calls", type=int, default=10)
    ap.add_argument("--peak-gbs", type=float, help="the device's peak bandwidth (default: tunelab's profile)")
    ap.add_argument(
        "--routed",
        action="store_true",
        help="also the routed stream: each program reads its expert id before its weights",
    )
    ap.add_argument(
        "--select-by",
        choices=("write", "read"),
        default="write",
        help="the flush under which each row's best config is chosen (read: tunelab's default "
        "protocol; write: what this script chose before --routed existed)",
    )
    args = ap.parse_args(argv)

    props = torch.cuda.get_device_properties(0)
    peak = args.peak_gbs or PEAK_GBS.get(props.name)
    if peak is None:
        raise SystemExit(f"no peak bandwidth known for {props.name}: pass --peak-gbs")
    timer = Timer(args.samples, args.graph_calls)
    one = torch.zeros(1, dtype=torch.int32, device="cuda")

    def noop():
        add_one[(1,)](one)

    lines = [
        f"# One-launch floor for a MoE call's bytes, {props.name}",
        "",
        f"{datetime.date.today().isoformat()}, torch {torch.__version__}, Triton {triton.__version__}, "
        f"{props.multi_processor_count} SMs, peak {peak:.0f} GB/s (tunelab's device profile). "
        f"`python3 bench/cold_stream_floor.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        f"Median of {args.samples}; graph: {args.graph_calls} calls a replay.",
        "",
        "| what | bytes (MB) | bound µs | cold, write flush µs | cold, read flush µs | graph µs a call | "
        f"% of bound: cold (write) / cold (read) / graph | best config (cold, {args.select_by} flush) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    lines.append(
        f"| no-op (one-element add) | 0 | 0 | {timer.cold(noop, 'write'):.2f} | "
        f"{timer.cold(noop, 'read'):.2f} | {timer.graph(noop):.2f} | — | — |"
    )
    other_flush = "read" if args.select_by == "write" else "write"

    def row(what: str, nbytes: float, bound_us: float, best) -> str:
        chosen, config, launch = best
        cold = {args.select_by: chosen, other_flush: timer.cold(launch, other_flush)}
        graph = timer.graph(launch)
        pct = " / ".join(f"{100 * bound_us / t:.1f}" for t in (cold["write"], cold["read"], graph))
        return (
            f"| {what} | {nbytes / 1e6:.1f} | {bound_us:.2f} | {cold['write']:.2f} | {cold['read']:.2f} | "
            f"{graph:.2f} | {pct} | {config} |"
        )

    for text in args.shapes.split(","):
        label, problem = shape_problem(text)
        nbytes = float(problem.bytes())
        bound_us = nbytes / (peak * 1e9) * 1e6
        buffer = torch.randint(-(2**31), 2**31 - 1, (triton.cdiv(int(nbytes), 4),), dtype=torch.int32, device="cuda")
        best = best_of(timer, stream_launches(buffer, props.multi_processor_count), args.select_by)
        lines.append(row(f"stream of {label}'s bytes", nbytes, bound_us, best))
        del buffer
        if args.routed:
            experts, topk_ids = routed_buffers(problem)
            routed_bytes = topk_ids.numel() * experts.shape[1] * 4.0
            best = best_of(timer, routed_launches(experts, topk_ids, props.multi_processor_count), args.select_by)
            lines.append(row(f"routed stream of {label}'s experts", routed_bytes, bound_us, best))
            del experts, topk_ids
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
