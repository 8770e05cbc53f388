"""Round 9's steps as a ledger: for each step, what it asked, the analysis and the prediction written before its GPU
run, what was measured and the verdict (:data:`LEDGER`; step 3's analysis :data:`STEP3_ANALYSIS`), the commits that
still hold the retired step 3's PIPE ring (:data:`PIPE_HOLDER`), step 5's FORM=2 (:data:`FORM2_HOLDER`), step 7's FORM=4
/ 5 (:data:`FORM45_HOLDER`) and step 8's PF=1 build (:data:`PF_HOLDER`), with the runs that measured the last three
(:data:`STEP5_RUN`, :data:`STEP7_RUN`, :data:`STEP8_RUN`), and the command that reruns a step there. The page renders
the measured steps from it, its state reads the latest one (:mod:`.state`) and the steps' records take their numbers,
predictions and verdicts from it (:mod:`.steps`)."""

from __future__ import annotations

from .plan import PREDICTION


#: step 3's analysis, written before its run from the compiler's report and the machine code (H100 80GB HBM3: 132
#: SMs, 64K registers and 228 KB of shared memory an SM; occupancy from labkernels.occupancy's 'h100' profile)
STEP3_ANALYSIS = {
    "load structure (PIPE=0, SASS)": "every load of a super-block at the top of its loop iteration (FORM=1 MT=1 f16: "
                                      "14 LDG.128, 6 of weights and 8 of activations; the first HMMA 36 instructions "
                                      "after the last), none carried across iterations: a warp's bytes in flight drop "
                                      "to zero while it computes the super-block",
    "bytes a warp a super-block": "weights MT x 16 rows x 144 B = 2,304 B (MT=1) / 4,608 B (MT=2; the 16-byte header "
                                  "loaded by the 4 lanes of a quad, L1 hits after the first); activations 512 B (f16) "
                                  "/ 1,024 B (f32) a token, L2 hits",
    "registers -> CTAs an SM (warps), peak weight bytes in flight an SM": (
        "FORM=0 MT=1 f16 96 -> 5 (20) 46 KB; FORM=0 MT=2 f16 126 -> 4 (16) 74 KB; FORM=1 MT=1 f16 106 -> 4 (16) "
        "37 KB; FORM=1 MT=2 f16 150 -> 3 (12) 55 KB; FORM=1 MT=1 f32 132 -> 3 (12) 28 KB; FORM=1 MT=2 f32 162 -> 3 "
        "(12) 55 KB. The average is the peak x L / (L + C), C the super-block's compute (~0.3-0.5 us): FORM=1 MT=1 "
        "f16 ~25-28 KB"),
    "Little's law": "2.98 TB/s x latency / 132 SMs: 15.8 KB an SM at 700 ns (the notes' 600-800 ns, unloaded: "
                    "shared/notes/decode-at-the-hbm-line.md; HOPPER.md gives no figure), 22.6-33.9 KB at a loaded "
                    "1.0-1.5 us (assumed: queueing near saturation). FORM=1 MT=1 f16 sits at the margin, f32 MT=1 "
                    "below it",
    "grid at 4096x14336 (56 super-blocks)": "FORM=1 MT=1 f16: 64 row groups x S=9 (default, rounded up) = 576 CTAs on "
                                            "4 x 132 = 528 slots: 1.09 waves, 48 CTAs of 6-7 super-blocks after the "
                                            "first finish (~6-7 us at low load); MT=2: 32 x 13 = 416 on 396 (1.05). "
                                            "One wave (S='wave'): MT=1 S=8 (512 CTAs, 7 super-blocks each), MT=2 S=12",
    "the split's fold": "S x nt x od x 4 B (147 KB at MT=1 S=9): 0.1 us of bytes, but the last CTA's chain at the end "
                        "(fence, arrival atomic, S partial loads, store: ~3 round trips, 1.5-3 us) is on the critical "
                        "path; step 2's 4096x4096 (9.4 MB, 3.2 us at the line) took 12.7 us: ~9 us of fixed costs "
                        "(launch, a 48-CTA second wave, the fold's chain)",
    "PIPE ring, in flight an SM (weights, continuously)": (
        "(PIPE - 1) x the CTA's stage x CTAs: nt=1 f16 MT=1 PIPE=2 5 CTAs (91 regs) 46 KB, PIPE=4 5 CTAs (92 regs, "
        "39 KB smem) 138 KB; MT=2 PIPE=2 4 CTAs (127 regs) 74 KB, PIPE=4 3 CTAs (76 KB smem) 166 KB; nt=8 f16 MT=1 "
        "PIPE=4 4 CTAs 111 KB"),
    "SASS main loop a super-block (one warp), FORM=1 -> PIPE=2 / PIPE=4": (
        "f16 MT=1 335 -> 371 / 373, MT=2 570 -> 603 / 605; f32 MT=1 349 -> 397 / 399, MT=2 597 -> 688 / 681 (5 or 10 "
        "LDGSTS of weights, 1-2 of activations in a loop over the CTA's tokens, 14 / 20 LDS.128 for 14 / 20 LDG.128, a "
        "DEPBAR and a BAR.SYNC); at the line PIPE MT=1 f16 issues ~2.1 warp-instructions a cycle an SM (of 4)"),
    "step time estimate (gemv_step3)": "40-70 s on an H100: NVRTC build of gemv_kq (28 instantiations) ~10 s, the "
                                       "references of 4 shapes ~8 s, 144 gated points x ~0.1-0.15 s ~15-25 s, timing "
                                       "(10 variants x 16 points x 60 launches behind a 300 us lead) ~5 s, the copy "
                                       "line ~1 s (step 2's plan, 128 gates, ran in 29 s)",
}


#: the commit that holds gemv_kq's FORM=4 and FORM=5 (round 9 step 7's FORM=1 under register caps of 6 / 8 CTAs an
#: SM) and its step (``gpu check --steps gemv_step7``): the last one with them
FORM45_HOLDER = "7894b07"
#: the run of step 7's A/B (H100 80GB HBM3, commit 045babc): FORM=4 / FORM=5 against FORM=1, the measurement they lost
STEP7_RUN = "20261207T195543Z-h10080gbhbm3-045babc"
#: the commit that holds gemv_kq's PF=1 build (round 9 step 8's L2 prefetch of the weights before the PDL wait),
#: ``PrefillOptions.gemv_pf`` and its step (``gpu check --steps gemv_step8``): the last one with them
PF_HOLDER = "7894b07"
#: the run of step 8's A/B (H100 80GB HBM3, commit 045babc): the decode with PF=1 against PF=0, the measurement it lost
STEP8_RUN = "20261207T195308Z-h10080gbhbm3-045babc"


#: the round's steps as records (prediction written before the run, then what was measured and the verdict)
LEDGER = [
    {"step": 1, "name": "gemv_kq, first measured build",
     "commit": "659e8fd", "card": "NVIDIA H100 80GB HBM3", "runs": ["20261206T044949Z-h10080gbhbm3-659e8fd",
                                                                     "20261206T045037Z-h10080gbhbm3-659e8fd"],
     "prediction": PREDICTION["claims"],
     "measured": "copy line 2.98 TB/s. Recorded (L2 overwritten between launches, host enqueue inside the events): "
                 "q4_K 4096x14336 nt=1 31.1 us = 36% of the line (MT=1), q6_K 35.1 us = 46%, 4096x4096 14.1 us = "
                 "22%; nt=8 / nt=1 = 1.2-1.4; faster than wgmma and cuBLAS fp16 at nt = 1..8 on every shape. Split "
                 "sweep at nt=1: S=8 24.3 us for 4096x14336 (default 30.9). Exploratory, printed by device calls "
                 "20-22 and not recorded (to be re-measured by the recorded bench): the write flush costs ~4 us "
                 "against a read flush (31.0 -> 27.1 us), the Python enqueue ~6 us more (a 300 us lead: best of "
                 "MT x S 20.8 us = 53% for q4_K 4096x14336, q6_K 23.9 us = 68%, 4096x4096 10.75 us = 29%, nt=8/nt=1 "
                 "1.38).",
     "verdict": "missed (predicted 55-75% at nt=1; 36% recorded, ~53% with the timing fixed). q6_K moves 1.46x q4_K's "
                "bytes in ~1.15x its time: q4_K is not bound by bytes. Its main loop issues 683 SASS instructions a "
                "super-block a warp (MT=2: 13 per 8 weights for the exact f16 dequant, the scale decode, 16 mma), "
                "~1.7 warp-instructions a cycle an SM at the H100's line and ~2.4 at the H200's: the issue rate, "
                "not the memory system, holds it. The 4096x4096 shape (3.2 us at the line) spends ~7 us on fixed "
                "costs: launch, one short wave, the split's fold."},
    {"step": 2, "name": "fewer instructions per weight, and the recorded timing without the host",
     "commit": "1f97ec7", "card": "NVIDIA H100 80GB HBM3", "runs": ["20261206T204334Z-h10080gbhbm3-1f97ec7"],
     "gpu_check": "gemv_step2",
     "prediction": [
         {"what": "the recorded bench with the read flush and a 300 us lead (bench_gemv defaults now)",
          "metric": "us", "low": 19.0, "high": 23.0,
          "why": "q4_K 4096x14336 nt=1 on the H100: the exploratory 20.8 us of step 1"},
         {"what": "an int8 form: q8_1 activations, mma m16n8k32 s8, a nibble to int8 in one LOP3 per 4 weights, "
                  "per-sub-block int32 folded with d*sc and the q8_1 sums (as llama.cpp's MMVQ and the lab's q4k_nb)",
          "metric": "frac_copy", "low": 0.70, "high": 0.85,
          "why": "~2.5x fewer instructions a weight than step 1's exact f16 dequant: under 1 warp-instruction a cycle "
                 "at the line; gated against the int8 reference like rounds 3-6 (it changes the exact function). NOT "
                 "BUILT in this step: the form built is FORM=1 below (no activation requantization); this claim "
                 "stays open"},
         # FORM=1, written 2026-12-06 before any GPU run of it (commits 5dac274..; nvcc 13.0, sm_90a, cuobjdump of
         # the main loop: instructions between the super-block loop's head and its backward branch, one warp)
         {"what": "gemv_kq FORM=1 q4_K 4096x14336 nt=1 f16, H100 (best of MT 1/2, default split; gemv_step2)",
          "metric": "us", "low": 16.5, "high": 19.5,
          "why": "SASS a super-block (one warp; FORM=0 -> FORM=1): f16 MT=2 683 -> 570, MT=1 369 -> 335; f32 MT=2 "
                 "694 -> 597 -- per 8 weights of a row the dequant is 1 SHF + 4 LOP3 + 4 HFMA2 (FORM=0: + 2 HADD2/HFMA2 "
                 "to make q and its HFMA2 q*S+B are one HFMA2 (1024+q)*sc - 1024*sc now), paid back in part by 8 "
                 "indicator HMMA + MT min HMMA + 8*MT FFMA (d, -dmin) a super-block. Step 1 found the loop issue-bound "
                 "(~0.08 SASS a weight): time scaled by 570/683 = 0.83 of the exploratory 20.8 us = 17.4 us; not "
                 "the 13.6 us bar (80% of the 2.98 TB/s line = 11.1 us of bytes): ~430 SASS a super-block are not "
                 "dequant (activation fragments, loads, scales, mma)"},
         {"what": "FORM=1 / FORM=0 time, q4_K nt=1, the four shapes, same config, same pairs", "metric": "ratio",
          "low": 0.78, "high": 0.95,
          "why": "the instruction ratio 0.83-0.91 (MT=2 / MT=1), less where the short shapes' fixed costs (launch, "
                 "one wave, the split's fold: ~7 us at 4096x4096) dominate"},
         {"what": "FORM=1 nt=8 / nt=1 time, q4_K, every shape", "metric": "ratio", "low": 1.0, "high": 1.3,
          "why": "the tokens are the mma's n: the indicator and min mma cost the same at nt=1..8; 8x the activation "
                 "loads (L1/L2 hits)"},
         {"what": "FORM=1 exactness", "metric": "gate", "low": 0.0, "high": 0.0,
          "why": "exact_rel against exact_weights_v2 (gguf's d*sc*q - dmin*m in float64, x rounded to f16) within "
                 "exact_gate(id) (f32 summation order and the 2^-22 hi/lo split of the sub-block sums); NMSE against "
                 "float64 x . dequantize(w)^T below FORM=0's (no f16 rounding of the weights). Range: a sub-block sum of the "
                 "activations below 65504 (the f16 hi half)"},
     ],
     "measured": "q4_K 4096x14336 nt=1 f16 (read flush, 300 us lead, 3 interleaved pairs): FORM=0 MT=1 28.3 us (39% "
                 "of the copy line), FORM=1 MT=1 27.6 us (40%); MT=2 31.5 -> 29.7 us. 11008x4096 nt=1: 21.6 -> 21.7 us. "
                 "nt=8 f16 4096x14336: best 36.1 us (FORM=1 MT=2). llama.cpp MMVQ in the same session and card: "
                 "16.1 us at n=1 (the lab 0.58x its speed), 47.7 us at n=8 (the lab 1.32x). Every FORM=1 point passed "
                 "its gate (exact_weights_v2 and float64) before it was timed; GPU tests of FORM=1 green.",
     "verdict": "missed: 27.6 us against the predicted 16.5-19.5 us, FORM=1 / FORM=0 0.94-0.98 against 0.78-0.95. The "
                "recorded bench did not reproduce step 1's exploratory 20.8 us (28.3 us with the same lead and flush): "
                "at nt=1 the kernel is held neither by its instruction count nor by bytes. The next step measures "
                "bytes in flight per SM (Little's law) and the launch's ramp and tail with counters."},
    # step 3: the analysis and the prediction written 2026-12-06 before any GPU run of the forms (nvcc 13.0 -cubin
    # sm_90 --resource-usage, cuobjdump -sass of the main loop, the lab's occupancy profile 'h100'; STEP3_ANALYSIS)
    {"step": 3, "name": "bytes in flight and the grid's tail: a cp.async ring (PIPE) and one-wave splits",
     "commit": "5740e33", "card": "NVIDIA H100 80GB HBM3", "runs": ["20261207T004259Z-h10080gbhbm3-2406c00"],
     "gpu_check": "gemv_step3", "analysis": STEP3_ANALYSIS,
     "prediction": [
         {"what": "FORM=1 MT=1 default split, q4_K 4096x14336 nt=1 f16 (the baseline, same process)", "metric": "us",
          "low": 26.0, "high": 30.0, "why": "step 2's 27.6 us; PIPE=0's machine code is instruction-identical to "
                                              "step 2's build"},
         {"what": "FORM=1 PIPE=0, S='wave', best of MT 1/2, q4_K 4096x14336 nt=1 f16", "metric": "us",
          "low": 20.0, "high": 25.0,
          "why": "the default split leaves a partial second wave (MT=1: 576 CTAs on 528 slots, 48 CTAs of 6-7 "
                 "super-blocks start when the first finish, ~6-7 us at low load); the wave split (S=8, 512 CTAs of 7 "
                 "super-blocks) removes it; the steady state is unchanged"},
         {"what": "PIPE=4 MT=1, default split, q4_K 4096x14336 nt=1 f16", "metric": "us", "low": 19.0, "high": 24.0,
          "why": "3 super-blocks in flight a CTA, continuously (138 KB an SM against the 23-34 KB Little's law asks): "
                 "the steady state at 85-95% of the line; the tail kept (5 CTAs an SM: S=11, 704 CTAs on 660 slots)"},
         {"what": "PIPE=4, S='wave', best of MT 1/2, q4_K 4096x14336 nt=1 f16", "headline": True, "metric": "us",
          "low": 14.0, "high": 18.0,
          "why": "= 62-80% of the 2.98 TB/s line (the bar, 80%, at 13.6 us: reached only at the bottom of the range): "
                 "the bytes at ~90% of the line (12.3 us) plus the ramp (the first super-block's latency, ~1.5 us) and "
                 "the split's end (the last CTA's fence, arrival atomic and S partial loads: ~1.5-3 us)"},
         {"what": "PIPE=2 / PIPE=4 time, S='wave', same MT, q4_K nt=1 f16, every shape", "metric": "ratio",
          "low": 0.95, "high": 1.10,
          "why": "both hold >= 2x the bytes Little's law asks at a 1.0-1.5 us loaded latency (PIPE=2 MT=1: 46 KB an "
                 "SM); PIPE=2 more than 10% slower would put the loaded latency above ~2 us"},
         {"what": "PIPE=4 S='wave' q4_K 4096x4096 nt=1 f16 (9.4 MB: 3.2 us at the line)", "metric": "us",
          "low": 6.0, "high": 9.0,
          "why": "step 2's FORM=1 12.7 us is fixed costs: a second wave of 48 CTAs and the fold's chain of round trips "
                 "at the end (~3 us); one wave with 1-2 super-blocks a CTA prefetched leaves launch + ramp + fold"},
         {"what": "PIPE=4 S='wave', best of MT 1/2, nt=1 f16, 14336x4096 and 11008x4096", "metric": "frac_copy",
          "low": 0.55, "high": 0.80, "why": "the same levers at 25-33 MB (step 2 FORM=1: 26.0 and 21.7 us, 39-40%)"},
         {"what": "PIPE=4 S='wave' nt=8 / nt=1 time, q4_K f16, every shape (best MT each)", "metric": "ratio",
          "low": 1.0, "high": 1.3,
          "why": "the ring carries the nt token rows (MT=1: 4 CTAs an SM at nt=8, 111 KB in flight), the mma work "
                 "per weight the same at nt=1..8"},
         {"what": "PIPE exactness", "metric": "gate", "low": 0.0, "high": 0.0,
          "why": "FORM=1's function (exact_weights_v2 within exact_gate(id), NMSE vs float64) at every point before it "
                 "is timed; bit-identical to FORM=1 PIPE=0 at the same split (GPU test test_gemv_pipe_parity)"},
     ],
     "measured": "H100 80GB HBM3 at 2406c00 (built at 5740e33's kernel source), copy line 2.99 TB/s, read flush, 300 us "
                 "lead, 3 interleaved pairs, every point gated first (exact_rel <= 6.5e-7, NMSE 3.9e-8). q4_K 4096x14336 "
                 "nt=1 f16: FORM=1 MT=1 default split (S=9, 576 CTAs on 528 slots) 27.4 us (40%); one-wave split (S=8, "
                 "512 CTAs) 21.0 us (53%, 1.30x); MT=2 one-wave 23.8 us; PIPE=4 MT=1 default 30.3 us, PIPE=4 one-wave "
                 "28.9 us (MT=2 29.9 us), PIPE=2 one-wave 26.0 us. The one-wave split wins at every shape and nt 1..4 "
                 "(4096x4096 11.0 vs 12.8 us, 11008x4096 18.8 vs 21.9 us, 14336x4096 22.3 vs 26.6 us at nt=1); the "
                 "ring loses at every nt=1 point (PIPE=2 / PIPE=4 0.89-0.97, PIPE=4 one-wave / PIPE=0 one-wave "
                 "1.29-1.38 at the three large shapes); nt=8 / nt=1 of PIPE=4 one-wave 0.98-1.13. cuBLAS fp16 on "
                 "dequantized weights 43.9 us at 4096x14336.",
     "verdict": "missed the headline: 28.9 us (PIPE=4, one wave) against the predicted 14-18 us; the lever that won "
                "is the one-wave split alone (20-25 us predicted, 21.0 us measured: within). The ring made every form "
                "slower, so bytes in flight per SM were not what held the kernel: the ring's cp.async / commit / wait "
                "and barrier per super-block cost more than the latency they hid, and its 39 KB a CTA moved MT=1 from "
                "4 to 5 CTAs an SM without a faster stream. Best of the step: 21.0 us = 53% of the copy line "
                "(0.76x MMVQ's 16.05 us, measured on an H100 in an earlier call, not in this one). PIPE leaves the product at "
                "the next step (reproducible at 2406c00 with `labkernels gpu check --steps gemv_step3`); the one-wave "
                "split becomes gemv_kq's default split once the benchmark of record confirms it for q6_K and f32.",
     "counters": "Nsight Compute (--set full, caches flushed, one launch each; H100 80GB HBM3, commit 5319d8c; the "
                 ".ncu-rep came back with the device call but is not a recorded run): q4_K 4096x14336 nt=1 f16, "
                 "FORM=1 MT=1 one-wave 22.2 us, DRAM read 1.50 TB/s (33.3 MB), warps active 22% of the SM's 64, "
                 "issue active 39%, 106 registers a thread: 4 CTAs (16 warps) an SM, held by registers; default split "
                 "29.5 us / 1.12 TB/s; MT=2 one-wave 24.1 us / 1.39 TB/s, 150 registers, 3 CTAs an SM; PIPE=4 one-wave "
                 "31.1 us / 1.07 TB/s at 94 registers and 5 CTAs an SM (26% warps active); FORM=0 MT=2 default 28.4 us. "
                 "What stands between the kernel and the line: few warps (register-limited) each waiting on its "
                 "super-block's loads at the top of the loop -- the next lever is bytes in flight per warp without a "
                 "shared-memory ring (a register double buffer of the next super-block's 32 B a lane) or fewer "
                 "registers for 5-6 CTAs an SM."},
    # step 4: written 2026-12-07 before its run, from step 3's run (H100) and the decode's split of the step time
    {"step": 4, "name": "the winner in the product: the benchmark of record with FORM=1 and the one-wave split, the "
                        "decode on the recorded fastest configuration",
     "commit": "7c063b3", "card": "NVIDIA H200", "runs": ["20261207T131457Z-h200-0b009b5"], "gpu_check": "gemv_step4",
     "analysis": {
         "what changes": "qmatmul(kernel='gemv_kq') (the decode's GEMV) no longer runs MT=2 FORM=0 at the default "
                         "split: it runs the fastest gemv_kq configuration of the recorded benchmark at the nearest "
                         "point (gemv.recorded_config: FORM=1 only for q4_K at nt <= 8, the one-wave split recomputed "
                         "for the shape asked); qmatmul(auto) reads FORM=1 and the one-wave split too, never PIPE.",
         "the benchmark of record": "PLAN's points (4 shapes, nt 1..16, q4_K and q6_K, f16 and f32) with the "
                                   "launches of STEP4_PLAN: FORM 0/1 x MT 1/2 x the default / one-wave split, "
                                   "wgmma and cuBLAS fp16 beside them, interleaved, every point gated first.",
         "the decode step": "the synthetic 7B's step reads 4.08 GB; at 220 tok/s (4.5 ms) it moves 30% of the copy "
                            "line. Its q4_K GEMVs (attn q/k/v/o, ffn gate/up) carry ~70% of the weight bytes and ran "
                            "FORM=0 MT=2 at the default split (step 2: ~28 us at 4096x14336, 1.33x step 3's winner).",
         "step time estimate (gemv_step4)": "150-200 s on an H100 (128 points x 7-9 launches x 3 pairs, the gates); "
                                           "the generation step ~75 s; llama-bench on the same GGUF ~60 s.",
     },
     "prediction": [
         {"what": "best gemv_kq, q4_K 4096x14336 nt=1 f16 (the benchmark of record)", "headline": True,
          "metric": "us", "low": 20.0, "high": 22.5,
          "why": "step 3's FORM=1 MT=1 one-wave 21.0 us reproduced in the benchmark's plan (same flush, lead, pairs)"},
         {"what": "q6_K 4096x14336 nt=1 f16: one-wave / default split time (best MT each, FORM=0)", "metric": "ratio",
          "low": 0.75, "high": 0.95,
          "why": "the same partial second wave removed (q6_K reads 1.46x the bytes: the tail is a smaller share)"},
         {"what": "best gemv_kq f32 / f16 activations, nt=1, every shape", "metric": "ratio", "low": 1.0, "high": 1.1,
          "why": "the activations are 1-2% of the bytes at nt=1 (57 KB f32 against 33 MB of weights)"},
         {"what": "best gemv_kq nt=8 / nt=1 time, q4_K f16, every shape", "metric": "ratio", "low": 1.05, "high": 1.4,
          "why": "step 3: FORM=1 one-wave 1.3-1.4 at MT=1, MT=2's one wave 1.13-1.17 at the large shapes"},
         {"what": "synthetic 7B Q4_K_M tokens/s after a 512-token prompt (generate, H100)", "metric": "tok/s",
          "low": 245.0, "high": 275.0,
          "why": "the q4_K GEMVs ~25% faster (28 -> 21 us at the 7B's largest shape) on ~70% of the bytes, if the "
                 "GEMVs are ~80% of the step: 12-20% less step time (220 -> 250-275); llama-bench tg128 285 in the "
                 "same call: 0.86-0.96x (the bar, 2x, stays out of reach of this step)"},
         {"what": "gates", "metric": "gate", "low": 0.0, "high": 0.0,
          "why": "every point of the benchmark gated before it is timed; the decode's logits against the prefill's "
                 "(test_decode_gpu) with the new configuration"},
     ],
     "measured": "NVIDIA H200 at 0b009b5 (the step's source 7c063b3 unchanged for FORM 0/1), copy line 4.14 TB/s, "
                 "read flush, 300 us lead, 3 interleaved pairs, every point gated first; run "
                 "20261207T131457Z-h200-0b009b5 (the benchmark of record since). q4_K 4096x14336 nt=1 f16: FORM=1 "
                 "MT=1 one-wave 19.10 us (42% of the line), FORM=0 MT=1 one-wave 19.31, MT=2 FORM=0 default (the "
                 "decode's earlier choice) 26.8 us; q6_K 20.83 us (56%, FORM=0 MT=1 one-wave). The fastest "
                 "configuration is not one form: FORM=1 at f16 nt=1, FORM=0 MT=1 one-wave at f32 nt=1 (19.60 vs "
                 "22.37 us), MT=2 FORM=1 one-wave at nt=8 (26.37 us). q6_K one-wave / default (FORM=0, best MT) "
                 "0.80-0.90 at nt=1 (f16 and f32); best f32 / f16 at nt=1 1.02-1.05 (q4_K and q6_K, every shape); "
                 "q4_K f16 nt=8 / nt=1 1.26-1.38. wgmma 44.5 us and cuBLAS fp16 32.6 us at 4096x14336 nt=1 f16. "
                 "Generation (run 20261207T131746Z-h200-0b009b5, same call): synthetic 7B 291 / 280 / 233 tok/s after "
                 "128 / 512 / 2048-token prompts (27% of the copy line at 512), synthetic Gemma 3 1,164-1,119 tok/s. "
                 "llama-bench was not run in this call: no ratio to the peer on this card. A fit of time against "
                 "weight bytes over the four shapes (nt=1 f16, tables.stream_fit): the winner pays 6.3 us a launch "
                 "before its bytes and then streams at 58% of the copy line; cuBLAS fp16 7.1 us + 30%; on the H100 "
                 "(step 3's run 20261207T004259Z-h10080gbhbm3-2406c00) the same configuration 6.9 us + 74%.",
     "verdict": "the configuration moved into the product (qmatmul's gemv_kq and the decode read the recorded fastest "
                "per point). Of the three card-free claims all three within: q6_K one-wave / default 0.80-0.90 "
                "(predicted 0.75-0.95), f32 / f16 1.02-1.05 (1.0-1.1), nt=8 / nt=1 1.26-1.38 (1.05-1.4). The headline "
                "(20-22.5 us) and the generation (245-275 tok/s) were predicted for an H100 and measured on an H200: "
                "19.1 us and 280 tok/s, not comparable to the ranges. The bar stays far: 22-56% of the copy line at "
                "nt=1 (target 80%). The time-versus-bytes fit says where: a fixed ~6-7 us a launch (the event floor: "
                "an empty kernel 2.7 us on the H200, round 7's run 20261203T130432Z-h200-e9d5a870b7; the first DRAM "
                "round trip, the split's fold and the wave's tail) is a third of the 19 us, and "
                "the stream between is 58% of the line on the H200 (74% on the H100) -- both must move, the fixed "
                "part first at the 7B's shapes."},
    # step 5: written 2026-12-07 before any GPU run of FORM=2, from step 3's counters (H100) and nvcc 13.0's
    # --resource-usage of the new form (sm_90a)
    {"step": 5, "name": "bytes in flight per warp without a ring: FORM=2, a register double buffer of the next "
                        "super-block's weight bytes",
     "commit": "5ce3996", "card": "NVIDIA H200", "runs": ["20261207T131432Z-h200-0b009b5"], "gpu_check": "gemv_step5",
     "analysis": {
         "what held step 3's winner": "FORM=1 MT=1 one-wave, 21.0 us (53% of the line): 16 warps an SM (106 "
                                     "registers, 4 CTAs), 22% of warps active, issue active 39% (ncu, step 3's "
                                     "counters). Every warp loads its super-block at the top of the loop and computes "
                                     "it after the loads land: nothing of that warp is in flight during its compute "
                                     "(~0.3-0.5 us a super-block), and at the one-wave split a CTA walks only 7 "
                                     "super-blocks, each a full DRAM round trip.",
         "the form": "FORM=2: the header (16 B) and the lane's 32 code bytes of super-block sb + 1 (per row: 96 B a "
                     "lane at MT=1) are loaded into registers before super-block sb is decoded and computed; the "
                     "activations still load at sb's top (L1 hits after the CTA's first warp). The arithmetic is "
                     "FORM=1's lk_form1_superblock: the same bits at the same split.",
         "registers (nvcc 13.0 -cubin sm_90a --resource-usage)": "FORM=2 MT=1 f16 122 (FORM=1 106): both 4 CTAs (16 "
                     "warps) an SM at the 128-thread CTA's allocation granularity; f32 149 (132): both 3 CTAs; "
                     "FORM=2 MT=2 spills 20-40 B under the 3-CTA cap (168): not built (MT=1 only). The ring of step 3 "
                     "is not reused: no shared memory, no barrier, no cp.async groups.",
         "SASS of the loop (nvcc 13.0 sm_90a, f16)": "the activations' eight 16-byte loads at the loop's top, then "
                     "the six 16-byte weight loads of super-block sb + 1 (2 headers, 4 code loads), then sb's 32 "
                     "HMMA: the next weights are in flight through the compute as intended; the activations' L1 / L2 "
                     "latency is still exposed once a super-block (prefetching them too takes 164 registers: 3 CTAs "
                     "an SM, the form not built).",
         "step time estimate (gemv_step5)": "60-100 s on an H100 (32 points x 4 gemv launches + cuBLAS x 3 pairs, "
                                           "the gates).",
     },
     "prediction": [
         {"what": "FORM=2 MT=1 one-wave, q4_K 4096x14336 nt=1 f16", "headline": True, "metric": "us",
          "low": 15.0, "high": 18.5,
          "why": "the super-block's compute (~35-45% of a warp's iteration at 39% issue active) overlaps the next "
                 "loads for 6 of the 7 super-blocks of a split; the fixed costs (launch, first round trip, the "
                 "split's fold: ~3 us) stay: (21.0 - 3) x 0.65-0.85 + 3"},
         {"what": "FORM=2 / FORM=1 time, one-wave, MT=1, q4_K nt=1 f16, the three large shapes", "metric": "ratio",
          "low": 0.72, "high": 0.9, "why": "the same overlap at 25-33 MB"},
         {"what": "FORM=2 / FORM=1 time, one-wave, q4_K 4096x4096 nt=1 f16", "metric": "ratio", "low": 0.85,
          "high": 1.0, "why": "2 super-blocks a split: one overlap, the fixed costs dominate"},
         {"what": "FORM=2 / FORM=1 time, one-wave, q4_K nt=8 f16, the three large shapes", "metric": "ratio",
          "low": 0.75, "high": 0.95, "why": "more compute a super-block at nt=8 (the activations of 8 tokens) to hide"},
         {"what": "FORM=2 / FORM=1 time, one-wave, q4_K nt=1 f32, the three large shapes", "metric": "ratio",
          "low": 0.75, "high": 0.95, "why": "3 CTAs an SM for both: the same overlap with fewer warps"},
         {"what": "FORM=2 exactness", "metric": "gate", "low": 0.0, "high": 0.0,
          "why": "FORM=1's function (exact_weights_v2 within form1_exact_gate, NMSE vs float64) at every point before "
                 "it is timed; bit-identical to FORM=1 at the same split (GPU test)"},
     ],
     "measured": "NVIDIA H200 at 0b009b5, copy line 4.17 TB/s, read flush, 300 us lead, 3 interleaved pairs, every "
                 "point gated first (FORM=2 within FORM=1's exact gate); run 20261207T131432Z-h200-0b009b5. q4_K "
                 "4096x14336 nt=1 f16, one-wave MT=1: FORM=2 20.70 us against FORM=1 19.12 us (1.08); FORM=2 / FORM=1 "
                 "at the one-wave split: nt=1 f16 1.07-1.08 on the three large shapes and 1.10 at 4096x4096, nt=8 f16 "
                 "1.04-1.05 on the large shapes (1.09 at 4096x4096), nt=1 f32 1.05-1.12; at the default split 1.08-1.11 "
                 "(nt=1 f16). The one point where "
                 "FORM=2 was faster: 14336x4096 nt=8 f32 (52.8 vs 54.7 us). Time-versus-bytes fit (nt=1 f16, "
                 "one-wave): FORM=2 7.2 us + 55% of the line, FORM=1 6.3 us + 57%.",
     "verdict": "missed: the headline 20.7 us against the predicted 15-18.5 us, and FORM=2 / FORM=1 1.04-1.12 where "
                "0.72-0.95 was predicted (measured on an H200; the prediction was written from H100 counters, but a "
                "ratio in one process carries across cards). Loading the next super-block's bytes before the current "
                "one's compute made every large point slower: the wait at the top of a warp's loop was not what held "
                "the kernel (the 16 more registers did not cost a CTA an SM; the extra moves and the loop's longer "
                "body did). FORM=2 left the production source (commit 90fd260 holds it and reruns the step); its "
                "loop stays as FORM=3's (step 6), whose warps split a CTA's super-blocks."},
    # step 6: built at 0b009b5 (nvcc 13.0 --resource-usage; no prediction was written before its first, exploratory
    # timings). The prediction below was written 2026-12-07 AFTER those unrecorded timings (quoted in its analysis),
    # for the recorded A/B that has not run: it is a forecast of a reproduction, not a test of the idea.
    {"step": 6, "name": "fewer, fuller CTAs: FORM=3, the CTA's warps on one 16-row group splitting its super-blocks, "
                        "folded in shared memory (no split-K workspace at S=1)",
     "commit": "0b009b5", "card": "NVIDIA H100 80GB HBM3", "runs": ["20261207T195442Z-h10080gbhbm3-045babc"], "gpu_check": "gemv_step6",
     "prediction_written": "written 2026-12-07 after unrecorded exploratory timings of the form, quoted in the "
                           "analysis: a forecast of their reproduction",
     "analysis": {
         "the form": "FORM=3 (q4_K, nt <= 8, MT=1, WARPS 4 or 8): one CTA computes 16 rows; its WARPS warps take "
                     "every WARPS-th super-block of the CTA's split and fold their partial sums in shared memory in "
                     "warp order. At S=1 there is no global workspace, no fence and no arrival atomic: the launch's "
                     "fixed costs lose the split's fold. nvcc 13.0 sm_90: 124 / 120 registers (f16, W4 / W8), 148 / "
                     "127 (f32), 0 spills.",
         "why now": "step 4's fit puts ~6-7 us of the 19 us before the first byte streams; the split's fold (a "
                    "workspace write, a fence, an atomic, the last CTA's read of S partials) is part of it.",
         "exploratory timings (unrecorded; device calls of 2026-12-07, script outside the repo)": (
             "H200 at 0b009b5, q4_K nt=1 f16 unless said: FORM=3 W8 S=1 against FORM=1 one-wave -- 4096x14336 "
             "19.2 vs 19.0 us, 4096x4096 9.49 vs 10.11, f32 4096x14336 20.9 vs 22.4, nt=8 f32 43.1 vs 48.1; "
             "slower at 14336x4096 (23.3 vs 20.7) and 11008x4096 (19.0 vs 17.0). H100 at afd31aa: 4096x14336 "
             "21.17 vs 21.28 us, 4096x4096 10.29 vs 10.78, f32 4096x14336 22.40 vs 24.10."),
         "step time estimate (gemv_step6)": "80-120 s on an H100 or H200 (32 points x 6 launches + cuBLAS + the "
                                            "empty launch x 3 pairs, the gates).",
     },
     "prediction": [
         {"what": "FORM=3 W8 S=1 / FORM=1 one-wave, q4_K 4096x4096 nt=1 f16",
          "check": {"kind": "ratio", "num": "gemv_m1w8_s1_f3", "den": "gemv_m1w4_sw_f1", "points": [{"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 1, "act": "f16"}]}, "headline": True, "metric": "ratio",
          "low": 0.90, "high": 0.97, "why": "the exploratory 0.94 (H200) and 0.95 (H100): the fold's fixed cost "
                                            "is a larger share of a 10 us launch"},
         {"what": "FORM=3 W8 S=1 / FORM=1 one-wave, q4_K 4096x14336 nt=1 f16",
          "check": {"kind": "ratio", "num": "gemv_m1w8_s1_f3", "den": "gemv_m1w4_sw_f1", "points": [{"qtype": "q4_K", "od": 4096, "id": 14336, "nt": 1, "act": "f16"}]}, "metric": "ratio", "low": 0.97,
          "high": 1.03, "why": "exploratory 1.01 / 0.99: at 56 super-blocks a row the stream dominates"},
         {"what": "FORM=3 W8 S=1 / FORM=1 one-wave, q4_K 14336x4096 and 11008x4096 nt=1 f16",
          "check": {"kind": "ratio", "num": "gemv_m1w8_s1_f3", "den": "gemv_m1w4_sw_f1", "points": [{"qtype": "q4_K", "od": 14336, "id": 4096, "nt": 1, "act": "f16"}, {"qtype": "q4_K", "od": 11008, "id": 4096, "nt": 1, "act": "f16"}]}, "metric": "ratio",
          "low": 1.05, "high": 1.2, "why": "exploratory 1.12-1.13: 16 super-blocks a row cut over 8 warps leave "
                                           "each warp 2, the loop's ramp exposed"},
         {"what": "FORM=3 W8 S=1 / FORM=1 one-wave, q4_K 4096x14336 nt=1 and nt=8 f32",
          "check": {"kind": "ratio", "num": "gemv_m1w8_s1_f3", "den": "gemv_m1w4_sw_f1", "points": [{"qtype": "q4_K", "od": 4096, "id": 14336, "nt": 1, "act": "f32"}, {"qtype": "q4_K", "od": 4096, "id": 14336, "nt": 8, "act": "f32"}]}, "metric": "ratio",
          "low": 0.85, "high": 0.97, "why": "exploratory 0.93 (nt=1) and 0.90 (nt=8): FORM=1 at f32 holds 3 CTAs an "
                                            "SM, FORM=3 W8 127 registers holds 2 CTAs of 8 warps"},
         {"what": "the empty launch (the harness's floor, 1 wave of 128-thread CTAs)",
          "check": {"kind": "us", "variant": "empty", "points": "all"}, "metric": "us", "low": 2.0,
          "high": 4.0, "why": "events, launch and CTA start/exit; the fit's intercept minus this is the kernel's "
                              "own fixed cost"},
         {"what": "FORM=3 exactness",
          "check": {"kind": "gate"}, "metric": "gate", "low": 0.0, "high": 0.0,
          "why": "FORM=1's function within form1_exact_gate at every point; at S=1 FORM=1's bits at split WARPS "
                 "(GPU test)"},
     ],
     "measured": "NVIDIA H100 80GB HBM3 at 045babc, copy line 2.94 TB/s, read flush, 300 us lead, 3 interleaved pairs, "
                 "every point gated first; run 20261207T195442Z-h10080gbhbm3-045babc. FORM=3 W8 S=1 / FORM=1 one-wave, nt=1 f16: 4096x4096 0.95 "
                 "(10.37 vs 10.91 us), 4096x14336 0.988 (20.74 vs 20.99 us), 14336x4096 1.14 and 11008x4096 1.09; "
                 "f32 4096x14336 0.92 (nt=1) and 0.89 (nt=8). Over all 32 points 0.76-1.14 (median 0.98): faster at "
                 "every 4096-row point (0.76-0.99, f32 0.76-0.92), slower at every tall f16 point (1.05-1.14). W4 at "
                 "S=1 is worse than W8 (median 1.02); W8 at the one-wave split is W8 at S=1 within 1%. FORM=0 at "
                 "the one-wave split is faster than FORM=1 at every f32 point (0.86-0.93). The empty launch 3.20-3.36 "
                 "us (the timing's floor).",
     "verdict": "all five claims within their ranges -- a forecast of a reproduction (the prediction followed "
                "unrecorded exploratory timings), so a weak test of the idea. FORM=3 is the fastest form measured at "
                "the 4096-row shapes (the 7B's q/k/v/o and down projections) and at f32; it stays in the source and "
                "enters the product only through a benchmark of record that includes it (qmatmul's auto reads step "
                "4's run, which does not): the next device step."},
    # step 7: built at 999f6b5; as step 6, the prediction was written after unrecorded exploratory timings (quoted)
    {"step": 7, "name": "more warps an SM: FORM=4 / FORM=5, FORM=1 under a register cap of 6 / 8 CTAs an SM",
     "commit": "999f6b5", "card": "NVIDIA H100 80GB HBM3", "runs": [STEP7_RUN], "gpu_check": "gemv_step7",
     "prediction_written": "written 2026-12-07 after unrecorded exploratory timings of the form, quoted in the "
                           "analysis: a forecast of their reproduction",
     "analysis": {
         "the form": "FORM=1's source built with __launch_bounds__(128, 6) / (128, 8): 80 / 64 registers, 24 / 32 "
                     "warps an SM where FORM=1 (106 registers) has 16; ptxas spills 0-44 B a thread, so the forms are "
                     "off the main path. The question: is the kernel held by warps an SM (step 3's counters: 22% of "
                     "warps active, issue active 39%)?",
         "exploratory timings (unrecorded; device call of 2026-12-07 on an H100 at afd31aa)": (
             "q4_K 4096x14336 nt=1 f16: FORM=1 one-wave 21.28 us, FORM=4 25.50, FORM=5 28.08; slower at almost "
             "every point. More warps with fewer registers (and spills) made it slower: occupancy is not the "
             "limiter either."),
         "step time estimate (gemv_step7)": "60-90 s (32 points x 5 launches + cuBLAS + the empty launch x 3 pairs).",
     },
     "prediction": [
         {"what": "FORM=4 / FORM=1, one-wave, q4_K 4096x14336 nt=1 f16",
          "check": {"kind": "ratio", "num": "gemv_m1w4_sw_f4", "den": "gemv_m1w4_sw_f1", "points": [{"qtype": "q4_K", "od": 4096, "id": 14336, "nt": 1, "act": "f16"}]}, "headline": True, "metric": "ratio",
          "low": 1.1, "high": 1.3, "why": "exploratory 1.20 on an H100"},
         {"what": "FORM=5 / FORM=1, one-wave, q4_K 4096x14336 nt=1 f16",
          "check": {"kind": "ratio", "num": "gemv_m1w4_sw_f5", "den": "gemv_m1w4_sw_f1", "points": [{"qtype": "q4_K", "od": 4096, "id": 14336, "nt": 1, "act": "f16"}]}, "metric": "ratio", "low": 1.2,
          "high": 1.45, "why": "exploratory 1.32 on an H100: 64 registers spill in the loop"},
         {"what": "FORM=4 and FORM=5 exactness",
          "check": {"kind": "gate"}, "metric": "gate", "low": 0.0, "high": 0.0,
          "why": "FORM=1's bits at the same split (GPU test); every point gated first"},
     ],
     "measured": "NVIDIA H100 80GB HBM3 at 045babc, copy line 2.94 TB/s, same harness as step 6; run 20261207T195543Z-h10080gbhbm3-045babc. "
                 "q4_K 4096x14336 nt=1 f16 at the one-wave split: FORM=4 / FORM=1 1.20 (25.2 vs 21.0 us), FORM=5 / "
                 "FORM=1 1.31. Over the 32 points at the one-wave split FORM=4 0.95-1.21 (median 1.07), FORM=5 "
                 "0.89-1.33 (median 1.13); at the default split 1.02-1.53. Faster than FORM=1 only at f32 with nt >= "
                 "4 on some shapes (best: FORM=5 at 14336x4096 nt=8 f32, 47.9 vs 54.0 us; FORM=0 took 49.5 there in step 6's run).",
     "verdict": "within: more warps an SM under a register cap (and the spills it forces) made the kernel slower at "
                "every f16 point, as the exploratory timings said: occupancy is not what holds gemv_kq. FORM=4 and "
                f"FORM=5 left the production source (commit {FORM45_HOLDER} holds them and reruns the step)."},
    # step 8: written 2026-12-07 before any GPU run of PF=1, from step 4's fit (6.3 us a launch before the bytes flow),
    # the generation run 20261207T131746Z (H200: 280 tok/s = 3.57 ms a step for the synthetic 7B at a 512-token
    # prompt) and nvcc 13.0's build of the PF=1 instantiations (sm_90a)
    {"step": 8, "name": "the weights before the wait: gemv_kq's PF=1 build prefetches its weight bytes into L2 while the "
                        "kernel ahead of it in the decode graph still runs",
     "commit": "74e666b", "card": "NVIDIA H100 80GB HBM3", "runs": [STEP8_RUN], "gpu_check": "gemv_step8",
     "analysis": {
         "what the decode graph does now": "every lab kernel of the step, gemv_kq included, launches "
                     "programmatically (PDL): each begins with griddepcontrol.wait then launch_dependents, so a "
                     "GEMV's CTAs may become resident while the kernel ahead -- an RMSNorm, decode_qkv / the "
                     "attention, the gate/up activation, each a few CTAs for a few us -- still runs, and then wait "
                     "idle. Its weights stream only after the wait: step 4's fit says a launch pays ~6 us (the timing's "
                     "floor ~2.7 us of it) before its bytes flow at 58% of the copy line.",
         "the change": "PF=1 (FORM 0/1/3, every decode GEMV): before the wait each CTA issues one "
                       "cp.async.bulk.prefetch.L2 a row of its range of super-blocks (q4_K; four a row for q6_K's "
                       "planes): the bytes it will read start moving while the kernel ahead runs. Weights are never "
                       "written by a kernel of the step, so nothing prefetched can be stale; nothing is read into "
                       "registers before the wait; the arithmetic and bits are PF=0's. PrefillOptions.gemv_pf (off) "
                       "selects it in the decode graph.",
         "build (nvcc 13.0 -cubin sm_90a)": "24 PF=1 instantiations, 0 spills, registers within -6..+11 of the PF=0 "
                       "twin with the same CTAs an SM (FORM=1 MT=1 f16 106 -> 108); the PTX issues the prefetches "
                       "before griddepcontrol.wait; every PF=0 instantiation's machine code unchanged.",
         "the decode step": "the synthetic 7B at a 512-token prompt: 3.57 ms a step (H200), 4-5 GEMVs a layer x 32 "
                            "layers + the head, each behind a short kernel; if a GEMV's stream starts 1-3 us earlier, "
                            "0.15-0.45 ms a step.",
         "step time estimate (gemv_step8)": "60-90 s on an H100 or H200 (2 models x 3 repeats x 2 values, a capture "
                                            "each, 128 replays).",
     },
     "prediction": [
         {"what": "synthetic 7B tok/s, PF=1 / PF=0, after a 512-token prompt (same process, alternating)",
          "check": {"kind": "gen_ratio", "option": "gemv_pf", "model": "synthetic-7b", "n_prompt": 512},
          "headline": True, "metric": "ratio", "low": 1.03, "high": 1.12,
          "why": "1-3 us of each of ~150 GEMVs' start hidden behind the kernel ahead: 0.15-0.45 ms of 3.57 ms"},
         {"what": "synthetic Gemma 3 tok/s, PF=1 / PF=0, after a 512-token prompt",
          "check": {"kind": "gen_ratio", "option": "gemv_pf", "model": "synthetic-gemma3", "n_prompt": 512}, "metric": "ratio", "low": 1.02,
          "high": 1.15, "why": "small GEMVs (640-wide, ~0.1-0.5 MB): a prefetch covers most of a GEMV's bytes, but "
                               "the step is held by launches and small kernels more than by bytes"},
         {"what": "tokens and graph check",
          "check": {"kind": "gen_same", "option": "gemv_pf"}, "metric": "gate", "low": 0.0, "high": 0.0,
          "why": "PF=1's greedy tokens equal PF=0's (first tokens recorded per row), the captured step's first replay "
                 "equal to its eager warm-up (diff 0); GPU tests: PF=1's bits equal PF=0's at every form and split"},
     ],
     "measured": "NVIDIA H100 80GB HBM3 at 045babc, copy line 2.94 TB/s; run 20261207T195308Z-h10080gbhbm3-045babc: synthetic 7B after a 512-token "
                 "prompt, 128 new tokens, graph replay, 3 alternating pairs in one process: PF=0 278.0 tok/s, PF=1 "
                 "262.6 (PF=1 / PF=0 0.945, pairs 0.942-0.946); synthetic Gemma 3: 1,095 vs 1,062 tok/s (0.969, "
                 "0.967-0.978). Tokens equal, the captured step's first replay equal to its eager warm-up.",
     "verdict": "missed: PF=1 made both decodes slower (0.945 / 0.969 where 1.03-1.12 / 1.02-1.15 was predicted). "
                "Prefetching a GEMV's weight range into L2 before its wait cost ~0.2 ms a 7B step (~1.3 us a GEMV) "
                "instead of saving it. Not diagnosed: ncu's DRAM and L2 bytes a GEMV with PF on and off would say "
                "whether bytes were fetched twice (prefetched, evicted, read again) or the prefetches delayed the "
                f"first demand loads. PF=1 left the production source (commit {PF_HOLDER} holds it and reruns the "
                "step)."},
    # step 9: written 2026-12-07 before its run, from step 6's H100 run (20261207T195442Z-h10080gbhbm3-045babc) and step
    # 4's benchmark of record (H200, 20261207T131457Z-h200-0b009b5); the kernel is 3fe7315's (FORM=3 unchanged since
    # 0b009b5, its machine code pinned by tests/test_machine_code.py)
    {"step": 9, "name": "step 6's winner in the product: the benchmark of record with FORM=3 beside step 4's launches",
     "commit": "3fe7315", "card": None, "runs": [], "gpu_check": "gemv_step9",
     "analysis": {
         "why": "step 6 measured FORM=3 (W8, S=1) faster than FORM=1 at every 4096-row point (0.76-0.99) and slower on "
                "the tall shapes (1.05-1.14), but qmatmul's auto and the decode read step 4's benchmark of record, "
                "which never timed FORM=3: the product cannot pick it. This step records the benchmark again with "
                "FORM=3 in it (STEP9_PLAN: step 4's seven launches, FORM=3 W8 S=1, the empty launch beside wgmma and "
                "cuBLAS); its run becomes the benchmark of record (what: gemv_bench).",
         "what the product will pick": "from step 6's ratios: FORM=3 at 4096x4096 (f16 and f32, nt 1..8) and at "
                "4096x14336 where it beats step 4's other forms (f16 nt >= 2; f32 only where FORM=0 one-wave is not "
                "faster, step 6: FORM=0 0.89 vs FORM=3 0.92 at nt=1); FORM=1 / FORM=0 stay on 14336x4096 and "
                "11008x4096. A recorded S=1 row keeps S=1 at any shape it is chosen for (no split is a choice "
                "that does not depend on the shape; gemv._params).",
         "the decode step": "the 7B's 4096-row GEMVs (q/k/v/o 4096x4096 and ffn_down 4096x11008) are ~45% of its "
                "GEMV time; 5% off them is ~2% of the step: within the generation's run-to-run spread, so no tokens/s "
                "claim is made here.",
         "step time estimate (gemv_step9)": "200-240 s on an H100 (step 4's 150-200 s with one launch and the empty "
                "launch more).",
     },
     "prediction": [
         {"what": "FORM=3 W8 S=1 / FORM=1 one-wave, q4_K 4096x4096 nt=1 f16",
          "check": {"kind": "ratio", "num": "gemv_m1w8_s1_f3", "den": "gemv_m1w4_sw_f1",
                    "points": [{"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 1, "act": "f16"}]},
          "headline": True, "metric": "ratio", "low": 0.92, "high": 0.98,
          "why": "step 6: 0.95 on the H100 (its exploratory 0.94 on the H200)"},
         {"what": "FORM=3 W8 S=1 / FORM=1 one-wave, q4_K 4096x14336 nt=1 and nt=8 f32",
          "check": {"kind": "ratio", "num": "gemv_m1w8_s1_f3", "den": "gemv_m1w4_sw_f1",
                    "points": [{"qtype": "q4_K", "od": 4096, "id": 14336, "nt": 1, "act": "f32"},
                               {"qtype": "q4_K", "od": 4096, "id": 14336, "nt": 8, "act": "f32"}]},
          "metric": "ratio", "low": 0.86, "high": 0.95, "why": "step 6: 0.918 and 0.893"},
         {"what": "FORM=3 W8 S=1 / FORM=1 one-wave, q4_K 14336x4096 and 11008x4096 nt=1 f16",
          "check": {"kind": "ratio", "num": "gemv_m1w8_s1_f3", "den": "gemv_m1w4_sw_f1",
                    "points": [{"qtype": "q4_K", "od": 14336, "id": 4096, "nt": 1, "act": "f16"},
                               {"qtype": "q4_K", "od": 11008, "id": 4096, "nt": 1, "act": "f16"}]},
          "metric": "ratio", "low": 1.04, "high": 1.18, "why": "step 6: 1.09-1.14 (the product keeps FORM=1 there)"},
         {"what": "the empty launch (the timing's floor)", "check": {"kind": "us", "variant": "empty", "points": "all"},
          "metric": "us", "low": 2.0, "high": 4.0, "why": "step 6 on the H100: 3.20-3.36 us; the H200 2.7 us"},
         {"what": "gates", "check": {"kind": "gate"}, "metric": "gate", "low": 0.0, "high": 0.0,
          "why": "every point of the benchmark gated before it is timed (FORM=3 within FORM=1's exact gate)"},
     ],
     "measured": None, "verdict": None},
    # step 10: written 2026-12-07 ~23:45 UTC before any GPU run of the register form, from the decode decomposition of
    # 2026-12-07 (H100, run 20261207T195646Z-h10080gbhbm3-045babc, status failed: the 7B's rows only) and the PTX of
    # add_rmsnorm_kernel (nvcc 13.0 -ptx sm_90: the loop form's body is not unrolled, one ld.global of x and of a and
    # one st.global an iteration)
    {"step": 10, "name": "the norms at one row: add_rmsnorm's row in registers (PrefillOptions.norm_regs) against its "
                         "loop",
     "commit": "b3fd61f", "card": None, "runs": [], "gpu_check": "decode_step10",
     "analysis": {
         "why": "the decode decomposition of the synthetic 7B (ctx 512, graph replay, H100) puts 676 us of a 3,531 us "
                "step in 65 norm launches (64 add_rmsnorm + the first layer's rmsnorm): 10.4 us a launch, more than "
                "the 4096x4096 GEMV (8.3 us). At one row add_rmsnorm is one block of 256 threads whose loop loads one "
                "element of x and of the GEMV's output a an iteration and waits for them: 16 dependent round trips to "
                "L2 a pass at 4096 columns, then a third pass re-reading x and w.",
         "the form": "J > 0 (registry.norm_j: the smallest of 4, 8, 16, 32 with J * 256 >= ncols): the thread's J "
                     "elements of a, x, w (and the post-norm weight) loaded up front -- 48-64 loads in flight a "
                     "thread, one round trip --, then the loop's sums, products and stores in the loop's order: the "
                     "same bits (GPU test at 640, 1000, 4096, 8000 columns, 1 and 5 rows). nvcc 13.0 sm_90: 28 "
                     "registers (J=4, PRE=1 OUT16=1: 48), 117 at J=16, 254 at J=32, 0 spills. Only at <= 16 rows "
                     "(NORM_REGS_MAX_ROWS): a prefill's rows fill the SMs with blocks that hide the loop's latency.",
         "the decode step": "the 7B: 64 add_rmsnorm a step, each from ~10 us to ~2-4 us (one round trip, two block "
                            "sums, the stores): 0.38-0.54 ms of 3.53 ms. Gemma 3 (640 columns, the post-norm of the "
                            "delta first: PRE=1): 37 launches of 3 iterations a pass (9 round trips) to one round "
                            "trip: ~1.5-3 us each of a ~0.95 ms step.",
         "step time estimate (decode_step10)": "60-90 s on an H100 or H200 (2 models x 3 repeats x 2 values, a "
                                               "capture each, 128 replays).",
     },
     "prediction": [
         {"what": "synthetic 7B tok/s, norm_regs / loop, after a 512-token prompt (same process, alternating)",
          "check": {"kind": "gen_ratio", "option": "norm_regs", "model": "synthetic-7b", "n_prompt": 512},
          "headline": True, "metric": "ratio", "low": 1.10, "high": 1.18,
          "why": "0.38-0.54 ms of the 3.53 ms step: 64 norms from ~10 us to 2-4 us"},
         {"what": "synthetic Gemma 3 tok/s, norm_regs / loop, after a 512-token prompt",
          "check": {"kind": "gen_ratio", "option": "norm_regs", "model": "synthetic-gemma3", "n_prompt": 512},
          "metric": "ratio", "low": 1.03, "high": 1.12,
          "why": "37 norms of 640 columns, 9 round trips to 1: 55-110 us of a ~0.95 ms step"},
         {"what": "tokens and graph check",
          "check": {"kind": "gen_same", "option": "norm_regs"}, "metric": "gate", "low": 0.0, "high": 0.0,
          "why": "the register form's bits are the loop's (GPU test), so the greedy tokens are equal and the captured "
                 "step's first replay equals its eager warm-up"},
     ],
     "measured": None, "verdict": None},
]


#: the commit that holds gemv_kq's PIPE form (round 9 step 3's cp.async ring) and its step: the last one with them
PIPE_HOLDER = "a1cf954"

#: the commit that holds gemv_kq's FORM=2 (round 9 step 5's register double buffer) and its step
#: (``gpu check --steps gemv_step5``): the last one with them
FORM2_HOLDER = "90fd260"
#: the run of step 5's A/B (H200, commit 0b009b5): FORM=1 against FORM=2, the measurement FORM=2 lost
STEP5_RUN = "20261207T131432Z-h200-0b009b5"


def _cmd(commit: str, name: str) -> str:
    return (f"git worktree add /tmp/lk-{commit} {commit} && cd /tmp/lk-{commit} && "
            f"python3 -m labkernels gpu check --steps {name} --out DIR   # on an H100/H200")


def _ledger(name: str) -> dict:
    return next((s for s in LEDGER if s.get("gpu_check") == name), {})


def _claims(claims) -> str:
    return "; ".join(f"{c['what']}: {c['low']:g}-{c['high']:g} ({c['metric']})" for c in claims)
