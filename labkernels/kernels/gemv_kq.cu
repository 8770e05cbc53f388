// labkernels round 9: k-quant matrix-vector and small-batch products for decode (nt = 1..16).
//
// Y[nt, od] (f32) = X[nt, id] (f16 or f32, read directly) x W[od, id]^T, W q4_K (the GGUF rows as uploaded) or q6_K
// (the same bytes repacked once at load into planes: labkernels.gemv.repack_q6k). Every weight byte is read once per
// launch; the tensor cores do the products: mma.sync m16n8k16 f16 x f16 -> f32, the weights dequantized in registers
// (exact: the 4/6-bit code is made an f16 with a magic exponent and an exact subtraction, then one rounding of
// q*S + B (q4_K) or (q-32)*S (q6_K) with the f16 scales S = fl16(d*sc), B = fl16(-dmin*m)); the activations are the
// mma's B operand (tokens are its n: 8 per n8 tile, NT8 tiles), so nt = 1..8 costs one mma per k-step like nt = 1.
//
// The k permutation (labkernels.gemv docstring): lane (g = lane/4, c = lane%4) owns physical k 64c..64c+63 of every
// super-block, i.e. bytes 32c..32c+31 of the q4_K qs (low nibbles: k 64c+p, high: 64c+32+p, p = 0..31). Word m of
// those bytes gives 4 f16x2 pairs: P0 (bytes 0,2 low nibbles: k 4m, 4m+2), P2 (bytes 1,3 low: 4m+1, 4m+3), P1, P3
// (the same, high nibbles: 32+...). One k-step of the mma takes P0/P2 (or P1/P3) of rows g and g+8 as A, and the
// activations at the same four k as B: a permutation of k applied to both operands, so the product is unchanged.
//
// CTA: WARPS warps, each MT m16 tiles (16 rows each) -- WARPS*MT*16 rows -- over super-blocks [sb0, sb1) of split
// blockIdx.y of S. S > 1: partial sums go to ws[s][nt][od] and the CTA arriving last for its rows adds them in the
// order s = 0..S-1 (deterministic) and resets its counter (self-cleaning: a captured graph replays it).
//
// FORM (template parameter; FORM=0 is the form above): FORM=1 (q4_K, NT8=1: nt <= 8) feeds the mma the EXACT f16
// products sc*q (sc the 6-bit sub-block scale, q the code: <= 63*15 = 945, an integer, exact in f16) made by one
// LOP3 (the magic exponent: (q | 0x6400) as f16 = 1024 + q) and one HFMA2 per pair ((1024+q)*sc - 1024*sc; the high
// nibbles (1024+16q)*(sc/16) - 64*sc), into a per-super-block f32 partial sum that is scaled by d in f32. The min
// term dmin * sum_j m_j * I_j (I_j the sum of the activations over sub-block j) goes through two more mma: an
// "indicator" mma per k-step (A = the activations, tokens as its rows; B = the 0/1 indicator of each k's sub-block:
// a constant per lane) gives I[n][j] in f32, laid out as exactly the B fragment of the second mma (k = j), which
// multiplies the exact f16 mins m_j of the rows with I split into two f16 halves (hi = fl16(I), lo = fl16(I - hi));
// that sum is scaled by -dmin in f32. Exact function (labkernels.gemv.exact_weights_v2): gguf's dequantized weights
// d*sc*q - dmin*m in float64 times the f16-rounded activations, up to f32 summation (and I's ~2^-22 split error).
// Range: |I| < 65504 (hi is an f16; a larger sub-block sum of the activations gives inf/NaN).
// FORM=3 (round 9 step 6; q4_K, nt <= 8, MT=1): FORM=1's function and arithmetic in a loop that holds the next
// super-block's weight bytes in registers while the current one is computed (a register double buffer; see the
// kernel body), with the CTA's warps on ONE group of 16 rows, the super-blocks of the CTA's split cut into WARPS
// consecutive ranges (warp w the w-th), the warps' partial sums added in shared memory in warp order by warp 0: the
// split over K a CTA folds itself, with no workspace, fence or arrival atomic (S = 1). At S = 1 it computes what
// FORM=1 computes at split WARPS, bit for bit (the same ranges, the same left-to-right sum of the partials); at S > 1
// the sum has two levels (the warps', then the splits').
//
// Round 9 step 3's PIPE form (FORM=1's bytes staged through a cp.async shared-memory ring, PIPE in {2, 4}) lost at
// every point and left this source; commit a1cf954 holds it (labkernels.rounds.r09_decode: the retired gemv_step3).
// Round 9 step 5's FORM=2 (FORM=1's arithmetic with the register double buffer, the warps on their own rows: FORM=3's
// loop without the warps' split of the super-blocks) lost almost everywhere (FORM=2 / FORM=1 at the one-wave split,
// q4_K nt=1 f16: 1.07-1.08 on the three large shapes, predicted 0.72-0.9; 1.10 at 4096x4096, predicted 0.85-1.0; H200
// run 20261207T131432Z-h200-0b009b5) and left this source; commit 90fd260 holds it (labkernels.rounds.r09_decode: the
// retired gemv_step5). FORM=3 keeps its loop.
// Round 9 step 7's FORM=4 and FORM=5 (FORM=1's code under a __launch_bounds__ register cap of 6 / 8 CTAs an SM: 80 /
// 64 registers, 24 / 32 warps an SM where FORM=1 has 16) were slower at every f16 point (FORM=4 / FORM=1 1.20, FORM=5
// / FORM=1 1.31 at q4_K 4096x14336 nt=1 f16, one-wave split; H100 run 20261207T195543Z-h10080gbhbm3-045babc) and left
// this source; commit 7894b07 holds them (labkernels.rounds.r09_decode: the retired gemv_step7).
// Round 9 step 8's PF=1 build (each CTA prefetching its weight bytes into L2 with cp.async.bulk.prefetch before its
// PDL wait) made the decode slower (synthetic 7B tokens/s PF=1 / PF=0 0.945, synthetic Gemma 3 0.969, predicted
// 1.03-1.12 / 1.02-1.15; H100 run 20261207T195308Z-h10080gbhbm3-045babc) and left this source with its template
// parameter PF; commit 7894b07 holds it (the retired gemv_step8). Every kernel begins with LK_PDL_ENTRY() as before.
#include "common.cuh"

// ---- f16x2 arithmetic through PTX (NVRTC builds have no cuda_fp16.h here)
__device__ __forceinline__ u32 lk_hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 lk_hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u32 lk_hmul2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
// two floats -> f16x2 (lo in bits 0-15), round to nearest even
__device__ __forceinline__ u32 lk_pack_h2(float lo, float hi) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
__device__ __forceinline__ float lk_h2f_lo(u32 a) {
    float f;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, l; }" : "=f"(f) : "r"(a));
    return f;
}
__device__ __forceinline__ float lk_h2f_hi(u32 a) {
    float f;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(a));
    return f;
}
__device__ __forceinline__ void lk_mma_f16_16816(float c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// streaming 16-byte load of weight bytes (read once: no L1 allocation)
__device__ __forceinline__ uint4 lk_ldg_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// (a & b) | c and a | (b & c) in one LOP3 each: written as PTX so that ptxas keeps the magic exponent in a register
// (a C expression with two constants compiled to two LOP3s: an AND with one immediate, then an OR with the other)
__device__ __forceinline__ u32 lk_and_or(u32 a, u32 b, u32 c) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 lk_or_and(u32 a, u32 b, u32 c) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xF8;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

#define LK_H2_1024 0x64006400u      // (1024, 1024)
#define LK_H2_M1024 0xE400E400u     // (-1024, -1024)
#define LK_H2_M1152 0xE480E480u     // (-1152, -1152)
#define LK_H2_1056 0x64206420u      // (1056, 1056)
#define LK_H2_1_16 0x2C002C00u      // (1/16, 1/16)
#define LK_H2_M64 0xD400D400u       // (-64, -64)
#define LK_H2_M96 0xD600D600u       // (-96, -96)

// word i (0..3) of a 16-byte load (i is a compile-time constant after unrolling: a register, no select)
__device__ __forceinline__ u32 lk_word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// ---- the weight types: per row and super-block, one lane's 64 weights as 8 words (q4_K: 2 x 16 bytes of qs; q6_K:
// 2 x 16 bytes of ql' and 16 bytes of qh') and its scales; dequant() gives the four f16x2 pairs of word m
template <int QT>
struct KqRow;

template <>
struct KqRow<4> {
    uint4 q0, q1;   // qs bytes 32c..32c+31
    u32 s_lo, b_lo, s_hi, b_hi;   // (S, S) and (B, B) of sub-blocks 2c (low nibbles) and 2c+1 (high)

    // GGUF rows [od][nsb * 144]: d, dmin (f16), 12 scale bytes, 128 qs bytes per super-block
    __device__ __forceinline__ void load(const u8* __restrict__ W, int row, int sb, int nsb, int od, int c) {
        const u8* blk = W + ((long long)row * nsb + sb) * 144;
        const uint4 h = __ldg((const uint4*)blk);
        q0 = lk_ldg_stream(blk + 16 + 32 * c);
        q1 = lk_ldg_stream(blk + 32 + 32 * c);
        // scales and mins of sub-blocks j = 2c, 2c+1 (get_scale_min_k4) as 16-bit lanes: bytes jj = j & 3 and jj+1 of
        // q[0..3] (h.y), q[4..7] (h.z), q[8..11] (h.w) moved to bits 0-7 / 16-23 by one PRMT each; both formulas
        // computed and selected per lane (no divergent branch between the quad's lanes)
        const u32 sel = (c & 1) ? 0x4342u : 0x4140u;      // jj = 2c & 3: 0 for lanes 0, 2; 2 for lanes 1, 3
        const u32 by = __byte_perm(h.y, 0u, sel), bz = __byte_perm(h.z, 0u, sel), bw = __byte_perm(h.w, 0u, sel);
        const u32 sc = c < 2 ? (by & 0x003F003Fu) : ((bw & 0x000F000Fu) | ((by >> 2) & 0x00300030u));
        const u32 mn = c < 2 ? (bz & 0x003F003Fu) : (((bw >> 4) & 0x000F000Fu) | ((bz >> 2) & 0x00300030u));
        // (sc0, sc1) and (m0, m1) as exact f16 integers (magic exponent, exact subtraction), then one rounding each
        // of d*sc and -dmin*m (f16 products of an 11-bit and a 6-bit number: the same value as fl16(f32 product))
        const u32 dd = __byte_perm(h.x, h.x, 0x1010u), ndm = __byte_perm(h.x, h.x, 0x3232u) ^ 0x80008000u;
        const u32 S = lk_hmul2(lk_hfma2(sc | LK_H2_1024, 0x3C003C00u, LK_H2_M1024), dd);
        const u32 B = lk_hmul2(lk_hfma2(mn | LK_H2_1024, 0x3C003C00u, LK_H2_M1024), ndm);
        s_lo = __byte_perm(S, S, 0x1010u);
        s_hi = __byte_perm(S, S, 0x3232u);
        b_lo = __byte_perm(B, B, 0x1010u);
        b_hi = __byte_perm(B, B, 0x3232u);
    }
    __device__ __forceinline__ u32 word(int m) const { return lk_word(m < 4 ? q0 : q1, m & 3); }
    // P0 (k 4m, 4m+2), P2 (4m+1, 4m+3) of sub-block 2c; P1, P3 (32 + the same) of 2c+1
    __device__ __forceinline__ void dequant(int m, u32& p0, u32& p1, u32& p2, u32& p3) const {
        const u32 w = word(m), w8 = w >> 8;
        const u32 l01 = lk_and_or(w, 0x000F000Fu, LK_H2_1024), l23 = lk_and_or(w8, 0x000F000Fu, LK_H2_1024);
        const u32 h01 = lk_and_or(w, 0x00F000F0u, LK_H2_1024), h23 = lk_and_or(w8, 0x00F000F0u, LK_H2_1024);
        p0 = lk_hfma2(lk_hsub2(l01, LK_H2_1024), s_lo, b_lo);                 // q exact, then q*S + B once
        p2 = lk_hfma2(lk_hsub2(l23, LK_H2_1024), s_lo, b_lo);
        p1 = lk_hfma2(lk_hfma2(h01, LK_H2_1_16, LK_H2_M64), s_hi, b_hi);      // (1024 + 16q)/16 - 64 = q exact
        p3 = lk_hfma2(lk_hfma2(h23, LK_H2_1_16, LK_H2_M64), s_hi, b_hi);
    }
};

// FORM=1's q4_K row: per row and super-block, (sc, sc) and (-1024 sc, -1024 sc) of sub-block 2c, (sc/16, sc/16) and
// (-64 sc, -64 sc) of 2c+1 (all exact in f16), the mins (m_2c, m_2c+1) as exact f16, d and -dmin in f32
struct KqRow4v2 {
    uint4 q0, q1;
    u32 s_lo, c_lo, s_hi, c_hi, mm;
    float d, ndmin;

    __device__ __forceinline__ void load(const u8* __restrict__ W, int row, int sb, int nsb, int od, int c) {
        const u8* blk = W + ((long long)row * nsb + sb) * 144;
        const uint4 h = __ldg((const uint4*)blk);
        q0 = lk_ldg_stream(blk + 16 + 32 * c);
        q1 = lk_ldg_stream(blk + 32 + 32 * c);
        decode(h, c);
    }
    // the scales of the 16-byte header h (d, dmin, the 12 scale bytes)
    __device__ __forceinline__ void decode(const uint4& h, int c) {
        const u32 sel = (c & 1) ? 0x4342u : 0x4140u;      // the scale decode of KqRow<4>::load
        const u32 by = __byte_perm(h.y, 0u, sel), bz = __byte_perm(h.z, 0u, sel), bw = __byte_perm(h.w, 0u, sel);
        const u32 sc = c < 2 ? (by & 0x003F003Fu) : ((bw & 0x000F000Fu) | ((by >> 2) & 0x00300030u));
        const u32 mn = c < 2 ? (bz & 0x003F003Fu) : (((bw >> 4) & 0x000F000Fu) | ((bz >> 2) & 0x00300030u));
        const u32 SC = lk_hsub2(sc | LK_H2_1024, LK_H2_1024);     // (sc0, sc1) exact
        mm = lk_hsub2(mn | LK_H2_1024, LK_H2_1024);               // (m0, m1) exact
        s_lo = __byte_perm(SC, SC, 0x1010u);
        const u32 shi = __byte_perm(SC, SC, 0x3232u);
        c_lo = lk_hmul2(s_lo, LK_H2_M1024);                        // -1024 sc: |.| <= 64512, exact
        s_hi = lk_hmul2(shi, LK_H2_1_16);                          // sc / 16 exact
        c_hi = lk_hmul2(shi, LK_H2_M64);                           // -64 sc exact
        d = lk_h2f_lo(h.x);
        ndmin = -lk_h2f_hi(h.x);
    }
    __device__ __forceinline__ u32 word(int m) const { return lk_word(m < 4 ? q0 : q1, m & 3); }
    // P0..P3 of word m as exact f16 products sc*q
    __device__ __forceinline__ void dequant(int m, u32& p0, u32& p1, u32& p2, u32& p3) const {
        const u32 w = word(m), w8 = w >> 8;
        const u32 l01 = lk_and_or(w, 0x000F000Fu, LK_H2_1024), l23 = lk_and_or(w8, 0x000F000Fu, LK_H2_1024);
        const u32 h01 = lk_and_or(w, 0x00F000F0u, LK_H2_1024), h23 = lk_and_or(w8, 0x00F000F0u, LK_H2_1024);
        p0 = lk_hfma2(l01, s_lo, c_lo);       // (1024 + q) sc - 1024 sc = q sc, one exact rounding
        p2 = lk_hfma2(l23, s_lo, c_lo);
        p1 = lk_hfma2(h01, s_hi, c_hi);       // (1024 + 16 q) sc/16 - 64 sc = q sc
        p3 = lk_hfma2(h23, s_hi, c_hi);
    }
};

template <>
struct KqRow<6> {
    uint4 q0, q1, h;   // ql' bytes 32c..32c+31, qh' bytes 16c..16c+15
    u32 s[4];          // (S, S) of sub-blocks 4c .. 4c+3

    // the planes of labkernels.gemv.repack_q6k: QL' [od][nsb][128], QH' [od][nsb][64], SC [od][nsb][16], D [od][nsb]
    __device__ __forceinline__ void load(const u8* __restrict__ W, int row, int sb, int nsb, int od, int c) {
        const long long b = (long long)row * nsb + sb, n = (long long)od * nsb;
        q0 = lk_ldg_stream(W + b * 128 + 32 * c);
        q1 = lk_ldg_stream(W + b * 128 + 32 * c + 16);
        h = lk_ldg_stream(W + n * 128 + b * 64 + 16 * c);
        const u32 sc4 = __ldg((const u32*)(W + n * 192 + b * 16 + 4 * c));
        const u32 d = __ldg((const u16*)(W + n * 208 + b * 2));
        const u32 dd = d | (d << 16);
        // the four int8 scales as exact f16 (sign flipped: sc + 128 in a byte, magic exponent, minus 1152), then one
        // rounding of d*sc each
        const u32 s01 = lk_hmul2(lk_hfma2((__byte_perm(sc4, 0u, 0x4140u) ^ 0x00800080u) | LK_H2_1024, 0x3C003C00u,
                                          LK_H2_M1152), dd);
        const u32 s23 = lk_hmul2(lk_hfma2((__byte_perm(sc4, 0u, 0x4342u) ^ 0x00800080u) | LK_H2_1024, 0x3C003C00u,
                                          LK_H2_M1152), dd);
        s[0] = __byte_perm(s01, s01, 0x1010u);
        s[1] = __byte_perm(s01, s01, 0x3232u);
        s[2] = __byte_perm(s23, s23, 0x1010u);
        s[3] = __byte_perm(s23, s23, 0x3232u);
    }
    __device__ __forceinline__ u32 word(int m) const { return lk_word(m < 4 ? q0 : q1, m & 3); }
    __device__ __forceinline__ void dequant(int m, u32& p0, u32& p1, u32& p2, u32& p3) const {
        const u32 w = word(m), w8 = w >> 8;
        const int u = m >> 1;
        const u32 hw = lk_word(h, u);
        // word 2u reads its high bits at (P0 0/16, P1 4/20, P2 2/18, P3 6/22), word 2u+1 at 8.. higher (repack_q6k)
        const u32 ha = (m & 1) ? hw >> 4 : hw << 4, hb = (m & 1) ? hw >> 6 : hw << 2;
        const u32 l01 = lk_or_and(lk_and_or(w, 0x000F000Fu, LK_H2_1024), ha, 0x00300030u);
        const u32 l23 = lk_or_and(lk_and_or(w8, 0x000F000Fu, LK_H2_1024), hb, 0x00300030u);
        const u32 h01 = lk_or_and(lk_and_or(w, 0x00F000F0u, LK_H2_1024), ha, 0x03000300u);
        const u32 h23 = lk_or_and(lk_and_or(w8, 0x00F000F0u, LK_H2_1024), hb, 0x03000300u);
        const u32 slo = s[m >> 2], shi = s[2 + (m >> 2)];
        p0 = lk_hmul2(lk_hsub2(l01, LK_H2_1056), slo);                         // 1024 + q - 1056 = q - 32, exact
        p2 = lk_hmul2(lk_hsub2(l23, LK_H2_1056), slo);
        p1 = lk_hmul2(lk_hfma2(h01, LK_H2_1_16, LK_H2_M96), shi);             // (1024 + 16q)/16 - 96 = q - 32
        p3 = lk_hmul2(lk_hfma2(h23, LK_H2_1_16, LK_H2_M96), shi);
    }
};

// ---- the activations of one token (n) for one lane: 64 values at k 64c.. of a super-block, as the B fragments of
// its 16 k-steps (low step m: k 4m..4m+3, high step m: 32+4m..): (x0, x2) and (x1, x3)
template <int XF32>
struct XSeg;

template <>
struct XSeg<0> {
    uint2 v[16];   // f16: 4 values a step
    __device__ __forceinline__ void load(const void* X, long long off, bool ok) {
        const uint4* p = (const uint4*)((const u16*)X + off);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint4 t = ok ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
            v[2 * i] = make_uint2(t.x, t.y);
            v[2 * i + 1] = make_uint2(t.z, t.w);
        }
    }
    // step s = 0..15 (s < 8: low step s, else high step s - 8): the values x[4s'..] with s' = s (k offsets 4s)
    __device__ __forceinline__ void frag(int s, u32& b0, u32& b1) const {
        b0 = __byte_perm(v[s].x, v[s].y, 0x5410);   // (x0, x2)
        b1 = __byte_perm(v[s].x, v[s].y, 0x7632);   // (x1, x3)
    }
};

template <>
struct XSeg<1> {
    float4 v[16];  // f32, converted to f16 at the fragment (round to nearest even)
    __device__ __forceinline__ void load(const void* X, long long off, bool ok) {
        const float4* p = (const float4*)((const float*)X + off);
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = ok ? __ldg(p + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __device__ __forceinline__ void frag(int s, u32& b0, u32& b1) const {
        b0 = lk_pack_h2(v[s].x, v[s].z);
        b1 = lk_pack_h2(v[s].y, v[s].w);
    }
};

// FORM=1: one super-block of a warp (its rows' decoded KqRow4v2 and one token tile of activations) into acc: the
// weight mma on the exact sc*q, the indicator mma (the sub-block sums of the activations), the min mma, d and -dmin
// applied in f32
template <int XF32, int MT>
__device__ __forceinline__ void lk_form1_superblock(const KqRow4v2 (&wr)[MT][2], const XSeg<XF32>& xs, u32 ind_lo,
                                                    u32 ind_hi, float (&acc)[MT][1][4]) {
    float part[MT][4], ind[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        ind[i] = 0.f;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) part[mt][i] = 0.f;
    }
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        u32 b[4];
        xs.frag(m, b[0], b[1]);
        xs.frag(8 + m, b[2], b[3]);
        // I[n][j] += x[n][k] Ind[k][j]: the activations as A (token g in rows g; rows g+8 empty)
        lk_mma_f16_16816(ind, b[0], b[1], b[2], b[3], ind_lo, ind_hi);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            u32 a0[4], a1[4];
            wr[mt][0].dequant(m, a0[0], a0[1], a0[2], a0[3]);
            wr[mt][1].dequant(m, a1[0], a1[1], a1[2], a1[3]);
            lk_mma_f16_16816(part[mt], a0[0], a1[0], a0[2], a1[2], b[0], b[1]);
            lk_mma_f16_16816(part[mt], a0[1], a1[1], a0[3], a1[3], b[2], b[3]);
        }
    }
    // ind[0] + ind[2], ind[1] + ind[3] = I[token g][sub-block 2c, 2c+1]: the B fragment (k = j, n = g) of
    // the min mma, as hi + lo f16 halves (b0: k 2c, 2c+1; b1: k 2c+8, 2c+9, the A fragment repeats the mins)
    const float i0 = ind[0] + ind[2], i1 = ind[1] + ind[3];
    const u32 ihi = lk_pack_h2(i0, i1);
    const u32 ilo = lk_pack_h2(i0 - lk_h2f_lo(ihi), i1 - lk_h2f_hi(ihi));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        float mins[4] = {0.f, 0.f, 0.f, 0.f};
        lk_mma_f16_16816(mins, wr[mt][0].mm, wr[mt][1].mm, wr[mt][0].mm, wr[mt][1].mm, ihi, ilo);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const KqRow4v2& r = wr[mt][i >> 1];
            acc[mt][0][i] = fmaf(r.d, part[mt][i], acc[mt][0][i]);
            acc[mt][0][i] = fmaf(r.ndmin, mins[i], acc[mt][0][i]);
        }
    }
}

template <int QT, int XF32, int NT8, int MT, int WARPS, int FORM>
// __launch_bounds__ minimum 3 CTAs an SM: a cap of 170 registers (without it ptxas took 128 for q6_K f16 NT8=1 MT=2
// and spilled 4 bytes; with it every instantiation builds without spills, 62-168 registers); 2 at WARPS=8 (FORM=3)
__global__ void __launch_bounds__(WARPS * 32, WARPS >= 8 ? 2 : 3) gemv_kq_kernel(const u8* __restrict__ W, const void* __restrict__ X,
                                                            float* __restrict__ Y, float* __restrict__ ws,
                                                            int* __restrict__ counters, int nt, int od, int id, int S) {
    LK_PDL_ENTRY();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int nsb = id >> 8;
    // FORM=3: every warp of the CTA on the same 16 rows, warp w on the w-th of WARPS ranges of the split's super-blocks
    constexpr bool KW = FORM == 3;
    int sb0 = (int)((long long)blockIdx.y * nsb / S), sb1 = (int)((long long)(blockIdx.y + 1) * nsb / S);
    if constexpr (KW) {
        const int a = sb0, n = sb1 - sb0;
        sb0 = a + (int)((long long)warp * n / WARPS);
        sb1 = a + (int)((long long)(warp + 1) * n / WARPS);
    }
    const int rowbase = (KW ? blockIdx.x : blockIdx.x * WARPS + warp) * (MT * 16);
    int rows[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        rows[mt][0] = min(rowbase + mt * 16 + g, od - 1);       // rows past od read the last row; never stored
        rows[mt][1] = min(rowbase + mt * 16 + g + 8, od - 1);
    }
    float acc[MT][NT8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int t = 0; t < NT8; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][t][i] = 0.f;

    if constexpr (KW) {
        // FORM=3's loop over its warp's super-blocks [sb0, sb1): FORM=1's arithmetic (the same lk_form1_superblock:
        // FORM=1's bits over the same super-blocks) with the weight bytes of super-block sb + 1 (header and the lane's
        // 32 code bytes, per row) loaded into registers before super-block sb is computed -- a register double buffer:
        // a warp keeps its next loads in flight through its compute instead of issuing them after it. The activations
        // load at sb's top as in FORM=1. MT=1 only (MT=2 spills under the 3-CTA register cap). Round 9 step 5 ran
        // this loop with the warps on their own rows (FORM=2, retired: commit 90fd260).
        static_assert(QT == 4 && NT8 == 1 && MT == 1, "FORM=3 is q4_K at nt <= 8, MT=1");
        const u32 ind_lo = g == 2 * c ? 0x3C003C00u : 0u, ind_hi = g == 2 * c + 1 ? 0x3C003C00u : 0u;
        uint4 nh[MT][2], nq0[MT][2], nq1[MT][2];
        auto fetch = [&](int sb) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const u8* blk = W + ((long long)rows[mt][h] * nsb + sb) * 144;
                    nh[mt][h] = __ldg((const uint4*)blk);
                    nq0[mt][h] = lk_ldg_stream(blk + 16 + 32 * c);
                    nq1[mt][h] = lk_ldg_stream(blk + 32 + 32 * c);
                }
        };
        const long long xoff = (long long)min(g, nt - 1) * id + 64 * c;
        if (sb0 < sb1) fetch(sb0);
        for (int sb = sb0; sb < sb1; ++sb) {
            KqRow4v2 wr[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    wr[mt][h].q0 = nq0[mt][h];
                    wr[mt][h].q1 = nq1[mt][h];
                    wr[mt][h].decode(nh[mt][h], c);
                }
            if (sb + 1 < sb1) fetch(sb + 1);
            XSeg<XF32> xs;
            xs.load(X, xoff + sb * 256, g < nt);
            lk_form1_superblock<XF32, MT>(wr, xs, ind_lo, ind_hi, acc);
        }
    } else if constexpr (FORM == 1) {
        static_assert(QT == 4 && NT8 == 1, "FORM=1 is q4_K at nt <= 8");
        // the indicator B fragment (k-rows x columns j = sub-blocks): the indicator mma's A is the four activation
        // fragments of step m as they are (b0, b1, b2, b3): columns 2c, 2c+1 hold lane c's low-step values (sub-block
        // 2c), columns 2c+8, 2c+9 its high-step values (2c+1); rows g and g+8 both hold token g (b1, b3 in row g+8)
        const u32 ind_lo = g == 2 * c ? 0x3C003C00u : 0u, ind_hi = g == 2 * c + 1 ? 0x3C003C00u : 0u;
        for (int sb = sb0; sb < sb1; ++sb) {
            KqRow4v2 wr[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                wr[mt][0].load(W, rows[mt][0], sb, nsb, od, c);
                wr[mt][1].load(W, rows[mt][1], sb, nsb, od, c);
            }
            XSeg<XF32> xs;
            xs.load(X, (long long)min(g, nt - 1) * id + sb * 256 + 64 * c, g < nt);
            lk_form1_superblock<XF32, MT>(wr, xs, ind_lo, ind_hi, acc);
        }
    } else
    for (int sb = sb0; sb < sb1; ++sb) {
        KqRow<QT> wr[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            wr[mt][0].load(W, rows[mt][0], sb, nsb, od, c);
            wr[mt][1].load(W, rows[mt][1], sb, nsb, od, c);
        }
        XSeg<XF32> xs[NT8];
#pragma unroll
        for (int t = 0; t < NT8; ++t) {
            const int n = t * 8 + g;
            xs[t].load(X, (long long)min(n, nt - 1) * id + sb * 256 + 64 * c, n < nt);
        }
#pragma unroll
        for (int m = 0; m < 8; ++m) {
            u32 b[NT8][4];
#pragma unroll
            for (int t = 0; t < NT8; ++t) {
                xs[t].frag(m, b[t][0], b[t][1]);        // low step: k 4m..
                xs[t].frag(8 + m, b[t][2], b[t][3]);    // high step: k 32 + 4m..
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                u32 a0[4], a1[4];   // rows g, g+8: P0, P1, P2, P3
                wr[mt][0].dequant(m, a0[0], a0[1], a0[2], a0[3]);
                wr[mt][1].dequant(m, a1[0], a1[1], a1[2], a1[3]);
#pragma unroll
                for (int t = 0; t < NT8; ++t) {
                    lk_mma_f16_16816(acc[mt][t], a0[0], a1[0], a0[2], a1[2], b[t][0], b[t][1]);   // low step
                    lk_mma_f16_16816(acc[mt][t], a0[1], a1[1], a0[3], a1[3], b[t][2], b[t][3]);   // high step
                }
            }
        }
    }

    // FORM=3: the warps' partial sums of the same fragment positions added by warp 0 in warp order (acc of warp 0,
    // then + warp 1, + warp 2, ...: FORM=1's split fold over the same ranges); only warp 0 stores
    if constexpr (KW) {
        __shared__ float4 red[WARPS > 1 ? WARPS - 1 : 1][32];
        if (warp > 0) red[warp - 1][lane] = make_float4(acc[0][0][0], acc[0][0][1], acc[0][0][2], acc[0][0][3]);
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int w = 1; w < WARPS; ++w) {
                const float4 v = red[w - 1][lane];
                acc[0][0][0] += v.x;
                acc[0][0][1] += v.y;
                acc[0][0][2] += v.z;
                acc[0][0][3] += v.w;
            }
        }
    }
    const bool writer = !KW || warp == 0;
    // C fragment: acc[mt][t] = (row g, token 2c), (row g, 2c+1), (row g+8, 2c), (row g+8, 2c+1) of tile (mt, t);
    // stored into Y (one split) or into this split's [nt][od] slice of the workspace
    float* dst = S == 1 ? Y : ws + (long long)blockIdx.y * nt * od;
    if (writer) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int t = 0; t < NT8; ++t)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int r = rowbase + mt * 16 + g + 8 * (i >> 1), n = t * 8 + 2 * c + (i & 1);
                    if (r < od && n < nt) dst[(long long)n * od + r] = acc[mt][t][i];
                }
    }
    if (S == 1) return;
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1) == S - 1;
    __syncthreads();
    if (!last || !writer) return;
    __threadfence();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int t = 0; t < NT8; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = rowbase + mt * 16 + g + 8 * (i >> 1), n = t * 8 + 2 * c + (i & 1);
                if (r < od && n < nt) {
                    float v = 0.f;
                    for (int s = 0; s < S; ++s) v += __ldcg(ws + ((long long)s * nt + n) * od + r);   // in order of s
                    Y[(long long)n * od + r] = v;
                }
            }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;   // ready for the next launch (or graph replay)
}
