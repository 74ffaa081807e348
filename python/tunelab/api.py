"""tunelab's Python API: the runner's Rust core, called in this process.

    import tunelab

    tunelab.validate("experiments/quickstart.yaml")            # raises ManifestError
    summary = tunelab.plan("experiments/gptoss.yaml", only="E=32,N=2880")
    records = tunelab.read_journal("results/quickstart/NVIDIA_H100_80GB_HBM3")
    frame = records.to_pandas()
    result = tunelab.run("experiments/quickstart.yaml", interpret=True, on_job=print)

Every function calls the same Rust code as the command of the same name
(through the extension module `tunelab._native`), with the same settings
(tunelab.toml, TUNELAB_* variables) and the same messages. docs/python-api.md
documents each, and the keys of the dicts they return.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, Optional, Sequence, Union

import tunelab._native as _native
from tunelab._native import ManifestError, SettingsError

if TYPE_CHECKING:
    import pandas

__all__ = [
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
]

__version__: str = _native.__version__

PathLike = Union[str, "os.PathLike[str]"]
Overrides = Union[Mapping[str, Any], Sequence[str]]
"""`--set` overrides: {"protocol.min_samples": 50} or ["protocol.min_samples=50"]."""

JobRecord = dict[str, Any]
"""One job's journal record (docs/python-api.md lists its keys)."""

# The command line's exit codes (README, "Exit codes").
EXIT_OK = 0
EXIT_JOBS_FAILED = 3
EXIT_INTERRUPTED = 130
_EXIT_MEANING = {
    1: "internal error (I/O, a bug)",
    2: "bad input: manifest, flag or settings",
    4: "environment unusable: no working Python worker, or the journal is locked by another run",
    101: "the runner panicked (a bug)",
}


class TunelabError(RuntimeError):
    """`run` ended with an exit code that means it could not do its work (1, 2, 4).

    The runner has printed why on stderr, as the command does.
    """

    def __init__(self, exit_code: int, message: str):
        super().__init__(message)
        self.exit_code = exit_code


def _set_args(overrides: Optional[Overrides]) -> list[str]:
    """`--set` values as the command line takes them; a mapping's values are
    written as JSON, which is YAML (`[1, 2]`, `true`, `"bf16"` as `bf16`)."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        import json

        return [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in overrides.items()]
    if isinstance(overrides, str):
        return [overrides]
    return [str(item) for item in overrides]


def _opt_path(path: Optional[PathLike]) -> Optional[str]:
    return None if path is None else os.fspath(path)


def load(
    manifest: PathLike,
    *,
    overrides: Optional[Overrides] = None,
    device: Optional[str] = None,
    config: Optional[PathLike] = None,
) -> dict[str, Any]:
    """Read, merge (extends, include, overrides) and validate a manifest.

    Returns the resolved experiment as a dict: name, problem, shapes, methods
    (with their spaces, constraints and baselines), tolerance, protocol,
    search, outputs, interpreter, companions. Raises ManifestError whose
    message is `tunelab validate`'s text: every error with file:line:column.
    `device` is the profile expressions see (`h100`, `h200`, `cpu`; default:
    the `device_profile` setting).
    """
    return _native.load(os.fspath(manifest), _set_args(overrides), device, _opt_path(config))


def validate(
    manifest: PathLike,
    *,
    overrides: Optional[Overrides] = None,
    only: Optional[str] = None,
    device: Optional[str] = None,
    config: Optional[PathLike] = None,
) -> dict[str, Any]:
    """What `tunelab validate` checks: load the manifest, then plan it for a GPU
    (a constraint set that rejects everything is an error too). Unlike the
    command, it starts no worker to import a user's problem class.

    Returns the plan summary (as `plan`); raises ManifestError otherwise.
    """
    return plan(manifest, overrides=overrides, only=only, device=device, config=config)


def plan(
    manifest: PathLike,
    *,
    overrides: Optional[Overrides] = None,
    only: Optional[str] = None,
    device: Optional[str] = None,
    config: Optional[PathLike] = None,
    interpret: bool = False,
    jobs: bool = False,
) -> dict[str, Any]:
    """Expand a manifest into jobs, as `tunelab plan --json`.

    Returns the summary: experiment, device, strategy, shapes, jobs and per
    method the points before and after each constraint. With `jobs=True` the
    dict also has "job_list": every job (id, shape, method, config, baseline),
    as `tunelab plan --jobs` prints them; they are all held in memory. `only` is
    `--only` ("E=32,N=2880,method=triton"). Like the command, it plans what
    `tunelab run` would run here (the first GPU, else the interpreter's
    shapes) unless `device` (or TUNELAB_DEVICE_PROFILE, or device_profile in
    tunelab.toml) names a profile ("h100"); `interpret` plans what the
    interpreter would run.
    """
    return _native.plan(
        os.fspath(manifest),
        _set_args(overrides),
        only,
        device,
        _opt_path(config),
        interpret,
        jobs,
    )


def schema() -> str:
    """The manifest JSON schema (`tunelab schema`)."""
    return _native.schema()


class JobRecords(list[JobRecord]):
    """The latest record of every job in a journal, in journal order: a list of dicts.

    Also holds the journal's run headers (`runs`, oldest first), the
    finalists' interleaved re-timings (`finals`), the lines it could not
    read (`warnings`), and the ids of the jobs that a later definition of
    their method superseded (`superseded`: kept in the journal, ranked by no
    output; leave them out before ranking, or two versions of a kernel mix).
    """

    def __init__(
        self,
        records: Iterable[JobRecord] = (),
        *,
        runs: Sequence[dict[str, Any]] = (),
        finals: Sequence[dict[str, Any]] = (),
        warnings: Sequence[str] = (),
        superseded: Iterable[str] = (),
        path: Optional[Path] = None,
    ):
        super().__init__(records)
        self.runs: list[dict[str, Any]] = list(runs)
        self.finals: list[dict[str, Any]] = list(finals)
        self.warnings: list[str] = list(warnings)
        self.superseded: set[str] = set(superseded)
        self.path = path

    def current(self) -> "JobRecords":
        """The records less the superseded ones: what `tunelab report` ranks."""
        return JobRecords(
            (r for r in self if r["job_id"] not in self.superseded),
            runs=self.runs,
            finals=self.finals,
            warnings=self.warnings,
            path=self.path,
        )

    def to_pandas(self) -> "pandas.DataFrame":
        """The records as a pandas DataFrame, one row a job.

        Nested fields become dotted columns: `shape.M`, `config.BLOCK_SIZE_M`,
        `stats.median_us`, `check.passed`, `failure.class`. Needs pandas.
        """
        try:
            import pandas
        except ImportError as missing:
            raise ImportError(
                f"JobRecords.to_pandas() needs pandas, which this Python ({sys.executable}) cannot import: "
                f"{sys.executable} -m pip install pandas"
            ) from missing
        return pandas.json_normalize(list(self), sep=".")


def read_journal(path: PathLike) -> JobRecords:
    """Read a results directory's journal (journal.jsonl.gz, then journal.jsonl),
    or one journal file, as `tunelab report` does.

    Returns the latest record of every job (a later record of a job id
    replaces an earlier one); `.superseded` names the jobs a later
    definition of their method replaced, `.current()` leaves them out.
    Raises FileNotFoundError where there is no journal, ValueError for a
    journal of a newer format than this tunelab reads, OSError when it
    cannot be read.
    """
    read = _native.read_journal(os.fspath(path))
    return JobRecords(
        read["jobs"],
        runs=read["runs"],
        finals=read["finals"],
        warnings=read["warnings"],
        superseded=read["superseded"],
        path=Path(path),
    )


def compare(
    base: PathLike, new: PathLike, fail_on_slower: Optional[float] = None, run_spread: Optional[float] = None
) -> dict[str, Any]:
    """NEW against BASE, as `tunelab compare BASE NEW` computes it.

    BASE and NEW are results directories or journal files, or BASE is a
    consumer's shipped file (a vLLM JSON) whose configs NEW's run timed
    (`run --compare-to`). Returns a dict: `rows` (per shape and method:
    `base_us`, `new_us`, `speedup` = base / new, `verdict` FAST / SAME / SLOW
    / AMBIGUOUS against a margin of the run-to-run spread, both configs),
    `geomean_speedup`, `notes` (what could not be compared), `markdown` (what
    the command prints) and, with `fail_on_slower` (0.02 for 2 %), the
    `regressions` beyond it. `run_spread`: how far apart separate runs of one
    config come out (default 0.05, as the command's; docs/ab.md). Raises
    ValueError when a side cannot be read or compared.
    """
    threshold = None if fail_on_slower is None else float(fail_on_slower)
    spread = None if run_spread is None else float(run_spread)
    return _native.compare(os.fspath(base), os.fspath(new), threshold, spread)


@dataclass
class RunResult:
    """How a `run` ended."""

    exit_code: int
    """0: every job ran and passed; 3: the run finished but some jobs failed (they are in the journal)."""
    results: list[Path] = field(default_factory=list)
    """The results directories the run wrote: the experiment's, then its companions'."""
    new_records: int = 0
    """Job records the run journaled (each was passed to `on_job`)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    def records(self) -> JobRecords:
        """Every job record of the experiment's results directory (earlier runs' too)."""
        return read_journal(self.results[0])


def run(
    manifest: PathLike,
    *,
    mode: Literal["tune", "bench", "check"] = "tune",
    only: Optional[str] = None,
    overrides: Optional[Overrides] = None,
    use_best: Optional[PathLike] = None,
    interpret: bool = False,
    python: Optional[str] = None,
    results_dir: Optional[PathLike] = None,
    config: Optional[PathLike] = None,
    compile_workers: Optional[int] = None,
    quiet: bool = False,
    trace: Optional[PathLike] = None,
    on_job: Optional[Callable[[JobRecord], object]] = None,
) -> RunResult:
    """Run (or resume) an experiment: `tunelab run` with these flags, in this process.

    `on_job(record)` is called in this thread with each job record the run
    journals, as the run goes (the record `read_journal` returns). It is fed
    from the journal, read every 0.1 s, so calls come in small bursts. An
    exception it raises stops the calls and is raised once the run is over;
    it does not stop the run. The GIL is released while the run works, so
    other Python threads go on.

    Output goes where the command's goes: the progress line (on a terminal,
    unless `quiet`) and warnings to stderr, the summary to stdout.
    Workers run in `python`, else the settings' Python, else this Python.

    Returns a RunResult for exit codes 0 and 3 (some jobs failed). Raises
    ManifestError for a manifest or override that does not load (before
    anything runs), KeyboardInterrupt after Ctrl-C (the run stops after the
    job in flight; every finished job is in the journal; run again to
    resume), and TunelabError for the other exit codes.
    """
    argv = ["tunelab", "run", os.fspath(manifest), "--mode", mode]
    if only is not None:
        argv += ["--only", only]
    sets = _set_args(overrides)
    for item in sets:
        argv += ["--set", item]
    if use_best is not None:
        argv += ["--use-best", os.fspath(use_best)]
    if interpret:
        argv.append("--interpret")
    if python is not None:
        argv += ["--python", python]
    if results_dir is not None:
        argv += ["--results-dir", os.fspath(results_dir)]
    if config is not None:
        argv += ["--config", os.fspath(config)]
    if compile_workers is not None:
        argv += ["--compile-workers", str(compile_workers)]
    if quiet:
        argv.append("--quiet")
    if trace is not None:
        argv += ["--trace", os.fspath(trace)]
    # Rust writes to the file descriptors directly: what Python buffered goes first.
    sys.stdout.flush()
    sys.stderr.flush()
    code, delivered, interrupted, dirs = _native.run_cli(
        argv,
        os.fspath(manifest),
        sets,
        _opt_path(results_dir),
        _opt_path(config),
        interpret,
        on_job,
    )
    if interrupted or code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt("tunelab run interrupted: every finished job is in the journal; run again to resume")
    if code not in (EXIT_OK, EXIT_JOBS_FAILED):
        meaning = _EXIT_MEANING.get(code, "unexpected exit code")
        raise TunelabError(code, f"tunelab run exited with code {code} ({meaning}); the runner said why on stderr")
    return RunResult(exit_code=code, results=[Path(d) for d in dirs], new_records=delivered)


# The place for `compare(base, new)`: `tunelab compare` (two results, side by
# side) as a call of the same Rust code, like `plan` (see the note in
# python/native/src/lib.rs; docs/python-api.md, "What is coming").
