"""Native launches, Python side (tunelab.native and the worker's share,
compare and recipe requests).

Without a GPU: the argument layout of a compiled Triton kernel, the poison
patterns, and that the worker refuses to share in interpreter mode. With a GPU
(and the native worker binary at $TUNELAB_BIN, default .bin/tunelab, as
bench/native_gpu_check.sh arranges): tensors shared with the native worker,
the quickstart's CUDA GEMM launched natively against torch's reference, a
Triton kernel launched natively giving the same bits as Python's launch, a
shape's data built by the native worker (`inputs: native`), and
(with $TUNELAB_AOT_DIR, an aot folder of a quickstart run) the aot output's C
dispatcher built with cc and called through ctypes.
"""

import json
import os
import pathlib
import re
import subprocess
import types

import pytest
import torch

from conftest import MODE
from tunelab import native

REPO = pathlib.Path(__file__).resolve().parents[2]
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "max_mismatch": 0.0}


class FakeTensor:
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


def test_triton_args_follow_the_compiled_signature():
    signature = {
        "a_ptr": "*bf16",
        "b_ptr": "*bf16",
        "c_ptr": "*bf16",
        "M": "i32",
        "N": "i32",
        "K": "i64",
        "stride_am": "i32",
        "stride_ak": "constexpr",  # an integer Triton specialised to 1
        "scale": "fp32",
        "flag": "i1",
        "BLOCK": "constexpr",
    }
    names = list(signature)
    values = [FakeTensor(100), FakeTensor(200), FakeTensor(300), 64, 32, 2**40, 128, 1, 0.5, True, 64]
    md = types.SimpleNamespace(global_scratch_size=0, profile_scratch_size=256)
    args = native.triton_args(signature, names, values, {100: 0, 200: 1, 300: 2}, md)
    kinds = [{k: v for k, v in a.items() if k not in ("name", "type")} for a in args]
    assert kinds == [
        {"tensor": 0},
        {"tensor": 1},
        {"tensor": 2},
        {"i32": 64},
        {"i32": 32},
        {"i64": 2**40},
        {"i32": 128},
        {"f32": 0.5},
        {"i32": 1},
        {"scratch": 0},
        {"scratch": 256},
    ]
    assert [a["name"] for a in args][-2:] == ["global_scratch", "profile_scratch"]
    # An older Triton: no scratch parameters at all.
    assert native.triton_args({"x": "i32"}, ["x"], [3], {}, types.SimpleNamespace()) == [
        {"i32": 3, "name": "x", "type": "i32"}
    ]


def test_triton_args_refuse_what_cannot_be_launched_natively():
    md = types.SimpleNamespace()
    with pytest.raises(native.NotNative, match="do not hold"):
        native.triton_args({"p": "*fp32"}, ["p"], [FakeTensor(5)], {6: 0}, md)
    with pytest.raises(native.NotNative, match="fp16"):
        native.triton_args({"x": "fp16"}, ["x"], [1.0], {}, md)
    with pytest.raises(native.NotNative, match="tuple"):
        native.triton_args({"t": ("i32", "i32")}, ["t"], [(1, 2)], {}, md)


@pytest.mark.parametrize(
    "dtype,pattern",
    [
        (torch.bfloat16, "c07f"),
        (torch.float16, "007e"),
        (torch.float32, "0000c07f"),
        (torch.int32, "00000080"),
        (torch.uint8, "00"),
    ],
)
def test_poison_patterns_are_what_the_worker_poisons_with(dtype, pattern):
    assert native.poison_pattern(torch, dtype).hex() == pattern


@pytest.mark.skipif(MODE != "interpreter", reason="interpreter mode only")
def test_sharing_needs_a_gpu(shared_worker):
    shape = {"M": 32, "N": 32, "K": 32, "dtype": "fp16"}
    reply = shared_worker.request("share", problem="gemm", shape=shape, seed=0)
    assert reply["ok"] is False and reply["class"] == "problem_error", reply
    assert "need a GPU" in reply["message"]
    reply = shared_worker.request("compare", problem="gemm", shape=shape, seed=0, tolerance=TOLERANCE)
    assert reply["ok"] is False and reply["class"] == "bad_request", reply
    # `recipes` answers each job's failure in its place, and refuses no jobs.
    job = {
        "job_id": "j",
        "problem": "gemm",
        "shape": shape,
        "method": {"name": "triton", "kind": "triton", "kernel": "matmul"},
        "config": {},
    }
    reply = shared_worker.request("recipes", jobs=[job, job], seed=0, cache_dir="/tmp")
    assert reply["ok"], reply
    assert [(r["ok"], r["class"]) for r in reply["recipes"]] == [(False, "bad_request")] * 2, reply
    assert "send 'share' first" in reply["recipes"][0]["message"]
    reply = shared_worker.request("recipes", jobs=[], seed=0, cache_dir="/tmp")
    assert reply["ok"] is False and reply["class"] == "bad_request", reply


def test_a_described_shape_is_laid_out_as_the_native_worker_builds_it():
    from tunelab import native_data as nd

    description = {
        "tensors": [nd.normal("x", "fp16", (4, 3), 0.5), nd.zeros("y", "fp32", (3, 2))],
        "output": nd.output("fp32", (4, 2)),
        "reference": nd.matmul("x", "y"),
    }
    layout = nd.layout(description, seed=9)
    assert [(t["name"], t["dtype"], t["bytes"], t["fill"]) for t in layout["tensors"]] == [
        ("x", "float16", 24, {"normal": {"std": 0.5, "stream": 0}}),
        ("y", "float32", 24, "zeros"),
        ("out", "float32", 32, None),
        ("reference", "float32", 32, None),
    ]
    assert (layout["out"], layout["reference"], layout["poison"], layout["elements"]) == (2, 3, "0000c07f", 8)
    assert layout["reference_op"] == {"op": "matmul", "a": 0, "b": 1, "out": 3, "m": 4, "n": 2, "k": 3}
    inputs, addresses = nd.stand_ins(description)
    assert inputs["x"].stride() == (3, 1) and inputs["y"].shape == (3, 2)
    assert addresses[inputs["y"].data_ptr()] == 1 and inputs["x"].data_ptr() % 16 == 0

    for bad, says in [
        (dict(description, output=nd.output("fp32", (4, 3))), "the matmul's is [4, 2]"),
        (dict(description, reference=nd.matmul("x", "z")), "the inputs are ['x', 'y']"),
        (dict(description, reference={"op": "conv"}), "computes: matmul"),
        (dict(description, tensors=[nd.normal("x", "fp8", (4, 3), 1.0)]), "builds"),
        (dict(description, tensors=[nd.normal("out", "fp16", (4, 3), 1.0)]), "not 'out'"),
    ]:
        with pytest.raises(nd.NativeDataError, match=re.escape(says)):
            nd.layout(bad, seed=0)


# ---------------------------------------------------------------- on a GPU, with the native worker


def _binary():
    return pathlib.Path(os.environ.get("TUNELAB_BIN", REPO / ".bin" / "tunelab"))


gpu_only = pytest.mark.skipif(
    MODE != "gpu" or not _binary().exists(),
    reason="needs a GPU and the tunelab binary ($TUNELAB_BIN or .bin/tunelab)",
)


class NativeWorker:
    """`tunelab native-worker` driven over pipes, as the runner drives it."""

    def __init__(self, helpers=None):
        self.proc = subprocess.Popen(
            [str(_binary()), "native-worker", "--backend", "cuda"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.next_id = 1
        self.hello = self.request("hello", **({"helpers": helpers} if helpers else {}))

    def request(self, op, **fields):
        rid = self.next_id
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"id": rid, "op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        assert reply["id"] == rid
        return reply

    def close(self):
        try:
            self.request("shutdown")
        finally:
            self.proc.wait(timeout=30)


def _import(nw, shared):
    imported = nw.request(
        "import",
        tensors=[{"handle": t["handle"], "offset": t["offset"], "bytes": t["bytes"]} for t in shared["tensors"]],
    )
    assert imported["ok"], imported


def _compile_gemm(tmp_path, config, dtype):
    """The quickstart's CUDA GEMM compiled by `tunelab native-compile`."""
    out = subprocess.run(
        [
            str(_binary()),
            "native-compile",
            str(REPO / "experiments/kernels/gemm_mma.cu"),
            "--kernel",
            "gemm_mma<{}, {}, {}, {}, {}, {}, {}>".format(*config, 1 if dtype == "fp16" else 0),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@gpu_only
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("mnk", [(256, 256, 256), (200, 136, 72), (33, 48, 40)])
def test_the_cuda_gemm_launched_natively_matches_the_reference(shared_worker, tmp_path, dtype, mnk):
    M, N, K = mnk
    shape = {"M": M, "N": N, "K": K, "dtype": dtype}
    shared = shared_worker.request("share", problem="gemm", shape=shape, seed=0)
    assert shared["ok"], shared
    nw = NativeWorker(helpers=_helpers(tmp_path))
    try:
        assert nw.hello["ok"], nw.hello
        assert nw.hello["uuid"].removeprefix("GPU-") == shared["uuid"].removeprefix("GPU-")
        _import(nw, shared)
        names = [t["name"] for t in shared["tensors"]]
        ref = shared["reference"]
        then = {
            "warmup": {"min_launches": 2, "min_ms": 0.0},
            "sample": {"count": 5, "flush_bytes": 1 << 20, "timing": "cold"},
        }

        def compare_with(tol):
            return {
                "out": shared["out"],
                "out_dtype": shared["tensors"][shared["out"]]["dtype"],
                "reference": ref,
                "reference_dtype": shared["tensors"][ref]["dtype"],
                "elements": shared["elements"],
                **tol,
            }

        for config in [(128, 128, 32, 2, 2, 3), (64, 64, 64, 2, 4, 2), (64, 128, 32, 2, 2, 4)]:
            art = _compile_gemm(tmp_path, config, dtype)
            BM, BN, BK, WM, WN, ST = config
            smem = ST * (BM * (BK + 8) + BK * (BN + 8)) * 2
            launch = dict(
                job_id=str(config),
                image=art["image"],
                symbol=art["symbol"],
                grid=[-(-N // BN), -(-M // BM)],
                block=[32 * WM * WN],
                shared=smem,
                args=[
                    {"tensor": names.index("a")},
                    {"tensor": names.index("b")},
                    {"tensor": shared["out"]},
                    {"i32": M},
                    {"i32": N},
                    {"i32": K},
                ],
                poison={"tensor": shared["out"], "pattern": shared["poison"], "elements": shared["elements"]},
            )
            checked = nw.request("check", **launch)
            assert checked["ok"], checked
            compared = shared_worker.request("compare", problem="gemm", shape=shape, seed=0, tolerance=TOLERANCE)
            assert compared["ok"] and compared["passed"], (config, compared)
            sampled = nw.request("sample", job_id=str(config), count=8, flush_bytes=1 << 20, timing="cold")
            assert sampled["ok"] and len(sampled["us"]) == 8 and min(sampled["us"]) > 0, sampled
            # A check that compares goes on to the warm-up and a first batch where it passes ...
            folded = nw.request("check", **launch, compare=compare_with(TOLERANCE), then=then)
            assert folded["ok"] and folded["compared"]["passed"], folded
            assert folded["then"]["ok"] and len(folded["then"]["sample"]["us"]) == 5, folded["then"]
            assert folded["then"]["warmup"]["launches"] >= 2 and folded["then"]["wall_ms"] > 0
            # ... and nowhere else: failing, or with the Python worker to judge.
            exact = {"atol": 0.0, "rtol": 0.0, "max_mismatch": 0.0}
            failed = nw.request("check", **launch, compare=compare_with(exact), then=then)
            assert failed["ok"] and not failed["compared"]["passed"] and failed["then"] is None, failed
            unjudged = nw.request("check", **launch, then=then)
            assert unjudged["ok"] and unjudged["then"] is None, unjudged
    finally:
        nw.close()


@gpu_only
def test_a_triton_kernel_launched_natively_gives_pythons_bits(shared_worker, tmp_path):
    """The recipe of tunelab's Triton GEMM, launched by the native worker, writes
    exactly the bits Triton's own launch writes."""
    shape = {"M": 192, "N": 160, "K": 96, "dtype": "bf16"}
    shared = shared_worker.request("share", problem="gemm", shape=shape, seed=0)
    assert shared["ok"], shared
    job = {
        "job_id": "native-triton",
        "problem": "gemm",
        "shape": shape,
        "method": {"name": "triton", "kind": "triton", "kernel": "matmul"},
        "config": {
            "BLOCK_SIZE_M": 64,
            "BLOCK_SIZE_N": 64,
            "BLOCK_SIZE_K": 32,
            "GROUP_SIZE_M": 4,
            "num_warps": 4,
            "num_stages": 3,
        },
    }
    recipe = shared_worker.request("recipe", job=job, seed=0, cache_dir=str(tmp_path))
    assert recipe["ok"], recipe
    # `recipes` answers each job as `recipe` does, and a job's failure as its own.
    other = {**job, "job_id": "native-triton-2", "config": {**job["config"], "BLOCK_SIZE_N": 128}}
    broken = {**job, "job_id": "no-method", "method": {**job["method"], "kernel": "nothing"}}
    batch = shared_worker.request("recipes", jobs=[job, broken, other], seed=0, cache_dir=str(tmp_path))
    assert batch["ok"], batch
    first, failed, second = batch["recipes"]
    strip = ("id", "ok", "met", "worker_us")
    assert {k: v for k, v in first.items() if k != "ok"} == {k: v for k, v in recipe.items() if k not in strip}
    assert failed["ok"] is False and failed["class"] == "bad_request", failed
    assert second["ok"] and second["grid"] != first["grid"], second
    nw = NativeWorker()
    try:
        _import(nw, shared)
        checked = nw.request(
            "check",
            job_id="native-triton",
            image=recipe["image"],
            symbol=recipe["symbol"],
            grid=recipe["grid"],
            block=recipe["block"],
            shared=recipe["shared"],
            args=[{k: v for k, v in a.items() if k not in ("name", "type")} for a in recipe["args"]],
            poison={"tensor": shared["out"], "pattern": shared["poison"], "elements": shared["elements"]},
        )
        assert checked["ok"], checked
        compared = shared_worker.request("compare", problem="gemm", shape=shape, seed=0, tolerance=TOLERANCE)
        assert compared["ok"] and compared["passed"], compared
        # The same launch from Python, in this process, on the same inputs.
        from tunelab.problems.gemm import Gemm

        problem = Gemm(shape)
        inputs = problem.inputs(0, torch.device("cuda"))
        launch = problem.methods()["matmul"].bind(problem, inputs, job["config"])
        launch()
        torch.cuda.synchronize()
        # The worker's shared output holds the native result: ask for its bytes.
        digest = shared_worker.request("digest", problem="gemm", shape=shape, seed=0)
        assert digest["ok"], digest
        import hashlib

        want = hashlib.sha256(launch.out.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
        assert digest["sha256"] == want
    finally:
        nw.close()


def _helpers(tmp_path):
    """tunelab's helper kernels, compiled as a run compiles them."""
    out = subprocess.run(
        [str(_binary()), "native-compile", "--helpers", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)["image"]


def _compare_cases(dtype, ref_dtype, atol, rtol):
    """(out, ref) on the GPU: random values near and across the tolerance's
    edge, elements exactly at it, and the special values compare() treats
    apart: NaN and infinities in either, zeros (a huge relative error),
    negative zero, subnormals."""
    g = torch.Generator(device="cuda").manual_seed(7)
    n = 100_003
    ref = torch.randn(n, device="cuda", generator=g) * 4
    allowed = atol + rtol * ref.abs()  # as compare() computes it (fp32)
    scale = torch.rand(n, device="cuda", generator=g) * 2.0  # half within, half beyond
    out = ref + torch.where(torch.rand(n, device="cuda", generator=g) < 0.5, 1.0, -1.0) * scale * allowed
    out[:1000] = ref[:1000] + allowed[:1000]  # at the edge (after rounding: either side)
    out[1000:1010] = float("nan")
    out[1010:1015] = float("inf")
    out[1015:1020] = -float("inf")
    ref[1020:1025] = float("inf")
    ref[1025:1030] = float("nan")
    ref[1030:1040] = 0.0
    ref[1040:1045] = -0.0
    out[1040:1045] = 0.0
    out[1045:1050] = 1e-6
    ref[1045:1050] = 3e-8  # fp16 subnormals
    return out.to(dtype).contiguous(), ref.to(ref_dtype).contiguous()


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ref_fp32", [True, False])
def test_the_native_compare_gives_pythons_figures(tmp_path, dtype, ref_fp32):
    """tunelab_compare (the native worker's `compare`, which a native job's
    check uses where the reference is shared) reproduces compare()'s verdict
    and every figure, bit for bit, on adversarial values."""
    from tunelab.compare import compare

    nw = NativeWorker(helpers=_helpers(tmp_path))
    try:
        assert nw.hello["ok"], nw.hello
        for atol, rtol, max_mismatch in [(1e-2, 1e-2, 0.0), (1e-3, 0.0, 0.5), (0.1, 0.05, 0.01)]:
            out, ref = _compare_cases(dtype, torch.float32 if ref_fp32 else dtype, atol, rtol)
            torch.cuda.synchronize()
            shared = [native.describe_tensor(torch, k, v) for k, v in (("out", out), ("reference", ref))]
            _import(nw, {"tensors": shared})
            got = nw.request(
                "compare",
                out=0,
                out_dtype=shared[0]["dtype"],
                reference=1,
                reference_dtype=shared[1]["dtype"],
                elements=out.numel(),
                atol=atol,
                rtol=rtol,
                max_mismatch=max_mismatch,
            )
            assert got["ok"], got
            got = {k: v for k, v in got.items() if k not in ("ok", "id", "met", "worker_us", "idle_us", "at_ns")}
            want = compare(out, ref, atol=atol, rtol=rtol, max_mismatch=max_mismatch)
            want.pop("mismatch")
            assert got == want, (atol, rtol)
            # The cases reach both verdicts' causes: NaN and infinite outputs, mismatches.
            assert want["nan_count"] == 10 and want["inf_count"] == 10 and 0 < want["mismatch_frac"] < 1
        # A passing check agrees too: the reference rounded to the output's type.
        ref = _compare_cases(dtype, torch.float32, 0.0, 0.0)[1][2000:].contiguous()
        out = ref.to(dtype)
        torch.cuda.synchronize()
        shared = [native.describe_tensor(torch, k, v) for k, v in (("out", out), ("reference", ref))]
        _import(nw, {"tensors": shared})
        got = nw.request(
            "compare",
            out=0,
            out_dtype=shared[0]["dtype"],
            reference=1,
            reference_dtype="float32",
            elements=out.numel(),
            atol=1e-2,
            rtol=1e-2,
        )
        assert got["ok"], got
        got = {k: v for k, v in got.items() if k not in ("ok", "id", "met", "worker_us", "idle_us", "at_ns")}
        want = compare(out, ref, atol=1e-2, rtol=1e-2, max_mismatch=0.0)
        want.pop("mismatch")
        assert got == want and want["passed"]
    finally:
        nw.close()


# ---------------------------------------------------------------- inputs built natively (`build`)


def _fetch(nw, index, dtype, shape):
    got = nw.request("fetch", tensor=index)
    assert got["ok"], got
    raw = bytearray.fromhex(got["hex"])
    return torch.frombuffer(raw, dtype=dtype).reshape(shape)


@gpu_only
def test_built_values_are_the_fp32_draws_rounded_once_and_repeat_by_seed(tmp_path):
    """`build`'s generator: one stream drawn into fp32, fp16 and bf16 gives the
    fp32 values rounded as torch rounds them (to nearest even; fp16
    subnormals and overflow included), the same seed the same bits, another
    seed or stream other values."""
    nw = NativeWorker(helpers=_helpers(tmp_path))
    try:
        n = 1 << 16
        for std in (1.0, 1e-5, 3e4):  # normal values; fp16 subnormals; fp16 overflow
            tensors = [
                {"bytes": 4 * n, "dtype": "float32", "fill": {"normal": {"std": std, "stream": 3}}},
                {"bytes": 2 * n, "dtype": "float16", "fill": {"normal": {"std": std, "stream": 3}}},
                {"bytes": 2 * n, "dtype": "bfloat16", "fill": {"normal": {"std": std, "stream": 3}}},
                {"bytes": 4 * n, "dtype": "float32", "fill": {"normal": {"std": std, "stream": 4}}},
            ]
            built = nw.request("build", tensors=tensors, seed=11)
            assert built["ok"], built
            fp32 = _fetch(nw, 0, torch.float32, (n,))
            assert torch.equal(
                _fetch(nw, 1, torch.float16, (n,)).view(torch.int16), fp32.to(torch.float16).view(torch.int16)
            ), std
            assert torch.equal(
                _fetch(nw, 2, torch.bfloat16, (n,)).view(torch.int16), fp32.to(torch.bfloat16).view(torch.int16)
            ), std
            assert abs(fp32.mean().item()) < 0.02 * std and abs(fp32.std().item() / std - 1) < 0.02
            assert not torch.equal(fp32, _fetch(nw, 3, torch.float32, (n,)))  # another stream
            if std == 1e-5:
                assert (_fetch(nw, 1, torch.float16, (n,)).abs() < 2**-14).float().mean() > 0.5
            if std == 3e4:
                assert torch.isinf(_fetch(nw, 1, torch.float16, (n,))).any()
            assert nw.request("build", tensors=tensors[:1], seed=11)["ok"]
            assert torch.equal(_fetch(nw, 0, torch.float32, (n,)), fp32)  # the same seed, the same bits
            assert nw.request("build", tensors=tensors[:1], seed=12)["ok"]
            assert not torch.equal(_fetch(nw, 0, torch.float32, (n,)), fp32)
    finally:
        nw.close()


@gpu_only
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("mnk", [(96, 80, 64), (37, 129, 200)])
def test_a_gemm_built_natively_has_torchs_product_as_its_reference(tmp_path, dtype, mnk):
    """The gemm problem's `native_data`, laid out as the lane sends it: the
    native worker's reference is the fp32 product of the inputs it built."""
    from tunelab import native_data
    from tunelab.problems.gemm import Gemm

    m, n, k = mnk
    layout = native_data.layout(Gemm({"M": m, "N": n, "K": k, "dtype": dtype}).native_data(), seed=5)
    nw = NativeWorker(helpers=_helpers(tmp_path))
    try:
        tensors = [{"bytes": t["bytes"], "dtype": t["dtype"], "fill": t["fill"]} for t in layout["tensors"]]
        built = nw.request("build", tensors=tensors, seed=5, reference=layout["reference_op"])
        assert built["ok"], built
        torch_type = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        a = _fetch(nw, 0, torch_type, (m, k)).float()
        b = _fetch(nw, 1, torch_type, (k, n)).float()
        reference = _fetch(nw, layout["reference"], torch.float32, (m, n))
        want = torch.matmul(a.double(), b.double()).float()
        torch.testing.assert_close(reference, want, atol=1e-5, rtol=1e-5)
        assert reference.std().item() > 0.5  # C ~ N(0, 1): the inputs are not zeros
    finally:
        nw.close()


# ---------------------------------------------------------------- the aot output, on a GPU


def _aot_dir():
    path = os.environ.get("TUNELAB_AOT_DIR")
    return pathlib.Path(path) if path else None


@gpu_only
@pytest.mark.skipif(
    _aot_dir() is None, reason="set TUNELAB_AOT_DIR to an aot folder of the quickstart (bench/native_gpu_check.sh does)"
)
def test_the_aot_dispatcher_gives_the_bits_of_each_winner(tmp_path):
    """The quickstart's aot export built with cc against the driver: every
    specialisation launched where its conditions hold writes what its method
    writes (a Triton winner: the bits of tunelab's Triton launch of the same
    config; a CUDA winner: the product within tolerance, the same bits twice),
    and the dispatcher picks the specialisation of the call's M bucket."""
    import ctypes
    import triton
    from tunelab.problems.gemm import Gemm

    folder = _aot_dir()
    index = json.loads((folder / "index.json").read_text())
    prefix = index["prefix"]
    assert index["tensors"] == ["a", "b", "out"] and index["ints"] == ["M", "N", "K"], index
    include = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    library = tmp_path / f"lib{prefix}.so"
    subprocess.run(
        [
            "cc",
            "-std=c11",
            "-O2",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Werror",
            "-I",
            str(include),
            "-I",
            str(folder),
            str(folder / f"{prefix}.c"),
            "-o",
            str(library),
        ],
        check=True,
    )
    ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(library))
    args = [ctypes.c_uint64] * 3 + [ctypes.c_int64] * 3

    def function(name, argtypes):
        f = getattr(lib, f"{prefix}_{name}")  # (attributes are cached; lib[name] is not)
        f.argtypes, f.restype = argtypes, ctypes.c_int
        return f

    choose = function("choose", args)
    fits = function("fits", [ctypes.c_int] + args)
    launch_spec = function("launch_spec", [ctypes.c_int, ctypes.c_void_p] + args)
    launch_any = function("launch", [ctypes.c_void_p] + args)

    torch.cuda.init()
    tuned = sorted({(s["won_at"]["M"], s["won_at"]["N"], s["won_at"]["K"]) for s in index["specs"]})
    # The tuned shapes, and an M just below each (another bucket member, not a multiple of 16).
    shapes = tuned + [(m - 3, n, k) for m, n, k in tuned]
    checked = set()
    for M, N, K in shapes:
        shape = {"M": M, "N": N, "K": K, "dtype": "bf16"}
        problem = Gemm(shape)
        inputs = problem.inputs(0, torch.device("cuda"))
        expected = problem.reference(inputs)
        ptrs = (inputs["a"].data_ptr(), inputs["b"].data_ptr())
        stream = torch.cuda.current_stream().cuda_stream
        for n, spec in enumerate(index["specs"]):
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            call = (*ptrs, out.data_ptr(), M, N, K)
            if not fits(n, *call):
                continue
            assert launch_spec(n, stream, *call) == 0, (n, shape)
            torch.cuda.synchronize()
            if spec["kind"] == "triton":
                launch = problem.methods()["matmul"].bind(problem, inputs, spec["config"])
                launch()
                torch.cuda.synchronize()
                assert torch.equal(out.view(torch.int16), launch.out.view(torch.int16)), (spec, shape)
            else:
                assert torch.allclose(out.float(), expected, atol=1e-2, rtol=1e-2), (spec, shape)
                again = torch.full_like(out, float("nan"))
                assert launch_spec(n, stream, *call[:2], again.data_ptr(), M, N, K) == 0
                torch.cuda.synchronize()
                assert torch.equal(out.view(torch.int16), again.view(torch.int16)), (spec, shape)
            checked.add(n)
        # The dispatcher: the spec of the largest tuned M of the call's bucket (here,
        # the tuned Ms are far apart: the smallest tuned M >= this M, else the largest).
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        chosen = choose(*ptrs, out.data_ptr(), M, N, K)
        assert chosen >= 0, shape
        above = [t for t in tuned if t[0] >= M]
        want = min(above) if above else max(tuned)
        won = index["specs"][chosen]["won_at"]
        assert (won["M"], won["N"], won["K"]) == want, (shape, index["specs"][chosen])
        assert launch_any(stream, *ptrs, out.data_ptr(), M, N, K) == 0
        torch.cuda.synchronize()
        assert torch.allclose(out.float(), expected, atol=1e-2, rtol=1e-2), shape
    assert checked == set(range(len(index["specs"]))), "every specialisation ran somewhere"
