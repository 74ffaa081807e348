"""`tunelab profile`: a results directory's winners re-run under Proton (and
Nsight Compute when `ncu` is on PATH). Needs a GPU.

    python -m tunelab.profiler DIR/profile/request.json --out DIR/profile [--no-ncu]

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
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tunelab.workbench.profile import NCU_SECTIONS, CannotProfile, hatchet_scopes, markdown, ncu_rows, slug, summarise


def _worker():
    import torch

    if not torch.cuda.is_available():
        raise CannotProfile(
            "needs a GPU: it re-runs the winners on one under Proton and Nsight Compute, and none is visible here"
        )
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
        cmd = [
            ncu,
            "--profile-from-start",
            "off",
            "--target-processes",
            "all",
            "--force-overwrite",
            "--export",
            str(report),
        ]
        for section in NCU_SECTIONS:
            cmd += ["--section", section]
        cmd += [sys.executable, "-m", "tunelab.profiler", str(request_path), "--out", str(out), "--ncu-child", str(i)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not report.with_name(report.name + ".ncu-rep").is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            failed[job["label"]] = "ncu: " + " | ".join(tail)
    return failed


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
        for label, reason in run_ncu(args.request, request, args.out, ncu).items():
            failed.setdefault(label, reason)
        for job in request["jobs"]:
            report = args.out / "ncu" / (slug(job["label"]) + ".ncu-rep")
            if report.is_file():
                ncu_results[job["label"]] = ncu_rows(ncu, report)
        files["ncu"] = "ncu/"
    rows = summarise(request, scopes, ncu_results, failed)
    (args.out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    files["summary"] = "summary.json"
    (args.out / "summary.md").write_text(markdown(request, rows, files))
    for label, reason in failed.items():
        print(f"tunelab profile: {label}: {reason}", file=sys.stderr)
    return 3 if failed else 0


if __name__ == "__main__":
    code = main()
    # Skip the interpreter's teardown with a CUDA context and CUPTI loaded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
