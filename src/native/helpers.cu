// tunelab's own kernels for the native worker: the spin that holds the GPU
// while a batch of samples is queued, and the read that evicts L2 before a
// cold sample. Compiled with NVRTC (or hiprtc) for the lane's GPU when the
// worker starts; no headers, so either compiler takes it as it is. Then the
// comparison kernel (tunelab_compare), and last the kernels that build a
// shape's data for `inputs: native` (tunelab_fill_normal,
// tunelab_matmul_reference).

// Spins one thread for `cycles` clock cycles.
extern "C" __global__ void tunelab_spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

// Reads `chunks` 16-byte chunks of `buf`; the sum is stored only when it is
// a value a zeroed buffer never sums to, so no load can be left out.
extern "C" __global__ void tunelab_flush_read(const uint4* buf, unsigned long long chunks, unsigned int* sink) {
    unsigned int acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < chunks; i += stride) {
        const uint4 v = buf[i];
        acc += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) {
        sink[0] = acc;
    }
}

// ---- the correctness check: tunelab_compare, the native twin of
// python/tunelab/compare.py's compare(), whose verdict and figures it must
// reproduce bit for bit (python/tests/test_native.py checks it on a GPU).
// Compiled without contraction (--fmad=false, -ffp-contract=off), so
// `atol + rtol * |ref|` rounds twice in fp32, as torch computes it. Bits are
// read and tested as integers: no math headers, and no fast-math surprises.

// Element kinds, as the native worker passes them.
#define TUNELAB_F32 0
#define TUNELAB_F16 1
#define TUNELAB_BF16 2
#define TUNELAB_COMPARE_THREADS 256

union tunelab_f32_bits {
    float f;
    unsigned int u;
};

union tunelab_f64_bits {
    double d;
    unsigned long long u;
};

__device__ float tunelab_from_bits(unsigned int u) {
    tunelab_f32_bits b;
    b.u = u;
    return b.f;
}

__device__ unsigned int tunelab_to_bits(float f) {
    tunelab_f32_bits b;
    b.f = f;
    return b.u;
}

// An IEEE half's exact fp32 value (subnormals normalised, NaN payloads kept).
__device__ unsigned int tunelab_half_to_f32_bits(unsigned int h) {
    const unsigned int sign = (h & 0x8000u) << 16;
    const unsigned int exponent = (h >> 10) & 0x1fu;
    unsigned int mantissa = h & 0x3ffu;
    if (exponent == 0x1fu) {
        return sign | 0x7f800000u | (mantissa << 13);
    }
    if (exponent != 0) {
        return sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    if (mantissa == 0) {
        return sign;
    }
    // mantissa x 2^-24: shift its leading one up to bit 10, one exponent step each.
    unsigned int e = 113u;
    while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        e -= 1;
    }
    return sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
}

__device__ unsigned int tunelab_load_bits(const void* p, unsigned long long i, int kind) {
    if (kind == TUNELAB_F32) {
        return ((const unsigned int*)p)[i];
    }
    const unsigned int h = ((const unsigned short*)p)[i];
    return kind == TUNELAB_BF16 ? h << 16 : tunelab_half_to_f32_bits(h);
}

// result (zeroed by the caller), all unsigned 64-bit:
//   [0] NaN outputs  [1] infinite outputs  [2] elements with |out - ref| <= atol + rtol * |ref|
//   [3] pairs where both sides are finite  [4] the largest |out - ref| over those pairs, as
//   fp32 bits  [5] the largest |out - ref| / (|ref| + FLT_MIN) over them, in fp64, as bits.
// The maxima are of non-negative numbers, whose bits order as the numbers do.
extern "C" __global__ void tunelab_compare(const void* out, int out_kind, const void* ref, int ref_kind,
                                           unsigned long long n, float atol, float rtol,
                                           unsigned long long* result) {
    __shared__ unsigned long long counts[4][TUNELAB_COMPARE_THREADS];
    __shared__ unsigned long long max_abs[TUNELAB_COMPARE_THREADS];
    __shared__ unsigned long long max_rel[TUNELAB_COMPARE_THREADS];
    unsigned long long nan = 0, inf = 0, within = 0, finite = 0, abs_bits = 0, rel_bits = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned int g = tunelab_load_bits(out, i, out_kind);
        const unsigned int w = tunelab_load_bits(ref, i, ref_kind);
        const unsigned int g_mag = g & 0x7fffffffu;
        const unsigned int w_mag = w & 0x7fffffffu;
        nan += g_mag > 0x7f800000u;
        inf += g_mag == 0x7f800000u;
        const float err = tunelab_from_bits(tunelab_to_bits(tunelab_from_bits(g) - tunelab_from_bits(w)) & 0x7fffffffu);
        const float ref_abs = tunelab_from_bits(w_mag);
        const float allowed = atol + rtol * ref_abs;
        within += err <= allowed;  // false for NaN, as in torch
        if (g_mag < 0x7f800000u && w_mag < 0x7f800000u) {
            finite += 1;
            const unsigned long long e = tunelab_to_bits(err);
            abs_bits = e > abs_bits ? e : abs_bits;
            tunelab_f64_bits rel;
            rel.d = (double)err / ((double)ref_abs + 1.1754943508222875e-38);
            rel_bits = rel.u > rel_bits ? rel.u : rel_bits;
        }
    }
    const unsigned int t = threadIdx.x;
    counts[0][t] = nan;
    counts[1][t] = inf;
    counts[2][t] = within;
    counts[3][t] = finite;
    max_abs[t] = abs_bits;
    max_rel[t] = rel_bits;
    __syncthreads();
    for (unsigned int half = TUNELAB_COMPARE_THREADS / 2; half > 0; half /= 2) {
        if (t < half) {
            for (int c = 0; c < 4; ++c) {
                counts[c][t] += counts[c][t + half];
            }
            max_abs[t] = max_abs[t + half] > max_abs[t] ? max_abs[t + half] : max_abs[t];
            max_rel[t] = max_rel[t + half] > max_rel[t] ? max_rel[t + half] : max_rel[t];
        }
        __syncthreads();
    }
    if (t == 0) {
        for (int c = 0; c < 4; ++c) {
            atomicAdd(&result[c], counts[c][0]);
        }
        atomicMax(&result[4], max_abs[0]);
        atomicMax(&result[5], max_rel[0]);
    }
}

// ---- a shape's data, built on the GPU (the `build` request, `inputs: native`
// in a manifest): inputs drawn from a seeded counter-based generator and the
// fp32 reference of a problem's operator, so the lane needs no Python with
// torch. The generator is a pure function of (seed, stream, index): the same
// seed gives the same bits on every run and every GPU this compiler targets.

__device__ unsigned long long tunelab_mix64(unsigned long long z) {
    // splitmix64's finaliser: every input bit reaches every output bit.
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// fp32 -> bf16 bits, rounding to nearest even (finite values; NaN kept quiet).
__device__ unsigned short tunelab_f32_to_bf16(float f) {
    const unsigned int x = tunelab_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((x >> 16) | 0x40u);
    }
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// fp32 -> IEEE half bits, rounding to nearest even, subnormals and overflow included.
__device__ unsigned short tunelab_f32_to_half(float f) {
    const unsigned int x = tunelab_to_bits(f);
    const unsigned int sign = (x >> 16) & 0x8000u;
    const unsigned int mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) {
        return (unsigned short)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u));
    }
    if (mag >= 0x477ff000u) {
        return (unsigned short)(sign | 0x7c00u);  // 65520 and up round to infinity
    }
    if (mag < 0x33000000u) {
        return (unsigned short)sign;  // below 2^-25 (and 2^-25 itself, a tie to even) rounds to zero
    }
    const unsigned int e = mag >> 23;
    unsigned int q, rem, half;
    if (e < 113u) {
        // A half subnormal: the value in units of 2^-24 is the 24-bit significand >> (126 - e).
        const unsigned int significand = (mag & 0x7fffffu) | 0x800000u;
        const unsigned int shift = 126u - e;
        q = significand >> shift;
        rem = significand & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
    } else {
        q = ((e - 112u) << 10) | ((mag & 0x7fffffu) >> 13);
        rem = mag & 0x1fffu;
        half = 0x1000u;
    }
    q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;  // a carry moves into the exponent
    return (unsigned short)(sign | q);
}

// Fills `n` elements of `out` (kind: TUNELAB_F32/F16/BF16) with std * N(0, 1)
// draws, element i from the hash of (seed, stream, i) by the Box-Muller
// transform, rounded once to the element type.
extern "C" __global__ void tunelab_fill_normal(void* out, int kind, unsigned long long n, unsigned long long seed,
                                               unsigned long long stream, float std) {
    const unsigned long long key = tunelab_mix64(tunelab_mix64(seed) ^ (stream * 0xd1b54a32d192ed03ull));
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const unsigned long long h = tunelab_mix64(key + i);
        const float u1 = (float)((h >> 40) + 1ull) * 5.9604644775390625e-8f;  // (0, 1]: 24 bits
        const float u2 = (float)(h & 0xffffffull) * 5.9604644775390625e-8f;   // [0, 1)
        const float z = std * (sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647f * u2));
        if (kind == TUNELAB_F32) {
            ((float*)out)[i] = z;
        } else if (kind == TUNELAB_BF16) {
            ((unsigned short*)out)[i] = tunelab_f32_to_bf16(z);
        } else {
            ((unsigned short*)out)[i] = tunelab_f32_to_half(z);
        }
    }
}

// The fp32 reference of C = A @ B: A [M, K] and B [K, N] row-major of their
// kinds, C [M, N] fp32, every product accumulated in K order by fused
// multiply-adds. 64 x 64 tiles of C, 256 threads of 4 x 4 outputs each.
#define TUNELAB_REF_TILE 64
#define TUNELAB_REF_STEP 16
extern "C" __global__ void tunelab_matmul_reference(const void* a, int a_kind, const void* b, int b_kind, float* c,
                                                    int m, int n, int k) {
    __shared__ float a_tile[TUNELAB_REF_STEP][TUNELAB_REF_TILE + 1];
    __shared__ float b_tile[TUNELAB_REF_STEP][TUNELAB_REF_TILE];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * TUNELAB_REF_TILE, col0 = blockIdx.x * TUNELAB_REF_TILE;
    float acc[4][4];
    for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) {
            acc[i][j] = 0.0f;
        }
    }
    for (int k0 = 0; k0 < k; k0 += TUNELAB_REF_STEP) {
        for (int l = threadIdx.x; l < TUNELAB_REF_TILE * TUNELAB_REF_STEP; l += blockDim.x) {
            const int r = l / TUNELAB_REF_STEP, s = l % TUNELAB_REF_STEP;
            const int gr = row0 + r, gs = k0 + s;
            a_tile[s][r] = (gr < m && gs < k)
                ? tunelab_from_bits(tunelab_load_bits(a, (unsigned long long)gr * k + gs, a_kind)) : 0.0f;
        }
        for (int l = threadIdx.x; l < TUNELAB_REF_STEP * TUNELAB_REF_TILE; l += blockDim.x) {
            const int s = l / TUNELAB_REF_TILE, col = l % TUNELAB_REF_TILE;
            const int gs = k0 + s, gc = col0 + col;
            b_tile[s][col] = (gs < k && gc < n)
                ? tunelab_from_bits(tunelab_load_bits(b, (unsigned long long)gs * n + gc, b_kind)) : 0.0f;
        }
        __syncthreads();
        for (int s = 0; s < TUNELAB_REF_STEP; ++s) {
            float av[4], bv[4];
            for (int i = 0; i < 4; ++i) {
                av[i] = a_tile[s][ty + 16 * i];
                bv[i] = b_tile[s][tx + 16 * i];
            }
            for (int i = 0; i < 4; ++i) {
                for (int j = 0; j < 4; ++j) {
                    acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
                }
            }
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) {
            const int r = row0 + ty + 16 * i, col = col0 + tx + 16 * j;
            if (r < m && col < n) {
                c[(unsigned long long)r * n + col] = acc[i][j];
            }
        }
    }
}
