#!/usr/bin/env python3
"""Where the one-launch persistent MoE spends its time: an in-kernel timeline.

A benchmark, not a test. For each shape and config it binds the persistent
call with TRACE on (every program stamps the GPU's global nanosecond clock,
%globaltimer, when it starts, when its GEMM 1 items begin and end, and each
GEMM 1 item and GEMM 2 item its begin, the end of its wait for GEMM 1, and
its end; see moe_persistent_kernel and trace_layout), checks the output
against the reference, then launches it --runs times:

- cold: L2 flushed (a read of 2x its size) before each launch, as the
  runner's default protocol times;
- hot: launched again at once, the weights still in L2 (how the calls of a
  CUDA graph replay find them).

Every time is in µs from the first program's start in that launch, and
each row of the report is the median over the runs. The same config without
TRACE is timed cold with CUDA events, beside it, so the cost of the stamps
shows (an event pair also counts the launch's start-up, which the timeline
does not see).

    PYTHONPATH=python python3 bench/moe_persistent_timeline.py --out timeline.json
        [--shapes 128:360:1] [--configs '[{"SPLIT_K": 6}]'] [--runs 30]

--configs is a JSON list of overrides of the shape's default persistent
config (persistent_default_config); the default itself always runs first.
Writes the JSON (every run's summary, and the raw stamps of the median cold
run) to --out and the markdown next to it (same name, .md); prints the
markdown.
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
import triton  # noqa: E402

from tunelab.compare import compare  # noqa: E402
from tunelab.kernels.fused_moe import (  # noqa: E402
    TRACE_PER_PROGRAM,
    PersistentMoELaunch,
    make_persistent_plan,
    persistent_default_config,
    trace_layout,
)
from tunelab.problems.moe import FusedMoE  # noqa: E402
from tunelab.worker import CudaEventTimer  # noqa: E402

TOLERANCE = {"atol": 2e-2, "rtol": 2e-2, "max_mismatch": 0.005}  # experiments/gptoss.yaml
EVENT_SAMPLES = 64


def read_timeline(launch: PersistentMoELaunch) -> dict:
    """The last launch's stamps as µs from its first program's start (host copy)."""
    layout = trace_layout(launch.plan, launch.grid)
    raw = launch.trace.cpu().tolist()
    first, grid = layout["programs"]
    programs = [raw[first + p * TRACE_PER_PROGRAM : first + (p + 1) * TRACE_PER_PROGRAM] for p in range(grid)]
    t0 = min(p[0] for p in programs)

    def us(ns):
        return (ns - t0) / 1e3

    first1, count1 = layout["items1"]
    first2, count2 = layout["items2"]
    # Items the routing did not make (blocks beyond num_blocks) were never stamped: zero.
    items1 = [raw[first1 + 3 * i : first1 + 3 * i + 3] for i in range(count1)]
    items2 = [raw[first2 + 4 * i : first2 + 4 * i + 4] for i in range(count2)]
    return {
        "programs": [
            {"start": us(p[0]), "gemm1_begin": us(p[1]), "gemm1_end": us(p[2]), "end": us(p[3]), "sm": int(p[4])}
            for p in programs
        ],
        "items1": [
            {"pid": i % grid, "begin": us(a), "loop": us(b), "end": us(c)} for i, (a, b, c) in enumerate(items1) if a
        ],
        "items2": [{"begin": us(a), "waited": us(b), "loop": us(c), "end": us(d)} for a, b, c, d in items2 if a],
    }


def summarise(tl: dict) -> dict:
    """One launch's timeline in a few figures (µs from the first program's start)."""
    progs, it1, it2 = tl["programs"], tl["items1"], tl["items2"]
    med = statistics.median
    s = {
        "last_start": max(p["start"] for p in progs),
        "gemm1_begin_med": med(p["gemm1_begin"] for p in progs),  # all programs, those with no GEMM 1 item too
        "end": max(p["end"] for p in progs),
        "items1": len(it1),
        "items2": len(it2),
    }
    if it1:
        s.update(
            item1_med_begin=med(i["begin"] for i in it1),
            item1_first_end=min(i["end"] for i in it1),
            item1_med_end=med(i["end"] for i in it1),
            item1_last_end=max(i["end"] for i in it1),
            item1_med_dur=med(i["end"] - i["begin"] for i in it1),
            item1_med_loop=med(i["loop"] - i["begin"] for i in it1),
            item1_med_epilogue=med(i["end"] - i["loop"] for i in it1),
        )
    if it2:
        s.update(
            item2_med_begin=med(i["begin"] for i in it2),
            wait_first_over=min(i["waited"] for i in it2),
            wait_med_over=med(i["waited"] for i in it2),
            wait_last_over=max(i["waited"] for i in it2),
            item2_med_work=med(i["end"] - i["waited"] for i in it2),
            item2_med_loop=med(i["loop"] - i["waited"] for i in it2),
            item2_med_epilogue=med(i["end"] - i["loop"] for i in it2),
            item2_last_end=max(i["end"] for i in it2),
        )
    return s


def timeline_runs(launch, flush, runs: int, hot: bool) -> tuple:
    summaries, raws = [], []
    for _ in range(runs):
        if hot:
            launch()  # the weights into L2; the traced launch below finds them there
        else:
            flush()
        launch.trace.zero_()
        launch()
        torch.cuda.synchronize()
        raw = read_timeline(launch)
        raws.append(raw)
        summaries.append(summarise(raw))
    order = sorted(range(runs), key=lambda i: summaries[i]["end"])
    median_run = order[len(order) // 2]
    keys = summaries[0].keys()
    return {k: statistics.median(s[k] for s in summaries) for k in keys}, summaries, raws[median_run]


def clock_step_ns(raw: dict) -> float:
    """The smallest nonzero difference between two stamps of one launch: the clock's resolution at most."""
    stamps = sorted(
        {round(v * 1e3) for p in raw["programs"] for v in (p["start"], p["gemm1_begin"], p["gemm1_end"], p["end"])}
    )
    steps = [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
    return min(steps) if steps else float("nan")


ROWS = [
    ("last program starts", "last_start"),
    ("GEMM 1 begins (median over all programs)", "gemm1_begin_med"),
    ("GEMM 1 items begin (median)", "item1_med_begin"),
    ("first GEMM 1 item ends", "item1_first_end"),
    ("median GEMM 1 item ends", "item1_med_end"),
    ("last GEMM 1 item ends", "item1_last_end"),
    ("a GEMM 1 item takes (median)", "item1_med_dur"),
    ("... its K loop (median)", "item1_med_loop"),
    ("... after its K loop: slices, epilogue, counts (median)", "item1_med_epilogue"),
    ("GEMM 2 items begin (median)", "item2_med_begin"),
    ("first GEMM 2 wait over", "wait_first_over"),
    ("median GEMM 2 wait over", "wait_med_over"),
    ("last GEMM 2 wait over", "wait_last_over"),
    ("a GEMM 2 item after its wait (median)", "item2_med_work"),
    ("... its K loop (median)", "item2_med_loop"),
    ("... after its K loop: weighted rows, counts, top-k sum (median)", "item2_med_epilogue"),
    ("last GEMM 2 item ends", "item2_last_end"),
    ("last program ends", "end"),
]


def markdown(report: dict) -> str:
    m = report["meta"]
    lines = [
        f"# Persistent MoE timeline on {m['device']}",
        "",
        f"Measured {m['date']} on {m['device']} (torch {m['torch']}, Triton {m['triton']}), "
        f"`{m['command']}`. Times in µs from the first program's start, median of {m['runs']} launches; "
        "cold: L2 flushed before each launch; hot: the launch right after another. "
        "`events` is the same config without the stamps, timed cold with CUDA events "
        f"(median of {EVENT_SAMPLES}, including the launch's start-up).",
        "",
    ]
    for entry in report["entries"]:
        s = entry["shape"]
        lines += [
            f"## E={s['E']} N={s['N']} M={s['M']}: {entry['label']}",
            "",
            f"Config {entry['config']}; grid {entry['grid']} ({entry['n_regs']} registers, "
            f"{entry['shared']} B shared); {entry['cold']['items1']:.0f} GEMM 1 items, "
            f"{entry['cold']['items2']:.0f} GEMM 2 items; clock step {entry['clock_step_ns']} ns.",
            "",
        ]
        if "error" in entry:
            lines += [f"Error: {entry['error']}", ""]
            continue
        lines += ["| step | cold µs | hot µs |", "| --- | ---: | ---: |"]
        for label, key in ROWS:
            if key in entry["cold"]:
                lines.append(f"| {label} | {entry['cold'][key]:.2f} | {entry['hot'][key]:.2f} |")
        lines.append(f"| events: untraced launch, cold | {entry['events_cold_us']:.2f} | |")
        lines.append(f"| events: traced launch, cold | {entry['events_traced_us']:.2f} | |")
        lines.append("")
    for row in report.get("carveouts", []):
        s = row["shape"]
        lines += [
            f"## E={s['E']} N={s['N']} M={s['M']}: default config under each shared-memory carveout",
            "",
            "| carveout % | events, cold µs | output checked |",
            "| ---: | ---: | --- |",
        ]
        lines += [
            f"| {k} | {v['cold_us']:.2f} | {'passed' if v['passed'] else 'FAILED'} |"
            if "cold_us" in v
            else f"| {k} | not run: {v['skipped']} | |"
            for k, v in row["us"].items()
        ]
        lines += ["", f"A one-element add, timed the same way: {row['one_element_add_cold_us']:.2f} µs.", ""]
    return "\n".join(lines) + "\n"


def time_carveouts(problem, inputs, expected, shape, carveouts: str, timer, flush_bytes: int) -> dict:
    """The default config's untraced launch timed cold under each shared-memory
    carveout (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, which
    PersistentMoELaunch sets to 100), and a one-element add beside it: the
    floor of a cold event-pair sample on this machine."""
    import ctypes

    from tunelab.kernels.fused_moe import _libcuda

    lib = _libcuda()
    if lib is None:
        raise RuntimeError("libcuda not found: cannot set a carveout")
    plan = make_persistent_plan(problem, persistent_default_config(shape["M"], shape["N"]))
    row = {"shape": shape, "us": {}}
    for value in (int(v) for v in carveouts.split(",")):
        # A launch of its own each (its workspace is clean even if another's waits timed out).
        launch = PersistentMoELaunch(plan, inputs)
        row["grid"] = launch.grid
        handle = ctypes.c_void_p(int(launch.function))
        status = lib.cuFuncSetAttribute(handle, ctypes.c_int(9), ctypes.c_int(value))
        blocks = ctypes.c_int(0)
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), handle, ctypes.c_int(32 * plan.config["num_warps"]), ctypes.c_size_t(launch.shared)
        )
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        if status != 0 or blocks.value * sms < launch.grid:
            # Too few programs resident for the grid: the in-kernel waits would time out.
            row["us"][str(value)] = {"skipped": f"status {status}, {blocks.value} programs an SM"}
            continue
        launch.out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        ok = compare(launch.out, expected, **TOLERANCE)["passed"] and not launch.timed_out()
        timer.warmup(launch, 5, 5.0)
        us, _ = timer.sample(launch, EVENT_SAMPLES, flush_bytes, "read")
        row["us"][str(value)] = {"cold_us": statistics.median(us), "passed": ok}
    one = torch.zeros(1, device="cuda")
    us, _ = timer.sample(lambda: one.add_(1.0), EVENT_SAMPLES, flush_bytes, "read")
    row["one_element_add_cold_us"] = statistics.median(us)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="128:360:1", help="E:N:M,... (default %(default)s)")
    ap.add_argument("--K", type=int, default=2880)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--activation", default="silu")
    ap.add_argument("--configs", default="[]", help="JSON list of overrides of the default config")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument(
        "--carveouts",
        default="",
        help="comma-separated shared-memory carveouts (%% of the SM's, -1: the driver's choice) to time "
        "the untraced default config under, cold, each checked first",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("moe_persistent_timeline: no CUDA GPU visible")
    props = torch.cuda.get_device_properties(0)
    flush_bytes = max(2 * getattr(props, "L2_cache_size", 50 << 20), 32 << 20)
    timer = CudaEventTimer(torch)
    flush_buf = torch.zeros(flush_bytes // 4, dtype=torch.int32, device="cuda")

    def flush():
        torch.amax(flush_buf)

    overrides = [{}] + json.loads(args.configs)
    report = {
        "meta": {
            "device": torch.cuda.get_device_name(),
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "runs": args.runs,
            "command": "python3 bench/moe_persistent_timeline.py " + " ".join(sys.argv[1:]),
        },
        "entries": [],
    }
    out = Path(args.out)
    for item in args.shapes.split(","):
        E, N, M = (int(v) for v in item.split(":"))
        shape = {
            "M": M,
            "E": E,
            "topk": args.topk,
            "K": args.K,
            "N": N,
            "dtype": args.dtype,
            "activation": args.activation,
        }
        problem = FusedMoE(shape)
        inputs = problem.inputs(0, "cuda")
        expected = problem.reference(inputs)
        for override in overrides:
            config = dict(persistent_default_config(M, N), **override)
            label = (
                "default config"
                if not override
                else "default with " + ", ".join(f"{k}={v}" for k, v in override.items())
            )
            entry = {"shape": shape, "label": label, "config": config}
            try:
                plan = make_persistent_plan(problem, config)
                plain = PersistentMoELaunch(plan, inputs)
                traced = PersistentMoELaunch(plan, inputs, trace=True)
                entry.update(grid=traced.grid, n_regs=traced.n_regs, shared=traced.shared)
                for launch in (plain, traced):
                    launch.out.fill_(float("nan"))
                    launch()
                    torch.cuda.synchronize()
                    result = compare(launch.out, expected, **TOLERANCE)
                    if not result["passed"] or launch.timed_out():
                        raise RuntimeError(f"check failed: {result}, timed out {launch.timed_out()}")
                for name, launch in (("events_cold_us", plain), ("events_traced_us", traced)):
                    timer.warmup(launch, 5, 5.0)
                    us, _ = timer.sample(launch, EVENT_SAMPLES, flush_bytes, "read")
                    entry[name] = statistics.median(us)
                entry["cold"], entry["cold_runs"], entry["cold_median_raw"] = timeline_runs(
                    traced, flush, args.runs, hot=False
                )
                entry["hot"], entry["hot_runs"], _ = timeline_runs(traced, flush, args.runs, hot=True)
                entry["clock_step_ns"] = clock_step_ns(entry["cold_median_raw"])
            except Exception as exc:  # noqa: BLE001 - a benchmark reports and moves on
                entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                entry.setdefault("cold", {"items1": 0, "items2": 0})
                entry.setdefault("grid", None)
                entry.setdefault("n_regs", None)
                entry.setdefault("shared", None)
                entry.setdefault("clock_step_ns", None)
            report["entries"].append(entry)
            out.write_text(json.dumps(report) + "\n")
            out.with_suffix(".md").write_text(markdown(report))
            torch.cuda.synchronize()
        if args.carveouts:
            report.setdefault("carveouts", []).append(
                time_carveouts(problem, inputs, expected, shape, args.carveouts, timer, flush_bytes)
            )
            out.write_text(json.dumps(report) + "\n")
            out.with_suffix(".md").write_text(markdown(report))
        del inputs, expected
        torch.cuda.empty_cache()
    print(markdown(report))


if __name__ == "__main__":
    main()
