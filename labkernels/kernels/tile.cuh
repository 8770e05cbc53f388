// labkernels: the int8 GEMM tile (tokens LK_BM x output rows LK_BN per block, LK_THREADS threads).
// The constants come from labkernels.kernels.registry (BM, BN, THREADS) as -D options (registry.cuda_defines()),
// so the launchers, the shared-memory formulas and the kernels cannot disagree.
#pragma once
#include "common.cuh"

#if !defined(LK_BM) || !defined(LK_BN) || !defined(LK_THREADS)
#error "LK_BM / LK_BN / LK_THREADS come from labkernels.kernels.registry: compile with registry.cuda_defines()"
#endif
