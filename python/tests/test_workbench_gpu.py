"""The kernel workbench on a GPU: what test_workbench.py cannot show without one.

- A dumped IR run as an `ir:` method computes the same output bits as the
  source kernel (GEMM at every stage, and one kernel of the fused MoE).
- A lane's check reports the driver's registers and spills, and they are the
  numbers a compile worker reads from the cubin.
- An edited IR (a register cap in the TTGIR module) runs, passes its check and
  uses the registers it asked for.
- `python -m tunelab.profiler` takes a Proton profile.

Skipped without a GPU. Run on an H100 with
    PYTHONPATH=python python -m pytest -q python/tests/test_workbench_gpu.py
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import PYTHON_DIR

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

GEMM_SHAPE = {"M": 512, "N": 384, "K": 1024, "dtype": "bf16"}
GEMM_CONFIG = {
    "BLOCK_SIZE_M": 128,
    "BLOCK_SIZE_N": 128,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 8,
    "num_warps": 8,
    "num_stages": 3,
}
MOE_SHAPE = {"M": 64, "E": 32, "topk": 4, "K": 2880, "N": 2880, "dtype": "bf16", "activation": "silu"}
MOE_CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}
TOLERANCE = {"atol": 2e-2, "rtol": 2e-2, "max_mismatch": 0.005}


def gemm_job(job_id, ir=None):
    method = {"name": "triton", "kind": "triton", "kernel": "matmul"}
    if ir is not None:
        method["ir"] = str(ir)
    return {"job_id": job_id, "problem": "gemm", "shape": GEMM_SHAPE, "method": method, "config": GEMM_CONFIG}


def moe_job(job_id, ir=None):
    method = {"name": "triton", "kind": "triton", "kernel": "fused_moe"}
    if ir is not None:
        method["ir"] = str(ir)
    return {"job_id": job_id, "problem": "moe", "shape": MOE_SHAPE, "method": method, "config": MOE_CONFIG}


@pytest.fixture(scope="module")
def lane():
    from tunelab.worker import Worker

    return Worker(role="lane", mode="gpu")


def checked_bits(lane, job):
    """Check the job; its output's bits (a copy) and the check's reply."""
    reply = lane.check({"job": job, "seed": 0, "tolerance": TOLERANCE})
    assert reply["passed"], reply
    out = lane.prepared.launch.out
    return out.detach().clone().view(torch.int16), reply


@pytest.mark.parametrize("stage", ["ttgir", "ttir", "llir", "ptx"])
def test_a_dumped_ir_computes_the_sources_bits(lane, tmp_path, stage):
    source_bits, _ = checked_bits(lane, gemm_job("src"))
    lane.keep_ir({"job": gemm_job("src"), "dir": str(tmp_path / "kept")})
    ir_bits, reply = checked_bits(lane, gemm_job(f"ir-{stage}", tmp_path / "kept" / f"matmul_kernel.{stage}"))
    assert torch.equal(source_bits, ir_bits)
    assert reply["kernels"][0]["name"] == "matmul_kernel"


def test_one_kernel_of_the_fused_moe_from_its_ir_computes_the_same_bits(lane, tmp_path):
    source_bits, source = checked_bits(lane, moe_job("moe-src"))
    lane.keep_ir({"job": moe_job("moe-src"), "dir": str(tmp_path / "kept")})
    ir_bits, reply = checked_bits(lane, moe_job("moe-ir", tmp_path / "kept" / "moe_gemm1_kernel.ttgir"))
    assert torch.equal(source_bits, ir_bits)
    assert [k["name"] for k in reply["kernels"]] == [k["name"] for k in source["kernels"]]


def test_the_drivers_registers_are_the_cubins(lane):
    from tunelab.workbench import jit

    _, reply = checked_bits(lane, moe_job("moe-res"))
    kernels = {k["name"]: k for k in reply["kernels"]}
    for compiled in lane.prepared.ctx.kernels.values():
        static = jit.static_registers(compiled)
        loaded = kernels[str(compiled.name)]
        assert (loaded["n_regs"], loaded["n_spills"]) == static, (compiled.name, loaded, static)


def test_an_edited_ir_with_a_register_cap_runs_and_uses_what_it_asked_for(lane, tmp_path):
    _, source = checked_bits(lane, moe_job("moe-cap-src"))
    lane.keep_ir({"job": moe_job("moe-cap-src"), "dir": str(tmp_path / "kept")})
    text = (tmp_path / "kept" / "moe_gemm1_kernel.ttgir").read_text()
    cap = 40
    edited = tmp_path / "moe_gemm1_kernel.ttgir"
    edited.write_text(text.replace("module attributes {", f'module attributes {{"ttg.maxnreg" = {cap} : i32, ', 1))
    _, reply = checked_bits(lane, moe_job("moe-cap", edited))
    gemm1 = next(k for k in reply["kernels"] if k["name"] == "moe_gemm1_kernel")
    before = next(k for k in source["kernels"] if k["name"] == "moe_gemm1_kernel")
    assert gemm1["n_regs"] <= cap < before["n_regs"], (before, gemm1)


def test_proton_profiles_a_job(tmp_path):
    request = {
        "experiment": "gpu-test",
        "problem": "gemm",
        "device": torch.cuda.get_device_name(),
        "seed": 0,
        "calls": 5,
        "jobs": [
            {
                "label": "gemm/triton",
                "rank": 1,
                "winner_of_shape": True,
                "job": gemm_job("p"),
                "tolerance": TOLERANCE,
                "median_us": None,
                "flops": 2.0 * 512 * 384 * 1024,
                "bytes": 2.0 * (512 * 1024 + 1024 * 384 + 512 * 384),
            }
        ],
    }
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    done = subprocess.run(
        [sys.executable, "-m", "tunelab.profiler", str(path), "--out", str(tmp_path), "--no-ncu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert rows[0]["gpu_us"] > 0 and rows[0]["kernels"][0]["name"] == "matmul_kernel", rows
    assert rows[0]["launches_per_call"] == pytest.approx(1.0)
    assert (tmp_path / "proton.hatchet").is_file() and "gemm/triton" in (tmp_path / "summary.md").read_text()
