"""Architecture description of a GGUF decoder model, read from its metadata only.

:class:`ModelConfig` is the spec the GPU forward and the CPU reference (:mod:`labkernels.prefill_ref`)
both follow. Every field comes from a GGUF key or a tensor shape; where llama.cpp hard-codes a value
instead of reading a key, the code says so and names the llama.cpp source that does it. The sources
(ggml-org/llama.cpp, read at the time of writing):

* ``src/llama-model.cpp`` ``load_hparams`` (case ``LLM_ARCH_GEMMA3``) -- sliding window, SWA pattern,
  SWA rope base, attention scale; ``llama_model_rope_type`` -- NORM vs NEOX rope per architecture;
  ``get_rope_freq_base`` / ``get_rope_freq_scale`` -- per-layer rope base / scale for SWA layers.
* ``src/llama-hparams.cpp`` ``set_swa_pattern`` (which layers slide) and ``is_masked_swa``
  (the window test ``p1 - p0 >= n_swa`` masks; ``p0`` = key position, ``p1`` = query position).
* ``src/models/gemma3.cpp`` ``llm_build_gemma3`` -- embedding scale, the four RMSNorms, q/k norm,
  rope, ``Qcur *= f_attention_scale`` then ``build_attn(..., kq_scale = 1.0)``, GELU gated FFN,
  residual order, final norm, tied head; softcapping only in the non-SWA variant.
* ``src/models/llama.cpp`` / ``src/models/qwen2.cpp`` -- pre-norm blocks, SiLU gated FFN,
  ``kq_scale = 1/sqrt(head_dim)``, qwen2 q/k/v biases, optional output head (tied otherwise).
* ``convert_hf_to_gguf.py`` ``Gemma3Model.modify_tensors`` -- Gemma's ``(1 + w)`` RMSNorm weights are
  stored with the +1 already added, so every norm here is the plain ``x / rms(x) * w``.

Checked against llama.cpp itself (llama-cpp-python 0.3.36, CPU): the real Gemma 3 270M logits and greedy
text, and synthetic llama / qwen2 / gemma3 GGUFs (rope pairing, window boundary) -- tests/test_prefill_ref.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .model import ModelError

SUPPORTED_ARCHS = ("gemma3", "llama", "qwen2")


class TokenError(ValueError):
    """Token ids a model cannot take: not integers, empty, not 1-D, or outside [0, vocab)."""


def check_token_ids(tokens, vocab: int, what: str = "token ids") -> np.ndarray:
    """``tokens`` as a 1-D int64 array after checking that they are integers (no float or bool ids: a float would be
    truncated silently), at least one, and each in [0, vocab); TokenError naming the first bad one otherwise."""
    if isinstance(tokens, (str, bytes)):
        raise TokenError(f"{what} must be a sequence of integers, got {type(tokens).__name__} {tokens!r}")
    try:
        a = np.asarray(tokens)
    except (ValueError, TypeError) as e:
        raise TokenError(f"{what} must be a sequence of integers ({e})") from None
    if a.ndim > 1:
        raise TokenError(f"{what} must be 1-D, got shape {a.shape}")
    a = a.reshape(-1)
    if a.size == 0:
        raise TokenError(f"{what}: empty (a prompt needs at least one token)")
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or vocab < 1:
        raise TokenError(f"vocabulary size must be a positive integer, got {vocab!r}")
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        bad = next((t for t in a.tolist() if isinstance(t, bool) or not isinstance(t, int)), a.tolist()[0])
        raise TokenError(f"{what} must be integers, got {type(bad).__name__} {bad!r} (dtype {a.dtype})")
    out = a.astype(np.int64)
    badi = np.flatnonzero((out < 0) | (out >= vocab))
    if len(badi):
        i = int(badi[0])
        raise TokenError(f"{what} must be non-negative and below the vocabulary size {vocab}: id {int(out[i])} at "
                         f"position {i} is not ({len(badi)} of {out.size} ids are outside [0, {vocab}))")
    return out

# llama.cpp llama_model_rope_type(): LLM_ARCH_LLAMA -> LLAMA_ROPE_TYPE_NORM ("pairs of consecutive head
# values"); LLM_ARCH_QWEN2 and LLM_ARCH_GEMMA3 -> LLAMA_ROPE_TYPE_NEOX ("pairs offset by n_rot/2").
ROPE_STYLE = {"llama": "normal", "qwen2": "neox", "gemma3": "neox"}

# src/models/gemma3.cpp: build_ffn(..., LLM_FFN_GELU, LLM_FFN_PAR) -> gelu(gate(x)) * up(x), ggml_gelu
# being the tanh approximation; llama.cpp / qwen2.cpp: LLM_FFN_SILU, LLM_FFN_PAR.
FFN_ACT = {"llama": "silu", "qwen2": "silu", "gemma3": "gelu_tanh"}

# llama-model.cpp load_hparams, LLM_ARCH_GEMMA3: hparams.set_swa_pattern(6) (newer llama.cpp: the
# default of an optional "{arch}.attention.sliding_window_pattern" key) and
# hparams.rope_freq_base_train_swa = 10000.0f, rope_freq_scale_train_swa = 1.0f (newer: overridable by
# the optional "{arch}.rope.freq_base_swa" key).
GEMMA3_SWA_PATTERN = 6
GEMMA3_ROPE_BASE_SWA = 10000.0

# llama-model.cpp load_hparams (generic part): rope_freq_base_train = 10000.0f when the key is absent.
DEFAULT_ROPE_BASE = 10000.0


@dataclass
class ModelConfig:
    """Everything a prefill needs to know about a model, besides its weights.

    Conventions: weights are [out_features, in_features] (numpy order); ``head_dim`` is the q/k head
    size, ``head_dim_v`` the v head size; query head ``h`` reads kv head ``h // (n_head // n_head_kv)``
    (ggml_mul_mat broadcasting). ``rms_eps`` is the float32 value stored in the GGUF.
    """
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_v: int
    n_ff: int
    vocab: int
    rms_eps: float
    rope_base: float                     # global (non-sliding) layers
    rope_base_local: float | None        # sliding layers (gemma3); None when no layer slides
    rope_style: str                      # 'neox' (pairs i, i + n_rot/2) | 'normal' (pairs 2i, 2i+1)
    sliding_window: int | None           # key j is visible from query i on a sliding layer iff i - j < window
    layer_is_sliding: list[bool]
    embed_scale: float                   # token embeddings are multiplied by this (gemma3: sqrt(n_embd))
    attn_scale: float                    # q is multiplied by this before q.k (no further 1/sqrt(d))
    ffn_act: str                         # 'gelu_tanh' | 'silu'; FFN = down(act(gate(x)) * up(x))
    qk_norm: bool                        # RMSNorm over head_dim on q and k (with weight), before rope
    post_norms: bool                     # gemma3: RMSNorm on the attention / FFN outputs before the residual add
    attn_bias: bool                      # q, k, v biases (qwen2)
    tied_output: bool                    # no output.weight: the head is token_embd.weight
    final_logit_softcap: float | None    # logits = c * tanh(logits / c) when set
    n_rot: int = 0                       # rotated dims per head (rope.dimension_count, default head_dim)
    rope_freq_scale: float = 1.0         # linear rope scaling on the global layers (1 / scaling.factor)
    rope_freqs: bool = False             # llama3-style rope_freqs.weight (theta divided per band)
    attn_out_bias: bool = False          # attn_output.bias present
    ffn_bias: bool = False               # ffn_gate/up/down .bias present (llama, optional)
    output_bias: bool = False            # output.bias present (qwen2, optional)
    n_ctx_train: int | None = None

    def __post_init__(self):
        if not self.n_rot:
            self.n_rot = self.head_dim
        validate_config(self)

    # ---- per-layer helpers ----------------------------------------------------------------------------
    def is_sliding(self, il: int) -> bool:
        return bool(self.sliding_window) and bool(self.layer_is_sliding[il])

    def rope_base_for(self, il: int) -> float:
        """llama_model::get_rope_freq_base: the SWA base on sliding layers, the model's base otherwise."""
        if self.is_sliding(il) and self.rope_base_local is not None:
            return self.rope_base_local
        return self.rope_base

    def rope_scale_for(self, il: int) -> float:
        """llama_model::get_rope_freq_scale: 1.0 (rope_freq_scale_train_swa) on sliding layers."""
        return 1.0 if self.is_sliding(il) else self.rope_freq_scale

    def kv_head(self, h: int) -> int:
        return h // (self.n_head // self.n_head_kv)

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def describe(self) -> str:
        sl = [i for i, s in enumerate(self.layer_is_sliding) if s] if self.sliding_window else []
        gl = [i for i in range(self.n_layer) if i not in sl]
        return (f"{self.arch}: {self.n_layer} layers, n_embd {self.n_embd}, heads {self.n_head}/{self.n_head_kv} "
                f"x {self.head_dim}, n_ff {self.n_ff}, vocab {self.vocab}, rope {self.rope_style} base "
                f"{self.rope_base:g}" + (f" (local {self.rope_base_local:g})" if self.rope_base_local else "")
                + f", window {self.sliding_window}, global layers {gl if sl else 'all'}, attn_scale "
                f"{self.attn_scale:.6g}, embed_scale {self.embed_scale:.6g}, act {self.ffn_act}"
                + (", qk_norm" if self.qk_norm else "") + (", post_norms" if self.post_norms else "")
                + (", qkv bias" if self.attn_bias else "") + (", tied head" if self.tied_output else ""))


def _finite_positive(v) -> bool:
    try:
        return math.isfinite(float(v)) and float(v) > 0
    except (TypeError, ValueError):
        return False


def validate_config(cfg: ModelConfig, where: str = "model config") -> None:
    """Raise ModelError unless every count and dimension is a positive integer and every epsilon, rope base,
    scale and cap is finite and positive (a NaN / zero / negative one gives NaN logits, not an error)."""
    for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "head_dim_v", "n_ff", "vocab", "n_rot"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ModelError(f"{where}: {name} = {v!r}; it must be a positive integer")
    if cfg.n_head % cfg.n_head_kv:
        raise ModelError(f"{where}: n_head {cfg.n_head} is not a multiple of n_head_kv {cfg.n_head_kv}")
    for name in ("rms_eps", "rope_base", "rope_freq_scale", "embed_scale", "attn_scale"):
        if not _finite_positive(getattr(cfg, name)):
            raise ModelError(f"{where}: {name} = {getattr(cfg, name)!r}; it must be finite and positive")
    for name in ("rope_base_local", "final_logit_softcap"):
        v = getattr(cfg, name)
        if v is not None and not _finite_positive(v):
            raise ModelError(f"{where}: {name} = {v!r}; it must be finite and positive (or absent)")
    if cfg.sliding_window is not None and (isinstance(cfg.sliding_window, bool) or cfg.sliding_window < 1):
        raise ModelError(f"{where}: sliding_window = {cfg.sliding_window!r}; it must be a positive integer")
    if len(cfg.layer_is_sliding) != cfg.n_layer:
        raise ModelError(f"{where}: layer_is_sliding has {len(cfg.layer_is_sliding)} entries for {cfg.n_layer} layers")


# --------------------------------------------------------------------------------------------------------
# tensor names
# --------------------------------------------------------------------------------------------------------
#: the lab's logical tensor names -> gguf-py's MODEL_TENSOR (whose TENSOR_NAMES give the GGUF names)
_TENSORS = {"token_embd": "TOKEN_EMBD", "output_norm": "OUTPUT_NORM", "output": "OUTPUT", "rope_freqs": "ROPE_FREQS",
            "attn_norm": "ATTN_NORM", "attn_q": "ATTN_Q", "attn_k": "ATTN_K", "attn_v": "ATTN_V",
            "attn_output": "ATTN_OUT", "ffn_norm": "FFN_NORM", "ffn_gate": "FFN_GATE", "ffn_up": "FFN_UP",
            "ffn_down": "FFN_DOWN", "attn_q_norm": "ATTN_Q_NORM", "attn_k_norm": "ATTN_K_NORM",
            "post_attention_norm": "ATTN_POST_NORM", "post_ffw_norm": "FFN_POST_NORM"}


@lru_cache(maxsize=None)
def tensor_name(logical: str, layer: int | None = None, suffix: str = "weight") -> str:
    """The GGUF tensor name of a logical tensor (``attn_q`` of layer 3 -> ``blk.3.attn_q.weight``), from gguf-py's
    ``TENSOR_NAMES``."""
    from gguf import MODEL_TENSOR, TENSOR_NAMES

    return TENSOR_NAMES[MODEL_TENSOR[_TENSORS[logical]]].format(bid=layer) + "." + suffix


def gguf_key(key: str, arch: str | None = None) -> str:
    """A GGUF metadata key from gguf-py's ``Keys`` (``"LLM.BLOCK_COUNT"``, arch ``llama`` -> ``llama.block_count``)."""
    from gguf import Keys

    group, name = key.split(".")
    return getattr(getattr(Keys, group), name).format(arch=arch)


def layer_tensors(cfg: ModelConfig, i: int) -> dict[str, str]:
    """Logical name -> GGUF tensor name for layer ``i`` (only the tensors this config has)."""
    if not 0 <= i < cfg.n_layer:
        raise IndexError(f"layer {i} out of range (n_layer {cfg.n_layer})")
    names = {k: tensor_name(k, i) for k in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                            "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
    if cfg.qk_norm:
        names["attn_q_norm"] = tensor_name("attn_q_norm", i)
        names["attn_k_norm"] = tensor_name("attn_k_norm", i)
    if cfg.post_norms:
        names["post_attention_norm"] = tensor_name("post_attention_norm", i)
        names["post_ffw_norm"] = tensor_name("post_ffw_norm", i)
    if cfg.attn_bias:
        for k in ("attn_q", "attn_k", "attn_v"):
            names[f"{k}_bias"] = tensor_name(k, i, "bias")
    if cfg.attn_out_bias:
        names["attn_output_bias"] = tensor_name("attn_output", i, "bias")
    if cfg.ffn_bias:
        for k in ("ffn_gate", "ffn_up", "ffn_down"):
            names[f"{k}_bias"] = tensor_name(k, i, "bias")
    return names


def global_tensors(cfg: ModelConfig) -> dict[str, str]:
    """token_embd, output_norm, output (= token_embd.weight when tied) and the optional extras."""
    names = {"token_embd": tensor_name("token_embd"), "output_norm": tensor_name("output_norm"),
             "output": tensor_name("token_embd") if cfg.tied_output else tensor_name("output")}
    if cfg.output_bias:
        names["output_bias"] = tensor_name("output", suffix="bias")
    if cfg.rope_freqs:
        names["rope_freqs"] = tensor_name("rope_freqs")
    return names


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    """GGUF tensor name -> numpy shape for every tensor of a model with this config."""
    E, F, V = cfg.n_embd, cfg.n_ff, cfg.vocab
    q, kd, vd = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
    o = cfg.n_head * cfg.head_dim_v
    g = global_tensors(cfg)
    out = {g["token_embd"]: (V, E), g["output_norm"]: (E,)}
    if not cfg.tied_output:
        out[g["output"]] = (V, E)
    if cfg.output_bias:
        out[g["output_bias"]] = (V,)
    if cfg.rope_freqs:
        out[g["rope_freqs"]] = (cfg.n_rot // 2,)
    for i in range(cfg.n_layer):
        shp = {"attn_norm": (E,), "attn_q": (q, E), "attn_k": (kd, E), "attn_v": (vd, E), "attn_output": (E, o),
               "ffn_norm": (E,), "ffn_gate": (F, E), "ffn_up": (F, E), "ffn_down": (E, F),
               "attn_q_norm": (cfg.head_dim,), "attn_k_norm": (cfg.head_dim,), "post_attention_norm": (E,),
               "post_ffw_norm": (E,), "attn_q_bias": (q,), "attn_k_bias": (kd,), "attn_v_bias": (vd,),
               "attn_output_bias": (E,), "ffn_gate_bias": (F,), "ffn_up_bias": (F,), "ffn_down_bias": (E,)}
        for logical, name in layer_tensors(cfg, i).items():
            out[name] = shp[logical]
    return out


# --------------------------------------------------------------------------------------------------------
# reading a config from GGUF metadata
# --------------------------------------------------------------------------------------------------------
def _where(model) -> str:
    return str(getattr(model, "path", None) or type(model).__name__)


def _has_tensor(model, name: str) -> bool:
    try:
        model.tensor(name)
        return True
    except (ModelError, KeyError):
        return False


def _scalar(model, key: str, what: str, required: bool = True, default=None):
    v = model.field(key)
    if v is None:
        if required:
            raise ModelError(f"{_where(model)}: missing GGUF key {key!r} ({what})")
        return default
    if isinstance(v, (list, tuple)):  # per-layer arrays: accepted when uniform
        if len(v) == 0 or any(x != v[0] for x in v):
            raise ModelError(f"{_where(model)}: {key!r} varies per layer ({v!r}); labkernels supports uniform "
                             "layers only")
        v = v[0]
    return v


def _int(model, key: str, what: str, required: bool = True, default=None, minimum: int = 1) -> int:
    v = _scalar(model, key, what, required, default)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ModelError(f"{_where(model)}: GGUF key {key!r} ({what}) is {v!r}; it must be an integer >= {minimum}")
    return int(v)


def _positive(model, key: str, what: str, required: bool = True, default=None) -> float | None:
    v = _scalar(model, key, what, required, default)
    if v is None:
        return None
    if isinstance(v, bool) or not _finite_positive(v):
        raise ModelError(f"{_where(model)}: GGUF key {key!r} ({what}) is {v!r}; it must be finite and positive")
    return float(v)


def config_from_model(model) -> ModelConfig:
    """Read a :class:`ModelConfig` from a model's GGUF metadata (``model.field``) and tensor shapes.

    Raises :class:`ModelError` naming the file and the key for an unsupported architecture, a missing
    key, or tensors whose shapes disagree with the metadata.
    """
    arch = model.field(gguf_key("General.ARCHITECTURE"))
    if arch is None:
        raise ModelError(f"{_where(model)}: missing GGUF key {gguf_key('General.ARCHITECTURE')!r}")
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(f"{_where(model)}: unsupported architecture {arch!r}; labkernels' reference forward "
                         f"supports {', '.join(SUPPORTED_ARCHS)}")
    k = lambda key: gguf_key(key, arch)  # noqa: E731   gguf-py's Keys, e.g. "LLM.BLOCK_COUNT" -> llama.block_count

    n_layer = _int(model, k("LLM.BLOCK_COUNT"), "number of layers")
    if not _has_tensor(model, tensor_name("attn_norm", n_layer - 1)):
        raise ModelError(f"{_where(model)}: missing tensor {tensor_name('attn_norm', n_layer - 1)!r}: "
                         f"{k('LLM.BLOCK_COUNT')} = {n_layer} but the model has no such layer")
    n_embd = _int(model, k("LLM.EMBEDDING_LENGTH"), "hidden size")
    n_ff = _int(model, k("LLM.FEED_FORWARD_LENGTH"), "FFN size")
    n_head = _int(model, k("Attention.HEAD_COUNT"), "attention heads")
    # llama-model.cpp: n_head_kv defaults to n_head; head sizes default to n_embd / n_head; n_rot to head size
    n_head_kv = _int(model, k("Attention.HEAD_COUNT_KV"), "kv heads", False, n_head)
    if n_head % n_head_kv:
        raise ModelError(f"{_where(model)}: n_head {n_head} is not a multiple of n_head_kv {n_head_kv}")
    head_dim = _int(model, k("Attention.KEY_LENGTH"), "q/k head size", False, n_embd // n_head)
    head_dim_v = _int(model, k("Attention.VALUE_LENGTH"), "v head size", False, n_embd // n_head)
    n_rot = _int(model, k("Rope.DIMENSION_COUNT"), "rotated dims", False, head_dim)
    rms_eps = _positive(model, k("Attention.LAYERNORM_RMS_EPS"), "RMSNorm epsilon")
    rope_base = _positive(model, k("Rope.FREQ_BASE"), "rope base", False, DEFAULT_ROPE_BASE)
    n_ctx = _scalar(model, k("LLM.CONTEXT_LENGTH"), "training context", False, None)
    if n_ctx is not None:
        n_ctx = _int(model, k("LLM.CONTEXT_LENGTH"), "training context")
    if model.field(k("LLM.EXPERT_COUNT")):
        raise ModelError(f"{_where(model)}: mixture-of-experts models are not supported")

    if n_rot % 2 or n_rot > head_dim:
        raise ModelError(f"{_where(model)}: rope dimension count {n_rot} invalid for head size {head_dim}")
    if arch in ("llama", "qwen2") and (n_rot != head_dim or head_dim != head_dim_v):
        # llama.cpp: "invalid n_rot" (llama) / GGML_ASSERT(n_embd_head == n_rot) (qwen2)
        raise ModelError(f"{_where(model)}: {arch} needs n_rot == head_dim == head_dim_v, got {n_rot}, "
                         f"{head_dim}, {head_dim_v}")

    # rope scaling: linear is a plain 1/factor on theta; yarn / longrope are not implemented here
    scaling = model.field(k("Rope.SCALING_TYPE"))
    factor = model.field(k("Rope.SCALING_FACTOR"))
    if factor is None:
        factor = model.field(f"{arch}.rope.scale_linear")   # llama.cpp's legacy key; gguf-py's Keys has no name for it
    rope_freq_scale = 1.0
    if scaling not in (None, "none", "linear"):
        raise ModelError(f"{_where(model)}: rope scaling {scaling!r} is not supported (none / linear only)")
    if factor is not None and not _finite_positive(factor):
        raise ModelError(f"{_where(model)}: rope scaling factor {factor!r} must be finite and positive")
    if scaling != "none" and factor:
        rope_freq_scale = 1.0 / float(factor)  # llama-model.cpp: rope_freq_scale_train = 1/ropescale

    # token embedding: vocab from the tensor (llama.cpp checks it against the tokenizer's list)
    try:
        emb = model.tensor(tensor_name("token_embd"))
    except (ModelError, KeyError):
        raise ModelError(f"{_where(model)}: no tensor 'token_embd.weight'") from None
    if len(emb.shape) != 2 or emb.shape[1] != n_embd:
        raise ModelError(f"{_where(model)}: token_embd.weight has shape {emb.shape}, expected (vocab, {n_embd})")
    vocab = int(emb.shape[0])
    toks = model.field(gguf_key("Tokenizer.LIST"))
    if toks is not None and len(toks) != vocab:
        raise ModelError(f"{_where(model)}: tokenizer has {len(toks)} tokens but token_embd.weight has {vocab} rows")

    tied = not _has_tensor(model, tensor_name("output"))
    final_softcap = None
    sliding_window = None
    layer_is_sliding = [False] * n_layer
    rope_base_local = None
    embed_scale = 1.0
    attn_scale = 1.0 / math.sqrt(head_dim)  # llama.cpp/qwen2.cpp: kq_scale = 1/sqrt(n_embd_head)

    if arch == "gemma3":
        # llama-model.cpp: a window key of 0 (or none) means no sliding-window attention
        swa = model.field(k("Attention.SLIDING_WINDOW"))
        if swa is not None:
            swa = _int(model, k("Attention.SLIDING_WINDOW"), "sliding window", minimum=0)
        if swa:
            sliding_window = swa
            pattern = model.field(k("Attention.SLIDING_WINDOW_PATTERN"))
            if isinstance(pattern, (list, tuple)):  # newer llama.cpp: get_key_or_arr, per-layer flags
                if len(pattern) != n_layer:
                    raise ModelError(f"{_where(model)}: sliding_window_pattern has {len(pattern)} entries, "
                                     f"expected {n_layer}")
                layer_is_sliding = [bool(x) for x in pattern]
            else:
                n_pattern = (_int(model, k("Attention.SLIDING_WINDOW_PATTERN"), "SWA pattern", minimum=0)
                             if pattern is not None else GEMMA3_SWA_PATTERN)
                # llama-hparams.cpp set_swa_pattern(n, dense_first=false):
                #   swa_layers[il] = n == 0 || (il % n < n - 1)  -> every n-th layer (il = n-1, 2n-1, ...) is global
                layer_is_sliding = [n_pattern == 0 or (il % n_pattern < n_pattern - 1) for il in range(n_layer)]
            rope_base_local = _positive(model, k("Rope.FREQ_BASE_SWA"), "SWA rope base", False, GEMMA3_ROPE_BASE_SWA)
        else:
            # llama-model.cpp: no window -> LLAMA_SWA_TYPE_NONE -> llm_build_gemma3<false>, whose head applies
            # final-logit softcapping with f_final_logit_softcapping (default 0 = division by zero there)
            cap = model.field(k("LLM.FINAL_LOGIT_SOFTCAPPING"))
            if not cap:
                raise ModelError(f"{_where(model)}: gemma3 without a sliding window needs "
                                 f"{k('LLM.FINAL_LOGIT_SOFTCAPPING')} (llama.cpp's non-SWA graph softcaps the logits)")
            final_softcap = _positive(model, k("LLM.FINAL_LOGIT_SOFTCAPPING"), "final logit softcap")
        # llm_build_gemma3: inpL = ggml_scale(inpL, sqrtf(n_embd))
        embed_scale = math.sqrt(n_embd)
        # llama-model.cpp load_hparams (gemma3): type is LLM_TYPE_27B iff n_layer == 62, and
        #   f_attention_scale = type == 27B ? 1/sqrt(n_embd / n_head) : 1/sqrt(n_embd_head_k)
        # (= query_pre_attn_scalar ** -0.5 of the HF configs: 256 = head_dim for 270M..12B, 168 for 27B)
        attn_scale = 1.0 / math.sqrt(n_embd // n_head) if n_layer == 62 else 1.0 / math.sqrt(head_dim)

    cfg = ModelConfig(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        head_dim_v=head_dim_v, n_ff=n_ff, vocab=vocab, rms_eps=rms_eps, rope_base=rope_base,
        rope_base_local=rope_base_local, rope_style=ROPE_STYLE[arch], sliding_window=sliding_window,
        layer_is_sliding=layer_is_sliding, embed_scale=embed_scale, attn_scale=attn_scale,
        ffn_act=FFN_ACT[arch], qk_norm=arch == "gemma3", post_norms=arch == "gemma3",
        attn_bias=_has_tensor(model, tensor_name("attn_q", 0, "bias")), tied_output=tied,
        final_logit_softcap=final_softcap, n_rot=n_rot, rope_freq_scale=rope_freq_scale,
        rope_freqs=_has_tensor(model, tensor_name("rope_freqs")),
        attn_out_bias=_has_tensor(model, tensor_name("attn_output", 0, "bias")),
        ffn_bias=_has_tensor(model, tensor_name("ffn_up", 0, "bias")),
        output_bias=_has_tensor(model, tensor_name("output", suffix="bias")),
        n_ctx_train=int(n_ctx) if n_ctx is not None else None,
    )
    if arch == "qwen2" and not cfg.attn_bias:
        raise ModelError(f"{_where(model)}: qwen2 needs blk.N.attn_q/k/v.bias (llama.cpp creates them as required)")
    check_shapes(model, cfg)
    check_unused(model, cfg)
    return cfg


#: tensor types the reference and the GPU prefill can read: vectors (norms, biases) in float, matrices in
#: float or one of the quantized types labkernels dequantizes (q4_K / q6_K also run on the lab's kernels)
VECTOR_TYPES = ("f32", "f16")
MATRIX_TYPES = ("f32", "f16", "q8_0", "q5_0", "q4_K", "q6_K")


def check_shapes(model, cfg: ModelConfig) -> None:
    """Raise ModelError when a tensor the config needs is missing, has the wrong shape or a type labkernels
    cannot compute with (objects without a ``qtype``, e.g. shape-only metadata probes, skip the type)."""
    for name, shape in expected_shapes(cfg).items():
        try:
            t = model.tensor(name)
        except (ModelError, KeyError):
            raise ModelError(f"{_where(model)}: missing tensor {name!r} (needed by the {cfg.arch} graph)") from None
        if tuple(t.shape) != tuple(shape):
            raise ModelError(f"{_where(model)}: tensor {name} has shape {tuple(t.shape)}, the metadata implies "
                             f"{tuple(shape)}")
        qtype = getattr(t, "qtype", None)
        allowed = VECTOR_TYPES if len(shape) == 1 else MATRIX_TYPES
        if qtype is not None and qtype not in allowed:
            raise ModelError(f"{_where(model)}: tensor {name} has type {getattr(t, 'ggml_type', qtype)}; a "
                             f"{len(shape)}-D {cfg.arch} tensor must be one of {', '.join(allowed)}")


def check_unused(model, cfg: ModelConfig) -> None:
    """Raise ModelError when the file has tensors the config does not use (llama.cpp's loader refuses such a
    file: "wrong number of tensors"): a block_count smaller than the layers present, a stray tensor, ..."""
    listing = getattr(model, "tensors", None)
    if listing is None:  # a metadata-only probe has no tensor list
        return
    expected = expected_shapes(cfg)
    extra = [t.name for t in listing() if t.name not in expected]
    if extra:
        layers = sorted({int(n.split(".")[1]) for n in extra if n.startswith("blk.") and n.split(".")[1].isdigit()})
        hint = (f"; layers {layers[0]}..{layers[-1]} are present but block_count is {cfg.n_layer}"
                if layers and layers[0] >= cfg.n_layer else "")
        raise ModelError(f"{_where(model)}: {len(extra)} tensor(s) the {cfg.arch} graph does not use "
                         f"(llama.cpp refuses such a file): {', '.join(extra[:6])}{' ...' if len(extra) > 6 else ''}"
                         f"{hint}")
