"""labkernels.nvbench_check on CPU: nvbench's JSON parsed, the two timers compared (agreement within 2% or the
difference reported), the comparison recorded as an nvbench_check run and shown for rounds 7 and 9."""
import json
import math

import pytest

from labkernels import nvbench_check as NB
from labkernels import records, records_admin


def _summary(tag, v):
    return {"tag": tag, "name": tag, "data": [{"name": "value", "type": "float64", "value": repr(v)}]}


def _doc(times: dict, median=True):
    bs = []
    for name, (mean_s, med_s) in times.items():
        sums = [_summary("nv/cold/time/gpu/mean", mean_s), _summary("nv/cold/sample_size", 1234),
                _summary("nv/cold/time/gpu/stdev/relative", 0.004)]
        if median:
            sums.append(_summary("nv/cold/time/gpu/median", med_s))
        bs.append({"name": name, "states": [{"name": "Device=0", "is_skipped": False, "summaries": sums}]})
    bs.append({"name": "skipped:lab", "states": [{"is_skipped": True, "skip_reason": "no sm_90a", "summaries": []}]})
    return {"benchmarks": bs}


def test_parse_nvbench_json_reads_cold_gpu_times():
    doc = _doc({"gemm_q4k_nt512:lab": (100e-6, 99e-6), "gemm_q4k_nt512:cublas": (120e-6, 121e-6)})
    p = NB.parse_nvbench_json(json.dumps(doc))
    e = p["gemm_q4k_nt512:lab"]
    assert e["gpu_mean_us"] == pytest.approx(100.0) and e["gpu_median_us"] == pytest.approx(99.0)
    assert e["samples"] == 1234 and e["gpu_noise"] == pytest.approx(0.004) and not e["skipped"]
    assert NB.nvbench_time(e) == pytest.approx(99.0)                       # the median where reported
    nomed = NB.parse_nvbench_json(_doc({"x:lab": (50e-6, 0)}, median=False))["x:lab"]
    assert nomed["gpu_median_us"] is None and NB.nvbench_time(nomed) == pytest.approx(50.0)
    assert p["skipped:lab"]["skipped"] and math.isnan(NB.nvbench_time(p["skipped:lab"]))
    assert p["skipped:lab"]["skip_reason"] == "no sm_90a"


def _lab():
    return {"gemm_q4k_nt512": {"lab_us": 100.0, "cublas_us": 120.0},     # ratio 1.2
            "gemm_q4k_nt4096": {"lab_us": 800.0, "cublas_us": 760.0},    # ratio 0.95
            "gemv_q4k_nt1": {"lab_us": 20.0, "cublas_us": 40.0}}         # ratio 2.0


def test_compare_agrees_within_two_percent():
    nvb = {"gemm_q4k_nt512": {"lab_us": 101.0, "cublas_us": 121.5},      # both a bit slower: ratio 1.2030
           "gemm_q4k_nt4096": {"lab_us": 790.0, "cublas_us": 752.0},
           "gemv_q4k_nt1": {"lab_us": 20.2, "cublas_us": 40.1}}
    t = NB.compare(_lab(), nvb)
    assert list(t.case) == ["gemm_q4k_nt512", "gemm_q4k_nt4096", "gemv_q4k_nt1"] and t.agree.all()
    r = t.iloc[0]
    assert r.harness_ratio == pytest.approx(1.2) and r.nvbench_ratio == pytest.approx(121.5 / 101.0)
    assert r.ratio_diff == pytest.approx((121.5 / 101.0) / 1.2 - 1) and r.lab_time_diff == pytest.approx(0.01)
    assert list(t["round"]) == [7, 7, 9] and "agree within 2%" in r.note
    assert NB.verdict(t).startswith("nvbench and the lab's harness agree within 2% on all 3")


def test_compare_reports_a_disagreement_and_its_side():
    nvb = {"gemm_q4k_nt512": {"lab_us": 110.0, "cublas_us": 120.0},      # the lab kernel 10% slower under nvbench
           "gemm_q4k_nt4096": {"lab_us": 800.0, "cublas_us": 760.0 * 1.019},   # 1.9%: inside
           "gemv_q4k_nt1": {"lab_us": 20.0, "cublas_us": 40.0 * 1.021}}        # 2.1%: outside, cuBLAS's side
    t = NB.compare(_lab(), nvb).set_index("case")
    assert not t.loc["gemm_q4k_nt512", "agree"] and t.loc["gemm_q4k_nt4096", "agree"]
    assert not t.loc["gemv_q4k_nt1", "agree"]
    assert t.loc["gemm_q4k_nt512", "ratio_diff"] == pytest.approx(100 / 110 - 1)
    assert "the lab kernel's time" in t.loc["gemm_q4k_nt512", "note"] and "-9.1%" in t.loc["gemm_q4k_nt512", "note"]
    assert "cuBLAS's time" in t.loc["gemv_q4k_nt1", "note"]
    v = NB.verdict(t.reset_index())
    assert "gemm_q4k_nt512" in v and "gemv_q4k_nt1" in v and "gemm_q4k_nt4096" not in v
    tight = NB.compare(_lab(), nvb, tol=0.01).set_index("case")
    assert not tight.loc["gemm_q4k_nt4096", "agree"]


def test_compare_missing_side_never_agrees():
    t = NB.compare(_lab(), {"gemm_q4k_nt512": {"lab_us": math.nan, "cublas_us": 120.0}}).set_index("case")
    assert not t.agree.any() and t.loc["gemm_q4k_nt512", "note"] == "missing: nvbench"
    assert NB.verdict(None) == "no comparison recorded"


def test_run_check_records_the_comparison_and_the_pages_show_it(tmp_path, monkeypatch):
    raw = {"gemm_q4k_nt512:lab": {"gpu_mean_us": 101.0, "gpu_median_us": 100.5, "gpu_noise": 0.003, "samples": 900,
                                  "skipped": False, "skip_reason": ""}}
    nvb = {k: dict(v) for k, v in _lab().items()}
    nvb["gemv_q4k_nt1"]["lab_us"] = 25.0                       # a disagreement on round 9's headline
    monkeypatch.setattr(NB, "nvbench_times", lambda names, seed=0: ({n: nvb[n] for n in names}, raw))
    monkeypatch.setattr(NB, "harness_times", lambda names, pairs, repeats, seed=0: {n: _lab()[n] for n in names})
    res = NB.run_check(tmp_path, progress=lambda s: None)
    assert not res["ok"] and "gemv_q4k_nt1" in res["verdict"]
    root = tmp_path / "data"
    run = records.load(NB.SERIES, res["run"], root)
    assert run.dir.name == "09_decode" and set(run.meta["tables"]) == {"comparison", "nvbench"}
    assert run.meta["summary"]["agree"] is False and run.meta["params"]["tolerance"] == NB.TOLERANCE
    assert records_admin.check_data(root)[1] == []
    assert records.latest("decode", root) is None               # round 9's replay of its benchmark is untouched
    line7, t7 = NB.page_view(7, root)
    assert list(t7.case) == ["gemm_q4k_nt512", "gemm_q4k_nt4096"] and t7.agree.all() and res["run"] in line7
    line9, t9 = NB.page_view(9, root)
    assert list(t9.case) == ["gemv_q4k_nt1"] and not t9.agree.any() and "differ by" in line9
    empty, t = NB.page_view(9, tmp_path / "nothing")
    assert "No nvbench cross-check" in empty and not len(t)


def _bracket(monkeypatch, order):
    """NVML's run readings and both timers as stand-ins that log their call order (a GPU run's provenance)."""
    from labkernels import nvml, provenance

    real = provenance.collect
    monkeypatch.setattr(provenance, "collect", lambda params=None: {**real(params), "date": "2026-12-08T10:00:00Z",
                                                                    "gpu": {"name": "NVIDIA H100 80GB HBM3"}})

    def reading(sm, reasons=()):
        return {"sm_mhz": sm, "mem_mhz": 2619, "power_w": 300.0, "temp_c": 40, "reasons": 0,
                "reasons_names": list(reasons), "seq": len(order)}

    monkeypatch.setattr(nvml, "run_start", lambda prov: order.append("nvml_start") or reading(1980))
    monkeypatch.setattr(nvml, "run_end", lambda start: order.append("nvml_end") or {**reading(1965), "reasons_seen": []})
    monkeypatch.setattr(nvml, "reading", lambda *a, **k: order.append("nvml_mid") or reading(1970))

    def nvb(names, seed=0):
        order.append("nvbench")
        return {n: _lab()[n] for n in names}, {}

    def harness(names, pairs, repeats, seed=0):
        order.append("harness")
        return {n: _lab()[n] for n in names}

    monkeypatch.setattr(NB, "nvbench_times", nvb)
    monkeypatch.setattr(NB, "harness_times", harness)


def test_nvml_readings_bracket_both_timers(tmp_path, monkeypatch):
    """The run's NVML start reading is taken before nvbench times anything and its end reading after the harness
    (the run opened before the timing, finished after it, as every timed run); one reading between the two timers
    gives the GPU across nvbench's phase. A reading after the timing would fail the order."""
    order = []
    _bracket(monkeypatch, order)
    res = NB.run_check(tmp_path, progress=lambda s: None)
    assert order == ["nvml_start", "nvbench", "nvml_mid", "harness", "nvml_end"]
    run = records.load(NB.SERIES, res["run"], tmp_path / "data")
    p = run.provenance
    assert p["nvml_start"]["sm_mhz"] == 1980 and p["nvml_end"]["sm_mhz"] == 1965
    assert run.meta["summary"]["nvml_nvbench_phase"] == "sm 1980>1970 MHz; 300>300 W; 40>40 C; reasons none>none"
    assert run.meta["summary"]["settled"] is True and records_admin.check_data(tmp_path / "data")[1] == []
    order.clear()                                   # not recorded: no run, no NVML reading
    assert NB.run_check(tmp_path, record=False, progress=lambda s: None)["run"] is None
    assert order == ["nvbench", "harness"]


def test_a_timer_that_fails_leaves_a_failed_run_with_both_readings(tmp_path, monkeypatch):
    order = []
    _bracket(monkeypatch, order)

    def broken(names, seed=0):
        order.append("nvbench")
        raise RuntimeError("nvbench worker failed (rc=1)")

    monkeypatch.setattr(NB, "nvbench_times", broken)
    with pytest.raises(RuntimeError, match="worker failed"):
        NB.run_check(tmp_path, progress=lambda s: None)
    assert order == ["nvml_start", "nvbench", "nvml_end"]
    (run,) = records.list_runs(NB.SERIES, tmp_path / "data", status=None)
    assert run.meta["status"] == "failed" and "worker failed" in run.meta["summary"]["error"]
    assert run.provenance["nvml_end"]["sm_mhz"] == 1965


def test_headlines_and_the_worker_cli():
    assert {h.name for h in NB.HEADLINES} == {"gemm_q4k_nt512", "gemm_q4k_nt4096", "gemv_q4k_nt1"}
    assert NB.headline("gemv_q4k_nt1").nt == 1 and NB.bench_name("a", "lab") == "a:lab"
    with pytest.raises(KeyError, match="no headline"):
        NB.headline("nope")


def test_the_gemv_headline_is_timed_with_round_9s_lead():
    """The harness times round 9's GEMV headline as round 9's benchmark of record does: its GPU lead is the round's
    (nvbench_check holds it in the headline instead of importing the round, whose step runs the check)."""
    from labkernels.rounds import r09_decode

    gemv = [h for h in NB.HEADLINES if h.kernel == "gemv"]
    assert gemv and all(h.lead_us == r09_decode.PLAN["lead_us"] for h in gemv)
    assert all(h.lead_us == 0.0 for h in NB.HEADLINES if h.kernel != "gemv")


def test_a_difference_the_flush_explains_is_said_and_settles_the_check():
    """The GEMV headline timed by the harness behind both flushes: when the harness behind nvbench's own memset flush
    agrees with nvbench, the difference is the flush's (explained, the check settled); when it does not, it stays
    unexplained."""
    lab = _lab()
    lab["gemv_q4k_nt1"].update(lab_us_nvflush=23.0, cublas_us_nvflush=41.0)     # ratio 1.7826
    nvb = {k: dict(v) for k, v in _lab().items()}
    nvb["gemv_q4k_nt1"] = {"lab_us": 23.2, "cublas_us": 41.2}                     # ratio 1.7759: -11% vs 2.0
    t = NB.compare(lab, nvb).set_index("case")
    g = t.loc["gemv_q4k_nt1"]
    assert not g.agree and g.explained and g.harness_nvflush_ratio == pytest.approx(41.0 / 23.0)
    assert g.nvflush_ratio_diff == pytest.approx((41.2 / 23.2) / (41.0 / 23.0) - 1)
    assert "the difference is the flush" in g.note
    assert not t.loc["gemm_q4k_nt512", "explained"] and math.isnan(t.loc["gemm_q4k_nt512", "harness_nvflush_ratio"])
    assert NB.settled(t.reset_index())
    nvb["gemv_q4k_nt1"] = {"lab_us": 26.0, "cublas_us": 41.2}                     # 1.585: 11% off the memset flush too
    t2 = NB.compare(lab, nvb).set_index("case")
    assert not t2.loc["gemv_q4k_nt1", "explained"] and "not the flush alone" in t2.loc["gemv_q4k_nt1", "note"]
    assert not NB.settled(t2.reset_index())
    old = NB.compare(_lab(), nvb).drop(columns=["explained"])                      # a run recorded before the column
    assert not NB.settled(old) and not NB.settled(None)
