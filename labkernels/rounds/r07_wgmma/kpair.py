"""Round 7's KPAIR family and the shared-memory form: the k-split pair build and its ablations (half B, decoupled,
no conversion), the shared-memory form with one and two converters, the shared-memory bandwidth model against
Nsight Compute (:func:`smem_model`, :func:`smem_table`), their A/Bs and tables."""

from __future__ import annotations

import re

import numpy as np

from ... import bench as B
from ... import model, wgmma
from ...wgmma import BLOCK_BYTES, QK, WgWeight, gate, int8_path_error, main_scl
from . import builds as wb
from .builds import KPAIR, KPAIR_PARAMS
from .benchmark import SHAPES
from .limits import _gate_point, _plan_launches, _plan_points, _time_with_cublas
from .tables import medians


#: one 64-row x 256-token tile per CTA, k split between its two consumer warpgroups (every other super-block), 2-CTA
#: clusters multicasting the activations (``gpu check --steps wgmma_kpair``, exploratory build -DLK_EXP_KPAIR):
#: against the launches of record (BN, scheduler, EPI) and cuBLAS fp16 at the bar's shapes, nt 512 and 4096; every
#: launch parity-gated at its point
#: LK_ABLATE_HALFB: the KPAIR build whose CTAs each receive only their own producer's half of every activation stage
#: (timing only; round 7's twenty-second step)
HALFB = ("LK_EXP_KPAIR", "LK_ABLATE_HALFB")
#: its A/B: the KPAIR build and its half-B ablation beside the launches of record and cuBLAS (od = 4096 shapes)
HALFB_AB = {"shapes": [[4096, 4096], [4096, 14336]], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
            "launches": [[256, 3, 5], [128, 0, 0], [256, 0, 0]], "pairs": 3, "repeats": 10}
#: LK_ABLATE_DECOUPLE: the half-B build whose consumers release a stage on their own CTA's empty barrier only (no
#: remote arrive): the pair's lock-step gone, the bytes received the half-B build's (timing only; round 7's
#: twenty-fourth step)
DECOUPLED = ("LK_ABLATE_DECOUPLE", "LK_ABLATE_HALFB", "LK_EXP_KPAIR")
#: LK_ABLATE_NOCONV of the KPAIR build and of the decoupled one: the consumers convert nothing (their A fragments
#: converted once before the loop; the weights' loads die): the loop's wgmmas, barriers and ring alone
KPAIR_NOCONV = ("LK_ABLATE_NOCONV", "LK_EXP_KPAIR")
DECOUPLED_NOCONV = ("LK_ABLATE_DECOUPLE", "LK_ABLATE_HALFB", "LK_ABLATE_NOCONV", "LK_EXP_KPAIR")
#: the KPAIR build and its ablations by short name (the ncu cases' ``who``, the A/B's variant suffix ``_<name>``)
KPAIR_BUILDS = {"kpair": KPAIR, "halfb": HALFB, "decoupled": DECOUPLED, "noconv": KPAIR_NOCONV,
                "decoupled_noconv": DECOUPLED_NOCONV}
#: what each ablation is, in a few words (figures and tables)
KPAIR_BUILD_LABELS = {"kpair": "KPAIR", "halfb": "KPAIR, half B", "decoupled": "KPAIR, half B, decoupled",
                      "noconv": "KPAIR, no conversion", "decoupled_noconv": "KPAIR, half B, decoupled, no conversion"}
#: the twenty-fourth step's A/B: the KPAIR build and its four ablations at the half-B step's points
DECOUPLE_AB = HALFB_AB
DECOUPLE_ABLATIONS = {f"_{k}": v for k, v in KPAIR_BUILDS.items() if k != "kpair"}
#: the twenty-third step: the shared-memory form (q4_K, data-parallel, BN=128) with one and two converter warpgroups,
#: each beside its LK_ABLATE_NOCONV build (the converters store nothing: timing only), the register form's BN=128
#: launch and its no-conversion skeleton, BN=256 at nt=4096, and cuBLAS
SMEMFORM_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K"], "pairs": 3, "repeats": 10}
NOCONV = ("LK_ABLATE_NOCONV",)


def smemform_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """The shared-memory form against its own no-conversion ablation (``gpu check --steps wgmma_smemform``): at each
    point of :data:`SMEMFORM_AB`, same process, interleaved, L2 flushed, data-parallel grids: ``wgmma_smem_bn128_s4``
    (FORM=1) and ``..._c2`` (FORM=2), the register form's ``wgmma_bn128_s4_scl0`` (and ``wgmma_bn256_s4_scl0`` at
    nt > 512), each gated (NaN-poisoned output, :func:`gate`; a failure raises) before it is timed; beside them the
    ``_noconv`` builds of the three BN=128 launches (timing only) and cuBLAS fp16 on cached dequantized weights.
    Rows: ``wgmma_smemform_ab`` and ``wgmma_smemform_gate``."""
    p = {**SMEMFORM_AB, **(plan or {})}
    rng = np.random.default_rng(seed or None)
    cp = wgmma._cp()
    flush = B.Flusher()
    rows = []
    for qtype, od, id_, nt, pt in _plan_points(p, rng):
        pt.w.gguf = pt.wq.raw   # the shared-memory form reads the GGUF rows as uploaded
        launches = {"wgmma_smem_bn128_s4": dict(BN=128, STAGES=4, FORM=1),
                    "wgmma_smem_bn128_s4_c2": dict(BN=128, STAGES=4, FORM=2),
                    "wgmma_bn128_s4_scl0": dict(BN=128, SCL=main_scl(qtype, 128))}
        if nt > 512:
            launches["wgmma_bn256_s4_scl0"] = dict(BN=256, SCL=main_scl(qtype, 256))
        calls = {}
        for v, prm in launches.items():
            pt.y.fill(np.nan)
            wb.gemm(pt.w, pt.x16, out=pt.y, **prm)
            _gate_point(run, "wgmma_smemform_gate", qtype, od, id_, nt, v, pt)
            calls[v] = lambda prm=prm: wb.gemm(pt.w, pt.x16, out=pt.y, **prm)
        y_x = cp.empty_like(pt.y)   # the ablations' Y: never read
        for v in ("wgmma_smem_bn128_s4", "wgmma_smem_bn128_s4_c2", "wgmma_bn128_s4_scl0"):
            calls[v + "_noconv"] = lambda prm=launches[v]: wb.gemm(pt.w, pt.x16, out=y_x, defines=NOCONV, **prm)
        rows += _time_with_cublas(run, "smemform", calls, (qtype, od, id_, nt), pt, p, flush, progress)
    return rows


def smemform_table(ab_df):
    """The twenty-third step's A/B per point: each launch's and each no-conversion build's ratio to cuBLAS fp16
    (cuBLAS / launch, medians over the interleaved rounds), and what the conversion costs each BN=128 form
    (``conv_cost`` = its time / its no-conversion build's time)."""
    import pandas as pd

    m = medians(ab_df)
    rows = []
    for k, g in m.groupby(["qtype", "od", "id", "nt"]):
        us = dict(zip(g.variant, g.median_us))
        cb = us.get("cublas_f16_cached")
        if cb is None:
            continue
        for v in ("wgmma_smem_bn128_s4", "wgmma_smem_bn128_s4_c2", "wgmma_bn128_s4_scl0", "wgmma_bn256_s4_scl0"):
            if v not in us:
                continue
            nc = us.get(v + "_noconv")
            rows.append({**dict(zip(["qtype", "od", "id", "nt"], k)), "launch": v.removeprefix("wgmma_"),
                         "us": us[v], "vs_cublas": cb / us[v],
                         "noconv_vs_cublas": cb / nc if nc else np.nan, "conv_cost": us[v] / nc if nc else np.nan})
    return pd.DataFrame(rows)


#: the tensor pipe's fp16 rate, MACs per SM per clock (dense, sm_90)
MACS_PER_CLK = 2048


def smem_bytes_per_clk(rows: int, tokens: int, a_in_smem: bool = False, a_written: bool = False,
                       recv_tokens: int | None = None) -> dict:
    """Shared-memory bytes per SM per clock that a CTA tile of ``rows`` weight rows x ``tokens`` tokens moves while the
    tensor pipe runs at its full fp16 rate (:data:`MACS_PER_CLK`), by source (a model, round 7's twenty-second step):

    * ``b_read``: wgmma's reads of B (the activations) -- an m64nNk16 reads N x 16 x 2 bytes for 64 N 16 MACs, 1/32
      byte per MAC whatever N, so 64 B/clk;
    * ``b_write``: the TMA's writes of the activation tile: ``recv_tokens`` (default ``tokens``) x k x 2 bytes per
      rows x tokens x k MACs;
    * ``a_read`` (``a_in_smem``: A from shared memory, the SS form): 64 x 16 x 2 bytes per wgmma, 2/tokens per MAC;
    * ``a_write`` (``a_written``: A staged through shared memory -- by TMA as fp16, or by converter warps): 2/tokens
      per MAC.
    The register form (the lab's main path) has b_read + b_write only."""
    recv = tokens if recv_tokens is None else recv_tokens
    r = {"b_read": MACS_PER_CLK / 32.0, "b_write": MACS_PER_CLK * 2.0 * recv / (rows * tokens),
         "a_read": MACS_PER_CLK * 2.0 / tokens if a_in_smem else 0.0,
         "a_write": MACS_PER_CLK * 2.0 / tokens if a_written else 0.0}
    r["total"] = sum(r.values())
    return r


KPAIR_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
            "launches": [[256, 3, 5], [256, 1, 5], [128, 1, 0], [128, 0, 0], [256, 0, 0]], "pairs": 3, "repeats": 10}
KPAIR_VARIANT = "wgmma_kpair_bn256"
#: the real-model gates of the build: every Gemma 3 270M q4_K / q6_K tensor at these token counts (37: one token
#: tile, most of it past nt; 300: a second tile 44 tokens deep)
KPAIR_REAL_NTS = (37, 300)


def kpair_real_rows(rng, progress=print, nts=KPAIR_REAL_NTS, defines=KPAIR, variant=None) -> list[dict]:
    """Every q4_K / q6_K tensor of Gemma 3 270M (all rows, fresh random tokens at each of ``nts``) through the
    ``LK_EXP_KPAIR`` launch (or the form of it that ``defines`` name, its rows under ``variant``), NaN-poisoned output,
    :func:`gate` against gguf-py's float64 dequantization and the kernel's exact weights, the int8 q8_1 path's error on
    the same inputs beside it; a failed gate raises."""
    cp = wgmma._cp()
    rows = []
    for name, qtype, raw in model.load_kquant():
        raw = np.ascontiguousarray(raw)
        id_ = raw.shape[1] // BLOCK_BYTES[qtype] * QK
        w = WgWeight.from_gguf(raw, qtype)
        for nt in nts:
            x = rng.standard_normal((nt, id_)).astype(np.float32)
            y = cp.full((nt, raw.shape[0]), np.nan, cp.float32)
            wb.gemm(w, cp.asarray(x), out=y, defines=defines, **KPAIR_PARAMS)
            g = gate(cp.asnumpy(y), raw, qtype, x, packed=cp.asnumpy(w.packed))
            i8 = int8_path_error(raw, qtype, x)
            rows.append({"tensor": name, "qtype": qtype, "od": raw.shape[0], "id": id_, "nt": nt,
                         "variant": variant or KPAIR_VARIANT, **g, "int8_max_rel_err_f64": i8["max_rel_err_f64"],
                         "int8_nmse": i8["nmse"]})
            if not g["ok"]:
                raise AssertionError(f"real-model gate failed: {name} {' '.join(defines)} nt={nt}: {g}")
    if not rows:
        raise AssertionError("no real-model gate ran: the model has no q4_K / q6_K tensor")
    progress(f"kpair real model ({' '.join(defines)}): {len(rows)} gates passed; max rel err vs float64 "
             f"{max(r['max_rel_err_f64'] for r in rows):.2e} (int8 q8_1 path "
             f"{max(r['int8_max_rel_err_f64'] for r in rows):.2e})")
    return rows


def kpair_ab(run=None, plan=None, progress=print, seed: int = 0, ablations: dict | None = None,
             builds: dict | None = None) -> list[dict]:
    """The ``LK_EXP_KPAIR`` build (:data:`KPAIR_PARAMS`, :func:`kpair_grid` CTAs in 2-CTA clusters) against the
    launches of record of the plan (:func:`_plan_launches`) and cuBLAS fp16 on cached dequantized weights, same
    process, interleaved, L2 flushed. First every Gemma tensor through the build (:func:`kpair_real_rows`, run table
    ``real_model_parity``); then at each point every launch -- the build's included -- is gated (NaN-poisoned output,
    :func:`gate`; a failure raises) before it is timed. ``ablations``: variant suffix -> defines of ablation builds of
    the KPAIR build (e.g. :data:`HALFB`), timed beside it as ``KPAIR_VARIANT + suffix``, never gated (timing only:
    their Y means nothing). ``builds``: variant suffix -> defines of other forms of the build that compute Y (e.g.
    :data:`KPAIR_FIN`): real-model gated as the build is (``real_model_parity``, their variant named) and gated and
    timed at every point beside it. Rows: ``wgmma_kpair_ab`` (the build's variant :data:`KPAIR_VARIANT`) and
    ``wgmma_kpair_gate``."""
    p = {**KPAIR_AB, **(plan or {})}
    rng = np.random.default_rng(seed or None)
    if run is not None:
        run.append("real_model_parity", kpair_real_rows(rng, progress))
        for sfx, d in (builds or {}).items():
            run.append("real_model_parity", kpair_real_rows(rng, progress, defines=d, variant=KPAIR_VARIANT + sfx))
    cp = wgmma._cp()
    flush = B.Flusher()
    sm = wgmma._sm_count(cp.cuda.Device().id)
    rows = []
    for qtype, od, id_, nt, pt in _plan_points(p, rng):
        launches = dict(_plan_launches(p, qtype, nt, od, id_, sm))
        calls = {v: (lambda prm=prm: wb.gemm(pt.w, pt.x16, out=pt.y, **prm)) for v, prm in launches.items()}
        calls[KPAIR_VARIANT] = lambda: wb.gemm(pt.w, pt.x16, out=pt.y, defines=KPAIR, **KPAIR_PARAMS)
        for sfx, d in (builds or {}).items():
            calls[KPAIR_VARIANT + sfx] = lambda d=d: wb.gemm(pt.w, pt.x16, out=pt.y, defines=d, **KPAIR_PARAMS)
        for v, call in calls.items():
            pt.y.fill(np.nan)
            call()
            _gate_point(run, "wgmma_kpair_gate", qtype, od, id_, nt, v, pt)
        y_x = cp.empty_like(pt.y)   # the ablations' Y: never read
        for sfx, d in (ablations or {}).items():
            calls[KPAIR_VARIANT + sfx] = lambda d=d: wb.gemm(pt.w, pt.x16, out=y_x, defines=d, **KPAIR_PARAMS)
        rows += _time_with_cublas(run, "kpair", calls, (qtype, od, id_, nt), pt, p, flush, progress)
    return rows


def kpair_table(ab_df):
    """The build's A/B per point (qtype, od, id, nt): cuBLAS fp16 (cached), the fastest launch of record and the
    build (medians over the interleaved pairs, us), each one's ratio to cuBLAS (cuBLAS / launch: >= 1 is the nt=512
    bar) and the build's speed over the best launch of record (> 1: faster)."""
    import pandas as pd

    m = medians(ab_df)
    rows = []
    for k, g in m.groupby(["qtype", "od", "id", "nt"]):
        us = dict(zip(g.variant, g.median_us))
        rec = {v: t for v, t in us.items() if v.startswith("wgmma_bn")}
        if "cublas_f16_cached" not in us or KPAIR_VARIANT not in us or not rec:
            continue
        best = min(rec, key=rec.get)
        cb, kp = us["cublas_f16_cached"], us[KPAIR_VARIANT]
        rows.append({**dict(zip(["qtype", "od", "id", "nt"], k)), "cublas_us": cb,
                     "best_record": best.removeprefix("wgmma_"), "best_record_us": rec[best], "kpair_us": kp,
                     "best_record_vs_cublas": cb / rec[best], "kpair_vs_cublas": cb / kp,
                     "kpair_over_best": rec[best] / kp})
    return pd.DataFrame(rows)


def kpair_ablation_builds(ab_df, labels: dict):
    """A ``wgmma_kpair_ab`` run with ablation variants (``KPAIR_VARIANT + suffix``) as :func:`kpair_builds` rows: the
    KPAIR build (``build`` "KPAIR") and each ablation of ``labels`` (suffix -> its build label, in the ``kpair_*``
    columns), each against cuBLAS and the best launch of record timed beside them in the same run, for
    :func:`labkernels.plotting.build_series_bars`; plus ``over_kpair`` = the KPAIR build's time / the ablation's
    (> 1: the ablation is faster; blank on the KPAIR rows)."""
    import pandas as pd

    abl = {KPAIR_VARIANT + sfx for sfx in labels}
    kp = kpair_table(ab_df[~ab_df.variant.isin(abl)]).assign(build="KPAIR")
    key = ["qtype", "od", "id", "nt"]
    out = [kp]
    for sfx, label in labels.items():
        v = KPAIR_VARIANT + sfx
        if not (ab_df.variant == v).any():
            continue
        t = ab_df[(ab_df.variant != KPAIR_VARIANT) & (~ab_df.variant.isin(abl - {v}))]
        t = kpair_table(t.replace({"variant": {v: KPAIR_VARIANT}})).assign(build=label)
        t = t.merge(kp[key + ["kpair_us"]].rename(columns={"kpair_us": "kpair_full_us"}), on=key)
        t["over_kpair"] = t.kpair_full_us / t.kpair_us
        out.append(t.drop(columns="kpair_full_us"))
    return pd.concat(out, ignore_index=True)


def forms_over(builds, base: str, names: dict):
    """:func:`kpair_ablation_builds` rows as one row per point: cuBLAS's time, each build's ratio to cuBLAS
    (``<name>_vs_cublas``; ``names``: build label -> short name) and each other build's speed over ``base`` (a label
    of ``names``): ``<name>_over_<base name>`` = base's time / its time (> 1: faster than the base). Builds absent from
    the rows are left out."""
    key = ["qtype", "od", "id", "nt"]
    b = builds[builds.build.isin(names)]
    out = b.groupby(key).cublas_us.first().reset_index()
    us = b.pivot_table(index=key, columns="build", values="kpair_us")
    vs = b.pivot_table(index=key, columns="build", values="kpair_vs_cublas")
    bn = names[base]
    for label, n in names.items():
        if label not in us.columns:
            continue
        out[f"{n}_vs_cublas"] = vs[label].values
        if label != base:
            out[f"{n}_over_{bn}"] = (us[base] / us[label]).values
    return out


def halfb_builds(ab_df):
    """The half-B ablation's A/B (``wgmma_kpair_ab`` with the ``_halfb`` variant): :func:`kpair_ablation_builds` with
    the ablation as "KPAIR, half B (ablation)" and its ``over_kpair`` as ``halfb_over_kpair``."""
    return kpair_ablation_builds(ab_df, {"_halfb": "KPAIR, half B (ablation)"}).rename(
        columns={"over_kpair": "halfb_over_kpair"})


def decouple_table(ab_df):
    """The twenty-fourth step's A/B per point: cuBLAS fp16 (cached) and the KPAIR build (us), each build's ratio to
    cuBLAS (``<name>_vs_cublas``, cuBLAS / launch) for the KPAIR build and its ablations (:data:`KPAIR_BUILDS`), and
    three quotients of medians: ``conversion`` = KPAIR / no conversion (what converting costs the coupled loop),
    ``coupling`` = half B / half B decoupled (what the pair's lock-step costs), ``conversion_decoupled`` = decoupled /
    decoupled without conversion. Points without the KPAIR build or cuBLAS are left out."""
    import pandas as pd

    m = medians(ab_df)
    rows = []
    for k, g in m.groupby(["qtype", "od", "id", "nt"]):
        us = dict(zip(g.variant, g.median_us))
        cb, kp = us.get("cublas_f16_cached"), us.get(KPAIR_VARIANT)
        if cb is None or kp is None:
            continue
        b = {n: us.get(KPAIR_VARIANT if n == "kpair" else f"{KPAIR_VARIANT}_{n}", np.nan) for n in KPAIR_BUILDS}
        row = {**dict(zip(["qtype", "od", "id", "nt"], k)), "cublas_us": cb, "kpair_us": kp}
        row |= {f"{n}_vs_cublas": cb / t for n, t in b.items()}
        row |= {"conversion": b["kpair"] / b["noconv"], "coupling": b["halfb"] / b["decoupled"],
                "conversion_decoupled": b["decoupled"] / b["decoupled_noconv"]}
        rows.append(row)
    return pd.DataFrame(rows)


#: the twenty-second step's ncu columns: (metric, short name)
SMEM_NCU_COLUMNS = {"Grid Size": "grid", "Cluster Size": "cluster", "Duration": "duration_ns",
                    "SM Frequency": "sm_hz", "sm__cycles_elapsed.avg": "cycles",
                    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "tensor_active_pct",
                    "l1tex__data_bank_reads.sum": "bank_reads", "l1tex__data_bank_writes.sum": "bank_writes",
                    "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed": "bank_reads_pct",
                    "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed": "bank_writes_pct",
                    "Issue Slots Busy": "issue_busy_pct", "# SMs": "sms"}
#: bytes of one shared-memory data-bank access (32 banks of 4 bytes)
BANK_BYTES = 4


def cublas_tile(kernel_name: str) -> tuple[int, int] | None:
    """(M, N) of the wgmma tile that a cuBLAS ``nvjet_sm90_*_<a>x<b>_...`` kernel name gives: wgmma's M comes in
    64-row steps, so a side that is not a multiple of 64 is its N (168 x 128: M = 128, N = 168), else (a, b). None
    for a name without a tile."""
    m = re.search(r"_(\d+)x(\d+)_\d+x\d+_", str(kernel_name))
    if not m:
        return None
    a, b = int(m.group(1)), int(m.group(2))
    return (b, a) if a % 64 else (a, b)


def smem_model(who: str, kernel_name: str, BN: int) -> dict:
    """:func:`smem_bytes_per_clk` of one case of the twenty-second step: cuBLAS's shared-memory tile (both operands
    TMA-staged and wgmma-read, the tile from :func:`cublas_tile`), the register form's 128-row tile of BN tokens, the
    KPAIR build's 64-row x 256-token tile, its half-B ablation (128 of the 256 tokens received)."""
    if who == "cublas":
        t = cublas_tile(kernel_name)
        if t is None:
            return {"b_read": np.nan, "b_write": np.nan, "a_read": np.nan, "a_write": np.nan, "total": np.nan}
        m, n = t
        return smem_bytes_per_clk(m, n, a_in_smem=True, a_written=True)
    if who in ("kpair", "noconv"):
        return smem_bytes_per_clk(64, 256)
    if who in ("halfb", "decoupled", "decoupled_noconv"):   # each CTA receives its own producer's 128 tokens
        return smem_bytes_per_clk(64, 256, recv_tokens=128)
    return smem_bytes_per_clk(128, int(BN))


def smem_table(ncu_df):
    """The twenty-second step's ncu run (table ``smem_ncu``) as one row per case (the first kernel of its profiled
    range): who, shape, the kernel (its function name) and the launch in short (cuBLAS: its name's tile, stages,
    cluster and layout; the lab: tile and scheduler), grid and cluster, duration (us), SM clock (MHz) and elapsed
    cycles (per SM), the tensor
    pipe's active share, shared memory's measured bytes per SM per clock (data-bank reads and writes x
    :data:`BANK_BYTES` over the SMs of the case's LaunchStats and its elapsed cycles), the same per tensor-active clock
    beside :func:`smem_model`'s, and the banks' use in % of ncu's peak. A case without its SM count raises."""
    import pandas as pd

    d = ncu_df[ncu_df.kernel_id == ncu_df.groupby("case").kernel_id.transform("min")]
    d = d[d.metric.isin(SMEM_NCU_COLUMNS)].copy()
    d["v"] = pd.to_numeric(d.value.astype(str).str.replace(",", ""), errors="coerce")
    key = ["case", "who", "qtype", "nt", "od", "id", "BN", "SK", "EPI"]
    p = d.pivot_table(index=key, columns="metric", values="v", aggfunc="first").rename(columns=SMEM_NCU_COLUMNS)
    names = d.groupby("case").kernel_name.first()
    rows = []
    for k, r in p.iterrows():
        c = dict(zip(key, k))
        name = str(names.loc[c["case"]])
        t = r.tensor_active_pct / 100.0
        if not r.get("sms", 0) > 0:
            raise ValueError(f"smem_ncu case {c['case']} has no '# SMs' (LaunchStats): bytes per SM unknown")
        rd = r.bank_reads * BANK_BYTES / r.sms / r.cycles
        wr = r.bank_writes * BANK_BYTES / r.sms / r.cycles
        mdl = smem_model(c["who"], name, c["BN"])
        kern = name.split("(")[0].removeprefix("void ").strip()
        if c["who"] == "cublas":
            launch = kern.removeprefix("nvjet_sm90_hsh_")
        elif c["who"] in KPAIR_BUILDS:
            launch = "KPAIR 64 x 256" + KPAIR_BUILD_LABELS[c["who"]].removeprefix("KPAIR")
        else:
            launch = f"128 x {c['BN']} " + ("data-parallel" if c["SK"] == 0 else f"SK={c['SK']} EPI={c['EPI']}")
        rows.append({**c, "kernel": kern, "launch": launch,
                     "grid": int(r.grid), "cluster": int(r.cluster), "duration_us": r.duration_ns / 1e3,
                     "sm_mhz": r.sm_hz / 1e6, "cycles": r.cycles, "tensor_active_pct": r.tensor_active_pct,
                     "issue_busy_pct": r.issue_busy_pct,
                     "read_B_per_clk": rd, "write_B_per_clk": wr,
                     "read_per_tensor_clk": rd / t, "write_per_tensor_clk": wr / t,
                     "model_read": mdl["b_read"] + mdl["a_read"], "model_write": mdl["b_write"] + mdl["a_write"],
                     "bank_reads_pct": r.bank_reads_pct, "bank_writes_pct": r.bank_writes_pct})
    return pd.DataFrame(rows)


def kpair_builds(runs):
    """The builds of an ``LK_EXP_KPAIR`` series side by side: ``runs`` = [(label, run)] (each a recorded
    ``wgmma_kpair_ab`` run). One row per (label, point) of :func:`kpair_table`, with the build's label; the best
    launch of record is each run's own (timed beside that build)."""
    import pandas as pd

    parts = [kpair_table(r.table("wgmma_kpair_ab")).assign(build=label) for label, r in runs]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


#: ncu metrics of the KPAIR comparison (:func:`kpair_ncu`): throughputs, the tensor pipe and the stall reasons
#: that changed between the builds (warps stalled per issued instruction)
KPAIR_NCU_METRICS = {"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe active %",
                     "Issue Slots Busy": "issue slots busy %", "L1/TEX Cache Throughput": "L1/TEX throughput %",
                     "L2 Cache Throughput": "L2 throughput %",
                     "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio": "stall: membar",
                     "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio":
                         "stall: long scoreboard",
                     "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "stall: barrier",
                     "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "stall: wait",
                     "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio": "stall: dispatch"}


def kpair_ncu(cases):
    """Nsight Compute counters side by side: ``cases`` = [(label, sections table of an ncu run, kernel-key
    substring, sk, nt)] -> one row per :data:`KPAIR_NCU_METRICS` metric, one column per label (the first case of
    the run that matches; a metric the run lacks is NaN, a case that matches nothing raises)."""
    import pandas as pd

    cols = {}
    for label, t, key, sk, nt in cases:
        m = t[t.kernel.str.contains(key, regex=False) & (t.sk == sk) & (t.nt == nt)]
        if m.empty:
            raise ValueError(f"no ncu case {key!r} SK={sk} nt={nt} for {label!r}")
        m = m[m.case == m.case.min()]
        vals = dict(zip(m.metric, m.value))
        cols[label] = {name: pd.to_numeric(str(vals[k]).replace(",", ""), errors="coerce") if k in vals else np.nan
                       for k, name in KPAIR_NCU_METRICS.items()}
    return pd.DataFrame(cols)
