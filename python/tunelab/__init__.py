"""tunelab's Python side: the worker process, builtin problems and their kernels,
and, when tunelab is installed (`pip install .`), the Python API.

The Rust runner (`tunelab`) plans, schedules, times and records; the worker
(`python -m tunelab.worker`) only builds inputs, runs methods and references,
and returns raw samples (docs/worker-protocol.md).

The API (`tunelab.load`, `validate`, `plan`, `read_journal`, `run`, ...) calls
the runner's Rust core in this process through the extension module
`tunelab._native` (docs/python-api.md). It is imported on first use, so a
worker, which imports this package too, never loads the extension.
"""

from typing import TYPE_CHECKING, Any

PROTOCOL_VERSION = 4

# Names of the API, resolved from tunelab.api on first access.
_API = (
    "JobRecords",
    "ManifestError",
    "RunResult",
    "SettingsError",
    "TunelabError",
    "compare",
    "load",
    "plan",
    "read_journal",
    "run",
    "schema",
    "validate",
    "__version__",
)

if TYPE_CHECKING:
    from tunelab.api import (
        JobRecords,
        ManifestError,
        RunResult,
        SettingsError,
        TunelabError,
        __version__,
        compare,
        load,
        plan,
        read_journal,
        run,
        schema,
        validate,
    )


def __getattr__(name: str) -> Any:
    if name in _API:
        from tunelab import api

        return getattr(api, name)
    raise AttributeError(f"module 'tunelab' has no attribute {name!r}")


def __dir__() -> list:
    return sorted([*globals(), *_API])
