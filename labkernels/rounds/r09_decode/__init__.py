"""Round 9 -- decode at the HBM line (``notebooks/09_decode``): the k-quant matrix-vector / small-batch kernels of
:mod:`labkernels.gemv` against the copy bandwidth measured in the same process, round 7's wgmma family, cuBLAS fp16 on
cached dequantized weights and llama.cpp's MMVQ (recorded as the peer). Runs are ``decode`` runs (``data/09_decode/``).

The round's launcher is :mod:`labkernels.gemv` (production kernel ``labkernels/kernels/gemv_kq.cu``); what only the
round uses is here, one file a level: its plans with the bar and the first prediction (:mod:`.plan`), the steps' ledger
-- per step the analysis and prediction written before its run, what was measured, the verdict, and the commits that
hold the retired step 3's PIPE ring, step 5's FORM=2, step 7's FORM=4 / 5 and step 8's PF=1 build (:mod:`.ledger`) --,
the benchmark of record (:mod:`.benchmark`: the copy line, the interleaved gated GEMV bench, :func:`measure`), the
generation benchmark (:mod:`.generate`: tokens/s of the KV-cache decode, the context sweep's points checked against each
model), the decode step's decomposition (:mod:`.decomp`: one step traced with CUPTI, its launches classed, the graph
replay timed), its steps (:mod:`.steps`: the gpu check runs, the sanitizer's driver and the steps as records, the
retired steps 3, 5, 7 and 8 with the commit and command that reproduce each), the page's tables and figures
(:mod:`.tables`) and where the round stands, for the top of its page (:mod:`.state`: the latest step's and the
generation's figures against llama.cpp, the abstract). The names the page and the tests use are re-exported here
(``r9.bench_table``); a test that patches a function patches it in the file that looks it up
(``r9.benchmark.copy_bandwidth``, ``r9.state.state_facts``).
"""

from __future__ import annotations

from . import benchmark, decomp, generate, ledger, plan, state, steps, tables
from .benchmark import bench_gemv, copy_bandwidth, measure, weight_bytes
from .decomp import measure_decomp
from .generate import measure_generate, plan_points, stored_weight_bytes
from .ledger import (FORM2_HOLDER, FORM45_HOLDER, LEDGER, PF_HOLDER, PIPE_HOLDER, STEP3_ANALYSIS, STEP5_RUN, STEP7_RUN,
                     STEP8_RUN)
from .plan import (DECOMP_PLAN, DECOMP_PREDICTION, GEN_CONTEXT_PLAN, GEN_PLAN, NTS, PLAN, PREDICTION, SHAPES, STEP2_PLAN,
                   STEP3_PLAN, STEP4_PLAN, STEP5_PLAN, STEP6_PLAN, STEP7_PLAN, GEN_STEP8_PLAN, STEP9_PLAN, GEN_STEP10_PLAN,
                   TARGETS)
from .state import abstract_now, peer_mmvq_us, record_run, same_call, state_facts, state_now
from .steps import (GEMV_SANITIZE_DRIVER, STEP_RECORDS, STEPS, step_decode, step_decode_decomp, step_gemv_sanitizer,
                    step_gemv_step2, step_gemv_step4, step_gemv_step6, step_gemv_step9, step_generate, step_generate_context,
                    step_nvbench_check)
from .tables import (bench_table, best_per_point, point_summary, context_run, context_section, copy_line, decomp_classes,
                     decomp_groups, decomp_prediction_table, decomp_run, decomp_section, figure_decomp,
                     figure_time_vs_nt, figure_tok_s_vs_context, generation_run, generation_table, headline,
                     peer_generation, prediction_table, stream_fit, generation_ab, claim_value,
                     step_claims_table, step_run, run_line)

NOTEBOOK = "09_decode"
DATA = ("decode",)
#: the run the page replays: the benchmark of record (a split sweep or another experiment records the same table)
REPLAY_WHERE = {"decode": lambda run, plan: run.meta.get("params", {}).get("what") == "gemv_bench"
                and run.has("gemv_bench")}

# the round's one plan (:data:`.plan.PLAN`), ``measure`` (:func:`.benchmark.measure`: the benchmark of record into a
# new ``decode`` run), its steps as records (:data:`.steps.STEP_RECORDS`: ``gpu check --round 9 --step N|NAME``, the
# retired steps 3, 5, 7 and 8 with the commit and command that reproduce each) and the live ones by their gpu check
# names (:data:`.steps.STEPS`: ``gpu check --steps NAME``) are imported above
