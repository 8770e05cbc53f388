"""GPU gates of round 9's decode kernels (gemv_kq): every registered instantiation, nt = 1..16 with tails in od and
the splits, f16 and f32 activations, NaN-poisoned outputs with guard regions, fresh random inputs; the gate of
labkernels.wgmma.gate against the kernel's exact function (labkernels.gemv.emulate_weights: <= exact_gate(id), only
the f32 summation order may differ) and gguf-py's float64 dequantization (NMSE)."""
import numpy as np
import pytest

from labkernels.kernels import registry

pytestmark = [pytest.mark.gpu]

GUARD = 256
SPECS = registry.family("gemv_kq")


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


def _weights(rng, qtype, od, id_):
    from labkernels import quants

    w = rng.standard_normal((od, id_)) * 10.0 ** rng.uniform(-4, 0, (od, 1))   # rows from ~1e-4 to ~1
    w[rng.integers(0, od), rng.integers(0, id_)] *= 20                          # an outlier
    return quants.quantize(w.astype(np.float32), qtype)


def _run(cp, w, x, **kw):
    from labkernels import gemv

    nt, od = x.shape[0], w.od
    buf = cp.full(nt * od + 2 * GUARD, np.nan, dtype=cp.float32)
    y = buf[GUARD:GUARD + nt * od].reshape(nt, od)
    gemv.gemv(w, x, out=y, **kw)
    g = cp.asnumpy(buf)
    assert np.isnan(g[:GUARD]).all() and np.isnan(g[-GUARD:]).all(), "write outside the output"
    return cp.asnumpy(y)


def _gate(y, raw, qtype, x):
    from labkernels import gemv, wgmma

    g = wgmma.gate(y, raw, qtype, x, w16=gemv.emulate_weights(raw, qtype))
    assert g["nonfinite"] == 0, g
    assert g["exact_rel"] <= wgmma.exact_gate(x.shape[1]), g
    assert g["ok"], g
    return g


@pytest.mark.gpu_fast
@pytest.mark.parametrize("spec", SPECS, ids=[k.key for k in SPECS])
def test_every_instantiation_passes_the_gate(cp, rng, spec):
    """Each registered instantiation once (the fast tier): nt at the top of its token tiles and a tail in od."""
    from labkernels import gpu

    p = spec.p
    qtype = "q4_K" if p["QT"] == 4 else "q6_K"
    nt = 8 * p["NT8"] - int(rng.integers(0, 3))
    od, id_ = 16 * p["MT"] * p["WARPS"] * 2 + 13, 768
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(raw, qtype)
    xd = cp.asarray(x) if p["XF32"] else cp.asarray(x.astype(np.float16))
    y = _run(cp, w, xd, MT=p["MT"], WARPS=p["WARPS"], S=2)
    _gate(y, raw, qtype, x)


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("nt", [1, 2, 3, 5, 8, 9, 16])
@pytest.mark.parametrize("od,id_", [(1, 256), (17, 512), (130, 1024), (1000, 4352)])
@pytest.mark.parametrize("f32", [0, 1])
def test_gemv_parity(cp, rng, qtype, nt, od, id_, f32):
    from labkernels import gpu

    raw = _weights(rng, qtype, od, id_)
    x = (rng.standard_normal((nt, id_)) * rng.uniform(0.5, 4)).astype(np.float32)
    w = gpu.QWeight.upload(raw, qtype)
    xd = cp.asarray(x) if f32 else cp.asarray(x.astype(np.float16))
    y = _run(cp, w, xd)
    _gate(y, raw, qtype, x)


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
def test_splits_are_deterministic_and_agree(cp, rng, qtype):
    """Every split count S = 1..nsb: the same output bit for bit on a second launch (the partials are added in split
    order by the last CTA, whichever arrives last), within f32 summation order of S=1, and gated."""
    from labkernels import gemv, gpu, wgmma

    od, id_, nt = 300, 2304, 5
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(raw, qtype)
    xd = cp.asarray(x)
    y1 = _run(cp, w, xd, S=1)
    scale = float(np.abs(y1).max())
    for S in range(1, id_ // gemv.QK + 1):
        a = _run(cp, w, xd, S=S)
        b = _run(cp, w, xd, S=S)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"S={S} not reproducible"
        assert np.abs(a - y1).max() <= 2 * wgmma.exact_gate(id_) * scale, S
    _gate(y1, raw, qtype, x)


def test_f16_and_f32_activations_agree(cp, rng):
    """f32 activations are rounded to f16 at the fragment: the same f16 numbers, so the same output bit for bit."""
    from labkernels import gpu

    raw = _weights(rng, "q4_K", 640, 2048)
    x = rng.standard_normal((7, 2048)).astype(np.float32)
    w = gpu.QWeight.upload(raw, "q4_K")
    a = _run(cp, w, cp.asarray(x), S=3)         # the same splits (the default depends on each build's occupancy)
    b = _run(cp, w, cp.asarray(x.astype(np.float16)), S=3)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.gpu_fast
def test_gemv_in_a_captured_graph(cp, rng):
    """The decode step is replayed as a CUDA graph: a split launch captured once and replayed on new activations
    (copied into the captured input) gives the eager result, the counters left clean for the next replay."""
    from labkernels import gpu

    raw = _weights(rng, "q4_K", 512, 4096)
    w = gpu.QWeight.upload(raw, "q4_K")
    x = cp.asarray(rng.standard_normal((1, 4096)).astype(np.float16))
    y = cp.empty((1, 512), cp.float32)
    from labkernels import gemv

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        gemv.gemv(w, x, out=y, S=4)      # the stream's workspace is made outside the capture
        s.synchronize()
        s.begin_capture()
        gemv.gemv(w, x, out=y, S=4)
        graph = s.end_capture()
    for _ in range(3):
        xn = rng.standard_normal((1, 4096)).astype(np.float16)
        x[...] = cp.asarray(xn)
        graph.launch(s)
        s.synchronize()
        ref = cp.asnumpy(gemv.gemv(w, cp.asarray(xn), S=4))
        assert np.array_equal(cp.asnumpy(y), ref)


@pytest.mark.gpu_fast
def test_gemv_refuses_bad_inputs(cp, rng):
    from labkernels import gemv, gpu

    raw = _weights(rng, "q4_K", 64, 512)
    w = gpu.QWeight.upload(raw, "q4_K")
    with pytest.raises(gpu.ShapeError, match="nt = 1..16"):
        gemv.gemv(w, cp.zeros((17, 512), cp.float16))
    with pytest.raises(gpu.ShapeError, match="inner dimensions"):
        gemv.gemv(w, cp.zeros((2, 256), cp.float16))
    with pytest.raises(gpu.ShapeError, match="float16 or float32"):
        gemv.gemv(w, cp.zeros((2, 512), cp.float64))
    with pytest.raises(gpu.ShapeError, match="splits"):
        gemv.gemv(w, cp.zeros((2, 512), cp.float16), S=3)
    with pytest.raises(gpu.ShapeError, match="2-D"):
        gemv.gemv(w, cp.zeros((512,), cp.float16))
    w224 = gpu.QWeight.upload(_weights(rng, "q6_K", 64, 512), "q6_K", 224)
    y = gemv.gemv(w224, cp.zeros((2, 512), cp.float16))     # the planes are made from the GGUF rows the upload kept
    assert y.shape == (2, 64)


@pytest.mark.model
def test_gemv_real_model_tensors(cp, rng):
    """Every q4_K / q6_K tensor of Gemma 3 270M at nt = 1 and 11 (f16 and f32 activations)."""
    from labkernels import gpu, model

    n = 0
    for name, qtype, raw in model.load_kquant():
        raw = np.ascontiguousarray(raw)
        w = gpu.QWeight.upload(raw, qtype)
        for nt, f32 in ((1, 0), (11, 1)):
            x = rng.standard_normal((nt, w.id)).astype(np.float32)
            y = _run(cp, w, cp.asarray(x) if f32 else cp.asarray(x.astype(np.float16)))
            _gate(y, raw, qtype, x)
        n += 1
    assert n >= 36
