"""The CUDA C++ one-launch bf16/fp16 MoE kernel (experiments/kernels/moe_gemv.cu,
method `cuda_gemv` of experiments/gptoss.yaml).

Without a GPU: NVRTC (the wheel torch installs) compiles the kernel for sm_90
at template instances that cover its code paths (SiLU and gpt-oss's SwiGLU,
bf16 and fp16, GEMM 2's rows asked for first or last, 4 to 16 warps) within
the registers one block an SM leaves a thread. With an NVIDIA GPU of compute
capability 9.0 or newer: the kernel launched through the driver on the `moe`
problem's own inputs and compared with the problem's reference under the
manifest's tolerance, at gpt-oss's shapes and at shapes the gpt-oss runs do
not reach: rings refilled many times (one or two stages), chunks that cross
from one slot to the next, two tokens, gpt-oss's SwiGLU with biases, fp16,
K and N that are not multiples of 256; each launched twice, as the barrier's
counter carries over from launch to launch.
"""

import ctypes
import re

import pytest
import torch

from conftest import load_bench

TOLERANCE = dict(atol=2e-2, rtol=2e-2, max_mismatch=0.005)  # experiments/gptoss.yaml
SOURCE_NAME = "moe_gemv.cu"


@pytest.fixture(scope="module")
def timeline():
    return load_bench("mxfp4_cuda_timeline")  # NVRTC and driver helpers


def _source(timeline):
    return timeline.SOURCE.parent / SOURCE_NAME


def _nvrtc(timeline):
    try:
        return timeline.nvrtc_library()
    except SystemExit as exc:  # no NVRTC wheel next to torch
        pytest.skip(str(exc))


def _ceil_div(a, b):
    return -(-a // b)


def _instance(M, K, N, topk, warps, chunk, stages, act, fp16, w2_late):
    """The manifest's template arguments."""
    return (topk, warps, chunk, stages, _ceil_div(K, 256), _ceil_div(topk * N, 256), act, fp16, w2_late)


def _name(instance):
    return f"moe_gemv<{', '.join(str(v) for v in instance)}>"


def shared_mem_bytes(M, K, N, topk, chunk, stages, sms):
    """experiments/gptoss.yaml's `shared_mem` for `cuda_gemv` on `sms` SMs."""
    units_max, rows_max = _ceil_div(M * topk * N, sms), _ceil_div(K, sms)
    return (384 + 16 * _ceil_div(4 * (2 * units_max + M * rows_max), 16) + 16 * _ceil_div(2 * M * K, 16)
            + 2 * M * topk * rows_max * N + 4 * stages * chunk * K)


def _compile(timeline, name: str, arch: str) -> tuple[bytes, str, str]:
    cubin, symbol, _, log = timeline.compile_cubin(_nvrtc(timeline), _source(timeline), name, arch, [],
                                                   options=("--ptxas-options=-v",))
    return cubin, symbol, log


@pytest.mark.parametrize("instance", [
    _instance(1, 2880, 360, 4, 8, 1, 12, 0, 0, 0),   # gpt-oss-120b TP8, M=1: everything in flight
    _instance(2, 2880, 360, 4, 16, 2, 4, 0, 0, 1),   # two tokens, a refilled ring, w2 last
    _instance(1, 1000, 200, 2, 4, 1, 2, 1, 1, 0),    # SwiGLU, fp16, short rows
])
def test_the_kernel_compiles_for_one_block_an_sm(timeline, instance):
    _, symbol, log = _compile(timeline, _name(instance), "sm_90")
    assert symbol.startswith("_Z8moe_gemv")
    used = re.search(r"Used (\d+) registers", log)
    if used is None:  # seen on a GPU host: a second compile of the same source reported nothing
        pytest.skip("compiled; NVRTC's log has no ptxas statistics, so the registers are not checked")
    warps = instance[1]
    # __launch_bounds__(32 * WARPS, 1): the one block an SM the grid barrier needs.
    assert int(used.group(1)) * 32 * warps <= 65536, log


def _gpu_arch():
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return None
    props = torch.cuda.get_device_properties(0)
    return f"sm_{props.major}{props.minor}" if props.major >= 9 else None


gpu_only = pytest.mark.skipif(_gpu_arch() is None, reason="needs an NVIDIA GPU of compute capability 9.0 or newer")


def _problem(**shape):
    from tunelab.problems import resolve

    shape = {"topk": 4, "dtype": "bf16", "activation": "silu", **shape}
    problem = resolve("moe")(shape)
    inputs = problem.inputs(0, "cuda")
    return shape, inputs, problem.reference(inputs)


def _launch(timeline, shape, inputs, out, warps, chunk, stages, w2_late, smem=None):
    M, K, N, topk = shape["M"], shape["K"], shape["N"], shape["topk"]
    act = 1 if shape["activation"] == "swiglu_oai" else 0
    fp16 = 1 if shape["dtype"] == "fp16" else 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if smem is None:
        smem = shared_mem_bytes(M, K, N, topk, chunk, stages, sms)
    cubin, symbol, _ = _compile(timeline, _name(_instance(M, K, N, topk, warps, chunk, stages, act, fp16, w2_late)),
                                _gpu_arch())
    torch.cuda.synchronize()
    kernel = timeline.Kernel(ctypes.CDLL("libcuda.so.1"), cubin, symbol, None, smem)
    bias = [("p", inputs[n].data_ptr() if n in inputs else 0) for n in ("b1", "b2")]
    args = ([("p", inputs[n].data_ptr()) for n in ("x", "topk_ids", "topk_weights", "w1", "w2")] + bias
            + [("p", out.data_ptr()), ("i", M), ("i", N), ("i", K)])
    return lambda: kernel.launch(sms, 32 * warps, args, torch.cuda.current_stream().cuda_stream)


@gpu_only
@pytest.mark.parametrize("shape,config", [
    (dict(M=1, E=128, K=2880, N=360), (8, 1, 12, 0)),   # the goal's shape, every byte asked for at once
    (dict(M=1, E=32, K=2880, N=720), (8, 2, 4, 1)),     # a refilled ring, w2 last
    (dict(M=2, E=128, K=2880, N=360), (16, 2, 4, 0)),   # two tokens
    (dict(M=1, E=8, K=2880, N=360), (4, 4, 1, 0)),      # one stage: every chunk waits for the one before
    (dict(M=2, E=6, K=1000, N=200, activation="swiglu_oai"), (4, 3, 2, 1)),  # biases, interleaved, chunks across slots
    (dict(M=1, E=6, K=1000, N=200, dtype="fp16"), (8, 1, 2, 0)),
])
def test_the_kernel_matches_the_reference(timeline, shape, config):
    from tunelab.compare import compare

    shape, inputs, reference = _problem(**shape)
    out = torch.empty_like(reference)
    launch = _launch(timeline, shape, inputs, out, *config)
    for attempt in range(2):
        out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        verdict = compare(out, reference, **TOLERANCE)
        assert verdict["passed"], (attempt, {k: v for k, v in verdict.items() if k != "mismatch"})
