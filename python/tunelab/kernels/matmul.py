"""A tiled Triton GEMM, C[M, N] = A[M, K] @ B[K, N], with grouped tile order.

Tunable parameters (the `config` of a job):

- BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K (constexpr, each >= 16 for tl.dot):
  the output tile one program computes and the K step of its inner loop.
- GROUP_SIZE_M (constexpr, default 1): how many tile rows are walked together;
  see `_tile_coords`.
- num_warps, num_stages (launch options, Triton's defaults 4 and 3).

Any M, N, K work: loads and the store are masked at the edges. Products are
accumulated in fp32 and C is written in C's dtype (the inputs' dtype).
Addresses use 32-bit arithmetic, so each operand must hold fewer than 2**31
elements.
"""

from __future__ import annotations


import triton
import triton.language as tl

from tunelab.dtypes import pointer
from tunelab.kernels.launch import direct_launch_enabled, direct_runner, interpreting
from tunelab.target import prebuild_host_code

_LAUNCH_OPTION_DEFAULTS = {"num_warps": 4, "num_stages": 3}


@triton.jit
def _tile_coords(pid, M, N, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    """Map a linear program id to the (row, column) of the output tile it owns.

    Programs that run at the same time should touch few distinct A row-panels
    and B column-panels, so that those panels stay in L2. Row-major order over
    tiles would sweep a whole row of C (all of B) before reusing anything;
    instead, tiles are numbered column by column within bands of GROUP_SIZE_M
    tile rows, so a wave of programs covers a compact block of C.
    """
    tile_rows = tl.cdiv(M, BLOCK_SIZE_M)
    tile_cols = tl.cdiv(N, BLOCK_SIZE_N)
    tiles_per_band = GROUP_SIZE_M * tile_cols
    band = pid // tiles_per_band
    band_first_row = band * GROUP_SIZE_M
    # The last band may be shorter than GROUP_SIZE_M.
    band_height = tl.minimum(tile_rows - band_first_row, GROUP_SIZE_M)
    index_in_band = pid % tiles_per_band
    row = band_first_row + index_in_band % band_height
    col = index_in_band // band_height
    return row, col


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    row, col = _tile_coords(tl.program_id(axis=0), M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)

    rows = row * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    cols = col * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    ks = tl.arange(0, BLOCK_SIZE_K)
    row_ok = rows < M
    col_ok = cols < N

    # Pointers to the first K-slab of this tile's A row-panel and B column-panel;
    # both advance by BLOCK_SIZE_K along K each iteration.
    a_tile = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_tile = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_SIZE_K):
        # Out-of-range K positions load as zero and so add nothing to the dot.
        k_ok = (k_start + ks) < K
        a = tl.load(a_tile, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_tile, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_tile += BLOCK_SIZE_K * stride_ak
        b_tile += BLOCK_SIZE_K * stride_bk

    c_tile = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_tile, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def split_config(config: dict):
    """Split a job config into the kernel's constexprs and Triton's launch options.

    Keys the kernel does not know (derived values a manifest computed for its
    constraints, say) are ignored.
    """
    try:
        constexprs = {
            "BLOCK_SIZE_M": int(config["BLOCK_SIZE_M"]),
            "BLOCK_SIZE_N": int(config["BLOCK_SIZE_N"]),
            "BLOCK_SIZE_K": int(config["BLOCK_SIZE_K"]),
            "GROUP_SIZE_M": int(config.get("GROUP_SIZE_M", 1)),
        }
    except KeyError as missing:
        raise ValueError(f"matmul config needs {missing.args[0]}") from None
    options = {key: int(config.get(key, default)) for key, default in _LAUNCH_OPTION_DEFAULTS.items()}
    return constexprs, options


def grid(M: int, N: int, constexprs: dict):
    """One program per output tile, in a 1-D grid so _tile_coords can reorder them."""
    return (triton.cdiv(M, constexprs["BLOCK_SIZE_M"]) * triton.cdiv(N, constexprs["BLOCK_SIZE_N"]),)


def make_launcher(a, b, c, config: dict, direct: bool | None = None):
    """Return a no-argument callable that computes c = a @ b with this config.

    Everything that does not change between launches (grid, strides, the split
    config, on a GPU the compiled kernel itself) is worked out once here, so a
    timed launch does only the launch (see tunelab.kernels.launch).
    """
    M, K = a.shape
    K2, N = b.shape
    if K != K2 or tuple(c.shape) != (M, N):
        raise ValueError(f"matmul shapes do not agree: a {tuple(a.shape)}, b {tuple(b.shape)}, c {tuple(c.shape)}")
    constexprs, options = split_config(config)
    launch_grid = grid(M, N, constexprs)
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    kwargs = {**constexprs, **options}
    if direct is None:
        direct = direct_launch_enabled(c.device)
    if direct:
        run = direct_runner(matmul_kernel, launch_grid, args, kwargs)
        if run is not None:
            return run

    def launch():
        matmul_kernel[launch_grid](*args, **kwargs)

    return launch


def compile_only(M: int, N: int, K: int, dtype, config: dict) -> bool:
    """Compile the kernel for this shape and config without launching it.

    Fills Triton's cache (memory and TRITON_CACHE_DIR) so the first real launch
    in a lane does not wait for the compiler. `dtype` is a torch dtype or, in a
    compile worker, its stand-in (tunelab.dtypes); pointer stand-ins take the
    tensors' place and Triton treats them as 16-byte aligned, as torch
    allocations are. The integer arguments are the ones a launch passes
    (contiguous operands), so the specialisation, and with it the cache key,
    matches the real launch.
    Returns False in interpreter mode, where nothing is compiled.
    """
    if interpreting():
        return False
    constexprs, options = split_config(config)
    compiled = matmul_kernel.warmup(
        pointer(dtype),
        pointer(dtype),
        pointer(dtype),
        M,
        N,
        K,
        K,
        1,
        N,
        1,
        N,
        1,
        grid=grid(M, N, constexprs),
        **constexprs,
        **options,
    )
    prebuild_host_code(compiled)
    return True
