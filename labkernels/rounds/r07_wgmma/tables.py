"""Round 7's tables for its page: medians and the bars against cuBLAS, the epilogue and build-option views
(:func:`suffix_ab`), the timing-method view and the Nsight Compute tables, comparisons and stall reasons."""

from __future__ import annotations


import numpy as np

from ...wgmma import variant_params


# ------------------------------------------------------------------------------------------------ analysis (notebook)

BASELINES = ("cublas_f16_cached", "cublas_f16_with_dequant")


def medians(bench_df):
    """Median over the interleaved pairs of each (qtype, od, id, nt, variant): median_us, tops_eq, us_per_gmac."""
    import pandas as pd

    g = bench_df.groupby(["qtype", "od", "id", "nt", "variant"], as_index=False).median_us.median()
    gmac = g.nt * g.od * g.id / 1e9
    g["us_per_gmac"] = g.median_us / gmac
    g["tops_eq"] = 2 * gmac * 1e9 / (g.median_us * 1e-6) / 1e12
    return pd.DataFrame(g)


def best_vs_cublas(ab_df, option: str = "_e5"):
    """Per point (qtype, od, id, nt) of an option A/B: the fastest wgmma launch without the ``option`` suffix and the
    fastest of all (the option's launches included), each one's ratio to cuBLAS fp16 (cached) timed beside it
    (medians over the interleaved pairs) -- what the option does to the point's best, which is what the bar asks."""
    import pandas as pd

    m = medians(ab_df)
    key = ["qtype", "od", "id", "nt"]
    rows = []
    for k, g in m.groupby(key):
        cb = g[g.variant == "cublas_f16_cached"].median_us
        w = g[g.variant.str.startswith("wgmma_")]
        if cb.empty or w.empty:
            continue
        without = w[~w.variant.str.endswith(option)]
        b0 = without.loc[without.median_us.idxmin()] if len(without) else None
        b1 = w.loc[w.median_us.idxmin()]
        rows.append({**dict(zip(key, k)), "cuBLAS us": float(cb.iloc[0]),
                     "best without": b0.variant.removeprefix("wgmma_") if b0 is not None else "",
                     "without vs cuBLAS": float(cb.iloc[0] / b0.median_us) if b0 is not None else float("nan"),
                     "best with": b1.variant.removeprefix("wgmma_"),
                     "with vs cuBLAS": float(cb.iloc[0] / b1.median_us)})
    return pd.DataFrame(rows)


def epi_table(ab_df):
    """The epilogue A/B (``wgmma_epi_ab``) as the notebook shows it: per (qtype, od, id, nt) and scheduler, the
    plain / bulk-fold / TMA-store launches as ratios to cuBLAS fp16 (cached) of the same point (medians over pairs);
    a form that did not run at a point (its grid does not fit) is NaN."""
    import pandas as pd

    m = medians(ab_df)
    key = ["qtype", "od", "id", "nt"]
    cb = m[m.variant == "cublas_f16_cached"].set_index(key).median_us.rename("cublas_us")
    m = m[m.variant.str.startswith("wgmma_bn")].join(cb, on=key)
    parsed = [variant_params(v, q)[1] for v, q in zip(m.variant, m.qtype)]
    m["sched"] = [f"BN={p['BN']} " + {0: "SK=0", 1: "SK=1", 2: "SK=2", 3: "SK=3"}[p["SK"]] for p in parsed]
    m["epi"] = [{0: "plain", 1: "bulk fold", 2: "+TMA store", 3: "pair exchange", 4: "staged TMA store"}[p.get("EPI", 0)] for p in parsed]
    m["vs_cublas"] = m.cublas_us / m.median_us
    t = m.pivot_table(index=key + ["sched"], columns="epi", values="vs_cublas")
    return pd.DataFrame(t.reindex(columns=[c for c in ("plain", "bulk fold", "+TMA store", "pair exchange")
                                           if c in t.columns])
                        ).reset_index()


def summary(bench_df):
    """Per (qtype, od, id, nt): the fastest wgmma_kq variant, its TOPS-eq and us/GMAC, and time ratios
    (baseline time / wgmma time, > 1 = wgmma faster) against cuBLAS fp16 (cached weights, and including the
    dequant) and the lab's int8 family -- each ratio the median of the per-pair ratios of the interleaved rounds."""
    import pandas as pd

    rows = []
    for key, grp in bench_df.groupby(["qtype", "od", "id", "nt"]):
        per = grp.pivot_table(index="pair", columns="variant", values="median_us")
        wg = [c for c in per.columns if c.startswith(("wgmma_bn", "wgmma_smem"))]   # both forms
        best = per[wg].median().idxmin()
        q, od, id_, nt = key
        row = {"qtype": q, "od": od, "id": id_, "nt": nt, "best": best,
               "tops_eq": 2 * nt * od * id_ / (per[best].median() * 1e-6) / 1e12,
               "us_per_gmac": per[best].median() / (nt * od * id_ / 1e9)}
        for b in BASELINES:
            row[f"vs_{b}"] = float((per[b] / per[best]).median())
        i8 = [c for c in per.columns if c.startswith("int8_")]
        row["vs_int8"] = float((per[i8[0]] / per[best]).median()) if i8 else float("nan")
        row["int8_family"] = i8[0][5:] if i8 else None
        row["cublas_tops"] = 2 * nt * od * id_ / (per["cublas_f16_cached"].median() * 1e-6) / 1e12
        row["pairs"] = int(len(per))
        rows.append(row)
    return pd.DataFrame(rows)


def forms(bench_df):
    """Per (qtype, od, id, nt) where both forms ran: the best register-form and shared-memory-form variant and
    their time ratios to cuBLAS fp16 on cached weights (baseline time / form time, medians over the pairs)."""
    import pandas as pd

    med = medians(bench_df)
    rows = []
    for key, g in med.groupby(["qtype", "od", "id", "nt"]):
        t = g.set_index("variant").median_us
        reg, sm = t[t.index.str.startswith("wgmma_bn")], t[t.index.str.startswith("wgmma_smem")]
        if not len(reg) or not len(sm) or "cublas_f16_cached" not in t:
            continue
        cb = t["cublas_f16_cached"]
        rows.append(dict(zip(["qtype", "od", "id", "nt"], key), register=reg.idxmin(), register_vs_cublas=cb / reg.min(),
                         smem=sm.idxmin(), smem_vs_cublas=cb / sm.min(), smem_vs_register=reg.min() / sm.min()))
    return pd.DataFrame(rows)


def bars(s, nt_large: int = 4096, nt_small: int = 512) -> list[dict]:
    """The issue's performance bar, row by row: nt_large >= 650 TOPS-eq and >= 0.85x cuBLAS; nt_small >= 1.0x."""
    out = []
    for _, r in s[s.nt.isin([nt_large, nt_small])].iterrows():
        if r.nt == nt_large:
            ok = r.tops_eq >= 650 and r.vs_cublas_f16_cached >= 0.85
            want = ">= 650 TOPS-eq and >= 0.85x cuBLAS"
        else:
            ok = r.vs_cublas_f16_cached >= 1.0
            want = ">= 1.0x cuBLAS"
        out.append({"qtype": r.qtype, "od": r.od, "id": r.id, "nt": r.nt, "tops_eq": r.tops_eq,
                    "vs_cublas": r.vs_cublas_f16_cached, "bar": want, "met": bool(ok)})
    return out


def traffic_bytes(qtype: str, nt: int, od: int, id_: int) -> int:
    """The fewest bytes one GEMM must move through HBM: the weights once (their GGUF bytes), the 16-bit
    activations once, the f32 output once."""
    bpw = {"q4_K": 4.5, "q6_K": 6.5625}[qtype]
    return int(od * id_ * bpw / 8 + 2 * nt * id_ + 4 * nt * od)


#: the Nsight Compute metrics the round shows (section, metric name as ncu prints it)
NCU_METRICS = [("GPU Speed Of Light Throughput", "Duration"), ("GPU Speed Of Light Throughput", "SM Frequency"),
               ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
               ("GPU Speed Of Light Throughput", "SM Active Cycles"), ("GPU Speed Of Light Throughput", "Elapsed Cycles"),
               ("GPU Speed Of Light Throughput", "DRAM Throughput"), ("Compute Workload Analysis", "Issue Slots Busy"),
               ("Compute Workload Analysis", "Executed Ipc Active"), ("Scheduler Statistics", "No Eligible"),
               ("Scheduler Statistics", "Eligible Warps Per Scheduler"),
               ("Warp State Statistics", "Warp Cycles Per Issued Instruction"),
               ("Occupancy", "Achieved Active Warps Per SM"), ("Memory Workload Analysis", "L2 Hit Rate"),
               # shared memory is L1/TEX traffic: the shared-memory form's limit
               ("GPU Speed Of Light Throughput", "L1/TEX Cache Throughput"), ("Memory Workload Analysis", "Mem Pipes Busy")]


#: the tile scheduler of a profiled launch, as the Nsight Compute figures name it
SCHED_LABEL = {0: "data-par.", 1: "stream-K", 2: "split-k", 3: "tile split"}


def ncu_label(kernel_key: str, sk: int, nt: int, sep: str = "\n") -> str:
    """A profiled kernel as the Nsight Compute figures label it: type, tile, form (shared-memory, AQ=4), then
    ``sep`` and the scheduler and nt -- e.g. 'q4_K BN=256\ntile split nt=512'."""
    head = (f"{'q4_K' if 'QT=4' in kernel_key else 'q6_K'} BN={kernel_key.split('BN=')[1].split(',')[0]}"
            f"{' smem' if kernel_key.startswith('wgmma_kqs') else ''}{' AQ=4' if 'AQ=4' in kernel_key else ''}")
    return f"{head}{sep}{SCHED_LABEL[int(sk)]} nt={nt}"


def ncu_table(sections_df):
    """One row per profiled kernel (variant, nt) and one column per metric of :data:`NCU_METRICS`, numeric."""
    import pandas as pd

    want = {m for _, m in NCU_METRICS}
    d = sections_df[sections_df.metric.isin(want)].copy()
    d["value"] = pd.to_numeric(d.value.astype(str).str.replace(",", ""), errors="coerce")
    units = d.groupby("metric").unit.first().to_dict()
    if "sk" not in d:   # runs before the stream-K scheduler: data-parallel
        d["sk"] = 0
    t = d.pivot_table(index=["case", "kernel", "sk", "nt", "od", "id"], columns="metric", values="value").reset_index()
    t.columns.name = None
    t = t.rename(columns={m: f"{m} [{units[m]}]" if isinstance(units.get(m), str) and units.get(m) else m
                          for m in want})
    return t


def suffix_ab(ab_df, suffixes=("_a4", "_p1", "_p2")):
    """A build-option A/B (``wgmma_aq_ab``, ``wgmma_pf_ab``) as speedups: for every variant named ``base + suffix``
    timed beside ``base`` at the same (qtype, od, id, nt), median(base) / median(variant) over the interleaved pairs
    (> 1: the option is faster), with each one's ratio to cuBLAS fp16 (cached) at that point; ``launch`` names the
    base's tile and scheduler (e.g. 'BN=256 stream-K')."""
    import pandas as pd

    m = medians(ab_df)
    key = ["qtype", "od", "id", "nt"]
    us = m.set_index(key + ["variant"]).median_us
    rows = []
    for (q, od, id_, nt, v), t in us.items():
        for sfx in suffixes:
            if v.endswith(sfx) and (q, od, id_, nt, v[:-len(sfx)]) in us.index:
                base = us[(q, od, id_, nt, v[:-len(sfx)])]
                cb = us.get((q, od, id_, nt, "cublas_f16_cached"), np.nan)
                bp = variant_params(v[:-len(sfx)], q)[1]
                rows.append({"qtype": q, "od": od, "id": id_, "nt": nt, "option": sfx[1:], "base": v[:-len(sfx)],
                             "launch": f"BN={bp['BN']} {SCHED_LABEL[bp['SK']]}",
                             "speedup": base / t, "base_vs_cublas": cb / base, "option_vs_cublas": cb / t})
    return pd.DataFrame(rows)


def build_ab_view(run, name: str):
    """A recorded bitwise build A/B (:func:`builds_ab`'s ``wgmma_<name>_ab`` and ``wgmma_<name>_gate`` tables, the
    build's variants named ``<variant>_<name>``) as the page shows it: the per-launch speedups (:func:`suffix_ab`:
    plain time / build time, each one's ratio to cuBLAS) and one line on its gates -- how many launches, whether
    every one was bitwise the plain build and passed its parity gate."""
    t = suffix_ab(run.table(f"wgmma_{name}_ab"), suffixes=(f"_{name}",))
    g = run.table(f"wgmma_{name}_gate")
    line = (f"run {run.run_id}: {len(g)} launches gated at their points, bitwise the plain build: "
            f"{bool(g[f'bitwise_vs_{name}'].all())}, parity gates passed: {bool(g.ok.all())}")
    return t, line


def lead_view(run):
    """The timing A/B (:func:`lead_ab`'s ``wgmma_lead_ab``) per (qtype, od, id, nt): under each timing the best
    wgmma launch (median over the rounds of each launch's medians) and cuBLAS fp16 (cached), their ratio, and the
    host times of both calls, with the flush's device time -- what the page tables and plots."""
    import pandas as pd

    b = run.table("wgmma_lead_ab")
    med = b.groupby(["qtype", "od", "id", "nt", "timing", "variant"], as_index=False).agg(
        us=("median_us", "median"), host_us=("host_us", "median"), flush_us=("flush_us", "first"))
    rows = []
    for (q, od, id_, nt, t), g in med.groupby(["qtype", "od", "id", "nt", "timing"], sort=False):
        wg = g[g.variant.str.startswith("wgmma_bn")].sort_values("us").iloc[0]
        cb = g[g.variant == "cublas_f16_cached"].iloc[0]
        rows.append({"qtype": q, "od": od, "id": id_, "nt": nt, "timing": t, "best launch": wg.variant,
                     "wgmma us": wg.us, "cuBLAS us": cb.us, "ratio": cb.us / wg.us,
                     "wgmma host us": wg.host_us, "cuBLAS host us": cb.host_us, "flush us": wg.flush_us})
    return pd.DataFrame(rows)


NCU_COMPARE = ("tensor pipe % active", "long_scoreboard", "short_scoreboard", "math_pipe_throttle")


def ncu_compare(plain_sections, build_sections, columns=NCU_COMPARE):
    """Two ncu runs of the same driver cases -- the plain build's and an exploratory build's -- side by side: per
    kernel and grid present in both (:func:`ncu_stalls`), each of ``columns`` as '<column> plain' and '<column>
    build', the launch named by :func:`ncu_label`."""
    import pandas as pd

    a, b = ncu_stalls(plain_sections, 0.0), ncu_stalls(build_sections, 0.0)
    if a.empty or b.empty:
        return pd.DataFrame()
    key = ["kernel", "sk", "nt"]
    cols = [c for c in columns if c in a.columns and c in b.columns]
    m = a[key + cols].merge(b[key + cols], on=key, suffixes=(" plain", " build"))
    m.insert(0, "launch", [ncu_label(k, s, n, ", ") for k, s, n in zip(m.kernel, m.sk, m.nt)])
    return m[["launch", "kernel", "sk", "nt"] + [f"{c} {w}" for c in cols for w in ("plain", "build")]]


#: the stall reasons the ncu step records (raw metrics, warps stalled per issued instruction)
_STALL = "smsp__average_warps_issue_stalled_"


def ncu_stalls(sections_df, min_share: float = 0.1):
    """Per profiled kernel (case): each stall reason's warps per issued instruction (``--metrics`` of the ncu step;
    empty for runs without them) -- the reasons above ``min_share`` at some case, 'selected' (the issuing warp
    itself) left out -- and the tensor pipe's active cycles (% of peak over elapsed and over active cycles)."""
    import pandas as pd

    d = sections_df[sections_df.metric.astype(str).str.startswith((_STALL, "sm__pipe_tensor_cycles_active"))].copy()
    if d.empty:
        return pd.DataFrame()
    d["value"] = pd.to_numeric(d.value.astype(str).str.replace(",", ""), errors="coerce")
    d["metric"] = (d.metric.str.replace(_STALL, "", regex=False).str.replace("_per_issue_active.ratio", "", regex=False)
                   .str.replace("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_", "tensor pipe % ", regex=False))
    t = d.pivot_table(index=["case", "kernel", "sk", "nt"], columns="metric", values="value").reset_index()
    t.columns.name = None
    reasons = [c for c in t.columns if c not in ("case", "kernel", "sk", "nt", "selected")
               and not c.startswith("tensor pipe") and t[c].max() >= min_share]
    reasons.sort(key=lambda c: -t[c].mean())
    pipe = [c for c in t.columns if c.startswith("tensor pipe")]
    return t[["case", "kernel", "sk", "nt"] + pipe + reasons]
