"""tunelab.interpreter: Triton's interpreter without its repeated swaps of
triton.language. The rule is checked on a stand-in for Triton's interpreter
module (which calls are swapped, which skipped); under the interpreter, a
kernel of nested helpers gives the same bits with one swap a launch."""

import os
import textwrap
import types

import pytest
import torch

import triton
import triton.language as tl
from tunelab import interpreter

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# A stand-in for triton.runtime.interpreter: its launch and helper calls go
# through `_patch_lang` by name, as Triton's do, and record what they swapped.
STAND_IN = textwrap.dedent(
    """
    swaps = []

    class Scope:
        def __init__(self, fn):
            self.fn = fn
        def restore(self):
            swaps.append(("restore", self.fn.__name__))

    def _patch_lang(fn):
        swaps.append(("swap", fn.__name__))
        return Scope(fn)

    class GridExecutor:
        def __call__(self, kernel, helpers):
            scope = _patch_lang(kernel)
            try:
                for helper in helpers:
                    InterpretedFunction()(helper)
            finally:
                scope.restore()

    class InterpretedFunction:
        def __call__(self, fn):
            _patch_lang(fn)
            return fn()
    """
)


def _stand_in():
    module = types.ModuleType("stand_in_interpreter")
    exec(STAND_IN, module.__dict__)
    return module


def _fn(name, **modules):
    """A function whose globals hold `modules`, as a helper's module would."""
    fn = types.FunctionType(compile("def f(): pass", name, "exec").co_consts[0], dict(modules), name)
    return fn


@pytest.fixture
def reinstall():
    """Each test installs what it needs; the process's own install comes back after."""
    was = bool(interpreter._INSTALLED)
    interpreter.uninstall()
    yield
    interpreter.uninstall()
    if was:
        interpreter.install()


def test_inside_a_launch_a_helper_that_sees_nothing_new_is_not_swapped(reinstall):
    fake = _stand_in()
    assert interpreter.install(fake)
    kernel, same = _fn("kernel", tl=tl), _fn("same", tl=tl, triton=triton)
    core_helper, core_again = _fn("core_helper", core=tl.core), _fn("core_again", core=tl.core, tl=tl)
    fake.GridExecutor()(kernel, [same, same, core_helper, core_again, same])
    # The kernel's own swap, then only the helper that sees a module the launch has not swapped.
    assert fake.swaps == [("swap", "kernel"), ("swap", "core_helper"), ("restore", "kernel")]
    # A call outside any launch is Triton's, and the next launch starts afresh.
    fake.swaps.clear()
    fake.InterpretedFunction()(same)
    fake.GridExecutor()(kernel, [same])
    assert fake.swaps == [("swap", "same"), ("swap", "kernel"), ("restore", "kernel")]


def test_a_launch_that_fails_leaves_no_launch_behind(reinstall):
    fake = _stand_in()
    assert interpreter.install(fake)
    kernel = _fn("kernel", tl=tl)

    def broken():
        raise RuntimeError("a helper failed")

    with pytest.raises(RuntimeError):
        fake.GridExecutor()(kernel, [broken])
    fake.swaps.clear()
    fake.InterpretedFunction()(kernel)  # outside a launch again: swapped
    assert fake.swaps == [("swap", "kernel")]


def test_an_interpreter_it_was_not_written_for_is_left_alone(reinstall, monkeypatch):
    fake = _stand_in()
    fake.InterpretedFunction.__call__ = lambda self, fn: None  # no longer swaps by name
    original = fake._patch_lang
    assert not interpreter.install(fake)
    assert fake._patch_lang is original
    monkeypatch.setenv("TUNELAB_INTERPRETER_REPATCH", "1")
    assert not interpreter.install(_stand_in())
    assert not interpreter._INSTALLED


@triton.jit
def _scaled(x, s):
    return x * s


@triton.jit
def _twice_scaled(x, s):
    return _scaled(_scaled(x, s), s) + tl.sum(x, axis=0)


@triton.jit
def _helpers_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, _twice_scaled(x, 3.0) - _scaled(x, 0.5))


@pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter only")
def test_a_kernel_of_helpers_gives_the_same_bits_with_one_swap_a_launch(reinstall):
    from triton.runtime import interpreter as triton_interpreter

    swaps = []
    original = triton_interpreter._patch_lang

    def counted(fn):
        swaps.append(fn.__name__)
        return original(fn)

    x = torch.randn(64, dtype=torch.float32)

    def run():
        out = torch.empty_like(x)
        _helpers_kernel[(4,)](x, out, BLOCK=16)
        return out

    triton_interpreter._patch_lang = counted
    try:
        expected = run()
        # The launch's, then each program's five helper calls: tl.sum is a
        # @triton.jit helper too, in a module that sees triton.language.core.
        assert len(swaps) == 1 + 4 * 5 and swaps.count("sum") == 4
        swaps.clear()
        assert interpreter.install()
        assert torch.equal(run(), expected)
        # The kernel sees triton.language; tl.sum's module sees its core as
        # well, which the launch had not swapped: swapped once, for the first.
        assert swaps == ["_helpers_kernel", "sum"]
    finally:
        interpreter.uninstall()
        triton_interpreter._patch_lang = original
