"""The fused-MoE problem: reference, Triton method, torch method, formulas.

Runs under Triton's interpreter without a GPU (conftest sets TRITON_INTERPRET);
shapes are tiny so the whole module stays fast on two cores. Never bf16 here:
the interpreter can get bf16 wrong.
"""

import math
import os

import torch

if not torch.cuda.is_available():  # before triton is imported (conftest does the same)
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tunelab.kernels.fused_moe import _self_aligned_block, align_sizes, moe_align_block_size  # noqa: E402
from tunelab.problems import resolve  # noqa: E402
from tunelab.problems.moe import FusedMoE, vllm_default_config  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 2, "num_warps": 4, "num_stages": 2}
TOL = {"fp16": dict(atol=1e-2, rtol=1e-2), "fp32": dict(atol=1e-4, rtol=1e-4)}


def shape(**kw):
    base = {"M": 13, "E": 8, "topk": 2, "K": 64, "N": 32, "dtype": "fp16"}
    base.update(kw)
    return base


def run_fused(problem, inputs, config=CFG, poison_buffers=False):
    launch = problem.methods()["fused_moe"].bind(problem, inputs, config)
    launch.out.fill_(float("nan"))  # the worker poisons the output before the check
    if poison_buffers:
        launch.inter.fill_(float("nan"))
        launch.out2.fill_(float("nan"))
        launch.sorted_ids.fill_(-7)
        launch.expert_ids.fill_(-7)
    launch()
    return launch


@pytest.fixture(params=["kernel", "self"])
def align(request, monkeypatch):
    """Both ways a call finds its blocks: the alignment kernel, or (the default
    for a few tokens) GEMMs that derive them from topk_ids."""
    from tunelab.kernels import fused_moe

    limit = 0 if request.param == "kernel" else fused_moe.SELF_ALIGN_LIMIT
    monkeypatch.setattr(fused_moe, "SELF_ALIGN_MAX_NUMEL", limit)
    return request.param


def assert_close(out, ref, dtype_name):
    assert not torch.isnan(out).any(), "output left partly unwritten (NaN poison survived)"
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype_name])


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("routing", ["random", "uniform"])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_moe_matches_reference(activation, routing, dtype, align, device):
    p = FusedMoE(shape(activation=activation, routing=routing, dtype=dtype))
    inputs = p.inputs(0, device)
    launch = run_fused(p, inputs, poison_buffers=True)
    assert launch.plan.self_align == (32 if align == "self" else 0)  # 13 tokens x 2 slots, padded to 32
    assert_close(launch.out, p.reference(inputs), dtype)


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_moe_decode_sizes(M, activation, device):
    p = FusedMoE(shape(M=M, activation=activation))
    inputs = p.inputs(1, device)
    assert_close(run_fused(p, inputs).out, p.reference(inputs), "fp16")


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fused_moe_tails(activation, align, device):
    # K and N not multiples of the tiles: masked K loop, partial last column
    # tiles, BLOCK_SIZE_N 16 (8 activated columns a tile), GROUP_SIZE_M > blocks.
    p = FusedMoE(shape(M=5, E=4, K=48, N=24, dtype="fp32", activation=activation))
    inputs = p.inputs(2, device)
    cfg = dict(CFG, BLOCK_SIZE_N=16, GROUP_SIZE_M=4)
    assert_close(run_fused(p, inputs, cfg).out, p.reference(inputs), "fp32")


def test_fused_moe_topk1_and_all_experts(align, device):
    p = FusedMoE(shape(M=6, E=2, topk=1, K=32, N=16))
    inputs = p.inputs(3, device)
    cfg = dict(CFG, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16)
    assert_close(run_fused(p, inputs, cfg).out, p.reference(inputs), "fp16")
    p = FusedMoE(shape(M=2, E=4, topk=4, K=32, N=16, dtype="fp32", routing="uniform"))
    inputs = p.inputs(3, device)
    assert_close(run_fused(p, inputs, cfg).out, p.reference(inputs), "fp32")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="direct launch is GPU-only")
def test_direct_and_ordinary_launch_agree(device):
    from tunelab.kernels.fused_moe import FusedMoELaunch, make_plan

    p = FusedMoE(shape(M=21, activation="swiglu_oai"))
    inputs = p.inputs(9, device)
    outs = []
    # Direct and JIT launches, with and without dependent launches, with and
    # without the alignment kernel.
    for self_align_max in (0, 64):
        for pdl in (False, True):
            plan = make_plan(p, CFG, self_align_max=self_align_max, pdl=pdl)
            for direct in (True, False):
                launch = FusedMoELaunch(plan, inputs, direct=direct)
                assert launch.direct == direct
                launch.out.fill_(float("nan"))
                launch()
                outs.append(launch.out.clone())
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=0, rtol=0)


def check_alignment(topk_ids, num_experts, bm, sorted_ids, expert_ids, num_post):
    ids = topk_ids.reshape(-1).long().cpu()
    numel = ids.numel()
    sorted_ids, expert_ids = sorted_ids.long().cpu(), expert_ids.long().cpu()
    total = int(num_post.reshape(-1)[0])
    max_blocks, max_padded = align_sizes(numel, num_experts, bm)
    assert sorted_ids.numel() == max_padded and expert_ids.numel() == max_blocks
    assert total % bm == 0 and numel <= total <= max_padded
    counts = torch.bincount(ids, minlength=num_experts)
    assert total == int(sum(math.ceil(c / bm) * bm for c in counts.tolist()))
    # Every slot exactly once, everything else (and everything past total) the sentinel.
    real = sorted_ids[sorted_ids != numel]
    assert sorted(real.tolist()) == list(range(numel))
    assert (sorted_ids[total:] == numel).all()
    nblocks = total // bm
    assert (expert_ids[nblocks:] == -1).all()
    used = expert_ids[:nblocks]
    assert (used[1:] >= used[:-1]).all(), "blocks are in expert order"
    for b in range(nblocks):
        block = sorted_ids[b * bm : (b + 1) * bm]
        slots = block[block != numel]
        assert slots.numel() > 0, "no block is padding only"
        assert (ids[slots] == expert_ids[b]).all(), "a block holds one expert's slots"
        # Padding sits at the end of an expert's run: only its last block has any.
        if b + 1 < nblocks and expert_ids[b + 1] == expert_ids[b]:
            assert slots.numel() == bm


@pytest.mark.parametrize("bm", [16, 32])
@pytest.mark.parametrize("M,E,topk", [(1, 8, 2), (3, 4, 2), (37, 8, 2), (100, 5, 3), (40, 64, 4)])
def test_alignment(M, E, topk, bm, device):
    gen = torch.Generator().manual_seed(M * 1000 + E)
    topk_ids = torch.stack([torch.randperm(E, generator=gen)[:topk] for _ in range(M)]).to(torch.int32)
    if M == 100:
        topk_ids[:, 0] = 1  # one hot expert, several full blocks
    topk_ids = topk_ids.to(device)
    check_alignment(topk_ids, E, bm, *moe_align_block_size(topk_ids, E, bm))


@triton.jit
def _self_align_probe(
    topk_ids_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    numel,
    num_experts,
    BLOCK_SIZE_M: tl.constexpr,
    NUMEL_PAD: tl.constexpr,
):
    pid = tl.program_id(0)
    slots, expert = _self_aligned_block(topk_ids_ptr, numel, num_experts, pid, BLOCK_SIZE_M, NUMEL_PAD)
    tl.store(sorted_ids_ptr + pid * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M), slots)
    tl.store(expert_ids_ptr + pid, expert)


@pytest.mark.parametrize("bm", [16, 64])
@pytest.mark.parametrize("M,E,topk", [(1, 8, 1), (1, 128, 4), (3, 4, 2), (16, 8, 4), (9, 64, 4), (5, 3, 3)])
def test_self_aligned_blocks_match_the_alignment_kernel(M, E, topk, bm, device):
    gen = torch.Generator().manual_seed(M * 1000 + E)
    topk_ids = torch.stack([torch.randperm(E, generator=gen)[:topk] for _ in range(M)]).to(torch.int32)
    if M == 16:
        topk_ids[:, 0] = 5  # one expert takes every token: full blocks and a padded one
    topk_ids = topk_ids.to(device)
    numel = M * topk
    max_blocks, max_padded = align_sizes(numel, E, bm)
    sorted_ids = torch.full((max_padded,), -7, dtype=torch.int32, device=device)
    expert_ids = torch.full((max_blocks,), -7, dtype=torch.int32, device=device)
    numel_pad = max(2, 1 << (numel - 1).bit_length())
    _self_align_probe[(max_blocks,)](topk_ids, sorted_ids, expert_ids, numel, E, BLOCK_SIZE_M=bm, NUMEL_PAD=numel_pad)
    num_post = torch.tensor([int((expert_ids >= 0).sum()) * bm])
    check_alignment(topk_ids, E, bm, sorted_ids, expert_ids, num_post)
    # The same layout as the alignment kernel: same expert per block, and each
    # expert's run holds the same slots (their order inside a run is free).
    k_sorted, k_experts, k_post = moe_align_block_size(topk_ids, E, bm)
    assert int(k_post[0]) == int(num_post[0])
    assert torch.equal(k_experts.cpu(), expert_ids.cpu())
    mine, theirs = sorted_ids.cpu(), k_sorted.cpu()
    for e in expert_ids.unique().tolist():
        if e >= 0:
            rows = (expert_ids.cpu() == e).repeat_interleave(bm)
            assert sorted(mine[rows].tolist()) == sorted(theirs[rows].tolist())
    # Stable: inside a run, slots are in increasing order (so both GEMMs agree).
    real = mine[mine != numel]
    for e in expert_ids.unique().tolist():
        if e >= 0:
            run = mine[(expert_ids.cpu() == e).repeat_interleave(bm)]
            run = run[run != numel]
            assert (run[1:] > run[:-1]).all()
    assert real.numel() == numel


@pytest.mark.parametrize("M", [1, 2, 40])
def test_dependent_launches_follow_an_earlier_kernel_of_the_call(M):
    """Where each kernel may start early, checked on the plan (no GPU needed):
    the call's first kernel is an ordinary launch (it follows the timer's event
    and the flush), every later one a dependent launch that waits in-kernel."""
    from tunelab.dtypes import int32, pointer, torch_dtype
    from tunelab.kernels.fused_moe import _launch_specs, make_plan

    p = FusedMoE(shape(M=M, E=8, topk=4, dtype="fp16"))
    names = [
        "x",
        "w1",
        "b1",
        "w2",
        "b2",
        "inter",
        "out2",
        "out",
        "topk_ids",
        "sorted_ids",
        "expert_ids",
        "num_post",
        "cursor",
        "topk_weights",
    ]
    bufs = {n: pointer(torch_dtype("fp16")) for n in names}
    for n in ("topk_ids", "sorted_ids", "expert_ids", "num_post", "cursor"):
        bufs[n] = pointer(int32())
    for pdl in (False, True):
        specs = _launch_specs(make_plan(p, CFG, pdl=pdl), bufs)
        kernels = [spec[0].fn.__name__ if hasattr(spec[0], "fn") else spec[0].__name__ for spec in specs]
        expected = ["moe_gemm1_kernel", "moe_gemm2_kernel", "moe_sum_kernel"]
        assert kernels == (expected if M * 4 <= 8 else ["moe_align_kernel"] + expected)
        assert "launch_pdl" not in specs[0][3]
        for _, _, _, kwargs in specs[1:]:
            assert kwargs.get("launch_pdl", False) == pdl
        assert all(kwargs["USE_PDL"] == pdl for _, _, _, kwargs in specs)


def test_alignment_inside_launch(device, monkeypatch):
    from tunelab.kernels import fused_moe

    monkeypatch.setattr(fused_moe, "SELF_ALIGN_MAX_NUMEL", 0)
    p = FusedMoE(shape(M=9, E=8, topk=2))
    inputs = p.inputs(4, device)
    launch = run_fused(p, inputs, poison_buffers=True)
    check_alignment(inputs["topk_ids"], p.E, CFG["BLOCK_SIZE_M"], launch.sorted_ids, launch.expert_ids, launch.num_post)
    assert launch.direct == (torch.device(device).type == "cuda")
    # A second call reuses every buffer (the alignment's cursors included) and
    # gives the same answer.
    first = launch.out.clone()
    launch.out.fill_(float("nan"))
    launch()
    torch.testing.assert_close(launch.out, first, atol=0, rtol=0)


def test_align_sizes_bounds():
    # M=1, topk=4: four blocks at most, whatever E and BLOCK_SIZE_M.
    assert align_sizes(4, 128, 16) == (4, 64)
    assert align_sizes(4, 128, 128) == (4, 512)
    # Large M: bounded by (numel + E * (BM - 1)) // BM.
    assert align_sizes(16384, 128, 64) == ((16384 + 128 * 63) // 64, (16384 + 128 * 63) // 64 * 64)


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_torch_method_matches_reference(activation, device):
    p = FusedMoE(shape(activation=activation))
    inputs = p.inputs(5, device)
    launch = p.methods()["torch"].bind(p, inputs, {})
    launch.out.fill_(float("nan"))
    launch()
    assert_close(launch.out, p.reference(inputs), "fp16")


def explicit_moe(inputs, M, topk, N, gate_rows, up_rows, act, bias):
    """Dense per-token evaluation with explicit gate/up row indices."""
    x, w1, w2 = inputs["x"].double(), inputs["w1"].double(), inputs["w2"].double()
    out = torch.zeros(M, x.shape[1], dtype=torch.float64)
    for t in range(M):
        for j in range(topk):
            e = int(inputs["topk_ids"][t, j])
            h = w1[e] @ x[t]
            if bias:
                h = h + inputs["b1"][e].double()
            a = act(h[gate_rows], h[up_rows])
            y = w2[e] @ a
            if bias:
                y = y + inputs["b2"][e].double()
            out[t] += float(inputs["topk_weights"][t, j]) * y
    return out


def swiglu(g, u):
    g = g.clamp(max=7.0)
    u = u.clamp(-7.0, 7.0)
    return (u + 1) * g * torch.sigmoid(1.702 * g)


def silu_mul(g, u):
    return torch.nn.functional.silu(g) * u


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_gate_up_convention(activation, device):
    N = 32
    p = FusedMoE(shape(M=4, N=N, dtype="fp32", activation=activation))
    inputs = p.inputs(6, "cpu")
    # Make the convention matter beyond noise: gate rows large (clamp active
    # for swiglu), up rows small and shifted.
    even, odd = torch.arange(0, 2 * N, 2), torch.arange(1, 2 * N, 2)
    first, second = torch.arange(N), torch.arange(N, 2 * N)
    gate_rows, up_rows = (even, odd) if activation == "swiglu_oai" else (first, second)
    inputs["w1"][:, gate_rows] *= 4.0
    inputs["w1"][:, up_rows] *= 0.25
    act = swiglu if activation == "swiglu_oai" else silu_mul
    right = explicit_moe(inputs, p.M, p.topk, N, gate_rows, up_rows, act, p.bias)
    swapped_layout = (first, second) if activation == "swiglu_oai" else (even, odd)
    wrong_layout = explicit_moe(inputs, p.M, p.topk, N, *swapped_layout, act, p.bias)
    wrong_order = explicit_moe(inputs, p.M, p.topk, N, up_rows, gate_rows, act, p.bias)
    ref = p.reference(inputs).double()
    torch.testing.assert_close(ref, right, atol=1e-4, rtol=1e-4)
    assert (ref - wrong_layout).abs().max() > 0.1
    assert (ref - wrong_order).abs().max() > 0.1
    # The Triton kernel and the torch method follow the same convention.
    dev_inputs = {k: v.to(device) for k, v in inputs.items()}
    fused = run_fused(p, dev_inputs).out.double().cpu()
    torch.testing.assert_close(fused, right, atol=1e-4, rtol=1e-4)
    eager = p.methods()["torch"].bind(p, dev_inputs, {})
    eager()
    torch.testing.assert_close(eager.out.double().cpu(), right, atol=1e-4, rtol=1e-4)


def test_swiglu_clamps_reached():
    # The default swiglu inputs exercise the clamp at 7 somewhere in a moderate shape.
    p = FusedMoE(shape(M=64, E=4, K=256, N=256, dtype="fp32", activation="swiglu_oai"))
    inp = p.inputs(0, "cpu")
    h = inp["x"] @ inp["w1"][0].T + inp["b1"][0]
    assert (h.abs() > 7).any()


def test_flops_and_bytes_gpt_oss_decode():
    # gpt-oss-120b, M=1, bf16, vLLM's plain SiLU: 4 distinct experts.
    p = FusedMoE({"M": 1, "E": 128, "topk": 4, "K": 2880, "N": 2880, "dtype": "bf16"})
    assert p.expected_distinct_experts() == pytest.approx(4.0)
    expert = (2 * 2880 * 2880 + 2880 * 2880) * 2
    assert p.flops() == 2 * 1 * 4 * (2880 * 2 * 2880 + 2880 * 2880)
    assert p.bytes() == pytest.approx(4 * expert + 2 * 2880 * 2)
    assert p.bytes() == pytest.approx(199_077_120)
    assert p.bandwidth_bound_bytes() == p.bytes()
    assert p.bound_us(4.8e12) == pytest.approx(41.47, abs=0.01)  # 199 MB of bf16 experts at 4.8 TB/s
    # With biases (gpt-oss's own activation) each expert adds 2N + K values.
    q = FusedMoE({"M": 1, "E": 128, "topk": 4, "K": 2880, "N": 2880, "dtype": "bf16", "activation": "swiglu_oai"})
    assert q.bias
    assert q.bytes() == pytest.approx(4 * (expert + (2 * 2880 + 2880) * 2) + 2 * 2880 * 2)


def test_bytes_distinct_experts():
    p = FusedMoE({"M": 256, "E": 32, "topk": 4, "K": 2880, "N": 720, "dtype": "fp16"})
    assert p.expected_distinct_experts() == pytest.approx(32 * (1 - (28 / 32) ** 256))
    u = FusedMoE({"M": 3, "E": 32, "topk": 4, "K": 64, "N": 32, "dtype": "fp32", "routing": "uniform"})
    assert u.expected_distinct_experts() == 12
    assert u.bytes() == 12 * (3 * 32 * 64) * 4 + 2 * 3 * 64 * 4


def test_bytes_for_counts_the_experts_the_routing_selects():
    p = FusedMoE({"M": 4, "E": 16, "topk": 2, "K": 64, "N": 32, "dtype": "fp32"})
    inputs = p.inputs(0, "cpu")
    act = 2 * 4 * 64 * 4
    # Hand-made routing: tokens share experts 3 and 5, so two experts are read, not ~6.
    inputs["topk_ids"] = torch.tensor([[3, 5], [5, 3], [3, 5], [5, 3]], dtype=torch.int32)
    assert p.bytes_for(inputs) == 2 * p.expert_bytes() + act
    inputs["topk_ids"] = torch.arange(8, dtype=torch.int32).reshape(4, 2)
    assert p.bytes_for(inputs) == 8 * p.expert_bytes() + act
    assert p.expected_distinct_experts() == pytest.approx(16 * (1 - (14 / 16) ** 4))


def test_inputs_deterministic_and_routed(device):
    p = FusedMoE(shape(M=9, topk=3, routing="random"))
    a, b, c = p.inputs(7, device), p.inputs(7, device), p.inputs(8, device)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not torch.equal(a["x"], c["x"])
    ids = a["topk_ids"]
    assert ids.dtype == torch.int32 and ids.shape == (9, 3)
    assert all(len(set(row)) == 3 for row in ids.tolist()), "a token's experts are distinct"
    torch.testing.assert_close(a["topk_weights"].sum(1), torch.ones(9, device=ids.device))
    u = FusedMoE(shape(M=5, E=8, topk=3, routing="uniform")).inputs(0, device)["topk_ids"]
    assert u.tolist() == [[(t * 3 + j) % 8 for j in range(3)] for t in range(5)]
    assert set(a) == {"x", "w1", "w2", "topk_ids", "topk_weights"}
    assert {"b1", "b2"} <= set(FusedMoE(shape(activation="swiglu_oai")).inputs(0, device))
    assert "b1" not in FusedMoE(shape(activation="swiglu_oai", bias=False)).inputs(0, device)


def test_registry_methods_and_defaults():
    cls = resolve("moe")
    assert cls is FusedMoE
    p = cls(shape())
    assert set(p.methods()) == {
        "fused_moe",
        "fused_moe_vllm",
        "fused_moe_persistent",
        "torch",
        "vllm",
        "aiter",
        "triton_kernels",
    }
    if os.environ.get("TRITON_INTERPRET") == "1":
        for name in ("fused_moe", "fused_moe_vllm", "fused_moe_persistent"):
            assert p.methods()[name].compile(p, CFG) is False
    assert vllm_default_config(1, 128) == {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 4,
    }
    assert vllm_default_config(4096, 32) == {
        "BLOCK_SIZE_M": 128,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 8,
        "num_stages": 3,
    }
    assert vllm_default_config(8192, 32)["GROUP_SIZE_M"] == 16


def test_bad_shapes_and_configs():
    with pytest.raises(ValueError, match="topk"):
        FusedMoE(shape(E=2, topk=3))
    with pytest.raises(ValueError, match="activation"):
        FusedMoE(shape(activation="gelu"))
    with pytest.raises(ValueError, match="'N'"):
        FusedMoE({"M": 1, "E": 2, "topk": 1, "K": 16})
    p = FusedMoE(shape())
    with pytest.raises(ValueError, match="BLOCK_SIZE_N"):
        p.methods()["fused_moe"].bind(p, p.inputs(0, "cpu"), dict(CFG, BLOCK_SIZE_N=24))


# ---------------------------------------------------------------- the other methods

PCFG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 32,
    "BLOCK_SIZE_K": 32,
    "BLOCK_SIZE_N2": 32,
    "BLOCK_SIZE_K2": 16,
    "SPLIT_K": 1,
    "num_warps": 4,
    "num_stages": 2,
    "PROGRAMS_PER_SM": 2,
    "PREFETCH_W2": 1,
}
# M=13, topk=2: 26 slots, not a multiple of BLOCK_SIZE_M=16. Every shape has fewer slots
# than experts, so some experts get no token whatever the generator draws (CPU and CUDA differ).
NEW_SHAPES = [dict(E=32), dict(M=1), dict(M=5, E=16, topk=3)]


def new_method_config(name):
    return PCFG if name == "fused_moe_persistent" else CFG if name == "fused_moe_vllm" else {}


def run_method(name, problem, inputs, config=None):
    launch = problem.methods()[name].bind(problem, inputs, new_method_config(name) if config is None else config)
    launch.out.fill_(float("nan"))
    for buf in ("inter", "gate_up", "out2", "part"):
        if getattr(launch, buf, None) is not None:
            getattr(launch, buf).fill_(float("nan"))
    launch()
    return launch


@pytest.mark.parametrize("kw", NEW_SHAPES, ids=["M13-E32", "M1-E8", "M5-E16-top3"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("method", ["fused_moe_vllm", "fused_moe_persistent", "torch"])
def test_new_methods_match_reference(method, activation, dtype, kw, device):
    p = FusedMoE(shape(activation=activation, dtype=dtype, **kw))
    inputs = p.inputs(11, device)
    assert p.M * p.topk < p.E, "some experts get no token"
    assert_close(run_method(method, p, inputs).out, p.reference(inputs), dtype)


def test_vllm_structure_launches_five_plain_kernels():
    """fused_moe_vllm is vLLM's call kernel for kernel, checked on the plan (no GPU
    needed): the alignment even for one token, GEMM 1 without activation, the
    activation kernel, GEMM 2, the sum, and no dependent launch anywhere."""
    from tunelab.dtypes import int32, pointer, torch_dtype
    from tunelab.kernels.fused_moe import ACT_NONE, _launch_specs, vllm_plan

    for M, activation in ((1, "silu"), (40, "swiglu_oai")):
        p = FusedMoE(shape(M=M, E=8, topk=4, activation=activation))
        plan = vllm_plan(p, CFG)
        assert plan.self_align == 0 and not plan.pdl and plan.split_activation
        bufs = {
            n: pointer(torch_dtype("fp16"))
            for n in ["x", "w1", "b1", "w2", "b2", "inter", "gate_up", "out2", "out", "topk_weights"]
        }
        bufs.update({n: pointer(int32()) for n in ("topk_ids", "sorted_ids", "expert_ids", "num_post", "cursor")})
        specs = _launch_specs(plan, bufs)
        names = [spec[0].fn.__name__ if hasattr(spec[0], "fn") else spec[0].__name__ for spec in specs]
        assert names == ["moe_align_kernel", "moe_gemm1_kernel", "moe_act_kernel", "moe_gemm2_kernel", "moe_sum_kernel"]
        assert all("launch_pdl" not in kwargs and not kwargs.get("USE_PDL", False) for _, _, _, kwargs in specs)
        assert specs[1][3]["ACTIVATION"] == ACT_NONE and specs[1][2][3] is bufs["gate_up"]
        assert specs[2][3]["ACTIVATION"] == plan.activation


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_vllm_structure_gemm1_writes_gate_and_up(activation, device):
    """GEMM 1's ACT_NONE path: every slot's row of gate_up is x @ w1[e].T + b1[e],
    all 2N columns in w1's own order; the activation kernel then makes `inter`."""
    p = FusedMoE(shape(M=7, N=24, activation=activation))  # 2N=48: a partial last BLOCK_SIZE_N tile
    inputs = p.inputs(12, device)
    launch = run_method("fused_moe_vllm", p, inputs)
    x, ids = inputs["x"].float().cpu(), inputs["topk_ids"].reshape(-1).long().cpu()
    w1 = inputs["w1"].float().cpu()
    expected = torch.stack([w1[e] @ x[s // p.topk] for s, e in enumerate(ids.tolist())])
    if p.bias:
        expected += inputs["b1"].float().cpu()[ids]
    torch.testing.assert_close(launch.gate_up.float().cpu(), expected, **TOL["fp16"])
    torch.testing.assert_close(launch.inter.float().cpu(), p.activate(expected), **TOL["fp16"])


# ---- the persistent kernel


def persistent_launch(p, inputs, config=PCFG, self_align_max=None, grid=None):
    from tunelab.kernels.fused_moe import PersistentMoELaunch, make_persistent_plan

    plan = make_persistent_plan(p, config, self_align_max=self_align_max)
    launch = PersistentMoELaunch(plan, inputs, grid=grid)
    launch.out.fill_(float("nan"))
    launch.inter.fill_(float("nan"))
    launch.part.fill_(float("nan"))
    return launch


def check_twice(launch, ref, dtype_name):
    """Call, check against the reference, call again: the same bits, and the
    workspace back to zero after each call."""
    launch()
    assert_close(launch.out, ref, dtype_name)
    assert launch.workspace_clear() and not launch.timed_out()
    first = launch.out.clone()
    launch.out.fill_(float("nan"))
    launch()
    torch.testing.assert_close(launch.out, first, atol=0, rtol=0)
    assert launch.workspace_clear()


def check_calls(launch, ref, dtype_name, calls):
    """Call `calls` times, each on a poisoned output: each matches the
    reference, and leaves the workspace zero and no wait timed out."""
    for _ in range(calls):
        launch.out.fill_(float("nan"))
        launch()
        assert_close(launch.out, ref, dtype_name)
        assert launch.workspace_clear() and not launch.timed_out()


@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("grid", [1, 2, 7, "more than tiles"])
@pytest.mark.parametrize("self_align", [True, False])
def test_persistent_alignment_and_grids(self_align, grid, split_k, device):
    """Both alignments (registers in every program; program 0 into memory), one
    program doing every tile, a few, more programs than tiles, GEMM 1 whole or
    split in K. Every call leaves the workspace zero, and a second call gives
    the same bits."""
    from tunelab.kernels.fused_moe import make_persistent_plan

    p = FusedMoE(shape(M=9, E=8, topk=2, activation="swiglu_oai"))
    inputs = p.inputs(13, device)
    config = dict(PCFG, SPLIT_K=split_k)
    if not isinstance(grid, int):
        grid = make_persistent_plan(p, config).max_items() + 2
    launch = persistent_launch(p, inputs, config=config, self_align_max=None if self_align else 0, grid=grid)
    assert launch.plan.split_k == split_k
    assert (launch.plan.self_align > 0) == self_align
    assert launch.phases == ([-1] if not INTERPRETED else [1, 2] if self_align else [0, 1, 2])
    check_twice(launch, p.reference(inputs), "fp16")
    if not self_align:
        check_alignment(
            inputs["topk_ids"], p.E, PCFG["BLOCK_SIZE_M"], launch.sorted_ids, launch.expert_ids, launch.num_post
        )


@pytest.mark.parametrize(
    "cfg",
    [
        dict(BLOCK_SIZE_N=16, BLOCK_SIZE_K=64, BLOCK_SIZE_N2=16, BLOCK_SIZE_K2=64),  # one K step, N2 tiles of 16
        dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=16, BLOCK_SIZE_N2=128, BLOCK_SIZE_K2=32),  # one N2 tile > K
        dict(BLOCK_SIZE_K=16, SPLIT_K=2),  # 3 K steps in slices of 2 and 1
        dict(BLOCK_SIZE_K=32, SPLIT_K=4),  # 2 K steps in 4 slices: two slices are empty
        dict(BLOCK_SIZE_K2=32, BLOCK_SIZE_N2=16),  # GEMM 2 in one (masked) step
    ],
    ids=["small-tiles", "large-tiles", "split-uneven", "split-empty-slices", "gemm2-one-step"],
)
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_persistent_tails(cfg, dtype, device):
    # K=48 and N=24 are multiples of no tile: masked K loops, partial tiles in both GEMMs.
    p = FusedMoE(shape(M=6, E=4, topk=3, K=48, N=24, dtype=dtype, activation="swiglu_oai"))
    inputs = p.inputs(14, device)
    launch = persistent_launch(p, inputs, config=dict(PCFG, **cfg))
    launch()
    assert_close(launch.out, p.reference(inputs), dtype)
    assert launch.workspace_clear()


@pytest.mark.skipif(not INTERPRETED, reason="the phase-split path is the interpreter's")
@pytest.mark.parametrize("self_align", [True, False])
def test_persistent_phases_one_at_a_time(self_align, device):
    """The interpreter runs moe_persistent_kernel once per phase: check what each
    phase leaves behind (the alignment, the activated intermediate, the output)."""
    p = FusedMoE(shape(M=11, E=8, topk=2))
    inputs = p.inputs(15, device)
    launch = persistent_launch(p, inputs, self_align_max=None if self_align else 0)
    runners = dict(zip(launch.phases, launch._runners))
    assert sorted(runners) == ([1, 2] if self_align else [0, 1, 2])
    if not self_align:
        launch.sorted_ids.fill_(-7)
        runners[0]()
        check_alignment(
            inputs["topk_ids"], p.E, PCFG["BLOCK_SIZE_M"], launch.sorted_ids, launch.expert_ids, launch.num_post
        )
        assert torch.isnan(launch.inter).all(), "phase 0 only aligns"
    runners[1]()
    x, ids = inputs["x"].float(), inputs["topk_ids"].reshape(-1).long()
    h = torch.stack([inputs["w1"][e].float() @ x[s // p.topk] for s, e in enumerate(ids.tolist())])
    torch.testing.assert_close(launch.inter.float(), p.activate(h), **TOL["fp16"])
    assert torch.isnan(launch.out).all(), "phase 1 writes no output"
    # Each block's READY word counts its GEMM 1 tiles; phase 2 clears it.
    from tunelab.kernels.fused_moe import WS_HEADER

    ready = launch.ws[WS_HEADER : WS_HEADER + launch.plan.max_blocks]
    assert int(ready.max()) == launch.plan.n_tiles1
    runners[2]()
    assert_close(launch.out, p.reference(inputs), "fp16")
    assert launch.workspace_clear()


def test_persistent_plan_and_defaults():
    from tunelab.kernels.fused_moe import PERSISTENT_CONFIG_KEYS, make_persistent_plan, persistent_default_config

    method = FusedMoE(shape()).methods()["fused_moe_persistent"]
    assert tuple(method.config_keys) == PERSISTENT_CONFIG_KEYS
    for M in (1, 64, 4096):
        assert set(persistent_default_config(M, 360)) == set(PERSISTENT_CONFIG_KEYS)
    # gpt-oss decode: four slots, aligned in registers; prefetch only where the
    # selectable w2 rows fit the budget, and never in the interpreter.
    small = FusedMoE({"M": 1, "E": 128, "topk": 4, "K": 2880, "N": 360, "dtype": "bf16"})
    decode = dict(persistent_default_config(1, 360), BLOCK_SIZE_N=32, BLOCK_SIZE_N2=64, SPLIT_K=1, PREFETCH_W2=1)
    plan = make_persistent_plan(small, decode)
    assert plan.self_align == 4 and plan.max_blocks == 4 and plan.n_tiles1 == 23 and plan.n_tiles2 == 45
    assert plan.prefetch == (0 if INTERPRETED else 64)
    big = FusedMoE({"M": 64, "E": 128, "topk": 4, "K": 2880, "N": 2880, "dtype": "bf16"})
    plan = make_persistent_plan(big, persistent_default_config(64, 2880))
    assert plan.self_align == 0 and plan.prefetch == 0 and plan.split_k == 1 and plan.slices_elems() == 1
    assert plan.ws_words == 32 + 2 * plan.max_blocks + 64 * plan.n_tiles2
    # K slices at decode sizes add one count a GEMM 1 tile; above SPLIT_K_MAX_TILES they do not apply.
    split = make_persistent_plan(small, dict(decode, SPLIT_K=3))
    assert split.split_k == 3 and split.max_items() == 4 * (23 * 3 + 45)
    assert split.ws_words == 32 + 2 * 4 + 45 + 4 * 23 and split.slices_elems() == 4 * 23 * 3 * 16 * 32
    assert make_persistent_plan(big, dict(persistent_default_config(64, 2880), SPLIT_K=3)).split_k == 1
    with pytest.raises(ValueError, match="BLOCK_SIZE_N2"):
        make_persistent_plan(small, dict(decode, BLOCK_SIZE_N2=24))
    with pytest.raises(ValueError, match="PROGRAMS_PER_SM"):
        make_persistent_plan(small, dict(persistent_default_config(1, 360), PROGRAMS_PER_SM=0))
    with pytest.raises(ValueError, match="SPLIT_K"):
        make_persistent_plan(small, dict(persistent_default_config(1, 360), SPLIT_K=0))


def test_resident_programs_per_sm():
    from types import SimpleNamespace

    from tunelab.kernels.fused_moe import resident_programs_per_sm

    h100 = SimpleNamespace(
        warp_size=32,
        max_threads_per_multi_processor=2048,
        regs_per_multiprocessor=65536,
        shared_memory_per_multiprocessor=233472,
    )
    # 128 registers x 4 warps: 16 K registers a program, 4 a SM; shared memory allows 6.
    assert resident_programs_per_sm(128, 36864, 4, h100) == 4
    # Shared memory binds: 100 KB a program, two fit.
    assert resident_programs_per_sm(64, 100 * 1024, 4, h100) == 2
    # Registers round up to 256 a warp: 129 -> 136 a thread.
    assert resident_programs_per_sm(129, 0, 8, h100) == 65536 // (136 * 32 * 8)
    # Threads: 16 warps a program, four a SM.
    assert resident_programs_per_sm(32, 0, 16, h100) == 4
    assert resident_programs_per_sm(255, 200 * 1024, 8, h100) == 1


@pytest.mark.skipif(INTERPRETED, reason="the in-kernel waits run on a GPU only")
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("M", [1, 4, 16, 17, 64, 300])
def test_persistent_on_the_gpu(M, split_k, device):
    """The synchronised single launch: gpt-oss-like proportions, sizes on both
    sides of the self-alignment limit, the default grid (every SM) and repeated
    calls (the workspace must come back to zero each time)."""
    p = FusedMoE({"M": M, "E": 32, "topk": 4, "K": 256, "N": 96, "dtype": "fp16", "activation": "swiglu_oai"})
    inputs = p.inputs(16, device)
    from tunelab.kernels.fused_moe import persistent_default_config

    launch = persistent_launch(p, inputs, config=dict(persistent_default_config(M, p.N), SPLIT_K=split_k))
    assert launch.phases == [-1] and launch.grid >= 1
    check_calls(launch, p.reference(inputs), "fp16", calls=3)


def test_persistent_trace(device):
    """A traced launch (bench/moe_persistent_timeline.py) stamps every program and
    every item the routing made, in order, and computes the same output. Under
    the interpreter there is no clock: asking for a trace is refused."""
    from tunelab.kernels.fused_moe import TRACE_PER_PROGRAM, PersistentMoELaunch, make_persistent_plan, trace_layout

    p = FusedMoE(shape(M=3, E=16, topk=4, activation="swiglu_oai"))
    inputs = p.inputs(18, device)
    plan = make_persistent_plan(p, dict(PCFG, SPLIT_K=2))
    if INTERPRETED:
        with pytest.raises(ValueError, match="needs a GPU"):
            PersistentMoELaunch(plan, inputs, trace=True)
        return
    launch = PersistentMoELaunch(plan, inputs, trace=True)
    # The second launch finds the counters the first left (zero).
    check_calls(launch, p.reference(inputs), "fp16", calls=2)
    layout = trace_layout(plan, launch.grid)
    raw = launch.trace.cpu()
    programs = raw[: launch.grid * TRACE_PER_PROGRAM].view(launch.grid, TRACE_PER_PROGRAM)
    start, gemm1_begin, gemm1_end, end, sm = programs.unbind(1)
    assert bool((start > 0).all()) and bool((start <= gemm1_begin).all()) and bool((gemm1_begin <= gemm1_end).all())
    assert bool((gemm1_end <= end).all()) and int(sm.max()) < torch.cuda.get_device_properties(0).multi_processor_count
    first1, count1 = layout["items1"]
    first2, count2 = layout["items2"]
    items1 = raw[first1 : first1 + 3 * count1].view(count1, 3)
    items2 = raw[first2 : first2 + 4 * count2].view(count2, 4)
    blocks = len({int(e) for e in inputs["topk_ids"].reshape(-1)})  # 3 tokens x 4 slots <= 16 rows: a block each
    made1, made2 = blocks * plan.n_tiles1 * plan.split_k, blocks * plan.n_tiles2
    assert bool((items1[:made1] > 0).all()) and bool((items1[made1:] == 0).all())
    assert bool((items2[:made2] > 0).all()) and bool((items2[made2:] == 0).all())
    assert bool((items1[:made1].diff(dim=1) >= 0).all()) and bool((items2[:made2].diff(dim=1) >= 0).all())
    # A GEMM 2 item's wait ends after the K loops of its block's GEMM 1 items (whose
    # counts it waits for) are done; 100 ns for the clock's steps.
    per_block1 = plan.n_tiles1 * plan.split_k
    for m in range(blocks):
        loops_done = int(items1[m * per_block1 : (m + 1) * per_block1, 1].max())
        waits_over = items2[m * plan.n_tiles2 : (m + 1) * plan.n_tiles2, 1]
        assert int(waits_over.min()) >= loops_done - 100
    assert int(items2[:made2, 3].max()) <= int(end.max())


# ---- the persistent kernel's GEMV schedule (GEMV=1)

GCFG = dict(PCFG, GEMV=1, BLOCK_SIZE_N=8, BLOCK_SIZE_N2=16)


_GEMV_ITEMS = {
    "one-column-items": dict(BLOCK_SIZE_N=2, BLOCK_SIZE_N2=1),
    "small-items": dict(BLOCK_SIZE_N=8, BLOCK_SIZE_N2=16),
    "one-item-a-slot": dict(BLOCK_SIZE_N=64, BLOCK_SIZE_N2=128),
}
# Every item width in fp16; fp32 (another load and accumulate type, the same
# item arithmetic) at one width: the interpreter takes seconds a case.
_GEMV_ITEM_CASES = [
    pytest.param(dtype, cfg, id=f"{dtype}-{name}")
    for name, cfg in _GEMV_ITEMS.items()
    for dtype in ("fp16", "fp32")
    if dtype == "fp16" or name == "small-items"
]


@pytest.mark.parametrize("dtype,cfg", _GEMV_ITEM_CASES)
@pytest.mark.parametrize(
    "kw",
    [dict(M=1, E=8, topk=2), dict(M=3, E=16, topk=3, K=48, N=24), dict(M=2, E=4, topk=4, K=96, N=40)],
    ids=["M1-top2", "M3-top3-K48-N24", "M2-top4-K96-N40"],
)
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_persistent_gemv_matches_reference(activation, kw, dtype, cfg, device):
    """Tail items in both GEMMs (N=24, 40 and K=48, 96 are multiples of no item
    width), a top-k that is not a power of two, biases (swiglu_oai), items
    wider than the whole matrix; a second call gives the same bits and leaves
    the workspace zero."""
    if INTERPRETED and cfg["BLOCK_SIZE_N"] == 2 and kw.get("K") == 96:
        # One-column items leave no tail at any of these sizes (all even), so
        # the largest adds only items: about 25 s of the interpreter for the
        # two activations, for what the two smaller shapes cover.
        pytest.skip("one-column items run at the two smaller shapes in the interpreter")
    p = FusedMoE(shape(activation=activation, dtype=dtype, **kw))
    inputs = p.inputs(19, device)
    launch = persistent_launch(p, inputs, config=dict(GCFG, **cfg))
    assert launch.plan.gemv and launch.phases == ([1, 2] if INTERPRETED else [-1])
    check_twice(launch, p.reference(inputs), dtype)


@pytest.mark.parametrize("grid", [1, 2, 7, "more than items"])
def test_persistent_gemv_grids(grid, device):
    """One program doing every item, a few (programs with GEMM 1 items left and
    none, GEMM 2 items continuing the round robin), more programs than items."""
    from tunelab.kernels.fused_moe import make_persistent_plan

    p = FusedMoE(shape(M=2, E=8, topk=3, K=80, N=36, activation="swiglu_oai"))
    inputs = p.inputs(20, device)
    if not isinstance(grid, int):
        grid = make_persistent_plan(p, GCFG).max_items() + 3
    launch = persistent_launch(p, inputs, config=GCFG, grid=grid)
    check_calls(launch, p.reference(inputs), "fp16", calls=2)


@pytest.mark.skipif(INTERPRETED, reason="the in-kernel wait runs on a GPU only")
@pytest.mark.parametrize("M", [1, 2, 5])
def test_persistent_gemv_on_the_gpu(M, device):
    """The synchronised launch with the grid sized from the GPU, repeated (the
    last program past the wait clears the counters for the next launch)."""
    p = FusedMoE({"M": M, "E": 32, "topk": 4, "K": 256, "N": 96, "dtype": "fp16", "activation": "swiglu_oai"})
    inputs = p.inputs(21, device)
    launch = persistent_launch(p, inputs, config=GCFG)
    assert launch.phases == [-1]
    check_calls(launch, p.reference(inputs), "fp16", calls=3)


def test_persistent_gemv_plan():
    from tunelab.kernels.fused_moe import (
        PersistentMoELaunch,
        make_persistent_plan,
        persistent_default_config,
        two_pow2_parts,
    )

    assert two_pow2_parts(2880) == (2048, 1024) and two_pow2_parts(360) == (256, 128)
    assert two_pow2_parts(64) == (32, 32) and two_pow2_parts(65) == (64, 1) and two_pow2_parts(2) == (1, 1)
    with pytest.raises(ValueError, match="n >= 2"):
        two_pow2_parts(1)
    small = FusedMoE({"M": 1, "E": 128, "topk": 4, "K": 2880, "N": 360, "dtype": "bf16"})
    # The tiled defaults' keys the GEMV schedule does not read (SPLIT_K 4, PREFETCH_W2) do not reach its plan.
    plan = make_persistent_plan(
        small, dict(persistent_default_config(1, 360), GEMV=1, BLOCK_SIZE_N=8, BLOCK_SIZE_N2=16)
    )
    assert plan.gemv and plan.split_k == 1 and plan.prefetch == 0 and plan.self_align == 0
    assert plan.n_tiles1 == 90 and plan.n_tiles2 == 180 and plan.max_items() == 4 * 90 and plan.ws_words == 32
    assert persistent_default_config(1, 360)["GEMV"] == 0
    # A config written before GEMV existed is the tiled schedule.
    assert not make_persistent_plan(small, {k: v for k, v in PCFG.items()}).gemv
    for bad, match in (
        (dict(BLOCK_SIZE_N=3), "BLOCK_SIZE_N"),
        (dict(BLOCK_SIZE_N2=0), "BLOCK_SIZE_N2"),
        (dict(GEMV=2), "GEMV"),
    ):
        with pytest.raises(ValueError, match=match):
            make_persistent_plan(small, dict(GCFG, **bad))
    tiny = FusedMoE(shape(M=1))
    with pytest.raises(ValueError, match="GEMV"):
        PersistentMoELaunch(make_persistent_plan(tiny, GCFG), tiny.inputs(0, "cpu"), trace=True)


# ---- torch


@pytest.mark.parametrize("path", ["grouped_mm", "gather_bmm", "dense_bmm"])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_torch_paths(path, activation, device):
    from tunelab.problems.moe_torch import TorchMoELaunch

    p = FusedMoE(shape(M=5, E=16, topk=3, dtype="fp32", activation=activation))
    inputs = p.inputs(17, device)
    if path == "grouped_mm" and device.type == "cuda":
        pytest.skip("torch._grouped_mm's CUDA fast path is bf16 only; fp32 would sync")
    launch = TorchMoELaunch(p, inputs, path=path)
    launch.out.fill_(float("nan"))
    launch()
    assert launch.path == path
    assert_close(launch.out, p.reference(inputs), "fp32")


def test_torch_path_choice():
    from tunelab.problems.moe_torch import torch_path

    # fp16 on CUDA never takes _grouped_mm (its fallback syncs), whatever the GPU.
    decode = FusedMoE({"M": 1, "E": 128, "topk": 4, "K": 2880, "N": 360, "dtype": "fp16"})
    prefill = FusedMoE({"M": 64, "E": 32, "topk": 4, "K": 2880, "N": 360, "dtype": "fp16"})
    assert torch_path(decode, "cuda")[0] == "gather_bmm" and "bf16" in torch_path(decode, "cuda")[1]
    assert torch_path(prefill, "cuda")[0] == "dense_bmm"
    launch = FusedMoE(shape()).methods()["torch"].bind(FusedMoE(shape()), FusedMoE(shape()).inputs(0, "cpu"), {})
    assert launch.path in ("grouped_mm", "gather_bmm") and launch.path_reason


@pytest.mark.skipif(INTERPRETED, reason="needs a GPU")
def test_torch_method_never_syncs(device):
    p = FusedMoE({"M": 8, "E": 32, "topk": 4, "K": 256, "N": 128, "dtype": "bf16"})
    inputs = p.inputs(18, device)
    for path in ("gather_bmm", "dense_bmm"):
        from tunelab.problems.moe_torch import TorchMoELaunch

        launch = TorchMoELaunch(p, inputs, path=path)
        launch()  # lazy initialisation outside the check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            launch()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    default = p.methods()["torch"].bind(p, inputs, {})
    default()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        default()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_close(default.out, p.reference(inputs), "fp16")  # bf16 output, fp16 tolerance is generous enough


# ---- library methods


def test_library_methods_say_why_they_cannot_run():
    """Neither vLLM nor aiter is installed where tunelab's tests run: both say so
    in one line, and binding anyway fails with the same reason."""
    p = FusedMoE(shape())
    methods = p.methods()
    for name, library in (("vllm", "vllm"), ("aiter", "aiter")):
        reason = methods[name].unavailable(p)
        if reason is None:
            pytest.skip(f"{library} is usable here")
        assert isinstance(reason, str) and "\n" not in reason and reason
        with pytest.raises(RuntimeError, match="cannot run here"):
            methods[name].bind(p, p.inputs(0, "cpu"), {})
    assert getattr(methods["fused_moe"], "unavailable", None) is None
    assert methods["torch"].unavailable(p) is None  # it declines quantised weights only


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("enum_activation", [False, True])
def test_vllm_adapter_maps_the_call(activation, enum_activation, monkeypatch, device):
    """The vllm method's call, against a stand-in vLLM that computes the MoE with
    the reference's formula from exactly the arguments vLLM would get: the
    activation's name (string or vLLM's newer Enum), biases through
    biased_moe_quant_config."""
    import enum
    import sys
    import types

    from tunelab.problems import moe_libraries as moe

    class MoEActivation(enum.Enum):
        SILU = "silu"
        SWIGLUOAI = "swigluoai"

    seen = {}

    class QuantConfig:
        def __init__(self, w1_bias, w2_bias):
            self.w1_bias, self.w2_bias = w1_bias, w2_bias

    def fused_experts(
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        inplace=False,
        activation=MoEActivation.SILU if enum_activation else "silu",
        quant_config=None,
    ):
        seen["activation"] = activation
        name = activation.value if isinstance(activation, enum.Enum) else activation
        shape_ = dict(
            problem.shape, activation={"silu": "silu", "swigluoai": "swiglu_oai"}[name], bias=quant_config is not None
        )
        inputs = {"x": hidden_states, "w1": w1, "w2": w2, "topk_weights": topk_weights, "topk_ids": topk_ids}
        if quant_config is not None:
            inputs.update(b1=quant_config.w1_bias, b2=quant_config.w2_bias)
        return FusedMoE(shape_).reference(inputs)

    fused = types.ModuleType("vllm.model_executor.layers.fused_moe")
    fused.fused_experts = fused_experts
    config = types.ModuleType("vllm.model_executor.layers.fused_moe.config")
    config.biased_moe_quant_config = QuantConfig
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers.fused_moe", fused)
    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers.fused_moe.config", config)
    monkeypatch.setattr(moe, "_VLLM", None)

    problem = FusedMoE(shape(activation=activation))
    inputs = problem.inputs(19, device)
    entry = moe._vllm_entry()
    assert entry["bias"] == "quant_config"
    launch = moe._LibraryLaunch(problem, inputs, moe._vllm_call(problem, inputs, entry))
    launch.out.fill_(float("nan"))
    launch()
    assert_close(launch.out, problem.reference(inputs), "fp16")
    want = "swigluoai" if activation == "swiglu_oai" else "silu"
    assert seen["activation"] == (MoEActivation(want) if enum_activation else want)
    monkeypatch.setattr(moe, "_VLLM", None)  # forget the stand-in


def test_vllm_method_tunes_vllms_kernel_through_its_override(monkeypatch, device):
    """The vllm method sets its config with vLLM's own `override_config` around
    each call (a stand-in vLLM records what its config lookup would see), the
    keys it leaves out from vLLM 0.33's default; an empty config leaves vLLM
    its own choice; a vLLM without the override refuses a config."""
    import contextlib
    import sys
    import types

    from tunelab.problems import moe_libraries
    from tunelab.problems.moe import vllm_default_config

    state = {"config": None}
    seen = []

    @contextlib.contextmanager
    def override_config(config):
        old, state["config"] = state["config"], config
        yield
        state["config"] = old

    def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, activation="silu"):
        seen.append(state["config"])
        return torch.zeros(hidden_states.shape, dtype=hidden_states.dtype, device=hidden_states.device)

    fused = types.ModuleType("vllm.model_executor.layers.fused_moe")
    fused.fused_experts = fused_experts
    fused.override_config = override_config
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers.fused_moe", fused)
    monkeypatch.setattr(moe_libraries, "_VLLM", None)

    problem = FusedMoE(shape(activation="silu"))
    inputs = problem.inputs(0, device)
    entry = moe_libraries._vllm_entry()
    config = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_stages": 2}
    override = moe_libraries.vllm_override(problem, config)
    assert override == dict(vllm_default_config(problem.M, problem.E), **config)
    launch = moe_libraries._LibraryLaunch(problem, inputs, moe_libraries._vllm_call(problem, inputs, entry, override))
    launch()
    assert seen[-1] == override and state["config"] is None
    assert moe_libraries.vllm_override(problem, {}) is None
    moe_libraries._LibraryLaunch(problem, inputs, moe_libraries._vllm_call(problem, inputs, entry, None))()
    assert seen[-1] is None
    with pytest.raises(RuntimeError, match="no override_config"):
        moe_libraries._vllm_call(problem, inputs, dict(entry, override=None), override)
    assert moe_libraries.VllmMoE().config_types == {k: int for k in moe_libraries.CONFIG_KEYS}
    monkeypatch.setattr(moe_libraries, "_VLLM", None)  # forget the stand-in
