"""Where a tunelab run's wall time went, from its trace (`tunelab run --trace FILE`).

    python bench/trace_breakdown.py TRACE.json[.gz] [--json]

The trace has one track per worker (its calls, each with the round trip and
the worker's own `worker_us`), one per lane's jobs (groups, waits for the
compile pool), the journal's appends and the planner. From those this reports:

- start-up: when the lane's worker and the compile workers were ready;
- the compile pool: how many compiles, their total time, the window they ran in;
- the lane: time in each worker call (check, warm-up, samples), time waiting
  for a compile, and time between calls;
- runner overhead per job: lane time inside groups that is not a worker call
  (scheduling, statistics, building records), plus the protocol's own cost
  (round trip minus worker time) per call; journal appends happen on another
  thread and are reported separately.

Used by bench/tuning_speed.py; standalone for any run.
"""

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict


def load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            spans[names.get(e["tid"], str(e["tid"]))].append(e)
    for track in spans.values():
        track.sort(key=lambda e: e["ts"])
    return spans


def _end(e):
    return e["ts"] + e["dur"]


def _ms(us):
    return us / 1e3


def breakdown(path):
    spans = load(path)
    everything = [e for track in spans.values() for e in track]
    if not everything:
        raise ValueError(f"{path}: no spans (was the run traced?)")
    wall_us = max(_end(e) for e in everything)

    lanes = sorted(t for t in spans if t.startswith("lane") and not t.endswith(" jobs"))
    compilers = sorted((t for t in spans if t.startswith("compile")), key=lambda t: int(t[7:] or 0))
    out = {"wall_s": wall_us / 1e6, "lanes": {}, "compile_pool": None, "journal": None, "outputs_ms": None}

    starts = [e for t in compilers for e in spans[t] if e["name"] == "start-up"]
    compiles = [e for t in compilers for e in spans[t] if e["name"] == "compile"]
    if compilers:
        out["compile_pool"] = {
            "workers": len(compilers),
            "ready_median_s": statistics.median(_end(e) for e in starts) / 1e6 if starts else None,
            "ready_last_s": max(_end(e) for e in starts) / 1e6 if starts else None,
            "compiles": len(compiles),
            "compile_s_total": sum(e["dur"] for e in compiles) / 1e6,
            "compile_ms_mean": _ms(statistics.mean(e["dur"] for e in compiles)) if compiles else None,
            "first_compile_s": min(e["ts"] for e in compiles) / 1e6 if compiles else None,
            "last_compile_end_s": max(_end(e) for e in compiles) / 1e6 if compiles else None,
        }

    for lane in lanes:
        calls = [e for e in spans[lane] if e["name"] != "start-up"]
        start = [e for e in spans[lane] if e["name"] == "start-up"]
        jobs_track = spans.get(f"{lane} jobs", [])
        groups = [e for e in jobs_track if e["name"] == "group"]
        waits = [e for e in jobs_track if e["name"] == "wait for compile"]
        by_op = defaultdict(lambda: {"calls": 0, "ms": 0.0})
        for e in calls:
            by_op[e["name"]]["calls"] += 1
            by_op[e["name"]]["ms"] += _ms(e["dur"])
        # Calls inside groups, so the probe's hello before the first group is not counted.
        in_groups_us = 0.0
        for g in groups:
            lo, hi = g["ts"], _end(g)
            in_groups_us += sum(e["dur"] for e in calls if e["ts"] >= lo and _end(e) <= hi)
        wait_us = sum(e["dur"] for e in waits)
        group_us = sum(e["dur"] for e in groups)
        jobs = len({e["args"].get("job") for e in calls if e["name"] == "check" and e["args"].get("job")})
        # hello's round trip includes the worker's start-up; it is reported as such.
        protocol = [e["dur"] - e["args"]["worker_us"] for e in calls
                    if e["name"] not in ("hello", "shutdown") and isinstance(e["args"].get("worker_us"), (int, float))]
        runner_us = group_us - in_groups_us - wait_us
        out["lanes"][lane] = {
            "ready_s": _end(start[0]) / 1e6 if start else None,
            "first_group_s": groups[0]["ts"] / 1e6 if groups else None,
            "last_group_end_s": _end(groups[-1]) / 1e6 if groups else None,
            "groups": len(groups),
            "jobs": jobs,
            "calls": dict(by_op),
            "wait_for_compile_s": wait_us / 1e6,
            "in_calls_s": in_groups_us / 1e6,
            "runner_between_calls_s": runner_us / 1e6,
            "runner_ms_per_job": _ms(runner_us / jobs) if jobs else None,
            "protocol_us_per_call": statistics.mean(protocol) if protocol else None,
            "calls_per_job": len(calls) / jobs if jobs else None,
        }

    appends = spans.get("journal", [])
    if appends:
        out["journal"] = {
            "appends": len(appends),
            "ms_mean": _ms(statistics.mean(e["dur"] for e in appends)),
            "ms_max": _ms(max(e["dur"] for e in appends)),
        }
    outputs = [e for e in spans.get("runner", []) if e["name"] == "write outputs"]
    if outputs:
        out["outputs_ms"] = _ms(outputs[0]["dur"])
    return out


def overhead_per_job_ms(b):
    """Everything the runner adds per job on a lane: between calls, plus the protocol's cost of its calls."""
    lane = next(iter(b["lanes"].values()), None)
    if not lane or not lane["jobs"] or lane["protocol_us_per_call"] is None:
        return None
    return lane["runner_ms_per_job"] + lane["protocol_us_per_call"] * lane["calls_per_job"] / 1e3


def render(b):
    lines = [f"wall (trace extent): {b['wall_s']:.2f} s"]
    pool = b["compile_pool"]
    if pool:
        lines.append(
            f"compile pool: {pool['workers']} workers ready at {pool['ready_median_s'] or 0:.2f} s (median), "
            f"{pool['ready_last_s'] or 0:.2f} s (last); {pool['compiles']} compiles, "
            f"{pool['compile_s_total']:.1f} s in total ({pool['compile_ms_mean'] or 0:.0f} ms each), "
            f"from {pool['first_compile_s'] or 0:.2f} s to {pool['last_compile_end_s'] or 0:.2f} s")
    for name, lane in b["lanes"].items():
        ops = ", ".join(f"{op} {v['calls']}x {v['ms']:.0f} ms" for op, v in sorted(lane["calls"].items()))
        lines.append(f"{name}: ready at {lane['ready_s'] or 0:.2f} s, groups {lane['first_group_s'] or 0:.2f}-"
                     f"{lane['last_group_end_s'] or 0:.2f} s, {lane['jobs']} jobs; calls: {ops}")
        lines.append(f"  waiting for compiles {lane['wait_for_compile_s']:.2f} s; in calls {lane['in_calls_s']:.2f} s; "
                     f"runner between calls {lane['runner_between_calls_s'] * 1e3:.1f} ms "
                     f"({lane['runner_ms_per_job'] or 0:.3f} ms/job); protocol "
                     f"{lane['protocol_us_per_call'] or 0:.0f} us/call, {lane['calls_per_job'] or 0:.1f} calls/job")
    per_job = overhead_per_job_ms(b)
    if per_job is not None:
        lines.append(f"runner overhead per job (between calls + protocol): {per_job:.3f} ms")
    if b["journal"]:
        j = b["journal"]
        lines.append(f"journal: {j['appends']} appends, {j['ms_mean']:.2f} ms mean, {j['ms_max']:.2f} ms max "
                     "(fsync each; on the writer thread, off the lane's path)")
    if b["outputs_ms"] is not None:
        lines.append(f"outputs: {b['outputs_ms']:.0f} ms")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    args = parser.parse_args(argv)
    b = breakdown(args.trace)
    print(json.dumps(b, indent=2) if args.json else render(b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
