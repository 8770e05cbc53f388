"""Tables the round notebooks show, computed from recorded benchmark rows (pure pandas, tested on CPU)."""

from __future__ import annotations

import numpy as np
import pandas as pd

SHAPE = ["od", "id", "nt"]


def summarize(df: pd.DataFrame, by=("od", "id", "nt", "variant")) -> pd.DataFrame:
    """Median over interleaved rounds of each variant's median time, with the p20/p80 band across all
    rounds, us/GMAC and TOPS-equivalent, and the noise floor (max/min of the per-round medians)."""
    g = df.groupby(list(by))
    out = g.agg(median_us=("median_us", "median"), p20_us=("p20_us", "min"), p80_us=("p80_us", "max"),
                rounds=("median_us", "size"), spread=("median_us", lambda s: s.max() / s.min()),
                gmac=("gmac", "first")).reset_index()
    out["us_per_gmac"] = out.median_us / out.gmac
    out["tops_eq"] = 2 * out.gmac * 1e9 / (out.median_us * 1e-6) / 1e12
    return out


def pair_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per matched shape and comparison: per-round ratios, how many rounds favour b, the median ratio."""
    rows = []
    for (a, b, od, id_, nt), g in pairs.groupby(["a", "b", "od", "id", "nt"]):
        r = g.sort_values("pair").ratio.to_numpy()
        rows.append({"a": a, "b": b, "od": od, "id": id_, "nt": nt, "median_ratio": float(np.median(r)),
                     "min_ratio": float(r.min()), "max_ratio": float(r.max()),
                     "pairs_b_faster": f"{int((r > 1).sum())}/{len(r)}",
                     "ratios": ", ".join(f"{x:.3f}" for x in r)})
    return pd.DataFrame(rows)


def best_per_kernel(sweep: pd.DataFrame, nt: int | None = None) -> pd.DataFrame:
    """For each (qtype, shape, kernel) of a sweep: TOPS at nt (or the best over nt), with resources."""
    s = sweep if nt is None else sweep[sweep.nt == nt]
    idx = s.groupby(["qtype", "od", "id", "kernel"]).tops_eq.idxmax()
    cols = ["qtype", "od", "id", "kernel", "kdr", "nt", "tops_eq", "us_per_gmac", "p20_us", "p80_us", "regs",
            "local_bytes", "dynamic_smem", "api_blocks_per_sm", "calc_blocks_per_sm", "calc_limiter"]
    cols = [c for c in cols if c in s.columns]
    return s.loc[idx, cols].sort_values(["qtype", "od", "id", "tops_eq"], ascending=[True, True, True, False])


def ratio_to_best(sweep: pd.DataFrame) -> pd.DataFrame:
    """Each sweep point's time relative to the best point of the same (qtype, shape, nt): 1.0 = best."""
    s = sweep.copy()
    best = s.groupby(["qtype", "od", "id", "nt"]).median_us.transform("min")
    s["x_best"] = s.median_us / best
    return s
