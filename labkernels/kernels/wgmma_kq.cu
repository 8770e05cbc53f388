// Round 7: the production wgmma kernels (sm_90a) -- the register form (wgmma_kq_kernel) and the shared-memory form
// (wgmma_kqs_kernel); their device code is wgmma_kq.cuh, here instantiated with the plain build policy (LkPlain).
// labkernels.kernels.registry lists every instantiation (the main path and the measured variants); the launcher is
// labkernels.wgmma. Round 7's exploratory and ablation builds are its own source
// (labkernels/rounds/r07_wgmma/kernels/wgmma_kq_experiments.cu): nothing here names them.
#include "wgmma_kq.cuh"

// tmy: the Y tensor map (EPI=2, 4, 5; other forms receive zeros and never read it); split_g: SK=3's G, else 0
template <int QT, int BN, int STAGES, int BF16, int SCL, int EPI, int AQ, int PF>
__global__ void __launch_bounds__(LK_WG_THREADS, 1)
    wgmma_kq_kernel(const __grid_constant__ LkTmap tm, const __grid_constant__ LkTmap tmy, const u8* __restrict__ W,
                    float* __restrict__ Y, int nt, int od, int id, float* __restrict__ ws, u32* __restrict__ flags,
                    int dp_tiles, int split_g) {
    LK_PDL_ENTRY();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    wgmma_kq_body<QT, BN, STAGES, BF16, SCL, EPI, AQ, PF, LkPlain>(tm, tmy, W, Y, nt, od, id, ws, flags, dp_tiles,
                                                                   split_g);
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
    wgmma_kqs_body<QT, BN, STAGES, BF16, NCV, LkPlain>(tmx, tmw, Y, nt, od, id, ws, flags, dp_tiles, split_g);
#else
    __trap();  // wgmma / setmaxnreg exist on sm_90a only: the launcher refuses other devices first
#endif
}
