"""An independent timer (issue 49 item 4): the benchmark of record's headline ratios measured again with NVIDIA's
nvbench (``cuda-bench``, its Python bindings ``cuda.bench``) and compared with the lab's harness.

The headlines (:data:`HEADLINES`): round 7's q4_K GEMM (``wgmma.gemm`` with the launch of record,
:func:`labkernels.wgmma.default_params`) at nt = 512 and 4096 against cuBLAS fp16 on cached fp16 weights
(``blas.matmul_f16``), and round 9's q4_K GEMV (``gemv.gemv``, default configuration) at nt = 1 against the same
cuBLAS call -- every side through the lab's own launch functions, the same inputs for both timers. The ratio is
``cublas_us / lab_us`` (> 1: the lab's kernel is faster), as on the round pages.

* **the lab's harness**: :func:`labkernels.bench.interleaved` (lab, cuBLAS per round, L2 flushed before every launch,
  CUDA events; the GEMV as round 9 times it: a read flush and a GPU lead so the host's enqueue is not timed), the
  median over rounds of each round's median;
* **nvbench**: one benchmark per (headline, side) in a separate process (:func:`worker`, ``python -m
  labkernels.nvbench_check --worker``): nvbench's cold measurement (L2 flushed before every sample), its default stop
  rule (relative standard deviation, ``stdrel``) and its throttle discard (samples taken while the SM clock is below
  ``throttle_threshold`` of the default clock are dropped, then it waits ``throttle_recovery_delay``). Each launch runs
  on nvbench's stream (``cupy.cuda.ExternalStream``), enqueued behind nvbench's blocking kernel (the host's enqueue
  not timed, as the harness's lead does). nvbench's cold GPU time (mean; the median where it reports one)
  is read from its JSON output (:func:`parse_nvbench_json`).

:func:`compare` (pure, CPU-tested) puts both side by side: per headline each timer's times and ratio, the ratio's
relative difference, ``agree`` when it is within :data:`TOLERANCE` (2%), and the difference and what differs
otherwise -- a disagreement is reported, never hidden. :func:`run_check` records it as an ``nvbench_check`` run (data/
09_decode/, table ``comparison``); rounds 7 and 9 show the latest one (:func:`latest_table`). ``labkernels gpu check
--steps nvbench_check`` runs it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import bench as B, blas, cases, gemv, gpu, nvml, paths, records, wgmma

SERIES = "nvbench_check"
#: agreement between the two timers on a headline ratio
TOLERANCE = 0.02


@dataclass(frozen=True)
class Headline:
    name: str
    round: int
    kernel: str       # "wgmma" (round 7's GEMM) or "gemv" (round 9's GEMV)
    qtype: str
    nt: int
    od: int
    id: int
    lead_us: float = 0.0   # the GEMV's GPU lead in the lab's harness (round 9's benchmark of record); 0: none


#: the benchmark of record's headline ratios (the GEMV's lead: round 9's, ``rounds.r09_decode.plan.PLAN["lead_us"]``, which
#: tests/test_nvbench_check.py holds equal -- this module does not import the round, whose step runs it)
HEADLINES = (
    Headline("gemm_q4k_nt512", 7, "wgmma", "q4_K", 512, 4096, 4096),
    Headline("gemm_q4k_nt4096", 7, "wgmma", "q4_K", 4096, 4096, 4096),
    Headline("gemv_q4k_nt1", 9, "gemv", "q4_K", 1, 4096, 14336, lead_us=300.0),
)
SIDES = ("lab", "cublas")


def headline(name: str) -> Headline:
    for h in HEADLINES:
        if h.name == name:
            return h
    raise KeyError(f"no headline {name!r}; headlines: {', '.join(h.name for h in HEADLINES)}")


# ------------------------------------------------------------------------------------------------ pure logic
def bench_name(case: str, side: str) -> str:
    return f"{case}:{side}"


def _num(v):
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _summary_value(summary: dict):
    """A summary's value: nvbench's JSON keeps it in ``data`` as [{"name": "value", "type": ..., "value": "1e-5"}]
    (older writers: ``value`` directly)."""
    if "value" in summary and not isinstance(summary["value"], (list, dict)):
        return _num(summary["value"])
    for d in summary.get("data", []) or []:
        if isinstance(d, dict) and d.get("name") == "value":
            return _num(d.get("value"))
    return None


def parse_nvbench_json(doc) -> dict:
    """nvbench's ``--json`` output -> {benchmark name: {"gpu_mean_us", "gpu_median_us" (or None), "gpu_noise"
    (relative stdev), "samples", "skipped", "skip_reason"}} from each benchmark's (first) state's cold summaries
    (``nv/cold/time/gpu/mean``, ``.../median``, ``.../stdev/relative``, ``nv/cold/sample_size``)."""
    if isinstance(doc, (str, bytes)):
        doc = json.loads(doc)
    out = {}
    for b in doc.get("benchmarks", []):
        name = b.get("name")
        states = b.get("states") or []
        if not states:
            continue
        st = states[0]
        sums = {s.get("tag"): _summary_value(s) for s in st.get("summaries", []) or [] if isinstance(s, dict)}
        mean = sums.get("nv/cold/time/gpu/mean")
        med = sums.get("nv/cold/time/gpu/median")
        out[name] = {"gpu_mean_us": mean * 1e6 if mean is not None else None,
                     "gpu_median_us": med * 1e6 if med is not None else None,
                     "gpu_noise": sums.get("nv/cold/time/gpu/stdev/relative"),
                     "samples": sums.get("nv/cold/sample_size"),
                     "skipped": bool(st.get("is_skipped", False)), "skip_reason": st.get("skip_reason") or ""}
    return out


def nvbench_time(entry: dict) -> float:
    """The time nvbench's entry stands for: its cold GPU median where reported, else its mean (NaN when skipped)."""
    if not entry or entry.get("skipped"):
        return math.nan
    v = entry.get("gpu_median_us")
    if v is None:
        v = entry.get("gpu_mean_us")
    return float(v) if v is not None else math.nan


def compare(lab: dict, nvb: dict, tol: float = TOLERANCE, headlines=HEADLINES) -> pd.DataFrame:
    """The two timers side by side. ``lab``: {case: {"lab_us", "cublas_us"}} (the lab's harness); ``nvb``:
    {case: {"lab_us", "cublas_us"}} (nvbench, :func:`nvbench_time`). One row per headline: both timers' times and
    ratios (``cublas / lab``), ``ratio_diff`` = nvbench ratio / harness ratio - 1, ``agree`` = |ratio_diff| <= tol, the
    per-side time differences, and ``note``: what differs when they do not agree (or what is missing)."""
    rows = []
    for h in headlines:
        a, b = lab.get(h.name) or {}, nvb.get(h.name) or {}
        la, ca = float(a.get("lab_us", math.nan)), float(a.get("cublas_us", math.nan))
        lb, cb = float(b.get("lab_us", math.nan)), float(b.get("cublas_us", math.nan))
        ra, rb = ca / la if la > 0 else math.nan, cb / lb if lb > 0 else math.nan
        diff = rb / ra - 1.0 if ra > 0 and rb > 0 else math.nan
        dl = lb / la - 1.0 if la > 0 and lb > 0 else math.nan
        dc = cb / ca - 1.0 if ca > 0 and cb > 0 else math.nan
        agree = bool(abs(diff) <= tol) if not math.isnan(diff) else False
        ln, cn = float(a.get("lab_us_nvflush", math.nan)), float(a.get("cublas_us_nvflush", math.nan))
        rn = cn / ln if ln > 0 and cn > 0 else math.nan
        diff_n = rb / rn - 1.0 if rn > 0 and rb > 0 else math.nan
        explained = bool(not agree and not math.isnan(diff_n) and abs(diff_n) <= tol)
        if math.isnan(diff):
            note = "missing: " + ", ".join(k for k, v in (("harness", ra), ("nvbench", rb)) if math.isnan(v))
        elif agree:
            note = f"agree within {tol:.0%}"
        else:
            side = ("the lab kernel's time" if abs(dl) >= abs(dc) else "cuBLAS's time")
            note = (f"differ by {diff:+.1%} (> {tol:.0%}): nvbench reads {side} differently (lab {dl:+.1%}, cuBLAS "
                    f"{dc:+.1%})")
            if explained:
                note += (f"; the harness behind nvbench's own L2 flush (a memset: dirty lines written back during the "
                         f"launch) gives {rn:.3f}, {diff_n:+.1%} from nvbench: the difference is the flush, not the "
                         f"timer")
            elif not math.isnan(diff_n):
                note += f"; behind nvbench's L2 flush the harness gives {rn:.3f} ({diff_n:+.1%}): not the flush alone"
        rows.append({"case": h.name, "round": h.round, "kernel": h.kernel, "qtype": h.qtype, "nt": h.nt, "od": h.od,
                     "id": h.id, "harness_lab_us": la, "harness_cublas_us": ca, "harness_ratio": ra,
                     "nvbench_lab_us": lb, "nvbench_cublas_us": cb, "nvbench_ratio": rb, "ratio_diff": diff,
                     "lab_time_diff": dl, "cublas_time_diff": dc, "agree": agree,
                     "harness_nvflush_lab_us": ln, "harness_nvflush_cublas_us": cn, "harness_nvflush_ratio": rn,
                     "nvflush_ratio_diff": diff_n, "explained": explained, "tolerance": tol, "note": note})
    return pd.DataFrame(rows)


def verdict(table: pd.DataFrame) -> str:
    """One line for a page: every headline agreeing, or the ones that do not and by how much."""
    if table is None or not len(table):
        return "no comparison recorded"
    bad = table[~table.agree.astype(bool)]
    if not len(bad):
        return (f"nvbench and the lab's harness agree within {table.tolerance.iloc[0]:.0%} on all {len(table)} "
                f"headline ratios (largest difference {table.ratio_diff.abs().max():.2%})")
    return "; ".join(f"{r.case}: {r.note}" for r in bad.itertuples())


def settled(table: pd.DataFrame) -> bool:
    """Every headline agrees within the tolerance, or its difference is explained by the flush (the harness behind
    nvbench's own flush agrees with nvbench: ``explained``; recorded runs before that column: never explained)."""
    if table is None or not len(table):
        return False
    expl = table["explained"].astype(bool) if "explained" in table else False
    return bool((table.agree.astype(bool) | expl).all())


# ------------------------------------------------------------------------------------------------ GPU side
def _setup(h: Headline, seed: int = 0) -> dict:
    """The case's inputs and its two launches through the lab's own functions: {"lab": fn, "cublas": fn}."""
    import cupy as cp
    import numpy as np

    rng = np.random.default_rng(seed)
    raw = cases.synthetic_weights(h.qtype, h.od, h.id, rng)
    x16 = cp.asarray(rng.standard_normal((h.nt, h.id)).astype(np.float16))
    wq = gpu.QWeight.upload(raw, h.qtype)
    w16 = gpu.dequant_f16(wq)
    y16 = cp.empty((h.nt, h.od), cp.float16)
    if h.kernel == "wgmma":
        w = wgmma.WgWeight.from_gguf(raw, h.qtype)
        y = cp.empty((h.nt, h.od), cp.float32)
        prm = wgmma.default_params(h.qtype, h.nt)
        lab = lambda: wgmma.gemm(w, x16, out=y, **prm)  # noqa: E731
    elif h.kernel == "gemv":
        gv = gemv.prepare(wq)
        yg = cp.empty((h.nt, h.od), cp.float32)
        lab = lambda: gemv.gemv(gv, x16, out=yg)  # noqa: E731
    else:
        raise ValueError(f"unknown kernel {h.kernel!r}")
    return {"lab": lab, "cublas": lambda: blas.matmul_f16(x16, w16, out=y16)}


def harness_times(names=None, pairs: int = 5, repeats: int = 20, seed: int = 0) -> dict:
    """The lab's harness: {case: {"lab_us", "cublas_us", "rounds"}} (interleaved, L2 flushed, CUDA events). The GEMV
    headline is timed twice, in one interleaved set: with round 9's read flush (its benchmark of record:
    ``lab_us``/``cublas_us``) and with nvbench's memset flush (:class:`labkernels.bench.MemsetFlusher`:
    ``lab_us_nvflush`` / ``cublas_us_nvflush``), the same GPU lead before each."""
    import numpy as np

    out = {}
    flush, read_flush, nv_flush, leads = B.Flusher(), None, None, {}
    for h in (headline(n) for n in (names or [h.name for h in HEADLINES])):
        fns = _setup(h, seed)
        if h.kernel == "gemv":      # round 9's benchmark of record: read flush, a lead so enqueue is not timed
            if read_flush is None:
                read_flush = B.ReadFlusher()
            if h.lead_us not in leads:
                leads[h.lead_us] = B.Lead(h.lead_us)
            lead = leads[h.lead_us]
            if nv_flush is None:
                nv_flush = B.MemsetFlusher()
            res, resn = {s: [] for s in SIDES}, {s: [] for s in SIDES}
            for _ in range(pairs):      # the two flushes alternate round by round: one interleaved set
                r1 = B.interleaved(fns, pairs=1, repeats=repeats, flush=read_flush, leads={s: lead for s in fns})
                r2 = B.interleaved(fns, pairs=1, repeats=repeats, flush=nv_flush, leads={s: lead for s in fns})
                for s in SIDES:
                    res[s] += r1[s]
                    resn[s] += r2[s]
        else:                       # round 7's: the L2 overwritten before every launch, CUDA events
            res, resn = B.interleaved(fns, pairs=pairs, repeats=repeats, flush=flush), None
        out[h.name] = {f"{s}_us": float(np.median([r["median_us"] for r in res[s]])) for s in SIDES}
        if resn is not None:
            out[h.name].update({f"{s}_us_nvflush": float(np.median([r["median_us"] for r in resn[s]]))
                                for s in SIDES})
        out[h.name]["rounds"] = pairs
    return out


def import_cuda_bench():
    try:
        import cuda.bench as nvbench
    except ImportError as e:
        raise ImportError("nvbench's Python bindings are missing: pip install cuda-bench (module cuda.bench); "
                          f"{e}") from e
    return nvbench


def worker(names, json_path, seed: int = 0, extra_args=()) -> None:
    """In a fresh process: one nvbench benchmark per (headline, side), run with nvbench's defaults (cold L2, stdrel
    stop rule, throttle discard), results to ``json_path``."""
    import cupy as cp

    nvbench = import_cuda_bench()
    keep = []
    for h in (headline(n) for n in names):
        fns = _setup(h, seed)
        keep.append(fns)
        for side in SIDES:
            fn = fns[side]
            fn()
            cp.cuda.runtime.deviceSynchronize()

            def bench(state, fn=fn):
                def launch(lc):
                    handle = lc.get_stream().__cuda_stream__()[1]
                    with cp.cuda.ExternalStream(int(handle)):
                        fn()
                state.exec(launch)

            nvbench.register(bench).set_name(bench_name(h.name, side))
    nvbench.run_all_benchmarks([sys.argv[0], "--json", str(json_path), *extra_args])


def nvbench_times(names=None, timeout: int = 900, seed: int = 0, json_path=None) -> tuple[dict, dict]:
    """nvbench in a subprocess (:func:`worker`): ({case: {"lab_us", "cublas_us"}}, the raw parsed entries)."""
    import tempfile

    names = list(names or [h.name for h in HEADLINES])
    jp = Path(json_path) if json_path else Path(tempfile.mkdtemp(prefix="lk-nvbench-")) / "nvbench.json"
    cmd = [sys.executable, "-m", "labkernels.nvbench_check", "--worker", "--json", str(jp), "--seed", str(seed),
           "--cases", ",".join(names)]
    r = subprocess.run(cmd, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or not jp.exists():
        raise RuntimeError(f"nvbench worker failed (rc={r.returncode}): {' '.join(cmd)}\n"
                           f"{((r.stdout or '') + (r.stderr or ''))[-3000:]}")
    parsed = parse_nvbench_json(jp.read_text())
    out = {}
    for n in names:
        out[n] = {f"{s}_us": nvbench_time(parsed.get(bench_name(n, s), {})) for s in SIDES}
    return out, parsed


def run_check(out=None, names=None, pairs: int = 5, repeats: int = 20, tol: float = TOLERANCE, seed: int = 0,
              record: bool = True, progress=print) -> dict:
    """Both timers on the headlines and the comparison, recorded as an ``nvbench_check`` run under ``out/data``
    (default the data root): tables ``comparison`` (:func:`compare`) and ``nvbench`` (nvbench's raw entries).

    The run is opened before either timer starts and finished after both, as every timed run is
    (:func:`labkernels.records.recording`): its NVML readings bracket the timing -- ``provenance.nvml_start`` before
    nvbench's subprocess, ``nvml_end`` after the harness, with ``reasons_seen`` over every reading between them (the
    one taken between the two timers and the harness's per-round ones) -- and the summary's ``nvml_nvbench_phase``
    is the GPU across nvbench's phase (start reading > the reading after it). A timer that fails leaves the run
    recorded ``failed`` with the error."""
    names = list(names or [h.name for h in HEADLINES])
    t0 = time.time()
    params = {"cases": names, "pairs": pairs, "repeats": repeats, "tolerance": tol, "seed": seed,
              "cuda_bench": _version("cuda-bench"), "stop_rule": "nvbench default (stdrel)",
              "l2": "cold (nvbench: a memset of the L2's size) / flushed per launch (harness: round 7's write "
                    "flush for the GEMMs; for the GEMV round 9's read flush and, alternating with "
                    "it, nvbench's memset flush)"}
    root = Path(out) / "data" if out is not None else None
    opened = records.recording(SERIES, params, root=root) if record else contextlib.nullcontext()
    with opened as run:     # NVML's start reading here, before nvbench; its end reading when the block finishes
        nvb, raw = nvbench_times(names, seed=seed)
        progress("nvbench: " + ", ".join(f"{k}: lab {v['lab_us']:.1f} us, cuBLAS {v['cublas_us']:.1f} us"
                                         for k, v in nvb.items()))
        start = (run.provenance.get("nvml_start") or {}) if run is not None else {"absent": "not recorded"}
        if "absent" not in start:   # nvbench timed in another process: the GPU as its phase ends, before the harness
            mid = nvml.reading(full=False)
            if "absent" not in mid:
                run.set_summary(nvml_nvbench_phase=nvml.pair_text(start, mid))
        lab = harness_times(names, pairs=pairs, repeats=repeats, seed=seed)
        progress("harness: " + ", ".join(f"{k}: lab {v['lab_us']:.1f} us, cuBLAS {v['cublas_us']:.1f} us"
                                         for k, v in lab.items()))
        table = compare(lab, nvb, tol, [headline(n) for n in names])
        v = verdict(table)
        progress(v)
        if run is not None:
            run.append("comparison", table)
            run.append("nvbench", [{"benchmark": k, **e} for k, e in raw.items()])
            run.set_summary(verdict=v, agree=bool(table.agree.all()), settled=settled(table),
                            seconds=round(time.time() - t0, 1))
    return {"ok": settled(table), "table": table, "verdict": v, "run": run.run_id if run is not None else None}


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "absent"


def latest_table(root=None, cases=None) -> tuple:
    """Replay: (the latest ``nvbench_check`` run or None, its comparison table restricted to ``cases``)."""
    run = records.latest(SERIES, root)
    if run is None:
        return None, pd.DataFrame()
    t = run.table("comparison")
    if cases is not None:
        t = t[t.case.isin(list(cases))]
    return run, t.reset_index(drop=True)


def page_view(round_no: int, root=None) -> tuple:
    """(a line for the round's page, the table's columns a reader needs) for the headlines of round ``round_no``."""
    run, t = latest_table(root, [h.name for h in HEADLINES if h.round == round_no])
    if run is None or not len(t):
        return ("No nvbench cross-check recorded yet (`labkernels gpu check --steps nvbench_check`).", t)
    card = run.gpu_name or "?"
    cols = ["case", "harness_lab_us", "harness_cublas_us", "harness_ratio", "nvbench_lab_us", "nvbench_cublas_us",
            "nvbench_ratio", "ratio_diff", "agree", "note"]
    if "harness_nvflush_ratio" in t and t.harness_nvflush_ratio.notna().any():
        cols[-2:-2] = ["harness_nvflush_ratio", "nvflush_ratio_diff", "explained"]
    return (f"nvbench cross-check, run {run.run_id} on {card}: {verdict(t)}", t[cols])


def step_nvbench_check(out, args) -> dict:
    """``gpu check --steps nvbench_check``: the headline ratios under nvbench and the lab's harness, recorded."""
    res = run_check(out, progress=getattr(args, "log", print))
    return {"ok": res["ok"], "run": res["run"], "verdict": res["verdict"]}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m labkernels.nvbench_check", description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help="(internal) run the nvbench benchmarks in this process")
    ap.add_argument("--json", default=None)
    ap.add_argument("--cases", default=",".join(h.name for h in HEADLINES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    a = ap.parse_args(argv)
    names = [n for n in a.cases.split(",") if n]
    if a.worker:
        worker(names, a.json, a.seed)
        return 0
    res = run_check(a.out, names, seed=a.seed)
    print(res["table"].to_string())
    return 0 if res["ok"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
