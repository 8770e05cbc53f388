"""GPU commands: ``labkernels gpu check`` (the one-call device run) and ``labkernels data import``: their arguments and
the calls that run them.

``gpu check --out DIR`` runs, in one process tree on a GPU machine: the GPU test suite (parity gates),
compute-sanitizer memcheck + racecheck over every main-path kernel, the occupancy-API cross-check and the
round benchmarks, recording every measurement as runs under ``DIR/data`` (copy them into ``data/`` with
``labkernels data import DIR/data``). Steps are chosen with ``--steps NAME,...`` or, for a round whose steps are
records, ``--round N --step N|NAME,...`` (``--round N --list`` lists them with the arguments each reads, retired
ones with the commit and command that reproduce them); a failing step is reported and the others still run; the exit
code is non-zero if any failed. The steps are the rounds' (:mod:`labkernels.rounds`: each round's package) and the
machine-wide ones (:mod:`labkernels.gpu_checks`: env, tests, sanitizer), which also runs them
(:func:`labkernels.gpu_checks.run_steps`).

Each step declares the arguments it reads (a round step's ``args``, :data:`labkernels.gpu_checks.STEP_ARGS`); a step
argument given on the command line that no chosen step reads is refused before anything runs, naming the steps that
take it. Every argument is still in ``--help``, with its default.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import attention, blas, gpu_checks, records_admin, rounds
from .gpu_checks import GpuCheckError, parse_shard
from .paths import REPO_ROOT

#: gpu check's results folder when neither --out nor $OUT names one: inside the repository, ignored by git
DEFAULT_OUT = REPO_ROOT / ".gpu" / "gpu-check"
#: the attribute of gpu check's parsed arguments that holds the step flags given on the command line
GIVEN = "step_flags_given"


class _StepFlag(argparse.Action):
    """A step's argument: stored as ``store`` (or ``store_true`` with ``nargs=0``) stores it, and remembered as given
    (:data:`GIVEN`), so that gpu check can refuse one no chosen step reads."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        setattr(namespace, GIVEN, getattr(namespace, GIVEN, frozenset()) | {self.option_strings[0]})


def _step_flag(kw: dict) -> dict:
    """argparse kwargs of a step flag (:class:`_StepFlag`: a ``store_true`` becomes ``nargs=0, const=True``)."""
    kw = dict(kw)
    if kw.pop("action", None) == "store_true":
        kw.update(nargs=0, const=True, default=kw.get("default", False))
    return {**kw, "action": _StepFlag}


def _set_paths(args) -> None:
    """--dense-path / --cudnn-plan: gemm_dense's path (blas.DENSE_PATH) and the cuDNN SDPA plan policy
    (attention.CUDNN_PLAN) in this process, for the chosen steps that declare them (the prefill runs record both)."""
    if getattr(args, "dense_path", None):
        blas.DENSE_PATH = args.dense_path
    if getattr(args, "cudnn_plan", None):
        attention.CUDNN_PLAN = args.cudnn_plan
    gpu_checks.log(f"gemm_dense path {blas.DENSE_PATH}, cuDNN plan policy {attention.CUDNN_PLAN}")


def check_args(args) -> None:
    """The paths and lists gpu check was given, before anything runs (GpuCheckError naming the bad one)."""
    parse_shard(getattr(args, "shard", None))
    if args.gemma is not None:
        g = Path(args.gemma)
        if not str(args.gemma).strip() or not g.is_file():
            why = "empty" if not str(args.gemma).strip() else "not a regular file" if g.exists() else "no such file"
            raise GpuCheckError(f"--gemma {args.gemma!r}: {why} (give the Gemma 3 270M GGUF, or leave it out for "
                                "data/models/)")
    if getattr(args, "old_kernels", None) and not Path(args.old_kernels).is_dir():
        raise GpuCheckError(f"--old-kernels {args.old_kernels!r}: no such folder")
    for name in ("repeats", "sweep_repeats", "decompose_nt", "sanitizer_timeout"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise GpuCheckError(f"--{name.replace('_', '-')} {v}: must be >= 1")


def _chosen_steps(args) -> list:
    """[(name, fn, flags it reads)] of this gpu check, every name checked before any step runs: ``--round N --step
    ...`` (the round's records) or ``--steps`` (gpu check names; a retired step's name is refused with its commit and
    command)."""
    if getattr(args, "round", None) is not None or getattr(args, "step", None) is not None:
        if args.round is None or args.step is None or args.steps:
            raise GpuCheckError("--round N --step N|NAME,... choose a round's steps (--steps: the step names): "
                             "--round and --step together, without --steps")
        try:
            return [(s.name, s.run, s.flags) for s in rounds.select_steps(args.round, args.step.split(","))]
        except rounds.RoundError as e:
            raise GpuCheckError(e.args[0]) from None
    steps = args.steps.split(",") if args.steps else ["env", "tests", "sanitizer", "occupancy", "q6k"]
    funcs = {**{k: (fn, gpu_checks.STEP_ARGS[k]) for k, fn in gpu_checks.STEPS.items()},
             **{k: (s.run, s.flags) for k, (_, s) in rounds.gpu_check_records().items()}}
    for s in steps:
        if s not in funcs and rounds.retired_message(s):
            raise GpuCheckError(rounds.retired_message(s))
    bad = [s for s in steps if s not in funcs]
    if bad:
        raise GpuCheckError(f"unknown step {bad[0]!r}; steps: {', '.join(funcs)}")
    return [(s, *funcs[s]) for s in steps]


def flag_readers() -> dict:
    """{step flag: the steps that read it, as gpu check names them} over every live step (machine-wide: its name; a
    round's: its ``--steps`` name, then its round, number and record name: ``prefill_r7 (round 7, --step prefill)``)."""
    out = {}
    for k, flags in gpu_checks.STEP_ARGS.items():
        for f in flags:
            out.setdefault(f, []).append(k)
    for k, (mod, s) in rounds.gpu_check_records().items():
        where = [f"round {int(mod.NOTEBOOK[:2])}"] + ([f"step {s.number}"] if s.number is not None else []) \
            + ([f"--step {s.name}"] if s.name != k else [])
        for f in s.flags:
            out.setdefault(f, []).append(f"{k} ({', '.join(where)})")
    return out


def check_step_flags(args, chosen) -> None:
    """Refuse a step flag given on the command line that no chosen step reads (GpuCheckError naming the flag, the
    chosen steps and the steps that take it)."""
    read = {f for *_, flags in chosen for f in flags}
    unread = sorted(f for f in getattr(args, GIVEN, ()) if f not in read)
    if unread:
        f, readers = unread[0], flag_readers()
        raise GpuCheckError(f"{f}: no chosen step reads it (chosen: {', '.join(n for n, *_ in chosen)}); the steps "
                            f"that take it: {'; '.join(readers.get(f, [])) or 'none'}"
                            + (f" (also refused: {', '.join(unread[1:])})" if unread[1:] else ""))


def main(args) -> int:
    if getattr(args, "list", False):
        if args.round is None:
            raise GpuCheckError("--list lists the steps of a round: --round N --list")
        print(rounds.list_steps(args.round))
        return 0
    chosen = _chosen_steps(args)              # before any step runs
    check_args(args)
    check_step_flags(args, chosen)
    if not str(args.out).strip():
        raise GpuCheckError("--out is empty: give a results folder")
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        raise GpuCheckError(f"--out {args.out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    args.log = gpu_checks.log
    _set_paths(args)
    return gpu_checks.run_steps([(name, fn) for name, fn, _ in chosen], out, args)


def import_main(args) -> int:
    copied = records_admin.import_runs(Path(args.src))
    print(f"imported {len(copied)} files into data/:")
    for c in copied:
        print("  ", c)
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("gpu-check", help="the one-call device run: GPU tests, sanitizer, occupancy API, benchmarks")
    p.add_argument("--out", default=os.environ.get("OUT") or str(DEFAULT_OUT),
                   help="results folder: the recorded runs go to OUT/data (default $OUT, else "
                        ".gpu/gpu-check/ in the repository, which git ignores)")
    p.add_argument("--steps", default=None, help="comma list of steps (default env,tests,sanitizer,occupancy,q6k; "
                                                 "every round's steps: labkernels.rounds)")
    p.add_argument("--round", default=None, help="a round whose steps are records: run --step of it, or --list them")
    p.add_argument("--step", default=None,
                   help="with --round: comma list of step numbers, names or their --steps names (--round 7 --step 28)")
    p.add_argument("--list", action="store_true", help="with --round: list its steps, the arguments each reads (retired "
                   "ones with the commit and command that reproduce them) and exit")
    shared = p.add_argument_group("step arguments read by several steps (labkernels gpu check --round N --list: which)")
    for flag, kw in gpu_checks.FLAGS.items():
        shared.add_argument(flag, **_step_flag(kw))
    readers, defined, groups = {}, {}, {}
    for nb, label, flags, kw in rounds.step_args():
        readers.setdefault(flags[0], []).append(label)
    for nb, label, flags, kw in rounds.step_args():   # the arguments each round step declares (once per flag)
        if kw is None:
            if flags[0] not in gpu_checks.FLAGS:
                raise GpuCheckError(f"round {nb} step {label} reads {flags[0]}, a flag gpu check does not share "
                                    "(labkernels.gpu_checks.FLAGS): define it in the step's args")
            continue
        if flags[0] in gpu_checks.FLAGS or defined.get(flags[0], (nb, kw)) != (nb, kw):
            raise GpuCheckError(f"round {nb} step {label} defines {flags[0]} again, differently")
        if flags[0] in defined:
            continue
        defined[flags[0]] = (nb, kw)
        g = groups.get(nb) or groups.setdefault(nb, p.add_argument_group(f"round {nb}'s steps"))
        g.add_argument(*flags, **_step_flag({**kw, "help": f"{kw.get('help', '')} (round {int(nb[:2])}'s "
                                                           f"{', '.join(readers[flags[0]])})".strip()}))
    p.set_defaults(func=main)
    q = sub.add_parser("import-runs", help="copy recorded runs from a GPU results folder into data/")
    q.add_argument("src", help="the folder of recorded runs to file into data/ (labkernels gpu check's OUT/data)")
    q.set_defaults(func=import_main)
