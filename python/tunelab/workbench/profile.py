"""What `tunelab profile` reads from its profilers and writes: Proton's
hatchet tree per scope, Nsight Compute's raw CSV, and the summary (JSON and
markdown). The program that runs the jobs under them is `tunelab.profiler`
(`python -m tunelab.profiler`): it drives a worker, which sits above this
package, so it is not part of it.
"""

from __future__ import annotations

import csv
import io
import math
import re
import subprocess
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
    for row in rows[start + 2 :]:
        if len(row) != len(header):
            continue
        cells = dict(zip(header, row))
        unit = dict(zip(header, units))
        kernel = {
            "kernel": cells.get("Kernel Name", ""),
            "block": cells.get("Block Size", ""),
            "grid": cells.get("Grid Size", ""),
        }
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
    found: dict = {}

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
        row = {
            "label": label,
            "job_id": job["job"]["job_id"],
            "rank": job.get("rank", 1),
            "winner_of_shape": job.get("winner_of_shape", False),
            "journal_us": job.get("median_us"),
            "error": failed.get(label),
        }
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
                {
                    "name": name,
                    "launches_per_call": c / calls,
                    "us_per_call": t * 1e-3 / calls,
                    "share": t / total_ns if total_ns else None,
                }
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
    lines.append(
        f"Device: {request['device']}. Each job was checked again, warmed up, then launched "
        f"{request.get('calls', 20)} times inside a Proton scope; GPU µs per call is the kernels' "
        "GPU time over those launches (gaps between launches not counted), so it sits below the "
        "journal's median, which times the whole call under the run's protocol. Achieved GB/s and "
        "TFLOP/s divide the problem's bytes and flops by it."
    )
    lines.append("")
    lines.append(
        "| Job | Journal µs | GPU µs per call | Launches per call | GB/s | TFLOP/s | Kernels (share of GPU time) |"
    )
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        name = r["label"] + (" (fastest of its shape)" if r.get("winner_of_shape") else "")
        if r.get("error") and "gpu_us" not in r:
            lines.append(f"| {name} | {_num(r.get('journal_us'))} | — | — | — | — | not profiled: {r['error']} |")
            continue
        kernels = ", ".join(f"`{k['name']}` {100 * (k['share'] or 0):.0f} %" for k in r.get("kernels", []))
        lines.append(
            f"| {name} | {_num(r.get('journal_us'))} | {_num(r.get('gpu_us'))} | "
            f"{_num(r.get('launches_per_call'), 0)} | {_num(r.get('gbs'), 0)} | {_num(r.get('tflops'), 2)} | "
            f"{kernels} |"
        )
    with_ncu = [r for r in rows if r.get("ncu")]
    if with_ncu:
        lines += [
            "",
            "## Nsight Compute",
            "",
            "One launch of each job (sections " + ", ".join(NCU_SECTIONS) + ").",
            "",
            "| Job | Kernel | Duration | SM % | Memory % | DRAM % | Registers | Occupancy % (achieved / theoretical) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in with_ncu:
            for k in r["ncu"]:
                lines.append(
                    f"| {r['label']} | `{_short(k.get('kernel', ''))}` | {k.get('duration', '—')} | "
                    f"{k.get('sm_pct', '—')} | {k.get('mem_pct', '—')} | {k.get('dram_pct', '—')} | "
                    f"{k.get('regs', '—')} | {k.get('occupancy_pct', '—')} / "
                    f"{k.get('theoretical_occupancy_pct', '—')} |"
                )
    elif files.get("ncu_note"):
        lines += ["", files["ncu_note"]]
    lines += ["", "Files: " + ", ".join(f"[{v}]({v})" for k, v in files.items() if k != "ncu_note" and v) + "."]
    return "\n".join(lines) + "\n"


def _short(name: str, width: int = 60) -> str:
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[: width - 1] + "…"


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9=,.+_-]+", "_", label).strip("_") or "job"
