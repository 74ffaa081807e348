"""How a worker fails a request: the protocol's failure classes, the error
that carries one, and the classification of whatever a problem, a method,
Triton or CUDA raised (docs/worker-protocol.md, "Failures")."""

import contextlib
import sys
import traceback
from collections.abc import Iterator

# Failure classes a worker may send (the runner adds crash and timeout).
BAD_REQUEST = "bad_request"
PROBLEM_ERROR = "problem_error"
COMPILE_ERROR = "compile_error"
OUT_OF_RESOURCES = "out_of_resources"
LAUNCH_ERROR = "launch_error"

# What an unrecognised exception means, by the step that raised it.
_STAGE_CLASS = {
    "problem": PROBLEM_ERROR,  # problem construction, inputs, reference, comparison
    "bind": PROBLEM_ERROR,  # Method.bind: allocating outputs, reading the config
    "compile": COMPILE_ERROR,
    "launch": LAUNCH_ERROR,
}

# Exception class names (anywhere in the MRO) that identify Triton failures.
# Matched by name so the worker needs no triton import to classify, and user
# methods that do not use Triton still work.
# Triton's interpreter raises InterpreterError for a kernel it cannot run
# (a non-power-of-two arange, a bad dot shape): what the compiler would reject
# on a GPU, so it is classed the same way.
_COMPILE_EXCEPTIONS = {"CompilationError", "PTXASError", "InterpreterError"}
_RESOURCE_EXCEPTIONS = {"OutOfResources"}
_CUDA_EXCEPTIONS = {"AcceleratorError", "CudaError", "CUDARuntimeError"}

# Substrings of messages that mean the GPU itself faulted; after one of these
# the CUDA context is unusable, so the runner must replace the worker.
_CUDA_FAULT_TEXT = (
    "CUDA error",
    "CUDA driver error",
    "Triton Error [CUDA]",
    "illegal memory access",
    "illegal instruction",
    "misaligned address",
    "device-side assert",
    "unspecified launch failure",
    "cudaErrorLaunchFailure",
)

_MESSAGE_LINES = 8
_MESSAGE_CHARS = 800


class WorkerError(Exception):
    """A failure with its protocol class; becomes an ok:false response."""

    def __init__(self, failure_class: str, message: str):
        super().__init__(message)
        self.failure_class = failure_class
        self.message = message


def bad_request(message: str) -> WorkerError:
    return WorkerError(BAD_REQUEST, message)


def classify(exc: BaseException, stage: str) -> str:
    """The protocol class of an exception raised during `stage`.

    The exception's type decides where it is specific (Triton's compile and
    resource errors, CUDA faults); otherwise the stage does.
    """
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = str(exc)
    if names & _RESOURCE_EXCEPTIONS or "out of resource" in text:
        return OUT_OF_RESOURCES
    if names & _COMPILE_EXCEPTIONS:
        return COMPILE_ERROR
    if names & _CUDA_EXCEPTIONS or any(marker in text for marker in _CUDA_FAULT_TEXT):
        return LAUNCH_ERROR
    return _STAGE_CLASS[stage]


def summarize(exc: BaseException) -> str:
    """A short message: type and the first lines of the text, never a traceback."""
    lines = [line.rstrip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    text = "\n".join(lines[:_MESSAGE_LINES])
    if len(lines) > _MESSAGE_LINES or len(text) > _MESSAGE_CHARS:
        text = text[:_MESSAGE_CHARS] + " [...]"
    return text


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Turn any exception raised inside into a WorkerError classed by `name`.

    The full traceback goes to stderr for whoever reads the worker's log; the
    response carries only the summary.
    """
    try:
        yield
    except WorkerError:
        raise
    except Exception as exc:
        failure_class = classify(exc, name)
        print(f"tunelab worker: {failure_class} during {name}:", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.flush()
        raise WorkerError(failure_class, summarize(exc)) from exc
