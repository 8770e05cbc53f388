// Dequantize q4_K (QT=4) or q6_K (QT=6) weight rows [od, id] to fp16 [od, id] (row-major), for the
// cuBLAS fp16 baselines. Values are computed in float32 with gguf-py's operation order
// ((d*sc)*q for q6_K, (d*sc)*q - dmin*m for q4_K) and rounded to fp16 (nearest even).
// STRIDE = bytes per block (0 = the type's natural 144 / 210; 224 = padded q6_K).
// One thread per (row, 32-element chunk); grid = ceil(od * id/32 / 256).
#include "common.cuh"

template <int QT, int STRIDE>
__global__ void __launch_bounds__(256) dequant_f16_kernel(const u8* __restrict__ W, u16* __restrict__ out, int od,
                                                           int id) {
    constexpr int BS = STRIDE ? STRIDE : (QT == 4 ? 144 : 210);
    const int nchunk = id >> 5, nsb = id >> 8;
    const long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (long long)od * nchunk) return;
    const int j = (int)(x / nchunk), c = (int)(x % nchunk);
    const u8* blk = W + (size_t)j * nsb * BS + (size_t)(c >> 3) * BS;
    const int cc = c & 7;
    u16* o = out + (size_t)j * id + (size_t)c * 32;
    if (QT == 6) {
        const float d = lk_h2f(*(const u16*)(blk + 208));
        const float ds0 = d * (float)(s8)blk[192 + 2 * cc], ds1 = d * (float)(s8)blk[192 + 2 * cc + 1];
        const int it = cc >> 2;
        for (int m = 0; m < 32; m++) {
            const int q = lk_q6k_codes<int>(blk[it * 64 + (cc & 1) * 32 + m], blk[128 + it * 32 + m], cc) - 32;
            o[m] = lk_f2h((m < 16 ? ds0 : ds1) * (float)q);
        }
    } else {
        const float d = lk_h2f(*(const u16*)blk), dmin = lk_h2f(*(const u16*)(blk + 2));
        int sc, mn;
        lk_q4k_scale_min(blk + 4, cc, sc, mn);
        const float dl = d * (float)sc, ml = dmin * (float)mn;
        for (int m = 0; m < 32; m++) {
            const int v = (blk[16 + (cc >> 1) * 32 + m] >> (4 * (cc & 1))) & 0xF;
            o[m] = lk_f2h(dl * (float)v - ml);
        }
    }
}
