"""labkernels.rounds.r06_forensics.ncu_rep on a fake ncu_report object model (no GPU, no Nsight Compute): launches, typed metrics, NVTX
selection, per-PC source / SASS hotspots; the module's import fallback and its error when absent."""
import sys
import types

import pandas as pd
import pytest

from labkernels.rounds.r06_forensics import ncu_rep


class FakeMetric:
    MetricType_OTHER, MetricType_COUNTER, MetricType_RATIO, MetricType_THROUGHPUT = 0, 1, 2, 3

    def __init__(self, name, value=None, unit="", mtype=1, instances=None, pcs=None):
        self._n, self._v, self._u, self._t = name, value, unit, mtype
        self._inst, self._pcs = instances or [], pcs

    def name(self):
        return self._n

    def unit(self):
        return self._u

    def metric_type(self):
        return self._t

    def num_instances(self):
        return len(self._inst)

    def has_correlation_ids(self):
        return self._pcs is not None

    def correlation_ids(self):
        return FakeMetric(self._n + ".ids", instances=self._pcs) if self._pcs is not None else None

    def value(self, idx=None):
        if idx is None:
            if self._v is None:
                raise ValueError("instanced only")
            return self._v
        return self._inst[idx]


class FakeSourceInfo:
    def __init__(self, f, line):
        self.f, self.l = f, line

    def file_name(self):
        return self.f

    def line(self):
        return self.l


class FakeDomain:
    def __init__(self, name, ranges):
        self.n, self.r = name, ranges

    def name(self):
        return self.n

    def push_pop_ranges(self):
        return self.r

    def start_end_ranges(self):
        return []


class FakeNvtx:
    def __init__(self, doms):
        self.d = doms

    def domains(self):
        return list(range(len(self.d)))

    def domain_by_id(self, i):
        return self.d[i]


class FakeAction:
    NameBase_FUNCTION, NameBase_DEMANGLED, NameBase_MANGLED = 0, 1, 2

    def __init__(self, name, demangled, metrics, nvtx=(), sass=None, src=None):
        self.n, self.dm, self.m = name, demangled, {m.name(): m for m in metrics}
        self.nv, self.sass, self.src = list(nvtx), sass or {}, src or {}

    def name(self, base=0):
        return self.dm if base == self.NameBase_DEMANGLED else self.n

    def metric_names(self):
        return list(self.m)

    def metric_by_name(self, n):
        return self.m.get(n)

    def nvtx_state(self):
        return FakeNvtx([FakeDomain("labkernels", self.nv)]) if self.nv else None

    def sass_by_pc(self, pc):
        return self.sass.get(pc, "")

    def source_info(self, pc):
        return FakeSourceInfo(*self.src[pc]) if pc in self.src else None


class FakeRange:
    def __init__(self, actions):
        self.a = actions

    def num_actions(self):
        return len(self.a)

    def action_by_idx(self, i):
        return self.a[i]

    def actions_by_nvtx(self, includes, excludes):
        want = {i.rstrip("/") for i in includes}
        return tuple(i for i, a in enumerate(self.a) if {f"labkernels@{r}" for r in a.nv} & want)


class FakeContext:
    def __init__(self, ranges):
        self.r = ranges

    def num_ranges(self):
        return len(self.r)

    def range_by_idx(self, i):
        return self.r[i]


PCS = [0x100, 0x110, 0x120, 0x130]
SASS = {0x100: "LDS.128 R4, [R2]", 0x110: "IMMA.16816.S8.S8 R8, R4, R6, R8", 0x120: "@!P0 IMMA.16816.S8.S8 R12, R4, R7, R12",
        0x130: "I2F.F32.S32 R20, R8"}
SRC = {0x100: ("/k/q6k_expb.cuh", 40), 0x110: ("/k/q6k_expb.cuh", 52), 0x120: ("/k/q6k_expb.cuh", 52),
       0x130: ("/k/q6k_expb.cuh", 77)}


def _ctx():
    prep = FakeAction("quantize_q8_1", "quantize_q8_1(...)", [FakeMetric("gpu__time_duration.sum", 2000.0, "nsecond")])
    tgt = FakeAction("q6k_expb_kernel", "void q6k_expb_kernel<4, 210, 0, 2>(...)", [
        FakeMetric("gpu__time_duration.sum", 123456.0, "nsecond"),
        FakeMetric("launch__grid_size", 832, "", 0), FakeMetric("launch__block_size", 256, "", 0),
        FakeMetric("launch__registers_per_thread", 128, "register/thread", 0),
        FakeMetric("sm__warps_active.avg.pct_of_peak_sustained_active", 48.5, "%", 2),
        FakeMetric("device__attribute_display_name", "NVIDIA H100", "", 0),
        FakeMetric("inst_executed", instances=[10.0, 400.0, 400.0, 90.0], pcs=PCS),
        FakeMetric("smsp__pcsamp_sample_count", instances=[5, 20, 10, 65], pcs=PCS),
        # ncu correlates string-valued metrics with PCs too (seen on an H100: 'CachePreferNone')
        FakeMetric("launch__func_cache_config", instances=["CachePreferNone"] * 4, pcs=PCS, mtype=0),
        # and counts per opcode with the opcode names as correlation ids (seen on an H100 at 2406c00: 'FFMA')
        FakeMetric("sass__inst_executed_per_opcode", instances=[12.0, 3.0], pcs=["FFMA", "IMAD"]),
    ], nvtx=["target"], sass=SASS, src=SRC)
    return FakeContext([FakeRange([prep, tgt])])


def test_launches_and_typed_metrics():
    ctx = _ctx()
    ls = ncu_rep.launches(ctx)
    assert list(ls.kernel) == ["quantize_q8_1", "q6k_expb_kernel"]
    t = ls.iloc[1]
    assert t.demangled.startswith("void q6k_expb_kernel<4, 210") and t.grid == 832 and t.block == 256
    assert t.duration_ns == 123456.0 and t.nvtx == "labkernels@target" and ls.iloc[0].nvtx == ""
    m = ncu_rep.metrics(ctx, kernel="q6k_expb")
    occ = m[m.metric == "sm__warps_active.avg.pct_of_peak_sustained_active"].iloc[0]
    assert (occ.value, occ.unit, occ.type) == (48.5, "%", "ratio")
    assert m[m.metric == "device__attribute_display_name"].iloc[0].value == "NVIDIA H100"
    assert m[m.metric == "gpu__time_duration.sum"].iloc[0].type == "counter"
    inst = m[m.metric == "inst_executed"].iloc[0]
    assert inst.instances == 4 and inst.value is None
    w = ncu_rep.metrics_wide(ctx, ["gpu__time_duration.sum"])
    assert list(w["gpu__time_duration.sum"]) == [2000.0, 123456.0] and w.attrs["units"]["gpu__time_duration.sum"] == "nsecond"


def test_nvtx_selects_the_target_launch():
    ctx = _ctx()
    inc = ncu_rep.target_include()
    assert inc == "labkernels@target/"
    sel = ncu_rep.select_nvtx(ctx, inc)
    assert [ncu_rep.kernel_name(a) for a in sel] == ["q6k_expb_kernel"]
    assert ncu_rep.select_nvtx(ctx, "labkernels@other/") == []


def test_pc_table_and_hotspots():
    act = _ctx().range_by_idx(0).action_by_idx(1)
    assert ncu_rep.source_metrics(act) == ["inst_executed", "smsp__pcsamp_sample_count"]
    pcs = ncu_rep.pc_table(act)
    assert list(pcs.pc) == PCS and list(pcs.line) == [40, 52, 52, 77]
    assert pcs.loc[1, "inst_executed"] == 400.0 and pcs.loc[3, "smsp__pcsamp_sample_count"] == 65
    lines = ncu_rep.line_hotspots(pcs)                        # by inst_executed
    assert list(lines.line) == [52, 77, 40] and lines.loc[0, "inst_executed"] == 800.0
    assert lines.loc[0, "share"] == pytest.approx(800 / 900) and lines.loc[0, "instructions"] == 2
    assert lines.loc[0, "file"] == "q6k_expb.cuh" and lines.loc[0, "hottest_sass"].lstrip("@!P0 ").startswith("IMMA")
    samp = ncu_rep.line_hotspots(pcs, by="smsp__pcsamp_sample_count", top=1)
    assert list(samp.line) == [77] and samp.loc[0, "share"] == pytest.approx(0.65)
    ops = ncu_rep.sass_hotspots(pcs, per="opcode")
    assert list(ops.opcode) == ["IMMA", "I2F", "LDS"] and ops.loc[0, "instructions"] == 2
    assert ncu_rep.sass_hotspots(pcs, by="smsp__pcsamp_sample_count", top=1).loc[0, "pc"] == 0x130
    with pytest.raises(KeyError, match="no per-PC metric"):
        ncu_rep.line_hotspots(pcs, by="nope")
    with pytest.raises(ValueError, match="launch__func_cache_config.*not a numeric per-PC count"):
        ncu_rep.pc_table(act, ["launch__func_cache_config"])
    with pytest.raises(ValueError, match="per-PC count"):
        ncu_rep.pc_table(act, ["sass__inst_executed_per_opcode"])
    assert ncu_rep.opcode("@!P0 IMMA.16816.S8.S8 R12") == "IMMA" and ncu_rep.opcode("") == ""


def test_no_line_info_lands_on_line_minus_one_and_no_source_metrics_says_so():
    act = FakeAction("k", "k()", [FakeMetric("inst_executed", instances=[1.0, 3.0], pcs=[8, 16])], sass={8: "NOP"})
    lines = ncu_rep.line_hotspots(ncu_rep.pc_table(act))
    assert list(lines.line) == [-1] and lines.loc[0, "inst_executed"] == 4.0
    bare = ncu_rep.pc_table(FakeAction("k", "k()", [FakeMetric("gpu__time_duration.sum", 1.0)]))
    with pytest.raises(ValueError, match="SourceCounters"):
        ncu_rep.line_hotspots(bare)


def test_kernel_hotspots_reads_a_report_through_the_module(tmp_path):
    rep = tmp_path / "x.ncu-rep"
    rep.write_bytes(b"fake")
    mod = types.SimpleNamespace(load_report=lambda p: _ctx())
    h = ncu_rep.kernel_hotspots(rep, "q6k_expb", module=mod)
    assert h["metric"] == "inst_executed" and list(h["lines"].line)[:1] == [52]
    assert h["launch"].iloc[0].kernel == "q6k_expb_kernel"
    with pytest.raises(KeyError, match="no kernel"):
        ncu_rep.kernel_hotspots(rep, "gemv", module=mod)
    with pytest.raises(FileNotFoundError):
        ncu_rep.load(tmp_path / "missing.ncu-rep", mod)


def test_import_falls_back_to_an_install_and_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ncu_report", None)          # the wheel absent
    monkeypatch.setenv("NCU_REPORT_PATH", str(tmp_path / "nowhere"))
    monkeypatch.setenv("NCU", str(tmp_path / "no-ncu"))
    with pytest.raises(ncu_rep.NcuReportMissing, match="pip install ncu-report.*nowhere"):
        ncu_rep.import_ncu_report()
    extras = tmp_path / "ncu" / "extras" / "python"
    extras.mkdir(parents=True)
    (extras / "ncu_report.py").write_text("def load_report(p):\n    return 'ctx:' + p\n")
    monkeypatch.delitem(sys.modules, "ncu_report")
    monkeypatch.setenv("NCU_REPORT_PATH", str(extras))
    monkeypatch.setattr(sys, "path", list(sys.path))
    mod = ncu_rep.import_ncu_report()
    assert mod.load_report("r") == "ctx:r"
    sys.modules.pop("ncu_report", None)


def test_nvtx_range_is_a_context_either_way():
    with ncu_rep.nvtx_range("target"):
        pass
    assert isinstance(ncu_rep.have_nvtx(), bool)
