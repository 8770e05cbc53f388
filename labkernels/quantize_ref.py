"""Vectorized numpy re-implementation of ggml's reference quantizers.

This module reproduces, bit for bit, the *reference* (``*_ref``) row quantizers of
``ggml/src/ggml-quants.c`` for the formats the lab's kernels consume:

* :func:`quantize_q4_K` -- ``quantize_row_q4_K_ref`` (144-byte ``block_q4_K``)
* :func:`quantize_q6_K` -- ``quantize_row_q6_K_ref`` (210-byte ``block_q6_K``)
* :func:`quantize_q8_0` -- ``quantize_row_q8_0_ref`` (34-byte ``block_q8_0``)
* :func:`quantize_q8_1` / :func:`pack_q8_1` -- ``quantize_row_q8_1_ref``
  (36-byte ``block_q8_1``)

"Bit for bit" means: the same algorithm, the same float32 operations in the same
order as the C code evaluated with strict IEEE-754 single precision (no FMA
contraction, no fast-math, no flush-to-zero), the same ``nearest_int`` (the
``x + 12582912.f`` magic-number trick, i.e. round-half-to-even, *including* its
bit-level behaviour outside the +-2^22 range), the same ``roundf``
(round-half-away-from-zero) and the same round-to-nearest-even fp32 -> fp16
conversion.  Every sum that the C code accumulates element by element is
accumulated here element by element too (a Python loop over the 16/32 elements
of a sub-block, vectorized across all sub-blocks), because numpy's own
reductions use pairwise / multi-accumulator summation, which rounds differently.

Implementation notes
--------------------
Sub-blocks are processed in an "element-major" layout ``(K, S)``: ``K`` is the
sub-block length (32 for q4_K, 16 for q6_K) and ``S`` the number of sub-blocks
in the current chunk.  Every per-sub-block scalar of the C code (``min``,
``scale``, ``best_error`` ...) becomes a length-``S`` vector, and the C loops
over ``i < n`` become whole-array operations.  Only the small fixed loops remain
in Python: the 21 ``is`` steps of ``make_qkx2_quants``, the 18 ``is`` steps of
``make_qx_quants`` and the element loop of the ordered sums.  Rows are processed
in chunks (see ``_CHUNK_ELEMS``) to bound memory and keep the working set in
cache; q4_K/q6_K chunks run on a small thread pool (numpy releases the GIL in
its loops; the output does not depend on the thread count).  Where the code can
prove that every argument of ``nearest_int`` lies within +-4194303 (from per
sub-block bounds, using monotonicity of rounding) it uses the equivalent float
form ``(v + 12582912.f) - 12582912.f``; otherwise it falls back to the bit-level
emulation (e.g. subnormal inputs, where ``iscale`` overflows to inf).

Caveat on "the C result": this matches ggml-quants.c compiled *without*
floating-point contraction (e.g. plain x86-64 ``-O2``, or ``-ffp-contract=off``).
If the compiler is allowed to fuse ``a*b + c`` into FMA (GCC's default
``-ffp-contract=fast`` together with ``-march=native`` / an FMA-capable target
such as aarch64), the C output itself changes for a few percent of blocks.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import layout

__all__ = [
    "QK_K",
    "QK8_0",
    "QK8_1",
    "BLOCK_BYTES",
    "nearest_int",
    "quantize_q4_K",
    "quantize_q6_K",
    "quantize_q8_0",
    "quantize_q8_1",
    "pack_q8_1",
    "QuantOverflowError",
    "MAX_ABS",
    "dequantize",
    "roundtrip_rmse",
]

QK_K = 256
QK8_0 = 32
QK8_1 = 32

#: bytes per block for each supported type
BLOCK_BYTES = {"q4_K": 144, "q6_K": 210, "q8_0": 34, "q8_1": 36}

_F32 = np.float32
_MAGIC = _F32(12582912.0)  # 1.5 * 2**23, ggml's nearest_int constant
_GROUP_MAX_EPS = _F32(1e-15)  # GROUP_MAX_EPS in ggml-quants.c

# Target number of float32 elements per processing chunk.  ~256K elements keep
# the dozen (K, S) temporaries of the search loops in L2/L3 cache.
_CHUNK_ELEMS = 1 << 18


# The largest |x| a block of each format can encode: fp16 scales are at most 65504, times the largest
# sub-block scale and the largest code (q4_K: d*sc*q with sc <= 63, q <= 15; q6_K: d*sc*q with |sc| <= 128,
# |q| <= 32; q8_0 / q8_1: d*q with |q| <= 127). A block beyond it cannot be represented: the quantizer's fp16
# scale overflows to inf (or, past ~1e19, its float32 intermediates do and it silently writes zeros).
_FP16_MAX = 65504.0
MAX_ABS = {"q4_K": _FP16_MAX * 63 * 15, "q6_K": _FP16_MAX * 128 * 32, "q8_0": _FP16_MAX * 127,
           "q8_1": _FP16_MAX * 127}


class QuantInputError(ValueError):
    """Input the quantizers / dequantizer cannot take (type, shape, dtype, an argument out of range), named."""


class QuantOverflowError(ValueError):
    """A block whose values overflow the format's fp16 scales (named by row and block)."""


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _check_input(x: np.ndarray, multiple: int, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise QuantInputError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    if np.iscomplexobj(x):
        raise QuantInputError(f"{name}: complex input (dtype {x.dtype}) is not supported: quantizers take real "
                         "float32 values (pass x.real explicitly if that is what you mean)")
    if x.dtype != np.float32:
        raise QuantInputError(
            f"{name}: expected float32 input, got dtype {x.dtype} (shape {x.shape}); "
            "convert with x.astype(np.float32) first"
        )
    if x.ndim != 2:
        raise QuantInputError(f"{name}: expected a 2-D (rows, n) array, got shape {x.shape}")
    n = x.shape[1]
    if n == 0 or n % multiple != 0:
        raise QuantInputError(
            f"{name}: row length {n} of input shape {x.shape} is not a positive "
            f"multiple of {multiple}"
        )
    return x


def _check_finite(xc: np.ndarray, name: str, row0: int) -> None:
    if not np.isfinite(xc).all():
        bad = np.argwhere(~np.isfinite(xc))[0]
        raise QuantInputError(
            f"{name}: input contains NaN or inf (first at row {row0 + int(bad[0])}, "
            f"column {int(bad[1])}); ggml's quantizers are undefined on non-finite values"
        )


def _row_chunks(rows: int, n: int):
    step = max(1, _CHUNK_ELEMS // n)
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def _seq_sum(a: np.ndarray) -> np.ndarray:
    """``s = 0; for i: s += a[i]`` over axis 0, in float32, in element order.

    ``np.add.reduce`` would use pairwise / 8-accumulator summation for some
    shapes; this loop guarantees the C order.  The final ``+ 0`` turns a ``-0``
    (possible only when every term is ``-0``) into the ``+0`` that C's
    ``0.0f + ...`` produces.
    """
    acc = a[0] + _F32(0.0)
    for k in range(1, a.shape[0]):
        np.add(acc, a[k], out=acc)
    return acc


def _seq_sum_from_first(a: np.ndarray) -> np.ndarray:
    """``s = a[0]; for i >= 1: s += a[i]`` (C loops that start from element 0)."""
    acc = a[0].copy()
    for k in range(1, a.shape[0]):
        np.add(acc, a[k], out=acc)
    return acc


def _nearest_int_bits(v: np.ndarray) -> np.ndarray:
    """ggml ``nearest_int`` on a float32 array, returned as int32.

    ``val = fval + 12582912.f; memcpy(&i, &val, 4); return (i & 0x7fffff) - 0x400000;``
    Round-half-to-even for |fval| <= 4194303; reproduced bit-exactly (garbage
    included) outside that range.  ``v`` is consumed (overwritten).
    """
    np.add(v, _MAGIC, out=v)
    i = v.view(np.int32)
    np.bitwise_and(i, 0x007FFFFF, out=i)
    np.subtract(i, 0x00400000, out=i)
    return i


def nearest_int(v) -> np.ndarray:
    """ggml's ``nearest_int`` (magic-number round-half-to-even) on float32 input."""
    a = np.array(v, dtype=np.float32, copy=True)
    return _nearest_int_bits(a)


def _nearest_clip_f32(v: np.ndarray, lo: int, hi: int, out: np.ndarray | None = None,
                      in_range: bool = False) -> np.ndarray:
    """``MAX(lo, MIN(hi, nearest_int(v)))`` as a float32 array (``v`` consumed).

    ``in_range=True`` asserts (the caller has proven it) that every |v| <= 4194303,
    where the magic-number trick is exactly ``(v + 12582912.f) - 12582912.f`` and
    the integer round trip can be skipped.
    """
    if in_range:
        r = v if out is None else out
        np.add(v, _MAGIC, out=r)
        np.subtract(r, _MAGIC, out=r)
        np.clip(r, lo, hi, out=r)
        return r
    i = _nearest_int_bits(v)
    np.clip(i, lo, hi, out=i)
    if out is None:
        return i.astype(np.float32)
    out[...] = i
    return out


_NEAREST_SAFE = _F32(4194303.0)


def _all_in_range(*bounds: np.ndarray) -> bool:
    """True when every |bound| <= 4194303 (NaN -> False)."""
    return all(bool((np.abs(b) <= _NEAREST_SAFE).all()) for b in bounds)


def _fp16_roundtrip(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGML_FP32_TO_FP16 (RNE) and back: returns (float16 array, float32 value)."""
    h = v.astype(np.float16)
    return h, h.astype(np.float32)


def _roundf(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: round half away from zero, exact in float32."""
    a = np.abs(v)
    f = np.floor(a)
    f += (a - f) >= _F32(0.5)  # a - f is exact for every float32 a
    return np.copysign(f, v)


# --------------------------------------------------------------------------- #
# make_qkx2_quants / q4_K
# --------------------------------------------------------------------------- #
def _make_qkx2_quants(X, W, nmax, rmin, rdelta, nstep):
    """Vectorized ``make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux,
    rmin, rdelta, nstep, use_mad=false)``.

    X, W: (n, S) float32, element-major.  Returns (L float32 (n, S), scale (S,),
    the_min (S,)).
    """
    # min / max / sum_w / sum_x (C starts every accumulator from element 0)
    xmin = X.min(axis=0)
    mx = X.max(axis=0)
    T = np.empty_like(X)  # scratch
    P = np.empty_like(X)  # scratch
    Laux = np.empty_like(X)
    sum_w = _seq_sum_from_first(W)
    np.multiply(W, X, out=P)
    sum_x = _seq_sum_from_first(P)
    mn = np.where(xmin > 0, _F32(0.0), xmin)  # if (min > 0) min = 0;
    degenerate = mx == mn
    mn0 = mn.copy()

    fnmax = _F32(nmax)
    iscale = fnmax / (mx - mn)
    scale = _F32(1.0) / iscale
    np.subtract(X, mn, out=T)
    T *= iscale
    L = np.empty_like(X)
    _nearest_clip_f32(T, 0, nmax, out=L, in_range=_all_in_range(iscale * (mx - mn)))
    np.multiply(L, scale, out=P)
    P += mn
    P -= X
    np.square(P, out=P)
    P *= W
    best_error = _seq_sum(P)

    frmin, frdelta = _F32(rmin), _F32(rdelta)
    for step in range(nstep + 1):
        num = (frmin + frdelta * _F32(step)) + fnmax  # rmin + rdelta*is + nmax
        iscale = num / (mx - mn)
        np.subtract(X, mn, out=T)
        T *= iscale  # iscale*(x[i] - min)
        # x in [mn0, mx] and rounding is monotonic: the endpoints bound every v
        in_range = _all_in_range(iscale * (mn0 - mn), iscale * (mx - mn))
        _nearest_clip_f32(T, 0, nmax, out=Laux, in_range=in_range)
        WL = np.multiply(W, Laux, out=T)
        sum_l = _seq_sum(WL)
        np.multiply(WL, X, out=P)
        sum_xl = _seq_sum(P)  # w*l*x[i] == (w*l)*x
        WL *= Laux
        sum_l2 = _seq_sum(WL)  # w*l*l == (w*l)*l
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        if pos.any():
            this_min = np.where(pos, _F32(0.0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        np.multiply(Laux, this_scale, out=P)
        P += this_min
        P -= X
        np.square(P, out=P)
        P *= W
        cur_error = _seq_sum(P)
        upd = (D > 0) & (cur_error < best_error)
        if upd.any():
            np.copyto(L, Laux, where=upd)
            best_error = np.where(upd, cur_error, best_error)
            scale = np.where(upd, this_scale, scale)
            mn = np.where(upd, this_min, mn)

    if degenerate.any():  # max == min: L = 0, the_min = -min, return 0
        L[:, degenerate] = 0
        scale = np.where(degenerate, _F32(0.0), scale)
        mn = np.where(degenerate, mn0, mn)
    return L, scale, -mn


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit packing of 8 scales + 8 mins (uint8, each <= 63) into 12 bytes."""
    nb = ls.shape[0]
    out = np.empty((nb, 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    return out


def _get_scale_min_k4(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``get_scale_min_k4`` for j = 0..7 at once: (nb, 12) -> sc (nb, 8), m (nb, 8)."""
    sc = np.empty((q.shape[0], 8), dtype=np.uint8)
    m = np.empty_like(sc)
    sc[:, 0:4] = q[:, 0:4] & 63
    m[:, 0:4] = q[:, 4:8] & 63
    sc[:, 4:8] = (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)
    m[:, 4:8] = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return sc, m


def _q4_K_blocks(xb: np.ndarray) -> np.ndarray:
    """quantize_row_q4_K_ref on (nb, 256) float32 -> (nb, 144) uint8."""
    nb = xb.shape[0]
    S = nb * 8
    X = np.ascontiguousarray(xb.reshape(S, 32).T)  # (32, S)

    sum_x2 = _seq_sum(X * X)
    av_x = np.sqrt(sum_x2 / _F32(32))
    W = np.abs(X)
    W += av_x  # weights[l] = av_x + fabsf(x[l])

    L, scales, mins = _make_qkx2_quants(X, W, 15, -1.0, 0.1, 20)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)

    # max_scale / max_min: `if (v > max) max = v` starting from 0 (NaN-safe)
    max_scale = np.where(scales > 0, scales, _F32(0.0)).max(axis=1)
    max_min = np.where(mins > 0, mins, _F32(0.0)).max(axis=1)
    pos_s, pos_m = max_scale > 0, max_min > 0
    with np.errstate(divide="ignore"):
        inv_scale = np.where(pos_s, _F32(63.0) / max_scale, _F32(0.0))
        inv_min = np.where(pos_m, _F32(63.0) / max_min, _F32(0.0))
    ls = _nearest_int_bits(inv_scale[:, None] * scales)  # uint8_t ls = nearest_int(...)
    lm = _nearest_int_bits(inv_min[:, None] * mins)
    ls = np.minimum(ls & 0xFF, 63).astype(np.uint8)  # ls = MIN(63, ls)
    lm = np.minimum(lm & 0xFF, 63).astype(np.uint8)
    packed_scales = _pack_scale_min_k4(ls, lm)

    d16, d32 = _fp16_roundtrip(max_scale / _F32(63.0))
    dmin16, dmin32 = _fp16_roundtrip(max_min / _F32(63.0))

    # re-quantize with the fp16-rounded super-block scales
    sc, m = _get_scale_min_k4(packed_scales)
    d = (d32[:, None] * sc.astype(np.float32)).reshape(S)
    dm = (dmin32[:, None] * m.astype(np.float32)).reshape(S)
    nz = d != 0  # `if (!d) continue;` keeps the make_qkx2_quants L
    t = X + dm
    t /= d
    Lr = _nearest_clip_f32(t, 0, 15)
    np.copyto(L, Lr, where=nz)

    Lb = L.T.reshape(nb, 4, 2, 32).astype(np.uint8)
    qs = (Lb[:, :, 0, :] | (Lb[:, :, 1, :] << 4)).reshape(nb, 128)

    out = np.empty((nb, 144), dtype=np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(nb, 2)
    out[:, 2:4] = dmin16.view(np.uint8).reshape(nb, 2)
    out[:, 4:16] = packed_scales
    out[:, 16:144] = qs
    return out


# --------------------------------------------------------------------------- #
# make_qx_quants / q6_K
# --------------------------------------------------------------------------- #
def _make_qx_quants_rmse1(X, nmax):
    """Vectorized ``make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL)``.

    X: (n, S) float32.  Returns (L (n, S) float32 holding the C's ``l + nmax``
    -- or a raw 0 for all-zero sub-blocks --, scale (S,)).
    """
    n, S = X.shape
    A = np.abs(X)
    idx = A.argmax(axis=0)  # first index of the max |x|  (`ax > amax`)
    cols = np.arange(S)
    amax = A[idx, cols]
    mxv = X[idx, cols]
    zero = amax < _GROUP_MAX_EPS
    mxv = np.where(zero, _F32(1.0), mxv)  # avoid 0-division; result discarded

    W = X * X  # rmse_type == 1: w = x*x
    WX = W * X
    T = np.empty_like(X)
    P = np.empty_like(X)

    def trial(iscale, l):
        np.multiply(X, iscale, out=T)
        # |x| <= amax and rounding is monotonic, so |iscale*amax| bounds |v|
        _nearest_clip_f32(T, -nmax, nmax - 1, out=l,
                          in_range=_all_in_range(iscale * amax))
        np.multiply(WX, l, out=P)
        sumlx = _seq_sum(P)  # sumlx += w*x[i]*l  == (w*x)*l
        np.multiply(W, l, out=P)
        np.multiply(P, l, out=P)
        suml2 = _seq_sum(P)  # suml2 += w*l*l == (w*l)*l
        return sumlx, suml2

    fnmax = _F32(nmax)
    iscale = -fnmax / mxv
    L = np.empty_like(X)
    sumlx, suml2 = trial(iscale, L)
    l = np.empty_like(X)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, _F32(0.0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fnmax + _F32(0.1) * _F32(step)) / mxv
        sumlx, suml2 = trial(iscale, l)
        upd = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        if upd.any():
            np.copyto(L, l, where=upd)
            with np.errstate(divide="ignore", invalid="ignore"):
                scale = np.where(upd, sumlx / suml2, scale)
            best = np.where(upd, scale * sumlx, best)
    L += fnmax
    if zero.any():
        L[:, zero] = 0
        scale = np.where(zero, _F32(0.0), scale)
    return L, scale


def _q6_K_blocks(xb: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref on (nb, 256) float32 -> (nb, 210) uint8."""
    nb = xb.shape[0]
    S = nb * 16
    X = np.ascontiguousarray(xb.reshape(S, 16).T)  # (16, S)

    L, scales = _make_qx_quants_rmse1(X, 32)
    scales = scales.reshape(nb, 16)

    abs_s = np.abs(scales)
    abs_s = np.where(abs_s > 0, abs_s, _F32(0.0))  # NaN never wins `>`
    ib = abs_s.argmax(axis=1)  # first max, like `if (abs > max_abs)`
    rows = np.arange(nb)
    max_abs_scale = abs_s[rows, ib]
    max_scale = scales[rows, ib]
    zero_block = max_abs_scale < _GROUP_MAX_EPS

    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(zero_block, _F32(0.0), _F32(-128.0) / max_scale)
        d16, d32 = _fp16_roundtrip(_F32(1.0) / iscale)
    sc = _nearest_int_bits(iscale[:, None] * scales)
    sc = np.minimum(sc, 127).astype(np.int8)  # int8_t = MIN(127, nearest_int(...))

    d = (d32[:, None] * sc.astype(np.float32)).reshape(S)
    nz = d != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = X / d
    Lr = _nearest_clip_f32(t, -32, 31)
    Lr += _F32(32)
    np.copyto(L, Lr, where=nz)

    Lq = L.T.reshape(nb, 2, 4, 32).astype(np.uint8)  # (block, half, quarter, l)
    lo = Lq & 0xF
    ql = np.empty((nb, 2, 2, 32), dtype=np.uint8)
    ql[:, :, 0, :] = lo[:, :, 0, :] | (lo[:, :, 2, :] << 4)
    ql[:, :, 1, :] = lo[:, :, 1, :] | (lo[:, :, 3, :] << 4)
    hi = Lq >> 4
    qh = hi[:, :, 0, :] | (hi[:, :, 1, :] << 2) | (hi[:, :, 2, :] << 4) | (hi[:, :, 3, :] << 6)

    out = np.empty((nb, 210), dtype=np.uint8)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d16.view(np.uint8).reshape(nb, 2)
    if zero_block.any():  # memset(&y[i], 0, sizeof(block_q6_K))
        out[zero_block] = 0
    return out


# --------------------------------------------------------------------------- #
# public quantizers
# --------------------------------------------------------------------------- #
def _default_threads() -> int:
    env = os.environ.get("LABKERNELS_QUANT_THREADS")
    if env:
        if not env.strip().isdigit() or int(env) < 1:
            raise QuantInputError(f"LABKERNELS_QUANT_THREADS={env!r}: must be an integer >= 1")
        return int(env)
    return max(1, min(8, os.cpu_count() or 1))


def _check_all_finite(x: np.ndarray, name: str, qtype: str | None = None, qk: int = QK_K) -> None:
    """NaN / inf anywhere, and (given ``qtype``) any block whose max |x| exceeds what the format encodes."""
    for r0, r1 in _row_chunks(x.shape[0], x.shape[1]):
        _check_finite(x[r0:r1], name, r0)
        if qtype is not None:
            amax = np.abs(x[r0:r1]).reshape(r1 - r0, -1, qk).max(axis=2)
            bad = np.argwhere(amax > MAX_ABS[qtype])
            if bad.size:
                r, b = int(bad[0][0]), int(bad[0][1])
                raise QuantOverflowError(
                    f"{name}: fp16 scale overflow at row {r0 + r}, block {b} (columns {b * qk}..{(b + 1) * qk - 1}): "
                    f"block max |x| = {float(amax[r, b]):.6g} exceeds the {MAX_ABS[qtype]:.6g} a {qtype} block "
                    "can encode")


def _check_scales(fields: dict, name: str, qtype: str, qk: int, x: np.ndarray) -> None:
    """Raise QuantOverflowError naming the first (row, block) whose fp16 scale field is inf / NaN.
    ``fields``: field name -> float16 array (rows, blocks)."""
    for field, h in fields.items():
        bad = np.argwhere(~np.isfinite(h))
        if bad.size:
            r, b = int(bad[0][0]), int(bad[0][1])
            blk = x[r, b * qk:(b + 1) * qk]
            raise QuantOverflowError(
                f"{name}: fp16 scale overflow at row {r}, block {b} (columns {b * qk}..{(b + 1) * qk - 1}): "
                f"{field} = {float(h[r, b])} (block max |x| = {float(np.abs(blk).max()):.6g}, sum = "
                f"{float(blk.astype(np.float64).sum()):.6g}); fp16 holds at most {_FP16_MAX:g}")


#: byte offsets of the fp16 scale fields inside a block
_SCALE_FIELDS = {"q4_K": {"d": 0, "dmin": 2}, "q6_K": {"d": 208}}


def _overflow_mode(overflow: str, name: str) -> bool:
    """True when overflow must raise ("raise", the default); "ggml" reproduces ggml's inf / NaN scales."""
    if overflow not in ("raise", "ggml"):
        raise QuantInputError(f"{name}: overflow must be 'raise' or 'ggml', got {overflow!r}")
    return overflow == "raise"


def _quantize_k(x: np.ndarray, name: str, block_fn, block_bytes: int,
                num_threads: int | None, overflow: str = "raise") -> np.ndarray:
    qtype = {144: "q4_K", 210: "q6_K"}[block_bytes]
    strict = _overflow_mode(overflow, name)
    _check_input(x, QK_K, name)
    _check_all_finite(x, name, qtype if strict else None, QK_K)
    rows, n = x.shape
    nblk = n // QK_K
    out = np.empty((rows, nblk * block_bytes), dtype=np.uint8)

    def work(span):
        r0, r1 = span
        with np.errstate(all="ignore"):
            xc = np.ascontiguousarray(x[r0:r1])
            out[r0:r1] = block_fn(xc.reshape(-1, QK_K)).reshape(r1 - r0, nblk * block_bytes)

    spans = list(_row_chunks(rows, n))
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer))
                                    or num_threads < 1):
        raise QuantInputError(f"{name}: num_threads must be an integer >= 1 (or None for the default), got "
                              f"{num_threads!r}")
    nt = _default_threads() if num_threads is None else int(num_threads)
    if nt == 1 or len(spans) < 2:
        for span in spans:
            work(span)
    else:  # numpy releases the GIL inside its loops; chunks are independent
        with ThreadPoolExecutor(max_workers=min(nt, len(spans))) as ex:
            list(ex.map(work, spans))
    blocks = out.reshape(rows, nblk, block_bytes)
    if strict:
        _check_scales({f: np.ascontiguousarray(blocks[:, :, o:o + 2]).view("<f2")[:, :, 0]
                       for f, o in _SCALE_FIELDS[qtype].items()}, name, qtype, QK_K, x)
    return out


def quantize_q4_K(x: np.ndarray, *, num_threads: int | None = None, overflow: str = "raise") -> np.ndarray:
    """Port of ggml ``quantize_row_q4_K_ref``.

    x: float32 (rows, n), n a multiple of 256, finite.  Returns uint8
    (rows, n/256*144) in ``block_q4_K`` layout: d (f16), dmin (f16),
    scales[12], qs[128].  Rows are processed in chunks, by ``num_threads``
    worker threads (default: ``$LABKERNELS_QUANT_THREADS`` or min(8, cpu_count));
    the result does not depend on the thread count.

    A block whose values overflow the fp16 scales (max |x| beyond :data:`MAX_ABS`, or a d / dmin that
    rounds to inf) raises :class:`QuantOverflowError` naming its row and block; ``overflow="ggml"`` instead
    returns what ggml writes (inf / NaN scales), for bit-exactness tests.
    """
    return _quantize_k(x, "quantize_q4_K", _q4_K_blocks, 144, num_threads, overflow)


def quantize_q6_K(x: np.ndarray, *, num_threads: int | None = None, overflow: str = "raise") -> np.ndarray:
    """Port of ggml ``quantize_row_q6_K_ref``.

    x: float32 (rows, n), n a multiple of 256, finite.  Returns uint8
    (rows, n/256*210) in ``block_q6_K`` layout: ql[128], qh[64],
    scales[16] (int8), d (f16).  ``num_threads`` and ``overflow`` as for :func:`quantize_q4_K`.
    """
    return _quantize_k(x, "quantize_q6_K", _q6_K_blocks, 210, num_threads, overflow)


def _q8_core(xb: np.ndarray):
    """Shared part of q8_0 / q8_1 on (nb, 32) blocks: (qs float32, d float32)."""
    amax = np.abs(xb).max(axis=1)
    d = amax / _F32(127)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d != 0, _F32(1.0) / d, _F32(0.0))
        qs = _roundf(xb * inv[:, None])
    return qs, d


def quantize_q8_0(x: np.ndarray, *, overflow: str = "raise") -> np.ndarray:
    """Port of ggml ``quantize_row_q8_0_ref``.

    x: float32 (rows, n), n a multiple of 32, finite.  Returns uint8
    (rows, n/32*34) in ``block_q8_0`` layout: d (f16), qs[32] (int8).  ``overflow`` as for
    :func:`quantize_q4_K` (d = amax/127 must fit fp16).
    """
    name = "quantize_q8_0"
    strict = _overflow_mode(overflow, name)
    _check_input(x, QK8_0, name)
    rows, n = x.shape
    nblk = n // QK8_0
    out = np.empty((rows, nblk, 34), dtype=np.uint8)
    _check_all_finite(x, name, "q8_0" if strict else None, QK8_0)
    for r0, r1 in _row_chunks(rows, n):
        xc = np.ascontiguousarray(x[r0:r1])
        qs, d = _q8_core(xc.reshape(-1, QK8_0))
        o = out[r0:r1].reshape(-1, 34)
        with np.errstate(over="ignore"):  # fp16 overflow -> inf, as in ggml
            o[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
        o[:, 2:] = qs.astype(np.int8).view(np.uint8)
    if strict:
        _check_scales({"d": np.ascontiguousarray(out[:, :, 0:2]).view("<f2")[:, :, 0]}, name, "q8_0", QK8_0, x)
    return out.reshape(rows, nblk * 34)


def quantize_q8_1(x: np.ndarray, *, overflow: str = "raise") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Port of ggml ``quantize_row_q8_1_ref``.

    x: float32 (rows, n), n a multiple of 32, finite.  Returns
    ``(qs int8 (rows, n), d float16 (rows, n/32), s float16 (rows, n/32))``
    with d = fp16(amax/127) and s = fp16(d_f32 * sum(qs)) (d_f32 is the
    float32 scale *before* fp16 rounding, exactly as in ggml).  ``overflow`` as for :func:`quantize_q4_K`:
    both d and s must fit fp16 (s overflows once |sum of a block| passes ~65504, e.g. 32 values of ~2100).
    """
    name = "quantize_q8_1"
    strict = _overflow_mode(overflow, name)
    _check_input(x, QK8_1, name)
    rows, n = x.shape
    nblk = n // QK8_1
    qs_out = np.empty((rows, n), dtype=np.int8)
    d_out = np.empty((rows, nblk), dtype=np.float16)
    s_out = np.empty((rows, nblk), dtype=np.float16)
    _check_all_finite(x, name, "q8_1" if strict else None, QK8_1)
    for r0, r1 in _row_chunks(rows, n):
        xc = np.ascontiguousarray(x[r0:r1])
        qs, d = _q8_core(xc.reshape(-1, QK8_1))
        qi = qs.astype(np.int8)
        total = qi.astype(np.int32).sum(axis=1)  # exact integer sum
        s = total.astype(np.float32) * d  # GGML_FP32_TO_FP16(sum*d)
        qs_out[r0:r1] = qi.reshape(r1 - r0, n)
        with np.errstate(over="ignore"):  # fp16 overflow -> inf, as in ggml
            d_out[r0:r1] = d.astype(np.float16).reshape(r1 - r0, nblk)
            s_out[r0:r1] = s.astype(np.float16).reshape(r1 - r0, nblk)
    if strict:
        _check_scales({"d": d_out, "s = d*sum(qs)": s_out}, name, "q8_1", QK8_1, x)
    return qs_out, d_out, s_out


def pack_q8_1(qs: np.ndarray, d: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Pack :func:`quantize_q8_1` output into ``block_q8_1`` bytes.

    Layout per 36-byte block: half2 ds = (d, s), then qs[32] (int8).
    Returns uint8 (rows, n/32*36).
    """
    qs = np.asarray(qs)
    d = np.asarray(d)
    s = np.asarray(s)
    if qs.ndim != 2 or qs.dtype != np.int8:
        raise QuantInputError(f"pack_q8_1: qs must be a 2-D int8 array, got {qs.dtype} shape {qs.shape}")
    rows, n = qs.shape
    if n == 0 or n % QK8_1 != 0:
        raise QuantInputError(
            f"pack_q8_1: row length {n} of qs shape {qs.shape} is not a positive multiple of {QK8_1}"
        )
    nblk = n // QK8_1
    for nm, a in (("d", d), ("s", s)):
        if a.shape != (rows, nblk):
            raise QuantInputError(f"pack_q8_1: {nm} must have shape {(rows, nblk)}, got {a.shape}")
    out = np.empty((rows, nblk, 36), dtype=np.uint8)
    out[:, :, 0:2] = d.astype(np.float16).view(np.uint8).reshape(rows, nblk, 2)
    out[:, :, 2:4] = s.astype(np.float16).view(np.uint8).reshape(rows, nblk, 2)
    out[:, :, 4:] = qs.view(np.uint8).reshape(rows, nblk, 32)
    return out.reshape(rows, nblk * 36)


# --------------------------------------------------------------------------- #
# round trip
# --------------------------------------------------------------------------- #
_QTYPE_ALIASES = {
    "q4_k": "q4_K", "q6_k": "q6_K", "q8_0": "q8_0", "q8_1": "q8_1",
}


def _qtype_name(qtype) -> str:
    name = getattr(qtype, "name", qtype)
    if not isinstance(name, str) or name.lower() not in _QTYPE_ALIASES:
        raise QuantInputError(f"unsupported qtype {qtype!r}; expected one of q4_K, q6_K, q8_0, q8_1")
    return _QTYPE_ALIASES[name.lower()]


def _quantize_by_name(x: np.ndarray, name: str) -> np.ndarray:
    if name == "q4_K":
        return quantize_q4_K(x)
    if name == "q6_K":
        return quantize_q6_K(x)
    if name == "q8_0":
        return quantize_q8_0(x)
    return pack_q8_1(*quantize_q8_1(x))


def dequantize(raw: np.ndarray, qtype, n: int | None = None) -> np.ndarray:
    """Dequantize ``raw`` (rows, nbytes) uint8 of ``qtype`` to float32 (rows, n).

    q4_K / q6_K / q8_0 go through ``gguf.quants.dequantize`` (gguf-py's
    reference dequantizers); q8_1 (not in gguf-py) is decoded here as d*qs.
    ``n``, when given, must be the elements a row holds (checked, never ignored); a block with a NaN / Inf
    scale is refused (:class:`QuantInputError` naming the block).
    """
    name = _qtype_name(qtype)
    qk, nbytes = {"q4_K": (256, 144), "q6_K": (256, 210), "q8_0": (32, 34), "q8_1": (32, 36)}[name]
    a = np.asarray(raw)
    if a.dtype != np.uint8 or a.ndim == 0 or a.shape[-1] == 0 or a.shape[-1] % nbytes:
        raise QuantInputError(f"dequantize: {name} raw data must be uint8 with a last axis of whole {nbytes}-byte "
                              f"blocks, got {a.dtype} {a.shape}")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise QuantInputError(f"dequantize: n must be an integer, got {n!r}")
        if n != a.shape[-1] // nbytes * qk:
            raise QuantInputError(f"dequantize: n={n}, but rows of {a.shape[-1]} {name} bytes hold "
                                  f"{a.shape[-1] // nbytes * qk} elements")
    raw = np.ascontiguousarray(a)
    blocks = raw.reshape(-1, nbytes)
    for field, off in {"q4_K": (("d", 0), ("dmin", 2)), "q6_K": (("d", 208),)}.get(name, (("d", 0),)):
        bad = np.flatnonzero((blocks[:, off:off + 2].view("<u2")[:, 0] & 0x7C00) == 0x7C00)  # f16 NaN / Inf
        if len(bad):
            i, per_row = int(bad[0]), raw.shape[-1] // nbytes
            raise QuantInputError(f"dequantize: {name} block {i} (row {i // per_row}, block {i % per_row} of the row) "
                                  f"has a non-finite scale {field} = {float(blocks[i, off:off + 2].view('<f2')[0])}: "
                                  f"{len(bad)} of {len(blocks)} blocks have a NaN/Inf {field}")
    if name == "q8_1":   # d * qs per 36-byte block (d f16 @0, qs int8 @4)

        b = raw.reshape(-1, 36)
        y = b[:, 4:].view(np.int8).astype(np.float32) * layout.f16_column(b[:, :2])
        return y.reshape(raw.shape[:-1] + (raw.shape[-1] // 36 * 32,))
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    gtype = {"q4_K": GGMLQuantizationType.Q4_K, "q6_K": GGMLQuantizationType.Q6_K,
             "q8_0": GGMLQuantizationType.Q8_0}[name]
    return gguf_dequantize(raw, gtype)


def roundtrip_rmse(x: np.ndarray, qtype) -> float:
    """Relative RMSE ``||dequant(quant(x)) - x|| / ||x||`` (float64 norms).

    ``qtype``: a ``gguf.GGMLQuantizationType`` (Q4_K, Q6_K, Q8_0, Q8_1) or one of
    the strings "q4_K", "q6_K", "q8_0", "q8_1" (case-insensitive).  Returns 0.0
    for an all-zero x that round-trips exactly, inf if x is zero but the
    round-trip is not.  Unlike the quantizers (which insist on float32), other
    floating dtypes are accepted here and converted to float32 first; the error
    is measured against that float32 copy.
    """
    name = _qtype_name(qtype)
    x = np.asarray(x)
    if np.iscomplexobj(x):
        raise QuantInputError(f"roundtrip_rmse: complex input (dtype {x.dtype}) is not supported")
    if x.dtype != np.float32 and np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
    raw = _quantize_by_name(x, name)
    deq = dequantize(raw, name).reshape(x.shape)
    num = np.linalg.norm((deq.astype(np.float64) - x.astype(np.float64)).ravel())
    den = np.linalg.norm(x.astype(np.float64).ravel())
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return float(num / den)
