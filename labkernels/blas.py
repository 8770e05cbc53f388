"""Dense products on cuBLAS (split from ``gpu.py``, issue 42): fp16 matmuls through CuPy (:func:`matmul_f16`,
:func:`bmm_f16`) and :func:`gemm_dense` -- one cuBLAS call that a CUDA graph may capture, through nvmath-python's
cuBLAS / cuBLASLt bindings (:func:`_bindings`), with its per-shape cuBLASLt plans (:class:`DensePlan`,
:func:`dense_plan`, :func:`dense_fallbacks`). The prefill and the decode multiply their dequantized weights, and the
benchmarks their cuBLAS baselines, here."""

from __future__ import annotations

import logging
from functools import lru_cache

import numpy as np

from . import gpu
from .errors import GpuError, ShapeError


def matmul_f16(x16, w16, out=None):
    """cuBLAS fp16 through cupy.matmul: [nt, id] x [od, id]^T -> fp16 [nt, od]."""
    c = gpu.cp()
    return c.matmul(x16, w16.T, out=out)


def bmm_f16(A, B, out=None):
    """out[b] = A[b] @ B[b] for C-contiguous fp16 [batch, M, K] x [batch, K, N] -> fp16 [batch, M, N]:
    one cuBLAS strided-batched GEMM on the tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F).
    (CuPy's batched ``matmul`` upcasts fp16 operands to fp32 and runs fp32 GEMMs.)"""
    c = gpu.cp()
    from cupy.cuda import cublas

    if A.dtype != np.float16 or B.dtype != np.float16:
        raise ShapeError(f"bmm_f16 takes float16 operands, got {A.dtype} and {B.dtype}")
    if A.ndim != 3 or B.ndim != 3 or A.shape[0] != B.shape[0] or A.shape[2] != B.shape[1]:
        raise ShapeError(f"bmm_f16 shapes {A.shape} x {B.shape} do not chain")
    if not (A.flags.c_contiguous and B.flags.c_contiguous):
        raise ShapeError("bmm_f16 needs C-contiguous operands")
    batch, M, K = A.shape
    N = B.shape[2]
    if out is None:
        out = c.empty((batch, M, N), dtype=c.float16)
    elif out.shape != (batch, M, N) or out.dtype != np.float16 or not out.flags.c_contiguous:
        raise ShapeError(f"out must be C-contiguous float16 {(batch, M, N)}")
    handle = c.cuda.device.get_cublas_handle()
    cublas.setStream(handle, c.cuda.get_current_stream().ptr)   # CuPy's wrapper: refused under graph capture
    one, zero = np.array(1.0, np.float32), np.array(0.0, np.float32)
    r16 = 2                                                     # CUDA_R_16F
    compute = getattr(cublas, "CUBLAS_COMPUTE_32F", 68)
    algo = getattr(cublas, "CUBLAS_GEMM_DEFAULT", -1)
    # row-major C = A B is column-major C^T = B^T A^T: (N x K)(K x M) with leading dims N, K, N
    cublas.gemmStridedBatchedEx(handle, 0, 0, N, M, K, one.ctypes.data, B.data.ptr, r16, N, K * N,
                                A.data.ptr, r16, K, M * K, zero.ctypes.data, out.data.ptr, r16, N, M * N,
                                batch, compute, algo)
    return out



def _bindings():
    """(nvmath.bindings.cublas, nvmath.bindings.cublasLt, nvmath.CudaDataType): nvmath-python's typed bindings of
    the cuBLAS and cuBLASLt C APIs (function pointers, enums, struct types from the libraries' headers), bound to the
    libcublas CuPy loaded: CuPy's cuBLAS is initialized first, and the bindings' loader (cuda.pathfinder) takes a
    library already loaded in the process before it searches for one. They call cuBLAS directly, so a call may be
    captured into a CUDA graph (CuPy's own wrappers call ``setStream`` first, which refuses to run while a stream
    captures -- cuBLAS itself captures fine)."""
    gpu.cp().cuda.device.get_cublas_handle()          # CuPy loads and initializes its libcublas first
    try:
        import nvmath
        from nvmath.bindings import cublas, cublasLt
    except ImportError as e:
        raise GpuError(f"gemm_dense needs nvmath-python's cuBLAS bindings (pip install nvmath-python; the gpu "
                       f"extra): {e}") from None
    return cublas, cublasLt, nvmath.CudaDataType


def dense_type(dtype) -> int:
    """The ``cudaDataType`` of gemm_dense's float32 / float16 operands (:func:`dense_plan`'s ``t_in``)."""
    dt = _bindings()[2]
    return int(dt.CUDA_R_16F if np.dtype(dtype) == np.float16 else dt.CUDA_R_32F)


def cublas_libraries() -> dict:
    """Which libcublas / libcublasLt the bindings call (cuda.pathfinder's record: path and whether the library was
    in the process before it looked), and their versions."""
    from cuda.pathfinder import load_nvidia_dynamic_lib

    cublas, lt, _ = _bindings()
    out = {}
    for name in ("cublas", "cublasLt"):
        d = load_nvidia_dynamic_lib(name)
        out[name] = {"path": d.abs_path, "already_loaded": bool(d.was_already_loaded_from_elsewhere)}
    out["cublas"]["version"] = int(cublas.get_version(int(gpu.cp().cuda.device.get_cublas_handle())))
    out["cublasLt"]["version"] = int(lt.get_version())
    return out


#: alpha = 1 and beta = 0 (host scalars, read when a call is made or captured)
_ONE, _ZERO = np.ones(1, np.float32), np.zeros(1, np.float32)


def _gemm_ex_capturable(transa, transb, m, n, k, A, atype, lda, B, btype, ldb, C, ctype, ldc):
    """cublasGemmEx (alpha 1, beta 0, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) on CuPy's cuBLAS handle and the current
    stream, through :func:`_bindings` (``transa`` / ``transb``: True = transposed)."""
    cublas, _, _ = _bindings()
    c = gpu.cp()
    handle = int(c.cuda.device.get_cublas_handle())
    op = lambda t: cublas.Operation.T if t else cublas.Operation.N  # noqa: E731
    try:
        cublas.set_stream(handle, int(c.cuda.get_current_stream().ptr))
        cublas.gemm_ex(handle, op(transa), op(transb), m, n, k, _ONE.ctypes.data, A, atype, lda, B, btype, ldb,
                       _ZERO.ctypes.data, C, ctype, ldc, cublas.ComputeType.COMPUTE_32F, cublas.GemmAlgo.DEFAULT)
    except cublas.cuBLASError as e:
        raise GpuError(f"cublasGemmEx failed: {e}") from None


#: gemm_dense's paths: "lt" = cublasLtMatmul with an algorithm chosen once per shape that does not split k (no
#: split-K reduction, so no memset of its counters before the GEMM: one graph node instead of two), "gemm_ex" =
#: cublasGemmEx with cuBLAS's own choice (which splits k at some shapes, e.g. Gemma's stacked QKV at nt=512).
#: The default is gemm_ex: in the same-session A/B on the H200 (prefill runs 20261201T145658Z..145843Z, Gemma 3 270M
#: graph replay) lt removed 18 memset nodes per forward at nt=512 (36 at nt=64) but its no-split kernels made the
#: forward slower: nt=64 1.97-1.99 vs 1.66-1.72 ms, nt=512 3.40-3.50 vs 3.29-3.37 ms
DENSE_PATHS = ("lt", "gemm_ex")
DENSE_PATH = "gemm_ex"


def gemm_dense(x, w, out=None, path: str | None = None):
    """y[n, od] = x[n, id] @ w[od, id]^T for C-contiguous float32 or float16 operands of one type (fp32 accumulate;
    float32 out) as one cuBLAS call on the current stream, through nvmath-python's cuBLAS / cuBLASLt bindings
    (:func:`_bindings`): unlike ``cupy.matmul`` it may be captured into a CUDA graph (CuPy refuses its own cuBLAS
    calls during capture).

    ``path`` (default :data:`DENSE_PATH`, ``"gemm_ex"``): ``"lt"`` runs ``cublasLtMatmul`` with the heuristic's best algorithm
    that does not split k and needs no workspace (:func:`dense_plan`, chosen once per shape and pointer alignment);
    where there is none, or cuBLASLt cannot be reached, it runs ``cublasGemmEx`` and says why in
    :func:`dense_fallbacks` (and the log). ``"gemm_ex"``: ``cublasGemmEx`` with cuBLAS's own algorithm."""
    path = DENSE_PATH if path is None else path
    if path not in DENSE_PATHS:
        raise ValueError(f"gemm_dense path must be one of {DENSE_PATHS}, got {path!r}")
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ShapeError(f"gemm_dense shapes {x.shape} x {w.shape}^T do not chain")
    if x.dtype != w.dtype or x.dtype not in (np.float32, np.float16):
        raise ShapeError(f"gemm_dense takes float32 or float16 operands of one type, got {x.dtype} and {w.dtype}")
    if not (x.flags.c_contiguous and w.flags.c_contiguous):
        raise ShapeError("gemm_dense needs C-contiguous operands")
    n, k = x.shape
    od = w.shape[0]
    if out is not None and (out.shape != (n, od) or out.dtype != np.float32 or not out.flags.c_contiguous):
        raise ShapeError(f"out must be C-contiguous float32 {(n, od)}")
    if out is None:
        out = gpu.cp().empty((n, od), dtype=np.float32)
    if n == 0 or od == 0:
        return out
    t_in, t_out = dense_type(x.dtype), dense_type(np.float32)
    if path == "lt":
        plan = dense_plan(t_in, n, od, k, align_a=_align(w.data.ptr), align_b=_align(x.data.ptr),
                          align_d=_align(out.data.ptr))
        if plan.algo is not None:
            plan.run(w.data.ptr, x.data.ptr, out.data.ptr)
            return out
    # row-major Y = X W^T is column-major Y^T (od x n) = W (od x k, stored as k x od: transposed) X^T (k x n)
    _gemm_ex_capturable(True, False, od, n, k, w.data.ptr, t_in, k, x.data.ptr, t_in, k, out.data.ptr, t_out, od)
    return out


def _align(ptr: int) -> int:
    """The largest power of two (at most 256) that divides a device address: cuBLASLt's algorithms state the
    alignment they need, and the heuristic is told what the operands have."""
    a = 256
    while a > 1 and ptr % a:
        a //= 2
    return a


def _lt_handle():
    """This device's cuBLASLt handle (``cublasLtCreate``, one per device: a handle is tied to the device current at
    its creation), made once and kept for the process."""
    return _lt_handle_of(_device_id())


@lru_cache(maxsize=None)
def _lt_handle_of(device: int) -> int:
    lt = _bindings()[1]
    try:
        return int(lt.create())
    except lt.cuBLASLtError as e:
        raise GpuError(f"cublasLtCreate failed: {e}") from None


#: what a candidate's description holds: its cublasLtMatmulAlgoConfigAttributes_t (nvmath's MatmulAlgoConfigAttribute)
_LT_CFG = {"algo_id": "ID", "tile": "TILE_ID", "splitk": "SPLITK_NUM", "reduction": "REDUCTION_SCHEME",
           "swizzle": "CTA_SWIZZLING", "custom": "CUSTOM_OPTION", "stages": "STAGES_ID"}
LT_HEURISTIC_COUNT = 16                                        # candidates asked of the heuristic


def pick_dense_algo(candidates: list[dict]) -> tuple[int | None, str]:
    """The first candidate (the heuristic's order: best estimate first) that succeeded, needs no workspace and does
    not split k (``splitk`` 0 or 1: nothing to reduce, so no zeroed counters or output before the GEMM); returns
    (its position, why) or (None, why none fits)."""
    if not candidates:
        return None, "the cuBLASLt heuristic returned no algorithm"
    why = []
    for i, c in enumerate(candidates):
        if c.get("state", 0) != 0:
            why.append(f"#{i} state {c['state']}")
        elif c.get("workspace", 0):
            why.append(f"#{i} needs {c['workspace']} B of workspace")
        elif c.get("splitk", 1) not in (0, 1, None):       # > 1, or -1 (int32_t, read as 4294967295 before)
            why.append(f"#{i} splits k {c['splitk']} ways (reduction scheme {c.get('reduction')})")
        else:
            return i, f"heuristic candidate #{i} of {len(candidates)} (the first without split-K)"
    return None, f"none of the {len(candidates)} cuBLASLt candidates runs without split-K and workspace: " + \
        "; ".join(why)


def _set_attr(set_fn, dtype_fn, obj, attr, value) -> None:
    """Set one cuBLASLt descriptor / preference attribute, typed as the binding says the attribute is."""
    buf = np.array(value, dtype=dtype_fn(attr))
    set_fn(obj, attr, buf.ctypes.data, buf.itemsize)


class DensePlan:
    """One cuBLASLt matmul (descriptors + chosen algorithm) of gemm_dense's shape, kept for the process: the
    heuristic runs once, on the host, so the plan can be made (and run) inside a CUDA-graph capture."""

    def __init__(self, t_in: int, n: int, od: int, k: int, aligns: tuple):
        self.key = (t_in, n, od, k, aligns)
        self.algo = None
        self.info: dict = {}
        try:
            cublas, lt, _ = _bindings()
            handle = _lt_handle()
        except GpuError as e:
            self.note = f"cublasGemmEx runs: {e}"
            return
        self.lt, self.handle = lt, handle           # the plan's device's (dense_plan keys plans by device)
        f32 = dense_type(np.float32)
        D, P = lt.MatmulDescAttribute, lt.MatmulPreferenceAttribute
        try:
            self.desc = lt.matmul_desc_create(cublas.ComputeType.COMPUTE_32F, f32)    # fp32 accumulate and scale
            for attr, op in ((D.TRANSA, cublas.Operation.T), (D.TRANSB, cublas.Operation.N)):   # W^T, X as stored
                _set_attr(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, self.desc, attr, int(op))
            # column-major view of gemm_dense (as in cublasGemmEx): A = W stored k x od, B = X^T stored k x n, D od x n
            self.layouts = [lt.matrix_layout_create(t, r, c, ld)
                            for t, r, c, ld in ((t_in, k, od, k), (t_in, k, n, k), (f32, od, n, od))]
            pref = lt.matmul_preference_create()
        except lt.cuBLASLtError as e:
            self.note = f"cublasGemmEx runs: a cuBLASLt descriptor could not be made: {e}"
            return
        res = lt.MatmulHeuristicResult(LT_HEURISTIC_COUNT)
        got = np.zeros(1, np.int32)
        try:
            _set_attr(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref,
                      P.MAX_WORKSPACE_BYTES, 0)                                                  # no workspace
            for attr, a in zip((P.MIN_ALIGNMENT_A_BYTES, P.MIN_ALIGNMENT_B_BYTES, P.MIN_ALIGNMENT_C_BYTES,
                                P.MIN_ALIGNMENT_D_BYTES), aligns):
                _set_attr(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref,
                          attr, a)
            A, B, Dl = self.layouts
            lt.matmul_algo_get_heuristic(handle, self.desc, A, B, Dl, Dl, pref, LT_HEURISTIC_COUNT, res.ptr,
                                         got.ctypes.data)
        except lt.cuBLASLtError as e:
            self.note = f"cublasGemmEx runs: cublasLtMatmulAlgoGetHeuristic failed: {e}"
            return
        finally:
            lt.matmul_preference_destroy(pref)
        self.candidates = [self._describe(res[i]) for i in range(int(got[0]))]
        i, why = pick_dense_algo(self.candidates)
        if i is None:
            self.note = f"cublasGemmEx runs: {why}"
            return
        self._heuristic = res                               # kept: the algorithm every matmul reads lives in it
        self._algo = res[i]["algo"]
        self.algo = int(self._algo.ctypes.data)
        self.info = self.candidates[i]
        self.note = f"cublasLt: {why}"

    def _describe(self, r) -> dict:
        lt = self.lt
        d = {"state": int(r.state), "workspace": int(r.workspace_size), "waves": float(r.waves_count)}
        algo = int(r["algo"].ctypes.data)
        for name, attr in _LT_CFG.items():
            a = lt.MatmulAlgoConfigAttribute[attr]
            buf, written = np.zeros(1, lt.get_matmul_algo_config_attribute_dtype(a)), np.zeros(1, np.uint64)
            try:
                lt.matmul_algo_config_get_attribute(algo, a, buf.ctypes.data, buf.itemsize, written.ctypes.data)
                d[name] = int(buf[0])
            except lt.cuBLASLtError:
                d[name] = None
        return d

    def run(self, w_ptr: int, x_ptr: int, out_ptr: int) -> None:
        A, B, D = self.layouts
        try:
            self.lt.matmul(self.handle, self.desc, _ONE.ctypes.data, w_ptr, A, x_ptr, B, _ZERO.ctypes.data, out_ptr, D,
                           out_ptr, D, self.algo, 0, 0, int(gpu.cp().cuda.get_current_stream().ptr))
        except self.lt.cuBLASLtError as e:
            raise GpuError(f"cublasLtMatmul failed: {e} (shape n={self.key[1]} od={self.key[2]} k={self.key[3]})") \
                from None


_DENSE_PLANS: dict = {}


def _device_id() -> int:
    return int(gpu.cp().cuda.Device().id)


def dense_plan(t_in: int, n: int, od: int, k: int, align_a: int = 256, align_b: int = 256,
               align_d: int = 256) -> DensePlan:
    """The cached :class:`DensePlan` of one gemm_dense shape (input type ``t_in``: :func:`dense_type`, x's rows n,
    w's rows od, depth k) and operand alignments in bytes (A = w, B = x, D = out) on this device; a plan that has no
    algorithm is logged once."""
    key = (_device_id(), t_in, n, od, k, align_a, align_b, align_d)
    p = _DENSE_PLANS.get(key)
    if p is None:
        p = _DENSE_PLANS[key] = DensePlan(t_in, n, od, k, (align_a, align_b, align_d, align_d))
        if p.algo is None:
            logging.getLogger("labkernels.gpu").warning("gemm_dense n=%d od=%d k=%d: %s", n, od, k, p.note)
    return p


def dense_fallbacks() -> list[dict]:
    """Every gemm_dense shape of this process that ran cublasGemmEx instead of cuBLASLt, and why."""
    out = [(k, p) for k, p in _DENSE_PLANS.items() if p.algo is None]
    names = {dense_type(np.float16): "f16", dense_type(np.float32): "f32"} if out else {}
    return [{"device": k[0], "type": names.get(k[1], str(k[1])), "n": k[2], "od": k[3], "k": k[4], "note": p.note}
            for k, p in out]
