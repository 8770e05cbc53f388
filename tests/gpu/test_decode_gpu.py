"""GPU tests of round 9's KV-cache generation (labkernels.decode, kernels/decode.cu).

* decode_attn against a float64 reference on fresh random fp16 caches: head dims 64/128/256, groups of 1/3/4/12/32
  query heads per kv head (GMAX 1..8, two head groups), global and sliding layers (a window narrower than the context,
  wider than it), contexts of one key to ~1000, chunks of 16..256, splits 1..more than the chunks; the output poisoned
  with NaN inside NaN guards that must stay NaN, the cache rows the mask excludes (past p, before the window) NaN
  too, so a read of one shows; fp16 and f32 outputs; the arrival counters back at zero;
* split vs unsplit bitwise (the chunk states folded in chunk order), and a repeated launch bitwise;
* decode_qkv bit for bit the prefill's qk_norm_rope_qkv16 / rope_qkv16 at one token and pos0 = p, only row p of the
  NaN-poisoned cache written, a position outside the cache flagged and nothing written;
* argmax_step against numpy (ties: the lowest index, across CTAs; NaN skipped and flagged);
* the decode step's logits at every position against the full prefill's (teacher forcing) on tiny llama / qwen2 /
  gemma3 (a window shorter than the sequence) and on Gemma 3 270M; graph replay against the eager step; greedy
  tokens of generate against GpuModel.greedy on Gemma 3 270M over 64 tokens; the cache that cannot be allocated; the
  CLI's JSON;
* round 9's decode-step decomposition on Gemma 3's shapes: the classes cover the traced kernel time, the replay is no
  slower than the eager step.

Parity runs the prefill on round 7's family (kernel="wgmma_kq": f16 activations x the same emulated f16 weights as
gemv_kq) and the lab's fp16 attention, so that the two sides compute the same function up to f32 summation order and
the attention's P (fp16 in the prefill's mma kernel, fp32 in decode_attn)."""
import json

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

GUARD = 64
#: decode_attn vs float64 (max |diff| / max |ref|): f32 output (fp32 softmax with ex2.approx, fp32 sums), fp16 output
ATTN_TOL = {False: 1e-4, True: 2e-3}
#: the decode step's logits vs the full prefill's (teacher forcing), max |diff| / max |prefill logits|, and the top-2
#: margin (a fraction of max |logits|) above which the top-1 tokens must agree
DEVICE_RTOL = 2e-2
TOP1_MARGIN = 2e-2
SEQ = [1, 17, 300, 42, 99, 7, 511, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 60, 2]


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


# ------------------------------------------------------------------------------------------------ decode_attn

def _attn_inputs(cp, rng, D, H, Hk, window, pos, n_ctx, spread=1.0):
    """q16 [1, H*D] and a cache whose rows outside lo..pos are NaN (never to be read)."""
    q = (spread * rng.standard_normal((1, H * D))).astype(np.float16)
    k = rng.standard_normal((n_ctx, Hk * D)).astype(np.float16)
    v = rng.standard_normal((n_ctx, Hk * D)).astype(np.float16)
    lo = max(0, pos - window + 1) if window else 0
    k[pos + 1:] = np.nan
    v[pos + 1:] = np.nan
    k[:lo] = np.nan
    v[:lo] = np.nan
    return q, k, v, lo


def _attn_ref(q, k, v, pos, lo, H, Hk, D, scale):
    qh = q.astype(np.float64).reshape(H, D)
    K = k[lo:pos + 1].astype(np.float64).reshape(-1, Hk, D)
    V = v[lo:pos + 1].astype(np.float64).reshape(-1, Hk, D)
    out = np.empty((H, D))
    for h in range(H):
        s = scale * (K[:, h // (H // Hk)] @ qh[h])
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ V[:, h // (H // Hk)]
    return out.reshape(1, H * D)


def _attn_run(cp, q, k, v, pos, kind, n_ctx, plan, out16):
    """decode_attn into the middle of a NaN buffer: (output, guards untouched, counters at zero)."""
    from labkernels import decode

    ws, cnt = decode.attn_workspace(plan, kind.n_head_kv, kind.head_dim)
    st = cp.asarray(np.array([0, pos, 0, 0], np.int32))
    w = kind.n_head * kind.head_dim
    buf = cp.full(w + 2 * GUARD, np.nan, cp.float16 if out16 else cp.float32)
    o = buf[GUARD:GUARD + w].reshape(1, w)
    decode.decode_attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), st, kind, n_ctx, plan, ws, cnt, out16=out16,
                            out=o)
    cp.cuda.runtime.deviceSynchronize()
    g = cp.asnumpy(buf)
    guards = bool(np.isnan(g[:GUARD]).all() and np.isnan(g[-GUARD:]).all())
    return g[GUARD:GUARD + w].reshape(1, w), guards, int(cp.asnumpy(cnt).any()) == 0


# (D, H, Hk, window, pos, n_ctx, chunk, split)
ATTN_CASES = [(256, 4, 1, 0, 0, 8, 64, None), (256, 4, 1, 512, 700, 1024, 64, None), (256, 4, 1, 0, 700, 1024, 64, 3),
              (256, 4, 1, 0, 1000, 1024, 256, 4), (128, 32, 32, 0, 511, 640, 64, None), (128, 8, 2, 33, 100, 128, 16, 5),
              (64, 6, 2, 0, 129, 256, 64, 2), (64, 24, 2, 50, 200, 256, 32, None), (128, 4, 2, 7, 5, 16, 256, 1),
              (64, 16, 2, 0, 63, 64, 64, 9), (128, 14, 2, 4096, 300, 512, 128, None)]


@pytest.mark.parametrize("out16", [True, False])
@pytest.mark.parametrize("case", ATTN_CASES, ids=[str(c) for c in ATTN_CASES])
def test_decode_attention_vs_float64(cp, rng, case, out16):
    from labkernels import decode
    from labkernels.attention_kinds import LayerKind

    D, H, Hk, window, pos, n_ctx, chunk, split = case
    kind = LayerKind(H, Hk, D, D, window, 1 / np.sqrt(D))
    plan = decode.attn_plan(H, Hk, n_ctx, split=split, chunk=chunk)
    q, k, v, lo = _attn_inputs(cp, rng, D, H, Hk, window, pos, n_ctx)
    got, guards, rearmed = _attn_run(cp, q, k, v, pos, kind, n_ctx, plan, out16)
    assert guards, "decode_attn wrote outside its output"
    assert np.isfinite(got).all(), f"{int((~np.isfinite(got)).sum())} outputs not written, or a masked row was read"
    assert rearmed, "an arrival counter was left non-zero"
    ref = _attn_ref(q, k, v, pos, lo, H, Hk, D, kind.scale)
    rel = float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    assert rel <= ATTN_TOL[out16], (rel, plan)


def test_decode_attention_large_scores(cp, rng):
    """Scores spread over hundreds (the softmax dominated by a few keys) stay finite and accurate."""
    from labkernels import decode
    from labkernels.attention_kinds import LayerKind

    D, H, Hk, pos, n_ctx = 128, 8, 2, 333, 512
    kind = LayerKind(H, Hk, D, D, 0, 1.0)
    q, k, v, lo = _attn_inputs(cp, rng, D, H, Hk, 0, pos, n_ctx, spread=4.0)
    got, guards, _ = _attn_run(cp, q, k, v, pos, kind, n_ctx, decode.attn_plan(H, Hk, n_ctx), False)
    ref = _attn_ref(q, k, v, pos, lo, H, Hk, D, 1.0)
    assert guards and np.isfinite(got).all()
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= 1e-3


@pytest.mark.gpu_fast
def test_decode_attention_split_is_bitwise_unsplit(cp, rng):
    """The chunk states are folded in chunk order by whichever CTA arrives last: one CTA per (kv head, head group)
    and any number of splits -- more than the chunks included -- give the same bits, launch after launch; the counters
    are left at zero for the next launch (a graph replay). Also the fast tier's gate of the kernel against float64."""
    from labkernels import decode
    from labkernels.attention_kinds import LayerKind

    for D, H, Hk, window, pos, n_ctx in ((256, 4, 1, 0, 1000, 1024), (256, 4, 1, 512, 1000, 1024),
                                         (128, 8, 2, 0, 700, 768)):
        kind = LayerKind(H, Hk, D, D, window, 1 / np.sqrt(D))
        q, k, v, lo = _attn_inputs(cp, rng, D, H, Hk, window, pos, n_ctx)
        ref = _attn_ref(q, k, v, pos, lo, H, Hk, D, kind.scale)
        base = None
        nch = -(-(pos - lo + 1) // 64)
        for split in (1, 2, 3, 5, nch, nch + 3):
            plan = decode.attn_plan(H, Hk, n_ctx, split=split, chunk=64)
            for _ in range(2):
                got, guards, rearmed = _attn_run(cp, q, k, v, pos, kind, n_ctx, plan, False)
                assert guards and rearmed and np.isfinite(got).all(), split
                if base is None:
                    base = got
                    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= ATTN_TOL[False]
                assert np.array_equal(got.view(np.uint32), base.view(np.uint32)), (D, window, split)


# ------------------------------------------------------------------------------------------------ decode_qkv

@pytest.mark.parametrize("neox", [0, 1])
@pytest.mark.parametrize("qkn,n_rot", [(1, 256), (0, 256), (0, 128)])
def test_decode_qkv_is_the_prefill_kernel_at_one_token(cp, rng, neox, qkn, n_rot):
    """decode_qkv at position p = st[1]: q16, and rows p of the cache, bit for bit what the prefill's fused kernel
    (qk_norm_rope_qkv16 with the q/k norms, rope_qkv16 without) writes for one token at pos0 = p; every other cache
    row untouched (NaN); a position outside the cache writes nothing and sets bit 0 of st[2]."""
    from labkernels import gpu

    H, Hk, hd, n_ctx = 4, 2, 256, 64
    eps, base, fs, qscale = np.float32(1e-6), np.float32(1e6), np.float32(1.0), np.float32(0.0625)
    w = (H + 2 * Hk) * hd
    row = cp.asarray(rng.standard_normal((1, w)).astype(np.float32) * 3)      # a stacked QKV output row
    q, k, v = row[:, :H * hd], row[:, H * hd:(H + Hk) * hd], row[:, (H + Hk) * hd:]
    wq = cp.asarray(rng.standard_normal(hd).astype(np.float32))
    wk = cp.asarray(rng.standard_normal(hd).astype(np.float32))
    for pos in (0, 1, int(rng.integers(2, n_ctx - 1)), n_ctx - 1):
        q16p, k16p, v16p = (cp.empty((1, x), cp.float16) for x in (H * hd, Hk * hd, Hk * hd))
        if qkn:
            gpu.kernel("qk_norm_rope_qkv16", NEOX=neox).launch((H + 2 * Hk,), (
                q, k, v, wq, wk, q16p, k16p, v16p, np.int32(H), np.int32(Hk), np.int32(hd), np.int32(hd),
                np.int32(n_rot), np.int32(w), np.int32(w), np.int32(w), eps, base, fs, np.int32(pos), qscale))
        else:
            total = (H + Hk) * (hd // 2) + Hk * (hd // 2)
            gpu.kernel("rope_qkv16", NEOX=neox).launch(((total + 255) // 256,), (
                q, k, v, q16p, k16p, v16p, np.int32(1), np.int32(H), np.int32(Hk), np.int32(hd), np.int32(hd),
                np.int32(n_rot), np.int32(w), np.int32(w), np.int32(w), base, fs, np.int32(pos), qscale))
        q16 = cp.full((1, H * hd), np.nan, cp.float16)
        kc = cp.full((n_ctx, Hk * hd), np.nan, cp.float16)
        vc = cp.full((n_ctx, Hk * hd), np.nan, cp.float16)
        st = cp.asarray(np.array([7, pos, 0, 0], np.int32))
        gpu.kernel("decode_qkv", NEOX=neox, QKN=qkn).launch((H + 2 * Hk,), (
            q, k, v, wq, wk, q16, kc, vc, st, np.int32(n_ctx), np.int32(H), np.int32(Hk), np.int32(hd), np.int32(hd),
            np.int32(n_rot), eps, base, fs, qscale))
        u = lambda a: cp.asnumpy(a).view(np.uint16)    # noqa: E731 -- bit patterns
        assert np.array_equal(u(q16), u(q16p)), pos
        assert np.array_equal(u(kc[pos:pos + 1]), u(k16p)) and np.array_equal(u(vc[pos:pos + 1]), u(v16p)), pos
        others = np.ones(n_ctx, bool)
        others[pos] = False
        assert np.isnan(cp.asnumpy(kc)[others]).all() and np.isnan(cp.asnumpy(vc)[others]).all(), pos
        assert list(cp.asnumpy(st)) == [7, pos, 0, 0]
    st = cp.asarray(np.array([7, n_ctx, 0, 0], np.int32))
    kc = cp.full((n_ctx, Hk * hd), np.nan, cp.float16)
    gpu.kernel("decode_qkv", NEOX=neox, QKN=qkn).launch((H + 2 * Hk,), (
        q, k, v, wq, wk, q16, kc, kc, st, np.int32(n_ctx), np.int32(H), np.int32(Hk), np.int32(hd), np.int32(hd),
        np.int32(n_rot), eps, base, fs, qscale))
    assert np.isnan(cp.asnumpy(kc)).all() and list(cp.asnumpy(st)) == [7, n_ctx, 1, 0]


# ------------------------------------------------------------------------------------------------ argmax_step

@pytest.mark.parametrize("n", [1, 100, 4097, 50000, 262144])
def test_argmax_step_vs_numpy(cp, rng, n):
    from labkernels import decode

    ws = decode.argmax_workspace(n)
    hist = cp.full(16, -1, cp.int32)
    for trial in range(3):
        x = rng.standard_normal(n).astype(np.float32)
        if n > 10:
            top = float(x.max()) + 1.0
            tie = np.sort(rng.choice(n, size=3, replace=False))     # a three-way tie, likely across CTAs
            x[tie] = top
            x[rng.choice(n, size=5, replace=False)] = np.nan
            x[tie[0]] = top                                          # the lowest tied index is not NaN
        pos = 3 + trial
        st = cp.asarray(np.array([-1, pos, 0, 0], np.int32))
        decode.argmax_step(cp.asarray(x), st, hist, ws)
        s = cp.asnumpy(st)
        want = int(np.flatnonzero(x == np.nanmax(x))[0])
        assert s[0] == want and s[1] == pos + 1 and int(cp.asnumpy(hist)[pos + 1]) == want, (trial, s, want)
        assert s[2] == (2 if np.isnan(x).any() else 0)
        assert int(cp.asnumpy(ws[2])[0]) == 0                        # the counter re-armed
    st = cp.asarray(np.array([5, 15, 0, 0], np.int32))               # all NaN, and p + 1 past the history
    decode.argmax_step(cp.full(n, np.nan, cp.float32), st, hist, ws)
    assert list(cp.asnumpy(st)) == [0, 16, 3, 0]


# ------------------------------------------------------------------------------------------------ the model

def _tiny(arch, seed=3):
    from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config

    extra = {"sliding_window": 8} if arch == "gemma3" else {}
    cfg = tiny_config(arch, n_layer=7 if arch == "gemma3" else 2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                      head_dim=64, vocab=512, **extra)
    return SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=seed)


def _matched(m, cfg=None, **kw):
    from labkernels.prefill import GpuModel, PrefillOptions

    return GpuModel(m, cfg=cfg, opts=PrefillOptions(kernel="wgmma_kq", attention="lab", attn_f16=True, **kw))


def _parity(cp, gm, seq, p0, n_ctx=None):
    """Teacher forcing: the decode step's logits at p0..len-1 against the full prefill's; (max rel err, positions
    whose top-1 differ although the prefill's top-2 margin exceeds TOP1_MARGIN, the decoder)."""
    from labkernels import decode

    full = cp.asnumpy(gm.forward(seq, all_logits=True, graph=False)).astype(np.float64)
    dec = decode.Decoder(gm, n_ctx or len(seq) + 1)
    dec.prefill(seq[:p0])
    errs, flips = [], []
    for p in range(p0, len(seq)):
        g = cp.asnumpy(dec.step(token=seq[p])).astype(np.float64)
        r = full[p]
        errs.append(float(np.max(np.abs(g - r)) / np.max(np.abs(r))))
        top = np.sort(r)[-2:]
        if int(np.argmax(g)) != int(np.argmax(r)) and top[1] - top[0] > TOP1_MARGIN * np.max(np.abs(r)):
            flips.append(p)
    assert dec.state() == {"tok": int(np.argmax(g)), "pos": len(seq), "err": 0}
    return max(errs), flips, dec


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_decode_logits_equal_the_prefill_on_the_device(cp, arch):
    gm = _matched(_tiny(arch))
    rel, flips, dec = _parity(cp, gm, SEQ, 3, n_ctx=32)
    assert rel <= DEVICE_RTOL and not flips, (rel, flips)
    # the rows the decode steps appended against those a prefill of the whole sequence writes
    from labkernels import decode

    other = decode.Decoder(gm, 32)
    other.prefill(SEQ)                                       # (synchronizes its stream)
    for il in range(gm.cfg.n_layer):
        for a, b in ((dec.cache.k[il], other.cache.k[il]), (dec.cache.v[il], other.cache.v[il])):
            a, b = cp.asnumpy(a[:len(SEQ)]).astype(np.float64), cp.asnumpy(b[:len(SEQ)]).astype(np.float64)
            assert np.max(np.abs(a - b)) <= 1e-2 * np.max(np.abs(b)), il


def test_graph_replay_equals_eager(cp):
    """The captured step replayed: the same tokens as eager steps, and at one position the same logits (the same
    kernels and pointers; a library's choice under capture at most GRAPH_RTOL away) and the same device state."""
    from labkernels.forward_common import GRAPH_RTOL

    m = _tiny("gemma3", seed=9)
    eager = _matched(m).generate(SEQ[:5], 14, graph=False)
    gm = _matched(m)
    got = gm.generate(SEQ[:5], 14, graph=True)
    st = gm.last_generate
    assert got == eager and st["mode"] == "graph" and st["replays"] == 12 and st["tok_per_s"] > 0
    dec = gm._decoder
    assert dec.graph.pdl_launches > 0 and dec.graph.max_rel_diff <= GRAPH_RTOL
    for p in (5, 11, 17):
        dec.set_state(SEQ[p % len(SEQ)], p)
        dec.replay(1)
        sg = dec.state()                                     # synchronizes the decoder's stream
        lg = cp.asnumpy(dec.graph.logits[0]).astype(np.float64)
        dec.set_state(SEQ[p % len(SEQ)], p)
        le = cp.asnumpy(dec.step()).astype(np.float64)
        assert float(np.max(np.abs(lg - le)) / np.max(np.abs(le))) <= GRAPH_RTOL, p
        assert dec.state() == sg, p
    assert gm.generate(SEQ[:5], 14, graph=True) == eager and gm.last_generate["replays"] == 13   # all replays now


def test_decode_decomposition_on_the_device(cp):
    """Round 9's decode-step decomposition (labkernels/rounds/r09_decode/decomp.py) on Gemma 3's shapes (synthetic
    weights) at a 256-token context: the eager step traced with CUPTI, its launches classed -- at least 95% of the traced
    kernel time named by a class, in the eager step and in the traced replays --, the replay's kernels mapped onto the
    eager ones, one attention launch a layer, the shares summing to 1, and the graph replay of the step no slower than
    the eager step's host wall. Needs cupti-python (the GPU extra)."""
    import pandas as pd

    from labkernels import prefill, synthetic
    from labkernels.rounds.r09_decode import decomp

    m = synthetic.load_model("synthetic-gemma3")
    gm = prefill.GpuModel(m)
    rows, s = decomp.decompose_step(gm, m, "synthetic-gemma3", 256, repeats=5, traced_replays=2,
                                    progress=lambda msg: None)
    t = pd.DataFrame(rows)
    assert s["mode"] == "graph", s["graph_refused"]
    assert s["classified_frac"] >= 0.95 and s["classified_frac_replay"] >= 0.95, s["unclassified_kernels"]
    assert s["replay_matched"] >= 0.9, s
    assert s["graph_us"] <= s["eager_wall_us"], s
    assert abs(t.share.sum() - 1.0) < 1e-9 and {"gemv", "attention", "small", "gaps"} <= set(t.group)
    assert int(t[t["class"] == "attention"].launches.iloc[0]) == gm.cfg.n_layer
    assert s["step_us"] >= s["graph_us"] - 1e-6 and s["busy_replay_us"] > 0


def test_cache_that_cannot_be_allocated_says_its_bytes(cp):
    from labkernels import decode

    cfg = _tiny("llama").cfg
    n = 2 ** 28                                              # 256 GiB of cache: more than any one GPU has
    with pytest.raises(decode.CacheAllocationError, match=f"needs {decode.cache_bytes(cfg, n)} bytes"):
        decode.KVCache(cfg, n)


@pytest.mark.model
def test_gemma_decode_logits_equal_the_prefill(cp, model):
    from labkernels.arch import config_from_model
    from labkernels.prefill_runs import GEMMA_PROMPT

    seq = GEMMA_PROMPT + [3694, 496, 1698, 529, 506, 8911, 236761, 108, 818, 5279, 529, 7001]
    for cfg in (None, config_from_model(model).replace(sliding_window=5)):    # the real window (512), and one < seq
        rel, flips, _ = _parity(cp, _matched(model, cfg=cfg), seq, 2)
        assert rel <= DEVICE_RTOL and not flips, (rel, flips, cfg and cfg.sliding_window)


@pytest.mark.model
def test_gemma_generate_equals_greedy_over_64_tokens(cp, model):
    from labkernels.prefill_runs import GEMMA_PROMPT

    gm = _matched(model)
    out = gm.generate(GEMMA_PROMPT, 64)
    assert gm.last_generate["mode"] == "graph", gm.last_generate.get("graph_refused")
    ref = gm.greedy(GEMMA_PROMPT, 64)
    first = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), None)
    assert out == ref, f"first difference at token {first}"


@pytest.mark.model
def test_cli_generate_json(model_path, capsys):
    from labkernels import cli

    assert cli.main(["generate", "--model", str(model_path), "--prompt-tokens", "16", "--new-tokens", "9",
                     "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert len(r["tokens"]) == 9 and r["n_prompt"] == 16 and r["mode"] == "graph" and r["replays"] == 7
    assert r["tok_per_s"] > 0 and r["gpu_ms"] > 0 and r["prefill_ms"] > 0 and "host_outside_ms" in r
    assert "gemv_kq x" in r["families"] and isinstance(r["text"], str)
