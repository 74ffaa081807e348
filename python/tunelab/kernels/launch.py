"""Launching a compiled Triton kernel without the JIT's per-call work.

`kernel[grid](...)` re-derives the specialisation of every argument and looks
the compiled kernel up on each call: 16 µs of host time per launch on an H100
host (bench/tuning_speed.py), as long as a decode-size kernel runs. A bound
launch's arguments never change, so the kernel is looked up once and its
compiled runner called directly: 7.6 µs on the same host.
`TUNELAB_DIRECT_LAUNCH=0` turns this off (the JIT path is then used).
"""

import os

from tunelab.dtypes import stand_ins_active


def interpreting() -> bool:
    """Triton's interpreter runs the kernels (TRITON_INTERPRET=1): nothing is compiled."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def direct_launch_enabled(device) -> bool:
    return device.type == "cuda" and os.environ.get("TUNELAB_DIRECT_LAUNCH", "1") != "0"


def direct_runner(kernel, grid, args, kwargs):
    """A no-argument callable that launches `kernel` on `grid`, or None.

    None where the kernel cannot be looked up ahead (the caller then launches
    through the JIT). `args` are positional, `kwargs` the remaining parameters
    (constexprs) and launch options, exactly as for `kernel[grid](*args, **kwargs)`.
    """
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    if compiled is None:
        return None
    return compiled_runner(kernel, compiled, grid, args, kwargs)


def compiled_runner(kernel, compiled, grid, args, kwargs):
    """direct_runner for a kernel already compiled (`kernel.warmup`): the caller
    may need the binary first, e.g. its registers to size the grid."""
    names = [p.name for p in kernel.params]
    full = list(args) + [kwargs[name] for name in names[len(args) :]]
    if stand_ins_active():
        # Bound to stand-in tensors (a lane whose inputs the native worker
        # builds): there is no GPU to load the kernel on, and only the
        # native launch below is ever used.
        def launch():
            raise RuntimeError("a launch bound to stand-in tensors runs natively only")
    else:
        run = compiled[tuple(grid) + (1,) * (3 - len(grid))]  # the compiled runner indexes all three

        def launch():
            run(*full)

    # What a native launch needs (tunelab.native.triton_recipe): no Python per launch.
    launch.native = (kernel, compiled, tuple(grid), full)
    return launch
