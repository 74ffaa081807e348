"""bench/quant_moe.py: its statistics, sweeps, peak table and goal verdicts,
and the whole benchmark run as a CPU smoke test (--smoke: Triton's
interpreter, tiny shapes, fp16 activations)."""

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import load_bench

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "quant_moe.py"


@pytest.fixture(scope="module")
def qm():
    return load_bench("quant_moe")


def test_median_ci_uses_the_runners_order_statistics(qm):
    # n = 20: half = 1.96 sqrt(20) / 2 = 4.38; ranks floor(5.62) = 5 and ceil(14.38) = 15 (1-based).
    assert qm.median_ci([float(v) for v in range(20, 0, -1)]) == (10.5, 5.0, 15.0)
    # n = 5: ranks floor(0.31) -> 1 and ceil(4.69) = 5.
    assert qm.median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0)


def test_until_precise_stops_at_the_target_or_a_cap(qm):
    rule = qm.Rule(batch=8, min_samples=20, max_samples=64)
    steady = qm.until_precise(lambda: [10.0] * 8, rule)
    assert steady["n"] == 24 and steady["median_us"] == 10.0 and steady["flags"] == []
    # Alternating 1 and 100: the median's interval never narrows, so the sample cap ends it.
    noisy = qm.until_precise(lambda: [1.0, 100.0] * 4, rule)
    assert noisy["n"] == 64 and noisy["flags"] == ["CAP_HIT"]
    # GPU time cap: four samples of 30 ms pass 100 ms in the first batch.
    slow = qm.until_precise(lambda: [1.0, 30_000.0] * 4, rule)
    assert slow["n"] == 8 and slow["flags"] == ["CAP_HIT"]
    # Wall-clock cap, on a fake clock that advances 1 s per call.
    ticks = iter(range(100))
    walled = qm.until_precise(lambda: [1.0, 100.0] * 4, rule, clock=lambda: float(next(ticks)))
    assert walled["n"] == 16 and walled["flags"] == ["CAP_HIT"]


def _space_yaml():
    """experiments/spaces/fused-moe.yaml's space lists and constraints, read without a YAML library."""
    text = (REPO / "experiments" / "spaces" / "fused-moe.yaml").read_text()
    space_block = text.split("space:", 1)[1].split("constraints:", 1)[0]
    space = {
        m.group(1): [int(v) for v in m.group(2).split(",")]
        for m in re.finditer(r"^\s+(\w+): \[([\d, ]+)\]\s*$", space_block, re.M)
    }
    constraints = re.findall(r'^\s+- "(.*)"\s*$', text.split("constraints:", 1)[1], re.M)
    return space, constraints


def test_sweep_is_the_tuning_space_under_its_constraints(qm):
    space, constraints = _space_yaml()
    assert space == qm.SPACE
    # allowed() implements these; a new or changed constraint must be added there.
    assert constraints == [
        "(BLOCK_SIZE_M + BLOCK_SIZE_N) * BLOCK_SIZE_K * 2 * num_stages <= device.smem_bytes",
        "BLOCK_SIZE_M <= max(16, 2 * M * topk // E)",
        "num_warps == 4 or BLOCK_SIZE_M * BLOCK_SIZE_N >= 8192",
        "BLOCK_SIZE_M >= 64 or M < 1024",
        "BLOCK_SIZE_N >= 64 or M <= 128",
        "num_warps == 8 or M < 2048 or BLOCK_SIZE_M * BLOCK_SIZE_N < 8192",
    ]
    smem = qm.SM90_SMEM
    splits = qm.sweep("fp8", 1, 4, 128, smem)
    both = [{k: v for k, v in c.items() if k != "SPLIT_K"} for c in splits if c["SPLIT_K"] == 1]
    # Decode sizes: every config once per split of K.
    assert sorted(json.dumps(c, sort_keys=True) for c in splits) == sorted(
        json.dumps(dict(c, SPLIT_K=sk), sort_keys=True) for c in both for sk in qm.SPLIT_K_VALUES
    )
    one = [{k: v for k, v in c.items() if k != "SWAP_AB"} for c in both if c["SWAP_AB"] == 0]
    assert one and all(c["BLOCK_SIZE_M"] == 16 and c["GROUP_SIZE_M"] == 1 and c["num_warps"] == 4 for c in one)
    # Swapped operands: every unswapped config, plus eight warps where the weights' side is 128 rows or more.
    swapped = [{k: v for k, v in c.items() if k != "SWAP_AB"} for c in both if c["SWAP_AB"] == 1]
    assert [c for c in swapped if c["num_warps"] == 4] == one
    assert {c["BLOCK_SIZE_N"] for c in swapped if c["num_warps"] == 8} == {128, 256}
    assert all((16 + c["BLOCK_SIZE_N"]) * c["BLOCK_SIZE_K"] * 2 * c["num_stages"] <= smem for c in one)
    assert {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 256,
        "BLOCK_SIZE_K": 256,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 4,
    } not in one  # 557,056 bytes of shared memory
    assert len(one) == len({json.dumps(c, sort_keys=True) for c in one})
    # Many tokens: only tall blocks, and large tiles with eight warps.
    big = [c for c in qm.sweep("fp8", 16384, 4, 32, smem) if c["SWAP_AB"] == 0]
    assert {c["SPLIT_K"] for c in big} == {1}  # tiles enough: no split
    assert {c["BLOCK_SIZE_M"] for c in big} == {64, 128}
    assert {c["num_warps"] for c in big} == {4, 8} and {c["GROUP_SIZE_M"] for c in big} == {1}
    assert all(c["num_warps"] == 8 or c["BLOCK_SIZE_M"] * c["BLOCK_SIZE_N"] < 8192 for c in big)
    # MXFP4: every config once per dequantisation, after the one-token kernel's (GEMV=1, 2) at decode sizes.
    mx_all = qm.sweep("mxfp4", 1, 4, 128, smem)
    gemv = [c for c in mx_all if c["GEMV"] in (1, 2)]
    assert len(gemv) == 2 * sum(c["GEMV"] == 2 for c in gemv)
    rest = mx_all[len(gemv) :]
    # The space less the tiles that would give a thread over 32 words (256 codes) a K step.
    assert 0 < len(gemv) < math.prod(len(v) for v in qm.GEMV_SPACE.values())
    assert all(c["BLOCK_SIZE_N"] * c["BLOCK_SIZE_K"] <= 8192 * c["num_warps"] for c in gemv)
    assert all(c["BLOCK_SIZE_M"] == 1 and c["SWAP_AB"] == c["MX_PTX"] == c["DOT_SCALED"] == 0 for c in gemv)
    assert {c["SPLIT_K"] for c in gemv} == set(qm.GEMV_SPACE["SPLIT_K"])
    assert list(gemv[0]) == list(rest[0])  # one key order: the report's config text reads alike
    mx = [{k: v for k, v in c.items() if k != "SPLIT_K"} for c in rest if c["SPLIT_K"] == 1]
    assert len(mx) == 3 * len(both)
    assert sorted(json.dumps(c, sort_keys=True) for c in mx) == sorted(
        json.dumps(dict(c, DOT_SCALED=ds, MX_PTX=px, GEMV=0), sort_keys=True)
        for c in both
        for ds, px in ((0, 0), (1, 0), (0, 1))
    )
    # Past the decode sizes: no one-token configs.
    assert all(c["GEMV"] == 0 for c in qm.sweep("mxfp4", 4, 4, 128, smem))


def test_sweep_runs_vllms_default_first_and_its_neighbours_next(qm):
    configs = qm.with_default_first("mxfp4", 1, 128, qm.sweep("mxfp4", 1, 4, 128, qm.SM90_SMEM))
    default = qm.default_config("mxfp4", 1, 128)
    assert configs[0] == default and configs.count(default) == 1
    # Then the one-token kernel's configs, then the MMA kernels' nearest the default first.
    mma = [c for c in configs[1:] if c["GEMV"] == 0]
    assert all(c["GEMV"] in (1, 2) for c in configs[1 : len(configs) - len(mma)])
    distance = [sum(c[k] != v for k, v in default.items()) for c in mma]
    assert distance == sorted(distance) and distance[0] == 1


def test_peak_table_is_the_runners(qm):
    rust = (REPO / "src" / "device" / "cuda.rs").read_text()
    body = rust.split("pub fn peak_bandwidth_gbs", 1)[1].split("\n}\n", 1)[0]
    h200 = float(re.search(r'name\.contains\("H200"\) \{\s*return ([\d.]+);', body).group(1))
    h100 = float(re.search(r'name\.contains\("H100"\)[^{]*\{\s*return ([\d.]+);', body).group(1))
    assert qm.peak_bandwidth_gbs("NVIDIA H200") == h200 == 4800.0
    assert qm.peak_bandwidth_gbs("NVIDIA H100 80GB HBM3") == h100
    assert qm.peak_bandwidth_gbs("NVIDIA H100 PCIe") is None
    # Anything else: double data rate over the bus (an A100 40GB: 1215 MHz, 5120 bits).
    assert qm.peak_bandwidth_gbs("NVIDIA A100-SXM4-40GB", 1_215_000, 5120) == pytest.approx(1555.2)


def test_plan_runs_the_goal_shapes_first_with_larger_shares(qm):
    args = qm.parse_args(["--mxfp4-m", "4,1,64", "--fp8-m", "2,8,256"])
    plan = qm.plan_shapes(args)
    assert [(f, s["M"], w) for f, s, w in plan] == [
        ("mxfp4", 1, 2.0),
        ("fp8", 2, 1.0),
        ("fp8", 8, 2.0),
        ("fp8", 256, 2.0),
        ("mxfp4", 4, 1.0),
        ("mxfp4", 64, 1.0),
    ]
    mx, fp8 = plan[0][1], plan[2][1]
    assert mx == {
        "E": 128,
        "topk": 4,
        "K": 2880,
        "N": 2880,
        "act_dtype": "bf16",
        "M": 1,
        "dtype": "mxfp4",
        "activation": "swiglu_oai",
    }
    assert fp8["dtype"] == "fp8" and fp8["weight_quant"] == "per_tensor" and fp8["activation"] == "silu"
    with pytest.raises(SystemExit):
        qm.parse_args(["--smoke", "--act-dtype", "bf16"])


def _entry(fmt, M, bound_us, best_us):
    row = {"config": {}, "cold": {"median_us": best_us}} if best_us else None
    return {"format": fmt, "shape": {"M": M}, "bound_us": bound_us, "best_cold": row}


def test_goals_are_judged_on_cold_times_over_the_goal_range():
    report = load_bench("quant_moe_report")  # the report alone: no torch
    meta = {"smoke": False, "device": "NVIDIA H200"}
    shapes = [
        _entry("mxfp4", 1, 7.0, 10.0),
        _entry("mxfp4", 4, 1.0, 10.0),  # M=4 is outside the goal
        _entry("fp8", 8, 8.0, 10.0),
        _entry("fp8", 256, 7.9, 10.0),
        _entry("fp8", 512, 1.0, 10.0),
    ]
    lines = report.goal_lines({"meta": meta, "shapes": shapes})
    assert lines[0].startswith("- mxfp4 (goal >= 70 %") and ": met: M=1 70.0 %" in lines[0]
    assert ": missed: M=8 80.0 %, M=256 79.0 %" in lines[1] and "512" not in lines[1]
    # An untimed shape misses; a goal met on another part says so.
    h100 = report.goal_lines(
        {
            "meta": dict(meta, device="NVIDIA H100 80GB HBM3"),
            "shapes": [_entry("mxfp4", 1, 9.0, 10.0), _entry("fp8", 16, 1.0, None)],
        }
    )
    assert "met on this NVIDIA H100 80GB HBM3 (the goal names an H200)" in h100[0]
    assert ": missed: M=16 - %" in h100[1]
    assert "not measured" in report.goal_lines({"meta": meta, "shapes": []})[0]


def _run_bench(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    env.pop("TRITON_INTERPRET", None)  # --smoke must set it itself
    return subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--out", str(tmp_path), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_smoke_run_checks_times_and_reports(tmp_path):
    done = _run_bench(tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "quant_moe.json").read_text())
    md = (tmp_path / "quant_moe.md").read_text()
    meta = report["meta"]
    assert meta["smoke"] and meta["device"] == "CPU (Triton interpreter)" and meta["act_dtype"] == "fp16"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", meta["date"]) and meta["command"].endswith(f"--out {tmp_path}")
    assert [(e["format"], e["shape"]["M"]) for e in report["shapes"]] == [("mxfp4", 1), ("fp8", 2)]
    assert report["skipped"] == []
    for e in report["shapes"]:
        # Every config ran, passed its check and was timed; vLLM's default first.
        assert e["cut_by_budget"] == 0 and len(e["rows"]) == e["configs"] >= 2
        assert e["rows"][0]["role"] == "vLLM's default config"
        for row in e["rows"]:
            assert row["check"]["passed"] and row["check"]["nan_count"] == 0, row
            assert row["cold"]["n"] == 2 and row["cold"]["median_us"] > 0
        assert e["best_cold"] == min(e["rows"], key=lambda r: r["cold"]["median_us"])
        assert e["bound_us"] == pytest.approx(e["bytes"] / (meta["peak_gbs"] * 1e9) * 1e6)
        assert e["best_cold"]["graph"]["median_us"] > 0 and e["rows"][0]["graph"]["median_us"] > 0
        assert f"| {e['format']} | E=8 N=32 M={e['shape']['M']} | {e['bound_us']:.1f} |" in md
    mx, fp8 = report["shapes"]
    assert {r["config"]["DOT_SCALED"] for r in mx["rows"]} == {0, 1}
    # MXFP4 bytes: 4 experts or fewer of 3 * 32 * 64 weights at 0.5 + 1/32 bytes, biases and activations in fp16.
    per_expert = 3 * 32 * 64 * (0.5 + 1 / 32) + (2 * 32 + 64) * 2
    assert (mx["bytes"] - 2 * 64 * 2) / per_expert in (1.0, 2.0)
    assert [r["method"] for r in fp8["vllm_structure"]] == ["fused_moe_vllm"] * len(fp8["vllm_structure"])
    assert all(r["check"]["passed"] and r["cold"]["median_us"] > 0 for r in fp8["vllm_structure"])
    assert [(p["shape"]["M"], p["shape"]["activation"], p["shape"]["dtype"]) for p in report["plain"]] == [
        (1, "swiglu_oai", "fp16"),
        (2, "silu", "fp16"),
    ]
    assert all(p["row"]["check"]["passed"] for p in report["plain"])
    assert "Not judged: a CPU smoke run" in md and "## fp8 in vLLM's call structure" in md
    assert "best with DOT_SCALED=0" in md and "best with DOT_SCALED=1" in md


def test_spent_budget_skips_and_says_so(tmp_path):
    done = _run_bench(tmp_path, "--budget-s", "0")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "quant_moe.json").read_text())
    assert report["shapes"] == [] and report["plain"] == []
    assert report["skipped"] == [
        "mxfp4 E=8 N=32 M=1",
        "fp8 E=8 N=32 M=2",
        "unquantised E=8 N=32 M=1 swiglu_oai",
        "unquantised E=8 N=32 M=2 silu",
    ]
    md = (tmp_path / "quant_moe.md").read_text()
    assert "- not run (time budget): fp8 E=8 N=32 M=2" in md
