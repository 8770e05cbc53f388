"""Round 1: closed-form per-element layout maps of q6_K and q4_K blocks, and their verifier.

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
drive the dequantizer in :mod:`labkernels.quants` and the pictures in the round-1 notebook.
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


def q6k_codes(blocks: np.ndarray) -> np.ndarray:
    """6-bit codes (0..63, uint8) of every element of [n, >=210] q6_K block bytes, via the maps."""
    lo = (blocks[:, Q6K_QL_BYTE] >> Q6K_QL_SHIFT.astype(np.uint8)) & np.uint8(0x0F)
    hi = (blocks[:, Q6K_QH_BYTE] >> Q6K_QH_SHIFT.astype(np.uint8)) & np.uint8(0x03)
    return (lo | (hi << np.uint8(4))).astype(np.int8)


def q4k_codes(blocks: np.ndarray) -> np.ndarray:
    """4-bit codes (0..15) of every element of [n, 144] q4_K blocks."""
    return (blocks[:, Q4K_QS_BYTE] >> Q4K_QS_SHIFT.astype(np.uint8)) & np.uint8(0x0F)


def q4k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12 packed bytes into 8 six-bit scales and 8 six-bit mins (ggml get_scale_min_k4)."""
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
    b = np.frombuffer(bytes(block), np.uint8) if not isinstance(block, np.ndarray) else block
    m, it, n = elem & 31, elem >> 7, elem & 127
    v = ((int(b[it * 64 + (n & 63)]) >> ((n >> 6) * 4)) & 0x0F) | \
        (((int(b[128 + it * 32 + m]) >> (((n >> 5) & 3) * 2)) & 0x03) << 4)
    return v - 32


# ---------------------------------------------------------------- the verifier

def verify_q6k_blocks(blocks: np.ndarray, stride: int = 210) -> dict:
    """Check the closed-form q6_K map against gguf-py's dequantization for [n, stride] blocks.

    For stride 224 the blocks are first cut back to 210 bytes for gguf-py (which only knows 210) while the
    maps index the padded blocks directly. Returns element/mismatch counts and the error of the seeds'
    wrong "8 sub-blocks of 32, one scale" model (the pitfall in seeds 002 section 3.3 #1).
    """
    import gguf

    from .quants import _f16

    if blocks.ndim != 2 or blocks.shape[1] != stride:
        raise ValueError(f"expected [n, {stride}] q6_K blocks, got {blocks.shape}")
    ref = gguf.quants.dequantize(np.ascontiguousarray(blocks[:, :210]), gguf.GGMLQuantizationType.Q6_K)
    ref = ref.reshape(-1, 256)
    codes = q6k_codes(blocks).astype(np.int8) - np.int8(32)
    d = _f16(blocks[:, Q6K_D_BYTE:Q6K_D_BYTE + 2])
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
    mine = (d * sc)[:, Q6K_SCALE_OF_ELEM] * codes.astype(np.float32)
    mism = int(np.count_nonzero(mine.view(np.uint32) != ref.view(np.uint32)))
    # the wrong model: 8 chunks of 32, each with ONE scale (the first of its two sub-blocks)
    wrong = (d * sc)[:, (_E >> 5) * 2] * codes.astype(np.float32)
    err = wrong - ref
    scale = np.sqrt(np.mean(ref.astype(np.float64) ** 2)) if ref.size else 0.0
    return {
        "type": "q6_K", "stride": stride, "blocks": int(blocks.shape[0]), "elements": int(ref.size),
        "mismatches": mism,
        "wrong_model_mismatches": int(np.count_nonzero(wrong != ref)),
        "wrong_model_rel_rmse": float(np.sqrt(np.mean(err.astype(np.float64) ** 2)) / scale) if scale else 0.0,
        "wrong_model_max_abs": float(np.max(np.abs(err))) if err.size else 0.0,
        "_wrong_err": err,  # for histograms; dropped by callers that serialize
        "_ref": ref,
    }


def verify_q4k_blocks(blocks: np.ndarray) -> dict:
    """Check the closed-form q4_K maps (nibbles + 6-bit scale/min unpacking) against gguf-py."""
    import gguf

    from .quants import _f16

    if blocks.ndim != 2 or blocks.shape[1] != 144:
        raise ValueError(f"expected [n, 144] q4_K blocks, got {blocks.shape}")
    ref = gguf.quants.dequantize(np.ascontiguousarray(blocks), gguf.GGMLQuantizationType.Q4_K).reshape(-1, 256)
    q = q4k_codes(blocks).astype(np.float32)
    sc, mn = q4k_scale_min(blocks[:, 4:16])
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    mine = (d * sc.astype(np.float32))[:, Q4K_SUB_OF_ELEM] * q - (dmin * mn.astype(np.float32))[:, Q4K_SUB_OF_ELEM]
    mism = int(np.count_nonzero(mine.view(np.uint32) != ref.view(np.uint32)))
    # unpacking check on its own: every sc/min in 0..63, and the naive "low 6 bits only" unpack is wrong
    naive_sc = blocks[:, 4:12] & 63
    return {
        "type": "q4_K", "stride": 144, "blocks": int(blocks.shape[0]), "elements": int(ref.size),
        "mismatches": mism,
        "naive_scale_unpack_mismatches": int(np.count_nonzero(naive_sc[:, 4:] != sc[:, 4:])),
    }


def random_q6k_blocks(n: int, rng: np.random.Generator, stride: int = 210) -> np.ndarray:
    """Random *valid* q6_K blocks: random ql/qh/scales bytes and a finite, normal fp16 d."""
    b = rng.integers(0, 256, size=(n, stride), dtype=np.uint8)
    d = (rng.uniform(1e-4, 1e-1, n) * rng.choice([-1, 1], n)).astype("<f2")
    b[:, 208:210] = d.view(np.uint8).reshape(n, 2)
    if stride > 210:
        b[:, 210:] = 0xEE  # pad bytes carry garbage on purpose: nothing may read them
    return b


def random_q4k_blocks(n: int, rng: np.random.Generator) -> np.ndarray:
    b = rng.integers(0, 256, size=(n, 144), dtype=np.uint8)
    for off in (0, 2):
        d = rng.uniform(1e-4, 1e-1, n).astype("<f2")
        b[:, off:off + 2] = d.view(np.uint8).reshape(n, 2)
    return b


def verify_model(path, name_filter: str | None = None, strides=(210, 224), max_blocks: int | None = None):
    """Run the verifier over every q4_K / q6_K tensor of a GGUF file.

    Returns (rows, extras): rows is a list of per-tensor dicts (tensor, type, stride, shape, blocks,
    elements, mismatches, wrong-model error); extras holds arrays for plots (wrong-model error samples).
    """
    import re

    from tqdm import tqdm

    from .model import open_model
    from .quants import pad_q6k

    m = open_model(path)
    rows, err_samples = [], []
    rx = re.compile(name_filter) if name_filter else None
    todo = [t for t in m.tensors() if t.qtype in ("q4_K", "q6_K") and not (rx and not rx.search(t.name))]
    # progress on a terminal only (disable=None): the full model takes tens of seconds
    for t in tqdm(todo, desc="verifying q4_K/q6_K tensors", unit="tensor", disable=None, leave=False):
        raw = t.raw()  # [rows, row_bytes]
        if t.qtype == "q6_K":
            for stride in strides:
                blocks = raw.reshape(-1, 210)
                if stride == 224:
                    blocks = pad_q6k(blocks)
                if max_blocks:
                    blocks = blocks[:max_blocks]
                r = verify_q6k_blocks(blocks, stride)
                if stride == strides[0]:
                    err_samples.append(r["_wrong_err"].ravel()[::7])
                rows.append({"tensor": t.name, "shape": tuple(t.shape), **_public(r)})
        else:
            blocks = raw.reshape(-1, 144)
            if max_blocks:
                blocks = blocks[:max_blocks]
            rows.append({"tensor": t.name, "shape": tuple(t.shape), **_public(verify_q4k_blocks(blocks))})
    extras = {"q6k_wrong_model_err": np.concatenate(err_samples) if err_samples else np.zeros(0)}
    return rows, extras


def _public(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def summarize(rows) -> dict:
    """Per-type totals (elements checked, mismatches) -- what ``labkernels layout --json`` prints."""
    out: dict = {}
    for r in rows:
        key = r["type"] if r["type"] == "q4_K" else f"q6_K/{r['stride']}"
        s = out.setdefault(key, {"tensors": 0, "blocks": 0, "elements": 0, "mismatches": 0})
        s["tensors"] += 1
        s["blocks"] += r["blocks"]
        s["elements"] += r["elements"]
        s["mismatches"] += r["mismatches"]
    return out
