"""Counter analysis of round 6 (pure pandas/numpy, tested on CPU): counts normalized per GMAC
(:func:`per_gmac`), the IMMA consistency check (:func:`imma_check`: IMMA instructions = MACs / (16*8*K) for
mma.m16n8kK, ops per MAC identical on every kernel), the seeds' linear law of duration against warp instructions
(:func:`fit_linear`, :func:`fit_table`), the A/B noise band (:func:`ab_summary`) and the counter-evidence
:func:`verdict`; the concept view of a raw ncu table (:func:`concept_view`, names from :mod:`labkernels.ncu`).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from ...ncu import CONCEPTS, concept_columns


def _is_extensive(col: str) -> bool:
    if col in CONCEPTS:
        return CONCEPTS[col].extensive
    if col.startswith("stall_"):
        return False
    return bool(re.search(r"\.sum$", col))


def _align(df: pd.DataFrame, values, what: str) -> np.ndarray:
    """values per row of df: a column name, a scalar, a sequence in row order, or a mapping keyed by the
    ``case`` column, the ``ID`` column or the index."""
    n = len(df)
    if isinstance(values, str):
        if values not in df.columns:
            raise KeyError(f"{what}: no column {values!r}")
        arr = df[values].to_numpy(dtype=float)
    elif isinstance(values, dict) or isinstance(values, pd.Series) and not values.index.equals(df.index):
        m = dict(values)
        for key in ("case", "ID"):
            if key in df.columns and all(k in m for k in df[key]):
                arr = np.array([m[k] for k in df[key]], dtype=float)
                break
        else:
            if all(k in m for k in df.index):
                arr = np.array([m[k] for k in df.index], dtype=float)
            else:
                raise KeyError(f"{what}: mapping keys {sorted(m)[:5]} match neither the case, ID nor index of the rows")
    elif np.ndim(values) == 0:
        arr = np.full(n, float(values))
    else:
        arr = np.asarray(values, dtype=float)
    if arr.shape != (n,):
        raise ValueError(f"{what}: {arr.shape[0] if arr.ndim else 1} values for {n} rows")
    return arr


def per_gmac(df: pd.DataFrame, macs_by_launch, extensive=None) -> pd.DataFrame:
    """Every count divided by the launch's GMAC (MACs / 1e9): the hardware resources a kernel spends per
    unit of math, independent of problem size (seeds 001 section 2). Counts are the ``.sum`` metrics and
    the extensive :data:`CONCEPTS` (``duration`` becomes ns/GMAC); rates, percentages, ratios and text
    columns are copied unchanged. ``macs_by_launch``: a column name, a sequence in row order, a scalar, or
    a mapping keyed by case / ID / index. Adds ``macs`` and ``gmac`` columns."""
    macs = _align(df, macs_by_launch, "macs_by_launch")
    if not np.all(np.isfinite(macs)) or np.any(macs <= 0):
        raise ValueError(f"MACs must be positive, got {macs}")
    gmac = macs / 1e9
    ext = set(extensive) if extensive is not None else None
    out = {}
    for c in df.columns:
        col = df[c]
        is_ext = (c in ext) if ext is not None else _is_extensive(c)
        if is_ext and pd.api.types.is_numeric_dtype(col):
            out[c] = col.to_numpy(dtype=float) / gmac
        else:
            out[c] = col.to_numpy()
    res = pd.DataFrame(out, index=df.index)
    res["macs"] = macs
    res["gmac"] = gmac
    res.attrs.update(df.attrs)
    return res


def mma_macs(k: int) -> int:
    """MACs of one warp-level mma.sync.m16n8kK: 16 x 8 x K."""
    if k not in (8, 16, 32, 64):
        raise ValueError(f"unexpected mma K={k}")
    return 16 * 8 * k


def imma_check(df: pd.DataFrame, macs, mma_k=16, ops_per_mac_expected: float = 2.0,
               rtol: float = 1e-6) -> pd.DataFrame:
    """The seeds' consistency test, before anything is compared: do the kernels do exactly the GEMM's
    tensor work?

    For each launch (row), with ``macs`` the MACs the tensor cores must do (the padded tiles' MACs) and
    ``mma_k`` the K of its mma.sync.m16n8kK:

    * ``imma_inst_expected`` = MACs / (16*8*K); ``inst_exact``: the IMMA instruction count equals it
      exactly (``inst_ratio`` = measured / expected, e.g. 2.0 if the hardware split each mma in two);
    * ``ops_per_mac`` = IMMA ops / MACs; ``ops_expected``: it equals ``ops_per_mac_expected`` (the seeds
      read "IMMA = 2 x MAC" on both sides); ``ops_identical``: it is the same on every launch checked
      (the tensor work per MAC is structural, so two kernels that differ here are not doing the same
      GEMM);
    * ``ok``: all the checks whose counters exist pass (a launch with neither IMMA counter is not ok).

    ``df`` holds concept columns ``imma_inst`` and/or ``imma_ops`` (or the raw metric names, mapped by
    :data:`CONCEPTS`); ``macs`` / ``mma_k``: column name, scalar, sequence or mapping (see :func:`per_gmac`)."""
    d = _concept_view_auto(df)
    m = _align(d, macs, "macs")
    k = _align(d, mma_k, "mma_k").astype(int)
    out = pd.DataFrame(index=d.index)
    for c in ("case", "variant", "shape", "Kernel Name"):
        if c in d.columns:
            out[c] = d[c]
    out["macs"] = m
    out["mma_k"] = k
    has_inst, has_ops = "imma_inst" in d.columns, "imma_ops" in d.columns
    ok = np.ones(len(d), dtype=bool)
    if has_inst:
        exp = m / np.array([mma_macs(int(x)) for x in k], dtype=float)
        got = d["imma_inst"].to_numpy(dtype=float)
        out["imma_inst"] = got
        out["imma_inst_expected"] = exp
        out["inst_ratio"] = got / exp
        out["inst_exact"] = np.abs(got - exp) < 0.5
        ok &= out["inst_exact"].to_numpy()
    if has_ops:
        got = d["imma_ops"].to_numpy(dtype=float)
        per = got / m
        out["imma_ops"] = got
        out["ops_per_mac"] = per
        out["ops_per_mac_expected"] = float(ops_per_mac_expected)
        out["ops_expected"] = np.isclose(per, ops_per_mac_expected, rtol=rtol, atol=0)
        finite = per[np.isfinite(per)]
        same = bool(finite.size == per.size and (finite.size == 0 or np.allclose(finite, finite[0], rtol=rtol, atol=0)))
        out["ops_identical"] = same
        ok &= out["ops_expected"].to_numpy() & same
    if not (has_inst or has_ops):
        ok &= False
    out["ok"] = ok
    return out


def imma_ok(check: pd.DataFrame) -> bool:
    return bool(len(check)) and bool(check["ok"].all())


def fit_linear(x, y) -> tuple[float, float, float]:
    """Least-squares line y = slope * x + intercept over the finite pairs; returns (slope, intercept, r2).
    r2 is NaN when y does not vary. Needs two distinct x values."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"x and y differ in shape: {x.shape} vs {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("a line needs at least two points with different x")
    xm, ym = x.mean(), y.mean()
    slope = float(np.sum((x - xm) * (y - ym)) / np.sum((x - xm) ** 2))
    intercept = float(ym - slope * xm)
    ss_res = float(np.sum((y - (slope * x + intercept)) ** 2))
    ss_tot = float(np.sum((y - ym) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan
    return slope, intercept, r2


VERDICTS = ("hypothesis out", "supported", "inconclusive")


def verdict(base_duration, variant_duration, noise) -> str:
    """The counter-evidence rule.

    The variant removes one hypothesized cost from the base (a template/preprocessor switch, parity-clean).
    With d = variant / base - 1 (medians when sequences are given) and ``noise`` the measured relative
    noise band (e.g. the base-vs-base ratio spread of interleaved timings, 0.02 = 2 %):

    * ``|d| <= noise``  -> ``'hypothesis out'``: removing the cost did not move duration beyond the noise,
      so that cost does not carry the time;
    * ``d < -noise``    -> ``'supported'``: the variant is faster by more than the noise;
    * ``d > +noise``    -> ``'inconclusive'``: the variant is slower -- it removed the cost but added
      another, so the experiment cannot speak for or against the hypothesis (look at its instruction
      count: the linear law may explain the loss);
    * missing / non-positive durations or an unknown (NaN / negative) noise -> ``'inconclusive'``."""
    try:
        b = float(np.median(np.asarray(base_duration, dtype=float)))
        v = float(np.median(np.asarray(variant_duration, dtype=float)))
        n = float(noise)
    except (TypeError, ValueError):
        return "inconclusive"
    if not (math.isfinite(b) and math.isfinite(v) and math.isfinite(n)) or b <= 0 or v <= 0 or n < 0:
        return "inconclusive"
    d = v / b - 1.0
    if abs(d) <= n:
        return "hypothesis out"
    return "supported" if d < 0 else "inconclusive"


def concept_view(df: pd.DataFrame, chosen: dict) -> pd.DataFrame:
    """Rename metric columns to their concept names (stall metrics -> ``stall_<reason>``)."""
    cols = concept_columns(chosen)
    out = df.rename(columns={m: c for m, c in cols.items() if m in df.columns})
    out.attrs.update(df.attrs)
    return out


def _concept_view_auto(df: pd.DataFrame) -> pd.DataFrame:
    """Map raw IMMA metric columns to concept names when the frame is not a concept view yet."""
    ren = {}
    for concept in ("imma_inst", "imma_ops"):
        if concept in df.columns:
            continue
        for m in CONCEPTS[concept].candidates:
            if m in df.columns:
                ren[m] = concept
                break
    return df.rename(columns=ren) if ren else df


def ab_summary(ab: dict, noise_floor: float = 0.005) -> dict:
    """Median ratio variant/base over rounds, and the noise band: the largest |base'/base - 1| of any
    round (the same kernel timed against itself), floored at ``noise_floor``."""
    rounds = ab["rounds"]
    ratios = np.array([r["ratio"] for r in rounds], dtype=float)
    self_dev = np.array([abs(r["self_ratio"] - 1.0) for r in rounds], dtype=float)
    base = np.array([r["base_us"] for r in rounds] + [r["base_again_us"] for r in rounds], dtype=float)
    var = np.array([r["variant_us"] for r in rounds], dtype=float)
    return {"base_us": float(np.median(base)), "variant_us": float(np.median(var)),
            "delta": float(np.median(ratios) - 1.0), "ratio_min": float(ratios.min()),
            "ratio_max": float(ratios.max()), "noise": max(float(self_dev.max()), noise_floor),
            "noise_measured": float(self_dev.max()), "rounds": len(rounds)}


def fit_table(cv: pd.DataFrame) -> list[dict]:
    """Duration vs warp instructions: over all cases (raw counts), per shape, and per GMAC."""
    rows = []

    def add(name, x, y, n):
        try:
            slope, icpt, r2 = fit_linear(x, y)
        except ValueError as e:
            rows.append({"fit": name, "n": n, "error": str(e)})
            return
        rows.append({"fit": name, "n": n, "x": "warp_inst", "y": "duration_ns", "slope_ns_per_inst": slope,
                     "intercept_ns": icpt, "r2": r2,
                     "inst_per_ns": 1.0 / slope if slope > 0 else math.nan})

    add("all_cases", cv["warp_inst"], cv["duration"], len(cv))
    for shape, g in cv.groupby("shape"):
        add(f"shape_{shape}", g["warp_inst"], g["duration"], len(g))
    gm = cv["gmac"].to_numpy(dtype=float)
    add("per_gmac", cv["warp_inst"].to_numpy(dtype=float) / gm, cv["duration"].to_numpy(dtype=float) / gm, len(cv))
    return rows


def pair_table(pg: pd.DataFrame, pairs) -> list[dict]:
    """Per-GMAC ratios other/base for the structural ``pairs`` (name, base, other, what) at each shape."""
    rows = []
    num = [c for c in pg.columns if _is_extensive(c) and pd.api.types.is_numeric_dtype(pg[c])
           and c not in ("macs", "gmac", "macs_padded")]
    for name, a, b, what in pairs:
        for shape in sorted(set(pg["shape"])):
            ra = pg[(pg.variant == a) & (pg["shape"] == shape)]
            rb = pg[(pg.variant == b) & (pg["shape"] == shape)]
            if ra.empty or rb.empty:
                continue
            row = {"pair": name, "shape": shape, "base": a, "other": b, "what": what}
            for c in num:
                va, vb = float(ra[c].iloc[0]), float(rb[c].iloc[0])
                row[f"{c}_ratio"] = vb / va if va else math.nan
            rows.append(row)
    return rows

