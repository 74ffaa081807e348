"""Triton fused mixture-of-experts, structured like vLLM's fused MoE.

Three call structures share these kernels' tile code:

- `make_plan` (the `fused_moe` method): the call described below;
- `vllm_plan` (`fused_moe_vllm`): vLLM's own structure, kernel for kernel: the
  alignment kernel at every size, GEMM 1 writing gate and up (ACT_NONE),
  `moe_act_kernel`, GEMM 2, the sum; plain launches;
- `moe_persistent_kernel` (`fused_moe_persistent`): the whole call in one
  launch, synchronised in-kernel (see PersistentMoELaunch).

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
from tunelab.kernels.launch import compiled_runner, direct_launch_enabled, direct_runner, interpreting
from tunelab.lazy import torch
from tunelab.target import prebuild_host_code

ACT_SILU = 0
ACT_SWIGLU_OAI = 1
ACT_NONE = 2  # vLLM's GEMM 1: gate and up written as they are, the activation left to its own kernel

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
    _align(topk_ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, cursor_ptr, numel, num_experts, max_padded,
           max_blocks, BLOCK_SIZE_M, E_PAD, CHUNK, BCHUNK)


@triton.jit
def _align(topk_ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, cursor_ptr, numel, num_experts, max_padded,
           max_blocks, BLOCK_SIZE_M: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr, BCHUNK: tl.constexpr):
    """The alignment, in one program (moe_align_kernel; the persistent kernel's program 0)."""
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
    ids, pos, valid, _ = _slot_positions(topk_ids_ptr, numel, num_experts, BLOCK_SIZE_M, NUMEL_PAD)
    return _block_slots(ids, pos, valid, numel, pid_m, BLOCK_SIZE_M, NUMEL_PAD)


@triton.jit
def _slot_positions(topk_ids_ptr, numel, num_experts, BLOCK_SIZE_M: tl.constexpr, NUMEL_PAD: tl.constexpr):
    """Where the alignment puts each slot, in registers: (ids, pos, valid, num_blocks).

    `pos[i]` is slot i's position in the sorted, padded order (see
    _self_aligned_block); `num_blocks` the number of BLOCK_SIZE_M blocks that
    order fills. Costs [NUMEL_PAD, NUMEL_PAD] comparisons: for a few slots only.
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
    num_blocks = tl.sum(tl.where(lead, padded, 0), axis=0) // BLOCK_SIZE_M
    return ids, pos, valid, num_blocks


@triton.jit
def _block_slots(ids, pos, valid, numel, pid_m, BLOCK_SIZE_M: tl.constexpr, NUMEL_PAD: tl.constexpr):
    """(slots, expert) of row block `pid_m`, given _slot_positions' (ids, pos, valid)."""
    i = tl.arange(0, NUMEL_PAD)
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
    inter_ptr,  # [M * topk, N], or [M * topk, 2N] with ACT_NONE
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
    _gemm1_tile(x_ptr, w1_ptr, b1_ptr, inter_ptr, slots, expert, pid_n, N, K, numel,
                stride_xm, stride_we, stride_wn, stride_be, stride_im,
                TOPK, INTERLEAVED, ACTIVATION, HAS_BIAS, EVEN_K, PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)


@triton.jit
def _gemm1_tile(x_ptr, w1_ptr, b1_ptr, inter_ptr, slots, expert, pid_n, N, K, numel,
                stride_xm, stride_we, stride_wn, stride_be, stride_im,
                TOPK: tl.constexpr, INTERLEAVED: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                EVEN_K: tl.constexpr, PRECISION: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
                BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    """One GEMM 1 tile: block `slots` (of `expert`) times BLOCK_SIZE_N rows of w1.

    With an activation (ACT_SILU, ACT_SWIGLU_OAI) the tile's rows are (gate,
    up) pairs (see the module docstring) and it stores BLOCK_SIZE_N // 2
    activated columns of the [numel, N] intermediate. With ACT_NONE (vLLM's
    GEMM 1) they are w1 rows pid_n * BLOCK_SIZE_N onwards, stored as they are
    (plus bias) into the [numel, 2N] gate/up buffer.
    """
    tok_mask = slots < numel
    rows = (slots // TOPK).to(tl.int64)
    offs_j, w_row, _ = _gemm1_rows(pid_n, N, INTERLEAVED, ACTIVATION, BLOCK_SIZE_N)
    # The K loop of _gemm1_acc, written out: as a call, the compiler orders the
    # address arithmetic differently and fused_moe's PTX (whose timings are on
    # record) would change. _gemm1_acc is the persistent kernel's (split K).
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

    _gemm1_store(acc, b1_ptr, inter_ptr, slots, tok_mask, expert, w_row, offs_j, pid_n, N, stride_be, stride_im,
                 ACTIVATION, HAS_BIAS, BLOCK_SIZE_M, BLOCK_SIZE_N)


@triton.jit
def _gemm1_rows(pid_n, N, INTERLEAVED: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """(offs_j, w_row, row_ok): the w1 rows of GEMM 1 column tile pid_n (see
    _gemm1_tile), and which of them the tile stores (the tail tile's others
    wrap around to rows in bounds)."""
    HALF: tl.constexpr = BLOCK_SIZE_N // 2
    offs_j = tl.arange(0, BLOCK_SIZE_N)
    if ACTIVATION == 2:
        # `% (2 * N)` keeps the tail tile's loads in bounds; those columns are not stored.
        w_row = (pid_n * BLOCK_SIZE_N + offs_j) % (2 * N)
        row_ok = pid_n * BLOCK_SIZE_N + offs_j < 2 * N
    else:
        # `% N` keeps the tail tile's loads in bounds; those columns are not stored.
        act_col = (pid_n * HALF + offs_j // 2) % N
        is_up = offs_j % 2
        if INTERLEAVED:
            w_row = 2 * act_col + is_up
        else:
            w_row = act_col + is_up * N
        row_ok = pid_n * HALF + offs_j // 2 < N
    return offs_j, w_row, row_ok


@triton.jit
def _gemm1_acc(x_ptr, w1_ptr, rows, tok_mask, expert, w_row, row_ok, k_first, k_last, K, stride_xm, stride_we,
               stride_wn, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
               BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    """GEMM 1's fp32 accumulator over K steps [k_first, k_last) of BLOCK_SIZE_K:
    x rows `rows` times w1[expert] rows `w_row`. Rows outside `row_ok` are not
    read (a tail tile of 64 rows over 2N=720 would read 48 rows it never
    stores: 7 % more w1 traffic)."""
    offs_k = tl.arange(0, BLOCK_SIZE_K)

    a_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] + k_first * BLOCK_SIZE_K
    w_base = w1_ptr + expert * stride_we
    b_ptrs = w_base + w_row[None, :].to(tl.int64) * stride_wn + offs_k[:, None] + k_first * BLOCK_SIZE_K

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(k_first, k_last):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=tok_mask[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=row_ok[None, :], other=0.0)
        else:
            k_rem = K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=tok_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0)
            b = tl.load(b_ptrs, mask=row_ok[None, :] & (offs_k[:, None] < k_rem), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_SIZE_K
        b_ptrs += BLOCK_SIZE_K
    return acc


@triton.jit
def _gemm1_store(acc, b1_ptr, inter_ptr, slots, tok_mask, expert, w_row, offs_j, pid_n, N, stride_be, stride_im,
                 ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
                 BLOCK_SIZE_N: tl.constexpr):
    """GEMM 1's epilogue: + b1, the activation (unless ACT_NONE), store (see _gemm1_tile)."""
    HALF: tl.constexpr = BLOCK_SIZE_N // 2
    if HAS_BIAS:
        bias = tl.load(b1_ptr + expert * stride_be + w_row).to(tl.float32)
        acc += bias[None, :]

    if ACTIVATION == 2:
        offs_c = pid_n * BLOCK_SIZE_N + offs_j
        c_ptrs = inter_ptr + slots[:, None].to(tl.int64) * stride_im + offs_c[None, :]
        tl.store(c_ptrs, acc.to(inter_ptr.dtype.element_ty), mask=tok_mask[:, None] & (offs_c[None, :] < 2 * N))
    else:
        gate, up = tl.split(tl.reshape(acc, (BLOCK_SIZE_M, HALF, 2)))
        act = _activate(gate, up, ACTIVATION)
        offs_c = pid_n * HALF + tl.arange(0, HALF)
        c_ptrs = inter_ptr + slots[:, None].to(tl.int64) * stride_im + offs_c[None, :]
        tl.store(c_ptrs, act.to(inter_ptr.dtype.element_ty), mask=tok_mask[:, None] & (offs_c[None, :] < N))


@triton.jit
def _activate(gate, up, ACTIVATION: tl.constexpr):
    """The gated activation in fp32: silu(gate) * up, or gpt-oss's clamped SwiGLU."""
    if ACTIVATION == 0:  # silu(gate) * up
        act = gate * tl.sigmoid(gate) * up
    else:  # gpt-oss clamped SwiGLU
        gate = tl.minimum(gate, 7.0)
        up = tl.minimum(tl.maximum(up, -7.0), 7.0)
        act = (up + 1.0) * gate * tl.sigmoid(1.702 * gate)
    return act


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
    acc = _gemm2_acc(inter_ptr, w2_ptr, b2_ptr, slots64, tok_mask, expert, offs_n, offs_k, K_RED,
                     stride_im, stride_we, stride_wn, stride_be,
                     HAS_BIAS, EVEN_K, PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, "")
    w = tl.load(weights_ptr + slots64, mask=tok_mask, other=0.0).to(tl.float32)
    acc = acc * w[:, None]

    c_ptrs = out_ptr + slots64[:, None] * stride_om + offs_n_raw[None, :]
    tl.store(c_ptrs, acc.to(out_ptr.dtype.element_ty), mask=tok_mask[:, None] & (offs_n_raw[None, :] < N_OUT))


@triton.jit
def _gemm2_acc(inter_ptr, w2_ptr, b2_ptr, slots64, tok_mask, expert, offs_n, offs_k, K_RED,
               stride_im, stride_we, stride_wn, stride_be,
               HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
               BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, A_CACHE: tl.constexpr):
    """One GEMM 2 tile in fp32: intermediate rows `slots64` times w2[expert] rows
    `offs_n`, plus b2; the routing weight is the caller's. `A_CACHE` is the
    cache modifier of the intermediate's loads ("" or ".cg": from L2, for an
    intermediate other programs of the same launch wrote)."""
    a_ptrs = inter_ptr + slots64[:, None] * stride_im + offs_k[None, :]
    b_ptrs = w2_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K_RED, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=tok_mask[:, None], other=0.0, cache_modifier=A_CACHE)
            b = tl.load(b_ptrs)
        else:
            k_rem = K_RED - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=tok_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0,
                        cache_modifier=A_CACHE)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_SIZE_K
        b_ptrs += BLOCK_SIZE_K

    if HAS_BIAS:
        bias = tl.load(b2_ptr + expert * stride_be + offs_n).to(tl.float32)
        acc += bias[None, :]
    return acc


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



@triton.jit
def moe_act_kernel(
    src_ptr,  # [M * topk, 2N]: GEMM 1's gate and up (ACT_NONE), biases already added
    dst_ptr,  # [M * topk, N]: the activated intermediate
    N,
    INTERLEAVED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """vLLM's `silu_and_mul` / `swigluoai_and_mul` as its own kernel, one row of
    BLOCK columns per program: gate and up read from GEMM 1's [*, 2N] output,
    the activation computed in fp32, stored in the intermediate's dtype."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    src = src_ptr + row * 2 * N
    if INTERLEAVED:  # gpt-oss: even columns gate, odd columns up
        gate = tl.load(src + 2 * offs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(src + 2 * offs + 1, mask=mask, other=0.0).to(tl.float32)
    else:  # gate columns [0, N), up columns [N, 2N)
        gate = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(src + N + offs, mask=mask, other=0.0).to(tl.float32)
    act = _activate(gate, up, ACTIVATION)
    tl.store(dst_ptr + row * N + offs, act.to(dst_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# The persistent MoE: the whole call in one launch.

# Workspace words (int32). The launch leaves every word as it found it (zero),
# so it is zeroed once when a launch is bound and never again.
WS_ALIGNED = 0  # program 0 published the alignment (program 0 -> everyone)
WS_EXITED = 1  # programs past their last wait; the last one clears WS_ALIGNED and itself
WS_TIMED_OUT = 2  # sticky: some wait gave up after MAX_SPIN polls (the output is then wrong)
WS_HEADER = 32  # 128 bytes: the counters below start on a line of their own
# then READY[max_blocks]: GEMM 1 tiles done per block; DONE[max_blocks]: GEMM 2
# tiles done per block; ARRIVED[M * n_tiles2]: GEMM 2 rows in per (token, column
# tile); with SPLIT_K > 1, SPLITS[max_blocks * n_tiles1]: K slices in per GEMM 1 tile.
# The same, as the kernel reads them (a @triton.jit function sees only constexpr globals).
_WS_ALIGNED = tl.constexpr(WS_ALIGNED)
_WS_EXITED = tl.constexpr(WS_EXITED)
_WS_TIMED_OUT = tl.constexpr(WS_TIMED_OUT)
_WS_HEADER = tl.constexpr(WS_HEADER)


@triton.jit
def _wait_at_least(counter_ptr, target, timed_out_ptr, MAX_SPIN: tl.constexpr):
    """Spin until *counter_ptr >= target, then acquire what its writers released.

    Polls with volatile loads (served by L2, no atomic traffic on the hot
    word), then one acquire read-modify-write, whose value is the counter's
    latest: every increment is a release RMW, so this acquire synchronises
    with all of them. After MAX_SPIN polls it stops waiting, sets the sticky
    timed-out word and carries on: a wrong answer the check reports, where a
    grid larger than the GPU holds (which cannot happen when the grid is
    sized from the occupancy, see persistent_grid) would otherwise hang.
    """
    seen = tl.load(counter_ptr, volatile=True)
    spins = 0
    while (seen < target) & (spins < MAX_SPIN):
        seen = tl.load(counter_ptr, volatile=True)
        spins += 1
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    if seen < target:
        tl.atomic_xchg(timed_out_ptr, 1, sem="relaxed", scope="gpu")
    # Everyone in the program reads after the acquire (it was one thread's).
    tl.debug_barrier()


# Words a program's timeline takes (TRACE): start, GEMM 1 begins, GEMM 1 ends, end, SM id.
TRACE_PER_PROGRAM = 5
_TRACE_PER_PROGRAM = tl.constexpr(TRACE_PER_PROGRAM)


@triton.jit
def _stamp(ptr, TRACE: tl.constexpr):
    """Store the GPU's global nanosecond clock (%globaltimer) at ptr when TRACE; nothing otherwise."""
    if TRACE:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(ptr, now)


@triton.jit
def _prefetch_l2(base_ptr, numel, LINE: tl.constexpr, LINES: tl.constexpr):
    """Ask L2 to fetch `numel` contiguous elements from `base_ptr`, one
    `prefetch.global.L2::evict_last` per LINE elements (a 128-byte line).
    Nothing waits for it: the loads that need the data later find it in L2."""
    for start in range(0, numel, LINE * LINES):
        offs = tl.minimum(start + tl.arange(0, LINES) * LINE, numel - 1)
        tl.inline_asm_elementwise(
            "prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l", [base_ptr + offs],
            dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def moe_persistent_kernel(
    x_ptr,  # [M, K]
    w1_ptr,  # [E, 2N, K]
    b1_ptr,  # [E, 2N] (unused unless HAS_BIAS)
    w2_ptr,  # [E, K, N]
    b2_ptr,  # [E, K] (unused unless HAS_BIAS)
    topk_ids_ptr,  # int32 [M * topk]
    weights_ptr,  # fp32 [M * topk] routing weights
    inter_ptr,  # [M * topk, N]: GEMM 1's activated output
    part_ptr,  # fp32 [M * topk, K]: GEMM 2's weighted rows
    slices_ptr,  # fp32 [max_blocks * n_tiles1 * SPLIT_K, BLOCK_SIZE_M, BLOCK_SIZE_N]: GEMM 1's K slices (SPLIT_K > 1)
    out_ptr,  # [M, K]
    sorted_ids_ptr,  # alignment in memory (unless SELF_ALIGN)
    expert_ids_ptr,
    num_post_ptr,
    cursor_ptr,
    ws_ptr,  # int32 workspace, zero between launches (WS_* above)
    trace_ptr,  # int64 timeline (TRACE; see trace_layout), else any pointer
    # A constexpr: Triton knows an integer argument's divisibility by 16 only, and
    # N=360 (gpt-oss's smallest shard) is not, so every w2 and intermediate row
    # would look unaligned and GEMM 2 would load them two bytes at a time,
    # unpipelined (H100, 2026-11-22: the whole call 27 us at M=1).
    N: tl.constexpr,
    K,
    numel,
    num_experts,
    max_blocks,
    max_padded,
    ws_words,
    TOPK: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K1: tl.constexpr,
    EVEN_K2: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,  # GEMM 1 tile: w1 rows (gate/up pairs)
    BLOCK_SIZE_K: tl.constexpr,  # GEMM 1 reduction step (over K)
    BLOCK_SIZE_N2: tl.constexpr,  # GEMM 2 tile: output columns (of K)
    BLOCK_SIZE_K2: tl.constexpr,  # GEMM 2 reduction step (over N)
    SPLIT_K: tl.constexpr,  # GEMM 1 tiles split in this many K slices (1: not split)
    SELF_ALIGN: tl.constexpr,  # NUMEL_PAD: every program aligns in registers; 0: program 0 aligns into memory
    E_PAD: tl.constexpr,  # alignment constexprs (see _align_meta), used when SELF_ALIGN is 0
    CHUNK: tl.constexpr,
    BCHUNK: tl.constexpr,
    PHASE: tl.constexpr,  # -1: the whole call, synchronised in-kernel (GPU); 0, 1, 2: one phase (interpreter)
    PREFETCH_W2: tl.constexpr,  # 0, or the elements per 128-byte line: prefetch GEMM 2's w2 tiles into L2
    MAX_SPIN: tl.constexpr,
    TRACE: tl.constexpr,  # 1: stamp %globaltimer at each step into trace_ptr (bench/moe_persistent_timeline.py)
):
    """Alignment, GEMM 1 with the activation, GEMM 2 with the routing weights
    and the top-k sum in one launch (see PersistentMoELaunch for the design).

    PHASE -1 runs everything, with in-kernel waits between dependent work, and
    needs every program resident at once: only on a GPU, with a grid from
    persistent_grid. Triton's interpreter runs programs one after another, so a
    wait there would never end: it launches the kernel once per phase instead
    (0: alignment, unless SELF_ALIGN; 1: GEMM 1; 2: GEMM 2 and the sum), which
    runs the same arithmetic and the same counters, only without waiting.
    """
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    SYNC: tl.constexpr = PHASE < 0
    n_tiles1 = tl.cdiv(2 * N, BLOCK_SIZE_N)
    n_tiles2 = tl.cdiv(K, BLOCK_SIZE_N2)
    ready_ptr = ws_ptr + _WS_HEADER
    done_ptr = ready_ptr + max_blocks
    arrived_ptr = done_ptr + max_blocks
    splits_ptr = arrived_ptr + (numel // TOPK) * n_tiles2
    timed_out_ptr = ws_ptr + _WS_TIMED_OUT
    # Timeline (TRACE): per program [start, GEMM 1 begins, GEMM 1 ends, end, SM],
    # then per GEMM 1 item [begin, K loop done, end], then per GEMM 2 item
    # [begin, wait over, K loop done, end].
    trace_items1 = trace_ptr + grid * _TRACE_PER_PROGRAM
    trace_items2 = trace_items1 + 3 * max_blocks * n_tiles1 * SPLIT_K
    _stamp(trace_ptr + pid * _TRACE_PER_PROGRAM, TRACE)
    if TRACE:
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
        tl.store(trace_ptr + pid * _TRACE_PER_PROGRAM + 4, sm.to(tl.int64))

    # ---- alignment: which slots each BLOCK_SIZE_M block holds, and its expert.
    if SELF_ALIGN:
        # A few slots: every program computes the whole layout in registers
        # (the same, stable layout everywhere), no wait.
        ids, pos, valid, num_blocks = _slot_positions(topk_ids_ptr, numel, num_experts, BLOCK_SIZE_M, SELF_ALIGN)
    else:
        if PHASE <= 0:
            if pid == 0:
                _align(topk_ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, cursor_ptr, numel, num_experts,
                       max_padded, max_blocks, BLOCK_SIZE_M, E_PAD, CHUNK, BCHUNK)
                if SYNC:
                    tl.debug_barrier()  # every thread's alignment stores are issued
                    tl.atomic_xchg(ws_ptr + _WS_ALIGNED, 1, sem="release", scope="gpu")
        if SYNC:
            _wait_at_least(ws_ptr + _WS_ALIGNED, 1, timed_out_ptr, MAX_SPIN)
        # .cg: from L2, never from a line this SM's L1 held before program 0 wrote it.
        num_blocks = tl.load(num_post_ptr, cache_modifier=".cg") // BLOCK_SIZE_M
    total1 = num_blocks * n_tiles1 * SPLIT_K
    total2 = num_blocks * n_tiles2
    if SYNC:
        # Bring the workspace's lines into L2 now, one line a program: after a cold
        # L2 the counters' first atomics would each wait for DRAM, on the critical path.
        ws_line = pid * 32
        if ws_line < ws_words:
            _prefetch_l2(ws_ptr + ws_line, 1, 32, 1)
    # GEMM 2 items continue GEMM 1's round robin: item i (GEMM 1 items first,
    # then GEMM 2's) goes to program i % grid, so the programs with no GEMM 1
    # item left take the first GEMM 2 items.
    first2 = (pid + grid - total1 % grid) % grid if SYNC else pid

    if SYNC and PREFETCH_W2:
        # GEMM 2's weights into L2 now, while GEMM 1 streams w1: they do not
        # depend on GEMM 1, and HBM stays busy across the wait. Where at least a
        # quarter of the programs have no GEMM 1 item (decode sizes), those share
        # them all out, so the others start GEMM 1 at once; otherwise each
        # program asks for its own GEMM 2 tiles (a few idle programs would each
        # issue a large share of w2's lines, one 128-byte line an instruction).
        prefetch_first = first2
        prefetch_step = grid
        if (total1 < grid) & ((grid - total1) * 4 >= grid):
            prefetch_step = grid - total1
            prefetch_first = pid - total1
            if pid < total1:
                prefetch_first = total2
        for j in range(prefetch_first, total2, prefetch_step):
            m = j // n_tiles2
            if SELF_ALIGN:
                _, expert = _block_slots(ids, pos, valid, numel, m, BLOCK_SIZE_M, SELF_ALIGN)
            else:
                expert = tl.load(expert_ids_ptr + m, cache_modifier=".cg")
            row0 = (j % n_tiles2) * BLOCK_SIZE_N2
            rows = tl.minimum(BLOCK_SIZE_N2, K - row0)
            # The tile's w2 rows are contiguous: rows * N elements.
            _prefetch_l2(w2_ptr + expert.to(tl.int64) * K * N + row0.to(tl.int64) * N, rows * N, PREFETCH_W2, 256)

    # ---- GEMM 1 (+ bias, activation): item t is K slice t % SPLIT_K of tile
    # t // SPLIT_K, which is block tile // n_tiles1, w1 rows tile tile % n_tiles1.
    _stamp(trace_ptr + pid * _TRACE_PER_PROGRAM + 1, TRACE)
    if PHASE == -1 or PHASE == 1:
        n_k = tl.cdiv(K, BLOCK_SIZE_K)
        k_per_slice = tl.cdiv(n_k, SPLIT_K)
        for t in range(pid, total1, grid):
            _stamp(trace_items1 + 3 * t, TRACE)
            tile = t // SPLIT_K
            m = tile // n_tiles1
            pid_n = tile % n_tiles1
            if SELF_ALIGN:
                slots, expert = _block_slots(ids, pos, valid, numel, m, BLOCK_SIZE_M, SELF_ALIGN)
            else:
                slots = tl.load(sorted_ids_ptr + m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M), cache_modifier=".cg")
                expert = tl.load(expert_ids_ptr + m, cache_modifier=".cg")
            expert = expert.to(tl.int64)
            tok_mask = slots < numel
            rows = (slots // TOPK).to(tl.int64)
            offs_j, w_row, row_ok = _gemm1_rows(pid_n, N, INTERLEAVED, ACTIVATION, BLOCK_SIZE_N)
            if SPLIT_K == 1:
                acc = _gemm1_acc(x_ptr, w1_ptr, rows, tok_mask, expert, w_row, row_ok, 0, n_k, K, K, 2 * N * K, K,
                                 EVEN_K1, PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
                _stamp(trace_items1 + 3 * t + 1, TRACE)
                _gemm1_store(acc, b1_ptr, inter_ptr, slots, tok_mask, expert, w_row, offs_j, pid_n, N, 2 * N, N,
                             ACTIVATION, HAS_BIAS, BLOCK_SIZE_M, BLOCK_SIZE_N)
                finished = True
            else:
                # One K slice into its own fp32 tile; the program that brings the
                # tile's count to SPLIT_K sums the slices in slice order, then runs
                # the epilogue (bias, activation, store) and clears the count.
                k_first = (t % SPLIT_K) * k_per_slice
                k_last = tl.minimum(k_first + k_per_slice, n_k)
                acc = _gemm1_acc(x_ptr, w1_ptr, rows, tok_mask, expert, w_row, row_ok, k_first, k_last, K, K,
                                 2 * N * K, K,
                                 EVEN_K1, PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
                _stamp(trace_items1 + 3 * t + 1, TRACE)
                tile_elems = BLOCK_SIZE_M * BLOCK_SIZE_N
                offs_tile = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
                tile_base = slices_ptr + tile.to(tl.int64) * SPLIT_K * tile_elems
                tl.store(tile_base + (t % SPLIT_K) * tile_elems + offs_tile, acc)
                tl.debug_barrier()
                arrived = tl.atomic_add(splits_ptr + tile, 1, sem="acq_rel", scope="gpu")
                finished = arrived == SPLIT_K - 1
                if finished:
                    tl.debug_barrier()
                    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                    for k_slice in tl.static_range(SPLIT_K):
                        acc += tl.load(tile_base + k_slice * tile_elems + offs_tile, cache_modifier=".cg")
                    _gemm1_store(acc, b1_ptr, inter_ptr, slots, tok_mask, expert, w_row, offs_j, pid_n, N, 2 * N, N,
                                 ACTIVATION, HAS_BIAS, BLOCK_SIZE_M, BLOCK_SIZE_N)
                    tl.atomic_xchg(splits_ptr + tile, 0, sem="relaxed", scope="gpu")
            if finished:
                # Publish the tile: GEMM 2's tiles of block m wait for all n_tiles1 of them.
                tl.debug_barrier()
                tl.atomic_add(ready_ptr + m, 1, sem="release", scope="gpu")
            _stamp(trace_items1 + 3 * t + 2, TRACE)
    _stamp(trace_ptr + pid * _TRACE_PER_PROGRAM + 2, TRACE)

    # ---- GEMM 2 (+ bias, x routing weight) and the top-k sum.
    if PHASE == -1 or PHASE == 2:
        for j in range(first2, total2, grid):
            _stamp(trace_items2 + 4 * j, TRACE)
            m = j // n_tiles2
            pid_n = j % n_tiles2
            # The block's slots and expert depend on the alignment only, not on GEMM 1.
            if SELF_ALIGN:
                slots, expert = _block_slots(ids, pos, valid, numel, m, BLOCK_SIZE_M, SELF_ALIGN)
            else:
                slots = tl.load(sorted_ids_ptr + m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M), cache_modifier=".cg")
                expert = tl.load(expert_ids_ptr + m, cache_modifier=".cg")
            expert = expert.to(tl.int64)
            tok_mask = slots < numel
            slots64 = slots.to(tl.int64)
            offs_n_raw = pid_n * BLOCK_SIZE_N2 + tl.arange(0, BLOCK_SIZE_N2)
            offs_n = offs_n_raw % K
            col_mask = offs_n_raw < K
            if SYNC:
                # Every program took its GEMM 1 items before any GEMM 2 item, and every
                # program is resident, so the tiles waited for are running or done.
                _wait_at_least(ready_ptr + m, n_tiles1, timed_out_ptr, MAX_SPIN)
            _stamp(trace_items2 + 4 * j + 1, TRACE)
            # Block bookkeeping: the last GEMM 2 tile of block m past its wait clears
            # the block's counters for the next launch. Relaxed: counting needs no
            # ordering, and an acq_rel count (what it was, before the top-k count)
            # costs a fence on top of the round trip.
            done = tl.atomic_add(done_ptr + m, 1, sem="relaxed", scope="gpu")
            # The intermediate was written by other programs of this launch: from L2 (.cg).
            acc = _gemm2_acc(inter_ptr, w2_ptr, b2_ptr, slots64, tok_mask, expert, offs_n,
                             tl.arange(0, BLOCK_SIZE_K2), N, N, K * N, N, K,
                             HAS_BIAS, EVEN_K2, PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N2, BLOCK_SIZE_K2, ".cg")
            _stamp(trace_items2 + 4 * j + 2, TRACE)
            w = tl.load(weights_ptr + slots64, mask=tok_mask, other=0.0).to(tl.float32)
            acc = acc * w[:, None]
            tl.store(part_ptr + slots64[:, None] * K + offs_n_raw[None, :], acc,
                     mask=tok_mask[:, None] & col_mask[None, :])
            tl.debug_barrier()  # every thread's rows are issued before the releases below

            # The top-k sum: the block's rows are distinct tokens (a token meets an
            # expert once). The program that brings a token's count for this column
            # tile to TOPK sums the token's TOPK rows, in slot order (the result does
            # not depend on who came last), and clears the count.
            tok = slots64 // TOPK
            arrived = tl.atomic_add(arrived_ptr + tok * n_tiles2 + pid_n, 1, mask=tok_mask,
                                    sem="acq_rel", scope="gpu")
            last = tok_mask & (arrived == TOPK - 1)
            tl.debug_barrier()  # the acquires above come before any thread's reads below
            _topk_sum(part_ptr, out_ptr, tok, last, offs_n_raw, col_mask, K, TOPK, BLOCK_SIZE_M, BLOCK_SIZE_N2)
            tl.store(arrived_ptr + tok * n_tiles2 + pid_n, 0, mask=last)
            if done == n_tiles2 - 1:
                tl.atomic_xchg(ready_ptr + m, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(done_ptr + m, 0, sem="relaxed", scope="gpu")
            _stamp(trace_items2 + 4 * j + 3, TRACE)

    if SYNC:
        if not SELF_ALIGN:
            # The last program past every wait clears the alignment flag (and this count).
            tl.debug_barrier()
            exited = tl.atomic_add(ws_ptr + _WS_EXITED, 1, sem="acq_rel", scope="gpu")
            if exited == grid - 1:
                tl.atomic_xchg(ws_ptr + _WS_ALIGNED, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(ws_ptr + _WS_EXITED, 0, sem="relaxed", scope="gpu")
    _stamp(trace_ptr + pid * _TRACE_PER_PROGRAM + 3, TRACE)


@triton.jit
def _topk_sum(part_ptr, out_ptr, tok, rows_mask, offs_n, col_mask, K, TOPK: tl.constexpr,
              BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """out[tok, offs_n] = sum over j < TOPK of part[tok * TOPK + j, offs_n], in
    fp32 and in slot order, for the rows in rows_mask. part rows come from
    other programs of the launch: read from L2 (.cg)."""
    mask = rows_mask[:, None] & col_mask[None, :]
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(part_ptr + (tok * TOPK + j)[:, None] * K + offs_n[None, :], mask=mask, other=0.0,
                       cache_modifier=".cg")
    tl.store(out_ptr + tok[:, None] * K + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# The persistent MoE's GEMV schedule (config GEMV=1): a few tokens, no tl.dot.

# Its workspace words (int32; WS_TIMED_OUT as above). Zero between launches.
GEMV_WS_DONE1 = 0  # GEMM 1 items done this launch; GEMM 2 waits for all of them
GEMV_WS_PASSED = 1  # programs past that wait; the last one clears both words
_GEMV_WS_DONE1 = tl.constexpr(GEMV_WS_DONE1)
_GEMV_WS_PASSED = tl.constexpr(GEMV_WS_PASSED)


@triton.jit
def _load_acquire(ptr):
    """One int32 read with acquire semantics at GPU scope (PTX ld.acquire.gpu)."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _wait_acquire(counter_ptr, target, timed_out_ptr, ACQUIRE_LOADS: tl.constexpr, MAX_SPIN: tl.constexpr):
    """Spin until *counter_ptr >= target; what its writers released is then visible.

    With ACQUIRE_LOADS (CUDA) every thread polls with acquire loads, so the
    wait ends without _wait_at_least's read-modify-write: one L2 round trip
    less on the way to GEMM 2 (H100, E=128 N=360 M=1: 11.36 -> 10.89 µs under
    graph timing, with the clearing below moved off the exit). Otherwise
    _wait_at_least's volatile polls and acquire RMW. A wait that gives up
    after MAX_SPIN polls sets the sticky timed-out word."""
    if ACQUIRE_LOADS:
        seen = _load_acquire(counter_ptr)
        spins = 0
        while (seen < target) & (spins < MAX_SPIN):
            seen = _load_acquire(counter_ptr)
            spins += 1
        if seen < target:
            tl.atomic_xchg(timed_out_ptr, 1, sem="relaxed", scope="gpu")
    else:
        _wait_at_least(counter_ptr, target, timed_out_ptr, MAX_SPIN)


@triton.jit
def _dot_two_parts(base_ptr, row_offs, vec_ptr, LEN: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """For each row: sum over j < LEN of base[row_offs + j] * vec[j], in fp32.

    The LEN columns are read as two power-of-two tiles, A (<= LEN, unmasked)
    and B (covering the rest): 2048 + 1024 for K=2880, where one padded tile
    of 4096 would hold 30 % masked lanes in registers. Every load is issued
    before any product, so a row's whole reduction is in flight at once."""
    offs_a = tl.arange(0, A)
    offs_b = A + tl.arange(0, B)
    in_b = offs_b < LEN
    wa = tl.load(base_ptr + row_offs[:, None] + offs_a[None, :])
    wb = tl.load(base_ptr + row_offs[:, None] + offs_b[None, :], mask=in_b[None, :], other=0.0)
    va = tl.load(vec_ptr + offs_a).to(tl.float32)
    vb = tl.load(vec_ptr + offs_b, mask=in_b, other=0.0).to(tl.float32)
    return tl.sum(wa.to(tl.float32) * va[None, :], axis=1) + tl.sum(wb.to(tl.float32) * vb[None, :], axis=1)


@triton.jit
def moe_persistent_gemv_kernel(
    x_ptr,  # [M, K]
    w1_ptr,  # [E, 2N, K]
    b1_ptr,  # [E, 2N] (unused unless HAS_BIAS)
    w2_ptr,  # [E, K, N]
    b2_ptr,  # [E, K] (unused unless HAS_BIAS)
    topk_ids_ptr,  # int32 [M * topk]
    weights_ptr,  # fp32 [M * topk] routing weights
    inter_ptr,  # [M * topk, N]: GEMM 1's activated output
    out_ptr,  # [M, K]
    ws_ptr,  # int32 workspace, zero between launches (GEMV_WS_* and WS_TIMED_OUT)
    M,
    N: tl.constexpr,
    K: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROWS1: tl.constexpr,  # activated columns per GEMM 1 item (BLOCK_SIZE_N // 2: gate/up row pairs)
    K_A: tl.constexpr,  # K read as two power-of-two parts (see _dot_two_parts)
    K_B: tl.constexpr,
    COLS2: tl.constexpr,  # output columns per GEMM 2 item (BLOCK_SIZE_N2)
    N_A: tl.constexpr,  # N read as two power-of-two parts
    N_B: tl.constexpr,
    ACQUIRE_LOADS: tl.constexpr,
    PHASE: tl.constexpr,  # -1: the whole call, synchronised in-kernel (GPU); 1, 2: one phase (interpreter)
    MAX_SPIN: tl.constexpr,
):
    """The whole MoE call for a few tokens as matrix-vector products, in one launch.

    A GEMM 1 item is one (token, expert) slot's ROWS1 activated columns: its
    2 * ROWS1 w1 rows (gate and up) against the token's x, whole K in one
    tile. A GEMM 2 item is one token's COLS2 output columns: the w2 rows of
    all the token's TOPK experts against their activated rows, weighted and
    summed in registers in a fixed order (the same bits every launch), and stored: no
    intermediate fp32 rows, no top-k count, no separate sum. GEMM 2's w2
    tile does not depend on GEMM 1, so it is loaded before the wait for
    GEMM 1. One counter joins the two: each program adds its GEMM 1 items
    once, after all of them (one release a program), and GEMM 2 waits for the
    total. See PersistentMoELaunch for the measurements.
    """
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    SYNC: tl.constexpr = PHASE < 0
    n_tiles1 = tl.cdiv(N, ROWS1)
    total1 = M * TOPK * n_tiles1
    n_tiles2 = tl.cdiv(K, COLS2)
    total2 = M * n_tiles2
    done1_ptr = ws_ptr + _GEMV_WS_DONE1
    passed_ptr = ws_ptr + _GEMV_WS_PASSED
    timed_out_ptr = ws_ptr + _WS_TIMED_OUT
    # GEMM 2 items continue GEMM 1's round robin (as in moe_persistent_kernel):
    # the programs with no GEMM 1 item left take the first GEMM 2 items.
    first2 = (pid + grid - total1 % grid) % grid if SYNC else pid

    if PHASE == -1 or PHASE == 1:
        mine = 0
        for t in range(pid, total1, grid):
            slot = t // n_tiles1
            tok = slot // TOPK
            expert = tl.load(topk_ids_ptr + slot).to(tl.int64)
            cols = (t % n_tiles1) * ROWS1 + tl.arange(0, ROWS1)
            cols_ok = cols < N
            cols_in = tl.minimum(cols, N - 1)  # the tail item's extra columns read a row in bounds, unstored
            if INTERLEAVED:
                gate_row = 2 * cols_in
                up_row = gate_row + 1
            else:
                gate_row = cols_in
                up_row = cols_in + N
            # Gate and up rows as one tile of 2 * ROWS1 rows (gate, up, gate, up, ...).
            rows = tl.reshape(tl.join(gate_row, up_row), (2 * ROWS1,)).to(tl.int64)
            dots = _dot_two_parts(w1_ptr + expert * (2 * N * K), rows * K, x_ptr + tok.to(tl.int64) * K, K, K_A, K_B)
            gate, up = tl.split(tl.reshape(dots, (ROWS1, 2)))
            if HAS_BIAS:
                gate += tl.load(b1_ptr + expert * (2 * N) + gate_row).to(tl.float32)
                up += tl.load(b1_ptr + expert * (2 * N) + up_row).to(tl.float32)
            act = _activate(gate, up, ACTIVATION)
            tl.store(inter_ptr + slot.to(tl.int64) * N + cols, act.to(inter_ptr.dtype.element_ty), mask=cols_ok)
            mine += 1
        if SYNC and mine > 0:
            tl.debug_barrier()  # every thread's stores are issued before the release
            tl.atomic_add(done1_ptr, mine, sem="release", scope="gpu")

    if PHASE == -1 or PHASE == 2:
        offs_s = tl.arange(0, TOPK_PAD)
        slot_ok = offs_s < TOPK
        offs_na = tl.arange(0, N_A)
        offs_nb = N_A + tl.arange(0, N_B)
        in_nb = offs_nb < N
        waited = False
        for j in range(first2, total2, grid):
            tok = j // n_tiles2
            cols = (j % n_tiles2) * COLS2 + tl.arange(0, COLS2)
            cols_ok = cols < K
            cols_in = tl.minimum(cols, K - 1).to(tl.int64)
            slots = tok * TOPK + offs_s
            experts = tl.load(topk_ids_ptr + slots, mask=slot_ok, other=0).to(tl.int64)
            w_rows = experts[:, None, None] * (K * N) + cols_in[None, :, None] * N  # [TOPK_PAD, COLS2, 1]
            wa = tl.load(w2_ptr + w_rows + offs_na[None, None, :], mask=slot_ok[:, None, None], other=0.0)
            wb = tl.load(w2_ptr + w_rows + offs_nb[None, None, :], mask=slot_ok[:, None, None] & in_nb[None, None, :],
                         other=0.0)
            routing = tl.load(weights_ptr + slots, mask=slot_ok, other=0.0)
            if SYNC and not waited:
                _wait_acquire(done1_ptr, total1, timed_out_ptr, ACQUIRE_LOADS, MAX_SPIN)
            # The activated rows were written by other programs of this launch: from L2 (.cg).
            a_rows = inter_ptr + slots[:, None].to(tl.int64) * N
            aa = tl.load(a_rows + offs_na[None, :], mask=slot_ok[:, None], other=0.0, cache_modifier=".cg")
            ab = tl.load(a_rows + offs_nb[None, :], mask=slot_ok[:, None] & in_nb[None, :], other=0.0,
                         cache_modifier=".cg")
            if SYNC and not waited:
                # The last program past the wait clears both words for the next launch
                # (every GEMM 1 count is in, every waiter has read it). Counted after the
                # loads above are issued, so its round trip overlaps theirs, and not at
                # exit, where the last program would wait for it.
                passed = tl.atomic_add(passed_ptr, 1, sem="relaxed", scope="gpu")
                if passed == tl.minimum(grid, total2) - 1:
                    tl.atomic_xchg(done1_ptr, 0, sem="relaxed", scope="gpu")
                    tl.atomic_xchg(passed_ptr, 0, sem="relaxed", scope="gpu")
            waited = True
            per_slot = (tl.sum(wa.to(tl.float32) * aa.to(tl.float32)[:, None, :], axis=2)
                        + tl.sum(wb.to(tl.float32) * ab.to(tl.float32)[:, None, :], axis=2))  # [TOPK_PAD, COLS2]
            if HAS_BIAS:
                per_slot += tl.load(b2_ptr + experts[:, None] * K + cols_in[None, :], mask=slot_ok[:, None],
                                    other=0.0).to(tl.float32)
            out = tl.sum(per_slot * routing[:, None], axis=0)
            tl.store(out_ptr + tok.to(tl.int64) * K + cols, out.to(out_ptr.dtype.element_ty), mask=cols_ok)


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
    # vLLM's structure: GEMM 1 writes gate and up ([numel, 2N], ACT_NONE) and
    # moe_act_kernel applies the activation, instead of GEMM 1's epilogue.
    split_activation: bool = False


def make_plan(problem, config: dict, *, self_align_max: int | None = None, pdl: bool | None = None,
              split_activation: bool = False) -> MoEPlan:
    """The launch plan. The keyword knobs are for benchmarks and tests
    (bench/moe_breakdown.py times the plain four-kernel call with
    `self_align_max=0, pdl=False`); a run of the `fused_moe` method always
    uses the defaults, so a journal's timings all come from one plan:
    SELF_ALIGN_MAX_NUMEL, and dependent launches wherever the target supports
    them. `vllm_plan` is the `fused_moe_vllm` method's plan."""
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
        split_activation=bool(split_activation),
    )


def vllm_plan(problem, config: dict) -> MoEPlan:
    """The call as vLLM's `fused_experts` makes it, kernel for kernel: the
    alignment kernel whatever the size, GEMM 1 writing gate and up, the
    activation kernel, GEMM 2 with the routing weights, the top-k sum, all
    plain launches. What a config tuned for vLLM's JSON files is run in."""
    return make_plan(problem, config, self_align_max=0, pdl=False, split_activation=True)


SUM_BLOCK = 1024
# Columns per program of moe_act_kernel (one row of the intermediate per program row).
ACT_BLOCK = 512


def _launch_specs(plan: MoEPlan, b: dict):
    """[(kernel, grid, args, kwargs)] for the Triton launches, in order: the
    alignment (unless the GEMMs align themselves), GEMM 1, the activation
    (split_activation only), GEMM 2, the sum.

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
    # With split_activation GEMM 1 writes gate and up to `gate_up` [numel, 2N]
    # and moe_act_kernel writes the activated intermediate.
    gemm1_out, gemm1_act, gemm1_stride = (
        (b["gate_up"], ACT_NONE, 2 * N) if plan.split_activation else (b["inter"], plan.activation, N))
    specs.append((
        moe_gemm1_kernel,
        plan.grid1,
        (b["x"], b["w1"], b["b1"] if plan.has_bias else b["x"], gemm1_out,
         b["sorted_ids"], b["expert_ids"], b["num_post"], b["topk_ids"],
         N, K, plan.numel, E, plan.max_blocks,
         K, 2 * N * K, K, 2 * N, gemm1_stride),
        dict(TOPK=plan.topk, INTERLEAVED=plan.interleaved, ACTIVATION=gemm1_act,
             HAS_BIAS=plan.has_bias, EVEN_K=K % bk == 0, PRECISION=precision, SELF_ALIGN=plan.self_align,
             USE_PDL=plan.pdl, **tiles, **launch, **({} if plan.self_align else dependent)),
    ))
    if plan.split_activation:
        specs.append((
            moe_act_kernel,
            (plan.numel, triton.cdiv(N, ACT_BLOCK)),
            (b["gate_up"], b["inter"], N),
            dict(INTERLEAVED=plan.interleaved, ACTIVATION=plan.activation, BLOCK=ACT_BLOCK, num_warps=4),
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
        "x": dt, "w1": dt, "b1": dt, "w2": dt, "b2": dt, "inter": dt, "gate_up": dt, "out2": dt, "out": dt,
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
        # GEMM 1's gate and up, for vLLM's structure only (else never allocated).
        self.gate_up = (torch.empty(plan.numel, 2 * plan.N, dtype=plan.dtype, device=dev)
                        if plan.split_activation else None)
        self.out2 = torch.empty(plan.numel, plan.K, dtype=plan.dtype, device=dev)
        self.out = torch.empty(plan.M, plan.K, dtype=plan.dtype, device=dev)
        bufs = dict(self.inputs, sorted_ids=self.sorted_ids, expert_ids=self.expert_ids, num_post=self.num_post,
                    cursor=self.cursor, inter=self.inter, gate_up=self.gate_up, out2=self.out2, out=self.out)
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


# ---------------------------------------------------------------------------
# Host side of the persistent MoE (moe_persistent_kernel).

PERSISTENT_CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "BLOCK_SIZE_N2", "BLOCK_SIZE_K2",
                          "SPLIT_K", "num_warps", "num_stages", "PROGRAMS_PER_SM", "PREFETCH_W2", "GEMV")
# SPLIT_K applies while GEMM 1 has at most this many tiles (decode sizes, where
# tiles are fewer than programs); above it every program has whole tiles to
# take, and the slices' buffer would grow with M: SPLIT_K is then 1.
SPLIT_K_MAX_TILES = 1024
# Up to this many (token, k) slots every program aligns in registers ([n, n]
# comparisons, once per program); above it program 0 aligns into memory and
# the others wait for it.
PERSISTENT_SELF_ALIGN_MAX = 64
# PREFETCH_W2 only where the w2 rows the routing can select fit this many
# bytes: far below any tunelab target's L2 (50 MB on an H100, 40 MB on an
# A100), so prefetched lines are still there when GEMM 2 reads them.
PREFETCH_BUDGET_BYTES = 16 << 20
# Polls before a wait gives up (about a second of spinning; see _wait_at_least).
MAX_SPIN = 1 << 22
# Triton's interpreter has no SMs: the phase launches use this many programs
# unless told otherwise (several items per program, as on a GPU).
INTERPRETER_PROGRAMS = 3


def persistent_default_config(M: int, N: int) -> dict:
    """The persistent config a job runs when it names none of the keys.

    Each choice below was measured on an H100 (bench/moe_methods.py, gpt-oss
    E=128, K=2880, bf16, SiLU; µs cold / under graph timing), as the best of
    a coordinate search (M=1 and 8) or of a one-key sweep (M=64). M <= 2 with
    N <= 720 is from results/bench/NVIDIA_H100_80GB_HBM3/moe_methods-2026-11-23.md
    (the kernel as it is), the rest from moe_methods-2026-11-22.md (before
    the GEMM 2 count and the prefetch changed, see PersistentMoELaunch; those
    rows take 75-1770 µs, where the 1 µs those changes saved matters little):

    - M <= 2, N <= 360: GEMM 1 in four K slices of 64-row tiles (4 x 12 tiles
      alone would leave most SMs idle), GEMM 2's weights prefetched: N=360
      19.9 / 13.7;
    - M <= 2, N <= 720: whole 64-row tiles, eight warps: N=720 28.3 / 24.9
      (the four-launch call: 29.8 / 24.9);
    - M <= 2, larger N: whole 64-row tiles, enough of them: N=2880 80.7 / 78.1;
    - M <= 16: whole 64-row tiles, six stages, GEMM 2 tiles of 128 columns:
      N=360 M=8 75.7 / 73.3;
    - M <= 64: 16-slot blocks, 32-row tiles, four programs per SM: M=64
      N=360 261.5 / 259.6, N=720 470.5 / 468.8, N=2880 1770.3 / 1767.8;
    - above: larger tiles (not measured).
    """
    base = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "BLOCK_SIZE_N2": 64, "BLOCK_SIZE_K2": 64,
            "SPLIT_K": 1, "num_warps": 4, "num_stages": 4, "PROGRAMS_PER_SM": 2, "PREFETCH_W2": 1, "GEMV": 0}
    if M <= 2:
        if N <= 360:
            return dict(base, BLOCK_SIZE_K=64, SPLIT_K=4)
        if N <= 720:
            return dict(base, num_warps=8, PREFETCH_W2=0)
        return dict(base, BLOCK_SIZE_K=64, PREFETCH_W2=0)
    if M <= 16:
        return dict(base, BLOCK_SIZE_N2=128, num_stages=6)
    if M <= 64:
        return dict(base, BLOCK_SIZE_N=32, PROGRAMS_PER_SM=4)
    return {"BLOCK_SIZE_M": 64 if M <= 512 else 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64,
            "BLOCK_SIZE_N2": 128, "BLOCK_SIZE_K2": 64, "SPLIT_K": 1, "num_warps": 8, "num_stages": 3,
            "PROGRAMS_PER_SM": 1, "PREFETCH_W2": 1, "GEMV": 0}


@dataclasses.dataclass(frozen=True)
class PersistentPlan:
    """Everything a persistent launch needs that depends on the shape and config only."""

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
    n_tiles1: int
    n_tiles2: int
    # NUMEL_PAD when every program aligns in registers, else 0 (program 0 aligns into memory).
    self_align: int
    # Elements per 128-byte line when GEMM 2's weights are prefetched into L2, else 0.
    prefetch: int
    # K slices per GEMM 1 tile (config SPLIT_K, or 1 above SPLIT_K_MAX_TILES).
    split_k: int
    ws_words: int
    # The GEMV schedule (config GEMV=1, moe_persistent_gemv_kernel): every slot is
    # a block of its own, GEMM 1 items are (slot, tile), GEMM 2 items (token, tile).
    gemv: bool = False

    def max_items(self) -> int:
        """GEMM 1 and GEMM 2 items at most: no grid needs more programs. (A GEMV
        program takes GEMM 1 items, then GEMM 2 items: the larger count will do.)"""
        if self.gemv:
            return max(self.numel * self.n_tiles1, self.M * self.n_tiles2)
        return self.max_blocks * (self.n_tiles1 * self.split_k + self.n_tiles2)

    def slices_elems(self) -> int:
        """fp32 elements of GEMM 1's K-slice buffer (1 when GEMM 1 is not split)."""
        if self.split_k == 1:
            return 1
        c = self.config
        return self.max_blocks * self.n_tiles1 * self.split_k * c["BLOCK_SIZE_M"] * c["BLOCK_SIZE_N"]


def make_persistent_plan(problem, config: dict, *, self_align_max: int | None = None) -> PersistentPlan:
    """The persistent launch plan for a problem and a config of PERSISTENT_CONFIG_KEYS.

    `self_align_max` (tests) overrides PERSISTENT_SELF_ALIGN_MAX. A config
    without GEMV (one written before that key) is the tiled schedule."""
    config = dict({"GEMV": 0}, **config)
    missing = [k for k in PERSISTENT_CONFIG_KEYS if k not in config]
    if missing:
        raise ValueError(f"fused_moe_persistent config needs {missing} (keys: {list(PERSISTENT_CONFIG_KEYS)})")
    c = {k: int(config[k]) for k in PERSISTENT_CONFIG_KEYS}
    if c["GEMV"] not in (0, 1):
        raise ValueError(f"GEMV must be 0 (tiles and tl.dot) or 1 (matrix-vector items), got {c['GEMV']}")
    gemv = bool(c["GEMV"])
    if gemv:
        for name, least in (("BLOCK_SIZE_N", 2), ("BLOCK_SIZE_N2", 1)):
            v = c[name]
            if v < least or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= {least} with GEMV=1, got {v}")
    else:
        for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "BLOCK_SIZE_N2", "BLOCK_SIZE_K2"):
            v = c[name]
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (tl.dot needs 16), got {v}")
    if c["PROGRAMS_PER_SM"] < 1:
        raise ValueError(f"PROGRAMS_PER_SM must be >= 1, got {c['PROGRAMS_PER_SM']}")
    if c["SPLIT_K"] < 1:
        raise ValueError(f"SPLIT_K must be >= 1, got {c['SPLIT_K']}")
    if c["PREFETCH_W2"] not in (0, 1):
        raise ValueError(f"PREFETCH_W2 must be 0 or 1, got {c['PREFETCH_W2']}")
    bm = c["BLOCK_SIZE_M"]
    numel = problem.M * problem.topk
    max_blocks, max_padded = align_sizes(numel, problem.E, bm)
    limit = PERSISTENT_SELF_ALIGN_MAX if self_align_max is None else self_align_max
    self_align = max(2, _next_pow2(numel)) if numel <= limit else 0
    es = 4 if is_fp32(problem.dtype) else 2
    w2_reachable = min(problem.E, numel) * problem.K * problem.N * es
    prefetch = 128 // es if (c["PREFETCH_W2"] and w2_reachable <= PREFETCH_BUDGET_BYTES and not interpreting()) else 0
    n_tiles1 = triton.cdiv(2 * problem.N, c["BLOCK_SIZE_N"])
    n_tiles2 = triton.cdiv(problem.K, c["BLOCK_SIZE_N2"])
    split_k = c["SPLIT_K"] if max_blocks * n_tiles1 <= SPLIT_K_MAX_TILES else 1
    if gemv:
        # Keys the GEMV schedule does not read are left out of its plan, so
        # nothing downstream (buffers, workspace) depends on them.
        max_blocks, max_padded, self_align, prefetch, split_k = numel, numel, 0, 0, 1
    return PersistentPlan(
        M=problem.M,
        E=problem.E,
        topk=problem.topk,
        K=problem.K,
        N=problem.N,
        dtype=problem.dtype,
        activation=ACT_SWIGLU_OAI if problem.activation == "swiglu_oai" else ACT_SILU,
        interleaved=problem.interleaved,
        has_bias=problem.bias,
        config=c,
        numel=numel,
        max_blocks=max_blocks,
        max_padded=max_padded,
        align_meta=_align_meta(numel, problem.E, max_padded),
        n_tiles1=n_tiles1,
        n_tiles2=n_tiles2,
        self_align=self_align,
        prefetch=prefetch,
        split_k=split_k,
        ws_words=(WS_HEADER if gemv else
                  WS_HEADER + 2 * max_blocks + problem.M * n_tiles2 + (max_blocks * n_tiles1 if split_k > 1 else 0)),
        gemv=gemv,
    )


def two_pow2_parts(n: int) -> tuple[int, int]:
    """(A, B): A the largest power of two below n (n // 2 for a power of two),
    B the power of two covering the rest: 2880 -> (2048, 1024), 360 -> (256, 128)."""
    if n < 2:
        raise ValueError(f"two_pow2_parts needs n >= 2, got {n}")
    a = 1 << (int(n) - 1).bit_length() - 1
    return a, _next_pow2(n - a)


def _acquire_loads() -> bool:
    """Whether the target takes PTX acquire loads (CUDA; not HIP or the interpreter)."""
    if interpreting():
        return False
    import triton.runtime

    return triton.runtime.driver.active.get_current_target().backend == "cuda"


def _persistent_gemv_spec(plan: PersistentPlan, b: dict, phase: int):
    """(kernel, args, kwargs) of one launch of the GEMV schedule."""
    c = plan.config
    k_a, k_b = two_pow2_parts(plan.K)
    n_a, n_b = two_pow2_parts(plan.N)
    args = (b["x"], b["w1"], b["b1"] if plan.has_bias else b["x"], b["w2"], b["b2"] if plan.has_bias else b["x"],
            b["topk_ids"], b["topk_weights"], b["inter"], b["out"], b["ws"])
    kwargs = dict(
        M=plan.M, N=plan.N, K=plan.K, TOPK=plan.topk, TOPK_PAD=_next_pow2(plan.topk), INTERLEAVED=plan.interleaved,
        ACTIVATION=plan.activation, HAS_BIAS=plan.has_bias, ROWS1=c["BLOCK_SIZE_N"] // 2, K_A=k_a, K_B=k_b,
        COLS2=c["BLOCK_SIZE_N2"], N_A=n_a, N_B=n_b, ACQUIRE_LOADS=_acquire_loads(), PHASE=phase, MAX_SPIN=MAX_SPIN,
        num_warps=c["num_warps"], num_stages=1,
    )
    return moe_persistent_gemv_kernel, args, kwargs


def _persistent_spec(plan: PersistentPlan, b: dict, phase: int):
    """(kernel, args, kwargs) of one persistent launch; the grid is the caller's."""
    if plan.gemv:
        return _persistent_gemv_spec(plan, b, phase)
    c = plan.config
    precision = "ieee" if is_fp32(plan.dtype) else "tf32"  # tf32 is ignored for 16-bit inputs
    # Without its own alignment the kernel still takes the buffers: any pointer will do.
    align = (b["sorted_ids"], b["expert_ids"], b["num_post"], b["cursor"])
    args = (b["x"], b["w1"], b["b1"] if plan.has_bias else b["x"], b["w2"], b["b2"] if plan.has_bias else b["x"],
            b["topk_ids"], b["topk_weights"], b["inter"], b["part"], b["slices"], b["out"], *align, b["ws"],
            b.get("trace", b["ws"]))
    kwargs = dict(
        N=plan.N, K=plan.K, numel=plan.numel, num_experts=plan.E, max_blocks=plan.max_blocks,
        max_padded=plan.max_padded, ws_words=plan.ws_words, TOPK=plan.topk, INTERLEAVED=plan.interleaved,
        ACTIVATION=plan.activation, HAS_BIAS=plan.has_bias,
        EVEN_K1=plan.K % c["BLOCK_SIZE_K"] == 0, EVEN_K2=plan.N % c["BLOCK_SIZE_K2"] == 0, PRECISION=precision,
        BLOCK_SIZE_M=c["BLOCK_SIZE_M"], BLOCK_SIZE_N=c["BLOCK_SIZE_N"], BLOCK_SIZE_K=c["BLOCK_SIZE_K"],
        BLOCK_SIZE_N2=c["BLOCK_SIZE_N2"], BLOCK_SIZE_K2=c["BLOCK_SIZE_K2"], SPLIT_K=plan.split_k,
        SELF_ALIGN=plan.self_align, E_PAD=plan.align_meta["E_PAD"], CHUNK=plan.align_meta["CHUNK"],
        BCHUNK=plan.align_meta["BCHUNK"], PHASE=phase, PREFETCH_W2=plan.prefetch if phase < 0 else 0,
        MAX_SPIN=MAX_SPIN, TRACE=int("trace" in b), num_warps=c["num_warps"], num_stages=c["num_stages"],
    )
    return moe_persistent_kernel, args, kwargs


def trace_layout(plan: PersistentPlan, grid: int) -> dict:
    """Where a traced launch (TRACE) stamps its times: (first int64 word, count)
    of the per-program records (TRACE_PER_PROGRAM words), the GEMM 1 item
    records (3 words) and the GEMM 2 item records (4 words), and the words in all."""
    items1 = plan.max_blocks * plan.n_tiles1 * plan.split_k
    items2 = plan.max_blocks * plan.n_tiles2
    first1 = grid * TRACE_PER_PROGRAM
    first2 = first1 + 3 * items1
    return {"programs": (0, grid), "items1": (first1, items1), "items2": (first2, items2),
            "words": first2 + 4 * items2}


def persistent_phases(plan: PersistentPlan):
    """The launches of one call: [-1] (everything, synchronised in-kernel) when
    compiling for a GPU; one per phase under Triton's interpreter."""
    if not interpreting():
        return [-1]
    return ([] if plan.self_align or plan.gemv else [0]) + [1, 2]


def compile_persistent(plan: PersistentPlan):
    """Compile the persistent kernel into Triton's cache without launching it.

    Needs no GPU and no SM count: the grid is a launch argument, not part of
    the binary."""
    dt, i32, f32 = pointer(plan.dtype), pointer(int32()), pointer(torch_dtype("fp32"))
    b = {"x": dt, "w1": dt, "b1": dt, "w2": dt, "b2": dt, "inter": dt, "out": dt, "part": f32, "slices": f32,
         "topk_ids": i32, "sorted_ids": i32, "expert_ids": i32, "num_post": i32, "cursor": i32, "ws": i32,
         "topk_weights": f32}
    for phase in persistent_phases(plan):
        kernel, args, kwargs = _persistent_spec(plan, b, phase)
        prebuild_host_code(kernel.warmup(*args, grid=(1,), **kwargs))


def resident_programs_per_sm(n_regs: int, shared_bytes: int, num_warps: int, props) -> int:
    """How many programs of a kernel one SM holds at once (CUDA's occupancy
    rules, rounded down where they are granular): threads, registers (256 per
    warp granule), shared memory (plus the 1 KB the driver reserves per block),
    and 32 blocks. `props` is torch's device properties."""
    warp = getattr(props, "warp_size", 32)
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (num_warps * warp)
    regs_per_warp = -(-max(int(n_regs), 1) * warp // 256) * 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * num_warps)
    smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    by_smem = smem // (int(shared_bytes) + 1024)
    return max(0, min(by_threads, by_regs, by_smem, 32))


def _libcuda():
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    return None


def pin_resident(function, threads: int, shared_bytes: int):
    """Make the driver keep as many programs of `function` on an SM as its
    resources allow, and return that count (None where libcuda is not at hand).

    Asks for the largest shared-memory carveout (CU_FUNC_ATTRIBUTE_PREFERRED_
    SHARED_MEMORY_CARVEOUT = 100 %), so that the L1/shared split the driver
    picks at launch never holds fewer programs than computed, then asks the
    driver's occupancy calculator (cuOccupancyMaxActiveBlocksPerMultiprocessor),
    the figure cooperative launches are checked against.
    """
    import ctypes

    lib = _libcuda()
    if lib is None:
        return None
    handle = ctypes.c_void_p(int(function))
    lib.cuFuncSetAttribute(handle, ctypes.c_int(9), ctypes.c_int(100))
    blocks = ctypes.c_int(0)
    status = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), handle, ctypes.c_int(threads),
                                                             ctypes.c_size_t(shared_bytes))
    return blocks.value if status == 0 else None


def persistent_grid(plan: PersistentPlan, n_regs: int, shared_bytes: int, device, driver_resident=None) -> int:
    """Programs of a persistent launch: PROGRAMS_PER_SM on every SM, never more
    than the GPU holds at once (a program that waits must never wait for one
    that is not running: the waited-for one could not start until the waiter
    left its SM), nor more than the call has tiles. `driver_resident` is the
    driver's own count (pin_resident) where it could be asked: the smaller
    of it and ours is used."""
    props = torch.cuda.get_device_properties(device)
    resident = resident_programs_per_sm(n_regs, shared_bytes, plan.config["num_warps"], props)
    if driver_resident is not None:
        resident = min(resident, driver_resident)
    if resident < 1:
        raise ValueError(f"moe_persistent_kernel does not fit on an SM ({n_regs} registers a thread, "
                         f"{shared_bytes} bytes of shared memory, {plan.config['num_warps']} warps): "
                         "use smaller tiles, fewer stages or fewer warps")
    per_sm = min(plan.config["PROGRAMS_PER_SM"], resident)
    return max(1, min(props.multi_processor_count * per_sm, plan.max_items()))


class PersistentMoELaunch:
    """A bound persistent call: one launch (GPU) computing into `out`.

    Design (moe_persistent_kernel):

    - Grid: `persistent_grid`, every program resident at once, so in-kernel
      waits cannot deadlock. Programs take work items round robin: first all
      GEMM 1 tiles (block x w1 row tile), then all GEMM 2 tiles (block x output
      column tile). Everything before a program's first wait is work that
      waits for nothing (GEMM 1 tiles, the alignment), so every wait ends.
    - Alignment: up to PERSISTENT_SELF_ALIGN_MAX slots, every program computes
      the (stable) layout in registers, with no wait. Above it, program 0 runs
      moe_align_kernel's code into memory and publishes a flag (release); the
      others wait for it (acquire).
    - GEMM 1 split in K (SPLIT_K > 1, decode sizes): each item is one K
      slice of a tile, written to `slices` (fp32); the program that brings
      the tile's SPLITS count to SPLIT_K sums the slices in slice order
      (deterministic) and runs the epilogue. More, smaller items when a
      decode call has fewer tiles than programs.
    - GEMM 1 -> GEMM 2: no grid-wide barrier. Each GEMM 1 tile counts itself
      into its block's READY word (release); a GEMM 2 tile waits only for its
      own block's n_tiles1 tiles (acquire), so GEMM 2 starts block by block.
      With PREFETCH_W2, GEMM 2's weights are asked of L2 at the start: by the
      programs with no GEMM 1 item where there are such, else by each program
      for its own GEMM 2 tiles.
    - Top-k sum, fused into GEMM 2: each GEMM 2 tile writes its weighted rows
      (fp32) to `part`, then counts each row's token into ARRIVED[token, tile];
      the program that brings a count to topk sums the token's topk rows in
      slot order (deterministic: the same bits whoever arrives last) into `out`.
    - Workspace: `ws` (int32, PersistentPlan.ws_words) is zeroed here once;
      every launch leaves it zero (the last GEMM 2 tile of a block clears the
      block's words, the summing program clears its count, the last program to
      exit clears the alignment flag). A failed wait (MAX_SPIN) sets the
      sticky WS_TIMED_OUT word instead of hanging: see `timed_out()`.

    - Cold L2: each program first asks L2 for one line of the workspace, so
      the counters' first atomics do not each wait for DRAM.

    Under Triton's interpreter the same kernel runs once per phase (see
    moe_persistent_kernel); `grid` overrides the number of programs (tests).

    Measured on an H100 (bench/moe_methods.py, gpt-oss E=128 K=2880 bf16
    SiLU, 2026-11-23, results/bench/NVIDIA_H100_80GB_HBM3/moe_methods-2026-11-23.md; µs cold / graph,
    the best config of each): M=1 N=360 19.9 / 13.7 against fused_moe's
    32.8 / 22.8 (the bound is 7.4; a one-element add measures 4.16-4.93 µs
    cold under the same protocol); M=8 N=360 76.2 / 74.1 against 102.7 /
    98.3; M=64 N=360 269.4 / 267.0 against 421.8 / 417.1; M=1 N=720 28.3 /
    24.6 against 29.8 / 24.9; M=64 N=720 493.3 / 490.6 against 494.5 / 489.7.
    - Where a decode call's time goes (bench/moe_persistent_timeline.py, an
      in-kernel %globaltimer timeline, results/bench/NVIDIA_H100_80GB_HBM3/
      persistent_timeline.md): at M=1 N=360, cold, GEMM 1's w1 stream ends at
      about 8.2 µs after the first program starts (2.2 TB/s), the K-slice
      sums publish the last tile at 10.6, GEMM 2 reads its (prefetched) w2
      from L2 in 2.8 and its epilogue (weighted rows, top-k count and sum)
      takes 1.0: the last program ends at 16.3, and the event pair around the
      launch reads 19.8.
    - Changed that day, from the kernel in persistent_timeline-before.md (the
      same bench on another H100 instance): GEMM 2's block count (which
      clears the counters for the next launch) is taken relaxed just after the
      wait, where it was an acq_rel count before the top-k count; with
      PREFETCH_W2 the programs with no GEMM 1 item prefetch all of w2 (where
      at least a quarter have none), where each program prefetched its own
      tiles before its GEMM 1 item. M=1 N=360 with PREFETCH_W2, cold: GEMM 2's
      work after its wait 4.26 -> 3.80 µs (median), GEMM 1 begins 1.02 ->
      0.70 (median over all programs), the last program ends 16.96 -> 16.26,
      the event pair 20.35 -> 19.79.
    - Tried and not kept (2026-11-23, the timeline's figures): GEMM 2 summing
      the K slices itself instead of a GEMM 1 program per tile (GEMM 1 done
      1.9 µs sooner, but GEMM 2's loop took 10 µs with the slice loads in
      inline PTX and 61 µs as tl.load, which Triton staged through 96 KB of
      shared memory); the programs with no GEMM 1 item also prefetching w1
      (GEMM 1's loop 6.9 -> 9.1 µs cold); narrow whole tiles (BLOCK_SIZE_N
      16, BLOCK_SIZE_K 256: GEMM 1's loop 8.3 µs, as slow hot as cold).
    - N is a constexpr because, as a runtime argument, N=360 is not known to be
      a multiple of 16: GEMM 2 then loaded w2 two bytes at a time, unpipelined
      (M=1 N=360: 27 -> 20 µs cold, 21 -> 14 graph, in an earlier run that day).
    - Tried and not kept: GEMM 2 in one step with its w2 rows loaded into
      registers before the wait (BLOCK_SIZE_K2 >= N), to stream them during
      GEMM 1: 17.7 µs graph at best at M=1 N=360, against 14.1 (its narrow
      tiles, padded to 512, cost more than the overlap saved).
    - Tried and not kept (commit c48ce06, 2026-11-23, H100, M=1 N=360, the
      in-kernel timeline: results/bench/NVIDIA_H100_80GB_HBM3/
      persistent_timeline-preload*.md): GEMM 2 items of one BLOCK_SIZE_K2
      step each (PRELOAD_W2), whose w2 tile is loaded before the wait and
      which wait only for the GEMM 1 tiles writing their step; each step's
      weighted rows summed with the top-k. GEMM 2's work after its wait fell
      from 3.9 to 2.0 µs, but the call got slower: loaded just before the
      wait, the tiles of programs coming from GEMM 1 took 3.6-3.9 µs to
      arrive and the last item ended later (event pair 19.8 -> 22.1 µs at
      best, 128 x 256 tiles); loaded at the program's start, the compiler
      waits for the tile before GEMM 1 begins (median program 0.70 -> 2.86
      µs; 25.2 µs). The 64 KB tiles that would give every program one item
      do not fit in registers beside GEMM 1 at two programs an SM.
    - Tried and not kept (commit 9624612, 2026-11-24, H100, bench/
      moe_methods.py: results/bench/NVIDIA_H100_80GB_HBM3/moe_chunked.md):
      a chunked schedule with no wait for the rest of GEMM 1. Each GEMM 1
      tile's BLOCK_SIZE_N / 2 activated columns went straight through GEMM 2
      in the same program, against the matching w2 columns, over an output
      share; the output was summed with fp32 atomic adds, and the program that
      completed a share converted it. It was correct, but slower at every
      decode shape, best config against best config: E=128 N=360 M=1 20.7 /
      14.4 µs (cold / graph) against 19.6 / 13.4, after a 55-config search;
      M=8 100.2 / 97.0 against 76.5 / 74.5. Learned there: Triton orders no
      global memory between the threads of a program. The program that
      converted a share read the sums and then zeroed them, and the zeros were
      laid out over the threads unlike the loads, so a thread zeroed sums that
      another had not read yet (at M=2 token 1's row read as zeros, even with
      one program). A barrier between the two fixed it.

    The GEMV schedule (config GEMV=1, moe_persistent_gemv_kernel), for one or
    two tokens: no tiles of BLOCK_SIZE_M slots, no tl.dot. A GEMM 1 item is
    one slot's BLOCK_SIZE_N w1 rows over the whole of K, a GEMM 2 item one
    token's BLOCK_SIZE_N2 output columns over all its experts, with the top-k
    summed in registers (no `part` rows, no top-k count). What made it faster
    than the tiled kernel, measured on an H100 at E=128 N=360 M=1 with a
    prototype of each step (2026-11-24, µs cold / graph, best of a sweep;
    the tiled kernel 19.7-20.0 / 13.3-13.7 on the same instances):
    - items as K loops of 256 columns, no tl.dot: 24.8 / 13.3 at best. Triton
      3.6 did not pipeline the loop, and its unrolled form kept 85 registers:
      about one step's loads in flight at a time;
    - each item's whole K (and GEMM 2's whole N) as one tile, so all its
      loads are issued before the first product, and GEMM 2's w2 tile loaded
      before its wait: 17.7 / 11.7;
    - those tiles as two power-of-two parts (2048 + 1024 for K=2880 instead
      of 4096, 256 + 128 for N=360 instead of 512: fewer registers, so more
      programs an SM), and one GEMM 1 count a program: 17.4 / 11.2;
    - the wait polling with acquire loads (no read-modify-write after it),
      and the counters cleared by the last program past the wait instead of
      the last to exit: 16.9 / 10.9, and 17.3 / 10.0 with 16 output columns a
      GEMM 2 item.
    The committed gpt-oss runs (results/gptoss/*/report.md, 2026-11-24) have
    it at 16.45 / 9.79 on an H100 and 15.18 / 9.39 on an H200 (the graph
    figures from the finalists' re-timing), and results/bench/
    NVIDIA_H100_80GB_HBM3/moe_methods.md at 16.8 / 10.1. It loses from N=1440 on, where
    GEMM 2's tile of N columns no longer fits in registers.
    """

    def __init__(self, plan: PersistentPlan, inputs: dict, direct: bool | None = None, grid: int | None = None,
                 trace: bool = False):
        self.plan = plan
        x = inputs["x"]
        dev = x.device
        i32 = torch.int32
        self.inputs = {k: v.contiguous() for k, v in inputs.items()}
        if self.inputs["topk_ids"].dtype != i32:
            self.inputs["topk_ids"] = self.inputs["topk_ids"].to(i32)
        if self.inputs["topk_weights"].dtype != torch.float32:
            self.inputs["topk_weights"] = self.inputs["topk_weights"].float()
        aligned = plan.self_align == 0 and not plan.gemv  # the alignment lives in memory (GEMV has none)
        self.sorted_ids = torch.empty(plan.max_padded if aligned else 1, dtype=i32, device=dev)
        self.expert_ids = torch.empty(plan.max_blocks if aligned else 1, dtype=i32, device=dev)
        self.num_post = torch.empty(1, dtype=i32, device=dev)
        self.cursor = torch.empty(plan.align_meta["E_PAD"] if aligned else 1, dtype=i32, device=dev)
        self.inter = torch.empty(plan.numel, plan.N, dtype=plan.dtype, device=dev)
        # GEMV sums the top-k in registers: no fp32 rows.
        self.part = torch.empty(1 if plan.gemv else plan.numel * plan.K, dtype=torch.float32, device=dev)
        self.slices = torch.empty(plan.slices_elems(), dtype=torch.float32, device=dev)
        self.out = torch.empty(plan.M, plan.K, dtype=plan.dtype, device=dev)
        self.ws = torch.zeros(plan.ws_words, dtype=i32, device=dev)
        bufs = dict(self.inputs, sorted_ids=self.sorted_ids, expert_ids=self.expert_ids, num_post=self.num_post,
                    cursor=self.cursor, inter=self.inter, part=self.part, slices=self.slices, out=self.out, ws=self.ws)
        self.phases = persistent_phases(plan)
        self.trace: Any = None  # int64 timeline of the last launch (trace=True, GPU only; see trace_layout)
        if trace:
            if plan.gemv:
                raise ValueError("the GEMV schedule (GEMV=1) stamps no timeline; trace the tiled one")
            if self.phases != [-1]:
                raise ValueError("a traced persistent launch needs a GPU (it stamps %globaltimer)")
            # Sized for the largest grid any binary of this plan takes (a grid is at most max_items).
            words = trace_layout(plan, grid or plan.max_items())["words"]
            self.trace = torch.zeros(words, dtype=torch.int64, device=dev)
            bufs["trace"] = self.trace
        specs = [_persistent_spec(plan, bufs, phase) for phase in self.phases]
        if direct is None:
            direct = direct_launch_enabled(dev)
        if self.phases == [-1]:
            kernel, args, kwargs = specs[0]
            # Compile (or find in the cache) first: the grid depends on the binary's registers.
            compiled = kernel.warmup(*args, grid=(1,), **kwargs)
            compiled._init_handles()
            self.n_regs: int | None
            self.shared: int | None
            self.n_regs, self.shared = int(compiled.n_regs), int(compiled.metadata.shared)
            threads = plan.config["num_warps"] * getattr(compiled.metadata, "warp_size", 32)
            self.function = compiled.function  # the CUfunction (bench/moe_persistent_timeline.py sets its carveout)
            self.driver_resident = pin_resident(compiled.function, threads, self.shared)
            self.grid = grid or persistent_grid(plan, self.n_regs, self.shared, dev, self.driver_resident)
            self.direct = bool(direct)
            if self.direct:
                self._runners = [compiled_runner(kernel, compiled, (self.grid,), args, kwargs)]
            else:
                self._runners = [functools.partial(kernel[(self.grid,)], *args, **kwargs)]
        else:
            self.n_regs = self.shared = self.driver_resident = None
            self.grid = grid or min(INTERPRETER_PROGRAMS, plan.max_items())
            self.direct = False
            self._runners = [functools.partial(kernel[(self.grid,)], *args, **kwargs) for kernel, args, kwargs in specs]

    def __call__(self):
        for run in self._runners:
            run()
        return self.out

    def timed_out(self) -> bool:
        """Whether a wait of any launch so far gave up (reads the workspace: a host sync)."""
        return bool(int(self.ws[WS_TIMED_OUT].item()))

    def workspace_clear(self) -> bool:
        """Whether the workspace is back to zero, as every launch must leave it (a host sync)."""
        return not bool(self.ws.count_nonzero().item())
