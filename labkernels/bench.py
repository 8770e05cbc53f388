"""Benchmark harness: CUDA-event timings like the seeds measure.

* each timing: warm-up launches, then ``repeats`` launches each bracketed by CUDA events, the L2 flushed
  (a buffer of twice the L2 overwritten) before every timed launch so repeats do not measure the cache;
  reported as median with p20 / p80;
* A/B comparisons are *interleaved pairs* in one process (A, B, A, B, ...), each pair a ratio, so drift
  cannot fake a delta; the same variant timed against itself gives the noise floor;
* everything is normalized by work: us/GMAC and TOPS-equivalent (2*nt*od*id / s);
* every result row carries its shape and parameters; runs are recorded with provenance by
  :mod:`labkernels.records`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import cases


def _cp():
    import cupy

    return cupy


class Flusher:
    """Overwrites a buffer twice the L2 size (so no operand survives in L2 between timed launches)."""

    def __init__(self):
        from .gpu import device_props

        cp = _cp()
        self.buf = cp.empty(max(2 * device_props()["l2"], 64 << 20) // 4, dtype=cp.int32)
        self.i = 0

    def __call__(self):
        self.i += 1
        self.buf.fill(self.i)


def time_launches(fn, warmup: int = 3, repeats: int = 20, flush: Flusher | None = None) -> np.ndarray:
    """Per-launch device times in microseconds."""
    cp = _cp()
    for _ in range(warmup):
        fn()
    cp.cuda.get_current_stream().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    out = np.empty(repeats)
    for r in range(repeats):
        if flush:
            flush()
        start.record()
        fn()
        end.record()
        end.synchronize()
        out[r] = cp.cuda.get_elapsed_time(start, end) * 1e3
    return out


def stats(us: np.ndarray) -> dict:
    return {"median_us": float(np.median(us)), "p20_us": float(np.percentile(us, 20)),
            "p80_us": float(np.percentile(us, 80)), "n": int(us.size)}


def work(nt: int, od: int, id_: int, us: float) -> dict:
    gmac = nt * od * id_ / 1e9
    return {"gmac": gmac, "us_per_gmac": us / gmac, "tops_eq": 2 * gmac * 1e9 / (us * 1e-6) / 1e12}


def pair_rows(res: dict, key: dict, nt: int, od: int, id_: int, params: dict | None = None,
              tail: dict | None = None) -> list[dict]:
    """One row per (variant, interleaved round) of :func:`interleaved`'s result: the point's ``key`` columns,
    variant, pair, ``params``, the timing stats, the work-normalized figures, then ``tail``."""
    return [{**key, "variant": name, "pair": p, **(params or {}), **s, **work(nt, od, id_, s["median_us"]),
             **(tail or {})} for name, per in res.items() for p, s in enumerate(per)]


def interleaved(variants: dict, pairs: int = 3, repeats: int = 20, warmup: int = 3, flush=None) -> dict:
    """Time every variant once per round, ``pairs`` rounds, in order A, B, C, A, B, C, ...

    Returns {name: [stats per round]}; ratios are formed per round by the caller."""
    res = {k: [] for k in variants}
    for _ in range(pairs):
        for name, fn in variants.items():
            res[name].append(stats(time_launches(fn, warmup, repeats, flush)))
    return res


def mma_ceiling(k: int = 16, blocks_per_sm: int = 4, iters: int = 4096) -> dict:
    """TOPS of the register-fed mma.sync probe (the physical int8 tensor-core line)."""
    from .gpu import device_props, kernel

    cp = _cp()
    kern = kernel("mma_probe", K=k)
    chains = 8
    grid = device_props()["sm_count"] * blocks_per_sm
    out = cp.empty(grid * 256, dtype=cp.int32)
    fn = lambda: kern.launch((grid,), (out, np.int32(iters)))
    us = time_launches(fn, warmup=2, repeats=10)
    ops = grid * 8 * iters * chains * 2 * 16 * 8 * k
    s = stats(us)
    return {"k": k, "tops": ops / (s["median_us"] * 1e-6) / 1e12, **s}


# ------------------------------------------------------------------ round 3: q6_K


#: round 3's kernels: the generic road and the two expanded-B epilogues (names of ``registry.VARIANTS``)
Q6K_VARIANTS = ("q6k_generic", "q6k_expb_epi0", "q6k_expb_epi1")


def bench_q6k(shapes, nts, variants=Q6K_VARIANTS, stride: int = 210, repeats: int = 20, pairs: int = 3, run=None,
              seed: int = 0, progress=print) -> list[dict]:
    """The q6_K variants (generic vs expanded-B) vs cuBLAS fp16 (cached dequantized weights, and including the
    dequant).

    Every case is parity-gated (subset of tokens, all rows, both references) before it is timed; a failed
    gate raises. Rows are appended to ``run`` (table ``q6k_bench`` / ``q6k_pairs``) as they are measured."""
    from . import gpu
    from .kernels import registry

    cp = _cp()
    vs = [registry.variant(n) for n in variants]
    kdrs = sorted({v.p["KDR"] for v in vs if "KDR" in v.p})
    rng = np.random.default_rng(seed or None)
    flush = Flusher()
    rows = []
    for od, id_ in shapes:
        w_raw = cases.synthetic_weights("q6_K", od, id_, rng)
        w = gpu.QWeight.upload(w_raw, "q6_K", stride)
        w16 = gpu.dequant_f16(w)
        for nt in nts:
            x = (rng.standard_normal((nt, id_))).astype(np.float32)
            xg = cp.asarray(x)
            x16 = xg.astype(cp.float16)
            y = cp.full((nt, od), np.nan, cp.float32)
            tokens = np.sort(rng.choice(nt, size=min(nt, 24), replace=False))
            launch = cases.launchers(w, xg, y, vs)
            refs = cases.references(w_raw, "q6_K", x, tokens)
            variants_fn = {}
            for v in vs:   # parity gates first, on fresh outputs
                cases.gate_launch(launch[v.name], y, refs, f"{v.name} at nt={nt} od={od} id={id_}", run, v.name)
                variants_fn[v.name] = launch[v.name]
            y16 = cp.empty((nt, od), cp.float16)
            variants_fn["cublas_f16_cached"] = lambda: gpu.matmul_f16(x16, w16, out=y16)
            variants_fn["cublas_f16_with_dequant"] = lambda: (gpu.dequant_f16(w, out=w16), gpu.matmul_f16(x16, w16, out=y16))
            variants_fn["prepass"] = lambda: gpu.prepass(xg)
            t0 = time.time()
            res = interleaved(variants_fn, pairs=pairs, repeats=repeats, flush=flush)
            new = pair_rows(res, {"od": od, "id": id_, "nt": nt}, nt, od, id_,
                            {"kdr": kdrs[0] if len(kdrs) == 1 else None, "stride": stride})
            rows += new
            if run is not None:
                run.append("q6k_bench", new)
            progress(f"q6k od={od} id={id_} nt={nt}: " + ", ".join(
                f"{k} {np.median([s['median_us'] for s in v]):.1f}us" for k, v in res.items())
                + f" ({time.time() - t0:.1f} s)")
    return rows


def pair_ratios(rows, a: str, b: str) -> list[dict]:
    """Per-pair speed ratio time(a)/time(b) at matched shapes (> 1 means b is faster)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    out = []
    for (od, id_, nt), grp in df.groupby(["od", "id", "nt"]):
        ta = grp[grp.variant == a].set_index("pair").median_us
        tb = grp[grp.variant == b].set_index("pair").median_us
        for p in sorted(set(ta.index) & set(tb.index)):
            out.append({"od": od, "id": id_, "nt": nt, "a": a, "b": b, "pair": p, "ratio": ta[p] / tb[p]})
    return out


# ------------------------------------------------------------------ round 4: KDR sweep, and q4_K


def kernel_row(family: str, **params) -> dict:
    """Resources of one instantiation: registers/local memory (CUDA attributes), smem, blocks/SM from the
    CUDA occupancy API and from labkernels' calculator (h200 profile)."""
    from . import gpu, occupancy

    k = gpu.kernel(family, **params)
    calc = occupancy.occupancy("h200", k.spec.threads, k.regs, k.smem + k.static_smem)
    return {"kernel": k.spec.key, "regs": k.regs, "local_bytes": k.local_bytes, "dynamic_smem": k.smem,
            "api_blocks_per_sm": k.occupancy_api(), "calc_blocks_per_sm": calc["blocks_per_sm"],
            "calc_limiter": calc["limiter"], "occupancy": calc["occupancy"]}


SWEEP_VARIANTS = {
    "q6_K": [dict(EPI=e, OCC=o) for e, o in ((0, 2), (1, 1), (1, 2), (0, 1))],
    "q4_K": [dict()],
}
SWEEP_KDR = {"q6_K": (1, 2, 4, 8), "q4_K": (2, 4, 8)}


def kdr_sweep(shapes, nts, repeats: int = 10, run=None, seed: int = 0, progress=print,
              qtypes=("q6_K", "q4_K")) -> list[dict]:
    """Staging depth (KDR) x variant x nt x shape: us/GMAC, TOPS-eq (p20/p80), registers, spills, smem,
    blocks/SM (API and calculator). Each (variant, shape) is parity-gated once before its timings; rows
    are appended to ``run`` point by point (table ``sweep``)."""
    from . import gpu
    from .kernels import registry

    cp = _cp()
    rng = np.random.default_rng(seed or None)
    flush = Flusher()
    rows = []
    for qtype in qtypes:
        fam = registry.default_variant(qtype).family
        for od, id_ in shapes[qtype]:
            w_raw = cases.synthetic_weights(qtype, od, id_, rng)
            w = gpu.QWeight.upload(w_raw, qtype)
            xs = {nt: cp.asarray(rng.standard_normal((nt, id_)).astype(np.float32)) for nt in nts}
            planes = {nt: gpu.prepass(x) for nt, x in xs.items()}
            for kdr in SWEEP_KDR[qtype]:
                for var in SWEEP_VARIANTS[qtype]:
                    params = {"KDR": kdr, **var}
                    if qtype == "q6_K":
                        params["STRIDE"] = 210
                    info = kernel_row(fam, **params)
                    # parity gate once per (kernel, shape), at the smallest nt that holds 24 tokens
                    ntg = min(n for n in nts if n >= 24) if any(n >= 24 for n in nts) else nts[0]
                    y = cp.full((ntg, od), np.nan, cp.float32)
                    gpu.gemm(w, planes[ntg], fam, out=y, **{k: v for k, v in params.items() if k != "STRIDE"})
                    x_host = cp.asnumpy(xs[ntg])
                    tok = np.sort(rng.choice(ntg, size=min(ntg, 24), replace=False))
                    gate = cases.check(y, cases.references(w_raw, qtype, x_host, tok),
                                       f"{info['kernel']} od={od} id={id_}")
                    for nt in nts:
                        y = cp.empty((nt, od), cp.float32)
                        fn = (lambda nt=nt, y=y: gpu.gemm(w, planes[nt], fam, out=y,
                                                            **{k: v for k, v in params.items() if k != "STRIDE"}))
                        s = stats(time_launches(fn, 2, repeats, flush))
                        row = {"qtype": qtype, "od": od, "id": id_, "nt": nt, "kdr": kdr, **var, **info, **s,
                               **work(nt, od, id_, s["median_us"]), "max_rel_err": gate["max_rel_err"],
                               "nmse": gate["nmse"]}
                        rows.append(row)
                        if run is not None:
                            run.append("sweep", row)
                    progress(f"sweep {info['kernel']} od={od} id={id_}: regs {info['regs']} local "
                             f"{info['local_bytes']} B, {info['api_blocks_per_sm']} blk/SM, best "
                             f"{max(r['tops_eq'] for r in rows if r['kernel'] == info['kernel'] and r['od'] == od and r['id'] == id_):.0f} TOPS")
    return rows


def bench_q4k(shapes, nts, variant: str = "q4k_nb_kdr4", repeats: int = 20, pairs: int = 3, run=None, seed: int = 0,
              progress=print) -> list[dict]:
    """A q4_K raw-nibble variant vs cuBLAS fp16 on cached dequantized weights (and with the dequant)."""
    from . import gpu
    from .kernels import registry

    cp = _cp()
    v = registry.variant(variant)
    rng = np.random.default_rng(seed or None)
    flush = Flusher()
    rows = []
    for od, id_ in shapes:
        w_raw = cases.synthetic_weights("q4_K", od, id_, rng)
        w = gpu.QWeight.upload(w_raw, "q4_K")
        w16 = gpu.dequant_f16(w)
        for nt in nts:
            x = rng.standard_normal((nt, id_)).astype(np.float32)
            xg = cp.asarray(x)
            x16 = xg.astype(cp.float16)
            y = cp.full((nt, od), np.nan, cp.float32)
            tokens = np.sort(rng.choice(nt, size=min(nt, 24), replace=False))
            fn = cases.launchers(w, xg, y, [v])[v.name]
            g = cases.gate_launch(fn, y, cases.references(w_raw, "q4_K", x, tokens),
                                  f"{v.name} at nt={nt} od={od} id={id_}", run, v.name)
            y16 = cp.empty((nt, od), cp.float16)
            variants = {
                v.name: fn,
                "cublas_f16_cached": lambda: gpu.matmul_f16(x16, w16, out=y16),
                "cublas_f16_with_dequant": lambda: (gpu.dequant_f16(w, out=w16), gpu.matmul_f16(x16, w16, out=y16)),
                "prepass": lambda: gpu.prepass(xg),
            }
            res = interleaved(variants, pairs=pairs, repeats=repeats, flush=flush)
            new = pair_rows(res, {"od": od, "id": id_, "nt": nt}, nt, od, id_, {"kdr": v.p["KDR"]},
                            {"max_rel_err": g["max_rel_err"], "nmse": g["nmse"]})
            rows += new
            if run is not None:
                run.append("q4k_bench", new)
            progress(f"q4k od={od} id={id_} nt={nt}: " + ", ".join(
                f"{k} {np.median([s['median_us'] for s in v]):.1f}us" for k, v in res.items()))
    return rows


# ------------------------------------------------------------------ recorded rounds (gpu-check steps and notebooks)

Q6K_PAIRS = (("q6k_generic", "q6k_expb_epi0"), ("q6k_generic", "q6k_expb_epi1"),
             ("cublas_f16_cached", "q6k_expb_epi0"), ("cublas_f16_cached", "q6k_expb_epi1"))


def record_q6k(run, shapes, nts, variants=Q6K_VARIANTS, stride: int = 210, repeats: int = 20, pairs: int = 3,
               progress=print) -> list[dict]:
    """Round 3 into ``run``: parity-gated benchmark rows, the mma.sync ceilings, the A/B pair ratios."""
    rows = bench_q6k([tuple(s) for s in shapes], nts, variants=variants, stride=stride, repeats=repeats, pairs=pairs,
                     run=run, progress=progress)
    run.append("ceiling", [mma_ceiling(16), mma_ceiling(32)])
    run.append("q6k_pairs", sum((pair_ratios(rows, a, b) for a, b in Q6K_PAIRS if {a, b} <= {r["variant"] for r in rows}),
                                []))
    return rows


def record_q4k(run, shapes, nts, variant: str = "q4k_nb_kdr4", repeats: int = 20, pairs: int = 3,
               progress=print) -> list[dict]:
    """The q4_K benchmark into ``run``: parity-gated rows and the cuBLAS A/B pair ratios."""
    rows = bench_q4k([tuple(s) for s in shapes], nts, variant=variant, repeats=repeats, pairs=pairs, run=run,
                     progress=progress)
    run.append("q4k_pairs", pair_ratios(rows, "cublas_f16_cached", variant))
    return rows
