// labkernels: the lab's fused attention (issue 18) -- causal / sliding-window grouped-query attention of the
// prefill in one kernel, FlashAttention-2 style, on mma.sync m16n8k16 f16 x f16 -> f32.
//
//   q [n, H*D], k / v [n, Hk*D]   fp16, token-major (the layout the prefill's rope kernel writes; q pre-scaled or
//                                  not: `scale_log2` = softmax scale * log2(e) is applied to the scores)
//   o [n, H*D]                     fp16, the layout attn_output's GEMM reads
//   key j is visible from query i iff j <= i and (window == 0 or i - j < window); keys >= n do not exist.
//
// One CTA = 8 warps over 16 query rows x WH heads x RW row groups (WH * RW = 4; WH heads share one kv head, so the
// K/V block staged in shared memory feeds every warp). Role w = warp % 4 owns 16 rows of head (w % WH), rows
// 16 * (w / WH) .. +15 of the CTA's BQ = 16 * RW rows; warps 0-3 take keys 0-31 of each 64-key block, warps 4-7
// keys 32-63 (two warps per scheduler, each with half the keys), and the two halves' softmax states are merged in
// shared memory at the end. Grid: x = query blocks (heaviest -- latest -- first), y = H / WH head groups. Shared
// memory: Q [64 rows][D] and a 2-stage cp.async ring of K and V blocks of 64 keys [64][D], every plane
// 16-byte-chunk XOR swizzled (chunk ^ row & 7) so that ldmatrix is conflict-free.
// Per 32 keys a warp computes S = Q K^T (16 x 32, fp32, ldmatrix A from Q, ldmatrix B from K), masks it,
// runs the online softmax in base 2 (fp32 row max / sum), and accumulates O += P V (P re-packed from the S
// accumulators as the A operand, V by ldmatrix.trans). Rows >= n are computed on zero-filled inputs, not written.
// Split-KV (few query blocks, e.g. Gemma's 4 heads at nt = 512: 32 CTAs for 132 SMs): with `items` the grid is a
// list of (query block, chunk) pairs, each chunk kcb key blocks of its query block's range; a chunk writes its
// softmax state (unnormalized O, row max, row sums) to `ws`, and the CTA whose atomicAdd on the query block's
// counter `cnt` comes last merges the states and writes O, then re-arms the counter (zeroed once when the lab
// allocates it, so a graph replay needs no memset). Still one launch per layer.
#include "common.cuh"

#define FA_BK 64        // keys per K/V block (one pipeline stage); each of a row group's two warps takes 32
#define FA_THREADS 256  // 8 warps: 4 (row group, head) roles x 2 key halves
#define FA_NEG_INF __int_as_float(0xff800000u)

__device__ __forceinline__ void fa_mma(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void fa_ldsm_x4_t(u32 r[4], const void* smem_row) {
    u32 addr = (u32)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 16-byte cp.async that zero-fills the destination when `ok` is false (nothing is read then)
__device__ __forceinline__ void fa_cp16(void* smem, const void* gmem, bool ok) {
    u32 s = (u32)__cvta_generic_to_shared(smem);
    int sz = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(sz));
}

// two floats -> f16x2 (lo in the low half), round to nearest even
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// byte offset of 16-byte chunk `c` of row `r` in a swizzled [rows][D] fp16 plane
template <int D>
__device__ __forceinline__ int fa_off(int r, int c) {
    return r * (D * 2) + ((c ^ (r & 7)) << 4);
}

// Merge another softmax state of the same two rows (p = its row maxes m_a, m_b and this lane's partial sums l_a,
// l_b) into this thread's (m, l updated); returns the factors that rescale this thread's accumulators (x) and the
// other state's (y) per row: acc = acc * x + other * y. A row that has seen no key in either keeps zeros.
struct FaRescale {
    float xa, ya, xb, yb;
};
__device__ __forceinline__ FaRescale fa_merge_state(float& m_a, float& m_b, float& l_a, float& l_b, float4 p) {
    const float M_a = fmaxf(m_a, p.x), M_b = fmaxf(m_b, p.y);
    const float R_a = M_a == FA_NEG_INF ? 0.f : M_a, R_b = M_b == FA_NEG_INF ? 0.f : M_b;
    const FaRescale r{fa_exp2(m_a - R_a), fa_exp2(p.x - R_a), fa_exp2(m_b - R_b), fa_exp2(p.y - R_b)};
    l_a = l_a * r.xa + p.z * r.ya;
    l_b = l_b * r.xb + p.w * r.yb;
    m_a = M_a;
    m_b = M_b;
    return r;
}
__device__ __forceinline__ void fa_merge_acc(float a[4], float4 q, const FaRescale& r) {
    a[0] = a[0] * r.xa + q.x * r.ya;
    a[1] = a[1] * r.xa + q.y * r.ya;
    a[2] = a[2] * r.xb + q.z * r.yb;
    a[3] = a[3] * r.xb + q.w * r.yb;
}

template <int D>
__global__ void __launch_bounds__(FA_THREADS, 1)
    flash_attn_kernel(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
                      u16* __restrict__ o, int n, int H, int Hk, int WH, int window, float scale_log2,
                      const int* __restrict__ items, int kcb, int maxc, float* __restrict__ ws, int* __restrict__ cnt) {
    LK_PDL_ENTRY();
    static_assert(D % 16 == 0 && D >= 64 && D <= 256, "head dim must be 64..256, a multiple of 16");
    constexpr int C16 = D / 8;        // 16-byte chunks per row
    constexpr int NT = D / 8;         // n-tiles of 8 dims in O
    extern __shared__ __align__(128) unsigned char fa_smem[];
    unsigned char* Qs = fa_smem;                              // [64][D]
    unsigned char* Ks = Qs + 64 * D * 2;                      // [2][FA_BK][D]
    unsigned char* Vs = Ks + 2 * FA_BK * D * 2;               // [2][FA_BK][D]

    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = (tid >> 5) & 3;                          // the (row group, head) role: 4 of them
    const int half = tid >> 7;                                // which 32 keys of each 64-key block this warp takes
    const int RW = 4 / WH, BQ = 16 * RW;
    // split-KV (items != 0): this CTA is chunk `chunk` (key blocks chunk*kcb .. +kcb-1 of its query block's range)
    // of query block items[2*bx]; without it, query block gridDim.x - 1 - bx (the latest, heaviest, first)
    const int qb = items ? items[2 * blockIdx.x] : gridDim.x - 1 - blockIdx.x;
    const int chunk = items ? items[2 * blockIdx.x + 1] : 0;
    const int q0 = qb * BQ;
    const int hg = blockIdx.y;
    const int G = H / Hk;
    const int kh = (hg * WH) / G;                             // the kv head of all WH heads of this CTA
    const int hw = warp % WH;
    const int h = hg * WH + hw;
    const int r0 = q0 + 16 * (warp / WH);                     // this warp's first query row
    const size_t qstride = (size_t)H * D, kstride = (size_t)Hk * D;

    // key blocks this CTA needs: [lo, hi) rounded out to FA_BK
    const int hi = min(n, q0 + BQ);
    const int lo = window > 0 ? max(0, q0 - window + 1) : 0;
    const int kb0 = lo / FA_BK, kb1 = (hi - 1) / FA_BK;      // inclusive
    const int nkb = kb1 - kb0 + 1;
    const int jb0 = items ? chunk * kcb : 0, jb1 = items ? min(nkb, jb0 + kcb) : nkb;   // this CTA's blocks
    const int nchunks = items ? (nkb + kcb - 1) / kcb : 1;

    // ---- Q: 64 rows (4 warps x 16) into shared memory, with K/V block 0 (one commit group)
    for (int idx = tid; idx < 64 * C16; idx += FA_THREADS) {
        const int R = idx / C16, c = idx % C16;
        const int w = R >> 4, rr = R & 15;
        const int row = q0 + 16 * (w / WH) + rr;
        const int hh = hg * WH + (w % WH);
        const bool ok = row < n;
        fa_cp16(Qs + fa_off<D>(R, c), q + (ok ? (size_t)row * qstride + (size_t)hh * D + c * 8 : 0), ok);
    }
    auto issue = [&](int j, int stage) {
        const int k0 = (kb0 + j) * FA_BK;
        unsigned char* ks = Ks + stage * FA_BK * D * 2;
        unsigned char* vs = Vs + stage * FA_BK * D * 2;
        for (int idx = tid; idx < FA_BK * C16; idx += FA_THREADS) {
            const int r = idx / C16, c = idx % C16;
            const int key = k0 + r;
            const bool ok = key < n;
            const size_t off = ok ? (size_t)key * kstride + (size_t)kh * D + c * 8 : 0;
            fa_cp16(ks + fa_off<D>(r, c), k + off, ok);
            fa_cp16(vs + fa_off<D>(r, c), v + off, ok);
        }
    };
    issue(jb0, 0);
    lk_cp_async_commit();

    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    float m_a = FA_NEG_INF, m_b = FA_NEG_INF;   // running max (base-2 scaled) of rows g and g+8
    float l_a = 0.f, l_b = 0.f;               // this thread's partial row sums
    const int g = lane >> 2, t4 = lane & 3;
    const int ia = r0 + g, ib = r0 + g + 8;   // the two query rows this thread holds
    const unsigned char* qw = Qs + warp * 16 * D * 2;

    for (int j = jb0; j < jb1; ++j) {
        const int st = (j - jb0) & 1;
        if (j + 1 < jb1) {
            issue(j + 1, st ^ 1);
            lk_cp_async_commit();
            lk_cp_async_wait_group<1>();
        } else {
            lk_cp_async_wait_group<0>();
        }
        __syncthreads();
        const int k0 = (kb0 + j) * FA_BK;
        // does any (row, key) of this warp's 16 x 32 block survive the mask?
        const int kw = k0 + 32 * half;                        // this warp's 32 keys: kw .. kw + 31
        const bool live = r0 < n && kw <= r0 + 15 && (window <= 0 || kw + 31 > r0 - window);
        if (live) {
            const unsigned char* ks = Ks + st * FA_BK * D * 2 + half * 32 * D * 2;
            const unsigned char* vs = Vs + st * FA_BK * D * 2 + half * 32 * D * 2;
            float s[4][4];
#pragma unroll
            for (int t = 0; t < 4; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
            // S = Q K^T over D (not unrolled fully: the 128 O accumulators of D = 256 need the registers)
#pragma unroll 2
            for (int kk = 0; kk < D / 16; ++kk) {
                u32 a[4];
                lk_ldmatrix_x4(a, qw + fa_off<D>((lane & 7) + 8 * ((lane >> 3) & 1), 2 * kk + (lane >> 4)));
#pragma unroll
                for (int p = 0; p < 2; ++p) {
                    u32 b[4];
                    lk_ldmatrix_x4(b, ks + fa_off<D>(16 * p + (lane & 7) + 8 * (lane >> 4), 2 * kk + ((lane >> 3) & 1)));
                    fa_mma(s[2 * p], a, b[0], b[1]);
                    fa_mma(s[2 * p + 1], a, b[2], b[3]);
                }
            }
            // mask, scale, block row max
            float bm_a = FA_NEG_INF, bm_b = FA_NEG_INF;
#pragma unroll
            for (int t = 0; t < 4; ++t) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = kw + 8 * t + 2 * t4 + e;
                    const bool va = key < n && key <= ia && (window <= 0 || ia - key < window);
                    const bool vb = key < n && key <= ib && (window <= 0 || ib - key < window);
                    s[t][e] = va ? s[t][e] * scale_log2 : FA_NEG_INF;
                    s[t][2 + e] = vb ? s[t][2 + e] * scale_log2 : FA_NEG_INF;
                    bm_a = fmaxf(bm_a, s[t][e]);
                    bm_b = fmaxf(bm_b, s[t][2 + e]);
                }
            }
            bm_a = fmaxf(bm_a, __shfl_xor_sync(0xffffffffu, bm_a, 1));
            bm_a = fmaxf(bm_a, __shfl_xor_sync(0xffffffffu, bm_a, 2));
            bm_b = fmaxf(bm_b, __shfl_xor_sync(0xffffffffu, bm_b, 1));
            bm_b = fmaxf(bm_b, __shfl_xor_sync(0xffffffffu, bm_b, 2));
            const float mn_a = fmaxf(m_a, bm_a), mn_b = fmaxf(m_b, bm_b);
            // a row that has seen no visible key yet keeps everything at zero (no inf - inf)
            const float ref_a = mn_a == FA_NEG_INF ? 0.f : mn_a, ref_b = mn_b == FA_NEG_INF ? 0.f : mn_b;
            const float al_a = fa_exp2(m_a - ref_a), al_b = fa_exp2(m_b - ref_b);
            m_a = mn_a;
            m_b = mn_b;
            l_a *= al_a;
            l_b *= al_b;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                acc[t][0] *= al_a;
                acc[t][1] *= al_a;
                acc[t][2] *= al_b;
                acc[t][3] *= al_b;
            }
            u32 pa[2][4];   // P as the A operand of two k16 steps (keys 0-15, 16-31)
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const float p0 = fa_exp2(s[t][0] - ref_a), p1 = fa_exp2(s[t][1] - ref_a);
                const float p2 = fa_exp2(s[t][2] - ref_b), p3 = fa_exp2(s[t][3] - ref_b);
                l_a += p0 + p1;
                l_b += p2 + p3;
                pa[t >> 1][(t & 1) * 2 + 0] = fa_pack(p0, p1);
                pa[t >> 1][(t & 1) * 2 + 1] = fa_pack(p2, p3);
            }
            // O += P V
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
                for (int dp = 0; dp < NT / 2; ++dp) {
                    u32 b[4];
                    fa_ldsm_x4_t(b, vs + fa_off<D>(16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * dp + (lane >> 4)));
                    fa_mma(acc[2 * dp], pa[kk], b[0], b[1]);
                    fa_mma(acc[2 * dp + 1], pa[kk], b[2], b[3]);
                }
            }
        }
        __syncthreads();   // the stage read here is refilled by the next iteration's issue
    }

    // ---- the two key halves of each (row group, head): half 1 hands its state to half 0 through shared memory
    // (the K/V ring is free after the loop's last barrier), half 0 merges and writes
    float* red = reinterpret_cast<float*>(Ks);                // [4 roles][NT][32 lanes][4]
    float* red_ml = red + 4 * NT * 32 * 4;                    // [4 roles][32 lanes][4]: m_a, m_b, l_a, l_b
    if (half == 1) {
        float4* red4 = reinterpret_cast<float4*>(red) + warp * NT * 32 + lane;
#pragma unroll
        for (int t = 0; t < NT; ++t) red4[32 * t] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
        *reinterpret_cast<float4*>(red_ml + (warp * 32 + lane) * 4) = make_float4(m_a, m_b, l_a, l_b);
    }
    __syncthreads();
    if (half == 1) return;
    {
        const FaRescale r = fa_merge_state(m_a, m_b, l_a, l_b,
                                           *reinterpret_cast<const float4*>(red_ml + (warp * 32 + lane) * 4));
        const float4* oth4 = reinterpret_cast<const float4*>(red) + warp * NT * 32 + lane;
#pragma unroll
        for (int t = 0; t < NT; ++t) fa_merge_acc(acc[t], oth4[32 * t], r);
    }
    // ---- split-KV: write this chunk's state (fragment order, per-thread partial sums); the CTA that finishes its
    // query block's last chunk merges every chunk's state and writes the output, then re-arms the counter
    if (nchunks > 1) {
        const size_t slot = ((size_t)(qb * gridDim.y + hg) * maxc);
        constexpr int SLOT = 4 * NT * 32 * 4 + 4 * 32 * 4;   // floats per chunk state
        float* mine = ws + (slot + chunk) * SLOT;
        float4* mine4 = reinterpret_cast<float4*>(mine) + warp * NT * 32 + lane;   // + 32 t: immediate offsets
#pragma unroll
        for (int t = 0; t < NT; ++t) __stcg(mine4 + 32 * t, make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
        __stcg(reinterpret_cast<float4*>(mine + 4 * NT * 32 * 4 + (warp * 32 + lane) * 4),
               make_float4(m_a, m_b, l_a, l_b));
        __threadfence();
        asm volatile("bar.sync 1, 128;\n" ::: "memory");    // the four merging warps (half 1 has left)
        int* flag = reinterpret_cast<int*>(red_ml + 4 * 32 * 4);
        if (tid == 0) {
            int* c = cnt + qb * gridDim.y + hg;
            const int last = atomicAdd(c, 1) == nchunks - 1;
            if (last) atomicExch(c, 0);                       // ready for the next launch
            *flag = last;
        }
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
        if (!*flag) return;
        __threadfence();
        // merge every chunk's state, this one's included (read back: nothing has to stay live across the barrier)
        m_a = m_b = FA_NEG_INF;
        l_a = l_b = 0.f;
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
#pragma unroll 1
        for (int c2 = 0; c2 < nchunks; ++c2) {
            const float* oth = ws + (slot + c2) * SLOT;
            const FaRescale r = fa_merge_state(
                m_a, m_b, l_a, l_b, __ldcg(reinterpret_cast<const float4*>(oth + 4 * NT * 32 * 4 + (warp * 32 + lane) * 4)));
            const float4* oth4 = reinterpret_cast<const float4*>(oth) + warp * NT * 32 + lane;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if ((t & 7) == 0) asm volatile("" ::: "memory");  // at most 8 loads in flight: no spills at D = 256
                fa_merge_acc(acc[t], __ldcg(oth4 + 32 * t), r);
            }
        }
    }
    // ---- normalize and write the two rows of this thread
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    const float inv_a = l_a > 0.f ? 1.f / l_a : 0.f, inv_b = l_b > 0.f ? 1.f / l_b : 0.f;
    size_t ra = (size_t)ia * qstride + (size_t)h * D + 2 * t4, rb = (size_t)ib * qstride + (size_t)h * D + 2 * t4;
    asm volatile("" : "+l"(ra), "+l"(rb));     // computed here, not kept live through the split merge (D = 256 spills)
    u16* oa = o + ra;
    u16* ob = o + rb;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (ia < n) *reinterpret_cast<u32*>(oa + 8 * t) = fa_pack(acc[t][0] * inv_a, acc[t][1] * inv_a);
        if (ib < n) *reinterpret_cast<u32*>(ob + 8 * t) = fa_pack(acc[t][2] * inv_b, acc[t][3] * inv_b);
    }
}
