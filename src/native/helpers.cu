// tunelab's own kernels for the native worker: the spin that holds the GPU
// while a batch of samples is queued, and the read that evicts L2 before a
// cold sample. Compiled with NVRTC (or hiprtc) for the lane's GPU when the
// worker starts; no headers, so either compiler takes it as it is.

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
