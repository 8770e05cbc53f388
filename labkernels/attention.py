"""Attention of the prefill: the lab's baseline, cuDNN's fused SDPA, and PyTorch's SDPA (for comparison).

``PrefillOptions(attention=...)`` picks the path (:func:`make`):

* ``"cudnn"`` -- one fused FlashAttention-class kernel per layer: cuDNN's scaled-dot-product attention through the
  ``nvidia-cudnn-frontend`` Python graph API. q / k / v stay in the prefill's token-major layout ([n, heads*d], read
  as BSHD strides, no copy); they are converted to fp16 (or bf16, ``attn_dtype``) in one pass each; the output is
  written in the layout ``attn_output`` reads ([n, n_head*d_v]), fp16 (what a ``wgmma_kq`` consumer takes directly).
  Masks: causal (``diagonal_band_right_bound=0``, top-left) and, on Gemma 3's sliding layers, the window as
  ``diagonal_band_left_bound=window`` (cuDNN masks key j for query i when j <= i - left_bound, i.e. a query sees its
  ``window`` most recent positions itself included -- llama.cpp's ``p1 - p0 >= n_swa`` rule). Grouped-query heads
  are K/V tensors with fewer heads; the softmax scale is ``attn_scale`` (the prefill passes 1.0: it multiplies q
  by the architecture's scale before attention, as llama.cpp's graphs do -- Gemma's query_pre_attn_scalar
  included); fp32 softmax statistics and accumulation. One graph per (tokens, layer kind, dtype) is built on first
  use and cached with its workspace.
* ``"torch"`` -- ``torch.nn.functional.scaled_dot_product_attention`` on the same CuPy buffers through DLPack (no
  copy in; the output is permuted back into [n, heads*d]); the sliding window goes as a boolean mask (which keeps
  PyTorch off its FlashAttention backend); the backend PyTorch picks is reported (:meth:`Torch.backend`).
* ``"baseline"`` -- the lab's path: cuBLAS batched QK^T and PV around the lab's masked-softmax kernel over the
  materialized [heads, n, n] scores (fp32, or fp16 with ``attn_f16``).
* ``"lab"`` -- the lab's fused kernel (``kernels/flash_attn.cu``): FlashAttention-2 on mma.sync f16 with fp32
  softmax, one launch per layer without workspace or memset node, split over the keys (chunk states merged by the
  last-arriving CTA) when the grid has few query-block CTAs (:class:`Lab`).
* ``"lab+cudnn"`` -- per launch the lab's kernel where its launch is split over the keys, cuDNN elsewhere
  (:class:`Routed`).
* ``"auto"`` (default) -- ``lab+cudnn`` when the frontend imports on a CUDA machine and every layer kind passes both
  paths' support checks (``cudnn`` when only cuDNN's pass); without a usable cuDNN, ``lab`` where the lab's kernel
  takes every layer kind and the attention is fp16 (``attn_f16``; it beat the baseline at every point of run
  20261201T194347Z, and a graph can capture it), else ``baseline``; the reason is logged (logger ``labkernels.attention``) and kept in
  ``backend.note`` (recorded by the prefill / decomposition runs). An explicit ``"cudnn"`` that cannot run is an
  error (:class:`AttentionUnavailable`), never a silent fallback; a layer shape or mask the chosen path cannot take
  is an :class:`AttentionError` naming the layer and the mask. When a model is set up, a fused path runs each of
  its layer kinds once on 64 tokens against the float64 reference (:meth:`Backend.probe`): a decline or a wrong
  number there is caught before any prefill (``auto``: the baseline, with the reason; requested: the error).

What one layer's attention computes (:class:`LayerKind`), its FLOPs, the float64 reference, each path's support checks
and the errors are :mod:`labkernels.attention_kinds` (no GPU needed); which libraries this machine can use and what they
loaded (cuDNN's frontend and libcudnn, PyTorch: :func:`import_cudnn`, :func:`cudnn_info`, :func:`status`,
:func:`import_torch`) are :mod:`labkernels.attention_libs`; this module holds the paths and their choice.
"""

from __future__ import annotations

import logging

import numpy as np

from . import blas, gpu, graph_nodes
from .attention_kinds import (AttentionError, AttentionUnavailable, LayerKind, as_f64, attention_flops, check_kind,
                              cudnn_problems, describe_layers, lab_heads_per_cta, lab_problems, layer_kind, model_kinds,
                              sdpa_ref)
# which libraries this machine can use (attention_libs); status is re-exported for callers of attention.status()
from .attention_libs import _gpu_ok, cudnn_info, import_cudnn, import_torch, status  # noqa: F401

log = logging.getLogger("labkernels.attention")

BACKENDS = ("auto", "lab+cudnn", "cudnn", "lab", "torch", "baseline")
DTYPES = ("f16", "bf16")


# ------------------------------------------------------------------------------------------------ choice of path
def resolve(requested: str, cfg, dtype: str = "f16", f16: bool = True) -> tuple[str, str]:
    """(backend that will run, note): ``auto`` as the module docstring says (lab+cudnn, cudnn, lab or baseline, with
    the reason); an explicit backend that cannot run raises AttentionUnavailable / AttentionError."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown attention path {requested!r}: one of {', '.join(BACKENDS)}")
    if requested == "baseline":
        return "baseline", "requested"
    kinds = model_kinds(cfg)
    if requested == "auto":
        why = _gpu_ok()
        if why is not None:
            note = f"auto: the lab's baseline attention (cuBLAS + masked softmax) runs, because {why}"
            log.warning(note)
            return "baseline", note
        lab_bad = [f"layer(s) {describe_layers(ls)}: {'; '.join(lab_problems(k))}" for k, ls in kinds.items()
                   if lab_problems(k)]
        if dtype != "f16":
            lab_bad.append(f"it takes fp16 only, not {dtype}")
        try:
            import_cudnn()
        except AttentionUnavailable as e:
            why = str(e)
        if why is None:
            bad = [f"layer(s) {describe_layers(ls)} ({k.describe()}): {'; '.join(cudnn_problems(k))}"
                   for k, ls in kinds.items() if cudnn_problems(k)]
            why = "cuDNN SDPA cannot take " + " | ".join(bad) if bad else None
        if why is None:
            if not lab_bad:
                return "lab+cudnn", ("auto: the lab's fused kernel where its launch is split over the keys and has "
                                     f"fewer than {Routed.ROUTE_BELOW_CTAS} query-block CTAs, cuDNN SDPA elsewhere")
            return "cudnn", "auto: cuDNN frontend available (the lab kernel cannot take " + " | ".join(lab_bad) + ")"
        if not f16:       # the baseline's fp32 products were asked for (attn_f16 off): not the fp16 kernel alone
            lab_bad.append("attention in fp32 was asked (attn_f16 off) and the kernel is fp16")
        if not lab_bad:   # faster than the baseline at every point measured (run 20261201T194347Z: 1.8-4.0x)
            note = f"auto: the lab's fused kernel runs every layer, because {why}"
            log.warning(note)
            return "lab", note
        note = (f"auto: the lab's baseline attention (cuBLAS + masked softmax) runs, because {why}, and the lab "
                f"kernel cannot take " + " | ".join(lab_bad))
        log.warning(note)
        return "baseline", note
    why = _gpu_ok()
    if why:
        raise AttentionUnavailable(f"attention={requested!r} needs a CUDA GPU: {why}")
    if requested in ("cudnn", "lab+cudnn"):
        import_cudnn()
    elif requested == "torch":
        import_torch()
    for k, ls in kinds.items():
        for part in requested.split("+"):
            check_kind(k, part, ls)
    return requested, "requested"


# ------------------------------------------------------------------------------------------------ fp16 / bf16
#: float32 -> bfloat16 bits, round to nearest even (NaN stays a quiet NaN); header-free so NVRTC needs no cuda_bf16.h
_BF16_FROM_F32 = """
unsigned int u = __float_as_uint(x);
if ((u & 0x7fffffffu) > 0x7f800000u) y = (unsigned short)((u >> 16) | 0x40u);
else y = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
"""


_EW: dict = {}


def _ew(name: str):
    cp = gpu.cp()
    if name not in _EW:
        if name == "f32_bf16":
            _EW[name] = cp.ElementwiseKernel("float32 x", "uint16 y", _BF16_FROM_F32, "lab_f32_to_bf16")
        elif name == "bf16_f32":
            _EW[name] = cp.ElementwiseKernel("uint16 x", "float32 y", "y = __uint_as_float(((unsigned int)x) << 16);",
                                             "lab_bf16_to_f32")
        elif name == "bf16_f16":
            _EW[name] = cp.ElementwiseKernel("uint16 x", "float16 y",
                                             "y = (float16)__uint_as_float(((unsigned int)x) << 16);", "lab_bf16_to_f16")
    return _EW[name]


def to_io(x, dtype: str):
    """An activation in the SDPA's input type: fp16 (CuPy float16) or bf16 (bits in uint16)."""
    cp = gpu.cp()
    if dtype == "f16":
        return x if x.dtype == cp.float16 else x.astype(cp.float16)
    if x.dtype == cp.uint16:
        return x
    return _ew("f32_bf16")(x if x.dtype == cp.float32 else x.astype(cp.float32))


def from_io(o, dtype: str, out16: bool):
    """The SDPA output as the prefill wants it: fp16 for a wgmma_kq consumer (out16), else fp32."""
    cp = gpu.cp()
    if dtype == "f16":
        return o if out16 else o.astype(cp.float32)
    return _ew("bf16_f16")(o) if out16 else _ew("bf16_f32")(o)


# ------------------------------------------------------------------------------------------------ backends
PROBE_TOKENS = 64
#: parity gate of fused outputs against the fp32 baseline / float64 reference on inputs rounded to the io type
PARITY_TOL = {"f16": 1e-3, "bf16": 1e-2, "f32": 1e-5}


class Backend:
    """One attention path of a model: ``backend(q, k, v, n, il, tracer, out16)`` -> [n, n_head*d_v]."""
    name = "?"

    def __init__(self, cfg, dtype: str = "f16", note: str = "requested"):
        if dtype not in DTYPES:
            raise ValueError(f"unknown attention dtype {dtype!r}: one of {', '.join(DTYPES)}")
        self.cfg, self.dtype, self.note = cfg, dtype, note

    def kind(self, il: int) -> LayerKind:
        return layer_kind(self.cfg, il)

    @property
    def takes_f16(self) -> bool:
        """Whether fp16 q/k/v give this path the same result as the f32 ones (it rounds them to fp16 itself): the
        prefill's rope may then write them in fp16 (PrefillOptions.fuse_qkv16)."""
        return self.dtype == "f16"

    def describe(self) -> dict:
        return {"attention": self.name, "attention_dtype": self.dtype, "attention_note": self.note}

    def ran(self, n: int) -> str:
        """The path(s) that ran this backend's launches at n tokens (a routed backend: the routes taken)."""
        return self.name

    def __call__(self, q, k, v, n, il, tr, out16: bool = False):
        return self.attend(q, k, v, n, self.kind(il), il, tr, out16)

    def probe(self, kinds: dict, n: int = PROBE_TOKENS) -> str | None:
        """Run each layer kind once at n tokens (a window shrunk below n so the band is in effect) against the
        float64 reference on the same rounded inputs; None when all agree, else what failed, naming the layers."""
        cp = gpu.cp()
        rng = np.random.default_rng(0)
        for kind, layers in kinds.items():
            k2 = LayerKind(kind.n_head, kind.n_head_kv, kind.head_dim, kind.head_dim_v,
                           min(kind.window, n // 3) if kind.window else 0, kind.scale)
            widths = (k2.n_head * k2.head_dim, k2.n_head_kv * k2.head_dim, k2.n_head_kv * k2.head_dim_v)
            ins = [to_io(cp.asarray(rng.standard_normal((n, w)).astype(np.float32)), self.dtype) for w in widths]
            try:
                got = cp.asnumpy(from_io(self.sdpa(*ins, n, k2, layers), self.dtype, False)).astype(np.float64)
            except AttentionError as e:
                return str(e)
            except Exception as e:     # a runtime failure of the library: said, with the layers
                return f"layer(s) {describe_layers(layers)} ({kind.describe()}): the {self.name} path failed: {type(e).__name__}: {e}"
            ref = sdpa_ref(*(cp.asnumpy(from_io(i, self.dtype, False)) for i in ins), n, k2)
            err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
            tol = 2 * PARITY_TOL[self.dtype]
            if not err <= tol:
                return (f"layer(s) {describe_layers(layers)} ({kind.describe()}): the {self.name} path's output at {n} tokens "
                        f"(window {k2.window or 'none'}) differs from the float64 reference by {err:.2e} (> {tol:g})")
        return None

    def attend(self, q, k, v, n, kind: LayerKind, il, tr, out16: bool = False):
        """One layer's attention of kind ``kind``: q [n, H*d], k/v [n, Hkv*d] (f32 or the io type) -> [n, H*dv]."""
        kind = kind.at(n)
        with tr.op("attn_cast", "attention_other", layer=il):
            q16, k16, v16 = (to_io(a, self.dtype) for a in (q, k, v))
        with tr.op("attn_fused", "attention_fused", layer=il, flops=attention_flops(n, kind)):
            o = self.sdpa(q16, k16, v16, n, kind, il)
        if self.dtype == "f16" and out16:
            return o
        with tr.op("attn_cast", "attention_other", layer=il):
            return from_io(o, self.dtype, out16)


class Baseline(Backend):
    """The lab's attention: cuBLAS batched QK^T and PV around the masked-softmax kernel (``f16``: fp16 GEMMs)."""
    name = "baseline"

    def __init__(self, cfg, f16: bool = False, note: str = "requested", fuse_layout: bool = True):
        super().__init__(cfg, "f16", note)
        self.f16 = bool(f16)
        self.fuse_layout = bool(fuse_layout)

    def _relayout(self, view, shape, dt):
        """A transposed view -> a C-contiguous ``dt`` array of ``shape``: cast and copy in one pass
        (PrefillOptions.fuse_layout), or the reshape copy then the cast copy (two passes; the same values)."""
        if self.fuse_layout:
            return view.astype(dt, order="C").reshape(shape)
        return view.reshape(shape).astype(dt, order="C")

    def describe(self) -> dict:
        return {"attention": self.name, "attention_dtype": "f16" if self.f16 else "f32", "attention_note": self.note}

    @property
    def takes_f16(self) -> bool:
        return self.f16

    def _bmm(self, A, B):
        if self.f16:
            # one cuBLAS strided-batched fp16 GEMM: CuPy's batched matmul upcasts fp16 to fp32 (the first
            # decomposition found attention at 23 TFLOPS); per-head 2-D GEMMs cost 2 launches per head
            return blas.bmm_f16(A, B)
        cp = gpu.cp()
        if gpu.capturing():
            # CuPy refuses its cuBLAS calls under capture: one (capturable) gemm_dense a batch entry
            out = cp.empty((A.shape[0], A.shape[1], B.shape[2]), cp.float32)
            for h in range(A.shape[0]):
                blas.gemm_dense(A[h], cp.ascontiguousarray(B[h].T), out=out[h])
            return out
        return cp.matmul(A, B)

    def attend(self, q, k, v, n, kind: LayerKind, il, tr, out16: bool = False):
        """Causal (sliding-window) GQA attention; q [n, H*hd], k/v [n, Hkv*hd]."""
        cp = gpu.cp()
        H, Hk, hd, hdv = kind.n_head, kind.n_head_kv, kind.head_dim, kind.head_dim_v
        G = H // Hk
        dt = cp.float16 if self.f16 else cp.float32
        with tr.op("attn_layout", "attention_other", layer=il):
            Q = self._relayout(q.reshape(n, Hk, G, hd).transpose(1, 2, 0, 3), (Hk, G * n, hd), dt)
            K = k.reshape(n, Hk, hd).transpose(1, 2, 0).astype(dt, order="C")          # [Hk, hd, n]
            V = v.reshape(n, Hk, hdv).transpose(1, 0, 2).astype(dt, order="C")         # [Hk, n, hdv]
        with tr.op("attn_qk", "attention_gemm", layer=il, flops=2 * H * n * n * hd):
            S = self._bmm(Q, K)                                              # [Hk, G*n, n]
        with tr.op("attn_softmax", "attention_softmax", layer=il):
            gpu.kernel("softmax_mask", F16=int(dt == cp.float16)).launch(
                (Hk * G * n,), (S, np.int32(n), np.int32(n), np.float32(kind.scale), np.int32(kind.window or 0)))
        with tr.op("attn_pv", "attention_gemm", layer=il, flops=2 * H * n * n * hdv):
            O = self._bmm(S, V)                                              # [Hk, G*n, hdv]
        with tr.op("attn_layout", "attention_other", layer=il):
            out = self._relayout(O.reshape(Hk, G, n, hdv).transpose(2, 0, 1, 3), (n, H * hdv),
                                 cp.float16 if out16 else cp.float32)
        return out


#: the plan cuDNN's SDPA runs (Cudnn's default): "heuristic" = the frontend's pick (heuristics A then FALLBACK, the
#: first plan that builds); "no_memset" = per (tokens, layer kind) the first plan in that order whose captured execution
#: has no memset node and whose output is within 2 x PARITY_TOL of the heuristic plan's, else the heuristic plan
CUDNN_PLANS = ("heuristic", "no_memset")
CUDNN_PLAN = "heuristic"
NO_MEMSET_MAX_PLANS = 6          # candidates "no_memset" tries, in the heuristics' order (each one is built and run)
_OWN = object()                  # Cudnn.execute: the graph's own workspace


class Cudnn(Backend):
    """cuDNN's fused SDPA (nvidia-cudnn-frontend); graphs cached per (tokens, layer kind, dtype). ``plan`` (default
    :data:`CUDNN_PLAN`): which execution plan runs; under "no_memset" the choice and its reason per graph are in
    ``plan_notes`` and :meth:`describe` (:func:`no_memset_plan` tries the plans)."""
    name = "cudnn"

    def __init__(self, cfg, dtype: str = "f16", note: str = "requested", plan: str | None = None):
        plan = CUDNN_PLAN if plan is None else plan
        if plan not in CUDNN_PLANS:
            raise ValueError(f"cuDNN plan must be one of {CUDNN_PLANS}, got {plan!r}")
        super().__init__(cfg, dtype, note)
        self.cudnn = import_cudnn()
        self.handle = self.cudnn.create_handle()
        self.plan = plan
        self.plan_notes: dict = {}
        self._graphs: dict = {}

    def describe(self) -> dict:
        d = {**super().describe(), **{f"cudnn_{k}": v for k, v in cudnn_info().items()}, "cudnn_plan": self.plan}
        if self.plan_notes:
            d["cudnn_plan_notes"] = "; ".join(f"{n} tokens, {k.mask}: {why}" for (n, k, _), why in self.plan_notes.items())
        return d

    def graph(self, n: int, kind: LayerKind, il=None):
        key = (n, kind, self.dtype)
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = self._build(n, kind, il)
        return g

    def define(self, n: int, kind: LayerKind, il=None) -> dict:
        """The SDPA graph of (tokens, layer kind) with its operation graph built and no plan yet: {graph, Q, K, V,
        O} (plans made by :meth:`_build`; ``labkernels.rounds.r05_wall.graph_census`` lists every candidate plan)."""
        cudnn = self.cudnn
        check_kind(kind, "cudnn", il if il is not None else "?")
        dt = cudnn.data_type.HALF if self.dtype == "f16" else cudnn.data_type.BFLOAT16
        H, Hk, d, dv = kind.n_head, kind.n_head_kv, kind.head_dim, kind.head_dim_v
        try:
            g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
            # the prefill's token-major buffers as [batch 1, heads, tokens, dim] with BSHD strides (no copy)
            Q = g.tensor(name="Q", dim=[1, H, n, d], stride=[n * H * d, d, H * d, 1], data_type=dt)
            K = g.tensor(name="K", dim=[1, Hk, n, d], stride=[n * Hk * d, d, Hk * d, 1], data_type=dt)
            V = g.tensor(name="V", dim=[1, Hk, n, dv], stride=[n * Hk * dv, dv, Hk * dv, 1], data_type=dt)
            band = {"diagonal_alignment": cudnn.diagonal_alignment.TOP_LEFT, "diagonal_band_right_bound": 0}
            if kind.window:
                band["diagonal_band_left_bound"] = int(kind.window)
            O, _ = g.sdpa(name="sdpa", q=Q, k=K, v=V, generate_stats=False, attn_scale=float(kind.scale), **band)
            O.set_output(True).set_dim([1, H, n, dv]).set_stride([n * H * dv, dv, H * dv, 1]).set_data_type(dt)
            g.validate()
            g.build_operation_graph()
        except Exception as e:
            raise AttentionError(f"attention of layer {il} ({kind.describe()}, {n} tokens, {self.dtype}): cuDNN SDPA "
                                 f"cannot take it: {type(e).__name__}: {e}") from None
        return {"graph": g, "Q": Q, "K": K, "V": V, "O": O}

    def _build(self, n: int, kind: LayerKind, il):
        G = self._build_heuristic(n, kind, il)
        if self.plan == "no_memset":
            G, self.plan_notes[(n, kind, self.dtype)] = no_memset_plan(self, n, kind, G)
        return G

    def _build_heuristic(self, n: int, kind: LayerKind, il):
        G = self.define(n, kind, il)
        g = G["graph"]
        try:
            g.create_execution_plans([self.cudnn.heur_mode.A, self.cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
            ws_bytes = int(g.get_workspace_size())
        except Exception as e:
            raise AttentionError(f"attention of layer {il} ({kind.describe()}, {n} tokens, {self.dtype}): cuDNN SDPA "
                                 f"cannot take it: {type(e).__name__}: {e}") from None
        ws = gpu.cp().empty(ws_bytes, gpu.cp().uint8) if ws_bytes else None
        return {**G, "workspace": ws, "workspace_bytes": ws_bytes}

    def sdpa(self, q16, k16, v16, n, kind: LayerKind, il=None, out=None):
        """O [n, H*dv] (io dtype) from q16 [n, H*d], k16/v16 [n, Hk*d] (io dtype, C-contiguous)."""
        cp = gpu.cp()
        G = self.graph(n, kind, il)
        H, dv = kind.n_head, kind.head_dim_v
        for a, w in ((q16, kind.n_head * kind.head_dim), (k16, kind.n_head_kv * kind.head_dim),
                     (v16, kind.n_head_kv * dv)):
            if a.shape != (n, w) or not a.flags.c_contiguous:
                raise AttentionError(f"attention of layer {il}: cuDNN SDPA input of shape {a.shape} "
                                     f"(contiguous {a.flags.c_contiguous}), expected C-contiguous ({n}, {w})")
        o = out if out is not None else cp.empty((n, H * dv), q16.dtype)
        try:
            self.execute(G, q16, k16, v16, o)
        except Exception as e:
            raise AttentionError(f"attention of layer {il} ({kind.describe()}, {n} tokens, {self.dtype}): cuDNN SDPA "
                                 f"execution failed: {type(e).__name__}: {e}") from None
        return o

    def execute(self, G: dict, q16, k16, v16, o, index=None, workspace=_OWN) -> None:
        """Run graph ``G`` (from :meth:`graph` / :meth:`define`) on the current stream: its chosen plan (``G``'s
        ``plan_index`` if set, else the frontend's selected plan) or plan ``index``; ``workspace``: G's own unless
        given (None: no workspace)."""
        cp = gpu.cp()
        ws = G["workspace"] if workspace is _OWN else workspace
        index = G.get("plan_index") if index is None else index
        pack = {G["Q"]: q16.data.ptr, G["K"]: k16.data.ptr, G["V"]: v16.data.ptr, G["O"]: o.data.ptr}
        self.cudnn.set_stream(self.handle, cp.cuda.get_current_stream().ptr)
        if index is None:
            G["graph"].execute(pack, ws, handle=self.handle)
        else:
            G["graph"].execute_plan_at_index(pack, ws, index=index, handle=self.handle)


def _raw_array(cp, size: int, dtype, host=None):
    """A device array on its own cudaMalloc (not from a memory pool: a buffer a captured graph keeps reading must
    not live in, or be freed with, another graph's private pool), filled from ``host`` when given (a synchronous
    copy: not under capture); the tests' numpy stand-in: a numpy array."""
    mem_cls = getattr(getattr(cp, "cuda", None), "Memory", None)
    if mem_cls is None:
        a = cp.empty(size, dtype)
        if host is not None:
            a[...] = host
        return a
    a = cp.ndarray((size,), dtype, cp.cuda.MemoryPointer(mem_cls(size * np.dtype(dtype).itemsize), 0))
    if host is not None:
        a.set(np.ascontiguousarray(host, dtype))
    return a


def _address(a) -> int:
    """A device array's address (CuPy), or a host array's (the tests' numpy stand-in)."""
    d = getattr(a, "data", None)
    return int(d.ptr) if hasattr(d, "ptr") else int(a.ctypes.data)


class Lab(Backend):
    """The lab's fused attention: one kernel per layer (kernels/flash_attn.cu, ``flash_attn`` in the registry) --
    FlashAttention-2 on mma.sync f16 with fp32 softmax and accumulation, causal and sliding-window masks, grouped
    kv heads read in place from the token-major buffers; no workspace, no memset node, programmatic launch inside
    the prefill's graph. fp16 only."""
    name = "lab"

    #: split-KV below this many CTAs (query blocks x head groups): half the H200's 132 SMs
    SPLIT_BELOW_CTAS = 66
    #: a query block's key range in at most this many chunks (the merging CTA reads every chunk's state)
    MAX_CHUNKS = 4
    KEY_BLOCK = 64

    def __init__(self, cfg, dtype: str = "f16", note: str = "requested"):
        if dtype != "f16":
            raise AttentionError(f"the lab's fused attention takes fp16 only, not {dtype!r}")
        super().__init__(cfg, dtype, note)
        self._plans: dict = {}
        self._cnt = None          # split-KV arrival counters, zeroed once (each merging CTA re-arms its own)

    def launch_shape(self, n: int, kind: LayerKind) -> tuple:
        """(grid, heads per CTA): x = query blocks of 16 * (4 / heads) rows, y = head groups."""
        wh = lab_heads_per_cta(kind)
        bq = 16 * (4 // wh)
        return ((n + bq - 1) // bq, kind.n_head // wh), wh

    def split_plan(self, n: int, kind: LayerKind) -> dict:
        """How a launch of n tokens is cut (host-side, no GPU): ``items`` None (one CTA per query block and head
        group) when the grid has at least SPLIT_BELOW_CTAS CTAs or a block needs one key block; else the
        (query block, chunk) list, heaviest query blocks first, each chunk ``kcb`` key blocks of 64, at most
        MAX_CHUNKS per query block (``maxc``)."""
        (nqb, hg), wh = self.launch_shape(n, kind)
        bq, kb = 16 * (4 // wh), self.KEY_BLOCK
        nkb = []
        for qb in range(nqb):
            q0 = qb * bq
            hi, lo = min(n, q0 + bq), (max(0, q0 - kind.window + 1) if kind.window else 0)
            nkb.append((hi - 1) // kb - lo // kb + 1)
        plan = {"grid": (nqb, hg), "wh": wh, "items": None, "kcb": 0, "maxc": 1}
        if nqb * hg >= self.SPLIT_BELOW_CTAS or max(nkb) < 2:
            return plan
        kcb = -(-max(nkb) // self.MAX_CHUNKS)
        order = sorted(range(nqb), key=lambda b: (-nkb[b], -b))
        items = [(b, c) for b in order for c in range(-(-nkb[b] // kcb))]
        plan.update(items=np.asarray(items, np.int32), kcb=kcb, maxc=-(-max(nkb) // kcb),
                    grid=(len(items), hg))
        return plan

    def _device_plan(self, n: int, kind: LayerKind) -> dict:
        """split_plan with its device buffers (made once per (n, kind), outside any graph capture: the prefill's
        eager warm-up makes them): the item list, the chunk-state workspace, the shared counters."""
        key = (n, kind)
        p = self._plans.get(key)
        if p is not None:
            return p
        p = self.split_plan(n, kind)
        if p["items"] is not None:
            cp = gpu.cp()
            nqb, hg = self.launch_shape(n, kind)[0]
            nt = kind.head_dim // 8
            slot = 4 * nt * 32 * 4 + 4 * 32 * 4       # floats of one chunk state: the kernel's SLOT
            p["ws"] = _raw_array(cp, nqb * hg * p["maxc"] * slot, cp.float32)
            p["items_dev"] = _raw_array(cp, p["items"].size, cp.int32, host=p["items"].ravel())
            if self._cnt is None or self._cnt.size < nqb * hg:
                self._cnt = _raw_array(cp, max(1024, nqb * hg), cp.int32, host=np.zeros(max(1024, nqb * hg), np.int32))
        self._plans[key] = p
        return p

    def sdpa(self, q16, k16, v16, n, kind: LayerKind, il=None, out=None):
        """O [n, H*d] fp16 from q16 [n, H*d], k16/v16 [n, Hk*d] fp16 (C-contiguous, 16-byte aligned)."""
        cp = gpu.cp()
        bad = lab_problems(kind)
        if bad:
            raise AttentionError(f"attention of layer {il} ({kind.describe()}): the lab path cannot take it: "
                                 f"{'; '.join(bad)}")
        if not n >= 1:
            raise AttentionError(f"attention of layer {il}: {n} tokens")
        H, Hk, d = kind.n_head, kind.n_head_kv, kind.head_dim
        for nm, a, w in (("q", q16, H * d), ("k", k16, Hk * d), ("v", v16, Hk * d)):
            if a.dtype != cp.float16 or a.shape != (n, w) or not a.flags.c_contiguous or _address(a) % 16:
                raise AttentionError(f"attention of layer {il}: the lab path's {nm} input is {a.dtype} {a.shape} "
                                     f"(contiguous {a.flags.c_contiguous}, address mod 16 = {_address(a) % 16}); "
                                     f"expected C-contiguous 16-byte-aligned float16 ({n}, {w})")
        o = out if out is not None else cp.empty((n, H * d), cp.float16)
        if o.dtype != cp.float16 or o.shape != (n, H * d) or not o.flags.c_contiguous or _address(o) % 4:
            raise AttentionError(f"attention of layer {il}: the lab path's output buffer is {o.dtype} {o.shape}, "
                                 f"expected C-contiguous float16 ({n}, {H * d})")
        p = self._device_plan(n, kind)
        split = p["items"] is not None
        null = np.uint64(0)
        gpu.kernel("flash_attn", D=d).launch(p["grid"], (
            q16, k16, v16, o, np.int32(n), np.int32(H), np.int32(Hk), np.int32(p["wh"]), np.int32(kind.window),
            np.float32(kind.scale * np.log2(np.e)), p["items_dev"] if split else null, np.int32(p["kcb"]),
            np.int32(p["maxc"]), p["ws"] if split else null, self._cnt if split else null))
        return o


class Routed(Backend):
    """``lab+cudnn`` (``auto``'s choice where both can run): per launch, the lab's kernel where its split-KV plan
    applies -- few query-block CTAs, e.g. Gemma 3 270M's 4 heads on 1 kv head up to ~1000 tokens, where cuDNN's SDPA
    is no faster and costs a workspace memset node and a ~4 us launch gap before each layer's kernel in a captured
    graph (prefill run 20261201T194423Z) -- and cuDNN's SDPA elsewhere (2-3x faster than the lab's mma.sync kernel at
    nt=3325: attention run 20261201T194347Z). Which one ran for each (tokens, layer kind) is in :attr:`routes` and
    :meth:`describe`."""
    name = "lab+cudnn"

    def __init__(self, cfg, dtype: str = "f16", note: str = "requested"):
        super().__init__(cfg, dtype, note)
        self.lab = Lab(cfg, dtype, note)
        self.cudnn = Cudnn(cfg, dtype, note)
        self.routes: dict = {}

    #: the lab's kernel below this many query-block CTAs (and split over the keys): Gemma up to 512 tokens. At
    #: 1024 (64 CTAs, split) cuDNN's kernel is faster by more than its memset and launch gap cost (Gemma's forward
    #: 2.36 vs 2.50 ms, prefill run 20261201T195305Z)
    ROUTE_BELOW_CTAS = 40

    def route(self, n: int, kind: LayerKind) -> str:
        """'lab' when the lab kernel's launch at n tokens is split over the keys and has fewer than
        ROUTE_BELOW_CTAS query-block CTAs, else 'cudnn'."""
        (nqb, hg), _ = self.lab.launch_shape(n, kind)
        split = self.lab.split_plan(n, kind)["items"] is not None
        return "lab" if split and nqb * hg < self.ROUTE_BELOW_CTAS else "cudnn"

    def describe(self) -> dict:
        d = {**super().describe(), **{k: v for k, v in self.cudnn.describe().items() if k.startswith("cudnn_")}}
        if self.routes:
            d["attention_routes"] = "; ".join(f"{n} tokens, {k.mask}: {r}" for (n, k), r in sorted(
                self.routes.items(), key=lambda x: (x[0][0], x[0][1].window)))
        return d

    def ran(self, n: int) -> str:
        taken = sorted({r for (m, _), r in self.routes.items() if m == n})
        return "+".join(taken) if taken else "none yet"

    def probe(self, kinds: dict, n: int = PROBE_TOKENS) -> str | None:
        """Both paths on every layer kind: cuDNN and the lab kernel at n tokens, and the lab kernel at 300 tokens
        too (a split-KV launch for Gemma-like layouts)."""
        return self.cudnn.probe(kinds, n) or self.lab.probe(kinds, n) or self.lab.probe(kinds, 300)

    def sdpa(self, q16, k16, v16, n, kind: LayerKind, il=None, out=None):
        r = self.routes.setdefault((n, kind), self.route(n, kind))
        return (self.lab if r == "lab" else self.cudnn).sdpa(q16, k16, v16, n, kind, il, out=out)


class Torch(Backend):
    """torch.nn.functional.scaled_dot_product_attention on the CuPy buffers (DLPack, zero copy in)."""
    name = "torch"

    def __init__(self, cfg, dtype: str = "f16", note: str = "requested", backends=None):
        super().__init__(cfg, dtype, note)
        self.torch = import_torch()
        self.backends = backends      # None: PyTorch's own choice; else a list of SDPBackend names to allow
        self._masks: dict = {}

    def _mask(self, n: int, window: int):
        key = (n, window)
        if key not in self._masks:
            t = self.torch
            i = t.arange(n, device="cuda")
            d = i[:, None] - i[None, :]
            self._masks[key] = (d >= 0) & (d < window)
        return self._masks[key]

    def _views(self, q16, k16, v16, n, kind: LayerKind):
        t = self.torch

        def view(a, heads, d):
            x = t.from_dlpack(a)
            if self.dtype == "bf16":
                x = x.view(t.bfloat16)
            return x.view(n, heads, d).transpose(0, 1).unsqueeze(0)         # [1, heads, n, d], strided

        q = view(q16, kind.n_head, kind.head_dim)
        k = view(k16, kind.n_head_kv, kind.head_dim)
        v = view(v16, kind.n_head_kv, kind.head_dim_v)
        mask = self._mask(n, kind.window) if kind.window else None
        return q, k, v, mask

    def _run(self, q, k, v, mask, kind: LayerKind):
        t = self.torch
        F = t.nn.functional
        kw = {"attn_mask": mask, "is_causal": mask is None, "scale": float(kind.scale),
              "enable_gqa": kind.n_head_kv != kind.n_head}
        if self.backends is None:
            return F.scaled_dot_product_attention(q, k, v, **kw)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, b) for b in self.backends]):
            return F.scaled_dot_product_attention(q, k, v, **kw)

    def backend(self, n: int, kind: LayerKind) -> str:
        """The SDPA backend PyTorch dispatches these inputs to (its own choice; 'unknown' if it cannot say)."""
        cp, t = gpu.cp(), self.torch
        kind = kind.at(n)
        z = cp.zeros((n, kind.n_head * kind.head_dim), cp.float16 if self.dtype == "f16" else cp.uint16)
        zk = cp.zeros((n, kind.n_head_kv * kind.head_dim), z.dtype)
        zv = cp.zeros((n, kind.n_head_kv * kind.head_dim_v), z.dtype)
        q, k, v, mask = self._views(z, zk, zv, n, kind)
        try:
            choice = int(t._fused_sdp_choice(q, k, v, mask, 0.0, mask is None, scale=float(kind.scale),
                                             enable_gqa=kind.n_head_kv != kind.n_head))
            from torch.nn.attention import SDPBackend

            names = {int(v): k for k, v in SDPBackend.__members__.items()}
            return names.get(choice, f"SDPBackend({choice})")
        except Exception as e:  # a private API: say so instead of guessing
            return f"unknown ({type(e).__name__}: {e})"

    def sdpa(self, q16, k16, v16, n, kind: LayerKind, il=None):
        cp = gpu.cp()
        ptr = cp.cuda.get_current_stream().ptr
        q, k, v, mask = self._views(q16, k16, v16, n, kind)
        t = self.torch
        if ptr:
            with t.cuda.stream(t.cuda.ExternalStream(ptr)):
                o = self._run(q, k, v, mask, kind)
                o = o[0].transpose(0, 1).reshape(n, kind.n_head * kind.head_dim_v)
        else:
            o = self._run(q, k, v, mask, kind)
            o = o[0].transpose(0, 1).reshape(n, kind.n_head * kind.head_dim_v)   # [n, H*dv] (a copy)
        if self.dtype == "bf16":
            o = o.view(t.int16)
        out = cp.from_dlpack(o)
        return out.view(cp.uint16) if self.dtype == "bf16" else out


def make(requested: str, cfg, f16: bool = False, dtype: str = "f16", fuse_layout: bool = True) -> Backend:
    """The attention backend a model runs (see the module docstring for ``auto``). A fused path is probed once per
    layer kind (:meth:`Backend.probe`, 64 tokens against the float64 reference): under ``auto`` a failing probe
    gives the baseline with the reason; a requested path that fails it is an AttentionError naming the layers."""
    name, note = resolve(requested, cfg, dtype, f16=f16)
    if name == "baseline":
        return Baseline(cfg, f16=f16, note=note, fuse_layout=fuse_layout)
    b = {"cudnn": Cudnn, "lab": Lab, "torch": Torch, "lab+cudnn": Routed}[name](cfg, dtype, note)
    bad = b.probe(model_kinds(cfg))
    if bad is None:
        return b
    if requested == "auto":
        note = f"auto: the lab's baseline attention (cuBLAS + masked softmax) runs, because the {name} probe failed: {bad}"
        log.warning(note)
        return Baseline(cfg, f16=f16, note=note, fuse_layout=fuse_layout)
    raise AttentionError(f"attention={requested!r}: {bad}")


# ---------------------------------------------------------- cuDNN plans without a memset node (the captured prefill)
def sdpa_inputs(kind, n: int, dtype: str, rng):
    """Random q, k, v of one SDPA (n tokens of ``kind``) on the device in the I/O type ``dtype``."""
    cp = gpu.cp()
    widths = (kind.n_head * kind.head_dim, kind.n_head_kv * kind.head_dim, kind.n_head_kv * kind.head_dim_v)
    return [to_io(cp.asarray(rng.standard_normal((n, wd)).astype(np.float32)), dtype) for wd in widths]


def no_memset_plan(b, n: int, kind, ref_G: dict, seed: int = 0) -> tuple[dict, str]:
    """For ``Cudnn(plan="no_memset")``: the first candidate plan of (n, kind) in the heuristics' order
    whose captured execution has no memset node and whose output on random inputs is within 2 x PARITY_TOL of the
    heuristic plan's (``ref_G``, already built); returns (its graph dict with ``plan_index``, why) or (``ref_G``,
    why not). Plans are not tried while the current stream captures (the trial runs and captures work itself)."""
    cp = gpu.cp()
    if cp.cuda.runtime.streamIsCapturing(cp.cuda.get_current_stream().ptr):
        return ref_G, "heuristic plan: plans are not tried while the stream captures a graph"
    stream = cp.cuda.Stream(non_blocking=True)
    ins = sdpa_inputs(kind, n, b.dtype, np.random.default_rng(seed))
    q, k, v = ins
    o = cp.zeros((n, kind.n_head * kind.head_dim_v), q.dtype)
    cp.cuda.runtime.deviceSynchronize()
    with stream:
        b.execute(ref_G, q, k, v, o)
        stream.synchronize()
    ref = as_f64(cp.asnumpy(o), b.dtype)
    try:
        G, count = graph_nodes._candidates(b, n, kind)
    except Exception as e:
        return ref_G, f"heuristic plan: the candidate plans could not be listed: {type(e).__name__}: {e}"
    tol = 2 * PARITY_TOL[b.dtype]
    tried = []
    for i in range(min(count, NO_MEMSET_MAX_PLANS)):
        row, got, ws = graph_nodes._plan_trial(b, G, i, ins, o.shape[1], stream)
        got = as_f64(got, b.dtype) if got is not None else None
        name = row.get("plan_name", "?")
        if got is None:
            tried.append(f"#{i} {name}: {row['error'][:120]}")
        elif row["n_memset"]:
            tried.append(f"#{i} {name}: {row['n_memset']} memset")
        elif not row["graph_bitwise_eager"]:
            tried.append(f"#{i} {name}: its replay differs from its eager run")
        elif not graph_nodes._max_rel(got, ref) <= tol:
            tried.append(f"#{i} {name}: {graph_nodes._max_rel(got, ref):.2e} from the heuristic plan (> {tol:g})")
        else:
            return ({**G, "workspace": ws, "workspace_bytes": row["workspace_bytes"], "plan_index": i},
                    f"plan #{i} of {count} ({name}): no memset node, {graph_nodes._max_rel(got, ref):.1e} from the "
                    "heuristic plan")
    return ref_G, (f"heuristic plan: none of the first {len(tried)} of {count} candidate plans fits (no memset node, "
                   f"replay equal to its eager run, within {tol:g} of the heuristic plan): " + "; ".join(tried))
