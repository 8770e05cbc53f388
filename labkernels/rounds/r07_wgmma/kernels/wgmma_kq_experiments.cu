// Round 7's exploratory and ablation builds of the wgmma kernels (sm_90a): the production device code
// (labkernels/kernels/wgmma_kq.cuh) with the hooks of a build policy switched on, and the 64-row KPAIR body -- each
// selected by its -D name, which is the build's identity in the cubin cache and in every recorded run's `defines`
// (labkernels.wgmma.gemm(..., defines=...) and LABKERNELS_WG_DEFINES build this file instead of wgmma_kq.cu, with
// the same registry instantiations; their steps: labkernels.rounds.r07_wgmma.steps). Names and what they do:
//
// * LK_EXP_TRACE      per-CTA %globaltimer / clock64 stamps at the phases of a launch (trace steps 14, 16, 25)
// * LK_ABLATE_NOLOAD  the main loop loads no weights (reconverts the segment's first super-block; step 11)
// * LK_ABLATE_NOCONV  the main loop converts nothing (steps 9, 11, 23, 24); timing only, as every LK_ABLATE_*
// * LK_ABLATE_NOFIX   no stream-K partial sums or fold; LK_ABLATE_NOSTORE  no store of Y (the cost scan)
// * LK_ABLATE_EMPTY   every CTA returns at once: the launch floor (step 16)
// * LK_EXP_KPAIR      one 64-row x 256-token tile per CTA, k split between the consumer warpgroups, 2-CTA clusters
//                     multicasting the activations (step 21); its forms LK_EXP_KPAIR_FIN (step 26) and ablations
//                     LK_ABLATE_HALFB (22), LK_ABLATE_DECOUPLE (24), LK_ABLATE_HALFY (28)
//
// Forms that lost left this file (LK_EXP_WTMA, LK_EXP_TMAPF, LK_EXP_SPLITFIN, LK_EXP_OLDCONV, LK_EXP_KPAIR_EARLY,
// LK_EXP_KPAIR_OVERLAP, LK_EXP_KPAIR_REQ_PRODUCER / _CONSUMERS, and before them LK_EXP_WSTAGE, LK_EXP_SWAPRED): the
// commit that holds each and the command that rebuilds it are in the round's retired steps.
#include "wgmma_kq.cuh"

#if defined(LK_EXP_WTMA) || defined(LK_EXP_TMAPF) || defined(LK_EXP_SPLITFIN) || defined(LK_EXP_OLDCONV) ||                \
    defined(LK_EXP_KPAIR_EARLY) || defined(LK_EXP_KPAIR_OVERLAP) || defined(LK_EXP_KPAIR_REQ_PRODUCER) ||              \
    defined(LK_EXP_KPAIR_REQ_CONSUMERS)
#error "a retired round-7 form: it is built at commit 4a8dcd9 (labkernels.rounds.r07_wgmma.steps lists its step)"
#endif

// ---- LK_EXP_TRACE (labkernels.wgmma.trace_launch): the first consumer thread of each CTA writes
// %globaltimer (ns) and clock64 at the phases of its launch -- entry, setup done, first activation tile, and per
// stream-K segment (up to 4) its start, the end of its main loop and the end of its fix-up/store; slot 15 = %smid
#ifdef LK_EXP_TRACE
#define LK_TRACE_EVENTS 16
#define LK_TRACE_CTAS 1024
__device__ unsigned long long lk_trace_ns[LK_TRACE_CTAS * LK_TRACE_EVENTS];
__device__ unsigned long long lk_trace_clk[LK_TRACE_CTAS * LK_TRACE_EVENTS];
__device__ __forceinline__ void lk_trace(int ev) {
    if (threadIdx.x != 128 || blockIdx.x >= LK_TRACE_CTAS || ev >= LK_TRACE_EVENTS - 1) return;
    unsigned long long t, k;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(k));
    lk_trace_ns[blockIdx.x * LK_TRACE_EVENTS + ev] = t;
    lk_trace_clk[blockIdx.x * LK_TRACE_EVENTS + ev] = k;
    if (ev == 0) {
        unsigned int sm;
        asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
        lk_trace_ns[blockIdx.x * LK_TRACE_EVENTS + LK_TRACE_EVENTS - 1] = sm;
    }
}
#define LK_TRACE(ev) lk_trace(ev)
#else
#define LK_TRACE(ev) \
    do {             \
    } while (0)
#endif

// the build's policy: production's (LkPlain) with this build's hooks on
struct LkBuild : LkPlain {
#ifdef LK_EXP_TRACE
    static constexpr bool TRACE = true;
    __device__ __forceinline__ static void stamp(int ev) { lk_trace(ev); }
#endif
#ifdef LK_ABLATE_NOLOAD
    static constexpr bool LOADS = false;
#endif
#ifdef LK_ABLATE_NOCONV
    static constexpr bool CONVERT = false;
#endif
#ifdef LK_ABLATE_NOFIX
    static constexpr bool FIXUP = false;
#endif
#ifdef LK_ABLATE_NOSTORE
    static constexpr bool STORE = false;
#endif
};

// ---- LK_EXP_KPAIR (exploratory build; labkernels.wgmma.kpair_ab): a tile of 64 weight rows x 256 tokens per CTA,
// its two consumer warpgroups on the same 64 rows, each over every other super-block (warpgroup 1: super-blocks 0, 2,
// 4, ...; warpgroup 2: 1, 3, 5, ...; each loads its next one a whole super-block ahead, as the plain loop does), their
// two partial sums added through the idle ring at the end
// -- no workspace, no flag, no second CTA per tile. The k scan (run 20261203T165118Z) had the BN=256 split launch at
// cuBLAS's cost per k with ~5.5 us more per launch, and BN=128 (one tile per CTA, no split) near cuBLAS's fixed cost
// with a dearer loop: this is one tile per CTA with BN=256's loop (each weight converted once per 256 tokens) on
// od/64 x nt/256 CTAs (128 at od = 4096, nt = 512). A 64-row tile reads its activations twice as often per MAC as a
// 128-row one, so CTAs run in 2-CTA clusters (m tiles 2i and 2i+1, the same token tile) whose producers each load
// half of every stage (128 tokens) and multicast it to both CTAs: the L2 reads of the 128-row tile. A stage is
// consumed by one warpgroup in each CTA, whose 4 + 4 warps release it on both CTAs' empty barriers (count 8, as the
// plain build's 8 consumer warps); the ring holds LK_KPAIR_HALF_STAGES stages per warpgroup. The registry's
// instantiation BN=256, STAGES=4 (its ring then 2 x LK_KPAIR_HALF_STAGES deep), f16, SCL=0, EPI=0, AQ=2, PF=0, the
// data-parallel grid only (the launcher refuses the rest; other instantiations trap). Not bitwise the plain
// build (two partial sums over k, then one add): the parity gate holds it.
#if defined(LK_EXP_KPAIR_FIN) && !defined(LK_EXP_KPAIR)
#error "LK_EXP_KPAIR_FIN is a form of the LK_EXP_KPAIR build only"
#endif
#if defined(LK_ABLATE_HALFB) && !defined(LK_EXP_KPAIR)
#error "LK_ABLATE_HALFB is an ablation of the LK_EXP_KPAIR build (its multicast stages) only"
#endif
// LK_ABLATE_HALFY (ablation of the FIN form only, timing only: its Y means nothing; round 7's twenty-eighth step): each
// warpgroup sends one of its two TMA stores (rows 0-31 of its 64), so half of Y's f32 bytes leave the SM -- the bytes
// a 16-bit Y would write (cuBLAS's fp16 GEMM writes fp16 C; the issue asks the lab's kernels for float32 Y)
#if defined(LK_ABLATE_HALFY) && !defined(LK_EXP_KPAIR_FIN)
#error "LK_ABLATE_HALFY is an ablation of the LK_EXP_KPAIR_FIN build only"
#endif
#ifdef LK_EXP_KPAIR
__device__ __forceinline__ void lk_tma_load_2d_mc(void* dst, const LkTmap* tm, int c0, int c1, u64* bar, u16 mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
        "%3}], [%4], %5;\n" ::"r"(lk_smem_u32(dst)),
        "l"((u64)tm), "r"(c0), "r"(c1), "r"(lk_smem_u32(bar)), "h"(mask)
        : "memory");
}
// LK_ABLATE_HALFB (ablation of this build only, timing only: its Y means nothing; round 7's twenty-second step): each
// producer's half of a stage goes to its own CTA alone (multicast mask of its rank, the full barrier expecting half a
// stage), so a CTA's shared memory receives 128 tokens x 64 k per stage instead of 256 -- the TMA's shared-memory
// writes and the bytes delivered to the SM halve; the wgmmas, the weights, the barriers and the remote releases stay
#ifdef LK_ABLATE_HALFB
constexpr int LK_KP_RECV = 1;   // halves of a stage a CTA receives
#else
constexpr int LK_KP_RECV = 2;
#endif
// LK_ABLATE_DECOUPLE (ablation of the half-B build only, timing only; round 7's twenty-fourth step): on top of
// LK_ABLATE_HALFB, a CTA's consumers release a stage on their own CTA's empty barrier only (no remote arrive; the
// barrier counts this CTA's 4 warps), so neither CTA of a pair waits for the other's consumers before its producer
// reloads a stage -- the pair's lock-step goes, the bytes each CTA receives and its wgmmas, weights and conversion stay
// the half-B build's. LK_ABLATE_NOCONV (any KPAIR build): the consumers convert nothing -- their two A-fragment sets
// are converted once from the first super-block before the loop and reused (the weights' loads then die): the loop's
// wgmmas, barriers and ring without the weights
// LK_EXP_KPAIR_FIN (exploratory, of this build only; round 7's twenty-sixth step): the two levers the twenty-fifth
// step's trace showed around the loop. (1) Each warpgroup's 64 rows x 128 tokens of Y leave through the idle ring and
// two TMA stores (EPI=4's staging: [128 tokens x 32 rows] boxes, 128-byte swizzle, the Y tensor map), not 64 scalar
// stores a thread (the finish: 2.35 us against BN=128's 1.89). (2) The pair's exit barrier is split: every consumer
// arrives (release: after its last remote arrive on the peer) right after its main loop and waits only at the exit, so
// a CTA no longer waits there for its peer's finish (1.17 us median). The same sums stored: bitwise the KPAIR build.
#if defined(LK_ABLATE_DECOUPLE) && !defined(LK_ABLATE_HALFB)
#error "LK_ABLATE_DECOUPLE is an ablation of the LK_ABLATE_HALFB build (its stages, each CTA's own half) only"
#endif
#ifdef LK_ABLATE_DECOUPLE
constexpr u32 LK_KP_RELEASERS = 4;   // warps releasing a stage: this CTA's consumer warpgroup only
#else
constexpr u32 LK_KP_RELEASERS = 8;   // 4 warps of one consumer warpgroup, in each of the two CTAs
#endif
#ifndef LK_KPAIR_HALF_STAGES   // stages of the ring per consumer warpgroup: labkernels.wgmma.KPAIR_HALF_STAGES (-D)
#error "LK_KPAIR_HALF_STAGES comes from labkernels.wgmma.KPAIR_HALF_STAGES (-D with LK_EXP_KPAIR)"
#endif
#define LK_KP_HS LK_KPAIR_HALF_STAGES
// the 256 consumer threads, from the two warpgroups' own code paths: not bar.sync (.aligned: every thread at the same
// instruction -- compute-sanitizer synccheck, run of commit 8f051eb, "divergent thread(s) in block")
__device__ __forceinline__ void lk_kpair_sync() { asm volatile("barrier.sync 1, 256;\n" ::: "memory"); }
// a stage's release on the peer's empty barrier: the arrive's default semantics (release at CTA scope), as CUTLASS's
// ClusterBarrier::arrive(cta_id) -- not lk_mbar_arrive_peer's .release.cluster, which put a cluster-scope fence in
// front of every chunk's arrive: the third build's warps stalled 3.7-4.9 cycles per issued instruction on "membar"
// (ncu run 20261203T185051Z; the plain build 0.00). What it orders is the retired wgmma reads of the stage (wait_group)
// before the peer's TMA overwrites it, not any of this thread's memory writes.
__device__ __forceinline__ void lk_mbar_arrive_remote(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void lk_sts128f(u32 addr, float a, float b, float c, float d) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
// consumer warpgroup 1 + HALF: super-blocks HALF, HALF + 2, ...; its u-th chunk (u = 4 (sb / 2) + j) in stage
// HALF LK_KP_HS + u % LK_KP_HS of the ring, use number u / LK_KP_HS. (The first two builds split every super-block's k
// between the warpgroups, chunks 0-1 and 2-3, so each loaded its next weights only two chunks ahead: 0.45-0.57x
// cuBLAS with two stages per warpgroup, run 20261203T183132Z, and 0.50-0.61x with three, run of commit 2dfdfe9.)
template <int QT, int HALF>
__device__ __forceinline__ void lk_kpair_consumer(const u8* __restrict__ W, float* __restrict__ Y, int nt, int od,
                                                  int nsb, int m0, int n0, u8* sB, u64* full_bar, u64* empty_bar,
                                                  u32 peer, const LkTmap* tmy) {
    constexpr int BN = 256, STAGE_BYTES = BN * LK_WG_K * 2;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int r0 = m0 + warp * 16 + g, r1 = r0 + 8;
    const int rr0 = r0 < od ? r0 : od - 1, rr1 = r1 < od ? r1 : od - 1;   // tail rows compute, never store
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
    u32 a[2][4][4];
    KQ<QT, 0, 0> T(W, od, nsb, rr0, rr1, c);
    typename KQ<QT, 0, 0>::Rows cur, nxt;
    if (HALF < nsb) T.load(cur, HALF, od, nsb);
#ifdef LK_EXP_TRACE
    // the first activation stage of this warpgroup has landed (warpgroup 1's thread stamps): waited for here, outside
    // the loop (a stamp inside it made q6_K's consumers spill), and again, at once, by the loop's first wait
    lk_mbar_wait(&full_bar[HALF * LK_KP_HS], 0);
    LK_TRACE(2);
#endif
    // LK_EXP_TRACE: the segment's start is the setup stamp (1: a stamp here made q6_K's consumers spill 8 B); its
    // main loop's end (4) and its store's end (5) as the plain body's
#ifdef LK_ABLATE_NOCONV
    T.prep(cur);
    T.chunk(cur, 0, a[0]);
    T.chunk(cur, 1, a[1]);
#endif
    int u = 0;   // this warpgroup's chunks so far
    for (int sb = HALF; sb < nsb; sb += 2) {
        T.prep(cur);
#pragma unroll
        for (int j = 0; j < 4; j++, u++) {
            const int jj = j & 1, st = HALF * LK_KP_HS + u % LK_KP_HS;
            if (j == T.LOAD_AT && sb + 2 < nsb) T.load(nxt, sb + 2, od, nsb);
#ifndef LK_ABLATE_NOCONV
            T.chunk(cur, j, a[jj]);
#endif
            lk_keep(a[jj]);
            lk_mbar_wait(&full_bar[st], (u / LK_KP_HS) & 1);
            lk_wgmma_fence_acc(acc);
            lk_wgmma_fence();
            const u64 dsc = lk_desc_sw128(lk_smem_u32(sB + st * STAGE_BYTES));
#pragma unroll
            for (int s = 0; s < 4; s++) lk_wgmma<BN, 0>(acc, a[jj][s], dsc + 2 * s);
            lk_wgmma_commit();
            lk_wgmma_fence_acc(acc);
            lk_wgmma_wait<1>();   // this warpgroup's previous chunk has retired: its stage is free in both CTAs
            lk_keep(a[jj ^ 1]);
            if (u > 0 && lane == 0) {
                u64* e = &empty_bar[HALF * LK_KP_HS + (u - 1) % LK_KP_HS];
                lk_mbar_arrive(e);
#ifndef LK_ABLATE_DECOUPLE
                lk_mbar_arrive_remote(lk_mapa(lk_smem_u32(e), peer));
#endif
            }
        }
        cur = nxt;
    }
    lk_wgmma_wait<0>();
    lk_wgmma_fence_acc(acc);
    // LK_EXP_TRACE: the main loop's end. With this stamp ptxas spills 8 B in q6_K's trace build (its consumers sit at
    // 240 registers; 0 without it, and in every other build): one STL.64 at the kernel's start and one LDL.64 here,
    // none in the loop (the SASS of trace run 20261204T165923Z)
    LK_TRACE(4);
#ifdef LK_EXP_KPAIR_FIN
    // this thread's part of the pair's exit barrier: its last remote arrive (lane 0, inside the loop) is ordered before
    // it (release); the wait is at the exit
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#endif
    // the two warpgroups' sums: warpgroup HALF keeps token columns 128 HALF .. 128 HALF + 127 (accumulators 64 HALF ..
    // 64 HALF + 63) and hands the other 128 columns to its partner through the ring -- thread t's float4 i at
    // (i x 128 + t) x 16 of the partner's half (the partner's thread t holds the same rows and columns)
    const u32 ring = lk_smem_u32(sB);
    lk_kpair_sync();   // both warpgroups' wgmmas have retired, and every stage has landed: the ring is idle
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int k = 4 * (i + 64 * (1 - HALF) / 4);   // the other half's accumulators
        lk_sts128f(ring + (u32)(1 - HALF) * 32768u + (u32)(i * 128 + tid) * 16, acc[k], acc[k + 1], acc[k + 2],
                   acc[k + 3]);
    }
    lk_kpair_sync();
#pragma unroll
    for (int i = 0; i < 16; i++) {
        if (i % 4 == 0) asm volatile("" ::: "memory");
        const float4 v = lk_lds128f(ring + (u32)HALF * 32768u + (u32)(i * 128 + tid) * 16);
        lk_add4(acc, i + 16 * HALF, v);   // own + partner: commutative, the same sum in either warpgroup
    }
#ifdef LK_EXP_KPAIR_FIN
    // this warpgroup's 64 rows x 128 columns through the ring behind the exchange's 64 KB (idle: every stage has landed
    // and been read) and two TMA stores: EPI=4's staging and boxes (rows and tokens past Y clipped by the TMA unit)
    const u32 wst = ring + 65536u + (u32)HALF * 32768u;
    const int lw0 = warp * 16 + g;   // the thread's first row among the warpgroup's 64
#pragma unroll
    for (int jn = 16 * HALF; jn < 16 * HALF + 16; jn++) {
#pragma unroll
        for (int e = 0; e < 4; e++)
            lk_sts32(lk_stage_addr(wst, lw0 + (e >> 1) * 8, 8 * (jn - 16 * HALF) + 2 * c + (e & 1)), acc[4 * jn + e]);
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the generic writes -> the TMA's reads
    lk_wg_sync(HALF);
    if (tid == 0) {
        lk_tma_store_2d(tmy, wst, m0, n0 + 128 * HALF);
#ifndef LK_ABLATE_HALFY
        lk_tma_store_2d(tmy, wst + 16384u, m0 + 32, n0 + 128 * HALF);
#endif
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");   // the ring is read before the CTA exits
    }
#else
    lk_store_y<BN / 2, 16 * HALF, 16 * HALF + 16>(acc, Y, nt, od, r0, r1, n0, c);   // this warpgroup's 128 columns
#endif
    LK_TRACE(5);
}
template <int QT>
__device__ __forceinline__ void wgmma_kq_kpair_body(const LkTmap& tm, const LkTmap& tmy, const u8* __restrict__ W,
                                                    float* __restrict__ Y, int nt, int od, int id) {
    constexpr int BN = 256, STAGES = 2 * LK_KP_HS, STAGE_BYTES = BN * LK_WG_K * 2;
    LK_TRACE(0);
    extern __shared__ u8 lk_dyn_smem[];
    __shared__ __align__(8) u64 full_bar[STAGES];
    __shared__ __align__(8) u64 empty_bar[STAGES];
    const u32 base = lk_smem_u32(lk_dyn_smem);
    u8* sB = lk_dyn_smem + (((base + 1023) & ~1023u) - base);
    const int nsb = id >> 8;
    const int mtiles = (((od + 63) >> 6) + 1) & ~1;   // even: a cluster's two CTAs hold the same token tile
    const int m0 = ((int)blockIdx.x % mtiles) * 64, n0 = ((int)blockIdx.x / mtiles) * BN;
    const u32 rank = lk_cluster_rank();
    const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    if (threadIdx.x == 0) {
        if (lk_cluster_size() != 2 || (int)gridDim.x != mtiles * ((nt + BN - 1) / BN)) __trap();
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            lk_mbar_init(&full_bar[s], 1);
            lk_mbar_init(&empty_bar[s], LK_KP_RELEASERS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    lk_cluster_sync();   // both CTAs' mbarriers exist before a multicast or a remote arrive reaches them
    LK_TRACE(1);
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (tid == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((u64)&tm) : "memory");
#ifdef LK_EXP_KPAIR_FIN
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((u64)&tmy) : "memory");
#endif
            // this CTA's half of every stage (tokens n0 + 128 rank ..): into both CTAs at the same offset, completing
            // on each one's full barrier, which expects the whole stage (both halves) from its own producer's arrive
            // the two warpgroups' u-th chunks in turn: super-block 2 (u / 4) + h, chunk u % 4, for h = 0, 1
            for (int u = 0; u < 4 * ((nsb + 1) >> 1); u++) {
                for (int h = 0; h < 2; h++) {
                    const int sb = 2 * (u >> 2) + h, s = h * LK_KP_HS + u % LK_KP_HS;
                    if (sb >= nsb) continue;
                    if (u >= LK_KP_HS) lk_mbar_wait(&empty_bar[s], ((u / LK_KP_HS) - 1) & 1);
                    lk_mbar_expect_tx(&full_bar[s], LK_KP_RECV * (STAGE_BYTES / 2));
                    lk_tma_load_2d_mc(sB + s * STAGE_BYTES + rank * (STAGE_BYTES / 2), &tm, (4 * sb + (u & 3)) * LK_WG_K,
                                      n0 + 128 * (int)rank, &full_bar[s],
                                      (u16)(LK_KP_RECV == 2 ? 3u : 1u << rank));
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    if (wg == 1) lk_kpair_consumer<QT, 0>(W, Y, nt, od, nsb, m0, n0, sB, full_bar, empty_bar, rank ^ 1u, &tmy);
    else lk_kpair_consumer<QT, 1>(W, Y, nt, od, nsb, m0, n0, sB, full_bar, empty_bar, rank ^ 1u, &tmy);
    // the peer's consumers arrive on this CTA's empty barriers up to their last chunk: neither CTA exits before both
    // are done (the producers have exited: they do not count)
#ifdef LK_EXP_KPAIR_FIN
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");   // arrived right after the main loops
#else
    lk_cluster_sync();
#endif
    LK_TRACE(6);   // LK_EXP_TRACE: past the exit barrier (labkernels.wgmma.KPAIR_TRACE: "exit")
}
#endif

// the registry's instantiations, as in wgmma_kq.cu, with this build's policy (and LK_EXP_KPAIR's body for its one
// launch shape, LK_ABLATE_EMPTY's immediate return)
template <int QT, int BN, int STAGES, int BF16, int SCL, int EPI, int AQ, int PF>
__global__ void __launch_bounds__(LK_WG_THREADS, 1)
    wgmma_kq_kernel(const __grid_constant__ LkTmap tm, const __grid_constant__ LkTmap tmy, const u8* __restrict__ W,
                    float* __restrict__ Y, int nt, int od, int id, float* __restrict__ ws, u32* __restrict__ flags,
                    int dp_tiles, int split_g) {
    LK_PDL_ENTRY();
#ifdef LK_ABLATE_EMPTY
    // ablation (labkernels.wgmma.floor_ab, timing only): the launch floor -- the same grid, threads, dynamic shared
    // memory and parameters as the plain launch, and no work: every CTA returns at once, writing nothing (Y, the
    // stream-K workspace and the flags are left as they were)
    return;
#endif
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#ifdef LK_EXP_KPAIR
    if constexpr (BN == 256 && STAGES == 4 && BF16 == 0 && SCL == 0 && EPI == 0 && AQ == 2 && PF == 0)
        wgmma_kq_kpair_body<QT>(tm, tmy, W, Y, nt, od, id);
    else
        __trap();   // the build's one launch shape (the launcher refuses the others)
#else
    wgmma_kq_body<QT, BN, STAGES, BF16, SCL, EPI, AQ, PF, LkBuild>(tm, tmy, W, Y, nt, od, id, ws, flags, dp_tiles,
                                                                   split_g);
#endif
#else
    __trap();  // wgmma / setmaxnreg exist on sm_90a only: the launcher refuses other devices first
#endif
}

template <int QT, int BN, int STAGES, int BF16, int NCV>
__global__ void __launch_bounds__(128 * (2 + NCV), 1)
    wgmma_kqs_kernel(const __grid_constant__ LkTmap tmx, const __grid_constant__ LkTmap tmw, float* __restrict__ Y,
                     int nt, int od, int id, float* __restrict__ ws, u32* __restrict__ flags, int dp_tiles,
                     int split_g) {
    LK_PDL_ENTRY();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    wgmma_kqs_body<QT, BN, STAGES, BF16, NCV, LkBuild>(tmx, tmw, Y, nt, od, id, ws, flags, dp_tiles, split_g);
#else
    __trap();  // wgmma / setmaxnreg exist on sm_90a only: the launcher refuses other devices first
#endif
}
