"""The kernel workbench at the compile level: no GPU needed.

A compile worker started with `--target cuda:90:32` compiles for an H100 on
any machine (Triton and ptxas run on the CPU), so what a kernel compiles to
can be tested here: the resources every job reports, the IR `--keep-ir`
writes, an `ir:` method compiled from a dumped IR (same PTX and cubin as
the source: the round trip), compile options as config values, and passes of
Triton's pipeline applied to an IR file. What needs a GPU (the same output
bits from the IR as from the source, Proton) is in test_workbench_gpu.py.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import MODE, PYTHON_DIR
from tunelab.workbench import irfile, jit

SHAPE = {"M": 256, "N": 256, "K": 256, "dtype": "fp16"}
CONFIG = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 32,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


def job(job_id="j", ir=None, **config):
    method = {"name": "triton", "kind": "triton", "kernel": "matmul"}
    if ir is not None:
        method["ir"] = str(ir)
    return {"job_id": job_id, "problem": "gemm", "shape": SHAPE, "method": method, "config": {**CONFIG, **config}}


@pytest.fixture
def compiler(spawn_worker, tmp_path):
    """A compile worker for sm_90 that sees no GPU, with its own cache."""
    cache = tmp_path / "triton-cache"
    worker = spawn_worker(
        "--role",
        "compile",
        "--target",
        "cuda:90:32",
        env_overrides={"TRITON_INTERPRET": None, "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(cache)},
    )
    worker.cache = cache
    return worker


def ok(response):
    assert response["ok"], response
    return response


def test_a_compile_reports_each_kernels_registers_spills_and_shared_memory(compiler):
    kernels = ok(compiler.request("compile", job=job()))["kernels"]
    assert [k["name"] for k in kernels] == ["matmul_kernel"]
    k = kernels[0]
    # Read from the cubin (cuobjdump), as the driver would report them once loaded.
    assert isinstance(k["n_regs"], int) and 16 < k["n_regs"] <= 255, k
    assert k["n_spills"] == 0, k
    # Two 64x32 and 32x64 fp16 tiles per stage, three stages: 24 KiB.
    assert k["shared"] == 3 * (64 * 32 + 32 * 64) * 2
    assert (k["num_warps"], k["num_stages"]) == (4, 3)


def test_res_usage_parsing():
    text = (
        " Common:\n  GLOBAL:0\n Function other:\n  REG:10 STACK:0 SHARED:0 LOCAL:0\n"
        " Function matmul_kernel:\n  REG:168 STACK:8 SHARED:1024 LOCAL:96 CONSTANT[0]:592 TEXTURE:0\n"
    )
    assert jit.parse_res_usage(text, "matmul_kernel") == (168, 24)
    assert jit.parse_res_usage(text, "missing") == (None, None)


def test_compile_options_reach_every_kernel_and_change_the_binary(compiler):
    big = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128}
    plain = ok(compiler.request("compile", job=job("a", **big)))["kernels"][0]
    capped = ok(compiler.request("compile", job=job("b", maxnreg=128, **big)))["kernels"][0]
    assert capped["n_regs"] == 128 < plain["n_regs"], (plain, capped)
    ok(compiler.request("compile", job=job("c", enable_fp_fusion=False, **big)))
    metas = [json.loads(p.read_text()) for p in compiler.cache.rglob("matmul_kernel.json")]
    assert sorted((m["maxnreg"] or 0, m["enable_fp_fusion"]) for m in metas) == [(0, False), (0, True), (128, True)]
    # Too few registers for the accumulator: ptxas refuses, a compile error of the job.
    refused = compiler.request("compile", job=job("d", maxnreg=40, **big))
    assert refused["ok"] is False and refused["class"] == "compile_error"


def test_probe_adds_compile_options_to_triton_methods(spawn_worker):
    worker = spawn_worker()
    probe = ok(
        worker.request(
            "probe",
            problem="gemm",
            shape=SHAPE,
            methods=["matmul", "torch_matmul"],
            kinds={"matmul": "triton", "torch_matmul": "torch"},
        )
    )
    types = probe["methods"]["matmul"]["config_types"]
    assert types["maxnreg"] == "int" and types["enable_fp_fusion"] == "bool" and types["BLOCK_SIZE_M"] == "int"
    assert probe["methods"]["torch_matmul"]["config_types"] == {}


def test_keep_ir_writes_every_stage_and_the_metadata(compiler, tmp_path):
    out = tmp_path / "ir" / "M=256,N=256,K=256,dtype=fp16" / "triton"
    kernels = ok(compiler.request("keep_ir", job=job(), dir=str(out)))["kernels"]
    assert [k["name"] for k in kernels] == ["matmul_kernel"]
    files = set(kernels[0]["files"])
    assert {
        "matmul_kernel.ttir",
        "matmul_kernel.ttgir",
        "matmul_kernel.llir",
        "matmul_kernel.ptx",
        "matmul_kernel.cubin",
        "matmul_kernel.source.ttir",
        "matmul_kernel.json",
    } <= files
    assert files == {p.name for p in out.iterdir()}
    meta = json.loads((out / "matmul_kernel.json").read_text())
    assert meta["metadata"]["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert meta["resources"]["n_regs"] == kernels[0]["n_regs"]
    # What a launch without Triton needs (the aot output): every parameter in
    # order, as compiled at this shape (256: divisible by 16; unit strides folded).
    params = {p["name"]: p for p in meta["launch"]["params"]}
    assert list(params)[:6] == ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K"]
    assert params["a_ptr"]["type"] == "*fp16" and params["a_ptr"]["attrs"] == [["tt.divisibility", 16]]
    assert params["M"]["type"] == "i32" and params["M"]["attrs"] == [["tt.divisibility", 16]]
    assert params["stride_ak"]["type"] == "constexpr" and params["stride_ak"]["value"] == 1
    assert not params["stride_ak"]["declared_constexpr"]
    assert params["BLOCK_SIZE_M"]["declared_constexpr"] and params["BLOCK_SIZE_M"]["value"] == 64
    assert ".target sm_90a" in (out / "matmul_kernel.ptx").read_text()
    if "matmul_kernel.sass" in files:
        assert "HMMA" in (out / "matmul_kernel.sass").read_text() or "HGMMA" in (out / "matmul_kernel.sass").read_text()


def _kept(compiler, tmp_path, name="src", **config):
    out = tmp_path / name
    ok(compiler.request("keep_ir", job=job(name, **config), dir=str(out)))
    return out


@pytest.mark.parametrize("stage", ["ttgir", "ttir", "llir", "ptx"])
def test_ir_round_trip_compiles_to_the_same_ptx_and_cubin(compiler, tmp_path, stage):
    """A dumped IR compiled as an `ir:` method gives the source's PTX and cubin:
    what runs from the file is what ran from the source."""
    src = _kept(compiler, tmp_path)
    ir_file = tmp_path / "edits" / f"matmul_kernel.{stage}"
    ir_file.parent.mkdir()
    shutil.copy(src / f"matmul_kernel.{stage}", ir_file)
    out = tmp_path / "from_ir"
    kernels = ok(compiler.request("keep_ir", job=job("ir", ir=ir_file), dir=str(out)))["kernels"]
    assert (out / "matmul_kernel.ptx").read_text() == (src / "matmul_kernel.ptx").read_text()
    assert (out / "matmul_kernel.cubin").read_bytes() == (src / "matmul_kernel.cubin").read_bytes()
    meta = json.loads((out / "matmul_kernel.json").read_text())["metadata"]
    assert meta["ir_override"].endswith(f"matmul_kernel.{stage}") and "tunelab-ir" in meta["ir_override"]
    assert kernels[0]["n_regs"] > 0


def _python(*args, cwd=None):
    """Runs tunelab's Python in a child, as `tunelab ir-pass` does: this test
    process runs Triton's interpreter and must keep its driver."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(PYTHON_DIR)
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_ir_round_trip_through_triton_irsource(compiler, tmp_path):
    """The same at Triton's own entry point for IR files (triton.compile of a
    path: IRSource), which `tunelab ir-pass --compile` compiles with."""
    src = _kept(compiler, tmp_path)
    out = _python(
        "-c",
        f"""
import json, sys
from tunelab.workbench import passes
c = passes.compile_file({str(src / "matmul_kernel.ttgir")!r}, 'cuda:90:32', {{'num_stages': 3}}, cache={str(tmp_path / "c2")!r})
print(json.dumps({{'ptx': c['ptx'], 'cubin': c['cubin'].hex(), 'res': c['resources']}}))
""",
    )
    compiled = json.loads(out.splitlines()[-1])
    assert compiled["ptx"] == (src / "matmul_kernel.ptx").read_text()
    assert bytes.fromhex(compiled["cubin"]) == (src / "matmul_kernel.cubin").read_bytes()
    assert compiled["res"]["shared"] == 24576


def test_ir_pass_lists_tritons_pipeline_and_applies_passes_from_it(compiler, tmp_path):
    src = _kept(compiler, tmp_path)
    listing = _python("-m", "tunelab.workbench.passes", str(src / "matmul_kernel.ttgir"), "--list")
    assert "make_ttgir:" in listing and "make_llir:" in listing
    # The arguments are Triton's own at this file's options: 3 stages, sm_90.
    assert "ttgpuir.pipeline(3, false)" in listing and "nvidia.ttnvgpuir.fence_insertion(90)" in listing
    listing4 = _python(
        "-m", "tunelab.workbench.passes", str(src / "matmul_kernel.ttgir"), "--list", "--option", "num_stages=4"
    )
    assert "ttgpuir.pipeline(4, false)" in listing4

    # TTIR through the first passes of make_ttgir: layouts appear, the dot becomes a Hopper MMA.
    out = tmp_path / "partial.ttgir"
    printed = _python(
        "-m",
        "tunelab.workbench.passes",
        str(src / "matmul_kernel.ttir"),
        "--pass",
        "convert_to_ttgpuir",
        "--pass",
        "coalesce",
        "--pass",
        "accelerate_matmul",
        "--option",
        "num_warps=4",
        "--out",
        str(out),
    )
    assert "ttir.convert_to_ttgpuir('cuda:90', 4, 32, 1)" in printed
    assert "#ttg.nvidia_mma" in out.read_text() and "loc(" in out.read_text()
    diff = (tmp_path / "partial.ttgir.diff").read_text()
    assert diff.startswith("---") and "+#blocked" in diff and "loc(" not in diff

    # A pass spelled with its arguments, on a ttgir; --compile compares the resources.
    printed = _python(
        "-m",
        "tunelab.workbench.passes",
        str(src / "matmul_kernel.ttgir"),
        "--pass",
        "ttgpuir.remove_layout_conversions",
        "--pass",
        "common.canonicalizer#2",
        "--compile",
    )
    rows = json.loads(printed[printed.index("\n{") + 1 :])
    assert rows["before"]["n_regs"] == rows["after"]["n_regs"] > 0
    assert (src / "matmul_kernel.after.ttgir").is_file()


def test_pass_names_and_arguments_parse():
    from tunelab.workbench.passes import parse_pass

    assert parse_pass("coalesce") == ("coalesce", 1, None)
    assert parse_pass("add_coalesce#2") == ("coalesce", 2, None)
    assert parse_pass("ttgpuir.pipeline(4, false)") == ("ttgpuir.pipeline", 1, (4, False))
    assert parse_pass("ttir.convert_to_ttgpuir('cuda:90', 4, 32, 1)") == (
        "ttir.convert_to_ttgpuir",
        1,
        ("cuda:90", 4, 32, 1),
    )
    assert parse_pass("x()") == ("x", 1, ())


def test_an_edited_ir_is_compiled_anew_and_an_unchanged_one_found(compiler, tmp_path):
    src = _kept(compiler, tmp_path)
    ir_file = tmp_path / "matmul_kernel.ttgir"
    text = (src / "matmul_kernel.ttgir").read_text()
    ir_file.write_text(text)
    first = ok(compiler.request("keep_ir", job=job("e1", ir=ir_file), dir=str(tmp_path / "e1")))
    # An edit that changes the code: the accumulator starts at 1.0 instead of 0.0.
    edited = text.replace(
        "arith.constant dense<0.000000e+00> : tensor<64x64xf32",
        "arith.constant dense<1.000000e+00> : tensor<64x64xf32",
        1,
    )
    assert edited != text
    ir_file.write_text(edited)
    second = ok(compiler.request("keep_ir", job=job("e2", ir=ir_file), dir=str(tmp_path / "e2")))
    assert (tmp_path / "e1" / "matmul_kernel.ptx").read_text() != (tmp_path / "e2" / "matmul_kernel.ptx").read_text()
    assert first["kernels"][0]["name"] == second["kernels"][0]["name"]
    # Copies are named by content, so both binaries stay in the cache.
    assert len(list(compiler.cache.glob("tunelab-ir/*/matmul_kernel.ttgir"))) == 2


def test_an_ir_of_another_specialisation_is_refused(compiler, tmp_path):
    src = _kept(compiler, tmp_path)
    # Dumped at N=256 (divisible by 16); run at N=250, where N is not.
    bad = dict(job("odd", ir=src / "matmul_kernel.ttgir"), shape={**SHAPE, "N": 250})
    response = compiler.request("compile", job=bad)
    assert response["ok"] is False and response["class"] == "compile_error", response
    assert "signature" in response["message"]


def test_an_ir_of_other_warps_is_refused(compiler, tmp_path):
    src = _kept(compiler, tmp_path)
    response = compiler.request("compile", job=job("w", ir=src / "matmul_kernel.ttgir", num_warps=8))
    assert response["ok"] is False and response["class"] == "compile_error", response
    assert "num-warps = 4" in response["message"]


def test_an_ir_of_a_kernel_the_method_does_not_launch_is_refused(compiler, tmp_path):
    src = _kept(compiler, tmp_path)
    other = tmp_path / "other.ttgir"
    other.write_text((src / "matmul_kernel.ttgir").read_text().replace("@matmul_kernel", "@other_kernel"))
    response = compiler.request("compile", job=job("o", ir=other))
    assert response["ok"] is False and response["class"] == "compile_error", response
    assert "@other_kernel is not one the method compiles" in response["message"]


def test_ir_files_are_read_without_triton(tmp_path):
    text = (
        'module attributes {"ttg.num-warps" = 8 : i32, ttg.target = "cuda:90"} {\n'
        '  tt.func public @k(%a: !tt.ptr<f16> {tt.divisibility = 16 : i32} loc("a"(#loc)), '
        '%n: i32 loc("n"(#loc))) attributes {noinline = false} {\n  }\n}\n'
    )
    path = tmp_path / "k.ttgir"
    path.write_text(text)
    f = irfile.IrFile.load(path)
    assert f.entry == "k" and f.ext == "ttgir"
    assert f.signature() == [("!tt.ptr<f16>", "{tt.divisibility = 16 : i32}"), ("i32", "")]
    assert f.module_int_attr("ttg.num-warps") == 8 and f.module_str_attr("ttg.target") == "cuda:90"
    with pytest.raises(irfile.IrFileError, match="must end in one of"):
        irfile.IrFile.load(tmp_path / "k.mlir")
    assert irfile.entry_name(".visible .entry matmul_kernel(\n", "ptx") == "matmul_kernel"
    assert irfile.entry_name("define ptx_kernel void @matmul_kernel(ptr addrspace(1) %0)", "llir") == "matmul_kernel"
    assert re.match(r"[0-9a-f]{64}", f.sha256)


@pytest.mark.skipif(MODE != "interpreter", reason="the interpreter's answers")
def test_in_the_interpreter_a_check_reports_no_kernels_and_refuses_to_run_ir(spawn_worker, tmp_path):
    worker = spawn_worker()
    small = {
        "job_id": "s",
        "problem": "gemm",
        "shape": {"M": 32, "N": 32, "K": 32, "dtype": "fp16"},
        "method": {"name": "triton", "kind": "triton", "kernel": "matmul"},
        "config": {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "num_warps": 4, "num_stages": 2},
    }
    tolerance = {"atol": 1e-2, "rtol": 1e-2}
    checked = ok(worker.request("check", job=small, seed=0, tolerance=tolerance))
    assert checked["passed"] and checked["kernels"] == []
    ir = tmp_path / "matmul_kernel.ttgir"
    ir.write_text("module {\n  tt.func public @matmul_kernel() {\n  }\n}\n")
    refused = worker.request(
        "check", job=dict(small, method={**small["method"], "ir": str(ir)}), seed=0, tolerance=tolerance
    )
    assert refused["ok"] is False and refused["class"] == "problem_error" and "needs a GPU" in refused["message"]
    kept = worker.request("keep_ir", job=small, dir=str(tmp_path / "ir"))
    assert kept["ok"] is False and "interpreter compiles nothing" in kept["message"]


# ---------------------------------------------------------------- profile (what runs without a GPU)


def test_a_proton_profile_is_read_per_scope_and_summarised():
    from tunelab.workbench import profile

    hatchet = [
        {
            "frame": {"name": "ROOT", "type": "function"},
            "metrics": {},
            "children": [
                {
                    "frame": {"name": "M=64,N=64/triton", "type": "function"},
                    "metrics": {"flops": 2.0e9, "bytes": 4.0e6},
                    "children": [
                        {
                            "frame": {"name": "matmul_kernel", "type": "function"},
                            "metrics": {"time (ns)": 150000.0, "count": 10, "device_id": "0"},
                            "children": [],
                        }
                    ],
                },
                {
                    "frame": {"name": "M=64,N=64/fused", "type": "function"},
                    "metrics": {},
                    "children": [
                        {
                            "frame": {"name": "gemm1", "type": "function"},
                            "metrics": {"time (ns)": 60000.0, "count": 10},
                            "children": [],
                        },
                        {
                            "frame": {"name": "gemm2", "type": "function"},
                            "metrics": {"time (ns)": 20000.0, "count": 10},
                            "children": [],
                        },
                    ],
                },
                {
                    "frame": {"name": "other", "type": "function"},
                    "metrics": {"time (ns)": 5.0, "count": 1},
                    "children": [],
                },
            ],
        },
        {"CUDA": {"0": {"arch": "90", "num_sms": 132}}},
    ]
    request = {
        "experiment": "x",
        "device": "NVIDIA H100 80GB HBM3",
        "calls": 10,
        "jobs": [
            {
                "label": "M=64,N=64/triton",
                "rank": 1,
                "winner_of_shape": True,
                "median_us": 16.0,
                "flops": 2.0e9,
                "bytes": 4.0e6,
                "job": {"job_id": "a"},
            },
            {
                "label": "M=64,N=64/fused",
                "rank": 1,
                "median_us": 9.0,
                "flops": None,
                "bytes": 8.0e6,
                "job": {"job_id": "b"},
            },
            {"label": "M=64,N=64/broken", "rank": 1, "median_us": 5.0, "job": {"job_id": "c"}},
        ],
    }
    scopes = profile.hatchet_scopes(hatchet, {j["label"] for j in request["jobs"]})
    assert scopes["M=64,N=64/triton"]["kernels"] == {"matmul_kernel": [10, 150000.0]}
    rows = profile.summarise(request, scopes, {}, {"M=64,N=64/broken": "compile_error: no"})
    triton, fused, broken = rows
    assert triton["gpu_us"] == pytest.approx(15.0) and triton["launches_per_call"] == 1
    assert triton["tflops"] == pytest.approx(2.0e9 / 15e-6 / 1e12)
    assert triton["gbs"] == pytest.approx(4.0e6 / 15e-6 / 1e9)
    assert fused["gpu_us"] == pytest.approx(8.0) and fused["launches_per_call"] == 2 and "tflops" not in fused
    assert [k["name"] for k in fused["kernels"]] == ["gemm1", "gemm2"]
    assert fused["kernels"][0]["share"] == pytest.approx(0.75)
    assert broken["error"] == "compile_error: no"
    text = profile.markdown(request, rows, {"proton": "proton.hatchet", "ncu_note": "Nsight Compute: skipped."})
    assert (
        "| M=64,N=64/triton (fastest of its shape) | 16.0 | 15.0 | 1 | 267 | 133.33 | `matmul_kernel` 100 % |" in text
    )
    assert "not profiled: compile_error: no" in text and "[proton.hatchet](proton.hatchet)" in text


def test_nsight_compute_raw_csv_is_read():
    from tunelab.workbench import profile

    text = (
        "==PROF== Disconnected\n"
        '"ID","Kernel Name","Block Size","Grid Size","gpu__time_duration.sum","launch__registers_per_thread",'
        '"sm__warps_active.avg.pct_of_peak_sustained_active","dram__throughput.avg.pct_of_peak_sustained_elapsed"\n'
        '"","","","","usecond","register/thread","%","%"\n'
        '"0","matmul_kernel","(128, 1, 1)","(64, 1, 1)","14.21","168","11.8","71.4"\n'
    )
    rows = profile.parse_ncu_raw(text)
    assert rows == [
        {
            "kernel": "matmul_kernel",
            "block": "(128, 1, 1)",
            "grid": "(64, 1, 1)",
            "duration": "14.21 usecond",
            "regs": "168 register/thread",
            "occupancy_pct": "11.8 %",
            "dram_pct": "71.4 %",
        }
    ]
    assert profile.parse_ncu_raw("nothing here\n") == []


@pytest.mark.skipif(MODE == "gpu", reason="what a machine without a GPU answers")
def test_profiling_without_a_gpu_says_so_in_one_line(tmp_path):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"experiment": "x", "device": "d", "calls": 1, "jobs": []}))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(PYTHON_DIR)
    done = subprocess.run(
        [sys.executable, "-m", "tunelab.profiler", str(request), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 4, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tunelab profile: ") and ("needs a GPU" in last or "Proton" in last), last


def test_an_edited_ttgir_with_a_register_cap_compiles_to_it(compiler, tmp_path):
    """An IR edit with a visible effect: `ttg.maxnreg` in the module's attributes
    reaches the PTX (`.maxnreg`) and the binary's register count."""
    src = _kept(compiler, tmp_path, BLOCK_SIZE_M=128, BLOCK_SIZE_N=128)
    before = json.loads((src / "matmul_kernel.json").read_text())["resources"]["n_regs"]
    text = (src / "matmul_kernel.ttgir").read_text()
    edited = tmp_path / "edits" / "matmul_kernel.ttgir"
    edited.parent.mkdir()
    edited.write_text(text.replace("module attributes {", 'module attributes {"ttg.maxnreg" = 128 : i32, ', 1))
    out = tmp_path / "capped"
    big = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128}
    kernels = ok(compiler.request("keep_ir", job=job("cap", ir=edited, **big), dir=str(out)))["kernels"]
    assert kernels[0]["n_regs"] == 128 < before
    assert ".maxnreg 128" in (out / "matmul_kernel.ptx").read_text()


def test_an_ir_kept_with_its_metadata_is_held_to_the_constexprs_it_folded_in(compiler, tmp_path):
    """GROUP_SIZE_M is a constexpr: folded into the IR, absent from its signature.
    Beside the NAME.json --keep-ir wrote, the IR is refused at another value."""
    src = _kept(compiler, tmp_path)
    meta = json.loads((src / "matmul_kernel.json").read_text())
    assert meta["constants"]["GROUP_SIZE_M"] == "1" and meta["constants"]["BLOCK_SIZE_K"] == "32"
    response = compiler.request("compile", job=job("g", ir=src / "matmul_kernel.ttgir", GROUP_SIZE_M=8))
    assert response["ok"] is False and response["class"] == "compile_error", response
    assert "GROUP_SIZE_M=1" in response["message"] and "GROUP_SIZE_M=8" in response["message"]
    # Alone (copied without its metadata) only the signature can be compared: it compiles.
    alone = tmp_path / "alone" / "matmul_kernel.ttgir"
    alone.parent.mkdir()
    shutil.copy(src / "matmul_kernel.ttgir", alone)
    assert ok(compiler.request("compile", job=job("g2", ir=alone, GROUP_SIZE_M=8)))
