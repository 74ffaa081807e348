"""bench/tuning_speed.py's contenders: their names, what each runs (the
overrides a native, native-inputs or raced contender adds to the manifest),
their labels, the config keys they search, and the goals the report judges
them by.

Shared by tuning_speed.py (which runs them), tuning_speed_gpu.py (its child
processes) and tuning_speed_report.py (the report); moved out of
tuning_speed.py, which still exports these names.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "experiments" / "bench-gemm.yaml"
CONTENDERS = (
    "autotune",
    "grid",
    "halving",
    "native-grid",
    "native-halving",
    "native-inputs-grid",
    "native-inputs-halving",
    "native-inputs-raced-grid",
)
# Contenders launched natively (every name after the first three), and those whose inputs are built natively too.
NATIVE_CONTENDERS = CONTENDERS[3:]
NATIVE_INPUTS_PREFIX = "native-inputs-"
NATIVE_INPUTS_OVERRIDE = "inputs=native"
# A contender named native-<strategy> is that strategy with the Triton method launched natively.
NATIVE_PREFIX = "native-"
NATIVE_OVERRIDE = "methods.triton.launch=native"
# A contender with -raced- in its name also races (protocol.race, docs/manifest.md): a config clearly slower than the best
# so far stops sampling at min_samples.
RACED_INFIX = "-raced-"
RACE_OVERRIDE = "protocol.race=0.05"
LABELS = {
    "autotune": "triton.autotune",
    "grid": "tunelab grid",
    "halving": "tunelab halving",
    "native-grid": "tunelab grid, native launches",
    "native-halving": "tunelab halving, native launches",
    "native-inputs-grid": "tunelab grid, native launches and inputs",
    "native-inputs-halving": "tunelab halving, native launches and inputs",
    "native-inputs-raced-grid": "tunelab grid, native launches and inputs, racing",
}
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")

GOALS = [
    "tunelab grid is at least 8x faster than triton.autotune, with the same winner or one within 1 %",
    "GPU busy at least 80 % of tunelab's wall time",
    "successive halving's winner within 2 % of the exhaustive (grid) best",
    "runner overhead per job (scheduling, protocol, journal) under 1 ms",
    "the whole tunelab process with native launches is at least 8x faster than triton.autotune, "
    "with the same winner or one within 1 %",
    "runner overhead per job on the native path <= 0.2 ms",
]


class BenchError(Exception):
    """A failure to report as a message with an exit code, not a traceback."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


def config_key(config):
    """A config as a hashable tuple of its six tunables (other keys ignored)."""
    return tuple(int(config[k]) for k in CONFIG_KEYS)


def config_label(config):
    c = {k: int(config[k]) for k in CONFIG_KEYS}
    return (
        f"{c['BLOCK_SIZE_M']}x{c['BLOCK_SIZE_N']}x{c['BLOCK_SIZE_K']} "
        f"g{c['GROUP_SIZE_M']} w{c['num_warps']} s{c['num_stages']}"
    )


def is_native(name):
    return name.startswith(NATIVE_PREFIX)


def has_native_inputs(name):
    return name.startswith(NATIVE_INPUTS_PREFIX)


def is_raced(name):
    return RACED_INFIX in name


def strategy_of(name):
    """The search strategy of a tunelab contender: grid for grid, native-grid and native-inputs-grid."""
    return name.rsplit("-", 1)[-1]
