"""GPU parity gates for the prepass and the GEMM kernels (run on the device: `labkernels gpu check`).

Every test draws fresh random inputs (the seed is printed), poisons the output with NaN inside guard
regions, and checks: every element written and finite, the guards untouched, max relative error vs the
exact integer reference <= 1e-3, NMSE vs the float64 dequantized reference <= 5e-4.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

GUARD = 1024


def _poisoned(cp, nt, od):
    """A NaN-filled output with NaN-pattern guards on both sides; returns (buffer, view)."""
    buf = cp.full(nt * od + 2 * GUARD, np.nan, dtype=cp.float32)
    buf[:GUARD] = cp.arange(GUARD, dtype=cp.float32) + 0.5
    buf[-GUARD:] = -(cp.arange(GUARD, dtype=cp.float32) + 0.5)
    return buf, buf[GUARD:GUARD + nt * od].reshape(nt, od)


def _check_guards(cp, buf):
    g = cp.asnumpy(buf)
    assert np.array_equal(g[:GUARD], np.arange(GUARD, dtype=np.float32) + 0.5), "write before the output"
    assert np.array_equal(g[-GUARD:], -(np.arange(GUARD, dtype=np.float32) + 0.5)), "write after the output"


def _weights(rng, qtype, od, id_):
    from labkernels import quants

    w = (rng.standard_normal((od, id_)) * rng.uniform(0.01, 0.1)).astype(np.float32)
    w[rng.integers(0, od), rng.integers(0, id_)] *= 20  # an outlier
    return quants.quantize(w, qtype)


def _gate(y_gpu, w_raw, qtype, x, stride=None):
    from labkernels import cases

    return cases.gate(y_gpu, cases.references(w_raw, qtype, x, stride=stride))


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


@pytest.mark.parametrize("nt,id_", [(1, 256), (63, 512), (64, 256), (130, 1024)])
def test_prepass_bit_exact(cp, rng, nt, id_):
    from labkernels import gpu
    from labkernels.quantize_ref import quantize_q8_1

    x = (rng.standard_normal((nt, id_)) * rng.uniform(0.1, 10)).astype(np.float32)
    x[:, rng.integers(0, id_)] = 0.0
    if nt > 2:
        x[1] = 0.0  # an all-zero token: d = 0
    t = gpu.prepass(cp.asarray(x))
    qs, d, isum = gpu.tiles_to_q8_1(t)
    rqs, rd, _ = quantize_q8_1(x)
    assert np.array_equal(qs, rqs)
    assert np.array_equal(d.view(np.uint16), rd.view(np.uint16))
    assert np.array_equal(isum, rqs.reshape(nt, -1, 32).astype(np.int32).sum(-1))
    # padding tokens of the last tile are written as zeros (codes and d|sum words)
    t_full = gpu.Q8Tiles(t.qa8, t.sda, t.ntile * 64, id_)
    pqs, pd, psum = gpu.tiles_to_q8_1(t_full)
    assert not pqs[nt:].any() and not pd[nt:].view(np.uint16).any() and not psum[nt:].any()


@pytest.mark.gpu_fast
def test_prepass_f16_input(cp, rng):
    from labkernels import gpu
    from labkernels.quantize_ref import quantize_q8_1

    x = rng.standard_normal((70, 512)).astype(np.float16)
    t = gpu.prepass(cp.asarray(x))
    qs, d, _ = gpu.tiles_to_q8_1(t)
    rqs, rd, _ = quantize_q8_1(x.astype(np.float32))
    assert np.array_equal(qs, rqs) and np.array_equal(d.view(np.uint16), rd.view(np.uint16))


@pytest.mark.gpu_fast
def test_q8_1_rows_match_ggml_layout(cp, rng):
    from labkernels import gpu
    from labkernels.quantize_ref import pack_q8_1, quantize_q8_1

    x = rng.standard_normal((37, 768)).astype(np.float32)
    got = cp.asnumpy(gpu.quantize_q8_1_rows(cp.asarray(x)))
    assert np.array_equal(got, pack_q8_1(*quantize_q8_1(x)))


Q6_VARIANTS = [dict(KDR=k, EPI=e, OCC=o) for k in (1, 2, 4, 8) for e in (0, 1) for o in (1, 2)]


@pytest.mark.gpu_fast
@pytest.mark.parametrize("stride", [210, 224])
@pytest.mark.parametrize("var", Q6_VARIANTS, ids=lambda v: "KDR{KDR}-EPI{EPI}-OCC{OCC}".format(**v))
def test_q6k_expb_parity(cp, rng, var, stride):
    from labkernels import gpu

    nt, od, id_ = int(rng.integers(65, 200)), int(rng.integers(129, 300)), 512
    w_raw = _weights(rng, "q6_K", od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(w_raw, "q6_K", stride)
    buf, y = _poisoned(cp, nt, od)
    gpu.gemm(w, gpu.prepass(cp.asarray(x)), "q6k_expb", out=y, **var)
    cp.cuda.runtime.deviceSynchronize()
    _check_guards(cp, buf)
    res = _gate(cp.asnumpy(y), w_raw, "q6_K", x)
    assert res["nonfinite"] == 0 and res["ok"], res


@pytest.mark.gpu_fast
@pytest.mark.parametrize("stride", [210, 224])
def test_q6k_generic_parity(cp, rng, stride):
    from labkernels import gpu

    nt, od, id_ = 150, 200, 768
    w_raw = _weights(rng, "q6_K", od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(w_raw, "q6_K", stride)
    buf, y = _poisoned(cp, nt, od)
    gpu.gemm_generic_q6k(w, gpu.quantize_q8_1_rows(cp.asarray(x)), nt, out=y)
    cp.cuda.runtime.deviceSynchronize()
    _check_guards(cp, buf)
    res = _gate(cp.asnumpy(y), w_raw, "q6_K", x)
    assert res["ok"], res


@pytest.mark.gpu_fast
@pytest.mark.parametrize("kdr", [2, 4, 8])
def test_q4k_nb_parity(cp, rng, kdr):
    from labkernels import gpu

    nt, od, id_ = int(rng.integers(1, 200)), int(rng.integers(1, 300)), 768
    w_raw = _weights(rng, "q4_K", od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(w_raw, "q4_K")
    buf, y = _poisoned(cp, nt, od)
    gpu.gemm(w, gpu.prepass(cp.asarray(x)), "q4k_nb", out=y, KDR=kdr)
    cp.cuda.runtime.deviceSynchronize()
    _check_guards(cp, buf)
    res = _gate(cp.asnumpy(y), w_raw, "q4_K", x)
    assert res["ok"], res


@pytest.mark.model
def test_real_model_tensors(cp, rng):
    """Every q6_K (both strides) and every q4_K tensor of Gemma 3 270M, through every main-path tile variant."""
    from labkernels import gpu
    from labkernels.kernels import registry
    from labkernels.model import load_kquant

    tensors = load_kquant()
    assert {q for _, q, _ in tensors} == {"q4_K", "q6_K"}
    nt = int(rng.integers(70, 140))
    failures = []
    for name, qtype, raw in tensors:
        id_ = raw.shape[1] // (210 if qtype == "q6_K" else 144) * 256
        x = rng.standard_normal((nt, id_)).astype(np.float32)
        a = gpu.prepass(cp.asarray(x))
        confs = [(v.name, s) for v in registry.VARIANTS.values() if v.qtype == qtype and v.main_path
                 and v.act == "q8_1_tiles" for s in ((210, 224) if qtype == "q6_K" else (144,))]
        for vname, stride in confs:
            w = gpu.QWeight.upload(raw, qtype, stride)
            buf, y = _poisoned(cp, nt, w.od)
            gpu.gemm(w, a, vname, out=y)
            cp.cuda.runtime.deviceSynchronize()
            _check_guards(cp, buf)
            res = _gate(cp.asnumpy(y), raw, qtype, x)
            if not res["ok"]:
                failures.append((name, vname, stride, res))
    assert not failures, failures


@pytest.mark.gpu_fast
def test_bad_inputs_raise(cp):
    from labkernels import errors, gpu
    from labkernels.kernels import registry

    with pytest.raises(errors.ShapeError, match="multiple of 256"):
        gpu.prepass(cp.zeros((4, 320), cp.float32))
    with pytest.raises(errors.ShapeError):
        gpu.prepass(np.zeros((4, 256), np.float32))  # host array
    w = gpu.QWeight.upload(np.zeros((3, 210), np.uint8), "q6_K")
    a = gpu.prepass(cp.ones((2, 512), cp.float32))
    with pytest.raises(errors.ShapeError, match="inner dimensions"):
        gpu.gemm(w, a)
    with pytest.raises(errors.ShapeError):
        gpu.QWeight.upload(np.zeros((3, 211), np.uint8), "q6_K")
    from dataclasses import replace

    big = replace(registry.find("q6k_expb", KDR=4, STRIDE=210, EPI=0, OCC=2), smem_formula="300000")
    with pytest.raises(errors.SharedMemoryError, match="300000"):
        gpu.Kernel(big)


@pytest.mark.gpu_fast
def test_occupancy_api_matches_calculator(cp):
    """cudaOccupancyMaxActiveBlocksPerMultiprocessor == labkernels.occupancy for every registry kernel."""
    from labkernels import gpu, occupancy
    from labkernels.kernels import registry

    prof = occupancy.profile("h200")
    bad = []
    for spec in registry.available():
        k = gpu.Kernel(spec)
        api = k.occupancy_api()
        calc = occupancy.occupancy(prof, spec.threads, k.regs, spec.dynamic_smem() + k.static_smem)
        if api != calc["blocks_per_sm"]:
            bad.append((spec.key, k.regs, spec.dynamic_smem(), api, calc))
    assert not bad, bad


@pytest.mark.parametrize("path", ["lt", "gemm_ex"])
@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_gemm_dense_matches_matmul_and_captures(dt, path):
    """blas.gemm_dense (raw cuBLAS: cuBLASLt without split-K, or cublasGemmEx) equals cupy.matmul in fp32 terms, and
    runs inside a CUDA-graph capture, which cupy.matmul refuses."""
    import cupy as cp

    from labkernels import blas

    rng = np.random.default_rng(1)
    x = cp.asarray(rng.standard_normal((37, 640)).astype(dt))
    w = cp.asarray(rng.standard_normal((1000, 640)).astype(dt))
    y = blas.gemm_dense(x, w, path=path)
    ref = cp.asnumpy(x.astype(cp.float32)) @ cp.asnumpy(w.astype(cp.float32)).T
    assert np.abs(cp.asnumpy(y) - ref).max() <= 1e-3 * np.abs(ref).max()
    s = cp.cuda.Stream(non_blocking=True)
    out = cp.empty((37, 1000), cp.float32)
    with s:
        blas.gemm_dense(x, w, out=out, path=path)       # warm-up on the capture stream (cuBLAS workspace)
        s.synchronize()
        s.begin_capture()
        blas.gemm_dense(x, w, out=out, path=path)
        g = s.end_capture()
    with s:              # on the graph's stream: a non-blocking stream does not wait for the legacy default stream
        out.fill(0)
    g.launch(s)
    s.synchronize()
    assert np.array_equal(cp.asnumpy(out), cp.asnumpy(y))


@pytest.mark.gpu_fast
def test_gemm_defaults_come_from_the_variant_table(cp, rng):
    """gpu.gemm without a kernel runs the weight type's default variant (q4_K: KDR=8, round 4's best): its output
    equals the named default variant's bit for bit."""
    from labkernels import gpu
    from labkernels.kernels import registry

    x = rng.standard_normal((70, 512)).astype(np.float32)
    a = gpu.prepass(cp.asarray(x))
    for qtype in ("q4_K", "q6_K"):
        raw = _weights(rng, qtype, 130, 512)
        w = gpu.QWeight.upload(raw, qtype)
        dflt = registry.default_variant(qtype)
        y0, y1 = gpu.gemm(w, a), gpu.gemm(w, a, dflt.name)
        assert cp.array_equal(y0, y1)
        assert _gate(cp.asnumpy(y0), raw, qtype, x)["ok"]
    assert registry.default_variant("q4_K").p == {"KDR": 8}
