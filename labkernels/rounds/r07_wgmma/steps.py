"""Round 7's steps as records, in the order of the round's page: each one's number, name (``gpu check --round 7
--step N|NAME``; its old gpu check name an alias, ``--steps NAME``), the builds it runs (their -D names are their
identity, in the cubin cache and in every recorded run's ``defines``), its plan, the prediction written before its
run, the verdict after, the recorded runs (``data/07_wgmma_kquant/``; ``prefill`` runs for the prefill step) and the
commit its measurement ran at; one ``run`` (:mod:`.runs`, GPU) and one ``view`` (its table from a recorded run, CPU).

Steps whose builds lost and left the kernel source are retired: no run, and a :class:`~labkernels.rounds.Retired`
record with the commit that still builds them and the command that reruns them there. Their recorded runs and
views stay: the page replays them like any other.
"""

from __future__ import annotations

import pandas as pd

from .. import Retired, Step
from . import builds as wb
from . import benchmark, kpair, limits, options, tables, traces
from . import runs as R

#: the commit that holds every build retired with the production kernel's split (issue 42): the last one with them
HOLDER = "4a8dcd9"


def _cmd(commit: str, name: str) -> str:
    """The command that reruns a retired step at its commit: the old flat name, as the holder predates
    ``labkernels gpu check`` (the old name still parses there and here)."""
    return (f"git worktree add /tmp/lk-{commit} {commit} && cd /tmp/lk-{commit} && "
            f"python3 -m labkernels gpu-check --steps {name} --out DIR   # on an H100/H200")


def _retired(name: str, why: str, commit: str = HOLDER) -> Retired:
    return Retired(commit=commit, command=_cmd(commit, name), why=why)


def _step(**kw) -> Step:
    return Step(**{"series": "wgmma", **kw})


# ------------------------------------------------------------------------------------------------ views
# each: a recorded run of its step -> the step's table (the page's, with its own formatting and figures)

def view_bench(run) -> pd.DataFrame:
    """The benchmark: per point and type, the best launch and its ratio to cuBLAS (tables.summary)."""
    return tables.summary(run.table("wgmma_bench"))


def view_sanitizer(run) -> pd.DataFrame:
    return run.table("sanitizer")


def view_ncu(run) -> pd.DataFrame:
    return tables.ncu_table(run.table("sections"))


def view_costs(run) -> pd.DataFrame:
    return benchmark.cost_fit(run.table("cost_scan"))


def view_trace(run) -> pd.DataFrame:
    """Per traced launch and role: fill, main loop, finish (traces.trace_roles); the first trace run, which
    recorded no SM count, by its summary table."""
    sms = (run.meta.get("params") or {}).get("sm_count")
    return traces.trace_roles(run.table("trace"), sms) if sms else run.table("trace_summary")


def view_prefill(run) -> pd.DataFrame:
    """Tokens per second of each prefill variant per model and nt (medians over the interleaved rounds)."""
    return run.table("throughput").pivot_table(index=["model", "nt"], columns="kernel", values="tok_per_s",
                                               aggfunc="median").reset_index()


def view_splitfin(run) -> pd.DataFrame:
    t = run.table("splitfin").pivot_table(index=["qtype", "od", "id", "nt"], columns=["build", "grid"],
                                          values="median_us").reset_index()
    t.columns = ["_".join(c for c in col if c) if isinstance(col, tuple) else col for col in t.columns]
    return t


def _suffix(table: str, suffixes: tuple):
    def view(run) -> pd.DataFrame:
        return tables.suffix_ab(run.table(table), suffixes=suffixes)
    view.__doc__ = f"each option ({', '.join(suffixes)}) over its base launch (tables.suffix_ab of {table})"
    return view


def view_epi(run) -> pd.DataFrame:
    return tables.epi_table(run.table("wgmma_epi_ab"))


def view_conv16(run) -> pd.DataFrame:
    return limits.conv16_table(run.table("wgmma_conv16_ab"))


def view_plane(run) -> pd.DataFrame:
    return options.plane_table(run.table("wgmma_plane_ab"))


def view_ceiling(run) -> pd.DataFrame:
    return limits.ceiling_table(run.table("wgmma_ceiling_ab"))


def _build_view(name: str):
    def view(run) -> pd.DataFrame:
        return tables.build_ab_view(run, name)[0]
    view.__doc__ = f"the {name} build's speedup over the plain one per launch (tables.build_ab_view)"
    return view


def view_lead(run) -> pd.DataFrame:
    return tables.lead_view(run)


def view_floor(run) -> pd.DataFrame:
    return limits.floor_view(run.table("wgmma_floor_ab"))


def view_clock(run) -> pd.DataFrame:
    return limits.clock_view(run.table("wgmma_clock"))


def view_kscan(run) -> pd.DataFrame:
    return limits.kscan_fit(run.table("wgmma_kscan_ab"))


def view_kpair(run) -> pd.DataFrame:
    return kpair.kpair_table(run.table("wgmma_kpair_ab"))


def view_smem(run) -> pd.DataFrame:
    return kpair.smem_table(run.table("smem_ncu"))


def view_smemform(run) -> pd.DataFrame:
    return kpair.smemform_table(run.table("wgmma_smemform_ab"))


def view_decouple(run) -> pd.DataFrame:
    return kpair.decouple_table(run.table("wgmma_kpair_ab"))


def view_kpairtrace(run) -> pd.DataFrame:
    return traces.kpair_trace_table(run)


def view_kpairfin(run) -> pd.DataFrame:
    """The FIN form beside the KPAIR build and the best launch of record, each over cuBLAS (labkernels.wgmma)."""
    b = kpair.kpair_ablation_builds(run.table("wgmma_kpair_ab"), {"_fin": "KPAIR_FIN"})
    return kpair.forms_over(b, "KPAIR", {"KPAIR": "kpair", "KPAIR_FIN": "fin"})


def view_kpairearly(run) -> pd.DataFrame:
    """The cold-L2 phases of each traced form (traces.early_table)."""
    return traces.early_table(run)


def view_halfy(run) -> pd.DataFrame:
    b = kpair.kpair_ablation_builds(run.table("wgmma_kpair_ab"), {"_fin": "KPAIR_FIN", "_fin_halfy": "HALFY"})
    return kpair.forms_over(b, "KPAIR_FIN", {"KPAIR_FIN": "fin", "HALFY": "halfy"})


# ------------------------------------------------------------------------------------------------ the records

_BENCH_RUNS = ("20261201T091148Z-h200-d830ac1521-2", "20261201T103932Z-h200-cb281b63d7",
               "20261201T142707Z-h200-bc40282287", "20261201T174905Z-h200-5fd9d93420",
               "20261201T201816Z-h200-4f0922ccf5", "20261201T231237Z-h200-9e8632af8a",
               "20261202T024948Z-h200-04371ade9c", "20261202T031202Z-h200-21faa44ca3",
               "20261202T053352Z-h200-592efcb78e")
_SANITIZER_RUNS = ("20261201T091516Z-h200-5033344a35", "20261201T104459Z-h200-a68bcce78d",
                   "20261201T112953Z-h200-10c958662b", "20261201T143014Z-h200-bc40282287",
                   "20261201T174307Z-h200-6260974ae0", "20261201T175148Z-h200-5fd9d93420",
                   "20261201T231201Z-h200-d5fff868bf", "20261202T004807Z-h200-1aa241b4df",
                   "20261202T010243Z-h200-1b32804938", "20261202T024133Z-h200-e7feb0c8d8",
                   "20261202T024803Z-h200-04371ade9c", "20261202T030856Z-h200-2862d13fcd",
                   "20261202T044329Z-h200-a25f3a192a", "20261202T053232Z-h200-592efcb78e",
                   "20261202T070827Z-h200-6cb39c9154", "20261202T230911Z-h200-058d1f732d",
                   "20261202T231849Z-h200-21c49fe8e0", "20261203T060137Z-h200-8c82599a84")
_SHAPES = [list(s) for s in benchmark.SHAPES]

#: the records, in the page's order
RECORDS = (
    # ---- the round's tool steps: rerun whenever the kernel changes
    _step(name="bench", aliases=("wgmma",), title="the benchmark of record: kernel resources, real-model gates, every "
          "variant against cuBLAS fp16, interleaved (the round's measure; the page and qmatmul(kernel='auto') read it)",
          plan=benchmark.PLAN, runs=_BENCH_RUNS, commit="592efcb", run=R.step_wgmma, view=view_bench,
          verdict="the benchmark of record (run 20261202T053352Z): nt=4096 met at all eight points (q4_K 0.95-1.03x, "
                  "q6_K 0.89-1.02x cuBLAS); nt=512 not met (q4_K 0.84-0.95x, q6_K 0.74-0.85x)"),
    _step(name="sanitizer", aliases=("wgmma_sanitizer",), what="sanitizer", run=R.step_wgmma_sanitizer,
          view=view_sanitizer, runs=_SANITIZER_RUNS, commit="8c82599",
          title="compute-sanitizer memcheck, racecheck, synccheck over every main-path variant with tails (an "
                "exploratory build's with LABKERNELS_WG_DEFINES)",
          args=("--sanitizer-timeout",),
          verdict="clean at every recorded build"),
    _step(name="ncu", aliases=("wgmma_ncu",), what="ncu", run=R.step_wgmma_ncu, view=view_ncu, commit="1a0e72a",
          title="Nsight Compute sections and stall counters of the main variants at 4096 x 4096",
          runs=("20261201T091148Z-h200-d830ac1521", "20261201T104510Z-h200-a68bcce78d",
                "20261201T150328Z-h200-4d4c6f5974", "20261202T005336Z-h200-ea30369a2e",
                "20261202T075626Z-h200-a0b98c6ffe", "20261203T185114Z-h200-1a0e72a467")),
    _step(name="costs", aliases=("wgmma_costs",), what="cost_scan", run=R.step_wgmma_costs, view=view_costs,
          title="the k scan at nt=512, od=4096: time = intercept + slope x k per variant, with the fix-up and store "
                "ablations (LK_ABLATE_NOFIX, LK_ABLATE_NOSTORE)",
          builds={"nofix": ("LK_ABLATE_NOFIX",), "nostore": ("LK_ABLATE_NOSTORE",)}, commit="5b08b8f",
          runs=("20261201T110331Z-h200-7a3aceab2d", "20261201T143621Z-h200-6ccc2725a1",
                "20261201T155450Z-h200-5b08b8fd1f"),
          verdict="a stream-K BN=256 launch pays 10.8 us per launch against cuBLAS's 6.7 (run 20261201T143621Z; the "
                  "ablations of the runs before 20261201T155450Z were the plain kernel: a cache bug, fixed)"),
    _step(name="trace", aliases=("wgmma_trace",), what="trace", run=R.step_wgmma_trace, view=view_trace,
          builds={"trace": ("LK_EXP_TRACE",)}, plan={f"{od}x{i}": v for (od, i), v in R.TRACE_PLAN.items()},
          title="per-CTA phase stamps (-DLK_EXP_TRACE) of the nt=512 launches of record, warm and from a flushed L2",
          commit="e9d5a87",
          runs=("20261201T155423Z-h200-5b08b8fd1f", "20261202T190840Z-h200-7057289046",
                "20261202T230839Z-h200-058d1f732d", "20261202T231817Z-h200-21c49fe8e0",
                "20261203T060103Z-h200-8c82599a84", "20261203T130504Z-h200-e9d5a870b7")),
    _step(name="prefill", aliases=("prefill_r7",), series="prefill", what=None, run=R.step_prefill_r7,
          view=view_prefill, commit="b034f91",
          title="the prefill: the synthetic 7B (and Gemma 3 270M) with the int8 families against "
                "qmatmul(kernel='auto'), interleaved, logits parity",
          args=((("--ab",), dict(default="int8,auto", help="prefill variants of round 7's prefill step: "
                                 + ", ".join(R.PREFILL_VARIANTS))),
                "--gemma", "--dense-path", "--cudnn-plan"),
          runs=("20261201T091516Z-h200-5033344a35", "20261201T092157Z-h200-7a22206e36", "20261201T094351Z-h200-9b7f1da38f",
                "20261201T104653Z-h200-b0b81131f1", "20261204T172858Z-h200-b034f91")),

    # ---- the numbered steps of the page
    _step(number=1, name="first", title="the register form: wgmma with the weights dequantized in registers "
          "(BN=128 and 256, data-parallel)", plan=benchmark.PLAN, run=R.step_wgmma, view=view_bench, commit="d830ac1",
          runs=("20261201T091148Z-h200-d830ac1521-2",),
          prediction="BN=128 near issue-bound at ~55-65% of the tensor line, BN=256 near cuBLAS (~80%); nt=512 near "
                     "~0.8x cuBLAS, short of the 1.0x bar",
          verdict="51-62% (BN=128) and 80-82% (BN=256) SM compute throughput; nt=4096 at 0.92-1.01x cuBLAS, nt=512 at "
                  "0.65-0.82x. BN=128's size right, its cause wrong: issue slots only 39-45% busy (latency)"),
    _step(number=2, name="streamk", title="a stream-K tile scheduler (SK=1)", plan=benchmark.PLAN, run=R.step_wgmma,
          view=view_bench, commit="cb281b6", runs=("20261201T103932Z-h200-cb281b63d7",),
          prediction="BN=256 stream-K ~1.9x BN=256 data-parallel at 4096 x 4096; nt=512 within +-5% of cuBLAS",
          verdict="wrong by the per-launch cost: 1.22-1.49x data-parallel (1.29x at q4_K 4096 x 4096), the best nt=512 "
                  "point 0.82-0.87x (q4_K) / 0.69-0.75x (q6_K) cuBLAS; the cost scan and the trace put the extra in "
                  "the serial epilogue (fix-up 3.2 us, store 4.4 us of 35.6)"),
    _step(name="splitfin", aliases=("wgmma_splitfin",), what="splitfin", view=view_splitfin,
          title="the split finish of two-CTA stream-K tiles (-DLK_EXP_SPLITFIN): owner and helper each fold in and "
                "store half of the tile", builds={"splitfin": ("LK_EXP_SPLITFIN",)},
          plan={"points": [[4096, 4096], [4096, 14336]], "nt": 512, "pairs": 3, "repeats": 10},
          runs=("20261201T174118Z-h200-6260974ae0",), commit="6260974",
          prediction="the paired split launch at 4096 x 4096, nt=512 within ~3 us of cuBLAS (the owners' ~6.5 us "
                     "finish halved)",
          verdict="wrong: worth nothing on the paired grid (0.2 us), 1.2 us slower on the default one (q6_K slower on "
                  "both); the paired grid alone gained 5-10% at all four points and became SK=2 (the third step)",
          retired=_retired("wgmma_splitfin", "LK_EXP_SPLITFIN lost; its paired grid became SK=2")),
    _step(number=3, name="splitk", title="the uniform split-k grid (SK=2)", plan=benchmark.PLAN, run=R.step_wgmma,
          view=view_bench, commit="5fd9d93",
          runs=("20261201T174905Z-h200-5fd9d93420", "20261201T175148Z-h200-5fd9d93420"),
          prediction="5-10% faster than stream-K where it fits (the split finish's paired grid), nothing elsewhere",
          verdict="the best nt=512 variant at 4096 x 4096 and 4096 x 14336, 1.06-1.11x stream-K (q4_K 4096 x 14336 "
                  "0.93x cuBLAS); 11008 x 4096 and 4096 x 11008 do not take it; the nt=512 bar not met (0.72-0.93x)"),
    _step(number=4, name="epi", aliases=("wgmma_epi",), what="epi_ab", run=R.step_wgmma_epi, view=view_epi,
          title="the epilogue of a CTA's last segment (EPI=1 bulk fold, EPI=2 TMA store) and the tile-aligned "
                "split (SK=3)", plan=options.EPI_AB, commit="d5fff86",
          runs=("20261201T230951Z-h200-d5fff868bf", "20261201T231201Z-h200-d5fff868bf",
                "20261201T231237Z-h200-9e8632af8a"),
          prediction="EPI=1 1-2 us off the SK=2/3 launches at nt=512, EPI=2 another 0.5-1.5 us; SK=3 at 4096 x 11008 "
                     "1.06-1.11x its stream-K launch; the nt=512 bar still not met",
          verdict="the epilogues wrong (bulk fold 0-4% and TMA store 0-3% slower, bitwise both), the split right "
                  "(1.07x / 1.11x stream-K at 4096 x 11008, into the benchmark of record 20261201T231237Z)"),
    _step(number=5, name="aq", aliases=("wgmma_aq",), what="aq_ab", run=R.step_wgmma_aq,
          view=_suffix("wgmma_aq_ab", ("_a4",)), plan=options.AQ_AB, commit="1aa241b",
          title="four A-fragment sets (AQ=4): the next chunk converted before the wait",
          runs=("20261202T003808Z-h200-1aa241b4df", "20261202T004807Z-h200-1aa241b4df",
                "20261202T005336Z-h200-ea30369a2e"),
          prediction="within +-5% of AQ=2 (the SASS still converts after the wait)",
          verdict="q4_K 4-10% slower (median 0.94x), q6_K 0-4% faster; bitwise AQ=2; measured, not kept"),
    _step(number=5, name="pf", aliases=("wgmma_pf",), what="pf_ab", run=R.step_wgmma_pf,
          view=_suffix("wgmma_pf_ab", ("_p1", "_p2")), plan=options.PF_AB, commit="1b32804",
          title="an L2 prefetch of each row's weights 1 or 2 super-blocks ahead (PF)",
          runs=("20261202T010302Z-h200-1b32804938", "20261202T010243Z-h200-1b32804938"),
          prediction="q6_K BN=128 +3-8%, q4_K within +-3%",
          verdict="wrong: q4_K 0-5% slower, q6_K BN=128 -3..+2%; q6_K's loads do not wait on HBM; not kept"),
    _step(number=6, name="pair", aliases=("wgmma_pair",), what="pair_ab", run=R.step_wgmma_pair,
          view=_suffix("wgmma_pair_ab", ("_e3",)), plan=options.PAIR_AB, commit="04371ad",
          title="the split grid's partial sums through distributed shared memory in 2-CTA clusters (EPI=3)",
          runs=("20261202T023643Z-h200-e7feb0c8d8", "20261202T024133Z-h200-e7feb0c8d8",
                "20261202T024803Z-h200-04371ade9c-2", "20261202T024803Z-h200-04371ade9c",
                "20261202T024948Z-h200-04371ade9c"),
          prediction="2-4 us off the SK=3 BN=256 launches at nt=512 (q4_K 4096 x 4096 from ~0.80x to 0.88-0.95x)",
          verdict="wrong: 1.00-1.01x the plain epilogue at nt=512; the finish's L2 traffic is not its time "
                  "(racecheck found the first build's missing exit barrier)"),
    _step(number=7, name="staged", aliases=("wgmma_staged",), what="staged_ab", run=R.step_wgmma_staged,
          view=_suffix("wgmma_staged_ab", ("_e4",)), plan=options.STAGED_AB, commit="2862d13",
          title="every tile's store through a staging buffer of its own and TMA stores (EPI=4)",
          runs=("20261202T030856Z-h200-2862d13fcd-2", "20261202T030856Z-h200-2862d13fcd",
                "20261202T031202Z-h200-21faa44ca3"),
          prediction="+2-4% at nt=2048/4096 for BN=256 data-parallel and stream-K, +-1% at nt=512",
          verdict="data-parallel 0.994-1.014x (wrong), stream-K 0.96-1.03x; EPI=4 on stream-K joined the benchmark of "
                  "record (20261202T031202Z: nt=4096 met at all eight points)"),
    _step(number=8, name="conv2", aliases=("wgmma_conv2",), what="conv2_ab", run=R.step_wgmma_conv2,
          view=_suffix("wgmma_conv2_ab", ("_c2",)), plan=options.CONV2_AB, commit="a25f3a1",
          title="two converter warpgroups for the shared-memory form (FORM=2)",
          runs=("20261202T050157Z-h200-a25f3a192a", "20261202T044329Z-h200-a25f3a192a"),
          prediction="FORM=2 at 1.2-1.5x FORM=1",
          verdict="wrong: 1.04-1.08x FORM=1; the form stays at 0.50-0.64x cuBLAS, below the register form everywhere"),
    _step(number=9, name="conv16", aliases=("wgmma_conv16",), what="conv16_ab", view=view_conv16,
          title="the register form's conversion in 16-bit arithmetic, against the build of the one before it "
                "(-DLK_EXP_OLDCONV)", builds={"oldconv": ("LK_EXP_OLDCONV",)}, commit="592efcb",
          plan={"shapes": _SHAPES, "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
                "launches": [[128, 0], [256, 1], [256, 3], [256, 0]], "pairs": 3, "repeats": 10},
          runs=("20261202T053232Z-h200-592efcb78e-2", "20261202T053232Z-h200-592efcb78e",
                "20261202T053352Z-h200-592efcb78e"),
          prediction="q4_K BN=128 at nt=512 +8-15%, q6_K 0-4%, q4_K BN=256 at nt=4096 +3-8%",
          verdict="q4_K BN=128 1.09-1.17x (right), BN=256 0.99-1.04x (wrong), q6_K 0.99-1.05x; the new conversion is "
                  "production's; the benchmark of record 20261202T053352Z meets nt=4096 at all eight points",
          retired=_retired("wgmma_conv16", "its baseline, the old conversion (LK_EXP_OLDCONV), left the source")),
    _step(number=10, name="plane", aliases=("wgmma_plane",), what="plane_ab", run=R.step_wgmma_plane,
          view=view_plane, plan=options.PLANE_AB, commit="6cb39c9", title="the q4_K scale plane (SCL=2)",
          runs=("20261202T070827Z-h200-6cb39c9154-2", "20261202T070827Z-h200-6cb39c9154",
                "20261202T075626Z-h200-a0b98c6ffe"),
          prediction="+4-8% (q4_K 4096 x 4096 at nt=512 from 530 to 550-570 TOPS-eq)",
          verdict="wrong in sign: 0.80-0.91x SCL=0 at every point (long_scoreboard 0.53 -> 2.67); the plane is opt-in"),
    _step(number=11, name="ceiling", aliases=("wgmma_ceiling",), what="ceiling_ab", run=R.step_wgmma_ceiling,
          view=view_ceiling, plan=limits.CEILING_AB, builds={k[1:]: v for k, v in limits.CEILING_BUILDS.items()},
          title="what the weights cost the loop: their loads against their conversion (LK_ABLATE_NOLOAD, "
                "LK_ABLATE_NOCONV)", commit="fee9c2f",
          runs=("20261202T075528Z-h200-a0b98c6ffe", "20261202T091332Z-h200-fee9c2ff77"),
          prediction="q4_K BN=128 at nt=512: the loads >= half of the weights' cost, q6_K >= 0.6; the skeleton >= "
                     "1.05x cuBLAS",
          verdict="q4_K: the conversion, not the loads (12-37%: wrong); q6_K half each (right); the skeleton "
                  "1.03-1.11x cuBLAS at three shapes, 0.91x at 11008 x 4096"),
    _step(number=12, name="wstage", aliases=("wgmma_wstage",), what="wstage_ab", view=_build_view("wstage"),
          title="the weights staged in shared memory per thread (-DLK_EXP_WSTAGE)",
          builds={"wstage": ("LK_EXP_WSTAGE",)}, commit="82d821d",
          plan={"shapes": _SHAPES, "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
                "launches": [[128, 0], [256, 1], [256, 3], [256, 0]], "pairs": 3, "repeats": 10},
          runs=("20261202T090329Z-h200-82d821d598", "20261202T090327Z-h200-82d821d598"),
          prediction="q6_K BN=128 nt=512 +8-15%, q6_K BN=256 +3-8%, q4_K BN=128 +2-5%",
          verdict="wrong in sign: slower at every launch (q4_K BN=128 0.64-0.75x, q6_K BN=128 0.78-0.86x)",
          retired=_retired("wgmma_wstage", "LK_EXP_WSTAGE lost", commit="82d821d")),
    _step(number=13, name="wtma", aliases=("wgmma_wtma",), what="wtma_ab", view=_build_view("wtma"),
          title="the weights through a shared-memory ring by the producer's TMA (-DLK_EXP_WTMA)",
          builds={"wtma": ("LK_EXP_WTMA",)}, commit="c900b16",
          plan={"shapes": _SHAPES, "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
                "launches": [[128, 0], [128, 1], [256, 1], [256, 3], [256, 0]], "pairs": 3, "repeats": 10},
          runs=("20261202T151044Z-h200-dde549e72c", "20261202T151606Z-h200-50a336b17d",
                "20261202T154226Z-h200-9d5d834d64", "20261202T154256Z-h200-9d5d834d64",
                "20261202T154625Z-h200-0b556ed32e", "20261202T154708Z-h200-0b556ed32e",
                "20261202T154727Z-h200-0b556ed32e", "20261202T155033Z-h200-88fc1c6543",
                "20261202T155121Z-h200-88fc1c6543", "20261202T155141Z-h200-88fc1c6543",
                "20261202T162332Z-h200-c900b161cd", "20261202T162456Z-h200-c900b161cd",
                "20261202T162514Z-h200-c900b161cd"),
          prediction="q6_K BN=128 +15-25% at nt=512, q6_K BN=256 +5-12%, q4_K BN=128 +2-6% (first build); q4_K "
                     "BN=128 1.00-1.04x (fifth)",
          verdict="the fifth build: q4_K 0.92-1.03x, q6_K BN=128 1.02-1.16x, BN=256 0.95-1.03x; the best nt=512 "
                  "launches did not move (two races of the slot release caught by the bitwise gate first)",
          retired=_retired("wgmma_wtma", "LK_EXP_WTMA did not move the launches of record")),
    _step(number=14, name="reduce", aliases=("wgmma_reduce",), what="reduce_ab", run=R.step_wgmma_reduce,
          view=_suffix("wgmma_reduce_ab", ("_e5",)), plan=options.REDUCE_AB, commit="8c82599",
          title="where the nt=512 split launches lose their time (trace), and the reduce finish (EPI=5)",
          runs=("20261202T190840Z-h200-7057289046", "20261202T230614Z-h200-058d1f732d",
                "20261202T230839Z-h200-058d1f732d", "20261202T230911Z-h200-058d1f732d",
                "20261202T231605Z-h200-21c49fe8e0", "20261202T231817Z-h200-21c49fe8e0",
                "20261202T231849Z-h200-21c49fe8e0", "20261203T055851Z-h200-8c82599a84",
                "20261203T060103Z-h200-8c82599a84", "20261203T060137Z-h200-8c82599a84"),
          prediction="the owner's finish from 6.7 to ~2.5 us at q4_K 4096 x 4096; the tile split at nt=512 from 0.82x "
                     "to 0.90-0.96x cuBLAS (q4_K), 0.76x to 0.83-0.88x (q6_K)",
          verdict="the finish fell (6.67 -> 2.0 us) but bought ~1.4 us of launch: the tile split 1.04x (0.86x "
                  "cuBLAS at q4_K 4096 x 4096), q6_K 1.01-1.03x; short of the prediction, the bar not met"),
    _step(number=15, name="lead", aliases=("wgmma_lead",), what="lead_ab", run=R.step_wgmma_lead, view=view_lead,
          plan=options.LEAD_AB, commit="7f1a131", runs=("20261203T114336Z-h200-7f1a1315f9",),
          title="the timing method: is the time outside the stamps the host's? (a GPU wait ahead of each call)",
          prediction="the nt=512 launches 2-6 us faster behind the lead, their ratio to cuBLAS +0.05-0.15",
          verdict="wrong: every call's host path (<= ~120 us) is shorter than the flush's 160 us of device time; "
                  "behind the lead every ratio within 1-2%: the benchmark's numbers are device time"),
    _step(number=16, name="floor", aliases=("wgmma_floor",), what="floor_ab", run=R.step_wgmma_floor,
          view=view_floor, plan=limits.FLOOR_AB, builds={k[1:]: v for k, v in limits.FLOOR_BUILDS.items()},
          title="the launch floor (LK_ABLATE_EMPTY), and the trace from a cold L2", commit="e9d5a87",
          runs=("20261203T130432Z-h200-e9d5a870b7", "20261203T130504Z-h200-e9d5a870b7"),
          prediction="the empty BN=256 split launches 3.5-5.0 us, a 1-CTA kernel 2-3 us; the flushed trace's span 1-3 "
                     "us longer than the warm one",
          verdict="the floor is ~3 us (empty builds 2.85-3.44 us, 1-CTA 2.66); cold spans grow 0.5-1.7 us (q4_K) and "
                  "3.5-7.7 us (q6_K, not predicted: its loop 10-20% slower cold at 4096 x 4096)"),
    _step(number=17, name="tmapf", aliases=("wgmma_tmapf",), what="tmapf_ab", view=_build_view("tmapf"),
          title="the weights prefetched into L2 by the producer's TMA (-DLK_EXP_TMAPF)",
          builds={"tmapf": ("LK_EXP_TMAPF",)}, commit="2070f21", runs=("20261203T132153Z-h200-2070f2103c",),
          plan={"shapes": _SHAPES, "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
                "launches": [[256, 3, 5], [256, 1, 5], [128, 1, 0], [128, 0, 0], [256, 0, 0]], "pairs": 3,
                "repeats": 10, "ahead": 2},
          prediction="nt=512: q6_K +8-14% on the split grids, +10-15% at BN=128, q4_K 0-3%; nt=4096: q6_K +3-8%",
          verdict="wrong: q6_K 0.97-1.05x (median ~1.00), q4_K 0.84-0.91x at BN=128; bitwise at all 56 launches",
          retired=_retired("wgmma_tmapf", "LK_EXP_TMAPF lost")),
    _step(number=18, name="clock", aliases=("wgmma_clock",), what="clock_ab", run=R.step_wgmma_clock,
          view=view_clock, plan=limits.CLOCK_AB, commit="e0fb934", runs=("20261203T132845Z-h200-e0fb9344f5",),
          title="the SM clock during the launches of record, against cuBLAS's",
          prediction="the launches of record at 1.60-1.70 GHz, cuBLAS 0-7% higher",
          verdict="wrong in sign: cuBLAS at the lower clock (1,657-1,684 against 1,585-1,769 MHz); in cycles the "
                  "kernel is further behind than in time (q4_K 0.78-0.90x, q6_K 0.73-0.81x at nt=512)"),
    _step(number=19, name="swapred", aliases=("wgmma_swapred",), what="swapred_ab", view=_build_view("swapred"),
          title="the helper's reduce-adds in the other order (-DLK_EXP_SWAPRED)",
          builds={"swapred": ("LK_EXP_SWAPRED",)}, commit="c301da5", runs=("20261203T134832Z-h200-c301da5bdf",),
          plan={"shapes": _SHAPES, "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
                "launches": [[256, 3, 5], [256, 1, 5]], "pairs": 3, "repeats": 10},
          prediction="the EPI=5 split launches at nt=512 +2-4%, stream-K at 11008 x 4096 +1-3%",
          verdict="wrong: q4_K +0.5-1.1%, q6_K -1.7..-0.1% at nt=512, up to -4.7% at nt=4096",
          retired=_retired("wgmma_swapred", "LK_EXP_SWAPRED lost", commit="c301da5")),
    _step(number=20, name="kscan", aliases=("wgmma_kscan",), what="kscan_ab", run=R.step_wgmma_kscan,
          view=view_kscan, plan=limits.KSCAN_AB, commit="b243ed7",
          runs=("20261203T163237Z-h200-755e1b8212", "20261203T165118Z-h200-b243ed73a1"),
          title="what a launch pays once against what it pays per k: the k scan of the launches of record and cuBLAS",
          prediction="cuBLAS 5.0-6.5 us + 5.3-5.6 ns/k; q4_K's tile split 10.5-12.5 us + 5.2-5.5 ns/k (its nt=512 "
                     "gap all fixed cost); BN=128 5-7 us + 6.2-6.7 (q4_K) / 8.1-8.6 ns/k (q6_K)",
          verdict="cuBLAS 6.1 us + 5.34 ns/k as predicted; the split launch has cuBLAS's cost per k and 4.3-4.7 us "
                  "more fixed cost than BN=128, which pays in the loop: no launch has both halves"),
    _step(number=21, name="kpair", aliases=("wgmma_kpair",), what="kpair_ab", run=R.step_wgmma_kpair,
          view=view_kpair, plan=kpair.KPAIR_AB, builds={"kpair": wb.KPAIR}, commit="76896f2",
          title="one 64-row x 256-token tile per CTA, its k split between the two consumer warpgroups, 2-CTA "
                "clusters multicasting the activations (-DLK_EXP_KPAIR)",
          runs=("20261203T183130Z-h200-8f051ebedb", "20261203T183132Z-h200-8f051ebedb",
                "20261203T183844Z-h200-2dfdfe9c83", "20261203T183846Z-h200-2dfdfe9c83",
                "20261203T184424Z-h200-baabb2de1f", "20261203T184426Z-h200-baabb2de1f",
                "20261203T185051Z-h200-1a0e72a467", "20261203T185114Z-h200-1a0e72a467",
                "20261203T185505Z-h200-76896f2335", "20261203T185507Z-h200-76896f2335",
                "20261203T185615Z-h200-76896f2335"),
          prediction="q4_K nt=512 0.85-1.00x cuBLAS, q6_K 0.75-0.90x at od=4096; nt=4096 within 10% of the best "
                     "launch of record",
          verdict="builds 1-3 wrong (a cluster-scope fence on every remote arrive); the fourth: q4_K 0.88-0.92x, q6_K "
                  "0.81-0.84x at od=4096 -- about what the split had; its loop 10-16% slower at nt=4096; not kept"),
    _step(number=22, name="smem", aliases=("wgmma_smem",), what="smem_ncu", run=R.step_wgmma_smem,
          view=view_smem, plan=kpair.HALFB_AB, builds={"kpair": wb.KPAIR, "halfb": kpair.HALFB}, commit="6dd764b",
          title="a shared-memory budget, and what cuBLAS runs (Nsight Compute of the baseline; the half-B ablation "
                "LK_ABLATE_HALFB)",
          runs=("20261204T140317Z-h200-6dd764be1c", "20261204T140317Z-h200-6dd764be1c-2"),
          prediction="the half-B ablation 1.08-1.18x KPAIR at nt=4096, 1.04-1.12x at nt=512; the data banks >= 85% "
                     "of peak for KPAIR",
          verdict="wrong: 0.96-1.05x; no loop of the lab's uses more than 23% of either way's bank peak (cuBLAS <= "
                  "39%); cuBLAS keeps the tensor pipe 85-95% busy, the lab's loops 53-67%"),
    _step(number=23, name="smemform", aliases=("wgmma_smemform",), what="smemform_ab", run=R.step_wgmma_smemform,
          view=view_smemform, plan={**kpair.SMEMFORM_AB, "ablations": list(kpair.NOCONV)},
          builds={"noconv": kpair.NOCONV}, commit="513243c", runs=("20261204T142127Z-h200-513243c674",),
          title="the shared-memory form without its conversion (LK_ABLATE_NOCONV)",
          prediction="the converters hold the form: its no-conversion build >= 0.95x cuBLAS at nt=512 at three of "
                     "the four shapes",
          verdict="wrong in its either/or: both halves cost; without conversion 0.86-0.90x cuBLAS at od=4096 "
                  "(0.72x at 11008 x 4096), 0.78-0.84x the register form's skeleton"),
    _step(number=24, name="decouple", aliases=("wgmma_decouple",), what="decouple_ab", run=R.step_wgmma_decouple,
          view=view_decouple, plan=kpair.DECOUPLE_AB, commit="c2eb998",
          builds={"kpair": wb.KPAIR, **{k[1:]: v for k, v in kpair.DECOUPLE_ABLATIONS.items()}},
          title="what holds the KPAIR loop: its pair's lock-step or its conversion (LK_ABLATE_HALFB, _DECOUPLE, "
                "_NOCONV)", runs=("20261204T163906Z-h200-c2eb998", "20261204T163906Z-h200-c2eb998-2"),
          prediction="the conversion costs q4_K 1.00-1.06x, q6_K 1.10-1.25x; the lock-step 1.06-1.15x at nt=512; "
                     "without either 0.95-1.05x cuBLAS at 4096 x 4096, nt=512",
          verdict="the lock-step small (1.01-1.05x: wrong), the conversion middling; without either the 64-row CTA is "
                  "0.93-0.97x cuBLAS at 4096 x 4096"),
    _step(number=25, name="kpairtrace", aliases=("wgmma_kpairtrace",), what="kpair_trace", view=view_kpairtrace,
          run=R.step_wgmma_kpairtrace, commit="f2a7460", runs=("20261204T165923Z-h200-f2a7460",),
          builds={"kpair_trace": wb.check_defines(wb.KPAIR + ("LK_EXP_TRACE",)), "bn128_trace": ("LK_EXP_TRACE",)},
          plan={"nt": 512, "shapes": [list(s) for s in R.KPAIR_TRACE_SHAPES]},
          title="where the 64-row CTA's time goes, stamped beside BN=128's (LK_EXP_KPAIR with LK_EXP_TRACE)",
          prediction="KPAIR q4_K cold at 4096 x 4096: setup 0.5-1.0 us, 1.5-2.5 us to its first stage, a loop at "
                     "4,350-4,600 cycles per warpgroup super-block (q6_K 4,700-5,100), finish 1.5-2.5 us",
          verdict="the better loop, more around it: 1.07x (q4_K) / 1.22x (q6_K) the pipe's cycles against BN=128's "
                  "1.27x / 1.90x, with a longer setup, fill and finish"),
    _step(number=26, name="kpairfin", aliases=("wgmma_kpairfin",), what="kpairfin_ab", run=R.step_wgmma_kpairfin,
          view=view_kpairfin, plan=kpair.KPAIR_AB, builds={"kpair": wb.KPAIR, "_fin": wb.KPAIR_FIN},
          title="the KPAIR build's finish by TMA stores, and its exit barrier split (-DLK_EXP_KPAIR_FIN)",
          commit="73bc367", runs=("20261204T171544Z-h200-73bc367", "20261204T171704Z-h200-73bc367"),
          prediction="FIN over KPAIR 1.02-1.05x at nt=512 (od=4096), 1.03-1.07x at 11008 x 4096, 1.04-1.08x at "
                     "nt=4096; KPAIR q4_K 4096 x 4096 from ~0.90x to 0.92-0.95x cuBLAS",
          verdict="real and small: 1.022x / 1.025x at 4096 x 4096 nt=512, 1.005-1.016x elsewhere, none at nt=4096 "
                  "(0.986-1.004x); q4_K 4096 x 4096 0.882x -> 0.902x cuBLAS"),
    _step(number=27, name="kpairearly", aliases=("wgmma_kpairearly",), what="kpairearly", view=view_kpairearly,
          title="the KPAIR build's cold start overlapped with its setup (-DLK_EXP_KPAIR_EARLY, _OVERLAP, "
                "_REQ_PRODUCER, _REQ_CONSUMERS)", commit="ac304f9",
          builds={"_fin": wb.KPAIR_FIN, "_fin_early": wb.KPAIR_FIN + ("LK_EXP_KPAIR_EARLY",),
                  "_fin_overlap": wb.KPAIR_FIN + ("LK_EXP_KPAIR_OVERLAP",),
                  "_fin_overlap_p": wb.KPAIR_FIN + ("LK_EXP_KPAIR_OVERLAP", "LK_EXP_KPAIR_REQ_PRODUCER"),
                  "_fin_overlap_c": wb.KPAIR_FIN + ("LK_EXP_KPAIR_OVERLAP", "LK_EXP_KPAIR_REQ_CONSUMERS")},
          plan=kpair.KPAIR_AB,
          runs=("20261204T202619Z-h200-ed66a4a", "20261204T203358Z-h200-b34bedb", "20261204T203612Z-h200-b34bedb",
                "20261204T204433Z-h200-ac304f9", "20261204T204625Z-h200-ac304f9"),
          prediction="EARLY over FIN 1.01-1.03x at nt=512 at 4096 x 4096 and 11008 x 4096 (the fill from ~1.95 to "
                     "0.9-1.5 us); OVERLAP 1.00-1.02x",
          verdict="wrong: EARLY's setup rose to 3.71 us (the cluster barrier's release waits for the requests), 0.93x "
                  "FIN; OVERLAP and its one-side forms lose too (the producer's box prefetches); none kept",
          retired=_retired("wgmma_kpairearly", "LK_EXP_KPAIR_EARLY / _OVERLAP / _REQ_* lost")),
    _step(number=28, name="halfy", aliases=("wgmma_halfy",), what="halfy_ab", run=R.step_wgmma_halfy,
          view=view_halfy, plan=kpair.KPAIR_AB, commit="9c0b105", runs=("20261204T205701Z-h200-9c0b105",),
          builds={"kpair": wb.KPAIR, "_fin": wb.KPAIR_FIN, "_fin_halfy": wb.FIN_HALFY},
          title="what the float32 Y costs: the FIN form storing half of Y's bytes (LK_ABLATE_HALFY)",
          prediction="HALFY over FIN: nt=512 1.01-1.03x at 4096 x 4096, 1.02-1.04x at 11008 x 4096, 1.005-1.01x at "
                     "the wide ids; nt=4096 1.00-1.02x",
          verdict="at most 2.4%: 1.023x (q4_K) / 1.011x (q6_K) at 4096 x 4096, 1.021x / 1.019x at 11008 x 4096, "
                  "0.997-1.005x at the wide ids, 0.996-1.024x at nt=4096: the float32 Y is not the gap"),
)


def gpu_check_names() -> dict:
    """{gpu check name: run} of the live steps (their aliases, the names ``gpu check --steps`` has taken)."""
    return {a: s.run for s in RECORDS if s.run is not None for a in s.aliases}


def step(sel):
    """One step by number (the first of that number), name or alias."""
    for s in RECORDS:
        if str(sel) in (s.name, str(s.number)) or sel in s.aliases:
            return s
    raise KeyError(f"round 7 has no step {sel!r}")
