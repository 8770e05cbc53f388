"""Issue 18 on CPU: the prefill's CUDA-graph cache (keys, options, the recorded fallback, the capture's checks)
and the fused small kernels (argument validation, the fused forward against the unfused one) with the numpy
stand-ins of tests/cpu_gpu_shim.py. The GPU side (real capture, the kernels' bitwise parity) is in
tests/gpu/test_prefill_graph_gpu.py."""
import contextlib
import types

import numpy as np
import pytest

from cpu_gpu_shim import OpNames as Ops, install
from labkernels import errors
from labkernels.forward_common import GraphCaptureError, check_act_mul_gu
from labkernels.prefill import (FUSIONS, GpuModel, PrefillOptions, Weight, check_add_rmsnorm, check_rope_qk,
                                check_rope_qkv16)
from labkernels.prefill_replay import GraphEntry, timed_prefill
from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config
from labkernels.trace import NullTracer

TOKS = [1, 17, 300, 42, 99, 7, 511]


@pytest.fixture(scope="module")
def tiny():
    cfg = tiny_config("llama", n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, vocab=512)
    return SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=11)


# ------------------------------------------------------------------ options and keys


def test_fusions_list_every_fusion_flag():
    """FUSIONS (the 'unfused' baseline's switches) names every launch fusion of PrefillOptions; fuse_f16 is a
    precision-neutral output format, not a launch fusion, and stays on in the baseline."""
    from dataclasses import fields

    flags = {f.name for f in fields(PrefillOptions) if f.name.startswith("fuse_")}
    assert set(FUSIONS) == flags - {"fuse_f16"} and len(FUSIONS) == len(set(FUSIONS))
    assert all(getattr(PrefillOptions(), f) is True for f in FUSIONS)


def test_options_key_excludes_graph_and_tracks_the_rest():
    a, b = PrefillOptions(graph=True), PrefillOptions(graph=False)
    assert a.key() == b.key()                                   # the mode is not part of what is captured
    assert PrefillOptions(fuse_rope=False).key() != a.key()
    assert PrefillOptions(q6k_variant={"KDR": 8}).key() != a.key()
    assert dict(a.key())["fuse_add_norm"] is True and "graph" not in dict(a.key())
    hash(a.key())                                               # usable in a dict key
    with pytest.raises(ValueError, match="graph must be"):
        PrefillOptions(graph="yes")


def test_options_key_is_cached_until_an_option_changes():
    """key() is cached (each replay asks for it) and follows every change: a field set, q6k_variant edited in
    place, a dataclasses.replace copy."""
    import dataclasses

    o = PrefillOptions()
    k = o.key()
    assert o.key() is k                                          # cached
    o.fuse_rope = False
    assert dict(o.key())["fuse_rope"] is False and o.key() != k
    o.fuse_rope = True
    assert o.key() == k
    o.q6k_variant["KDR"] = 8                                     # in place
    assert dict(o.key())["q6k_variant"] == (("KDR", 8),)
    r = dataclasses.replace(o, pdl=False)
    assert dict(r.key())["pdl"] is False and dict(o.key())["pdl"] is True
    assert r == dataclasses.replace(o, pdl=False) and "_key_cache" not in repr(r)


def test_graph_key(monkeypatch, tiny):
    install(monkeypatch, exact=True)
    gm = GpuModel(tiny)
    k = gm.graph_key(7)
    assert k == gm.graph_key(7) and k.nt == 7 and k.model == id(tiny) and not k.all_logits
    assert k != gm.graph_key(8) and k != gm.graph_key(7, all_logits=True)
    gm.opts.fuse_layout = False                                 # options mutated after construction: a new key
    assert gm.graph_key(7) != k
    with pytest.raises(ValueError, match="graph must be"):
        gm.forward(TOKS, graph="on")


# ------------------------------------------------------------------ fallback and strict mode (no capture on the shim)


def test_auto_mode_falls_back_and_records_why(monkeypatch, tiny):
    install(monkeypatch, exact=True)
    gm = GpuModel(tiny)                                          # graph=None: auto
    eager = np.array(GpuModel(tiny, opts=PrefillOptions(graph=False)).forward(TOKS))
    got = gm.forward(TOKS)
    assert gm.last_mode == "eager" and np.array_equal(np.asarray(got), eager)
    assert len(gm.graph_fallbacks) == 1
    fb = gm.graph_fallbacks[0]
    assert fb["nt"] == len(TOKS) and "stream capture" in fb["reason"] and fb["options"]["fuse_rope"] is True
    gm.forward(TOKS)                                            # recorded once per key
    assert len(gm.graph_fallbacks) == 1
    gm.forward(TOKS[:5])
    assert [f["nt"] for f in gm.graph_fallbacks] == [7, 5]
    t = timed_prefill(gm, TOKS, repeats=2)
    assert t["mode"] == "eager" and "stream capture" in t["fallback"]
    t = timed_prefill(gm, TOKS, repeats=1, graph=False)
    assert t["mode"] == "eager" and t["fallback"] is None         # eager asked: not a fallback


def test_strict_graph_raises(monkeypatch, tiny):
    install(monkeypatch, exact=True)
    gm = GpuModel(tiny, opts=PrefillOptions(graph=True))
    with pytest.raises(GraphCaptureError, match="stream capture"):
        gm.forward(TOKS)
    assert gm.graph_fallbacks == []                              # an error, not a fallback
    assert np.asarray(gm.forward(TOKS, graph=False)).shape == (512,) and gm.last_mode == "eager"


def test_traced_forward_runs_eager(monkeypatch, tiny):
    install(monkeypatch, exact=True)

    class Active(Ops):
        active = True

    gm = GpuModel(tiny)
    gm.forward(TOKS, tracer=Active())
    assert gm.last_mode == "eager" and gm.graph_fallbacks == []  # not a fallback: a trace needs the eager ops
    with pytest.raises(GraphCaptureError, match="traced"):
        gm.forward(TOKS, tracer=Active(), graph=True)


# ------------------------------------------------------------------ the cache, with a stand-in capture


class Settable(np.ndarray):
    """A numpy array with cupy's ``set`` (the host -> device copy into the persistent token buffer)."""

    def set(self, arr, stream=None):
        self[...] = arr


class ReplayGraph:
    """Stands in for a captured graph: a replay re-runs the forward from the entry's token buffer into its
    logits buffer (as the real graph reads and writes those fixed pointers)."""

    def __init__(self, gm, e_ref):
        self.gm, self.e_ref, self.launches = gm, e_ref, 0

    def launch(self, stream=None):
        e = self.e_ref[0]
        self.launches += 1
        e.out[...] = self.gm._forward_device(np.asarray(e.tokens), e.key.nt, NullTracer(), e.key.all_logits)


def _fake_capture(gm, log):
    def capture(key, toks):
        log.append(key)
        ref = [None]
        g = ReplayGraph(gm, ref)
        tok = np.zeros(key.nt, np.int32).view(Settable)
        out = np.zeros((key.nt, gm.cfg.vocab) if key.all_logits else gm.cfg.vocab, np.float32)
        e = GraphEntry(key, g, types.SimpleNamespace(total_bytes=lambda: 0, free_all_blocks=lambda: None), None,
                       tok, out, ("q4k_nb",), 0.0, 0.0, True)
        ref[0] = e
        return e
    return capture


def test_graph_cache_replays_per_key(monkeypatch, tiny):
    install(monkeypatch, exact=True)
    gm = GpuModel(tiny)
    log = []
    monkeypatch.setattr(gm, "_capture", _fake_capture(gm, log))
    eager = GpuModel(tiny, opts=PrefillOptions(graph=False))
    a = np.array(gm.forward(TOKS))
    assert gm.last_mode == "graph" and len(log) == 1 and np.array_equal(a, np.asarray(eager.forward(TOKS)))
    other = [3, 5, 8, 13, 21, 34, 55]                           # same nt, new ids: the same graph, the new tokens
    b = np.array(gm.forward(other))
    assert len(log) == 1 and np.array_equal(b, np.asarray(eager.forward(other))) and not np.array_equal(a, b)
    assert gm.families_used() == "q4k_nb x 1"                   # the families of the captured forward
    gm.forward(TOKS[:4])                                        # a new nt: a new capture
    gm.forward(TOKS, all_logits=True)
    assert len(log) == 3
    gm.opts.fuse_rope = False                                   # new options: a new capture
    gm.forward(TOKS)
    assert len(log) == 4 and len({k for k in log}) == 4
    rows = gm.graphs()
    assert [(r["nt"], r["all_logits"], r["replays"]) for r in rows] == [(7, False, 2), (4, False, 1), (7, True, 1),
                                                                        (7, False, 1)]
    t = timed_prefill(gm, TOKS, repeats=2)
    assert t["mode"] == "graph" and t["fallback"] is None and len(log) == 4
    gm.free_graphs()
    assert gm.graphs() == []
    r = gm.forward(TOKS, graph=False)
    assert gm.last_mode == "eager" and len(log) == 4 and np.array_equal(np.asarray(r), a)


# ------------------------------------------------------------------ the capture's own checks (fake CuPy capture)


class FakeStream:
    def __init__(self, non_blocking=False):
        self.capturing = False
        self.graph_effect = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass

    def begin_capture(self, mode=None):
        assert not self.capturing
        self.capturing = True

    def is_capturing(self):
        return self.capturing

    def end_capture(self):
        self.capturing = False
        return FAKE["graph"]


FAKE = {"graph": None, "streams": []}


def _install_capture(monkeypatch, cp, graph):
    def stream(non_blocking=False):
        s = FakeStream(non_blocking)
        FAKE["streams"].append(s)
        return s

    monkeypatch.setitem(FAKE, "graph", graph)
    monkeypatch.setitem(FAKE, "streams", [])
    cuda = types.SimpleNamespace(Stream=stream, MemoryPool=lambda: types.SimpleNamespace(
        malloc=None, total_bytes=lambda: 0, free_all_blocks=lambda: None),
        using_allocator=lambda f: contextlib.nullcontext(), runtime=cp.cuda.runtime,
        get_current_stream=cp.cuda.get_current_stream,
        Event=lambda **kw: types.SimpleNamespace(record=lambda stream=None: None, synchronize=lambda: None))
    cuda.Stream.begin_capture = True                             # graph_support() looks for it
    monkeypatch.setattr(cp, "cuda", cuda)
    # the runtime's capture, the graph rewrite and its instantiation, on the fake stream
    from labkernels import graph_nodes, prefill_replay

    def capture(fn, s):       # graph_nodes.capture on the fake stream: a failure inside ends the capture
        s.begin_capture()
        try:
            fn()
        except BaseException:
            s.end_capture()
            raise
        return s.end_capture()

    monkeypatch.setattr(graph_nodes, "capture", capture)
    monkeypatch.setattr(graph_nodes, "destroy", lambda g: None)
    monkeypatch.setattr(prefill_replay, "_instantiate", lambda g: g)
    monkeypatch.setattr(graph_nodes, "memsets_to_kernels", lambda g: {"replaced": 0, "bytes": 0, "left": 0})
    monkeypatch.setattr(graph_nodes, "census", lambda g: [])
    monkeypatch.setattr(prefill_replay.gpu, "host_device_pointer", lambda host: host)   # the fake kernels read numpy
    monkeypatch.setattr(prefill_replay.gpu, "record_in_graph", lambda ev, s: None)
    monkeypatch.setattr(cp, "abs", np.abs, raising=False)
    monkeypatch.setattr(cp, "empty", lambda shape, dtype=np.float32: np.empty(shape, dtype).view(Settable))


class CorruptingGraph:
    """A replay that writes wrong logits (e.g. a buffer the graph reads was reused): the capture must refuse."""

    def launch(self, stream=None):
        pass


def _second_pass(monkeypatch, gm, change):
    """Make the second _forward_device call (the captured pass; the first is the eager warm-up) go through
    ``change(real_output_fn)``; returns the call counter."""
    real = gm._forward_device
    calls = {"n": 0}

    def forward_device(*a):
        calls["n"] += 1
        return change(lambda: real(*a)) if calls["n"] == 2 else real(*a)

    monkeypatch.setattr(gm, "_forward_device", forward_device)
    return calls


def _raise_in_capture(run):
    raise RuntimeError("operation not permitted when stream is capturing")


def test_capture_checks_the_replay_against_eager(monkeypatch, tiny):
    cp = install(monkeypatch, exact=True)
    gm = GpuModel(tiny, opts=PrefillOptions(graph=True))
    calls = _second_pass(monkeypatch, gm, lambda run: run() + 1.0)   # the captured buffer holds something else
    _install_capture(monkeypatch, cp, CorruptingGraph())
    with pytest.raises(GraphCaptureError, match="differs from the eager forward"):
        gm.forward(TOKS)
    gm.opts.graph = None                                        # auto: the refusal is recorded, the result is eager's
    calls["n"] = 0
    y = gm.forward(TOKS)
    assert gm.last_mode == "eager" and "differs" in gm.graph_fallbacks[0]["reason"]
    assert np.array_equal(np.asarray(y), np.asarray(GpuModel(tiny, opts=PrefillOptions(graph=False)).forward(TOKS)))


def test_capture_failure_ends_the_capture(monkeypatch, tiny):
    cp = install(monkeypatch, exact=True)
    gm = GpuModel(tiny, opts=PrefillOptions(graph=True))
    _second_pass(monkeypatch, gm, _raise_in_capture)
    _install_capture(monkeypatch, cp, CorruptingGraph())
    with pytest.raises(GraphCaptureError, match="capture of the forward at nt=7 failed: RuntimeError"):
        gm.forward(TOKS)
    assert FAKE["streams"] and not any(s.capturing for s in FAKE["streams"])


def test_capture_keeps_its_buffers(monkeypatch, tiny):
    """A capture that works: the entry holds the token and logits buffers and the pool, and is bitwise."""
    cp = install(monkeypatch, exact=True)
    gm = GpuModel(tiny, opts=PrefillOptions(graph=True, pdl=False, memsets_as_kernels=False, ids_from_host=False))
    _install_capture(monkeypatch, cp, CorruptingGraph())        # a no-op launch: out keeps the captured pass's values
    y = gm.forward(TOKS)
    e = next(iter(gm._graphs.values()))
    assert gm.last_mode == "graph" and e.bitwise and e.max_rel_diff == 0.0
    assert np.array_equal(np.asarray(e.tokens), np.asarray(TOKS, np.int32)) and e.out.shape == (512,)
    assert np.array_equal(np.asarray(y), np.asarray(GpuModel(tiny, opts=PrefillOptions(graph=False)).forward(TOKS)))
    assert e.families and gm.graphs()[0]["nt"] == 7
    g0 = gm.graphs()[0]
    assert (g0["pdl"], g0["memsets_replaced"], g0["memsets_kept_why"], g0["ids_from_host"]) == (False, 0, "", False)


# ------------------------------------------------------------------ the fused kernels


def test_add_rmsnorm_argument_checks():
    x = np.zeros((4, 256), np.float32)
    w = np.ones(256, np.float32)
    check_add_rmsnorm(x, x.copy(), w, w)
    check_add_rmsnorm(x[3:], x[3:].copy(), w)                    # the last row: a contiguous view
    with pytest.raises(errors.ShapeError, match="x must be"):
        check_add_rmsnorm(x.astype(np.float16), x, w)
    with pytest.raises(errors.ShapeError, match="x must be"):
        check_add_rmsnorm(x[:, :128], x[:, :128].copy(), w[:128])
    with pytest.raises(errors.ShapeError, match="delta must be"):
        check_add_rmsnorm(x, x[:3].copy(), w)
    with pytest.raises(errors.ShapeError, match="delta must be"):
        check_add_rmsnorm(x, x.astype(np.float16), w)
    with pytest.raises(errors.ShapeError, match="w must be"):
        check_add_rmsnorm(x, x.copy(), w[:128])
    with pytest.raises(errors.ShapeError, match="pre must be"):
        check_add_rmsnorm(x, x.copy(), w, w.astype(np.float16))


def test_act_mul_gu_argument_checks():
    gu, out = np.zeros((3, 2 * 512), np.float32), np.zeros((3, 512), np.float16)
    check_act_mul_gu(gu, out, 512)
    check_act_mul_gu(gu, out.astype(np.float32), 512)
    with pytest.raises(errors.ShapeError, match="gu must be"):
        check_act_mul_gu(gu, out, 256)
    with pytest.raises(errors.ShapeError, match="gu must be"):
        check_act_mul_gu(gu.astype(np.float16), out, 512)
    with pytest.raises(errors.ShapeError, match="out must be"):
        check_act_mul_gu(gu, out[:2], 512)
    with pytest.raises(errors.ShapeError, match="out must be"):
        check_act_mul_gu(gu, out.astype(np.int32), 512)


def test_stacked_weights(monkeypatch, tiny, model):
    """[gate; up] as one weight: the rows of both (k-quant GGUF rows or dequantized matrices), refused across types."""
    install(monkeypatch, exact=True)
    gm = GpuModel(tiny)
    L = gm.layers[0]
    w = gm.gate_up(0)
    g, u = L["ffn_gate"], L["ffn_up"]
    assert w.shape == (g.od + u.od, g.id) and w.qtype == g.qtype and w.q is not None
    assert np.array_equal(w.q.host, np.concatenate([g.q.host, u.q.host])) and gm.gate_up(0) is w   # made once
    assert Weight.stacked(g, L["ffn_down"]) is None                     # another inner dimension
    from labkernels.arch import config_from_model

    full = config_from_model(model)
    gg = GpuModel(model, cfg=full.replace(n_layer=1, layer_is_sliding=full.layer_is_sliding[:1]))
    d = gg.gate_up(0)                                                   # gemma3: q5_0, dequantized once
    assert d.q is None and np.array_equal(d.dense, np.concatenate([gg.layers[0]["ffn_gate"].dense,
                                                                   gg.layers[0]["ffn_up"].dense]))
    q, k, v = gg.layers[0]["attn_q"], gg.layers[0]["attn_k"], gg.layers[0]["attn_v"]
    qk = Weight.stacked(q, k)
    qkv = Weight.stacked(qk, v)        # dequantized matrices stack across GGUF types; the type names both
    assert (q.qtype, v.qtype) == ("q5_0", "q8_0") and qk.qtype == "q5_0" and qkv.qtype == "q5_0+q8_0"
    assert np.array_equal(qkv.dense, np.concatenate([q.dense, k.dense, v.dense])) and qkv.shape == (1536, 640)
    assert [names for _, names in gg.qkv_groups(0)] == [("attn_q", "attn_k", "attn_v")]
    # k-quants of two types do not: q4_K [gate; up] against q6_K down of the same inner dimension
    t = GpuModel(tiny, cfg=None)
    a = t.layers[0]["attn_q"]
    b = next(w for L in t.layers for w in L.values() if w.q is not None and w.qtype != a.qtype and w.id == a.id)
    assert a.q is not None and Weight.stacked(a, b) is None


def test_rope_qk_argument_checks():
    q, k = np.zeros((5, 4 * 64), np.float32), np.zeros((5, 2 * 64), np.float32)
    check_rope_qk(q, k, 5, 4, 2, 64, 64, 0.125)
    check_rope_qk(q, k, 5, 4, 2, 64, 32, 1.0)
    with pytest.raises(errors.ShapeError, match="q scale"):
        check_rope_qk(q, k, 5, 4, 2, 64, 32, 0.125)
    with pytest.raises(errors.ShapeError, match="n_rot"):
        check_rope_qk(q, k, 5, 4, 2, 64, 63, 1.0)
    with pytest.raises(errors.ShapeError, match="does not hold"):
        check_rope_qk(q, k, 6, 4, 2, 64, 64, 1.0)
    with pytest.raises(errors.ShapeError, match="k .* does not hold"):
        check_rope_qk(q, k, 5, 4, 4, 64, 64, 1.0)
    with pytest.raises(errors.ShapeError, match="q must be"):
        check_rope_qk(q[:, ::2], k, 5, 2, 2, 64, 64, 1.0)


@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_fused_forward_equals_unfused(monkeypatch, arch, tiny, model):
    """Each fusion computes the unfused ops' values (the shim's fused kernels are the unfused transcriptions, so this
    checks the forward's plumbing: which delta, which post-norm, which rows, the folded q scale); the fused forward
    has no separate residual / q-scale ops."""
    install(monkeypatch, exact=True)
    if arch == "gemma":
        from labkernels.arch import config_from_model

        full = config_from_model(model)
        m, cfg = model, full.replace(n_layer=2, layer_is_sliding=full.layer_is_sliding[:2])
        toks = [2, 818, 5279, 529, 7001, 563]
    else:
        m, cfg, toks = tiny, None, TOKS
    off = {**{f: False for f in FUSIONS}, "graph": False}
    tu, tf = Ops(), Ops()
    u = np.asarray(GpuModel(m, cfg=cfg, opts=PrefillOptions(**off)).forward(toks, tracer=tu))
    f = np.asarray(GpuModel(m, cfg=cfg, opts=PrefillOptions(graph=False)).forward(toks, tracer=tf))
    rel = float(np.abs(f - u).max() / np.abs(u).max())
    assert rel < 1e-6 and f.argmax() == u.argmax(), rel
    assert tu.names.count("residual") == 2 * 2 and tf.names.count("residual") == 0
    assert tf.names.count("ffn_norm+residual") == 2 and tf.names.count("attn_norm+residual") == 1
    assert tf.names.count("output_norm+residual") == 1
    assert tu.names.count("q_scale") == 2 and tf.names.count("q_scale") == 0   # both archs scale q (1/8, 1/16)
    assert tu.names.count("ffn_gate") == 2 and tf.names.count("ffn_gate_up") == 2 and "ffn_gate" not in tf.names
    if arch == "gemma":
        assert tu.names.count("post_attention_norm") == 2 and "post_attention_norm" not in tf.names
    # all positions: the fused final add covers every row
    gm_u = GpuModel(m, cfg=cfg, opts=PrefillOptions(**off))
    gm_f = GpuModel(m, cfg=cfg, opts=PrefillOptions(graph=False))
    au, af = np.asarray(gm_u.forward(toks, all_logits=True)), np.asarray(gm_f.forward(toks, all_logits=True))
    assert af.shape == (len(toks), gm_f.cfg.vocab) and np.abs(af - au).max() <= 1e-6 * np.abs(au).max()


def test_rope_qkv16_argument_checks():
    q, k, v = (np.zeros((5, h * 64), np.float32) for h in (4, 2, 2))
    check_rope_qkv16(q, k, v, 5, 4, 2, 64, 64, 32)
    with pytest.raises(errors.ShapeError, match="v must be"):
        check_rope_qkv16(q, k, v.astype(np.float16), 5, 4, 2, 64, 64, 64)
    with pytest.raises(errors.ShapeError, match="v .* does not hold"):
        check_rope_qkv16(q, k, v, 5, 4, 2, 64, 96, 64)
    with pytest.raises(errors.ShapeError, match="must be even"):
        check_rope_qkv16(np.zeros((5, 4 * 63), np.float32), np.zeros((5, 2 * 63), np.float32), v, 5, 4, 2, 63, 64, 62)
    with pytest.raises(errors.ShapeError, match="n_rot"):
        check_rope_qkv16(q, k, v, 5, 4, 2, 64, 64, 66)


@pytest.mark.parametrize("n_rot", [64, 32])
def test_qkv16_fusion_replaces_the_casts_and_the_q_scale(monkeypatch, tiny, n_rot):
    """With an fp16 attention path the rope writes fp16 q/k/v (the q scale applied to every dim, partial rotary
    too): the same logits as rope + q scale + the attention's casts; an f32 attention path never takes it."""
    install(monkeypatch, exact=True)
    from labkernels.arch import config_from_model

    cfg = config_from_model(tiny).replace(n_rot=n_rot)
    calls = []
    real = GpuModel.rope_qkv16
    monkeypatch.setattr(GpuModel, "rope_qkv16", lambda self, *a, **k: calls.append(k) or real(self, *a, **k))
    t_on, t_off = Ops(), Ops()
    on = np.asarray(GpuModel(tiny, cfg=cfg, opts=PrefillOptions(graph=False, attn_f16=True)).forward(TOKS, tracer=t_on))
    assert len(calls) == cfg.n_layer and all(c["qscale"] == cfg.attn_scale for c in calls)
    off = np.asarray(GpuModel(tiny, cfg=cfg, opts=PrefillOptions(graph=False, attn_f16=True, fuse_qkv16=False))
                     .forward(TOKS, tracer=t_off))
    assert len(calls) == cfg.n_layer                      # the unfused forward did not call it
    assert t_on.names.count("q_scale") == 0 and t_off.names.count("q_scale") == (2 if n_rot < 64 else 0)
    assert np.abs(on - off).max() <= 1e-6 * np.abs(off).max() and on.argmax() == off.argmax()
    GpuModel(tiny, cfg=cfg, opts=PrefillOptions(graph=False, attn_f16=False)).forward(TOKS)
    assert len(calls) == cfg.n_layer                      # fp32 attention: no fp16 q/k/v


def test_gemma_qk_norm_rope_and_casts_in_one_launch(monkeypatch, model):
    """gemma3 with an fp16 attention: Q/K/V stacked into one GEMM (their dequantized rows), the q/k norms, RoPE,
    q scale and casts in one launch (qk_norm+rope), the same logits as the separate ops; fuse_qk_norm off leaves
    rmsnorm_qk then rope_qkv16."""
    install(monkeypatch, exact=True)
    from labkernels.arch import config_from_model

    full = config_from_model(model)
    cfg = full.replace(n_layer=2, layer_is_sliding=full.layer_is_sliding[:2])
    toks = [2, 818, 5279, 529, 7001, 563]
    runs = {}
    for name, kw in {"one": {}, "two": {"fuse_qk_norm": False},
                     "off": {"fuse_qkv": False, "fuse_qk_norm": False, "fuse_qkv16": False}}.items():
        t = Ops()
        runs[name] = (np.asarray(GpuModel(model, cfg=cfg, opts=PrefillOptions(graph=False, attn_f16=True, **kw))
                                 .forward(toks, tracer=t)), t.names)
    (one, n1), (two, n2), (off, n0) = runs["one"], runs["two"], runs["off"]
    assert n1.count("qk_norm+rope") == 2 and "qk_norm" not in n1 and "rope" not in n1
    assert n1.count("attn_q+attn_k+attn_v") == 2 and "attn_q" not in n1
    assert n2.count("qk_norm") == 2 and n2.count("rope") == 2 and "qk_norm+rope" not in n2
    assert n0.count("attn_q") == 2 and n0.count("qk_norm") == 2
    for got in (one, two):
        assert np.abs(got - off).max() <= 1e-6 * np.abs(off).max() and got.argmax() == off.argmax()


def test_fold_scale_only_when_every_dim_rotates(monkeypatch, tiny):
    install(monkeypatch, exact=True)
    from labkernels.arch import config_from_model

    cfg = config_from_model(tiny).replace(n_rot=32)              # partial rotary: the q scale stays a separate op
    t = Ops()
    a = np.asarray(GpuModel(tiny, cfg=cfg, opts=PrefillOptions(graph=False)).forward(TOKS, tracer=t))
    b = np.asarray(GpuModel(tiny, cfg=cfg, opts=PrefillOptions(graph=False, fuse_rope=False)).forward(TOKS))
    assert t.names.count("q_scale") == 2 and np.abs(a - b).max() <= 1e-6 * np.abs(b).max()


# ------------------------------------------------------------------ CLI plumbing


def test_cli_mode_flags():
    from labkernels import cli

    from labkernels.prefill_cli import options_from_args

    p = cli.build_parser()
    a = p.parse_args(["prefill", "--model", "synthetic-7b", "--tokens", "8"])
    o = options_from_args(a)
    assert o.graph is None and o.fuse_add_norm and o.fuse_rope and o.fuse_layout
    o = options_from_args(p.parse_args(["prefill", "--model", "x", "--tokens", "8", "--graph"]))
    assert o.graph is True
    o = options_from_args(p.parse_args(["prefill", "--model", "x", "--tokens", "8", "--no-graph", "--no-fuse"]))
    assert o.graph is False and not (o.fuse_add_norm or o.fuse_rope or o.fuse_layout or o.fuse_gate_up)
    o = options_from_args(p.parse_args(["decompose", "--model", "x", "--graph", "--attn-f16", "--kernel", "int8"]))
    assert o.graph is True and o.attn_f16 and o.kernel == "int8"


# ------------------------------------------------------------------ the gpu-check step's logic on the shim


def test_graph_ab_records_every_variant(monkeypatch, tiny, tmp_path):
    """prefill_graph's measurement loop (without the CUPTI decompositions): every variant at every nt and round,
    the mode that ran and why a graph was refused (the shim cannot capture), logits against eager-unfused."""
    from labkernels import records
    from labkernels.rounds.r05_wall import prefill_graph

    install(monkeypatch, exact=True)
    gm = GpuModel(tiny, opts=PrefillOptions(attn_f16=True))
    with records.recording("prefill", {"what": "graph"}, root=tmp_path) as run:
        r = prefill_graph.graph_ab(gm, tiny, "tiny", run, nts=(6, 9), dec_nts=(), rounds=2, repeats=1,
                             progress=lambda s: None)
    th = run.table("throughput")
    ran = [v for v in prefill_graph.GRAPH_VARIANTS if "cudnnattn" not in v]     # no cuDNN frontend on this machine
    assert len(th) == 2 * 2 * len(ran) and set(th.variant) == set(ran)
    assert set(th.kernel) == {f"auto {v}" for v in ran}   # round 5's notebook groups by kernel
    graphs = [v for v, o in prefill_graph.GRAPH_VARIANTS.items() if o["graph"] is not False]
    assert set(graphs) == {"graph-fused", "graph-fused-f32dense", "graph-fused-plain", "graph-fused-nodes",
                           "graph-fused-cudnnattn", "graph-fused-plain-cudnnattn"}
    V = prefill_graph.GRAPH_VARIANTS
    assert V["graph-fused"] == {"graph": None}           # the defaults: all three graph changes on
    assert all(getattr(PrefillOptions(), f) for f in prefill_graph.GRAPH_OPTIONS)
    assert V["graph-fused-plain"] == {"graph": None, **{f: False for f in prefill_graph.GRAPH_OPTIONS}}
    assert V["graph-fused-nodes"] == {"graph": None, "pdl": False}
    assert V["graph-fused-f32dense"] == {"graph": None, "other_f16": False} and PrefillOptions().other_f16
    assert V["graph-fused-cudnnattn"] == {"graph": None, "attention": "cudnn"}
    assert V["graph-fused-plain-cudnnattn"] == {**V["graph-fused-plain"], "attention": "cudnn"}
    graphs = [v for v in graphs if v in ran]
    g = th[th.variant.isin(graphs)]
    assert (g["mode"] == "eager").all() and g.fallback.str.contains("stream capture").all()
    rest = th[~th.variant.isin(graphs)]
    assert (rest["mode"] == "eager").all() and rest.fallback.isna().all()
    lv = run.table("logits_vs_first")
    assert len(lv) == 2 * len(ran) and (lv["first"] == "eager-unfused").all()
    assert lv.bitwise.all()
    ge = run.table("graph_vs_eager")
    assert list(ge.nt) == [6, 9] and ge.bitwise.all()
    assert sorted(r["walls"]) == sorted((nt, v) for nt in (6, 9) for v in ran)
    assert gm.opts.graph is None and gm.opts.fuse_add_norm       # the base options are back
    assert [f["nt"] for f in gm.graph_fallbacks] == [6] * 4 + [9] * 4      # once per (nt, options): 4 graph variants
    # the lab-attention variants ran the lab path (its backend made on first use of that option set), the rest auto
    # (auto without the cuDNN frontend: the lab's fused kernel, which the shim runs, in fp16 -- attn_f16 is on here)
    assert {b.name for b in gm._attns.values()} == {"lab"}
    un = run.table("variants_unavailable")       # no cuDNN frontend here: the cuDNN-attention variants are left out
    assert sorted(un.variant) == ["graph-fused-cudnnattn", "graph-fused-plain-cudnnattn"]
    assert (th.attention == "lab").all() and (th.attention_ran == "lab").all()
    assert un.reason.str.contains("nvidia-cudnn-frontend").all()


def test_host_overhead_is_its_own_class():
    import pandas as pd

    from labkernels.rounds.r05_wall import decompose as D

    classes = pd.DataFrame({"launches": [2, 1], "busy_ms": [8.0, 2.0], "kernels": ["a", "b"], "gmac": [4.0, 0.0],
                            "gflop_attn": [0.0, 4.0], "share_busy": [0.8, 0.2], "share_wall": [0.4, 0.1]},
                           index=["gemm_q4k:attn_q", "attention_gemm"])
    t = D.host_overhead_table(classes, {"wall_ms": 20.0, "busy_ms": 10.0})
    h = t.set_index("class").loc["host_overhead"]
    assert h.busy_ms == 10.0 and h.share_wall == 0.5 and h.launches == 0 and t.iloc[0]["class"] == "host_overhead"
    assert t.busy_ms.sum() == pytest.approx(20.0) and t.share_wall.sum() == pytest.approx(1.0)
    assert t.set_index("class").loc["gemm_q4k:attn_q"].share_wall == 0.4
    # graph mode: the traced replay's busy; a busy above the wall is no negative host time
    t2 = D.host_overhead_table(classes, {"wall_ms": 11.0, "busy_ms": 10.0, "busy_replay_ms": 10.5})
    assert t2.set_index("class").loc["host_overhead"].busy_ms == pytest.approx(0.5)
    t3 = D.host_overhead_table(t2, {"wall_ms": 9.0, "busy_ms": 10.0, "busy_replay_ms": float("nan")})
    assert (t3["class"] == "host_overhead").sum() == 1 and t3.set_index("class").loc["host_overhead"].busy_ms == 0.0


def test_timed_prefill_takes_the_outside_time_per_forward(monkeypatch):
    """host_outside_ms is the median of wall - graph span per forward, not the difference of the two medians (which
    would carry the walls' spread): walls 10/20/30 ms with spans 9.5/19.9/29.0 ms -> 0.5 ms, not 20 - 19.9."""
    import types

    from labkernels import prefill_replay

    clock = iter([0.0, 0.010, 1.0, 1.020, 2.0, 2.030, 3.0, 3.0])
    spans = iter([9.5, 19.9, 29.0])
    monkeypatch.setattr(prefill_replay.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(prefill_replay.gpu, "cp", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(deviceSynchronize=lambda: None))))

    class GM:
        opts = types.SimpleNamespace(graph=None)
        last_mode = "graph"
        _graph_refused = {}

        def _tokens(self, t):
            return np.asarray(t, np.int32)

        def forward(self, toks, graph="opts"):
            pass

        def last_graph_span_ms(self):
            return next(spans)

        def graph_key(self, n):
            return n

    t = prefill_replay.timed_prefill(GM(), [1, 2, 3], repeats=3, warmup=0)
    assert t["mode"] == "graph" and t["wall_ms"] == pytest.approx(20.0)
    assert t["gpu_span_ms"] == pytest.approx(19.9) and t["host_outside_ms"] == pytest.approx(0.5)   # not 0.1


def test_replay_breakdown_splits_the_wall_outside_the_graph(monkeypatch):
    """A stamped replay's wall splits into the host's parts (before the launch call, the call, after it, the
    synchronization) and the GPU's (the event before the launch to the graph's first node, the graph, its last node
    to the event after the logits' copy); submit_wake is what neither side saw. Unstamped: NaN, never a guess."""
    import types

    from labkernels import prefill_replay

    m0, m1, s0, s1 = "m0", "m1", "s0", "s1"
    el = {(m0, s0): 0.030, (s0, s1): 3.2, (s1, m1): 0.006}
    monkeypatch.setattr(prefill_replay.gpu, "cp", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_elapsed_time=lambda a, b: el[(a, b)])))
    gm = GpuModel.__new__(GpuModel)
    gm.last_mode = "graph"
    gm._last_graph = types.SimpleNamespace(marks=(m0, m1), span=(s0, s1))
    # replay entry +5 us, lookup done +8, ids written +15, launch call at +20 us, returns at +45, forward at +60
    gm._last_stamps = (1.000005, 1.000008, 1.000015, 1.000020, 1.000045, 1.000060)
    b = gm.replay_breakdown(1.0, 1.003300)                # synchronized at +3.3 ms
    assert b["py_pre_ms"] == pytest.approx(0.020) and b["launch_call_ms"] == pytest.approx(0.025)
    assert (b["py_entry_ms"], b["lookup_ms"], b["ids_ms"], b["mark_ms"]) == pytest.approx((0.005, 0.003, 0.007, 0.005))
    assert b["py_post_ms"] == pytest.approx(0.015) and b["sync_ms"] == pytest.approx(3.3 - 0.060)
    assert (b["gpu_lead_ms"], b["gpu_span_ms"], b["gpu_tail_ms"]) == (0.030, 3.2, 0.006)
    assert b["submit_wake_ms"] == pytest.approx(3.3 - 0.020 - 3.236)
    gm._last_stamps = None                                 # a replay that was not stamped
    assert all(np.isnan(v) for v in gm.replay_breakdown(1.0, 1.0033).values())
    gm._last_stamps, gm.last_mode = (1.0,) * 6, "eager"
    assert all(np.isnan(v) for v in gm.replay_breakdown(1.0, 1.0033).values())


def test_timed_prefill_breakdown_stamps_only_its_own_forwards(monkeypatch):
    """breakdown=True stamps the timed forwards (not the warm-up), gives each part's median and puts the model's
    stamp setting back, also when a forward raises."""
    import types

    from labkernels import prefill_replay

    monkeypatch.setattr(prefill_replay.gpu, "cp", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(deviceSynchronize=lambda: None))))
    seen = []

    class GM:
        opts = types.SimpleNamespace(graph=None)
        last_mode = "graph"
        _graph_refused = {}
        stamp_replays = False
        fail = False

        def _tokens(self, t):
            return np.asarray(t, np.int32)

        def forward(self, toks, graph="opts"):
            seen.append(self.stamp_replays)
            if self.fail and len(seen) > 1:
                raise RuntimeError("boom")

        def last_graph_span_ms(self):
            return 1.0

        def replay_breakdown(self, t0, t1):
            return {"gpu_lead_ms": [0.01, 0.05, 0.02][(len(seen) - 2) % 3], "sync_ms": 0.5}

        def graph_key(self, n):
            return n

    gm = GM()
    t = prefill_replay.timed_prefill(gm, [1, 2], repeats=3, warmup=1, breakdown=True)
    assert seen == [False, True, True, True] and gm.stamp_replays is False
    assert t["breakdown"]["gpu_lead_ms"] == pytest.approx(0.02) and t["breakdown"]["sync_ms"] == 0.5
    assert set(t["breakdown"]) == {"wall_ms", "gpu_lead_ms", "sync_ms"}
    assert prefill_replay.timed_prefill(gm, [1, 2], repeats=2, warmup=0)["breakdown"] is None
    gm.fail, seen[:] = True, []
    with pytest.raises(RuntimeError, match="boom"):
        prefill_replay.timed_prefill(gm, [1, 2], repeats=2, warmup=1, breakdown=True)
    assert gm.stamp_replays is False
