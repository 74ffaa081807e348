"""Issue 48's goals on one GPU, measured with the tunelab binary: `tunelab ab`
on gpt-oss's bf16 MoE at E=32 N=2880 (74 shape x method pairs) and
`tunelab compare` of separate runs. Usage, from the repository root of a
checkout with the release binary (`just gpu-bin` makes .bin/tunelab):

    /opt/torch/.venv/bin/python3 bench/ab_goals.py [STEP ...]

STEP is any of (default: all of them but tune2, in this order):

- tune1   tune bench/ab_goals.yaml (gpt-oss bf16, no companions) at
          --only E=32,N=2880 into OUT/tune1: the picks every A/B times
          (about 2.5 min on an H200);
- null    `tunelab ab` of tune1's picks against themselves, gate 2 %:
          the gate passes, at least 95 % of pairs SAME or AMBIGUOUS;
          the A/B of 74 pairs takes at most 3 minutes;
- plant3  the same with B made 3 % slower (--plant-slowdown 3%):
          SLOW at 90 % of pairs or more;
- plant10 with 10 %: SLOW at every pair;
- compare `tunelab compare` of the committed run of this device
          (results/gptoss/<device>) against tune1, and of tune1 against
          tune2 where tune2 ran, gate 2 %, default settings: the gate passes;
          the picks that agree (issue 48.5);
- tune2   a second tune like tune1 into OUT/tune2: two runs of one
          commit, for `compare` (about 2.5 min more).

A plant step also records how much of the plant B's rounds show
(`realised`: per pair, B's extra time over the plant).

--interleave samples|batches and --batch N are passed to each A/B step
(steps.json records the batch the A/B's setup took).

--picks DIR has the A/B steps time the picks of the results directory DIR
(for example the committed results/gptoss/<device>) instead of tune1's,
so that null, plant3 and plant10 need no tune first.

Each step writes its evidence under OUT (default
results/bench/<device>/ab-goals; --out DIR), journals packed for
committing; steps.json keeps each step's exit status, wall time and
headline, so steps may run in separate invocations (each under the GPU
machine's 10-minute limit); the last one prints the table of goals and
writes it to OUT/README.md. Runs nothing but the tunelab binary and this
Python's standard library.

--interpret runs the same steps in Triton's interpreter on the CPU, on one
interpreter shape and method with 1 A/A and 2 A/B rounds (OUT defaults to
a temporary folder): a check of this script, whose timings mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "bench/ab_goals.yaml"
ONLY = "E=32,N=2880"
STEPS = ["tune1", "null", "plant3", "plant10", "compare"]
GATE = "2%"


def binary() -> str:
    return os.environ.get("TUNELAB_BIN", str(ROOT / ".bin" / "tunelab"))


def tunelab(*args: str, python: str) -> tuple[int, str, float]:
    """Runs the binary from the repository root; returns (exit status, stdout, seconds)."""
    cmd = [binary(), *args, "--python", python]
    print("$", " ".join(cmd), flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    seconds = time.monotonic() - started
    sys.stdout.write(proc.stdout)
    return proc.returncode, proc.stdout, seconds


def device_dir(interpret: bool) -> str:
    if interpret:
        return "cpu-interpreter"
    out = subprocess.run([binary(), "devices", "--json"], cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    devices = json.loads(out.stdout)
    if not devices:
        sys.exit("no GPU found: these goals are measured on a GPU")
    return devices[0]["vllm_name"]


def headline_counts(text: str) -> dict:
    """`B against A over 74 pairs: 70 SAME, 3 AMBIGUOUS, 1 SLOW, 0 FAST` -> counts."""
    m = re.search(r"over (\d+) pairs?: (\d+) SAME, (\d+) AMBIGUOUS, (\d+) SLOW, (\d+) FAST", text)
    if not m:
        return {}
    pairs, same, ambiguous, slow, fast = map(int, m.groups())
    return {"pairs": pairs, "same": same, "ambiguous": ambiguous, "slow": slow, "fast": fast}


def realised(ab_dir: Path) -> dict:
    """How much of the planted slowdown B's rounds show, per pair: (the
    geometric mean of the rounds' B / A, less 1) x A's median in the A/B
    rounds, over the plant in microseconds. Returns the median share over
    the pairs, the lowest, and how many pairs realised under 2/3. Only the
    journal's last run counts: a step run again appends to its journal."""
    path = ab_dir / "journal.jsonl.gz"
    if not path.is_file():
        path = ab_dir / "journal.jsonl"
    opener = gzip.open if path.suffix == ".gz" else open
    shares: list[float] = []
    with opener(path, "rt") as f:
        for line in f:
            entry = json.loads(line)
            if entry.get("type") == "run":
                shares = []
            rounds = entry.get("rounds") or []
            if entry.get("type") != "ab_pair" or not entry.get("plant_us") or not rounds:
                continue
            ratio = math.exp(sum(math.log(r["b_us"] / r["a_us"]) for r in rounds) / len(rounds))
            a_us = sorted(r["a_us"] for r in rounds)[len(rounds) // 2]
            shares.append((ratio - 1) * a_us / entry["plant_us"])
    if not shares:
        return {}
    shares.sort()
    return {
        "pairs": len(shares),
        "median_share": round(shares[len(shares) // 2], 3),
        "lowest_share": round(shares[0], 3),
        "under_two_thirds": sum(s < 2 / 3 for s in shares),
    }


def setup_batch(ab_dir: Path):
    """Samples a side a round, as the A/B's last setup record says (None: no journal yet)."""
    journal = ab_dir / "journal.jsonl"
    if not journal.is_file():
        return None
    batch = None
    for line in journal.read_text().splitlines():
        if '"ab_setup"' in line:
            record = json.loads(line)
            if record.get("type") == "ab_setup":
                batch = record.get("batch")
    return batch


def picks_name(picks: Path) -> str:
    """The picks' directory as the repository names it, where it lies inside the repository."""
    try:
        return str(picks.resolve().relative_to(ROOT))
    except ValueError:
        return str(picks)


def pack(*dirs: Path, python: str):
    for d in dirs:
        if (d / "journal.jsonl").is_file():
            tunelab("pack", str(d), python=python)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", nargs="*", choices=[*STEPS, "tune2"], default=STEPS)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--interpret", action="store_true")
    parser.add_argument(
        "--picks",
        type=Path,
        default=None,
        help="the results directory whose picks the A/B steps time (default: OUT/tune1)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="passed to `tunelab ab --batch` (default: the binary's default)",
    )
    parser.add_argument(
        "--interleave",
        choices=["samples", "batches"],
        default=None,
        help="passed to `tunelab ab --interleave` (default: the binary's default)",
    )
    args = parser.parse_args()
    python = os.environ.get("TUNELAB_PYTHON", sys.executable)
    device = device_dir(args.interpret)
    only = "M=1,method=triton_vllm" if args.interpret else ONLY
    # A check of the script in the interpreter: the fewest rounds.
    extra = ["--interpret", "--aa-rounds", "1", "--rounds", "2"] if args.interpret else []
    if args.out is None and args.interpret:
        import tempfile

        args.out = Path(tempfile.mkdtemp(prefix="ab-goals-"))
    out = args.out or ROOT / "results" / "bench" / device / "ab-goals"
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "steps.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}

    def tuned(name: str) -> Path:
        return out / name / "gptoss" / device

    def ab(name: str, *more: str):
        picks = args.picks or tuned("tune1")
        code, text, seconds = tunelab(
            "ab",
            MANIFEST,
            "--only",
            only,
            "--a",
            str(picks),
            "--results-dir",
            str(out / name),
            "--quiet",
            *extra,
            *(["--interleave", args.interleave] if args.interleave else []),
            *(["--batch", str(args.batch)] if args.batch else []),
            *more,
            python=python,
        )
        state[name] = {
            "exit": code,
            "interleave": args.interleave or "default",
            "batch": setup_batch(out / name / "gptoss-ab" / device),
            "seconds": round(seconds, 1),
            "a_side": picks_name(picks),
            **headline_counts(text),
            "headline": next((line for line in text.splitlines() if line.startswith("B against A")), ""),
        }
        pack(out / name / "gptoss-ab" / device, python=python)
        if "--plant-slowdown" in more:
            state[name]["realised"] = realised(out / name / "gptoss-ab" / device)

    for step in args.steps:
        if step in ("tune1", "tune2"):
            code, text, seconds = tunelab(
                "run", MANIFEST, "--only", only, "--results-dir", str(out / step), "--quiet", *extra[:1], python=python
            )
            state[step] = {"exit": code, "seconds": round(seconds, 1)}
            pack(tuned(step), python=python)
        elif step == "null":
            ab("null", "--fail-on-slower", GATE)
        elif step == "plant3":
            ab("plant3", "--plant-slowdown", "3%")
        elif step == "plant10":
            ab("plant10", "--plant-slowdown", "10%")
        elif step == "compare":
            runs = [
                ("committed", ROOT / "results" / "gptoss" / device, tuned("tune1")),
                ("tunes", tuned("tune1"), tuned("tune2")),
            ]
            for name, base, new in runs:
                if not (base.is_dir() and new.is_dir()):
                    continue
                code, text, _ = tunelab(
                    "compare",
                    str(base),
                    str(new),
                    "--fail-on-slower",
                    GATE,
                    "--out",
                    str(out / f"compare-{name}.md"),
                    python=python,
                )
                picks = re.search(r"Picks: (\d+) of (\d+) pairs picked the same config in both runs \((\d+) by", text)
                first = text.splitlines()[2] if len(text.splitlines()) > 2 else ""
                state[f"compare-{name}"] = {
                    "exit": code,
                    "headline": first.strip("*"),
                    "picks": picks.groups() if picks else None,
                }
        state_path.write_text(json.dumps(state, indent=2) + "\n")

    table = summary(state)
    print("\n" + table)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        ).stdout.strip()
    except OSError:  # no git on the GPU machine: the tune's journal names the binary's commit
        commit = ""
    commit = commit or "that of the binary (its journals' fingerprint)"
    (out / "README.md").write_text(
        f"# Issue 48's goals on {device}\n\n"
        f"`python bench/ab_goals.py` ({datetime.date.today().isoformat()}, commit {commit}): "
        f"`tunelab ab` and `tunelab compare` on `{MANIFEST}` (gpt-oss bf16, no companions) at `--only {ONLY}`. "
        f"Each step's exit status, wall time and headline are in `steps.json`; the A/B reports in "
        f"`<step>/gptoss-ab/{device}/report.md`, the comparisons in `compare-*.md`.\n\n{table}\n"
    )
    return 0


def summary(state: dict) -> str:
    rows = [("goal", "measured", "met")]

    def row(goal: str, measured: str, met):
        rows.append((goal, measured, "—" if met is None else ("yes" if met else "**no**")))

    null = state.get("null", {})
    if null:
        ok = null.get("same", 0) + null.get("ambiguous", 0)
        n = null.get("pairs", 0)
        row(f"null A/B: gate {GATE} passes", f"exit {null['exit']}", null["exit"] == 0)
        row("null A/B: SAME or AMBIGUOUS >= 95 %", f"{ok} of {n}", n > 0 and ok >= 0.95 * n)
        row(
            "the A/B of 74 pairs takes <= 3 min", f"{null['seconds']:.0f} s (the whole command)", null["seconds"] <= 180
        )
    for name, share, goal in (("plant3", 0.90, ">= 90 %"), ("plant10", 1.0, "all")):
        s = state.get(name, {})
        if s:
            n, slow = s.get("pairs", 0), s.get("slow", 0)
            side = f" (A: {s['a_side']})" if s.get("a_side") else ""
            row(
                f"planted {name[5:]} %: SLOW at {goal} of pairs",
                f"{slow} of {n}; {s['seconds']:.0f} s{side}",
                n > 0 and slow >= share * n,
            )
            r = s.get("realised")
            if r:
                row(
                    f"planted {name[5:]} %: how much of it the rounds show",
                    f"{100 * r['median_share']:.0f} % at the median pair, {100 * r['lowest_share']:.0f} % at the "
                    f"lowest; under 2/3 at {r['under_two_thirds']} of {r['pairs']}",
                    None,
                )
    for name, what in (("committed", "the committed run against tune1"), ("tunes", "tune1 against tune2")):
        s = state.get(f"compare-{name}", {})
        if s:
            row(f"compare {what}: gate {GATE} passes (defaults)", f"exit {s['exit']}: {s['headline']}", s["exit"] == 0)
            if s.get("picks"):
                same, total, fastest = s["picks"]
                row(f"picks agree, {what}", f"{same} of {total} ({fastest} by the fastest alone)", None)
    for name in ("tune1", "tune2"):
        if name in state:
            row(f"{name} (tuning run)", f"exit {state[name]['exit']}, {state[name]['seconds']:.0f} s", None)
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["| " + " | ".join(r[i].ljust(width[i]) for i in range(3)) + " |" for r in rows]
    lines.insert(1, "| " + " | ".join("-" * width[i] for i in range(3)) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
