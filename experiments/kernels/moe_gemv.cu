// The fused MoE at decode sizes (M * topk <= 8) with bf16 or fp16 expert
// weights, in one launch whose weights all come through the Tensor Memory
// Accelerator into shared memory: GEMM 1 with the activation (SiLU-and-mul,
// or gpt-oss's clamped, interleaved SwiGLU), then GEMM 2, weighted by the
// router and summed over each token's experts; biases when given. tunelab
// compiles it with NVRTC for each config of the `cuda_gemv` method of
// experiments/gptoss.yaml and launches it from Rust (README, "Persistent MoE
// at decode sizes").
//
// Why: at M=1 the call is a stream of its experts' weights (24.9 MB at
// gpt-oss-120b's E=128 N=360, 7.4 us at an H100's 3.35 TB/s) and the Triton
// one-launch kernels lose to that stream by how few bytes they have in flight
// while they compute, then by GEMM 2 waiting on GEMM 1
// (results/bench/NVIDIA_H100_80GB_HBM3/persistent_timeline.md). Here the grid
// is one block an SM, and each block asks for every byte it will read before
// it computes anything: its share of GEMM 1's rows through a ring of STAGES
// chunks of shared memory (all of them at once when the share fits, as it
// does at E=128 N=360 M=1: 126 KB an SM on 132 SMs), and its share of GEMM
// 2's rows whole (63 KB there), each by a few bulk copies
// (`cp.async.bulk`, completion counted in bytes on an mbarrier), issued by
// one thread. Once the activations of GEMM 1 are written, a grid barrier, and
// GEMM 2 finds its weights already on chip.
//
// Work:
//   - GEMM 1's units are (slot, j): a routed slot's gate and up rows j, K
//     long. Block b takes units [b * U / G, (b + 1) * U / G) of the U = slots
//     * N in order (10 or 11 at E=128 N=360 M=1: the most a block has is
//     within 1 % of the mean), CHUNK units a ring slot. Consecutive units of
//     a slot are consecutive rows of its expert's w1, so a chunk is two bulk
//     copies (gate rows, up rows; one for the interleaved layout) per slot it
//     touches. A warp takes a block's units in turn (warp, warp + WARPS, ...),
//     holds its token's activations in registers as fp32 (KV 16-byte vectors
//     a lane), and writes act(gate, up) times the router's weight, in fp32,
//     to a module-scope buffer; when the last unit of a ring chunk is done,
//     the warp that finished it asks for the chunk STAGES ahead into it.
//   - GEMM 2's units are output columns r of a token: block b takes r in
//     [b * K / G, (b + 1) * K / G) for every token, whose rows r of the
//     token's experts' w2 it copied into shared memory at the start
//     (W2_LATE 0), or after its last GEMM 1 chunk was asked for (W2_LATE 1:
//     GEMM 1's chunks first, when the ring is refilled). A lane holds GPL2
//     8-value groups of the token's activated GEMM 1 output (topk * N
//     values, flattened), a warp takes columns in turn and sums the lanes.
//
// The barrier's counter only grows (each launch adds the grid), so no launch
// needs it reset. A launch that faults or is killed takes the module with it
// (the native worker restarts). A launch given less dynamic shared memory
// than its layout needs traps rather than write past it.
//
// Limits (the manifest's constraints): M * topk <= MAX_SLOTS; N and K at most
// MAX_COLS and multiples of 8 (bulk copies move multiples of 16 bytes from
// 16-byte aligned addresses); STAGES <= MAX_STAGES.
//
// No headers: bf16 and fp16 travel as their raw bits, so the file compiles
// with NVRTC alone.

typedef unsigned short bits16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define MAX_SLOTS 8
#define MAX_COLS 4096
#define MAX_STAGES 14

namespace tunelab_moe_gemv {

__device__ u64 g_arrived;  // grid barrier: arrivals since the module loaded
// GEMM 1's activated output times the router's weight, [slot][MAX_COLS].
__device__ __align__(16) float g_h[MAX_SLOTS * MAX_COLS];

#ifdef TRACE
// bench/moe_gemv_timeline.py: %globaltimer stamps, TRACE_STAMPS a warp.
#define TRACE_STAMPS 8
__device__ u64 g_trace[4096 * TRACE_STAMPS];
#define STAMP(i)                                                                                   \
    do {                                                                                           \
        if ((threadIdx.x & 31) == 0) {                                                             \
            u64 t;                                                                                 \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                                  \
            tunelab_moe_gemv::g_trace[(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * TRACE_STAMPS + (i)] = t; \
        }                                                                                          \
    } while (0)
#else
#define STAMP(i)
#endif

// Shared memory starts with this header, then (16-byte aligned each): the
// biases of the block's GEMM 1 units and GEMM 2 columns (fp32), the tokens'
// activations, GEMM 2's rows, GEMM 1's ring.
struct Header {
    u64 bars[2 + MAX_STAGES];  // the activations', GEMM 2's rows', each ring slot's
    int done[MAX_STAGES];      // units finished in each ring slot, over all its chunks
    int issued[MAX_STAGES];    // chunks asked for into each ring slot
    int ids[MAX_SLOTS];        // each slot's expert
    float weights[MAX_SLOTS];  // each slot's router weight
};
#define HEADER_BYTES 384
static_assert(sizeof(Header) <= HEADER_BYTES, "the manifest's shared_mem counts 384 bytes of header");

__device__ __forceinline__ u32 shared_address(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void bar_init(u32 bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}

// One arrival that also says how many bytes the copies counted on it bring.
__device__ __forceinline__ void bar_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// Waits for the phase of the given parity to complete: the current one, or
// the one before it. (Further back, parity alone cannot tell: see `issued`.)
__device__ __forceinline__ void bar_wait(u32 bar, u32 parity) {
    u32 done, spins = 0;
    while (true) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
        if (done) return;
        // Bytes that never come (a copy that faulted): stop rather than hang.
        if (++spins > (1u << 22)) __trap();
    }
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     shared_address(dst)),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

template <int FP16>
__device__ __forceinline__ float to_float(bits16 v) {
    if (FP16) {
        float f;
        asm("{ .reg .f16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(v));
        return f;
    }
    return __uint_as_float((u32)v << 16);
}

template <int FP16>
__device__ __forceinline__ bits16 from_float(float f) {
    bits16 v;
    if (FP16)
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(f));
    else
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(v) : "f"(f));
    return v;
}

// The two values of a word of two 16-bit floats, low half first.
template <int FP16>
__device__ __forceinline__ void unpack(u32 w, float& lo, float& hi) {
    if (FP16) {
        lo = to_float<1>((bits16)(w & 0xffffu));
        hi = to_float<1>((bits16)(w >> 16));
    } else {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
    }
}

template <int FP16>
__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
    unpack<FP16>(v.x, f[0], f[1]);
    unpack<FP16>(v.y, f[2], f[3]);
    unpack<FP16>(v.z, f[4], f[5]);
    unpack<FP16>(v.w, f[6], f[7]);
}

template <int FP16>
__device__ __forceinline__ float dot8(uint4 w, const float (&x)[8], float acc) {
    float f[8];
    unpack8<FP16>(w, f);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(f[i], x[i], acc);
    return acc;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// tunelab.problems.moe's activations.
template <int ACT>
__device__ __forceinline__ float activate(float gate, float up) {
    if (ACT == 0) return gate / (1.f + __expf(-gate)) * up;  // SiLU(gate) * up
    gate = fminf(gate, 7.f);                                 // gpt-oss: alpha 1.702, clamped at 7
    up = fminf(fmaxf(up, -7.f), 7.f);
    return (up + 1.f) * (gate / (1.f + __expf(-1.702f * gate)));
}

// Every block arrives, then waits for the whole grid of this launch. The
// arrival is a release and the wait an acquire, by one thread of the block,
// between two block barriers (which carry the block's other threads' writes
// and reads to and from it).
__device__ __forceinline__ void grid_barrier() {
    __syncthreads();
    if (threadIdx.x == 0) {
        const u64 grid = gridDim.x;
        u64 arrived;
        asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;" : "=l"(arrived) : "l"(&g_arrived) : "memory");
        const u64 target = (arrived / grid + 1) * grid;
        u64 now;
        u32 spins = 0;
        while (true) {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(&g_arrived) : "memory");
            if (now >= target) break;
            // A block that is not resident would never arrive: stop rather than hang (seconds).
            if (++spins > (1u << 24)) __trap();
            __nanosleep(32);
        }
    }
    __syncthreads();
}

__device__ __forceinline__ u64 align16(u64 bytes) { return (bytes + 15) & ~(u64)15; }

}  // namespace tunelab_moe_gemv

using namespace tunelab_moe_gemv;

// TOPK experts a token; WARPS a block, one block an SM (the grid is the SM
// count); CHUNK GEMM 1 units a ring slot, STAGES slots; KV = ceil(K / 256)
// 16-byte vectors of a row a lane; GPL2 = ceil(TOPK * N / 256) 8-value groups
// of GEMM 2's activations a lane; ACT 0 SiLU-and-mul (gate rows first), 1
// gpt-oss's SwiGLU (gate and up rows interleaved); FP16 0 bf16, 1 fp16;
// W2_LATE: GEMM 2's rows asked for after GEMM 1's last chunk (1) or at the
// start (0). b1 and b2 may be null (no biases).
template <int TOPK, int WARPS, int CHUNK, int STAGES, int KV, int GPL2, int ACT, int FP16, int W2_LATE>
__global__ void __launch_bounds__(WARPS * 32, 1)
    moe_gemv(const bits16* __restrict__ x, const int* __restrict__ topk_ids, const float* __restrict__ topk_weights,
             const bits16* __restrict__ w1, const bits16* __restrict__ w2, const bits16* __restrict__ b1,
             const bits16* __restrict__ b2, bits16* __restrict__ out, int M, int N, int K) {
    static_assert(STAGES >= 1 && STAGES <= MAX_STAGES, "STAGES ring slots, each with its mbarrier");
    extern __shared__ __align__(128) unsigned char smem[];
    Header& head = *(Header*)smem;
    STAMP(0);
    const int G = gridDim.x, block = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int slots = M * TOPK;

    // GEMM 1's units [u0, u1) and GEMM 2's columns [r0, r1) of this block.
    const int units = slots * N;
    const int u0 = (int)((u64)block * units / G), u1 = (int)((u64)(block + 1) * units / G);
    const int my_units = u1 - u0, units_max = (units + G - 1) / G;
    const int chunks = (my_units + CHUNK - 1) / CHUNK;
    const int r0 = (int)((u64)block * K / G), r1 = (int)((u64)(block + 1) * K / G);
    const int rows = r1 - r0, rows_max = (K + G - 1) / G;

    // The layout, as the manifest's `shared_mem` counts it.
    float* bias1 = (float*)(smem + HEADER_BYTES);  // [units_max][2]: gate, up
    float* bias2 = bias1 + 2 * units_max;          // [M][rows_max]: the router-weighted sum of b2
    u64 at = HEADER_BYTES + align16(4ull * (2 * units_max + M * rows_max));
    bits16* xs = (bits16*)(smem + at);  // [M][K]
    at += align16(2ull * M * K);
    bits16* w2s = (bits16*)(smem + at);  // [slot][rows_max][N]
    at += 2ull * slots * rows_max * N;
    bits16* ring = (bits16*)(smem + at);  // [STAGES][2 * CHUNK][K]
    at += 2ull * STAGES * CHUNK * 2 * K;
    u32 dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    // GEMM 2's activations go over the ring (fp32, [slot][N]).
    if (at > dynamic_bytes || slots * N > STAGES * CHUNK * K) __trap();

    const u32 x_bar = shared_address(&head.bars[0]), w2_bar = shared_address(&head.bars[1]);
    auto ring_bar = [&](int stage) { return shared_address(&head.bars[2 + stage]); };

    // Chunk c of GEMM 1 into its ring slot: per slot it touches, its gate
    // rows and its up rows (SiLU), or both interleaved (gpt-oss), each
    // contiguous in the expert's w1.
    auto issue_chunk = [&](int c) {
        const int first = c * CHUNK, last = min(first + CHUNK, my_units);
        bits16* dst = ring + (u64)(c % STAGES) * 2 * CHUNK * K;
        const u32 bar = ring_bar(c % STAGES);
        bar_expect(bar, (u32)(last - first) * 4u * K);
        for (int i = first; i < last;) {
            const int u = u0 + i, s = u / N, j = u % N;
            const int n = min(last - i, N - j);
            const bits16* expert = w1 + (u64)head.ids[s] * 2 * N * K;
            const int ci = i - first;
            if (ACT == 0) {
                bulk_copy(dst + (u64)ci * K, expert + (u64)j * K, 2u * n * K, bar);
                bulk_copy(dst + (u64)(CHUNK + ci) * K, expert + (u64)(N + j) * K, 2u * n * K, bar);
            } else {
                bulk_copy(dst + (u64)2 * ci * K, expert + (u64)2 * j * K, 4u * n * K, bar);
            }
            i += n;
        }
    };
    // This block's columns of GEMM 2: rows r0..r1 of every slot's expert's w2.
    auto issue_w2 = [&]() {
        bar_expect(w2_bar, 2u * slots * rows * N);
        if (rows > 0)
            for (int s = 0; s < slots; ++s)
                bulk_copy(w2s + (u64)s * rows_max * N, w2 + ((u64)head.ids[s] * K + r0) * N, 2u * rows * N, w2_bar);
    };

    if (tid == 0) {
        for (int i = 0; i < 2 + STAGES; ++i) bar_init(shared_address(&head.bars[i]));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        bar_expect(x_bar, 2u * M * K);  // the activations need no routing: asked for first
        bulk_copy(xs, x, 2u * M * K, x_bar);
    }
    if (tid < STAGES) {
        head.done[tid] = 0;
        head.issued[tid] = 1;  // the first round, asked for below before any warp waits
    }
    if (tid < slots) {
        head.ids[tid] = topk_ids[tid];
        head.weights[tid] = topk_weights[tid];
    }
    __syncthreads();
    // One thread asks for the weights while the others go on: issuing a bulk
    // copy can wait for the copies before it, about 0.15 us each on an H100
    // (bench/moe_gemv_timeline.py), so no block barrier waits for it.
    if (tid == 0) {
        for (int c = 0; c < min(chunks, STAGES); ++c) issue_chunk(c);
        if (!W2_LATE || chunks <= STAGES) issue_w2();
    }
    // The biases, while the weights come: fp32, GEMM 2's weighted and summed
    // over the token's experts (read after the grid barrier).
    if (b1) {
        for (int i = tid; i < 2 * my_units; i += WARPS * 32) {
            const int u = u0 + i / 2, s = u / N, j = u % N;
            const int row = ACT == 0 ? j + (i & 1) * N : 2 * j + (i & 1);
            bias1[i] = to_float<FP16>(b1[(u64)head.ids[s] * 2 * N + row]);
        }
        __syncthreads();
    }
    for (int i = tid; i < M * rows; i += WARPS * 32) {
        const int t = i / rows, r = r0 + i % rows;
        float sum = 0.f;
        if (b2)
#pragma unroll
            for (int k = 0; k < TOPK; ++k)
                sum = fmaf(head.weights[t * TOPK + k], to_float<FP16>(b2[(u64)head.ids[t * TOPK + k] * K + r]), sum);
        bias2[t * rows_max + i % rows] = sum;
    }
    STAMP(1);

    // ---- GEMM 1
    const int vectors = K / 8;
    float xf[KV][8];
    int x_token = -1;
    for (int i = warp; i < my_units; i += WARPS) {
        const int c = i / CHUNK, stage = c % STAGES, ci = i - c * CHUNK;
        const int u = u0 + i, s = u / N, j = u % N, t = s / TOPK;
        if (t != x_token) {
            if (x_token < 0) bar_wait(x_bar, 0);
            x_token = t;
#pragma unroll
            for (int q = 0; q < KV; ++q) {
                const int v = lane + 32 * q;
                const uint4 raw = v < vectors ? *(const uint4*)(xs + (u64)t * K + 8 * v) : make_uint4(0, 0, 0, 0);
                unpack8<FP16>(raw, xf[q]);
            }
        }
        // A warp may reach a chunk two or more rounds of the ring ahead of
        // the slot's (its units are WARPS apart): it waits until the chunk
        // is asked for, after which the slot's mbarrier is at its phase or
        // past it.
        const int round = c / STAGES;
        if (round > 0) {
            u32 spins = 0;
            while (*(volatile int*)&head.issued[stage] <= round)
                if (++spins > (1u << 24)) __trap();
        }
        bar_wait(ring_bar(stage), round & 1);
        if (i == warp) STAMP(2);
        const bits16* slot = ring + (u64)stage * 2 * CHUNK * K;
        const uint4* gate = (const uint4*)(slot + (u64)(ACT == 0 ? ci : 2 * ci) * K);
        const uint4* up = (const uint4*)(slot + (u64)(ACT == 0 ? CHUNK + ci : 2 * ci + 1) * K);
        float g = 0.f, v = 0.f;
#pragma unroll
        for (int q = 0; q < KV; ++q) {
            const int at_v = lane + 32 * q;
            if (at_v < vectors) {
                g = dot8<FP16>(gate[at_v], xf[q], g);
                v = dot8<FP16>(up[at_v], xf[q], v);
            }
        }
        g = warp_sum(g);  // every lane's reads of the slot are done past here
        v = warp_sum(v);
        if (lane == 0) {
            // The last unit of a chunk with one STAGES ahead asks for that one
            // into the slot (the count only grows: CHUNK a chunk, every chunk
            // refilled after is whole).
            if (c + STAGES < chunks) {
                __threadfence_block();
                const int before = atomicAdd(&head.done[stage], 1);
                if (before == (round + 1) * CHUNK - 1) {
                    // The generic proxy's reads of the slot before the async proxy's writes.
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    issue_chunk(c + STAGES);
                    __threadfence_block();  // the chunk's arrival before the count that lets waiters in
                    *(volatile int*)&head.issued[stage] = round + 2;
                    if (W2_LATE && c + STAGES == chunks - 1) issue_w2();
                }
            }
            if (b1) {
                g += bias1[2 * i];
                v += bias1[2 * i + 1];
            }
            const float h = activate<ACT>(g, v);
            asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(g_h + s * MAX_COLS + j), "f"(h * head.weights[s])
                         : "memory");
        }
    }

    STAMP(3);
    grid_barrier();
    STAMP(4);

    // ---- GEMM 2: column r of token t is the sum over the token's experts
    // of w2[e][r] . h (h already weighted), plus the weighted biases.
    if (rows == 0) return;
    bar_wait(w2_bar, 0);
    STAMP(5);
    // Every slot's activations into shared memory, over GEMM 1's ring (every
    // unit is done): each block reads them from L2 once, starting at its own
    // place so the blocks do not queue on the same lines. (Read by every
    // warp from L2, they took about 4 us at E=128 N=360 M=1 on an H100.)
    float* hs = (float*)ring;  // [slot][N]
    {
        const int quads = slots * N / 4, per_row = N / 4;
        const int first = (int)(((u64)block * 37) % (u64)quads);
        for (int base = tid; base < quads; base += 4 * WARPS * 32) {
            float4 held[4];
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                int w = base + b * WARPS * 32;
                if (w < quads) {
                    w = w + first < quads ? w + first : w + first - quads;
                    const float* src = g_h + (w / per_row) * MAX_COLS + 4 * (w % per_row);
                    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                                 : "=f"(held[b].x), "=f"(held[b].y), "=f"(held[b].z), "=f"(held[b].w)
                                 : "l"(src));
                }
            }
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                int w = base + b * WARPS * 32;
                if (w < quads) {
                    w = w + first < quads ? w + first : w + first - quads;
                    *(float4*)(hs + (w / per_row) * N + 4 * (w % per_row)) = held[b];
                }
            }
        }
    }
    __syncthreads();
    const int groups = N / 8, flat = TOPK * groups;  // a token's activations, in 8-value groups
    for (int t = 0; t < M; ++t) {
        float h[GPL2][8];
        u32 offset[GPL2];  // of the group's weights in w2s, row 0
#pragma unroll
        for (int q = 0; q < GPL2; ++q) {
            const int f = lane + 32 * q;
            const int k = f / groups, g = f - k * groups;
            if (f < flat) {
                const float* src = hs + (t * TOPK + k) * N + 8 * g;
                const float4 a = *(const float4*)src, b = *(const float4*)(src + 4);
                h[q][0] = a.x, h[q][1] = a.y, h[q][2] = a.z, h[q][3] = a.w;
                h[q][4] = b.x, h[q][5] = b.y, h[q][6] = b.z, h[q][7] = b.w;
                offset[q] = (u32)((t * TOPK + k) * rows_max) * N + 8 * g;
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) h[q][e] = 0.f;
                offset[q] = 0;
            }
        }
        for (int r = warp; r < rows; r += WARPS) {
            float y = 0.f;
#pragma unroll
            for (int q = 0; q < GPL2; ++q)
                if (lane + 32 * q < flat) y = dot8<FP16>(*(const uint4*)(w2s + offset[q] + (u32)r * N), h[q], y);
            y = warp_sum(y);
            if (lane == 0) out[(u64)t * K + r0 + r] = from_float<FP16>(y + bias2[t * rows_max + r]);
        }
    }
    STAMP(6);
}
