"""Round 7 -- a Hopper-native q4_K / q6_K GEMM: weights dequantized in registers feeding ``wgmma``
(``notebooks/07_wgmma_kquant``). The round's launcher is :mod:`labkernels.wgmma` (production kernels
``labkernels/kernels/wgmma_kq.cu``); what only the round uses is here: its steps as records (:mod:`.steps`: number,
builds, plan, prediction, verdict, runs, commit; retired ones with the commit and command that reproduce them), their
GPU runs (:mod:`.runs`), what they measure and how the page reads it (:mod:`.experiments`: the benchmark, A/Bs,
traces, views), and its exploratory and ablation builds with their launcher (:mod:`.builds`; their source
``kernels/wgmma_kq_experiments.cu``). Its runs are
``wgmma`` runs: the benchmark (table ``wgmma_bench``, the one the page replays and ``qmatmul(kernel="auto")`` reads),
the cost scan, compute-sanitizer and Nsight Compute runs (one each, told apart by their tables); the prefill A/B
(``prefill_r7``) records ``prefill`` runs, the prefill's shared folder (see :mod:`labkernels.rounds`)."""

from __future__ import annotations

from . import experiments as wx
from . import steps

NOTEBOOK = "07_wgmma_kquant"
DATA = ("wgmma",)
#: the run of each series the page replays: the benchmark (a sanitizer, ncu or cost-scan run is newer at times)
REPLAY_WHERE = {"wgmma": lambda run, plan: run.has("wgmma_bench")}


#: the round's one plan: the benchmark's own (:data:`.experiments.PLAN`, which ``experiments.record`` completes with)
PLAN = wx.PLAN


def measure(run, progress=print, **plan) -> None:
    """The round into ``run`` (a new ``wgmma`` run): kernel resources, real-model gates, the benchmark."""
    wx.record(run, plan, progress=progress)


#: its steps as records (:data:`.steps.RECORDS`: ``gpu-check --round 7 --step N|NAME``), retired ones with the commit
#: and command that reproduce them; and the live ones by their gpu-check names (``gpu-check --steps NAME``)
STEP_RECORDS = steps.RECORDS
STEPS = steps.gpu_check_names()
