"""Round 9's steps: what ``labkernels gpu check --steps NAME`` (and ``--round 9 --step N|NAME``) runs, each a
``fn(out, args) -> dict`` that records a ``decode`` run under ``out/data`` -- the benchmark of record, the generation,
each live step's A/B, compute-sanitizer over every gemv_kq instantiation (:data:`GEMV_SANITIZE_DRIVER`), the nvbench
check (:data:`STEPS`) --, and the steps as records (:data:`STEP_RECORDS`: numbered where a ledger step names them; the
retired steps 3, 5, 7 and 8 with the commit and command that reproduce each)."""

from __future__ import annotations

from pathlib import Path

import sys

from ... import nvbench_check, records, sanitizer, trace
from ...paths import REPO_ROOT
from ...peers import sha256_file
from .. import Retired, Step
from . import benchmark, decomp, generate, tables
from .ledger import (FORM2_HOLDER, FORM45_HOLDER, PF_HOLDER, PIPE_HOLDER, STEP5_RUN, STEP7_RUN, STEP8_RUN, _claims,
                     _cmd, _ledger)
from .plan import (DECOMP_PLAN, GEN_CONTEXT_PLAN, GEN_PLAN, PLAN, STEP2_PLAN, STEP3_PLAN, STEP4_PLAN, STEP5_PLAN,
                   STEP6_PLAN, STEP7_PLAN, GEN_STEP8_PLAN, STEP9_PLAN, GEN_STEP10_PLAN)


def step_decode(out, args) -> dict:
    """gpu check step ``decode``: the benchmark of record (every shape, nt and activation type of the plan) into
    ``out/data``."""
    plan = dict(PLAN)
    with records.recording("decode", {**plan, "what": "gemv_bench"}, root=out / "data") as run:
        benchmark.measure(run, progress=getattr(args, "log", print), **plan)
    return {"ok": True, "run": run.run_id}


def _with_gemma(plan: dict, args, what: str) -> dict:
    """``plan`` with the real Gemma 3 270M first among its models where ``--gemma PATH`` names it (its sha256
    recorded); a path that is not a file is refused before anything is recorded."""
    plan = dict(plan)
    gemma = getattr(args, "gemma", None)
    if gemma:
        p = Path(gemma)
        if not p.is_file():
            raise ValueError(f"{what}: --gemma {gemma}: no such GGUF file")
        plan["models"] = [str(p), *plan["models"]]
        plan["gemma_sha256"] = sha256_file(p)
    return plan


def step_generate(out, args) -> dict:
    """gpu check step ``generate``: tokens/s of the KV-cache generation per model and prompt length (GEN_PLAN) into
    ``out/data`` (a ``decode`` run whose params say ``what: generate``); ``--gemma PATH`` adds the real Gemma 3 270M
    (its sha256 recorded)."""
    plan = _with_gemma(GEN_PLAN, args, "generate")
    with records.recording("decode", {**plan, "what": "generate"}, root=out / "data") as run:
        rows = generate.measure_generate(run, progress=getattr(args, "log", print),
                                         **{k: plan[k] for k in ("models", "prompts", "n_new", "repeats")})
    return {"ok": bool(rows), "run": run.run_id}


def step_generate_context(out, args) -> dict:
    """gpu check step ``generate_context``: tokens/s against context length, 128 .. 8192 (GEN_CONTEXT_PLAN), into
    ``out/data`` (a ``decode`` run whose params say ``what: generate_context``; a prompt a model cannot take is a row
    of table ``generate_skipped``); ``--gemma PATH`` adds the real Gemma 3 270M."""
    plan = _with_gemma(GEN_CONTEXT_PLAN, args, "generate_context")
    with records.recording("decode", {**plan, "what": "generate_context"}, root=out / "data") as run:
        rows = generate.measure_generate(run, progress=getattr(args, "log", print),
                                         **{k: plan[k] for k in ("models", "prompts", "n_new", "repeats")})
    return {"ok": bool(rows), "run": run.run_id}


def step_decode_decomp(out, args) -> dict:
    """gpu check step ``decode_decomp``: what a decode step spends -- one eager step traced with CUPTI, every launch
    classed by its op label and name (GEMV per weight, attention, small kernels, memset / memcpy), the graph replay of
    the same step timed and traced -- per model and context (DECOMP_PLAN) into ``out/data`` (a ``decode`` run whose
    params say ``what: decode_decomp``; tables decode_decomp, decode_decomp_steps). Needs cupti-python: without it the
    step fails naming the package before anything is loaded or recorded. ``--gemma PATH`` adds the real Gemma 3 270M."""
    trace.CuptiTracer()            # TraceError naming cupti-python, before a model is loaded or a run is opened
    plan = _with_gemma(DECOMP_PLAN, args, "decode_decomp")
    with records.recording("decode", {**plan, "what": "decode_decomp"}, root=out / "data") as run:
        rows = decomp.measure_decomp(run, progress=getattr(args, "log", print),
                                     **{k: plan[k] for k in ("models", "contexts", "repeats", "lead_us",
                                                             "traced_replays")})
        measured = [r for r in rows if r["status"] == "measured"]
        run.set_summary(points=len(measured), skipped=len(rows) - len(measured),
                        classified_frac_min=min((r["classified_frac"] for r in measured), default=None))
    return {"ok": bool(measured), "run": run.run_id}


def _step_run(out, args, plan: dict, what: str, **kw) -> dict:
    """A step's A/B: bench_gemv over ``plan`` (and ``kw``) into a ``decode`` run whose params say ``what``."""
    with records.recording("decode", {**plan, "what": what}, root=out / "data") as run:
        benchmark.bench_gemv(run, shapes=[tuple(x) for x in plan["shapes"]], nts=tuple(plan["nts"]),
                             qtypes=tuple(plan["qtypes"]), acts=tuple(plan["acts"]), pairs=plan["pairs"],
                             repeats=plan["repeats"], seed=plan["seed"], flush=plan["flush"],
                             lead_us=plan["lead_us"], progress=getattr(args, "log", print), **kw)
    return {"ok": True, "run": run.run_id}


def step_gemv_step2(out, args) -> dict:
    """gpu check step ``gemv_step2``: round 9 step 2's A/B -- gemv_kq FORM=0 and FORM=1 timed interleaved in one
    process (each point gated first: FORM=1 against exact_weights_v2 and the float64 reference) into a ``decode`` run
    whose params say ``what: gemv_step2`` (not the benchmark of record: ``qmatmul(auto)`` does not read it)."""
    plan = dict(STEP2_PLAN)
    return _step_run(out, args, plan, "gemv_step2", configs=tuple(tuple(c) for c in plan["configs"]),
                     splits=tuple(plan["splits"]), forms=tuple(plan["forms"]))


def step_nvbench_check(out, args) -> dict:
    """The headline ratios (round 7's GEMM at nt=512 / 4096, this round's GEMV at nt=1, each vs cuBLAS fp16) timed by
    nvbench (cuda-bench) and by the lab's harness, compared within 2% (labkernels.nvbench_check)."""
    return nvbench_check.step_nvbench_check(out, args)


#: compute-sanitizer's driver for gemv_kq: every registered instantiation once (a row tail, S=2, nt at the top of its
#: token tiles less one); run as ``python -c`` by :func:`step_gemv_sanitizer` (racecheck and synccheck cover the
#: split's arrival: its shared flag and barriers)
GEMV_SANITIZE_DRIVER = r"""
import numpy as np, cupy as cp
from labkernels import gemv, gpu, quants
from labkernels.kernels import registry
rng = np.random.default_rng(1)
od, id_ = 141, 1024
ws = {q: gpu.QWeight.upload(quants.quantize(rng.standard_normal((od, id_)).astype(np.float32) * .02, q), q)
      for q in ("q4_K", "q6_K")}
n = 0
for k in registry.family("gemv_kq"):
    p = k.p
    w = ws["q4_K" if p["QT"] == 4 else "q6_K"]
    nt = 8 * p["NT8"] - 1
    x = rng.standard_normal((nt, id_)).astype(np.float32 if p["XF32"] else np.float16)
    gemv.gemv(w, cp.asarray(x), MT=p["MT"], WARPS=p["WARPS"], S=2, FORM=p["FORM"])
    n += 1
cp.cuda.runtime.deviceSynchronize()
print(f"gemv sanitizer driver done: {n} launches")
"""


def step_gemv_sanitizer(out, args) -> dict:
    """gpu check step ``gemv_sanitizer``: compute-sanitizer memcheck, racecheck and synccheck over
    :data:`GEMV_SANITIZE_DRIVER` (every gemv_kq instantiation); each tool's report in ``out/sanitizer-gemv-<tool>.txt``,
    classed by :mod:`labkernels.sanitizer` (clean when nothing but cuda-bindings' driver probes is reported)."""
    res = {}
    for tool in sanitizer.TOOLS:
        res[tool] = sanitizer.run_tool(tool, [sys.executable, "-c", GEMV_SANITIZE_DRIVER],
                                       Path(out) / f"sanitizer-gemv-{tool}.txt", cwd=REPO_ROOT,
                                       timeout=getattr(args, "sanitizer_timeout", 600))
        getattr(args, "log", print)(sanitizer.line(tool, res[tool]) + " [gemv_kq]")
    return {"ok": all(r["ok"] for r in res.values()), **res}


def step_gemv_step4(out, args) -> dict:
    """gpu check step ``gemv_step4``: round 9 step 4 -- the benchmark of record (params ``what: gemv_bench``: the run
    ``qmatmul`` reads its gemv_kq choices from) over STEP4_PLAN's launches (FORM 0/1, MT 1/2, default / one-wave
    split) beside round 7's wgmma and cuBLAS fp16, every point gated first."""
    plan = dict(STEP4_PLAN)
    return _step_run(out, args, plan, "gemv_bench", baselines=tuple(plan["baselines"]),
                     launches=[tuple(v) for v in plan["launches"]])


def step_gemv_step9(out, args) -> dict:
    """gpu check step ``gemv_step9``: round 9 step 9 -- the benchmark of record again (params ``what: gemv_bench``, the
    run qmatmul's auto and the decode read) over STEP9_PLAN: step 4's launches with step 6's FORM=3 (W8, S=1) beside
    them and the empty launch beside wgmma and cuBLAS fp16, every point gated first."""
    plan = dict(STEP9_PLAN)
    return _step_run(out, args, plan, "gemv_bench", baselines=tuple(plan["baselines"]),
                     launches=[tuple(v) for v in plan["launches"]])


def step_gemv_step6(out, args) -> dict:
    """gpu check step ``gemv_step6``: round 9 step 6's A/B -- gemv_kq FORM=3 (WARPS 8 / 4 at S=1, WARPS 8 at the
    one-wave split) against FORM=1 and FORM=0 at the one-wave split, beside cuBLAS fp16 and the empty launch (the
    timing's floor), every point gated first, into a ``decode`` run whose params say ``what: gemv_step6``."""
    plan = dict(STEP6_PLAN)
    return _step_run(out, args, plan, "gemv_step6", baselines=tuple(plan["baselines"]),
                     launches=[tuple(v) for v in plan["launches"]])


def step_decode_step10(out, args) -> dict:
    """gpu check step ``decode_step10``: round 9 step 10's A/B -- the decode with add_rmsnorm's register form
    (PrefillOptions.norm_regs: the row of the residual add + RMSNorm loaded into registers at once) against its loop,
    alternating in every repeat (GEN_STEP10_PLAN), into a ``decode`` run whose params say ``what: decode_step10`` (not
    the generation of record)."""
    plan = dict(GEN_STEP10_PLAN)
    with records.recording("decode", {**plan, "what": "decode_step10"}, root=out / "data") as run:
        rows = generate.measure_generate(run, progress=getattr(args, "log", print),
                                         **{k: plan[k] for k in ("models", "prompts", "n_new", "repeats", "ab")})
    return {"ok": bool(rows), "run": run.run_id}


#: the live gpu check steps (``labkernels gpu check --steps NAME``)
STEPS = {"decode": step_decode, "generate": step_generate, "generate_context": step_generate_context,
         "decode_decomp": step_decode_decomp, "gemv_step2": step_gemv_step2, "gemv_step4": step_gemv_step4,
         "gemv_step6": step_gemv_step6, "gemv_step9": step_gemv_step9, "decode_step10": step_decode_step10,
         "gemv_sanitizer": step_gemv_sanitizer,
         "nvbench_check": step_nvbench_check}


#: the gpu check arguments each live step reads (the steps not named read none): the generation steps load a model
#: and run its prefill in this process (--gemma adds the real Gemma 3 270M; the dense path and cuDNN plan apply)
ARGS = {"generate": ("--gemma", "--dense-path", "--cudnn-plan"),
        "generate_context": ("--gemma", "--dense-path", "--cudnn-plan"),
        "decode_decomp": ("--gemma", "--dense-path", "--cudnn-plan"), "decode_step10": ("--dense-path", "--cudnn-plan"),
        "gemv_sanitizer": ("--sanitizer-timeout",)}


def _live(name: str) -> Step:
    fn = STEPS[name]
    return Step(name=name, title=(fn.__doc__ or name).strip().splitlines()[0], number=_ledger(name).get("step"),
                series="decode", run=fn, args=ARGS.get(name, ()))


#: the round's steps as records (``labkernels gpu check --round 9 --step N|NAME``): the live ones (:data:`STEPS`,
#: numbered where a LEDGER step names them) and the retired steps 3, 5, 7 and 8, whose forms lost and left the source:
#: no run, the commit that still holds each and the command that reruns it there. Their recorded runs, plans and ledger
#: text stay (the page renders them from the recorded data; each record's view reads its run).
STEP_RECORDS = (
    *(_live(k) for k in ("decode", "generate", "gemv_step2")),
    Step(name="gemv_step3", number=3, series="decode", what="gemv_step3", plan=STEP3_PLAN,
         title="bytes in flight and the grid's tail: gemv_kq FORM=1 with and without a cp.async shared-memory ring "
               "(PIPE 2/4), at the default and the one-wave split",
         prediction=_claims(_ledger("gemv_step3")["prediction"]), verdict=_ledger("gemv_step3")["verdict"],
         runs=tuple(_ledger("gemv_step3")["runs"]), commit="2406c00", view=lambda run: tables.bench_table(run),
         retired=Retired(commit=PIPE_HOLDER, command=_cmd(PIPE_HOLDER, "gemv_step3"),
                         why="gemv_kq's PIPE ring lost at every point (PIPE=4 one-wave 28.9 us vs PIPE=0 21.0 us, run "
                             "20261207T004259Z-h10080gbhbm3-2406c00) and left the source")),
    _live("gemv_step4"),
    Step(name="gemv_step5", number=5, series="decode", what="gemv_step5", plan=STEP5_PLAN,
         title="bytes in flight per warp without a ring: gemv_kq FORM=2 (a register double buffer of the next "
               "super-block's weight bytes) against FORM=1, at the one-wave and the default split",
         prediction=_claims(_ledger("gemv_step5")["prediction"]), verdict=_ledger("gemv_step5")["verdict"] or "",
         runs=(STEP5_RUN,), commit="0b009b5", view=lambda run: tables.bench_table(run),
         retired=Retired(commit=FORM2_HOLDER, command=_cmd(FORM2_HOLDER, "gemv_step5"),
                         why="gemv_kq's FORM=2 lost almost everywhere (FORM=2 / FORM=1 at the one-wave split, q4_K "
                             "4096x14336 nt=1 f16 20.70 vs 19.12 us; 1.07-1.08 at nt=1 f16 on the three large shapes, "
                             "predicted 0.72-0.9; 1.10 at 4096x4096, predicted 0.85-1.0; 1.04-1.05 at nt=8 f16 and "
                             "1.07-1.12 at nt=1 f32 on the large shapes, predicted 0.75-0.95; H200 run "
                             f"{STEP5_RUN}) and left the source (FORM=3 keeps its loop)")),
    _live("gemv_step6"),
    Step(name="gemv_step7", number=7, series="decode", what="gemv_step7", plan=STEP7_PLAN,
         title="more warps an SM: gemv_kq FORM=4 / FORM=5 (FORM=1 under a register cap of 6 / 8 CTAs an SM) against "
               "FORM=1, at the one-wave and the default split",
         prediction=_claims(_ledger("gemv_step7")["prediction"]), verdict=_ledger("gemv_step7")["verdict"],
         runs=(STEP7_RUN,), commit="045babc", view=lambda run: tables.bench_table(run),
         retired=Retired(commit=FORM45_HOLDER, command=_cmd(FORM45_HOLDER, "gemv_step7"),
                         why="gemv_kq's FORM=4 and FORM=5 were slower at every f16 point (one-wave split, q4_K "
                             "4096x14336 nt=1 f16: FORM=4 / FORM=1 1.20, 25.2 vs 21.0 us; FORM=5 / FORM=1 1.31; "
                             "predicted 1.1-1.3 / 1.2-1.45 from unrecorded exploratory timings; H100 run "
                             f"{STEP7_RUN}) and left the source")),
    Step(name="gemv_step8", number=8, series="decode", what="gemv_step8", plan=GEN_STEP8_PLAN,
         title="the weights before the wait: the decode with gemv_kq's PF=1 build (each CTA's weight bytes prefetched "
               "into L2 before its PDL wait) against PF=0",
         prediction=_claims(_ledger("gemv_step8")["prediction"]), verdict=_ledger("gemv_step8")["verdict"],
         runs=(STEP8_RUN,), commit="045babc", view=lambda run: tables.generation_ab(run, "gemv_pf"),
         retired=Retired(commit=PF_HOLDER, command=_cmd(PF_HOLDER, "gemv_step8"),
                         why="gemv_kq's PF=1 build made the decode slower (tokens/s PF=1 / PF=0 after a 512-token "
                             "prompt: synthetic 7B 0.945, 262.6 vs 278.0; synthetic Gemma 3 0.969; predicted "
                             f"1.03-1.12 / 1.02-1.15; H100 run {STEP8_RUN}) and left the source with "
                             "PrefillOptions.gemv_pf")),
    _live("gemv_step9"),
    _live("decode_step10"),
    *(_live(k) for k in ("gemv_sanitizer", "nvbench_check", "generate_context", "decode_decomp")),
)
