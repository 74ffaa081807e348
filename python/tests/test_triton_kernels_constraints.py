"""tunelab.triton_kernels_constraints: a `triton_kernels_json` file applied around matmul_ogs calls.

The file is the one tests/emit.rs renders from a fixture journal (the same
bytes), so the writer and this reader are held to one format. The
constraints are checked in triton_kernels' own opt_flags module where
triton_kernels imports (`just peers`), else in a stand-in with its API.
"""

import json
import pathlib
import types

import pytest

from tunelab import peers
from tunelab import triton_kernels_constraints as tkc

FIXTURE = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "triton_kernels_constraints.json"


class FakeOptFlags:
    """triton_kernels' opt_flags API: a process-global constraints dict."""

    def __init__(self):
        self._opt_flags_constraints = {}

    def update_opt_flags_constraints(self, constraints):
        self._opt_flags_constraints.update(constraints)

    def reset_opt_flags_constraints(self):
        self._opt_flags_constraints = {}


def opt_flags_module():
    tk = peers.triton_kernels()
    if isinstance(tk, str):
        return FakeOptFlags()
    from triton_kernels.matmul_ogs_details import opt_flags

    return opt_flags


class Shaped:
    def __init__(self, *shape):
        self.shape = shape


def test_the_fixture_loads_and_the_nearest_m_wins():
    f = tkc.ConstraintsFile.load(FIXTURE)
    doc = json.loads(FIXTURE.read_text())
    assert (f.E, f.N) == (doc["shape"]["E"], doc["shape"]["N"])
    ms = sorted(int(m) for m in doc["M"])
    for m in ms:
        assert f.for_m(m) == {k: doc["M"][str(m)][k] for k in ("w1", "w2")}
    # Between two tuned M, the nearer; on a tie the first in file order (the smaller).
    assert ms[:3] == [1, 4, 16]
    entry = {m: f.for_m(m) for m in ms}
    assert f.for_m(15) is entry[16] and f.for_m(9) is entry[4] and f.for_m(10) is entry[4]
    assert entry[4] != entry[16]  # else the tie would prove nothing
    assert f.for_m(10**6) == f.for_m(ms[-1]) and f.for_m(0) == f.for_m(ms[0])
    assert f.covers(f.E, f.N) and not f.covers(f.E + 1, f.N)


def test_bad_files_say_what_is_wrong(tmp_path):
    doc = json.loads(FIXTURE.read_text())
    with pytest.raises(ValueError, match="not a triton_kernels_json file"):
        tkc.ConstraintsFile({"format": "x"})
    with pytest.raises(ValueError, match="version 2"):
        tkc.ConstraintsFile({**doc, "version": 2})
    bad = json.loads(json.dumps(doc))
    first = next(iter(bad["M"]))
    bad["M"][first]["w1"] = {"block_m": 0}
    with pytest.raises(ValueError, match=f"M={first} w1 must map constraint names to positive integers"):
        tkc.ConstraintsFile(bad)


def test_each_call_runs_with_the_files_constraints_and_the_process_keeps_its_own():
    """A fake vLLM module whose matmul_ogs records the constraints in force at
    each call: the gate/up call (a gather) gets the file's w1 constraints for
    its M tokens, the down call (a scatter, M * topk rows) its w2
    constraints, and the process's own constraints (vLLM's split_k 1) are
    back after each; a call of another shape runs with the process's."""
    opt_flags = opt_flags_module()
    opt_flags.reset_opt_flags_constraints()
    opt_flags.update_opt_flags_constraints({"split_k": 1})  # vLLM's, set at weight loading
    seen = []

    def matmul_ogs(x, w, bias, routing_data=None, gather_indx=None, scatter_indx=None, **kwargs):
        seen.append(dict(opt_flags._opt_flags_constraints))
        return "y"

    vllm_module = types.SimpleNamespace(matmul_ogs=matmul_ogs)
    files = tkc.install([FIXTURE], module=vllm_module, opt_flags=opt_flags)
    f = files[0]
    doc = json.loads(FIXTURE.read_text())
    topk = doc["shape"]["topk"]
    routing = types.SimpleNamespace(n_expts_act=topk)
    w1 = Shaped(f.E, doc["shape"]["K"], 2 * f.N)
    w2 = Shaped(f.E, f.N, doc["shape"]["K"])
    for m in (1, 5, 64, 3000):
        want = f.for_m(m)
        assert vllm_module.matmul_ogs(Shaped(m, 2880), w1, None, routing, gather_indx=object()) == "y"
        assert seen[-1] == want["w1"]
        assert opt_flags._opt_flags_constraints == {"split_k": 1}
        vllm_module.matmul_ogs(Shaped(m * topk, f.N), w2, None, routing, scatter_indx=object())
        assert seen[-1] == want["w2"]
        assert opt_flags._opt_flags_constraints == {"split_k": 1}
    other = Shaped(f.E * 2, 2880, 2 * f.N)
    vllm_module.matmul_ogs(Shaped(8, 2880), other, None, routing, gather_indx=object())
    assert seen[-1] == {"split_k": 1}
    # Installing again wraps the original, not the wrapper.
    tkc.install([FIXTURE], module=vllm_module, opt_flags=opt_flags)
    assert vllm_module.matmul_ogs.__wrapped__ is matmul_ogs
    opt_flags.reset_opt_flags_constraints()


def test_a_padded_intermediate_size_is_the_tuned_shapes():
    doc = json.loads(FIXTURE.read_text())
    doc["shape"]["N"] = 1440
    f = tkc.ConstraintsFile(doc)
    assert f.covers(f.E, 1440) and f.covers(f.E, 1472) and not f.covers(f.E, 1536)
