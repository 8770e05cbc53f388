"""KV-cache generation (round 9, issue 45 item 3): :meth:`GpuModel.generate` -- the prefill fills a KV cache, then one
decode step per token, captured once as a CUDA graph and replayed.

**The KV cache** (:class:`KVCache`): fp16, per layer a K plane ``[n_ctx, n_head_kv * head_dim]`` and a V plane
``[n_ctx, n_head_kv * head_dim_v]``, token-major: row ``p`` holds every kv head of position ``p`` (head ``h`` at
columns ``h * head_dim ..``), the K of a position after its q/k norm (gemma3) and RoPE. That is the layout the
prefill's rope kernels write its k / v in, so the prefill fills rows ``0..n-1`` with one strided copy per layer
(``GpuModel.kv_sink``: f32 rows are rounded to fp16 there, fp16 ones copied). All layers' planes are one allocation
(:func:`cache_bytes`); one that fails raises :class:`CacheAllocationError` with the bytes it needed.

**The decode step** (:meth:`Decoder.step`): the token and its position live in device memory -- the decode state ``st``
(int32 ``[4]``: ``st[ST_TOK]`` the token id, ``st[ST_POS]`` its position ``p``, ``st[ST_ERR]`` error flags) -- so that
no launch of the step takes a per-token host argument and one captured graph serves every token:

* embed: the prefill's ``embed`` kernel, reading the id from ``st``;
* per layer: the norms (the prefill's ``rmsnorm`` / ``add_rmsnorm`` at one row), Q/K/V, O and the FFN through
  :func:`labkernels.dispatch.qmatmul` at nt = 1 with ``kernel="gemv_kq"`` for the q4_K / q6_K weights (the other types
  through cuBLAS on the dequantized weight, as the prefill does), ``decode_qkv`` (kernels/decode.cu: the q/k norm,
  RoPE at ``p``, the q scale, the fp16 casts and the append of k, v as row ``p`` of the layer's cache), then
  ``decode_attn``: the query of every head over keys ``lo..p`` of the cache (``lo = max(0, p - window + 1)`` on
  Gemma 3's sliding layers, 0 on global ones) -- flash-decoding: the keys are cut into chunks of ``CH``; CTA (kv head,
  split, head group) writes each of its chunks' softmax state (max, sum, unnormalized O) to a workspace and the CTA
  that arrives last folds them (the largest max first, then the rescaled sums in chunk order; :class:`AttnPlan`). The
  state of a chunk does not depend on the CTA that computed it and the fold order is fixed, so the output is the same
  bits for any split count;
* the output norm and head, then ``argmax_step``: the argmax of the logits (ties: the lowest index) written into
  ``st[ST_TOK]``, the position advanced, the token recorded in the history ``hist[p + 1]``.

The first decode step runs eager (it loads every module and sizes every workspace, with its activations in a private
memory pool), then the step is captured (CuPy / runtime stream capture, as the prefill's graph) and its first replay is
checked at the warm-up's position against the eager step (``forward_common.GRAPH_RTOL``); every later token is one replay.
Tokens are read back once at the end. ``graph`` as the prefill's: None -- a graph where it captures, else eager steps
with the reason kept in ``Decoder.graph_refused``; True -- a capture failure raises; False -- eager steps.

**Parity**: a decode step computes, for the token at position p, the numbers the prefill computes for row p of the
same sequence, up to (a) f32 summation order in the GEMMs (gemv_kq vs the prefill's family; the same f16 weights and
f16 activations where the prefill runs ``wgmma_kq``), (b) the attention: the cache's keys and values are fp16 (the
prefill's fp16 attention paths round them the same way) and the decode kernel keeps P in fp32 where the prefill's
mma-based kernels round it to fp16. Bounds: tests/test_decode.py (shim) and tests/gpu/test_decode_gpu.py.

**Bad input** (:func:`check_request`, before any GPU work): an empty prompt, an id outside the vocabulary,
``n_new < 1``, a context (prompt + n_new) longer than the model's ``n_ctx_train`` or the cache's ``n_ctx``, an
unknown sampler: :class:`DecodeError` naming what was wrong.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from . import blas, dispatch, errors, forward_common, gemv, gpu, graph_nodes
from .attention_kinds import LayerKind
from .forward_common import GRAPH_RTOL, GraphCaptureError, check_act_mul_gu
from .kernels import registry

#: the decode state's slots (kernels/decode.cu LK_ST_*) and error flags (LK_ERR_*)
ST_TOK, ST_POS, ST_ERR = 0, 1, 2
ERR_POS, ERR_NAN = 1, 2
SAMPLERS = ("greedy",)
#: head dims and query heads per CTA decode_attn is instantiated for (registry rows)
ATTN_HEAD_DIMS = (64, 128, 256)
ATTN_GMAX = (1, 2, 4, 8)
#: the largest key chunk of decode_attn (DA_CHMAX: shared memory for a chunk's scores)
ATTN_CHMAX = 256
#: the default key chunk: small, so that short contexts still spread over several CTAs (tunable: AttnPlan)
ATTN_CHUNK = 64
AM_THREADS = 256
#: logits per argmax CTA (the grid is ceil(vocab / this), at most AM_MAX_CTAS)
AM_PER_CTA = 4096
AM_MAX_CTAS = 1024


class _Untraced:
    """The decode step's tracer when none is given: each op label one shared no-op context (the eager step's host
    path pays no generator per op, as :class:`labkernels.trace.NullTracer`'s would)."""
    active = False
    _ctx = contextlib.nullcontext()

    def op(self, name, cls, **kw):
        return self._ctx


_UNTRACED = _Untraced()


class DecodeError(ValueError):
    """A generation request the decode path refuses (bad ids, lengths, sampler, model shape), or a decode that went
    wrong on the device (a NaN logit, a position outside the cache)."""


class CacheAllocationError(errors.GpuError):
    """The KV cache could not be allocated; the message says how many bytes it needed."""


# ------------------------------------------------------------------------------------------------ requests

def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_request(cfg, prompt_ids, n_new, sampler: str = "greedy", n_ctx=None) -> tuple[np.ndarray, int]:
    """(the prompt as int32 ids, prompt + n_new) for a valid request, else DecodeError -- no GPU work."""
    if sampler not in SAMPLERS:
        raise DecodeError(f"unknown sampler {sampler!r}: one of {', '.join(SAMPLERS)}")
    if not _is_int(n_new) or n_new < 1:
        raise DecodeError(f"n_new (tokens to generate) must be an integer >= 1, got {n_new!r}")
    try:
        raw = np.asarray(prompt_ids)
    except Exception as e:
        raise DecodeError(f"the prompt must be a list of token ids: {type(e).__name__}: {e}") from None
    if raw.ndim != 1:
        raise DecodeError(f"the prompt must be a 1-D list of token ids, got shape {raw.shape}")
    if raw.size == 0:
        raise DecodeError("an empty prompt: give at least one token id")
    if raw.dtype.kind not in "iu":
        raise DecodeError(f"token ids must be integers, got {raw.dtype} ({raw[:3].tolist()}...)")
    bad = np.flatnonzero((raw < 0) | (raw >= cfg.vocab))
    if bad.size:
        i = int(bad[0])
        raise DecodeError(f"token id {int(raw[i])} at prompt position {i} is outside the vocabulary 0..{cfg.vocab - 1}"
                          + (f" ({bad.size} such ids)" if bad.size > 1 else ""))
    need = int(raw.size) + int(n_new)
    ctx_train = cfg.n_ctx_train
    if ctx_train and need > ctx_train:
        raise DecodeError(f"a context of {raw.size} prompt + {n_new} new = {need} tokens is longer than the model's "
                          f"training context n_ctx_train={ctx_train}")
    if n_ctx is not None:
        if not _is_int(n_ctx) or n_ctx < 1:
            raise DecodeError(f"n_ctx (the cache's length) must be an integer >= 1, got {n_ctx!r}")
        if ctx_train and n_ctx > ctx_train:
            raise DecodeError(f"a cache of n_ctx={n_ctx} positions is longer than the model's training context "
                              f"n_ctx_train={ctx_train}")
        if need > n_ctx:
            raise DecodeError(f"a context of {raw.size} prompt + {n_new} new = {need} tokens is longer than the "
                              f"cache's n_ctx={n_ctx}")
    return raw.astype(np.int32), need


def decode_problems(cfg) -> list[str]:
    """Why the decode kernels cannot take a model (empty: they can)."""
    bad = []
    if cfg.head_dim != cfg.head_dim_v:
        bad.append(f"q/k head dim {cfg.head_dim} differs from v head dim {cfg.head_dim_v}")
    if cfg.head_dim not in ATTN_HEAD_DIMS:
        bad.append(f"head dim {cfg.head_dim} is not one decode_attn is built for ({', '.join(map(str, ATTN_HEAD_DIMS))})")
    if cfg.n_head % cfg.n_head_kv:
        bad.append(f"{cfg.n_head} query heads are not a multiple of {cfg.n_head_kv} kv heads")
    if cfg.qk_norm and cfg.head_dim > registry.QKNORM_MAXHD:
        bad.append(f"head dim {cfg.head_dim} > {registry.QKNORM_MAXHD} (decode_qkv's q/k norm row in shared memory)")
    return bad


def default_n_ctx(cfg, need: int) -> int:
    """The cache length generate picks: ``need`` rounded up to a multiple of 256, at most the training context."""
    n = -(-need // 256) * 256
    return min(n, cfg.n_ctx_train) if cfg.n_ctx_train else n


# ------------------------------------------------------------------------------------------------ the KV cache

def cache_bytes(cfg, n_ctx: int) -> int:
    """Bytes of the fp16 KV cache of ``n_ctx`` positions: every layer's K and V planes."""
    return 2 * cfg.n_layer * n_ctx * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)


def _is_oom(e: BaseException) -> bool:
    t = type(e).__name__
    return isinstance(e, MemoryError) or "OutOfMemory" in t or "out of memory" in str(e).lower() \
        or "cudaErrorMemoryAllocation" in str(e)


class KVCache:
    """The fp16 KV cache of a model: ``k[il]`` ``[n_ctx, n_head_kv * head_dim]``, ``v[il]`` ``[n_ctx, n_head_kv *
    head_dim_v]`` (views of one zeroed allocation), token-major -- row p holds every kv head of position p, head h at
    columns ``h * head_dim ..``; the K rows after the q/k norm and RoPE. The prefill's layout: :meth:`fill` copies its
    rows 0..n-1, the decode step appends row p (kernels/decode.cu)."""

    def __init__(self, cfg, n_ctx: int):
        if not _is_int(n_ctx) or n_ctx < 1:
            raise DecodeError(f"n_ctx must be an integer >= 1, got {n_ctx!r}")
        cp = gpu.cp()
        self.cfg, self.n_ctx = cfg, int(n_ctx)
        self.wk, self.wv = cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v
        self.nbytes = cache_bytes(cfg, n_ctx)
        try:
            self.buf = cp.zeros(self.nbytes // 2, cp.float16)
        except Exception as e:
            if not _is_oom(e):
                raise
            raise CacheAllocationError(
                f"the KV cache of {n_ctx} positions x {cfg.n_layer} layers (fp16 K [{n_ctx}, {self.wk}] and V "
                f"[{n_ctx}, {self.wv}] per layer) needs {self.nbytes} bytes ({self.nbytes / 2**30:.2f} GiB), which "
                f"could not be allocated: {type(e).__name__}: {e}") from None
        per = n_ctx * (self.wk + self.wv)
        self.k = [self.buf[il * per: il * per + n_ctx * self.wk].reshape(n_ctx, self.wk) for il in range(cfg.n_layer)]
        self.v = [self.buf[il * per + n_ctx * self.wk: (il + 1) * per].reshape(n_ctx, self.wv)
                  for il in range(cfg.n_layer)]

    def fill(self, il: int, k, v, n: int) -> None:
        """Rows 0..n-1 of layer il from the prefill's k [n, >= wk] / v [n, >= wv] (f32 rows, rounded to fp16 to nearest
        even as the decode kernel's casts, or fp16): one strided copy each (GpuModel.kv_sink)."""
        if n > self.n_ctx:
            raise DecodeError(f"a prefill of {n} tokens does not fit the cache's n_ctx={self.n_ctx}")
        for dst, src, w, what in ((self.k[il], k, self.wk, "k"), (self.v[il], v, self.wv, "v")):
            if src.ndim != 2 or src.shape[0] != n or src.shape[1] < w or str(src.dtype) not in ("float32", "float16"):
                raise errors.ShapeError(f"KV cache fill of layer {il}: {what} must be float32/float16 [{n}, >= {w}], got "
                                        f"{src.dtype} {tuple(src.shape)}")
            dst[:n] = src[:, :w]


# ------------------------------------------------------------------------------------------------ attention

@dataclass(frozen=True)
class AttnPlan:
    """How decode_attn cuts a layer's keys: ``GMAX`` query heads a CTA (the instantiation), ``NZ`` head groups per kv
    head (grid z), ``CH`` keys a chunk, ``NS`` splits (grid y: split y takes chunks [y*nch/NS, (y+1)*nch/NS)), and
    ``maxch`` workspace slots per (kv head, head group): the chunks of the longest context it serves."""
    GMAX: int
    NZ: int
    CH: int
    NS: int
    maxch: int

    def slot_floats(self, head_dim: int) -> int:
        """One chunk state: O [GMAX][D], m [GMAX], l [GMAX], padded to 16 bytes (kernels/decode.cu SLOT)."""
        return self.GMAX * head_dim + 2 * max(self.GMAX, 2)

    def ws_floats(self, n_head_kv: int, head_dim: int) -> int:
        return n_head_kv * self.NZ * self.maxch * self.slot_floats(head_dim)


def attn_plan(n_head: int, n_head_kv: int, max_keys: int, sm_count: int = 132, split: int | None = None,
              chunk: int | None = None, gmax: int | None = None) -> AttnPlan:
    """The plan for contexts of up to ``max_keys`` keys: GMAX the smallest instantiation covering the group (8 and
    several head groups beyond), chunks of ``chunk`` (default ATTN_CHUNK) keys, and ``split`` CTAs per (kv head, head
    group) (default: one per chunk of the longest context, at most two waves of ``sm_count``)."""
    G = n_head // n_head_kv
    if gmax is None:
        gmax = next((g for g in ATTN_GMAX if g >= G), ATTN_GMAX[-1])
    if gmax not in ATTN_GMAX:
        raise errors.ShapeError(f"decode_attn takes {ATTN_GMAX} query heads a CTA, not {gmax}")
    CH = ATTN_CHUNK if chunk is None else int(chunk)
    if not 1 <= CH <= ATTN_CHMAX:
        raise errors.ShapeError(f"decode_attn's key chunk must be 1..{ATTN_CHMAX}, got {CH}")
    if max_keys < 1:
        raise errors.ShapeError(f"max_keys must be >= 1, got {max_keys}")
    NZ = -(-G // gmax)
    maxch = -(-max_keys // CH)
    if split is None:
        split = max(1, min(maxch, -(-2 * sm_count // (n_head_kv * NZ))))
    if not _is_int(split) or split < 1:
        raise errors.ShapeError(f"split must be an integer >= 1, got {split!r}")
    return AttnPlan(int(gmax), NZ, CH, int(split), maxch)


def attn_workspace(plan: AttnPlan, n_head_kv: int, head_dim: int):
    """(ws float32, cnt int32 zeroed) for decode_attn under ``plan`` (the counters stay zero at rest)."""
    cp = gpu.cp()
    return (cp.empty(max(1, plan.ws_floats(n_head_kv, head_dim)), cp.float32),
            cp.zeros(n_head_kv * plan.NZ, cp.int32))


def decode_attention(q16, kc, vc, st, kind, n_ctx: int, plan: AttnPlan, ws, cnt, out16: bool = True, out=None):
    """One layer's attention of the token at position st[ST_POS] over the cache (kernels/decode.cu decode_attn):
    q16 fp16 [1, H*D] (pre-scaled: softmax scale ``kind.scale``, 1 in the decode step), kc / vc fp16 [n_ctx, Hk*D]
    -> [1, H*D] fp16 (``out16``) or f32. ``kind``: an attention_kinds.LayerKind (heads, dims, window)."""
    cp = gpu.cp()
    H, Hk, D = kind.n_head, kind.n_head_kv, kind.head_dim
    if kind.head_dim != kind.head_dim_v or D not in ATTN_HEAD_DIMS or H % Hk:
        raise errors.ShapeError(f"decode_attn takes head dims {ATTN_HEAD_DIMS} (q/k = v) and whole GQA groups, got "
                                f"{kind.describe()}")
    if -(-(min(n_ctx, kind.window) if kind.window else n_ctx) // plan.CH) > plan.maxch:
        raise errors.ShapeError(f"plan {plan} has {plan.maxch} chunk slots; {n_ctx} positions need more")
    if plan.GMAX * plan.NZ < H // Hk:
        raise errors.ShapeError(f"plan {plan} covers {plan.GMAX * plan.NZ} of the {H // Hk} query heads per kv head")
    for a, shape, dt, what in ((q16, (1, H * D), "float16", "q16"), (kc, (n_ctx, Hk * D), "float16", "kc"),
                               (vc, (n_ctx, Hk * D), "float16", "vc")):
        if tuple(a.shape) != shape or str(a.dtype) != dt or not a.flags.c_contiguous:
            raise errors.ShapeError(f"decode_attn: {what} must be C-contiguous {dt} {shape}, got {a.dtype} {tuple(a.shape)}")
    if ws.size < plan.ws_floats(Hk, D) or cnt.size < Hk * plan.NZ:
        raise errors.ShapeError(f"decode_attn: workspace of {ws.size} floats / {cnt.size} counters, the plan needs "
                                f"{plan.ws_floats(Hk, D)} / {Hk * plan.NZ}")
    o = out if out is not None else cp.empty((1, H * D), cp.float16 if out16 else cp.float32)
    if tuple(o.shape) != (1, H * D) or str(o.dtype) != ("float16" if out16 else "float32") or not o.flags.c_contiguous:
        raise errors.ShapeError(f"decode_attn: out must be C-contiguous {'float16' if out16 else 'float32'} (1, {H * D})")
    for a, what in ((q16, "q16"), (kc, "kc"), (vc, "vc"), (o, "out"), (ws, "the workspace")):
        if _address(a) % 16:
            raise errors.ShapeError(f"decode_attn: {what} must be 16-byte aligned (its 16-byte loads / stores)")
    gpu.kernel("decode_attn", D=D, GMAX=plan.GMAX).launch(
        (Hk, plan.NS, plan.NZ),
        (q16, kc, vc, o, st, np.int32(n_ctx), np.int32(H), np.int32(Hk), np.int32(kind.window or 0),
         np.float32(kind.scale * math.log2(math.e)), np.int32(plan.CH), np.int32(plan.maxch), ws, cnt,
         np.int32(int(out16))))
    return o


def _address(a) -> int:
    """A device array's address (CuPy), or a host array's (the CPU tests' numpy stand-in)."""
    d = getattr(a, "data", None)
    return int(d.ptr) if hasattr(d, "ptr") else int(a.ctypes.data)


# ------------------------------------------------------------------------------------------------ argmax

def argmax_grid(n: int) -> int:
    return max(1, min(AM_MAX_CTAS, -(-n // AM_PER_CTA)))


def argmax_workspace(n: int):
    """(values float32, indices int32, counter int32 zeroed) for argmax_step over n logits."""
    cp = gpu.cp()
    g = argmax_grid(n)
    return cp.empty(g, cp.float32), cp.empty(g, cp.int32), cp.zeros(1, cp.int32)


def argmax_step(logits, st, hist, ws) -> None:
    """Greedy sampling on the device (kernels/decode.cu argmax_step): st[ST_TOK] = argmax(logits) (ties: the lowest
    index), st[ST_POS] += 1, hist[st[ST_POS]] = the token. ``logits``: f32, C-contiguous, n = its size."""
    if str(logits.dtype) != "float32" or not logits.flags.c_contiguous:
        raise errors.ShapeError(f"argmax_step takes C-contiguous float32 logits, got {logits.dtype}")
    n = int(logits.size)
    wsv, wsi, cnt = ws
    if wsv.size < argmax_grid(n):
        raise errors.ShapeError(f"argmax_step: workspace of {wsv.size} CTAs, {n} logits need {argmax_grid(n)}")
    gpu.kernel("argmax_step").launch((argmax_grid(n),), (logits, np.int32(n), st, hist, np.int32(hist.size),
                                                          wsv, wsi, cnt))


# ------------------------------------------------------------------------------------------------ the decoder

def _stream():
    """A stream of the decoder's own (None where this CuPy has none: the CPU tests' stand-in)."""
    s = getattr(gpu.cp().cuda, "Stream", None)
    return s(non_blocking=True) if s is not None else None


def _sync(stream) -> None:
    if stream is not None:
        stream.synchronize()
    else:
        gpu.cp().cuda.runtime.deviceSynchronize()


@dataclass
class StepGraph:
    """A captured decode step and what its replays touch: the private pool of its activations, the logits buffer it
    writes, the workspaces it reads (kept referenced: gemv's per-stream workspace may be replaced when it grows)."""
    graph: object
    pool: object
    logits: object
    keep: tuple
    capture_s: float
    max_rel_diff: float       # first replay vs the eager step at the same position
    bitwise: bool
    pdl_launches: int = 0
    memsets_replaced: int = 0
    memsets_left: int = 0
    replays: int = 0          # the checked first one included


class Decoder:
    """A model's decode path for contexts of up to ``n_ctx`` positions: the KV cache, the decode state, the workspaces
    and (after the first decode step) the captured step. ``split`` / ``chunk`` / ``gmax``: decode_attn's plan
    (:func:`attn_plan`; tests and experiments)."""

    def __init__(self, gm, n_ctx: int, split: int | None = None, chunk: int | None = None, gmax: int | None = None):
        bad = decode_problems(gm.cfg)
        if bad:
            raise DecodeError(f"the decode path cannot take {gm.cfg.arch} ({'; '.join(bad)})")
        cp = gpu.cp()
        c = self.cfg = gm.cfg
        self.gm, self.n_ctx = gm, int(n_ctx)
        self.cache = KVCache(c, n_ctx)
        self.st = cp.zeros(4, cp.int32)
        self.hist = cp.zeros(self.n_ctx + 1, cp.int32)   # hist[p + 1]: the token the step at p picked (p < n_ctx)
        sm = gpu.device_props()["sm_count"] if gpu._has_gpu() else 132
        self.plan = attn_plan(c.n_head, c.n_head_kv, self.n_ctx, sm, split, chunk, gmax)
        self.aws, self.acnt = attn_workspace(self.plan, c.n_head_kv, c.head_dim)
        self.amws = argmax_workspace(c.vocab)
        self.stream = _stream()
        self.graph: StepGraph | None = None
        self._pool = None
        self.graph_refused: str | None = None
        self.stats: dict = {}
        self.opts_key = gm.opts.key()
        self.kinds = [LayerKind(c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v,
                                int(c.sliding_window) if c.is_sliding(il) else 0, 1.0) for il in range(c.n_layer)]
        self.families: list[str] = []
        cp.cuda.runtime.deviceSynchronize()    # the zeroed buffers are ready before the decoder's own stream uses them

    # ---------------------------------------------------------------- host <-> device state
    def _on(self):
        return self.stream if self.stream is not None else contextlib.nullcontext()

    def set_state(self, tok: int, pos: int) -> None:
        """st = (tok, pos, no errors) from the host, on the decoder's stream."""
        cp = gpu.cp()
        with self._on():
            self.st[...] = cp.asarray(np.array([tok, pos, 0, 0], np.int32))

    def state(self) -> dict:
        """The decode state read back (synchronizes): token, position, error flags."""
        _sync(self.stream)
        s = gpu.cp().asnumpy(self.st)
        return {"tok": int(s[ST_TOK]), "pos": int(s[ST_POS]), "err": int(s[ST_ERR])}

    def check_errors(self) -> None:
        e = self.state()["err"]
        if e:
            why = []
            if e & ERR_POS:
                why.append(f"a position outside the cache's 0..{self.n_ctx - 1}")
            if e & ERR_NAN:
                why.append("a NaN logit")
            raise DecodeError(f"the decode steps flagged {' and '.join(why) or f'error bits {e:#x}'} (st[{ST_ERR}]="
                              f"{e:#x})")

    # ---------------------------------------------------------------- the prefill
    def prefill(self, toks) -> object:
        """The prefill of ``toks`` (eager) filling cache rows 0..n-1, then the first token: argmax of its logits from
        position n-1 -> st = (token, n), hist[n] = token. Returns the prefill's logits."""
        gm = self.gm
        n = len(toks)
        if n > self.n_ctx:
            raise DecodeError(f"a prompt of {n} tokens does not fit the cache's n_ctx={self.n_ctx}")
        self.set_state(0, n - 1)
        with self._on():
            gm.kv_sink = self.cache.fill
            try:
                logits = gm.forward(toks, graph=False)
            finally:
                gm.kv_sink = None
            argmax_step(logits, self.st, self.hist, self.amws)
        _sync(self.stream)
        return logits

    # ---------------------------------------------------------------- one step
    def _f16_ok(self, weights) -> bool:
        """An activation all of whose consumers read fp16 is written in fp16 by its producer (gemv_kq rounds f32 to
        f16 itself; cuBLAS reads the fp16 copy of a dequantized weight with other_f16): the same values."""
        return all(w.q is not None or self.gm.opts.other_f16 for w in weights)

    def _mm(self, x, w):
        if w.q is not None:
            self.families.append("gemv_kq")
            return dispatch.qmatmul(x, w.q, kernel="gemv_kq")
        self.families.append("cublas")
        return self.gm.matmul(x, w)

    def _op_mm(self, tr, name: str, il, x, w):
        """One projection of the step inside its op label (``name``: the weight's role, ``attn_q+attn_k`` for a
        stacked group; class the prefill's ``gemm_q4k`` / ``gemm_q6k`` / ``gemm_other_<type>``): :meth:`_mm`."""
        with tr.op(name, self.gm._gemm_class(w), layer=il, weight=w.name, macs=w.od * w.id):
            return self._mm(x, w)

    def _qkv(self, il: int, h, L, tr=None):
        tr = tr or _UNTRACED
        return self.gm.qkv_from(il, L, lambda w, names: self._op_mm(tr, "+".join(names), il, h, w))

    def _rope_append(self, il: int, q, k, v, L):
        """decode_qkv: q16 [1, H*hd] fp16 (normed, rotated, scaled), k and v appended as row st[ST_POS] of the cache."""
        cp = gpu.cp()
        c = self.cfg
        for a, w, what in ((q, c.n_head * c.head_dim, "q"), (k, c.n_head_kv * c.head_dim, "k"),
                           (v, c.n_head_kv * c.head_dim_v, "v")):
            if a.ndim != 2 or a.shape != (1, w) or str(a.dtype) != "float32":
                raise errors.ShapeError(f"decode_qkv: {what} must be float32 (1, {w}), got {a.dtype} {tuple(a.shape)}")
        q16 = cp.empty((1, c.n_head * c.head_dim), cp.float16)
        wq = L["attn_q_norm"].dense if c.qk_norm else q
        wk = L["attn_k_norm"].dense if c.qk_norm else k
        gpu.kernel("decode_qkv", NEOX=int(c.rope_style == "neox"), QKN=int(bool(c.qk_norm))).launch(
            (c.n_head + 2 * c.n_head_kv,),
            (q, k, v, wq, wk, q16, self.cache.k[il], self.cache.v[il], self.st, np.int32(self.n_ctx),
             np.int32(c.n_head), np.int32(c.n_head_kv), np.int32(c.head_dim), np.int32(c.head_dim_v),
             np.int32(c.n_rot), np.float32(c.rms_eps), np.float32(c.rope_base_for(il)),
             np.float32(c.rope_scale_for(il)), np.float32(c.attn_scale)))
        return q16

    def _ffn_in(self, il: int, h, L, tr=None):
        cp = gpu.cp()
        tr = tr or _UNTRACED
        gm, c = self.gm, self.cfg
        gu = gm.gate_up(il) if gm.opts.fuse_gate_up else None
        act = 0 if c.ffn_act == "gelu_tanh" else 1
        out16 = self._f16_ok([L["ffn_down"]])
        if gu is not None:
            y = self._op_mm(tr, "ffn_gate_up", il, h, gu)
            n_ff = gu.od // 2
            with tr.op("ffn_act", "activation", layer=il):
                m = cp.empty((1, n_ff), cp.float16 if out16 else cp.float32)
                check_act_mul_gu(y, m, n_ff)
                gm._k("act_mul_gu", ACT=act, OUT16=int(out16)).launch(((m.size + 255) // 256,),
                                                                      (y, m, np.int32(n_ff), np.int64(m.size)))
            return m
        g = self._op_mm(tr, "ffn_gate", il, h, L["ffn_gate"])
        u = self._op_mm(tr, "ffn_up", il, h, L["ffn_up"])
        with tr.op("ffn_act", "activation", layer=il):
            m = cp.empty(g.shape, cp.float16 if out16 else cp.float32)
            gm._k("act_mul", ACT=act, OUT16=int(out16)).launch(((g.size + 255) // 256,), (g, u, m, np.int64(g.size)))
        return m

    def _head(self, xs):
        cp = gpu.cp()
        gm = self.gm
        if gm.head is None:      # tied: the embedding table (its fp16 copy with other_f16), as the prefill
            self.families.append("cublas")
            if gm.opts.other_f16:
                return blas.gemm_dense(cp.ascontiguousarray(xs, dtype=cp.float16), gm.embd16())
            return blas.gemm_dense(cp.ascontiguousarray(xs, dtype=cp.float32), gm.embd)
        return self._mm(xs, gm.head)

    def _step_device(self, tracer=None):
        """One decode step from the device state: kernel launches only (capturable). Returns the logits [1, vocab].
        ``tracer`` (:mod:`labkernels.trace`; None: no labels): every launch of the step inside an op label -- embed,
        the norms (as the prefill labels them), each projection (its weight's role, class ``gemm_*``), decode_qkv
        (``rope``: q/k norm, RoPE, the cache append), ``attention``, ``ffn_act``, the head (``output_head``) and the
        argmax (``sampling``) -- for round 9's step decomposition (:mod:`labkernels.rounds.r09_decode.decomp`); the
        labels launch nothing and change no number."""
        cp = gpu.cp()
        gm, c = self.gm, self.cfg
        tr = tracer or _UNTRACED
        self.families = []
        x = cp.empty((1, c.n_embd), cp.float32)
        with tr.op("embed", "embed"):
            gm._k("embed", F16=0).launch((1,), (gm.embd, self.st, x, np.int32(c.n_embd), np.float32(c.embed_scale)))
        pend = None
        for il, L in enumerate(gm.layers):
            h = gm._residual_norm(tr, "attn_norm", il, x, pend, L["attn_norm"],
                                  out16=self._f16_ok([w for w, _ in gm.qkv_groups(il)]))
            q, k, v = self._qkv(il, h, L, tr)
            if c.attn_bias:
                with tr.op("qkv_bias", "elementwise", layer=il):
                    q += L["attn_q_bias"].dense
                    k += L["attn_k_bias"].dense
                    v += L["attn_v_bias"].dense
            with tr.op("decode_qkv", "rope", layer=il):
                q16 = self._rope_append(il, q, k, v, L)
            with tr.op("attention", "attention", layer=il):
                a = decode_attention(q16, self.cache.k[il], self.cache.v[il], self.st, self.kinds[il], self.n_ctx,
                                     self.plan, self.aws, self.acnt, out16=self._f16_ok([L["attn_output"]]))
            a = self._op_mm(tr, "attn_output", il, a, L["attn_output"])
            pend = (a, L["post_attention_norm"] if c.post_norms else None, "post_attention_norm")
            h = gm._residual_norm(tr, "ffn_norm", il, x, pend, L["ffn_norm"],
                                  out16=self._f16_ok(gm._ffn_in_weights(il)))
            m = self._ffn_in(il, h, L, tr)
            d = self._op_mm(tr, "ffn_down", il, m, L["ffn_down"])
            pend = (d, L["post_ffw_norm"] if c.post_norms else None, "post_ffw_norm")
        head16 = self._f16_ok([gm.head]) if gm.head is not None else gm.opts.other_f16
        xs = gm._residual_norm(tr, "output_norm", None, x, pend, gm.output_norm, out16=head16)
        with tr.op("output", "output_head", weight=gm.head_name, macs=c.vocab * c.n_embd):
            logits = self._head(xs)
        with tr.op("argmax", "sampling"):
            argmax_step(logits, self.st, self.hist, self.amws)
        return logits

    def step(self, token: int | None = None):
        """One eager decode step at the device position (``token``: written into st[ST_TOK] first -- teacher forcing;
        None: the previous step's argmax). Returns the step's logits [vocab] (f32)."""
        if token is not None:
            if not _is_int(token) or not 0 <= token < self.cfg.vocab:
                raise DecodeError(f"token id {token!r} is outside the vocabulary 0..{self.cfg.vocab - 1}")
            cp = gpu.cp()
            with self._on():
                self.st[ST_TOK:ST_TOK + 1] = cp.asarray(np.array([token], np.int32))
        with self._on():
            out = self._step_device()[0]
        _sync(self.stream)                      # computed when returned (the stream is not the caller's)
        return out

    # ---------------------------------------------------------------- the captured step
    def _prepare(self) -> None:
        """The lazily built per-weight state (gemv_kq's q6_K planes, fp16 copies of dequantized weights) made before
        the private pool is in use."""
        gm = self.gm
        ws = [gm.head] if gm.head is not None else []
        for il, L in enumerate(gm.layers):
            ws += [w for w, _ in gm.qkv_groups(il)] + gm._ffn_in_weights(il) + [L["attn_output"], L["ffn_down"]]
        for w in ws:
            if w.q is not None:
                gemv.prepare(w.q)
            elif gm.opts.other_f16 and w.dense is not None and w.dense.ndim == 2:
                w.dense16()
        if gm.head is None and gm.opts.other_f16:
            gm.embd16()
        # gemv_kq's split workspace of this stream, sized for every weight of the step (S <= the super-blocks of a
        # row, one counter per row group) from the default pool: never grown inside the private pool or the capture
        kq = [w.q for w in ws if w.q is not None]
        if kq and self.stream is not None:
            floats = max(w.od * (w.id // gemv.QK) for w in kq)
            ctas = max(-(-w.od // gemv.rows_per_cta(1, 4, 3)) for w in kq)   # FORM=3's 16-row groups: the most
            with self._on():
                gemv._WS.get(self.stream.ptr, floats, ctas)
        gpu.cp().cuda.runtime.deviceSynchronize()   # made on the default stream: ready before the decoder's stream reads

    def _capture(self):
        """Eager warm-up step (in a private pool), capture of the step, first replay at the warm-up's position
        checked against it. Returns the warm-up's logits; sets self.graph, or raises GraphCaptureError."""
        cp = gpu.cp()
        why = forward_common.graph_support()
        if why:
            raise GraphCaptureError(why)
        t0 = time.perf_counter()
        self._prepare()
        s0 = self.state()
        pool = self._pool = cp.cuda.MemoryPool()          # kept with the decoder: what the graph replays lives here
        stream = self.stream
        with cp.cuda.using_allocator(pool.malloc), stream:
            ref = self._step_device().copy()                 # eager: the real step at s0's position
            stream.synchronize()
            s1 = self.state()
            families = list(self.families)
            captured = {}

            def work():
                with gpu.programmatic_launches(self.gm.opts.pdl):
                    captured["logits"] = self._step_device()

            pdl0 = gpu.pdl_launch_count()
            try:
                graw = graph_nodes.capture(work, stream)
            except graph_nodes.CaptureError as e:
                raise GraphCaptureError(f"stream capture of the decode step returned no graph: {e}") from e
            except Exception as e:
                raise GraphCaptureError(f"capture of the decode step failed: {type(e).__name__}: {e}") from e
            pdl_n = gpu.pdl_launch_count() - pdl0
            try:
                rew = graph_nodes.memsets_to_kernels(graw) if self.gm.opts.memsets_as_kernels else \
                    {"replaced": 0, "left": sum(r["type"] == "MEMSET" for r in graph_nodes.census(graw))}
                g = forward_common._instantiate(graw)
            except BaseException as e:
                graph_nodes.destroy(graw)
                if isinstance(e, Exception):
                    raise GraphCaptureError(f"instantiating the decode step's graph failed: {type(e).__name__}: "
                                            f"{e}") from e
                raise
            self.families = families
            # the first replay at the warm-up's position: the same token, so the same numbers (up to a library's
            # choice of algorithm under capture)
            self.set_state(s0["tok"], s0["pos"])
            g.launch(stream=stream)
            stream.synchronize()
            out = captured["logits"]
            diff = float(cp.abs(out - ref).max())
            scale = float(cp.abs(ref).max())
        rel = diff / scale if scale else diff
        keep = (self.aws, self.acnt, self.amws, gemv._WS.bufs.get(stream.ptr))
        bad = None
        if not np.isfinite(rel) or rel > GRAPH_RTOL:
            bad = f"max rel diff {rel:.3g} > {GRAPH_RTOL:g}"
        elif self.state() != s1:
            bad = f"it left the state {self.state()}, the eager step {s1}"
        if bad:
            g.close()
            self.set_state(s0["tok"], s0["pos"])            # the eager step again: its cache rows and state
            self.step()
            raise GraphCaptureError(f"the decode step's first replay differs from the eager step: {bad}")
        self.graph = StepGraph(g, pool, out, keep, time.perf_counter() - t0, rel, diff == 0.0, pdl_launches=pdl_n,
                               memsets_replaced=rew["replaced"], memsets_left=rew["left"], replays=1)
        return ref[0]

    def replay(self, steps: int = 1) -> None:
        """``steps`` replays of the captured step (no host work between them)."""
        if self.graph is None:
            raise DecodeError("no captured decode step: run generate (or a step in graph mode) first")
        for _ in range(steps):
            self.graph.graph.launch(stream=self.stream)
        self.graph.replays += steps

    # ---------------------------------------------------------------- generation
    def generate(self, toks, n_new: int, graph="opts") -> list[int]:
        """Prefill ``toks`` (a checked int32 prompt, see :func:`check_request`), then ``n_new - 1`` decode steps;
        the ``n_new`` tokens. Timings and modes in :attr:`stats`."""
        cp = gpu.cp()
        want = self.gm.opts.graph if graph == "opts" else graph
        if want not in (None, True, False):
            raise ValueError(f"graph must be True, False or None (auto), got {want!r}")
        n = len(toks)
        if n + n_new > self.n_ctx:
            raise DecodeError(f"a context of {n} prompt + {n_new} new = {n + n_new} tokens is longer than the "
                              f"cache's n_ctx={self.n_ctx}")
        st = {"n_prompt": n, "n_new": n_new, "n_ctx": self.n_ctx, "cache_bytes": self.cache.nbytes,
              "attn_plan": dataclasses.asdict(self.plan)}
        t0 = time.perf_counter()
        self.prefill(toks)
        _sync(self.stream)
        st["prefill_ms"] = (time.perf_counter() - t0) * 1e3
        steps = n_new - 1
        mode = "eager" if want is False or steps == 0 or (want is None and self.graph_refused) else "graph"
        eager_steps = 0
        if mode == "graph" and self.graph is None:
            t1 = time.perf_counter()
            try:
                self._capture()                            # the first step runs eager inside
            except Exception as e:
                if want is True or not isinstance(e, GraphCaptureError):
                    raise
                self.graph_refused = str(e)
                mode = "eager"
                # the warm-up step may have run: continue from the device state
            else:
                eager_steps = 1
            st["first_step_capture_ms"] = (time.perf_counter() - t1) * 1e3
            if mode == "eager":
                eager_steps = self.state()["pos"] - n
        remaining = steps - eager_steps
        if mode == "graph":
            st["replays"] = 0
            st["capture"] = {k: getattr(self.graph, k) for k in ("capture_s", "max_rel_diff", "bitwise",
                                                                 "pdl_launches", "memsets_replaced", "memsets_left")}
            if remaining > 0:
                ev = (cp.cuda.Event(), cp.cuda.Event())
                _sync(self.stream)
                ta = time.perf_counter()
                ev[0].record(self.stream)
                for _ in range(remaining):
                    self.graph.graph.launch(stream=self.stream)
                tl = time.perf_counter()
                ev[1].record(self.stream)
                self.stream.synchronize()
                tb = time.perf_counter()
                self.graph.replays += remaining
                gpu_ms = float(cp.cuda.get_elapsed_time(ev[0], ev[1]))
                wall = (tb - ta) * 1e3
                st.update(replays=remaining, gpu_ms=gpu_ms, tok_per_s=remaining / (gpu_ms / 1e3),
                          wall_ms=wall, tok_per_s_wall=remaining / (wall / 1e3), host_launch_ms=(tl - ta) * 1e3,
                          host_outside_ms=wall - gpu_ms)
        else:
            t1 = time.perf_counter()
            for _ in range(remaining):
                self.step()
            _sync(self.stream)
            wall = (time.perf_counter() - t1) * 1e3
            if remaining:
                st.update(eager_steps_ms=wall, tok_per_s_eager=remaining / (wall / 1e3))
        st["mode"] = mode
        st["graph_refused"] = self.graph_refused
        st["families"] = _count(self.families)
        self.check_errors()
        out = cp.asnumpy(self.hist[n:n + n_new]).astype(int).tolist()
        st["tokens"] = out
        self.stats = st
        return out

    def free(self) -> None:
        """Give the graph, its pool and the cache back."""
        if self.graph is not None:
            self.graph.graph.close()
            self.graph = None
        if self._pool is not None:
            self._pool.free_all_blocks()
            self._pool = None
        self.cache = None


def _count(xs) -> str:
    from collections import Counter

    return ", ".join(f"{k} x {v}" for k, v in sorted(Counter(xs).items())) or "none"


def decoder(gm, n_ctx: int) -> Decoder:
    """The model's decoder for a cache of ``n_ctx`` positions: kept with the model (``gm._decoder``: its cache and
    captured step are reused by the next generate of the same n_ctx and options), replaced otherwise."""
    d = getattr(gm, "_decoder", None)
    if d is not None and d.n_ctx == n_ctx and d.opts_key == gm.opts.key() and d.cache is not None:
        return d
    if d is not None:
        d.free()
        gm._decoder = None
    d = Decoder(gm, n_ctx)
    gm._decoder = d
    return d


def generate(gm, prompt_ids, n_new, sampler: str = "greedy", n_ctx=None, graph="opts") -> list[int]:
    """``n_new`` greedy tokens after ``prompt_ids`` (see the module docstring). Every check of the request is made
    before any GPU work (:func:`check_request`); ``n_ctx`` (the cache's positions) defaults to the request rounded up
    to 256 (at most the training context), or the kept decoder's when that is long enough."""
    toks, need = check_request(gm.cfg, prompt_ids, n_new, sampler, n_ctx)
    bad = decode_problems(gm.cfg)
    if bad:
        raise DecodeError(f"the decode path cannot take {gm.cfg.arch} ({'; '.join(bad)})")
    if n_ctx is None:
        d = getattr(gm, "_decoder", None)
        n_ctx = d.n_ctx if d is not None and d.n_ctx >= need and d.opts_key == gm.opts.key() else \
            default_n_ctx(gm.cfg, need)
    dec = decoder(gm, int(n_ctx))
    out = dec.generate(toks, int(n_new), graph=graph)
    gm.last_generate = dec.stats
    return out
