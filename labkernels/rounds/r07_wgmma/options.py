"""Round 7's build-option A/Bs: one form of the production kernel against another through :func:`option_ab` (the
benchmark's own timing and gates) -- the epilogue forms, the A-fragment sets, the L2 prefetch, the pair exchange,
the staged store, the reduce finish, the timing method, two converters, the scale plane (``*_AB`` plans, ``*_ab`` runs)."""

from __future__ import annotations


import numpy as np

from ...kernels import registry
from ...wgmma import kernel
from .benchmark import REAL_MODEL_FORMS, SHAPES, bench, real_model_rows
from .tables import suffix_ab


# ------------------------------------------------------------------------------------------- the epilogue A/B

#: the epilogue-form and tile-aligned-split experiment (``gpu check --steps wgmma_epi``): the one-segment-per-CTA
#: schedulers (SK 0, 2, 3) with the plain epilogue and the new forms, and the stream-K launches (plain only) that
#: the benchmark of record found best at some nt <= 1024 -- tuples (BN, STAGES, SCL or None, SK, FORM, EPI)
EPI_AB = {"shapes": [list(s) for s in SHAPES], "nts": [256, 512, 1024], "qtypes": ["q4_K", "q6_K"],
          "variants": [[256, 4, None, 2, 0, e] for e in (0, 1, 2)] + [[256, 4, None, 3, 0, e] for e in (0, 1, 2)]
          + [[128, 4, None, 0, 0, e] for e in (0, 2)] + [[256, 4, None, 0, 0, e] for e in (0, 2)]
          + [[256, 4, None, 1, 0, 0], [128, 4, None, 1, 0, 0]],     # stream-K (the plain epilogue only)
          "pairs": 3, "repeats": 10}


def option_ab(run, defaults: dict, table: str, forms, plan=None, progress=print, seed: int = 0) -> None:
    """One build-option A/B into ``run``: the real-model gates of the forms it adds (the :data:`REAL_MODEL_FORMS`
    where ``forms(f)``) on every Gemma tensor, then the plan (``defaults`` updated by ``plan``) interleaved per point
    with cuBLAS by :func:`bench` into its own ``table`` (``auto`` keeps reading the benchmark of record)."""
    p = {**defaults, **(plan or {})}
    rng = np.random.default_rng(seed or None)
    new = tuple(f for f in REAL_MODEL_FORMS if forms(f))
    run.append("real_model_parity", real_model_rows(rng, progress, forms=new))
    bench([tuple(s) for s in p["shapes"]], p["nts"], p["qtypes"], [tuple(v) for v in p["variants"]],
          pairs=p["pairs"], repeats=p["repeats"], run=run, progress=progress, table=table)


def epi_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """The epilogue forms (EPI 1 / 2) and the tile-aligned split (SK=3) against the plain launches and cuBLAS,
    interleaved per point (:func:`bench`, its own table ``wgmma_epi_ab``: ``auto`` keeps reading the benchmark of
    record), after the real-model gates of the new forms on every Gemma tensor."""
    option_ab(run, EPI_AB, "wgmma_epi_ab", lambda f: f[1] == 3 or f[3], plan, progress, seed)


# ------------------------------------------------------------------------------------- the A-fragment-set A/B

#: the four-A-set experiment (``gpu check --steps wgmma_aq``): BN=128 with AQ 2 and 4 under the data-parallel,
#: stream-K and tile-aligned split grids, beside BN=256's best nt=512 schedulers and cuBLAS -- tuples (BN, STAGES,
#: SCL or None, SK, FORM, EPI, AQ)
AQ_AB = {"shapes": [list(s) for s in SHAPES], "nts": [256, 512, 1024], "qtypes": ["q4_K", "q6_K"],
         "variants": [[128, 4, None, sk, 0, 0, aq] for sk in (0, 1, 3) for aq in (2, 4)]
         + [[256, 4, None, 1], [256, 4, None, 3]],
         "pairs": 3, "repeats": 10}


def aq_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """AQ=4 against AQ=2 (and BN=256's nt=512 schedulers, cuBLAS), interleaved per point (:func:`bench`, its own
    table ``wgmma_aq_ab``: ``auto`` keeps reading the benchmark of record), after the real-model gates of the AQ=4
    forms on every Gemma tensor."""
    option_ab(run, AQ_AB, "wgmma_aq_ab", lambda f: len(f) > 4 and f[4] != 2, plan, progress, seed)


# ------------------------------------------------------------------------------------------- the L2-prefetch A/B

#: the L2-prefetch experiment (``gpu check --steps wgmma_pf``; ncu run 20261202T005336Z: q6_K's consumers stall on
#: their weight loads, 1.4-2.0 warps per issued instruction in long_scoreboard): PF 0 / 1 / 2 on the nt=512 and
#: nt=4096 launches of record -- tuples (BN, STAGES, SCL or None, SK, FORM, EPI, AQ, PF)
PF_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
         "variants": [[256, 4, None, 3, 0, 0, 2, p] for p in (0, 1, 2)] + [[256, 4, None, 0, 0, 0, 2, p] for p in (0, 1, 2)]
         + [[128, 4, None, 0, 0, 0, 2, p] for p in (0, 1, 2)] + [[128, 4, None, 3, 0, 0, 2, p] for p in (0, 2)]
         + [[256, 4, None, 1]],
         "pairs": 3, "repeats": 10}


def pf_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """The L2 prefetch (PF 1 / 2) against none, interleaved per point with cuBLAS (:func:`bench`, its own table
    ``wgmma_pf_ab``), after the real-model gates of the PF forms on every Gemma tensor."""
    option_ab(run, PF_AB, "wgmma_pf_ab", lambda f: len(f) > 5 and f[5], plan, progress, seed)


# ------------------------------------------------------------------------------------------- the pair-exchange A/B

#: the pair exchange (``gpu check --steps wgmma_pair``): EPI=3 on the tile-aligned split (SK=3) where it gives two
#: CTAs per tile, against the plain epilogue on the same grid, stream-K and cuBLAS -- tuples as in :data:`PLAN`
PAIR_AB = {"shapes": [list(s) for s in SHAPES], "nts": [256, 512, 1024], "qtypes": ["q4_K", "q6_K"],
           "variants": [[256, 4, None, 3, 0, e] for e in (0, 3)] + [[128, 4, None, 3, 0, e] for e in (0, 3)]
           + [[256, 4, None, 1], [128, 4, None, 1]],
           "pairs": 3, "repeats": 10}


def pair_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """EPI=3 against the plain epilogue on SK=3's grid, stream-K and cuBLAS, interleaved per point (:func:`bench`,
    its own table ``wgmma_pair_ab``; a point where SK=3 does not give two CTAs per tile is recorded as not
    applicable), after the real-model gates of the EPI=3 forms."""
    occ = [{"kernel": k.key, "cluster": 2, "max_active_clusters": kernel(k.family, **k.p).max_active_clusters(2)}
           for k in registry.family("wgmma_kq") if k.p["EPI"] == 3]
    run.append("cluster_occupancy", occ)
    progress("2-CTA clusters resident at once: " + ", ".join(f"{o['kernel']} {o['max_active_clusters']}" for o in occ))
    option_ab(run, PAIR_AB, "wgmma_pair_ab", lambda f: f[3] == 3, plan, progress, seed)


# --------------------------------------------------------------------------------------------- the staged-store A/B

#: the staged TMA store (``gpu check --steps wgmma_staged``): EPI=4 against the plain epilogue on the same grid --
#: data-parallel and stream-K at BN=256 (nt=4096's launches of record, ~10 tiles per CTA), BN=128 data-parallel and
#: SK=3 (nt=512's), beside cuBLAS -- tuples as in :data:`PLAN`
STAGED_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 2048, 4096], "qtypes": ["q4_K", "q6_K"],
             "variants": [[256, 4, None, sk, 0, e] for sk in (0, 1) for e in (0, 4)]
             + [[128, 4, None, 0, 0, e] for e in (0, 4)] + [[256, 4, None, 3, 0, e] for e in (0, 4)],
             "pairs": 3, "repeats": 10}


def staged_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """EPI=4 against the plain epilogue, interleaved per point with cuBLAS (:func:`bench`, its own table
    ``wgmma_staged_ab``), after the real-model gates of the EPI=4 forms on every Gemma tensor."""
    option_ab(run, STAGED_AB, "wgmma_staged_ab", lambda f: f[3] == 4, plan, progress, seed)


# ------------------------------------------------------------------------------------------- the reduce-finish A/B

#: the reduce finish (``gpu check --steps wgmma_reduce``; trace run 20261202T190840Z: on the nt=512 split grids the
#: owner's finish -- the helper's partial sums through the workspace, its flag, the fold, the store -- takes 4.7-7.0
#: us of a ~30 us launch): EPI=5 against EPI=0 and EPI=4 on the same grids (the tile-aligned split and stream-K at
#: both tiles; EPI=3 where it pairs), beside BN=128 data-parallel and cuBLAS, at the bar's nt=512 and at nt=4096 --
#: tuples as in :data:`PLAN`; a point whose grid puts three CTAs on a tile is recorded as not applicable
REDUCE_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
             "variants": [[256, 4, None, 3, 0, e] for e in (0, 3, 4, 5)] + [[256, 4, None, 1, 0, e] for e in (0, 4, 5)]
             + [[128, 4, None, 1, 0, e] for e in (0, 4, 5)] + [[128, 4, None, 0]],
             "pairs": 3, "repeats": 10}


def reduce_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """EPI=5 against the plain and staged epilogues on the same grids, interleaved per point with cuBLAS
    (:func:`bench`, its own table ``wgmma_reduce_ab``), after the real-model gates of the EPI=5 forms on every Gemma
    tensor."""
    option_ab(run, REDUCE_AB, "wgmma_reduce_ab", lambda f: f[3] == 5, plan, progress, seed)


# ------------------------------------------------------------------------------------- the timing method A/B

#: the timing A/B (``gpu check --steps wgmma_lead``): every call of the launches of record and of cuBLAS timed as the
#: benchmark times it (events right after the flush) and behind a 500 us GPU wait (:class:`labkernels.bench.Lead`),
#: call by call, with each call's host time -- does the host path of ``gemm()`` outlast the flush, so that the GPU
#: waits inside the timed interval? Tuples as in :data:`PLAN`.
LEAD_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
           "variants": [[256, 4, None, 3, 0, 5], [256, 4, None, 1, 0, 5], [128, 4, None, 1, 0, 0],
                        [128, 4, None, 0], [256, 4, None, 0]],
           "leads_us": [500], "pairs": 3, "repeats": 10}


def lead_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """The timing A/B of :data:`LEAD_AB` into ``run`` (table ``wgmma_lead_ab``; no kernel is new, so no real-model
    gates beyond :func:`bench`'s own per point)."""
    p = {**LEAD_AB, **(plan or {})}
    bench([tuple(s) for s in p["shapes"]], p["nts"], p["qtypes"], [tuple(v) for v in p["variants"]],
          pairs=p["pairs"], repeats=p["repeats"], run=run, progress=progress, table="wgmma_lead_ab",
          leads_us=tuple(p["leads_us"]), int8=False, seed=seed)


# ------------------------------------------------------------------------------------- the two-converter A/B

#: two converter warpgroups for the shared-memory form (``gpu check --steps wgmma_conv2``): FORM=2 against FORM=1
#: (one converter) at BN=128 under both schedulers, beside the register form's launches and cuBLAS (q4_K) --
#: tuples as in :data:`PLAN`
CONV2_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K"],
            "variants": [[128, 4, None, sk, f] for sk in (0, 1) for f in (1, 2)]
            + [[128, 4, None, 0], [256, 4, None, 0], [256, 4, None, 1], [256, 4, None, 3]],
            "pairs": 3, "repeats": 10}


def conv2_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """FORM=2 against FORM=1 and the register form, interleaved per point with cuBLAS (:func:`bench`, its own table
    ``wgmma_conv2_ab``), after the real-model gates of the FORM=2 forms on every Gemma q4_K tensor."""
    option_ab(run, CONV2_AB, "wgmma_conv2_ab", lambda f: f[2] == 2, plan, progress, seed)


#: the scale plane's A/B (``gpu check --steps wgmma_plane``): q4_K BN=128 with the plane (SCL=2) against the header
#: decode (SCL=0) under three schedulers, beside the BN=256 split grids, at nt 512 and 4096
PLANE_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K"],
            "variants": [[128, 4, scl, sk] for sk in (0, 1, 3) for scl in (0, 2)] + [[256, 4, 0, 1], [256, 4, 0, 3]],
            "pairs": 3, "repeats": 10}


def plane_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """SCL=2 against SCL=0 and the BN=256 launches, interleaved per point with cuBLAS (:func:`bench`, its own table
    ``wgmma_plane_ab``), after the real-model gates of the SCL=2 forms on every Gemma q4_K tensor."""
    option_ab(run, PLANE_AB, "wgmma_plane_ab", lambda f: len(f) > 6 and f[6] == 2, plan, progress, seed)


def plane_table(ab_df):
    """The scale plane's A/B as one row per (point, scheduler): median(SCL=0) / median(SCL=2) over the interleaved
    pairs (> 1: the plane is faster) and each one's ratio to cuBLAS fp16 (cached) -- :func:`suffix_ab` with each
    SCL=2 variant named as its SCL=0 base plus ``_plane``."""
    plane = ab_df.variant.str.contains("_scl2")
    named = ab_df.assign(variant=ab_df.variant.where(~plane, ab_df.variant.str.replace("_scl2", "_scl0") + "_plane"))
    t = suffix_ab(named, suffixes=("_plane",))
    if t.empty:
        return t
    return (t.rename(columns={"speedup": "plane_over_header", "option_vs_cublas": "plane_vs_cublas",
                              "base_vs_cublas": "header_vs_cublas"})
            [["qtype", "od", "id", "nt", "launch", "plane_over_header", "plane_vs_cublas", "header_vs_cublas"]])
