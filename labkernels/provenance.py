"""Provenance: every recorded number carries the machine, GPU, driver, clocks, commit, date and versions."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from functools import lru_cache

from . import nvml
from .nvml import gpu_available, utc_now  # noqa: F401  (defined in nvml, the lowest module that needs them)
from .paths import REPO_ROOT


def _git(*args) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit() -> dict:
    """The commit the code came from. On the GPU machine there is no .git: the run command exports
    LABKERNELS_COMMIT (and LABKERNELS_DIRTY) from the checkout that sent the tree."""
    env = os.environ.get("LABKERNELS_COMMIT")
    if env:
        return {"commit": env, "dirty": os.environ.get("LABKERNELS_DIRTY", "0") == "1", "source": "env"}
    sha = _git("rev-parse", "HEAD")
    if sha:
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        return {"commit": sha, "dirty": dirty, "source": "git"}
    return {"commit": "unknown", "dirty": None, "source": "none"}


def short_commit() -> str:
    c = commit()
    s = c["commit"][:10]
    return s + ("+dirty" if c.get("dirty") else "")


@lru_cache(maxsize=1)
def gpu_info() -> dict | None:
    """GPU identity and state at the time of the call (None without a GPU)."""
    if not gpu_available():
        return None
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    info = {
        "name": name,
        "cc": f"{props['major']}.{props['minor']}",
        "sm_count": props["multiProcessorCount"],
        "smem_per_sm": props["sharedMemPerMultiprocessor"],
        "smem_per_block_optin": props["sharedMemPerBlockOptin"],
        "regs_per_sm": props["regsPerMultiprocessor"],
        "max_threads_per_sm": props["maxThreadsPerMultiProcessor"],
        "l2_bytes": props["l2CacheSize"],
        "total_mem": props["totalGlobalMem"],
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
        "cupy": cupy.__version__,
    }
    # the driver, UUID and bus id from NVML (nvidia-ml-py); without NVML the keys are absent and "nvml" says why
    ident = nvml.identity(dev.pci_bus_id)
    if "absent" in ident:
        info["nvml"] = ident["absent"]
    else:
        info.update({k: ident[k] for k in ("driver", "uuid", "pci_bus_id") if k in ident})
    return info


def collect(params: dict | None = None) -> dict:
    """Full provenance block for a recorded run or a rendered report."""
    import numpy

    g = gpu_info()
    return {
        "date": utc_now(),
        "host": socket.gethostname(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cpus",
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        **{f"git_{k}": v for k, v in commit().items()},
        "gpu": g,
        "params": params or {},
    }


def _clock(p: dict) -> str:
    """SM clock at the start of a run (often the idle reading) and, when recorded, at its end (under load): NVML's
    readings (``nvml_start`` / ``nvml_end``), or nvidia-smi's of runs recorded before them (``smi_*``,
    ``gpu_at_finish``)."""
    s, e = p.get("nvml_start") or {}, p.get("nvml_end") or {}
    if "sm_mhz" in s:
        start, end = f"{s['sm_mhz']}/{s.get('sm_max_mhz', '?')} MHz", e.get("sm_mhz")
    else:
        g = p.get("gpu") or {}
        start = f"{g.get('smi_sm_clock_mhz', '?')}/{g.get('smi_sm_clock_max_mhz', '?')} MHz"
        end = (p.get("gpu_at_finish") or {}).get("sm_clock_mhz")
    return f"{start} at start, {end} MHz at end" if end else f"{start} at start"


def describe(p: dict) -> str:
    """One line for a page footer: GPU (or CPU), driver, clocks, commit, date."""
    g = p.get("gpu")
    dev = "no GPU (CPU machine)"
    if g:
        dev = (f"{g.get('name')} (sm_{g.get('cc', '').replace('.', '')}, {g.get('sm_count')} SMs), driver "
               f"{g.get('driver') or g.get('smi_driver', '?')}, CUDA {g.get('cuda_runtime')}, CuPy {g.get('cupy')}, "
               f"SM clock {_clock(p)}")
    c = p.get("git_commit", "unknown")
    dirty = "+dirty" if p.get("git_dirty") else ""
    return f"{dev}; host {p.get('host')}; commit {str(c)[:10]}{dirty}; {p.get('date')}"
