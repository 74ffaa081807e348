// A tiled 16-bit GEMM on tensor cores, C[M, N] = A[M, K] @ B[K, N], all
// row-major, in bf16 (FP16 = 0) or fp16 (FP16 = 1), accumulated in fp32 and
// rounded to the inputs' type (round to nearest even, as torch rounds). tunelab compiles it with NVRTC for each config of
// experiments/quickstart.yaml's `cuda` method and launches it from Rust.
//
// A block computes a BLOCK_M x BLOCK_N tile of C with WARPS_M x WARPS_N warps;
// each warp owns a (BLOCK_M / WARPS_M) x (BLOCK_N / WARPS_N) sub-tile, made of
// m16n8k16 tensor-core products (`mma.sync`, sm_80 and later). The K loop
// walks BLOCK_K-wide slabs through a STAGES-deep ring of shared-memory
// buffers filled with `cp.async`, so the loads of later slabs overlap the
// products of the current one.
//
// Any M, N, K work. When K and N are multiples of 8 (and the operands 16-byte
// aligned) tiles are copied 16 bytes at a time, chunks past an edge zero-filled;
// otherwise element by element, with the same zero fill.
//
// No headers: 16-bit values travel as their raw bits (unsigned short), so the
// file compiles with NVRTC alone, wherever it comes from.
//
// Dynamic shared memory: STAGES * (BLOCK_M * (BLOCK_K + 8) + BLOCK_K * (BLOCK_N + 8)) * 2
// bytes (the manifest's `shared_mem:` says the same); a launch with less traps.

typedef unsigned short bits16;
typedef unsigned int u32;
typedef unsigned long long u64;

namespace tunelab_gemm {

__device__ __forceinline__ u32 shared_address(const void* p) {
    u64 a;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

// 16 bytes global -> shared, asynchronously; `bytes` of them read (0 or 16), the rest zero.
__device__ __forceinline__ void copy16_async(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void wait_copies() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// d += a * b for one m16n8k16 fragment (PTX ISA, "Matrix Fragments for mma.m16n8k16").
template <int FP16>
__device__ __forceinline__ void mma16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    if constexpr (FP16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

// fp32 -> bf16 or fp16, round to nearest even; a NaN stays a NaN (bf16: 0x7fc0, torch's).
template <int FP16>
__device__ __forceinline__ bits16 round16(float f) {
    if constexpr (FP16) {
        bits16 h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    } else {
        u32 x = __float_as_uint(f);
        if ((x & 0x7fffffffu) > 0x7f800000u) {
            return (bits16)0x7fc0;
        }
        x += 0x7fffu + ((x >> 16) & 1u);
        return (bits16)(x >> 16);
    }
}

// One ROWS x COLS tile of a row-major matrix (`pitch` elements per row,
// `rows` x `cols` in all) into shared memory with `spitch` elements per row;
// what lies past the matrix's edge is zero.
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile(bits16* dst, int spitch, const bits16* src, int row0, int col0,
                                          int rows, int cols, int pitch, bool vectors) {
    constexpr int CHUNKS = ROWS * COLS / 8;
    for (int c = threadIdx.x; c < CHUNKS; c += THREADS) {
        const int r = c / (COLS / 8);
        const int k = (c % (COLS / 8)) * 8;
        const int gr = row0 + r, gc = col0 + k;
        bits16* d = dst + r * spitch + k;
        if (vectors) {
            // cols % 8 == 0: a chunk is wholly inside the matrix or wholly outside.
            const bool inside = gr < rows && gc < cols;
            const bits16* s = inside ? src + (u64)gr * pitch + gc : src;
            copy16_async(d, s, inside ? 16 : 0);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                d[j] = (gr < rows && gc + j < cols) ? src[(u64)gr * pitch + gc + j] : (bits16)0;
            }
        }
    }
}

}  // namespace tunelab_gemm

template <int BLOCK_M, int BLOCK_N, int BLOCK_K, int WARPS_M, int WARPS_N, int STAGES, int FP16>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
    gemm_mma(const bits16* __restrict__ A, const bits16* __restrict__ B, bits16* __restrict__ C,
                  int M, int N, int K) {
    using namespace tunelab_gemm;
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WM = BLOCK_M / WARPS_M;  // a warp's rows
    constexpr int WN = BLOCK_N / WARPS_N;  // a warp's columns
    constexpr int MI = WM / 16;            // m16 fragments per warp
    constexpr int NI = WN / 8;             // n8 fragments per warp
    // Padding keeps rows 16-byte aligned and spreads a fragment's reads over the banks.
    constexpr int A_PITCH = BLOCK_K + 8;
    constexpr int B_PITCH = BLOCK_N + 8;
    constexpr int A_STAGE = BLOCK_M * A_PITCH;
    constexpr int B_STAGE = BLOCK_K * B_PITCH;
    constexpr u32 SMEM_BYTES = STAGES * (A_STAGE + B_STAGE) * 2;
    static_assert(WM % 16 == 0 && WN % 8 == 0, "a warp's tile is whole m16n8 fragments");
    static_assert(BLOCK_K % 16 == 0, "BLOCK_K is a multiple of the k16 step");
    static_assert(STAGES >= 2, "the ring needs two stages at least");

    extern __shared__ __align__(16) unsigned char shared[];
    u32 given;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(given));
    if (given < SMEM_BYTES) {
        __trap();  // launched with less shared memory than the ring needs
    }
    bits16* As = reinterpret_cast<bits16*>(shared);
    bits16* Bs = As + STAGES * A_STAGE;

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int group = lane >> 2;          // groupID of the fragment layouts
    const int in_group = lane & 3;        // threadID_in_group
    const int warp_row = (warp / WARPS_N) * WM;
    const int warp_col = (warp % WARPS_N) * WN;
    const int m0 = blockIdx.y * BLOCK_M;
    const int n0 = blockIdx.x * BLOCK_N;
    const bool vectors = (K % 8 == 0) && (N % 8 == 0) && ((reinterpret_cast<u64>(A) | reinterpret_cast<u64>(B)) % 16 == 0);

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;
    auto load = [&](int kt, int stage) {
        const int k0 = kt * BLOCK_K;
        load_tile<BLOCK_M, BLOCK_K, THREADS>(As + stage * A_STAGE, A_PITCH, A, m0, k0, M, K, K, vectors);
        load_tile<BLOCK_K, BLOCK_N, THREADS>(Bs + stage * B_STAGE, B_PITCH, B, k0, n0, K, N, N, vectors);
    };

    // The first STAGES - 1 slabs in flight; one commit group per slab, empty past the end.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) load(s, s);
        commit_copies();
    }
    for (int kt = 0; kt < k_tiles; ++kt) {
        // Slab kt has landed; every warp is done with the stage the next load overwrites.
        wait_copies<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < k_tiles) load(next, next % STAGES);
        commit_copies();

        const bits16* a_s = As + (kt % STAGES) * A_STAGE;
        const bits16* b_s = Bs + (kt % STAGES) * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BLOCK_K; kk += 16) {
            u32 a[MI][4];
            u32 b[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const bits16* p = a_s + (warp_row + i * 16 + group) * A_PITCH + kk + 2 * in_group;
                a[i][0] = *reinterpret_cast<const u32*>(p);                    // row g,   k 2t, 2t+1
                a[i][1] = *reinterpret_cast<const u32*>(p + 8 * A_PITCH);      // row g+8, k 2t, 2t+1
                a[i][2] = *reinterpret_cast<const u32*>(p + 8);                // row g,   k 2t+8, 2t+9
                a[i][3] = *reinterpret_cast<const u32*>(p + 8 * A_PITCH + 8);  // row g+8, k 2t+8, 2t+9
            }
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const bits16* p = b_s + (kk + 2 * in_group) * B_PITCH + warp_col + j * 8 + group;
                b[j][0] = (u32)p[0] | ((u32)p[B_PITCH] << 16);                    // k 2t, 2t+1; column g
                b[j][1] = (u32)p[8 * B_PITCH] | ((u32)p[9 * B_PITCH] << 16);      // k 2t+8, 2t+9
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) mma16<FP16>(acc[i][j], a[i], b[j]);
        }
    }
    wait_copies<0>();

#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            const int r = m0 + warp_row + i * 16 + group;
            const int c = n0 + warp_col + j * 8 + 2 * in_group;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int rr = r + (e >= 2 ? 8 : 0);
                const int cc = c + (e & 1);
                if (rr < M && cc < N) C[(u64)rr * N + cc] = round16<FP16>(acc[i][j][e]);
            }
        }
    }
}
