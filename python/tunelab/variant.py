"""How one side of an A/B run (`tunelab ab`, docs/ab.md) runs a job other
than its method's definition says: Python modules replaced by other files
(the method's kernel at another git revision, or a second source file), and
a planted slowdown (a testing knob).

A job carries them in its JOB object (docs/worker-protocol.md, "JOB"):
`method.modules` maps a module's dotted name to the file to run instead, and
`plant_us` asks for a spin of that many microseconds after every launch,
inside whatever times the launch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
import time
from typing import Any, Callable, Iterator

# (module name, file, file's digest) -> the module loaded from that file.
_LOADED: dict[tuple[str, str, str], Any] = {}


def _load(name: str, path: str):
    """The module `name` as `path` defines it, loaded once per content. It
    keeps `name` as its name, so its own imports of the package resolve to
    the package as it is, and Triton keys its kernels by their source (the
    file's), so they compile apart from the module they stand in for."""
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    key = (name, path, digest)
    if key not in _LOADED:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path} cannot be loaded as module {name}")
        module = importlib.util.module_from_spec(spec)
        previous = sys.modules.get(name)
        sys.modules[name] = module  # what a module under execution expects of itself
        try:
            spec.loader.exec_module(module)
        finally:
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
        _LOADED[key] = module
    return _LOADED[key]


@contextlib.contextmanager
def swapped(modules: dict[str, str] | None) -> Iterator[None]:
    """Inside, each named module is the one its file defines: in
    `sys.modules` (`from a.b.c import x`, `import a.b.c`) and as its parent
    package's attribute (`from a.b import c`). A module bound before, or a
    name a problem imported at its own module's top, still refers to what
    it did: tunelab's problems import their kernels where they bind and
    compile, which runs inside."""
    if not modules:
        yield
        return
    saved: list[tuple[str, Any, Any, Any]] = []
    try:
        for name, path in modules.items():
            replacement = _load(name, path)
            parent_name, _, attr = name.rpartition(".")
            parent = sys.modules.get(parent_name) if parent_name else None
            saved.append((name, sys.modules.get(name), parent, getattr(parent, attr, None) if parent else None))
            sys.modules[name] = replacement
            if parent is not None:
                setattr(parent, attr, replacement)
        yield
    finally:
        for name, module, parent, attribute in reversed(saved):
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
            if parent is not None:
                attr = name.rpartition(".")[2]
                if attribute is None:
                    delattr(parent, attr)
                else:
                    setattr(parent, attr, attribute)


class Planted:
    """A launch followed by a spin: a slowdown planted on purpose, inside
    whatever times the launch (an event pair, a captured CUDA graph, the
    interpreter's wall clock). Everything else of the launch (its output,
    its native launch) is the launch's own."""

    def __init__(self, launch: Callable[[], Any], spin: Callable[[], Any], planted_us: float):
        self._launch = launch
        self._spin = spin
        # What the spin adds to a launch, as calibrated (microseconds).
        self.planted_us = planted_us

    def __call__(self):
        result = self._launch()
        self._spin()
        return result

    def __getattr__(self, name: str):
        return getattr(self._launch, name)


def plant_on_cpu(launch: Callable[[], Any], plant_us: float) -> Planted:
    """The interpreter's plant: a busy wait of `plant_us` after the launch,
    on the wall clock its samples are timed by."""

    def spin():
        until = time.perf_counter() + plant_us / 1e6
        while time.perf_counter() < until:
            pass

    return Planted(launch, spin, plant_us)


def plant_on_gpu(torch, launch: Callable[[], Any], plant_us: float, samples: int = 64) -> Planted:
    """The GPU's plant: a spin kernel (`torch.cuda._sleep`, a count of SM
    clock cycles) queued after the launch, sized so that a launch with it
    takes `plant_us` longer than without it. What it adds is measured here,
    at the clock the GPU runs now, from event pairs around the launch alone,
    the launch and an empty spin (the gap between two kernels), and the
    launch and a spin of a known count (the cycles per microsecond): the
    spin's count is then (`plant_us` - gap) x cycles per microsecond, none
    where the gap alone is as long. A spin counts cycles, so when the clock
    falls under load the spin lengthens with the kernels around it."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        raise RuntimeError("torch.cuda._sleep is missing: this torch cannot plant a slowdown")

    def median_us(fn) -> float:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
        for start, end in zip(starts, ends):
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
        return times[len(times) // 2]

    probe_cycles = 200_000  # about 100 µs at 2 GHz
    launch()  # warm
    alone = median_us(launch)
    gap = median_us(lambda: (launch(), sleep(0)))
    spun = median_us(lambda: (launch(), sleep(probe_cycles)))
    per_us = probe_cycles / max(spun - gap, 1e-3)
    cycles = max(0, int(round((plant_us - (gap - alone)) * per_us)))
    planted = (gap - alone) + cycles / per_us
    print(
        f"tunelab worker: planted {planted:.2f} us a launch (asked {plant_us:.2f}): "
        f"launch {alone:.2f} us, kernel gap {gap - alone:.2f} us, {per_us:.0f} cycles/us, spin {cycles} cycles",
        file=sys.stderr,
    )
    return Planted(launch, lambda: sleep(cycles), planted)
