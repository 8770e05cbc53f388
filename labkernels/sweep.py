"""Sweeps on Dask distributed: ``labkernels sweep PLAN.yaml --cluster local[:N] | local-cuda | tcp://ADDRESS``.

A *plan* (YAML) names tasks of two kinds:

* ``bench``: one benchmark point -- (qtype, od, id, nt) and a list of registry variants of one kernel
  family, parity-gated then timed in *interleaved pairs* on one GPU (A, B, C, A, B, C, ...), so every
  A/B ratio is formed inside one GPU's pairs. ``backend: cpu`` runs the same path with a numpy stand-in
  kernel (blocked q8_1 x dequantized-weights GEMM, KDR super-blocks per step) for CPU machines and tests;
* ``notebook``: one round notebook executed with one parameter set (``labkernels report run`` semantics); the runs
  it records land in ``data/`` like a single-GPU run.

Each task runs on a Dask worker (``local-cuda``: dask-cuda's LocalCUDACluster, one worker per GPU pinned by
CUDA_VISIBLE_DEVICES, one thread; ``local[:N]``: a LocalCluster of N processes, one thread each; or a
scheduler address). The worker records into a private staging folder and sends the files back; the client
writes them to ``<workdir>/staging/<key>.part``, adds the sweep provenance (sweep id, task key, host, GPU
index / UUID / clocks of that worker), renames the folder into place and imports it into ``data/`` through
:func:`merge_into_data` -- nothing half-written reaches ``data/``. A task is identified by its *key*, a hash of
its canonical description; a key already recorded by a complete run is skipped, so re-running a plan only
runs what is missing. A task that raises is resubmitted on another worker, a worker that dies has its task
rescheduled by Dask (``distributed.scheduler.allowed-failures``), both up to ``max_attempts`` attempts in
all (counted from the workers' start events), then the task is marked failed; with ``task_timeout_s`` an
attempt running longer has its worker restarted (a hung kernel counts as a death).

A plan (examples in ``labkernels/plans/``)::

    name: round4-kdr
    max_attempts: 2              # attempts per task in all (default 3)
    task_timeout_s: 600          # optional
    defaults: {backend: gpu, repeats: 10, warmup: 2, pairs: 3}
    tasks:
      - bench: {family: q4k_nb, variants: {KDR: [2, 4, 8]}, od: 4096, id: 4096, nt: [256, 4096]}
      - notebook: {round: 04_kdr_sweep, params: {mode: measure}}

Records: bench tasks are runs of round ``sweep_bench`` (tables ``points``, ``parity``, ``kernels``,
``ratios``), notebook tasks a run of ``sweep_notebooks`` (table ``execution``) plus the runs the notebook
records itself, the summary a run of ``sweeps``; each carries ``provenance.sweep``.

At the end the sweep records a summary run (round ``sweeps``: table ``tasks`` with key, status, attempts,
worker, GPU, duration, run id; table ``best_variants``: per GPU model, qtype, shape class and nt, the fastest
variant, from within-GPU interleaved timings). :func:`best_variants` / :func:`pick_variant` read those tables
back (the GEMM entry point's ``auto`` choice). What round 8's page reads back (the summary it replays, the
reproduction against round 4's serial runs) is the round's own: :mod:`labkernels.rounds.r08_sweeps.readback`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import bench, cases, gpu, nvml, paths, pipeline, provenance, quants, records, records_admin, reference, rounds
from .paths import PLANS_DIR, REPORTS_DIR
from .kernels import registry
from .recorded_tables import SUMMARY_ROUND, best_variants, pick_variant, shape_class  # noqa: F401

#: rounds (data/<round>/) written by sweeps
BENCH_ROUND = "sweep_bench"
NOTEBOOK_ROUND = "sweep_notebooks"
EVENT_TOPIC = "labkernels-sweep"

#: GEMM families a bench task can time (the int8 families of the registry's named variants), with their weight type
FAMILY_QTYPE = {v.family: v.qtype for v in registry.VARIANTS.values()}
BENCH_KEYS = {"backend", "family", "qtype", "variants", "od", "id", "shapes", "nt", "repeats", "pairs", "warmup",
              "seed", "fault"}
NOTEBOOK_KEYS = {"round", "params"}
PLAN_KEYS = {"name", "max_attempts", "defaults", "tasks", "task_timeout_s"}
FAULTS = ("exit_once", "raise_once", "raise_always", "hang_once")  # stand-in fault injection (tests of the retry path)


class PlanError(ValueError):
    """A plan that cannot run: reported before anything is submitted."""


class SweepError(RuntimeError):
    pass


class CrossDeviceError(SweepError):
    """A ratio asked across two GPUs (or two separate timing sessions): refused."""


class TaskFailure(RuntimeError):
    """A task that raised on a worker; carries the worker so the retry goes elsewhere."""

    def __init__(self, message: str, worker: str | None = None):
        super().__init__(message, worker)
        self.worker = worker

    def __str__(self) -> str:
        return f"{self.args[0]} (on worker {self.worker})"


# ------------------------------------------------------------------ plans and tasks


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Task:
    spec: dict = field(hash=False)

    @property
    def key(self) -> str:
        """Hash of the task's canonical description: the same task in any plan has the same key."""
        return hashlib.sha256(canonical(self.spec).encode()).hexdigest()[:16]

    @property
    def kind(self) -> str:
        return self.spec["kind"]

    @property
    def label(self) -> str:
        s = self.spec
        if s["kind"] == "bench":
            return (f"{s['family']} {s['qtype']} {s['od']}x{s['id']} nt={s['nt']} ({len(s['variants'])} variants, "
                    f"{s['backend']})")
        return f"notebook {s['notebook']} {canonical(s['params'])}"


@dataclass
class Plan:
    name: str
    tasks: list
    max_attempts: int = 3
    task_timeout_s: float | None = None   # a task running longer has its worker restarted (counts as a death)

    @property
    def digest(self) -> str:
        return hashlib.sha256(canonical(sorted(t.key for t in self.tasks)).encode()).hexdigest()[:8]


def _as_list(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _pos_int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise PlanError(f"{what} must be a positive integer, got {v!r}")
    return v


def expand_variants(family: str, variants) -> list[dict]:
    """Variant parameter sets of a family: a mapping whose list values form a grid, or a list of mappings.
    Every set must name a registered instantiation (all of its template parameters)."""
    if family not in FAMILY_QTYPE:
        known = sorted({k.family for k in registry.KERNELS})
        raise PlanError(f"family {family!r} has no benchmark launcher; timed families: {sorted(FAMILY_QTYPE)} "
                        f"(registered: {known})")
    out = []
    for v in _as_list(variants if variants is not None else [{}]):
        if not isinstance(v, dict):
            raise PlanError(f"{family}: a variant is a mapping of template parameters, got {v!r}")
        names = list(v)
        for values in itertools.product(*[_as_list(v[n]) for n in names]):
            params = dict(zip(names, values))
            try:
                spec = registry.find(family, **params)
            except KeyError as e:
                raise PlanError(str(e).strip('"')) from None
            if spec.p not in out:
                out.append(spec.p)
    return out


def _bench_tasks(entry: dict, defaults: dict) -> list[Task]:
    e = {**{k: v for k, v in defaults.items() if k in BENCH_KEYS}, **entry}
    unknown = set(e) - BENCH_KEYS
    if unknown:
        raise PlanError(f"bench task: unknown keys {sorted(unknown)} (known: {sorted(BENCH_KEYS)})")
    for k in ("family", "nt"):
        if k not in e:
            raise PlanError(f"bench task: {k!r} is required ({entry})")
    family = e["family"]
    variants = expand_variants(family, e.get("variants"))
    qtype = e.get("qtype", FAMILY_QTYPE[family])
    if qtype != FAMILY_QTYPE[family]:
        raise PlanError(f"family {family} takes {FAMILY_QTYPE[family]} weights, the task says qtype {qtype!r}")
    backend = e.get("backend", "gpu")
    if backend not in ("gpu", "cpu"):
        raise PlanError(f"backend must be gpu or cpu (the numpy stand-in), got {backend!r}")
    fault = e.get("fault")
    if fault is not None and (backend != "cpu" or fault not in FAULTS):
        raise PlanError(f"fault {fault!r}: only the cpu stand-in takes fault injection, one of {FAULTS}")
    if "shapes" in e:
        if "od" in e or "id" in e:
            raise PlanError("bench task: give shapes: [[od, id], ...] or od: and id:, not both")
        shapes = e["shapes"]
        if not isinstance(shapes, list) or not all(isinstance(s, (list, tuple)) and len(s) == 2 for s in shapes):
            raise PlanError(f"shapes must be a list of [od, id] pairs, got {shapes!r}")
    else:
        if "od" not in e or "id" not in e:
            raise PlanError(f"bench task: od and id (or shapes) are required ({entry})")
        shapes = [(od, id_) for od in _as_list(e["od"]) for id_ in _as_list(e["id"])]
    out = []
    for od, id_ in shapes:
        _pos_int(od, "od")
        if _pos_int(id_, "id") % 256:
            raise PlanError(f"id={id_} is not a multiple of 256 (q4_K/q6_K super-blocks)")
        for nt in _as_list(e["nt"]):
            spec = {"kind": "bench", "backend": backend, "family": family, "qtype": qtype, "variants": variants,
                    "od": od, "id": id_, "nt": _pos_int(nt, "nt"),
                    "repeats": _pos_int(e.get("repeats", 10), "repeats"), "pairs": _pos_int(e.get("pairs", 3), "pairs"),
                    "warmup": _pos_int(e.get("warmup", 2), "warmup"), "seed": int(e.get("seed", 0))}
            if fault:
                spec["fault"] = fault
            out.append(Task(spec))
    return out


def _notebook_tasks(entry: dict) -> list[Task]:
    unknown = set(entry) - NOTEBOOK_KEYS
    if unknown:
        raise PlanError(f"notebook task: unknown keys {sorted(unknown)} (known: {sorted(NOTEBOOK_KEYS)})")
    if "round" not in entry:
        raise PlanError(f"notebook task: 'round' is required ({entry})")
    try:
        (nb,) = pipeline.resolve([str(entry["round"])])
    except (SystemExit, pipeline.PipelineError) as e:  # no match / ambiguity
        raise PlanError(str(e)) from None
    declared = pipeline.declared_parameters(nb)
    out = []
    for params in _as_list(entry.get("params", {})):
        if not isinstance(params, dict):
            raise PlanError(f"notebook {nb.stem}: params must be a mapping (or a list of them), got {params!r}")
        bad = sorted(set(params) - set(declared))
        if bad:
            raise PlanError(f"notebook {nb.stem} declares no parameter {bad} (declared: {sorted(declared)})")
        name = nb.stem if nb.parent == pipeline.NOTEBOOKS_DIR else str(nb)
        out.append(Task({"kind": "notebook", "notebook": name, "params": params}))
    return out


def load_plan(src) -> Plan:
    """A plan from a YAML file (or an already parsed mapping); every task validated against the registry /
    the notebooks before anything runs."""
    import yaml

    if isinstance(src, dict):
        data = src
    else:
        p = Path(src)
        if not str(src).strip():
            raise PlanError("the plan path is empty: give a plan YAML (see labkernels/plans/)")
        if not p.exists():
            raise PlanError(f"plan file {p} does not exist")
        text = paths.read_small_file(p, PlanError, "plan file", limit=1 << 20)   # no FIFO, device or endless file
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PlanError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise PlanError("a plan is a mapping with a non-empty list 'tasks'")
    unknown = set(data) - PLAN_KEYS
    if unknown:
        raise PlanError(f"plan: unknown keys {sorted(unknown)} (known: {sorted(PLAN_KEYS)})")
    defaults = data.get("defaults") or {}
    tasks = []
    for entry in data["tasks"]:
        if not isinstance(entry, dict) or len(entry) != 1 or next(iter(entry)) not in ("bench", "notebook"):
            raise PlanError(f"each task is {{bench: {{...}}}} or {{notebook: {{...}}}}, got {entry!r}")
        (kind, body), = entry.items()
        if not isinstance(body, dict):
            raise PlanError(f"{kind} task: expected a mapping, got {body!r}")
        tasks += _bench_tasks(body, defaults) if kind == "bench" else _notebook_tasks(body)
    keys = [t.key for t in tasks]
    if len(set(keys)) != len(keys):
        dup = sorted({t.label for t in tasks if keys.count(t.key) > 1})
        raise PlanError(f"the plan names the same task twice: {dup}")
    timeout = data.get("task_timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise PlanError(f"task_timeout_s must be a positive number of seconds, got {timeout!r}")
    return Plan(name=str(data.get("name") or "sweep"), tasks=tasks,
                max_attempts=_pos_int(data.get("max_attempts", 3), "max_attempts"), task_timeout_s=timeout)


# ------------------------------------------------------------------ on the worker


def worker_identity(need_gpu: bool = False) -> dict:
    """Who runs this task: host, Dask worker, and (on a GPU worker) the physical GPU it is pinned to."""
    ident = {"host": socket.gethostname(), "pid": os.getpid(), "worker": _worker_address(), "gpu_index": None,
             "gpu_uuid": None, "gpu_name": None, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if provenance.gpu_available():
        import cupy

        dev = cupy.cuda.Device(0)
        # the GPU this process sees as device 0, found in NVML by its PCI bus id (NVML's index is the physical one)
        nv = nvml.identity(dev.pci_bus_id)
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        ident.update(gpu_index=nv.get("index"), gpu_uuid=nv.get("uuid"), gpu_name=name, pci_bus_id=dev.pci_bus_id,
                     nvml_bus_id=dev.pci_bus_id, nvml_start=nvml.reading(dev.pci_bus_id))
        if "absent" in nv:
            ident["nvml"] = nv["absent"]
        ident["device"] = f"{ident['host']}/gpu{ident['gpu_index']}"
    elif need_gpu:
        raise SweepError(f"backend gpu needs a CUDA GPU with cupy on the worker; {ident['host']} has none "
                         "(use backend: cpu for the numpy stand-in)")
    else:
        ident["device"] = f"{ident['host']}/cpu"
    return ident


def _log_event(msg: dict) -> None:
    try:
        from distributed import get_worker

        get_worker().log_event(EVENT_TOPIC, msg)
    except (ImportError, ValueError):
        pass


def variant_label(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items()) or "default"


class _GpuBackend:
    """The real kernels, timed with CUDA events and an L2 flush (labkernels.bench)."""

    def __init__(self, spec: dict):
        self.bench, self.gpu, self.cp, self.spec = bench, gpu, gpu.cp(), spec
        self.flush = bench.Flusher()

    def prepare(self, w_raw, x):
        cp, s = self.cp, self.spec
        self.w_raw, self.weights = w_raw, {}
        xg = cp.asarray(x)
        self.a = (self.gpu.quantize_q8_1_rows(xg) if s["family"] == "q6k_generic" else self.gpu.prepass(xg))
        self.y = cp.empty((s["nt"], s["od"]), cp.float32)

    def launcher(self, v: dict):
        s, gpu = self.spec, self.gpu
        stride = v.get("STRIDE")
        if stride not in self.weights:
            self.weights[stride] = gpu.QWeight.upload(self.w_raw, s["qtype"], stride)
        w = self.weights[stride]
        if s["family"] == "q6k_generic":
            return lambda: gpu.gemm_generic_q6k(w, self.a, s["nt"], out=self.y)
        tp = {k: val for k, val in v.items() if k != "STRIDE"}
        return lambda: gpu.gemm(w, self.a, s["family"], out=self.y, **tp)

    def output(self, v: dict) -> np.ndarray:
        self.y.fill(np.nan)
        self.launcher(v)()
        return self.cp.asnumpy(self.y)

    def time(self, fn) -> np.ndarray:
        return self.bench.time_launches(fn, self.spec["warmup"], self.spec["repeats"], self.flush)

    def kernel_info(self, v: dict) -> dict:
        return self.bench.kernel_row(self.spec["family"], **v)


class _CpuStandin:
    """A numpy stand-in with the kernels' math: q8_1 activations x dequantized weights, KDR super-blocks of
    the inner dimension per step; timed with perf_counter. Same gates, tables and records as the GPU path."""

    def __init__(self, spec: dict):
        self.spec = spec

    def prepare(self, w_raw, x):
        a = reference.quantize_activations(x)
        nt, id_ = a.qs.shape
        self.xa = (a.qs.reshape(nt, id_ // 32, 32) * a.d.astype(np.float32)[..., None]).reshape(nt, id_)
        self.wt = np.ascontiguousarray(quants.dequantize(w_raw, self.spec["qtype"]).T)   # [id, od]

    def launcher(self, v: dict):
        step = 256 * int(v.get("KDR", 1))
        xa, wt = self.xa, self.wt

        def run():
            y = np.zeros((xa.shape[0], wt.shape[1]), np.float32)
            for k in range(0, xa.shape[1], step):
                y += xa[:, k:k + step] @ wt[k:k + step]
            return y
        return run

    def output(self, v: dict) -> np.ndarray:
        return self.launcher(v)()

    def time(self, fn) -> np.ndarray:
        for _ in range(self.spec["warmup"]):
            fn()
        out = np.empty(self.spec["repeats"])
        for r in range(out.size):
            t0 = time.perf_counter()
            fn()
            out[r] = (time.perf_counter() - t0) * 1e6
        return out

    def kernel_info(self, v: dict) -> dict:
        k = registry.find(self.spec["family"], **v)
        return {"kernel": k.key, "threads": k.threads, "dynamic_smem": k.dynamic_smem(), "main_path": k.main_path}


def _apply_fault(spec: dict, key: str, ctx: dict) -> None:
    fault = spec.get("fault")
    if not fault:
        return
    if fault == "raise_always":
        raise RuntimeError("injected fault: raise_always")
    marker = Path(ctx["fault_dir"]) / f"{key}.{fault}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    if fault == "raise_once":
        raise RuntimeError("injected fault: raise_once")
    if fault == "hang_once":
        time.sleep(3600)
    time.sleep(0.5)  # let the start event reach the scheduler, then die like a segfault would
    os._exit(17)


def run_bench(spec: dict, run, ident: dict, key: str = "", sweep_id: str = "") -> list[dict]:
    """One bench task into ``run``: parity gate per variant, interleaved timing, tables ``kernels``,
    ``parity``, ``points`` (one row per variant and pair, with the device) and ``ratios`` (vs the first
    variant, per pair)."""
    be = _GpuBackend(spec) if spec["backend"] == "gpu" else _CpuStandin(spec)
    qtype, od, id_, nt = spec["qtype"], spec["od"], spec["id"], spec["nt"]
    rng = np.random.default_rng(spec["seed"] or None)
    w_raw = cases.synthetic_weights(qtype, od, id_, rng)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    tokens = cases.gate_tokens(rng, nt)
    # both references once per point (all variants share weights and inputs), every variant gated on them
    refs = cases.references(w_raw, qtype, x, tokens)
    be.prepare(w_raw, x)
    fns = {}
    for v in spec["variants"]:
        label = variant_label(v)
        cases.check(be.output(v), refs, f"{spec['family']}[{label}] od={od} id={id_} nt={nt}", run, label)
        fns[label] = be.launcher(v)
        run.append("kernels", {"variant": label, "params": canonical(v), **be.kernel_info(v)})
    res = {k: [] for k in fns}
    for _ in range(spec["pairs"]):
        for k, fn in fns.items():
            res[k].append(bench.stats(be.time(fn)))
    end = nvml.reading(ident["nvml_bus_id"]) if ident.get("nvml_bus_id") else {}
    dev = {"task_key": key, "sweep_id": sweep_id, "backend": spec["backend"], "device": ident["device"],
           "host": ident["host"], "gpu_index": ident.get("gpu_index"), "gpu_name": ident.get("gpu_name") or "cpu",
           "gpu_uuid": ident.get("gpu_uuid"),
           "sm_clock_mhz_start": (ident.get("nvml_start") or {}).get("sm_mhz"), "sm_clock_mhz_end": end.get("sm_mhz"),
           "clocks_event_reasons_end": "+".join(end.get("reasons_names", [])) if "reasons_names" in end else None}
    rows = []
    for v in spec["variants"]:
        label = variant_label(v)
        for p, s in enumerate(res[label]):
            rows.append({**dev, "qtype": qtype, "family": spec["family"], "variant": label, "params": canonical(v),
                         "kernel": registry.find(spec["family"], **v).key, "od": od, "id": id_, "nt": nt,
                         "pair": p, **s, **bench.work(nt, od, id_, s["median_us"])})
    run.append("points", rows)
    labels = list(fns)
    if len(labels) > 1:
        df = pd.DataFrame(rows)
        run.append("ratios", pd.concat([pair_ratios(df, labels[0], b) for b in labels[1:]], ignore_index=True))
    return rows


def _collect(root: Path, prefix: str) -> dict:
    return {f"{prefix}/{p.relative_to(root)}": p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run_notebook(spec: dict, tmp: Path, key: str, sweep_id: str) -> dict:
    data, reports, task = tmp / "data", tmp / "reports", tmp / "task"
    old = os.environ.get("LABKERNELS_DATA_DIR")
    os.environ["LABKERNELS_DATA_DIR"] = str(data)   # the notebook's kernel inherits it: its runs are staged
    t0 = time.time()
    try:
        rc = pipeline.run([spec["notebook"]], [f"{k}={json.dumps(v)}" for k, v in spec["params"].items()], [],
                          out_dir=reports)
    finally:
        if old is None:
            os.environ.pop("LABKERNELS_DATA_DIR", None)
        else:
            os.environ["LABKERNELS_DATA_DIR"] = old
    state = json.loads((reports / "index.json").read_text())
    name = Path(spec["notebook"]).stem
    st = state.get(name, {})
    if rc != 0 or st.get("status") != "ok":
        raise RuntimeError(f"notebook {name} failed: {st.get('error')}")
    children = sorted(p.stem for p in data.rglob("*.json")) if data.exists() else []
    with records.recording(NOTEBOOK_ROUND, {"notebook": spec["notebook"], "params": spec["params"]},
                           root=task) as run:
        run.append("execution", {"notebook": name, "params": canonical(spec["params"]), "status": st["status"],
                                 "seconds": round(time.time() - t0, 2), "mode": st.get("mode"),
                                 "headline": canonical(st.get("headline") or {}),
                                 "recorded_runs": ";".join(children), "task_key": key, "sweep_id": sweep_id})
    return {**(_collect(data, "data") if data.exists() else {}), **_collect(task, "task"),
            **{k: v for k, v in _collect(reports, "reports").items() if k.endswith(".html")}}


def _worker_address() -> str | None:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


STAGING_PREFIX = "labkernels-sweep-"


def _remove_stale_staging() -> None:
    """Remove the staging folders of this host's worker processes that died mid-task (their pid is in the name):
    a task whose worker is killed cannot clean up after itself."""
    base = Path(tempfile.gettempdir())
    for d in base.glob(f"{STAGING_PREFIX}*"):
        pid = d.name[len(STAGING_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:   # another user's live process
            pass


def execute(spec: dict, ctx: dict) -> dict:
    """Run one task on this worker into a private staging folder; return its files (bytes) and identity.
    Nothing is written to the sweep's data/ from here. Start / end events go to the scheduler (attempt
    accounting, the client's per-task timeout)."""
    key, worker = Task(spec).key, _worker_address()
    event = {"key": key, "sweep_id": ctx["sweep_id"], "worker": worker}
    _log_event({**event, "event": "start", "t": time.time()})
    t0 = time.time()
    _remove_stale_staging()
    tmp = None
    try:
        ident = worker_identity(need_gpu=spec.get("backend") == "gpu")
        _apply_fault(spec, key, ctx)  # before the staging folder exists: an injected death leaves nothing behind
        tmp = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-{key}-"))
        if spec["kind"] == "bench":
            with records.recording(BENCH_ROUND, spec, root=tmp / "task") as run:
                rows = run_bench(spec, run, ident, key, ctx["sweep_id"])
                run.finish(points=len(rows), task_key=key)
            files = _collect(tmp / "task", "task")
        else:
            files = _run_notebook(spec, tmp, key, ctx["sweep_id"])
    except Exception as e:
        _log_event({**event, "event": "error", "t": time.time(), "error": f"{type(e).__name__}: {e}"[:500]})
        raise TaskFailure(f"{type(e).__name__}: {e}"[:2000], worker) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if ident.get("nvml_bus_id"):
        ident["nvml_end"] = nvml.reading(ident["nvml_bus_id"])
    _log_event({**event, "event": "end", "t": time.time()})
    return {"key": key, "identity": ident, "files": files, "seconds": time.time() - t0, "t_start": t0,
            "t_end": time.time()}


# ------------------------------------------------------------------ on the client: staging and merging


def merge_into_data(staged: Path, dest: Path) -> list[str]:
    """The one import of staged runs into data/: records' validated, atomic import (every run's manifest,
    metadata and tables checked before anything is copied)."""
    return records_admin.import_runs(staged, dest)


def _read_meta(p: Path) -> dict:
    return json.loads(p.read_text())


def _write_meta(p: Path, meta: dict) -> None:
    p.write_text(json.dumps(meta, indent=1, default=str))


def _annotate_and_dedupe(staged: Path, dest: Path, sweep: dict, role: str) -> list[tuple[str, str]]:
    """Add provenance.sweep to every staged run and give it an id free in ``dest`` (runs recorded at the
    same second on two GPUs of one model would share one); returns [(series, run_id)]."""
    out = []
    for mp in sorted(staged.glob("*/*.json")):
        meta = _read_meta(mp)
        rnd, rid = mp.parent.name, meta["run_id"]          # rnd: the folder; the run's series is meta["round"]
        series = meta.get("round") or rnd
        if meta.get("status") not in ("complete", "failed"):
            raise SweepError(f"staged run {rnd}/{rid} is {meta.get('status')!r}: only finished runs are merged")
        meta.setdefault("provenance", {})["sweep"] = {**sweep, "role": role}
        new, n = rid, 1
        while (dest / records.folder(series) / f"{new}.json").exists():
            n += 1
            new = f"{rid}-{n}"
        if new != rid:
            for f in sorted(mp.parent.glob(f"{rid}.*")):
                f.rename(f.with_name(new + f.name[len(rid):]))
            mp = mp.with_name(f"{new}.json")
            meta["run_id"] = new
        _write_meta(mp, meta)
        # the run's metadata changed (provenance.sweep, maybe its id): seal it again, so the validated import
        # (records_admin.import_runs: manifest, sha256, rows) checks what is merged
        records.write_manifest(records.Run(series, new, staged, meta, folder=rnd))
        out.append((series, new))
    return out


def stage_and_merge(result: dict, workdir: Path, dest: Path, sweep: dict) -> list[tuple[str, str]]:
    """Write a task's returned files under ``workdir/staging/<key>.part``, annotate, rename into place, import
    into ``dest`` (children first, the task's own run -- its completion mark -- last)."""
    key = result["key"]
    final = workdir / "staging" / key
    part = final.with_name(key + ".part")
    for d in (part, final):
        shutil.rmtree(d, ignore_errors=True)
    for rel, data in result["files"].items():
        p = (part / rel).resolve()
        if part.resolve() not in p.parents:
            raise SweepError(f"task {key} returned a file outside its staging folder: {rel!r}")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    runs = []
    for sub, role in (("data", "child"), ("task", "task")):
        if (part / sub).exists():
            runs += [(r, i, role) for r, i in _annotate_and_dedupe(part / sub, dest, sweep, role)]
    os.replace(part, final)  # atomic: a staged task is either whole or absent
    for sub in ("data", "task"):
        if (final / sub).exists():
            merge_into_data(final / sub, dest)
    if (final / "reports").exists():
        rep = workdir / "reports" / key
        shutil.rmtree(rep, ignore_errors=True)
        shutil.copytree(final / "reports", rep)
    shutil.rmtree(final)
    return runs


def completed_tasks(root: Path | None = None) -> dict:
    """{task key: (round, run_id, sweep_id)} of every complete run in ``root`` that marks a finished task."""
    root = Path(root) if root else records.data_root()
    done = {}
    for rnd in (BENCH_ROUND, NOTEBOOK_ROUND):
        for r in records.list_runs(rnd, root):
            sw = r.provenance.get("sweep") or {}
            if sw.get("role") == "task" and sw.get("task_key"):
                done[sw["task_key"]] = (rnd, r.run_id, sw.get("sweep_id"))
    return done


# ------------------------------------------------------------------ clusters


def open_client(cluster: str, max_attempts: int = 3):
    """(client, cluster-or-None, dashboard line) for ``local[:N]``, ``local-cuda[:N]`` or ``tcp://ADDRESS``."""
    import dask
    from distributed import Client, LocalCluster

    try:
        import bokeh  # noqa: F401 -- the dashboard needs it

        dash = ":0"
    except ImportError:
        dash = None
    # a worker that dies while running a task: the scheduler reschedules it up to max_attempts times in all
    # (read when a local scheduler starts; a remote scheduler keeps its own setting). Work stealing is off: a
    # retry is placed on the workers it has not failed on with allow_other_workers (so it cannot hang when they
    # are gone), and a loosely restricted task is one the stealing extension hands to any idle worker -- the
    # very worker it just failed on (distributed/stealing.py, _get_thief). Tasks without restrictions are
    # queued on the scheduler and handed to free workers, which is the balancing a sweep needs.
    with dask.config.set({"distributed.scheduler.allowed-failures": max(0, max_attempts - 1),
                          "distributed.scheduler.work-stealing": False}):
        return _open_client(cluster, dash, Client, LocalCluster)


def check_cluster(cluster) -> str:
    """``cluster`` when it is local[:N], local-cuda[:N] (N >= 1) or tcp://HOST:PORT / tls://HOST:PORT (port 1..65535);
    SweepError naming what is wrong otherwise -- checked before anything starts or is written."""
    if not isinstance(cluster, str) or not cluster.strip():
        raise SweepError(f"--cluster {cluster!r}: use local[:N], local-cuda[:N] or tcp://HOST:PORT")
    if cluster.startswith(("tcp://", "tls://")):
        host, _, port = cluster.split("://", 1)[1].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SweepError(f"--cluster {cluster!r}: a scheduler address is tcp://HOST:PORT with a port 1..65535")
        return cluster
    kind, _, n = cluster.partition(":")
    if kind not in ("local", "local-cuda"):
        raise SweepError(f"--cluster {cluster!r}: use local[:N], local-cuda[:N] or tcp://HOST:PORT")
    if n and not (n.isdigit() and int(n) > 0):
        raise SweepError(f"--cluster {cluster}: the worker count must be a positive integer")
    return cluster


@contextmanager
def _workers_without_ctrl_c():
    """Local worker processes that the terminal's Ctrl-C does not reach: SIGINT is blocked in this (the main)
    thread while the cluster starts, so the threads it starts -- its event loop, which also restarts a worker that
    died -- and the worker processes they spawn inherit the blocked signal (a thread's mask survives fork and exec).
    A Ctrl-C in a terminal goes to the whole process group: each worker stopped in the middle of its asyncio loop and
    printed a KeyboardInterrupt traceback ("Process Dask Worker process (from Nanny)"), however cleanly the client
    exited. The client alone stops now (KeyboardInterrupt: exit 130) and closes the cluster, which ends the workers.
    The main thread's mask is restored on the way out (a SIGINT that came meanwhile is delivered then)."""
    import signal

    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    from multiprocessing import resource_tracker

    # multiprocessing's resource tracker started here, not by the first worker's spawn: starting it unblocks SIGINT in
    # the thread that starts it (its own guard, bpo-33613), and the workers spawned from that thread had Ctrl-C again
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _open_client(cluster: str, dash, Client, LocalCluster):
    kind, _, n = cluster.partition(":")
    check_cluster(cluster)
    if cluster.startswith("tcp://") or cluster.startswith("tls://"):
        try:
            client, cl = Client(cluster, timeout="30s"), None
        except OSError as e:     # no scheduler there (a refused or timed-out connection)
            raise SweepError(f"--cluster {cluster}: cannot reach the scheduler ({e})") from None
    elif kind in ("local", "local-cuda"):
        if n and not (n.isdigit() and int(n) > 0):
            raise SweepError(f"--cluster {cluster}: the worker count must be a positive integer")
        cl = client = None
        try:
            with _workers_without_ctrl_c():
                if kind == "local":
                    cl = LocalCluster(n_workers=int(n) if n else (os.cpu_count() or 1), threads_per_worker=1,
                                      processes=True, dashboard_address=dash)
                else:
                    try:
                        from dask_cuda import LocalCUDACluster
                    except ImportError as e:
                        raise SweepError(f"--cluster local-cuda needs dask-cuda (pip install 'labkernels[gpu]'): "
                                         f"{e}") from None
                    kw = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(int(n)))} if n else {}
                    try:
                        cl = LocalCUDACluster(threads_per_worker=1, dashboard_address=dash, **kw)
                    except Exception as e:  # no GPU / no NVML on this machine
                        raise SweepError(f"--cluster local-cuda: LocalCUDACluster did not start: "
                                         f"{type(e).__name__}: {e}") from None
                client = Client(cl)
        except BaseException:    # a Ctrl-C while it started (delivered as the mask is restored): nothing left running
            for x in (client, cl):
                if x is not None:
                    try:
                        x.close()
                    except Exception:
                        pass
            raise
    else:
        raise SweepError(f"--cluster {cluster!r}: use local[:N], local-cuda[:N] or tcp://HOST:PORT")
    link = (f"dashboard: {client.dashboard_link}" if dash and client.dashboard_link
            else "dashboard: off (bokeh is not installed)" if not dash else "dashboard: not reported by the cluster")
    return client, cl, link


def _quiet_logging() -> None:
    """Dask's log lines of this process (a worker, the client) from here on only for critical ones."""
    import logging

    logging.getLogger("distributed").setLevel(logging.CRITICAL)


def _quiet_shutdown(client, timeout: float = 5.0) -> None:
    """Before a sweep that is stopping early (Ctrl-C, an error) closes its cluster: Dask's own log lines of the
    shutdown silenced, here and in every worker (bounded by ``timeout``: a worker that does not answer is closed all
    the same). Workers closed while their tasks still run log each cut-off heartbeat as an error with a traceback
    ("Failed to communicate with scheduler during heartbeat"), which is noise after the lab's one line."""
    _quiet_logging()

    def run():
        try:
            client.run(_quiet_logging, on_error="ignore")
        except Exception:   # a client or cluster already going: nothing to quiet there
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)


@contextmanager
def quiet_dask(level: str = "critical"):
    """Dask's own log lines (a worker's 'Compute Failed' for a task that raised, the nanny restarting a dead
    worker) silenced in this process and in the worker processes it starts, e.g. while a report page runs a
    sweep whose faults it shows in its own tables. Restores both on exit."""
    import logging

    env, saved_env = "DASK_LOGGING__DISTRIBUTED", os.environ.get("DASK_LOGGING__DISTRIBUTED")
    logger = logging.getLogger("distributed")
    saved_level = logger.level
    os.environ[env] = level                      # read by distributed's logging set-up in each new worker process
    logger.setLevel(getattr(logging, level.upper()))
    try:
        yield
    finally:
        logger.setLevel(saved_level)
        if saved_env is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = saved_env


# ------------------------------------------------------------------ the sweep


@dataclass
class _State:
    task: Task
    submissions: int = 0
    failed_on: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    status: str = "pending"
    result: dict | None = None
    runs: list = field(default_factory=list)


def _workers(client) -> list[str]:
    try:
        info = client.scheduler_info(n_workers=-1)   # newer distributed lists only a few workers by default
    except TypeError:
        info = client.scheduler_info()
    return list(info["workers"])


def _other_workers(client, exclude, n_expected: int, wait_s: float = 15.0) -> list[str]:
    """Workers that have not failed this task; while fewer workers than at the start are up (one is being
    restarted after a death), wait a little for it rather than retry where the task just failed."""
    t0 = time.time()
    while True:
        ws = _workers(client)
        others = [w for w in ws if w not in exclude]
        if others or len(ws) >= n_expected or time.time() - t0 > wait_s:
            return others
        time.sleep(0.2)


def _start_counts(client, sweep_id: str) -> dict:
    counts = {}
    for _, msg in client.get_events(EVENT_TOPIC):
        if isinstance(msg, dict) and msg.get("sweep_id") == sweep_id and msg.get("event") == "start":
            counts[msg["key"]] = counts.get(msg["key"], 0) + 1
    return counts


def _running_attempts(client, sweep_id: str) -> dict:
    """{(task key, worker): start time} of attempts that started and have not ended (per worker events)."""
    running = {}
    for _, m in client.get_events(EVENT_TOPIC):
        if isinstance(m, dict) and m.get("sweep_id") == sweep_id:
            if m.get("event") == "start":
                running[(m["key"], m["worker"])] = m["t"]
            else:
                running.pop((m["key"], m["worker"]), None)
    return running


def _watchdog(client, sweep_id: str, timeout_s: float, stop, log) -> None:
    """Restart the worker of any attempt running past ``timeout_s`` (a hung kernel, a stuck notebook): Dask
    then reschedules the task like after a worker death, within the attempt limit."""
    handled = set()
    while not stop.wait(min(2.0, timeout_s / 4)):
        try:
            alive = set(_workers(client))
            for (key, worker), t in _running_attempts(client, sweep_id).items():
                if time.time() - t > timeout_s and worker in alive and (key, worker, t) not in handled:
                    handled.add((key, worker, t))
                    log(f"task {key} has run {time.time() - t:.0f} s on {worker} (task_timeout_s={timeout_s}): "
                        "restarting that worker")
                    client.restart_workers([worker], raise_for_error=False)
        except Exception as e:  # the client closing under us ends the watchdog
            if not stop.is_set():
                log(f"sweep watchdog: {type(e).__name__}: {e}")
            return


def run_sweep(plan, cluster: str = "local:2", root=None, workdir=None, force: bool = False, progress: bool = True,
              log=print) -> dict:
    """Run a plan; returns {"sweep_id", "summary_run", "tasks": DataFrame, "failed": n}."""
    from distributed import as_completed
    from tqdm import tqdm

    plan = plan if isinstance(plan, Plan) else load_plan(plan)
    root = Path(root) if root else records.data_root()
    sweep_id = f"{provenance.utc_now().replace('-', '').replace(':', '')}-{records._slug(plan.name)}-{plan.digest}"
    workdir = Path(workdir) if workdir else REPORTS_DIR / "sweeps" / sweep_id
    workdir.mkdir(parents=True, exist_ok=True)
    done = {} if force else completed_tasks(root)
    states = {t.key: _State(t) for t in plan.tasks}
    for k, st in states.items():
        if k in done:
            st.status, st.runs = "skipped", [(done[k][0], done[k][1], "task")]
    pending = [st for st in states.values() if st.status == "pending"]
    kind, _, n = cluster.partition(":")
    if kind == "local" and (int(n) if n.isdigit() else (os.cpu_count() or 1)) > 1 and any(
            st.task.spec.get("backend") == "gpu" for st in pending):
        raise SweepError(f"--cluster {cluster}: a LocalCluster of several processes would time GPU tasks side by "
                         "side on one GPU; use --cluster local-cuda (one worker per GPU) or local:1")
    if kind in ("local", "local-cuda") and any(st.task.spec.get("backend") == "gpu" for st in pending):
        if not provenance.gpu_available():
            n_gpu = sum(st.task.spec.get("backend") == "gpu" for st in pending)
            raise SweepError(f"--cluster {cluster}: this machine has no CUDA GPU, and {n_gpu} of the plan's tasks "
                             "run on one (backend: gpu); nothing was run or recorded. Run the plan on a GPU machine, "
                             "or a cpu-backend plan here (labkernels/plans/cpu_standin_example.yaml)")
    log(f"sweep {sweep_id}: {len(plan.tasks)} tasks, {len(plan.tasks) - len(pending)} already recorded "
        f"(skipped), {len(pending)} to run on {cluster}")
    if not pending:         # a sweep that ran nothing records nothing
        log(f"sweep {sweep_id}: nothing to run (every task is recorded already); no summary recorded")
        table = _summary_table(states, {})
        return {"sweep_id": sweep_id, "summary_run": None, "tasks": table, "failed": 0, "workdir": workdir}
    client = cl = None
    if pending:
        client, cl, link = open_client(cluster, plan.max_attempts)
        log(link)
        ctx = {"sweep_id": sweep_id, "fault_dir": str(workdir / "faults")}
        n_start = len(_workers(client))
        futs = {}

        def submit(st: _State, workers=None):
            st.submissions += 1
            f = client.submit(execute, st.task.spec, ctx, key=f"lk-{st.task.key}-{st.submissions}", pure=False,
                              retries=0, **({"workers": workers, "allow_other_workers": True} if workers else {}))
            futs[f.key] = st
            return f

        stop = threading.Event()
        if plan.task_timeout_s:
            threading.Thread(target=_watchdog, args=(client, sweep_id, plan.task_timeout_s, stop, log),
                             daemon=True).start()
        try:
            ac = as_completed([submit(st) for st in pending])
            bar = tqdm(total=len(pending), desc=f"sweep {plan.name}", disable=not progress, file=sys.stderr)
            for fut in ac:
                st = futs.pop(fut.key)
                if fut.status == "finished":
                    st.result = fut.result()
                    sweep_prov = {"sweep_id": sweep_id, "task_key": st.task.key, "task": st.task.label,
                                  **{k: v for k, v in st.result["identity"].items() if k != "pid"}}
                    try:
                        st.runs = stage_and_merge(st.result, workdir, root, sweep_prov)
                        st.status = "complete"
                    except Exception as e:  # a merge refused: the task's records stay out of data/
                        st.status, st.errors = "failed", st.errors + [f"merge: {type(e).__name__}: {e}"]
                    bar.update(1)
                else:
                    try:
                        exc = fut.exception()
                    except Exception as e:  # cancelled (scheduler lost the task): an attempt that failed
                        exc = e
                    worker = getattr(exc, "worker", None) or getattr(getattr(exc, "last_worker", None), "address", None)
                    st.failed_on.append(worker)
                    st.errors.append(f"{type(exc).__name__}: {exc}"[:1000])
                    attempts = max(st.submissions, _start_counts(client, sweep_id).get(st.task.key, 0))
                    if attempts < plan.max_attempts:
                        ac.add(submit(st, workers=_other_workers(client, st.failed_on, n_start) or None))
                    else:
                        st.status = "failed"
                        bar.update(1)
                fut.release()
            bar.close()
            starts = _start_counts(client, sweep_id)
        except BaseException:
            _quiet_shutdown(client)     # interrupted (or failed): the cluster's shutdown says nothing of its own
            raise
        finally:
            stop.set()
            client.close()
            if cl is not None:
                cl.close()
    else:
        starts = {}
    table = _summary_table(states, starts)
    summary_run = _record_summary(plan, sweep_id, table, workdir, root, cluster)
    failed = int((table.status == "failed").sum())
    log(f"sweep {sweep_id}: {int((table.status == 'complete').sum())} complete, "
        f"{int((table.status == 'skipped').sum())} skipped, {failed} failed; summary run {summary_run}")
    return {"sweep_id": sweep_id, "summary_run": summary_run, "tasks": table, "failed": failed, "workdir": workdir}


def _summary_table(states: dict, starts: dict) -> pd.DataFrame:
    rows = []
    for k, st in states.items():
        ident = (st.result or {}).get("identity", {})
        task_runs = [f"{r}/{i}" for r, i, role in st.runs if role == "task"]
        rows.append({"task_key": k, "kind": st.task.kind, "task": st.task.label, "status": st.status,
                     "attempts": max(st.submissions, starts.get(k, 0)), "worker": ident.get("worker"),
                     "host": ident.get("host"), "device": ident.get("device"), "gpu_index": ident.get("gpu_index"),
                     "gpu_name": ident.get("gpu_name"),
                     "seconds": round((st.result or {}).get("seconds", float("nan")), 3),
                     "run_id": task_runs[0] if task_runs else None,
                     "child_runs": ";".join(f"{r}/{i}" for r, i, role in st.runs if role == "child"),
                     "failed_on": ";".join(str(w) for w in st.failed_on),
                     "error": " | ".join(st.errors)[-2000:] if st.status == "failed" else ""})
    df = pd.DataFrame(rows)
    df["overlaps"] = _overlaps(df, states)
    return df


def _overlaps(df: pd.DataFrame, states: dict) -> list[str]:
    """For each GPU task, the tasks that ran on the same device at the same time (should be none: with one
    worker per GPU two timings never share a GPU; a hand-made cluster could break that)."""
    span = {k: (st.result["t_start"], st.result["t_end"], st.result["identity"].get("device"))
            for k, st in states.items() if st.result and st.task.spec.get("backend") == "gpu"}
    out = []
    for k in df.task_key:
        if k not in span:
            out.append("")
            continue
        a0, a1, dev = span[k]
        out.append(";".join(o for o, (b0, b1, d) in span.items() if o != k and d == dev and a0 < b1 and b0 < a1))
    return out


def _record_summary(plan: Plan, sweep_id: str, table: pd.DataFrame, workdir: Path, root: Path, cluster: str) -> str:
    stage = workdir / "staging" / "_summary.part"
    shutil.rmtree(stage, ignore_errors=True)
    params = {"plan": plan.name, "sweep_id": sweep_id, "cluster": cluster, "max_attempts": plan.max_attempts,
              "tasks": len(plan.tasks)}
    with records.recording(SUMMARY_ROUND, params, root=stage, kind="sweep") as run:
        run.append("tasks", table)
        best = best_from_points(sweep_points(table, root))
        if not best.empty:
            run.append("best_variants", best)
        run.finish(**{s: int((table.status == s).sum()) for s in ("complete", "skipped", "failed")})
    (rid_round, rid), = _annotate_and_dedupe(stage, root, {"sweep_id": sweep_id}, "summary")
    merge_into_data(stage, root)
    shutil.rmtree(stage)
    return rid


# ------------------------------------------------------------------ reading sweeps back


def pair_ratios(points: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """time(a) / time(b) per interleaved pair (> 1: b is faster), only inside one timing session on one GPU:
    rows are matched by task key and pair index. Refuses (CrossDeviceError) a ratio whose two variants were
    timed on different devices or in different sessions, and a session whose rows name two devices."""
    need = {"variant", "pair", "median_us", "device", "task_key", "od", "id", "nt"}
    if not need <= set(points.columns):
        raise SweepError(f"points lack columns {sorted(need - set(points.columns))}")
    out = []
    for shape, grp in points[points.variant.isin([a, b])].groupby(["od", "id", "nt"]):
        sessions = [g for _, g in grp.groupby("task_key") if {a, b} <= set(g.variant)]
        if not sessions:
            da = sorted(set(grp[grp.variant == a].device))
            db = sorted(set(grp[grp.variant == b].device))
            if da and db:
                raise CrossDeviceError(
                    f"{a} (on {da}) and {b} (on {db}) at od,id,nt={shape} were not timed in one interleaved "
                    "session on one GPU: ratios across GPUs or sessions are refused (put both in one task)")
            continue
        for g in sessions:
            if g.device.nunique() != 1:
                raise CrossDeviceError(f"task {g.task_key.iloc[0]} has rows from devices {sorted(set(g.device))}")
            ta = g[g.variant == a].set_index("pair").median_us
            tb = g[g.variant == b].set_index("pair").median_us
            for p in sorted(set(ta.index) & set(tb.index)):
                out.append({"od": shape[0], "id": shape[1], "nt": shape[2], "a": a, "b": b, "pair": int(p),
                            "device": g.device.iloc[0], "task_key": g.task_key.iloc[0], "ratio": ta[p] / tb[p]})
    return pd.DataFrame(out, columns=["od", "id", "nt", "a", "b", "pair", "device", "task_key", "ratio"])


def sweep_points(tasks: pd.DataFrame, root=None) -> pd.DataFrame:
    """The ``points`` rows of every complete (or skipped, recorded earlier) bench task of a summary table."""
    root = Path(root) if root else records.data_root()
    by_id = {r.run_id: r for r in records.list_runs(BENCH_ROUND, root)}
    frames = []
    for rid in tasks[(tasks.kind == "bench") & tasks.status.isin(["complete", "skipped"])].run_id.dropna():
        rnd, _, run_id = str(rid).partition("/")
        if run_id in by_id and by_id[run_id].has("points"):
            frames.append(by_id[run_id].table("points"))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def best_from_points(points: pd.DataFrame) -> pd.DataFrame:
    """Best variant per (GPU model, qtype, shape class, nt). Each variant's time is first normalized inside its
    own timing session (median over pairs / the session's fastest), then scored by the geometric mean over
    the shapes of the class that measured it with all its competitors."""
    cols = ["gpu_model", "qtype", "shape_class", "nt", "family", "variant", "params", "kernel", "shapes",
            "score", "runner_up", "runner_up_score", "median_us", "tops_eq", "backend", "task_keys"]
    if points.empty:
        return pd.DataFrame(columns=cols)
    med = (points.groupby(["task_key", "gpu_name", "backend", "qtype", "family", "variant", "params", "kernel", "od",
                           "id", "nt"], as_index=False).agg(median_us=("median_us", "median"),
                                                            tops_eq=("tops_eq", "median")))
    med["rel"] = med.median_us / med.groupby("task_key").median_us.transform("min")
    med["shape_class"] = [shape_class(o, i) for o, i in zip(med.od, med.id)]
    out = []
    for (gpu, qtype, cls, nt), g in med.groupby(["gpu_name", "qtype", "shape_class", "nt"]):
        nshape = g.groupby(["od", "id"]).ngroups
        score = g.groupby(["family", "variant"]).agg(score=("rel", lambda r: float(np.exp(np.log(r).mean()))),
                                                     n=("rel", "size")).reset_index()
        score = score[score.n == score.n.max()].sort_values("score")
        best, runner = score.iloc[0], (score.iloc[1] if len(score) > 1 else None)
        rows = g[(g.family == best.family) & (g.variant == best.variant)]
        out.append({"gpu_model": gpu, "qtype": qtype, "shape_class": cls, "nt": int(nt), "family": best.family,
                    "variant": best.variant, "params": rows.params.iloc[0], "kernel": rows.kernel.iloc[0],
                    "shapes": nshape, "score": best.score,
                    "runner_up": runner.variant if runner is not None else None,
                    "runner_up_score": runner.score if runner is not None else float("nan"),
                    "median_us": float(rows.median_us.median()), "tops_eq": float(rows.tops_eq.median()),
                    "backend": rows.backend.iloc[0], "task_keys": ";".join(sorted(set(rows.task_key)))})
    return pd.DataFrame(out, columns=cols)


def plan_path(name: str) -> Path:
    """A plan by name in ``labkernels/plans/`` (``round4_kdr_h200``) or a path to a YAML file."""
    p = paths.plan_file(name)
    if p is None:
        raise PlanError(f"plan {name!r}: no such file, and none of {sorted(x.stem for x in PLANS_DIR.glob('*.yaml'))} "
                        f"in {PLANS_DIR.name}/")
    return p


# ------------------------------------------------------------------ command line


def stand_in(plan: Plan) -> bool:
    """A plan that measures nothing of record: every bench task on the numpy stand-in (backend: cpu) and every
    notebook task a CPU round (or a GPU round in cpu or replay mode)."""
    for t in plan.tasks:
        if t.kind == "bench" and t.spec.get("backend") != "cpu":
            return False
        if t.kind == "notebook":
            try:
                gpu_round = bool(rounds.module(Path(t.spec["notebook"]).stem).DATA)
            except rounds.RoundError:
                gpu_round = True       # a notebook the lab does not know: treat it as one that records
            if gpu_round and (t.spec.get("params") or {}).get("mode") not in ("cpu", "replay"):
                return False
    return True


def main(args) -> int:
    plan = load_plan(args.plan)
    check_cluster(args.cluster)
    for opt, v in (("--data", args.data), ("--workdir", args.workdir)):
        if v is not None and not str(v).strip():
            raise SweepError(f"{opt} is empty: give a folder, or leave it out")
        if v is not None and Path(v).exists() and not Path(v).is_dir():
            raise SweepError(f"{opt} {v}: exists and is not a folder")
    if args.workdir is not None:
        data = Path(args.data or records.data_root()).resolve()
        w = Path(args.workdir).resolve()
        if w == data or data in w.parents:
            raise SweepError(f"--workdir {args.workdir}: inside the data folder {data}: staging files and rendered "
                             "notebooks are not records; use a folder outside it")
    root = Path(args.data) if args.data else None
    scratch = None
    if root is None and stand_in(plan) and not args.record:
        stamp = provenance.utc_now().replace("-", "").replace(":", "")
        scratch = REPORTS_DIR / "scratch" / "sweeps" / f"{stamp}-{records._slug(plan.name)}"
        root = scratch / "data"
        print(f"plan {plan.name!r} is a CPU stand-in (numpy kernels, CPU rounds): its runs go to the scratch folder "
              f"{scratch} and not to data/ (pass --record to record them in data/)", flush=True)
    res = run_sweep(plan, cluster=args.cluster, root=root,
                    workdir=Path(args.workdir) if args.workdir else (scratch / "work" if scratch else None),
                    force=args.force, progress=not args.no_progress)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(res["tasks"][["task_key", "task", "status", "attempts", "device", "seconds", "run_id"]].to_string())
    return 1 if res["failed"] else 0


def register_cli(sub) -> None:
    p = sub.add_parser("sweep", help="run a sweep plan (bench points, notebooks) on Dask workers, recorded in data/ "
                                     "(a CPU stand-in plan: in a scratch folder)")
    p.add_argument("plan", help="plan YAML (see labkernels/plans/)")
    p.add_argument("--cluster", default="local", help="local[:N] | local-cuda[:N] | tcp://HOST:PORT (default local)")
    p.add_argument("--data", default=None, help="data root (default data/ or $LABKERNELS_DATA_DIR)")
    p.add_argument("--workdir", default=None, help="staging + rendered notebooks (default reports/sweeps/<sweep id>)")
    p.add_argument("--force", action="store_true", help="run tasks already recorded too")
    p.add_argument("--record", action="store_true",
                   help="record a CPU stand-in plan's runs in data/ (default: a scratch folder under reports/scratch/)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)
