"""An example user problem, defined outside the tunelab package.

A manifest names it as `problem: "my_problems:Axpy"`, with this folder on the
worker's PYTHONPATH. It shows everything a user problem needs: a shape, flop
and byte counts, seeded inputs, an fp32 reference and methods whose `bind`
returns a Launch (an `out` tensor plus a no-argument call). It meets the
contract in tunelab.protocols, which mypy checks (`just typecheck`; the
assignments at the end).

Besides a real Triton kernel it carries deliberately broken methods and a
noisy variant, which tunelab's tests use to exercise the worker's failure
paths.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from tunelab.protocols import Config, Device, Inputs, Method, ProblemClass, Shape, Tensor

_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    x = tl.load(x_ptr + offsets, mask=inside).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=inside).to(tl.float32)
    tl.store(out_ptr + offsets, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=inside)


class Launch:
    """What `bind` returns: the preallocated `out` and a call that fills it."""

    def __init__(self, run, out: Tensor):
        self._run = run
        self.out = out

    def __call__(self) -> None:
        self._run()


class Axpy:
    """out = alpha * x + y over N elements."""

    def __init__(self, shape: Shape):
        if "N" not in shape:
            raise ValueError("Axpy needs shape key N")
        self.n = int(shape["N"])
        self.alpha = float(shape.get("alpha", 2.0))
        self.dtype = _DTYPES[shape.get("dtype", "fp32")]

    def flops(self) -> float:
        return 2.0 * self.n

    def bytes(self) -> float:
        return 3.0 * self.n * torch.tensor([], dtype=self.dtype).element_size()

    def inputs(self, seed: int, device: Device) -> Inputs:
        generator = torch.Generator(device=device).manual_seed(seed)
        x = torch.rand(self.n, generator=generator, device=device).to(self.dtype)
        y = torch.rand(self.n, generator=generator, device=device).to(self.dtype)
        return {"x": x, "y": y}

    def reference(self, inputs: Inputs) -> Tensor:
        return self.alpha * inputs["x"].float() + inputs["y"].float()

    def methods(self) -> dict[str, Method[Axpy]]:
        return {
            "triton": TritonAxpy(),
            "torch": TorchAxpy(),
            "off_by_one": OffByOne(),
            "nan": MakesNan(),
            "faults": Faults(),
            "syncs": Syncs(),
            "needs_frobnicator": NeedsFrobnicator(),
            "broken_hook": BrokenHook(),
        }


def _output(problem: Axpy, inputs: Inputs) -> Tensor:
    return torch.empty_like(inputs["x"])


class TritonAxpy:
    def bind(self, problem: Axpy, inputs: Inputs, config: Config) -> Launch:
        out = _output(problem, inputs)
        block = int(config.get("BLOCK", 64))
        grid = (triton.cdiv(problem.n, block),)

        def run():
            axpy_kernel[grid](inputs["x"], inputs["y"], out, problem.alpha, problem.n, BLOCK=block)

        return Launch(run, out)


class TorchAxpy:
    def bind(self, problem: Axpy, inputs: Inputs, config: Config) -> Launch:
        out = _output(problem, inputs)

        def run():
            torch.add(inputs["y"], inputs["x"], alpha=problem.alpha, out=out)

        return Launch(run, out)


class OffByOne:
    """Right everywhere except the last element, which is off by one."""

    def bind(self, problem, inputs, config):
        out = _output(problem, inputs)

        def run():
            torch.add(inputs["y"], inputs["x"], alpha=problem.alpha, out=out)
            out[-1] += 1.0

        return Launch(run, out)


class MakesNan:
    """Right everywhere except the first element, which is NaN."""

    def bind(self, problem, inputs, config):
        out = _output(problem, inputs)

        def run():
            torch.add(inputs["y"], inputs["x"], alpha=problem.alpha, out=out)
            out[0] = float("nan")

        return Launch(run, out)


class Faults:
    """Fails the way a kernel that touched bad memory fails."""

    def bind(self, problem, inputs, config):
        def run():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        return Launch(run, _output(problem, inputs))


class Syncs:
    """Right, but reads a value back to the host inside the call: no CUDA graph can capture it."""

    def bind(self, problem, inputs, config):
        out = _output(problem, inputs)

        def run():
            alpha = float(torch.tensor(problem.alpha, device=out.device).item())  # the host sync
            torch.add(inputs["y"], inputs["x"], alpha=alpha, out=out)

        return Launch(run, out)


class NeedsFrobnicator(TorchAxpy):
    """A method that says it cannot run here (the optional `unavailable` hook)."""

    def unavailable(self, problem):
        return "needs the frobnicator library"


class BrokenHook(TorchAxpy):
    """A method whose `unavailable` hook itself fails."""

    def unavailable(self, problem):
        raise KeyError("frobnicator_version")


class NoisyAxpy(Axpy):
    """Axpy that prints to stdout everywhere a user's code might, from Python and from the fd."""

    def __init__(self, shape: dict):
        print("NoisyAxpy: constructing")
        super().__init__(shape)

    def inputs(self, seed: int, device) -> dict:
        print("NoisyAxpy: making inputs")
        os.write(1, b"NoisyAxpy: raw write to fd 1\n")
        return super().inputs(seed, device)

    def methods(self) -> dict:
        return {"torch": NoisyTorchAxpy()}


class NoisyTorchAxpy(TorchAxpy):
    def bind(self, problem, inputs, config):
        launch = super().bind(problem, inputs, config)
        inner = launch._run

        def run():
            print("NoisyTorchAxpy: launching", flush=True)
            os.write(1, b'{"id": 999, "ok": true}\n')  # looks like a response; must not reach the runner
            inner()

        return Launch(run, launch.out)


if TYPE_CHECKING:
    # The contract of tunelab.protocols, checked by mypy (`just typecheck`).
    _problem: ProblemClass = Axpy
    _noisy: ProblemClass = NoisyAxpy
    _triton: Method[Axpy] = TritonAxpy()
