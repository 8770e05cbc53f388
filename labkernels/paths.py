"""Where things live. The repository root is found from this file, or LABKERNELS_ROOT."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = Path(os.environ.get("LABKERNELS_ROOT", PACKAGE_DIR.parent)).resolve()
DATA_DIR = REPO_ROOT / "data"
MODELS_DIR = DATA_DIR / "models"
CACHE_DIR = DATA_DIR / "cache"
REPORTS_DIR = REPO_ROOT / "reports"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
KERNELS_DIR = PACKAGE_DIR / "kernels"
PLANS_DIR = PACKAGE_DIR / "plans"          # round 8's sweep plans (YAML)


def plan_file(name: str) -> Path | None:
    """A sweep plan by name in ``labkernels/plans/`` (``round4_kdr_h200``) or a path to a YAML file; None if
    neither exists (``sweep.plan_path`` raises the sweep's error)."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    q = PLANS_DIR / f"{p.stem if p.suffix in ('.yaml', '.yml') else name}.yaml"
    return q if q.exists() else None

#: the one table of data folders: run series (the old folder names) -> the round folder its runs live in; a series
#: not listed (``prefill``, ``peers``: shared by several rounds) is its own folder
FOLDERS = {
    "occupancy": "02_occupancy_calculator",      # the CUDA occupancy API vs the calculator
    "q6k": "03_q6k_expanded_b",
    "tile_ab": "03_q6k_expanded_b",              # the tile skeleton's old vs new builds (rounds 3 and 4's shapes)
    "kdr_sweep": "04_kdr_sweep",
    "q4k": "04_kdr_sweep",
    "decompose": "05_wall_decomposition",
    "attention": "05_wall_decomposition",        # fused attention alone (issue 17), shown by round 5's page
    "forensics": "06_counter_forensics",
    "wgmma": "07_wgmma_kquant",
    "sweeps": "08_dask_sweeps",
    "sweep_bench": "08_dask_sweeps",
    "sweep_notebooks": "08_dask_sweeps",
    "decode": "09_decode",
    "nvbench_check": "09_decode",               # nvbench vs the lab's harness on the headline ratios (rounds 7 and 9)
}
#: folders that hold the runs of several rounds (see above)
SHARED = ("prefill", "peers", "gpu_suite")   # gpu_suite: the GPU test suite's runs (gpu-check's tests step), by tier
