"""Round 9's benchmark of record: the copy line (:func:`copy_bandwidth`, a device-to-device copy in the same process),
the weight bytes a launch reads (:func:`weight_bytes`), :func:`bench_gemv` (gemv_kq's launches beside round 7's wgmma
and cuBLAS fp16, interleaved, L2 flushed, every point gated first) and :func:`measure`, the round into a run."""

from __future__ import annotations

import numpy as np

from ... import bench, blas, cases, dispatch, gemv, gpu, wgmma
from .ledger import PIPE_HOLDER
from .plan import NTS, SHAPES


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 10) -> dict:
    """The reachable HBM line: a device-to-device copy of ``nbytes``, bytes read + written over its median time."""
    import cupy as cp

    a = cp.empty(nbytes // 4, cp.int32)
    a.fill(1)
    b = cp.empty_like(a)
    us = bench.time_launches(lambda: b.__setitem__(Ellipsis, a), warmup=3, repeats=repeats)
    s = bench.stats(us)
    del a, b
    return {"bytes": 2 * nbytes, **s, "tb_per_s": 2 * nbytes / (s["median_us"] * 1e-6) / 1e12}


def weight_bytes(qtype: str, od: int, id_: int) -> int:
    return od * id_ // 256 * {"q4_K": 144, "q6_K": 210}[qtype]


def bench_gemv(run=None, shapes=SHAPES, nts=NTS, qtypes=("q4_K", "q6_K"), acts=("f16", "f32"), pairs: int = 3,
               repeats: int = 20, seed: int = 0, splits=(), configs=((2, 4),), baselines=("wgmma", "cublas"),
               progress=print, flush: str = "read", lead_us: float = 300.0, forms=(0,), launches=None) -> list[dict]:
    """Interleaved, L2-flushed CUDA-event medians of gemv_kq (each ``configs`` (MT, WARPS), the default split and
    each of ``splits``) beside ``baselines`` (round 7's ``wgmma`` via qmatmul, ``cublas`` fp16 on cached dequantized
    weights; ``empty``: :class:`labkernels.bench.EmptyLaunch` over one wave of 128-thread CTAs, the timing's floor,
    family ``empty``, bytes 0) at matched (qtype, od, id, nt, activation type). Every point is gated first (all rows; the first, middle
    and last token). ``flush``: "read" (:class:`labkernels.bench.ReadFlusher`: no dirty L2 lines left to write back)
    or "write" (:class:`labkernels.bench.Flusher`, the first recorded runs); ``lead_us`` > 0: every timed call
    behind a :class:`labkernels.bench.Lead` of that many microseconds, so that the host's enqueue time (a Python
    launch path of tens of us against a kernel of 10-40 us) is not timed -- the decode step replays a CUDA graph,
    where it does not exist; 0: no lead (the first recorded runs timed it).
    ``forms``: the gemv_kq forms timed (typed column FORM; variant names of FORM=1 end in ``_f1``): FORM=1 (step 2)
    at q4_K and nt <= 8 only, interleaved with FORM=0 and the baselines in the same pairs (an A/B in one process),
    gated against its own exact function (:func:`labkernels.gemv.exact_weights_v2`) and the float64 reference.
    ``launches`` (step 3 on): instead of forms x configs x splits, the gemv_kq launches timed, each ``(MT, WARPS,
    FORM, S)`` with S None (the default split), ``"wave"`` (:func:`labkernels.gemv.wave_splits`) or a number (FORM=1
    launches at q4_K and nt <= 8 only); typed column WAVE (S: the split the launch ran), variant names ending ``_sw``;
    each launch's grid (CTAs, resident CTAs an SM, waves, S) and its gate in table ``gemv_plan``. (Step 3's runs
    also have a typed column PIPE and variants ending ``_p<PIPE>``: its ring, retired since; step 5's run has FORM=2
    rows, variants ending ``_f2``, and step 7's FORM=4 / 5 rows ending ``_f4`` / ``_f5``: retired since, a launch of
    one is refused naming the commit that holds it, 90fd260 / 7894b07: :data:`labkernels.gemv.RETIRED_FORMS`.)
    Rows: table ``gemv_bench`` (per variant and pair), with bytes read and the fraction of ``copy`` (the same
    process's copy bandwidth, table ``copy``)."""
    if launches is not None and any(len(v) != 4 for v in launches):
        raise ValueError(f"bench_gemv launches are (MT, WARPS, FORM, S), got {list(launches)}: step 3's (MT, WARPS, "
                         f"FORM, PIPE, S) ran the PIPE ring, which left the source (commit {PIPE_HOLDER} holds it)")
    unknown = sorted(set(baselines) - {"wgmma", "cublas", "empty"})
    if unknown:
        raise ValueError(f"bench_gemv baselines are 'wgmma', 'cublas' and 'empty', not {unknown}")
    gone = sorted(({int(v[2]) for v in launches or ()} | {int(f) for f in forms}) & set(gemv.RETIRED_FORMS))
    if gone:
        held = "; ".join(f"FORM={f}, {gemv.RETIRED_FORMS[f][0]}: commit {gemv.RETIRED_FORMS[f][1]} holds it and runs "
                         f"its launches (gpu check --steps {gemv.RETIRED_FORMS[f][2]} there)" for f in gone)
        raise ValueError(f"bench_gemv: gemv_kq FORM {gone} lost and left the source ({held})")

    import cupy as cp
    import gguf

    rng = np.random.default_rng(seed or None)
    cb = copy_bandwidth()
    progress(f"copy line: {cb['tb_per_s']:.3f} TB/s (1 GiB device-to-device, read + write)")
    if run is not None:
        run.append("copy", [cb])
    if flush not in ("read", "write"):
        raise ValueError(f"flush is 'read' or 'write', not {flush!r}")
    flusher = bench.ReadFlusher() if flush == "read" else bench.Flusher()
    lead = bench.Lead(lead_us) if lead_us else None
    rows = []
    sm = gpu.device_props()["sm_count"]
    for qtype in qtypes:
        for od, id_ in shapes:
            raw = cases.synthetic_weights(qtype, od, id_, rng)
            w = gpu.QWeight.upload(raw, qtype)
            gv = gemv.prepare(w)
            w16e = gemv.emulate_weights(raw, qtype)
            any_f1 = any(f > 0 for f in forms) if launches is None else any(v[2] > 0 for v in launches)
            wv2 = gemv.exact_weights_v2(raw, qtype) if any_f1 and qtype == "q4_K" else None
            w64 = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype.upper()])
            wd16 = gpu.dequant_f16(w) if "cublas" in baselines else None
            nbytes = weight_bytes(qtype, od, id_)
            if run is not None:
                run.append("gemv_weights", {"qtype": qtype, "od": od, "id": id_, "bytes": nbytes,
                                            "layout_bytes": gv.nbytes, "repack_s": gv.repack_s})
            for nt in nts:
                x = rng.standard_normal((nt, id_)).astype(np.float32)
                tok = np.unique([0, nt // 2, nt - 1])     # every row, the first, middle and last token
                for act in acts:
                    xd = cp.asarray(x) if act == "f32" else cp.asarray(x.astype(np.float16))
                    variants, typed = {}, {}
                    todo = []
                    if launches is None:
                        for form in forms:
                            if form > 0 and (qtype != "q4_K" or nt > gemv.FORM1_MAX_NT):
                                continue
                            for mt, warps in configs:
                                todo += [(mt, warps, form, S) for S in (None, *splits)
                                         if S is None or S <= id_ // 256]
                    else:
                        todo = [tuple(v) for v in launches
                                if v[2] == 0 or (qtype == "q4_K" and nt <= gemv.FORM1_MAX_NT)]
                    for mt, warps, form, S in todo:
                        name = (f"gemv_m{mt}w{warps}" + ("" if S is None else "_sw" if S == "wave" else f"_s{S}")
                                + ("" if form == 0 else f"_f{form}"))
                        y = gemv.gemv(gv, xd, MT=mt, WARPS=warps, S=S, FORM=form)
                        g = wgmma.gate(cp.asnumpy(y), raw, qtype, x, w16=w16e if form == 0 else wv2,
                                       w64=w64, tokens=tok,
                                       exact_bound=gemv.form1_exact_gate(id_) if form > 0 else None)
                        if not g["ok"]:
                            raise RuntimeError(f"gemv gate failed {qtype} {od}x{id_} nt={nt} {act} {name}: {g}")
                        variants[name] = (lambda mt=mt, warps=warps, S=S, form=form: gemv.gemv(
                            gv, xd, MT=mt, WARPS=warps, S=S, FORM=form))
                        typed[name] = {"family": "gemv_kq", "MT": mt, "WARPS": warps, "S": S or 0, "FORM": form,
                                       "WAVE": int(S == "wave")}
                        if launches is not None:
                            plan = gemv.launch_plan(gv, nt, int(act == "f32"), mt, warps, form, S, sm)
                            typed[name]["S"] = plan["S"]
                            if run is not None:
                                run.append("gemv_plan", [{"qtype": qtype, "od": od, "id": id_, "nt": nt, "act": act,
                                                          "variant": name, **plan, "exact_rel": g["exact_rel"],
                                                          "nmse": g["nmse"]}])
                    if "wgmma" in baselines and wgmma.supported(gpu.device_props()["cc"]):
                        variants["wgmma"] = lambda: dispatch.qmatmul(xd, w, kernel="wgmma_kq")
                        typed["wgmma"] = {"family": "wgmma_kq"}
                    if "empty" in baselines:     # the harness's floor at this point: one wave of empty CTAs
                        variants["empty"] = bench.EmptyLaunch(grid=4 * sm, threads=128)
                        typed["empty"] = {"family": "empty"}
                    if wd16 is not None:
                        x16 = xd if act == "f16" else xd.astype(cp.float16)
                        variants["cublas"] = (lambda x16=x16: blas.matmul_f16(x16, wd16)) if act == "f16" else \
                            (lambda: blas.matmul_f16(xd.astype(cp.float16), wd16))
                        typed["cublas"] = {"family": "cublas_f16"}
                    res = bench.interleaved(variants, pairs=pairs, repeats=repeats, flush=flusher,
                                            leads={v: lead for v in variants} if lead else None)
                    key = {"qtype": qtype, "od": od, "id": id_, "nt": nt, "act": act, "sm_count": sm,
                           "flush": flush, "lead_us": float(lead_us)}
                    pr = bench.pair_rows(res, key, nt, od, id_, tail={"bytes": nbytes})
                    for r in pr:
                        r.update({"family": "", "MT": 0, "WARPS": 0, "S": 0, "FORM": 0, "WAVE": 0,
                                  **typed[r["variant"]]})
                        if r["family"] == "empty":      # reads no weight bytes
                            r["bytes"] = 0
                        r["tb_per_s"] = r["bytes"] / (r["median_us"] * 1e-6) / 1e12
                        r["frac_copy"] = r["tb_per_s"] / cb["tb_per_s"]
                    rows += pr
                    if run is not None:
                        run.append("gemv_bench", pr)
                    med = {v: float(np.median([s["median_us"] for s in per])) for v, per in res.items()}
                    progress(f"{qtype} {od}x{id_} nt={nt} {act}: " + ", ".join(
                        f"{v} {t:.2f} us ({nbytes / t / 1e6 / cb['tb_per_s']:.0%})" for v, t in med.items()))
            del w, gv, wd16, w64, w16e, wv2
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def measure(run, progress=print, *, shapes, nts, qtypes, acts, pairs, repeats, seed, configs, splits, flush,
            lead_us) -> None:
    """The round into ``run`` (a new ``decode`` run, its params saying ``what: gemv_bench``): the benchmark."""
    run.meta["params"]["what"] = "gemv_bench"
    bench_gemv(run, shapes=[tuple(x) for x in shapes], nts=tuple(nts), qtypes=tuple(qtypes), acts=tuple(acts),
               pairs=pairs, repeats=repeats, seed=seed, configs=tuple(tuple(c) for c in configs),
               splits=tuple(splits), flush=flush, lead_us=lead_us, progress=progress)
