"""Bad input gets a clear error that names the problem (tested with real broken files)."""
import numpy as np
import pytest

from labkernels import model as M


def test_missing_file(tmp_path):
    with pytest.raises(M.ModelError, match="not found"):
        M.open_model(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(M.ModelError, match="not a GGUF"):
        M.open_model(p)


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_real_file(model_path, tmp_path, keep):
    data = model_path.read_bytes()
    p = tmp_path / "cut.gguf"
    n = int(len(data) * keep)
    p.write_bytes(data[:n])
    # the tensor data check of the pre-check, with the cut size -- not a generic parse failure
    with pytest.raises(M.ModelError, match=rf"{p}: offset \d+: tensor '[^']+' data: truncated: the tensor needs "
                                           rf"bytes \d+\.\.\d+ but the file has {n} bytes"):
        M.open_model(p)


@pytest.mark.parametrize("n,match", [
    (4096, r"offset 8: tensor count: 236 tensor entries need at least 5664 bytes up to offset 5680 but the file "
           r"has 4096 bytes: truncated"),
    (3_000_000, r"offset \d+: metadata 'tokenizer\.ggml\.tokens' element \d+ length: (truncated: needs \d+ bytes "
                r"up to offset \d+ but the file has 3000000 bytes|\d+ bytes up to offset \d+ but the file has "
                r"3000000 bytes: truncated)"),
])
def test_truncated_header(model_path, tmp_path, n, match):
    p = tmp_path / "head.gguf"
    with open(model_path, "rb") as f:
        p.write_bytes(f.read(n))
    with pytest.raises(M.ModelError, match=match):
        M.open_model(p)


def test_wrong_tensor_type(model):
    q5 = model.tensor("blk.0.attn_q.weight")
    with pytest.raises(M.ModelError, match="Q5_0"):
        q5.require_kquant()
    with pytest.raises(M.ModelError, match="expected q4_K"):
        model.tensor("blk.0.ffn_down.weight").require_kquant("q4_K")
    with pytest.raises(M.ModelError, match="no tensor"):
        model.tensor("blk.99.nothing")


def test_kquant_listing(model):
    ts = M.kquant_weights(model)
    assert {t.qtype for t in ts} == {"q4_K", "q6_K"}
    for t in ts:
        t.require_kquant()
        assert t.cols % 256 == 0
    w = model.tensor("blk.0.ffn_down.weight")
    assert w.shape == (640, 2048) and w.raw().shape == (640, 2048 // 256 * 210)
    assert w.array().dtype == np.float32
