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
  (round trip minus worker time; for a check sent ahead, the native worker's
  own wait before it) of every call made inside a group but `shutdown`,
  divided by the lane's jobs (`hello` and `probe`, once per run before the
  first group, are start-up: traces before 2026-11-24 counted the probe's
  protocol too, a one-off of 5 to 15 ms over 48 jobs); journal appends happen on another thread and
  are reported separately. A call's worker time (`worker_us`) runs from the
  worker reading the request to its reply being text, so the protocol is the
  pipe's two hand-offs and the runner's own encoding and parsing;
- what the GPU waited for the runner per job: time inside groups that the
  worker that times (the native worker on a native lane) sat idle while a
  job was ready for it (compiled and not yet begun, or, once every job has
  begun, anything: the rest waits on the runner alone), from when each
  worker began on each request (`worker_at_us`, runners since 2026-11-24).
  It and the overhead above are different measures, neither a bound on the
  other: the lane's side counts lane work done while the worker was busy
  with a job sent ahead, or while no compiled job was waiting (a group's
  `describe` before the first compile ends), which delay nothing; it misses
  the worker's own waits, for a core when woken or to finish writing a
  reply, which this counts;
- how the lane met each reply (`met`, runners since the spin-then-sleep
  waits of docs/worker-protocol.md), and each worker its requests
  (`worker_met`, from the reply's `met`): spinning, asleep, or already there.

A lane N is the track `laneN` (its Python worker's calls), `laneN jobs`
(groups, waits for compiles, health checks) and, when the run launches
methods natively (`kind: cuda`, Triton's `launch: native`), `nativeN`: the
native worker's calls (`hello`, `import`, `check`, `warmup`, `sample`,
`shutdown`; `launch_cost` is bench/native_launch.py's, not a run's), its
`start-up` (process, GPU, `hello`) and the one-off `helper kernels` compile
(NVRTC, in the runner) before it. Both run while the lane's Python worker
starts (before commit 2026-11-23 they ran on the lane's thread inside the
first native group); either way they are start-up, not runner overhead.
A native job's calls are `recipe` (Triton methods) and `compare` on the
Python worker, `check`, `warmup` and `sample` on the native worker; `share`
and `import` once per shape. A job is counted once, by its `check` on
either worker.

Where the native worker compares itself, the lane sends the next job's
`check` before it reads the last one's answer (commit 2026-11-23, later): such
a call's span (`sent_ahead`) starts when the answer before it was read, and
the lane's recording of one job falls inside the next one's span. The worker
goes on to such a request from its last answer without waiting for the lane,
so its protocol cost is the worker's own wait between the two (`idle_us` in
its answer, since 2026-11-23), not the round trip minus the worker's time,
which also counts the lane's reading the answer late (asleep when it came)
though the worker was already on the next job then. Both are reported. The
overhead per job then leaves out lane work done while the worker measured;
what the GPU waited for the runner is the figure above that counts from the
worker's side.

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


# Spans on a worker's track that are not calls: its start-up, and the native
# worker's helper kernels (compiled by the runner before the worker starts).
NOT_CALLS = ("start-up", "helper kernels")
# Calls whose round trip is not protocol: hello includes the worker's start-up.
NOT_PROTOCOL = ("hello", "shutdown")


def _union_us(intervals):
    """Total length of the union of (start, end) intervals."""
    return sum(hi - lo for lo, hi in _merged(intervals))


def _merged(intervals):
    """(start, end) intervals as a sorted list of disjoint ones covering the same time."""
    out = []
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus_us(intervals, taken):
    """Total length of the union of `intervals` outside the union of `taken`: one sweep over both,
    merged and sorted (a run's calls number in the tens of thousands)."""
    total, taken, t = 0.0, _merged(taken), 0
    for lo, hi in _merged(intervals):
        while t < len(taken) and taken[t][1] <= lo:
            t += 1  # ends before this interval, so before every later one
        covered, k = 0.0, t
        while k < len(taken) and taken[k][0] < hi:
            covered += min(hi, taken[k][1]) - max(lo, taken[k][0])
            k += 1
        total += hi - lo - covered
    return total


def _gpu_waited_us(groups, timing_calls, other_calls, compiles, other_idle):
    """Time inside `groups` that the worker that times (the native worker on a native lane, else the
    lane's Python worker) sat idle while a job was ready for it: what the GPU waited for the runner,
    as the goal "runner overhead per job" means it. None for traces whose workers do not say when
    they read each request (`worker_at_us`, runners since 2026-11-24); a call with no answer (lost
    to a timeout or a crash) counts as busy over its whole span.

    A worker's own time is [worker_at_us, + worker_us] of each of its calls (either worker's: a
    Python worker's `compare` or `recipe` is the job's work, not the runner's). A job is ready from
    the end of its compile in the pool (`compiles`: job id to the end of its last compile span; a
    job with none, from the group's start) until the worker reads its first call; once every job of
    the group has had its first call, what is left (samples, finalists' re-timing, halving's later
    rounds) waits on nothing but the runner, so the rest of the group counts, less `other_idle`
    (the protocol's rests between re-timing batches, worker start-up inside a group). So: lane
    work or a slow wake-up while the worker is busy, or while no compiled job is waiting for it
    (the group's `describe` before the first compile ends), is not counted; the worker's idle
    between jobs with the next one compiled is, whatever the lane was doing.

    Not counted: the time of calls to the other worker (a group's `native_data`, a `compare`) and
    the native worker's `build`, which are work, not waiting; and, before every job has begun, idle
    between two calls of a job already begun when no other compiled job waits (on today's native
    path a job's first `check` carries its measurement, so there is none)."""
    calls = timing_calls + other_calls
    if not any(_in_groups(timing_calls, groups)):
        return None
    total = 0.0
    for g in groups:
        lo, hi = g["ts"], _end(g)
        inside = [e for e in calls if lo <= e["ts"] < hi and e["name"] not in NOT_CALLS]
        answered = [e for e in inside if e["args"].get("outcome") != "lost"]
        if any(not _number(e["args"].get("worker_at_us")) or not _number(e["args"].get("worker_us")) for e in answered):
            return None
        busy = [(e["args"]["worker_at_us"], e["args"]["worker_at_us"] + e["args"]["worker_us"]) for e in answered]
        busy += [(e["ts"], _end(e)) for e in inside if e["args"].get("outcome") == "lost"]
        first_read = {}
        for e in sorted(answered, key=lambda e: e["args"]["worker_at_us"]):
            job = e["args"].get("job")
            if job and job not in first_read:
                first_read[job] = e["args"]["worker_at_us"]
        ready = [(max(lo, compiles.get(job, lo)), read) for job, read in first_read.items()]
        if first_read:
            ready.append((max(first_read.values()), hi))
        clipped = [(max(lo, a), min(hi, b)) for a, b in ready]
        total += _minus_us(clipped, busy + [(max(lo, e["ts"]), min(hi, _end(e))) for e in other_idle])
    return total


def _in_groups(calls, groups):
    """The calls made while the lane ran a group (begun inside one)."""
    return [e for e in calls if any(g["ts"] <= e["ts"] < _end(g) for g in groups)]


def _inside(spans, groups):
    """Each span clipped to each group it overlaps, as (start, end) intervals."""
    out = []
    for g in groups:
        lo, hi = g["ts"], _end(g)
        for e in spans:
            a, b = max(lo, e["ts"]), min(hi, _end(e))
            if b > a:
                out.append((a, b))
    return out


def _median(values):
    return statistics.median(values) if values else None


def _ops(calls):
    by_op = defaultdict(lambda: {"calls": 0, "ms": 0.0})
    for e in calls:
        by_op[e["name"]]["calls"] += 1
        by_op[e["name"]]["ms"] += _ms(e["dur"])
    return dict(by_op)


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _protocol_us(calls, compile_waits=()):
    """What each call (not hello, shutdown) cost beyond the worker's own time: its round trip minus the
    worker's time; for a check sent ahead whose worker says how long it waited before it (`idle_us`),
    that wait. Such a request was queued in the worker's pipe: the worker went on to it from its last
    answer, and the lane read that answer when it got to it, off the GPU's path. Of that wait, the part
    the lane spent waiting for the job's compile (`compile_waits`, spans) is the compile pool's, not
    the runner's: with `inputs: native` the lane times jobs while the pool still compiles, and it may
    wait for the next job's compile with a check under way, reading that check's answer after it."""

    def compile_wait_within(start, end):
        return sum(max(0.0, min(end, _end(w)) - max(start, w["ts"])) for w in compile_waits)

    out = []
    for e in calls:
        a = e["args"]
        if e["name"] in NOT_PROTOCOL or not _number(a.get("worker_us")):
            continue
        if a.get("sent_ahead") and _number(a.get("worker_idle_us")):
            idle = a["worker_idle_us"]
            out.append(max(0.0, idle - compile_wait_within(e["ts"] - idle, e["ts"])))
        else:
            out.append(max(0.0, e["dur"] - a["worker_us"] - compile_wait_within(e["ts"], _end(e))))
    return out


def _met(calls, key="met"):
    """How each counted call's reply was met by the lane (`met` in the span, from runners that record
    it), or its request by the worker (`worker_met`, from workers that say): {"spinning": n,
    "asleep": n, "ready": n}, or None when no call says."""
    met = defaultdict(int)
    for e in calls:
        if e["name"] not in NOT_PROTOCOL and e["args"].get(key):
            met[e["args"][key]] += 1
    return dict(met) or None


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

    # Each job's compile end, for what the GPU waited (the last, where a job compiled twice).
    compile_ends = {}
    for e in compiles:
        job = e.get("args", {}).get("job")
        if job:
            compile_ends[job] = max(compile_ends.get(job, 0.0), _end(e))

    for lane in lanes:
        native_track = "native" + lane[len("lane") :]
        py_calls = [e for e in spans[lane] if e["name"] not in NOT_CALLS]
        start = [e for e in spans[lane] if e["name"] == "start-up"]
        native = spans.get(native_track, [])
        nat_calls = [e for e in native if e["name"] not in NOT_CALLS]
        nat_start = [e for e in native if e["name"] in NOT_CALLS]
        calls = py_calls + nat_calls
        jobs_track = spans.get(f"{lane} jobs", [])
        groups = [e for e in jobs_track if e["name"] == "group"]
        waits = [e for e in jobs_track if e["name"] == "wait for compile"]
        # The GPU resting between the finalists' re-timing batches (`protocol.retime_rest`): the
        # protocol's time, not the runner's.
        rests = [e for e in jobs_track if e["name"] == "rest"]
        # Inside groups only, so the probe's hello before the first group is not counted. The
        # lane's thread makes every call and wait in turn; the native start-up runs beside the
        # Python worker's (or, in older traces and runs without native jobs planned, inside a
        # group); a union all the same, as the native start-up span holds the native worker's hello.
        in_calls_us = _union_us(_inside(calls, groups))
        native_startup_us = _union_us(_inside(nat_start, groups))
        covered_us = _union_us(_inside(calls + nat_start + waits + rests, groups))
        wait_us = sum(e["dur"] for e in waits)
        group_us = sum(e["dur"] for e in groups)
        job_ids = {e["args"].get("job") for e in calls if e["name"] == "check" and e["args"].get("job")}
        native_job_ids = {e["args"].get("job") for e in nat_calls if e["name"] == "check" and e["args"].get("job")}
        jobs = len(job_ids)
        py_protocol = _protocol_us(_in_groups(py_calls, groups))
        nat_in_groups = _in_groups(nat_calls, groups)
        nat_protocol = _protocol_us(nat_in_groups, waits)
        protocol = py_protocol + nat_protocol
        runner_us = group_us - covered_us
        timing, helper = (nat_calls, py_calls) if nat_in_groups else (py_calls, [])
        # Not waiting for the runner: the protocol's rests, and either worker starting (again) inside
        # a group.
        gpu_waited_us = _gpu_waited_us(groups, timing, helper, compile_ends, rests + nat_start + start)
        out["lanes"][lane] = {
            "ready_s": _end(start[0]) / 1e6 if start else None,
            "first_group_s": groups[0]["ts"] / 1e6 if groups else None,
            "last_group_end_s": _end(groups[-1]) / 1e6 if groups else None,
            "groups": len(groups),
            "jobs": jobs,
            "calls": _ops(py_calls),
            "wait_for_compile_s": wait_us / 1e6,
            "rest_s": sum(e["dur"] for e in rests) / 1e6,
            "in_calls_s": in_calls_us / 1e6,
            "runner_between_calls_s": runner_us / 1e6,
            "runner_ms_per_job": _ms(runner_us / jobs) if jobs else None,
            "protocol_us_per_call": statistics.mean(protocol) if protocol else None,
            # The calls whose protocol is counted (every call but hello and shutdown), per job.
            "calls_per_job": len(protocol) / jobs if jobs else None,
            "protocol_ms_per_job": _ms(sum(protocol) / jobs) if jobs and protocol else None,
            # The worker that times idle while a job was ready for it (_gpu_waited_us), per job.
            "gpu_waited_ms_per_job": _ms(gpu_waited_us / jobs) if jobs and gpu_waited_us is not None else None,
            "python_protocol_us_per_call": statistics.mean(py_protocol) if py_protocol else None,
            "python_calls_per_job": len(py_protocol) / jobs if jobs else None,
            # Whether the lane was spinning (no CPU to wake) when each reply came, both workers.
            "replies_met": _met(calls),
            # Whether the worker was spinning when each request came.
            "python_requests_met": _met(py_calls, "worker_met"),
            "native": None
            if not native
            else {
                "track": native_track,
                "ready_s": max(_end(e) for e in nat_start if e["name"] == "start-up") / 1e6
                if any(e["name"] == "start-up" for e in nat_start)
                else None,
                "startup_s": _union_us((e["ts"], _end(e)) for e in nat_start) / 1e6,
                "startup_in_groups_s": native_startup_us / 1e6,
                "calls": _ops(nat_calls),
                # Jobs whose check the native worker ran: launched natively.
                "jobs": len(native_job_ids),
                # Triton jobs whose launch recipe the compile worker made with the compile
                # (`inputs: native`, runners since 2026-11-24): no `recipes` call for them.
                "recipes_from_pool": sum(1 for e in waits if e.get("args", {}).get("recipe")),
                "protocol_us_per_call": statistics.mean(nat_protocol) if nat_protocol else None,
                "calls_per_job": len(nat_protocol) / jobs if jobs else None,
                "requests_met": _met(nat_calls, "worker_met"),
                # Checks sent before the answer ahead of them was read (a span since then).
                "checks_sent_ahead": sum(1 for e in nat_calls if e["name"] == "check" and e["args"].get("sent_ahead")),
                # The native worker's own wait between its previous answer and such a check (its
                # `idle_us`, from runners since 2026-11-23): what the GPU waited for, as the worker saw it.
                "sent_ahead_idle_us": _median(
                    [
                        e["args"]["worker_idle_us"]
                        for e in nat_calls
                        if e["name"] == "check"
                        and e["args"].get("sent_ahead")
                        and _number(e["args"].get("worker_idle_us"))
                    ]
                ),
                # The same checks' round trip minus worker time, which also counts the lane's reading
                # the answer late (asleep when it came), shown beside it.
                "sent_ahead_round_trip_us": _median(
                    [
                        e["dur"] - e["args"]["worker_us"]
                        for e in nat_calls
                        if e["name"] == "check" and e["args"].get("sent_ahead") and _number(e["args"].get("worker_us"))
                    ]
                ),
            },
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
    """Everything the runner adds per job on a lane: between calls, plus the protocol's cost of its calls.

    Both workers' calls for a lane that launches natively. The journal's append
    (another thread) is not in it; bench/tuning_speed.py adds it.
    """
    lane = next(iter(b["lanes"].values()), None)
    if not lane or not lane["jobs"] or lane["protocol_ms_per_job"] is None:
        return None
    return lane["runner_ms_per_job"] + lane["protocol_ms_per_job"]


def gpu_waited_ms_per_job(b):
    """What the GPU waited for the runner per job on a lane (_gpu_waited_us), or None for older traces."""
    lane = next(iter(b["lanes"].values()), None)
    return lane.get("gpu_waited_ms_per_job") if lane else None


def _render_met(met):
    return ", ".join(f"{k} {v}" for k, v in sorted(met.items()))


def _render_ops(calls):
    return ", ".join(f"{op} {v['calls']}x {v['ms']:.0f} ms" for op, v in sorted(calls.items()))


def render(b):
    lines = [f"wall (trace extent): {b['wall_s']:.2f} s"]
    pool = b["compile_pool"]
    if pool:
        lines.append(
            f"compile pool: {pool['workers']} workers ready at {pool['ready_median_s'] or 0:.2f} s (median), "
            f"{pool['ready_last_s'] or 0:.2f} s (last); {pool['compiles']} compiles, "
            f"{pool['compile_s_total']:.1f} s in total ({pool['compile_ms_mean'] or 0:.0f} ms each), "
            f"from {pool['first_compile_s'] or 0:.2f} s to {pool['last_compile_end_s'] or 0:.2f} s"
        )
    for name, lane in b["lanes"].items():
        lines.append(
            f"{name}: ready at {lane['ready_s'] or 0:.2f} s, groups {lane['first_group_s'] or 0:.2f}-"
            f"{lane['last_group_end_s'] or 0:.2f} s, {lane['jobs']} jobs; calls: {_render_ops(lane['calls'])}"
        )
        nat = lane.get("native")
        if nat:
            lines.append(
                f"  native worker ({nat['track']}): {nat['jobs']} of {lane['jobs']} jobs checked there; "
                f"start-up {nat.get('startup_s', 0) * 1e3:.0f} ms (helper kernels, process, GPU, hello), "
                f"{nat['startup_in_groups_s'] * 1e3:.0f} ms of it inside the groups (not runner overhead), "
                f"ready at {nat['ready_s'] or 0:.2f} s; "
                f"calls: {_render_ops(nat['calls'])}"
            )
            if nat.get("recipes_from_pool"):
                lines.append(
                    f"  launch recipes made by the compile pool with the compile: "
                    f"{nat['recipes_from_pool']} of {lane['jobs']} jobs"
                )
            if nat.get("checks_sent_ahead"):
                idle = nat.get("sent_ahead_idle_us")
                lines.append(
                    f"  checks sent ahead (before the answer ahead of them was read): "
                    f"{nat['checks_sent_ahead']} of {nat['calls'].get('check', {}).get('calls', 0)}"
                    + (
                        f"; the native worker waited {idle:.0f} us (median) between its answer and each "
                        f"(counted as its protocol; round trip minus worker time "
                        f"{nat['sent_ahead_round_trip_us'] or 0:.0f} us)"
                        if idle is not None
                        else ""
                    )
                )
        lines.append(
            f"  waiting for compiles {lane['wait_for_compile_s']:.2f} s; in calls {lane['in_calls_s']:.2f} s; "
            f"runner between calls {lane['runner_between_calls_s'] * 1e3:.1f} ms "
            f"({lane['runner_ms_per_job'] or 0:.3f} ms/job); protocol "
            f"{lane['protocol_us_per_call'] or 0:.0f} us/call, {lane['calls_per_job'] or 0:.1f} calls/job "
            f"({lane['protocol_ms_per_job'] or 0:.3f} ms/job)"
        )
        if lane.get("rest_s"):
            lines.append(
                f"  GPU resting between the finalists' re-timing batches (protocol.retime_rest): "
                f"{lane['rest_s']:.2f} s, not runner overhead"
            )
        met = lane.get("replies_met")
        if met:
            lines.append(
                "  replies met: "
                + _render_met(met)
                + " (spinning: the lane was polling when the reply came, no CPU to wake)"
            )
        for who, wmet in (("Python", lane.get("python_requests_met")), ("native", (nat or {}).get("requests_met"))):
            if wmet:
                lines.append(f"  requests met by the {who} worker: " + _render_met(wmet))
        if nat:
            lines.append(
                f"  protocol by worker: Python {lane['python_protocol_us_per_call'] or 0:.0f} us/call x "
                f"{lane['python_calls_per_job'] or 0:.1f} calls/job, native "
                f"{nat['protocol_us_per_call'] or 0:.0f} us/call x {nat['calls_per_job'] or 0:.1f} calls/job"
            )
    per_job = overhead_per_job_ms(b)
    if per_job is not None:
        lines.append(f"runner overhead per job (between calls + protocol): {per_job:.3f} ms")
    waited = gpu_waited_ms_per_job(b)
    if waited is not None:
        lines.append(
            f"GPU waited for the runner per job (the worker that times idle while a compiled job was "
            f"ready for it): {waited:.3f} ms"
        )
    if b["journal"]:
        j = b["journal"]
        lines.append(
            f"journal: {j['appends']} appends, {j['ms_mean']:.2f} ms mean, {j['ms_max']:.2f} ms max "
            "(fsync each; on the writer thread, off the lane's path)"
        )
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
