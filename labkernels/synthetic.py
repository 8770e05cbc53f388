"""Synthetic GGUF models: llama-7B shapes with llama.cpp's Q4_K_M type recipe, built fast and lazily.

* :func:`llama7b_config` -- llama-7B (LLaMA-1/2 7B) shapes as a :class:`~labkernels.arch.ModelConfig`.
* :func:`tiny_config` -- small llama / qwen2 / gemma3 configs for tests.
* :func:`q4_k_m_recipe` -- tensor name -> GGML type, following llama.cpp's ``llama_tensor_get_type``
  (``src/llama-quant.cpp``) for ``LLAMA_FTYPE_MOSTLY_Q4_K_M``.
* :class:`SyntheticModel` -- an in-memory model with the interface of :class:`labkernels.model.Model`
  (``tensor``, ``tensors``, ``field``, ``architecture``). Quantized tensors are assembled from a pool of
  blocks quantized once per type with the reference quantizers (Gaussian weights, std 0.02): every
  row of every tensor is a random draw of pool blocks (k-quant / q8_0 blocks are self-contained, so
  this is distributed exactly like independently quantized Gaussian rows). Tensors are built on first
  access; no float copies are kept.
* :func:`write_gguf` -- write a model to a GGUF file with gguf-py's ``GGUFWriter`` such that
  :func:`labkernels.model.open_model` + :func:`labkernels.arch.config_from_model` read it back
  identically (tensor bytes and config).
"""

from __future__ import annotations

import math
import re
import time
import zlib
from pathlib import Path

import numpy as np

from . import quantize_ref, quants
from .arch import (GEMMA3_ROPE_BASE_SWA, GEMMA3_SWA_PATTERN, ModelConfig, config_from_model, expected_shapes,
                   gguf_key, global_tensors, layer_tensors, tensor_name)
from .model import ModelError, Tensor, open_model

__all__ = ["llama7b_config", "tiny_config", "q4_k_m_recipe", "use_more_bits", "recipe_counts", "SyntheticModel",
           "SyntheticTensor", "write_gguf", "metadata_from_config", "LLAMA_FTYPE_MOSTLY_Q4_K_M"]

LLAMA_FTYPE_MOSTLY_Q4_K_M = 15  # llama.h enum llama_ftype; general.file_type of a Q4_K_M file

WEIGHT_STD = 0.02
NORM_NOISE = 0.05
POOL_ELEMS = 1 << 20   # floats quantized per pool (4096 q4_K / q6_K blocks, 32768 q8_0 blocks)

#: (elements per block, bytes per block) of the GGML types the synthetic model can produce
_QBLOCK = {"Q4_K": (256, 144), "Q6_K": (256, 210), "Q8_0": (32, 34), "Q5_0": (32, 22)}
_FLOAT = {"F32": np.float32, "F16": np.float16}


def _f32(x: float) -> float:
    """The value a float32 GGUF key holds (what a reader returns)."""
    return float(np.float32(x))


# --------------------------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------------------------
class _MetaOnly:
    """Metadata + tensor shapes, enough for config_from_model (used to derive configs consistently)."""

    def __init__(self, meta: dict, shapes: dict):
        self.meta, self.shapes, self.path = meta, shapes, "<synthetic metadata>"

    def field(self, key, default=None):
        v = self.meta.get(key)
        return default if v is None else v[0]

    def tensor(self, name):
        if name not in self.shapes:
            raise ModelError(f"no tensor {name!r}")
        return _ShapeOnly(self.shapes[name])


class _ShapeOnly:
    def __init__(self, shape):
        self.shape = tuple(shape)


def _build_config(arch: str, *, n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, vocab, rms_eps, rope_base,
                  sliding_window=None, n_ctx=4096, tied=None, attn_bias=None) -> ModelConfig:
    """A config derived exactly the way config_from_model derives it from a GGUF."""
    from gguf.constants import GGUFValueType as VT
    k = lambda key: gguf_key(key, arch)  # noqa: E731
    meta = {gguf_key("General.ARCHITECTURE"): (arch, VT.STRING),
            k("LLM.CONTEXT_LENGTH"): (int(n_ctx), VT.UINT32), k("LLM.BLOCK_COUNT"): (int(n_layer), VT.UINT32),
            k("LLM.EMBEDDING_LENGTH"): (int(n_embd), VT.UINT32), k("LLM.FEED_FORWARD_LENGTH"): (int(n_ff), VT.UINT32),
            k("Attention.HEAD_COUNT"): (int(n_head), VT.UINT32),
            k("Attention.HEAD_COUNT_KV"): (int(n_head_kv), VT.UINT32),
            k("Attention.KEY_LENGTH"): (int(head_dim), VT.UINT32),
            k("Attention.VALUE_LENGTH"): (int(head_dim), VT.UINT32),
            k("Attention.LAYERNORM_RMS_EPS"): (_f32(rms_eps), VT.FLOAT32),
            k("Rope.FREQ_BASE"): (_f32(rope_base), VT.FLOAT32)}
    if sliding_window:
        meta[k("Attention.SLIDING_WINDOW")] = (int(sliding_window), VT.UINT32)
    tied = (arch == "gemma3") if tied is None else tied
    attn_bias = (arch == "qwen2") if attn_bias is None else attn_bias
    probe = ModelConfig(arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                        head_dim=head_dim, head_dim_v=head_dim, n_ff=n_ff, vocab=vocab, rms_eps=rms_eps,
                        rope_base=rope_base, rope_base_local=None, rope_style="", sliding_window=None,
                        layer_is_sliding=[False] * n_layer, embed_scale=1.0, attn_scale=1.0, ffn_act="",
                        qk_norm=arch == "gemma3", post_norms=arch == "gemma3", attn_bias=attn_bias,
                        tied_output=tied, final_logit_softcap=None)
    return config_from_model(_MetaOnly(meta, expected_shapes(probe)))


def llama7b_config() -> ModelConfig:
    """LLaMA 7B: 32 layers, n_embd 4096, 32 heads x 128 (no GQA), n_ff 11008, vocab 32000, rope base
    10000 ('normal' pairing), RMSNorm eps 1e-5 (as float32), separate output head."""
    return _build_config("llama", n_layer=32, n_embd=4096, n_ff=11008, n_head=32, n_head_kv=32, head_dim=128,
                         vocab=32000, rms_eps=1e-5, rope_base=10000.0, n_ctx=4096)


def gemma3_270m_config() -> ModelConfig:
    """Gemma 3 270M's shapes: 18 layers (every 6th global, the rest a 512-token sliding window), n_embd 640,
    4 query heads x 256 over 1 kv head, n_ff 2048, vocab 262144, tied embeddings; what config_from_model reads
    from the real GGUF (a CPU test holds the two equal)."""
    return _build_config("gemma3", n_layer=18, n_embd=640, n_ff=2048, n_head=4, n_head_kv=1, head_dim=256,
                         vocab=262144, rms_eps=1e-6, rope_base=1e6, sliding_window=512, n_ctx=32768)


def tiny_config(arch: str = "llama", n_layer: int = 2, n_embd: int = 256, n_ff: int = 512, n_head: int = 4,
                n_head_kv: int = 2, head_dim: int | None = None, vocab: int = 1000, sliding_window: int | None = 8,
                rope_base: float | None = None, rms_eps: float | None = None, tied: bool | None = None) -> ModelConfig:
    """A small config of ``arch`` ('llama' | 'qwen2' | 'gemma3') for tests. ``sliding_window`` is used by
    gemma3 only (its layers follow llama.cpp's pattern: every 6th layer global)."""
    if arch not in ("llama", "qwen2", "gemma3"):
        raise ValueError(f"unsupported arch {arch!r}")
    head_dim = head_dim or n_embd // n_head
    if rope_base is None:
        rope_base = 1e6 if arch in ("gemma3", "qwen2") else 10000.0
    if rms_eps is None:
        rms_eps = 1e-6 if arch in ("gemma3", "qwen2") else 1e-5
    return _build_config(arch, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
                         head_dim=head_dim, vocab=vocab, rms_eps=rms_eps, rope_base=rope_base,
                         sliding_window=sliding_window if arch == "gemma3" else None, n_ctx=2048, tied=tied)


# --------------------------------------------------------------------------------------------------------
# llama.cpp's Q4_K_M recipe
# --------------------------------------------------------------------------------------------------------
def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp ``use_more_bits``: the first and last eighth of the layers, and every third in between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _fallback(gtype: str, ncols: int) -> str:
    """llama-quant.cpp tensor_type_fallback: rows that are not a whole number of blocks."""
    blck = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32}.get(gtype, 1)
    if ncols % blck == 0:
        return gtype
    new = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}.get(gtype)
    if new is None or ncols % 32:
        return "F16"
    return new


def q4_k_m_recipe(cfg: ModelConfig) -> dict[str, str]:
    """GGUF tensor name -> GGML type name of a Q4_K_M quantization, per llama.cpp ``src/llama-quant.cpp``:

    * default type Q4_K (``llama_model_quantize_impl``: ``LLAMA_FTYPE_MOSTLY_Q4_K_M -> GGML_TYPE_Q4_K``);
      only tensors with >= 2 dims are quantized: norms, biases, rope_freqs stay F32;
    * ``output.weight`` -- or ``token_embd.weight`` when there is no output tensor (tied) -- Q6_K, or Q8_0
      when its row length is not a multiple of 256 (``llama_tensor_get_type``: ``nx % qk_k != 0``);
    * ``attn_v.weight`` of layer i: Q6_K if ``use_more_bits(i, n_layer)`` (+ the 70B rule Q4_K -> Q5_K);
    * ``ffn_down.weight`` of layer i: Q6_K if ``use_more_bits(i, n_layer)``;
    * everything else (token_embd when untied, attn_q/k/output, ffn_gate/up): Q4_K;
    * then ``tensor_type_fallback`` for rows not a multiple of the block size (Q4_K -> Q5_0, Q6_K -> Q8_0).

    ``use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2`` (integer division).
    """
    shapes = expected_shapes(cfg)
    # llama.cpp model type LLM_TYPE_70B for llama: 80 layers with GQA (n_head != n_head_kv)
    is_70b = cfg.arch == "llama" and cfg.n_layer == 80 and cfg.n_head != cfg.n_head_kv
    out = {}
    for name, shape in shapes.items():
        if len(shape) < 2:
            out[name] = "F32"
            continue
        t = "Q4_K"
        if name == tensor_name("output") or (cfg.tied_output and name == tensor_name("token_embd")):
            t = "Q8_0" if shape[-1] % 256 else "Q6_K"
        elif (i := _layer_of(name, "attn_v")) is not None:
            if use_more_bits(i, cfg.n_layer):
                t = "Q6_K"
            if is_70b and t in ("Q3_K", "Q4_K"):
                t = "Q5_K"
        elif (i := _layer_of(name, "ffn_down")) is not None:
            if use_more_bits(i, cfg.n_layer):
                t = "Q6_K"
        out[name] = _fallback(t, shape[-1])
    return out


def _layer_of(name: str, logical: str) -> int | None:
    """The layer of a GGUF tensor name if it is that logical layer tensor's weight (``blk.7.attn_v.weight``, attn_v ->
    7), else None; the pattern is gguf-py's TENSOR_NAMES entry."""
    rx = re.escape(tensor_name(logical, 999999)).replace("999999", r"(\d+)")
    m = re.fullmatch(rx, name)
    return int(m[1]) if m else None


def recipe_counts(recipe: dict[str, str]) -> dict:
    """Type histogram and the per-kind Q6_K counts of a recipe."""
    hist: dict = {}
    for t in recipe.values():
        hist[t] = hist.get(t, 0) + 1
    kinds = {}
    for kind in ("attn_v", "ffn_down"):
        layer = {n: i for n in recipe if (i := _layer_of(n, kind)) is not None}
        kinds[kind] = {"Q6_K": sum(recipe[n] == "Q6_K" for n in layer), "total": len(layer),
                       "layers_q6_K": sorted(i for n, i in layer.items() if recipe[n] == "Q6_K")}
    return {"types": hist, **kinds}


# --------------------------------------------------------------------------------------------------------
# GGUF metadata of a config
# --------------------------------------------------------------------------------------------------------
def _vocab_tokens(cfg: ModelConfig):
    """A SentencePiece-style vocabulary: <unk> <s> </s>, 256 byte tokens, then '▁tNNN' words."""
    n = cfg.vocab
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    toks = toks[:n]
    types = types[:n]
    toks += [f"\u2581t{i}" for i in range(len(toks), n)]
    types += [1] * (n - len(types))
    return toks, types


def metadata_from_config(cfg: ModelConfig, file_type: int | None = None) -> dict:
    """GGUF key -> (value as a reader returns it, GGUFValueType, array subtype or None)."""
    from gguf.constants import GGUFValueType as VT
    a = cfg.arch
    k = lambda key: gguf_key(key, a)  # noqa: E731   gguf-py's Keys, e.g. "LLM.BLOCK_COUNT"
    m = {gguf_key("General.ARCHITECTURE"): (a, VT.STRING, None),
         gguf_key("General.NAME"): (f"synthetic {a}", VT.STRING, None)}
    if file_type is not None:
        m[gguf_key("General.FILE_TYPE")] = (int(file_type), VT.UINT32, None)
    u32 = lambda key, v: m.__setitem__(k(key), (int(v), VT.UINT32, None))  # noqa: E731
    f32 = lambda key, v: m.__setitem__(k(key), (_f32(v), VT.FLOAT32, None))  # noqa: E731
    u32("LLM.CONTEXT_LENGTH", cfg.n_ctx_train or 4096)
    u32("LLM.BLOCK_COUNT", cfg.n_layer)
    u32("LLM.EMBEDDING_LENGTH", cfg.n_embd)
    u32("LLM.FEED_FORWARD_LENGTH", cfg.n_ff)
    u32("Attention.HEAD_COUNT", cfg.n_head)
    u32("Attention.HEAD_COUNT_KV", cfg.n_head_kv)
    u32("Attention.KEY_LENGTH", cfg.head_dim)
    u32("Attention.VALUE_LENGTH", cfg.head_dim_v)
    f32("Attention.LAYERNORM_RMS_EPS", cfg.rms_eps)
    f32("Rope.FREQ_BASE", cfg.rope_base)
    u32("Rope.DIMENSION_COUNT", cfg.n_rot)
    if cfg.rope_freq_scale != 1.0:
        m[k("Rope.SCALING_TYPE")] = ("linear", VT.STRING, None)
        f32("Rope.SCALING_FACTOR", 1.0 / cfg.rope_freq_scale)
    if cfg.sliding_window:
        u32("Attention.SLIDING_WINDOW", cfg.sliding_window)
        default = [il % GEMMA3_SWA_PATTERN < GEMMA3_SWA_PATTERN - 1 for il in range(cfg.n_layer)]
        if list(cfg.layer_is_sliding) != default:
            m[k("Attention.SLIDING_WINDOW_PATTERN")] = ([bool(x) for x in cfg.layer_is_sliding], VT.ARRAY, VT.BOOL)
        if cfg.rope_base_local is not None and cfg.rope_base_local != GEMMA3_ROPE_BASE_SWA:
            f32("Rope.FREQ_BASE_SWA", cfg.rope_base_local)
    if cfg.final_logit_softcap:
        f32("LLM.FINAL_LOGIT_SOFTCAPPING", cfg.final_logit_softcap)
    toks, types = _vocab_tokens(cfg)
    m[gguf_key("Tokenizer.MODEL")] = ("llama", VT.STRING, None)
    m[gguf_key("Tokenizer.LIST")] = (toks, VT.ARRAY, VT.STRING)
    m[gguf_key("Tokenizer.SCORES")] = ([0.0] * cfg.vocab, VT.ARRAY, VT.FLOAT32)
    m[gguf_key("Tokenizer.TOKEN_TYPE")] = (types, VT.ARRAY, VT.INT32)
    m[gguf_key("Tokenizer.BOS_ID")] = (min(1, cfg.vocab - 1), VT.UINT32, None)
    m[gguf_key("Tokenizer.EOS_ID")] = (min(2, cfg.vocab - 1), VT.UINT32, None)
    return m


# --------------------------------------------------------------------------------------------------------
# the synthetic model
# --------------------------------------------------------------------------------------------------------
class SyntheticTensor(Tensor):
    """A :class:`labkernels.model.Tensor` whose bytes are generated by its :class:`SyntheticModel`."""

    def __init__(self, name: str, ggml_type: str, shape: tuple, owner: "SyntheticModel"):
        super().__init__(name, ggml_type, tuple(int(s) for s in shape), None)
        self._owner = owner

    @property
    def row_bytes(self) -> int:
        if self.ggml_type in _QBLOCK:
            qk, nb = _QBLOCK[self.ggml_type]
            return self.cols // qk * nb
        return self.cols * np.dtype(_FLOAT[self.ggml_type]).itemsize

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def raw(self) -> np.ndarray:
        """Raw bytes [rows, row_bytes] uint8 (read-only), the same layout labkernels.model.Tensor.raw() gives."""
        return self._owner._raw(self)

    def array(self) -> np.ndarray:
        r = self.raw()
        if self.ggml_type in _FLOAT:
            return r.view(_FLOAT[self.ggml_type]).astype(np.float32).reshape(self.shape)
        return quants.dequantize(r, self.qtype).reshape(self.shape)


def _quantize_gguf_py(gtype: str):
    """gguf-py's quantizer of a type the lab has no reference quantizer for (Q5_0: Gemma 3 270M's q/k/v/gate/up)."""
    from gguf import GGMLQuantizationType, quants

    return lambda x: quants.quantize(np.asarray(x, np.float32), GGMLQuantizationType[gtype])


class SyntheticModel:
    """In-memory model with :class:`labkernels.model.Model`'s interface, built from a config and a
    recipe (tensor name -> GGML type; default :func:`q4_k_m_recipe`).

    Deterministic in ``seed``: a tensor's bytes depend only on (seed, type, name), not on access order.
    With ``cache=True`` (default) a tensor's bytes are kept after their first access (like the pages of a
    memory-mapped file); ``cache=False`` regenerates them on every ``raw()`` (bounded memory).
    """

    def __init__(self, cfg: ModelConfig, recipe: dict[str, str] | None = None, seed: int = 0, cache: bool = True,
                 check: bool = True):
        self.cfg = cfg
        self.seed = int(seed)
        self.cache = cache
        self.path = None
        shapes = expected_shapes(cfg)
        self.recipe = dict(recipe) if recipe is not None else q4_k_m_recipe(cfg)
        missing = set(shapes) - set(self.recipe)
        if missing:
            raise ValueError(f"recipe has no type for {sorted(missing)[:5]}...")
        extra = set(self.recipe) - set(shapes)
        if extra:
            raise ValueError(f"recipe names tensors the config does not have: {sorted(extra)[:5]}")
        order = [global_tensors(cfg)["token_embd"]]
        for i in range(cfg.n_layer):
            order += sorted(layer_tensors(cfg, i).values())
        order += [n for n in shapes if n not in order]
        self._tensors: dict[str, SyntheticTensor] = {}
        for name in order:
            t = self.recipe[name]
            if t not in _QBLOCK and t not in _FLOAT:
                raise ValueError(f"tensor {name}: type {t} is not supported by SyntheticModel "
                                 f"(supported: {', '.join(list(_QBLOCK) + list(_FLOAT))})")
            shape = shapes[name]
            if t in _QBLOCK and shape[-1] % _QBLOCK[t][0]:
                raise ValueError(f"tensor {name}: row length {shape[-1]} is not a multiple of {_QBLOCK[t][0]} ({t})")
            self._tensors[name] = SyntheticTensor(name, t, shape, self)
        ftype = LLAMA_FTYPE_MOSTLY_Q4_K_M if self.recipe == q4_k_m_recipe(cfg) else None
        self.metadata = metadata_from_config(cfg, ftype)
        self._raw_cache: dict[str, np.ndarray] = {}
        self._pools: dict[str, np.ndarray] = {}
        if check:
            got = config_from_model(self)
            if got != cfg:
                diff = {f: (getattr(cfg, f), getattr(got, f)) for f in cfg.__dataclass_fields__
                        if getattr(cfg, f) != getattr(got, f)}
                raise ValueError(f"config cannot be expressed in GGUF metadata; it reads back differently: {diff}")

    # ---- Model interface -------------------------------------------------------------------------------
    def tensors(self) -> list[SyntheticTensor]:
        return list(self._tensors.values())

    def tensor(self, name: str) -> SyntheticTensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelError(f"synthetic {self.cfg.arch} model: no tensor named {name!r}") from None

    def field(self, key: str, default=None):
        v = self.metadata.get(key)
        return default if v is None else v[0]

    def metadata_items(self):
        """(key, value, GGUFValueType, array subtype) for every metadata key."""
        for key, (val, vt, sub) in self.metadata.items():
            yield key, val, vt, sub

    @property
    def architecture(self) -> str:
        return self.cfg.arch

    def type_counts(self) -> dict:
        out: dict = {}
        for t in self._tensors.values():
            out[t.ggml_type] = out.get(t.ggml_type, 0) + 1
        return out

    def nbytes(self) -> int:
        """Total tensor bytes (what a GGUF of this model holds, without metadata and padding)."""
        return sum(t.nbytes for t in self._tensors.values())

    def __repr__(self):
        return (f"SyntheticModel({self.cfg.arch}, {self.cfg.n_layer} layers, n_embd {self.cfg.n_embd}, "
                f"{self.nbytes() / 2**30:.2f} GiB, seed {self.seed})")

    # ---- generation ------------------------------------------------------------------------------------
    def _rng(self, *salt) -> np.random.Generator:
        return np.random.default_rng([self.seed] + [int(s) for s in salt])

    def _pool(self, gtype: str) -> np.ndarray:
        """[n_blocks, block_bytes] blocks of Gaussian (std 0.02) data quantized with the reference quantizer."""
        p = self._pools.get(gtype)
        if p is None:
            qk, nb = _QBLOCK[gtype]
            x = (self._rng(0x9001, zlib.crc32(gtype.encode())).standard_normal((POOL_ELEMS // 4096, 4096))
                 * WEIGHT_STD).astype(np.float32)
            fn = {"Q4_K": quantize_ref.quantize_q4_K, "Q6_K": quantize_ref.quantize_q6_K,
                  "Q8_0": quantize_ref.quantize_q8_0, "Q5_0": _quantize_gguf_py("Q5_0")}[gtype]
            p = np.ascontiguousarray(fn(x).reshape(-1, nb))
            p.setflags(write=False)
            self._pools[gtype] = p
        return p

    def _generate(self, t: SyntheticTensor) -> np.ndarray:
        rng = self._rng(0x7E50, zlib.crc32(t.name.encode()))
        if t.ggml_type in _QBLOCK:
            qk, nb = _QBLOCK[t.ggml_type]
            pool = self._pool(t.ggml_type)
            nblk = t.cols // qk
            idx = rng.integers(0, pool.shape[0], size=(t.rows, nblk), dtype=np.int64)
            raw = pool[idx].reshape(t.rows, nblk * nb)
        else:
            n = t.rows * t.cols
            short = t.name.split(".")[-2] if t.name.count(".") else t.name
            if short.endswith("norm"):
                vals = 1.0 + NORM_NOISE * rng.standard_normal(n)
            elif t.name == tensor_name("rope_freqs"):
                vals = np.ones(n)
            else:  # biases, unquantized matrices
                vals = WEIGHT_STD * rng.standard_normal(n)
            raw = vals.astype(_FLOAT[t.ggml_type]).view(np.uint8).reshape(t.rows, -1)
        raw.setflags(write=False)
        return raw

    def _raw(self, t: SyntheticTensor) -> np.ndarray:
        r = self._raw_cache.get(t.name)
        if r is None:
            r = self._generate(t)
            if self.cache:
                self._raw_cache[t.name] = r
        return r

    def build_all(self, keep: bool | None = None) -> dict:
        """Generate every tensor (e.g. to time the build); returns {'seconds', 'bytes', 'tensors'}."""
        t0 = time.perf_counter()
        total = 0
        for t in self._tensors.values():
            r = self._raw(t) if keep is not False else self._generate(t)
            total += r.nbytes
            del r
        return {"seconds": time.perf_counter() - t0, "bytes": total, "tensors": len(self._tensors)}


# --------------------------------------------------------------------------------------------------------
# writing GGUF
# --------------------------------------------------------------------------------------------------------
def _metadata_items(model):
    if hasattr(model, "metadata_items"):
        yield from model.metadata_items()
        return
    reader = getattr(model, "reader", None)
    if reader is None:
        raise TypeError("write_gguf needs a SyntheticModel or a labkernels.model.Model")
    from gguf.constants import GGUFValueType as VT
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == VT.ARRAY else None
        yield key, f.contents(), vt, sub


def write_gguf(model, path) -> Path:
    """Write ``model`` (a :class:`SyntheticModel`, or a :class:`labkernels.model.Model`) to a GGUF file.

    Tensors are streamed one at a time (a SyntheticModel with ``cache=False`` writes in bounded memory).
    """
    import gguf
    from gguf.constants import GGMLQuantizationType as QT
    from gguf.constants import GGUFValueType as VT

    path = Path(path)
    arch = model.field(gguf_key("General.ARCHITECTURE"))
    w = gguf.GGUFWriter(path, arch)
    for key, val, vt, sub in _metadata_items(model):
        if key == gguf_key("General.ARCHITECTURE"):
            continue
        if vt == VT.ARRAY:
            w.add_key_value(key, list(val), VT.ARRAY, sub_type=sub)
        else:
            w.add_key_value(key, val, vt)
    tensors = model.tensors()
    for t in tensors:
        gt = t.ggml_type
        rows, cols = t.rows, t.cols
        if gt in ("F32", "F16"):
            dt = np.float32 if gt == "F32" else np.float16
            w.add_tensor_info(t.name, tuple(t.shape), np.dtype(dt), rows * cols * np.dtype(dt).itemsize)
        else:
            rb = t.raw().shape[-1] if not isinstance(t, SyntheticTensor) else t.row_bytes
            w.add_tensor_info(t.name, (rows, rb) if len(t.shape) == 2 else tuple(t.shape[:-1]) + (rb,),
                              np.dtype(np.uint8), rows * rb, raw_dtype=QT[gt])
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in tensors:
        gt = t.ggml_type
        r = np.ascontiguousarray(t.raw())
        if gt in ("F32", "F16"):
            data = r.view(np.float32 if gt == "F32" else np.float16).reshape(t.shape)
        else:
            data = r.reshape(tuple(t.shape[:-1]) + (r.shape[-1],))
        w.write_tensor_data(data)
        del r, data
    w.close()
    return path


def build_report(cfg: ModelConfig | None = None, seed: int = 0) -> dict:
    """Time the full build of a synthetic model (default llama-7B Q4_K_M) without keeping its bytes."""
    cfg = cfg or llama7b_config()
    t0 = time.perf_counter()
    m = SyntheticModel(cfg, seed=seed, cache=False)
    setup = time.perf_counter() - t0
    for gt in sorted(set(m.recipe.values()) & set(_QBLOCK)):
        m._pool(gt)
    pools = time.perf_counter() - t0 - setup
    rep = m.build_all(keep=False)
    rec = recipe_counts(m.recipe)
    return {"config": cfg.describe(), "setup_s": setup, "pools_s": pools, "build_s": rep["seconds"],
            "total_s": time.perf_counter() - t0, "bytes": rep["bytes"], "GiB": rep["bytes"] / 2**30,
            "tensors": rep["tensors"], "recipe": rec, "params": sum(math.prod(t.shape) for t in m.tensors())}


#: the synthetic model specs load_model takes -> their config functions in labkernels.synthetic
SYNTHETIC = {"synthetic-7b": "llama7b_config", "llama7b": "llama7b_config", "synthetic-gemma3": "gemma3_270m_config"}


def load_model(spec: str):
    """'synthetic-7b' (llama-7B shapes, Q4_K_M recipe, random weights), 'synthetic-gemma3' (Gemma 3 270M's shapes
    and recipe, random weights: a stand-in where the real file is not at hand) or a GGUF path."""
    if spec in SYNTHETIC:
        cfg = globals()[SYNTHETIC[spec]]()
        return SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=1234)
    return open_model(spec)
