"""Round 9's page: its tables and figures from recorded runs -- the benchmark of record per point and variant
(:func:`bench_table`), the run's copy line, the fastest gemv_kq configuration per point beside the baselines, the
headline figures, the first prediction against the run, time against tokens --, the generation's: its latest run,
tokens/s per model and prompt (skipped points with their reason), llama-bench's on the same card, tokens/s against
context length (:func:`context_section`) -- and the decode step's decomposition (:func:`decomp_section`: the classes'
time per model and context, its prediction beside it). A section whose run is not recorded says so and names the
command that records it."""

from __future__ import annotations

import math

from ... import records
from .benchmark import weight_bytes
from .decomp import PARTS
from .plan import DECOMP_PREDICTION, PREDICTION, TARGETS

#: the commands that record the sections' runs (on a GPU machine; then ``labkernels data import DIR/data`` here)
CONTEXT_CMD = "python3 -m labkernels gpu check --steps generate_context --out DIR"
DECOMP_CMD = "python3 -m labkernels gpu check --steps decode_decomp --out DIR"
IMPORT_CMD = "python3 -m labkernels data import DIR/data"


def run_line(run) -> str:
    """Where a run's figures come from, as the page says it: "Run <id> on <card>, commit <commit>"."""
    return f"Run {run.run_id} on {run.gpu_name or '?'}, commit {run.commit or '?'}"


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


def point_summary(best) -> "pd.DataFrame":
    """The page's short form of :func:`best_per_point`: one row per (qtype, od, id, act) with the fastest
    configuration's time and fraction of the copy line at nt=1, its time at nt=8 and the ratio, and cuBLAS fp16 at
    nt=1 (NaN where a point was not timed)."""
    import pandas as pd

    rows = []
    for (q, od, id_, act), g in best.groupby(["qtype", "od", "id", "act"], sort=True):
        one, eight = g[g.nt == 1], g[g.nt == 8]
        u1 = float(one.median_us.iloc[0]) if len(one) else float("nan")
        u8 = float(eight.median_us.iloc[0]) if len(eight) else float("nan")
        rows.append({"type": q, "od": int(od), "id": int(id_), "activations": act,
                     "nt=1 config": one.variant.iloc[0] if len(one) else "—", "nt=1 (µs)": u1,
                     "nt=1 of the copy line": float(one.frac_copy.iloc[0]) if len(one) else float("nan"),
                     "nt=8 (µs)": u8, "nt=8 / nt=1": u8 / u1,
                     "cuBLAS fp16 nt=1 (µs)": float(one.cublas_us.iloc[0]) if len(one) else float("nan")})
    return pd.DataFrame(rows)


def headline(run) -> dict:
    """The page's headline figures (the benchmark of record; the card and run named)."""
    b = best_per_point(bench_table(run))
    card = run.gpu_name or "?"
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


def claim_value(run, check: dict):
    """What a step's run measured for one ledger claim's ``check`` (the claim says how it is read from the run):
    ``ratio`` -- median time of variant ``num`` over ``den`` at each of ``points`` (qtype, od, id, nt, act) of the
    run's gemv_bench table: (lowest, highest); ``us`` -- the median time of ``variant`` over ``points`` ("all": every
    point): (value, value); ``gen_ratio`` -- :func:`generation_ab`'s ratio (last value / first) of ``option`` for
    ``model`` at ``n_prompt``: (value, value); ``gate`` -- the run is complete, so every point passed its gate before
    it was timed (a failed gate aborts the run): "passed"; ``gen_same`` -- the A/B's rows of the two values generated
    the same first tokens at every (model, prompt, repeat): "passed" or "FAILED". None where the run lacks the
    points."""
    kind = check["kind"]
    if kind == "gate":
        return "passed" if run.meta.get("status", "complete") == "complete" else None
    if kind in ("gen_ratio", "gen_same"):
        df = run.table("generate") if run.has("generate") else None
        if df is None or check["option"] not in df.columns:
            return None
        if kind == "gen_same":
            firsts = df.groupby(["model", "n_prompt", "rep"]).first_tokens.nunique()
            return "passed" if (firsts == 1).all() else "FAILED"
        t = generation_ab(run, check["option"])
        r = t[(t.model == check["model"]) & (t.n_prompt == check["n_prompt"])]
        return (float(r.ratio.iloc[0]),) * 2 if len(r) else None
    if not run.has("gemv_bench"):
        return None
    t = bench_table(run)
    keys = ["qtype", "od", "id", "nt", "act"]
    med = t.set_index([*keys, "variant"]).median_us
    if kind == "us":
        rows = t[t.variant == check["variant"]]
        if check.get("points", "all") != "all":
            pts = {tuple(p[k] for k in keys) for p in check["points"]}
            rows = rows[[tuple(r) in pts for r in rows[keys].itertuples(index=False)]]
        return (float(rows.median_us.median()),) * 2 if len(rows) else None
    if kind == "ratio":
        vals = []
        for p in check["points"]:
            k = tuple(p[c] for c in keys)
            if (*k, check["num"]) not in med.index or (*k, check["den"]) not in med.index:
                return None
            vals.append(float(med[(*k, check["num"])] / med[(*k, check["den"])]))
        return (min(vals), max(vals))
    raise ValueError(f"unknown claim check kind {kind!r}")


def step_run(step: dict, root=None):
    """The latest recorded run a ledger step names (its ``runs``) that the data folder holds, or None."""
    for rid in reversed(step.get("runs") or []):
        try:
            return records.load("decode", rid, root)
        except Exception:          # a run this clone's data/ does not hold
            continue
    return None


def step_claims_table(step: dict, run) -> "pd.DataFrame":
    """A ledger step's written claims beside what its run measured (:func:`claim_value`): measured (a value, a range
    over the claim's points, or a gate's outcome) and the verdict -- within / below / above / partly (a range that
    crosses a bound) / passed / FAILED / not measured."""
    import pandas as pd

    rows = []
    for c in step["prediction"]:
        got = claim_value(run, c["check"]) if "check" in c and run is not None else None
        if got is None:
            shown, verdict = None, "not measured"
        elif isinstance(got, str):
            shown, verdict = got, got
        else:
            lo, hi = got
            shown = f"{lo:.3g}" if lo == hi else f"{lo:.3g}-{hi:.3g}"
            verdict = ("within" if c["low"] <= lo and hi <= c["high"] else "below" if hi < c["low"]
                       else "above" if lo > c["high"] else "partly")
        rows.append({"claim": c["what"], "metric": c["metric"],
                     "predicted": "passes" if c["metric"] == "gate" else f"{c['low']:g}-{c['high']:g}",
                     "measured": shown, "verdict": verdict})
    return pd.DataFrame(rows)


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
    card = run.gpu_name or "?"
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

def _latest_what(what: str, root=None):
    runs = [r for r in records.list_runs("decode", root) if (r.meta.get("params") or {}).get("what") == what]
    return runs[-1] if runs else None


def generation_run(root=None):
    """The latest complete ``decode`` run of the generation benchmark (``what: generate``), or None (not recorded)."""
    return _latest_what("generate", root)


def generation_ab(run, option: str) -> "pd.DataFrame":
    """An A/B generation run (``measure_generate(ab={option: [a, b]})``): per (model, prompt length) the median tokens/s
    of each value of ``option`` over the repeats and the ratio of the last value's to the first's, with the largest
    and smallest per-repeat ratio (the repeats alternate the values, so repeat r's pair ran back to back)."""
    import pandas as pd

    df = run.table("generate")
    if option not in df.columns:
        raise ValueError(f"run {run.run_id} is not an A/B over {option!r} (its generate table has no such column)")
    vals = list(dict.fromkeys(df[option]))
    if len(vals) != 2:
        raise ValueError(f"run {run.run_id}: an A/B takes two values of {option!r}, found {vals}")
    a, b = vals
    rows = []
    for (model, n), g in df.groupby(["model", "n_prompt"], sort=False):
        ta = g[g[option] == a].set_index("rep").tok_per_s
        tb = g[g[option] == b].set_index("rep").tok_per_s
        per = (tb / ta).dropna()
        rows.append({"model": model, "n_prompt": int(n), f"tok_per_s ({option}={a})": float(ta.median()),
                     f"tok_per_s ({option}={b})": float(tb.median()), "ratio": float(tb.median() / ta.median()),
                     "ratio_min": float(per.min()), "ratio_max": float(per.max()), "pairs": int(len(per))})
    return pd.DataFrame(rows)


def generation_table(run) -> "pd.DataFrame":
    """Per (model, prompt length): the median over the repeats of tokens/s (GPU time of the graph replays), of the
    host's tokens/s, of the prefill's ms, and the fraction of the run's copy line the stored weight bytes a token
    take at that rate; ``status`` "measured", or "skipped: <why>" for a point the run recorded as skipped (table
    ``generate_skipped``: a prompt the model cannot take), its figures empty."""
    import pandas as pd

    df = run.table("generate") if run.has("generate") else pd.DataFrame(
        columns=["model", "n_prompt", "n_new", "tok_per_s", "tok_per_s_wall", "prefill_ms", "weight_bytes", "mode",
                 "rep"])
    t = df.groupby(["model", "n_prompt", "n_new"], as_index=False).agg(
        tok_per_s=("tok_per_s", "median"), tok_per_s_wall=("tok_per_s_wall", "median"),
        prefill_ms=("prefill_ms", "median"), weight_bytes=("weight_bytes", "first"), mode=("mode", "first"),
        repeats=("rep", "nunique"))
    t["frac_copy"] = t.weight_bytes * t.tok_per_s / 1e12 / copy_line(run)
    t["status"] = "measured"
    if run.has("generate_skipped"):
        sk = run.table("generate_skipped")
        t = pd.concat([t, pd.DataFrame({"model": sk.model, "n_prompt": sk.n_prompt, "n_new": sk.n_new,
                                        "status": "skipped: " + sk.why.astype(str)})], ignore_index=True)
    t = t.sort_values(["model", "n_prompt"]).reset_index(drop=True)
    return pd.DataFrame(t)


def context_run(root=None):
    """The latest complete context sweep (``what: generate_context``), or None (not recorded)."""
    return _latest_what("generate_context", root)


def figure_tok_s_vs_context(run):
    """Tokens/s (GPU time of the replays) against the context at the first new token (the prompt), one panel per
    model; a skipped point is marked at the axis with its reason (the model's context)."""
    import matplotlib.pyplot as plt

    t = generation_table(run)
    models = list(dict.fromkeys(t.model))
    card = run.gpu_name or "?"
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False, layout="constrained")
    for ax, m in zip(axes[0], models):
        g = t[t.model == m]
        ok = g[g.status == "measured"].sort_values("n_prompt")
        ax.plot(ok.n_prompt, ok.tok_per_s, "o-", color="#1f77b4", label="tokens/s (GPU time of the replays)")
        for r in g[g.status != "measured"].itertuples():
            ax.plot([r.n_prompt], [0], "x", color="#d62728", ms=8)
            ax.annotate("skipped:\n> n_ctx_train", (r.n_prompt, 0), textcoords="offset points", xytext=(0, 8),
                        ha="center", fontsize=7, color="#d62728")
        ax.set_xscale("log", base=2)
        ticks = sorted(g.n_prompt.unique())
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(v) for v in ticks], fontsize=7)
        ax.set_ylim(0, None)
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("prompt tokens (context at the first new token)")
    axes[0][0].set_ylabel("tokens / s")
    n_new = int(t.n_new.iloc[0]) if len(t) else 0
    fig.suptitle(f"Generation of {n_new} tokens after the prompt, {card} (run {run.run_id})", fontsize=9)
    return fig


def context_section(root=None) -> dict:
    """The page's tokens/s-against-context section: ``run`` (None: not recorded), ``message`` (what the section shows,
    or that nothing is recorded and the command that records it), ``table`` (:func:`generation_table`) and
    ``figure`` (None without a run)."""
    run = context_run(root)
    if run is None:
        return {"run": None, "table": None, "figure": None,
                "message": f"*Not recorded yet:* no context sweep (tokens/s at prompts of 128 .. 8,160 tokens) under "
                           f"`data/09_decode/`. `{CONTEXT_CMD}` on a GPU machine records one (then `{IMPORT_CMD}` "
                           f"here)."}
    t = generation_table(run)
    sk = t[t.status != "measured"]
    note = (" Skipped: " + "; ".join(f"{r.model} at {r.n_prompt} ({r.status[9:]})" for r in sk.itertuples()) + "."
            if len(sk) else "")
    return {"run": run, "table": t, "figure": figure_tok_s_vs_context(run),
            "message": f"{run_line(run)}.{note}"}


def peer_runs_on(card: str | None, table: str, root=None):
    """The peers runs (newest first) with ``table`` that were measured on ``card`` -- as their provenance, or the
    params of a run recorded from a peer's own output, name it; a run that names no card is never taken for one.
    ``card`` None: any card."""
    for r in reversed(records.list_runs("peers", root)):
        if r.has(table) and (card is None or (r.gpu_name or (r.meta.get("params") or {}).get("gpu_name")) == card):
            yield r


def peer_generation(card: str | None, root=None) -> "pd.DataFrame":
    """llama-bench's token generation on the same card (the latest peers run whose bench table has tg / pg rows and
    whose GPU is ``card``): model, test (tg128, pp512+tg128), tok/s, the run id. Empty where none is recorded."""
    import pandas as pd

    for r in peer_runs_on(card, "bench", root):
        b = r.table("bench")
        if "n_gen" not in b or not (b.n_gen > 0).any():
            continue
        g = b[b.n_gen > 0].copy()
        g["test"] = [f"tg{n}" if not p else f"pp{p}+tg{n}" for p, n in zip(g.n_prompt, g.n_gen)]
        g["run"] = r.run_id
        return pd.DataFrame(g[["model", "test", "flash_attn", "n_prompt", "n_gen", "tok_s", "run"]])
    return pd.DataFrame(columns=["model", "test", "flash_attn", "n_prompt", "n_gen", "tok_s", "run"])


# ------------------------------------------------------------------------------------------ the decode step's parts

def decomp_run(root=None):
    """The latest complete decode-step decomposition (``what: decode_decomp``), or None (not recorded)."""
    return _latest_what("decode_decomp", root)


def decomp_classes(run) -> "pd.DataFrame":
    """The run's class rows (table ``decode_decomp``): per (model, context, class) the launches, the time in the
    eager step and in the graph replay, the step's figure and its share."""
    return run.table("decode_decomp")


def decomp_groups(run) -> "pd.DataFrame":
    """Per measured (model, context): the step (µs, tokens/s), each group's time and share (GEMV, attention, small
    kernels, memset / memcpy, unclassified, gaps), the graph replay's and the eager step's times, the classes'
    coverage; and per skipped point its reason."""
    import pandas as pd

    c = decomp_classes(run) if run.has("decode_decomp") else pd.DataFrame(columns=["model", "context", "group", "us",
                                                                                    "share"])
    st = run.table("decode_decomp_steps")
    rows = []
    for r in st.itertuples():
        row = {"model": r.model, "context": int(r.context), "status": r.status,
               "why": "" if not isinstance(r.why, str) else r.why, "mode": r.mode if isinstance(r.mode, str) else ""}
        if r.status == "measured":
            g = c[(c.model == r.model) & (c.context == r.context)]
            for grp in ("gemv", "attention", "small", "memory", "unclassified", "gaps"):
                x = g[g.group == grp]
                row[f"{grp}_us"] = float(x.us.sum())
                row[f"{grp}_share"] = float(x.share.sum())
            row.update(step_us=float(r.step_us), tok_per_s=1e6 / float(r.step_us), graph_us=float(r.graph_us),
                       eager_wall_us=float(r.eager_wall_us), kernel_sum_eager_us=float(r.kernel_sum_eager_us),
                       launches=int(r.launches_eager), classified=float(r.classified_frac),
                       gemv_frac_copy=float(r.gemv_frac_copy), attention_frac_copy=float(r.attention_frac_copy))
        rows.append(row)
    return pd.DataFrame(rows)


def _claim_value(c: dict, groups) -> float | None:
    """What a DECOMP_PREDICTION claim's metric measured in ``groups`` (:func:`decomp_groups`), or None."""
    if groups is None or not len(groups):
        return None
    m = groups[groups.status == "measured"]
    if c["metric"] == "frac":
        return float(m.classified.min()) if len(m) else None
    row = m[(m.model == c["model"]) & (m.context == c["context"])]
    if not len(row):
        return None
    row = row.iloc[0]
    if c["metric"] == "share":
        if c["group"] == "small+gaps":
            return float(1.0 - row.gemv_share - row.attention_share)
        return float(row[f"{c['group']}_share"])
    if c["metric"] == "ratio":
        v = row.graph_us / row.eager_wall_us
        return float(v) if math.isfinite(v) else None
    if c["metric"] == "attention_ratio":
        base = m[(m.model == c["model"]) & (m.context == 512)]
        return float(row.attention_us / base.attention_us.iloc[0]) if len(base) and base.attention_us.iloc[0] else None
    return None


def decomp_prediction_table(run=None) -> "pd.DataFrame":
    """The decomposition's prediction (DECOMP_PREDICTION, written before any run) beside what ``run`` measured
    (None: every claim "not measured"): the claim, its metric, this round's range, the opening estimate where the
    task gave one, the measurement and the verdict against this round's range."""
    import pandas as pd

    groups = decomp_groups(run) if run is not None else None
    rows = []
    for c in DECOMP_PREDICTION["claims"]:
        got = _claim_value(c, groups)
        verdict = ("not measured" if got is None else "within" if c["low"] <= got <= c["high"]
                   else "below" if got < c["low"] else "above")
        op = c.get("opening")
        rows.append({"claim": c["what"], "metric": c["metric"], "predicted": f"{c['low']:g}-{c['high']:g}",
                     "opening estimate": f"{op[0]:g}-{op[1]:g}" if op else "—", "measured": got,
                     "verdict": verdict})
    return pd.DataFrame(rows)


#: the figure's colour per part (PARTS' order)
PART_COLORS = {"GEMV: Q/K/V": "#1f77b4", "GEMV: attention output": "#6baed6", "GEMV: FFN gate/up": "#08519c",
               "GEMV: FFN down": "#9ecae1", "GEMV: output head": "#17becf", "GEMV: other": "#c6dbef",
               "attention": "#ff7f0e", "small kernels": "#2ca02c", "memset / memcpy": "#9467bd",
               "unclassified": "#d62728", "gaps": "#bdbdbd"}


def figure_decomp(run):
    """One stacked bar per (model, context): the step's time (µs) by part -- the GEMVs by weight, attention, the small
    kernels, memset / memcpy, unclassified launches and the gaps -- one panel per model (their steps differ ~5x)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    c = decomp_classes(run)
    card = run.gpu_name or "?"
    models = list(dict.fromkeys(c.model))
    fig, axes = plt.subplots(1, len(models), figsize=(3.6 + 1.3 * max(1, c.context.nunique()) * len(models), 3.8),
                             squeeze=False, layout="constrained")
    used = []
    for ax, m in zip(axes[0], models):
        g = c[c.model == m]
        ctxs = sorted(g.context.unique())
        bottom = [0.0] * len(ctxs)
        for part, _ in PARTS:
            vals = [float(g[(g.context == x) & (g.part == part)].us.sum()) for x in ctxs]
            if not any(vals):
                continue
            ax.bar(range(len(ctxs)), vals, bottom=bottom, color=PART_COLORS[part], width=0.6)
            used.append(part)
            bottom = [b + v for b, v in zip(bottom, vals)]
        for i, tot in enumerate(bottom):
            ax.annotate(f"{tot:,.0f} µs", (i, tot), textcoords="offset points", xytext=(0, 3), ha="center",
                        fontsize=7)
        ax.set_xticks(range(len(ctxs)))
        ax.set_xticklabels([f"{x:,}" for x in ctxs])
        ax.set_xlabel("context (keys the step attends)")
        ax.set_ylim(0, max(bottom) * 1.12 if bottom else 1)
        mode = str(g["mode"].iloc[0]) if len(g) else "?"
        ax.set_title(f"{m} ({'graph replay' if mode.startswith('graph') else 'eager step'})", fontsize=9)
    axes[0][0].set_ylabel("time per decode step (µs)")
    fig.suptitle(f"Where a decode step's time goes, {card}, run {run.run_id}\nkernels traced with CUPTI; gaps: the "
                 f"step's time minus its kernels'", fontsize=9)
    parts = [p for p, _ in PARTS if p in used]
    fig.legend([Patch(color=PART_COLORS[p]) for p in parts], parts, loc="outside lower center",
               ncol=min(6, len(parts)), fontsize=7, frameon=False)
    return fig


def decomp_section(root=None) -> dict:
    """The page's decode-step section: ``run`` (None: not recorded), ``message`` (the run, card and commit and any
    skipped point, or that nothing is recorded and the command that records it), ``groups`` (:func:`decomp_groups`),
    ``classes`` (:func:`decomp_classes`), ``prediction`` (:func:`decomp_prediction_table`: shown either way) and
    ``figure`` (None without a run)."""
    run = decomp_run(root)
    pred = decomp_prediction_table(run)
    if run is None:
        return {"run": None, "groups": None, "classes": None, "figure": None, "prediction": pred,
                "message": f"*Not recorded yet:* no decode-step decomposition under `data/09_decode/`. "
                           f"`{DECOMP_CMD}` on a GPU machine records one (then `{IMPORT_CMD}` here); the prediction "
                           f"below was written before any run."}
    groups = decomp_groups(run)
    sk = groups[groups.status != "measured"]
    note = (" Skipped: " + "; ".join(f"{r.model} at context {r.context} ({r.why})" for r in sk.itertuples()) + "."
            if len(sk) else "")
    return {"run": run, "groups": groups[groups.status == "measured"].reset_index(drop=True),
            "classes": decomp_classes(run), "prediction": pred,
            "figure": figure_decomp(run) if run.has("decode_decomp") else None,
            "message": f"{run_line(run)}.{note}"}
