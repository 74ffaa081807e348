"""The kernel workbench on a GPU, end to end, for one gpt-oss shape.

    cargo build --release
    python bench/workbench_gpu.py OUT [--shape E=32,N=2880,M=64] [--tunelab target/release/tunelab]

Writes everything under OUT (a fresh directory), and OUT/workbench_gpu.md
saying what ran, what it measured and what to commit:

1. `python/tests/test_workbench_gpu.py`: an IR dumped from a kernel runs as an
   `ir:` method with the source's output bits (GEMM from ttgir, ttir, llir and
   ptx; one kernel of the fused MoE); the driver's registers are the cubin's;
   an edited IR runs; Proton profiles a job. Its log: OUT/gpu_tests.txt.
2. The shape tuned (`experiments/gptoss.yaml`, method `triton`, the fused MoE)
   with `run --keep-ir`: every job records its kernels' registers, spills and
   shared memory; the winner's IR is kept under results/.../ir/.
3. `tunelab ir-pass` on the winner's GEMM kernel: Triton's pipeline for it,
   and two passes applied with their resources compared.
4. The winner's config run side by side (OUT/workbench.yaml, every job's IR
   kept): from source; from its kept TTGIR unchanged (the round trip: same
   time); from an edited TTGIR (a register cap on the GEMM kernel with the
   most registers, `ttg.maxnreg` in the module); and with the compile option
   `maxnreg` as a space axis (a cap on every kernel of the call).
5. `tunelab profile` of both results directories: Proton (and Nsight Compute
   when `ncu` is on PATH).

Needs a GPU, the worker's Python (torch, triton) and the release binary.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class Log:
    def __init__(self, out: Path):
        self.out = out
        self.steps = []

    def run(self, name: str, cmd, log_name: str, env=None, cwd=REPO) -> int:
        started = time.time()
        shown = " ".join(str(c) for c in cmd)
        print(f"== {name}: {shown}", flush=True)
        done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd)
        (self.out / log_name).write_text(f"$ {shown}\n\n{done.stdout}\n--- stderr ---\n{done.stderr}")
        seconds = time.time() - started
        self.steps.append((name, shown, done.returncode, seconds, log_name))
        print(f"   exit {done.returncode} in {seconds:.0f} s (log: {log_name})", flush=True)
        return done.returncode


def results_dir(root: Path, experiment: str) -> Path | None:
    found = sorted(p for p in (root / experiment).glob("*") if p.is_dir())
    return found[0] if found else None


def read_csv(path: Path):
    if not path.is_file():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", default="E=32,N=2880,M=64", help="the gptoss shape, as --only takes it")
    parser.add_argument("--tunelab", type=Path, default=REPO / "target" / "release" / "tunelab")
    parser.add_argument("--python", default=sys.executable, help="the worker's Python")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.tunelab.is_file():
        sys.exit(f"{args.tunelab}: build it first (cargo build --release)")
    log = Log(out)
    env = dict(os.environ, TUNELAB_PYTHON=args.python)
    env.pop("TRITON_INTERPRET", None)
    results = out / "results"
    tl = [args.tunelab, "--python", args.python, "--results-dir", results]

    # 1. what only a GPU shows, as tests
    if not args.skip_tests:
        log.run(
            "GPU tests",
            [args.python, "-m", "pytest", "-q", "-rs", "python/tests/test_workbench_gpu.py"],
            "gpu_tests.txt",
            env=dict(env, PYTHONPATH=str(REPO / "python")),
        )

    # 2. tune the shape, keeping the winner's IR
    log.run(
        "tune with --keep-ir",
        [*tl, "run", "experiments/gptoss.yaml", "--only", f"{args.shape},method=triton", "--keep-ir", "--quiet"],
        "tune.txt",
        env=env,
    )
    tuned = results_dir(results, "gptoss")
    if tuned is None:
        print("the tuning run wrote no results: see tune.txt", file=sys.stderr)
        return 1
    kept = [p for p in (tuned / "ir").glob("*/triton/job.json")]
    if not kept:
        print(f"no IR kept under {tuned / 'ir'}: see tune.txt", file=sys.stderr)
        return 1
    winner = json.loads(kept[0].read_text())
    folder = kept[0].parent
    gemms = [k for k in winner["kernels"] if "gemm" in k["name"]] or winner["kernels"]
    target = max(gemms, key=lambda k: k["n_regs"] or 0)
    cap = max(32, (int(target["n_regs"] or 64) * 3 // 4) // 8 * 8)

    # 3. Triton's pipeline on the winner's GEMM kernel
    ttgir = folder / f"{target['name']}.ttgir"
    log.run("ir-pass --list", [*tl, "ir-pass", ttgir, "--list"], "ir_pass_list.txt", env=env)
    edits = out / "edits"
    (edits / "roundtrip").mkdir(parents=True, exist_ok=True)
    (edits / "regcap").mkdir(parents=True, exist_ok=True)
    log.run(
        "ir-pass two passes",
        [
            *tl,
            "ir-pass",
            ttgir,
            "--pass",
            "ttgpuir.remove_layout_conversions",
            "--pass",
            "ttgpuir.reorder_instructions",
            "--compile",
            "--out",
            edits / f"{target['name']}.passes.ttgir",
        ],
        "ir_pass_apply.txt",
        env=env,
    )

    # 4. the winner from source, from its IR, from an edited IR, with a compile option
    shutil.copy(ttgir, edits / "roundtrip" / ttgir.name)
    # Its metadata beside each: the worker then holds the IR to the constexprs it folded in.
    for variant in ("roundtrip", "regcap"):
        shutil.copy(folder / f"{target['name']}.json", edits / variant / f"{target['name']}.json")
    text = ttgir.read_text()
    (edits / "regcap" / ttgir.name).write_text(
        text.replace("module attributes {", f'module attributes {{"ttg.maxnreg" = {cap} : i32, ', 1)
    )
    config = json.dumps(winner["config"])
    shape = json.dumps(winner["shape"])
    manifest = out / "workbench.yaml"
    description = (
        f"gptoss {args.shape}: the tuned fused-MoE config from source, from IR, from edited IR "
        f"({target['name']} capped at {cap} registers), and with maxnreg as a compile option"
    )
    manifest.write_text(f"""# Written by bench/workbench_gpu.py: the winner of {args.shape} (gptoss, method triton)
# run from source, from its kept TTGIR, from an edited TTGIR and under a compile option.
experiment: gptoss-workbench
description: "{description}"
problem: moe
shapes:
  list: [{shape}]
methods:
  triton:
    kind: triton
    kernel: fused_moe
    params: {config}
  triton_from_ir:
    kind: triton
    kernel: fused_moe
    ir: edits/roundtrip/{ttgir.name}
    params: {config}
  triton_regcap_ir:
    kind: triton
    kernel: fused_moe
    ir: edits/regcap/{ttgir.name}
    params: {config}
  triton_maxnreg:
    kind: triton
    kernel: fused_moe
    params: {config}
    space: {{maxnreg: [{cap}, 255]}}
tolerance: {{atol: 2e-2, rtol: 2e-2, max_mismatch: 0.005}}
protocol: {{retime_with: [graph]}}
search: {{strategy: grid}}
outputs:
  - {{format: jobs_csv, path: jobs.csv}}
  - {{format: best_csv, path: best.csv}}
  - {{format: ir, path: ir}}
  - {{format: report, path: report.md}}
""")
    log.run("side by side", [*tl, "run", manifest, "--keep-ir=all", "--quiet"], "side_by_side.txt", env=env)
    side = results_dir(results, "gptoss-workbench")

    # 5. profiles
    log.run("profile the tuned shape", [*tl, "profile", tuned, "--top", "2"], "profile_tuned.txt", env=env)
    if side is not None:
        log.run("profile side by side", [*tl, "profile", side, "--manifest", manifest], "profile_side.txt", env=env)
    for d in (tuned, side):
        if d is not None:
            log.run(f"pack {d.parent.name}", [*tl, "pack", d], f"pack_{d.parent.name}.txt", env=env)
            log.run(f"report {d.parent.name}", [*tl, "report", d], f"report_{d.parent.name}.txt", env=env)

    # the summary
    lines = [
        "# Kernel workbench on a GPU",
        "",
        f"Shape {args.shape} of experiments/gptoss.yaml, method `triton` (tunelab's fused MoE); "
        f"written by `bench/workbench_gpu.py` on {time.strftime('%Y-%m-%d')}.",
        "",
        "| Step | Command | Exit | Seconds | Log |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for name, shown, code, seconds, log_name in log.steps:
        shown = shown.replace(str(out) + "/", "").replace(str(REPO) + "/", "")
        lines.append(f"| {name} | `{shown}` | {code} | {seconds:.0f} | [{log_name}]({log_name}) |")
    lines += ["", f"Winner: `{json.dumps(winner['config'])}`, {winner.get('median_us')} µs; its kernels:", ""]
    lines += ["| Kernel | Registers | Spilled | Shared bytes |", "| --- | ---: | ---: | ---: |"]
    for k in winner["kernels"]:
        lines.append(f"| `{k['name']}` | {k['n_regs']} | {k['n_spills']} | {k['shared']} |")
    lines += ["", f"Edited IR: `{target['name']}` capped at {cap} registers (`ttg.maxnreg` in its TTGIR module).", ""]
    if side is not None:
        rel = lambda p: os.path.relpath(p, out)  # noqa: E731
        lines += [
            "Side by side (best.csv; each method's time is its finalist re-timing where it has one):",
            "",
            "| Method | Config | Median µs | n |",
            "| --- | --- | ---: | ---: |",
        ]
        for row in read_csv(side / "best.csv"):
            lines.append(f"| {row['method']} | `{row['config']}` | {row['median_us']} | {row['n']} |")
        lines += [
            "",
            "Registers per job (jobs.csv):",
            "",
            "| Method | Job | Status | n_regs | n_spills | Kernels |",
            "| --- | --- | --- | ---: | ---: | --- |",
        ]
        for row in read_csv(side / "jobs.csv"):
            lines.append(
                f"| {row['method']} | {row['job_id']} | {row['status']} {row['failure_class']} | "
                f"{row['n_regs']} | {row['n_spills']} | {row['kernels']} |"
            )
        lines += [
            "",
            "Links: "
            f"[tuned report]({rel(tuned / 'report.md')}), [tuned IR]({rel(tuned / 'ir')}/), "
            f"[tuned profile]({rel(tuned / 'profile' / 'summary.md')}), "
            f"[side-by-side report]({rel(side / 'report.md')}), [side-by-side IR index]({rel(side / 'ir' / 'index.md')}), "
            f"[side-by-side profile]({rel(side / 'profile' / 'summary.md')}), [manifest](workbench.yaml), "
            "[edited IR](edits/).",
        ]
    lines += [
        "",
        "## What to commit",
        "",
        "Results directories as docs/workbench.md says: the packed journal, the outputs, `ir/index.md`, "
        "each kept folder's `job.json`, `*.ttgir`, `*.ptx` and `*.json`; `profile/summary.md`, "
        "`profile/summary.json` and `profile/proton.hatchet`; not `*.llir`, `*.cubin`, `*.sass`, "
        "`*.ttir`, `*.ncu-rep`, `.cache/`, `logs/`, `jobs.csv`. And this file, `workbench.yaml`, `edits/` "
        "and the step logs.",
    ]
    (out / "workbench_gpu.md").write_text("\n".join(lines) + "\n")
    print(f"summary: {out / 'workbench_gpu.md'}")
    return 0 if all(code == 0 for _, _, code, _, _ in log.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
