"""Tests for labkernels.quantize_ref (CPU only).

The exactness tests compare the vectorized quantizers with a deliberately slow,
literal, scalar transcription of ggml's C reference functions
(``nearest_int``, ``make_qx_quants``, ``make_qkx2_quants``, ``get_scale_min_k4``,
``quantize_row_q4_K_ref``, ``quantize_row_q6_K_ref``, ``quantize_row_q8_0_ref``,
``quantize_row_q8_1_ref``), evaluated with numpy float32 scalars so that every
C float operation rounds to float32 in the same order.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402

from labkernels import quantize_ref as qr  # noqa: E402
from labkernels import quants  # noqa: E402

F = np.float32


# =========================================================================== #
# literal scalar transcription of the C reference (slow, for testing only)
# =========================================================================== #
def c_nearest_int(fval) -> int:
    val = F(fval) + F(12582912.0)
    (i,) = struct.unpack("<i", struct.pack("<f", float(val)))
    return (i & 0x007FFFFF) - 0x00400000


def c_fp32_to_fp16(f) -> np.float16:
    return np.float16(F(f))


def c_fp16_to_fp32(h) -> np.float32:
    return F(h)


def c_make_qx_quants(n, nmax, x, L, rmse_type, qw):
    max_ = F(0)
    amax = F(0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            max_ = x[i]
    if amax < F(1e-15):
        for i in range(n):
            L[i] = 0
        return F(0)
    iscale = F(-nmax) / max_
    assert rmse_type == 1 and qw is None  # the only variant q6_K uses
    sumlx = F(0)
    suml2 = F(0)
    for i in range(n):
        l = c_nearest_int(iscale * x[i])
        l = max(-nmax, min(nmax - 1, l))
        L[i] = l + nmax
        w = x[i] * x[i]
        sumlx += w * x[i] * F(l)
        suml2 += w * F(l) * F(l)
    scale = sumlx / suml2 if suml2 else F(0)
    best = scale * sumlx
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        iscale = -(F(nmax) + F(0.1) * F(is_)) / max_
        sumlx = suml2 = F(0)
        for i in range(n):
            l = c_nearest_int(iscale * x[i])
            l = max(-nmax, min(nmax - 1, l))
            w = x[i] * x[i]
            sumlx += w * x[i] * F(l)
            suml2 += w * F(l) * F(l)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                l = c_nearest_int(iscale * x[i])
                L[i] = nmax + max(-nmax, min(nmax - 1, l))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


def c_make_qkx2_quants(n, nmax, x, weights, L, Laux, rmin, rdelta, nstep, use_mad):
    """Returns (scale, the_min)."""
    min_ = x[0]
    max_ = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < min_:
            min_ = x[i]
        if x[i] > max_:
            max_ = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if min_ > 0:
        min_ = F(0)
    if max_ == min_:
        for i in range(n):
            L[i] = 0
        return F(0), -min_
    iscale = F(nmax) / (max_ - min_)
    scale = F(1) / iscale
    best_error = F(0)
    for i in range(n):
        l = c_nearest_int(iscale * (x[i] - min_))
        L[i] = max(0, min(nmax, l))
        diff = scale * F(L[i]) + min_ - x[i]
        diff = abs(diff) if use_mad else diff * diff
        w = weights[i]
        best_error += w * diff
    if nstep < 1:
        return scale, -min_
    for is_ in range(nstep + 1):
        iscale = (F(rmin) + F(rdelta) * F(is_) + F(nmax)) / (max_ - min_)
        sum_l = F(0)
        sum_l2 = F(0)
        sum_xl = F(0)
        for i in range(n):
            l = c_nearest_int(iscale * (x[i] - min_))
            l = max(0, min(nmax, l))
            Laux[i] = l
            w = weights[i]
            sum_l += w * F(l)
            sum_l2 += w * F(l) * F(l)
            sum_xl += w * F(l) * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = F(0)
                this_scale = sum_xl / sum_l2
            cur_error = F(0)
            for i in range(n):
                diff = this_scale * F(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                w = weights[i]
                cur_error += w * diff
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                min_ = this_min
    return scale, -min_


def c_get_scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)
    m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4)
    return d, m


def c_quantize_block_q4_K(x) -> bytes:
    """quantize_row_q4_K_ref for one 256-element block."""
    x = [F(v) for v in x]
    L = [0] * 256
    Laux = [0] * 32
    mins = [F(0)] * 8
    scales = [F(0)] * 8
    max_scale = F(0)
    max_min = F(0)
    for j in range(8):
        xs = x[32 * j: 32 * j + 32]
        sum_x2 = F(0)
        for l in range(32):
            sum_x2 += xs[l] * xs[l]
        av_x = np.sqrt(sum_x2 / F(32))
        weights = [av_x + abs(xs[l]) for l in range(32)]
        Lj = [0] * 32
        scales[j], mins[j] = c_make_qkx2_quants(32, 15, xs, weights, Lj, Laux, -1.0, 0.1, 20, False)
        L[32 * j: 32 * j + 32] = Lj
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    inv_scale = F(63) / max_scale if max_scale > 0 else F(0)
    inv_min = F(63) / max_min if max_min > 0 else F(0)
    ysc = [0] * 12
    for j in range(8):
        ls = c_nearest_int(inv_scale * scales[j]) & 0xFF  # uint8_t
        lm = c_nearest_int(inv_min * mins[j]) & 0xFF
        ls = min(63, ls)
        lm = min(63, lm)
        if j < 4:
            ysc[j] = ls
            ysc[j + 4] = lm
        else:
            ysc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            ysc[j - 4] |= (ls >> 4) << 6
            ysc[j - 0] |= (lm >> 4) << 6
    yd = c_fp32_to_fp16(max_scale / F(63))
    ydmin = c_fp32_to_fp16(max_min / F(63))
    for j in range(8):
        sc, m = c_get_scale_min_k4(j, ysc)
        d = c_fp16_to_fp32(yd) * F(sc)
        if not d:
            continue
        dm = c_fp16_to_fp32(ydmin) * F(m)
        for ii in range(32):
            l = c_nearest_int((x[32 * j + ii] + dm) / d)
            L[32 * j + ii] = max(0, min(15, l))
    q = []
    for j in range(0, 256, 64):
        for l in range(32):
            q.append(L[j + l] | (L[j + l + 32] << 4))
    return yd.tobytes() + ydmin.tobytes() + bytes(ysc) + bytes(q)


def c_quantize_block_q6_K(x) -> bytes:
    """quantize_row_q6_K_ref for one 256-element block."""
    x = [F(v) for v in x]
    L = [0] * 256
    scales = [F(0)] * 16
    max_scale = F(0)
    max_abs_scale = F(0)
    for ib in range(16):
        Lj = [0] * 16
        scale = c_make_qx_quants(16, 32, x[16 * ib: 16 * ib + 16], Lj, 1, None)
        L[16 * ib: 16 * ib + 16] = Lj
        scales[ib] = scale
        abs_scale = abs(scale)
        if abs_scale > max_abs_scale:
            max_abs_scale = abs_scale
            max_scale = scale
    if max_abs_scale < F(1e-15):
        return bytes(210)
    iscale = F(-128) / max_scale
    yd = c_fp32_to_fp16(F(1) / iscale)
    ysc = []
    for ib in range(16):
        v = min(127, c_nearest_int(iscale * scales[ib]))
        ysc.append(((v + 128) & 0xFF) - 128)  # int8_t
    for j in range(16):
        d = c_fp16_to_fp32(yd) * F(ysc[j])
        if not d:
            continue
        for ii in range(16):
            l = c_nearest_int(x[16 * j + ii] / d)
            l = max(-32, min(31, l))
            L[16 * j + ii] = l + 32
    ql = [0] * 128
    qh = [0] * 64
    for half, j in enumerate(range(0, 256, 128)):
        for l in range(32):
            q1 = L[j + l + 0] & 0xF
            q2 = L[j + l + 32] & 0xF
            q3 = L[j + l + 64] & 0xF
            q4 = L[j + l + 96] & 0xF
            ql[64 * half + l + 0] = q1 | (q3 << 4)
            ql[64 * half + l + 32] = q2 | (q4 << 4)
            qh[32 * half + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2)
                                 | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6))
    return bytes(ql) + bytes(qh) + bytes(v & 0xFF for v in ysc) + yd.tobytes()


def c_roundf(v) -> int:
    a = abs(float(v))
    f = np.floor(a)
    r = f + 1 if a - f >= 0.5 else f
    return int(-r if v < 0 else r)


def c_quantize_block_q8_1(x):
    x = [F(v) for v in x]
    amax = F(0)
    for v in x:
        amax = max(amax, abs(v))
    d = amax / F(127)
    id_ = F(1) / d if d else F(0)
    qs = [c_roundf(v * id_) for v in x]
    s = c_fp32_to_fp16(F(sum(qs)) * d)
    return c_fp32_to_fp16(d), s, qs


def _ref_rows(fn, x):
    with np.errstate(all="ignore"):
        return _ref_rows_impl(fn, x)


def _ref_rows_impl(fn, x):
    rows, n = x.shape
    out = []
    for r in range(rows):
        out.append(b"".join(fn(x[r, b * 256:(b + 1) * 256]) for b in range(n // 256)))
    return np.frombuffer(b"".join(out), dtype=np.uint8).reshape(rows, -1)


# =========================================================================== #
# test data
# =========================================================================== #
def edge_blocks() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    g = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    b = {}
    b["zeros"] = np.zeros(256, np.float32)
    b["neg_zeros"] = -np.zeros(256, np.float32)
    b["const_pos"] = np.full(256, 0.7, np.float32)
    b["const_neg"] = np.full(256, -0.3, np.float32)
    v = g(256) * F(0.01)
    v[77] = F(1000.0)
    b["outlier_pos"] = v
    v = g(256) * F(0.02)
    v[3] = F(-500.0)
    b["outlier_neg"] = v
    b["negative_only"] = -np.abs(g(256))
    b["positive_only"] = np.abs(g(256)) + F(0.5)
    b["tiny_1e-30"] = g(256) * F(1e-30)
    b["tiny_1e-10"] = g(256) * F(1e-10)  # q6_K: fp16 d underflows to 0
    b["subnormal"] = g(256) * F(1e-41)
    b["large_1e4"] = g(256) * F(1e4)
    b["fp16_overflow_1e7"] = g(256) * F(1e7)
    v = g(256)
    v[:128] = 0
    b["half_zero"] = v
    v = g(256)
    v[32:64] *= F(1e-9)  # one q4_K sub-block (and 2 q6_K ones) rounds to scale 0
    v[160:176] = 0
    b["one_tiny_subblock"] = v
    v = np.zeros(256, np.float32)
    v[rng.choice(256, 9, replace=False)] = g(9)
    b["sparse"] = v
    b["halves_ties"] = (rng.integers(-16, 16, 256) * 0.5).astype(np.float32)
    b["small_ints"] = rng.integers(-3, 4, 256).astype(np.float32)
    b["uniform"] = rng.uniform(-1, 1, 256).astype(np.float32)
    b["shifted"] = g(256) + F(5.0)
    b["heavy_tail"] = (g(256) ** 3).astype(np.float32)
    v = g(256)
    v[::2] = -0.0
    b["signed_zeros_mix"] = v
    return b


def random_blocks(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = (10.0 ** rng.uniform(-4, 3, size=(n, 1))).astype(np.float32)
    x = rng.standard_normal((n, 256)).astype(np.float32) * scales
    # every 4th block: per-sub-block scale variation, as in real weights
    sub = (10.0 ** rng.uniform(-2, 0, size=(n, 8, 1))).astype(np.float32)
    x[::4] = (x.reshape(n, 8, 32) * sub).reshape(n, 256)[::4]
    return x


@pytest.fixture(scope="module")
def exact_blocks() -> np.ndarray:
    eb = np.stack(list(edge_blocks().values()))
    return np.concatenate([eb, random_blocks(160, 7)], axis=0)


# =========================================================================== #
# nearest_int / small pieces
# =========================================================================== #
def test_nearest_int_is_round_half_even_and_bit_exact():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 3.4999998, 7.0, -0.0,
                  4194303.0, -4194304.0, 5e6, -1e7, 123456789.0, 1e30], dtype=np.float32)
    got = qr.nearest_int(v)
    assert got.dtype == np.int32
    assert got.tolist() == [c_nearest_int(F(t)) for t in v]
    assert got[:10].tolist() == [0, 2, 2, 0, -2, -2, 0, 3, 7, 0]


# =========================================================================== #
# bit-exactness vs literal C transcription
# =========================================================================== #
def test_q4_K_matches_scalar_c_transcription(exact_blocks):
    got = qr.quantize_q4_K(exact_blocks, overflow="ggml")  # the edge blocks include an fp16 overflow
    want = _ref_rows(c_quantize_block_q4_K, exact_blocks)
    assert got.shape == (exact_blocks.shape[0], 144)
    names = list(edge_blocks()) + [f"random{i}" for i in range(exact_blocks.shape[0])]
    bad = [names[i] for i in np.nonzero((got != want).any(axis=1))[0]]
    assert not bad, f"q4_K blocks differing from the C transcription: {bad}"


def test_q6_K_matches_scalar_c_transcription(exact_blocks):
    got = qr.quantize_q6_K(exact_blocks)
    want = _ref_rows(c_quantize_block_q6_K, exact_blocks)
    assert got.shape == (exact_blocks.shape[0], 210)
    names = list(edge_blocks()) + [f"random{i}" for i in range(exact_blocks.shape[0])]
    bad = [names[i] for i in np.nonzero((got != want).any(axis=1))[0]]
    assert not bad, f"q6_K blocks differing from the C transcription: {bad}"


def test_k_quants_multi_block_rows_and_chunking(monkeypatch):
    """Several blocks per row, several rows per chunk and several chunks."""
    x = random_blocks(24, 99).reshape(6, 1024)
    x[2, 256:512] = 0.0
    want4 = _ref_rows(c_quantize_block_q4_K, x)
    want6 = _ref_rows(c_quantize_block_q6_K, x)
    np.testing.assert_array_equal(qr.quantize_q4_K(x), want4)
    np.testing.assert_array_equal(qr.quantize_q6_K(x), want6)
    monkeypatch.setattr(qr, "_CHUNK_ELEMS", 2048)  # 2 rows per chunk
    np.testing.assert_array_equal(qr.quantize_q4_K(x), want4)
    np.testing.assert_array_equal(qr.quantize_q6_K(x), want6)
    # non-contiguous input
    xf = np.asfortranarray(x)
    np.testing.assert_array_equal(qr.quantize_q4_K(xf), want4)
    np.testing.assert_array_equal(qr.quantize_q6_K(xf[:, :]), want6)


def test_fast_rounding_path_and_threads_do_not_change_bytes(monkeypatch):
    rng = np.random.default_rng(21)
    x = random_blocks(64, 5).reshape(16, 1024)
    x[3] = rng.standard_normal(1024).astype(np.float32) * F(1e-38)  # iscale overflow
    monkeypatch.setattr(qr, "_CHUNK_ELEMS", 4096)  # 4 rows per chunk -> 4 chunks
    ref4 = qr.quantize_q4_K(x, num_threads=1)
    ref6 = qr.quantize_q6_K(x, num_threads=1)
    np.testing.assert_array_equal(qr.quantize_q4_K(x, num_threads=3), ref4)
    np.testing.assert_array_equal(qr.quantize_q6_K(x, num_threads=3), ref6)
    monkeypatch.setattr(qr, "_all_in_range", lambda *b: False)  # always the bit-level path
    np.testing.assert_array_equal(qr.quantize_q4_K(x, num_threads=1), ref4)
    np.testing.assert_array_equal(qr.quantize_q6_K(x, num_threads=1), ref6)


def test_special_cases_layout():
    z = np.zeros((1, 256), np.float32)
    assert not qr.quantize_q6_K(z).any()  # memset(&y[i], 0, ...)
    q4 = qr.quantize_q4_K(z)
    assert not q4.any()
    # constant negative block: make_qkx2_quants hits max == min -> scale 0, min = -c
    c = np.full((1, 256), -0.25, np.float32)
    raw = qr.quantize_q4_K(c)
    assert raw[0, 0:2].view(np.float16)[0] == 0  # d
    assert raw[0, 2:4].view(np.float16)[0] == np.float16(0.25 / 63)  # dmin
    np.testing.assert_allclose(qr.dequantize(raw, "q4_K"), c, rtol=2e-3)


# =========================================================================== #
# q8_0 / q8_1
# =========================================================================== #
def _q8_inputs():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    x[1, :32] = 0
    x[2, :32] = (rng.integers(-40, 40, 32) * 0.5).astype(np.float32)  # ties
    x[3, 32:64] = 127.0 / 2 * np.linspace(-1, 1, 32, dtype=np.float32)
    x[4] *= F(1e-30)
    x[5] *= F(1e4)
    return x


def test_q8_0_bit_exact_vs_gguf():
    x = _q8_inputs()
    ours = qr.quantize_q8_0(x)
    theirs = gguf.quants.quantize(x, QT.Q8_0)
    assert ours.shape == theirs.shape == (8, 16 * 34)
    np.testing.assert_array_equal(ours, theirs)
    rng = np.random.default_rng(11)
    big = rng.standard_normal((300, 4096)).astype(np.float32)
    np.testing.assert_array_equal(qr.quantize_q8_0(big), gguf.quants.quantize(big, QT.Q8_0))


def test_q8_1_matches_scalar_c_transcription_and_packing():
    x = _q8_inputs()
    qs, d, s = qr.quantize_q8_1(x, overflow="ggml")  # row 5 (x 1e4): s = d*sum(qs) overflows fp16
    assert qs.dtype == np.int8 and qs.shape == x.shape
    assert d.dtype == np.float16 and d.shape == (8, 16)
    assert s.dtype == np.float16 and s.shape == (8, 16)
    for r in range(x.shape[0]):
        for b in range(16):
            with np.errstate(all="ignore"):
                wd, ws, wq = c_quantize_block_q8_1(x[r, 32 * b: 32 * b + 32])
            assert d[r, b].tobytes() == wd.tobytes()
            assert s[r, b].tobytes() == ws.tobytes()
            assert qs[r, 32 * b: 32 * b + 32].tolist() == wq
    # q8_1 quants are the q8_0 quants
    q80 = qr.quantize_q8_0(x).reshape(8, 16, 34)
    np.testing.assert_array_equal(q80[:, :, 2:].view(np.int8).reshape(8, 512), qs)
    packed = qr.pack_q8_1(qs, d, s)
    assert packed.shape == (8, 16 * 36) and packed.dtype == np.uint8
    blk = packed.reshape(8, 16, 36)
    np.testing.assert_array_equal(blk[:, :, 0:2].copy().view(np.float16)[..., 0], d)
    np.testing.assert_array_equal(blk[:, :, 2:4].copy().view(np.float16)[..., 0], s)
    np.testing.assert_array_equal(blk[:, :, 4:].view(np.int8).reshape(8, 512), qs)


# =========================================================================== #
# round trip quality
# =========================================================================== #
@pytest.fixture(scope="module")
def gauss() -> np.ndarray:
    return np.random.default_rng(2024).standard_normal((128, 4096)).astype(np.float32)


def test_roundtrip_rmse_bounds(gauss):
    # measured on this data: q4_K 0.07136, q6_K 0.01773, q8_0 = q8_1 0.00535 (the same on
    # 4096x11008 N(0,1): 0.07135 / 0.01773 / 0.00535).  These are ggml's own numbers for
    # Gaussian weights: the ref quantizers are matched bit for bit, so they can't be 'improved'.
    r4 = qr.roundtrip_rmse(gauss, QT.Q4_K)
    r6 = qr.roundtrip_rmse(gauss, QT.Q6_K)
    r8 = qr.roundtrip_rmse(gauss, QT.Q8_0)
    r81 = qr.roundtrip_rmse(gauss, "q8_1")
    assert 0.06 < r4 < 0.08
    assert 0.015 < r6 < 0.02
    assert 0.004 < r8 < 0.006
    assert r81 == pytest.approx(r8, rel=0, abs=0)  # same quants, same fp16 d
    assert r8 < r6 < r4
    assert qr.roundtrip_rmse(gauss, "Q4_K") == r4
    assert qr.roundtrip_rmse(gauss.astype(np.float64), "q4_K") == r4  # converted to float32


def test_roundtrip_via_gguf_dequantize(gauss):
    x = gauss[:16]
    for fn, qt, tol in ((qr.quantize_q4_K, QT.Q4_K, 0.08), (qr.quantize_q6_K, QT.Q6_K, 0.02),
                        (qr.quantize_q8_0, QT.Q8_0, 0.006)):
        raw = fn(x)
        deq = gguf.quants.dequantize(raw, qt)
        assert deq.shape == x.shape
        rel = np.linalg.norm(deq - x) / np.linalg.norm(x)
        assert rel < tol, (qt.name, rel)


def test_q4_K_q6_K_error_ordering_on_scaled_data():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((32, 1024)) * 10.0 ** rng.uniform(-3, 2, (32, 1))).astype(np.float32)
    assert qr.roundtrip_rmse(x, "q6_K") < qr.roundtrip_rmse(x, "q4_K")


# =========================================================================== #
# error handling
# =========================================================================== #
@pytest.mark.parametrize("fn,mult", [(qr.quantize_q4_K, 256), (qr.quantize_q6_K, 256),
                                     (qr.quantize_q8_0, 32), (qr.quantize_q8_1, 32)])
def test_bad_shapes(fn, mult):
    with pytest.raises(ValueError, match=rf"\(4, {mult + 16}\).*multiple of {mult}"):
        fn(np.zeros((4, mult + 16), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        fn(np.zeros(mult * 2, np.float32))
    with pytest.raises(ValueError, match="2-D"):
        fn(np.zeros((2, 2, mult), np.float32))
    with pytest.raises(ValueError, match="multiple"):
        fn(np.zeros((2, 0), np.float32))
    with pytest.raises(ValueError, match="float32"):
        fn(np.zeros((2, mult), np.float64))


@pytest.mark.parametrize("fn", [qr.quantize_q4_K, qr.quantize_q6_K, qr.quantize_q8_0, qr.quantize_q8_1])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rejected(fn, bad):
    x = np.ones((3, 512), np.float32)
    x[2, 300] = bad
    with pytest.raises(ValueError, match=r"NaN or inf.*row 2, column 300"):
        fn(x)


def test_pack_q8_1_and_qtype_validation():
    qs, d, s = qr.quantize_q8_1(np.ones((2, 64), np.float32))
    with pytest.raises(ValueError, match="shape"):
        qr.pack_q8_1(qs, d[:, :1], s)
    with pytest.raises(ValueError, match="int8"):
        qr.pack_q8_1(qs.astype(np.int16), d, s)
    with pytest.raises(ValueError, match="unsupported qtype"):
        qr.roundtrip_rmse(np.ones((2, 256), np.float32), "q5_K")


def test_empty_rows_ok():
    assert qr.quantize_q4_K(np.zeros((0, 512), np.float32)).shape == (0, 288)
    assert qr.quantize_q6_K(np.zeros((0, 256), np.float32)).shape == (0, 210)


# =========================================================================== #
# fp16 scale overflow and bad dtypes: an error naming the row and block
# =========================================================================== #
def _raw(qtype, x, **kw):
    """Raw blocks of x from the reference quantizer of qtype."""
    if qtype == "q8_1":
        return qr.pack_q8_1(*qr.quantize_q8_1(x, **kw))
    return {"q4_K": qr.quantize_q4_K, "q6_K": qr.quantize_q6_K, "q8_0": qr.quantize_q8_0}[qtype](x, **kw)


@pytest.mark.parametrize("qtype,qk,amp,match", [
    ("q4_K", 256, 1e7, r"dmin = inf"),
    ("q4_K", 256, 1e8, r"block max \|x\| = .* exceeds the 6\.19013e\+07 a q4_K block can encode"),
    ("q6_K", 256, 1e10, r"exceeds the 2\.68304e\+08 a q6_K block"),
    ("q6_K", 256, 1e20, r"exceeds the 2\.68304e\+08 a q6_K block"),  # ggml: a block of zeros
    ("q8_0", 32, 1e7, r"exceeds the 8\.31901e\+06 a q8_0 block"),
    ("q8_1", 32, 1e7, r"exceeds the 8\.31901e\+06 a q8_1 block"),
])
def test_scale_overflow_raises_naming_row_and_block(qtype, qk, amp, match):
    x = np.random.default_rng(3).standard_normal((4, 2 * qk)).astype(np.float32) * F(1e-2)
    x[2, qk + 5] = F(amp)  # row 2, block 1 only
    x[2, qk + 6] = F(-amp)
    for fn in (_raw, quants.quantize):
        with pytest.raises(qr.QuantOverflowError, match=match) as e:
            fn(qtype, x) if fn is _raw else fn(x, qtype)
        assert f"row 2, block 1 (columns {qk}..{2 * qk - 1})" in str(e.value)
    # what ggml writes for the same input: an inf / NaN scale (which dequantize refuses, naming the block), or
    # (q6_K at 1e20) a block of zeros
    raw = _raw(qtype, x, overflow="ggml")
    bad, _ = quants.nonfinite_scales(raw, qtype)
    if len(bad):
        assert bad.tolist() == [2 * 2 + 1]
        with pytest.raises(quants.QuantFormatError, match=r"block 5 \(row 2, block 1 of the row\) has a non-finite"):
            quants.dequantize(raw, qtype)
    else:
        blk = quants.dequantize(raw, qtype)[2, qk:2 * qk]
        assert np.abs(blk - x[2, qk:2 * qk]).max() > 0.5 * amp


def test_just_below_the_limit_is_fine():
    x = np.zeros((1, 256), np.float32)
    x[0, 0] = F(6.0e6)
    raw = qr.quantize_q4_K(x)
    assert abs(quants.dequantize(raw, "q4_K")[0, 0] - 6.0e6) / 6.0e6 < 0.01
    y = np.full((1, 32), F(8.0e6))
    assert abs(quants.dequantize(qr.quantize_q8_0(y), "q8_0")[0, 0] - 8.0e6) / 8.0e6 < 0.01


def test_q8_1_sum_overflow():
    x = np.full((3, 64), F(1.0), np.float32)
    x[1, 32:] = F(2100.0)  # d = 16.5 fits, s = d * 32 * 127 = 67200 does not
    with pytest.raises(qr.QuantOverflowError, match=r"row 1, block 1 .*s = d\*sum\(qs\) = inf"):
        qr.quantize_q8_1(x)
    x[1, 32:] = F(2000.0)
    qs, d, s = qr.quantize_q8_1(x)
    assert np.isfinite(s).all()


def test_complex_and_non_numeric_input_is_refused():
    z = np.ones((2, 256), np.complex64)
    for f in (qr.quantize_q4_K, qr.quantize_q6_K, qr.quantize_q8_0, qr.quantize_q8_1):
        with pytest.raises(ValueError, match="complex input"):
            f(z)
    for qt in ("q4_K", "q6_K", "q8_0", "q8_1"):
        with pytest.raises(ValueError, match="complex input"):
            quants.quantize(z, qt)
        with pytest.raises(ValueError, match="complex input"):
            qr.roundtrip_rmse(z, qt)
    with pytest.raises(ValueError, match="real numbers"):
        quants.quantize(np.array([["a"] * 256]), "q4_K")
    with pytest.raises(ValueError, match=r"x\[0, 7\] = 1e\+300 is beyond float32's range"):
        quants.quantize(np.where(np.arange(256) == 7, 1e300, 0.5)[None], "q4_K")
    with pytest.raises(ValueError, match="overflow must be"):
        qr.quantize_q4_K(np.zeros((1, 256), np.float32), overflow="ignore")
