"""Round 6 -- counter forensics with Nsight Compute (``notebooks/06_counter_forensics``): the round is
:mod:`labkernels.forensics` (plumbing :mod:`labkernels.ncu`, analysis :mod:`labkernels.counters`, one profiled launch
per case from :mod:`labkernels.forensics_driver`)."""

from __future__ import annotations

NOTEBOOK = "06_counter_forensics"
DATA = ("forensics",)
PLAN = {"metrics_set": "full"}
measure = None       # forensics.run_forensics records its own run (one ncu process per case)


def step_forensics(out, args) -> dict:
    """Round 6: Nsight Compute counters per GMAC for the paired kernels (labkernels.forensics)."""
    from .. import forensics

    return forensics.gpu_check_step(out, args)


STEPS = {"forensics": step_forensics}
