"""How one side of an A/B run (`tunelab ab`, docs/ab.md) runs a job other
than its method's definition says: Python modules replaced by other files
(the method's kernel at another git revision, or a second source file), and
a planted slowdown (a testing knob).

A job carries them in its JOB object (docs/worker-protocol.md, "JOB"):
`method.modules` maps a module's dotted name to the file to run instead, and
`plant_us` asks for that many microseconds of busy GPU (or host) after
every launch, inside whatever times the launch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
import time
import types
from typing import Any, Callable, Iterator

# (module name, file, file's digest, what was swapped in before it) -> the module loaded from that file.
_LOADED: dict[tuple[str, str, str, tuple], Any] = {}


def _load(name: str, path: str, against: tuple = ()):
    """The module `name` as `path` defines it, loaded once per content (and
    per `against`: the replacements already in place when it runs, which its
    imports of them bind, see swapped). It keeps `name` as its name, so its own
    imports of the package resolve to the package as it is, and Triton keys
    its kernels by their source (the file's), so they compile apart from the
    module they stand in for."""
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    key = (name, path, digest, against)
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
    compile, which runs inside. A module of a swapped one's package that
    was imported before and refers to it (see _dependents: fused_moe's
    launches bind moe_kernels' kernels when it runs) is run again from its
    own file against the replacement, and swapped in the same way."""
    if not modules:
        yield
        return
    saved: list[tuple[str, Any, Any, Any]] = []

    def install(name: str, replacement) -> None:
        parent_name, _, attr = name.rpartition(".")
        parent = sys.modules.get(parent_name) if parent_name else None
        saved.append((name, sys.modules.get(name), parent, getattr(parent, attr, None) if parent else None))
        sys.modules[name] = replacement
        if parent is not None:
            setattr(parent, attr, replacement)

    try:
        # Named modules first, then their dependents, each after the modules it
        # refers to (as imported now), so that its imports find them swapped.
        order = _in_order(
            {
                name: (path, _refers_to(sys.modules[name]) if name in sys.modules else set())
                for name, path in modules.items()
            }
        )
        order += _dependents(set(modules))
        against: list[tuple[str, int]] = []
        for name, path in order:
            install(name, _load(name, path, tuple(against)))
            against.append((name, id(sys.modules[name])))
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


def _refers_to(module) -> set[str]:
    """Names of the modules `module`'s globals come from: modules, and the
    functions, classes and Triton kernels they define (a constant imported
    alone says nothing of where it came from)."""
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:  # pragma: no cover - tunelab's workers have Triton
        KernelInterface = ()
    out = set()
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType):
            out.add(value.__name__)
        elif isinstance(value, (types.FunctionType, type, KernelInterface)):
            # A kernel (JITFunction, or the interpreter's wrapper) names its function's module.
            origin = getattr(getattr(value, "fn", value), "__module__", None)
            if isinstance(origin, str):
                out.add(origin)
    return out


def _dependents(names: set[str]) -> list[tuple[str, str]]:
    """(name, file) of the already imported modules of the swapped modules'
    packages that refer to one of them, directly or through another such
    module, each after those of them it refers to. Without running these
    again, a side whose change is in tunelab.kernels.moe_kernels would run
    the launches of fused_moe, which bound the working tree's kernels when
    it was first imported."""
    packages = {n.rpartition(".")[0] for n in names}
    candidates = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name not in names and name.rpartition(".")[0] in packages and isinstance(path, str):
            candidates[name] = (path, _refers_to(module))
    found: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, (_, refs) in candidates.items():
            if name not in found and refs & (names | found):
                found.add(name)
                grew = True
    return _in_order({name: candidates[name] for name in found})


def _in_order(modules: dict[str, tuple[str, set[str]]]) -> list[tuple[str, str]]:
    """(name, file) of {name: (file, names it refers to)}, each after the
    others it refers to (where they refer to each other: in name order)."""
    ordered: list[str] = []
    while len(ordered) < len(modules):
        left = [n for n in sorted(modules) if n not in ordered]
        ready = [n for n in left if not (modules[n][1] & set(left)) - {n}]
        ordered.extend(ready or left[:1])
    return [(name, modules[name][0]) for name in ordered]


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
        # Sizes the spin again before a batch (the GPU's clock may have moved).
        self.before_batch: Callable[[], Any] = lambda: None

    def __call__(self):
        result = self._launch()
        self._spin()
        return result

    def __getattr__(self, name: str):
        return getattr(self._launch, name)


def plant_on_cpu(launch: Callable[[], Any], plant_us: float) -> Planted:
    """The interpreter's plant: a busy wait of `plant_us` after the launch,
    on the wall clock its samples are timed by."""

    return Planted(launch, lambda: host_wait(plant_us), plant_us)


def host_wait(us: float) -> None:
    """Busy-waits `us` microseconds on the host."""
    until = time.perf_counter() + us / 1e6
    while time.perf_counter() < until:
        pass


def tensor_core_burn(torch) -> Callable[[], Any]:
    """A kernel that draws about the power a large GEMM draws: one bf16
    matmul, 1024 x 1024 by 1024 x 4096 (8.6 GFLOP: several microseconds on
    an H200, and 128 to 256 output tiles, enough to keep every SM busy),
    into a buffer of its own. The plant queues it instead of idling where
    the plant is long enough (plant_on_gpu)."""
    device = torch.device("cuda", torch.cuda.current_device())
    a = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
    b = torch.randn(1024, 4096, device=device, dtype=torch.bfloat16)
    c = torch.empty(1024, 4096, device=device, dtype=torch.bfloat16)
    return lambda: torch.matmul(a, b, out=c)


def plant_on_gpu(torch, launch: Callable[[], Any], plant_us: float, burn: Callable[[], Any] | None = None) -> Planted:
    """The GPU's plant: kernels queued after the launch that keep the GPU
    busy for `plant_us`, and the host held until `plant_us` after it began
    queueing them, so that a launch with them takes `plant_us` longer
    whichever side bounds it. Where the GPU does (the host queues ahead of
    it), the kernels add their time and the host's wait is hidden; where
    the host does (many small kernels, Python launch costs), the GPU waits
    for the host anyway and kernels alone would run inside that wait.

    The kernels: as many `burn` calls as fit (tensor_core_burn: a matmul
    that draws the power a large GEMM does), then a spin (`torch.cuda._sleep`,
    which counts SM clock cycles) for the rest. Why burn rather than spin:
    a kernel under the GPU's power cap runs at the clock the cap allows;
    an idle spin after it lowers the power drawn, the clock climbs, and the
    next launch runs faster, so the launch loses less than was planted (on
    an H200, 2026-12-02, an idle 3 % plant showed 0.7-3.1 % at gpt-oss's
    M >= 1536 pairs). A plant shorter than one burn only spins: there the
    kernel is short, and the power it draws is not what bounds it.

    Sizing: k burns and a spin of c cycles behind the launch add
    k b + g + c / r microseconds, b what one more burn costs there (its
    time and its gap), g what one more kernel costs (the gap between two
    kernels and an empty spin), r the cycles a microsecond the spin runs
    at; k = floor((plant - g) / b), c = (plant - g - k b) r. All three are
    timed with the host ahead of the GPU: a hold spin of about 200 µs
    first, then event pairs around an empty spin, a probe spin as long as
    the planned one and the planned burns, all queued behind the launch
    while the hold runs (timed behind a bare short launch, g held the host's
    launch latency and the spin came out short). Timed before each batch
    (`Planted.before_batch`, which the worker calls), the medians of the
    last five taken, so a GPU that falls under its power cap plants as
    long as asked. A CUDA graph keeps the plan it was captured with (and no
    host wait)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        raise RuntimeError("torch.cuda._sleep is missing: this torch cannot plant a slowdown")

    def event():
        return torch.cuda.Event(enable_timing=True)

    # About 100 µs at 2 GHz: the first probe, before a plan exists. The hold
    # (about 200 µs) keeps the GPU busy while the host queues what is timed:
    # the calls into CUDA from Python, tens of microseconds on a loaded host.
    state: dict[str, Any] = {"cycles": 0, "probe": 200_000, "burns": 0, "gaps": [], "rates": [], "burn_us": []}
    hold_cycles = 400_000

    def time_behind_launch():
        """One timing of (g, r, b) behind the launch."""
        probe = state["probe"]
        burns = max(1, state["burns"])
        e0, e1, e2, e3 = event(), event(), event(), event()
        launch()
        sleep(hold_cycles)
        e0.record()
        sleep(0)
        e1.record()
        sleep(probe)
        e2.record()
        if burn is not None:
            for _ in range(burns):
                burn()
        e3.record()
        e3.synchronize()
        gap = e0.elapsed_time(e1) * 1e3
        spun = e1.elapsed_time(e2) * 1e3 - gap
        state["gaps"] = (state["gaps"] + [gap])[-5:]
        state["rates"] = (state["rates"] + [probe / max(spun, 1e-3)])[-5:]
        if burn is not None:
            state["burn_us"] = (state["burn_us"] + [e2.elapsed_time(e3) * 1e3 / burns])[-5:]

    def median(values: list) -> float:
        return sorted(values)[len(values) // 2]

    def size() -> float:
        time_behind_launch()
        gap, per_us = median(state["gaps"]), median(state["rates"])
        state["gap"] = gap
        rest = max(0.0, plant_us - gap)
        if burn is not None:
            burn_us = median(state["burn_us"])
            state["burn_each"] = burn_us
            state["burns"] = int(rest // burn_us) if burn_us > 0 else 0
            rest -= state["burns"] * burn_us
        state["cycles"] = max(0, int(round(rest * per_us)))
        # The next probe as long as the spin (at least about 10 µs).
        state["probe"] = max(state["cycles"], 20_000)
        return per_us

    def spin():
        # The host's deadline counts from before the kernels are queued: the
        # host's path gains the plant, not the plant and the queueing.
        until = time.perf_counter() + plant_us / 1e6
        for _ in range(state["burns"]):
            burn()
        sleep(state["cycles"])
        while time.perf_counter() < until:
            pass

    for _ in range(2):
        time_behind_launch()
    per_us = size()
    planted = Planted(launch, spin, max(plant_us, state["gap"]))
    planted.before_batch = size
    burned = f"{state['burns']} burns of {state['burn_each']:.2f} us, " if burn is not None else ""
    print(
        f"tunelab worker: planted {planted.planted_us:.2f} us a launch (asked {plant_us:.2f}): "
        f"behind a launch, one more kernel {state['gap']:.2f} us, {per_us:.0f} cycles/us; "
        f"{burned}spin {state['cycles']} cycles, then {plant_us:.2f} us on the host",
        file=sys.stderr,
    )
    return planted
