#!/usr/bin/env python3
"""Tuning speed: triton.autotune vs tunelab (grid, successive halving; Python and native launches), one GPU.

Every contender searches the same 48 configs of tunelab's Triton matmul
(python/tunelab/kernels/matmul.py) for one bf16 4096^3 GEMM, each from a cold
Triton cache. The config list comes from `tunelab plan --jobs
experiments/bench-gemm.yaml`, so triton.autotune gets exactly the points
tunelab runs. For each contender the script records wall time, mean GPU
utilisation, the winning config and its time; then it re-times every winner
in one process with one timer (so "gap to grid winner" compares like with
like) and measures the host cost of one launch through Triton's JIT dispatch,
through the compiled kernel's launcher and through torch.matmul.

Contenders: `autotune` (triton.autotune), `grid` and `halving` (`tunelab run`
with that search strategy; the Python worker launches and times each
kernel), `native-grid` and `native-halving` (the same runs with
`--set methods.triton.launch=native`: the Python compile pool compiles as
before, tunelab's native worker (Rust, cudarc) launches and times the cubins,
docs/native-backend.md; the manifest file is not changed or copied), and
`native-inputs-grid` / `native-inputs-halving` (also `--set inputs=native`:
the native worker builds the inputs and the reference itself, so the lane's
Python worker never imports torch; docs/native-backend.md, "Inputs built
natively"), and `native-inputs-raced-grid` (also `--set protocol.race=0.05`:
racing, docs/manifest.md's protocol table).

What the native contenders need at run time, all of it found by tunelab
itself (nothing to pass, no build feature: the default `cargo build
--release` / `just gpu-bin` binary has the CUDA native worker):
- the native worker is the tunelab binary itself (`tunelab native-worker`);
  `TUNELAB_NATIVE_WORKER` overrides it (for the Python package's entry point);
- NVRTC, to compile tunelab's helper kernels (spin, L2 flush): `TUNELAB_NVRTC`,
  else the pip wheel in the workers' Python (torch installs it:
  site-packages/nvidia/cu13/lib/libnvrtc.so.13), else the CUDA toolkit;
- libcuda from the driver, and the GPU that the lane's Python worker uses.
Where it cannot start, tunelab quietly launches the Triton method from Python
instead: the script therefore checks in each native run's trace that the
native worker checked every job, and fails that contender otherwise.

    TUNELAB_PYTHON=/path/to/python /path/to/python bench/tuning_speed.py [--tunelab PATH] [--contenders LIST]
    python3 bench/tuning_speed.py --dry-run     # no GPU needed: checks and prints the plan

Writes results/bench/<device>/tuning_speed.md and tuning_speed.json and prints
the markdown. Exit codes: 0 done, 1 a contender failed (what finished is still
written), 2 bad input or no GPU.

The parent process never imports torch or Triton: every GPU step runs in a
child process (this file with --child) with its own fresh TRITON_CACHE_DIR, set
before Triton is imported, so no contender inherits another's compiled kernels.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trace_breakdown  # noqa: E402  (bench/, next to this file)

# The script's other parts, split off along its seams: the contenders and
# goals, what runs on the GPU (the --child steps), the report. GOALS and
# goal_status are imported for the tests, which load this file alone.
from tuning_speed_contenders import (
    CONFIG_KEYS,
    CONTENDERS,
    GOALS,  # noqa: F401
    MANIFEST,
    NATIVE_INPUTS_OVERRIDE,  # noqa: F401
    NATIVE_OVERRIDE,
    RACE_OVERRIDE,
    REPO,
    BenchError,
    config_key,
    config_label,
    has_native_inputs,
    is_native,
    is_raced,
    strategy_of,
)
from tuning_speed_gpu import Nvml, UtilSampler, child_main, nvidia_smi_query
from tuning_speed_report import assemble, goal_status, render_markdown  # noqa: F401

# tunelab's helper kernels, which a native lane compiles with NVRTC before its first launch.
HELPERS_SOURCE = REPO / "src" / "native" / "helpers.cu"
EXPECTED_CONFIGS = 48
HOPPER_SMEM_BYTES = 227 * 1024  # the per-block opt-in maximum on H100/H200

# A step that runs longer than this has hung (the whole benchmark takes a few minutes).
STEP_TIMEOUT_S = 900


# ---------------------------------------------------------------------------
# Command line, the tunelab binary, the config space (no GPU needed)
# ---------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tunelab", type=Path, help="tunelab binary (default: .bin/tunelab, else target/release/tunelab)")
    p.add_argument(
        "--contenders", default=",".join(CONTENDERS), help=f"comma-separated subset of {','.join(CONTENDERS)}"
    )
    p.add_argument("--out-dir", type=Path, default=REPO / "results" / "bench", help="outputs go to OUT_DIR/<device>/")
    p.add_argument("--keep-work", action="store_true", help="keep the temporary caches and tunelab results")
    p.add_argument("--dry-run", action="store_true", help="check arguments, binary and space; print the plan; no GPU")
    # Internal: run one GPU step in a fresh process (see run_child).
    p.add_argument("--child", choices=("env", "autotune", "verify"), help=argparse.SUPPRESS)
    p.add_argument("--child-spec", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CONTENDERS]
    if unknown or not chosen:
        p.error(f"--contenders: unknown {unknown}; choose from {', '.join(CONTENDERS)}")
    args.contenders = [c for c in CONTENDERS if c in chosen]  # fixed order: autotune first
    return args


def find_tunelab(explicit):
    """The binary to run: --tunelab, else the prebuilt .bin/tunelab, else the cargo build."""
    candidates = [explicit] if explicit else [REPO / ".bin" / "tunelab", REPO / "target" / "release" / "tunelab"]
    for path in candidates:
        path = Path(path)
        if not path.is_absolute():
            path = Path.cwd() / path
        if path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise BenchError(
        f"no tunelab binary (tried {tried}); build it with `cargo build --release` or pass --tunelab PATH", 2
    )


def worker_python():
    """The Python that runs tunelab's workers; the autotune child uses the same one, for the same torch and Triton."""
    return os.environ.get("TUNELAB_PYTHON") or sys.executable


def plan_jobs(tunelab, overrides=(), device=None):
    cmd = [str(tunelab), "plan", str(MANIFEST), "--jobs"]
    if device:
        cmd += ["--device", device]
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"`{shlex.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr.strip()}", 2)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def plan_configs(tunelab, native=False, device=None):
    """The shape and the configs tunelab will run, from `tunelab plan --jobs`.

    Taking the list from tunelab itself (rather than re-reading the YAML) is
    what makes triton.autotune search exactly the same points. With `native`,
    the manifest with the native override must plan the very same jobs (the
    override is accepted, and changes how they are launched, not which).
    `device`: a device profile to plan for (a dry run on a machine without a
    GPU, where `tunelab plan` would show the interpreter's plan); None plans
    for the GPU found.
    """
    jobs = plan_jobs(tunelab, device=device)
    if native:
        native_jobs = plan_jobs(tunelab, [NATIVE_OVERRIDE], device=device)
        if [(j["shape"], j["config"]) for j in native_jobs] != [(j["shape"], j["config"]) for j in jobs]:
            raise BenchError(f"`--set {NATIVE_OVERRIDE}` plans other jobs than {MANIFEST.name}", 2)
    shapes = {json.dumps(j["shape"], sort_keys=True) for j in jobs}
    if len(shapes) != 1:
        raise BenchError(f"{MANIFEST.name} must have exactly one shape, has {len(shapes)}", 2)
    configs = [{k: int(j["config"][k]) for k in CONFIG_KEYS} for j in jobs]
    check_space(configs)
    return jobs[0]["shape"], configs


def smem_bytes(config):
    """Shared memory for the bf16 A and B tiles of every pipeline stage."""
    return (config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"]) * config["BLOCK_SIZE_K"] * 2 * config["num_stages"]


def check_space(configs):
    if len(configs) != EXPECTED_CONFIGS:
        raise BenchError(f"{MANIFEST.name} plans {len(configs)} configs, expected {EXPECTED_CONFIGS}", 2)
    if len({config_key(c) for c in configs}) != len(configs):
        raise BenchError(f"{MANIFEST.name} plans duplicate configs", 2)
    too_big = [config_label(c) for c in configs if smem_bytes(c) > HOPPER_SMEM_BYTES]
    if too_big:
        raise BenchError(f"configs over Hopper's {HOPPER_SMEM_BYTES} B of shared memory: {too_big}", 2)


# ---------------------------------------------------------------------------
# Parent: running the contenders
# ---------------------------------------------------------------------------


def child_env_vars(cache_dir):
    """Environment for every GPU process: a fresh Triton cache, tunelab's package, one GPU.

    The benchmark is about one GPU. tunelab runs one lane per visible GPU and
    points each lane at CUDA_VISIBLE_DEVICES=<index among the visible ones>, so
    only GPU 0 is a choice that means the same GPU to every process; PCI bus
    order makes CUDA's index 0 NVML's too.
    """
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "python"), env.get("PYTHONPATH")) if p)
    env["CUDA_VISIBLE_DEVICES"] = "0"
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def run_child(kind, spec, work):
    """Run this file with --child KIND in a fresh process and cache; return what it wrote, and its wall time."""
    cache = Path(tempfile.mkdtemp(prefix=f"triton-cache-{kind}-", dir=work))
    spec_path, out_path = work / f"{kind}.spec.json", work / f"{kind}.out.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [
        worker_python(),
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "--child-spec",
        str(spec_path),
        "--child-out",
        str(out_path),
    ]
    start = time.perf_counter()
    try:
        # The child's stdout goes to our stderr: our stdout carries only the final markdown.
        proc = subprocess.run(cmd, cwd=REPO, env=child_env_vars(cache), stdout=sys.stderr, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BenchError(f"the {kind} step ran past {STEP_TIMEOUT_S} s and was stopped") from None
    wall_s = time.perf_counter() - start
    if kind == "env" and proc.returncode != 0:
        # Without a GPU (2), or without torch/Triton in this Python: nothing can run.
        what = "no usable CUDA GPU" if proc.returncode == 2 else f"{worker_python()} cannot run torch and Triton"
        raise BenchError(f"{what} (see the message above); nothing was run", 2)
    if proc.returncode != 0 or not out_path.exists():
        raise BenchError(f"the {kind} step failed (exit {proc.returncode}); its output is above")
    result = json.loads(out_path.read_text())
    result["process_s"] = wall_s
    return result


def tunelab_command(tunelab, name, results_dir):
    """`tunelab run` for contender `name`: grid, halving or one of NATIVE_CONTENDERS."""
    cmd = [
        str(tunelab),
        "run",
        str(MANIFEST.relative_to(REPO)),
        "--results-dir",
        str(results_dir),
        "--quiet",
        "--python",
        worker_python(),
        "--trace",
        str(results_dir / "trace.json"),
    ]
    strategy = strategy_of(name)
    if strategy != "grid":
        cmd += ["--set", f"search.strategy={strategy}"]
    if is_native(name):
        cmd += ["--set", NATIVE_OVERRIDE]
    if has_native_inputs(name):
        cmd += ["--set", NATIVE_INPUTS_OVERRIDE]
    if is_raced(name):
        cmd += ["--set", RACE_OVERRIDE]
    return cmd


def run_tunelab(tunelab, name, work, gpu):
    """`tunelab run` in a fresh results directory (so a fresh Triton cache under its .cache); wall time around it."""
    results_dir = work / f"tunelab-{name}"
    cmd = tunelab_command(tunelab, name, results_dir)
    print(f"tuning_speed: {name}: {shlex.join(cmd)}", file=sys.stderr)
    env = child_env_vars(Path(tempfile.mkdtemp(prefix=f"triton-cache-{name}-", dir=work)))
    with UtilSampler(gpu) as util:
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BenchError(f"tunelab {name} ran past {STEP_TIMEOUT_S} s and was stopped") from None
        wall_s = time.perf_counter() - start
    log = (proc.stdout + proc.stderr).strip()
    # 3: the run finished but some configs failed; they are in the journal and counted below.
    if proc.returncode not in (0, 3):
        raise BenchError(
            f"tunelab {name} failed (exit {proc.returncode}; worker logs in {results_dir}, "
            f"kept with --keep-work):\n{log[-3000:]}"
        )
    journal = find_journal(results_dir)
    summary = summarize_journal(journal)
    trace_path = results_dir / "trace.json"
    if trace_path.exists():
        summary.update(overhead_from_trace(trace_breakdown.breakdown(trace_path)))
        summary["trace"] = str(trace_path)
    if is_native(name):
        check_native_ran(name, summary.get("breakdown"), log, results_dir)
    summary.update(
        {
            "command": shlex.join(cmd),
            "exit_code": proc.returncode,
            "wall_s": wall_s,
            "util": util.result(),
            "timed_kernel_fraction": summary["gpu_ms_jobs"] / 1e3 / wall_s,
            "timed_kernel_fraction_with_finals": (summary["gpu_ms_jobs"] + summary["gpu_ms_finals"]) / 1e3 / wall_s,
            "tunelab_log_tail": log.splitlines()[-3:],
            "journal": str(journal),
        }
    )
    return summary


def overhead_from_trace(b):
    """The trace's breakdown, and runner overhead per job: bench/trace_breakdown.py's plus the journal append.

    trace_breakdown counts, per job of the lane: lane time inside groups that is
    in no worker call (Python's or the native worker's), no wait for a compile and
    no native worker start-up; plus round trip minus worker time of every call but
    hello and shutdown, on both workers (for a check sent ahead, the native
    worker's own wait before it, as the request was queued in its pipe):
    `lane_overhead_ms_per_job`, what the native goal counts. The journal's
    append (fsync) runs on the writer thread, off the lane's path;
    `overhead_ms_per_job` adds its mean (the goal "under 1 ms" counts it), and
    `overhead_parts_ms` names each part. `gpu_waited_ms_per_job`: the time the
    worker that times sat idle while a compiled job was ready for it (traces
    from runners since 2026-11-24), what the GPU waited for the runner: a
    different measure from the lane's (it counts the worker's own waits for a
    core, and leaves out lane work done while the worker was busy).
    """
    lane_ms = trace_breakdown.overhead_per_job_ms(b)
    out = {
        "breakdown": b,
        "breakdown_text": trace_breakdown.render(b),
        # On the lane's path: between calls + protocol (trace_breakdown's figure).
        "lane_overhead_ms_per_job": lane_ms,
        # What the GPU waited for the runner (None for older traces).
        "gpu_waited_ms_per_job": trace_breakdown.gpu_waited_ms_per_job(b),
        # With the journal append: what the goal "under 1 ms" counts.
        "overhead_ms_per_job": lane_ms,
        "overhead_parts_ms": None,
    }
    lane = next(iter(b["lanes"].values()), None)
    if out["overhead_ms_per_job"] is not None:
        journal_ms = b["journal"]["ms_mean"] if b["journal"] else 0.0
        out["overhead_ms_per_job"] += journal_ms
        nat = lane.get("native") or {}
        python_ms = (lane.get("python_protocol_us_per_call") or 0.0) * (lane.get("python_calls_per_job") or 0.0) / 1e3
        native_ms = (nat.get("protocol_us_per_call") or 0.0) * (nat.get("calls_per_job") or 0.0) / 1e3
        out["overhead_parts_ms"] = {
            "between_calls": lane["runner_ms_per_job"],
            "protocol_python": python_ms,
            "protocol_native": native_ms,
            "journal": journal_ms,
        }
    return out


def check_native_ran(name, breakdown, log, results_dir):
    """A native contender must have had every job checked (so launched and timed) by the native worker.

    tunelab launches a `launch: native` Triton method from Python when native
    launches cannot run (no NVRTC, a native worker that does not start); that
    run would be timed as a Python one, so it is an error here.
    """
    if breakdown is None:
        raise BenchError(f"tunelab {name}: no trace, so no way to tell that its launches were native")
    lane = next(iter(breakdown["lanes"].values()), None)
    native = (lane or {}).get("native")
    done = native["jobs"] if native else 0
    total = lane["jobs"] if lane else 0
    if not total or done != total:
        warnings = [line for line in log.splitlines() if "warning" in line.lower()]
        logs = sorted(results_dir.glob("*/*/logs/native*.log"))
        tail = logs[0].read_text(errors="replace").strip().splitlines()[-5:] if logs else []
        raise BenchError(
            f"tunelab {name}: the native worker checked {done} of {total} jobs, so the others were "
            f"launched by Python (no NVRTC: set TUNELAB_NVRTC; or a native worker that did not start)"
            + (f"; tunelab said: {' | '.join(warnings)}" if warnings else "")
            + (f"; {logs[0].name} ends: {' | '.join(tail)}" if tail else "; no native worker log")
        )


def nvrtc_check(tunelab, arch):
    """Compile tunelab's helper kernels (spin, L2 flush) with NVRTC, as a native lane's first job does.

    `tunelab native-compile` finds NVRTC the way a run does (TUNELAB_NVRTC, the
    workers' Python's wheels, the toolkit). Without it the native contenders
    would be launched by Python; returns the compiler tunelab found.
    """
    out = Path(tempfile.mkdtemp(prefix="tunelab-nvrtc-"))
    cmd = [
        str(tunelab),
        "native-compile",
        str(HELPERS_SOURCE),
        "--kernel",
        "tunelab_spin",
        "--out",
        str(out),
        "--arch",
        arch,
        "--python",
        worker_python(),
    ]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise BenchError(f"`{shlex.join(cmd)}` ran past 120 s", 2) from None
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        raise BenchError(
            f"the native contenders cannot launch natively: `{shlex.join(cmd)}` failed "
            f"({proc.returncode}): {proc.stderr.strip()[-1500:]}\n  = help: point TUNELAB_NVRTC at "
            "libnvrtc.so, or install the NVRTC wheel into the workers' Python",
            2,
        )
    try:
        return json.loads(proc.stdout)["compiler"]
    except (ValueError, KeyError):
        return proc.stdout.strip()


def find_journal(results_dir):
    """results/<experiment>/<device>/journal.jsonl: the device directory is tunelab's naming, so search for it."""
    found = sorted(results_dir.glob("*/*/journal.jsonl"))
    if len(found) != 1:
        raise BenchError(f"expected one journal under {results_dir}, found {[str(f) for f in found]}")
    return found[0]


def summarize_journal(path):
    """Winner, status counts and timed GPU time from a tunelab journal.

    A job's time is its finalist re-timing (the "final" record) when it has one,
    else its own median: finalists are re-timed interleaved, which is what
    tunelab itself ranks by. Only status "ok" Triton jobs can win.
    """
    jobs, finals, job_lines = {}, {}, []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("type") == "job":
            jobs[rec["job_id"]] = rec  # a later record of a job replaces an earlier one
            job_lines.append(rec)
        elif rec.get("type") == "final":
            finals[rec["job_id"]] = rec

    def time_us(job):
        final = finals.get(job["job_id"])
        return (final or job)["stats"]["median_us"]

    # Only the Triton method's jobs compete (bench-gemm has no other; a torch job has no tile config).
    ok = [j for j in jobs.values() if j["status"] == "ok" and j.get("stats") and j.get("kind") == "triton"]
    if not ok:
        raise BenchError(f"no job finished ok in {path}")
    winner = min(ok, key=time_us)
    counts = {}
    for job in jobs.values():
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    return {
        "winner": {k: int(winner["config"][k]) for k in CONFIG_KEYS},
        "winner_us": time_us(winner),
        "winner_from_final": winner["job_id"] in finals,
        "counts": counts,
        "failures": sorted(
            {(j.get("failure") or {}).get("class", "?") for j in jobs.values() if j["status"] == "failed"}
        ),
        # Every job line is sampling time spent; pruned jobs keep their screening samples.
        "gpu_ms_jobs": sum(j["stats"]["gpu_ms"] for j in job_lines if j.get("stats")),
        "gpu_ms_finals": sum(f["stats"]["gpu_ms"] for f in finals.values()),
    }


# ---------------------------------------------------------------------------
# Parent: putting the facts together
# ---------------------------------------------------------------------------


def device_dir(gpu_name):
    """Directory name for the GPU: its name with '_' for spaces; every H200 variant is NVIDIA_H200."""
    if "H200" in gpu_name:
        return "NVIDIA_H200"
    return gpu_name.strip().replace(" ", "_")


def driver_version(gpu):
    try:
        return Nvml(gpu).driver_version()
    except (OSError, AttributeError):
        pass
    try:
        return nvidia_smi_query(gpu, "driver_version")
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def print_plan(args, tunelab, shape, configs):
    out = [
        "tuning_speed dry run: nothing will run on a GPU",
        f"  tunelab:   {tunelab} ({tunelab_version(tunelab)})",
        f"  python:    {worker_python()} (workers and GPU children)",
        f"  problem:   {shape}, {len(configs)} configs from `tunelab plan --jobs {MANIFEST.relative_to(REPO)}`, "
        f"max smem {max(smem_bytes(c) for c in configs)} B <= {HOPPER_SMEM_BYTES} B",
        "  contenders (in this order, each with a fresh TRITON_CACHE_DIR, CUDA_VISIBLE_DEVICES=0):",
    ]
    for name in args.contenders:
        if name == "autotune":
            out.append(
                "    autotune: triton.autotune(configs=<48>, key=['M','N','K'])(tunelab matmul_kernel), "
                "first call timed, winner timed with do_bench"
            )
        else:
            out.append(f"    {name}: {shlex.join(tunelab_command(tunelab, name, Path('<tmp>') / f'tunelab-{name}'))}")
    if any(is_native(n) for n in args.contenders):
        worker = os.environ.get("TUNELAB_NATIVE_WORKER") or tunelab
        out.append(
            f"    native-*: `--set {NATIVE_OVERRIDE}` accepted, same {len(configs)} jobs planned; "
            f"native worker: {worker} native-worker; NVRTC (helper kernels "
            f"compiled for sm_90 here): {args.nvrtc}; each run's trace must show every job checked by "
            "the native worker"
        )
    out.append(
        "    verify: re-time the winners in one process; host µs per launch: JIT, compiled launcher, torch.matmul"
    )
    out.append(f"  outputs:   {args.out_dir}/<device>/tuning_speed.md, tuning_speed.json")
    out.append(f"  triton.Config list: {triton_config_summary(configs)}")
    out.append("  configs:")
    out.extend(f"    {i:2d} {config_label(c)}  smem {smem_bytes(c)} B" for i, c in enumerate(configs))
    print("\n".join(out))


def triton_config_summary(configs):
    """Build the triton.Config list the autotune child will build, when Triton is importable here (no GPU needed)."""
    try:
        sys.path.insert(0, str(REPO / "python"))
        import triton
        from tunelab.kernels import matmul
    except Exception as e:  # torch or triton missing here is fine for a dry run
        return f"not built (Triton not importable here: {type(e).__name__}: {e})"
    built = []
    for cfg in configs:
        constexprs, options = matmul.split_config(cfg)
        built.append(triton.Config(constexprs, num_warps=options["num_warps"], num_stages=options["num_stages"]))
    distinct = len({str(c) for c in built})
    return f"{len(built)} triton.Config objects ({distinct} distinct), Triton {triton.__version__}; first: {built[0]}"


def tunelab_version(tunelab):
    try:
        return subprocess.run([str(tunelab), "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def run_benchmark(args, tunelab, shape, configs):
    errors, results, verify = [], {}, None
    commands = {"self": self_command(), "contenders": {}}
    work = Path(tempfile.mkdtemp(prefix="tunelab-bench-"))
    try:
        env = run_child("env", {}, work)
        gpu = env.get("uuid") or "0"
        env.update(
            {
                "driver": driver_version(gpu),
                "cpus": os.cpu_count(),
                "tunelab": str(tunelab),
                "tunelab_version": tunelab_version(tunelab),
                "worker_python": worker_python(),
            }
        )
        print(f"tuning_speed: {env['gpu']}, torch {env['torch']}, Triton {env['triton']}", file=sys.stderr)
        env["idle_util_before"] = idle_utilization(gpu)
        native_blocked = None
        if any(is_native(n) for n in args.contenders):
            try:
                env["nvrtc"] = nvrtc_check(tunelab, "sm_" + env["capability"].replace(".", ""))
            except BenchError as e:
                native_blocked = str(e)
        for name in args.contenders:
            try:
                if is_native(name) and native_blocked:
                    raise BenchError(f"not run: {native_blocked}")
                if name == "autotune":
                    print("tuning_speed: autotune: triton.autotune over the same configs (cold cache)", file=sys.stderr)
                    commands["contenders"][name] = "triton.autotune in `--child autotune` (this script)"
                    results[name] = run_child("autotune", {"shape": shape, "configs": configs, "gpu": gpu}, work)
                else:
                    results[name] = run_tunelab(tunelab, name, work, gpu)
                    commands["contenders"][name] = results[name]["command"]
                    keep_journal(results[name], args.out_dir / device_dir(env["gpu"]), name)
            except BenchError as e:
                errors.append(f"{name}: {e}")
                print(f"tuning_speed: {name} failed: {e}", file=sys.stderr)
        if results:
            verify = run_verify(results, shape, work, errors)
    finally:
        if args.keep_work:
            print(f"tuning_speed: work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    facts = assemble(shape, configs, env, results, verify, commands, errors)
    write_outputs(args.out_dir / device_dir(env["gpu"]), facts)
    return 1 if errors else 0


def idle_utilization(gpu, seconds=2.0):
    """GPU utilisation with nothing of ours running; well above 0 means another job shares the GPU."""
    with UtilSampler(gpu) as util:
        time.sleep(seconds)
    idle = util.result()["mean"]
    if idle is not None and idle > 0.05:
        print(
            f"tuning_speed: warning: the GPU is {idle:.0%} busy before the benchmark starts; "
            "another process is using it and the figures will be off",
            file=sys.stderr,
        )
    return idle


def run_verify(results, shape, work, errors):
    """Re-time the distinct winners together and measure launch cost with the grid's winner (else any)."""
    winners = []
    for r in results.values():
        if r["winner"] not in winners:
            winners.append(r["winner"])
    launch_config = results.get("grid", next(iter(results.values())))["winner"]
    print(f"tuning_speed: verify: re-timing {len(winners)} winner(s), launch cost", file=sys.stderr)
    try:
        return run_child("verify", {"shape": shape, "winners": winners, "launch_config": launch_config}, work)
    except BenchError as e:
        errors.append(f"verify: {e}")
        return None


def keep_journal(result, out_dir, name):
    """A copy of each tunelab journal (and its trace) next to the results, so every number can be traced."""
    dest = out_dir / "journals"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result["journal"], dest / f"{name}.journal.jsonl")
    if result.get("trace"):
        shutil.copyfile(result["trace"], dest / f"{name}.trace.json")


def self_command():
    prefix = f"TUNELAB_PYTHON={shlex.quote(os.environ['TUNELAB_PYTHON'])} " if os.environ.get("TUNELAB_PYTHON") else ""
    return prefix + shlex.join([sys.executable, *sys.argv])


def write_outputs(out_dir, facts):
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(facts)
    (out_dir / "tuning_speed.md").write_text(markdown)
    (out_dir / "tuning_speed.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(markdown)
    print(f"tuning_speed: wrote {out_dir / 'tuning_speed.md'} and tuning_speed.json", file=sys.stderr)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child_main(args)
    try:
        tunelab = find_tunelab(args.tunelab)
        native = any(is_native(n) for n in args.contenders)
        # A dry run plans for a Hopper GPU wherever it runs (the benchmark's
        # space is sized for one; see HOPPER_SMEM_BYTES).
        shape, configs = plan_configs(tunelab, native=native, device="h100" if args.dry_run else None)
        if args.dry_run:
            args.nvrtc = None
            if native:
                try:
                    args.nvrtc = nvrtc_check(tunelab, "sm_90")
                except BenchError as e:  # this machine may not be the GPU host: say so, plan anyway
                    args.nvrtc = f"NOT FOUND here, the native contenders would not run: {e}"
            print_plan(args, tunelab, shape, configs)
            return 0
        return run_benchmark(args, tunelab, shape, configs)
    except BenchError as e:
        print(f"tuning_speed: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
