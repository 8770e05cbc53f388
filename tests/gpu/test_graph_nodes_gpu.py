"""Issue 18 on the GPU: the memset nodes of the prefill's captured calls (labkernels.graph_nodes)."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.gpu_fast
def test_census_counts_a_captured_memset_and_kernel():
    """The census itself: a memsetAsync and a CuPy kernel captured on a stream are one MEMSET node (its
    destination and size) and one KERNEL node (its name)."""
    import cupy as cp

    from labkernels import graph_nodes

    a = cp.ones(1000, cp.float32)
    s = cp.cuda.Stream(non_blocking=True)

    def work():
        cp.cuda.runtime.memsetAsync(a.data.ptr, 0, 400, s.ptr)
        a[100:] *= 2

    g = graph_nodes.capture(work, s)
    try:
        nodes = graph_nodes.census(g)
    finally:
        graph_nodes.destroy(g)
    sm = graph_nodes.summarize(nodes, {"a": (a.data.ptr, a.nbytes)})
    assert sm["n_memset"] == 1 and sm["memset_bytes"] == 400 and sm["memset_where"] == "a+0"
    assert sm["n_kernel"] == 1 and "multiply" in sm["kernels"]


def test_memsets_become_fill_kernels_that_write_the_same_bytes():
    """memsets_to_kernels: 1-, 2-, 4-byte and 2-D (pitched) memset nodes between CuPy kernels are replaced by the
    lab's fill kernel with the same dependencies; the replay writes exactly what the memsets wrote (the bytes
    around each region untouched) and in the same order relative to the kernels around them."""
    import cupy as cp
    from cuda.bindings import driver as drv

    from labkernels import graph_nodes

    s = cp.cuda.Stream(non_blocking=True)
    b = cp.full(4096, 0x5A, cp.uint8)
    a = cp.arange(64, dtype=cp.float32)

    def work():
        cp.cuda.runtime.memsetAsync(b.data.ptr + 3, 0x11, 101, s.ptr)                       # bytes
        a[:] += 1                                                                           # a kernel between
        assert int(drv.cuMemsetD16Async(b.data.ptr + 200, 0xBEEF, 33, s.ptr)[0]) == 0        # 2-byte elements
        assert int(drv.cuMemsetD32Async(b.data.ptr + 400, 0xCAFEF00D, 17, s.ptr)[0]) == 0    # 4-byte elements
        assert int(drv.cuMemsetD2D8Async(b.data.ptr + 1024, 256, 0x77, 50, 8, s.ptr)[0]) == 0  # 8 rows of 50, pitch 256
        a[:] *= 2

    want = cp.asnumpy(b).copy()
    want[3:104] = 0x11
    want[200:266] = np.frombuffer(np.full(33, 0xBEEF, "<u2").tobytes(), np.uint8)
    want[400:468] = np.frombuffer(np.full(17, 0xCAFEF00D, "<u4").tobytes(), np.uint8)
    for r in range(8):
        want[1024 + 256 * r:1024 + 256 * r + 50] = 0x77
    g = graph_nodes.capture(work, s)
    try:
        before = graph_nodes.summarize(graph_nodes.census(g))
        rew = graph_nodes.memsets_to_kernels(g)
        after = graph_nodes.census(g)
        sm = graph_nodes.summarize(after)
        ge = cp.cuda.runtime.graphInstantiate(g)
        try:
            cp.cuda.runtime.graphLaunch(ge, s.ptr)
            s.synchronize()
        finally:
            cp.cuda.runtime.graphExecDestroy(ge)
    finally:
        graph_nodes.destroy(g)
    assert before["n_memset"] == 4 and rew == {"replaced": 4, "bytes": 101 + 66 + 68 + 400, "left": 0, "kept": 0,
                                               "kept_why": ""}
    assert sm["n_memset"] == 0 and sm["n_kernel"] == before["n_kernel"] + 4
    assert sum("fill_kernel" in r["name"] for r in after) == 4
    assert np.array_equal(cp.asnumpy(b), want)
    assert np.array_equal(cp.asnumpy(a), (np.arange(64, dtype=np.float32) + 1) * 2)


def test_gemm_dense_lt_has_no_memset_at_gemmas_qkv_and_matches_gemm_ex():
    """Gemma's stacked Q/K/V GEMM (x [nt, 640] fp32 @ w [1536, 640]^T): cublasGemmEx puts a memset before the
    GEMM at nt=512 (split-K, round 5's decomposition 20261201T132809Z); gemm_dense's cuBLASLt path has none at
    nt 64 / 512 / 3325, is within the dense parity gate of float64 and, where both paths ran the same kernel
    without a memset, bitwise equal to cublasGemmEx."""
    from labkernels.rounds.r05_wall import graph_census

    pts = [("attn_qkv", nt, "f32") for nt in (64, 512, 3325)]
    rows = graph_census.dense_census(pts, reps=2, launches=1, progress=lambda *a: None)
    by = {(r["nt"], r["path"]): r for r in rows}
    assert by[(512, "gemm_ex")]["n_memset"] >= 1
    for nt in (64, 512, 3325):
        old, new = by[(nt, "gemm_ex")], by[(nt, "lt")]
        assert new["n_memset"] == 0 and new["n_kernel"] == 1, new
        assert new["lt_note"].startswith("cublasLt") and new["lt_splitk"] == 1
        assert new["within_gate"] and old["within_gate"] and new["graph_bitwise_eager"]
        if old["n_memset"] == 0 and old["kernels"] == new["kernels"]:
            assert new["bitwise_vs_gemm_ex"], (nt, old["kernels"])
    assert graph_census.check(rows, [])["ok"]


def test_prefill_graph_lt_dense_gemms_drop_memsets(model_path):
    """Gemma 3 270M's captured forward at nt=512, replayed under CUPTI: with gemm_dense's cuBLASLt path the replay
    has fewer memsets than with cublasGemmEx (one per layer's stacked Q/K/V GEMM fewer), and the logits agree
    within gemm_dense's parity gate with the same top token."""
    import cupy as cp

    from labkernels import blas, prefill_runs, synthetic
    from labkernels.prefill import GpuModel, PrefillOptions
    from labkernels.trace import CuptiTracer

    m = synthetic.load_model(str(model_path))
    toks = prefill_runs.prompt_tokens(m, 512)
    memsets, logits = {}, {}
    old = blas.DENSE_PATH
    try:
        for path in ("gemm_ex", "lt"):
            blas.DENSE_PATH = path
            gm = GpuModel(m, opts=PrefillOptions(attn_f16=True, graph=True))
            logits[path] = cp.asnumpy(gm.forward(toks)).astype(np.float64)     # captures the graph
            with CuptiTracer() as tr:
                gm.forward(toks)
                cp.cuda.runtime.deviceSynchronize()
            assert gm.last_mode == "graph"
            memsets[path] = sum(r["name"] == "memset" for r in tr.records()[0])
            n_layer = gm.cfg.n_layer
            gm.free_graphs()
    finally:
        blas.DENSE_PATH = old
    assert memsets["lt"] <= memsets["gemm_ex"] - n_layer, memsets
    d = np.abs(logits["lt"] - logits["gemm_ex"]).max() / np.abs(logits["gemm_ex"]).max()
    assert d <= 1e-3 and logits["lt"].argmax() == logits["gemm_ex"].argmax(), d


def test_sdpa_census_replays_the_plans_and_no_memset_keeps_parity():
    """cuDNN SDPA of Gemma's layer kinds captured alone: the heuristic plan (the prefill's) and the no_memset policy
    replay bitwise equal to their eager calls; no_memset either runs a plan without a memset node within the
    attention parity tolerance of the heuristic plan, or keeps the heuristic plan (bitwise the same output) and says
    why no candidate fits; every candidate plan that runs agrees within that tolerance."""
    from labkernels import attention
    from labkernels.rounds.r05_wall import graph_census

    st = attention.status()["cudnn"]
    if isinstance(st, str):
        pytest.skip(f"cuDNN frontend: {st}")
    rows = graph_census.sdpa_census(nts=(512,), plan_nts=(512,), reps=2, launches=1, budget_s=60,
                                   progress=lambda *a: None)
    v = graph_census.check([], rows)
    assert v["ok"], v["problems"]
    tol = 2 * attention.PARITY_TOL["f16"]
    for r in rows:
        if r["plan"] == "no_memset":
            if "heuristic plan:" in r["plan_name"]:          # kept the heuristic plan: it says why, runs the same
                assert "none of the" in r["plan_name"] and r["bitwise_vs_prefill"], r["plan_name"]
            else:
                assert r["n_memset"] == 0 and r["max_rel_vs_prefill"] <= tol, r
        elif r["plan"] == "heuristic":
            assert r["n_kernel"] >= 1
    ran = [r for r in rows if r["plan"] not in graph_census.POLICY_ROWS + ("all",) and "error" not in r]
    assert ran, rows
    assert all(r["max_rel_vs_prefill"] <= tol for r in ran), [(r["plan_name"], r["max_rel_vs_prefill"]) for r in ran]
