"""`just peers` (scripts/peers.py) and where tunelab.peers looks, on a stand-in wheel: no network."""

import importlib.util
import json
import pathlib
import zipfile

import pytest

from tunelab import peers

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "peers.py"


def load_script():
    spec = importlib.util.spec_from_file_location("peers_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_in_wheel(folder: pathlib.Path, version: str, extra=()) -> pathlib.Path:
    wheel = folder / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/third_party/triton_kernels/__init__.py", "")
        z.writestr("vllm/third_party/triton_kernels/matmul_ogs.py", "# stand-in\n")
        z.writestr("vllm/third_party/triton_kernels/tensor_details/layout.py", "# stand-in\n")
        z.writestr("vllm/third_party/triton_kernels/README.md", "not a source file")
        z.writestr("vllm/model_executor/layers/fused_moe/fused_moe.py", "def fused_moe_kernel(): pass\n")
        z.writestr("vllm/model_executor/layers/fused_moe/layer.py", "# not taken\n")
        z.writestr("vllm/big_binary.so", b"\0" * 10)
        for name, data in extra:
            z.writestr(name, data)
    return wheel


def test_just_peers_unpacks_only_what_the_comparisons_run(tmp_path):
    script = load_script()
    cache = tmp_path / "cache"
    cache.mkdir()
    wheel = stand_in_wheel(cache, script.VLLM_VERSION)
    out = tmp_path / ".peers"
    assert script.main(["--cache", str(cache), "--out", str(out)]) == 0
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [
        "manifest.json",
        "python/triton_kernels/__init__.py",
        "python/triton_kernels/matmul_ogs.py",
        "python/triton_kernels/tensor_details/layout.py",
        "vllm/fused_moe.py",
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["vllm"] == script.VLLM_VERSION and manifest["wheel"] == wheel.name
    assert manifest["wheel_sha256"] == script.sha256(wheel)
    assert manifest["python_path"] == "python"
    assert manifest["triton_kernels"]["sha256"] == script.tree_digest(out / "python" / "triton_kernels")
    # Run again: the folder is made anew, the wheel reused (no download: the cache has it).
    (out / "python" / "stale.py").write_text("")
    assert script.main(["--cache", str(cache), "--out", str(out)]) == 0
    assert not (out / "python" / "stale.py").exists()


def test_a_wheel_without_the_sources_is_refused(tmp_path):
    script = load_script()
    wheel = tmp_path / f"vllm-{script.VLLM_VERSION}-x.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "")
    with pytest.raises(SystemExit, match="has no vllm/model_executor/layers/fused_moe/fused_moe.py"):
        script.unpack(wheel, tmp_path / "out")


def test_where_tunelab_looks_for_peers(tmp_path, monkeypatch):
    folder = tmp_path / "elsewhere"
    (folder / "vllm").mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"vllm": "0.33.0", "fused_moe": {"path": "vllm/fused_moe.py"}}))
    monkeypatch.setenv("TUNELAB_PEERS", str(folder))
    assert peers.peers_dir() == folder
    assert peers.peers_manifest()["dir"] == str(folder)
    assert peers.vllm_fused_moe_source() is None  # the manifest names a file that is not there
    (folder / "vllm" / "fused_moe.py").write_text("")
    assert peers.vllm_fused_moe_source() == folder / "vllm" / "fused_moe.py"
    (folder / "manifest.json").write_text("not json")
    assert peers.peers_manifest(folder) is None
