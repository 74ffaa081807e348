"""An IR file a method runs from (`ir:` in a manifest), read without Triton.

Triton compiles a kernel from an IR file through its `ir_override` option: the
source kernel goes through Triton's pipeline as usual and, at the stage the
file's extension names (ttir, ttgir, llir, ptx), the file's module replaces
what the pipeline made; the later stages compile the file. Everything a launch
needs besides the binary (the grid, the arguments, the launcher) still comes
from the source kernel's call, so an IR file runs wherever its kernel is
launched with the specialisation it was compiled for.

Triton keys its cache on the option's value, a path, and not on the file's
contents; an edited file at the same path would find the old binary. So the
worker compiles from a copy named by the contents' hash (`cached_copy`):
an edit is a new path, a new key, a new binary, and an unchanged file is found
in the cache by every compile worker and lane.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

# What Triton's ir_override takes (CUDA): the stage named by the extension.
IR_EXTENSIONS = ("ttir", "ttgir", "llir", "ptx")
_MLIR = ("ttir", "ttgir")


class IrFileError(ValueError):
    """An IR file tunelab cannot run from; the message says why."""


@dataclass(frozen=True)
class IrFile:
    path: Path
    ext: str
    text: str
    sha256: str
    entry: str

    @staticmethod
    def load(path) -> "IrFile":
        path = Path(path)
        ext = path.suffix[1:]
        if ext not in IR_EXTENSIONS:
            raise IrFileError(
                f"{path}: an IR file must end in one of .{', .'.join(IR_EXTENSIONS)} "
                f"(the stage Triton compiles it from), not {path.suffix or 'nothing'}"
            )
        try:
            text = path.read_text()
        except OSError as exc:
            raise IrFileError(f"cannot read IR file {path}: {exc}") from None
        entry = entry_name(text, ext)
        if entry is None:
            raise IrFileError(f"{path}: no kernel entry found (a public tt.func for .{ext})")
        return IrFile(path, ext, text, hashlib.sha256(text.encode()).hexdigest(), entry)

    def module_int_attr(self, name: str):
        """An integer attribute of the MLIR module (`ttg.num-warps`), or None."""
        m = re.search(r'"?' + re.escape(name) + r'"?\s*=\s*(\d+)\s*:\s*i32', self._module_header())
        return int(m.group(1)) if m else None

    def module_str_attr(self, name: str):
        m = re.search(r'"?' + re.escape(name) + r'"?\s*=\s*"([^"]*)"', self._module_header())
        return m.group(1) if m else None

    def _module_header(self) -> str:
        m = re.search(r"^module attributes \{(.*)\}\s*\{\s*$", self.text, re.MULTILINE)
        return m.group(1) if m else ""

    def signature(self):
        """The entry's arguments as (type, attributes) texts, names and locations
        dropped: what the specialisation decided (which integers were constants,
        which are divisible by 16). None for llir and ptx."""
        return mlir_signature(self.text, self.entry) if self.ext in _MLIR else None

    def cached_copy(self, cache_dir) -> Path:
        """A copy named by the contents' hash under `cache_dir`, made once
        (written to a temporary name and renamed, so concurrent workers never
        see half a file)."""
        target = Path(cache_dir) / "tunelab-ir" / self.sha256[:32] / f"{self.entry}.{self.ext}"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(self.text)
            os.replace(tmp, target)
        return target


def entry_name(text: str, ext: str):
    """The kernel an IR text defines: the public function (MLIR), the first
    defined function (LLVM IR), the `.entry` (PTX)."""
    if ext in _MLIR:
        m = re.search(r"tt\.func\s+public\s+@([\w$.]+)\s*\(", text)
    elif ext == "llir":
        m = re.search(r"^define\s+[^@\n]*@([\w$.]+)\s*\(", text, re.MULTILINE)
    else:
        m = re.search(r"\.entry\s+([\w$]+)\s*\(", text)
    return m.group(1) if m else None


def mlir_signature(text: str, entry: str):
    """[(type, attributes)] of `entry`'s arguments in an MLIR text."""
    start = re.search(r"tt\.func\s+(?:public\s+)?@" + re.escape(entry) + r"\s*\(", text)
    if start is None:
        return None
    args_text = _balanced(text, start.end() - 1)
    out = []
    for arg in _split_top(args_text, ","):
        arg = _strip_locations(arg).strip()
        if not arg:
            continue
        # `%name: type {attrs}`: the name is whatever the source called it.
        _, _, rest = arg.partition(":")
        rest = rest.strip()
        brace = rest.find("{")
        kind, attrs = (rest, "") if brace < 0 else (rest[:brace].strip(), rest[brace:].strip())
        out.append((kind, attrs))
    return out


def describe_signature(sig) -> str:
    return ", ".join(f"{t} {a}".strip() for t, a in sig)


def _balanced(text: str, open_at: int) -> str:
    """The text inside the bracket opening at `open_at`, to its match."""
    pairs = {"(": ")", "<": ">", "{": "}", "[": "]"}
    stack = []
    in_string = False
    for i in range(open_at, len(text)):
        c = text[i]
        if in_string:
            in_string = c != '"' or text[i - 1] == "\\"
            continue
        if c == '"':
            in_string = True
        elif c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return text[open_at + 1 : i]
    raise IrFileError("unbalanced brackets in the kernel's signature")


def _split_top(text: str, sep: str):
    parts: list[str] = []
    current: list[str] = []
    depth, in_string = 0, False
    for i, c in enumerate(text):
        if in_string:
            in_string = c != '"' or text[i - 1] == "\\"
        elif c == '"':
            in_string = True
        elif c in "(<{[":
            depth += 1
        elif c in ")>}]":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(c)
    parts.append("".join(current))
    return parts


def _strip_locations(text: str) -> str:
    """`loc(...)` removed, balanced (locations nest: `loc("a"(#loc))`)."""
    while (i := text.find("loc(")) >= 0:
        inner = _balanced(text, i + 3)
        text = text[:i] + text[i + 4 + len(inner) + 1 :]
    return text
