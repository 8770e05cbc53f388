"""One module per round, each beside its notebook of the same number (``notebooks/NN_name.py``), and the table
of rounds.

A round module declares ``NOTEBOOK`` (its notebook's name), ``DATA`` (the ``data/<folder>/`` names of its recorded
runs, the first the one its page replays), ``PLAN`` (its one default plan), ``measure(run, progress, **plan)`` (GPU: record
the round into ``run``, a new run of its first folder; None for a CPU round) and ``STEPS`` (its ``labkernels gpu-check`` steps: name ->
``fn(out, args)``). :data:`ROUNDS` lists them by number; :func:`open_round` resolves measure / replay / cpu,
measures into new runs or opens the latest ones, and returns them with the banner; ``gpu-check`` takes its steps
from :func:`gpu_check_steps`. A round whose page replays one kind of run among several in a folder names it in
``REPLAY_WHERE`` ({series: predicate(run, plan)}: round 5's decomposition of the plan's model and nt, round 7's
benchmark among its sanitizer and ncu runs). A round whose measurement records its own runs (round 6: one ncu
process per case) declares ``record_runs(root, progress, **plan) -> {series: run}`` instead of ``measure``. A new round
joins the table by adding its module to :data:`MODULES`.

**Data folders.** A round's recorded runs live in ``data/<its notebook's name>/`` (``data/03_q6k_expanded_b/``).
Every run names its *series* (the ``round`` of its metadata: ``q6k``, ``kdr_sweep``, ``wgmma``, the names the code
records and reads by, and the folder names before #14); :data:`FOLDERS` is the one table from series to folder,
which :mod:`labkernels.records` resolves every recording, reading, check and import through (``recording("q6k")``
writes into ``data/03_q6k_expanded_b/``; the runs of several series share their round's folder, a reader by series
sees its own). Two folders keep a plain name because no single round owns them:

* ``data/prefill/`` -- whole-model prefill runs (Gemma parity, throughput, the CUDA-graph A/B): recorded by round
  5's steps (``prefill``, ``prefill7b``, ``prefill_graph``) and round 7's (``prefill_r7``, the int8 vs wgmma A/B),
  and read by both pages;
* ``data/peers/`` -- llama.cpp measured as the peer (``labkernels peers``), read by rounds 3, 4, 5 and 7.

``labkernels migrate-data`` moves the runs of the old folders (``data/q6k/``...) into the round folders, bytes
unchanged (``records.migrate``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

#: the round modules in order (number = position + 1)
MODULES = ("r01_layout", "r02_occupancy", "r03_q6k", "r04_kdr", "r05_wall", "r06_forensics", "r07_wgmma", "r08_sweeps")


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
    "gpu_suite": "gpu_suite",                    # the GPU test suite's runs (gpu-check's tests step), by tier
}
#: folders that hold the runs of several rounds (see above)
SHARED = ("prefill", "peers", "gpu_suite")


class RoundError(KeyError):
    """An unknown round, plan parameter or mode for a round (a KeyError whose message reads as written)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def module(name: str):
    """A round module by number (3, "3", "03"), module name ("r03_q6k") or notebook name ("03_q6k_expanded_b")."""
    for m in MODULES:
        mod = importlib.import_module(f"{__name__}.{m}")
        num = int(m[1:3])
        if str(name) in (m, mod.NOTEBOOK, str(num), f"{num:02d}") or name == num:
            return mod
    raise RoundError(f"no round {name!r}; rounds: {', '.join(MODULES)}")


def rounds() -> list:
    return [module(m) for m in MODULES]


def param_modes(mod) -> dict:
    """{notebook parameter: the modes in which it has effect} for the parameters that do not act in every mode: a
    round's ``PARAM_MODES`` where it declares them, else every key of its ``PLAN`` (what a measurement records;
    replay shows the recorded plan instead) except its ``REPLAY_KEYS`` (those select the run replay shows)."""
    if hasattr(mod, "PARAM_MODES"):
        return dict(mod.PARAM_MODES)
    if not mod.DATA or (getattr(mod, "measure", None) is None and not hasattr(mod, "record_runs")):
        return {}
    return {k: ("measure",) for k in mod.PLAN if k not in getattr(mod, "REPLAY_KEYS", ())}


def gpu_check_steps() -> dict:
    """{step name: fn(out, args)} over every round of the table (a name declared twice is an error)."""
    out = {}
    for mod in rounds():
        for k, fn in getattr(mod, "STEPS", {}).items():
            if k in out:
                raise RoundError(f"gpu-check step {k!r} declared by two rounds")
            out[k] = fn
    return out


@dataclass
class Opened:
    """What a round's notebook shows: the mode, the plan it ran or replays, and one run per data folder."""
    round: str
    mode: str
    plan: dict
    runs: dict = field(default_factory=dict)

    @property
    def run(self):
        """The run of the round's first data folder (None for a CPU round)."""
        return next(iter(self.runs.values()), None)

    def banner(self, note: str = "") -> None:
        from .. import report

        others = [f"{k}: run {r.run_id}" for k, r in list(self.runs.items())[1:] if r is not None]
        report.banner(self.mode, self.run, note=note or "; ".join(others))


def measure_into(mod, root=None, progress=print, **plan) -> dict:
    """Record ``mod.measure(run, **plan)`` into a new run of its first data folder (under ``root``, default
    ``data/``); a round with more folders records those runs itself and returns them; a round with
    ``record_runs`` records all its runs itself. {series: run}."""
    from .. import records

    full = {**mod.PLAN, **plan}
    if getattr(mod, "record_runs", None) is not None:
        return mod.record_runs(root=root, progress=progress, **full)
    if mod.measure is None:
        raise RoundError(f"round {mod.NOTEBOOK} measures nothing into a run (its runs come from its own command)")
    with records.recording(mod.DATA[0], full, root=root) as run:
        extra = mod.measure(run, progress=progress, **full) or {}
    return {mod.DATA[0]: run, **extra}


def open_round(name, mode: str = "auto", **plan) -> Opened:
    """measure: run ``measure(run, **plan)`` into new runs of the round's data folders (GPU); replay: the latest
    complete run of each folder, its plan read back from the recording; cpu: a round without GPU data."""
    from .. import records, report

    mod = module(name)
    bad = sorted(set(plan) - set(mod.PLAN))
    if bad:
        raise RoundError(f"round {mod.NOTEBOOK} has no plan parameter {bad}; plan: {', '.join(mod.PLAN)}")
    full = {**mod.PLAN, **plan}
    if not mod.DATA:
        if mode not in ("auto", "cpu"):
            raise RoundError(f"round {mod.NOTEBOOK} runs on the CPU (nothing recorded to {mode}): mode 'cpu' or 'auto'")
        return Opened(mod.NOTEBOOK, "cpu", full)
    if mode == "cpu":     # a banner "computed while it rendered" over recorded GPU numbers would be false
        raise RoundError(f"round {mod.NOTEBOOK} shows recorded GPU runs: mode measure, replay or auto, not cpu")
    mode = report.resolve_mode(mode, mod.DATA[0])
    if mode == "measure":
        return Opened(mod.NOTEBOOK, mode, full, measure_into(mod, **full))
    where = getattr(mod, "REPLAY_WHERE", {})
    # replay_run: the latest complete run, refused (naming it) where a newer run of the series has not finished
    runs = {d: records.replay_run(d, where=(lambda r, w=where[d]: w(r, full)) if d in where else None) for d in mod.DATA}
    if runs[mod.DATA[0]] is None:
        raise report.ModeError(f"round {mod.NOTEBOOK}: no complete {mod.DATA[0]} run recorded under "
                               f"{records.data_root() / records.folder(mod.DATA[0])} for the plan {full}")
    recorded = dict(runs[mod.DATA[0]].meta.get("params") or {})
    return Opened(mod.NOTEBOOK, mode, {**full, **{k: v for k, v in recorded.items() if k in full}}, runs)
