"""fp8 GEMM with block scales (a8w8 block-scale): C[M, N] = A[M, K] @ W[N, K]^T.

A and W are fp8 (E4M3). A has one fp32 scale per row and per GROUP_K columns
(a_scale [M, ceil(K / GROUP_K)], the 1 x 128 activation blocks of DeepSeek-style
checkpoints); W one per GROUP_N x GROUP_K tile (w_scale [ceil(N / GROUP_N),
ceil(K / GROUP_K)]). C is written in its own dtype (bf16 by default). The
layout and scale shapes are those of aiter's `gemm_a8w8_blockscale` and
vLLM's `w8a8_block_fp8_matmul` (docs/quantisation.md), so a config tuned
here means the same tiles there.

Tunable parameters (the `config` of a job):

- BLOCK_SIZE_M, BLOCK_SIZE_N: the output tile of one program.
- BLOCK_SIZE_K: the K step; it must divide GROUP_K (each step lies in one
  scale group: its fp8 product is scaled once by the rows' and columns'
  scales of that group, then added to the fp32 accumulator).
- GROUP_SIZE_M: tile rows walked together (tunelab.kernels.matmul._tile_coords).
- NUM_KSPLIT: K split over this many programs per tile (decode-sized M has
  few tiles): each writes an fp32 partial, and `reduce_splits_kernel` sums
  them into C. 1: no split, C written directly.
- num_warps, num_stages: launch options.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tunelab.dtypes import fp8_e4m3, pointer, torch_dtype
from tunelab.kernels.launch import direct_launch_enabled, direct_runner, interpreting
from tunelab.kernels.matmul import _tile_coords
from tunelab.target import prebuild_host_code

CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "NUM_KSPLIT", "num_warps", "num_stages")
REDUCE_BLOCK = 1024


@triton.jit
def matmul_a8w8_blockscale_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    a_scale_ptr,
    w_scale_ptr,
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_cm,
    stride_asm,
    stride_wsn,
    k_per_split,  # K columns per split, a multiple of BLOCK_SIZE_K
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    NUM_KSPLIT: tl.constexpr,
):
    row, col = _tile_coords(tl.program_id(0), M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
    split = tl.program_id(1)
    rows = row * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    cols = col * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    row_ok = rows < M
    cols_in = cols % N  # the tail tile's extra columns read column N - ... in bounds; not stored
    ks = tl.arange(0, BLOCK_SIZE_K)
    k_first = split * k_per_split
    k_last = tl.minimum(k_first + k_per_split, K)

    a_tile = a_ptr + rows.to(tl.int64)[:, None] * stride_am + (k_first + ks)[None, :]
    w_tile = w_ptr + cols_in.to(tl.int64)[None, :] * stride_wn + (k_first + ks)[:, None]
    a_scales = a_scale_ptr + rows.to(tl.int64) * stride_asm
    w_scales = w_scale_ptr + (cols_in // GROUP_N).to(tl.int64) * stride_wsn

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(k_first, k_last, BLOCK_SIZE_K):
        k_ok = k + ks < K
        a = tl.load(a_tile, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_tile, mask=k_ok[:, None], other=0.0)
        group = k // GROUP_K
        a_s = tl.load(a_scales + group, mask=row_ok, other=0.0)
        w_s = tl.load(w_scales + group)
        acc += tl.dot(a, w) * a_s[:, None] * w_s[None, :]
        a_tile += BLOCK_SIZE_K
        w_tile += BLOCK_SIZE_K

    mask = row_ok[:, None] & (cols < N)[None, :]
    if NUM_KSPLIT == 1:
        c_tile = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
        tl.store(c_tile, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        part = c_ptr + split.to(tl.int64) * M * N + rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(part, acc, mask=mask)


@triton.jit
def reduce_splits_kernel(part_ptr, c_ptr, numel, NUM_KSPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """C = the sum of NUM_KSPLIT fp32 partials [NUM_KSPLIT, M, N], in split order."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(NUM_KSPLIT):
        acc += tl.load(part_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def split_config(config: dict, block_shape) -> tuple:
    """(constexprs, launch options) of a job config, checked."""
    try:
        c = {k: int(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")}
    except KeyError as missing:
        raise ValueError(f"matmul_a8w8_blockscale config needs {missing.args[0]}") from None
    c["GROUP_SIZE_M"] = int(config.get("GROUP_SIZE_M", 1))
    c["NUM_KSPLIT"] = int(config.get("NUM_KSPLIT", 1))
    for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
        if c[name] < 16 or c[name] & (c[name] - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {c[name]}")
    group_n, group_k = block_shape
    if c["BLOCK_SIZE_K"] < 32 or group_k % c["BLOCK_SIZE_K"]:
        raise ValueError(
            f"BLOCK_SIZE_K ({c['BLOCK_SIZE_K']}) must be at least 32 (fp8 dots) and divide the "
            f"scale block's K ({group_k}): each K step takes one scale per row and column"
        )
    if c["NUM_KSPLIT"] < 1 or c["GROUP_SIZE_M"] < 1:
        raise ValueError(f"NUM_KSPLIT and GROUP_SIZE_M must be >= 1, got {c['NUM_KSPLIT']}, {c['GROUP_SIZE_M']}")
    options = {"num_warps": int(config.get("num_warps", 4)), "num_stages": int(config.get("num_stages", 3))}
    return c, options


def k_per_split(K: int, block_k: int, splits: int) -> int:
    """Columns per split: whole K steps, so a split never starts inside a step."""
    steps = triton.cdiv(K, block_k)
    return triton.cdiv(steps, splits) * block_k


def _specs(M: int, N: int, K: int, block_shape, config: dict, bufs: dict):
    """[(kernel, grid, args, kwargs)]: the GEMM, then the reduction of the splits (NUM_KSPLIT > 1)."""
    c, options = split_config(config, block_shape)
    group_n, group_k = block_shape
    splits = c["NUM_KSPLIT"]
    per_split = k_per_split(K, c["BLOCK_SIZE_K"], splits)
    # Splits that would start past K do no work; the grid has only the others.
    used = triton.cdiv(K, per_split)
    grid = (triton.cdiv(M, c["BLOCK_SIZE_M"]) * triton.cdiv(N, c["BLOCK_SIZE_N"]), used)
    target = bufs["c"] if used == 1 else bufs["part"]
    args = (
        bufs["a"],
        bufs["w"],
        target,
        bufs["a_scale"],
        bufs["w_scale"],
        M,
        N,
        K,
        K,
        K,
        N,
        triton.cdiv(K, group_k),
        triton.cdiv(K, group_k),
        per_split,
    )
    kwargs = dict(GROUP_N=group_n, GROUP_K=group_k, **dict(c, NUM_KSPLIT=used), **options)
    specs: list[tuple] = [(matmul_a8w8_blockscale_kernel, grid, args, kwargs)]
    if used > 1:
        specs.append(
            (
                reduce_splits_kernel,
                (triton.cdiv(M * N, REDUCE_BLOCK),),
                (bufs["part"], bufs["c"], M * N),
                dict(NUM_KSPLIT=used, BLOCK=REDUCE_BLOCK, num_warps=4),
            )
        )
    return specs


def make_launcher(a, w, a_scale, w_scale, c, block_shape, config: dict, direct: bool | None = None):
    """A no-argument callable computing c = (a, a_scale) @ (w, w_scale)^T with this config."""
    import torch

    M, K = a.shape
    N, K2 = w.shape
    if K != K2 or tuple(c.shape) != (M, N):
        raise ValueError(f"shapes do not agree: a {tuple(a.shape)}, w {tuple(w.shape)}, c {tuple(c.shape)}")
    c_cfg, _ = split_config(config, block_shape)
    part = None
    if c_cfg["NUM_KSPLIT"] > 1:
        part = torch.empty(c_cfg["NUM_KSPLIT"], M, N, dtype=torch.float32, device=a.device)
    bufs = {"a": a, "w": w, "c": c, "a_scale": a_scale, "w_scale": w_scale, "part": part}
    specs = _specs(M, N, K, block_shape, config, bufs)
    if direct is None:
        direct = direct_launch_enabled(c.device)
    if direct:
        runners = [direct_runner(*spec) for spec in specs]
        if all(r is not None for r in runners):

            def run_direct():
                for r in runners:
                    r()

            return run_direct

    def launch():
        for kernel, grid, args, kwargs in specs:
            kernel[grid](*args, **kwargs)

    return launch


def compile_only(M: int, N: int, K: int, block_shape, out_dtype, config: dict) -> bool:
    """Compile the kernels for this shape and config without launching (no GPU needed);
    False in interpreter mode, where nothing is compiled."""
    if interpreting():
        return False
    f8, f32 = pointer(fp8_e4m3()), pointer(torch_dtype("fp32"))
    bufs = {"a": f8, "w": f8, "c": pointer(out_dtype), "a_scale": f32, "w_scale": f32, "part": f32}
    for kernel, grid, args, kwargs in _specs(M, N, K, block_shape, config, bufs):
        prebuild_host_code(kernel.warmup(*args, grid=grid, **kwargs))
    return True
