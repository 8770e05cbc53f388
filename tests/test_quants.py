"""Formats and dequantization: bit-for-bit equality with gguf-py, on the real model and random blocks."""
import gguf
import numpy as np
import pytest

from labkernels import quants
from labkernels.rounds import r01_layout

GT = {"q4_K": gguf.GGMLQuantizationType.Q4_K, "q6_K": gguf.GGMLQuantizationType.Q6_K,
      "q8_0": gguf.GGMLQuantizationType.Q8_0, "q5_0": gguf.GGMLQuantizationType.Q5_0}


def _random_blocks(qtype, n, rng):
    if qtype == "q6_K":
        return r01_layout.random_q6k_blocks(n, rng)
    if qtype == "q4_K":
        return r01_layout.random_q4k_blocks(n, rng)
    _, nb = quants.BLOCK_SIZES[qtype]
    b = rng.integers(0, 256, size=(n, nb), dtype=np.uint8)
    b[:, 0:2] = rng.uniform(-1, 1, n).astype("<f2").view(np.uint8).reshape(n, 2)
    return b


def _same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K", "q8_0", "q5_0"])
def test_random_blocks_bit_exact(qtype, rng):
    raw = _random_blocks(qtype, 3000, rng).reshape(100, -1)
    assert _same_bits(quants.dequantize(raw, qtype), gguf.quants.dequantize(raw, GT[qtype]))


def test_every_tensor_of_the_real_model_bit_exact(model):
    seen = set()
    for t in model.tensors():
        if t.qtype in GT:
            raw = t.raw()
            assert _same_bits(quants.dequantize(raw, t.qtype), gguf.quants.dequantize(raw, GT[t.qtype])), t.name
            seen.add(t.qtype)
    assert seen == set(GT)


def test_padded_stride_same_values(rng):
    raw = r01_layout.random_q6k_blocks(512, rng).reshape(8, -1)
    padded = quants.pad_q6k(raw)
    assert padded.shape == (8, 64 * 224)
    assert _same_bits(quants.dequantize(padded, "q6_K_224"), quants.dequantize(raw, "q6_K"))
    assert np.array_equal(quants.unpad_q6k(padded), raw)


def test_structured_views_match_layout():
    assert quants.BLOCK_DTYPES["q6_K"].fields["d"][1] == 208
    assert quants.BLOCK_DTYPES["q6_K"].fields["scales"][1] == 192
    assert quants.BLOCK_DTYPES["q4_K"].fields["qs"][1] == 16
    assert quants.BLOCK_DTYPES["q8_1"].itemsize == 36


def test_bad_raw_data_errors():
    with pytest.raises(quants.QuantFormatError, match="multiple of the 210-byte"):
        quants.dequantize(np.zeros((2, 211), np.uint8), "q6_K")
    with pytest.raises(quants.QuantFormatError, match="uint8"):
        quants.dequantize(np.zeros((2, 210), np.float32), "q6_K")
    with pytest.raises(quants.QuantFormatError, match="unsupported"):
        quants.dequantize(np.zeros((2, 210), np.uint8), "q3_K")


def test_quantize_roundtrip_and_errors(rng):
    x = rng.standard_normal((4, 512)).astype(np.float32)
    for qt, tol in (("q8_0", 0.01), ("q6_K", 0.03), ("q4_K", 0.1)):
        raw = quants.quantize(x, qt)
        assert raw.shape == (4, quants.row_bytes(qt, 512))
        err = np.linalg.norm(quants.dequantize(raw, qt) - x) / np.linalg.norm(x)
        assert err < tol, (qt, err)
    assert quants.quantize(x[0], "q6_K").shape == (quants.row_bytes("q6_K", 512),)
    assert quants.quantize(x, "q6_K_224").shape == (4, 2 * 224)
    with pytest.raises(ValueError, match="256"):
        quants.quantize(rng.standard_normal((2, 320)).astype(np.float32), "q6_K")
    with pytest.raises(quants.QuantFormatError, match="multiple of 256"):
        quants.row_bytes("q4_K", 300)


def _lab_imports(module: str) -> set[str]:
    """The labkernels modules a module imports anywhere in it (lazy imports inside functions included)."""
    import ast
    from pathlib import Path

    import labkernels

    path = Path(labkernels.__file__).parent / (module.replace(".", "/") + ".py")
    pkg = module.rsplit(".", 1)[0] if "." in module else ""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)] if pkg else []
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            out |= {mod} if node.module else {".".join([*base, a.name]) for a in node.names}
    return {m for m in out if m}


def test_the_format_modules_import_one_way():
    """layout (element maps) <- quantize_ref <- quants <- model <- rounds.r01_layout (the verifier): no circle."""
    assert _lab_imports("layout") == set()
    assert _lab_imports("quantize_ref") <= {"layout"}
    assert _lab_imports("quants") <= {"layout", "quantize_ref"}
    assert "layout" not in _lab_imports("model") and "quantize_ref" not in _lab_imports("model")
    assert {"layout", "quants", "model"} >= _lab_imports("rounds.r01_layout")


def test_one_record_per_type_sizes_from_one_table():
    for name, t in quants.QTYPES.items():
        assert quants.BLOCK_SIZES[name] == (t.qk, t.nbytes) and quants.BLOCK_DTYPES[name].itemsize == t.nbytes
        assert quants.normalize_qtype(t.ggml) == name if t.ggml else True
    assert quants.qtype_info("Q6_K").gemm_strides == (210, 224) and quants.qtype_info("q4_K").gemm_strides == (144,)
    assert quants.QTYPES["q6_K_224"].base == "q6_K"
    with pytest.raises(quants.QuantFormatError, match="quantize does not support 'q5_0'"):
        quants.quantize(np.zeros((1, 32), np.float32), "q5_0")


def test_gpu_upload_reads_the_type_records():
    from labkernels import errors, gpu

    with pytest.raises(errors.ShapeError, match="take q4_K or q6_K weights, not q8_0"):
        gpu.QWeight.upload(np.zeros((3, 34), np.uint8), "q8_0")
    with pytest.raises(errors.ShapeError, match="q4_K block stride must be 144, got 160"):
        gpu.QWeight.upload(np.zeros((3, 144), np.uint8), "q4_K", 160)
    with pytest.raises(errors.ShapeError, match="not whole 210-byte blocks"):
        gpu.QWeight.upload(np.zeros((3, 224), np.uint8), "q6_K_224")
