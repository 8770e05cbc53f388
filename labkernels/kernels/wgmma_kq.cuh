// Round 7: a Hopper-native q4_K / q6_K GEMM (sm_90a) -- the device code of the production kernels (wgmma_kq.cu
// instantiates them; labkernels.kernels.registry lists every instantiation).
//
//   Y[nt, od] (f32) = X[nt, id] (f16 | bf16) * W[od, id]^T (q4_K | q6_K, repacked, same bits per weight)
//
// * wgmma.mma_async m64nBNk16 with f32 accumulators; the weight tile is the M operand, dequantized from the
//   raw k-quant bits to f16/bf16 in registers (register-A form): per sub-block scale (and q4_K's min) folded
//   into the weight, so there is no per-k epilogue at all (round 6: ~21 issue slots per IMMA went there).
// * activations are the B operand: [BN tokens x 64 k] tiles, 128-byte swizzled, loaded by TMA
//   (cp.async.bulk.tensor) into a STAGES-deep ring with full/empty mbarriers.
// * warp specialization: warpgroup 0 is the producer (one thread issues TMA; setmaxnreg.dec), warpgroups 1-2
//   are consumers (64 weight rows each; setmaxnreg.inc): 384 threads, one CTA per SM.
// * weight layout (labkernels.wgmma.repack): q4_K keeps its 144-byte blocks, the 128 nibble bytes permuted
//   so that lane c of a row's 4 lanes reads its 32 bytes contiguously and every 32-bit word unpacks into
//   4 A-fragment registers with one lop3 each; q6_K becomes 4 planes (low nibbles 128 B, high 2-bit 64 B,
//   int8 scales 16 B, fp16 d 2 B per block) with the same 210 bytes per 256 weights.
//
// Fragment layout (PTX ISA, wgmma register A, m64k16, 16-bit types): warp w of the warpgroup owns rows
// 16w..16w+15; lane (g = lane/4, c = lane%4) holds a0 = (row g, k 2c..2c+1), a1 = (row g+8, k 2c..2c+1),
// a2 = (row g, k 2c+8..2c+9), a3 = (row g+8, k 2c+8..2c+9), low half = lower k.
// Accumulator (m64nN, f32): d[4j+0..1] = (row g, n 8j+2c..+1), d[4j+2..3] = (row g+8, n 8j+2c..+1).
//
// The bodies take a build policy P (below): production instantiates LkPlain, whose hooks are all off. Round 7's
// ablation and trace builds are policies of their own, in the round's source of exploratory builds
// (labkernels/rounds/r07_wgmma/kernels/wgmma_kq_experiments.cu, which includes this file): the hooks are selected
// with if constexpr, so LkPlain's instantiations are the plain kernel's code and nothing else.
#include "common.cuh"
#include "wgmma_ops.cuh"

#ifndef LK_WG_M
#define LK_WG_M 128  // weight rows per CTA: two consumer warpgroups x 64
#endif
#define LK_WG_K 64   // k per pipeline stage: one 128-byte swizzle row of 16-bit activations
#define LK_WG_THREADS 384

// ---- the build policy: what an ablation or trace build changes, each hook off in production (LkPlain)
struct LkPlain {
    static constexpr bool TRACE = false;    // stamp() records per-CTA phase times (a trace build)
    static constexpr bool LOADS = true;     // the loop loads each super-block's weights (off: reconverts the first)
    static constexpr bool CONVERT = true;   // ... and converts each chunk (off: A keeps what it holds; timing only)
    static constexpr bool FIXUP = true;     // split tiles' partial sums written and folded in (off: timing only)
    static constexpr bool STORE = true;     // Y stored (off: timing only)
    __device__ __forceinline__ static void stamp(int) {}   // phase ev of the CTA (see the trace build)
};

struct __align__(64) LkTmap {  // CUtensorMap: 128 opaque bytes, passed by value as a __grid_constant__
    u64 w[16];
};

__device__ __forceinline__ u32 lk_smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// ---- mbarriers (CTA scope) ----
__device__ __forceinline__ void lk_mbar_init(u64* bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(lk_smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void lk_mbar_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(lk_smem_u32(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void lk_mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(lk_smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void lk_mbar_wait(u64* bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(lk_smem_u32(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}

// ---- TMA: one 2-D box [c1 .. c1+box1) x [c0 .. c0+box0) into shared memory, completing on an mbarrier ----
__device__ __forceinline__ void lk_tma_load_2d(void* dst, const LkTmap* tm, int c0, int c1, u64* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            lk_smem_u32(dst)),
        "l"((u64)tm), "r"(c0), "r"(c1), "r"(lk_smem_u32(bar))
        : "memory");
}

// ---- wgmma plumbing ----
__device__ __forceinline__ void lk_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void lk_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void lk_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// keep A-fragment registers alive (unreused) until the wgmma group that reads them has retired
__device__ __forceinline__ void lk_keep(u32 (&a)[4][4]) {
#pragma unroll
    for (int s = 0; s < 4; s++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" : "+r"(a[s][i])::"memory");
}

// AQ=4: a real (never executed: ``never`` is false at run time) use of a retired A set after the wait that
// retired it, so ptxas keeps the set in its own registers up to there and cannot give the next chunk's
// conversion the same registers (which forces that conversion below the wait)
__device__ __forceinline__ void lk_hold(const u32 (&a)[4][4], u32 never) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.u32 p, %16, 0;\n"
        "@p st.shared.v4.b32 [%16], {%0, %1, %2, %3};\n@p st.shared.v4.b32 [%16], {%4, %5, %6, %7};\n"
        "@p st.shared.v4.b32 [%16], {%8, %9, %10, %11};\n@p st.shared.v4.b32 [%16], {%12, %13, %14, %15};\n}\n" ::"r"(
            a[0][0]),
        "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]), "r"(a[1][2]), "r"(a[1][3]), "r"(a[2][0]),
        "r"(a[2][1]), "r"(a[2][2]), "r"(a[2][3]), "r"(a[3][0]), "r"(a[3][1]), "r"(a[3][2]), "r"(a[3][3]), "r"(never)
        : "memory");
}

// K-major B tile of 64 16-bit k (128 bytes) per token row, 128-byte swizzle: 8-row core groups 1024 B apart
__device__ __forceinline__ u64 lk_desc_sw128(u32 saddr) {
    return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

template <int BN, int BF16>
__device__ __forceinline__ void lk_wgmma(float (&d)[BN / 2], const u32 (&a)[4], u64 desc) {
    if constexpr (BF16) {
        if constexpr (BN == 64) lk_wgmma_m64n64k16_bf16_rs(d, a[0], a[1], a[2], a[3], desc, 1);
        if constexpr (BN == 128) lk_wgmma_m64n128k16_bf16_rs(d, a[0], a[1], a[2], a[3], desc, 1);
        if constexpr (BN == 192) lk_wgmma_m64n192k16_bf16_rs(d, a[0], a[1], a[2], a[3], desc, 1);
        if constexpr (BN == 256) lk_wgmma_m64n256k16_bf16_rs(d, a[0], a[1], a[2], a[3], desc, 1);
    } else {
        if constexpr (BN == 64) lk_wgmma_m64n64k16_f16_rs(d, a[0], a[1], a[2], a[3], desc, 1);
        if constexpr (BN == 128) lk_wgmma_m64n128k16_f16_rs(d, a[0], a[1], a[2], a[3], desc, 1);
        if constexpr (BN == 192) lk_wgmma_m64n192k16_f16_rs(d, a[0], a[1], a[2], a[3], desc, 1);
        if constexpr (BN == 256) lk_wgmma_m64n256k16_f16_rs(d, a[0], a[1], a[2], a[3], desc, 1);
    }
}

// ---- 16-bit pair arithmetic (f16x2 / bf16x2) without cuda_fp16.h ----
template <int BF16>
__device__ __forceinline__ u32 lk_sub2(u32 a, u32 b) {
    u32 d;
    if constexpr (BF16) asm("sub.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    else asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
template <int BF16>
__device__ __forceinline__ u32 lk_fma2(u32 a, u32 b, u32 c) {
    u32 d;
    if constexpr (BF16) asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    else asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
template <int BF16>
__device__ __forceinline__ u32 lk_mul2(u32 a, u32 b) {
    u32 d;
    if constexpr (BF16) asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    else asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
// one float, rounded once, in both halves
template <int BF16>
__device__ __forceinline__ u32 lk_bcast2(float f) {
    u32 d;
    if constexpr (BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %1;\n" : "=r"(d) : "f"(f));
    else asm("cvt.rn.f16x2.f32 %0, %1, %1;\n" : "=r"(d) : "f"(f));
    return d;
}
__device__ __forceinline__ u32 lk_lop_or_and(u32 a, u32 mask, u32 orv) {  // (a & mask) | orv: one LOP3
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(mask), "r"(orv));
    return d;
}
__device__ __forceinline__ u32 lk_lop_or_or_and(u32 a, u32 b, u32 mask) {  // a | (b & mask): one LOP3
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xF8;\n" : "=r"(d) : "r"(a), "r"(b), "r"(mask));
    return d;
}
// magic exponent that turns a small unsigned integer in the low mantissa bits into (bias + q), and the bias
template <int BF16>
struct LkMagic {
    static constexpr u32 OR = BF16 ? 0x43004300u : 0x64006400u;    // 128.0 | 1024.0 in both halves
    static constexpr u32 Q4 = BF16 ? 0x43004300u : 0x64006400u;    // subtract 128 | 1024: q in 0..15
    static constexpr u32 Q6 = BF16 ? 0x43204320u : 0x64206420u;    // subtract 160 | 1056: q - 32
};

// ---- q4_K: a 144-byte block, header kept, nibble bytes permuted (labkernels.wgmma.repack) ----
// lane c's 32 bytes at 16 + 32c: word (j, h) = bytes [b(32j+16h+2c), b(..+8), b(..+1), b(..+9)] of the GGUF qs
struct Q4Raw {
    uint4 hdr, qa, qb;  // d|dmin, scales[12]; words (j=0,h=0..1),(j=1,..); words (j=2..3)
};
__device__ __forceinline__ void q4_load(Q4Raw& r, const u8* blk, int c) {
    r.hdr = __ldg((const uint4*)blk);
    r.qa = __ldg((const uint4*)(blk + 16 + 32 * c));
    r.qb = __ldg((const uint4*)(blk + 32 + 32 * c));
}
__device__ __forceinline__ u32 q4_word(const Q4Raw& r, int j, int h) {
    const uint4& v = j < 2 ? r.qa : r.qb;
    const int i = (j & 1) * 2 + h;
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
// 6-bit scale and min of sub-block is (0..7), as in ggml's get_scale_min_k4, from the header words
__device__ __forceinline__ void q4_scale_min(const uint4& h, int is, u32& sc, u32& mn) {
    const int b = 8 * (is & 3);   // both forms, then a select: no branch when is is not a compile-time constant
    const u32 y = h.y >> b, z = h.z >> b, w = h.w >> b;
    const u32 low = 0u - (u32)(is < 4);   // all ones for sub-blocks 0..3 (a mask, not a branch: a branch inside
                                           // the wgmma pipeline makes ptxas serialize it, warning C7515)
    sc = ((y & 63) & low) | (((w & 0xF) | ((y >> 6 & 3) << 4)) & ~low);
    mn = ((z & 63) & low) | (((w >> 4 & 0xF) | ((z >> 6 & 3) << 4)) & ~low);
}
// scale (d*sc) and negated min (-dmin*m) of chunk j's two sub-blocks (2j: low nibbles, 2j+1: high), as 16-bit pairs
struct Q4Scales {
    u32 s[2], z[2];
};
template <int BF16>
__device__ __forceinline__ Q4Scales q4_scales(const Q4Raw& r, int j) {
    const float d = lk_h2f((u16)(r.hdr.x & 0xFFFF)), dmin = lk_h2f((u16)(r.hdr.x >> 16));
    Q4Scales o;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        u32 sc, mn;
        q4_scale_min(r.hdr, 2 * j + half, sc, mn);
        o.s[half] = lk_bcast2<BF16>(d * (float)sc);
        o.z[half] = lk_bcast2<BF16>(-(dmin * (float)mn));
    }
    return o;
}
// f16 (the SCL=0 path): the same pairs in 16-bit arithmetic. Sub-blocks 2j and 2j+1's 6-bit scales (mins) go into
// the two halves of one word (byte permutes of the header words; ggml's two forms, is < 4 and is >= 4), become f16
// by the magic exponent (1024 + v, exact), and one f16x2 multiply by (d, d) / (-dmin, -dmin) gives both sub-blocks'
// values: RNE(d * sc) of the exact product, as the fp32 path's exact product rounded once by cvt.rn -- bitwise the
// same pairs, in ~10 instructions per row and chunk fewer (no int -> float conversions, no per-half extraction)
// the chunk's scale pairs as the fragments take them: each sub-block's value in both halves of a word
__device__ __forceinline__ Q4Scales q4_pairs(u32 sp, u32 zp) {
    Q4Scales o;
    o.s[0] = __byte_perm(sp, 0, 0x1010);
    o.s[1] = __byte_perm(sp, 0, 0x3232);
    o.z[0] = __byte_perm(zp, 0, 0x1010);
    o.z[1] = __byte_perm(zp, 0, 0x3232);
    return o;
}
__device__ __forceinline__ Q4Scales q4_scales_h(const uint4& h, int j) {
    const u32 b = j < 2 ? 2 * j : 2 * j - 4;            // header byte of sub-block 2j (is & 3), then 2j+1
    const u32 sel = b | ((b + 1) << 8) | 0x4040u;       // bytes b, b+1 into the low bytes of the two halves
    u32 scv, mnv;                                       // (1024 + sc) | (1024 + sc'), (1024 + m) | (1024 + m')
    if (j < 2) {
        scv = lk_lop_or_and(__byte_perm(h.y, 0, sel), 0x003F003Fu, 0x64006400u);
        mnv = lk_lop_or_and(__byte_perm(h.z, 0, sel), 0x003F003Fu, 0x64006400u);
    } else {   // low 4 bits from scales[8 + i], the top 2 from bits 6-7 of scales[i] (mins: [i + 4])
        const u32 wp = __byte_perm(h.w, 0, sel);
        scv = lk_lop_or_or_and(lk_lop_or_and(wp, 0x000F000Fu, 0x64006400u), __byte_perm(h.y, 0, sel) >> 2, 0x00300030u);
        mnv = lk_lop_or_or_and(lk_lop_or_and(wp >> 4, 0x000F000Fu, 0x64006400u), __byte_perm(h.z, 0, sel) >> 2,
                               0x00300030u);
    }
    const u32 dd = __byte_perm(h.x, 0, 0x1010), ndm = __byte_perm(h.x, 0, 0x3232) ^ 0x80008000u;
    return q4_pairs(lk_mul2<0>(lk_sub2<0>(scv, 0x64006400u), dd), lk_mul2<0>(lk_sub2<0>(mnv, 0x64006400u), ndm));
}
// SCL=1: lane c of a row's 4 lanes decodes chunk c's scales once per super-block; chunk j takes lane j's
__device__ __forceinline__ u32 lk_from_lane(u32 v, int j) {
    return __shfl_sync(0xffffffffu, v, (int)((threadIdx.x & 31) & ~3u) | j);
}
__device__ __forceinline__ Q4Scales q4_take(const Q4Scales& own, int j) {
    Q4Scales o;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        o.s[h] = lk_from_lane(own.s[h], j);
        o.z[h] = lk_from_lane(own.z[h], j);
    }
    return o;
}
// A fragments of chunk j (k 64j..64j+63 of the super-block) for one row: frag[s][0] = (k 2c..), [1] = (k 2c+8..)
template <int BF16>
__device__ __forceinline__ void q4_chunk(const Q4Raw& r, int j, const Q4Scales& sc, u32 (&frag)[4][2]) {
#pragma unroll
    for (int half = 0; half < 2; half++) {      // low nibbles: sub-block 2j, high nibbles: 2j+1
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int s = 2 * half + h;           // k16 step inside the chunk
            if (BF16 == 0 && half == 1) {
                // f16, high nibbles in place: (1024 + 16q) / 16 - 64 = q exactly, one FMA instead of two shifts and
                // a subtraction (bf16's 7-bit mantissa cannot hold 16q: it keeps the shifts)
                const u32 w = q4_word(r, j, h);
                frag[s][0] = lk_fma2<BF16>(lk_fma2<BF16>(lk_lop_or_and(w, 0x00F000F0u, 0x64006400u), 0x2C002C00u, 0xD400D400u),
                                           sc.s[half], sc.z[half]);
                frag[s][1] = lk_fma2<BF16>(lk_fma2<BF16>(lk_lop_or_and(w >> 8, 0x00F000F0u, 0x64006400u), 0x2C002C00u,
                                                         0xD400D400u), sc.s[half], sc.z[half]);
                continue;
            }
            const u32 w = q4_word(r, j, h) >> (4 * half);
            frag[s][0] = lk_fma2<BF16>(lk_sub2<BF16>(lk_lop_or_and(w, 0x000F000Fu, LkMagic<BF16>::OR), LkMagic<BF16>::Q4),
                                       sc.s[half], sc.z[half]);
            frag[s][1] = lk_fma2<BF16>(lk_sub2<BF16>(lk_lop_or_and(w >> 8, 0x000F000Fu, LkMagic<BF16>::OR), LkMagic<BF16>::Q4),
                                       sc.s[half], sc.z[half]);
        }
    }
}

// ---- q6_K: planes L (128 B/block: lane c's 32 B), H (64 B/block: lane c's 16 B), SC (16 B), D (2 B) ----
// L word (j, p): 4 bytes, byte (2c|2c+8|2c+1|2c+9 order) low nibble = step 2p, high nibble = step 2p+1
// H word j: 2-bit field f = 2 s + t (s = step in chunk, t = 0 for k 2c.., 1 for 2c+8..) at bit 2f (lower k)
// and 16 + 2f (upper k)
struct Q6Raw {
    uint4 la, lb, h, sc;  // L words (j=0..1 | j=2..3, p=0..1), H words j=0..3, int8 scales[16]
    u16 d;
};
__device__ __forceinline__ void q6_load(Q6Raw& r, const u8* L, const u8* H, const u8* SC, const u8* D, size_t blk,
                                        int c) {
    r.la = __ldg((const uint4*)(L + blk * 128 + 32 * c));
    r.lb = __ldg((const uint4*)(L + blk * 128 + 32 * c + 16));
    r.h = __ldg((const uint4*)(H + blk * 64 + 16 * c));
    r.sc = __ldg((const uint4*)(SC + blk * 16));
    r.d = __ldg((const u16*)(D + blk * 2));
}
// PF > 0: an L2 prefetch of a super-block's bytes ahead of its register loads (the weights stream from HBM once
// per token tile; round 7's stall counters, ncu run 20261202T005336Z, have q6_K's consumers waiting on these loads)
__device__ __forceinline__ void lk_prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"((u64)p));
}
__device__ __forceinline__ u32 lk_u4(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
// the 4 step scales d*sc[4j+s] of chunk j as 16-bit pairs
struct Q6Scales {
    u32 s[4];
};
template <int BF16>
__device__ __forceinline__ Q6Scales q6_scales(const Q6Raw& r, int j) {
    const float d = lk_h2f(r.d);
    const u32 scw = lk_u4(r.sc, j);
    Q6Scales o;
#pragma unroll
    for (int s = 0; s < 4; s++) o.s[s] = lk_bcast2<BF16>(d * (float)(int)(s8)(scw >> (8 * s)));
    return o;
}
// f16: the same pairs in 16-bit arithmetic -- two int8 scales per word (byte permutes), as f16 by the magic exponent
// ((s ^ 0x80) + 1024 = s + 1152, exact), times (d, d) in one f16x2 multiply: RNE(d * s) of the exact product, as the
// fp32 path's (11 x 8 bits: exact) rounded once by cvt.rn -- bitwise the same pairs
__device__ __forceinline__ Q6Scales q6_scales_h(const Q6Raw& r, int j) {
    const u32 scw = lk_u4(r.sc, j), dd = __byte_perm((u32)r.d, 0, 0x1010);
    Q6Scales o;
#pragma unroll
    for (int p = 0; p < 2; p++) {   // steps 2p, 2p+1
        u32 v;
        asm("lop3.b32 %0, %1, 0x00800080, 0x64006400, 0xBE;\n" : "=r"(v) : "r"(__byte_perm(scw, 0, p ? 0x4342u : 0x4140u)));
        const u32 sp = lk_mul2<0>(lk_sub2<0>(v, 0x64806480u), dd);   // (s ^ 0x80) | 0x6400 - 1152 = s
        o.s[2 * p] = __byte_perm(sp, 0, 0x1010);
        o.s[2 * p + 1] = __byte_perm(sp, 0, 0x3232);
    }
    return o;
}
__device__ __forceinline__ Q6Scales q6_take(const Q6Scales& own, int j) {
    Q6Scales o;
#pragma unroll
    for (int s = 0; s < 4; s++) o.s[s] = lk_from_lane(own.s[s], j);
    return o;
}
template <int BF16>
__device__ __forceinline__ void q6_chunk(const Q6Raw& r, int j, const Q6Scales& sc, u32 (&frag)[4][2]) {
    const u32 hw = lk_u4(r.h, j);
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const u32 lw = lk_u4(j < 2 ? r.la : r.lb, (j & 1) * 2 + (s >> 1)) >> (4 * (s & 1));
#pragma unroll
        for (int t = 0; t < 2; t++) {
            const int f = 2 * s + t;
            const u32 hs = (4 - 2 * f) >= 0 ? hw << (4 - 2 * f) : hw >> (2 * f - 4);
            const u32 lo = lk_lop_or_and(lw >> (8 * t), 0x000F000Fu, LkMagic<BF16>::OR);
            const u32 q = lk_lop_or_and(hs, 0x00300030u, lo);
            frag[s][t] = lk_mul2<BF16>(lk_sub2<BF16>(q, LkMagic<BF16>::Q6), sc.s[s]);
        }
    }
}
// P::LOADS off (an ablation build, timing only): the loop loads no weight bytes -- each super-block converts the
// segment's first super-block's registers again, made opaque to the compiler at every super-block (lk_opaque) so
// that the conversion is neither hoisted nor folded. With P::CONVERT off as well (no conversion, whose loads ptxas
// then drops as dead) it splits what the weights cost the loop into their loads and their conversion.
template <class T>
__device__ __forceinline__ void lk_opaque(T& v) {
    static_assert(sizeof(T) % 4 == 0, "registers as 32-bit words");
    u32* p = reinterpret_cast<u32*>(&v);
#pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 4); i++) asm volatile("" : "+r"(p[i]));
}

// ---- per-type traits of the main loop: load one super-block of a thread's two rows, prepare its scales, and
// produce the A fragments of one 64-k chunk (a[s] = {row g k 2c.., row g+8 k 2c.., row g k 2c+8.., row g+8 ..})
template <bool C, class A, class B>
struct LkIf {
    using type = A;
};
template <class A, class B>
struct LkIf<false, A, B> {
    using type = B;
};
template <int QT, int BF16, int SCL>
struct KQ;

// SCL=2 (q4_K, f16): the scale plane written once at load (labkernels.wgmma.scale_plane), after the od x nsb
// blocks: per row and super-block 32 bytes, words [sp0 zp0 sp1 zp1 | sp2 zp2 sp3 zp3] -- chunk j's pairs
// (d sc, d sc') and (-dmin m, -dmin m') of sub-blocks 2j and 2j+1, RNE of the exact products: the words
// q4_scales_h makes from the header, so the A fragments are bitwise SCL=0's. A chunk's scales are then four byte
// permutes per row (the pairs' halves broadcast); the header is not read.
__device__ __forceinline__ Q4Scales q4_scales_pl(const uint4 (&pl)[2], int j) {
    const uint4& v = pl[j >> 1];
    return q4_pairs((j & 1) ? v.z : v.x, (j & 1) ? v.w : v.y);
}

template <int BF16, int SCL>
struct KQ<4, BF16, SCL> {
    static_assert(SCL != 2 || BF16 == 0, "the scale plane (SCL=2) holds f16 pairs");
    static constexpr int LOAD_AT = 0;   // chunk before which the next super-block's bytes are requested
    struct RowsBytes {
        Q4Raw r0, r1;
    };
    struct RowsPlane {
        Q4Raw r0, r1;
        uint4 pl0[2], pl1[2];   // SCL=2: the rows' scale-plane words of the super-block
    };
    using Rows = typename LkIf<SCL == 2, RowsPlane, RowsBytes>::type;
    const u8 *p0, *p1, *q0, *q1;
    int c;
    Q4Scales sc0[4], sc1[4];   // SCL=1: the super-block's four chunks' scales, taken from their lanes
    __device__ __forceinline__ KQ(const u8* W, int od, int nsb, int rr0, int rr1, int c_)
        : p0(W + (size_t)rr0 * nsb * 144), p1(W + (size_t)rr1 * nsb * 144),
          q0(W + (size_t)od * nsb * 144 + (size_t)rr0 * nsb * 32), q1(W + (size_t)od * nsb * 144 + (size_t)rr1 * nsb * 32),
          c(c_) {}
    // SCL=2: the rows' scale-plane words of super-block sb (global memory, in every build)
    __device__ __forceinline__ void load_plane(Rows& R, int sb) const {
        const uint4* a = (const uint4*)(q0 + (size_t)sb * 32);
        const uint4* b = (const uint4*)(q1 + (size_t)sb * 32);
        R.pl0[0] = __ldg(a);
        R.pl0[1] = __ldg(a + 1);
        R.pl1[0] = __ldg(b);
        R.pl1[1] = __ldg(b + 1);
    }
    __device__ __forceinline__ void load(Rows& R, int sb, int, int) const {
        q4_load(R.r0, p0 + (size_t)sb * 144, c);   // SCL=2: the header words are never used (their loads dead)
        q4_load(R.r1, p1 + (size_t)sb * 144, c);
        if constexpr (SCL == 2) load_plane(R, sb);
    }
    __device__ __forceinline__ void prefetch(int sb, int, int) const {   // the lines of both rows' 144-byte blocks
        const int off = c == 3 ? 143 : 48 * c;   // lanes 0..3: bytes 0, 48, 96, 143 -- every line a block touches
        lk_prefetch_l2(p0 + (size_t)sb * 144 + off);
        lk_prefetch_l2(p1 + (size_t)sb * 144 + off);
    }
    __device__ __forceinline__ void prep(const Rows& R) {
        if constexpr (SCL == 1) {
            const Q4Scales own0 = q4_scales<BF16>(R.r0, c), own1 = q4_scales<BF16>(R.r1, c);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                sc0[j] = q4_take(own0, j);
                sc1[j] = q4_take(own1, j);
            }
        }
    }
    template <int ROW>
    __device__ __forceinline__ Q4Scales scales(const Rows& R, int j) const {
        const Q4Raw& r = ROW ? R.r1 : R.r0;
        if constexpr (SCL == 1) return ROW ? sc1[j] : sc0[j];
        else if constexpr (SCL == 2) return q4_scales_pl(ROW ? R.pl1 : R.pl0, j);
        else if constexpr (BF16) return q4_scales<BF16>(r, j);
        else return q4_scales_h(r.hdr, j);
    }
    __device__ __forceinline__ void chunk(const Rows& R, int j, u32 (&a)[4][4]) const {
        u32 f0[4][2], f1[4][2];
        q4_chunk<BF16>(R.r0, j, scales<0>(R, j), f0);
        q4_chunk<BF16>(R.r1, j, scales<1>(R, j), f1);
#pragma unroll
        for (int s = 0; s < 4; s++) {
            a[s][0] = f0[s][0];
            a[s][1] = f1[s][0];
            a[s][2] = f0[s][1];
            a[s][3] = f1[s][1];
        }
    }
};

template <int BF16, int SCL>
struct KQ<6, BF16, SCL> {
    static_assert(SCL < 2, "q6_K: no scale plane");
    static constexpr int LOAD_AT = 2;   // later than q4_K: the low-nibble words of chunks 0-1 are dead by then
    struct Rows {
        Q6Raw r0, r1;
    };
    const u8* W;      // the planes L | H | SC | D start at W, W + 128 nblk, W + 192 nblk, W + 208 nblk (nblk =
    u32 b0, b1;       // od nsb, from the kernel parameters at each load); 32-bit block indices (the launcher
    int c;            // checks od x nsb < 2^31): the consumers' registers are all but taken by the accumulators
    Q6Scales own0, own1;       // SCL=1: lane c's chunk-c scales of the super-block
    __device__ __forceinline__ KQ(const u8* W_, int od, int nsb, int rr0, int rr1, int c_)
        : W(W_), b0((u32)rr0 * (u32)nsb), b1((u32)rr1 * (u32)nsb), c(c_) {}
    __device__ __forceinline__ void load(Rows& R, int sb, int od, int nsb) const {
        const u32 nblk = (u32)od * (u32)nsb;
        const u8 *L = W, *H = W + (size_t)nblk * 128, *SC = W + (size_t)nblk * 192, *D = W + (size_t)nblk * 208;
        q6_load(R.r0, L, H, SC, D, (size_t)(b0 + sb), c);
        q6_load(R.r1, L, H, SC, D, (size_t)(b1 + sb), c);
    }
    __device__ __forceinline__ void prefetch(int sb, int od, int nsb) const {   // each plane's bytes of both rows:
        const u32 nblk = (u32)od * (u32)nsb;                                       // lane c the one of its four
        const size_t blk = (size_t)((c & 2 ? b1 : b0) + sb);                       // (c = 0, 1: row 0; 2, 3: row 1)
        const u8* L = W + blk * 128 + 64 * (c & 1);
        const u8* P = (c & 1) ? W + (size_t)nblk * 128 + blk * 64 : W + (size_t)nblk * 192 + blk * 16;   // H | SC
        lk_prefetch_l2(L);
        lk_prefetch_l2(P);
        if ((c & 1) == 0) lk_prefetch_l2(W + (size_t)nblk * 208 + blk * 2);      // D
    }
    __device__ __forceinline__ void prep(const Rows& R) {
        if constexpr (SCL) {
            own0 = q6_scales<BF16>(R.r0, c);
            own1 = q6_scales<BF16>(R.r1, c);
        }
    }
    __device__ __forceinline__ void chunk(const Rows& R, int j, u32 (&a)[4][4]) const {
        u32 f0[4][2], f1[4][2];
        q6_chunk<BF16>(R.r0, j, SCL ? q6_take(own0, j) : BF16 ? q6_scales<BF16>(R.r0, j) : q6_scales_h(R.r0, j), f0);
        q6_chunk<BF16>(R.r1, j, SCL ? q6_take(own1, j) : BF16 ? q6_scales<BF16>(R.r1, j) : q6_scales_h(R.r1, j), f1);
#pragma unroll
        for (int s = 0; s < 4; s++) {
            a[s][0] = f0[s][0];
            a[s][1] = f1[s][0];
            a[s][2] = f0[s][1];
            a[s][3] = f1[s][1];
        }
    }
};

// ---------------------------------------------------------------------------------------------- the scheduler
// Work = tiles x I iterations (I = super-blocks of 256 k per tile; tile t = (m tile t % mtiles, token tile
// t / mtiles)). The first dp_tiles tiles go data-parallel in waves (CTA c: tiles c, c + ncta, ...); the rest is
// stream-K: its iterations, tile-major, are cut into ncta equal contiguous ranges. A CTA's range therefore starts
// inside a tile at most once (its first segment: a "helper", which writes its partial accumulators to ws[cta] and
// raises flags[cta]) and the CTA whose segment holds a tile's k = 0 (the "owner") adds the helpers' partials in
// CTA order (deterministic: the sum order depends only on the schedule), resets their flags and stores Y.
// dp_tiles == tiles == ncta is the plain one-tile-per-CTA grid. The owners wait on later CTAs' first segments,
// which never wait: this needs all ncta CTAs resident at once (the launcher keeps ncta <= SMs x blocks/SM).
#ifndef LK_SK_MAXSEG      // stream-K segments per CTA (its range spans < 2 waves of tiles + its two ends): the
#error "LK_SK_MAXSEG comes from the registry (registry.SK_MAXSEG via -D); the launcher checks schedules against it"
#endif
struct LkSeg {
    int tile, klo, khi;
};
// CTA c's stream-K range [c base + min(c, extra), +base + (c < extra)) of T = (tiles - dp_tiles) I iterations
// (32-bit: the launcher checks tiles x I < 2^31). G > 0 (SK=3, the tile-aligned split-k grid: G x tiles CTAs, no
// data-parallel waves): CTA c = G t + p starts at part p of tile t, t I + floor(p I / G), so every CTA holds one
// segment of one tile, floor(I/G) or ceil(I/G) super-blocks long, whether or not G divides I (where it does, this is
// the even range split above: SK=2's grid)
__device__ __forceinline__ int lk_sk_start(int c, int T, int I, int G) {
    if (G > 0) {
        const int t = c / G, p = c - t * G;
        return t * I + (p * I) / G;
    }
    const int base = T / (int)gridDim.x, extra = T - base * (int)gridDim.x;
    return c * base + (c < extra ? c : extra);
}
// one thread writes the CTA's stream-K segments to shared memory (the consumers' registers are all taken by
// the accumulators: the schedule lives in shared memory, the loops keep one counter)
__device__ __forceinline__ int lk_sk_segments(LkSeg* out, int I, int tiles, int dp_tiles, int G) {
    const int T = (tiles - dp_tiles) * I;
    int it = lk_sk_start(blockIdx.x, T, I, G), n = 0;
    const int it1 = lk_sk_start(blockIdx.x + 1, T, I, G);
    while (it < it1 && n < LK_SK_MAXSEG) {
        const int t = it / I, tend = (t + 1) * I;
        out[n].tile = dp_tiles + t;
        out[n].klo = it - t * I;
        out[n].khi = (it1 < tend ? it1 : tend) - t * I;
        it = t * I + out[n].khi;
        n++;
    }
    return it < it1 ? -1 : n;   // -1: more segments than LK_SK_MAXSEG (the launcher never asks for that)
}
// segment si of this CTA: data-parallel waves first (tile cta + si ncta), then the stream-K list
__device__ __forceinline__ bool lk_segment(int si, int I, int dp_tiles, const LkSeg* sk, int nsk, LkSeg& s) {
    const int dpw = dp_tiles / (int)gridDim.x;
    if (si < dpw) {
        s.tile = (int)blockIdx.x + si * (int)gridDim.x;
        s.klo = 0;
        s.khi = I;
        return true;
    }
    if (si - dpw >= nsk) return false;
    s = sk[si - dpw];
    return true;
}

__device__ __forceinline__ u32 lk_ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void lk_st_release(u32* p, u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void lk_consumer_sync() {   // the 256 consumer threads (named barrier 1)
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
}
// the 128 threads of one consumer warpgroup (named barriers 2 and 3), the barrier's id in a register: no branch (EPI=4's
// epilogue with a two-branch form, one bar.sync per warpgroup, made ptxas spill 36 B inside q6_K BN=256's main loop)
__device__ __forceinline__ void lk_wg_sync(int wgi) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wgi) : "memory");
}

// ---- the epilogue forms (registry parameter EPI of wgmma_kq). EPI 1 and 2 stage through the activation ring, which is
// idle once a CTA's last segment has left its main loop (every chunk it was loaded with is consumed, the producer
// has nothing left to load); so they take grids of one segment per CTA only -- SK=0, 2, 3, never stream-K (SK=1),
// where the producer fills the ring for the next segment while an owner folds. The launcher refuses SK=1 with EPI
// 1-3 and the kernel traps on such a schedule (EPI=4, below, has a buffer of its own and takes every scheduler). (A build that kept the plain epilogue for a stream-K CTA's earlier
// segments as well spilled 40-48 B in q6_K BN=256's main loop: its consumers sit at setmaxnreg's 240 registers.)
// * EPI=1, the bulk fold: an owner copies each helper's partial accumulators (one contiguous BN x 512-byte block of
//   the workspace) into the ring with bulk async copies (cp.async.bulk, 16 KB each, completing on one mbarrier)
//   and folds them in from shared memory, instead of 32 (BN=256) dependent float4 L2 loads per thread in groups
//   of 4 (round 7's trace: an owner's finish ~6.5 us, mostly that chain). Same sums in the same order: bitwise
//   the plain epilogue.
// * EPI=2, the bulk fold and a TMA store: the tile is then written to the ring as four 128-byte swizzled boxes of
//   [BN tokens x 32 rows] f32 (the layout of the Y tensor map, labkernels.wgmma.output_map) and stored by four
//   cp.async.bulk.tensor stores (full 128-byte lines; out-of-range tokens and rows are clipped by the TMA unit)
//   instead of BN/2 scalar 4-byte stores per thread.
// * EPI=4, the staged store (any scheduler, any number of segments per CTA): not the ring but a staging buffer of
//   its own behind it (64 KB: [128 tokens x 64 rows] f32 per consumer warpgroup) carries each tile to two TMA
//   stores per warpgroup and 128 tokens -- BN=256 in two rounds, the second waiting only until the TMA unit has
//   read the first (cp.async.bulk.wait_group.read). The consumers go on to their next tile while the stores drain:
//   on a multi-tile grid (nt=4096: ~10 tiles per CTA, all CTAs storing at the same moment) the plain epilogue's
//   BN/2 scalar stores per thread queue behind one another and hold the tensor pipe; here only the shared-memory
//   writes do. The same accumulators stored: bitwise the plain epilogue.
// * EPI=5, the reduce finish (grids whose tiles have at most two CTAs each, the helper's owner the CTA before it --
//   the launcher checks): no partial sums through the workspace and no fold. The CTA that holds a split tile's k = 0
//   fills the tile of Y with -0.0 early -- its producer warpgroup's three idle warps, at the CTA's start, by TMA
//   stores of a 16 KB box of -0.0 in the staging buffer (its consumers wait for the reads), then a flag
//   (flags[cta], for the helper) and an mbarrier (for its own consumers) -- and each of the tile's two CTAs adds its
//   partial sums into Y through EPI=4's staging buffer with TMA reduce-adds (cp.reduce.async.bulk.tensor .add) as
//   soon as its own main loop ends: neither waits for the other. Y = (-0 + a) + b = a + b in either order (IEEE
//   addition is commutative, -0 its identity): bitwise the plain epilogue's owner + helper, up to the flush of a
//   subnormal sum (the reduce's f32 add flushes them, as red.global.add.f32 does). Whole tiles: EPI=4's store.
//   Round 7's trace (run 20261202T190840Z): the owner's finish on the split grids 4.7-7.0 us, the helper's 2.6-3.6,
//   EPI=4's whole tile 2.2.
#define LK_FOLD_PIECE 16384
__device__ __forceinline__ void lk_bulk_g2s(u32 dst, const void* src, u32 bytes, u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"((u64)src), "r"(bytes), "r"(lk_smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void lk_tma_store_2d(const LkTmap* tm, u32 src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"((u64)tm),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}
// EPI=5: the same box added into Y element by element in L2 (f32 add, as red.global.add.f32: subnormals flushed)
__device__ __forceinline__ void lk_tma_reduce_add_2d(const LkTmap* tm, u32 src, int c0, int c1) {
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     (u64)tm),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void lk_sts32(u32 addr, float v) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float4 lk_lds128f(u32 addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr)
                 : "memory");
    return v;
}

// ---- EPI=3, the pair exchange in a 2-CTA cluster: distributed shared memory and cluster-scope mbarriers
__device__ __forceinline__ u32 lk_cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ u32 lk_cluster_size() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void lk_cluster_sync() {   // every thread of both CTAs (all of them still running)
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ u32 lk_mapa(u32 saddr, u32 rank) {   // this CTA's shared address -> the peer's
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(saddr), "r"(rank));
    return r;
}
__device__ __forceinline__ void lk_mbar_arrive_peer(u32 bar) {   // release at cluster scope: this thread's stores
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void lk_mbar_wait_cluster(u64* bar, u32 parity) {   // acquire at cluster scope
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(lk_smem_u32(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}
__device__ __forceinline__ void lk_st_peer_v4(u32 addr, float a, float b, float c, float d) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
}

// the plain store of a thread's accumulators, 8-token column groups J0 .. J1-1 of the tile: Y is token-major [nt, od],
// rows r0 and r1 = r0 + 8 (the fragment's g and g + 8), tokens n0 + 8 jn + 2 c and + 1; rows past od and tokens past
// nt are not stored
template <int N, int J0, int J1>
__device__ __forceinline__ void lk_store_y(const float (&acc)[N], float* __restrict__ Y, int nt, int od, int r0, int r1,
                                           int n0, int c) {
#pragma unroll
    for (int jn = J0; jn < J1; jn++) {
        const int n = n0 + 8 * jn + 2 * c;
        if (r0 < od) {
            if (n < nt) Y[(size_t)n * od + r0] = acc[4 * jn + 0];
            if (n + 1 < nt) Y[(size_t)(n + 1) * od + r0] = acc[4 * jn + 1];
        }
        if (r1 < od) {
            if (n < nt) Y[(size_t)n * od + r1] = acc[4 * jn + 2];
            if (n + 1 < nt) Y[(size_t)(n + 1) * od + r1] = acc[4 * jn + 3];
        }
    }
}
// acc[4i .. 4i+3] += v: one float4 of partial sums folded into a thread's accumulators (every fix-up path)
template <int N>
__device__ __forceinline__ void lk_add4(float (&acc)[N], int i, const float4& v) {
    acc[4 * i] += v.x;
    acc[4 * i + 1] += v.y;
    acc[4 * i + 2] += v.z;
    acc[4 * i + 3] += v.w;
}
// acc += a tile of partial sums staged in shared memory at ``ring``, float4 i of thread t at (i * threads + t) * 16
// (the order its writer stored them: conflict-free); at most 4 loads in flight over the live accumulators
template <int BN>
__device__ __forceinline__ void lk_fold_lds(float (&acc)[BN / 2], u32 ring, int threads, int t) {
#pragma unroll
    for (int i = 0; i < BN / 8; i++) {
        if (i % 4 == 0) asm volatile("" ::: "memory");
        lk_add4(acc, i, lk_lds128f(ring + (u32)(i * threads + t) * 16));
    }
}

// EPI=4's staging (and round 7's 64-row builds'): the shared address of row lw (0..63 of a warpgroup's rows) and token n
// (0..127) in a [128 tokens x 64 rows] f32 buffer at wst, the layout of two TMA boxes of the Y map: box lw / 32 holds
// [128 tokens x 32 rows], token n's 128 bytes at n * 128, its 16-byte chunk k = (lw % 32) / 4 at k ^ (n % 8) (the
// 128-byte swizzle), the row's float at (lw % 4) * 4
__device__ __forceinline__ u32 lk_stage_addr(u32 wst, int lw, int n) {
    return wst + (u32)(lw >> 5) * 16384u + (u32)n * 128 + ((u32)(((lw & 31) >> 2) ^ (n & 7)) << 4) + (u32)(lw & 3) * 4;
}

// ---- the end of a consumer's segment (both forms): a stream-K helper writes its partial accumulators and raises
// its flag; an owner folds in the helpers' partials (in CTA order) and stores its rows of Y. ``ring``: the
// activation ring's shared address (EPI >= 1, the CTA's one segment); ``fold_bar``: the bulk fold's mbarrier
// (EPI 1, 2) or the pair exchange's two (EPI = 3: fold_bar[1] the peer's ring is free, fold_bar[2] its partial
// sums have arrived); ``tmy``: the Y tensor map (EPI = 2, 4); ``stg``: EPI=4's staging buffer; ``G``: the
// tile-aligned split (SK=3) or 0.
template <int BN, int EPI, class P>
__device__ __forceinline__ void lk_finish_segment(float (&acc)[BN / 2], const LkSeg& seg, float* __restrict__ Y,
                                                  int nt, int od, int nsb, int tiles, int dp_tiles,
                                                  float* __restrict__ ws, u32* __restrict__ flags, int r0, int r1,
                                                  int n0, int c, int ctid, int G, u32 ring, u64* fold_bar, const LkTmap* tmy, u32 stg) {
    static_assert(EPI >= 0 && EPI <= 5, "EPI is 0 (plain), 1 (bulk fold), 2 (bulk fold + TMA store), 3 (pair exchange), "
                                        "4 (staged TMA store), 5 (reduce finish)");
    float4* part = (float4*)ws;
    if constexpr (EPI == 3) {
        // EPI=3, the pair exchange: the tile's two CTAs (SK=3, G=2: CTAs 2t and 2t+1, one 2-CTA cluster) each hold
        // its partial sums over half of k. Cluster rank r keeps consumer warpgroup r's 64 rows and sends the other
        // warpgroup's 64 rows into the peer's idle ring through distributed shared memory -- no workspace, no L2
        // round trip, no flag -- then folds the peer's half of its rows in and stores them: each CTA stores half
        // the tile. Rank 0's sum is the plain owner's (its k-half + the other); rank 1's adds the same two numbers
        // in the other order: IEEE addition is commutative, so bitwise the plain epilogue.
        const u32 me = lk_cluster_rank(), peer = me ^ 1u;
        const int wgi = ctid >> 7, t = ctid & 127;
        lk_consumer_sync();   // every consumer's wgmmas have retired: this CTA's ring is free for the peer
        if (ctid == 0) lk_mbar_arrive_peer(lk_mapa(lk_smem_u32(&fold_bar[1]), peer));
        if (wgi != (int)me) {   // the peer's rows: wait for its ring, write them there, arrive (128 threads)
            lk_mbar_wait_cluster(&fold_bar[1], 0);
            const u32 dst = lk_mapa(ring, peer);
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
                lk_st_peer_v4(dst + (u32)(i * 128 + t) * 16, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
            lk_mbar_arrive_peer(lk_mapa(lk_smem_u32(&fold_bar[2]), peer));
            return;
        }
        lk_mbar_wait_cluster(&fold_bar[2], 0);   // the peer's 128 senders' stores have landed in this ring
        lk_fold_lds<BN>(acc, ring, 128, t);
    }
    // EPI=5: a split tile's two CTAs add into Y (zeroed by the owner's producer warps) -- no fold; a helper waits
    // only for that zeroing (done at the owner's start), the owner for its own producer's
    const bool red = EPI == 5 && (seg.klo > 0 || seg.khi < nsb);
    (void)red;
    if constexpr (EPI == 5) {
        if (seg.klo > 0) {
            if (ctid == 0) {
                u32* f = flags + blockIdx.x - 1;   // the owner: the CTA before (the launcher checks)
                while (lk_ld_acquire(f) == 0) __nanosleep(64);
                *f = 0u;   // consumed (only this CTA reads it): zero again for the next launch
            }
            lk_consumer_sync();
        } else if (red) {
            lk_mbar_wait(fold_bar, 0);   // this CTA's producer warps have zeroed the tile (once per launch)
        }
    }
    if constexpr (EPI != 3 && EPI != 5 && P::FIXUP) {   // (P::FIXUP off: an ablation build, timing only)
        if (seg.klo > 0) {   // a helper: partial accumulators to ws[cta] (coalesced by thread), then the flag
            float4* dst = part + (size_t)blockIdx.x * (BN / 8) * 256 + ctid;
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
                __stcg(dst + i * 256, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
            lk_consumer_sync();
            if (ctid == 0) {
                __threadfence();
                lk_st_release(flags + blockIdx.x, 1u);
            }
            return;
        }
        {   // the owner: fold in the partials of the CTAs that hold the rest of this tile's k, in CTA order -- from L2
            // (plain), or (EPI >= 1) each through the idle ring by bulk copies
            constexpr bool bulk = EPI == 1 || EPI == 2;
            u32 nf = 0;   // bulk folds so far: the mbarrier's phase
            for (int cc = blockIdx.x + 1, covered = seg.khi; covered < nsb && cc < (int)gridDim.x; cc++) {
                const int T = (tiles - dp_tiles) * nsb, t0 = (seg.tile - dp_tiles) * nsb;
                const int a1 = lk_sk_start(cc + 1, T, nsb, G), khi = (a1 < t0 + nsb ? a1 : t0 + nsb) - t0;
                if (khi <= covered) continue;   // an empty range (never with the launcher's ncta <= stream-K iterations)
                if (ctid == 0) {
                    while (lk_ld_acquire(flags + cc) == 0) __nanosleep(64);
                    flags[cc] = 0u;   // consumed: the next launch (after this one, in stream order) starts at zero
                }
                // every consumer is past its main loop (for the bulk fold: the ring's last wgmma reads have retired)
                // and past the previous fold's reads (the ring may be overwritten)
                lk_consumer_sync();
                if (EPI >= 1 && bulk) {
                    if (ctid == 0) {
                        // the helper's generic stores, acquired above, before this thread's async-proxy reads of them
                        asm volatile("fence.proxy.async.global;\n" ::: "memory");
                        lk_mbar_expect_tx(fold_bar, BN * 512);
                        const u8* src = (const u8*)(part + (size_t)cc * (BN / 8) * 256);
#pragma unroll
                        for (int p = 0; p < BN * 512 / LK_FOLD_PIECE; p++)
                            lk_bulk_g2s(ring + p * LK_FOLD_PIECE, src + p * LK_FOLD_PIECE, LK_FOLD_PIECE, fold_bar);
                    }
                    lk_mbar_wait(fold_bar, nf & 1);
                    nf++;
                    lk_fold_lds<BN>(acc, ring, 256, ctid);   // thread ctid's float4s as the helper wrote them
                } else {
                    const float4* src = part + (size_t)cc * (BN / 8) * 256 + ctid;
#pragma unroll
                    for (int i = 0; i < BN / 8; i++) {
                        // at most 4 loads in flight over the live accumulators (hoisting all 32 spills registers)
                        if (i % 4 == 0) asm volatile("" ::: "memory");
                        const float4 v = __ldcg(src + i * 256);
                        lk_add4(acc, i, v);
                    }
                }
                covered = khi;
            }
        }
    }   // EPI != 3, 5
    if constexpr (!P::STORE) {   // an ablation build (timing only): no store
        if (acc[0] == 12345.f) Y[0] = acc[1];   // keep the accumulators live
    } else {
        if constexpr (EPI == 4 || EPI == 5) {   // per warpgroup: its 64 rows through its staging half, 128 tokens a round
            if (EPI == 5) lk_mbar_wait(&fold_bar[1], 0);   // the producer's TMA has read its zeros from the buffer
            const int wgi = ctid >> 7, t = ctid & 127;
            const u32 wst = stg + (u32)wgi * 32768u;           // [128 tokens x 64 rows] f32: two boxes of 32 rows
            const int lw0 = (t >> 5) * 16 + ((t & 31) >> 2);   // the thread's first row among the warpgroup's 64
#pragma unroll
            for (int h = 0; h < BN / 128; h++) {
                // the previous round's (or tile's) stores have read the buffer: this warpgroup's leader committed them
                if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
                lk_wg_sync(wgi);
#pragma unroll
                for (int jn = 16 * h; jn < 16 * h + 16; jn++) {
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        lk_sts32(lk_stage_addr(wst, lw0 + (e >> 1) * 8, 8 * (jn - 16 * h) + 2 * c + (e & 1)), acc[4 * jn + e]);
                }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the generic writes -> the TMA's reads
                lk_wg_sync(wgi);
                if (t == 0) {
                    const int m0w = r0 - lw0;   // the warpgroup's first row
                    if (EPI == 5 && red) {      // a split tile: add into the zeroed Y (the zeros' generic writes, acquired
                        asm volatile("fence.proxy.async.global;\n" ::: "memory");   // above, before the async adds)
                        lk_tma_reduce_add_2d(tmy, wst, m0w, n0 + 128 * h);
                        lk_tma_reduce_add_2d(tmy, wst + 16384u, m0w + 32, n0 + 128 * h);
                    } else {
                        lk_tma_store_2d(tmy, wst, m0w, n0 + 128 * h);
                        lk_tma_store_2d(tmy, wst + 16384u, m0w + 32, n0 + 128 * h);
                    }
                    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                }
            }
            return;
        }
        if (EPI == 2) {   // the tile through the ring and four TMA stores
            lk_consumer_sync();   // every consumer's wgmmas (no fold) or fold reads (EPI >= 1) are done with the ring
            // box b = local row / 32 holds [BN tokens x 32 rows]: token n's 128 bytes at n * 128, its 16-byte chunk
            // k = (row % 32) / 4 at k ^ (n % 8) (the 128-byte swizzle), the row's float at (row % 4) * 4
            const int lr0 = (ctid >> 5) * 16 + (r0 & 15);   // r0's row in the 128-row tile (m0 is a multiple of 128)
#pragma unroll
            for (int jn = 0; jn < BN / 8; jn++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int lr = lr0 + (e >> 1) * 8, n = 8 * jn + 2 * c + (e & 1);
                    const u32 a = ring + (u32)(lr >> 5) * (BN * 128) + (u32)n * 128 +
                                  ((u32)(((lr & 31) >> 2) ^ (n & 7)) << 4) + (u32)(lr & 3) * 4;
                    lk_sts32(a, acc[4 * jn + e]);
                }
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the generic writes -> the TMA's reads
            lk_consumer_sync();
            if (ctid == 0) {
                const int m0 = r0 - lr0;
#pragma unroll
                for (int b = 0; b < 4; b++) lk_tma_store_2d(tmy, ring + (u32)b * (BN * 128), m0 + 32 * b, n0);
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");   // the ring is read before exit
            }
            return;
        }
        // epilogue: Y is token-major [nt, od]; lanes with the same c write 8 consecutive rows (32 B)
        lk_store_y<BN / 2, 0, BN / 8>(acc, Y, nt, od, r0, r1, n0, c);
    }   // P::STORE
}

// ---------------------------------------------------------------------------------------------- the kernel
template <int QT, int BN, int STAGES, int BF16, int SCL, int EPI, int AQ, int PF, class P>
__device__ __forceinline__ void wgmma_kq_body(const LkTmap& tm, const LkTmap& tmy, const u8* __restrict__ W,
                                              float* __restrict__ Y, int nt, int od, int id, float* __restrict__ ws,
                                              u32* __restrict__ flags, int dp_tiles, int split_g) {
    static_assert(EPI == 0 || STAGES * BN * 128 >= BN * 512, "the EPI forms stage a BN x 128 f32 tile in the ring");
    static_assert(EPI < 4 || BN % 128 == 0, "EPI=4 and 5 stage 128 tokens a round");
    static_assert(AQ == 2 || AQ == 4, "AQ: 2 or 4 A-fragment sets");
    static_assert(PF >= 0 && PF <= 2, "PF: no L2 prefetch (0), or of the super-block 1 or 2 ahead");
    constexpr int STAGE_BYTES = BN * LK_WG_K * 2;
    P::stamp(0);
    extern __shared__ u8 lk_dyn_smem[];
    __shared__ __align__(8) u64 full_bar[STAGES];
    __shared__ __align__(8) u64 empty_bar[STAGES];
    __shared__ __align__(8) u64 fold_bar[3];       // EPI 1, 2: [0] the bulk fold's copies; EPI 3: [1], [2] the pair's
    __shared__ LkSeg sk_seg[LK_SK_MAXSEG];
    __shared__ int sk_n;
    const u32 base = lk_smem_u32(lk_dyn_smem);
    u8* sB = lk_dyn_smem + (((base + 1023) & ~1023u) - base);   // 128-byte swizzle wants 1024-aligned tiles

    const int nsb = id >> 8;
    const int mtiles = (od + LK_WG_M - 1) / LK_WG_M, tiles = mtiles * ((nt + BN - 1) / BN);
    const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            lk_mbar_init(&full_bar[s], 1);
            lk_mbar_init(&empty_bar[s], 8);   // lane 0 of each of the 8 consumer warps
        }
        lk_mbar_init(&fold_bar[0], 1);        // the first consumer thread, with the copies' byte count
        lk_mbar_init(&fold_bar[1], 1);        // EPI=3: the peer's first consumer thread (its ring is free)
        lk_mbar_init(&fold_bar[2], 128);      // EPI=3: the peer's 128 sending threads
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        sk_n = lk_sk_segments(sk_seg, nsb, tiles, dp_tiles, split_g);
        if (sk_n < 0) __trap();
        if (EPI >= 1 && EPI <= 3 && dp_tiles / (int)gridDim.x + sk_n != 1) __trap();   // EPI 1-3: one segment per CTA
        if (EPI == 3 && (split_g != 2 || lk_cluster_size() != 2)) __trap();   // a pair of CTAs per tile, clustered
        if (EPI == 5) {   // at most one split tile held from its k = 0 (the producer zeroes one), and a helper's
            int own = 0;  // owner is the CTA before it (its flag): the launcher checks both on the host model
            for (int i = 0; i < sk_n; i++) own += sk_seg[i].klo == 0 && sk_seg[i].khi < nsb;
            if (own > 1 || (sk_n > 0 && sk_seg[0].klo > 0 && blockIdx.x == 0)) __trap();
        }
    }
    __syncthreads();
    if (EPI == 3) lk_cluster_sync();   // the peer's mbarriers are initialized before anything arrives on them
    P::stamp(1);
    const int nsk = sk_n;
    LkSeg seg;

    if (wg == 0) {  // ------------------------------------------------ producer warpgroup
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (tid == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((u64)&tm) : "memory");
            if (EPI == 2 || EPI >= 4) asm volatile("prefetch.tensormap [%0];\n" ::"l"((u64)&tmy) : "memory");
            u32 q = 0;   // chunks issued so far: ring slot q % STAGES, its use number q / STAGES
            for (int si = 0; lk_segment(si, nsb, dp_tiles, sk_seg, nsk, seg); si++) {
                const int n0 = (seg.tile / mtiles) * BN;
                for (int kt = 4 * seg.klo; kt < 4 * seg.khi; kt++, q++) {
                    const int s = q % STAGES;
                    if (q >= STAGES) lk_mbar_wait(&empty_bar[s], ((q / STAGES) - 1) & 1);
                    lk_mbar_expect_tx(&full_bar[s], STAGE_BYTES);
                    lk_tma_load_2d(sB + s * STAGE_BYTES, &tm, kt * LK_WG_K, n0, &full_bar[s]);
                }
            }
        }
        if constexpr (EPI == 5) {
            // warps 1-3 of the producer: the tile this CTA holds from k = 0 without finishing it (its helper is the
            // next CTA) is filled with -0.0 in Y now, long before either CTA adds into it (EPI=5 above), by TMA
            // stores of a 16 KB box of -0.0 written to the start of the staging buffer. Not by the warps' own stores
            // (the first build: 128 KB a CTA through the SM's load/store path slowed the consumers' main loop from
            // 4,109 to 4,360 clock64 cycles per super-block, trace run 20261202T230839Z), and not from 16 KB of shared
            // memory of its own (the second build: q6_K's loop slowed by ~11% with the smaller L1 beside it, trace
            // run 20261202T231817Z). fold_bar[1]: the staging buffer read (every EPI=5 CTA arrives once, its
            // consumers wait before their first staging write); fold_bar[0] and the flag: the zeros written
            if (tid >= 32) {
                int zt = -1;
                for (int i = 0; i < nsk; i++)
                    if (sk_seg[i].klo == 0 && sk_seg[i].khi < nsb) zt = sk_seg[i].tile;
                const int z = tid - 32;
                if (zt >= 0) {
                    const int m0 = (zt % mtiles) * LK_WG_M, n0 = (zt / mtiles) * BN;
                    const u32 zb = lk_smem_u32(sB) + (u32)(STAGES * STAGE_BYTES);   // [128 tokens x 32 rows]
                    for (int e = z; e < 1024; e += 96)
                        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(zb + 16u * (u32)e),
                                     "r"(0x80000000u)
                                     : "memory");
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // -> the TMA unit's reads
                    asm volatile("bar.sync 4, 96;\n" ::: "memory");
                    if (z == 0) {
                        for (int h = 0; h < BN / 128; h++)       // the map's box: 32 rows x 128 tokens (clipped at
                            for (int r = 0; r < LK_WG_M; r += 32)   // od and nt by the TMA unit)
                                lk_tma_store_2d(&tmy, zb, m0 + r, n0 + 128 * h);
                        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
                        lk_mbar_arrive(&fold_bar[1]);            // the staging buffer is the consumers' again
                        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");   // written, not only read
                        asm volatile("fence.proxy.async.global;\n" ::: "memory");
                        __threadfence();
                        lk_st_release(flags + blockIdx.x, 1u);   // the helper (the next CTA)
                        lk_mbar_arrive(&fold_bar[0]);            // this CTA's consumers
                    }
                } else if (z == 0) {
                    lk_mbar_arrive(&fold_bar[1]);   // nothing to zero: the staging buffer is free from the start
                }
            }
        }
        return;
    }
    // ------------------------------------------------------------------ consumer warpgroups
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int ctid = threadIdx.x - 128;   // 0..255 over the two consumer warpgroups
    u32 q = 0;                            // chunks consumed so far (the same ring count as the producer's)
    for (int si = 0; lk_segment(si, nsb, dp_tiles, sk_seg, nsk, seg); si++) {
        const int m0 = (seg.tile % mtiles) * LK_WG_M, n0 = (seg.tile / mtiles) * BN;
        const int r0 = m0 + (wg - 1) * 64 + warp * 16 + g, r1 = r0 + 8;
        const int rr0 = r0 < od ? r0 : od - 1, rr1 = r1 < od ? r1 : od - 1;   // tail rows compute, never store

        float acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
        // AQ=2: two A-fragment sets -- chunk q's wgmmas read set q&1 while chunk q-1's (the other set) may still be
        // in flight; the consumer waits for q-1 to retire, then converts q+1: while it converts, only chunk q of
        // this warpgroup is queued on the tensor pipe.
        // AQ=4: the conversion moves ahead of the wait -- after issuing chunk q the consumer converts chunk q+1
        // (into set (q+1)&3, last read by chunk q-3, retired two waits ago), then waits for q-1: while it converts,
        // chunks q-1 and q are queued, twice AQ=2's work, for BN=128, whose 64-k chunk is half BN=256's tensor
        // time over the same conversion. Four sets, one per chunk of the super-block: compile-time indices (no
        // register rotation); the next super-block's chunk 0 is converted during this one's chunk 3 (its bytes
        // loaded at chunk 0, its scales prepared then). wait_group 1 as in AQ=2: with wait_group 2 (issue chunk
        // q, wait for q-2, convert) ptxas serializes the pipeline (C7513).
        u32 a[AQ][4][4];
        const u32 never = nt < 0;   // AQ=4's lk_hold: false, and not known to the compiler
        P::stamp(3 + 3 * si);
        KQ<QT, BF16, SCL> T(W, od, nsb, rr0, rr1, c);
        typename KQ<QT, BF16, SCL>::Rows cur, nxt;
        T.load(cur, seg.klo, od, nsb);
        if constexpr (AQ == 4) {
            T.prep(cur);
            T.chunk(cur, 0, a[0]);
            lk_keep(a[0]);
            lk_wgmma_fence_acc(acc);
            lk_wgmma_fence();   // the zeroed accumulators and chunk 0's set before the segment's first wgmmas
        }
        for (int sb = seg.klo; sb < seg.khi; sb++) {
            if constexpr (AQ == 2) T.prep(cur);
#pragma unroll
            for (int j = 0; j < 4; j++, q++) {
                const int st = STAGES == 4 ? j : q % STAGES;   // q = 4 x (super-blocks so far) + j: a constant
                const int sn = j % AQ;                 // this chunk's set (compile-time after unrolling)
                if (P::LOADS && PF > 0 && j == 0 && sb + PF < seg.khi) T.prefetch(sb + PF, od, nsb);   // L2, PF ahead
                if constexpr (AQ == 2) {
                    if (P::LOADS && j == T.LOAD_AT && sb + 1 < seg.khi) T.load(nxt, sb + 1, od, nsb);
                    if constexpr (P::CONVERT) T.chunk(cur, j, a[sn]);   // (off: A keeps its first chunk)
                    lk_keep(a[sn]);   // all 16 fragments of the chunk exist (in 16 registers) before its first wgmma
                } else {
                    if (P::LOADS && j == 0 && sb + 1 < seg.khi) T.load(nxt, sb + 1, od, nsb);   // 3 chunks ahead
                }
                lk_mbar_wait(&full_bar[st], (q / STAGES) & 1);
                if constexpr (P::TRACE) {
                    if (q == 0) P::stamp(2);   // the first activation tile has landed
                }
                lk_wgmma_fence_acc(acc);
                if constexpr (AQ == 2) lk_wgmma_fence();   // AQ=4: fenced right after the conversion (below)
                // one descriptor per chunk: the k16 steps' are it + 2 s (32 bytes further in the 1024-aligned stage;
                // the 14-bit address field cannot carry below 256 KB), the same bits as encoding each
                const u32 sa = lk_smem_u32(sB + st * STAGE_BYTES);
                const u64 dsc = lk_desc_sw128(sa);
#pragma unroll
                for (int s = 0; s < 4; s++)
                    lk_wgmma<BN, BF16>(acc, a[sn][s], dsc + 2 * s);
                lk_wgmma_commit();
                lk_wgmma_fence_acc(acc);
                if constexpr (AQ == 4) {   // convert chunk q+1 while q-1 and q are queued
                    if (j < 3) {
                        if constexpr (P::CONVERT) T.chunk(cur, j + 1, a[j + 1]);
                        lk_keep(a[j + 1]);
                    } else if (sb + 1 < seg.khi) {
                        if constexpr (!P::LOADS) {
                            lk_opaque(cur);
                            nxt = cur;
                        }
                        T.prep(nxt);
                        if constexpr (P::CONVERT) T.chunk(nxt, 0, a[0]);
                        lk_keep(a[0]);
                    }
                    // the fence that orders these register writes before chunk q+1's wgmmas, issued here, before the
                    // wait: ptxas keeps the conversion ahead of it, so it cannot sink the conversion below the wait
                    // and into the registers of chunk q-1 (which it did without: the two sets then shared
                    // registers and the conversion ran after the wait, as in AQ=2). Nothing writes the accumulators
                    // or the A sets between here and those wgmmas.
                    lk_wgmma_fence();
                }
                lk_wgmma_wait<1>();                        // chunk q-1's group has retired
                if constexpr (AQ == 4) lk_hold(a[(j + 3) & 3], never);
                lk_keep(a[(j + AQ - 1) % AQ]);             // ...its set lived up to here (AQ=2: chunk q+1 writes it)
                // chunk q-1 (possibly the previous segment's last) has retired: its ring slot is free
                if (q > 0 && lane == 0) lk_mbar_arrive(&empty_bar[(q - 1) % STAGES]);
            }
            if constexpr (P::LOADS) cur = nxt;
            else lk_opaque(cur);   // NOLOAD: the same bytes again, unknown to the compiler
        }
        lk_wgmma_wait<0>();
        lk_wgmma_fence_acc(acc);
        P::stamp(4 + 3 * si);

        const u32 ring = (lk_smem_u32(lk_dyn_smem) + 1023) & ~1023u;   // recomputed: no register over the loop
        lk_finish_segment<BN, EPI, P>(acc, seg, Y, nt, od, nsb, tiles, dp_tiles, ws, flags, r0, r1, n0, c, ctid,
                                      split_g, ring, fold_bar, &tmy, ring + (u32)(STAGES * STAGE_BYTES));
        P::stamp(5 + 3 * si);
    }
    // EPI=4, 5: the last tile's stores have read the staging buffer before the CTA's shared memory is released
    if constexpr (EPI == 4 || EPI == 5) {
        if ((ctid & 127) == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    }
    // EPI=3: neither CTA of a pair exits while its peer may still write its ring. The mbarrier protocol already
    // orders it (a CTA's receivers wait for all 128 of the peer's stores), but only a cluster barrier before exit
    // says so to compute-sanitizer racecheck ("write ... in a block that might have already exited"), and it is
    // the CUDA guide's rule for distributed shared memory. The producers have exited: they do not count.
    if constexpr (EPI == 3) lk_cluster_sync();
}

// ============================================================================ the shared-memory form (wgmma_kqs)
// The register form's consumers convert their own A fragments between wgmmas, so conversion, issue and the
// tensor pipe share one dependency chain (round 7: issue-active ~40%, tensor pipe ~55% at nt=512). Here the
// first warpgroup converts and the consumers only issue wgmma, both operands from shared memory (cuBLAS's
// structure):
// * warpgroup 0, "converters": thread r owns row r of the CTA's 128-row tile. Thread 0 also issues every TMA:
//   the activations' [BN x 64] tiles (as the register form's producer) and the raw q4_K super-blocks of the tile
//   (the GGUF bytes as they are: a [128 rows x 144 B] box of the weight viewed as a 2-D byte array) into a
//   LK_WS_RAW-deep ring, LK_WS_RAW - 1 super-blocks ahead. Per 64-k chunk each thread reads its row's 32 nibble
//   bytes and scale header from shared memory, dequantizes them (scale and min folded in, the register form's
//   arithmetic: bitwise the same f16/bf16 weights) and writes them 128-byte swizzled into the chunk's A slot
//   ([128 rows x 64 k] f16, K-major: the layout the wgmma descriptor reads), then fence.proxy.async + arrive.
// * warpgroups 1-2, consumers: wait for the A and B slots of the chunk, 4 x wgmma m64nBNk16 (A: their 64 rows
//   of the slot, B: the activations), release the slot one chunk later; the same tile scheduler, stream-K
//   fix-up and store as the register form.
// q4_K only (q6_K's 210-byte blocks are not a TMA box; its planes would need their own order).
// NCV = 2: two converter warpgroups (512 threads). Thread r of converter c still owns row r, and converts half of
// each chunk: nibble bytes 16c .. 16c + 15 (k 16c .. 16c + 15 and 32 + 16c ..), the other half being the other
// converter's -- the same weights written to the same places, so bitwise NCV=1's. With one converter warpgroup
// (one warp per SM sub-partition) the form ran at 0.5-0.75x the register form (round 7's benchmark of record):
// its conversion was latency-bound, not issue-bound; two warps per sub-partition halve each one's chain.
// setmaxnreg 80 for the converters, 176 for the consumers (the 512-thread budget: 2 x 80 + 2 x 176 = 512 / 128).
#define LK_WS_RAW 3          // raw super-block ring of the shared-memory form
#define LK_WS_RAW_BYTES (LK_WG_M * 144)

__device__ __forceinline__ uint4 lk_lds128(const u8* p) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(lk_smem_u32(p)));
    return v;
}
__device__ __forceinline__ void lk_sts128(u32 addr, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ u32 lk_prmt(u32 a, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(d) : "r"(a), "r"(sel));
    return d;
}
template <int BN, int BF16>
__device__ __forceinline__ void lk_wgmma_ss(float (&d)[BN / 2], u64 da, u64 db) {
    if constexpr (BF16) {
        if constexpr (BN == 128) lk_wgmma_m64n128k16_bf16_ss(d, da, db, 1);
        if constexpr (BN == 256) lk_wgmma_m64n256k16_bf16_ss(d, da, db, 1);
    } else {
        if constexpr (BN == 128) lk_wgmma_m64n128k16_f16_ss(d, da, db, 1);
        if constexpr (BN == 256) lk_wgmma_m64n256k16_f16_ss(d, da, db, 1);
    }
}
// the f16/bf16 pairs of one nibble word w = GGUF qs bytes [b0 b1 b2 b3] (k = 4m .. 4m+3 of the chunk's low
// nibbles, k = 32 + 4m .. of its high ones): lo[0] = (k 4m, 4m+1), lo[1] = (4m+2, 4m+3), hi likewise
template <int BF16>
__device__ __forceinline__ void q4s_word(u32 w, u32 s0, u32 z0, u32 s1, u32 z1, u32 (&lo)[2], u32 (&hi)[2]) {
    const u32 p = lk_prmt(w, 0x3120);      // bytes [b0 b2 b1 b3]: b0|b1 and (>> 8) b2|b3 sit in the two halves
    const u32 p8 = p >> 8;
    lo[0] = lk_fma2<BF16>(lk_sub2<BF16>(lk_lop_or_and(p, 0x000F000Fu, LkMagic<BF16>::OR), LkMagic<BF16>::Q4), s0, z0);
    lo[1] = lk_fma2<BF16>(lk_sub2<BF16>(lk_lop_or_and(p8, 0x000F000Fu, LkMagic<BF16>::OR), LkMagic<BF16>::Q4), s0, z0);
    if constexpr (BF16) {   // bf16 has 7 mantissa bits: 16 q does not fit under the magic exponent, shift down
        hi[0] = lk_fma2<BF16>(lk_sub2<BF16>(lk_lop_or_and(p >> 4, 0x000F000Fu, LkMagic<BF16>::OR), LkMagic<BF16>::Q4), s1, z1);
        hi[1] = lk_fma2<BF16>(lk_sub2<BF16>(lk_lop_or_and(p8 >> 4, 0x000F000Fu, LkMagic<BF16>::OR), LkMagic<BF16>::Q4), s1, z1);
    } else {                // f16: (1024 + 16 q) / 16 - 64 = q exactly, no shift
        hi[0] = lk_fma2<BF16>(lk_fma2<BF16>(lk_lop_or_and(p, 0x00F000F0u, 0x64006400u), 0x2C002C00u, 0xD400D400u), s1, z1);
        hi[1] = lk_fma2<BF16>(lk_fma2<BF16>(lk_lop_or_and(p8, 0x00F000F0u, 0x64006400u), 0x2C002C00u, 0xD400D400u), s1, z1);
    }
}
// a consumer's or converter's walk over the CTA's super-blocks in schedule order (segment si, super-block sb)
struct LkCursor {
    LkSeg seg;
    int si, sb;
    bool ok;
    __device__ __forceinline__ LkCursor(int I, int dp_tiles, const LkSeg* sk, int nsk) : si(0) {
        ok = lk_segment(0, I, dp_tiles, sk, nsk, seg);
        sb = seg.klo;
    }
    __device__ __forceinline__ void next(int I, int dp_tiles, const LkSeg* sk, int nsk) {
        if (!ok) return;
        if (++sb >= seg.khi) {
            ok = lk_segment(++si, I, dp_tiles, sk, nsk, seg);
            sb = seg.klo;
        }
    }
};

template <int QT, int BN, int STAGES, int BF16, int NCV, class P>
__device__ __forceinline__ void wgmma_kqs_body(const LkTmap& tmx, const LkTmap& tmw, float* __restrict__ Y, int nt,
                                               int od, int id, float* __restrict__ ws, u32* __restrict__ flags,
                                               int dp_tiles, int split_g) {
    static_assert(QT == 4, "the shared-memory form takes q4_K");
    static_assert(NCV == 1 || NCV == 2, "NCV: one or two converter warpgroups");
    constexpr int B_BYTES = BN * LK_WG_K * 2, A_BYTES = LK_WG_M * LK_WG_K * 2;
    extern __shared__ u8 lk_dyn_smem[];
    __shared__ __align__(8) u64 full_b[STAGES], full_a[STAGES], empty_bar[STAGES];
    __shared__ __align__(8) u64 raw_full[LK_WS_RAW], raw_empty[LK_WS_RAW];
    __shared__ LkSeg sk_seg[LK_SK_MAXSEG];
    __shared__ int sk_n;
    const u32 base = lk_smem_u32(lk_dyn_smem);
    u8* sB = lk_dyn_smem + (((base + 1023) & ~1023u) - base);   // 128-byte swizzle wants 1024-aligned tiles
    u8* sA = sB + STAGES * B_BYTES;
    u8* sR = sA + STAGES * A_BYTES;

    const int nsb = id >> 8;
    const int mtiles = (od + LK_WG_M - 1) / LK_WG_M, tiles = mtiles * ((nt + BN - 1) / BN);
    const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127, lane = tid & 31;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            lk_mbar_init(&full_b[s], 1);
            lk_mbar_init(&full_a[s], 4 * NCV);   // lane 0 of each converter warp
            lk_mbar_init(&empty_bar[s], 8);   // lane 0 of each of the 8 consumer warps
        }
#pragma unroll
        for (int s = 0; s < LK_WS_RAW; s++) {
            lk_mbar_init(&raw_full[s], 1);
            lk_mbar_init(&raw_empty[s], 4 * NCV);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        sk_n = lk_sk_segments(sk_seg, nsb, tiles, dp_tiles, split_g);
        if (sk_n < 0) __trap();
    }
    __syncthreads();
    const int nsk = sk_n;

    if (NCV == 1 ? wg == 0 : wg < NCV) {  // ------------------------- converter warpgroup(s) (+ the TMA thread)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 80;\n");
        const bool issuer = NCV == 1 ? tid == 0 : threadIdx.x == 0;   // thread 0 of converter 0
        LkCursor ahead(nsb, dp_tiles, sk_seg, nsk);   // the next super-block to request
        if (issuer) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((u64)&tmx) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((u64)&tmw) : "memory");
            for (int t = 0; t < LK_WS_RAW - 1 && ahead.ok; t++) {
                lk_mbar_expect_tx(&raw_full[t], LK_WS_RAW_BYTES);
                lk_tma_load_2d(sR + t * LK_WS_RAW_BYTES, &tmw, ahead.sb * 144,
                               (ahead.seg.tile % mtiles) * LK_WG_M, &raw_full[t]);
                ahead.next(nsb, dp_tiles, sk_seg, nsk);
            }
        }
        // this thread's row in the A slot: 64-row half (one consumer warpgroup's), 8-row core group, swizzle
        const u32 a_row = (u32)((tid >> 6) * 8192 + ((tid & 63) >> 3) * 1024 + (tid & 7) * 128);
        const u32 sw = (u32)(tid & 7);
        const u32 sA0 = lk_smem_u32(sA);
        u32 q = 0, u = 0;   // chunks and super-blocks converted so far (the consumers count the same chunks)
        LkCursor cur(nsb, dp_tiles, sk_seg, nsk);
        for (; cur.ok; cur.next(nsb, dp_tiles, sk_seg, nsk), u++) {
            const int n0 = (cur.seg.tile / mtiles) * BN;
            const int rs = u % LK_WS_RAW;
            lk_mbar_wait(&raw_full[rs], (u / LK_WS_RAW) & 1);
            const u8* rp = sR + rs * LK_WS_RAW_BYTES + tid * 144;
            const uint4 hdr = lk_lds128(rp);
            const float d = lk_h2f((u16)(hdr.x & 0xFFFF)), dmin = lk_h2f((u16)(hdr.x >> 16));
#pragma unroll
            for (int j = 0; j < 4; j++, q++) {
                const int st = q % STAGES;
                if (q >= STAGES) lk_mbar_wait(&empty_bar[st], ((q / STAGES) - 1) & 1);
                if (issuer) {
                    lk_mbar_expect_tx(&full_b[st], B_BYTES);
                    lk_tma_load_2d(sB + st * B_BYTES, &tmx, (cur.sb * 4 + j) * LK_WG_K, n0, &full_b[st]);
                }
                u32 sc, mn;
                q4_scale_min(hdr, 2 * j, sc, mn);
                const u32 s0 = lk_bcast2<BF16>(d * (float)sc), z0 = lk_bcast2<BF16>(-(dmin * (float)mn));
                q4_scale_min(hdr, 2 * j + 1, sc, mn);
                const u32 s1 = lk_bcast2<BF16>(d * (float)sc), z1 = lk_bcast2<BF16>(-(dmin * (float)mn));
                const u32 arow = sA0 + st * A_BYTES + a_row;
                // P::CONVERT off (an ablation, timing only; round 7's twenty-third step): the converters convert and
                // store nothing -- the A slot keeps whatever it held -- but keep the slot's protocol (waits, fence,
                // arrive), the raw ring and the activation TMA: what the shared-memory form costs without its conversion
                if constexpr (P::CONVERT) {
#pragma unroll
                    for (int hh = 0; hh < 2 / NCV; hh++) {   // nibble bytes 16h .. 16h+15 of the chunk's 32: k 16h.. and
                        const int h = NCV == 1 ? hh : wg;      // 32+16h.. (NCV=2: converter wg takes h = wg)
                        const uint4 v = lk_lds128(rp + 16 + 32 * j + 16 * h);
                        u32 lo[4][2], hi[4][2];
                        q4s_word<BF16>(v.x, s0, z0, s1, z1, lo[0], hi[0]);
                        q4s_word<BF16>(v.y, s0, z0, s1, z1, lo[1], hi[1]);
                        q4s_word<BF16>(v.z, s0, z0, s1, z1, lo[2], hi[2]);
                        q4s_word<BF16>(v.w, s0, z0, s1, z1, lo[3], hi[3]);
                        // 16-byte chunk c16 of the row = k 8 c16 .. 8 c16 + 7, at position c16 ^ (row & 7)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const u32 c_lo = 2 * h + e, c_hi = 4 + 2 * h + e;
                            lk_sts128(arow + ((c_lo ^ sw) << 4), make_uint4(lo[2 * e][0], lo[2 * e][1], lo[2 * e + 1][0], lo[2 * e + 1][1]));
                            lk_sts128(arow + ((c_hi ^ sw) << 4), make_uint4(hi[2 * e][0], hi[2 * e][1], hi[2 * e + 1][0], hi[2 * e + 1][1]));
                        }
                    }
                } else {
                    (void)s0; (void)z0; (void)s1; (void)z1; (void)arow;
                }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // generic writes -> wgmma's reads
                __syncwarp();
                if (lane == 0) lk_mbar_arrive(&full_a[st]);
                if (j == 0 && issuer && ahead.ok) {   // request super-block u + RAW - 1 (its slot held u - 1)
                    const int t = (int)(u + LK_WS_RAW - 1) % LK_WS_RAW;
                    if (u >= 1) lk_mbar_wait(&raw_empty[t], ((u - 1) / LK_WS_RAW) & 1);
                    lk_mbar_expect_tx(&raw_full[t], LK_WS_RAW_BYTES);
                    lk_tma_load_2d(sR + t * LK_WS_RAW_BYTES, &tmw, ahead.sb * 144,
                                   (ahead.seg.tile % mtiles) * LK_WG_M, &raw_full[t]);
                    ahead.next(nsb, dp_tiles, sk_seg, nsk);
                }
            }
            __syncwarp();
            if (lane == 0) lk_mbar_arrive(&raw_empty[rs]);   // this warp is done with the super-block's bytes
        }
        return;
    }
    // ------------------------------------------------------------------ consumer warpgroups
    if constexpr (NCV == 1) asm volatile("setmaxnreg.inc.sync.aligned.u32 208;\n");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 176;\n");
    const int warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int ctid = threadIdx.x - 128 * NCV;   // 0..255 over the two consumer warpgroups
    u32 q = 0;
    LkSeg seg;
    for (int si = 0; lk_segment(si, nsb, dp_tiles, sk_seg, nsk, seg); si++) {
        const int m0 = (seg.tile % mtiles) * LK_WG_M, n0 = (seg.tile / mtiles) * BN;
        const int r0 = m0 + (wg - NCV) * 64 + warp * 16 + g, r1 = r0 + 8;
        float acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
        for (int kc = 4 * seg.klo; kc < 4 * seg.khi; kc++, q++) {
            const int st = q % STAGES;
            lk_mbar_wait(&full_a[st], (q / STAGES) & 1);
            lk_mbar_wait(&full_b[st], (q / STAGES) & 1);
            lk_wgmma_fence_acc(acc);
            lk_wgmma_fence();
            const u32 sa = lk_smem_u32(sA + st * A_BYTES + (wg - NCV) * 8192), sb = lk_smem_u32(sB + st * B_BYTES);
#pragma unroll
            for (int s = 0; s < 4; s++) lk_wgmma_ss<BN, BF16>(acc, lk_desc_sw128(sa + 32 * s), lk_desc_sw128(sb + 32 * s));
            lk_wgmma_commit();
            lk_wgmma_fence_acc(acc);
            lk_wgmma_wait<1>();
            if (q > 0 && lane == 0) lk_mbar_arrive(&empty_bar[(q - 1) % STAGES]);
        }
        lk_wgmma_wait<0>();
        lk_wgmma_fence_acc(acc);
        lk_finish_segment<BN, 0, P>(acc, seg, Y, nt, od, nsb, tiles, dp_tiles, ws, flags, r0, r1, n0, c, ctid,
                                    split_g, 0u, nullptr, nullptr, 0u);
    }
}
