"""Compiling Triton kernels for a GPU this process never touches.

A compile worker only fills Triton's on-disk cache for a lane on the same
machine. It needs the lane GPU's target (backend, architecture, warp size),
which the runner passes as ``--target cuda:90:32`` from its own device
discovery, and nothing else from the GPU: no driver calls, no CUDA context, no
device memory. So sixteen compile workers cost sixteen CPU cores and nothing
on the GPU, and they compile while the lane's worker is still starting.

Triton's JIT asks its *active driver* for the current device, stream and
target before it compiles (``kernel.warmup`` and a launch take the same path,
which is what makes their cache keys agree). ``TargetOnlyDriver`` answers
those three questions from the target alone; anything else a driver does
(loading a binary, launching) is exactly what a compile worker must never do,
so those attributes do not exist here and fail loudly if reached.
"""

import contextlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    backend: str  # "cuda" or "hip"
    arch: object  # int compute capability (90) for cuda, "gfx942" for hip
    warp_size: int

    def __str__(self):
        return f"{self.backend}:{self.arch}:{self.warp_size}"


def parse_target(text: str) -> Target:
    """``cuda:90:32`` or ``hip:gfx942:64``, as the runner writes it."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"target {text!r} must be BACKEND:ARCH:WARP_SIZE, e.g. cuda:90:32 or hip:gfx942:64")
    backend, arch_text, warp = parts
    arch: "int | str" = arch_text
    if backend not in ("cuda", "hip"):
        raise ValueError(f"target backend {backend!r} must be cuda or hip")
    if backend == "cuda":
        if not arch_text.isdigit():
            raise ValueError(f"a cuda target's arch is the compute capability as digits (90 for sm_90), got {arch!r}")
        arch = int(arch_text)
    if not warp.isdigit() or int(warp) <= 0:
        raise ValueError(f"target warp size must be a positive integer, got {warp!r}")
    return Target(backend, arch, int(warp))


class TargetOnlyDriver:
    """Stands in for Triton's CUDA/HIP driver while compiling for `target`."""

    def __init__(self, target: Target):
        from triton.backends.compiler import GPUTarget

        self._target = GPUTarget(target.backend, target.arch, target.warp_size)

    @staticmethod
    def is_active():
        return True

    def get_current_target(self):
        return self._target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def compile_for(target: Target):
    """Make Triton compile for `target` from now on, in this process."""
    import triton.runtime

    triton.runtime.driver.set_active(TargetOnlyDriver(target))


def prebuild_host_code(compiled) -> bool:
    """Build the C launcher of a just-compiled kernel into the shared cache.

    Triton launches a kernel through a small C module generated for its
    signature and built with the host compiler (about a second each), plus a
    one-off `cuda_utils` module; a lane would otherwise build both at its first
    launch, while the GPU waits. Building them needs the CUDA headers and
    libcuda to link against, not a GPU. Only in a compile worker (a target-only
    driver is active), only for CUDA, and best effort: these are Triton
    internals, so a version that moved them just leaves the work to the lane.
    """
    import triton.runtime

    driver = triton.runtime.driver.active
    if not isinstance(driver, TargetOnlyDriver) or driver.get_current_target().backend != "cuda":
        return False
    global _host_code_failed
    if compiled is None or _host_code_failed:
        return False
    # One builder at a time: in a cold cache every worker's first kernel needs
    # the same modules, and sixteen host compilers building one file at once
    # take each other's cores. A worker that finds the lock taken skips this
    # kernel's launcher; a later kernel with the same signature (or the lane)
    # finds it built.
    try:
        with _host_code_lock() as mine:
            if not mine:
                return False
            from triton.backends.nvidia import driver as nvidia

            nvidia.CudaUtils()
            nvidia.CudaLauncher(compiled.src, compiled.metadata)
            return True
    except Exception as exc:  # noqa: BLE001 - see the docstring
        _host_code_failed = True
        import sys

        print(f"tunelab: launchers are left to the lane (prebuilding failed: {exc!r})", file=sys.stderr)
        return False


_host_code_failed = False


@contextlib.contextmanager
def _host_code_lock():
    """Yields True while holding the cache's host-code lock, False if another worker holds it."""
    import fcntl
    import os

    from triton import knobs

    cache_dir = knobs.cache.dir or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    os.makedirs(cache_dir, exist_ok=True)
    with open(os.path.join(cache_dir, "tunelab-host-code.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
