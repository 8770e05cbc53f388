"""Round 8 -- Dask sweeps: kernel-variant points fanned out over one worker per GPU (``notebooks/08_dask_sweeps``).
The round is :mod:`labkernels.sweep` (plans in ``labkernels/plans/``): ``labkernels sweep PLAN --cluster ...`` records
one ``sweep_bench`` run per bench task, a ``sweep_notebooks`` mark per notebook task and a ``sweeps`` summary run
(tables ``tasks``, ``best_variants``); the page replays the latest GPU summary and compares its points with round
4's serial ``kdr_sweep`` runs."""

from __future__ import annotations

NOTEBOOK = "08_dask_sweeps"
DATA = ("sweeps", "sweep_bench")
#: the page's plan: which sweep plan a measure-mode render runs, on which cluster (its parameters cell)
PLAN = {"plan": "round4_kdr_h200", "cluster": "local-cuda", "force": False, "cpu_plan": "cpu_faults_demo",
        "summary_run": None, "serial_runs": []}
measure = None       # a sweep records its own runs (one per task, then the summary): sweep.run_sweep
#: the page's parameters that act in some modes only (labkernels run refuses them in the others)
PARAM_MODES = {"plan": ("measure",), "cluster": ("measure",), "force": ("measure",), "cpu_plan": ("cpu",),
               "summary_run": ("replay",)}
STEPS = {}           # the GPU run is `labkernels sweep PLAN --cluster local-cuda`, not a gpu-check step



def _on_gpu(run, plan) -> bool:
    from ..sweep import ran_on_gpu

    return ran_on_gpu(run)


#: the page replays the latest sweep whose tasks ran on GPUs (as sweep.latest_summary)
REPLAY_WHERE = {"sweeps": _on_gpu}
