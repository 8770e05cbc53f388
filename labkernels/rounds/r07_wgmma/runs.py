"""Round 7's GPU steps: what ``labkernels gpu check --round 7 --step N`` runs (each a ``fn(out, args) -> dict``
that records its runs under ``out/data``; their records, predictions and verdicts: :mod:`.steps`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from ... import bench, cases, gpu, ncu, prefill, prefill_replay, prefill_runs, records, sanitizer, synthetic, wgmma
from ...model import default_model_path
from ...paths import REPO_ROOT
from .. import measure_into
from .. import module as round_module
from . import builds as wb
from . import benchmark, kpair, limits, options, traces

#: the series of the round's runs (data/07_wgmma_kquant/)
SERIES = "wgmma"


WGMMA_DRIVER = r"""
import sys, numpy as np, cupy as cp
from labkernels import quants, wgmma
from labkernels.rounds.r07_wgmma import builds as wb
from labkernels.errors import SharedMemoryError
from labkernels.kernels import registry
mode = sys.argv[1]
rng = np.random.default_rng(3)
cases = []
if mode == "sanitizer" and "LK_EXP_KPAIR" in wb.build_defines():   # that build's one launch shape (2-CTA
    for qt in (4, 6):         # clusters, multicast stages, the halves' add through the ring), tails in nt and od
        k = registry.find("wgmma_kq", QT=qt, **{n: v for n, v in wb.KPAIR_PARAMS.items() if n != "SK"})
        odp = 132 if "LK_EXP_KPAIR_FIN" in wb.build_defines() else 130   # a padded m tile (FIN's TMA store: od % 4 = 0)
        cases += [(k, 77, 200, 512, 0), (k, 300, odp, 1024, 0), (k, 520, 384, 768, 0)]
elif mode == "sanitizer":     # tails in nt and od, every main-path variant, the three schedulers (stream-K
    for k in registry.family("wgmma_kq") + registry.family("wgmma_kqs"):   # splits these tiles' k over 4 CTAs,
                                                # the uniform split over 2 each: partials, flags, fix-up; both forms)
        if k.p.get("EPI") == 3:   # the pair exchange: SK=3 with two CTAs per tile (2 tiles of 2 super-blocks)
            cases += [(k, 77, 200, 512, 3)]
        elif k.p.get("EPI") == 5:   # the reduce finish: split grids of two CTAs a tile (zeroing, flag, TMA adds),
            cases += [(k, 77, 200, 512, sk) for sk in (1, 3)] + [(k, 600, 4000, 512, 1)]   # and several tiles a CTA
        elif (k.main_path or k.p.get("AQ", 2) != 2 or k.p.get("PF") or k.p.get("EPI") == 4
              or k.p.get("NCV") == 2 or k.p.get("SCL") == 2):   # (and the AQ=4, PF, EPI=4, two-converter and
            # scale-plane experiments) ... and the
            # tile-aligned split (SK=3) where G does not divide the 7 super-blocks (1+2+2+2); the epilogue forms
            # EPI 1, 2 take no stream-K grid
            cases += [(k, 77, 200, 512, sk) for sk in (0, 1, 2) if not (sk == 1 and k.p.get("EPI") in (1, 2))]
            cases += [(k, 77, 4000, 1792, 3)]
            if k.p.get("EPI") == 4:   # the staged store over several tiles per CTA (160 or 128 tiles, data-parallel)
                cases += [(k, 600, 4000, 512, 0)]
elif "LK_EXP_KPAIR" in wb.build_defines():   # ncu of that build: its one launch shape at nt 512 and 4096
    for qt in (4, 6):
        k = registry.find("wgmma_kq", QT=qt, **{n: v for n, v in wb.KPAIR_PARAMS.items() if n != "SK"})
        cases += [(k, 512, 4096, 4096, 0), (k, 4096, 4096, 4096, 0)]
else:                         # ncu: the main variants at the 7B attention shape
    for qt in (4, 6):
        for nt, bn, sk in ((512, 128, 0), (512, 256, 1), (4096, 256, 0)):
            scl = wgmma.main_scl("q4_K" if qt == 4 else "q6_K", bn)
            cases.append((registry.find("wgmma_kq", QT=qt, BN=bn, STAGES=4, BF16=0, SCL=scl, EPI=0, AQ=2, PF=0), nt, 4096, 4096, sk))
        scl = wgmma.main_scl("q4_K" if qt == 4 else "q6_K", 128)   # the four-A-set form beside BN=128's
        cases.append((registry.find("wgmma_kq", QT=qt, BN=128, STAGES=4, BF16=0, SCL=scl, EPI=0, AQ=4, PF=0), 512, 4096, 4096, 0))
        cases.append((registry.find("wgmma_kq", QT=qt, BN=256, STAGES=4, BF16=0, SCL=0, EPI=0, AQ=2, PF=0), 512, 4096, 4096, 3))
    # the q4_K scale plane (SCL=2, measured 0.80-0.91x the header decode) beside its SCL=0 case above
    cases.append((registry.find("wgmma_kq", QT=4, BN=128, STAGES=4, BF16=0, SCL=2, EPI=0, AQ=2, PF=0), 512, 4096, 4096, 0))
    for nt, bn, st in ((512, 128, 4), (4096, 256, 3)):   # the shared-memory form (q4_K), data-parallel
        cases.append((registry.find("wgmma_kqs", QT=4, BN=bn, STAGES=st, BF16=0, NCV=1), nt, 4096, 4096, 0))
for k, nt, od, id_, sk in cases:
    qtype = "q4_K" if k.p["QT"] == 4 else "q6_K"
    raw = quants.quantize((rng.standard_normal((min(od, 256), id_)) * .02).astype(np.float32), qtype)
    raw = np.ascontiguousarray(np.tile(raw, (-(-od // raw.shape[0]), 1))[:od])
    w = wgmma.WgWeight.from_gguf(raw, qtype, plane=k.p.get("SCL") == 2)
    form = k.p["NCV"] if k.family == "wgmma_kqs" else 0   # 1 / 2 converter warpgroups
    if form:
        w.gguf = cp.asarray(raw)
    x = cp.asarray(rng.standard_normal((nt, id_)).astype(np.float16))
    y = cp.empty((nt, od), cp.float32)
    try:
        wb.gemm(w, x, out=y, SK=sk, FORM=form, defines=wb.build_defines(),   # LABKERNELS_WG_DEFINES: the build
                **{n: v for n, v in k.params if n not in ("QT", "NCV")})
    except SharedMemoryError as e:   # an exploratory build's extra shared memory (the KPAIR ring) may not fit
        if not wb.build_defines():   # beside a variant's own: that case is left out, said; the plain build has
            raise                       # no such case
        print("skipped", k.key, "SK=%d" % sk, nt, od, id_, "--", e, flush=True)
        continue
    cp.cuda.runtime.deviceSynchronize()
    print("case", k.key, "SK=%d" % sk, nt, od, id_, flush=True)
"""


def step_wgmma(out: Path, args) -> dict:
    """``gpu check --steps wgmma``: kernel resources, real-model gates and the interleaved benchmark (the round's
    measure with its plan)."""
    runs = measure_into(round_module(7), root=out / "data", progress=args.log)
    return {"ok": True, "run": runs[SERIES].run_id}


def step_wgmma_costs(out: Path, args) -> dict:
    """Round 7: the per-launch vs main-loop cost scan at nt=512 (benchmark.cost_scan), recorded."""
    with records.recording(SERIES, {"what": "cost_scan"}, root=out / "data") as run:
        benchmark.cost_scan(run, progress=args.log)
    return {"ok": True, "run": run.run_id}


def _record_ab(out: Path, args, what: str, plan: dict, ab) -> dict:
    """A build-option A/B step: ``ab`` (labkernels.wgmma's ``*_ab``) into a run recorded as ``what`` with its plan."""
    with records.recording(SERIES, {"what": what, "plan": plan}, root=out / "data") as run:
        ab(run, progress=args.log)
    return {"ok": True, "run": run.run_id}


def step_wgmma_epi(out: Path, args) -> dict:
    """Round 7: the epilogue forms (bulk fold, TMA store) and the tile-aligned split-k grid against the plain
    launches and cuBLAS at nt 256-1024 (options.epi_ab), real-model gated, recorded."""
    return _record_ab(out, args, "epi_ab", options.EPI_AB, options.epi_ab)


def step_wgmma_aq(out: Path, args) -> dict:
    """Round 7: four A-fragment sets (AQ=4, the next chunk converted before the wait) against two, at BN=128 under
    three schedulers, beside BN=256 and cuBLAS at nt 256-1024 (options.aq_ab), real-model gated, recorded."""
    return _record_ab(out, args, "aq_ab", options.AQ_AB, options.aq_ab)


def step_wgmma_pf(out: Path, args) -> dict:
    """Round 7: an L2 prefetch of the weights 1 or 2 super-blocks ahead (PF) against none, at nt 512 and 4096 on the
    launches of record, beside cuBLAS (options.pf_ab), real-model gated, recorded."""
    return _record_ab(out, args, "pf_ab", options.PF_AB, options.pf_ab)


def step_wgmma_pair(out: Path, args) -> dict:
    """Round 7: the pair exchange (EPI=3: a tile's two split-k CTAs in one cluster, partial sums through distributed
    shared memory) against the plain epilogue on the same grid, stream-K and cuBLAS at nt 256-1024
    (options.pair_ab), real-model gated, recorded."""
    return _record_ab(out, args, "pair_ab", options.PAIR_AB, options.pair_ab)


def step_wgmma_staged(out: Path, args) -> dict:
    """Round 7: the staged TMA store (EPI=4: every tile through a staging buffer of its own, TMA stores the next
    tile does not wait for) against the plain epilogue on the same grids at nt 512-4096 (options.staged_ab),
    real-model gated, recorded."""
    return _record_ab(out, args, "staged_ab", options.STAGED_AB, options.staged_ab)


def step_wgmma_reduce(out: Path, args) -> dict:
    """Round 7: the reduce finish (EPI=5: a split tile's two CTAs TMA-add their partial sums into Y, zeroed early by
    the owner) against the plain and staged epilogues on the same grids at nt 512 and 4096
    (options.reduce_ab), real-model gated, recorded."""
    return _record_ab(out, args, "reduce_ab", options.REDUCE_AB, options.reduce_ab)


def step_wgmma_lead(out: Path, args) -> dict:
    """Round 7: the timing method -- every call of the launches of record and of cuBLAS timed right after the flush
    (as the benchmark does) and behind a GPU wait that hides the host path, call by call, with each call's host time
    (options.lead_ab), recorded."""
    return _record_ab(out, args, "lead_ab", options.LEAD_AB, options.lead_ab)


def step_wgmma_conv2(out: Path, args) -> dict:
    """Round 7: the shared-memory form with two converter warpgroups (FORM=2, 512 threads) against one, and the
    register form, at nt 512 and 4096 (options.conv2_ab), real-model gated, recorded."""
    return _record_ab(out, args, "conv2_ab", options.CONV2_AB, options.conv2_ab)


#: the traced launches of ``gpu check --steps wgmma_trace``: per shape and type, the nt=512 launches of record that
#: bracket the bar -- BN=128 data-parallel (its loop converts under 128 tokens) and the BN=256 split grids (the
#: tile-aligned split and its pair exchange where two CTAs share each tile, stream-K with the staged store where not)
#: and the reduce finish (EPI=5) on the same split grids
TRACE_PLAN = {(4096, 4096): {"q4_K": ("wgmma_bn128_s4_scl0", "wgmma_bn256_s4_scl0_skt", "wgmma_bn256_s4_scl0_skt_e3",
                                      "wgmma_bn256_s4_scl0_skt_e5"),
                             "q6_K": ("wgmma_bn128_s4_scl1", "wgmma_bn256_s4_scl0_skt", "wgmma_bn256_s4_scl0_skt_e5")},
              (11008, 4096): {"q4_K": ("wgmma_bn128_s4_scl0_sk", "wgmma_bn256_s4_scl0_sk_e4", "wgmma_bn256_s4_scl0_sk_e5"),
                              "q6_K": ("wgmma_bn128_s4_scl1_sk", "wgmma_bn256_s4_scl0_sk_e4", "wgmma_bn256_s4_scl0_sk_e5")}}


def step_wgmma_trace(out: Path, args) -> dict:
    """Round 7, exploratory: per-CTA phase stamps (a -DLK_EXP_TRACE build) of the nt=512 launches of
    :data:`TRACE_PLAN` -- where a launch's time goes before, between and after the main loops
    (traces.trace_launch), recorded with the per-event summary: after warm-up launches (table ``trace``)
    and once more right after an L2 flush, as the benchmark times a launch (``trace_flushed``)."""
    rng = np.random.default_rng(11)
    flusher = bench.Flusher()
    nt = 512
    sms = wgmma._sm_count(wgmma._cp().cuda.Device().id)
    with records.recording(SERIES, {"what": "trace", "defines": ["LK_EXP_TRACE"], "nt": nt, "sm_count": sms,
                                     "plan": {f"{od}x{id_}": v for (od, id_), v in TRACE_PLAN.items()}},
                           root=out / "data") as run:
        for (od, id_), per in TRACE_PLAN.items():
            x16 = wgmma._cp().asarray(rng.standard_normal((nt, id_)).astype(np.float16))
            for qtype, variants in per.items():
                w = wgmma.WgWeight.from_gguf(cases.synthetic_weights(qtype, od, id_, rng), qtype)
                for name in variants:
                    _, p = wgmma.variant_params(name, qtype)
                    # no event timing of the trace build: one gemm() call a launch is host-bound at ~95-140 us
                    # (run 20261202T190840Z's trace_timed against stamp spans of 28-108 us) -- bench times launches
                    rows = traces.trace_launch(w, x16, BN=p["BN"], STAGES=p["STAGES"], SCL=p["SCL"], SK=p["SK"],
                                           EPI=p.get("EPI", 0))
                    key = {"qtype": qtype, "od": od, "id": id_, "nt": nt, "variant": name}
                    run.append("trace", [{**key, **r} for r in rows])
                    summ = traces.trace_summary(rows)
                    run.append("trace_summary", [{**key, **r} for r in summ.to_dict("records")])
                    # the same launch from a cold L2, as the benchmark times it (table trace_flushed)
                    cold = traces.trace_launch(w, x16, BN=p["BN"], STAGES=p["STAGES"], SCL=p["SCL"], SK=p["SK"],
                                           EPI=p.get("EPI", 0), flush=flusher)
                    run.append("trace_flushed", [{**key, **r} for r in cold])
                    csum = traces.trace_summary(cold)
                    args.log(f"trace {qtype} {od}x{id_} {name}: {summ.ctas.max()} CTAs, "
                             f"stamps span {summ.t_us_max.max():.1f} us warm / {csum.t_us_max.max():.1f} us from a "
                             f"flushed L2, first tile at {summ.cta_us_median.iloc[2]:.2f} / "
                             f"{csum.cta_us_median.iloc[2]:.2f} us (median per CTA)")
    return {"ok": True, "run": run.run_id}


def step_wgmma_sanitizer(out: Path, args) -> dict:
    """compute-sanitizer memcheck, racecheck, synccheck over every main-path wgmma_kq variant (tails), through
    :mod:`labkernels.sanitizer` (each report classed: clean when nothing but driver probes is reported)."""
    res, rows = {}, []
    for tool in sanitizer.TOOLS:
        r = sanitizer.run_tool(tool, [sys.executable, "-c", WGMMA_DRIVER, "sanitizer"],
                               out / f"wgmma-sanitizer-{tool}.txt", cwd=REPO_ROOT, timeout=args.sanitizer_timeout)
        text = (out / f"wgmma-sanitizer-{tool}.txt").read_text()
        r["cases"] = sum(1 for ln in text.splitlines() if ln.startswith("case "))
        r["skipped"] = sum(1 for ln in text.splitlines() if ln.startswith("skipped "))
        res[tool] = r
        rows.append({"tool": tool, "rc": r["rc"], "summary": str(r["summary"]), "cases": r["cases"],
                     "skipped": r["skipped"], "probe_api_errors": r.get("probe_api_errors"), "clean": r["ok"]})
        args.log(f"wgmma {sanitizer.line(tool, r)} ({r['cases']} cases, {r['skipped']} left out)")
    ok = all(r["ok"] for r in res.values())
    # an exploratory build's run (LABKERNELS_WG_DEFINES) names its defines: the page reads the plain build's
    with records.recording(SERIES, {"what": "sanitizer", "tools": [r["tool"] for r in rows],
                                     "defines": list(wb.build_defines())}, root=out / "data") as run:
        run.append("sanitizer", rows)
    return {"ok": ok, **res, "run": run.run_id}


NCU_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "WarpStateStats", "SchedulerStats", "Occupancy",
                "MemoryWorkloadAnalysis")
#: raw metrics beside the sections: the stall reasons (warps stalled per issued instruction, one per reason: what the
#: "Warp Cycles Per Issued Instruction" of WarpStateStats is made of) and the tensor pipes' active cycles
NCU_METRICS = ("regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio$",
               "regex:sm__pipe_tensor.*cycles_active\\.avg\\.pct_of_peak_sustained_(active|elapsed)$")


def step_wgmma_ncu(out: Path, args) -> dict:
    """Nsight Compute sections of the main wgmma_kq variants (tensor pipe, issue, stalls), recorded."""
    import csv
    import io

    cmd = ["ncu", "--clock-control", "none", "-k", "regex:wgmma_kq", "--csv", "--page", "details"]
    for sname in NCU_SECTIONS:
        cmd += ["--section", sname]
    drv = [sys.executable, "-c", WGMMA_DRIVER, "ncu"]
    metrics = list(NCU_METRICS)
    r = subprocess.run(cmd + ["--metrics", ",".join(metrics)] + drv, cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0 and "metric" in (r.stdout + r.stderr).lower():   # this ncu names them otherwise: the
        args.log(f"ncu refused the raw metrics ({(r.stdout + r.stderr)[-300:]!r}); sections only")   # sections alone
        metrics = []
        r = subprocess.run(cmd + drv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    (out / "wgmma-ncu.txt").write_text(r.stdout + r.stderr)
    cases = [ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("case ")]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines)))) if lines else []
    if r.returncode != 0 or not rows:
        args.log(f"ncu failed rc={r.returncode}: {(r.stdout + r.stderr)[-800:]}")
        return {"ok": False, "rc": r.returncode}
    ids = sorted({int(x["ID"]) for x in rows})
    table = []
    for x in rows:
        i = ids.index(int(x["ID"]))
        key, sk, nt, od, id_ = cases[i] if i < len(cases) else ("?", "SK=0", 0, 0, 0)
        table.append({"case": i, "kernel": key, "sk": int(sk[3:]), "nt": int(nt), "od": int(od), "id": int(id_),
                      "section": x.get("Section Name"), "metric": x.get("Metric Name"), "unit": x.get("Metric Unit"),
                      "value": x.get("Metric Value")})
    # an exploratory build's counters (LABKERNELS_WG_DEFINES) name its defines: the page's main table reads the plain
    with records.recording(SERIES, {"what": "ncu", "sections": NCU_SECTIONS, "metrics": metrics, "cases": cases,
                                     "defines": list(wb.build_defines())}, root=out / "data") as run:
        run.append("sections", table)
    args.log(f"ncu: {len(ids)} kernels x {len(NCU_SECTIONS)} sections recorded (run {run.run_id})")
    return {"ok": True, "run": run.run_id}


#: the twenty-second step's driver: one launch per process, profiled between cudaProfilerStart / Stop after warm-up
#: calls (ncu --profile-from-start off): cuBLAS fp16 (the benchmark's baseline call, blas.matmul_f16) or a lab launch
#: (plain launch of record, the KPAIR build or one of its ablations, kpair.KPAIR_BUILDS), printing its case line
SMEM_DRIVER = r"""
import sys, numpy as np, cupy as cp
from labkernels import blas, cases, wgmma
from labkernels.rounds.r07_wgmma import builds as wb, kpair
who, qtype, nt, od, id_, bn, sk, epi = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:9])
rng = np.random.default_rng(5)
x16 = cp.asarray(rng.standard_normal((nt, id_)).astype(np.float16))
if who == "cublas":
    w16 = cp.asarray((rng.standard_normal((od, id_)) * .02).astype(np.float16))
    y = cp.empty((nt, od), cp.float16)
    launch = lambda: blas.matmul_f16(x16, w16, out=y)
else:
    w = wgmma.WgWeight.from_gguf(cases.synthetic_weights(qtype, od, id_, rng), qtype)
    y = cp.empty((nt, od), cp.float32)
    if who == "lab":
        prm = dict(BN=bn, SCL=wgmma.main_scl(qtype, bn), SK=sk, EPI=epi)
    else:
        prm = dict(defines=kpair.KPAIR_BUILDS[who], **wb.KPAIR_PARAMS)
    launch = lambda: wb.gemm(w, x16, out=y, **prm)
for _ in range(3):
    launch()
rt = cp.cuda.runtime
start, stop = (rt.profilerStart, rt.profilerStop) if hasattr(rt, "profilerStart") else (
    cp.cuda.profiler.start, cp.cuda.profiler.stop)
rt.deviceSynchronize()
start()
launch()
rt.deviceSynchronize()
stop()
print("case", who, qtype, nt, od, id_, bn, sk, epi, flush=True)
"""
#: its cases: (who, qtype, nt, od, id, BN, SK, EPI) -- cuBLAS at the bar's shapes and both nts; the launches of record,
#: the KPAIR build and its half-B ablation at 4096 x 4096
SMEM_CASES = tuple([("cublas", "f16", nt, od, id_, 0, 0, 0) for nt in (512, 4096) for od, id_ in benchmark.SHAPES]
                   + [(who, q, nt, 4096, 4096, bn, sk, epi) for q in ("q4_K", "q6_K")
                      for who, nt, bn, sk, epi in (("lab", 512, 128, 0, 0), ("lab", 512, 256, 3, 5),
                                                   ("lab", 4096, 256, 0, 0), ("kpair", 512, 256, 0, 0),
                                                   ("kpair", 4096, 256, 0, 0), ("halfb", 512, 256, 0, 0),
                                                   ("halfb", 4096, 256, 0, 0))])
#: sections (LaunchStats: grid, block, cluster, registers, shared memory) and the raw metrics wanted beside them,
#: each kept only where this ncu lists it: the tensor pipe, and shared memory's data-bank reads and writes (what
#: the twenty-second step's model predicts) with the LSU's shared-memory wavefronts
SMEM_SECTIONS = ("SpeedOfLight", "LaunchStats", "ComputeWorkloadAnalysis", "WarpStateStats", "MemoryWorkloadAnalysis",
                 "MemoryWorkloadAnalysis_Tables")
SMEM_METRICS = ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed",
                "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed",
                "l1tex__data_bank_reads.sum", "l1tex__data_bank_writes.sum",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
                "smsp__cycles_active.avg", "sm__cycles_elapsed.avg",
                "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
                "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
                "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
                "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio")


def _ncu_cases(out: Path, args, cases, tag: str) -> tuple[list[dict], list[str], bool]:
    """Nsight Compute of ``cases`` ((who, qtype, nt, od, id, BN, SK, EPI), :data:`SMEM_DRIVER`), one process per case
    profiled from cudaProfilerStart (``--profile-from-start off``; cuBLAS's kernels unfiltered, the lab's by name),
    :data:`SMEM_SECTIONS` and those of :data:`SMEM_METRICS` this ncu lists. The rows of each case that ran (its case
    line printed), the metrics asked for, and whether every case ran; a failing case is said and left out. Logs:
    ``<tag>-ncu.txt``, ``<tag>-ncu-query.txt``."""
    import csv
    import io

    qtext, avail = ncu.query_metrics()
    (out / f"{tag}-ncu-query.txt").write_text("\n".join(ln for ln in qtext.splitlines()
                                                       if any(w in ln for w in ("l1tex__data", "tensor", "shared", "gmma"))))
    metrics = [m for m in SMEM_METRICS if ncu.metric_available(m, avail)]
    args.log(f"{tag} ncu: {len(metrics)} of {len(SMEM_METRICS)} wanted metrics listed by this ncu: {metrics}")
    table, log = [], []
    for i, case in enumerate(cases):
        who = case[0]
        cmd = ["ncu", "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "details"]
        if who != "cublas":
            cmd += ["-k", "regex:wgmma_kq"]
        for sname in SMEM_SECTIONS:
            cmd += ["--section", sname]
        if metrics:
            cmd += ["--metrics", ",".join(metrics)]
        cmd += [sys.executable, "-c", SMEM_DRIVER, *map(str, case)]
        r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        log.append(f"### case {i} {case} rc={r.returncode}\n" + r.stdout[-4000:] + r.stderr[-4000:])
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith('"')]
        rows = list(csv.DictReader(io.StringIO("\n".join(lines)))) if lines else []
        if r.returncode != 0 or not rows or not any(ln.startswith("case ") for ln in r.stdout.splitlines()):
            args.log(f"{tag} ncu case {case} failed rc={r.returncode}: {(r.stdout + r.stderr)[-600:]}")
            continue
        who, qtype, nt, od, id_, bn, sk, epi = case
        for x in rows:
            table.append({"case": i, "who": who, "qtype": qtype, "nt": nt, "od": od, "id": id_, "BN": bn, "SK": sk,
                          "EPI": epi, "kernel_id": int(x["ID"]), "kernel_name": x.get("Kernel Name"),
                          "section": x.get("Section Name"), "metric": x.get("Metric Name"),
                          "unit": x.get("Metric Unit"), "value": x.get("Metric Value")})
    (out / f"{tag}-ncu.txt").write_text("\n".join(log))
    return table, metrics, len({t["case"] for t in table}) == len(cases)


def _kpair_ab_run(out: Path, args, what: str, plan: dict, builds: dict | None = None,
                  ablations: dict | None = None) -> str:
    """One recorded run of kpair.kpair_ab at ``plan``'s points: the KPAIR build and its ``builds`` (forms
    that compute Y: real-model gated and gated at every point) and ``ablations`` (timing only, never gated) beside the
    launches of record and cuBLAS; its params name both (a key only when given). Returns the run id."""
    params = {"what": what, "plan": plan, "defines": list(wb.KPAIR)}
    params |= {k: {s: list(d) for s, d in v.items()} for k, v in (("builds", builds), ("ablations", ablations)) if v}
    params["real_nts"] = list(kpair.KPAIR_REAL_NTS)
    with records.recording(SERIES, params, root=out / "data") as run:
        kpair.kpair_ab(run, plan=plan, progress=args.log, builds=builds, ablations=ablations)
    return run.run_id


def _ncu_then_kpair_ab(out: Path, args, tag: str, cases, ab_what: str, plan: dict, ablations: dict) -> dict:
    """An ncu-and-A/B step: :func:`_ncu_cases` of ``cases`` recorded as ``<tag>_ncu`` (table ``smem_ncu``), then the
    KPAIR build beside its ``ablations`` at ``plan``'s points (kpair.kpair_ab; the build real-model gated,
    every non-ablation launch parity-gated) recorded as ``ab_what``."""
    table, metrics, ok = _ncu_cases(out, args, cases, tag)
    with records.recording(SERIES, {"what": f"{tag}_ncu", "sections": list(SMEM_SECTIONS), "metrics": metrics,
                                     "cases": [list(c) for c in cases]}, root=out / "data") as run:
        run.append("smem_ncu", table)
    args.log(f"{tag} ncu: {len({t['case'] for t in table})} of {len(cases)} cases recorded (run {run.run_id})")
    return {"ok": ok, "run": run.run_id, "ab_run": _kpair_ab_run(out, args, ab_what, plan, ablations=ablations)}


def step_wgmma_smem(out: Path, args) -> dict:
    """Round 7, twenty-second step: (1) Nsight Compute of cuBLAS fp16 (the baseline) at the bar's shapes and nt 512 /
    4096 beside the launches of record, the KPAIR build and its half-B ablation (LK_ABLATE_HALFB) at 4096 x 4096 --
    launch configuration, tensor pipe, shared memory's data banks -- one process per case; (2) the half-B ablation's
    timing A/B beside the KPAIR build, the launches of record and cuBLAS (kpair.kpair_ab with
    ``ablations``; the KPAIR build real-model gated and every non-ablation launch parity-gated); both recorded."""
    return _ncu_then_kpair_ab(out, args, "smem", SMEM_CASES, "halfb_ab", kpair.HALFB_AB, {"_halfb": kpair.HALFB})


#: the twenty-fourth step's ncu cases: cuBLAS and the KPAIR build with each of its ablations (kpair.KPAIR_BUILDS) at
#: 4096 x 4096, nt=512 (the bar's point, one wave)
DECOUPLE_CASES = tuple([("cublas", "f16", 512, 4096, 4096, 0, 0, 0)]
                       + [(who, q, 512, 4096, 4096, 256, 0, 0) for q in ("q4_K", "q6_K") for who in kpair.KPAIR_BUILDS])


def step_wgmma_decouple(out: Path, args) -> dict:
    """Round 7, twenty-fourth step: what holds the KPAIR build's loop -- its pair's lock-step or its conversion.
    (1) Nsight Compute of :data:`DECOUPLE_CASES`, one process per case; (2) the timing A/B of the KPAIR build beside
    its ablations (kpair.DECOUPLE_ABLATIONS: half B, half B decoupled, no conversion, decoupled without conversion),
    the launches of record and cuBLAS (kpair.kpair_ab; the KPAIR build real-model gated, every
    non-ablation launch parity-gated); both recorded."""
    return _ncu_then_kpair_ab(out, args, "decouple", DECOUPLE_CASES, "decouple_ab", kpair.DECOUPLE_AB,
                              kpair.DECOUPLE_ABLATIONS)


#: the twenty-fifth step's shapes (od, id) at nt=512: the KPAIR build and the BN=128 launch of record traced
KPAIR_TRACE_SHAPES = ((4096, 4096), (4096, 14336))


def step_wgmma_kpairtrace(out: Path, args) -> dict:
    """Round 7, twenty-fifth step: the per-CTA phase stamps of the KPAIR build (a -DLK_EXP_KPAIR -DLK_EXP_TRACE
    build) beside those of the BN=128 data-parallel launch of record (-DLK_EXP_TRACE), q4_K and q6_K at
    :data:`KPAIR_TRACE_SHAPES`, nt=512 -- each after warm-up launches and once more right after an L2 flush, as the
    benchmark times a launch. Tables ``kpair_trace`` / ``kpair_trace_flushed`` (traces.kpair_trace_phases)
    and ``bn128_trace`` / ``bn128_trace_flushed`` (traces.trace_roles), recorded."""
    rng = np.random.default_rng(25)
    flusher = bench.Flusher()
    nt = 512
    sms = wgmma._sm_count(wgmma._cp().cuda.Device().id)
    with records.recording(SERIES, {"what": "kpair_trace", "defines": list(wb.KPAIR) + ["LK_EXP_TRACE"], "nt": nt,
                                     "sm_count": sms, "shapes": [list(x) for x in KPAIR_TRACE_SHAPES]},
                           root=out / "data") as run:
        for od, id_ in KPAIR_TRACE_SHAPES:
            x16 = wgmma._cp().asarray(rng.standard_normal((nt, id_)).astype(np.float16))
            for qtype in ("q4_K", "q6_K"):
                w = wgmma.WgWeight.from_gguf(cases.synthetic_weights(qtype, od, id_, rng), qtype)
                bn128 = f"wgmma_bn128_s4_scl{wgmma.main_scl(qtype, 128)}"
                for name, tab, kw in ((kpair.KPAIR_VARIANT, "kpair_trace", {"kpair": True}),
                                      (bn128, "bn128_trace", {"BN": 128, "SCL": wgmma.main_scl(qtype, 128)})):
                    key = {"qtype": qtype, "od": od, "id": id_, "nt": nt, "variant": name}
                    warm = traces.trace_launch(w, x16, **kw)
                    cold = traces.trace_launch(w, x16, flush=flusher, **kw)
                    run.append(tab, [{**key, **r} for r in warm])
                    run.append(tab + "_flushed", [{**key, **r} for r in cold])
                    if kw.get("kpair"):
                        ph = traces.kpair_trace_phases(cold, id_).median()
                        args.log(f"kpair trace {qtype} {od}x{id_} (cold, medians over CTAs): fill {ph.fill_us:.2f} us, "
                                 f"main {ph.main_us:.2f} us ({ph.cycles_per_iter:,.0f} cycles a super-block), finish "
                                 f"{ph.finish_us:.2f} us, exit {ph.exit_us:.2f} us, end {ph.end_us:.1f} us")
                    else:
                        ro = traces.trace_roles([{**key, **r} for r in cold], sms).iloc[0]
                        args.log(f"bn128 trace {qtype} {od}x{id_} (cold): fill {ro.fill_us:.2f} us, main "
                                 f"{ro.main_us:.2f} us ({ro.cycles_per_iter:,.0f} cycles a super-block), finish "
                                 f"{ro.finish_us:.2f} us, end {ro.end_us_max:.1f} us")
    return {"ok": True, "run": run.run_id}


def step_wgmma_kpairfin(out: Path, args) -> dict:
    """Round 7, twenty-sixth step: the KPAIR build's form with Y through TMA stores and the exit barrier arrived at
    after the main loops (LK_EXP_KPAIR_FIN, wb.KPAIR_FIN), real-model gated and timed beside the KPAIR build, the
    launches of record and cuBLAS at every point of kpair.KPAIR_AB (kpair.kpair_ab with ``builds``; every
    launch parity-gated), recorded."""
    return {"ok": True, "run": _kpair_ab_run(out, args, "kpairfin_ab", kpair.KPAIR_AB, builds={"_fin": wb.KPAIR_FIN})}


def step_wgmma_halfy(out: Path, args) -> dict:
    """Round 7, twenty-eighth step: what the float32 Y costs the FIN form -- its LK_ABLATE_HALFY build (half of Y's
    bytes stored, the bytes of a 16-bit Y; timing only, never gated) timed beside the FIN form, the KPAIR build, the
    launches of record and cuBLAS at every point of kpair.KPAIR_AB (kpair.kpair_ab: the FIN form
    real-model gated and gated at every point, the ablation not), recorded."""
    return {"ok": True, "run": _kpair_ab_run(out, args, "halfy_ab", kpair.KPAIR_AB, builds={"_fin": wb.KPAIR_FIN},
                                             ablations={"_fin_halfy": wb.FIN_HALFY})}


def step_wgmma_smemform(out: Path, args) -> dict:
    """Round 7, twenty-third step: the shared-memory form (one and two converter warpgroups) and the register form at
    BN=128, each beside its no-conversion build (LK_ABLATE_NOCONV, timing only), and cuBLAS, at the bar's shapes and
    nt 512 / 4096 (kpair.smemform_ab; every plain launch parity-gated), recorded."""
    return _record_ab(out, args, "smemform_ab", {**kpair.SMEMFORM_AB, "ablations": list(kpair.NOCONV)},
                      kpair.smemform_ab)


#: prefill variants the A/B step can compare (name -> PrefillOptions fields)
PREFILL_VARIANTS = {"int8": {"kernel": "int8"}, "auto": {"kernel": "auto"},
                    "auto-unfused": {"kernel": "auto", "fuse_f16": False},
                    "auto-attn-baseline": {"kernel": "auto", "attention": "baseline"},
                    "auto-attn-cudnn": {"kernel": "auto", "attention": "cudnn"}}


def step_prefill_r7(out: Path, args) -> dict:
    """Round 7 in the prefill: the synthetic 7B (and Gemma 3 270M when its GGUF is here), prefill variants
    (--ab, default int8 vs auto) interleaved in one process at nt 512 and 3325; Gemma logits parity; the logits
    of every variant against the first one's."""
    import gc

    names = [v for v in args.ab.split(",") if v]
    bad = [v for v in names if v not in PREFILL_VARIANTS]
    if bad:
        raise SystemExit(f"unknown prefill variants {bad}: {', '.join(PREFILL_VARIANTS)}")
    models = [("synthetic-7b", True)]
    if Path(args.gemma or default_model_path()).exists():
        models.append((str(args.gemma or default_model_path()), True))
    runs = []
    cp = gpu.cp()
    for spec, f16 in models:
        label = "synthetic-7b" if spec == "synthetic-7b" else "gemma-3-270m-q4_k_m"
        with records.recording("prefill", {"model": label, "nts": [512, 3325], "attn_f16": f16, "ab": names,
                                           "variants": {v: PREFILL_VARIANTS[v] for v in names}},
                               root=out / "data") as run:
            m = synthetic.load_model(spec)
            if label != "synthetic-7b":
                prefill_runs.parity_run(spec, run, n_new=0, progress=args.log, kernel="auto")
            gms = {k: prefill.GpuModel(m, opts=prefill.PrefillOptions(attn_f16=f16, **PREFILL_VARIANTS[k]))
                   for k in names}
            for nt in (512, 3325):
                toks = prefill_runs.prompt_tokens(m, nt)
                ref = None
                for k, gm in gms.items():        # the variants' logits against the first variant's
                    lg = cp.asnumpy(gm.forward(toks)).astype(np.float64)
                    ref = lg if ref is None else ref
                    run.append("logits_vs_first", {"model": label, "nt": nt, "variant": k, "first": names[0],
                                                   "max_abs_diff": float(np.abs(lg - ref).max()),
                                                   "max_rel_diff": float(np.abs(lg - ref).max() / np.abs(ref).max()),
                                                   "top1_same": bool(lg.argmax() == ref.argmax())})
                for rnd in range(3):
                    for k, gm in gms.items():
                        t = prefill_replay.timed_prefill(gm, toks, repeats=3)
                        row = {"model": label, "arch": gm.cfg.arch, "nt": nt, "kernel": k, "round": rnd,
                               "wall_ms": t["wall_ms"], "tok_per_s": t["tok_per_s"], "repeats": 3, "attn_f16": f16,
                               "gemm_families": gm.families_used(), "attention": gm.attn.name,
                               "attention_note": gm.attn.note}
                        run.append("throughput", row)
                        args.log(f"prefill {label} nt={nt} {k} ({row['gemm_families']}): {t['wall_ms']:.1f} ms "
                             f"{t['tok_per_s']:.0f} tok/s")
        runs.append(run.run_id)
        del gms, m
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
    return {"ok": True, "runs": runs}


def step_wgmma_plane(out: Path, args) -> dict:
    """Round 7: the q4_K scale plane (SCL=2, written at load) against the in-loop header decode (SCL=0) at BN=128,
    beside the BN=256 split grids and cuBLAS at nt 512 and 4096 (options.plane_ab), real-model gated,
    recorded."""
    return _record_ab(out, args, "plane_ab", options.PLANE_AB, options.plane_ab)


def step_wgmma_ceiling(out: Path, args) -> dict:
    """Round 7: the plain launches against their no-load and no-conversion ablation builds (timing only), each plain
    launch parity-gated, interleaved with cuBLAS at nt 512 and 4096 (limits.ceiling_ab), recorded."""
    return _record_ab(out, args, "ceiling_ab", {**limits.CEILING_AB, "builds": {k: list(v) for k, v in
                                                                            limits.CEILING_BUILDS.items()}},
                      limits.ceiling_ab)


def step_wgmma_floor(out: Path, args) -> dict:
    """Round 7: the launch floor -- the launches of record at nt=512 against an empty build of themselves (the same
    grid, threads, shared memory and parameters, no work; timing only), each plain launch parity-gated, interleaved
    with cuBLAS and a 1-CTA empty kernel (limits.floor_ab), recorded."""
    return _record_ab(out, args, "floor_ab", {**limits.FLOOR_AB, "builds": {k: list(v) for k, v in
                                                                        limits.FLOOR_BUILDS.items()}},
                      limits.floor_ab)


def step_wgmma_clock(out: Path, args) -> dict:
    """Round 7: the SM clock during the launches of record and cuBLAS at nt=512 (a clock probe beside each launch,
    after the flush; limits.clock_ab), each launch parity-gated, recorded."""
    return _record_ab(out, args, "clock_ab", limits.CLOCK_AB, limits.clock_ab)


def step_wgmma_kscan(out: Path, args) -> dict:
    """Round 7: the launches of record and cuBLAS fp16 (fp16 and fp32 output) over id at nt=512, od=4096 (time =
    intercept + slope x id: fixed cost per launch against the main loop's cost per k), cuBLAS also alone at small
    k, each launch parity-gated (limits.kscan_ab), recorded."""
    return _record_ab(out, args, "kscan_ab", limits.KSCAN_AB, limits.kscan_ab)


def step_wgmma_kpair(out: Path, args) -> dict:
    """Round 7, exploratory: one 64-row x 256-token tile per CTA with k split between its two consumer warpgroups, in
    2-CTA clusters multicasting the activations (-DLK_EXP_KPAIR), real-model gated, against the launches of record and
    cuBLAS at nt 512 and 4096, every launch parity-gated (kpair.kpair_ab), recorded."""
    return _record_ab(out, args, "kpair_ab", {**kpair.KPAIR_AB, "defines": list(wb.KPAIR),
                                              "real_nts": list(kpair.KPAIR_REAL_NTS)}, kpair.kpair_ab)
