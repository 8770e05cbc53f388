"""Round 7's per-CTA traces: the stamps a ``-DLK_EXP_TRACE`` build writes (:func:`trace_launch`), read as rows,
phases and roles in the schedule, the KPAIR body's traces and the cold-L2 phases."""

from __future__ import annotations


import numpy as np

from ... import wgmma
from ...wgmma import QK, WgmmaError, WgWeight, schedule, segments, split_g, tile_count, variant_params
from . import builds as wb
from .builds import KPAIR, KPAIR_PARAMS, check_defines, kernel_built, kpair_grid
from .kpair import MACS_PER_CLK


#: the phases a -DLK_EXP_TRACE build of the register form stamps per CTA (the experiments source, LK_TRACE): slot i of 15
TRACE_EVENTS = ("entry", "setup", "first_tile",
                *[f"seg{i}_{p}" for i in range(4) for p in ("start", "mma_end", "done")])
TRACE_CTAS = 1024        # LK_TRACE_CTAS
#: the same events in the order a CTA passes them: the first tile arrives inside the first segment's main loop
TRACE_ORDER = ("entry", "setup", "seg0_start", "first_tile", *TRACE_EVENTS[4:])


def trace_rows(ns, clk) -> list[dict]:
    """Rows (cta, smid, event, t_us, cta_us, cycles) from the kernel's trace arrays ``ns`` / ``clk`` [ncta, 16]
    (globaltimer ns / clock64; slot 15 of ``ns`` = the CTA's SM): ``t_us`` from the earliest entry of any CTA,
    ``cta_us`` from the CTA's own entry (globaltimer), ``cycles`` from its own entry (clock64, the SM's clock).
    Slots never written (0) are left out: a CTA with fewer segments stamps fewer events."""
    ns = np.asarray(ns, np.uint64)
    clk = np.asarray(clk, np.uint64)
    if ns.ndim != 2 or ns.shape[1] != len(TRACE_EVENTS) + 1 or clk.shape != ns.shape:
        raise ValueError(f"trace arrays must be [ncta, {len(TRACE_EVENTS) + 1}], got {ns.shape} / {clk.shape}")
    entry = ns[:, 0].astype(np.int64)
    if (entry == 0).any():
        raise WgmmaError(f"{int((entry == 0).sum())} CTA(s) never stamped their entry: not a trace build, or the "
                         "launch did not run")
    t0 = int(entry.min())
    rows = []
    for c in range(ns.shape[0]):
        for e, name in enumerate(TRACE_EVENTS):
            if ns[c, e] == 0:
                continue
            rows.append({"cta": c, "smid": int(ns[c, -1]), "event": name, "t_us": (int(ns[c, e]) - t0) / 1e3,
                         "cta_us": (int(ns[c, e]) - int(entry[c])) / 1e3,
                         "cycles": int(clk[c, e]) - int(clk[c, 0])})
    return rows


def trace_summary(rows):
    """Per event: how many CTAs stamped it, and the median / min / max over CTAs of its time from the launch's first
    entry (``t_us``) and from the CTA's own entry (``cta_us``); the entries' spread is the launch ramp."""
    import pandas as pd

    df = pd.DataFrame(rows)
    order = {e: i for i, e in enumerate(TRACE_ORDER)}
    g = df.groupby("event").agg(ctas=("cta", "nunique"), t_us_median=("t_us", "median"), t_us_min=("t_us", "min"),
                                t_us_max=("t_us", "max"), cta_us_median=("cta_us", "median"),
                                cta_us_max=("cta_us", "max"), cycles_median=("cycles", "median")).reset_index()
    return g.sort_values("event", key=lambda s: s.map(order)).reset_index(drop=True)


def trace_phases(rows, od: int, id_: int, nt: int, sm_count: int | None = None):
    """Per CTA and segment of a traced launch (:func:`trace_rows` rows, several variants allowed): its role in the
    schedule (``owner``: holds the tile's k = 0 and stores it; ``helper``: writes partial sums; ``whole``: the whole
    tile), super-block iterations, and its phases in us: ``fill`` (segment start to the first activation tile, first
    segment only), ``main`` (to the end of the main loop), ``finish`` (the fix-up and the store: partial sums written,
    or the helpers' waited for, folded in and Y stored); ``start_us`` / ``end_us`` from the launch's first entry;
    ``cycles_per_iter`` of the main loop (clock64) and the SM clock ``mhz`` over the CTA's launch (clock64 cycles per
    globaltimer us). ``sm_count``: the SMs the launch was scheduled for (the tile-aligned split's G depends on it;
    None: the traced CTAs, which is the data-parallel and stream-K grids' count)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    out = []
    for v, g in df.groupby("variant"):
        _, p = variant_params(v, "q4_K")
        bn, sk = p["BN"], p["SK"]
        ncta = g.cta.nunique()
        sms = int(sm_count) if sm_count else ncta
        I = id_ // QK
        tiles = tile_count(nt, od, bn)
        nc, dp = schedule(sk, nt, od, id_, bn, sms)
        G = split_g(sk, nt, od, id_, bn, sms)
        if nc != ncta:
            raise WgmmaError(f"{v}: {ncta} CTAs traced, the schedule at nt={nt}, od={od}, id={id_} has {nc}")
        for c, gc in g.groupby("cta"):
            ev = gc.set_index("event")
            segs = segments(ncta, int(c), I, tiles, dp, G)
            mhz = ev.loc["seg0_mma_end", "cycles"] / ev.loc["seg0_mma_end", "cta_us"] if "seg0_mma_end" in ev.index \
                else np.nan
            for si, (tile, klo, khi) in enumerate(segs):
                if f"seg{si}_done" not in ev.index:
                    break
                t0 = ev.loc[f"seg{si}_start"]
                ft = ev.loc["first_tile"] if si == 0 else t0
                me, dn = ev.loc[f"seg{si}_mma_end"], ev.loc[f"seg{si}_done"]
                owns = klo == 0
                role = "whole" if (owns and khi == I) else ("owner" if owns else "helper")
                out.append({"variant": v, "cta": int(c), "seg": si, "tile": tile, "role": role, "iters": khi - klo,
                            "start_us": t0.t_us, "end_us": dn.t_us, "fill_us": ft.cta_us - t0.cta_us,
                            "main_us": me.cta_us - ft.cta_us, "finish_us": dn.cta_us - me.cta_us,
                            "cycles_per_iter": (me.cycles - ft.cycles) / max(1, khi - klo), "mhz": mhz})
    return pd.DataFrame(out)


def trace_roles(trace, sm_count: int | None = None):
    """A recorded trace table (``wgmma_trace``'s ``trace``: several shapes, types and variants) as one row per
    (qtype, od, id, nt, variant, role) of :func:`trace_phases`: how many segments, their median iterations and
    fill / main / finish times (us), the slowest finish, the last segment's end (the stamps' span), the main loop's
    median clock64 cycles per super-block and the SM clock (MHz)."""
    import pandas as pd

    df = pd.DataFrame(trace)
    parts = []
    for (q, od, id_, nt), g in df.groupby(["qtype", "od", "id", "nt"], sort=False):
        ph = trace_phases(g.to_dict("records"), int(od), int(id_), int(nt), sm_count)
        parts.append(ph.assign(qtype=q, od=int(od), id=int(id_), nt=int(nt)))
    ph = pd.concat(parts, ignore_index=True)
    return (ph.groupby(["qtype", "od", "id", "nt", "variant", "role"], sort=False)
              .agg(segments=("cta", "size"), iters=("iters", "median"), fill_us=("fill_us", "median"),
                   main_us=("main_us", "median"), finish_us=("finish_us", "median"),
                   finish_us_max=("finish_us", "max"), end_us_max=("end_us", "max"),
                   cycles_per_iter=("cycles_per_iter", "median"), mhz=("mhz", "median")).reset_index())


def trace_launch(w: WgWeight, x16, BN: int = 128, STAGES: int = 4, SCL: int = 0, SK: int = 0, EPI: int = 0,
                 warmup: int = 2, timed: int = 0, flush=None, kpair: bool = False, defines: tuple = ()):
    """Exploratory: the per-CTA phase stamps (:func:`trace_rows`) of one register-form launch -- any scheduler and
    epilogue form :func:`gemm` takes (EPI=3's 2-CTA clusters included) -- from a ``-DLK_EXP_TRACE`` build (its own
    cubin: the plain build stays as it is), after ``warmup`` launches of it. ``x16``: float16 activations [nt, id].
    ``timed`` > 0: also the median CUDA-event time of that many launches of the trace build, returned as
    ``(rows, median_us)`` (the span of the stamps against the launch's whole time: its ramp and its drain). The trace
    build's timings include the stamps' own cost (a few global stores per CTA). ``flush``: a
    :class:`labkernels.bench.Flusher` run right before the traced launch, so that it starts from a cold L2 as every
    benchmarked launch does (without it the warm-up launches leave the weights and activations in L2). ``kpair``: the
    ``LK_EXP_KPAIR`` build's one launch shape instead (:data:`KPAIR_PARAMS`, :func:`kpair_grid` CTAs; the tile
    arguments are then not read): its stamps are read by :func:`kpair_trace_phases`; ``defines``: with ``kpair``, a
    form of that build instead (e.g. :data:`KPAIR_FIN`), traced with the same stamps."""
    if kpair and defines and "LK_EXP_KPAIR" not in defines:
        raise WgmmaError(f"a KPAIR trace takes a form of the KPAIR build, not {defines}")
    if defines and not kpair:
        raise WgmmaError("trace_launch takes other defines only for a KPAIR trace (kpair=True)")
    cp = wgmma._cp()
    qt = 4 if w.qtype == "q4_K" else 6
    nt = x16.shape[0]
    if kpair:
        defines = check_defines(tuple(defines or KPAIR) + ("LK_EXP_TRACE",))
        kw = dict(defines=defines, **KPAIR_PARAMS)
        k = kernel_built(defines, QT=qt, **{n: v for n, v in KPAIR_PARAMS.items() if n != "SK"})
        ncta = kpair_grid(nt, w.od)
    else:
        kw = dict(BN=BN, STAGES=STAGES, SCL=SCL, SK=SK, EPI=EPI, defines=("LK_EXP_TRACE",))
        k = kernel_built(("LK_EXP_TRACE",), QT=qt, BN=BN, STAGES=STAGES, BF16=0, SCL=SCL, EPI=EPI, AQ=2, PF=0)
        ncta, _ = schedule(int(SK), nt, w.od, w.id, BN, wgmma._sm_count(cp.cuda.Device().id) * k.blocks_per_sm)
    if ncta > TRACE_CTAS:
        raise WgmmaError(f"the trace build stamps {TRACE_CTAS} CTAs, this launch has {ncta}")
    n = TRACE_CTAS * (len(TRACE_EVENTS) + 1)
    ns = cp.ndarray((n,), cp.uint64, memptr=k.module.get_global("lk_trace_ns"))
    clk = cp.ndarray((n,), cp.uint64, memptr=k.module.get_global("lk_trace_clk"))
    y = cp.empty((nt, w.od), cp.float32)
    for _ in range(warmup):
        wb.gemm(w, x16, out=y, **kw)
    ns.fill(0)
    clk.fill(0)
    if flush is not None:
        flush()
    wb.gemm(w, x16, out=y, **kw)
    cp.cuda.get_current_stream().synchronize()
    shape = (TRACE_CTAS, len(TRACE_EVENTS) + 1)
    rows = trace_rows(cp.asnumpy(ns).reshape(shape)[:ncta], cp.asnumpy(clk).reshape(shape)[:ncta])
    if not timed:
        return rows
    ts = []
    for _ in range(int(timed)):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        wb.gemm(w, x16, out=y, **kw)
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
    return rows, float(np.median(ts))


#: the KPAIR body's trace slots by meaning: its one segment starts at the setup stamp (a stamp of its own made q6_K's
#: consumers spill); slot 6, "seg1_start" in the plain body's naming, is its exit barrier passed
KPAIR_TRACE = {"entry": "entry", "setup": "setup", "first_tile": "first_tile", "mma_end": "seg0_mma_end",
               "done": "seg0_done", "exit": "seg1_start"}


def _trace_pivots(df):
    """A traced launch's stamps (:func:`trace_rows` rows) as three [cta x event] tables: us from the CTA's entry,
    clock64 cycles from its entry, and us from the launch's first entry."""
    return tuple(df.pivot_table(index="cta", columns="event", values=v, aggfunc="first")
                 for v in ("cta_us", "cycles", "t_us"))


def kpair_trace_phases(rows, id_: int):
    """Per CTA of a traced ``LK_EXP_KPAIR`` launch (:func:`trace_launch` with ``kpair``; warpgroup 1's first thread
    stamps): ``setup_us`` (entry to the setup stamp: barriers, cluster sync -- the consumers start right after it),
    ``fill_us`` (from there to its first activation stage landed), ``main_us`` (to the end of its main loop, the fill
    included), ``finish_us`` (the two warpgroups' exchange of partial sums and its Y stores), ``exit_us`` (waiting at
    the cluster's exit barrier), ``end_us`` (the exit from the launch's first entry), ``cycles_per_iter`` (clock64 cycles of the main loop per super-block of the warpgroup:
    ceil(id / 512) of them), ``loop_cycles_per_iter`` (the same from its first activation stage on: the fill left out)
    and ``mhz`` (clock64 cycles per globaltimer us over the CTA). A CTA without every stamp raises."""
    import pandas as pd

    need = list(KPAIR_TRACE.values())
    us, cyc, t = _trace_pivots(pd.DataFrame(rows))
    miss = [e for e in need if e not in us.columns or us[e].isna().any()]
    if miss:
        raise WgmmaError(f"a KPAIR trace without every stamp: {miss} missing (not a KPAIR trace build?)")
    e = KPAIR_TRACE
    iters = -(-(int(id_) // QK) // 2)
    out = pd.DataFrame({"cta": us.index, "setup_us": us[e["setup"]] - us[e["entry"]],
                        "fill_us": us[e["first_tile"]] - us[e["setup"]],
                        "main_us": us[e["mma_end"]] - us[e["setup"]],
                        "finish_us": us[e["done"]] - us[e["mma_end"]],
                        "exit_us": us[e["exit"]] - us[e["done"]], "end_us": t[e["exit"]],
                        "cycles_per_iter": (cyc[e["mma_end"]] - cyc[e["setup"]]) / iters,
                        "loop_cycles_per_iter": (cyc[e["mma_end"]] - cyc[e["first_tile"]]) / iters,
                        "mhz": cyc[e["exit"]] / us[e["exit"]]})
    return out.reset_index(drop=True)


def kpair_trace_table(run):
    """The twenty-fifth step's trace run as one row per (L2 state, qtype, od, id, build): the KPAIR build (tables
    ``kpair_trace[_flushed]``, :func:`kpair_trace_phases`) and the BN=128 data-parallel launch (``bn128_trace[_flushed]``)
    on the same phases, medians over CTAs: ``to_first_tile_us`` (entry to the first activation stage: setup, register
    hand-over, the first loads), ``loop_us`` (from there to the main loop's end) and its clock64 cycles per iteration
    beside the tensor pipe's (``pipe_cycles``: 2,048 per BN=128 super-block; 4,096 per KPAIR warpgroup super-block, the
    two warpgroups sharing the pipe), ``finish_us`` (the exchange and stores), ``exit_us`` (KPAIR's cluster exit
    barrier; blank for BN=128), ``end_us_max`` (the launch's last stamp from its first entry) and the SM clock."""
    import pandas as pd

    rows = []
    for state, sfx in (("warm", ""), ("cold", "_flushed")):
        for build, tab in (("KPAIR 64 x 256", "kpair_trace"), ("BN=128 data-parallel", "bn128_trace")):
            if not run.has(tab + sfx):
                continue
            d = run.table(tab + sfx)
            for (q, od, id_), g in d.groupby(["qtype", "od", "id"], sort=False):
                if build.startswith("KPAIR"):
                    ph = kpair_trace_phases(g.to_dict("records"), int(id_))
                    m = ph.median()
                    r = {"to_first_tile_us": m.setup_us + m.fill_us, "loop_us": m.main_us - m.fill_us,
                         "loop_cycles_per_iter": m.loop_cycles_per_iter, "pipe_cycles": 2 * MACS_PER_CLK,
                         "finish_us": m.finish_us, "exit_us": m.exit_us, "end_us_max": ph.end_us.max(), "mhz": m.mhz}
                else:
                    us, cyc, t = _trace_pivots(g)
                    nsb = int(id_) // QK
                    r = {"to_first_tile_us": us.first_tile.median(),
                         "loop_us": (us.seg0_mma_end - us.first_tile).median(),
                         "loop_cycles_per_iter": ((cyc.seg0_mma_end - cyc.first_tile) / nsb).median(),
                         "pipe_cycles": MACS_PER_CLK, "finish_us": (us.seg0_done - us.seg0_mma_end).median(),
                         "exit_us": np.nan, "end_us_max": t.seg0_done.max(),
                         "mhz": (cyc.seg0_done / us.seg0_done).median()}
                rows.append({"L2": state, "qtype": q, "od": int(od), "id": int(id_), "build": build, **r,
                             "loop_over_pipe": r["loop_cycles_per_iter"] / r["pipe_cycles"]})
    return pd.DataFrame(rows)


def early_table(run):
    """The twenty-seventh step's run (the FIN form with its cold start's L2 requests moved -- LK_EXP_KPAIR_EARLY,
    _OVERLAP, retired -- against :data:`KPAIR_FIN`): per traced build (its
    variant), qtype and shape, the cold-L2 phases (``kpair_trace_flushed``, :func:`kpair_trace_phases`) as medians over
    CTAs -- ``setup_us``, ``fill_us``, ``to_first_tile_us`` (their sum), ``loop_us`` (the main loop from the first
    stage), ``finish_us``, ``exit_us`` -- and ``end_us_max`` (the launch's last stamp from its first entry), each the
    median over the run's traced launches (``rep``; one launch without it). A run without the table gives an empty
    frame."""
    import pandas as pd

    if not run.has("kpair_trace_flushed"):
        return pd.DataFrame()
    t = run.table("kpair_trace_flushed")
    if "rep" not in t.columns:
        t = t.assign(rep=0)
    key = ["variant", "qtype", "od", "id"]
    rows = []
    for k, g in t.groupby(key + ["rep"]):
        ph = kpair_trace_phases(g.to_dict("records"), k[3])
        m = ph.median()
        rows.append({**dict(zip(key, k[:4])), "setup_us": m.setup_us, "fill_us": m.fill_us,
                     "to_first_tile_us": (ph.setup_us + ph.fill_us).median(),
                     "loop_us": (ph.main_us - ph.fill_us).median(), "finish_us": m.finish_us, "exit_us": m.exit_us,
                     "end_us_max": ph.end_us.max()})
    out = pd.DataFrame(rows).groupby(key, sort=False).median().reset_index()
    return out.assign(launches=pd.DataFrame(rows).groupby(key, sort=False).size().values)


def trace_cold(run):
    """A trace run's launches warm (table ``trace``: after warm-up launches) against the same launches from a flushed
    L2 (``trace_flushed``), per role (:func:`trace_roles`): medians of fill, main loop and cycles per super-block
    both ways, and each launch's stamp span both ways."""
    sm = run.meta["params"]["sm_count"]
    keys = ["qtype", "od", "id", "nt", "variant", "role"]
    cols = ["fill_us", "main_us", "cycles_per_iter"]
    warm, cold = (trace_roles(run.table(t), sm)[keys + cols] for t in ("trace", "trace_flushed"))
    m = warm.merge(cold, on=keys, suffixes=("_warm", "_cold"))
    sp = trace_spans(run.table("trace")).merge(trace_spans(run.table("trace_flushed")),
                                               on=keys[:-1], suffixes=("_warm", "_cold"))
    m = m.merge(sp, on=keys[:-1])
    m["cycles_cold_over_warm"] = m.cycles_per_iter_cold / m.cycles_per_iter_warm
    return m


def trace_spans(trace_df):
    """Per traced launch (qtype, od, id, nt, variant): the span of its CTAs' stamps, first to last (us)."""
    g = trace_df.groupby(["qtype", "od", "id", "nt", "variant"], as_index=False).t_us
    return g.agg(lambda s: s.max() - s.min()).rename(columns={"t_us": "span_us"})
