"""Round 9's ledger claims that say how they are read from their step's run (``check``): every such claim of the
pending steps names variants / points its step's plan records, and tables.claim_value / step_claims_table read them
from a run: ratios over points, the empty launch's floor, the generation A/B's ratio and its token check, gates."""
import pytest

from labkernels import records
from labkernels.rounds import r09_decode as r9


def _name(mt, warps, form, S):
    return (f"gemv_m{mt}w{warps}" + ("" if S is None else "_sw" if S == "wave" else f"_s{S}")
            + ("" if form == 0 else f"_f{form}"))


@pytest.mark.parametrize("step, plan", [(6, "STEP6_PLAN"), (7, "STEP7_PLAN")])
def test_the_pending_steps_claims_name_what_their_plans_record(step, plan):
    plan = getattr(r9, plan)
    names = {_name(*v) for v in plan["launches"]} | set(plan["baselines"])
    pts = {(q, od, id_, nt, act) for q in plan["qtypes"] for od, id_ in plan["shapes"] for nt in plan["nts"]
           for act in plan["acts"]}
    s = next(x for x in r9.LEDGER if x["step"] == step)
    assert all("check" in c for c in s["prediction"])
    for c in s["prediction"]:
        ch = c["check"]
        if ch["kind"] == "ratio":
            assert {ch["num"], ch["den"]} <= names, (c["what"], names)
            assert all((p["qtype"], p["od"], p["id"], p["nt"], p["act"]) in pts for p in ch["points"]), c["what"]
        elif ch["kind"] == "us":
            assert ch["variant"] in names


def _bench_run(tmp_path, times):
    rows = []
    for (od, id_, nt, act, var), us in times.items():
        for p in range(3):
            rows.append({"qtype": "q4_K", "od": od, "id": id_, "nt": nt, "act": act, "variant": var,
                         "family": "empty" if var == "empty" else "gemv_kq", "MT": 1, "WARPS": 4, "S": 1, "FORM": 0,
                         "WAVE": 0, "pair": p, "median_us": us + 0.01 * (p - 1), "bytes": 0 if var == "empty" else 1})
    with records.recording("decode", {"what": "gemv_step6"}, root=tmp_path / "data") as run:
        run.append("copy", [{"bytes": 2, "median_us": 1.0, "tb_per_s": 3.0}])
        run.append("gemv_bench", rows)
    return run


def test_step_claims_table_reads_ratios_floor_and_gate_from_a_step6_run(tmp_path):
    s = next(x for x in r9.LEDGER if x["step"] == 6)
    f1, f3 = "gemv_m1w4_sw_f1", "gemv_m1w8_s1_f3"
    times = {(4096, 4096, 1, "f16", f1): 10.0, (4096, 4096, 1, "f16", f3): 9.4,
             (4096, 14336, 1, "f16", f1): 19.0, (4096, 14336, 1, "f16", f3): 19.2,
             (14336, 4096, 1, "f16", f1): 20.0, (14336, 4096, 1, "f16", f3): 22.4,
             (11008, 4096, 1, "f16", f1): 17.0, (11008, 4096, 1, "f16", f3): 23.0,
             (4096, 14336, 1, "f32", f1): 22.4, (4096, 14336, 1, "f32", f3): 20.9,
             (4096, 4096, 1, "f16", "empty"): 2.6, (4096, 14336, 1, "f16", "empty"): 2.8}
    t = r9.step_claims_table(s, _bench_run(tmp_path, times)).set_index("claim")
    rows = [c["what"] for c in s["prediction"]]
    assert t.loc[rows[0], "measured"] == "0.94" and t.loc[rows[0], "verdict"] == "within"
    assert t.loc[rows[1], "verdict"] == "within"                                  # 19.2 / 19.0
    assert t.loc[rows[2], "measured"] == "1.12-1.35" and t.loc[rows[2], "verdict"] == "partly"
    assert t.loc[rows[3], "verdict"] == "not measured"                            # nt=8 f32 not in this run
    assert t.loc[rows[4], "measured"] == "2.7" and t.loc[rows[4], "verdict"] == "within"
    assert t.loc[rows[5], "verdict"] == "passed" and t.loc[rows[5], "predicted"] == "passes"
    with pytest.raises(ValueError, match="unknown claim check"):
        r9.claim_value(_bench_run(tmp_path, times), {"kind": "nope"})


def test_step_claims_table_reads_the_generation_ab_and_its_token_check(tmp_path):
    s = next(x for x in r9.LEDGER if x["step"] == 8)
    rows = []
    for model, base in (("synthetic-7b", 280.0), ("synthetic-gemma3", 1140.0)):
        for rep in range(3):
            for pf, gain in ((False, 1.0), (True, 1.08)):
                rows.append({"model": model, "n_prompt": 512, "n_new": 128, "rep": rep, "gemv_pf": pf,
                             "tok_per_s": base * gain, "first_tokens": "1 2 3" if model == "synthetic-7b" or not pf
                             else "1 2 4"})
    with records.recording("decode", {"what": "gemv_step8"}, root=tmp_path / "data") as run:
        run.append("generate", rows)
    t = r9.step_claims_table(s, run).set_index("claim")
    what = [c["what"] for c in s["prediction"]]
    assert t.loc[what[0], "measured"] == "1.08" and t.loc[what[0], "verdict"] == "within"
    assert t.loc[what[2], "verdict"] == "FAILED"                   # gemma's PF=1 generated other tokens
    assert r9.step_run({"runs": ["20990101T000000Z-h200-0000000"]}) is None


def test_a_peer_run_that_names_no_card_is_never_taken_for_one(tmp_path):
    """Round 9 pairs the lab's figures with llama.cpp's only on the same card: a peers run whose provenance and params
    name no GPU (recorded here, on a machine without one) is not taken for any card, only when no card is asked."""
    from labkernels.rounds.r09_decode import state, tables

    root = tmp_path / "data"
    with records.recording("peers", {"what": "test"}, root=root) as run:
        run.append("mmq", [{"type": "q4_K", "m": 4096, "k": 14336, "n": 1, "us_per_run": 16.0}])
    assert run.gpu_name is None
    assert state.peer_mmvq_us("NVIDIA H200", "q4_K", 4096, 14336, 1, root) is None
    assert state.peer_mmvq_us(None, "q4_K", 4096, 14336, 1, root) == (16.0, run.run_id)
    assert [r.run_id for r in tables.peer_runs_on(None, "mmq", root)] == [run.run_id]
    assert list(tables.peer_runs_on("NVIDIA H200", "mmq", root)) == []


def test_the_page_summarises_every_point_in_one_row_a_shape_and_folds_the_rest():
    """Page 09's every-point section: point_summary gives one row per (type, shape, activations) whose nt=1 / nt=8
    figures are best_per_point's own, and the full table goes behind a <details> disclosure (report.folded)."""
    import numpy as np
    import pandas as pd

    from labkernels import report
    from labkernels.rounds import r09_decode as r9

    best = pd.DataFrame([
        {"qtype": "q4_K", "od": 4096, "id": 4096, "act": "f16", "nt": nt, "variant": f"v{nt}", "median_us": us,
         "frac_copy": fc, "cublas_us": cb}
        for nt, us, fc, cb in [(1, 10.0, 0.5, 14.0), (2, 11.0, 0.45, 14.5), (8, 14.0, 0.36, 15.0)]]
        + [{"qtype": "q6_K", "od": 4096, "id": 14336, "act": "f32", "nt": 1, "variant": "w", "median_us": 20.0,
            "frac_copy": 0.55, "cublas_us": 33.0}])
    s = r9.point_summary(best)
    assert len(s) == 2 and list(s["type"]) == ["q4_K", "q6_K"]
    a = s.iloc[0]
    assert (a["nt=1 config"], a["nt=1 (µs)"], a["nt=8 (µs)"], a["nt=8 / nt=1"]) == ("v1", 10.0, 14.0, 1.4)
    assert a["nt=1 of the copy line"] == 0.5 and a["cuBLAS fp16 nt=1 (µs)"] == 14.0
    assert np.isnan(s.iloc[1]["nt=8 (µs)"])                 # not timed at nt=8: said, not invented
    h = report.folded(report.table(best), "Every point (4 rows) <all>").data
    assert h.startswith('<details class="lk-fold"><summary>Every point (4 rows) &lt;all&gt;</summary>')
    assert h.count("<tr>") >= 5 and h.rstrip().endswith("</details>")
