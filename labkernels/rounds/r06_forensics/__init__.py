"""Round 6 -- counter forensics with Nsight Compute (``notebooks/06_counter_forensics``). The round's package holds
what only it uses: :mod:`.forensics` (the round: profile, A/B timing, record, replay; the ``labkernels gpu forensics``
command), :mod:`.counters` (the analysis: per GMAC, IMMA check, fit, verdict), :mod:`.forensics_driver` (one profiled
launch per case, ``python3 -m labkernels.rounds.r06_forensics.forensics_driver``) and :mod:`.ncu_rep` (the kept
``.ncu-rep`` read back); the Nsight Compute plumbing it shares with round 7 is :mod:`labkernels.ncu`. Its gpu check step
is a record (:data:`STEP_RECORDS`)."""

from __future__ import annotations

from ... import records, records_admin
from .. import NO_PREDICTION, Step
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
    """Round 6: Nsight Compute counters per GMAC for the paired kernels (:mod:`.forensics`), with its defaults (every
    case and shape, the full metric set; ``labkernels gpu forensics`` takes the options)."""
    return forensics.gpu_check_step(out, args)


def view_verdicts(run):
    """The counter-evidence patch per shape: the EPI switch's instruction and duration changes and the rule's verdict."""
    return run.table("verdicts")


#: the round's step as a record (``gpu check --round 6 --step 1|forensics``); it reads no gpu check argument
STEP_RECORDS = (
    Step(number=1, name="forensics", series="forensics", run=step_forensics, view=view_verdicts, plan=PLAN,
         title="Nsight Compute counters per GMAC of the paired int8 kernels (generic vs expanded-B q6_K, q6_K vs "
               "q4_K at matched shapes): IMMA = MACs, the linear law of duration against warp instructions, and the "
               "EPI switch (the I2F conversions removed) as counter-evidence",
         runs=("20261130T104535Z-h200-bec343a19a", "20261130T112600Z-h200-054de65fad",
               "20261207T023136Z-h10080gbhbm3-5319d8c"), commit="5319d8c",
         prediction=f"{NO_PREDICTION}; the page's test instead: the hypothesis that the I2F conversions carry the "
                    "gap, with the seeds' rule that a change removing a hypothesized cost and not moving duration takes "
                    "the hypothesis out",
         verdict="the page's headline (run 20261207T023136Z, H100, shape 3328x4096x11008): IMMA = MACs exact on all "
                 "kernels; duration follows warp instructions (402 warp-inst/ns, r2 0.92); expanded-B issues 21.2 "
                 "warp instructions per IMMA (q4_K 26.5); the EPI switch cuts 14% of the instructions for -2.0% "
                 "duration ('supported' beyond noise), and the page reads it: the conversions hide in the issue shadow "
                 "of the rest -- the lever is fewer instructions per IMMA"),
)
#: its gpu check name (``gpu check --steps forensics``)
STEPS = {s.name: s.run for s in STEP_RECORDS}
