"""One number per fact: the figures of record read from the recorded runs, each naming its run; a root without
them is a clear error."""
import pytest

from labkernels import facts, records


def test_the_prefill_of_record_is_the_graph_runs_fused_median():
    f = facts.prefill()
    run = records.load("prefill", f.run_id)
    t = run.table("throughput")
    rows = t[(t.model == "synthetic-7b") & (t.nt == 3325) & (t.variant == "graph-fused")]
    assert f.value == pytest.approx(rows.tok_per_s.median()) and len(rows) >= 3
    assert f.run_id in f.text() and "captured graph" in f.text() and f.text().startswith(f"{f.value:,.0f} tok/s")
    # the newest graph run with the cuDNN frontend: no later run of the same kind
    later = [r for r in records.list_runs("prefill") if r.run_id > f.run_id and r.has("throughput")
             and "variant" in r.table("throughput") and "synthetic-7b" in set(r.table("throughput").model)]
    from labkernels.peers import with_cudnn

    assert all(not with_cudnn(r) for r in later)
    no = facts.prefill_without_cudnn()
    assert no is None or ("not the figure of record" in no.text() and no.run_id != f.run_id)


def test_vs_llama_ratios_are_the_record_runs_over_llama_bench():
    f = facts.prefill()
    v = facts.prefill_vs_llama()
    assert set(v) >= {512, 3325} and all(x.run_id == f.run_id for x in v.values())
    assert v[3325].value == pytest.approx(f.value / float(v[3325].how.split("flash attention on, ")[1].split(" tok/s")[0]
                                                             .replace(",", "")), rel=2e-4)
    assert v[3325].shown.endswith("x") and "peers run" in v[3325].how
    t = facts.vs_llama_text(v)
    assert t.startswith(f"nt=512: {v[512].shown}; nt=3325: {v[3325].shown} (llama-bench") and t.count("peers run") == 1


def test_gemm_benchmark_of_record_names_its_run_and_point():
    tops, vs = facts.gemm("q4_K", 4096, 11008, 4096)
    assert tops.run_id == vs.run_id == facts.gemm_run().run_id
    assert 100 < tops.value < 1000 and 0.3 < vs.value < 2 and vs.shown.endswith("x cuBLAS fp16")
    with pytest.raises(facts.FactError, match="no point q4_K 1x1"):
        facts.gemm("q4_K", 1, 1, 4096)


def test_a_root_without_runs_is_a_clear_error(tmp_path):
    with pytest.raises(facts.FactError, match="no prefill_graph run of synthetic-7b"):
        facts.prefill(root=tmp_path)
    with pytest.raises(facts.FactError, match="no wgmma benchmark run"):
        facts.gemm_run(root=tmp_path)


def test_targets_say_where_they_came_from_and_no_issue():
    for t in facts.TARGETS.values():
        assert t.source and "issue" not in (t.what + t.source).lower()
    assert facts.TARGETS["prefill_7b"].text(True).startswith(">= 2x 8,428") and facts.TARGETS["prefill_7b"].text(True).endswith(": met")
