"""labkernels.sanitizer: compute-sanitizer's report read into records and classed -- a kernel's fault fails the step,
cuda-bindings' failed driver-entry-point lookups do not (and are counted), and every sanitizer step runs the one
runner."""

import subprocess
import types

import pytest

from labkernels import sanitizer

#: one record of round 9's gemv memcheck report (H100 80GB HBM3, driver 580.159.04, commit 045babc): 34 of these were
#: the whole of its "34 errors"
PROBE = """========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on CUDA API call to cuGetProcAddress_v2.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame:  [0xd4a2] in cydriver.cpython-312-x86_64-linux-gnu.so
=========         Host Frame:  [0x4cd54] in cydriver.cpython-312-x86_64-linux-gnu.so
=========         Host Frame:  [0xfe69] in cydriver.cpython-312-x86_64-linux-gnu.so
=========         Host Frame:  [0x30d4ed] in driver.cpython-312-x86_64-linux-gnu.so
=========         Host Frame: PyObject_Vectorcall [0x1499b4] in python3
=========         Host Frame: _PyEval_EvalFrameDefault [0x1d710e] in python3
=========         Host Frame: PyEval_EvalCode [0x1d55ea] in python3
=========         Host Frame: PyRun_StringFlags [0x208732] in python3
=========         Host Frame: PyRun_SimpleStringFlags [0x2b40dd] in python3
=========         Host Frame: Py_RunMain [0x2bcda0] in python3
=========         Host Frame: Py_BytesMain [0x2bc7bc] in python3
=========         Host Frame:  [0x2a1c9] in libc.so.6
=========         Host Frame: __libc_start_main [0x2a28a] in libc.so.6
=========         Host Frame: _start [0x257a04] in python3
=========         Host Frame: launch_programmatic in gpu.py:144
=========         Host Frame: launch in gpu.py:271
=========         Host Frame: gemv in gemv.py:552
=========         Host Frame: <module> in <string>:16
========= """

DEVICE = """========= Invalid __global__ read of size 16 bytes
=========     at gemv_kq<4, 0, 1, 1, 4, 1, 0>(const unsigned char *, const void *, float *, float *, unsigned int *, int, int, int, int)+0x4a0
=========     by thread (3,0,0) in block (140,1,0)
=========     Address 0x7f2a1c000a40 is out of bounds
=========
"""


def report(*records, summary=None, tool="memcheck"):
    n = len(records) if summary is None else summary
    tail = (f"========= RACECHECK SUMMARY: {n} hazards displayed ({n} errors, 0 warnings)" if tool == "racecheck"
            else f"========= ERROR SUMMARY: {n} error{'' if n == 1 else 's'}")
    return "\n".join(["========= COMPUTE-SANITIZER", *records, "driver done", tail]) + "\n"


def test_driver_probes_alone_are_clean_and_counted():
    f = sanitizer.findings(report(*[PROBE] * 34), "memcheck")
    assert f["errors"] == 34 and f["probe_api_errors"] == 34 and f["clean"]
    assert f["api_errors"] == {} and f["device"] == []


def test_a_device_fault_among_probes_is_not_clean_and_is_named():
    f = sanitizer.findings(report(PROBE, DEVICE, PROBE), "memcheck")
    assert f["errors"] == 3 and f["probe_api_errors"] == 2 and not f["clean"]
    assert f["device"] == ["Invalid __global__ read of size 16 bytes"] and f["device_count"] == 1


def test_another_failed_api_call_is_not_a_probe():
    other = PROBE.replace("cuGetProcAddress_v2", "cuLaunchKernelEx")
    f = sanitizer.findings(report(PROBE, other), "memcheck")
    assert f["api_errors"] == {"cuLaunchKernelEx: CUDA_ERROR_INVALID_VALUE": 1} and not f["clean"]
    wrong_error = PROBE.replace("CUDA_ERROR_INVALID_VALUE (error 1)", "CUDA_ERROR_OUT_OF_MEMORY (error 2)")
    assert not sanitizer.findings(report(wrong_error), "memcheck")["clean"]


def test_a_count_the_records_do_not_explain_is_not_clean():
    # the summary counts an error the parser did not see as a record: never called clean
    assert not sanitizer.findings(report(PROBE, summary=2), "memcheck")["clean"]


def test_racecheck_and_synccheck_summaries():
    assert sanitizer.findings(report(tool="racecheck"), "racecheck")["clean"]
    hazard = "========= Error: Race reported between Write access at kern+0x10\n=========     and Read access at kern+0x20"
    f = sanitizer.findings(report(hazard, tool="racecheck"), "racecheck")
    assert f["errors"] == 1 and not f["clean"] and f["device"][0].startswith("Error: Race reported")
    warn = ("========= COMPUTE-SANITIZER\n========= Warning: Race reported between Read access and Write access\n"
            "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)\n")
    f = sanitizer.findings(warn, "racecheck")
    assert f["clean"] and f["warnings"] == 1 and f["errors"] == 0
    assert sanitizer.findings(report(), "synccheck")["clean"]


def test_a_report_without_a_summary_or_an_unknown_tool_is_refused():
    with pytest.raises(sanitizer.SanitizerError, match="no summary line"):
        sanitizer.findings("========= COMPUTE-SANITIZER\nSegmentation fault\n", "memcheck")
    with pytest.raises(ValueError, match="unknown compute-sanitizer tool"):
        sanitizer.findings(report(), "initcheck")


@pytest.mark.parametrize("text, rc, ok, note", [
    (report(*[PROBE] * 34), 9, True, "34 failed cuGetProcAddress lookups"),
    (report(), 0, True, None),
    (report(PROBE, DEVICE), 9, False, "Invalid __global__ read"),
    ("========= COMPUTE-SANITIZER\nTraceback (most recent call last):\n", 1, False, "exit code 1"),
])
def test_run_tool_keeps_the_report_and_judges_it_by_its_records(tmp_path, monkeypatch, text, rc, ok, note):
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return types.SimpleNamespace(stdout=text, stderr="", returncode=rc)

    monkeypatch.setattr(sanitizer.subprocess, "run", fake_run)
    res = sanitizer.run_tool("memcheck", ["python3", "-c", "pass"], tmp_path / "r.txt", cwd=tmp_path, timeout=5)
    assert seen[0][:3] == ["compute-sanitizer", "--tool=memcheck", "--error-exitcode=9"]
    assert "--report-api-errors" not in seen[0]                # API reports stay on: classed, not hidden
    assert (tmp_path / "r.txt").read_text() == text and res["ok"] is ok and res["rc"] == rc
    assert (note is None and "note" not in res) or note in res["note"]


def test_run_tool_timeout_is_not_ok(tmp_path, monkeypatch):
    def slow(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"========= COMPUTE-SANITIZER\n")

    monkeypatch.setattr(sanitizer.subprocess, "run", slow)
    res = sanitizer.run_tool("racecheck", ["x"], tmp_path / "r.txt", cwd=tmp_path, timeout=1)
    assert res["rc"] == 124 and not res["ok"] and res["note"] == "timed out"
    assert (tmp_path / "r.txt").read_text().startswith("timeout after 1 s")


def test_every_sanitizer_step_runs_the_one_runner(tmp_path, monkeypatch):
    """The machine-wide, round 7 and round 9 sanitizer steps all go through sanitizer.run_tool (one classifier), and
    a report of probes only passes each of them."""
    from labkernels import gpu_checks
    from labkernels.rounds.r09_decode import steps as r9_steps

    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd[1])
        return types.SimpleNamespace(stdout=report(*[PROBE] * 3), stderr="", returncode=9)

    monkeypatch.setattr(sanitizer.subprocess, "run", fake_run)
    args = types.SimpleNamespace(sanitizer_timeout=5, log=lambda m: None)
    assert gpu_checks.step_sanitizer(tmp_path, args)["ok"]
    assert r9_steps.step_gemv_sanitizer(tmp_path, args)["ok"]
    assert calls == [f"--tool={t}" for t in sanitizer.TOOLS] * 2
    from labkernels.paths import REPO_ROOT

    builders = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "labkernels").rglob("*.py")
                      if '["compute-sanitizer"' in p.read_text())
    assert builders == ["labkernels/sanitizer.py"], builders     # no second command line, no second classifier
