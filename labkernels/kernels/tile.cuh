// labkernels: the int8 GEMM tile (tokens LK_BM x output rows LK_BN per block, LK_THREADS threads).
// The constants come from labkernels.kernels.registry (BM, BN, THREADS) as -D options (registry.cuda_defines()),
// so the launchers, the shared-memory formulas and the kernels cannot disagree.
#pragma once
#include "common.cuh"

#if !defined(LK_BM) || !defined(LK_BN) || !defined(LK_THREADS)
#error "LK_BM / LK_BN / LK_THREADS come from labkernels.kernels.registry: compile with registry.cuda_defines()"
#endif

// ---- the int8 GEMM tile skeleton (q6k_expb, q4k_nb, q6k_generic): warp w of the LK_THREADS/32 owns output rows
// 16w..16w+15 and all LK_BM tokens as 4 m16 sub-tiles x 2 n8 half-tiles; C element i of (m, nh) is token
// m*16 + g + 8*(i>>1), row w*16 + nh*8 + 2*t4 + (i&1) (g = lane>>2, t4 = lane&3).
typedef float lk_acc_t[4][2][4];

__device__ __forceinline__ void lk_acc_zero(lk_acc_t acc) {
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int nh = 0; nh < 2; nh++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][nh][i] = 0.f;
}

// the guarded store of a warp's accumulators: tokens t0.., rows j0 + 16*warp.. of Y [nt, od]. A macro for the
// reason LK_A_LOAD is one (as a function it changed q6k_generic[STRIDE=210]'s machine code).
#define LK_TILE_STORE(acc, Y, t0, j0, nt, od, warp, g, t4)                                                      \
    _Pragma("unroll") for (int m_ = 0; m_ < 4; m_++)                                                            \
    _Pragma("unroll") for (int nh_ = 0; nh_ < 2; nh_++)                                                         \
    _Pragma("unroll") for (int i_ = 0; i_ < 4; i_++) {                                                          \
        const int t_ = (t0) + m_ * 16 + (g) + 8 * (i_ >> 1);                                                    \
        const int j_ = (j0) + (warp) * 16 + nh_ * 8 + 2 * (t4) + (i_ & 1);                                      \
        if (t_ < (nt) && j_ < (od)) (Y)[(size_t)t_ * (od) + j_] = (acc)[m_][nh_][i_];                           \
    }

// A staging of the prepass planes for KDR chunks of iteration kt (no commit): qa8 [KDR][LK_BM][32] codes and
// sda [KDR][LK_BM] d|sum words, 16-byte cp.async copies. sda's pointer type is the caller's (u8 or u32): the
// offset is written in its units, so each kernel compiles to the machine code it had before the skeleton.
template <int KDR, typename SP>
__device__ __forceinline__ void lk_stage_a(u8* qa8, SP* sda, const u8* __restrict__ qa8g,
                                           const u32* __restrict__ sdag, int kt, int nchunk, int tid) {
    const size_t qbase = ((size_t)blockIdx.x * nchunk + (size_t)kt * KDR) * (LK_BM * 32);
#pragma unroll
    for (int i = 0; i < (KDR * LK_BM * 32 / 16 + LK_THREADS - 1) / LK_THREADS; i++) {
        const int off = tid + i * LK_THREADS;
        if (off < KDR * LK_BM * 32 / 16) lk_cp_async16(qa8 + off * 16, qa8g + qbase + (size_t)off * 16);
    }
    const size_t sbase = ((size_t)blockIdx.x * nchunk + (size_t)kt * KDR) * LK_BM;
    if (tid < KDR * LK_BM / 4) lk_cp_async16(sda + tid * (int)(16 / sizeof(SP)), sdag + sbase + (size_t)tid * 4);
}

// A operand of chunk kd, m16 sub-tile m: declares the ldmatrix fragment a[4] (over the prepass's half-swapped rows),
// the two tokens' q8_1 words dw (tokens g and g+8 of the sub-tile: d f16 | int16 sum of codes << 16) and their d
// decoded (da0, da1) in the caller's scope. A macro, not a function: inlined function forms (a struct return, or
// out-parameters) made ptxas schedule q6k_expb differently (1-2% slower on the H200, tile_ab 20261201T125104Z);
// the macro compiles to the pre-skeleton machine code (audit.text_ab).
#define LK_A_LOAD(a, dw, da0, da1, qa8, sda, kd, m, lane, g)                                                     \
    u32 a[4];                                                                                                   \
    {                                                                                                           \
        const int tok_ = (m) * 16 + (((lane) >> 3) & 1) * 8 + ((lane) & 7);                                     \
        lk_ldmatrix_x4(a, (qa8) + (kd) * LK_BM * 32 + tok_ * 32 + ((((lane) >> 4) ^ ((tok_ >> 2) & 1)) << 4));  \
    }                                                                                                           \
    const uint2 dw = *(const uint2*)((sda) + (kd) * LK_BM + (m) * 16 + 2 * (g));                                \
    const float da0 = lk_h2f((u16)(dw.x & 0xFFFF)), da1 = lk_h2f((u16)(dw.y & 0xFFFF));

// the per-(chunk, row) float2 scales of a warp's two n8 half-tiles: (x, y) of row 2*t4, (z, w) of row 2*t4 + 1
struct lk_bscales {
    float4 v[2];
};
__device__ __forceinline__ lk_bscales lk_b_scales(const float2* sds, int kd, int warp, int t4) {
    lk_bscales s;
#pragma unroll
    for (int nh = 0; nh < 2; nh++) s.v[nh] = *(const float4*)(sds + kd * LK_BN + warp * 16 + nh * 8 + 2 * t4);
    return s;
}
