# %% [markdown]
# # Round 1 — Layout verifier: every element of q6_K and q4_K blocks

# %% tags=["parameters"]
model_path: "Optional[str]" = None     # GGUF file; None: data/models/gemma-3-270m-q4_k_m.gguf (labkernels model fetch)
tensor_filter: "Optional[Regex]" = None  # regex on tensor names; None: every q4_K / q6_K tensor
strides: "NonEmpty[List[OneOf[210, 224]]]" = [210, 224]   # q6_K block strides to check (bytes)
random_blocks: "Range[1, 1000000]" = 20000   # random valid blocks per type and stride, on top of the model's
seed: "Range[0, 4294967295]" = 0   # random seed; 0: a fresh seed each run (printed)

# %%
import numpy as np, pandas as pd, matplotlib.pyplot as plt
from labkernels import layout, quants, report, provenance, plotting
from labkernels.rounds import open_round, r01_layout
from labkernels.model import open_model, default_model_path
report.setup()
r1 = open_round("01", "cpu")
mode = r1.mode
r1.banner()
report.lead()        # the abstract, headline and result figure: filled in where they are computed
seed = seed or int(np.random.SeedSequence().entropy % 2**32)
rng = np.random.default_rng(seed)
model_path = model_path or default_model_path()
print(f"seed {seed} | model {report.relative_path(str(model_path))}")

# %% [markdown]
# ## Method
#
# The seeds' q6_K campaign (002, §2.1/§3.3) nearly built an mma kernel on a wrong layout model: *"q6_K = 8
# sub-blocks of 32 with one scale"*. q6_K actually has **16 sub-blocks of 16** with an int8 scale each, and an
# element's 6-bit code is split across two planes — the low 4 bits in `ql`, the high 2 bits in `qh` — at
# different strides. This round maps every element of a block to its bytes, bits and scale in closed form
# (`labkernels.layout`), and checks the map exhaustively against gguf-py's dequantization:
# all 256 elements of random blocks, both q6_K block strides (210 B and the 224 B padded repack), and every
# block of every q4_K / q6_K tensor of the real Gemma 3 270M Q4_K_M model. The wrong model is evaluated too,
# so the pitfall is documented with a number.

# %% [markdown]
# ## The maps
#
# q6_K, element `e` of a 256-element super-block (`m = e & 31`, `n = e & 127`, `it = e >> 7`):
# low 4 bits from `ql[it*64 + (n & 63)] >> 4*(n >> 6)`, high 2 bits from `qh[it*32 + m] >> 2*((n >> 5) & 3)`,
# scale `scales[e >> 4]` (16 sub-blocks of 16), `value = d · sc · (code − 32)`.
# q4_K: sub-block `j = e >> 5` (8 of 32), nibble `qs[32*(j >> 1) + (e & 31)] >> 4*(j & 1)`, 6-bit scale and min
# unpacked from 12 bytes, `value = d·sc·q − dmin·m`.
# Each square below is one element (rows: 32-element chunks, columns: offset in the chunk); the colour is the
# byte it reads, the number the bit shift.

# %%
t6 = layout.q6k_element_table(); t4 = layout.q4k_element_table()
fig, axes = plt.subplots(4, 1, figsize=(plotting.PAGE_WIDTH_IN, 12))
def grid(ax, values, shifts, title, cmap, unit):
    v = values.reshape(8, 32)
    im = ax.imshow(v, cmap=cmap, aspect="auto")
    if shifts is not None:  # the digit is the right-shift that extracts the element's bits from its byte
        lo, hi = v.min(), v.max()
        for i, s in enumerate(shifts):
            light = (v.flat[i] - lo) / max(hi - lo, 1) > 0.55
            ax.text(i % 32, i // 32, str(s), ha="center", va="center", fontsize=9,
                    color="black" if light else "white", fontweight="bold")
    ax.set_title(title); ax.set_xlabel("element offset in its 32-element chunk"); ax.set_ylabel("chunk (0-7)")
    ax.set_xticks(range(0, 32, 4)); ax.set_yticks(range(8)); ax.grid(False)
    cb = plt.colorbar(im, ax=ax, pad=0.01); cb.set_label(unit); plotting.integer_axis(cb.ax.yaxis)
grid(axes[0], t6.ql_byte.values, t6.ql_shift.values, "q6_K low 4 bits: colour = byte of ql[] read, digit = bit shift", "viridis", "ql byte index")
grid(axes[1], t6.qh_byte.values, t6.qh_shift.values, "q6_K high 2 bits: colour = byte of qh[] read, digit = bit shift", "plasma", "qh byte index")
grid(axes[2], t6.sub16.values, None, "q6_K scale: 16 sub-blocks of 16 elements, one int8 scale each", "tab20", "scales[] index")
grid(axes[3], t4.qs_byte.values, t4.qs_shift.values, "q4_K nibble: colour = byte of qs[] read, digit = bit shift (row = sub-block)", "viridis", "qs byte index")
plt.show()
report.table(t6.iloc[[0, 15, 16, 31, 32, 63, 64, 70, 127, 128, 255]], caption="q6_K element map, selected elements")

# %% [markdown]
# ## Exhaustive check on random valid blocks
#
# Every element of every block, both strides; the pad bytes of the 224 B stride are filled with garbage so a
# map that strayed into them would show. The seeds' scalar `expand_q6_elem` is also compared element by
# element with the vectorized map.

# %%
rows = []
for stride in strides:
    b = r01_layout.random_q6k_blocks(random_blocks, rng, stride)
    r = r01_layout.verify_q6k_blocks(b, stride)
    rows.append({k: v for k, v in r.items() if not k.startswith("_")})
b4 = r01_layout.random_q4k_blocks(random_blocks, rng)
rows.append(r01_layout.verify_q4k_blocks(b4))
one = r01_layout.random_q6k_blocks(64, rng, 224)
scalar = np.array([[layout.expand_q6_elem(one[i], e) for e in range(256)] for i in range(64)])
vector = layout.q6k_codes(one).astype(int) - 32
rows.append({"type": "q6_K expand_q6_elem (scalar seeds form) vs map", "stride": 224, "blocks": 64,
             "elements": scalar.size, "mismatches": int((scalar != vector).sum())})
random_table = pd.DataFrame(rows)
assert (random_table.mismatches == 0).all(), random_table
report.table(random_table)

# %% [markdown]
# ## Every block of every q4_K / q6_K tensor of the real model

# %%
m = open_model(model_path)
print(report.relative_path(str(m.path)), "|", m.architecture, "|",
      ", ".join(f"{k}: {v} tensors" for k, v in m.type_counts().items()))
model_rows, extras = r01_layout.verify_model(m.path, tensor_filter, strides=tuple(strides))
model_table = pd.DataFrame(model_rows)
totals = r01_layout.summarize(model_rows)
assert model_rows and all(v["mismatches"] == 0 for v in totals.values()), totals
display(report.table(pd.DataFrame(totals).T.rename_axis("type / stride").reset_index(), caption="totals"))
report.table(model_table[["tensor", "type", "stride", "shape", "blocks", "elements", "mismatches"]],
             caption="per tensor (shape = GGUF [id, od])")

# %% [markdown]
# ## The wrong model, with numbers
#
# Reading q6_K as 8 sub-blocks of 32 with one scale each (here: the first of the two true scales of each
# 32-chunk) leaves the codes right but applies the wrong scale to half of every chunk. On the real ffn_down
# tensors:

# %%
q6 = model_table[(model_table.type == "q6_K") & (model_table.stride == strides[0])]
wrong = q6[["tensor", "elements", "wrong_model_mismatches", "wrong_model_rel_rmse", "wrong_model_max_abs"]]
display(report.table(wrong))
err = extras["q6k_wrong_model_err"]
fig, ax = plt.subplots(figsize=(9, 3.6))
ax.hist(err[err != 0], bins=200, log=True, color=plotting.color("q6k_generic"))
ax.set_xlabel("wrong-model value − true value (dequantized weight units)"); ax.set_ylabel("elements (log scale)")
ax.set_title(f"'8 x 32, one scale' model on the real q6_K tensors: rel. RMSE {q6.wrong_model_rel_rmse.mean():.3f}")
report.lead_figure(fig, "What the wrong layout model costs: the error of every element of the real model's q6_K "
                        "tensors read as '8 sub-blocks of 32 with one scale' against the true value (dequantized "
                        "weight units; elements it gets right left out; log count); the true map has no error")

# %% [markdown]
# ## Reference quantizers: round-trip error by type
#
# `labkernels.quants.quantize` follows ggml's reference (`_ref`) algorithms (q4_K: weighted min/scale search
# with 6-bit packed scales and mins; q6_K: per-16 scale search with int8 sub-scales; q8_0). Relative RMSE
# `‖deq(quant(x)) − x‖ / ‖x‖` on Gaussian rows and on real weights (dequantized Gemma tensors re-quantized):

# %%
from labkernels.quantize_ref import roundtrip_rmse
x = rng.standard_normal((256, 4096)).astype(np.float32)
real = m.tensor([t.name for t in m.tensors() if t.qtype == "q6_K"][0]).array()[:256]
rt = pd.DataFrame([{"qtype": q, "gaussian 256x4096": roundtrip_rmse(x, q),
                    "real ffn_down rows (re-quantized)": roundtrip_rmse(real, q)} for q in ("q8_0", "q6_K", "q4_K")])
report.table(rt, {c: "{:.4f}" for c in rt.columns[1:]}, caption="relative RMSE of the round trip")

# %%
el = sum(v["elements"] for v in totals.values())
mm = sum(v["mismatches"] for v in totals.values())
report.abstract(
    f"Round 1 maps every element of a q6_K and a q4_K block to its bytes, bits and scale in closed form and checks the "
    f"map against gguf-py's dequantization, on {int(random_table.blocks.sum()):,} random blocks and on all {el:,} "
    f"elements of every q4_K / q6_K tensor of Gemma 3 270M. The map has {mm} mismatches. The reading of q6_K as "
    f"'8 sub-blocks of 32 with one scale', which the seeds nearly built a kernel on, is off by a relative RMSE of "
    f"{float(q6.wrong_model_rel_rmse.mean()):.2f} on the model's tensors.")
report.headline(**{"elements checked (model)": f"{el:,}", "mismatches": mm,
                   "random blocks checked": f"{int(random_table.blocks.sum()):,}",
                   "wrong '8x32' model rel. RMSE": float(q6.wrong_model_rel_rmse.mean())})
report.footer({**provenance.collect({"seed": seed, "strides": strides, "tensor_filter": tensor_filter})})
