"""Quantised fused MoE: fp8 w8a8 (per-tensor and block scales) and MXFP4.

Runs under Triton's interpreter without a GPU (fp16 activations: the
interpreter can get bf16 wrong) and on a GPU with the real kernels, where
bf16 activations and gpt-oss-sized reductions are checked as well
(`test_gpu_*`; docs/quantisation.md, "On a GPU", has the command).
"""

import os

import torch

if not torch.cuda.is_available():  # before triton is imported (conftest does the same)
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tunelab import quant  # noqa: E402
from tunelab.compare import compare  # noqa: E402
from tunelab.kernels import quant_moe  # noqa: E402
from tunelab.problems.moe import FusedMoE, vllm_default_config  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
GPU = pytest.mark.skipif(INTERPRETED, reason="needs a GPU (bf16 and gpt-oss-sized shapes)")
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}
# Per format, as experiments/gptoss-fp8.yaml and gptoss-mxfp4.yaml have them (docs/quantisation.md says why
# fp8's is wider); MXFP4's max_mismatch is 0 at these small shapes.
TOL = {"fp8": dict(atol=5e-2, rtol=5e-2, max_mismatch=0.005), "mxfp4": dict(atol=2e-2, rtol=2e-2, max_mismatch=0.0)}
# K = 96 and N = 40: K steps of 64 leave a tail, and MXFP4's w2 rows are padded from 40 to 64.
FP8_TENSOR = {"dtype": "fp8", "act_dtype": "fp16"}
FP8_BLOCK = {"dtype": "fp8", "act_dtype": "fp16", "weight_quant": "block", "block_shape": [32, 64]}
MXFP4 = {"dtype": "mxfp4", "act_dtype": "fp16", "activation": "swiglu_oai"}


def shape(fmt, **kw):
    base = {"M": 13, "E": 8, "topk": 2, "K": 96, "N": 40, **fmt}
    base.update(kw)
    return base


def run(method, problem, inputs, config=CFG):
    launch = problem.methods()[method].bind(problem, inputs, config)
    launch.out.fill_(float("nan"))  # the worker poisons the output before the check
    launch.inter.fill_(float("nan"))
    launch.out2.fill_(float("nan"))
    launch()
    if not INTERPRETED:
        torch.cuda.synchronize()
    return launch


def check(out, ref, fmt, **override):
    tol = dict(TOL[fmt], **override)
    result = compare(out, ref, **tol)
    assert result["nan_count"] == 0, "output left partly unwritten (NaN poison survived)"
    assert result["passed"], result
    return result


@pytest.fixture(params=["kernel", "self"])
def align(request, monkeypatch):
    """Both ways a call finds its blocks: the alignment kernel, or GEMMs that derive them from topk_ids."""
    monkeypatch.setattr(quant_moe, "SELF_ALIGN_MAX_NUMEL", 0 if request.param == "kernel" else 64)
    return request.param


@pytest.mark.parametrize("fmt", [FP8_TENSOR, FP8_BLOCK, MXFP4], ids=["fp8-tensor", "fp8-block", "mxfp4"])
def test_fused_moe_matches_reference(fmt, align, device):
    p = FusedMoE(shape(fmt))
    inputs = p.inputs(0, device)
    launch = run("fused_moe", p, inputs)
    assert launch.plan.self_align == (32 if align == "self" else 0)
    # tunelab's structure rounds where the reference does: fp8 is as tight as MXFP4 here.
    check(launch.out, p.reference(inputs), "mxfp4")


@pytest.mark.parametrize("dot_scaled", [0, 1])
@pytest.mark.parametrize("M", [1, 5])
def test_mxfp4_both_dequantisations(dot_scaled, M, device):
    p = FusedMoE(shape(MXFP4, M=M, E=4, topk=3, K=128, N=96))
    inputs = p.inputs(3, device)
    launch = run("fused_moe", p, inputs, dict(CFG, BLOCK_SIZE_K=64, DOT_SCALED=dot_scaled))
    assert launch.plan.dot_scaled == bool(dot_scaled)
    check(launch.out, p.reference(inputs), "mxfp4")


@pytest.mark.parametrize(
    "fmt,dot_scaled",
    [(FP8_TENSOR, 0), (FP8_BLOCK, 0), (MXFP4, 0), (MXFP4, 1)],
    ids=["fp8-tensor", "fp8-block", "mxfp4", "mxfp4-dot-scaled"],
)
@pytest.mark.parametrize("M", [1, 13])
def test_swapped_operands_match_reference(fmt, dot_scaled, M, device):
    """SWAP_AB=1 (the weights as the MMA's left operand) computes the same
    product: K = 96 leaves a K tail, N = 40 a partial tile and MXFP4 padding."""
    p = FusedMoE(shape(fmt, M=M))
    inputs = p.inputs(2, device)
    config = dict(CFG, SWAP_AB=1, **({"DOT_SCALED": 1} if dot_scaled else {}))
    launch = run("fused_moe", p, inputs, config)
    assert launch.plan.swap_ab and launch.plan.dot_scaled == bool(dot_scaled)
    check(launch.out, p.reference(inputs), "mxfp4")
    plain = run("fused_moe", p, inputs, dict(config, SWAP_AB=0))
    # The same products summed in another order: equal to within an fp32 rounding or two.
    torch.testing.assert_close(launch.out.float(), plain.out.float(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize(
    "fmt,extra",
    [(FP8_TENSOR, {}), (FP8_BLOCK, {}), (MXFP4, {}), (MXFP4, {"DOT_SCALED": 1}), (MXFP4, {"SWAP_AB": 1})],
    ids=["fp8-tensor", "fp8-block", "mxfp4", "mxfp4-dot-scaled", "mxfp4-swapped"],
)
@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k_matches_one_split(fmt, extra, split_k, align, device):
    """SPLIT_K > 1 (K split over programs, the last split of each tile sums the
    partials and runs the epilogue): the same output as one split to within
    fp32 reassociation. K = 160 is three K steps of 64 with a tail, so three
    splits take one step each and two take two and one; N = 40 leaves a
    partial column tile in both GEMMs. A second call must give the same bits:
    the tiles' counters were reset by their last split. Both ways of finding
    blocks at three splits; at two, the alignment kernel's alone (where the
    blocks come from is the same at any split count, and each case takes
    the interpreter seconds). Three experts for six routed tokens: blocks
    of three, two and one token (eight experts made six blocks of one,
    each a program per tile, for nothing split-K does not see in three)."""
    if split_k == 2 and align == "self":
        pytest.skip("self-alignment is split three ways in the split_k=3 case")
    p = FusedMoE(shape(fmt, M=3, K=160, E=3))
    inputs = p.inputs(4, device)
    config = dict(CFG, **extra)
    launch = run("fused_moe", p, inputs, dict(config, SPLIT_K=split_k))
    assert launch.plan.split_k == split_k and launch.plan.grid1[1] == split_k
    first = launch.out.clone()
    # Partials poisoned: a split's mask that differed between store and load would show as NaN.
    launch.part1.fill_(float("nan"))
    launch.part2.fill_(float("nan"))
    check(first, p.reference(inputs), "mxfp4")
    one = run("fused_moe", p, inputs, config)
    torch.testing.assert_close(first.float(), one.out.float(), atol=2e-3, rtol=2e-3)
    assert launch.count1.eq(0).all() and launch.count2.eq(0).all()
    launch.out.fill_(float("nan"))
    launch()
    assert torch.equal(launch.out, first)


GEMV_CFG = {
    "BLOCK_SIZE_M": 1,
    "BLOCK_SIZE_N": 16,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 1,
    "GEMV": 1,
}


@pytest.mark.parametrize("gemv", [1, 2])
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("M", [1, 3])
def test_gemv_matches_reference(M, split_k, gemv, align, device):
    """GEMV=1 and 2 (one token a block on CUDA cores; 2 in packed f16 on a
    GPU, 1's code under the interpreter): K = 96 is three scale groups,
    so the second K step of 64 has a masked group; w2's rows (N = 40) are
    padded to 64 with zero codes; M = 3 with topk 2 over 2 experts puts every
    token on both experts, three tokens on one expert (a block each). A
    second call gives the same bits. (Small: the interpreter runs a program
    at a time, and each token-expert pair is one.)"""
    p = FusedMoE(shape(MXFP4, M=M, E=2, topk=2))
    config = dict(GEMV_CFG, SPLIT_K=split_k, GEMV=gemv)
    if INTERPRETED and gemv == 2:
        # The interpreter runs GEMV=1's arithmetic for GEMV=2 (PTX does not run there): the plan
        # says so; running it would repeat the GEMV=1 case.
        assert quant_moe.make_quant_plan(p, config).gemv == 1
        return
    inputs = p.inputs(5, device)
    launch = run("fused_moe", p, inputs, config)
    assert launch.plan.gemv == gemv
    assert launch.plan.grid1[0] == launch.plan.max_blocks * 80 // 16
    first = launch.out.clone()
    check(first, p.reference(inputs), "mxfp4")
    mma = run("fused_moe", p, inputs, CFG)
    torch.testing.assert_close(first.float(), mma.out.float(), atol=2e-3, rtol=2e-3)
    if INTERPRETED and split_k == 1:
        # The interpreter runs programs one at a time, so one split leaves
        # nothing to race and no counter to reset between calls; a GEMV launch
        # takes it seconds.
        return
    launch.out.fill_(float("nan"))
    launch()
    assert torch.equal(launch.out, first)


# The activation decides only GEMM 1's row order, which no split count
# changes: SiLU's halves at one split (and on a GPU), SwiGLU at every split.
@pytest.mark.parametrize(
    "activation,gemv,split_k",
    [
        ("swiglu_oai", 1, 1),
        ("swiglu_oai", 1, 2),
        ("swiglu_oai", 1, 4),
        ("silu", 1, 1),
        pytest.param("swiglu_oai", 2, 8, marks=GPU),
        pytest.param("silu", 2, 8, marks=GPU),
    ],
)
def test_gemv_tile_major_weights_with_tail_tiles(activation, gemv, split_k, device):
    """GEMV reads weights copied tile by tile (gemv_tile_major), each column
    tile's rows in the order the kernel computes them (gemm1_weight_rows for
    w1, wrapping around in a tail tile). N = 44 leaves GEMM 1 a tail tile
    (88 rows in tiles of 16) and K = 104 GEMM 2 one (104 rows), and K = 104
    is 3.25 scale groups: the copies' padding past K must read as zeros.
    gpt-oss's SwiGLU takes gate and up interleaved, SiLU in two halves. With
    two K steps (BLOCK_SIZE_K 64), SPLIT_K 2 gives each split one and the last
    split's load ahead nothing; SPLIT_K 4 leaves two splits empty (8, on a
    GPU, six)."""
    p = FusedMoE(shape(MXFP4, M=2, E=4, topk=3, N=44, K=104, activation=activation))
    assert p.interleaved == (activation == "swiglu_oai")
    inputs = p.inputs(6, device)
    launch = run("fused_moe", p, inputs, dict(GEMV_CFG, GEMV=gemv, SPLIT_K=split_k))
    check(launch.out, p.reference(inputs), "mxfp4")
    rows = quant_moe.gemm1_weight_rows(44, p.interleaved, launch.plan.activation, 16)
    assert rows.shape == (6, 16) and set(rows.reshape(-1).tolist()) == set(range(88))
    assert launch.inputs["w1"].shape == (4, 6, 2, 16, 32) and launch.inputs["w2_scale"].shape == (4, 7, 1, 16, 2)


@triton.jit
def _gemv_probe(a_ptr, w_ptr, s_ptr, out_ptr, K, ROWS: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, F16: tl.constexpr):
    rows = tl.arange(0, ROWS).to(tl.int64)
    if F16:
        acc = quant_moe._mx_gemv_acc_f16(
            a_ptr, 0, w_ptr, s_ptr, rows, K, 0, tl.cdiv(K, BLOCK_SIZE_K), ROWS, BLOCK_SIZE_K
        )
    else:
        acc = quant_moe._mx_gemv_acc(a_ptr, 0, w_ptr, s_ptr, rows, K, 0, tl.cdiv(K, BLOCK_SIZE_K), ROWS, BLOCK_SIZE_K)
    tl.store(out_ptr + rows, acc)


@pytest.mark.parametrize("f16", [0, pytest.param(1, marks=GPU)])
@pytest.mark.parametrize("exponent", [0, 1, 100, 127, 128, 129, 200, 254])
def test_gemv_scales_across_the_e8m0_range(exponent, f16, device):
    """_mx_gemv_acc applies a group's scale as two powers of two so that every
    E8M0 byte is exact (and pre-scales the activations by 2^64 so that the
    products stay normal). The scales are set to one exponent, fp32
    activations sized against it keep the products finite, and the result must
    match the dequantised weights' product in float64: 0 and 254 are the
    ends of the range, 127 is 1.0, 128 and above take the second factor. K =
    80 ends in a partly padded group and a masked one. The packed f16 version
    (_mx_gemv_acc_f16, GPU only) rescales the activations per group instead
    and rounds them and its sums to f16: the same, to f16's precision."""
    gen = torch.Generator().manual_seed(exponent)
    rows, K = 16, 80
    packed, scales = quant.quantize_mxfp4(torch.randn(rows, K, generator=gen))
    scales.fill_(exponent)
    a = torch.randn(K, generator=gen) * 2.0 ** max(-60, min(60, 127 - exponent))
    out = torch.empty(rows, dtype=torch.float32)
    packed, scales, a, out = (t.to(device) for t in (packed, scales, a, out))
    # One expert, one tile of every row, laid out as GEMV reads it.
    tiled, tiled_scales = quant_moe.gemv_tile_major(packed[None], scales[None], torch.arange(rows)[None], 64)
    _gemv_probe[(1,)](a, tiled, tiled_scales, out, K, ROWS=rows, BLOCK_SIZE_K=64, F16=f16)
    # The codes' values (scale 2^0) in float64, then the scale: 6 x 2^127 is not an fp32.
    codes = quant.dequantize_mxfp4(packed, torch.full_like(scales, 127), K).double()
    want = (codes * 2.0 ** (exponent - 127)) @ a.double()
    assert torch.isfinite(want).all() and want.abs().max() > 0
    # f16 keeps 11 bits: its error is within a few of its ulps of the row's largest result.
    rtol, atol = (2e-3, 2e-3) if f16 else (1e-5, 1e-6)
    torch.testing.assert_close(out.double(), want, rtol=rtol, atol=want.abs().max().item() * atol)


def test_gemv_refuses_what_it_cannot_run(monkeypatch):
    m = FusedMoE(shape(MXFP4))
    with pytest.raises(ValueError, match="BLOCK_SIZE_M must be 1"):
        quant_moe.make_quant_plan(m, dict(GEMV_CFG, BLOCK_SIZE_M=16))
    for key in ("DOT_SCALED", "SWAP_AB", "MX_PTX"):
        with pytest.raises(ValueError, match=f"{key} must be 0"):
            quant_moe.make_quant_plan(m, dict(GEMV_CFG, **{key: 1}))
    with pytest.raises(ValueError, match="MXFP4 weights only"):
        quant_moe.make_quant_plan(FusedMoE(shape(FP8_TENSOR)), GEMV_CFG)
    with pytest.raises(ValueError, match="GEMV must be 0, 1 or 2"):
        quant_moe.make_quant_plan(m, dict(GEMV_CFG, GEMV=3))
    # GEMV=2 on a GPU below compute capability 9.0 (as the plan sees it: not interpreting, no sm_90).
    with monkeypatch.context() as patch:
        patch.setattr(quant_moe, "interpreting", lambda: False)
        patch.setattr(quant_moe, "pdl_supported", lambda: False)
        with pytest.raises(ValueError, match="use GEMV=1 on this GPU"):
            quant_moe.make_quant_plan(m, dict(GEMV_CFG, GEMV=2))
    for gemv in (1, 2):
        with pytest.raises(ValueError, match=f"GEMV={gemv} computes one token a block"):
            quant_moe.make_quant_plan(m, dict(GEMV_CFG, GEMV=gemv, BLOCK_SIZE_M=16))
    with pytest.raises(ValueError, match="vLLM's call structure"):
        quant_moe.make_quant_plan(m, GEMV_CFG, vllm_structure=True)


@pytest.mark.parametrize("fmt", [FP8_TENSOR, FP8_BLOCK], ids=["fp8-tensor", "fp8-block"])
@pytest.mark.parametrize("M", [1, 13])
def test_vllm_structure_fp8(fmt, M, device):
    p = FusedMoE(shape(fmt, M=M))
    inputs = p.inputs(1, device)
    launch = run("fused_moe_vllm", p, inputs)
    # GEMM 1 rounds gate and up to the activation dtype before the activation kernel, and the
    # re-quantised intermediate then differs from the reference's in a few fp8 roundings.
    check(launch.out, p.reference(inputs), "fp8")
    assert launch.kernels == [
        "moe_align_kernel",
        "moe_quant_act_kernel",
        "moe_gemm1_q_kernel",
        "moe_act_kernel",
        "moe_quant_act_kernel",
        "moe_gemm2_q_kernel",
        "moe_sum_kernel",
    ]
    assert not launch.plan.pdl and launch.plan.self_align == 0


def test_call_structures(device):
    x = FusedMoE(shape(FP8_TENSOR, M=1))
    assert run("fused_moe", x, x.inputs(0, device)).kernels == [
        "moe_quant_act_kernel",
        "moe_gemm1_q_kernel",
        "moe_quant_act_kernel",
        "moe_gemm2_q_kernel",
        "moe_sum_kernel",
    ]
    m = FusedMoE(shape(MXFP4, M=1))
    assert run("fused_moe", m, m.inputs(0, device)).kernels == [
        "moe_gemm1_q_kernel",
        "moe_gemm2_q_kernel",
        "moe_sum_kernel",
    ]
    m = FusedMoE(shape(MXFP4, M=40))
    assert run("fused_moe", m, m.inputs(0, device)).kernels == [
        "moe_align_kernel",
        "moe_gemm1_q_kernel",
        "moe_gemm2_q_kernel",
        "moe_sum_kernel",
    ]


@pytest.mark.parametrize("pdl", [True, False])
def test_dependent_launches_wait_for_their_predecessor(pdl):
    """Every kernel after the first waits for its predecessor before letting its
    successor start, so a kernel's completion implies every earlier one's
    (GEMM 2 reads the alignment before its own wait)."""
    p = FusedMoE(shape(FP8_TENSOR, M=40))
    plan = quant_moe.make_quant_plan(p, CFG, pdl=pdl)
    specs = quant_moe._launch_specs(plan, quant_moe._stand_in_buffers(plan))
    names = [getattr(k, "fn", k).__name__ for k, _, _, _ in specs]
    assert names == [
        "moe_align_kernel",
        "moe_quant_act_kernel",
        "moe_gemm1_q_kernel",
        "moe_quant_act_kernel",
        "moe_gemm2_q_kernel",
        "moe_sum_kernel",
    ]
    for i, (_, _, _, kw) in enumerate(specs):
        assert kw.get("launch_pdl", False) == (pdl and i > 0)
        if "PDL_WAIT" in kw:
            assert kw["PDL_WAIT"] == (pdl and i > 0) and kw["PDL_LAUNCH"] == pdl
    with pytest.raises(ValueError, match="plainly"):
        quant_moe.make_quant_plan(p, CFG, vllm_structure=True, pdl=True)


@pytest.mark.parametrize("group", [0, 32])
def test_activation_quantisation_kernel_matches_torch(group, device):
    """The kernel's scales and fp8 values are the reference's, bit for bit. On
    a GPU also a million fp16 values, where Triton's approximate fp32
    division (the kernel divides with div_rn) put 11 on the other fp8
    neighbour (H100, 2026-11-25)."""
    x = torch.randn(6, 200, device=device) * torch.tensor([1.0, 30.0, 1e-3, 0.0, 5.0, 0.2], device=device)[:, None]
    cases = [x.half()]
    if not INTERPRETED:
        gen = torch.Generator(device=device).manual_seed(0)
        cases.append(
            (
                torch.randn(256, 4096, device=device, generator=gen)
                * torch.rand(256, 1, device=device, generator=gen)
                * 8
            ).half()
        )
    for x in cases:
        rows, cols = x.shape
        q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device=device)
        s = torch.empty(rows, quant.cdiv(cols, group) if group else 1, dtype=torch.float32, device=device)
        for round_f32 in [True] if INTERPRETED else [True, False]:
            quant_moe.moe_quant_act_kernel[(rows,)](
                x,
                q,
                s,
                cols,
                cols,
                GROUP=group,
                BLOCK=64 if group else 128,
                PDL_WAIT=False,
                PDL_LAUNCH=False,
                ROUND_F32=round_f32,
            )
            rq, rs = quant.quantize_act_fp8(x, group)
            assert torch.equal(s.view(rs.shape), rs)
            differ = int((q.float() != rq.float()).sum())
            assert differ == 0, f"{differ} of {x.numel()} fp8 values differ from the reference"


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, quant_moe._round_e4m3(x).to(y_ptr.dtype.element_ty), mask=offs < n)


def test_round_e4m3_is_torchs_rounding(device):
    # Every binade from the subnormals up, ties included (232 lies halfway between 224 and 240).
    x = torch.cat(
        [
            torch.linspace(-448, 448, 20001),
            torch.randn(4000) * 1e-2,
            torch.randn(4000) * 1e-3,
            torch.tensor([0.0, 232.0, -232.0, 2.0**-10, 3 * 2.0**-11, 127.9, -127.9]),
        ]
    ).to(device)
    y = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    _round_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    assert torch.equal(y.float(), x.to(torch.float8_e4m3fn).float())


@triton.jit
def _halves_kernel(p_ptr, s_ptr, lo_ptr, hi_ptr, BK: tl.constexpr, BN: tl.constexpr):
    h = tl.arange(0, BK // 2)
    n = tl.arange(0, BN)
    packed = tl.load(p_ptr + n[None, :] * (BK // 2) + h[:, None])
    scales = tl.load(s_ptr + n[:, None] * (BK // 32) + tl.arange(0, BK // 32)[None, :])
    lo, hi = quant_moe._mx_halves(packed, scales, tl.float32, BK, BN)
    tl.store(lo_ptr + h[:, None] * BN + n[None, :], lo)
    tl.store(hi_ptr + h[:, None] * BN + n[None, :], hi)


@pytest.mark.parametrize("scale_range", [(0, 128), (100, 200)], ids=["one-multiply", "two-multiplies"])
def test_mxfp4_dequantisation_is_exact(scale_range, device):
    """Every code at every scale, both ways (a tile whose scales are all <= 128
    takes one multiply; any larger scale, two): the values tunelab.quant's
    dequantisation gives, bit for bit."""
    BK, BN = 64, 16
    codes = torch.arange(BN * BK, device=device).view(BN, BK) % 16
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).contiguous()
    lo_e, hi_e = scale_range
    scales = torch.randint(lo_e, hi_e + 1, (BN, BK // 32), device=device, dtype=torch.int32).to(torch.uint8)
    scales[0, 0], scales[1, 1] = lo_e, hi_e
    lo = torch.empty(BK // 2, BN, device=device)
    hi = torch.empty(BK // 2, BN, device=device)
    _halves_kernel[(1,)](packed, scales, lo, hi, BK=BK, BN=BN)
    want = quant.dequantize_mxfp4(packed, scales, BK)  # [BN, BK]; scale 0 gives subnormal products, still exact
    assert torch.equal(lo, want[:, 0::2].T) and torch.equal(hi, want[:, 1::2].T)


def _bits_to(bits: int, dtype) -> float:
    """The value of a 16-bit pattern as `dtype` (bf16 or f16), in float64."""
    return torch.tensor([bits & 0xFFFF], dtype=torch.int32).to(torch.int16).view(dtype).double().item()


def _to_bits(x: float, dtype) -> int:
    """`x` rounded to nearest in `dtype` (bf16 or f16), as its 16-bit pattern."""
    return torch.tensor([x], dtype=torch.float64).to(dtype).view(torch.int16).item() & 0xFFFF


def _f32_bits(x: float) -> int:
    return torch.tensor([x], dtype=torch.float32).view(torch.int32).item() & 0xFFFFFFFF


def _f32(bits: int) -> float:
    return torch.tensor([bits & 0xFFFFFFFF], dtype=torch.int64).to(torch.int32).view(torch.float32).double().item()


def _e4m3(byte: int) -> float:
    """The value of an E4M3 byte (no NaN is ever built here)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 15, byte & 7
    return sign * (man / 8 * 2.0**-6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))


def _run_ptx(asm: str, regs: dict) -> dict:
    """Run MX_PTX's and GEMV=2's inline PTX on the CPU, instruction by
    instruction, on registers holding bit patterns ($n and named; .f32 ones
    as fp32 bits, .b16 ones in the low 16 bits). Packed half-precision
    arithmetic is computed exactly in float64 and rounded once to nearest,
    as `.rn` does."""

    def val(tok):
        tok = tok.strip().rstrip(";")
        return int(tok, 0) if tok[0].isdigit() else regs[tok]

    def halves(op2, dtype, *xs):
        """Both 16-bit lanes of packed operands through op2, rounded to dtype."""
        return sum(_to_bits(op2(*[_bits_to(x >> s, dtype) for x in xs]), dtype) << s for s in (0, 16))

    for line in asm.replace(";", ";\n").splitlines():
        line = line.strip()
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        if op == "mov.b32" and args.startswith("{"):  # unpack: {low, high}, source
            lanes, source = args.rstrip(";").split("}")
            low, high = (a.strip() for a in lanes.lstrip("{").split(","))
            word = val(source.strip().lstrip(","))
            regs[low], regs[high] = word & 0xFFFF, word >> 16
            continue
        d, *src = [a.strip() for a in args.rstrip(";").split(",")]
        x = [val(a) for a in src]
        if op == "prmt.b32":
            pool = x[0] | (x[1] << 32)
            out = 0
            for i in range(4):
                out |= ((pool >> (8 * ((x[2] >> (4 * i)) & 7))) & 0xFF) << (8 * i)
        elif op == "shl.b32":
            out = (x[0] << x[1]) & 0xFFFFFFFF
        elif op == "shr.b32":
            out = x[0] >> x[1]
        elif op == "and.b32":
            out = x[0] & x[1]
        elif op == "or.b32":
            out = x[0] | x[1]
        elif op == "mul.rn.bf16x2":
            out = halves(lambda a, b: a * b, torch.bfloat16, x[0], x[1])
        elif op == "mul.rn.f16x2":
            out = halves(lambda a, b: a * b, torch.float16, x[0], x[1])
        elif op == "fma.rn.f16x2":
            out = halves(lambda a, b, c: a * b + c, torch.float16, x[0], x[1], x[2])
        elif op == "cvt.rn.f16x2.e4m3x2":  # the low byte to the low lane
            out = _to_bits(_e4m3(x[0] & 0xFF), torch.float16) | _to_bits(_e4m3(x[0] >> 8), torch.float16) << 16
        elif op == "cvt.f32.f16":
            out = _f32_bits(_bits_to(x[0], torch.float16))
        elif op == "add.f32":
            out = _f32_bits(_f32(x[0]) + _f32(x[1]))  # fp32 addends: exact in float64 here, then rounded once
        else:
            raise AssertionError(f"an instruction the emulator does not know: {line}")
        regs[d] = out
    return regs


@pytest.mark.parametrize("two", [False, True], ids=["one-multiply", "two-multiplies"])
def test_mx_ptx_dequantisation_is_exact(two):
    """MX_PTX's PTX, run instruction by instruction on the CPU: every byte (so
    every pair of codes) at scales around its one-multiply limit gives
    tunelab.quant's dequantised values, bit for bit, for both nibbles of each
    of the four bytes in a register."""
    asm = quant_moe._ptx(two)
    scales = [0, 1, 100, 127, 128] + ([129, 150, 200] if two else [])

    def factor(bits_e):  # the bf16 factors the kernel passes for scale e (_mx_halves_ptx)
        if not two:
            return [(bits_e + 126) << 7]
        return [(min(bits_e, 128) + 126) << 7, (max(bits_e, 128) - 1) << 7]

    for e in scales:
        for start in range(0, 256, 4):
            four = list(range(start, start + 4))
            es = [e, e, max(e - 1, 0), e]  # a different scale for one element of the pack
            regs = {"$4": sum(b << (8 * j) for j, b in enumerate(four))}
            fs = [factor(x) for x in es]
            for k in range(len(fs[0])):
                regs[f"${5 + 2 * k}"] = fs[0][k] | (fs[1][k] << 16)
                regs[f"${6 + 2 * k}"] = fs[2][k] | (fs[3][k] << 16)
            regs = _run_ptx(asm, regs)
            for j in range(4):
                row = torch.zeros(1, 16, dtype=torch.uint8)  # one scale group, the byte first
                row[0, 0] = four[j]
                want = quant.dequantize_mxfp4(row, torch.tensor([[es[j]]], dtype=torch.uint8), 2)[0]
                out_lo, out_hi = regs[f"${j // 2}"], regs[f"${2 + j // 2}"]
                shift = 16 * (j % 2)
                got = [
                    torch.tensor([(r >> shift) & 0xFFFF], dtype=torch.int32)
                    .to(torch.int16)
                    .view(torch.bfloat16)
                    .float()
                    .item()
                    for r in (out_lo, out_hi)
                ]
                assert got == [want[0].item(), want[1].item()], (e, four[j], got, want)


def test_gemv_f16_words_ptx_decodes_every_code_at_every_position():
    """GEMV=2's PTX (_gemv_f16_words_ptx), run instruction by instruction on
    the CPU: with one activation 1.0 and every other 0, the result is the one
    code's E2M1 value x 2^-6 (the E4M3 byte's value), exactly, for every code
    at every position p of either word, which also checks the pairing of
    codes with activation pairs ($3-$6, $7-$10: (p0, p2), (p1, p3), (p4, p6),
    (p5, p7) in the low and high lanes)."""
    asm = quant_moe._gemv_f16_words_ptx()
    one = _to_bits(1.0, torch.float16)
    pair_of = {0: (0, 0), 2: (0, 16), 1: (1, 0), 3: (1, 16), 4: (2, 0), 6: (2, 16), 5: (3, 0), 7: (3, 16)}
    values = list(quant.E2M1_MAGNITUDES) + [-v for v in quant.E2M1_MAGNITUDES]  # code 8 + m is -code m
    for word in (0, 1):
        for p in range(8):
            for code in range(16):
                # The other codes of both words are 7 (6.0): any leak would show.
                words = [0x77777777, 0x77777777]
                words[word] = (words[word] & ~(0xF << (4 * p))) | (code << (4 * p))
                regs = {"$1": words[0], "$2": words[1]}
                for k in range(3, 11):
                    regs[f"${k}"] = 0
                index, shift = pair_of[p]
                regs[f"${3 + 4 * word + index}"] = one << shift
                got = _f32(_run_ptx(asm, regs)["$0"])
                assert got == float(values[code]) * 2.0**-6, (word, p, code, got)


def test_gemv_f16_words_ptx_sums_sixteen_products():
    """The same PTX with random codes and activation pairs: the sixteen
    products summed in f16 lanes (eight each, then added in fp32) agree with
    the float64 sum to f16's precision."""
    gen = torch.Generator().manual_seed(0)
    asm = quant_moe._gemv_f16_words_ptx()
    e2m1 = list(quant.E2M1_MAGNITUDES) + [-v for v in quant.E2M1_MAGNITUDES]
    pairs = [(0, 2), (1, 3), (4, 6), (5, 7)]
    for _ in range(200):
        codes = torch.randint(0, 16, (2, 8), generator=gen).tolist()
        acts = (torch.randn(2, 8, generator=gen) * 2.0**12).to(torch.float16).double().tolist()
        regs = {f"${1 + w}": sum(c << (4 * p) for p, c in enumerate(codes[w])) for w in range(2)}
        for w in range(2):
            for i, (lo, hi) in enumerate(pairs):
                regs[f"${3 + 4 * w + i}"] = (
                    _to_bits(acts[w][lo], torch.float16) | _to_bits(acts[w][hi], torch.float16) << 16
                )
        got = _f32(_run_ptx(asm, regs)["$0"])
        terms = [e2m1[codes[w][p]] * 2.0**-6 * acts[w][p] for w in range(2) for p in range(8)]
        assert abs(got - sum(terms)) <= 2.0**-9 * sum(abs(t) for t in terms) + 1e-6, (codes, acts, got)


def test_gpt_oss_interleaved_bias_with_block_scales(align, device):
    """Interleaved gate/up rows and biases with fp8 block scales: each w1 row's
    scale is its own block row's, wherever the tile takes the row from."""
    p = FusedMoE(shape(FP8_BLOCK, M=6, activation="swiglu_oai", block_shape=[16, 64]))
    assert p.interleaved and p.bias
    inputs = p.inputs(2, device)
    check(run("fused_moe", p, inputs).out, p.reference(inputs), "mxfp4")


def test_quantised_buffers_and_scales(device):
    p = FusedMoE(shape(FP8_BLOCK, M=3))
    inputs = p.inputs(0, device)
    launch = run("fused_moe", p, inputs)
    rq, rs = quant.quantize_act_fp8(inputs["x"], 64)
    assert torch.equal(launch.xs, rs) and torch.equal(launch.xq.float(), rq.float())
    assert launch.xs.shape == (3, 2) and launch.inters.shape == (6, 1)


def test_inputs_layout_and_shared_weights(device):
    p = FusedMoE(shape(MXFP4, M=3, N=40))
    a = p.inputs(0, device)
    assert a["w1"].dtype == torch.uint8 and a["w1"].shape == (8, 80, 48) and a["w1_scale"].shape == (8, 80, 3)
    assert a["w2"].shape == (8, 96, 32) and a["w2_scale"].shape == (8, 96, 2)  # N=40 padded to 64
    # The CUDA kernel's copies: the same codes in pair order.
    assert torch.equal(a["w1_pairs"], quant.to_pair_order(a["w1"])) and a["w2_pairs"].shape == a["w2"].shape
    assert a["x"].dtype == torch.float16 and a["b1"].dtype == torch.float16
    b = FusedMoE(shape(MXFP4, M=9, N=40)).inputs(0, device)
    assert b["w1"] is a["w1"]  # another M, the same weights: built once
    c = FusedMoE(shape(MXFP4, M=3, N=40)).inputs(1, device)
    assert not torch.equal(c["w1"], a["w1"])
    f = FusedMoE(shape(FP8_TENSOR)).inputs(0, device)
    assert f["w1"].dtype == torch.float8_e4m3fn and f["w1_scale"].shape == (8,) and "b1" not in f
    f = FusedMoE(shape(FP8_BLOCK)).inputs(0, device)
    assert f["w1_scale"].shape == (8, 3, 2) and f["w2_scale"].shape == (8, 3, 1)


def test_weight_cache_keeps_the_most_recent_within_its_limit(device, monkeypatch):
    from tunelab.problems import moe

    cache = moe._WeightCache()
    monkeypatch.setattr(moe, "_WEIGHTS", cache)
    shapes = [FusedMoE(shape(FP8_TENSOR, N=n)) for n in (16, 32, 48)]
    sizes = [cache.nbytes(p._build_weights(0, device)) for p in shapes]
    monkeypatch.setattr(cache, "limit_bytes", lambda _: sizes[1] + sizes[2])
    first = shapes[0].inputs(0, device)["w1"]
    assert shapes[0].inputs(0, device)["w1"] is first  # kept
    shapes[1].inputs(0, device)
    shapes[2].inputs(0, device)  # N=16's weights go first to make room
    assert len(cache.entries) == 2 and shapes[0].inputs(0, device)["w1"] is not first
    assert torch.equal(shapes[0].inputs(0, device)["w1"].float(), first.float())  # rebuilt the same


def test_reference_uses_the_dequantised_weights(device):
    p = FusedMoE(shape(MXFP4, M=2, E=2, topk=1, bias=False))
    inputs = p.inputs(0, device)
    w1 = quant.dequantize_mxfp4(inputs["w1"], inputs["w1_scale"], p.K)
    w2 = quant.dequantize_mxfp4(inputs["w2"], inputs["w2_scale"], p.N)
    e = inputs["topk_ids"].long()[:, 0]
    h = torch.einsum("mk,mnk->mn", inputs["x"].float(), w1[e])
    y = torch.einsum("mn,mkn->mk", p.activate(h).half().float(), w2[e]) * inputs["topk_weights"].float()
    assert torch.allclose(p.reference(inputs).float(), y, atol=2e-3, rtol=2e-3)


def test_bandwidth_bounds_count_packed_bytes_and_scales():
    gpt = {"M": 1, "E": 128, "topk": 4, "K": 2880, "N": 2880}
    weights = 3 * 2880 * 2880
    mx = FusedMoE(dict(gpt, dtype="mxfp4", activation="swiglu_oai"))
    biases = (2 * 2880 + 2880) * 2
    assert mx.expert_bytes() == weights * (0.5 + 1 / 32) + biases
    bf = FusedMoE(dict(gpt, dtype="bf16", activation="swiglu_oai"))
    assert bf.expert_bytes() == weights * 2 + biases
    f8 = FusedMoE(dict(gpt, dtype="fp8"))
    assert f8.expert_bytes() == weights + 2 * 4
    blk = FusedMoE(dict(gpt, dtype="fp8", weight_quant="block", block_shape=[128, 128]))
    assert blk.expert_bytes() == weights + (45 * 23 + 23 * 23) * 4  # 2N=5760 -> 45 rows of blocks; 2880 -> 23
    # M=1 reads 4 experts: 52.9 MB of MXFP4 (an 11.0 us bound at 4.8 TB/s) against 199 MB of bf16.
    inputs = {"topk_ids": torch.tensor([[3, 9, 17, 100]], dtype=torch.int32)}
    assert mx.bytes_for(inputs) == 4 * mx.expert_bytes() + 2 * 2880 * 2
    assert 10.9 < mx.bytes_for(inputs) / 4.8e12 * 1e6 < 11.1


def test_flops_do_not_depend_on_the_format():
    gpt = {"M": 8, "E": 32, "topk": 4, "K": 2880, "N": 720}
    assert FusedMoE(dict(gpt, dtype="fp8")).flops() == FusedMoE(dict(gpt, dtype="bf16")).flops()


def test_vllm_default_config_for_block_fp8():
    # vLLM 0.33's rule (test_vllm_mirror.py has the rest of it).
    assert vllm_default_config(4, 8, (128, 128)) == {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 4,
    }
    assert vllm_default_config(4, 8) == vllm_default_config(4, 8, None)


def test_methods_that_cannot_run_quantised_weights_say_why():
    for fmt in (FP8_TENSOR, MXFP4):
        p = FusedMoE(shape(fmt))
        methods = p.methods()
        assert "bf16/fp16/fp32" in methods["fused_moe_persistent"].unavailable(p)
        assert "torch has no MoE" in methods["torch"].unavailable(p)
        assert methods["fused_moe"].__class__.__dict__.get("unavailable") is None
    p = FusedMoE(shape(MXFP4))
    assert "do not read fused-MoE JSON" in p.methods()["fused_moe_vllm"].unavailable(p)
    assert p.methods()["fused_moe_vllm"].unavailable(FusedMoE(shape(FP8_TENSOR))) is None


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"dtype": "fp8", "weight_quant": "block"}, "needs block_shape"),
        ({"dtype": "fp8", "weight_quant": "block", "block_shape": [128, 96]}, "power of two"),
        ({"dtype": "fp8", "weight_quant": "per_tensor", "block_shape": [128, 128]}, "not per_tensor"),
        ({"dtype": "fp8", "weight_quant": "per_channel"}, "weight_quant must be one of"),
        ({"dtype": "mxfp4", "act_dtype": "fp32"}, "act_dtype of mxfp4"),
        ({"dtype": "mxfp4", "weight_quant": "block"}, "their own scales"),
        ({"dtype": "bf16", "act_dtype": "fp16"}, "computes in bf16"),
        ({"dtype": "int4"}, "unknown moe dtype"),
    ],
)
def test_bad_quantised_shapes(fields, message):
    with pytest.raises(ValueError, match=message):
        FusedMoE(dict({"M": 1, "E": 8, "topk": 2, "K": 64, "N": 32}, **fields))


def test_bad_quantised_configs(device):
    blk = FusedMoE(shape(FP8_BLOCK))
    with pytest.raises(ValueError, match="must divide the weights' block_k"):
        quant_moe.make_quant_plan(blk, dict(CFG, BLOCK_SIZE_K=128))
    with pytest.raises(ValueError, match="mxfp4 weights only"):
        blk.methods()["fused_moe"].bind(blk, blk.inputs(0, device), dict(CFG, DOT_SCALED=1))
    mx = FusedMoE(shape(MXFP4))
    with pytest.raises(ValueError, match=">= 32 for MXFP4"):
        quant_moe.make_quant_plan(mx, dict(CFG, BLOCK_SIZE_K=16))
    with pytest.raises(ValueError, match="DOT_SCALED must be 0 or 1"):
        quant_moe.make_quant_plan(mx, dict(CFG, DOT_SCALED=2))
    with pytest.raises(ValueError, match=r"power of two >= 16 \(tl.dot"):
        quant_moe.make_quant_plan(mx, dict(CFG, BLOCK_SIZE_M=8))
    with pytest.raises(ValueError, match="DOT_SCALED=0 only"):
        quant_moe.make_quant_plan(mx, dict(CFG, MX_PTX=1, DOT_SCALED=1))
    with pytest.raises(ValueError, match="mxfp4 weights only"):
        blk.methods()["fused_moe"].bind(blk, blk.inputs(0, device), dict(CFG, MX_PTX=1))
    with pytest.raises(ValueError, match="SWAP_AB must be 0 or 1"):
        quant_moe.make_quant_plan(mx, dict(CFG, SWAP_AB=3))
    with pytest.raises(ValueError, match="vLLM's call structure"):
        quant_moe.make_quant_plan(blk, dict(CFG, SWAP_AB=1), vllm_structure=True)
    with pytest.raises(ValueError, match="SPLIT_K must be between 1 and 16"):
        quant_moe.make_quant_plan(mx, dict(CFG, SPLIT_K=0))
    with pytest.raises(ValueError, match="SPLIT_K must be between 1 and 16"):
        quant_moe.make_quant_plan(mx, dict(CFG, SPLIT_K=17))
    big = FusedMoE(
        {
            "M": 16384,
            "E": 128,
            "topk": 4,
            "K": 2880,
            "N": 2880,
            "dtype": "mxfp4",
            "act_dtype": "bf16",
            "activation": "swiglu_oai",
        }
    )
    with pytest.raises(ValueError, match=r"SPLIT_K=16 at M=16384 needs 33\.8 GiB of fp32 partials"):
        quant_moe.make_quant_plan(big, dict(CFG, SPLIT_K=16))
    with pytest.raises(ValueError, match="SPLIT_K is tunelab's own"):
        quant_moe.make_quant_plan(blk, dict(CFG, SPLIT_K=2), vllm_structure=True)
    plain = FusedMoE(shape({"dtype": "fp16"}))
    with pytest.raises(ValueError, match="SWAP_AB applies to quantised weights .* only"):
        plain.methods()["fused_moe"].bind(plain, plain.inputs(0, device), dict(CFG, SWAP_AB=1))
    with pytest.raises(ValueError, match="SPLIT_K applies to quantised weights .* only"):
        plain.methods()["fused_moe"].bind(plain, plain.inputs(0, device), dict(CFG, SPLIT_K=4))


# ---------------------------------------------------------------------------
# GPU: bf16 activations and gpt-oss's hidden size (the interpreter would take minutes)


GPT_OSS_CFGS = [
    {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4},
    {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16, "num_warps": 8, "num_stages": 3},
]


@GPU
@pytest.mark.parametrize("cfg", GPT_OSS_CFGS, ids=["small-tiles", "large-tiles"])
@pytest.mark.parametrize("M", [1, 8, 256])
@pytest.mark.parametrize("N", [2880, 360])
@pytest.mark.parametrize("method", ["fused_moe", "fused_moe_vllm"])
@pytest.mark.parametrize("swap", [0, 1], ids=["", "swapped"])
@pytest.mark.parametrize("fmt", ["fp8-tensor", "fp8-block", "mxfp4", "mxfp4-dot-scaled", "mxfp4-ptx"])
def test_gpu_gpt_oss_shapes(fmt, swap, method, N, M, cfg, device):
    fields = {
        "fp8-tensor": {"dtype": "fp8"},
        "fp8-block": {"dtype": "fp8", "weight_quant": "block", "block_shape": [128, 128]},
        "mxfp4": {"dtype": "mxfp4", "activation": "swiglu_oai"},
        "mxfp4-dot-scaled": {"dtype": "mxfp4", "activation": "swiglu_oai"},
        "mxfp4-ptx": {"dtype": "mxfp4", "activation": "swiglu_oai"},
    }[fmt]
    p = FusedMoE({"M": M, "E": 32, "topk": 4, "K": 2880, "N": N, "act_dtype": "bf16", **fields})
    reason = getattr(p.methods()[method], "unavailable", lambda _: None)(p)
    if reason:
        pytest.skip(reason)
    config = dict(cfg, DOT_SCALED=1) if fmt == "mxfp4-dot-scaled" else dict(cfg)
    if fmt == "mxfp4-ptx":
        config["MX_PTX"] = 1
    if swap:
        if method == "fused_moe_vllm":
            pytest.skip("SWAP_AB is tunelab's call only")
        config["SWAP_AB"] = 1
    if fmt == "fp8-block" and config["BLOCK_SIZE_K"] > 128:
        pytest.skip("BLOCK_SIZE_K must divide block_k")
    inputs = p.inputs(0, device)
    launch = run(method, p, inputs, config)
    # bf16 activations: gptoss-fp8.yaml's and gptoss-mxfp4.yaml's tolerances.
    check(
        launch.out,
        p.reference(inputs),
        "fp8" if fmt.startswith("fp8") else "mxfp4",
        **({"max_mismatch": 0.005} if fmt.startswith("mxfp4") else {}),
    )


@GPU
@pytest.mark.parametrize("split_k", [2, 4, 8])
@pytest.mark.parametrize("fmt", ["fp8-tensor", "mxfp4-ptx-swapped", "mxfp4-dot-scaled"])
@pytest.mark.parametrize("M", [1, 4, 64])
def test_gpu_split_k(fmt, M, split_k, device):
    """SPLIT_K on the GPU, where the splits of a tile really run at once: the
    output passes the reference and repeats bit for bit over 20 calls (the
    partials are summed in split order whichever finished last; a lost count
    or a stale partial would show as a NaN, a mismatch or a changed bit)."""
    fields = {"dtype": "fp8"} if fmt == "fp8-tensor" else {"dtype": "mxfp4", "activation": "swiglu_oai"}
    p = FusedMoE({"M": M, "E": 128, "topk": 4, "K": 2880, "N": 2880, "act_dtype": "bf16", **fields})
    config = dict(GPT_OSS_CFGS[0], SPLIT_K=split_k)
    extra = {"mxfp4-ptx-swapped": {"MX_PTX": 1, "SWAP_AB": 1}, "mxfp4-dot-scaled": {"DOT_SCALED": 1}}
    config.update(extra.get(fmt, {}))
    inputs = p.inputs(0, device)
    launch = run("fused_moe", p, inputs, config)
    first = launch.out.clone()
    check(
        first,
        p.reference(inputs),
        "fp8" if fmt.startswith("fp8") else "mxfp4",
        **({"max_mismatch": 0.005} if fmt.startswith("mxfp4") else {}),
    )
    for _ in range(20):
        launch.out.fill_(float("nan"))
        launch.part1.fill_(float("nan"))
        launch.part2.fill_(float("nan"))
        assert torch.equal(launch(), first)
    torch.cuda.synchronize()
    assert launch.count1.eq(0).all() and launch.count2.eq(0).all()


@GPU
@pytest.mark.parametrize("gemv", [1, 2])
@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("bn,bk,warps", [(64, 256, 4), (128, 512, 8)])
@pytest.mark.parametrize("N", [2880, 360])
@pytest.mark.parametrize("M", [1, 2, 8])
def test_gpu_gemv(M, N, bn, bk, warps, split_k, gemv, device):
    """GEMV=1 and 2 at gpt-oss's shapes with bf16 activations: K = 2880 is 90 scale
    groups (a partly masked last K step at BLOCK_SIZE_K 256 and 512), N = 360
    ends w2's rows in a padded group; M = 8 routes 32 slots, several tokens to
    one expert. Passes the reference and repeats bit for bit."""
    p = FusedMoE(
        {
            "M": M,
            "E": 128,
            "topk": 4,
            "K": 2880,
            "N": N,
            "act_dtype": "bf16",
            "dtype": "mxfp4",
            "activation": "swiglu_oai",
        }
    )
    config = {
        "BLOCK_SIZE_M": 1,
        "BLOCK_SIZE_N": bn,
        "BLOCK_SIZE_K": bk,
        "GROUP_SIZE_M": 1,
        "num_warps": warps,
        "num_stages": 1,
        "GEMV": gemv,
        "SPLIT_K": split_k,
    }
    inputs = p.inputs(0, device)
    launch = run("fused_moe", p, inputs, config)
    first = launch.out.clone()
    check(first, p.reference(inputs), "mxfp4", max_mismatch=0.005)
    for _ in range(5):
        launch.out.fill_(float("nan"))
        assert torch.equal(launch(), first)


@GPU
def test_gpu_direct_and_ordinary_launch_agree(device):
    for fields in ({"dtype": "fp8"}, {"dtype": "mxfp4", "activation": "swiglu_oai"}):
        p = FusedMoE({"M": 8, "E": 32, "topk": 4, "K": 2880, "N": 720, **fields})
        inputs = p.inputs(0, device)
        plan = quant_moe.make_quant_plan(p, GPT_OSS_CFGS[0])
        direct = quant_moe.QuantMoELaunch(plan, inputs, direct=True)
        ordinary = quant_moe.QuantMoELaunch(plan, inputs, direct=False)
        assert direct.direct and not ordinary.direct
        assert torch.equal(direct().clone(), ordinary())
