# %% [markdown]
# # Round 9 — Decode at the HBM line: k-quant matrix-vector kernels

# %% tags=["parameters"]
mode: "OneOf[auto, measure, replay]" = "auto"   # measure (GPU) | replay (recorded run) | auto
shapes: "NonEmpty[List[Shape]]" = [[4096, 4096], [14336, 4096], [4096, 14336], [11008, 4096]]   # [od, id] of the 7B weights (measure mode)
nts: "NonEmpty[List[Range[1, 16]]]" = [1, 2, 3, 4, 6, 8, 12, 16]   # tokens per launch (measure mode; replay shows the recorded ones)
qtype: "OneOf[q4_K, q6_K]" = "q4_K"   # weight type of the lead figure
act: "OneOf[f16, f32]" = "f16"   # activation type of the lead figure

# %%
import numpy as np, pandas as pd, matplotlib.pyplot as plt
from IPython.display import Markdown
from labkernels import report
report.setup()
from labkernels.rounds import open_round
from labkernels.rounds import r09_decode as r9
r = open_round("09", mode, shapes=shapes, nts=nts)
mode, run = r.mode, r.run
r.banner()
report.lead()        # the abstract, headline and result figure, filled in below
bench = r9.bench_table(run)
best = r9.best_per_point(bench)
line = r9.copy_line(run)

# %% [markdown]
# ## Method
#
# A decode step reads every weight once per token, so its floor is the weight bytes over the memory bandwidth: the
# line this round measures against is the **copy line**, a 1 GiB device-to-device copy timed in the same process
# (bytes read + written over its median time). The kernel, `gemv_kq` (`labkernels/kernels/gemv_kq.cu`, launcher
# `labkernels.gemv`), reads q4_K weights as the GGUF rows were uploaded and q6_K weights repacked once at load into
# planes of the same 210 bytes a super-block; the activations are read as they are (f16, or f32 rounded to f16 at the
# fragment). Each weight is dequantized exactly in registers — the 4/6-bit code made an f16 number by a magic exponent
# and an exact subtraction, then one rounding of `q·S + B` — and the tensor cores multiply with the tokens as the
# `mma.m16n8k16` n dimension, so 1 to 8 tokens cost one mma per k-step. A lane of a quad owns 64 k of each
# super-block (a k permutation applied to both operands); splits of the super-blocks across CTAs are added in split
# order by the CTA that arrives last, so the result is deterministic.
#
# **Parity first.** Every point was gated before it was timed (all rows; the first, middle and last token) against the
# kernel's exact function (`labkernels.gemv.emulate_weights`: only the f32 summation order may differ, ≤ 1e-5·√(K/1024))
# and gguf-py's float64 dequantization (NMSE ≤ 5e-4); the GPU suite gates every instantiation at tails in nt and od,
# NaN-poisoned outputs and guards, and every k-quant tensor of Gemma 3 270M. A numpy mirror of the lane's bit
# operations rebuilds the weights from the bytes a lane loads, bit for bit, on the CPU (`tests/test_gemv.py`).
#
# **Timing.** Medians of CUDA-event timings, the variants interleaved round by round in one process at matched
# (qtype, od, id, nt, activation type), the L2 evicted between launches; the baselines are round 7's `wgmma_kq`
# launch and cuBLAS fp16 on cached dequantized weights. **Read the first runs' times as upper bounds:** the runs of
# 2026-12-06 evicted the L2 by overwriting it (its dirty lines then compete with the launch) and timed the Python
# enqueue inside the events (no lead), which together add ~4-10 µs to a 10-35 µs launch and touch every variant,
# baselines included (step 1 below); the benchmark now evicts by reading and times behind a lead.

# %% [markdown]
# ## The prediction, written before the first run

# %%
pt = r9.prediction_table(run)
display(Markdown(f"Step 1's claims against the page's run ({r9.run_line(run)}), not the run of step 1's build: the "
                 f"verdicts say where the kernel stands now."))
display(report.table(pt, {"measured": "{:.3f}"}))

# %% [markdown]
# ## Time against tokens at the 7B shapes

# %%
fig = r9.figure_time_vs_nt(run, qtype=qtype, act=act)
report.lead_figure(fig, f"Time per launch (µs) of the fastest gemv_kq configuration, round 7's wgmma_kq and cuBLAS "
                        f"fp16 on cached dequantized weights against tokens, {qtype} weights, {act} activations, with "
                        f"the time the weight bytes take at the copy line ({line:.2f} TB/s measured in the same run); "
                        f"run {run.run_id}.")

# %%
other = "q6_K" if qtype == "q4_K" else "q4_K"
if (best.qtype == other).any():
    r9.figure_time_vs_nt(run, qtype=other, act=act)
    plt.show()

# %% [markdown]
# ## Every point: the fastest configuration, its fraction of the copy line, and the baselines
#
# One row a weight and activation type: one and eight tokens. Every timed point (each nt) is in the table below it,
# folded.

# %%
display(report.table(r9.point_summary(best), {"nt=1 (µs)": "{:.1f}", "nt=1 of the copy line": "{:.0%}",
                                               "nt=8 (µs)": "{:.1f}", "nt=8 / nt=1": "{:.2f}",
                                               "cuBLAS fp16 nt=1 (µs)": "{:.1f}"}, caption=r9.run_line(run)))
names = {"qtype": "type", "od": "od", "id": "id", "nt": "nt", "act": "activations", "variant": "gemv_kq config",
         "median_us": "time (µs)", "tb_per_s": "weight TB/s", "frac_copy": "of the copy line",
         "wgmma_us": "wgmma_kq (µs)", "cublas_us": "cuBLAS fp16 (µs)"}
tbl = best[list(names)].sort_values(["qtype", "od", "id", "act", "nt"]).rename(columns=names)
display(report.folded(report.table(tbl, {"time (µs)": "{:.1f}", "weight TB/s": "{:.2f}", "of the copy line": "{:.0%}",
                                         "wgmma_kq (µs)": "{:.1f}", "cuBLAS fp16 (µs)": "{:.1f}"}),
                      f"Every point ({len(tbl)} rows: the fastest configuration at each type, shape, activation "
                      f"type and nt, beside the baselines)"))

# %% [markdown]
# ## What stands between the GEMV and the copy line: a fixed cost, then a stream
#
# The time of one configuration at the four shapes, fitted by least squares as *fixed + weight bytes / stream*
# (nt = 1): the intercept is what a launch costs before its bytes flow (the event timing's floor, the first DRAM
# round trip, a split's fold, the wave's tail); the slope's inverse is the rate the bytes stream at once they flow.
# Where the run timed an empty launch (one wave of empty CTAs, behind the same flush and lead: steps 6 and 7), its
# median is the timing's floor and *fixed − floor* the kernel's own fixed cost. Two shapes carry the same bytes
# (4096x14336 and 14336x4096): the largest residual says how far a shape's own costs stray from the line.

# %%
fit = r9.stream_fit(run, qtype=qtype, act=act, nt=1)
display(Markdown(r9.run_line(run) + f"; {qtype} weights, {act} activations, nt = 1."))
fnames = {"variant": "configuration", "family": "family", "points": "points", "fixed_us": "fixed (µs)",
          "stream_tb_per_s": "stream (TB/s)", "stream_frac_copy": "stream / copy line", "max_resid_us": "max residual (µs)",
          "floor_us": "empty launch (µs)", "kernel_fixed_us": "fixed − floor (µs)"}
if len(fit) and fit.floor_us.isna().all():      # no empty launch timed in this run: no floor columns
    fnames = {k: v for k, v in fnames.items() if k not in ("floor_us", "kernel_fixed_us")}
if len(fit):
    display(report.table(fit[list(fnames)].rename(columns=fnames),
                         {"fixed (µs)": "{:.1f}", "stream (TB/s)": "{:.2f}", "stream / copy line": "{:.0%}",
                          "max residual (µs)": "{:.1f}", "empty launch (µs)": "{:.1f}", "fixed − floor (µs)": "{:.1f}"}))
    g = fit[fit.family == "gemv_kq"]
    mb = r9.weight_bytes(qtype, 4096, 14336) / 1e6
    w = g.loc[(g.fixed_us + mb / g.stream_tb_per_s).idxmin()] if len(g) else None     # the fit's fastest at 4096x14336
    if w is not None:
        display(Markdown(f"At one token the gemv_kq configuration fastest at {qtype} 4096x14336 ({w.variant}) pays "
                         f"{w.fixed_us:.1f} µs before its bytes flow and then streams at {w.stream_frac_copy:.0%} of "
                         f"the copy line; the target, 80% of the line over the whole launch, is {mb / (0.8 * line):.1f} "
                         f"µs for those {mb:.0f} MB."))
else:
    display(Markdown("*Not fitted:* the run has fewer than three shapes at nt = 1 for these weights and activations."))

# %% [markdown]
# ## Generation: tokens per second with the KV cache
#
# `GpuModel.generate`: the prefill fills an fp16 KV cache, then one decode step per token, captured once as a CUDA
# graph and replayed. Tokens per second are the GPU time of the replays (CUDA events); the fraction is the stored
# weight bytes one step reads at that rate over the copy line of the same run. llama-bench's tg128 beside it where
# a peers run on the same card recorded it: flash attention on, generation after an empty prompt (the target's
# measure), on the same GGUF (the synthetic models written from the lab's config, recipe and seed); the lab's rows
# generate after the prompt shown, so the longer prompts' ratios include attention over a longer cache.

# %%
gen = r9.generation_run()
if gen is None:
    display(Markdown("*Not recorded yet:* no generation run (`labkernels gpu check --steps generate`) under "
                     "`data/09_decode/`."))
else:
    gcard = gen.gpu_name or "?"
    gt = r9.generation_table(gen)
    peer = r9.peer_generation(gcard)
    tg = peer[(peer.test == "tg128") & (peer.flash_attn == 1)].set_index("model").tok_s if len(peer) else {}
    gt["llama_tg128"] = [tg.get(m, float("nan")) if len(peer) else float("nan") for m in gt.model]
    gt["vs_llama"] = gt.tok_per_s / gt.llama_tg128
    gnames = {"model": "model", "n_prompt": "prompt tokens", "n_new": "new tokens", "tok_per_s": "tok/s (GPU)",
              "tok_per_s_wall": "tok/s (host wall)", "frac_copy": "of the copy line", "prefill_ms": "prefill (ms)",
              "llama_tg128": "llama-bench tg128 (tok/s)", "vs_llama": "lab / llama.cpp"}
    display(Markdown(r9.run_line(gen) + (f"; peer run {peer.run.iloc[0]}" if len(peer) else
                                         "; no llama-bench generation recorded on this card")))
    display(report.table(gt[list(gnames)].rename(columns=gnames),
                         {"tok/s (GPU)": "{:,.0f}", "tok/s (host wall)": "{:,.0f}", "of the copy line": "{:.0%}",
                          "prefill (ms)": "{:.1f}", "llama-bench tg128 (tok/s)": "{:,.0f}",
                          "lab / llama.cpp": "{:.2f}x"}))

# %% [markdown]
# ## Tokens per second against context length
#
# The same generation at prompts of 128 to 8,160 tokens (32 new tokens each, so the last one attends up to 8,192
# keys), recorded by `python3 -m labkernels gpu check --steps generate_context --out DIR`. Only attention reads more
# per step as the context grows (the KV cache: 0.5 MB a token for the synthetic 7B; 18 KB for Gemma 3's shapes, of
# which only its 3 global layers' 3 KB grow past 512 keys). A prompt a model cannot take -- the synthetic 7B's context
# is 4,096 tokens -- is a skipped point with its reason, not a missing one.

# %%
cs = r9.context_section()
display(Markdown(cs["message"]))
if cs["run"] is not None:
    plt.show()
    cnames = {"model": "model", "n_prompt": "prompt tokens", "n_new": "new tokens", "tok_per_s": "tok/s (GPU)",
              "tok_per_s_wall": "tok/s (host wall)", "frac_copy": "of the copy line", "prefill_ms": "prefill (ms)",
              "status": "status"}
    display(report.table(cs["table"][list(cnames)].rename(columns=cnames),
                         {"tok/s (GPU)": "{:,.0f}", "tok/s (host wall)": "{:,.0f}", "of the copy line": "{:.0%}",
                          "prefill (ms)": "{:.1f}"}))

# %% [markdown]
# ## What a decode step spends
#
# One decode step taken apart launch by launch, as round 5 took the prefill apart: per model and context, the step at
# that position run eager under CUPTI, every launch inside the op label the decode path gives it -- each projection by
# its weight (GEMV: gemv_kq, or cuBLAS on a dequantized weight), attention (`decode_attn`), the small kernels (the norms
# with the residual adds fused in, `decode_qkv`'s RoPE and cache append, the activation, the embedding, the argmax),
# memset / memcpy -- and a launch neither its label nor its name places kept as *unclassified*. The captured graph of
# the same step is replayed (CUDA events behind a GPU lead) and traced; its kernels take the eager launches' classes
# by their order, each counted for the time no earlier kernel covers (programmatic launches overlap). **Gaps** are
# the replay's time minus its kernels': the idle time between the graph's nodes. Recorded by
# `python3 -m labkernels gpu check --steps decode_decomp --out DIR` (tables `decode_decomp`, `decode_decomp_steps`);
# the prediction was written before any run, from the bytes each class reads against the copy line.

# %%
dd = r9.decomp_section()
display(Markdown(dd["message"]))
if dd["run"] is not None:
    plt.show()
    dnames = {"model": "model", "context": "context", "mode": "timed as", "step_us": "step (µs)",
              "tok_per_s": "tok/s", "gemv_share": "GEMV", "attention_share": "attention",
              "small_share": "small kernels", "gaps_share": "gaps", "graph_us": "graph replay (µs)",
              "eager_wall_us": "eager step wall (µs)", "kernel_sum_eager_us": "eager kernels (µs)",
              "launches": "launches", "classified": "classified", "gemv_frac_copy": "GEMV of the copy line",
              "attention_frac_copy": "attention of the copy line"}
    display(report.table(dd["groups"][list(dnames)].rename(columns=dnames),
                         {"step (µs)": "{:,.0f}", "tok/s": "{:,.0f}", "graph replay (µs)": "{:,.0f}",
                          "eager step wall (µs)": "{:,.0f}", "eager kernels (µs)": "{:,.0f}"},
                         percent=("GEMV", "attention", "small kernels", "gaps", "classified",
                                  "GEMV of the copy line", "attention of the copy line")))
    knames = {"model": "model", "context": "context", "class": "class", "launches": "launches", "us": "µs",
              "share": "share", "eager_us": "eager (µs)", "replay_us": "replay (µs)", "kernels": "kernels"}
    display(report.table(dd["classes"][list(knames)].rename(columns=knames),
                         {"µs": "{:,.1f}", "eager (µs)": "{:,.1f}", "replay (µs)": "{:,.1f}"}, percent=("share",)))
display(report.table(dd["prediction"], {"measured": "{:.3f}"}))

# %% [markdown]
# ## The round's steps
#
# Each step's prediction was written before its run (where it was written after unrecorded exploratory timings, the
# step says so); the ledger keeps what was measured and the verdict.

# %%
for s in r9.LEDGER:
    pred = "; ".join(f"{c['what']}: {c['low']:g}-{c['high']:g} ({c['metric']})" for c in s["prediction"])
    when = f" *({s['prediction_written']})*" if s.get("prediction_written") else ""
    display(Markdown(f"**Step {s['step']}: {s['name']}** (commit {s['commit'] or 'not yet built'}; "
                     f"{s['card'] or 'not yet measured'})\n\n*Predicted{when}.* {pred}\n\n"
                     f"*Measured.* {s['measured'] or 'not yet.'}\n\n*Verdict.* {s['verdict'] or 'not yet.'}"))
    srun = r9.step_run(s) if any("check" in c for c in s["prediction"]) else None
    if srun is not None:              # claims the ledger says how to read: predicted beside measured, from the run
        display(Markdown(f"Step {s['step']}'s claims read from the run ({r9.run_line(srun)}):"))
        display(report.table(r9.step_claims_table(s, srun)))

# %% [markdown]
# ## What is not here yet
#
# The generation runs use synthetic weights (the decode steps run the lab's own flash-decoding kernel; the prefill that
# fills the cache ran the baseline attention, the cuDNN frontend not being installed there); the real Gemma 3 270M's
# generation is not recorded yet. The context sweep and the decomposition above say themselves whether their runs are
# recorded.

# %% [markdown]
# ## An independent timer: nvbench on the headline ratios
#
# The headline ratios against cuBLAS fp16 measured again with NVIDIA's nvbench (`cuda-bench`: cold L2, its own stop
# rule, samples under a throttled clock discarded) through the same launch functions, beside the lab's harness
# (interleaved, L2 flushed, CUDA events). Agreement within 2%, or the difference and the side it comes from
# (`labkernels/nvbench_check.py`; `labkernels gpu check --steps nvbench_check` records it).

# %%
from labkernels import nvbench_check
nb_line, nb_table = nvbench_check.page_view(9)
print(nb_line)
if len(nb_table):
    display(report.table(nb_table, {"harness_ratio": "{:.3f}", "nvbench_ratio": "{:.3f}", "ratio_diff": "{:+.2%}"}))

# %%
now = r9.state_now()
report.abstract(r9.abstract_now())
report.headline(**now)      # step 1's figures: the lead figure, the prediction and every-point tables above
report.footer(run.provenance)
