"""Where the peers' code comes from: triton_kernels and vLLM's fused-MoE source.

tunelab compares with other projects' kernels by running their own code
(docs/peers.md). That code is found, in this order, the way vLLM finds
triton_kernels itself:

1. an importable `triton_kernels` (installed in the worker's Python);
2. `vllm.third_party.triton_kernels` (vLLM's bundled copy, where vLLM is
   installed), registered as `triton_kernels` as vLLM does, since its modules
   import each other by that name;
3. the `.peers/` folder that `just peers` unpacks from vLLM's wheel: the one
   `TUNELAB_PEERS` names, else `.peers` in the working directory, else in the
   checkout tunelab runs from. Its `manifest.json` says what it holds and its
   `python_path` goes on `sys.path`.

Nothing here imports torch or Triton until a peer is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pathlib
import sys
from dataclasses import dataclass
from typing import Any, Optional

MANIFEST = "manifest.json"


def peers_dir() -> Optional[pathlib.Path]:
    """The `.peers` folder to use, or None: TUNELAB_PEERS, ./.peers, the checkout's .peers."""
    env = os.environ.get("TUNELAB_PEERS")
    candidates = [pathlib.Path(env)] if env else []
    candidates.append(pathlib.Path.cwd() / ".peers")
    candidates.append(pathlib.Path(__file__).resolve().parents[2] / ".peers")
    for folder in candidates:
        if (folder / MANIFEST).is_file():
            return folder
    return None


def peers_manifest(folder: Optional[pathlib.Path] = None) -> Optional[dict]:
    """The `.peers` manifest (with `dir`, the folder), or None where there is none."""
    folder = folder or peers_dir()
    if folder is None:
        return None
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    manifest["dir"] = str(folder)
    return manifest


def vllm_fused_moe_source() -> Optional[pathlib.Path]:
    """vLLM's fused_moe.py as `just peers` unpacked it, or None."""
    manifest = peers_manifest()
    if manifest is None or not isinstance(manifest.get("fused_moe"), dict):
        return None
    path = pathlib.Path(manifest["dir"]) / str(manifest["fused_moe"].get("path", ""))
    return path if path.is_file() else None


@dataclass(frozen=True)
class TritonKernels:
    """The triton_kernels package found, and what it is."""

    module: Any
    # Where it came from, for the journal: "`.peers` (vllm 0.33.0 wheel, ...)".
    source: str
    # The API generation, inferred as vLLM infers it: "3.5.1", "3.6" or "3.8".
    api: str

    def describe(self) -> str:
        return f"triton_kernels {self.api} API, {self.source}"


_FOUND: Optional[TritonKernels] = None
_WHY_NOT: Optional[str] = None


def _has(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _api_of(module) -> str:
    """vLLM's own inference: 3.8 has no matmul_ogs, 3.5.1 no SparseMatrix."""
    try:
        importlib.import_module(module.__name__ + ".matmul_ogs")
    except ImportError:
        return "3.8"
    tensor = importlib.import_module(module.__name__ + ".tensor")
    return "3.6" if hasattr(tensor, "SparseMatrix") else "3.5.1"


def triton_kernels() -> TritonKernels | str:
    """The triton_kernels to run, or a one-line reason there is none (cached)."""
    global _FOUND, _WHY_NOT
    if _FOUND is not None:
        return _FOUND
    if _WHY_NOT is not None:
        return _WHY_NOT
    try:
        found = _find()
    except Exception as exc:  # noqa: BLE001 - a package that fails to import is not usable
        _WHY_NOT = f"triton_kernels does not import ({type(exc).__name__}: {exc})"
        return _WHY_NOT
    if isinstance(found, str):
        _WHY_NOT = found
    else:
        _FOUND = found
    return found


def _peers_source(manifest: dict) -> str:
    found = manifest.get("triton_kernels")
    tk: dict = found if isinstance(found, dict) else {}
    return f"`.peers` ({tk.get('from', 'unknown origin')}, sha256 {str(tk.get('sha256', ''))[:12]})"


def _find() -> TritonKernels | str:
    manifest = peers_manifest()
    peers_path = None
    if manifest is not None:
        peers_path = (pathlib.Path(manifest["dir"]) / str(manifest.get("python_path", "python"))).resolve()
    if "triton_kernels" in sys.modules or _has("triton_kernels"):
        module = importlib.import_module("triton_kernels")
        where = pathlib.Path(str(module.__file__)).resolve().parent
        if manifest is not None and peers_path is not None and where.parent == peers_path:
            return TritonKernels(module, _peers_source(manifest), _api_of(module))
        return TritonKernels(module, f"installed at {where}", _api_of(module))
    if _has("vllm") and _has("vllm.third_party.triton_kernels"):
        module = importlib.import_module("vllm.third_party.triton_kernels")
        sys.modules["triton_kernels"] = module  # as vLLM registers it
        from importlib.metadata import version

        return TritonKernels(module, f"vllm {version('vllm')}'s vllm.third_party.triton_kernels", _api_of(module))
    if manifest is None or peers_path is None:
        return (
            "triton_kernels is not installed, vLLM (which bundles it) is not either, and there is no "
            "`.peers` folder: run `just peers` (docs/peers.md)"
        )
    if not (peers_path / "triton_kernels").is_dir():
        return (
            f"the `.peers` folder has no triton_kernels under {manifest.get('python_path')!r}: run `just peers` again"
        )
    sys.path.insert(0, str(peers_path))
    module = importlib.import_module("triton_kernels")
    return TritonKernels(module, _peers_source(manifest), _api_of(module))
