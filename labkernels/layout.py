"""Round 1: closed-form per-element layout maps of q6_K and q4_K blocks (the verifier: rounds.r01_layout).

q6_K (seeds 002, section 2.1 / 3.2, ``expand_q6_elem``): element e (0..255) of a super-block is
    m  = e & 31            offset in its 32-chunk      it = e >> 7   which 128-half
    n  = e & 127           offset in the half
    ql byte = it*64 + (n & 63),   ql shift = 4 * (n >> 6)            (low 4 bits)
    qh byte = 128 + it*32 + m,    qh shift = 2 * ((n >> 5) & 3)      (high 2 bits, offset 128 in block)
    scale   = scales[e >> 4]  (16 sub-blocks of 16 elements, int8 at byte 192 + (e >> 4)), d f16 @208
    value   = d * scale * (code - 32)
q4_K: element e: sub-block j = e >> 5 (8 sub-blocks of 32), byte = 16 + 32*(j >> 1) + (e & 31),
    shift = 4 * (j & 1); 6-bit scale/min of sub-block j from the 12 packed bytes (``q4k_scale_min``):
    j < 4: sc = s[j] & 63, m = s[j+4] & 63;  j >= 4: sc = (s[j+4] & 15) | ((s[j-4] >> 6) << 4),
    m = (s[j+4] >> 4) | ((s[j] >> 6) << 4);   value = d*sc*q - dmin*m.

Everything here is vectorized over blocks with numpy fancy indexing using the maps, so the same maps
drive the dequantizer in :mod:`labkernels.quants`, the verifier of :mod:`labkernels.rounds.r01_layout` and the
pictures in the round-1 notebook. This module imports nothing of the lab: the formats' bottom layer.
"""

from __future__ import annotations

import numpy as np

_E = np.arange(256)

# ---- q6_K maps (byte offsets are within one 210/224-byte block) ----
Q6K_QL_BYTE = (_E >> 7) * 64 + ((_E & 127) & 63)
Q6K_QL_SHIFT = 4 * ((_E & 127) >> 6)
Q6K_QH_BYTE = 128 + (_E >> 7) * 32 + (_E & 31)
Q6K_QH_SHIFT = 2 * (((_E & 127) >> 5) & 3)
Q6K_SCALE_OF_ELEM = _E >> 4                       # index into scales[16]
Q6K_SCALE_BYTE = 192 + Q6K_SCALE_OF_ELEM
Q6K_D_BYTE = 208

# ---- q4_K maps ----
Q4K_SUB_OF_ELEM = _E >> 5                          # index into the 8 (sc, min) pairs
Q4K_QS_BYTE = 16 + 32 * (Q4K_SUB_OF_ELEM >> 1) + (_E & 31)
Q4K_QS_SHIFT = 4 * (Q4K_SUB_OF_ELEM & 1)

# ---- q5_0 maps (32 elements) ----
_E32 = np.arange(32)
Q5_0_QS_BYTE = 6 + (_E32 & 15)
Q5_0_QS_SHIFT = 4 * (_E32 >> 4)
Q5_0_QH_BIT = _E32                                 # bit e of the little-endian uint32 at byte 2


def f16_column(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 stored in 2 uint8 columns -> float32 column vector [n, 1]."""
    b = np.asarray(b)
    if b.dtype != np.uint8 or b.ndim != 2 or b.shape[1] != 2:
        raise LayoutError(f"f16_column takes [n, 2] uint8 bytes (one little-endian fp16 per row), got {b.dtype} "
                          f"{b.shape}")
    return np.ascontiguousarray(b).view("<f2").astype(np.float32).reshape(-1, 1)


class LayoutError(ValueError):
    """Block bytes that are not [n, bytes] uint8 with at least one whole block per row."""


def _blocks(blocks, nbytes: int, what: str) -> np.ndarray:
    b = np.asarray(blocks)
    if b.dtype != np.uint8 or b.ndim != 2 or b.shape[1] < nbytes:
        raise LayoutError(f"{what} takes [n, >={nbytes}] uint8 block bytes, got {b.dtype} {b.shape}")
    return b


def q6k_codes(blocks: np.ndarray) -> np.ndarray:
    """6-bit codes (0..63, uint8) of every element of [n, >=210] q6_K block bytes, via the maps."""
    blocks = _blocks(blocks, 210, "q6k_codes")
    lo = (blocks[:, Q6K_QL_BYTE] >> Q6K_QL_SHIFT.astype(np.uint8)) & np.uint8(0x0F)
    hi = (blocks[:, Q6K_QH_BYTE] >> Q6K_QH_SHIFT.astype(np.uint8)) & np.uint8(0x03)
    return (lo | (hi << np.uint8(4))).astype(np.int8)


def q4k_codes(blocks: np.ndarray) -> np.ndarray:
    """4-bit codes (0..15) of every element of [n, 144] q4_K blocks."""
    blocks = _blocks(blocks, 144, "q4k_codes")
    return (blocks[:, Q4K_QS_BYTE] >> Q4K_QS_SHIFT.astype(np.uint8)) & np.uint8(0x0F)


def q4k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12 packed bytes into 8 six-bit scales and 8 six-bit mins (ggml get_scale_min_k4)."""
    s = np.asarray(s)
    if s.ndim != 2 or s.shape[1] != 12 or not np.issubdtype(s.dtype, np.integer):
        raise LayoutError(f"q4k_scale_min takes [n, 12] packed scale bytes, got {s.dtype} {s.shape}")
    s = s.astype(np.uint8)
    j = np.arange(8)
    lo = j < 4
    jl = np.where(lo, j, 0)
    jh = np.where(lo, 4, j)  # j >= 4 branch indices (dummy for j < 4)
    sc = np.where(lo, s[:, jl] & 63, (s[:, np.minimum(jh + 4, 11)] & 15) | ((s[:, jh - 4] >> 6) << 4))
    mn = np.where(lo, s[:, jl + 4] & 63, (s[:, np.minimum(jh + 4, 11)] >> 4) | ((s[:, jh] >> 6) << 4))
    return sc.astype(np.uint8), mn.astype(np.uint8)


def q5_0_codes(blocks: np.ndarray) -> np.ndarray:
    """5-bit codes (0..31) of every element of [n, 22] q5_0 blocks."""
    blocks = _blocks(blocks, 22, "q5_0_codes")
    lo = (blocks[:, Q5_0_QS_BYTE] >> Q5_0_QS_SHIFT.astype(np.uint8)) & np.uint8(0x0F)
    qh = np.ascontiguousarray(blocks[:, 2:6]).view("<u4").reshape(-1, 1)
    hi = ((qh >> Q5_0_QH_BIT.astype(np.uint32)) & np.uint32(1)).astype(np.uint8)
    return lo | (hi << np.uint8(4))


# ---------------------------------------------------------------- element map tables (for pictures)

def q6k_element_table() -> "pandas.DataFrame":
    """One row per element of a q6_K block: which bytes/bits and which scale it comes from."""
    import pandas as pd

    return pd.DataFrame({
        "elem": _E, "chunk32": _E >> 5, "sub16": Q6K_SCALE_OF_ELEM,
        "ql_byte": Q6K_QL_BYTE, "ql_shift": Q6K_QL_SHIFT,
        "qh_byte": Q6K_QH_BYTE, "qh_shift": Q6K_QH_SHIFT, "scale_byte": Q6K_SCALE_BYTE,
    })


def q4k_element_table() -> "pandas.DataFrame":
    import pandas as pd

    return pd.DataFrame({
        "elem": _E, "sub32": Q4K_SUB_OF_ELEM, "qs_byte": Q4K_QS_BYTE, "qs_shift": Q4K_QS_SHIFT,
    })


def expand_q6_elem(block: bytes | np.ndarray, elem: int) -> int:
    """Scalar transcription of the seeds' ``expand_q6_elem`` (centered code -32..31) for one element."""
    if isinstance(elem, bool) or not isinstance(elem, (int, np.integer)) or not 0 <= elem < 256:
        raise LayoutError(f"expand_q6_elem: element {elem!r} is not an integer in 0..255 (a q6_K block has 256)")
    if isinstance(block, np.ndarray):
        b = block
        if b.dtype != np.uint8 or b.ndim != 1:
            raise LayoutError(f"expand_q6_elem takes one block's bytes (1-D uint8), got {b.dtype} {b.shape}")
    elif isinstance(block, (bytes, bytearray, memoryview)):
        b = np.frombuffer(bytes(block), np.uint8)
    else:
        raise LayoutError(f"expand_q6_elem takes one block's bytes, got {type(block).__name__}")
    if b.size < 210:
        raise LayoutError(f"expand_q6_elem: a q6_K block is 210 bytes, got {b.size}")
    elem = int(elem)
    m, it, n = elem & 31, elem >> 7, elem & 127
    v = ((int(b[it * 64 + (n & 63)]) >> ((n >> 6) * 4)) & 0x0F) | \
        (((int(b[128 + it * 32 + m]) >> (((n >> 5) & 3) * 2)) & 0x03) << 4)
    return v - 32
