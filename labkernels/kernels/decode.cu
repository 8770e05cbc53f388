// labkernels round 9: the decode step's own kernels (labkernels.decode). A decode step processes one token at the
// position held in device memory, so that one captured CUDA graph serves every token: no kernel here takes the
// position or the token id as a launch argument.
//
// The decode state `st` (int32 [4], labkernels.decode.ST_*): st[0] the token id the step embeds, st[1] its position
// p, st[2] error flags (bit 0: a position outside the cache, bit 1: a NaN logit), st[3] unused.
//
// The KV cache (labkernels.decode.KVCache): per layer fp16 K [n_ctx, n_head_kv * head_dim] and V [n_ctx, n_head_kv *
// head_dim_v], token-major -- row p holds every kv head of position p, head h at columns h*head_dim.. -- the layout
// the prefill's rope kernels write its k / v in, so the prefill fills rows 0..n-1 with one strided copy.
//
//  decode_qkv_kernel   q/k RMSNorm (gemma3, QKN=1), RoPE at position p, the q scale, the fp16 casts, and the append
//                      of k and v as row p of the layer's cache (prefill_ops.cuh: the prefill's arithmetic).
//  decode_attn_kernel  one query per head over the cache (flash-decoding): keys lo..p, lo = max(0, p - window + 1)
//                      on sliding layers, 0 on global ones, cut into chunks of CH keys; CTA (kv head, split, head
//                      group) computes the softmax state of its chunks, the last CTA to arrive folds every chunk's
//                      state in chunk order. fp32 scores / softmax / accumulation on the CUDA cores.
//  argmax_step_kernel  greedy sampling: argmax over the logits (ties: the lowest index) by many CTAs, the last
//                      merges; writes the token into st[0], advances st[1] and records the token in hist[p + 1].
#include "common.cuh"
#include "prefill_ops.cuh"

#ifndef LK_QKNORM_MAXHD   // the largest head_dim decode_qkv_kernel stages for the q/k norm (the launcher checks)
#error "LK_QKNORM_MAXHD comes from the registry (registry.QKNORM_MAXHD via -D)"
#endif

#define LK_ST_TOK 0
#define LK_ST_POS 1
#define LK_ST_ERR 2
#define LK_ERR_POS 1
#define LK_ERR_NAN 2

#define DA_THREADS 128   // decode_attn_kernel: 4 warps
#define DA_CHMAX 256     // the largest key chunk (shared memory for the chunk's scores)
#define DA_U 4           // key rows a warp loads at once in the score loop
#define AM_THREADS 256   // argmax_step_kernel
#define DA_NEG_INF __int_as_float(0xff800000u)

__device__ __forceinline__ float da_exp2(float x) {   // ex2.approx.ftz: ex2(-inf) = +0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// The per-token Q/K/V work of one layer (labkernels.decode.Decoder._rope_append): one block of 256 threads per head,
// q's n_head heads, then k's n_head_kv, then v's n_head_kv. q, k, v: f32 [n_head*head_dim], [n_head_kv*head_dim],
// [n_head_kv*head_dim_v] (the token's row of the QKV projections: pointers into the stacked output are fine).
//   q/k heads: QKN=1 RMSNorm over head_dim times wq / wk (lk_rmsnorm_row into shared memory), then for every pair slot
//     lk_rope16_slot at position p = st[1] (the q scale qscale multiplying every q value after the rotation, one
//     rounding to fp16): q -> q16 [n_head*head_dim] (fp16), k -> kc row p (kc + p * n_head_kv * head_dim)
//   v heads: the fp16 cast -> vc row p
// The values of the prefill's qk_norm_rope_qkv16 (QKN=1) / rope_qkv16 (QKN=0) launch at n_tok=1, pos0=p.
// A position outside 0..n_ctx-1 writes nothing and sets bit 0 of st[2].
template <int NEOX, int QKN>
__global__ void __launch_bounds__(256) decode_qkv_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                                          const float* __restrict__ v, const float* __restrict__ wq,
                                                          const float* __restrict__ wk, u16* __restrict__ q16,
                                                          u16* __restrict__ kc, u16* __restrict__ vc, int* st,
                                                          int n_ctx, int n_head, int n_head_kv, int head_dim,
                                                          int head_dim_v, int n_rot, float eps, float base,
                                                          float freq_scale, float qscale) {
    LK_PDL_ENTRY();
    __shared__ float red[32];
    __shared__ float xs[QKN ? LK_QKNORM_MAXHD : 1];
    const int pos = st[LK_ST_POS];
    if (pos < 0 || pos >= n_ctx) {
        if (blockIdx.x == 0 && threadIdx.x == 0) atomicOr(st + LK_ST_ERR, LK_ERR_POS);
        return;
    }
    const int h = blockIdx.x;
    if (h >= n_head + n_head_kv) {                 // a v head: the cast into row p
        const int hv = h - n_head - n_head_kv;
        const float* src = v + (size_t)hv * head_dim_v;
        u16* dst = vc + ((size_t)pos * n_head_kv + hv) * head_dim_v;
        for (int i = threadIdx.x; i < head_dim_v; i += blockDim.x) dst[i] = lk_f2h(src[i]);
        return;
    }
    const bool isq = h < n_head;
    const int hh = isq ? h : h - n_head;
    const float* src = (isq ? q : k) + (size_t)hh * head_dim;
    u16* dst = isq ? q16 + (size_t)hh * head_dim : kc + ((size_t)pos * n_head_kv + hh) * head_dim;
    if (QKN) {
        lk_rmsnorm_row<1, 0>(src, isq ? wq : wk, xs, 0, head_dim, eps, red);
        __syncthreads();
        src = xs;
    }
    for (int j = threadIdx.x; j < head_dim / 2; j += blockDim.x)
        lk_rope16_slot<NEOX>(src, dst, j, n_rot, pos, base, freq_scale, isq ? qscale : 1.0f);
}

// Attention of the token at position p = st[1] over the layer's cache (labkernels.decode.decode_attention).
//   q16 [H*D] fp16 (pre-scaled: the scores are q.k * scale_log2, scale_log2 = softmax scale * log2(e)); kc, vc the
//   cache [n_ctx, Hk*D] fp16; o [H*D] fp16 (out16) or f32. Query head h reads kv head h / (H / Hk).
//   Keys lo..p are visible, lo = max(0, p - window + 1) (window > 0: a sliding layer) else 0; they are cut into
//   nch = ceil((p - lo + 1) / CH) chunks of CH keys (the last one shorter), chunk c = keys lo + c*CH ..
// Grid (Hk, NS, NZ): x the kv head, z the group of up to GMAX of its query heads (heads z*GMAX ..), y one of NS
// splits of the chunks: split y takes chunks [y*nch/NS, (y+1)*nch/NS). Per chunk the CTA computes, for each of its
// heads g, the scores s_j (fp32; lanes of a warp take 16-byte pieces of a key row, shuffle-summed in a fixed tree),
// the chunk max m = max_j s_j, p_j = 2^(s_j - m), l = sum_j p_j (lane-strided then a fixed shuffle tree) and the
// unnormalized O[d] = sum_j p_j v_j[d] (row group r of RG takes keys r, r+RG, ..., a thread 8 dims of them; the
// groups added in order), and writes (O, m, l) to its slot of `ws` (maxch slots of GMAX*D + 2*max(GMAX, 2) floats per
// (kv head, head group): maxch >= nch, the launcher's bound). The state of chunk c does not depend on which CTA
// computed it. The CTA that arrives last on the counter of its (kv head, head group) -- cnt[x * NZ + z], zero at
// rest -- re-arms it and folds the states of chunks 0..nch-1: M = max_c m_c, then in chunk order L = sum_c l_c
// 2^(m_c - M), O = sum_c O_c 2^(m_c - M); o = O / L. So the output is the same bits for every NS (split vs unsplit)
// and for any arrival order. q16, kc, vc, o and ws must be 16-byte aligned (the launcher checks).
// A position outside 0..n_ctx-1 writes nothing (decode_qkv_kernel flags it).
template <int D, int GMAX>
__global__ void __launch_bounds__(DA_THREADS, 1) decode_attn_kernel(const u16* __restrict__ q16,
                                                                  const u16* __restrict__ kc,
                                                                  const u16* __restrict__ vc, void* __restrict__ o,
                                                                  const int* st, int n_ctx, int H, int Hk,
                                                                  int window, float scale_log2, int CH, int maxch,
                                                                  float* __restrict__ ws, int* __restrict__ cnt,
                                                                  int out16) {
    LK_PDL_ENTRY();
    static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
    static_assert(GMAX >= 1 && GMAX <= 8, "1..8 query heads a CTA");
    constexpr int LPK = D / 8;                 // lanes per key row: 16 bytes (8 dims) each
    constexpr int KPW = 32 / LPK;              // keys a warp takes per step
    constexpr int NW = DA_THREADS / 32;
    constexpr int TPR = D / 8;                 // PV: threads per V row, 8 dims (16 bytes) each
    constexpr int RG = DA_THREADS / TPR;       // PV: row groups (16, 8, 4)
    // floats of one chunk state: O [GMAX][D], m [GMAX], l [GMAX], padded to 16 bytes (labkernels.decode.AttnPlan)
    constexpr int SLOT = GMAX * D + 2 * (GMAX > 2 ? GMAX : 2);
    __shared__ float sc[GMAX][DA_CHMAX];
    __shared__ float ml[2][GMAX];
    __shared__ float red[(RG - 1) * GMAX * D];
    __shared__ int last;

    const int pos = st[LK_ST_POS];
    if (pos < 0 || pos >= n_ctx) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kh = blockIdx.x, z = blockIdx.z, NZ = gridDim.z, NS = gridDim.y;
    const int G = H / Hk;
    const int g0 = z * GMAX, ng = min(GMAX, G - g0);
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    const int nch = (pos - lo + CH) / CH;                     // ceil((pos - lo + 1) / CH)
    const int c0 = (int)((long long)blockIdx.y * nch / NS), c1 = (int)((long long)(blockIdx.y + 1) * nch / NS);
    const size_t kstride = (size_t)Hk * D;
    const size_t slot0 = (size_t)(kh * NZ + z) * maxch;
    const int seg = lane % LPK, kq = lane / LPK;

    // this lane's 8 dims (seg) of each query head of the CTA, in fp32 (heads >= ng: zero, never written)
    float qr[GMAX][8];
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
        uint4 t = make_uint4(0, 0, 0, 0);
        if (g < ng) t = __ldg((const uint4*)(q16 + (size_t)(kh * G + g0 + g) * D + seg * 8));
        const u32 w4[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            qr[g][2 * e] = lk_h2f((u16)(w4[e] & 0xFFFF));
            qr[g][2 * e + 1] = lk_h2f((u16)(w4[e] >> 16));
        }
    }
    const int r = tid / TPR, dp = tid % TPR;

    for (int c = c0; c < c1; ++c) {
        const int kb = lo + c * CH, len = min(CH, pos + 1 - kb);
        // ---- scores: warp w takes keys w*KPW + kq + m*NW*KPW (m = 0, 1, ..), DA_U of them per step (their
        // loads issued together)
        for (int j0 = warp * KPW; j0 < len; j0 += NW * KPW * DA_U) {   // warp-uniform: the shuffles see every lane
            uint4 t[DA_U];
#pragma unroll
            for (int u = 0; u < DA_U; ++u) {
                const int j = j0 + u * NW * KPW + kq;
                t[u] = j < len ? __ldg((const uint4*)(kc + (size_t)(kb + j) * kstride + (size_t)kh * D + seg * 8))
                               : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < DA_U; ++u) {
                const int j = j0 + u * NW * KPW + kq;
                const u32 w4[4] = {t[u].x, t[u].y, t[u].z, t[u].w};
                float dot[GMAX];
#pragma unroll
                for (int g = 0; g < GMAX; ++g) dot[g] = 0.f;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float k0 = lk_h2f((u16)(w4[e] & 0xFFFF)), k1 = lk_h2f((u16)(w4[e] >> 16));
#pragma unroll
                    for (int g = 0; g < GMAX; ++g) {
                        dot[g] = fmaf(qr[g][2 * e], k0, dot[g]);
                        dot[g] = fmaf(qr[g][2 * e + 1], k1, dot[g]);
                    }
                }
#pragma unroll
                for (int g = 0; g < GMAX; ++g)
#pragma unroll
                    for (int off = LPK / 2; off > 0; off >>= 1) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], off);
                if (j < len && seg == 0) {
#pragma unroll
                    for (int g = 0; g < GMAX; ++g)
                        if (g < ng) sc[g][j] = dot[g] * scale_log2;
                }
            }
        }
        __syncthreads();
        // ---- per head: chunk max, p_j = 2^(s_j - m) in place, l = sum p_j (warp w takes heads w, w + NW, ..)
        for (int g = warp; g < ng; g += NW) {
            float m = DA_NEG_INF;
            for (int j = lane; j < len; j += 32) m = fmaxf(m, sc[g][j]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
            float l = 0.f;
            for (int j = lane; j < len; j += 32) {
                const float p = da_exp2(sc[g][j] - m);
                sc[g][j] = p;
                l += p;
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
            if (lane == 0) {
                ml[0][g] = m;
                ml[1][g] = l;
            }
        }
        __syncthreads();
        // ---- O = sum_j p_j v_j: row group r takes keys r, r + RG, ..; thread dp dims 8dp .. 8dp+7 (one 16-byte load)
        float acc[GMAX][8];
#pragma unroll
        for (int g = 0; g < GMAX; ++g)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
#pragma unroll 2
        for (int j = r; j < len; j += RG) {
            const uint4 t = __ldg((const uint4*)(vc + (size_t)(kb + j) * kstride + (size_t)kh * D + 8 * dp));
            const u32 w4[4] = {t.x, t.y, t.z, t.w};
            float vf[8];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                vf[2 * e] = lk_h2f((u16)(w4[e] & 0xFFFF));
                vf[2 * e + 1] = lk_h2f((u16)(w4[e] >> 16));
            }
#pragma unroll
            for (int g = 0; g < GMAX; ++g) {
                const float p = g < ng ? sc[g][j] : 0.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
            }
        }
        // the row groups added in order 0, 1, .. (through shared memory)
        if (r > 0) {
#pragma unroll
            for (int g = 0; g < GMAX; ++g)
#pragma unroll
                for (int e = 0; e < 8; ++e) red[((r - 1) * GMAX + g) * D + 8 * dp + e] = acc[g][e];
        }
        __syncthreads();
        if (r == 0) {
            for (int rr = 1; rr < RG; ++rr) {
#pragma unroll
                for (int g = 0; g < GMAX; ++g)
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[g][e] += red[((rr - 1) * GMAX + g) * D + 8 * dp + e];
            }
        }
        float* S = ws + (slot0 + c) * SLOT;
        if (r == 0) {
#pragma unroll
            for (int g = 0; g < GMAX; ++g)
                if (g < ng) {
                    float4* d4 = reinterpret_cast<float4*>(S + g * D + 8 * dp);
                    d4[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
                    d4[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
                }
        }
        if (tid < ng) {
            S[GMAX * D + tid] = ml[0][tid];
            S[GMAX * D + GMAX + tid] = ml[1][tid];
        }
        __syncthreads();                                         // sc, ml, red are the next chunk's
    }

    // ---- arrival; the last CTA of this (kv head, head group) re-arms the counter and folds the chunk states
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int* cp = cnt + kh * NZ + z;
        const int l = atomicAdd(cp, 1) == NS - 1;
        if (l) atomicExch(cp, 0);                                // ready for the next launch (graph replay)
        last = l;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // the fold, thread (head g, dims 8*d8 ..): M = max_c m_c, then in chunk order L = sum_c l_c 2^(m_c - M) and
    // O = sum_c O_c 2^(m_c - M) (each chunk's loads independent of the running sums), o = O / L
    for (int idx = tid; idx < ng * (D / 8); idx += DA_THREADS) {
        const int g = idx / (D / 8), d8 = idx % (D / 8);
        const float* S0 = ws + slot0 * SLOT;
        float M = DA_NEG_INF;
#pragma unroll 4
        for (int c = 0; c < nch; ++c) M = fmaxf(M, __ldcg(S0 + (size_t)c * SLOT + GMAX * D + g));
        float L = 0.f, a[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) a[e] = 0.f;
#pragma unroll 2
        for (int c = 0; c < nch; ++c) {
            const float* S = S0 + (size_t)c * SLOT;
            const float w = da_exp2(__ldcg(S + GMAX * D + g) - M);
            const float4 x = __ldcg(reinterpret_cast<const float4*>(S + g * D + 8 * d8));
            const float4 y = __ldcg(reinterpret_cast<const float4*>(S + g * D + 8 * d8 + 4));
            L = fmaf(__ldcg(S + GMAX * D + GMAX + g), w, L);
            a[0] = fmaf(x.x, w, a[0]);
            a[1] = fmaf(x.y, w, a[1]);
            a[2] = fmaf(x.z, w, a[2]);
            a[3] = fmaf(x.w, w, a[3]);
            a[4] = fmaf(y.x, w, a[4]);
            a[5] = fmaf(y.y, w, a[5]);
            a[6] = fmaf(y.z, w, a[6]);
            a[7] = fmaf(y.w, w, a[7]);
        }
        const float inv = 1.0f / L;
        const size_t at = (size_t)(kh * G + g0 + g) * D + 8 * d8;
        if (out16) {
            u32 h2[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) h2[e] = (u32)lk_f2h(a[2 * e] * inv) | ((u32)lk_f2h(a[2 * e + 1] * inv) << 16);
            *reinterpret_cast<uint4*>((u16*)o + at) = make_uint4(h2[0], h2[1], h2[2], h2[3]);
        } else {
            float4* d4 = reinterpret_cast<float4*>((float*)o + at);
            d4[0] = make_float4(a[0] * inv, a[1] * inv, a[2] * inv, a[3] * inv);
            d4[1] = make_float4(a[4] * inv, a[5] * inv, a[6] * inv, a[7] * inv);
        }
    }
}

// (value, index) a is better than b: larger, or equal and a lower index (NaN is never better; the sentinel index n
// of "none yet" loses every tie).
__device__ __forceinline__ bool am_better(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

__device__ __forceinline__ void am_block_best(float& v, int& i, float* sv, int* si) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, off);
        const int oi = __shfl_xor_sync(0xffffffffu, i, off);
        if (am_better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
    for (int w = 1; w < AM_THREADS / 32; ++w)
        if (am_better(sv[w], si[w], v, i)) {
            v = sv[w];
            i = si[w];
        }
}

// Greedy sampling of the step (labkernels.decode.argmax_step): t = argmax_i logits[i] over i < n (ties: the lowest
// index; NaN logits are skipped and set bit 1 of st[2]), then st[0] = t, st[1] = p + 1 and hist[p + 1] = t (p =
// st[1]; p + 1 >= hist_len sets bit 0 of st[2] and writes no hist). CTA b scans [b*per, (b+1)*per), per = ceil(n /
// gridDim.x), and writes its best to wsv/wsi[b]; the CTA that arrives last on cnt[0] (zero at rest) re-arms it and
// merges the CTAs' bests. No logits at all that are not NaN: t = 0 and bit 1 of st[2].
__global__ void __launch_bounds__(AM_THREADS) argmax_step_kernel(const float* __restrict__ logits, int n, int* st,
                                                                  int* __restrict__ hist, int hist_len,
                                                                  float* __restrict__ wsv, int* __restrict__ wsi,
                                                                  int* __restrict__ cnt) {
    LK_PDL_ENTRY();
    __shared__ float sv[AM_THREADS / 32];
    __shared__ int si[AM_THREADS / 32];
    __shared__ int last;
    const int per = (n + (int)gridDim.x - 1) / (int)gridDim.x;
    const int b0 = (int)blockIdx.x * per, b1 = min(n, b0 + per);
    float v = DA_NEG_INF;
    int i = n;
    int nan = 0;
    for (int t = b0 + (int)threadIdx.x; t < b1; t += AM_THREADS) {
        const float x = logits[t];
        if (x != x) nan = 1;
        else if (am_better(x, t, v, i)) {
            v = x;
            i = t;
        }
    }
    nan = __syncthreads_or(nan);
    am_block_best(v, i, sv, si);
    if (threadIdx.x == 0) {
        if (nan) atomicOr(st + LK_ST_ERR, LK_ERR_NAN);
        wsv[blockIdx.x] = v;
        wsi[blockIdx.x] = i;
        __threadfence();
        const int l = atomicAdd(cnt, 1) == (int)gridDim.x - 1;
        if (l) atomicExch(cnt, 0);
        last = l;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    v = DA_NEG_INF;
    i = n;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += AM_THREADS) {
        const float bv = __ldcg(wsv + b);
        const int bi = __ldcg(wsi + b);
        if (am_better(bv, bi, v, i)) {
            v = bv;
            i = bi;
        }
    }
    am_block_best(v, i, sv, si);
    if (threadIdx.x == 0) {
        int tok = i;
        if (tok >= n) {                                    // every logit NaN
            atomicOr(st + LK_ST_ERR, LK_ERR_NAN);
            tok = 0;
        }
        const int p = st[LK_ST_POS] + 1;
        st[LK_ST_TOK] = tok;
        st[LK_ST_POS] = p;
        if (p >= 0 && p < hist_len) hist[p] = tok;
        else atomicOr(st + LK_ST_ERR, LK_ERR_POS);
    }
}
