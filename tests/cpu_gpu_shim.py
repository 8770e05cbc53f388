"""A numpy stand-in for labkernels.gpu, so the prefill's Python-side logic (op order, reshapes, GQA head
mapping, masks, the per-weight paths) is tested on CPU machines against the independent CPU reference.
Each fake kernel is a plain numpy transcription of what its CUDA counterpart documents; the GEMMs use the
exact integer reference (q8_1 activations), as the lab kernels do."""
from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np

from labkernels import dispatch, gpu, quants, reference


class _FakeCuda:
    class runtime:
        @staticmethod
        def deviceSynchronize():
            pass

    @staticmethod
    def get_current_stream():
        return types.SimpleNamespace(synchronize=lambda: None)


def make_cp():
    cp = types.SimpleNamespace()
    for name in ("float32", "float16", "int32", "uint8", "uint32", "empty", "empty_like", "zeros", "matmul",
                 "argmax", "ascontiguousarray", "full", "ndarray", "concatenate"):
        setattr(cp, name, getattr(np, name))
    cp.asarray = lambda a, dtype=None: np.array(a, dtype=dtype, copy=True)
    cp.asnumpy = lambda a: np.array(a, copy=True)
    cp.cuda = _FakeCuda
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    return cp


@dataclass
class FakeQWeight:
    raw: np.ndarray
    qtype: str
    od: int
    id: int
    stride: int
    host: np.ndarray = None
    wg: object = None

    @classmethod
    def upload(cls, w_raw, qtype, stride=None):
        qt = quants.qtype_info(qtype)
        return cls(np.asarray(w_raw), qt.name, w_raw.shape[0], w_raw.shape[1] // qt.nbytes * qt.qk, qt.nbytes,
                   host=np.asarray(w_raw))


def fake_prepass(x):
    """A Q8Tiles whose qa8 holds the float activations (the fake GEMM quantizes them itself)."""
    assert x.dtype == np.float32 and x.shape[1] % 256 == 0
    return gpu.Q8Tiles(np.array(x), None, x.shape[0], x.shape[1])


EXACT = {"on": False}


def fake_gemm(w, a, family=None, out=None, **kw):
    if EXACT["on"]:   # float activations: isolates the prefill logic from q8_1 activation rounding
        y = (a.qa8.astype(np.float64) @ quants.dequantize(w.raw, w.qtype).astype(np.float64).T).astype(np.float32)
    else:
        y = reference.gemm_int_ref(w.raw, w.qtype, reference.quantize_activations(a.qa8)).astype(np.float32)
    if out is not None:
        out[...] = y
        return out
    return y


def fake_dequant_f16(w, out=None):
    return quants.dequantize(w.raw, w.qtype).astype(np.float16)


class FakeKernel:
    def __init__(self, family, params):
        self.family, self.p = family, params

    def launch(self, grid, args):
        getattr(self, "_" + self.family)(*args)

    def _rmsnorm(self, x, w, y, ncols, eps):
        xr = x.reshape(-1, int(ncols)).astype(np.float32)
        sc = 1.0 / np.sqrt((xr * xr).sum(1, keepdims=True) / float(ncols) + np.float32(eps))
        y.reshape(-1, int(ncols))[...] = (xr * sc) * (w if self.p["W"] else 1.0)

    def _rope(self, x, n, nh, hd, nrot, ld, base, fs, pos0):
        n, nh, hd, nrot = int(n), int(nh), int(hd), int(nrot)
        half = nrot // 2
        x2 = x if x.ndim == 2 else x.reshape(n, -1)       # a row view (stacked QKV output) stays a view
        v = x2[:, : nh * hd].reshape(n, nh, hd)
        i = np.arange(half)
        theta = (np.arange(n)[:, None] + int(pos0)) * float(fs) * float(base) ** (-2.0 * i / nrot)
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        a = i if self.p["NEOX"] else 2 * i
        b = i + half if self.p["NEOX"] else 2 * i + 1
        x0, x1 = v[:, :, a].copy(), v[:, :, b].copy()
        v[:, :, a] = x0 * c - x1 * s
        v[:, :, b] = x0 * s + x1 * c

    def _rope_qk(self, q, k, n, nh, nhk, hd, nrot, ldq, ldk, base, fs, pos0, qscale):
        self._rope(q, n, nh, hd, nrot, ldq, base, fs, pos0)
        self._rope(k, n, nhk, hd, nrot, ldk, base, fs, pos0)
        if float(qscale) != 1.0:
            v = q.reshape(int(n), -1)[:, : int(nh) * int(hd)]
            v *= np.float32(qscale)

    def _rope_qkv16(self, q, k, v, q16, k16, v16, n, nh, nhk, hd, hdv, nrot, ldq, ldk, ldv, base, fs, pos0, qscale):
        n = int(n)
        q, k = q.copy(), k.copy()                    # the kernel reads f32 and writes fp16 copies
        self._rope_qk(q, k, n, nh, nhk, hd, nrot, ldq, ldk, base, fs, pos0, 1.0)
        q = q.reshape(n, -1)[:, : int(nh) * int(hd)]
        if float(qscale) != 1.0:
            q *= np.float32(qscale)
        for src, dst, w in ((q, q16, int(nh) * int(hd)), (k, k16, int(nhk) * int(hd)), (v, v16, int(nhk) * int(hdv))):
            dst.reshape(n, w)[...] = src.reshape(n, -1)[:, :w].astype(np.float16)

    def _rmsnorm_qk(self, q, k, wq, wk, yq, yk, nh, nhk, hd, ldq, ldk, eps):
        n, hd = q.shape[0], int(hd)
        for src, dst, h in ((q, yq, int(nh)), (k, yk, int(nhk))):
            rows = np.ascontiguousarray(src[:, : h * hd]).reshape(-1, hd)
            out = np.empty_like(rows)
            FakeKernel("rmsnorm", {"W": 1}).launch(None, (rows, wq if src is q else wk, out, hd, eps))
            dst.reshape(n, h * hd)[...] = out.reshape(n, h * hd)

    def _qk_norm_rope_qkv16(self, q, k, v, wq, wk, q16, k16, v16, nh, nhk, hd, hdv, nrot, ldq, ldk, ldv, eps, base,
                            fs, pos0, qscale):
        n = q.shape[0]
        yq, yk = np.empty((n, int(nh) * int(hd)), np.float32), np.empty((n, int(nhk) * int(hd)), np.float32)
        self._rmsnorm_qk(q, k, wq, wk, yq, yk, nh, nhk, hd, ldq, ldk, eps)
        self._rope_qkv16(yq, yk, v, q16, k16, v16, n, nh, nhk, hd, hdv, nrot, yq.shape[1], yk.shape[1], ldv, base, fs,
                         pos0, qscale)

    def _add_rmsnorm(self, x, a, wpre, w, y, ncols, eps):
        d = a
        if self.p["PRE"]:
            d = np.empty_like(a)
            FakeKernel("rmsnorm", {"W": 1}).launch(None, (a, wpre, d, ncols, eps))
        x += d
        FakeKernel("rmsnorm", {"W": 1}).launch(None, (x, w, y, ncols, eps))

    def _softmax_mask(self, S, n_q, n_k, scale, window):
        n_q, n_k, window = int(n_q), int(n_k), int(window)
        R = S.reshape(-1, n_k)
        q = (np.arange(R.shape[0]) % n_q)[:, None]
        k = np.arange(n_k)[None, :]
        vis = (k <= q) & ((window == 0) | (q - k < window))
        z = np.where(vis, R.astype(np.float32) * float(scale), -np.inf)
        z = np.exp(z - z.max(1, keepdims=True))
        R[...] = z / z.sum(1, keepdims=True)

    def _act_mul(self, g, u, out, n):
        if self.p["ACT"] == 0:
            a = 0.5 * g * (1.0 + np.tanh(0.7978845608028654 * g * (1.0 + 0.044715 * g * g)))
        else:
            a = g / (1.0 + np.exp(-g))
        out[...] = (a * u).astype(out.dtype)

    def _act_mul_gu(self, gu, out, n_ff, n):
        n_ff = int(n_ff)
        rows = gu.reshape(-1, 2 * n_ff)
        self._act_mul(np.ascontiguousarray(rows[:, :n_ff]), rows[:, n_ff:], out.reshape(-1, n_ff), n)

    def _flash_attn(self, q, k, v, o, n, H, Hk, WH, window, scale_log2, items, kcb, maxc, ws, cnt):
        from labkernels.attention_kinds import LayerKind, sdpa_ref

        n, H, Hk, d = int(n), int(H), int(Hk), int(self.p["D"])
        assert H % int(WH) == 0 and (H // Hk) % int(WH) == 0      # a CTA's heads share one kv head
        kind = LayerKind(H, Hk, d, d, int(window), float(scale_log2) / np.log2(np.e))
        o[...] = sdpa_ref(q, k, v, n, kind).astype(np.float16)

    def _embed(self, table, tok, out, d, scale):
        out[...] = table[tok[: out.shape[0]]] * np.float32(scale)     # block r reads tok[r]

    # -- the decode step's kernels (kernels/decode.cu); st = (token, position, error flags, -)
    def _decode_qkv(self, q, k, v, wq, wk, q16, kc, vc, st, n_ctx, nh, nhk, hd, hdv, nrot, eps, base, fs, qscale):
        """The prefill's qk_norm_rope_qkv16 (QKN=1) / rope_qkv16 (QKN=0) at one token and pos0 = st[1]; q -> q16, k
        and v -> row st[1] of the cache; a position outside the cache writes nothing and sets bit 0 of st[2]."""
        pos = int(st[1])
        if not 0 <= pos < int(n_ctx):
            st[2] |= 1
            return
        q, k, v = (np.array(a.reshape(1, -1), np.float32) for a in (q, k, v))
        k16 = np.empty((1, int(nhk) * int(hd)), np.float16)
        v16 = np.empty((1, int(nhk) * int(hdv)), np.float16)
        q16v = q16.reshape(1, -1)
        if self.p["QKN"]:
            FakeKernel("qk_norm_rope_qkv16", {"NEOX": self.p["NEOX"]})._qk_norm_rope_qkv16(
                q, k, v, wq, wk, q16v, k16, v16, nh, nhk, hd, hdv, nrot, q.shape[1], k.shape[1], v.shape[1], eps, base,
                fs, pos, qscale)
        else:
            FakeKernel("rope_qkv16", {"NEOX": self.p["NEOX"]})._rope_qkv16(
                q, k, v, q16v, k16, v16, 1, nh, nhk, hd, hdv, nrot, q.shape[1], k.shape[1], v.shape[1], base, fs, pos,
                qscale)
        kc[pos] = k16[0]
        vc[pos] = v16[0]

    def _decode_attn(self, q16, kc, vc, o, st, n_ctx, H, Hk, window, scale_log2, CH, maxch, ws, cnt, out16):
        """The token at p = st[1]: per query head h, softmax over keys lo..p (lo = p - window + 1 on a sliding layer,
        else 0) of scale * q_h . k_j (scale = scale_log2 / log2(e)) times v_j, kv head h // (H / Hk); in float64."""
        pos, H, Hk, window, D = int(st[1]), int(H), int(Hk), int(window), int(self.p["D"])
        if not 0 <= pos < int(n_ctx):
            return
        lo = max(0, pos - window + 1) if window > 0 else 0
        K = kc.reshape(int(n_ctx), Hk, D)[lo:pos + 1].astype(np.float64)
        V = vc.reshape(int(n_ctx), Hk, D)[lo:pos + 1].astype(np.float64)
        qh = q16.reshape(H, D).astype(np.float64)
        out = np.empty((H, D))
        for h in range(H):
            s = K[:, h // (H // Hk)] @ qh[h] * (float(scale_log2) / np.log2(np.e))
            p = np.exp(s - s.max())
            out[h] = (p / p.sum()) @ V[:, h // (H // Hk)]
        o.reshape(-1)[...] = out.reshape(-1).astype(np.float16 if int(out16) else np.float32)

    def _argmax_step(self, logits, n, st, hist, hist_len, wsv, wsi, cnt):
        """st[0] = the lowest index of the largest logit (NaN skipped, bit 1 of st[2]; none left: 0), st[1] += 1,
        hist[st[1]] = the token (a position outside hist: bit 0 of st[2])."""
        x = logits.reshape(-1)[: int(n)]
        nan = np.isnan(x)
        if nan.any():
            st[2] |= 2
        if nan.all():
            tok = 0
        else:
            tok = int(np.flatnonzero(~nan & (x == x[~nan].max()))[0])
        p = int(st[1]) + 1
        st[0], st[1] = tok, p
        if 0 <= p < int(hist_len):
            hist[p] = tok
        else:
            st[2] |= 1


def install(monkeypatch, exact: bool = False):
    """Replace labkernels.gpu's device entry points with the numpy versions for one test. ``exact``: the
    k-quant GEMMs use float activations (no q8_1), so only float32 rounding separates the two forwards."""
    from labkernels import blas, gpu

    monkeypatch.setitem(EXACT, "on", exact)
    cp = make_cp()
    monkeypatch.setattr(gpu, "cp", lambda: cp)
    monkeypatch.setattr(gpu, "kernel", lambda family, **p: FakeKernel(family, p))
    monkeypatch.setattr(gpu, "prepass", fake_prepass)
    monkeypatch.setattr(gpu, "gemm", fake_gemm)
    monkeypatch.setattr(gpu, "dequant_f16", fake_dequant_f16)
    monkeypatch.setattr(gpu, "QWeight", FakeQWeight)
    monkeypatch.setattr(blas, "bmm_f16", lambda A, B, out=None: np.matmul(A.astype(np.float32), B.astype(np.float32)).astype(np.float16))
    monkeypatch.setattr(blas, "gemm_dense", fake_gemm_dense)
    monkeypatch.setattr(gpu, "pinned_empty", lambda shape, dtype: np.empty(shape, dtype))
    monkeypatch.setattr(gpu, "h2d_async", lambda dst, host, stream: dst.__setitem__(Ellipsis, host))
    from labkernels import gemv

    monkeypatch.setattr(gemv, "gemv", fake_gemv)
    from labkernels import attention

    # the fake device counts as a GPU for an explicitly requested lab attention (its kernel is faked above);
    # "auto" still finds no cuDNN here and runs the baseline
    monkeypatch.setattr(attention, "_gpu_ok", lambda: None)
    return cp


_F32: dict = {}


def _as_f32(w):
    """A weight in float32: fp16 ones converted per call, except the big ones (Gemma's tied output head: 168M values,
    a decode step's largest operand) converted once and kept while the array lives."""
    if w.dtype == np.float32:
        return w
    import weakref

    key = id(w)
    hit = _F32.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1]
    f = w.astype(np.float32)
    if w.size >= 1 << 22:
        _F32[key] = (weakref.ref(w), f)
        weakref.finalize(w, _F32.pop, key, None)
    return f


def fake_gemm_dense(x, w, out=None):
    """blas.gemm_dense on the CPU: the same checks' outcome (shapes chain, one dtype), fp32 result."""
    assert x.ndim == 2 and w.ndim == 2 and x.shape[1] == w.shape[1] and x.dtype == w.dtype
    return np.matmul(x.astype(np.float32), _as_f32(w).T)


def fake_gemv(w, x, out=None, S=None, MT=2, WARPS=4, FORM=0, PF=None):
    """labkernels.gemv.gemv on the CPU: the kernel's exact function (its docstring) -- the f16 weights of
    gemv.emulate_weights (FORM=1: gemv.exact_weights_v2, q4_K nt <= 8) times the activations rounded to f16, summed
    in float64 -> f32 [nt, od]."""
    from labkernels import gemv

    assert x.ndim == 2 and x.shape[1] == w.id and 1 <= x.shape[0] <= gemv.MAX_NT and x.dtype in (np.float16, np.float32)
    assert FORM in gemv.FORMS and (FORM == 0 or (w.qtype == "q4_K" and x.shape[0] <= gemv.FORM1_MAX_NT))
    assert FORM in (0, 1) or MT == 1
    assert gemv.check_pf(PF) == 0       # round 9 step 8's PF=1 left the source (a ShapeError): None / 0 only
    attr = "_emu16" if FORM == 0 else "_emu_v2"
    w16 = getattr(w, attr, None)
    if w16 is None:
        host = np.asarray(w.host if w.host is not None else w.raw)
        w16 = (gemv.emulate_weights(host, w.qtype).astype(np.float64) if FORM == 0
               else gemv.exact_weights_v2(host, w.qtype))
        setattr(w, attr, w16)
    y = (x.astype(np.float16).astype(np.float64) @ w16.T).astype(np.float32)
    if out is not None:
        out[...] = y
        return out
    return y


def install_wgmma(monkeypatch, f16_only: bool = True):
    """Stand the round-7 family in on the CPU: the kernel's exact function (the emulated 16-bit weights times the
    16-bit activations), so the prefill's wgmma path -- fp16 activations shared per input, qmatmul routing -- runs
    without a GPU."""
    from labkernels import wgmma

    @dataclass
    class FakeWg:
        raw: np.ndarray      # the repacked bytes
        qtype: str
        od: int
        id: int
        repack_s: float = 0.0
        plane: np.ndarray | None = None   # q4_K: the scale plane of SCL=2, as WgWeight.from_gguf(plane=True) makes it
        plane_s: float = 0.0

        @property
        def packed(self):
            return self.raw

        @property
        def nbytes(self):
            return int(self.raw.nbytes)

        @property
        def plane_bytes(self):
            return 0 if self.plane is None else int(self.plane.nbytes)

    def from_gguf(raw, qtype, plane=False):
        raw = np.asarray(raw)
        od, id_ = raw.shape[0], raw.shape[1] // wgmma.BLOCK_BYTES[qtype] * 256
        p = wgmma.repack(raw, qtype)
        pl = wgmma.scale_plane(p.reshape(od, id_ // 256, 144)[..., :16]) if qtype == "q4_K" and plane else None
        return FakeWg(p, qtype, od, id_, plane=pl)

    def fake_wg_gemm(w, x, out=None, **p):
        if f16_only:
            assert x.dtype == np.float16, "the prefill hands wgmma_kq fp16 activations"
        x = x.astype(np.float16)   # what wgmma.gemm does with float32 activations
        w16 = getattr(w, "_emu16", None)      # the emulated weights, made once per weight
        if w16 is None:
            w16 = w._emu16 = wgmma.emulate_weights(w.raw, w.qtype, w.od, w.id)
        y = (x.astype(np.float64) @ w16.T).astype(np.float32)
        if out is not None:
            out[...] = y
            return out
        return y

    monkeypatch.setattr(wgmma, "supported", lambda cc=None: True)
    monkeypatch.setattr(wgmma, "require_sm90a", lambda: None)
    monkeypatch.setattr(wgmma.WgWeight, "from_gguf", staticmethod(from_gguf))
    monkeypatch.setattr(wgmma, "gemm", fake_wg_gemm)
    # round 7's launcher of its exploratory builds (its experiments call it as builds.gemm): a build computes the plain
    # kernel's function here (its ``defines`` ignored)
    from labkernels.rounds.r07_wgmma import builds

    monkeypatch.setattr(builds, "gemm", fake_wg_gemm)
    calls = []
    real_qmatmul = dispatch.qmatmul

    def counting_qmatmul(x, w, kernel="auto", out=None, **p):
        y = real_qmatmul(x, w, kernel=kernel, out=out, **p)
        calls.append(dispatch.last_choice().family)
        return y

    monkeypatch.setattr(dispatch, "qmatmul", counting_qmatmul)
    return calls


class OpNames:
    """A tracer that lists the names of the ops a forward runs (inactive, like NullTracer: no launch is tagged)."""
    active = False

    def __init__(self):
        self.names = []

    def op(self, name, cls, **kw):
        from labkernels.trace import NullTracer

        self.names.append(name)
        return NullTracer().op(name, cls, **kw)
