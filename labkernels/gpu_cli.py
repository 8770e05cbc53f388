"""GPU commands: ``labkernels gpu-check`` (the one-call device run) and ``labkernels import-runs``: their arguments and the
calls that run them.

``gpu-check --out DIR`` runs, in one process tree on a GPU machine: the GPU test suite (parity gates),
compute-sanitizer memcheck + racecheck over every main-path kernel, the occupancy-API cross-check and the
round benchmarks, recording every measurement as runs under ``DIR/data`` (copy them into ``data/`` with
``labkernels import-runs DIR/data``). Steps are chosen with ``--steps NAME,...`` or, for a round whose steps are
records, ``--round N --step N|NAME,...`` (``--round N --list`` lists them, retired ones with the commit and command
that reproduce them); a failing step is reported and the others still run; the exit code is non-zero if any failed.
The steps are the rounds' (:mod:`labkernels.rounds`: each round's package) and the machine-wide ones
(:mod:`labkernels.gpu_checks`: env, tests, sanitizer), which also runs them (:func:`labkernels.gpu_checks.run_steps`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import attention, blas, gpu_checks, records_admin, rounds
from .gpu_checks import GpuCheckError, TIERS, parse_shard
from .paths import REPO_ROOT

#: gpu-check's results folder when neither --out nor $OUT names one: inside the repository, ignored by git
DEFAULT_OUT = REPO_ROOT / ".gpu" / "gpu-check"


def _set_paths(args) -> None:
    """--dense-path / --cudnn-plan: gemm_dense's path (blas.DENSE_PATH) and the cuDNN SDPA plan policy
    (attention.CUDNN_PLAN) for every step of this gpu-check (the prefill runs record both)."""
    if getattr(args, "dense_path", None):
        blas.DENSE_PATH = args.dense_path
    if getattr(args, "cudnn_plan", None):
        attention.CUDNN_PLAN = args.cudnn_plan
    gpu_checks.log(f"gemm_dense path {blas.DENSE_PATH}, cuDNN plan policy {attention.CUDNN_PLAN}")


def check_args(args) -> None:
    """The paths and lists gpu-check was given, before anything runs (GpuCheckError naming the bad one)."""
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
    """[(name, fn)] of this gpu-check, every name checked before any step runs: ``--round N --step ...`` (the round's
    records) or ``--steps`` (gpu-check names; a retired step's name is refused with its commit and command)."""
    if getattr(args, "round", None) is not None or getattr(args, "step", None) is not None:
        if args.round is None or args.step is None or args.steps:
            raise GpuCheckError("--round N --step N|NAME,... choose a round's steps (--steps the gpu-check names): "
                             "--round and --step together, without --steps")
        try:
            return [(s.name, s.run) for s in rounds.select_steps(args.round, args.step.split(","))]
        except rounds.RoundError as e:
            raise GpuCheckError(e.args[0]) from None
    steps = args.steps.split(",") if args.steps else ["env", "tests", "sanitizer", "occupancy", "q6k"]
    funcs = {**gpu_checks.STEPS, **rounds.gpu_check_steps()}
    for s in steps:
        if s not in funcs and rounds.retired_message(s):
            raise GpuCheckError(rounds.retired_message(s))
    bad = [s for s in steps if s not in funcs]
    if bad:
        raise GpuCheckError(f"unknown step {bad[0]!r}; steps: {', '.join(funcs)}")
    return [(s, funcs[s]) for s in steps]


def main(args) -> int:
    if getattr(args, "list", False):
        if args.round is None:
            raise GpuCheckError("--list lists the steps of a round: --round N --list")
        print(rounds.list_steps(args.round))
        return 0
    chosen = _chosen_steps(args)              # before any step runs
    check_args(args)
    if not str(args.out).strip():
        raise GpuCheckError("--out is empty: give a results folder")
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        raise GpuCheckError(f"--out {args.out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    args.log = gpu_checks.log
    _set_paths(args)
    return gpu_checks.run_steps(chosen, out, args)


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
                   help="with --round: comma list of step numbers, names or old gpu-check names (--round 7 --step 28)")
    p.add_argument("--list", action="store_true", help="with --round: list its steps (retired ones with the commit and "
                   "command that reproduce them) and exit")
    p.add_argument("--repeats", type=int, default=20, help="timed launches per point of the benchmark steps")
    p.add_argument("--sweep-repeats", type=int, default=10, help="timed launches per point of the KDR sweep step")
    p.add_argument("--decompose-nt", type=int, default=3325, help="prompt tokens of the decomposition steps")
    p.add_argument("--decompose-models", default="gemma,7b", help="comma list of gemma, 7b")
    p.add_argument("--graph-models", default="7b,gemma", help="prefill_graph: comma list of 7b, gemma (the real GGUF), synthetic-gemma3 (its shapes, random weights)")
    p.add_argument("--fail-fast", action="store_true", help="stop the GPU tests at the first failure (pytest -x)")
    p.add_argument("--tier", choices=sorted(TIERS), default="fast",
                   help="tests step: fast (-m gpu_fast, < 4 min) or full (every GPU test); default fast")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="tests step: run the I-th of N parts of the tier (test files dealt by size), to run the whole "
                        "suite over several calls; the index shows the full tier once every part of one commit is "
                        "recorded")
    p.add_argument("--workers", type=int, default=0,
                   help="tests step: pytest-xdist processes sharing the GPU (0: one process)")
    p.add_argument("--model-tests", action="store_true",
                   help="tests step: include the tests that need the real model (its GGUF or tensor cache on the "
                        "machine)")
    p.add_argument("--sanitizer-timeout", type=int, default=240,
                   help="seconds each compute-sanitizer tool may run before it counts as failed")
    p.add_argument("--kernel", default="auto", help="qmatmul kernel of the prefill/decompose steps (default auto)")
    p.add_argument("--old-kernels", default=None,
                   help="tile_ab: the kernel sources before the tile skeleton (default: git archive eef6c5d)")
    p.add_argument("--gemma", default=None, help="Gemma 3 270M GGUF path for prefill_r7 and prefill_graph "
                   "(default data/models/...); generate measures it beside the synthetic models when given")
    p.add_argument("--attention", default="auto", help="attention path of the decompose / attention steps: "
                   "auto | cudnn | torch | baseline (labkernels.attention)")
    p.add_argument("--attn-dtype", default="f16", help="input type of the fused attention: f16 | bf16")
    p.add_argument("--attention-nts", default="512,3325,8192", help="token counts of the attention benchmark")
    p.add_argument("--dense-path", default=None, choices=blas.DENSE_PATHS,
                   help=f"gemm_dense's cuBLAS path for every step (default {blas.DENSE_PATH}: labkernels.blas.gemm_dense)")
    p.add_argument("--cudnn-plan", default=None, choices=attention.CUDNN_PLANS,
                   help=f"cuDNN SDPA plan policy for every step (default {attention.CUDNN_PLAN}: labkernels.attention.Cudnn)")
    groups = {}
    for nb, label, flags, kw in rounds.step_args():   # the arguments each round step declares (once per flag)
        g = groups.get(nb) or groups.setdefault(nb, p.add_argument_group(f"round {nb}'s steps"))
        try:
            g.add_argument(*flags, **{**kw, "help": f"{kw.get('help', '')} (step {label})".strip()})
        except argparse.ArgumentError:
            pass                                      # declared already (gpu-check's own, or another step's)
    p.set_defaults(func=main)
    q = sub.add_parser("import-runs", help="copy recorded runs from a GPU results folder into data/")
    q.add_argument("src", help="the folder of recorded runs to file into data/ (gpu-check's OUT/data)")
    q.set_defaults(func=import_main)
