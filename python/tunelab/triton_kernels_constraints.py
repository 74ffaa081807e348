"""Apply tuned triton_kernels constraints (`triton_kernels_json` files) in a vLLM process.

triton_kernels reads no tuned file: its heuristic picks each matmul's tiles
at call time within the constraints the process has set. A tunelab run of
the moe problem's `triton_kernels` method writes the best constraints per
(shape, M) to `triton_kernels_json` files (docs/peers.md); this module sets
them before each of vLLM's two `matmul_ogs` calls of a gpt-oss MoE layer:

    from tunelab.triton_kernels_constraints import install
    install(["results/gptoss-mxfp4/NVIDIA_H200/triton_kernels/E=32,N=2880,device_name=NVIDIA_H200,dtype=mxfp4.json"])
    # then build and run vLLM's LLM in this process as usual

`install` wraps `matmul_ogs` in vLLM's triton_kernels MoE module
(`vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe`,
vLLM 0.33). For each call the wrapper finds the file of the call's experts
and intermediate size, the entry of the M nearest to the call's tokens (the
first in file order on a tie, as vLLM picks from its fused-MoE files), and
sets that matmul's constraints (`w1`: gate/up, the call with a gather; `w2`:
down, the call with a scatter) in place of the process's, restoring the
process's own (vLLM's `split_k: 1` on sm_90) after the call. A call no file
covers runs with the process's constraints unchanged. Pass files tuned on
the GPU the process runs on (their `device_name` says which).
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any, Iterable, Optional

FORMAT = "tunelab_triton_kernels_constraints"
VERSION = 1
MATMULS = ("w1", "w2")
# vLLM pads the intermediate size of this backend to a multiple of 64, so a
# call's weights may be wider than the tuned shape's N.
INTERMEDIATE_ALIGN = 64
VLLM_MODULE = "vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe"


class ConstraintsFile:
    """One `triton_kernels_json` file: a shape's constraints per M."""

    def __init__(self, doc: dict, source: str = "<memory>"):
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f'{source}: not a triton_kernels_json file (its "format" is not {FORMAT!r})')
        if doc.get("version") != VERSION:
            raise ValueError(f"{source}: version {doc.get('version')!r}; this tunelab reads version {VERSION}")
        shape = doc.get("shape")
        entries = doc.get("M")
        if not isinstance(shape, dict) or not isinstance(entries, dict) or not entries:
            raise ValueError(f'{source}: needs a "shape" object and a non-empty "M" object')
        try:
            self.E, self.N = int(shape["E"]), int(shape["N"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f'{source}: "shape" needs integer E and N') from None
        self.source = source
        self.device_name = doc.get("device_name")
        self.entries: list[tuple[int, dict]] = []
        for key, entry in entries.items():
            try:
                m = int(key)
            except ValueError:
                raise ValueError(f"{source}: M key {key!r} is not an integer") from None
            constraints = {}
            for matmul in MATMULS:
                given = entry.get(matmul, {}) if isinstance(entry, dict) else None
                if not isinstance(given, dict) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in given.values()
                ):
                    raise ValueError(f"{source}: M={key} {matmul} must map constraint names to positive integers")
                constraints[matmul] = dict(given)
            self.entries.append((m, constraints))

    @classmethod
    def load(cls, path) -> "ConstraintsFile":
        path = pathlib.Path(path)
        return cls(json.loads(path.read_text()), str(path))

    def covers(self, n_experts: int, intermediate: int) -> bool:
        """Whether a call over `n_experts` experts of this (possibly padded) intermediate size is this shape's."""
        padded = -(-self.N // INTERMEDIATE_ALIGN) * INTERMEDIATE_ALIGN
        return n_experts == self.E and intermediate in (self.N, padded)

    def for_m(self, m: int) -> dict:
        """{"w1": {...}, "w2": {...}} of the tuned M nearest to `m` (the first on a tie)."""
        return min(self.entries, key=lambda e: abs(e[0] - m))[1]


def load(paths: Iterable) -> list[ConstraintsFile]:
    return [ConstraintsFile.load(p) for p in paths]


def constraints_for(
    files: list[ConstraintsFile], matmul: str, n_experts: int, intermediate: int, m: int
) -> Optional[dict]:
    """The constraints of one call, or None when no file covers it."""
    for f in files:
        if f.covers(n_experts, intermediate):
            return f.for_m(m)[matmul]
    return None


def wrap_matmul_ogs(matmul_ogs, files: list[ConstraintsFile], opt_flags):
    """`matmul_ogs` that sets the files' constraints for each call it can
    place (see the module docstring) and restores the process's after it."""

    @functools.wraps(matmul_ogs)
    def call(x, w, bias, routing_data=None, *args, **kwargs):
        which = _which_matmul(kwargs)
        constraints = None
        if which is not None and routing_data is not None:
            rows = x.shape[-2]
            tokens = rows if which == "w1" else rows // max(1, int(routing_data.n_expts_act))
            intermediate = w.shape[-1] // 2 if which == "w1" else w.shape[-2]
            constraints = constraints_for(files, which, int(w.shape[0]), int(intermediate), int(tokens))
        if constraints is None:
            return matmul_ogs(x, w, bias, routing_data, *args, **kwargs)
        saved = dict(opt_flags._opt_flags_constraints)
        opt_flags.reset_opt_flags_constraints()
        opt_flags.update_opt_flags_constraints(dict(constraints))
        try:
            return matmul_ogs(x, w, bias, routing_data, *args, **kwargs)
        finally:
            opt_flags.reset_opt_flags_constraints()
            opt_flags.update_opt_flags_constraints(saved)

    call.tunelab_files = files  # type: ignore[attr-defined]
    return call


def _which_matmul(kwargs: dict) -> Optional[str]:
    if kwargs.get("gather_indx") is not None:
        return "w1"
    if kwargs.get("scatter_indx") is not None:
        return "w2"
    return None


def install(paths: Iterable, module: Any = None, opt_flags: Any = None) -> list[ConstraintsFile]:
    """Wrap `module.matmul_ogs` (vLLM's triton_kernels MoE module by default)
    so each call runs with the tuned constraints of these files; returns the
    files loaded. Installing again replaces the earlier files."""
    import importlib

    files = load(paths)
    if module is None:
        module = importlib.import_module(VLLM_MODULE)
    if opt_flags is None:
        opt_flags = importlib.import_module("triton_kernels.matmul_ogs_details.opt_flags")
    original = getattr(module.matmul_ogs, "__wrapped__", module.matmul_ogs)
    module.matmul_ogs = wrap_matmul_ogs(original, files, opt_flags)
    return files
