"""The quantised fused MoE's Triton kernels: fp8 activation quantisation, the
quantised GEMM tile (fp8 x fp8, or 16-bit activations x MXFP4 weights), SPLIT_K's
partial sums, and the two GEMM kernels.

tunelab.kernels.quant_moe has the module docstring that says what each format
does, and the host side (plans, launch arguments, launches) that runs these;
MXFP4's dequantisation and its one-token GEMV accumulators are in
tunelab.kernels.quant_moe_mx. Kept apart from the host code so that a kernel
change reads as one and the host side stays short enough to read in one sitting.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tunelab.kernels.moe_kernels import (
    _block_coords,
    _gemm1_rows,
    _gemm1_store,
    _self_aligned_block,
)
from tunelab.kernels.quant_moe_mx import (
    _mx_gemv_acc,
    _mx_gemv_acc_f16,
    _mx_halves,
    _mx_halves_ptx,
    _mx_halves_rows,
    _scales_per_byte_cols,
    _scales_per_byte_rows,
)
from tunelab.quant import ACT_EPS, FP8_MAX, FP8_MAX_RECIP

# tunelab.quant's constants, as the kernels see them (a @triton.jit function sees only constexpr globals).
_FP8_MAX = tl.constexpr(FP8_MAX)
_FP8_MAX_RECIP = tl.constexpr(FP8_MAX_RECIP)
_ACT_EPS = tl.constexpr(ACT_EPS)


# ---------------------------------------------------------------------------
# Activation quantisation (fp8)


@triton.jit
def _round_e4m3(y):
    """y (fp32, |y| <= 448) rounded to the nearest E4M3 value, ties to even, in
    fp32 arithmetic: the quantum at y's binade (2^(e - 3), e >= -6 for the
    subnormals) is added and taken away again at 1.5 * 2^23 quanta, where the
    fp32 add rounds to exactly that quantum. Used under Triton's interpreter,
    whose fp32 -> fp8 conversion drops the carry into the next binade (-127.9
    converts to -64, about 1 % of the values in [-448, 448]); on a GPU the
    hardware conversion rounds the same way by itself."""
    bits = y.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    quantum = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    big = quantum * 12582912.0
    r = (tl.abs(y) + big) - big
    return tl.where(y < 0, -r, r)


@triton.jit
def moe_quant_act_kernel(
    src_ptr,  # [R, C] activations (x, or the activated intermediate)
    q_ptr,  # fp8 [R, C]
    s_ptr,  # fp32 [R] (GROUP == 0) or [R, ceil(C / GROUP)]
    C,
    stride_src,
    GROUP: tl.constexpr,  # 0: one scale per row; else one per 1 x GROUP block (a power of two)
    BLOCK: tl.constexpr,  # columns per step, a multiple of GROUP
    PDL_WAIT: tl.constexpr,  # wait for the previous kernel's writes (a dependent launch)
    PDL_LAUNCH: tl.constexpr,  # let the next kernel be placed (it waits for this one)
    ROUND_F32: tl.constexpr,  # round to E4M3 in fp32 first (_round_e4m3; the interpreter)
):
    """One row per program: scale = max(amax, ACT_EPS) x FP8_MAX_RECIP over
    the row or over each GROUP block, q = clamp(x / scale, -448, 448) in fp8
    (E4M3): tunelab.quant.quantize_act_fp8's formula, with its bits. The
    quotient is IEEE-rounded (div_rn), as torch's is. Triton's `/` on fp32
    is an approximate division, a rounding off now and then, and a quotient
    one rounding off next to an E4M3 rounding boundary lands on the
    neighbouring fp8 value, 6-12 % away. On an H100 (2026-11-25) 11 of a
    million random fp16 values did; in a test's call, one of 480 values of
    x, which moved every output of that token by up to 0.07 against the
    reference."""
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    if PDL_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    src = src_ptr + row * stride_src
    q = q_ptr + row * C
    offs = tl.arange(0, BLOCK)
    if GROUP == 0:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, C, BLOCK):
            x = tl.load(src + start + offs, mask=start + offs < C, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0), _ACT_EPS) * _FP8_MAX_RECIP
        tl.store(s_ptr + row, scale)
        for start in range(0, C, BLOCK):
            mask = start + offs < C
            x = tl.load(src + start + offs, mask=mask, other=0.0).to(tl.float32)
            y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -_FP8_MAX), _FP8_MAX)
            if ROUND_F32:
                y = _round_e4m3(y)
            tl.store(q + start + offs, y.to(q_ptr.dtype.element_ty), mask=mask)
    else:
        NG: tl.constexpr = BLOCK // GROUP
        n_groups = tl.cdiv(C, GROUP)
        s_row = s_ptr + row * n_groups
        for start in range(0, C, BLOCK):
            mask = start + offs < C
            x = tl.load(src + start + offs, mask=mask, other=0.0).to(tl.float32)
            x2 = tl.reshape(x, (NG, GROUP))
            scale = tl.maximum(tl.max(tl.abs(x2), axis=1), _ACT_EPS) * _FP8_MAX_RECIP  # [NG]
            y = tl.minimum(tl.maximum(tl.math.div_rn(x2, scale[:, None]), -_FP8_MAX), _FP8_MAX)
            if ROUND_F32:
                y = _round_e4m3(y)
            tl.store(q + start + offs, tl.reshape(y, (BLOCK,)).to(q_ptr.dtype.element_ty), mask=mask)
            g = start // GROUP + tl.arange(0, NG)
            tl.store(s_row + g, scale, mask=g < n_groups)


# ---------------------------------------------------------------------------
# The quantised GEMM tile (both GEMMs)


@triton.jit
def _q_acc(
    a_ptr,  # activations: fp8 (fp8 formats) or 16-bit (MXFP4); rows `a_rows`
    a_scale_ptr,  # fp32 activation scales (fp8): [rows] or [rows, ceil(K_RED / GROUP_K)]
    w_ptr,  # this expert's weight: fp8 [rows, K_RED] or packed uint8 [rows, K_PAD / 2]
    w_scale_ptr,  # this expert's weight scales: fp32 scalar / [ceil(rows / GROUP_N), ceil(K_RED / GROUP_K)], or E8M0 [rows, K_PAD / 32]
    a_rows,  # int64 [BLOCK_SIZE_M]
    a_mask,  # [BLOCK_SIZE_M]
    w_rows,  # int64 [BLOCK_SIZE_N], in bounds (GEMV: tile-major row numbers, see gemv_tile_major)
    K_RED,
    k_begin,  # the K steps of BLOCK_SIZE_K this program reduces: [k_begin, k_end) (_split_k_steps)
    k_end,
    stride_am,
    stride_asm,  # activation scales' row stride (block: ceil(K_RED / GROUP_K))
    stride_wr,  # weight row stride, in elements (fp8) or bytes (MXFP4)
    stride_wsr,  # weight scales' row stride (block: per block row; MXFP4: per weight row)
    WFMT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    DOT_SCALED: tl.constexpr,
    A_FMT: tl.constexpr,  # "bf16" or "fp16": tl.dot_scaled's name for the activation dtype
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    A_CACHE: tl.constexpr,
    SWAP_AB: tl.constexpr = 0,
    MX_PTX: tl.constexpr = 0,
    GEMV: tl.constexpr = 0,
):
    """fp32 [BLOCK_SIZE_M, BLOCK_SIZE_N]: activation rows `a_rows` times weight
    rows `w_rows` over K steps [k_begin, k_end) of the reduction axis K_RED,
    dequantised (see the module docstring). Tails along K_RED are masked
    (MXFP4 storage is zero-padded). SWAP_AB=1 computes the transpose
    (_q_acc_swapped) and returns it transposed back; GEMV=1 and 2 (MXFP4,
    BLOCK_SIZE_M = 1) the block's one row on CUDA cores (_mx_gemv_acc,
    _mx_gemv_acc_f16)."""
    if GEMV:
        # The block's one slot. With blocks of one, every block the GEMMs run holds
        # a real slot; row 0 stands in for a padding one all the same (never stored).
        row_offset = tl.sum(tl.where(a_mask, a_rows, 0), axis=0) * stride_am
        if GEMV == 2:
            acc_n = _mx_gemv_acc_f16(
                a_ptr, row_offset, w_ptr, w_scale_ptr, w_rows, K_RED, k_begin, k_end, BLOCK_SIZE_N, BLOCK_SIZE_K
            )
        else:
            acc_n = _mx_gemv_acc(
                a_ptr, row_offset, w_ptr, w_scale_ptr, w_rows, K_RED, k_begin, k_end, BLOCK_SIZE_N, BLOCK_SIZE_K
            )
        return acc_n[None, :]
    if SWAP_AB:
        acc_t = _q_acc_swapped(
            a_ptr,
            a_scale_ptr,
            w_ptr,
            w_scale_ptr,
            a_rows,
            a_mask,
            w_rows,
            K_RED,
            k_begin,
            k_end,
            stride_am,
            stride_asm,
            stride_wr,
            stride_wsr,
            WFMT,
            GROUP_N,
            GROUP_K,
            DOT_SCALED,
            A_FMT,
            BLOCK_SIZE_M,
            BLOCK_SIZE_N,
            BLOCK_SIZE_K,
            A_CACHE,
            MX_PTX,
        )
        return tl.trans(acc_t)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    if WFMT == 3:
        HALF: tl.constexpr = BLOCK_SIZE_K // 2
        GROUPS: tl.constexpr = BLOCK_SIZE_K // 32
        k_pad = tl.cdiv(K_RED, 32) * 32
        offs_h = tl.arange(0, HALF)
        offs_g = tl.arange(0, GROUPS)
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        w_base = w_ptr + w_rows[None, :] * stride_wr
        s_base = w_scale_ptr + w_rows[:, None] * stride_wsr
        for k in range(k_begin, k_end):
            byte0 = k * HALF
            packed = tl.load(w_base + (byte0 + offs_h)[:, None], mask=(byte0 + offs_h)[:, None] < k_pad // 2, other=0)
            g0 = k * GROUPS
            scales = tl.load(s_base + (g0 + offs_g)[None, :], mask=(g0 + offs_g)[None, :] < k_pad // 32, other=0)
            if DOT_SCALED:
                kk = k * BLOCK_SIZE_K + offs_k
                a = tl.load(
                    a_ptr + a_rows[:, None] * stride_am + kk[None, :],
                    mask=a_mask[:, None] & (kk[None, :] < K_RED),
                    other=0.0,
                    cache_modifier=A_CACHE,
                )
                acc = tl.dot_scaled(a, None, A_FMT, packed, scales, "e2m1", acc)
            else:
                k_even = k * BLOCK_SIZE_K + 2 * offs_h
                a_row = a_ptr + a_rows[:, None] * stride_am
                a_lo = tl.load(
                    a_row + k_even[None, :],
                    mask=a_mask[:, None] & (k_even[None, :] < K_RED),
                    other=0.0,
                    cache_modifier=A_CACHE,
                )
                a_hi = tl.load(
                    a_row + (k_even + 1)[None, :],
                    mask=a_mask[:, None] & (k_even[None, :] + 1 < K_RED),
                    other=0.0,
                    cache_modifier=A_CACHE,
                )
                if MX_PTX:
                    # Each byte's scale beside it: the tile's layout, not one the dot would need (measured:
                    # loading the bytes as [groups, 16, BLOCK_SIZE_N] to broadcast the scales in registers
                    # instead was 1.4x slower on an H200).
                    lo, hi = _mx_halves_ptx(packed, _scales_per_byte_cols(scales, BLOCK_SIZE_K, BLOCK_SIZE_N))
                else:
                    lo, hi = _mx_halves(packed, scales, a_lo.dtype, BLOCK_SIZE_K, BLOCK_SIZE_N)
                acc = tl.dot(a_lo, lo, acc)
                acc = tl.dot(a_hi, hi, acc)
    else:
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] + k_begin * BLOCK_SIZE_K
        b_ptrs = w_ptr + w_rows[None, :] * stride_wr + offs_k[:, None] + k_begin * BLOCK_SIZE_K
        if WFMT == 2:
            a_s_ptrs = a_scale_ptr + a_rows * stride_asm
            b_s_ptrs = w_scale_ptr + (w_rows // GROUP_N) * stride_wsr
        for k in range(k_begin, k_end):
            k_rem = K_RED - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=a_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0, cache_modifier=A_CACHE)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rem, other=0.0)
            if WFMT == 2:
                # One K step lies within one GROUP_K group (BLOCK_SIZE_K divides GROUP_K).
                group = (k * BLOCK_SIZE_K) // GROUP_K
                a_s = tl.load(a_s_ptrs + group, mask=a_mask, other=0.0)
                b_s = tl.load(b_s_ptrs + group)
                acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_SIZE_K
            b_ptrs += BLOCK_SIZE_K
        if WFMT == 1:
            # vLLM's order (accumulator * a_scale * b_scale): the same bits as its kernel.
            a_s = tl.load(a_scale_ptr + a_rows, mask=a_mask, other=0.0)
            acc = acc * a_s[:, None] * tl.load(w_scale_ptr)
    return acc


@triton.jit
def _q_acc_swapped(
    a_ptr,
    a_scale_ptr,
    w_ptr,
    w_scale_ptr,
    a_rows,
    a_mask,
    w_rows,
    K_RED,
    k_begin,
    k_end,
    stride_am,
    stride_asm,
    stride_wr,
    stride_wsr,
    WFMT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    DOT_SCALED: tl.constexpr,
    A_FMT: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    A_CACHE: tl.constexpr,
    MX_PTX: tl.constexpr = 0,
):
    """_q_acc's product transposed, fp32 [BLOCK_SIZE_N, BLOCK_SIZE_M]: weight
    rows times activation columns, the weights as the left operand.

    Why: with a few tokens per expert, the left operand's rows are the MMA's
    long side. Hopper's warp-group MMA takes 64 of them and can read that
    operand from registers, so weights dequantised in registers feed it
    without a round trip through shared memory, and the tokens (16 of a tile,
    most of them padding at decode sizes) are its short side. Same values,
    same fp32 accumulation; only the order of the products in a dot differs."""
    acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    if WFMT == 3:
        HALF: tl.constexpr = BLOCK_SIZE_K // 2
        GROUPS: tl.constexpr = BLOCK_SIZE_K // 32
        k_pad = tl.cdiv(K_RED, 32) * 32
        offs_h = tl.arange(0, HALF)
        offs_g = tl.arange(0, GROUPS)
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        w_base = w_ptr + w_rows[:, None] * stride_wr
        s_base = w_scale_ptr + w_rows[:, None] * stride_wsr
        a_col = a_ptr + a_rows[None, :] * stride_am
        for k in range(k_begin, k_end):
            byte0 = k * HALF
            packed = tl.load(w_base + (byte0 + offs_h)[None, :], mask=(byte0 + offs_h)[None, :] < k_pad // 2, other=0)
            g0 = k * GROUPS
            scales = tl.load(s_base + (g0 + offs_g)[None, :], mask=(g0 + offs_g)[None, :] < k_pad // 32, other=0)
            if DOT_SCALED:
                kk = k * BLOCK_SIZE_K + offs_k
                a_t = tl.load(
                    a_col + kk[:, None], mask=a_mask[None, :] & (kk[:, None] < K_RED), other=0.0, cache_modifier=A_CACHE
                )
                acc = tl.dot_scaled(packed, scales, "e2m1", a_t, None, A_FMT, acc)
            else:
                k_even = k * BLOCK_SIZE_K + 2 * offs_h
                a_lo = tl.load(
                    a_col + k_even[:, None],
                    mask=a_mask[None, :] & (k_even[:, None] < K_RED),
                    other=0.0,
                    cache_modifier=A_CACHE,
                )
                a_hi = tl.load(
                    a_col + (k_even + 1)[:, None],
                    mask=a_mask[None, :] & (k_even[:, None] + 1 < K_RED),
                    other=0.0,
                    cache_modifier=A_CACHE,
                )
                if MX_PTX:
                    lo, hi = _mx_halves_ptx(packed, _scales_per_byte_rows(scales, BLOCK_SIZE_K, BLOCK_SIZE_N))
                else:
                    lo, hi = _mx_halves_rows(packed, scales, a_lo.dtype, BLOCK_SIZE_K, BLOCK_SIZE_N)
                acc = tl.dot(lo, a_lo, acc)
                acc = tl.dot(hi, a_hi, acc)
    else:
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        a_ptrs = a_ptr + a_rows[None, :] * stride_am + offs_k[:, None] + k_begin * BLOCK_SIZE_K
        w_ptrs = w_ptr + w_rows[:, None] * stride_wr + offs_k[None, :] + k_begin * BLOCK_SIZE_K
        if WFMT == 2:
            a_s_ptrs = a_scale_ptr + a_rows * stride_asm
            w_s_ptrs = w_scale_ptr + (w_rows // GROUP_N) * stride_wsr
        for k in range(k_begin, k_end):
            k_rem = K_RED - k * BLOCK_SIZE_K
            a_t = tl.load(a_ptrs, mask=a_mask[None, :] & (offs_k[:, None] < k_rem), other=0.0, cache_modifier=A_CACHE)
            w = tl.load(w_ptrs, mask=offs_k[None, :] < k_rem, other=0.0)
            if WFMT == 2:
                group = (k * BLOCK_SIZE_K) // GROUP_K
                a_s = tl.load(a_s_ptrs + group, mask=a_mask, other=0.0)
                w_s = tl.load(w_s_ptrs + group)
                acc += tl.dot(w, a_t) * w_s[:, None] * a_s[None, :]
            else:
                acc = tl.dot(w, a_t, acc)
            a_ptrs += BLOCK_SIZE_K
            w_ptrs += BLOCK_SIZE_K
        if WFMT == 1:
            a_s = tl.load(a_scale_ptr + a_rows, mask=a_mask, other=0.0)
            acc = acc * a_s[None, :] * tl.load(w_scale_ptr)
    return acc


# ---------------------------------------------------------------------------
# K split over programs (SPLIT_K > 1): decode sizes


@triton.jit
def _split_k_steps(K_RED, BLOCK_SIZE_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """[k_begin, k_end): the K steps this program reduces. The grid's second
    axis is the split; each split takes ceil(steps / SPLIT_K) consecutive
    steps (the last ones may take fewer, or none)."""
    n_k = tl.cdiv(K_RED, BLOCK_SIZE_K)
    per_split = tl.cdiv(n_k, SPLIT_K)
    k_begin = tl.minimum(tl.program_id(1) * per_split, n_k)
    return k_begin, tl.minimum(k_begin + per_split, n_k)


@triton.jit
def _split_k_total(acc, part_ptr, count_ptr, rows, row_ok, cols, col_ok, stride_ps, stride_pr, SPLIT_K: tl.constexpr):
    """(total, last): the sum of the tile's SPLIT_K partial products, in split
    order, and whether this program is the tile's last to finish (only the
    last one has the total and runs the epilogue).

    Each split stores its fp32 partial in part_ptr[split, row, col] (rows and
    columns the tile owns only), then counts itself in count_ptr[tile] with
    one acquire-release atomic. Triton (3.6 to 3.9, read in their generated
    PTX) makes a scalar atomic from one thread and broadcasts its result
    through shared memory behind a barrier, so: every thread's store, the
    barrier below, one thread's gpu-scope release (the pattern of a grid-wide
    barrier), and on the last split one acquire before any thread loads. The program that counts SPLIT_K - 1 acquires
    everyone's partials, reads them past L1 (.cg) and resets the counter to
    zero for the next call: no memset launch, and the sum's order does not
    depend on which split finished last, so the output is deterministic."""
    # 64-bit offsets: SPLIT_K x M * topk x columns can pass 2^31 elements.
    stride_ps = stride_ps.to(tl.int64)
    ptrs = part_ptr + rows[:, None] * stride_pr + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(ptrs + tl.program_id(1).to(tl.int64) * stride_ps, acc, mask=mask)
    tl.debug_barrier()
    tile = tl.program_id(0)
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLIT_K - 1
    total = tl.zeros_like(acc)
    if last:
        for split in tl.static_range(SPLIT_K):
            total += tl.load(ptrs + split * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(count_ptr + tile, 0)
    return total, last


@triton.jit
def moe_gemm1_q_kernel(
    a_ptr,  # [M, K]: x (MXFP4) or its fp8 quantisation
    a_scale_ptr,  # fp32 activation scales (fp8 formats; else any pointer)
    w1_ptr,  # [E, 2N, K] fp8, or packed [E, 2N, K_PAD / 2] uint8 (GEMV: tile-major, gemv_tile_major)
    w1_scale_ptr,  # fp32 [E] / [E, ceil(2N / GROUP_N), ceil(K / GROUP_K)], or E8M0 [E, 2N, K_PAD / 32] (GEMV: as w1)
    b1_ptr,  # [E, 2N] (unused unless HAS_BIAS)
    inter_ptr,  # [M * topk, N], or [M * topk, 2N] with ACT_NONE
    part_ptr,  # fp32 [SPLIT_K, M * topk, 2N]: the splits' partial products (SPLIT_K > 1)
    count_ptr,  # int32 [grid axis 0], zero between calls: splits finished per tile (SPLIT_K > 1)
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_ptr,
    topk_ids_ptr,  # read only when SELF_ALIGN
    N,
    K,
    numel,
    num_experts,
    num_pid_m,
    stride_am,
    stride_asm,
    stride_we,
    stride_wr,
    stride_wse,
    stride_wsr,
    stride_be,
    stride_im,
    stride_ps,  # part_ptr's split stride (its row stride is 2N)
    TOPK: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WFMT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    DOT_SCALED: tl.constexpr,
    A_FMT: tl.constexpr,
    SWAP_AB: tl.constexpr,  # 1: the weights as the MMA's left operand (_q_acc_swapped)
    MX_PTX: tl.constexpr,  # 1: MXFP4 dequantised by inline PTX (_mx_halves_ptx)
    GEMV: tl.constexpr,  # 1, 2: MXFP4, one token a block, on CUDA cores (_mx_gemv_acc, _mx_gemv_acc_f16)
    SPLIT_K: tl.constexpr,  # K split over the grid's second axis (_split_k_total)
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    SELF_ALIGN: tl.constexpr,  # 0, or NUMEL_PAD: derive the block from topk_ids (no alignment kernel)
    PDL_WAIT: tl.constexpr,  # a dependent launch: wait for the previous kernel's writes before reading them
    PDL_LAUNCH: tl.constexpr,  # let the next kernel be placed once past the wait
):
    num_pid_n = tl.cdiv(2 * N, BLOCK_SIZE_N)
    pid_m, pid_n = _block_coords(num_pid_m, num_pid_n, GROUP_SIZE_M)
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    if PDL_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
    if SELF_ALIGN:
        slots, expert = _self_aligned_block(topk_ids_ptr, numel, num_experts, pid_m, BLOCK_SIZE_M, SELF_ALIGN)
        if expert < 0:
            return
        expert = expert.to(tl.int64)
    else:
        num_post = tl.load(num_post_ptr)
        if pid_m * BLOCK_SIZE_M >= num_post:
            return
        slots = tl.load(sorted_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    tok_mask = slots < numel
    rows = (slots // TOPK).to(tl.int64)
    offs_j, w_row, row_ok = _gemm1_rows(pid_n, N, INTERLEAVED, ACTIVATION, BLOCK_SIZE_N)
    k_begin, k_end = _split_k_steps(K, BLOCK_SIZE_K, SPLIT_K)
    # GEMV reads tile-major weights (gemv_tile_major), whose tile pid_n holds w_row's rows in order.
    acc_rows = (pid_n * BLOCK_SIZE_N + offs_j) if GEMV else w_row
    acc = _q_acc(
        a_ptr,
        a_scale_ptr,
        w1_ptr + expert * stride_we,
        w1_scale_ptr + expert * stride_wse,
        rows,
        tok_mask,
        acc_rows.to(tl.int64),
        K,
        k_begin,
        k_end,
        stride_am,
        stride_asm,
        stride_wr,
        stride_wsr,
        WFMT,
        GROUP_N,
        GROUP_K,
        DOT_SCALED,
        A_FMT,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        "",
        SWAP_AB,
        MX_PTX,
        GEMV,
    )
    if SPLIT_K > 1:
        acc, last = _split_k_total(
            acc, part_ptr, count_ptr, slots.to(tl.int64), tok_mask, w_row, row_ok, stride_ps, 2 * N, SPLIT_K
        )
        if not last:
            return
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
def moe_gemm2_q_kernel(
    a_ptr,  # [M * topk, N]: the intermediate (MXFP4) or its fp8 quantisation
    a_scale_ptr,
    w2_ptr,  # [E, K, N] fp8, or packed [E, K, N_PAD / 2] uint8 (GEMV: tile-major, gemv_tile_major)
    w2_scale_ptr,
    b2_ptr,  # [E, K] (unused unless HAS_BIAS)
    out_ptr,  # [M * topk, K]
    part_ptr,  # fp32 [SPLIT_K, M * topk, K]: the splits' partial products (SPLIT_K > 1)
    count_ptr,  # int32 [grid axis 0], zero between calls (SPLIT_K > 1)
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
    stride_am,
    stride_asm,
    stride_we,
    stride_wr,
    stride_wse,
    stride_wsr,
    stride_be,
    stride_om,
    stride_ps,  # part_ptr's split stride (its row stride is N_OUT)
    HAS_BIAS: tl.constexpr,
    WFMT: tl.constexpr,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    DOT_SCALED: tl.constexpr,
    A_FMT: tl.constexpr,
    SWAP_AB: tl.constexpr,  # 1: the weights as the MMA's left operand (_q_acc_swapped)
    MX_PTX: tl.constexpr,  # 1: MXFP4 dequantised by inline PTX (_mx_halves_ptx)
    GEMV: tl.constexpr,  # 1, 2: MXFP4, one token a block, on CUDA cores (_mx_gemv_acc, _mx_gemv_acc_f16)
    SPLIT_K: tl.constexpr,  # K split over the grid's second axis (_split_k_total)
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    SELF_ALIGN: tl.constexpr,
    PDL_WAIT: tl.constexpr,
    PDL_LAUNCH: tl.constexpr,
):
    num_pid_n = tl.cdiv(N_OUT, BLOCK_SIZE_N)
    pid_m, pid_n = _block_coords(num_pid_m, num_pid_n, GROUP_SIZE_M)
    # The block's slots and expert come from the alignment, complete before the
    # previous kernel let this one be placed (every kernel of the call waits
    # for its predecessor before letting its successor start), or from topk_ids.
    if SELF_ALIGN:
        slots, expert = _self_aligned_block(topk_ids_ptr, numel, num_experts, pid_m, BLOCK_SIZE_M, SELF_ALIGN)
        if expert < 0:
            return
        expert = expert.to(tl.int64)
    else:
        num_post = tl.load(num_post_ptr, cache_modifier=".cg")
        if pid_m * BLOCK_SIZE_M >= num_post:
            return
        slots = tl.load(sorted_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M), cache_modifier=".cg")
        expert = tl.load(expert_ids_ptr + pid_m, cache_modifier=".cg").to(tl.int64)
    tok_mask = slots < numel
    slots64 = slots.to(tl.int64)
    offs_n_raw = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_n = (offs_n_raw % N_OUT).to(tl.int64)
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    if PDL_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
    k_begin, k_end = _split_k_steps(K_RED, BLOCK_SIZE_K, SPLIT_K)
    acc = _q_acc(
        a_ptr,
        a_scale_ptr,
        w2_ptr + expert * stride_we,
        w2_scale_ptr + expert * stride_wse,
        slots64,
        tok_mask,
        offs_n_raw.to(tl.int64) if GEMV else offs_n,
        K_RED,
        k_begin,
        k_end,
        stride_am,
        stride_asm,
        stride_wr,
        stride_wsr,
        WFMT,
        GROUP_N,
        GROUP_K,
        DOT_SCALED,
        A_FMT,
        BLOCK_SIZE_M,
        BLOCK_SIZE_N,
        BLOCK_SIZE_K,
        "",
        SWAP_AB,
        MX_PTX,
        GEMV,
    )
    if SPLIT_K > 1:
        acc, last = _split_k_total(
            acc, part_ptr, count_ptr, slots64, tok_mask, offs_n, offs_n_raw < N_OUT, stride_ps, N_OUT, SPLIT_K
        )
        if not last:
            return
    if HAS_BIAS:
        acc += tl.load(b2_ptr + expert * stride_be + offs_n).to(tl.float32)[None, :]
    w = tl.load(weights_ptr + slots64, mask=tok_mask, other=0.0).to(tl.float32)
    acc = acc * w[:, None]
    c_ptrs = out_ptr + slots64[:, None] * stride_om + offs_n_raw[None, :]
    tl.store(c_ptrs, acc.to(out_ptr.dtype.element_ty), mask=tok_mask[:, None] & (offs_n_raw[None, :] < N_OUT))


# ---------------------------------------------------------------------------
# Host side
