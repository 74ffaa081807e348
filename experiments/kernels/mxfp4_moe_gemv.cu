// gpt-oss's fused MoE at decode sizes with MXFP4 expert weights, in one
// launch: GEMM 1 with its biases and the clamped, interleaved SwiGLU, then
// GEMM 2 with its biases, weighted by the router and summed over each
// token's experts; bf16 or fp16 activations and output (FP16). tunelab compiles it with
// NVRTC for each config of experiments/gptoss-mxfp4.yaml's `cuda_gemv`
// method and launches it from Rust (docs/quantisation.md, "A CUDA C++
// one-launch kernel").
//
// Why outside Triton: at M=1 the Triton one-token kernels are held by their
// work on each weight once it is on chip, not by their loads
// (docs/quantisation.md, "What limits MXFP4 at M=1"). Here eight weights (one
// 32-bit word) cost twelve instructions:
//   - the weights come in pair order (tunelab.quant.to_pair_order: each
//     word's bits rearranged when the weights are loaded, the same bytes), in
//     which four rotations and four masked XORs give the word's eight codes
//     as four f16 pairs worth the codes' values times 2^-14 (a code's sign at
//     bit 15, its exponent and mantissa at bits 11-9 of its half);
//   - one `fma.rn.f16x2` per pair into f16 accumulators, a group's 32
//     products in two accumulators of eight products a lane, added at the end;
// and the activations of GEMM 1 stay in registers: a lane always takes the
// same 32-value scale groups of a row, so it holds its share of the token's
// activations as f16 pairs, each group scaled by a power of two that puts
// its largest value in [2^14, 2^15) (a lane's sixteen products with decoded
// values, at most 6 * 2^-14, stay below 16 * 12), the power taken back with
// the group's E8M0 scale when the group's sum is added in fp32.
// Work: each block stages the token's activations, scaled, in shared memory
// once (asked for before anything else, so they do not queue behind the
// weights); a warp copies its groups to registers and takes GEMM 1 units (a
// routed slot's gate and up rows j, both K long, with their biases),
// STAGES - 1 units ahead through a ring of shared memory filled by
// asynchronous copies (cp.async), and writes the activated value, rounded
// to the activation type as the reference rounds it, as f16 times 2^10 to a
// module-scope buffer (under gpt-oss's clamps |h| <= 8 * 7 = 56, so 2^10 |h|
// stays below f16's 65504; a product with a decoded weight is an f16
// subnormal only when |h| times the code is below 2^-10, an absolute error
// of at most 2^-25 a product), each group in the order the decode pairs
// it; block 0 writes zeros past N up to the last whole group. All blocks
// then meet at a grid barrier (every block is resident: the grid is the SM
// count times BLOCKS_PER_SM, __launch_bounds__ holds the registers to that
// and the manifest's constraints the shared memory); GEMM 2's first rows
// were asked for before it. With STAGE2, each block then copies every
// slot's activations into shared memory (all of a thread's loads in flight
// at once, through L1, from a block-dependent first record); without, GEMM
// 2 reads them where GEMM 1 wrote them. A warp takes GEMM 2 units (token,
// r): row r of each of the token's experts and its bias, weighted by the
// router and summed in the warp, then written in the activation type.
//
// The barrier's counter only grows (each launch adds the grid), so no launch
// needs it reset. A launch that faults or is killed takes the module with it
// (the native worker restarts).
//
// Limits (the manifest's constraints): M * topk <= MAX_SLOTS, N and K at
// most MAX_COLS, rows stored padded to whole 32-value groups (tunelab.quant).
//
// No headers: bf16 and f16 travel as their raw bits, so the file compiles
// with NVRTC alone.

typedef unsigned short bits16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define MAX_SLOTS 8
#define MAX_COLS 4096

namespace tunelab_mxfp4 {

__device__ u64 g_arrived;                          // grid barrier: arrivals since the module loaded
// GEMM 1's activated output as f16 bits, [slot][N], each 32-value group in
// the order the decode pairs it (`pair_position`).
__device__ __align__(16) bits16 g_h[MAX_SLOTS * MAX_COLS];  // read 16 bytes at a time

#ifdef TRACE
// bench/mxfp4_cuda_timeline.py: %globaltimer stamps, TRACE_STAMPS a warp.
#define TRACE_STAMPS 8
__device__ u64 g_trace[4096 * TRACE_STAMPS];
#define STAMP(i)                                                                                   \
    do {                                                                                           \
        if ((threadIdx.x & 31) == 0) {                                                             \
            u64 t;                                                                                 \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                                  \
            tunelab_mxfp4::g_trace[(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * TRACE_STAMPS + (i)] = t; \
        }                                                                                          \
    } while (0)
#else
#define STAMP(i)
#endif

struct Group {  // one lane's 32-value scale group of a weight row
    uint4 codes;
    u32 scale;
};

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ u32 hadd2(u32 a, u32 b) {
    u32 d;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ float half_lo(u32 pair) {
    float f;
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, l; }" : "=f"(f) : "r"(pair));
    return f;
}

__device__ __forceinline__ float half_hi(u32 pair) {
    float f;
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(pair));
    return f;
}

__device__ __forceinline__ u32 pack_halves(float lo, float hi) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(d) : "f"(lo), "f"(hi));
    return d;
}

__device__ __forceinline__ float bf16_to_float(bits16 b) { return __int_as_float((u32)b << 16); }

__device__ __forceinline__ float f16_to_float(bits16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// The activations' type: bf16 (FP16 = 0) or fp16 (1).
template <int FP16>
__device__ __forceinline__ float act_to_float(bits16 b) {
    return FP16 ? f16_to_float(b) : bf16_to_float(b);
}

// Round to nearest even, as torch rounds fp32 to bf16 (NaN kept a NaN).
__device__ __forceinline__ bits16 float_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bits16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bits16)(u >> 16);
}

__device__ __forceinline__ bits16 float_to_f16(float f) {
    bits16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

template <int FP16>
__device__ __forceinline__ bits16 float_to_act(float f) {
    return FP16 ? float_to_f16(f) : float_to_bf16(f);
}

// Streamed once: no L1 allocation.
__device__ __forceinline__ uint4 load_stream16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ u32 load_byte(const unsigned char* p) {
    u32 v;
    asm volatile("ld.global.nc.u8 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 load_u16(const bits16* p) {
    u32 v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 shared_address(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Asynchronous copies into shared memory (cp.async): `bytes` of the copy's
// size are read, the rest of it is filled with zeros.
__device__ __forceinline__ void copy_async16(void* dst, const void* src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)), "l"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void copy_async4(void* dst, const void* src, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(shared_address(dst)), "l"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Until at most `PENDING` of this thread's committed copy groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void copy_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}

__device__ __forceinline__ u32 rotr(u32 w, u32 s) {
    u32 d;
    asm("shf.r.wrap.b32 %0, %1, %1, %2;" : "=r"(d) : "r"(w), "r"(s));
    return d;
}

// A pair-order word's mask and rotations (tunelab.quant.PAIR_MASK, PAIR_ROTATIONS).
#define PAIR_MASK 0x8E008E00u

// d += the products of 8 codes (one pair-order word) with their activations:
// pairs[i] holds (a_i, a_{i+4}) as f16x2, the pair the decode gives for
// codes i and i + 4. Each decoded value is the code's times 2^-14.
__device__ __forceinline__ u32 dot8(u32 word, const u32 (&pairs)[4], u32 acc) {
    const u32 r7 = rotr(word, 7);
    acc = hfma2(word & PAIR_MASK, pairs[0], acc);
    acc = hfma2(rotr(word, 3) & PAIR_MASK, pairs[1], acc);
    acc = hfma2((r7 ^ rotr(word, 9)) & PAIR_MASK, pairs[2], acc);
    acc = hfma2((r7 ^ rotr(word, 12)) & PAIR_MASK, pairs[3], acc);
    return acc;
}

// 2^(s - 127), the E8M0 scale byte s as a float; 0 for s = 0 (2^-127 is a
// subnormal that times any E2M1 value and activation is far below every
// tolerance) and infinity for 255 (NaN in the format; quantize_mxfp4 never
// writes it).
__device__ __forceinline__ float e8m0_to_float(u32 s) { return __uint_as_float(s << 23); }

// 8 activations from 16 bytes.
template <int FP16>
__device__ __forceinline__ void unpack8(uint4 raw, float* v) {
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = act_to_float<FP16>((bits16)(w[i] & 0xffffu));
        v[2 * i + 1] = act_to_float<FP16>((bits16)(w[i] >> 16));
    }
}

__device__ __forceinline__ uint4 load16_cached(const void* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// To L2 only (st.global.cg): GEMM 1's output never has a line in an SM's L1,
// so GEMM 2 may read it through L1 after the grid barrier (see the staging).
__device__ __forceinline__ void store_l2(bits16* p, bits16 v) {
    asm volatile("st.global.cg.u16 [%0], %1;" : : "l"(p), "h"(v) : "memory");
}

// Where activation group i (token i / groups, group i % groups) of x starts.
__device__ __forceinline__ const bits16* group_start(const bits16* x, int i, int groups, int K) {
    return x + (u64)(i / groups) * K + 32 * (i % groups);
}

// Whether that group is read as four 16-byte loads (load_group_values' fast path).
__device__ __forceinline__ bool group_loads_whole(const bits16* x, int i, int groups, int K) {
    return 32 * (i % groups) + 32 <= K && ((u64)group_start(x, i, groups, K) & 15) == 0;
}

// The 32 activations of the scale group starting at src[col0], zero from `cols` on.
template <int FP16>
__device__ __forceinline__ void load_group_values(const bits16* src, int col0, int cols, float (&v)[32]) {
    const bits16* p = src + col0;
    if (col0 + 32 <= cols && ((u64)p & 15) == 0) {
#pragma unroll
        for (int c = 0; c < 4; ++c) unpack8<FP16>(load16_cached(p + 8 * c), v + 8 * c);
    } else {
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            const bits16 b = col0 + k < cols ? p[k] : (bits16)0;
            v[k] = act_to_float<FP16>(b);
        }
    }
}

// A scale group's activations as the decode pairs them (pairs[4 w + i] holds
// values 8 w + i and 8 w + i + 4), scaled by 2^shift so that the largest
// lands in [2^14, 2^15). `undo` is what the group's sum is multiplied by
// besides the weights' scale: 2^(14 - shift), which takes back both the
// activations' power and the decode's 2^-14.
__device__ __forceinline__ void scale_group(const float (&v)[32], u32* pairs, float& undo) {
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < 32; ++k) amax = fmaxf(amax, fabsf(v[k]));
    int e = 0;  // amax in [2^(e-1), 2^e): scaled by 2^(15 - e) it lands in [2^14, 2^15)
    if (amax > 0.f) frexpf(amax, &e);
    // At most 127: 2^shift stays a float (a group below 2^-112 would need more)
    // and the scaled values stay below 2^15.
    const int shift = amax > 0.f ? min(15 - e, 127) : 0;
    undo = exp2f((float)(14 - shift));
    const float f = exp2f((float)shift);
#pragma unroll
    for (int w = 0; w < 4; ++w)
#pragma unroll
        for (int i = 0; i < 4; ++i) pairs[4 * w + i] = pack_halves(v[8 * w + i] * f, v[8 * w + i + 4] * f);
}

template <int GPL>
__device__ __forceinline__ void load_row(const unsigned char* codes, const unsigned char* scales, int groups,
                                         int lane, Group (&row)[GPL]) {
#pragma unroll
    for (int q = 0; q < GPL; ++q) {
        const int g = lane + 32 * q;
        if (g < groups) {
            row[q].codes = load_stream16(codes + 16 * g);
            row[q].scale = load_byte(scales + g);
        } else {
            row[q].codes = make_uint4(0, 0, 0, 0);
            row[q].scale = 127;
        }
    }
}

// sum + one group's dot product with its scaled activations, in fp32, the
// scales applied (`undo`: scale_group's).
__device__ __forceinline__ float group_dot(const Group& group, const u32 (&pairs)[16], float undo, float sum) {
    u32 a0 = 0, a1 = 0;  // two accumulators: shorter dependent chains, eight products a lane each
    a0 = dot8(group.codes.x, *(const u32(*)[4])(pairs + 0), a0);
    a1 = dot8(group.codes.y, *(const u32(*)[4])(pairs + 4), a1);
    a0 = dot8(group.codes.z, *(const u32(*)[4])(pairs + 8), a0);
    a1 = dot8(group.codes.w, *(const u32(*)[4])(pairs + 12), a1);
    const u32 a = hadd2(a0, a1);
    return fmaf(half_lo(a) + half_hi(a), e8m0_to_float(group.scale) * undo, sum);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// gpt-oss's activation (tunelab.problems.moe: alpha 1.702, clamped at 7).
__device__ __forceinline__ float swiglu_oai(float gate, float up) {
    gate = fminf(gate, 7.f);
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

// Shared memory: activations, one 20-word record a 32-value group (16 f16
// pairs, the group's `undo` factor as float bits, padding). 80-byte records make a quarter
// warp's 16-byte reads of consecutive groups fall in distinct banks.
#define ACT_RECORD_WORDS 20
// GEMM 1's output is held times this (see finish1).
#define H_SCALE 1024.f
// GEMM 2's staging: records a thread loads before it stores any. At 4 warps
// (128 threads), 3 records a thread cover gpt-oss's 4 slots x 90 groups (360)
// in one round trip.
#define STAGE_BATCH 3

// Where value k of a group sits among its 32 halves: pair 4 w + i holds
// values 8 w + i (low half) and 8 w + i + 4 (high), as dot8 takes them.
__device__ __forceinline__ int pair_position(int k) {
    const int w = k >> 3, i = k & 7;
    return 2 * (4 * w + (i & 3)) + (i >> 2);
}

// This lane's share of a GEMM 2 row's dot product with one slot's
// activations, in fp32: from the block's staged records (STAGED), or read
// where GEMM 1 left them (`h`: g_h through L1, 32-value groups in decode
// order, times H_SCALE; past N they are zeros, which block 0 writes before
// the grid barrier, and meet zero codes, which pad the rows).
template <int GPL, int STAGED>
__device__ __forceinline__ float row_dot(const Group (&row)[GPL], const u32* records, const bits16* h, int groups,
                                         int lane) {
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < GPL; ++q) {
        const int g = lane + 32 * q;
        if (g < groups) {
            u32 pairs[16];
            float undo;
            if (STAGED) {
                const u32* record = records + g * ACT_RECORD_WORDS;
#pragma unroll
                for (int c = 0; c < 4; ++c) *(uint4*)(pairs + 4 * c) = *(const uint4*)(record + 4 * c);
                undo = __uint_as_float(record[16]);
            } else {
#pragma unroll
                for (int c = 0; c < 4; ++c) *(uint4*)(pairs + 4 * c) = load16_cached(h + 32 * g + 8 * c);
                undo = 16384.f / H_SCALE;
            }
            sum = group_dot(row[q], pairs, undo, sum);
        }
    }
    return sum;
}

// The same with the activations in registers (a lane's groups, copied once from shared memory).
template <int GPL>
__device__ __forceinline__ float row_dot_held(const Group (&row)[GPL], const u32 (&pairs)[GPL][16],
                                              const float (&undo)[GPL]) {
    float sum = 0.f;
#pragma unroll
    for (int q = 0; q < GPL; ++q) sum = group_dot(row[q], pairs[q], undo[q], sum);
    return sum;
}

}  // namespace tunelab_mxfp4

// GPL1 = groups per lane of a GEMM 1 row (ceil(K / 1024)); GPL2 of a GEMM 2
// row (ceil(N / 1024)); TOPK = the shape's topk; STAGES = GEMM 1 units in a
// warp's ring of shared memory (STAGES - 1 in flight while one is
// computed); STAGE2 = 1: GEMM 2's activations copied into each block's
// shared memory first, 0: read where GEMM 1 wrote them. Dynamic shared
// memory: max(M * ceil(K / 32) * 80 + WARPS * STAGES * SLOT1, STAGE2 * M *
// topk * ceil(N / 32) * 80) bytes (the manifest's `shared_mem:`; SLOT1 =
// 1088 * GPL1 + 32).
template <int GPL1, int GPL2, int TOPK, int WARPS, int BLOCKS_PER_SM, int STAGES, int STAGE2, int FP16>
__global__ void __launch_bounds__(WARPS * 32, BLOCKS_PER_SM)
    mxfp4_moe_gemv(const bits16* __restrict__ x, const int* __restrict__ topk_ids,
                   const float* __restrict__ topk_weights, const unsigned char* __restrict__ w1,
                   const unsigned char* __restrict__ w1_scale, const unsigned char* __restrict__ w2,
                   const unsigned char* __restrict__ w2_scale, const bits16* __restrict__ b1,
                   const bits16* __restrict__ b2, bits16* __restrict__ out, int M, int N, int K) {
    using namespace tunelab_mxfp4;
    static_assert(STAGES >= 2, "a ring needs a unit in flight");
    extern __shared__ __align__(16) u32 act[];
    const int lane = threadIdx.x & 31;
    const int warps = gridDim.x * WARPS;
    const int warp = blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int slots = M * TOPK;
    const int groups1 = (K + 31) / 32, groups2 = (N + 31) / 32;
    const u64 row1 = 16ull * groups1, row2 = 16ull * groups2;  // packed bytes a row
    STAMP(0);

    // ---- GEMM 1: units (slot, j), the gate and up rows j of the slot's
    // expert; a warp keeps one token, its activations in registers. Each
    // warp streams its units through a ring of STAGES slots of shared
    // memory by asynchronous copies, STAGES - 1 units ahead, so that the
    // bytes in flight take no registers (on an H200, two stages were the
    // fastest and three or more slower: results/bench/NVIDIA_H200/
    // mxfp4_m1_gemv/cuda_gemv.md, versions 9 and 10).
    const int token1 = warp % M;
    const int warps_per_token = warps / M;
    const bool gemm1_warp = warp < warps_per_token * M;
    const int groups_x = M * groups1;
    // A slot: the unit's codes [row (gate, up)][q][lane] 16 bytes each, then
    // its 2 * groups1 scale bytes from the 4-byte word holding the first, then
    // the gate and up biases.
    constexpr int SCALES1 = 1024 * GPL1, BIAS1 = SCALES1 + 64 * GPL1 + 16, SLOT1 = BIAS1 + 16;
    constexpr int SCALE_COPIES = (16 * GPL1 + 1 + 31) / 32;  // 4-byte copies a lane, at most
    unsigned char* const ring =
        (unsigned char*)act + groups_x * ACT_RECORD_WORDS * 4 + (threadIdx.x >> 5) * STAGES * SLOT1;
    // A unit is (k, j): row pair j of the warp's token's k-th expert; a warp
    // steps through them by step1 (no divisions: they cost about a tenth of a
    // unit's instructions).
    struct Unit {
        int k, j;
    };
    auto advance = [&](Unit& at, int by) {
        at.j += by;
        while (at.j >= N) at.j -= N, ++at.k;
    };
    auto gate_row_of = [&](Unit at) {  // interleaved: even rows gate, odd up
        return (u64)topk_ids[token1 * TOPK + at.k] * 2 * N + 2 * at.j;
    };
    auto issue1 = [&](int stage, Unit at) {
        unsigned char* slot = ring + stage * SLOT1;
        const u64 gate_row = gate_row_of(at);
        const unsigned char* lane_codes = w1 + gate_row * row1 + 16 * lane;
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int q = 0; q < GPL1; ++q) {
                // Past the row's groups zeros are written and nothing is read;
                // the address is kept inside the row all the same.
                const bool inside = lane + 32 * q < groups1;
                copy_async16(slot + ((r * GPL1 + q) * 32 + lane) * 16, lane_codes + r * row1 + (inside ? 512 * q : 0),
                             inside ? 16 : 0);
            }
        // The unit's 2 * groups1 scale bytes, from the 4-byte word holding the first.
        const u64 first = gate_row * groups1;
        const int lead = (int)(first & 3), bytes = lead + 2 * groups1;
        const unsigned char* scales = w1_scale + (first - lead);
#pragma unroll
        for (int c = 0; c < SCALE_COPIES; ++c) {
            const int at_byte = 4 * (lane + 32 * c);
            if (at_byte < bytes) copy_async4(slot + SCALES1 + at_byte, scales + at_byte, min(4, bytes - at_byte));
        }
        if (lane == 0) copy_async4(slot + BIAS1, b1 + gate_row, 4);  // gate_row is even: 4-byte aligned
    };
    const int step1 = warps_per_token;
    int u = warp / M;
    // A thread's first group of the tokens' activations is asked for before
    // the weights: after them, it would queue behind every block's first rows.
    // Both are then in flight while the activations are scaled.
    uint4 x_first[4];
    const bool x_first_held = threadIdx.x < groups_x && group_loads_whole(x, threadIdx.x, groups1, K);
    if (x_first_held) {
        const bits16* src = group_start(x, threadIdx.x, groups1, K);
#pragma unroll
        for (int c = 0; c < 4; ++c) x_first[c] = load16_cached(src + 8 * c);
    }
    Unit now{0, u}, ahead{0, u};  // the unit to compute, the next to ask for
    advance(now, 0);
    advance(ahead, 0);
    if (gemm1_warp) {
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) {
            if (ahead.k < TOPK) issue1(i, ahead);
            copy_async_commit();  // empty groups too: the waits below count groups
            advance(ahead, step1);
        }
    }

    // Each token's activations into shared memory once a block, scaled per group.
    for (int i = threadIdx.x; i < groups_x; i += WARPS * 32) {
        const int token = i / groups1, g = i % groups1;
        float v[32];
        if (i == (int)threadIdx.x && x_first_held) {
#pragma unroll
            for (int c = 0; c < 4; ++c) unpack8<FP16>(x_first[c], v + 8 * c);
        } else {
            load_group_values<FP16>(x + (u64)token * K, 32 * g, K, v);
        }
        u32* record = act + i * ACT_RECORD_WORDS;
        float undo;
        scale_group(v, record, undo);
        record[16] = __float_as_uint(undo);
    }
    // GEMM 1's output past N, up to the last whole group, is zero: an earlier
    // launch with a longer N (the same module serves every N of a template
    // instance) may have left values there, even a NaN from non-finite inputs,
    // and GEMM 2 reads whole groups (0 codes times a NaN is a NaN).
    if (blockIdx.x == 0) {
        const int tail = 32 * groups2 - N;
        for (int i = threadIdx.x; i < slots * tail; i += WARPS * 32) {
            const int j = N + i % tail;
            store_l2(g_h + (i / tail) * MAX_COLS + (j & ~31) + pair_position(j & 31), (bits16)0);
        }
    }
    __syncthreads();
    STAMP(1);

    if (gemm1_warp) {
        u32 pairs[GPL1][16];
        float undo[GPL1];
#pragma unroll
        for (int q = 0; q < GPL1; ++q) {
            const int g = lane + 32 * q;
            const u32* record = act + (token1 * groups1 + (g < groups1 ? g : 0)) * ACT_RECORD_WORDS;
#pragma unroll
            for (int c = 0; c < 4; ++c) *(uint4*)(pairs[q] + 4 * c) = *(const uint4*)(record + 4 * c);
            undo[q] = __uint_as_float(record[16]);  // a lane past the row's groups multiplies zero codes
        }
        auto finish1 = [&](int stage, Unit at) {
            const unsigned char* slot = ring + stage * SLOT1;
            const int lead = (int)((gate_row_of(at) * groups1) & 3);
            Group gate[GPL1], up[GPL1];
#pragma unroll
            for (int q = 0; q < GPL1; ++q) {
                const int g = lane + 32 * q;
                gate[q].codes = *(const uint4*)(slot + (q * 32 + lane) * 16);
                up[q].codes = *(const uint4*)(slot + ((GPL1 + q) * 32 + lane) * 16);
                // Past the row's groups the codes are zeros: any finite scale.
                gate[q].scale = g < groups1 ? slot[SCALES1 + lead + g] : 127u;
                up[q].scale = g < groups1 ? slot[SCALES1 + lead + groups1 + g] : 127u;
            }
            float g = warp_sum(row_dot_held<GPL1>(gate, pairs, undo));
            float v = warp_sum(row_dot_held<GPL1>(up, pairs, undo));
            if (lane == 0) {
                const int slot_index = token1 * TOPK + at.k, j = at.j;
                const u32 bias = *(const u32*)(slot + BIAS1);
                g += act_to_float<FP16>((bits16)(bias & 0xffffu));
                v += act_to_float<FP16>((bits16)(bias >> 16));
                // Rounded to bf16 as the reference rounds it, then held as f16
                // times H_SCALE (exact): |h| <= 8 * 7 under the clamps, so
                // 2^10 |h| < 65504, and a lane's sixteen products with the
                // decoded weights (at most 6 * 2^-14) stay below 16 * 21.
                const float h = act_to_float<FP16>(float_to_act<FP16>(swiglu_oai(g, v)));
                store_l2(g_h + slot_index * MAX_COLS + (j & ~31) + pair_position(j & 31), float_to_f16(h * H_SCALE));
            }
        };
        int stage = 0;
        while (now.k < TOPK) {
            // The unit STAGES - 1 ahead goes into the slot the last one left.
            if (ahead.k < TOPK) issue1(stage == 0 ? STAGES - 1 : stage - 1, ahead);
            copy_async_commit();
            advance(ahead, step1);
            copy_async_wait<STAGES - 1>();  // this unit's group is complete
            __syncwarp();                   // and so are the other lanes' (scales, biases)
            finish1(stage, now);
            __syncwarp();  // every lane is done with the slot before it is asked for again
            advance(now, step1);
            stage = stage == STAGES - 1 ? 0 : stage + 1;
        }
    }
    copy_async_wait<0>();  // nothing in flight into what GEMM 2's staging overwrites

    // ---- GEMM 2: units (token, r): row r of each of the token's experts,
    // summed and weighted in the warp.
    Group rows0[TOPK][GPL2], rows1[TOPK][GPL2];
    // Lane k < TOPK also asks for the bias of row r of the token's k-th expert
    // with the rows (raw bits), hidden behind the dot products as in GEMM 1.
    u32 bias2_0 = 0, bias2_1 = 0;
    auto issue2 = [&](Group (&rows)[TOPK][GPL2], u32& bias, int unit) {
        const int token = unit / K, r = unit % K;
#pragma unroll
        for (int k = 0; k < TOPK; ++k) {
            const u64 row = (u64)topk_ids[token * TOPK + k] * K + r;
            load_row<GPL2>(w2 + row * row2, w2_scale + row * groups2, groups2, lane, rows[k]);
        }
        if (lane < TOPK) bias = load_u16(b2 + (u64)topk_ids[token * TOPK + lane] * K + r);
    };
    const int units2 = M * K;
    u = warp;
    if (u < units2) issue2(rows0, bias2_0, u);  // weights need no activations: asked before the barrier
    STAMP(2);
    grid_barrier();
    STAMP(3);

    if (STAGE2) {
        // Every slot's activations into shared memory (over GEMM 1's, no
        // longer read; past N they are zeros, see above). Every block reads
        // the same few KB at once, so: a thread issues all of its loads
        // (STAGE_BATCH records) before it stores any, one round trip instead
        // of one a record; the loads go through L1, which the blocks of an SM
        // share (safe: L1 holds no line of g_h, which GEMM 1 stored to L2 only
        // and nothing read before the barrier); and each block starts at its
        // own record, so the blocks do not all queue on the same L2 lines first.
        const int records = slots * groups2;
        const int first = (int)((blockIdx.x * 7u) % (unsigned)records);
        for (int base = threadIdx.x; base < records; base += STAGE_BATCH * WARPS * 32) {
            uint4 held[STAGE_BATCH][4];
#pragma unroll
            for (int b = 0; b < STAGE_BATCH; ++b) {
                int i = base + b * WARPS * 32;
                i = i < records - first ? i + first : i + first - records;
                if (base + b * WARPS * 32 < records) {
                    const bits16* src = g_h + (i / groups2) * MAX_COLS + 32 * (i % groups2);
#pragma unroll
                    for (int c = 0; c < 4; ++c) held[b][c] = load16_cached(src + 8 * c);
                }
            }
#pragma unroll
            for (int b = 0; b < STAGE_BATCH; ++b) {
                if (base + b * WARPS * 32 >= records) break;
                int i = base + b * WARPS * 32;
                i = i < records - first ? i + first : i + first - records;
                u32* record = act + i * ACT_RECORD_WORDS;
#pragma unroll
                for (int c = 0; c < 4; ++c) *(uint4*)(record + 4 * c) = held[b][c];
                record[16] = __float_as_uint(16384.f / H_SCALE);  // undo the decode's 2^-14 and H_SCALE
            }
        }
        __syncthreads();
    }
    STAMP(4);

    auto finish2 = [&](const Group (&rows)[TOPK][GPL2], u32 bias, int unit) {
        const int token = unit / K, r = unit % K;
        float y = 0.f;
#pragma unroll
        for (int k = 0; k < TOPK; ++k) {
            const int slot = token * TOPK + k;
            const float dot = row_dot<GPL2, STAGE2>(rows[k], act + slot * groups2 * ACT_RECORD_WORDS,
                                                     g_h + slot * MAX_COLS, groups2, lane);
            y = fmaf(topk_weights[slot], dot, y);
        }
        if (lane < TOPK) y = fmaf(topk_weights[token * TOPK + lane], act_to_float<FP16>((bits16)bias), y);
        y = warp_sum(y);
        if (lane == 0) out[(u64)token * K + r] = float_to_act<FP16>(y);
    };
    const int step2 = warps;
    // finish2 is straight-line code (TOPK * GPL2 groups) that a warp runs
    // once or twice, so every warp fetches it cold. With 12 groups or more
    // (gpt-oss at N=2880) it is written once, the next unit's rows moved into
    // rows0 after each unit: two copies made "no instruction" the top stall
    // under Nsight Compute (31 % of samples, nearly all in GEMM 2), and one
    // copy is 3.7 % faster. With fewer groups, two copies alternating between
    // the two sets of rows are 1-3 % faster (H200,
    // results/bench/NVIDIA_H200/mxfp4_m1_gemv/cuda_gemv.md).
    if constexpr (TOPK * GPL2 >= 12) {
#pragma unroll 1
        while (u < units2) {
            const bool more = u + step2 < units2;
            if (more) issue2(rows1, bias2_1, u + step2);
            finish2(rows0, bias2_0, u);
            if (!more) break;
            u += step2;
#pragma unroll
            for (int k = 0; k < TOPK; ++k)
#pragma unroll
                for (int q = 0; q < GPL2; ++q) rows0[k][q] = rows1[k][q];
            bias2_0 = bias2_1;
        }
    } else {  // two copies, alternating between the two sets of rows
        while (u < units2) {
            if (u + step2 < units2) issue2(rows1, bias2_1, u + step2);
            finish2(rows0, bias2_0, u);
            u += step2;
            if (u >= units2) break;
            if (u + step2 < units2) issue2(rows0, bias2_0, u + step2);
            finish2(rows1, bias2_1, u);
            u += step2;
        }
    }
    STAMP(5);
}
