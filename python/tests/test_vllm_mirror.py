"""`fused_moe_vllm` held to vLLM's own kernel, bit for bit.

vLLM's `fused_moe_kernel` (and the helper it calls) is taken from the source
file `just peers` unpacks from vLLM 0.33.0's wheel (.peers/vllm/fused_moe.py):
the two functions are read from the file as written and compiled in a
namespace of their own (vLLM itself is not imported). Each of tunelab's
mirrored GEMMs is checked against it on the same alignment: GEMM 1 (gate
and up with the biases, no activation) and GEMM 2 (times the routing
weights, with the biases), in fp16 under Triton's interpreter without a GPU
and in bf16 and fp16 on a GPU. Skipped where .peers is absent (docs/peers.md).
"""

import ast
import os
import sys
import types

import torch

if not torch.cuda.is_available():  # before triton is imported (conftest does the same)
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tunelab import peers  # noqa: E402
from tunelab.problems.moe import FusedMoE, TritonFusedMoEVllm  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
SOURCE = peers.vllm_fused_moe_source()
needs_source = pytest.mark.skipif(SOURCE is None, reason="no vLLM fused_moe.py in .peers: run `just peers`")
KERNEL_FUNCTIONS = ("write_zeros_to_output", "fused_moe_kernel")
# The name vLLM's kernel source is compiled under (vLLM itself is never imported).
PEER_MODULE = "tunelab_peer_vllm_fused_moe"
TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def vllm_kernel():
    """vLLM's fused_moe_kernel, compiled from its source as the wheel ships it."""
    text = SOURCE.read_text()
    tree = ast.parse(text)
    # A module of its own, registered by name: Triton's code generator reads a
    # called JIT function's `__module__` (a bare exec namespace leaves it None,
    # which compiling for a GPU cannot take; the interpreter never looks).
    module = types.ModuleType(PEER_MODULE)
    module.__file__ = str(SOURCE)
    module.__dict__.update(triton=triton, tl=tl)
    sys.modules[PEER_MODULE] = module
    namespace = module.__dict__
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in KERNEL_FUNCTIONS:
            found[node.name] = node
    missing = set(KERNEL_FUNCTIONS) - set(found)
    assert not missing, f"{SOURCE} has no {sorted(missing)}: vLLM's kernel moved"
    for name in KERNEL_FUNCTIONS:
        node = found[name]
        # The decorators' lines too: Triton reads the function's source.
        first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        code = compile(ast.Module(body=[node], type_ignores=[]), str(SOURCE), "exec")
        assert first >= 1
        exec(code, namespace)
    return namespace["fused_moe_kernel"]


def run_vllm_gemm(
    kernel,
    a,
    b,
    bias,
    c,
    weights,
    launch,
    top_k,
    mul_routed_weight,
    config,
    dtype,
    a_scale=None,
    b_scale=None,
    block_shape=None,
    swap_ab=False,
):
    """One fused_moe_kernel launch with the arguments vLLM 0.33's
    invoke_fused_moe_triton_kernel passes: unquantised weights, or fp8 w8a8
    (`a_scale` per token or per token and K group, `b_scale` per expert or
    per block; per-token scales are vLLM's `per_channel_quant`)."""
    fp8 = b_scale is not None
    EM = launch.sorted_ids.size(0)
    if a.size(0) < config["BLOCK_SIZE_M"]:
        EM = min(EM, a.size(0) * top_k * config["BLOCK_SIZE_M"])
    grid = (triton.cdiv(EM, config["BLOCK_SIZE_M"]) * triton.cdiv(b.size(1), config["BLOCK_SIZE_N"]),)
    rest = {k: v for k, v in config.items() if k != "BLOCK_SIZE_K"}
    rest["SPLIT_K"] = 1
    block_k = config["BLOCK_SIZE_K"] if block_shape is None else min(config["BLOCK_SIZE_K"], *block_shape)
    kernel[grid](
        a,
        b,
        c,
        bias,
        a_scale,
        b_scale,
        weights,
        launch.sorted_ids,
        launch.expert_ids,
        launch.num_post,
        b.size(1),
        b.size(2),
        EM,
        a.size(0) * top_k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(2),
        b.stride(1),
        c.stride(1),
        c.stride(2),
        a_scale.stride(0) if a_scale is not None and a_scale.ndim == 2 else 0,
        a_scale.stride(1) if a_scale is not None and a_scale.ndim == 2 else 0,
        b_scale.stride(0) if b_scale is not None else 0,
        b_scale.stride(2) if b_scale is not None and b_scale.ndim == 3 else 0,
        b_scale.stride(1) if b_scale is not None and b_scale.ndim >= 2 and b_scale.size(1) > 1 else 0,
        bias.stride(0) if bias is not None else 0,
        bias.stride(1) if bias is not None else 0,
        0 if block_shape is None else block_shape[0],
        0 if block_shape is None else block_shape[1],
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        top_k=top_k,
        compute_type=TL_DTYPES[dtype],
        use_fp8_w8a8=fp8,
        use_int8_w8a8=False,
        use_int8_w8a16=False,
        per_channel_quant=fp8 and block_shape is None,
        naive_block_assignment=False,
        HAS_BIAS=bias is not None,
        BLOCK_SIZE_K=block_k,
        SWAP_AB=swap_ab,
        USE_TD=False,
        **rest,
    )


CASES = [
    # (shape fields, config): tails in K and N, the interleaved activation with biases, a larger block.
    # K = 1040 is long enough that another K step (a sum in another order) changes output bits.
    (
        {"M": 16, "E": 4, "topk": 2, "K": 1040, "N": 48, "activation": "silu"},
        {
            "BLOCK_SIZE_M": 16,
            "BLOCK_SIZE_N": 32,
            "BLOCK_SIZE_K": 32,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 2,
        },
    ),
    (
        {"M": 9, "E": 4, "topk": 2, "K": 64, "N": 40, "activation": "swiglu_oai"},
        {
            "BLOCK_SIZE_M": 32,
            "BLOCK_SIZE_N": 64,
            "BLOCK_SIZE_K": 64,
            "GROUP_SIZE_M": 2,
            "num_warps": 4,
            "num_stages": 2,
        },
    ),
]


@needs_source
@pytest.mark.parametrize("dtype", ["fp16"] if INTERPRETED else ["fp16", "bf16"])
@pytest.mark.parametrize("fields,config", CASES)
def test_fused_moe_vllm_gemms_are_vllms_bit_for_bit(fields, config, dtype, device):
    problem = FusedMoE({**fields, "dtype": dtype})
    inputs = problem.inputs(0, device)
    launch = TritonFusedMoEVllm().bind(problem, inputs, config)
    launch()
    kernel = vllm_kernel()
    M, topk, N, K = problem.M, problem.topk, problem.N, problem.K
    dt = problem.dtype
    gate_up = torch.full((M, topk, 2 * N), float("nan"), dtype=dt, device=device)
    run_vllm_gemm(kernel, inputs["x"], inputs["w1"], inputs.get("b1"), gate_up, None, launch, topk, False, config, dt)
    out2 = torch.full((M, topk, K), float("nan"), dtype=dt, device=device)
    run_vllm_gemm(
        kernel, launch.inter, inputs["w2"], inputs.get("b2"), out2, inputs["topk_weights"], launch, 1, True, config, dt
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(gate_up.view(M * topk, 2 * N), launch.gate_up), "GEMM 1 differs from vLLM's"
    assert torch.equal(out2.view(M * topk, K), launch.out2), "GEMM 2 differs from vLLM's"


def test_swap_ab_is_vllms_rule():
    """fused_moe_vllm swaps the operands exactly where vLLM 0.33 does: fp8 w8a8
    (per-tensor or block scales), compute capability 9.0 exactly, BLOCK_SIZE_M
    < 64 and BLOCK_SIZE_N >= 64; never for other weights or GPUs, and a
    config that names SWAP_AB is refused (vLLM raises on it)."""
    from tunelab.kernels import quant_moe

    fp8 = FusedMoE({"M": 4, "E": 8, "topk": 2, "K": 64, "N": 64, "dtype": "fp8", "act_dtype": "fp16"})
    block = FusedMoE(
        {
            "M": 4,
            "E": 8,
            "topk": 2,
            "K": 64,
            "N": 64,
            "dtype": "fp8",
            "act_dtype": "fp16",
            "weight_quant": "block",
            "block_shape": [64, 64],
        }
    )
    mxfp4 = FusedMoE(
        {"M": 4, "E": 8, "topk": 2, "K": 64, "N": 64, "dtype": "mxfp4", "act_dtype": "fp16", "activation": "swiglu_oai"}
    )

    def swapped(problem, bm, bn, capability):
        config = {
            "BLOCK_SIZE_M": bm,
            "BLOCK_SIZE_N": bn,
            "BLOCK_SIZE_K": 64,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 2,
        }
        return quant_moe.make_quant_plan(problem, config, vllm_structure=True, capability=capability).swap_ab

    for problem in (fp8, block):
        assert swapped(problem, 16, 64, (9, 0)) and swapped(problem, 32, 128, (9, 0))
        assert not swapped(problem, 64, 64, (9, 0)) and not swapped(problem, 16, 32, (9, 0))
        assert not swapped(problem, 16, 64, (10, 0)) and not swapped(problem, 16, 64, (8, 9))
        # None: the GPU this runs on (none under the interpreter).
        assert swapped(problem, 16, 64, None) == (quant_moe.current_capability() == (9, 0))
    assert not swapped(mxfp4, 16, 64, (9, 0))
    with pytest.raises(ValueError, match="decides SWAP_AB itself"):
        quant_moe.make_quant_plan(
            fp8,
            {
                "BLOCK_SIZE_M": 16,
                "BLOCK_SIZE_N": 64,
                "BLOCK_SIZE_K": 64,
                "GROUP_SIZE_M": 1,
                "num_warps": 4,
                "num_stages": 2,
                "SWAP_AB": 0,
            },
            vllm_structure=True,
        )
    # Not under tunelab's own call, where SWAP_AB is the config's.
    assert not quant_moe.make_quant_plan(
        fp8,
        {
            "BLOCK_SIZE_M": 16,
            "BLOCK_SIZE_N": 64,
            "BLOCK_SIZE_K": 64,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 2,
        },
        capability=(9, 0),
    ).swap_ab


def test_vllm_default_config_is_vllm_033s():
    """get_default_config of vLLM 0.33 (docs/quantisation.md): fp8 per-tensor
    takes BLOCK_SIZE_K 128 past M=64, block fp8 its own rule."""
    from tunelab.problems.moe import vllm_default_config

    assert vllm_default_config(256, 32)["BLOCK_SIZE_K"] == 64
    assert vllm_default_config(256, 32, fp8=True)["BLOCK_SIZE_K"] == 128
    assert vllm_default_config(1, 32, fp8=True) == vllm_default_config(1, 32)
    assert vllm_default_config(4, 8, (128, 128)) == {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 4,
    }
    assert vllm_default_config(32, 8, (128, 128)) == {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 32,
        "num_warps": 4,
        "num_stages": 3,
    }
    assert vllm_default_config(100, 8, (128, 128))["BLOCK_SIZE_M"] == 64


FP8_CASES = [
    # (weight fields, config, GPU capability for vLLM's SWAP_AB rule): per-tensor and block scales,
    # each with and without the swap (BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64 on 9.0).
    (
        {"weight_quant": "per_tensor"},
        {
            "BLOCK_SIZE_M": 16,
            "BLOCK_SIZE_N": 64,
            "BLOCK_SIZE_K": 64,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 2,
        },
        (9, 0),
    ),
    (
        {"weight_quant": "per_tensor"},
        {
            "BLOCK_SIZE_M": 16,
            "BLOCK_SIZE_N": 32,
            "BLOCK_SIZE_K": 64,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 2,
        },
        (9, 0),
    ),
    (
        {"weight_quant": "block", "block_shape": [64, 64]},
        {
            "BLOCK_SIZE_M": 32,
            "BLOCK_SIZE_N": 64,
            "BLOCK_SIZE_K": 128,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 2,
        },
        (9, 0),
    ),
    (
        {"weight_quant": "block", "block_shape": [64, 64]},
        {
            "BLOCK_SIZE_M": 64,
            "BLOCK_SIZE_N": 64,
            "BLOCK_SIZE_K": 64,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 2,
        },
        (9, 0),
    ),
]


@needs_source
@pytest.mark.parametrize("fields,config,capability", FP8_CASES)
def test_fp8_gemms_are_vllms_bit_for_bit(fields, config, capability, device):
    """fp8 w8a8 in vLLM's call: each GEMM on the activations tunelab
    quantised (vLLM quantises them with a CUDA op of its own, which this test
    does not run), against vLLM's kernel with the same scales, SWAP_AB as
    vLLM's rule sets it for a GPU of this capability (on a GPU, the GPU's own
    capability), and block scales' K step clamped as vLLM clamps it."""
    from tunelab.kernels import quant_moe

    if device.type == "cuda":
        capability = tuple(torch.cuda.get_device_capability())
    act = "fp16" if INTERPRETED else "bf16"
    problem = FusedMoE(
        {
            "M": 13,
            "E": 4,
            "topk": 2,
            "K": 1024,
            "N": 64,
            "activation": "silu",
            "dtype": "fp8",
            "act_dtype": act,
            **fields,
        }
    )
    inputs = problem.inputs(0, device)
    plan = quant_moe.make_quant_plan(problem, config, vllm_structure=True, capability=capability)
    launch = quant_moe.QuantMoELaunch(plan, inputs)
    launch()
    kernel = vllm_kernel()
    M, topk, N, K = problem.M, problem.topk, problem.N, problem.K
    dt = problem.dtype
    block = list(problem.block_shape) if problem.block_shape else None
    w1s, w2s = inputs["w1_scale"], inputs["w2_scale"]
    xs = launch.xs if block else launch.xs.view(M, -1)
    gate_up = torch.full((M, topk, 2 * N), float("nan"), dtype=dt, device=device)
    run_vllm_gemm(
        kernel,
        launch.xq,
        inputs["w1"],
        inputs.get("b1"),
        gate_up,
        None,
        launch,
        topk,
        False,
        config,
        dt,
        a_scale=xs,
        b_scale=w1s,
        block_shape=block,
        swap_ab=plan.swap_ab,
    )
    out2 = torch.full((M, topk, K), float("nan"), dtype=dt, device=device)
    run_vllm_gemm(
        kernel,
        launch.interq,
        inputs["w2"],
        inputs.get("b2"),
        out2,
        inputs["topk_weights"],
        launch,
        1,
        True,
        config,
        dt,
        a_scale=launch.inters,
        b_scale=w2s,
        block_shape=block,
        swap_ab=plan.swap_ab,
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(gate_up.view(M * topk, 2 * N), launch.gate_up), "GEMM 1 differs from vLLM's"
    assert torch.equal(out2.view(M * topk, K), launch.out2), "GEMM 2 differs from vLLM's"
