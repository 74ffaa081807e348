"""bench/tuning_speed.py's report: every fact of a run put together
(`assemble`: the JSON file), the goals judged (`goal_status`), and the
markdown rendered from the facts (`render_markdown`, with the trace's
breakdown and the launch cost).

Moved out of tuning_speed.py, which still exports these names.
"""

import datetime

from tuning_speed_contenders import (
    GOALS,
    LABELS,
    MANIFEST,
    NATIVE_CONTENDERS,
    NATIVE_INPUTS_OVERRIDE,
    NATIVE_OVERRIDE,
    RACE_OVERRIDE,
    REPO,
    config_key,
    config_label,
    has_native_inputs,
    is_native,
    is_raced,
)


def tflops(shape, us):
    return 2.0 * shape["M"] * shape["N"] * shape["K"] / (us * 1e-6) / 1e12


def assemble(shape, configs, env, results, verify, commands, errors):
    """One dict with every fact; the JSON file is this, the markdown is rendered from it."""
    rows = {}
    reference = grid_reference(results)
    grid_key = config_key(results[reference]["winner"]) if reference else None
    retimed = {config_key(r["config"]): r["us"] for r in (verify or {}).get("retimed", [])}
    autotune_wall = results.get("autotune", {}).get("wall_s")
    autotune_process = results.get("autotune", {}).get("process_s")
    for name, r in results.items():
        key = config_key(r["winner"])
        row = {
            "wall_s": r["wall_s"],
            "speedup_vs_autotune": autotune_wall / r["wall_s"] if autotune_wall else None,
            # Against autotune's whole child process (interpreter, imports, inputs, tuning call, output
            # check, one do_bench of the winner); not given for autotune itself.
            "speedup_vs_autotune_process": (
                autotune_process / r["wall_s"] if autotune_process and name != "autotune" else None
            ),
            "native": is_native(name),
            # tunelab's wall after its lane worker answered hello: what autotune's figure measures
            # too (autotune's clock starts in a process that has imported torch already).
            "after_startup_s": after_startup(r),
            "gpu_util": r["util"]["mean"],
            "winner": r["winner"],
            "winner_label": config_label(r["winner"]),
            "winner_us": r["winner_us"],
            "winner_tflops": tflops(shape, r["winner_us"]),
            "winner_retimed_us": retimed.get(key),
            "same_winner_as_grid": key == grid_key if grid_key else None,
            # Same config: 0 by definition, not re-timing noise. Else both re-timed with one timer in one process.
            "gap_to_grid_pct": gap_pct(key, grid_key, retimed),
        }
        row["speedup_after_startup"] = (
            autotune_wall / row["after_startup_s"] if autotune_wall and row["after_startup_s"] else None
        )
        if name == "autotune":
            row.update(
                {
                    "configs_ok": r["configs_timed"],
                    "configs_pruned": 0,
                    "configs_failed": r["configs_failed"],
                    "process_s": r["process_s"],
                    "bench_time_s": r["bench_time_s"],
                    "check": r["check"],
                    "winner_us_autotuner": r["winner_us_autotuner"],
                }
            )
        else:
            row.update(
                {
                    "configs_ok": r["counts"].get("ok", 0),
                    "configs_pruned": r["counts"].get("pruned", 0),
                    "configs_failed": r["counts"].get("failed", 0),
                    "failures": r["failures"],
                    "timed_kernel_fraction": r["timed_kernel_fraction"],
                    "timed_kernel_fraction_with_finals": r["timed_kernel_fraction_with_finals"],
                    "winner_from_final": r["winner_from_final"],
                    "exit_code": r["exit_code"],
                    "tunelab_log_tail": r["tunelab_log_tail"],
                    "overhead_ms_per_job": r.get("overhead_ms_per_job"),
                    "lane_overhead_ms_per_job": r.get("lane_overhead_ms_per_job"),
                    "gpu_waited_ms_per_job": r.get("gpu_waited_ms_per_job"),
                    "overhead_parts_ms": r.get("overhead_parts_ms"),
                    "breakdown": r.get("breakdown"),
                    "breakdown_text": r.get("breakdown_text"),
                }
            )
        row["util_samples"], row["util_source"] = r["util"]["samples"], r["util"]["source"]
        rows[name] = row
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": commands["self"],
        "contender_commands": commands["contenders"],
        "environment": env,
        "problem": {**shape, "configs": len(configs), "manifest": str(MANIFEST.relative_to(REPO))},
        "native_override": NATIVE_OVERRIDE,
        "grid_reference": reference,
        "contenders": rows,
        "launch_cost": (verify or {}).get("launch_cost"),
        "goals": goal_status(rows),
        "errors": errors,
    }


def grid_reference(rows):
    """The exhaustive run the gaps are taken against: grid, else native-grid (same space, same search)."""
    return next((n for n in ("grid", "native-grid") if n in rows), None)


def after_startup(result):
    """Wall time from the lane worker's first answer to the end of the run (from the trace)."""
    if "wall_s" in result and "breakdown" not in result:
        return result["wall_s"]  # autotune: its clock already starts after the imports
    lane = next(iter((result["breakdown"] or {}).get("lanes", {}).values()), None)
    if not lane or lane["ready_s"] is None:
        return None
    return result["wall_s"] - lane["ready_s"]


def gap_pct(key, grid_key, retimed):
    if grid_key is None:
        return None
    if key == grid_key:
        return 0.0
    if key in retimed and grid_key in retimed:
        return (retimed[key] / retimed[grid_key] - 1.0) * 100.0
    return None


def winner_gap_pct(row, other):
    """row's winner re-timed against other's, in %: 0 when it is the same config, None when not re-timed."""
    if config_key(row["winner"]) == config_key(other["winner"]):
        return 0.0
    a, b = row.get("winner_retimed_us"), other.get("winner_retimed_us")
    return (a / b - 1.0) * 100.0 if a and b else None


def autotune_winner_verdict(auto, row):
    """Whether autotune's winner is row's, or no more than 1 % faster than it (re-timed), and the words for it.

    gap: autotune's winner re-timed against row's. Positive means tunelab found the
    faster config; only autotune winning by more than 1 % counts against tunelab.
    """
    gap = winner_gap_pct(auto, row)
    same = config_key(auto["winner"]) == config_key(row["winner"])
    good = same or (gap is not None and gap >= -1.0)
    text = "is the same config" if same else f"differs and is {fmt(gap, '{:+.2f} %')} vs tunelab's (re-timed)"
    return good, text


def goal_status(rows):
    """Each goal with the measured value and whether it was met (stated, never asserted)."""
    grid, auto = rows.get("grid"), rows.get("autotune")
    reference = grid_reference(rows)
    out = []
    if grid and auto:
        good_winner, winner_text = autotune_winner_verdict(auto, grid)
        met = grid["speedup_vs_autotune"] >= 8 and good_winner
        out.append(
            {
                "goal": GOALS[0] + " (whole tunelab process)",
                "met": met,
                "measured": f"{grid['speedup_vs_autotune']:.1f}x; autotune's winner {winner_text}",
            }
        )
        if grid.get("speedup_after_startup"):
            out.append(
                {
                    "goal": GOALS[0] + " (after worker start-up, as autotune's figure is)",
                    "met": grid["speedup_after_startup"] >= 8 and good_winner,
                    "measured": f"{grid['speedup_after_startup']:.1f}x ({grid['after_startup_s']:.1f} s)",
                }
            )
    for name in NATIVE_CONTENDERS:
        native = rows.get(name)
        if not (native and auto):
            continue
        good_winner, winner_text = autotune_winner_verdict(auto, native)
        against = [("speedup_vs_autotune", f"against autotune's tuning call, {auto['wall_s']:.1f} s")]
        if native.get("speedup_vs_autotune_process"):
            against.append(
                ("speedup_vs_autotune_process", f"against autotune's whole process, {auto['process_s']:.1f} s")
            )
        for key, label in against:
            out.append(
                {
                    "goal": f"{GOALS[4]} ({name}, {native['wall_s']:.1f} s; {label})",
                    "met": native[key] >= 8 and good_winner,
                    "measured": f"{native[key]:.1f}x; autotune's winner {winner_text}",
                }
            )
    for name in ("grid", "halving") + NATIVE_CONTENDERS:
        if rows.get(name) and rows[name]["gpu_util"] is not None:
            out.append(
                {
                    "goal": f"{GOALS[1]} ({name})",
                    "met": rows[name]["gpu_util"] >= 0.8,
                    "measured": f"{rows[name]['gpu_util'] * 100:.0f} % NVML utilisation",
                }
            )
    for name in ("halving", "native-halving", "native-inputs-halving"):
        if reference and rows.get(name):
            gap = rows[name]["gap_to_grid_pct"]
            label = GOALS[2] if name == "halving" and reference == "grid" else f"{GOALS[2]} ({name} vs {reference})"
            out.append({"goal": label, "met": gap is not None and gap <= 2.0, "measured": fmt(gap, "{:+.2f} %")})
    for name in ("grid", "halving"):
        overhead = (rows.get(name) or {}).get("overhead_ms_per_job")
        if overhead is not None:
            out.append(
                {"goal": f"{GOALS[3]} ({name})", "met": overhead < 1.0, "measured": f"{overhead:.3f} ms per job"}
            )
    for name in NATIVE_CONTENDERS:
        # What the GPU waited for the runner: the native worker idle while a compiled job was ready for
        # it (trace_breakdown's `gpu_waited_ms_per_job`). The lane's side, between calls + protocol of
        # both workers' calls, is shown beside it (another measure, not a bound); for traces from older
        # runners, whose workers did not say when they read each request, it is the figure counted,
        # and the goal says so.
        # The journal append runs on the writer thread; it is shown, not counted.
        row = rows.get(name) or {}
        lane = row.get("lane_overhead_ms_per_job")
        waited = row.get("gpu_waited_ms_per_job")
        parts = overhead_parts_text(row.get("overhead_parts_ms"))
        if waited is not None:
            out.append(
                {
                    "goal": f"{GOALS[5]} ({name}; what the GPU waited for the runner: the native worker "
                    f"idle while a compiled job was ready for it)",
                    "met": waited <= 0.2,
                    "measured": f"{waited:.3f} ms per job; the lane's side, another measure: {lane:.3f} ({parts})",
                }
            )
        elif lane is not None:
            out.append(
                {
                    "goal": f"{GOALS[5]} ({name}; between calls + protocol, the lane's side: the trace does "
                    f"not say when the workers began each request)",
                    "met": lane <= 0.2,
                    "measured": f"{lane:.3f} ms per job ({parts})",
                }
            )
    return out


def overhead_parts_text(parts):
    if not parts:
        return "parts not known"
    return (
        f"between calls {parts['between_calls']:.3f} + protocol of the Python worker's calls "
        f"{parts['protocol_python']:.3f} + of the native worker's {parts['protocol_native']:.3f}; not counted: "
        f"the journal append, {parts['journal']:.3f} on the writer thread"
    )


def fmt(value, pattern):
    return "—" if value is None else pattern.format(value)


def render_markdown(f):
    env, lines = f["environment"], []
    add = lines.append
    add(f"# Tuning speed: triton.autotune vs tunelab, {env['gpu']}")
    add("")
    p = f["problem"]
    add(
        f"Same {p['configs']}-config space (`{p['manifest']}`) for tunelab's Triton matmul, "
        f"{p['M']}x{p['N']}x{p['K']} {p['dtype']}, each contender from a cold Triton cache, one GPU."
    )
    add("")
    add(
        "| contender | wall s | speedup vs autotune | vs autotune's whole process | wall after start-up s | speedup "
        "| GPU util | winner | winner µs | TFLOP/s | gap to grid winner | winner re-timed µs | timed-kernel fraction "
        "| configs ok / pruned / failed |"
    )
    add("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, r in f["contenders"].items():
        add(
            f"| {LABELS[name]} | {r['wall_s']:.1f} | {fmt(r['speedup_vs_autotune'], '{:.1f}x')} "
            f"| {fmt(r.get('speedup_vs_autotune_process'), '{:.1f}x')} "
            f"| {fmt(r.get('after_startup_s'), '{:.1f}')} | {fmt(r.get('speedup_after_startup'), '{:.1f}x')} "
            f"| {fmt(r['gpu_util'], '{:.0%}')} | `{r['winner_label']}` | {r['winner_us']:.1f} "
            f"| {r['winner_tflops']:.1f} | {fmt(r['gap_to_grid_pct'], '{:+.2f} %')} "
            f"| {fmt(r['winner_retimed_us'], '{:.1f}')} | {fmt(r.get('timed_kernel_fraction'), '{:.0%}')} "
            f"| {fmt(r['configs_ok'], '{}')} / {r['configs_pruned']} / {r['configs_failed']} |"
        )
    add("")
    add(
        "- wall s: triton.autotune, the first (tuning) call, synchronised, in a process that had already imported "
        "torch and built the inputs"
        + (
            f" (whole process: {f['contenders']['autotune']['process_s']:.1f} s)"
            if "autotune" in f["contenders"]
            else ""
        )
        + "; tunelab, the whole `tunelab run` process: start-up, workers, compile pool, checks, timing, finalists, outputs."
    )
    add(
        "- speedup vs autotune: autotune's wall s (its tuning call) / this wall s. vs autotune's whole process: "
        "the wall time of autotune's whole child process (interpreter start, imports, inputs, the tuning call, the "
        "output check, one `do_bench` of the winner) / this wall s."
    )
    if any(r.get("native") for r in f["contenders"].values()):
        override = f.get("native_override", NATIVE_OVERRIDE)
        add(
            f"- native launches: `tunelab run` of the same manifest with `--set {override}` "
            "(an override on the command line; no derived manifest): Triton compiles in the Python compile pool as "
            "before, the runner's native worker (Rust, cudarc) loads each cubin and launches and times it; the "
            "lane's Python worker builds inputs and reference, shares them over CUDA IPC and answers `recipe`; "
            "the native worker compares each job's output with the shared reference (a `compare` call to the "
            "Python worker where the reference cannot be shared). The script checked in each such run's trace that the native worker "
            "checked every job (none fell back to Python's launch)."
        )
    if any(has_native_inputs(n) for n in f["contenders"]):
        add(
            f"- native launches and inputs: also `--set {NATIVE_INPUTS_OVERRIDE}`: the lane's Python worker imports "
            "no torch and sees no GPU (it describes the shape's data and answers `recipe` over stand-in tensors); "
            "the native worker builds the inputs with its seeded generator and the fp32 reference with its own "
            "matmul kernel (`build`), then compares each job's output with it."
        )
    if any(is_raced(n) for n in f["contenders"]):
        add(
            f"- racing: also `--set {RACE_OVERRIDE}`: a config whose median is, with 95 % confidence, more than 5 % "
            "slower than the best its run has recorded so far stops sampling at `min_samples` (flagged OUTPACED) "
            "instead of refining its figure to ±0.5 %; it keeps its median and can still be a finalist."
        )
    add(
        "- wall after start-up: tunelab's wall time from its lane worker's first answer (torch imported, CUDA "
        "up; for native inputs, no torch) to the end of the run, from the trace; the same starting point as "
        "autotune's figure. For autotune the two columns are the same figure."
    )
    add("- GPU util: mean NVML utilisation (share of time any kernel ran) sampled every ~50 ms over that wall time.")
    add(
        "- winner µs: each contender's own timer (autotune: `triton.testing.do_bench` median; tunelab: its journal, "
        "the finalist re-timing where there is one). winner re-timed µs: every winner again in one process, "
        "do_bench median of 5 interleaved rounds; the gap column uses these (0 when the config is the grid's)"
        + (f"; grid here is `{f['grid_reference']}`" if f.get("grid_reference") not in (None, "grid") else "")
        + "."
    )
    add(
        "- timed-kernel fraction: sum of the journal's job `stats.gpu_ms` / wall (finalist re-timings not included; "
        "for halving, survivors' screening samples are not in the journal either)."
    )
    add("")
    add_breakdown(add, f["contenders"])
    add_launch_cost(add, f.get("launch_cost"))
    add("## Goals (stated, not asserted)")
    add("")
    for g in f["goals"]:
        add(f"- {'met' if g['met'] else 'NOT met'}: {g['goal']}: {g['measured']}")
    if not f["goals"]:
        add("- not evaluated (contenders missing)")
    if f["errors"]:
        add("")
        add("## Errors")
        add("")
        for e in f["errors"]:
            add(f"- {e}")
    add("")
    add("## Environment")
    add("")
    add(
        f"- GPU: {env['gpu']} (sm {env['capability']}, {env['sm_count']} SMs), driver {env.get('driver') or '?'}, "
        f"CUDA {env['cuda']}"
    )
    add(f"- torch {env['torch']}, Triton {env['triton']}, Python {env['python']}; host CPUs: {env['cpus']}")
    add(f"- GPU utilisation before the runs (idle check): {fmt(env.get('idle_util_before'), '{:.0%}')}")
    add(f"- tunelab: `{env['tunelab']}` ({env['tunelab_version']})")
    if env.get("nvrtc"):
        add(f"- NVRTC (native contenders' helper kernels): {env['nvrtc']}")
    add(f"- date (UTC): {f['date_utc']}")
    add(f"- command: `{f['command']}`")
    for name, cmd in f["contender_commands"].items():
        add(f"- {name}: `{cmd}`")
    return "\n".join(lines) + "\n"


def add_breakdown(add, contenders):
    """Each tunelab run's wall time taken apart from its trace (bench/trace_breakdown.py)."""
    traced = {name: r for name, r in contenders.items() if r.get("breakdown_text")}
    if not traced:
        return
    add("## Where tunelab's wall time goes")
    add("")
    add(
        "From each run's `--trace` (kept as `journals/<contender>.trace.json`; open it in ui.perfetto.dev). "
        "Runner overhead per job: lane time inside a group that is not a worker call, plus each call's round "
        "trip minus the worker's own time, plus the journal append (fsync) on the writer thread."
    )
    if any(r.get("native") for r in traced.values()):
        add("")
        add(
            "Native launches: a job is `recipe` and `compare` on the lane's Python worker (track `lane0`), "
            "`check`, `warmup` and `sample` on the native worker (track `native0`); `share` and `import` once "
            "per shape; `describe` once per group. Runner overhead per job there: lane time inside groups in no "
            "call of either worker, no wait for a compile, and not the native worker's start-up (tunelab's "
            "helper kernels compiled with NVRTC, the process started, its GPU opened, `hello`: once per run, "
            "while the lane's Python worker starts, reported on its own line); plus round trip minus worker time of every "
            "call of both workers but `hello` and `shutdown`; divided by the lane's jobs (each counted once, by "
            "its `check`); plus the journal append's mean. What the GPU waited for the runner (traces from "
            "runners since 2026-11-24, whose workers say when they read each request): time inside groups that "
            "the native worker sat idle while a job was ready for it (compiled and not yet begun, or, once every "
            "job had begun, anything but the protocol's rests), per job; lane work while the worker was busy, or "
            "while no compiled job waited, delays nothing and is not in it."
        )
    add("")
    for name, r in traced.items():
        add(f"**{LABELS[name]}**")
        add("")
        add("```")
        add(r["breakdown_text"])
        add("```")
        add("")


def add_launch_cost(add, lc):
    add("## Host cost of one launch")
    add("")
    if not lc:
        add("Not measured.")
        add("")
        return
    add(
        f"Winning config `{config_label(lc['config'])}` at {lc['size']}^3 bf16 (a kernel shorter than its launch, "
        f"so the host is the limit), {lc['n']} launches back to back without a sync after a warm-up, median of "
        f"{lc['repeats']} repeats. Kernel µs: the launched kernel's own GPU time (do_bench median); the host "
        "figure is the host's cost only where it is the larger of the two."
    )
    add("")
    add("| launch path | host µs / launch | kernel µs |")
    add("| --- | ---: | ---: |")
    add(f"| (a) JIT dispatch `matmul_kernel[grid](...)` | {lc['jit']['host_us']:.2f} | {lc['jit']['kernel_us']:.2f} |")
    comp = lc["compiled"]
    if comp["reachable"]:
        add(
            f"| (b) compiled launcher `compiled[grid](...)` ({comp['form']}) | {comp['host_us']:.2f} "
            f"| {comp['kernel_us']:.2f} |"
        )
    else:
        add(f"| (b) compiled launcher `compiled[grid](...)` | not reachable: {comp['why']} | — |")
    add(f"| (c) `torch.matmul(a, b, out=c)` | {lc['torch']['host_us']:.2f} | {lc['torch']['kernel_us']:.2f} |")
    add("")
