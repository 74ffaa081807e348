"""`tunelab profile`: a results directory's winners re-run under Proton (and
Nsight Compute when `ncu` is on PATH). Needs a GPU.

    python -m tunelab.workbench.profile DIR/profile/request.json --out DIR/profile [--no-ncu]

The request (written by the runner, `src/workbench/profile.rs`) lists each job
as a worker takes it. Each job is checked again in this process (the worker's
own `check`, so an `ir:` method runs from its IR file and compile options
apply), warmed up, and launched `calls` times inside a Proton scope named
`shape/method` that carries the call's flops and bytes; CUPTI puts each kernel
launch under it with its GPU time. The Proton session is active only around
those launches, so checks and warm-ups are not in the profile.

With `ncu` on PATH, each job is also launched once in a child process under
Nsight Compute (`--profile-from-start off`: the child opens the profiler
around that one launch only), sections SpeedOfLight, LaunchStats, Occupancy
and MemoryWorkloadAnalysis, one `.ncu-rep` per job.

Writes under --out: `proton.hatchet`, `ncu/<job>.ncu-rep`, `summary.json`,
`summary.md`. Exit status: 0, 3 when some job could not be profiled, 4 when
this machine cannot profile (no GPU, no Proton).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

NCU_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis")
# ncu metric -> (summary key, what it is)
NCU_METRICS = {
    "gpu__time_duration.sum": ("duration", "duration"),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("sm_pct", "SM throughput, % of peak"),
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("mem_pct", "memory throughput, % of peak"),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("dram_pct", "DRAM throughput, % of peak"),
    "launch__registers_per_thread": ("regs", "registers per thread"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("occupancy_pct", "achieved occupancy, %"),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical_occupancy_pct", "theoretical occupancy, %"),
}


# Proton's scope for the work its launch hook does (libproton.metadata_scope_name):
# not part of the profiled call.
METADATA_SCOPE = "__proton_launch_metadata"


class CannotProfile(Exception):
    """This machine cannot profile (exit 4)."""


# --------------------------------------------------------------------------
# running the jobs


def _worker():
    import torch

    if not torch.cuda.is_available():
        raise CannotProfile("needs a GPU: it re-runs the winners on one under Proton and Nsight Compute, "
                            "and none is visible here")
    from tunelab.worker import Worker

    return Worker(role="lane", mode="gpu")


def _prepare(worker, job: dict, seed: int):
    """Check the job as a lane does and warm it up; the prepared job, or an error text."""
    from tunelab.worker import WorkerError

    try:
        result = worker.check({"job": job["job"], "seed": seed, "tolerance": job["tolerance"]})
    except WorkerError as err:
        return None, f"{err.failure_class}: {err.message.splitlines()[0]}"
    if not result["passed"]:
        return None, f"its check failed again (mismatch fraction {result['mismatch_frac']})"
    worker.warmup({"job_id": job["job"]["job_id"], "min_launches": 10, "min_ms": 20.0})
    return worker.prepared, None


def run_proton(request: dict, out: Path) -> dict:
    """Profiles every job under one Proton session; {label: error} of those that failed."""
    worker = _worker()
    try:
        import triton.profiler as proton
    except Exception as exc:  # noqa: BLE001 - Proton missing or not built for this platform
        raise CannotProfile(f"Proton (triton.profiler) does not import here: {exc}") from exc
    import torch

    from tunelab.workbench import jit

    failed = {}
    calls = int(request.get("calls", 20))
    session = proton.start(str(out / "proton"), hook="triton")
    proton.deactivate(session)
    try:
        for job in request["jobs"]:
            prepared, error = _prepare(worker, job, request.get("seed", 0))
            if error:
                failed[job["label"]] = error
                continue
            torch.cuda.synchronize()
            metrics = {k: float(job[k]) for k in ("flops", "bytes") if job.get(k)}
            proton.activate(session)
            with jit.active(prepared.ctx), proton.scope(job["label"], metrics):
                for _ in range(calls):
                    prepared.launch()
                torch.cuda.synchronize()
            proton.deactivate(session)
    finally:
        proton.finalize()
    return failed


def ncu_child(request: dict, index: int) -> int:
    """Inside `ncu --profile-from-start off`: one job, one launch between profiler start and stop."""
    import torch

    from tunelab.workbench import jit

    worker = _worker()
    job = request["jobs"][index]
    prepared, error = _prepare(worker, job, request.get("seed", 0))
    if error:
        print(f"tunelab profile: {job['label']}: {error}", file=sys.stderr)
        return 3
    torch.cuda.synchronize()
    cudart = torch.cuda.cudart()
    cudart.cudaProfilerStart()
    with jit.active(prepared.ctx):
        prepared.launch()
    torch.cuda.synchronize()
    cudart.cudaProfilerStop()
    return 0


def run_ncu(request_path: Path, request: dict, out: Path, ncu: str) -> dict:
    """One ncu report per job; {label: error} of those that failed."""
    failed = {}
    (out / "ncu").mkdir(parents=True, exist_ok=True)
    for i, job in enumerate(request["jobs"]):
        report = out / "ncu" / slug(job["label"])
        cmd = [ncu, "--profile-from-start", "off", "--target-processes", "all", "--force-overwrite",
               "--export", str(report)]
        for section in NCU_SECTIONS:
            cmd += ["--section", section]
        cmd += [sys.executable, "-m", "tunelab.workbench.profile", str(request_path), "--out", str(out),
                "--ncu-child", str(i)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not report.with_name(report.name + ".ncu-rep").is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            failed[job["label"]] = "ncu: " + " | ".join(tail)
    return failed


def ncu_rows(ncu: str, report: Path) -> list:
    """The kernels of one report, as dicts of the NCU_METRICS keys (strings with units)."""
    done = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw"], capture_output=True, text=True)
    if done.returncode != 0:
        return []
    return parse_ncu_raw(done.stdout)


def parse_ncu_raw(text: str) -> list:
    """`ncu --csv --page raw`: a header row of metric names, a row of units, a row per kernel."""
    rows = list(csv.reader(io.StringIO(text)))
    # ncu may print its own notes (==PROF== ...) before the table.
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if start is None or start + 1 >= len(rows):
        return []
    header, units = rows[start], rows[start + 1]
    out = []
    for row in rows[start + 2:]:
        if len(row) != len(header):
            continue
        cells = dict(zip(header, row))
        unit = dict(zip(header, units))
        kernel = {"kernel": cells.get("Kernel Name", ""), "block": cells.get("Block Size", ""),
                  "grid": cells.get("Grid Size", "")}
        for metric, (key, _) in NCU_METRICS.items():
            if metric in cells and cells[metric] not in ("", "n/a"):
                kernel[key] = f"{cells[metric]} {unit.get(metric, '')}".strip()
        out.append(kernel)
    return out


# --------------------------------------------------------------------------
# reading Proton's profile


def hatchet_scopes(data, labels) -> dict:
    """{label: {"kernels": {name: [count, time_ns]}, "metrics": {...}}} from a
    Proton tree profile (`proton.hatchet`): for each scope named by a label,
    the GPU time and launch count of the kernels under it."""
    roots = data if isinstance(data, list) else [data]
    found = {}

    def kernels_under(node, acc):
        for child in node.get("children", []):
            metrics = child.get("metrics", {})
            name = child.get("frame", {}).get("name", "?")
            if name.startswith(METADATA_SCOPE):
                continue  # what Proton's launch hook itself ran to compute a launch's metrics
            if "time (ns)" in metrics:
                entry = acc.setdefault(name, [0, 0.0])
                entry[0] += int(metrics.get("count", 0) or 0)
                entry[1] += float(metrics["time (ns)"] or 0.0)
            kernels_under(child, acc)

    def walk(node):
        name = node.get("frame", {}).get("name")
        if name in labels:
            scope = found.setdefault(name, {"kernels": {}, "metrics": {}})
            kernels_under(node, scope["kernels"])
            scope["metrics"].update({k: v for k, v in node.get("metrics", {}).items() if k != "time (ns)"})
            return
        for child in node.get("children", []):
            walk(child)

    for root in roots:
        if isinstance(root, dict) and "frame" in root:
            walk(root)
    return found


def summarise(request: dict, scopes: dict, ncu: dict, failed: dict) -> list:
    """One row per job: GPU time per call, achieved rates, its kernels."""
    calls = int(request.get("calls", 20))
    rows = []
    for job in request["jobs"]:
        label = job["label"]
        scope = scopes.get(label)
        row = {"label": label, "job_id": job["job"]["job_id"], "rank": job.get("rank", 1),
               "winner_of_shape": job.get("winner_of_shape", False), "journal_us": job.get("median_us"),
               "error": failed.get(label)}
        if scope and scope["kernels"]:
            total_ns = sum(t for _, t in scope["kernels"].values())
            launches = sum(c for c, _ in scope["kernels"].values())
            per_call_s = total_ns * 1e-9 / calls
            row["gpu_us"] = per_call_s * 1e6
            row["launches_per_call"] = launches / calls
            if job.get("bytes") and per_call_s > 0:
                row["gbs"] = job["bytes"] / per_call_s / 1e9
            if job.get("flops") and per_call_s > 0:
                row["tflops"] = job["flops"] / per_call_s / 1e12
            row["kernels"] = [
                {"name": name, "launches_per_call": c / calls, "us_per_call": t * 1e-3 / calls,
                 "share": t / total_ns if total_ns else None}
                for name, (c, t) in sorted(scope["kernels"].items(), key=lambda kv: -kv[1][1])
            ]
        elif not row["error"]:
            row["error"] = "no kernel launch was recorded under its scope"
        if label in ncu:
            row["ncu"] = ncu[label]
        rows.append(row)
    return rows


def _num(x, digits=1):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.{digits}f}"


def markdown(request: dict, rows: list, files: dict) -> str:
    lines = [f"# {request['experiment']} — profiles of the winners", ""]
    lines.append(f"Device: {request['device']}. Each job was checked again, warmed up, then launched "
                 f"{request.get('calls', 20)} times inside a Proton scope; GPU µs per call is the kernels' "
                 "GPU time over those launches (gaps between launches not counted), so it sits below the "
                 "journal's median, which times the whole call under the run's protocol. Achieved GB/s and "
                 "TFLOP/s divide the problem's bytes and flops by it.")
    lines.append("")
    lines.append("| Job | Journal µs | GPU µs per call | Launches per call | GB/s | TFLOP/s | Kernels (share of GPU time) |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        name = r["label"] + (" (fastest of its shape)" if r.get("winner_of_shape") else "")
        if r.get("error") and "gpu_us" not in r:
            lines.append(f"| {name} | {_num(r.get('journal_us'))} | — | — | — | — | not profiled: {r['error']} |")
            continue
        kernels = ", ".join(f"`{k['name']}` {100 * (k['share'] or 0):.0f} %" for k in r.get("kernels", []))
        lines.append(f"| {name} | {_num(r.get('journal_us'))} | {_num(r.get('gpu_us'))} | "
                     f"{_num(r.get('launches_per_call'), 0)} | {_num(r.get('gbs'), 0)} | {_num(r.get('tflops'), 2)} | "
                     f"{kernels} |")
    with_ncu = [r for r in rows if r.get("ncu")]
    if with_ncu:
        lines += ["", "## Nsight Compute", "",
                  "One launch of each job (sections " + ", ".join(NCU_SECTIONS) + ").", "",
                  "| Job | Kernel | Duration | SM % | Memory % | DRAM % | Registers | Occupancy % (achieved / theoretical) |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in with_ncu:
            for k in r["ncu"]:
                lines.append(f"| {r['label']} | `{_short(k.get('kernel', ''))}` | {k.get('duration', '—')} | "
                             f"{k.get('sm_pct', '—')} | {k.get('mem_pct', '—')} | {k.get('dram_pct', '—')} | "
                             f"{k.get('regs', '—')} | {k.get('occupancy_pct', '—')} / "
                             f"{k.get('theoretical_occupancy_pct', '—')} |")
    elif files.get("ncu_note"):
        lines += ["", files["ncu_note"]]
    lines += ["", "Files: " + ", ".join(f"[{v}]({v})" for k, v in files.items() if k != "ncu_note" and v) + "."]
    return "\n".join(lines) + "\n"


def _short(name: str, width: int = 60) -> str:
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[: width - 1] + "…"


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9=,.+_-]+", "_", label).strip("_") or "job"


# --------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tunelab profile", description=__doc__.splitlines()[0])
    parser.add_argument("request", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-ncu", action="store_true")
    parser.add_argument("--ncu-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    request = json.loads(args.request.read_text())
    try:
        if args.ncu_child is not None:
            return ncu_child(request, args.ncu_child)
        args.out.mkdir(parents=True, exist_ok=True)
        failed = run_proton(request, args.out)
    except CannotProfile as why:
        print(f"tunelab profile: {why}", file=sys.stderr)
        return 4
    hatchet = args.out / "proton.hatchet"
    labels = {job["label"] for job in request["jobs"]}
    scopes = hatchet_scopes(json.loads(hatchet.read_text()), labels) if hatchet.is_file() else {}
    files = {"proton": hatchet.name if hatchet.is_file() else None}
    ncu_results = {}
    ncu = shutil.which("ncu")
    if args.no_ncu:
        files["ncu_note"] = "Nsight Compute: skipped (--no-ncu)."
    elif ncu is None:
        files["ncu_note"] = "Nsight Compute: `ncu` is not on PATH here, so only Proton profiled the jobs."
    else:
        for label, why in run_ncu(args.request, request, args.out, ncu).items():
            failed.setdefault(label, why)
        for job in request["jobs"]:
            report = args.out / "ncu" / (slug(job["label"]) + ".ncu-rep")
            if report.is_file():
                ncu_results[job["label"]] = ncu_rows(ncu, report)
        files["ncu"] = "ncu/"
    rows = summarise(request, scopes, ncu_results, failed)
    (args.out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    files["summary"] = "summary.json"
    (args.out / "summary.md").write_text(markdown(request, rows, files))
    for label, why in failed.items():
        print(f"tunelab profile: {label}: {why}", file=sys.stderr)
    return 3 if failed else 0


if __name__ == "__main__":
    code = main()
    # Skip the interpreter's teardown with a CUDA context and CUPTI loaded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
