"""Host cost of one kernel launch: Triton's JIT, tunelab's compiled launcher,
and the native worker (no Python per launch). A measurement, not a test.

    python bench/native_launch.py OUT.json [--tunelab .bin/tunelab] [--launches 10000]

One kernel, one shape (tunelab's Triton GEMM at M=16, N=K=1024, bf16: a
decode-size launch), launched four ways, each timed the same way: batches of
100 launches queued behind a GPU spin long enough that the queue never fills
(so a launch never waits for the GPU), host time per launch per batch, the
median and mean over batches:

- `triton_jit`: `matmul_kernel[grid](...)`, Triton's JIT dispatch;
- `triton_compiled`: tunelab's direct launcher (the compiled kernel's runner,
  looked up once: what a Python lane times);
- `native_triton`: the same cubin launched by `tunelab native-worker` from
  the recipe a lane would send it (`launch_cost`, docs/native-backend.md);
- `native_cuda`: the quickstart's CUDA kernel (`gemm_mma`), compiled by
  `tunelab native-compile`, launched by the native worker.

Writes OUT.json (device, date, each way's numbers) and prints a markdown
table. Needs a GPU, torch, Triton and the tunelab binary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

BATCH = 100


def python_cost(launch, launches: int, torch) -> dict:
    """Host µs per launch of `launch()`, batches queued behind a GPU spin."""
    for _ in range(20):
        launch()
    torch.cuda.synchronize()
    per_batch = []
    # ~20 µs of GPU time per queued launch at ~1.5 GHz: the spin outlasts the batch.
    spin = int(BATCH * 20 * 1500)
    done = 0
    while done < launches:
        n = min(BATCH, launches - done)
        torch.cuda._sleep(spin)
        t = time.perf_counter()
        for _ in range(n):
            launch()
        per_batch.append((time.perf_counter() - t) * 1e6 / n)
        torch.cuda.synchronize()
        done += n
    return {"launches": launches, "median_us": statistics.median(per_batch), "mean_us": statistics.fmean(per_batch)}


class NativeWorker:
    def __init__(self, binary: Path, helpers: str | None):
        self.proc = subprocess.Popen(
            [str(binary), "native-worker", "--backend", "cuda"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.next = 1
        self.hello = self.request("hello", **({"helpers": helpers} if helpers else {}))

    def request(self, op, **fields):
        rid = self.next
        self.next += 1
        self.proc.stdin.write(json.dumps({"id": rid, "op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the native worker exited during {op}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"{op}: {reply.get('class')}: {reply.get('message')}")
        return reply

    def close(self):
        try:
            self.request("shutdown")
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        self.proc.wait(timeout=30)


def native_compile(binary: Path, source: Path, kernel: str, out: Path) -> dict:
    done = subprocess.run(
        [str(binary), "native-compile", str(source), "--kernel", kernel, "--out", str(out)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"native-compile {kernel}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tunelab", type=Path, default=Path(os.environ.get("TUNELAB_BIN", REPO / ".bin" / "tunelab")))
    ap.add_argument("--launches", type=int, default=10000)
    args = ap.parse_args()

    import torch
    import triton

    from tunelab import native
    from tunelab.kernels.matmul import matmul_kernel, split_config, grid as matmul_grid
    from tunelab.problems.gemm import Gemm

    shape = {"M": 16, "N": 1024, "K": 1024, "dtype": "bf16"}
    config = {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
    problem = Gemm(shape)
    inputs = problem.inputs(0, torch.device("cuda"))
    a, b = inputs["a"], inputs["b"]
    launch = problem.methods()["matmul"].bind(problem, inputs, config)
    out = launch.out
    results = {}
    errors = {}

    # Triton's JIT dispatch, the same kernel and arguments.
    constexprs, options = split_config(config)
    jit_args = (
        a,
        b,
        out,
        16,
        1024,
        1024,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        out.stride(1),
    )
    jit_grid = matmul_grid(16, 1024, constexprs)

    def jit():
        matmul_kernel[jit_grid](*jit_args, **constexprs, **options)

    for name, fn in (("triton_jit", jit), ("triton_compiled", launch)):
        try:
            results[name] = python_cost(fn, args.launches, torch)
            print(f"{name}: {results[name]['median_us']:.2f} µs", flush=True)
        except Exception as exc:  # noqa: BLE001 - report and go on
            errors[name] = repr(exc)

    worker = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            helpers = native_compile(args.tunelab, REPO / "src/native/helpers.cu", "tunelab_spin", Path(tmp))
            worker = NativeWorker(args.tunelab, helpers["image"])
            tensors = [("a", a), ("b", b), ("out", out)]
            described = [native.describe_tensor(torch, n, t) for n, t in tensors]
            worker.request(
                "import",
                tensors=[{"handle": d["handle"], "offset": d["offset"], "bytes": d["bytes"]} for d in described],
            )
            index = {d["ptr"]: i for i, d in enumerate(described)}
            kernel, compiled, grid, values = launch.native
            recipe = native.triton_recipe(kernel, compiled, grid, values, index, tmp)
            plain = [{k: v for k, v in arg.items() if k not in ("name", "type")} for arg in recipe["args"]]
            worker.request(
                "check",
                job_id="triton",
                image=recipe["image"],
                symbol=recipe["symbol"],
                grid=recipe["grid"],
                block=recipe["block"],
                shared=recipe["shared"],
                args=plain,
            )
            cost = worker.request("launch_cost", job_id="triton", count=args.launches)
            results["native_triton"] = {k: cost[k] for k in ("launches", "median_us", "mean_us")}
            print(f"native_triton: {cost['median_us']:.2f} µs", flush=True)
            cuda = native_compile(
                args.tunelab, REPO / "experiments/kernels/gemm_mma.cu", "gemm_mma<64, 64, 32, 2, 2, 2, 0>", Path(tmp)
            )
            smem = 2 * (64 * (32 + 8) + 32 * (64 + 8)) * 2
            worker.request(
                "check",
                job_id="cuda",
                image=cuda["image"],
                symbol=cuda["symbol"],
                grid=[triton.cdiv(1024, 64), triton.cdiv(16, 64)],
                block=[128],
                shared=smem,
                args=[{"tensor": 0}, {"tensor": 1}, {"tensor": 2}, {"i32": 16}, {"i32": 1024}, {"i32": 1024}],
            )
            cost = worker.request("launch_cost", job_id="cuda", count=args.launches)
            results["native_cuda"] = {k: cost[k] for k in ("launches", "median_us", "mean_us")}
            print(f"native_cuda: {cost['median_us']:.2f} µs", flush=True)
        except Exception as exc:  # noqa: BLE001 - report what ran
            errors["native"] = repr(exc)
        finally:
            if worker is not None:
                worker.close()

    report = {
        "bench": "native_launch",
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shape": shape,
        "config": config,
        "results": results,
        "errors": errors,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nHost cost of one launch, {report['device']}, {report['date']} (median over batches of {BATCH}):\n")
    print("| launch | median µs | mean µs |\n| --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['median_us']:.2f} | {r['mean_us']:.2f} |")
    for name, e in errors.items():
        print(f"| {name} | failed: {e} | |")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
