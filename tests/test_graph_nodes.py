"""CPU side of issue 18's memset removal: gemm_dense's cuBLASLt algorithm choice (a fake heuristic), its recorded
fallback, argument checks, and the graph-node census's counting (labkernels.graph_nodes)."""
import ctypes
import logging

import numpy as np
import pytest

from labkernels import gpu, graph_nodes


def test_pick_dense_algo_takes_the_first_candidate_without_split_k_or_workspace():
    cands = [{"state": 0, "workspace": 0, "splitk": 3, "reduction": 1},       # split-K in place: memset counters
             {"state": 15, "workspace": 0, "splitk": 1},                       # not supported
             {"state": 0, "workspace": 4096, "splitk": 1},                     # needs a workspace
             {"state": 0, "workspace": 0, "splitk": 1, "tile": 18},
             {"state": 0, "workspace": 0, "splitk": 1, "tile": 20}]
    i, why = gpu.pick_dense_algo(cands)
    assert i == 3 and "#3 of 5" in why
    i, why = gpu.pick_dense_algo(cands[:3])
    assert i is None
    assert "#0 splits k 3 ways" in why and "#1 state 15" in why and "#2 needs 4096 B" in why
    assert gpu.pick_dense_algo([]) == (None, "the cuBLASLt heuristic returned no algorithm")


def test_heuristic_result_has_cublasLt_h_layout():
    R = gpu._lt_result_type()
    assert ctypes.sizeof(R) == 96              # cublasLtMatmulAlgo_t (8 x uint64) + size_t + int + float + 4 ints
    assert (R.workspaceSize.offset, R.state.offset, R.wavesCount.offset) == (64, 72, 76)


class FakeLt:
    """cuBLASLt's C calls as gpu.DensePlan makes them (ctypes byref arguments: ``._obj`` is the object)."""

    def __init__(self, cands):
        self.cands, self.prefs, self.calls = cands, {}, []

    def cublasLtMatmulDescCreate(self, ref, compute, scale):
        self.calls.append(("desc", compute, scale))
        return 0

    def cublasLtMatmulDescSetAttribute(self, desc, attr, ref, size):
        self.calls.append(("trans", attr, ref._obj.value))
        return 0

    def cublasLtMatrixLayoutCreate(self, ref, t, rows, cols, ld):
        self.calls.append(("layout", t, rows, cols, ld))
        return 0

    def cublasLtMatmulPreferenceCreate(self, ref):
        return 0

    def cublasLtMatmulPreferenceSetAttribute(self, pref, attr, ref, size):
        self.prefs[attr] = ref._obj.value
        return 0

    def cublasLtMatmulPreferenceDestroy(self, pref):
        self.calls.append(("pref destroyed",))
        return 0

    def cublasLtMatmulAlgoGetHeuristic(self, h, desc, A, B, C, D, pref, count, res, got):
        for i, c in enumerate(self.cands[:count]):
            res[i].algo[0] = i
            res[i].state = c.get("state", 0)
            res[i].workspaceSize = c.get("workspace", 0)
        got._obj.value = min(count, len(self.cands))
        return 0

    def cublasLtMatmulAlgoConfigGetAttribute(self, algo, attr, buf, size, written):
        name = {v: k for k, v in gpu._LT_CFG.items()}[attr]
        buf._obj.value = self.cands[algo._obj.algo[0]].get(name, 1 if name == "splitk" else 0)
        return 0


@pytest.fixture
def fresh_plans(monkeypatch):
    monkeypatch.setattr(gpu, "_DENSE_PLANS", {})
    monkeypatch.setattr(gpu, "_device_id", lambda: 0)
    monkeypatch.setattr(gpu, "_lt_handle", lambda: None)


def test_dense_plan_asks_for_no_workspace_and_picks_past_split_k(monkeypatch, fresh_plans):
    lt = FakeLt([{"splitk": 2, "reduction": 1, "tile": 15}, {"splitk": 1, "tile": 15, "stages": 19}])
    monkeypatch.setattr(gpu, "_libcublaslt", lambda: lt)
    p = gpu.dense_plan(0, 512, 1536, 640, align_a=256, align_b=128, align_d=64)
    assert p.algo is not None and p.info["splitk"] == 1 and p.info["stages"] == 19
    assert p.note.startswith("cublasLt: heuristic candidate #1 of 2")
    assert lt.prefs[gpu._LT_PREF_MAX_WORKSPACE] == 0
    assert [lt.prefs[gpu._LT_PREF_MIN_ALIGN[m]] for m in "ABCD"] == [256, 128, 64, 64]
    # gemm_dense's column-major view: A = W (k x od, transposed), B = X^T (k x n), D = Y^T (od x n, fp32)
    assert ("layout", 0, 640, 1536, 640) in lt.calls and ("layout", 0, 640, 512, 640) in lt.calls
    assert ("layout", 0, 1536, 512, 1536) in lt.calls
    assert ("trans", gpu._LT_DESC_TRANSA, 1) in lt.calls and ("trans", gpu._LT_DESC_TRANSB, 0) in lt.calls
    assert ("desc", 68, 0) in lt.calls and ("pref destroyed",) in lt.calls
    assert gpu.dense_plan(0, 512, 1536, 640, align_a=256, align_b=128, align_d=64) is p     # cached
    assert gpu.dense_fallbacks() == []


def test_dense_plan_without_a_fitting_algorithm_falls_back_with_a_note(monkeypatch, fresh_plans, caplog):
    monkeypatch.setattr(gpu, "_libcublaslt", lambda: FakeLt([{"splitk": 4, "reduction": 1}]))
    with caplog.at_level(logging.WARNING, logger="labkernels.gpu"):
        p = gpu.dense_plan(0, 512, 1536, 640)
    assert p.algo is None and p.note.startswith("cublasGemmEx runs: none of the 1 cuBLASLt candidates")
    assert "splits k 4 ways" in caplog.text
    assert gpu.dense_fallbacks() == [{"device": 0, "type": "f32", "n": 512, "od": 1536, "k": 640, "note": p.note}]


def test_dense_plan_without_cublaslt_falls_back_with_a_note(monkeypatch, fresh_plans):
    def missing():
        raise gpu.GpuError("libcublasLt is not mapped in this process")

    monkeypatch.setattr(gpu, "_libcublaslt", missing)
    p = gpu.dense_plan(2, 64, 1536, 640)
    assert p.algo is None and p.note == "cublasGemmEx runs: libcublasLt is not mapped in this process"
    assert gpu.dense_fallbacks()[0]["type"] == "f16"


def test_gemm_dense_checks_its_arguments_before_the_gpu():
    x, w = np.zeros((4, 8), np.float32), np.zeros((3, 8), np.float32)
    with pytest.raises(ValueError, match="path must be one of"):
        gpu.gemm_dense(x, w, path="cublas")
    with pytest.raises(gpu.ShapeError, match="do not chain"):
        gpu.gemm_dense(x, np.zeros((3, 7), np.float32))
    with pytest.raises(gpu.ShapeError, match="one type"):
        gpu.gemm_dense(x, w.astype(np.float16))
    with pytest.raises(gpu.ShapeError, match="C-contiguous"):
        gpu.gemm_dense(np.zeros((8, 4), np.float32).T, w)
    with pytest.raises(gpu.ShapeError, match="out must be"):
        gpu.gemm_dense(x, w, out=np.zeros((4, 3), np.float16))


def test_align_is_the_largest_power_of_two_up_to_256():
    assert [gpu._align(p) for p in (0, 4096, 256 * 7, 128, 6, 3)] == [256, 256, 256, 128, 2, 1]


def test_summarize_counts_node_types_and_places_memsets():
    nodes = [{"type": "MEMSET", "name": "", "dst": 1000, "bytes": 16},
             {"type": "KERNEL", "name": "sm80_xmma_gemm", "dst": 0, "bytes": 0},
             {"type": "MEMSET", "name": "", "dst": 50, "bytes": 8},
             {"type": "MEMCPY", "name": "", "dst": 0, "bytes": 0}]
    s = graph_nodes.summarize(nodes, {"out": (990, 100)})
    assert (s["nodes"], s["n_kernel"], s["n_memset"], s["n_memcpy"]) == (4, 1, 2, 1)
    assert s["kernels"] == "sm80_xmma_gemm" and s["memset_bytes"] == 24
    assert s["memset_where"] == "out+10; elsewhere"
    assert graph_nodes.summarize([])["n_memset"] == 0


def _dense_row(path, n_memset=0, **kw):
    return {"shape": "attn_qkv", "nt": 512, "dtype": "f32", "path": path, "n_memset": n_memset,
            "graph_bitwise_eager": True, "within_gate": True, "rel_err_f64": 1e-6, **kw}


def test_check_flags_a_memset_or_fallback_on_the_lt_path():
    good = [_dense_row("gemm_ex", 1, us_per_call=10.0),
            _dense_row("lt", lt_note="cublasLt: heuristic candidate #0 of 8", us_per_call=9.0)]
    v = graph_nodes.check(good, [])
    assert v["dense_lt_vs_gemm_ex_time"] == {"attn_qkv nt=512 f32": 0.9}
    assert v["ok"] and v["memsets_attn_qkv_nt512_f32_gemm_ex"] == 1 and v["memsets_attn_qkv_nt512_f32_lt"] == 0
    v = graph_nodes.check([_dense_row("lt", 1, lt_note="cublasLt: ...")], [])
    assert not v["ok"] and "1 memset node" in v["problems"][0]
    v = graph_nodes.check([_dense_row("lt", lt_note="cublasGemmEx runs: no candidate")], [])
    assert not v["ok"]
    v = graph_nodes.check([_dense_row("gemm_ex", within_gate=False, rel_err_f64=0.1)], [])
    assert not v["ok"] and "from float64" in v["problems"][0]


def test_check_lists_sdpa_plans_without_memset_and_unavailable_cudnn():
    pol = {"kind": "global", "nt": 512, "dtype": "f16", "graph_bitwise_eager": True}
    sdpa = [{**pol, "plan": "heuristic", "n_memset": 1, "max_rel_vs_prefill": 0.0},
            {**pol, "plan": "no_memset", "n_memset": 0, "max_rel_vs_prefill": 1e-3},
            {"kind": "global", "nt": 512, "plan": "0", "plan_name": "eng0", "n_memset": 1},
            {"kind": "global", "nt": 512, "plan": "1", "plan_name": "eng9", "n_memset": 0},
            {"kind": "global", "nt": 512, "plan": "2", "error": "not supported"}]
    v = graph_nodes.check([], sdpa)
    assert v["ok"] and v["sdpa_plans_without_memset"] == ["global nt=512 plan 1 (eng9)"]
    assert v["memsets_sdpa_global_nt512_heuristic"] == 1 and v["memsets_sdpa_global_nt512_no_memset"] == 0
    sdpa[1]["max_rel_vs_prefill"] = 5e-3                     # > 2 x attention.PARITY_TOL["f16"]
    v = graph_nodes.check([], sdpa)
    assert not v["ok"] and "from the heuristic plan" in v["problems"][0]
    v = graph_nodes.check([], [{"kind": "all", "plan": "all", "error": "AttentionUnavailable: no frontend"}])
    assert not v["ok"] and "no frontend" in v["problems"][0]


def test_cudnn_plan_policy_is_checked_before_the_library():
    from labkernels import attention

    assert attention.CUDNN_PLAN in attention.CUDNN_PLANS == ("heuristic", "no_memset")
    with pytest.raises(ValueError, match="cuDNN plan must be one of"):
        attention.Cudnn(None, "f16", plan="fastest")


def test_graph_nodes_is_a_gpu_check_step():
    from labkernels import gpu_cli

    assert "graph_nodes" in gpu_cli.STEPS and callable(gpu_cli.step_graph_nodes)


def test_memset_regions_are_not_read_where_the_graph_owns_the_memory():
    ms = {"type": "MEMSET", "name": "", "dst": 4096, "bytes": 64, "height": 1}
    assert graph_nodes._memsets_zero_after([]) == ""
    assert graph_nodes._memsets_zero_after([ms, {"type": "MEM_ALLOC"}]) == "not read (graph-owned memory)"
    assert graph_nodes._memsets_zero_after([{**ms, "height": 4}]) == "not read (2-D)"


def test_gpu_check_sets_the_dense_path_and_cudnn_plan_for_its_steps(monkeypatch):
    import argparse

    from labkernels import attention, gpu_cli

    monkeypatch.setattr(gpu, "DENSE_PATH", "lt")
    monkeypatch.setattr(attention, "CUDNN_PLAN", "heuristic")
    gpu_cli._set_paths(argparse.Namespace(dense_path=None, cudnn_plan=None))
    assert (gpu.DENSE_PATH, attention.CUDNN_PLAN) == ("lt", "heuristic")
    gpu_cli._set_paths(argparse.Namespace(dense_path="gemm_ex", cudnn_plan="no_memset"))
    assert (gpu.DENSE_PATH, attention.CUDNN_PLAN) == ("gemm_ex", "no_memset")
