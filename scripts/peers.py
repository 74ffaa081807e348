"""Fetch the peers' sources that tunelab compares against into `.peers/`.

    python scripts/peers.py [--cache DIR] [--out .peers]

tunelab compares with other projects' kernels by running their own code, taken
from their released packages (docs/peers.md). This script takes vLLM's wheel
(`pip download --no-deps`, about 340 MB, kept in a cache folder and reused),
and unpacks from it only what the comparisons run:

- `vllm/third_party/triton_kernels/` (OpenAI's triton_kernels as vLLM bundles
  it, under 1 MB) into `.peers/python/triton_kernels/`, importable as
  `triton_kernels` once `.peers/python` is on the path;
- vLLM's Triton fused-MoE source (`fused_moe.py`) into `.peers/vllm/`, read
  (never imported) by the test that holds `fused_moe_vllm` to vLLM's kernel.

It writes `.peers/manifest.json`: the wheel's name, version and sha256, what
was unpacked from where, and `python_path` (relative to `.peers/`), which
tunelab's workers put on `sys.path`. `.peers/` is git-ignored: no peer's
source is ever committed. A GPU machine without network gets the folder from
a machine that ran this (`just peers`), carried with the checkout.

The cache folder is `--cache`, else `$TUNELAB_PEERS_CACHE`, else
`~/.cache/tunelab/peers`. Only the standard library and pip are used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

VLLM_VERSION = "0.33.0"
# What is taken from the wheel: (prefix in the wheel, folder under .peers/).
TRITON_KERNELS = ("vllm/third_party/triton_kernels/", "python/triton_kernels/")
FUSED_MOE_FILES = (("vllm/model_executor/layers/fused_moe/fused_moe.py", "vllm/fused_moe.py"),)
MANIFEST = "manifest.json"
# A wheel member larger than this is not what we want (the sources are small).
MAX_MEMBER_BYTES = 4 << 20


def cache_dir(arg: str | None) -> pathlib.Path:
    if arg:
        return pathlib.Path(arg)
    env = os.environ.get("TUNELAB_PEERS_CACHE")
    if env:
        return pathlib.Path(env)
    return pathlib.Path.home() / ".cache" / "tunelab" / "peers"


def find_wheel(folder: pathlib.Path) -> pathlib.Path | None:
    wheels = sorted(folder.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    return wheels[0] if wheels else None


def download(folder: pathlib.Path) -> pathlib.Path:
    """vLLM's wheel in `folder`, downloaded by pip when it is not there yet."""
    wheel = find_wheel(folder)
    if wheel is not None:
        return wheel
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"vllm=={VLLM_VERSION}",
        "-d",
        str(folder),
    ]
    print("peers: " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    wheel = find_wheel(folder)
    if wheel is None:
        raise SystemExit(f"peers: pip downloaded no vllm-{VLLM_VERSION} wheel into {folder}")
    return wheel


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(root: pathlib.Path) -> str:
    """sha256 over the files under `root` (relative path and bytes, sorted by path)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _safe_target(out: pathlib.Path, relative: str) -> pathlib.Path:
    target = (out / relative).resolve()
    if not str(target).startswith(str(out.resolve()) + os.sep):
        raise SystemExit(f"peers: refusing to write {relative!r} outside {out}")
    return target


def unpack(wheel: pathlib.Path, out: pathlib.Path) -> list[str]:
    """Unpack the members named above into `out`; returns the paths written (relative to `out`)."""
    written = []
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        wanted = []
        prefix, dest = TRITON_KERNELS
        for name in names:
            if name.startswith(prefix) and name.endswith(".py"):
                wanted.append((name, dest + name[len(prefix) :]))
        for name, dest_name in FUSED_MOE_FILES:
            if name not in names:
                raise SystemExit(f"peers: {wheel.name} has no {name}")
            wanted.append((name, dest_name))
        if not any(name.startswith(prefix) for name, _ in wanted):
            raise SystemExit(f"peers: {wheel.name} has no {prefix}")
        for name, dest_name in wanted:
            info = z.getinfo(name)
            if info.file_size > MAX_MEMBER_BYTES:
                raise SystemExit(f"peers: {name} in {wheel.name} is {info.file_size} bytes, more than expected")
            target = _safe_target(out, dest_name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
            written.append(dest_name)
    return sorted(written)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache", help="folder for vLLM's wheel (default $TUNELAB_PEERS_CACHE or ~/.cache/tunelab/peers)"
    )
    parser.add_argument("--out", default=".peers", help="where to unpack (default .peers, git-ignored)")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    wheel = download(cache_dir(args.cache))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = unpack(wheel, out)
    manifest = {
        "vllm": VLLM_VERSION,
        "wheel": wheel.name,
        "wheel_sha256": sha256(wheel),
        "python_path": "python",
        "triton_kernels": {
            "from": f"vllm {VLLM_VERSION} wheel, {TRITON_KERNELS[0]}",
            "path": TRITON_KERNELS[1].rstrip("/"),
            "sha256": tree_digest(out / TRITON_KERNELS[1]),
        },
        "fused_moe": {
            "from": f"vllm {VLLM_VERSION} wheel, {FUSED_MOE_FILES[0][0]}",
            "path": FUSED_MOE_FILES[0][1],
        },
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"peers: {len(files)} files from {wheel.name} in {out} ({size / 1024:.0f} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
