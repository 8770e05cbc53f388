"""Round 9's page: its tables and figures from recorded runs -- the benchmark of record per point and variant
(:func:`bench_table`), the run's copy line, the fastest gemv_kq configuration per point beside the baselines, the
headline figures, the first prediction against the run, time against tokens -- and the generation's: its latest run,
tokens/s per model and prompt, llama-bench's on the same card."""

from __future__ import annotations

from ... import records
from .benchmark import weight_bytes
from .plan import PREDICTION, TARGETS


def bench_table(run) -> "pd.DataFrame":
    """One row per (qtype, od, id, nt, act, variant): the median over the interleaved pairs of each pair's median time,
    with the weight bytes, TB/s of weight bytes and the fraction of the run's copy line."""
    import pandas as pd

    df = run.table("gemv_bench")
    # runs before step 2 (FORM) and step 3 (PIPE, WAVE): 0; runs after step 3's ring left the source have no PIPE: 0
    for col in ("FORM", "PIPE", "WAVE"):
        if col not in df.columns:
            df = df.assign(**{col: 0})
    keys = ["qtype", "od", "id", "nt", "act", "variant", "family", "MT", "WARPS", "S", "FORM", "PIPE", "WAVE"]
    t = df.groupby(keys, as_index=False).agg(median_us=("median_us", "median"), bytes=("bytes", "first"),
                                             pairs=("pair", "nunique"))
    line = copy_line(run)
    t["tb_per_s"] = t.bytes / (t.median_us * 1e-6) / 1e12
    t["frac_copy"] = t.tb_per_s / line
    return pd.DataFrame(t)


def copy_line(run) -> float:
    """The run's copy line (TB/s, read + write of 1 GiB, median)."""
    return float(run.table("copy").tb_per_s.median())


def best_per_point(t) -> "pd.DataFrame":
    """Per (qtype, od, id, nt, act): the fastest gemv_kq configuration and the baselines' times beside it."""
    import pandas as pd

    g = t[t.family == "gemv_kq"]
    best = g.loc[g.groupby(["qtype", "od", "id", "nt", "act"]).median_us.idxmin()].copy()
    for fam, col in (("wgmma_kq", "wgmma_us"), ("cublas_f16", "cublas_us")):
        ref = t[t.family == fam].set_index(["qtype", "od", "id", "nt", "act"]).median_us
        best[col] = [ref.get(k, float("nan")) for k in zip(best.qtype, best.od, best.id, best.nt, best.act)]
    return pd.DataFrame(best).reset_index(drop=True)


def headline(run) -> dict:
    """The page's headline figures (the benchmark of record; the card and run named)."""
    b = best_per_point(bench_table(run))
    card = ((run.provenance or {}).get("gpu") or {}).get("name", "?")
    out = {"card, copy line": f"{card}, {copy_line(run):.2f} TB/s (read + write of 1 GiB, this run)"}
    for q in ("q4_K", "q6_K"):
        r = b[(b.qtype == q) & (b.od == 4096) & (b.id == 14336) & (b.nt == 1) & (b.act == "f16")]
        if len(r):
            r = r.iloc[0]
            out[f"{q} 4096x14336 nt=1"] = (f"{r.median_us:.1f} us = {r.frac_copy:.0%} of the copy line "
                                           f"({r.variant}; wgmma {r.wgmma_us:.1f} us)")
    one = b[(b.nt == 1) & (b.act == "f16")]
    eight = b[(b.nt == 8) & (b.act == "f16")].set_index(["qtype", "od", "id"]).median_us
    ratios = [eight.get((r.qtype, r.od, r.id)) / r.median_us for r in one.itertuples()
              if (r.qtype, r.od, r.id) in eight.index]
    if ratios:
        out["nt=8 / nt=1 time"] = f"{min(ratios):.2f}-{max(ratios):.2f}x (target <= {TARGETS['nt8_over_nt1']}x)"
    if len(one):
        met = (one.frac_copy >= TARGETS["frac_copy_nt1"]).sum()
        out["target: >= 80% of the copy line at nt=1"] = (
            f"{'met' if met == len(one) else 'NOT met'} at {met} of {len(one)} points "
            f"({one.frac_copy.min():.0%}-{one.frac_copy.max():.0%})")
    return out


def stream_fit(run, qtype: str = "q4_K", act: str = "f16", nt: int = 1) -> "pd.DataFrame":
    """What a launch costs before its bytes stream, and how fast they stream then: per variant timed at every shape of
    the run (at ``qtype``, ``act``, ``nt``), the least-squares line time = fixed + bytes / stream over the shapes'
    weight bytes -- ``fixed_us`` (the intercept: the timing's floor, the first DRAM round trip, a split's fold, the
    wave's tail), ``stream_tb_per_s`` and its fraction of the run's copy line, the largest residual -- beside the
    empty launch's median at the same points where the run timed one (``floor_us``; ``kernel_fixed_us`` = fixed -
    floor). Variants timed at fewer than 3 shapes are left out (two points fit any line)."""
    import numpy as np
    import pandas as pd

    t = bench_table(run)
    t = t[(t.qtype == qtype) & (t.act == act) & (t.nt == nt)]
    line = copy_line(run)
    empty = t[t.family == "empty"].median_us
    floor = float(empty.median()) if len(empty) else float("nan")
    rows = []
    for (fam, var), g in t[t.family != "empty"].groupby(["family", "variant"]):
        if g.bytes.nunique() < 3:
            continue
        a = np.c_[np.ones(len(g)), g.bytes.to_numpy(float) / 1e6]
        (fixed, us_per_mb), *_ = np.linalg.lstsq(a, g.median_us.to_numpy(float), rcond=None)
        if us_per_mb <= 0:
            continue            # time not growing with bytes: no stream to report
        stream = 1.0 / us_per_mb          # MB/us = TB/s
        rows.append({"variant": var, "family": fam, "points": len(g), "fixed_us": float(fixed),
                     "stream_tb_per_s": stream, "stream_frac_copy": stream / line,
                     "max_resid_us": float(np.abs(a @ [fixed, us_per_mb] - g.median_us.to_numpy(float)).max()),
                     "floor_us": floor, "kernel_fixed_us": float(fixed) - floor})
    cols = ["variant", "family", "points", "fixed_us", "stream_tb_per_s", "stream_frac_copy", "max_resid_us",
            "floor_us", "kernel_fixed_us"]
    return pd.DataFrame(rows, columns=cols).sort_values("fixed_us").reset_index(drop=True)


def prediction_table(run, claims=None) -> "pd.DataFrame":
    """The written prediction (step 1's claims) beside what the run measured, where the run measures it."""
    import pandas as pd

    b = best_per_point(bench_table(run))
    rows = []
    for c in claims or PREDICTION["claims"]:
        got = None
        if c["metric"] == "frac_copy":
            q, shape = c["what"].split()[:2]
            od, id_ = (int(v) for v in shape.split("x"))
            r = b[(b.qtype == q) & (b.od == od) & (b.id == id_) & (b.nt == 1) & (b.act == "f16")]
            got = float(r.frac_copy.iloc[0]) if len(r) else None
        elif c["metric"] == "ratio":
            n = int(c["what"].split("/")[0].split("=")[1])
            hi = b[(b.nt == n) & (b.act == "f16")].set_index(["qtype", "od", "id"]).median_us
            lo = b[(b.nt == 1) & (b.act == "f16")].set_index(["qtype", "od", "id"]).median_us
            rs = [hi[k] / lo[k] for k in hi.index if k in lo.index]
            got = max(rs) if rs else None
        verdict = ("not measured" if got is None else "within" if c["low"] <= got <= c["high"]
                   else "below" if got < c["low"] else "above")
        rows.append({"claim": c["what"], "metric": c["metric"], "predicted": f"{c['low']:g}-{c['high']:g}",
                     "measured": got, "verdict": verdict})
    return pd.DataFrame(rows)


def figure_time_vs_nt(run, qtype: str = "q4_K", act: str = "f16"):
    """Time against tokens at the four shapes: the best gemv_kq configuration, round 7's wgmma launch and cuBLAS fp16
    on cached dequantized weights, with the time the weight bytes take at the run's copy line (dashed)."""
    import matplotlib.pyplot as plt

    t = bench_table(run)
    b = best_per_point(t)
    b = b[(b.qtype == qtype) & (b.act == act)]
    line = copy_line(run)
    card = ((run.provenance or {}).get("gpu") or {}).get("name", "?")
    shapes = sorted({(r.od, r.id) for r in b.itertuples()}, key=lambda s: s[0] * s[1])
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.0 * len(shapes), 3.3), sharey=False, squeeze=False,
                             layout="constrained")
    for ax, (od, id_) in zip(axes[0], shapes):
        p = b[(b.od == od) & (b.id == id_)].sort_values("nt")
        ax.plot(p.nt, p.median_us, "o-", color="#1f77b4", label="gemv_kq (best config)")
        ax.plot(p.nt, p.wgmma_us, "s--", color="#ff7f0e", label="wgmma_kq (round 7)")
        ax.plot(p.nt, p.cublas_us, "^:", color="#7f7f7f", label="cuBLAS fp16, cached")
        hbm = weight_bytes(qtype, od, id_) / (line * 1e12) * 1e6
        ax.axhline(hbm, color="#2ca02c", ls="--", lw=1, label="weight bytes at the copy line")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(p.nt.unique()))
        ax.set_xticklabels([str(v) for v in sorted(p.nt.unique())])
        ax.set_ylim(0, None)
        ax.set_title(f"{qtype} {od}x{id_}", fontsize=9)
        ax.set_xlabel("tokens (nt)")
    axes[0][0].set_ylabel("time per launch (µs)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(f"{qtype}, {act} activations, {card}: median of interleaved CUDA-event timings (run {run.run_id})",
                 fontsize=9)
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    return fig


# ------------------------------------------------------------------------------------------ generation (tokens/s)

def generation_run(root=None):
    """The latest complete ``decode`` run of the generation benchmark (``what: generate``), or None (not recorded)."""
    runs = [r for r in records.list_runs("decode", root) if (r.meta.get("params") or {}).get("what") == "generate"]
    return runs[-1] if runs else None


def generation_table(run) -> "pd.DataFrame":
    """Per (model, prompt length): the median over the repeats of tokens/s (GPU time of the graph replays), of the
    host's tokens/s, of the prefill's ms, and the fraction of the run's copy line the stored weight bytes a token
    take at that rate."""
    import pandas as pd

    df = run.table("generate")
    t = df.groupby(["model", "n_prompt", "n_new"], as_index=False).agg(
        tok_per_s=("tok_per_s", "median"), tok_per_s_wall=("tok_per_s_wall", "median"),
        prefill_ms=("prefill_ms", "median"), weight_bytes=("weight_bytes", "first"), mode=("mode", "first"),
        repeats=("rep", "nunique"))
    t["frac_copy"] = t.weight_bytes * t.tok_per_s / 1e12 / copy_line(run)
    return pd.DataFrame(t)


def peer_generation(card: str | None, root=None) -> "pd.DataFrame":
    """llama-bench's token generation on the same card (the latest peers run whose bench table has tg / pg rows and
    whose GPU is ``card``): model, test (tg128, pp512+tg128), tok/s, the run id. Empty where none is recorded."""
    import pandas as pd

    for r in reversed(records.list_runs("peers", root)):
        if not r.has("bench"):
            continue
        b = r.table("bench")
        if "n_gen" not in b or not (b.n_gen > 0).any():
            continue
        gpu = ((r.provenance or {}).get("gpu") or {}).get("name") or (r.meta.get("params") or {}).get("gpu_name")
        if card and gpu and gpu != card:
            continue
        g = b[b.n_gen > 0].copy()
        g["test"] = [f"tg{n}" if not p else f"pp{p}+tg{n}" for p, n in zip(g.n_prompt, g.n_gen)]
        g["run"] = r.run_id
        return pd.DataFrame(g[["model", "test", "flash_attn", "n_prompt", "n_gen", "tok_s", "run"]])
    return pd.DataFrame(columns=["model", "test", "flash_attn", "n_prompt", "n_gen", "tok_s", "run"])
