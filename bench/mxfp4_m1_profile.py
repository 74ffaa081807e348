#!/usr/bin/env python3
"""Where an MXFP4 fused-MoE call spends its time, kernel by kernel (a measurement, not a test).

Binds tunelab's call (`fused_moe`) at gpt-oss-120b's shape (E=128, topk=4,
K=2880, N=2880, bf16 activations, SwiGLU with biases) for each config given,
checks it against the reference, then times each of its kernels alone with
a cold L2: add 1 to every element of another buffer of max(2 x L2, 32 MiB)
(a write: L2 is left holding that buffer's dirty lines, unlike the worker's
default `flush_with: read`), an event pair around one launch, the median
of --samples (default 50). Kernels after the
first read what the whole call left in their inputs, so each one does its
real work. The whole call is timed the same way for comparison.

--hot: no flush, so each kernel finds its weights in L2 from the launch
before (the call's 53 MB fit an H100's or H200's L2): what a kernel costs
once its loads no longer wait for DRAM, to set beside the cold figure. A
spin kernel (`torch.cuda._sleep`) keeps the GPU busy while the host
enqueues each sample, as the flush does when cold.

    python3 bench/mxfp4_m1_profile.py [--M 1] [--samples 50] [--hot] [--ncu] CONFIG_JSON...

--ncu: after the timings, one more call between cudaProfilerStart and
cudaProfilerStop, for `ncu --profile-from-start off ...` to profile.
Prints a markdown table (device, date and command first) to stdout.
"""

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402

from tunelab.compare import compare  # noqa: E402
from tunelab.problems.moe import FusedMoE  # noqa: E402


def median_us(fn, flush, samples: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(samples):
        if flush is not None:
            flush.add_(1)
        else:
            # The GPU kept busy (about 50 us) while the host enqueues the
            # start event and the launches, as the flush does when cold:
            # else the event pair would time the host's launch too.
            torch.cuda._sleep(100_000)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", help="a config as JSON, e.g. '{\"BLOCK_SIZE_M\": 1, ...}'")
    ap.add_argument("--M", type=int, default=1)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--hot", action="store_true", help="no L2 flush before each sample")
    args = ap.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(max(2 * props.L2_cache_size, 32 << 20) // 4, dtype=torch.float32, device="cuda")
    problem = FusedMoE(
        {
            "M": args.M,
            "E": 128,
            "topk": 4,
            "K": 2880,
            "N": 2880,
            "act_dtype": "bf16",
            "dtype": "mxfp4",
            "activation": "swiglu_oai",
        }
    )
    inputs = problem.inputs(0, torch.device("cuda"))
    expected = problem.reference(inputs)
    print(
        f"Device {torch.cuda.get_device_name()}, {datetime.date.today().isoformat()}, torch {torch.__version__}; "
        f"`python3 bench/mxfp4_m1_profile.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n"
    )
    if args.hot:
        flush = None
    print(f"| config | kernel | {'hot' if args.hot else 'cold'} µs (median) |\n| --- | --- | ---: |")
    launches = []
    for text in args.configs:
        config = json.loads(text)
        launch = problem.methods()["fused_moe"].bind(problem, inputs, config)
        for _ in range(3):
            launch()
        torch.cuda.synchronize()
        result = compare(launch.out, expected, atol=2e-2, rtol=2e-2, max_mismatch=0.005)
        label = " ".join(f"{k}={v}" for k, v in config.items())
        if not result["passed"]:
            print(f"| {label} | check failed: {result} | - |")
            continue
        for name, run in zip(launch.kernels, launch._runners):
            print(f"| {label} | {name} | {median_us(run, flush, args.samples):.1f} |")
        print(f"| {label} | whole call | {median_us(launch, flush, args.samples):.1f} |")
        if args.ncu:
            # Kept only to profile: a GEMV launch holds tile-major copies of the weights (1.6 GB here).
            launches.append(launch)
    if args.ncu:
        cudart = torch.cuda.cudart()
        for launch in launches:
            torch.cuda.synchronize()
            cudart.cudaProfilerStart()
            launch()
            torch.cuda.synchronize()
            cudart.cudaProfilerStop()


if __name__ == "__main__":
    main()
