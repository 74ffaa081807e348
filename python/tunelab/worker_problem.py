"""How the worker calls a problem and its methods, outside any one op:
making the problem, what a report calls a method (`_description`), its
config types as protocol names, whether it can run here, an output's
poison, a shape's bytes, and the check that an `ir:` method ran its IR.

Moved out of tunelab.worker, whose ops use them; none keeps state.
"""

import os
import sys
from typing import Any, Optional

from tunelab.failures import COMPILE_ERROR, PROBLEM_ERROR, WorkerError, summarize
from tunelab.worker_request import Job

_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool"}


def _description(method: Any) -> Optional[str]:
    """What a report calls the method: its `description` where it has one (a
    library method says which version of the library runs), else its class's
    docstring's first sentence. A description that fails to build is left out."""
    try:
        own = getattr(method, "description", None)
    except Exception as exc:  # noqa: BLE001 - the run goes on without it
        print(f"tunelab worker: a method's description failed: {summarize(exc)}", file=sys.stderr)
        own = None
    if isinstance(own, str) and own.strip():
        return own.strip().splitlines()[0]
    return _summary(type(method).__doc__)


_ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "cf")


def _summary(doc: Optional[str]) -> Optional[str]:
    """A method class's docstring's first sentence, whole however many lines
    it is wrapped over: what a report calls the method. The sentence ends at
    the first full stop followed by a space or the paragraph's end, outside
    brackets and backticks (a dotted module path or "e.g." does not end it)."""
    if not doc:
        return None
    paragraph = doc.strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in paragraph.splitlines() if line.strip())
    depth, quoted = 0, False
    for i, c in enumerate(text):
        if c == "`":
            quoted = not quoted
        elif quoted:
            continue
        elif c in "([":
            depth += 1
        elif c in ")]":
            depth = max(0, depth - 1)
        elif c == "." and depth == 0 and text[i + 1 : i + 2] == " ":
            if not text[:i].lower().endswith(_ABBREVIATIONS):
                return text[: i + 1]
    return text or None


def _type_names(method: str, declared: object) -> dict[str, str]:
    """A method's `config_types` ({key: int | float | str | bool}) as protocol names."""
    if not isinstance(declared, dict):
        raise WorkerError(PROBLEM_ERROR, f"method {method!r}: config_types must be a dict of key -> type")
    out = {}
    for key, kind in declared.items():
        if kind not in _TYPE_NAMES:
            raise WorkerError(
                PROBLEM_ERROR, f"method {method!r}: config_types[{key!r}] must be int, float, str or bool"
            )
        out[str(key)] = _TYPE_NAMES[kind]
    return out


def _make_problem(name: str, shape: dict[str, Any]) -> Any:
    from tunelab.problems import resolve

    return resolve(name)(shape)


def _require_ir_applied(job: Job, ctx: Any) -> None:
    """An IR file whose kernel the method never compiled ran nothing: a failure, not a silent source run."""
    if ctx.ir is not None and not ctx.ir_applied and ctx.launched:
        raise WorkerError(
            COMPILE_ERROR,
            f"IR file {job.ir} defines kernel @{ctx.ir.entry}, which method "
            f"{job.method!r} does not launch (it launches: {', '.join(ctx.launched)})",
        )


def _triton_cache_dir() -> str:
    from triton import knobs

    return knobs.cache.dir or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def _unavailable(method: Any, problem: Any) -> Optional[str]:
    """The method's one-line reason it cannot run here, or None (no hook: it can).

    A hook that raises does not fail the shape: its error becomes the reason."""
    hook = getattr(method, "unavailable", None)
    if hook is None:
        return None
    try:
        reason = hook(problem)
    except Exception as exc:  # noqa: BLE001 - a user's method may raise anything
        return f"its unavailable() check failed: {summarize(exc)}"
    return str(reason) if reason else None


def _poison(torch: Any, out: Any) -> None:
    """Fill the output with values no correct method leaves behind.

    NaN for floating outputs (any element the method fails to write then shows
    up in nan_count); the most negative value for integer outputs.
    """
    if out.dtype.is_floating_point or out.dtype.is_complex:
        out.fill_(float("nan"))
    elif out.dtype != torch.bool:
        out.fill_(torch.iinfo(out.dtype).min)


def _bytes_for(problem: Any, inputs: Any) -> float:
    """The problem's minimal bytes for these inputs where it can count them
    (`bytes_for`, e.g. the experts a routing selects), else its `bytes()`.

    A `bytes_for` that fails costs only the refinement: the shape is still
    described and its jobs still run, with `bytes()`; the reason goes to stderr."""
    bytes_for = getattr(problem, "bytes_for", None)
    if bytes_for is not None:
        try:
            return float(bytes_for(inputs))
        except Exception as exc:  # noqa: BLE001 - a user's problem may raise anything
            print(
                f"tunelab worker: {type(problem).__name__}.bytes_for failed ({type(exc).__name__}: {exc}); "
                "using bytes()",
                file=sys.stderr,
                flush=True,
            )
    return float(problem.bytes())
