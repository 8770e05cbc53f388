"""NVML provenance (labkernels.nvml) on the CPU: a fake ``pynvml`` module stands in for the driver's library, with
the constants and call shapes of nvidia-ml-py; the real library's constants are checked where it is installed."""
import sys
import time
import types

import numpy as np
import pytest

from labkernels import bench, nvml, provenance, records, records_admin, report


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    def __str__(self):
        return "Not Supported"


def fake_pynvml(state: dict, init_error: Exception | None = None, slow_s: float = 0.0):
    """A module with pynvml's names: ``state`` holds what the 'GPU' reports now (edit it between readings)."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    m.NVML_PERF_POLICY_POWER, m.NVML_PERF_POLICY_THERMAL = 0, 1
    # nvidia-ml-py 13's clocks-event reason bits (and the older throttle spellings, one bit only they name)
    for name, bit in (("GpuIdle", 0x1), ("ApplicationsClocksSetting", 0x2), ("UserDefinedClocks", 0x2),
                      ("SwPowerCap", 0x4), ("HwSlowdown", 0x8), ("SyncBoost", 0x10), ("SwThermalSlowdown", 0x20),
                      ("HwThermalSlowdown", 0x40), ("HwPowerBrakeSlowdown", 0x80), ("DisplayClockSetting", 0x100),
                      ("None", 0), ("All", 0x1FF)):
        setattr(m, f"nvmlClocksEventReason{name}", bit)
        setattr(m, f"nvmlClocksThrottleReason{name}", bit)
    m.nvmlClocksThrottleReasonBoardLimit = 0x200
    calls = state.setdefault("calls", [])

    def init():
        calls.append("init")
        if init_error:
            raise init_error

    def get(key):
        if slow_s:
            time.sleep(slow_s)
        v = state[key]
        if isinstance(v, Exception):
            raise v
        return v

    m.nvmlInit = init
    m.nvmlDeviceGetHandleByPciBusId = lambda bus: ("h", bus)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    m.nvmlDeviceGetHandleByUUID = lambda u: ("h", u)
    m.nvmlDeviceGetClockInfo = lambda h, c: get({1: "sm", 2: "mem"}[c])
    m.nvmlDeviceGetMaxClockInfo = lambda h, c: {1: 1980, 2: 3201}[c]
    m.nvmlDeviceGetPowerUsage = lambda h: get("mw")
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700000
    m.nvmlDeviceGetTemperature = lambda h, s: get("temp")
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: get("reasons")
    m.nvmlDeviceGetPerformanceState = lambda h: 0
    m.nvmlDeviceGetTotalEnergyConsumption = lambda h: get("energy")
    m.nvmlDeviceGetViolationStatus = lambda h, pol: types.SimpleNamespace(
        referenceTime=0, violationTime=get({0: "power_ns", 1: "thermal_ns"}[pol]))
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetUUID = lambda h: "GPU-1234"
    m.nvmlDeviceGetIndex = lambda h: 3
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId="00000000:1B:00.0")
    m.nvmlSystemGetDriverVersion = lambda: "580.95.05"
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    return m


GPU = {"sm": 1980, "mem": 3201, "mw": 612345, "temp": 52, "reasons": 0, "energy": 1000, "power_ns": 5_000_000,
       "thermal_ns": NotSupported()}


@pytest.fixture
def gpu(monkeypatch):
    """A fake NVML GPU for this test (the state dict it reads from), behind CUDA's current device's bus id."""
    state = dict(GPU)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(state))
    monkeypatch.setattr(nvml, "_cuda_pci_bus_id", lambda: "00000000:1B:00.0")
    nvml._reset()
    yield state
    nvml._reset()


def test_reading_is_typed_decoded_and_names_what_nvml_refused(gpu):
    gpu["reasons"] = 0x1 | 0x4 | 0x400           # idle, SW power cap, and a bit this pynvml has no name for
    r = nvml.reading()
    assert (r["sm_mhz"], r["sm_max_mhz"], r["mem_mhz"], r["mem_max_mhz"]) == (1980, 1980, 3201, 3201)
    assert r["power_w"] == 612.3 and r["power_limit_w"] == 700.0 and r["temp_c"] == 52 and r["pstate"] == "P0"
    assert r["reasons"] == 0x405 and r["reasons_names"] == ["gpu_idle", "sw_power_cap", "bit_0x400"]
    assert r["power_violation_ns"] == 5_000_000 and "thermal_violation_ns" not in r
    assert r["errors"] == {"thermal_violation_ns": "NotSupported: Not Supported"}
    assert isinstance(r["seq"], int) and r["t"].endswith("Z")
    short = nvml.reading(full=False)
    assert "sm_max_mhz" not in short and "power_violation_ns" not in short and short["seq"] == r["seq"] + 1


def test_reason_names_come_from_pynvml_deduplicated(gpu):
    bits = nvml.reason_bits(sys.modules["pynvml"])
    assert bits[0x2] == "applications_clocks_setting"        # not the deprecated alias UserDefinedClocks
    assert bits[0x200] == "board_limit" and 0 not in bits and 0x1FF not in bits
    assert set(nvml.CAP_REASONS) <= set(bits.values()) and "gpu_idle" not in nvml.CAP_REASONS


def test_real_pynvml_names_every_cap_reason():
    """With nvidia-ml-py installed (dev extra; nvmlInit is not needed for its constants): the reason names the lab
    flags are the library's."""
    pynvml = pytest.importorskip("pynvml")
    names = set(nvml.reason_bits(pynvml).values())
    assert set(nvml.CAP_REASONS) <= names and {"gpu_idle", "sync_boost"} <= names
    assert callable(getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None))


def test_without_nvml_the_fields_are_absent_and_say_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)          # import pynvml raises ImportError
    nvml._reset()
    assert nvml.reading() == {"absent": "NVML not read: the Python package nvidia-ml-py (module pynvml) is not "
                                        "installed"}
    assert "absent" in nvml.identity()
    state = dict(GPU)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(state, init_error=NVMLError("Driver Not Loaded")))
    nvml._reset()
    r = nvml.reading()
    assert r["absent"].startswith("NVML not read: nvmlInit failed") and "Driver Not Loaded" in r["absent"]
    nvml.reading()
    assert state["calls"].count("init") == 1                  # the failure is remembered, not retried per reading
    nvml._reset()


def _gpu_collect(monkeypatch, date="2026-12-08T10:00:00Z"):
    real = provenance.collect
    monkeypatch.setattr(provenance, "collect", lambda params=None: {**real(params), "date": date,
                                                                    "gpu": {"name": "NVIDIA H200"}})


def test_a_run_records_nvml_at_start_and_end_with_every_reason_seen(gpu, monkeypatch, tmp_path):
    _gpu_collect(monkeypatch)
    run = records.new_run("decode", {}, root=tmp_path)
    assert run.provenance["nvml_start"]["sm_mhz"] == 1980 and run.provenance["nvml_start"]["reasons_names"] == []
    gpu["reasons"] = 0x4                       # capped in the middle of the run ...
    nvml.reading(full=False)
    gpu["reasons"], gpu["power_ns"] = 0x1, 9_500_000       # ... idle again at the end; the counter moved 4.5 ms
    run.finish()
    r = records.latest("decode", root=tmp_path)
    end = r.provenance["nvml_end"]
    assert end["reasons_names"] == ["gpu_idle"] and end["reasons_seen"] == ["gpu_idle", "sw_power_cap"]
    assert end["readings"] == 3
    assert nvml.throttled(r) == ["sw_power_cap during the run", "power violation counter +4.5 ms"]
    assert not nvml.for_verdict(r) and nvml.for_verdict(r, why="the cap is what this page studies")
    assert "THROTTLED" in nvml.throttle_html(r) and "sw_power_cap during the run" in nvml.throttle_html(r)
    assert "1980/1980 MHz at start, 1980 MHz at end" in provenance.describe(r.provenance)
    assert records_admin.check_data(tmp_path) == (1, [])


def test_an_unthrottled_run_is_not_flagged_and_idle_is_not_a_cap(gpu, monkeypatch, tmp_path):
    _gpu_collect(monkeypatch)
    gpu["reasons"] = 0x1 | 0x10                    # idle + sync boost: not caps
    with records.recording("decode", {}, root=tmp_path):
        nvml.reading(full=False)
    r = records.latest("decode", root=tmp_path)
    assert nvml.throttled(r) == [] and nvml.for_verdict(r) and nvml.throttle_html(r) == ""


def test_the_banner_flags_a_throttled_run(gpu, monkeypatch, tmp_path):
    _gpu_collect(monkeypatch)
    gpu["reasons"] = 0x40
    with records.recording("decode", {}, root=tmp_path):
        pass
    run = records.latest("decode", root=tmp_path)
    shown = []
    monkeypatch.setattr(report, "_display_html", shown.append)
    report.banner("replay", run)
    assert "<b>THROTTLED</b>" in shown[0] and "hw_thermal_slowdown at start" in shown[0]
    shown.clear()
    gpu["reasons"] = 0
    with records.recording("q6k", {}, root=tmp_path):
        pass
    report.banner("replay", records.latest("q6k", root=tmp_path))
    assert "THROTTLED" not in shown[0]


def test_verdict_tables_skip_throttled_runs(gpu, monkeypatch, tmp_path):
    """gemv.auto_table (round 9's decode choice) takes the latest decode run that saw no cap."""
    from labkernels import gemv

    row = {"qtype": "q4_K", "act": "f16", "od": 4096, "id": 4096, "nt": 1, "variant": "gemv_m2w4", "family": "gemv_kq",
           "MT": 2, "WARPS": 4, "S": 0, "median_us": 10.0}
    ids = []
    for i, reasons in enumerate((0, 0x4)):        # an older clean run, then a newer one under a power cap
        _gpu_collect(monkeypatch, date=f"2026-12-08T10:00:0{i}Z")
        gpu["reasons"] = reasons
        with records.recording("decode", {"what": "gemv_bench"}, root=tmp_path) as run:
            run.append("gemv_bench", row)
        ids.append(run.run_id)
    assert gemv.auto_table(root=tmp_path).run_id.iloc[0] == ids[0]


def test_check_data_requires_nvml_on_gpu_runs_after_the_cut_over(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)          # a GPU machine whose NVML cannot be read
    nvml._reset()
    for date in ("2026-12-01T00:00:00Z", "2026-12-08T00:00:00Z"):
        _gpu_collect(monkeypatch, date)
        with records.recording("decode", {}, root=tmp_path):
            pass
    n, problems = records_admin.check_data(tmp_path)
    assert n == 2 and len(problems) == 2        # the later run only: its nvml_start and nvml_end are absent
    assert all("2026120 8T".replace(" ", "") in p and "is absent (NVML not read: the Python package" in p
               for p in problems)
    nvml._reset()


def test_check_run_rules():
    good = {"sm_mhz": 1, "mem_mhz": 2, "reasons": 0, "reasons_names": []}
    meta = lambda **p: {"run_id": "r", "started": "2026-12-09T00:00:00Z", "provenance": {"gpu": {"name": "x"}, **p}}
    assert nvml.check_run(meta(nvml_start=good, nvml_end=good)) == []
    assert nvml.check_run({**meta(), "started": "2026-12-01T00:00:00Z"}) == []              # before the cut-over
    assert nvml.check_run({"run_id": "r", "started": "2026-12-09T00:00:00Z", "provenance": {"gpu": None}}) == []
    assert nvml.check_run(meta(nvml_start=good)) == [
        f"run r: a GPU run recorded after {nvml.NVML_SINCE} without provenance.nvml_end"]
    bad = {"sm_mhz": 1, "mem_mhz": 2, "errors": {"reasons": "NotSupported"}}
    (p,) = nvml.check_run(meta(nvml_start=good, nvml_end=bad))
    assert "nvml_end lacks ['reasons', 'reasons_names']" in p and "NotSupported" in p


def test_interleaved_rounds_carry_a_compact_reading(gpu, monkeypatch):
    monkeypatch.setattr(nvml, "PAIR_BUDGET", 10.0)       # every round read (the budget has its own test below)

    def fake(fn, warmup=3, repeats=20, flush=None, *a):
        gpu["sm"] -= 10
        return np.ones(3)

    monkeypatch.setattr(bench, "time_launches", fake)
    res = bench.interleaved({"a": None, "b": None}, pairs=3)
    texts = [s["nvml"] for s in res["a"]]
    assert texts == [s["nvml"] for s in res["b"]]
    assert texts[0] == "sm 1980>1960 MHz; 612.3>612.3 W; 52>52 C; reasons none>none"
    assert texts[1].startswith("sm 1960>1940 MHz")         # the reading after a round is the next one's before
    monkeypatch.setattr(bench, "time_launches", lambda *a, **k: (gpu.update(reasons=0x4 | 0x1, sm=1910), np.ones(3))[1])
    res = bench.interleaved({"a": None}, pairs=1)       # capped during the round
    p = nvml.parse_pair(res["a"][0]["nvml"])
    assert p["reasons"] == ([], ["gpu_idle", "sw_power_cap"]) and p["sm_mhz"] == (1920.0, 1910.0)
    assert nvml.pair_caps(res["a"][0]["nvml"]) == ["sw_power_cap"]
    rows = bench.pair_rows(res, {"od": 1}, 1, 1, 256)
    assert rows[0]["nvml"] == res["a"][0]["nvml"]


def test_interleaved_stops_reading_when_a_reading_costs_over_one_percent(monkeypatch):
    state = dict(GPU)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(state, slow_s=0.002))    # ~10 ms a short reading
    monkeypatch.setattr(nvml, "_cuda_pci_bus_id", lambda: "00000000:1B:00.0")
    nvml._reset()
    monkeypatch.setattr(bench, "time_launches", lambda fn, warmup=3, repeats=20, flush=None: np.ones(3))
    res = bench.interleaved({"a": None}, pairs=3)
    texts = [s["nvml"] for s in res["a"]]
    assert texts[0].startswith("sm 1980>1980 MHz")
    assert texts[1] == texts[2] and texts[1].startswith("not read: one NVML reading takes")
    assert nvml.parse_pair(texts[1]) is None and nvml.pair_caps(texts[1]) == []
    nvml._reset()


def test_interleaved_without_nvml_adds_no_column(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    nvml._reset()
    monkeypatch.setattr(bench, "time_launches", lambda fn, warmup=3, repeats=20, flush=None: np.ones(3))
    res = bench.interleaved({"a": None}, pairs=2)
    assert all("nvml" not in s for s in res["a"])
    nvml._reset()


def test_identity_and_peers_read_nvml(gpu):
    from labkernels import peers

    assert nvml.identity() == {"name": "NVIDIA H200", "uuid": "GPU-1234", "index": 3, "pci_bus_id": "00000000:1B:00.0",
                               "driver": "580.95.05", "cc": "9.0"}
    assert peers.gpu_name() == "NVIDIA H200" and peers.gpu_cc() == 900


def test_no_nvidia_smi_text_is_parsed_any_more():
    from pathlib import Path

    import labkernels

    pkg = Path(labkernels.__file__).parent
    hits = [p.name for p in pkg.rglob("*.py") if "--query-gpu" in p.read_text() or "_nvidia_smi" in p.read_text()]
    assert hits == []
