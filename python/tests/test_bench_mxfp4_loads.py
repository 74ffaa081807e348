"""bench/mxfp4_m1_loads.py: its load-only kernels read the bytes they claim
to (run on a small shape under the interpreter, or on a GPU)."""

import pytest
import torch
import triton
from conftest import DEVICE, load_bench

from tunelab.problems.moe import FusedMoE


@pytest.fixture(scope="module")
def ml():
    return load_bench("mxfp4_m1_loads")


def test_row_major_and_tile_major_loads_fold_the_same_bytes(ml):
    """Two splits of a K = 288 reduction (nine scale groups, five K steps of 64
    with the last partly past K): the row-major loads (a step at a time, and
    a step ahead) and the tile-major ones fold to the same word per row and
    split, and that word is the XOR of the row's words, scales and the
    activations' bits over the split's groups, computed here on the host."""
    p = FusedMoE(
        {
            "M": 1,
            "E": 8,
            "topk": 4,
            "K": 288,
            "N": 64,
            "act_dtype": "fp16",
            "dtype": "mxfp4",
            "activation": "swiglu_oai",
        }
    )
    inputs = p.inputs(0, DEVICE)
    w1, s1 = inputs["w1"], inputs["w1_scale"]
    experts = inputs["topk_ids"].reshape(-1).to(torch.int32).contiguous()
    x = inputs["x"].float().contiguous()
    rows, bn, bk, split = w1.shape[1], 32, 64, 2
    grid = (experts.numel() * triton.cdiv(rows, bn), split)
    outs = []
    for ahead in (0, 1):
        out = torch.zeros(experts.numel() * rows * split, dtype=torch.int32, device=DEVICE)
        ml.gemv_loads_kernel[grid](
            x,
            w1,
            s1,
            experts,
            out,
            288,
            rows,
            w1.stride(0),
            w1.stride(1),
            s1.stride(0),
            s1.stride(1),
            BLOCK_SIZE_N=bn,
            BLOCK_SIZE_K=bk,
            SPLIT_K=split,
            AHEAD=ahead,
        )
        outs.append(out)
    wt, st, steps = ml.tile_major(w1[experts.long()], s1[experts.long()], bn, bk)
    assert steps == 5 and wt.shape == (4, rows // bn, 5, bn, bk // 2)
    tiled = torch.zeros_like(outs[0])
    ml.tiled_loads_kernel[grid](x, wt, st, tiled, 288, rows, steps, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, SPLIT_K=split)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], tiled)
    # Expert 0's row 5, second split: steps 3 and 4, scale groups 6 to 8 (K = 288 is 9 groups).
    words = w1[experts[0].long(), 5].view(torch.int32).cpu()
    scales = s1[experts[0].long(), 5].to(torch.int32).cpu()
    want = 0
    for g in range(6, 9):
        for q in range(4):
            want ^= int(words[g * 4 + q]) ^ int(scales[g])
    for v in x[0, 6 * 32 : 288].view(torch.int32).cpu().tolist():
        want ^= v
    assert int(outs[0][5 * split + 1]) == want
