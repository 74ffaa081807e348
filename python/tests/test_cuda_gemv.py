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
carries over from launch to launch.
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


def _compile(timeline, nvrtc, name: str, arch: str) -> tuple[bytes, str, str]:
    """(cubin, lowered name, ptxas's report) of one instance."""
    prog = ctypes.c_void_p()
    source = timeline.SOURCE.read_bytes()
    timeline.check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, b"mxfp4_moe_gemv.cu", 0, None, None))
    timeline.check(nvrtc.nvrtcAddNameExpression(prog, name.encode()))
    opts = [f"-arch={arch}".encode(), b"-std=c++17", b"--ptxas-options=-v"]
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    assert status == 0, f"NVRTC failed for {name}:\n{log.value.decode()}"
    lowered = ctypes.c_char_p()
    timeline.check(nvrtc.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(lowered)))
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    timeline.check(nvrtc.nvrtcGetCUBIN(prog, cubin))
    return cubin.raw, lowered.value.decode(), log.value.decode()


@pytest.mark.parametrize("instance", [
    (3, 3, 4, 4, 3, 2, 1, 0),  # gpt-oss N=2880: GEMM 2 written once, staged
    (3, 1, 4, 4, 4, 3, 0, 1),  # N=360: two copies, read in place, fp16
    (1, 1, 2, 8, 2, 2, 0, 0),  # short rows, topk 2, 8 warps
])
def test_the_kernel_compiles_within_its_register_bound(timeline, instance):
    nvrtc = _nvrtc(timeline)
    _, _, log = _compile(timeline, nvrtc, _name(*instance), "sm_90")
    used = re.search(r"Used (\d+) registers", log)
    assert used, log
    warps, per_sm = instance[3], instance[4]
    # __launch_bounds__(32 * WARPS, BLOCKS_PER_SM): every block resident, as the grid barrier needs.
    assert int(used.group(1)) * 32 * warps * per_sm <= 65536, log


def _gpu_arch():
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return None
    props = torch.cuda.get_device_properties(0)
    return f"sm_{props.major}{props.minor}" if props.major >= 9 else None


gpu_only = pytest.mark.skipif(_gpu_arch() is None, reason="needs an NVIDIA GPU of compute capability 9.0 or newer")


@gpu_only
@pytest.mark.parametrize("shape", [
    dict(M=1, E=8, K=2880, N=2880),
    dict(M=2, E=8, K=2880, N=360),
    dict(M=2, E=6, K=1000, N=200),  # padded K groups, a tail group past N
    dict(M=1, E=6, K=1000, N=200, act_dtype="fp16"),
])
@pytest.mark.parametrize("stages,stage2", [(2, 1), (3, 0)])
def test_the_kernel_matches_the_reference(timeline, shape, stages, stage2):
    from tunelab.compare import compare
    from tunelab.problems import resolve

    nvrtc = _nvrtc(timeline)
    arch = _gpu_arch()
    shape = {"topk": 4, "dtype": "mxfp4", "act_dtype": "bf16", "activation": "swiglu_oai", **shape}
    M, K, N, topk = shape["M"], shape["K"], shape["N"], shape["topk"]
    problem = resolve("moe")(shape)
    inputs = problem.inputs(0, "cuda")
    reference = problem.reference(inputs)
    out = torch.empty_like(reference)
    names = ("x", "topk_ids", "topk_weights", "w1_pairs", "w1_scale", "w2_pairs", "w2_scale", "b1", "b2")
    args = [("p", inputs[n].data_ptr()) for n in names] + [("p", out.data_ptr()), ("i", M), ("i", N), ("i", K)]
    warps, per_sm = 4, 3
    gpl1, gpl2 = -(-K // 1024), -(-N // 1024)
    fp16 = 1 if shape["act_dtype"] == "fp16" else 0
    cubin, symbol, _ = _compile(timeline, nvrtc, _name(gpl1, gpl2, topk, warps, per_sm, stages, stage2, fp16), arch)
    # The manifest's shared_mem.
    smem = max(M * -(-K // 32) * 80 + warps * stages * (1088 * gpl1 + 32), M * topk * -(-N // 32) * 80)
    cuda = ctypes.CDLL("libcuda.so.1")
    torch.cuda.synchronize()
    kernel = timeline.Kernel(cuda, cubin, symbol, None, smem)
    stream = torch.cuda.current_stream().cuda_stream
    grid = torch.cuda.get_device_properties(0).multi_processor_count * per_sm
    for launch in range(2):
        out.fill_(float("nan"))
        kernel.launch(grid, 32 * warps, args, stream)
        torch.cuda.synchronize()
        verdict = compare(out, reference, **TOLERANCE)
        assert verdict["passed"], (launch, {k: v for k, v in verdict.items() if k != "mismatch"})
