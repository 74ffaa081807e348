"""`tunelab ir-pass`: passes of Triton's own pipeline applied to an IR file.

    python -m tunelab.workbench.passes FILE.ttgir --pass remove_layout_conversions [--pass ...]
    python -m tunelab.workbench.passes FILE.ttgir --list

Which passes exist, in which order and with which arguments, is read from
Triton itself: its backend's stage functions (`make_ttir`, `make_ttgir`,
`make_llir`) are run once with recording stand-ins for the pass bindings, at
the file's target and options (num_warps from the module, num_stages and the
rest from `--option`), so `--list` shows exactly the pipeline Triton would
run, and a pass named with `--pass` runs with the arguments Triton gives it
there (its first occurrence; `NAME#2` for the second). A pass not in the
pipeline is looked up among the bindings (`ttgpuir.coalesce`,
`nvidia.ttnvgpuir.fence_insertion`) and takes its arguments written out:
`--pass 'ttgpuir.pipeline(4, false)'`.

Writes the new module (with locations, so it still maps to the source) and a
unified diff of the two modules printed without locations, which is the
change the passes made; `--compile` also compiles both for the target and
prints each one's registers, spills and shared memory.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

# The stage functions of a backend whose passes apply to a file of each stage,
# in pipeline order (a .ttir file goes through make_ttir's passes and on).
_STAGES = {"ttir": ("make_ttir", "make_ttgir", "make_llir"), "ttgir": ("make_ttgir", "make_llir")}


@dataclass
class Step:
    """One pass as Triton's pipeline adds it."""

    name: str  # dotted, without `add_`: "ttgpuir.coalesce", "nvidia.ttnvgpuir.fence_insertion"
    args: tuple
    fn: Callable[..., Any] = field(repr=False)
    stage: str = ""

    def describe(self) -> str:
        args = ", ".join(_literal(a) for a in self.args)
        return f"{self.name}({args})" if self.args else self.name


class _Runs(list):
    """The log of recorded steps, counting the pass managers' runs: a stage
    may run several (AMD's make_ttgir runs an early one)."""

    runs = 0


class _RecordingPM:
    def __init__(self, log):
        self.log = log

    def enable_debug(self):
        return False

    def run(self, *args, **kwargs):
        # The passes added so far are recorded; what the stage does next with
        # the module (translating it to LLVM) fails on the stand-in, and is
        # not a pass.
        self.log.runs += 1

    def __getattr__(self, name):
        return lambda *a, **k: None


class _Recorder:
    """Stands in for a pass-binding module: `add_*` calls are logged, submodules wrapped."""

    def __init__(self, real, path: str, log: list):
        self._real, self._path, self._log = real, path, log

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name.startswith("add_") and callable(attr):
            full = f"{self._path}.{name[4:]}".lstrip(".")

            def add(pm, *args):
                self._log.append(Step(full, args, attr))

            return add
        if isinstance(attr, ModuleType) or type(attr).__name__ == "module":
            # `nvidia.passes.ttnvgpuir` is named `nvidia.ttnvgpuir`: `passes` is implied.
            sub = self._path if name == "passes" else f"{self._path}.{name}".lstrip(".")
            return _Recorder(attr, sub, self._log)
        return attr


class _IrRecorder:
    """Stands in for `ir`: a recording pass manager, the rest passed through."""

    def __init__(self, real, log):
        self._real, self._log = real, log

    def pass_manager(self, context):
        return _RecordingPM(self._log)

    def builder(self, context):
        # Stage functions build attributes for the module (make_ttgir's
        # `ttg.maxnreg`); the stand-in module ignores them.
        return _AnyAttr()

    def __getattr__(self, name):
        return getattr(self._real, name)


class _AnyAttr:
    def __getattr__(self, name):
        return lambda *a, **k: None


class _FakeModule:
    context = None

    def set_attr(self, *args):
        pass

    def get_int_attr(self, name):
        return None

    def get_tensordesc_metadata(self):
        return []


def pipeline(backend, options, stages) -> list:
    """The passes Triton adds in each of `stages`, in order, with their arguments."""
    module = sys.modules[type(backend).__module__]
    log = _Runs()
    saved = {}
    for name, value in vars(module).copy().items():
        if name == "ir":
            saved[name] = value
            setattr(module, name, _IrRecorder(value, log))
        elif name in ("passes", "nvidia", "amd") and type(value).__name__ == "module":
            saved[name] = value
            setattr(module, name, _Recorder(value, "" if name == "passes" else name, log))
    capability = backend._parse_arch(options.arch) if hasattr(backend, "_parse_arch") else None
    try:
        for stage in stages:
            start = len(log)
            fn = getattr(backend, stage, None)
            if fn is None:
                continue
            # (mod, metadata, options, capability) on CUDA, without the
            # capability on HIP; a bound make_llir's `self` is not counted.
            arity = len(inspect.signature(fn).parameters)
            runs = log.runs
            try:
                fn(*(_FakeModule(), {}, options, capability)[:arity])
            except Exception as exc:  # noqa: BLE001 - the stand-ins cannot answer something the stage asks
                if log.runs == runs:
                    print(
                        f"tunelab ir-pass: {stage}'s pipeline recorded up to where it asked the module for "
                        f"something ({type(exc).__name__}: {exc})",
                        file=sys.stderr,
                    )
            for step in log[start:]:
                step.stage = stage
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
    return log


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def parse_pass(spec: str):
    """`name`, `name#2` or `name(arg, ...)` -> (name, occurrence, args or None)."""
    import re

    spec = spec.strip()
    args = None
    if spec.endswith(")") and "(" in spec:
        spec, _, rest = spec.partition("(")
        inner = re.sub(r"\bfalse\b", "False", re.sub(r"\btrue\b", "True", rest[:-1].strip()))
        try:
            args = tuple(ast.literal_eval(f"({inner},)")) if inner else ()
        except (ValueError, SyntaxError):
            raise SystemExit(f"--pass {spec}({rest}: arguments must be literals: 4, true, 'cuda:90'") from None
    occurrence = 1
    if "#" in spec:
        spec, _, n = spec.partition("#")
        occurrence = int(n)
    return spec.strip().removeprefix("add_"), occurrence, args


def _matches(step_name: str, wanted: str) -> bool:
    return step_name == wanted or step_name.endswith("." + wanted)


def resolve(spec: str, recorded: list) -> Step:
    """The step `spec` names: from the recorded pipeline, else from the bindings."""
    name, occurrence, args = parse_pass(spec)
    found = [s for s in recorded if _matches(s.name, name)]
    distinct = {s.name for s in found}
    if len(distinct) > 1:
        raise SystemExit(f"--pass {spec}: ambiguous, it could be {', '.join(sorted(distinct))}")
    if found:
        if occurrence > len(found):
            raise SystemExit(f"--pass {spec}: the pipeline adds {found[0].name} {len(found)} time(s)")
        step = found[occurrence - 1]
        return Step(step.name, step.args if args is None else args, step.fn, step.stage)
    fn, full = _binding(name)
    if fn is None:
        raise SystemExit(f"--pass {spec}: no such pass in Triton's pipeline or bindings; `--list` shows the pipeline")
    return Step(full, args or (), fn, "bindings")


def _binding(name: str):
    from triton._C import libtriton

    roots = [("", libtriton.passes)]
    for backend in ("nvidia", "amd"):
        mod = getattr(libtriton, backend, None)
        if mod is not None and hasattr(mod, "passes"):
            roots.append((backend, mod.passes))
    candidates = []
    for prefix, root in roots:
        for group in dir(root):
            sub = getattr(root, group)
            if group.startswith("_") or not hasattr(sub, "__dict__"):
                continue
            for attr in dir(sub):
                if attr.startswith("add_"):
                    full = ".".join(p for p in (prefix, group, attr[4:]) if p)
                    if _matches(full, name):
                        candidates.append((getattr(sub, attr), full))
    if len(candidates) == 1:
        return candidates[0]
    if len(candidates) > 1:
        raise SystemExit(f"pass {name} is ambiguous: {', '.join(c[1] for c in candidates)}")
    return None, None


# --------------------------------------------------------------------------
# the file, its target and options


def _target(text: str, given):
    from tunelab.target import parse_target

    if given:
        return parse_target(given)
    import re

    m = re.search(r'ttg\.target\s*=\s*"(cuda|hip):(\w+)"', text)
    if m:
        warp = re.search(r'"ttg\.threads-per-warp"\s*=\s*(\d+)', text)
        return parse_target(f"{m.group(1)}:{m.group(2)}:{warp.group(1) if warp else 32}")
    return parse_target("cuda:90:32")


def _options(backend, text: str, extra: dict):
    import re

    opts = {}
    m = re.search(r'"ttg\.num-warps"\s*=\s*(\d+)', text)
    if m:
        opts["num_warps"] = int(m.group(1))
    m = re.search(r'"ttg\.num-ctas"\s*=\s*(\d+)', text)
    if m:
        opts["num_ctas"] = int(m.group(1))
    opts.update(extra)
    return backend.parse_options(opts)


def _option_values(pairs) -> dict:
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--option {pair}: write KEY=VALUE (num_stages=3)")
        value = value.strip()
        low = value.lower()
        out[key.strip()] = (
            True if low == "true" else False if low == "false" else int(value) if value.lstrip("-").isdigit() else value
        )
    return out


def _backend(target):
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    from tunelab.target import compile_for

    compile_for(target)  # no GPU needed: the stage functions ask the active driver
    return make_backend(GPUTarget(target.backend, target.arch, target.warp_size))


def apply(path: Path, specs, target=None, option_pairs=()):
    """Parses the file, runs the passes; returns (before, after, after_nodebug, before_nodebug, steps, pipeline text)."""
    from triton._C.libtriton import ir

    text = path.read_text()
    ext = path.suffix[1:]
    if ext not in _STAGES:
        raise SystemExit(f"{path}: passes run on MLIR modules: a .ttir or .ttgir file, not .{ext}")
    tgt = _target(text, target)
    backend = _backend(tgt)
    options = _options(backend, text, _option_values(option_pairs))
    recorded = pipeline(backend, options, _STAGES[ext])
    steps = [resolve(s, recorded) for s in specs]
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = ir.parse_mlir_module(str(path), context)
    module.context = context
    before_nodebug = module.str_nodebug()
    pm = ir.pass_manager(context)
    pm.enable_debug()
    for step in steps:
        try:
            step.fn(pm, *step.args)
        except TypeError as exc:
            raise SystemExit(
                f"--pass {step.name}: wrong arguments {step.args!r} ({exc}); write them out: --pass '{step.name}(...)'"
            ) from None
    pipeline_text = pm.get_pipeline_str() if hasattr(pm, "get_pipeline_str") else ""
    pm.run(module, "tunelab-ir-pass")
    return text, str(module), module.str_nodebug(), before_nodebug, steps, pipeline_text


def compile_file(path, target: str, options: dict, cache=None) -> dict:
    """Compiles an IR file for `target` through Triton's own IR entry point
    (`triton.compile(path)`, IRSource): {stage: text or bytes, "resources": ...}."""
    import os

    if cache is not None:
        os.environ["TRITON_CACHE_DIR"] = str(cache)
        from triton import knobs

        knobs.cache.dir = str(cache)
    import triton
    from triton.backends.compiler import GPUTarget

    from tunelab.target import compile_for, parse_target
    from tunelab.workbench import jit

    t = parse_target(target)
    compile_for(t)
    compiled = triton.compile(str(path), target=GPUTarget(t.backend, t.arch, t.warp_size), options=dict(options))
    out = dict(compiled.asm)
    out["resources"] = jit.resources(compiled)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tunelab ir-pass", description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="a .ttir or .ttgir file (from `tunelab run --keep-ir`)")
    parser.add_argument(
        "--pass",
        dest="passes",
        action="append",
        default=[],
        metavar="NAME",
        help="a pass to apply, in order (repeatable): coalesce, ttgpuir.pipeline#1, 'ttgpuir.pipeline(4, false)'",
    )
    parser.add_argument("--list", action="store_true", help="print the pipeline Triton runs on this file's stage")
    parser.add_argument("--target", help="BACKEND:ARCH:WARP_SIZE (default: the module's ttg.target, else cuda:90:32)")
    parser.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a compile option the pipeline depends on (num_stages=3, maxnreg=128)",
    )
    parser.add_argument("--out", type=Path, help="the new IR file (default: FILE's name with .after before its suffix)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compile the file and the result for the target and compare their resources",
    )
    args = parser.parse_args(argv)
    if not args.file.is_file():
        parser.error(f"{args.file}: no such file")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        print(f"tunelab ir-pass: this Python has no Triton ({exc})", file=sys.stderr)
        return 4
    if args.list:
        text = args.file.read_text()
        tgt = _target(text, args.target)
        backend = _backend(tgt)
        options = _options(backend, text, _option_values(args.option))
        for stage in _STAGES.get(args.file.suffix[1:], ()):
            print(f"{stage}:")
            for step in pipeline(backend, options, [stage]):
                print(f"  {step.describe()}")
        return 0
    if not args.passes:
        parser.error("name at least one --pass (or --list to see them)")
    _, after, after_nodebug, before_nodebug, steps, pipeline_text = apply(
        args.file, args.passes, args.target, args.option
    )
    out = args.out or args.file.with_name(f"{args.file.stem}.after{args.file.suffix}")
    out.write_text(after)
    diff_path = out.with_suffix(out.suffix + ".diff")
    diff = "".join(
        difflib.unified_diff(
            before_nodebug.splitlines(True), after_nodebug.splitlines(True), fromfile=str(args.file), tofile=str(out)
        )
    )
    diff_path.write_text(diff)
    changed = sum(1 for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))
    print(f"passes: {', '.join(s.describe() for s in steps)}")
    if pipeline_text:
        print(f"pipeline: {pipeline_text}")
    print(f"wrote {out} and {diff_path} ({changed} lines changed)")
    if args.compile:
        text = args.file.read_text()
        tgt = str(_target(text, args.target))
        extra = _option_values(args.option)
        rows = {}
        for label, path in (("before", args.file), ("after", out)):
            try:
                rows[label] = compile_file(path, tgt, extra)["resources"]
            except Exception as exc:  # noqa: BLE001 - a pass can make a module the later stages reject
                rows[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
