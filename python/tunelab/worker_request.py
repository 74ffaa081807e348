"""The worker's requests, validated: the fields every op reads the same way
(`_int_field`, `_number_field`), the JOB object of `compile`, `check`,
`recipe` and `keep_ir` (`Job`), and the one-shape requests (`_shape_of`).

Moved out of tunelab.worker (which still exports them) so that the worker
holds its ops and not their parsing; they raise `bad_request`, which the
worker answers as a `bad_request` failure.
"""

import json
import math

from tunelab.failures import bad_request


def _int_field(request: dict, key: str, default=None, minimum=None, maximum=None) -> int:
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{key!r} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise bad_request(f"{key!r} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise bad_request(f"{key!r} must be <= {maximum}, got {value}")
    return value


def _number_field(obj: dict, key: str, default=None) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise bad_request(f"{key!r} must be a finite number >= 0, got {value!r}")
    return float(value)


class Job:
    """The JOB object of a request, validated."""

    def __init__(self, raw):
        if not isinstance(raw, dict):
            raise bad_request("request needs a 'job' object")
        self.job_id = raw.get("job_id")
        self.problem = raw.get("problem")
        self.shape = raw.get("shape")
        self.config = raw.get("config", {})
        method = raw.get("method")
        if not isinstance(self.job_id, str) or not self.job_id:
            raise bad_request("job.job_id must be a non-empty string")
        if not isinstance(self.problem, str) or not self.problem:
            raise bad_request("job.problem must be a string (a builtin name or 'module.path:ClassName')")
        if not isinstance(self.shape, dict):
            raise bad_request("job.shape must be an object")
        if not isinstance(self.config, dict):
            raise bad_request("job.config must be an object")
        if not isinstance(method, dict):
            raise bad_request("job.method must be an object")
        # `kernel` names the problem's method; a method entry without one is
        # named after itself.
        self.method = method.get("kernel") or method.get("name")
        if not isinstance(self.method, str):
            raise bad_request("job.method needs a 'kernel' (or 'name') string")
        # An `ir:` method: the IR file (absolute path) its kernel is compiled from.
        self.ir = method.get("ir")
        if self.ir is not None and (not isinstance(self.ir, str) or not self.ir):
            raise bad_request("job.method.ir must be a path to an IR file")
        # An A/B side's code (tunelab.variant): module name -> the file run instead.
        self.modules = method.get("modules") or {}
        if not isinstance(self.modules, dict) or not all(
                isinstance(k, str) and k and isinstance(v, str) and v for k, v in self.modules.items()):
            raise bad_request("job.method.modules must map module names to files")
        # A planted slowdown (an A/B side's testing knob): microseconds of spin after each launch.
        self.plant_us = _number_field(raw, "plant_us", default=0.0)


def _shape_of(op: str, request: dict):
    """(problem, shape, seed, the key a shape's data is kept under) of a request about one shape."""
    name, shape = request.get("problem"), request.get("shape")
    if not isinstance(name, str) or not isinstance(shape, dict):
        raise bad_request(f"{op} needs 'problem' (a string) and 'shape' (an object)")
    seed = _int_field(request, "seed", default=0)
    return name, shape, seed, (name, json.dumps(shape, sort_keys=True), seed)
