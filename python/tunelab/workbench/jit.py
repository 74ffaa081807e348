"""The worker's hold on Triton's JIT.

Every Triton compile and launch a method makes, through `kernel[grid](...)` or
`kernel.warmup(...)` (which tunelab's direct launches use), goes through
`JITFunction.run`. `install()` wraps it once per worker process; while a
`JobContext` is active (`active(ctx)`), the wrapper:

- adds the job's compile options (`COMPILE_OPTIONS` found in its config:
  `maxnreg`, `enable_fp_fusion`, `launch_pdl`, ...) to every kernel the method
  compiles, overriding what the method passes itself, so a manifest axis can
  vary them for any Triton method, whatever its kernels' code;
- for an `ir:` method, adds `ir_override` (a content-addressed copy of the IR
  file, see `irfile`) to the kernel whose name is the file's entry, so that
  kernel is compiled from the file and launched by the method's own call;
- records each compiled kernel the job's compile, check or warm-up returned,
  so the worker can report its registers, spills and shared memory and write
  its IR.

Compile worker and lane go through the same wrapper with the same context, so
their cache keys agree and the lane finds the compile worker's binary.

Triton's interpreter never compiles (its kernels are not JITFunctions): there
nothing is recorded, compile options have no effect and `ir:` methods cannot
run (the runner skips them).
"""

from __future__ import annotations

import contextlib
from typing import Any
import os
import subprocess
import tempfile

# Triton compile options a config may carry, with their types: the worker
# passes them to every kernel of a Triton method (the CUDA backend's names;
# on HIP, those its options have). `num_warps` and `num_stages` are not here:
# methods pass them per kernel themselves.
COMPILE_OPTIONS = {
    "maxnreg": int,
    "enable_fp_fusion": bool,
    "launch_pdl": bool,
    "launch_cooperative_grid": bool,
    "sched4reg": bool,
    # AMD
    "waves_per_eu": int,
    "matrix_instr_nonkdim": int,
    "kpack": int,
}

_installed = False
_active = None


class JobContext:
    """What a job's Triton launches compile with, and what they compiled."""

    def __init__(self, config: dict | None = None, ir=None, ir_path=None, modules: dict | None = None):
        self.options = {k: v for k, v in (config or {}).items() if k in COMPILE_OPTIONS and v is not None}
        # Modules the job runs from other files (an A/B side's code, tunelab.variant):
        # swapped in while the context is active.
        self.modules = dict(modules or {})
        self.ir = ir  # an irfile.IrFile, or None
        self.ir_path = str(ir_path) if ir_path is not None else None
        self.ir_applied = False
        self.recording = True
        # hash -> compiled kernel, in the order first seen
        self.kernels: dict[str, Any] = {}
        # JIT function names launched, for a message when the IR's entry is not among them
        self.launched: list[str] = []

    def without_ir(self) -> "JobContext":
        """The same options, compiling the source (to compare the IR's signature with)."""
        return JobContext(self.options, modules=self.modules)

    def kwargs(self, fn, kwargs: dict) -> dict:
        name = fn.__name__
        if name not in self.launched:
            self.launched.append(name)
        if not self.options and self.ir is None:
            return kwargs
        kwargs = dict(kwargs, **self.options)
        if self.ir is not None and name == self.ir.entry:
            kwargs["ir_override"] = self.ir_path
            self.ir_applied = True
        return kwargs

    def record(self, compiled):
        if self.recording and compiled is not None and hasattr(compiled, "asm"):
            self.kernels.setdefault(getattr(compiled, "hash", id(compiled)), compiled)


def install() -> bool:
    """Wrap JITFunction.run (once per process). False where Triton has none."""
    global _installed
    if _installed:
        return True
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # noqa: BLE001 - no Triton, nothing to hold
        return False
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        ctx = _active
        if ctx is None:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        kernel = original(self, *args, grid=grid, warmup=warmup, **ctx.kwargs(self, kwargs))
        ctx.record(kernel)
        return kernel

    run.__wrapped__ = original  # type: ignore[attr-defined]
    JITFunction.run = run
    _installed = True
    return True


@contextlib.contextmanager
def active(ctx: JobContext | None):
    """Make `ctx` the job context of every Triton launch inside, with the
    modules it replaces swapped in (tunelab.variant)."""
    global _active
    install()
    from tunelab import variant

    previous = _active
    _active = ctx
    try:
        with variant.swapped(ctx.modules if ctx is not None else None):
            yield ctx
    finally:
        _active = previous


# --------------------------------------------------------------------------
# what a compiled kernel uses


def resources(compiled, load: bool = False) -> dict:
    """Registers per thread, spilled registers and shared memory of a compiled kernel.

    `n_regs` and `n_spills` are the driver's (CU_FUNC_ATTRIBUTE_NUM_REGS, and
    LOCAL_SIZE_BYTES / 4: Triton's definition) once the kernel is loaded on a
    GPU; `load` loads it first (a lane). Not loaded (a compile worker), they are
    read from the cubin with cuobjdump's resource usage, which states the same
    two numbers; None where neither is possible (HIP without a GPU).
    `shared` is Triton's dynamic shared memory in bytes (metadata.shared).
    """
    md = compiled.metadata
    n_regs = getattr(compiled, "n_regs", None)
    n_spills = getattr(compiled, "n_spills", None)
    if n_regs is None and load:
        try:
            compiled._init_handles()
            n_regs, n_spills = compiled.n_regs, compiled.n_spills
        except Exception:  # noqa: BLE001 - out of resources, no GPU: fall back to the binary
            n_regs = None
    if n_regs is None:
        n_regs, n_spills = static_registers(compiled)
    return {
        "name": str(compiled.name),
        "n_regs": None if n_regs is None else int(n_regs),
        "n_spills": None if n_spills is None else int(n_spills),
        "shared": int(getattr(md, "shared", 0) or 0),
        "num_warps": int(getattr(md, "num_warps", 0) or 0),
        "num_stages": int(getattr(md, "num_stages", 0) or 0),
    }


def static_registers(compiled):
    """(registers, spilled registers) from a CUDA kernel's cubin, or (None, None)."""
    cubin = getattr(compiled, "asm", {}).get("cubin") if hasattr(compiled, "asm") else None
    if not isinstance(cubin, (bytes, bytearray)):
        return None, None
    try:
        from triton import knobs

        tool = knobs.nvidia.cuobjdump.path
    except Exception:  # noqa: BLE001 - a Triton without the tool knob
        return None, None
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        text = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, timeout=60).stdout
    except Exception:  # noqa: BLE001 - no cuobjdump: the numbers stay unknown
        return None, None
    finally:
        os.unlink(path)
    return parse_res_usage(text, str(compiled.name))


def parse_res_usage(text: str, name: str):
    """(REG, LOCAL / 4) of function `name` in `cuobjdump -res-usage` output."""
    import re

    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == f"Function {name}:" and i + 1 < len(lines):
            usage = dict(re.findall(r"(\w+(?:\[\d+\])?):(\d+)", lines[i + 1]))
            if "REG" in usage:
                return int(usage["REG"]), int(usage.get("LOCAL", 0)) // 4
    return None, None
