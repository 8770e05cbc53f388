"""Issue 49 on the GPU: the fp16 yardstick through nvmath-python's cuBLAS / cuBLASLt bindings is bit-for-bit what it
was through ctypes (the previous code, kept in _ctypes_cublas_ref.py), on the same inputs, on both gemm_dense paths;
one libcublas serves CuPy and the bindings; the calls still capture into a CUDA graph."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

#: (n, od, k): Gemma 3 270M's stacked QKV / FFN at the prefill's token counts, a 7B shape, and odd sizes (n = 1,
#: a k that is not a multiple of 64, od not a multiple of 8)
SHAPES = [(512, 1536, 640), (64, 2048, 640), (512, 640, 2048), (3, 4096, 4096), (1, 1000, 320), (37, 24, 200)]


def _inputs(n, od, k, dtype, seed):
    import cupy as cp

    rng = np.random.default_rng(seed)
    x = cp.asarray(rng.standard_normal((n, k)).astype(dtype))
    w = cp.asarray((rng.standard_normal((od, k)) / np.sqrt(k)).astype(dtype))
    return x, w


@pytest.mark.gpu_fast
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("path", ["gemm_ex", "lt"])
def test_gemm_dense_is_bit_identical_to_the_ctypes_path(path, dtype):
    import cupy as cp
    from _ctypes_cublas_ref import _PLANS as OLD_PLANS
    from _ctypes_cublas_ref import old_gemm_dense

    from labkernels import blas

    for i, (n, od, k) in enumerate(SHAPES):
        x, w = _inputs(n, od, k, dtype, i)
        new = blas.gemm_dense(x, w, path=path)
        old, ran = old_gemm_dense(x, w, cp.full((n, od), np.nan, cp.float32), path)
        cp.cuda.get_current_stream().synchronize()
        a, b = cp.asnumpy(new), cp.asnumpy(old)
        assert np.isfinite(a).all()
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), \
            f"{path} {np.dtype(dtype).name} n={n} od={od} k={k}: nvmath path differs from the ctypes path ({ran})"
        if path == "lt":     # the same algorithm chosen (or the same fallback), described the same way
            p = blas.dense_plan(blas.dense_type(dtype), n, od, k, align_a=blas._align(w.data.ptr),
                                align_b=blas._align(x.data.ptr), align_d=blas._align(new.data.ptr))
            assert (p.algo is not None) == (ran == "lt")
            ref = next(q for key, q in OLD_PLANS.items() if key[1:5] == p.key[:4] and key[5:8] == p.key[4][:3])
            # the bindings type SPLITK_NUM as cublasLt.h does (int32_t: -1) where ctypes read a uint32 (4294967295)
            assert _u32(getattr(p, "candidates", None)) == _u32(getattr(ref, "candidates", None)) and p.note == ref.note


def _u32(candidates):
    """Candidates with every integer field read as the uint32 the ctypes path read (float fields unchanged)."""
    if candidates is None:
        return None
    return [{k: (v & 0xFFFFFFFF if isinstance(v, int) and not isinstance(v, bool) and k != "workspace" else v)
             for k, v in c.items()} for c in candidates]


@pytest.mark.gpu_fast
def test_gemm_ex_is_cupys_own_gemm_ex_call():
    """The bindings' cublasGemmEx and CuPy's wrapper of the same call (same handle, arguments, algorithm) agree."""
    import cupy as cp
    from cupy.cuda import cublas

    from labkernels import blas

    n, od, k = 512, 1536, 640
    x, w = _inputs(n, od, k, np.float16, 7)
    new = blas.gemm_dense(x, w, path="gemm_ex")
    ref = cp.empty((n, od), cp.float32)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    h = cp.cuda.device.get_cublas_handle()
    cublas.setStream(h, cp.cuda.get_current_stream().ptr)
    cublas.gemmEx(h, 1, 0, od, n, k, one.ctypes.data, w.data.ptr, 2, k, x.data.ptr, 2, k, zero.ctypes.data,
                  ref.data.ptr, 0, od, cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
    assert np.array_equal(cp.asnumpy(new).view(np.uint32), cp.asnumpy(ref).view(np.uint32))


@pytest.mark.gpu_fast
def test_matmul_f16_is_unchanged_by_the_bindings():
    """blas.matmul_f16 (cupy.matmul, the fp16 yardstick of the benches) gives the same bits before nvmath-python is
    imported and after gemm_dense has run through it: the bindings' library loading does not swap the libcublas
    CuPy calls (a fresh process, so nothing was loaded before)."""
    code = textwrap.dedent("""
        import sys, numpy as np, cupy as cp
        from labkernels import blas
        rng = np.random.default_rng(3)
        x = cp.asarray(rng.standard_normal((512, 4096)).astype(np.float16))
        w = cp.asarray((rng.standard_normal((4096, 4096)) / 64).astype(np.float16))
        before = cp.asnumpy(blas.matmul_f16(x, w))
        assert "nvmath" not in sys.modules
        blas.gemm_dense(x, w, path="lt"); blas.gemm_dense(x, w, path="gemm_ex")
        after = cp.asnumpy(blas.matmul_f16(x, w))
        ref = cp.asnumpy(cp.matmul(x, w.T))
        libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/libcublas.so" in l})
        lts = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/libcublasLt.so" in l})
        info = blas.cublas_libraries()
        print("SAME", np.array_equal(before.view(np.uint16), after.view(np.uint16)),
              np.array_equal(after.view(np.uint16), ref.view(np.uint16)))
        print("LIBS", libs, lts, info)
        assert len(libs) == 1 and len(lts) == 1, (libs, lts)
        import os
        assert os.path.realpath(info["cublas"]["path"]) == os.path.realpath(libs[0])
        assert os.path.realpath(info["cublasLt"]["path"]) == os.path.realpath(lts[0])
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SAME True True" in r.stdout, r.stdout


def test_both_paths_capture_into_a_graph_and_replay_the_eager_bits():
    """gemm_dense under stream capture (what the prefill graph does): one replay writes the eager call's bits."""
    import cupy as cp

    from labkernels import blas, graph_nodes

    n, od, k = 64, 1536, 640
    x, w = _inputs(n, od, k, np.float16, 11)
    s = cp.cuda.Stream(non_blocking=True)
    for path in ("gemm_ex", "lt"):
        out = cp.empty((n, od), cp.float32)
        with s:
            eager = cp.asnumpy(blas.gemm_dense(x, w, out=out, path=path))
            out.fill(np.nan)
            s.synchronize()
        nodes = graph_nodes.run_once(lambda: blas.gemm_dense(x, w, out=out, path=path), s)
        assert sum(nd["type"] == "KERNEL" for nd in nodes) >= 1, nodes
        assert np.array_equal(cp.asnumpy(out).view(np.uint32), eager.view(np.uint32)), path
