"""KV-cache generation (round 9, issue 45 items 3-4) on the CPU: the decode path's Python logic (the step's op order,
the cache's layout and fill, the device state, the graph bookkeeping) with the numpy stand-ins of tests/cpu_gpu_shim.py
-- each decode kernel's stand-in a plain transcription of what kernels/decode.cu documents -- against the full
prefill of the same sequence, the re-prefill greedy and the independent CPU reference; and the bad input the request
checks refuse before any GPU work. The device kernels themselves: tests/gpu/test_decode_gpu.py.

Parity setup: the prefill runs round 7's family (``kernel="wgmma_kq"``: f16 activations x the emulated f16 weights)
and the fp16 attention (``attn_f16``: the lab kernel's stand-in), so that both sides compute the same function and
only f32 summation order and the fp16 K/V rounding (made the same way on both sides) can separate them."""
import contextlib
import types

import numpy as np
import pytest

from cpu_gpu_shim import install, install_wgmma
from labkernels import decode, errors, gpu
from labkernels.decode import CacheAllocationError, DecodeError
from labkernels.forward_common import GraphCaptureError
from labkernels.prefill import GpuModel, PrefillOptions
from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config

#: decode step vs the full prefill on the tiny synthetic models (max |diff| / max |prefill logits| at every position):
#: the stand-ins compute in float64 on the same f16 numbers, so only float32 rounding may differ (measured: 0)
SYNTH_RTOL = 1e-5
#: the same on Gemma 3 270M, whose q5_0 / q8_0 projections go through (fake) cuBLAS in float32, where one row and
#: many rows sum in different orders and fp16 K/V roundings can flip (measured: <= 8.9e-4 over 12 positions)
GEMMA_RTOL = 3e-3
SEQ = [1, 17, 300, 42, 99, 7, 511, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 60, 2]


def _tiny(arch: str, seed: int = 3):
    extra = {"sliding_window": 8} if arch == "gemma3" else {}
    n_layer = 7 if arch == "gemma3" else 2        # gemma3: layers 0-4 and 6 slide (window 8 < the sequence), 5 global
    cfg = tiny_config(arch, n_layer=n_layer, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, vocab=512,
                      **extra)
    return SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=seed)


def _gm(monkeypatch, m, table=None, **opts):
    """The model on the CPU stand-ins; the decode's GEMV configuration from ``table`` (gemv.auto_table's form), not from
    the recorded runs under data/ (None: no recorded benchmark, FORM=0 -- the f16 weights the prefill's wgmma_kq
    stand-in uses too, so decode and prefill differ only by float32 rounding)."""
    from labkernels import gemv

    install(monkeypatch, exact=True)
    install_wgmma(monkeypatch)
    monkeypatch.setattr(gemv, "_AUTO", {"t": table})
    return GpuModel(m, opts=PrefillOptions(attn_f16=True, kernel="wgmma_kq", **opts))


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _teacher_forced(gm, seq, p0: int, n_ctx: int = 32, dec=None):
    """Decode logits at positions p0..len-1 (the prefill of seq[:p0], then one step per given token)."""
    dec = dec or decode.Decoder(gm, n_ctx)
    dec.prefill(seq[:p0])
    return [np.asarray(dec.step(token=seq[p]), np.float64) for p in range(p0, len(seq))], dec


# ------------------------------------------------------------------------------------------------ parity

#: decode vs prefill when the decode's q4_K GEMVs run FORM=1 (round 9 step 4's recorded winner: gguf's weights
#: d*sc*q - dmin*m exactly, where the prefill's wgmma_kq rounds each weight to f16, a relative 2^-11 at most): the
#: logits move by the weights' rounding (measured on the tiny models, CPU stand-ins: 1.0e-3 .. 3.7e-3)
FORM1_RTOL = 1e-2


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_decode_with_the_recorded_form1_gemv_stays_within_the_weights_rounding(monkeypatch, arch):
    """With a recorded benchmark whose winner is FORM=1 (the product's choice since step 4), the decode's q4_K GEMVs
    run FORM=1 (seen in the stand-in's calls) and its logits stay within FORM1_RTOL of the prefill's, same top-1."""
    import pandas as pd

    from labkernels import gemv
    from cpu_gpu_shim import fake_gemv

    seen = []

    def spy(w, x, out=None, S=None, MT=2, WARPS=4, FORM=0):
        seen.append((w.qtype, FORM))
        return fake_gemv(w, x, out, S, MT, WARPS, FORM)

    table = pd.DataFrame([{"qtype": "q4_K", "act": act, "od": 4096, "id": 4096, "nt": 1, "variant": "gemv_m1w4_sw_f1",
                           "family": "gemv_kq", "MT": 1, "WARPS": 4, "S": 8, "FORM": 1, "WAVE": 1, "median_us": 10.0,
                           "wgmma_us": 25.0, "run_id": "test"} for act in ("f16", "f32")])
    gm = _gm(monkeypatch, _tiny(arch), table=table)
    monkeypatch.setattr(gemv, "gemv", spy)
    full = np.asarray(gm.forward(SEQ, all_logits=True, graph=False), np.float64)
    got, _ = _teacher_forced(gm, SEQ, 3)
    errs = [_rel(g, full[p]) for p, g in zip(range(3, len(SEQ)), got)]
    assert ("q4_K", 1) in seen and all(f == 0 for q, f in seen if q != "q4_K")
    assert max(errs) <= FORM1_RTOL, errs
    assert [int(np.argmax(g)) for g in got] == [int(np.argmax(full[p])) for p in range(3, len(SEQ))]


def test_decode_never_runs_the_retired_form_2_from_a_recorded_table(monkeypatch):
    """A recorded table (as the auto_table of commit 90fd260 could make it) whose fastest q4_K row is step 5's FORM=2:
    the decode's q4_K GEMVs run the fastest live form recorded there (FORM=1), never FORM=2, which left the source."""
    import pandas as pd

    from labkernels import gemv
    from cpu_gpu_shim import fake_gemv

    seen = []

    def spy(w, x, out=None, S=None, MT=2, WARPS=4, FORM=0):
        seen.append((w.qtype, FORM))
        return fake_gemv(w, x, out, S, MT, WARPS, FORM)

    row = {"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 1, "family": "gemv_kq", "MT": 1, "WARPS": 4, "S": 8,
           "WAVE": 1, "wgmma_us": 25.0, "run_id": "test"}
    table = pd.DataFrame([{**row, "act": act, **v} for act in ("f16", "f32") for v in (
        {"variant": "gemv_m1w4_sw_f2", "FORM": 2, "median_us": 8.0},
        {"variant": "gemv_m1w4_sw_f1", "FORM": 1, "median_us": 10.0})])
    gm = _gm(monkeypatch, _tiny("llama"), table=table)
    monkeypatch.setattr(gemv, "gemv", spy)
    full = np.asarray(gm.forward(SEQ, all_logits=True, graph=False), np.float64)
    got, _ = _teacher_forced(gm, SEQ, 3)
    assert ("q4_K", 1) in seen and not any(f == 2 for _, f in seen)
    assert max(_rel(g, full[p]) for p, g in zip(range(3, len(SEQ)), got)) <= FORM1_RTOL


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_decode_logits_equal_the_prefill_at_every_position(monkeypatch, arch):
    gm = _gm(monkeypatch, _tiny(arch))
    full = np.asarray(gm.forward(SEQ, all_logits=True, graph=False), np.float64)
    got, dec = _teacher_forced(gm, SEQ, 3)
    errs = [_rel(g, full[p]) for p, g in zip(range(3, len(SEQ)), got)]
    assert max(errs) <= SYNTH_RTOL, errs
    assert [int(np.argmax(g)) for g in got] == [int(np.argmax(full[p])) for p in range(3, len(SEQ))]
    st = dec.state()
    assert st["pos"] == len(SEQ) and st["err"] == 0 and st["tok"] == int(np.argmax(full[-1]))


def test_the_parity_check_sees_a_wrong_window_and_a_wrong_position(monkeypatch):
    """The comparison above can fail: gemma3's decode without its sliding window differs from the prefill once the
    sequence is longer than the window (and not before), and a step at the wrong position differs."""
    gm = _gm(monkeypatch, _tiny("gemma3"))
    full = np.asarray(gm.forward(SEQ, all_logits=True, graph=False), np.float64)
    dec = decode.Decoder(gm, 32)
    dec.kinds = [dataclass_replace(k, window=0) for k in dec.kinds]
    got, _ = _teacher_forced(gm, SEQ, 3, dec=dec)
    errs = [_rel(g, full[p]) for p, g in zip(range(3, len(SEQ)), got)]
    assert max(errs[:8 - 3]) <= SYNTH_RTOL and min(errs[8 - 3:]) > 1e-4, errs   # positions < 8 see <= 8 keys
    dec = decode.Decoder(gm, 32)
    dec.prefill(SEQ[:5])
    dec.set_state(SEQ[5], 6)                                                    # token 5 stepped at position 6
    assert _rel(dec.step(), full[5]) > 1e-3


def dataclass_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


@pytest.mark.model
@pytest.mark.slow
def test_gemma_decode_logits_equal_the_prefill(model, monkeypatch):
    from labkernels.prefill_runs import GEMMA_PROMPT

    gm = _gm(monkeypatch, model)
    seq = GEMMA_PROMPT + [3694, 496, 1698, 529, 506, 8911, 236761, 108]
    full = np.asarray(gm.forward(seq, all_logits=True, graph=False), np.float64)
    got, dec = _teacher_forced(gm, seq, 2, n_ctx=len(seq))
    errs = [_rel(g, full[p]) for p, g in zip(range(2, len(seq)), got)]
    assert max(errs) <= GEMMA_RTOL, errs
    assert [int(np.argmax(g)) for g in got] == [int(np.argmax(full[p])) for p in range(2, len(seq))]
    assert dec.state() == {"tok": int(np.argmax(got[-1])), "pos": len(seq), "err": 0}   # a full cache: no error


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_generate_equals_the_reprefill_greedy(monkeypatch, arch):
    gm = _gm(monkeypatch, _tiny(arch, seed=5))
    prompt = SEQ[:4]
    out = gm.generate(prompt, 24)
    assert out == gm.greedy(prompt, 24)
    st = gm.last_generate
    assert st["mode"] == "eager" and "stream capture" in st["graph_refused"]      # the shim cannot capture
    assert st["tokens"] == out and st["n_prompt"] == 4 and st["n_ctx"] == 256
    assert "gemv_kq x" in st["families"]
    # a second request reuses the decoder (its cache and state are overwritten by the new prefill)
    dec = gm._decoder
    assert gm.generate(SEQ[:6], 5) == gm.greedy(SEQ[:6], 5) and gm._decoder is dec
    assert gm.generate(prompt, 1) == out[:1]                                      # one token: the prefill's argmax


@pytest.mark.model
@pytest.mark.slow
def test_gemma_generate_equals_the_reprefill_greedy_over_64_tokens(model, monkeypatch):
    from labkernels.prefill_runs import GEMMA_PROMPT

    gm = _gm(monkeypatch, model)
    out = gm.generate(GEMMA_PROMPT, 64)
    ref = gm.greedy(GEMMA_PROMPT, 64)
    assert len(out) == 64
    if out != ref:
        # the two paths sum in different orders (GEMMA_RTOL apart): they may part only where the re-prefill's top
        # two logits are that close (a near-tie, after which the continuations differ by construction)
        i = next(j for j, (a, b) in enumerate(zip(out, ref)) if a != b)
        lg = np.asarray(gm.forward(list(GEMMA_PROMPT) + ref[:i], graph=False), np.float64).reshape(-1)[-gm.cfg.vocab:]
        top2 = np.sort(lg)[-2:]
        assert top2[1] - top2[0] <= GEMMA_RTOL * np.abs(lg).max(), (i, out[i], ref[i], top2)
        assert lg[out[i]] >= top2[1] - GEMMA_RTOL * np.abs(lg).max(), (i, out[i], lg[out[i]], top2)


# ------------------------------------------------------------------------------------------------ the cache

def test_cache_layout_against_the_reference_forward(monkeypatch):
    """Row p of layer il's K plane holds every kv head of position p after the q/k norm and RoPE (head h at columns
    h*head_dim..), V likewise: the rows the prefill filled and the rows the decode steps appended, against the CPU
    reference forward's Kcur / Vcur (float64, independent code)."""
    from labkernels.prefill_ref import get_ref_model

    m = _tiny("gemma3")
    gm = _gm(monkeypatch, m)
    cap: dict = {}
    get_ref_model(m).forward(SEQ[:12], capture=cap)
    dec = decode.Decoder(gm, 16)
    dec.prefill(SEQ[:5])
    for p in range(5, 12):
        dec.step(token=SEQ[p])
    c = gm.cfg
    for il in range(c.n_layer):
        k = dec.cache.k[il][:12].astype(np.float64).reshape(12, c.n_head_kv, c.head_dim)
        v = dec.cache.v[il][:12].astype(np.float64).reshape(12, c.n_head_kv, c.head_dim_v)
        for got, ref in ((k, cap[f"{il}.Kcur"]), (v, cap[f"{il}.Vcur"])):
            assert np.max(np.abs(got - ref)) <= 2e-2 * np.max(np.abs(ref)), il
        assert not dec.cache.k[il][12:].any()                                # nothing written past the last step
    assert dec.cache.nbytes == decode.cache_bytes(c, 16) == 2 * c.n_layer * 16 * c.n_head_kv * 2 * c.head_dim
    assert all(np.shares_memory(a, dec.cache.buf) for a in dec.cache.k + dec.cache.v)   # one allocation


def test_the_prefill_hands_every_layer_to_the_sink_and_nothing_without_one(monkeypatch):
    gm = _gm(monkeypatch, _tiny("qwen2"))
    base = np.array(gm.forward(SEQ[:7], graph=False))
    seen = []
    gm.kv_sink = lambda il, k, v, n: seen.append((il, k.shape, v.shape, str(k.dtype), n))
    assert np.array_equal(np.array(gm.forward(SEQ[:7])), base)                   # the sink does not change the forward
    c = gm.cfg
    assert [s[0] for s in seen] == list(range(c.n_layer))
    assert all(s[1] == (7, c.n_head_kv * c.head_dim) and s[2] == (7, c.n_head_kv * c.head_dim_v) and s[4] == 7
               for s in seen)
    with pytest.raises(GraphCaptureError, match="KV cache"):
        gm.forward(SEQ[:7], graph=True)                                          # a replay would skip the fill
    gm.kv_sink = None
    dec = decode.Decoder(gm, 16)
    dec.prefill(SEQ[:7])
    assert gm.kv_sink is None                                                     # the decoder's fill is scoped


def test_cache_allocation_failure_says_the_bytes(monkeypatch):
    cp = install(monkeypatch, exact=True)
    cfg = _tiny("llama").cfg

    def oom(*a, **k):
        raise MemoryError("out of memory allocating 123 bytes")

    monkeypatch.setattr(cp, "zeros", oom)
    need = decode.cache_bytes(cfg, 4096)
    with pytest.raises(CacheAllocationError, match=f"needs {need} bytes"):
        decode.KVCache(cfg, 4096)
    monkeypatch.setattr(cp, "zeros", lambda *a, **k: (_ for _ in ()).throw(TypeError("a bug, not memory")))
    with pytest.raises(TypeError, match="a bug"):                                 # only a failed allocation is one
        decode.KVCache(cfg, 16)


# ------------------------------------------------------------------------------------------------ bad input

BAD = [
    ({"prompt_ids": []}, "empty prompt"),
    ({"prompt_ids": [1, 512]}, "token id 512 at prompt position 1 is outside the vocabulary 0..511"),
    ({"prompt_ids": [-1, 2]}, "token id -1 at prompt position 0"),
    ({"prompt_ids": [1.5, 2]}, "must be integers"),
    ({"prompt_ids": [[1, 2]]}, "1-D"),
    ({"n_new": 0}, "n_new .* >= 1, got 0"),
    ({"n_new": -3}, "got -3"),
    ({"n_new": 2.0}, "got 2.0"),
    ({"n_new": True}, "got True"),
    ({"n_new": 2047}, "2 prompt \\+ 2047 new = 2049 tokens is longer than the model's training context "
                      "n_ctx_train=2048"),
    ({"n_new": 20, "n_ctx": 16}, "22 tokens is longer than the cache's n_ctx=16"),
    ({"n_ctx": 4096}, "n_ctx=4096 positions is longer than the model's training context"),
    ({"n_ctx": 0}, "n_ctx .* >= 1"),
    ({"sampler": "top_k"}, "unknown sampler 'top_k'"),
]


@pytest.mark.parametrize("kw,match", BAD, ids=[m[:24] for _, m in BAD])
def test_bad_requests_are_refused_before_any_gpu_work(monkeypatch, kw, match):
    gm = _gm(monkeypatch, _tiny("llama"))

    def no_gpu(*a, **k):
        raise AssertionError("GPU work before the request was checked")

    monkeypatch.setattr(gpu, "kernel", no_gpu)
    monkeypatch.setattr(gpu, "cp", no_gpu)
    args = {"prompt_ids": [1, 2], "n_new": 4, **kw}
    with pytest.raises(DecodeError, match=match):
        gm.generate(args.pop("prompt_ids"), args.pop("n_new"), **args)


def test_models_the_decode_kernels_cannot_take(monkeypatch):
    gm = _gm(monkeypatch, _tiny("llama"))
    for change, match in (({"head_dim": 96}, "head dim 96"), ({"head_dim_v": 32}, "differs from v head dim"),
                          ({"n_head": 3}, "not a multiple")):
        bad = types.SimpleNamespace(**{**vars(gm.cfg), **change})
        assert any(match in p for p in decode.decode_problems(bad)), (change, decode.decode_problems(bad))
    assert decode.decode_problems(gm.cfg) == []
    gm.cfg = gm.cfg.replace(head_dim=32, head_dim_v=32, n_rot=32)
    with pytest.raises(DecodeError, match="head dim 32"):
        gm.generate([1, 2], 3)


def test_device_errors_are_reported(monkeypatch):
    """A NaN logit and a step past the cache are flagged in the device state and raised at the end."""
    gm = _gm(monkeypatch, _tiny("llama"))
    dec = decode.Decoder(gm, 8)
    real = dec._head
    monkeypatch.setattr(dec, "_head", lambda xs: real(xs) * np.nan)
    with pytest.raises(DecodeError, match="NaN logit"):
        dec.generate(np.array([1, 2], np.int32), 3)
    dec = decode.Decoder(gm, 8)
    dec.prefill([1, 2, 3])
    dec.set_state(4, 8)                                                          # position n_ctx: outside the cache
    before = dec.cache.buf.copy()
    dec.step()
    assert np.array_equal(dec.cache.buf, before)                                 # nothing appended
    with pytest.raises(DecodeError, match="outside the cache"):
        dec.check_errors()
    with pytest.raises(DecodeError, match="longer than the cache"):
        dec.generate(np.array([1, 2, 3], np.int32), 6)


def test_argmax_takes_the_lowest_index_of_a_tie_and_skips_nan(monkeypatch):
    install(monkeypatch, exact=True)
    st, hist = np.array([0, 3, 0, 0], np.int32), np.zeros(8, np.int32)
    ws = decode.argmax_workspace(10)
    x = np.array([1, 5, 2, np.nan, 5, 5, -1, 0, 3, 4], np.float32)
    decode.argmax_step(x, st, hist, ws)
    assert list(st) == [1, 4, 2, 0] and hist[4] == 1                             # index 1 of the three 5s; NaN: bit 1
    st[...] = [0, 7, 0, 0]
    decode.argmax_step(np.full(4, np.nan, np.float32), st, hist, ws)
    assert list(st) == [0, 8, 3, 0]                                              # no number: 0, NaN and past hist
    with pytest.raises(errors.ShapeError, match="float32"):
        decode.argmax_step(x.astype(np.float64), st, hist, ws)


# ------------------------------------------------------------------------------------------------ plans

def test_attention_plan():
    p = decode.attn_plan(4, 1, 600, sm_count=132)          # Gemma 3 270M: one kv head, a group of 4
    assert (p.GMAX, p.NZ, p.CH, p.maxch, p.NS) == (4, 1, 64, 10, 10)
    p = decode.attn_plan(32, 32, 640, sm_count=132)        # llama-7B: 32 kv heads, groups of 1
    assert (p.GMAX, p.NZ, p.maxch, p.NS) == (1, 1, 10, 9)
    p = decode.attn_plan(24, 2, 100, chunk=256, split=1)   # a group of 12: two CTAs of 8 heads per kv head
    assert (p.GMAX, p.NZ, p.CH, p.maxch, p.NS) == (8, 2, 256, 1, 1)
    assert p.ws_floats(2, 128) == 2 * 2 * 1 * (8 * 128 + 16)
    assert decode.attn_plan(4, 4, 10).slot_floats(64) == 64 + 4                   # padded to 16 bytes
    assert decode.attn_plan(6, 2, 10, gmax=2).NZ == 2
    for kw, match in (({"chunk": 300}, "1..256"), ({"gmax": 3}, "query heads a CTA"), ({"split": 0}, "split")):
        with pytest.raises(errors.ShapeError, match=match):
            decode.attn_plan(4, 1, 100, **kw)
    assert decode.argmax_grid(262144) == 64 and decode.argmax_grid(10) == 1
    assert decode.default_n_ctx(tiny_config("llama"), 300) == 512
    assert decode.default_n_ctx(tiny_config("llama"), 2000) == 2048               # at most n_ctx_train


def test_decode_attention_checks_its_arguments(monkeypatch):
    install(monkeypatch, exact=True)
    from labkernels.attention_kinds import LayerKind

    kind = LayerKind(4, 1, 64, 64, 0, 1.0)
    plan = decode.attn_plan(4, 1, 16)
    ws, cnt = decode.attn_workspace(plan, 1, 64)
    q = np.zeros((1, 256), np.float16)
    kc = np.zeros((16, 64), np.float16)
    st = np.array([0, 3, 0, 0], np.int32)
    with pytest.raises(errors.ShapeError, match="kc must be"):
        decode.decode_attention(q, kc[:8], kc, st, kind, 16, plan, ws, cnt)
    with pytest.raises(errors.ShapeError, match="chunk slots"):
        decode.decode_attention(q, np.zeros((1000, 64), np.float16), kc, st, kind, 1000, plan, ws, cnt)
    with pytest.raises(errors.ShapeError, match="head dims"):
        decode.decode_attention(q, kc, kc, st, LayerKind(4, 1, 96, 96, 0, 1.0), 16, plan, ws, cnt)
    o = decode.decode_attention(q, kc, kc, st, kind, 16, plan, ws, cnt, out16=False)
    assert o.shape == (1, 256) and o.dtype == np.float32
    with pytest.raises(errors.ShapeError, match="16-byte aligned"):
        decode.decode_attention(q, kc, kc, st, kind, 16, plan, ws, cnt, out=np.zeros(257, np.float16)[1:].reshape(1, 256))


# ------------------------------------------------------------------------------------------------ the graph path

class _Stream:
    ptr = 12345

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


def _fake_capture(monkeypatch, cp, corrupt: bool = False):
    """A stand-in stream capture: the captured work is kept and each replay runs it again (``corrupt``: and then
    spoils the logits the replay wrote, as a graph reading a stale buffer would)."""
    from labkernels import forward_common, graph_nodes

    steps = []
    real_step = decode.Decoder._step_device

    def step_device(self):
        out = real_step(self)
        steps.append(out)
        return out

    class Replay:
        def __init__(self, work):
            self.work = work

        def launch(self, stream=None):
            self.work()
            if corrupt:
                steps[-1][...] += 1.0

        def close(self):
            pass

    cuda = types.SimpleNamespace(
        Stream=lambda non_blocking=False: _Stream(), runtime=cp.cuda.runtime,
        MemoryPool=lambda: types.SimpleNamespace(malloc=None, free_all_blocks=lambda: None),
        using_allocator=lambda f: contextlib.nullcontext(), get_current_stream=cp.cuda.get_current_stream,
        Event=lambda: types.SimpleNamespace(record=lambda stream=None: None), get_elapsed_time=lambda a, b: 2.0)
    monkeypatch.setattr(cp, "cuda", cuda)
    monkeypatch.setattr(cp, "abs", np.abs, raising=False)
    monkeypatch.setattr(decode.Decoder, "_step_device", step_device)
    monkeypatch.setattr(forward_common, "graph_support", lambda: None)
    monkeypatch.setattr(graph_nodes, "capture", lambda work, stream: work)
    monkeypatch.setattr(graph_nodes, "destroy", lambda g: None)
    monkeypatch.setattr(graph_nodes, "memsets_to_kernels", lambda g: {"replaced": 0, "left": 0})
    monkeypatch.setattr(forward_common, "_instantiate", Replay)


def test_the_graph_path_replays_the_captured_step(monkeypatch):
    """With a stand-in capture whose replays run the step again: the first step eager, the capture, its first
    replay checked at the warm-up's position, then one replay per token -- the same tokens as eager steps."""
    gm = _gm(monkeypatch, _tiny("llama"))
    want = gm.generate(SEQ[:4], 9, graph=False)
    cp = gpu.cp()
    gm2 = GpuModel(gm.model, opts=PrefillOptions(attn_f16=True, kernel="wgmma_kq"))
    _fake_capture(monkeypatch, cp)
    got = gm2.generate(SEQ[:4], 9, graph=True)
    st = gm2.last_generate
    assert got == want and st["mode"] == "graph" and st["replays"] == 7 and st["capture"]["bitwise"]
    assert st["tok_per_s"] == pytest.approx(7 / 2e-3)
    dec = gm2._decoder
    assert dec.graph.replays == 8                                                 # 7 tokens + the checked one
    assert gm2.generate(SEQ[:4], 9, graph=True) == want                          # all replays now
    assert gm2.last_generate["replays"] == 8


def test_a_replay_that_differs_from_the_eager_step_is_refused(monkeypatch):
    gm = _gm(monkeypatch, _tiny("llama"))
    want = gm.generate(SEQ[:4], 6, graph=False)
    cp = gpu.cp()
    _fake_capture(monkeypatch, cp, corrupt=True)
    gm2 = GpuModel(gm.model, opts=PrefillOptions(attn_f16=True, kernel="wgmma_kq"))
    with pytest.raises(GraphCaptureError, match="first replay differs"):
        gm2.generate(SEQ[:4], 6, graph=True)
    gm3 = GpuModel(gm.model, opts=PrefillOptions(attn_f16=True, kernel="wgmma_kq"))
    got = gm3.generate(SEQ[:4], 6)                                               # auto: eager steps, said why
    assert got == want and gm3.last_generate["mode"] == "eager"
    assert "first replay differs" in gm3.last_generate["graph_refused"]
    assert gm3.generate(SEQ[:4], 6) == want and gm3._decoder.graph is None       # refused once: not captured again
    assert gm3.last_generate["mode"] == "eager" and "eager_steps_ms" in gm3.last_generate


# ------------------------------------------------------------------------------------------------ the command line

def test_cli_refuses_bad_requests_before_any_gpu_work(capsys):
    from labkernels import cli

    for argv, match in ((["--prompt-tokens", "4000", "--new-tokens", "128"], "4128 tokens is longer than the model's "
                                                                               "training context n_ctx_train=4096"),
                        (["--prompt-ids", "5", "32000"], "id 32000 at position 1"),
                        (["--prompt-ids", "-4"], "token id -4 is outside"),
                        ([], "an empty prompt"),
                        (["--prompt-tokens", "8", "--new-tokens", "8", "--n-ctx", "12"], "longer than the cache")):
        assert cli.main(["generate", "--model", "synthetic-7b", *argv]) == 2, argv
        assert match in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        cli.main(["generate", "--model", "synthetic-7b", "--prompt-tokens", "4", "--new-tokens", "0"])
    assert "0 is less than 1" in capsys.readouterr().err
    p = cli.build_parser().parse_args(["generate", "--model", "m", "--prompt-tokens", "3", "--no-graph", "--json"])
    assert (p.new_tokens, p.graph, p.json, p.n_ctx) == (128, False, True, None)


@pytest.mark.model
def test_stored_weight_bytes_is_what_gguf_py_says_a_decode_step_reads():
    """The generation benchmark's bytes a token: every 2-D tensor of the GGUF as gguf-py sizes it (Gemma 3 ties its
    head to the token embedding, so the embedding is read whole); a model with its own head leaves the embedding out."""
    import gguf

    from labkernels import model as model_mod
    from labkernels.synthetic import load_model
    from labkernels.rounds import r09_decode

    m = model_mod.open_model()
    reader = gguf.GGUFReader(str(m.path))
    want = sum(int(t.n_bytes) for t in reader.tensors if len([d for d in t.shape if d > 1]) >= 2)
    assert r09_decode.stored_weight_bytes(m) == want
    s = load_model("synthetic-7b")
    emb = s.tensor("token_embd.weight")
    with_emb = r09_decode.stored_weight_bytes(s) + emb.rows * emb.cols // 256 * {"q4_K": 144, "q6_K": 210}[emb.qtype]
    assert 3.9e9 < r09_decode.stored_weight_bytes(s) < with_emb


def test_generation_rows_name_models_as_llama_bench_rows_do(tmp_path):
    """The real Gemma's generation rows pair with llama-bench's by model name (the page's vs-llama column); a
    --gemma that is not a file is refused before anything is recorded."""
    import argparse

    from labkernels import peers
    from labkernels.rounds import r09_decode

    assert r09_decode.generate.model_label is peers.model_label      # what names the generation rows
    labels = [r09_decode.generate.model_label(s) for s in ("synthetic-7b", "synthetic-gemma3",
                                                           "/tmp/model/gemma-3-270m-q4_k_m.gguf", "Other-Model.GGUF")]
    assert labels == ["synthetic-7b", "synthetic-gemma3", "gemma-3-270m-q4_k_m", "other-model"]
    with pytest.raises(ValueError, match="no such GGUF file"):
        r09_decode.step_generate(tmp_path, argparse.Namespace(gemma=str(tmp_path / "absent.gguf"), log=print))
    assert not (tmp_path / "data").exists()


def test_round9_page_leads_with_the_latest_step_and_generation(tmp_path):
    """The page's abstract and headline come from the GEMV benchmark of record (the run qmatmul's auto reads, not a
    later step's A/B or generation run), the generation run and the peers' runs on the same card (each named); with
    no recorded data they say so instead of inventing figures."""
    import re

    from labkernels import records
    from labkernels.rounds import r09_decode as r9

    f = r9.state_facts()
    from labkernels import gemv

    auto = gemv.auto_table()
    if "gemv" in f:                     # the committed data holds the benchmark of record
        assert auto is not None and f["gemv"]["run"] == auto.run_id.iloc[0]
        step = next(s for s in r9.LEDGER if f["gemv"]["run"] in s.get("runs", []))
        assert f["gemv"]["step"] == step["step"] and step["gpu_check"] in ("gemv_step4", "gemv_step9")
        g = records.load("decode", f["gemv"]["run"])
        assert gemv.is_bench_of_record(g) and 0 < f["gemv"]["frac_copy"] < 1
        later = [r9.step_run(s) for s in r9.LEDGER if s["step"] > step["step"] and s.get("runs")]
        assert any(later) and all(r.run_id != g.run_id for r in later if r)   # a later step's run is not the headline's
    else:
        assert auto is None
    text = r9.abstract_now()
    assert len(re.findall(r"[.;]\s+[A-Z]", text)) + 1 <= 3 and text.endswith(".")
    for k, v in r9.state_now().items():
        assert "run" in k or k.startswith("next"), k
        assert "nan" not in v.lower()
    empty = tmp_path / "data"
    empty.mkdir()
    assert "gemv" not in r9.state_facts(empty) and "gen" not in r9.state_facts(empty)
    assert "Nothing is recorded yet." in r9.abstract_now(empty)


def test_round9_abstract_names_each_card_when_the_figures_come_from_two(monkeypatch):
    from labkernels.rounds import r09_decode as r9

    facts = {"gemv": {"card": "NVIDIA H100 80GB HBM3", "us": 27.6, "frac_copy": 0.4, "mmvq_us": 16.1,
                      "run": "20261206T204403Z-h10080gbhbm3-1f97ec7", "mmvq_run": "20261206T204547Z-h10080gbhbm3-1f97ec7"},
             "gen": {"card": "NVIDIA H200", "tok_s": 220.0, "llama_tg128": 285.0}}
    monkeypatch.setattr(r9.state, "state_facts", lambda root=None: facts)   # where abstract_now looks it up
    text = r9.abstract_now()
    assert "27.6 us, 40% of the copy line (0.58x the speed of llama.cpp's MMVQ) (on an NVIDIA H100 80GB HBM3)" in text
    facts["gemv"]["run"] = "20261207T004259Z-h10080gbhbm3-2406c00"       # another commit, hours later: another call
    assert "MMVQ, timed in another call on the same card model)" in r9.abstract_now()
    assert "220 tokens/s (0.77x llama-bench's tg128) (on an NVIDIA H200)" in text and "On an" not in text


def test_same_call_needs_one_card_one_commit_and_minutes_apart():
    from labkernels.rounds import r09_decode as r9

    a = "20261206T204403Z-h10080gbhbm3-1f97ec7"
    assert r9.same_call(a, "20261206T204547Z-h10080gbhbm3-1f97ec7")
    assert not r9.same_call(a, "20261206T204547Z-h200-1f97ec7")               # another card
    assert not r9.same_call(a, "20261206T204547Z-h10080gbhbm3-2406c00")       # another commit
    assert not r9.same_call(a, "20261206T214547Z-h10080gbhbm3-1f97ec7")       # an hour later
    assert not r9.same_call(a, "not-a-run") and not r9.same_call(a, None)
