"""Holding an IR file to the kernel it stands in for.

An IR file was compiled for one specialisation of its kernel: which integer
arguments were constants (a stride of 1) and which divisible by 16, its
constexprs folded in, its warps and target fixed in the module. Launched with
arguments of another specialisation, or under another warp count, it reads
the wrong memory or computes garbage. So before a job runs from an IR file,
the worker compiles the source kernel at the job's shape and config (a cache
hit when the source method runs beside it) and compares:

- the entry's signature (argument types and attributes), for ttir and ttgir;
- `ttg.num-warps` against the warps the config compiles with (ttgir);
- `ttg.target` against the target compiled for (ttgir).

- the constexprs, when the IR file lies beside the `NAME.json` that
  `run --keep-ir` wrote with it: they are folded into the IR and its
  signature does not show them (the MoE's EVEN_K follows K).

LLVM IR and PTX carry no such attributes tunelab can compare; their names
must match, and the check launch compares the output with the reference, as
for any method.
"""

from __future__ import annotations

import json

from tunelab.workbench.irfile import describe_signature, mlir_signature


def against_source(ir, source_kernels) -> str:
    """What does not fit, as one message; empty when the IR fits the source."""
    same_name = [k for k in source_kernels if str(k.name) == ir.entry]
    if not same_name:
        names = ", ".join(sorted({str(k.name) for k in source_kernels})) or "none"
        return f"its kernel @{ir.entry} is not one the method compiles (it compiles: {names})"
    if len(same_name) > 1:
        return f"the method compiles @{ir.entry} at {len(same_name)} specialisations; an IR file stands for one of them"
    source = same_name[0]
    problems = []
    expected = source.asm.get(ir.ext) if ir.ext in ("ttir", "ttgir") else None
    if expected is not None:
        want = mlir_signature(expected, ir.entry)
        got = ir.signature()
        if want is not None and got is not None and want != got:
            problems.append(
                f"its signature ({describe_signature(got)}) is not the kernel's here ({describe_signature(want)})"
            )
    if ir.ext == "ttgir":
        warps = ir.module_int_attr("ttg.num-warps")
        if warps is not None and warps != source.metadata.num_warps:
            problems.append(
                f"it has ttg.num-warps = {warps}, the config compiles with num_warps = {source.metadata.num_warps}"
            )
        target = ir.module_str_attr("ttg.target")
        t = source.metadata.target
        compiled_for = f"{t.backend}:{t.arch}"
        if target is not None and target != compiled_for:
            problems.append(f"it targets {target}, this worker compiles for {compiled_for}")
    kept = ir.path.with_name(f"{ir.entry}.json")
    if kept.is_file():
        try:
            recorded = json.loads(kept.read_text()).get("constants") or {}
        except (OSError, ValueError):
            recorded = {}
        from tunelab.workbench.dump import constants

        here = constants(source)
        differ = sorted(k for k in recorded.keys() & here.keys() if recorded[k] != here[k])
        if differ:
            problems.append(
                "it was compiled with "
                + ", ".join(f"{k}={recorded[k]}" for k in differ)
                + f" ({kept.name}), the kernel here has "
                + ", ".join(f"{k}={here[k]}" for k in differ)
            )
    return "; ".join(problems)
