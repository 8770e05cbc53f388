"""Round 9's decode kernels: k-quant matrix-vector and small-batch products, ``gemv_kq`` (labkernels/kernels/gemv_kq.cu).

``Y[nt, od] = X[nt, id] W^T`` for nt = 1..16 with every weight byte read once per launch. q4_K weights are the GGUF
rows as uploaded (``QWeight.raw``); q6_K weights are the same bytes repacked once at load into planes
(:func:`repack_q6k`, same size: 210 bytes a super-block). Activations are f16 or f32, read directly (the f32 ones
rounded to f16 at the fragment, as round 7's wgmma family rounds them).

**The kernel's exact function** (:func:`emulate_weights`): each weight is the f16 number
``fl16(q * S + B)`` (q4_K: ``S = fl16(d * sc)``, ``B = fl16(-dmin * m)``, q the 4-bit code) or ``fl16((q - 32) * S)``
(q6_K: ``S = fl16(d * sc)``), the activations are rounded to f16, and the tensor cores multiply and add in f32. So the
kernel equals ``x16 @ w16.T`` up to f32 summation order (the gate of :func:`labkernels.wgmma.gate`).

**The layout a lane reads** (mirrored in numpy by :func:`lane_dequant`, which rebuilds the weights from the bytes a
lane loads with the kernel's bit operations; a CPU test checks it equals :func:`emulate_weights`): lane ``c = lane % 4``
of a quad owns k ``64c .. 64c + 63`` of each super-block; its 32 bytes of codes (q4_K: ``qs[32c .. 32c + 31]`` of the
GGUF block; q6_K: ``ql'`` of the repack) hold in byte ``4m + j`` the low 4 bits of k ``64c + 4m + j`` (low nibble) and
of ``64c + 32 + 4m + j`` (high nibble). Word ``m`` yields four f16 pairs: ``P0 = k(4m, 4m+2)``, ``P2 = k(4m+1, 4m+3)``
from the low nibbles, ``P1``, ``P3`` the same plus 32 from the high nibbles. q6_K's two high bits come from ``qh'``
(16 bytes a lane: word ``u`` serves code words ``2u`` and ``2u + 1`` at the bit positions of :data:`Q6_QH_BITS`).

**FORM=1** (q4_K, nt <= 8; round 9 step 2, ``gemv(..., FORM=1)``): the mma takes the exact f16 products ``sc * q``
(<= 63 * 15 = 945, integers: exact in f16) made per pair by one LOP3 (magic exponent) and one HFMA2
(``(1024 + q) sc - 1024 sc``; high nibbles ``(1024 + 16 q) sc/16 - 64 sc``); the per-super-block f32 sums are scaled
by ``d`` in f32; the min term ``dmin * sum_j m_j I_j`` (``I_j`` the activations' sum over sub-block j, from an
indicator mma, split into f16 ``hi + lo`` for the min mma) by ``-dmin`` in f32. Its exact function
(:func:`exact_weights_v2`): gguf's dequantized weights ``d*sc*q - dmin*m`` in float64 (no f16 rounding of the
weights) times the f16-rounded activations, up to f32 summation and the ~2^-22 relative split error of ``I_j``. Its
lane mirror: :func:`lane_dequant_v2`. Its range: a sub-block sum of the activations ``|I_j|`` must stay below 65504
(the f16 ``hi`` half; larger gives inf/NaN -- an average |x| over 2047 in 32 consecutive values; FORM=0 has no such
limit).

**FORM=3** (q4_K, nt <= 8, MT=1, WARPS 4 or 8; round 9 step 6, ``gemv(..., FORM=3, MT=1)``): FORM=1's function and
arithmetic in a loop that loads the next super-block's weight bytes into registers before the current one is computed
(a register double buffer: a warp's next loads stay in flight through its compute), with every warp of a CTA on the
same 16 rows and the split's super-blocks cut into WARPS consecutive ranges, one a warp; warp 0 adds the warps' partial
sums in shared memory in warp order and stores. The split over K is folded inside the CTA (no workspace, fence or
arrival atomic at S=1), and FORM=3 at S=1 computes FORM=1's bits at split WARPS.

``S="wave"`` (round 9 step 3, any form): the splits that make one wave of the resident CTAs, no second partial wave
(:func:`wave_splits`; the default :func:`default_splits` rounds up). Step 3's other form, PIPE (FORM=1's bytes staged
through a cp.async shared-memory ring), lost at every point and left the product; commit a1cf954 holds it (the
retired step ``gemv_step3`` of :mod:`labkernels.rounds.r09_decode.steps`). Recorded runs keep its rows (typed column PIPE
> 0), which the recorded choice (:func:`auto_table`) leaves out.

Round 9 step 5's **FORM=2** (FORM=1 with the register double buffer, the warps on their own rows: FORM=3's loop
without the warps' split of the super-blocks) lost almost everywhere (FORM=2 / FORM=1 at the one-wave split, q4_K nt=1
f16: 1.07-1.08 on the three large shapes, predicted 0.72-0.9; 1.10 at 4096x4096, predicted 0.85-1.0; H200 run
20261207T131432Z-h200-0b009b5) and left the product: ``gemv(..., FORM=2)`` raises, naming commit 90fd260, which holds
it (the retired step ``gemv_step5``). Recorded rows of FORM=2 (:data:`RETIRED_FORMS`) are never the recorded choice.

Round 9 step 7's **FORM=4, FORM=5** (FORM=1's source under a ``__launch_bounds__`` register cap of 6 / 8 CTAs an SM:
80 / 64 registers, 24 / 32 warps an SM where FORM=1 has 16, spilling 24-44 B a thread) were slower at every f16 point
(FORM=4 / FORM=1 1.20, FORM=5 / FORM=1 1.31 at q4_K 4096x14336 nt=1 f16, one-wave split; H100 run
20261207T195543Z-h10080gbhbm3-045babc) and left the product: ``gemv(..., FORM=4)`` and ``FORM=5`` raise, naming commit
7894b07, which holds them (the retired step ``gemv_step7``); their recorded rows are never the recorded choice.

Round 9 step 8's **PF=1** build (before its PDL wait each CTA prefetched its weight bytes into L2 with
``cp.async.bulk.prefetch``, so a programmatically launched GEMV's stream would start while the kernel ahead ran) made
the decode slower (synthetic 7B tokens/s PF=1 / PF=0 0.945, synthetic Gemma 3 0.969, predicted 1.03-1.12 / 1.02-1.15;
H100 run 20261207T195308Z-h10080gbhbm3-045babc) and left the product with its template parameter, its context
(``weights_before_wait``) and ``PrefillOptions.gemv_pf``: ``gemv(..., PF=1)`` raises, naming commit 7894b07, which holds
it (the retired step ``gemv_step8``; :data:`RETIRED_PF`). Every launch is what PF=0 was: the kernel begins with its PDL
wait.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import lru_cache

import numpy as np

from . import errors, gpu, nvml, records, wgmma_pack

QK = 256
BLOCK_BYTES = {"q4_K": 144, "q6_K": 210}
#: nt the family takes (NT8 n8 tiles of tokens: 1 or 2)
MAX_NT = 16
#: (qh' word bit offset of the low-half element, of the high-half element) for each (word parity, pair): pair P0/P2
#: are low-nibble pairs (their two high bits go to f16 bits 4-5 / 20-21), P1/P3 high-nibble pairs (8-9 / 24-25)
Q6_QH_BITS = {(0, "P0"): (0, 16), (0, "P1"): (4, 20), (0, "P2"): (2, 18), (0, "P3"): (6, 22),
              (1, "P0"): (8, 24), (1, "P1"): (12, 28), (1, "P2"): (10, 26), (1, "P3"): (14, 30)}
#: the k offsets (within a lane's 64) of each pair of word m: (low-half element, high-half element)
PAIR_K = {"P0": (0, 2), "P2": (1, 3), "P1": (32, 34), "P3": (33, 35)}


class GemvError(ValueError):
    """A weight, activation or launch the decode kernels cannot take."""


# ------------------------------------------------------------------------------------------ the weight types

def _blocks(raw: np.ndarray, qtype: str) -> np.ndarray:
    raw = np.asarray(raw)
    if qtype not in BLOCK_BYTES:
        raise GemvError(f"gemv_kq takes q4_K or q6_K weights, not {qtype!r}")
    if raw.dtype != np.uint8 or raw.ndim != 2:
        raise GemvError(f"weights must be uint8 GGUF rows [od, row_bytes], got {raw.dtype} {raw.shape}")
    nb = BLOCK_BYTES[qtype]
    if raw.shape[1] == 0 or raw.shape[1] % nb:
        raise GemvError(f"{qtype} rows of {raw.shape[1]} bytes are not whole {nb}-byte super-blocks")
    return np.ascontiguousarray(raw).reshape(raw.shape[0], raw.shape[1] // nb, nb)


def q4k_fields(raw: np.ndarray):
    """(d, dmin as float32 [od, nsb], sc, m as int [od, nsb, 8], codes uint8 [od, nsb, 256]) of q4_K rows."""
    b = _blocks(raw, "q4_K")
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    q = b[..., 4:16].astype(np.int32)
    sc = np.empty(b.shape[:2] + (8,), np.int32)
    mn = np.empty_like(sc)
    sc[..., :4] = q[..., 0:4] & 63
    mn[..., :4] = q[..., 4:8] & 63
    sc[..., 4:] = (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    qs = b[..., 16:144].reshape(b.shape[:2] + (4, 32))
    codes = np.concatenate([np.stack([qs[..., j, :] & 0xF, qs[..., j, :] >> 4], axis=-2) for j in range(4)],
                           axis=-2).reshape(b.shape[:2] + (256,))
    return d, dmin, sc, mn, codes


def q6k_fields(raw: np.ndarray):
    """(d float32 [od, nsb], sc int [od, nsb, 16], codes uint8 0..63 [od, nsb, 256]) of q6_K rows."""
    b = _blocks(raw, "q6_K")
    ql = b[..., 0:128].reshape(b.shape[:2] + (2, 64))
    qh = b[..., 128:192].reshape(b.shape[:2] + (2, 32))
    sc = b[..., 192:208].view(np.int8).astype(np.int32)
    d = b[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    codes = np.empty(b.shape[:2] + (2, 4, 32), np.uint8)
    for i in range(4):   # k = 128 h + 32 i + l: ql byte l + 32 (i % 2), nibble i // 2; qh byte l, bits 2i, 2i+1
        lo = (ql[..., 32 * (i % 2):32 * (i % 2) + 32] >> (4 * (i // 2))) & 0xF
        codes[..., i, :] = lo | (((qh >> (2 * i)) & 3) << 4)
    return d, sc, codes.reshape(b.shape[:2] + (256,))


def _f16(a) -> np.ndarray:
    return np.asarray(a, np.float64).astype(np.float16)


def emulate_weights(raw: np.ndarray, qtype: str) -> np.ndarray:
    """The f16 weights [od, id] the kernel multiplies (as float32): q4_K ``fl16(q * fl16(d*sc) + fl16(-dmin*m))``,
    q6_K ``fl16((q - 32) * fl16(d*sc))`` -- products of f16 and small integers are exact in float64, so one rounding."""
    if qtype == "q4_K":
        d, dmin, sc, mn, codes = q4k_fields(raw)
        S = _f16(d[..., None] * sc).astype(np.float64)            # [od, nsb, 8]
        B = _f16(-(dmin[..., None] * mn)).astype(np.float64)
        q = codes.reshape(codes.shape[:2] + (8, 32)).astype(np.float64)
        w = _f16(q * S[..., None] + B[..., None])
    elif qtype == "q6_K":
        d, sc, codes = q6k_fields(raw)
        S = _f16(d[..., None] * sc).astype(np.float64)            # [od, nsb, 16]
        q = codes.reshape(codes.shape[:2] + (16, 16)).astype(np.float64) - 32
        w = _f16(q * S[..., None])
    else:
        raise GemvError(f"gemv_kq takes q4_K or q6_K weights, not {qtype!r}")
    return w.reshape(w.shape[0], -1).astype(np.float32)


def exact_weights_v2(raw: np.ndarray, qtype: str = "q4_K") -> np.ndarray:
    """FORM=1's exact weights [od, id] (float64): ``d * (sc * q) - dmin * m`` with d, dmin the block's f16 scales,
    sc, m its 6-bit sub-block scale and min, q the 4-bit code -- gguf's q4_K dequantization without rounding to f16
    or f32 (the kernel forms ``sc * q`` exactly in f16, and applies ``d`` and ``-dmin`` in f32 to sums)."""
    if qtype != "q4_K":
        raise GemvError(f"gemv_kq FORM=1 takes q4_K weights, not {qtype!r}")
    d, dmin, sc, mn, codes = q4k_fields(raw)
    q = codes.reshape(codes.shape[:2] + (8, 32)).astype(np.float64)
    scq = q * sc[..., None]                                        # exact integers <= 945
    w = d.astype(np.float64)[..., None, None] * scq - (dmin.astype(np.float64)[..., None] * mn)[..., None]
    return w.reshape(w.shape[0], -1)


# ------------------------------------------------------------------------------------------ the q6_K repack

def repack_q6k(raw: np.ndarray) -> np.ndarray:
    """q6_K GGUF rows [od, nsb*210] -> the kernel's planes, one uint8 buffer of the same size:
    ``QL' [od][nsb][128] | QH' [od][nsb][64] | SC [od][nsb][16] | D [od][nsb] (f16)``. QL' byte ``32c + 4m + j`` holds
    the low 4 bits of code ``64c + 4m + j`` (low nibble) and ``64c + 32 + 4m + j`` (high nibble); QH' lane ``c``'s word
    ``u`` holds the codes' two high bits of words ``2u``, ``2u+1`` at :data:`Q6_QH_BITS`; SC and D are the GGUF
    block's scales and d."""
    b = _blocks(raw, "q6_K")
    od, nsb = b.shape[:2]
    _, _, codes = q6k_fields(raw)
    cl = codes.reshape(od, nsb, 4, 2, 8, 4)          # [.., c, half(0: k<32, 1: k>=32), m, j]
    lo4 = cl & 0xF
    ql = (lo4[:, :, :, 0] | (lo4[:, :, :, 1] << 4)).astype(np.uint8).reshape(od, nsb, 128)
    hi2 = (cl >> 4).astype(np.uint32)                # [.., c, half, m, j]
    words = np.zeros((od, nsb, 4, 4), np.uint32)     # [.., c, u]
    for (par, pair), (blo, bhi) in Q6_QH_BITS.items():
        klo, khi = PAIR_K[pair]                      # k offsets in the lane's 64: half = k // 32, j = k % 4
        for u in range(4):
            m = 2 * u + par
            words[:, :, :, u] |= hi2[:, :, :, klo // 32, m, klo % 4] << blo
            words[:, :, :, u] |= hi2[:, :, :, khi // 32, m, khi % 4] << bhi
    qh = words.view(np.uint8).reshape(od, nsb, 64)   # little-endian words, lane c at bytes 16c..
    sc = b[..., 192:208]
    d = b[..., 208:210]
    return np.concatenate([ql.reshape(-1), qh.reshape(-1), sc.reshape(-1), d.reshape(-1)])


def _h16(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, np.uint16).view(np.float16).astype(np.float64)


def lane_dequant(data: np.ndarray, qtype: str, od: int, id_: int) -> np.ndarray:
    """The weights [od, id] rebuilt from the bytes the kernel's lanes load (q4_K: the GGUF rows; q6_K: the planes of
    :func:`repack_q6k`), with the kernel's bit operations on 32-bit words (magic-exponent f16 codes, exact
    subtraction, one rounding of the scale step) -- the CPU mirror of ``KqRow<QT>::dequant``."""
    nsb = id_ // QK
    data = np.ascontiguousarray(data).reshape(-1)
    w = np.zeros((od, nsb, 4, 64), np.float64)      # [row, sb, lane c, k offset]
    if qtype == "q4_K":
        blk = data.reshape(od, nsb, 144)
        hdr = blk[..., 0:16].copy().view("<u4").astype(np.int64)   # [od, nsb, 4]: the lane's 16-byte header load
        d = _h16(hdr[..., 0] & 0xFFFF)
        dmin = _h16(hdr[..., 0] >> 16)
        sc, mn = _q4k_lane_scales(hdr)
        qs = blk[..., 16:144].reshape(od, nsb, 4, 8, 4).copy().view("<u4")[..., 0]     # [.., c, m] words
        S = _f16(d[..., None] * sc)                  # [od, nsb, 8] as f16
        B = _f16(-(dmin[..., None] * mn))
        for m in range(8):
            wd = qs[..., m].astype(np.uint32)
            w8 = wd >> 8
            for pair, src, hi in (("P0", wd, False), ("P2", w8, False), ("P1", wd, True), ("P3", w8, True)):
                v = ((src & (0x00F000F0 if hi else 0x000F000F)) | 0x64006400).astype(np.uint32)
                lo_h, hi_h = _h16(v & 0xFFFF), _h16(v >> 16)
                j = 2 * np.arange(4) + (1 if hi else 0)      # sub-block of lane c: 2c (low nibbles), 2c+1 (high)
                s, bb = S[..., j].astype(np.float64), B[..., j].astype(np.float64)
                for half, val in ((0, lo_h), (1, hi_h)):
                    q = (val / 16 - 64) if hi else (val - 1024)   # exact in f16 (checked: an integer 0..15)
                    assert np.all(q == np.round(q)) and q.min() >= 0 and q.max() <= 15
                    w[:, :, :, 4 * m + PAIR_K[pair][half]] = _f16(q * s + bb)
    elif qtype == "q6_K":
        n = od * nsb
        ql = data[:n * 128].reshape(od, nsb, 4, 8, 4).copy().view("<u4")[..., 0]          # [.., c, m]
        qh = data[n * 128:n * 192].reshape(od, nsb, 4, 4, 4).copy().view("<u4")[..., 0]   # [.., c, u]
        sc8 = data[n * 192:n * 208].reshape(od, nsb, 16).astype(np.int64)
        sc = (_h16(((sc8 ^ 0x80) | 0x6400)) - 1152)      # KqRow<6>::load: sc + 128 in a byte, magic exponent, exact
        d = data[n * 208:n * 210].copy().view(np.float16).reshape(od, nsb).astype(np.float64)
        S = _f16(d[..., None] * sc)                  # [od, nsb, 16]
        for m in range(8):
            wd = ql[..., m].astype(np.uint32)
            w8 = wd >> 8
            hw = qh[..., m >> 1].astype(np.uint32)
            ha = (hw >> 4) if m & 1 else ((hw << 4) & 0xFFFFFFFF)
            hb = (hw >> 6) if m & 1 else ((hw << 2) & 0xFFFFFFFF)
            for pair, src, hsrc, hi in (("P0", wd, ha, False), ("P2", w8, hb, False), ("P1", wd, ha, True),
                                        ("P3", w8, hb, True)):
                v = ((src & (0x00F000F0 if hi else 0x000F000F)) | 0x64006400
                     | (hsrc & (0x03000300 if hi else 0x00300030))).astype(np.uint32)
                sub = 4 * np.arange(4) + (2 if hi else 0) + (m >> 2)    # sub-block of lane c's pair
                s = S[..., sub].astype(np.float64)
                for half, val in ((0, _h16(v & 0xFFFF)), (1, _h16(v >> 16))):
                    q = (val / 16 - 96) if hi else (val - 1056)
                    assert np.all(q == np.round(q)) and q.min() >= -32 and q.max() <= 31
                    w[:, :, :, 4 * m + PAIR_K[pair][half]] = _f16(q * s)
    else:
        raise GemvError(f"gemv_kq takes q4_K or q6_K weights, not {qtype!r}")
    return w.reshape(od, id_).astype(np.float32)


def _q4k_lane_scales(hdr: np.ndarray):
    """The q4_K 6-bit scales and mins [od, nsb, 8] as KqRow<4>::load decodes them from a lane's 16-byte header load
    (``hdr``: its four little-endian words, int64): bytes jj, jj+1 to 16-bit lanes with one PRMT a field."""
    sc = np.empty(hdr.shape[:-1] + (8,), np.int64)
    mn = np.empty_like(sc)
    for c in range(4):
        sel = 0x4342 if c & 1 else 0x4140            # the kernel's PRMT selector, read back as jj (a wrong one fails)
        jj = sel & 0xF
        assert jj == (2 * c) & 3 and (sel >> 8) & 0xF == jj + 1
        by, bz, bw = (((hdr[..., i] >> (8 * jj)) & 0xFF) | (((hdr[..., i] >> (8 * jj + 8)) & 0xFF) << 16)
                      for i in (1, 2, 3))
        if c < 2:
            s2, m2 = by & 0x003F003F, bz & 0x003F003F
        else:
            s2 = (bw & 0x000F000F) | ((by >> 2) & 0x00300030)
            m2 = ((bw >> 4) & 0x000F000F) | ((bz >> 2) & 0x00300030)
        sc[..., 2 * c], sc[..., 2 * c + 1] = s2 & 0xFFFF, s2 >> 16
        mn[..., 2 * c], mn[..., 2 * c + 1] = m2 & 0xFFFF, m2 >> 16
    return sc, mn


def lane_dequant_v2(data: np.ndarray, od: int, id_: int, parts: bool = False):
    """FORM=1's weights [od, id] (float64) rebuilt from the bytes its lanes load (q4_K GGUF rows) with its bit
    operations -- the CPU mirror of ``KqRow4v2``: the f16 constants ``(sc, -1024 sc)`` (low nibbles) and
    ``(sc/16, -64 sc)`` (high), one f16 rounding of ``code_f16 * s + c`` (code_f16 = 1024 + q or 1024 + 16 q from the
    magic exponent), the mins ``m`` as exact f16, d and dmin widened to f32; the weight is ``d * A - dmin * m``.
    ``parts``: also return (A as f16 values, m per k, d, dmin) -- what the mma and the f32 epilogue see."""
    nsb = id_ // QK
    blk = np.ascontiguousarray(data).reshape(od, nsb, 144)
    hdr = blk[..., 0:16].copy().view("<u4").astype(np.int64)
    d = _h16(hdr[..., 0] & 0xFFFF).astype(np.float32).astype(np.float64)
    dmin = _h16(hdr[..., 0] >> 16).astype(np.float32).astype(np.float64)
    sc, mn = _q4k_lane_scales(hdr)      # KqRow4v2::load: KqRow<4>'s scale decode
    SC = _h16((sc | 0x6400)) - 1024                  # hsub2(sc | 0x6400, 1024): exact
    MM = _h16((mn | 0x6400)) - 1024
    assert np.array_equal(SC, sc) and np.array_equal(MM, mn)
    s_lo, c_lo = SC, _f16(SC * -1024.0).astype(np.float64)      # f16 products, exact (checked below)
    s_hi, c_hi = _f16(SC / 16).astype(np.float64), _f16(SC * -64.0).astype(np.float64)
    assert np.array_equal(c_lo, -1024.0 * sc) and np.array_equal(s_hi * 16, sc) and np.array_equal(c_hi, -64.0 * sc)
    qs = blk[..., 16:144].reshape(od, nsb, 4, 8, 4).copy().view("<u4")[..., 0]     # [.., c, m] words
    A = np.zeros((od, nsb, 4, 64), np.float64)
    M = np.zeros((od, nsb, 4, 64), np.float64)
    for m in range(8):
        wd = qs[..., m].astype(np.uint32)
        w8 = wd >> 8
        for pair, src, hi in (("P0", wd, False), ("P2", w8, False), ("P1", wd, True), ("P3", w8, True)):
            v = ((src & (0x00F000F0 if hi else 0x000F000F)) | 0x64006400).astype(np.uint32)
            j = 2 * np.arange(4) + (1 if hi else 0)          # lane c's sub-block: 2c (low nibbles), 2c+1 (high)
            s, cc = (s_hi, c_hi) if hi else (s_lo, c_lo)
            for half, val in ((0, _h16(v & 0xFFFF)), (1, _h16(v >> 16))):
                k = 4 * m + PAIR_K[pair][half]
                A[:, :, :, k] = _f16(val * s[..., j] + cc[..., j])   # fma: exact product, one f16 rounding
                M[:, :, :, k] = MM[..., j]
    w = d[..., None, None] * A - dmin[..., None, None] * M
    w = w.reshape(od, id_)
    if parts:
        return w, A.reshape(od, id_), M.reshape(od, id_), d, dmin
    return w


# ------------------------------------------------------------------------------------------ launch

@dataclasses.dataclass
class GemvWeight:
    """A weight in the decode kernel's layout on the GPU: q4_K the uploaded GGUF rows, q6_K its planes."""
    data: object       # cupy uint8
    qtype: str
    od: int
    id: int
    nbytes: int
    repack_s: float = 0.0


def prepare(w) -> GemvWeight:
    """The :class:`GemvWeight` of a ``gpu.QWeight`` (made once and kept on it as ``w.gv``): q4_K reads the uploaded
    rows at their natural 144-byte stride; q6_K's planes are made from the GGUF rows the upload kept."""
    import time

    gv = getattr(w, "gv", None)
    if gv is not None:
        return gv
    if w.qtype not in BLOCK_BYTES:
        raise GemvError(f"gemv_kq takes q4_K or q6_K weights, not {w.qtype!r}")
    c = gpu.cp()
    t0 = time.perf_counter()
    if w.qtype == "q4_K":
        if w.stride != 144:
            raise GemvError(f"q4_K rows at stride {w.stride}: gemv_kq reads the natural 144-byte stride")
        gv = GemvWeight(w.raw, "q4_K", w.od, w.id, int(w.raw.nbytes))
    else:
        if w.host is None:
            raise GemvError("gemv_kq's q6_K planes are made from the GGUF rows, which this QWeight did not keep")
        host = np.asarray(w.host)
        data = c.asarray(repack_q6k(host))
        gv = GemvWeight(data, "q6_K", w.od, w.id, int(data.nbytes), time.perf_counter() - t0)
    w.gv = gv
    return gv


class _Workspace:
    """Per stream: the split partials (float32, grown on demand) and the per-CTA arrival counters (int32, zero at
    rest: the last CTA of each row group resets its own). Growing during a graph capture is refused; a buffer that
    is outgrown is kept alive (``retired``), since a graph captured earlier may still point at it."""

    def __init__(self):
        self.bufs = {}
        self.retired = []

    def get(self, stream_ptr: int, floats: int, ctas: int):
        c = gpu.cp()
        ws, cnt = self.bufs.get(stream_ptr, (None, None))
        if ws is None or ws.size < floats or cnt.size < ctas:
            if gpu.capturing(stream_ptr):
                raise GemvError("gemv_kq's split workspace must grow while a graph is being captured: run the "
                                "launch once before capturing")
            if ws is not None:
                self.retired.append((ws, cnt))
            ws = c.empty(max(floats, 1 << 16, 0 if ws is None else 2 * ws.size), c.float32)
            cnt = c.zeros(max(ctas, 1024, 0 if cnt is None else 2 * cnt.size), c.int32)
            self.bufs[stream_ptr] = (ws, cnt)
        return ws, cnt


_WS = _Workspace()


def rows_per_cta(MT: int, WARPS: int, FORM: int = 0) -> int:
    """Rows of one CTA: WARPS warps of MT m16 tiles each, or (FORM=3: the warps split the super-blocks) one warp's."""
    return 16 * MT * (1 if FORM == 3 else WARPS)


def default_splits(od: int, id_: int, MT: int, WARPS: int, sm_count: int, blocks_per_sm: int, FORM: int = 0) -> int:
    """S, the splits of the super-blocks: enough CTAs for one full wave of the resident CTAs the occupancy allows
    (row groups x S >= SMs x blocks per SM), at most one super-block per split."""
    groups = -(-od // rows_per_cta(MT, WARPS, FORM))
    want = max(1, -(-sm_count * blocks_per_sm // groups))
    return int(min(want, id_ // QK))


def wave_splits(od: int, id_: int, MT: int, WARPS: int, sm_count: int, blocks_per_sm: int, FORM: int = 0) -> int:
    """S of one wave (step 3): the most splits whose CTAs (row groups x S) all fit the resident slots at once (SMs x
    blocks per SM), at least 1, at most one super-block per split -- :func:`default_splits` rounds the other way and
    can leave a second, partial wave (q4_K 4096x14336 FORM=1 MT=1: 576 CTAs on 528 slots)."""
    groups = -(-od // rows_per_cta(MT, WARPS, FORM))
    return int(max(1, min(sm_count * blocks_per_sm // groups, id_ // QK)))


@lru_cache(maxsize=None)
def _kernel(QT: int, XF32: int, NT8: int, MT: int, WARPS: int, FORM: int = 0):
    return gpu.kernel("gemv_kq", QT=QT, XF32=XF32, NT8=NT8, MT=MT, WARPS=WARPS, FORM=FORM)


#: round 9 step 8's PF=1 build, which lost and left the source: {PF: (what it was, the commit that holds it, the
#: gpu check step that measured it)}
RETIRED_PF = {1: ("round 9 step 8's L2 prefetch of the CTA's weight bytes before its PDL wait", "7894b07",
                  "gemv_step8")}


def check_pf(PF) -> int:
    """0, the one build there is, for ``PF`` None or 0 (accepted as before the retirement, and ignored); ``PF=1``
    (:data:`RETIRED_PF`) a :class:`labkernels.errors.ShapeError` naming the commit that holds it; anything else a
    ShapeError too."""
    if PF is None:
        return 0
    if isinstance(PF, (int, np.integer)) and not isinstance(PF, bool):
        if PF == 0:
            return 0
        if int(PF) in RETIRED_PF:
            what, commit, step = RETIRED_PF[int(PF)]
            raise errors.ShapeError(
                f"gemv_kq PF={int(PF)} ({what}) lost and left the source: commit {commit} holds it (labkernels gpu "
                f"check --steps {step} runs there); gemv_kq has no PF build now (PF 0 or None: the kernel as PF=0 was)")
    raise errors.ShapeError(f"gemv_kq PF is 0 or None (its PF=1 build left the source: commit {RETIRED_PF[1][1]} holds "
                            f"it), got {PF!r}")


@lru_cache(maxsize=None)
def _blocks_per_sm(QT: int, XF32: int, NT8: int, MT: int, WARPS: int, FORM: int = 0) -> int:
    return max(1, _kernel(QT, XF32, NT8, MT, WARPS, FORM).occupancy_api())


#: the nt the forms FORM > 0 take (one n8 tile of tokens)
FORM1_MAX_NT = 8
#: the forms of the registry (FORM > 0: q4_K, nt <= FORM1_MAX_NT, FORM1's exact function; FORM=3 MT=1 only and the
#: one with WARPS=8 too)
FORMS = (0, 1, 3)
#: WARPS a CTA of each form takes (registry rows)
FORM_WARPS = {0: (4,), 1: (4,), 3: (4, 8)}
#: forms that lost and left the source: {FORM: (what it was, the commit that holds it, the gpu check step that
#: measured it)}; gemv refuses them by name and the recorded choice never takes their recorded rows
RETIRED_FORMS = {2: ("round 9 step 5's register double buffer", "90fd260", "gemv_step5"),
                 4: ("round 9 step 7's FORM=1 under a register cap of 6 CTAs an SM", "7894b07", "gemv_step7"),
                 5: ("round 9 step 7's FORM=1 under a register cap of 8 CTAs an SM", "7894b07", "gemv_step7")}


def check_form(FORM: int) -> int:
    """FORM as an int, or a :class:`labkernels.errors.ShapeError`: a retired form (:data:`RETIRED_FORMS`) names the
    commit that holds it, any other form outside :data:`FORMS` the forms there are."""
    FORM = int(FORM)
    if FORM in RETIRED_FORMS:
        what, commit, step = RETIRED_FORMS[FORM]
        raise errors.ShapeError(
            f"gemv_kq FORM={FORM} ({what}) lost and left the source: commit {commit} holds it (labkernels gpu check "
            f"--steps {step} runs there); the forms now are {FORMS}")
    if FORM not in FORMS:
        raise errors.ShapeError(f"gemv_kq FORM is one of {FORMS}, got {FORM}")
    return FORM


def form1_exact_gate(id_: int) -> float:
    """FORM=1 against its exact function (:func:`exact_weights_v2`): besides the fp32 accumulation order
    (wgmma's exact_gate), the min term's sub-block sums go through a hi/lo f16 split (~2^-22 of the term) and the two
    terms d*sum(sc*q*x) and dmin*sum(m*I) are scaled in f32 apart, then subtracted: where they cancel to an output
    ~100x smaller than the terms, relative to the largest output that is ~1e-5 more (1.7e-5 seen at id=256 on an
    H100, one random seed of the full GPU suite). 4x the fp32-order bound; a wrong fragment still gives O(1)."""
    return 4.0 * wgmma_pack.exact_gate(id_)


def launch_plan(gv: GemvWeight, nt: int, XF32: int, MT: int = 2, WARPS: int = 4, FORM: int = 0,
                S: int | str | None = None, sm_count: int = 132) -> dict:
    """The grid of one launch on ``sm_count`` SMs: splits S (``None``: :func:`default_splits`; ``"wave"``:
    :func:`wave_splits`; an int as given), row groups, CTAs, the resident CTAs an SM (the occupancy API), waves (CTAs
    over resident slots), the most super-blocks a split holds."""
    FORM = check_form(FORM)
    QT = 4 if gv.qtype == "q4_K" else 6
    NT8 = 1 if nt <= 8 else 2
    bps = _blocks_per_sm(QT, XF32, NT8, MT, WARPS, FORM)
    groups = -(-gv.od // rows_per_cta(MT, WARPS, FORM))
    nsb = gv.id // QK
    if S is None:
        S = default_splits(gv.od, gv.id, MT, WARPS, sm_count, bps, FORM)
    elif S == "wave":
        S = wave_splits(gv.od, gv.id, MT, WARPS, sm_count, bps, FORM)
    elif isinstance(S, str):
        raise GemvError(f"S is a number of splits, None or 'wave', not {S!r}")
    S = int(S)
    return {"S": S, "groups": groups, "ctas": groups * S, "blocks_per_sm": bps, "sm_count": sm_count,
            "waves": groups * S / (sm_count * bps), "sb_per_split_max": -(-nsb // S)}


def gemv(w, x, out=None, S: int | str | None = None, MT: int = 2, WARPS: int = 4, FORM: int = 0, PF: int | None = None):
    """Y[nt, od] (float32) = x[nt, id] W^T for nt = 1..16 on ``gemv_kq``. ``w``: a ``gpu.QWeight`` (q4_K / q6_K) or a
    :class:`GemvWeight`; ``x``: cupy float16 or float32 [nt, id], C-contiguous; ``S``: splits of the super-blocks
    (default :func:`default_splits`; ``"wave"``: :func:`wave_splits`); ``MT`` m16 tiles a warp, ``WARPS`` warps a CTA
    (registry rows); ``FORM``: 0 the exact-f16-weight form, 1 step 2's exact ``sc*q`` form (q4_K, nt <= 8; its exact
    function :func:`exact_weights_v2`), 3 step 6's: FORM=1's function in a register double buffer with the CTA's
    warps on one group of 16 rows, the split's super-blocks cut among them and folded in shared memory (MT=1, WARPS 4
    or 8; at S=1 the bits of FORM=1 at split WARPS).
    Round 9 step 3's ``PIPE`` argument left with its form (a TypeError now); step 5's FORM=2 left too (a ShapeError
    naming commit 90fd260, which holds it), and step 7's FORM=4 / 5 (a ShapeError naming 7894b07). ``PF``: round 9
    step 8's PF=1 build left the source (a ShapeError naming commit 7894b07, :func:`check_pf`); 0 and None are
    accepted and launch the one build there is, what PF=0 was."""
    FORM = check_form(FORM)
    check_pf(PF)
    c = gpu.cp()
    gv = w if isinstance(w, GemvWeight) else prepare(w)
    if not isinstance(x, c.ndarray) or x.ndim != 2:
        raise errors.ShapeError(f"activations must be a 2-D cupy array [nt, id], got {type(x).__name__}")
    if x.dtype not in (np.float16, np.float32):
        raise errors.ShapeError(f"gemv_kq reads float16 or float32 activations, not {x.dtype}")
    nt, id_ = x.shape
    if id_ != gv.id:
        raise errors.ShapeError(f"inner dimensions differ: activations id={id_}, weights id={gv.id}")
    if not 1 <= nt <= MAX_NT:
        raise errors.ShapeError(f"gemv_kq takes nt = 1..{MAX_NT} tokens, got {nt} (larger nt: qmatmul's wgmma / int8 "
                                f"families)")
    if FORM and (gv.qtype != "q4_K" or nt > FORM1_MAX_NT):
        raise errors.ShapeError(f"gemv_kq FORM={FORM} takes q4_K weights at nt = 1..{FORM1_MAX_NT}, got {gv.qtype} at "
                                f"nt={nt}")
    if FORM == 3 and MT != 1:
        raise errors.ShapeError(f"gemv_kq FORM={FORM} is built at MT=1 only, got MT={MT}")
    if WARPS not in FORM_WARPS[FORM]:
        raise errors.ShapeError(f"gemv_kq FORM={FORM} is built with WARPS in {FORM_WARPS[FORM]}, got WARPS={WARPS}")
    if not x.flags.c_contiguous:
        x = c.ascontiguousarray(x)
    QT = 4 if gv.qtype == "q4_K" else 6
    NT8 = 1 if nt <= 8 else 2
    XF32 = int(x.dtype == np.float32)
    k = _kernel(QT, XF32, NT8, MT, WARPS, FORM)
    groups = -(-gv.od // rows_per_cta(MT, WARPS, FORM))
    nsb = gv.id // QK
    if isinstance(S, str) and S != "wave":
        raise errors.ShapeError(f"S is a number of splits, None or 'wave', not {S!r}")
    if S is None or isinstance(S, str):
        S = launch_plan(gv, nt, XF32, MT, WARPS, FORM, S, gpu.device_props()["sm_count"])["S"]
    S = int(S)
    if not 1 <= S <= nsb:
        raise errors.ShapeError(f"S (splits of the {nsb} super-blocks) must be 1..{nsb}, got {S}")
    y = gpu._out(nt, gv.od, out)
    ws, cnt = _WS.get(c.cuda.get_current_stream().ptr, S * nt * gv.od if S > 1 else 0, groups)
    k.launch((groups, S), (gv.data, x, y, ws, cnt, np.int32(nt), np.int32(gv.od), np.int32(gv.id), np.int32(S)))
    logging.getLogger("labkernels.gemv").debug("gemv_kq QT=%d FORM=%d nt=%d %dx%d S=%d", QT, FORM, nt, gv.od, gv.id, S)
    return y


# ------------------------------------------------------------------------------------------ the recorded choice

def is_bench_of_record(run) -> bool:
    """A ``decode`` run that is round 9's benchmark (params ``what: gemv_bench``, with its gemv_bench table), not an
    experiment (a split sweep, an ablation) that records the same table for other questions."""
    return run.has("gemv_bench") and run.meta.get("params", {}).get("what") == "gemv_bench"


def bench_of_record(root=None):
    """The GEMV benchmark of record: the latest complete ``decode`` run of round 9's benchmark
    (:func:`is_bench_of_record`) that saw no power or thermal cap (:func:`labkernels.nvml.for_verdict`), or None."""
    return records.latest("decode", root=root, where=lambda r: is_bench_of_record(r) and nvml.for_verdict(r))


def auto_table(root=None):
    """Round 9's recorded table for ``qmatmul(kernel="auto")`` at nt <= 16: per (qtype, act, od, id, nt) of the latest
    complete ``decode`` run with a ``gemv_bench`` table that saw no power or thermal cap
    (:func:`labkernels.nvml.for_verdict`), the median time of the fastest gemv_kq configuration (typed columns MT,
    WARPS, FORM, WAVE (1: the one-wave split), S: the split it ran, 0 the default split in runs before step 3) and of
    round 7's wgmma launch (``wgmma_us``; NaN where not timed). None without such a run."""
    run = bench_of_record(root)
    if run is None:
        return None
    df = run.table("gemv_bench").copy()
    # typed columns of later steps, absent from earlier runs: FORM (step 2; 0 before), PIPE and WAVE (step 3; 0
    # before; runs after PIPE left the source have no PIPE column). The product has no PIPE form (step 3: it lost at
    # every point and was retired) and no FORM=2 (step 5) or FORM=4 / 5 (step 7), retired likewise (RETIRED_FORMS):
    # such a recorded row is never a candidate.
    for col in ("FORM", "PIPE", "WAVE"):
        df[col] = df[col].fillna(0).astype(int) if col in df.columns else 0
    df = df[(df.PIPE == 0) & ~df.FORM.isin(list(RETIRED_FORMS))]
    med = df.groupby(["qtype", "act", "od", "id", "nt", "variant", "family", "MT", "WARPS", "S", "FORM", "WAVE"],
                     as_index=False).median_us.median()
    g = med[med.family == "gemv_kq"]
    best = g.loc[g.groupby(["qtype", "act", "od", "id", "nt"]).median_us.idxmin()].copy()
    wg = med[med.family == "wgmma_kq"].set_index(["qtype", "act", "od", "id", "nt"]).median_us
    best["wgmma_us"] = [wg.get(k, np.nan) for k in zip(best.qtype, best.act, best.od, best.id, best.nt)]
    best["run_id"] = run.run_id
    return best.reset_index(drop=True)


_AUTO: dict = {}


def auto_table_cached():
    if "t" not in _AUTO:
        _AUTO["t"] = auto_table()
    return _AUTO["t"]


def recorded_choice(qtype: str, nt: int, od: int, id_: int, act: str, table=None):
    """(params, reason) when the recorded decode table says gemv_kq is faster than round 7's wgmma launch at the
    nearest recorded point (log distance in od, id, nt; same qtype and activation type), else None -- also None for
    nt > 16 or without a recorded run (the caller keeps round 7's choice and says so)."""
    r = _nearest(qtype, nt, od, id_, act, table)
    if r is None or not (r.median_us < r.wgmma_us):          # NaN (no wgmma timing on that card) is not a win
        return None
    return _params(r, od, id_), (f"gemv_kq {r.median_us:.1f} us vs wgmma {r.wgmma_us:.1f} us at {r.od}x{r.id} "
                                 f"nt={r.nt} {act} in run {r.run_id}")


def _nearest(qtype: str, nt: int, od: int, id_: int, act: str, table=None):
    """The recorded row nearest (log distance in od, id, nt) among those of the same qtype and activation type whose
    form can run ``nt`` tokens (FORM > 0: q4_K and nt <= FORM1_MAX_NT) and is still in the source (not one of
    :data:`RETIRED_FORMS`, in a table made by hand or by an older :func:`auto_table`), or None."""
    if nt > MAX_NT:
        return None
    t = auto_table_cached() if table is None else table
    if t is None or not len(t):
        return None
    rows = t[(t.qtype == qtype) & (t.act == act)]
    if "FORM" in rows.columns:
        rows = rows[~rows.FORM.fillna(0).astype(int).isin(list(RETIRED_FORMS))]
    if "FORM" in rows.columns and (qtype != "q4_K" or nt > FORM1_MAX_NT):
        rows = rows[rows.FORM == 0]
    if not len(rows):
        return None
    d = (np.log(rows.od / od) ** 2 + np.log(rows.id / id_) ** 2 + np.log(rows.nt / nt) ** 2)
    return rows.loc[d.idxmin()]


def _params(r, od: int, id_: int) -> dict:
    """gemv()'s arguments of a recorded row: the one-wave split as S='wave' (recomputed for the shape asked), S=1 (no
    split: FORM=3's way, a choice that does not depend on the shape) at any shape, another recorded split count only
    at its own shape (else the default split)."""
    params = {"MT": int(r.MT), "WARPS": int(r.WARPS)}
    if int(getattr(r, "FORM", 0) or 0):
        params["FORM"] = int(r.FORM)
    if int(getattr(r, "WAVE", 0) or 0):
        params["S"] = "wave"
    elif int(r.S) == 1 or (int(r.S) and (int(r.od), int(r.id)) == (od, id_)):
        params["S"] = int(r.S)
    return params


def recorded_config(qtype: str, nt: int, od: int, id_: int, act: str, table=None):
    """(params, reason) of ``qmatmul(kernel="gemv_kq")``: the fastest recorded gemv_kq configuration at the nearest
    recorded point (whatever wgmma did there), else MT=2 WARPS=4 FORM=0 at the default split (no recorded run)."""
    r = _nearest(qtype, nt, od, id_, act, table)
    if r is None:
        return {"MT": 2, "WARPS": 4}, "named (no recorded gemv_kq benchmark: MT=2 WARPS=4, the default split)"
    return _params(r, od, id_), (f"named: fastest recorded gemv_kq {r.variant} {r.median_us:.1f} us at "
                                 f"{r.od}x{r.id} nt={r.nt} {act} in run {r.run_id}")
