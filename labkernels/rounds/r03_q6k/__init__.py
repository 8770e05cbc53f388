"""Round 3 -- q6_K: the generic kernel vs the expanded-B kernel, against cuBLAS fp16 (``notebooks/03_q6k_expanded_b``).

Every case is parity-gated (:mod:`labkernels.cases`) before it is timed (:mod:`labkernels.bench`): interleaved
rounds of the round's variants (``registry.VARIANTS`` names), cuBLAS fp16 on cached dequantized weights (and with
the dequant), the prepass; the int8 mma.sync ceilings; per-round A/B ratios.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ... import bench, blas, cases, gpu
from ...kernels import registry
from .. import measure_into
from . import tile_ab

NOTEBOOK = "03_q6k_expanded_b"
DATA = ("q6k",)

#: round 3's kernels: the generic road and the two expanded-B epilogues (names of ``registry.VARIANTS``)
Q6K_VARIANTS = ("q6k_generic", "q6k_expb_epi0", "q6k_expb_epi1")

PLAN = {"shapes": [[4096, 4096], [11008, 4096], [4096, 11008]], "nts": [512, 3328, 4096],
        "variants": list(Q6K_VARIANTS), "stride": 210, "repeats": 20, "pairs": 3}

Q6K_PAIRS = (("q6k_generic", "q6k_expb_epi0"), ("q6k_generic", "q6k_expb_epi1"),
             ("cublas_f16_cached", "q6k_expb_epi0"), ("cublas_f16_cached", "q6k_expb_epi1"))


def bench_q6k(shapes, nts, variants=Q6K_VARIANTS, stride: int = 210, repeats: int = 20, pairs: int = 3, run=None,
              seed: int = 0, progress=print) -> list[dict]:
    """The q6_K variants (generic vs expanded-B) vs cuBLAS fp16 (cached dequantized weights, and including the
    dequant).

    Every case is parity-gated (subset of tokens, all rows, both references) before it is timed; a failed
    gate raises. Rows are appended to ``run`` (table ``q6k_bench`` / ``q6k_pairs``) as they are measured."""
    cp = gpu.cp()
    vs = [registry.variant(n) for n in variants]
    kdrs = sorted({v.p["KDR"] for v in vs if "KDR" in v.p})
    rng = np.random.default_rng(seed or None)
    flush = bench.Flusher()
    rows = []
    for od, id_ in shapes:
        w_raw = cases.synthetic_weights("q6_K", od, id_, rng)
        w = gpu.QWeight.upload(w_raw, "q6_K", stride)
        w16 = gpu.dequant_f16(w)
        for nt in nts:
            x, xg, x16, y, tokens = cases.point_inputs(rng, nt, od, id_)
            launch = cases.launchers(w, xg, y, vs)
            refs = cases.references(w_raw, "q6_K", x, tokens)
            variants_fn = {}
            for v in vs:   # parity gates first, on fresh outputs
                cases.gate_launch(launch[v.name], y, refs, f"{v.name} at nt={nt} od={od} id={id_}", run, v.name)
                variants_fn[v.name] = launch[v.name]
            y16 = cp.empty((nt, od), cp.float16)
            variants_fn["cublas_f16_cached"] = lambda: blas.matmul_f16(x16, w16, out=y16)
            variants_fn["cublas_f16_with_dequant"] = lambda: (gpu.dequant_f16(w, out=w16), blas.matmul_f16(x16, w16, out=y16))
            variants_fn["prepass"] = lambda: gpu.prepass(xg)
            t0 = time.time()
            res = bench.interleaved(variants_fn, pairs=pairs, repeats=repeats, flush=flush)
            new = bench.pair_rows(res, {"od": od, "id": id_, "nt": nt}, nt, od, id_,
                            {"kdr": kdrs[0] if len(kdrs) == 1 else None, "stride": stride})
            rows += new
            if run is not None:
                run.append("q6k_bench", new)
            progress(f"q6k od={od} id={id_} nt={nt}: " + ", ".join(
                f"{k} {np.median([s['median_us'] for s in v]):.1f}us" for k, v in res.items())
                + f" ({time.time() - t0:.1f} s)")
    return rows


def record_q6k(run, shapes, nts, variants=Q6K_VARIANTS, stride: int = 210, repeats: int = 20, pairs: int = 3,
               progress=print) -> list[dict]:
    """Round 3 into ``run``: parity-gated benchmark rows, the mma.sync ceilings, the A/B pair ratios."""
    rows = bench_q6k([tuple(s) for s in shapes], nts, variants=variants, stride=stride, repeats=repeats, pairs=pairs,
                     run=run, progress=progress)
    run.append("ceiling", [bench.mma_ceiling(16), bench.mma_ceiling(32)])
    run.append("q6k_pairs", sum((bench.pair_ratios(rows, a, b) for a, b in Q6K_PAIRS if {a, b} <= {r["variant"] for r in rows}),
                                []))
    return rows


def measure(run, progress=print, *, shapes, nts, variants, stride, repeats, pairs) -> None:
    """The round into ``run`` (a new ``q6k`` run)."""
    record_q6k(run, shapes, nts, variants=variants, stride=stride, repeats=repeats, pairs=pairs, progress=progress)


def step_q6k(out, args) -> dict:
    """``gpu-check --steps q6k``: the round with its plan (``--repeats``)."""
    runs = measure_into(sys.modules[__name__], root=out / "data", progress=args.log, repeats=args.repeats)
    return {"ok": True, "run": runs[DATA[0]].run_id}


def step_tile_ab(out, args) -> dict:
    """``gpu-check --steps tile_ab``: the tile skeleton's old vs new kernel builds at rounds 3 and 4's shapes."""
    return tile_ab.step_tile_ab(out, args)


STEPS = {"q6k": step_q6k, "tile_ab": step_tile_ab}
