"""The user-problem contract, typed: what a worker calls on a problem.

A manifest names a problem class, `problem: "my_pkg.problems:MyProblem"` (or a
builtin: `gemm`, `moe`). The worker builds one instance per shape and calls
the methods below; docs/python-api.md ("Writing a problem") says what each
must do. These are `typing.Protocol` classes: a problem does not inherit from
them, it only has to have these methods, and a type checker (mypy, as CI
runs it: `just typecheck`) says whether it does:

    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        from tunelab.protocols import ProblemClass, CompilingMethod
        _problem: ProblemClass = MyProblem
        _method: CompilingMethod[MyProblem] = MyTritonMethod()

This module imports nothing heavy (no torch), so workers and type checkers
can import it anywhere.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol, TypeVar

Shape = dict[str, Any]
"""A shape: the manifest's fields for one point (`{"M": 64, "N": 2880, "dtype": "bf16"}`).
Values are JSON scalars: int, float, str, bool."""

Config = dict[str, Any]
"""A method's config: its fixed `params`, the space point and the `derived`
values, merged by the runner. A method ignores keys it does not know."""

Inputs = dict[str, Any]
"""What `Problem.inputs` builds and `reference` and `Method.bind` read: tensors by name."""

Tensor = Any
"""A torch.Tensor (torch is not imported here)."""

Device = Any
"""A torch.device: the lane's GPU, or the CPU in interpreter mode."""


class Launch(Protocol):
    """A method bound to one shape's inputs and one config.

    `out` is preallocated (the worker poisons it with NaN before the
    correctness check); each call computes the result into `out`, and is
    what gets timed.
    """

    out: Tensor

    def __call__(self) -> None: ...


P_contra = TypeVar("P_contra", contravariant=True)


class Method(Protocol[P_contra]):
    """One way to compute a problem: a Triton kernel, a torch op, ...

    `bind` allocates the output and whatever the launch needs, outside the
    timed region. `P_contra` is the problem class it works on.
    """

    def bind(self, problem: P_contra, inputs: Inputs, config: Config) -> Launch: ...


class CompilingMethod(Method[P_contra], Protocol[P_contra]):
    """A method that can compile without launching (Triton kernels).

    Compile workers call `compile` ahead of the GPU, to fill Triton's cache;
    it returns whether it compiled anything (`None` counts as true).
    """

    def compile(self, problem: P_contra, config: Config) -> Optional[bool]: ...


class TypedMethod(Method[P_contra], Protocol[P_contra]):
    """A method that declares its config keys and their types.

    `config_types` maps each config key the method takes to `int`, `float`,
    `str` or `bool` (`{}` for a method that takes none). The runner checks a
    manifest's `params`, space and derived values against it before the run,
    so a misspelt key or a value of the wrong type is an error at its own
    line. Without the attribute nothing is checked.
    """

    @property
    def config_types(self) -> Mapping[str, type]: ...


class AvailabilityMethod(Method[P_contra], Protocol[P_contra]):
    """A method that may not run in every worker (a library that is not
    installed, a GPU it does not support).

    `unavailable(problem)` returns a one-line reason it cannot run this
    problem here, or None when it can. The worker reports the reason in
    `describe`, and the runner records the method's jobs as skipped with it
    instead of failing them.
    """

    def unavailable(self, problem: P_contra) -> Optional[str]: ...


class Problem(Protocol):
    """A problem at one shape: its sizes, inputs, reference and methods.

    Constructing it and `methods()` must not allocate device memory: the
    runner asks for flops, bytes and the method names (`describe`) without a
    GPU.
    """

    def flops(self) -> float:
        """Useful floating-point operations of one call."""
        ...

    def bytes(self) -> float:
        """The fewest bytes any method must move to or from memory."""
        ...

    def inputs(self, seed: int, device: Device) -> Inputs:
        """Fresh inputs, the same for the same seed."""
        ...

    def reference(self, inputs: Inputs) -> Tensor:
        """The expected output, of `out`'s shape, accumulated in fp32."""
        ...

    def methods(self) -> Mapping[str, Method[Any]]:
        """Method name (a manifest's `kernel:`) -> method."""
        ...


class ProblemWithBytesFor(Problem, Protocol):
    """A problem whose minimal bytes depend on the inputs (a MoE moves only the
    experts its routing selects). The worker uses `bytes_for` when a problem
    has it, and `bytes` when it has not or `bytes_for` fails."""

    def bytes_for(self, inputs: Inputs) -> float: ...


class ProblemClass(Protocol):
    """What a manifest's `problem:` names: a class (or any callable) that
    builds a Problem from a shape, raising ValueError for a shape it cannot
    take."""

    def __call__(self, shape: Shape) -> Problem: ...
