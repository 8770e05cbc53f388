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
        lk_stage_a<KDR>(buf, buf + O_SDA, qa8g, sdag, kt, nchunk, tid);
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

    lk_acc_t acc;
    lk_acc_zero(acc);

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
                int sc, mn;
                lk_q4k_scale_min(h + 4, cbase + kd, sc, mn);
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
            const lk_bscales S = lk_b_scales(sds, kd, warp, t4);
#pragma unroll
            for (int m = 0; m < 4; m++) {
                LK_A_LOAD(a, dw, da0, da1, qa8, sda, kd, m, lane, g)
                const float ds0 = da0 * (float)(short)(dw.x >> 16), ds1 = da1 * (float)(short)(dw.y >> 16);
#pragma unroll
                for (int nh = 0; nh < 2; nh++) {
                    int c[4] = {LK_MAGIC_I, LK_MAGIC_I, LK_MAGIC_I, LK_MAGIC_I};
                    lk_mma_16832(c, a[0], a[1], a[2], a[3], b[nh][0], b[nh][1]);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float dsc = (i & 1) ? S.v[nh].z : S.v[nh].x;
                        const float dmm = (i & 1) ? S.v[nh].w : S.v[nh].y;
                        const float da = (i >> 1) ? da1 : da0, dsum = (i >> 1) ? ds1 : ds0;
                        const float tq = fmaf(__int_as_float(c[i]), dsc, -LK_MAGIC_F * dsc);
                        acc[m][nh][i] = fmaf(tq, da, acc[m][nh][i]);
                        acc[m][nh][i] = fmaf(-dmm, dsum, acc[m][nh][i]);
                    }
                }
            }
        }
    }
    LK_TILE_STORE(acc, Y, blockIdx.x * LK_BM, j0, nt, od, warp, g, t4)
}
