"""tunelab.quant: the fp8 and MXFP4 formats the quantised problems use.

Pure torch on the CPU: these are the references' building blocks, checked
against values worked out by hand (docs/quantisation.md).
"""

import math

import pytest
import torch

from tunelab import quant


def test_e2m1_codes_and_nibble_order():
    # Byte 0x21: low nibble 1 (0.5) is value 0, high nibble 2 (1.0) is value 1.
    packed = torch.tensor([[0x21, 0xF8]], dtype=torch.uint8)
    codes = quant.unpack_e2m1(packed)
    assert codes.tolist() == [[1, 2, 8, 15]]
    scales = torch.tensor([[127]], dtype=torch.uint8)  # 2^0; one group of 32 covers the 4 values (padded)
    full = torch.zeros(1, 16, dtype=torch.uint8)
    full[0, :2] = packed[0]
    vals = quant.dequantize_mxfp4(full, scales, 4)
    assert vals.tolist() == [[0.5, 1.0, -0.0, -6.0]]


def test_e8m0_scale_is_a_power_of_two():
    full = torch.full((1, 16), 0x77, dtype=torch.uint8)  # both nibbles code 7: every value 6.0
    for e, factor in ((127, 1.0), (130, 8.0), (120, 2.0**-7)):
        vals = quant.dequantize_mxfp4(full, torch.tensor([[e]], dtype=torch.uint8), 32)
        assert torch.all(vals == 6.0 * factor)


def test_mxfp4_round_trip_of_representable_values():
    mags = torch.tensor(quant.E2M1_MAGNITUDES)
    row = torch.cat([mags, -mags, mags.flip(0), -mags.flip(0)])  # 32 values, amax 6 -> exponent 0
    w = torch.stack([row, row * 4.0, row * 2.0**-5])
    packed, scales = quant.quantize_mxfp4(w)
    assert packed.shape == (3, 16) and scales.shape == (3, 1)
    assert scales[:, 0].tolist() == [127, 129, 122]
    assert torch.equal(quant.dequantize_mxfp4(packed, scales, 32), w)
    # Low nibble first: values 0 and 1 (0.0 and 0.5, codes 0 and 1) share byte 0x10.
    assert packed[0, 0].item() == 0x10


def test_mxfp4_rounds_to_nearest_ties_to_even_and_saturates():
    # Group amax 6 (exponent 0), so values are compared with the E2M1 grid directly.
    vals = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, -0.3, 2.9] + [0.0] * 21)
    packed, scales = quant.quantize_mxfp4(vals[None])
    back = quant.dequantize_mxfp4(packed, scales, 32)[0]
    assert back[:11].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.5, 3.0]
    # A group whose amax is just under a power of two: scaled into [4, 8), 7.9 saturates to 6.
    packed, scales = quant.quantize_mxfp4(torch.tensor([[7.9] + [0.0] * 31]))
    assert scales.item() == 127 and quant.dequantize_mxfp4(packed, scales, 32)[0, 0] == 6.0


def test_mxfp4_pads_the_reduction_axis_to_32():
    w = torch.randn(5, 40)
    packed, scales = quant.quantize_mxfp4(w)
    assert packed.shape == (5, 32) and scales.shape == (5, 2)
    assert torch.all(quant.unpack_e2m1(packed)[:, 40:] == 0)  # the padding holds zeros
    back = quant.dequantize_mxfp4(packed, scales, 40)
    assert back.shape == (5, 40)
    # Relative error of 4-bit values with a shared power-of-two scale: at most a quarter of the group's amax.
    amax = torch.nn.functional.pad(w, (0, 24)).view(5, 2, 32).abs().amax(-1).repeat_interleave(32, 1)[:, :40]
    assert torch.all((back - w).abs() <= 0.25 * amax + 1e-7)


def test_zero_group_scale():
    packed, scales = quant.quantize_mxfp4(torch.zeros(2, 32))
    assert scales.tolist() == [[0], [0]] and torch.all(packed == 0)


def test_fp8_per_tensor_and_block_scales():
    w = torch.randn(3, 64, 96)
    q, s = quant.quantize_fp8_per_tensor(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3,)
    assert torch.allclose(s, w.abs().flatten(1).amax(1) / 448.0)
    assert torch.equal(q.float().abs().flatten(1).amax(1), torch.full((3,), 448.0))  # each expert's amax lands on 448
    back = quant.dequantize_fp8(q, s)
    assert torch.all((back - w).abs() <= w.abs() * 2.0**-4 + s[:, None, None] * 2.0**-9)

    q, s = quant.quantize_fp8_block(w, 32, 64)
    assert s.shape == (3, 2, 2)  # 64 rows / 32, 96 columns -> 2 blocks of 64 (the second partial)
    assert torch.isclose(s[1, 1, 1], w[1, 32:, 64:].abs().max() / 448.0)
    back = quant.dequantize_fp8(q, s, (32, 64))
    assert torch.all((back - w).abs() <= w.abs() * 2.0**-4 + 1e-3)


def test_activation_scale_factor_is_one_over_448_in_fp32():
    """The kernels and the reference multiply amax by this one fp32 number."""
    r = torch.tensor(1.0 / 448.0, dtype=torch.float32).item()
    assert quant.FP8_MAX_RECIP == r and quant.FP8_MAX_RECIP != 1.0 / 448.0


def test_activation_scales_are_the_same_bits_on_any_device():
    """amax x FP8_MAX_RECIP, not amax / 448: torch divides by a Python number
    through its reciprocal on a GPU and exactly on a CPU, which differ."""
    amax = torch.linspace(0.5, 600.0, 100001)
    q, s = quant.quantize_act_fp8(amax[:, None], 0)
    assert torch.equal(s, amax * torch.tensor(quant.FP8_MAX_RECIP))
    assert not torch.equal(s, amax / 448.0)  # some of these differ, or the test proves nothing


@pytest.mark.parametrize("group", [0, 32])
@pytest.mark.parametrize("seed", range(8))
def test_act_quantisation(group, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 80, generator=gen) * torch.tensor([1.0, 10.0, 0.01, 0.0])[:, None]
    q, s = quant.quantize_act_fp8(x, group)
    if group == 0:
        assert s.shape == (4,)
        assert math.isclose(s[1].item(), x[1].abs().max().item() / 448.0, rel_tol=1e-6)
    else:
        assert s.shape == (4, 3)
        assert math.isclose(s[0, 2].item(), x[0, 64:].abs().max().item() / 448.0, rel_tol=1e-6)
    zero_row_scale = torch.tensor(quant.ACT_EPS, dtype=torch.float32) * quant.FP8_MAX_RECIP
    assert torch.all(q[3].float() == 0) and torch.all(s[3] == zero_row_scale)  # the zero row
    back = quant.dequantize_act_fp8(q, s, group)
    # Round to nearest E4M3: half a step is 2^-4 of a normal value, and near zero half the
    # subnormal step, 2^-10 in units of the scale (x / scale below 2^-6 is subnormal).
    scale = s[:, None] if group == 0 else s.repeat_interleave(group, dim=1)[:, :80]
    assert torch.all((back - x).abs() <= x.abs() * 2.0**-4 + scale * 2.0**-10 * (1 + 1e-6))


def test_bytes_per_weight():
    assert quant.mxfp4_bytes_per_weight() == 0.5 + 1 / 32
    assert quant.mx_padded(360) == 384 and quant.mx_padded(2880) == 2880


def _f16(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.float16).item()


def _pair_values(word: int) -> list[float]:
    """What the CUDA kernel's decode makes of a pair-order word: eight values, code order."""
    pairs = quant.decode_pair_order(word)
    low = [_f16(p & 0xFFFF if p & 0x8000 == 0 else (p & 0xFFFF) - 0x10000) for p in pairs]
    high = [_f16((p >> 16) if p >> 31 == 0 else (p >> 16) - 0x10000) for p in pairs]
    return low + high  # pair k holds codes k (low half) and k + 4 (high half)


def test_pair_order_decodes_every_code_at_every_position():
    # Each of the 16 codes at each of the 8 positions of a word, the other
    # positions holding the other codes in turn: the decode gives the code's
    # value times 2^-14 exactly, whatever its neighbours.
    table = [v for v in quant.E2M1_MAGNITUDES] + [-v for v in quant.E2M1_MAGNITUDES]
    words = []
    for code in range(16):
        for pos in range(8):
            for fill in range(16):
                codes = [(fill + i) % 16 for i in range(8)]
                codes[pos] = code
                words.append(sum(c << (4 * i) for i, c in enumerate(codes)))
    standard = torch.tensor(words, dtype=torch.int64).to(torch.int32)  # wraps to the same bits
    paired = quant.to_pair_order(standard.view(torch.uint8)).view(torch.int32)
    for word, got in zip(words, paired.tolist()):
        want = [table[(word >> (4 * i)) & 0xF] * 2.0**-14 for i in range(8)]
        assert _pair_values(got & 0xFFFFFFFF) == want, hex(word)


def test_pair_order_keeps_bytes_words_and_shape():
    packed, _ = quant.quantize_mxfp4(torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(3)))
    paired = quant.to_pair_order(packed)
    assert paired.shape == packed.shape and paired.dtype == torch.uint8
    # A word's bits stay in that word: changing one word changes only its own.
    other = packed.clone()
    other[1, 2, 4:8] ^= 0x5A
    changed = (quant.to_pair_order(other) != paired).view(-1, 4).any(dim=1)
    assert changed.nonzero().flatten().tolist() == [(1 * 5 + 2) * 8 + 1]
    # Invertible: distinct words stay distinct (the map is a bijection on 32 bits).
    assert len(set(quant._pair_order_words())) == 32
    with pytest.raises(ValueError, match="multiple of 4"):
        quant.to_pair_order(torch.zeros(3, 6, dtype=torch.uint8))


def test_e8m0_scales_are_exact_powers_of_two():
    """Every E8M0 byte, 0 (the subnormal 2^-127) and 255 (read as infinity) included."""
    s = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    f = quant.e8m0_to_float(s)
    want = [math.ldexp(1.0, int(e) - 127) if e < 255 else math.inf for e in range(256)]
    assert f.dtype == torch.float32 and f.tolist() == want
