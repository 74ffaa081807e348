"""The native backend on a GPU, end to end, in one command (bench/native_gpu_check.sh).

    TUNELAB_PYTHON=/path/to/python3 bash bench/native_gpu_check.sh [OUT]

For a machine with a GPU, the worker's Python (torch, Triton) and the tunelab
binary at .bin/tunelab ($TUNELAB_BIN), with no Rust and no network. Writes
everything under OUT ($OUT, else ./native-gpu-check) and OUT/native_gpu_check.md,
the summary. Steps, each with its own time limit inside an overall budget
(--budget, 450 s); a step that fails or runs out of time is reported and the
others still run:

1. environment: the GPU, Python, torch, Triton, the binary, cc;
2. the quickstart (experiments/quickstart.yaml: Triton, the CUDA C++ method,
   torch's cuBLAS) tuned on the GPU into OUT/results, its aot output included;
3. its journal read back: every method must have ok jobs;
4. python/tests/test_native.py and python/tests/test_cuda_gemv.py on the
   GPU (the native worker, shared tensors, the CUDA GEMM natively, a Triton
   kernel natively with Python's bits, the aot dispatcher from step 2 built
   with cc; the CUDA C++ MXFP4 MoE kernel against its reference), with
   pytest from the device's Python or from the wheels in .whl/ (unpacked
   under OUT);
5. bench/native_launch.py: host cost of one launch, Triton's JIT and
   compiled launcher against the native worker.

Exit code: 0 when every step passed, else 1.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class Steps:
    def __init__(self, out: Path, budget_s: float):
        self.out = out
        self.started = time.time()
        self.deadline = self.started + budget_s
        self.rows = []

    def elapsed(self) -> float:
        return time.time() - self.started

    def run(self, name: str, cmd, log: str, cap_s: float, env=None, fine=(0,)) -> int:
        """Runs `cmd` with at most `cap_s` seconds (less when the budget is
        nearly spent); records exit code (`fine` ones are ok), time and log.
        Never raises."""
        left = self.deadline - time.time()
        limit = max(5.0, min(cap_s, left))
        shown = " ".join(str(c) for c in cmd)
        print(f"== [{self.elapsed():4.0f} s] {name} (limit {limit:.0f} s): {shown}", flush=True)
        if left < 5:
            self.rows.append((name, "skipped: the time budget is spent", 0.0, log))
            print("   skipped: the time budget is spent", flush=True)
            return 124
        t = time.time()
        path = self.out / log
        try:
            with open(path, "w") as f:
                f.write(f"$ {shown}\n\n")
                f.flush()
                proc = subprocess.Popen(
                    [str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
                )
                try:
                    rc = proc.wait(timeout=limit)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    proc.wait()
                    rc = 124
                    f.write(f"\n--- killed after {limit:.0f} s ---\n")
        except OSError as exc:
            rc = 127
            path.write_text(f"$ {shown}\n\ncould not start: {exc}\n")
        seconds = time.time() - t
        status = "ok" if rc in fine else ("timed out" if rc == 124 else f"exit {rc}")
        if rc != 0 and rc in fine:
            status = f"ok (exit {rc})"
        self.rows.append((name, status, seconds, log))
        print(f"   {status} in {seconds:.0f} s; last lines of {log}:", flush=True)
        for line in tail(path, 6):
            print(f"   | {line}", flush=True)
        return rc

    def note(self, name: str, ok: bool, text: str):
        self.rows.append((name, "ok" if ok else f"failed: {text}", 0.0, ""))
        print(f"== [{self.elapsed():4.0f} s] {name}: {'ok' if ok else 'FAILED'} {text}", flush=True)


def tail(path: Path, n: int):
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:200] for line in lines[-n:]]


def pytest_path(python: str, out: Path):
    """A PYTHONPATH entry that provides pytest: none when the Python has it,
    else the wheels of .whl/ unpacked under OUT; (path or None, why not)."""
    has = subprocess.run([python, "-c", "import pytest"], capture_output=True).returncode == 0
    if has:
        return "", None
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    if not any(w.name.startswith("pytest-") for w in wheels):
        return None, "pytest is not installed and .whl/ holds no pytest wheel"
    target = out / "pylib"
    target.mkdir(parents=True, exist_ok=True)
    for w in wheels:
        if w.name.endswith("-none-any.whl"):
            with zipfile.ZipFile(w) as z:
                z.extractall(target)
    return str(target), None


def quickstart_summary(results: Path):
    """(per method: ok / failed / other counts, best per shape, aot folders, text) of the run."""
    journals = glob.glob(str(results / "quickstart" / "*" / "journal.jsonl"))
    if not journals:
        return None, "no journal under " + str(results)
    journal = Path(journals[0])
    latest = {}
    for line in journal.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("type") == "job":
            latest[r["job_id"]] = r
    counts = {}
    for r in latest.values():
        c = counts.setdefault(r["method"], {})
        c[r["status"]] = c.get(r["status"], 0) + 1
        if r["status"] not in ("ok", "pruned", "checked"):
            failure = r.get("failure") or {}
            key = f"{r['status']}: {failure.get('class', '')}: {str(failure.get('message', ''))[:160]}"
            c.setdefault("examples", set()).add(key)
    best = []
    best_csv = journal.parent / "best.csv"
    if best_csv.exists():
        with open(best_csv) as f:
            best = list(csv.DictReader(f))
    aot = sorted(p.parent for p in journal.parent.glob("aot/*/index.json"))
    return {"dir": journal.parent, "counts": counts, "best": best, "aot": aot}, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path, default=Path(os.environ.get("OUT") or REPO / "native-gpu-check"))
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for all steps (default 450)")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    python = os.environ.get("TUNELAB_PYTHON") or sys.executable
    binary = Path(os.environ.get("TUNELAB_BIN") or REPO / ".bin" / "tunelab").resolve()
    env = dict(os.environ, TUNELAB_PYTHON=python, TUNELAB_BIN=str(binary), PYTHONUNBUFFERED="1")
    steps = Steps(out, args.budget)
    print(f"native GPU check: results under {out}, binary {binary}, Python {python}", flush=True)

    # 1. Environment.
    steps.run(
        "environment: GPU",
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"],
        "env_gpu.txt",
        30,
        env,
    )
    steps.run(
        "environment: Python",
        [
            python,
            "-c",
            "import sys, torch, triton; print(sys.version); "
            "print('torch', torch.__version__, 'cuda', torch.version.cuda, "
            "torch.cuda.is_available()); print('triton', triton.__version__)",
        ],
        "env_python.txt",
        60,
        env,
    )
    steps.run("environment: tunelab", [binary, "devices"], "env_tunelab.txt", 30, env)
    cc = shutil.which("cc") or shutil.which("gcc")
    steps.note("environment: cc", cc is not None, "no C compiler: the aot GPU test is skipped" if cc is None else "")

    # 2. The quickstart on the GPU, every method, the aot output.
    results = out / "results"
    steps.run(
        "quickstart run",
        [binary, "--results-dir", results, "run", str(REPO / "experiments/quickstart.yaml"), "--quiet"],
        "quickstart_run.txt",
        240,
        env,
        # 3: some jobs failed (a config out of resources, say): step 3 judges the methods.
        fine=(0, 3),
    )

    # 3. Every method ran.
    summary, why = quickstart_summary(results)
    methods_ok = False
    if summary is None:
        steps.note("quickstart: ok jobs per method", False, why)
    else:
        missing = [m for m in ("triton", "cuda", "torch") if summary["counts"].get(m, {}).get("ok", 0) == 0]
        methods_ok = not missing
        steps.note(
            "quickstart: ok jobs per method", methods_ok, "" if methods_ok else f"no ok job for {', '.join(missing)}"
        )
        steps.note(
            "quickstart: aot output",
            bool(summary["aot"]),
            "" if summary["aot"] else "no aot folder written (see quickstart_run.txt)",
        )

    # 4. The native tests on the GPU.
    extra, why_not = pytest_path(python, out)
    test_env = dict(env)
    test_env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO / "python"), extra or ""] if p)
    if summary and summary["aot"]:
        test_env["TUNELAB_AOT_DIR"] = str(summary["aot"][0])
    label = "python/tests/test_native.py, test_cuda_gemv.py"
    if why_not:
        steps.note(label, False, why_not)
    else:
        steps.run(
            label,
            [
                python,
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                "python/tests/test_native.py",
                "python/tests/test_cuda_gemv.py",
            ],
            "test_native.txt",
            240,
            test_env,
        )

    # 5. Launch cost.
    launch_json = out / "native_launch.json"
    steps.run(
        "bench/native_launch.py",
        [python, "bench/native_launch.py", launch_json, "--tunelab", binary],
        "native_launch.txt",
        90,
        test_env,
    )

    # The summary.
    lines = [f"# Native backend GPU check ({time.strftime('%Y-%m-%d')})", ""]
    lines += ["Written by `bench/native_gpu_check.sh`; logs beside this file.", ""]
    for log in ("env_gpu.txt", "env_python.txt"):
        lines += [f"`{log}`:", "", "```", *tail(out / log, 8), "```", ""]
    lines += ["## Steps", "", "| step | result | seconds | log |", "| --- | --- | --- | --- |"]
    for name, status, seconds, log in steps.rows:
        lines.append(f"| {name} | {status} | {seconds:.0f} | {log} |")
    lines += ["", f"Total: {steps.elapsed():.0f} s.", ""]
    if summary:
        lines += [
            "## Quickstart",
            "",
            f"Results: `{summary['dir']}`",
            "",
            "| method | jobs by status |",
            "| --- | --- |",
        ]
        for method, c in sorted(summary["counts"].items()):
            by = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k != "examples")
            lines.append(f"| {method} | {by} |")
        for method, c in sorted(summary["counts"].items()):
            for example in sorted(c.get("examples", ()))[:3]:
                lines.append(f"\n- {method}: {example}")
        if summary["best"]:
            cols = [k for k in ("M", "N", "K", "method", "time_us", "median_us", "config") if k in summary["best"][0]]
            lines += [
                "",
                "Best per shape and method (best.csv):",
                "",
                "| " + " | ".join(cols) + " |",
                "| " + " | ".join("---" for _ in cols) + " |",
            ]
            for row in summary["best"]:
                lines.append("| " + " | ".join(str(row.get(k, "")) for k in cols) + " |")
        for folder in summary["aot"]:
            index = json.loads((folder / "index.json").read_text())
            lines += [
                "",
                f"aot `{folder}`: prefix `{index['prefix']}`, {len(index['specs'])} specialisations, "
                f"buckets {', '.join(index['buckets'])}, {len(index['left_out'])} winners left out",
            ]
    tests = tail(out / "test_native.txt", 40)
    lines += ["", "## python/tests/test_native.py, test_cuda_gemv.py", "", "```", *tests[-15:], "```"]
    lines += ["", "## Launch cost (bench/native_launch.py)", ""]
    if launch_json.exists():
        report = json.loads(launch_json.read_text())
        lines += [
            f"{report['device']}, {report['date']}, torch {report['torch']}, Triton {report['triton']}; "
            f"tunelab's Triton GEMM at {report['shape']}, host µs per launch (batches of 100 queued "
            "behind a GPU spin):",
            "",
            "| launch | median µs | mean µs |",
            "| --- | --- | --- |",
        ]
        for name, r in report["results"].items():
            lines.append(f"| {name} | {r['median_us']:.2f} | {r['mean_us']:.2f} |")
        for name, e in report["errors"].items():
            lines.append(f"| {name} | failed: {e} | |")
    else:
        lines.append("No result (see native_launch.txt).")
    (out / "native_gpu_check.md").write_text("\n".join(lines) + "\n")
    print(f"\nsummary: {out / 'native_gpu_check.md'} ({steps.elapsed():.0f} s)", flush=True)
    failed = [name for name, status, _, _ in steps.rows if not status.startswith("ok")]
    for name in failed:
        print(f"FAILED: {name}", flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
