"""CPU reference forward (prefill) of a GGUF decoder model, from dequantized weights.

This is the independent reference the GPU prefill's logits are compared with. It follows llama.cpp's
graphs (``src/models/gemma3.cpp``, ``llama.cpp``, ``qwen2.cpp``; every detail is pinned in
:mod:`labkernels.arch`) but computes in float64 by default from the exactly dequantized weights
(``Tensor.array()``), with exact math: ``tanh``-GELU by formula (ggml's CPU backend uses an fp16 lookup
table), softmax in the working precision, rope angles in float64.

Per layer (``x`` is the residual stream, ``rms(v, w) = v / sqrt(mean(v^2) + eps) * w``)::

    h = rms(x, attn_norm)
    q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)          reshaped [T, heads, head_dim]
    q, k = rms(q, attn_q_norm), rms(k, attn_k_norm)               (gemma3: over head_dim)
    q, k = rope(q, pos), rope(k, pos)                             (neox: pairs (i, i + n_rot/2))
    s[h, i, j] = attn_scale * q[i, h] . k[j, h // n_gqa]          masked: j > i, or i - j >= window (sliding layers)
    a = softmax_j(s) v  ->  [T, n_head * head_dim_v] Wo^T (+bo)
    a = rms(a, post_attention_norm)                               (gemma3)
    x = x + a
    h = rms(x, ffn_norm);  f = (act(h Wg^T) * (h Wu^T)) Wd^T;  f = rms(f, post_ffw_norm) (gemma3)
    x = x + f
    logits = rms(x, output_norm) Wout^T   (Wout = token_embd when tied; gemma3 scales the input
                                           embeddings by sqrt(n_embd))
"""

from __future__ import annotations

import re
import weakref

import numpy as np

from . import quantize_ref
from .arch import ModelConfig, TokenError, check_shapes, check_token_ids, config_from_model, global_tensors, layer_tensors, validate_config

class RefArgumentError(ValueError):
    """An argument of the reference forward that is not a model, a dtype it computes in, or a count it takes."""


__all__ = ["RefArgumentError", "RefModel", "forward_ref", "greedy_ref", "detokenize", "attention_mask", "rope", "rms_norm",
           "get_ref_model", "clear_cache"]

GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = 0.79788456080286535587989211986876

_HEAD_CHUNK = 16384  # rows of the output head upcast at a time (float64 logits from float32 weights)


# --------------------------------------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------------------------------------
def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """ggml_rms_norm over the last axis, then ggml_mul by the weight (broadcast)."""
    x = np.asarray(x)
    eps = x.dtype.type(eps)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    y = x * (x.dtype.type(1.0) / np.sqrt(ms + eps))
    return y if w is None else y * w


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    t = x.dtype.type
    return t(0.5) * x * (t(1.0) + np.tanh(t(SQRT_2_OVER_PI) * x * (t(1.0) + t(GELU_COEF_A) * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (x.dtype.type(1.0) + np.exp(-x))


ACTIVATIONS = {"gelu_tanh": gelu_tanh, "silu": silu}


def rope_angles(positions: np.ndarray, n_rot: int, base: float, freq_scale: float = 1.0,
                freq_factors: np.ndarray | None = None) -> np.ndarray:
    """theta[t, i] = pos[t] * freq_scale * base^(-2i/n_rot) / freq_factors[i], i < n_rot/2 (float64).

    ggml_rope_ext with ext_factor = 0 (no YaRN): theta_interp = freq_scale * theta_extrap, mscale 1.
    """
    inv = np.power(float(base), -np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, np.float64)
    return np.asarray(positions, np.float64)[:, None] * (freq_scale * inv)[None, :]


def rope(x: np.ndarray, theta: np.ndarray, style: str) -> np.ndarray:
    """Rotate x [T, heads, d] by theta [T, n_rot/2]; dims >= n_rot pass through.

    'neox' pairs (i, i + n_rot/2); 'normal' pairs (2i, 2i + 1). Rotation:
    (a, b) -> (a cos - b sin, a sin + b cos).
    """
    half = theta.shape[1]
    n_rot = 2 * half
    cos = np.cos(theta).astype(x.dtype)[:, None, :]
    sin = np.sin(theta).astype(x.dtype)[:, None, :]
    out = x.copy()
    if style == "neox":
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    elif style == "normal":
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    else:
        raise ValueError(f"unknown rope style {style!r}")
    return out


def attention_mask(cfg: ModelConfig, il: int, pos_q: np.ndarray, pos_k: np.ndarray | None = None) -> np.ndarray:
    """Boolean [Tq, Tk]: True where query i may attend to key j.

    llama.cpp (llama-kv-cache.cpp set_input_kq_mask + llama-hparams.cpp is_masked_swa): masked when
    p0 > p1 (future key) or, on a sliding layer, when p1 - p0 >= n_swa, with p0 the key position and p1
    the query position. So a sliding layer sees the ``window`` most recent positions, itself included.
    """
    pq = np.asarray(pos_q)[:, None]
    pk = (np.asarray(pos_q) if pos_k is None else np.asarray(pos_k))[None, :]
    vis = pk <= pq
    if cfg.is_sliding(il):
        vis &= (pq - pk) < cfg.sliding_window
    return vis


# --------------------------------------------------------------------------------------------------------
# the reference model: dequantized weights, cached
# --------------------------------------------------------------------------------------------------------
class RefModel:
    """Dequantized weights of ``model`` in ``dtype`` (float64 or float32) and the forward pass.

    Layer weights are dequantized on first use and kept (``keep_layers=False``: only the layer in use is
    kept, for models whose dequantized weights do not fit in memory, e.g. llama-7B: ~80 s for 5 tokens in
    float32). The (large) output head / token embedding is kept in float32 -- the dequantized values are
    float32 exactly -- and upcast chunk by chunk when the working dtype is float64 (the result equals a
    float64 matrix product).
    """

    def __init__(self, model, cfg: ModelConfig | None = None, dtype=np.float64, shared: dict | None = None,
                 keep_layers: bool = True, act_quant: bool = False):
        self.model = model
        # act_quant: round the activations entering every q4_K / q6_K matmul to q8_1 first (per 32 values,
        # d = amax/127 stored fp16), which is what the int8-mma kernels (and llama.cpp's MMQ) compute with
        self.act_quant = act_quant
        self.keep_layers = keep_layers  # False: dequantize each layer when used, keep only the current one
        # the model check runs before any forward pass: config_from_model checks the metadata, every tensor
        # (shape, type) and refuses unused ones; a config given explicitly is re-validated (it may have been
        # edited after construction) and its tensors checked against the model
        if cfg is None:
            cfg = config_from_model(model)
        else:
            validate_config(cfg, where=str(getattr(model, "path", None) or "model config"))
            check_shapes(model, cfg)
        self.cfg = cfg
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:
            raise RefArgumentError(f"reference forward: dtype must be float64 or float32, got {dtype!r}") from None
        if self.dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise RefArgumentError(f"reference forward: dtype must be float64 or float32, got {self.dtype}")
        self._shared = shared if shared is not None else {}
        self._layers: list[dict | None] = [None] * self.cfg.n_layer
        g = global_tensors(self.cfg)
        self._gnames = g
        self.output_norm = self._load(g["output_norm"])
        self.output_bias = self._load(g["output_bias"]) if "output_bias" in g else None
        self.rope_freqs = (np.asarray(model.tensor(g["rope_freqs"]).array(), np.float64)
                           if "rope_freqs" in g else None)

    # ---- weights ---------------------------------------------------------------------------------------
    def _f32(self, name: str) -> np.ndarray:
        """float32 dequantized tensor, shared between the RefModels of one model (head / embedding)."""
        a = self._shared.get(name)
        if a is None:
            a = np.ascontiguousarray(self.model.tensor(name).array(), dtype=np.float32)
            self._shared[name] = a
        return a

    def _load(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(self.model.tensor(name).array(), dtype=self.dtype)

    def layer(self, il: int) -> dict:
        w = self._layers[il]
        if w is None:
            if not self.keep_layers:
                self._layers = [None] * self.cfg.n_layer
            names = layer_tensors(self.cfg, il)
            w = {k: self._load(n) for k, n in names.items()}
            w["_kquant"] = {k for k, n in names.items() if self.model.tensor(n).qtype in ("q4_K", "q6_K")}
            self._layers[il] = w
        return w

    def _mm(self, w: dict, key: str, h: np.ndarray) -> np.ndarray:
        """h @ W^T, with h rounded through q8_1 first when emulating the int8 kernels (act_quant)."""
        if self.act_quant and key in w["_kquant"]:
            qs, d, _ = quantize_ref.quantize_q8_1(np.ascontiguousarray(h, dtype=np.float32))
            h = (qs.astype(self.dtype).reshape(h.shape[0], -1, 32)
                 * d.astype(self.dtype)[:, :, None]).reshape(h.shape)
        return h @ w[key].T

    @property
    def token_embd(self) -> np.ndarray:
        return self._f32(self._gnames["token_embd"])

    @property
    def output_weight(self) -> np.ndarray:
        return self._f32(self._gnames["output"])

    # ---- pieces of the graph ---------------------------------------------------------------------------
    def embed(self, tokens) -> np.ndarray:
        tokens = check_token_ids(tokens, self.cfg.vocab)
        x = self.token_embd[tokens].astype(self.dtype)
        if self.cfg.embed_scale != 1.0:
            x = x * self.dtype.type(self.cfg.embed_scale)
        return x

    def attention(self, il: int, h: np.ndarray, positions: np.ndarray, capture: dict | None = None) -> np.ndarray:
        cfg, w = self.cfg, self.layer(il)
        T = h.shape[0]
        q = self._mm(w, "attn_q", h)
        k = self._mm(w, "attn_k", h)
        v = self._mm(w, "attn_v", h)
        if cfg.attn_bias:
            q, k, v = q + w["attn_q_bias"], k + w["attn_k_bias"], v + w["attn_v_bias"]
        q = q.reshape(T, cfg.n_head, cfg.head_dim)
        k = k.reshape(T, cfg.n_head_kv, cfg.head_dim)
        v = v.reshape(T, cfg.n_head_kv, cfg.head_dim_v)
        if cfg.qk_norm:
            q = rms_norm(q, w["attn_q_norm"], cfg.rms_eps)
            k = rms_norm(k, w["attn_k_norm"], cfg.rms_eps)
        theta = rope_angles(positions, cfg.n_rot, cfg.rope_base_for(il), cfg.rope_scale_for(il), self.rope_freqs)
        q = rope(q, theta, cfg.rope_style)
        k = rope(k, theta, cfg.rope_style)
        q = q * self.dtype.type(cfg.attn_scale)
        if capture is not None:
            capture[f"{il}.Qcur"], capture[f"{il}.Kcur"], capture[f"{il}.Vcur"] = q, k, v
        # GQA: query head h = kv * n_gqa + g reads kv head kv
        g = cfg.n_gqa
        qh = q.reshape(T, cfg.n_head_kv, g, cfg.head_dim).transpose(1, 2, 0, 3)   # [kv, g, T, d]
        kh = k.transpose(1, 2, 0)[:, None]                                         # [kv, 1, d, T]
        vh = v.transpose(1, 0, 2)[:, None]                                         # [kv, 1, T, dv]
        s = qh @ kh                                                                # [kv, g, T, T]
        vis = attention_mask(cfg, il, positions)
        s = np.where(vis, s, s.dtype.type(-np.inf))
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p = p / p.sum(axis=-1, keepdims=True)
        o = (p @ vh)                                                               # [kv, g, T, dv]
        o = o.transpose(2, 0, 1, 3).reshape(T, cfg.n_head * cfg.head_dim_v)
        out = self._mm(w, "attn_output", o)
        if cfg.attn_out_bias:
            out = out + w["attn_output_bias"]
        return out

    def ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        cfg, w = self.cfg, self.layer(il)
        gate = self._mm(w, "ffn_gate", h)
        up = self._mm(w, "ffn_up", h)
        if cfg.ffn_bias:
            gate, up = gate + w["ffn_gate_bias"], up + w["ffn_up_bias"]
        out = self._mm(w, "ffn_down", ACTIVATIONS[cfg.ffn_act](gate) * up)
        if cfg.ffn_bias:
            out = out + w["ffn_down_bias"]
        return out

    def block(self, il: int, x: np.ndarray, positions: np.ndarray, capture: dict | None = None) -> np.ndarray:
        cfg, w = self.cfg, self.layer(il)
        a = self.attention(il, rms_norm(x, w["attn_norm"], cfg.rms_eps), positions, capture)
        if cfg.post_norms:
            a = rms_norm(a, w["post_attention_norm"], cfg.rms_eps)
        x = x + a
        f = self.ffn(il, rms_norm(x, w["ffn_norm"], cfg.rms_eps))
        if cfg.post_norms:
            f = rms_norm(f, w["post_ffw_norm"], cfg.rms_eps)
        x = x + f
        if capture is not None:
            capture[f"{il}.attn_out"], capture[f"{il}.ffn_out"], capture[f"{il}.l_out"] = a, f, x
        return x

    def head(self, h: np.ndarray) -> np.ndarray:
        """Logits [T, vocab] from final-normed hidden states h [T, n_embd]."""
        W = self.output_weight
        if self.dtype == np.float32:
            out = h @ W.T
        else:
            out = np.empty((h.shape[0], W.shape[0]), np.float64)
            for r0 in range(0, W.shape[0], _HEAD_CHUNK):
                out[:, r0:r0 + _HEAD_CHUNK] = h @ W[r0:r0 + _HEAD_CHUNK].astype(np.float64).T
        if self.output_bias is not None:
            out = out + self.output_bias
        c = self.cfg.final_logit_softcap
        if c:
            c = self.dtype.type(c)
            out = np.tanh(out / c) * c
        return out

    def forward(self, tokens, last_only: bool = False, positions=None, capture: dict | None = None) -> np.ndarray:
        """Logits [T, vocab] (or [vocab] for ``last_only``) for one sequence starting at position 0.

        ``capture`` (a dict) receives the intermediate activations: 'inp_scaled', '<il>.Qcur' (after q
        norm, rope and attn_scale), '<il>.Kcur', '<il>.Vcur', '<il>.attn_out' (after post norm),
        '<il>.ffn_out', '<il>.l_out', 'result_norm'.
        """
        logits = self.head(self.hidden(tokens, last_only, positions, capture))
        return logits[0] if last_only else logits

    __call__ = forward

    def hidden(self, tokens, last_only: bool = False, positions=None, capture: dict | None = None) -> np.ndarray:
        """Final-normed hidden states [T, n_embd] (``last_only``: [1, n_embd]), the input of the head."""
        x = self.embed(tokens)
        T = x.shape[0]
        positions = np.arange(T) if positions is None else np.asarray(positions, np.int64)
        if capture is not None:
            capture["inp_scaled"] = x
        for il in range(self.cfg.n_layer):
            x = self.block(il, x, positions, capture)
        if last_only:
            x = x[-1:]
        h = rms_norm(x, self.output_norm, self.cfg.rms_eps)
        if capture is not None:
            capture["result_norm"] = h
        return h

    def next_token(self, tokens) -> int:
        """argmax of the last position's logits, exactly as ``forward(tokens, last_only=True).argmax()``.

        In float64 the head is first evaluated in float32 (no upcast of the big matrix), then the
        candidates within a generous float32 error bound of the maximum are re-scored in float64.
        """
        h = self.hidden(tokens, last_only=True)[0]
        W = self.output_weight
        if self.dtype == np.float32:
            return int(np.argmax(self.head(h[None])[0]))
        l32 = W @ h.astype(np.float32)
        if self.output_bias is not None:
            l32 = l32 + self.output_bias.astype(np.float32)
        tol = 1e-3 * (float(np.abs(l32).max()) + 1.0)  # float32 dot error is ~1e-6 relative; softcap is monotonic
        cand = np.nonzero(l32 >= l32.max() - tol)[0]
        exact = W[cand].astype(np.float64) @ h
        if self.output_bias is not None:
            exact = exact + self.output_bias[cand]
        return int(cand[np.argmax(exact)])


# --------------------------------------------------------------------------------------------------------
# cached entry points
# --------------------------------------------------------------------------------------------------------
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_CACHE_STRONG: dict = {}  # for model objects that cannot be weakly referenced


def _model_cache(model) -> dict:
    try:
        return _CACHE.setdefault(model, {})
    except TypeError:
        return _CACHE_STRONG.setdefault(id(model), {})


def get_ref_model(model, cfg: ModelConfig | None = None, dtype=np.float64, act_quant: bool = False) -> RefModel:
    """The cached :class:`RefModel` of ``model`` for (cfg, dtype, act_quant); the float32 head is shared."""
    mc = _model_cache(model)
    if cfg is None:
        cfg = mc.get("cfg")
        if cfg is None:
            cfg = mc["cfg"] = config_from_model(model)
    key = (np.dtype(dtype).name, repr(cfg), act_quant)
    ref = mc.get(key)
    if ref is None:
        ref = mc[key] = RefModel(model, cfg, dtype, shared=mc.setdefault("f32", {}), act_quant=act_quant)
    return ref


def clear_cache() -> None:
    _CACHE.clear()
    _CACHE_STRONG.clear()


def forward_ref(model, tokens, cfg: ModelConfig | None = None, dtype=np.float64, last_only: bool = False,
                act_quant: bool = False) -> np.ndarray:
    """Reference logits [n_tok, vocab] (``last_only``: [vocab]) of the prefill of ``tokens``.

    ``model``: anything with ``.tensor(name)`` (-> ``.qtype .shape .raw() .array()``) and ``.field(key)``
    (:class:`labkernels.model.Model`, :class:`labkernels.synthetic.SyntheticModel`). Dequantized weights
    are cached per model, so repeated calls only pay for the arithmetic.
    """
    _check_model(model)
    ref = get_ref_model(model, cfg, dtype, act_quant=act_quant)
    try:
        return ref.forward(tokens, last_only=last_only)
    except MemoryError:
        n = len(tokens) if hasattr(tokens, "__len__") else "?"
        raise TokenError(f"reference forward of {n} tokens: out of memory (its attention is [heads, T, T] in "
                         f"{np.dtype(dtype).name}); use fewer tokens") from None


def _check_model(model) -> None:
    if not (callable(getattr(model, "tensor", None)) and callable(getattr(model, "field", None))):
        raise RefArgumentError(f"the reference forward takes a model (labkernels.model.open_model, "
                         f"synthetic.SyntheticModel), got {type(model).__name__}")


def greedy_ref(model, prompt_ids, n_new: int = 32, cfg: ModelConfig | None = None, dtype=np.float64,
               stop_ids=None, act_quant: bool = False) -> list[int]:
    """Greedy (argmax) continuation of ``prompt_ids``: the ``n_new`` generated ids (without the prompt).

    Each step re-runs the reference prefill on the grown sequence and takes the argmax of the last
    position's logits (only that position's head is computed; see :meth:`RefModel.next_token`). Stops
    early at an id in ``stop_ids`` (which is included in the result).
    """
    _check_model(model)
    if isinstance(n_new, bool) or not isinstance(n_new, (int, np.integer)) or n_new < 0:
        raise TokenError(f"n_new must be an integer >= 0 (tokens to generate), got {n_new!r}")
    ref = get_ref_model(model, cfg, dtype, act_quant=act_quant)
    ids = check_token_ids(prompt_ids, ref.cfg.vocab, "prompt ids").tolist()
    out: list[int] = []
    stop = set(check_token_ids(stop_ids, ref.cfg.vocab, "stop ids").tolist()) if stop_ids else set()
    for _ in range(n_new):
        nxt = ref.next_token(ids)
        out.append(nxt)
        ids.append(nxt)
        if nxt in stop:
            break
    return out


# --------------------------------------------------------------------------------------------------------
# detokenizer (display only)
# --------------------------------------------------------------------------------------------------------
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
TOKEN_TYPE_CONTROL = 3  # llama_token_type / gguf TokenType: 1 normal, 2 unknown, 3 control, 4 user, 5 unused, 6 byte
TOKEN_TYPE_BYTE = 6


def _gpt2_byte_decoder() -> dict[str, int]:
    # the GPT-2 byte-level BPE alphabet: printable bytes map to themselves, the rest to U+0100 upwards
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    dec, extra = {}, 0
    for b in range(256):
        if b in keep:
            dec[chr(b)] = b
        else:
            dec[chr(256 + extra)] = b
            extra += 1
    return dec


def _vocab(model) -> tuple[list, list | None, str]:
    mc = _model_cache(model)
    v = mc.get("vocab")
    if v is None:
        toks = model.field("tokenizer.ggml.tokens")
        if toks is None:
            raise ValueError("the model has no tokenizer.ggml.tokens")
        v = mc["vocab"] = (list(toks), model.field("tokenizer.ggml.token_type"),
                           model.field("tokenizer.ggml.model") or "llama")
    return v


def detokenize(model, ids, special: bool = False) -> str:
    """Text of token ids from the GGUF vocabulary (display only; no text -> ids).

    SentencePiece ('llama') vocabularies: '▁' -> ' ', ``<0xNN>`` byte tokens -> that byte; 'gpt2'
    vocabularies: byte-level BPE alphabet -> bytes. Control tokens (<bos>, <eos>, ...) are dropped
    unless ``special``. Bytes are decoded as UTF-8 with replacement of invalid sequences.
    """
    toks, types, kind = _vocab(model)
    buf = bytearray()
    dec = _gpt2_byte_decoder() if kind == "gpt2" else None
    for i in ids:
        i = int(i)
        if not 0 <= i < len(toks):
            raise ValueError(f"token id {i} out of range [0, {len(toks)})")
        t = toks[i]
        ty = types[i] if types is not None else 1
        if ty == TOKEN_TYPE_CONTROL and not special:
            continue
        if dec is not None and ty != TOKEN_TYPE_CONTROL:
            buf += bytes(dec.get(ch, ord("?")) for ch in t)
            continue
        m = _BYTE_TOKEN.match(t)
        if m and (ty == TOKEN_TYPE_BYTE or types is None):
            buf.append(int(m.group(1), 16))
        else:
            buf += t.replace("\u2581", " ").encode("utf-8")
    return buf.decode("utf-8", errors="replace")
