#!/usr/bin/env python3
"""How far apart several preparations of one config time on one GPU.

A benchmark, not a test: issue 48's A/B run compares side A with a second
preparation of it (A/A rounds) and with side B. At some shapes a null A/B
(B = A's config, prepared again) read B/A 1.03 over 32 rounds, which the
A/A rounds did not predict. This measures the spread directly: for each
(method, shape, config) it binds --preps launches of the same config, each
with its own buffers, checks each once, then times them in --rounds rounds
(each round visits every preparation in a rotated order: a warm-up and one
batch of --batch samples, L2 flushed before every sample, the worker's own
CudaEventTimer). It prints per preparation the median of its round medians,
and the spread of those against the round-to-round noise of one preparation.

With --layouts it repeats the experiment with the preparations made
differently: "same" times one preparation --preps times over (the control:
what the spread is when nothing but the timing position differs), "fresh"
binds every preparation anew each round (the caching allocator may hand back
the same blocks; the addresses are recorded).

With --pairs it times two preparations against each other instead, the
way an A/B round does, three ways, and prints the per-round log ratio's
mean and standard deviation for each: "batches" (a warm-up and a batch of
--batch samples for one, then for the other, the order alternating by
round: today's A/B round), "small" (the same with batches of 8), and
"interleaved" (one batch of 2 x --batch samples, the two launches taking
turns sample by sample). Each also with the second preparation planted
--plant slower (tunelab.variant.plant_on_gpu, sized from the first's time).

--table FILE prints the markdown table of a run's JSON (plain or gzipped),
needing no GPU. For --pairs: per way, B / A (the exponential of the mean
log ratio) and the standard deviation of one round's log ratio. Otherwise: per row the spread of the preparations' medians,
a round's median absolute deviation, the standard deviation between the
batches of one round (timed one after the other, tens of milliseconds
apart) and between the rounds' means, each relative.

    PYTHONPATH=python python3 bench/prep_spread.py --out prep_spread.json
        [--shapes 32:2880:2048,32:2880:4096] [--methods fused_moe,fused_moe_vllm]
        [--picks results/gptoss/NVIDIA_H200/best.csv] [--preps 6] [--rounds 12]
"""

import argparse
import csv
import datetime
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))


def table(path: str) -> str:
    """The markdown table of a spread run's JSON (see the docstring)."""
    import gzip

    raw = Path(path).read_bytes()
    doc = json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
    if doc["rows"] and "way" in doc["rows"][0]:
        return pairs_table(doc)
    lines = [
        "| M | method | preparations | spread of their medians | round MAD | between one round's batches "
        "| between rounds' means |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        rounds = r["rounds_us"]
        k, n = len(rounds), len(rounds[0])
        mean = statistics.mean(x for m in rounds for x in m)
        within = statistics.mean(statistics.pstdev([rounds[i][j] for i in range(k)]) for j in range(n)) / mean
        between = statistics.pstdev([statistics.mean(rounds[i][j] for i in range(k)) for j in range(n)]) / mean
        lines.append(
            f"| {r['shape']['M']} | {r['method']} | {r['layout']} | {r['spread'] * 100:.2f} % "
            f"| {r['round_mad'] * 100:.2f} % | {within * 100:.2f} % | {between * 100:.2f} % |"
        )
    return "\n".join(lines)


def pairs_table(doc: dict) -> str:
    """The markdown table of a --pairs run: per way, B / A over the rounds and a round's spread."""
    lines = [
        "| M | method | B | way | B / A | one round's log ratio, SD | its mean's standard error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        side = "A again" if r["side_b"] == "null" else r["side_b"]
        se = r["sd"] / len(r["logs"]) ** 0.5
        lines.append(
            f"| {r['M']} | {r['method']} | {side} | {r['way']} | {math.exp(r['mean']):.4f} "
            f"| {r['sd'] * 100:.2f} % | {se * 100:.2f} % |"
        )
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["--table"]:
    print(table(sys.argv[2]))
    sys.exit(0)

import torch  # noqa: E402

from tunelab.compare import compare  # noqa: E402
from tunelab.problems.moe import FusedMoE  # noqa: E402
from tunelab.worker import CudaEventTimer  # noqa: E402

TOLERANCE = {"atol": 2e-2, "rtol": 2e-2, "max_mismatch": 0.005}  # experiments/gptoss.yaml
METHOD_OF = {"fused_moe": "triton", "fused_moe_vllm": "triton_vllm", "fused_moe_persistent": "persistent"}


def picked_config(picks: Path, method: str, E: int, N: int, M: int) -> dict:
    """The committed pick of experiments/gptoss.yaml's method at this shape (best.csv)."""
    with picks.open() as f:
        for row in csv.DictReader(f):
            if (row["method"], int(row["E"]), int(row["N"]), int(row["M"])) == (METHOD_OF[method], E, N, M):
                return json.loads(row["config"])
    raise SystemExit(f"{picks}: no pick for {METHOD_OF[method]} at E={E} N={N} M={M}")


def big_tensors(launch) -> dict:
    """The launch's own tensors of at least 1 MiB, by attribute name."""
    return {
        k: v
        for k, v in vars(launch).items()
        if isinstance(v, torch.Tensor) and v.is_cuda and v.numel() * v.element_size() >= 1 << 20
    }


def where(launch) -> dict:
    """Each big tensor's address: offset in its 2 MiB page, and the page number."""
    return {
        k: {"ptr": v.data_ptr(), "in_2mib": v.data_ptr() % (2 << 20), "mib": v.numel() * v.element_size() >> 20}
        for k, v in big_tensors(launch).items()
    }


def timed(timer: CudaEventTimer, launch, batch: int, flush_bytes: int) -> float:
    timer.warmup(launch, 3, 2.0)
    us, _ = timer.sample(launch, batch, flush_bytes, "read")
    return statistics.median(us)


def interleaved(timer: CudaEventTimer, launches: list, batch: int, flush_bytes: int) -> list:
    """One batch, the launches taking turns sample by sample: each launch's median."""
    for launch in launches:
        getattr(launch, "before_batch", lambda: None)()
        timer.warmup(launch, 3, 2.0)
    flush = timer._flusher(flush_bytes, "read")
    count = batch * len(launches)
    starts, ends = timer._events(count)

    def queue_one(i: int) -> None:
        flush()
        starts[i].record()
        launches[i % len(launches)]()
        ends[i].record()

    timer._queue_held(count, queue_one)
    torch.cuda.synchronize()
    us = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return [statistics.median(us[k :: len(launches)]) for k in range(len(launches))]


def pair_noise(problem, inputs, method: str, config: dict, args, timer, flush_bytes) -> list:
    """The per-round log ratio of two preparations (and of one against the other planted) three ways."""
    import math

    from tunelab import variant

    bind = problem.methods()[method].bind
    a, a2 = bind(problem, inputs, config), bind(problem, inputs, config)
    a_us = statistics.median(timed(timer, a, args.batch, flush_bytes) for _ in range(5))
    burn = variant.tensor_core_burn(torch)
    planted = variant.plant_on_gpu(torch, a2, args.plant * a_us, burn)
    rows = []
    for label, b in (("null", a2), (f"plant {args.plant * 100:g} %", planted)):
        for way in ("batches", "small", "interleaved"):
            logs = []
            for r in range(args.rounds):
                order = [a, b] if r % 2 == 0 else [b, a]
                if way == "interleaved":
                    got = interleaved(timer, order, args.batch, flush_bytes)
                else:
                    n = args.batch if way == "batches" else 8
                    got = []
                    for launch in order:
                        getattr(launch, "before_batch", lambda: None)()
                        got.append(timed(timer, launch, n, flush_bytes))
                ta, tb = (got[0], got[1]) if r % 2 == 0 else (got[1], got[0])
                logs.append(math.log(tb / ta))
            mean, sd = statistics.mean(logs), statistics.stdev(logs)
            rows.append(
                {
                    "method": method,
                    "M": problem.shape["M"] if hasattr(problem, "shape") else None,
                    "side_b": label,
                    "way": way,
                    "logs": logs,
                    "mean": mean,
                    "sd": sd,
                }
            )
            print(
                f"{method:22s} {label:10s} {way:12s} B/A {math.exp(mean):.4f}  sd {sd * 100:5.2f} %  "
                f"se {sd / math.sqrt(len(logs)) * 100:5.2f} %",
                flush=True,
            )
    return rows


def experiment(problem, inputs, expected, method: str, config: dict, layout: str, args, timer, flush_bytes) -> dict:
    bind = problem.methods()[method].bind

    def prepare() -> list:
        if layout == "same":
            return [bind(problem, inputs, config)] * args.preps
        return [bind(problem, inputs, config) for _ in range(args.preps)]

    preps = prepare()
    checks = []
    for p in preps:
        p.out.fill_(float("nan"))
        p()
        torch.cuda.synchronize()
        checks.append(compare(p.out, expected, **TOLERANCE)["passed"])
    medians = [[] for _ in preps]
    addresses = [[where(p)] for p in preps]
    for r in range(args.rounds):
        if layout == "fresh" and r > 0:
            preps = None
            preps = prepare()
            for i, p in enumerate(preps):
                addresses[i].append(where(p))
        order = list(range(len(preps)))
        order = order[r % len(order) :] + order[: r % len(order)]
        if r % 2:
            order.reverse()
        for i in order:
            medians[i].append(timed(timer, preps[i], args.batch, flush_bytes))
    per_prep = [statistics.median(m) for m in medians]
    # One preparation's round-to-round noise: the median absolute deviation
    # of its round medians from its own median, relative, pooled.
    mad = statistics.median(abs(x / c - 1) for m, c in zip(medians, per_prep) for x in m)
    lo, hi = min(per_prep), max(per_prep)
    return {
        "layout": layout,
        "checks": checks,
        "per_prep_us": per_prep,
        "rounds_us": medians,
        "spread": hi / lo - 1,
        "round_mad": mad,
        "addresses": addresses,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="32:2880:2048,32:2880:4096", help="E:N:M,...")
    ap.add_argument("--methods", default="fused_moe,fused_moe_vllm")
    ap.add_argument("--picks", default=str(REPO / "results/gptoss/NVIDIA_H200/best.csv"))
    ap.add_argument("--preps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layouts", default="separate", help="separate,same,fresh")
    ap.add_argument("--pairs", action="store_true", help="time two preparations against each other three ways")
    ap.add_argument("--plant", type=float, default=0.03)
    args = ap.parse_args()
    timer = CudaEventTimer(torch)
    flush_bytes = 2 * torch.cuda.get_device_properties(0).L2_cache_size
    doc = {
        "meta": {
            "device": torch.cuda.get_device_name(0),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python3 bench/prep_spread.py " + " ".join(sys.argv[1:]),
            "torch": torch.__version__,
        },
        "rows": [],
    }
    for spec in args.shapes.split(","):
        E, N, M = (int(x) for x in spec.split(":"))
        shape = {"M": M, "E": E, "topk": 4, "K": 2880, "N": N, "dtype": "bf16", "activation": "silu"}
        problem = FusedMoE(shape)
        inputs = problem.inputs(0, "cuda")
        expected = problem.reference(inputs)
        for method in args.methods.split(","):
            config = picked_config(Path(args.picks), method, E, N, M)
            if args.pairs:
                print(f"E={E} N={N} M={M}", flush=True)
                doc["rows"] += [
                    dict(r, shape=shape, config=config)
                    for r in pair_noise(problem, inputs, method, config, args, timer, flush_bytes)
                ]
                Path(args.out).write_text(json.dumps(doc, indent=1))
                continue
            for layout in args.layouts.split(","):
                row = experiment(problem, inputs, expected, method, config, layout, args, timer, flush_bytes)
                row.update({"shape": shape, "method": method, "config": config})
                doc["rows"].append(row)
                print(
                    f"E={E} N={N} M={M} {method:22s} {layout:8s} spread {row['spread'] * 100:5.2f} %  "
                    f"round MAD {row['round_mad'] * 100:5.2f} %  per prep "
                    + " ".join(f"{x:8.1f}" for x in row["per_prep_us"]),
                    flush=True,
                )
                Path(args.out).write_text(json.dumps(doc, indent=1))
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
