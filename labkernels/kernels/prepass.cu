// Activation prepass: f32 (F16=0) or f16 (F16=1) activations [nt, id] -> q8_1 (ggml's quantize_row_q8_1:
// per 32 values d = amax/127, q = roundf(x * (1/d)), sum term), bit-identical to labkernels.quantize_ref.
#include "tile.cuh"

template <int F16>
__device__ __forceinline__ float lk_load_act(const void* x, long long i) {
    if (F16) return lk_h2f(((const u16*)x)[i]);
    return ((const float*)x)[i];
}

// One warp per (token, 32-chunk): returns this lane's code, and d / the integer sum (all lanes).
template <int F16>
__device__ __forceinline__ int lk_q8_1_lane(const void* x, int t, int nt, int id, int c, float& d, int& sum) {
    const int lane = threadIdx.x & 31;
    float v = 0.f;
    if (t < nt) v = lk_load_act<F16>(x, (long long)t * id + c * 32 + lane);
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    d = amax / 127.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(v * inv);
    sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    return q;
}

// Tile-ordered planes for the GEMM kernels (seeds' r34 quantize-transpose prepass):
//   qa8g [ntile][nchunk][64 tokens][32 B]: token p's two 16-byte halves stored swapped when (p>>2)&1,
//        so the kernels' ldmatrix row reads are bank-conflict free and staging is a plain 16 B copy;
//   sdag [ntile][nchunk][64] u32 = d (f16 bits) | (int16 sum of codes) << 16, in the order
//        m*16 + g*2 + h for token p = m*16 + h*8 + g (the pair a thread needs is one 8-byte load).
// Tokens nt..ntile*64-1 are written as zeros. Grid: ntile*64*nchunk/8 blocks of 256 threads.
template <int F16>
__global__ void __launch_bounds__(LK_THREADS) prepass_q8_1_tiles(const void* __restrict__ x, u8* __restrict__ qa8g,
                                                            u32* __restrict__ sdag, int nt, int id) {
    const int nchunk = id >> 5;
    const long long wg = (long long)blockIdx.x * (LK_THREADS / 32) + (threadIdx.x >> 5);
    const int t = (int)(wg / nchunk), c = (int)(wg % nchunk);
    const int lane = threadIdx.x & 31;
    float d;
    int sum;
    const int q = lk_q8_1_lane<F16>(x, t, nt, id, c, d, sum);
    const int tile = t >> 6, p = t & 63;
    const long long base = (long long)tile * nchunk + c;
    const int half = lane >> 4;
    qa8g[(base * LK_BM + p) * 32 + ((half ^ ((p >> 2) & 1)) << 4) + (lane & 15)] = (u8)(s8)q;
    if (lane == 0) {
        const int idx = (p >> 4) * 16 + (p & 7) * 2 + ((p >> 3) & 1);
        sdag[base * LK_BM + idx] = (u32)lk_f2h(d) | ((u32)(sum & 0xFFFF) << 16);
    }
}

// ggml's block_q8_1 rows [nt][id/32] x 36 B: half d, half s = d*sum (fp16), int8 qs[32].
// Grid: nt*nchunk/8 blocks of 256 threads.
template <int F16>
__global__ void __launch_bounds__(LK_THREADS) quantize_q8_1_rows(const void* __restrict__ x, u8* __restrict__ out,
                                                            int nt, int id) {
    const int nchunk = id >> 5;
    const long long wg = (long long)blockIdx.x * (LK_THREADS / 32) + (threadIdx.x >> 5);
    if (wg >= (long long)nt * nchunk) return;
    const int t = (int)(wg / nchunk), c = (int)(wg % nchunk);
    const int lane = threadIdx.x & 31;
    float d;
    int sum;
    const int q = lk_q8_1_lane<F16>(x, t, nt, id, c, d, sum);
    u8* blk = out + ((long long)t * nchunk + c) * 36;
    blk[4 + lane] = (u8)(s8)q;
    if (lane == 0) {
        *(u16*)(blk) = lk_f2h(d);
        *(u16*)(blk + 2) = lk_f2h(d * (float)sum);
    }
}
