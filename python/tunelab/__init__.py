"""tunelab's Python side: the worker process, builtin problems and their kernels.

The Rust runner (`tunelab`) plans, schedules, times and records; this package
only builds inputs, runs methods and references, and returns raw samples.
See docs/worker-protocol.md.
"""

PROTOCOL_VERSION = 3
