"""Round 8 -- Dask sweeps: kernel-variant points fanned out over one worker per GPU (``notebooks/08_dask_sweeps``).
The sweep engine is the lab's shared :mod:`labkernels.sweep` (plans in ``labkernels/plans/``): ``labkernels sweep PLAN
--cluster ...`` records one ``sweep_bench`` run per bench task, a ``sweep_notebooks`` mark per notebook task and a
``sweeps`` summary run (tables ``tasks``, ``best_variants``); the page replays the latest GPU summary and compares its
points with round 4's serial ``kdr_sweep`` runs -- what it reads back is the round's own :mod:`.readback`."""

from __future__ import annotations

from ... import records, sweep
from ...kernels import registry
from . import readback

NOTEBOOK = "08_dask_sweeps"
DATA = ("sweeps", "sweep_bench")
#: the page's plan: which sweep plan a measure-mode render runs, on which cluster (its parameters cell)
PLAN = {"plan": "round4_kdr_h200", "cluster": "local-cuda", "force": False, "cpu_plan": "cpu_faults_demo",
        "summary_run": None, "serial_runs": []}
measure = None       # a sweep records its own runs (one per task, then the summary): labkernels.sweep.run_sweep
#: the page's parameters that act in some modes only (labkernels report run refuses them in the others)
PARAM_MODES = {"plan": ("measure",), "cluster": ("measure",), "force": ("measure",), "cpu_plan": ("cpu",),
               "summary_run": ("replay",)}
STEPS = {}           # the GPU run is `labkernels sweep PLAN --cluster local-cuda`, not a gpu check step



def _on_gpu(run, plan) -> bool:
    return readback.ran_on_gpu(run)


#: the page replays the latest sweep whose tasks ran on GPUs (as readback.latest_summary)
REPLAY_WHERE = {"sweeps": _on_gpu}


def local_bytes(tasks, root=None) -> dict[str, int]:
    """{kernel key: local memory bytes per thread} of every kernel the sweep's bench tasks built (their runs'
    ``kernels`` tables): a variant that spills is named as such wherever a page calls it best."""
    out: dict[str, int] = {}
    ids = {str(r).split("/", 1)[-1] for r in tasks.run_id.dropna()} if "run_id" in tasks else set()
    for r in records.list_runs(sweep.BENCH_ROUND, root):
        if r.run_id in ids and r.has("kernels"):
            k = r.table("kernels")
            if "local_bytes" not in k:          # the CPU stand-in's kernels have no registers
                continue
            for key, lb in zip(k.kernel, k.local_bytes):
                out[key] = max(out.get(key, 0), int(lb))
    return out


def best_name(family: str, variant: str, spills: dict) -> str:
    """A best-variant row as a page names it: the kernel, whether it is a registry variant (and the type's
    default), and its spills."""
    key = f"{family}[{variant}]"
    params = dict(p.split("=") for p in variant.split(","))
    params = {k: int(v) for k, v in params.items() if k != "STRIDE"}
    hit = [v for v in registry.VARIANTS.values() if v.family == family and dict(v.params) == params]
    notes = []
    if hit:
        v = hit[0]
        notes.append(v.name + ("" if v.main_path else ", off the main path"))
    lb = spills.get(key, 0)
    if lb:
        notes.append(f"spills to {lb} B of local memory per thread")
    return key + (f" ({'; '.join(notes)})" if notes else "")
