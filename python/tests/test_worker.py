"""The worker: its comparison, its failure classes and the protocol end to end.

End-to-end tests drive `python -m tunelab.worker` over pipes exactly as the
runner does (docs/worker-protocol.md). Without a GPU the worker runs Triton's
interpreter and times with the wall clock; with one it runs the GPU paths.
"""

import ctypes.util
import json
import time
import math
import pathlib

import pytest
import torch

from conftest import MODE, RESPONSE_TIMEOUT_S
from tunelab import PROTOCOL_VERSION
from tunelab.compare import compare
from tunelab.worker import classify, summarize

TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "max_mismatch": 0.0}


def gemm_job(job_id="gemm-1", dtype="fp16", method="matmul", **config):
    # One 32x32 tile: a single interpreted program, so the test stays fast.
    return {
        "job_id": job_id,
        "problem": "gemm",
        "shape": {"M": 32, "N": 32, "K": 32, "dtype": dtype},
        "method": {"name": "triton", "kind": "triton", "kernel": method},
        "config": {
            "BLOCK_SIZE_M": 32,
            "BLOCK_SIZE_N": 32,
            "BLOCK_SIZE_K": 16,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 2,
            **config,
        },
    }


def axpy_job(job_id, method, problem="my_problems:Axpy", n=100):
    return {
        "job_id": job_id,
        "problem": problem,
        "shape": {"N": n, "alpha": 2.0, "dtype": "fp32"},
        "method": {"name": method, "kernel": method},
        "config": {"BLOCK": 64},
    }


def assert_failed(response, failure_class):
    assert response["ok"] is False, response
    assert response["class"] == failure_class, response
    assert isinstance(response["message"], str) and response["message"]


# ---------------------------------------------------------------- compare


def test_compare_identical_outputs_pass():
    ref = torch.randn(64, 3)
    result = compare(ref.clone(), ref, atol=0.0, rtol=0.0, max_mismatch=0.0)
    assert result["passed"]
    assert result["max_abs_err"] == 0.0 and result["max_rel_err"] == 0.0
    assert result["mismatch"] == 0 and result["mismatch_frac"] == 0.0
    assert result["elements"] == 192


def test_compare_tolerance_edge_is_inclusive():
    # allowed = atol + rtol * |ref| = 0.5 + 0.25 * |ref|, exact in fp32.
    ref = torch.tensor([2.0, -2.0, 0.0, 4.0])
    at_edge = torch.tensor([3.0, -3.0, 0.5, 2.5])
    result = compare(at_edge, ref, atol=0.5, rtol=0.25, max_mismatch=0.0)
    assert result["mismatch"] == 0 and result["passed"]
    assert result["max_abs_err"] == 1.5

    just_over = at_edge.clone()
    just_over[0] = torch.nextafter(torch.tensor(3.0), torch.tensor(4.0))
    result = compare(just_over, ref, atol=0.5, rtol=0.25, max_mismatch=0.0)
    assert result["mismatch"] == 1 and result["mismatch_frac"] == 0.25
    assert not result["passed"]


def test_compare_max_mismatch_is_a_fraction():
    ref = torch.zeros(4)
    out = torch.tensor([0.0, 0.0, 0.0, 1.0])
    assert compare(out, ref, atol=0.1, rtol=0.0, max_mismatch=0.25)["passed"]
    assert not compare(out, ref, atol=0.1, rtol=0.0, max_mismatch=0.2)["passed"]


def test_compare_counts_nan_and_inf_and_never_passes_them():
    ref = torch.ones(10)
    out = ref.clone()
    out[1] = float("nan")
    out[2] = float("inf")
    out[3] = float("-inf")
    result = compare(out, ref, atol=0.1, rtol=0.1, max_mismatch=1.0)
    assert result["nan_count"] == 1 and result["inf_count"] == 2
    assert result["mismatch"] == 3
    assert not result["passed"]  # even though every mismatch is allowed
    # The maxima cover the finite elements and stay finite (JSON-safe).
    assert result["max_abs_err"] == 0.0 and math.isfinite(result["max_rel_err"])


def test_compare_all_nan_output():
    result = compare(torch.full((3,), float("nan")), torch.zeros(3), atol=1.0, rtol=1.0, max_mismatch=1.0)
    assert result["nan_count"] == 3 and result["mismatch_frac"] == 1.0 and not result["passed"]
    assert result["max_abs_err"] == 0.0 and result["max_rel_err"] == 0.0


def test_compare_relative_error_over_zero_reference_is_finite():
    result = compare(torch.tensor([1e3, 1.0]), torch.tensor([0.0, 1.0]), atol=0.0, rtol=0.0, max_mismatch=1.0)
    assert math.isfinite(result["max_rel_err"]) and result["max_rel_err"] > 1e30
    assert result["max_abs_err"] == 1e3


def test_compare_works_in_fp32_for_half_outputs():
    ref = torch.tensor([1.0, 2.0, 3.0])
    result = compare(ref.half(), ref, atol=0.0, rtol=0.0, max_mismatch=0.0)
    assert result["passed"]
    assert isinstance(result["max_abs_err"], float) and isinstance(result["nan_count"], int)


def test_compare_rejects_a_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        compare(torch.zeros(4), torch.zeros(2, 2), atol=0.0, rtol=0.0, max_mismatch=0.0)


# ---------------------------------------------------------------- failure classes


def _named(name, base=Exception):
    return type(name, (base,), {})


@pytest.mark.parametrize(
    "exc, stage, expected",
    [
        (_named("CompilationError")("bad kernel"), "launch", "compile_error"),
        (_named("UnsupportedLanguageConstruct", _named("CompilationError"))("x"), "launch", "compile_error"),
        (_named("PTXASError")("ptxas failed"), "compile", "compile_error"),
        (_named("OutOfResources")("shared memory"), "launch", "out_of_resources"),
        (RuntimeError("out of resource: shared memory, Required: 262144"), "launch", "out_of_resources"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "launch", "launch_error"),
        (RuntimeError("Triton Error [CUDA]: misaligned address"), "launch", "launch_error"),
        (RuntimeError("CUDA error: device-side assert triggered"), "problem", "launch_error"),
        (ValueError("shape needs N"), "problem", "problem_error"),
        (KeyError("BLOCK_SIZE_M"), "bind", "problem_error"),
        (RuntimeError("PassManager::run failed"), "compile", "compile_error"),
        (TypeError("anything"), "launch", "launch_error"),
    ],
)
def test_classify(exc, stage, expected):
    assert classify(exc, stage) == expected


def test_summarize_is_short():
    exc = RuntimeError("\n".join(f"line {i}" for i in range(100)))
    message = summarize(exc)
    assert message.startswith("RuntimeError: line 0")
    assert message.count("\n") < 10 and len(message) < 1000


# ---------------------------------------------------------------- end to end


def test_mode_gpu_is_for_a_lane_without_the_interpreter(spawn_worker):
    # A compile worker, or a lane told to interpret: refused at the command line.
    for args, env in ((["--role", "compile", "--mode", "gpu"], {}), (["--mode", "gpu"], {"TRITON_INTERPRET": "1"})):
        w = spawn_worker(*args, env_overrides=env)
        assert w.at_eof(), w.stderr_text()
        assert w.proc.wait(timeout=RESPONSE_TIMEOUT_S) == 2
        assert "--mode gpu is for a lane on a GPU" in w.stderr_text()


def test_mode_gpu_says_hello_on_a_gpu_and_stops_without_one(spawn_worker):
    w = spawn_worker("--mode", "gpu", env_overrides={"TRITON_INTERPRET": None})
    if torch.cuda.is_available():  # not MODE: interpreter tests may run on a GPU host
        hello = w.request("hello")
        assert hello["ok"] and hello["mode"] == "gpu", hello
        return
    # The runner found a GPU that this torch cannot see: a clear stop, not the interpreter.
    assert w.at_eof(), w.stderr_text()
    assert w.proc.wait(timeout=RESPONSE_TIMEOUT_S) == 1
    assert "--mode gpu, and torch sees no GPU here" in w.stderr_text()


def test_probe_reports_methods_and_their_declared_types(spawn_worker):
    worker = spawn_worker()
    shape = {"M": 64, "N": 64, "K": 64, "dtype": "fp16"}
    probed = worker.request("probe", problem="gemm", shape=shape, methods=["matmul", "torch_matmul", "nope"])
    assert probed["ok"], probed
    assert probed["available"] == ["matmul", "torch_matmul", "matmul_a8w8_blockscale"]
    assert probed["methods"]["matmul"]["found"] is True
    assert probed["methods"]["matmul"]["config_types"]["num_warps"] == "int"
    assert probed["methods"]["torch_matmul"]["config_types"] == {}
    assert probed["methods"]["nope"] == {"found": False, "config_types": None}
    assert probed["methods"]["matmul"]["description"] == "tunelab's own Triton GEMM (tunelab.kernels.matmul)."
    # A first sentence wrapped over two docstring lines comes whole.
    moe = {"M": 1, "E": 8, "N": 32, "K": 64, "topk": 2, "dtype": "fp16"}
    probed = worker.request("probe", problem="moe", shape=moe, methods=["fused_moe"])
    assert probed["ok"], probed
    assert probed["methods"]["fused_moe"]["description"] == (
        "Our Triton fused MoE (tunelab.kernels.fused_moe; quantised weights: tunelab.kernels.quant_moe), vLLM-style config."
    )

    missing = worker.request("probe", problem="no_such_module_for_tests:P", shape=shape, methods=[])
    assert not missing["ok"] and missing["class"] == "problem_error"
    assert "No module named 'no_such_module_for_tests'" in missing["message"]
    bad = worker.request("probe", problem="gemm", shape=shape, methods="matmul")
    assert not bad["ok"] and bad["class"] == "bad_request"


def test_protocol_end_to_end(spawn_worker):
    worker = spawn_worker()

    hello = worker.request("hello")
    assert hello["ok"] and hello["protocol"] == PROTOCOL_VERSION and hello["mode"] == MODE
    assert all(key in hello for key in ("python", "torch", "triton", "device", "cuda"))
    if MODE == "interpreter":
        assert hello["device"] == "cpu"

    described = worker.request("describe", problem="gemm", shape={"M": 64, "N": 64, "K": 64, "dtype": "fp16"})
    assert described == {
        "id": described["id"],
        "ok": True,
        "flops": 524288.0,
        "bytes": 24576.0,
        "methods": ["matmul", "torch_matmul", "matmul_a8w8_blockscale"],
        "unavailable": {
            "matmul_a8w8_blockscale": "matmul_a8w8_blockscale multiplies fp8 operands (dtype: fp8), not fp16"
        },
    }

    job = gemm_job()
    compiled = worker.request("compile", job=job)
    assert compiled["ok"] and compiled["compiled"] is (MODE == "gpu") and compiled["seconds"] >= 0

    checked = worker.request("check", job=job, seed=0, tolerance=TOLERANCE)
    assert checked["ok"] and checked["passed"], checked
    assert checked["elements"] == 32 * 32 and checked["nan_count"] == 0 and checked["inf_count"] == 0
    assert checked["mismatch_frac"] == 0.0 and checked["max_abs_err"] < 1e-2
    assert checked["flops"] == 2 * 32**3 and checked["bytes"] == 3 * 32 * 32 * 2

    warm = worker.request("warmup", job_id=job["job_id"], min_launches=2, min_ms=0.0)
    assert warm["ok"] and warm["launches"] >= 2 and warm["ms"] > 0

    for flush_with in ("read", "memset"):
        sampled = worker.request("sample", job_id=job["job_id"], count=3, flush_bytes=1 << 20, flush_with=flush_with)
        assert sampled["ok"] and len(sampled["us"]) == 3 and all(t > 0 for t in sampled["us"])
    assert_failed(
        worker.request("sample", job_id=job["job_id"], count=1, flush_bytes=64, flush_with="evict"), "bad_request"
    )
    assert sampled["timer"] == ("cuda_event" if MODE == "gpu" else "wall")
    if MODE == "interpreter":
        assert sampled["sm_clock_mhz"] is None

    assert worker.request("release")["ok"]
    assert_failed(worker.request("sample", job_id=job["job_id"], count=1), "bad_request")

    bye = worker.request("shutdown")
    assert bye == {"id": bye["id"], "ok": True}
    assert worker.at_eof(), "nothing may follow the shutdown response"
    assert worker.proc.wait(timeout=30) == 0


def test_bad_input_gets_bad_request_and_the_worker_keeps_serving(shared_worker):
    worker = shared_worker
    for junk in (b"this is not json\n", b"[1, 2]\n", b'{"op": "hello"}\n', b"\xff\xfe\n", b'{"id": 1, "op": "hello"\n'):
        worker.send_raw(junk)
        response = worker.read()
        assert_failed(response, "bad_request")
        assert response["id"] is None
    assert_failed(worker.request("frobnicate"), "bad_request")
    assert_failed(worker.request("check", job={"job_id": "x"}, tolerance=TOLERANCE), "bad_request")
    assert_failed(worker.request("check", job=gemm_job(), seed=0), "bad_request")  # no tolerance
    assert_failed(worker.request("sample", job_id="never-checked", count=1), "bad_request")
    assert_failed(worker.request("warmup", job_id="never-checked"), "bad_request")
    assert_failed(
        worker.request("check", job=gemm_job(method="no_such_method"), seed=0, tolerance=TOLERANCE), "bad_request"
    )
    # Blank lines are not requests and get no response; the next one does.
    worker.send_raw(b"\n")
    assert worker.request("hello")["ok"]


@pytest.mark.parametrize("spin_s", [0.0, 0.005])
def test_requests_come_whole_however_the_pipe_splits_them(spin_s):
    import os
    import threading
    import time

    from tunelab.worker import _Requests

    read_fd, write_fd = os.pipe()
    try:
        requests = _Requests(read_fd, spin_s)
        os.write(write_fd, b'{"id":1}\n\n{"id"')
        assert requests.readline() == b'{"id":1}\n'
        # In the pipe before the reader looked (not yet in its buffer): ready, spin or none.
        assert requests.met == "ready"
        assert requests.readline() == b"\n"
        assert requests.met == "ready"

        # The rest of a line comes while the reader spins, then sleeps.
        def rest():
            time.sleep(0.02)
            os.write(write_fd, b':2}\n{"id":3}')
            os.close(write_fd)

        writer = threading.Thread(target=rest)
        writer.start()
        assert requests.readline() == b'{"id":2}\n'
        writer.join()
        # Waited for: spinning (unless the host is crowded) or asleep.
        assert requests.met in (("spinning", "asleep") if spin_s else ("asleep",))
        # End of file: the last line without its newline, then nothing.
        assert requests.readline() == b'{"id":3}'
        assert requests.readline() == b""
    finally:
        os.close(read_fd)


def test_worker_us_covers_the_encoding_and_ends_the_line(shared_worker):
    worker = shared_worker
    sent = time.monotonic_ns()
    worker.send_raw(b'{"id": 5, "op": "release"}\n')
    line = worker._lines.get(timeout=60)
    answered = time.monotonic_ns()
    assert line.startswith(b'{"id":5,"ok":true') and line.endswith(b"}\n")
    response = json.loads(line)
    assert list(response)[-3:] == ["at_ns", "met", "worker_us"] and response["worker_us"] >= 0
    # When the worker read the request, on the clock every process on the host shares.
    assert sent <= response["at_ns"] <= answered


def test_a_worker_that_never_spins_serves_the_same(spawn_worker):
    worker = spawn_worker(env_overrides={"TUNELAB_SPIN_US": "0"})
    assert worker.request("hello")["ok"]
    worker.send_raw(b"\n")
    assert worker.request("release")["ok"]
    assert worker.request("shutdown")["ok"]
    assert worker.at_eof()


def test_problem_errors(shared_worker):
    worker = shared_worker
    assert_failed(worker.request("describe", problem="no_such_module:Nope", shape={}), "problem_error")
    assert_failed(worker.request("describe", problem="gemm", shape={"M": 1}), "problem_error")
    bad_shape = {**axpy_job("bad", "torch"), "shape": {"alpha": 1.0}}
    assert_failed(worker.request("check", job=bad_shape, seed=0, tolerance=TOLERANCE), "problem_error")


def test_a_reference_with_nan_or_inf_is_named_not_reported_as_a_mismatch(shared_worker):
    # alpha * x overflows float32 for most x: the reference holds infinities.
    job = {**axpy_job("axpy-inf", "torch"), "shape": {"N": 100, "alpha": 1e39, "dtype": "fp32"}}
    response = shared_worker.request("check", job=job, seed=0, tolerance=TOLERANCE)
    assert_failed(response, "problem_error")
    assert "the reference output holds" in response["message"], response
    assert "infinite values (of 100)" in response["message"], response
    # The worker goes on with a shape whose reference is sound.
    fine = shared_worker.request("check", job=axpy_job("axpy-fine", "torch"), seed=0, tolerance=TOLERANCE)
    assert fine["ok"] and fine["passed"], fine


def test_reference_fault_names_nan_and_inf():
    from tunelab.compare import reference_fault

    assert reference_fault(torch.ones(4)) is None
    assert reference_fault(torch.ones(4, dtype=torch.int32)) is None
    message = reference_fault(torch.tensor([1.0, float("nan"), float("inf"), float("-inf")]))
    assert message is not None and "1 NaN and 2 infinite values (of 4)" in message


def test_user_problem_end_to_end(shared_worker):
    worker = shared_worker
    described = worker.request("describe", problem="my_problems:Axpy", shape={"N": 100})
    assert described["ok"] and described["flops"] == 200.0 and described["bytes"] == 1200.0
    assert "triton" in described["methods"]

    job = axpy_job("axpy-triton", "triton")
    checked = worker.request("check", job=job, seed=3, tolerance=TOLERANCE)
    assert checked["ok"] and checked["passed"], checked
    assert checked["elements"] == 100
    warm = worker.request("warmup", job_id=job["job_id"], min_launches=3, min_ms=0.0)
    assert warm["ok"] and warm["launches"] >= 3
    sampled = worker.request("sample", job_id=job["job_id"], count=4, flush_bytes=0)
    assert sampled["ok"] and len(sampled["us"]) == 4


def test_wrong_output_fails_the_check_and_is_not_prepared(shared_worker):
    worker = shared_worker
    job = axpy_job("axpy-wrong", "off_by_one")
    checked = worker.request("check", job=job, seed=0, tolerance=TOLERANCE)
    assert checked["ok"] and not checked["passed"], checked
    assert checked["mismatch_frac"] == pytest.approx(1 / 100)
    assert checked["nan_count"] == 0 and checked["max_abs_err"] == pytest.approx(1.0)
    # Failures are never timed.
    assert_failed(worker.request("sample", job_id=job["job_id"], count=1), "bad_request")


THEN = {"warmup": {"min_launches": 2, "min_ms": 0.0}, "sample": {"count": 3, "flush_bytes": 0, "timing": "cold"}}


def test_a_passing_check_goes_on_to_the_warmup_and_first_batch_in_the_same_call(shared_worker):
    worker = shared_worker
    job = gemm_job()
    checked = worker.request("check", job=job, seed=0, tolerance=TOLERANCE, then=THEN)
    assert checked["ok"] and checked["passed"], checked
    then = checked["then"]
    assert then["ok"], then
    assert then["warmup"]["launches"] >= 2
    assert len(then["sample"]["us"]) == 3 and all(t > 0 for t in then["sample"]["us"])
    assert then["sample"]["timer"] == ("cuda_event" if MODE == "gpu" else "wall")
    assert then["wall_ms"] > 0
    # The job stays prepared for more batches.
    assert len(worker.request("sample", job_id=job["job_id"], count=2)["us"]) == 2


def test_a_failing_check_does_not_go_on(shared_worker):
    checked = shared_worker.request(
        "check", job=axpy_job("axpy-wrong-then", "off_by_one"), seed=0, tolerance=TOLERANCE, then=THEN
    )
    assert checked["ok"] and not checked["passed"] and "then" not in checked, checked


VERDICT = ("passed", "max_abs_err", "max_rel_err", "mismatch_frac", "nan_count", "inf_count", "elements")


def test_a_recheck_that_may_reuse_answers_the_kept_verdict(shared_worker):
    # A finalist's re-timing: checked, another job checked after it, then
    # checked again with `reuse`: the verdict it gave, marked reused, and
    # the batch it asks for; both jobs stay prepared.
    worker = shared_worker
    a, b = axpy_job("kept-a", "triton"), axpy_job("kept-b", "triton")
    first = worker.request("check", job=a, seed=0, tolerance=TOLERANCE)
    assert first["ok"] and first["passed"] and "reused" not in first, first
    assert worker.request("check", job=b, seed=0, tolerance=TOLERANCE)["passed"]
    again = worker.request("check", job=a, seed=0, tolerance=TOLERANCE, reuse=True, then=THEN)
    assert again["ok"] and again["reused"] is True, again
    assert {k: again[k] for k in VERDICT} == {k: first[k] for k in VERDICT}
    assert again["then"]["ok"] and len(again["then"]["sample"]["us"]) == 3, again
    for job in (a, b):
        assert len(worker.request("sample", job_id=job["job_id"], count=1)["us"]) == 1


def test_a_recheck_of_a_job_not_kept_checks_it_anew(shared_worker):
    # Only a passing job is kept, so `reuse` never turns a failure into a pass.
    worker = shared_worker
    wrong = axpy_job("never-kept", "off_by_one")
    for _ in range(2):
        checked = worker.request("check", job=wrong, seed=0, tolerance=TOLERANCE, reuse=True, then=THEN)
        assert checked["ok"] and not checked["passed"], checked
        assert "reused" not in checked and "then" not in checked


def test_a_verdict_is_reused_only_for_the_same_seed_and_tolerance(shared_worker):
    worker = shared_worker
    job = axpy_job("kept-asked", "triton")
    assert worker.request("check", job=job, seed=0, tolerance=TOLERANCE)["passed"]
    looser = {**TOLERANCE, "max_mismatch": 0.5}
    for seed, tolerance in ((1, TOLERANCE), (0, looser)):
        again = worker.request("check", job=job, seed=seed, tolerance=tolerance, reuse=True)
        assert again["ok"] and again["passed"] and "reused" not in again, again
    assert worker.request("check", job=job, seed=0, tolerance=looser, reuse=True)["reused"] is True


def test_kept_jobs_are_bounded_and_dropped_at_a_shape_change(shared_worker):
    from tunelab.worker import KEEP_PREPARED

    worker = shared_worker
    jobs = [axpy_job(f"bounded-{i}", "triton") for i in range(KEEP_PREPARED + 1)]
    for job in jobs:
        assert worker.request("check", job=job, seed=0, tolerance=TOLERANCE)["passed"]
    # The least recently checked is dropped; a reused check counts as checked.
    assert_failed(worker.request("sample", job_id=jobs[0]["job_id"], count=1), "bad_request")
    assert worker.request("check", job=jobs[1], seed=0, tolerance=TOLERANCE, reuse=True)["reused"] is True
    assert worker.request("check", job=jobs[0], seed=0, tolerance=TOLERANCE)["passed"]
    assert_failed(worker.request("sample", job_id=jobs[2]["job_id"], count=1), "bad_request")
    assert worker.request("sample", job_id=jobs[1]["job_id"], count=1)["ok"]
    # Another shape's check drops them all: they hold the old shape's inputs.
    other = axpy_job("other-shape", "triton", n=200)
    assert worker.request("check", job=other, seed=0, tolerance=TOLERANCE)["passed"]
    for job in jobs[:2]:
        assert_failed(worker.request("sample", job_id=job["job_id"], count=1), "bad_request")
        again = worker.request("check", job=job, seed=0, tolerance=TOLERANCE, reuse=True)
        assert again["passed"] and "reused" not in again, again


def test_a_then_that_fails_keeps_the_checks_verdict(shared_worker):
    bad_sample = {**THEN, "sample": {"count": 0}}
    checked = shared_worker.request("check", job=gemm_job(), seed=0, tolerance=TOLERANCE, then=bad_sample)
    assert checked["ok"] and checked["passed"], checked
    assert checked["then"]["ok"] is False and checked["then"]["class"] == "bad_request"
    assert "count" in checked["then"]["message"]
    assert_failed(
        shared_worker.request("check", job=gemm_job(), seed=0, tolerance=TOLERANCE, then={"warmup": 1}), "bad_request"
    )


def test_nan_output_is_counted(shared_worker):
    checked = shared_worker.request(
        "check", job=axpy_job("axpy-nan", "nan"), seed=0, tolerance={**TOLERANCE, "max_mismatch": 1.0}
    )
    assert checked["ok"] and not checked["passed"], checked
    assert checked["nan_count"] == 1 and checked["inf_count"] == 0


def test_a_faulting_launch_is_a_launch_error(shared_worker):
    response = shared_worker.request("check", job=axpy_job("axpy-fault", "faults"), seed=0, tolerance=TOLERANCE)
    assert_failed(response, "launch_error")
    assert "illegal memory access" in response["message"]
    assert "Traceback" not in response["message"]


def test_a_lane_counts_the_bytes_of_the_inputs_it_built(shared_worker):
    """describe with a seed builds the shape's inputs; the MoE's bytes are then
    those of the experts its routing selects, and check reports the same."""
    from tunelab.problems.moe import FusedMoE

    shape = {"M": 3, "E": 64, "topk": 2, "K": 32, "N": 16, "dtype": "fp32"}
    plain = shared_worker.request("describe", problem="moe", shape=shape)
    seeded = shared_worker.request("describe", problem="moe", shape=shape, seed=4)
    problem = FusedMoE(shape)
    assert plain["bytes"] == problem.bytes()
    inputs = problem.inputs(4, "cuda" if MODE == "gpu" else "cpu")
    assert seeded["bytes"] == problem.bytes_for(inputs) != plain["bytes"]
    job = {
        "job_id": "moe-bytes",
        "problem": "moe",
        "shape": shape,
        "method": {"name": "torch", "kernel": "torch"},
        "config": {},
    }
    checked = shared_worker.request("check", job=job, seed=4, tolerance=TOLERANCE)
    assert checked["ok"] and checked["passed"] and checked["bytes"] == seeded["bytes"], checked


def test_a_kernel_the_compiler_rejects_is_a_compile_error(shared_worker):
    # Not a power of two: Triton rejects tl.arange(0, 24), compiled or interpreted.
    job = gemm_job("gemm-bad-block", BLOCK_SIZE_M=24)
    assert_failed(shared_worker.request("check", job=job, seed=0, tolerance=TOLERANCE), "compile_error")
    # The worker is still usable afterwards.
    assert shared_worker.request("check", job=gemm_job("gemm-ok"), seed=0, tolerance=TOLERANCE)["passed"]


def test_torch_method_through_the_worker(shared_worker):
    job = gemm_job("gemm-torch", dtype="fp32", method="torch_matmul")
    checked = shared_worker.request("check", job=job, seed=1, tolerance=TOLERANCE)
    assert checked["ok"] and checked["passed"], checked
    assert shared_worker.request("sample", job_id=job["job_id"], count=2, flush_bytes=0)["ok"]


def test_stray_prints_do_not_corrupt_the_protocol(spawn_worker):
    worker = spawn_worker()
    job = axpy_job("noisy", "torch", problem="my_problems:NoisyAxpy")
    # `read` fails the test on any stdout line that is not a response, so the
    # whole exchange passing shows the prints went elsewhere.
    checked = worker.request("check", job=job, seed=0, tolerance=TOLERANCE)
    assert checked["ok"] and checked["passed"], checked
    assert worker.request("sample", job_id="noisy", count=2, flush_bytes=0)["ok"]
    assert worker.request("shutdown")["ok"]
    assert worker.at_eof()
    stderr = worker.stderr_text()
    assert "NoisyAxpy: making inputs" in stderr and "raw write to fd 1" in stderr
    assert "NoisyTorchAxpy: launching" in stderr


def test_compile_role_serves_compile_only(spawn_worker):
    worker = spawn_worker("--role", "compile")
    assert worker.request("hello")["ok"]
    compiled = worker.request("compile", job=gemm_job())
    assert compiled["ok"] and compiled["compiled"] is (MODE == "gpu")
    assert_failed(worker.request("check", job=gemm_job(), seed=0, tolerance=TOLERANCE), "bad_request")
    assert worker.request("shutdown")["ok"]
    assert worker.proc.wait(timeout=30) == 0


def _cubins(cache_dir):
    return sorted(path.name for path in cache_dir.rglob("*.cubin"))


def test_compile_role_with_a_target_compiles_for_a_gpu_it_cannot_see(spawn_worker, tmp_path):
    """What the runner's compile pool relies on: sm_90 binaries with no GPU visible.

    Triton's own compiler and ptxas run on the CPU; the worker must never ask a
    driver for anything. Runs the same way with or without a GPU in the machine.
    """
    cache = tmp_path / "triton-cache"
    # It must not import torch either (seconds of start-up): a torch that
    # refuses to import comes first on its path.
    no_torch = tmp_path / "no-torch"
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch" / "__init__.py").write_text("raise ImportError('a compile worker imported torch')\n")
    worker = spawn_worker(
        "--role",
        "compile",
        "--target",
        "cuda:90:32",
        extra_path=(no_torch,),
        env_overrides={"TRITON_INTERPRET": None, "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(cache)},
    )
    hello = worker.request("hello")
    assert hello["ok"] and hello["device"] == "compile-only for cuda:90:32" and hello["mode"] == "gpu"
    assert hello["torch"] is None and hello["triton"]

    compiled = worker.request("compile", job=gemm_job(dtype="bf16"))
    assert compiled["ok"] and compiled["compiled"] is True, compiled
    assert _cubins(cache) == ["matmul_kernel.cubin"]
    ptx = next(cache.rglob("matmul_kernel.ptx")).read_text()
    assert ".target sm_90a" in ptx

    moe = {
        "job_id": "moe-1",
        "problem": "moe",
        "shape": {"M": 4, "E": 8, "topk": 2, "K": 128, "N": 64, "dtype": "bf16", "activation": "silu"},
        "method": {"name": "triton", "kernel": "fused_moe"},
        "config": {
            "BLOCK_SIZE_M": 16,
            "BLOCK_SIZE_N": 32,
            "BLOCK_SIZE_K": 64,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 2,
        },
    }
    compiled = worker.request("compile", job=moe)
    assert compiled["ok"] and compiled["compiled"] is True, compiled
    # 8 slots: the GEMMs align their own blocks, no alignment kernel.
    assert {"moe_gemm1_kernel.cubin", "moe_gemm2_kernel.cubin", "moe_sum_kernel.cubin"} <= set(_cubins(cache))
    assert "moe_align_kernel.cubin" not in _cubins(cache)
    # sm_90 gets dependent launches: GEMM 2 waits for GEMM 1 in-kernel.
    assert "griddepcontrol.wait" in next(cache.rglob("moe_gemm2_kernel.ptx")).read_text()
    compiled = worker.request("compile", job=dict(moe, job_id="moe-2", shape=dict(moe["shape"], M=40)))
    assert compiled["ok"] and compiled["compiled"] is True, compiled
    assert "moe_align_kernel.cubin" in _cubins(cache)
    # After the alignment kernel, GEMM 1 lets GEMM 2 be placed only once it has
    # waited for the alignment: GEMM 2 reads the alignment before its own wait.
    gemm1 = [f.read_text() for f in cache.rglob("moe_gemm1_kernel.ptx") if "griddepcontrol.wait" in f.read_text()]
    assert len(gemm1) == 1
    assert gemm1[0].index("griddepcontrol.wait") < gemm1[0].index("griddepcontrol.launch_dependents")
    if ctypes.util.find_library("cuda"):
        # With libcuda to link against, the launchers are built ahead too.
        assert list(cache.rglob("__triton_launcher*.so")), worker.stderr_text()

    # A lane's work is refused, and a bad target is a start-up error, not a hang.
    assert_failed(worker.request("check", job=gemm_job(), seed=0, tolerance=TOLERANCE), "bad_request")
    assert worker.request("shutdown")["ok"]
    assert worker.proc.wait(timeout=30) == 0


def test_quantised_kernels_compile_for_sm90_without_a_gpu(spawn_worker, tmp_path):
    """fp8 and MXFP4 MoE kernels and the a8w8 GEMM compile for Hopper in a
    compile worker (what the interpreter cannot check: fp8 dots, tl.dot_scaled's
    lowering, dependent launches)."""
    cache = tmp_path / "triton-cache"
    worker = spawn_worker(
        "--role",
        "compile",
        "--target",
        "cuda:90:32",
        env_overrides={"TRITON_INTERPRET": None, "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(cache)},
    )
    cfg = {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
    base = {"M": 4, "E": 8, "topk": 2, "K": 256, "N": 96, "act_dtype": "bf16"}
    jobs = [
        ("fused_moe", dict(base, dtype="fp8"), cfg),
        ("fused_moe_vllm", dict(base, dtype="fp8", weight_quant="block", block_shape=[128, 128]), cfg),
        ("fused_moe", dict(base, dtype="mxfp4", activation="swiglu_oai"), dict(cfg, DOT_SCALED=0)),
        ("fused_moe", dict(base, dtype="mxfp4", activation="swiglu_oai"), dict(cfg, DOT_SCALED=1)),
    ]
    for i, (kernel, shape, config) in enumerate(jobs):
        job = {
            "job_id": f"q{i}",
            "problem": "moe",
            "shape": shape,
            "method": {"name": kernel, "kernel": kernel},
            "config": config,
        }
        compiled = worker.request("compile", job=job)
        assert compiled["ok"] and compiled["compiled"] is True, compiled
    gemm = {
        "job_id": "a8w8",
        "problem": "gemm",
        "shape": {"M": 16, "N": 256, "K": 512, "dtype": "fp8"},
        "method": {"name": "a8w8", "kernel": "matmul_a8w8_blockscale"},
        "config": dict(cfg, NUM_KSPLIT=2),
    }
    compiled = worker.request("compile", job=gemm)
    assert compiled["ok"] and compiled["compiled"] is True, compiled
    assert {
        "moe_quant_act_kernel.cubin",
        "moe_gemm1_q_kernel.cubin",
        "moe_gemm2_q_kernel.cubin",
        "moe_act_kernel.cubin",
        "matmul_a8w8_blockscale_kernel.cubin",
        "reduce_splits_kernel.cubin",
    } <= set(_cubins(cache))
    ptx = [f.read_text() for f in cache.rglob("moe_gemm1_q_kernel.ptx")]
    # tunelab's fp8 call: GEMM 1 waits for the quantised x (a dependent launch on sm_90);
    # fp8 operands reach the tensor cores (wgmma or mma.sync after an fp8 -> 16-bit conversion).
    assert any("griddepcontrol.wait" in text and "e4m3" in text for text in ptx)
    assert any("mma" in text and "e4m3" not in text for text in ptx)  # the MXFP4 GEMMs
    assert worker.request("shutdown")["ok"]


def test_a_malformed_target_stops_the_worker_with_a_message(spawn_worker):
    worker = spawn_worker("--role", "compile", "--target", "cuda:sm90:32", env_overrides={"TRITON_INTERPRET": None})
    assert worker.at_eof()
    assert worker.proc.wait(timeout=30) != 0
    assert "compute capability as digits" in worker.stderr_text()


def test_a_lane_with_a_target_sees_no_gpu(spawn_worker):
    worker = spawn_worker("--target", "cuda:90:32", "--mode", "gpu", env_overrides={"TRITON_INTERPRET": None})
    assert worker.at_eof()
    assert worker.proc.wait(timeout=30) == 2
    assert "--target makes a lane without torch" in worker.stderr_text()


def test_a_lane_without_torch_describes_the_data_and_binds_recipes_to_it(spawn_worker, tmp_path):
    """`inputs: native`: the lane's worker imports no torch and sees no GPU.
    It answers the shape's data as the native worker builds it, and Triton
    recipes whose pointers name those tensors by index."""
    cache = tmp_path / "triton-cache"
    no_torch = tmp_path / "no-torch"
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch" / "__init__.py").write_text("raise ImportError('the lane imported torch')\n")
    worker = spawn_worker(
        "--role",
        "lane",
        "--target",
        "cuda:90:32",
        extra_path=(no_torch,),
        env_overrides={"TRITON_INTERPRET": None, "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(cache)},
    )
    hello = worker.request("hello")
    assert hello["ok"] and hello["torch"] is None, hello
    assert hello["device"] == "inputs built natively; compiles for cuda:90:32"
    shape = {"M": 96, "N": 80, "K": 64, "dtype": "bf16"}
    data = worker.request("native_data", problem="gemm", shape=shape, seed=7)
    assert data["ok"], data
    assert [(t["name"], t["dtype"], t["shape"], t["bytes"]) for t in data["tensors"]] == [
        ("a", "bfloat16", [96, 64], 96 * 64 * 2),
        ("b", "bfloat16", [64, 80], 64 * 80 * 2),
        ("out", "bfloat16", [96, 80], 96 * 80 * 2),
        ("reference", "float32", [96, 80], 96 * 80 * 4),
    ]
    std = 64**-0.25
    assert [t["fill"] for t in data["tensors"]] == [
        {"normal": {"std": std, "stream": 0}},
        {"normal": {"std": std, "stream": 1}},
        None,
        None,
    ]
    assert (data["out"], data["reference"], data["poison"], data["elements"], data["seed"]) == (2, 3, "c07f", 7680, 7)
    assert data["reference_op"] == {"op": "matmul", "a": 0, "b": 1, "out": 3, "m": 96, "n": 80, "k": 64}

    described = worker.request("describe", problem="gemm", shape=shape, seed=7)
    assert described["ok"] and "inputs_s" not in described, described  # nothing built here

    job = dict(gemm_job(dtype="bf16"), shape=shape)
    answer = worker.request("recipes", jobs=[job], seed=7, cache_dir=str(tmp_path / "native"))
    assert answer["ok"], answer
    recipe = answer["recipes"][0]
    assert recipe["ok"], recipe
    assert recipe["symbol"] == "matmul_kernel" and recipe["block"] == [128, 1, 1]
    assert recipe["grid"] == [3 * 3, 1, 1]  # 32 x 32 tiles over 96 x 80
    assert pathlib.Path(recipe["image"]).read_bytes()[:4] == b"\x7fELF"
    values = {a["name"]: a for a in recipe["args"]}
    assert [values[p].get("tensor") for p in ("a_ptr", "b_ptr", "c_ptr")] == [0, 1, 2]
    assert [values[p].get("i32") for p in ("M", "N", "K")] == [96, 80, 64]
    assert recipe["kernels"] == []  # the native worker reports the kernel it loads
    # Another shape's recipe before its data is described is refused.
    other = dict(job, shape=dict(shape, M=128))
    refused = worker.request("recipes", jobs=[other], seed=7, cache_dir=str(tmp_path / "native"))
    assert refused["ok"] and refused["recipes"][0]["class"] == "bad_request"

    fp8 = worker.request("native_data", problem="gemm", shape={"M": 16, "N": 256, "K": 512, "dtype": "fp8"})
    assert_failed(fp8, "problem_error")
    assert "inputs: python" in fp8["message"]
    moe = worker.request(
        "native_data", problem="moe", shape={"M": 4, "E": 8, "topk": 2, "K": 128, "N": 64, "dtype": "bf16"}
    )
    assert_failed(moe, "problem_error")
    assert "no native_data()" in moe["message"]
    assert worker.request("shutdown")["ok"]
    assert worker.proc.wait(timeout=30) == 0


def test_a_compile_worker_makes_the_recipe_the_lane_would(spawn_worker, tmp_path):
    """`inputs: native`: a compile worker asked for the job's recipe with its
    compile answers the very recipe the torch-free lane gives (same tensor
    indices, same cubin), so the lane need not ask its own worker. A recipe
    it cannot make is that answer's failure, not the compile's."""
    cache = tmp_path / "triton-cache"
    env = {"TRITON_INTERPRET": None, "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(cache)}
    compiler = spawn_worker("--role", "compile", "--target", "cuda:90:32", env_overrides=env)
    lane = spawn_worker("--role", "lane", "--target", "cuda:90:32", env_overrides=env)
    shape = {"M": 96, "N": 80, "K": 64, "dtype": "bf16"}
    job = dict(gemm_job(dtype="bf16", BLOCK_SIZE_M=64), shape=shape)
    ask = {"seed": 7, "cache_dir": str(tmp_path / "pool")}
    compiled = compiler.request("compile", job=job, recipe=ask)
    assert compiled["ok"] and compiled["compiled"], compiled
    made = compiled["recipe"]
    assert made["ok"], made

    assert lane.request("native_data", problem="gemm", shape=shape, seed=7)["ok"]
    theirs = lane.request("recipes", jobs=[job], seed=7, cache_dir=str(tmp_path / "lane"))["recipes"][0]
    assert theirs["ok"], theirs
    mine = {k: v for k, v in made.items() if k != "image"}
    assert mine == {k: v for k, v in theirs.items() if k != "image"}
    assert mine["grid"] == [2 * 3, 1, 1]  # 64 x 32 tiles over 96 x 80
    assert pathlib.Path(made["image"]).parent == tmp_path / "pool"
    assert pathlib.Path(made["image"]).read_bytes() == pathlib.Path(theirs["image"]).read_bytes()

    # Another seed, another shape: described again from the job alone.
    other = dict(job, shape=dict(shape, M=192))
    again = compiler.request("compile", job=other, recipe=dict(ask, seed=8))["recipe"]
    assert again["ok"] and again["grid"] == [3 * 3, 1, 1], again

    # A problem without a native description: the compile answers, its recipe is refused.
    fp8 = dict(gemm_job(dtype="fp8"), shape={"M": 16, "N": 256, "K": 512, "dtype": "fp8"})
    answer = compiler.request("compile", job=fp8, recipe=ask)
    assert answer["ok"], answer
    assert (answer["recipe"]["ok"], answer["recipe"]["class"]) == (False, "problem_error")
    assert "inputs: python" in answer["recipe"]["message"]
    assert_failed(compiler.request("compile", job=job, recipe={"seed": 7}), "bad_request")
    # A recipe that fails unexpectedly (its cubin cannot be written) leaves the compile's answer whole.
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    answer = compiler.request("compile", job=job, recipe={"seed": 7, "cache_dir": str(blocked / "native")})
    assert answer["ok"] and answer["compiled"] and answer["seconds"] >= 0, answer
    assert (answer["recipe"]["ok"], answer["recipe"]["class"]) == (False, "problem_error")
    assert "internal worker error" in answer["recipe"]["message"]
    assert compiler.request("shutdown")["ok"] and lane.request("shutdown")["ok"]


# ---------------------------------------------------------------- timing modes (protocol 2)


def test_timing_modes(shared_worker):
    worker = shared_worker
    job = axpy_job("axpy-timing", "triton")
    assert worker.request("check", job=job, seed=0, tolerance=TOLERANCE)["passed"]
    for timing in ("cold", "hot"):
        sampled = worker.request("sample", job_id=job["job_id"], count=3, flush_bytes=1 << 20, timing=timing)
        assert sampled["ok"] and len(sampled["us"]) == 3 and all(t > 0 for t in sampled["us"]), sampled
        assert sampled["timer"] == ("cuda_event" if MODE == "gpu" else "wall")
    for calls in (1, 4):
        sampled = worker.request("sample", job_id=job["job_id"], count=2, timing="graph", graph_calls=calls)
        assert sampled["ok"] and len(sampled["us"]) == 2 and all(t > 0 for t in sampled["us"]), sampled
        assert sampled["timer"] == ("cuda_graph" if MODE == "gpu" else "wall")
    # graph_calls defaults to 10; a second request replays the cached graph.
    assert worker.request("sample", job_id=job["job_id"], count=2, timing="graph")["ok"]
    assert worker.request("sample", job_id=job["job_id"], count=2, timing="graph")["ok"]
    for bad in (
        {"timing": "warm"},
        {"timing": 3},
        {"timing": "graph", "graph_calls": 0},
        {"timing": "graph", "graph_calls": 2.5},
        {"timing": "graph", "graph_calls": True},
    ):
        assert_failed(worker.request("sample", job_id=job["job_id"], count=1, **bad), "bad_request")


def test_graph_timing_emulation_divides_by_the_calls(shared_worker):
    """Interpreter (or GPU) graph timing reports per-launch time: a 20-launch
    sample is not 20 times one launch."""
    job = axpy_job("axpy-graph", "torch")
    assert shared_worker.request("check", job=job, seed=0, tolerance=TOLERANCE)["passed"]
    one = shared_worker.request("sample", job_id=job["job_id"], count=5, timing="graph", graph_calls=1)["us"]
    many = shared_worker.request("sample", job_id=job["job_id"], count=5, timing="graph", graph_calls=20)["us"]
    assert min(many) < 5 * max(one), (one, many)


@pytest.mark.skipif(MODE != "gpu", reason="CUDA graphs need a GPU")
def test_a_launch_that_syncs_cannot_be_graph_timed(spawn_worker):
    worker = spawn_worker()
    job = axpy_job("axpy-syncs", "syncs")
    assert worker.request("check", job=job, seed=0, tolerance=TOLERANCE)["passed"]
    assert worker.request("sample", job_id=job["job_id"], count=2, timing="hot")["ok"]
    response = worker.request("sample", job_id=job["job_id"], count=2, timing="graph")
    assert_failed(response, "launch_error")
    assert "cannot be captured in a CUDA graph" in response["message"]
    # The worker answers on (the runner replaces it after a launch_error anyway).
    assert worker.request("hello")["ok"]


@pytest.mark.skipif(MODE != "gpu", reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("method", ["fused_moe", "fused_moe_vllm", "fused_moe_persistent", "torch"])
def test_moe_methods_under_graph_timing(shared_worker, method):
    shape = {"M": 4, "E": 32, "topk": 4, "K": 256, "N": 128, "dtype": "bf16"}
    job = {
        "job_id": f"moe-graph-{method}",
        "problem": "moe",
        "shape": shape,
        "method": {"name": method, "kernel": method},
        "config": {},
    }
    checked = shared_worker.request("check", job=job, seed=0, tolerance={"atol": 2e-2, "rtol": 2e-2})
    assert checked["ok"] and checked["passed"], checked
    sampled = shared_worker.request("sample", job_id=job["job_id"], count=4, timing="graph", graph_calls=5)
    assert sampled["ok"] and sampled["timer"] == "cuda_graph" and all(t > 0 for t in sampled["us"]), sampled


# ---------------------------------------------------------------- methods that cannot run here


def test_describe_names_the_methods_that_cannot_run(shared_worker):
    described = shared_worker.request("describe", problem="my_problems:Axpy", shape={"N": 100})
    assert described["ok"], described
    assert described["unavailable"]["needs_frobnicator"] == "needs the frobnicator library"
    assert "KeyError" in described["unavailable"]["broken_hook"]
    assert "triton" not in described["unavailable"] and "needs_frobnicator" in described["methods"]
    job = axpy_job("axpy-frob", "needs_frobnicator")
    response = shared_worker.request("check", job=job, seed=0, tolerance=TOLERANCE)
    assert_failed(response, "problem_error")
    assert "cannot run here: needs the frobnicator library" in response["message"]


def test_moe_library_methods_are_reported_unavailable(shared_worker):
    import importlib.util

    shape = {"M": 2, "E": 8, "topk": 2, "K": 64, "N": 32, "dtype": "fp16"}
    described = shared_worker.request("describe", problem="moe", shape=shape)
    assert described["ok"]
    assert {"fused_moe", "fused_moe_vllm", "fused_moe_persistent", "torch", "vllm", "aiter", "triton_kernels"} == set(
        described["methods"]
    )
    assert not {"fused_moe", "fused_moe_vllm", "fused_moe_persistent", "torch"} & set(described["unavailable"])
    if importlib.util.find_spec("vllm") is None:
        assert "not installed" in described["unavailable"]["vllm"]
    assert "MXFP4 weights with gpt-oss's swiglu_oai" in described["unavailable"]["triton_kernels"]
    # A library method's own description (which library it found) is what the run header records.
    probed = shared_worker.request("probe", problem="moe", shape=shape, methods=["triton_kernels", "fused_moe"])
    assert probed["ok"]
    description = probed["methods"]["triton_kernels"]["description"]
    assert description.startswith("OpenAI's triton_kernels matmul_ogs MoE") and "(" in description
    assert probed["methods"]["fused_moe"]["description"].startswith("Our Triton fused MoE")
    job = {
        "job_id": "moe-aiter",
        "problem": "moe",
        "shape": shape,
        "method": {"name": "aiter", "kernel": "aiter"},
        "config": {},
    }
    if "aiter" in described["unavailable"]:
        response = shared_worker.request("check", job=job, seed=0, tolerance=TOLERANCE)
        assert_failed(response, "problem_error")
        assert described["unavailable"]["aiter"] in response["message"]


def test_a_compile_worker_with_a_target_leaves_unavailable_out(spawn_worker, tmp_path):
    worker = spawn_worker(
        "--role",
        "compile",
        "--target",
        "cuda:90:32",
        env_overrides={
            "TRITON_INTERPRET": None,
            "CUDA_VISIBLE_DEVICES": "",
            "TRITON_CACHE_DIR": str(tmp_path / "cache"),
        },
    )
    described = worker.request(
        "describe", problem="moe", shape={"M": 2, "E": 8, "topk": 2, "K": 64, "N": 32, "dtype": "bf16"}
    )
    assert described["ok"] and "unavailable" not in described and "vllm" in described["methods"]


def test_compile_worker_compiles_the_new_moe_methods(spawn_worker, tmp_path):
    """fused_moe_vllm and fused_moe_persistent compile for sm_90 in a compile
    worker that sees no GPU and refuses torch, like fused_moe."""
    cache = tmp_path / "triton-cache"
    no_torch = tmp_path / "no-torch"
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch" / "__init__.py").write_text("raise ImportError('a compile worker imported torch')\n")
    worker = spawn_worker(
        "--role",
        "compile",
        "--target",
        "cuda:90:32",
        extra_path=(no_torch,),
        env_overrides={"TRITON_INTERPRET": None, "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(cache)},
    )
    shape = {"M": 1, "E": 8, "topk": 4, "K": 128, "N": 64, "dtype": "bf16", "activation": "swiglu_oai"}

    def compile_job(job_id, method, **shape_changes):
        job = {
            "job_id": job_id,
            "problem": "moe",
            "shape": dict(shape, **shape_changes),
            "method": {"name": method, "kernel": method},
            "config": {},
        }
        compiled = worker.request("compile", job=job)
        assert compiled["ok"] and compiled["compiled"] is True, compiled

    # vLLM's structure: the alignment and activation kernels even for 4 slots, no dependent launch.
    compile_job("vllm-1", "fused_moe_vllm")
    assert {
        "moe_align_kernel.cubin",
        "moe_gemm1_kernel.cubin",
        "moe_act_kernel.cubin",
        "moe_gemm2_kernel.cubin",
        "moe_sum_kernel.cubin",
    } == set(_cubins(cache))
    assert not any("griddepcontrol" in f.read_text() for f in cache.rglob("*.ptx"))

    # Persistent, 4 slots: aligned in registers, waits (volatile polls), w2 prefetched into L2.
    compile_job("persistent-1", "fused_moe_persistent")
    ptx = [f.read_text() for f in cache.rglob("moe_persistent_kernel.ptx")]
    assert len(ptx) == 1 and "ld.volatile.global" in ptx[0] and "prefetch.global.L2" in ptx[0]
    # 160 slots: program 0 aligns into memory, the others wait for its flag.
    compile_job("persistent-40", "fused_moe_persistent", M=40)
    ptx = [f.read_text() for f in cache.rglob("moe_persistent_kernel.ptx")]
    assert len(ptx) == 2
    assert worker.request("shutdown")["ok"]
