"""Round 5 arithmetic on CPU: classes from tagged launch records, busy vs wall, the priced queue."""
import pandas as pd
import numpy as np
import pytest

from labkernels.rounds.r05_wall import decompose as D
from labkernels.trace import OpInfo


def _records():
    # two layers: a q6_K GEMM, attention GEMMs and a norm, plus one untagged launch
    recs, t = [], 0
    def add(name, op_id, op, cls, dur, layer=0, weight=None):
        nonlocal t
        recs.append({"name": name, "start": t, "end": t + dur, "duration_ns": dur, "op_id": op_id, "op": op,
                     "cls": cls, "layer": layer, "weight": weight, "correlation_id": len(recs)})
        t += dur + 100
    add("q6k_expb_kernel<4,210,0,2>", 1, "ffn_down", "gemm_q6k", 4_000_000, 0, "blk.0.ffn_down.weight")
    add("sm80_xmma_gemm", 2, "attn_qk", "attention_gemm", 2_000_000, 0)
    add("rmsnorm_kernel<1>", 3, "attn_norm", "norm", 500_000, 0)
    add("q6k_expb_kernel<4,210,0,2>", 4, "ffn_down", "gemm_q6k", 4_000_000, 1, "blk.1.ffn_down.weight")
    add("cupy_copy", None, None, "untagged", 100_000, None)
    ops = [OpInfo(1, "ffn_down", "gemm_q6k", 0, "blk.0.ffn_down.weight", macs=2 * 10**9),
           OpInfo(2, "attn_qk", "attention_gemm", 0, flops=4 * 10**9), OpInfo(3, "attn_norm", "norm", 0),
           OpInfo(4, "ffn_down", "gemm_q6k", 1, "blk.1.ffn_down.weight", macs=2 * 10**9)]
    return recs, ops


def test_class_table_sums_to_busy_and_normalizes():
    recs, ops = _records()
    df = D.classify(recs)
    bw = D.busy_wall(df, wall_ms=11.0)
    assert bw["busy_ms"] == pytest.approx(10.6) and bw["valid"]
    t = D.class_table(df, ops, bw["wall_ms"], n_tokens=1000)
    assert t.busy_ms.sum() == pytest.approx(bw["busy_ms"])
    g = t.loc["gemm_q6k:ffn_down"]
    assert g.launches == 2 and g.gmac == pytest.approx(4.0) and g.us_per_gmac == pytest.approx(8000 / 4.0)
    assert t.loc["attention_gemm"].gflop_attn == pytest.approx(4.0)
    assert "untagged" in t.index  # nothing is dropped
    assert not D.busy_wall(df, wall_ms=20.0)["valid"]  # a 47% gap invalidates the decomposition


def test_priority_queue_prices():
    recs, ops = _records()
    df = D.classify(recs)
    t = D.class_table(df, ops, 11.0, 1000)
    refs = pd.DataFrame([{"class": "gemm_q6k:ffn_down", "nt": 1000, "od": 1, "id": 1, "us_per_gmac": 500.0}])
    q = D.full_queue(t.reset_index().rename(columns={"index": "class"}), refs, wall_ms=11.0, n_tokens=1000).set_index("class")
    # q6_K: 8 ms now, 4 GMAC at 500 us/GMAC = 2 ms -> 6 ms recoverable -> 1000 tok / 5 ms
    assert q.loc["gemm_q6k:ffn_down"].recoverable_ms == pytest.approx(6.0)
    assert q.loc["gemm_q6k:ffn_down"].tok_s_ceiling == pytest.approx(1000 / 0.005)
    # attention: 4 GFLOP at the fp16 rate implied by the refs (2e3/500 = 4 TFLOPS) = 1 ms -> 1 ms recoverable
    assert q.loc["attention_gemm"].ms_at_ref == pytest.approx(1.0)
    assert q.loc["attention_gemm"].recoverable_ms == pytest.approx(1.0)
    # a hidden tax is added back to the wall
    q2 = D.priority_queue(t, {"gemm_q6k:ffn_down": 500.0}, 11.0, 1000, hidden_tax_ms={"gemm_q6k:ffn_down": 1.0})
    assert q2.iloc[0].wall_after_ms == pytest.approx(11.0 - 6.0 + 1.0)


def test_recorded_decompositions_are_valid():
    """The committed H200 decompositions: classes sum to busy within 1% and busy is within 5% of wall."""
    from labkernels import records

    runs = records.list_runs("decompose")
    assert runs, "no recorded decomposition"
    for r in runs:
        bw = r.table("busy_wall").iloc[0]
        c = r.table("classes")
        assert abs(c.busy_ms.sum() - bw.busy_ms) <= 0.01 * bw.busy_ms
        assert bw.valid and abs(bw.gap_frac) <= D.VALID_GAP


def test_host_overhead_untraced_takes_the_interleaved_walls():
    import pandas as pd

    from labkernels.rounds.r05_wall.decompose import host_overhead_untraced

    thr = pd.DataFrame({"model": ["m"] * 5 + ["x"], "nt": [512] * 6,
                        "variant": ["graph-fused"] * 3 + ["eager-fused"] * 2 + ["graph-fused"],
                        "mode": ["graph"] * 3 + ["eager"] * 2 + ["graph"], "wall_ms": [3.3, 3.2, 3.4, 9.0, 9.0, 7.0]})
    bw = pd.DataFrame({"model": ["m", "m"], "nt": [512, 512], "variant": ["eager-unfused", "graph-fused"],
                       "mode": ["eager", "graph"], "busy_replay_ms": [float("nan"), 3.1], "wall_ms": [20.0, 3.6]})
    t = host_overhead_untraced(thr, bw)
    assert len(t) == 1 and t.rounds[0] == 3 and abs(t.wall_ms[0] - 3.3) < 1e-12        # its model, variant, mode only
    assert abs(t.host_frac[0] - 0.2 / 3.3) < 1e-12 and abs(t.host_overhead_ms[0] - 0.2) < 1e-12


def test_host_overhead_splits_into_outside_and_inside_the_graph():
    """With the graph's own event span: wall - traced busy splits into the time outside the graph's execution (per
    untraced forward) and the idle inside it; the traced replays' own gaps are kept beside them."""
    import pandas as pd

    from labkernels.rounds.r05_wall.decompose import host_overhead_untraced

    walls = [3.36, 3.35, 3.34]
    thr = pd.DataFrame({"model": ["m"] * 3, "nt": [512] * 3, "variant": ["graph-fused"] * 3, "mode": ["graph"] * 3,
                        "wall_ms": walls, "gpu_span_ms": [w - 0.12 for w in walls],
                        "host_outside_ms": [0.12, 0.13, 0.11]})
    bw = pd.DataFrame({"model": ["m"], "nt": [512], "variant": ["graph-fused"], "mode": ["graph"],
                       "busy_replay_ms": [3.15], "idle_replay_ms": [0.25], "wall_ms": [3.4]})
    t = host_overhead_untraced(thr, bw).iloc[0]
    assert t.host_overhead_ms == pytest.approx(0.20) and t.host_frac == pytest.approx(0.20 / 3.35)
    assert t.host_outside_ms == pytest.approx(0.12) and t.graph_idle_ms == pytest.approx(0.08)
    assert t.host_outside_ms + t.graph_idle_ms == pytest.approx(t.host_overhead_ms)
    assert t.graph_idle_traced_ms == 0.25
    t2 = host_overhead_untraced(thr.drop(columns=["gpu_span_ms", "host_outside_ms"]), bw).iloc[0]
    assert np.isnan(t2.host_outside_ms) and t2.host_frac == pytest.approx(0.20 / 3.35)


def test_host_overhead_paired_with_the_traced_replays():
    """Where the decomposition timed an untraced forward just before each traced replay, host_frac_paired is the wall
    of those minus the same busy; runs without them leave it NaN."""
    import pandas as pd

    from labkernels.rounds.r05_wall.decompose import host_overhead_untraced

    thr = pd.DataFrame({"model": ["m"] * 3, "nt": [512] * 3, "variant": ["graph-fused"] * 3, "mode": ["graph"] * 3,
                        "wall_ms": [17.6, 17.5, 17.7]})
    bw = pd.DataFrame({"model": ["m"], "nt": [512], "variant": ["graph-fused"], "mode": ["graph"],
                       "busy_replay_ms": [16.2], "wall_paired_ms": [16.45], "wall_ms": [17.6]})
    t = host_overhead_untraced(thr, bw).iloc[0]
    assert t.host_frac == pytest.approx(1.4 / 17.6) and t.host_frac_paired == pytest.approx(0.25 / 16.45)
    t2 = host_overhead_untraced(thr, bw.drop(columns=["wall_paired_ms"])).iloc[0]
    assert np.isnan(t2.host_frac_paired)


def test_graph_run_history_takes_the_latest_runs_and_each_variants_options(tmp_path, monkeypatch):
    """graph_run_history: newest run first, at most ``last`` runs of that model, each graph variant's options its
    own over the run's recorded defaults (absent options off), eager rows and superseded variants left out."""
    import pandas as pd

    from labkernels import prefill_runs, records
    from labkernels.rounds.r05_wall import decompose

    def run(variants, defaults=None, models=("m",)):
        r = records.new_run("prefill", {"what": "graph", "variants": variants,
                                        **({"option_defaults": defaults} if defaults else {})}, root=tmp_path)
        thr, bw = [], []
        for mdl in models:
            for v in variants:
                mode = "eager" if v.startswith("eager") else "graph"
                thr.append({"model": mdl, "nt": 512, "variant": v, "mode": mode, "wall_ms": 3.3})
                bw.append({"model": mdl, "nt": 512, "variant": v, "mode": mode, "wall_ms": 3.4,
                           "busy_replay_ms": 3.1 if mode == "graph" else float("nan")})
        r.append("throughput", thr)
        r.append("decompose_busy_wall", bw)
        r.append("graphs", [{"model": models[0], "nt": 512, "pdl": False}])
        r.finish()
        return r

    old = run({"eager-unfused": {"graph": False}, "graph-fused": {"graph": None}, "graph-fused-pdl": {"pdl": True}},
              defaults={"pdl": False, "memsets_as_kernels": False, "ids_from_host": False})
    new = run({"graph-fused": {"graph": None}, "graph-fused-f32dense": {"other_f16": False}},
              defaults={"pdl": False, "memsets_as_kernels": False, "ids_from_host": False, "other_f16": True})
    run({"graph-fused": {"graph": None}}, models=("other",))
    h = decompose.graph_run_history("m", last=4, root=tmp_path)
    assert list(h.run.unique()) == [new.run_id, old.run_id]             # newest first; the other model's run not
    assert set(h.variant) == {"graph-fused", "graph-fused-f32dense", "graph-fused-pdl"}    # no eager rows
    f = h.set_index(["run", "variant"])
    assert f.loc[(new.run_id, "graph-fused"), "other_f16"] and not f.loc[(new.run_id, "graph-fused-f32dense"), "other_f16"]
    assert not f.loc[(old.run_id, "graph-fused"), "other_f16"] and f.loc[(old.run_id, "graph-fused-pdl"), "pdl"]
    assert f.loc[(new.run_id, "graph-fused"), "host_frac"] == pytest.approx(0.2 / 3.3)
    assert list(decompose.graph_run_history("m", last=1, root=tmp_path).run.unique()) == [new.run_id]
    commit = str(new.provenance.get("git_commit", ""))
    monkeypatch.setattr(decompose, "SUPERSEDED", {(commit[:7], "graph-fused-f32dense"): "test"})
    h2 = decompose.graph_run_history("m", last=4, root=tmp_path)
    assert "graph-fused-f32dense" not in set(h2.variant) and "graph-fused-pdl" in set(h2.variant)
    assert decompose.graph_run_history("nobody", root=tmp_path).empty
    # the attention path: from the throughput rows where they name it, else what auto resolved to at that commit
    assert set(h.attention) == {"cudnn"} and decompose._auto_attention("1a431eef1d") == "lab+cudnn"
    lab = records.new_run("prefill", {"what": "graph", "variants": {"graph-fused": {"graph": None}}}, root=tmp_path)
    lab.append("throughput", [{"model": "m", "nt": 512, "variant": "graph-fused", "mode": "graph", "wall_ms": 3.3,
                               "attention": "lab+cudnn", "attention_ran": "lab"}])
    lab.append("decompose_busy_wall", [{"model": "m", "nt": 512, "variant": "graph-fused", "mode": "graph",
                                        "wall_ms": 3.4, "busy_replay_ms": 3.1}])
    lab.finish()
    h3 = decompose.graph_run_history("m", last=1, root=tmp_path)
    assert list(h3.run) == [lab.run_id] and list(h3.attention) == ["lab+cudnn"] and list(h3.attention_ran) == ["lab"]
    assert h.attention_ran.isna().all()                 # runs that do not record the routes taken
    # the newest run of a model that has a table
    assert prefill_runs.latest_graph_run("m", "decompose_busy_wall", root=tmp_path).run_id == lab.run_id
    assert prefill_runs.latest_graph_run("m", "graphs", root=tmp_path).run_id == new.run_id
    assert prefill_runs.latest_graph_run("other", "graphs", root=tmp_path).meta["params"]["variants"] == {
        "graph-fused": {"graph": None}}
    assert prefill_runs.latest_graph_run("nobody", "graphs", root=tmp_path) is None
    # an A/B step's run (kernel rows, no variant) is not a graph run, with or without the cuDNN frontend
    ab = records.new_run("prefill", {"ab": ["int8", "auto"]}, root=tmp_path)
    ab.append("throughput", [{"model": "m", "nt": 512, "kernel": k, "tok_per_s": 1.0, "attention": "lab"}
                             for k in ("int8", "auto")])
    ab.finish()
    assert prefill_runs.latest_graph_run("m", "throughput", root=tmp_path, cudnn=False) is None
    assert prefill_runs.latest_graph_run("m", "throughput", root=tmp_path).run_id == lab.run_id


def test_with_cudnn_tells_a_run_without_the_frontend():
    """The pages of record read prefill runs made with the whole GPU stack: a run whose default variants ran the lab's
    attention kernel alone (auto without a usable cuDNN frontend) is told apart; rows that do not name the path (older
    runs) and routed / cuDNN runs count as with it."""
    import types

    import pandas as pd

    from labkernels.peers import with_cudnn

    def run(rows):
        return types.SimpleNamespace(table=lambda name: pd.DataFrame(rows))

    assert not with_cudnn(run([{"variant": "graph-fused", "attention": "lab"},
                                         {"variant": "eager-fused", "attention": "lab"}]))
    assert with_cudnn(run([{"variant": "graph-fused", "attention": "lab+cudnn"},
                                     {"variant": "graph-fused-cudnnattn", "attention": "cudnn"}]))
    assert with_cudnn(run([{"variant": "graph-fused", "wall_ms": 1.0}]))     # no attention column
    assert with_cudnn(run([{"variant": "auto", "attention": "lab"}]))         # no default graph variant
    # the A/B step's runs (prefill_r7: a kernel column, no variant): told apart by qmatmul auto's rows
    assert not with_cudnn(run([{"kernel": "int8", "attention": "lab"}, {"kernel": "auto", "attention": "lab"}]))
    assert with_cudnn(run([{"kernel": "int8", "attention": "lab"},
                                     {"kernel": "auto", "attention": "lab+cudnn"}]))
    assert with_cudnn(run([{"kernel": "auto", "tok_per_s": 1.0}]))           # older A/B runs: not named
