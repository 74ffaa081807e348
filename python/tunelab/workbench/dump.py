"""Writing a job's compiled kernels to a directory (`tunelab run --keep-ir`).

Per kernel, named after it: every stage Triton kept (`.ttir`, `.ttgir`,
`.llir`, `.ptx`, `.cubin`; `.amdgcn`, `.hsaco` on AMD), the TTIR as the
front end made it before any pass (`.source.ttir`), the SASS where cuobjdump
can disassemble the cubin (`.sass`), and the compile metadata (`.json`:
Triton's, with the target spelled out, the kernel's resources, and what a
launch of the binary needs: `launch_info`). Two
kernels of one name in a job (one JIT function at two specialisations) get
`.1`, `.2`, ... after the name.
"""

from __future__ import annotations

import json
from pathlib import Path

from tunelab.workbench import jit

# Triton's names for its stages -> the file suffix they are written with.
_SUFFIX = {"source": "source.ttir"}


def write_kernels(kernels, directory, load: bool = False) -> list:
    """Writes each compiled kernel's IR and metadata under `directory`;
    returns each kernel's resources with the files written (relative names)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    seen: dict = {}
    out = []
    for compiled in kernels:
        name = str(compiled.name)
        n = seen.get(name, 0)
        seen[name] = n + 1
        stem = name if n == 0 else f"{name}.{n}"
        files = []
        for stage, content in sorted(compiled.asm.items()):
            if stage == "sass":
                continue  # below, only where it can be made
            path = directory / f"{stem}.{_SUFFIX.get(stage, stage)}"
            _write(path, content)
            files.append(path.name)
        sass = _sass(compiled)
        if sass is not None:
            path = directory / f"{stem}.sass"
            _write(path, sass)
            files.append(path.name)
        res = jit.resources(compiled, load=load)
        meta = {
            "resources": res,
            "metadata": metadata_dict(compiled),
            "constants": constants(compiled),
            "launch": launch_info(compiled),
        }
        path = directory / f"{stem}.json"
        _write(path, json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
        files.append(path.name)
        out.append({**res, "files": sorted(files)})
    return out


def metadata_dict(compiled) -> dict:
    """Triton's compile metadata as plain JSON values."""
    md = compiled.metadata._asdict()
    target = md.get("target")
    if target is not None and not isinstance(target, dict):
        md["target"] = {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size}
    return md


def constants(compiled) -> dict:
    """The constexprs (and arguments specialised to constants) the kernel was
    compiled with, by argument name: what its IR has folded in and its
    signature does not show. `tunelab.workbench.ircheck` compares them when
    the IR runs again."""
    src = getattr(compiled, "src", None)
    consts = getattr(src, "constants", None)
    names = getattr(getattr(src, "fn", None), "arg_names", None)
    if not isinstance(consts, dict) or names is None:
        return {}
    out = {}
    for key, value in consts.items():
        index = key[0] if isinstance(key, tuple) and key else key
        name = names[index] if isinstance(index, int) and index < len(names) else str(key)
        if isinstance(key, tuple) and len(key) > 1:
            name += "".join(f"[{i}]" for i in key[1:])
        out[name] = str(getattr(value, "value", value))
    return out


def launch_info(compiled):
    """What launching the binary without Triton needs (the `aot` output):
    each parameter of the JIT function in order, with its name, whether it is
    declared `tl.constexpr`, its type as compiled (`*bf16`, `i32`,
    `constexpr`: an integer Triton folded in because it was 1 is `constexpr`
    too, with its `value`) and Triton's specialisation attributes
    (`[["tt.divisibility", 16]]`). None where this Triton does not expose
    them (attributes are a dict from Triton 3.3 on)."""
    src = getattr(compiled, "src", None)
    fn = getattr(src, "fn", None)
    signature = getattr(src, "signature", None)
    attrs = getattr(src, "attrs", None)
    params = getattr(fn, "params", None)
    if params is None or not isinstance(signature, dict) or not isinstance(attrs, dict):
        return None
    folded = {}
    for key, value in (getattr(src, "constants", None) or {}).items():
        if isinstance(key, tuple) and len(key) == 1:
            folded[key[0]] = getattr(value, "value", value)
    out = []
    for index, p in enumerate(params):
        ty = signature.get(p.name, signature.get(index))
        entry = {"name": p.name, "declared_constexpr": bool(p.is_constexpr), "type": str(ty)}
        if ty == "constexpr" and index in folded:
            value = folded[index]
            entry["value"] = value if isinstance(value, (bool, int, float)) or value is None else str(value)
        entry["attrs"] = [[str(name), value] for name, value in attrs.get((index,), [])]
        out.append(entry)
    return {"params": out}


def _sass(compiled):
    if "cubin" not in compiled.asm:
        return None
    try:
        from triton.tools.disasm import get_sass

        return get_sass(compiled.asm["cubin"])
    except Exception:  # noqa: BLE001 - no cuobjdump here: the cubin is kept all the same
        return None


def _write(path: Path, content):
    data = content if isinstance(content, (bytes, bytearray)) else str(content).encode()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
