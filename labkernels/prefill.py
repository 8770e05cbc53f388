"""A whole prefill on the GPU with the lab's kernels (llama-family and gemma3, from GGUF metadata).

Weights stay quantized on the GPU: q4_K / q6_K tensors go through :func:`labkernels.gpu.qmatmul` (``kernel=``
``PrefillOptions.kernel``: ``auto`` picks round 7's ``wgmma_kq`` on sm_90 -- activations converted to fp16 once per
shared input -- or the int8 families ``q4k_nb`` / ``q6k_expb`` behind one q8_1 prepass per shared input, from the
recorded round-7 table); every other type (q5_0, q8_0, f16) is dequantized once at load
and multiplied with cuBLAS in fp32 ("gemm_other" class). Attention (``PrefillOptions.attention``, see
:mod:`labkernels.attention`) is cuDNN's fused SDPA by default where the frontend is installed, else -- recorded in
``GpuModel.attn.note`` -- the lab's cuBLAS batched QK^T and PV with its masked-softmax kernel (causal, sliding
window on gemma3's local layers); ``"torch"`` runs PyTorch's SDPA for comparison. Norms, RoPE, activations
and the embedding gather are the lab's kernels in ``kernels/prefill.cu``; residual adds are CuPy
elementwise kernels. Only the last position's logits are computed unless asked (as llama.cpp does).

Every op runs inside ``tracer.op(name, cls, ...)`` so :mod:`labkernels.decompose` can attribute each kernel
launch to its op, layer and weight tensor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import attention, gpu
from .arch import ModelConfig, config_from_model, global_tensors, layer_tensors
from .trace import NullTracer

KQUANT = ("q4_K", "q6_K")


@dataclass
class PrefillOptions:
    kernel: str = "auto"              # gpu.qmatmul's kernel for every q4_K / q6_K weight
    q6k_variant: dict = None          # template params of q6k_expb when the int8 family runs (default: gpu.gemm's)
    q4k_kdr: int = 8                  # q4k_nb staging depth when the int8 family runs (round 4's best)
    attn_f16: bool = False            # fp16 QK^T / PV (faster) instead of fp32
    fuse_f16: bool = True             # the norm / activation / attention feeding only wgmma_kq GEMMs writes fp16
                                      # itself (no separate f32 -> f16 pass; the same values)
    other_f16: bool = False           # fp16 cuBLAS for the dequantized-once weights instead of fp32
    attention: str = "auto"           # attention path: auto (cudnn when usable, else baseline, recorded) | cudnn |
                                      # torch | baseline (labkernels.attention)
    attn_dtype: str = "f16"           # input/output type of the cudnn / torch SDPA: f16 | bf16 (fp32 softmax)

    def __post_init__(self):
        self.q6k_variant = dict(self.q6k_variant or {})
        if self.kernel not in gpu.QMATMUL_KERNELS:
            raise ValueError(f"unknown GEMM kernel {self.kernel!r}: one of {', '.join(gpu.QMATMUL_KERNELS)}")
        if self.attention not in attention.BACKENDS:
            raise ValueError(f"unknown attention path {self.attention!r}: one of {', '.join(attention.BACKENDS)}")
        if self.attn_dtype not in attention.DTYPES:
            raise ValueError(f"unknown attention dtype {self.attn_dtype!r}: one of {', '.join(attention.DTYPES)}")


class Weight:
    """One weight on the GPU: a lab QWeight (k-quants) or a dequantized f32/f16 matrix."""

    def __init__(self, t, opts: PrefillOptions):
        cp = gpu.cp()
        self.name, self.qtype, self.shape = t.name, t.qtype, tuple(t.shape)
        if t.qtype in KQUANT and len(t.shape) == 2:
            t.require_kquant()
            self.q = gpu.QWeight.upload(np.asarray(t.raw()), t.qtype)
            self.dense = None
        else:
            arr = np.asarray(t.array(), np.float32)
            self.q = None
            self.dense = cp.asarray(arr.astype(np.float16) if (opts.other_f16 and arr.ndim == 2) else arr)

    @property
    def od(self):
        return self.shape[0]

    @property
    def id(self):
        return self.shape[-1]


class GpuModel:
    """A model resident on the GPU, ready for prefills."""

    def __init__(self, model, cfg: ModelConfig | None = None, opts: PrefillOptions | None = None):
        self.model = model
        self.cfg = cfg or config_from_model(model)
        self.opts = opts or PrefillOptions()
        if self.cfg.rope_freqs:
            raise NotImplementedError("llama3-style rope_freqs scaling is not implemented in the lab prefill")
        if self.cfg.final_logit_softcap:
            raise NotImplementedError("final logit softcapping is not implemented in the lab prefill")
        if self.cfg.attn_out_bias or self.cfg.ffn_bias or self.cfg.output_bias:
            raise NotImplementedError("attn_output / ffn / output biases are not implemented in the lab prefill")
        # the attention path (resolved once: auto -> cudnn or baseline, the reason kept in self.attn.note)
        self.attn = attention.make(self.opts.attention, self.cfg, f16=self.opts.attn_f16, dtype=self.opts.attn_dtype)
        t0 = time.time()
        self.layers = []
        for i in range(self.cfg.n_layer):
            self.layers.append({k: Weight(model.tensor(n), self.opts) for k, n in layer_tensors(self.cfg, i).items()})
        g = global_tensors(self.cfg)
        self.embd_name = g["token_embd"]
        emb = model.tensor(g["token_embd"])
        cp = gpu.cp()
        if emb.qtype in KQUANT:   # dequantize on the GPU with the lab's kernel
            qe = gpu.QWeight.upload(np.asarray(emb.raw()), emb.qtype)
            self.embd = gpu.dequant_f16(qe).astype(cp.float32)
            del qe
        else:
            self.embd = cp.asarray(np.asarray(emb.array(), np.float32))
        self.output_norm = Weight(model.tensor(g["output_norm"]), self.opts)
        out_name = g.get("output", g["token_embd"])
        self.head_name = out_name
        if out_name == g["token_embd"] and emb.qtype not in KQUANT:
            self.head = None      # tied: reuse the f32 embedding table
        else:
            self.head = Weight(model.tensor(out_name), self.opts)
        self.load_seconds = time.time() - t0
        self._used: list[str] = []

    # ---------------------------------------------------------------- building blocks
    def _k(self, fam, **p):
        return gpu.kernel(fam, **p)

    def rmsnorm(self, x, w, ncols=None, out16: bool = False):
        cp = gpu.cp()
        ncols = ncols or x.shape[-1]
        y = cp.empty(x.shape, cp.float16 if out16 else cp.float32)
        rows = x.size // ncols
        self._k("rmsnorm", W=1, OUT16=int(out16)).launch(
            (rows,), (x, w.dense, y, np.int32(ncols), np.float32(self.cfg.rms_eps)))
        return y

    def _f16_in(self, weights, n: int) -> bool:
        """True when every consumer of an activation is a wgmma_kq GEMM (it reads fp16): its producer then writes
        fp16 directly (PrefillOptions.fuse_f16)."""
        return self.opts.fuse_f16 and all(w.q is not None and self.family(w, n) == "wgmma_kq" for w in weights)

    def family(self, w: Weight, n: int) -> str:
        """The GEMM family a k-quant weight takes at n tokens (the auto choice, or the named kernel)."""
        if self.opts.kernel == "int8":
            return gpu._int8_default(w.qtype)[0]
        if self.opts.kernel != "auto":
            return self.opts.kernel
        return gpu.choose(w.qtype, n, w.od, w.id).family

    def _act(self, x, fam: str, box: dict, tr, layer, weight):
        """The activation form a family reads, made once per shared input (box): fp16 for wgmma_kq, q8_1 tiles
        for the int8 families."""
        cp = gpu.cp()
        if fam == "wgmma_kq":
            if x.dtype == cp.float16:       # its producer wrote fp16 already (fuse_f16)
                return x
            if "x16" not in box:
                with tr.op("act_f16", "prepass", layer=layer, weight=weight):
                    box["x16"] = x.astype(cp.float16)
            return box["x16"]
        if fam == "q6k_generic":
            return x
        if "planes" not in box:
            with tr.op("prepass", "prepass", layer=layer, weight=weight):
                box["planes"] = gpu.prepass(x)
        return box["planes"]

    def families_used(self) -> str:
        """Which GEMM families the k-quant weights took in the latest forward (e.g. 'wgmma_kq x 226')."""
        from collections import Counter

        c = Counter(self._used)
        return ", ".join(f"{k} x {v}" for k, v in sorted(c.items())) or "none"

    def _qmatmul(self, a, w: Weight, fam: str):
        self._used.append(fam)
        par = {}
        if fam == "q6k_expb":
            par = self.opts.q6k_variant
        elif fam == "q4k_nb":
            par = {"KDR": self.opts.q4k_kdr}
        return gpu.qmatmul(a, w.q, kernel=fam, **par)

    def matmul(self, x, w: Weight, box=None, tr=None, layer=None):
        """x [n, id] f32 -> [n, od] f32 with the weight's path (``box`` shares activation forms between calls)."""
        cp = gpu.cp()
        if w.q is not None:
            fam = self.family(w, x.shape[0])
            a = self._act(x, fam, {} if box is None else box, tr or NullTracer(), layer, w.name)
            return self._qmatmul(a, w, fam)
        if w.dense.dtype == cp.float16:
            return cp.matmul(x.astype(cp.float16), w.dense.T).astype(cp.float32)
        return cp.matmul(x, w.dense.T)

    def _gemm_class(self, w: Weight) -> str:
        return {"q6_K": "gemm_q6k", "q4_K": "gemm_q4k"}.get(w.qtype, f"gemm_other_{w.qtype}")

    def _linear(self, tr, name, layer, x, w: Weight, box: dict):
        """One projection, tagged for the trace; the activation form of x is shared by the k-quant weights."""
        n = x.shape[0]
        a = None
        if w.q is not None:
            fam = self.family(w, n)
            a = self._act(x, fam, box, tr, layer, w.name)
        with tr.op(name, self._gemm_class(w), layer=layer, weight=w.name, macs=n * w.od * w.id):
            y = self._qmatmul(a, w, fam) if a is not None else self.matmul(x, w)
        return y

    def attention(self, q, k, v, n, il, tr, out16: bool = False):
        """Causal (sliding-window on local layers) GQA attention of layer il; q [n, H*hd], k/v [n, Hkv*hd] (q
        pre-scaled) -> [n, H*hdv] (fp16 when out16) through the model's attention path (self.attn)."""
        return self.attn(q, k, v, n, il, tr, out16=out16)

    def rope(self, x, n, n_head, il):
        c = self.cfg
        half = c.n_rot // 2
        total = n * n_head * half
        self._k("rope", NEOX=int(c.rope_style == "neox")).launch(
            ((total + 255) // 256,), (x, np.int32(n), np.int32(n_head), np.int32(c.head_dim), np.int32(c.n_rot),
                                      np.int32(x.shape[1]), np.float32(c.rope_base_for(il)),
                                      np.float32(c.rope_scale_for(il)), np.int32(0)))

    # ---------------------------------------------------------------- the forward
    def forward(self, tokens, tracer=None, all_logits: bool = False):
        """Logits (cupy f32) of the last position [vocab] (or all positions [n, vocab])."""
        cp = gpu.cp()
        tr = tracer or NullTracer()
        c = self.cfg
        self._used = []
        toks = np.asarray(tokens, np.int32)
        if toks.ndim != 1 or toks.size < 1:
            raise ValueError("tokens must be a non-empty 1-D list of ids")
        if toks.min() < 0 or toks.max() >= c.vocab:
            raise ValueError(f"token ids must be in 0..{c.vocab - 1}")
        n = toks.size
        tok_g = cp.asarray(toks)
        x = cp.empty((n, c.n_embd), cp.float32)
        with tr.op("embed", "embed"):
            self._k("embed", F16=0).launch((n,), (self.embd, tok_g, x, np.int32(c.n_embd), np.float32(c.embed_scale)))
        for il, L in enumerate(self.layers):
            with tr.op("attn_norm", "norm", layer=il):
                h = self.rmsnorm(x, L["attn_norm"], out16=self._f16_in([L["attn_q"], L["attn_k"], L["attn_v"]], n))
            box: dict = {}
            q = self._linear(tr, "attn_q", il, h, L["attn_q"], box)
            k = self._linear(tr, "attn_k", il, h, L["attn_k"], box)
            v = self._linear(tr, "attn_v", il, h, L["attn_v"], box)
            if c.attn_bias:
                with tr.op("qkv_bias", "elementwise", layer=il):
                    q += L["attn_q_bias"].dense; k += L["attn_k_bias"].dense; v += L["attn_v_bias"].dense
            if c.qk_norm:
                with tr.op("qk_norm", "norm", layer=il):
                    q = self.rmsnorm(q, L["attn_q_norm"], c.head_dim)
                    k = self.rmsnorm(k, L["attn_k_norm"], c.head_dim)
            with tr.op("rope", "rope", layer=il):
                self.rope(q, n, c.n_head, il)
                self.rope(k, n, c.n_head_kv, il)
            if c.attn_scale != 1.0:
                with tr.op("q_scale", "elementwise", layer=il):
                    q *= np.float32(c.attn_scale)
            a = self.attention(q, k, v, n, il, tr, out16=self._f16_in([L["attn_output"]], n))
            a = self._linear(tr, "attn_output", il, a, L["attn_output"], {})
            if c.post_norms:
                with tr.op("post_attention_norm", "norm", layer=il):
                    a = self.rmsnorm(a, L["post_attention_norm"])
            with tr.op("residual", "elementwise", layer=il):
                x += a
            with tr.op("ffn_norm", "norm", layer=il):
                h = self.rmsnorm(x, L["ffn_norm"], out16=self._f16_in([L["ffn_gate"], L["ffn_up"]], n))
            box = {}
            gte = self._linear(tr, "ffn_gate", il, h, L["ffn_gate"], box)
            up = self._linear(tr, "ffn_up", il, h, L["ffn_up"], box)
            with tr.op("ffn_act", "activation", layer=il):
                out16 = self._f16_in([L["ffn_down"]], n)
                m = cp.empty(gte.shape, cp.float16 if out16 else cp.float32)
                act = 0 if c.ffn_act == "gelu_tanh" else 1
                self._k("act_mul", ACT=act, OUT16=int(out16)).launch(((gte.size + 255) // 256,),
                                                                     (gte, up, m, np.int64(gte.size)))
            d = self._linear(tr, "ffn_down", il, m, L["ffn_down"], {})
            if c.post_norms:
                with tr.op("post_ffw_norm", "norm", layer=il):
                    d = self.rmsnorm(d, L["post_ffw_norm"])
            with tr.op("residual", "elementwise", layer=il):
                x += d
        xs = x if all_logits else x[n - 1:]
        with tr.op("output_norm", "norm"):
            xs = self.rmsnorm(cp.ascontiguousarray(xs), self.output_norm)
        macs = xs.shape[0] * c.vocab * c.n_embd
        if self.head is None:
            with tr.op("output", "output_head", weight=self.head_name, macs=macs):
                logits = cp.matmul(xs, self.embd.T)
        else:
            box = {}
            if self.head.q is not None:
                self._act(xs, self.family(self.head, xs.shape[0]), box, tr, None, self.head_name)
            with tr.op("output", "output_head", weight=self.head_name, macs=macs):
                logits = self.matmul(xs, self.head, box)
        return logits if all_logits else logits[0]

    def greedy(self, prompt, n_new: int = 32) -> list[int]:
        """Greedy continuation by re-running the prefill on the growing sequence (no KV cache)."""
        seq = list(int(t) for t in prompt)
        out = []
        for _ in range(n_new):
            nxt = int(gpu.cp().asnumpy(gpu.cp().argmax(self.forward(seq))))
            out.append(nxt)
            seq.append(nxt)
        return out


def timed_prefill(gm: GpuModel, tokens, repeats: int = 3, warmup: int = 1) -> dict:
    """Wall time of whole prefills (host clock around a synchronized forward), median of repeats."""
    cp = gpu.cp()
    for _ in range(warmup):
        gm.forward(tokens)
    cp.cuda.runtime.deviceSynchronize()
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gm.forward(tokens)
        cp.cuda.runtime.deviceSynchronize()
        walls.append(time.perf_counter() - t0)
    w = float(np.median(walls))
    return {"n_tokens": len(tokens), "wall_ms": w * 1e3, "tok_per_s": len(tokens) / w,
            "wall_ms_all": [x * 1e3 for x in walls]}
