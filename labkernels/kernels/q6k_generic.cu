// The generic q6_K int8-mma GEMM: "the old road" of seeds 000 section 3.2 (mmq_nt<7,2>), kept as the
// baseline every q6_K speedup is measured against. Y[nt, od] f32 = A (ggml block_q8_1 rows) x W^T.
//
// What makes it the old road (each is a lever a later kernel pulls):
//  - A side is staged from ggml's plain block_q8_1 rows (36-byte blocks) with a per-chunk reshuffle into
//    a [token][KD*32] plane, word by word - no prepass transpose, no 16-byte bulk copy;
//  - B is re-derived from the raw q6_K blocks for every tile: per 16-element sub-block the 4 words of
//    (ql nibble | qh 2 bits << 4) - 32 are assembled with SIMD word ops (mmq_stage_b<7>), and each row
//    also stages two scale planes ds/ds1 = d*sc;
//  - fragments are read with plain 32-bit shared loads (no ldmatrix), planes unpadded/unswizzled;
//  - KSPLIT=2: two mma.m16n8k16 per 32-chunk, int32 -> float (I2F) epilogue per sub-block.
// Tile 64 tokens x 128 rows, 256 threads, KD=4 chunks per iteration, single-buffered.
#include "tile.cuh"

#define LK_GEN_KD 4

template <int STRIDE>
__global__ void __launch_bounds__(LK_THREADS)
q6k_generic_kernel(const u8* __restrict__ W, const u8* __restrict__ Aq8_1, float* __restrict__ Y, int nt,
                   int od, int id) {
    constexpr int KD = LK_GEN_KD;
    constexpr int WS = KD * 8;  // words per row
    extern __shared__ __align__(16) u8 lk_smem[];
    int* qa = (int*)lk_smem;                                  // [BM][WS]
    int* qb = qa + LK_BM * WS;                                // [BN][WS]
    float* sda = (float*)(qb + LK_BN * WS);                   // [KD][BM]
    float* ds = sda + KD * LK_BM;                             // [KD][BN]
    float* ds1 = ds + KD * LK_BN;                             // [KD][BN]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int nchunk = id >> 5, nsb = id >> 8;
    const int i0 = blockIdx.x * LK_BM, j0 = blockIdx.y * LK_BN;
    const size_t rowbytes = (size_t)nsb * STRIDE;

    lk_acc_t acc;
    lk_acc_zero(acc);

    for (int kt = 0; kt < nchunk / KD; kt++) {
        __syncthreads();
        // ---- A: per-chunk reshuffle out of the 36-byte block_q8_1 rows
        for (int x = tid; x < LK_BM * WS; x += LK_THREADS) {
            const int r = x / WS, w = x % WS, kd = w >> 3;
            const int t = i0 + r;
            int v = 0;
            if (t < nt) v = *(const int*)(Aq8_1 + ((size_t)t * nchunk + kt * KD + kd) * 36 + 4 + 4 * (w & 7));
            qa[r * WS + w] = v;
        }
        for (int x = tid; x < LK_BM * KD; x += LK_THREADS) {
            const int kd = x / LK_BM, r = x % LK_BM;
            const int t = i0 + r;
            sda[kd * LK_BM + r] = t < nt ? lk_h2f(*(const u16*)(Aq8_1 + ((size_t)t * nchunk + kt * KD + kd) * 36)) : 0.f;
        }
        // ---- B: mmq_stage_b<7>: per (row, chunk, half) one 16-element sub-block = 4 words
        for (int x = tid; x < LK_BN * KD * 2; x += LK_THREADS) {
            const int r = x / (KD * 2), rem = x % (KD * 2), kd = rem >> 1, half = rem & 1;
            const int j = j0 + r;
            const int c = kt * KD + kd;                  // global chunk
            const int sbk = c >> 3;
            const int s = (2 * (c & 7) + half) & 15;      // 16-sub-block inside the super-block
            const int chunk = s >> 3, gq = (s >> 1) & 3, is = s & 1;
            if (j < od) {
                const u8* blk = W + (size_t)j * rowbytes + (size_t)sbk * STRIDE;
                const u8* ql = blk + chunk * 64 + (gq & 1) * 32 + is * 16;
                const u8* qh = blk + 128 + chunk * 32 + is * 16;
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    const u32 QL = (u32)ql[4 * w] | ((u32)ql[4 * w + 1] << 8) | ((u32)ql[4 * w + 2] << 16) |
                                   ((u32)ql[4 * w + 3] << 24);
                    const u32 QH = (u32)qh[4 * w] | ((u32)qh[4 * w + 1] << 8) | ((u32)qh[4 * w + 2] << 16) |
                                   ((u32)qh[4 * w + 3] << 24);
                    const u32 nib = (gq < 2) ? (QL & 0x0F0F0F0Fu) : ((QL >> 4) & 0x0F0F0F0Fu);
                    const u32 hi = ((QH >> (2 * gq)) & 0x03030303u) << 4;
                    qb[r * WS + kd * 8 + half * 4 + w] = __vsubss4((int)(nib | hi), 0x20202020);
                }
                if (half == 0) {
                    const float d = lk_h2f(*(const u16*)(blk + 208));
                    ds[kd * LK_BN + r] = d * (float)(s8)blk[192 + (2 * c) % 16];
                    ds1[kd * LK_BN + r] = d * (float)(s8)blk[192 + (2 * c + 1) % 16];
                }
            } else {
#pragma unroll
                for (int w = 0; w < 4; w++) qb[r * WS + kd * 8 + half * 4 + w] = 0;
                if (half == 0) ds[kd * LK_BN + r] = 0.f, ds1[kd * LK_BN + r] = 0.f;
            }
        }
        __syncthreads();
        // ---- compute
#pragma unroll
        for (int kd = 0; kd < KD; kd++) {
            int b[2][2];
#pragma unroll
            for (int nh = 0; nh < 2; nh++) {
                const int r = warp * 16 + nh * 8 + g;
                b[nh][0] = qb[r * WS + kd * 8 + t4];
                b[nh][1] = qb[r * WS + kd * 8 + 4 + t4];
            }
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const int r0 = m * 16 + g, r1 = r0 + 8;
                const u32 a0 = qa[r0 * WS + kd * 8 + t4], a1 = qa[r1 * WS + kd * 8 + t4];
                const u32 a2 = qa[r0 * WS + kd * 8 + 4 + t4], a3 = qa[r1 * WS + kd * 8 + 4 + t4];
                const float da0 = sda[kd * LK_BM + r0], da1 = sda[kd * LK_BM + r1];
#pragma unroll
                for (int nh = 0; nh < 2; nh++) {
                    int clo[4] = {0, 0, 0, 0}, chi[4] = {0, 0, 0, 0};
                    lk_mma_16816(clo, a0, a1, (u32)b[nh][0]);
                    lk_mma_16816(chi, a2, a3, (u32)b[nh][1]);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int r = warp * 16 + nh * 8 + 2 * t4 + (i & 1);
                        const float da = (i >> 1) ? da1 : da0;
                        acc[m][nh][i] += (da * ds[kd * LK_BN + r]) * (float)clo[i];
                        acc[m][nh][i] += (da * ds1[kd * LK_BN + r]) * (float)chi[i];
                    }
                }
            }
        }
    }
    LK_TILE_STORE(acc, Y, i0, j0, nt, od, warp, g, t4)
}
