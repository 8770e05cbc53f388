"""Round 9's plans, with its bar and its first prediction: the benchmark of record's points (:data:`PLAN`, the round's
one plan), the bar of the issue that opened the round (:data:`TARGETS`), what the first gemv_kq build should measure
(:data:`PREDICTION`, written before its first run), each step's A/B (:data:`STEP2_PLAN` .. :data:`STEP7_PLAN`; the
retired steps 3 and 5's as they ran) and the generation benchmark's (:data:`GEN_PLAN`). Data only: the round's other
files read it."""

from __future__ import annotations


#: (od, id) of the 7B's weights (llama.cpp's test-backend-ops m x k)
SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (11008, 4096))
NTS = (1, 2, 3, 4, 6, 8, 12, 16)
#: the round's one plan: the benchmark of record's points (:func:`.benchmark.measure` takes it)
PLAN = {"shapes": [list(s) for s in SHAPES], "nts": list(NTS), "qtypes": ["q4_K", "q6_K"], "acts": ["f16", "f32"],
        "pairs": 3, "repeats": 20, "seed": 0, "configs": [[1, 4], [2, 4]], "splits": [], "flush": "read",
        "lead_us": 300.0}


#: the bar of the issue that opened the round (decode at the HBM line), as the page shows it
TARGETS = {"frac_copy_nt1": 0.80, "nt8_over_nt1": 1.5, "vs_mmvq_nt2_8": 2.0, "vs_llama_tg": 2.0}


#: what the first gemv_kq build should measure, written before its first GPU run (commit d19f769, 2026-12-06). The line
#: is the copy bandwidth of the same process (read + write of 1 GiB; KINDS.md: ~4.3 TB/s on the H200, ~3.0 on the
#: H100); weight bytes / time over it is the fraction. Ranges, per card where the card matters.
PREDICTION = {
    "written": "2026-12-06, before the first run of gemv_kq (commit d19f769); the build first measured is the second "
               "(one LOP3 per magic-exponent code, the scale decode in f16x2 without divergent branches: the q4_K "
               "loop 900 -> 683 SASS instructions a super-block, q6_K 1013 -> 875, same exact function), for which "
               "the same ranges stand",
    "claims": [
        {"what": "q4_K 4096x14336 nt=1 (33.0 MB)", "metric": "frac_copy", "low": 0.55, "high": 0.75,
         "why": "one wave of ~400 CTAs of 4 warps, 2 x 2.3 KB per warp in flight: Little's law is met (~23 KB/SM at "
                "4.3 TB/s x 700 ns); the loss is the ramp and the tail of one short wave (~2-3 us)"},
        {"what": "q4_K 4096x4096 nt=1 (9.4 MB)", "metric": "frac_copy", "low": 0.35, "high": 0.55,
         "why": "2.2 us at the line on the H200: launch, ramp and tail of the same size as the transfer"},
        {"what": "q6_K 4096x14336 nt=1 (48.2 MB)", "metric": "frac_copy", "low": 0.55, "high": 0.75,
         "why": "1.46x q4_K's bytes, ~1.5x its dequant instructions per weight: bandwidth-bound like q4_K"},
        {"what": "nt=8 / nt=1 time, every shape", "metric": "ratio", "low": 1.0, "high": 1.2,
         "why": "the tokens are the mma's n: the same weight bytes and dequant, 8x the activation loads (L1/L2 hits)"},
        {"what": "nt=16 / nt=1 time, every shape", "metric": "ratio", "low": 1.0, "high": 1.5,
         "why": "two n8 tiles: twice the mma and activation work per weight, register pressure (fewer warps)"},
        {"what": "vs llama.cpp MMVQ, q4_K 4096x14336, H200", "metric": "speedup", "low": 1.2, "high": 1.6,
         "why": "MMVQ's 16.2 us at n=1 (~2.0 TB/s) is latency-bound; at n=8 (46.7 us) ~3.5x, MMVQ repeating the dot "
                "per column"},
    ],
}


#: step 2's A/B (FORM=0 against FORM=1, interleaved in the same pairs, beside round 7's wgmma and cuBLAS fp16): q4_K,
#: the four shapes, nt <= 8 (FORM=1's range), both activation types, both warp tilings
STEP2_PLAN = {"shapes": [list(s) for s in SHAPES], "nts": [1, 2, 4, 8], "qtypes": ["q4_K"], "acts": ["f16", "f32"],
              "pairs": 3, "repeats": 20, "seed": 0, "configs": [[1, 4], [2, 4]], "splits": [], "flush": "read",
              "lead_us": 300.0, "forms": [0, 1]}


#: step 3's A/B as it ran (round 9 step 3, retired: the record of its plan, not runnable here): FORM=1 without the
#: ring at the default and the one-wave split (the baseline) and the rings PIPE=4 / PIPE=2 (FORM=1's function, the
#: same bits) at the one-wave split, PIPE=4 at the default split too, interleaved in the same pairs beside cuBLAS fp16
#: (the harness's anchor); q4_K, the four shapes, nt <= 8, f16. Launches: (MT, WARPS, FORM, PIPE, S) with S None (the
#: default split) or "wave" -- bench_gemv's form at commit a1cf954, the last that holds the ring
STEP3_PLAN = {"shapes": [list(s) for s in SHAPES], "nts": [1, 2, 4, 8], "qtypes": ["q4_K"], "acts": ["f16"],
              "pairs": 3, "repeats": 20, "seed": 0, "flush": "read", "lead_us": 300.0, "baselines": ["cublas"],
              "launches": [[1, 4, 1, 0, None], [1, 4, 1, 0, "wave"], [2, 4, 1, 0, None], [2, 4, 1, 0, "wave"],
                           [1, 4, 1, 4, None], [1, 4, 1, 4, "wave"], [2, 4, 1, 4, "wave"],
                           [1, 4, 1, 2, "wave"], [2, 4, 1, 2, "wave"]]}


#: step 4's plan: the benchmark of record (PLAN's points) over FORM 0/1 x MT 1/2 x the default / one-wave split;
#: launches (MT, WARPS, FORM, S) as :func:`.benchmark.bench_gemv` takes them
STEP4_PLAN = {**{k: v for k, v in PLAN.items() if k not in ("configs", "splits")},
              "baselines": ["wgmma", "cublas"],
              "launches": [[1, 4, 0, None], [2, 4, 0, None], [1, 4, 0, "wave"], [2, 4, 0, "wave"],
                           [1, 4, 1, None], [1, 4, 1, "wave"], [2, 4, 1, "wave"]]}


#: step 5's A/B as it ran (round 9 step 5, retired: the record of its plan, not runnable here): FORM=1 against FORM=2
#: (MT=1), the one-wave and the default split, interleaved in the same pairs beside cuBLAS fp16; q4_K, the four
#: shapes, nt <= 8, f16 and f32. Launches (MT, WARPS, FORM, S) -- FORM=2 left the source; commit 90fd260 holds it
STEP5_PLAN = {"shapes": [list(s) for s in SHAPES], "nts": [1, 2, 4, 8], "qtypes": ["q4_K"], "acts": ["f16", "f32"],
              "pairs": 3, "repeats": 20, "seed": 0, "flush": "read", "lead_us": 300.0, "baselines": ["cublas"],
              "launches": [[1, 4, 1, "wave"], [1, 4, 2, "wave"], [1, 4, 1, None], [1, 4, 2, None]]}


#: step 6's A/B: FORM=3 (the CTA's warps split its 16 rows' super-blocks, a shared-memory fold) at WARPS 8 and 4,
#: S=1 (no split-K workspace) and WARPS 8 at the one-wave split, against FORM=1 and FORM=0 (MT=1) at the one-wave
#: split (step 4's winners at f16 / f32), beside cuBLAS fp16 and the empty launch (the harness's floor: one wave of
#: 128-thread CTAs doing nothing, timed as every launch is); q4_K, the four shapes, nt <= 8, f16 and f32.
#: Launches (MT, WARPS, FORM, S)
STEP6_PLAN = {"shapes": [list(s) for s in SHAPES], "nts": [1, 2, 4, 8], "qtypes": ["q4_K"], "acts": ["f16", "f32"],
              "pairs": 3, "repeats": 20, "seed": 0, "flush": "read", "lead_us": 300.0, "baselines": ["cublas", "empty"],
              "launches": [[1, 4, 1, "wave"], [1, 4, 0, "wave"], [1, 8, 3, 1], [1, 4, 3, 1], [1, 8, 3, "wave"]]}


#: step 7's A/B: FORM=4 / FORM=5 (FORM=1 under a register cap of 6 / 8 CTAs an SM) against FORM=1, each at its own
#: one-wave split and at the default split, beside cuBLAS fp16 and the empty launch; q4_K, the four shapes, nt <= 8,
#: f16 and f32. Launches (MT, WARPS, FORM, S)
STEP7_PLAN = {"shapes": [list(s) for s in SHAPES], "nts": [1, 2, 4, 8], "qtypes": ["q4_K"], "acts": ["f16", "f32"],
              "pairs": 3, "repeats": 20, "seed": 0, "flush": "read", "lead_us": 300.0, "baselines": ["cublas", "empty"],
              "launches": [[1, 4, 1, "wave"], [1, 4, 4, "wave"], [1, 4, 5, "wave"], [1, 4, 4, None],
                           [1, 4, 5, None]]}


#: the generation benchmark's plan: models, prompt lengths (the context before the first new token), new tokens
GEN_PLAN = {"models": ["synthetic-gemma3", "synthetic-7b"], "prompts": [128, 512, 2048], "n_new": 128, "repeats": 3}
