"""Triton's interpreter without its repeated patching of `triton.language`.

Under TRITON_INTERPRET=1, Triton (3.x, 3.9 included) swaps the builtins of
`triton.language` for interpreted ones when a kernel is launched, and puts
them back when it returns. It also does the whole swap again each time the
kernel calls a `@triton.jit` helper: a scan of the language modules' members
(`inspect.getmembers`) per call, kept until the launch ends. Inside one
launch that second swap finds every builtin already swapped, so it changes
nothing, yet it costs about 2 ms a call. tunelab's kernels are built from
helpers (the MXFP4 GEMV, the in-kernel alignment), so on a 2-core machine
it was more than half the interpreter's time: one MXFP4 GEMV launch at E=8
N=32 M=4 took 7.3 s, and 2.7 s without the repeats (2026-12-03, Triton 3.9).

`install()` skips a helper's swap when the launch it runs in has already
swapped every language module the helper sees; anything else (a helper that
sees a module the kernel does not, a call outside a launch) goes to Triton's
own code, unchanged. It installs only where Triton's interpreter has the
functions it wraps, used the way described above, and reports whether it
did. Workers in interpreter mode and the tests install it;
TUNELAB_INTERPRETER_REPATCH=1 leaves Triton's interpreter as it is.
"""

from __future__ import annotations

import inspect
import os
import types
from typing import Any

_INSTALLED: dict[str, Any] = {}


class _NothingToRestore:
    """What a skipped swap returns: Triton's swaps return a scope to restore."""

    def restore(self) -> None:
        pass


def _uses(method: Any, name: str) -> bool:
    code = getattr(method, "__code__", None)
    return code is not None and name in code.co_names


def install(interpreter: types.ModuleType | None = None) -> bool:
    """Skip the repeated swaps from now on, in this process. True if installed
    (now or before); False where Triton's interpreter is not the one this was
    written against, or TUNELAB_INTERPRETER_REPATCH=1 asks for Triton's own.
    `interpreter` stands in for triton.runtime.interpreter in tests."""
    if os.environ.get("TUNELAB_INTERPRETER_REPATCH", "0") == "1":
        return False
    if _INSTALLED:
        return True
    import triton.language as tl
    import triton.runtime.interpreter

    module: Any = triton.runtime.interpreter if interpreter is None else interpreter

    patch_lang = getattr(module, "_patch_lang", None)
    grid_executor = getattr(module, "GridExecutor", None)
    interpreted = getattr(module, "InterpretedFunction", None)
    if not (
        callable(patch_lang)
        and grid_executor is not None
        and interpreted is not None
        and _uses(grid_executor.__call__, "_patch_lang")
        and _uses(interpreted.__call__, "_patch_lang")
    ):
        return False
    languages = (tl, tl.core)
    # One entry while a kernel runs (kernels do not launch kernels): the ids of
    # the language modules swapped for it, empty until its own swap (a kernel
    # sees triton.language, which Triton asserts).
    launch: list[set[int]] = []

    def language_modules(fn: Any) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and any(v is m for m in languages)}

    def swap_once(fn: Any) -> Any:
        if not launch:
            return patch_lang(fn)  # a call outside a launch: Triton's way
        swapped = launch[-1]
        seen = language_modules(fn)
        if swapped and seen <= swapped:
            return _NothingToRestore()
        swapped |= seen
        return patch_lang(fn)

    run_grid = grid_executor.__call__

    def run_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        launch.append(set())
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            launch.pop()

    module._patch_lang = swap_once
    grid_executor.__call__ = run_launch
    _INSTALLED.update(module=module, patch_lang=patch_lang, grid_executor=grid_executor, run_grid=run_grid)
    return True


def uninstall() -> None:
    """Triton's interpreter as it was (for tests that compare the two)."""
    if not _INSTALLED:
        return
    _INSTALLED["module"]._patch_lang = _INSTALLED["patch_lang"]
    _INSTALLED["grid_executor"].__call__ = _INSTALLED["run_grid"]
    _INSTALLED.clear()
