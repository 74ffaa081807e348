"""What vLLM runs for gpt-oss's MXFP4 experts on Hopper against tunelab's best, per shape.

    python bench/peers_summary.py results/gptoss-mxfp4/NVIDIA_H200 [--markdown]

Reads a results directory of experiments/gptoss-mxfp4.yaml (its best.csv and
journal, as `tunelab run` or `tunelab report` leaves them) and prints, for
every shape where the `triton_kernels` methods ran (docs/peers.md):

- vLLM: the `triton_kernels` method's baseline (triton_kernels' heuristic
  with vLLM's split_k 1 on sm_90), what vLLM 0.33 runs;
- heuristic: `triton_kernels_heuristic` (no constraint at all);
- tuned: the `triton_kernels` method's best and its constraints, and its gain
  over vLLM's setting and over the bare heuristic;
- tunelab: the fastest of tunelab's own methods and its name, and its gain
  over vLLM's;
- the tiles triton_kernels chose for vLLM's setting and the heuristic (from
  the kernels each job compiled: `_matmul_ogs_<layouts>_<dtypes>_<BM>x<BN>x<BK>x<SPLIT_K>`,
  warps, stages).

Times are best.csv's (the report's selection rule), in microseconds.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import pathlib
import re
import sys

TK = "triton_kernels"
TK_HEURISTIC = "triton_kernels_heuristic"


def journal_records(folder: pathlib.Path) -> dict:
    """job_id -> its latest job record, from journal.jsonl.gz then journal.jsonl."""
    jobs: dict = {}
    for name, opener in (("journal.jsonl.gz", gzip.open), ("journal.jsonl", open)):
        path = folder / name
        if not path.exists():
            continue
        with opener(path, "rt") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("type") == "job":
                    jobs[rec["job_id"]] = rec
    return jobs


def tiles(record) -> str:
    """The matmul_ogs kernels a job compiled: BMxBNxBKxSPLIT_K wW sS each."""
    if not record:
        return "?"
    out = []
    for k in record.get("kernels", []):
        name = k.get("name", "")
        tile = re.search(r"(\d+x\d+x\d+x\d+)", name) if "matmul_ogs" in name else None
        if tile:
            persistent = "persistent " if name.startswith("_p_matmul_ogs") else ""
            out.append(f"{persistent}{tile.group(1)} w{k.get('num_warps')} s{k.get('num_stages')}")
    return "; ".join(out) or "?"


def constraints(config_text: str) -> str:
    config = json.loads(config_text)
    parts = [f"{k}={v}" for k, v in config.items() if v]
    return " ".join(parts) or "none"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=pathlib.Path)
    args = parser.parse_args(argv)
    rows = list(csv.DictReader(open(args.dir / "best.csv")))
    jobs = journal_records(args.dir)
    shapes: dict = {}
    for r in rows:
        key = (int(r["E"]), int(r["N"]), int(r["M"]))
        shapes.setdefault(key, {})[r["method"]] = r
    print(
        "| E | N | M | vLLM µs | heuristic µs | tuned µs | tuned / vLLM | tuned / heuristic | tuned constraints "
        "| tunelab's fastest | µs | vLLM / tunelab | vLLM's tiles | heuristic's tiles |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | --- | --- |")
    for (E, N, M), methods in sorted(shapes.items()):
        tk = methods.get(TK)
        if tk is None:
            continue
        heur = methods.get(TK_HEURISTIC)
        vllm_us = float(tk["baseline_us"]) if tk.get("baseline_us") else None
        tuned_us = float(tk["median_us"])
        heur_us = float(heur["median_us"]) if heur else None
        own = [(float(r["median_us"]), m) for m, r in methods.items() if m not in (TK, TK_HEURISTIC)]
        own_us, own_m = min(own) if own else (None, "—")

        def f(v):
            return "—" if v is None else f"{v:.2f}"

        def ratio(a, b):
            return "—" if a is None or b is None else f"{a / b:.3f}×"

        print(
            f"| {E} | {N} | {M} | {f(vllm_us)} | {f(heur_us)} | {f(tuned_us)} | {ratio(vllm_us, tuned_us)} "
            f"| {ratio(heur_us, tuned_us)} | {constraints(tk['config'])} | {own_m} | {f(own_us)} "
            f"| {ratio(vllm_us, own_us)} | {tiles(jobs.get(tk.get('baseline_job_id')))} "
            f"| {tiles(jobs.get(heur['job_id'])) if heur else '—'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
