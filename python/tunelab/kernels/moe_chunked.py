"""The persistent MoE's chunked schedule (`SCHEDULE=1` of `fused_moe_persistent`).

The phased schedule (`moe_persistent_kernel`) runs GEMM 1's tiles, then
GEMM 2's, and a GEMM 2 tile waits for every GEMM 1 tile of its block: the
intermediate row it reads spans all of them. At decode sizes that wait is the
call's critical path (H100, E=128 N=360 M=1: GEMM 2 starts about 11 µs after
the first program, then takes 3.8 µs more; see PersistentMoELaunch).

The chunked schedule cuts the intermediate instead. A GEMM 1 tile of
BLOCK_SIZE_N w1 rows makes BLOCK_SIZE_N / 2 activated columns of the
intermediate: a chunk. GEMM 2 is linear in the intermediate, so a chunk times
the matching BLOCK_SIZE_N / 2 columns of w2 is that chunk's share of every
output column, and the output is the sum of the shares. So each GEMM 1 tile
is followed at once, in the program that has it, by its chunk's GEMM 2:

- Items: (block, chunk, s) for s < SPLIT_K. Item s computes K slice s of
  the tile's GEMM 1 and, once the chunk is whole, GEMM 2's output columns
  share s (ceil(n_tiles2 / SPLIT_K) column tiles of BLOCK_SIZE_N2).
- SPLIT_K = 1: no wait at all. The tile's accumulator stays in registers,
  the activation runs on it, and the same program does the chunk's GEMM 2
  over every output column.
- SPLIT_K > 1: each item writes its K slice (fp32) to `slices` and counts it
  into the tile's READY word (release). After all of its GEMM 1 items, a
  program waits, per item, only for its own tile's SPLIT_K slices (acquire),
  sums them in slice order (every reader gets the same bits) and runs the
  activation and its share of GEMM 2. The programs of one tile start and
  end GEMM 1 together, so the wait is short. Readers count themselves into
  the same word; the last clears it.
- The output: every chunk's share, times the routing weight, is added to
  the fp32 `sums` [M, K] with atomic adds; GEMM 2's bias once, by chunk 0.
  Each item then counts itself into its share's DONE word (acq_rel); the
  item that completes a share converts the share's columns of `sums` to
  `out` and zeroes them for the next launch. fp32 addition in arrival
  order: the output can differ in its last bits from one launch to the next
  (the phased schedule's fixed-order sums cannot).

Alignment always in registers (`_slot_positions`): the schedule is for decode
sizes, up to PERSISTENT_SELF_ALIGN_MAX slots. The workspace is the phased
schedule's header, READY[max_blocks * n_tiles1], DONE[SPLIT_K]; every launch
leaves it and `sums` zero. Under Triton's interpreter the launch runs phase 1
(GEMM 1, and with SPLIT_K = 1 everything) and then phase 2 (the reads and
GEMM 2 of split tiles), as the phased schedule does.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tunelab.kernels.fused_moe import (
    _activate,
    _block_slots,
    _gemm1_acc,
    _gemm1_rows,
    _slot_positions,
    _WS_HEADER,
    _WS_TIMED_OUT,
)


@triton.jit
def _wait_and_read(counter_ptr, target, timed_out_ptr, MAX_SPIN: tl.constexpr):
    """Spin until *counter_ptr >= target (every K slice of the tile is in),
    then count this reader in with one acquire add, which synchronises with
    the slices' release adds. The reader that brings the word to 2 * target
    (all `target` readers past) clears it for the next launch."""
    seen = tl.load(counter_ptr, volatile=True)
    spins = 0
    while (seen < target) & (spins < MAX_SPIN):
        seen = tl.load(counter_ptr, volatile=True)
        spins += 1
    seen = tl.atomic_add(counter_ptr, 1, sem="acquire", scope="gpu")
    if seen < target:
        tl.atomic_xchg(timed_out_ptr, 1, sem="relaxed", scope="gpu")
    if seen == 2 * target - 1:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    # Everyone in the program reads after the acquire (it was one thread's).
    tl.debug_barrier()


@triton.jit
def _fence_gpu(GPU: tl.constexpr):
    """This thread's writes so far (stores, atomic adds) become visible GPU-wide
    before its later ones (fence.acq_rel.gpu), where GPU (a launch synchronised
    in-kernel; the interpreter has no fences and no concurrency).

    Every thread fences before the barrier that precedes one thread's release
    count: the count's own fence waits for that thread's writes only, and an
    output summed by a program right after its own adds read them incomplete
    without it (H100, 2026-11-24: up to 40 % of the outputs wrong at M=2)."""
    if GPU:
        tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def _prefetch_rows_l2(base_ptr, rows, row_stride, row_bytes, mask):
    """Ask L2 for `row_bytes` bytes (a multiple of 16) at each of `rows` (row
    starts 16-byte aligned), one bulk prefetch a row (sm_90's
    cp.async.bulk.prefetch.L2). Nothing waits for it."""
    ptrs = base_ptr + rows.to(tl.int64) * row_stride
    size = tl.where(mask, row_bytes, 0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _chunk_gemm2(acc, b1_ptr, w2_ptr, b2_ptr, weights_ptr, sums_ptr, out_ptr, done_ptr, slots, tok_mask, expert,
                 w_row, pid_n, share, num_items, N: tl.constexpr, K, numel, M,
                 TOPK: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_N2: tl.constexpr,
                 SPLIT_K: tl.constexpr, GPU: tl.constexpr):
    """A whole GEMM 1 tile's accumulator -> + b1, the activation -> times the
    chunk's w2 columns over output share `share`, + b2 (chunk 0), times the
    routing weight, added to `sums`; then the share's count, and the share's
    output when this item completes it."""
    HALF: tl.constexpr = BLOCK_SIZE_N // 2
    if HAS_BIAS:
        acc += tl.load(b1_ptr + expert * 2 * N + w_row).to(tl.float32)[None, :]
    gate, up = tl.split(tl.reshape(acc, (BLOCK_SIZE_M, HALF, 2)))
    offs_c = pid_n * HALF + tl.arange(0, HALF)  # the chunk's intermediate columns
    c_ok = offs_c < N
    h = tl.where(c_ok[None, :], _activate(gate, up, ACTIVATION), 0.0).to(w2_ptr.dtype.element_ty)
    weight = tl.load(weights_ptr + slots, mask=tok_mask, other=0.0).to(tl.float32)
    tok = (slots // TOPK).to(tl.int64)
    n_tiles2 = tl.cdiv(K, BLOCK_SIZE_N2)
    per_share = tl.cdiv(n_tiles2, SPLIT_K)
    first = share * per_share
    last = tl.minimum(first + per_share, n_tiles2)
    w2_base = w2_ptr + expert * K * N
    for ct in range(first, last):
        offs_n = ct * BLOCK_SIZE_N2 + tl.arange(0, BLOCK_SIZE_N2)
        n_ok = offs_n < K
        b = tl.load(w2_base + offs_n[None, :].to(tl.int64) * N + offs_c[:, None],
                    mask=c_ok[:, None] & n_ok[None, :], other=0.0)
        part = tl.dot(h, b, input_precision=PRECISION)
        if HAS_BIAS:
            if pid_n == 0:  # GEMM 2's bias once a slot, with the first chunk
                part += tl.load(b2_ptr + expert * K + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        part = part * weight[:, None]
        tl.atomic_add(sums_ptr + tok[:, None] * K + offs_n[None, :], part,
                      mask=tok_mask[:, None] & n_ok[None, :], sem="relaxed", scope="gpu")
    # Every thread's adds are visible before the release below.
    _fence_gpu(GPU)
    tl.debug_barrier()
    done = tl.atomic_add(done_ptr + share, 1, sem="acq_rel", scope="gpu")
    if done == num_items - 1:
        # Every chunk of every block added its share: write it out, zero it.
        tl.debug_barrier()
        for r0 in range(0, M, BLOCK_SIZE_M):
            r = r0 + tl.arange(0, BLOCK_SIZE_M)
            r_ok = r < M
            for ct in range(first, last):
                offs_n = ct * BLOCK_SIZE_N2 + tl.arange(0, BLOCK_SIZE_N2)
                mask = r_ok[:, None] & (offs_n < K)[None, :]
                at = r[:, None].to(tl.int64) * K + offs_n[None, :]
                total = tl.load(sums_ptr + at, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + at, total.to(out_ptr.dtype.element_ty), mask=mask)
                # Triton orders nothing between threads through global memory, and the
                # zeros below are laid out over the threads unlike the loads above: without
                # the barrier a thread zeroed sums another had not read yet (H100,
                # 2026-11-24: token 1's row read as zeros at M=2).
                tl.debug_barrier()
                tl.store(sums_ptr + at, tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N2), dtype=tl.float32), mask=mask)
        tl.atomic_xchg(done_ptr + share, 0, sem="relaxed", scope="gpu")


@triton.jit
def moe_chunked_kernel(
    x_ptr,  # [M, K]
    w1_ptr,  # [E, 2N, K]
    b1_ptr,  # [E, 2N] (unused unless HAS_BIAS)
    w2_ptr,  # [E, K, N]
    b2_ptr,  # [E, K] (unused unless HAS_BIAS)
    topk_ids_ptr,  # int32 [M * topk]
    weights_ptr,  # fp32 [M * topk] routing weights
    slices_ptr,  # fp32 [max_blocks * n_tiles1 * SPLIT_K, BLOCK_SIZE_M, BLOCK_SIZE_N] (SPLIT_K > 1)
    sums_ptr,  # fp32 [M, K], zero between launches
    out_ptr,  # [M, K]
    ws_ptr,  # int32 workspace, zero between launches (see the module docstring)
    N: tl.constexpr,  # a constexpr for the same reason as moe_persistent_kernel's
    K,
    numel,
    num_experts,
    max_blocks,
    TOPK: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K1: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,  # GEMM 1 tile: w1 rows (gate/up pairs), a chunk of BLOCK_SIZE_N / 2
    BLOCK_SIZE_K: tl.constexpr,  # GEMM 1 reduction step (over K)
    BLOCK_SIZE_N2: tl.constexpr,  # GEMM 2 output column tile
    SPLIT_K: tl.constexpr,  # GEMM 1 K slices per tile = GEMM 2 output shares per chunk
    NUMEL_PAD: tl.constexpr,  # alignment in registers over this many slots (a power of two >= numel)
    PHASE: tl.constexpr,  # -1: the whole call (GPU); 1, 2: one phase (interpreter)
    PREFETCH_W2: tl.constexpr,  # 1: bulk-prefetch each item's w2 rows into L2 before GEMM 1 (sm_90)
    MAX_SPIN: tl.constexpr,
):
    """The whole MoE call in one launch, GEMM 2 chunk by chunk (the module docstring)."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    HALF: tl.constexpr = BLOCK_SIZE_N // 2
    n_tiles1 = tl.cdiv(N, HALF)
    ready_ptr = ws_ptr + _WS_HEADER
    done_ptr = ready_ptr + max_blocks * n_tiles1
    timed_out_ptr = ws_ptr + _WS_TIMED_OUT
    M = numel // TOPK
    ids, pos, valid, num_blocks = _slot_positions(topk_ids_ptr, numel, num_experts, BLOCK_SIZE_M, NUMEL_PAD)
    n_chunks = num_blocks * n_tiles1  # GEMM 2 items per output share
    total = n_chunks * SPLIT_K
    n_k = tl.cdiv(K, BLOCK_SIZE_K)
    k_per_slice = tl.cdiv(n_k, SPLIT_K)
    tile_elems: tl.constexpr = BLOCK_SIZE_M * BLOCK_SIZE_N
    # int64: the slices' offsets below add the item index to it.
    offs_tile = (tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]).to(tl.int64)

    if PREFETCH_W2 and PHASE < 0:
        # Each item's w2 rows (its share of the output columns, its chunk's
        # columns) into L2 now, while GEMM 1 streams w1.
        es: tl.constexpr = w2_ptr.dtype.element_ty.primitive_bitwidth // 8
        n_tiles2 = tl.cdiv(K, BLOCK_SIZE_N2)
        per_share = tl.cdiv(n_tiles2, SPLIT_K)
        for t in range(pid, total, grid):
            tile = t // SPLIT_K
            pid_n = tile % n_tiles1
            _, expert = _block_slots(ids, pos, valid, numel, tile // n_tiles1, BLOCK_SIZE_M, NUMEL_PAD)
            row_bytes = (tl.minimum(HALF, N - pid_n * HALF) * es) // 16 * 16
            base = w2_ptr + expert.to(tl.int64) * K * N + pid_n * HALF
            for ct in range((t % SPLIT_K) * per_share, tl.minimum((t % SPLIT_K + 1) * per_share, n_tiles2)):
                rows = ct * BLOCK_SIZE_N2 + tl.arange(0, BLOCK_SIZE_N2)
                _prefetch_rows_l2(base, rows, N, row_bytes, rows < K)

    # ---- GEMM 1: item t is K slice t % SPLIT_K of tile t // SPLIT_K (block
    # tile // n_tiles1, chunk tile % n_tiles1).
    if PHASE == -1 or PHASE == 1:
        for t in range(pid, total, grid):
            tile = t // SPLIT_K
            pid_n = tile % n_tiles1
            slots, expert = _block_slots(ids, pos, valid, numel, tile // n_tiles1, BLOCK_SIZE_M, NUMEL_PAD)
            expert = expert.to(tl.int64)
            tok_mask = slots < numel
            offs_j, w_row, row_ok = _gemm1_rows(pid_n, N, INTERLEAVED, ACTIVATION, BLOCK_SIZE_N)
            k_first = (t % SPLIT_K) * k_per_slice
            k_last = tl.minimum(k_first + k_per_slice, n_k)
            acc = _gemm1_acc(x_ptr, w1_ptr, (slots // TOPK).to(tl.int64), tok_mask, expert, w_row, row_ok,
                             k_first, k_last, K, K, 2 * N * K, K,
                             EVEN_K1, PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
            if SPLIT_K == 1:
                _chunk_gemm2(acc, b1_ptr, w2_ptr, b2_ptr, weights_ptr, sums_ptr, out_ptr, done_ptr, slots, tok_mask,
                             expert, w_row, pid_n, 0, n_chunks, N, K, numel, M, TOPK, ACTIVATION, HAS_BIAS,
                             PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_N2, SPLIT_K, PHASE < 0)
            else:
                # Only the block's real rows: at M=1 one row of BLOCK_SIZE_M.
                tl.store(slices_ptr + offs_tile + t * tile_elems, acc, mask=tok_mask[:, None])
                _fence_gpu(PHASE < 0)
                tl.debug_barrier()  # every thread's stores are visible before the release
                tl.atomic_add(ready_ptr + tile, 1, sem="release", scope="gpu")

    # ---- GEMM 2 of split tiles: every program's GEMM 1 items came first, and
    # every program is resident, so the slices waited for are running or done.
    if SPLIT_K > 1 and (PHASE == -1 or PHASE == 2):
        for t in range(pid, total, grid):
            tile = t // SPLIT_K
            pid_n = tile % n_tiles1
            slots, expert = _block_slots(ids, pos, valid, numel, tile // n_tiles1, BLOCK_SIZE_M, NUMEL_PAD)
            expert = expert.to(tl.int64)
            tok_mask = slots < numel
            _, w_row, _ = _gemm1_rows(pid_n, N, INTERLEAVED, ACTIVATION, BLOCK_SIZE_N)
            _wait_and_read(ready_ptr + tile, SPLIT_K, timed_out_ptr, MAX_SPIN)
            acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for k_slice in tl.static_range(SPLIT_K):
                acc += tl.load(slices_ptr + offs_tile + (tile * SPLIT_K + k_slice) * tile_elems, mask=tok_mask[:, None], other=0.0,
                               cache_modifier=".cg")
            _chunk_gemm2(acc, b1_ptr, w2_ptr, b2_ptr, weights_ptr, sums_ptr, out_ptr, done_ptr, slots, tok_mask,
                         expert, w_row, pid_n, t % SPLIT_K, n_chunks, N, K, numel, M, TOPK, ACTIVATION, HAS_BIAS,
                         PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_N2, SPLIT_K, PHASE < 0)
