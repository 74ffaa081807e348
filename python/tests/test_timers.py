"""The GPU timer's queueing, against a simulated GPU (no CUDA needed).

The simulation keeps two clocks: the host's (advanced by what each call
costs the host) and the GPU's (one in-order stream: an operation starts when
the host has queued it and the previous one has finished). An event's time is
when the GPU reaches it. A sample is then the GPU's view of start..end, which
includes host time only if the GPU ran dry inside the sample: the failure the
spin kernel ahead of a batch exists to prevent.
"""

import time
import types

import pytest

from tunelab.timers import CudaEventTimer, WallTimer


class FakeGpu:
    def __init__(self):
        self.host_us = 0.0
        self.gpu_us = 0.0  # when the GPU finishes what has been queued so far
        self.spins: list[float] = []

    def queue(self, host_cost_us: float, gpu_cost_us: float) -> float:
        """The host spends host_cost_us queueing an op that runs gpu_cost_us; when it finishes."""
        self.host_us += host_cost_us
        self.gpu_us = max(self.gpu_us, self.host_us) + gpu_cost_us
        return self.gpu_us


class FakeEvent:
    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu
        self.at = None

    def record(self):
        self.at = self.gpu.queue(1.0, 0.0)

    def synchronize(self):
        self.gpu.host_us = max(self.gpu.host_us, self.gpu.gpu_us)

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.at - self.at) / 1e3  # ms, as torch's


def fake_torch(gpu: FakeGpu):
    def sleep(cycles):
        us = cycles / CudaEventTimer._SPIN_CYCLES_PER_US
        gpu.spins.append(us)
        gpu.queue(2.0, us)

    def synchronize():
        gpu.host_us = max(gpu.host_us, gpu.gpu_us)

    cuda = types.SimpleNamespace(
        Event=lambda enable_timing: FakeEvent(gpu), _sleep=sleep, synchronize=synchronize, clock_rate=lambda: 1980
    )
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def patched_clock(monkeypatch):
    """time.perf_counter in tunelab.timers reads the simulated host clock."""
    gpu = FakeGpu()
    import tunelab.timers as timers

    monkeypatch.setattr(timers.time, "perf_counter", lambda: gpu.host_us / 1e6)
    return gpu


@pytest.mark.parametrize("host_us, kernel_us", [(1000.0, 80.0), (3.0, 40.0), (300.0, 5.0)])
def test_samples_time_the_kernel_not_the_host_however_slow_the_host_is(patched_clock, host_us, kernel_us):
    """A launch whose host side costs far more than its kernel (triton_kernels'
    matmul_ogs: about 1 ms of Python against 80 us on the GPU) reads its
    kernel's time in every sample, from a fresh timer's first batch on."""
    gpu = patched_clock
    timer = CudaEventTimer(fake_torch(gpu))

    def launch():
        gpu.queue(host_us, kernel_us)

    timer.warmup(launch, 3, 5.0)
    for _ in range(3):
        us, clock = timer.sample(launch, 32, 0)
        assert len(us) == 32 and clock == 1980
        assert max(us) == pytest.approx(kernel_us, abs=0.01), us
    # Every spin within the cap; a slow host needs several per batch.
    assert max(gpu.spins) <= CudaEventTimer._MAX_SPIN_US
    if host_us * 32 * CudaEventTimer._HOLD_MARGIN > CudaEventTimer._MAX_SPIN_US:
        assert len(gpu.spins) > 3


def test_a_pause_of_the_host_inside_a_chunk_queues_the_chunk_again(patched_clock):
    """One launch that stalls the host (a garbage collection, a page fault)
    longer than the spin lasts would let the GPU run dry; the chunk is queued
    again and no sample keeps the stall."""
    gpu = patched_clock
    timer = CudaEventTimer(fake_torch(gpu))
    calls = {"n": 0}

    def launch():
        calls["n"] += 1
        gpu.queue(50_000.0 if calls["n"] == 20 else 10.0, 20.0)

    timer.warmup(launch, 3, 0.01)
    us, _ = timer.sample(launch, 32, 0)
    assert max(us) == pytest.approx(20.0, abs=0.01), us


def test_graph_samples_are_held_the_same_way(patched_clock):
    gpu = patched_clock
    timer = CudaEventTimer(fake_torch(gpu))
    graph = types.SimpleNamespace(replay=lambda: gpu.queue(900.0, 300.0))
    prepared = types.SimpleNamespace(graphs={10: graph}, launch=None)
    us, _ = timer.sample_graph(prepared, 64, 10)
    assert max(us) == pytest.approx(30.0, abs=0.01), us  # 300 us a replay / 10 calls


@pytest.mark.parametrize("min_launches, min_ms, least", [(0, 0.0, 0), (2, 0.0, 2), (0, 1.0, 1)])
def test_the_interpreters_warmup_launches_until_both_limits_are_met_and_not_at_all_for_none(
    min_launches, min_ms, least
):
    # The interpreter's protocol asks for no warm-up (its check has launched
    # the kernel, and there is nothing to compile): (0, 0) launches nothing.
    calls = []
    launches, ms = WallTimer().warmup(lambda: calls.append(time.sleep(0.002)), min_launches, min_ms)
    assert launches == len(calls) and launches >= least and ms >= min_ms
    assert launches == least or min_ms > 0


def test_launches_taking_turns_are_each_timed_in_order_including_a_requeued_chunk(patched_clock):
    """sample_turns: sample i is launch i mod n's, each list holds its own
    launch's times only, also where a chunk is queued again after a stall
    of the host (the requeue re-records the same samples' events)."""
    gpu = patched_clock
    timer = CudaEventTimer(fake_torch(gpu))
    order = []
    calls = {"n": 0}

    def launch_of(name, kernel_us):
        def launch():
            calls["n"] += 1
            order.append(name)
            gpu.queue(50_000.0 if calls["n"] == 30 else 10.0, kernel_us)

        return launch

    a, b, c = launch_of("a", 20.0), launch_of("b", 35.0), launch_of("c", 50.0)
    timer.warmup(a, 3, 0.01)
    order.clear()
    turns, clock = timer.sample_turns([a, b, c], 16, 0)
    assert clock == 1980 and [len(t) for t in turns] == [16, 16, 16]
    assert turns[0] == pytest.approx([20.0] * 16) and turns[1] == pytest.approx([35.0] * 16)
    assert turns[2] == pytest.approx([50.0] * 16)
    assert order[:6] == ["a", "b", "c", "a", "b", "c"]
    # One launch taking every turn is a plain batch.
    us, _ = timer.sample(b, 8, 0)
    assert us == pytest.approx([35.0] * 8)


def test_graphs_taking_turns_replay_their_own_graph(patched_clock):
    gpu = patched_clock
    timer = CudaEventTimer(fake_torch(gpu))
    prepared = [
        types.SimpleNamespace(
            graphs={10: types.SimpleNamespace(replay=lambda us=us: gpu.queue(900.0, us))}, launch=None
        )
        for us in (300.0, 500.0)
    ]
    turns, _ = timer.sample_graph_turns(prepared, 8, 10)
    assert turns[0] == pytest.approx([30.0] * 8) and turns[1] == pytest.approx([50.0] * 8)


def test_the_interpreter_takes_turns_on_the_wall_clock():
    order = []
    turns, clock = WallTimer().sample_turns([lambda: order.append("a"), lambda: order.append("b")], 3, 0)
    assert order == ["a", "b"] * 3 and [len(t) for t in turns] == [3, 3] and clock is None
    prepared = [types.SimpleNamespace(graphs={}, launch=lambda k=k: order.append(k)) for k in "xy"]
    order.clear()
    turns, _ = WallTimer().sample_graph_turns(prepared, 2, 3)
    # One warm-up launch each, then 3 launches a sample, in turns.
    assert order == ["x", "y"] + ["x"] * 3 + ["y"] * 3 + ["x"] * 3 + ["y"] * 3
    assert [len(t) for t in turns] == [2, 2]


def test_jobs_taking_turns_launch_in_their_own_contexts_a_graphs_warm_up_included():
    # The worker's sample_turns hands the timers each job's launch wrapped in
    # its job context (its compile options, its swapped modules): every
    # launch, the graph emulation's warm-up included, sees its own job's.
    from tunelab.workbench import jit
    from tunelab.worker import _in_context

    seen = []
    jobs = [types.SimpleNamespace(ctx=types.SimpleNamespace(modules=None, name=k), graphs={}) for k in "xy"]
    for job in jobs:
        job.launch = lambda: seen.append(jit._active.name if jit._active is not None else None)
    turned = [types.SimpleNamespace(launch=_in_context(j), graphs=j.graphs) for j in jobs]
    WallTimer().sample_graph_turns(turned, 1, 2)
    assert seen == ["x", "y", "x", "x", "y", "y"]
    assert jit._active is None
