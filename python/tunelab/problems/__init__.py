"""Builtin problems and the loader for user problems named "module:Class"."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunelab.protocols import ProblemClass

# Short names a manifest may use for `problem:`. Values are import paths so a
# worker only imports the problem it serves.
BUILTINS = {
    "gemm": "tunelab.problems.gemm:Gemm",
    "moe": "tunelab.problems.moe:FusedMoE",
}


def resolve(name: str) -> "ProblemClass":
    """Return the problem class for a builtin short name or "module.path:Class".

    What it returns is trusted to meet tunelab.protocols.ProblemClass; the
    worker classes whatever it does not as a problem_error.
    """
    target = BUILTINS.get(name, name)
    if ":" not in target:
        known = ", ".join(sorted(BUILTINS))
        raise LookupError(f"unknown problem {name!r}: use a builtin ({known}) or 'module.path:ClassName'")
    module_name, _, class_name = target.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise LookupError(f"module {module_name!r} has no class {class_name!r}") from None
