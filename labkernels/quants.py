"""GGUF block formats (numpy layouts) and bit-exact dequantization.

Block layouts follow ggml (``ggml-common.h``); every offset below is the byte offset inside one block.

=========  ======  ============================================================================
type       bytes   layout
=========  ======  ============================================================================
q4_K       144     d f16 @0, dmin f16 @2, scales u8[12] @4 (6-bit packed sc/min), qs u8[128] @16
q6_K       210     ql u8[128] @0, qh u8[64] @128, scales i8[16] @192, d f16 @208
q6_K/224   224     the same 210 bytes followed by 14 pad bytes (the seeds' padded repack stride)
q8_0       34      d f16 @0, qs i8[32] @2
q5_0       22      d f16 @0, qh u8[4] @2 (bit 4 of each of the 32 values), qs u8[16] @6
q8_1       36      d f16 @0, s f16 @2 (s = d * sum(qs)), qs i8[32] @4   (activations)
=========  ======  ============================================================================

``dequantize(raw, qtype)`` reproduces ``gguf.quants.dequantize`` bit for bit (same float32 operation
order), but is written from the closed-form per-element maps of :mod:`labkernels.layout`, so the two
are independent implementations of the same format. A block whose float16 scale (``d``, ``dmin``) is NaN or
Inf is refused (:func:`check_scales`: QuantFormatError naming the block), as llama.cpp refuses such rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import layout, quantize_ref

QK_K = 256


class QuantFormatError(ValueError):
    """Raised for raw data that does not form whole blocks of the named type, or unknown types."""


def _f16(b: np.ndarray) -> np.ndarray:
    return layout.f16_column(b)


# ---- per-type decoders (float32, gguf-py's operation order) over [n, nbytes] uint8 blocks -> [n, qk]

def _dequant_q6k(blocks):
    q = layout.q6k_codes(blocks) - np.int8(32)                 # [n, 256] int8, -32..31
    d = _f16(blocks[:, 208:210])                               # [n, 1]
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)   # [n, 16]
    ds = (d * sc)[:, layout.Q6K_SCALE_OF_ELEM]                 # d*sc per element (same op as gguf)
    return ds * q.astype(np.float32)


def _dequant_q4k(blocks):
    q = layout.q4k_codes(blocks)                               # [n, 256] uint8 0..15
    d = _f16(blocks[:, 0:2])
    dmin = _f16(blocks[:, 2:4])
    sc, mn = layout.q4k_scale_min(blocks[:, 4:16])             # [n, 8] each, 0..63
    dl = (d * sc.astype(np.float32))[:, layout.Q4K_SUB_OF_ELEM]
    ml = (dmin * mn.astype(np.float32))[:, layout.Q4K_SUB_OF_ELEM]
    return dl * q.astype(np.float32) - ml


def _dequant_q5_0(blocks):
    q = layout.q5_0_codes(blocks).astype(np.int8) - np.int8(16)
    return _f16(blocks[:, 0:2]) * q.astype(np.float32)


def _dequant_q8(qs_at: int):
    return lambda blocks: blocks[:, qs_at:qs_at + 32].view(np.int8).astype(np.float32) * _f16(blocks[:, 0:2])


@dataclass(frozen=True)
class QType:
    """One GGUF block format: its name, elements and bytes per block (the one table of sizes), the numpy
    layout of one block, gguf-py's name, the type whose blocks these are (``q6_K_224`` pads ``q6_K``), the
    block strides the GEMM kernels take (empty: not a GEMM weight type), the dequantizer and the reference
    quantizer (``ggml``'s ``_ref`` algorithm; None where the lab has none)."""
    name: str
    qk: int
    nbytes: int
    fields: tuple
    ggml: str | None
    base: str
    gemm_strides: tuple
    dequant: Callable
    quant: Callable | None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(list(self.fields))


def _quant_q6k_224(x):
    return pad_q6k(quantize_ref.quantize_q6_K(x))


def _quant_q8_1(x):
    return quantize_ref.pack_q8_1(*quantize_ref.quantize_q8_1(x))


_Q6K_FIELDS = (("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2"))

#: the block formats of the lab, one record each
QTYPES: dict[str, QType] = {t.name: t for t in [
    QType("q4_K", 256, 144, (("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))),
          "Q4_K", "q4_K", (144,), _dequant_q4k, lambda x: quantize_ref.quantize_q4_K(x)),
    QType("q6_K", 256, 210, _Q6K_FIELDS, "Q6_K", "q6_K", (210, 224), _dequant_q6k,
          lambda x: quantize_ref.quantize_q6_K(x)),
    QType("q6_K_224", 256, 224, _Q6K_FIELDS + (("pad", "u1", (14,)),), None, "q6_K", (), _dequant_q6k,
          _quant_q6k_224),
    QType("q8_0", 32, 34, (("d", "<f2"), ("qs", "i1", (32,))), "Q8_0", "q8_0", (), _dequant_q8(2),
          lambda x: quantize_ref.quantize_q8_0(x)),
    QType("q5_0", 32, 22, (("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))), "Q5_0", "q5_0", (),
          _dequant_q5_0, None),
    QType("q8_1", 32, 36, (("d", "<f2"), ("s", "<f2"), ("qs", "i1", (32,))), "Q8_1", "q8_1", (), _dequant_q8(4),
          _quant_q8_1),
]}

for _t in QTYPES.values():
    assert _t.dtype.itemsize == _t.nbytes, _t.name

#: views of the table: numpy structured dtypes (one element = one block), (elements, bytes) per block
BLOCK_DTYPES: dict[str, np.dtype] = {k: t.dtype for k, t in QTYPES.items()}
BLOCK_SIZES: dict[str, tuple[int, int]] = {k: (t.qk, t.nbytes) for k, t in QTYPES.items()}

#: GGML type names (as gguf-py spells them) -> labkernels names
GGML_NAMES = {t.ggml: k for k, t in QTYPES.items() if t.ggml}

DEQUANT_TYPES = tuple(QTYPES)
QUANT_TYPES = tuple(k for k, t in QTYPES.items() if t.quant is not None)


def qtype_info(qtype) -> QType:
    """The record of a type (any spelling :func:`normalize_qtype` accepts)."""
    return QTYPES[normalize_qtype(qtype)]


def normalize_qtype(qtype) -> str:
    """Accept 'q6_K', 'Q6_K', a gguf GGMLQuantizationType, ... and return the labkernels name."""
    name = getattr(qtype, "name", qtype)
    if not isinstance(name, str):
        raise QuantFormatError(f"unsupported quant type {qtype!r}")
    if name in BLOCK_SIZES:
        return name
    if name.upper() in GGML_NAMES:
        return GGML_NAMES[name.upper()]
    raise QuantFormatError(
        f"unsupported quant type {name!r}: labkernels handles {', '.join(sorted(BLOCK_SIZES))}")


def as_blocks(raw: np.ndarray, qtype: str) -> np.ndarray:
    """View raw bytes (any shape whose last axis is a whole number of blocks) as a 2-D [nblocks, bytes]
    uint8 array. Raises QuantFormatError naming the problem when the bytes do not form whole blocks."""
    qtype = normalize_qtype(qtype)
    _, nbytes = BLOCK_SIZES[qtype]
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise QuantFormatError(f"{qtype} raw data must be uint8 bytes, got dtype {raw.dtype}")
    if raw.ndim == 0 or raw.shape[-1] % nbytes != 0:
        raise QuantFormatError(
            f"{qtype} raw data: last axis of shape {raw.shape} is not a multiple of the "
            f"{nbytes}-byte block size")
    return np.ascontiguousarray(raw).reshape(-1, nbytes)


#: the float16 scale fields of each type that its values are multiplied by (``s`` of q8_1 is a derived sum, not read
#: by the dequantizer): a NaN or Inf there makes every element of the block NaN / Inf
SCALE_FIELDS = ("d", "dmin")


def scale_offsets(qtype) -> tuple[tuple[str, int], ...]:
    """(field, byte offset in the block) of the float16 scales of a type (:data:`SCALE_FIELDS`)."""
    dt = BLOCK_DTYPES[normalize_qtype(qtype)]
    return tuple((f, dt.fields[f][1]) for f in SCALE_FIELDS if f in dt.fields)


def nonfinite_scales(raw: np.ndarray, qtype) -> tuple[np.ndarray, list[str]]:
    """Indices (into the flattened blocks of ``raw``) of the blocks with a NaN or Inf float16 scale, and the
    field of the first of them. Vectorized over the bytes (a uint16 view of each scale column, exponent bits all
    ones): nothing is dequantized, nothing copied when ``raw`` is contiguous."""
    qtype = normalize_qtype(qtype)
    blocks = as_blocks(raw, qtype)
    bad = None
    for _, off in scale_offsets(qtype):
        col = blocks[:, off:off + 2].view("<u2")[:, 0]
        b = (col & np.uint16(0x7C00)) == np.uint16(0x7C00)
        bad = b if bad is None else bad | b
    if bad is None or not bad.any():
        return np.zeros(0, np.int64), []
    idx = np.flatnonzero(bad)
    first = blocks[idx[0]]
    fields = [f"{f} = {float(first[o:o + 2].view('<f2')[0])}" for f, o in scale_offsets(qtype)
              if (int(first[o:o + 2].view('<u2')[0]) & 0x7C00) == 0x7C00]
    return idx, fields


def check_scales(raw: np.ndarray, qtype, what: str = "", error=None) -> None:
    """Raise (``error``, default :class:`QuantFormatError`) when a block of ``raw`` has a NaN or Inf scale, naming
    ``what`` (e.g. the tensor), the first such block (and its row where ``raw`` has rows) and how many there are."""
    qtype = normalize_qtype(qtype)
    idx, fields = nonfinite_scales(raw, qtype)
    if not len(idx):
        return
    raw = np.asarray(raw)
    _, nbytes = BLOCK_SIZES[qtype]
    per_row = raw.shape[-1] // nbytes
    i = int(idx[0])
    where = f"block {i}" + (f" (row {i // per_row}, block {i % per_row} of the row)" if raw.ndim > 1 else "")
    more = f"; {len(idx)} of {raw.size // nbytes} blocks have a NaN/Inf scale" if len(idx) > 1 else ""
    raise (error or QuantFormatError)(
        f"{what + ': ' if what else ''}{qtype} {where} has a non-finite scale ({', '.join(fields)}): every value of "
        f"the block would be NaN/Inf{more}")


def blocks_view(raw: np.ndarray, qtype: str) -> np.ndarray:
    """Structured view (fields d, qs, scales, ...) of raw block bytes, flattened to [nblocks]."""
    qtype = normalize_qtype(qtype)
    return as_blocks(raw, qtype).view(BLOCK_DTYPES[qtype]).reshape(-1)


def dequantize(raw: np.ndarray, qtype) -> np.ndarray:
    """Dequantize raw GGUF blocks to float32.

    ``raw`` is uint8 with the last axis a whole number of blocks (e.g. ``GGUFReader`` tensor data of shape
    [rows, row_bytes]); the result has the same leading shape with the last axis in elements.
    Bit-for-bit equal to ``gguf.quants.dequantize`` for q4_K, q6_K, q8_0, q5_0 (q6_K_224 is q6_K with a
    224-byte stride; q8_1 is the activation format).
    """
    qtype = normalize_qtype(qtype)
    blocks = as_blocks(raw, qtype)
    check_scales(raw, qtype)
    qk, nbytes = BLOCK_SIZES[qtype]
    raw = np.asarray(raw)
    out_shape = raw.shape[:-1] + (raw.shape[-1] // nbytes * qk,)
    n = blocks.shape[0]

    y = QTYPES[qtype].dequant(blocks)
    assert y.shape == (n, qk)
    return y.astype(np.float32, copy=False).reshape(out_shape)


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    """Quantize float rows with ggml's reference (``_ref``) algorithms.

    ``x`` is [rows, n] (or [n]); returns uint8 raw blocks, one row of blocks per row of x.
    q4_K / q6_K need n % 256 == 0; q8_0 / q8_1 need n % 32 == 0. ``q6_K_224`` gives q6_K blocks padded
    to the 224-byte stride (pad bytes zero).
    """
    qtype = normalize_qtype(qtype)
    if QTYPES[qtype].quant is None:
        raise QuantFormatError(f"quantize does not support {qtype!r} (supported: {', '.join(QUANT_TYPES)})")
    if x is None:
        raise QuantFormatError("quantize: x is None, expected an array of real numbers")
    x = np.asarray(x)
    if np.iscomplexobj(x):
        raise QuantFormatError(f"quantize: complex input (dtype {x.dtype}) is not supported; pass x.real explicitly")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise QuantFormatError(f"quantize: expected real numbers, got dtype {x.dtype}")
    squeeze = x.ndim == 1
    x2 = x.reshape(1, -1) if squeeze else x
    if x2.ndim != 2:
        raise QuantFormatError(f"quantize expects a 1-D or 2-D array, got shape {x.shape}")
    with np.errstate(over="ignore"):
        x32 = np.ascontiguousarray(x2, dtype=np.float32)
    if x2.dtype != np.float32 and np.isfinite(x2).all() and not np.isfinite(x32).all():
        r, c = (int(i) for i in np.argwhere(~np.isfinite(x32))[0])
        raise QuantFormatError(f"quantize: x[{r}, {c}] = {float(x2[r, c])!r} is beyond float32's range")
    x2 = x32
    out = QTYPES[qtype].quant(x2)
    return out[0] if squeeze else out


def pad_q6k(raw: np.ndarray) -> np.ndarray:
    """Repack q6_K rows from the 210-byte stride to the 224-byte padded stride (pad bytes zero)."""
    b = as_blocks(raw, "q6_K")
    out = np.zeros((b.shape[0], 224), np.uint8)
    out[:, :210] = b
    raw = np.asarray(raw)
    return out.reshape(raw.shape[:-1] + (raw.shape[-1] // 210 * 224,))


def unpad_q6k(raw: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pad_q6k`."""
    b = as_blocks(raw, "q6_K_224")
    raw = np.asarray(raw)
    return np.ascontiguousarray(b[:, :210]).reshape(raw.shape[:-1] + (raw.shape[-1] // 224 * 210,))


def row_bytes(qtype, n: int) -> int:
    """Bytes of one row of n elements; raises when n is not a whole number of blocks."""
    qtype = normalize_qtype(qtype)
    qk, nbytes = BLOCK_SIZES[qtype]
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise QuantFormatError(f"{qtype}: row length must be an integer, got {n!r} ({type(n).__name__})")
    if n < qk:
        raise QuantFormatError(f"{qtype}: row length {n} is less than one block of {qk} elements")
    if n % qk:
        raise QuantFormatError(f"{qtype}: row length {n} is not a multiple of {qk}")
    return int(n) // qk * nbytes
