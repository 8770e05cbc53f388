"""Tests for labkernels.synthetic (and the config reader of labkernels.arch) -- CPU only."""

from __future__ import annotations

import time

import numpy as np
import pytest

from labkernels.arch import config_from_model, expected_shapes, global_tensors, layer_tensors
from labkernels.model import ModelError, kquant_weights, open_model
from labkernels.synthetic import (SyntheticModel, llama7b_config, q4_k_m_recipe, recipe_counts, tiny_config,
                                  use_more_bits, write_gguf)


# --------------------------------------------------------------------------------------------------------
# the Q4_K_M recipe
# --------------------------------------------------------------------------------------------------------
def test_use_more_bits_32_layers():
    more = [i for i in range(32) if use_more_bits(i, 32)]
    # first 32/8 = 4, last 4 (i >= 28), and (i - 4) % 3 == 2 in between
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_llama7b_q4_k_m_recipe():
    cfg = llama7b_config()
    rec = q4_k_m_recipe(cfg)
    c = recipe_counts(rec)
    assert c["attn_v"]["Q6_K"] == 16 and c["ffn_down"]["Q6_K"] == 16
    assert c["types"] == {"Q4_K": 193, "Q6_K": 33, "F32": 65}
    assert rec["output.weight"] == "Q6_K"
    assert rec["token_embd.weight"] == "Q4_K"
    assert rec["output_norm.weight"] == "F32"
    for i in range(32):
        n = layer_tensors(cfg, i)
        for k in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert rec[n[k]] == "Q4_K"
        assert rec[n["attn_norm"]] == rec[n["ffn_norm"]] == "F32"
        want = "Q6_K" if use_more_bits(i, 32) else "Q4_K"
        assert rec[n["attn_v"]] == want and rec[n["ffn_down"]] == want


def test_recipe_reproduces_the_real_gemma_file(model):
    """The same rules (tied head -> output rule, 640-wide rows -> Q5_0 / Q8_0 fallbacks) give exactly the
    types llama-quantize wrote into the real Gemma 3 270M Q4_K_M file."""
    cfg = config_from_model(model)
    assert q4_k_m_recipe(cfg) == {t.name: t.ggml_type for t in model.tensors()}
    assert model.field("general.file_type") == 15


def test_llama7b_config():
    c = llama7b_config()
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.vocab) == \
        ("llama", 32, 4096, 32, 32, 128, 11008, 32000)
    assert c.rope_base == 10000.0 and c.rope_style == "normal" and c.ffn_act == "silu"
    assert c.rms_eps == float(np.float32(1e-5))
    assert c.attn_scale == pytest.approx(1 / np.sqrt(128))
    assert not c.tied_output and not c.qk_norm and not c.post_norms and c.sliding_window is None
    assert c.embed_scale == 1.0


# --------------------------------------------------------------------------------------------------------
# the synthetic model
# --------------------------------------------------------------------------------------------------------
def test_llama7b_builds_fast_and_has_the_right_tensors():
    cfg = llama7b_config()
    t0 = time.perf_counter()
    m = SyntheticModel(cfg, seed=0, cache=False)
    rep = m.build_all(keep=False)
    dt = time.perf_counter() - t0
    print(f"llama-7B Q4_K_M synthetic build: {dt:.1f} s, {rep['bytes'] / 2**30:.2f} GiB")
    assert dt < 30
    assert rep["tensors"] == 291
    assert rep["bytes"] == m.nbytes() == 4080263168  # 3.80 GiB, the size of a real llama-2-7b Q4_K_M
    assert config_from_model(m) == cfg
    t = m.tensor("blk.7.ffn_down.weight")
    assert (t.ggml_type, t.shape, t.raw().shape) == ("Q4_K", (4096, 11008), (4096, 11008 // 256 * 144))
    t = m.tensor("blk.6.attn_v.weight")
    assert (t.ggml_type, t.shape, t.raw().shape) == ("Q6_K", (4096, 4096), (4096, 16 * 210))
    w = t.array()
    assert w.dtype == np.float32 and np.isfinite(w).all()
    assert 0.015 < w.std() < 0.025 and abs(w.mean()) < 1e-3
    assert len(np.unique(t.raw()[:64], axis=0)) == 64  # rows differ
    nw = m.tensor("blk.3.ffn_norm.weight").array()
    assert nw.shape == (4096,) and abs(nw.mean() - 1) < 0.01 and 0.01 < nw.std() < 0.1
    ks = kquant_weights(m)  # the lab's helpers accept a SyntheticModel
    assert len(ks) == 193 + 33 and all(k.require_kquant() for k in ks[:3])


def test_synthetic_is_deterministic_and_order_independent():
    cfg = tiny_config("llama")
    a, b, c = SyntheticModel(cfg, seed=3), SyntheticModel(cfg, seed=3), SyntheticModel(cfg, seed=4)
    names = [t.name for t in a.tensors()]
    ra = {n: a.tensor(n).raw().copy() for n in names}
    rb = {n: b.tensor(n).raw().copy() for n in reversed(names)}
    for n in names:
        assert np.array_equal(ra[n], rb[n])
    assert not np.array_equal(ra["blk.0.attn_q.weight"], c.tensor("blk.0.attn_q.weight").raw())
    nc = SyntheticModel(cfg, seed=3, cache=False)
    assert np.array_equal(nc.tensor("blk.1.ffn_up.weight").raw(), ra["blk.1.ffn_up.weight"])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_write_gguf_round_trip(tmp_path, arch):
    from labkernels.prefill_ref import forward_ref

    cfg = tiny_config(arch, n_layer=6 if arch == "gemma3" else 2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                      vocab=1000)
    m = SyntheticModel(cfg, seed=11)
    path = write_gguf(m, tmp_path / f"tiny-{arch}.gguf")
    back = open_model(path)
    assert config_from_model(back) == cfg == config_from_model(m)
    assert [t.name for t in back.tensors()] == [t.name for t in m.tensors()]
    for t in m.tensors():
        u = back.tensor(t.name)
        assert (u.ggml_type, u.shape) == (t.ggml_type, t.shape), t.name
        assert np.array_equal(np.asarray(u.raw()), t.raw()), t.name
        assert np.array_equal(u.array(), t.array()), t.name
    for key in ("general.architecture", f"{arch}.block_count", f"{arch}.attention.layer_norm_rms_epsilon",
                f"{arch}.rope.freq_base", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
        assert back.field(key) == m.field(key), key
    toks = [1, 5, 17, 300, 999, 42, 7]
    assert np.array_equal(forward_ref(back, toks), forward_ref(m, toks))


def test_round_trip_of_a_non_default_gemma3_layout(tmp_path):
    """A custom per-layer sliding pattern and SWA rope base travel as the optional keys newer llama.cpp reads."""
    cfg = tiny_config("gemma3", n_layer=3, sliding_window=5)
    cfg = cfg.replace(layer_is_sliding=[False, True, True], rope_base_local=20000.0)
    m = SyntheticModel(cfg, seed=2)
    back = open_model(write_gguf(m, tmp_path / "g.gguf"))
    assert config_from_model(back) == cfg


def test_inexpressible_config_is_refused():
    cfg = tiny_config("llama").replace(attn_scale=0.5)  # llama.cpp derives it from head_dim
    with pytest.raises(ValueError, match="attn_scale"):
        SyntheticModel(cfg)


# --------------------------------------------------------------------------------------------------------
# config reader errors and tensor names
# --------------------------------------------------------------------------------------------------------
def test_config_errors_are_clear():
    m = SyntheticModel(tiny_config("llama"))
    from gguf.constants import GGUFValueType as VT
    m.metadata["general.architecture"] = ("bert", VT.STRING, None)
    with pytest.raises(ModelError, match="unsupported architecture 'bert'"):
        config_from_model(m)
    m = SyntheticModel(tiny_config("llama"))
    del m.metadata["llama.attention.layer_norm_rms_epsilon"]
    with pytest.raises(ModelError, match="llama.attention.layer_norm_rms_epsilon"):
        config_from_model(m)
    m = SyntheticModel(tiny_config("llama"))
    m.metadata["llama.feed_forward_length"] = (768, VT.UINT32, None)
    with pytest.raises(ModelError, match="ffn_gate.weight has shape"):
        config_from_model(m)


def test_tensor_names_cover_the_model():
    for arch in ("llama", "qwen2", "gemma3"):
        cfg = tiny_config(arch)
        m = SyntheticModel(cfg)
        names = set(global_tensors(cfg).values())
        for i in range(cfg.n_layer):
            names |= set(layer_tensors(cfg, i).values())
        assert names == {t.name for t in m.tensors()} == set(expected_shapes(cfg))
    g = tiny_config("gemma3")
    assert global_tensors(g)["output"] == "token_embd.weight"
    assert layer_tensors(g, 0)["post_ffw_norm"] == "blk.0.post_ffw_norm.weight"
    assert layer_tensors(tiny_config("qwen2"), 1)["attn_v_bias"] == "blk.1.attn_v.bias"


def test_gemma3_270m_config_is_the_real_files(model):
    """The synthetic Gemma stand-in has exactly the config the real GGUF gives (every field)."""
    from labkernels.arch import config_from_model
    from labkernels.synthetic import gemma3_270m_config

    assert gemma3_270m_config() == config_from_model(model)
    assert {k: v.lower() for k, v in q4_k_m_recipe(gemma3_270m_config()).items()} == {t.name: t.qtype.lower() for t in model.tensors()}


def test_synthetic_q5_0_rows_dequantize_with_gguf_py():
    """Gemma's Q5_0 tensors in the synthetic stand-in: gguf-py-quantized pool rows, read back by gguf-py."""
    from gguf import GGMLQuantizationType, quants

    from labkernels.synthetic import gemma3_270m_config

    m = SyntheticModel(gemma3_270m_config(), seed=3)
    t = m.tensor("blk.0.attn_q.weight")
    w = np.asarray(t.array())
    assert t.qtype.lower() == "q5_0" and w.shape == (1024, 640) and 0.015 < w.std() < 0.025
    assert np.array_equal(w, quants.dequantize(np.asarray(t.raw()), GGMLQuantizationType.Q5_0).reshape(w.shape))
