"""Triton fused mixture-of-experts, structured like vLLM's fused MoE.

Four steps per call (three for a few tokens, see below), the same work split
as vLLM's `fused_experts` so that a config tuned here means the same thing there:

1. `moe_align_kernel` (one program): sorts the flattened (token, k) slots by
   expert, pads each expert's run to a multiple of BLOCK_SIZE_M with the
   sentinel `M * topk`, and writes one expert id per block and the padded count.
2. `moe_gemm1_kernel`: per block, x rows gathered by `slot // topk` times
   `w1[expert].T` (+ b1), activation fused in the epilogue, written to the
   intermediate `[M * topk, N]`.
3. `moe_gemm2_kernel`: intermediate times `w2[expert].T` (+ b2), times the
   routing weight, written to `[M * topk, K]`.
4. `moe_sum_kernel`: the sum over topk into `out [M, K]` (faster than
   torch.sum over the middle dimension: 36 vs 55 us at M=4096 on an H200).

Decode sizes (measured on an H100, 2026-11-22; figures are µs per call with
clean-L2 cold samples, from results/bench/*/moe_variants.json):

- Dependent launches (CUDA, sm_90+): GEMM 1 (after the alignment), GEMM 2 and
  the sum are programmatic dependent launches. Each is placed on the SMs while
  the kernel before it finishes and waits for that kernel's writes in-kernel
  (griddepcontrol.wait), which hides launch latency and the drain between
  kernels: 85.3 -> 81.9 at M=1, 151.9 -> 147.8 at M=2 (E=128, N=2880).
- Up to SELF_ALIGN_MAX_NUMEL (token, k) slots, the GEMMs compute their blocks
  from topk_ids themselves (`_self_aligned_block`) and the alignment kernel
  is not launched: 81.9 -> 80.6 at M=1. With more slots every program pays
  that prologue once per wave of programs, and it costs more than it saves
  (M=4: 277.6 -> 280.4).
- Tried and not kept: GEMM 2 writing the top-k sum itself (arrival counters,
  the last program of a token sums its rows) saved 0.4 at M=1 and cost 0.5
  to 1.3 % from M=4 to M=1024; prefetching GEMM 2's first weight lines into L2 before its
  wait was within ±1.5 µs with 8 lines a row (H200) and slower with more.

A bound launch calls the compiled kernels directly (see tunelab.kernels.launch):
Triton's ordinary `kernel[grid](...)` path costs about 17 us of host time per
launch, which at decode sizes is as long as the kernels run, so timings taken
with events would measure the host. `TUNELAB_DIRECT_LAUNCH=0` turns this off.

Tile semantics match vLLM's GEMM 1: a program owns BLOCK_SIZE_N rows of w1
(of 2N). Its columns pair up as (gate, up): column j holds activation column
j // 2, gate when j is even and up when j is odd. For interleaved weights
(gpt-oss) those are w1 rows `2a` and `2a + 1`, exactly vLLM's contiguous tile;
for the split layout (gate rows [0, N), up rows [N, 2N)) they are rows `a` and
`N + a`. Either way the dot has vLLM's shape and the program writes
BLOCK_SIZE_N // 2 activated columns, so the separate silu-and-mul pass and its
`[M * topk, 2N]` round trip disappear without changing what a config means.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import triton
import triton.language as tl

from tunelab.dtypes import int32, is_fp32, pointer, torch_dtype
from tunelab.kernels.launch import direct_launch_enabled, direct_runner, interpreting
from tunelab.lazy import torch
from tunelab.target import prebuild_host_code

ACT_SILU = 0
ACT_SWIGLU_OAI = 1

# gpt-oss clamped SwiGLU constants.
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


@triton.jit
def moe_align_kernel(
    topk_ids_ptr,  # int32 [numel]: expert of each (token, k) slot
    sorted_ids_ptr,  # int32 [max_padded]: slots grouped by expert, sentinel-padded
    expert_ids_ptr,  # int32 [max_blocks]: expert of each block, -1 past the padded count
    num_post_ptr,  # int32 [1]: padded count
    cursor_ptr,  # int32 [E_PAD]: scratch, next free position per expert
    numel,
    num_experts,
    max_padded,
    max_blocks,
    BLOCK_SIZE_M: tl.constexpr,
    E_PAD: tl.constexpr,  # power of two > num_experts: bin num_experts takes masked lanes
    CHUNK: tl.constexpr,
    BCHUNK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:
        # GEMM 1 may be placed on the SMs now; it waits for this kernel's
        # writes with griddepcontrol.wait before reading them.
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.arange(0, CHUNK)

    # Sentinel everywhere first; the scatter below overwrites the real slots.
    sentinel = tl.zeros([CHUNK], dtype=tl.int32) + numel
    for start in range(0, max_padded, CHUNK):
        idx = start + offs
        tl.store(sorted_ids_ptr + idx, sentinel, mask=idx < max_padded)

    # Per-expert histogram, kept in registers. Masked lanes count into the
    # spare bin `num_experts`, dropped below, so no masked histogram is needed.
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for start in range(0, numel, CHUNK):
        idx = start + offs
        valid = idx < numel
        e = tl.load(topk_ids_ptr + idx, mask=valid, other=0)
        e = tl.where(valid, e, num_experts)
        counts += tl.histogram(e, E_PAD)

    bins = tl.arange(0, E_PAD)
    counts = tl.where(bins < num_experts, counts, 0)
    padded = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M * BLOCK_SIZE_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    total = tl.sum(padded, 0)
    tl.store(num_post_ptr, total)
    tl.store(cursor_ptr + bins, starts)

    # Block b starts at b * BLOCK_SIZE_M; its expert is the number of expert
    # runs that end at or before that position (runs are in expert order).
    boffs = tl.arange(0, BCHUNK)
    for bstart in range(0, max_blocks, BCHUNK):
        b = bstart + boffs
        pos = b * BLOCK_SIZE_M
        eid = tl.sum((ends[None, :] <= pos[:, None]).to(tl.int32), axis=1)
        eid = tl.where(pos < total, eid, -1)
        tl.store(expert_ids_ptr + b, eid, mask=b < max_blocks)

    # Sentinel stores and cursors must land before the scatter reads/overwrites them.
    tl.debug_barrier()

    # Scatter: each slot takes the next free position of its expert. The order
    # inside one expert's run is not deterministic on a GPU; results do not
    # depend on it (every slot's output row is computed on its own).
    for start in range(0, numel, CHUNK):
        idx = start + offs
        valid = idx < numel
        e = tl.load(topk_ids_ptr + idx, mask=valid, other=0)
        dst = tl.atomic_add(cursor_ptr + e, 1, mask=valid, sem="relaxed", scope="cta")
        tl.store(sorted_ids_ptr + dst, idx, mask=valid)


@triton.jit
def _block_coords(num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    # Grouped ordering: GROUP_SIZE_M consecutive row blocks share each column
    # tile while it is hot in L2.
    pid = tl.program_id(0)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _self_aligned_block(topk_ids_ptr, numel, num_experts, pid_m,
                        BLOCK_SIZE_M: tl.constexpr, NUMEL_PAD: tl.constexpr):
    """(slots, expert) of row block `pid_m` for a few tokens, from topk_ids alone.

    The same layout as moe_align_kernel (slots grouped by expert in expert
    order, each run padded to BLOCK_SIZE_M with the sentinel `numel`), computed
    in registers with [NUMEL_PAD, NUMEL_PAD] comparisons, stable by slot so that
    both GEMMs derive the same blocks. `expert` is -1 past the padded count.
    Used when numel <= NUMEL_PAD is small: it saves the alignment launch.
    """
    i = tl.arange(0, NUMEL_PAD)
    valid = i < numel
    ids = tl.load(topk_ids_ptr + i, mask=valid, other=0)
    ids = tl.where(valid, ids, num_experts)  # padding lanes match no real expert
    same = ids[:, None] == ids[None, :]
    rank = tl.sum((same & (i[None, :] < i[:, None])).to(tl.int32), axis=1)  # my expert's slots before me
    count = tl.sum(same.to(tl.int32), axis=1)  # my expert's slots
    padded = (count + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M * BLOCK_SIZE_M
    lead = valid & (rank == 0)  # one lane per selected expert
    # My expert's run starts after the padded runs of the selected experts with smaller ids.
    before = lead[None, :] & (ids[None, :] < ids[:, None])
    pos = tl.sum(tl.where(before, padded[None, :], 0), axis=1) + rank
    rows = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    match = (pos[None, :] == rows[:, None]) & valid[None, :]
    slots = tl.sum(tl.where(match, i[None, :], 0), axis=1)
    slots = tl.where(tl.max(match.to(tl.int32), axis=1) > 0, slots, numel)
    expert = tl.max(tl.max(tl.where(match, ids[None, :], -1), axis=1), axis=0)
    return slots, expert


@triton.jit
def moe_gemm1_kernel(
    x_ptr,  # [M, K]
    w1_ptr,  # [E, 2N, K]
    b1_ptr,  # [E, 2N] (unused unless HAS_BIAS)
    inter_ptr,  # [M * topk, N]
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_ptr,
    topk_ids_ptr,  # read only when SELF_ALIGN
    N,
    K,
    numel,
    num_experts,
    num_pid_m,
    stride_xm,
    stride_we,
    stride_wn,
    stride_be,
    stride_im,
    TOPK: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    SELF_ALIGN: tl.constexpr,  # 0, or NUMEL_PAD: derive the block from topk_ids (no alignment kernel)
    USE_PDL: tl.constexpr,
):
    HALF: tl.constexpr = BLOCK_SIZE_N // 2
    num_pid_n = tl.cdiv(2 * N, BLOCK_SIZE_N)
    pid_m, pid_n = _block_coords(num_pid_m, num_pid_n, GROUP_SIZE_M)
    if SELF_ALIGN:
        if USE_PDL:
            # This kernel reads nothing an earlier kernel of the call wrote, so GEMM 2
            # may be placed as soon as every program here has started.
            tl.extra.cuda.gdc_launch_dependents()
        slots, expert = _self_aligned_block(topk_ids_ptr, numel, num_experts, pid_m, BLOCK_SIZE_M, SELF_ALIGN)
        if expert < 0:
            return
        expert = expert.to(tl.int64)
    else:
        if USE_PDL:
            # Wait for the alignment kernel's writes, then let GEMM 2 be placed: it
            # reads the alignment (complete by now) before its own wait.
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        num_post = tl.load(num_post_ptr)
        if pid_m * BLOCK_SIZE_M >= num_post:
            return
        slots = tl.load(sorted_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    tok_mask = slots < numel
    rows = (slots // TOPK).to(tl.int64)

    offs_j = tl.arange(0, BLOCK_SIZE_N)
    # `% N` keeps the tail tile's loads in bounds; those columns are not stored.
    act_col = (pid_n * HALF + offs_j // 2) % N
    is_up = offs_j % 2
    if INTERLEAVED:
        w_row = 2 * act_col + is_up
    else:
        w_row = act_col + is_up * N
    offs_k = tl.arange(0, BLOCK_SIZE_K)

    a_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
    w_base = w1_ptr + expert * stride_we
    b_ptrs = w_base + w_row[None, :].to(tl.int64) * stride_wn + offs_k[:, None]

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=tok_mask[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_rem = K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=tok_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_SIZE_K
        b_ptrs += BLOCK_SIZE_K

    if HAS_BIAS:
        bias = tl.load(b1_ptr + expert * stride_be + w_row).to(tl.float32)
        acc += bias[None, :]

    gate, up = tl.split(tl.reshape(acc, (BLOCK_SIZE_M, HALF, 2)))
    if ACTIVATION == 0:  # silu(gate) * up
        act = gate * tl.sigmoid(gate) * up
    else:  # gpt-oss clamped SwiGLU
        gate = tl.minimum(gate, 7.0)
        up = tl.minimum(tl.maximum(up, -7.0), 7.0)
        act = (up + 1.0) * gate * tl.sigmoid(1.702 * gate)

    offs_c = pid_n * HALF + tl.arange(0, HALF)
    c_ptrs = inter_ptr + slots[:, None].to(tl.int64) * stride_im + offs_c[None, :]
    tl.store(c_ptrs, act.to(inter_ptr.dtype.element_ty), mask=tok_mask[:, None] & (offs_c[None, :] < N))


@triton.jit
def moe_gemm2_kernel(
    inter_ptr,  # [M * topk, N]
    w2_ptr,  # [E, K, N]
    b2_ptr,  # [E, K] (unused unless HAS_BIAS)
    out_ptr,  # [M * topk, K]
    weights_ptr,  # fp32 [M * topk] routing weights
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_ptr,
    topk_ids_ptr,  # read only when SELF_ALIGN
    N_OUT,  # hidden size K
    K_RED,  # intermediate size N
    numel,
    num_experts,
    num_pid_m,
    stride_im,
    stride_we,
    stride_wn,
    stride_be,
    stride_om,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    SELF_ALIGN: tl.constexpr,  # 0, or NUMEL_PAD (see moe_gemm1_kernel)
    USE_PDL: tl.constexpr,
):
    num_pid_n = tl.cdiv(N_OUT, BLOCK_SIZE_N)
    pid_m, pid_n = _block_coords(num_pid_m, num_pid_n, GROUP_SIZE_M)
    # The block's slots and expert come from the alignment (written before GEMM 1
    # passed its wait, see there) or from topk_ids: neither waits for GEMM 1.
    if SELF_ALIGN:
        slots, expert = _self_aligned_block(topk_ids_ptr, numel, num_experts, pid_m, BLOCK_SIZE_M, SELF_ALIGN)
        if expert < 0:
            return
        expert = expert.to(tl.int64)
    else:
        # Read before this kernel's wait: GEMM 1 let it be placed only after its
        # own wait for the alignment, so these are complete. .cg reads them
        # from L2, never from a line this SM's L1 held before they were written.
        num_post = tl.load(num_post_ptr, cache_modifier=".cg")
        if pid_m * BLOCK_SIZE_M >= num_post:
            return
        slots = tl.load(sorted_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M), cache_modifier=".cg")
        expert = tl.load(expert_ids_ptr + pid_m, cache_modifier=".cg").to(tl.int64)
    tok_mask = slots < numel
    slots64 = slots.to(tl.int64)

    offs_n_raw = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_n = offs_n_raw % N_OUT
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    if USE_PDL:
        # Pulling the first lines of this program's w2 rows into L2 before the
        # wait (they do not depend on GEMM 1) was measured on an H200: within
        # ±1.5 µs with 8 lines a row, slower with 32 or more. Not done.
        tl.extra.cuda.gdc_wait()  # GEMM 1's intermediate is complete and visible
        tl.extra.cuda.gdc_launch_dependents()
    a_ptrs = inter_ptr + slots64[:, None] * stride_im + offs_k[None, :]
    b_ptrs = w2_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K_RED, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=tok_mask[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_rem = K_RED - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=tok_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_SIZE_K
        b_ptrs += BLOCK_SIZE_K

    if HAS_BIAS:
        bias = tl.load(b2_ptr + expert * stride_be + offs_n).to(tl.float32)
        acc += bias[None, :]
    w = tl.load(weights_ptr + slots64, mask=tok_mask, other=0.0).to(tl.float32)
    acc = acc * w[:, None]

    c_ptrs = out_ptr + slots64[:, None] * stride_om + offs_n_raw[None, :]
    tl.store(c_ptrs, acc.to(out_ptr.dtype.element_ty), mask=tok_mask[:, None] & (offs_n_raw[None, :] < N_OUT))


@triton.jit
def moe_sum_kernel(
    src_ptr,  # [M * topk, K], rows of one token adjacent
    out_ptr,  # [M, K]
    K,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # GEMM 2's output is complete and visible
    m = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < K
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(src_ptr + (m * TOPK + j) * K + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * K + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# Host side: sizes, launch arguments, compile, launch.

def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def align_sizes(numel: int, num_experts: int, block_size_m: int):
    """(max_blocks, max_padded): upper bounds on the padded blocks and entries.

    Each non-empty expert's run is padded up to a multiple of BLOCK_SIZE_M, at
    most min(E, numel) experts are non-empty, and every block holds at least
    one real slot, so blocks <= min(numel, (numel + nz * (BM - 1)) // BM).
    """
    nz = min(num_experts, numel)
    max_blocks = min(numel, (numel + nz * (block_size_m - 1)) // block_size_m)
    return max_blocks, max_blocks * block_size_m


def _align_meta(numel: int, num_experts: int, max_padded: int):
    """Constexprs and warps of the alignment kernel (measured on an H200: 4096-wide
    chunks and 8 warps take M=4096, E=128, topk=4 from 58 to 49 us; M=1 is ~5 us
    whatever the choice)."""
    e_pad = _next_pow2(num_experts + 1)
    chunk = min(4096, max(16, _next_pow2(max_padded)))
    bchunk = max(16, 4096 // e_pad)
    return {"E_PAD": e_pad, "CHUNK": chunk, "BCHUNK": bchunk, "num_warps": 8 if chunk >= 4096 else 4}


# Up to this many (token, k) slots, the GEMMs derive their blocks from topk_ids
# themselves and the alignment kernel is not launched (see _self_aligned_block).
SELF_ALIGN_MAX_NUMEL = 8
# The prologue compares every pair of slots in registers: keep it small.
SELF_ALIGN_LIMIT = 64


def pdl_supported() -> bool:
    """Programmatic dependent launch: CUDA, compute capability 9.0 or newer.

    Asks Triton's active driver, so a compile worker (tunelab.target) answers
    for the lane's GPU without touching one."""
    if interpreting():
        return False
    import triton.runtime

    target = triton.runtime.driver.active.get_current_target()
    return target.backend == "cuda" and int(target.arch) >= 90


@dataclasses.dataclass(frozen=True)
class MoEPlan:
    """Everything a launch needs that depends on the shape and config only."""

    M: int
    E: int
    topk: int
    K: int
    N: int
    dtype: object  # a torch dtype, or its stand-in in a compile worker
    activation: int
    interleaved: bool
    has_bias: bool
    config: dict
    numel: int
    max_blocks: int
    max_padded: int
    align_meta: dict
    grid1: tuple
    grid2: tuple
    # NUMEL_PAD when the GEMMs align their own blocks (no alignment launch), else 0.
    self_align: int
    # Launch GEMM 1 (after the alignment), GEMM 2 and the sum as programmatic
    # dependent launches: each is placed on the SMs while the previous kernel
    # finishes and waits for its writes in-kernel.
    pdl: bool


def make_plan(problem, config: dict, *, self_align_max: int | None = None, pdl: bool | None = None) -> MoEPlan:
    """The launch plan. The keyword knobs are for benchmarks and tests
    (bench/moe_breakdown.py times the plain four-kernel call with
    `self_align_max=0, pdl=False`); a run always uses the defaults, so a
    journal's timings all come from one plan: SELF_ALIGN_MAX_NUMEL, and
    dependent launches wherever the target supports them."""
    bm, bn, bk = (int(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
    for name, v in (("BLOCK_SIZE_M", bm), ("BLOCK_SIZE_N", bn), ("BLOCK_SIZE_K", bk)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot needs 16), got {v}")
    if int(config["GROUP_SIZE_M"]) < 1:
        raise ValueError(f"GROUP_SIZE_M must be >= 1, got {config['GROUP_SIZE_M']}")
    numel = problem.M * problem.topk
    max_blocks, max_padded = align_sizes(numel, problem.E, bm)
    if self_align_max is None:
        self_align_max = SELF_ALIGN_MAX_NUMEL
    if not 0 <= self_align_max <= SELF_ALIGN_LIMIT:
        raise ValueError(f"self_align_max must be in [0, {SELF_ALIGN_LIMIT}], got {self_align_max}")
    if pdl is None:
        pdl = pdl_supported()
    return MoEPlan(
        M=problem.M,
        E=problem.E,
        topk=problem.topk,
        K=problem.K,
        N=problem.N,
        dtype=problem.dtype,
        activation=ACT_SWIGLU_OAI if problem.activation == "swiglu_oai" else ACT_SILU,
        interleaved=problem.interleaved,
        has_bias=problem.bias,
        config={k: int(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M",
                                              "num_warps", "num_stages")},
        numel=numel,
        max_blocks=max_blocks,
        max_padded=max_padded,
        align_meta=_align_meta(numel, problem.E, max_padded),
        grid1=(max_blocks * triton.cdiv(2 * problem.N, bn),),
        grid2=(max_blocks * triton.cdiv(problem.K, bn),),
        self_align=max(2, _next_pow2(numel)) if numel <= self_align_max else 0,
        pdl=bool(pdl),
    )


SUM_BLOCK = 1024


def _launch_specs(plan: MoEPlan, b: dict):
    """[(kernel, grid, args, kwargs)] for the Triton launches, in order: the
    alignment (unless the GEMMs align themselves), GEMM 1, GEMM 2, the sum.

    `b` maps buffer names to tensors, or to pointer stand-ins for a compile without
    launching (see tunelab.dtypes.pointer). Strides are
    those of contiguous buffers, so compile and launch share one specialization.
    """
    c = plan.config
    E, K, N = plan.E, plan.K, plan.N
    tiles = {k: c[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}
    launch = {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
    precision = "ieee" if is_fp32(plan.dtype) else "tf32"  # tf32 is ignored for 16-bit inputs
    bk = c["BLOCK_SIZE_K"]
    # A dependent launch only where an earlier kernel of the call precedes it:
    # the call's first kernel follows the timer's event and the L2 flush.
    dependent = {"launch_pdl": True} if plan.pdl else {}
    specs: list[tuple[Any, tuple, tuple, dict]] = []  # (kernel, grid, args, keyword args)
    if not plan.self_align:
        specs.append((
            moe_align_kernel,
            (1,),
            (b["topk_ids"], b["sorted_ids"], b["expert_ids"], b["num_post"], b["cursor"],
             plan.numel, E, plan.max_padded, plan.max_blocks),
            dict(BLOCK_SIZE_M=c["BLOCK_SIZE_M"], USE_PDL=plan.pdl, **plan.align_meta),
        ))
    specs.append((
        moe_gemm1_kernel,
        plan.grid1,
        (b["x"], b["w1"], b["b1"] if plan.has_bias else b["x"], b["inter"],
         b["sorted_ids"], b["expert_ids"], b["num_post"], b["topk_ids"],
         N, K, plan.numel, E, plan.max_blocks,
         K, 2 * N * K, K, 2 * N, N),
        dict(TOPK=plan.topk, INTERLEAVED=plan.interleaved, ACTIVATION=plan.activation,
             HAS_BIAS=plan.has_bias, EVEN_K=K % bk == 0, PRECISION=precision, SELF_ALIGN=plan.self_align,
             USE_PDL=plan.pdl, **tiles, **launch, **({} if plan.self_align else dependent)),
    ))
    specs.append((
        moe_gemm2_kernel,
        plan.grid2,
        (b["inter"], b["w2"], b["b2"] if plan.has_bias else b["inter"], b["out2"], b["topk_weights"],
         b["sorted_ids"], b["expert_ids"], b["num_post"], b["topk_ids"],
         K, N, plan.numel, E, plan.max_blocks,
         N, K * N, N, K, K),
        dict(HAS_BIAS=plan.has_bias, EVEN_K=N % bk == 0, PRECISION=precision, SELF_ALIGN=plan.self_align,
             USE_PDL=plan.pdl, **tiles, **launch, **dependent),
    ))
    specs.append((
        moe_sum_kernel,
        (plan.M, triton.cdiv(K, SUM_BLOCK)),
        (b["out2"], b["out"], K),
        dict(TOPK=plan.topk, BLOCK=SUM_BLOCK, USE_PDL=plan.pdl, num_warps=4, **dependent),
    ))
    return specs


def compile_plan(plan: MoEPlan):
    """Compile the plan's kernels into Triton's cache without launching them."""
    dt, i32, f32 = pointer(plan.dtype), pointer(int32()), pointer(torch_dtype("fp32"))
    b = {
        "x": dt, "w1": dt, "b1": dt, "w2": dt, "b2": dt, "inter": dt, "out2": dt, "out": dt,
        "topk_ids": i32, "sorted_ids": i32, "expert_ids": i32, "num_post": i32, "cursor": i32,
        "topk_weights": f32,
    }
    for kernel, grid, args, kwargs in _launch_specs(plan, b):
        prebuild_host_code(kernel.warmup(*args, grid=grid, **kwargs))


class FusedMoELaunch:
    """A bound fused-MoE call: buffers preallocated, `__call__` computes into `out`.

    Alignment runs inside every call, as its own kernel or inside the GEMMs
    (vLLM's timed call includes it); only allocation and kernel lookup happen here.
    """

    def __init__(self, plan: MoEPlan, inputs: dict, direct: bool | None = None):
        self.plan = plan
        x = inputs["x"]
        dev = x.device
        i32 = torch.int32
        self.inputs = {k: v.contiguous() for k, v in inputs.items()}
        if self.inputs["topk_ids"].dtype != i32:
            self.inputs["topk_ids"] = self.inputs["topk_ids"].to(i32)
        if self.inputs["topk_weights"].dtype != torch.float32:
            self.inputs["topk_weights"] = self.inputs["topk_weights"].float()
        self.sorted_ids = torch.empty(plan.max_padded, dtype=i32, device=dev)
        self.expert_ids = torch.empty(plan.max_blocks, dtype=i32, device=dev)
        self.num_post = torch.empty(1, dtype=i32, device=dev)
        self.cursor = torch.empty(plan.align_meta["E_PAD"], dtype=i32, device=dev)
        self.inter = torch.empty(plan.numel, plan.N, dtype=plan.dtype, device=dev)
        self.out2 = torch.empty(plan.numel, plan.K, dtype=plan.dtype, device=dev)
        self.out = torch.empty(plan.M, plan.K, dtype=plan.dtype, device=dev)
        bufs = dict(self.inputs, sorted_ids=self.sorted_ids, expert_ids=self.expert_ids, num_post=self.num_post,
                    cursor=self.cursor, inter=self.inter, out2=self.out2, out=self.out)
        specs = _launch_specs(plan, bufs)
        if direct is None:
            direct = direct_launch_enabled(dev)
        self.direct = False
        if direct:
            runners = [direct_runner(*spec) for spec in specs]
            if all(r is not None for r in runners):
                self._runners, self.direct = runners, True
        if not self.direct:
            self._runners = [functools.partial(kernel[grid], *args, **kwargs) for kernel, grid, args, kwargs in specs]

    def __call__(self):
        for run in self._runners:
            run()
        return self.out


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size_m: int):
    """Run the alignment kernel alone: (sorted_ids, expert_ids, num_tokens_post_padded)."""
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    numel = ids.numel()
    max_blocks, max_padded = align_sizes(numel, num_experts, block_size_m)
    meta = _align_meta(numel, num_experts, max_padded)
    dev = ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    num_post = torch.empty(1, dtype=torch.int32, device=dev)
    cursor = torch.empty(meta["E_PAD"], dtype=torch.int32, device=dev)
    moe_align_kernel[(1,)](ids, sorted_ids, expert_ids, num_post, cursor, numel, num_experts, max_padded,
                           max_blocks, BLOCK_SIZE_M=block_size_m, USE_PDL=False, **meta)
    return sorted_ids, expert_ids, num_post
