"""The worker's requests, validated: the fields every op reads the same way
(`_int_field`, `_number_field`), the JOB object of `compile`, `check`,
`recipe` and `keep_ir` (`Job`), and the one-shape requests (`_shape_of`).

Moved out of tunelab.worker (which still exports them) so that the worker
holds its ops and not their parsing; they raise `bad_request`, which the
worker answers as a `bad_request` failure.
"""

import json
import math
from typing import Any, Optional

from tunelab.failures import bad_request


def _int_field(
    request: dict[str, Any],
    key: str,
    default: Optional[int] = None,
    minimum: Optional[int] = None,
    maximum: Optional[int] = None,
) -> int:
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{key!r} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise bad_request(f"{key!r} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise bad_request(f"{key!r} must be <= {maximum}, got {value}")
    return value


def _number_field(obj: dict[str, Any], key: str, default: Optional[float] = None) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise bad_request(f"{key!r} must be a finite number >= 0, got {value!r}")
    return float(value)


class Job:
    """The JOB object of a request, validated."""

    def __init__(self, raw: object) -> None:
        if not isinstance(raw, dict):
            raise bad_request("request needs a 'job' object")
        # Read into locals first: each check below narrows one to its type.
        job_id, problem, shape = raw.get("job_id"), raw.get("problem"), raw.get("shape")
        config = raw.get("config", {})
        method = raw.get("method")
        if not isinstance(job_id, str) or not job_id:
            raise bad_request("job.job_id must be a non-empty string")
        if not isinstance(problem, str) or not problem:
            raise bad_request("job.problem must be a string (a builtin name or 'module.path:ClassName')")
        if not isinstance(shape, dict):
            raise bad_request("job.shape must be an object")
        if not isinstance(config, dict):
            raise bad_request("job.config must be an object")
        if not isinstance(method, dict):
            raise bad_request("job.method must be an object")
        self.job_id: str = job_id
        self.problem: str = problem
        self.shape: dict[str, Any] = shape
        self.config: dict[str, Any] = config
        # `kernel` names the problem's method; a method entry without one is
        # named after itself.
        name = method.get("kernel") or method.get("name")
        if not isinstance(name, str):
            raise bad_request("job.method needs a 'kernel' (or 'name') string")
        self.method: str = name
        # An `ir:` method: the IR file (absolute path) its kernel is compiled from.
        ir = method.get("ir")
        if ir is not None and (not isinstance(ir, str) or not ir):
            raise bad_request("job.method.ir must be a path to an IR file")
        self.ir: Optional[str] = ir
        # An A/B side's code (tunelab.variant): module name -> the file run instead.
        modules = method.get("modules") or {}
        if not isinstance(modules, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in modules.items()
        ):
            raise bad_request("job.method.modules must map module names to files")
        self.modules: dict[str, str] = modules
        # A planted slowdown (an A/B side's testing knob): microseconds of spin after each launch.
        self.plant_us = _number_field(raw, "plant_us", default=0.0)


def _shape_of(op: str, request: dict[str, Any]) -> tuple[str, dict[str, Any], int, tuple[str, str, int]]:
    """(problem, shape, seed, the key a shape's data is kept under) of a request about one shape."""
    name, shape = request.get("problem"), request.get("shape")
    if not isinstance(name, str) or not isinstance(shape, dict):
        raise bad_request(f"{op} needs 'problem' (a string) and 'shape' (an object)")
    seed = _int_field(request, "seed", default=0)
    return name, shape, seed, (name, json.dumps(shape, sort_keys=True), seed)
