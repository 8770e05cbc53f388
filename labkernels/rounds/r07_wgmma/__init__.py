"""Round 7 -- a Hopper-native q4_K / q6_K GEMM: weights dequantized in registers feeding ``wgmma``
(``notebooks/07_wgmma_kquant``). The round's launcher is :mod:`labkernels.wgmma` (production kernels
``labkernels/kernels/wgmma_kq.cu``); what only the round uses is here: its steps as records (:mod:`.steps`: number,
builds, plan, prediction, verdict, runs, commit; retired ones with the commit and command that reproduce them), their
GPU runs (:mod:`.runs`), what they measure and how the page reads it -- one file a level: the benchmark of record
and the recorded round (:mod:`.benchmark`), the build-option A/Bs (:mod:`.options`), the A/Bs against ablation builds
that find the loop's ceiling, the launch floor, the clock and the k scan (:mod:`.limits`), the KPAIR family and the
shared-memory form (:mod:`.kpair`), the per-CTA traces (:mod:`.traces`), the page's tables and views
(:mod:`.tables`) --, the steps' ledger its steps page opens with (:mod:`.ledger`), and its exploratory and ablation builds with their launcher (:mod:`.builds`; their source
``kernels/wgmma_kq_experiments.cu``). Its runs are
``wgmma`` runs: the benchmark (table ``wgmma_bench``, the one the page replays and ``qmatmul(kernel="auto")`` reads),
the cost scan, compute-sanitizer and Nsight Compute runs (one each, told apart by their tables); the prefill A/B
(``prefill_r7``) records ``prefill`` runs, the prefill's shared folder (see :mod:`labkernels.rounds`)."""

from __future__ import annotations

from . import benchmark, steps

NOTEBOOK = "07_wgmma_kquant"
DATA = ("wgmma",)
#: the run of each series the page replays: the benchmark (a sanitizer, ncu or cost-scan run is newer at times)
REPLAY_WHERE = {"wgmma": lambda run, plan: run.has("wgmma_bench")}


#: the round's one plan: the benchmark's own (:data:`.benchmark.PLAN`, which ``benchmark.record`` completes with)
PLAN = benchmark.PLAN


def measure(run, progress=print, **plan) -> None:
    """The round into ``run`` (a new ``wgmma`` run): kernel resources, real-model gates, the benchmark."""
    benchmark.record(run, plan, progress=progress)


#: its steps as records (:data:`.steps.RECORDS`: ``gpu check --round 7 --step N|NAME``), retired ones with the commit
#: and command that reproduce them; and the live ones by their gpu check names (``gpu check --steps NAME``)
STEP_RECORDS = steps.RECORDS
STEPS = steps.gpu_check_names()
