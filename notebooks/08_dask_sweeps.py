# %% [markdown]
# # Round 8 — Dask sweeps: kernel-variant points fanned out over one worker per GPU, recorded like every run

# %% tags=["parameters"]
mode: "OneOf[auto, measure, replay, cpu]" = "auto"   # replay (recorded sweep) | measure (run plan on cluster) | cpu (stand-in sweep, faults) | auto
plan: "Known[sweep_plans]" = "round4_kdr_h200"   # measure mode: a plan in labkernels/plans/ or a YAML path
cluster: "Cluster" = "local-cuda"   # measure mode: local-cuda[:N] (one worker per GPU) | tcp://HOST:PORT
force = False               # measure mode: run the plan's tasks already recorded again (else they are skipped)
cpu_plan: "Known[sweep_plans]" = "cpu_faults_demo"   # cpu mode: stand-in plan run on a LocalCluster of 2 processes (temporary data root)
summary_run: "Optional[RunId]" = None   # replay: the sweeps run shown (default: the latest GPU sweep)
serial_runs: "List[RunId]" = []   # kdr_sweep run ids to reproduce (default: the two latest on the sweep's GPU model)

# %%
import shutil, tempfile
from pathlib import Path
import numpy as np, pandas as pd, matplotlib.pyplot as plt
from IPython.display import HTML
from matplotlib.patches import Patch
from labkernels import report, records, plotting, sweep
from labkernels.rounds.r08_sweeps import readback
report.setup()
mode = report.resolve_mode(mode, sweep.SUMMARY_ROUND if mode != "cpu" else None)
logs = []     # the sweep's own log lines (sweep id, dashboard address, totals), shown under the banner
root = None   # data/ (replay, measure); a temporary folder in cpu mode: a stand-in render records nothing in data/
if mode == "measure":
    with sweep.quiet_dask():   # faults show in the tables below, not as worker log lines
        res = sweep.run_sweep(sweep.plan_path(plan), cluster=cluster, force=force, progress=False, log=logs.append)
    summary_run = res["summary_run"]
elif mode == "cpu":
    root = report.temp_dir("lk-sweep-page-") / "data"   # removed when the page ends, even if it fails
    with sweep.quiet_dask():
        res = sweep.run_sweep(sweep.plan_path(cpu_plan), cluster="local:2", root=root, workdir=root.parent / "work",
                              progress=False, log=logs.append)
    summary_run = res["summary_run"]
elif summary_run is None:
    latest = readback.latest_summary()
    if latest is None:
        raise report.ModeError("no GPU sweep summary under data/08_dask_sweeps/: run `labkernels sweep PLAN --cluster "
                               "local-cuda` on a GPU machine, or render this page with -p mode=cpu")
    summary_run = latest.run_id
rep = readback.sweep_report(summary_run, root=root)
run, tasks, points = rep["run"], rep["tasks"], rep["points"]
report.banner(mode, run, f"Sweep {rep['sweep_id']} on cluster {rep['cluster']}.", stand_in=(mode == "cpu"))
report.lead()        # the abstract, headline and result figure: filled in where they are computed
if logs:
    print("\n".join(logs))

# %% [markdown]
# ## Method
#
# A kernel lab's heavy work is sweeps (round 4: KDR x epilogue x occupancy x nt; round 7: tiles, stages,
# schedulers). `labkernels sweep PLAN.yaml --cluster local[:N] | local-cuda[:N] | tcp://ADDRESS` runs a plan's tasks
# on Dask distributed: dask-cuda's `LocalCUDACluster` (one worker per GPU, pinned by `CUDA_VISIBLE_DEVICES`, one
# thread, so two timings never share a GPU), a `LocalCluster` of processes on a CPU machine, or a scheduler address.
# Each *bench* task parity-gates every variant of one point (qtype, od, id, nt) against the exact references and
# times them in interleaved pairs on its GPU; each task records a run under `data/08_dask_sweeps/` (series
# `sweep_bench`) through the same validated import as a single-GPU run (provenance: sweep id, host, GPU index / UUID
# / clocks). A task that raises is retried on another worker, a dead worker's task is rescheduled, both up to the
# plan's attempt limit; re-running a plan skips the task keys already recorded. The sweep ends with a summary run
# beside them (series `sweeps`, tables `tasks` and `best_variants`).
#
# This page shows one sweep: **coverage**, **per-GPU timings**, **failures and retries**, the **best variant** per
# (GPU model, qtype, shape class, nt), and the round's target — **an H200 sweep of round-4 points through `local-cuda`
# reproduces the serial numbers within the noise floor**: each point's sweep median against the same kernel at the
# same shape in two serial round-4 runs (`kdr_sweep` runs in `data/04_kdr_sweep/`), whose disagreement with each
# other is the noise floor. Logic: `labkernels/sweep.py` (the sweep engine; plans in `labkernels/plans/`) and
# `labkernels/rounds/r08_sweeps/readback.py` (what this page reads back), tests `tests/test_sweep.py`.

# %% [markdown]
# ## Coverage: every planned task recorded once, skipped (recorded by an earlier sweep) or failed

# %%
display(report.table(rep["coverage"], percent=["coverage"],
                     caption=f"Tasks of plan {run.meta['params']['plan']!r} by kind and status (summary run {run.run_id})"))
display(report.table(tasks[["task_key", "task", "status", "attempts", "device", "seconds", "run_id"]],
                     caption="The summary table: one row per task (run_id = the task's recorded run under data/)"))

# %% [markdown]
# ## Per-GPU timings
#
# One row per device that ran tasks: how many, their wall time (parity gates, warm-up and the interleaved timed
# pairs), and the SM clock that `nvidia-smi` reported for that GPU at the start and end of each task — every
# point carries its own GPU's clocks, and ratios are only formed inside one task's pairs on one GPU.

# %%
display(report.table(rep["per_gpu"], caption="Per device: tasks, wall seconds, attempts, points timed, SM clock (MHz) "
                                             "at task start / end (min-max over tasks)"))
ran = tasks[tasks.status != "failed"]
devices = list(dict.fromkeys(ran.device.dropna()))
cols = dict(zip(devices, plotting.colors(devices)))
ordered = tasks.iloc[::-1]
fig, ax = plt.subplots(figsize=(11, 0.35 * len(tasks) + 1.6))
ax.barh(ordered.task, ordered.seconds.fillna(0), color=[cols.get(d, "#c0392b") for d in ordered.device])
for y, r in enumerate(ordered.itertuples()):
    if r.status == "failed":
        ax.text(0, y, f"  failed after {r.attempts} attempts: no record", va="center", fontsize=8, color="#c0392b")
ax.legend(handles=[Patch(color=cols[d], label=d) for d in devices], fontsize=8, loc="lower right")
ax.set_xlabel("task wall time on its worker (s)")
ax.set_title(f"Sweep {rep['sweep_id']}: wall time per task, coloured by device\n(summary: {report.source(rep['run'])})",
             fontsize=10)
ax.grid(axis="x", alpha=.3)
plt.show()
fig_tasks = fig         # the result figure of a sweep without a reproduction check (a stand-in sweep)

# %% [markdown]
# ## Failures and retries
#
# A task that raised is resubmitted on another worker; a worker that died has its task rescheduled by Dask;
# `attempts` counts every start. A task still failing at the attempt limit is marked failed and nothing of it
# reaches `data/`. (`-p mode=cpu` renders this page from a live stand-in sweep on 2 worker processes in which
# one task kills its worker once and one raises on every attempt.)

# %%
if rep["failures"].empty and rep["retried"].empty:
    print(f"No task failed or needed a second attempt in sweep {rep['sweep_id']} "
          f"({len(tasks)} tasks, at most {int(tasks.attempts.max())} attempt each).")
if not rep["retried"].empty:
    display(report.table(rep["retried"], caption="Tasks that took more than one attempt (failed_on: the workers where "
                                                 "it raised; a worker that died is not named: Dask rescheduled the task)"))
if not rep["failures"].empty:
    display(report.table(rep["failures"], caption="Failed tasks: no run recorded"))
if not rep["overlapped"].empty:
    display(report.table(rep["overlapped"], caption="GPU tasks that overlapped on one device (timings suspect)"))

# %% [markdown]
# ## Best variant per (GPU model, qtype, shape class, nt)
#
# Each variant's median time is normalized inside its own timing session (by the session's fastest variant),
# then scored by the geometric mean over the shapes of the class; `score` 1.00 is the winner, `runner_up_score`
# how much slower the next one is. This recorded table is what the GEMM entry's `auto` choice reads
# (`sweep.best_variants` / `sweep.pick_variant`).

# %%
best = rep["best"]
if best.empty:
    print("No bench task completed: no best-variant table.")
else:
    display(report.table(best[["gpu_model", "qtype", "shape_class", "nt", "family", "variant", "shapes", "score",
                               "runner_up", "runner_up_score", "median_us", "tops_eq", "backend"]],
                         caption="Best variants from within-GPU interleaved timings (median_us, tops_eq of the winner)"))

# %% [markdown]
# ## The target: the sweep reproduces the serial round-4 numbers within the noise floor
#
# For every (kernel, od, id, nt) the sweep measured and round 4's serial sweep measured too: `ratio` = sweep
# median / serial median, `ratio_again` = the same against the second serial run, `serial_ratio` = second
# serial / first serial — the run-to-run noise floor. Target: every sweep ratio (against either serial run) deviates
# from 1 by no more than the largest serial-to-serial deviation.

# %%
serial = readback.serial_runs(points, serial_runs, root=root) if not points.empty else []
check = None
if len(serial) < 2:
    print(f"No two serial round-4 runs on {sorted(set(points.get('gpu_name', [])))} to reproduce against "
          f"(found {[r.run_id for r in serial]}): the reproduction check needs a GPU sweep of round-4 points.")
else:
    s1, s2 = serial[0], serial[1]
    repro = readback.reproduction(points, s1.table("sweep"), s2.table("sweep"))
    check = readback.reproduction_check(repro)
    display(report.kv_table({
        "serial run (reference)": s1.run_id, "serial run again": s2.run_id, "points matched": check["points"],
        "sweep / serial": f"{check['ratio_min']:.4f} - {check['ratio_max']:.4f}",
        "sweep / serial again": f"{check['ratio_again_min']:.4f} - {check['ratio_again_max']:.4f}",
        "serial again / serial (noise)": f"{check['serial_min']:.4f} - {check['serial_max']:.4f}",
        "noise floor max |serial again / serial - 1|": f"{check['noise_floor']:.4f}",
        "largest sweep deviation |sweep / serial - 1|": f"{check['max_deviation']:.4f}",
        "points within the noise floor": f"{check['within']} of {check['points']}",
        "target": "met" if check["met"] else "not met"},
        caption="Reproduction: sweep vs serial, and serial vs serial (the noise floor)"))
    ratio_fmt = {c: "{:.4f}" for c in repro.columns if "ratio" in c}
    display(report.table(readback.reproduction_groups(repro), {c: "{:.4f}" for c in ("ratio_min", "ratio_max",
            "ratio_again_min", "ratio_again_max", "serial_ratio_min", "serial_ratio_max")},
                         caption="Per family and point: ratio ranges over the family's variants"))
    display(HTML("<details><summary>every point (kernel, shape, nt): medians in µs and ratios</summary>"
                 + report.table(repro, ratio_fmt).to_html() + "</details>"))
    fig, ax = plt.subplots(figsize=(11, 6))
    f = check["noise_floor"]
    ax.axhspan(1 - f, 1 + f, color="0.85", label=f"noise floor: 1 ± max|serial again / serial − 1| = 1 ± {f:.3f}")
    for fam, g in repro.assign(family=repro.kernel.str.split("[").str[0]).groupby("family"):
        ax.scatter(g.serial_us, g.ratio, s=28, color=plotting.color(fam), label=f"{fam}: sweep / serial {s1.run_id[:16]}")
        ax.scatter(g.serial_us, g.ratio_again, s=28, marker="^", facecolors="none", edgecolors=plotting.color(fam),
                   label=f"{fam}: sweep / serial {s2.run_id[:16]}")
    ax.scatter(repro.serial_us, repro.serial_ratio, s=22, marker="x", color="0.35", label="serial again / serial")
    ax.axhline(1, color="k", lw=.8)
    ax.set_xscale("log")
    ax.set_xlabel("serial median time of the point (µs, log scale)")
    ax.set_ylabel("time ratio at the same kernel, shape and nt")
    ax.set_title(f"{len(repro)} round-4 points on the {points.gpu_name.iloc[0]}: sweep ({rep['cluster']}) vs two "
                 f"serial runs\n(summary: {report.source(rep['run'])})", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)
    ax.grid(alpha=.3)
    report.lead_figure(fig, f"Each round-4 point's sweep median against the same kernel, shape and nt in two serial "
                            f"round-4 runs (time ratios; 1 = the same), and the serial runs against each other: the "
                            f"grey band is their noise floor ({report.source(rep['run'])})")
if check is None:
    report.lead_figure(fig_tasks, f"Wall time of each task of the sweep on its worker (s), coloured by device "
                                  f"({report.source(rep['run'])})")

# %%
n = {s: int((tasks.status == s).sum()) for s in ("complete", "skipped", "failed")}
ndev = int(tasks.device.nunique())
head = {"tasks complete / skipped / failed": f"{n['complete']} / {n['skipped']} / {n['failed']} of {len(tasks)} "
                                             f"on {ndev} device{'s' if ndev != 1 else ''} ({rep['cluster']})"}
if check is not None:
    head["sweep / serial (%d points)" % check["points"]] = (
        f"{check['ratio_min']:.3f}-{check['ratio_max']:.3f} (vs 2nd serial {check['ratio_again_min']:.3f}-"
        f"{check['ratio_again_max']:.3f}); serial / serial {check['serial_min']:.3f}-{check['serial_max']:.3f}")
    from labkernels import facts
    head["target"] = facts.TARGETS["sweep"].text(check["met"]) + f" (noise floor ±{check['noise_floor']:.3f})"
from labkernels.rounds import r08_sweeps
spills = r08_sweeps.local_bytes(tasks, root)
if not best.empty:
    top = best[best.nt == best.nt.max()]
    head[f"best at nt={int(best.nt.max())}"] = "; ".join(f"{r.qtype} {r.shape_class} "
                                                         f"{r08_sweeps.best_name(r.family, r.variant, spills)}"
                                                         for r in top.itertuples())
spilled = sorted({f"{r.family}[{r.variant}]" for r in best.itertuples() if spills.get(f"{r.family}[{r.variant}]")}) \
    if not best.empty else []
if mode == "cpu":
    report.abstract(
        f"Round 8 runs kernel-variant sweeps as Dask tasks, one worker per GPU, each task parity-gated, timed in "
        f"interleaved pairs on its own device and recorded like any run, with retries for tasks that fail and "
        f"workers that die. This page is a stand-in: the numpy kernel on CPU worker processes ({rep['cluster']}), "
        f"one task killing its worker once and one failing every attempt "
        f"({n['complete']} of {len(tasks)} tasks complete, {n['failed']} failed). Nothing of it is the record: the "
        f"published page replays the GPU sweep.")
else:
    report.abstract(
        f"Round 8 runs kernel-variant sweeps as Dask tasks, one worker per GPU, each task parity-gated, timed in "
        f"interleaved pairs on its own device and recorded like any run, with retries for tasks that fail and "
        f"workers that die. "
        + (f"The {points.gpu_name.iloc[0]} sweep of {check['points']} round-4 points reproduces the serial round-4 "
           f"runs: every sweep / serial time ratio lies in {check['ratio_min']:.3f}-{check['ratio_max']:.3f}, "
           f"{'inside' if check['met'] else 'not inside'} the serial runs' own noise floor of "
           f"±{check['noise_floor']:.3f}. " if check is not None else
           f"This sweep completed {n['complete']} of {len(tasks)} tasks. ")
        + ("Its best-variant table is what the GEMM entry's auto choice reads for the int8 families"
           + (f"; its fastest q6_K point ({', '.join(spilled)}) is a build that spills to local memory, not "
              f"the registry's default." if spilled else ".")))
report.headline(**head)

# %%
report.footer(run.provenance)
if mode == "cpu":
    shutil.rmtree(root.parent, ignore_errors=True)   # the stand-in sweep's temporary data root
