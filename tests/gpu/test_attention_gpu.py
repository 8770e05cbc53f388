"""GPU tests of the fused attention paths (labkernels.attention): per-layer outputs against the lab's fp32 baseline
and a float64 numpy reference (causal, sliding window, GQA, head dims 64/128/256), the bf16 conversions, the
errors, and whole prefills with the fused path against the float64 CPU reference (Gemma 3 270M, tiny llama / qwen2
/ gemma3). cuDNN cases need the nvidia-cudnn-frontend package (skipped with the reason otherwise); PyTorch cases
need torch."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


def _cudnn():
    from labkernels import attention, attention_kinds

    try:
        attention.import_cudnn()
    except attention_kinds.AttentionUnavailable as e:
        pytest.skip(str(e))


def _torch():
    from labkernels import attention, attention_kinds

    try:
        attention.import_torch()
    except attention_kinds.AttentionUnavailable as e:
        pytest.skip(str(e))


def _acts(cp, rng, n, kind):
    """fp16-representable fp32 q / k / v: the comparison is about the attention, not the input rounding."""
    def a(w):
        return cp.asarray(rng.standard_normal((n, w)).astype(np.float16).astype(np.float32))

    return a(kind.n_head * kind.head_dim), a(kind.n_head_kv * kind.head_dim), a(kind.n_head_kv * kind.head_dim_v)


def _ref64(cp, q, k, v, n, kind):
    from labkernels.attention_kinds import sdpa_ref

    return sdpa_ref(cp.asnumpy(q), cp.asnumpy(k), cp.asnumpy(v), n, kind)


def _rel(got, ref):
    import cupy

    g = cupy.asnumpy(got).astype(np.float64) if not isinstance(got, np.ndarray) else got.astype(np.float64)
    r = cupy.asnumpy(ref).astype(np.float64) if not isinstance(ref, np.ndarray) else ref.astype(np.float64)
    return float(np.max(np.abs(g - r)) / np.max(np.abs(r)))


# (n, heads, kv heads, head dim, window): llama MHA 128, GQA 64, Gemma's 256 with a window crossing n, its global
# layers, a window larger than n (plain causal), the 7B layout at the nt
CASES = [(300, 8, 8, 128, 0), (333, 8, 2, 64, 0), (400, 4, 1, 256, 64), (400, 4, 1, 256, 0), (200, 4, 1, 256, 512),
         (1100, 4, 1, 256, 512)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("path", ["cudnn", "torch", "lab"])
def test_fused_layer_matches_baseline(cp, rng, case, path):
    """Per-layer attention output of the fused path vs the fp32 baseline: max rel err <= 1e-3 in fp32 terms (fp16
    inputs, fp16 output); both against a float64 reference at the small sizes; the fp16 output (for a wgmma_kq
    consumer) is the fp32 output rounded."""
    from labkernels import attention
    from labkernels.attention_kinds import LayerKind
    from labkernels.trace import NullTracer

    if path != "lab":
        _cudnn() if path == "cudnn" else _torch()
    n, H, Hk, d, w = case
    kind = LayerKind(H, Hk, d, d, w, 1 / np.sqrt(d))
    q, k, v = _acts(cp, rng, n, kind)
    tr = NullTracer()
    base = attention.Baseline(None).attend(q, k, v, n, kind, 0, tr)
    B = {"cudnn": attention.Cudnn, "torch": attention.Torch, "lab": attention.Lab}[path](None)
    got = B.attend(q, k, v, n, kind, 0, tr)
    assert got.dtype == cp.float32 and got.shape == (n, H * d)
    err = _rel(got, base)
    # the bar is the fused (cudnn) path's; PyTorch may dispatch a masked case to a backend that rounds more
    assert err <= (2e-3 if path == "torch" else 1e-3), (path, case, err)
    g16 = B.attend(q, k, v, n, kind, 0, tr, out16=True)
    assert g16.dtype == cp.float16 and _rel(g16, got) <= 1e-3
    if n <= 400:
        r64 = _ref64(cp, q, k, v, n, kind)
        assert _rel(base, r64) <= 1e-4
        assert _rel(got, r64) <= (2e-3 if path == "torch" else 1e-3)


def test_cudnn_7b_layout_at_3325(cp, rng):
    from labkernels import attention
    from labkernels.attention_kinds import LayerKind
    from labkernels.trace import NullTracer

    _cudnn()
    n, kind = 3325, LayerKind(32, 32, 128, 128, 0, 1 / np.sqrt(128))
    q, k, v = _acts(cp, rng, n, kind)
    base = attention.Baseline(None).attend(q, k, v, n, kind, 0, NullTracer())
    c = attention.Cudnn(None)
    assert _rel(c.attend(q, k, v, n, kind, 0, NullTracer()), base) <= 1e-3
    assert len(c._graphs) == 1
    c.attend(q, k, v, n, kind, 1, NullTracer())            # same (tokens, kind): the cached graph is reused
    assert len(c._graphs) == 1


@pytest.mark.parametrize("path", ["cudnn", "torch"])
def test_bf16_path(cp, rng, path):
    """bf16 in, fp32 softmax: within bf16 precision of the baseline; the device conversion is the numpy one."""
    from labkernels import attention, attention_kinds
    from labkernels.attention_kinds import LayerKind
    from labkernels.trace import NullTracer

    _cudnn() if path == "cudnn" else _torch()
    n, kind = 257, LayerKind(8, 2, 128, 128, 100, 1 / np.sqrt(128))
    q, k, v = _acts(cp, rng, n, kind)
    bits = attention.to_io(q, "bf16")
    assert bits.dtype == cp.uint16 and np.array_equal(cp.asnumpy(bits), attention_kinds.bf16_bits(cp.asnumpy(q)))
    assert np.array_equal(cp.asnumpy(attention.from_io(bits, "bf16", False)), attention_kinds.bf16_to_f32(cp.asnumpy(bits)))
    base = attention.Baseline(None).attend(q, k, v, n, kind, 0, NullTracer())
    B = attention.Cudnn(None, "bf16") if path == "cudnn" else attention.Torch(None, "bf16")
    assert _rel(B.attend(q, k, v, n, kind, 0, NullTracer()), base) <= 1e-2


def test_cudnn_refuses_what_it_cannot_take(cp, rng):
    from labkernels import attention
    from labkernels.attention_kinds import AttentionError, LayerKind

    _cudnn()
    c = attention.Cudnn(None)
    kind = LayerKind(2, 1, 512, 512, 0, 1.0)
    q, k, v = _acts(cp, rng, 64, kind)
    with pytest.raises(AttentionError, match=r"layer\(s\) 4 \(causal, 2 query heads.*head dim 512 exceeds 256"):
        c.sdpa(attention.to_io(q, "f16"), attention.to_io(k, "f16"), attention.to_io(v, "f16"), 64, kind, 4)
    ok = LayerKind(2, 1, 64, 64, 0, 1.0)
    q, k, v = (attention.to_io(a, "f16") for a in _acts(cp, rng, 64, ok))
    with pytest.raises(AttentionError, match="expected C-contiguous"):
        c.sdpa(q[:, :64], k, v, 64, ok, 2)


@pytest.mark.gpu_fast
def test_torch_reports_its_backend(cp):
    from labkernels import attention
    from labkernels.attention_kinds import LayerKind

    _torch()
    t = attention.Torch(None)
    name = t.backend(512, LayerKind(32, 32, 128, 128, 0, 1 / np.sqrt(128)))
    assert name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH") or name.startswith("unknown")


def _top1_agrees(g, r, margin: float = 1e-2) -> bool:
    """Same argmax, or a near tie in the reference (its top two within margin * max|r|) that g ranks top-2."""
    if int(np.argmax(g)) == int(np.argmax(r)):
        return True
    a, b = np.sort(r)[-2:][::-1]
    return (a - b) < margin * np.max(np.abs(r)) and int(np.argmax(g)) in set(np.argsort(-r)[:2])


def _logits_vs_ref(gm, model, toks):
    import cupy

    from labkernels.prefill_ref import forward_ref

    g = cupy.asnumpy(gm.forward(toks)).astype(np.float64)
    r = forward_ref(model, toks, last_only=True)
    rel = float(np.max(np.abs(g - r)) / np.max(np.abs(r)))
    top5 = len(set(np.argsort(-g)[:5]) & set(np.argsort(-r)[:5]))
    return g, rel, _top1_agrees(g, r), top5


@pytest.mark.parametrize("path", ["baseline", "cudnn", "lab"])
def test_gemma_prefill_vs_reference_per_attention_path(model, path):
    """Gemma 3 270M logits vs the float64 CPU reference, unchanged by the attention path: the fixed prompt, and 700
    tokens (the sliding layers' 512-token window in effect)."""
    from labkernels.prefill import GpuModel, PrefillOptions
    from labkernels.prefill_runs import GEMMA_PROMPT, prompt_tokens
    from labkernels.prefill_ref import forward_ref

    if path == "cudnn":
        _cudnn()
    gm = GpuModel(model, opts=PrefillOptions(attention=path))
    assert gm.attn.name == path
    g, rel, _, top5 = _logits_vs_ref(gm, model, GEMMA_PROMPT)
    assert rel < 3e-2 and top5 >= 4 and np.argmax(g) == np.argmax(forward_ref(model, GEMMA_PROMPT, last_only=True))
    _, rel, top1, top5 = _logits_vs_ref(gm, model, prompt_tokens(model, 700, seed=3))
    assert top1 and rel < 3e-2 and top5 >= 4, (path, rel, top5)


def test_gemma_fused_logits_match_baseline(model):
    import cupy

    from labkernels.prefill import GpuModel, PrefillOptions
    from labkernels.prefill_runs import prompt_tokens

    _cudnn()
    toks = prompt_tokens(model, 700, seed=4)
    a = cupy.asnumpy(GpuModel(model, opts=PrefillOptions(attention="baseline")).forward(toks)).astype(np.float64)
    b = cupy.asnumpy(GpuModel(model, opts=PrefillOptions(attention="cudnn")).forward(toks)).astype(np.float64)
    assert _top1_agrees(b, a) and np.max(np.abs(a - b)) / np.max(np.abs(a)) < 1e-2
    assert len(set(np.argsort(-a)[:5]) & set(np.argsort(-b)[:5])) >= 4


@pytest.mark.gpu_fast
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_tiny_models_fused_vs_reference(arch):
    """Tiny synthetic models (GQA 4/2 x 64; gemma3 with a window of 8 over 40 tokens and a global layer) through
    the cuDNN path: logits vs the float64 reference as close as the baseline path's."""
    from labkernels.prefill import GpuModel, PrefillOptions
    from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config

    _cudnn()
    cfg = tiny_config(arch, n_layer=6 if arch == "gemma3" else 2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                      head_dim=64, vocab=512, sliding_window=8)
    m = SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=11)
    toks = [1] + list(range(20, 59))
    res = {}
    for path in ("baseline", "cudnn"):
        gm = GpuModel(m, opts=PrefillOptions(attention=path))
        res[path] = _logits_vs_ref(gm, m, toks)
    g_c, rel_c, top1_c, top5_c = res["cudnn"]
    g_b, rel_b, _, _ = res["baseline"]
    assert top1_c and top5_c >= 4 and rel_c < max(2 * rel_b, 1e-2), (arch, rel_c, rel_b)
    assert np.max(np.abs(g_c - g_b)) / np.max(np.abs(g_b)) < 5e-3
