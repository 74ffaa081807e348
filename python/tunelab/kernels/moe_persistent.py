"""Host side of the persistent MoE (the `fused_moe_persistent` method): the
whole call in one launch of tunelab.kernels.moe_persistent_kernels'
`moe_persistent_kernel` (or, with GEMV=1, `moe_persistent_gemv_kernel`).

Its config keys and default config, the plan (`make_persistent_plan`), the
launch arguments, the grid (every program resident at once, so in-kernel
waits end) and the bound launch (`PersistentMoELaunch`, whose docstring has
the design). tunelab.kernels.fused_moe re-exports these names, where the
problem (tunelab.problems.moe), tests and bench scripts import them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import triton

from tunelab.dtypes import int32, is_fp32, pointer, torch_dtype
from tunelab.kernels.launch import compiled_runner, direct_launch_enabled, interpreting
from tunelab.kernels.moe_kernels import ACT_SILU, ACT_SWIGLU_OAI, _align_meta, _next_pow2, align_sizes
from tunelab.kernels.moe_persistent_kernels import (
    TRACE_PER_PROGRAM,
    WS_HEADER,
    WS_TIMED_OUT,
    moe_persistent_gemv_kernel,
    moe_persistent_kernel,
)
from tunelab.lazy import torch
from tunelab.target import prebuild_host_code

PERSISTENT_CONFIG_KEYS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "BLOCK_SIZE_N2",
    "BLOCK_SIZE_K2",
    "SPLIT_K",
    "num_warps",
    "num_stages",
    "PROGRAMS_PER_SM",
    "PREFETCH_W2",
    "GEMV",
)
# SPLIT_K applies while GEMM 1 has at most this many tiles (decode sizes, where
# tiles are fewer than programs); above it every program has whole tiles to
# take, and the slices' buffer would grow with M: SPLIT_K is then 1.
SPLIT_K_MAX_TILES = 1024
# Up to this many (token, k) slots every program aligns in registers ([n, n]
# comparisons, once per program); above it program 0 aligns into memory and
# the others wait for it.
PERSISTENT_SELF_ALIGN_MAX = 64
# PREFETCH_W2 only where the w2 rows the routing can select fit this many
# bytes: far below any tunelab target's L2 (50 MB on an H100, 40 MB on an
# A100), so prefetched lines are still there when GEMM 2 reads them.
PREFETCH_BUDGET_BYTES = 16 << 20
# Polls before a wait gives up (about a second of spinning; see _wait_at_least).
MAX_SPIN = 1 << 22
# Triton's interpreter has no SMs: the phase launches use this many programs
# unless told otherwise (several items per program, as on a GPU).
INTERPRETER_PROGRAMS = 3


def persistent_default_config(M: int, N: int) -> dict:
    """The persistent config a job runs when it names none of the keys.

    Each choice below was measured on an H100 (bench/moe_methods.py, gpt-oss
    E=128, K=2880, bf16, SiLU; µs cold / under graph timing), as the best of
    a coordinate search (M=1 and 8) or of a one-key sweep (M=64). M <= 2 with
    N <= 720 is from results/bench/NVIDIA_H100_80GB_HBM3/moe_methods-2026-11-23.md
    (the kernel as it is), the rest from moe_methods-2026-11-22.md (before
    the GEMM 2 count and the prefetch changed, see PersistentMoELaunch; those
    rows take 75-1770 µs, where the 1 µs those changes saved matters little):

    - M <= 2, N <= 360: GEMM 1 in four K slices of 64-row tiles (4 x 12 tiles
      alone would leave most SMs idle), GEMM 2's weights prefetched: N=360
      19.9 / 13.7;
    - M <= 2, N <= 720: whole 64-row tiles, eight warps: N=720 28.3 / 24.9
      (the four-launch call: 29.8 / 24.9);
    - M <= 2, larger N: whole 64-row tiles, enough of them: N=2880 80.7 / 78.1;
    - M <= 16: whole 64-row tiles, six stages, GEMM 2 tiles of 128 columns:
      N=360 M=8 75.7 / 73.3;
    - M <= 64: 16-slot blocks, 32-row tiles, four programs per SM: M=64
      N=360 261.5 / 259.6, N=720 470.5 / 468.8, N=2880 1770.3 / 1767.8;
    - above: larger tiles (not measured).
    """
    base = {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "BLOCK_SIZE_N2": 64,
        "BLOCK_SIZE_K2": 64,
        "SPLIT_K": 1,
        "num_warps": 4,
        "num_stages": 4,
        "PROGRAMS_PER_SM": 2,
        "PREFETCH_W2": 1,
        "GEMV": 0,
    }
    if M <= 2:
        if N <= 360:
            return dict(base, BLOCK_SIZE_K=64, SPLIT_K=4)
        if N <= 720:
            return dict(base, num_warps=8, PREFETCH_W2=0)
        return dict(base, BLOCK_SIZE_K=64, PREFETCH_W2=0)
    if M <= 16:
        return dict(base, BLOCK_SIZE_N2=128, num_stages=6)
    if M <= 64:
        return dict(base, BLOCK_SIZE_N=32, PROGRAMS_PER_SM=4)
    return {
        "BLOCK_SIZE_M": 64 if M <= 512 else 128,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 64,
        "BLOCK_SIZE_N2": 128,
        "BLOCK_SIZE_K2": 64,
        "SPLIT_K": 1,
        "num_warps": 8,
        "num_stages": 3,
        "PROGRAMS_PER_SM": 1,
        "PREFETCH_W2": 1,
        "GEMV": 0,
    }


@dataclasses.dataclass(frozen=True)
class PersistentPlan:
    """Everything a persistent launch needs that depends on the shape and config only."""

    M: int
    E: int
    topk: int
    K: int
    N: int
    dtype: object  # a torch dtype, or its stand-in in a compile worker
    activation: int
    interleaved: bool
    has_bias: bool
    config: dict
    numel: int
    max_blocks: int
    max_padded: int
    align_meta: dict
    n_tiles1: int
    n_tiles2: int
    # NUMEL_PAD when every program aligns in registers, else 0 (program 0 aligns into memory).
    self_align: int
    # Elements per 128-byte line when GEMM 2's weights are prefetched into L2, else 0.
    prefetch: int
    # K slices per GEMM 1 tile (config SPLIT_K, or 1 above SPLIT_K_MAX_TILES).
    split_k: int
    ws_words: int
    # The GEMV schedule (config GEMV=1, moe_persistent_gemv_kernel): every slot is
    # a block of its own, GEMM 1 items are (slot, tile), GEMM 2 items (token, tile).
    gemv: bool = False

    def max_items(self) -> int:
        """GEMM 1 and GEMM 2 items at most: no grid needs more programs. (A GEMV
        program takes GEMM 1 items, then GEMM 2 items: the larger count will do.)"""
        if self.gemv:
            return max(self.numel * self.n_tiles1, self.M * self.n_tiles2)
        return self.max_blocks * (self.n_tiles1 * self.split_k + self.n_tiles2)

    def slices_elems(self) -> int:
        """fp32 elements of GEMM 1's K-slice buffer (1 when GEMM 1 is not split)."""
        if self.split_k == 1:
            return 1
        c = self.config
        return self.max_blocks * self.n_tiles1 * self.split_k * c["BLOCK_SIZE_M"] * c["BLOCK_SIZE_N"]


def make_persistent_plan(problem, config: dict, *, self_align_max: int | None = None) -> PersistentPlan:
    """The persistent launch plan for a problem and a config of PERSISTENT_CONFIG_KEYS.

    `self_align_max` (tests) overrides PERSISTENT_SELF_ALIGN_MAX. A config
    without GEMV (one written before that key) is the tiled schedule."""
    config = dict({"GEMV": 0}, **config)
    missing = [k for k in PERSISTENT_CONFIG_KEYS if k not in config]
    if missing:
        raise ValueError(f"fused_moe_persistent config needs {missing} (keys: {list(PERSISTENT_CONFIG_KEYS)})")
    c = {k: int(config[k]) for k in PERSISTENT_CONFIG_KEYS}
    if c["GEMV"] not in (0, 1):
        raise ValueError(f"GEMV must be 0 (tiles and tl.dot) or 1 (matrix-vector items), got {c['GEMV']}")
    gemv = bool(c["GEMV"])
    if gemv:
        for name, least in (("BLOCK_SIZE_N", 2), ("BLOCK_SIZE_N2", 1)):
            v = c[name]
            if v < least or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= {least} with GEMV=1, got {v}")
    else:
        for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "BLOCK_SIZE_N2", "BLOCK_SIZE_K2"):
            v = c[name]
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (tl.dot needs 16), got {v}")
    if c["PROGRAMS_PER_SM"] < 1:
        raise ValueError(f"PROGRAMS_PER_SM must be >= 1, got {c['PROGRAMS_PER_SM']}")
    if c["SPLIT_K"] < 1:
        raise ValueError(f"SPLIT_K must be >= 1, got {c['SPLIT_K']}")
    if c["PREFETCH_W2"] not in (0, 1):
        raise ValueError(f"PREFETCH_W2 must be 0 or 1, got {c['PREFETCH_W2']}")
    bm = c["BLOCK_SIZE_M"]
    numel = problem.M * problem.topk
    max_blocks, max_padded = align_sizes(numel, problem.E, bm)
    limit = PERSISTENT_SELF_ALIGN_MAX if self_align_max is None else self_align_max
    self_align = max(2, _next_pow2(numel)) if numel <= limit else 0
    es = 4 if is_fp32(problem.dtype) else 2
    w2_reachable = min(problem.E, numel) * problem.K * problem.N * es
    prefetch = 128 // es if (c["PREFETCH_W2"] and w2_reachable <= PREFETCH_BUDGET_BYTES and not interpreting()) else 0
    n_tiles1 = triton.cdiv(2 * problem.N, c["BLOCK_SIZE_N"])
    n_tiles2 = triton.cdiv(problem.K, c["BLOCK_SIZE_N2"])
    split_k = c["SPLIT_K"] if max_blocks * n_tiles1 <= SPLIT_K_MAX_TILES else 1
    if gemv:
        # Keys the GEMV schedule does not read are left out of its plan, so
        # nothing downstream (buffers, workspace) depends on them.
        max_blocks, max_padded, self_align, prefetch, split_k = numel, numel, 0, 0, 1
    return PersistentPlan(
        M=problem.M,
        E=problem.E,
        topk=problem.topk,
        K=problem.K,
        N=problem.N,
        dtype=problem.dtype,
        activation=ACT_SWIGLU_OAI if problem.activation == "swiglu_oai" else ACT_SILU,
        interleaved=problem.interleaved,
        has_bias=problem.bias,
        config=c,
        numel=numel,
        max_blocks=max_blocks,
        max_padded=max_padded,
        align_meta=_align_meta(numel, problem.E, max_padded),
        n_tiles1=n_tiles1,
        n_tiles2=n_tiles2,
        self_align=self_align,
        prefetch=prefetch,
        split_k=split_k,
        ws_words=(
            WS_HEADER
            if gemv
            else WS_HEADER + 2 * max_blocks + problem.M * n_tiles2 + (max_blocks * n_tiles1 if split_k > 1 else 0)
        ),
        gemv=gemv,
    )


def two_pow2_parts(n: int) -> tuple[int, int]:
    """(A, B): A the largest power of two below n (n // 2 for a power of two),
    B the power of two covering the rest: 2880 -> (2048, 1024), 360 -> (256, 128)."""
    if n < 2:
        raise ValueError(f"two_pow2_parts needs n >= 2, got {n}")
    a = 1 << (int(n) - 1).bit_length() - 1
    return a, _next_pow2(n - a)


def _acquire_loads() -> bool:
    """Whether the target takes PTX acquire loads (CUDA; not HIP or the interpreter)."""
    if interpreting():
        return False
    import triton.runtime

    return triton.runtime.driver.active.get_current_target().backend == "cuda"


def _persistent_gemv_spec(plan: PersistentPlan, b: dict, phase: int):
    """(kernel, args, kwargs) of one launch of the GEMV schedule."""
    c = plan.config
    k_a, k_b = two_pow2_parts(plan.K)
    n_a, n_b = two_pow2_parts(plan.N)
    args = (
        b["x"],
        b["w1"],
        b["b1"] if plan.has_bias else b["x"],
        b["w2"],
        b["b2"] if plan.has_bias else b["x"],
        b["topk_ids"],
        b["topk_weights"],
        b["inter"],
        b["out"],
        b["ws"],
    )
    kwargs = dict(
        M=plan.M,
        N=plan.N,
        K=plan.K,
        TOPK=plan.topk,
        TOPK_PAD=_next_pow2(plan.topk),
        INTERLEAVED=plan.interleaved,
        ACTIVATION=plan.activation,
        HAS_BIAS=plan.has_bias,
        ROWS1=c["BLOCK_SIZE_N"] // 2,
        K_A=k_a,
        K_B=k_b,
        COLS2=c["BLOCK_SIZE_N2"],
        N_A=n_a,
        N_B=n_b,
        ACQUIRE_LOADS=_acquire_loads(),
        PHASE=phase,
        MAX_SPIN=MAX_SPIN,
        num_warps=c["num_warps"],
        num_stages=1,
    )
    return moe_persistent_gemv_kernel, args, kwargs


def _persistent_spec(plan: PersistentPlan, b: dict, phase: int):
    """(kernel, args, kwargs) of one persistent launch; the grid is the caller's."""
    if plan.gemv:
        return _persistent_gemv_spec(plan, b, phase)
    c = plan.config
    precision = "ieee" if is_fp32(plan.dtype) else "tf32"  # tf32 is ignored for 16-bit inputs
    # Without its own alignment the kernel still takes the buffers: any pointer will do.
    align = (b["sorted_ids"], b["expert_ids"], b["num_post"], b["cursor"])
    args = (
        b["x"],
        b["w1"],
        b["b1"] if plan.has_bias else b["x"],
        b["w2"],
        b["b2"] if plan.has_bias else b["x"],
        b["topk_ids"],
        b["topk_weights"],
        b["inter"],
        b["part"],
        b["slices"],
        b["out"],
        *align,
        b["ws"],
        b.get("trace", b["ws"]),
    )
    kwargs = dict(
        N=plan.N,
        K=plan.K,
        numel=plan.numel,
        num_experts=plan.E,
        max_blocks=plan.max_blocks,
        max_padded=plan.max_padded,
        ws_words=plan.ws_words,
        TOPK=plan.topk,
        INTERLEAVED=plan.interleaved,
        ACTIVATION=plan.activation,
        HAS_BIAS=plan.has_bias,
        EVEN_K1=plan.K % c["BLOCK_SIZE_K"] == 0,
        EVEN_K2=plan.N % c["BLOCK_SIZE_K2"] == 0,
        PRECISION=precision,
        BLOCK_SIZE_M=c["BLOCK_SIZE_M"],
        BLOCK_SIZE_N=c["BLOCK_SIZE_N"],
        BLOCK_SIZE_K=c["BLOCK_SIZE_K"],
        BLOCK_SIZE_N2=c["BLOCK_SIZE_N2"],
        BLOCK_SIZE_K2=c["BLOCK_SIZE_K2"],
        SPLIT_K=plan.split_k,
        SELF_ALIGN=plan.self_align,
        E_PAD=plan.align_meta["E_PAD"],
        CHUNK=plan.align_meta["CHUNK"],
        BCHUNK=plan.align_meta["BCHUNK"],
        PHASE=phase,
        PREFETCH_W2=plan.prefetch if phase < 0 else 0,
        MAX_SPIN=MAX_SPIN,
        TRACE=int("trace" in b),
        num_warps=c["num_warps"],
        num_stages=c["num_stages"],
    )
    return moe_persistent_kernel, args, kwargs


def trace_layout(plan: PersistentPlan, grid: int) -> dict:
    """Where a traced launch (TRACE) stamps its times: (first int64 word, count)
    of the per-program records (TRACE_PER_PROGRAM words), the GEMM 1 item
    records (3 words) and the GEMM 2 item records (4 words), and the words in all."""
    items1 = plan.max_blocks * plan.n_tiles1 * plan.split_k
    items2 = plan.max_blocks * plan.n_tiles2
    first1 = grid * TRACE_PER_PROGRAM
    first2 = first1 + 3 * items1
    return {"programs": (0, grid), "items1": (first1, items1), "items2": (first2, items2), "words": first2 + 4 * items2}


def persistent_phases(plan: PersistentPlan):
    """The launches of one call: [-1] (everything, synchronised in-kernel) when
    compiling for a GPU; one per phase under Triton's interpreter."""
    if not interpreting():
        return [-1]
    return ([] if plan.self_align or plan.gemv else [0]) + [1, 2]


def compile_persistent(plan: PersistentPlan):
    """Compile the persistent kernel into Triton's cache without launching it.

    Needs no GPU and no SM count: the grid is a launch argument, not part of
    the binary."""
    dt, i32, f32 = pointer(plan.dtype), pointer(int32()), pointer(torch_dtype("fp32"))
    b = {
        "x": dt,
        "w1": dt,
        "b1": dt,
        "w2": dt,
        "b2": dt,
        "inter": dt,
        "out": dt,
        "part": f32,
        "slices": f32,
        "topk_ids": i32,
        "sorted_ids": i32,
        "expert_ids": i32,
        "num_post": i32,
        "cursor": i32,
        "ws": i32,
        "topk_weights": f32,
    }
    for phase in persistent_phases(plan):
        kernel, args, kwargs = _persistent_spec(plan, b, phase)
        prebuild_host_code(kernel.warmup(*args, grid=(1,), **kwargs))


def resident_programs_per_sm(n_regs: int, shared_bytes: int, num_warps: int, props) -> int:
    """How many programs of a kernel one SM holds at once (CUDA's occupancy
    rules, rounded down where they are granular): threads, registers (256 per
    warp granule), shared memory (plus the 1 KB the driver reserves per block),
    and 32 blocks. `props` is torch's device properties."""
    warp = getattr(props, "warp_size", 32)
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (num_warps * warp)
    regs_per_warp = -(-max(int(n_regs), 1) * warp // 256) * 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * num_warps)
    smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    by_smem = smem // (int(shared_bytes) + 1024)
    return max(0, min(by_threads, by_regs, by_smem, 32))


def _libcuda():
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    return None


def pin_resident(function, threads: int, shared_bytes: int):
    """Make the driver keep as many programs of `function` on an SM as its
    resources allow, and return that count (None where libcuda is not at hand).

    Asks for the largest shared-memory carveout (CU_FUNC_ATTRIBUTE_PREFERRED_
    SHARED_MEMORY_CARVEOUT = 100 %), so that the L1/shared split the driver
    picks at launch never holds fewer programs than computed, then asks the
    driver's occupancy calculator (cuOccupancyMaxActiveBlocksPerMultiprocessor),
    the figure cooperative launches are checked against.
    """
    import ctypes

    lib = _libcuda()
    if lib is None:
        return None
    handle = ctypes.c_void_p(int(function))
    lib.cuFuncSetAttribute(handle, ctypes.c_int(9), ctypes.c_int(100))
    blocks = ctypes.c_int(0)
    status = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(blocks), handle, ctypes.c_int(threads), ctypes.c_size_t(shared_bytes)
    )
    return blocks.value if status == 0 else None


def persistent_grid(plan: PersistentPlan, n_regs: int, shared_bytes: int, device, driver_resident=None) -> int:
    """Programs of a persistent launch: PROGRAMS_PER_SM on every SM, never more
    than the GPU holds at once (a program that waits must never wait for one
    that is not running: the waited-for one could not start until the waiter
    left its SM), nor more than the call has tiles. `driver_resident` is the
    driver's own count (pin_resident) where it could be asked: the smaller
    of it and ours is used."""
    props = torch.cuda.get_device_properties(device)
    resident = resident_programs_per_sm(n_regs, shared_bytes, plan.config["num_warps"], props)
    if driver_resident is not None:
        resident = min(resident, driver_resident)
    if resident < 1:
        raise ValueError(
            f"moe_persistent_kernel does not fit on an SM ({n_regs} registers a thread, "
            f"{shared_bytes} bytes of shared memory, {plan.config['num_warps']} warps): "
            "use smaller tiles, fewer stages or fewer warps"
        )
    per_sm = min(plan.config["PROGRAMS_PER_SM"], resident)
    return max(1, min(props.multi_processor_count * per_sm, plan.max_items()))


class PersistentMoELaunch:
    """A bound persistent call: one launch (GPU) computing into `out`.

    Design (moe_persistent_kernel):

    - Grid: `persistent_grid`, every program resident at once, so in-kernel
      waits cannot deadlock. Programs take work items round robin: first all
      GEMM 1 tiles (block x w1 row tile), then all GEMM 2 tiles (block x output
      column tile). Everything before a program's first wait is work that
      waits for nothing (GEMM 1 tiles, the alignment), so every wait ends.
    - Alignment: up to PERSISTENT_SELF_ALIGN_MAX slots, every program computes
      the (stable) layout in registers, with no wait. Above it, program 0 runs
      moe_align_kernel's code into memory and publishes a flag (release); the
      others wait for it (acquire).
    - GEMM 1 split in K (SPLIT_K > 1, decode sizes): each item is one K
      slice of a tile, written to `slices` (fp32); the program that brings
      the tile's SPLITS count to SPLIT_K sums the slices in slice order
      (deterministic) and runs the epilogue. More, smaller items when a
      decode call has fewer tiles than programs.
    - GEMM 1 -> GEMM 2: no grid-wide barrier. Each GEMM 1 tile counts itself
      into its block's READY word (release); a GEMM 2 tile waits only for its
      own block's n_tiles1 tiles (acquire), so GEMM 2 starts block by block.
      With PREFETCH_W2, GEMM 2's weights are asked of L2 at the start: by the
      programs with no GEMM 1 item where there are such, else by each program
      for its own GEMM 2 tiles.
    - Top-k sum, fused into GEMM 2: each GEMM 2 tile writes its weighted rows
      (fp32) to `part`, then counts each row's token into ARRIVED[token, tile];
      the program that brings a count to topk sums the token's topk rows in
      slot order (deterministic: the same bits whoever arrives last) into `out`.
    - Workspace: `ws` (int32, PersistentPlan.ws_words) is zeroed here once;
      every launch leaves it zero (the last GEMM 2 tile of a block clears the
      block's words, the summing program clears its count, the last program to
      exit clears the alignment flag). A failed wait (MAX_SPIN) sets the
      sticky WS_TIMED_OUT word instead of hanging: see `timed_out()`.

    - Cold L2: each program first asks L2 for one line of the workspace, so
      the counters' first atomics do not each wait for DRAM.

    Under Triton's interpreter the same kernel runs once per phase (see
    moe_persistent_kernel); `grid` overrides the number of programs (tests).

    - N is a constexpr because, as a runtime argument, N=360 is not known to
      be a multiple of 16: GEMM 2 then loaded w2 two bytes at a time,
      unpipelined.
    - Triton orders no global memory between the threads of a program: a
      program that reads values and then overwrites them needs a barrier
      between the two, or a thread may overwrite what another has not read
      yet (the layout of the stores need not be the loads').

    The GEMV schedule (config GEMV=1, moe_persistent_gemv_kernel), for one or
    two tokens: no tiles of BLOCK_SIZE_M slots, no tl.dot. A GEMM 1 item is
    one slot's BLOCK_SIZE_N w1 rows over the whole of K, a GEMM 2 item one
    token's BLOCK_SIZE_N2 output columns over all its experts, with the top-k
    summed in registers (no `part` rows, no top-k count). Each item's whole K
    (GEMM 2's whole N) is one tile in two power-of-two parts, so all its
    loads are issued before the first product; GEMM 2's w2 tile is loaded
    before its wait, the wait polls with acquire loads, and the last program
    past it clears the counters. It loses from N=1440 on, where GEMM 2's tile
    of N columns no longer fits in registers.

    What each choice was measured at, on an H100 and an H200, and what was
    tried and not kept (with commits and result files): docs/performance.md,
    "Persistent MoE at decode sizes", "The persistent kernel, step by step".
    """

    def __init__(
        self,
        plan: PersistentPlan,
        inputs: dict,
        direct: bool | None = None,
        grid: int | None = None,
        trace: bool = False,
    ):
        self.plan = plan
        x = inputs["x"]
        dev = x.device
        i32 = torch.int32
        self.inputs = {k: v.contiguous() for k, v in inputs.items()}
        if self.inputs["topk_ids"].dtype != i32:
            self.inputs["topk_ids"] = self.inputs["topk_ids"].to(i32)
        if self.inputs["topk_weights"].dtype != torch.float32:
            self.inputs["topk_weights"] = self.inputs["topk_weights"].float()
        aligned = plan.self_align == 0 and not plan.gemv  # the alignment lives in memory (GEMV has none)
        self.sorted_ids = torch.empty(plan.max_padded if aligned else 1, dtype=i32, device=dev)
        self.expert_ids = torch.empty(plan.max_blocks if aligned else 1, dtype=i32, device=dev)
        self.num_post = torch.empty(1, dtype=i32, device=dev)
        self.cursor = torch.empty(plan.align_meta["E_PAD"] if aligned else 1, dtype=i32, device=dev)
        self.inter = torch.empty(plan.numel, plan.N, dtype=plan.dtype, device=dev)
        # GEMV sums the top-k in registers: no fp32 rows.
        self.part = torch.empty(1 if plan.gemv else plan.numel * plan.K, dtype=torch.float32, device=dev)
        self.slices = torch.empty(plan.slices_elems(), dtype=torch.float32, device=dev)
        self.out = torch.empty(plan.M, plan.K, dtype=plan.dtype, device=dev)
        self.ws = torch.zeros(plan.ws_words, dtype=i32, device=dev)
        bufs = dict(
            self.inputs,
            sorted_ids=self.sorted_ids,
            expert_ids=self.expert_ids,
            num_post=self.num_post,
            cursor=self.cursor,
            inter=self.inter,
            part=self.part,
            slices=self.slices,
            out=self.out,
            ws=self.ws,
        )
        self.phases = persistent_phases(plan)
        self.trace: Any = None  # int64 timeline of the last launch (trace=True, GPU only; see trace_layout)
        if trace:
            if plan.gemv:
                raise ValueError("the GEMV schedule (GEMV=1) stamps no timeline; trace the tiled one")
            if self.phases != [-1]:
                raise ValueError("a traced persistent launch needs a GPU (it stamps %globaltimer)")
            # Sized for the largest grid any binary of this plan takes (a grid is at most max_items).
            words = trace_layout(plan, grid or plan.max_items())["words"]
            self.trace = torch.zeros(words, dtype=torch.int64, device=dev)
            bufs["trace"] = self.trace
        specs = [_persistent_spec(plan, bufs, phase) for phase in self.phases]
        if direct is None:
            direct = direct_launch_enabled(dev)
        if self.phases == [-1]:
            kernel, args, kwargs = specs[0]
            # Compile (or find in the cache) first: the grid depends on the binary's registers.
            compiled = kernel.warmup(*args, grid=(1,), **kwargs)
            compiled._init_handles()
            self.n_regs: int | None
            self.shared: int | None
            self.n_regs, self.shared = int(compiled.n_regs), int(compiled.metadata.shared)
            threads = plan.config["num_warps"] * getattr(compiled.metadata, "warp_size", 32)
            self.function = compiled.function  # the CUfunction (bench/moe_persistent_timeline.py sets its carveout)
            self.driver_resident = pin_resident(compiled.function, threads, self.shared)
            self.grid = grid or persistent_grid(plan, self.n_regs, self.shared, dev, self.driver_resident)
            self.direct = bool(direct)
            if self.direct:
                self._runners = [compiled_runner(kernel, compiled, (self.grid,), args, kwargs)]
            else:
                self._runners = [functools.partial(kernel[(self.grid,)], *args, **kwargs)]
        else:
            self.n_regs = self.shared = self.driver_resident = None
            self.grid = grid or min(INTERPRETER_PROGRAMS, plan.max_items())
            self.direct = False
            self._runners = [functools.partial(kernel[(self.grid,)], *args, **kwargs) for kernel, args, kwargs in specs]

    def __call__(self):
        for run in self._runners:
            run()
        return self.out

    def timed_out(self) -> bool:
        """Whether a wait of any launch so far gave up (reads the workspace: a host sync)."""
        return bool(int(self.ws[WS_TIMED_OUT].item()))

    def workspace_clear(self) -> bool:
        """Whether the workspace is back to zero, as every launch must leave it (a host sync)."""
        return not bool(self.ws.count_nonzero().item())
