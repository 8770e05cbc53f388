"""Round 6 -- counter forensics with Nsight Compute (``notebooks/06_counter_forensics``): the round is
:mod:`labkernels.forensics` (plumbing :mod:`labkernels.ncu`, analysis :mod:`labkernels.counters`, one profiled launch
per case from :mod:`labkernels.forensics_driver`)."""

from __future__ import annotations

NOTEBOOK = "06_counter_forensics"
DATA = ("forensics",)
PLAN = {"metrics_set": "full"}
measure = None       # forensics.run_forensics records its own run (one ncu process per case): record_runs


def record_runs(root=None, progress=print, *, metrics_set) -> dict:
    """The round on this GPU: ``forensics.run_forensics`` in a scratch folder (the raw ncu output stays there),
    its run imported into ``root`` (default data/, validated). {series: run}."""
    import tempfile
    from pathlib import Path

    from .. import forensics, records

    tmp = Path(tempfile.mkdtemp(prefix="lk-ncu-"))
    res = forensics.run_forensics(tmp, metrics_set=metrics_set, record=True, progress=progress)
    records.import_runs(tmp / "data", root)
    progress(f"raw ncu output: {tmp}")
    return {DATA[0]: records.load(DATA[0], res["summary"]["run"], root)}


def step_forensics(out, args) -> dict:
    """Round 6: Nsight Compute counters per GMAC for the paired kernels (labkernels.forensics)."""
    from .. import forensics

    return forensics.gpu_check_step(out, args)


STEPS = {"forensics": step_forensics}
