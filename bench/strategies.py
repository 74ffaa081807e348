"""How close each search strategy gets to the exhaustive best on gpt-oss MoE shapes.

    python bench/strategies.py --tunelab .bin/tunelab [--only E=32,N=2880]
        [--strategies grid,random,surrogate,halving] [--budget 16] [--reuse halving=RESULTS_DIR]

Runs `tunelab run experiments/gptoss.yaml --only ...` once per strategy, each
in its own results directory; grid (exhaustive) runs first and its Triton
cache is copied to the others, so every strategy's wall time is measurement,
not compilation. `--reuse NAME=DIR` takes a strategy's results from an
earlier run of the same manifest and shapes on the same GPU model instead.

For every shape, a strategy's pick is the fastest config it measured (its
finalists' re-timing where it has one). Its gap is read from the grid run's
own timing of that config, against the grid's best: one set of measurements,
so run-to-run noise does not enter. Also reported: the share of configs each
strategy measured fully, and its wall time.

Writes results/bench/<device>/strategies.md and strategies.json.
"""

import argparse
import datetime
import gzip
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MANIFEST = "experiments/gptoss.yaml"
STEP_TIMEOUT_S = 3600


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tunelab", default=str(REPO / "target/release/tunelab"))
    p.add_argument("--only", default="E=32,N=2880")
    p.add_argument("--strategies", default="grid,random,surrogate,halving")
    p.add_argument(
        "--budget",
        type=int,
        default=16,
        help="configs per shape for random and surrogate (default 16, about 30 %% of the space)",
    )
    p.add_argument("--reuse", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--out-dir", default=str(REPO / "results/bench"))
    p.add_argument("--work", help="keep per-strategy results here (default: a temporary directory)")
    return p.parse_args(argv)


def read_journal(results_dir):
    """A run's journal, packed (journal.jsonl.gz, as committed) and live (journal.jsonl) in that order."""
    dirs = sorted({p.parent for p in Path(results_dir).glob("**/journal.jsonl*")})
    if len(dirs) != 1:
        raise SystemExit(f"expected one results directory under {results_dir}, found {dirs}")
    header, jobs, finals = None, {}, {}
    lines = []
    packed, live = dirs[0] / "journal.jsonl.gz", dirs[0] / "journal.jsonl"
    if packed.is_file():
        lines += gzip.decompress(packed.read_bytes()).decode().splitlines()
    if live.is_file():
        lines += live.read_text().splitlines()
    for line in lines:
        if not line.strip():
            continue
        rec = json.loads(line)
        kind = rec.get("type")
        if kind == "run" and header is None:
            header = rec
        elif kind == "job":
            jobs[rec["job_id"]] = rec
        elif kind == "final":
            finals[rec["job_id"]] = rec
    return dirs[0], header, jobs, finals


def shape_key(shape):
    return json.dumps({k: shape[k] for k in sorted(shape)}, sort_keys=True)


def picks(jobs, finals, only):
    """Per shape: the chosen job id and counts (measured fully, configs)."""
    by_shape = {}
    for j in jobs.values():
        if not matches(j["shape"], only):
            continue
        by_shape.setdefault(shape_key(j["shape"]), []).append(j)
    out = {}
    for key, group in by_shape.items():
        ok = [j for j in group if j["status"] == "ok" and j.get("stats")]
        if not ok:
            continue

        def time_us(j):
            return (finals.get(j["job_id"]) or j)["stats"]["median_us"]

        best = min(ok, key=time_us)
        candidates = [j for j in group if not j["baseline"]]
        out[key] = {
            "shape": group[0]["shape"],
            "pick": best["job_id"],
            "pick_config": best["config"],
            "full": sum(1 for j in candidates if j["status"] == "ok"),
            "configs": len(candidates),
        }
    return out


def matches(shape, only):
    for part in filter(None, only.split(",")):
        key, _, value = part.partition("=")
        if str(shape.get(key.strip())) != value.strip():
            return False
    return True


def run_strategy(args, name, work, cache_from):
    results = work / name
    if cache_from is not None:
        for cache in cache_from.glob("**/.cache/triton"):
            dest = results / cache.relative_to(cache_from)
            shutil.copytree(cache, dest, dirs_exist_ok=True)
    cmd = [
        args.tunelab,
        "run",
        MANIFEST,
        "--only",
        args.only,
        "--results-dir",
        str(results),
        "--quiet",
        "--trace",
        str(results / "trace.json"),
        "--set",
        f"search.strategy={name}",
    ]
    if name in ("random", "surrogate"):
        cmd += ["--set", f"search.budget={args.budget}"]
    print(f"strategies: {name}: {shlex.join(cmd)}", file=sys.stderr)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 3):
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return results, wall, shlex.join(cmd)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if "grid" not in strategies:
        raise SystemExit("grid (the exhaustive reference) must be one of the strategies")
    reuse = dict(r.split("=", 1) for r in args.reuse)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tunelab-strategies-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = {}
    order = ["grid"] + [s for s in strategies if s != "grid"]
    for name in order:
        if name in reuse:
            runs[name] = {"dir": Path(reuse[name]), "wall_s": None, "command": f"reused: {reuse[name]}"}
            continue
        results, wall, cmd = run_strategy(args, name, work, None if name == "grid" else work / "grid")
        runs[name] = {"dir": results, "wall_s": wall, "command": cmd}

    _, header, grid_jobs, grid_finals = read_journal(runs["grid"]["dir"])
    grid = picks(grid_jobs, grid_finals, args.only)
    grid_time = {
        j["job_id"]: j["stats"]["median_us"] for j in grid_jobs.values() if j["status"] == "ok" and j.get("stats")
    }
    table = {}
    for name, run in runs.items():
        _, _, jobs, finals = read_journal(run["dir"])
        mine = picks(jobs, finals, args.only)
        rows = []
        for key, ref in sorted(grid.items(), key=lambda kv: kv[1]["shape"]["M"]):
            best_us = grid_time[ref["pick"]]
            got = mine.get(key)
            chosen_us = grid_time.get(got["pick"]) if got else None
            rows.append(
                {
                    "M": ref["shape"]["M"],
                    "grid_best_us": best_us,
                    "pick_config": got["pick_config"] if got else None,
                    "pick_us_in_grid_run": chosen_us,
                    "gap_pct": (chosen_us / best_us - 1.0) * 100.0 if chosen_us else None,
                    "measured_fully": got["full"] if got else None,
                    "configs": ref["configs"],
                }
            )
        gaps = [r["gap_pct"] for r in rows if r["gap_pct"] is not None]
        fractions = [r["measured_fully"] / r["configs"] for r in rows if r["measured_fully"] is not None]
        table[name] = {
            "wall_s": run["wall_s"],
            "command": run["command"],
            "shapes": rows,
            "max_gap_pct": max(gaps) if gaps else None,
            "median_gap_pct": statistics.median(gaps) if gaps else None,
            "shapes_within_2pct": sum(1 for g in gaps if g <= 2.0),
            "measured_fully_mean": statistics.mean(fractions) if fractions else None,
        }
    device = header["device"]["vllm_name"]
    facts = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": header["device"]["name"],
        "manifest": MANIFEST,
        "only": args.only,
        "budget": args.budget,
        "command": shlex.join([sys.executable, *sys.argv]),
        "strategies": table,
    }
    out = Path(args.out_dir) / device
    out.mkdir(parents=True, exist_ok=True)
    (out / "strategies.json").write_text(json.dumps(facts, indent=2) + "\n")
    (out / "strategies.md").write_text(render(facts))
    print(render(facts))
    return 0


def fmt(v, pattern):
    return "—" if v is None else pattern.format(v)


def render(f):
    lines = [f"# Search strategies vs the exhaustive best, {f['gpu']}", ""]
    lines.append(
        f"`{f['manifest']}` restricted to `--only {f['only']}` (every M vLLM tunes), bf16. "
        f"random and surrogate measure {f['budget']} configs per shape (plus the vLLM-default baseline). "
        "Gap: the grid run's timing of the strategy's pick against the grid's best, so both come from "
        "one set of measurements. Measured fully: configs given the full protocol / configs in the space."
    )
    lines.append("")
    lines.append("| strategy | wall s | shapes within 2 % | median gap | worst gap | measured fully |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, s in f["strategies"].items():
        n = len(s["shapes"])
        lines.append(
            f"| {name} | {fmt(s['wall_s'], '{:.0f}')} | {s['shapes_within_2pct']} / {n} "
            f"| {fmt(s['median_gap_pct'], '{:+.2f} %')} | {fmt(s['max_gap_pct'], '{:+.2f} %')} "
            f"| {fmt(s['measured_fully_mean'], '{:.0%}')} |"
        )
    lines.append("")
    lines.append("Per shape (gap to the grid's best):")
    lines.append("")
    names = list(f["strategies"])
    lines.append("| M | grid best µs | " + " | ".join(names) + " |")
    lines.append("| ---: | ---: | " + " | ".join("---:" for _ in names) + " |")
    grid_rows = f["strategies"]["grid"]["shapes"]
    for i, row in enumerate(grid_rows):
        cells = [fmt(f["strategies"][n]["shapes"][i]["gap_pct"], "{:+.2f} %") for n in names]
        lines.append(f"| {row['M']} | {row['grid_best_us']:.1f} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"- date (UTC): {f['date_utc']}; command: `{f['command']}`")
    for name, s in f["strategies"].items():
        lines.append(f"- {name}: `{s['command']}`")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
