// Non-GEMM kernels of the lab's prefill (labkernels.prefill): RMSNorm, RoPE, masked softmax for the
// cuBLAS attention, gated activations and the embedding gather. f32 in and out unless a template
// parameter says f16. Each is a named kernel class in the wall decomposition.
#include "common.cuh"
#include "prefill_ops.cuh"

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[(r % wrows), :]   (ggml_rms_norm then ggml_mul)
// One block per row. W=0: no weight. The weight may be per head (wrows rows of ncols) for q/k norms.
// OUT16=1 writes y as fp16 (round to nearest even): the same values the GEMM's f32 -> f16 conversion would
// make, for a consumer that reads fp16 (round 7's wgmma_kq), without the extra pass over y.
template <int W, int OUT16>
__global__ void __launch_bounds__(256) rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                       void* __restrict__ y, int ncols, float eps) {
    LK_PDL_ENTRY();
    __shared__ float red[32];
    lk_rmsnorm_row<W, OUT16>(x + (size_t)blockIdx.x * ncols, w, y, (size_t)blockIdx.x * ncols, ncols, eps, red);
}

// Gemma's per-head q and k norms in one launch (PrefillOptions.fuse_qk_norm): block r is token r / (n_head +
// n_head_kv), head r % (n_head + n_head_kv) (q's heads, then k's), read from rows of ldq / ldk floats (views of
// the stacked QKV GEMM's output), rmsnorm_kernel's arithmetic with the per-head weight wq / wk, written
// C-contiguous: yq [n_tok, n_head*head_dim], yk [n_tok, n_head_kv*head_dim] (f32).
__global__ void __launch_bounds__(256) rmsnorm_qk_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                                          const float* __restrict__ wq, const float* __restrict__ wk,
                                                          float* __restrict__ yq, float* __restrict__ yk,
                                                          int n_head, int n_head_kv, int head_dim, int ldq, int ldk,
                                                          float eps) {
    LK_PDL_ENTRY();
    __shared__ float red[32];
    const int nh = n_head + n_head_kv;
    const int t = (int)(blockIdx.x / nh), h = (int)(blockIdx.x % nh);
    if (h < n_head)
        lk_rmsnorm_row<1, 0>(q + (size_t)t * ldq + (size_t)h * head_dim, wq, yq,
                             ((size_t)t * n_head + h) * head_dim, head_dim, eps, red);
    else
        lk_rmsnorm_row<1, 0>(k + (size_t)t * ldk + (size_t)(h - n_head) * head_dim, wk, yk,
                             ((size_t)t * n_head_kv + h - n_head) * head_dim, head_dim, eps, red);
}

// In-place rotary embedding of x[t, h, :] (row stride ld floats per token), the first n_rot dims of each
// head: NEOX pairs (i, i + n_rot/2), otherwise (2i, 2i+1). theta = pos * freq_scale * base^(-2i/n_rot).
// One thread per (token, head, pair).
template <int NEOX>
__global__ void __launch_bounds__(256) rope_kernel(float* __restrict__ x, int n_tok, int n_head, int head_dim,
                                                    int n_rot, int ld, float base, float freq_scale, int pos0) {
    LK_PDL_ENTRY();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int half = n_rot / 2;
    if (idx >= (long long)n_tok * n_head * half) return;
    const int i = (int)(idx % half);
    const int h = (int)((idx / half) % n_head);
    const int t = (int)(idx / ((long long)half * n_head));
    float s, c;
    lk_rope_cs(t + pos0, i, n_rot, base, freq_scale, s, c);
    float* p = x + (size_t)t * ld + (size_t)h * head_dim;
    const int a = NEOX ? i : 2 * i, b = NEOX ? i + half : 2 * i + 1;
    float r0, r1;
    lk_rope_pair(p[a], p[b], c, s, r0, r1);
    p[a] = r0;
    p[b] = r1;
}

#ifndef LK_QKNORM_MAXHD   // the largest head_dim qk_norm_rope_qkv16_kernel stages (the launcher checks)
#error "LK_QKNORM_MAXHD comes from the registry (registry.QKNORM_MAXHD via -D)"
#endif

// RoPE of Q and K and the fp16 cast of Q, K and V in one launch (PrefillOptions.fuse_qkv16) for an fp16 attention
// path: reads f32 q [n_tok, ldq] (n_head heads), k [n_tok, ldk] and v [n_tok, ldv] (n_head_kv heads of head_dim /
// head_dim_v) and writes C-contiguous fp16 q16 [n_tok, n_head*head_dim], k16, v16. rope_qk_kernel's rotation; qscale
// multiplies every q value after it (the separate q *= scale, or rope_qk's folded scale: the same f32 product), then
// each value is rounded to fp16 once (lk_f2h, as the cast it replaces). One thread per (token, pair slot): a head's
// head_dim/2 slots are its n_rot/2 rotated pairs, then its unrotated dims two by two; V's slots follow K's.
template <int NEOX>
__global__ void __launch_bounds__(256) rope_qkv16_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                                          const float* __restrict__ v, u16* __restrict__ q16,
                                                          u16* __restrict__ k16, u16* __restrict__ v16, int n_tok,
                                                          int n_head, int n_head_kv, int head_dim, int head_dim_v,
                                                          int n_rot, int ldq, int ldk, int ldv, float base,
                                                          float freq_scale, int pos0, float qscale) {
    LK_PDL_ENTRY();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int hp = head_dim / 2;
    const int sq = n_head * hp, sk = n_head_kv * hp, sv = n_head_kv * (head_dim_v / 2);
    const int per_tok = sq + sk + sv;
    if (idx >= (long long)n_tok * per_tok) return;
    const int t = (int)(idx / per_tok);
    int slot = (int)(idx % per_tok);
    if (slot >= sq + sk) {                     // V: cast two values
        slot -= sq + sk;
        const float* src = v + (size_t)t * ldv + 2 * slot;
        u16* dst = v16 + (size_t)t * n_head_kv * head_dim_v + 2 * slot;
        dst[0] = lk_f2h(src[0]);
        dst[1] = lk_f2h(src[1]);
        return;
    }
    const bool isq = slot < sq;
    if (!isq) slot -= sq;
    const int h = slot / hp, j = slot % hp;
    const float* src = (isq ? q + (size_t)t * ldq : k + (size_t)t * ldk) + (size_t)h * head_dim;
    u16* dst = (isq ? q16 + (size_t)t * n_head * head_dim : k16 + (size_t)t * n_head_kv * head_dim) +
               (size_t)h * head_dim;
    lk_rope16_slot<NEOX>(src, dst, j, n_rot, t + pos0, base, freq_scale, isq ? qscale : 1.0f);
}

// Gemma's q/k norms, RoPE, the q scale and the fp16 cast of Q, K, V in one launch (PrefillOptions.fuse_qk_norm
// with fuse_qkv16): rmsnorm_qk_kernel's row arithmetic (lk_rmsnorm_row, into shared memory) then rope_qkv16_kernel's
// pair arithmetic (lk_rope16_slot) -- the values of those two launches. One block of 256 per (token, head): q's
// heads, then k's, then v's (cast only); q/k/v rows of ldq / ldk / ldv floats (views of the stacked QKV output).
template <int NEOX>
__global__ void __launch_bounds__(256) qk_norm_rope_qkv16_kernel(
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
        const float* __restrict__ wq, const float* __restrict__ wk, u16* __restrict__ q16, u16* __restrict__ k16,
        u16* __restrict__ v16, int n_head, int n_head_kv, int head_dim, int head_dim_v, int n_rot, int ldq, int ldk,
        int ldv, float eps, float base, float freq_scale, int pos0, float qscale) {
    LK_PDL_ENTRY();
    __shared__ float red[32];
    __shared__ float xs[LK_QKNORM_MAXHD];
    const int nh = n_head + 2 * n_head_kv;
    const int t = (int)(blockIdx.x / nh), h = (int)(blockIdx.x % nh);
    if (h >= n_head + n_head_kv) {                 // a v head: the cast
        const int hv = h - n_head - n_head_kv;
        const float* src = v + (size_t)t * ldv + (size_t)hv * head_dim_v;
        u16* dst = v16 + ((size_t)t * n_head_kv + hv) * head_dim_v;
        for (int i = threadIdx.x; i < head_dim_v; i += blockDim.x) dst[i] = lk_f2h(src[i]);
        return;
    }
    const bool isq = h < n_head;
    const int hh = isq ? h : h - n_head;
    const float* src = isq ? q + (size_t)t * ldq + (size_t)hh * head_dim : k + (size_t)t * ldk + (size_t)hh * head_dim;
    u16* dst = isq ? q16 + ((size_t)t * n_head + hh) * head_dim : k16 + ((size_t)t * n_head_kv + hh) * head_dim;
    lk_rmsnorm_row<1, 0>(src, isq ? wq : wk, xs, 0, head_dim, eps, red);
    __syncthreads();
    for (int j = threadIdx.x; j < head_dim / 2; j += blockDim.x)
        lk_rope16_slot<NEOX>(xs, dst, j, n_rot, t + pos0, base, freq_scale, isq ? qscale : 1.0f);
}

// Row-wise masked softmax of attention scores S [rows, n_k] (f32 or f16, in place), row r is query
// q = r % n_q. Key k is visible iff k <= q and (window == 0 or q - k < window). scale multiplies S first.
template <int F16>
__global__ void __launch_bounds__(256) softmax_mask_kernel(void* __restrict__ S, int n_q, int n_k, float scale,
                                                            int window) {
    LK_PDL_ENTRY();
    __shared__ float red[32];
    const long long r = blockIdx.x;
    const int q = (int)(r % n_q);
    float* Sf = (float*)S + r * n_k;
    u16* Sh = (u16*)S + r * n_k;
    auto ld = [&](int k) { return F16 ? lk_h2f(Sh[k]) : Sf[k]; };
    auto visible = [&](int k) { return k <= q && (window == 0 || q - k < window); };
    float m = __int_as_float(0xff800000);
    for (int k = threadIdx.x; k < n_k; k += blockDim.x)
        if (visible(k)) m = fmaxf(m, ld(k) * scale);
    m = lk_block_max(m, red);
    float sum = 0.f;
    for (int k = threadIdx.x; k < n_k; k += blockDim.x)
        if (visible(k)) sum += expf(ld(k) * scale - m);
    sum = lk_block_sum(sum, red);
    const float inv = 1.0f / sum;
    for (int k = threadIdx.x; k < n_k; k += blockDim.x) {
        const float p = visible(k) ? expf(ld(k) * scale - m) * inv : 0.f;
        if (F16) Sh[k] = lk_f2h(p);
        else Sf[k] = p;
    }
}

// act(x) (ACT 0: GELU, tanh approximation as ggml_gelu; 1: SiLU), shared by act_mul and act_mul_gu.
template <int ACT>
__device__ __forceinline__ float lk_act(float x) {
    if (ACT == 0) return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
    return x / (1.0f + expf(-x));
}

// out = act(g) * u. OUT16: write f16.
template <int ACT, int OUT16>
__global__ void __launch_bounds__(256) act_mul_kernel(const float* __restrict__ g, const float* __restrict__ u,
                                                       void* __restrict__ out, long long n) {
    LK_PDL_ENTRY();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = lk_act<ACT>(g[i]) * u[i];
    if (OUT16) ((u16*)out)[i] = lk_f2h(v);
    else ((float*)out)[i] = v;
}

// The same on the output of the merged [gate; up] GEMM (PrefillOptions.fuse_gate_up): gu [rows, 2 * n_ff], gate in
// the first n_ff columns of a row, up in the next n_ff; out [rows, n_ff]; n = rows * n_ff.
template <int ACT, int OUT16>
__global__ void __launch_bounds__(256) act_mul_gu_kernel(const float* __restrict__ gu, void* __restrict__ out,
                                                          int n_ff, long long n) {
    LK_PDL_ENTRY();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = i / n_ff, c = i % n_ff;
    const float* row = gu + r * 2 * n_ff;
    const float v = lk_act<ACT>(row[c]) * row[n_ff + c];
    if (OUT16) ((u16*)out)[i] = lk_f2h(v);
    else ((float*)out)[i] = v;
}

// A memset as a kernel (issue 18, PrefillOptions.memsets_as_kernels): the memset nodes cuBLAS (split-K counters)
// and cuDNN (its workspace flag) put into the prefill's captured graph are replaced by this kernel with the node's
// parameters -- height rows of width elements of ES bytes set to value, rows pitch bytes apart -- so that the
// boundaries around it are kernel-to-kernel ones (labkernels.graph_nodes.memsets_to_kernels).
template <int ES>
__global__ void __launch_bounds__(256) fill_kernel(u8* __restrict__ dst, u32 value, unsigned long long width,
                                                    unsigned long long height, unsigned long long pitch) {
    LK_PDL_ENTRY();
    const unsigned long long n = width * height;
    for (unsigned long long i = (unsigned long long)blockIdx.x * 256 + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * 256) {
        const unsigned long long r = i / width, c = i - r * width;
        u8* q = dst + r * pitch + c * ES;
        if constexpr (ES == 4) *(u32*)q = value;
        else if constexpr (ES == 2) *(u16*)q = (u16)value;
        else *q = (u8)value;
    }
}

// out[t, :] = table[tok[t], :] * scale  (f32 table). One block per token.
template <int F16>
__global__ void __launch_bounds__(256) embed_kernel(const void* __restrict__ table, const int* __restrict__ tok,
                                                     float* __restrict__ out, int d, float scale) {
    LK_PDL_ENTRY();
    const size_t row = (size_t)tok[blockIdx.x] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = F16 ? lk_h2f(((const u16*)table)[row + i]) : ((const float*)table)[row + i];
        out[(size_t)blockIdx.x * d + i] = v * scale;
    }
}

// Residual add fused with the next RMSNorm (labkernels.prefill, PrefillOptions.fuse_add_norm):
//   x[r, :] += PRE ? rmsnorm(a[r, :]) * wpre : a[r, :]      (the residual stream, written back)
//   y[r, :]  = rmsnorm(x[r, :]) * w                          (f32, or fp16 when OUT16)
// One block per row. The per-element arithmetic (no contraction: __fmul_rn / __fadd_rn) and the block reductions
// are those of rmsnorm_kernel followed by the separate f32 add, so the fused result is bitwise the unfused one.
// J (round 9 step 10): 0 -- the loop above, one element of each array per iteration: at one row (the decode step: one
// block) every iteration waits for its loads (16 serial L2/HBM round trips a pass at 4096 columns, ~10 us a launch on
// an H100). J > 0 (ncols <= J * blockDim.x, the launcher checks): the row is loaded into registers up front -- the
// thread's J elements of a, x, wpre and w issued together, one round trip -- and every sum, product and store is the
// loop's, in the loop's order (element i = threadIdx.x + j * blockDim.x, j ascending; the same block reductions), so
// x and y are bitwise J=0's (GPU test).
template <int PRE, int OUT16, int J>
__global__ void __launch_bounds__(256) add_rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ a,
                                                           const float* __restrict__ wpre,
                                                           const float* __restrict__ w, void* __restrict__ y,
                                                           int ncols, float eps) {
    LK_PDL_ENTRY();
    __shared__ float red[32];
    float* xr = x + (size_t)blockIdx.x * ncols;
    const float* ar = a + (size_t)blockIdx.x * ncols;
    float sa = 1.0f;
    if constexpr (J > 0) {
        float av[J], xv[J], pv[J], wv[J];
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            const bool in = i < ncols;
            av[j] = in ? ar[i] : 0.f;
            xv[j] = in ? xr[i] : 0.f;
            wv[j] = in ? w[i] : 0.f;
            if (PRE) pv[j] = in ? wpre[i] : 0.f;
        }
        if (PRE) {
            float sp = 0.f;
#pragma unroll
            for (int j = 0; j < J; ++j)
                if (threadIdx.x + j * blockDim.x < ncols) sp += av[j] * av[j];
            sp = lk_block_sum(sp, red);
            sa = 1.0f / sqrtf(sp / (float)ncols + eps);
        }
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < ncols) {
                const float d = PRE ? __fmul_rn(__fmul_rn(av[j], sa), pv[j]) : av[j];
                const float v = __fadd_rn(xv[j], d);
                xr[i] = v;
                xv[j] = v;
                ss += v * v;
            }
        }
        ss = lk_block_sum(ss, red);
        const float scale = 1.0f / sqrtf(ss / (float)ncols + eps);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < ncols) {
                const float v = __fmul_rn(__fmul_rn(xv[j], scale), wv[j]);
                if (OUT16) ((u16*)y)[(size_t)blockIdx.x * ncols + i] = lk_f2h(v);
                else ((float*)y)[(size_t)blockIdx.x * ncols + i] = v;
            }
        }
        return;
    }
    if (PRE) {
        float sp = 0.f;
        for (int i = threadIdx.x; i < ncols; i += blockDim.x) sp += ar[i] * ar[i];
        sp = lk_block_sum(sp, red);
        sa = 1.0f / sqrtf(sp / (float)ncols + eps);
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float d = PRE ? __fmul_rn(__fmul_rn(ar[i], sa), wpre[i]) : ar[i];
        const float v = __fadd_rn(xr[i], d);
        xr[i] = v;
        ss += v * v;
    }
    ss = lk_block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / (float)ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        if (OUT16) ((u16*)y)[(size_t)blockIdx.x * ncols + i] = lk_f2h(v);
        else ((float*)y)[(size_t)blockIdx.x * ncols + i] = v;
    }
}

// RoPE over Q and K in one launch (PrefillOptions.fuse_rope): rope_kernel's arithmetic on q [n_tok, ldq] (n_head
// heads) and k [n_tok, ldk] (n_head_kv heads), one thread per (token, head of q then k, pair). qscale != 1
// multiplies the rotated q values (the attention scale folded in; only valid when n_rot == head_dim, which the
// launcher checks): the same f32 product as a separate q *= scale after the rotation.
template <int NEOX>
__global__ void __launch_bounds__(256) rope_qk_kernel(float* __restrict__ q, float* __restrict__ k, int n_tok,
                                                       int n_head, int n_head_kv, int head_dim, int n_rot, int ldq,
                                                       int ldk, float base, float freq_scale, int pos0,
                                                       float qscale) {
    LK_PDL_ENTRY();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int half = n_rot / 2;
    const int nh = n_head + n_head_kv;
    if (idx >= (long long)n_tok * nh * half) return;
    const int i = (int)(idx % half);
    const int h = (int)((idx / half) % nh);
    const int t = (int)(idx / ((long long)half * nh));
    float s, c;
    lk_rope_cs(t + pos0, i, n_rot, base, freq_scale, s, c);
    const bool isq = h < n_head;
    float* p = isq ? q + (size_t)t * ldq + (size_t)h * head_dim : k + (size_t)t * ldk + (size_t)(h - n_head) * head_dim;
    const int a = NEOX ? i : 2 * i, b = NEOX ? i + half : 2 * i + 1;
    float r0, r1;
    lk_rope_pair(p[a], p[b], c, s, r0, r1);
    if (isq && qscale != 1.0f) {
        p[a] = __fmul_rn(r0, qscale);
        p[b] = __fmul_rn(r1, qscale);
    } else {
        p[a] = r0;
        p[b] = r1;
    }
}
