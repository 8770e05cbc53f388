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
are independent implementations of the same format.
"""

from __future__ import annotations

import numpy as np

QK_K = 256

#: numpy structured dtypes, one element = one block
BLOCK_DTYPES: dict[str, np.dtype] = {
    "q4_K": np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))]),
    "q6_K": np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")]),
    "q6_K_224": np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2"),
                          ("pad", "u1", (14,))]),
    "q8_0": np.dtype([("d", "<f2"), ("qs", "i1", (32,))]),
    "q5_0": np.dtype([("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))]),
    "q8_1": np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (32,))]),
}

#: (elements per block, bytes per block)
BLOCK_SIZES: dict[str, tuple[int, int]] = {
    "q4_K": (256, 144),
    "q6_K": (256, 210),
    "q6_K_224": (256, 224),
    "q8_0": (32, 34),
    "q5_0": (32, 22),
    "q8_1": (32, 36),
}

for _name, (_, _nbytes) in BLOCK_SIZES.items():
    assert BLOCK_DTYPES[_name].itemsize == _nbytes, _name

#: GGML type names (as gguf-py spells them) -> labkernels names
GGML_NAMES = {"Q4_K": "q4_K", "Q6_K": "q6_K", "Q8_0": "q8_0", "Q5_0": "q5_0", "Q8_1": "q8_1"}

DEQUANT_TYPES = ("q4_K", "q6_K", "q6_K_224", "q8_0", "q5_0", "q8_1")
QUANT_TYPES = ("q4_K", "q6_K", "q6_K_224", "q8_0", "q8_1")


class QuantFormatError(ValueError):
    """Raised for raw data that does not form whole blocks of the named type, or unknown types."""


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


def blocks_view(raw: np.ndarray, qtype: str) -> np.ndarray:
    """Structured view (fields d, qs, scales, ...) of raw block bytes, flattened to [nblocks]."""
    qtype = normalize_qtype(qtype)
    return as_blocks(raw, qtype).view(BLOCK_DTYPES[qtype]).reshape(-1)


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 stored in 2 uint8 columns -> float32 column vector [n, 1]."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32).reshape(-1, 1)


def dequantize(raw: np.ndarray, qtype) -> np.ndarray:
    """Dequantize raw GGUF blocks to float32.

    ``raw`` is uint8 with the last axis a whole number of blocks (e.g. ``GGUFReader`` tensor data of shape
    [rows, row_bytes]); the result has the same leading shape with the last axis in elements.
    Bit-for-bit equal to ``gguf.quants.dequantize`` for q4_K, q6_K, q8_0, q5_0 (q6_K_224 is q6_K with a
    224-byte stride; q8_1 is the activation format).
    """
    from . import layout  # the closed-form element maps live there

    qtype = normalize_qtype(qtype)
    blocks = as_blocks(raw, qtype)
    qk, nbytes = BLOCK_SIZES[qtype]
    raw = np.asarray(raw)
    out_shape = raw.shape[:-1] + (raw.shape[-1] // nbytes * qk,)
    n = blocks.shape[0]

    if qtype in ("q6_K", "q6_K_224"):
        q = layout.q6k_codes(blocks) - np.int8(32)                 # [n, 256] int8, -32..31
        d = _f16(blocks[:, 208:210])                               # [n, 1]
        sc = blocks[:, 192:208].view(np.int8).astype(np.float32)   # [n, 16]
        ds = (d * sc)[:, layout.Q6K_SCALE_OF_ELEM]                 # d*sc per element (same op as gguf)
        y = ds * q.astype(np.float32)
    elif qtype == "q4_K":
        q = layout.q4k_codes(blocks)                               # [n, 256] uint8 0..15
        d = _f16(blocks[:, 0:2])
        dmin = _f16(blocks[:, 2:4])
        sc, mn = layout.q4k_scale_min(blocks[:, 4:16])             # [n, 8] each, 0..63
        dl = (d * sc.astype(np.float32))[:, layout.Q4K_SUB_OF_ELEM]
        ml = (dmin * mn.astype(np.float32))[:, layout.Q4K_SUB_OF_ELEM]
        y = dl * q.astype(np.float32) - ml
    elif qtype == "q8_0":
        y = blocks[:, 2:34].view(np.int8).astype(np.float32) * _f16(blocks[:, 0:2])
    elif qtype == "q5_0":
        q = layout.q5_0_codes(blocks).astype(np.int8) - np.int8(16)
        y = _f16(blocks[:, 0:2]) * q.astype(np.float32)
    elif qtype == "q8_1":
        y = blocks[:, 4:36].view(np.int8).astype(np.float32) * _f16(blocks[:, 0:2])
    else:  # pragma: no cover - normalize_qtype guards this
        raise QuantFormatError(qtype)
    assert y.shape == (n, qk)
    return y.astype(np.float32, copy=False).reshape(out_shape)


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    """Quantize float rows with ggml's reference (``_ref``) algorithms.

    ``x`` is [rows, n] (or [n]); returns uint8 raw blocks, one row of blocks per row of x.
    q4_K / q6_K need n % 256 == 0; q8_0 / q8_1 need n % 32 == 0. ``q6_K_224`` gives q6_K blocks padded
    to the 224-byte stride (pad bytes zero).
    """
    from . import quantize_ref

    qtype = normalize_qtype(qtype)
    x = np.asarray(x)
    if np.iscomplexobj(x):
        raise ValueError(f"quantize: complex input (dtype {x.dtype}) is not supported; pass x.real explicitly")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"quantize: expected real numbers, got dtype {x.dtype}")
    squeeze = x.ndim == 1
    x2 = x.reshape(1, -1) if squeeze else x
    if x2.ndim != 2:
        raise ValueError(f"quantize expects a 1-D or 2-D array, got shape {x.shape}")
    with np.errstate(over="ignore"):
        x32 = np.ascontiguousarray(x2, dtype=np.float32)
    if x2.dtype != np.float32 and np.isfinite(x2).all() and not np.isfinite(x32).all():
        r, c = (int(i) for i in np.argwhere(~np.isfinite(x32))[0])
        raise ValueError(f"quantize: x[{r}, {c}] = {float(x2[r, c])!r} is beyond float32's range")
    x2 = x32
    if qtype == "q4_K":
        out = quantize_ref.quantize_q4_K(x2)
    elif qtype == "q6_K":
        out = quantize_ref.quantize_q6_K(x2)
    elif qtype == "q6_K_224":
        out = pad_q6k(quantize_ref.quantize_q6_K(x2))
    elif qtype == "q8_0":
        out = quantize_ref.quantize_q8_0(x2)
    elif qtype == "q8_1":
        out = quantize_ref.pack_q8_1(*quantize_ref.quantize_q8_1(x2))
    else:
        raise QuantFormatError(f"quantize does not support {qtype!r} (supported: {', '.join(QUANT_TYPES)})")
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
    if n % qk:
        raise QuantFormatError(f"{qtype}: row length {n} is not a multiple of {qk}")
    return n // qk * nbytes
