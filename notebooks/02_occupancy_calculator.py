# %% [markdown]
# # Round 2 — Shared memory and registers to occupancy, checked against CUDA

# %% tags=["parameters"]
device: "Known[device_profiles]" = "h200"   # profile for the single-configuration table and the maps
threads: "Range[1, 1024]" = 256   # threads per block
regs: "Range[1, 255]" = 85        # registers per thread (the seeds' q6_K kernel: 85)
kernel_family: "Known[kdr_families]" = "q6k_expb"   # registry family whose KDR points are marked on the smem curves
profiles: "NonEmpty[List[Known[device_profiles]]]" = ["h200", "a100", "l40s", "rtx5090", "gb10"]   # device profiles drawn in the plots
run_audit = True           # compile every kernel instantiation with nvcc (needs nvcc; skipped otherwise)

# %%
import shutil
import numpy as np, pandas as pd, matplotlib.pyplot as plt
from labkernels import occupancy as occ, report, provenance, records, plotting
from labkernels.kernels import registry
from labkernels.rounds import open_round
report.setup()
r2 = open_round("02", "cpu")
mode = r2.mode
r2.banner(note="The CUDA-API cross-check table at the end replays a run recorded on the H200.")
report.lead()        # the abstract, headline and result figure: filled in where they are computed

# %% [markdown]
# ## Method
#
# The seeds decide kernel shapes by one chain: shared memory and registers per block → blocks per SM → warps per
# SM → latency-bound or not (seeds 002 §2.3: KDR=4 at 29,696 B → 2 blocks/SM, KDR=8 at 59,392 B → 1 block/SM on
# GB10). `labkernels.occupancy` computes that chain from device profiles held as data
# (`labkernels/profiles/devices.json`, every value with its source). It is checked three ways: against CUDA's own
# header-only calculator `cuda_occupancy.h` on thousands of random configurations per profile (tests, CPU),
# against `cudaOccupancyMaxActiveBlocksPerMultiprocessor` for every real kernel instantiation on the H200
# (recorded run), and the ptxas audit below gives each kernel's real registers, spills and shared memory.

# %% [markdown]
# ## The seeds' GB10 statements, reproduced from the GB10 profile

# %%
rows = []
for kdr, smem in ((4, 29696), (8, 59392)):
    for dev in ("gb10", "h200"):
        r = occ.occupancy(dev, 256, 85, smem)
        rows.append({"device": dev, "KDR": kdr, "smem/block": smem, "blocks/SM": r["blocks_per_sm"],
                     "warps/SM": f"{r['warps_per_sm']} of {r['max_warps_per_sm']}",
                     "theoretical occupancy": f"{100 * r['occupancy']:.1f}%", "limiter": r["limiter"],
                     "limits (warps/regs/smem/blocks)": "/".join(str(r["limits"][k]) for k in ("warps", "registers", "smem", "blocks"))})
seeds = pd.DataFrame(rows)
display(report.table(seeds, {"smem/block": "{:,} B"}))
implied = occ.max_warps_from_achieved(18.12, 0.3774)
print(f"GB10 max warps/SM implied by 18.12 achieved warps = 37.74%: {implied:.2f} (profile: {occ.profile('gb10')['max_warps_per_sm']})")
g4 = seeds[(seeds.device == "gb10") & (seeds.KDR == 4)].iloc[0]; g8 = seeds[(seeds.device == "gb10") & (seeds.KDR == 8)].iloc[0]
assert (g4["blocks/SM"], g8["blocks/SM"]) == (2, 1) and round(implied) == 48

# %% [markdown]
# Note the limiter column: at 85 registers the KDR=4 configuration on GB10 is held at 2 blocks/SM by **registers**
# (shared memory alone would allow 3); KDR=8 is held at 1 by shared memory. On the H200 (228 KB/SM, 64 warps) both
# depths give 2 blocks/SM at 85 registers — the seeds' cliff is not where GB10 put it.

# %%
one = occ.occupancy(device, threads, regs, registry.default_variant(kernel_family).spec().dynamic_smem()) if kernel_family == "q6k_expb" else None
print(occ.format_table(one) if one else "")

# %% [markdown]
# ## Blocks/SM against shared memory per block, per profile (256 threads; KDR points of the q6_K kernel marked)

# %%
fam = registry.family(kernel_family)
kdr_pts = sorted({(k.p["KDR"], k.dynamic_smem()) for k in fam})
smem = np.arange(0, 232 * 1024, 512)
fig, axes = plt.subplots(1, 2, figsize=(plotting.PAGE_WIDTH_IN, 4.6), sharey=True)
for ax, r in zip(axes, (regs, 128)):
    for j, name in enumerate(profiles):
        p = occ.profile(name)
        ys = [occ.occupancy(name, threads, r, int(s))["blocks_per_sm"] if s <= p["smem_per_block_optin"] else np.nan for s in smem]
        off = 0.04 * (j - (len(profiles) - 1) / 2)  # equal values stay visible side by side
        ax.step(smem / 1024, np.array(ys) + off, where="post", label=name, color=plotting.color(name))
        for kdr, s in kdr_pts:
            if s <= p["smem_per_block_optin"]:
                ax.plot(s / 1024, occ.occupancy(name, threads, r, s)["blocks_per_sm"], "ko", ms=4)
    for kdr, s in kdr_pts:
        ax.axvline(s / 1024, color="gray", lw=0.6, ls=":")
        ax.annotate(f"KDR={kdr}", (s / 1024, 0.3), rotation=90, fontsize=8, xytext=(2, 0), textcoords="offset points")
    ax.set_xlabel("shared memory per block (KB, symlog scale)"); ax.set_title(f"{threads} threads, {r} registers/thread")
    ax.set_xscale("symlog", linthresh=16); plotting.integer_axis(ax.yaxis); ax.set_ylim(bottom=0)
    ax.set_xticks([0, 4, 8, 16, 32, 64, 128, 228]); ax.xaxis.set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
axes[0].set_ylabel("resident blocks / SM (lines offset slightly)"); axes[0].legend(title="profile")
report.lead_figure(fig, f"Resident blocks per SM against shared memory per block for every device profile, at "
                        f"{threads} threads and {regs} / 128 registers per thread (the calculator, checked against "
                        f"CUDA's); black dots: the {kernel_family} kernel's KDR points")

# %% [markdown]
# ## Registers against occupancy (256 threads, the KDR=4 shared memory)

# %%
s4 = registry.default_variant(kernel_family).spec().dynamic_smem() if kernel_family == "q6k_expb" else 0
rr = np.arange(16, 256)
fig, ax = plt.subplots(figsize=(10, 4))
for name in profiles:
    ax.step(rr, [100 * occ.occupancy(name, threads, int(r), s4)["occupancy"] for r in rr], where="post", label=name,
            color=plotting.color(name))
ax.axvline(85, color="k", ls=":", lw=1); ax.text(86, 5, "seeds: 85", fontsize=9)
ax.axvline(128, color="k", ls=":", lw=1); ax.text(129, 5, "__launch_bounds__(256,2): 128", fontsize=9)
ax.set_xlabel("registers / thread"); ax.set_ylabel("theoretical occupancy (%)"); ax.set_ylim(0, 105)
ax.legend(title="profile"); plt.show()

# %% [markdown]
# ## Which limit binds: registers × shared memory (profile from the parameters, 256 threads)

# %%
names = ["warps", "registers", "smem", "blocks"]
R = np.arange(24, 256, 4); S = np.arange(0, occ.profile(device)["smem_per_block_optin"], 2048)
lim = np.array([[names.index(occ.occupancy(device, threads, int(r), int(s))["limiter"]) for s in S] for r in R])
bl = np.array([[occ.occupancy(device, threads, int(r), int(s))["blocks_per_sm"] for s in S] for r in R])
fig, axes = plt.subplots(1, 2, figsize=(plotting.PAGE_WIDTH_IN, 4.8))
im = axes[0].imshow(lim, aspect="auto", origin="lower", extent=[0, S[-1] / 1024, R[0], R[-1]], cmap=plt.matplotlib.colors.ListedColormap(["#4c72b0", "#dd8452", "#55a868", "#c44e52"]), vmin=-.5, vmax=3.5)
cb = plt.colorbar(im, ax=axes[0], ticks=range(4)); cb.ax.set_yticklabels(names); cb.set_label("limiting resource")
axes[0].set_title(f"{device}: which limit sets blocks/SM"); axes[0].set_ylabel("registers / thread")
nb_ = int(bl.max())
im2 = axes[1].imshow(bl, aspect="auto", origin="lower", extent=[0, S[-1] / 1024, R[0], R[-1]],
                     cmap=plt.get_cmap("viridis", nb_ + 1), vmin=-0.5, vmax=nb_ + 0.5)
cb2 = plt.colorbar(im2, ax=axes[1], ticks=range(nb_ + 1)); cb2.set_label("resident blocks / SM")
axes[1].set_title(f"{device}: blocks/SM ({threads} threads/block)")
for ax in axes:
    ax.set_xlabel("shared memory per block (KB)"); ax.grid(False)
    for j, (kdr, s) in enumerate(kdr_pts):
        ax.plot(s / 1024, 128, "w*", ms=10, mec="k")
        ax.annotate(f"KDR {kdr}", (s / 1024, 128), xytext=(-8, 8 + 12 * (j % 2)), textcoords="offset points", color="w", fontsize=8)
plt.show()

# %% [markdown]
# ## ptxas resource audit of every kernel instantiation
#
# Every registry instantiation compiled offline (`nvcc -cubin -arch=sm_90 -Xptxas -v`), with the launcher's dynamic
# shared memory from the registry formula and the resulting H200 occupancy row. Main-path kernels must have no
# spills and no stack frame (CI fails otherwise).

# %%
from labkernels import audit
if run_audit and shutil.which("nvcc"):
    rows = audit.audit()
    at = pd.DataFrame(rows)[["key", "main_path", "regs", "spill_stores", "spill_loads", "stack_frame", "static_smem", "dynamic_smem", "blocks_per_sm", "warps_per_sm", "occupancy", "limiter"]]
    failures = audit.check(rows)
    print("main-path failures:", failures or "none")
    display(report.table(at, {"occupancy": "{:.0%}"}))
else:
    at, failures = None, None
    print("nvcc not available here: audit skipped (it runs in CI)")

# %% [markdown]
# ## Cross-check with the CUDA occupancy API on the H200 (recorded)

# %%
run = records.latest("occupancy")
if run is None:
    print("no recorded API cross-check yet (labkernels gpu check --steps occupancy on a GPU)")
    agree = None
else:
    api = run.table("api_check")
    print(run.describe())
    agree = int(api.agree.sum()); print(f"{agree} of {len(api)} instantiations: CUDA API blocks/SM == calculator")
    display(report.table(api[["kernel", "regs", "local_bytes", "static_smem", "dynamic_smem", "api_blocks_per_sm", "calc_blocks_per_sm", "calc_limiter", "agree"]]))

# %%
h4 = seeds[(seeds.device == "h200") & (seeds.KDR == 4)].iloc[0]; h8 = seeds[(seeds.device == "h200") & (seeds.KDR == 8)].iloc[0]
report.abstract(
    "Round 2 computes the chain from shared memory and registers per block to blocks and warps per SM from device "
    "profiles held as data, and checks it against CUDA's own calculator, against the CUDA occupancy API on the H200"
    + (f" ({agree} of {len(api)} kernel instantiations agree)" if agree is not None else "")
    + " and against ptxas's resource report of every kernel. "
    f"It reproduces the seeds' GB10 statements (KDR=4: {g4['blocks/SM']} blocks/SM, KDR=8: {g8['blocks/SM']}) and the "
    f"{implied:.0f} warps/SM their achieved occupancy implies. "
    f"On the H200 both depths keep {h4['blocks/SM']} blocks/SM at 85 registers: the seeds' cliff is not where GB10 put it.")
report.headline(**{"GB10 KDR=4 / KDR=8 blocks/SM": f"{g4['blocks/SM']} / {g8['blocks/SM']} ({g4['theoretical occupancy']} / {g8['theoretical occupancy']})",
                   "GB10 warps/SM implied": f"{implied:.1f}",
                   "H200 API agreement": f"{agree}/{len(api)}" if agree is not None else "not recorded",
                   "audit main-path failures": (len(failures) if failures is not None else "skipped")})
report.footer(run.provenance if run else None)
