// occ_harness.cpp -- CUDA's own occupancy calculator (the header-only cuda_occupancy.h) behind a line protocol,
// so labkernels.occupancy can be checked against it on a CPU-only machine (no GPU, no CUDA runtime).
//
// Build:  g++ -O1 -std=c++11 -I<cuda>/include occ_harness.cpp -o occ_harness
//
// stdin, whitespace separated, one record per line:
//   P major minor maxThreadsPerBlock maxThreadsPerMultiprocessor regsPerBlock regsPerMultiprocessor warpSize
//     sharedMemPerBlock sharedMemPerMultiprocessor numSms sharedMemPerBlockOptin reservedSharedMemPerBlock
//       -> sets the cudaOccDeviceProp for the following C records (prints nothing)
//   C threads regs staticSmem dynamicSmem carveout maxDynamicSmem
//       -> one output line per C record:
//          err blocks limitingFactors blockLimitRegs blockLimitSharedMem blockLimitWarps blockLimitBlocks
//          allocatedRegistersPerBlock allocatedSharedMemPerBlock
//          (err = cudaOccError; INT_MAX limits are printed as -1)
//
// The function attributes mirror what cudaFuncGetAttributes reports for a lab kernel whose launcher opted in to
// its dynamic shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize = maxDynamicSmem): the header's own
// cudaFuncAttributes conversion sets shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN and numBlockBarriers = 1.
// carveout is cudaFuncAttributePreferredSharedMemoryCarveout: -1 (default) or a percentage 0..100.
#include <climits>
#include <cstdio>
#include <cstring>

#include "cuda_occupancy.h"

static int lim(int v) { return v == INT_MAX ? -1 : v; }

int main() {
    cudaOccDeviceProp prop;
    bool have_prop = false;
    char tag[4];
    while (std::scanf("%3s", tag) == 1) {
        if (tag[0] == 'P') {
            long long v[12];
            for (int i = 0; i < 12; ++i) {
                if (std::scanf("%lld", &v[i]) != 1) { std::fprintf(stderr, "bad P record\n"); return 2; }
            }
            prop.computeMajor = (int)v[0];
            prop.computeMinor = (int)v[1];
            prop.maxThreadsPerBlock = (int)v[2];
            prop.maxThreadsPerMultiprocessor = (int)v[3];
            prop.regsPerBlock = (int)v[4];
            prop.regsPerMultiprocessor = (int)v[5];
            prop.warpSize = (int)v[6];
            prop.sharedMemPerBlock = (size_t)v[7];
            prop.sharedMemPerMultiprocessor = (size_t)v[8];
            prop.numSms = (int)v[9];
            prop.sharedMemPerBlockOptin = (size_t)v[10];
            prop.reservedSharedMemPerBlock = (size_t)v[11];
            have_prop = true;
        } else if (tag[0] == 'C') {
            long long threads, regs, static_smem, dyn_smem, carveout, max_dyn;
            if (std::scanf("%lld %lld %lld %lld %lld %lld", &threads, &regs, &static_smem, &dyn_smem, &carveout,
                           &max_dyn) != 6 || !have_prop) {
                std::fprintf(stderr, "bad C record (or no P record before it)\n");
                return 2;
            }
            cudaOccFuncAttributes attr;
            attr.maxThreadsPerBlock = prop.maxThreadsPerBlock;
            attr.numRegs = (int)regs;
            attr.sharedSizeBytes = (size_t)static_smem;
            attr.partitionedGCConfig = PARTITIONED_GC_OFF;
            attr.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
            attr.maxDynamicSharedSizeBytes = (size_t)max_dyn;
            attr.numBlockBarriers = 1;
            attr.virtualResourceCount = 0;

            cudaOccDeviceState state;
            state.carveoutConfig = (int)carveout;

            cudaOccResult res;
            std::memset(&res, 0, sizeof(res));
            cudaOccError err = cudaOccMaxActiveBlocksPerMultiprocessor(&res, &prop, &attr, &state, (int)threads,
                                                                       (size_t)dyn_smem);
            std::printf("%d %d %u %d %d %d %d %d %zu\n", (int)err, res.activeBlocksPerMultiprocessor,
                        res.limitingFactors, lim(res.blockLimitRegs), lim(res.blockLimitSharedMem),
                        lim(res.blockLimitWarps), lim(res.blockLimitBlocks), res.allocatedRegistersPerBlock,
                        res.allocatedSharedMemPerBlock);
        } else {
            std::fprintf(stderr, "unknown record tag %s\n", tag);
            return 2;
        }
    }
    return 0;
}
