"""Triton fused MoE with quantised expert weights: fp8 w8a8 and MXFP4.

The call structures and tile semantics are those of tunelab.kernels.fused_moe
(read its module docstring first): the same alignment (or self-alignment for
a few tokens), GEMM 1 over w1's 2N rows with the activation fused into its
epilogue (or, in vLLM's structure, written as gate and up for a separate
activation kernel), GEMM 2 with the routing weights, the top-k sum. A config
(BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages) means the same tiles
as for bf16 weights, so a tuned fp8 config is one vLLM's fused-MoE kernel can
use. What changes is what the GEMMs read and how they dequantise
(docs/quantisation.md has the formats; tunelab.quant the torch side):

- fp8 w8a8 (WFMT_FP8_TENSOR, WFMT_FP8_BLOCK): the activations are quantised
  to fp8 by `moe_quant_act_kernel` before each GEMM (x before GEMM 1, the
  activated intermediate before GEMM 2), one fp32 scale per token row
  (per-tensor weights) or per 1 x block_k block of a row (block weights), as
  vLLM does. The GEMMs multiply fp8 by fp8 into fp32:
  - per-tensor weights (one fp32 scale per expert and weight): the
    accumulator is scaled once at the end, by the row's activation scale
    times the expert's weight scale;
  - block weights (one fp32 scale per [block_n, block_k] tile): each K step
    lies within one block_k group (BLOCK_SIZE_K must divide block_k), and
    its partial product is scaled by the rows' group scales times the
    columns' tile scales before it is added.
  Calls: [alignment] -> quantise x -> GEMM 1 -> [activation] -> quantise
  the intermediate -> GEMM 2 -> sum.
- MXFP4 weights with 16-bit activations (WFMT_MXFP4, gpt-oss's format): w1
  and w2 hold E2M1 values two per byte (low nibble first) along the
  reduction axis, padded to a multiple of 32, with one E8M0 scale byte per
  32. Each K step loads BLOCK_SIZE_K / 2 bytes and BLOCK_SIZE_K / 32 scales
  per weight row, and either
  - DOT_SCALED=0 (tunelab's own dequantisation): splits the bytes into their
    low and high nibbles, turns each code into fp32 bits (the value times
    2^-126, no table and no select: `_e2m1_bits`), multiplies by 2^126 times
    its group's 2^(e - 127) in one go, converts to the activation dtype, and
    makes two dots of BLOCK_SIZE_K / 2: the activation's even columns with
    the low nibbles, its odd columns with the high ones, so no register
    shuffle interleaves the nibbles; or
  - DOT_SCALED=1: hands the packed bytes and scales to `tl.dot_scaled`,
    Triton's own upcast (on Hopper it converts to bf16 and runs an ordinary
    dot).
  or
  - GEMV=1 (decode sizes, BLOCK_SIZE_M = 1): one token a program on CUDA
    cores, no MMA (`_mx_gemv_acc`); GEMV=2 the same in packed f16
    arithmetic (`_mx_gemv_acc_f16`; inline PTX, allowed from compute
    capability 9.0; GEMV=1's code under the interpreter).
  Calls: as for bf16 (no quantisation kernels).

Every dequantised value is exact in the activation dtype; the accumulation
is fp32 throughout, except GEMV=2's, which takes the activations in f16
and sums eight products at a time in each f16 lane before widening.
"""

from __future__ import annotations

import dataclasses
import functools

import triton
import triton.language as tl

from tunelab.dtypes import fp8_e4m3, int32, pointer, torch_dtype, uint8
from tunelab.kernels.fused_moe import (
    ACT_BLOCK,
    ACT_NONE,
    ACT_SILU,
    ACT_SWIGLU_OAI,
    SELF_ALIGN_MAX_NUMEL,
    SUM_BLOCK,
    _align_meta,
    _block_coords,
    _gemm1_rows,
    _gemm1_store,
    _next_pow2,
    _self_aligned_block,
    align_sizes,
    moe_act_kernel,
    moe_align_kernel,
    moe_sum_kernel,
    pdl_supported,
)
from tunelab.kernels.launch import direct_launch_enabled, direct_runner, interpreting
from tunelab.lazy import torch
from tunelab.quant import ACT_EPS, FP8_MAX, FP8_MAX_RECIP, MX_GROUP, cdiv, mx_padded
from tunelab.target import prebuild_host_code

WFMT_FP8_TENSOR = 1
WFMT_FP8_BLOCK = 2
WFMT_MXFP4 = 3

# SPLIT_K's ceilings: each split writes an fp32 partial of the GEMM's whole output.
MAX_SPLIT_K = 16
MAX_SPLIT_K_BYTES = 1 << 30
QUANT_CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
# Columns of one row a quantisation program covers per step (a multiple of the group).
QUANT_BLOCK = 1024
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
# MXFP4 dequantisation


@triton.jit
def _e2m1_bits(code):
    """fp32 values of E2M1 codes (uint32, 0..15; sign bit 3, exponent bits 1-2,
    mantissa bit 0), times 2^-126, from their bits alone: the three magnitude
    bits go to fp32 bits 22-24 and the sign to bit 31. Exponent e > 0 then
    reads 2^(e - 127) x (1 + m / 2) = value x 2^-126, and e = 0 with m = 1 is
    fp32's subnormal 2^-127 = 0.5 x 2^-126 (exact; `mul.f32` without .ftz,
    what Triton emits, keeps subnormals). No compare, no select."""
    return (((code & 7) << 22) | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _scales_per_byte_cols(scales, BLOCK_SIZE_K: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """uint32 [BLOCK_SIZE_K / 2, BLOCK_SIZE_N]: each packed byte's E8M0 scale,
    for a tile with the reduction axis first; scales [BLOCK_SIZE_N, BLOCK_SIZE_K / 32]
    (byte i's group is i // 16)."""
    GROUPS: tl.constexpr = BLOCK_SIZE_K // 32
    e = tl.trans(scales.to(tl.uint32))  # [GROUPS, BLOCK_SIZE_N]
    return tl.reshape(tl.broadcast_to(e[:, None, :], (GROUPS, 16, BLOCK_SIZE_N)), (BLOCK_SIZE_K // 2, BLOCK_SIZE_N))


@triton.jit
def _scales_per_byte_rows(scales, BLOCK_SIZE_K: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """_scales_per_byte_cols for the swapped tile: [BLOCK_SIZE_N, BLOCK_SIZE_K / 2]."""
    GROUPS: tl.constexpr = BLOCK_SIZE_K // 32
    e = scales.to(tl.uint32)  # [BLOCK_SIZE_N, GROUPS]
    return tl.reshape(tl.broadcast_to(e[:, :, None], (BLOCK_SIZE_N, GROUPS, 16)), (BLOCK_SIZE_N, BLOCK_SIZE_K // 2))


@triton.jit
def _mx_values(packed, e, e_max, OUT_DTYPE: tl.constexpr):
    """(low, high): the dequantised values in OUT_DTYPE of packed bytes (byte
    i holds reduction indices 2i and 2i + 1) whose E8M0 scales are `e`
    (uint32, the same shape; `e_max` their largest).

    A value is its bits (x 2^-126, _e2m1_bits) times 2^126 x 2^(e - 127) =
    2^(e - 1): one multiply, exact. 2^(e - 1) is an fp32 for e <= 128 (a
    group whose largest weight is below 16); a tile with a larger scale takes
    two multiplies (2^126, then 2^(e - 127))."""
    p = packed.to(tl.uint32)
    u_lo = _e2m1_bits(p & 15)
    u_hi = _e2m1_bits(p >> 4)
    if e_max <= 128:
        factor = ((e + 126) << 23).to(tl.float32, bitcast=True)  # 2^(e - 1)
        lo = (u_lo * factor).to(OUT_DTYPE)
        hi = (u_hi * factor).to(OUT_DTYPE)
    else:
        factor = (e << 23).to(tl.float32, bitcast=True)  # 2^(e - 127); e = 0 reads as 0
        lo = (u_lo * 8.507059173023462e37 * factor).to(OUT_DTYPE)  # 2^126
        hi = (u_hi * 8.507059173023462e37 * factor).to(OUT_DTYPE)
    return lo, hi


@triton.jit
def _mx_halves(packed, scales, OUT_DTYPE: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """(low, high) of packed bytes [BLOCK_SIZE_K / 2, BLOCK_SIZE_N], each
    [BLOCK_SIZE_K / 2, BLOCK_SIZE_N] in OUT_DTYPE, with scales
    [BLOCK_SIZE_N, BLOCK_SIZE_K / 32] (_mx_values)."""
    return _mx_values(packed, _scales_per_byte_cols(scales, BLOCK_SIZE_K, BLOCK_SIZE_N),
                      tl.max(tl.max(scales, axis=1), axis=0), OUT_DTYPE)


@triton.jit
def _mx_halves_rows(packed, scales, OUT_DTYPE: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                    BLOCK_SIZE_N: tl.constexpr):
    """_mx_halves for the swapped tile: packed bytes [BLOCK_SIZE_N, BLOCK_SIZE_K / 2]
    (one weight row per row, as the weights lie in memory); the same values."""
    return _mx_values(packed, _scales_per_byte_rows(scales, BLOCK_SIZE_K, BLOCK_SIZE_N),
                      tl.max(tl.max(scales, axis=1), axis=0), OUT_DTYPE)


# Inline PTX for MX_PTX=1: four packed bytes in (one register), the bf16
# values of their low nibbles ($0, $1) and of their high nibbles ($2, $3)
# out, two values a register; element j of the pack is byte j. Each byte is
# first spread into a 16-bit half of its own (prmt), so one shift-and-mask
# works on two values: a code's magnitude bits go to bf16 bits 6-8 and its
# sign to bit 15, which reads as the value times 2^-126 (e = 0, m = 1 is
# bf16's subnormal 2^-127: exact, as mul.bf16x2 keeps subnormals). One
# mul.bf16x2 by the element's factor ($5, $6: 2^(e - 1), bf16) makes it the
# weight. `_PTX_TWO` is the same with a second factor ($7, $8) for groups
# whose 2^(e - 1) is not a bf16 (e > 128): 2^(min(e, 128) - 1), then
# 2^(e - 128). (E8M0's 255 is NaN; like tunelab's fp32 path, this one reads
# it as a huge power of two instead. No real weight file holds it.)
_PTX_SPREAD = """
    .reg .b32 t<2>, m, g;
    prmt.b32 t0, $4, 0, 0x4140;
    prmt.b32 t1, $4, 0, 0x4342;
"""
_PTX_NIBBLE = """
    shl.b32 m, {t}, {mag}; and.b32 m, m, 0x01C001C0;
    shl.b32 g, {t}, {sign}; and.b32 g, g, 0x80008000;
    or.b32 {out}, m, g;
"""


def _ptx(two: bool) -> str:
    body = [_PTX_SPREAD]
    for out, t, mag, sign, f in (("$0", "t0", 6, 12, 5), ("$1", "t1", 6, 12, 6),
                                 ("$2", "t0", 2, 8, 5), ("$3", "t1", 2, 8, 6)):
        body.append(_PTX_NIBBLE.format(t=t, mag=mag, sign=sign, out=out))
        body.append(f"    mul.rn.bf16x2 {out}, {out}, ${f};\n")
        if two:
            body.append(f"    mul.rn.bf16x2 {out}, {out}, ${f + 2};\n")
    return "{\n" + "".join(body) + "}"


_PTX_ONE = tl.constexpr(_ptx(False))
_PTX_TWO = tl.constexpr(_ptx(True))


@triton.jit
def _mx_halves_ptx(packed, e):
    """(low, high) bf16 values of packed bytes (uint8) whose E8M0 scales are `e`
    (uint32, the same shape: each byte's group's scale): MX_PTX=1's
    dequantisation, the same values as _mx_halves' (both exact), two per
    instruction. (Measured on an H200: scales widened before the broadcast
    run faster than uint8 ones widened after it.)"""
    if tl.max(e) <= 128:
        f = ((e + 126) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)  # 2^(e - 1)
        lo, hi = tl.inline_asm_elementwise(_PTX_ONE, "=r,=r,=r,=r,r,r,r", [packed, f],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        f_a = ((tl.minimum(e, 128) + 126) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        f_b = ((tl.maximum(e, 128) - 1) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)  # 2^(e - 128)
        lo, hi = tl.inline_asm_elementwise(_PTX_TWO, "=r,=r,=r,=r,r,r,r,r,r", [packed, f_a, f_b],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    return lo, hi


# ---------------------------------------------------------------------------
# One token a program (GEMV=1): MXFP4 at decode sizes

# A product's scale: the activations are multiplied by 2^64 as they are
# loaded, so that a weight's bits read as its code's value x 2^-126
# (_e2m1_bits) give products of about value x activation x 2^-62, normal
# fp32 for any activation above 2^-64 in magnitude; the group's scale
# 2^(e - 127) times 2^62 is applied to the group's sum.
_GEMV_ACT_SHIFT = tl.constexpr(18446744073709551616.0)  # 2^64


@triton.jit
def _gemv_tile_bases(w_ptr, w_scale_ptr, w_rows, K_RED, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    """The one-token kernels' tile addresses in tile-major weights (see
    gemv_tile_major): weight words [rows, 1, 4] (a group's four 32-bit words,
    eight codes each) and E8M0 scales [rows, 1] of K step 0. `w_rows` are
    tile-major row numbers, tile w_rows // BLOCK_SIZE_N, row w_rows %
    BLOCK_SIZE_N of it."""
    GROUPS: tl.constexpr = BLOCK_SIZE_K // 32
    k_steps = tl.cdiv(K_RED, BLOCK_SIZE_K)
    row = (w_rows // BLOCK_SIZE_N) * k_steps * BLOCK_SIZE_N + w_rows % BLOCK_SIZE_N
    # A row's share of a K step is BLOCK_SIZE_K / 2 bytes: whole 16-byte groups of four words.
    w_base = w_ptr.to(tl.pointer_type(tl.uint32)) + row[:, None, None] * (GROUPS * 4) + tl.arange(0, 4)[None, None, :]
    s_base = w_scale_ptr + row[:, None] * GROUPS
    return w_base, s_base


@triton.jit
def _gemv_step_loads(a_ptr, a_row, w_base, s_base, k, g_end, K_RED, BLOCK_SIZE_N: tl.constexpr,
                     GROUPS: tl.constexpr):
    """K step k's weight words [rows, GROUPS, 4], E8M0 scales [rows, GROUPS]
    (uint32) and activations [GROUPS, 4, 8] (fp32, one vector load a thread;
    element [g, q, p] is reduction index 32g + 8q + p, code p of word q). A
    step's words and scales are contiguous for the whole tile (tile-major).
    No weights or scales are read from scale group g_end on (past K, or past
    the program's last step for a loop that loads a step ahead: their DRAM
    traffic would be wasted); activations are, up to K (small, and thrown
    away with the step)."""
    g_in_step = tl.arange(0, GROUPS)
    g = k * GROUPS + g_in_step
    g_ok = g < g_end
    w = tl.load(w_base + k * (BLOCK_SIZE_N * GROUPS * 4) + (g_in_step * 4)[None, :, None], mask=g_ok[None, :, None],
                other=0)
    e = tl.load(s_base + k * (BLOCK_SIZE_N * GROUPS) + g_in_step[None, :], mask=g_ok[None, :], other=0).to(tl.uint32)
    kk = g[:, None, None] * 32 + tl.arange(0, 4)[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    a8 = tl.load(a_ptr + a_row + kk, mask=kk < K_RED, other=0.0).to(tl.float32)
    return w, e, a8


@triton.jit
def _by_code_position(a8, GROUPS: tl.constexpr):
    """a8 [GROUPS, 4, 8] split by code position p: eight [GROUPS, 4] tensors."""
    a_even, a_odd = tl.split(tl.reshape(a8, (GROUPS, 4, 4, 2)))  # p = 2j, 2j + 1
    a04, a26 = tl.split(tl.reshape(a_even, (GROUPS, 4, 2, 2)))
    a15, a37 = tl.split(tl.reshape(a_odd, (GROUPS, 4, 2, 2)))
    a0, a4 = tl.split(a04)
    a2, a6 = tl.split(a26)
    a1, a5 = tl.split(a15)
    a3, a7 = tl.split(a37)
    return a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _mx_gemv_acc(a_ptr, a_row, w_ptr, w_scale_ptr, w_rows, K_RED, k_begin, k_end, BLOCK_SIZE_N: tl.constexpr,
                 BLOCK_SIZE_K: tl.constexpr):
    """fp32 [BLOCK_SIZE_N]: the activation row at offset `a_row` times MXFP4
    weight rows `w_rows` over K steps [k_begin, k_end), on CUDA cores: no
    MMA, so no 16-row tile of which one token uses one row.

    The weights are read as 32-bit words, eight codes each, four words (16
    bytes, one vector load) per scale group: a tile is [rows, groups, 4]
    words. Code p of word q of group g is reduction index 32g + 8q + p. Each
    code's bits become an fp32 (x 2^-126, _e2m1_bits: shifts and masks, no
    conversion instruction) multiplied into the activation (x 2^64, see
    _GEMV_ACT_SHIFT) with one fused multiply-add; a group's 32 products are
    summed in registers and scaled once, by 2^(e - 65) as two exact powers
    of two (2^(min(e, 128) - 65) x 2^(max(e, 128) - 128): each an fp32 for
    every E8M0 byte). A step's activations are one vector load a thread,
    split by code position (measured on an H200: loading each position
    apart made GEMM 1 1.31x slower, results/bench/NVIDIA_H200/mxfp4_m1_gemv.md).

    Each step's loads are issued one step ahead, before the previous step's
    arithmetic, so a warp has them in flight while it computes. Measured on
    an H200 at its best config (BN64 BK128 w4 SPLIT_K 4): the whole M=1 call
    55.4 -> 47.6 us (same file). GEMV=2 does not do this: see its docstring."""
    GROUPS: tl.constexpr = BLOCK_SIZE_K // 32
    w_base, s_base = _gemv_tile_bases(w_ptr, w_scale_ptr, w_rows, K_RED, BLOCK_SIZE_N, BLOCK_SIZE_K)
    # The last step's loads of the step after it load nothing.
    g_end = tl.minimum(tl.cdiv(K_RED, 32), k_end * GROUPS)
    acc = tl.zeros((BLOCK_SIZE_N, GROUPS), dtype=tl.float32)
    w_next, e_next, a8_next = _gemv_step_loads(a_ptr, a_row, w_base, s_base, k_begin, g_end, K_RED, BLOCK_SIZE_N,
                                               GROUPS)
    for k in range(k_begin, k_end):
        # The next step's loads are issued before this step's arithmetic, so
        # that a warp has them in flight while it computes.
        w, e, a8 = w_next, e_next, a8_next
        w_next, e_next, a8_next = _gemv_step_loads(a_ptr, a_row, w_base, s_base, k + 1, g_end, K_RED, BLOCK_SIZE_N,
                                                   GROUPS)
        a0, a1, a2, a3, a4, a5, a6, a7 = _by_code_position(a8 * _GEMV_ACT_SHIFT, GROUPS)
        part = _e2m1_bits(w) * a0[None, :, :]
        part += _e2m1_bits(w >> 4) * a1[None, :, :]
        part += _e2m1_bits(w >> 8) * a2[None, :, :]
        part += _e2m1_bits(w >> 12) * a3[None, :, :]
        part += _e2m1_bits(w >> 16) * a4[None, :, :]
        part += _e2m1_bits(w >> 20) * a5[None, :, :]
        part += _e2m1_bits(w >> 24) * a6[None, :, :]
        part += _e2m1_bits(w >> 28) * a7[None, :, :]
        f_lo = ((tl.minimum(e, 128) + 62) << 23).to(tl.float32, bitcast=True)  # 2^(min(e, 128) - 65)
        f_hi = ((tl.maximum(e, 128) - 1) << 23).to(tl.float32, bitcast=True)  # 2^(max(e, 128) - 128)
        acc += tl.sum(part, axis=2) * f_lo * f_hi
    return tl.sum(acc, axis=1)


# GEMV=2: the same product in packed half-precision arithmetic. Its PTX needs
# sm_89 (`cvt.rn.f16x2.e4m3x2`); tunelab allows it from compute capability 9.0,
# the only one it has run on. A word's eight codes become four f16x2 pairs in
# eleven SASS instructions (seven integer, four conversions; sm_90): shifts
# and masks turn each code into an E4M3 byte (magnitude bits to bits 2-4, sign
# to bit 7: the code's value x 2^-6, exactly, subnormals included), and
# `cvt.rn.f16x2.e4m3x2` widens two bytes at once. `fma.rn.f16x2` multiplies
# them into the activations, scaled per scale group into f16 (the group's
# largest below 2^15) and paired to match: (p0, p2), (p1, p3), (p4, p6),
# (p5, p7), p the code's position in its word. Two words' sixteen products go
# into one f16x2 accumulator, eight a lane (at most 8 x 6 x 2^-6 x 2^15 =
# 24576, inside f16's range); the lanes are widened and added in fp32, and
# everything after is fp32, as in GEMV=1.
def _gemv_f16_words_ptx() -> str:
    """Two words (eight codes each: $1, $2) times their activation pairs ($3-$6,
    $7-$10: (p0, p2), (p1, p3), (p4, p6), (p5, p7) as f16x2), summed in one f16x2
    accumulator and widened: $0, fp32. lo / hi: the E4M3 bytes of the words'
    low / high nibbles; lo0, lo1 (hi0, hi1) their low and high byte pairs."""
    body = ["{",
            "    .reg .b32 m, s, lo, hi, h0, h1, acc;",
            "    .reg .b16 lo0, lo1, hi0, hi1, x0, x1;",
            "    .reg .f32 f0, f1;"]
    for word, pairs in ((1, (3, 4, 5, 6)), (2, (7, 8, 9, 10))):
        first = "mul.rn.f16x2 acc, h0, ${};".format(pairs[0]) if word == 1 else \
            "fma.rn.f16x2 acc, h0, ${}, acc;".format(pairs[0])
        body += [
            # Low nibbles: magnitude bits to E4M3 bits 2-4, sign to bit 7.
            f"    and.b32 m, ${word}, 0x07070707;",
            f"    and.b32 s, ${word}, 0x08080808;",
            "    shl.b32 m, m, 2;",
            "    shl.b32 s, s, 4;",
            "    or.b32 lo, m, s;",
            # High nibbles: magnitude bits down to bits 2-4, the sign is already bit 7.
            f"    shr.b32 m, ${word}, 2;",
            "    and.b32 m, m, 0x1C1C1C1C;",
            f"    and.b32 s, ${word}, 0x80808080;",
            "    or.b32 hi, m, s;",
            "    mov.b32 {lo0, lo1}, lo;",
            "    mov.b32 {hi0, hi1}, hi;",
            "    cvt.rn.f16x2.e4m3x2 h0, lo0;",
            "    cvt.rn.f16x2.e4m3x2 h1, lo1;",
            "    " + first,
            f"    fma.rn.f16x2 acc, h1, ${pairs[2]}, acc;",
            "    cvt.rn.f16x2.e4m3x2 h0, hi0;",
            "    cvt.rn.f16x2.e4m3x2 h1, hi1;",
            f"    fma.rn.f16x2 acc, h0, ${pairs[1]}, acc;",
            f"    fma.rn.f16x2 acc, h1, ${pairs[3]}, acc;",
        ]
    body += ["    mov.b32 {x0, x1}, acc;",
             "    cvt.f32.f16 f0, x0;",
             "    cvt.f32.f16 f1, x1;",
             "    add.f32 $0, f0, f1;",
             "}"]
    return "\n".join(body)


_GEMV_F16_WORDS = tl.constexpr(_gemv_f16_words_ptx())
# The products' scale: E4M3 bytes read as the code's value x 2^-6 and the
# activations are x 2^(141 - e), e their group's largest fp32 exponent field,
# so a group's sum is its products x 2^(135 - e). 2^(e - 197) takes it to
# GEMV=1's scale (x 2^-62; then the weights' 2^(e_w - 65), as there). e is
# taken as at least 71 so that 2^(e - 197) is a normal fp32: smaller groups
# (every activation below 2^-56) are scaled to below 2^14 instead of 2^15.
_GEMV_F16_MIN_EXP = tl.constexpr(71)


@triton.jit
def _pack_f16x2(lo, hi):
    """uint32: the f16 pair (lo, hi), each rounded to nearest from fp32."""
    return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.uint32,
                                     is_pure=True, pack=1)


@triton.jit
def _by_word_parity(x, GROUPS: tl.constexpr):
    """x [GROUPS, 4] (one value per word q) split into its even and odd words
    (q = 0, 2 and 1, 3), each [1, GROUPS, 2] to broadcast over a tile's rows."""
    even, odd = tl.split(tl.reshape(x, (GROUPS, 2, 2)))
    return even[None, :, :], odd[None, :, :]


@triton.jit
def _mx_gemv_acc_f16(a_ptr, a_row, w_ptr, w_scale_ptr, w_rows, K_RED, k_begin, k_end, BLOCK_SIZE_N: tl.constexpr,
                     BLOCK_SIZE_K: tl.constexpr):
    """_mx_gemv_acc in packed half precision (GEMV=2, see _GEMV_F16_WORDS):
    the same tile and scale groups. Its K loop compiles to 3.1 SASS
    instructions a weight against GEMV=1's 5.6 (sm_90, BLOCK_SIZE_N 128,
    BLOCK_SIZE_K 128, four warps; results/bench/NVIDIA_H200/mxfp4_m1_gemv.md
    says how they were counted). The result differs from GEMV=1's by f16
    rounding: of the sums (eight products a lane), and of activations far
    below their group's largest (bf16 and f16 values within about 2^16 of
    it convert exactly).

    Its loads are not issued a step ahead as _mx_gemv_acc's are: measured on
    an H200 (results/bench/NVIDIA_H200/mxfp4_m1_gemv.md), that helped some
    configs and hurt others (the registers it holds, 78 -> 96 at BN128 BK128
    w4, leave room for five programs an SM, not six), and the fastest whole
    call got no faster (44.0 us before, 44.9 with it)."""
    GROUPS: tl.constexpr = BLOCK_SIZE_K // 32
    w_base, s_base = _gemv_tile_bases(w_ptr, w_scale_ptr, w_rows, K_RED, BLOCK_SIZE_N, BLOCK_SIZE_K)
    n_groups = tl.cdiv(K_RED, 32)
    acc = tl.zeros((BLOCK_SIZE_N, GROUPS), dtype=tl.float32)
    for k in range(k_begin, k_end):
        w, e, a8 = _gemv_step_loads(a_ptr, a_row, w_base, s_base, k, n_groups, K_RED, BLOCK_SIZE_N, GROUPS)
        # Each group's largest exponent field, then its activations x 2^(141 - e) (exact).
        e_a = tl.max(tl.max(tl.abs(a8).to(tl.uint32, bitcast=True) >> 23, axis=2), axis=1)
        e_a = tl.maximum(e_a, _GEMV_F16_MIN_EXP)
        up = ((268 - e_a) << 23).to(tl.float32, bitcast=True)
        a0, a1, a2, a3, a4, a5, a6, a7 = _by_code_position(a8 * up[:, None, None], GROUPS)
        # Activation pairs per word, then each tile split into its even and odd words
        # (q = 0, 2 and 1, 3), whose sums one f16x2 accumulator takes in turn.
        w_even, w_odd = tl.split(tl.reshape(w, (BLOCK_SIZE_N, GROUPS, 2, 2)))
        p02_even, p02_odd = _by_word_parity(_pack_f16x2(a0, a2), GROUPS)
        p13_even, p13_odd = _by_word_parity(_pack_f16x2(a1, a3), GROUPS)
        p46_even, p46_odd = _by_word_parity(_pack_f16x2(a4, a6), GROUPS)
        p57_even, p57_odd = _by_word_parity(_pack_f16x2(a5, a7), GROUPS)
        part = tl.inline_asm_elementwise(
            _GEMV_F16_WORDS, "=f" + ",r" * 10,
            [w_even, w_odd, p02_even, p13_even, p46_even, p57_even, p02_odd, p13_odd, p46_odd, p57_odd],
            dtype=tl.float32, is_pure=True, pack=1)
        down = ((e_a - 70) << 23).to(tl.float32, bitcast=True)  # 2^(e - 197)
        f_lo = ((tl.minimum(e, 128) + 62) << 23).to(tl.float32, bitcast=True)  # 2^(min(e, 128) - 65)
        f_hi = ((tl.maximum(e, 128) - 1) << 23).to(tl.float32, bitcast=True)  # 2^(max(e, 128) - 128)
        acc += tl.sum(part, axis=2) * down[None, :] * f_lo * f_hi
    return tl.sum(acc, axis=1)


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
            acc_n = _mx_gemv_acc_f16(a_ptr, row_offset, w_ptr, w_scale_ptr, w_rows, K_RED, k_begin, k_end,
                                     BLOCK_SIZE_N, BLOCK_SIZE_K)
        else:
            acc_n = _mx_gemv_acc(a_ptr, row_offset, w_ptr, w_scale_ptr, w_rows, K_RED, k_begin, k_end, BLOCK_SIZE_N,
                                 BLOCK_SIZE_K)
        return acc_n[None, :]
    if SWAP_AB:
        acc_t = _q_acc_swapped(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, a_rows, a_mask, w_rows, K_RED, k_begin,
                               k_end, stride_am,
                               stride_asm, stride_wr, stride_wsr, WFMT, GROUP_N, GROUP_K, DOT_SCALED, A_FMT,
                               BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, A_CACHE, MX_PTX)
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
            packed = tl.load(w_base + (byte0 + offs_h)[:, None], mask=(byte0 + offs_h)[:, None] < k_pad // 2,
                             other=0)
            g0 = k * GROUPS
            scales = tl.load(s_base + (g0 + offs_g)[None, :], mask=(g0 + offs_g)[None, :] < k_pad // 32, other=0)
            if DOT_SCALED:
                kk = k * BLOCK_SIZE_K + offs_k
                a = tl.load(a_ptr + a_rows[:, None] * stride_am + kk[None, :],
                            mask=a_mask[:, None] & (kk[None, :] < K_RED), other=0.0, cache_modifier=A_CACHE)
                acc = tl.dot_scaled(a, None, A_FMT, packed, scales, "e2m1", acc)
            else:
                k_even = k * BLOCK_SIZE_K + 2 * offs_h
                a_row = a_ptr + a_rows[:, None] * stride_am
                a_lo = tl.load(a_row + k_even[None, :], mask=a_mask[:, None] & (k_even[None, :] < K_RED),
                               other=0.0, cache_modifier=A_CACHE)
                a_hi = tl.load(a_row + (k_even + 1)[None, :], mask=a_mask[:, None] & (k_even[None, :] + 1 < K_RED),
                               other=0.0, cache_modifier=A_CACHE)
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
            a = tl.load(a_ptrs, mask=a_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0,
                        cache_modifier=A_CACHE)
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
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, a_rows, a_mask, w_rows, K_RED, k_begin, k_end, stride_am, stride_asm,
    stride_wr, stride_wsr,
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
            packed = tl.load(w_base + (byte0 + offs_h)[None, :], mask=(byte0 + offs_h)[None, :] < k_pad // 2,
                             other=0)
            g0 = k * GROUPS
            scales = tl.load(s_base + (g0 + offs_g)[None, :], mask=(g0 + offs_g)[None, :] < k_pad // 32, other=0)
            if DOT_SCALED:
                kk = k * BLOCK_SIZE_K + offs_k
                a_t = tl.load(a_col + kk[:, None], mask=a_mask[None, :] & (kk[:, None] < K_RED), other=0.0,
                              cache_modifier=A_CACHE)
                acc = tl.dot_scaled(packed, scales, "e2m1", a_t, None, A_FMT, acc)
            else:
                k_even = k * BLOCK_SIZE_K + 2 * offs_h
                a_lo = tl.load(a_col + k_even[:, None], mask=a_mask[None, :] & (k_even[:, None] < K_RED),
                               other=0.0, cache_modifier=A_CACHE)
                a_hi = tl.load(a_col + (k_even + 1)[:, None], mask=a_mask[None, :] & (k_even[:, None] + 1 < K_RED),
                               other=0.0, cache_modifier=A_CACHE)
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
            a_t = tl.load(a_ptrs, mask=a_mask[None, :] & (offs_k[:, None] < k_rem), other=0.0,
                          cache_modifier=A_CACHE)
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
def _split_k_total(acc, part_ptr, count_ptr, rows, row_ok, cols, col_ok, stride_ps, stride_pr,
                   SPLIT_K: tl.constexpr):
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
    acc = _q_acc(a_ptr, a_scale_ptr, w1_ptr + expert * stride_we, w1_scale_ptr + expert * stride_wse, rows,
                 tok_mask, acc_rows.to(tl.int64), K, k_begin, k_end, stride_am, stride_asm, stride_wr, stride_wsr,
                 WFMT, GROUP_N, GROUP_K, DOT_SCALED, A_FMT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, "", SWAP_AB, MX_PTX,
                 GEMV)
    if SPLIT_K > 1:
        acc, last = _split_k_total(acc, part_ptr, count_ptr, slots.to(tl.int64), tok_mask, w_row, row_ok,
                                   stride_ps, 2 * N, SPLIT_K)
        if not last:
            return
    _gemm1_store(acc, b1_ptr, inter_ptr, slots, tok_mask, expert, w_row, offs_j, pid_n, N, stride_be, stride_im,
                 ACTIVATION, HAS_BIAS, BLOCK_SIZE_M, BLOCK_SIZE_N)


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
    acc = _q_acc(a_ptr, a_scale_ptr, w2_ptr + expert * stride_we, w2_scale_ptr + expert * stride_wse, slots64,
                 tok_mask, offs_n_raw.to(tl.int64) if GEMV else offs_n, K_RED, k_begin, k_end, stride_am, stride_asm,
                 stride_wr, stride_wsr,
                 WFMT, GROUP_N, GROUP_K, DOT_SCALED, A_FMT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, "", SWAP_AB, MX_PTX,
                 GEMV)
    if SPLIT_K > 1:
        acc, last = _split_k_total(acc, part_ptr, count_ptr, slots64, tok_mask, offs_n, offs_n_raw < N_OUT,
                                   stride_ps, N_OUT, SPLIT_K)
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


@dataclasses.dataclass(frozen=True)
class QuantMoEPlan:
    """Everything a quantised launch needs that depends on the shape and config only."""

    M: int
    E: int
    topk: int
    K: int
    N: int
    act_dtype: object  # torch dtype of x, the intermediate and out (or its stand-in)
    wfmt: int
    group_n: int  # block_n of fp8 block weights (0 otherwise)
    group_k: int  # block_k of fp8 block weights; the activation group (0: per token)
    activation: int
    interleaved: bool
    has_bias: bool
    config: dict
    dot_scaled: bool
    swap_ab: bool  # the weights as the MMA's left operand (_q_acc_swapped)
    mx_ptx: bool  # MXFP4 dequantised by inline PTX (_mx_halves_ptx); False under the interpreter
    # MXFP4 one token a block on CUDA cores, BLOCK_SIZE_M 1: 0 no, 1 fp32 (_mx_gemv_acc), 2 packed f16
    # (_mx_gemv_acc_f16; 1 under the interpreter)
    gemv: int
    split_k: int  # K split over this many programs per tile (the grids' second axis; _split_k_total)
    numel: int
    max_blocks: int
    max_padded: int
    align_meta: dict
    grid1: tuple
    grid2: tuple
    self_align: int
    pdl: bool
    # vLLM's structure: GEMM 1 writes gate and up, moe_act_kernel activates.
    split_activation: bool

    @property
    def fp8(self) -> bool:
        return self.wfmt in (WFMT_FP8_TENSOR, WFMT_FP8_BLOCK)


def weight_format_code(problem) -> int:
    if problem.weight_format == "mxfp4":
        return WFMT_MXFP4
    if problem.weight_format == "fp8":
        return WFMT_FP8_BLOCK if problem.block_shape else WFMT_FP8_TENSOR
    raise ValueError(f"the quantised MoE kernels take fp8 or mxfp4 weights, not {problem.weight_format!r}")


def vllm_swap_ab(wfmt: int, block_m: int, block_n: int, capability) -> bool:
    """vLLM 0.33's rule (`enable_swap_ab` in fused_moe/utils.py, applied to fp8
    w8a8 in invoke_fused_moe_triton_kernel): the weights are the MMA's left
    operand on a GPU of compute capability exactly 9.0 when BLOCK_SIZE_M < 64
    and BLOCK_SIZE_N >= 64. `capability` is (major, minor), None off a GPU."""
    is_fp8 = wfmt in (WFMT_FP8_TENSOR, WFMT_FP8_BLOCK)
    return bool(is_fp8 and capability is not None and tuple(capability) == (9, 0)
                and block_m < 64 and block_n >= 64)


def current_capability():
    """(major, minor) of the NVIDIA GPU the kernels are compiled for, or None
    (the interpreter, AMD). Asks Triton's active driver, as pdl_supported
    does, so a compile worker answers for the lane's GPU without touching one."""
    if interpreting():
        return None
    import triton.runtime

    target = triton.runtime.driver.active.get_current_target()
    if target.backend != "cuda":
        return None
    arch = int(target.arch)
    return arch // 10, arch % 10


def make_quant_plan(problem, config: dict, *, vllm_structure: bool = False, self_align_max: int | None = None,
                    pdl: bool | None = None, capability=None) -> QuantMoEPlan:
    """The launch plan of a quantised problem (FusedMoE with dtype fp8 or mxfp4).

    `vllm_structure`: vLLM's call (alignment kernel at every size, GEMM 1
    writing gate and up, the activation kernel, plain launches), as the
    `fused_moe_vllm` method runs; else tunelab's (`fused_moe`). The keyword
    knobs are for tests and benchmarks, as in fused_moe.make_plan;
    `capability` is the GPU's (major, minor) for vLLM's SWAP_AB rule (by
    default the current GPU's)."""
    wfmt = weight_format_code(problem)
    if vllm_structure and capability is None:
        capability = current_capability()
    if vllm_structure and wfmt == WFMT_FP8_BLOCK:
        # vLLM takes BLOCK_SIZE_K = min(BLOCK_SIZE_K, block_n, block_k) for block-scale weights.
        config = dict(config, BLOCK_SIZE_K=min(int(config["BLOCK_SIZE_K"]), *problem.block_shape))
    bm, bn, bk = (int(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
    gemv = int(config.get("GEMV", 0))
    if gemv not in (0, 1, 2):
        raise ValueError(f"GEMV must be 0, 1 or 2, got {gemv}")
    if gemv:
        if wfmt != WFMT_MXFP4:
            raise ValueError(f"GEMV={gemv} is tunelab's one-token MXFP4 kernel: MXFP4 weights only")
        if bm != 1:
            raise ValueError(f"GEMV={gemv} computes one token a block: BLOCK_SIZE_M must be 1, got {bm}")
        for key in ("DOT_SCALED", "SWAP_AB", "MX_PTX"):
            if int(config.get(key, 0)):
                raise ValueError(f"GEMV={gemv} dequantises on CUDA cores with no MMA: {key} must be 0")
        if vllm_structure:
            raise ValueError(f"GEMV={gemv} is tunelab's own kernel; vLLM's call structure (fused_moe_vllm) runs "
                             "vLLM's, which has no such key")
    if gemv == 2:
        if interpreting():
            # The interpreter cannot run PTX: it runs GEMV=1's arithmetic, as MX_PTX=1 falls back there too.
            gemv = 1
        elif not pdl_supported():
            # Its PTX needs sm_89 (cvt.rn.f16x2.e4m3x2); tunelab allows it where it has run, compute
            # capability 9.0 or newer (pdl_supported() asks that, as MX_PTX=1 does).
            raise ValueError("GEMV=2 is inline PTX that tunelab runs on compute capability 9.0 or newer: "
                             "use GEMV=1 on this GPU")
    checked = (("BLOCK_SIZE_N", bn), ("BLOCK_SIZE_K", bk)) if gemv else \
        (("BLOCK_SIZE_M", bm), ("BLOCK_SIZE_N", bn), ("BLOCK_SIZE_K", bk))
    for name, v in checked:
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot needs 16), got {v}")
    if int(config["GROUP_SIZE_M"]) < 1:
        raise ValueError(f"GROUP_SIZE_M must be >= 1, got {config['GROUP_SIZE_M']}")
    dot_scaled = int(config.get("DOT_SCALED", 0))
    if dot_scaled not in (0, 1):
        raise ValueError(f"DOT_SCALED must be 0 or 1, got {dot_scaled}")
    swap_ab = int(config.get("SWAP_AB", 0))
    if swap_ab not in (0, 1):
        raise ValueError(f"SWAP_AB must be 0 or 1, got {swap_ab}")
    if vllm_structure:
        if "SWAP_AB" in config:
            raise ValueError("vLLM's call structure (fused_moe_vllm) decides SWAP_AB itself, as vLLM does (a config "
                             "file's SWAP_AB makes vLLM raise): leave it out of the config")
        swap_ab = int(vllm_swap_ab(wfmt, bm, bn, capability))
    split_k = int(config.get("SPLIT_K", 1))
    if not 1 <= split_k <= MAX_SPLIT_K:
        raise ValueError(f"SPLIT_K must be between 1 and {MAX_SPLIT_K}, got {split_k}")
    partial_bytes = 4 * split_k * problem.M * problem.topk * (2 * problem.N + problem.K) if split_k > 1 else 0
    if partial_bytes > MAX_SPLIT_K_BYTES:
        raise ValueError(f"SPLIT_K={split_k} at M={problem.M} needs {partial_bytes / 2**30:.1f} GiB of fp32 partials "
                         f"(at most {MAX_SPLIT_K_BYTES / 2**30:.0f}): split K at decode sizes, where the GEMMs "
                         "have few tiles")
    if split_k > 1 and vllm_structure:
        raise ValueError("SPLIT_K is tunelab's own (K split over programs); vLLM's call structure "
                         "(fused_moe_vllm) runs vLLM's kernel, which has no such key")
    mx_ptx = int(config.get("MX_PTX", 0))
    if mx_ptx not in (0, 1):
        raise ValueError(f"MX_PTX must be 0 or 1, got {mx_ptx}")
    if mx_ptx:
        if wfmt != WFMT_MXFP4 or dot_scaled:
            raise ValueError("MX_PTX=1 is tunelab's own MXFP4 dequantisation: MXFP4 weights with DOT_SCALED=0 only")
        if not interpreting():
            if problem.act_dtype_name != "bf16":
                raise ValueError(f"MX_PTX=1 builds bf16 weights: it takes bf16 activations, not "
                                 f"{problem.act_dtype_name}")
            # mul.rn.bf16x2 is sm_90 PTX; pdl_supported() asks the same question (CUDA, 9.0 or newer).
            if not pdl_supported():
                raise ValueError("MX_PTX=1 is inline PTX for compute capability 9.0 or newer (mul.rn.bf16x2): "
                                 "use MX_PTX=0 on this GPU")
    group_n = group_k = 0
    if wfmt == WFMT_MXFP4:
        if bk < MX_GROUP:
            raise ValueError(f"BLOCK_SIZE_K must be >= {MX_GROUP} for MXFP4 weights (a K step covers whole "
                             f"{MX_GROUP}-value scale groups), got {bk}")
        if problem.act_dtype_name not in ("bf16", "fp16"):
            raise ValueError(f"MXFP4 weights take bf16 or fp16 activations, not {problem.act_dtype_name}")
    else:
        if dot_scaled:
            raise ValueError("DOT_SCALED applies to MXFP4 weights only (it selects tl.dot_scaled's upcast)")
        if wfmt == WFMT_FP8_BLOCK:
            group_n, group_k = problem.block_shape
            if group_k & (group_k - 1) or group_k % bk:
                raise ValueError(f"BLOCK_SIZE_K ({bk}) must divide the weights' block_k ({group_k}), a power of "
                                 "two: each K step takes one scale per row, as in vLLM's kernel")
        if bk < 32:
            raise ValueError(f"BLOCK_SIZE_K must be >= 32 for fp8 dots, got {bk}")
    numel = problem.M * problem.topk
    max_blocks, max_padded = align_sizes(numel, problem.E, bm)
    if self_align_max is None:
        self_align_max = 0 if vllm_structure else SELF_ALIGN_MAX_NUMEL
    if pdl is None:
        pdl = False if vllm_structure else pdl_supported()
    if pdl and vllm_structure:
        raise ValueError("vLLM's call structure launches its kernels plainly: no dependent launches")
    return QuantMoEPlan(
        M=problem.M, E=problem.E, topk=problem.topk, K=problem.K, N=problem.N,
        act_dtype=problem.dtype, wfmt=wfmt, group_n=group_n, group_k=group_k,
        activation=ACT_SWIGLU_OAI if problem.activation == "swiglu_oai" else ACT_SILU,
        interleaved=problem.interleaved, has_bias=problem.bias,
        config={k: int(config[k]) for k in QUANT_CONFIG_KEYS}, dot_scaled=bool(dot_scaled), swap_ab=bool(swap_ab),
        mx_ptx=bool(mx_ptx) and not interpreting(), gemv=gemv, split_k=split_k,
        numel=numel, max_blocks=max_blocks, max_padded=max_padded,
        align_meta=_align_meta(numel, problem.E, max_padded),
        grid1=(max_blocks * triton.cdiv(2 * problem.N, bn), split_k),
        grid2=(max_blocks * triton.cdiv(problem.K, bn), split_k),
        self_align=max(2, _next_pow2(numel)) if numel <= self_align_max else 0,
        pdl=bool(pdl), split_activation=bool(vllm_structure),
    )


def gemm1_weight_rows(N: int, interleaved: bool, activation: int, bn: int):
    """int64 [tiles, bn]: the w1 rows GEMM 1's column tile t reads, in order,
    as the kernel's _gemm1_rows computes them (tail tiles wrap around)."""
    tiles = cdiv(2 * N, bn)
    j = torch.arange(bn, dtype=torch.int64)
    pid = torch.arange(tiles, dtype=torch.int64)[:, None]
    if activation == ACT_NONE:
        return (pid * bn + j) % (2 * N)
    act_col = (pid * (bn // 2) + j // 2) % N
    is_up = j % 2
    return 2 * act_col + is_up if interleaved else act_col + is_up * N


def gemv_tile_major(w, scales, rows, bk: int):
    """GEMV's weights: packed MXFP4 `w` [E, R, K_PAD / 2] and its E8M0
    `scales` [E, R, K_PAD / 32] copied tile by tile. `rows` [tiles, bn] are
    the weight rows each column tile reads (in order); the copies are
    [E, tiles, K steps, bn, bk / 2] and [E, tiles, K steps, bn, bk / 32],
    zero past K, so a K step's bytes and scales for a whole tile are
    contiguous: a warp's load covers consecutive bytes rather than bn rows
    K_PAD / 2 bytes apart. Measured on an H200 (bench/mxfp4_m1_loads.py,
    results/bench/NVIDIA_H200/mxfp4_m1_gemv.md): GEMM 1's loads alone at
    BN128 BK128, 17.6 us from row-major weights and 13.4 tile-major (read
    flush). Built when a launch is bound, as a serving engine lays out its
    weights when it loads them; the copy is not part of the timed call."""
    rows = rows.to(w.device)
    tiles, bn = rows.shape
    out = []
    for t, unit in ((w, bk // 2), (scales, bk // MX_GROUP)):
        e, _, width = t.shape
        full, tail = divmod(width, unit)
        gathered = t[:, rows.reshape(-1)].view(e, tiles, bn, width)
        tiled = t.new_zeros(e, tiles, full + (tail > 0), bn, unit)
        # Copied straight into place, through a [.., bn, steps, unit] view: one temporary, the gather.
        into = tiled.transpose(2, 3)
        into[:, :, :, :full] = gathered[..., :full * unit].unflatten(-1, (full, unit))
        if tail:
            into[:, :, :, full, :tail] = gathered[..., full * unit:]
        out.append(tiled)
    return out[0], out[1]


def _a_fmt(dtype) -> str:
    return "bf16" if str(dtype) == "torch.bfloat16" else "fp16"


def _weight_strides(plan: QuantMoEPlan, rows: int, cols: int):
    """(stride_we, stride_wr, stride_wse, stride_wsr) of a contiguous weight
    [E, rows, cols] and its scales, as the kernels index them (GEMV: the
    tile-major copies' expert strides; rows are found from the tile sizes)."""
    if plan.gemv:
        bn, bk = plan.config["BLOCK_SIZE_N"], plan.config["BLOCK_SIZE_K"]
        rows_padded = cdiv(rows, bn) * bn * cdiv(cols, bk)
        return rows_padded * bk // 2, 0, rows_padded * bk // MX_GROUP, 0
    if plan.wfmt == WFMT_MXFP4:
        pad = mx_padded(cols)
        return rows * pad // 2, pad // 2, rows * pad // MX_GROUP, pad // MX_GROUP
    if plan.wfmt == WFMT_FP8_BLOCK:
        sr, sc = cdiv(rows, plan.group_n), cdiv(cols, plan.group_k)
        return rows * cols, cols, sr * sc, sc
    return rows * cols, cols, 1, 0


def _act_scale_stride(plan: QuantMoEPlan, cols: int) -> int:
    return cdiv(cols, plan.group_k) if plan.group_k else 1


def _launch_specs(plan: QuantMoEPlan, b: dict):
    """[(kernel, grid, args, kwargs)] in launch order (see the module docstring).

    Dependent launches (plan.pdl): every kernel after the first waits for its
    predecessor's writes (so each one's completion implies all earlier ones')
    and only then lets its successor be placed; the first follows the timer's
    event and the L2 flush, so it is an ordinary launch."""
    c = plan.config
    E, K, N = plan.E, plan.K, plan.N
    tiles = {k: c[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}
    launch = {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
    fmt = dict(WFMT=plan.wfmt, GROUP_N=plan.group_n, GROUP_K=plan.group_k, DOT_SCALED=plan.dot_scaled,
               A_FMT=_a_fmt(plan.act_dtype), SWAP_AB=plan.swap_ab, MX_PTX=plan.mx_ptx, GEMV=plan.gemv,
               SPLIT_K=plan.split_k)
    specs: list[tuple] = []

    def add(kernel, grid, args, kwargs):
        first = not specs
        pdl = dict(PDL_WAIT=plan.pdl and not first, PDL_LAUNCH=plan.pdl)
        extra = {"launch_pdl": True} if plan.pdl and not first else {}
        specs.append((kernel, grid, args, {**kwargs, **pdl, **extra}))

    if not plan.self_align:
        specs.append((
            moe_align_kernel, (1,),
            (b["topk_ids"], b["sorted_ids"], b["expert_ids"], b["num_post"], b["cursor"],
             plan.numel, E, plan.max_padded, plan.max_blocks),
            dict(BLOCK_SIZE_M=c["BLOCK_SIZE_M"], USE_PDL=plan.pdl, **plan.align_meta),
        ))
    group = plan.group_k
    quant_kw = dict(GROUP=group, BLOCK=max(QUANT_BLOCK, group) if group else min(QUANT_BLOCK, _next_pow2(K)),
                    ROUND_F32=interpreting(), num_warps=4)
    if plan.fp8:
        # Whatever came before (the alignment) is complete once this kernel is:
        # it waits even though it reads only x.
        add(moe_quant_act_kernel, (plan.M,), (b["x"], b["xq"], b["xs"], K, K), quant_kw)
        a1, a1s, stride_a1s = b["xq"], b["xs"], _act_scale_stride(plan, K)
    else:
        a1, a1s, stride_a1s = b["x"], b["x"], 0
    gemm1_out, gemm1_act, gemm1_stride = (
        (b["gate_up"], ACT_NONE, 2 * N) if plan.split_activation else (b["inter"], plan.activation, N))
    swe, swr, swse, swsr = _weight_strides(plan, 2 * N, K)
    add(moe_gemm1_q_kernel, plan.grid1,
        (a1, a1s, b["w1"], b["w1_scale"], b["b1"] if plan.has_bias else b["x"], gemm1_out, b["part1"], b["count1"],
         b["sorted_ids"], b["expert_ids"], b["num_post"], b["topk_ids"],
         N, K, plan.numel, E, plan.max_blocks,
         K, stride_a1s, swe, swr, swse, swsr, 2 * N, gemm1_stride, plan.numel * 2 * N),
        dict(TOPK=plan.topk, INTERLEAVED=plan.interleaved, ACTIVATION=gemm1_act, HAS_BIAS=plan.has_bias,
             SELF_ALIGN=plan.self_align, **fmt, **tiles, **launch))
    if plan.split_activation:
        # vLLM's structure: plain launches only (make_quant_plan refuses pdl with it).
        specs.append((moe_act_kernel, (plan.numel, triton.cdiv(N, ACT_BLOCK)), (b["gate_up"], b["inter"], N),
                      dict(INTERLEAVED=plan.interleaved, ACTIVATION=plan.activation, BLOCK=ACT_BLOCK, num_warps=4)))
    if plan.fp8:
        n_kw = dict(quant_kw, BLOCK=max(QUANT_BLOCK, group) if group else min(QUANT_BLOCK, _next_pow2(N)))
        add(moe_quant_act_kernel, (plan.numel,), (b["inter"], b["interq"], b["inters"], N, N), n_kw)
        a2, a2s, stride_a2s = b["interq"], b["inters"], _act_scale_stride(plan, N)
    else:
        a2, a2s, stride_a2s = b["inter"], b["inter"], 0
    swe, swr, swse, swsr = _weight_strides(plan, K, N)
    add(moe_gemm2_q_kernel, plan.grid2,
        (a2, a2s, b["w2"], b["w2_scale"], b["b2"] if plan.has_bias else b["x"], b["out2"], b["part2"], b["count2"],
         b["topk_weights"], b["sorted_ids"], b["expert_ids"], b["num_post"], b["topk_ids"],
         K, N, plan.numel, E, plan.max_blocks,
         N, stride_a2s, swe, swr, swse, swsr, K, K, plan.numel * K),
        dict(HAS_BIAS=plan.has_bias, SELF_ALIGN=plan.self_align, **fmt, **tiles, **launch))
    # The sum waits for GEMM 2 through moe_sum_kernel's own USE_PDL.
    specs.append((moe_sum_kernel, (plan.M, triton.cdiv(K, SUM_BLOCK)), (b["out2"], b["out"], K),
                  dict(TOPK=plan.topk, BLOCK=SUM_BLOCK, USE_PDL=plan.pdl, num_warps=4,
                       **({"launch_pdl": True} if plan.pdl else {}))))
    return specs


def _stand_in_buffers(plan: QuantMoEPlan) -> dict:
    dt, i32, f32 = pointer(plan.act_dtype), pointer(int32()), pointer(torch_dtype("fp32"))
    wt = pointer(uint8() if plan.wfmt == WFMT_MXFP4 else fp8_e4m3())
    ws = pointer(uint8()) if plan.wfmt == WFMT_MXFP4 else f32
    q = pointer(fp8_e4m3())
    return {
        "x": dt, "w1": wt, "w1_scale": ws, "b1": dt, "w2": wt, "w2_scale": ws, "b2": dt,
        "inter": dt, "gate_up": dt, "out2": dt, "out": dt, "xq": q, "xs": f32, "interq": q, "inters": f32,
        "topk_ids": i32, "sorted_ids": i32, "expert_ids": i32, "num_post": i32, "cursor": i32, "topk_weights": f32,
        "part1": f32, "part2": f32, "count1": i32, "count2": i32,
    }


def compile_quant_plan(plan: QuantMoEPlan):
    """Compile the plan's kernels into Triton's cache without launching them (no GPU needed)."""
    for kernel, grid, args, kwargs in _launch_specs(plan, _stand_in_buffers(plan)):
        prebuild_host_code(kernel.warmup(*args, grid=grid, **kwargs))


class QuantMoELaunch:
    """A bound quantised call: buffers preallocated, `__call__` computes into `out`."""

    def __init__(self, plan: QuantMoEPlan, inputs: dict, direct: bool | None = None):
        self.plan = plan
        x = inputs["x"]
        dev = x.device
        i32 = torch.int32
        self.inputs = {k: v.contiguous() for k, v in inputs.items()}
        if plan.gemv:
            # GEMV never takes vLLM's structure (make_quant_plan), so GEMM 1 applies plan.activation.
            assert not plan.split_activation
            bn, bk = plan.config["BLOCK_SIZE_N"], plan.config["BLOCK_SIZE_K"]
            rows1 = gemm1_weight_rows(plan.N, plan.interleaved, plan.activation, bn)
            rows2 = torch.arange(cdiv(plan.K, bn) * bn, dtype=torch.int64).reshape(-1, bn) % plan.K
            w1, s1 = gemv_tile_major(self.inputs["w1"], self.inputs["w1_scale"], rows1, bk)
            w2, s2 = gemv_tile_major(self.inputs["w2"], self.inputs["w2_scale"], rows2, bk)
            # The kernels index experts by these strides (_weight_strides), not by the tensors'.
            assert (w1.stride(0), s1.stride(0)) == _weight_strides(plan, 2 * plan.N, plan.K)[::2]
            assert (w2.stride(0), s2.stride(0)) == _weight_strides(plan, plan.K, plan.N)[::2]
            self.inputs.update(w1=w1, w1_scale=s1, w2=w2, w2_scale=s2)
        if self.inputs["topk_ids"].dtype != i32:
            self.inputs["topk_ids"] = self.inputs["topk_ids"].to(i32)
        if self.inputs["topk_weights"].dtype != torch.float32:
            self.inputs["topk_weights"] = self.inputs["topk_weights"].float()
        adt = plan.act_dtype
        self.sorted_ids = torch.empty(plan.max_padded, dtype=i32, device=dev)
        self.expert_ids = torch.empty(plan.max_blocks, dtype=i32, device=dev)
        self.num_post = torch.empty(1, dtype=i32, device=dev)
        self.cursor = torch.empty(plan.align_meta["E_PAD"], dtype=i32, device=dev)
        self.inter = torch.empty(plan.numel, plan.N, dtype=adt, device=dev)
        self.gate_up = torch.empty(plan.numel, 2 * plan.N, dtype=adt, device=dev) if plan.split_activation else None
        self.out2 = torch.empty(plan.numel, plan.K, dtype=adt, device=dev)
        self.out = torch.empty(plan.M, plan.K, dtype=adt, device=dev)
        # SPLIT_K > 1: the splits' fp32 partials, and per tile a count of splits
        # done that must start at zero (the last split of a tile resets it).
        # With one split the kernels never touch them: a stand-in element each.
        f32 = torch.float32
        split = plan.split_k > 1
        self.part1 = torch.empty((plan.split_k, plan.numel, 2 * plan.N) if split else (1,), dtype=f32, device=dev)
        self.part2 = torch.empty((plan.split_k, plan.numel, plan.K) if split else (1,), dtype=f32, device=dev)
        self.count1 = torch.zeros(plan.grid1[0] if split else 1, dtype=i32, device=dev)
        self.count2 = torch.zeros(plan.grid2[0] if split else 1, dtype=i32, device=dev)
        bufs = dict(self.inputs, sorted_ids=self.sorted_ids, expert_ids=self.expert_ids, num_post=self.num_post,
                    cursor=self.cursor, inter=self.inter, gate_up=self.gate_up, out2=self.out2, out=self.out,
                    part1=self.part1, part2=self.part2, count1=self.count1, count2=self.count2)
        if plan.fp8:
            f8 = torch.float8_e4m3fn
            g = plan.group_k
            self.xq = torch.empty(plan.M, plan.K, dtype=f8, device=dev)
            self.xs = torch.empty(plan.M, cdiv(plan.K, g) if g else 1, dtype=torch.float32, device=dev)
            self.interq = torch.empty(plan.numel, plan.N, dtype=f8, device=dev)
            self.inters = torch.empty(plan.numel, cdiv(plan.N, g) if g else 1, dtype=torch.float32, device=dev)
            bufs.update(xq=self.xq, xs=self.xs, interq=self.interq, inters=self.inters)
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
        # The kernels launched, in order (tests check the call structure).
        self.kernels = [getattr(spec[0], "fn", spec[0]).__name__ for spec in specs]

    def __call__(self):
        for run in self._runners:
            run()
        return self.out


