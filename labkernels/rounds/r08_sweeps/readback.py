"""Round 8's reading of its sweeps (``notebooks/08_dask_sweeps``): the summary run the page replays
(:func:`latest_summary`, :func:`ran_on_gpu`, :func:`sweep_report`: coverage, per-GPU timings, failures, best
variants) and the round's target, a sweep's points reproducing round 4's serial ``kdr_sweep`` runs within their noise
floor (:func:`serial_runs`, :func:`reproduction`, :func:`reproduction_check`, :func:`reproduction_groups`). The sweep
engine that records the runs (plans, Dask workers, staging, the summary's ``best_variants``) is the lab's shared
:mod:`labkernels.sweep`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ... import records
from ...recorded_tables import SUMMARY_ROUND
from ...sweep import CrossDeviceError, SweepError, sweep_points


def reproduction(points: pd.DataFrame, serial: pd.DataFrame, serial_again: pd.DataFrame | None = None) -> pd.DataFrame:
    """A sweep's points against a serial run of the same kernels (e.g. the ``sweep`` table of a recorded
    ``kdr_sweep`` run): per (kernel, od, id, nt), sweep median over pairs / serial median. This checks that
    the same kernel reproduces -- it is not an A/B ratio. With a second serial run, ``serial_ratio`` =
    serial_again / serial at the same point is the run-to-run noise floor to hold it against, and
    ``ratio_again`` = sweep / serial_again the sweep against that second run."""
    key = ["kernel", "od", "id", "nt"]
    sw = points.groupby(key + ["device"], as_index=False).median_us.median().rename(columns={"median_us": "sweep_us"})
    out = sw.merge(serial[key + ["median_us"]].rename(columns={"median_us": "serial_us"}), on=key, how="inner")
    out["ratio"] = out.sweep_us / out.serial_us
    if serial_again is not None:
        again = serial_again[key + ["median_us"]].rename(columns={"median_us": "serial_again_us"})
        out = out.merge(again, on=key, how="left")
        out["serial_ratio"] = out.serial_again_us / out.serial_us
        out["ratio_again"] = out.sweep_us / out.serial_again_us
    return out.sort_values(key).reset_index(drop=True)


#: round 4's serial runs (``labkernels gpu check --steps kdr``): table ``sweep`` with kernel, od, id, nt, median_us
SERIAL_ROUND = "kdr_sweep"


def serial_runs(points: pd.DataFrame, run_ids=(), root=None, n: int = 2) -> list:
    """The serial runs to hold a sweep's points against: the ``kdr_sweep`` runs named by ``run_ids``, else
    the ``n`` most recent ones recorded on the points' GPU model that measured at least one of the points'
    (kernel, od, id, nt). A named run on another GPU model is refused (a reproduction compares one model)."""
    root = Path(root) if root else records.data_root()
    models = set(points.gpu_name) if "gpu_name" in points else set()
    if len(models) > 1:
        raise CrossDeviceError(f"the points come from several GPU models {sorted(models)}: reproduce one at a time")
    model = next(iter(models), None)
    key = ["kernel", "od", "id", "nt"]
    want = set(map(tuple, points[key].drop_duplicates().itertuples(index=False))) if len(points) else set()
    if run_ids:
        runs = [records.load(SERIAL_ROUND, rid, root) for rid in run_ids]
        bad = [r.run_id for r in runs if r.gpu_name != model]
        if bad:
            raise CrossDeviceError(f"serial runs {bad} were not recorded on the sweep's GPU model {model!r}")
        return runs
    out = []
    for r in reversed(records.list_runs(SERIAL_ROUND, root)):
        if r.gpu_name == model and r.has("sweep"):
            got = set(map(tuple, r.table("sweep")[key].itertuples(index=False)))
            if want & got:
                out.append(r)
        if len(out) == n:
            break
    return out[::-1]


def reproduction_check(rep: pd.DataFrame) -> dict:
    """The bar of a reproduction table: the noise floor is the largest serial-to-serial deviation
    max |serial_ratio - 1|; the sweep reproduces when every sweep/serial ratio (against both serial runs)
    deviates by no more than that. Needs a table with ``serial_ratio`` (two serial runs)."""
    if rep.empty or "serial_ratio" not in rep or rep.serial_ratio.isna().all():
        raise SweepError("a reproduction check needs points matched in two serial runs (serial_ratio)")
    r = rep.dropna(subset=["serial_ratio"])
    floor = float((r.serial_ratio - 1).abs().max())
    dev = np.maximum((r.ratio - 1).abs(), (r.ratio_again - 1).abs())
    return {"points": len(r), "ratio_min": float(r.ratio.min()), "ratio_max": float(r.ratio.max()),
            "ratio_again_min": float(r.ratio_again.min()), "ratio_again_max": float(r.ratio_again.max()),
            "serial_min": float(r.serial_ratio.min()), "serial_max": float(r.serial_ratio.max()),
            "noise_floor": floor, "max_deviation": float(dev.max()), "within": int((dev <= floor).sum()),
            "met": bool((dev <= floor).all())}


def reproduction_groups(rep: pd.DataFrame, by=("family", "od", "id", "nt")) -> pd.DataFrame:
    """A reproduction table condensed per kernel family and point (over the family's variants): how many
    kernels, the range of sweep/serial ratios against each serial run and of the serial-to-serial ratios."""
    r = rep.assign(family=rep.kernel.str.split("[").str[0])
    agg = {"kernels": ("kernel", "size"), "ratio_min": ("ratio", "min"), "ratio_max": ("ratio", "max")}
    if "serial_ratio" in r:
        agg.update(ratio_again_min=("ratio_again", "min"), ratio_again_max=("ratio_again", "max"),
                   serial_ratio_min=("serial_ratio", "min"), serial_ratio_max=("serial_ratio", "max"))
    return r.groupby(list(by), as_index=False).agg(**agg)


def ran_on_gpu(summary) -> bool:
    """Whether a sweep summary run's tasks ran on GPUs (its ``tasks`` table names a GPU)."""
    t = summary.table("tasks")
    return bool("gpu_name" in t and t.gpu_name.notna().any())


def latest_summary(root=None, gpu: bool = True):
    """The most recent sweep summary run whose tasks ran on GPUs (``gpu=False``: on CPU workers only)."""
    return records.latest(SUMMARY_ROUND, root, where=lambda r: ran_on_gpu(r) == gpu)


def sweep_report(summary_run: str | None = None, root=None) -> dict:
    """What a report page shows for one sweep (default: the latest): coverage, per-GPU timings, failures,
    best variants, and the summary table itself."""
    root = Path(root) if root else records.data_root()
    run = records.load(SUMMARY_ROUND, summary_run, root) if summary_run else records.latest(SUMMARY_ROUND, root)
    if run is None:
        raise records.RecordError(f"no complete sweep summary under {root / records.folder(SUMMARY_ROUND)}")
    tasks = run.table("tasks")
    cov = (tasks.assign(n=1).pivot_table(index="kind", columns="status", values="n", aggfunc="sum", fill_value=0)
           .reindex(columns=["complete", "skipped", "failed"], fill_value=0))
    cov["planned"] = cov.sum(axis=1)
    cov["coverage"] = (cov.complete + cov.skipped) / cov.planned
    ran = tasks[tasks.status == "complete"]
    per_gpu = (ran.groupby(["device", "gpu_name"], dropna=False)
               .agg(tasks=("task_key", "size"), seconds=("seconds", "sum"), median_task_s=("seconds", "median"),
                    max_attempts=("attempts", "max")).reset_index())
    points = sweep_points(tasks, root)
    if not points.empty:
        clocks = points.groupby("device").agg(
            gpu_uuid=("gpu_uuid", "first"), points=("median_us", "size"),
            sm_clock_start_min=("sm_clock_mhz_start", "min"), sm_clock_start_max=("sm_clock_mhz_start", "max"),
            sm_clock_end_min=("sm_clock_mhz_end", "min"), sm_clock_end_max=("sm_clock_mhz_end", "max")).reset_index()
        per_gpu = per_gpu.merge(clocks, on="device", how="left")
    failures = tasks[tasks.status == "failed"][["task_key", "task", "attempts", "failed_on", "error"]].reset_index(drop=True)
    overlapped = tasks[tasks.overlaps.notna()] if "overlaps" in tasks else tasks.iloc[:0]   # "" reads back as NaN
    best = run.table("best_variants") if run.has("best_variants") else pd.DataFrame()
    return {"run_id": run.run_id, "sweep_id": run.meta["params"].get("sweep_id"), "run": run,
            "cluster": run.meta["params"].get("cluster"), "coverage": cov.reset_index(),
            "per_gpu": per_gpu, "failures": failures, "best": best, "tasks": tasks, "points": points,
            "overlapped": overlapped[["task_key", "task", "device", "overlaps"]].reset_index(drop=True),
            "retried": tasks[tasks.attempts > 1][["task_key", "task", "attempts", "status", "failed_on", "worker"]]
            .reset_index(drop=True)}
