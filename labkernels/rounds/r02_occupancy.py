"""Round 2 -- shared memory and registers to occupancy (``notebooks/02_occupancy_calculator``): the calculator
and the ptxas audit run on the CPU; the GPU check records the CUDA occupancy API against the calculator for every
registry instantiation (``occupancy`` runs): its one step, as a record (:data:`STEP_RECORDS`)."""

from __future__ import annotations

from pathlib import Path

from .. import gpu, occupancy, records, wgmma
from ..kernels import registry
from . import NO_PREDICTION, Step

NOTEBOOK = "02_occupancy_calculator"
DATA = ()            # the page is computed on the CPU; the API cross-check's ``occupancy`` runs
                     # are under data/02_occupancy_calculator/
PLAN = {}
measure = None       # CPU page


#: what an ``occupancy`` run's params say it measured
API_CHECK = "CUDA occupancy API vs labkernels.occupancy"


def step_occupancy(out: Path, args) -> dict:
    """Record cudaOccupancyMaxActiveBlocksPerMultiprocessor vs the calculator for every instantiation."""
    run = records.new_run("occupancy", {"what": API_CHECK}, root=out / "data")
    prof = occupancy.profile("h200")
    rows, bad = [], 0

    for spec in registry.available():
        if "sm_90a" in spec.archs:     # built by nvcc for sm_90a (wgmma), not by NVRTC for the device's arch
            k = wgmma.WgKernel(spec)
            static = k.entry["static_smem"]
        else:
            k = gpu.Kernel(spec)
            static = k.static_smem
        api = k.occupancy_api()
        smem = spec.dynamic_smem() + static
        calc = occupancy.occupancy(prof, spec.threads, k.regs, smem)
        row = {"kernel": spec.key, "family": spec.family, "threads": spec.threads, "regs": k.regs,
               "local_bytes": k.local_bytes, "static_smem": static, "dynamic_smem": spec.dynamic_smem(),
               "api_blocks_per_sm": api, "calc_blocks_per_sm": calc["blocks_per_sm"],
               "calc_limiter": calc["limiter"], "occupancy": calc["occupancy"], "agree": api == calc["blocks_per_sm"]}
        bad += not row["agree"]
        rows.append(row)
    run.append("api_check", rows)
    run.finish(kernels=len(rows), disagreements=bad)
    args.log(f"occupancy API check: {len(rows)} kernels, {bad} disagreements (run {run.run_id})")
    return {"ok": bad == 0, "run": run.run_id}


def view_api_check(run):
    """Per instantiation: registers, shared memory, the API's and the calculator's blocks/SM, and whether they agree."""
    return run.table("api_check")[["kernel", "regs", "local_bytes", "static_smem", "dynamic_smem", "api_blocks_per_sm",
                                    "calc_blocks_per_sm", "calc_limiter", "agree"]]


#: the round's step as a record (``gpu check --round 2 --step 1|occupancy``)
STEP_RECORDS = (
    Step(number=1, name="occupancy", series="occupancy", what=API_CHECK, run=step_occupancy, view=view_api_check,
         title="the CUDA occupancy API (cudaOccupancyMaxActiveBlocksPerMultiprocessor) against the calculator's "
               "blocks/SM for every registry instantiation",
         runs=("20261130T103041Z-h200-f94cb78d8d", "20261130T104506Z-h200-bec343a19a"), commit="bec343a",
         prediction=NO_PREDICTION,
         verdict="the API and the calculator agree at every instantiation: 58 of 58 (run 20261130T104506Z; 46 of 46 "
                 "in run 20261130T103041Z), as the page's abstract and headline say"),
)
#: its gpu check name (``gpu check --steps occupancy``)
STEPS = {s.name: s.run for s in STEP_RECORDS}
