"""How a tunelab run scales over the GPUs of one host, and what limits it.

    python bench/scaling.py [--gpus 0,1] [-- tunelab run args, e.g. --only N=1440]
    python bench/scaling.py --measure N --gpus 0,1,2,3 --work DIR [-- run args]
    python bench/scaling.py --report DIR [--name scaling-4gpu]
    python bench/scaling.py --simulate 4,8 results/gptoss/NVIDIA_H200 [more results dirs]

Measured mode runs `tunelab run experiments/gptoss.yaml` (its companion too,
where `--only` fits it) from an empty results directory with `--trace`, on the
first N GPUs of `--gpus`, while nvidia-smi samples each GPU's utilisation.
The Triton cache lives in the results directory, so every run starts with a
cold cache: that keeps the runs alike (none inherits another's compiles) and
is what a first tuning run on a new host meets; the compile pool's share then
shows in the lanes' waits for compiles. With no `--measure`/`--report` it runs
1 GPU, then all of `--gpus`, then reports; `--measure N` runs one count into
DIR/<N>gpu/ (one command each, where a command's time is limited), and
`--report DIR` compares every count in DIR with the one-GPU run:

- wall time per GPU count (the whole `tunelab run`, from its start to the
  last span of its trace), speedup, efficiency;
- each lane's busy fraction (time inside groups over the run's wall time)
  and its GPU's mean utilisation (nvidia-smi);
- what limits scaling: the longest group (no lane can finish before it),
  the lanes' time waiting for the compile pool and the pool's own busy
  fraction, the journal writer's busy fraction, and the idle tail (from the
  first lane running out of groups to the last finishing);
- whether the picks agree: per (shape, method), the same config, or configs
  tied within noise (their 95 % confidence intervals overlap), or different.

It writes results/bench/<device>/<name>.{md,json} (name: scaling-<most GPUs>gpu),
with every run's journals and traces gzipped in results/bench/<device>/<name>/.

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
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tunelab", default=str(REPO / "target/release/tunelab"))
    p.add_argument("--manifest", default=MANIFEST)
    p.add_argument(
        "--gpus", default="0,1", help="the GPUs to scale over, as `tunelab devices` numbers them (default 0,1)"
    )
    p.add_argument("--out-dir", default=str(REPO / "results/bench"))
    p.add_argument("--work", help="keep the runs' results here (default: a temporary directory)")
    p.add_argument("--measure", type=int, metavar="N", help="one run on the first N GPUs of --gpus, into --work/<N>gpu")
    p.add_argument("--report", metavar="DIR", help="compare the runs in DIR (from --measure) with its one-GPU run")
    p.add_argument("--name", help="the report's file name (default scaling-<most GPUs>gpu)")
    p.add_argument(
        "--interpret", action="store_true", help="a smoke test without a GPU: interpreter lanes (--lanes 1, then 2)"
    )
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
        g = groups.setdefault(
            group_key(r["method"], r["shape"]),
            {
                "method": r["method"],
                "shape": r["shape"],
                "jobs": 0,
                "seconds": 0.0,
                "compile_s": 0.0,
                "ids": set(),
                "first": float("inf"),
                "last": 0.0,
            },
        )
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


def timed(entries):
    """Per job id: its statistics as the run ranks them (a finalist's
    re-timing in the run's own timing where there is one, else its own)."""
    header = next((e for e in reversed(entries) if e.get("type") == "run"), {})
    timing = header.get("protocol", {}).get("timing", "cold")
    latest, finals = {}, {}
    for e in entries:
        if e.get("type") == "job":
            latest[e["job_id"]] = e
        elif e.get("type") == "final" and e.get("timing") == timing:
            finals[e["job_id"]] = e["stats"]
    return latest, {
        jid: finals.get(jid, r["stats"]) for jid, r in latest.items() if r["status"] == "ok" and r.get("stats")
    }


def picks(entries):
    """Per (shape, method): the selected job, and every timed job's statistics."""
    latest, stats = timed(entries)
    best = {}
    for jid, st in stats.items():
        r = latest[jid]
        key = group_key(r["method"], r["shape"])
        if key not in best or st["median_us"] < stats[best[key]]["median_us"]:
            best[key] = jid
    return {"best": best, "config": {jid: latest[jid]["config"] for jid in best.values()}, "stats": stats}


def overlap(a, b):
    return a["ci_low_us"] <= b["ci_high_us"] and b["ci_low_us"] <= a["ci_high_us"]


def agreement(one, many):
    """The picks of two runs of one experiment. Two runs never time alike to
    the last per cent (another GPU of the host, another moment), so a
    different pick is tied when, in one run that timed both configs, their
    95 % confidence intervals overlap; it differs when neither run says so."""
    same = tied = differ = 0
    differing = []
    for key in sorted(set(one["best"]) & set(many["best"])):
        ja, jb = one["best"][key], many["best"][key]
        if ja == jb:
            same += 1
            continue
        within = [(run["stats"].get(ja), run["stats"].get(jb)) for run in (one, many)]
        if any(x and y and overlap(x, y) for x, y in within):
            tied += 1
            continue
        differ += 1
        method, shape = key.split("\u0001")
        gaps = [100 * (y["median_us"] / x["median_us"] - 1) for x, y in within if x and y]
        differing.append(
            {
                "method": method,
                "shape": json.loads(shape),
                "one_gpu_us": one["stats"][ja]["median_us"],
                "many_gpus_us": many["stats"][jb]["median_us"],
                "gap_pct_within_runs": gaps,
            }
        )
    by_method = defaultdict(int)
    for d in differing:
        by_method[d["method"]] += 1
    return {
        "compared": same + tied + differ,
        "same": same,
        "tied": tied,
        "differ": differ,
        "differ_by_method": dict(by_method),
        "differing": differing[:20],
    }


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
                longest = {
                    "s": e["dur"] / 1e6,
                    "method": e["args"].get("method"),
                    "shape": e["args"].get("shape"),
                    "jobs": e["args"].get("jobs"),
                }
    compiles = [e for t, evs in spans.items() if t.startswith("compile") for e in evs if e["name"] == "compile"]
    workers = len([t for t in spans if t.startswith("compile")])
    appends = [e for e in spans.get("journal", []) if e["name"] == "append"]
    pool_busy = sum(e["dur"] for e in compiles) / 1e6
    every = [e for evs in spans.values() for e in evs]
    return {
        "end_s": max((e["ts"] + e["dur"] for e in every), default=0) / 1e6,
        "lanes": lanes,
        "longest_group": longest,
        "idle_tail_s": (max(ends) - min(ends)) if len(ends) > 1 else 0.0,
        "first_group_s": min(starts) if starts else None,
        "compile_pool": {
            "workers": workers,
            "compiles": len(compiles),
            "busy_s": pool_busy,
            "busy_fraction": pool_busy / workers / wall_s if workers and wall_s else None,
        },
        "journal": {
            "appends": len(appends),
            "busy_s": sum(e["dur"] for e in appends) / 1e6,
            "busy_fraction": sum(e["dur"] for e in appends) / wall_us if wall_us else None,
        },
    }


# ---------------------------------------------------------------- measured mode


class Utilisation:
    """nvidia-smi's utilization.gpu of each GPU every half second, while a run
    lasts: the fraction of time a kernel ran, as NVML samples it."""

    def __init__(self, path):
        self.path = path
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.file = open(path, "w")
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits", "-lms", "500"],
                stdout=self.file,
                stderr=subprocess.DEVNULL,
            )

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.file.close()

    @staticmethod
    def mean(path, gpus):
        """Mean utilisation per GPU index over the samples."""
        if not Path(path).is_file():
            return {}
        samples = defaultdict(list)
        for line in Path(path).read_text().splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                samples[int(parts[0])].append(int(parts[1]))
        return {g: sum(samples[g]) / len(samples[g]) / 100 for g in gpus if samples.get(g)}


def run_once(args, n, gpus, work):
    """One run on the first `n` GPUs, from an empty results directory; its
    journal, trace and facts go to work/<n>gpu/."""
    label = f"{n}gpu"
    place = Path(work) / label
    if place.exists():
        shutil.rmtree(place)
    place.mkdir(parents=True)
    results = place / "results"
    trace = place / "trace.json"
    cmd = [args.tunelab, "run", args.manifest, "--results-dir", str(results), "--trace", str(trace), "--quiet"]
    cmd += ["--interpret", "--lanes", str(n)] if args.interpret else ["--gpus", ",".join(map(str, gpus[:n]))]
    cmd += args.extra
    print("$", " ".join(cmd), flush=True)
    util = Utilisation(place / "utilisation.csv") if not args.interpret else None
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO)
    wall = time.monotonic() - started
    if util:
        util.stop()
    if proc.returncode not in (0, 3):
        raise SystemExit(f"{label}: tunelab exited {proc.returncode}")
    with open(trace, "rb") as f, gzip.open(place / "trace.json.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    trace.unlink()
    facts = {
        "gpus": gpus[:n],
        "wall_s": wall,
        "exit": proc.returncode,
        "date": datetime.date.today().isoformat(),
        "command": " ".join(
            ["tunelab run", args.manifest]
            + (["--interpret", "--lanes", str(n)] if args.interpret else ["--gpus", ",".join(map(str, gpus[:n]))])
            + args.extra
        ),
        "cores": os.cpu_count(),
    }
    (place / "run.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(f"{label}: {wall:.1f} s, exit {proc.returncode}; in {place}", flush=True)


def load_run(place):
    facts = json.loads((place / "run.json").read_text())
    dirs = sorted({p.parent for p in (place / "results").glob("**/journal.jsonl")})
    entries = [e for d in dirs for e in read_journal(d)]
    header = next(e for e in entries if e.get("type") == "run")
    device = header["device"]["vllm_name"] if header["mode"] == "gpu" else "cpu-interpreter"
    trace = place / "trace.json"
    with gzip.open(place / "trace.json.gz", "rb") as f:
        trace.write_bytes(f.read())
    try:
        # The run's wall time: from the process's start (the trace's zero) to
        # its last span, so a run is timed alike whatever ran after it.
        analysed = analyse_trace(trace, 1.0)
        facts["process_wall_s"] = facts.get("wall_s")
        facts["wall_s"] = analysed["end_s"]
        analysed = analyse_trace(trace, facts["wall_s"])
    finally:
        trace.unlink()
    util = Utilisation.mean(place / "utilisation.csv", facts["gpus"])
    return {
        **facts,
        "device": device,
        "jobs": len({e["job_id"] for e in entries if e.get("type") == "job"}),
        "gpu_utilisation": {str(g): u for g, u in util.items()},
        "trace": analysed,
        "picks": {str(d.relative_to(place / "results")): picks(read_journal(d)) for d in dirs},
    }


def report(args, work):
    """Every run under `work` against the one-GPU run: scaling.{md,json}."""
    places = sorted((p for p in Path(work).glob("*gpu") if (p / "run.json").is_file()), key=lambda p: int(p.name[:-3]))
    runs = [load_run(p) for p in places]
    if not runs or len(runs[0]["gpus"]) != 1:
        raise SystemExit(f"{work}: no one-GPU run to compare with (run `measure 1` first)")
    one = runs[0]
    for r in runs:
        r["speedup"] = one["wall_s"] / r["wall_s"]
        r["efficiency"] = r["speedup"] / len(r["gpus"])
        r["picks_agree"] = {exp: agreement(one["picks"][exp], r["picks"].get(exp, {})) for exp in one["picks"]}
        r["limits"] = limits(r, r["wall_s"])
    for r in runs:
        del r["picks"]
    most = len(runs[-1]["gpus"])
    name = args.name or f"scaling-{most}gpu"
    doc = {
        "device": one["device"],
        "date": runs[-1]["date"],
        "host_cores": one.get("cores"),
        "triton_cache": "cold in every run (each results directory starts empty, and holds the cache)",
        "runs": runs,
    }
    out = Path(args.out_dir) / one["device"]
    keep = out / name
    keep.mkdir(parents=True, exist_ok=True)
    for p in places:
        shutil.copyfile(p / "trace.json.gz", keep / f"{p.name}.trace.json.gz")
        for d in sorted({j.parent for j in (p / "results").glob("**/journal.jsonl")}):
            flat = "-".join(d.relative_to(p / "results").parts)
            with open(d / "journal.jsonl", "rb") as f, gzip.open(keep / f"{p.name}-{flat}.journal.jsonl.gz", "wb") as g:
                shutil.copyfileobj(f, g)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown(doc))
    print(markdown(doc))
    print(f"wrote {out / name}.md and .json; journals and traces in {keep}")


def limits(run, wall):
    t = run["trace"]
    out = []
    if t.get("first_group_s") is not None:
        out.append(
            f"start-up: the first group began {t['first_group_s']:.1f} s in (workers importing torch, the first compiles)"
        )
    lg = t["longest_group"]
    if lg.get("s"):
        out.append(
            f"longest group {lg['s']:.1f} s ({lg.get('method')} {lg.get('shape')}, {lg.get('jobs')} jobs): "
            f"{100 * lg['s'] / wall:.0f} % of the wall time; no lane finishes before it"
        )
    waits = sum(lane["wait_for_compile_s"] for lane in t["lanes"].values())
    pool = t["compile_pool"]
    if pool["workers"]:
        out.append(
            f"compile pool: {pool['workers']} workers {100 * (pool['busy_fraction'] or 0):.0f} % busy; "
            f"lanes waited {waits:.1f} s in all for compiles"
        )
    out.append(
        f"journal writer: {100 * (t['journal']['busy_fraction'] or 0):.1f} % busy ({t['journal']['appends']} appends)"
    )
    out.append(f"idle tail: {t['idle_tail_s']:.1f} s between the first and the last lane finishing")
    return out


def markdown(doc):
    runs = doc["runs"]
    head = " | ".join(f"{len(r['gpus'])} GPU{'s' if len(r['gpus']) > 1 else ''}" for r in runs)
    lines = (
        [
            f"# Scaling over the GPUs of one host: {doc['device']}",
            "",
            f"{doc['date']}, {doc.get('host_cores')} host cores; Triton cache {doc['triton_cache']}.",
            "",
            "Commands:",
            "",
        ]
        + [f"- `{r['command']}`" for r in runs]
        + [
            "",
            f"| | {head} |",
            "| --- |" + " ---: |" * len(runs),
            "| wall time | " + " | ".join(f"{r['wall_s']:.1f} s" for r in runs) + " |",
            "| speedup over 1 GPU | " + " | ".join(f"**{r['speedup']:.2f}×**" for r in runs) + " |",
            "| efficiency | " + " | ".join(f"{100 * r['efficiency']:.0f} %" for r in runs) + " |",
            "| jobs recorded | " + " | ".join(str(r["jobs"]) for r in runs) + " |",
            "| GPU utilisation, mean over lanes (nvidia-smi) | "
            + " | ".join(
                (
                    f"{100 * sum(r['gpu_utilisation'].values()) / len(r['gpu_utilisation']):.0f} %"
                    if r["gpu_utilisation"]
                    else "n/a"
                )
                for r in runs
            )
            + " |",
            "",
            "Per lane: busy fraction (time inside groups over the run's wall time) and nvidia-smi's mean utilisation of its GPU:",
            "",
        ]
    )
    for r in runs:
        parts = []
        for k, v in sorted(r["trace"]["lanes"].items()):
            gpu = r["gpus"][int(k[4:])] if k[4:].isdigit() and int(k[4:]) < len(r["gpus"]) else None
            u = r["gpu_utilisation"].get(str(gpu)) if gpu is not None else None
            parts.append(
                f"{k} {100 * (v['busy_fraction'] or 0):.0f} % busy"
                + (f", GPU {100 * u:.0f} %" if u is not None else "")
                + f" ({v['groups']} group{'s' if v['groups'] != 1 else ''})"
            )
        lines.append(f"- {len(r['gpus'])} GPU{'s' if len(r['gpus']) > 1 else ''}: " + "; ".join(parts))
    for r in runs[1:]:
        n = len(r["gpus"])
        lines += ["", f"What limits the {n}-GPU run:", ""] + [f"- {x}" for x in r["limits"]]
    lines += [
        "",
        "Picks against the 1-GPU run: the same config, or tied (in a run that timed both,",
        "their 95 % CIs overlap), or different:",
        "",
    ]
    for r in runs[1:]:
        for exp, a in r["picks_agree"].items():
            lines.append(
                f"- {len(r['gpus'])} GPUs, {exp}: {a['compared']} (shape, method) picks: "
                f"{a['same']} same, {a['tied']} tied, {a['differ']} differ"
                + (
                    " (" + ", ".join(f"{m} {k}" for m, k in sorted(a["differ_by_method"].items())) + ")"
                    if a["differ"]
                    else ""
                )
            )
            for d in a["differing"][:5]:
                gaps = ", ".join(f"{g:+.1f} %" for g in d["gap_pct_within_runs"])
                lines.append(
                    f"  - {d['method']} {d['shape']}: {d['one_gpu_us']:.2f} µs on 1 GPU, {d['many_gpus_us']:.2f} µs"
                    + (f"; the {len(r['gpus'])}-GPU pick against the 1-GPU pick within a run: {gaps}" if gaps else "")
                )
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
            pool = max(1, min(64, args.cores - n))
            rows.append(
                {
                    "dir": str(d),
                    "lanes": n,
                    "groups": len(groups),
                    "group_seconds": total,
                    "wall_by_measured_s": by_time,
                    "wall_by_plan_s": by_plan,
                    "efficiency_by_measured": total / (n * by_time),
                    "efficiency_by_plan": total / (n * by_plan),
                    "longest_group_s": longest["seconds"],
                    "compile_pool_workers": pool,
                    "compile_bound_s": compile_total / pool,
                }
            )
    out = [
        "SIMULATION, not a measurement: the scheduler's dealing policy replayed on the per-group times",
        "(job records' durations plus finalist re-timing) of the journals below, each group as long on",
        "every lane as it was there. Start-up, the compile pool and the journal writer are not simulated;",
        "`compile-bound` is the recorded compile time over the pool the lanes leave of --cores, a floor",
        "on a cold-cache run's wall time.",
        "",
        "| journal | lanes | wall, measured order | eff. | wall, plan order | eff. | longest group | compile-bound |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['dir']} | {r['lanes']} | {r['wall_by_measured_s']:.0f} s | {100 * r['efficiency_by_measured']:.0f} % | "
            f"{r['wall_by_plan_s']:.0f} s | {100 * r['efficiency_by_plan']:.0f} % | {r['longest_group_s']:.1f} s | "
            f"{r['compile_bound_s']:.0f} s ({r['compile_pool_workers']} workers) |"
        )
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
    if args.report:
        report(args, args.report)
        return 0
    if not args.interpret and not os.access(args.tunelab, os.X_OK):
        raise SystemExit(f"no tunelab binary at {args.tunelab}: cargo build --release")
    gpus = [int(g) for g in args.gpus.split(",")]
    if args.measure:
        if not args.work:
            raise SystemExit("--measure N needs --work DIR, where --report finds it")
        if not 1 <= args.measure <= len(gpus):
            raise SystemExit(f"--measure {args.measure}: --gpus names {len(gpus)} GPUs")
        run_once(args, args.measure, gpus, args.work)
        return 0
    if len(gpus) < 2:
        raise SystemExit("--gpus needs two GPUs or more")
    work = args.work or tempfile.mkdtemp(prefix="tunelab-scaling-")
    for n in (1, len(gpus)):
        run_once(args, n, gpus, work)
    report(args, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
