// mma_probe.cu -- the int8 tensor-core ceiling: a register-fed loop of
//   mma.sync.aligned.m16n8k{K}.row.col.s32.s8.s8.s32      (K = 16 or 32, sm_80+)
// with CHAINS independent accumulator chains per warp, so the tensor pipe always has independent work in flight
// and nothing but the mma issue rate limits the loop. No shared or global memory in the loop: A/B fragments
// live in registers (derived from the thread index so they are not compile-time constants), the accumulators
// are summed and written to `out` at the end so nothing is dead-code eliminated.
//
// Work per launch: gridDim.x * (blockDim.x / 32) warps x iters x CHAINS mma, each 2*16*8*K int8 ops.
// Registry family: mma_probe (params K in {16, 32}, 256 threads, no shared memory).
//
// Compiled by nvcc (audit, -arch=sm_80/90/120) and by NVRTC through cupy: no standard headers.

#ifndef MMA_PROBE_CHAINS
#define MMA_PROBE_CHAINS 8
#endif

template <int K>
struct MmaProbeFrag;

// m16n8k16 s8: A 16x16 row-major = 2 x b32 per thread, B 16x8 col-major = 1 x b32, C/D 16x8 s32 = 4 x s32
template <>
struct MmaProbeFrag<16> {
    static constexpr int NA = 2;
    static constexpr int NB = 1;
    static __device__ __forceinline__ void mma(int (&d)[4], const unsigned (&a)[NA], const unsigned (&b)[NB]) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 "
            "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(b[0]));
    }
};

// m16n8k32 s8: A 16x32 row-major = 4 x b32 per thread, B 32x8 col-major = 2 x b32, C/D 16x8 s32 = 4 x s32
template <>
struct MmaProbeFrag<32> {
    static constexpr int NA = 4;
    static constexpr int NB = 2;
    static __device__ __forceinline__ void mma(int (&d)[4], const unsigned (&a)[NA], const unsigned (&b)[NB]) {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

template <int K>
__global__ void __launch_bounds__(256) mma_probe_kernel(int* out, int iters) {
    static_assert(K == 16 || K == 32, "mma_probe_kernel: K must be 16 or 32");
    typedef MmaProbeFrag<K> F;
    constexpr int CHAINS = MMA_PROBE_CHAINS;

    const unsigned t = threadIdx.x + blockIdx.x * blockDim.x;
    // small signed bytes (-2..2) so the s32 accumulators never overflow for any realistic iters
    unsigned a[F::NA], b[F::NB];
#pragma unroll
    for (int i = 0; i < F::NA; ++i) a[i] = 0x01010101u * (((t + 3u * i) % 5u) - 2u);
#pragma unroll
    for (int i = 0; i < F::NB; ++i) b[i] = 0x01010101u * (((t + 7u * i + 1u) % 5u) - 2u);

    int acc[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[c][j] = 0;
    }

#pragma unroll 2
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) F::mma(acc[c], a, b);
    }

    int s = 0;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    out[t] = s;
}
