"""Round 1 -- the layout verifier: the closed-form q6_K / q4_K element maps of :mod:`labkernels.layout` checked
against gguf-py's dequantization on random valid blocks and on every block of a model (both q6_K strides), and
the seeds' wrong "8 sub-blocks of 32, one scale" q6_K model measured against it."""

from __future__ import annotations

import numpy as np

from .. import layout, model
from ..layout import (_E, Q4K_SUB_OF_ELEM, Q6K_D_BYTE, Q6K_SCALE_OF_ELEM, f16_column, q4k_codes, q4k_scale_min,
                      q6k_codes)
from ..quants import pad_q6k

NOTEBOOK = "01_layout_verifier"
DATA = ()            # a CPU round: nothing recorded
PLAN = {}
measure = None       # CPU round
STEPS = {}


def verify_q6k_blocks(blocks: np.ndarray, stride: int = 210) -> dict:
    """Check the closed-form q6_K map against gguf-py's dequantization for [n, stride] blocks.

    For stride 224 the blocks are first cut back to 210 bytes for gguf-py (which only knows 210) while the
    maps index the padded blocks directly. Returns element/mismatch counts and the error of the seeds'
    wrong "8 sub-blocks of 32, one scale" model (the pitfall in seeds 002 section 3.3 #1).
    """
    import gguf

    if blocks.ndim != 2 or blocks.shape[1] != stride:
        raise ValueError(f"expected [n, {stride}] q6_K blocks, got {blocks.shape}")
    ref = gguf.quants.dequantize(np.ascontiguousarray(blocks[:, :210]), gguf.GGMLQuantizationType.Q6_K)
    ref = ref.reshape(-1, 256)
    codes = q6k_codes(blocks).astype(np.int8) - np.int8(32)
    d = f16_column(blocks[:, Q6K_D_BYTE:Q6K_D_BYTE + 2])
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

    if blocks.ndim != 2 or blocks.shape[1] != 144:
        raise ValueError(f"expected [n, 144] q4_K blocks, got {blocks.shape}")
    ref = gguf.quants.dequantize(np.ascontiguousarray(blocks), gguf.GGMLQuantizationType.Q4_K).reshape(-1, 256)
    q = q4k_codes(blocks).astype(np.float32)
    sc, mn = q4k_scale_min(blocks[:, 4:16])
    d, dmin = f16_column(blocks[:, 0:2]), f16_column(blocks[:, 2:4])
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

    strides = tuple(strides)
    if not strides or any(isinstance(s, bool) or s not in (210, 224) for s in strides):
        raise layout.LayoutError(f"q6_K block strides to check: one or more of 210 and 224, got {list(strides)}")
    rx = None
    if name_filter is not None:
        if not isinstance(name_filter, str) or not name_filter:
            raise model.ModelError(f"tensor filter must be a non-empty regular expression, got {name_filter!r}")
        try:
            rx = re.compile(name_filter)
        except re.error as e:
            raise model.ModelError(f"tensor filter {name_filter!r} is not a regular expression: {e}") from None
    m = model.open_model(path)
    rows, err_samples = [], []
    todo = [t for t in m.tensors() if t.qtype in ("q4_K", "q6_K") and not (rx and not rx.search(t.name))]
    if not todo:
        names = [t.name for t in m.tensors() if t.qtype in ("q4_K", "q6_K")]
        raise model.ModelError(f"{m.path}: no q4_K / q6_K tensor " + (f"matches the filter {name_filter!r} (e.g. "
                               f"{', '.join(names[:3])})" if rx and names else "in the model"))
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
    """Per-type totals (elements checked, mismatches) -- what ``labkernels model layout --json`` prints."""
    out: dict = {}
    for r in rows:
        key = r["type"] if r["type"] == "q4_K" else f"q6_K/{r['stride']}"
        s = out.setdefault(key, {"tensors": 0, "blocks": 0, "elements": 0, "mismatches": 0})
        s["tensors"] += 1
        s["blocks"] += r["blocks"]
        s["elements"] += r["elements"]
        s["mismatches"] += r["mismatches"]
    return out
