// Per-element arithmetic shared by the prefill's kernels (prefill.cu) and the decode step's (decode.cu): the block
// reductions, one RMSNorm row, the RoPE angle and rotation, and the fp16 RoPE slot. One definition, so that a
// decode step computes the same numbers as the prefill for the same inputs (the K/V rows of its cache included).
// Device functions only (no kernels).
#pragma once
#include "common.cuh"

__device__ __forceinline__ float lk_block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += red[w];
    return s;
}

__device__ __forceinline__ float lk_block_max(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = __int_as_float(0xff800000);
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s = fmaxf(s, red[w]);
    return s;
}

// One row of it (one block): rmsnorm_kernel and rmsnorm_qk_kernel share this, so both make the same values.
template <int W, int OUT16>
__device__ __forceinline__ void lk_rmsnorm_row(const float* __restrict__ xr, const float* __restrict__ w,
                                               void* __restrict__ y, size_t yoff, int ncols, float eps, float* red) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) ss += xr[i] * xr[i];
    ss = lk_block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / (float)ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = W ? (xr[i] * scale) * w[i] : xr[i] * scale;
        if (OUT16) ((u16*)y)[yoff + i] = lk_f2h(v);
        else ((float*)y)[yoff + i] = v;
    }
}

// The rotation of one pair (shared by rope_kernel and rope_qk_kernel so that both compile to the same arithmetic).
__device__ __forceinline__ void lk_rope_pair(float x0, float x1, float c, float s, float& r0, float& r1) {
    r0 = x0 * c - x1 * s;
    r1 = x0 * s + x1 * c;
}

// cos / sin of the rotation of pair i at position pos: theta = pos * freq_scale * base^(-2i/n_rot).
__device__ __forceinline__ void lk_rope_cs(int pos, int i, int n_rot, float base, float freq_scale, float& s,
                                           float& c) {
    const float theta = (float)pos * freq_scale * powf(base, -2.0f * (float)i / (float)n_rot);
    sincosf(theta, &s, &c);
}

// Pair slot j of one head (rope_qkv16 / qk_norm_rope_qkv16): j < n_rot/2 rotates pair j (NEOX: (j, j + n_rot/2),
// else (2j, 2j+1)) at position pos, larger j copy the unrotated dims n_rot + 2(j - n_rot/2) and the next; then
// times qscale (1 for k) and rounded to fp16 once.
template <int NEOX>
__device__ __forceinline__ void lk_rope16_slot(const float* src, u16* __restrict__ dst, int j, int n_rot, int pos,
                                               float base, float freq_scale, float qscale) {
    const int half = n_rot / 2;
    int a, b;
    float r0, r1;
    if (j < half) {
        float s, c;
        lk_rope_cs(pos, j, n_rot, base, freq_scale, s, c);
        a = NEOX ? j : 2 * j;
        b = NEOX ? j + half : 2 * j + 1;
        lk_rope_pair(src[a], src[b], c, s, r0, r1);
    } else {
        a = n_rot + 2 * (j - half);
        b = a + 1;
        r0 = src[a];
        r1 = src[b];
    }
    if (qscale != 1.0f) {
        r0 = __fmul_rn(r0, qscale);
        r1 = __fmul_rn(r1, qscale);
    }
    dst[a] = lk_f2h(r0);
    dst[b] = lk_f2h(r1);
}

