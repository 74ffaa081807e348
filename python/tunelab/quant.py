"""Weight and activation quantisation for the quantised problems, in torch.

What the Triton kernels read, and what references dequantise
(docs/quantisation.md has the formats and where each rule comes from):

- fp8 (E4M3, torch.float8_e4m3fn, largest finite value 448):
  - weights per tensor: one fp32 scale per expert and weight,
    scale = amax / 448, q = x / scale;
  - weights per block: one fp32 scale per [block_n, block_k] tile of a
    [rows, cols] weight (rows are output features, cols the reduction axis),
    shape [ceil(rows / block_n), ceil(cols / block_k)]; partial tiles at the
    edges have scales of their own;
  - activations per token (one scale per row) or per 1 x group block along the
    reduction axis: scale = max(amax, ACT_EPS) x FP8_MAX_RECIP (1/448 rounded
    to fp32), q = clamp(x / scale, -448, 448) with an IEEE-rounded quotient,
    the same formula and the same bits as the kernels' quantisation.
- MXFP4 (OCP microscaling, E2M1 values): one E8M0 scale byte e per 32
  consecutive values along the reduction axis, worth 2^(e - 127); values are
  E2M1 (sign, two exponent bits, one mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6),
  two per byte, the lower-index value in the low nibble. A reduction axis that
  is not a multiple of 32 is zero-padded to one in storage (its last scale
  covers the real values only).

Dequantised values are exact in fp32, so references built from them differ
from the kernels only by summation order and the roundings the kernels make.
"""

from __future__ import annotations

import functools
import struct

from tunelab.lazy import torch

FP8_MAX = 448.0
# 1/448 rounded to fp32: activation scales are amax times it, in torch and in
# the kernels alike (torch divides a tensor by a Python number this way on a
# GPU and not on a CPU, so the reference spells it out).
FP8_MAX_RECIP = struct.unpack("<f", struct.pack("<f", 1.0 / FP8_MAX))[0]
# Smallest amax an activation block is scaled by: an all-zero row gets a tiny
# scale and zeros, never a division by zero.
ACT_EPS = 1e-10
MX_GROUP = 32
# E2M1 magnitudes by their three low bits (exponent, mantissa).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------
# fp8


def fp8_dtype():
    return torch.float8_e4m3fn


def quantize_fp8_per_tensor(w):
    """(q, scale) of a weight [..., rows, cols]: one fp32 scale per leading index
    (per expert for [E, rows, cols]); q in fp8."""
    w32 = w.float()
    amax = w32.abs().flatten(-2).amax(dim=-1)
    scale = torch.clamp(amax, min=ACT_EPS) / FP8_MAX
    q = (w32 / scale[..., None, None]).clamp(-FP8_MAX, FP8_MAX).to(fp8_dtype())
    return q, scale.contiguous()


def quantize_fp8_block(w, block_n: int, block_k: int):
    """(q, scale) of a weight [..., rows, cols] with one fp32 scale per
    [block_n, block_k] tile: scale [..., ceil(rows / block_n), ceil(cols / block_k)]."""
    w32 = w.float()
    rows, cols = w32.shape[-2:]
    rb, cb = cdiv(rows, block_n), cdiv(cols, block_k)
    padded = torch.zeros(*w32.shape[:-2], rb * block_n, cb * block_k, dtype=torch.float32, device=w.device)
    padded[..., :rows, :cols] = w32
    tiles = padded.unflatten(-1, (cb, block_k)).unflatten(-3, (rb, block_n))  # [..., rb, bn, cb, bk]
    amax = tiles.abs().amax(dim=(-3, -1))  # [..., rb, cb]
    scale = torch.clamp(amax, min=ACT_EPS) / FP8_MAX
    full = expand_block_scale(scale, rows, cols, block_n, block_k)
    q = (w32 / full).clamp(-FP8_MAX, FP8_MAX).to(fp8_dtype())
    return q, scale.contiguous()


def expand_block_scale(scale, rows: int, cols: int, block_n: int, block_k: int):
    """A [..., rb, cb] block scale repeated to [..., rows, cols]."""
    full = scale.repeat_interleave(block_n, dim=-2).repeat_interleave(block_k, dim=-1)
    return full[..., :rows, :cols]


def dequantize_fp8(q, scale, block=None):
    """fp32 values of an fp8 weight: per-tensor scale [...] (block None) or
    block scale [..., rb, cb] with block = (block_n, block_k)."""
    q32 = q.float()
    if block is None:
        return q32 * scale.float()[..., None, None]
    rows, cols = q.shape[-2:]
    return q32 * expand_block_scale(scale.float(), rows, cols, *block)


def quantize_act_fp8(x, group: int = 0):
    """(q, scale) of activations [rows, cols], as the kernels quantise them:
    group 0 is one scale per row (per token), else one per 1 x group block
    along cols (scale [rows, ceil(cols / group)])."""
    x32 = x.float()
    rows, cols = x32.shape
    if group == 0:
        amax = x32.abs().amax(dim=1)
        scale = torch.clamp(amax, min=ACT_EPS) * FP8_MAX_RECIP
        full = scale[:, None]
    else:
        nb = cdiv(cols, group)
        padded = torch.zeros(rows, nb * group, dtype=torch.float32, device=x.device)
        padded[:, :cols] = x32
        amax = padded.view(rows, nb, group).abs().amax(dim=2)
        scale = torch.clamp(amax, min=ACT_EPS) * FP8_MAX_RECIP
        full = scale.repeat_interleave(group, dim=1)[:, :cols]
    q = (x32 / full).clamp(-FP8_MAX, FP8_MAX).to(fp8_dtype())
    return q, scale.contiguous()


def dequantize_act_fp8(q, scale, group: int = 0):
    q32 = q.float()
    if group == 0:
        return q32 * scale.float()[:, None]
    return q32 * scale.float().repeat_interleave(group, dim=1)[:, : q.shape[1]]


# ---------------------------------------------------------------------------
# MXFP4


def mx_padded(cols: int) -> int:
    """The stored length of a reduction axis of `cols` values: a multiple of 32."""
    return cdiv(cols, MX_GROUP) * MX_GROUP


def _e2m1_table(device):
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])  # codes 8..15 carry the sign bit


def quantize_mxfp4(w):
    """(packed, scales) of a weight [..., rows, cols], quantised along cols:
    packed uint8 [..., rows, mx_padded(cols) // 2] (low nibble first), scales
    uint8 [..., rows, mx_padded(cols) // 32] (E8M0).

    Each group's exponent is floor(log2(amax)) - 2, so the group's largest
    value lands in [4, 8) before rounding to the nearest E2M1 value (6 at
    most: values above saturate); all-zero groups get exponent -127. Values
    round to the nearest E2M1 magnitude, ties to the even code.
    """
    w32 = w.float()
    cols = w32.shape[-1]
    padded_cols = mx_padded(cols)
    if padded_cols != cols:
        w32 = torch.nn.functional.pad(w32, (0, padded_cols - cols))
    groups = w32.unflatten(-1, (padded_cols // MX_GROUP, MX_GROUP))
    amax = groups.abs().amax(dim=-1)
    exp = torch.floor(torch.log2(torch.clamp(amax, min=2.0**-127))) - 2
    exp = torch.where(amax > 0, exp, torch.full_like(exp, -127.0)).clamp(-127, 127)
    scales = (exp + 127).to(torch.uint8)
    # Divided by the very scale dequantize_mxfp4 multiplies by (exact at -127 too).
    scaled = groups / e8m0_to_float(scales)[..., None]
    codes = _nearest_e2m1(scaled).flatten(-2)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed.contiguous(), scales.contiguous()


# Midpoints between consecutive E2M1 magnitudes, and whether a value exactly
# on one rounds up: ties go to the even code (mantissa bit 0).
_E2M1_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _nearest_e2m1(v):
    """E2M1 codes (uint8, 0..15) nearest to v, ties to the even code, saturating at 6."""
    a = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for mid, tie_up in _E2M1_MIDPOINTS:
        code += (a >= mid) if tie_up else (a > mid)
    sign = (v < 0) & (code > 0)
    return code + 8 * sign.to(torch.uint8)


def unpack_e2m1(packed):
    """E2M1 codes (uint8 [..., 2 * n]) of packed bytes [..., n], low nibble first."""
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def dequantize_mxfp4(packed, scales, cols: int):
    """fp32 values [..., rows, cols] of an MXFP4 weight, exact."""
    codes = unpack_e2m1(packed)
    vals = _e2m1_table(packed.device)[codes.long()]
    factor = e8m0_to_float(scales).repeat_interleave(MX_GROUP, dim=-1)
    return (vals * factor)[..., :cols]


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """2^(s - 127) for E8M0 bytes s, as fp32, built from its bits: exact for
    every s, including 0, whose 2^-127 is an fp32 subnormal (`torch.exp2` on
    a GPU returns 5.877470e-39 for it, not 2^-127 = 5.877472e-39). 255, NaN in
    the format, reads as infinity, as the kernels read it."""
    s = scales.to(torch.int32)
    bits = torch.where(s > 0, s << 23, torch.full_like(s, 1 << 22))
    return bits.view(torch.float32)


def mxfp4_bytes_per_weight() -> float:
    """Bytes an MXFP4 weight takes: half a byte, plus one scale byte per 32."""
    return 0.5 + 1.0 / MX_GROUP


# --------------------------------------------------------------------------
# MXFP4 in pair order: the CUDA one-token kernel's weight words
#
# An f16 whose bits are an E2M1 code's sign at bit 15 and its three other bits
# (exponent, mantissa) at bits 11, 10, 9 is worth exactly the code's value
# times 2^-14 (the code's exponent lands in the f16 exponent's two low bits,
# its mantissa bit in the f16 mantissa's top bit; code exponent 0 lands on an
# f16 subnormal, as E2M1's own subnormal 0.5 needs). So four logic
# instructions and four rotations turn a 32-bit word of eight codes into four
# f16 pairs, if the word's bits are arranged for it: pair k is
# `PAIR_MASK & (rotr(w, a) ^ rotr(w, b) ...)` over the rotations in
# PAIR_ROTATIONS[k], and holds codes k (low half) and k + 4 (high half) of
# the eight. Plain shifts cannot do it with fewer: the mask's eight bit
# positions have no four translates that tile a word, so at least four
# rotated copies are needed, and the XORs make four of them enough (found by
# search over GF(2); the map from a word in standard order to one in pair
# order is linear and invertible, so it is a table lookup a byte).
#
# Pair order rearranges bits within each 32-bit word only: the bytes, their
# count and the scales are those of the standard layout (quantize_mxfp4),
# as a serving engine rearranges weights when it loads them.

PAIR_MASK = 0x8E008E00
PAIR_ROTATIONS = ((0,), (3,), (7, 9), (7, 12))
# Where a code's bits go in its f16 half: sign to 15, bits 0-2 to 9-11.
_F16_POSITION = (9, 10, 11, 15)
_MASK_POSITIONS = tuple(p for p in range(32) if PAIR_MASK >> p & 1)


def _pair_order_words() -> list[int]:
    """The pair-order word of each single bit of a standard-order word: entry
    j is the word whose pairs decode to the codes of `1 << j` (linear: the
    word of any standard word is the XOR of its bits' entries)."""
    # A's rows: one per (pair k, mask position p), the W bits that position reads.
    rows = []
    for rotations in PAIR_ROTATIONS:
        for p in _MASK_POSITIONS:
            row = 0
            for r in rotations:
                row ^= 1 << ((p + r) % 32)
            rows.append(row)
    # Invert A over GF(2) (Gauss-Jordan on [A | I]).
    n = len(rows)
    aug = [(rows[i], 1 << i) for i in range(n)]
    for col in range(32):
        pivot = next((i for i in range(col, n) if aug[i][0] >> col & 1), None)
        if pivot is None:
            raise AssertionError("PAIR_ROTATIONS do not give an invertible decode")
        aug[col], aug[pivot] = aug[pivot], aug[col]
        for i in range(n):
            if i != col and aug[i][0] >> col & 1:
                aug[i] = (aug[i][0] ^ aug[col][0], aug[i][1] ^ aug[col][1])
    # Row col of A^-1 (as bits over targets) is aug[col][1]: W bit col = XOR of the targets it names.
    inverse_rows = [aug[col][1] for col in range(32)]
    words = []
    for j in range(32):
        code, bit = divmod(j, 4)
        pair, half = code % 4, code // 4
        target = pair * len(_MASK_POSITIONS) + _MASK_POSITIONS.index(16 * half + _F16_POSITION[bit])
        words.append(sum(1 << col for col in range(32) if inverse_rows[col] >> target & 1))
    return words


@functools.lru_cache(maxsize=None)
def _pair_order_tables() -> tuple:
    """Four 256-entry tables (int32 bits): table b maps byte b of a standard
    word to its share of the pair-order word."""
    unit = _pair_order_words()
    tables = []
    for byte in range(4):
        table = [0] * 256
        for v in range(256):
            for b in range(8):
                if v >> b & 1:
                    table[v] ^= unit[8 * byte + b]
        tables.append(tuple(t - (1 << 32) if t >= 1 << 31 else t for t in table))
    return tuple(tables)


def to_pair_order(packed):
    """MXFP4 codes `packed` (uint8 [..., n], n a multiple of 4, standard
    order: quantize_mxfp4's) with each 32-bit word's bits in pair order."""
    if packed.dtype != torch.uint8 or packed.shape[-1] % 4:
        raise ValueError("pair order needs uint8 codes whose last dimension is a multiple of 4 bytes")
    words = packed.contiguous().view(torch.int32)
    out = torch.zeros_like(words)
    for byte, table in enumerate(_pair_order_tables()):
        lookup = torch.tensor(table, dtype=torch.int32, device=packed.device)
        out ^= lookup[((words >> (8 * byte)) & 0xFF).long()]
    return out.view(torch.uint8)


def decode_pair_order(word: int) -> list[int]:
    """The four f16 pairs (32-bit ints) the kernel makes of one pair-order
    word: for tests and for reading the layout."""

    def rotr(w: int, s: int) -> int:
        return ((w >> s) | (w << (32 - s))) & 0xFFFFFFFF if s else w

    out = []
    for rotations in PAIR_ROTATIONS:
        v = 0
        for r in rotations:
            v ^= rotr(word, r)
        out.append(v & PAIR_MASK)
    return out
