"""The builtin gemm problem and its Triton kernel, through the Method/Launch interface.

Shapes are tiny because Triton's interpreter is slow; they are chosen so that
edges are masked (sizes that are not multiples of the block), there are
several tiles in each direction, and the last GROUP_SIZE_M band is short.
bf16 is left out: the interpreter's bf16 arithmetic is not trustworthy.
"""

import pytest
import torch

from conftest import INTERPRET
from tunelab.compare import compare
from tunelab.problems import resolve
from tunelab.problems.gemm import Gemm

BLOCK16 = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 16,
    "BLOCK_SIZE_K": 16,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 2,
}

# What the check would accept: the ones the runner defaults to.
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "max_mismatch": 0.0}


def run_method(problem, method_name, config, device, seed=0):
    """Bind, poison, launch once and compare, as the worker's check does."""
    inputs = problem.inputs(seed, device)
    launch = problem.methods()[method_name].bind(problem, inputs, config)
    launch.out.fill_(float("nan"))
    launch()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return launch.out, compare(launch.out, problem.reference(inputs), **TOLERANCE)


def test_builtin_name_resolves_to_gemm():
    assert resolve("gemm") is Gemm


def test_flops_and_bytes():
    problem = Gemm({"M": 64, "N": 32, "K": 16, "dtype": "fp16"})
    assert problem.flops() == 2 * 64 * 32 * 16
    assert problem.bytes() == (64 * 16 + 16 * 32 + 64 * 32) * 2
    assert Gemm({"M": 64, "N": 32, "K": 16, "dtype": "fp32"}).bytes() == (64 * 16 + 16 * 32 + 64 * 32) * 4


def test_methods_are_named_for_describe():
    assert sorted(Gemm({"M": 1, "N": 1, "K": 1, "dtype": "fp16"}).methods()) == [
        "matmul",
        "matmul_a8w8_blockscale",
        "torch_matmul",
    ]


@pytest.mark.parametrize(
    "shape",
    [
        {"M": 0, "N": 4, "K": 4, "dtype": "fp16"},
        {"N": 4, "K": 4, "dtype": "fp16"},
        {"M": 4, "N": 4, "K": 4, "dtype": "int8"},
    ],
)
def test_bad_shapes_are_rejected(shape):
    with pytest.raises(ValueError):
        Gemm(shape)


def test_inputs_are_deterministic_in_seed(device):
    problem = Gemm({"M": 8, "N": 8, "K": 16, "dtype": "fp16"})
    first, again, other = problem.inputs(1, device), problem.inputs(1, device), problem.inputs(2, device)
    assert torch.equal(first["a"], again["a"]) and torch.equal(first["b"], again["b"])
    assert not torch.equal(first["a"], other["a"])
    assert first["a"].dtype == torch.float16 and first["a"].shape == (8, 16) and first["b"].shape == (16, 8)


def test_reference_is_fp32_and_of_order_one(device):
    problem = Gemm({"M": 32, "N": 32, "K": 256, "dtype": "fp16"})
    ref = problem.reference(problem.inputs(0, device))
    assert ref.dtype == torch.float32
    # Inputs are scaled by K**-0.25, so C ~ N(0, 1) at any K.
    assert 0.5 < ref.std().item() < 2.0


@pytest.mark.parametrize(
    "shape, config",
    [
        ({"M": 32, "N": 32, "K": 32, "dtype": "fp16"}, BLOCK16),
        # Ragged edges in M, N and K; three tile rows in bands of two.
        ({"M": 40, "N": 33, "K": 20, "dtype": "fp32"}, {**BLOCK16, "GROUP_SIZE_M": 2}),
        ({"M": 40, "N": 33, "K": 20, "dtype": "fp16"}, {**BLOCK16, "GROUP_SIZE_M": 8, "BLOCK_SIZE_N": 32}),
    ],
)
def test_triton_matmul_matches_reference(shape, config, device):
    problem = Gemm(shape)
    out, result = run_method(problem, "matmul", config, device)
    # Every tile written (no poison left) and every element within tolerance.
    assert result["nan_count"] == 0
    assert result["passed"], result
    assert out.dtype == problem.dtype and out.shape == (shape["M"], shape["N"])


def test_triton_matmul_ignores_unknown_config_keys(device):
    problem = Gemm({"M": 16, "N": 16, "K": 16, "dtype": "fp32"})
    _, result = run_method(problem, "matmul", {**BLOCK16, "smem_bytes": 4096}, device)
    assert result["passed"], result


def test_triton_matmul_names_a_missing_config_key(device):
    problem = Gemm({"M": 16, "N": 16, "K": 16, "dtype": "fp32"})
    inputs = problem.inputs(0, device)
    with pytest.raises(ValueError, match="BLOCK_SIZE_K"):
        problem.methods()["matmul"].bind(problem, inputs, {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16})


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_torch_matmul_matches_reference(dtype, device):
    problem = Gemm({"M": 24, "N": 40, "K": 48, "dtype": dtype})
    out, result = run_method(problem, "torch_matmul", {}, device)
    assert result["passed"], result
    assert out.dtype == problem.dtype


@pytest.mark.skipif(INTERPRET, reason="bf16 in Triton's interpreter is not trustworthy")
def test_triton_matmul_bf16_on_gpu(device):
    problem = Gemm({"M": 200, "N": 136, "K": 72, "dtype": "bf16"})
    config = {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 32,
        "GROUP_SIZE_M": 4,
        "num_warps": 4,
        "num_stages": 3,
    }
    _, result = run_method(problem, "matmul", config, device)
    assert result["passed"], result


def test_compile_is_a_noop_in_the_interpreter_and_compiles_on_gpu():
    problem = Gemm({"M": 64, "N": 64, "K": 64, "dtype": "fp16"})
    compiled = problem.methods()["matmul"].compile(problem, BLOCK16)
    assert compiled is (not INTERPRET)


@pytest.mark.skipif(INTERPRET, reason="needs a GPU: the interpreter compiles nothing")
def test_compile_fills_the_cache_entry_the_launch_uses(device):
    # compile_only passes dtypes for tensors; if Triton specialised them
    # differently from real tensors, the first timed-job launch would compile a
    # second kernel and the compile pool's work would be wasted.
    from tunelab.kernels import matmul

    config = {
        "BLOCK_SIZE_M": 32,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 32,
        "GROUP_SIZE_M": 4,
        "num_warps": 4,
        "num_stages": 3,
    }
    problem = Gemm({"M": 96, "N": 80, "K": 48, "dtype": "fp16"})
    assert problem.methods()["matmul"].compile(problem, config)
    caches = getattr(matmul.matmul_kernel, "device_caches", None)
    if caches is None:
        pytest.skip("this Triton keeps its kernel cache elsewhere")
    kernels = caches[torch.cuda.current_device()][0]
    before = len(kernels)
    _, result = run_method(problem, "matmul", config, device)
    assert result["passed"], result
    assert len(kernels) == before, "the launch compiled a kernel that compile() had not"


@pytest.mark.skipif(INTERPRET, reason="direct launch is GPU-only")
def test_direct_and_jit_launch_agree(device):
    from tunelab.kernels.matmul import make_launcher

    a = torch.randn(300, 200, device=device, dtype=torch.float16)
    b = torch.randn(200, 100, device=device, dtype=torch.float16)
    config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 4}
    outs = []
    for direct in (True, False):
        c = torch.full((300, 100), float("nan"), device=device, dtype=torch.float16)
        make_launcher(a, b, c, config, direct=direct)()
        outs.append(c)
    assert torch.equal(outs[0], outs[1])
    assert not torch.isnan(outs[0]).any()


# ---- fp8 a8w8 block-scale

A8W8 = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 32,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 2,
    "NUM_KSPLIT": 1,
    "num_warps": 4,
    "num_stages": 2,
}


def fp8_gemm(**kw):
    # fp16 C under the interpreter (its bf16 is not trustworthy); bf16, the default, on a GPU.
    base = {"M": 33, "N": 130, "K": 300, "dtype": "fp8", "out_dtype": "fp16" if INTERPRET else "bf16"}
    return Gemm(dict(base, **kw))


@pytest.mark.parametrize("split,block_k", [(1, 64), (3, 128), (8, 32)])
def test_a8w8_blockscale_matches_reference(split, block_k, device):
    # K=300: a partial last scale block (300 = 2 x 128 + 44) and K-step tails; N=130: a partial block row.
    out, result = run_method(
        fp8_gemm(), "matmul_a8w8_blockscale", dict(A8W8, NUM_KSPLIT=split, BLOCK_SIZE_K=block_k), device
    )
    assert result["passed"] and result["nan_count"] == 0, result
    assert out.dtype == (torch.float16 if INTERPRET else torch.bfloat16)


def test_a8w8_inputs_and_scales(device):
    p = fp8_gemm(M=3, N=200, K=256, block_shape=[64, 128])
    inputs = p.inputs(0, device)
    assert inputs["a"].dtype == inputs["w"].dtype == torch.float8_e4m3fn
    assert inputs["a"].shape == (3, 256) and inputs["w"].shape == (200, 256)
    assert inputs["a_scale"].shape == (3, 2) and inputs["w_scale"].shape == (4, 2)
    # Each scale is its block's amax over 448: the block's largest value is 448 in fp8.
    assert inputs["w"][64:128, 128:].float().abs().max() == 448.0
    assert p.bytes() == 3 * 256 + 200 * 256 + 4 * (3 * 2 + 4 * 2) + 3 * 200 * 2
    assert p.flops() == 2 * 3 * 200 * 256


def test_a8w8_errors_and_availability(device):
    p = fp8_gemm()
    methods = p.methods()
    assert methods["matmul"].unavailable(p) and methods["torch_matmul"].unavailable(p)
    assert methods["matmul_a8w8_blockscale"].unavailable(p) is None
    plain = Gemm({"M": 4, "N": 4, "K": 4, "dtype": "fp16"})
    assert "fp8 operands" in methods["matmul_a8w8_blockscale"].unavailable(plain)
    with pytest.raises(ValueError, match="divide the scale block's K"):
        methods["matmul_a8w8_blockscale"].bind(p, p.inputs(0, device), dict(A8W8, BLOCK_SIZE_K=256))
    for shape, message in (
        ({"weight_quant": "per_tensor"}, "block scales"),
        ({"block_shape": [128, 96]}, "power of two"),
        ({"out_dtype": "fp8"}, "out_dtype"),
    ):
        with pytest.raises(ValueError, match=message):
            fp8_gemm(**shape)
    with pytest.raises(ValueError, match="is for dtype fp8"):
        Gemm({"M": 4, "N": 4, "K": 4, "dtype": "bf16", "block_shape": [128, 128]})


def test_a8w8_split_k_partials_cover_k_once():
    from tunelab.kernels.matmul_a8w8 import k_per_split

    # 300 columns in K steps of 64: 5 steps; 3 splits take 2, 2 and 1 steps.
    assert k_per_split(300, 64, 3) == 128
    # More splits than steps: one step each, and the splits past K are not launched.
    assert k_per_split(100, 64, 8) == 64
