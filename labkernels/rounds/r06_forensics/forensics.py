"""Counter forensics: per-GMAC hardware counters of the GEMM kernels with Nsight Compute (seeds 001).

The method (seeds 001, r13), as code:

* **discover** the metric names the device offers (``ncu --query-metrics``; :func:`parse_query_metrics`)
  and pick, per counter *concept*, the first candidate it has (:data:`CONCEPTS`, :func:`choose_metrics`) --
  never assume one chip's names on another (the seeds' GB10 had no ``dram__*`` and counted int8 mma under
  IMMA, not HMMA);
* **profile** exactly one launch per case: :mod:`labkernels.rounds.r06_forensics.forensics_driver` runs one matched-shape GEMM
  per process and :func:`ncu_command` selects its last launch with a kernel-name regex and
  ``--launch-skip/--launch-count``; clocks are left alone (``--clock-control none``);
* **parse** ncu's raw CSV (:func:`parse_ncu_csv`: units row, quoted thousands separators, ``==PROF==``
  noise) and **normalize** every count per GMAC (:func:`per_gmac`);
* **check** before comparing anything that both kernels of a pair do the same tensor work
  (:func:`imma_check`: IMMA instructions = MACs / (16*8*K) for mma.m16n8kK, IMMA ops per MAC identical on
  every kernel and equal to the expected value);
* **fit** duration against warp instructions (the seeds' linear law, :func:`fit_linear`);
* **counter-evidence**: a variant built by a template switch that removes one hypothesized cost (q6k_expb
  EPI=0 -> EPI=1 removes the epilogue's int->float conversions); :func:`verdict` says whether duration moved
  beyond the measured noise band.

The plumbing (counter concepts, metric discovery, the ncu command, its CSV) is :mod:`labkernels.ncu`; the
analysis (per GMAC, IMMA check, fit, verdict) :mod:`labkernels.rounds.r06_forensics.counters`. :func:`run_forensics` does all of it on the GPU machine and records a run (round ``forensics``) with tables
``metrics`` (raw, per case), ``per_gmac``, ``imma_check``, ``fit`` and ``verdicts``; the raw ncu text and the
query-metrics output are kept as files beside the records. ``labkernels gpu forensics`` is its command line.
"""

from __future__ import annotations

import json
import lzma
import math
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import pandas as pd

from ... import paths, records
from ...kernels import registry
from . import forensics_driver as drv, ncu_rep
from .counters import ab_summary, concept_view, fit_table, imma_check, imma_ok, pair_table, per_gmac, verdict
from ...ncu import (METRIC_SETS, REQUIRED, NcuError, _json_line, _run, _tail, choose_metrics, concept_columns,
                    find_ncu, import_command, metric_list, ncu_command, parse_ncu_csv, query_device, query_metrics,
                    rejected_metrics)

ROUND = "forensics"


class ForensicsError(RuntimeError):
    pass


#: the structural comparisons at matched shapes: (name, base variant, other variant, what it asks)
PAIRS = (
    ("generic_vs_expb", "q6k_generic", "q6k_expb_epi0", "q6_K: generic (old road) vs expanded-B"),
    ("q6k_vs_q4k", "q6k_expb_epi1", "q4k_nb_kdr4", "q6_K expanded-B vs q4_K raw-nibble (both magic epilogue, OCC 1 vs 2)"),
    ("epi0_vs_epi1", "q6k_expb_epi0", "q6k_expb_epi1_occ2", "EPI template switch at OCC=2"),
)


#: counter-evidence experiments: the variant differs from the base by one template switch
COUNTER_EVIDENCE = (
    {"name": "i2f_epilogue", "base": "q6k_expb_epi0", "variant": "q6k_expb_epi1_occ2",
     "hypothesis": "the int32->float (I2F) conversions of the EPI=0 epilogue carry the gap",
     "switch": "q6k_expb_kernel template parameter EPI 0 -> 1 (magic-number epilogue, no I2F); KDR=4, "
               "STRIDE=210, OCC=2 on both"},
)


def profile_case(variant: str, shape, chosen: dict, out_dir: Path, ncu: str = "ncu", warmup: int = 2,
                 repeats: int = 10, parity: bool = True, timeout: int = 600, progress=print, *,
                 report: bool = True, source: bool = True, nvtx: bool | None = None) -> tuple:
    """ncu over one driver process; returns (row: case info + metrics, raw ncu text, the command, units, the kept
    ``.ncu-rep`` or None). A metric ncu rejects is dropped (required ones excepted) and the case is profiled once more
    without it. ``report``: keep the report (``--export``; its metrics read back with ``ncu --import`` when the export
    printed none); ``source``: with the SourceCounters section and the .cu text (the hotspot table); ``nvtx`` (default:
    the ``nvtx`` package is importable): the launch selected by the driver's NVTX range, not by ``--launch-skip``."""
    spec = drv.case_spec(variant, shape)
    nvtx = ncu_rep.have_nvtx() if nvtx is None else bool(nvtx)
    plan = drv.launch_plan(warmup, repeats, nvtx=nvtx)
    rep = Path(out_dir) / f"ncu-{spec['variant']}-{spec['shape']}.ncu-rep" if report else None
    metrics = metric_list(chosen)
    required = {chosen[c] for c in REQUIRED if c in chosen}
    log = Path(out_dir) / f"ncu-{spec['variant']}-{spec['shape']}.csv.tmp"
    args = ["-m", "labkernels.rounds.r06_forensics.forensics_driver", "--case", variant, "--shape", spec["shape"],
            "--warmup", warmup, "--repeats", repeats] + ([] if parity else ["--no-parity"])
    for attempt in range(2):
        cmd = ncu_command(args, metrics, spec["kernel_regex"], plan["launch_skip"], plan["launch_count"], log, ncu=ncu,
                          nvtx_include=plan.get("nvtx_include"), export=rep,
                          sections=("SourceCounters",) if (source and rep) else (), import_source=bool(source and rep))
        if log.exists():
            log.unlink()
        t0 = time.time()
        env = {**os.environ, "LABKERNELS_LINEINFO": "1"} if (source and rep) else None
        r = _run(cmd, timeout=timeout, cwd=paths.REPO_ROOT, env=env)
        raw = log.read_text() if log.exists() else ""
        if rep is not None and rep.exists() and parse_ncu_csv(raw).empty:   # --export printed no table: read it back
            imp = _run(import_command(rep, ncu), timeout=timeout)
            raw = raw + "\n" + (imp.stdout or "")
        allout = raw + "\n" + (r.stdout or "") + "\n" + (r.stderr or "")
        bad = rejected_metrics(allout, metrics)
        if bad and attempt == 0 and not (set(bad) & required):
            progress(f"  ncu rejected {bad}; profiling {spec['case']} again without them")
            metrics = [m for m in metrics if m not in bad]
            continue
        break
    if log.exists():
        log.unlink()
    if any(s in allout for s in ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "Failed to initialize the profiler")):
        raise NcuError(f"ncu cannot read the hardware counters on this machine ({spec['case']}):\n{_tail(allout)}")
    info = _json_line(r.stdout or "", "forensics_case")
    if r.returncode != 0 or info is None:
        raise NcuError(f"{spec['case']}: rc={r.returncode}\n$ {shlex.join(cmd)}\n{_tail(allout)}")
    df = parse_ncu_csv(raw)
    if len(df) == 0 and plan.get("nvtx_include"):
        # the NVTX filter matched nothing (an ncu without NVTX support, a range the driver did not emit): choose the
        # launch by count instead, and say so in the row
        progress(f"  {spec['case']}: ncu --nvtx-include {plan['nvtx_include']} profiled no launch; selecting by "
                 "--launch-skip instead")
        out = profile_case(variant, shape, chosen, out_dir, ncu, warmup, repeats, parity, timeout, progress,
                           report=report, source=source, nvtx=False)
        out[0]["selected_by"] = "launch_skip (nvtx matched none)"
        return out
    if len(df) != plan["launch_count"]:
        raise NcuError(f"{spec['case']}: ncu profiled {len(df)} launches, expected {plan['launch_count']} "
                       f"(regex {spec['kernel_regex']!r}, skip {plan['launch_skip']})\n{_tail(allout)}")
    launch = df.iloc[0].to_dict()
    want = spec["name_expression"].split("<", 1)
    name = str(launch.get("Kernel Name", ""))
    if spec["template"] not in name:
        raise NcuError(f"{spec['case']}: profiled kernel {name!r} is not {spec['template']}")
    targs = [a.strip() for a in want[1].rstrip(">").split(",")] if len(want) > 1 else []
    got_args = re.search(r"<([^>]*)>", name)
    args_match = None
    if targs and got_args:
        args_match = [a.strip() for a in got_args.group(1).split(",")] == targs
        if not args_match:
            progress(f"  warning: profiled {name!r}; expected template arguments <{','.join(targs)}>")
    timing = info.get("timing") or {}
    row = {"case": spec["case"], "variant": variant, "shape": spec["shape"], "nt": spec["nt"], "od": spec["od"],
           "id": spec["id"], "qtype": spec["qtype"], "kernel": spec["kernel_key"], "mma_k": spec["mma_k"],
           "macs": spec["macs"], "macs_padded": spec["macs_padded"], "gmac": spec["gmac"],
           "event_median_us": timing.get("median_us"), "event_p20_us": timing.get("p20_us"),
           "event_p80_us": timing.get("p80_us"), "event_n": timing.get("n"),
           "parity_ok": (info.get("parity") or {}).get("ok"), "kernel_args_match": args_match,
           "ncu_seconds": round(time.time() - t0, 1), **launch}
    row.pop("Process ID", None)
    row.pop("Host Name", None)
    row["selected_by"] = "nvtx" if plan.get("nvtx_include") else "launch_skip"
    return row, raw, cmd, df.attrs.get("units", {}), (rep if rep is not None and rep.exists() else None)


#: the hottest source lines kept per case in the run's ``hotspots`` table
HOTSPOT_TOP = 12
#: the reports a forensics run keeps in data/ (git) at most, together; the page's kernel (FOCUS) first
RUN_REPORT_BUDGET = 24 << 20
#: the kernel round 6's page discusses (its hotspot table): its reports are kept before the others
FOCUS = "q6k_expb_epi0"


def keep_reports(run, reports: dict, spec_of=None, top: int = HOTSPOT_TOP, progress=print) -> tuple:
    """Each case's ``.ncu-rep`` attached to ``run`` xz-compressed as ``<case>.ncu-rep.xz`` (a full-set report of
    ~5 MB keeps in ~0.4 MB; ``xz -dk`` it, then open it in Nsight Compute) through
    :meth:`labkernels.records.Run.attach` (manifested, at most :data:`labkernels.records.MAX_ATTACH_BYTES`
    compressed; a bigger one stays in the results folder and is said so) and its
    per-source-line hotspots read back with ``ncu_report`` (:mod:`labkernels.rounds.r06_forensics.ncu_rep`). Returns ({case: attachment
    name or why not}, the hotspot rows as a DataFrame (``file`` as the report names it, ``source`` the lab's name
    of that file: :func:`source_name`), {case: why no hotspots})."""
    kept, rows, errors, total = {}, [], {}, 0
    for case, rep in sorted(reports.items(), key=lambda kv: not kv[0].startswith(FOCUS + "@")):
        name = re.sub(r"[^a-z0-9_-]+", "-", case.lower()).strip("-") + ".ncu-rep.xz"
        size = 0
        if run is not None:
            xz = Path(rep).with_name(Path(rep).name + ".xz")
            with open(rep, "rb") as src, lzma.open(xz, "wb", preset=6) as dst:
                shutil.copyfileobj(src, dst)
            size = xz.stat().st_size
        if run is None:
            kept[case] = str(rep)
        elif size > records.MAX_ATTACH_BYTES:
            kept[case] = f"not kept: {size} bytes xz-compressed, over the cap of {records.MAX_ATTACH_BYTES} ({rep})"
        elif total + size > RUN_REPORT_BUDGET:
            kept[case] = f"not kept: the run's reports would pass {RUN_REPORT_BUDGET} bytes ({rep})"
        else:
            run.attach(name, xz)
            kept[case] = name
            total += size
        try:
            spec = spec_of(case) if spec_of else {}
            kernel = str(spec.get("kernel", "")).split("<")[0] or ""
            h = ncu_rep.kernel_hotspots(rep, _template_of(spec) or kernel, top=top)
        except Exception as e:          # no ncu_report, no per-PC metric: the counters stand, the table is absent
            errors[case] = f"{type(e).__name__}: {e}"[:500]
            progress(f"  hotspots {case}: {errors[case]}")
            continue
        for i, r in h["lines"].iterrows():
            rows.append({"case": case, "rank": i + 1, "metric": h["metric"], "file": r["file"],
                         "source": source_name(r["file"], case), "line": int(r["line"]),
                         "value": float(r[h["metric"]]), "share": float(r["share"]),
                         "instructions": int(r["instructions"]), "hottest_sass": r["hottest_sass"]})
    return kept, pd.DataFrame(rows), errors


def _template_of(spec: dict) -> str:
    try:
        return drv.case_spec(spec["variant"], spec["shape"])["template"]
    except Exception:
        return ""


# ------------------------------------------------------------------------------------------------ hotspot file names
#: the name the ``-lineinfo`` of a kernel built through CuPy's kernel cache gives its .cu: ``gpu._module`` hands
#: ``RawModule`` the registry's source file read verbatim (``code=path.read_text()``; the tile constants travel as
#: ``-D`` options, nothing is prepended), and CuPy (14: ``cupy/cuda/compiler.py`` ``_compile_with_cache_cuda``)
#: writes that text to a temporary folder as ``<sha1 of the cache key>.cubin.cu`` and names the NVRTC program so.
#: Nsight Compute's source view, and so the ``file`` column of a run's ``hotspots`` table, carries that name; the
#: headers the source includes (``common.cuh``, ``tile.cuh``) keep their own.
BUILD_CACHE_NAME = re.compile(r"[0-9a-f]{40}\.cubin\.cu")


def is_build_cache_name(file) -> bool:
    """Whether ``file`` (a name or a path) is the build cache's hash-named copy of a kernel source."""
    return isinstance(file, str) and bool(BUILD_CACHE_NAME.fullmatch(os.path.basename(file)))


def kernel_source(case: str) -> str:
    """The registry's source file of a forensics case's kernel: case -> variant -> family -> its ``source``
    (``q6k_expb_epi0@3328x4096x4096`` -> ``q6k_expb.cu``; a bare variant or a label an older run used works too).
    An unknown variant raises :class:`labkernels.kernels.registry.RegistryError`."""
    return registry.variant(str(case).split("@", 1)[0]).spec().source


def source_name(file, case: str) -> str:
    """A hotspot row's file as the lab names it: the build cache's hash-named copy -> :func:`kernel_source` of the
    case (the same text, so the same line numbers); any other name (a header) unchanged."""
    return kernel_source(case) if is_build_cache_name(file) else (file if isinstance(file, str) else "")


def with_sources(hot: pd.DataFrame) -> pd.DataFrame:
    """``hot`` with a ``source`` column: the real file name of every row. Runs recorded with it keep their own
    (:func:`keep_reports` writes it); older runs' (their ``file`` the build cache's hash name) are mapped here from
    the case, never edited on disk."""
    hot = hot.copy()
    mapped = [source_name(f, c) for f, c in zip(hot["file"], hot["case"])] if len(hot) else []
    if "source" in hot.columns:
        hot["source"] = [s if isinstance(s, str) and s else m for s, m in zip(hot["source"], mapped)]
    else:
        hot.insert(list(hot.columns).index("file") + 1, "source", mapped)
    return hot


def hotspot_table(hot: pd.DataFrame, case: str) -> pd.DataFrame:
    """One case's rows of a run's ``hotspots`` table as the page shows them: ``file`` the kernel's real source file
    name (:func:`with_sources`), the build cache's hash name gone."""
    h = with_sources(hot[hot["case"] == case])
    h = h.drop(columns=["file"]).rename(columns={"source": "file"})
    return h[["rank", "file", "line", "value", "share", "instructions", "hottest_sass"]].reset_index(drop=True)


def hotspot_source_note(hot: pd.DataFrame, case: str, commit: str) -> str:
    """What the ``file`` / ``line`` columns of :func:`hotspot_table` refer to: the files under ``labkernels/kernels/``
    at the run's commit, and the name Nsight Compute's source view gives the kernel's own file."""
    h = with_sources(hot[hot["case"] == case])
    files = list(dict.fromkeys(h["source"]))
    built = sorted({os.path.basename(f) for f in h["file"] if is_build_cache_name(f)})
    src = kernel_source(case)
    note = (f"Line numbers refer to {', '.join(f'`labkernels/kernels/{f}`' for f in files)} at the run's commit "
            f"{commit} (`git show {commit}:labkernels/kernels/{src}`).")
    if built:
        note += (f" In the kept report the kernel's own file is named {', '.join(f'`{b}`' for b in built)}: CuPy's "
                 f"kernel cache compiles `{src}` under the SHA-1 of its cache key. The text is the file verbatim (the "
                 f"tile constants are `-D` options, nothing is prepended), so its line numbers are `{src}`'s.")
    return note


def ab_timing(base: str, variant: str, shape, pairs: int = 5, repeats: int = 20, timeout: int = 600) -> dict:
    """Interleaved base / variant / base-again timing in one driver process (no ncu)."""
    cmd = [sys.executable, "-m", "labkernels.rounds.r06_forensics.forensics_driver", "--ab", base, variant, "--shape", str(shape),
           "--pairs", str(pairs), "--repeats", str(repeats)]
    r = _run(cmd, timeout=timeout, cwd=paths.REPO_ROOT)
    info = _json_line(r.stdout or "", "forensics_ab")
    if r.returncode != 0 or info is None:
        raise ForensicsError(f"A/B timing failed: rc={r.returncode}\n$ {shlex.join(cmd)}\n"
                             f"{_tail((r.stdout or '') + (r.stderr or ''))}")
    return info


#: the per-case columns profile_case puts before the metrics
CASE_COLUMNS = ("case", "variant", "shape", "nt", "od", "id", "qtype", "kernel", "mma_k", "macs", "macs_padded",
                "gmac", "Kernel Name", "Grid Size", "Block Size", "parity_ok", "kernel_args_match")


def run_forensics(out_dir, cases=None, metrics_set: str = "full", record: bool = True, *, shapes=None,
                  ncu: str | None = None, warmup: int = 2, repeats: int = 0, ab_pairs: int = 5, ab_repeats: int = 20,
                  noise_floor: float = 0.005, parity: bool = True, timeout: int = 600, progress=print,
                  report: bool = True, source: bool = True) -> dict:
    """The whole round on the GPU machine. ``out_dir`` gets ``ncu-query-metrics.txt.gz``, ``ncu-raw.txt``
    (every case's raw ncu output) and, with ``record``, the run under ``out_dir/data/06_counter_forensics/``.

    Per case: one ncu process over :mod:`labkernels.rounds.r06_forensics.forensics_driver` (``warmup`` launches, the first
    parity-gated, then the profiled one; ``repeats`` CUDA-event-timed launches in between are off by
    default: under ncu's launch interception event times are distorted -- on the H200 a 104 us q4_K launch
    read 380-6081 us). The counter-evidence verdicts use interleaved A/B timing in a separate process
    without ncu (``ab_pairs`` rounds of ``ab_repeats`` launches each), noise band floored at
    ``noise_floor``. The duration in the fit is ncu's ``gpu__time_duration`` of the profiled launch."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cases = list(cases or drv.CASES)
    shapes = [drv.shape_name(*drv.parse_shape(s)) for s in (shapes or drv.DEFAULT_SHAPES)]
    for c in cases:
        drv._variant(c)
    t_start = time.time()
    ncu = find_ncu(ncu)

    ver = _run([ncu, "--version"], timeout=60)
    ncu_version = _tail((ver.stdout or "") + (ver.stderr or ""), 1)
    qtext, available = query_metrics(ncu)
    import gzip

    # mode 'all' lists ~500k lines (~100 MB on the H200): kept compressed
    with gzip.open(out / "ncu-query-metrics.txt.gz", "wt") as fh:
        fh.write(qtext)
    chosen = choose_metrics(available, metrics_set)
    device = query_device(qtext)
    progress(f"ncu {ncu_version}; device {device}; {len(available)} metrics listed; "
             f"{len(metric_list(chosen))} chosen ({metrics_set})")

    run = None
    if record:
        params = {"cases": cases, "shapes": shapes, "metrics_set": metrics_set, "warmup": warmup,
                  "repeats": repeats, "ab_pairs": ab_pairs, "ab_repeats": ab_repeats, "noise_floor": noise_floor,
                  "ncu_version": ncu_version, "ncu_device": device, "chosen_metrics": chosen,
                  "counter_evidence": list(COUNTER_EVIDENCE)}
        run = records.new_run(ROUND, params, root=out / "data")
    try:
        rows, raws, cmds, units, reports = [], [], {}, {}, {}
        for shape in shapes:
            for variant in cases:
                row, raw, cmd, u, rep = profile_case(variant, shape, chosen, out, ncu=ncu, warmup=warmup,
                                                     repeats=repeats, parity=parity, timeout=timeout, progress=progress,
                                                     report=report, source=source)
                rows.append(row)
                if rep is not None:
                    reports[row["case"]] = rep
                units.update(u)
                cmds[row["case"]] = shlex.join(map(str, cmd))
                raws.append(f"### case {row['case']}\n### $ {cmds[row['case']]}\n{raw}")
                (out / "ncu-raw.txt").write_text("\n".join(raws))
                progress(f"  {row['case']}: {row.get(chosen['duration'], math.nan) / 1e3:.1f} us (ncu), "
                         f"{row.get(chosen['warp_inst'], math.nan) / row['gmac'] / 1e6:.3f} M warp-inst/GMAC, "
                         f"parity {row['parity_ok']} ({row['ncu_seconds']} s)")
        metrics_df = pd.DataFrame(rows)
        cv = concept_view(metrics_df, chosen)
        # the per-GMAC table: the case columns and the chosen concepts only (the raw page also carries every
        # rollup of each metric, device attributes and launch__* values; those stay in the metrics table)
        keep = [c for c in CASE_COLUMNS if c in cv.columns] + \
            [c for c in concept_columns(chosen).values() if c in cv.columns]
        pg = per_gmac(cv[keep], "macs")
        pg["duration_us_per_gmac"] = pg["duration"] / 1e3
        check = imma_check(cv, macs="macs_padded", mma_k="mma_k")
        ok = imma_ok(check)
        progress(f"IMMA check: {'ok' if ok else 'FAILED'} (" + ", ".join(
            f"{r['case']}: inst x{r.get('inst_ratio', math.nan):.3f}, ops/MAC {r.get('ops_per_mac', math.nan):.3f}"
            for _, r in check.iterrows()) + ")")
        fits = fit_table(cv)
        for f in fits:
            if "slope_ns_per_inst" in f:
                progress(f"fit {f['fit']}: duration = {f['slope_ns_per_inst']:.4g} ns/inst x inst + "
                         f"{f['intercept_ns']:.4g}, r2 {f['r2']:.4f} ({f['inst_per_ns']:.3g} warp-inst/ns)")
        verdicts = []
        for ce in COUNTER_EVIDENCE:
            if ce["base"] not in cases or ce["variant"] not in cases:
                continue
            for shape in shapes:
                b = cv[(cv.variant == ce["base"]) & (cv["shape"] == shape)].iloc[0]
                v = cv[(cv.variant == ce["variant"]) & (cv["shape"] == shape)].iloc[0]
                ab = ab_summary(ab_timing(ce["base"], ce["variant"], shape, ab_pairs, ab_repeats, timeout),
                                noise_floor)
                pair_ok = bool(check[check.case.isin([b["case"], v["case"]])]["ok"].all())
                vd = verdict(ab["base_us"], ab["variant_us"], ab["noise"]) if pair_ok else "inconclusive"
                verdicts.append({
                    "experiment": ce["name"], "shape": shape, "base": ce["base"], "variant": ce["variant"],
                    "hypothesis": ce["hypothesis"], "switch": ce["switch"], "verdict": vd,
                    "reason": "" if pair_ok else "IMMA consistency check failed: the pair is not comparable",
                    **{f"ab_{k}": val for k, val in ab.items()},
                    "ncu_base_ns": float(b["duration"]), "ncu_variant_ns": float(v["duration"]),
                    "ncu_delta": float(v["duration"] / b["duration"] - 1.0),
                    "warp_inst_delta": float(v["warp_inst"] / b["warp_inst"] - 1.0),
                    "target_hit": bool(v["warp_inst"] < b["warp_inst"]),
                })
                progress(f"counter-evidence {ce['name']} @ {shape}: {vd} (delta {ab['delta']:+.2%}, noise "
                         f"{ab['noise']:.2%}, warp inst {verdicts[-1]['warp_inst_delta']:+.2%})")
        pairs = pair_table(pg, PAIRS)
        kept, hot, hot_errors = keep_reports(run, reports, spec_of=lambda case: next(
            r for r in rows if r["case"] == case), progress=progress)
        summary = {"ncu_reports": kept, "hotspots_errors": hot_errors, "imma_ok": ok, "verdicts": {f"{v['experiment']}@{v['shape']}": v["verdict"] for v in verdicts},
                   "fit_all": next((f for f in fits if f["fit"] == "all_cases"), None),
                   "ncu_commands": cmds,
                   "units": {m: units.get(m, "") for m in metric_list(chosen)},
                   "concepts": concept_columns(chosen), "seconds": round(time.time() - t_start, 1)}
        if run is not None:
            run.append("metrics", metrics_df)
            run.append("per_gmac", pg)
            run.append("imma_check", check)
            run.append("fit", fits)
            if pairs:
                run.append("pairs", pairs)
            if verdicts:
                run.append("verdicts", verdicts)
            if len(hot):
                run.append("hotspots", hot)
            run.finish(**summary)
            summary["run"] = run.run_id
        return {"ok": ok, "metrics": metrics_df, "hotspots": hot, "per_gmac": pg, "imma_check": check, "fit": pd.DataFrame(fits),
                "pairs": pd.DataFrame(pairs), "verdicts": pd.DataFrame(verdicts), "summary": summary,
                "chosen": chosen}
    except BaseException as e:
        if run is not None and run.meta.get("status") == "running":
            run.finish("failed", error=f"{type(e).__name__}: {e}"[:2000])
        raise


def load_run(run_id: str | None = None, root=None) -> dict:
    """Replay: the tables of a recorded forensics run (the latest complete one by default)."""
    run = records.load(ROUND, run_id, root) if run_id else records.latest(ROUND, root)
    if run is None:
        raise ForensicsError(f"no complete {ROUND} run recorded under {records.data_root() if root is None else root}")
    tables = {t: run.table(t) for t in run.meta.get("tables", [])}
    return {"run": run, **tables}


def _main(args) -> int:
    res = run_forensics(args.out, cases=args.cases.split(",") if args.cases else None,
                        metrics_set=args.metrics_set, record=not args.no_record,
                        shapes=args.shapes.split(",") if args.shapes else None, ncu=args.ncu,
                        warmup=args.warmup, repeats=args.repeats, ab_pairs=args.ab_pairs, ab_repeats=args.ab_repeats,
                        parity=not args.no_parity, timeout=args.timeout, report=not args.no_report,
                        source=not args.no_source)
    s = res["summary"]
    print(json.dumps({k: s[k] for k in ("imma_ok", "verdicts", "fit_all", "run") if k in s}, indent=1, default=str))
    return 0 if res["ok"] else 1


def add_arguments(p) -> None:
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-out"), help="results folder (default $OUT)")
    p.add_argument("--cases", default=None, help=f"comma list of cases (default all: {','.join(drv.CASES)})")
    p.add_argument("--shapes", default=None, help=f"comma list of NTxODxID (default {','.join(drv.DEFAULT_SHAPES)})")
    p.add_argument("--metrics-set", choices=METRIC_SETS, default="full", help="which ncu metrics to collect")
    p.add_argument("--ncu", default=None, help="the ncu executable (default $NCU, PATH, /opt/nvidia/nsight-compute)")
    p.add_argument("--warmup", type=int, default=2, help="untimed launches before the profiled one")
    p.add_argument("--repeats", type=int, default=0,
                   help="event-timed launches before the profiled one (0: under ncu's launch interception CUDA-event "
                        "times are not trustworthy; the verdicts use the --ab timing, which runs without ncu)")
    p.add_argument("--ab-pairs", type=int, default=5, help="interleaved A/B pairs of the timing without ncu")
    p.add_argument("--ab-repeats", type=int, default=20, help="timed launches per side of each A/B pair")
    p.add_argument("--timeout", type=int, default=600, help="seconds per ncu process")
    p.add_argument("--no-parity", action="store_true", help="skip the parity gate of each case (its numbers then do not count)")
    p.add_argument("--no-record", action="store_true", help="print only: record no run under data/")
    p.add_argument("--no-report", action="store_true", help="do not keep the .ncu-rep reports (nor read hotspots)")
    p.add_argument("--no-source", action="store_true",
                   help="no SourceCounters section / -lineinfo build (no per-line hotspot table)")


def register_cli(sub) -> None:
    p = sub.add_parser("forensics", help="Nsight Compute counter forensics: per-GMAC counters, IMMA check, "
                                         "linear law, counter-evidence verdicts (GPU machine)")
    add_arguments(p)
    p.set_defaults(func=_main)


def gpu_check_step(out: Path, args) -> dict:
    """``gpu check --steps forensics``: the round with the defaults (options from args when present)."""
    g = lambda k, d: getattr(args, k, d) if getattr(args, k, None) is not None else d  # noqa: E731
    res = run_forensics(out, cases=g("forensics_cases", None), metrics_set=g("forensics_metrics_set", "full"),
                        shapes=g("forensics_shapes", None), ncu=g("ncu", None))
    s = res["summary"]
    return {"ok": bool(res["ok"]), "run": s.get("run"), "imma_ok": s["imma_ok"], "verdicts": s["verdicts"]}

