"""An A/B side's variant of a job (tunelab.variant, docs/ab.md): modules run
from other files, and a planted slowdown, in-process and through a worker."""

import pathlib
import sys
import time
import types

import pytest

from conftest import MODE, PYTHON_DIR
from tunelab import variant
from test_worker import TOLERANCE, gemm_job


def _package(tmp_path: pathlib.Path) -> pathlib.Path:
    """A package `abpkg` with a module `mod` saying "original", importable."""
    pkg = tmp_path / "abpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("WHO = 'original'\n\ndef who():\n    return WHO\n")
    if str(tmp_path) not in sys.path:
        sys.path.insert(0, str(tmp_path))
    return pkg


def test_a_swapped_module_is_the_replacement_inside_and_the_original_after(tmp_path):
    _package(tmp_path)
    replacement = tmp_path / "other.py"
    replacement.write_text("WHO = 'replacement'\n\ndef who():\n    return WHO\n")
    import abpkg.mod

    with variant.swapped({"abpkg.mod": str(replacement)}):
        from abpkg.mod import who
        from abpkg import mod

        assert who() == "replacement"
        assert mod.WHO == "replacement"
        assert sys.modules["abpkg.mod"].__file__ == str(replacement)
    from abpkg import mod as after

    assert after is abpkg.mod and after.who() == "original"
    assert sys.modules["abpkg.mod"] is abpkg.mod
    # Loaded once per content: a second swap finds the same module.
    with variant.swapped({"abpkg.mod": str(replacement)}):
        first = sys.modules["abpkg.mod"]
    with variant.swapped({"abpkg.mod": str(replacement)}):
        assert sys.modules["abpkg.mod"] is first
    with variant.swapped(None), variant.swapped({}):
        assert sys.modules["abpkg.mod"] is abpkg.mod


def test_a_module_never_imported_before_is_gone_again_after_the_swap(tmp_path):
    pkg = _package(tmp_path)
    (pkg / "late.py").write_text("X = 1\n")
    replacement = tmp_path / "late_other.py"
    replacement.write_text("X = 2\n")
    import abpkg

    assert "abpkg.late" not in sys.modules
    with variant.swapped({"abpkg.late": str(replacement)}):
        from abpkg import late

        assert late.X == 2
    assert "abpkg.late" not in sys.modules and not hasattr(abpkg, "late")


def test_a_cpu_plant_adds_at_least_its_time_to_every_launch():
    calls = []
    planted = variant.plant_on_cpu(lambda: calls.append(1) or "done", 3000.0)
    for _ in range(3):
        started = time.perf_counter()
        assert planted() == "done"
        assert (time.perf_counter() - started) * 1e6 >= 3000.0
    assert len(calls) == 3 and planted.planted_us == 3000.0


def test_a_planted_launch_keeps_the_launchs_attributes():
    class Launch:
        out = "the output"

        def __call__(self):
            return None

    planted = variant.plant_on_cpu(Launch(), 1.0)
    assert planted.out == "the output"


@pytest.mark.skipif(MODE != "interpreter", reason="times the interpreter's wall clock")
def test_a_job_with_a_plant_is_checked_and_every_sample_carries_it(shared_worker):
    job = {**gemm_job("planted-1"), "plant_us": 20_000.0}
    checked = shared_worker.request("check", job=job, seed=0, tolerance=TOLERANCE)
    assert checked["ok"] and checked["passed"], checked
    sampled = shared_worker.request("sample", job_id="planted-1", count=3)
    assert all(us >= 20_000.0 for us in sampled["us"]), sampled


def test_a_job_with_its_kernel_module_from_another_file_runs_that_file(shared_worker, tmp_path):
    # A copy of the GEMM kernel module that doubles its output: the check
    # fails where the module's own file passes, so the copy is what ran.
    source = (PYTHON_DIR / "tunelab" / "kernels" / "matmul.py").read_text()
    doubled = tmp_path / "matmul_doubled.py"
    doubled.write_text(
        source + "\n\n_make = make_launcher\n\n\ndef make_launcher(a, b, out, config):\n"
        "    run = _make(a, b, out, config)\n\n"
        "    def doubled():\n        run()\n        out.mul_(2)\n\n    return doubled\n"
    )
    same = tmp_path / "matmul_same.py"
    same.write_text(source)
    for path, passes in ((doubled, False), (same, True)):
        job = gemm_job(f"swapped-{passes}")
        job["method"] = {**job["method"], "modules": {"tunelab.kernels.matmul": str(path)}}
        checked = shared_worker.request("check", job=job, seed=0, tolerance=TOLERANCE)
        assert checked["ok"] and checked["passed"] is passes, checked
    # The module's own file is back for the next job.
    assert shared_worker.request("check", job=gemm_job("unswapped"), seed=0, tolerance=TOLERANCE)["passed"]


def test_malformed_variants_are_bad_requests(shared_worker):
    for bad in ({"plant_us": -1.0}, {"plant_us": "3%"}):
        reply = shared_worker.request("check", job={**gemm_job("bad-plant"), **bad}, seed=0, tolerance=TOLERANCE)
        assert reply["ok"] is False and reply["class"] == "bad_request", reply
    job = gemm_job("bad-modules")
    job["method"] = {**job["method"], "modules": {"tunelab.kernels.matmul": 3}}
    reply = shared_worker.request("check", job=job, seed=0, tolerance=TOLERANCE)
    assert reply["ok"] is False and reply["class"] == "bad_request", reply


class _FakeGpu:
    """A stream on a virtual clock: an op starts when the GPU is free and the
    host has queued it (the host's time is the wall clock), and takes its
    duration; an event records when the stream reaches it. `_sleep` spins
    at 40 cycles a microsecond (a hold of 10 ms, so a loaded host still
    queues what is timed behind it) and costs 1 µs of its own; queueing a
    kernel costs the host 5 µs (a launch's API cost), a launch `host_us`."""

    CYCLES_PER_US = 40.0

    def __init__(self, launch_us: float, host_us: float = 5.0):
        self.free_at = 0.0  # µs on the host's clock
        self.launch_us = launch_us
        self.host_us = host_us
        self.slept: list[int] = []
        gpu = self

        class Event:
            def __init__(self, enable_timing=True):
                self.at = None

            def record(self):
                self.at = gpu._run(0.0)

            def elapsed_time(self, end):
                return (end.at - self.at) / 1e3

            def synchronize(self):
                variant.host_wait(max(0.0, gpu.free_at - time.perf_counter() * 1e6))

        def _sleep(cycles):
            gpu.slept.append(cycles)
            variant.host_wait(5.0)
            gpu._run(1.0 + cycles / self.CYCLES_PER_US)

        self.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(_sleep=_sleep, Event=Event))

    def _run(self, us: float) -> float:
        self.free_at = max(self.free_at, time.perf_counter() * 1e6) + us
        return self.free_at

    def launch(self):
        variant.host_wait(self.host_us)
        self._run(self.launch_us)
        return "out"

    def sample_spans(self, launch, count: int) -> list[float]:
        """`count` launches back to back, each between an event pair, as a
        timer samples them; the spans in µs."""
        spans = []
        for _ in range(count):
            start, end = self.torch.cuda.Event(), self.torch.cuda.Event()
            start.record()
            launch()
            end.record()
            spans.append(start.elapsed_time(end) * 1e3)
        end.synchronize()
        return spans


@pytest.mark.parametrize("launch_us", [2.0, 5000.0])
def test_a_gpu_plant_is_sized_where_it_runs_and_waits_on_the_host_too(launch_us):
    # A kernel shorter than the host takes to queue the next (2 µs) and one
    # far longer: the gap one more kernel costs is the GPU's own 1 µs either
    # way (timed behind a hold spin, not behind the host's 5 µs), the rate 40
    # cycles a microsecond, so a 300 µs plant spins (300 - 1) x 40 cycles.
    gpu = _FakeGpu(launch_us)
    planted = variant.plant_on_gpu(gpu.torch, gpu.launch, 300.0)
    assert planted.planted_us == 300.0
    gpu.slept.clear()
    started = time.perf_counter()
    assert planted() == "out"
    host_us = (time.perf_counter() - started) * 1e6
    assert gpu.slept == [pytest.approx(299 * 40, rel=0.01)]
    # And the host waits the plant too: where the host bounds the launch,
    # the spin alone would run while the GPU waits for it.
    assert host_us >= 300.0


@pytest.mark.parametrize("host_us", [5.0, 1000.0])
def test_a_gpu_plant_adds_its_time_whether_the_gpu_or_the_host_bounds_the_launch(host_us):
    # A 500 µs kernel queued in 5 µs (the GPU bounds it) and a 2 µs one the
    # host takes 1000 µs to queue (the host bounds it: Python launch costs).
    # Timed back to back by event pairs, a 40 µs plant adds about 40 µs to
    # each sample either way. Without the host's wait the host-bound samples
    # would gain only what queueing the spin costs (the spin runs while the
    # host queues the next launch).
    launch_us = 500.0 if host_us == 5.0 else 2.0
    gpu = _FakeGpu(launch_us, host_us)
    plain = gpu.sample_spans(gpu.launch, 40)
    planted = variant.plant_on_gpu(gpu.torch, gpu.launch, 40.0)
    spans = gpu.sample_spans(planted, 40)
    added = sorted(spans)[20] - sorted(plain)[20]
    # (Wide bounds: the host-bound spans carry the host's own jitter.)
    assert 30.0 <= added <= 60.0, f"{added:.1f} us added for 40 asked"


@pytest.mark.parametrize("plant_us, burns, cycles", [(300.0, 14, 19 * 40), (15.0, 0, 14 * 40)])
def test_a_gpu_plant_burns_what_it_can_and_spins_the_rest(plant_us, burns, cycles):
    # A burn of 20 µs on the simulated GPU (the host queues it in 5 µs)
    # behind a 5 ms kernel: a 300 µs plant is one more kernel (1 µs), 14
    # burns (280 µs) and a spin of the 19 µs left; a 15 µs plant, shorter
    # than a burn, only spins. And the samples gain the plant either way.
    gpu = _FakeGpu(5000.0)
    burned = []

    def burn():
        burned.append(1)
        variant.host_wait(5.0)
        gpu._run(20.0)

    plain = gpu.sample_spans(gpu.launch, 9)
    planted = variant.plant_on_gpu(gpu.torch, gpu.launch, plant_us, burn)
    gpu.slept.clear()
    burned.clear()
    planted()
    assert len(burned) == burns
    assert gpu.slept == [pytest.approx(cycles, abs=2)]
    spans = gpu.sample_spans(planted, 9)
    added = sorted(spans)[4] - sorted(plain)[4]
    assert plant_us * 0.9 <= added <= plant_us * 1.1 + 2.0, f"{added:.1f} us added for {plant_us} asked"


@pytest.mark.skipif(MODE != "gpu", reason="plants kernels on a GPU")
def test_a_gpu_plant_adds_about_what_it_was_asked(shared_worker):
    # A small GEMM timed cold with and without 50 µs planted: the medians
    # differ by the plant, give or take a quarter (the kernel gap is
    # measured, the spin sized at the clock the GPU runs at).
    medians = []
    for job_id, plant in (("plain", 0.0), ("planted-50", 50.0)):
        job = {**gemm_job(job_id), "plant_us": plant}
        assert shared_worker.request("check", job=job, seed=0, tolerance=TOLERANCE)["passed"]
        us = sorted(shared_worker.request("sample", job_id=job_id, count=64)["us"])
        medians.append(us[len(us) // 2])
    added = medians[1] - medians[0]
    assert 37.5 <= added <= 62.5, f"{added:.2f} us added for 50 asked (medians {medians})"


def test_a_module_that_imports_from_a_swapped_one_runs_again_against_it(tmp_path):
    pkg = tmp_path / "abdeps"  # a package of its own: abpkg may be another test's, imported from its folder
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("WHO = 'original'\n\ndef who():\n    return WHO\n")
    (pkg / "user.py").write_text("from abdeps.mod import who\n\ndef greet():\n    return who()\n")
    (pkg / "bystander.py").write_text("from abdeps.mod import WHO\n")  # a constant alone: not followed
    replacement = tmp_path / "mod_dep.py"
    replacement.write_text("WHO = 'replacement'\n\ndef who():\n    return WHO\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import abdeps.bystander
        import abdeps.user
    finally:
        sys.path.remove(str(tmp_path))

    before, bystander = abdeps.user, abdeps.bystander
    with variant.swapped({"abdeps.mod": str(replacement)}):
        from abdeps import user

        assert user.greet() == "replacement"
        assert user is not before and sys.modules["abdeps.user"] is user
        assert sys.modules["abdeps.bystander"] is bystander
    assert sys.modules["abdeps.user"] is before and abdeps.user is before and before.greet() == "original"


def test_the_moe_launchers_take_a_swapped_kernel_module(tmp_path):
    """An A/B side whose change is in a kernel module (moe_kernels) must reach
    the launches that other modules bound at their import (fused_moe's,
    the persistent kernel's tile code, the quantised GEMMs')."""
    import tunelab.kernels.fused_moe as fused_before
    import tunelab.kernels.quant_moe  # noqa: F401 - imported, so a dependent

    source = (PYTHON_DIR / "tunelab" / "kernels" / "moe_kernels.py").read_text()
    path = tmp_path / "moe_kernels_a.py"
    path.write_text(source + "\n# side A\n")
    with variant.swapped({"tunelab.kernels.moe_kernels": str(path)}):
        kernels = sys.modules["tunelab.kernels.moe_kernels"]
        from tunelab.kernels import fused_moe, quant_moe

        assert kernels.__file__ == str(path)
        assert fused_moe.moe_gemm1_kernel is kernels.moe_gemm1_kernel
        assert fused_moe.PersistentMoELaunch is sys.modules["tunelab.kernels.moe_persistent"].PersistentMoELaunch
        assert sys.modules["tunelab.kernels.moe_persistent_kernels"]._gemm1_rows is kernels._gemm1_rows
        assert sys.modules["tunelab.kernels.quant_moe_kernels"]._gemm1_rows is kernels._gemm1_rows
        assert quant_moe.moe_align_kernel is kernels.moe_align_kernel
    assert sys.modules["tunelab.kernels.fused_moe"] is fused_before
    # Both named, the launcher first: it still runs after the kernels it imports are in place.
    launcher = tmp_path / "fused_moe_a.py"
    launcher.write_text((PYTHON_DIR / "tunelab" / "kernels" / "fused_moe.py").read_text() + "\n# side A\n")
    with variant.swapped({"tunelab.kernels.fused_moe": str(launcher), "tunelab.kernels.moe_kernels": str(path)}):
        from tunelab.kernels import fused_moe

        assert fused_moe.__file__ == str(launcher)
        assert fused_moe.moe_gemm1_kernel is sys.modules["tunelab.kernels.moe_kernels"].moe_gemm1_kernel
