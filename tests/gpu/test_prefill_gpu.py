"""GPU tests of the prefill: each CUDA kernel against its numpy transcription, then the whole Gemma prefill
against the CPU reference (needs the model: LABKERNELS_MODEL or data/models/)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from cpu_gpu_shim import FakeKernel  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


def _both(cp, family, params, grid, host_args):
    """Run the CUDA kernel and the numpy transcription on copies of the same arguments."""
    from labkernels import gpu

    dev = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in host_args]
    gpu.kernel(family, **params).launch(grid, tuple(dev))
    cp.cuda.runtime.deviceSynchronize()
    host = [a.copy() if isinstance(a, np.ndarray) else a for a in host_args]
    FakeKernel(family, params).launch(grid, host)
    return [cp.asnumpy(d) if isinstance(d, cp.ndarray) else d for d in dev], host


@pytest.mark.gpu_fast
def test_rmsnorm(cp, rng):
    x = rng.standard_normal((37, 640)).astype(np.float32)
    w = rng.standard_normal(640).astype(np.float32)
    y = np.full_like(x, np.nan)
    d, h = _both(cp, "rmsnorm", {"W": 1, "OUT16": 0}, (37,), [x, w, y, np.int32(640), np.float32(1e-6)])
    assert np.allclose(d[2], h[2], rtol=2e-5, atol=1e-5)
    # fp16 output for an fp16 consumer: the f32 values rounded to nearest even
    y16 = np.full(x.shape, np.nan, np.float16)
    d16, _ = _both(cp, "rmsnorm", {"W": 1, "OUT16": 1}, (37,), [x, w, y16, np.int32(640), np.float32(1e-6)])
    assert d16[2].dtype == np.float16 and np.array_equal(d16[2], d[2].astype(np.float16))
    # per-head weights: rows of 256 (q/k norm)
    x = rng.standard_normal((10, 4 * 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    d, h = _both(cp, "rmsnorm", {"W": 1, "OUT16": 0}, (40,), [x, w, np.full_like(x, np.nan), np.int32(256),
                                                            np.float32(1e-6)])
    assert np.allclose(d[2], h[2], rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [0, 1])
def test_rope(cp, rng, neox):
    n, nh, hd = 50, 4, 64
    x = rng.standard_normal((n, nh * hd)).astype(np.float32)
    total = n * nh * hd // 2
    d, h = _both(cp, "rope", {"NEOX": neox}, ((total + 255) // 256,),
                 [x, np.int32(n), np.int32(nh), np.int32(hd), np.int32(hd), np.int32(nh * hd), np.float32(10000.0),
                  np.float32(1.0), np.int32(0)])
    assert np.allclose(d[0], h[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("f16", [0, 1])
def test_softmax_mask(cp, rng, window, f16):
    nq = 33
    S = (rng.standard_normal((2 * 3 * nq, nq)) * 4).astype(np.float16 if f16 else np.float32)
    d, h = _both(cp, "softmax_mask", {"F16": f16}, (S.shape[0],), [S, np.int32(nq), np.int32(nq), np.float32(0.5),
                                                                   np.int32(window)])
    tol = 2e-3 if f16 else 1e-5
    assert np.allclose(d[0].astype(np.float32), h[0].astype(np.float32), atol=tol)
    assert np.allclose(d[0].astype(np.float32).sum(1), 1.0, atol=3e-3)


@pytest.mark.parametrize("act", [0, 1])
def test_act_mul(cp, rng, act):
    g = rng.standard_normal(1000).astype(np.float32) * 3
    u = rng.standard_normal(1000).astype(np.float32)
    out = np.full(1000, np.nan, np.float32)
    d, h = _both(cp, "act_mul", {"ACT": act, "OUT16": 0}, (4,), [g, u, out, np.int64(1000)])
    assert np.allclose(d[2], h[2], rtol=1e-5, atol=1e-6)


@pytest.mark.gpu_fast
def test_embed(cp, rng):
    table = rng.standard_normal((100, 64)).astype(np.float32)
    tok = np.array([3, 99, 0, 3], np.int32)
    out = np.full((4, 64), np.nan, np.float32)
    d, h = _both(cp, "embed", {"F16": 0}, (4,), [table, tok, out, np.int32(64), np.float32(8.0)])
    assert np.array_equal(d[2], h[2])


def test_gemma_prefill_vs_reference(model):
    """Last-position logits of the whole GPU prefill vs the float64 CPU reference."""
    from labkernels.prefill import GpuModel
    from labkernels.prefill_runs import GEMMA_PROMPT
    from labkernels.prefill_ref import forward_ref
    import cupy

    gm = GpuModel(model)
    g = cupy.asnumpy(gm.forward(GEMMA_PROMPT)).astype(np.float64)
    r = forward_ref(model, GEMMA_PROMPT, last_only=True)
    rel = float(np.max(np.abs(g - r)) / np.max(np.abs(r)))
    assert np.argmax(g) == np.argmax(r) and rel < 3e-2, rel
    assert len(set(np.argsort(-g)[:5]) & set(np.argsort(-r)[:5])) >= 4


@pytest.mark.parametrize("fuse_f16", [True, False])
def test_gemma_prefill_other_f16_vs_reference(model, fuse_f16):
    """other_f16 (Gemma's q5_0 / q8_0 weights on fp16 cuBLAS, the norms feeding them writing fp16): the same
    float64-reference gate as the default path, fp16 attention; with the norms' fp16 output (fuse_f16) bitwise the
    separate cast (the same round-to-nearest of the same f32 values)."""
    from labkernels.prefill import GpuModel, PrefillOptions
    from labkernels.prefill_runs import GEMMA_PROMPT
    from labkernels.prefill_ref import forward_ref
    import cupy

    gm = GpuModel(model, opts=PrefillOptions(graph=False, attn_f16=True, fuse_f16=fuse_f16, other_f16=False))
    base = cupy.asnumpy(gm.forward(GEMMA_PROMPT)).astype(np.float64)
    gm.opts.other_f16 = True                   # switched after loading: the fp16 copies are made on first use
    g = cupy.asnumpy(gm.forward(GEMMA_PROMPT)).astype(np.float64)
    ws = [w for L in gm.layers for w in L.values()]
    for v in gm._stacked.values():          # gate/up: a Weight (or None); Q/K/V: [(Weight, names)]
        ws += [g for g, _ in v] if isinstance(v, list) else [v]
    used = [w for w in ws if w is not None and w.q is None and w._dense16 is not None]
    assert used and all(w.dense.dtype == cupy.float32 for w in used) and not np.array_equal(g, base)
    r = forward_ref(model, GEMMA_PROMPT, last_only=True)
    rel = float(np.max(np.abs(g - r)) / np.max(np.abs(r)))
    print("other_f16 fuse_f16", fuse_f16, "rel", rel)
    assert np.argmax(g) == np.argmax(r) and rel < 3e-2, rel
    assert len(set(np.argsort(-g)[:5]) & set(np.argsort(-r)[:5])) >= 4
    if fuse_f16:
        u = GpuModel(model, opts=PrefillOptions(graph=False, attn_f16=True, other_f16=True, fuse_f16=False))
        assert np.array_equal(g, cupy.asnumpy(u.forward(GEMMA_PROMPT)).astype(np.float64))


@pytest.mark.parametrize("shape", [(3, 70, 64, 90), (2, 256, 128, 256)])
def test_bmm_f16_matches_fp32_matmul(cp, rng, shape):
    from labkernels import blas, errors

    b, m, k, n = shape
    A = cp.asarray(rng.standard_normal((b, m, k)).astype(np.float16))
    B = cp.asarray(rng.standard_normal((b, k, n)).astype(np.float16))
    got = cp.asnumpy(blas.bmm_f16(A, B)).astype(np.float64)
    ref = np.matmul(cp.asnumpy(A).astype(np.float64), cp.asnumpy(B).astype(np.float64))
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 2e-3
    with pytest.raises(errors.ShapeError):
        blas.bmm_f16(A, B.astype(cp.float32))
