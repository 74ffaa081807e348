"""The CUDA C++ one-launch MXFP4 MoE kernel (experiments/kernels/mxfp4_moe_gemv.cu,
method `cuda_gemv` of experiments/gptoss-mxfp4.yaml).

Without a GPU: NVRTC (the wheel torch installs) compiles the kernel for sm_90
at template instances that cover its code paths: GEMM 2 written once or
twice (TOPK * GPL2 >= 12 or not), 2 and 3 ring stages, GEMM 2's activations
staged or read in place, bf16 and fp16 activations. With an NVIDIA GPU of
compute capability 9.0 or newer: the kernel launched through the driver on the
`moe` problem's own inputs (pair-order weights) and compared with the
problem's reference under the manifest's tolerance, at shapes the gpt-oss
runs do not reach: two tokens (M * topk = 8, two GEMM 1 tokens a grid),
K and N that are not multiples of 32 (padded groups, a tail group in GEMM 2),
and fp16 activations; each config launched twice, as the barrier's counter
carries over from launch to launch; a shorter N after a launch whose output
was NaN, in the same module (GEMM 2 reads whole groups of GEMM 1's output
past N); and a group of activations too small to scale by a float.
"""

import ctypes
import re

import pytest
import torch

from conftest import load_bench

TOLERANCE = dict(atol=2e-2, rtol=2e-2, max_mismatch=0.005)  # experiments/gptoss-mxfp4.yaml


@pytest.fixture(scope="module")
def timeline():
    return load_bench("mxfp4_cuda_timeline")


def _nvrtc(timeline):
    try:
        return timeline.nvrtc_library()
    except SystemExit as exc:  # no NVRTC wheel next to torch
        pytest.skip(str(exc))


def _name(gpl1, gpl2, topk, warps, per_sm, stages, stage2, fp16):
    return f"mxfp4_moe_gemv<{gpl1}, {gpl2}, {topk}, {warps}, {per_sm}, {stages}, {stage2}, {fp16}>"


def _compile(timeline, name: str, arch: str) -> tuple[bytes, str, str]:
    """(cubin, lowered name, NVRTC's log with ptxas's report) of one instance."""
    cubin, symbol, _, log = timeline.compile_cubin(
        _nvrtc(timeline), timeline.SOURCE, name, arch, [], options=("--ptxas-options=-v",)
    )
    return cubin, symbol, log


@pytest.mark.parametrize(
    "instance",
    [
        (3, 3, 4, 4, 3, 2, 1, 0),  # gpt-oss N=2880: GEMM 2 written once, staged
        (3, 1, 4, 4, 4, 3, 0, 1),  # N=360: two copies, read in place, fp16
        (1, 1, 2, 8, 2, 2, 0, 0),  # short rows, topk 2, 8 warps
    ],
)
def test_the_kernel_compiles_within_its_register_bound(timeline, instance):
    _, _, log = _compile(timeline, _name(*instance), "sm_90")
    used = re.search(r"Used (\d+) registers", log)
    if used is None:  # seen on a GPU host: a second compile of the same source reported nothing
        pytest.skip("compiled; NVRTC's log has no ptxas statistics, so the registers are not checked")
    warps, per_sm = instance[3], instance[4]
    # __launch_bounds__(32 * WARPS, BLOCKS_PER_SM): every block resident, as the grid barrier needs.
    assert int(used.group(1)) * 32 * warps * per_sm <= 65536, log


def _gpu_arch():
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return None
    props = torch.cuda.get_device_properties(0)
    return f"sm_{props.major}{props.minor}" if props.major >= 9 else None


gpu_only = pytest.mark.skipif(_gpu_arch() is None, reason="needs an NVIDIA GPU of compute capability 9.0 or newer")


class _Launch:
    """One template instance loaded once (one module: its globals persist
    from launch to launch), launched on a shape's inputs."""

    def __init__(self, timeline, instance, smem):
        cubin, symbol, _ = _compile(timeline, _name(*instance), _gpu_arch())
        torch.cuda.synchronize()
        self.kernel = timeline.Kernel(ctypes.CDLL("libcuda.so.1"), cubin, symbol, None, smem)
        self.timeline = timeline
        self.warps, self.per_sm = instance[3], instance[4]

    def __call__(self, inputs, out, M, N, K):
        args = self.timeline.kernel_args(inputs, out, M, N, K)
        grid = torch.cuda.get_device_properties(0).multi_processor_count * self.per_sm
        out.fill_(float("nan"))
        self.kernel.launch(grid, 32 * self.warps, args, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()


def _problem(**shape):
    from tunelab.problems import resolve

    shape = {"topk": 4, "dtype": "mxfp4", "act_dtype": "bf16", "activation": "swiglu_oai", **shape}
    problem = resolve("moe")(shape)
    inputs = problem.inputs(0, "cuda")
    return shape, inputs, problem.reference(inputs), problem


@gpu_only
@pytest.mark.parametrize(
    "shape",
    [
        dict(M=1, E=8, K=2880, N=2880),
        dict(M=2, E=8, K=2880, N=360),
        dict(M=2, E=6, K=1000, N=200),  # padded K groups, a tail group past N
        dict(M=1, E=6, K=1000, N=200, act_dtype="fp16"),
    ],
)
@pytest.mark.parametrize("stages,stage2", [(2, 1), (3, 0)])
def test_the_kernel_matches_the_reference(timeline, shape, stages, stage2):
    from tunelab.compare import compare

    shape, inputs, reference, _ = _problem(**shape)
    M, K, N, topk = shape["M"], shape["K"], shape["N"], shape["topk"]
    warps, per_sm = 4, 3
    fp16 = 1 if shape["act_dtype"] == "fp16" else 0
    instance = (-(-K // 1024), -(-N // 1024), topk, warps, per_sm, stages, stage2, fp16)
    launch = _Launch(timeline, instance, timeline.shared_mem_bytes(M, K, N, topk, warps, stages, stage2))
    out = torch.empty_like(reference)
    for attempt in range(2):
        launch(inputs, out, M, N, K)
        verdict = compare(out, reference, **TOLERANCE)
        assert verdict["passed"], (attempt, {k: v for k, v in verdict.items() if k != "mismatch"})


@gpu_only
@pytest.mark.parametrize("stage2", [0, 1])
def test_a_shorter_n_after_a_nan_reads_nothing_left_past_n(timeline, stage2):
    # One module for N=1000 and N=200 (both one group a lane): the first
    # launch, with gate biases of -inf, leaves NaN in GEMM 1's output up to
    # column 1000 (the SiLU of -inf divides -inf by inf); the second must not
    # read the NaN past its N=200.
    from tunelab.compare import compare

    M, K, topk, warps, per_sm, stages = 1, 1000, 4, 4, 3, 2
    _, long_inputs, _, _ = _problem(M=M, E=6, K=K, N=1000)
    _, inputs, reference, _ = _problem(M=M, E=6, K=K, N=200)
    smem = timeline.shared_mem_bytes(M, K, 1000, topk, warps, stages, stage2)
    launch = _Launch(timeline, (1, 1, topk, warps, per_sm, stages, stage2, 0), smem)
    b1 = long_inputs["b1"].clone()
    b1[:, 0::2] = float("-inf")  # interleaved: even rows are the gates'
    long_inputs = dict(long_inputs, b1=b1)
    long_out = torch.empty(M, K, dtype=long_inputs["x"].dtype, device="cuda")
    launch(long_inputs, long_out, M, 1000, K)
    assert long_out.isnan().any()  # the poison is in place
    out = torch.empty_like(reference)
    launch(inputs, out, M, 200, K)
    verdict = compare(out, reference, **TOLERANCE)
    assert verdict["passed"], {k: v for k, v in verdict.items() if k != "mismatch"}


@gpu_only
def test_a_group_of_tiny_activations_stays_in_range(timeline):
    # A 32-value group whose largest value is 1e-36 (about 2^-120): scaling it
    # into [2^14, 2^15) would take 2^134, past a float; the kernel stops at
    # 2^127 (the values then stay below 2^15).
    from tunelab.compare import compare

    M, K, N, topk, warps, per_sm, stages = 1, 1000, 200, 4, 4, 3, 2
    _, inputs, _, problem = _problem(M=M, E=6, K=K, N=N)
    x = inputs["x"].clone()
    x[0, :32] = 1e-36
    inputs = dict(inputs, x=x)
    reference = problem.reference(inputs)
    smem = timeline.shared_mem_bytes(M, K, N, topk, warps, stages, 1)
    launch = _Launch(timeline, (1, 1, topk, warps, per_sm, stages, 1, 0), smem)
    out = torch.empty_like(reference)
    launch(inputs, out, M, N, K)
    verdict = compare(out, reference, **TOLERANCE)
    assert verdict["passed"], {k: v for k, v in verdict.items() if k != "mismatch"}
