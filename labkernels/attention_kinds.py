"""What one layer's attention computes, and which path can take it -- no GPU needed (split from ``attention.py``,
issue 42): :class:`LayerKind` (heads, head dims, the causal window, the softmax scale) of a model's layers, the FLOPs
and the float64 reference (the tests' and the probes' independent answer), each fused path's support checks
(:func:`cudnn_problems`, :func:`lab_problems`, :func:`check_kind`), the benchmark's layer kinds (:func:`bench_layouts`),
bf16 bit patterns on the host, and the errors. The paths themselves and their choice are :mod:`labkernels.attention`.

FLOPs (:func:`attention_flops`): 2·(d + d_v) per visible (query, key) pair per head, the visible pairs counted as
the area of the causal band: n²/2 for causal attention (the usual convention: causal counted as half), n²/2 -
(n - w)²/2 with a window w < n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .synthetic import llama7b_config


#: head dims cuDNN's fp16/bf16 SDPA takes on sm_80..sm_90 (multiple of 8, at most 256; d_qk = 192 with d_v = 128)
CUDNN_MAX_HEAD_DIM = 256


class AttentionError(ValueError):
    """A layer's attention (shape or mask) that the chosen path cannot take."""


class AttentionUnavailable(RuntimeError):
    """The requested attention backend cannot run on this machine (package missing, no GPU)."""


# ------------------------------------------------------------------------------------------------ layer kinds
@dataclass(frozen=True)
class LayerKind:
    """What one layer's attention computes: heads, head dims, the causal window and the softmax scale."""
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_v: int
    window: int = 0          # 0: causal only; w: key j visible from query i iff 0 <= i - j < w
    scale: float = 1.0       # softmax(scale * q.k)

    @property
    def mask(self) -> str:
        return f"causal + sliding window {self.window}" if self.window else "causal"

    def describe(self) -> str:
        return (f"{self.mask}, {self.n_head} query heads / {self.n_head_kv} kv heads x {self.head_dim}"
                + (f" (v {self.head_dim_v})" if self.head_dim_v != self.head_dim else "") + f", scale {self.scale:g}")

    def at(self, n: int) -> "LayerKind":
        """The kind as it acts on n tokens: a window >= n masks nothing beyond causality."""
        if self.window and self.window >= n:
            return LayerKind(self.n_head, self.n_head_kv, self.head_dim, self.head_dim_v, 0, self.scale)
        return self


def layer_kind(cfg, il: int, scale: float = 1.0) -> LayerKind:
    """Layer ``il``'s kind from a ModelConfig (``scale`` 1.0: the prefill pre-scales q by ``cfg.attn_scale``)."""
    window = int(cfg.sliding_window) if cfg.is_sliding(il) else 0
    return LayerKind(cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v, window, float(scale))


def model_kinds(cfg, scale: float = 1.0) -> dict:
    """{kind: [layers]} over a model's layers."""
    out: dict = {}
    for il in range(cfg.n_layer):
        out.setdefault(layer_kind(cfg, il, scale), []).append(il)
    return out


def visible_pairs(n: int, window: int = 0) -> float:
    """(query, key) pairs a causal (windowed) layer computes, as the band's area: n²/2, or n²/2 - (n - w)²/2."""
    if n < 0 or window < 0:
        raise ValueError(f"tokens and window must be non-negative, got n={n}, window={window}")
    full = n * n / 2
    if window and window < n:
        return full - (n - window) ** 2 / 2
    return full


def attention_flops(n: int, kind: LayerKind) -> float:
    """Useful FLOPs of one layer's attention on n tokens: QK^T and PV over the visible pairs."""
    return 2.0 * kind.n_head * (kind.head_dim + kind.head_dim_v) * visible_pairs(n, kind.window)


def dense_flops(n: int, kind: LayerKind) -> float:
    """FLOPs of the full n x n products (what the baseline computes before masking)."""
    return 2.0 * kind.n_head * (kind.head_dim + kind.head_dim_v) * n * n


def sdpa_ref(q, k, v, n: int, kind: LayerKind) -> np.ndarray:
    """float64 numpy attention (the tests' independent reference): q [n, H*d], k/v [n, Hkv*d] host arrays ->
    [n, H*dv]; query head h reads kv head h // (H/Hkv); key j visible from query i iff 0 <= i - j (< window)."""
    H, Hk, d, dv = kind.n_head, kind.n_head_kv, kind.head_dim, kind.head_dim_v
    qh = np.asarray(q, np.float64).reshape(n, H, d)
    kh = np.asarray(k, np.float64).reshape(n, Hk, d)
    vh = np.asarray(v, np.float64).reshape(n, Hk, dv)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    vis = (j <= i) & ((kind.window == 0) | (i - j < kind.window))
    out = np.empty((n, H, dv))
    for h in range(H):
        s = np.where(vis, kind.scale * qh[:, h] @ kh[:, h // (H // Hk)].T, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        out[:, h] = (p / p.sum(1, keepdims=True)) @ vh[:, h // (H // Hk)]
    return out.reshape(n, H * dv)


# ------------------------------------------------------------------------------------------------ support checks
def cudnn_problems(kind: LayerKind) -> list[str]:
    """Why cuDNN's fp16/bf16 SDPA cannot take a layer kind (empty: it can), from its documented support surface."""
    bad = []
    d, dv = kind.head_dim, kind.head_dim_v
    if kind.n_head % kind.n_head_kv:
        bad.append(f"{kind.n_head} query heads are not a multiple of {kind.n_head_kv} kv heads")
    if d % 8 or dv % 8:
        bad.append(f"head dims {d}/{dv} are not multiples of 8")
    if max(d, dv) > CUDNN_MAX_HEAD_DIM:
        bad.append(f"head dim {max(d, dv)} exceeds {CUDNN_MAX_HEAD_DIM}")
    if d != dv and (d, dv) != (192, 128):
        bad.append(f"q/k head dim {d} differs from v head dim {dv} (cuDNN takes equal dims, or 192/128)")
    if not (np.isfinite(kind.scale) and kind.scale > 0):
        bad.append(f"softmax scale {kind.scale!r} is not finite and positive")
    return bad


#: head dims the lab's fused attention (kernels/flash_attn.cu) is instantiated for
LAB_HEAD_DIMS = (64, 128, 256)


def lab_problems(kind: LayerKind) -> list[str]:
    """Why the lab's fused attention kernel cannot take a layer kind (empty: it can)."""
    bad = []
    if kind.n_head % kind.n_head_kv:
        bad.append(f"{kind.n_head} query heads are not a multiple of {kind.n_head_kv} kv heads")
    if kind.head_dim != kind.head_dim_v:
        bad.append(f"q/k head dim {kind.head_dim} differs from v head dim {kind.head_dim_v}")
    if kind.head_dim not in LAB_HEAD_DIMS:
        bad.append(f"head dim {kind.head_dim} is not one the kernel is built for ({', '.join(map(str, LAB_HEAD_DIMS))})")
    if not (np.isfinite(kind.scale) and kind.scale > 0):
        bad.append(f"softmax scale {kind.scale!r} is not finite and positive")
    if kind.window < 0:
        bad.append(f"window {kind.window} is negative")
    return bad


def lab_heads_per_cta(kind: LayerKind) -> int:
    """Query heads one CTA of the lab's kernel covers (they share its kv head): 4, 2 or 1, the largest dividing the
    group size; the CTA's other warps take more query rows (16 per warp, 4 warps)."""
    g = kind.n_head // kind.n_head_kv
    return 4 if g % 4 == 0 else (2 if g % 2 == 0 else 1)


def check_kind(kind: LayerKind, backend: str, layers) -> None:
    """Raise AttentionError naming the layers and the mask when ``backend`` cannot take ``kind``."""
    bad = cudnn_problems(kind) if backend == "cudnn" else (lab_problems(kind) if backend == "lab" else [])
    if backend == "torch" and kind.n_head % kind.n_head_kv:
        bad.append(f"{kind.n_head} query heads are not a multiple of {kind.n_head_kv} kv heads")
    if bad:
        raise AttentionError(f"attention of layer(s) {describe_layers(layers)} ({kind.describe()}): the {backend} path cannot "
                             f"take it: {'; '.join(bad)}")


def describe_layers(layers) -> str:
    layers = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    return ", ".join(str(i) for i in layers) if len(layers) <= 8 else f"{layers[0]}..{layers[-1]} ({len(layers)})"


# ------------------------------------------------------------------------------------------------ bf16 on the host
def bf16_bits(x: np.ndarray) -> np.ndarray:
    """numpy float32 -> bfloat16 bit patterns (uint16), the same rounding as the device conversion."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def as_f64(o: np.ndarray, dtype: str) -> np.ndarray:
    """A host copy of an SDPA output in I/O type ``dtype`` (bf16 held as uint16) as float64."""
    return (bf16_to_f32(o) if dtype == "bf16" else o).astype(np.float64)


# ------------------------------------------------------------------------------------------------ benchmark
def bench_layouts() -> dict:
    """{layout: {kind label: LayerKind}} of the benchmark, with each architecture's real softmax scale: the
    synthetic 7B (llama-7B: 32 heads x 128, no GQA, all layers causal) and Gemma 3 270M (4 query heads / 1 kv head
    x 256, window 512 on its sliding layers, global causal layers; its config read from the GGUF is checked
    against these numbers in tests/test_attention.py)."""
    c7 = llama7b_config()
    s7 = 1.0 / float(np.sqrt(c7.head_dim))
    return {"synthetic-7b": {"causal": LayerKind(c7.n_head, c7.n_head_kv, c7.head_dim, c7.head_dim_v, 0, s7)},
            "gemma-3-270m": {"sliding": LayerKind(4, 1, 256, 256, 512, 1 / 16.0),
                             "global": LayerKind(4, 1, 256, 256, 0, 1 / 16.0)}}
