"""Round 6 -- counter forensics with Nsight Compute (``notebooks/06_counter_forensics``). The round's package holds
what only it uses: :mod:`.forensics` (the round: profile, A/B timing, record, replay; the ``labkernels gpu forensics``
command), :mod:`.counters` (the analysis: per GMAC, IMMA check, fit, verdict), :mod:`.forensics_driver` (one profiled
launch per case, ``python3 -m labkernels.rounds.r06_forensics.forensics_driver``) and :mod:`.ncu_rep` (the kept
``.ncu-rep`` read back); the Nsight Compute plumbing it shares with round 7 is :mod:`labkernels.ncu`."""

from __future__ import annotations

from ... import records, records_admin
from . import forensics

NOTEBOOK = "06_counter_forensics"
DATA = ("forensics",)
PLAN = {"metrics_set": "full"}
measure = None       # forensics.run_forensics records its own run (one ncu process per case): record_runs


def record_runs(root=None, progress=print, *, metrics_set) -> dict:
    """The round on this GPU: ``forensics.run_forensics`` in a scratch folder (the raw ncu output stays there),
    its run imported into ``root`` (default data/, validated). {series: run}."""
    import tempfile
    from pathlib import Path

    tmp = Path(tempfile.mkdtemp(prefix="lk-ncu-"))
    res = forensics.run_forensics(tmp, metrics_set=metrics_set, record=True, progress=progress)
    records_admin.import_runs(tmp / "data", root)
    progress(f"raw ncu output: {tmp}")
    return {DATA[0]: records.load(DATA[0], res["summary"]["run"], root)}


def step_forensics(out, args) -> dict:
    """Round 6: Nsight Compute counters per GMAC for the paired kernels (:mod:`.forensics`)."""
    return forensics.gpu_check_step(out, args)


STEPS = {"forensics": step_forensics}
