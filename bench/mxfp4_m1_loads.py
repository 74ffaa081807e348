#!/usr/bin/env python3
"""How fast the one-token MXFP4 GEMM 1 could be if it only loaded (a measurement, not a test).

At gpt-oss-120b's M=1 shape (E=128, topk=4, K=2880, N=2880: GEMM 1 reads four
experts' w1, 4 x 5760 rows of 1440 bytes plus 90 scale bytes a row, 35.3 MB)
it times, each alone with a cold L2, the L2 flushed by a write
(`mxfp4_m1_profile.py`'s flush and timer) and by a read (the runner's):

- `loads`: a kernel that makes exactly the loads `GEMV: 1` and `2` made
  from row-major weights (before commit 4e4207c), for the same grid, tile
  and split (`row_major_bases` and `row_major_step_loads`, the module's
  helpers of then; one K step at a time or one step ahead as `GEMV: 1`
  does), and folds them into one word a row with XOR instead of the
  arithmetic, so nothing is computed but nothing is left unloaded;
- `loads, tile-major weights`: the same loads from a copy of the four
  experts' weights laid out tile by tile, each K step's [BN, BK / 2] bytes
  and its scales contiguous (`tile_major`), so a warp's load covers
  consecutive bytes instead of BN rows 1440 bytes apart;
- `stream`: the same bytes read as four contiguous ranges (the experts'
  w1 and scales), 16 bytes a thread, 8192 a program: the access pattern
  with nothing to lose to it.

    python3 bench/mxfp4_m1_loads.py [--samples 50] BN,BK,WARPS,SPLIT_K...

Prints a markdown table (device, date and command first) to stdout.
"""

import argparse
import datetime
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mxfp4_m1_profile import median_us  # noqa: E402
from tunelab.kernels import quant_moe  # noqa: E402
from tunelab.problems.moe import FusedMoE  # noqa: E402


@triton.jit
def row_major_bases(w_ptr, w_scale_ptr, w_rows, stride_wr, stride_wsr):
    """The one-token kernels' tile addresses in row-major weights [rows, K_PAD / 2]
    (quant_moe._gemv_tile_bases as it was before tile-major weights, commit
    9b9c4d4): words [rows, 1, 4] and scales [rows, 1] of scale group 0."""
    stride_w = tl.multiple_of(stride_wr // 4, 4)
    w_base = w_ptr.to(tl.pointer_type(tl.uint32)) + w_rows[:, None, None] * stride_w + tl.arange(0, 4)[None, None, :]
    return w_base, w_scale_ptr + w_rows[:, None] * stride_wsr


@triton.jit
def row_major_step_loads(a_ptr, w_base, s_base, k, g_end, K_RED, GROUPS: tl.constexpr):
    """quant_moe._gemv_step_loads's loads from row-major weights: K step k's
    words [rows, GROUPS, 4], scales [rows, GROUPS] and activations [GROUPS, 4, 8]."""
    g = k * GROUPS + tl.arange(0, GROUPS)
    g_ok = g < g_end
    w = tl.load(w_base + (g * 4)[None, :, None], mask=g_ok[None, :, None], other=0)
    e = tl.load(s_base + g[None, :], mask=g_ok[None, :], other=0).to(tl.uint32)
    kk = g[:, None, None] * 32 + tl.arange(0, 4)[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    a8 = tl.load(a_ptr + kk, mask=kk < K_RED, other=0.0).to(tl.float32)
    return w, e, a8


@triton.jit
def gemv_loads_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    expert_ids_ptr,
    out_ptr,
    K,
    ROWS,
    stride_we,
    stride_wr,
    stride_wse,
    stride_wsr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    AHEAD: tl.constexpr,
):
    GROUPS: tl.constexpr = BLOCK_SIZE_K // 32
    num_pid_n = tl.cdiv(ROWS, BLOCK_SIZE_N)
    pid_m = tl.program_id(0) // num_pid_n
    pid_n = tl.program_id(0) % num_pid_n
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    rows = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)).to(tl.int64)
    w_base, s_base = row_major_bases(
        w_ptr + expert * stride_we, s_ptr + expert * stride_wse, rows, stride_wr, stride_wsr
    )
    k_begin, k_end = quant_moe._split_k_steps(K, BLOCK_SIZE_K, SPLIT_K)
    g_end = tl.minimum(tl.cdiv(K, 32), k_end * GROUPS)
    acc = tl.zeros((BLOCK_SIZE_N, GROUPS, 4), dtype=tl.uint32)
    act = tl.zeros((GROUPS, 4, 8), dtype=tl.uint32)
    if AHEAD:
        w_next, e_next, a_next = row_major_step_loads(a_ptr, w_base, s_base, k_begin, g_end, K, GROUPS)
    for k in range(k_begin, k_end):
        if AHEAD:
            w, e, a8 = w_next, e_next, a_next
            w_next, e_next, a_next = row_major_step_loads(a_ptr, w_base, s_base, k + 1, g_end, K, GROUPS)
        else:
            w, e, a8 = row_major_step_loads(a_ptr, w_base, s_base, k, g_end, K, GROUPS)
        acc ^= w ^ e[:, :, None]
        act ^= a8.to(tl.uint32, bitcast=True)
    folded = tl.xor_sum(tl.xor_sum(acc, axis=2), axis=1) ^ tl.xor_sum(tl.xor_sum(tl.xor_sum(act, 2), 1), 0)
    out = out_ptr + (pid_m * ROWS + rows) * SPLIT_K + tl.program_id(1)
    tl.store(out, folded, mask=rows < ROWS)


@triton.jit
def stream_kernel(w_ptr, s_ptr, expert_ids_ptr, out_ptr, W_WORDS, S_WORDS, stride_we, stride_wse, BLOCK: tl.constexpr):
    """Program (e, i) reads words [i * BLOCK, (i + 1) * BLOCK) of expert e's
    w1 (as 4-word vectors) and the matching share of its scales."""
    expert = tl.load(expert_ids_ptr + tl.program_id(1)).to(tl.int64)
    words = w_ptr.to(tl.pointer_type(tl.uint32)) + expert * (stride_we // 4)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    w = tl.load(words + offs, mask=offs < W_WORDS, other=0)
    s_words = s_ptr.to(tl.pointer_type(tl.uint32)) + expert * (stride_wse // 4)
    per = tl.cdiv(S_WORDS, tl.num_programs(0))
    s_offs = tl.program_id(0) * per + tl.arange(0, BLOCK // 16)
    s = tl.load(s_words + s_offs, mask=(s_offs < S_WORDS) & (tl.arange(0, BLOCK // 16) < per), other=0)
    tl.store(out_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), tl.xor_sum(w, 0) ^ tl.xor_sum(s, 0))


@triton.jit
def tiled_loads_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    K,
    ROWS,
    K_STEPS,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """`gemv_loads_kernel`'s loads from weights laid out tile by tile (see
    `tile_major`): a K step's [BLOCK_SIZE_N, BLOCK_SIZE_K / 2] bytes, and its
    scales, are contiguous, so a warp's load covers consecutive bytes."""
    GROUPS: tl.constexpr = BLOCK_SIZE_K // 32
    num_pid_n = tl.cdiv(ROWS, BLOCK_SIZE_N)
    tile = tl.program_id(0).to(tl.int64)  # expert-major: (expert, n tile)
    pid_n = tl.program_id(0) % num_pid_n
    rows = tl.arange(0, BLOCK_SIZE_N)
    words = w_ptr.to(tl.pointer_type(tl.uint32)) + tile * K_STEPS * (BLOCK_SIZE_N * BLOCK_SIZE_K // 8)
    scales = s_ptr + tile * K_STEPS * (BLOCK_SIZE_N * GROUPS)
    k_begin, k_end = quant_moe._split_k_steps(K, BLOCK_SIZE_K, SPLIT_K)
    acc = tl.zeros((BLOCK_SIZE_N, GROUPS, 4), dtype=tl.uint32)
    act = tl.zeros((GROUPS, 4, 8), dtype=tl.uint32)
    offs_w = (
        rows[:, None, None] * (BLOCK_SIZE_K // 8)
        + tl.arange(0, GROUPS)[None, :, None] * 4
        + tl.arange(0, 4)[None, None, :]
    )
    offs_s = rows[:, None] * GROUPS + tl.arange(0, GROUPS)[None, :]
    for k in range(k_begin, k_end):
        w = tl.load(words + k * (BLOCK_SIZE_N * BLOCK_SIZE_K // 8) + offs_w)
        e = tl.load(scales + k * (BLOCK_SIZE_N * GROUPS) + offs_s).to(tl.uint32)
        g = k * GROUPS + tl.arange(0, GROUPS)
        kk = g[:, None, None] * 32 + tl.arange(0, 4)[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
        a8 = tl.load(a_ptr + kk, mask=kk < K, other=0.0)
        acc ^= w ^ e[:, :, None]
        act ^= a8.to(tl.uint32, bitcast=True)
    folded = tl.xor_sum(tl.xor_sum(acc, axis=2), axis=1) ^ tl.xor_sum(tl.xor_sum(tl.xor_sum(act, 2), 1), 0)
    out = out_ptr + (tile * BLOCK_SIZE_N + rows) * SPLIT_K + tl.program_id(1)
    tl.store(out, folded, mask=pid_n * BLOCK_SIZE_N + rows < ROWS)


def tile_major(w, s, bn: int, bk: int):
    """(weights, scales, K steps): weights [E', rows, K/2] and scales
    [E', rows, K/32] (uint8) laid out as the one-token kernels read them,
    [E', row tiles, K steps, bn, bk/2] and [.., bn, bk/32]
    (quant_moe.gemv_tile_major, rows in order; a tail tile wraps around)."""
    rows = w.shape[1]
    order = torch.arange(triton.cdiv(rows, bn) * bn, dtype=torch.int64).reshape(-1, bn) % rows
    wt, st = quant_moe.gemv_tile_major(w, s, order, bk)
    return wt, st, wt.shape[2]


class ReadFlush:
    """median_us's flush, as a read: `add_` sums the buffer instead of
    writing it, so L2 holds no dirty lines to write back during the kernel
    (the runner's default, `flush_with: read`)."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.total = torch.empty((), dtype=buffer.dtype, device=buffer.device)

    def add_(self, _value):
        torch.sum(self.buffer, dim=0, out=self.total)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tiles", nargs="+", help="BN,BK,WARPS,SPLIT_K")
    ap.add_argument("--samples", type=int, default=50)
    args = ap.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(max(2 * props.L2_cache_size, 32 << 20) // 4, dtype=torch.float32, device="cuda")
    problem = FusedMoE(
        {
            "M": 1,
            "E": 128,
            "topk": 4,
            "K": 2880,
            "N": 2880,
            "act_dtype": "bf16",
            "dtype": "mxfp4",
            "activation": "swiglu_oai",
        }
    )
    inputs = problem.inputs(0, torch.device("cuda"))
    w1, s1 = inputs["w1"], inputs["w1_scale"]
    experts = inputs["topk_ids"].reshape(-1).to(torch.int32).contiguous()
    x = inputs["x"].float().contiguous()  # the kernels load fp32 activations here: 11.5 KB, next to nothing
    E, rows, row_bytes = w1.shape
    K = problem.K
    nbytes = experts.numel() * (rows * row_bytes + s1.shape[1] * s1.shape[2])
    print(
        f"Device {torch.cuda.get_device_name()}, {datetime.date.today().isoformat()}, torch {torch.__version__}; "
        f"`python3 bench/mxfp4_m1_loads.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n"
    )
    print(
        f"GEMM 1's weights and scales at M=1: {nbytes / 1e6:.1f} MB (w1 {tuple(w1.shape)} uint8, scales "
        f"{tuple(s1.shape)}; experts {experts.tolist()}).\n"
    )
    print(
        "| kernel | tile | grid | cold µs, write flush | GB/s | cold µs, read flush | GB/s |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    )
    reader = ReadFlush(flush)
    rows_out = []

    def row(name, tile, grid, fn):
        written = median_us(fn, flush, args.samples)
        read = median_us(fn, reader, args.samples)
        rows_out.append(
            f"| {name} | {tile} | {grid} | {written:.1f} | {nbytes / written / 1e3:.0f} | {read:.1f} | "
            f"{nbytes / read / 1e3:.0f} |"
        )

    # Two passes over everything, the first not reported: a GPU that had been
    # idle ran the first rows of a single pass slower (measured: 42.5 against
    # 25.9 us with the read flush), as it warmed up.
    for _ in range(2):
        rows_out.clear()
        for text in args.tiles:
            bn, bk, warps, split = (int(v) for v in text.split(","))
            out = torch.empty(experts.numel() * rows * split, dtype=torch.int32, device="cuda")
            grid = (experts.numel() * triton.cdiv(rows, bn), split)
            for ahead in (0, 1):

                def fn(bn=bn, bk=bk, warps=warps, split=split, ahead=ahead, out=out, grid=grid):
                    gemv_loads_kernel[grid](
                        x,
                        w1,
                        s1,
                        experts,
                        out,
                        K,
                        rows,
                        w1.stride(0),
                        w1.stride(1),
                        s1.stride(0),
                        s1.stride(1),
                        BLOCK_SIZE_N=bn,
                        BLOCK_SIZE_K=bk,
                        SPLIT_K=split,
                        AHEAD=ahead,
                        num_warps=warps,
                        num_stages=1,
                    )

                fn()
                name = "loads, one step ahead" if ahead else "loads"
                row(name, f"BN{bn} BK{bk} w{warps} SPLIT_K {split}", grid[0] * grid[1], fn)
            wt, st, steps = tile_major(w1[experts.long()], s1[experts.long()], bn, bk)

            def tiled(bn=bn, bk=bk, warps=warps, split=split, out=out, grid=grid, wt=wt, st=st, steps=steps):
                tiled_loads_kernel[grid](
                    x,
                    wt,
                    st,
                    out,
                    K,
                    rows,
                    steps,
                    BLOCK_SIZE_N=bn,
                    BLOCK_SIZE_K=bk,
                    SPLIT_K=split,
                    num_warps=warps,
                    num_stages=1,
                )

            tiled()
            row("loads, tile-major weights", f"BN{bn} BK{bk} w{warps} SPLIT_K {split}", grid[0] * grid[1], tiled)
            del wt, st
        w_words = rows * row_bytes // 4
        s_words = s1.shape[1] * s1.shape[2] // 4
        for block, warps in ((8192 // 4, 4), (8192 // 4, 8), (16384 // 4, 8)):
            programs = triton.cdiv(w_words, block)
            out = torch.empty(experts.numel() * programs, dtype=torch.int32, device="cuda")

            def fn(block=block, warps=warps, programs=programs, out=out, w_words=w_words, s_words=s_words):
                stream_kernel[(programs, experts.numel())](
                    w1, s1, experts, out, w_words, s_words, w1.stride(0), s1.stride(0), BLOCK=block, num_warps=warps
                )

            fn()
            row("stream", f"{block * 4} bytes a program, w{warps}", programs * experts.numel(), fn)

    print("\n".join(rows_out))


if __name__ == "__main__":
    main()
