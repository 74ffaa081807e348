"""Method launches must not sit in reference cycles: the worker frees a shape's
inputs (gigabytes on a GPU) by dropping its references, and a cycle would keep
them until Python's cycle collector happens to run."""

import gc
import weakref

import torch

from tunelab.problems.moe import FusedMoE
from tunelab.problems.moe_torch import TorchMoELaunch


def _launch_is_freed_without_the_collector(make_launch):
    gc.collect()
    gc.disable()
    try:
        launch = make_launch()
        launch()
        probe = launch.out
        ref = weakref.ref(launch)
        del launch, probe
        return ref() is None
    finally:
        gc.enable()


def test_torch_moe_launch_is_not_in_a_reference_cycle():
    problem = FusedMoE({"M": 4, "E": 4, "topk": 2, "K": 32, "N": 16, "dtype": "fp32", "activation": "silu"})
    inputs = problem.inputs(0, torch.device("cpu"))
    for path in ("grouped_mm", "gather_bmm", "dense_bmm"):
        assert _launch_is_freed_without_the_collector(lambda path=path: TorchMoELaunch(problem, inputs, path=path)), (
            path
        )
