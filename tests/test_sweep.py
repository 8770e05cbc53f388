"""Sweeps on Dask: plan validation, task keys, staging + merge, within-GPU ratios, best-variant tables, and a
LocalCluster of 2 worker processes where one worker dies mid-sweep and every task is still recorded once."""
import json
import os
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from labkernels import dispatch, records, sweep
from labkernels.kernels import registry
from labkernels.rounds.r08_sweeps import readback

CPU_BENCH = {"backend": "cpu", "family": "q6k_expb", "variants": {"KDR": [1, 4], "STRIDE": 210, "EPI": 0, "OCC": 2},
             "od": 128, "id": 512, "nt": 8, "repeats": 3, "pairs": 2}


def _plan(*bench, name="t", **kw):
    return {"name": name, "tasks": [{"bench": b} for b in bench], **kw}


# ------------------------------------------------------------------ plans


def test_plan_expands_grids_and_keys_are_canonical():
    plan = sweep.load_plan(_plan({**CPU_BENCH, "nt": [8, 16]}))
    assert len(plan.tasks) == 2 and [t.spec["nt"] for t in plan.tasks] == [8, 16]
    t = plan.tasks[0]
    assert t.spec["variants"] == [registry.find("q6k_expb", KDR=k, STRIDE=210, EPI=0, OCC=2).p for k in (1, 4)]
    # the key is a hash of the canonical description: key order in the YAML does not matter, content does
    again = sweep.load_plan(_plan(dict(reversed(list({**CPU_BENCH, "nt": [8, 16]}.items())))))
    assert [x.key for x in again.tasks] == [x.key for x in plan.tasks]
    other = sweep.load_plan(_plan({**CPU_BENCH, "repeats": 4}))
    assert other.tasks[0].key != t.key and len(t.key) == 16
    shapes = sweep.load_plan(_plan({**{k: v for k, v in CPU_BENCH.items() if k not in ("od", "id")},
                                    "shapes": [[128, 512], [256, 256]], "nt": [8, 16]}))
    assert sorted((x.spec["od"], x.spec["id"], x.spec["nt"]) for x in shapes.tasks) == \
        [(128, 512, 8), (128, 512, 16), (256, 256, 8), (256, 256, 16)]


@pytest.mark.parametrize("change, match", [
    ({"family": "q5k_magic"}, "no benchmark launcher"),
    ({"variants": {"KDR": 3, "STRIDE": 210, "EPI": 0, "OCC": 2}}, "no registered kernel q6k_expb"),
    ({"variants": {"KDR": 4}}, "no registered kernel q6k_expb"),          # incomplete parameter set
    ({"qtype": "q4_K"}, "takes q6_K weights"),
    ({"id": 500}, "multiple of 256"),
    ({"nt": 0}, "nt must be a positive integer"),
    ({"repeats": "many"}, "repeats must be a positive integer"),
    ({"backend": "tpu"}, "backend must be gpu or cpu"),
    ({"kdr": 4}, "unknown keys"),
    ({"backend": "gpu", "fault": "exit_once"}, "only the cpu stand-in takes fault injection"),
    ({"fault": "explode"}, "only the cpu stand-in takes fault injection"),
])
def test_bad_plans_are_clear_errors(change, match):
    with pytest.raises(sweep.PlanError, match=match):
        sweep.load_plan(_plan({**CPU_BENCH, **change}))


def test_bad_plan_structure_and_notebooks(tmp_path):
    for bad, match in [({"tasks": []}, "non-empty list"), ({"tasks": [{"bench": {}, "notebook": {}}]}, "each task"),
                       ({"tasks": [{"bench": CPU_BENCH}], "retries": 2}, "unknown keys"),
                       ({"tasks": [{"bench": CPU_BENCH}], "task_timeout_s": 0}, "task_timeout_s must be"),
                       ({"tasks": [{"bench": CPU_BENCH}, {"bench": CPU_BENCH}]}, "same task twice"),
                       ({"tasks": [{"notebook": {"round": "99_nothing"}}]}, "no match"),
                       ({"tasks": [{"notebook": {"round": "01", "params": {"no_such_param": 1}}}]},
                        "declares no parameter")]:
        with pytest.raises(sweep.PlanError, match=match):
            sweep.load_plan(bad)
    (tmp_path / "p.yaml").write_text("tasks: [bench: {family: q4k_nb")
    with pytest.raises(sweep.PlanError, match="not valid YAML"):
        sweep.load_plan(tmp_path / "p.yaml")
    with pytest.raises(sweep.PlanError, match="does not exist"):
        sweep.load_plan(tmp_path / "missing.yaml")


def test_cli_bad_plan_fails_before_any_cluster(tmp_path, capsys):
    from labkernels import cli

    (tmp_path / "p.yaml").write_text("tasks:\n  - bench: {family: q4k_nb, variants: {KDR: 5}, od: 128, id: 256, nt: 8}\n")
    assert cli.main(["sweep", str(tmp_path / "p.yaml"), "--cluster", "local:2", "--data", str(tmp_path)]) == 2
    assert "no registered kernel q4k_nb" in capsys.readouterr().err
    assert not any(tmp_path.rglob("*.json"))


def test_gpu_tasks_refuse_a_multi_process_local_cluster(tmp_path):
    with pytest.raises(sweep.SweepError, match="side by side on one GPU"):
        sweep.run_sweep(_plan({**CPU_BENCH, "backend": "gpu"}), "local:2", root=tmp_path, workdir=tmp_path / "w")


@pytest.mark.parametrize("cluster, match", [("local:x", "positive integer"), ("local:0", "positive integer"),
                                             ("slurm", "use local"), ("local-cuda", "local-cuda")])
def test_bad_clusters_are_clear_errors(cluster, match):
    with pytest.raises(sweep.SweepError, match=match):   # local-cuda: no dask-cuda, or no GPU, on CI machines
        sweep.open_client(cluster)


def test_overlapping_gpu_timings_are_flagged():
    tasks = {k: sweep._State(sweep.Task({"k": k, "backend": "gpu", "kind": "bench"}), status="complete",
                             result={"t_start": t0, "t_end": t1, "identity": {"device": dev}})
             for k, t0, t1, dev in [("a", 0, 10, "h/gpu0"), ("b", 5, 12, "h/gpu0"), ("c", 5, 12, "h/gpu1"),
                                    ("d", 10, 11, "h/gpu0")]}
    df = pd.DataFrame({"task_key": list(tasks)})
    assert sweep._overlaps(df, {k: st for k, st in tasks.items()}) == ["b", "a;d", "", "b"]


def test_shipped_plans_validate():
    plans = sorted((Path(sweep.__file__).parent / "plans").glob("*.yaml"))
    assert plans
    for p in plans:
        plan = sweep.load_plan(p)
        assert plan.tasks, p


# ------------------------------------------------------------------ one task, in process


def test_cpu_standin_bench_records_gates_points_and_ratios(tmp_path):
    (task,) = sweep.load_plan(_plan(CPU_BENCH)).tasks
    ident = sweep.worker_identity()
    assert ident["device"].endswith("/cpu") and ident["gpu_index"] is None
    with records.recording(sweep.BENCH_ROUND, task.spec, root=tmp_path) as run:
        rows = sweep.run_bench(task.spec, run, ident, task.key, "sw")
    par = run.table("parity")
    assert len(par) == 2 and par.ok.all() and (par.max_rel_err < 1e-3).all()
    pts = run.table("points")
    assert len(rows) == len(pts) == 2 * 2                       # variants x pairs
    assert set(pts.device) == {ident["device"]} and set(pts.task_key) == {task.key}
    assert (pts.median_us > 0).all() and np.allclose(pts.gmac, 8 * 128 * 512 / 1e9)
    rat = run.table("ratios")
    a, b = [sweep.variant_label(v) for v in task.spec["variants"]]
    ta = pts[pts.variant == a].set_index("pair").median_us
    tb = pts[pts.variant == b].set_index("pair").median_us
    assert np.allclose(rat.sort_values("pair").ratio, (ta / tb).sort_index())


def test_a_variant_failing_its_gate_records_no_timings(tmp_path, monkeypatch):
    (task,) = sweep.load_plan(_plan(CPU_BENCH)).tasks
    good = sweep._CpuStandin.output
    monkeypatch.setattr(sweep._CpuStandin, "output", lambda self, v: good(self, v) * (1.01 if v["KDR"] == 4 else 1))
    with pytest.raises(AssertionError, match=r"parity failed for q6k_expb\[KDR=4"):
        with records.recording(sweep.BENCH_ROUND, task.spec, root=tmp_path) as run:
            sweep.run_bench(task.spec, run, sweep.worker_identity(), task.key, "sw")
    assert run.meta["status"] == "failed" and not run.has("points")
    assert run.table("parity").ok.tolist() == [True, False]


def test_standin_kernel_is_the_reference_math():
    """The stand-in computes what the kernels compute (q8_1 activations x dequantized weights): it must
    fail the gate when it is wrong, so a broken stand-in cannot record timings."""
    from labkernels import cases, reference

    spec = sweep.load_plan(_plan(CPU_BENCH)).tasks[0].spec
    be = sweep._CpuStandin(spec)
    rng = np.random.default_rng(3)
    w = cases.synthetic_weights("q6_K", 128, 512, rng)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    be.prepare(w, x)
    y = be.output(spec["variants"][0])
    ref = reference.gemm_int_ref(w, "q6_K", reference.quantize_activations(x))
    assert reference.parity(y, ref)["ok"]
    assert not reference.parity(y * 1.01, ref)["ok"]
    assert np.allclose(be.output(spec["variants"][1]), y, rtol=1e-5, atol=1e-5)  # KDR changes blocking only


# ------------------------------------------------------------------ staging and merging


def _staged_result(tmp_path, key, rnd="sweep_bench", status="complete"):
    stage = tmp_path / f"worker-{key}"
    run = records.new_run(rnd, {"k": key}, root=stage / "task")
    run.append("points", {"x": 1})
    if status != "running":
        run.finish(status)
    return {"key": key, "files": sweep._collect(stage / "task", "task"), "identity": {}}, run.run_id


def test_stage_and_merge_dedupes_ids_and_refuses_bad_results(tmp_path):
    dest, work = tmp_path / "data", tmp_path / "work"
    res1, rid = _staged_result(tmp_path, "k1")
    runs1 = sweep.stage_and_merge(res1, work, dest, {"sweep_id": "s", "task_key": "k1"})
    assert runs1 == [("sweep_bench", rid, "task")]
    # a second task whose run got the same id (same second, same GPU model): renamed, not overwritten/lost
    res2 = {**res1, "key": "k2", "files": {k: v for k, v in res1["files"].items()}}
    runs2 = sweep.stage_and_merge(res2, work, dest, {"sweep_id": "s", "task_key": "k2"})
    assert runs2 == [("sweep_bench", f"{rid}-2", "task")]
    metas = {r.run_id: r for r in records.list_runs("sweep_bench", root=dest)}
    assert set(metas) == {rid, f"{rid}-2"}
    assert metas[f"{rid}-2"].table("points").x.tolist() == [1]
    assert [metas[i].provenance["sweep"]["task_key"] for i in (rid, f"{rid}-2")] == ["k1", "k2"]
    assert sweep.completed_tasks(dest) == {"k1": ("sweep_bench", rid, "s"), "k2": ("sweep_bench", f"{rid}-2", "s")}
    # a run still 'running' (a crashed recording) and a path escaping the staging folder never reach data/
    res3, _ = _staged_result(tmp_path, "k3", status="running")
    with pytest.raises(sweep.SweepError, match="only finished runs"):
        sweep.stage_and_merge(res3, work, dest, {"sweep_id": "s", "task_key": "k3"})
    with pytest.raises(sweep.SweepError, match="outside its staging folder"):
        sweep.stage_and_merge({"key": "k4", "files": {"task/../../evil.json": b"{}"}}, work, dest, {})
    assert len(list(dest.rglob("*.json"))) == 2 and not (tmp_path / "evil.json").exists()


# ------------------------------------------------------------------ ratios and best variants


def _points(rows):
    base = {"qtype": "q6_K", "family": "q6k_expb", "backend": "gpu", "gpu_name": "NVIDIA H200", "tops_eq": 1.0}
    return pd.DataFrame([{**base, "params": json.dumps({"V": r["variant"]}), "kernel": f"k[{r['variant']}]", **r}
                         for r in rows])


def _session(task, device, times, od=4096, id_=4096, nt=512, **kw):
    """One interleaved session: {variant: [median_us per pair]}."""
    return [{"task_key": task, "device": device, "variant": v, "pair": p, "median_us": t, "od": od, "id": id_,
             "nt": nt, **kw} for v, ts in times.items() for p, t in enumerate(ts)]


def test_pair_ratios_inside_one_gpu_only():
    pts = _points(_session("t1", "h/gpu0", {"a": [10, 12, 11], "b": [5, 6, 5.5]}))
    r = sweep.pair_ratios(pts, "a", "b")
    assert r.ratio.tolist() == [2.0, 2.0, 2.0] and set(r.device) == {"h/gpu0"}
    # a and b timed on two GPUs (two tasks): no ratio is formed, the call is refused
    cross = _points(_session("t1", "h/gpu0", {"a": [10, 12]}) + _session("t2", "h/gpu1", {"b": [5, 6]}))
    with pytest.raises(sweep.CrossDeviceError, match="ratios across GPUs or sessions are refused"):
        sweep.pair_ratios(cross, "a", "b")
    # same GPU but two separate sessions: not interleaved either
    with pytest.raises(sweep.CrossDeviceError):
        sweep.pair_ratios(_points(_session("t1", "h/gpu0", {"a": [10]}) + _session("t2", "h/gpu0", {"b": [5]})),
                          "a", "b")
    # a session whose rows claim two devices is corrupt
    bad = _points(_session("t1", "h/gpu0", {"a": [10]}) + _session("t1", "h/gpu1", {"b": [5]}))
    with pytest.raises(sweep.CrossDeviceError, match="has rows from devices"):
        sweep.pair_ratios(bad, "a", "b")
    # sessions on different GPUs at the same shape, each holding both variants: one ratio set per GPU
    two = _points(_session("t1", "h/gpu0", {"a": [10], "b": [5]}) + _session("t2", "h/gpu1", {"a": [9], "b": [3]}))
    assert sorted(sweep.pair_ratios(two, "a", "b").ratio) == [2.0, 3.0]


def test_best_from_points_normalizes_inside_sessions():
    # two square shapes measured on two GPUs of one model at different clocks: b wins after normalization
    pts = _points(_session("t1", "h/gpu0", {"a": [10, 10], "b": [8, 8], "c": [20, 20]}, od=4096, id_=4096)
                  + _session("t2", "h/gpu1", {"a": [100, 100], "b": [90, 90], "c": [95, 95]}, od=2048, id_=4096)
                  + _session("t3", "h/gpu1", {"a": [5, 5], "b": [6, 6]}, od=11008, id_=4096)   # tall
                  + _session("t4", "h/gpu0", {"a": [7, 7], "b": [6, 6]}, nt=4096))
    best = sweep.best_from_points(pts).set_index(["shape_class", "nt"])
    sq = best.loc[("square", 512)]
    assert sq.variant == "b" and sq.shapes == 2 and sq.runner_up == "a"
    assert sq.runner_up_score == pytest.approx(np.sqrt(10 / 8 * 100 / 90))
    assert best.loc[("tall", 512)].variant == "a" and best.loc[("square", 4096)].variant == "b"
    assert sweep.shape_class(4096, 11008) == "deep"


def _record_best(root, rows):
    with records.recording(sweep.SUMMARY_ROUND, {"sweep_id": "x"}, root=root) as run:
        run.append("tasks", [{"task_key": "k", "status": "complete"}])
        run.append("best_variants", sweep.best_from_points(_points(rows)))
    return run.run_id


def test_best_variants_loader_and_pick(tmp_path):
    import time

    assert sweep.best_variants(root=tmp_path).empty
    old = _record_best(tmp_path, _session("t1", "h/gpu0", {"a": [5], "b": [9]}, nt=512)
                       + _session("t2", "h/gpu0", {"a": [5], "b": [9]}, nt=64))
    time.sleep(1.1)  # run ids sort by second
    new = _record_best(tmp_path, _session("t3", "h/gpu0", {"a": [9], "b": [5]}, nt=512))
    df = sweep.best_variants("h200", "q6_K", root=tmp_path)
    got = df.set_index("nt")
    assert got.loc[512].variant == "b" and got.loc[512].sweep_run == new     # the latest measurement wins
    assert got.loc[64].variant == "a" and got.loc[64].sweep_run == old       # not re-measured: kept
    assert sweep.best_variants("GB10", root=tmp_path).empty
    pick = sweep.pick_variant("q6_K", 8192, 8192, 3000, "NVIDIA H200", root=tmp_path)
    assert pick == {"family": "q6k_expb", "params": {"V": "b"}, "kernel": "k[b]", "nt_measured": 512,
                    "shape_class": "square", "gpu_model": "NVIDIA H200", "sweep_run": new}
    assert sweep.pick_variant("q6_K", 4096, 4096, 70, "H200", root=tmp_path)["params"] == {"V": "a"}
    with pytest.raises(LookupError, match="no recorded best variant"):
        sweep.pick_variant("q6_K", 11008, 4096, 512, "H200", root=tmp_path)   # tall: never measured
    with pytest.raises(LookupError):
        sweep.pick_variant("q4_K", 4096, 4096, 512, "H200", root=tmp_path)


# ------------------------------------------------------------------ the sweep on a LocalCluster of 2 processes


def _recording_notebook(path: Path):
    params = nbformat.v4.new_code_cell("value = 1")
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Round x: records a run"), params,
        nbformat.v4.new_code_cell("from labkernels import records, report\nreport.resolve_mode('cpu')\n"
                                  "with records.recording('prefill', {'value': value}) as run:\n"
                                  "    run.append('t', {'doubled': value * 2})\n"
                                  "report.headline(doubled=value * 2)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


@pytest.mark.slow
def test_sweep_two_workers_with_a_killed_worker(tmp_path):
    nb = tmp_path / "99_records.ipynb"
    _recording_notebook(nb)
    std = {k: v for k, v in CPU_BENCH.items() if k != "nt"}
    plan = {"name": "cpu-test", "max_attempts": 3, "tasks": [
        {"bench": {**std, "nt": [8, 16, 24]}},
        {"bench": {**std, "nt": 32, "fault": "exit_once"}},         # its worker dies mid-sweep (os._exit)
        {"bench": {**std, "family": "q4k_nb", "variants": {"KDR": [2, 8]}, "od": 256, "id": 256, "nt": [8, 16]}},
        {"bench": {**std, "nt": 48, "fault": "raise_always"}},      # fails every attempt: marked failed
        {"notebook": {"round": str(nb), "params": {"value": 21}}},
    ]}
    data, work = tmp_path / "data", tmp_path / "work"
    res = sweep.run_sweep(plan, "local:2", root=data, workdir=work, progress=False)
    t = res["tasks"].set_index("task_key")
    keys = {x.key: x for x in sweep.load_plan(plan).tasks}
    by_fault = {x.spec.get("fault"): k for k, x in keys.items() if x.kind == "bench"}
    assert len(t) == 8 and res["failed"] == 1
    assert t.loc[by_fault["raise_always"], "status"] == "failed"
    assert t.loc[by_fault["raise_always"], "attempts"] == 3 and "injected fault" in t.loc[by_fault["raise_always"], "error"]
    assert (t.drop(by_fault["raise_always"]).status == "complete").all()
    assert t.loc[by_fault["exit_once"], "attempts"] == 2       # the start event of the attempt that died counts
    # every task recorded exactly once: one complete task run per key, none for the failed one, nothing running
    bench_runs = records.list_runs(sweep.BENCH_ROUND, root=data, status=None)
    assert all(r.meta["status"] == "complete" for r in bench_runs)
    recorded = sorted(r.provenance["sweep"]["task_key"] for r in bench_runs)
    assert recorded == sorted(k for k, x in keys.items() if x.kind == "bench" and k != by_fault["raise_always"])
    for r in bench_runs:
        sw = r.provenance["sweep"]
        assert sw["sweep_id"] == res["sweep_id"] and sw["host"] and sw["device"] == f"{sw['host']}/cpu"
        pts = r.table("points")
        assert len(pts) == 2 * 2 and set(pts.task_key) == {sw["task_key"]} and r.table("parity").ok.all()
        assert t.loc[sw["task_key"], "run_id"] == f"{sweep.BENCH_ROUND}/{r.run_id}"
    # the notebook task: its own run (completion mark) and the run the notebook recorded, both staged + merged
    nb_key = next(k for k, x in keys.items() if x.kind == "notebook")
    (mark,) = records.list_runs(sweep.NOTEBOOK_ROUND, root=data)
    assert mark.provenance["sweep"]["task_key"] == nb_key and mark.table("execution").status.tolist() == ["ok"]
    (child,) = records.list_runs("prefill", root=data)
    assert child.table("t").doubled.tolist() == [42] and child.provenance["sweep"]["role"] == "child"
    assert t.loc[nb_key, "child_runs"] == f"prefill/{child.run_id}"
    assert (work / "reports" / nb_key).exists() and not list((work / "staging").iterdir())
    # the summary run, and what a report page shows
    rep = readback.sweep_report(res["summary_run"], root=data)
    cov = rep["coverage"].set_index("kind")
    assert cov.loc["bench", "planned"] == 7 and cov.loc["bench", "failed"] == 1 and cov.loc["notebook", "complete"] == 1
    assert rep["failures"].task_key.tolist() == [by_fault["raise_always"]] and rep["overlapped"].empty
    assert rep["per_gpu"].tasks.sum() == 7 and by_fault["exit_once"] in set(rep["retried"].task_key)
    assert set(rep["best"].qtype) == {"q6_K", "q4_K"} and (rep["best"].backend == "cpu").all()
    assert not sweep.best_variants(root=data, backend="cpu").empty
    # re-running the plan (plus one task that raises once) runs only what is missing, records nothing twice;
    # with no worker dying now, the task that raised is retried on the other worker
    plan["tasks"].append({"bench": {**std, "nt": 40, "fault": "raise_once"}})
    (ro_key,) = {x.key for x in sweep.load_plan(plan).tasks} - set(keys)
    again = sweep.run_sweep(plan, "local:2", root=data, workdir=tmp_path / "work2", progress=False)
    t2 = again["tasks"].set_index("task_key")
    assert (t2.drop([by_fault["raise_always"], ro_key]).status == "skipped").all()
    assert t2.loc[by_fault["raise_always"], "status"] == "failed"
    ro = t2.loc[ro_key]
    assert ro.status == "complete" and ro.attempts == 2 and ro.failed_on and ro.worker != ro.failed_on
    assert len(records.list_runs(sweep.BENCH_ROUND, root=data, status=None)) == len(bench_runs) + 1
    assert len(records.list_runs("prefill", root=data)) == 1
    assert len(records.list_runs(sweep.SUMMARY_ROUND, root=data)) == 2


# ------------------------------------------------------------------ the GPU path's orchestration, on CPU


def test_gpu_backend_orchestration_with_the_cpu_shim(tmp_path, monkeypatch):
    """The gpu backend's Python side (weights per STRIDE, template parameters to gpu.gemm, gates before timing,
    per-point device columns) with labkernels.gpu replaced by the numpy shim (integer-reference GEMMs)."""
    from cpu_gpu_shim import fake_gemm, install

    from labkernels import bench, gpu

    install(monkeypatch)
    calls = []

    def gemm(w, a, family=None, out=None, **kw):
        calls.append((family, uploads[id(w)], tuple(sorted(kw.items()))))
        return fake_gemm(w, a, family, out, **kw)

    uploads = {}   # id(uploaded weight) -> the stride it was uploaded with

    def upload(w, q, stride=None):
        qw = real_upload(w, q, stride)
        uploads[id(qw)] = stride
        return qw

    real_upload = gpu.QWeight.upload
    monkeypatch.setattr(gpu, "gemm", gemm)
    monkeypatch.setattr(gpu.QWeight, "upload", upload)
    monkeypatch.setattr(bench, "Flusher", lambda: None)
    monkeypatch.setattr(bench, "time_launches", lambda fn, warmup, repeats, flush: (fn(), np.full(repeats, 7.0))[1])
    monkeypatch.setattr(bench, "kernel_row", lambda fam, **p: {"kernel": registry.find(fam, **p).key, "regs": 99})
    read = []
    monkeypatch.setattr(sweep.nvml, "reading", lambda bus: (read.append(bus), {"sm_mhz": 1980, "reasons": 4,
                                                                               "reasons_names": ["sw_power_cap"]})[1])
    ident = {"host": "h", "device": "h/gpu3", "gpu_index": 3, "gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-x",
             "pci_bus_id": "0000:1b:00.0", "nvml_bus_id": "0000:1b:00.0", "nvml_start": {"sm_mhz": 345}}
    spec = {**CPU_BENCH, "backend": "gpu", "variants": [{"KDR": 4, "STRIDE": 210, "EPI": 0, "OCC": 2},
                                                        {"KDR": 4, "STRIDE": 224, "EPI": 1, "OCC": 1}]}
    (task,) = sweep.load_plan(_plan(spec)).tasks
    with records.recording(sweep.BENCH_ROUND, task.spec, root=tmp_path) as run:
        sweep.run_bench(task.spec, run, ident, task.key, "sw")
    assert sorted(uploads.values()) == [210, 224]                  # one upload per block stride
    assert set(calls) == {("q6k_expb", 210, (("EPI", 0), ("KDR", 4), ("OCC", 2))),
                          ("q6k_expb", 224, (("EPI", 1), ("KDR", 4), ("OCC", 1)))}
    assert run.table("parity").ok.all() and run.table("kernels").regs.tolist() == [99, 99]
    pts = run.table("points")
    assert set(pts.device) == {"h/gpu3"} and set(pts.gpu_name) == {"NVIDIA H200"}
    assert set(pts.sm_clock_mhz_start) == {345} and set(pts.sm_clock_mhz_end) == {1980}
    assert set(pts.clocks_event_reasons_end) == {"sw_power_cap"} and read == ["0000:1b:00.0"]   # NVML, by bus id
    assert (pts.median_us == 7.0).all() and run.table("ratios").ratio.tolist() == [1.0, 1.0]


def test_reproduction_joins_serial_tables_by_registry_key():
    pts = _points(_session("t1", "h/gpu0", {"a": [10, 12, 11]}, nt=512))
    serial = pd.DataFrame([{"kernel": "k[a]", "od": 4096, "id": 4096, "nt": 512, "median_us": 10.0},
                           {"kernel": "k[a]", "od": 4096, "id": 4096, "nt": 64, "median_us": 3.0}])
    again = serial.assign(median_us=[10.5, 3.0])
    rep = readback.reproduction(pts, serial, again)
    assert len(rep) == 1 and rep.ratio.iloc[0] == pytest.approx(1.1) and rep.serial_ratio.iloc[0] == pytest.approx(1.05)
    # the recorded serial round-4 runs name kernels by the same registry keys as sweep points
    runs = records.list_runs("kdr_sweep")
    if runs:
        keys = {k.key for k in registry.KERNELS}
        assert set(runs[-1].table("sweep").kernel) <= keys


@pytest.mark.slow
def test_hung_task_is_restarted_after_the_timeout(tmp_path):
    std = {k: v for k, v in CPU_BENCH.items() if k != "nt"}
    # the timeout sits far above a healthy task's seconds: on a loaded 2-core CI machine a fresh worker's
    # imports alone took more than 3 s, and the healthy tasks were restarted as hung (CI of 2026-12-06)
    plan = {"name": "hang", "max_attempts": 2, "task_timeout_s": 20, "tasks": [
        {"bench": {**std, "nt": 8, "fault": "hang_once"}}, {"bench": {**std, "nt": [16, 24]}}]}
    logs = []
    res = sweep.run_sweep(plan, "local:2", root=tmp_path / "data", workdir=tmp_path / "w", progress=False,
                          log=logs.append)
    t = res["tasks"].set_index("task_key")
    hung = next(x.key for x in sweep.load_plan(plan).tasks if x.spec.get("fault"))
    assert (t.status == "complete").all() and t.loc[hung, "attempts"] == 2
    assert any("restarting that worker" in m for m in logs)
    assert len(records.list_runs(sweep.BENCH_ROUND, root=tmp_path / "data")) == 3


def test_auto_choice_takes_the_int8_variant_from_the_recorded_sweep():
    """dispatch.choose: the family comes from round 7's interleaved table; an int8 family's variant from the sweeps'
    best-variant table (its STRIDE left to the weight), said in the reason; without a covering row, the default."""
    import json

    import pandas as pd

    from labkernels import gpu

    table = pd.DataFrame([{"gpu_model": "NVIDIA H200", "qtype": "q6_K", "shape_class": "square", "nt": 1024,
                           "family": "q6k_expb", "kernel": "q6k_expb[KDR=2,STRIDE=210,EPI=1,OCC=1]",
                           "params": json.dumps({"KDR": 2, "STRIDE": 210, "EPI": 1, "OCC": 1}), "sweep_run": "S1"}])
    base = dispatch.Choice("q6k_expb", (("KDR", 4), ("EPI", 0), ("OCC", 2)), "rule")
    ch = dispatch._with_sweep_variant(base, "q6_K", 900, 4096, 4096, table=table)
    assert dict(ch.params) == {"KDR": 2, "EPI": 1, "OCC": 1} and "sweep S1" in ch.reason
    # another shape class, another family or qtype: nothing recorded covers it -> the default, unchanged
    assert dispatch._with_sweep_variant(base, "q6_K", 900, 11008, 4096, table=table) == base
    assert dispatch._with_sweep_variant(base, "q4_K", 900, 4096, 4096, table=table) == base
    q4 = dispatch.Choice("q4k_nb", (("KDR", 8),), "rule")
    assert dispatch._with_sweep_variant(q4, "q4_K", 900, 4096, 4096, table=table) == q4

# ------------------------------------------------------------------ the report page's logic (notebooks/08)


def _repro(ratio, serial_ratio):
    """A reproduction table with the given sweep/serial and serial again/serial ratios (serial = 100 us)."""
    r, s = np.asarray(ratio, float), np.asarray(serial_ratio, float)
    return pd.DataFrame({"kernel": [f"fam[K={i}]" for i in range(len(r))], "od": 4096, "id": 4096, "nt": 256,
                         "device": "h/gpu0", "sweep_us": 100 * r, "serial_us": 100.0, "ratio": r,
                         "serial_again_us": 100 * s, "serial_ratio": s, "ratio_again": r / s})


def test_reproduction_check_holds_the_sweep_against_the_serial_noise_floor():
    ok = readback.reproduction_check(_repro([0.99, 1.0, 1.005], [0.98, 1.0, 1.0]))
    assert ok["noise_floor"] == pytest.approx(0.02) and ok["met"] and ok["within"] == 3 and ok["points"] == 3
    assert (ok["ratio_min"], ok["ratio_max"]) == (pytest.approx(0.99), pytest.approx(1.005))
    assert ok["ratio_again_max"] == pytest.approx(0.99 / 0.98)
    # one point outside the floor against the first serial run
    bad = readback.reproduction_check(_repro([0.99, 1.03, 1.0], [0.98, 1.0, 1.0]))
    assert not bad["met"] and bad["within"] == 2 and bad["max_deviation"] == pytest.approx(0.03)
    # inside against the first run, outside against the second: not met either
    again = readback.reproduction_check(_repro([1.015, 1.0], [0.98, 1.0]))
    assert not again["met"] and again["max_deviation"] == pytest.approx(1.015 / 0.98 - 1)
    with pytest.raises(sweep.SweepError, match="two serial runs"):
        readback.reproduction_check(_repro([1.0], [1.0]).drop(columns=["serial_ratio", "ratio_again"]))
    with pytest.raises(sweep.SweepError):
        readback.reproduction_check(_repro([], []))


def test_reproduction_adds_the_ratio_against_the_second_run_and_groups_by_family():
    pts = _points(_session("t1", "h/gpu0", {"a": [10, 12, 11], "b": [20, 20, 20]}, nt=512))
    serial = pd.DataFrame([{"kernel": k, "od": 4096, "id": 4096, "nt": 512, "median_us": t}
                           for k, t in (("k[a]", 10.0), ("k[b]", 25.0))])
    rep = readback.reproduction(pts, serial, serial.assign(median_us=[11.0, 20.0]))
    assert rep.ratio_again.tolist() == pytest.approx([1.0, 1.0])
    g = readback.reproduction_groups(rep)
    assert len(g) == 1 and g.kernels.iloc[0] == 2 and g.family.iloc[0] == "k"
    assert (g.ratio_min.iloc[0], g.ratio_max.iloc[0]) == (pytest.approx(0.8), pytest.approx(1.1))
    assert (g.serial_ratio_min.iloc[0], g.serial_ratio_max.iloc[0]) == (pytest.approx(0.8), pytest.approx(1.1))


def _fake_gpu(monkeypatch):
    """records.new_run with a chosen GPU name and a date one second later on every call."""
    real, clock = records.provenance.collect, iter(range(10, 60))
    gpu = {"name": None}

    def collect(params=None):
        p = real(params)
        p["date"] = f"2026-01-01T00:00:{next(clock):02d}Z"
        p.pop("gpu", None)
        if gpu["name"]:
            p["gpu"] = {"name": gpu["name"]}
        return p

    monkeypatch.setattr(records.provenance, "collect", collect)
    return gpu


def test_serial_runs_are_the_latest_on_the_same_gpu_model_covering_the_points(tmp_path, monkeypatch):
    gpu = _fake_gpu(monkeypatch)
    pts = _points(_session("t1", "h/gpu0", {"a": [10, 11]}, nt=512))

    def serial(name, kernel="k[a]", nt=512):
        gpu["name"] = name
        with records.recording(readback.SERIAL_ROUND, {}, root=tmp_path) as run:
            run.append("sweep", {"kernel": kernel, "od": 4096, "id": 4096, "nt": nt, "median_us": 10.0})
        return run.run_id

    a = serial("NVIDIA H200")
    serial("NVIDIA GB10")                       # another GPU model: never a reference
    b = serial("NVIDIA H200")
    serial("NVIDIA H200", nt=64)                # same model, no common point
    c = serial("NVIDIA H200")
    assert [r.run_id for r in readback.serial_runs(pts, root=tmp_path)] == [b, c]
    assert [r.run_id for r in readback.serial_runs(pts, root=tmp_path, n=3)] == [a, b, c]
    assert [r.run_id for r in readback.serial_runs(pts, [c, a], root=tmp_path)] == [c, a]   # as named
    gb10 = next(r.run_id for r in records.list_runs(readback.SERIAL_ROUND, tmp_path) if "gb10" in r.run_id)
    with pytest.raises(sweep.CrossDeviceError, match="not recorded on the sweep's GPU model"):
        readback.serial_runs(pts, [a, gb10], root=tmp_path)
    with pytest.raises(records.RecordError, match="no run"):
        readback.serial_runs(pts, ["20990101T000000Z-h200-x"], root=tmp_path)
    mixed = pd.concat([pts, pts.assign(gpu_name="NVIDIA GB10")])
    with pytest.raises(sweep.CrossDeviceError, match="several GPU models"):
        readback.serial_runs(mixed, root=tmp_path)
    assert readback.serial_runs(pts.assign(gpu_name="NVIDIA A100"), root=tmp_path) == []


def test_latest_summary_tells_gpu_sweeps_from_cpu_ones(tmp_path, monkeypatch):
    _fake_gpu(monkeypatch)
    ids = {}
    for name, gpu_name in (("gpu", "NVIDIA H200"), ("cpu", None)):
        with records.recording(sweep.SUMMARY_ROUND, {"sweep_id": name}, root=tmp_path) as run:
            run.append("tasks", [{"task_key": "k", "status": "complete", "gpu_name": gpu_name}])
        ids[name] = run.run_id
    assert readback.latest_summary(tmp_path).run_id == ids["gpu"]
    assert readback.latest_summary(tmp_path, gpu=False).run_id == ids["cpu"]
    assert readback.latest_summary(tmp_path / "nothing") is None


def test_plan_path_by_name_or_file(tmp_path):
    assert sweep.plan_path("round4_kdr_h200") == sweep.PLANS_DIR / "round4_kdr_h200.yaml"
    assert sweep.plan_path("cpu_faults_demo.yaml") == sweep.PLANS_DIR / "cpu_faults_demo.yaml"
    own = tmp_path / "mine.yaml"
    own.write_text("tasks: []\n")
    assert sweep.plan_path(str(own)) == own
    with pytest.raises(sweep.PlanError, match="round4_kdr_h200"):   # the message lists the shipped plans
        sweep.plan_path("round9")


def test_cpu_faults_demo_plan_injects_one_death_and_one_permanent_failure():
    plan = sweep.load_plan(sweep.plan_path("cpu_faults_demo"))
    faults = sorted(t.spec.get("fault") or "" for t in plan.tasks)
    assert faults.count("") == len(plan.tasks) - 2 and faults[-2:] == ["exit_once", "raise_always"]
    assert plan.max_attempts == 2 and {t.spec["backend"] for t in plan.tasks} == {"cpu"}


def test_quiet_dask_silences_and_restores(monkeypatch):
    import logging
    import os

    monkeypatch.delenv("DASK_LOGGING__DISTRIBUTED", raising=False)
    lg = logging.getLogger("distributed")
    before = lg.level
    with sweep.quiet_dask():
        assert os.environ["DASK_LOGGING__DISTRIBUTED"] == "critical" and lg.level == logging.CRITICAL
    assert "DASK_LOGGING__DISTRIBUTED" not in os.environ and lg.level == before
    monkeypatch.setenv("DASK_LOGGING__DISTRIBUTED", "info")
    with pytest.raises(RuntimeError):
        with sweep.quiet_dask("error"):
            raise RuntimeError
    assert os.environ["DASK_LOGGING__DISTRIBUTED"] == "info" and lg.level == before


def test_recorded_h200_sweep_reproduces_the_serial_round4_runs():
    """The issue's bar on the recorded data: the local-cuda sweep of round-4 points against the two serial
    round-4 runs of the same GPU model, within their run-to-run noise floor."""
    summ = readback.latest_summary()
    if summ is None:
        pytest.skip("no GPU sweep recorded under data/08_dask_sweeps/")
    rep = readback.sweep_report(summ.run_id)
    pts = rep["points"]
    serial = readback.serial_runs(pts)
    if len(serial) < 2:
        pytest.skip("fewer than two serial round-4 runs on the sweep's GPU model")
    repro = readback.reproduction(pts, serial[0].table("sweep"), serial[1].table("sweep"))
    check = readback.reproduction_check(repro)
    assert check["points"] == len(pts.groupby(["kernel", "od", "id", "nt"])) and check["met"], check
    assert set(pts.gpu_name) == {_gpu_of(serial[0])} == {_gpu_of(serial[1])}
    # every point carries its GPU's clocks, shown per device
    g = rep["per_gpu"]
    assert g.points.sum() == len(pts) and g.sm_clock_end_min.notna().all() and g.gpu_uuid.notna().all()
    cov = rep["coverage"].set_index("kind")
    assert cov.planned.sum() == len(rep["tasks"]) and set(rep["best"].qtype) <= {"q4_K", "q6_K"}


def _gpu_of(run):
    return run.provenance["gpu"]["name"]


def test_auto_choice_says_when_the_sweep_table_cannot_be_read():
    """A broken best-variant table (a missing column) is not silently treated as 'nothing recorded'."""
    import pandas as pd

    from labkernels import gpu

    base = dispatch.Choice("q6k_expb", (("KDR", 4),), "rule")
    broken = pd.DataFrame([{"gpu_model": "NVIDIA H200", "qtype": "q6_K", "family": "q6k_expb", "nt": 1024}])
    ch = dispatch._with_sweep_variant(base, "q6_K", 900, 4096, 4096, table=broken)
    assert ch.params == base.params and "sweep best-variant table not used (" in ch.reason


def test_local_scheduler_retries_without_work_stealing():
    # a retry is restricted (loosely) to the workers it has not failed on; the stealing extension would hand
    # such a task to any idle worker, the one it just failed on included -- so the local scheduler has none,
    # and keeps the allowed-failures setting it was opened with
    client, cl, _ = sweep.open_client("local:1", max_attempts=4)
    try:
        ext, fails = client.run_on_scheduler(
            lambda dask_scheduler: (sorted(dask_scheduler.extensions), dask_scheduler.allowed_failures))
        assert "stealing" not in ext and fails == 3
    finally:
        client.close()
        cl.close()


@pytest.mark.slow
def test_cpu_standin_sweep_command_records_nothing_in_data(tmp_path):
    """`labkernels sweep labkernels/plans/cpu_standin_example.yaml --cluster local:2` (the README's CPU example):
    its runs go to a scratch folder under reports/scratch/, and it says so; data/, the README and
    reports/index.json stay byte-identical, and no staging folder is left in the temporary directory."""
    import glob
    import subprocess
    import sys
    import tempfile

    from labkernels.paths import REPO_ROOT, REPORTS_DIR

    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from test_reports import tree_digest

    index = REPORTS_DIR / "index.json"
    before = (tree_digest(REPO_ROOT / "data"), (REPO_ROOT / "README.md").read_bytes(),
              index.read_bytes() if index.exists() else None)
    tmp_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "labkernels-sweep-[0-9]*-*")))
    env = {k: v for k, v in os.environ.items() if k != "LABKERNELS_DATA_DIR"}
    r = subprocess.run([sys.executable, "-m", "labkernels", "sweep", "labkernels/plans/cpu_standin_example.yaml",
                        "--cluster", "local:2", "--no-progress"], cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CPU stand-in" in r.stdout and "not to data/" in r.stdout
    after = (tree_digest(REPO_ROOT / "data"), (REPO_ROOT / "README.md").read_bytes(),
             index.read_bytes() if index.exists() else None)
    assert after == before
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "labkernels-sweep-[0-9]*-*"))) <= tmp_before
    scratch = r.stdout.split("scratch folder ", 1)[1].split(" and not", 1)[0]
    assert len(records.list_runs(sweep.SUMMARY_ROUND, root=Path(scratch) / "data")) == 1


def test_a_sweep_that_runs_nothing_records_nothing(tmp_path, monkeypatch):
    """Every task recorded already: no cluster, no summary run, nothing written under the data root."""
    plan = sweep.load_plan(_plan(CPU_BENCH))
    monkeypatch.setattr(sweep, "completed_tasks", lambda root: {t.key: (sweep.BENCH_ROUND, "r", "s") for t in plan.tasks})
    monkeypatch.setattr(sweep, "open_client", lambda *a, **k: pytest.fail("a cluster was started"))
    logs = []
    res = sweep.run_sweep(plan, "local:1", root=tmp_path / "data", workdir=tmp_path / "w", progress=False,
                          log=logs.append)
    assert res["summary_run"] is None and (res["tasks"].status == "skipped").all()
    assert not (tmp_path / "data").exists() or not list((tmp_path / "data").rglob("*"))
    assert "no summary recorded" in logs[-1]


def test_gpu_tasks_on_a_machine_without_a_gpu_are_refused_before_anything_runs(tmp_path, monkeypatch):
    from labkernels import provenance

    monkeypatch.setattr(provenance, "gpu_available", lambda: False)
    monkeypatch.setattr(sweep, "open_client", lambda *a, **k: pytest.fail("a cluster was started"))
    with pytest.raises(sweep.SweepError, match="no CUDA GPU.*nothing was run or recorded"):
        sweep.run_sweep(_plan({**CPU_BENCH, "backend": "gpu"}), "local:1", root=tmp_path / "data",
                        workdir=tmp_path / "w", progress=False)
    assert not (tmp_path / "data").exists()


def test_stand_in_plans_are_told_from_plans_that_record():
    assert sweep.stand_in(sweep.load_plan(sweep.plan_path("cpu_standin_example")))
    assert sweep.stand_in(sweep.load_plan(sweep.plan_path("cpu_faults_demo")))
    assert not sweep.stand_in(sweep.load_plan(sweep.plan_path("round4_kdr_h200")))
    assert not sweep.stand_in(sweep.load_plan(_plan({**CPU_BENCH, "backend": "gpu"})))


def test_a_dead_workers_staging_folder_is_removed_a_live_ones_kept(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()                                                   # a pid that has exited
    dead = tmp_path / f"{sweep.STAGING_PREFIX}{p.pid}-abc-x1"
    live = tmp_path / f"{sweep.STAGING_PREFIX}{os.getppid()}-abc-x2"
    other = tmp_path / f"{sweep.STAGING_PREFIX}abc-x3"         # not a worker's (no pid): left alone
    for d in (dead, live, other):
        d.mkdir()
    sweep._remove_stale_staging()
    assert not dead.exists() and live.exists() and other.exists()
