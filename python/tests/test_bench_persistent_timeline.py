"""bench/moe_persistent_timeline.py: reading a traced launch's stamps (the
layout the kernel writes, trace_layout) and summarising them, on a made-up
trace; the GPU run itself is the benchmark's."""

import types

import pytest
import torch
from conftest import load_bench

from tunelab.kernels.fused_moe import TRACE_PER_PROGRAM, make_persistent_plan, trace_layout
from tunelab.problems.moe import FusedMoE


@pytest.fixture(scope="module")
def tl():
    return load_bench("moe_persistent_timeline")


def fake_launch():
    """A launch's stamps as the kernel would leave them: two programs, one block
    (M=1, topk=1: one slot), GEMM 1 one tile in two K slices, GEMM 2 two column
    tiles; %globaltimer nanoseconds from 1_000_000."""
    problem = FusedMoE({"M": 1, "E": 8, "topk": 1, "K": 64, "N": 16, "dtype": "fp16"})
    config = {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 32,
        "BLOCK_SIZE_K": 16,
        "BLOCK_SIZE_N2": 32,
        "BLOCK_SIZE_K2": 16,
        "SPLIT_K": 2,
        "num_warps": 4,
        "num_stages": 2,
        "PROGRAMS_PER_SM": 1,
        "PREFETCH_W2": 0,
    }
    plan = make_persistent_plan(problem, config)
    assert (plan.max_blocks, plan.n_tiles1, plan.split_k, plan.n_tiles2) == (1, 1, 2, 2)
    grid = 2
    layout = trace_layout(plan, grid)
    raw = torch.zeros(layout["words"], dtype=torch.int64)
    t0 = 1_000_000
    # program p: start, GEMM 1 begins, GEMM 1 ends, end, SM
    programs = [[t0, t0 + 500, t0 + 4000, t0 + 9000, 7], [t0 + 100, t0 + 600, t0 + 5000, t0 + 10000, 3]]
    for p, record in enumerate(programs):
        raw[p * TRACE_PER_PROGRAM : (p + 1) * TRACE_PER_PROGRAM] = torch.tensor(record)
    first1, _ = layout["items1"]
    raw[first1 : first1 + 6] = torch.tensor([t0 + 500, t0 + 3000, t0 + 4000, t0 + 600, t0 + 3500, t0 + 5000])
    first2, _ = layout["items2"]
    raw[first2 : first2 + 8] = torch.tensor(
        [t0 + 4000, t0 + 5200, t0 + 7000, t0 + 9000, t0 + 5000, t0 + 5300, t0 + 8000, t0 + 10000]
    )
    return types.SimpleNamespace(plan=plan, grid=grid, trace=raw)


def test_read_timeline_follows_the_kernels_layout(tl):
    timeline = tl.read_timeline(fake_launch())
    assert [p["sm"] for p in timeline["programs"]] == [7, 3]
    assert timeline["programs"][1] == {"start": 0.1, "gemm1_begin": 0.6, "gemm1_end": 5.0, "end": 10.0, "sm": 3}
    assert timeline["items1"] == [
        {"pid": 0, "begin": 0.5, "loop": 3.0, "end": 4.0},
        {"pid": 1, "begin": 0.6, "loop": 3.5, "end": 5.0},
    ]
    assert timeline["items2"][1] == {"begin": 5.0, "waited": 5.3, "loop": 8.0, "end": 10.0}


def test_summarise_reports_the_critical_steps(tl):
    s = tl.summarise(tl.read_timeline(fake_launch()))
    assert (s["items1"], s["items2"]) == (2, 2)
    assert s["last_start"] == 0.1 and s["end"] == 10.0
    assert s["item1_last_end"] == 5.0 and s["item1_med_loop"] == pytest.approx(2.7)
    assert s["item1_med_epilogue"] == pytest.approx(1.25)
    assert (s["wait_first_over"], s["wait_last_over"]) == (5.2, 5.3)
    assert s["item2_med_loop"] == pytest.approx(2.25) and s["item2_med_epilogue"] == pytest.approx(2.0)
    # An item the routing did not make stays zero in the buffer and is not read.
    launch = fake_launch()
    first2, _ = trace_layout(launch.plan, launch.grid)["items2"]
    launch.trace[first2 + 4 : first2 + 8] = 0
    assert tl.summarise(tl.read_timeline(launch))["items2"] == 1
