"""Types of the extension module (python/native/src/lib.rs). Use tunelab.api."""

import os
from typing import Any, Callable, Optional, Sequence, Union

_Path = Union[str, "os.PathLike[str]"]

__version__: str
JOURNAL: str

class ManifestError(ValueError): ...
class SettingsError(ValueError): ...

def load(
    path: _Path, set: Sequence[str] = ..., device: Optional[str] = ..., config: Optional[_Path] = ...
) -> dict[str, Any]: ...
def plan(
    path: _Path,
    set: Sequence[str] = ...,
    only: Optional[str] = ...,
    device: Optional[str] = ...,
    config: Optional[_Path] = ...,
    interpret: bool = ...,
    jobs: bool = ...,
) -> dict[str, Any]: ...
def read_journal(path: _Path) -> dict[str, Any]: ...
def compare(
    base: _Path, new: _Path, fail_on_slower: Optional[float] = None, run_spread: Optional[float] = None
) -> dict[str, Any]: ...
def schema() -> str: ...
def default_python() -> tuple[str, str]: ...
def cli_main(argv: Sequence[str]) -> int: ...
def run_cli(
    argv: Sequence[str],
    path: _Path,
    set: Sequence[str] = ...,
    results_dir: Optional[_Path] = ...,
    config: Optional[_Path] = ...,
    interpret: bool = ...,
    on_job: Optional[Callable[[dict[str, Any]], object]] = ...,
) -> tuple[int, int, bool, list[str]]: ...
