"""Triton fused mixture-of-experts, structured like vLLM's fused MoE.

This module is the host side of the four-step call (plans, launch arguments,
compiling, the bound launch); the kernels are in tunelab.kernels.moe_kernels
and the persistent call in tunelab.kernels.moe_persistent (host) and
tunelab.kernels.moe_persistent_kernels. Every name of those that other code
uses is importable from here as well: tunelab's problems, the tests and the
bench scripts import them from here.

Three call structures share these kernels' tile code:

- `make_plan` (the `fused_moe` method): the call described below;
- `vllm_plan` (`fused_moe_vllm`): vLLM's own structure, kernel for kernel: the
  alignment kernel at every size, GEMM 1 writing gate and up (ACT_NONE),
  `moe_act_kernel`, GEMM 2, the sum; plain launches;
- `moe_persistent_kernel` (`fused_moe_persistent`): the whole call in one
  launch, synchronised in-kernel (see PersistentMoELaunch).

Four steps per call (three for a few tokens, see below), the same work split
as vLLM's `fused_experts` so that a config tuned here means the same thing there:

1. `moe_align_kernel` (one program): sorts the flattened (token, k) slots by
   expert, pads each expert's run to a multiple of BLOCK_SIZE_M with the
   sentinel `M * topk`, and writes one expert id per block and the padded count.
2. `moe_gemm1_kernel`: per block, x rows gathered by `slot // topk` times
   `w1[expert].T` (+ b1), activation fused in the epilogue, written to the
   intermediate `[M * topk, N]`.
3. `moe_gemm2_kernel`: intermediate times `w2[expert].T` (+ b2), times the
   routing weight, written to `[M * topk, K]`.
4. `moe_sum_kernel`: the sum over topk into `out [M, K]` (faster than
   torch.sum over the middle dimension: 36 vs 55 us at M=4096 on an H200).

Decode sizes (measured on an H100, 2026-11-22; figures are µs per call with
clean-L2 cold samples, from results/bench/*/moe_variants.json):

- Dependent launches (CUDA, sm_90+): GEMM 1 (after the alignment), GEMM 2 and
  the sum are programmatic dependent launches. Each is placed on the SMs while
  the kernel before it finishes and waits for that kernel's writes in-kernel
  (griddepcontrol.wait), which hides launch latency and the drain between
  kernels: 85.3 -> 81.9 at M=1, 151.9 -> 147.8 at M=2 (E=128, N=2880).
- Up to SELF_ALIGN_MAX_NUMEL (token, k) slots, the GEMMs compute their blocks
  from topk_ids themselves (`_self_aligned_block`) and the alignment kernel
  is not launched: 81.9 -> 80.6 at M=1. With more slots every program pays
  that prologue once per wave of programs, and it costs more than it saves
  (M=4: 277.6 -> 280.4).
- Tried and not kept: GEMM 2 writing the top-k sum itself (arrival counters,
  the last program of a token sums its rows) saved 0.4 at M=1 and cost 0.5
  to 1.3 % from M=4 to M=1024; prefetching GEMM 2's first weight lines into L2 before its
  wait was within ±1.5 µs with 8 lines a row (H200) and slower with more.

A bound launch calls the compiled kernels directly (see tunelab.kernels.launch):
Triton's ordinary `kernel[grid](...)` path costs about 17 us of host time per
launch, which at decode sizes is as long as the kernels run, so timings taken
with events would measure the host. `TUNELAB_DIRECT_LAUNCH=0` turns this off.

Tile semantics match vLLM's GEMM 1: a program owns BLOCK_SIZE_N rows of w1
(of 2N). Its columns pair up as (gate, up): column j holds activation column
j // 2, gate when j is even and up when j is odd. For interleaved weights
(gpt-oss) those are w1 rows `2a` and `2a + 1`, exactly vLLM's contiguous tile;
for the split layout (gate rows [0, N), up rows [N, 2N)) they are rows `a` and
`N + a`. Either way the dot has vLLM's shape and the program writes
BLOCK_SIZE_N // 2 activated columns, so the separate silu-and-mul pass and its
`[M * topk, 2N]` round trip disappear without changing what a config means.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import triton

from tunelab.dtypes import int32, is_fp32, pointer, torch_dtype
from tunelab.kernels.launch import direct_launch_enabled, direct_runner, interpreting
from tunelab.kernels.moe_kernels import (  # noqa: F401 - ACT_*, SWIGLU_*, the kernels and helpers re-exported
    ACT_NONE,
    ACT_SILU,
    ACT_SWIGLU_OAI,
    SWIGLU_ALPHA,
    SWIGLU_LIMIT,
    _activate,
    _align,
    _align_meta,
    _block_coords,
    _block_slots,
    _gemm1_acc,
    _gemm1_rows,
    _gemm1_store,
    _gemm1_tile,
    _gemm2_acc,
    _next_pow2,
    _self_aligned_block,
    _slot_positions,
    align_sizes,
    moe_act_kernel,
    moe_align_kernel,
    moe_gemm1_kernel,
    moe_gemm2_kernel,
    moe_sum_kernel,
)
from tunelab.kernels.moe_persistent import (  # noqa: F401 - re-exported
    INTERPRETER_PROGRAMS,
    MAX_SPIN,
    PERSISTENT_CONFIG_KEYS,
    PERSISTENT_SELF_ALIGN_MAX,
    PREFETCH_BUDGET_BYTES,
    SPLIT_K_MAX_TILES,
    PersistentMoELaunch,
    PersistentPlan,
    _acquire_loads,
    _libcuda,
    _persistent_gemv_spec,
    _persistent_spec,
    compile_persistent,
    make_persistent_plan,
    persistent_default_config,
    persistent_grid,
    persistent_phases,
    pin_resident,
    resident_programs_per_sm,
    trace_layout,
    two_pow2_parts,
)
from tunelab.kernels.moe_persistent_kernels import (  # noqa: F401 - re-exported
    GEMV_WS_DONE1,
    GEMV_WS_PASSED,
    TRACE_PER_PROGRAM,
    WS_ALIGNED,
    WS_EXITED,
    WS_HEADER,
    WS_TIMED_OUT,
    moe_persistent_gemv_kernel,
    moe_persistent_kernel,
)
from tunelab.lazy import torch
from tunelab.target import prebuild_host_code

# Up to this many (token, k) slots, the GEMMs derive their blocks from topk_ids
# themselves and the alignment kernel is not launched (see _self_aligned_block).
SELF_ALIGN_MAX_NUMEL = 8
# The prologue compares every pair of slots in registers: keep it small.
SELF_ALIGN_LIMIT = 64


def pdl_supported() -> bool:
    """Programmatic dependent launch: CUDA, compute capability 9.0 or newer.

    Asks Triton's active driver, so a compile worker (tunelab.target) answers
    for the lane's GPU without touching one."""
    if interpreting():
        return False
    import triton.runtime

    target = triton.runtime.driver.active.get_current_target()
    return target.backend == "cuda" and int(target.arch) >= 90


@dataclasses.dataclass(frozen=True)
class MoEPlan:
    """Everything a launch needs that depends on the shape and config only."""

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
    grid1: tuple
    grid2: tuple
    # NUMEL_PAD when the GEMMs align their own blocks (no alignment launch), else 0.
    self_align: int
    # Launch GEMM 1 (after the alignment), GEMM 2 and the sum as programmatic
    # dependent launches: each is placed on the SMs while the previous kernel
    # finishes and waits for its writes in-kernel.
    pdl: bool
    # vLLM's structure: GEMM 1 writes gate and up ([numel, 2N], ACT_NONE) and
    # moe_act_kernel applies the activation, instead of GEMM 1's epilogue.
    split_activation: bool = False


def make_plan(
    problem, config: dict, *, self_align_max: int | None = None, pdl: bool | None = None, split_activation: bool = False
) -> MoEPlan:
    """The launch plan. The keyword knobs are for benchmarks and tests
    (bench/moe_breakdown.py times the plain four-kernel call with
    `self_align_max=0, pdl=False`); a run of the `fused_moe` method always
    uses the defaults, so a journal's timings all come from one plan:
    SELF_ALIGN_MAX_NUMEL, and dependent launches wherever the target supports
    them. `vllm_plan` is the `fused_moe_vllm` method's plan."""
    bm, bn, bk = (int(config[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
    for name, v in (("BLOCK_SIZE_M", bm), ("BLOCK_SIZE_N", bn), ("BLOCK_SIZE_K", bk)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot needs 16), got {v}")
    if int(config["GROUP_SIZE_M"]) < 1:
        raise ValueError(f"GROUP_SIZE_M must be >= 1, got {config['GROUP_SIZE_M']}")
    numel = problem.M * problem.topk
    max_blocks, max_padded = align_sizes(numel, problem.E, bm)
    if self_align_max is None:
        self_align_max = SELF_ALIGN_MAX_NUMEL
    if not 0 <= self_align_max <= SELF_ALIGN_LIMIT:
        raise ValueError(f"self_align_max must be in [0, {SELF_ALIGN_LIMIT}], got {self_align_max}")
    if pdl is None:
        pdl = pdl_supported()
    return MoEPlan(
        M=problem.M,
        E=problem.E,
        topk=problem.topk,
        K=problem.K,
        N=problem.N,
        dtype=problem.dtype,
        activation=ACT_SWIGLU_OAI if problem.activation == "swiglu_oai" else ACT_SILU,
        interleaved=problem.interleaved,
        has_bias=problem.bias,
        config={
            k: int(config[k])
            for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
        },
        numel=numel,
        max_blocks=max_blocks,
        max_padded=max_padded,
        align_meta=_align_meta(numel, problem.E, max_padded),
        grid1=(max_blocks * triton.cdiv(2 * problem.N, bn),),
        grid2=(max_blocks * triton.cdiv(problem.K, bn),),
        self_align=max(2, _next_pow2(numel)) if numel <= self_align_max else 0,
        pdl=bool(pdl),
        split_activation=bool(split_activation),
    )


def vllm_plan(problem, config: dict) -> MoEPlan:
    """The call as vLLM's `fused_experts` makes it, kernel for kernel: the
    alignment kernel whatever the size, GEMM 1 writing gate and up, the
    activation kernel, GEMM 2 with the routing weights, the top-k sum, all
    plain launches. What a config tuned for vLLM's JSON files is run in."""
    return make_plan(problem, config, self_align_max=0, pdl=False, split_activation=True)


SUM_BLOCK = 1024
# Columns per program of moe_act_kernel (one row of the intermediate per program row).
ACT_BLOCK = 512


def _launch_specs(plan: MoEPlan, b: dict):
    """[(kernel, grid, args, kwargs)] for the Triton launches, in order: the
    alignment (unless the GEMMs align themselves), GEMM 1, the activation
    (split_activation only), GEMM 2, the sum.

    `b` maps buffer names to tensors, or to pointer stand-ins for a compile without
    launching (see tunelab.dtypes.pointer). Strides are
    those of contiguous buffers, so compile and launch share one specialization.
    """
    c = plan.config
    E, K, N = plan.E, plan.K, plan.N
    tiles = {k: c[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}
    launch = {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
    precision = "ieee" if is_fp32(plan.dtype) else "tf32"  # tf32 is ignored for 16-bit inputs
    bk = c["BLOCK_SIZE_K"]
    # A dependent launch only where an earlier kernel of the call precedes it:
    # the call's first kernel follows the timer's event and the L2 flush.
    dependent = {"launch_pdl": True} if plan.pdl else {}
    specs: list[tuple[Any, tuple, tuple, dict]] = []  # (kernel, grid, args, keyword args)
    if not plan.self_align:
        specs.append(
            (
                moe_align_kernel,
                (1,),
                (
                    b["topk_ids"],
                    b["sorted_ids"],
                    b["expert_ids"],
                    b["num_post"],
                    b["cursor"],
                    plan.numel,
                    E,
                    plan.max_padded,
                    plan.max_blocks,
                ),
                dict(BLOCK_SIZE_M=c["BLOCK_SIZE_M"], USE_PDL=plan.pdl, **plan.align_meta),
            )
        )
    # With split_activation GEMM 1 writes gate and up to `gate_up` [numel, 2N]
    # and moe_act_kernel writes the activated intermediate.
    gemm1_out, gemm1_act, gemm1_stride = (
        (b["gate_up"], ACT_NONE, 2 * N) if plan.split_activation else (b["inter"], plan.activation, N)
    )
    specs.append(
        (
            moe_gemm1_kernel,
            plan.grid1,
            (
                b["x"],
                b["w1"],
                b["b1"] if plan.has_bias else b["x"],
                gemm1_out,
                b["sorted_ids"],
                b["expert_ids"],
                b["num_post"],
                b["topk_ids"],
                N,
                K,
                plan.numel,
                E,
                plan.max_blocks,
                K,
                2 * N * K,
                K,
                2 * N,
                gemm1_stride,
            ),
            dict(
                TOPK=plan.topk,
                INTERLEAVED=plan.interleaved,
                ACTIVATION=gemm1_act,
                HAS_BIAS=plan.has_bias,
                EVEN_K=K % bk == 0,
                PRECISION=precision,
                SELF_ALIGN=plan.self_align,
                USE_PDL=plan.pdl,
                **tiles,
                **launch,
                **({} if plan.self_align else dependent),
            ),
        )
    )
    if plan.split_activation:
        specs.append(
            (
                moe_act_kernel,
                (plan.numel, triton.cdiv(N, ACT_BLOCK)),
                (b["gate_up"], b["inter"], N),
                dict(INTERLEAVED=plan.interleaved, ACTIVATION=plan.activation, BLOCK=ACT_BLOCK, num_warps=4),
            )
        )
    specs.append(
        (
            moe_gemm2_kernel,
            plan.grid2,
            (
                b["inter"],
                b["w2"],
                b["b2"] if plan.has_bias else b["inter"],
                b["out2"],
                b["topk_weights"],
                b["sorted_ids"],
                b["expert_ids"],
                b["num_post"],
                b["topk_ids"],
                K,
                N,
                plan.numel,
                E,
                plan.max_blocks,
                N,
                K * N,
                N,
                K,
                K,
            ),
            dict(
                HAS_BIAS=plan.has_bias,
                EVEN_K=N % bk == 0,
                PRECISION=precision,
                SELF_ALIGN=plan.self_align,
                USE_PDL=plan.pdl,
                **tiles,
                **launch,
                **dependent,
            ),
        )
    )
    specs.append(
        (
            moe_sum_kernel,
            (plan.M, triton.cdiv(K, SUM_BLOCK)),
            (b["out2"], b["out"], K),
            dict(TOPK=plan.topk, BLOCK=SUM_BLOCK, USE_PDL=plan.pdl, num_warps=4, **dependent),
        )
    )
    return specs


def compile_plan(plan: MoEPlan):
    """Compile the plan's kernels into Triton's cache without launching them."""
    dt, i32, f32 = pointer(plan.dtype), pointer(int32()), pointer(torch_dtype("fp32"))
    b = {
        "x": dt,
        "w1": dt,
        "b1": dt,
        "w2": dt,
        "b2": dt,
        "inter": dt,
        "gate_up": dt,
        "out2": dt,
        "out": dt,
        "topk_ids": i32,
        "sorted_ids": i32,
        "expert_ids": i32,
        "num_post": i32,
        "cursor": i32,
        "topk_weights": f32,
    }
    for kernel, grid, args, kwargs in _launch_specs(plan, b):
        prebuild_host_code(kernel.warmup(*args, grid=grid, **kwargs))


class FusedMoELaunch:
    """A bound fused-MoE call: buffers preallocated, `__call__` computes into `out`.

    Alignment runs inside every call, as its own kernel or inside the GEMMs
    (vLLM's timed call includes it); only allocation and kernel lookup happen here.
    """

    def __init__(self, plan: MoEPlan, inputs: dict, direct: bool | None = None):
        self.plan = plan
        x = inputs["x"]
        dev = x.device
        i32 = torch.int32
        self.inputs = {k: v.contiguous() for k, v in inputs.items()}
        if self.inputs["topk_ids"].dtype != i32:
            self.inputs["topk_ids"] = self.inputs["topk_ids"].to(i32)
        if self.inputs["topk_weights"].dtype != torch.float32:
            self.inputs["topk_weights"] = self.inputs["topk_weights"].float()
        self.sorted_ids = torch.empty(plan.max_padded, dtype=i32, device=dev)
        self.expert_ids = torch.empty(plan.max_blocks, dtype=i32, device=dev)
        self.num_post = torch.empty(1, dtype=i32, device=dev)
        self.cursor = torch.empty(plan.align_meta["E_PAD"], dtype=i32, device=dev)
        self.inter = torch.empty(plan.numel, plan.N, dtype=plan.dtype, device=dev)
        # GEMM 1's gate and up, for vLLM's structure only (else never allocated).
        self.gate_up = (
            torch.empty(plan.numel, 2 * plan.N, dtype=plan.dtype, device=dev) if plan.split_activation else None
        )
        self.out2 = torch.empty(plan.numel, plan.K, dtype=plan.dtype, device=dev)
        self.out = torch.empty(plan.M, plan.K, dtype=plan.dtype, device=dev)
        bufs = dict(
            self.inputs,
            sorted_ids=self.sorted_ids,
            expert_ids=self.expert_ids,
            num_post=self.num_post,
            cursor=self.cursor,
            inter=self.inter,
            gate_up=self.gate_up,
            out2=self.out2,
            out=self.out,
        )
        specs = _launch_specs(plan, bufs)
        if direct is None:
            direct = direct_launch_enabled(dev)
        self.direct = False
        if direct:
            runners = [direct_runner(*spec) for spec in specs]
            if all(r is not None for r in runners):
                self._runners, self.direct = runners, True
        if not self.direct:
            self._runners = [functools.partial(kernel[grid], *args, **kwargs) for kernel, grid, args, kwargs in specs]

    def __call__(self):
        for run in self._runners:
            run()
        return self.out


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size_m: int):
    """Run the alignment kernel alone: (sorted_ids, expert_ids, num_tokens_post_padded)."""
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    numel = ids.numel()
    max_blocks, max_padded = align_sizes(numel, num_experts, block_size_m)
    meta = _align_meta(numel, num_experts, max_padded)
    dev = ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    num_post = torch.empty(1, dtype=torch.int32, device=dev)
    cursor = torch.empty(meta["E_PAD"], dtype=torch.int32, device=dev)
    moe_align_kernel[(1,)](
        ids,
        sorted_ids,
        expert_ids,
        num_post,
        cursor,
        numel,
        num_experts,
        max_padded,
        max_blocks,
        BLOCK_SIZE_M=block_size_m,
        USE_PDL=False,
        **meta,
    )
    return sorted_ids, expert_ids, num_post
