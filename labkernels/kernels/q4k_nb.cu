// q4_K raw-nibble int8-mma GEMM (seeds 002 section 1: the r28-r34 skeleton). Y[nt, od] f32 =
//   A[nt, id] (q8_1 tile-ordered planes from the prepass) x W[od, id]^T (q4_K rows, 144 B blocks).
//
// Block tile 64 tokens x 128 rows, 256 threads (warp w: rows 16w..16w+15, all 64 tokens). Per k iteration
// KDR 32-element sub-blocks (KDR even: sub-blocks 2p and 2p+1 share the same 32 qs bytes, low/high nibble):
//   qa8  [KDR][64][32]  A codes (16-byte cp.async of the prepass planes), sda [KDR][64] d|sum words
//   qbn  [128][KDR*16]  B: the raw qs bytes, 16-byte cp.async straight from the weights (raw-byte
//                       streaming), swizzled; nibbles are unpacked in registers at mma time
//   hdr  [128][16]      each row's block header (d, dmin, 12 packed scale bytes), 16-byte cp.async
//   (all four double-buffered: iteration kt+1 is in flight while kt computes)
//   sds  [KDR][128]     float2 per (sub-block,row): (d*sc, dmin*m), unpacked from the header
// One mma.m16n8k32 per (32-sub-block, m16, n8): q4_K has one (scale, min) per 32 elements.
// Epilogue per sub-block, exact-magic form: the int32 accumulator starts at the 1.5*2^23 bits, so
//   t = fmaf(float_bits(C), d*sc, -1.5*2^23*d*sc) = sum*d*sc with one rounding (d*sc has <= 17 significant
//   bits, so 1.5*2^23*d*sc is exact), acc += t*da, acc -= (dmin*m)*(da*sum_a)  (the q8_1 sum term).
#include "tile.cuh"

template <int KDR>
__global__ void __launch_bounds__(LK_THREADS, 2)
q4k_nb_kernel(const u8* __restrict__ W, const u8* __restrict__ qa8g, const u32* __restrict__ sdag,
              float* __restrict__ Y, int nt, int od, int id) {
    static_assert(KDR == 2 || KDR == 4 || KDR == 8, "KDR must be 2, 4 or 8 (nibble pairs)");
    constexpr int R16 = KDR;  // 16-byte columns per qbn row
    // one pipeline buffer: qa8 [KDR][64][32] | sda [KDR][64] | qbn [128][KDR*16] | hdr [128][16]
    constexpr int O_SDA = KDR * LK_BM * 32, O_QBN = O_SDA + KDR * LK_BM * 4, O_HDR = O_QBN + LK_BN * KDR * 16;
    constexpr int BUF = O_HDR + LK_BN * 16;
    extern __shared__ __align__(16) u8 lk_smem[];
    float2* sds = (float2*)(lk_smem + 2 * BUF);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int nchunk = id >> 5, nsb = id >> 8, nkt = nchunk / KDR;
    const int j0 = blockIdx.y * LK_BN;
    const size_t rowbytes = (size_t)nsb * 144;

    auto issue = [&](int kt) {  // everything iteration kt needs, as 16-byte cp.async, into buffer kt&1
        u8* buf = lk_smem + (kt & 1) * BUF;
        const size_t qbase = ((size_t)blockIdx.x * nchunk + (size_t)kt * KDR) * (LK_BM * 32);
#pragma unroll
        for (int i = 0; i < (KDR * LK_BM * 32 / 16 + LK_THREADS - 1) / LK_THREADS; i++) {
            const int off = tid + i * LK_THREADS;
            if (off < KDR * LK_BM * 32 / 16) lk_cp_async16(buf + off * 16, qa8g + qbase + (size_t)off * 16);
        }
        const size_t sbase = ((size_t)blockIdx.x * nchunk + (size_t)kt * KDR) * LK_BM;
        if (tid < KDR * LK_BM / 4) lk_cp_async16(buf + O_SDA + tid * 16, sdag + sbase + (size_t)tid * 4);
        const int sb = (kt * KDR) >> 3, cbase = (kt * KDR) & 7;
        // raw qs bytes of the KDR sub-blocks (KDR/2 nibble pairs of 32 bytes) + the 16-byte block header
#pragma unroll
        for (int i = 0; i < (LK_BN * (KDR + 1) + LK_THREADS - 1) / LK_THREADS; i++) {
            const int x = tid + i * LK_THREADS;
            if (x < LK_BN * (KDR + 1)) {
                const int jj = x / (KDR + 1), col = x % (KDR + 1), j = j0 + jj;
                u8* dst = col < KDR ? buf + O_QBN + lk_swz<R16>(jj, col * 16) : buf + O_HDR + jj * 16;
                const u8* blk = W + (size_t)j * rowbytes + (size_t)sb * 144;
                if (j < od)
                    lk_cp_async16(dst, col < KDR ? blk + 16 + (cbase >> 1) * 32 + col * 16 : blk);
                else
                    *(uint4*)dst = make_uint4(0, 0, 0, 0);
            }
        }
        lk_cp_async_commit();
    };

    float acc[4][2][4];
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int nh = 0; nh < 2; nh++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][nh][i] = 0.f;

    issue(0);
    for (int kt = 0; kt < nkt; kt++) {
        __syncthreads();  // compute(kt-1) is done with sds and buffer (kt+1)&1
        if (kt + 1 < nkt) {
            issue(kt + 1);
            lk_cp_async_wait_group<1>();
        } else {
            lk_cp_async_wait_group<0>();
        }
        __syncthreads();  // buffer kt landed for every thread
        const u8* buf = lk_smem + (kt & 1) * BUF;
        const int cbase = (kt * KDR) & 7;
        // (sub-block, row) scales from the 12 packed bytes: (d*sc, dmin*m)
#pragma unroll
        for (int i = 0; i < (LK_BN * KDR + LK_THREADS - 1) / LK_THREADS; i++) {
            const int s = tid + i * LK_THREADS;
            if (s < LK_BN * KDR) {
                const int kd = s / LK_BN, jj = s % LK_BN;
                const u8* h = buf + O_HDR + jj * 16;
                const float d = lk_h2f(*(const u16*)h), dmin = lk_h2f(*(const u16*)(h + 2));
                const u8* q = h + 4;
                const int sub = cbase + kd;
                int sc, mn;
                if (sub < 4) {
                    sc = q[sub] & 63;
                    mn = q[sub + 4] & 63;
                } else {
                    sc = (q[sub + 4] & 0xF) | ((q[sub - 4] >> 6) << 4);
                    mn = (q[sub + 4] >> 4) | ((q[sub] >> 6) << 4);
                }
                sds[s] = make_float2(d * (float)sc, dmin * (float)mn);
            }
        }
        __syncthreads();
        const u8* qa8 = buf;
        const u32* sda = (const u32*)(buf + O_SDA);
        const u8* qbn = buf + O_QBN;
#pragma unroll
        for (int kd = 0; kd < KDR; kd++) {
            const int pp = kd >> 1, hn = kd & 1;
            u32 b[2][2];
#pragma unroll
            for (int nh = 0; nh < 2; nh++) {
                const int jj = warp * 16 + nh * 8 + g;
                const u32 q0 = *(const u32*)(qbn + lk_swz<R16>(jj, pp * 32 + 4 * t4));
                const u32 q1 = *(const u32*)(qbn + lk_swz<R16>(jj, pp * 32 + 16 + 4 * t4));
                b[nh][0] = (q0 >> (4 * hn)) & 0x0F0F0F0Fu;
                b[nh][1] = (q1 >> (4 * hn)) & 0x0F0F0F0Fu;
            }
            float4 sc[2];
#pragma unroll
            for (int nh = 0; nh < 2; nh++)
                sc[nh] = *(const float4*)(sds + kd * LK_BN + warp * 16 + nh * 8 + 2 * t4);
#pragma unroll
            for (int m = 0; m < 4; m++) {
                u32 a[4];
                const int tok = m * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
                lk_ldmatrix_x4(a, qa8 + kd * LK_BM * 32 + tok * 32 + (((lane >> 4) ^ ((tok >> 2) & 1)) << 4));
                const uint2 dw = *(const uint2*)(sda + kd * LK_BM + m * 16 + 2 * g);
                const float da0 = lk_h2f((u16)(dw.x & 0xFFFF)), da1 = lk_h2f((u16)(dw.y & 0xFFFF));
                const float ds0 = da0 * (float)(short)(dw.x >> 16), ds1 = da1 * (float)(short)(dw.y >> 16);
#pragma unroll
                for (int nh = 0; nh < 2; nh++) {
                    int c[4] = {LK_MAGIC_I, LK_MAGIC_I, LK_MAGIC_I, LK_MAGIC_I};
                    lk_mma_16832(c, a[0], a[1], a[2], a[3], b[nh][0], b[nh][1]);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float dsc = (i & 1) ? sc[nh].z : sc[nh].x;
                        const float dmm = (i & 1) ? sc[nh].w : sc[nh].y;
                        const float da = (i >> 1) ? da1 : da0, dsum = (i >> 1) ? ds1 : ds0;
                        const float tq = fmaf(__int_as_float(c[i]), dsc, -LK_MAGIC_F * dsc);
                        acc[m][nh][i] = fmaf(tq, da, acc[m][nh][i]);
                        acc[m][nh][i] = fmaf(-dmm, dsum, acc[m][nh][i]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int nh = 0; nh < 2; nh++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int t = blockIdx.x * LK_BM + m * 16 + g + 8 * (i >> 1);
                const int j = j0 + warp * 16 + nh * 8 + 2 * t4 + (i & 1);
                if (t < nt && j < od) Y[(size_t)t * od + j] = acc[m][nh][i];
            }
}
