"""The fused MoE's Triton kernels for the four-step call (bf16/fp16/fp32 weights).

The alignment (`moe_align_kernel`, and the self-alignment helpers a GEMM
calls for a few tokens), GEMM 1 with its activation epilogue, vLLM's separate
activation kernel, GEMM 2 with the routing weights and the top-k sum; their
tile helpers are shared with the persistent kernel
(tunelab.kernels.moe_persistent_kernels) and the quantised GEMMs
(tunelab.kernels.quant_moe_kernels). At the end, the alignment's sizes as
the host computes them (`align_sizes`, `_align_meta`), which every plan needs.

tunelab.kernels.fused_moe's docstring says how the call is put together and
what a config's tiles mean; its host side plans and launches these kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

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
    _align(
        topk_ids_ptr,
        sorted_ids_ptr,
        expert_ids_ptr,
        num_post_ptr,
        cursor_ptr,
        numel,
        num_experts,
        max_padded,
        max_blocks,
        BLOCK_SIZE_M,
        E_PAD,
        CHUNK,
        BCHUNK,
    )


@triton.jit
def _align(
    topk_ids_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_ptr,
    cursor_ptr,
    numel,
    num_experts,
    max_padded,
    max_blocks,
    BLOCK_SIZE_M: tl.constexpr,
    E_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    BCHUNK: tl.constexpr,
):
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
def _self_aligned_block(topk_ids_ptr, numel, num_experts, pid_m, BLOCK_SIZE_M: tl.constexpr, NUMEL_PAD: tl.constexpr):
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
    _gemm1_tile(
        x_ptr,
        w1_ptr,
        b1_ptr,
        inter_ptr,
        slots,
        expert,
        pid_n,
        N,
        K,
        numel,
        stride_xm,
        stride_we,
        stride_wn,
        stride_be,
        stride_im,
        TOPK,
        INTERLEAVED,
        ACTIVATION,
        HAS_BIAS,
        EVEN_K,
        PRECISION,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
    )


@triton.jit
def _gemm1_tile(
    x_ptr,
    w1_ptr,
    b1_ptr,
    inter_ptr,
    slots,
    expert,
    pid_n,
    N,
    K,
    numel,
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
):
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

    _gemm1_store(
        acc,
        b1_ptr,
        inter_ptr,
        slots,
        tok_mask,
        expert,
        w_row,
        offs_j,
        pid_n,
        N,
        stride_be,
        stride_im,
        ACTIVATION,
        HAS_BIAS,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
    )


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
def _gemm1_acc(
    x_ptr,
    w1_ptr,
    rows,
    tok_mask,
    expert,
    w_row,
    row_ok,
    k_first,
    k_last,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
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
def _gemm1_store(
    acc,
    b1_ptr,
    inter_ptr,
    slots,
    tok_mask,
    expert,
    w_row,
    offs_j,
    pid_n,
    N,
    stride_be,
    stride_im,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
):
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
    acc = _gemm2_acc(
        inter_ptr,
        w2_ptr,
        b2_ptr,
        slots64,
        tok_mask,
        expert,
        offs_n,
        offs_k,
        K_RED,
        stride_im,
        stride_we,
        stride_wn,
        stride_be,
        HAS_BIAS,
        EVEN_K,
        PRECISION,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        "",
    )
    w = tl.load(weights_ptr + slots64, mask=tok_mask, other=0.0).to(tl.float32)
    acc = acc * w[:, None]

    c_ptrs = out_ptr + slots64[:, None] * stride_om + offs_n_raw[None, :]
    tl.store(c_ptrs, acc.to(out_ptr.dtype.element_ty), mask=tok_mask[:, None] & (offs_n_raw[None, :] < N_OUT))


@triton.jit
def _gemm2_acc(
    inter_ptr,
    w2_ptr,
    b2_ptr,
    slots64,
    tok_mask,
    expert,
    offs_n,
    offs_k,
    K_RED,
    stride_im,
    stride_we,
    stride_wn,
    stride_be,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    A_CACHE: tl.constexpr,
):
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
            a = tl.load(a_ptrs, mask=tok_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0, cache_modifier=A_CACHE)
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
# The alignment's sizes, host side (every plan's buffers and constexprs).


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
