// labkernels: shared device helpers for the GEMM kernels.
// Compiled both by NVRTC (through cupy.RawModule, for the running GPU) and by nvcc -cubin (the ptxas
// audit on CPU machines): no host or standard-library headers here.
#pragma once

typedef unsigned char u8;
typedef signed char s8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// The int8 GEMM tile constants LK_BM (tokens per block tile), LK_BN (output rows per block tile) and LK_THREADS
// are not written here: labkernels.kernels.registry (BM, BN, THREADS) passes them as -D options to every build,
// and tile.cuh refuses to compile a tile kernel without them.

// Programmatic dependent launch (issue 18; sm_90+). A kernel launched with the programmatic-stream-serialization
// attribute (labkernels.gpu.programmatic_launches: the prefill's captured graph) may be scheduled while the kernel
// ahead of it in the stream is still running. Every kernel of a source the launcher marks PDL-capable therefore
// starts with LK_PDL_ENTRY(): griddepcontrol.wait blocks until every prerequisite grid has completed and its memory
// is visible (it returns at once after a normal launch), then launch_dependents lets the next kernel in the stream be
// scheduled (its CTAs wait in their own LK_PDL_ENTRY). Nothing is read or written before the wait.
// labkernels.gpu.pdl_sources() checks that every __global__ of a source begins with it.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define LK_PDL_ENTRY()                                          \
    do {                                                        \
        asm volatile("griddepcontrol.wait;\n" ::: "memory");    \
        asm volatile("griddepcontrol.launch_dependents;\n" ::); \
    } while (0)
#else
#define LK_PDL_ENTRY() \
    do {               \
    } while (0)
#endif

// fp16 bits -> float without cuda_fp16.h
__device__ __forceinline__ float lk_h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 lk_f2h(float f) {  // round to nearest even, like numpy/ggml
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// 1.5 * 2^23: int32 accumulators initialised with these bits read back as (1.5*2^23 + sum) in float,
// exactly, while |sum| < 2^22. Lets the epilogues skip the quarter-rate I2F conversion.
#define LK_MAGIC_I 0x4B400000
#define LK_MAGIC_F 12582912.0f

// ---- mma.sync int8 (row.col, s32 accumulate) ----
// m16n8k16: A 2 regs (rows g / g+8, k 4t..4t+3), B 1 reg (k 4t..4t+3, n g), C 4 regs
__device__ __forceinline__ void lk_mma_16816(int c[4], u32 a0, u32 a1, u32 b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}
// m16n8k32: A 4 regs (k16 halves: {a0,a1} = k 0..15, {a2,a3} = k 16..31), B 2 regs
__device__ __forceinline__ void lk_mma_16832(int c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ldmatrix x4: lane l gives the row address of matrix l>>3, row l&7; each thread receives 4 bytes
// (row lane>>2, bytes 4*(lane&3)..+3) of each of the four 8x16-byte matrices.
__device__ __forceinline__ void lk_ldmatrix_x4(u32 r[4], const void* smem_row) {
    u32 addr = (u32)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 16-byte global -> shared asynchronous copy (LDGSTS), bypassing L1
__device__ __forceinline__ void lk_cp_async16(void* smem, const void* gmem) {
    u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void lk_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }
__device__ __forceinline__ void lk_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void lk_cp_async_wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Swizzled byte offset inside a [rows][R16 * 16 bytes] shared plane, so that 8 consecutive rows read at
// the same logical 16-byte column by 4 threads each (the B-fragment pattern) hit 32 distinct banks.
template <int R16>
__device__ __forceinline__ int lk_swz(int row, int byte_off) {
    constexpr int W = R16 >= 8 ? 8 : R16;                     // columns the xor may permute
    constexpr int SH = R16 >= 8 ? 0 : (R16 == 4 ? 1 : (R16 == 2 ? 2 : 3));
    const int f = (row >> SH) & (W - 1);
    return row * (R16 * 16) + ((((byte_off >> 4) ^ f)) << 4) + (byte_off & 15);
}

// Unaligned-safe 32-bit load from a 2-byte aligned address (q6_K blocks at the 210-byte stride are only
// 2-byte aligned); 4-byte aligned strides use one load.
template <bool ALIGNED4>
__device__ __forceinline__ u32 lk_ld32(const u8* p) {
    if (ALIGNED4) return __ldg((const u32*)p);
    const u16* q = (const u16*)p;
    return (u32)__ldg(q) | ((u32)__ldg(q + 1) << 16);
}

// centre 6-bit codes (0..63 per byte) to int8 (code - 32) in all 4 bytes, without SIMD emulation
__device__ __forceinline__ u32 lk_center32(u32 v) { return ((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u; }

// ---- per-type unpack shared by the GEMMs and dequant.cu
// q6_K: the 6-bit codes (0..63, one per byte) of 32-chunk cc (0..7 of a super-block) from its ql and qh bytes
// (ql byte it*64 + (cc&1)*32 + m, shift 4*((cc>>1)&1); qh byte 128 + it*32 + m, shift 2*(cc&3), it = cc>>2):
// 4 codes of a 32-bit word, or one of a single byte
// (T = u32: a word of 4 codes; T = int: one byte's code, the masks cut to one byte so that each caller keeps the
// instructions it had before the two shared this)
template <typename T>
__device__ __forceinline__ T lk_q6k_codes(T ql, T qh, int cc) {
    constexpr bool WORD = T(-1) > T(0);                  // u32: four codes at once; int: one
    constexpr T M4 = WORD ? T(0x0F0F0F0Fu) : T(0xF), M2 = WORD ? T(0x03030303u) : T(0x3);
    return ((ql >> (4 * ((cc >> 1) & 1))) & M4) | (((qh >> (2 * (cc & 3))) & M2) << 4);
}

// q4_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed scale bytes q (block bytes 4..15)
__device__ __forceinline__ void lk_q4k_scale_min(const u8* q, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = q[j] & 63;
        mn = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
