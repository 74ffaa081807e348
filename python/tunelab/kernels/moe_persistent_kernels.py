"""The persistent MoE's Triton kernels: the whole call in one launch.

`moe_persistent_kernel` (tiles of BLOCK_SIZE_M slots, synchronised in-kernel
through a workspace of counters) and `moe_persistent_gemv_kernel` (config
GEMV=1: a few tokens as matrix-vector products, no tl.dot), with the waits,
the timeline stamps (TRACE) and the L2 prefetch they use. The tile code is
the four-step call's (tunelab.kernels.moe_kernels).

The design, and what was measured and tried, is in
tunelab.kernels.moe_persistent.PersistentMoELaunch, whose host side plans,
sizes the grid for and launches these kernels; docs/performance.md has the
dated measurements.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tunelab.kernels.moe_kernels import (
    _activate,
    _align,
    _block_slots,
    _gemm1_acc,
    _gemm1_rows,
    _gemm1_store,
    _gemm2_acc,
    _slot_positions,
)

# ---------------------------------------------------------------------------
# The persistent MoE: the whole call in one launch.

# Workspace words (int32). The launch leaves every word as it found it (zero),
# so it is zeroed once when a launch is bound and never again.
WS_ALIGNED = 0  # program 0 published the alignment (program 0 -> everyone)
WS_EXITED = 1  # programs past their last wait; the last one clears WS_ALIGNED and itself
WS_TIMED_OUT = 2  # sticky: some wait gave up after MAX_SPIN polls (the output is then wrong)
WS_HEADER = 32  # 128 bytes: the counters below start on a line of their own
# then READY[max_blocks]: GEMM 1 tiles done per block; DONE[max_blocks]: GEMM 2
# tiles done per block; ARRIVED[M * n_tiles2]: GEMM 2 rows in per (token, column
# tile); with SPLIT_K > 1, SPLITS[max_blocks * n_tiles1]: K slices in per GEMM 1 tile.
# The same, as the kernel reads them (a @triton.jit function sees only constexpr globals).
_WS_ALIGNED = tl.constexpr(WS_ALIGNED)
_WS_EXITED = tl.constexpr(WS_EXITED)
_WS_TIMED_OUT = tl.constexpr(WS_TIMED_OUT)
_WS_HEADER = tl.constexpr(WS_HEADER)


@triton.jit
def _wait_at_least(counter_ptr, target, timed_out_ptr, MAX_SPIN: tl.constexpr):
    """Spin until *counter_ptr >= target, then acquire what its writers released.

    Polls with volatile loads (served by L2, no atomic traffic on the hot
    word), then one acquire read-modify-write, whose value is the counter's
    latest: every increment is a release RMW, so this acquire synchronises
    with all of them. After MAX_SPIN polls it stops waiting, sets the sticky
    timed-out word and carries on: a wrong answer the check reports, where a
    grid larger than the GPU holds (which cannot happen when the grid is
    sized from the occupancy, see persistent_grid) would otherwise hang.
    """
    seen = tl.load(counter_ptr, volatile=True)
    spins = 0
    while (seen < target) & (spins < MAX_SPIN):
        seen = tl.load(counter_ptr, volatile=True)
        spins += 1
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    if seen < target:
        tl.atomic_xchg(timed_out_ptr, 1, sem="relaxed", scope="gpu")
    # Everyone in the program reads after the acquire (it was one thread's).
    tl.debug_barrier()


# Words a program's timeline takes (TRACE): start, GEMM 1 begins, GEMM 1 ends, end, SM id.
TRACE_PER_PROGRAM = 5
_TRACE_PER_PROGRAM = tl.constexpr(TRACE_PER_PROGRAM)


@triton.jit
def _stamp(ptr, TRACE: tl.constexpr):
    """Store the GPU's global nanosecond clock (%globaltimer) at ptr when TRACE; nothing otherwise."""
    if TRACE:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(ptr, now)


@triton.jit
def _prefetch_l2(base_ptr, numel, LINE: tl.constexpr, LINES: tl.constexpr):
    """Ask L2 to fetch `numel` contiguous elements from `base_ptr`, one
    `prefetch.global.L2::evict_last` per LINE elements (a 128-byte line).
    Nothing waits for it: the loads that need the data later find it in L2."""
    for start in range(0, numel, LINE * LINES):
        offs = tl.minimum(start + tl.arange(0, LINES) * LINE, numel - 1)
        tl.inline_asm_elementwise(
            "prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;",
            "=r,l",
            [base_ptr + offs],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit
def moe_persistent_kernel(
    x_ptr,  # [M, K]
    w1_ptr,  # [E, 2N, K]
    b1_ptr,  # [E, 2N] (unused unless HAS_BIAS)
    w2_ptr,  # [E, K, N]
    b2_ptr,  # [E, K] (unused unless HAS_BIAS)
    topk_ids_ptr,  # int32 [M * topk]
    weights_ptr,  # fp32 [M * topk] routing weights
    inter_ptr,  # [M * topk, N]: GEMM 1's activated output
    part_ptr,  # fp32 [M * topk, K]: GEMM 2's weighted rows
    slices_ptr,  # fp32 [max_blocks * n_tiles1 * SPLIT_K, BLOCK_SIZE_M, BLOCK_SIZE_N]: GEMM 1's K slices (SPLIT_K > 1)
    out_ptr,  # [M, K]
    sorted_ids_ptr,  # alignment in memory (unless SELF_ALIGN)
    expert_ids_ptr,
    num_post_ptr,
    cursor_ptr,
    ws_ptr,  # int32 workspace, zero between launches (WS_* above)
    trace_ptr,  # int64 timeline (TRACE; see trace_layout), else any pointer
    # A constexpr: Triton knows an integer argument's divisibility by 16 only, and
    # N=360 (gpt-oss's smallest shard) is not, so every w2 and intermediate row
    # would look unaligned and GEMM 2 would load them two bytes at a time,
    # unpipelined (H100, 2026-11-22: the whole call 27 us at M=1).
    N: tl.constexpr,
    K,
    numel,
    num_experts,
    max_blocks,
    max_padded,
    ws_words,
    TOPK: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K1: tl.constexpr,
    EVEN_K2: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,  # GEMM 1 tile: w1 rows (gate/up pairs)
    BLOCK_SIZE_K: tl.constexpr,  # GEMM 1 reduction step (over K)
    BLOCK_SIZE_N2: tl.constexpr,  # GEMM 2 tile: output columns (of K)
    BLOCK_SIZE_K2: tl.constexpr,  # GEMM 2 reduction step (over N)
    SPLIT_K: tl.constexpr,  # GEMM 1 tiles split in this many K slices (1: not split)
    SELF_ALIGN: tl.constexpr,  # NUMEL_PAD: every program aligns in registers; 0: program 0 aligns into memory
    E_PAD: tl.constexpr,  # alignment constexprs (see _align_meta), used when SELF_ALIGN is 0
    CHUNK: tl.constexpr,
    BCHUNK: tl.constexpr,
    PHASE: tl.constexpr,  # -1: the whole call, synchronised in-kernel (GPU); 0, 1, 2: one phase (interpreter)
    PREFETCH_W2: tl.constexpr,  # 0, or the elements per 128-byte line: prefetch GEMM 2's w2 tiles into L2
    MAX_SPIN: tl.constexpr,
    TRACE: tl.constexpr,  # 1: stamp %globaltimer at each step into trace_ptr (bench/moe_persistent_timeline.py)
):
    """Alignment, GEMM 1 with the activation, GEMM 2 with the routing weights
    and the top-k sum in one launch (see PersistentMoELaunch for the design).

    PHASE -1 runs everything, with in-kernel waits between dependent work, and
    needs every program resident at once: only on a GPU, with a grid from
    persistent_grid. Triton's interpreter runs programs one after another, so a
    wait there would never end: it launches the kernel once per phase instead
    (0: alignment, unless SELF_ALIGN; 1: GEMM 1; 2: GEMM 2 and the sum), which
    runs the same arithmetic and the same counters, only without waiting.
    """
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    SYNC: tl.constexpr = PHASE < 0
    n_tiles1 = tl.cdiv(2 * N, BLOCK_SIZE_N)
    n_tiles2 = tl.cdiv(K, BLOCK_SIZE_N2)
    ready_ptr = ws_ptr + _WS_HEADER
    done_ptr = ready_ptr + max_blocks
    arrived_ptr = done_ptr + max_blocks
    splits_ptr = arrived_ptr + (numel // TOPK) * n_tiles2
    timed_out_ptr = ws_ptr + _WS_TIMED_OUT
    # Timeline (TRACE): per program [start, GEMM 1 begins, GEMM 1 ends, end, SM],
    # then per GEMM 1 item [begin, K loop done, end], then per GEMM 2 item
    # [begin, wait over, K loop done, end].
    trace_items1 = trace_ptr + grid * _TRACE_PER_PROGRAM
    trace_items2 = trace_items1 + 3 * max_blocks * n_tiles1 * SPLIT_K
    _stamp(trace_ptr + pid * _TRACE_PER_PROGRAM, TRACE)
    if TRACE:
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
        tl.store(trace_ptr + pid * _TRACE_PER_PROGRAM + 4, sm.to(tl.int64))

    # ---- alignment: which slots each BLOCK_SIZE_M block holds, and its expert.
    if SELF_ALIGN:
        # A few slots: every program computes the whole layout in registers
        # (the same, stable layout everywhere), no wait.
        ids, pos, valid, num_blocks = _slot_positions(topk_ids_ptr, numel, num_experts, BLOCK_SIZE_M, SELF_ALIGN)
    else:
        if PHASE <= 0:
            if pid == 0:
                _align(
                    topk_ids_ptr,
                    sorted_ids_ptr,
                    expert_ids_ptr,
                    num_post_ptr,
                    cursor_ptr,
                    numel,
                    num_experts,
                    max_padded,
                    max_blocks,
                    BLOCK_SIZE_M,
                    E_PAD,
                    CHUNK,
                    BCHUNK,
                )
                if SYNC:
                    tl.debug_barrier()  # every thread's alignment stores are issued
                    tl.atomic_xchg(ws_ptr + _WS_ALIGNED, 1, sem="release", scope="gpu")
        if SYNC:
            _wait_at_least(ws_ptr + _WS_ALIGNED, 1, timed_out_ptr, MAX_SPIN)
        # .cg: from L2, never from a line this SM's L1 held before program 0 wrote it.
        num_blocks = tl.load(num_post_ptr, cache_modifier=".cg") // BLOCK_SIZE_M
    total1 = num_blocks * n_tiles1 * SPLIT_K
    total2 = num_blocks * n_tiles2
    if SYNC:
        # Bring the workspace's lines into L2 now, one line a program: after a cold
        # L2 the counters' first atomics would each wait for DRAM, on the critical path.
        ws_line = pid * 32
        if ws_line < ws_words:
            _prefetch_l2(ws_ptr + ws_line, 1, 32, 1)
    # GEMM 2 items continue GEMM 1's round robin: item i (GEMM 1 items first,
    # then GEMM 2's) goes to program i % grid, so the programs with no GEMM 1
    # item left take the first GEMM 2 items.
    first2 = (pid + grid - total1 % grid) % grid if SYNC else pid

    if SYNC and PREFETCH_W2:
        # GEMM 2's weights into L2 now, while GEMM 1 streams w1: they do not
        # depend on GEMM 1, and HBM stays busy across the wait. Where at least a
        # quarter of the programs have no GEMM 1 item (decode sizes), those share
        # them all out, so the others start GEMM 1 at once; otherwise each
        # program asks for its own GEMM 2 tiles (a few idle programs would each
        # issue a large share of w2's lines, one 128-byte line an instruction).
        prefetch_first = first2
        prefetch_step = grid
        if (total1 < grid) & ((grid - total1) * 4 >= grid):
            prefetch_step = grid - total1
            prefetch_first = pid - total1
            if pid < total1:
                prefetch_first = total2
        for j in range(prefetch_first, total2, prefetch_step):
            m = j // n_tiles2
            if SELF_ALIGN:
                _, expert = _block_slots(ids, pos, valid, numel, m, BLOCK_SIZE_M, SELF_ALIGN)
            else:
                expert = tl.load(expert_ids_ptr + m, cache_modifier=".cg")
            row0 = (j % n_tiles2) * BLOCK_SIZE_N2
            rows = tl.minimum(BLOCK_SIZE_N2, K - row0)
            # The tile's w2 rows are contiguous: rows * N elements.
            _prefetch_l2(w2_ptr + expert.to(tl.int64) * K * N + row0.to(tl.int64) * N, rows * N, PREFETCH_W2, 256)

    # ---- GEMM 1 (+ bias, activation): item t is K slice t % SPLIT_K of tile
    # t // SPLIT_K, which is block tile // n_tiles1, w1 rows tile tile % n_tiles1.
    _stamp(trace_ptr + pid * _TRACE_PER_PROGRAM + 1, TRACE)
    if PHASE == -1 or PHASE == 1:
        n_k = tl.cdiv(K, BLOCK_SIZE_K)
        k_per_slice = tl.cdiv(n_k, SPLIT_K)
        for t in range(pid, total1, grid):
            _stamp(trace_items1 + 3 * t, TRACE)
            tile = t // SPLIT_K
            m = tile // n_tiles1
            pid_n = tile % n_tiles1
            if SELF_ALIGN:
                slots, expert = _block_slots(ids, pos, valid, numel, m, BLOCK_SIZE_M, SELF_ALIGN)
            else:
                slots = tl.load(sorted_ids_ptr + m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M), cache_modifier=".cg")
                expert = tl.load(expert_ids_ptr + m, cache_modifier=".cg")
            expert = expert.to(tl.int64)
            tok_mask = slots < numel
            rows = (slots // TOPK).to(tl.int64)
            offs_j, w_row, row_ok = _gemm1_rows(pid_n, N, INTERLEAVED, ACTIVATION, BLOCK_SIZE_N)
            if SPLIT_K == 1:
                acc = _gemm1_acc(
                    x_ptr,
                    w1_ptr,
                    rows,
                    tok_mask,
                    expert,
                    w_row,
                    row_ok,
                    0,
                    n_k,
                    K,
                    K,
                    2 * N * K,
                    K,
                    EVEN_K1,
                    PRECISION,
                    BLOCK_SIZE_M,
                    BLOCK_SIZE_N,
                    BLOCK_SIZE_K,
                )
                _stamp(trace_items1 + 3 * t + 1, TRACE)
                _gemm1_store(
                    acc,
                    b1_ptr,
                    inter_ptr,
                    slots,
                    tok_mask,
                    expert,
                    w_row,
                    offs_j,
                    pid_n,
                    N,
                    2 * N,
                    N,
                    ACTIVATION,
                    HAS_BIAS,
                    BLOCK_SIZE_M,
                    BLOCK_SIZE_N,
                )
                finished = True
            else:
                # One K slice into its own fp32 tile; the program that brings the
                # tile's count to SPLIT_K sums the slices in slice order, then runs
                # the epilogue (bias, activation, store) and clears the count.
                k_first = (t % SPLIT_K) * k_per_slice
                k_last = tl.minimum(k_first + k_per_slice, n_k)
                acc = _gemm1_acc(
                    x_ptr,
                    w1_ptr,
                    rows,
                    tok_mask,
                    expert,
                    w_row,
                    row_ok,
                    k_first,
                    k_last,
                    K,
                    K,
                    2 * N * K,
                    K,
                    EVEN_K1,
                    PRECISION,
                    BLOCK_SIZE_M,
                    BLOCK_SIZE_N,
                    BLOCK_SIZE_K,
                )
                _stamp(trace_items1 + 3 * t + 1, TRACE)
                tile_elems = BLOCK_SIZE_M * BLOCK_SIZE_N
                offs_tile = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
                tile_base = slices_ptr + tile.to(tl.int64) * SPLIT_K * tile_elems
                tl.store(tile_base + (t % SPLIT_K) * tile_elems + offs_tile, acc)
                tl.debug_barrier()
                arrived = tl.atomic_add(splits_ptr + tile, 1, sem="acq_rel", scope="gpu")
                finished = arrived == SPLIT_K - 1
                if finished:
                    tl.debug_barrier()
                    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                    for k_slice in tl.static_range(SPLIT_K):
                        acc += tl.load(tile_base + k_slice * tile_elems + offs_tile, cache_modifier=".cg")
                    _gemm1_store(
                        acc,
                        b1_ptr,
                        inter_ptr,
                        slots,
                        tok_mask,
                        expert,
                        w_row,
                        offs_j,
                        pid_n,
                        N,
                        2 * N,
                        N,
                        ACTIVATION,
                        HAS_BIAS,
                        BLOCK_SIZE_M,
                        BLOCK_SIZE_N,
                    )
                    tl.atomic_xchg(splits_ptr + tile, 0, sem="relaxed", scope="gpu")
            if finished:
                # Publish the tile: GEMM 2's tiles of block m wait for all n_tiles1 of them.
                tl.debug_barrier()
                tl.atomic_add(ready_ptr + m, 1, sem="release", scope="gpu")
            _stamp(trace_items1 + 3 * t + 2, TRACE)
    _stamp(trace_ptr + pid * _TRACE_PER_PROGRAM + 2, TRACE)

    # ---- GEMM 2 (+ bias, x routing weight) and the top-k sum.
    if PHASE == -1 or PHASE == 2:
        for j in range(first2, total2, grid):
            _stamp(trace_items2 + 4 * j, TRACE)
            m = j // n_tiles2
            pid_n = j % n_tiles2
            # The block's slots and expert depend on the alignment only, not on GEMM 1.
            if SELF_ALIGN:
                slots, expert = _block_slots(ids, pos, valid, numel, m, BLOCK_SIZE_M, SELF_ALIGN)
            else:
                slots = tl.load(sorted_ids_ptr + m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M), cache_modifier=".cg")
                expert = tl.load(expert_ids_ptr + m, cache_modifier=".cg")
            expert = expert.to(tl.int64)
            tok_mask = slots < numel
            slots64 = slots.to(tl.int64)
            offs_n_raw = pid_n * BLOCK_SIZE_N2 + tl.arange(0, BLOCK_SIZE_N2)
            offs_n = offs_n_raw % K
            col_mask = offs_n_raw < K
            if SYNC:
                # Every program took its GEMM 1 items before any GEMM 2 item, and every
                # program is resident, so the tiles waited for are running or done.
                _wait_at_least(ready_ptr + m, n_tiles1, timed_out_ptr, MAX_SPIN)
            _stamp(trace_items2 + 4 * j + 1, TRACE)
            # Block bookkeeping: the last GEMM 2 tile of block m past its wait clears
            # the block's counters for the next launch. Relaxed: counting needs no
            # ordering, and an acq_rel count (what it was, before the top-k count)
            # costs a fence on top of the round trip.
            done = tl.atomic_add(done_ptr + m, 1, sem="relaxed", scope="gpu")
            # The intermediate was written by other programs of this launch: from L2 (.cg).
            acc = _gemm2_acc(
                inter_ptr,
                w2_ptr,
                b2_ptr,
                slots64,
                tok_mask,
                expert,
                offs_n,
                tl.arange(0, BLOCK_SIZE_K2),
                N,
                N,
                K * N,
                N,
                K,
                HAS_BIAS,
                EVEN_K2,
                PRECISION,
                BLOCK_SIZE_M,
                BLOCK_SIZE_N2,
                BLOCK_SIZE_K2,
                ".cg",
            )
            _stamp(trace_items2 + 4 * j + 2, TRACE)
            w = tl.load(weights_ptr + slots64, mask=tok_mask, other=0.0).to(tl.float32)
            acc = acc * w[:, None]
            tl.store(
                part_ptr + slots64[:, None] * K + offs_n_raw[None, :], acc, mask=tok_mask[:, None] & col_mask[None, :]
            )
            tl.debug_barrier()  # every thread's rows are issued before the releases below

            # The top-k sum: the block's rows are distinct tokens (a token meets an
            # expert once). The program that brings a token's count for this column
            # tile to TOPK sums the token's TOPK rows, in slot order (the result does
            # not depend on who came last), and clears the count.
            tok = slots64 // TOPK
            arrived = tl.atomic_add(arrived_ptr + tok * n_tiles2 + pid_n, 1, mask=tok_mask, sem="acq_rel", scope="gpu")
            last = tok_mask & (arrived == TOPK - 1)
            tl.debug_barrier()  # the acquires above come before any thread's reads below
            _topk_sum(part_ptr, out_ptr, tok, last, offs_n_raw, col_mask, K, TOPK, BLOCK_SIZE_M, BLOCK_SIZE_N2)
            tl.store(arrived_ptr + tok * n_tiles2 + pid_n, 0, mask=last)
            if done == n_tiles2 - 1:
                tl.atomic_xchg(ready_ptr + m, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(done_ptr + m, 0, sem="relaxed", scope="gpu")
            _stamp(trace_items2 + 4 * j + 3, TRACE)

    if SYNC:
        if not SELF_ALIGN:
            # The last program past every wait clears the alignment flag (and this count).
            tl.debug_barrier()
            exited = tl.atomic_add(ws_ptr + _WS_EXITED, 1, sem="acq_rel", scope="gpu")
            if exited == grid - 1:
                tl.atomic_xchg(ws_ptr + _WS_ALIGNED, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(ws_ptr + _WS_EXITED, 0, sem="relaxed", scope="gpu")
    _stamp(trace_ptr + pid * _TRACE_PER_PROGRAM + 3, TRACE)


@triton.jit
def _topk_sum(
    part_ptr,
    out_ptr,
    tok,
    rows_mask,
    offs_n,
    col_mask,
    K,
    TOPK: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
):
    """out[tok, offs_n] = sum over j < TOPK of part[tok * TOPK + j, offs_n], in
    fp32 and in slot order, for the rows in rows_mask. part rows come from
    other programs of the launch: read from L2 (.cg)."""
    mask = rows_mask[:, None] & col_mask[None, :]
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(
            part_ptr + (tok * TOPK + j)[:, None] * K + offs_n[None, :], mask=mask, other=0.0, cache_modifier=".cg"
        )
    tl.store(out_ptr + tok[:, None] * K + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------
# The persistent MoE's GEMV schedule (config GEMV=1): a few tokens, no tl.dot.

# Its workspace words (int32; WS_TIMED_OUT as above). Zero between launches.
GEMV_WS_DONE1 = 0  # GEMM 1 items done this launch; GEMM 2 waits for all of them
GEMV_WS_PASSED = 1  # programs past that wait; the last one clears both words
_GEMV_WS_DONE1 = tl.constexpr(GEMV_WS_DONE1)
_GEMV_WS_PASSED = tl.constexpr(GEMV_WS_PASSED)


@triton.jit
def _load_acquire(ptr):
    """One int32 read with acquire semantics at GPU scope (PTX ld.acquire.gpu)."""
    return tl.inline_asm_elementwise(
        "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _wait_acquire(counter_ptr, target, timed_out_ptr, ACQUIRE_LOADS: tl.constexpr, MAX_SPIN: tl.constexpr):
    """Spin until *counter_ptr >= target; what its writers released is then visible.

    With ACQUIRE_LOADS (CUDA) every thread polls with acquire loads, so the
    wait ends without _wait_at_least's read-modify-write: one L2 round trip
    less on the way to GEMM 2 (H100, E=128 N=360 M=1: 11.36 -> 10.89 µs under
    graph timing, with the clearing below moved off the exit). Otherwise
    _wait_at_least's volatile polls and acquire RMW. A wait that gives up
    after MAX_SPIN polls sets the sticky timed-out word."""
    if ACQUIRE_LOADS:
        seen = _load_acquire(counter_ptr)
        spins = 0
        while (seen < target) & (spins < MAX_SPIN):
            seen = _load_acquire(counter_ptr)
            spins += 1
        if seen < target:
            tl.atomic_xchg(timed_out_ptr, 1, sem="relaxed", scope="gpu")
    else:
        _wait_at_least(counter_ptr, target, timed_out_ptr, MAX_SPIN)


@triton.jit
def _dot_two_parts(base_ptr, row_offs, vec_ptr, LEN: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """For each row: sum over j < LEN of base[row_offs + j] * vec[j], in fp32.

    The LEN columns are read as two power-of-two tiles, A (<= LEN, unmasked)
    and B (covering the rest): 2048 + 1024 for K=2880, where one padded tile
    of 4096 would hold 30 % masked lanes in registers. Every load is issued
    before any product, so a row's whole reduction is in flight at once."""
    offs_a = tl.arange(0, A)
    offs_b = A + tl.arange(0, B)
    in_b = offs_b < LEN
    wa = tl.load(base_ptr + row_offs[:, None] + offs_a[None, :])
    wb = tl.load(base_ptr + row_offs[:, None] + offs_b[None, :], mask=in_b[None, :], other=0.0)
    va = tl.load(vec_ptr + offs_a).to(tl.float32)
    vb = tl.load(vec_ptr + offs_b, mask=in_b, other=0.0).to(tl.float32)
    return tl.sum(wa.to(tl.float32) * va[None, :], axis=1) + tl.sum(wb.to(tl.float32) * vb[None, :], axis=1)


@triton.jit
def moe_persistent_gemv_kernel(
    x_ptr,  # [M, K]
    w1_ptr,  # [E, 2N, K]
    b1_ptr,  # [E, 2N] (unused unless HAS_BIAS)
    w2_ptr,  # [E, K, N]
    b2_ptr,  # [E, K] (unused unless HAS_BIAS)
    topk_ids_ptr,  # int32 [M * topk]
    weights_ptr,  # fp32 [M * topk] routing weights
    inter_ptr,  # [M * topk, N]: GEMM 1's activated output
    out_ptr,  # [M, K]
    ws_ptr,  # int32 workspace, zero between launches (GEMV_WS_* and WS_TIMED_OUT)
    M,
    N: tl.constexpr,
    K: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROWS1: tl.constexpr,  # activated columns per GEMM 1 item (BLOCK_SIZE_N // 2: gate/up row pairs)
    K_A: tl.constexpr,  # K read as two power-of-two parts (see _dot_two_parts)
    K_B: tl.constexpr,
    COLS2: tl.constexpr,  # output columns per GEMM 2 item (BLOCK_SIZE_N2)
    N_A: tl.constexpr,  # N read as two power-of-two parts
    N_B: tl.constexpr,
    ACQUIRE_LOADS: tl.constexpr,
    PHASE: tl.constexpr,  # -1: the whole call, synchronised in-kernel (GPU); 1, 2: one phase (interpreter)
    MAX_SPIN: tl.constexpr,
):
    """The whole MoE call for a few tokens as matrix-vector products, in one launch.

    A GEMM 1 item is one (token, expert) slot's ROWS1 activated columns: its
    2 * ROWS1 w1 rows (gate and up) against the token's x, whole K in one
    tile. A GEMM 2 item is one token's COLS2 output columns: the w2 rows of
    all the token's TOPK experts against their activated rows, weighted and
    summed in registers in a fixed order (the same bits every launch), and stored: no
    intermediate fp32 rows, no top-k count, no separate sum. GEMM 2's w2
    tile does not depend on GEMM 1, so it is loaded before the wait for
    GEMM 1. One counter joins the two: each program adds its GEMM 1 items
    once, after all of them (one release a program), and GEMM 2 waits for the
    total. See PersistentMoELaunch for the measurements.
    """
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    SYNC: tl.constexpr = PHASE < 0
    n_tiles1 = tl.cdiv(N, ROWS1)
    total1 = M * TOPK * n_tiles1
    n_tiles2 = tl.cdiv(K, COLS2)
    total2 = M * n_tiles2
    done1_ptr = ws_ptr + _GEMV_WS_DONE1
    passed_ptr = ws_ptr + _GEMV_WS_PASSED
    timed_out_ptr = ws_ptr + _WS_TIMED_OUT
    # GEMM 2 items continue GEMM 1's round robin (as in moe_persistent_kernel):
    # the programs with no GEMM 1 item left take the first GEMM 2 items.
    first2 = (pid + grid - total1 % grid) % grid if SYNC else pid

    if PHASE == -1 or PHASE == 1:
        mine = 0
        for t in range(pid, total1, grid):
            slot = t // n_tiles1
            tok = slot // TOPK
            expert = tl.load(topk_ids_ptr + slot).to(tl.int64)
            cols = (t % n_tiles1) * ROWS1 + tl.arange(0, ROWS1)
            cols_ok = cols < N
            cols_in = tl.minimum(cols, N - 1)  # the tail item's extra columns read a row in bounds, unstored
            if INTERLEAVED:
                gate_row = 2 * cols_in
                up_row = gate_row + 1
            else:
                gate_row = cols_in
                up_row = cols_in + N
            # Gate and up rows as one tile of 2 * ROWS1 rows (gate, up, gate, up, ...).
            rows = tl.reshape(tl.join(gate_row, up_row), (2 * ROWS1,)).to(tl.int64)
            dots = _dot_two_parts(w1_ptr + expert * (2 * N * K), rows * K, x_ptr + tok.to(tl.int64) * K, K, K_A, K_B)
            gate, up = tl.split(tl.reshape(dots, (ROWS1, 2)))
            if HAS_BIAS:
                gate += tl.load(b1_ptr + expert * (2 * N) + gate_row).to(tl.float32)
                up += tl.load(b1_ptr + expert * (2 * N) + up_row).to(tl.float32)
            act = _activate(gate, up, ACTIVATION)
            tl.store(inter_ptr + slot.to(tl.int64) * N + cols, act.to(inter_ptr.dtype.element_ty), mask=cols_ok)
            mine += 1
        if SYNC and mine > 0:
            tl.debug_barrier()  # every thread's stores are issued before the release
            tl.atomic_add(done1_ptr, mine, sem="release", scope="gpu")

    if PHASE == -1 or PHASE == 2:
        offs_s = tl.arange(0, TOPK_PAD)
        slot_ok = offs_s < TOPK
        offs_na = tl.arange(0, N_A)
        offs_nb = N_A + tl.arange(0, N_B)
        in_nb = offs_nb < N
        waited = False
        for j in range(first2, total2, grid):
            tok = j // n_tiles2
            cols = (j % n_tiles2) * COLS2 + tl.arange(0, COLS2)
            cols_ok = cols < K
            cols_in = tl.minimum(cols, K - 1).to(tl.int64)
            slots = tok * TOPK + offs_s
            experts = tl.load(topk_ids_ptr + slots, mask=slot_ok, other=0).to(tl.int64)
            w_rows = experts[:, None, None] * (K * N) + cols_in[None, :, None] * N  # [TOPK_PAD, COLS2, 1]
            wa = tl.load(w2_ptr + w_rows + offs_na[None, None, :], mask=slot_ok[:, None, None], other=0.0)
            wb = tl.load(
                w2_ptr + w_rows + offs_nb[None, None, :], mask=slot_ok[:, None, None] & in_nb[None, None, :], other=0.0
            )
            routing = tl.load(weights_ptr + slots, mask=slot_ok, other=0.0)
            if SYNC and not waited:
                _wait_acquire(done1_ptr, total1, timed_out_ptr, ACQUIRE_LOADS, MAX_SPIN)
            # The activated rows were written by other programs of this launch: from L2 (.cg).
            a_rows = inter_ptr + slots[:, None].to(tl.int64) * N
            aa = tl.load(a_rows + offs_na[None, :], mask=slot_ok[:, None], other=0.0, cache_modifier=".cg")
            ab = tl.load(
                a_rows + offs_nb[None, :], mask=slot_ok[:, None] & in_nb[None, :], other=0.0, cache_modifier=".cg"
            )
            if SYNC and not waited:
                # The last program past the wait clears both words for the next launch
                # (every GEMM 1 count is in, every waiter has read it). Counted after the
                # loads above are issued, so its round trip overlaps theirs, and not at
                # exit, where the last program would wait for it.
                passed = tl.atomic_add(passed_ptr, 1, sem="relaxed", scope="gpu")
                if passed == tl.minimum(grid, total2) - 1:
                    tl.atomic_xchg(done1_ptr, 0, sem="relaxed", scope="gpu")
                    tl.atomic_xchg(passed_ptr, 0, sem="relaxed", scope="gpu")
            waited = True
            per_slot = tl.sum(wa.to(tl.float32) * aa.to(tl.float32)[:, None, :], axis=2) + tl.sum(
                wb.to(tl.float32) * ab.to(tl.float32)[:, None, :], axis=2
            )  # [TOPK_PAD, COLS2]
            if HAS_BIAS:
                per_slot += tl.load(
                    b2_ptr + experts[:, None] * K + cols_in[None, :], mask=slot_ok[:, None], other=0.0
                ).to(tl.float32)
            out = tl.sum(per_slot * routing[:, None], axis=0)
            tl.store(out_ptr + tok.to(tl.int64) * K + cols, out.to(out_ptr.dtype.element_ty), mask=cols_ok)
