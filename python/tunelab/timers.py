"""How a lane worker times a launch: host wall-clock under Triton's
interpreter, CUDA event pairs (cold or hot) and CUDA graph replays on a GPU,
and the SM clock read beside them (docs/timing.md)."""

import math
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, Optional

from tunelab.failures import LAUNCH_ERROR, WorkerError, summarize


class WallTimer:
    """Interpreter mode: host wall-clock around each launch (kernels run on the CPU)."""

    name = "wall"

    def warmup(self, launch: Callable[[], object], min_launches: int, min_ms: float) -> tuple[int, float]:
        """Launches until both limits are met: none when both are 0 (the
        interpreter compiles nothing, and the check has launched already)."""
        launches, ms = 0, 0.0
        started = time.perf_counter()
        while launches < min_launches or ms < min_ms:
            launch()
            launches += 1
            ms = (time.perf_counter() - started) * 1e3
        return launches, ms

    def sample(
        self, launch: Callable[[], object], count: int, flush_bytes: int, flush_with: str = "read"
    ) -> tuple[list[float], Optional[int]]:
        turns, clock = self.sample_turns([launch], count, flush_bytes, flush_with)
        return turns[0], clock

    def sample_turns(
        self, launches: list[Callable[[], object]], count: int, flush_bytes: int, flush_with: str = "read"
    ) -> tuple[list[list[float]], Optional[int]]:
        """`count` samples of each launch, the launches taking turns sample by sample."""
        us: list[list[float]] = [[] for _ in launches]
        for _ in range(count):
            for k, launch in enumerate(launches):
                started = time.perf_counter()
                launch()
                us[k].append((time.perf_counter() - started) * 1e6)
        return us, None

    graph_name = "wall"

    def sample_graph(self, prepared: Any, count: int, graph_calls: int) -> tuple[list[float], Optional[int]]:
        turns, clock = self.sample_graph_turns([prepared], count, graph_calls)
        return turns[0], clock

    def sample_graph_turns(
        self, prepared: list[Any], count: int, graph_calls: int
    ) -> tuple[list[list[float]], Optional[int]]:
        """The graph timing's emulation: wall-clock over graph_calls back-to-back
        launches, per launch, the prepared jobs taking turns. One warm-up
        launch first, once per prepared job and graph size, as a capture
        would make."""
        for p in prepared:
            if graph_calls not in p.graphs:
                p.launch()
                p.graphs[graph_calls] = "warm"
        us: list[list[float]] = [[] for _ in prepared]
        for _ in range(count):
            for k, p in enumerate(prepared):
                started = time.perf_counter()
                for _ in range(graph_calls):
                    p.launch()
                us[k].append((time.perf_counter() - started) * 1e6 / graph_calls)
        return us, None


class CudaEventTimer:
    """GPU mode: a CUDA event pair around each launch, one host sync per batch.

    Events and the L2 flush buffer are allocated once and reused, so a sample
    call allocates nothing on the GPU unless it asks for a larger flush.
    """

    name = "cuda_event"

    # Cap on the number of launches one warm-up batch queues.
    _MAX_WARMUP_BATCH = 4096
    # The spin kernel is sized in clock cycles; 2 GHz is at or above the SM
    # clock of the GPUs tunelab targets, so the spin lasts at least as long as
    # intended (a lower clock only makes it longer).
    _SPIN_CYCLES_PER_US = 2000
    _MAX_SPIN_US = 20_000.0
    # The spin lasts this many times the host's queueing time it covers.
    _HOLD_MARGIN = 1.5
    # Host time a sample adds to its launch (the flush's reduction, two event
    # records), and the least the queueing estimate may fall to.
    _SAMPLE_OVERHEAD_US = 15.0
    _MIN_ENQUEUE_US = 5.0
    # Times a batch's chunks may be queued again after outrunning their spin.
    _REQUEUES = 2

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._starts: list[Any] = []
        self._ends: list[Any] = []
        self._flush: Any = None
        self._clock: Optional[SmClock] = None
        # Host time to queue one sample (flush, two events, launch); refined
        # after every sample call and used to size the spin kernel.
        self._enqueue_us = 50.0

    def _events(self, count: int) -> tuple[list[Any], list[Any]]:
        while len(self._starts) < count:
            self._starts.append(self._torch.cuda.Event(enable_timing=True))
            self._ends.append(self._torch.cuda.Event(enable_timing=True))
        return self._starts[:count], self._ends[:count]

    def _flush_buffer(self, nbytes: int) -> Any:
        """The first `nbytes` (rounded up to whole int32 words) of the flush buffer, as int32."""
        if nbytes <= 0:
            return None
        words = (nbytes + 3) // 4
        if self._flush is None or self._flush.numel() < words:
            self._flush = None  # free the smaller buffer before allocating the larger
            # Zeroed once so a read flush never reads uninitialised memory.
            self._flush = self._torch.zeros(words, dtype=self._torch.int32, device="cuda")
        return self._flush[:words]

    def _flusher(self, nbytes: int, flush_with: str) -> Optional[Callable[[], object]]:
        """A callable that evicts L2 before a sample, or None.

        "read" reduces the buffer to one value, leaving L2 full of clean lines;
        "memset" writes it, leaving L2 full of dirty lines whose write-back the
        next kernel pays for (about 10 µs per call for a memory-bound fused MoE
        on an H100, see FlushWith in src/manifest/raw.rs).
        """
        buf = self._flush_buffer(nbytes)
        if buf is None:
            return None
        if flush_with == "memset":
            zero: Callable[[], object] = buf.zero_
            return zero
        torch = self._torch
        return lambda: torch.amax(buf)

    def _hold_gpu(self, count: int) -> float:
        """Queue a spin kernel long enough for the host to queue `count` samples
        behind it; the spin's length in microseconds (0 where torch has no spin kernel).

        Without it, a kernel shorter than its host launch cost starts only when
        the host gets to it, after its start event has already fired, and the
        sample would include launch latency and idle time. With the GPU held,
        every sample runs back to back from a full queue.
        """
        spin = getattr(self._torch.cuda, "_sleep", None)
        if spin is None:
            return 0.0
        spin_us = min(self._HOLD_MARGIN * self._enqueue_us * count, self._MAX_SPIN_US)
        spin(int(spin_us * self._SPIN_CYCLES_PER_US))
        return spin_us

    def _queue_held(self, count: int, queue_one: Callable[[int], None]) -> None:
        """Queue samples 0..count-1 (`queue_one(i)` queues sample i: its flush,
        event pair and launch) in chunks, each behind its own spin kernel.

        A chunk is as many samples as the host queues within the spin's cap
        (at the host time a sample took so far), so a launch whose host side
        costs more than its kernel (a Python library call such as
        triton_kernels' matmul_ogs: about 1 ms of host time against 80 us of
        GPU time) is timed as the GPU runs it, not as the host queues it. The
        spins chain: the next chunk's spin is queued right behind the current
        chunk's samples, so the host queues the next chunk while the GPU
        spins. A chunk the host took longer to queue than its spin lasted
        (the GPU may have caught up with it: a pause of the host) is queued
        again, its events recorded anew, at most `_REQUEUES` times.
        """
        done = 0
        requeues = 0
        while done < count:
            held = self._MAX_SPIN_US / (self._HOLD_MARGIN * self._enqueue_us)
            chunk = max(1, min(count - done, int(held)))
            spin_us = self._hold_gpu(chunk)
            queued_at = time.perf_counter()
            for i in range(done, done + chunk):
                queue_one(i)
            took_us = (time.perf_counter() - queued_at) * 1e6
            self._enqueue_us = max(took_us / chunk, self._MIN_ENQUEUE_US)
            if spin_us and took_us > spin_us and requeues < self._REQUEUES:
                requeues += 1
                continue
            done += chunk

    def warmup(self, launch: Callable[[], object], min_launches: int, min_ms: float) -> tuple[int, float]:
        starts, ends = self._events(1)
        start, end = starts[0], ends[0]
        launches, ms = 0, 0.0
        host_us = 0.0
        batch = max(1, min_launches)
        while True:
            start.record()
            queued_at = time.perf_counter()
            for _ in range(batch):
                launch()
            host_us += (time.perf_counter() - queued_at) * 1e6
            end.record()
            end.synchronize()
            launches += batch
            ms += start.elapsed_time(end)
            if launches >= min_launches and ms >= min_ms:
                # The host's cost of one launch, plus what a sample adds (a
                # flush, two events): the first sample batch's spin is sized
                # from it.
                self._enqueue_us = max(host_us / launches + self._SAMPLE_OVERHEAD_US, self._MIN_ENQUEUE_US)
                return launches, ms
            # Size the next batch from the GPU time per launch seen so far,
            # growing at most 4x so one bad estimate cannot overshoot by much.
            per_launch = ms / launches
            needed = math.ceil((min_ms - ms) / per_launch) if per_launch > 0 else 2 * batch
            batch = max(1, min(needed, 4 * batch, self._MAX_WARMUP_BATCH))

    def sample(
        self, launch: Callable[[], object], count: int, flush_bytes: int, flush_with: str = "read"
    ) -> tuple[list[float], Optional[int]]:
        turns, clock = self.sample_turns([launch], count, flush_bytes, flush_with)
        return turns[0], clock

    def sample_turns(
        self, launches: list[Callable[[], object]], count: int, flush_bytes: int, flush_with: str = "read"
    ) -> tuple[list[list[float]], Optional[int]]:
        """`count` samples of each launch in one batch, the launches taking
        turns sample by sample (one launch: a plain batch). Taking turns, the
        launches meet the same clock: a kernel under the GPU's power cap runs
        at a clock that moves from one batch to the next, and two batches
        taken one after the other differ by that much (docs/ab.md, "Taking
        turns")."""
        torch = self._torch
        flush = self._flusher(flush_bytes, flush_with)
        turns = len(launches)
        starts, ends = self._events(count * turns)

        def queue_one(i: int) -> None:
            if flush is not None:
                flush()  # touches more than L2 holds: evicts the previous sample's data
            starts[i].record()
            launches[i % turns]()
            ends[i].record()

        self._queue_held(count * turns, queue_one)
        torch.cuda.synchronize()
        # Read just after the batch, while the clock still reflects the load.
        clock = self._sm_clock()
        us = [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]
        return [us[k::turns] for k in range(turns)], clock

    def _sm_clock(self) -> Optional[int]:
        if self._clock is None:
            self._clock = SmClock(self._torch)
        return self._clock.read()

    graph_name = "cuda_graph"

    def sample_graph(self, prepared: Any, count: int, graph_calls: int) -> tuple[list[float], Optional[int]]:
        """`count` replays of one CUDA graph holding `graph_calls` launches back
        to back, each between an event pair; a sample is elapsed / graph_calls.

        vLLM's MoE benchmark times a config this way: launch gaps and host
        launch cost are gone, the data stays in L2 from one call to the next
        (no flush). The graph is captured once per prepared job and graph size
        (after a warm-up launch outside the capture) and replayed by every
        later sample request.
        """
        turns, clock = self.sample_graph_turns([prepared], count, graph_calls)
        return turns[0], clock

    def sample_graph_turns(
        self, prepared: list[Any], count: int, graph_calls: int
    ) -> tuple[list[list[float]], Optional[int]]:
        """`sample_graph` of several prepared jobs in one batch, their graphs
        replayed in turns (see `sample_turns`)."""
        graphs = []
        for p in prepared:
            graph = p.graphs.get(graph_calls)
            if graph is None:
                graph = self._capture(p.launch, graph_calls)
                p.graphs[graph_calls] = graph
            graphs.append(graph)
        turns = len(graphs)
        starts, ends = self._events(count * turns)

        def queue_one(i: int) -> None:
            starts[i].record()
            graphs[i % turns].replay()
            ends[i].record()

        self._queue_held(count * turns, queue_one)
        self._torch.cuda.synchronize()
        clock = self._sm_clock()
        us = [start.elapsed_time(end) * 1e3 / graph_calls for start, end in zip(starts, ends)]
        return [us[k::turns] for k in range(turns)], clock

    def _capture(self, launch: Callable[[], object], calls: int) -> Any:
        torch = self._torch
        # Warm up on a side stream, as torch's CUDA graph notes ask: whatever the
        # first call sets up (workspaces, handles) is not captured.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            launch()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    launch()
        except Exception as exc:  # noqa: BLE001 - the launch may do anything a capture forbids
            print("tunelab worker: CUDA graph capture failed:", file=sys.stderr)
            traceback.print_exception(exc, file=sys.stderr)
            sys.stderr.flush()
            raise WorkerError(
                LAUNCH_ERROR,
                "timing 'graph': this launch cannot be captured in a CUDA graph (a host sync, or a CUDA call "
                f"a capture forbids, inside the call): {summarize(exc)}. Time it with timing 'cold' or 'hot'.",
            ) from exc
        return graph


class SmClock:
    """The current SM clock in MHz, or None where it cannot be read cheaply.

    torch.cuda.clock_rate (torch >= 2.1, through NVML) maps CUDA_VISIBLE_DEVICES
    to the right NVML device; pynvml by PCI bus id is the fallback. Once a read
    fails the reader is dropped, so a missing NVML costs one try, not one per call.
    """

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._read = self._pick()

    def _pick(self) -> Optional[Callable[[], Any]]:
        torch_clock: Optional[Callable[[], Any]] = getattr(self._torch.cuda, "clock_rate", None)
        if torch_clock is not None:
            return torch_clock
        try:
            import pynvml

            pynvml.nvmlInit()
            props = self._torch.cuda.get_device_properties(self._torch.cuda.current_device())
            bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
            return lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        except Exception:
            return None

    def read(self) -> Optional[int]:
        if self._read is None:
            return None
        try:
            return int(self._read())
        except Exception:
            self._read = None
            return None
