"""Figure conventions of the round notebooks: inline rendering, one style, one colour per variant.

``setup()`` (called by every round notebook's first cell) makes matplotlib draw into the notebook whatever
``MPLBACKEND`` says (``lab.py`` and CI set ``Agg``, under which ``plt.show()`` draws nothing), and sets the
style every published figure shares: sizes readable at the page width, light grid, tight bounding boxes.
``color(name)`` gives a variant the same colour in every chart of every round.
"""

from __future__ import annotations

import matplotlib

from .kernels import registry

#: the published page is ~1300 px wide: figures are at most this many inches wide at ``DPI``
PAGE_WIDTH_IN = 13.0
DPI = 100

STYLE = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.framealpha": 0.9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.constrained_layout.use": True,
}

#: fixed colours of the variants the rounds compare (the same kernel has the same colour everywhere)
VARIANT_COLORS = {
    # round 3 / 6: q6_K kernels and references
    # (variant names of labkernels.kernels.registry.VARIANTS; older recorded names resolve to them)
    "q6k_generic": "#8c8c8c", "q6k_expb_epi0": "#1f77b4",
    "q6k_expb_epi1_occ2": "#17becf", "q6k_expb_epi1": "#9467bd",  # OCC=1
    "cublas_f16_cached": "#d62728", "cublas_f16": "#d62728",
    "cublas_f16_with_dequant": "#ff9896",
    "prepass": "#bcbd22",
    # round 4: q6_K template variants and the q4_K kernel
    # (the same colours as the named variants of the same EPI/OCC)
    "EPI=0,OCC=1": "#ff7f0e", "EPI=0,OCC=2": "#1f77b4", "EPI=1,OCC=1": "#9467bd", "EPI=1,OCC=2": "#17becf",
    "q4k_nb_kdr4": "#2ca02c",
    # round 7: the wgmma family against the same references (int8 = the lab's rounds 3-4 families)
    "wgmma_kq": "#6a3d9a", "wgmma_incl_f32_to_f16": "#cab2d6", "int8": "#2ca02c", "issue": "#fdbf6f",
    "uniform_split": "#1b9e77",      # the wgmma_kq launch on the uniform split-k grid (SK=2)
    # device profiles (round 2 / 4)
    "h200": "#1f77b4", "a100": "#ff7f0e", "l40s": "#9467bd", "rtx5090": "#8c564b", "gb10": "#d62728",
}
#: other names (kernel classes, ...) take the next of these in order of first use: tab20 without the
#: colours reserved above, then tab20b
_FALLBACK = ["#e377c2", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#aec7e8",
             "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252", "#bd9e39", "#ad494a",
             "#a55194", "#6b6ecf", "#b5cf6b", "#e7ba52", "#d6616b", "#ce6dbd"]
_assigned: dict[str, str] = {}


def color(name: str) -> str:
    """The colour of a variant / device / class, stable across every chart of a page."""
    name = registry.canonical(str(name))
    if name in VARIANT_COLORS:
        return VARIANT_COLORS[name]
    if name not in _assigned:
        _assigned[name] = _FALLBACK[len(_assigned) % len(_FALLBACK)]
    return _assigned[name]


def colors(names) -> list[str]:
    return [color(n) for n in names]


def setup() -> None:
    """Inline figures (when running under IPython) and the shared style."""
    matplotlib.rcParams.update(STYLE)
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: nothing to display into
        return
    ip = get_ipython()
    if ip is not None and hasattr(ip, "run_line_magic"):
        ip.run_line_magic("matplotlib", "inline")
        matplotlib.rcParams.update(STYLE)  # the inline backend resets some rcParams when it loads
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")


def integer_axis(axis) -> None:
    """Ticks only at integers (counts: blocks/SM, warps, KDR)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


#: the nt of an option A/B point -> its marker (:func:`option_speedups`)
NT_MARKERS = {256: "v", 512: "o", 1024: "^", 2048: "D", 4096: "s"}


def option_speedups(ax, sab, names: dict, title: str = "") -> None:
    """Every point of a build-option A/B (:func:`~labkernels.rounds.r07_wgmma.tables.suffix_ab`: columns option, qtype, nt, speedup)
    as a strip per (option, qtype): marker = nt, colour = weight type, the 1.0 line drawn; x labels from
    ``names`` (option -> label)."""
    import numpy as np
    from matplotlib.lines import Line2D

    cats = [(o, q) for o in names for q in ("q4_K", "q6_K") if len(sab[(sab.option == o) & (sab.qtype == q)])]
    for i, (o, q) in enumerate(cats):
        d = sab[(sab.option == o) & (sab.qtype == q)]
        for nt, mk in NT_MARKERS.items():
            dd = d[d.nt == nt]
            if len(dd):
                ax.scatter(i + np.linspace(-.25, .25, len(dd)), dd.speedup, marker=mk, s=22, alpha=.75,
                           color=color("wgmma_kq" if q == "q4_K" else "issue"))
    ax.axhline(1, color="0.3", lw=1)
    ax.set_xticks(range(len(cats)), [f"{names[o]}\n{q}" for o, q in cats], fontsize=8)
    ax.set_ylabel("speedup (base time / option time)")
    shown = [n for n in NT_MARKERS if n in set(sab.nt)]
    ax.legend([Line2D([], [], ls="", marker=NT_MARKERS[n], color="0.4") for n in shown], [f"nt={n}" for n in shown],
              fontsize=8, ncol=len(shown), loc="upper right")
    lo, hi = float(sab.speedup.min()), float(sab.speedup.max())
    ax.set_ylim(min(0.85, lo - 0.02), max(1.12, hi + 0.04))
    ax.grid(axis="y", alpha=.3)
    if title:
        ax.set_title(title, fontsize=8)


def launch_speedups(ax, table, speedup: str, title: str, ylabel: str) -> None:
    """:func:`option_speedups` of an A/B table with one row per (point, launch) -- a strip per base launch
    (column ``launch``, e.g. 'BN=128 data-par.') and weight type, its ``speedup`` column on the y axis."""
    option_speedups(ax, table.assign(option=table.launch, speedup=table[speedup]),
                    {g: g.replace(" ", "\n", 1) for g in sorted(table.launch.unique())}, title)
    ax.set_ylabel(ylabel)


#: the builds of the ceiling A/B (:func:`~labkernels.rounds.r07_wgmma.limits.ceiling_table` columns) and their bar labels
CEILING_BARS = {"plain_vs_cublas": "plain (loads + conversion)", "noload_vs_cublas": "no weight loads (conversion)",
                "noconv_vs_cublas": "no conversion (the skeleton)"}


def ceiling_bars(ax, table, nt: int = 512, title: str = "") -> None:
    """The ceiling A/B at one nt: per (weight type, shape) the launch whose plain build is fastest, its three builds'
    ratios to cuBLAS fp16 as grouped bars, the 1.0 line (the bar) drawn, the launch named under each group."""
    import numpy as np

    t = table[table.nt == nt].sort_values("plain_vs_cublas").groupby(["qtype", "od", "id"], sort=True).last().reset_index()
    x = np.arange(len(t))
    w = 0.8 / len(CEILING_BARS)
    for i, (col, label) in enumerate(CEILING_BARS.items()):
        ax.bar(x + (i - 1) * w, t[col], w, label=label, color=("0.3", "0.6", "0.85")[i], edgecolor="0.2", lw=.5)
    ax.axhline(1, color="0.2", lw=1)
    ax.set_xticks(x, [f"{q}\n{od}x{id_}\n{ln}" for q, od, id_, ln in zip(t.qtype, t.od, t["id"], t.launch)], fontsize=7)
    ax.set_ylabel("ratio to cuBLAS fp16 (cached), same shape")
    ax.set_ylim(0, max(1.2, float(t[list(CEILING_BARS)].max().max()) + 0.1))
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    ax.grid(axis="y", alpha=.3)
    if title:
        ax.set_title(title, fontsize=8)


#: the phases of :func:`phase_bars` -> (column, label, colour name)
PHASES = (("fill_us", "waiting for the first activation tile", None), ("main_us", "main loop (wgmma)", "wgmma_kq"),
          ("finish_us", "finish: partial sums, fold, store (median)", "issue"))


def timing_pairs(ax, view, nt: int, title: str = "") -> None:
    """The timing A/B (:func:`~labkernels.rounds.r07_wgmma.tables.lead_view`) at one nt: per (weight type, shape) the best launch's
    ratio to cuBLAS under each timing as paired bars, the 1.0 line (the bar) drawn."""
    import numpy as np

    v = view[view.nt == nt]
    pts = list(v.groupby(["qtype", "od", "id"], sort=False).groups)
    timings = list(dict.fromkeys(v.timing))
    x = np.arange(len(pts))
    w = 0.8 / len(timings)
    for i, t in enumerate(timings):
        r = v[v.timing == t].set_index(["qtype", "od", "id"]).loc[pts, "ratio"]
        label = "events right after the flush" if t == "events" else f"behind a {t[4:]} us lead"
        ax.bar(x + (i - (len(timings) - 1) / 2) * w, r.values, w, label=label, color=("0.35", "0.75")[i % 2],
               edgecolor="0.2", lw=.5)
    ax.axhline(1, color="0.2", lw=1)
    ax.set_xticks(x, [f"{q}\n{od}×\n{id_}" for q, od, id_ in pts], fontsize=7)
    ax.set_ylabel("best launch / cuBLAS fp16 (cached)")
    ax.set_ylim(0, 1.25)
    ax.legend(fontsize=7, loc="upper center", ncol=2, frameon=False)
    ax.set_title(title, fontsize=9)


def phase_bars(ax, roles, title: str = "") -> None:
    """:func:`~labkernels.rounds.r07_wgmma.traces.trace_roles` as stacked horizontal bars, one per (launch, role): the median fill,
    main loop and finish of that role's segments (us), the slowest finish as a whisker, the launch's last segment
    end as a black tick; labelled with the variant, the role and how many segments it has."""
    import numpy as np

    r = roles.reset_index(drop=True)
    y = np.arange(len(r))[::-1]
    left = np.zeros(len(r))
    for col, label, cname in PHASES:
        ax.barh(y, r[col], left=left, height=.75, color=color(cname) if cname else "0.75", label=label, lw=0)
        left = left + r[col].to_numpy()
    fin0 = left - r["finish_us"].to_numpy()
    ax.errorbar(fin0 + r["finish_us_max"], y, xerr=[r["finish_us_max"] - r["finish_us"], np.zeros(len(r))],
                fmt="none", ecolor="0.2", lw=.8, capsize=2)
    ax.scatter(r["end_us_max"], y, marker="|", s=120, color="k", label="launch's last segment end (stamps)", zorder=3)
    ax.set_yticks(y, [f"{v.removeprefix('wgmma_')} {ro} (x{n})" for v, ro, n in zip(r.variant, r.role, r.segments)],
                  fontsize=7)
    ax.set_xlabel("time from the segment's start, medians over its role's segments [us]")
    ax.grid(axis="x", alpha=.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), framealpha=.95)
    if title:
        ax.set_title(title, fontsize=8)


def _best_per_point(view, us: str):
    """The fastest wgmma launch (smallest ``us``) of each (qtype, od, id) of a per-launch view, in view order."""
    v = view[view.variant.str.startswith("wgmma_bn")]
    return v.loc[v.groupby(["qtype", "od", "id"], sort=False)[us].idxmin()]


def floor_bars(ax, view, title: str = "") -> None:
    """The launch floor (:func:`~labkernels.rounds.r07_wgmma.limits.floor_view`): per point the fastest launch of record as a stacked
    bar -- its empty build's time (the floor) and what it spends above it -- beside cuBLAS fp16 (cached); the
    1-CTA empty kernel as a dashed line. Times in us."""
    import numpy as np

    b = _best_per_point(view, "plain_us")
    x = np.arange(len(b))
    ax.bar(x - 0.2, b.empty_us, 0.4, color="0.25", label="floor: its empty build (same grid, no work)")
    ax.bar(x - 0.2, b.above_floor_us, 0.4, bottom=b.empty_us, color=color("wgmma_kq"), label="above the floor")
    ax.bar(x + 0.2, b.cublas_us, 0.4, color=color("cublas_f16_cached"), label="cuBLAS fp16 (cached), whole")
    ax.axhline(float(b.empty_1cta_us.median()), color="0.2", ls="--", lw=.8, label="1-CTA empty kernel")
    for xi, (_, r) in zip(x, b.iterrows()):
        ax.text(xi - 0.2, r.plain_us, f"{r.ratio:.2f}×", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{q}\n{od}×{id_}\n{v.removeprefix('wgmma_')}" for q, od, id_, v in
                      zip(b.qtype, b.od, b.id, b.variant)], fontsize=7)
    ax.set_ylabel("us per launch (median)")
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    ax.set_title(title, fontsize=9)


def kscan_lines(ax, points, fits, qtype: str, title: str = "", max_id: float | None = None) -> None:
    """The k scan of one qtype (:func:`~labkernels.rounds.r07_wgmma.limits.kscan_points`, ``kscan_fit``): each
    launch's median time against id as markers with its fitted line (dashed), cuBLAS fp16 (cached; and with fp32
    output where the scan has it) beside them and alone at small k (open markers), the 1-CTA empty kernel as a
    dotted line. Times in us, id in elements. ``max_id``: show id up to it only (a zoom on the intercepts; the y
    range follows)."""
    import numpy as np

    pq = points[points.qtype == qtype]
    fq = fits[fits.qtype == qtype].set_index("variant")
    names = [v for v in dict.fromkeys(pq.variant) if v.startswith("wgmma_bn") and v in fq.index]
    names += [v for v in ("cublas_f16_cached", "cublas_f16_f32out") if v in fq.index]
    ids = np.array(sorted(pq["id"].unique()), float)
    xs = np.linspace(0, ids.max() * 1.02, 50)
    marks = dict(zip(names, "osD^vx"))
    marks.update({"cublas_f16_cached": "^", "cublas_f16_f32out": "v"})
    cublas_label = {"cublas_f16_cached": "cuBLAS fp16 (cached)", "cublas_f16_f32out": "cuBLAS fp16, fp32 out"}
    for v in names:
        g = pq[pq.variant == v].sort_values("id")
        c = color(v)
        f = fq.loc[v]
        lab = f"{cublas_label.get(v, v.removeprefix('wgmma_'))}: {f.intercept_us:.1f} us + {f.ns_per_k:.2f} ns/k"
        ax.plot(g["id"], g.median_us, marks[v], color=c, ms=4, label=lab)
        ax.plot(xs, f.intercept_us + f.ns_per_k * 1e-3 * xs, "--", color=c, lw=.8)
    alone = points[(points.qtype == "f16") & (points.variant == "cublas_f16_cached")].sort_values("id")
    if len(alone):
        ax.plot(alone["id"], alone.median_us, "o", mfc="none", color=color("cublas_f16_cached"), ms=5,
                label="cuBLAS alone at small k")
    e = points[points.variant == "empty_kernel_1cta"].median_us
    if len(e):
        ax.axhline(float(e.median()), color="0.3", ls=":", lw=.8, label="1-CTA empty kernel")
    if max_id is None:
        ax.set_xlim(0, ids.max() * 1.03)
        ax.set_ylim(0, None)
    else:
        shown = pq[(pq["id"] <= max_id) & pq.variant.isin(names)].median_us
        ax.set_xlim(0, max_id)
        ax.set_ylim(0, float(shown.max()) * 1.15 if len(shown) else None)
    ax.set_xlabel("id (k, elements)")
    ax.set_ylabel("time per launch (us)")
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    ax.set_title(title, fontsize=9)


def clock_bars(ax, view, title: str = "") -> None:
    """The SM clock during the launches (:func:`~labkernels.rounds.r07_wgmma.limits.clock_view`): per point the fastest launch of
    record beside cuBLAS fp16 (cached), MHz, with the idle clock (the probe alone) as a dashed line."""
    import numpy as np

    b = _best_per_point(view, "us")
    cb = view[view.variant == "cublas_f16_cached"].set_index(["qtype", "od", "id"])
    x = np.arange(len(b))
    ax.bar(x - 0.2, b.mhz, 0.4, color=color("wgmma_kq"), label="fastest wgmma launch")
    ax.bar(x + 0.2, cb.loc[list(zip(b.qtype, b.od, b.id)), "mhz"].values, 0.4, color=color("cublas_f16_cached"),
           label="cuBLAS fp16 (cached)")
    ax.axhline(float(view.idle_mhz.median()), color="0.2", ls="--", lw=.8, label="idle (the probe alone)")
    ax.set_ylim(1400, 2100)
    ax.set_xticks(x, [f"{q}\n{od}×{id_}\n{v.removeprefix('wgmma_')}" for q, od, id_, v in
                      zip(b.qtype, b.od, b.id, b.variant)], fontsize=7)
    ax.set_ylabel("SM clock during the launch (MHz)")
    ax.legend(fontsize=7, loc="upper left", ncol=3, frameon=False)
    ax.set_title(title, fontsize=9)


def build_series_bars(ax, table, qtype: str, nt: int, title: str = "") -> None:
    """A series of exploratory builds (:func:`~labkernels.rounds.r07_wgmma.kpair.kpair_builds`) at one (weight type, nt): per shape,
    the best launch of record (of the last build's run) and each build as grouped bars of their ratio to cuBLAS fp16
    timed beside them, the 1.0 line (the nt=512 bar) drawn."""
    import numpy as np

    t = table[(table.qtype == qtype) & (table.nt == nt)]
    builds = list(dict.fromkeys(t.build))
    shapes = sorted({(od, id_) for od, id_ in zip(t.od, t["id"])})
    x = np.arange(len(shapes))
    n = len(builds) + 1
    w = 0.8 / n
    last = t[t.build == builds[-1]].set_index(["od", "id"])
    ax.bar(x - 0.4 + w / 2, [last.loc[s, "best_record_vs_cublas"] for s in shapes], w, color="0.25",
           label="best launch of record", edgecolor="0.2", lw=.5)
    grey = np.linspace(0.85, 0.5, len(builds))
    for i, b in enumerate(builds):
        g = t[t.build == b].set_index(["od", "id"])
        ax.bar(x - 0.4 + w * (i + 1.5), [g.loc[s, "kpair_vs_cublas"] if s in g.index else np.nan for s in shapes], w,
               color=color("wgmma_kq") if i == len(builds) - 1 else str(grey[i]), label=b, edgecolor="0.2", lw=.5)
    ax.axhline(1, color="0.2", lw=1)
    ax.set_xticks(x, [f"{od} x {id_}" for od, id_ in shapes], fontsize=7)
    ax.set_xlabel("od x id", fontsize=8)
    ax.set_ylabel("ratio to cuBLAS fp16 (cached), same shape")
    ax.set_ylim(0, 1.15)
    ax.grid(axis="y", alpha=.3)
    if title:
        ax.set_title(title, fontsize=8)


def _smem_label(r, labels: dict) -> str:
    """A case of :func:`~labkernels.rounds.r07_wgmma.kpair.smem_table` in a few words: who, shape, nt (and the lab's
    launch: ``labels`` names a build, the caller's -- round 7's ``kpair.KPAIR_BUILD_LABELS`` -- so plotting, which
    every page imports, never loads a round's code)."""
    if r.who == "cublas":
        return f"cuBLAS {r.od}x{r.id} nt={r.nt}"
    launch = labels.get(r.who)
    if launch is None:
        launch = f"BN={r.BN} " + ("data-par." if r.SK == 0 else f"SK={r.SK} EPI={r.EPI}")
    return f"{r.qtype} {launch} nt={r.nt}"


def smem_bars(axs, table, title: str = "", labels: dict | None = None) -> None:
    """The twenty-second step (:func:`~labkernels.rounds.r07_wgmma.kpair.smem_table`) on two axes: ``axs[0]`` shared memory's measured
    bytes per SM per tensor-active clock (data-bank reads and writes) as bars with the model's values
    (:func:`~labkernels.rounds.r07_wgmma.kpair.smem_model`) as black ticks, ``axs[1]`` the tensor pipe's active share of the same
    cases; one x position per case, labelled by ``labels`` (build -> words; round 7's ``kpair.KPAIR_BUILD_LABELS``)."""
    import numpy as np

    t = table.reset_index(drop=True)
    x = np.arange(len(t))
    w = 0.38
    ax = axs[0]
    ax.bar(x - w / 2, t.read_per_tensor_clk, w, color="#1f77b4", label="reads (measured)")
    ax.bar(x + w / 2, t.write_per_tensor_clk, w, color="#ff7f0e", label="writes (measured)")
    ax.scatter(x - w / 2, t.model_read, marker="_", s=220, color="k", lw=2, zorder=3, label="model")
    ax.scatter(x + w / 2, t.model_write, marker="_", s=220, color="k", lw=2, zorder=3)
    ax.set_ylabel("shared memory, B per SM\nper tensor-active clock")
    ax.legend(fontsize=8, ncol=3, loc="upper right")
    if title:
        ax.set_title(title, fontsize=9)
    ax2 = axs[1]
    ax2.bar(x, t.tensor_active_pct, 0.6, color=[color("cublas_f16") if w_ == "cublas" else color("wgmma_kq")
                                                for w_ in t.who])
    ax2.set_ylabel("tensor pipe active\n(% of active cycles)")
    ax2.set_ylim(0, 100)
    for a in axs:
        a.set_xticks(x, [_smem_label(r, labels or {}) for r in t.itertuples()], rotation=60, ha="right", fontsize=7)
        a.grid(axis="y", alpha=.3)
    axs[0].tick_params(labelbottom=False)


#: the forms of :func:`smemform_bars`: launch (smemform_table's) -> label
SMEMFORM_LAUNCHES = {"smem_bn128_s4": "shared-memory form, 1 converter warpgroup",
                     "smem_bn128_s4_c2": "shared-memory form, 2 converter warpgroups",
                     "bn128_s4_scl0": "register form"}


def smemform_bars(ax, table, nt: int, title: str = "") -> None:
    """The twenty-third step (:func:`~labkernels.rounds.r07_wgmma.kpair.smemform_table`) at one nt: per shape and BN=128 form, its
    ratio to cuBLAS fp16 as a bar and its no-conversion build's as an outlined bar behind it; the 1.0 line."""
    import numpy as np

    t = table[(table.nt == nt) & table.launch.isin(SMEMFORM_LAUNCHES)]
    shapes = sorted({(od, id_) for od, id_ in zip(t.od, t["id"])})
    x = np.arange(len(shapes))
    w = 0.8 / len(SMEMFORM_LAUNCHES)
    cols = ("#1f77b4", "#17becf", color("wgmma_kq"))
    for i, (ln, label) in enumerate(SMEMFORM_LAUNCHES.items()):
        g = t[t.launch == ln].set_index(["od", "id"])
        pos = x - 0.4 + w * (i + 0.5)
        ax.bar(pos, [g.loc[s, "noconv_vs_cublas"] if s in g.index else np.nan for s in shapes], w, fill=False,
               edgecolor=cols[i], lw=1.2, hatch="//", label=f"{label}, no conversion (ablation)")
        ax.bar(pos, [g.loc[s, "vs_cublas"] if s in g.index else np.nan for s in shapes], w * 0.7, color=cols[i],
               edgecolor="0.2", lw=.5, label=label)
    ax.axhline(1, color="0.2", lw=1)
    ax.set_xticks(x, [f"{od} x {id_}" for od, id_ in shapes], fontsize=8)
    ax.set_xlabel("od x id (q4_K)")
    ax.set_ylabel("ratio to cuBLAS fp16 (cached), same shape")
    ax.set_ylim(0, 1.25)
    ax.grid(axis="y", alpha=.3)
    if title:
        ax.set_title(title, fontsize=9)


#: the phases of :func:`~labkernels.rounds.r07_wgmma.traces.kpair_trace_table`, in a CTA's order: (column, label, colour, hatch)
TRACE_PHASES = (("to_first_tile_us", "to the first activation stage", "0.75", ""),
                ("loop_pipe_us", "main loop at the tensor pipe's rate", None, ""),
                ("loop_excess_us", "main loop above the pipe's rate", "#c5b0d5", ""),
                ("finish_us", "finish (partial sums, Y stores)", "0.4", ""),
                ("exit_us", "cluster exit barrier (KPAIR)", "white", "///"))


def trace_phase_bars(ax, table, title: str = "") -> None:
    """The twenty-fifth step's traces (:func:`~labkernels.rounds.r07_wgmma.traces.kpair_trace_table`, one L2 state): per (type, shape,
    build) a horizontal bar of a CTA's median phases, in us from its entry -- the main loop split into its time at
    the tensor pipe's rate (cycles per iteration at the pipe's rate, the SM clock of the trace) and what it takes
    above that; the launch's last stamp as a tick."""
    import numpy as np

    t = table.copy()
    t["loop_pipe_us"] = t.loop_us / t.loop_over_pipe
    t["loop_excess_us"] = t.loop_us - t.loop_pipe_us
    y = np.arange(len(t))
    left = np.zeros(len(t))
    for col, label, c, hatch in TRACE_PHASES:
        v = t[col].fillna(0).to_numpy(float)
        ax.barh(y, v, left=left, color=c or color("wgmma_kq"), hatch=hatch, edgecolor="0.3", lw=.5, label=label)
        left += v
    ax.scatter(t.end_us_max, y, marker="|", s=120, color="k", zorder=3, label="the launch's last stamp")
    ax.set_yticks(y, [f"{r.qtype} {r.od} x {r.id}, {r.build}" for r in t.itertuples()], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("us from the CTA's entry (median over CTAs)")
    ax.grid(axis="x", alpha=.3)
    if title:
        ax.set_title(title, fontsize=9)


def build_series_grid(table, suptitle: str, ncol: int = 3, height: float = 7.4):
    """:func:`build_series_bars` for both weight types (rows) at nt 512 and 4096 (columns), one shared y axis and one
    legend below; returns the figure."""
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(2, 2, figsize=(12, height), sharey=True)
    for i, q in enumerate(("q4_K", "q6_K")):
        for j, nt in enumerate((512, 4096)):
            build_series_bars(axs[i, j], table, q, nt, f"{q}, nt={nt}")
        axs[i, 1].set_ylabel("")
    fig.legend(*axs[0, 0].get_legend_handles_labels(), fontsize=8, ncol=ncol, loc="outside lower center")
    fig.suptitle(suptitle, fontsize=9)
    return fig


def ratio_by_point(ax, table, col: str, ylabel: str, title: str = "") -> None:
    """A ratio per A/B point as grouped bars: the shapes (od x id) along x, one bar per (qtype, nt) series, the
    ratio ``col`` on the y axis, a line at 1 (no change); each bar labelled with its value."""
    import numpy as np

    shapes = list(dict.fromkeys(f"{int(r.od)} x {int(r.id)}" for r in table.itertuples()))
    series = sorted({(r.qtype, int(r.nt)) for r in table.itertuples()})
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(shapes))
    for i, (q, nt) in enumerate(series):
        t = table[(table.qtype == q) & (table.nt == nt)]
        v = {f"{int(r.od)} x {int(r.id)}": getattr(r, col) for r in t.itertuples()}
        ys = [v.get(s, np.nan) for s in shapes]
        bars = ax.bar(x - 0.4 + width * (i + 0.5), ys, width, label=f"{q}, nt={nt}")
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=1)
    ax.axhline(1.0, color="0.3", lw=0.8, ls="--")
    ax.set_xticks(x, shapes)
    ax.set_xlabel("weight shape od x id")
    ax.set_ylabel(ylabel, fontsize=8)
    lo = np.nanmin(table[col].to_numpy(float)) if len(table) else 1.0
    hi = np.nanmax(table[col].to_numpy(float)) if len(table) else 1.0
    ax.set_ylim(min(lo, 1.0) - 0.02, max(hi, 1.0) + 0.035)   # headroom: the legend sits above the tallest bars
    ax.legend(fontsize=8, ncol=len(series), loc="upper left")
    if title:
        ax.set_title(title, fontsize=9)
