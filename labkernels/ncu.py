"""Nsight Compute plumbing: which counters mean what, the metric names a device offers, the ncu command line
that profiles exactly one launch, and ncu's raw CSV (used by round 6, :mod:`labkernels.rounds.r06_forensics.forensics`).

* **discover** the metric names the device offers (``ncu --query-metrics``; :func:`parse_query_metrics`)
  and pick, per counter *concept*, the first candidate it has (:data:`CONCEPTS`, :func:`choose_metrics`) --
  never assume one chip's names on another (the seeds' GB10 had no ``dram__*`` and counted int8 mma under
  IMMA, not HMMA);
* :func:`ncu_command` selects one launch with a kernel-name regex and ``--launch-skip/--launch-count``; clocks
  are left alone (``--clock-control none``);
* **parse** ncu's raw CSV (:func:`parse_ncu_csv`: units row, quoted thousands separators, ``==PROF==`` noise).
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
from dataclasses import dataclass

import pandas as pd


class ProfilerError(RuntimeError):
    """Nsight Compute could not give the counters asked for."""


class MetricsError(ProfilerError):
    """A required counter concept has no metric on this device (or the query output had no metrics)."""


class NcuError(ProfilerError):
    """ncu failed, could not read the counters, or profiled the wrong number of launches."""


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
            + ". Check `ncu --query-metrics` on the device and add its name to ncu.CONCEPTS.")
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


def ncu_command(python_args, metrics, kernel_regex: str, launch_skip: int, launch_count: int, out_csv,
                ncu: str = "ncu", python: str | None = None, *, nvtx_include: str | None = None,
                export=None, sections=(), import_source: bool = False) -> list[str]:
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
    * replay mode and cache control stay at ncu's defaults (kernel replay, caches flushed between passes);
    * ``nvtx_include`` (``domain@range/``): ``--nvtx --nvtx-include``: only launches inside the lab's NVTX range are
      candidates (the driver wraps the profiled launch in one, :func:`labkernels.rounds.r06_forensics.ncu_rep.nvtx_range`), so the launch
      is chosen by name, not by ``--launch-skip`` arithmetic (the skip is then 0);
    * ``export``: ``--export PATH --force-overwrite``: the ``.ncu-rep`` report is kept (read back with
      :mod:`labkernels.rounds.r06_forensics.ncu_rep`); ``sections`` (``SourceCounters``: per-PC counters for the source / SASS view) and
      ``import_source`` (``--import-source yes``: the .cu text into the report) go with it."""
    if not metrics:
        raise ValueError("no metrics to collect")
    if launch_skip < 0 or launch_count < 1:
        raise ValueError("launch_skip must be >= 0 and launch_count >= 1")
    return [ncu, "--clock-control", "none", "--target-processes", "all",
            "--csv", "--page", "raw", "--print-units", "base",
            "--metrics", ",".join(metrics),
            "--kernel-name-base", "function", "--kernel-name", f"regex:{kernel_regex}",
            "--launch-skip", str(int(launch_skip)), "--launch-count", str(int(launch_count)),
            *(["--nvtx", "--nvtx-include", nvtx_include] if nvtx_include else []),
            *[a for sec in sections for a in ("--section", str(sec))],
            *(["--export", str(export), "--force-overwrite"] if export else []),
            *(["--import-source", "yes"] if import_source and export else []),
            "--log-file", str(out_csv),
            python or sys.executable, *[str(a) for a in python_args]]


def import_command(report, ncu: str = "ncu") -> list[str]:
    """ncu reading a kept report back as the same raw CSV (``--import``): the metrics of an exported run."""
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


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

