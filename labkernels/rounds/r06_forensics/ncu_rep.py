"""Nsight Compute reports (``.ncu-rep``) read back with ``ncu_report``, Nsight Compute's Python report interface, as
pandas tables (issue 49 item 2).

Round 6 keeps each profiled case's report with its run (:meth:`labkernels.records.Run.attach`, size-capped and
manifested), so a reader can reopen the source / SASS view behind a claim. This module is pure Python over the
report's object model -- ``IContext`` (ranges) -> ``IRange`` (actions) -> ``IAction`` (one profiled kernel: metrics,
NVTX state, source info by PC) -> ``IMetric`` (typed value, unit, instances with correlation ids = PCs):

* :func:`import_ncu_report` finds the module: the ``ncu-report`` wheel (PyPI) when installed, else the copy every
  Nsight Compute install ships under ``extras/python`` (next to the ``ncu`` found by :func:`labkernels.ncu.find_ncu`,
  ``$NCU_REPORT_PATH``, ``/opt/nvidia/nsight-compute/*``, ``/usr/local/cuda*``); :class:`NcuReportMissing` says
  where it looked;
* :func:`launches` -- one row per profiled kernel (name, grid, block, duration, NVTX ranges it ran in);
* :func:`metrics` -- one row per (kernel, metric): value, unit, metric type (counter / ratio / throughput), the typed
  view of what :func:`labkernels.ncu.parse_ncu_csv` reads from text;
* :func:`select_nvtx` -- the kernels inside an NVTX range (``IRange.actions_by_nvtx``, the report's own filter);
* :func:`pc_table` -- every source-correlated (per-PC) metric of a kernel, one row per SASS instruction, with its
  source file and line (builds with ``-lineinfo``: ``LABKERNELS_LINEINFO=1``, :func:`labkernels.gpu.lineinfo_options`);
  :func:`line_hotspots` / :func:`sass_hotspots` -- the hottest source lines / instructions by a metric and their
  share of the kernel's total: the table round 6's page shows.

The functions take any object with the interface's methods, so the tests run on a fake object model (no GPU, no
Nsight Compute); the GPU test profiles one small kernel with ncu and reads its report back.
"""

from __future__ import annotations

import glob
import importlib
import os
import sys
from pathlib import Path

import pandas as pd

from ...ncu import find_ncu


class NcuReportMissing(ImportError):
    """Neither the ``ncu-report`` wheel nor an Nsight Compute install's ``extras/python`` could be imported."""


#: per-PC metrics the hotspot table prefers, first found first (SourceCounters section: instructions executed per
#: SASS instruction; PC sampling); any other source-correlated metric of the report becomes a column too
HOTSPOT_METRICS = ("inst_executed", "sass__inst_executed", "smsp__sass_inst_executed", "smsp__inst_executed",
                   "smsp__pcsamp_sample_count", "smsp__pcsamp_warps_issue_stalled_long_scoreboard")

#: NVTX: the domain the lab's ranges live in, and the range around a profiled launch (forensics_driver)
NVTX_DOMAIN = "labkernels"
NVTX_TARGET = "target"


def _candidate_dirs(ncu: str | None = None) -> list[str]:
    dirs = []
    if os.environ.get("NCU_REPORT_PATH"):
        dirs += os.environ["NCU_REPORT_PATH"].split(os.pathsep)
    try:
        exe = find_ncu(ncu)
        if exe and os.sep in exe:
            real = os.path.realpath(exe)
            for base in (os.path.dirname(real), os.path.dirname(os.path.dirname(real))):
                dirs.append(os.path.join(base, "extras", "python"))
    except Exception:  # pragma: no cover - a broken PATH entry is not a reason to fail here
        pass
    dirs += sorted(glob.glob("/opt/nvidia/nsight-compute/*/extras/python"), reverse=True)
    dirs += sorted(glob.glob("/usr/local/cuda*/nsight-compute*/extras/python"), reverse=True)
    return list(dict.fromkeys(dirs))


def import_ncu_report(ncu: str | None = None):
    """The ``ncu_report`` module: the installed wheel (``pip install ncu-report``), else an Nsight Compute install's
    ``extras/python`` (added to ``sys.path``). :class:`NcuReportMissing` names every place tried."""
    try:
        return importlib.import_module("ncu_report")
    except ImportError as e:
        first = e
    tried = []
    for d in _candidate_dirs(ncu):
        tried.append(d)
        if os.path.isfile(os.path.join(d, "ncu_report.py")) or os.path.isdir(os.path.join(d, "ncu_report")):
            sys.path.insert(0, d)
            try:
                return importlib.import_module("ncu_report")
            except ImportError as e:   # pragma: no cover - a broken install
                sys.path.remove(d)
                first = e
    raise NcuReportMissing(
        "Nsight Compute's Python report interface (ncu_report) is not importable: install the wheel "
        "(pip install ncu-report) or point NCU_REPORT_PATH at an Nsight Compute install's extras/python. "
        f"Import error: {first}. Looked in: {', '.join(tried) or '(no Nsight Compute install found)'}")


def load(path, module=None):
    """The report's ``IContext`` (``ncu_report.load_report``)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such Nsight Compute report")
    mod = module or import_ncu_report()
    return mod.load_report(str(p))


# ------------------------------------------------------------------------------------------------ the object model
def iter_actions(ctx):
    """(range index, action index, IAction) of every profiled result in the report."""
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            yield r, a, rng.action_by_idx(a)


def _const(obj, name: str, default):
    return getattr(type(obj), name, getattr(obj, name, default))


def kernel_name(action, demangled: bool = False) -> str:
    if demangled:
        base = _const(action, "NameBase_DEMANGLED", None)
        if base is not None:
            try:
                return str(action.name(base))
            except TypeError:
                pass
    return str(action.name())


_TYPES = {"MetricType_COUNTER": "counter", "MetricType_RATIO": "ratio", "MetricType_THROUGHPUT": "throughput",
          "MetricType_OTHER": "other"}


def metric_type(m) -> str:
    t = m.metric_type()
    for const, name in _TYPES.items():
        if _const(m, const, object()) == t:
            return name
    return str(t)


def _scalar(m):
    try:
        v = m.value()
    except Exception:   # a metric without a value of its own (instanced only)
        return None
    return v


def metric_value(action, name: str, default=None):
    m = action.metric_by_name(name)
    if m is None:
        return default
    v = _scalar(m)
    return default if v is None else v


def nvtx_ranges(action) -> list[str]:
    """``domain@range`` of every NVTX push/pop and start/end range the kernel ran inside (outermost first)."""
    st = action.nvtx_state() if hasattr(action, "nvtx_state") else None
    if st is None:
        return []
    out = []
    for did in st.domains():
        dom = st.domain_by_id(did)
        dname = dom.name() or "default"
        for r in list(dom.push_pop_ranges()) + list(dom.start_end_ranges()):
            out.append(f"{dname}@{r}")
    return out


def launches(ctx) -> pd.DataFrame:
    """One row per profiled kernel: range, action, kernel (function name), demangled name, grid, block, registers,
    ``duration_ns`` (gpu__time_duration.sum), the NVTX ranges it ran in."""
    rows = []
    for r, a, act in iter_actions(ctx):
        rows.append({"range": r, "action": a, "kernel": kernel_name(act), "demangled": kernel_name(act, True),
                     "grid": metric_value(act, "launch__grid_size"), "block": metric_value(act, "launch__block_size"),
                     "registers": metric_value(act, "launch__registers_per_thread"),
                     "duration_ns": metric_value(act, "gpu__time_duration.sum"),
                     "nvtx": ";".join(nvtx_ranges(act))})
    return pd.DataFrame(rows, columns=["range", "action", "kernel", "demangled", "grid", "block", "registers",
                                       "duration_ns", "nvtx"])


def metrics(ctx, names=None, kernel: str | None = None) -> pd.DataFrame:
    """One row per (kernel, metric): value (numbers as float, strings kept), unit, metric type, instance count.
    ``names``: only these metrics (default every one the report holds); ``kernel``: only kernels whose function
    name contains it."""
    rows = []
    for r, a, act in iter_actions(ctx):
        kn = kernel_name(act)
        if kernel and kernel not in kn:
            continue
        for name in (names if names is not None else sorted(act.metric_names())):
            m = act.metric_by_name(name)
            if m is None:
                continue
            v = _scalar(m)
            if isinstance(v, bool):
                v = int(v)
            rows.append({"range": r, "action": a, "kernel": kn, "metric": name,
                         "value": float(v) if isinstance(v, (int, float)) else v, "unit": m.unit(),
                         "type": metric_type(m), "instances": int(m.num_instances())})
    return pd.DataFrame(rows, columns=["range", "action", "kernel", "metric", "value", "unit", "type", "instances"])


def metrics_wide(ctx, names=None) -> pd.DataFrame:
    """:func:`metrics` as one row per kernel, one column per metric (numbers only); units in ``attrs['units']``."""
    long = metrics(ctx, names)
    num = long[long.value.map(lambda v: isinstance(v, float))]
    wide = num.pivot_table(index=["range", "action", "kernel"], columns="metric", values="value", aggfunc="first")
    wide = wide.reset_index()
    wide.columns.name = None
    wide.attrs["units"] = dict(zip(num.metric, num.unit))
    return wide


def select_nvtx(ctx, include: str, exclude=()) -> list:
    """The actions inside an NVTX range (``domain@range/`` for push/pop, ncu's ``--nvtx-include`` syntax), range by
    range: ``IRange.actions_by_nvtx`` where the report has it, else the ranges :func:`nvtx_ranges` lists."""
    out = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        if hasattr(rng, "actions_by_nvtx"):
            idx = rng.actions_by_nvtx([include], list(exclude))
            out += [rng.action_by_idx(i) for i in idx]
        else:   # pragma: no cover - every ncu_report has it; kept for partial object models
            want = include.rstrip("/")
            for a in range(rng.num_actions()):
                act = rng.action_by_idx(a)
                if want in nvtx_ranges(act):
                    out.append(act)
    return out


def target_include(domain: str = NVTX_DOMAIN, name: str = NVTX_TARGET) -> str:
    """The ``--nvtx-include`` expression for the lab's push/pop range around a profiled launch."""
    return f"{domain}@{name}/"


# ------------------------------------------------------------------------------------------------ source / SASS
def _numeric(v) -> bool:
    """A per-PC value that can be summed (ncu also correlates string-valued metrics with PCs, e.g. a launch's cache
    preference 'CachePreferNone')."""
    if v is None or isinstance(v, bool):
        return v is None
    if isinstance(v, (int, float)):
        return True
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _per_pc(m) -> bool:
    """An instanced metric whose correlation ids are PCs and whose values are numbers. ncu also correlates
    string values with PCs (a launch's cache preference 'CachePreferNone') and counts per *opcode* with the
    opcode names as correlation ids ('FFMA', seen on an H100 at 2406c00): neither is a per-PC count."""
    if m is None or not m.has_correlation_ids() or m.num_instances() == 0 or not _numeric(m.value(0)):
        return False
    ids = m.correlation_ids()
    if ids is None:
        return False
    first = ids.value(0)
    if isinstance(first, bool):
        return False
    if isinstance(first, int):
        return True
    try:
        int(str(first), 0)
        return True
    except ValueError:
        return False


def source_metrics(action) -> list[str]:
    """The kernel's numeric source-correlated metrics (instanced, with correlation ids = PCs), the preferred ones
    first; string-valued and per-opcode instanced metrics are left out (they cannot be summed per line)."""
    found = []
    for name in action.metric_names():
        if _per_pc(action.metric_by_name(name)):
            found.append(name)
    pref = [n for n in HOTSPOT_METRICS if n in found]
    return pref + sorted(n for n in found if n not in pref)


def pc_table(action, names=None) -> pd.DataFrame:
    """One row per SASS instruction (PC) that a source-correlated metric counts: ``pc``, ``sass`` (the instruction
    text), ``file`` and ``line`` (when the cubin carries line info), one column per metric."""
    names = list(names) if names is not None else source_metrics(action)
    per_pc: dict[int, dict] = {}
    for name in names:
        m = action.metric_by_name(name)
        if m is None or not m.has_correlation_ids():
            continue
        if m.num_instances() and not _per_pc(m):
            raise ValueError(f"metric {name!r} is not a numeric per-PC count (its first value is {m.value(0)!r}, "
                             f"its first correlation id {m.correlation_ids().value(0)!r})")
        ids = m.correlation_ids()
        for i in range(m.num_instances()):
            pc = ids.value(i) if isinstance(ids.value(i), int) else int(str(ids.value(i)), 0)
            v = m.value(i)
            row = per_pc.setdefault(pc, {"pc": pc})
            row[name] = row.get(name, 0.0) + (float(v) if v is not None else 0.0)
    rows = []
    for pc in sorted(per_pc):
        info = action.source_info(pc)
        rows.append({"pc": pc, "sass": action.sass_by_pc(pc) or "",
                     "file": info.file_name() if info is not None else "",
                     "line": int(info.line()) if info is not None else -1, **{k: v for k, v in per_pc[pc].items()
                                                                                if k != "pc"}})
    df = pd.DataFrame(rows, columns=["pc", "sass", "file", "line", *[n for n in names if n in
                                                                    {k for r in per_pc.values() for k in r}]])
    return df.fillna({n: 0.0 for n in names})


def _by(pcs: pd.DataFrame, by: str | None) -> str:
    cols = [c for c in pcs.columns if c not in ("pc", "sass", "file", "line", "opcode")]
    if by is None:
        if not cols:
            raise ValueError("the kernel has no source-correlated metric (profile with --section SourceCounters "
                             "or --set full)")
        return cols[0]
    if by not in pcs.columns:
        raise KeyError(f"no per-PC metric {by!r}; the report has {cols}")
    return by


def line_hotspots(pcs: pd.DataFrame, by: str | None = None, top: int = 15) -> pd.DataFrame:
    """The hottest source lines by one per-PC metric (default the first of :func:`pc_table`'s): per (file, line) the
    metric summed over its instructions, its share of the kernel's total, the instruction count and the line's
    hottest SASS instruction. Without line info every PC lands on line -1 (one row): build with -lineinfo."""
    by = _by(pcs, by)
    total = float(pcs[by].sum()) or float("nan")
    g = pcs.sort_values(by, ascending=False).groupby(["file", "line"], sort=False)
    out = g.agg(**{by: (by, "sum"), "instructions": ("pc", "count"), "hottest_sass": ("sass", "first")}).reset_index()
    out["share"] = out[by] / total
    out = out.sort_values(by, ascending=False).head(top).reset_index(drop=True)
    out["file"] = out["file"].map(lambda f: os.path.basename(f) if f else "")
    return out[["file", "line", by, "share", "instructions", "hottest_sass"]]


def opcode(sass: str) -> str:
    """``@!P0 IMMA.16816.S8.S8 R4, R8, ...`` -> ``IMMA``: the mnemonic without predicate and modifiers."""
    s = (sass or "").strip()
    if s.startswith("@"):
        s = s.split(None, 1)[1] if " " in s else ""
    return s.split(None, 1)[0].split(".")[0] if s else ""


def sass_hotspots(pcs: pd.DataFrame, by: str | None = None, top: int = 15, per: str = "pc") -> pd.DataFrame:
    """The hottest SASS instructions (``per='pc'``) or opcodes (``per='opcode'``) by one per-PC metric, with their
    share of the kernel's total."""
    by = _by(pcs, by)
    total = float(pcs[by].sum()) or float("nan")
    if per == "opcode":
        t = pcs.assign(opcode=pcs.sass.map(opcode)).groupby("opcode", as_index=False).agg(
            **{by: (by, "sum"), "instructions": ("pc", "count")})
    elif per == "pc":
        t = pcs[["pc", "sass", "line", by]].copy()
    else:
        raise ValueError(f"per is 'pc' or 'opcode', not {per!r}")
    t["share"] = t[by] / total
    return t.sort_values(by, ascending=False).head(top).reset_index(drop=True)


def kernel_hotspots(path, kernel: str, by: str | None = None, top: int = 15, module=None) -> dict:
    """The report at ``path`` -> {'launch': its row of :func:`launches`, 'lines': :func:`line_hotspots`, 'sass':
    :func:`sass_hotspots` by opcode, 'metric': the metric ranked by} for the first kernel whose name contains
    ``kernel``."""
    ctx = load(path, module)
    for r, a, act in iter_actions(ctx):
        if kernel in kernel_name(act):
            pcs = pc_table(act)
            m = _by(pcs, by)
            ls = launches(ctx)
            return {"launch": ls[(ls["range"] == r) & (ls["action"] == a)].reset_index(drop=True),
                    "lines": line_hotspots(pcs, m, top), "sass": sass_hotspots(pcs, m, top, per="opcode"),
                    "metric": m, "pcs": pcs}
    raise KeyError(f"{path}: no kernel whose name contains {kernel!r}")


# ------------------------------------------------------------------------------------------------ NVTX emission
class _NoRange:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def have_nvtx() -> bool:
    try:
        import nvtx  # noqa: F401
    except ImportError:
        return False
    return True


def nvtx_range(name: str, domain: str = NVTX_DOMAIN):
    """A push/pop NVTX range (``nvtx.annotate``) around a launch the profiler should select by name; a no-op
    context when the ``nvtx`` package is absent (then :func:`have_nvtx` is False and callers select by count)."""
    try:
        import nvtx
    except ImportError:
        return _NoRange()
    return nvtx.annotate(message=name, domain=domain)
