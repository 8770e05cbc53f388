"""Round 7's build A/Bs: the launches of record against ablation and exploratory builds of themselves
(:func:`builds_ab`) -- the weights' share of the loop (ceiling), the launch floor, the SM clock, the k scan -- and
their tables and views."""

from __future__ import annotations


import numpy as np

from ... import bench as B
from ... import blas, cases, gpu, wgmma
from ...wgmma import WgWeight, emulate_weights, gate, main_scl, reduce_fits, sk_fits, variant_name
from . import builds as wb
from .benchmark import SHAPES
from .tables import medians, suffix_ab


def _plan_points(p: dict, rng):
    """The points of an A/B plan ``p`` (its qtypes x shapes x nts), in order: yields (qtype, od, id_, nt, pt), ``pt``
    a namespace of the point's synthetic weight (``raw``, ``w`` repacked, ``wq`` the GGUF upload, ``w16`` cuBLAS's
    fp16 copy, ``w64`` gguf-py's float64 dequantization, ``w16e`` the kernel's exact weights) and its fresh inputs
    (``x``, ``xg``, ``x16``, ``y``, ``tok``: :func:`labkernels.cases.point_inputs`)."""
    from types import SimpleNamespace

    import gguf

    cp = wgmma._cp()
    for qtype in p["qtypes"]:
        for od, id_ in (tuple(s) for s in p["shapes"]):
            raw = cases.synthetic_weights(qtype, od, id_, rng)
            w = WgWeight.from_gguf(raw, qtype)
            wq = gpu.QWeight.upload(raw, qtype)
            wts = dict(raw=raw, w=w, wq=wq, w16=gpu.dequant_f16(wq),
                       w64=gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype.upper()]),
                       w16e=emulate_weights(cp.asnumpy(w.packed), qtype, od, id_))
            for nt in p["nts"]:
                x, xg, x16, y, tok = cases.point_inputs(rng, nt, od, id_)
                yield qtype, od, id_, nt, SimpleNamespace(**wts, x=x, xg=xg, x16=x16, y=y, tok=tok)


def _plan_launches(p: dict, qtype: str, nt: int, od: int, id_: int, sm: int):
    """The plan's register-form launches (BN, scheduler[, EPI]; the main scale form) that the grid takes at a point:
    (variant name, :func:`gemm` parameters). Left out: a split grid that does not fit, BN=256 data-parallel at
    nt <= 512 (one tile per two SMs: not a launch of record), EPI=5 on a grid with more than two CTAs a tile."""
    for bn, sk, epi in ((tuple(v) + (0,))[:3] for v in p["launches"]):
        if sk in (2, 3) and not sk_fits(sk, nt, od, id_, bn, sm):
            continue
        if sk == 0 and bn == 256 and nt <= 512:
            continue
        if epi == 5 and not reduce_fits(sk, nt, od, id_, bn, sm):
            continue
        prm = dict(BN=bn, SCL=main_scl(qtype, bn), SK=sk, EPI=epi)
        yield variant_name(bn, 4, prm["SCL"], sk, 0, epi), prm


def _gate_point(run, table: str, qtype: str, od: int, id_: int, nt: int, name: str, pt, extra: dict | None = None):
    """:func:`gate` of the launch's Y now in ``pt.y`` against the point's references; the row (with ``extra``) into
    ``run`` table ``table``; a failed gate raises."""
    cp = wgmma._cp()
    g = gate(cp.asnumpy(pt.y), pt.raw, qtype, pt.x, tokens=pt.tok, w64=pt.w64, w16=pt.w16e)
    if run is not None:
        run.append(table, {"qtype": qtype, "od": od, "id": id_, "nt": nt, "variant": name, **(extra or {}), **g})
    if not g["ok"]:
        raise AssertionError(f"{name} parity failed: {qtype} nt={nt} od={od} id={id_}: {g}")


def builds_ab(run, p: dict, builds: dict, name: str, rng, bitwise: bool, progress=print,
              extra: dict | None = None, per_point=None) -> list[dict]:
    """Builds of the register form against the plain one, on the plan ``p``'s launches (BN, scheduler[, EPI]; the
    main scale form) at its (qtype, shape, nt) points, same process, interleaved with cuBLAS fp16 on cached
    dequantized weights, L2 flushed. ``builds``: variant suffix -> build defines. Every plain launch is gated first
    at its point (NaN-poisoned output, :func:`gate`; a failure raises). ``bitwise``: each build's Y must be bitwise
    the plain build's (twice; else it raises) -- otherwise the builds are ablations, timed only (their Y means
    nothing). A launch whose grid does not take the scheduler or the epilogue at a point is left out there
    (:func:`_plan_launches`). ``extra``: name -> callable, timed beside them at every point (e.g.
    :class:`labkernels.bench.EmptyLaunch`); ``per_point``: a function of the point's namespace (see
    :func:`_plan_points`) giving more such name -> callable, made at each point (e.g. another cuBLAS call on its
    operands).
    Rows: ``wgmma_<name>_ab`` (a build's variant named ``<variant><suffix>``) and ``wgmma_<name>_gate``."""
    cp = wgmma._cp()
    flush = B.Flusher()
    sm = wgmma._sm_count(cp.cuda.Device().id)
    rows = []
    for qtype, od, id_, nt, pt in _plan_points(p, rng):
        w, x16, y = pt.w, pt.x16, pt.y
        y_b = cp.empty_like(y)
        vs = {}
        for vname, prm in _plan_launches(p, qtype, nt, od, id_, sm):
            same = {}
            for _ in range(2 if bitwise else 1):   # bitwise: both builds launched twice, each pair compared
                y.fill(np.nan)
                wb.gemm(w, x16, out=y, **prm)
                for sfx, d in builds.items():
                    y_b.fill(np.nan)
                    wb.gemm(w, x16, out=y_b, defines=d, **prm)
                    if bitwise:
                        same[sfx] = bool(cp.array_equal(y.view(cp.uint32), y_b.view(cp.uint32)))
                        if not same[sfx]:
                            raise AssertionError(f"{vname}{sfx} differs from the plain build at {qtype} "
                                                 f"{od}x{id_} nt={nt}")
            _gate_point(run, f"wgmma_{name}_gate", qtype, od, id_, nt, vname, pt,
                        {f"bitwise_vs{k}": v for k, v in same.items()})
            vs[vname] = lambda prm=prm: wb.gemm(w, x16, out=y, **prm)
            for sfx, d in builds.items():
                vs[vname + sfx] = lambda prm=prm, d=d: wb.gemm(w, x16, out=y_b, defines=d, **prm)
        vs.update(extra or {})
        vs.update(per_point(pt) if per_point is not None else {})
        rows += _time_with_cublas(run, name, vs, (qtype, od, id_, nt), pt, p, flush, progress)
    return rows


def conv16_table(ab_df):
    """The 16-bit scale path's A/B as one row per (point, launch): new / old speed (median(old) / median(new) over
    the interleaved pairs: > 1, the new conversion is faster) and each build's ratio to cuBLAS fp16 (cached)."""
    t = suffix_ab(ab_df, suffixes=("_oldconv",))
    if t.empty:
        return t
    return (t.assign(new_over_old=1 / t.speedup, new_vs_cublas=t.base_vs_cublas, old_vs_cublas=t.option_vs_cublas)
            [["qtype", "od", "id", "nt", "launch", "base", "new_over_old", "new_vs_cublas", "old_vs_cublas"]]
            .rename(columns={"base": "variant"}).sort_values(["qtype", "od", "id", "nt", "launch"])
            .reset_index(drop=True))


#: the weights' share of the loop (``gpu check --steps wgmma_ceiling``): the plain launches of record against two
#: ablation builds of themselves, timed only -- LK_ABLATE_NOLOAD (the conversion of the same registers at every
#: super-block, no weight loads in the loop) and LK_ABLATE_NOCONV (no conversion; ptxas then drops the loads as
#: dead): the skeleton's ceiling (TMA ring, wgmma, scheduler, finish) and what the loads and the conversion cost
CEILING_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
              "launches": [[128, 0], [256, 1], [256, 3], [256, 0]], "pairs": 3, "repeats": 10}
CEILING_BUILDS = {"_noload": ("LK_ABLATE_NOLOAD",), "_noconv": ("LK_ABLATE_NOCONV",)}


def ceiling_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """:func:`builds_ab` of the plain launches against their NOLOAD and NOCONV ablation builds (timing only; each
    plain launch parity-gated at its point). Rows: ``wgmma_ceiling_ab``, ``wgmma_ceiling_gate``."""
    p = {**CEILING_AB, **(plan or {})}
    return builds_ab(run, p, CEILING_BUILDS, "ceiling", np.random.default_rng(seed or None), bitwise=False,
                     progress=progress)


#: the launch floor (``gpu check --steps wgmma_floor``): the launches of record at nt=512 -- (BN, scheduler, EPI) --
#: against an empty build of themselves (LK_ABLATE_EMPTY: the same grid, threads, dynamic shared memory and
#: parameters; every CTA returns at once), timed only, beside cuBLAS and a 1-CTA empty kernel (the events' own floor)
FLOOR_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512], "qtypes": ["q4_K", "q6_K"],
            "launches": [[256, 3, 5], [256, 1, 5], [128, 1, 0], [128, 0, 0]], "pairs": 3, "repeats": 10}
FLOOR_BUILDS = {"_empty": ("LK_ABLATE_EMPTY",)}
EMPTY_1CTA = "empty_kernel_1cta"


def floor_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """:func:`builds_ab` of the launches of record against their empty builds (timing only; each plain launch
    parity-gated at its point), with a 1-CTA empty kernel timed beside them (:data:`EMPTY_1CTA`). Rows:
    ``wgmma_floor_ab`` (``<variant>_empty``), ``wgmma_floor_gate``."""
    p = {**FLOOR_AB, **(plan or {})}
    return builds_ab(run, p, FLOOR_BUILDS, "floor", np.random.default_rng(seed or None), bitwise=False,
                     progress=progress, extra={EMPTY_1CTA: B.EmptyLaunch(1, 32)})


def floor_view(ab_df, spans=None):
    """The launch floor per (point, launch of record): the plain launch's median time, its empty build's (the same
    launch doing nothing), what the launch spends above that floor, cuBLAS fp16 (cached) and the 1-CTA empty
    kernel, all medians over the interleaved rounds of each one's medians; ``ratio`` = cuBLAS / plain. ``spans``: a
    trace's per-launch stamp spans (columns qtype, od, id, nt, variant, span_us, e.g. :func:`trace_spans`) to add
    ``outside_us`` = plain - span (the time outside the CTAs' stamps) and ``drain_us`` = outside - empty (what of it
    the floor does not explain: after the last stamp, the stores and reduce-adds draining and the exit)."""
    import pandas as pd

    med = ab_df.groupby(["qtype", "od", "id", "nt", "variant"], as_index=False).median_us.median()
    rows = []
    for (q, od, id_, nt), g in med.groupby(["qtype", "od", "id", "nt"], sort=False):
        us = dict(zip(g.variant, g.median_us))
        for v in [v for v in g.variant if v.startswith("wgmma_bn") and not v.endswith("_empty")]:
            e = us.get(v + "_empty")
            if e is None:
                continue
            rows.append({"qtype": q, "od": od, "id": id_, "nt": nt, "variant": v, "plain_us": us[v], "empty_us": e,
                         "above_floor_us": us[v] - e, "cublas_us": us.get("cublas_f16_cached", np.nan),
                         "empty_1cta_us": us.get(EMPTY_1CTA, np.nan)})
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    t["ratio"] = t.cublas_us / t.plain_us
    if spans is not None and len(spans):
        t = t.merge(spans[["qtype", "od", "id", "nt", "variant", "span_us"]], how="left",
                    on=["qtype", "od", "id", "nt", "variant"])
        t["outside_us"] = t.plain_us - t.span_us
        t["drain_us"] = t.outside_us - t.empty_us
    return t


#: the SM clock during the launches of record and cuBLAS at nt=512 (``gpu check --steps wgmma_clock``):
#: :class:`labkernels.bench.ClockProbe` beside every launch, after the flush, interleaved round by round
CLOCK_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512], "qtypes": ["q4_K", "q6_K"],
            "launches": [[256, 3, 5], [256, 1, 5], [128, 0, 0]], "pairs": 3, "repeats": 10, "window_us": 12.0}


def clock_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """The SM clock (MHz) over a 12 us window inside each launch: the launches of record that the grid takes at
    each point (each parity-gated first), cuBLAS fp16 (cached) and the probe alone, round by round after the L2
    flush, with each one's CUDA-event time in the same round. Rows: ``wgmma_clock`` (variant, round, mhz_median,
    mhz_mean, median_us) and ``wgmma_clock_gate``."""
    p = {**CLOCK_AB, **(plan or {})}
    cp = wgmma._cp()
    flush = B.Flusher()
    probe = B.ClockProbe(p["window_us"])
    sm = wgmma._sm_count(cp.cuda.Device().id)
    rows = []
    for qtype, od, id_, nt, pt in _plan_points(p, np.random.default_rng(seed or None)):
        vs = {}
        for name, prm in _plan_launches(p, qtype, nt, od, id_, sm):
            pt.y.fill(np.nan)
            wb.gemm(pt.w, pt.x16, out=pt.y, **prm)
            _gate_point(run, "wgmma_clock_gate", qtype, od, id_, nt, name, pt)
            vs[name] = lambda prm=prm: wb.gemm(pt.w, pt.x16, out=pt.y, **prm)
        y16 = cp.empty((nt, od), cp.float16)
        vs["cublas_f16_cached"] = lambda: blas.matmul_f16(pt.x16, pt.w16, out=y16)
        vs["probe_alone"] = None
        new = []
        for rnd in range(p["pairs"]):
            for name, fn in vs.items():
                mhz = probe.mhz(fn, flush, repeats=p["repeats"])
                us = (float(np.median(B.time_launches(fn, 2, p["repeats"], flush))) if fn is not None
                      else float("nan"))
                new.append({"qtype": qtype, "od": od, "id": id_, "nt": nt, "variant": name, "round": rnd,
                            "mhz_median": float(np.median(mhz)), "mhz_mean": float(np.mean(mhz)),
                            "median_us": us, "window_us": p["window_us"]})
        rows += new
        if run is not None:
            run.append("wgmma_clock", new)
        med = {}
        for r in new:
            med.setdefault(r["variant"], []).append(r["mhz_median"])
        progress(f"clock {qtype} {od}x{id_} nt={nt}: " + ", ".join(f"{k} {np.median(v):.0f} MHz"
                                                                   for k, v in med.items()))
    return rows


def clock_view(clock_df):
    """Per point and launch: the median over rounds of the SM clock during it (MHz) and of its time, the clock
    against cuBLAS's at the same point, and its time in cycles at that clock (us x MHz: what it would take at
    any one clock)."""
    import pandas as pd

    m = clock_df.groupby(["qtype", "od", "id", "nt", "variant"], as_index=False, sort=False).agg(
        mhz=("mhz_median", "median"), us=("median_us", "median"))
    rows = []
    for _, g in m.groupby(["qtype", "od", "id", "nt"], sort=False):
        cb = g[g.variant == "cublas_f16_cached"].iloc[0]
        idle = g[g.variant == "probe_alone"]
        for _, r in g[g.variant != "probe_alone"].iterrows():
            rows.append({**r.to_dict(), "idle_mhz": float(idle.mhz.iloc[0]) if len(idle) else np.nan,
                         "mhz_vs_cublas": r.mhz / cb.mhz, "kcycles": r.us * r.mhz / 1e3,
                         "ratio": cb.us / r.us, "ratio_in_cycles": (cb.us * cb.mhz) / (r.us * r.mhz)})
    return pd.DataFrame(rows)


#: the k scan (``gpu check --steps wgmma_kscan``): the launches of record at nt=512 and od=4096 over id, cuBLAS fp16
#: (cached) beside them at every point and alone at small k (``cublas_small_ids``), so that time = intercept +
#: slope x id splits each one's fixed cost per launch from its main loop's cost per k
KSCAN_AB = {"shapes": [[4096, k] for k in (512, 1024, 2048, 4096, 8192, 14336)], "nts": [512],
            "qtypes": ["q4_K", "q6_K"], "launches": [[256, 3, 5], [256, 1, 5], [128, 1, 0], [128, 0, 0]],
            "pairs": 3, "repeats": 10, "cublas_small_ids": [16, 64, 256]}
CUBLAS = "cublas_f16_cached"
CUBLAS_F32OUT = "cublas_f16_f32out"   # cuBLAS fp16 operands with float32 output (cublasGemmEx): the kernel's output


def kscan_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """:func:`builds_ab` with no other build over the plan's ids (each launch of record parity-gated at its point,
    timed interleaved with cuBLAS fp16 and the 1-CTA empty kernel, L2 flushed), then cuBLAS alone (with the empty
    kernel) at each ``cublas_small_ids`` k, where its time is nearly all fixed cost. Both times cuBLAS also with
    float32 output (:data:`CUBLAS_F32OUT`, :func:`labkernels.blas.gemm_dense`): the kernel writes float32, cuBLAS's
    baseline of record float16, half the bytes. Rows: ``wgmma_kscan_ab``, ``wgmma_kscan_gate``."""
    p = {**KSCAN_AB, **(plan or {})}
    cp = wgmma._cp()
    rng = np.random.default_rng(seed or None)
    empty = B.EmptyLaunch(1, 32)

    def f32out(pt):
        y32 = cp.empty(pt.y.shape, cp.float32)
        return {CUBLAS_F32OUT: lambda: blas.gemm_dense(pt.x16, pt.w16, out=y32)}

    rows = builds_ab(run, p, {}, "kscan", rng, bitwise=False, progress=progress, extra={EMPTY_1CTA: empty},
                     per_point=f32out)
    flush = B.Flusher()
    for nt in p["nts"]:
        for od in sorted({int(s[0]) for s in p["shapes"]}):
            for k in p["cublas_small_ids"]:
                x16 = cp.asarray(rng.standard_normal((nt, k)).astype(np.float16))
                w16 = cp.asarray(rng.standard_normal((od, k)).astype(np.float16))
                y16, y32 = cp.empty((nt, od), cp.float16), cp.empty((nt, od), cp.float32)
                res = B.interleaved({CUBLAS: lambda x16=x16, w16=w16, y16=y16: blas.matmul_f16(x16, w16, out=y16),
                                     CUBLAS_F32OUT: lambda x16=x16, w16=w16, y32=y32: blas.gemm_dense(x16, w16, out=y32),
                                     EMPTY_1CTA: empty}, pairs=p["pairs"], repeats=p["repeats"], flush=flush)
                new = B.pair_rows(res, {"qtype": "f16", "od": od, "id": k, "nt": nt}, nt, od, k)
                rows += new
                if run is not None:
                    run.append("wgmma_kscan_ab", new)
                progress(f"kscan cuBLAS alone {od}x{k} nt={nt}: "
                         f"{np.median([s['median_us'] for s in res[CUBLAS]]):.1f} us (fp16 out), "
                         f"{np.median([s['median_us'] for s in res[CUBLAS_F32OUT]]):.1f} us (fp32 out)")
    return rows


def kscan_fit(ab_df):
    """Per (qtype, od, nt, launch): time = intercept + slope x id, least squares over the point medians (the median
    over the interleaved rounds of each one's median) at the ids where the k-quant launches ran; cuBLAS fitted per
    qtype on the same points. Also the fastest launch per point fitted as one line (``best``), cuBLAS alone at its
    smallest k (``cublas_min_k_us``, ``cublas_min_k``; with float32 output ``cublas_f32out_min_k_us``) and the
    1-CTA empty kernel (``empty_1cta_us``). Columns:
    qtype, od, nt, variant, n_ids, intercept_us, ns_per_k, max_resid_us, plus the per-qtype context columns."""
    import pandas as pd

    med = medians(ab_df)
    small = med[(med.qtype == "f16") & (med.variant == CUBLAS)]
    small32 = med[(med.qtype == "f16") & (med.variant == CUBLAS_F32OUT)]
    empty = med[med.variant == EMPTY_1CTA].median_us
    rows = []

    def fit(g, q, od, nt, v):
        g = g.sort_values("id")
        if len(g) < 2:
            return
        x, y = g["id"].to_numpy(float), g.median_us.to_numpy(float)
        slope, icpt = np.polyfit(x, y, 1)
        rows.append({"qtype": q, "od": od, "nt": nt, "variant": v, "n_ids": len(g), "intercept_us": icpt,
                     "ns_per_k": slope * 1e3, "max_resid_us": float(np.abs(y - (icpt + slope * x)).max())})

    for (q, od, nt), g in med[med.qtype != "f16"].groupby(["qtype", "od", "nt"], sort=False):
        for v, gv in g[g.variant != EMPTY_1CTA].groupby("variant", sort=False):
            fit(gv, q, od, nt, v)
        k = g[g.variant.str.startswith("wgmma_")]
        fit(k.loc[k.groupby("id").median_us.idxmin()], q, od, nt, "best")
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    sm = small.sort_values("id")
    t["cublas_min_k"] = int(sm.id.iloc[0]) if len(sm) else np.nan
    t["cublas_min_k_us"] = float(sm.median_us.iloc[0]) if len(sm) else np.nan
    s32 = small32.sort_values("id")
    t["cublas_f32out_min_k_us"] = float(s32.median_us.iloc[0]) if len(s32) else np.nan
    t["empty_1cta_us"] = float(empty.median()) if len(empty) else np.nan
    return t


def kscan_points(ab_df):
    """The k scan's point medians (qtype, od, id, nt, variant, median_us) and, per k-quant point, the fastest
    launch's ratio to cuBLAS at the same point (``ratio``: cuBLAS / launch, on the rows of the fastest launch)."""
    med = medians(ab_df)[["qtype", "od", "id", "nt", "variant", "median_us"]]
    med["ratio"] = np.nan
    for _, g in med[med.qtype != "f16"].groupby(["qtype", "od", "id", "nt"]):
        k = g[g.variant.str.startswith("wgmma_")]
        cb = g[g.variant == CUBLAS]
        if len(k) and len(cb):
            i = k.median_us.idxmin()
            med.loc[i, "ratio"] = float(cb.median_us.iloc[0]) / med.loc[i, "median_us"]
    return med


def kscan_compare(fit, points, ids=(4096, 14336)):
    """Per qtype of a k scan (:func:`kscan_fit`, :func:`kscan_points`): the fixed cost (intercept, us) and the cost
    per k (slope, relative) of the BN=256 tile split (``split_*``) and of BN=128 data-parallel (``bn128_*``) over
    cuBLAS fp16's line, and of cuBLAS with fp32 output over it (``f32out_*``; NaN without it); then, at each of
    ``ids``, a launch with BN=128's intercept and the split's slope (``hybrid_us_<id>``) against cuBLAS's measured
    time there (``hybrid_ratio_<id>`` = cuBLAS / hybrid). The launches are the main scale form's (:func:`main_scl`)."""
    import pandas as pd

    f = fit.set_index(["qtype", "variant"])
    rows = []
    for q in dict.fromkeys(fit.qtype):
        split, dp = variant_name(256, 4, main_scl(q, 256), 3, 0, 5), variant_name(128, 4, main_scl(q, 128), 0)
        if not all((q, v) in f.index for v in (split, dp, CUBLAS)):
            continue
        cb, sp, d = f.loc[(q, CUBLAS)], f.loc[(q, split)], f.loc[(q, dp)]
        r = {"qtype": q,
             "split_extra_us": sp.intercept_us - cb.intercept_us, "split_per_k": sp.ns_per_k / cb.ns_per_k - 1,
             "bn128_extra_us": d.intercept_us - cb.intercept_us, "bn128_per_k": d.ns_per_k / cb.ns_per_k - 1,
             "f32out_extra_us": np.nan, "f32out_per_k": np.nan}
        if (q, CUBLAS_F32OUT) in f.index:
            c32 = f.loc[(q, CUBLAS_F32OUT)]
            r.update(f32out_extra_us=c32.intercept_us - cb.intercept_us, f32out_per_k=c32.ns_per_k / cb.ns_per_k - 1)
        for k in ids:
            hyb = d.intercept_us + sp.ns_per_k * 1e-3 * k
            meas = points[(points.qtype == q) & (points["id"] == k) & (points.variant == CUBLAS)].median_us
            r[f"hybrid_us_{k}"] = hyb
            r[f"hybrid_ratio_{k}"] = float(meas.iloc[0]) / hyb if len(meas) else np.nan
        rows.append(r)
    return pd.DataFrame(rows)


def _time_with_cublas(run, name: str, calls: dict, point, pt, p: dict, flush, progress) -> list[dict]:
    """The end of an A/B point: ``calls`` and cuBLAS fp16 on the point's cached dequantized weights timed
    interleaved (``p``'s pairs and repeats, ``flush``), the rows into ``run`` table ``wgmma_<name>_ab`` and returned,
    each call's TOPS-eq logged."""
    qtype, od, id_, nt = point
    y16 = wgmma._cp().empty((nt, od), np.float16)
    calls = {**calls, "cublas_f16_cached": lambda: blas.matmul_f16(pt.x16, pt.w16, out=y16)}
    res = B.interleaved(calls, pairs=p["pairs"], repeats=p["repeats"], flush=flush)
    new = B.pair_rows(res, {"qtype": qtype, "od": od, "id": id_, "nt": nt}, nt, od, id_)
    if run is not None:
        run.append(f"wgmma_{name}_ab", new)
    med = {k: np.median([s["median_us"] for s in v]) for k, v in res.items()}
    progress(f"{name} {qtype} {od}x{id_} nt={nt}: " + ", ".join(
        f"{k} {2 * nt * od * id_ / (v * 1e-6) / 1e12:.0f}" for k, v in med.items()) + " TOPS-eq")
    return new


def ceiling_table(ab_df):
    """The ceiling A/B as one row per (point, launch): each build's ratio to cuBLAS fp16 (cached) -- plain, without
    weight loads, without conversion (the skeleton) -- and the share of the plain launch's excess time over the
    skeleton that the loads account for: (t_plain - t_noload) / (t_plain - t_noconv)."""
    t = suffix_ab(ab_df, suffixes=tuple(CEILING_BUILDS))
    if t.empty:
        return t
    key = ["qtype", "od", "id", "nt", "launch", "base"]
    w = t.pivot_table(index=key, columns="option", values=["speedup", "option_vs_cublas", "base_vs_cublas"],
                      aggfunc="first")
    out = w.index.to_frame(index=False)
    out["plain_vs_cublas"] = w[("base_vs_cublas", "noload")].to_numpy()   # the base's: the same under both options
    out["noload_vs_cublas"] = w[("option_vs_cublas", "noload")].to_numpy()
    out["noconv_vs_cublas"] = w[("option_vs_cublas", "noconv")].to_numpy()
    # times relative to the plain launch's: 1 / speedup
    r_load, r_conv = 1 / w[("speedup", "noload")].to_numpy(), 1 / w[("speedup", "noconv")].to_numpy()
    out["loads_share"] = (1 - r_load) / (1 - r_conv)
    return out.rename(columns={"base": "variant"}).sort_values(["qtype", "od", "id", "nt", "launch"]).reset_index(drop=True)
