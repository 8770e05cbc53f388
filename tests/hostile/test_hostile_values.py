"""Class 1: a NaN or Inf scale in a k-quant block (q4_K d / dmin, q6_K d; q8_0 / q5_0 d too) is refused where the
bytes enter the lab -- the GGUF loader, the k-quant cache, quants.dequantize, quantize_ref.dequantize, the integer
reference, `labkernels model layout` -- naming the tensor and the block, instead of NaN logits or "0 mismatches"."""
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_util import assert_clean_error, labkernels, tiny_gguf
from labkernels import model as M
from labkernels import quantize_ref, quants, reference

#: float16 bit patterns that are not finite: +Inf, -Inf, quiet NaN, a signalling NaN, all ones
NONFINITE = [0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF]
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf")


@pytest.fixture(scope="module")
def quantized(gguf_file):
    """(name, ggml type, labkernels type, data offset, blocks, blocks per row) of every block-quantized tensor."""
    import gguf

    out = []
    for t in gguf.GGUFReader(gguf_file, "r").tensors:
        q = M.KNOWN_TYPES.get(t.tensor_type.name)
        if q in quants.QTYPES and quants.scale_offsets(q):
            nbytes = quants.BLOCK_SIZES[q][1]
            per_row = int(t.shape[0]) // quants.BLOCK_SIZES[q][0]
            out.append((t.name, t.tensor_type.name, q, int(t.data_offset), int(t.n_bytes) // nbytes, per_row))
    assert {q for _, _, q, *_ in out} >= {"q4_K", "q6_K"}
    return out


@SETTINGS
@given(data=st.data())
def test_a_nonfinite_scale_anywhere_is_refused_at_load_naming_tensor_block_and_offset(gguf_file, quantized,
                                                                                     tmp_path_factory, data):
    name, gname, q, off, nblocks, per_row = data.draw(st.sampled_from(quantized), label="tensor")
    field, foff = data.draw(st.sampled_from(quants.scale_offsets(q)), label="field")
    b = data.draw(st.integers(0, nblocks - 1), label="block")
    bits = data.draw(st.sampled_from(NONFINITE), label="bits")
    nbytes = quants.BLOCK_SIZES[q][1]
    buf = bytearray(gguf_file.read_bytes())
    buf[off + b * nbytes + foff:off + b * nbytes + foff + 2] = bits.to_bytes(2, "little")
    p = tmp_path_factory.mktemp("bad") / "bad.gguf"
    p.write_bytes(bytes(buf))
    with pytest.raises(M.ModelError) as e:
        M.open_model(p)
    msg = str(e.value)
    assert f"tensor {name!r} ({gname})" in msg, msg
    assert f"block {b} (row {b // per_row}, block {b % per_row} of the row) at file offset {off + b * nbytes}" in msg
    assert f"{field} = " in msg and "non-finite scale" in msg


def test_a_nonfinite_f32_weight_is_refused(gguf_file, tmp_path):
    import gguf

    t = next(t for t in gguf.GGUFReader(gguf_file, "r").tensors if t.tensor_type.name == "F32")
    buf = bytearray(gguf_file.read_bytes())
    buf[int(t.data_offset) + 8:int(t.data_offset) + 12] = np.float32(np.nan).tobytes()
    p = tmp_path / "nan.gguf"
    p.write_bytes(bytes(buf))
    with pytest.raises(M.ModelError, match=rf"tensor '{t.name}' \(F32\): element 2 is nan"):
        M.open_model(p)


def test_layout_cli_refuses_the_file_instead_of_reporting_no_mismatches(gguf_file, quantized, tmp_path):
    name, _, q, off, _, _ = next(x for x in quantized if x[2] == "q6_K")
    buf = bytearray(gguf_file.read_bytes())
    buf[off + 208:off + 210] = (0x7E00).to_bytes(2, "little")       # block 0's d: NaN
    p = tmp_path / "bad.gguf"
    p.write_bytes(bytes(buf))
    r = labkernels("layout", "--model", p)
    assert_clean_error(r, "ModelError", f"tensor {name!r}", "block 0 ")
    assert "mismatches 0" not in r.stdout


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K", "q6_K_224", "q8_0", "q5_0"])
@SETTINGS
@given(data=st.data())
def test_dequantize_finds_exactly_the_blocks_with_a_nonfinite_scale(qtype, data):
    qk, nbytes = quants.BLOCK_SIZES[qtype]
    rows, per_row = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    raw = rng.integers(0, 256, (rows, per_row * nbytes), dtype=np.uint8)
    blocks = raw.reshape(-1, nbytes)
    for _, off in quants.scale_offsets(qtype):      # finite scales everywhere first: exponent field below 0x1F
        blocks[:, off + 1] &= 0x7B
    assert len(quants.nonfinite_scales(raw, qtype)[0]) == 0
    assert np.isfinite(quants.dequantize(raw, qtype)).all()
    bad = sorted(data.draw(st.sets(st.integers(0, rows * per_row - 1), min_size=1, max_size=3)))
    field, off = data.draw(st.sampled_from(quants.scale_offsets(qtype)))
    for i in bad:
        blocks[i, off:off + 2] = np.frombuffer(data.draw(st.sampled_from(NONFINITE)).to_bytes(2, "little"), np.uint8)
    assert quants.nonfinite_scales(raw, qtype)[0].tolist() == bad
    with pytest.raises(quants.QuantFormatError, match=rf"block {bad[0]} \(row {bad[0] // per_row}, block "
                                                      rf"{bad[0] % per_row} of the row\) has a non-finite scale"):
        quants.dequantize(raw, qtype)
    if qtype in ("q4_K", "q6_K", "q8_0"):
        with pytest.raises(quantize_ref.QuantInputError, match=rf"block {bad[0]} "):
            quantize_ref.dequantize(raw, qtype)


@pytest.mark.parametrize("qtype,stride", [("q4_K", None), ("q6_K", None), ("q6_K", 224)])
def test_the_integer_reference_refuses_a_nan_scale(qtype, stride, rng):
    w = quants.quantize(rng.standard_normal((4, 512)).astype(np.float32), qtype)
    if stride == 224:
        w = quants.pad_q6k(w)
    nbytes = stride or quants.BLOCK_SIZES[qtype][1]
    off = quants.scale_offsets(qtype)[-1][1]
    w[2, nbytes + off:nbytes + off + 2] = np.frombuffer((0x7C00).to_bytes(2, "little"), np.uint8)
    a = reference.quantize_activations(rng.standard_normal((3, 512)).astype(np.float32))
    with pytest.raises(reference.ShapeError, match=r"weights: q\S+ block 5 \(row 2, block 1 of the row\)"):
        reference.gemm_int_ref(w, qtype, a, stride=stride)


def test_the_kquant_cache_is_checked_too(tmp_path, monkeypatch, rng):
    raw = quants.quantize(rng.standard_normal((2, 256)).astype(np.float32), "q6_K")
    raw[1, 208:210] = np.frombuffer((0x7E00).to_bytes(2, "little"), np.uint8)
    cache = tmp_path / "cache.npz"
    np.savez(cache, **{"q6_K__blk.0.ffn_down.weight": raw})
    monkeypatch.setattr(M, "KQUANT_CACHE", cache)
    with pytest.raises(M.ModelError, match=r"cache\.npz: tensor 'blk\.0\.ffn_down\.weight' \(Q6_K\): block 1 "):
        M.load_kquant(tmp_path / "no-model.gguf")


@pytest.mark.model
@pytest.mark.slow
def test_the_scale_check_costs_under_5_percent_of_the_real_model_load(model_path):
    """The check runs inside open_model; its share of the load is measured here on the real Gemma 3 270M."""
    t0 = time.perf_counter()
    m = M.open_model(model_path)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    for t in m.reader.tensors:
        M.check_values(m.path, t.name, t.tensor_type.name, t.data, int(t.data_offset))
    check = time.perf_counter() - t0
    print(f"open_model {load:.2f} s, of which the value checks {check:.3f} s ({100 * check / load:.2f}%)")
    assert check < 0.05 * load
