"""Where the one-launch CUDA C++ MXFP4 MoE kernel's time goes: a timeline.

Compiles experiments/kernels/mxfp4_moe_gemv.cu with NVRTC (the wheel torch
installs), once as it ships and once with -DTRACE=1 (a %globaltimer stamp per
warp at each phase: start, GEMM 1's activations ready, GEMM 1 done, past the
grid barrier, GEMM 2's activations staged, end), loads both through the CUDA
driver (ctypes) into torch's context and launches them on the `moe`
problem's own inputs (tunelab.problems.moe), the output checked against the
problem's reference with its tolerance. Cold: a 256 MiB write before each
launch (with --hot, none, and a 50 µs spin kernel instead: the launch finds
what the one before left in L2);
an event pair around the launch; the median of --runs.

    PYTHONPATH=python python3 bench/mxfp4_cuda_timeline.py --shapes 128:2880:1,128:360:1 \
        --configs 4:3:0,4:3:1 --out timeline.md
    # two versions of the kernel on one machine:
    ... --source old.cu --source experiments/kernels/mxfp4_moe_gemv.cu

Needs a GPU (NVIDIA, sm_90 or newer). Prints markdown.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "experiments" / "kernels" / "mxfp4_moe_gemv.cu"
STAMPS = (
    "start",
    "GEMM 1 activations staged",
    "GEMM 1 done",
    "past the grid barrier",
    "GEMM 2 activations staged",
    "end",
)
TRACE_STAMPS = 8


def nvrtc_library():
    import nvidia  # the wheel torch depends on

    for base in nvidia.__path__:
        for rel in ("cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.12"):
            path = Path(base) / rel
            if path.exists():
                return ctypes.CDLL(str(path))
    raise SystemExit("no NVRTC wheel found next to torch")


def compile_cubin(
    nvrtc, source: Path, name: str, arch: str, defines: list[str], options: tuple[str, ...] = ()
) -> tuple[bytes, str, str | None, str]:
    """(cubin, the kernel's lowered name, the trace buffer's lowered name,
    NVRTC's log) of one template instance; `options` are NVRTC's."""
    prog = ctypes.c_void_p()
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.read_bytes(), source.name.encode(), 0, None, None))
    names = [name.encode()] + ([b"&tunelab_mxfp4::g_trace"] if defines else [])
    for n in names:
        check(nvrtc.nvrtcAddNameExpression(prog, n))
    opts = [f"-arch={arch}".encode(), b"-std=c++17"] + [d.encode() for d in (*defines, *options)]
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if status != 0:
        raise SystemExit(f"NVRTC failed:\n{log.value.decode()}")
    lowered = []
    for n in names:
        out = ctypes.c_char_p()
        check(nvrtc.nvrtcGetLoweredName(prog, n, ctypes.byref(out)))
        lowered.append(out.value.decode())
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    check(nvrtc.nvrtcGetCUBIN(prog, cubin))
    return cubin.raw, lowered[0], (lowered[1] if defines else None), log.value.decode()


def shared_mem_bytes(M: int, K: int, N: int, topk: int, warps: int, stages: int, stage2: int = 1) -> int:
    """The dynamic shared memory of one launch: experiments/gptoss-mxfp4.yaml's
    `shared_mem` for `cuda_gemv` (with STAGE2 1 by default, enough for the
    versions before STAGE2 too)."""
    gpl1 = -(-K // 1024)
    return max(M * -(-K // 32) * 80 + warps * stages * (1088 * gpl1 + 32), stage2 * M * topk * -(-N // 32) * 80)


def kernel_args(inputs: dict, out, M: int, N: int, K: int, standard_order: bool = False) -> list:
    """The kernel's arguments over the `moe` problem's inputs, in its
    signature's order: the weights in pair order, or (`standard_order`) as
    the kernels before version 8 read them."""
    w1, w2 = ("w1", "w2") if standard_order else ("w1_pairs", "w2_pairs")
    names = ("x", "topk_ids", "topk_weights", w1, "w1_scale", w2, "w2_scale", "b1", "b2")
    return [("p", inputs[n].data_ptr()) for n in names] + [("p", out.data_ptr()), ("i", M), ("i", N), ("i", K)]


def check(status):
    if status != 0:
        raise SystemExit(f"driver or NVRTC call failed: {status}")


class Kernel:
    def __init__(self, cuda, cubin: bytes, symbol: str, trace_symbol: str | None, smem: int):
        self.cuda = cuda
        self.module = ctypes.c_void_p()
        check(cuda.cuModuleLoadData(ctypes.byref(self.module), cubin))
        self.function = ctypes.c_void_p()
        check(cuda.cuModuleGetFunction(ctypes.byref(self.function), self.module, symbol.encode()))
        if smem > 48 * 1024:
            check(cuda.cuFuncSetAttribute(self.function, 8, smem))  # MAX_DYNAMIC_SHARED_SIZE_BYTES
        self.smem = smem
        self.trace = None
        if trace_symbol:
            ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
            check(cuda.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), self.module, trace_symbol.encode()))
            self.trace = (ptr.value, size.value)

    def launch(self, grid: int, block: int, args: list, stream: int):
        values = [ctypes.c_uint64(a) if kind == "p" else ctypes.c_int(a) for kind, a in args]
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        check(
            self.cuda.cuLaunchKernel(
                self.function, grid, 1, 1, block, 1, 1, self.smem, ctypes.c_void_p(stream), params, None
            )
        )

    def read_trace(self, torch, warps: int):
        ptr, size = self.trace
        host = torch.empty(size // 8, dtype=torch.int64)
        self.cuda.cuCtxSynchronize()
        check(self.cuda.cuMemcpyDtoH_v2(ctypes.c_void_p(host.data_ptr()), ctypes.c_uint64(ptr), ctypes.c_size_t(size)))
        return host[: warps * TRACE_STAMPS].view(warps, TRACE_STAMPS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="128:2880:1", help="E:N:M,... (K=2880, topk=4, gpt-oss)")
    parser.add_argument(
        "--configs",
        default="4:3:3:1",
        help="WARPS:BLOCKS_PER_SM:STAGES[:STAGE2],... (the kernel's sixth template parameter: "
        "STAGES since version 9, PREFETCH_W2 before; STAGE2 since version 10)",
    )
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out", help="also write the markdown here")
    parser.add_argument(
        "--hot",
        action="store_true",
        help="no L2 flush before a launch: its weights are where the launch before left them",
    )
    parser.add_argument(
        "--source",
        action="append",
        type=Path,
        help="a version of the kernel's source to time (repeat to compare versions on one "
        f"machine, each config of each in turn); default {SOURCE.relative_to(REPO)}",
    )
    parser.add_argument(
        "--standard-order",
        action="store_true",
        help="pass the weights in standard order (w1, w2), as kernels before pair order "
        "(version 8) read them; default: w1_pairs, w2_pairs",
    )
    args = parser.parse_args(argv)
    sources = args.source or [SOURCE]

    import torch

    sys.path.insert(0, str(REPO / "python"))
    from tunelab.compare import compare
    from tunelab.problems import resolve

    cuda = ctypes.CDLL("libcuda.so.1")
    nvrtc = nvrtc_library()
    props = torch.cuda.get_device_properties(0)
    arch = f"sm_{props.major}{props.minor}"
    stream = torch.cuda.current_stream().cuda_stream
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    lines = [
        f"# One-launch CUDA C++ MXFP4 MoE: timeline on {props.name}",
        "",
        f"torch {torch.__version__}, {arch}, {props.multi_processor_count} SMs; "
        + (
            "hot (no flush: each launch right after another)"
            if args.hot
            else "cold (256 MiB written before each launch)"
        )
        + f", median of {args.runs}; stamps in µs from the first warp's start.",
        "",
    ]
    for shape_text in args.shapes.split(","):
        E, N, M = (int(v) for v in shape_text.split(":"))
        shape = {
            "M": M,
            "E": E,
            "topk": 4,
            "K": 2880,
            "N": N,
            "dtype": "mxfp4",
            "act_dtype": "bf16",
            "activation": "swiglu_oai",
        }
        problem = resolve("moe")(shape)
        inputs = problem.inputs(0, "cuda")
        reference = problem.reference(inputs)
        out = torch.empty_like(reference)
        launch_args = kernel_args(inputs, out, M, N, 2880, args.standard_order)
        for source, config_text in ((s, c) for c in args.configs.split(",") for s in sources):
            warps, per_sm, stages, *stage2 = (int(v) for v in config_text.split(":"))
            params = [-(-2880 // 1024), -(-N // 1024), 4, warps, per_sm, stages, *stage2, 0]
            name = f"mxfp4_moe_gemv<{', '.join(str(v) for v in params)}>"
            grid, block = props.multi_processor_count * per_sm, 32 * warps
            smem = shared_mem_bytes(M, 2880, N, 4, warps, stages)
            row = {}
            for traced in (False, True):
                cubin, symbol, trace_symbol, _ = compile_cubin(
                    nvrtc, source, name, arch, ["-DTRACE=1"] if traced else []
                )
                kernel = Kernel(cuda, cubin, symbol, trace_symbol, smem)
                out.fill_(float("nan"))
                kernel.launch(grid, block, launch_args, stream)
                torch.cuda.synchronize()
                verdict = compare(out, reference, atol=2e-2, rtol=2e-2, max_mismatch=0.005)
                times, stamps = [], []
                for _ in range(args.runs):
                    if args.hot:
                        # The GPU busy (about 50 µs) while the host launches, as the flush keeps it when
                        # cold: else the event pair would time the host's launch too.
                        torch.cuda._sleep(100_000)
                    else:
                        flush.fill_(1)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    kernel.launch(grid, block, launch_args, stream)
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end) * 1000.0)
                    if traced:
                        t = kernel.read_trace(torch, grid * warps).double()
                        stamps.append(((t[:, :6] - t[:, 0].min()) / 1000.0))
                row["traced" if traced else "plain"] = (statistics.median(times), verdict)
                if traced:
                    # The run with the median event time, summarised per stamp.
                    order = sorted(range(len(times)), key=times.__getitem__)
                    chosen = stamps[order[len(order) // 2]]
                    row["stamps"] = chosen
            plain_us, verdict = row["plain"]
            version = f" ({source.name})" if len(sources) > 1 else ""
            stage2_text = f", STAGE2 {stage2[0]}" if stage2 else ""
            lines += [
                f"## E={E} N={N} M={M}, WARPS {warps}, BLOCKS_PER_SM {per_sm}, STAGES {stages}{stage2_text}{version}",
                "",
                f"events: {plain_us:.2f} µs untraced, {row['traced'][0]:.2f} traced; output "
                f"{'passed' if verdict.get('passed') else 'FAILED'} (max abs err {verdict.get('max_abs_err')})",
                "",
                "| stamp | first warp | median warp | last warp |",
                "| --- | ---: | ---: | ---: |",
            ]
            stamps = row["stamps"]
            gemm1_warps = stamps[:, 1] > 0
            for i, label in enumerate(STAMPS):
                col = stamps[:, i]
                if i == 1:
                    col = col[gemm1_warps]
                lines.append(
                    f"| {label} | {col.min().item():.2f} | {col.median().item():.2f} | {col.max().item():.2f} |"
                )
            lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
