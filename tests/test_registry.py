"""The kernel registry's named variants (the one place a default lives) and its tile constants (the one place
they are written: the CUDA sources receive them as -D options)."""
import re

import pytest

from labkernels import dispatch
from labkernels.kernels import registry


def test_every_variant_is_a_registered_instantiation():
    for v in registry.VARIANTS.values():
        strides = (210, 224) if v.qtype == "q6_K" else (None,)
        for s in strides:
            spec = v.spec(s)
            assert spec.family == v.family and {k: spec.p[k] for k in v.p} == v.p
            if s:
                assert spec.p["STRIDE"] == s
        assert v.mma_k in (16, 32) and v.act in ("q8_1_tiles", "q8_1_rows")


def test_one_default_per_type_and_family():
    assert registry.default_variant("q4_K").name == "q4k_nb_kdr8"          # round 4's best KDR
    assert registry.default_variant("q4_K").p == {"KDR": 8}
    assert registry.default_variant("q6_K").p == {"KDR": 4, "EPI": 0, "OCC": 2}
    for fam in ("q4k_nb", "q6k_expb", "q6k_generic"):
        assert registry.default_variant(fam).family == fam
    with pytest.raises(KeyError, match="0 variants are the default of 'q5_K'"):
        registry.default_variant("q5_K")


def test_gpu_int8_defaults_read_the_table():
    assert dispatch._int8_default("q4_K") == ("q4k_nb", {"KDR": 8})
    assert dispatch._int8_default("q6_K") == ("q6k_expb", {"KDR": 4, "EPI": 0, "OCC": 2})


def test_every_caller_takes_its_default_from_the_table(monkeypatch):
    """Move q4_K's default to KDR=4 in the table: the int8 path of round 7's benchmark (and so ``auto``'s int8
    rows) follows; the prefill's option starts at the table's value."""
    import dataclasses

    from labkernels import wgmma
    from labkernels.prefill import PrefillOptions

    assert PrefillOptions().q4k_kdr == registry.default_variant("q4k_nb").p["KDR"] == 8
    assert wgmma.variant_params("int8_q6k_expb", "q6_K") == ("q6k_expb", {"KDR": 4, "EPI": 0, "OCC": 2})
    v4, v8 = registry.VARIANTS["q4k_nb_kdr4"], registry.VARIANTS["q4k_nb_kdr8"]
    monkeypatch.setitem(registry.VARIANTS, "q4k_nb_kdr4", dataclasses.replace(v4, default_for=v8.default_for))
    monkeypatch.setitem(registry.VARIANTS, "q4k_nb_kdr8", dataclasses.replace(v8, default_for=()))
    assert wgmma.variant_params("int8_q4k_nb", "q4_K") == ("q4k_nb", {"KDR": 4})
    assert dispatch._int8_default("q4_K") == ("q4k_nb", {"KDR": 4})


def test_names_resolve_one_way():
    assert registry.resolve("q4k_nb").name == "q4k_nb_kdr8"                  # a family: its default variant
    assert registry.resolve("q4k_nb_kdr8").p == {"KDR": 8}
    assert registry.variant("q4k_nb").name == "q4k_nb_kdr4"                  # round 6's recorded label
    assert registry.canonical("q4k_nb") == "q4k_nb_kdr4"
    for old, new in registry.LEGACY_NAMES.items():                          # round 3's recorded names
        assert registry.variant(old) is registry.VARIANTS[new] and registry.canonical(old) == new
    assert registry.canonical("cublas_f16_cached") == "cublas_f16_cached"
    with pytest.raises(KeyError, match="neither a kernel variant"):
        registry.resolve("q6k_expb_epi2")
    with pytest.raises(KeyError, match="unknown kernel variant"):
        registry.variant("q6k_expb")


def test_tile_constants_are_written_once():
    assert registry.cuda_defines() == (f"-DLK_BM={registry.BM}", f"-DLK_BN={registry.BN}",
                                       f"-DLK_THREADS={registry.THREADS}", f"-DLK_SK_MAXSEG={registry.SK_MAXSEG}",
                                       f"-DLK_QKNORM_MAXHD={registry.QKNORM_MAXHD}")
    for src in registry.KERNELS_DIR.glob("*.cu*"):
        assert not re.search(r"#define\s+LK_(BM|BN|THREADS|SK_MAXSEG|QKNORM_MAXHD)\b", src.read_text()), src.name
    assert "#error" in (registry.KERNELS_DIR / "prefill.cu").read_text().split("LK_QKNORM_MAXHD", 2)[1]
    from labkernels import wgmma
    assert wgmma.SK_MAXSEG == registry.SK_MAXSEG
    assert "#error" in (registry.KERNELS_DIR / "wgmma_kq.cuh").read_text().split("LK_SK_MAXSEG", 2)[1]
    tile = (registry.KERNELS_DIR / "tile.cuh").read_text()
    assert "#error" in tile and "LK_BM" in tile
    for fam in ("q6k_expb", "q4k_nb", "q6k_generic", "prepass_q8_1"):
        assert all(k.threads == registry.THREADS for k in registry.family(fam))
        assert '#include "tile.cuh"' in registry.family(fam)[0].path.read_text()
