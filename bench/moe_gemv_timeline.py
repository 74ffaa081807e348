"""Where the one-launch CUDA C++ bf16 MoE kernel's time goes: a timeline.

Compiles experiments/kernels/moe_gemv.cu with NVRTC (the wheel torch
installs), once as it ships and once with -DTRACE=1 (a %globaltimer stamp per
warp at each phase), loads both through the CUDA driver (ctypes) into torch's
context and launches them on the `moe` problem's own inputs
(tunelab.problems.moe, bf16, SiLU), the output checked against the problem's
reference with experiments/gptoss.yaml's tolerance. Cold as the runner times
by default: L2 flushed by reading a 256 MiB buffer before each launch, an
event pair around the launch; the median of --runs. Beside it, the same
timer around a one-element add (the launch and timer floor).

    PYTHONPATH=python python3 bench/moe_gemv_timeline.py --shapes 128:360:1 \\
        --configs 8:1:12:0,8:4:2:1 --out timeline.md

Configs are WARPS:CHUNK:STAGES:W2_LATE (the manifest's `cuda_gemv` keys).
Needs a GPU (NVIDIA, sm_90 or newer). Prints markdown.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "python"))

import mxfp4_cuda_timeline as rtc  # noqa: E402  (NVRTC and driver helpers)

SOURCE = REPO / "experiments" / "kernels" / "moe_gemv.cu"
STAMPS = ("start", "set up (routing read, copies asked for)", "first unit's chunk arrived", "GEMM 1 done",
          "past the grid barrier", "GEMM 2's rows arrived", "end")
TOLERANCE = dict(atol=2e-2, rtol=2e-2, max_mismatch=0.005)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def shared_mem_bytes(M: int, K: int, N: int, topk: int, chunk: int, stages: int, sms: int) -> int:
    """experiments/gptoss.yaml's `shared_mem` for `cuda_gemv`."""
    units_max, rows_max = ceil_div(M * topk * N, sms), ceil_div(K, sms)
    return (384 + 16 * ceil_div(4 * (2 * units_max + M * rows_max), 16) + 16 * ceil_div(2 * M * K, 16)
            + 2 * M * topk * rows_max * N + 4 * stages * chunk * K)


def instance_name(M, K, N, topk, warps, chunk, stages, w2_late) -> str:
    params = (topk, warps, chunk, stages, ceil_div(K, 256), ceil_div(topk * N, 256), 0, 0, w2_late)
    return f"moe_gemv<{', '.join(str(v) for v in params)}>"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="128:360:1", help="E:N:M,... (K=2880, topk=4, gpt-oss)")
    parser.add_argument("--configs", default="8:1:12:0", help="WARPS:CHUNK:STAGES:W2_LATE,...")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--out", help="also write the markdown here")
    args = parser.parse_args(argv)

    import torch

    from tunelab.compare import compare
    from tunelab.problems import resolve

    cuda = ctypes.CDLL("libcuda.so.1")
    nvrtc = rtc.nvrtc_library()
    props = torch.cuda.get_device_properties(0)
    arch, sms = f"sm_{props.major}{props.minor}", props.multi_processor_count
    stream = torch.cuda.current_stream().cuda_stream
    smem_max = ctypes.c_int()
    rtc.check(cuda.cuDeviceGetAttribute(ctypes.byref(smem_max), 97, torch.cuda.current_device()))  # opt-in per block
    flush = torch.ones(256 << 20 >> 2, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int32, device="cuda")

    def cold_time(launch) -> float:
        torch.sum(flush, dim=0, out=sink)  # L2 flushed by a read, as the runner's default
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000.0

    one = torch.zeros(1, device="cuda")
    noop = statistics.median(cold_time(lambda: one.add_(1)) for _ in range(args.runs))
    command = "python3 bench/moe_gemv_timeline.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# One-launch CUDA C++ bf16 MoE (moe_gemv.cu): timeline on {props.name}", "",
             f"{datetime.date.today()}, torch {torch.__version__}, {arch}, {sms} SMs; `{command}`", "",
             f"Cold (L2 flushed by a 256 MiB read before each launch), an event pair around the launch, median "
             f"of {args.runs}; stamps in µs from the first warp's start. A one-element add under the same timer: "
             f"{noop:.2f} µs.", ""]
    for shape_text in args.shapes.split(","):
        E, N, M = (int(v) for v in shape_text.split(":"))
        K, topk = 2880, 4
        problem = resolve("moe")({"M": M, "E": E, "topk": topk, "K": K, "N": N, "dtype": "bf16",
                                  "activation": "silu"})
        inputs = problem.inputs(0, "cuda")
        reference = problem.reference(inputs)
        out = torch.empty_like(reference)
        launch_args = ([("p", inputs[n].data_ptr()) for n in ("x", "topk_ids", "topk_weights", "w1", "w2")]
                       + [("p", 0), ("p", 0), ("p", out.data_ptr()), ("i", M), ("i", N), ("i", K)])
        bound = problem.bound_us(3350e9 if "H100" in props.name else 4800e9)
        for config_text in args.configs.split(","):
            warps, chunk, stages, w2_late = (int(v) for v in config_text.split(":"))
            name = instance_name(M, K, N, topk, warps, chunk, stages, w2_late)
            smem = shared_mem_bytes(M, K, N, topk, chunk, stages, sms)
            if smem > smem_max.value:
                lines += [f"## E={E} N={N} M={M}: WARPS {warps}, CHUNK {chunk}, STAGES {stages}, W2_LATE {w2_late}",
                          "", f"not run: {smem} bytes of shared memory, a block may have {smem_max.value}", ""]
                continue
            row = {}
            for traced in (False, True):
                cubin, symbol, trace_symbol, _ = rtc.compile_cubin(
                    nvrtc, args.source, name, arch, ["-DTRACE=1"] if traced else [],
                    trace_buffer="&tunelab_moe_gemv::g_trace")
                kernel = rtc.Kernel(cuda, cubin, symbol, trace_symbol, smem)

                def launch():
                    kernel.launch(sms, 32 * warps, launch_args, stream)

                out.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                verdict = compare(out, reference, **TOLERANCE)
                times, stamps = [], []
                for _ in range(args.runs):
                    times.append(cold_time(launch))
                    if traced:
                        t = kernel.read_trace(torch, sms * warps).double()
                        stamps.append((t[:, :len(STAMPS)] - t[:, 0].min()) / 1000.0)
                row[traced] = (statistics.median(times), verdict)
                if traced:
                    order = sorted(range(len(times)), key=times.__getitem__)
                    row["stamps"] = stamps[order[len(order) // 2]]
            plain_us, verdict = row[False]
            lines += [f"## E={E} N={N} M={M}: WARPS {warps}, CHUNK {chunk}, STAGES {stages}, W2_LATE {w2_late}",
                      "",
                      f"events: **{plain_us:.2f} µs** untraced ({bound / plain_us * 100:.1f} % of the "
                      f"{bound:.2f} µs bound), {row[True][0]:.2f} traced; output "
                      f"{'passed' if verdict.get('passed') else 'FAILED'} (max abs err {verdict.get('max_abs_err')})",
                      "", "| stamp | first warp | median warp | last warp |", "| --- | ---: | ---: | ---: |"]
            st = row["stamps"]
            for i, label in enumerate(STAMPS):
                col = st[:, i]
                col = col[col >= 0] if i in (2, 5) else col  # warps without a unit or rows stamp nothing
                col = col[col < 1e6]
                if len(col):
                    lines.append(f"| {label} | {col.min().item():.2f} | {col.median().item():.2f} | "
                                 f"{col.max().item():.2f} |")
            lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
