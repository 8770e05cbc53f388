"""CPU side of issue 18's memset removal: gemm_dense's cuBLASLt algorithm choice (a fake heuristic behind fakes of
nvmath-python's cuBLAS / cuBLASLt bindings), its recorded fallback, the bindings' call plumbing, argument checks,
and the graph-node census's counting (labkernels.graph_nodes)."""
import ctypes
import logging
import types

import numpy as np
import pytest

from labkernels import blas, errors, gpu, graph_nodes
from labkernels.rounds.r05_wall import graph_census


def test_pick_dense_algo_takes_the_first_candidate_without_split_k_or_workspace():
    cands = [{"state": 0, "workspace": 0, "splitk": 3, "reduction": 1},       # split-K in place: memset counters
             {"state": 15, "workspace": 0, "splitk": 1},                       # not supported
             {"state": 0, "workspace": 4096, "splitk": 1},                     # needs a workspace
             {"state": 0, "workspace": 0, "splitk": 1, "tile": 18},
             {"state": 0, "workspace": 0, "splitk": 1, "tile": 20}]
    i, why = blas.pick_dense_algo(cands)
    assert i == 3 and "#3 of 5" in why
    i, why = blas.pick_dense_algo(cands[:3])
    assert i is None
    assert "#0 splits k 3 ways" in why and "#1 state 15" in why and "#2 needs 4096 B" in why
    assert blas.pick_dense_algo([]) == (None, "the cuBLASLt heuristic returned no algorithm")
    # SPLITK_NUM is int32_t: -1 (read as 4294967295 through a uint32) is not "one part", as before the bindings
    i, why = blas.pick_dense_algo([{"state": 0, "workspace": 0, "splitk": -1, "reduction": 0}, cands[3]])
    assert i == 1 and "#1 of 2" in why


# ---- nvmath-python's cuBLAS / cuBLASLt bindings, faked at their Python surface (names, enum values and the struct
# layout of nvmath 1.0's cublasLt module; the real module's are checked in test_nvmath_bindings_match_cublasLt_h)

class _Err(Exception):
    pass


_RESULT = np.dtype([("algo", [("data_", "<u8", (8,))]), ("workspace_size", "<u8"), ("state", "<i4"),
                    ("waves_count", "<f4"), ("reserved", "<i4", (4,))])


class FakeResults:
    """nvmath.bindings.cublasLt.MatmulHeuristicResult: a numpy-backed array of cublasLtMatmulHeuristicResult_t."""
    live: dict = {}

    def __init__(self, size=1, data=None):
        self._data = np.zeros(size, _RESULT) if data is None else data
        self.ptr = self._data.ctypes.data
        FakeResults.live[self.ptr] = self

    def __getitem__(self, key):
        if isinstance(key, int):
            return FakeResults(data=self._data[key:key + 1])
        return self._data[key].view(np.recarray)

    state = property(lambda self: int(self._data["state"][0]))
    workspace_size = property(lambda self: int(self._data["workspace_size"][0]))
    waves_count = property(lambda self: float(self._data["waves_count"][0]))


def _poke(ptr, value, dtype):
    v = np.array([value], dtype)
    ctypes.memmove(ptr, v.ctypes.data, v.itemsize)


def fake_bindings(cands, create_error=None):
    """(cublas, cublasLt, CudaDataType) fakes recording every call; the heuristic returns ``cands`` (dicts of
    state / workspace / config attributes by blas._LT_CFG's names)."""
    import enum

    calls = []
    cublas = types.SimpleNamespace(
        ComputeType=enum.IntEnum("ComputeType", {"COMPUTE_32F": 68}),
        Operation=enum.IntEnum("Operation", {"N": 0, "T": 1}),
        GemmAlgo=enum.IntEnum("GemmAlgo", {"DEFAULT": -1}), cuBLASError=_Err,
        set_stream=lambda h, s: calls.append(("set_stream", h, s)),
        gemm_ex=lambda *a: calls.append(("gemm_ex", *[int(x) for x in a])))
    cfg = enum.IntEnum("MatmulAlgoConfigAttribute", {"ID": 0, "TILE_ID": 1, "SPLITK_NUM": 2, "REDUCTION_SCHEME": 3,
                                                     "CTA_SWIZZLING": 4, "CUSTOM_OPTION": 5, "STAGES_ID": 6})
    attr_name = {v: k for k, v in blas._LT_CFG.items()}

    def create():
        if create_error:
            raise _Err(create_error)
        return 77

    def heuristic(h, desc, A, B, C, D, pref, count, res_ptr, got_ptr):
        res = FakeResults.live[res_ptr]
        for i, c in enumerate(cands[:count]):
            res._data[i]["algo"]["data_"][0] = i
            res._data[i]["state"] = c.get("state", 0)
            res._data[i]["workspace_size"] = c.get("workspace", 0)
        _poke(got_ptr, min(count, len(cands)), np.int32)
        calls.append(("heuristic", h, desc, A, B, C, D, pref, count))

    def config_get(algo_ptr, attr, buf, size, written):
        i = int(np.frombuffer((ctypes.c_uint64 * 1).from_address(algo_ptr), np.uint64)[0])
        name = attr_name[cfg(attr).name]
        _poke(buf, cands[i].get(name, 1 if name == "splitk" else 0), np.int32 if size == 4 else np.uint64)

    layouts = iter(range(100, 200))
    lt = types.SimpleNamespace(
        cuBLASLtError=_Err, MatmulHeuristicResult=FakeResults, MatmulAlgoConfigAttribute=cfg,
        MatmulDescAttribute=enum.IntEnum("MatmulDescAttribute", {"TRANSA": 3, "TRANSB": 4}),
        MatmulPreferenceAttribute=enum.IntEnum("MatmulPreferenceAttribute", {
            "MAX_WORKSPACE_BYTES": 1, "MIN_ALIGNMENT_A_BYTES": 5, "MIN_ALIGNMENT_B_BYTES": 6,
            "MIN_ALIGNMENT_C_BYTES": 7, "MIN_ALIGNMENT_D_BYTES": 8}),
        get_matmul_desc_attribute_dtype=lambda a: np.int32,
        get_matmul_preference_attribute_dtype=lambda a: np.uint64 if a == 1 else np.uint32,
        get_matmul_algo_config_attribute_dtype=lambda a: np.int32 if a in (0, 2) else np.uint32,
        create=create,
        matmul_desc_create=lambda compute, scale: (calls.append(("desc", int(compute), int(scale))), 11)[1],
        matmul_desc_set_attribute=lambda d, a, buf, size: calls.append(
            ("desc attr", int(a), int(np.frombuffer((ctypes.c_int32 * 1).from_address(buf), np.int32)[0]), size)),
        matrix_layout_create=lambda t, r, c, ld: (calls.append(("layout", int(t), r, c, ld)), next(layouts))[1],
        matmul_preference_create=lambda: 21,
        matmul_preference_set_attribute=lambda p, a, buf, size: calls.append(
            ("pref", int(a), int(np.frombuffer((ctypes.c_uint8 * size).from_address(buf),
                                               np.uint64 if size == 8 else np.uint32)[0]))),
        matmul_preference_destroy=lambda p: calls.append(("pref destroyed", p)),
        matmul_algo_get_heuristic=heuristic, matmul_algo_config_get_attribute=config_get,
        matmul=lambda *a: calls.append(("matmul", *a)))
    cuda_type = enum.IntEnum("CudaDataType", {"CUDA_R_32F": 0, "CUDA_R_16F": 2})
    return cublas, lt, cuda_type, calls


@pytest.fixture
def fresh_plans(monkeypatch):
    monkeypatch.setattr(blas, "_DENSE_PLANS", {})
    monkeypatch.setattr(blas, "_device_id", lambda: 0)
    blas._lt_handle_of.cache_clear()
    yield
    blas._lt_handle_of.cache_clear()


def _use(monkeypatch, cands, **kw):
    cublas, lt, ct, calls = fake_bindings(cands, **kw)
    monkeypatch.setattr(blas, "_bindings", lambda: (cublas, lt, ct))
    return calls


def test_dense_plan_asks_for_no_workspace_and_picks_past_split_k(monkeypatch, fresh_plans):
    calls = _use(monkeypatch, [{"splitk": 2, "reduction": 1, "tile": 15}, {"splitk": 1, "tile": 15, "stages": 19}])
    p = blas.dense_plan(0, 512, 1536, 640, align_a=256, align_b=128, align_d=64)
    assert p.algo is not None and p.info["splitk"] == 1 and p.info["stages"] == 19 and p.info["tile"] == 15
    assert int(np.frombuffer((ctypes.c_uint64 * 1).from_address(p.algo), np.uint64)[0]) == 1   # candidate #1's algo
    assert p.note.startswith("cublasLt: heuristic candidate #1 of 2")
    prefs = {c[1]: c[2] for c in calls if c[0] == "pref"}
    assert prefs == {1: 0, 5: 256, 6: 128, 7: 64, 8: 64}          # no workspace; alignments of A, B, C = D, D
    # gemm_dense's column-major view: A = W (k x od, transposed), B = X^T (k x n), D = Y^T (od x n, fp32)
    assert [c for c in calls if c[0] == "layout"] == [("layout", 0, 640, 1536, 640), ("layout", 0, 640, 512, 640),
                                                     ("layout", 0, 1536, 512, 1536)]
    assert ("desc attr", 3, 1, 4) in calls and ("desc attr", 4, 0, 4) in calls       # TRANSA = T, TRANSB = N
    assert ("desc", 68, 0) in calls and ("pref destroyed", 21) in calls
    (h,) = [c for c in calls if c[0] == "heuristic"]
    assert h[1:] == (77, 11, 100, 101, 102, 102, 21, blas.LT_HEURISTIC_COUNT)
    assert blas.dense_plan(0, 512, 1536, 640, align_a=256, align_b=128, align_d=64) is p     # cached
    assert blas.dense_fallbacks() == []


def test_dense_plan_without_a_fitting_algorithm_falls_back_with_a_note(monkeypatch, fresh_plans, caplog):
    _use(monkeypatch, [{"splitk": 4, "reduction": 1}])
    with caplog.at_level(logging.WARNING, logger="labkernels.gpu"):
        p = blas.dense_plan(0, 512, 1536, 640)
    assert p.algo is None and p.note.startswith("cublasGemmEx runs: none of the 1 cuBLASLt candidates")
    assert "splits k 4 ways" in caplog.text
    assert blas.dense_fallbacks() == [{"device": 0, "type": "f32", "n": 512, "od": 1536, "k": 640, "note": p.note}]


def test_dense_plan_without_a_cublaslt_handle_falls_back_with_a_note(monkeypatch, fresh_plans):
    _use(monkeypatch, [], create_error="CUBLAS_STATUS_NOT_INITIALIZED")
    p = blas.dense_plan(2, 64, 1536, 640)
    assert p.algo is None and p.note == "cublasGemmEx runs: cublasLtCreate failed: CUBLAS_STATUS_NOT_INITIALIZED"
    assert blas.dense_fallbacks()[0]["type"] == "f16"


class _Dev:
    """A host array posing as a CuPy array (data.ptr = its address), for the call plumbing only."""

    def __init__(self, a):
        self.a = a
        self.shape, self.ndim, self.dtype, self.flags = a.shape, a.ndim, a.dtype, a.flags
        self.data = types.SimpleNamespace(ptr=a.ctypes.data)


def _fake_cp(monkeypatch):
    cuda = types.SimpleNamespace(device=types.SimpleNamespace(get_cublas_handle=lambda: 555),
                                 get_current_stream=lambda: types.SimpleNamespace(ptr=999),
                                 Device=lambda: types.SimpleNamespace(id=0))
    monkeypatch.setattr(gpu, "cp", lambda: types.SimpleNamespace(cuda=cuda, empty=lambda s, dtype: _Dev(np.empty(s, dtype))))


def test_gemm_dense_calls_cublas_gemm_ex_through_the_bindings(monkeypatch, fresh_plans):
    calls = _use(monkeypatch, [])
    _fake_cp(monkeypatch)
    x, w = _Dev(np.zeros((5, 64), np.float16)), _Dev(np.zeros((24, 64), np.float16))
    out = blas.gemm_dense(x, w, path="gemm_ex")
    (g,) = [c for c in calls if c[0] == "gemm_ex"]
    # column-major Y^T (od x n) = W^T (stored k x od) X^T: T, N, m=od, n, k; fp16 in, fp32 out, COMPUTE_32F, DEFAULT
    assert g[1:7] == (555, 1, 0, 24, 5, 64) and g[8:11] == (w.data.ptr, 2, 64) and g[11:14] == (x.data.ptr, 2, 64)
    assert g[15:] == (out.data.ptr, 0, 24, 68, -1)
    assert np.frombuffer((ctypes.c_float * 1).from_address(g[7]), np.float32)[0] == 1.0      # alpha
    assert np.frombuffer((ctypes.c_float * 1).from_address(g[14]), np.float32)[0] == 0.0     # beta
    assert calls.index(("set_stream", 555, 999)) < calls.index(g)                    # on the current stream


def test_gemm_dense_lt_runs_the_plan_and_a_cublas_error_is_a_gpu_error(monkeypatch, fresh_plans):
    calls = _use(monkeypatch, [{"splitk": 1, "tile": 15}])
    _fake_cp(monkeypatch)
    x, w = _Dev(np.zeros((5, 64), np.float32)), _Dev(np.zeros((24, 64), np.float32))
    out = _Dev(np.zeros((5, 24), np.float32))
    blas.gemm_dense(x, w, out=out, path="lt")
    (m,) = [c for c in calls if c[0] == "matmul"]
    p = next(iter(blas._DENSE_PLANS.values()))
    assert m[1:3] == (77, 11) and m[4:6] == (w.data.ptr, 100) and m[6:8] == (x.data.ptr, 101)
    assert m[9:13] == (out.data.ptr, 102, out.data.ptr, 102) and m[13:] == (p.algo, 0, 0, 999)

    def fail(*a):
        raise _Err("CUBLAS_STATUS_INVALID_VALUE")

    cublas, lt, ct, _ = fake_bindings([])
    cublas.gemm_ex = fail
    monkeypatch.setattr(blas, "_bindings", lambda: (cublas, lt, ct))
    with pytest.raises(errors.GpuError, match="cublasGemmEx failed: CUBLAS_STATUS_INVALID_VALUE"):
        blas.gemm_dense(x, w, path="gemm_ex")


def test_nvmath_bindings_match_cublasLt_h():
    """Where nvmath-python is installed: the enum values and the heuristic-result layout gemm_dense relies on are
    cublasLt.h's (the values the lab's ctypes code once copied by hand)."""
    lt = pytest.importorskip("nvmath.bindings.cublasLt")
    from nvmath.bindings import cublas

    r = lt.MatmulHeuristicResult(2)
    assert r[1]["algo"].ctypes.data - r.ptr == 96 and r[1].ptr - r.ptr == 96     # sizeof(the result struct)
    assert (lt.MatmulDescAttribute.TRANSA, lt.MatmulDescAttribute.TRANSB) == (3, 4)
    P = lt.MatmulPreferenceAttribute
    assert (P.MAX_WORKSPACE_BYTES, P.MIN_ALIGNMENT_A_BYTES, P.MIN_ALIGNMENT_D_BYTES) == (1, 5, 8)
    assert [lt.MatmulAlgoConfigAttribute[v] for v in blas._LT_CFG.values()] == list(range(7))
    assert (cublas.ComputeType.COMPUTE_32F, cublas.GemmAlgo.DEFAULT, cublas.Operation.T) == (68, -1, 1)


def test_gemm_dense_checks_its_arguments_before_the_gpu():
    x, w = np.zeros((4, 8), np.float32), np.zeros((3, 8), np.float32)
    with pytest.raises(ValueError, match="path must be one of"):
        blas.gemm_dense(x, w, path="cublas")
    with pytest.raises(errors.ShapeError, match="do not chain"):
        blas.gemm_dense(x, np.zeros((3, 7), np.float32))
    with pytest.raises(errors.ShapeError, match="one type"):
        blas.gemm_dense(x, w.astype(np.float16))
    with pytest.raises(errors.ShapeError, match="C-contiguous"):
        blas.gemm_dense(np.zeros((8, 4), np.float32).T, w)
    with pytest.raises(errors.ShapeError, match="out must be"):
        blas.gemm_dense(x, w, out=np.zeros((4, 3), np.float16))


def test_align_is_the_largest_power_of_two_up_to_256():
    assert [blas._align(p) for p in (0, 4096, 256 * 7, 128, 6, 3)] == [256, 256, 256, 128, 2, 1]


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
    v = graph_census.check(good, [])
    assert v["dense_lt_vs_gemm_ex_time"] == {"attn_qkv nt=512 f32": 0.9}
    assert v["ok"] and v["memsets_attn_qkv_nt512_f32_gemm_ex"] == 1 and v["memsets_attn_qkv_nt512_f32_lt"] == 0
    v = graph_census.check([_dense_row("lt", 1, lt_note="cublasLt: ...")], [])
    assert not v["ok"] and "1 memset node" in v["problems"][0]
    v = graph_census.check([_dense_row("lt", lt_note="cublasGemmEx runs: no candidate")], [])
    assert not v["ok"]
    v = graph_census.check([_dense_row("gemm_ex", within_gate=False, rel_err_f64=0.1)], [])
    assert not v["ok"] and "from float64" in v["problems"][0]


def test_check_lists_sdpa_plans_without_memset_and_unavailable_cudnn():
    pol = {"kind": "global", "nt": 512, "dtype": "f16", "graph_bitwise_eager": True}
    sdpa = [{**pol, "plan": "heuristic", "n_memset": 1, "max_rel_vs_prefill": 0.0},
            {**pol, "plan": "no_memset", "n_memset": 0, "max_rel_vs_prefill": 1e-3},
            {"kind": "global", "nt": 512, "plan": "0", "plan_name": "eng0", "n_memset": 1},
            {"kind": "global", "nt": 512, "plan": "1", "plan_name": "eng9", "n_memset": 0},
            {"kind": "global", "nt": 512, "plan": "2", "error": "not supported"}]
    v = graph_census.check([], sdpa)
    assert v["ok"] and v["sdpa_plans_without_memset"] == ["global nt=512 plan 1 (eng9)"]
    assert v["memsets_sdpa_global_nt512_heuristic"] == 1 and v["memsets_sdpa_global_nt512_no_memset"] == 0
    sdpa[1]["max_rel_vs_prefill"] = 5e-3                     # > 2 x attention.PARITY_TOL["f16"]
    v = graph_census.check([], sdpa)
    assert not v["ok"] and "from the heuristic plan" in v["problems"][0]
    v = graph_census.check([], [{"kind": "all", "plan": "all", "error": "AttentionUnavailable: no frontend"}])
    assert not v["ok"] and "no frontend" in v["problems"][0]


def test_cudnn_plan_policy_is_checked_before_the_library():
    from labkernels import attention

    assert attention.CUDNN_PLAN in attention.CUDNN_PLANS == ("heuristic", "no_memset")
    with pytest.raises(ValueError, match="cuDNN plan must be one of"):
        attention.Cudnn(None, "f16", plan="fastest")


def test_graph_nodes_is_a_gpu_check_step():
    from labkernels.rounds import r05_wall

    assert "graph_nodes" in r05_wall.STEPS and callable(r05_wall.step_graph_nodes)


def test_memset_regions_are_not_read_where_the_graph_owns_the_memory():
    ms = {"type": "MEMSET", "name": "", "dst": 4096, "bytes": 64, "height": 1}
    assert graph_nodes._memsets_zero_after([]) == ""
    assert graph_nodes._memsets_zero_after([ms, {"type": "MEM_ALLOC"}]) == "not read (graph-owned memory)"
    assert graph_nodes._memsets_zero_after([{**ms, "height": 4}]) == "not read (2-D)"


def test_gpu_check_sets_the_dense_path_and_cudnn_plan_for_its_steps(monkeypatch):
    import argparse

    from labkernels import attention, gpu_cli

    monkeypatch.setattr(blas, "DENSE_PATH", "lt")
    monkeypatch.setattr(attention, "CUDNN_PLAN", "heuristic")
    gpu_cli._set_paths(argparse.Namespace(dense_path=None, cudnn_plan=None))
    assert (blas.DENSE_PATH, attention.CUDNN_PLAN) == ("lt", "heuristic")
    gpu_cli._set_paths(argparse.Namespace(dense_path="gemm_ex", cudnn_plan="no_memset"))
    assert (blas.DENSE_PATH, attention.CUDNN_PLAN) == ("gemm_ex", "no_memset")
