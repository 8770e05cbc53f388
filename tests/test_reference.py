"""The exact integer reference GEMM: equal to float64 products of the dequantized operands."""
import numpy as np
import pytest

from labkernels import quants, reference as R


@pytest.mark.parametrize("qtype", ["q6_K", "q4_K"])
def test_int_ref_equals_dequantized_product(qtype, rng):
    w = (rng.standard_normal((70, 512)) * 0.05).astype(np.float32)
    raw = quants.quantize(w, qtype)
    x = rng.standard_normal((33, 512)).astype(np.float32)
    a = R.quantize_activations(x)
    y = R.gemm_int_ref(raw, qtype, a)
    # the same function, computed another way: dequantized activations (d*q) x dequantized weights
    a_deq = a.qs.astype(np.float64) * np.repeat(a.d.astype(np.float64), 32, axis=1)
    w_deq = quants.dequantize(raw, qtype).astype(np.float64)
    ref = a_deq @ w_deq.T
    assert np.max(np.abs(y - ref)) <= 1e-9 * np.max(np.abs(ref))
    # and close to the float64 reference of the original activations (activation quantization only)
    p = R.parity(y, y, R.gemm_f64_ref(raw, qtype, x))
    assert p["ok"] and 1e-7 < p["nmse"] < 5e-4


def test_padded_stride_and_token_subset(rng):
    raw = quants.quantize(rng.standard_normal((20, 256)).astype(np.float32), "q6_K")
    a = R.quantize_activations(rng.standard_normal((10, 256)).astype(np.float32))
    y = R.gemm_int_ref(raw, "q6_K", a)
    assert np.array_equal(R.gemm_int_ref(quants.pad_q6k(raw), "q6_K", a, stride=224), y)
    assert np.array_equal(R.gemm_int_ref(raw, "q6_K", a, tokens=np.array([3, 7])), y[[3, 7]])


def test_parity_gate_catches_problems(rng):
    ref = rng.standard_normal((4, 5))
    assert R.parity(ref, ref)["ok"]
    bad = ref.copy(); bad[1, 2] = np.nan
    assert not R.parity(bad, ref)["ok"]
    off = ref.copy(); off[0, 0] += 0.01 * np.abs(ref).max()
    assert not R.parity(off, ref)["ok"]
    with pytest.raises(R.ShapeError):
        R.parity(ref[:2], ref)


def test_shape_errors(rng):
    raw = quants.quantize(rng.standard_normal((4, 256)).astype(np.float32), "q6_K")
    with pytest.raises(R.ShapeError, match="inner dimensions"):
        R.gemm_int_ref(raw, "q6_K", R.quantize_activations(rng.standard_normal((2, 512)).astype(np.float32)))
    with pytest.raises(R.ShapeError, match="multiple of 32"):
        R.quantize_activations(np.zeros((2, 40), np.float32))
