"""Round 7's benchmark of record and the recorded round: :func:`bench` (the wgmma_kq launches against cuBLAS fp16 and the
lab's int8 kernel, interleaved, L2 flushed, parity-gated), the cost scan (:func:`cost_scan`, :func:`cost_fit`), the
real-model gates (:func:`real_model_rows`), the kernels' resources and :func:`record` with its :data:`PLAN`."""

from __future__ import annotations

import time

import numpy as np

from ... import bench as B
from ... import blas, cases, gpu, model, occupancy, wgmma
from ...kernels import registry
from ...wgmma import (BLOCK_BYTES, NO_MAP, QK, WgWeight, _WS, default_params, emulate_weights, gate, int8_path_error,
                      kernel, main_scl, pair_fits, reduce_fits, schedule, segments, sk_fits, split_g, tensor_map,
                      tile_count, variant_name)
from . import builds as wb
from .builds import kernel_built

#: the four 7B shapes of the issue (od x id) and the token counts of the nt sweep
SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008), (4096, 14336))
NTS = (64, 128, 256, 512, 1024, 2048, 4096)


def bench(shapes=SHAPES, nts=NTS, qtypes=("q4_K", "q6_K"), variants=((128, 4, None, 1), (256, 4, None, 0)), pairs: int = 3,
          repeats: int = 10, run=None, seed: int = 0, progress=print, int8: bool = True,
          table: str = "wgmma_bench", leads_us: tuple = ()) -> list[dict]:
    """Interleaved, L2-flushed CUDA-event timings of the wgmma_kq variants against cuBLAS fp16 on cached
    dequantized weights (and including the dequant), and the lab's best int8 kernel, at matched (nt, od, id).
    ``variants``: tuples (BN, STAGES, SCL or None for the main scale form, SK, FORM, EPI, AQ, PF), trailing defaults
    optional (SK, FORM, EPI 0; AQ 2; PF 0).

    Every (qtype, shape, nt) is parity-gated on 24 tokens (all rows) before it is timed; a failed gate raises.
    ``leads_us``: also time every call behind a :class:`labkernels.bench.Lead` of each of these microseconds,
    interleaved call by call with the plain timing (rows' ``timing``: ``events`` or ``lead<us>``, with ``host_us``,
    each call's host time, and ``flush_us``, the flush's device time).
    Rows (one per variant and pair) go to ``run`` tables ``table`` (``wgmma_bench``: the benchmark of record, which
    ``auto`` reads; an experiment names its own) and ``wgmma_parity``."""
    import gguf

    cp = wgmma._cp()
    rng = np.random.default_rng(seed or None)
    flush = B.Flusher()
    timings = {"events": None, **{f"lead{int(u)}": B.Lead(float(u)) for u in leads_us}}
    fl_us = B.flush_us(flush) if leads_us else None
    if leads_us:
        progress(f"flush: {fl_us:.1f} us of device time; leads {', '.join(f'{u:g}' for u in leads_us)} us")
    rows = []
    for qtype in qtypes:
        for od, id_ in shapes:
            raw = cases.synthetic_weights(qtype, od, id_, rng)
            w = WgWeight.from_gguf(raw, qtype, plane=any(len(v) > 2 and v[2] == 2 for v in variants))
            wq = gpu.QWeight.upload(raw, qtype)
            if qtype == "q4_K":
                w.gguf = wq.raw        # the shared-memory form reads the GGUF rows as uploaded
            w64 = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype.upper()])
            w16e = emulate_weights(cp.asnumpy(w.packed), qtype, od, id_)
            if run is not None:
                run.append("wgmma_repack", {"qtype": qtype, "od": od, "id": id_, "repack_s": w.repack_s,
                                            "bytes": w.nbytes, "gguf_bytes": int(raw.nbytes),
                                            "bits_per_weight": 8 * w.nbytes / (od * id_),
                                            "plane_bytes": w.plane_bytes, "plane_s": w.plane_s,   # q4_K's SCL=2 plane
                                            "bits_per_weight_with_plane": 8 * (w.nbytes + w.plane_bytes) / (od * id_)})
            w16 = gpu.dequant_f16(wq)
            fam, fpar = registry.default_variant(qtype).family, registry.default_variant(qtype).p
            for nt in nts:
                x, xg, x16, y, tok = cases.point_inputs(rng, nt, od, id_)
                vs = {}
                for v in variants:
                    bn, st, scl, sk, form, epi, aq, pf = (tuple(v) + (0, 0, 0, 0, 0, 0, 2, 0)[len(v):])[:8]
                    if form and qtype != "q4_K":
                        continue           # the shared-memory form takes q4_K
                    if pf and qtype == "q6_K" and bn == 256:
                        continue           # no q6_K BN=256 prefetch build (its consumers spill with it)
                    scl = main_scl(qtype, bn) if scl is None else scl
                    if epi == 3 and (qtype == "q6_K" and bn == 256 or not pair_fits(nt, od, id_, bn,
                                                                                      wgmma._sm_count(cp.cuda.Device().id))):
                        if run is not None:     # the pair exchange: two CTAs per tile only (no q6_K BN=256 build)
                            why = ("no q6_K BN=256 build" if qtype == "q6_K" and bn == 256
                                   else "no two-CTA-per-tile grid (SK=3, G != 2)")
                            run.append("wgmma_not_applicable", {"qtype": qtype, "od": od, "id": id_, "nt": nt, "why": why,
                                                                "variant": variant_name(bn, st, scl, sk, form, epi, aq, pf)})
                        continue
                    if epi == 5 and not reduce_fits(sk, nt, od, id_, bn, wgmma._sm_count(cp.cuda.Device().id)):
                        if run is not None:     # the reduce finish: at most two CTAs a tile
                            run.append("wgmma_not_applicable", {"qtype": qtype, "od": od, "id": id_, "nt": nt,
                                                                "variant": variant_name(bn, st, scl, sk, form, epi, aq, pf),
                                                                "why": "a tile over more than two CTAs (EPI=5)"})
                        continue
                    if sk in (2, 3) and not sk_fits(sk, nt, od, id_, bn, wgmma._sm_count(cp.cuda.Device().id)):
                        if run is not None:     # the split-k grid does not fit: not run, and said so
                            run.append("wgmma_not_applicable", {"qtype": qtype, "od": od, "id": id_, "nt": nt,
                                                                "variant": variant_name(bn, st, scl, sk, form, epi, aq, pf),
                                                                "why": f"no {'uniform' if sk == 2 else 'tile-aligned'} "
                                                                       "split-k grid (G < 2)"})
                        continue
                    y.fill(np.nan)
                    wb.gemm(w, x16, out=y, BN=bn, STAGES=st, SCL=scl, SK=sk, FORM=form, EPI=epi, AQ=aq, PF=pf)
                    g = gate(cp.asnumpy(y), raw, qtype, x, tokens=tok, w64=w64, w16=w16e)
                    name = variant_name(bn, st, scl, sk, form, epi, aq, pf)
                    if run is not None:
                        run.append("wgmma_parity", {"qtype": qtype, "od": od, "id": id_, "nt": nt, "variant": name,
                                                    **g})
                    if not g["ok"]:
                        raise AssertionError(f"{name} parity failed: {qtype} nt={nt} od={od} id={id_}: {g}")
                    vs[name] = (lambda bn=bn, st=st, scl=scl, sk=sk, form=form, epi=epi, aq=aq, pf=pf: wb.gemm(
                        w, x16, out=y, BN=bn, STAGES=st, SCL=scl, SK=sk, FORM=form, EPI=epi, AQ=aq, PF=pf))
                main = default_params(qtype, nt)
                vs["wgmma_incl_f32_to_f16"] = lambda: wb.gemm(w, xg, out=y, **main)
                y16 = cp.empty((nt, od), cp.float16)
                vs["cublas_f16_cached"] = lambda: blas.matmul_f16(x16, w16, out=y16)
                vs["cublas_f16_with_dequant"] = lambda: (gpu.dequant_f16(wq, out=w16), blas.matmul_f16(x16, w16, out=y16))
                if int8:
                    a = gpu.prepass(xg)
                    vs[f"int8_{fam}"] = lambda: gpu.gemm(wq, a, fam, out=y, **fpar)
                t0 = time.time()
                key = {"qtype": qtype, "od": od, "id": id_, "nt": nt}
                if not leads_us:
                    res = B.interleaved(vs, pairs=pairs, repeats=repeats, flush=flush)
                    per = {"": res}
                    new = B.pair_rows(res, key, nt, od, id_)
                else:                      # each call under every timing, one after the other, round by round
                    combo = {(n, t): f for n, f in vs.items() for t in timings}
                    res = B.interleaved(combo, pairs=pairs, repeats=repeats, flush=flush,
                                        leads={k: timings[k[1]] for k in combo})
                    per = {t: {n: res[(n, t)] for n in vs} for t in timings}
                    new = [r for t in timings for r in B.pair_rows(per[t], {**key, "timing": t}, nt, od, id_,
                                                                    tail={"flush_us": fl_us})]
                rows += new
                if run is not None:
                    run.append(table, new)
                for t, rt in per.items():
                    med = {k: np.median([s["median_us"] for s in v]) for k, v in rt.items()}
                    best = min((k for k in med if k.startswith(("wgmma_bn", "wgmma_smem"))), key=med.get)
                    progress(f"{qtype} {od}x{id_} nt={nt}{' ' + t if t else ''}: " + ", ".join(
                        f"{k} {2 * nt * od * id_ / (v * 1e-6) / 1e12:.0f}" for k, v in med.items())
                        + f" TOPS-eq; best/cuBLAS {med['cublas_f16_cached'] / med[best]:.2f}x ({time.time() - t0:.1f} s)")
    return rows


def cost_scan(run=None, od: int = 4096, ids=(256, 1024, 4096, 14336), nt: int = 512, pairs: int = 3,
              repeats: int = 10, seed: int = 0, progress=print, ablate_id: int | None = 4096) -> list[dict]:
    """Where a launch's time goes at a small token count: an id (k) scan of q4_K at (nt, od) for BN 128/256 under
    both schedulers and cuBLAS fp16 (interleaved, L2 flushed, CUDA events), so that time = intercept + slope x k
    separates the per-launch cost (launch, pipeline fill, epilogue) from the main loop's; plus, per id, the
    back-to-back rate of 50 launches without a flush (host-enqueue-bound when it exceeds the kernel time) and the
    host time of one ``gemm()`` call. At ``ablate_id``, the stream-K BN=256 launch also from ablation builds
    (``LK_ABLATE_NOFIX``: no partial sums / fix-up; ``LK_ABLATE_NOSTORE``: no output store; wrong results by design,
    timing only), interleaved with the normal build: variant names end in ``[NOFIX]`` / ``[NOSTORE]``. Rows to
    ``run`` table ``cost_scan``."""
    cp = wgmma._cp()
    rng = np.random.default_rng(seed or None)
    flush = B.Flusher()
    rows = []
    for id_ in ids:
        raw = cases.synthetic_weights("q4_K", od, id_, rng)
        w = WgWeight.from_gguf(raw, "q4_K")
        x16 = cp.asarray(rng.standard_normal((nt, id_)).astype(np.float16))
        y = cp.empty((nt, od), cp.float32)
        y16 = cp.empty((nt, od), cp.float16)
        w16 = cp.asarray(rng.standard_normal((od, id_)).astype(np.float16))
        vs = {variant_name(bn, 4, 0, sk): (lambda bn=bn, sk=sk: wb.gemm(w, x16, out=y, BN=bn, SCL=0, SK=sk))
              for bn in (128, 256) for sk in (0, 1)}
        vs["cublas_f16_cached"] = lambda: cp.matmul(x16, w16.T, out=y16)
        res = B.interleaved(vs, pairs=pairs, repeats=repeats, flush=flush)
        for name, st in res.items():
            f = vs[name]
            f()
            cp.cuda.Device().synchronize()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            t0 = time.perf_counter()
            e0.record()
            for _ in range(50):
                f()
            e1.record()
            t1 = time.perf_counter()
            e1.synchronize()
            rows.append({"qtype": "q4_K", "od": od, "id": id_, "nt": nt, "variant": name,
                         "median_us": float(np.median([r["median_us"] for r in st])),
                         "back_to_back_us": cp.cuda.get_elapsed_time(e0, e1) * 1e3 / 50,
                         "host_enqueue_us": (t1 - t0) / 50 * 1e6})
        progress(f"cost scan {od}x{id_} nt={nt}: " + ", ".join(f"{r['variant']} {r['median_us']:.1f}"
                                                            for r in rows[-len(vs):]) + " us")
        if id_ == ablate_id:
            rows += _ablation(w, x16, y, flush, pairs, repeats, {"qtype": "q4_K", "od": od, "id": id_, "nt": nt},
                              progress)
    if run is not None:
        run.append("cost_scan", rows)
    return rows


ABLATIONS = ("LK_ABLATE_NOFIX", "LK_ABLATE_NOSTORE")


def _ablation(w, x16, y, flush, pairs, repeats, key, progress) -> list[dict]:
    spec = registry.find("wgmma_kq", QT=4, BN=256, STAGES=4, BF16=0, SCL=0, EPI=0, AQ=2, PF=0)
    base = variant_name(256, 4, 0, 1)
    ks = {base: kernel(**spec.p)}
    for d in ABLATIONS:
        ks[f"{base}[{d[len('LK_ABLATE_'):]}]"] = kernel_built((d,), **spec.p)
    ncta, dp_tiles = schedule(1, x16.shape[0], w.od, w.id, 256, wgmma._sm_count(wgmma._cp().cuda.Device().id))
    tm = tensor_map(x16, 256)
    ws, flags = _WS.get(wgmma._cp().cuda.get_current_stream().ptr, wgmma._sm_count(wgmma._cp().cuda.Device().id) * ks[base].blocks_per_sm)
    vs = {n: (lambda k=k: k.launch((ncta, 1), (tm, NO_MAP), w.packed, y, np.int32(x16.shape[0]), np.int32(w.od),
                                   np.int32(w.id), ws, flags, np.int32(dp_tiles), np.int32(0))) for n, k in ks.items()}
    res = B.interleaved(vs, pairs=pairs, repeats=repeats, flush=flush)
    rows = [{**key, "variant": n, "median_us": float(np.median([r["median_us"] for r in st])),
             "back_to_back_us": float("nan"), "host_enqueue_us": float("nan")} for n, st in res.items()]
    progress("ablation: " + ", ".join(f"{r['variant']} {r['median_us']:.1f}" for r in rows) + " us")
    return rows


def cost_fit(scan_df):
    """Per variant: time = intercept + slope x id (least squares over the scan), and the host enqueue time."""
    import pandas as pd

    out = []
    scan_df = scan_df[~scan_df.variant.str.contains(r"\[", regex=True)]   # the ablation rows are one k only
    for v, g in scan_df.groupby("variant"):
        slope, icpt = np.polyfit(g["id"].to_numpy(float), g.median_us.to_numpy(float), 1)
        out.append({"variant": v, "intercept_us": icpt, "ns_per_k": slope * 1e3,
                    "host_enqueue_us": float(g.host_enqueue_us.median()),
                    "back_to_back_us_at_min_id": float(g.sort_values("id").back_to_back_us.iloc[0])})
    return pd.DataFrame(out)


def pair_nt(od: int, id_: int, BN: int, sm_count: int, tail: int = 27, limit: int = 64) -> int | None:
    """The fewest tokens, one token tile short by ``tail`` (a tail in nt), at which EPI=3 takes od x id; None if no
    nt up to ``limit`` token tiles does. The real-model gates run EPI=3 there: at their 37 tokens the split grid gives
    a Gemma tensor's few tiles more than two CTAs each, which EPI=3 refuses."""
    for m in range(1, limit + 1):
        if pair_fits(m * BN - tail, od, id_, BN, sm_count):
            return m * BN - tail
    return None


# ------------------------------------------------------------------------------------------------ the recorded round


#: the plan of round 7's measurement (the gpu check step and the notebook's measure mode)
PLAN = {"shapes": [list(s) for s in SHAPES], "nts": list(NTS), "qtypes": ["q4_K", "q6_K"],
        "variants": [[128, 4, 0, 0], [128, 4, 1, 0], [256, 4, 0, 0], [256, 4, 1, 0],
                     [128, 4, 0, 1], [128, 4, 1, 1], [256, 4, 0, 1], [256, 4, 1, 1],
                     # the shared-memory form (q4_K): [BN, STAGES, -, SK, FORM=1]
                     [128, 4, 0, 0, 1], [128, 4, 0, 1, 1], [256, 3, 0, 0, 1], [256, 3, 0, 1, 1],
                     # the uniform split-k grid (SK=2), BN=256 main scale form; where it fits (G >= 2)
                     [256, 4, 0, 2], [128, 4, 0, 2], [128, 4, 1, 2],
                     # the tile-aligned split-k grid (SK=3, run 20261201T2310: 1.07-1.11x stream-K at 4096x11008)
                     [256, 4, 0, 3], [128, 4, 0, 3], [128, 4, 1, 3],
                     # the pair exchange on SK=3's grid (EPI=3; main scale form; where a tile gets two CTAs)
                     [256, 4, None, 3, 0, 3], [128, 4, None, 3, 0, 3],
                     # the staged TMA store on stream-K (EPI=4; run 20261202T030856Z: 1.015-1.028x the plain
                     # epilogue at 11008x4096, 0.96-0.99x at q6_K 4096x11008 / 4096x14336, neutral data-parallel)
                     [256, 4, None, 1, 0, 4]],
        "pairs": 3, "repeats": 10}


def kernel_rows() -> list[dict]:
    """Resources of every registered wgmma_kq instantiation as built for the device (nvcc -> cubin)."""
    rows = []
    for spec in registry.family("wgmma_kq") + registry.family("wgmma_kqs"):
        k = kernel(spec.family, **spec.p)
        smem = k.smem + k.entry["static_smem"]
        calc = occupancy.occupancy("h200", spec.threads, k.regs, smem)
        rows.append({"kernel": spec.key, **spec.p, "main_path": spec.main_path, "regs": k.regs,
                     "local_bytes": k.local_bytes, "spill_stores": k.entry["spill_stores"],
                     "wgmma_serialized": k.entry.get("wgmma_serialized", False), "dynamic_smem": k.smem,
                     "static_smem": k.entry["static_smem"], "api_blocks_per_sm": k.occupancy_api(),
                     "calc_blocks_per_sm": calc["blocks_per_sm"]})
    return rows


#: the (BN, SK, FORM, EPI[, AQ[, PF]]) forms the real-model gates run (each where its scheduler fits the tensor at 37 tokens)
REAL_MODEL_FORMS = ((128, 0, 0, 0), (256, 0, 0, 0), (128, 1, 0, 0), (256, 1, 0, 0), (128, 2, 0, 0), (256, 2, 0, 0),
                    (128, 0, 1, 0), (128, 1, 1, 0), (256, 1, 1, 0),      # the shared-memory form (q4_K)
                    (128, 3, 0, 0), (256, 3, 0, 0),                      # the tile-aligned split-k grid
                    (256, 0, 0, 1), (256, 2, 0, 1), (128, 0, 0, 2), (256, 0, 0, 2), (256, 2, 0, 2), (256, 3, 0, 2),
                    (128, 3, 0, 1),
                    (128, 0, 0, 0, 4), (128, 1, 0, 0, 4), (128, 3, 0, 0, 4),     # four A-fragment sets (AQ=4)
                    (128, 0, 0, 0, 2, 2), (128, 1, 0, 0, 2, 1), (256, 3, 0, 0, 2, 2),   # the L2 prefetch (PF)
                    (128, 3, 0, 3), (256, 3, 0, 3),                      # the pair exchange (EPI=3)
                    (128, 0, 0, 4), (256, 0, 0, 4), (128, 1, 0, 4), (256, 1, 0, 4), (256, 3, 0, 4),   # staged (EPI=4)
                    (128, 1, 0, 5), (256, 1, 0, 5), (128, 3, 0, 5), (256, 3, 0, 5),   # the reduce finish (EPI=5)
                    (128, 0, 2, 0), (128, 1, 2, 0),                      # two converter warpgroups (FORM=2)
                    (128, 0, 0, 0, 2, 0, 2), (128, 1, 0, 0, 2, 0, 2), (128, 3, 0, 0, 2, 0, 2))   # the scale plane (SCL=2)


def reduce_nt(sk: int, od: int, id_: int, BN: int, sm_count: int) -> int | None:
    """The fewest tokens (a multiple of 8 up to 4096) at which EPI=5 takes scheduler ``sk`` on this weight with some
    tile split over two CTAs -- the real-model gate's nt for the reduce finish; None where there is none."""
    I = id_ // QK
    for nt in range(8, 4097, 8):
        if not reduce_fits(sk, nt, od, id_, BN, sm_count):
            continue
        ncta, dp = schedule(sk, nt, od, id_, BN, sm_count)
        G = split_g(sk, nt, od, id_, BN, sm_count)
        if any(klo > 0 for c in range(ncta) for _, klo, _ in segments(ncta, c, I, tile_count(nt, od, BN), dp, G)):
            return nt
    return None


def real_model_rows(rng, progress=print, forms=REAL_MODEL_FORMS) -> list[dict]:
    """Every q4_K / q6_K tensor of Gemma 3 270M (all rows, 37 fresh random tokens) through the main variants
    under every scheduler and epilogue form in ``forms`` (at 37 tokens stream-K splits every tile's k over several
    CTAs: the fix-up is gated), with the int8 q8_1 path's error on the same inputs beside it. The pair exchange
    (EPI=3) runs at :func:`pair_nt` tokens instead, the fewest at which the tensor's tiles get two CTAs each."""
    cp = wgmma._cp()
    sm = wgmma._sm_count(cp.cuda.Device().id)
    rows = []
    for name, qtype, raw in model.load_kquant():
        raw = np.ascontiguousarray(raw)
        id_ = raw.shape[1] // BLOCK_BYTES[qtype] * QK
        w = WgWeight.from_gguf(raw, qtype, plane=any(len(f) > 6 and f[6] == 2 for f in forms))
        if qtype == "q4_K":
            w.gguf = cp.asarray(raw)
        inputs = {}    # nt -> (x, the int8 q8_1 path's error on x): 37 tokens, or EPI=3's pair_nt
        for f in forms:
            bn, sk, form, epi, aq, pf, scl = (tuple(f) + (2, 0, None)[len(f) - 4:])[:7]
            if scl == 2 and qtype != "q4_K":
                continue     # the scale plane is q4_K's
            if (pf or epi == 3) and qtype == "q6_K" and bn == 256:
                continue     # no q6_K BN=256 prefetch or pair-exchange build (they spill)
            if form and qtype != "q4_K":
                continue     # the shared-memory form takes q4_K
            nt = 37
            if epi == 3:
                nt = pair_nt(raw.shape[0], id_, bn, sm)
                if nt is None:
                    continue     # the pair exchange: two CTAs per tile only
            if epi == 5:
                nt = reduce_nt(sk, raw.shape[0], id_, bn, sm)
                if nt is None or raw.shape[0] % 4:
                    continue     # the reduce finish: a grid of at most two CTAs a tile, some of them split
            if not sk_fits(sk, nt, raw.shape[0], id_, bn, sm):
                continue     # a split-k grid where it fits this tensor (every Gemma tensor, at 37 tokens)
            if epi in (2, 4, 5) and raw.shape[0] % 4:
                continue     # the TMA-store epilogue's rows are 16-byte multiples
            if nt not in inputs:
                x = rng.standard_normal((nt, id_)).astype(np.float32)
                inputs[nt] = (x, int8_path_error(raw, qtype, x))
            x, i8 = inputs[nt]
            p = {"BN": bn, "STAGES": 3 if form and bn == 256 else 4, "BF16": 0,
                 "SCL": main_scl(qtype, bn) if scl is None else scl, "SK": sk,
                 "FORM": form, "EPI": epi, "AQ": aq, "PF": pf}
            y = cp.full((nt, raw.shape[0]), np.nan, cp.float32)
            wb.gemm(w, cp.asarray(x), out=y, **p)
            g = gate(cp.asnumpy(y), raw, qtype, x, packed=cp.asnumpy(w.packed))
            rows.append({"tensor": name, "qtype": qtype, "od": raw.shape[0], "id": id_, "nt": nt,
                         "variant": variant_name(bn, p["STAGES"], p["SCL"], sk, form, epi, aq, pf), **g, "int8_max_rel_err_f64": i8["max_rel_err_f64"],
                         "int8_nmse": i8["nmse"]})
            if not g["ok"]:
                raise AssertionError(f"real-model gate failed: {name} {p}: {g}")
    if not rows:
        raise AssertionError(f"no real-model gate ran: no Gemma 3 270M tensor takes the forms {list(forms)}")
    progress(f"real model: {len(rows)} gates passed; max rel err vs float64 {max(r['max_rel_err_f64'] for r in rows):.2e} "
             f"(int8 q8_1 path {max(r['int8_max_rel_err_f64'] for r in rows):.2e}), NMSE "
             f"{max(r['nmse'] for r in rows):.1e} (int8 {max(r['int8_nmse'] for r in rows):.1e})")
    return rows


def record(run, plan=None, progress=print, seed: int = 0) -> None:
    """Round 7 into ``run``: kernel resources, real-model gates, the interleaved benchmark with its gates."""
    p = {**PLAN, **(plan or {})}
    rng = np.random.default_rng(seed or None)
    run.append("kernels", kernel_rows())
    run.append("real_model_parity", real_model_rows(rng, progress))
    bench([tuple(s) for s in p["shapes"]], p["nts"], p["qtypes"], [tuple(v) for v in p["variants"]],
          pairs=p["pairs"], repeats=p["repeats"], run=run, progress=progress)
