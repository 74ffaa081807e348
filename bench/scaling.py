"""How a tunelab run scales from 1 to 2 GPUs of one host, and what limits it.

    python bench/scaling.py [--tunelab target/release/tunelab] [--gpus 0,1] [-- tunelab run args, e.g. --only E=32,N=2880]
    python bench/scaling.py --simulate 4,8 results/gptoss/NVIDIA_H200 [more results dirs]

Measured mode runs `tunelab run experiments/gptoss.yaml` (its companion too)
twice, each from an empty results directory and with `--trace`: on the first
GPU of `--gpus`, then on all of them. The Triton cache lives in the results
directory, so both runs start with a cold cache: that keeps the two runs
alike (neither inherits the other's compiles) and is what a first tuning run
on a new host meets; the compile pool's share then shows in the lanes' waits
for compiles, reported below. It reports:

- wall time on 1 and 2 GPUs (the whole `tunelab run`), speedup, efficiency;
- each lane's busy fraction (time inside groups over the run's wall time);
- what limits scaling: the longest group (no lane can finish before it),
  the lanes' time waiting for the compile pool and the pool's own busy
  fraction, the journal writer's busy fraction, and the idle tail (from the
  first lane running out of groups to the last finishing);
- whether the picks agree: per (shape, method), the same config, or configs
  tied within noise (their 95 % confidence intervals overlap), or different.

It writes results/bench/<device>/scaling.{md,json}, with both runs' journals
and traces gzipped beside them (results/bench/<device>/scaling/).

`--simulate N[,N...] DIR...` predicts instead: it replays the scheduler's
dealing policy (largest estimated cost first, each group to the lane that
frees up first) on the per-group times recorded in committed journals, for N
lanes, and says plainly that it is a simulation.
"""

import argparse
import datetime
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MANIFEST = "experiments/gptoss.yaml"
# What a group costs besides its jobs, in jobs (src/plan/shard.rs).
GROUP_OVERHEAD_JOBS = 8.0


def parse_args(argv):
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tunelab", default=str(REPO / "target/release/tunelab"))
    p.add_argument("--manifest", default=MANIFEST)
    p.add_argument("--gpus", default="0,1", help="the GPUs to scale over, as `tunelab devices` numbers them (default 0,1)")
    p.add_argument("--out-dir", default=str(REPO / "results/bench"))
    p.add_argument("--work", help="keep both runs' results here (default: a temporary directory)")
    p.add_argument("--interpret", action="store_true", help="a smoke test without a GPU: interpreter lanes (--lanes 1, then 2)")
    p.add_argument("--simulate", metavar="N[,N...]", help="predict N lanes from journals instead of running")
    p.add_argument("--cores", type=int, default=16, help="host cores, for the simulated compile pool (default 16)")
    p.add_argument("dirs", nargs="*", help="with --simulate: results directories with journals")
    args = p.parse_args(argv)
    args.extra = extra
    return args


# ---------------------------------------------------------------- journals

def read_journal(d):
    """Entries of a results directory's journal: packed, then live."""
    d = Path(d)
    lines = []
    if (d / "journal.jsonl.gz").is_file():
        with gzip.open(d / "journal.jsonl.gz", "rt") as f:
            lines += f.read().splitlines()
    if (d / "journal.jsonl").is_file():
        lines += (d / "journal.jsonl").read_text().splitlines()
    entries = []
    for line in lines:
        if line.strip():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return entries


def group_key(method, shape):
    return method + "\u0001" + json.dumps(shape, sort_keys=True)


def groups_of(entries):
    """Per (method, shape): jobs, seconds in its job records, its compiles, and
    its finalists' re-timing (their wall time), from the latest record of each job."""
    latest = {}
    for e in entries:
        if e.get("type") == "job":
            latest[e["job_id"]] = e
    groups = {}
    for r in latest.values():
        g = groups.setdefault(group_key(r["method"], r["shape"]), {
            "method": r["method"], "shape": r["shape"], "jobs": 0, "seconds": 0.0, "compile_s": 0.0, "ids": set(),
            "first": float("inf"), "last": 0.0})
        g["jobs"] += 1
        g["ids"].add(r["job_id"])
        if r["status"] != "skipped":
            duration = r.get("duration_s") or 0.0
            g["seconds"] += duration
            end = _epoch(r["finished_at"])
            g["first"], g["last"] = min(g["first"], end - duration), max(g["last"], end)
        g["compile_s"] += r.get("compile_s") or 0.0
    # Halving screens every config before recording any, so its records'
    # durations overlap: a group took no longer than from its first job's
    # start to its last record (timestamps to the second).
    for g in groups.values():
        if g["last"] > 0:
            g["seconds"] = min(g["seconds"], g["last"] - g["first"] + 1.0)
    by_id = {jid: g for g in groups.values() for jid in g["ids"]}
    for e in entries:
        if e.get("type") == "final" and e["job_id"] in by_id:
            by_id[e["job_id"]]["seconds"] += (e["stats"].get("wall_ms") or 0.0) / 1e3
    return groups


def _epoch(rfc3339):
    return datetime.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def plan_cost(g):
    m = g["shape"].get("M")
    m = m if isinstance(m, (int, float)) and m > 0 else 0
    return (g["jobs"] + GROUP_OVERHEAD_JOBS) * (1 + m / 1024)


def picks(entries):
    """Per (shape, method): the selected config and its statistics (finalist
    re-timing in the run's own timing where there is one, else its own)."""
    header = next((e for e in reversed(entries) if e.get("type") == "run"), {})
    timing = header.get("protocol", {}).get("timing", "cold")
    latest, finals = {}, {}
    for e in entries:
        if e.get("type") == "job":
            latest[e["job_id"]] = e
        elif e.get("type") == "final" and e.get("timing") == timing:
            finals[e["job_id"]] = e["stats"]
    best = {}
    for r in latest.values():
        if r["status"] != "ok" or not r.get("stats"):
            continue
        st = finals.get(r["job_id"], r["stats"])
        key = group_key(r["method"], r["shape"])
        if key not in best or st["median_us"] < best[key][1]["median_us"]:
            best[key] = (r["config"], st)
    return best


def agreement(a, b):
    same = tied = differ = 0
    differing = []
    for key in sorted(set(a) & set(b)):
        (ca, sa), (cb, sb) = a[key], b[key]
        if ca == cb:
            same += 1
        elif sa["ci_low_us"] <= sb["ci_high_us"] and sb["ci_low_us"] <= sa["ci_high_us"]:
            tied += 1
        else:
            differ += 1
            method, shape = key.split("\u0001")
            differing.append({"method": method, "shape": json.loads(shape),
                              "one_gpu_us": sa["median_us"], "two_gpus_us": sb["median_us"]})
    return {"compared": same + tied + differ, "same": same, "tied": tied, "differ": differ,
            "differing": differing[:20]}


# ---------------------------------------------------------------- traces

def trace_spans(path):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    spans = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            spans[names.get(e["tid"], str(e["tid"]))].append(e)
    return spans


def analyse_trace(path, wall_s):
    spans = trace_spans(path)
    wall_us = wall_s * 1e6
    lanes = {}
    ends, starts = [], []
    longest = {"s": 0.0}
    for track, evs in spans.items():
        if not (track.startswith("lane") and track.endswith(" jobs")):
            continue
        groups = [e for e in evs if e["name"] == "group"]
        waits = [e for e in evs if e["name"] == "wait for compile"]
        busy = sum(e["dur"] for e in groups)
        lanes[track[:-5]] = {
            "groups": len(groups),
            "busy_s": busy / 1e6,
            "busy_fraction": busy / wall_us if wall_us else None,
            "wait_for_compile_s": sum(e["dur"] for e in waits) / 1e6,
        }
        if groups:
            ends.append(max(e["ts"] + e["dur"] for e in groups) / 1e6)
            starts.append(min(e["ts"] for e in groups) / 1e6)
        for e in groups:
            if e["dur"] / 1e6 > longest["s"]:
                longest = {"s": e["dur"] / 1e6, "method": e["args"].get("method"), "shape": e["args"].get("shape"),
                           "jobs": e["args"].get("jobs")}
    compiles = [e for t, evs in spans.items() if t.startswith("compile") for e in evs if e["name"] == "compile"]
    workers = len([t for t in spans if t.startswith("compile")])
    appends = [e for e in spans.get("journal", []) if e["name"] == "append"]
    pool_busy = sum(e["dur"] for e in compiles) / 1e6
    return {
        "lanes": lanes,
        "longest_group": longest,
        "idle_tail_s": (max(ends) - min(ends)) if len(ends) > 1 else 0.0,
        "first_group_s": min(starts) if starts else None,
        "compile_pool": {"workers": workers, "compiles": len(compiles), "busy_s": pool_busy,
                         "busy_fraction": pool_busy / workers / wall_s if workers and wall_s else None},
        "journal": {"appends": len(appends), "busy_s": sum(e["dur"] for e in appends) / 1e6,
                    "busy_fraction": sum(e["dur"] for e in appends) / wall_us if wall_us else None},
    }


# ---------------------------------------------------------------- measured mode

def run_once(args, label, gpus, work):
    results = Path(work) / label
    if results.exists():
        shutil.rmtree(results)
    trace = Path(work) / f"{label}.trace.json"
    cmd = [args.tunelab, "run", args.manifest, "--results-dir", str(results), "--trace", str(trace), "--quiet"]
    cmd += ["--interpret", "--lanes", str(len(gpus))] if args.interpret else ["--gpus", ",".join(map(str, gpus))]
    cmd += args.extra
    print("$", " ".join(cmd), flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO)
    wall = time.monotonic() - started
    if proc.returncode not in (0, 3):
        raise SystemExit(f"{label}: tunelab exited {proc.returncode}")
    dirs = sorted({p.parent for p in results.glob("**/journal.jsonl")})
    return {"label": label, "gpus": gpus, "wall_s": wall, "exit": proc.returncode, "dirs": dirs, "trace": trace}


def measured(args):
    gpus = [int(g) for g in args.gpus.split(",")]
    if len(gpus) < 2:
        raise SystemExit("--gpus needs two GPUs or more")
    work = args.work or tempfile.mkdtemp(prefix="tunelab-scaling-")
    one = run_once(args, "1gpu", gpus[:1], work)
    many = run_once(args, f"{len(gpus)}gpu", gpus, work)
    n = len(gpus)
    device = None
    runs = []
    for r in (one, many):
        entries = [e for d in r["dirs"] for e in read_journal(d)]
        header = next(e for e in entries if e.get("type") == "run")
        device = header["device"]["vllm_name"] if header["mode"] == "gpu" else "cpu-interpreter"
        jobs = {e["job_id"] for e in entries if e.get("type") == "job"}
        runs.append({
            "gpus": r["gpus"], "wall_s": r["wall_s"], "exit": r["exit"], "jobs": len(jobs),
            "trace": analyse_trace(r["trace"], r["wall_s"]), "picks": {str(d.relative_to(Path(work) / r["label"])): picks(read_journal(d)) for d in r["dirs"]},
        })
    speedup = runs[0]["wall_s"] / runs[1]["wall_s"]
    agree = {exp: agreement(runs[0]["picks"][exp], runs[1]["picks"].get(exp, {})) for exp in runs[0]["picks"]}
    for r in runs:
        del r["picks"]
    report = {
        "date": datetime.date.today().isoformat(),
        "device": device,
        "command": " ".join(["tunelab run", args.manifest] + args.extra),
        "triton_cache": "cold in both runs (each results directory starts empty, and holds the cache)",
        "runs": runs,
        "speedup": speedup,
        "efficiency": speedup / n,
        "picks_agree": agree,
        "limits": limits(runs[1], runs[1]["wall_s"]),
    }
    out = Path(args.out_dir) / device
    out.mkdir(parents=True, exist_ok=True)
    keep = out / "scaling"
    keep.mkdir(exist_ok=True)
    for r in (one, many):
        with open(r["trace"], "rb") as f, gzip.open(keep / f"{r['label']}.trace.json.gz", "wb") as g:
            shutil.copyfileobj(f, g)
        for d in r["dirs"]:
            name = "-".join(d.relative_to(Path(work) / r["label"]).parts)
            with open(d / "journal.jsonl", "rb") as f, gzip.open(keep / f"{r['label']}-{name}.journal.jsonl.gz", "wb") as g:
                shutil.copyfileobj(f, g)
    (out / "scaling.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "scaling.md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {out / 'scaling.md'} and scaling.json; journals and traces in {keep}")


def limits(run, wall):
    t = run["trace"]
    out = []
    if t.get("first_group_s") is not None:
        out.append(f"start-up: the first group began {t['first_group_s']:.1f} s in (workers importing torch, the first compiles)")
    lg = t["longest_group"]
    if lg.get("s"):
        out.append(f"longest group {lg['s']:.1f} s ({lg.get('method')} {lg.get('shape')}, {lg.get('jobs')} jobs): "
                   f"{100 * lg['s'] / wall:.0f} % of the wall time; no lane finishes before it")
    waits = sum(l["wait_for_compile_s"] for l in t["lanes"].values())
    pool = t["compile_pool"]
    if pool["workers"]:
        out.append(f"compile pool: {pool['workers']} workers {100 * (pool['busy_fraction'] or 0):.0f} % busy; "
                   f"lanes waited {waits:.1f} s in all for compiles")
    out.append(f"journal writer: {100 * (t['journal']['busy_fraction'] or 0):.1f} % busy ({t['journal']['appends']} appends)")
    out.append(f"idle tail: {t['idle_tail_s']:.1f} s between the first and the last lane finishing")
    return out


def markdown(r):
    n = len(r["runs"][1]["gpus"])
    lines = [f"# Scaling: 1 and {n} GPUs, {r['device']}", "",
             f"{r['date']}, `{r['command']}`; Triton cache {r['triton_cache']}.", "",
             "| | 1 GPU | %d GPUs |" % n, "| --- | ---: | ---: |",
             f"| wall time | {r['runs'][0]['wall_s']:.1f} s | {r['runs'][1]['wall_s']:.1f} s |",
             f"| jobs | {r['runs'][0]['jobs']} | {r['runs'][1]['jobs']} |",
             "", f"Speedup **{r['speedup']:.2f}x**, efficiency **{100 * r['efficiency']:.0f} %**.", "",
             "Lane busy fraction (time inside groups over the run's wall time):", ""]
    for label, run in (("1 GPU", r["runs"][0]), (f"{n} GPUs", r["runs"][1])):
        lanes = ", ".join(f"{k} {100 * (v['busy_fraction'] or 0):.0f} % ({v['groups']} groups)" for k, v in sorted(run["trace"]["lanes"].items()))
        lines.append(f"- {label}: {lanes}")
    lines += ["", f"What limits the {n}-GPU run:", ""] + [f"- {x}" for x in r["limits"]]
    lines += ["", "Picks, 1 GPU against %d (same config, or tied: 95 %% CIs overlap):" % n, ""]
    for exp, a in r["picks_agree"].items():
        lines.append(f"- {exp}: {a['compared']} (shape, method) picks: {a['same']} same, {a['tied']} tied, {a['differ']} differ")
        for d in a["differing"][:5]:
            lines.append(f"  - {d['method']} {d['shape']}: {d['one_gpu_us']:.2f} vs {d['two_gpus_us']:.2f} us")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- simulation

def deal(groups, lanes, key):
    """List scheduling: groups in order of `key`, largest first, each to the
    lane that frees up first. Returns (makespan, per-lane busy seconds)."""
    order = sorted(groups, key=key, reverse=True)
    free = [0.0] * lanes
    for g in order:
        i = min(range(lanes), key=lambda k: (free[k], k))
        free[i] += g["seconds"]
    return max(free), free


def simulate(args):
    counts = [int(x) for x in args.simulate.split(",")]
    rows = []
    for d in args.dirs:
        entries = read_journal(d)
        if not entries:
            raise SystemExit(f"{d}: no journal")
        groups = list(groups_of(entries).values())
        total = sum(g["seconds"] for g in groups)
        compile_total = sum(g["compile_s"] for g in groups)
        longest = max(groups, key=lambda g: g["seconds"])
        for n in [1] + counts:
            by_time, busy = deal(groups, n, key=lambda g: g["seconds"])
            by_plan, _ = deal(groups, n, key=plan_cost)
            pool = max(1, min(16, args.cores - n))
            rows.append({
                "dir": str(d), "lanes": n, "groups": len(groups), "group_seconds": total,
                "wall_by_measured_s": by_time, "wall_by_plan_s": by_plan,
                "efficiency_by_measured": total / (n * by_time), "efficiency_by_plan": total / (n * by_plan),
                "longest_group_s": longest["seconds"], "compile_pool_workers": pool,
                "compile_bound_s": compile_total / pool,
            })
    out = ["SIMULATION, not a measurement: the scheduler's dealing policy replayed on the per-group times",
           "(job records' durations plus finalist re-timing) of the journals below, each group as long on",
           "every lane as it was there. Start-up, the compile pool and the journal writer are not simulated;",
           "`compile-bound` is the recorded compile time over the pool the lanes leave of --cores, a floor",
           "on a cold-cache run's wall time.", "",
           "| journal | lanes | wall, measured order | eff. | wall, plan order | eff. | longest group | compile-bound |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['dir']} | {r['lanes']} | {r['wall_by_measured_s']:.0f} s | {100 * r['efficiency_by_measured']:.0f} % | "
                   f"{r['wall_by_plan_s']:.0f} s | {100 * r['efficiency_by_plan']:.0f} % | {r['longest_group_s']:.1f} s | "
                   f"{r['compile_bound_s']:.0f} s ({r['compile_pool_workers']} workers) |")
    print("\n".join(out))
    return rows


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.simulate:
        if not args.dirs:
            raise SystemExit("--simulate N[,N...] takes results directories with journals")
        simulate(args)
        return 0
    if args.dirs:
        raise SystemExit(f"unexpected arguments {args.dirs} (tunelab run arguments go after --)")
    if not args.interpret and not os.access(args.tunelab, os.X_OK):
        raise SystemExit(f"no tunelab binary at {args.tunelab}: cargo build --release")
    measured(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
