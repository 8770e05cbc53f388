"""The weight layout of the Hopper-native k-quant GEMM (``kernels/wgmma_kq.cu``, launched by :mod:`labkernels.wgmma`):
the repack, its exact CPU emulation, and the parity gate against it (CPU only: numpy, the references).

Weight layouts (same bits per weight as GGUF; :func:`repack` / :func:`unrepack` round-trip byte for byte):

* **q4_K** (4.5 bpw): each 144-byte block keeps its 16-byte header (d, dmin, 12 scale bytes); its 128 nibble
  bytes are permuted so that lane ``c`` (of the 4 lanes that share a row in the wgmma A fragment) reads its 32
  bytes at ``16 + 32c`` contiguously. Word ``(j, h)`` (chunk j of 64 k, h = 0/1) holds the GGUF bytes
  ``qs[32j + 16h + 2c + (0, 8, 1, 9)]``: its low nibbles are the A-fragment pairs of k16 step ``h`` (k ``2c, 2c+1``
  in bits 0/16 and ``2c+8, 2c+9`` in bits 8/24), its high nibbles those of step ``h + 2``.
* **q6_K** (6.5625 bpw): four planes over all ``od * nsb`` blocks, row-major: ``L`` (128 B/block) low nibbles,
  lane ``c``'s 32 bytes contiguous, word ``(j, p)`` = bytes for k offsets ``2c + (0, 8, 1, 9)`` whose low nibble
  is step ``2p`` and high nibble step ``2p + 1`` of chunk j; ``H`` (64 B/block) the 2-bit high parts, lane c's
  word j holding field ``f = 2s + t`` (step s, t = 0 for k ``2c..``, 1 for ``2c+8..``) at bits ``2f`` (lower k) and
  ``16 + 2f`` (upper k); ``SC`` (16 B/block, int8 scales) and ``D`` (2 B/block, fp16 d). The planes keep every
  16-byte load aligned, which the 210-byte GGUF stride does not.

:func:`emulate_weights` performs exactly the kernel's bit operations and fp16/bf16 roundings on the repacked
bytes in numpy, giving the weights the tensor cores see; ``X16 @ W_emulated^T`` in float64 is then the exact
reference of the kernel (up to fp32 accumulation order).
"""

from __future__ import annotations

import numpy as np

from . import reference

QK = 256
BLOCK_BYTES = {"q4_K": 144, "q6_K": 210}
_KOFF = np.array([0, 8, 1, 9])          # byte order of a word: k offsets (2c + ...) of the A-fragment pairs


class RepackError(ValueError):
    pass


def _blocks(raw: np.ndarray, qtype: str) -> np.ndarray:
    raw = np.ascontiguousarray(raw)
    bb = BLOCK_BYTES.get(qtype)
    if bb is None:
        raise RepackError(f"the round-7 repack takes q4_K or q6_K, not {qtype}")
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] % bb:
        raise RepackError(f"{qtype} weights must be uint8 [od, nsb*{bb}], got {raw.dtype} {raw.shape}")
    return raw.reshape(raw.shape[0], raw.shape[1] // bb, bb)


def _packed(packed, qtype: str, od, id_, what: str) -> tuple[np.ndarray, int]:
    """(the repacked bytes as uint8, super-blocks per row) of a ``what`` call, RepackError unless ``qtype`` is q4_K /
    q6_K, ``od`` >= 1 and ``id`` a positive multiple of 256 (integers), and ``packed`` uint8 of exactly the
    od x id/256 blocks' bytes (:func:`repack`'s output for that shape)."""
    bb = BLOCK_BYTES.get(qtype) if isinstance(qtype, str) else None
    if bb is None:
        raise RepackError(f"{what}: the round-7 repack takes q4_K or q6_K, not {qtype!r}")
    for name, v in (("od", od), ("id", id_)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise RepackError(f"{what}: {name} must be an integer >= 1, got {v!r}")
    if id_ % QK:
        raise RepackError(f"{what}: id={id_} is not a multiple of {QK}")
    if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8:
        raise RepackError(f"{what}: the repacked {qtype} bytes must be a uint8 numpy array (repack's output), got "
                          f"{getattr(packed, 'dtype', type(packed).__name__)}")
    nsb = int(id_) // QK
    if packed.size != int(od) * nsb * bb:
        planes = " in its four planes (L, H, SC, D)" if qtype == "q6_K" else ""
        raise RepackError(f"{what}: {od} x {id_} {qtype} holds {od} x {nsb} blocks of {bb} bytes = "
                          f"{int(od) * nsb * bb} repacked bytes{planes}, got {packed.size} (shape {packed.shape})")
    return np.ascontiguousarray(packed), nsb


# ------------------------------------------------------------------------------------------------ q4_K


def _q4_perm() -> np.ndarray:
    """perm[pos] = GGUF qs index of repacked qs byte pos (pos = 32c + 8j + 4h + b)."""
    c, j, h, b = np.meshgrid(np.arange(4), np.arange(4), np.arange(2), np.arange(4), indexing="ij")
    pos = 32 * c + 8 * j + 4 * h + b
    src = 32 * j + 16 * h + 2 * c + _KOFF[b]
    perm = np.empty(128, np.int64)
    perm[pos.ravel()] = src.ravel()
    assert sorted(perm) == list(range(128))
    return perm


_Q4_PERM = _q4_perm()
_Q4_INV = np.argsort(_Q4_PERM)

# ------------------------------------------------------------------------------------------------ q6_K


def _q6_code_index():
    """For each element e (0..255) of a block: (ql byte, ql shift, qh byte, qh shift) of its 6-bit code."""
    e = np.arange(256)
    n, r = e // 128, e % 128
    quarter, l = r // 32, r % 32
    ql = 64 * n + l + 32 * (quarter & 1)
    qls = 4 * (quarter >> 1)
    qh = 128 + 32 * n + l
    qhs = 2 * quarter
    return ql, qls, qh, qhs


_Q6_QL, _Q6_QLS, _Q6_QH, _Q6_QHS = _q6_code_index()


def _q6_codes(blk: np.ndarray) -> np.ndarray:
    """6-bit codes (0..63, before the -32) [..., 256] of q6_K blocks [..., 210]."""
    lo = (blk[..., _Q6_QL] >> _Q6_QLS) & 0xF
    hi = (blk[..., _Q6_QH] >> _Q6_QHS) & 0x3
    return (lo | (hi << 4)).astype(np.uint8)


def _q6_from_codes(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ql [..., 128], qh [..., 64] from codes [..., 256] (inverse of _q6_codes)."""
    shp = q.shape[:-1]
    ql = np.zeros(shp + (128,), np.uint8)
    qh = np.zeros(shp + (64,), np.uint8)
    for e in range(256):   # 256 vectorized column ops: fine for a load-time repack
        ql[..., _Q6_QL[e]] |= ((q[..., e] & 0xF) << _Q6_QLS[e]).astype(np.uint8)
        qh[..., _Q6_QH[e] - 128] |= (((q[..., e] >> 4) & 3) << _Q6_QHS[e]).astype(np.uint8)
    return ql, qh


def _q6_L_index():
    """L plane byte (c, j, p, b) -> (element of its low nibble, element of its high nibble)."""
    c, j, p, b = np.meshgrid(np.arange(4), np.arange(4), np.arange(2), np.arange(4), indexing="ij")
    k = 2 * c + _KOFF[b]
    s_lo = 4 * j + 2 * p
    return (16 * s_lo + k).ravel(), (16 * (s_lo + 1) + k).ravel()


def _q6_H_index():
    """H plane (c, j) word, field f = 2s+t: element at bits 2f (lower k) and 16+2f (upper k)."""
    c, j, s, t = np.meshgrid(np.arange(4), np.arange(4), np.arange(4), np.arange(2), indexing="ij")
    e_lo = 16 * (4 * j + s) + 2 * c + 8 * t
    f = 2 * s + t
    return e_lo.reshape(16, 8), (e_lo + 1).reshape(16, 8), f.reshape(16, 8)


_Q6_L_LO, _Q6_L_HI = _q6_L_index()
_Q6_H_LO, _Q6_H_HI, _Q6_H_F = _q6_H_index()


# ------------------------------------------------------------------------------------------------ API


def repack(raw: np.ndarray, qtype: str) -> np.ndarray:
    """GGUF rows [od, nsb*block] -> the round-7 layout (uint8, same byte count; 2-D [od, ...] for q4_K, 1-D planes
    for q6_K)."""
    blk = _blocks(raw, qtype)
    od, nsb, _ = blk.shape
    if qtype == "q4_K":
        out = blk.copy()
        out[..., 16:] = blk[..., 16:][..., _Q4_PERM]
        return out.reshape(od, nsb * 144)
    q = _q6_codes(blk)
    L = ((q[..., _Q6_L_LO] & 0xF) | ((q[..., _Q6_L_HI] & 0xF) << 4)).astype(np.uint8)
    hl = ((q[..., _Q6_H_LO] >> 4) & 3).astype(np.uint32) << (2 * _Q6_H_F).astype(np.uint32)
    hh = ((q[..., _Q6_H_HI] >> 4) & 3).astype(np.uint32) << (16 + 2 * _Q6_H_F).astype(np.uint32)
    H = (hl.sum(-1, dtype=np.uint32) | hh.sum(-1, dtype=np.uint32)).astype("<u4")
    return np.concatenate([L.ravel(), np.ascontiguousarray(H).view(np.uint8).ravel(), blk[..., 192:208].ravel(), blk[..., 208:210].ravel()])


def planes_q6(packed: np.ndarray, od: int, nsb: int):
    n = od * nsb
    o = np.cumsum([0, 128 * n, 64 * n, 16 * n, 2 * n])
    if packed.size != o[-1]:
        raise RepackError(f"q6_K planes of {od} x {nsb} blocks hold {o[-1]} bytes, got {packed.size}")
    return (packed[o[0]:o[1]].reshape(od, nsb, 128), packed[o[1]:o[2]].reshape(od, nsb, 64).view("<u4"),
            packed[o[2]:o[3]].reshape(od, nsb, 16), packed[o[3]:o[4]].reshape(od, nsb, 2))


def unrepack(packed: np.ndarray, qtype: str, od: int, id_: int) -> np.ndarray:
    """The inverse of :func:`repack`: the original GGUF bytes [od, nsb*block]."""
    packed, nsb = _packed(packed, qtype, od, id_, "unrepack")
    if qtype == "q4_K":
        blk = packed.reshape(od, nsb, 144)
        out = blk.copy()
        out[..., 16:] = blk[..., 16:][..., _Q4_INV]
        return out.reshape(od, nsb * 144)
    L, H, SC, D = planes_q6(packed.ravel(), od, nsb)
    q = np.zeros((od, nsb, 256), np.uint8)
    q[..., _Q6_L_LO] = L & 0xF
    q[..., _Q6_L_HI] = L >> 4
    f = (2 * _Q6_H_F).astype(np.uint32)
    q[..., _Q6_H_LO] |= (((H[..., :, None] >> f) & 3) << 4).astype(np.uint8)
    q[..., _Q6_H_HI] |= (((H[..., :, None] >> (16 + f)) & 3) << 4).astype(np.uint8)
    ql, qh = _q6_from_codes(q)
    return np.concatenate([ql, qh, SC, D], axis=-1).reshape(od, nsb * 210)


# ------------------------------------------------------------------------------------------------ emulation


def _round16(x: np.ndarray, bf16: bool) -> np.ndarray:
    """Round float64/float32 values to fp16 or bf16 (nearest even), returned as float64."""
    if not bf16:
        return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)
    f = np.asarray(x, np.float64).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def _q4_scales(hdr: np.ndarray, bf16: bool):
    """The 8 sub-block scales d*sc and negated mins -(dmin*m) of q4_K block headers [..., 16] as the kernel rounds
    them (f32 products, then one rounding to fp16/bf16), float64 [..., 8] each."""
    d = hdr[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = hdr[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sc8 = hdr[..., 4:16].astype(np.int64)
    scale = np.zeros(hdr.shape[:-1] + (8,)); mins = np.zeros(hdr.shape[:-1] + (8,))
    for i in range(8):      # get_scale_min_k4
        if i < 4:
            s_, m_ = sc8[..., i] & 63, sc8[..., i + 4] & 63
        else:
            s_ = (sc8[..., i + 4] & 0xF) | ((sc8[..., i - 4] >> 6) << 4)
            m_ = (sc8[..., i + 4] >> 4) | ((sc8[..., i] >> 6) << 4)
        scale[..., i] = _round16(d * s_.astype(np.float32), bf16)
        mins[..., i] = _round16(-(dmin * m_.astype(np.float32)), bf16)
    return scale, mins


#: the q4_K scale plane's bytes per row and super-block (SCL=2): four chunks x two f16 pairs
PLANE_BYTES = 32


def scale_plane(hdr: np.ndarray) -> np.ndarray:
    """The q4_K scale plane of the register form's SCL=2 (wgmma_kq.cuh ``q4_scales_pl``) from block headers
    [..., 16] (d, dmin, scales[12]: the GGUF header, kept by :func:`repack`): uint8 [..., 32], per super-block the
    words [sp0 zp0 sp1 zp1 sp2 zp2 sp3 zp3] -- sp_j the f16 pair (d sc_2j, d sc_2j+1), zp_j (-dmin m_2j,
    -dmin m_2j+1), each rounded once from the exact product, as the kernel's f16 scale path (``q4_scales_h``) and
    its fp32 one round them: the A fragments are bitwise SCL=0's. 32 bytes per 256 weights: +1 bit per weight over
    the 4.5 of the repacked blocks, which keep their headers (so the repack still round-trips to the GGUF bytes)."""
    scale, mins = _q4_scales(np.asarray(hdr, np.uint8), bf16=False)
    out = np.empty(scale.shape[:-1] + (4, 2, 2), np.float16)   # [..., chunk j, (sp, zp), half]
    out[..., 0, :] = scale.reshape(scale.shape[:-1] + (4, 2))
    out[..., 1, :] = mins.reshape(mins.shape[:-1] + (4, 2))
    return out.reshape(scale.shape[:-1] + (16,)).view(np.uint8)


def emulate_weights(packed: np.ndarray, qtype: str, od: int, id_: int, bf16: bool = False) -> np.ndarray:
    """The weights [od, id] (float64 holding fp16/bf16 values) that the kernel feeds the tensor cores, computed
    from the *repacked* bytes with the kernel's own bit extraction and rounding order."""
    packed, nsb = _packed(packed, qtype, od, id_, "emulate_weights")
    c = np.arange(4)
    if qtype == "q4_K":
        blk = packed.reshape(od, nsb, 144)
        scale, mins = _q4_scales(blk[..., :16], bf16)
        words = blk[..., 16:].reshape(od, nsb, 4, 4, 2, 4)                      # [c, j, h, byte]
        w = words.astype(np.uint32)
        word = w[..., 0] | (w[..., 1] << 8) | (w[..., 2] << 16) | (w[..., 3] << 24)   # [od, nsb, c, j, h]
        out = np.zeros((od, nsb, 256))
        for half in range(2):
            for h in range(2):
                s = 2 * half + h
                for t in range(2):
                    v = (word[..., h] >> (4 * half + 8 * t)).astype(np.uint32)
                    lo, hi = v & 0xF, (v >> 16) & 0xF                          # [od, nsb, c, j]
                    for jj in range(4):
                        sub = 2 * jj + half
                        sc_, mn_ = scale[..., sub, None], mins[..., sub, None]
                        k = 64 * jj + 16 * s + 2 * c + 8 * t                  # [c]
                        out[..., k] = _round16(lo[..., jj] * sc_ + mn_, bf16)
                        out[..., k + 1] = _round16(hi[..., jj] * sc_ + mn_, bf16)
        return out.reshape(od, id_)
    L, H, SC, D = planes_q6(packed.ravel(), od, nsb)
    d = D.copy().view(np.float16)[..., 0].astype(np.float32)
    scale = _round16(d[..., None] * SC.view(np.int8).astype(np.float32), bf16)     # [od, nsb, 16]
    Lw = L.reshape(od, nsb, 4, 4, 2, 4).astype(np.uint32)
    lword = Lw[..., 0] | (Lw[..., 1] << 8) | (Lw[..., 2] << 16) | (Lw[..., 3] << 24)  # [od, nsb, c, j, p]
    Hw = H.reshape(od, nsb, 4, 4)                                                 # [od, nsb, c, j]
    out = np.zeros((od, nsb, 256))
    for j in range(4):
        for s in range(4):
            lw = lword[..., j, s >> 1] >> (4 * (s & 1))
            for t in range(2):
                f = 2 * s + t
                hs = (Hw[..., j] << (4 - 2 * f)) if f <= 2 else (Hw[..., j] >> (2 * f - 4))
                v = ((lw >> (8 * t)) & 0x000F000F) | (hs & 0x00300030)
                lo, hi = (v & 0xFFFF).astype(np.int64) - 32, (v >> 16).astype(np.int64) - 32
                k = 64 * j + 16 * s + 2 * c + 8 * t
                sc_ = scale[..., 4 * j + s, None]
                out[..., k] = _round16(lo * sc_, bf16)
                out[..., k + 1] = _round16(hi * sc_, bf16)
    return out.reshape(od, id_)



# ------------------------------------------------------------------------------------------------ gates



def gate(y, w_raw: np.ndarray, qtype: str, x: np.ndarray, packed: np.ndarray | None = None, bf16: bool = False,
         tokens=None, w64: np.ndarray | None = None, w16: np.ndarray | None = None,
         exact_bound: float | None = None) -> dict:
    """The round-7 parity gate on ``tokens`` (all rows), the lab's two gates in the form the int8 rounds use them
    (max relative error against the kernel's exact function, NMSE against the independent float64 reference):

    * ``max_rel_err`` = max|y - exact| / max|exact| <= 1e-3, exact = the kernel's own exact function computed on the
      CPU from the repacked bytes (:func:`emulate_weights`: the 16-bit weights the tensor cores see) times the
      16-bit activations, in float64 -- as the int8 rounds gate against the exact integer function of their q8_1
      activations; a second, strict bound :func:`exact_gate` (~1e-5: only fp32 accumulation order may differ)
      must hold too, on the error relative to the largest sum of |terms| of an output (``exact_rel_terms``:
      the scale of a summation-order error, max|exact| unless the terms cancel);
    * ``nmse`` <= 5e-4 against the pure float64 reference (gguf-py's dequantized weights, the original float
      activations).

    ``max_rel_err_f64`` (against the pure float64 reference) and ``max_rel_err_in`` (gguf-py weights times the 16-bit
    activations) are reported beside them: rounding the weights to fp16 alone puts those near 1e-3.
    ``w64`` / ``w16`` (gguf-py's dequantized / the emulated weights) may be passed in when one matrix is gated often."""
    import gguf

    x = np.asarray(x, np.float32)
    tok = np.arange(x.shape[0]) if tokens is None else np.asarray(tokens)
    y = np.asarray(y, np.float64)[tok]
    if w64 is None:
        w64 = gguf.quants.dequantize(np.ascontiguousarray(w_raw), gguf.GGMLQuantizationType[qtype.upper()])
    w64 = np.asarray(w64, np.float64)
    x16 = _round16(x[tok], bf16)
    ref64 = x[tok].astype(np.float64) @ w64.T
    ref_in = x16 @ w64.T
    finite = bool(np.isfinite(y).all())

    def rel(a, b):
        return float(np.abs(a - b).max() / (float(np.abs(b).max()) or 1.0)) if finite else float("inf")

    if w16 is None:
        if packed is None:
            raise ValueError("the gate needs the repacked bytes (packed) or the emulated weights (w16)")
        w16 = emulate_weights(packed, qtype, ref64.shape[1], x.shape[1], bf16=bf16)
    w16 = np.asarray(w16, np.float64)
    exact = x16 @ w16.T
    exact_rel = rel(y, exact)
    # the strict bound's scale: the largest sum of |terms| of an output (|x16| @ |w16|^T), which an fp32 summation
    # error is proportional to; it is max|exact| where the terms do not cancel, larger where they do (an output
    # ~100x smaller than its terms, od = 1 and one token: nothing else to take the max over) -- a wrong weight,
    # scale or fragment still moves an output by a whole term, O(1/K) of the sum or more
    terms = float((np.abs(x16) @ np.abs(w16).T).max()) if finite else 0.0
    exact_rel_terms = float(np.abs(y - exact).max() / (terms or 1.0)) if finite else float("inf")
    out = {"max_rel_err": exact_rel, "exact_rel": exact_rel, "exact_rel_terms": exact_rel_terms,
           "max_rel_err_in": rel(y, ref_in),
           "max_rel_err_f64": rel(y, ref64),
           "nmse": float(((y - ref64) ** 2).sum() / max((ref64 ** 2).sum(), 1e-300)) if finite else float("inf"),
           "nonfinite": int(y.size - np.isfinite(y).sum()), "tokens_checked": int(tok.size)}
    bound = exact_gate(x.shape[1]) if exact_bound is None else exact_bound      # a form's own bound (gemv FORM=1)
    out["exact_bound"] = bound
    out["ok"] = bool(finite and exact_rel <= reference.REL_ERR_GATE and exact_rel_terms <= bound
                     and out["nmse"] <= reference.NMSE_GATE)
    return out


def exact_gate(id_: int) -> float:
    """Kernel vs its own exact function (16-bit operands, float64 products): only the tensor cores' fp32
    accumulation order differs, an error growing like sqrt(K): 1e-5 up to K=1024, 3.7e-5 at K=14336. A wrong
    fragment, scale or row gives O(1)."""
    return 1e-5 * max(1.0, (id_ / 1024) ** 0.5)


def int8_path_error(w_raw: np.ndarray, qtype: str, x: np.ndarray) -> dict:
    """The error of the lab's int8 q8_1 path against the same float64 reference (its kernels equal the integer
    reference to ~1e-6, so the integer reference stands for them): for the 'smaller than int8' comparison."""
    a = reference.quantize_activations(x)
    ref = reference.gemm_int_ref(w_raw, qtype, a)
    ref64 = reference.gemm_f64_ref(w_raw, qtype, x)
    return {"max_rel_err_f64": float(np.abs(ref - ref64).max() / (float(np.abs(ref64).max()) or 1.0)),
            "nmse": float(((ref - ref64) ** 2).sum() / max((ref64 ** 2).sum(), 1e-300))}
