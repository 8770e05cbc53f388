"""Exact CPU references for the GEMM kernels: y[nt, od] = A[nt, id] (q8_1) x W[od, id]^T (q4_K | q6_K).

``gemm_int_ref`` computes what an int8 mma kernel computes: integer dot products per sub-block (16
elements for q6_K, 32 for q4_K) -- exact, emulated in numpy (float32 matmuls of integers below 2^24 are
exact) -- then float scaling in float64: for q6_K ``y += (d_w * sc) * d_a * isum`` per 16-sub-block, for
q4_K ``y += (d_w * sc) * d_a * isum - (dmin * m) * d_a * sum(q_a)`` per 32-sub-block (the q8_1 sum term,
taken here as the exact integer sum). ``gemm_f64_ref`` is the independent float64 reference from the
gguf-py dequantized weights and the original float activations.

Gates (``parity``): max relative error vs the integer reference, ``max|y - ref| / max|ref|`` <= 1e-3 (the
seeds' gate), and NMSE ``sum((y - ref64)^2) / sum(ref64^2)`` <= 5e-4 vs the float64 reference
(llama.cpp test-backend-ops' MUL_MAT bound). NaN/inf anywhere fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import layout, quantize_ref, quants

REL_ERR_GATE = 1e-3
NMSE_GATE = 5e-4


class ShapeError(ValueError):
    pass


@dataclass
class Q8_1:
    """q8_1 activations: qs int8 [nt, id], d float16 [nt, id/32], s float16 [nt, id/32] (ggml's d*sum)."""
    qs: np.ndarray
    d: np.ndarray
    s: np.ndarray

    @property
    def isum(self) -> np.ndarray:
        """Exact integer sum of each 32-block [nt, id/32]."""
        nt, n = self.qs.shape
        return self.qs.reshape(nt, n // 32, 32).astype(np.int32).sum(-1)


def quantize_activations(x: np.ndarray) -> Q8_1:
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)) or x.dtype == bool:
        raise ShapeError(f"activations must be real numbers, got dtype {x.dtype}")
    x = x.astype(np.float32, copy=False)
    if x.ndim != 2:
        raise ShapeError(f"activations must be 2-D [nt, id], got {x.shape}")
    if x.shape[1] % 32:
        raise ShapeError(f"activation row length {x.shape[1]} is not a multiple of 32")
    qs, d, s = quantize_ref.quantize_q8_1(x)
    return Q8_1(qs, d, s)


def _stride(qtype: str, stride) -> int:
    """The block stride of ``qtype`` weights: its natural size, or one of the strides the kernels take
    (``quants.QTYPES[qtype].gemm_strides``: 144 for q4_K, 210 or the padded 224 for q6_K); ShapeError otherwise."""
    if qtype not in ("q4_K", "q6_K"):
        raise ShapeError(f"the integer reference covers q4_K and q6_K, not {qtype}")
    if stride is None:
        return quants.BLOCK_SIZES[qtype][1]
    allowed = quants.QTYPES[qtype].gemm_strides
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or int(stride) not in allowed:
        raise ShapeError(f"{qtype} block stride must be {' or '.join(map(str, allowed))} bytes, got {stride!r}")
    return int(stride)


def _check(w_raw: np.ndarray, qtype: str, a: Q8_1, stride: int | None):
    nbytes = _stride(qtype, stride)
    w_raw = np.asarray(w_raw)
    if w_raw.ndim != 2 or w_raw.dtype != np.uint8:
        raise ShapeError(f"weights must be uint8 [od, row_bytes], got {w_raw.dtype} {w_raw.shape}")
    if w_raw.shape[0] < 1 or w_raw.shape[1] < nbytes or w_raw.shape[1] % nbytes:
        raise ShapeError(f"{qtype} weight rows of {w_raw.shape[1]} bytes are not whole {nbytes}-byte blocks")
    id_ = w_raw.shape[1] // nbytes * 256
    if not isinstance(a, Q8_1):
        raise ShapeError(f"activations must be reference.Q8_1 (quantize_activations), got {type(a).__name__}")
    if a.qs.ndim != 2 or a.qs.shape[1] != id_:
        raise ShapeError(f"inner dimensions differ: weights have id={id_}, activations {a.qs.shape[1:]}")
    quants.check_scales(w_raw, "q6_K_224" if nbytes == 224 else qtype, "weights", error=ShapeError)
    return w_raw, id_, nbytes


def weight_codes(w_raw: np.ndarray, qtype: str, stride: int | None = None):
    """Integer codes and per-sub-block float scales of a weight matrix.

    q6_K: (q int8 [od, id] centered -32..31, dsc float64 [od, id/16] = d*sc)
    q4_K: (q uint8 [od, id] 0..15, dsc float64 [od, id/32] = d*sc, dmm float64 [od, id/32] = dmin*m)
    """
    nbytes = _stride(qtype, stride)
    w_raw = np.asarray(w_raw)
    if w_raw.ndim != 2 or w_raw.dtype != np.uint8 or w_raw.shape[0] < 1 or w_raw.shape[1] % nbytes:
        raise ShapeError(f"weights must be uint8 [od, row_bytes] of whole {nbytes}-byte {qtype} blocks, got "
                         f"{w_raw.dtype} {w_raw.shape}")
    od = w_raw.shape[0]
    blocks = np.ascontiguousarray(w_raw).reshape(-1, nbytes)
    nsb = blocks.shape[0] // od
    if qtype == "q6_K":
        q = (layout.q6k_codes(blocks) - np.int8(32)).reshape(od, nsb * 256)
        d = blocks[:, 208:210].copy().view("<f2").astype(np.float64)            # [od*nsb, 1]
        sc = blocks[:, 192:208].view(np.int8).astype(np.float64)                 # [od*nsb, 16]
        return q, (d * sc).reshape(od, nsb * 16), None
    if qtype == "q4_K":
        q = layout.q4k_codes(blocks).reshape(od, nsb * 256)
        d = blocks[:, 0:2].copy().view("<f2").astype(np.float64)
        dmin = blocks[:, 2:4].copy().view("<f2").astype(np.float64)
        sc, mn = layout.q4k_scale_min(blocks[:, 4:16])
        return q, (d * sc).reshape(od, nsb * 8), (dmin * mn).reshape(od, nsb * 8)
    raise ShapeError(f"the integer reference covers q4_K and q6_K, not {qtype}")


def gemm_int_ref(w_raw: np.ndarray, qtype: str, a: Q8_1, stride: int | None = None,
                 tokens: np.ndarray | None = None) -> np.ndarray:
    """Exact integer-accumulator reference, float64 [nt (or len(tokens)), od]."""
    qtype = quants.normalize_qtype(qtype)
    if qtype == "q6_K_224":
        qtype, stride = "q6_K", 224
    w_raw, id_, _ = _check(w_raw, qtype, a, stride)
    qs = a.qs if tokens is None else a.qs[tokens]
    da = (a.d if tokens is None else a.d[tokens]).astype(np.float64)            # [nt, id/32]
    q, dsc, dmm = weight_codes(w_raw, qtype, stride)
    nt, od = qs.shape[0], q.shape[0]
    y = np.zeros((nt, od), np.float64)
    sub = 16 if qtype == "q6_K" else 32
    af = qs.astype(np.float32)
    wf = q.astype(np.float32)
    for s in range(id_ // sub):
        k0 = s * sub
        # exact: |products| <= 127*32 and at most 32 terms, far below 2^24
        isum = (af[:, k0:k0 + sub] @ wf[:, k0:k0 + sub].T).astype(np.float64)   # int32 accumulator
        c = k0 // 32
        y += (da[:, c:c + 1] * dsc[None, :, s]) * isum
    if qtype == "q4_K":
        isa = (a.isum if tokens is None else a.isum[tokens]).astype(np.float64)  # [nt, id/32]
        y -= (da * isa) @ dmm.T
    return y


def gemm_f64_ref(w_raw: np.ndarray, qtype: str, x: np.ndarray, stride: int | None = None) -> np.ndarray:
    """float64 reference from gguf-py's dequantization of the weights and the float activations."""
    import gguf

    qtype = quants.normalize_qtype(qtype)
    if qtype == "q6_K_224" or (qtype == "q6_K" and stride == 224):
        w_raw, qtype = quants.unpad_q6k(w_raw), "q6_K"
    if qtype not in ("q4_K", "q6_K"):
        raise ShapeError(f"the float64 reference covers q4_K and q6_K, not {qtype}")
    nbytes = quants.BLOCK_SIZES[qtype][1]
    w_raw = np.asarray(w_raw)
    if w_raw.ndim != 2 or w_raw.dtype != np.uint8 or w_raw.shape[0] < 1 or w_raw.shape[1] % nbytes or not w_raw.shape[1]:
        raise ShapeError(f"weights must be uint8 [od, row_bytes] of whole {nbytes}-byte {qtype} blocks, got "
                         f"{w_raw.dtype} {w_raw.shape}")
    quants.check_scales(w_raw, qtype, "weights", error=ShapeError)
    id_ = w_raw.shape[1] // nbytes * 256
    x = np.asarray(x)
    if x.dtype == bool or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ShapeError(f"activations must be real numbers, got dtype {x.dtype}")
    if x.ndim != 2 or x.shape[1] != id_:
        raise ShapeError(f"activations must be 2-D [nt, {id_}] for weights of id={id_}, got {x.shape}")
    gt = {"q6_K": gguf.GGMLQuantizationType.Q6_K, "q4_K": gguf.GGMLQuantizationType.Q4_K}[qtype]
    w = gguf.quants.dequantize(np.ascontiguousarray(w_raw), gt).astype(np.float64)
    return np.asarray(x, np.float64) @ w.T


def parity(y: np.ndarray, ref_int: np.ndarray, ref64: np.ndarray | None = None) -> dict:
    """Gate metrics. ``ok`` only when every element is finite and both gates hold."""
    y = np.asarray(y, np.float64)
    if y.shape != ref_int.shape:
        raise ShapeError(f"output shape {y.shape} differs from reference {ref_int.shape}")
    finite = bool(np.isfinite(y).all())
    scale = float(np.max(np.abs(ref_int))) or 1.0
    rel = float(np.max(np.abs(y - ref_int)) / scale) if finite else float("inf")
    out = {"max_rel_err": rel, "rel_gate": REL_ERR_GATE, "nonfinite": int(y.size - np.isfinite(y).sum())}
    ok = finite and rel <= REL_ERR_GATE
    if ref64 is not None:
        nmse = float(np.sum((y - ref64) ** 2) / max(np.sum(ref64 ** 2), 1e-300)) if finite else float("inf")
        out.update(nmse=nmse, nmse_gate=NMSE_GATE)
        ok = ok and nmse <= NMSE_GATE
    out["ok"] = bool(ok)
    return out


def macs(nt: int, od: int, id_: int) -> int:
    for k, v in (("nt", nt), ("od", od), ("id", id_)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ShapeError(f"macs: {k} must be a non-negative integer, got {v!r}")
    return int(nt) * int(od) * int(id_)
