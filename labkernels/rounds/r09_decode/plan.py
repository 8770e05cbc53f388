"""Round 9's plans, with its bar and its first prediction: the benchmark of record's points (:data:`PLAN`, the round's
one plan), the bar of the issue that opened the round (:data:`TARGETS`), what the first gemv_kq build should measure
(:data:`PREDICTION`, written before its first run), each step's A/B (:data:`STEP2_PLAN` .. :data:`STEP7_PLAN`,
:data:`GEN_STEP8_PLAN`; the retired steps 3, 5, 7 and 8's as they ran) and the generation benchmark's
(:data:`GEN_PLAN`). Data only: the round's other files read it."""

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


#: step 9: the benchmark of record again (what: gemv_bench -- the run qmatmul's auto and the decode read), with step 6's
#: winner in it: STEP4_PLAN's points and launches, FORM=3 (MT=1, WARPS=8, S=1: no split) beside them, and the empty
#: launch (the timing's floor) beside wgmma and cuBLAS fp16. FORM=3 runs where its form can (q4_K, nt <= 8); elsewhere
#: the bench leaves it out as it does FORM=1. Launches (MT, WARPS, FORM, S)
STEP9_PLAN = {**STEP4_PLAN, "baselines": ["wgmma", "cublas", "empty"],
              "launches": [*STEP4_PLAN["launches"], [1, 8, 3, 1]]}


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


#: step 7's A/B as it ran (round 9 step 7, retired: the record of its plan, not runnable here): FORM=4 / FORM=5 (FORM=1
#: under a register cap of 6 / 8 CTAs an SM) against FORM=1, each at its own one-wave split and at the default split,
#: beside cuBLAS fp16 and the empty launch; q4_K, the four shapes, nt <= 8, f16 and f32. Launches (MT, WARPS, FORM, S)
#: -- FORM=4 / 5 left the source; commit 7894b07 holds them
STEP7_PLAN = {"shapes": [list(s) for s in SHAPES], "nts": [1, 2, 4, 8], "qtypes": ["q4_K"], "acts": ["f16", "f32"],
              "pairs": 3, "repeats": 20, "seed": 0, "flush": "read", "lead_us": 300.0, "baselines": ["cublas", "empty"],
              "launches": [[1, 4, 1, "wave"], [1, 4, 4, "wave"], [1, 4, 5, "wave"], [1, 4, 4, None],
                           [1, 4, 5, None]]}


#: step 8's A/B as it ran (round 9 step 8, retired: the record of its plan, not runnable here -- PF=1 and
#: PrefillOptions.gemv_pf left the source; commit 7894b07 holds them): the decode with gemv_kq's PF=1 build in its
#: graph (the CTA's weight bytes prefetched into L2 before its PDL wait) against PF=0, generate after a 512-token
#: prompt, the two alternating in every repeat (PrefillOptions gemv_pf False / True: a decoder and graph each); the
#: synthetic 7B (4 GEMVs a layer behind a norm, the attention, a norm and the gate/up activation) and the synthetic
#: Gemma 3 (small GEMVs, launch-bound)
GEN_STEP8_PLAN = {"models": ["synthetic-7b", "synthetic-gemma3"], "prompts": [512], "n_new": 128, "repeats": 3,
                  "ab": {"gemv_pf": [False, True]}}


#: step 10's A/B: the decode with add_rmsnorm's register form (PrefillOptions.norm_regs) against its loop, alternating in
#: every repeat in one process, both models after a 512-token prompt
GEN_STEP10_PLAN = {"models": ["synthetic-7b", "synthetic-gemma3"], "prompts": [512], "n_new": 128, "repeats": 3,
                   "ab": {"norm_regs": [False, True]}}


#: the generation benchmark's plan: models, prompt lengths (the context before the first new token), new tokens
GEN_PLAN = {"models": ["synthetic-gemma3", "synthetic-7b"], "prompts": [128, 512, 2048], "n_new": 128, "repeats": 3}


#: the context sweep: tokens/s against context length, 128 .. 8192 (step ``generate_context``; GEN_PLAN stays the plan
#: of the recorded generation runs). The prompts are chosen so that the last new token's context ends at 160 .. 8192
#: keys: 4064 + 32 = 4096 is the synthetic 7B's n_ctx_train (llama 7B's), the top it can take; 8160 + 32 = 8192 is
#: taken by the Gemma 3 shapes (n_ctx_train 32768) and refused for the 7B -- recorded as a skipped point (table
#: ``generate_skipped``), not dropped. The KV cache at the top (decode.cache_bytes: layers x positions x kv heads x
#: (K + V dims) x 2 B): synthetic-gemma3 18 x 8192 x 1 x (256 + 256) x 2 B = 0.15 GB; synthetic-7b 32 x 4096 x 32 x
#: (128 + 128) x 2 B = 2.1 GB (8192 would be 4.3 GB: it fits an 80 GB card, the model's context does not take it); a
#: point whose cache does not fit 80% of the memory free after the model's upload is skipped the same way.
#: Device time, estimated (H100): the two models' load and upload ~30-40 s (the generation run of 2026-12-07, 84 s on
#: an H200, held 18 generates of 128 tokens beside them); 11 points x 2 repeats x (prefill <= 1.5 s at 4064 / 8160
#: tokens, the step's capture ~0.5 s, 31 replays <= 0.2 s) ~30-50 s; the copy line 1 s: ~1.5-2 min in all.
GEN_CONTEXT_PLAN = {"models": ["synthetic-gemma3", "synthetic-7b"], "prompts": [128, 512, 1024, 2048, 4064, 8160],
                    "n_new": 32, "repeats": 2}


#: the decode-step decomposition (step ``decode_decomp``): per model and context (keys the step attends: the prompt's
#: length; the step at that position), one eager step traced launch by launch with CUPTI (every launch in an op label
#: of Decoder._step_device), ``repeats`` untraced eager steps (host wall), ``repeats`` graph replays of the same step
#: timed with CUDA events behind a ``lead_us`` lead, and ``traced_replays`` replays traced (the graph's kernels mapped
#: to the eager step's classes by their order). A context the model cannot take (prompt + 2 > n_ctx_train: the 7B at
#: 8192) is recorded as skipped. Device time, estimated (H100): the 7B's load and upload ~20-30 s, Gemma's ~5 s; a
#: point: the prefill (0.1-1 s), the capture (~0.5 s), the traced eager step (~0.5-1 s with CUPTI's flush), 20 eager
#: steps (~0.1 s), 20 replays behind the lead (~0.1 s), 3 traced replays (~0.5 s): ~2-4 s; 5 points (7B 512 / 4032,
#: Gemma 512 / 4032 / 8192; 7B 8192 skipped) and the copy line: ~1-1.5 min in all.
DECOMP_PLAN = {"models": ["synthetic-7b", "synthetic-gemma3"], "contexts": [512, 4032, 8192], "repeats": 20,
               "lead_us": 300.0, "traced_replays": 3}

#: the decomposition's new tokens per generate: the prefill's token, then one step (captured, its first replay checked)
DECOMP_NEW = 2


#: what the decomposition should measure, written 2026-12-07 before any run of it (no decode step has been traced yet).
#: ``low``-``high``: this round's estimate, from the bytes each class reads against the copy line and the recorded
#: runs named in ``why``; ``opening``: the range the task that built the step opened with (GEMV 75-85% and attention
#: 4-8% of the 7B's step at 512, attention 25-35% at 4032), kept beside it -- the recorded generation run puts the
#: 7B's attention above it (see the attention claims' why). ``share``: the class group's time over the step (the
#: graph replay's time: the groups' kernel time in the traced replays plus the gaps; the shares sum to 1);
#: ``ratio`` / ``frac``: as named.
DECOMP_PREDICTION = {
    "written": "2026-12-07, before the first run of decode_decomp (nothing traced yet); the figures it reads are the "
               "H200 generation run 20261207T131746Z-h200-0b009b5 and the H200 GEMV benchmark "
               "20261207T131457Z-h200-0b009b5; the H100's copy line 2.98 TB/s (step 1), the H200's 4.17",
    "claims": [
        {"what": "synthetic-7b, context 512: GEMV (every projection and the head)", "model": "synthetic-7b",
         "context": 512, "metric": "share", "group": "gemv", "low": 0.66, "high": 0.80, "opening": [0.75, 0.85],
         "why": "3.9 GB of weights a token (q4_K 144 B / q6_K 210 B a 256-weight block): 1.31 ms at the H100's copy "
                "line, 0.94 ms at the H200's. gemv_kq reads them at 22-42% (q4_K) / 31-56% (q6_K) of the line at nt=1 "
                "(H200 benchmark: 4096x4096 10.2 us, 11008x4096 17 us, 4096x14336 19 us): ~82 us a layer (Q+K, V, O, "
                "gate+up stacked, down) x 32 + the 107 MB head ~40 us = 2.6-2.9 ms of a 3.6-4.0 ms step"},
        {"what": "synthetic-7b, context 512: attention (decode_attn)", "model": "synthetic-7b", "context": 512,
         "metric": "share", "group": "attention", "low": 0.07, "high": 0.14, "opening": [0.04, 0.08],
         "why": "the KV cache is 0.5 MB a context token (32 layers x 32 kv heads x 128 x (K, V) x 2 B): 269 MB at 512, "
                "0.09 ms at the H100's line; but the recorded generation grows by 0.47 us a step per context token "
                "from 512 to 2048 (H200: 3.57 -> 4.29 ms; 1.1 TB/s, ~27% of its line): ~0.24 ms at 512 (~0.33 on the "
                "H100 if it scales with the line), plus a floor of 32 launches of two phases (chunks, then the "
                "last CTA's fold: ~3-5 us each, 0.1-0.16 ms) -- 0.35-0.5 ms of the step, above the opening 4-8%"},
        {"what": "synthetic-7b, context 4032: attention (decode_attn)", "model": "synthetic-7b", "context": 4032,
         "metric": "share", "group": "attention", "low": 0.30, "high": 0.46, "opening": [0.25, 0.35],
         "why": "2.1 GB of cache at 4032 (0.71 ms at the H100's line); at the recorded 0.47 us a token (H200) 1.9 ms "
                "+ the floor, ~2.6 ms if the H100 reads it at its line's fraction: 2.0-2.8 ms of a 5.2-6.3 ms step"},
        {"what": "synthetic-7b, context 4032: GEMV", "model": "synthetic-7b", "context": 4032, "metric": "share",
         "group": "gemv", "low": 0.42, "high": 0.60,
         "why": "the same 2.6-2.9 ms of GEMV over the longer step"},
        {"what": "synthetic-7b, context 512: small kernels and gaps (the rest)", "model": "synthetic-7b",
         "context": 512, "metric": "share", "group": "small+gaps", "low": 0.08, "high": 0.22,
         "why": "131 one-row launches (2 norms + decode_qkv + act_mul_gu a layer, embed, output norm, argmax): bytes "
                "negligible (a 4096-float row), each latency-bound at ~2-3 us: 0.3-0.4 ms; ~310 graph nodes with "
                "programmatic launches leave ~0.5-1 us between nodes: 0.15-0.3 ms"},
        {"what": "synthetic-7b, context 512: graph replay / eager step (host wall)", "model": "synthetic-7b",
         "context": 512, "metric": "ratio", "group": "graph/eager", "low": 0.55, "high": 0.95,
         "why": "the eager step launches ~310 kernels from Python (~8-15 us each: 2.5-4.5 ms of host time against "
                "~3.6 ms of GPU work, partly overlapped); the replay leaves only the node gaps"},
        {"what": "synthetic-gemma3, context 512: GEMV (cuBLAS fp16 on the q5_0 / q8_0 weights, gemv_kq on the "
                 "k-quants, the tied 262144 x 640 head)", "model": "synthetic-gemma3", "context": 512,
         "metric": "share", "group": "gemv", "low": 0.40, "high": 0.65,
         "why": "the head's fp16 copy is 335 MB (~80-110 us at the line); every other GEMV is small (0.2-2.6 MB) "
                "and latency-bound at ~4-8 us: ~4 a layer x 18 = 0.3-0.5 ms of a ~0.88 ms step (H200: 1,140 tok/s)"},
        {"what": "synthetic-gemma3, context 512: small kernels and gaps", "model": "synthetic-gemma3",
         "context": 512, "metric": "share", "group": "small+gaps", "low": 0.25, "high": 0.50,
         "why": "18 layers of one-row norms (with the post-norms fused), decode_qkv, act_mul_gu: ~75 launches at 2-3 us "
                "and ~150 graph nodes' gaps, against a step whose bytes (~0.5 GB) take ~0.15 ms at the line"},
        {"what": "synthetic-gemma3: attention at 4032 / at 512", "model": "synthetic-gemma3", "context": 4032,
         "metric": "attention_ratio", "group": "attention", "low": 0.9, "high": 1.6,
         "why": "15 of the 18 layers slide over 512 keys: only the 3 global layers read the longer cache (3 layers x 1 kv "
                "head x (256 + 256) x 2 B = 3 KB a token: 12 MB at 4032); the recorded generation's step grows 1.9% "
                "from 512 to 2048 (H200)"},
        {"what": "every point: traced kernel time the classes name (not 'unclassified')", "model": None,
         "context": None, "metric": "frac", "group": "classified", "low": 0.95, "high": 1.0,
         "why": "every launch of Decoder._step_device runs inside an op label; the names classify the rest"},
    ],
}
