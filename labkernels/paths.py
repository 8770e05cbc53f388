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


def read_small_file(path, error, what: str = "file", limit: int = 64 << 20, binary: bool = False):
    """The contents of a small input file (a README, an index, a parameters or plan YAML, a device profile table),
    or ``error`` naming the path and what is wrong: opened without blocking and checked with fstat before any read --
    a FIFO (which would block for ever), a device such as /dev/zero (endless bytes), a directory, an empty file (the
    /proc files that block or fail when read report size 0) or one over ``limit`` bytes is refused; text must be
    UTF-8."""
    import stat

    p = Path(path)
    if not str(path).strip():
        raise error(f"{what} path is empty")
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{what} {p}: no such file") from None
    except OSError as e:
        raise error(f"{what} {p}: cannot open ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{what} {p}: is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {p}: not a regular file (a FIFO, a device or a socket: it could block or never end)")
        if st.st_size == 0:
            raise error(f"{what} {p}: is empty")
        if st.st_size > limit:
            raise error(f"{what} {p}: {st.st_size} bytes, more than the {limit} a {what} may hold")
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(limit + 1)
        except OSError as e:
            raise error(f"{what} {p}: cannot read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{what} {p}: more than {limit} bytes (it grew while read)")
    if binary:
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {p}: not UTF-8 text ({e})") from None
