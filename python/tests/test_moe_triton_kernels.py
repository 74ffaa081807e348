"""The `triton_kernels` method: triton_kernels' MoE as vLLM 0.33 calls it.

Needs triton_kernels (`just peers` unpacks it into .peers/; skipped with that
reason where it is absent). Without a GPU the parts that can run are checked:
the weight conversion into triton_kernels' Hopper layouts (plain torch), the
routing data (triton_kernels' routing kernels under Triton's interpreter),
gpt-oss's gate/up convention against triton_kernels' own SwiGLU (under the
interpreter), and the opt_flags constraints the launch sets. matmul_ogs
itself needs a GPU (its heuristic reads the device's properties, and its
kernels are specialised JIT functions the interpreter cannot run): the
`test_gpu_*` tests run it against the problem's reference on an sm_90 GPU.
"""

import os

import torch

if not torch.cuda.is_available():  # before triton is imported (conftest does the same)
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tunelab import peers, quant  # noqa: E402
from tunelab.compare import compare  # noqa: E402
from tunelab.problems import moe_triton_kernels as mtk  # noqa: E402
from tunelab.problems.moe import FusedMoE  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
TK = peers.triton_kernels()
needs_tk = pytest.mark.skipif(isinstance(TK, str), reason=f"no triton_kernels: {TK}")
SM90 = (not INTERPRETED) and torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
GPU = pytest.mark.skipif(not SM90, reason="matmul_ogs runs on an sm_90 GPU (docs/peers.md)")
# As experiments/gptoss-mxfp4.yaml has it.
TOL = dict(atol=2e-2, rtol=2e-2, max_mismatch=0.005)


def problem(**kw):
    shape = {
        "M": 5,
        "E": 4,
        "topk": 2,
        "K": 64,
        "N": 96,
        "dtype": "mxfp4",
        "act_dtype": "bf16",
        "activation": "swiglu_oai",
    }
    shape.update(kw)
    return FusedMoE(shape)


def test_constraints_per_matmul():
    config = {"w1_block_m": 64, "w1_num_stages": 3, "w1_split_k": 0, "w2_split_k": 1, "other": 7}
    assert mtk.constraints_of(config, "w1") == {"block_m": 64, "num_stages": 3}
    assert mtk.constraints_of(config, "w2") == {"split_k": 1}
    assert mtk.constraints_of({}, "w1") == {}
    with pytest.raises(ValueError, match="w1_block_m must be 0 or one of"):
        mtk.constraints_of({"w1_block_m": 48}, "w1")
    with pytest.raises(ValueError, match=">= 0"):
        mtk.constraints_of({"w2_split_k": -1}, "w2")


@needs_tk
def test_constraints_are_set_for_the_call_only():
    """The launch's context sets exactly its constraints in triton_kernels'
    own (process-global) opt_flags module and clears them after, also after
    an error, so no other call inherits them."""
    from triton_kernels.matmul_ogs_details import opt_flags

    opt_flags.update_opt_flags_constraints({"block_k": 256})  # left over by someone else
    with mtk.opt_flags_constraints({"block_m": 32, "split_k": 1}):
        assert opt_flags._opt_flags_constraints == {"block_m": 32, "split_k": 1}
    assert opt_flags._opt_flags_constraints == {}
    with pytest.raises(RuntimeError):
        with mtk.opt_flags_constraints({"num_stages": 3}):
            raise RuntimeError("a failed launch")
    assert opt_flags._opt_flags_constraints == {}
    with mtk.opt_flags_constraints({}):
        assert opt_flags._opt_flags_constraints == {}


@needs_tk
@pytest.mark.parametrize("N", [96, 128])
def test_weights_convert_into_hopper_layouts_and_back(N):
    """The converted weights, read back through the layouts' own unswizzle,
    are the problem's weights (gate/up rows in the problem's interleaved
    order), zero-padded to an intermediate size of a multiple of 64 (N=96 ->
    128), with the scale's K groups padded to a multiple of 4."""
    p = problem(N=N)
    inputs = p.inputs(0, "cpu")
    w = mtk.ConvertedWeights(p, inputs, mtk.hopper_layouts())
    Np = mtk.padded_intermediate(N)
    assert w.n_padded == Np == 128
    for name, weight, pc, rows, cols in (("w1", w.w1, w.pc1, 2 * N, p.K), ("w2", w.w2, w.pc2, p.K, N)):
        assert weight.storage.layout.name == "HOPPER_VALUE"
        scale = pc.weight_scale
        assert scale.storage.layout.name == "HOPPER_SCALE"
        codes = weight.storage.layout.unswizzle_data(weight.storage.data)  # [E, K/2, rows] as stored before
        groups = scale.storage.layout.unswizzle_data(scale.storage.data)
        codes, groups = codes.transpose(-2, -1), groups.transpose(-2, -1)
        padded_rows = 2 * Np if name == "w1" else p.K
        padded_cols = p.K if name == "w1" else Np
        assert codes.shape[-2:] == (padded_rows, padded_cols // 2)
        # The scale layout pads its rows further (to its tile); the K groups to a multiple of 4.
        assert groups.shape[-2] >= padded_rows and groups.shape[-1] % mtk.SCALE_GROUPS_ALIGN == 0
        assert not groups[:, :, padded_cols // quant.MX_GROUP :].any()
        for e in range(p.E):
            scales = groups[e, :padded_rows, : padded_cols // quant.MX_GROUP]
            got = quant.dequantize_mxfp4(codes[e], scales, padded_cols)
            want = p.dequantized(inputs, name, e)
            assert torch.equal(got[:rows, :cols], want)
            assert not got[rows:].any() and not got[:, cols:].any()
    assert torch.equal(w.b1[:, : 2 * N], inputs["b1"].float()) and not w.b1[:, 2 * N :].any()
    assert w.b1.dtype == torch.float32 and torch.equal(w.b2, inputs["b2"].float())


@triton.jit
def _swiglu_tile(h_ptr, out_ptr, alpha, limit, ROWS: tl.constexpr, COLS: tl.constexpr):
    from triton_kernels.swiglu import swiglu_fn

    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    h = tl.load(h_ptr + r[:, None] * COLS + c[None, :])
    out = swiglu_fn(h, alpha, limit)
    half = tl.arange(0, COLS // 2)
    tl.store(out_ptr + r[:, None] * (COLS // 2) + half[None, :], out)


@needs_tk
@pytest.mark.skipif(not INTERPRETED, reason="checks the convention under the interpreter; the GPU tests run the call")
def test_gate_up_interleave_is_triton_kernels_swiglu():
    """triton_kernels' own fused SwiGLU (what matmul_ogs applies to the gate/up
    matmul's columns) computes the problem's activation: the problem's
    interleave (even columns gate, odd up) is the one triton_kernels reads."""
    p = problem()
    h = torch.randn(4, 16) * 4  # some values past the clamp at 7
    out = torch.empty(4, 8)
    _swiglu_tile[(1,)](h, out, mtk.SWIGLU_ALPHA, mtk.SWIGLU_LIMIT, ROWS=4, COLS=16)
    torch.testing.assert_close(out, p.activate(h), rtol=1e-5, atol=1e-5)
    swapped = torch.stack([h[:, 1::2], h[:, 0::2]], dim=-1).flatten(-2)
    assert not torch.allclose(out, p.activate(swapped), rtol=1e-3, atol=1e-3)


@needs_tk
@pytest.mark.skipif(not INTERPRETED, reason="the GPU tests run the routing inside the call")
@pytest.mark.parametrize("M,E,topk", [(5, 8, 2), (40, 64, 4)])
def test_routing_data_from_topk_ids(M, E, topk):
    """The routing data triton_kernels' kernels build from the problem's top-k
    ids and weights (the bitmatrix from tunelab's kernel): each expert's
    count, the slots in expert order (stable), their weights in bf16, the
    inverse permutation for the scatter, and each block size's tile map as
    triton_kernels' own torch reference computes it."""
    from triton_kernels.routing import compute_expt_data_torch

    p = problem(M=M, E=E, topk=topk)
    inputs = p.inputs(3, "cpu")
    ids, weights = inputs["topk_ids"], inputs["topk_weights"]
    bits = mtk.routing_bits(ids.to(torch.int16), E)
    flat = ids.reshape(-1).long()
    want_bits = torch.zeros(M, triton.cdiv(E, 32), dtype=torch.int64)
    want_bits.scatter_add_(1, ids.long() // 32, torch.ones_like(ids, dtype=torch.int64) << (ids.long() % 32))
    assert torch.equal(bits.view(torch.int32).long() & 0xFFFFFFFF, want_bits)

    data, gather, scatter = mtk.routing(ids, weights, E)
    order = torch.sort(flat, stable=True).indices
    assert torch.equal(data.expt_hist.long(), torch.bincount(flat, minlength=E))
    assert torch.equal(gather.src_indx.long(), order)
    assert torch.equal(gather.dst_indx.long(), torch.argsort(order))
    assert torch.equal(scatter.src_indx, gather.dst_indx) and torch.equal(scatter.dst_indx, gather.src_indx)
    assert torch.equal(data.gate_scal, weights.reshape(-1)[order].to(torch.bfloat16))
    assert (data.n_expts_tot, data.n_expts_act) == (E, topk)
    want = compute_expt_data_torch(data.expt_hist, E, M * topk)
    for block_m in mtk.BLOCK_MS:
        assert torch.equal(data.expt_data.token_offs_pad[block_m], want.token_offs_pad[block_m])
        assert torch.equal(data.expt_data.block_pid_map[block_m], want.block_pid_map[block_m])


def test_unavailable_says_why():
    method = mtk.TritonKernelsMoE()
    assert "MXFP4 weights with gpt-oss's swiglu_oai" in method.unavailable(
        FusedMoE({"M": 1, "E": 8, "topk": 2, "K": 64, "N": 32, "dtype": "bf16"})
    )
    assert "bf16 activations" in method.unavailable(problem(act_dtype="fp16"))
    assert "multiple of 32" in method.unavailable(problem(K=80))
    reason = method.unavailable(problem())
    if isinstance(TK, str):
        assert reason == TK and "just peers" in reason
    elif INTERPRETED:
        assert "not Triton's interpreter" in reason
    assert method.description.startswith("OpenAI's triton_kernels matmul_ogs MoE")


@needs_tk
def test_description_names_the_triton_kernels_found():
    description = mtk.TritonKernelsMoE().description
    assert TK.describe() in description and "3.5.1 API" in description


def _gptoss(M, E=32, **kw):
    return problem(M=M, E=E, topk=4, K=2880, N=2880, **kw)


@GPU
@needs_tk
@pytest.mark.parametrize("M", [1, 8, 128, 1024])
@pytest.mark.parametrize(
    "config",
    [
        {},
        {"w1_split_k": 1, "w2_split_k": 1},
        {"w1_block_m": 64, "w1_num_stages": 3, "w2_block_m": 64, "w2_num_stages": 3},
        {"w1_split_k": 2, "w2_split_k": 4},
    ],
)
def test_gpu_matches_reference(M, config):
    """The whole call (routing, gate/up with the fused SwiGLU, down with the
    scatter) against the problem's MXFP4 reference, at gpt-oss-20b's shape,
    with the heuristic, vLLM's setting, a tuned-like setting and split K."""
    p = _gptoss(M)
    inputs = p.inputs(0, "cuda")
    launch = mtk.TritonKernelsMoE().bind(p, inputs, config)
    with mtk.recorded_opt_flags() as chosen:
        out = launch()
    torch.cuda.synchronize()
    result = compare(out, p.reference(inputs), **TOL)
    assert result["passed"], result
    assert len(chosen) == 2
    for flags, matmul in zip(chosen, mtk.MATMULS):
        for key, value in mtk.constraints_of(config, matmul).items():
            assert getattr(flags, key) == value, (matmul, key, flags)


@GPU
@needs_tk
def test_gpu_graph_replay_keeps_the_constraints():
    """A CUDA graph captured around the call replays the kernels the
    constraints chose, and gives the eager call's output."""
    p = _gptoss(8)
    inputs = p.inputs(0, "cuda")
    launch = mtk.TritonKernelsMoE().bind(p, inputs, {"w1_split_k": 1, "w2_split_k": 2})
    eager = launch().clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    launch.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(launch.out, eager)
