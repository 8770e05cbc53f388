"""The lab's cuBLAS / cuBLASLt calls as they were before nvmath-python's bindings replaced them (labkernels/gpu.py
at 4caa4be: ctypes, the libraries found in /proc/self/maps, enum values and the heuristic-result struct copied from
cublasLt.h), kept here -- outside labkernels/ -- only as the reference the GPU test compares the new path with,
bit for bit, on the same inputs. Not imported by the lab."""
from functools import lru_cache

from labkernels.blas import _align, _device_id
from labkernels.errors import GpuError
from labkernels.gpu import cp


@lru_cache(maxsize=None)
def _libcublas():
    """The libcublas CuPy loaded (found in this process's mappings), through ctypes: CuPy's own wrappers call
    ``setStream`` first, which refuses to run while a stream captures a CUDA graph -- cuBLAS itself captures fine."""
    import ctypes

    cp().cuda.device.get_cublas_handle()   # make sure CuPy has loaded and initialized it
    paths = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "/libcublas.so" in ln})
    if not paths:
        raise GpuError("libcublas is not mapped in this process")
    lib = ctypes.CDLL(paths[0])
    lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cublasGetStream_v2.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.cublasGemmEx.argtypes = ([ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_int])
    return lib


def _gemm_ex_capturable(transa, transb, m, n, k, A, atype, lda, B, btype, ldb, C, ctype, ldc):
    """cublasGemmEx (alpha 1, beta 0, fp32 compute) on the current stream through :func:`_libcublas`."""
    import ctypes

    c = cp()
    lib = _libcublas()
    handle = ctypes.c_void_p(int(c.cuda.device.get_cublas_handle()))
    stream = ctypes.c_void_p(int(c.cuda.get_current_stream().ptr))
    st = lib.cublasSetStream_v2(handle, stream)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    st = st or lib.cublasGemmEx(handle, transa, transb, m, n, k, ctypes.byref(one), A, atype, lda, B, btype, ldb,
                                ctypes.byref(zero), C, ctype, ldc, 68, -1)   # CUBLAS_COMPUTE_32F, GEMM_DEFAULT
    if st:
        raise GpuError(f"cublasGemmEx failed: status {st}")


@lru_cache(maxsize=None)
def _libcublaslt():
    """libcublasLt through ctypes: the one beside the libcublas CuPy loaded (its dependency), else the first one
    mapped in this process. Its handles are made with its own cublasLtCreate (:func:`_lt_handle`)."""
    import ctypes
    import os

    here = os.path.dirname(_libcublas()._name)
    paths = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "/libcublasLt.so" in ln})
    if not paths:
        raise GpuError("libcublasLt is not mapped in this process")
    lib = ctypes.CDLL(next((p for p in paths if os.path.dirname(p) == here), paths[0]))
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.cublasLtCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_int]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
    lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                               ctypes.c_int64]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
    lib.cublasLtMatmulPreferenceDestroy.argtypes = [vp]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, ctypes.c_int, vp,
                                                   ctypes.POINTER(ctypes.c_int)]
    lib.cublasLtMatmulAlgoConfigGetAttribute.argtypes = [vp, ctypes.c_int, vp, sz, ctypes.POINTER(sz)]
    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp]
    return lib


def _lt_result_type():
    """cublasLtMatmulHeuristicResult_t (cublasLt.h): algo (uint64 x 8), workspaceSize, state, wavesCount, int x 4."""
    import ctypes

    class Result(ctypes.Structure):
        _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                    ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]
    return Result


#: cublasLt.h enum values used here
_LT_DESC_TRANSA, _LT_DESC_TRANSB = 3, 4                        # cublasLtMatmulDescAttributes_t
_LT_PREF_MAX_WORKSPACE = 1                                     # cublasLtMatmulPreferenceAttributes_t
_LT_PREF_MIN_ALIGN = {"A": 5, "B": 6, "C": 7, "D": 8}


def _lt_handle():
    """This device's cuBLASLt handle (cublasLtCreate of :func:`_libcublaslt`, one per device: a handle is tied to the
    device current at its creation), made once and kept for the process."""
    return _lt_handle_of(_device_id())


@lru_cache(maxsize=None)
def _lt_handle_of(device: int):
    import ctypes

    h = ctypes.c_void_p()
    st = _libcublaslt().cublasLtCreate(ctypes.byref(h))
    if st:
        raise GpuError(f"cublasLtCreate failed: status {st}")
    return h


_LT_CFG = {"algo_id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6}
LT_HEURISTIC_COUNT = 16                                        # candidates asked of the heuristic


def pick_dense_algo(candidates: list[dict]) -> tuple[int | None, str]:
    """The first candidate (the heuristic's order: best estimate first) that succeeded, needs no workspace and does
    not split k (``splitk`` <= 1: nothing to reduce, so no zeroed counters or output before the GEMM); returns
    (its position, why) or (None, why none fits)."""
    if not candidates:
        return None, "the cuBLASLt heuristic returned no algorithm"
    why = []
    for i, c in enumerate(candidates):
        if c.get("state", 0) != 0:
            why.append(f"#{i} state {c['state']}")
        elif c.get("workspace", 0):
            why.append(f"#{i} needs {c['workspace']} B of workspace")
        elif c.get("splitk", 1) > 1:
            why.append(f"#{i} splits k {c['splitk']} ways (reduction scheme {c.get('reduction')})")
        else:
            return i, f"heuristic candidate #{i} of {len(candidates)} (the first without split-K)"
    return None, f"none of the {len(candidates)} cuBLASLt candidates runs without split-K and workspace: " + \
        "; ".join(why)


class DensePlan:
    """One cuBLASLt matmul (descriptors + chosen algorithm) of gemm_dense's shape, kept for the process: the
    heuristic runs once, on the host, so the plan can be made (and run) inside a CUDA-graph capture."""

    def __init__(self, t_in: int, n: int, od: int, k: int, aligns: tuple):
        import ctypes

        self.key = (t_in, n, od, k, aligns)
        self.algo = None
        self.info: dict = {}
        try:
            lib = _libcublaslt()
            handle = _lt_handle()
        except GpuError as e:
            self.note = f"cublasGemmEx runs: {e}"
            return
        self.lib, self.handle = lib, handle         # the plan's device's (dense_plan keys plans by device)
        vp = ctypes.c_void_p

        def ok(st, what):
            if st:
                raise GpuError(f"{what} failed: cuBLAS status {st}")

        self.desc = vp()
        ok(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), 68, 0), "cublasLtMatmulDescCreate")  # COMPUTE_32F, R_32F
        for attr, v in ((_LT_DESC_TRANSA, 1), (_LT_DESC_TRANSB, 0)):                                 # W^T, X as stored
            x = ctypes.c_int32(v)
            ok(lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(x), 4), "cublasLtMatmulDescSetAttribute")
        # column-major view of gemm_dense (as in cublasGemmEx): A = W stored k x od, B = X^T stored k x n, D od x n
        self.layouts = [vp() for _ in range(3)]
        for lay, (t, r, cc, ld) in zip(self.layouts, ((t_in, k, od, k), (t_in, k, n, k), (0, od, n, od))):
            ok(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), t, r, cc, ld), "cublasLtMatrixLayoutCreate")
        pref = vp()
        ok(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        try:
            ws = ctypes.c_uint64(0)
            ok(lib.cublasLtMatmulPreferenceSetAttribute(pref, _LT_PREF_MAX_WORKSPACE, ctypes.byref(ws), 8),
               "cublasLtMatmulPreferenceSetAttribute")
            for name, a in zip("ABCD", aligns):
                v = ctypes.c_uint32(a)
                ok(lib.cublasLtMatmulPreferenceSetAttribute(pref, _LT_PREF_MIN_ALIGN[name], ctypes.byref(v), 4),
                   "cublasLtMatmulPreferenceSetAttribute")
            res = (_lt_result_type() * LT_HEURISTIC_COUNT)()
            got = ctypes.c_int(0)
            A, B, D = self.layouts
            st = lib.cublasLtMatmulAlgoGetHeuristic(handle, self.desc, A, B, D, D, pref, LT_HEURISTIC_COUNT,
                                                    res, ctypes.byref(got))
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        if st:
            self.note = f"cublasGemmEx runs: cublasLtMatmulAlgoGetHeuristic failed: status {st}"
            return
        self.candidates = [self._describe(r) for r in res[:got.value]]
        i, why = pick_dense_algo(self.candidates)
        if i is None:
            self.note = f"cublasGemmEx runs: {why}"
            return
        self._result = type(res[i]).from_buffer_copy(res[i])      # kept: the algorithm every matmul reads
        self.algo = ctypes.byref(self._result, 0)
        self.info = self.candidates[i]
        self.note = f"cublasLt: {why}"

    def _describe(self, r) -> dict:
        import ctypes

        d = {"state": int(r.state), "workspace": int(r.workspaceSize), "waves": float(r.wavesCount)}
        for name, attr in _LT_CFG.items():
            v, n = ctypes.c_uint32(0), ctypes.c_size_t(0)
            st = self.lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(r, 0), attr, ctypes.byref(v), 4,
                                                               ctypes.byref(n))
            d[name] = int(v.value) if st == 0 else None
        return d

    def run(self, w_ptr: int, x_ptr: int, out_ptr: int) -> None:
        import ctypes

        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        A, B, D = self.layouts
        stream = ctypes.c_void_p(int(cp().cuda.get_current_stream().ptr))
        st = self.lib.cublasLtMatmul(self.handle, self.desc, ctypes.byref(one), ctypes.c_void_p(w_ptr), A,
                                     ctypes.c_void_p(x_ptr), B, ctypes.byref(zero), ctypes.c_void_p(out_ptr), D,
                                     ctypes.c_void_p(out_ptr), D, self.algo, None, 0, stream)
        if st:
            raise GpuError(f"cublasLtMatmul failed: status {st} (shape n={self.key[1]} od={self.key[2]} k={self.key[3]})")




_PLANS: dict = {}


def old_gemm_dense(x, w, out, path: str):
    """gemm_dense's body at 4caa4be (its argument checks left out): returns (out, 'lt' | 'gemm_ex' as run)."""
    n, k = x.shape
    od = w.shape[0]
    t_in = 2 if x.dtype.itemsize == 2 else 0                    # CUDA_R_16F | CUDA_R_32F
    if path == "lt":
        key = (int(cp().cuda.Device().id), t_in, n, od, k, _align(w.data.ptr), _align(x.data.ptr), _align(out.data.ptr))
        plan = _PLANS.get(key)
        if plan is None:
            plan = _PLANS[key] = DensePlan(t_in, n, od, k, key[5:] + key[7:])
        if plan.algo is not None:
            plan.run(w.data.ptr, x.data.ptr, out.data.ptr)
            return out, "lt"
    _gemm_ex_capturable(1, 0, od, n, k, w.data.ptr, t_in, k, x.data.ptr, t_in, k, out.data.ptr, 0, od)
    return out, "gemm_ex"
