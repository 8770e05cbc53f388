"""A whole prefill on the GPU with the lab's kernels (llama-family and gemma3, from GGUF metadata).

Weights stay quantized on the GPU: q4_K / q6_K tensors go through :func:`labkernels.dispatch.qmatmul` (``kernel=``
``PrefillOptions.kernel``: ``auto`` picks round 7's ``wgmma_kq`` on sm_90 -- activations converted to fp16 once per
shared input -- or the int8 families ``q4k_nb`` / ``q6k_expb`` behind one q8_1 prepass per shared input, from the
recorded round-7 table); every other type (q5_0, q8_0, f16) is dequantized once at load
and multiplied with cuBLAS, fp16 on the tensor cores by default (``other_f16``; fp32 otherwise) ("gemm_other"
class). Attention (``PrefillOptions.attention``, see :mod:`labkernels.attention`) is by default ``lab+cudnn`` where
cuDNN's frontend is installed -- the lab's fused kernel (``kernels/flash_attn.cu``) where its launch splits over the
keys, cuDNN's fused SDPA elsewhere -- without it the lab's fused kernel alone where it takes every layer (fp16),
else, recorded in ``GpuModel.attn.note``, the lab's cuBLAS batched QK^T and PV
with its masked-softmax kernel (causal, sliding window on gemma3's local layers); ``"torch"`` runs PyTorch's SDPA
for comparison. Norms, RoPE, activations
and the embedding gather are the lab's kernels in ``kernels/prefill.cu``; each residual add is fused with the
RMSNorm after it (``add_rmsnorm``; ``PrefillOptions.fuse_add_norm=False``: a CuPy elementwise add, then the
norm), RoPE runs over Q and K in one launch with the attention scale folded in (``fuse_rope``). Only the last
position's logits are computed unless asked (as llama.cpp does).

CUDA graphs (``PrefillOptions.graph``): the whole forward is captured once per (model, nt, options) with CuPy
stream capture and replayed, so a prefill costs one graph launch instead of hundreds of Python-side kernel
launches. Every activation of a captured forward lives in a private memory pool kept with the graph (filled by
an eager warm-up on the capture stream, so the capture reuses its blocks), the token ids are copied into a
persistent input buffer before each replay, and the first replay is checked against the eager warm-up's logits.
Round 7's ``wgmma_kq`` launches encode the activation's TMA descriptor on the host at launch time: under capture
that is the pool buffer's pointer, which stays valid for every replay. Where capture fails the forward runs eager
and says why (``graph=None``, the default: recorded in ``GpuModel.graph_fallbacks`` and logged) or raises
(``graph=True``); ``GpuModel.last_mode`` says what ran.
The capture and replay are :class:`labkernels.prefill_replay.GraphReplay` (a base of :class:`GpuModel`), with
:func:`labkernels.prefill_replay.timed_prefill`.

Every op runs inside ``tracer.op(name, cls, ...)`` so round 5's :mod:`labkernels.rounds.r05_wall.decompose` can
attribute each kernel launch to its op, layer and weight tensor (a traced forward runs eager).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np

from . import attention, blas, decode, dispatch, errors, gpu, wgmma
from .kernels import registry
from .forward_common import GraphCaptureError, _c_contig, check_act_mul_gu
from .arch import ModelConfig, config_from_model, global_tensors, layer_tensors
from .prefill_replay import GraphReplay
from .trace import NullTracer

KQUANT = ("q4_K", "q6_K")
QKV = ("attn_q", "attn_k", "attn_v")
#: the PrefillOptions that fuse small kernels (to cut the prefill's host overhead); each computes the unfused ops'
#: values, and all of them off is the 'unfused' baseline of the step ``prefill_graph`` and the CLI's --no-fuse
FUSIONS = ("fuse_add_norm", "fuse_rope", "fuse_qkv", "fuse_qk_norm", "fuse_qkv16", "fuse_layout", "fuse_gate_up")


#: the most rows add_rmsnorm takes in its register form under PrefillOptions.norm_regs (the decode's 1..16 tokens):
#: from a wave of rows up (132 blocks on an H100) other blocks hide the loop's latency, and the register form's
#: registers (117 a thread at J=16) would cut the blocks an SM holds
NORM_REGS_MAX_ROWS = 16


@dataclass
class PrefillOptions:
    kernel: str = "auto"              # dispatch.qmatmul's kernel for every q4_K / q6_K weight
    q6k_variant: dict = None          # template params of q6k_expb when the int8 family runs (default: gpu.gemm's)
    q4k_kdr: int = registry.default_variant("q4k_nb").p["KDR"]   # q4k_nb staging depth when the int8 family runs
    attn_f16: bool = False            # fp16 QK^T / PV (faster) instead of fp32
    fuse_f16: bool = True             # the norm / activation / attention feeding only wgmma_kq GEMMs writes fp16
                                      # itself (no separate f32 -> f16 pass; the same values)
    other_f16: bool = True            # fp16 cuBLAS (tensor cores, fp32 accumulate) for the dequantized-once weights
                                      # (and a tied f32 output head) instead of fp32 SIMT GEMMs; the norms feeding
                                      # them write fp16. Gemma 3 270M's q5_0 / q8_0 Q/K/V and gate/up took 1.76 of
                                      # its 3.4 ms at nt=512 in fp32 (run 20261201T163853Z); in fp16 the forward is
                                      # 2.0x faster at nt=512, 3.3x at 3325, logits within 1.3e-3 of the fp32 path's
                                      # (run 20261201T180839Z). False: the exact float32 weights, as before
    attention: str = "auto"           # attention path: auto (lab+cudnn when both run, else cudnn, else baseline,
                                      # recorded) | lab+cudnn (the lab's kernel where its launch splits over the
                                      # keys, cuDNN elsewhere) | cudnn | lab (flash_attn.cu) | torch | baseline
                                      # (labkernels.attention)
    attn_dtype: str = "f16"           # input/output type of the cudnn / torch SDPA: f16 | bf16 (fp32 softmax)
    fuse_add_norm: bool = True        # residual add (+ gemma3's post-norm of the delta) and the next RMSNorm in
                                      # one kernel (add_rmsnorm; bitwise the unfused ops)
    fuse_rope: bool = True            # RoPE of Q and K (and the q scale) in one launch (rope_qk)
    fuse_qkv: bool = True             # Q, K, V projections that share a path as one GEMM on their stacked rows
    fuse_qk_norm: bool = True         # gemma3's per-head q and k RMSNorms in one launch (rmsnorm_qk)
    fuse_qkv16: bool = True           # with an fp16 attention path: RoPE, the q scale and the fp16 cast of Q, K, V
                                      # in one launch (rope_qkv16; no separate casts around attention)
    fuse_layout: bool = True          # attention's layout copies: transpose + cast in one pass (not two)
    fuse_gate_up: bool = True         # ffn_gate and ffn_up (same type and shape) as one GEMM on their stacked rows,
                                      # the activation reading its two halves (act_mul_gu)
    # three changes to the captured graph (its idle between nodes), on by default from 20261201T20 (prefill runs
    # 195305Z / 195405Z, with the lab+cudnn attention: Gemma 3 270M at nt=512 2.96% host with them, 5.74% without; the synthetic 7B
    # 4.86% / 4.49%, its walls within 0.2% of each other). Earlier runs (161416Z-163853Z, cuDNN attention) had found
    # pdl 0.5-4% slower on the 7B at nt=512. Gemma's graphs still refuse node removal (their one memset left at
    # nt=512 is cuBLAS's, before the output head: the lab attention has none)
    pdl: bool = True                  # the lab's kernels launch programmatically (PDL) in the captured graph: each
                                      # is scheduled while the kernel ahead of it finishes and waits for it on the
                                      # GPU (griddepcontrol.wait); eager forwards launch normally either way
    # (round 9 step 8's gemv_pf -- the decode graph's gemv_kq taking its PF=1 build, weight bytes prefetched into L2
    # before the PDL wait -- lost: 0.945 / 0.969 of PF=0's tokens/s, H100 run 20261207T195308Z-h10080gbhbm3-045babc;
    # it left with the build, commit 7894b07 holds it. PrefillOptions(gemv_pf=...) is a TypeError naming the field)
    norm_regs: bool = False           # round 9 step 10: add_rmsnorm (residual add + the next RMSNorm) at <= 16 rows
                                      # (NORM_REGS_MAX_ROWS) holds its row in registers (registry.norm_j: J elements
                                      # a thread, one round trip of loads) instead of its loop (16 dependent round
                                      # trips a pass at 4096 columns and one row: the decode step); the same bits.
                                      # Off until step 10's A/B measures it
    memsets_as_kernels: bool = True   # the graph's memset nodes (cuBLAS split-K counters, cuDNN's workspace flag)
                                      # become the lab's fill kernel with the same parameters
                                      # (graph_nodes.memsets_to_kernels; a graph whose nodes cannot be removed keeps
                                      # them, and says why in its record): a memset node costs ~5 us idle GPU
    ids_from_host: bool = True        # the graph's embedding reads the token ids from the pinned host buffer (no
                                      # host-to-device copy node at its start: ~31 us idle before the first kernel)
    graph: bool | None = None         # CUDA-graph capture of the whole forward per (model, nt, options): True =
                                      # required (a capture failure raises GraphCaptureError), False = eager,
                                      # None = graph where it captures, else eager with the reason recorded

    def __post_init__(self):
        self.q6k_variant = dict(self.q6k_variant or {})
        if self.kernel not in dispatch.QMATMUL_KERNELS:
            raise ValueError(f"unknown GEMM kernel {self.kernel!r}: one of {', '.join(dispatch.QMATMUL_KERNELS)}")
        if self.attention not in attention.BACKENDS:
            raise ValueError(f"unknown attention path {self.attention!r}: one of {', '.join(attention.BACKENDS)}")
        if self.attn_dtype not in attention.DTYPES:
            raise ValueError(f"unknown attention dtype {self.attn_dtype!r}: one of {', '.join(attention.DTYPES)}")
        if self.graph not in (None, True, False):
            raise ValueError(f"graph must be True, False or None (auto), got {self.graph!r}")

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name != "_key_cache":
            object.__setattr__(self, "_key_cache", None)      # any field set: the key is computed anew

    def key(self) -> tuple:
        """What the captured forward depends on: every option but ``graph`` itself (a graph cache key part).
        Cached until a field is set (or q6k_variant's items change in place): each graph replay asks for it, and
        building it costs more than the rest of the replay's Python (~4 of ~16 us on a CI core)."""
        c = self.__dict__.get("_key_cache")
        q6 = tuple(sorted(self.q6k_variant.items()))
        if c is not None and c[0] == q6:
            return c[1]
        k = tuple((f.name, _freeze(getattr(self, f.name))) for f in fields(self) if f.name != "graph")
        object.__setattr__(self, "_key_cache", (q6, k))
        return k


def _freeze(v):
    return tuple(sorted(v.items())) if isinstance(v, dict) else v


                                 # after the logits' copy, when GpuModel.stamp_replays asks (replay_breakdown)


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
            self.dense = cp.asarray(arr)     # float32, exact; fp16 on demand (dense16, PrefillOptions.other_f16)
        self._dense16 = None

    @classmethod
    def stacked(cls, a: "Weight", b: "Weight") -> "Weight | None":
        """One weight of a's rows then b's (two projections of the same input as one GEMM), or None when they
        differ in inner dimension or path, or (k-quants) in type; dequantized weights of one dtype stack whatever
        their GGUF types (the stacked type then names both, e.g. 'q5_0+q8_0')."""
        if a.shape[1:] != b.shape[1:] or len(a.shape) != 2 or (a.q is None) != (b.q is None):
            return None
        if a.q is not None and a.qtype != b.qtype:
            return None
        w = cls.__new__(cls)
        w._dense16 = None
        qt = a.qtype if a.qtype == b.qtype or b.qtype in a.qtype.split("+") else f"{a.qtype}+{b.qtype}"
        w.name, w.qtype, w.shape = f"{a.name}+{b.name}", qt, (a.shape[0] + b.shape[0], a.shape[1])
        if a.q is not None:
            if a.q.host is None or b.q.host is None:
                return None
            w.q = gpu.QWeight.upload(np.concatenate([np.asarray(a.q.host), np.asarray(b.q.host)]), a.qtype)
            w.dense = None
        else:
            w.q = None
            w.dense = gpu.cp().concatenate([a.dense, b.dense])
        return w

    def dense16(self):
        """The dequantized matrix in fp16 (made once, on first use; the float32 one stays the exact copy): what
        cuBLAS multiplies with PrefillOptions.other_f16, whatever the options were when the weight was loaded."""
        if self._dense16 is None:
            if self.dense is None or self.dense.ndim != 2:
                raise errors.ShapeError(f"{self.name}: only a dequantized 2-D weight has an fp16 copy")
            self._dense16 = self.dense.astype(gpu.cp().float16)
        return self._dense16

    @property
    def od(self):
        return self.shape[0]

    @property
    def id(self):
        return self.shape[-1]


class GpuModel(GraphReplay):
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
        # the attention path (resolved per attention option set: auto -> cudnn or baseline, the reason kept in
        # self.attn.note); the one of the construction options is resolved (and probed) here
        self._attns: dict = {}
        self.attn
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
        self._stacked: dict = {}             # layer -> its [gate; up] Weight (or None), made on first use
        self._graphs: dict = {}              # GraphKey -> GraphEntry
        self._graph_refused: dict = {}       # GraphKey -> why it runs eager (auto mode)
        self.graph_fallbacks: list[dict] = []
        self.last_mode: str | None = None    # 'graph' | 'eager': what the latest forward ran
        self.stamp_replays = False           # replays also stamp host clocks and two events around the launch
        self._last_stamps = None             # perf_counter s: replay entry, after the lookup, after the ids, before
                                             # the launch call, after it, after the logits' copy
        self.kv_sink = None                  # labkernels.decode: called (layer, k, v, n) after each layer's RoPE step of
                                             # an eager forward (the KV cache's fill); None (default): nothing

    # ---------------------------------------------------------------- building blocks
    def _k(self, fam, **p):
        return gpu.kernel(fam, **p)

    def rmsnorm(self, x, w, ncols=None, out16: bool = False):
        cp = gpu.cp()
        ncols = ncols or x.shape[-1]
        if not _c_contig(x) or str(x.dtype) != "float32" or x.size % ncols:
            raise errors.ShapeError(f"rmsnorm: x must be C-contiguous float32 rows of {ncols}, got {x.dtype} "
                                    f"{tuple(x.shape)} (contiguous {_c_contig(x)})")
        y = cp.empty(x.shape, cp.float16 if out16 else cp.float32)
        rows = x.size // ncols
        self._k("rmsnorm", W=1, OUT16=int(out16)).launch(
            (rows,), (x, w.dense, y, np.int32(ncols), np.float32(self.cfg.rms_eps)))
        return y

    def _f16_in(self, weights, n: int) -> bool:
        """True when every consumer of an activation reads fp16 -- a wgmma_kq GEMM, or cuBLAS on an fp16 weight
        (``other_f16``): its producer then writes fp16 directly (PrefillOptions.fuse_f16)."""
        return self.opts.fuse_f16 and all(
            (w.q is not None and self.family(w, n) == "wgmma_kq") or (w.q is None and self.opts.other_f16)
            for w in weights)

    def family(self, w: Weight, n: int) -> str:
        """The GEMM family a k-quant weight takes at n tokens (the auto choice, or the named kernel)."""
        if self.opts.kernel == "int8":
            return dispatch._int8_default(w.qtype)[0]
        if self.opts.kernel != "auto":
            return self.opts.kernel
        return dispatch.choose(w.qtype, n, w.od, w.id).family

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
        return dispatch.qmatmul(a, w.q, kernel=fam, **par)

    def matmul(self, x, w: Weight, box=None, tr=None, layer=None):
        """x [n, id] f32 -> [n, od] f32 with the weight's path (``box`` shares activation forms between calls)."""
        cp = gpu.cp()
        if w.q is not None:
            fam = self.family(w, x.shape[0])
            a = self._act(x, fam, {} if box is None else box, tr or NullTracer(), layer, w.name)
            return self._qmatmul(a, w, fam)
        # raw cuBLAS (blas.gemm_dense): cupy.matmul refuses to run under CUDA-graph capture
        if self.opts.other_f16:     # (an fp16 x comes from a producer that wrote it: no second cast)
            return blas.gemm_dense(cp.ascontiguousarray(x, dtype=cp.float16), w.dense16())
        return blas.gemm_dense(cp.ascontiguousarray(x, dtype=cp.float32), w.dense)

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

    @property
    def attn(self) -> attention.Backend:
        """The attention backend of the current options (``opts.attention``, ``attn_f16``, ``attn_dtype``,
        ``fuse_layout``), made and probed on first use of that option set and kept: a variant that switches
        ``opts.attention`` runs that path (and its graph, keyed on the options, is its own)."""
        o = self.opts
        key = (o.attention, o.attn_f16, o.attn_dtype, o.fuse_layout)
        b = self._attns.get(key)
        if b is None:
            b = self._attns[key] = attention.make(o.attention, self.cfg, f16=o.attn_f16, dtype=o.attn_dtype,
                                                  fuse_layout=o.fuse_layout)
        return b

    @attn.setter
    def attn(self, backend: attention.Backend):
        """Install ``backend`` as the attention path of the current attention options (tests, experiments)."""
        o = self.opts
        self._attns[(o.attention, o.attn_f16, o.attn_dtype, o.fuse_layout)] = backend

    def attention(self, q, k, v, n, il, tr, out16: bool = False):
        """Causal (sliding-window on local layers) GQA attention of layer il; q [n, H*hd], k/v [n, Hkv*hd] (q
        pre-scaled) -> [n, H*hdv] (fp16 when out16) through the model's attention path (self.attn)."""
        return self.attn(q, k, v, n, il, tr, out16=out16)

    def rmsnorm_qk(self, q, k, L):
        """gemma3's q and k norms (per head, over head_dim) in one launch; q/k may be row views of the stacked QKV
        output -> C-contiguous f32 copies normed."""
        cp = gpu.cp()
        c = self.cfg
        check_rows(q, "rmsnorm_qk q", c.n_head * c.head_dim)
        n = q.shape[0]
        check_rows(k, "rmsnorm_qk k", c.n_head_kv * c.head_dim, n)
        yq = cp.empty((n, c.n_head * c.head_dim), cp.float32)
        yk = cp.empty((n, c.n_head_kv * c.head_dim), cp.float32)
        self._k("rmsnorm_qk").launch((n * (c.n_head + c.n_head_kv),), (
            q, k, L["attn_q_norm"].dense, L["attn_k_norm"].dense, yq, yk, np.int32(c.n_head), np.int32(c.n_head_kv),
            np.int32(c.head_dim), np.int32(_ld(q)), np.int32(_ld(k)), np.float32(c.rms_eps)))
        return yq, yk

    def qkv_groups(self, il: int) -> list:
        """Layer il's Q, K, V projections as [(weight, names)]: with fuse_qkv neighbours that share a path stacked
        into one weight (Q+K+V, Q+K, or none), made on first use."""
        L = self.layers[il]
        if not self.opts.fuse_qkv:
            return [(L[nm], (nm,)) for nm in QKV]
        key = ("qkv", il)
        if key not in self._stacked:
            groups, cur, names = [], L[QKV[0]], [QKV[0]]
            for nm in QKV[1:]:
                st = Weight.stacked(cur, L[nm])
                if st is None:
                    groups.append((cur, tuple(names)))
                    cur, names = L[nm], [nm]
                else:
                    cur, names = st, names + [nm]
            groups.append((cur, tuple(names)))
            self._stacked[key] = groups
        return self._stacked[key]

    def _qkv(self, tr, il, h, L, n):
        """q, k, v of layer il (f32 [n, width]; row views of one output where the projections were stacked)."""
        box = {}
        return self.qkv_from(il, L, lambda w, names: self._linear(tr, "+".join(names), il, h, w, box))

    def qkv_from(self, il, L, project):
        """q, k, v of layer il from ``project(weight, names)`` run once per group of :meth:`qkv_groups` (a stacked
        group's output split into column views of each projection's width) -- shared by the prefill and the decode
        step."""
        out = {}
        for w, names in self.qkv_groups(il):
            y = project(w, names)
            off = 0
            for nm in names:
                od = L[nm].od
                out[nm] = y if len(names) == 1 else y[:, off:off + od]
                off += od
        return out["attn_q"], out["attn_k"], out["attn_v"]

    def _rope(self, tr, il, q, k, v, n, qkv16: bool, fold_scale: bool):
        """RoPE of layer il: with the q scale and the fp16 casts (qkv16), rope_qk (the scale folded when every dim
        rotates) or two rope launches -> q, k, v."""
        c = self.cfg
        with tr.op("rope", "rope", layer=il):
            if qkv16:       # rope + q scale + the fp16 cast the attention would do: one launch
                return self.rope_qkv16(q, k, v, n, il, qscale=c.attn_scale)
            if self.opts.fuse_rope:
                self.rope_qk(q, k, n, il, qscale=c.attn_scale if fold_scale else 1.0)
            else:
                self.rope(q, n, c.n_head, il)
                self.rope(k, n, c.n_head_kv, il)
        return q, k, v

    def qk_norm_rope_qkv16(self, q, k, v, L, n, il, qscale: float = 1.0):
        """gemma3's q/k norms, then rope_qkv16's RoPE, q scale and fp16 casts, in one launch (fuse_qk_norm with
        fuse_qkv16) -> fp16 C-contiguous q16, k16, v16."""
        cp = gpu.cp()
        c = self.cfg
        check_rope_qkv16(q, k, v, n, c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.n_rot)
        if c.head_dim > registry.QKNORM_MAXHD:
            raise errors.ShapeError(f"qk_norm_rope_qkv16: head_dim {c.head_dim} > {registry.QKNORM_MAXHD} (the row it "
                                    "stages in shared memory); run with fuse_qk_norm=False")
        q16, k16, v16 = self._qkv16_out(n)
        self._k("qk_norm_rope_qkv16", NEOX=int(c.rope_style == "neox")).launch(
            (n * (c.n_head + 2 * c.n_head_kv),),
            (q, k, v, L["attn_q_norm"].dense, L["attn_k_norm"].dense, q16, k16, v16, np.int32(c.n_head),
             np.int32(c.n_head_kv), np.int32(c.head_dim), np.int32(c.head_dim_v), np.int32(c.n_rot),
             np.int32(_ld(q)), np.int32(_ld(k)), np.int32(_ld(v)), np.float32(c.rms_eps),
             np.float32(c.rope_base_for(il)), np.float32(c.rope_scale_for(il)), np.int32(0), np.float32(qscale)))
        return q16, k16, v16

    def rope(self, x, n, n_head, il):
        c = self.cfg
        half = c.n_rot // 2
        check_rows(x, "rope x", n_head * c.head_dim, n)
        total = n * n_head * half
        self._k("rope", NEOX=int(c.rope_style == "neox")).launch(
            ((total + 255) // 256,), (x, np.int32(n), np.int32(n_head), np.int32(c.head_dim), np.int32(c.n_rot),
                                      np.int32(_ld(x)), np.float32(c.rope_base_for(il)),
                                      np.float32(c.rope_scale_for(il)), np.int32(0)))

    def rope_qk(self, q, k, n, il, qscale: float = 1.0):
        """RoPE of q [n, n_head*hd] and k [n, n_head_kv*hd] in place, one launch; ``qscale`` (the attention scale)
        multiplies the rotated q, which needs every q dim rotated (n_rot == head_dim)."""
        c = self.cfg
        check_rope_qk(q, k, n, c.n_head, c.n_head_kv, c.head_dim, c.n_rot, qscale)
        total = n * (c.n_head + c.n_head_kv) * (c.n_rot // 2)
        self._k("rope_qk", NEOX=int(c.rope_style == "neox")).launch(
            ((total + 255) // 256,), (q, k, np.int32(n), np.int32(c.n_head), np.int32(c.n_head_kv),
                                      np.int32(c.head_dim), np.int32(c.n_rot), np.int32(_ld(q)),
                                      np.int32(_ld(k)), np.float32(c.rope_base_for(il)),
                                      np.float32(c.rope_scale_for(il)), np.int32(0), np.float32(qscale)))

    def _qkv16_out(self, n: int):
        """The C-contiguous fp16 q16 [n, n_head*hd], k16 [n, n_head_kv*hd], v16 [n, n_head_kv*hd_v] an fp16
        attention path reads."""
        cp = gpu.cp()
        c = self.cfg
        return tuple(cp.empty((n, w), cp.float16) for w in (c.n_head * c.head_dim, c.n_head_kv * c.head_dim,
                                                             c.n_head_kv * c.head_dim_v))

    def rope_qkv16(self, q, k, v, n, il, qscale: float = 1.0):
        """rope_qk on q and k, q times ``qscale``, and the fp16 cast of q, k and v in one launch (fuse_qkv16):
        fp16 C-contiguous (q16 [n, n_head*hd], k16 [n, n_head_kv*hd], v16 [n, n_head_kv*hd_v])."""
        cp = gpu.cp()
        c = self.cfg
        check_rope_qkv16(q, k, v, n, c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.n_rot)
        q16, k16, v16 = self._qkv16_out(n)
        total = n * ((c.n_head + c.n_head_kv) * (c.head_dim // 2) + c.n_head_kv * (c.head_dim_v // 2))
        self._k("rope_qkv16", NEOX=int(c.rope_style == "neox")).launch(
            ((total + 255) // 256,), (q, k, v, q16, k16, v16, np.int32(n), np.int32(c.n_head), np.int32(c.n_head_kv),
                                      np.int32(c.head_dim), np.int32(c.head_dim_v), np.int32(c.n_rot),
                                      np.int32(_ld(q)), np.int32(_ld(k)), np.int32(_ld(v)),
                                      np.float32(c.rope_base_for(il)), np.float32(c.rope_scale_for(il)), np.int32(0),
                                      np.float32(qscale)))
        return q16, k16, v16

    def add_rmsnorm(self, x, delta, w: Weight, pre: Weight | None = None, out16: bool = False):
        """x += (rmsnorm(delta) * pre if pre else delta) in place, then rmsnorm(x) * w: one launch (the register form
        of the row, bitwise the loop's, under PrefillOptions.norm_regs: round 9 step 10)."""
        cp = gpu.cp()
        check_add_rmsnorm(x, delta, w.dense, None if pre is None else pre.dense)
        y = cp.empty(x.shape, cp.float16 if out16 else cp.float32)
        j = registry.norm_j(x.shape[1]) if self.opts.norm_regs and x.shape[0] <= NORM_REGS_MAX_ROWS else 0
        self._k("add_rmsnorm", PRE=int(pre is not None), OUT16=int(out16), J=j).launch(
            (x.shape[0],), (x, delta, (pre if pre is not None else w).dense, w.dense, y, np.int32(x.shape[1]),
                            np.float32(self.cfg.rms_eps)))
        return y

    def gate_up(self, il: int) -> Weight | None:
        """Layer il's stacked [ffn_gate; ffn_up] weight (PrefillOptions.fuse_gate_up), made on first use; None when
        the two cannot share one GEMM (their types differ)."""
        if il not in self._stacked:
            L = self.layers[il]
            self._stacked[il] = Weight.stacked(L["ffn_gate"], L["ffn_up"])
        return self._stacked[il]

    def _ffn_in(self, tr, il, h, L, n):
        """act(gate(h)) * up(h): two GEMMs and act_mul, or one GEMM on the stacked weight and act_mul_gu."""
        cp = gpu.cp()
        c = self.cfg
        gu = self.gate_up(il) if self.opts.fuse_gate_up else None
        act = 0 if c.ffn_act == "gelu_tanh" else 1
        out16 = self._f16_in([L["ffn_down"]], n)
        if gu is not None:
            y = self._linear(tr, "ffn_gate_up", il, h, gu, {})
            with tr.op("ffn_act", "activation", layer=il):
                n_ff = gu.od // 2
                m = cp.empty((n, n_ff), cp.float16 if out16 else cp.float32)
                check_act_mul_gu(y, m, n_ff)
                self._k("act_mul_gu", ACT=act, OUT16=int(out16)).launch(((m.size + 255) // 256,),
                                                                        (y, m, np.int32(n_ff), np.int64(m.size)))
            return m
        box: dict = {}
        gte = self._linear(tr, "ffn_gate", il, h, L["ffn_gate"], box)
        up = self._linear(tr, "ffn_up", il, h, L["ffn_up"], box)
        with tr.op("ffn_act", "activation", layer=il):
            m = cp.empty(gte.shape, cp.float16 if out16 else cp.float32)
            self._k("act_mul", ACT=act, OUT16=int(out16)).launch(((gte.size + 255) // 256,),
                                                                 (gte, up, m, np.int64(gte.size)))
        return m

    def _ffn_in_weights(self, il: int) -> list:
        gu = self.gate_up(il) if self.opts.fuse_gate_up else None
        L = self.layers[il]
        return [gu] if gu is not None else [L["ffn_gate"], L["ffn_up"]]

    def _residual_norm(self, tr, name, il, x, pend, w: Weight, out16: bool = False):
        """The norm before a block: x += the pending delta (RMS-normed first by gemma3's post-norm), then
        rmsnorm(x) * w -- fused (PrefillOptions.fuse_add_norm) or as the three separate ops."""
        if pend is None:
            with tr.op(name, "norm", layer=il):
                return self.rmsnorm(x, w, out16=out16)
        delta, pre, pre_name = pend
        if self.opts.fuse_add_norm:
            with tr.op(name + "+residual", "norm", layer=il):
                return self.add_rmsnorm(x, delta, w, pre, out16=out16)
        if pre is not None:
            with tr.op(pre_name, "norm", layer=il):
                delta = self.rmsnorm(delta, pre)
        with tr.op("residual", "elementwise", layer=il):
            x += delta
        with tr.op(name, "norm", layer=il):
            return self.rmsnorm(x, w, out16=out16)

    # ---------------------------------------------------------------- the forward
    def _tokens(self, tokens) -> np.ndarray:
        toks = np.asarray(tokens, np.int32)
        if toks.ndim != 1 or toks.size < 1:
            raise ValueError("tokens must be a non-empty 1-D list of ids")
        if toks.min() < 0 or toks.max() >= self.cfg.vocab:
            raise ValueError(f"token ids must be in 0..{self.cfg.vocab - 1}")
        return toks

    def forward(self, tokens, tracer=None, all_logits: bool = False, graph: bool | None = "opts"):
        """Logits (cupy f32) of the last position [vocab] (or all positions [n, vocab]).

        ``graph`` (default: ``PrefillOptions.graph``): replay a CUDA graph of the whole forward captured for this
        (model, nt, options), capturing it on first use (see :meth:`_forward_graph`); a traced forward always
        runs eager (the tracer tags each op's launches). :attr:`last_mode` says which ran ('graph' | 'eager')."""
        toks = self._tokens(tokens)
        want = self.opts.graph if graph == "opts" else graph
        if want is not None and want not in (True, False):
            raise ValueError(f"graph must be True, False or None (auto), got {want!r}")
        if tracer is not None and getattr(tracer, "active", False):
            if want is True:
                raise GraphCaptureError("a traced forward runs eager (graph=True asked for a replay)")
            want = False
        if self.kv_sink is not None:     # a forward filling a KV cache runs eager (a replayed graph would skip it)
            if want is True:
                raise GraphCaptureError("a forward that fills a KV cache (kv_sink) runs eager (graph=True asked for "
                                        "a replay)")
            want = False
        if want is False:
            self.last_mode = "eager"
            return self._forward_eager(toks, tracer, all_logits)
        try:
            out = self._forward_graph(toks, all_logits)
        except GraphCaptureError as e:
            if want is True:
                raise
            key = self.graph_key(toks.size, all_logits)
            if key not in self._graph_refused:     # recorded once per key; later forwards go eager directly
                self._record_fallback(key, str(e))
            self.last_mode = "eager"
            return self._forward_eager(toks, tracer, all_logits)
        self.last_mode = "graph"
        return out

    def _forward_eager(self, toks, tracer, all_logits):
        self._used = []
        return self._forward_device(gpu.cp().asarray(toks), toks.size, tracer or NullTracer(), all_logits)

    def _forward_device(self, tok_g, n: int, tr, all_logits: bool):
        """The forward from token ids the GPU can read -- a device int32 array, or (a captured graph with
        ``ids_from_host``) the device address of the pinned host buffer as np.uint64: kernel launches only (no host
        <-> device copies and no synchronization), so that it can be captured into a CUDA graph."""
        cp = gpu.cp()
        c = self.cfg
        x = cp.empty((n, c.n_embd), cp.float32)
        with tr.op("embed", "embed"):
            self._k("embed", F16=0).launch((n,), (self.embd, tok_g, x, np.int32(c.n_embd), np.float32(c.embed_scale)))
        pend = None        # (delta, post-norm weight or None, its op name): added to x before the next norm
        fold_scale = self.opts.fuse_rope and c.attn_scale != 1.0 and c.n_rot == c.head_dim
        for il, L in enumerate(self.layers):
            h = self._residual_norm(tr, "attn_norm", il, x, pend, L["attn_norm"],
                                    out16=self._f16_in([w for w, _ in self.qkv_groups(il)], n))
            q, k, v = self._qkv(tr, il, h, L, n)
            if c.attn_bias:
                with tr.op("qkv_bias", "elementwise", layer=il):
                    q += L["attn_q_bias"].dense; k += L["attn_k_bias"].dense; v += L["attn_v_bias"].dense
            qkv16 = self.opts.fuse_qkv16 and self.attn.takes_f16
            one = qkv16 and c.qk_norm and self.opts.fuse_qk_norm     # norms + rope + scale + casts: one launch
            if one:
                with tr.op("qk_norm+rope", "rope", layer=il):
                    q, k, v = self.qk_norm_rope_qkv16(q, k, v, L, n, il, qscale=c.attn_scale)
            elif c.qk_norm:
                with tr.op("qk_norm", "norm", layer=il):
                    if self.opts.fuse_qk_norm:
                        q, k = self.rmsnorm_qk(q, k, L)
                    else:        # rmsnorm reads whole rows: views of a stacked output are copied first
                        q = self.rmsnorm(cp.ascontiguousarray(q), L["attn_q_norm"], c.head_dim)
                        k = self.rmsnorm(cp.ascontiguousarray(k), L["attn_k_norm"], c.head_dim)
            if not one:
                q, k, v = self._rope(tr, il, q, k, v, n, qkv16, fold_scale)
            if c.attn_scale != 1.0 and not fold_scale and not qkv16:
                with tr.op("q_scale", "elementwise", layer=il):
                    q *= np.float32(c.attn_scale)
            if self.kv_sink is not None:      # k, v after RoPE: [n, n_head_kv*head_dim(_v)], f32 rows or fp16
                self.kv_sink(il, k, v, n)
            a = self.attention(q, k, v, n, il, tr, out16=self._f16_in([L["attn_output"]], n))
            a = self._linear(tr, "attn_output", il, a, L["attn_output"], {})
            pend = (a, L["post_attention_norm"] if c.post_norms else None, "post_attention_norm")
            h = self._residual_norm(tr, "ffn_norm", il, x, pend, L["ffn_norm"],
                                    out16=self._f16_in(self._ffn_in_weights(il), n))
            m = self._ffn_in(tr, il, h, L, n)
            d = self._linear(tr, "ffn_down", il, m, L["ffn_down"], {})
            pend = (d, L["post_ffw_norm"] if c.post_norms else None, "post_ffw_norm")
        if all_logits:
            xs = self._residual_norm(tr, "output_norm", None, x, pend, self.output_norm)
        else:   # only the last row of the residual stream is needed
            d, pre, pre_name = pend
            xs = self._residual_norm(tr, "output_norm", None, x[n - 1:], (d[n - 1:], pre, pre_name), self.output_norm)
        macs = xs.shape[0] * c.vocab * c.n_embd
        if self.head is None:
            with tr.op("output", "output_head", weight=self.head_name, macs=macs):
                # tied embeddings (Gemma): raw cuBLAS, capturable (cupy.matmul refuses under CUDA-graph capture);
                # with other_f16 on the table's fp16 copy (half the bytes of the forward's largest read)
                if self.opts.other_f16:
                    logits = blas.gemm_dense(cp.ascontiguousarray(xs, dtype=cp.float16), self.embd16())
                else:
                    logits = blas.gemm_dense(cp.ascontiguousarray(xs, dtype=cp.float32), self.embd)
        else:
            box = {}
            if self.head.q is not None:
                self._act(xs, self.family(self.head, xs.shape[0]), box, tr, None, self.head_name)
            with tr.op("output", "output_head", weight=self.head_name, macs=macs):
                logits = self.matmul(xs, self.head, box)
        return logits if all_logits else logits[0]

    def _prepare(self, n: int, all_logits: bool) -> None:
        """Make the lazily built per-weight state (round 7's repacked weights) outside the graph's private pool."""
        ws = []
        for il, L in enumerate(self.layers):      # the weights this forward multiplies by
            ws += [w for k, w in L.items() if k not in ("ffn_gate", "ffn_up") + QKV] + self._ffn_in_weights(il)
            ws += [w for w, _ in self.qkv_groups(il)]
        for w in (w for w in ws if w.q is not None):
            self._wg_ready(w, n)
        if self.opts.other_f16:      # the fp16 copies of the dequantized weights: made here, not in the graph's pool
            for w in (w for w in ws if w.q is None and w.dense.ndim == 2):
                w.dense16()
            if self.head is None:
                self.embd16()
        if self.head is not None and self.head.q is not None:
            self._wg_ready(self.head, n if all_logits else 1)

    def embd16(self):
        """The tied output head's fp16 copy of the f32 embedding table (made once; other_f16)."""
        if getattr(self, "_embd16", None) is None:
            self._embd16 = self.embd.astype(gpu.cp().float16)
        return self._embd16

    def _wg_ready(self, w: Weight, n: int) -> None:
        if self.family(w, n) == "wgmma_kq" and w.q.wg is None and w.q.host is not None:
            w.q.wg = wgmma.WgWeight.from_gguf(np.asarray(w.q.host), w.q.qtype)

    def generate(self, prompt_ids, n_new: int, sampler: str = "greedy", n_ctx: int | None = None,
                 graph: bool | None = "opts") -> list[int]:
        """``n_new`` tokens after ``prompt_ids`` with a KV cache: the prefill fills the cache, then one decode step
        per token, captured once as a CUDA graph and replayed (:func:`labkernels.decode.generate`)."""
        return decode.generate(self, prompt_ids, n_new, sampler=sampler, n_ctx=n_ctx, graph=graph)

    def greedy(self, prompt, n_new: int = 32) -> list[int]:
        """Greedy continuation by re-running the prefill on the growing sequence (no KV cache)."""
        seq = list(int(t) for t in prompt)
        out = []
        for _ in range(n_new):
            nxt = int(gpu.cp().asnumpy(gpu.cp().argmax(self.forward(seq, graph=False))))   # a new nt per step
            out.append(nxt)
            seq.append(nxt)
        return out


def _rows_contig(a) -> bool:
    """A 2-D array whose rows are contiguous (a C-contiguous one, or a column range of one): what the kernels
    that take a row stride read."""
    return a.ndim == 2 and (a.shape[1] <= 1 or a.strides[1] == a.itemsize) and a.strides[0] % a.itemsize == 0 \
        and a.strides[0] >= a.shape[1] * a.itemsize


def _ld(a) -> int:
    """The row stride of a 2-D array in elements."""
    return int(a.strides[0] // a.itemsize)


def check_rows(a, what: str, width: int, n: int | None = None) -> None:
    """a: float32 [n, >= width] with contiguous rows (a row stride is fine). Raises errors.ShapeError."""
    if a.ndim != 2 or str(a.dtype) != "float32" or not _rows_contig(a):
        raise errors.ShapeError(f"{what} must be float32 [n, {width}] with contiguous rows, got {a.dtype} "
                                f"{tuple(a.shape)} strides {tuple(a.strides)}")
    if a.shape[1] < width or (n is not None and a.shape[0] != n):
        raise errors.ShapeError(f"{what} {tuple(a.shape)} does not hold {n if n is not None else 'n'} tokens x {width}")


def check_add_rmsnorm(x, delta, w, pre=None) -> None:
    """add_rmsnorm's arguments: x and delta f32 [rows, ncols], C-contiguous, the same shape; w (and pre) f32
    [ncols]. Raises errors.ShapeError."""
    if x.ndim != 2 or str(x.dtype) != "float32" or not _c_contig(x):
        raise errors.ShapeError(f"add_rmsnorm: x must be C-contiguous float32 [rows, ncols], got {x.dtype} {x.shape}")
    if tuple(delta.shape) != tuple(x.shape) or str(delta.dtype) != "float32" or not _c_contig(delta):
        raise errors.ShapeError(f"add_rmsnorm: delta must be C-contiguous float32 {tuple(x.shape)}, got "
                                f"{delta.dtype} {tuple(delta.shape)}")
    for what, v in (("w", w), ("pre", pre)):
        if v is not None and (tuple(v.shape) != (x.shape[1],) or str(v.dtype) != "float32"):
            raise errors.ShapeError(f"add_rmsnorm: {what} must be float32 [{x.shape[1]}], got {v.dtype} {tuple(v.shape)}")





def check_rope_qkv16(q, k, v, n: int, n_head: int, n_head_kv: int, head_dim: int, head_dim_v: int,
                     n_rot: int) -> None:
    """rope_qkv16's arguments: q, k as rope_qk takes them, v f32 [n, >= n_head_kv*head_dim_v] C-contiguous rows;
    head_dim and head_dim_v even (the kernel moves pairs). Raises errors.ShapeError."""
    check_rope_qk(q, k, n, n_head, n_head_kv, head_dim, n_rot, 1.0)
    check_rows(v, "rope_qkv16: v", n_head_kv * head_dim_v, n)
    if head_dim % 2 or head_dim_v % 2:
        raise errors.ShapeError(f"rope_qkv16: head_dim={head_dim} and head_dim_v={head_dim_v} must be even")


def check_rope_qk(q, k, n: int, n_head: int, n_head_kv: int, head_dim: int, n_rot: int, qscale: float) -> None:
    """rope_qk's arguments: q f32 [n, >= n_head*head_dim], k f32 [n, >= n_head_kv*head_dim], C-contiguous rows;
    0 < n_rot <= head_dim, even; a q scale != 1 only when every dim is rotated. Raises errors.ShapeError."""
    for what, a, nh in (("q", q, n_head), ("k", k, n_head_kv)):
        check_rows(a, f"rope_qk: {what}", nh * head_dim, n)
    if n_rot <= 0 or n_rot % 2 or n_rot > head_dim:
        raise errors.ShapeError(f"rope_qk: n_rot={n_rot} must be even and in 1..head_dim={head_dim}")
    if qscale != 1.0 and n_rot != head_dim:
        raise errors.ShapeError(f"rope_qk: the q scale is applied to rotated dims only; n_rot={n_rot} < "
                                f"head_dim={head_dim} needs the separate q scale")
