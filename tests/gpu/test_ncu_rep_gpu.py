"""Nsight Compute as a report (issue 49 item 2), on the device: one small round-6 case profiled by ncu with the
report kept (--export, SourceCounters, -lineinfo build, the launch chosen by the driver's NVTX range when the nvtx
package is present), read back through ncu_report -- the launch, typed metrics with units, and the per-source-line
hotspot table round 6's page shows."""
import os
import shutil

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_fast]


@pytest.fixture(scope="module")
def ncu():
    from labkernels.ncu import find_ncu

    exe = find_ncu()
    if not (os.sep in exe and os.access(exe, os.X_OK)) and not shutil.which(exe):
        pytest.skip("Nsight Compute (ncu) not installed")
    return exe


def test_profiled_case_report_reads_back_with_hotspots(tmp_path, ncu):
    from labkernels.rounds.r06_forensics import forensics, ncu_rep

    ncu_rep.import_ncu_report(ncu)          # the wheel or the install's extras/python: a failure here is the finding
    chosen = {"duration": "gpu__time_duration.sum", "warp_inst": "smsp__inst_executed.sum"}
    row, raw, cmd, units, rep = forensics.profile_case("q4k_nb_kdr4", "256x512x1024", chosen, tmp_path, ncu=ncu,
                                                       warmup=2, repeats=0, progress=print)
    assert rep is not None and rep.stat().st_size > 0, "no .ncu-rep kept"
    assert row["selected_by"] == ("nvtx" if ncu_rep.have_nvtx() else "launch_skip")
    ctx = ncu_rep.load(rep)
    ls = ncu_rep.launches(ctx)
    assert len(ls) == 1 and "q4k" in ls.kernel[0], ls
    if ncu_rep.have_nvtx():
        assert "labkernels@target" in ls.nvtx[0]
        assert len(ncu_rep.select_nvtx(ctx, ncu_rep.target_include())) == 1
    m = ncu_rep.metrics(ctx, ["gpu__time_duration.sum"])
    assert m.value[0] > 0 and m.unit[0] in ("nsecond", "ns", "usecond", "msecond")
    assert row["gpu__time_duration.sum"] == pytest.approx(m.value[0] * (1.0 if m.unit[0] in ("nsecond", "ns") else
                                                                      {"usecond": 1e3, "msecond": 1e6}[m.unit[0]]),
                                                          rel=1e-3)
    h = ncu_rep.kernel_hotspots(rep, "q4k")
    lines = h["lines"]
    print(h["metric"], "\n", lines.to_string())
    assert len(lines) >= 2 and lines.share.sum() <= 1.0 + 1e-9
    assert (lines.line > 0).any(), "no source lines: the -lineinfo build did not reach the report"
    assert rep.stat().st_size <= 6 << 20, f"{rep.stat().st_size} bytes: over the record's attachment cap"
