"""Round 2 -- shared memory and registers to occupancy (``notebooks/02_occupancy_calculator``): the calculator
and the ptxas audit run on the CPU; the GPU check records the CUDA occupancy API against the calculator for every
registry instantiation (``occupancy`` runs)."""

from __future__ import annotations

from pathlib import Path

from .. import gpu, occupancy, records, wgmma
from ..kernels import registry

NOTEBOOK = "02_occupancy_calculator"
DATA = ()            # the page is computed on the CPU; the API cross-check's ``occupancy`` runs
                     # are under data/02_occupancy_calculator/
PLAN = {}
measure = None       # CPU page


def step_occupancy(out: Path, args) -> dict:
    """Record cudaOccupancyMaxActiveBlocksPerMultiprocessor vs the calculator for every instantiation."""
    run = records.new_run("occupancy", {"what": "CUDA occupancy API vs labkernels.occupancy"}, root=out / "data")
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


STEPS = {"occupancy": step_occupancy}
