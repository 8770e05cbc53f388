"""Counter forensics: per-GMAC hardware counters of the GEMM kernels with Nsight Compute (seeds 001).

The method (seeds 001, r13), as code:

* **discover** the metric names the device offers (``ncu --query-metrics``; :func:`parse_query_metrics`)
  and pick, per counter *concept*, the first candidate it has (:data:`CONCEPTS`, :func:`choose_metrics`) --
  never assume one chip's names on another (the seeds' GB10 had no ``dram__*`` and counted int8 mma under
  IMMA, not HMMA);
* **profile** exactly one launch per case: :mod:`labkernels.forensics_driver` runs one matched-shape GEMM
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

:func:`run_forensics` does all of it on the GPU machine and records a run (round ``forensics``) with tables
``metrics`` (raw, per case), ``per_gmac``, ``imma_check``, ``fit`` and ``verdicts``; the raw ncu text and the
query-metrics output are kept as files beside the records. ``labkernels forensics`` is its command line.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROUND = "forensics"


class ForensicsError(RuntimeError):
    pass


class MetricsError(ForensicsError):
    """A required counter concept has no metric on this device (or the query output had no metrics)."""


class NcuError(ForensicsError):
    """ncu failed, could not read the counters, or profiled the wrong number of launches."""


# ------------------------------------------------------------------ counter concepts


@dataclass(frozen=True)
class Concept:
    """One thing we want to count, with the metric names that measure it in preference order.

    ``extensive``: a count over the whole launch (normalized per GMAC); otherwise a rate, percentage or
    ratio (kept as is). ``sets``: the metric sets (``core`` / ``full``) that collect it."""
    name: str
    candidates: tuple
    required: bool = False
    extensive: bool = True
    sets: tuple = ("full",)
    doc: str = ""


_CORE = ("core", "full")

#: Candidate names for sm_90 (Hopper, ncu chip ``gh100``) first, then fallbacks seen on other chips and
#: Nsight Compute versions. Sources: NVIDIA's shipped rule SharedMemoryConflicts.py (section
#: MemoryWorkloadAnalysis_Tables: smsp__sass_inst_executed_op_shared_{ld,st}.sum, smsp__inst_executed_op_ldsm.sum,
#: l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st}.sum, l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_
#: {ld,st}.sum), the WarpStateStats section's stall ratios (smsp__average_warps_issue_stalled_<reason>_per_issue_
#: active.ratio), the Occupancy section (sm__warps_active.avg.pct_of_peak_sustained_active), the SpeedOfLight
#: section (gpu__time_duration.sum), the Profiling Guide's metric structure (unit__counter.rollup.submetric) and
#: the seeds' GB10 session (IMMA, not HMMA, counts int8 mma). choose_metrics() takes the first one the device
#: lists, so a wrong or missing guess here costs a fallback, never a wrong counter.
CONCEPTS: dict[str, Concept] = {c.name: c for c in [
    Concept("duration", ("gpu__time_duration.sum",), required=True, sets=_CORE,
            doc="kernel duration (ns)"),
    Concept("warp_inst", ("smsp__inst_executed.sum", "sm__inst_executed.sum"), required=True, sets=_CORE,
            doc="warp instructions executed"),
    Concept("imma_inst", ("sm__inst_executed_pipe_tensor_op_imma.sum", "smsp__inst_executed_pipe_tensor_op_imma.sum",
                          "sm__sass_inst_executed_op_imma.sum", "smsp__sass_inst_executed_op_imma.sum",
                          "sm__inst_executed_pipe_tensor.sum"),
            required=True, sets=_CORE,
            doc="warp-level IMMA instructions (one per mma.sync.m16n8kK); the last fallback counts the whole "
                "tensor pipe, which for these int8-only kernels is the same"),
    Concept("imma_ops", ("sm__ops_path_tensor_op_imma_src_int8.sum",
                         "sm__ops_path_tensor_op_imma_src_int8_sparsity_off.sum",
                         "smsp__ops_path_tensor_op_imma_src_int8.sum",
                         "sm__ops_path_tensor_src_int8.sum", "sm__ops_path_tensor_src_int8_sparsity_off.sum"),
            sets=_CORE, doc="int8 tensor operations (the seeds read 2 per MAC)"),
    Concept("warp_inst_issued", ("smsp__inst_issued.sum", "sm__inst_issued.sum"),
            doc="warp instructions issued (replays included)"),
    Concept("shared_ld_inst", ("smsp__sass_inst_executed_op_shared_ld.sum", "smsp__inst_executed_op_shared_ld.sum",
                               "sm__sass_inst_executed_op_shared_ld.sum", "sass__inst_executed_shared_loads"),
            doc="shared-memory load instructions (LDS, without ldmatrix)"),
    Concept("shared_st_inst", ("smsp__sass_inst_executed_op_shared_st.sum", "smsp__inst_executed_op_shared_st.sum",
                               "sm__sass_inst_executed_op_shared_st.sum", "sass__inst_executed_shared_stores"),
            doc="shared-memory store instructions (STS)"),
    Concept("ldsm_inst", ("smsp__inst_executed_op_ldsm.sum", "sm__sass_inst_executed_op_ldsm.sum"),
            doc="ldmatrix instructions (LDSM)"),
    Concept("ldgsts_inst", ("smsp__inst_executed_op_ldgsts.sum", "smsp__sass_inst_executed_op_ldgsts.sum",
                            "sm__sass_inst_executed_op_ldgsts.sum"),
            doc="cp.async global->shared instructions (LDGSTS)"),
    Concept("shared_ld_conflicts", ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",),
            doc="shared-load bank conflicts"),
    Concept("shared_st_conflicts", ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",),
            doc="shared-store bank conflicts"),
    Concept("shared_ld_wavefronts", ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",),
            doc="shared-load wavefronts (conflict-free: one per request)"),
    Concept("shared_st_wavefronts", ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",),
            doc="shared-store wavefronts"),
    Concept("l2_read_sectors", ("lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_op_read.sum"),
            doc="L2 sectors read (32 B) on behalf of the SMs"),
    Concept("l2_write_sectors", ("lts__t_sectors_srcunit_tex_op_write.sum", "lts__t_sectors_op_write.sum"),
            doc="L2 sectors written"),
    Concept("dram_read_bytes", ("dram__bytes_read.sum",), doc="DRAM bytes read (absent on the seeds' GB10)"),
    Concept("dram_write_bytes", ("dram__bytes_write.sum",), doc="DRAM bytes written"),
    Concept("l1_global_ld_requests", ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",),
            doc="L1 requests for global loads (LDG)"),
    Concept("l1_global_ld_sectors", ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",),
            doc="L1 sectors for global loads"),
    Concept("l1_ldgsts_requests", ("l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum",),
            doc="L1 requests for cp.async global loads"),
    Concept("issue_slot_pct", ("sm__inst_issued.avg.pct_of_peak_sustained_active",
                               "smsp__issue_active.avg.pct_of_peak_sustained_active"),
            extensive=False, sets=_CORE, doc="issue-slot utilization (% of peak, active cycles)"),
    Concept("issue_active_pct", ("smsp__issue_active.avg.pct_of_peak_sustained_active",),
            extensive=False, doc="cycles with an instruction issued (% of active cycles)"),
    Concept("warp_latency_per_inst", ("smsp__average_warp_latency_per_inst_issued.ratio",),
            extensive=False, doc="average warp cycles per issued instruction (the stall total)"),
    Concept("occupancy_pct", ("sm__warps_active.avg.pct_of_peak_sustained_active",), extensive=False, sets=_CORE,
            doc="achieved occupancy"),
    Concept("sm_clock_hz", ("sm__cycles_elapsed.avg.per_second", "smsp__cycles_elapsed.avg.per_second",
                            "gpc__cycles_elapsed.avg.per_second"),
            extensive=False, sets=_CORE, doc="SM clock during the launch (clocks are not locked)"),
    Concept("sm_cycles", ("sm__cycles_elapsed.max", "sm__cycles_elapsed.avg"), extensive=False,
            doc="elapsed SM cycles"),
    Concept("registers", ("launch__registers_per_thread",), extensive=False, doc="registers per thread"),
]}

REQUIRED = tuple(c.name for c in CONCEPTS.values() if c.required)

#: stall-reason families, preferred first: (regex over listed names -> reason, full metric name template).
#: The WarpStateStats section reads the first (warp cycles per issued instruction, by reason).
STALL_FAMILIES = (
    (re.compile(r"^smsp__average_warps_issue_stalled_(?P<r>[a-z0-9_]+?)_per_issue_active(?:\.ratio)?$"),
     "smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio"),
    (re.compile(r"^smsp__average_warp_latency_issue_stalled_(?P<r>[a-z0-9_]+?)(?:\.ratio)?$"),
     "smsp__average_warp_latency_issue_stalled_{r}.ratio"),
    (re.compile(r"^smsp__warp_issue_stalled_(?P<r>[a-z0-9_]+?)_per_warp_active(?:\.pct)?$"),
     "smsp__warp_issue_stalled_{r}_per_warp_active.pct"),
    (re.compile(r"^smsp__pcsamp_warps_issue_stalled_(?P<r>[a-z0-9_]+)$"),
     "smsp__pcsamp_warps_issue_stalled_{r}"),
)
_STALL_RX = re.compile(r"issue_stalled_(?P<r>[a-z0-9_]+?)(?:_per_issue_active|_per_warp_active)?(?:\.[a-z_]+)?$")

METRIC_SETS = ("core", "full")

_METRIC_RX = re.compile(r"^[a-z][a-z0-9]*__[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*$")
_SUFFIX_RX = re.compile(r"^\.[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*$")


# ------------------------------------------------------------------ ncu --query-metrics


def parse_query_metrics(text: str) -> set[str]:
    """Metric names in the output of ``ncu --query-metrics`` (any ``--query-metrics-mode``, with or
    without ``--csv``, with or without ``--chip``).

    The plain output is a table, one metric a line, name first::

        Device NVIDIA H200 (GH100)
        -------------------------------------  ---------  -----------  ------------------------------
        Metric Name                            Metric Type  Metric Unit  Metric Description
        -------------------------------------  ---------  -----------  ------------------------------
        dram__bytes                            Counter      byte         # of bytes accessed in DRAM

    ``base`` mode lists base names (``sm__inst_executed``), ``suffix``/``all`` list full names
    (``sm__inst_executed.sum``); a line holding only suffixes (``.sum, .avg``) extends the base name above
    it. ``--csv`` output is the same table as quoted CSV. Headers, rulers, ``==PROF==``/``==WARNING==``
    lines and wrapped description lines are skipped (a name starts its line and has the ``unit__counter``
    form)."""
    names: set[str] = set()
    last_base = None
    for raw in text.splitlines():
        line = raw.rstrip()
        s = line.strip()
        if not s or s.startswith("==") or set(s) <= set("-= "):
            continue
        if s.startswith('"'):
            try:
                fields = next(csv.reader([s]))
            except csv.Error:
                continue
            tok = fields[0].strip() if fields else ""
        else:
            if _SUFFIX_RX.match(s.split(",")[0].split()[0]) and last_base:
                for suf in re.split(r"[,\s]+", s):
                    if _SUFFIX_RX.match(suf):
                        names.add(last_base + suf)
                continue
            if line[:1].isspace() and not _METRIC_RX.match(s.split()[0]):
                continue  # wrapped description
            tok = s.split()[0]
        if _METRIC_RX.match(tok):
            names.add(tok)
            last_base = tok.split(".", 1)[0]
    return names


def query_device(text: str) -> str | None:
    """The device / chip line of a --query-metrics output (``Device NVIDIA H200 (GH100)``), if any."""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Device ") or s.lower().startswith("chip "):
            return s.split(None, 1)[1].strip() if len(s.split(None, 1)) > 1 else s
    return None


def _index(available) -> dict:
    idx: dict[str, set] = {}
    for name in available:
        base, _, suffix = name.partition(".")
        idx.setdefault(base, set())
        if suffix:
            idx[base].add(suffix)
    return idx


def metric_available(name: str, available, index: dict | None = None) -> bool:
    """Whether a full metric name is offered by a device whose query output is ``available``.

    Exact names always count. A base-mode listing holds only base names, so ``X.sum`` counts when ``X`` is
    listed with no suffixed variants; when suffixed variants of ``X`` are listed, the candidate's rollup
    (``sum``/``avg``/...) must be among them (sub-metrics such as ``.pct_of_peak_sustained_active`` may be
    left out of a listing)."""
    if name in available:
        return True
    idx = index if index is not None else _index(available)
    base, _, suffix = name.partition(".")
    if not suffix or base not in idx:
        return False
    listed = idx[base]
    if not listed:
        return True
    rollup = suffix.split(".")[0]
    return any(s == rollup or s.startswith(rollup + ".") for s in listed)


def stall_reason(metric: str) -> str:
    """``smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio`` -> ``long_scoreboard``."""
    for rx, _ in STALL_FAMILIES:
        m = rx.match(metric)
        if m:
            return m.group("r")
    m = _STALL_RX.search(metric)
    return m.group("r") if m else metric


def _stall_metrics(available) -> list[str]:
    for rx, template in STALL_FAMILIES:
        reasons = set()
        for name in available:
            m = rx.match(name)
            if m and not m.group("r").endswith("not_issued"):
                reasons.add(m.group("r"))
        if reasons:
            return [template.format(r=r) for r in sorted(reasons)]
    return []


def choose_metrics(available, metrics_set: str = "full") -> dict:
    """concept -> the first candidate metric the device offers (concepts with none are left out; the
    required ones -- duration, warp instructions, IMMA instructions -- raise :class:`MetricsError`).
    ``stalls`` -> every stall-reason metric of the first stall family the device offers (full set only)."""
    if metrics_set not in METRIC_SETS:
        raise ValueError(f"metrics_set must be one of {METRIC_SETS}, got {metrics_set!r}")
    available = set(available)
    if not available:
        raise MetricsError("the ncu --query-metrics output listed no metrics (is ncu working on this machine?)")
    idx = _index(available)
    chosen: dict = {}
    missing = []
    for c in CONCEPTS.values():
        if metrics_set not in c.sets and not c.required:
            continue
        hit = next((m for m in c.candidates if metric_available(m, available, idx)), None)
        if hit:
            chosen[c.name] = hit
        elif c.required:
            missing.append(c)
    if missing:
        raise MetricsError("no metric on this device for required counter concept(s): " + "; ".join(
            f"{c.name} ({c.doc}) -- tried {', '.join(c.candidates)}" for c in missing)
            + ". Check `ncu --query-metrics` on the device and add its name to forensics.CONCEPTS.")
    if metrics_set == "full":
        stalls = _stall_metrics(available)
        if stalls:
            chosen["stalls"] = stalls
    return chosen


def metric_list(chosen: dict) -> list[str]:
    """The flat, de-duplicated list of metric names to hand to ``ncu --metrics``."""
    out = []
    for k, v in chosen.items():
        for m in (v if isinstance(v, (list, tuple)) else [v]):
            if m not in out:
                out.append(m)
    return out


def concept_columns(chosen: dict) -> dict:
    """metric name -> concept column name (stall metrics -> ``stall_<reason>``)."""
    cols = {}
    for k, v in chosen.items():
        if k == "stalls":
            for m in v:
                cols[m] = f"stall_{stall_reason(m)}"
        else:
            cols.setdefault(v, k)
    return cols


# ------------------------------------------------------------------ the ncu command


def ncu_command(python_args, metrics, kernel_regex: str, launch_skip: int, launch_count: int, out_csv,
                ncu: str = "ncu", python: str | None = None) -> list[str]:
    """The ncu command line that profiles one selected launch of a Python program, raw CSV to ``out_csv``.

    * ``--clock-control none``: leave the GPU's clocks as they are (the device's rule; durations are then
      at the clocks the benchmarks see, and ``sm_clock_hz`` records them);
    * ``--target-processes all``: follow the Python process tree;
    * ``--csv --page raw --print-units base``: one row per launch, one column per metric, a units row,
      values in base units (ns, byte, sector, inst);
    * ``--kernel-name-base function --kernel-name regex:R``: match the bare function (template) name;
      ``--launch-skip/--launch-count`` count launches of matching kernels only;
    * ``--log-file``: ncu's own output (the CSV and ``==PROF==`` lines) to the file; the program's stdout
      stays on stdout;
    * replay mode and cache control stay at ncu's defaults (kernel replay, caches flushed between passes)."""
    if not metrics:
        raise ValueError("no metrics to collect")
    if launch_skip < 0 or launch_count < 1:
        raise ValueError("launch_skip must be >= 0 and launch_count >= 1")
    return [ncu, "--clock-control", "none", "--target-processes", "all",
            "--csv", "--page", "raw", "--print-units", "base",
            "--metrics", ",".join(metrics),
            "--kernel-name-base", "function", "--kernel-name", f"regex:{kernel_regex}",
            "--launch-skip", str(int(launch_skip)), "--launch-count", str(int(launch_count)),
            "--log-file", str(out_csv),
            python or sys.executable, *[str(a) for a in python_args]]


# ------------------------------------------------------------------ ncu CSV


ID_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context", "Stream",
              "Block Size", "Grid Size", "Device", "CC", "Section Name", "Rule Name", "Rule Type",
              "Rule Description", "Estimated Speedup Type", "Estimated Speedup")

_NA = {"", "n/a", "N/A", "(!) n/a", "nan", "NaN", "-"}
#: prefixed units ncu prints without --print-units base -> (base unit, factor)
_TIME = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1.0, "us": 1e3, "ms": 1e6}
_SI = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_COUNT_UNITS = ("byte", "sector", "inst", "request", "warp", "cycle", "wavefront", "thread", "block", "op", "hz")


def _to_number(s: str) -> float:
    s = s.strip()
    if s in _NA:
        return math.nan
    return float(s.replace(",", "").replace("(!)", "").strip())


def _unit_scale(unit: str) -> tuple[str, float]:
    u = (unit or "").strip()
    if u in _TIME:
        return "nsecond", _TIME[u]
    if len(u) > 1 and u[0] in _SI and u[1:].lower() in _COUNT_UNITS:
        return u[1:], _SI[u[0]]
    return u, 1.0


def parse_ncu_csv(text: str) -> pd.DataFrame:
    """ncu ``--csv --page raw`` output -> one row per profiled launch, one column per metric.

    The raw page is a header row (``"ID","Process ID",...,"Kernel Name",...,"Block Size","Grid Size",
    "Device","CC",<metric names>``), a units row (empty ID), then one row per launch; values are quoted and
    may carry thousands separators (``"1,234,567"``). Lines that are not CSV rows of that table --
    ``==PROF==``/``==WARNING==`` lines, the program's own output -- are skipped; a second header (outputs
    concatenated) starts a new table. The long ``--page details`` form (``Metric Name``/``Metric Unit``/
    ``Metric Value`` columns) is pivoted to the same shape. Values become floats in base units (a prefixed
    unit such as ``usecond`` or ``Kbyte`` is scaled); ``ID`` becomes an int; the units are in
    ``df.attrs['units']``."""
    records: list[dict] = []
    units: dict[str, str] = {}
    header = None
    long_form = False
    for raw in text.splitlines():
        s = raw.strip()
        if not s or s.startswith("==") or not s.startswith('"'):
            continue
        try:
            fields = next(csv.reader([s]))
        except csv.Error:
            continue
        if fields and fields[0] == "ID" and "Kernel Name" in fields:
            header = fields
            long_form = "Metric Name" in fields and "Metric Value" in fields
            continue
        if header is None or len(fields) != len(header):
            continue
        rec = dict(zip(header, fields))
        rid = rec["ID"].strip()
        if rid == "":
            units.update({k: v for k, v in rec.items() if v and k not in ID_COLUMNS})
            continue
        if not rid.lstrip("-").isdigit():
            continue
        if long_form:
            name = rec.get("Metric Name", "").strip()
            if not name:
                continue
            key = {k: rec[k] for k in header if k in ID_COLUMNS and k not in ("Section Name",) and
                   not k.startswith("Rule") and not k.startswith("Estimated")}
            key[name] = rec["Metric Value"]
            if rec.get("Metric Unit"):
                units[name] = rec["Metric Unit"]
            records.append(key)
        else:
            records.append(rec)
    if not records:
        df = pd.DataFrame(columns=["ID", "Kernel Name", "Grid Size", "Block Size"])
        df.attrs["units"] = {}
        return df
    if long_form:  # merge the per-metric rows of each launch
        merged: dict = {}
        for r in records:
            merged.setdefault(r["ID"], {}).update(r)
        records = list(merged.values())
    df = pd.DataFrame(records)
    out_units = {}
    for col in df.columns:
        if col in ID_COLUMNS:
            continue
        vals = df[col].astype(str)
        try:
            nums = vals.map(_to_number).astype(float)
        except ValueError:
            continue  # a string-valued metric: keep the text
        base, factor = _unit_scale(units.get(col, ""))
        df[col] = nums * factor
        out_units[col] = base
    df["ID"] = df["ID"].astype(int)
    first = [c for c in ("ID", "Kernel Name", "Grid Size", "Block Size") if c in df.columns]
    df = df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)
    df.attrs["units"] = out_units
    return df


def ncu_errors(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("==ERROR==")]


def rejected_metrics(text: str, metrics) -> list[str]:
    """Requested metrics that ncu's ``==ERROR==`` lines name (an unknown or uncollectable metric)."""
    errs = "\n".join(ncu_errors(text))
    return [m for m in metrics if m in errs]


# ------------------------------------------------------------------ normalization and checks


def _is_extensive(col: str) -> bool:
    if col in CONCEPTS:
        return CONCEPTS[col].extensive
    if col.startswith("stall_"):
        return False
    return bool(re.search(r"\.sum$", col))


def _align(df: pd.DataFrame, values, what: str) -> np.ndarray:
    """values per row of df: a column name, a scalar, a sequence in row order, or a mapping keyed by the
    ``case`` column, the ``ID`` column or the index."""
    n = len(df)
    if isinstance(values, str):
        if values not in df.columns:
            raise KeyError(f"{what}: no column {values!r}")
        arr = df[values].to_numpy(dtype=float)
    elif isinstance(values, dict) or isinstance(values, pd.Series) and not values.index.equals(df.index):
        m = dict(values)
        for key in ("case", "ID"):
            if key in df.columns and all(k in m for k in df[key]):
                arr = np.array([m[k] for k in df[key]], dtype=float)
                break
        else:
            if all(k in m for k in df.index):
                arr = np.array([m[k] for k in df.index], dtype=float)
            else:
                raise KeyError(f"{what}: mapping keys {sorted(m)[:5]} match neither the case, ID nor index of the rows")
    elif np.ndim(values) == 0:
        arr = np.full(n, float(values))
    else:
        arr = np.asarray(values, dtype=float)
    if arr.shape != (n,):
        raise ValueError(f"{what}: {arr.shape[0] if arr.ndim else 1} values for {n} rows")
    return arr


def per_gmac(df: pd.DataFrame, macs_by_launch, extensive=None) -> pd.DataFrame:
    """Every count divided by the launch's GMAC (MACs / 1e9): the hardware resources a kernel spends per
    unit of math, independent of problem size (seeds 001 section 2). Counts are the ``.sum`` metrics and
    the extensive :data:`CONCEPTS` (``duration`` becomes ns/GMAC); rates, percentages, ratios and text
    columns are copied unchanged. ``macs_by_launch``: a column name, a sequence in row order, a scalar, or
    a mapping keyed by case / ID / index. Adds ``macs`` and ``gmac`` columns."""
    macs = _align(df, macs_by_launch, "macs_by_launch")
    if not np.all(np.isfinite(macs)) or np.any(macs <= 0):
        raise ValueError(f"MACs must be positive, got {macs}")
    gmac = macs / 1e9
    ext = set(extensive) if extensive is not None else None
    out = {}
    for c in df.columns:
        col = df[c]
        is_ext = (c in ext) if ext is not None else _is_extensive(c)
        if is_ext and pd.api.types.is_numeric_dtype(col):
            out[c] = col.to_numpy(dtype=float) / gmac
        else:
            out[c] = col.to_numpy()
    res = pd.DataFrame(out, index=df.index)
    res["macs"] = macs
    res["gmac"] = gmac
    res.attrs.update(df.attrs)
    return res


def mma_macs(k: int) -> int:
    """MACs of one warp-level mma.sync.m16n8kK: 16 x 8 x K."""
    if k not in (8, 16, 32, 64):
        raise ValueError(f"unexpected mma K={k}")
    return 16 * 8 * k


def imma_check(df: pd.DataFrame, macs, mma_k=16, ops_per_mac_expected: float = 2.0,
               rtol: float = 1e-6) -> pd.DataFrame:
    """The seeds' consistency test, before anything is compared: do the kernels do exactly the GEMM's
    tensor work?

    For each launch (row), with ``macs`` the MACs the tensor cores must do (the padded tiles' MACs) and
    ``mma_k`` the K of its mma.sync.m16n8kK:

    * ``imma_inst_expected`` = MACs / (16*8*K); ``inst_exact``: the IMMA instruction count equals it
      exactly (``inst_ratio`` = measured / expected, e.g. 2.0 if the hardware split each mma in two);
    * ``ops_per_mac`` = IMMA ops / MACs; ``ops_expected``: it equals ``ops_per_mac_expected`` (the seeds
      read "IMMA = 2 x MAC" on both sides); ``ops_identical``: it is the same on every launch checked
      (the tensor work per MAC is structural, so two kernels that differ here are not doing the same
      GEMM);
    * ``ok``: all the checks whose counters exist pass (a launch with neither IMMA counter is not ok).

    ``df`` holds concept columns ``imma_inst`` and/or ``imma_ops`` (or the raw metric names, mapped by
    :data:`CONCEPTS`); ``macs`` / ``mma_k``: column name, scalar, sequence or mapping (see :func:`per_gmac`)."""
    d = _concept_view_auto(df)
    m = _align(d, macs, "macs")
    k = _align(d, mma_k, "mma_k").astype(int)
    out = pd.DataFrame(index=d.index)
    for c in ("case", "variant", "shape", "Kernel Name"):
        if c in d.columns:
            out[c] = d[c]
    out["macs"] = m
    out["mma_k"] = k
    has_inst, has_ops = "imma_inst" in d.columns, "imma_ops" in d.columns
    ok = np.ones(len(d), dtype=bool)
    if has_inst:
        exp = m / np.array([mma_macs(int(x)) for x in k], dtype=float)
        got = d["imma_inst"].to_numpy(dtype=float)
        out["imma_inst"] = got
        out["imma_inst_expected"] = exp
        out["inst_ratio"] = got / exp
        out["inst_exact"] = np.abs(got - exp) < 0.5
        ok &= out["inst_exact"].to_numpy()
    if has_ops:
        got = d["imma_ops"].to_numpy(dtype=float)
        per = got / m
        out["imma_ops"] = got
        out["ops_per_mac"] = per
        out["ops_per_mac_expected"] = float(ops_per_mac_expected)
        out["ops_expected"] = np.isclose(per, ops_per_mac_expected, rtol=rtol, atol=0)
        finite = per[np.isfinite(per)]
        same = bool(finite.size == per.size and (finite.size == 0 or np.allclose(finite, finite[0], rtol=rtol, atol=0)))
        out["ops_identical"] = same
        ok &= out["ops_expected"].to_numpy() & same
    if not (has_inst or has_ops):
        ok &= False
    out["ok"] = ok
    return out


def imma_ok(check: pd.DataFrame) -> bool:
    return bool(len(check)) and bool(check["ok"].all())


def fit_linear(x, y) -> tuple[float, float, float]:
    """Least-squares line y = slope * x + intercept over the finite pairs; returns (slope, intercept, r2).
    r2 is NaN when y does not vary. Needs two distinct x values."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"x and y differ in shape: {x.shape} vs {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("a line needs at least two points with different x")
    xm, ym = x.mean(), y.mean()
    slope = float(np.sum((x - xm) * (y - ym)) / np.sum((x - xm) ** 2))
    intercept = float(ym - slope * xm)
    ss_res = float(np.sum((y - (slope * x + intercept)) ** 2))
    ss_tot = float(np.sum((y - ym) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan
    return slope, intercept, r2


VERDICTS = ("hypothesis out", "supported", "inconclusive")


def verdict(base_duration, variant_duration, noise) -> str:
    """The counter-evidence rule.

    The variant removes one hypothesized cost from the base (a template/preprocessor switch, parity-clean).
    With d = variant / base - 1 (medians when sequences are given) and ``noise`` the measured relative
    noise band (e.g. the base-vs-base ratio spread of interleaved timings, 0.02 = 2 %):

    * ``|d| <= noise``  -> ``'hypothesis out'``: removing the cost did not move duration beyond the noise,
      so that cost does not carry the time;
    * ``d < -noise``    -> ``'supported'``: the variant is faster by more than the noise;
    * ``d > +noise``    -> ``'inconclusive'``: the variant is slower -- it removed the cost but added
      another, so the experiment cannot speak for or against the hypothesis (look at its instruction
      count: the linear law may explain the loss);
    * missing / non-positive durations or an unknown (NaN / negative) noise -> ``'inconclusive'``."""
    try:
        b = float(np.median(np.asarray(base_duration, dtype=float)))
        v = float(np.median(np.asarray(variant_duration, dtype=float)))
        n = float(noise)
    except (TypeError, ValueError):
        return "inconclusive"
    if not (math.isfinite(b) and math.isfinite(v) and math.isfinite(n)) or b <= 0 or v <= 0 or n < 0:
        return "inconclusive"
    d = v / b - 1.0
    if abs(d) <= n:
        return "hypothesis out"
    return "supported" if d < 0 else "inconclusive"


def concept_view(df: pd.DataFrame, chosen: dict) -> pd.DataFrame:
    """Rename metric columns to their concept names (stall metrics -> ``stall_<reason>``)."""
    cols = concept_columns(chosen)
    out = df.rename(columns={m: c for m, c in cols.items() if m in df.columns})
    out.attrs.update(df.attrs)
    return out


def _concept_view_auto(df: pd.DataFrame) -> pd.DataFrame:
    """Map raw IMMA metric columns to concept names when the frame is not a concept view yet."""
    ren = {}
    for concept in ("imma_inst", "imma_ops"):
        if concept in df.columns:
            continue
        for m in CONCEPTS[concept].candidates:
            if m in df.columns:
                ren[m] = concept
                break
    return df.rename(columns=ren) if ren else df


# ------------------------------------------------------------------ pairs of this round

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


# ------------------------------------------------------------------ the GPU-machine run


def find_ncu(ncu: str | None = None) -> str:
    """The ncu executable: the one given, $NCU, ``ncu`` on PATH, or the newest under /opt/nvidia or
    /usr/local/cuda* (the device image keeps Nsight Compute under /opt/nvidia/nsight-compute/<version>)."""
    import glob
    import shutil

    for c in (ncu, os.environ.get("NCU"), "ncu"):
        if c and (os.sep in c and os.access(c, os.X_OK) or shutil.which(c)):
            return c if os.sep in c else shutil.which(c)
    found = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu") + glob.glob("/usr/local/cuda*/bin/ncu")
                   + glob.glob("/usr/local/cuda*/nsight-compute*/ncu"))
    if found:
        return found[-1]
    return ncu or "ncu"


def _run(cmd, timeout=None, cwd=None, env=None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise NcuError(f"{cmd[0]} not found ({e}); is Nsight Compute on PATH? (pass --ncu /path/to/ncu)") from None
    except subprocess.TimeoutExpired as e:
        raise NcuError(f"timeout after {timeout} s: {shlex.join(map(str, cmd))}\n{(e.stdout or '')[-2000:]}") from None


def _json_line(text: str, key: str) -> dict | None:
    for line in reversed(text.splitlines()):
        s = line.strip()
        if s.startswith("{") and f'"{key}"' in s:
            try:
                return json.loads(s)
            except json.JSONDecodeError:
                continue
    return None


def query_metrics(ncu: str = "ncu", timeout: int = 300) -> tuple[str, set[str]]:
    """Run ``ncu --query-metrics`` (mode ``all`` first: full names; then the default base mode)."""
    texts = []
    for args in (["--query-metrics", "--query-metrics-mode", "all"], ["--query-metrics"]):
        r = _run([ncu, *args], timeout=timeout)
        text = (r.stdout or "") + (r.stderr or "")
        texts.append(f"### {shlex.join([ncu, *args])} (rc={r.returncode})\n{text}")
        names = parse_query_metrics(r.stdout or "")
        if r.returncode == 0 and names:
            return "\n".join(texts), names
    raise MetricsError("ncu --query-metrics listed no metrics:\n" + "\n".join(t[-3000:] for t in texts))


def _tail(text: str, n: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def profile_case(variant: str, shape, chosen: dict, out_dir: Path, ncu: str = "ncu", warmup: int = 2,
                 repeats: int = 10, parity: bool = True, timeout: int = 600, progress=print) -> tuple:
    """ncu over one driver process; returns (row: case info + metrics, raw ncu text, the command, units).
    A metric ncu rejects is dropped (required ones excepted) and the case is profiled once more without it."""
    from . import forensics_driver as drv
    from .paths import REPO_ROOT

    spec = drv.case_spec(variant, shape)
    plan = drv.launch_plan(warmup, repeats)
    metrics = metric_list(chosen)
    required = {chosen[c] for c in REQUIRED if c in chosen}
    log = Path(out_dir) / f"ncu-{spec['variant']}-{spec['shape']}.csv.tmp"
    args = ["-m", "labkernels.forensics_driver", "--case", variant, "--shape", spec["shape"],
            "--warmup", warmup, "--repeats", repeats] + ([] if parity else ["--no-parity"])
    for attempt in range(2):
        cmd = ncu_command(args, metrics, spec["kernel_regex"], plan["launch_skip"], plan["launch_count"], log, ncu=ncu)
        if log.exists():
            log.unlink()
        t0 = time.time()
        r = _run(cmd, timeout=timeout, cwd=REPO_ROOT)
        raw = log.read_text() if log.exists() else ""
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
    return row, raw, cmd, df.attrs.get("units", {})


def ab_timing(base: str, variant: str, shape, pairs: int = 5, repeats: int = 20, timeout: int = 600) -> dict:
    """Interleaved base / variant / base-again timing in one driver process (no ncu)."""
    from .paths import REPO_ROOT

    cmd = [sys.executable, "-m", "labkernels.forensics_driver", "--ab", base, variant, "--shape", str(shape),
           "--pairs", str(pairs), "--repeats", str(repeats)]
    r = _run(cmd, timeout=timeout, cwd=REPO_ROOT)
    info = _json_line(r.stdout or "", "forensics_ab")
    if r.returncode != 0 or info is None:
        raise ForensicsError(f"A/B timing failed: rc={r.returncode}\n$ {shlex.join(cmd)}\n"
                             f"{_tail((r.stdout or '') + (r.stderr or ''))}")
    return info


def ab_summary(ab: dict, noise_floor: float = 0.005) -> dict:
    """Median ratio variant/base over rounds, and the noise band: the largest |base'/base - 1| of any
    round (the same kernel timed against itself), floored at ``noise_floor``."""
    rounds = ab["rounds"]
    ratios = np.array([r["ratio"] for r in rounds], dtype=float)
    self_dev = np.array([abs(r["self_ratio"] - 1.0) for r in rounds], dtype=float)
    base = np.array([r["base_us"] for r in rounds] + [r["base_again_us"] for r in rounds], dtype=float)
    var = np.array([r["variant_us"] for r in rounds], dtype=float)
    return {"base_us": float(np.median(base)), "variant_us": float(np.median(var)),
            "delta": float(np.median(ratios) - 1.0), "ratio_min": float(ratios.min()),
            "ratio_max": float(ratios.max()), "noise": max(float(self_dev.max()), noise_floor),
            "noise_measured": float(self_dev.max()), "rounds": len(rounds)}


def fit_table(cv: pd.DataFrame) -> list[dict]:
    """Duration vs warp instructions: over all cases (raw counts), per shape, and per GMAC."""
    rows = []

    def add(name, x, y, n):
        try:
            slope, icpt, r2 = fit_linear(x, y)
        except ValueError as e:
            rows.append({"fit": name, "n": n, "error": str(e)})
            return
        rows.append({"fit": name, "n": n, "x": "warp_inst", "y": "duration_ns", "slope_ns_per_inst": slope,
                     "intercept_ns": icpt, "r2": r2,
                     "inst_per_ns": 1.0 / slope if slope > 0 else math.nan})

    add("all_cases", cv["warp_inst"], cv["duration"], len(cv))
    for shape, g in cv.groupby("shape"):
        add(f"shape_{shape}", g["warp_inst"], g["duration"], len(g))
    gm = cv["gmac"].to_numpy(dtype=float)
    add("per_gmac", cv["warp_inst"].to_numpy(dtype=float) / gm, cv["duration"].to_numpy(dtype=float) / gm, len(cv))
    return rows


def pair_table(pg: pd.DataFrame) -> list[dict]:
    """Per-GMAC ratios other/base for the structural pairs at each shape."""
    rows = []
    num = [c for c in pg.columns if _is_extensive(c) and pd.api.types.is_numeric_dtype(pg[c])
           and c not in ("macs", "gmac", "macs_padded")]
    for name, a, b, what in PAIRS:
        for shape in sorted(set(pg["shape"])):
            ra = pg[(pg.variant == a) & (pg["shape"] == shape)]
            rb = pg[(pg.variant == b) & (pg["shape"] == shape)]
            if ra.empty or rb.empty:
                continue
            row = {"pair": name, "shape": shape, "base": a, "other": b, "what": what}
            for c in num:
                va, vb = float(ra[c].iloc[0]), float(rb[c].iloc[0])
                row[f"{c}_ratio"] = vb / va if va else math.nan
            rows.append(row)
    return rows


#: the per-case columns profile_case puts before the metrics
CASE_COLUMNS = ("case", "variant", "shape", "nt", "od", "id", "qtype", "kernel", "mma_k", "macs", "macs_padded",
                "gmac", "Kernel Name", "Grid Size", "Block Size", "parity_ok", "kernel_args_match")


def run_forensics(out_dir, cases=None, metrics_set: str = "full", record: bool = True, *, shapes=None,
                  ncu: str | None = None, warmup: int = 2, repeats: int = 0, ab_pairs: int = 5, ab_repeats: int = 20,
                  noise_floor: float = 0.005, parity: bool = True, timeout: int = 600, progress=print) -> dict:
    """The whole round on the GPU machine. ``out_dir`` gets ``ncu-query-metrics.txt.gz``, ``ncu-raw.txt``
    (every case's raw ncu output) and, with ``record``, the run under ``out_dir/data/forensics/``.

    Per case: one ncu process over :mod:`labkernels.forensics_driver` (``warmup`` launches, the first
    parity-gated, then the profiled one; ``repeats`` CUDA-event-timed launches in between are off by
    default: under ncu's launch interception event times are distorted -- on the H200 a 104 us q4_K launch
    read 380-6081 us). The counter-evidence verdicts use interleaved A/B timing in a separate process
    without ncu (``ab_pairs`` rounds of ``ab_repeats`` launches each), noise band floored at
    ``noise_floor``. The duration in the fit is ncu's ``gpu__time_duration`` of the profiled launch."""
    from . import forensics_driver as drv
    from . import records

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
        rows, raws, cmds, units = [], [], {}, {}
        for shape in shapes:
            for variant in cases:
                row, raw, cmd, u = profile_case(variant, shape, chosen, out, ncu=ncu, warmup=warmup, repeats=repeats,
                                             parity=parity, timeout=timeout, progress=progress)
                rows.append(row)
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
        pairs = pair_table(pg)
        summary = {"imma_ok": ok, "verdicts": {f"{v['experiment']}@{v['shape']}": v["verdict"] for v in verdicts},
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
            run.finish(**summary)
            summary["run"] = run.run_id
        return {"ok": ok, "metrics": metrics_df, "per_gmac": pg, "imma_check": check, "fit": pd.DataFrame(fits),
                "pairs": pd.DataFrame(pairs), "verdicts": pd.DataFrame(verdicts), "summary": summary,
                "chosen": chosen}
    except BaseException as e:
        if run is not None and run.meta.get("status") == "running":
            run.finish("failed", error=f"{type(e).__name__}: {e}"[:2000])
        raise


def load_run(run_id: str | None = None, root=None) -> dict:
    """Replay: the tables of a recorded forensics run (the latest complete one by default)."""
    from . import records

    run = records.load(ROUND, run_id, root) if run_id else records.latest(ROUND, root)
    if run is None:
        raise ForensicsError(f"no complete {ROUND} run recorded under {records.data_root() if root is None else root}")
    tables = {t: run.table(t) for t in run.meta.get("tables", [])}
    return {"run": run, **tables}


# ------------------------------------------------------------------ CLI and gpu-check step


def _main(args) -> int:
    res = run_forensics(args.out, cases=args.cases.split(",") if args.cases else None,
                        metrics_set=args.metrics_set, record=not args.no_record,
                        shapes=args.shapes.split(",") if args.shapes else None, ncu=args.ncu,
                        warmup=args.warmup, repeats=args.repeats, ab_pairs=args.ab_pairs, ab_repeats=args.ab_repeats,
                        parity=not args.no_parity, timeout=args.timeout)
    s = res["summary"]
    print(json.dumps({k: s[k] for k in ("imma_ok", "verdicts", "fit_all", "run") if k in s}, indent=1, default=str))
    return 0 if res["ok"] else 1


def add_arguments(p) -> None:
    from . import forensics_driver as drv

    p.add_argument("--out", default=os.environ.get("OUT", "gpu-out"), help="results folder (default $OUT)")
    p.add_argument("--cases", default=None, help=f"comma list of cases (default all: {','.join(drv.CASES)})")
    p.add_argument("--shapes", default=None, help=f"comma list of NTxODxID (default {','.join(drv.DEFAULT_SHAPES)})")
    p.add_argument("--metrics-set", choices=METRIC_SETS, default="full")
    p.add_argument("--ncu", default=None, help="the ncu executable (default $NCU, PATH, /opt/nvidia/nsight-compute)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=0,
                   help="event-timed launches before the profiled one (0: under ncu's launch interception CUDA-event "
                        "times are not trustworthy; the verdicts use the --ab timing, which runs without ncu)")
    p.add_argument("--ab-pairs", type=int, default=5)
    p.add_argument("--ab-repeats", type=int, default=20)
    p.add_argument("--timeout", type=int, default=600, help="seconds per ncu process")
    p.add_argument("--no-parity", action="store_true")
    p.add_argument("--no-record", action="store_true")


def register_cli(sub) -> None:
    p = sub.add_parser("forensics", help="Nsight Compute counter forensics: per-GMAC counters, IMMA check, "
                                         "linear law, counter-evidence verdicts (GPU machine)")
    add_arguments(p)
    p.set_defaults(func=_main)


def gpu_check_step(out: Path, args) -> dict:
    """``gpu-check --steps forensics``: the round with the defaults (options from args when present)."""
    g = lambda k, d: getattr(args, k, d) if getattr(args, k, None) is not None else d  # noqa: E731
    res = run_forensics(out, cases=g("forensics_cases", None), metrics_set=g("forensics_metrics_set", "full"),
                        shapes=g("forensics_shapes", None), ncu=g("ncu", None))
    s = res["summary"]
    return {"ok": bool(res["ok"]), "run": s.get("run"), "imma_ok": s["imma_ok"], "verdicts": s["verdicts"]}
