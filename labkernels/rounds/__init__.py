"""One module per round, each beside its notebook of the same number (``notebooks/NN_name.py``), and the table
of rounds. A round with code only it uses is a package ``rNN_name/`` whose ``__init__.py`` is that module and whose
other files hold that code (round 5's decomposition, round 6's forensics, round 7's experiments, round 8's reading of
its sweeps, round 9's benchmark, steps and page); what two rounds or more use stays in ``labkernels/``.

A round module declares ``NOTEBOOK`` (its notebook's name), ``DATA`` (the ``data/<folder>/`` names of its recorded
runs, the first the one its page replays), ``PLAN`` (its one default plan), ``measure(run, progress, **plan)`` (GPU: record
the round into ``run``, a new run of its first folder; None for a CPU round) and ``STEPS`` (its ``labkernels gpu check``
steps: name -> ``fn(out, args)``). :data:`MODULES` lists them by number; :func:`open_round` resolves measure / replay /
cpu, measures into new runs or opens the latest ones, and returns them with the banner; ``gpu check`` takes its steps
from :func:`gpu_check_steps` (``--steps NAME,...``) and :func:`select_steps` (``--round N --step N|NAME,...``).
Every round with gpu check steps declares them as records, ``STEP_RECORDS`` (:class:`Step`: number, name, builds, plan,
prediction, verdict, run ids, commit, one ``run`` and one ``view``, the gpu check arguments it reads; a retired one with
the commit and command that reproduce it): rounds 2-6 in their own module (numbered in the order each step was first
recorded; a step whose round wrote no prediction before its run says so, :data:`NO_PREDICTION`), round 7 in
:mod:`labkernels.rounds.r07_wgmma.steps`, round 9 (whose steps 3, 5, 7 and 8 are retired) in
:mod:`labkernels.rounds.r09_decode.steps`; its ``STEPS`` are then the live ones' gpu check names. A round
whose page replays one kind of run among several in a folder names it in ``REPLAY_WHERE`` ({series: predicate(run,
plan)}: round 5's decomposition of the plan's model and nt, round 7's benchmark among its sanitizer and ncu runs). A
round whose measurement records its own runs (round 6: one ncu process per case) declares ``record_runs(root, progress,
**plan) -> {series: run}`` instead of ``measure``. A new round joins the table by adding its module to :data:`MODULES`.

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

``labkernels data migrate`` moves the runs of the old folders (``data/q6k/``...) into the round folders, bytes
unchanged (``records_admin.migrate``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

#: the round modules in order (number = position + 1)
MODULES = ("r01_layout", "r02_occupancy", "r03_q6k", "r04_kdr", "r05_wall", "r06_forensics", "r07_wgmma", "r08_sweeps",
           "r09_decode")


from .. import records, report
from ..paths import FOLDERS, SHARED  # noqa: F401  (the table of data folders, in paths since issue 42)


#: a step's ``prediction`` where its round wrote none before the run (rounds 2-6 kept no prediction ledger)
NO_PREDICTION = "none written before the run (the round kept no prediction ledger)"
#: a step's ``verdict`` where its round's page states none in words (it shows the run's tables only)
NO_VERDICT = "none written (the round's page shows this run's tables without a verdict in words)"


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
    return {k: s.run for k, (_, s) in gpu_check_records().items()}


def gpu_check_records() -> dict:
    """{gpu check step name: (round module, its live :class:`Step`)} over every round of the table: each name of a
    round's ``STEPS`` with the record it runs (the record that has it as an alias, else the one of that name; a round
    without records gets one per name, :func:`round_steps`). A name declared by two rounds is an error."""
    out = {}
    for mod in rounds():
        recs = [s for s in round_steps(mod) if s.retired is None]
        for k in getattr(mod, "STEPS", {}):
            if k in out:
                raise RoundError(f"gpu check step {k!r} declared by two rounds")
            hit = [s for s in recs if k in s.aliases] or [s for s in recs if s.name == k]
            if not hit:
                raise RoundError(f"round {mod.NOTEBOOK}: gpu check step {k!r} has no live record")
            out[k] = (mod, hit[0])
    return out


@dataclass(frozen=True)
class Retired:
    """What reproduces a retired step: the commit that still holds its code and build, and the command that reruns it
    there (on a GPU machine); ``why`` it left."""
    commit: str
    command: str
    why: str = ""


@dataclass(frozen=True)
class Step:
    """One step of a round as a record: its ``number`` on the round's page (None: a tool step, or an experiment the
    page does not number), ``name`` (``gpu check --round N --step NAME``) and ``aliases`` (the gpu check names it had,
    ``gpu check --steps NAME``); the ``builds`` it runs (label -> -D names; () the plain build), its ``plan``, the
    ``prediction`` written before its run and the ``verdict`` after; the recorded ``runs`` (ids, in the round's
    ``series``) whose params name ``what`` (None: the series' main measurement) and the ``commit`` its measurement ran
    at. ``run(out, args) -> dict`` records it again on a GPU (None once ``retired``: :class:`Retired` says where and
    how); ``view(run) -> DataFrame`` is its table from one of its recorded runs; ``args``: the gpu check arguments it
    reads (gpu check refuses one given when no chosen step reads it), each either the name of a flag gpu check shares
    among steps (``"--gemma"``: :data:`labkernels.gpu_checks.FLAGS`) or ``((flag, ...), argparse kwargs)`` for a flag
    the round defines itself (several of its steps may declare the same one)."""
    name: str
    title: str
    number: int | None = None
    aliases: tuple = ()
    what: str | None = None
    series: str = ""
    builds: dict = field(default_factory=dict)
    plan: dict | None = None
    prediction: str = ""
    verdict: str = ""
    runs: tuple = ()
    commit: str = ""
    run: Callable | None = None
    view: Callable | None = None
    args: tuple = ()
    retired: Retired | None = None

    def __post_init__(self):
        if (self.run is None) == (self.retired is None):
            raise RoundError(f"step {self.name!r}: a live step has a run, a retired one its Retired record (not both)")

    @property
    def label(self) -> str:
        return f"{self.number}. {self.name}" if self.number is not None else self.name

    @property
    def flags(self) -> tuple:
        """The gpu check flags it reads, by their first option string (``("--repeats", "--old-kernels")``)."""
        return tuple(a if isinstance(a, str) else tuple(a[0])[0] for a in self.args)

    def recorded(self, root=None, listed=None) -> list:
        """Its recorded runs (``runs``, in their order; a run listed but not on disk raises), from ``listed`` (the
        series' runs, :func:`labkernels.records.list_runs` with ``status=None``) or the data folder."""
        have = {r.run_id: r for r in (listed if listed is not None else
                                      records.list_runs(self.series, root, status=None))}
        missing = [r for r in self.runs if r not in have]
        if missing:
            raise RoundError(f"step {self.label}: recorded runs {missing} are not under data/{records.folder(self.series)}")
        return [have[r] for r in self.runs]

    def latest(self, root=None, listed=None):
        """Its latest complete recorded run whose params name its ``what`` (the one its view reads), or None."""
        runs = [r for r in self.recorded(root, listed) if r.meta.get("status") == "complete"
                and (r.meta.get("params") or {}).get("what") == self.what]
        return runs[-1] if runs else None


def round_steps(mod) -> list:
    """A round's steps as :class:`Step` records: its ``STEP_RECORDS``, else one unnumbered live record per entry of
    its ``STEPS`` (name -> fn)."""
    recs = getattr(mod, "STEP_RECORDS", None)
    if recs is not None:
        return list(recs)
    return [Step(name=k, title=(fn.__doc__ or k).strip().splitlines()[0], run=fn) for k, fn in mod.STEPS.items()]


def _reproduce(mod, s) -> str:
    which = f"step {s.number} ({s.name})" if s.number is not None else f"step {s.name}"
    return (f"round {int(mod.NOTEBOOK[:2])}'s {which} is retired ({s.retired.why}); it runs at commit "
            f"{s.retired.commit}: {s.retired.command}")


def select_steps(name, selectors) -> list:
    """``gpu check --round N --step SEL,...``: the round's live steps chosen by number (every record of that number,
    the retired ones left out and said -- none left is an error), name or alias, in the order asked. A retired step
    named, or an unknown selector, raises before any step runs."""
    mod = module(name)
    steps = round_steps(mod)
    out = []
    for sel in selectors:
        sel = str(sel).strip()
        if sel.isdigit():
            got = [s for s in steps if s.number == int(sel)]
            if not got:
                nums = sorted({s.number for s in steps if s.number is not None})
                raise RoundError(f"round {mod.NOTEBOOK}: no step {sel}; steps {nums[0]}-{nums[-1]}" if nums else
                                 f"round {mod.NOTEBOOK} numbers no steps")
            live = [s for s in got if s.retired is None]
            if not live:
                raise RoundError("; ".join(_reproduce(mod, s) for s in got))
            out += live
            continue
        got = [s for s in steps if sel == s.name or sel in s.aliases]
        if not got:
            raise RoundError(f"round {mod.NOTEBOOK}: no step {sel!r}; steps: "
                             + ", ".join(s.label for s in steps if s.retired is None))
        if got[0].retired is not None:
            raise RoundError(_reproduce(mod, got[0]))
        out += got
    return out


def retired_step(name: str):
    """The retired step (round module, Step) a gpu check name or alias belongs to, or None."""
    for mod in rounds():
        for s in round_steps(mod):
            if s.retired is not None and (name == s.name or name in s.aliases):
                return mod, s
    return None


def retired_message(name: str) -> str | None:
    """What ``gpu check --steps NAME`` says of a retired step (its commit and command), or None."""
    hit = retired_step(name)
    return _reproduce(*hit) if hit else None


def step_args() -> list:
    """Every argument a live round step declares, ``(round notebook, step label, flags, kwargs)``, for gpu check's
    parser: ``kwargs`` None where the step names a flag gpu check shares (:data:`labkernels.gpu_checks.FLAGS`)."""
    out = []
    for mod in rounds():
        for s in round_steps(mod):
            if s.retired is not None:
                continue
            for a in s.args:
                if isinstance(a, str):
                    out.append((mod.NOTEBOOK, s.label, (a,), None))
                else:
                    flags, kw = a
                    out.append((mod.NOTEBOOK, s.label, tuple(flags), dict(kw)))
    return out


def list_steps(round_name) -> str:
    """``gpu check --round N --list``: the round's steps (number, name, old names, builds; then the arguments it reads
    and the runs it records, or for a retired one the commit and command that reproduce it)."""
    mod = module(round_name)
    steps = round_steps(mod)
    lines = [f"round {mod.NOTEBOOK}: labkernels gpu check --round {int(mod.NOTEBOOK[:2])} --step N|NAME"]
    if not steps:
        lines.append("  (no gpu check steps)")
    for s in steps:
        alias = f" (--steps {', '.join(s.aliases)})" if s.aliases else ""
        builds = "; builds " + ", ".join(f"{k}={'+'.join(v) or 'plain'}" for k, v in s.builds.items()) if s.builds else ""
        lines.append(f"  {s.label}{alias}: {s.title}{builds}")
        if s.retired is not None:
            lines.append(f"      retired ({s.retired.why}): at commit {s.retired.commit}: {s.retired.command}")
        else:
            into = f"; records {s.series} runs" + (f" (what: {s.what})" if s.what else "") if s.series else ""
            lines.append(f"      arguments: {', '.join(s.flags) or 'none'}{into}")
    return "\n".join(lines)


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
        others = [f"{k}: run {r.run_id}" for k, r in list(self.runs.items())[1:] if r is not None]
        report.banner(self.mode, self.run, note=note or "; ".join(others))


def measure_into(mod, root=None, progress=print, **plan) -> dict:
    """Record ``mod.measure(run, **plan)`` into a new run of its first data folder (under ``root``, default
    ``data/``); a round with more folders records those runs itself and returns them; a round with
    ``record_runs`` records all its runs itself. {series: run}."""
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
