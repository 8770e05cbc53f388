"""The GGUF pre-check: hostile files end in a ModelError naming the file, offset and field, fast and with
bounded memory, before gguf-py reads anything."""
import os
import struct
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkernels import model as M
from labkernels.gguf_check import check_gguf


# ------------------------------------------------------------------ a hand-written GGUF builder (v3, LE)
def gstr(s) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return gstr(key) + struct.pack("<II", 4, v)


def tinfo(name, dims, gtype=0, offset=0):
    return gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", gtype, offset)


def gguf_file(kvs=(), tensors=(), data=b"", alignment=32, version=3):
    """header + metadata + tensor table, padded to the alignment, then ``data``."""
    body = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(tensors)
    pad = (-len(body)) % alignment
    return body + bytes(pad) + data


def f32_tensor_file(n=8, name="w"):
    return gguf_file([kv_u32("x.count", 1)], [tinfo(name, [n], 0, 0)], np.arange(n, dtype=np.float32).tobytes())


def write(tmp_path, data, name="t.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


# ------------------------------------------------------------------ the cases
HANG_51 = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("arr") + struct.pack("<IIQ", 9, 0, 2 ** 40)


def test_51_byte_array_bomb_fails_fast_with_bounded_memory(tmp_path):
    assert len(HANG_51) == 51
    p = write(tmp_path, HANG_51, "h.gguf")
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(M.ModelError) as e:
        M.open_model(p)
    dt = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert dt < 1.0 and peak < 4 * 2 ** 20
    msg = str(e.value)
    assert str(p) in msg and "offset 43" in msg and "'arr' array length" in msg and str(2 ** 40) in msg


def test_51_byte_file_through_the_cli_returns_quickly(tmp_path):
    p = write(tmp_path, HANG_51, "h.gguf")
    r = subprocess.run([sys.executable, "-m", "labkernels", "layout", "--model", str(p)], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert r.returncode == 2 and "ModelError" in r.stderr and "array length" in r.stderr


def test_fifo_is_refused_without_blocking(tmp_path):
    p = tmp_path / "pipe.gguf"
    os.mkfifo(p)
    t0 = time.perf_counter()
    with pytest.raises(M.ModelError, match="FIFO"):
        M.open_model(p)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("target,word", [("dir", "a directory"), ("/dev/null", "a character device")])
def test_non_regular_files(tmp_path, target, word):
    p = tmp_path if target == "dir" else target
    with pytest.raises(M.ModelError, match=word):
        M.open_model(p)


def test_unreadable_file(tmp_path, monkeypatch):
    p = write(tmp_path, f32_tensor_file())
    real_open = os.open

    def denied(path, *a, **k):
        if str(path) == str(p):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", denied)  # root may read a chmod 000 file: deny it here instead
    with pytest.raises(M.ModelError, match="permission denied"):
        M.open_model(p)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads chmod 000 files")
def test_unreadable_file_chmod(tmp_path):
    p = write(tmp_path, f32_tensor_file())
    p.chmod(0)
    with pytest.raises(M.ModelError, match="permission denied"):
        M.open_model(p)


def test_a_small_valid_file_loads(tmp_path):
    m = M.open_model(write(tmp_path, f32_tensor_file()))
    assert m.tensor("w").array().tolist() == list(range(8))


@pytest.mark.parametrize("tensors,data,match", [
    ([tinfo("w", [], 0, 0)], bytes(32), r"n_dims: 0-d tensor"),
    ([tinfo("w", [8, 0], 0, 0)], bytes(32), r"dimension 1: zero-sized tensor"),
    ([tinfo("w", [1, 1, 1, 1, 1], 0, 0)], bytes(32), r"5 dimensions"),
    ([tinfo("", [8], 0, 0)], bytes(32), r"empty tensor name"),
    ([tinfo("a" * 64, [8], 0, 0)], bytes(32), r"at most 63"),
    ([tinfo("w", [8], 0, 0), tinfo("w", [8], 0, 32)], bytes(64), r"duplicate tensor name"),
    ([tinfo("a", [8], 0, 0), tinfo("b", [8], 0, 0)], bytes(64), r"'b' data offset: 0 overlaps tensor 'a'"),
    ([tinfo("a", [16], 0, 0), tinfo("b", [8], 0, 32)], bytes(96), r"'b' data offset: 32 overlaps tensor 'a'"),
    ([tinfo("w", [8], 0, 4)], bytes(64), r"data offset: 4 is not a multiple of the alignment 32"),
    ([tinfo("w", [8], 99, 0)], bytes(32), r"type: unknown GGML type 99"),
    ([tinfo("w", [100], 12, 0)], bytes(256), r"Q4_K needs rows that are a multiple of 256"),
    ([tinfo("w", [2 ** 40, 2 ** 20], 0, 0)], bytes(32), r"tensor 'w' data: truncated: the tensor needs bytes 96\.\.4611686018427388000 "),
    ([tinfo("w", [64], 0, 0)], bytes(32), r"tensor 'w' data: truncated: the tensor needs bytes"),
])
def test_bad_tensor_tables(tmp_path, tensors, data, match):
    p = write(tmp_path, gguf_file([], tensors, data))
    with pytest.raises(M.ModelError, match=match) as e:
        M.open_model(p)
    assert str(p) in str(e.value) and "offset " in str(e.value)


@pytest.mark.parametrize("kvs,match", [
    ([kv_u32("k", 1), kv_u32("k", 2)], "duplicate key"),
    ([gstr("k") + struct.pack("<I", 42)], "unknown GGUF value type 42"),
    ([gstr("k") + struct.pack("<IIQ", 9, 9, 1)], "arrays of arrays"),
    ([gstr("k") + struct.pack("<IIQ", 9, 8, 2 ** 50)], r"1125899906842624 strings need"),
    ([gstr(b"\xff\xfe") + struct.pack("<IB", 0, 1)], "not valid UTF-8"),
    ([gstr("general.alignment") + struct.pack("<II", 4, 24)], "24 is not a power of two"),
    ([gstr("general.alignment") + struct.pack("<IQ", 10, 32)], "expected uint32"),
    ([struct.pack("<Q", 2 ** 62) + bytes(16)], "key 0 length: 4611686018427387904 bytes need"),
])
def test_bad_metadata(tmp_path, kvs, match):
    p = write(tmp_path, gguf_file(kvs))
    with pytest.raises(M.ModelError, match=match):
        M.open_model(p)


def test_huge_counts_in_the_header(tmp_path):
    for n_t, n_kv, field in ((2 ** 63, 0, "tensor count"), (0, 2 ** 60, "metadata key count")):
        p = write(tmp_path, b"GGUF" + struct.pack("<IQQ", 3, n_t, n_kv) + bytes(64))
        with pytest.raises(M.ModelError, match=f"offset (8|16): {field}: {n_t or n_kv} "):
            M.open_model(p)


def test_bad_magic_version_and_tiny_files(tmp_path):
    for data, match in ((b"", "too short"), (b"GGU", "too short"), (b"GGML" + bytes(40), "not a GGUF"),
                        (b"GGUF" + struct.pack("<I", 1) + bytes(40), "unsupported GGUF version 1"),
                        (b"GGUF" + struct.pack(">I", 3) + bytes(40), "unsupported GGUF version 50331648")):
        with pytest.raises(M.ModelError, match=match):
            M.open_model(write(tmp_path, data))


# ------------------------------------------------------------------ truncation: the specific message
def test_every_cut_of_a_small_file_says_truncated(tmp_path):
    data = gguf_file([kv_u32("a.b", 7), gstr("s") + struct.pack("<I", 8) + gstr("hello"),
                      gstr("arr") + struct.pack("<IIQ", 9, 4, 3) + bytes(12)],
                     [tinfo("w", [8], 0, 0), tinfo("v", [4], 1, 32)], bytes(40))
    M.open_model(write(tmp_path, data))  # the whole file is fine
    for cut in range(8, len(data)):
        with pytest.raises(M.ModelError, match=rf"offset \d+: .*(truncated: .*the file has {cut} bytes|"
                                                 rf"the file has {cut} bytes: truncated)"):
            check_gguf(write(tmp_path, data[:cut]))


@pytest.mark.model
@pytest.mark.parametrize("keep", [0.0001, 0.01, 0.5, 0.999])
def test_truncated_real_file_names_the_cut(model_path, tmp_path, keep):
    size = model_path.stat().st_size
    n = int(size * keep)
    p = tmp_path / "cut.gguf"
    with open(model_path, "rb") as f:
        p.write_bytes(f.read(n))
    with pytest.raises(M.ModelError, match=rf"truncated: .*the file has {n} bytes|the file has {n} bytes: truncated") as e:
        M.open_model(p)
    assert str(p) in str(e.value) and "offset" in str(e.value)


# ------------------------------------------------------------------ property-based fuzz
def _mutations():
    header = st.tuples(st.sampled_from([2, 3]), st.integers(0, 2 ** 64 - 1), st.integers(0, 2 ** 64 - 1))
    return st.one_of(
        # a random header and random bytes after it
        st.tuples(st.just("raw"), header, st.binary(max_size=200)),
        # a valid file with one u64/u32 field overwritten by a random value
        st.tuples(st.just("field"), st.integers(8, 200), st.integers(0, 2 ** 64 - 1), st.sampled_from([4, 8])),
        # a valid file cut anywhere
        st.tuples(st.just("cut"), st.integers(0, 400)),
    )


_BASE = gguf_file([kv_u32("a.count", 2), gstr("a.name") + struct.pack("<I", 8) + gstr("tiny"),
                   gstr("a.list") + struct.pack("<IIQ", 9, 8, 2) + gstr("x") + gstr("yz")],
                  [tinfo("w", [8], 0, 0), tinfo("v", [4, 2], 1, 32)], np.ones(24, np.float32).tobytes())


def _build(m) -> bytes:
    if m[0] == "raw":
        (ver, nt, nkv), rest = m[1], m[2]
        return b"GGUF" + struct.pack("<IQQ", ver, nt, nkv) + rest
    if m[0] == "field":
        off, v, w = m[1], m[2], m[3]
        b = bytearray(_BASE)
        off = min(off, len(b) - w)
        b[off:off + w] = struct.pack("<Q" if w == 8 else "<I", v % (2 ** (8 * w)))
        return bytes(b)
    return _BASE[:m[1]]


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_mutations())
def test_fuzz_precheck_ends_in_model_error_or_a_readable_model(tmp_path, m):
    data = _build(m)
    p = write(tmp_path, data, "fuzz.gguf")
    t0 = time.perf_counter()
    try:
        model = M.open_model(p)
    except M.ModelError as e:
        assert str(p) in str(e)
    else:  # accepted: then every tensor reads, with the shape its table says
        for t in model.tensors():
            assert t.raw().size > 0 and t.array().size == int(np.prod(t.shape))
    assert time.perf_counter() - t0 < 2.0, m
