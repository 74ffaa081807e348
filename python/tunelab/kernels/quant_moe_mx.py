"""MXFP4 weights in Triton: E2M1 codes and E8M0 scales into 16-bit values
(`_mx_halves` and its swapped and inline-PTX forms), and the one-token GEMV
accumulators that read them on CUDA cores (`_mx_gemv_acc`, GEMV=1;
`_mx_gemv_acc_f16`, GEMV=2, packed f16 in inline PTX).

@triton.jit helpers only, called from tunelab.kernels.quant_moe_kernels' GEMM
kernels; tunelab.kernels.quant_moe's docstring says where each is used and
docs/quantisation.md has the format.
"""

from __future__ import annotations

import triton
import triton.language as tl

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
    return _mx_values(
        packed,
        _scales_per_byte_cols(scales, BLOCK_SIZE_K, BLOCK_SIZE_N),
        tl.max(tl.max(scales, axis=1), axis=0),
        OUT_DTYPE,
    )


@triton.jit
def _mx_halves_rows(packed, scales, OUT_DTYPE: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """_mx_halves for the swapped tile: packed bytes [BLOCK_SIZE_N, BLOCK_SIZE_K / 2]
    (one weight row per row, as the weights lie in memory); the same values."""
    return _mx_values(
        packed,
        _scales_per_byte_rows(scales, BLOCK_SIZE_K, BLOCK_SIZE_N),
        tl.max(tl.max(scales, axis=1), axis=0),
        OUT_DTYPE,
    )


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
    for out, t, mag, sign, f in (
        ("$0", "t0", 6, 12, 5),
        ("$1", "t1", 6, 12, 6),
        ("$2", "t0", 2, 8, 5),
        ("$3", "t1", 2, 8, 6),
    ):
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
        lo, hi = tl.inline_asm_elementwise(
            _PTX_ONE, "=r,=r,=r,=r,r,r,r", [packed, f], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
        )
    else:
        f_a = ((tl.minimum(e, 128) + 126) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        f_b = ((tl.maximum(e, 128) - 1) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)  # 2^(e - 128)
        lo, hi = tl.inline_asm_elementwise(
            _PTX_TWO,
            "=r,=r,=r,=r,r,r,r,r,r",
            [packed, f_a, f_b],
            dtype=(tl.bfloat16, tl.bfloat16),
            is_pure=True,
            pack=4,
        )
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
def _gemv_step_loads(a_ptr, a_row, w_base, s_base, k, g_end, K_RED, BLOCK_SIZE_N: tl.constexpr, GROUPS: tl.constexpr):
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
    w = tl.load(
        w_base + k * (BLOCK_SIZE_N * GROUPS * 4) + (g_in_step * 4)[None, :, None], mask=g_ok[None, :, None], other=0
    )
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
def _mx_gemv_acc(
    a_ptr,
    a_row,
    w_ptr,
    w_scale_ptr,
    w_rows,
    K_RED,
    k_begin,
    k_end,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
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
    w_next, e_next, a8_next = _gemv_step_loads(
        a_ptr, a_row, w_base, s_base, k_begin, g_end, K_RED, BLOCK_SIZE_N, GROUPS
    )
    for k in range(k_begin, k_end):
        # The next step's loads are issued before this step's arithmetic, so
        # that a warp has them in flight while it computes.
        w, e, a8 = w_next, e_next, a8_next
        w_next, e_next, a8_next = _gemv_step_loads(
            a_ptr, a_row, w_base, s_base, k + 1, g_end, K_RED, BLOCK_SIZE_N, GROUPS
        )
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
    body = [
        "{",
        "    .reg .b32 m, s, lo, hi, h0, h1, acc;",
        "    .reg .b16 lo0, lo1, hi0, hi1, x0, x1;",
        "    .reg .f32 f0, f1;",
    ]
    for word, pairs in ((1, (3, 4, 5, 6)), (2, (7, 8, 9, 10))):
        first = (
            "mul.rn.f16x2 acc, h0, ${};".format(pairs[0])
            if word == 1
            else "fma.rn.f16x2 acc, h0, ${}, acc;".format(pairs[0])
        )
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
    body += [
        "    mov.b32 {x0, x1}, acc;",
        "    cvt.f32.f16 f0, x0;",
        "    cvt.f32.f16 f1, x1;",
        "    add.f32 $0, f0, f1;",
        "}",
    ]
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
    return tl.inline_asm_elementwise(
        "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.uint32, is_pure=True, pack=1
    )


@triton.jit
def _by_word_parity(x, GROUPS: tl.constexpr):
    """x [GROUPS, 4] (one value per word q) split into its even and odd words
    (q = 0, 2 and 1, 3), each [1, GROUPS, 2] to broadcast over a tile's rows."""
    even, odd = tl.split(tl.reshape(x, (GROUPS, 2, 2)))
    return even[None, :, :], odd[None, :, :]


@triton.jit
def _mx_gemv_acc_f16(
    a_ptr,
    a_row,
    w_ptr,
    w_scale_ptr,
    w_rows,
    K_RED,
    k_begin,
    k_end,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
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
            _GEMV_F16_WORDS,
            "=f" + ",r" * 10,
            [w_even, w_odd, p02_even, p13_even, p46_even, p57_even, p02_odd, p13_odd, p46_odd, p57_odd],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
        down = ((e_a - 70) << 23).to(tl.float32, bitcast=True)  # 2^(e - 197)
        f_lo = ((tl.minimum(e, 128) + 62) << 23).to(tl.float32, bitcast=True)  # 2^(min(e, 128) - 65)
        f_hi = ((tl.maximum(e, 128) - 1) << 23).to(tl.float32, bitcast=True)  # 2^(max(e, 128) - 128)
        acc += tl.sum(part, axis=2) * down[None, :] * f_lo * f_hi
    return tl.sum(acc, axis=1)
