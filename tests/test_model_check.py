"""The model check before any forward pass: wrong metadata is a ModelError, never a silently wrong model."""
import math

import numpy as np
import pytest
from gguf.constants import GGUFValueType as VT

from labkernels import cli
from labkernels.arch import config_from_model
from labkernels.model import ModelError, open_model
from labkernels.prefill_runs import prompt_tokens
from labkernels.prefill_ref import clear_cache, forward_ref
from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config, write_gguf

TOKS = [1, 5, 9, 3]


def tiny(arch="llama", recipe_edit=None, **meta):
    """A 2-layer synthetic model with some metadata keys replaced (value, GGUFValueType)."""
    cfg = tiny_config(arch, n_layer=2)
    recipe = q4_k_m_recipe(cfg)
    recipe.update(recipe_edit or {})
    m = SyntheticModel(cfg, recipe, seed=3, check=not recipe_edit)
    for key, (v, vt) in meta.items():
        m.metadata[key.replace("__", ".").format(a=arch)] = (v, vt, None)
    return m


def gguf(tmp_path, m, name="m.gguf"):
    return open_model(write_gguf(m, tmp_path / name))


def test_the_unedited_model_runs(tmp_path):
    m = gguf(tmp_path, tiny())
    logits = forward_ref(m, TOKS, last_only=True)
    assert logits.shape == (1000,) and np.isfinite(logits).all()


@pytest.mark.parametrize("n,match", [(1, r"does not use .*blk\.1\..*block_count is 1"),
                                     (0, r"block_count' \(number of layers\) is 0; it must be an integer >= 1")])
def test_block_count_smaller_than_the_layers_in_the_file(tmp_path, n, match):
    m = gguf(tmp_path, tiny(**{"{a}__block_count": (n, VT.UINT32)}))
    with pytest.raises(ModelError, match=match):
        forward_ref(m, TOKS)
    with pytest.raises(ModelError, match=match):
        config_from_model(m)


def test_block_count_larger_than_the_layers_in_the_file(tmp_path):
    m = gguf(tmp_path, tiny(**{"{a}__block_count": (3, VT.UINT32)}))
    with pytest.raises(ModelError, match=r"missing tensor 'blk\.2\.attn_norm\.weight'"):
        forward_ref(m, TOKS)


@pytest.mark.parametrize("key", ["{a}__attention__layer_norm_rms_epsilon", "{a}__rope__freq_base"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -1e-5, 0.0])
def test_eps_and_rope_base_must_be_finite_and_positive(tmp_path, key, value):
    m = gguf(tmp_path, tiny(**{key: (value, VT.FLOAT32)}))
    with pytest.raises(ModelError, match="must be finite and positive") as e:
        forward_ref(m, TOKS)
    assert str(m.path) in str(e.value) and key.split("__")[-1] in str(e.value)


def test_gemma_swa_rope_base(tmp_path):
    m = gguf(tmp_path, tiny("gemma3", **{"{a}__rope__freq_base_swa": (0.0, VT.FLOAT32)}))
    with pytest.raises(ModelError, match="freq_base_swa.*must be finite and positive"):
        config_from_model(m)


@pytest.mark.parametrize("meta,match", [
    ({"{a}__attention__head_count": (0, VT.UINT32)}, r"head_count' \(attention heads\) is 0"),
    ({"{a}__attention__head_count_kv": (3, VT.UINT32)}, "not a multiple of n_head_kv 3"),
    ({"{a}__embedding_length": (128, VT.UINT32)}, "token_embd.weight has shape"),
    ({"{a}__feed_forward_length": ("512", VT.STRING)}, r"feed_forward_length' \(FFN size\) is '512'"),
    ({"{a}__attention__key_length": (32, VT.UINT32)}, "rope dimension count 64 invalid for head size 32"),
    ({"{a}__attention__key_length": (32, VT.UINT32), "{a}__rope__dimension_count": (32, VT.UINT32)},
     r"needs n_rot == head_dim == head_dim_v, got 32, 32, 64"),
])
def test_counts_and_dims(tmp_path, meta, match):
    with pytest.raises(ModelError, match=match):
        config_from_model(gguf(tmp_path, tiny(**meta)))


def test_tensor_type_is_checked(tmp_path):
    m = tiny(recipe_edit={"blk.1.ffn_norm.weight": "Q8_0"})
    with pytest.raises(ModelError, match=r"blk\.1\.ffn_norm\.weight has type Q8_0; a 1-D llama tensor must be one of"):
        config_from_model(gguf(tmp_path, m))


def test_explicit_config_is_validated_too(tmp_path):
    m = gguf(tmp_path, tiny())
    cfg = config_from_model(m)
    with pytest.raises(ModelError, match="rms_eps = nan"):
        cfg.replace(rms_eps=math.nan)
    bad = cfg.replace()
    bad.rope_base = -1.0  # edited after construction
    clear_cache()
    with pytest.raises(ModelError, match="rope_base = -1.0"):
        forward_ref(m, TOKS, cfg=bad)
    wide = cfg.replace(n_embd=512)
    with pytest.raises(ModelError, match="token_embd.weight has shape"):
        forward_ref(m, TOKS, cfg=wide)


# ------------------------------------------------------------------ token counts on the command line
@pytest.mark.parametrize("argv,rc,msg", [
    (["--tokens", "-5"], 2, "argument --tokens: -5 is less than 0"),
    (["--tokens", "0"], 2, "--tokens 0 without prompt ids is an empty prompt"),
    ([], 2, "--tokens 0 without prompt ids is an empty prompt"),
    (["--tokens", "2", "--prompt-ids"], 2, "--prompt-ids needs at least one id"),
    (["--prompt-ids", "-1", "5"], 2, "prompt ids must be non-negative"),
    (["--tokens", "3", "--repeats", "0"], 2, "argument --repeats: 0 is less than 1"),
])
def test_prefill_cli_token_counts(capsys, argv, rc, msg):
    try:
        got = cli.main(["prefill", "--model", "synthetic-7b", *argv])
    except SystemExit as e:  # argparse usage errors
        got = e.code
    assert got == rc and msg in capsys.readouterr().err


def test_decompose_cli_nt(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["decompose", "--model", "synthetic-7b", "--nt", "0"])
    assert e.value.code == 2 and "--nt: 0 is less than 1" in capsys.readouterr().err


def test_prompt_tokens(tmp_path):
    m = tiny()
    assert len(prompt_tokens(m, 7)) == 7 and prompt_tokens(m, 2, [4, 5, 6]) == [4, 5]
    assert prompt_tokens(m, 0, [4, 5, 6]) == [4, 5, 6]
    for n, ids, match in ((-5, None, "non-negative"), (0, None, "empty prompt"), (3, [], "without any ids"),
                          (2, [1, -2], "non-negative")):
        with pytest.raises(ValueError, match=match):
            prompt_tokens(m, n, ids)
