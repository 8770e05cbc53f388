"""Round 1: closed-form element maps, exhaustive checks, the wrong model, and the CLI."""
import json
import subprocess
import sys

import numpy as np
import pytest

from labkernels import layout
from labkernels.rounds import r01_layout


@pytest.mark.parametrize("stride", [210, 224])
def test_q6k_map_exhaustive_random(stride, rng):
    b = r01_layout.random_q6k_blocks(4000, rng, stride)
    r = r01_layout.verify_q6k_blocks(b, stride)
    assert r["elements"] == 4000 * 256 and r["mismatches"] == 0
    assert r["wrong_model_mismatches"] > 0 and r["wrong_model_rel_rmse"] > 0.1


def test_seeds_scalar_expand_matches_vector_map(rng):
    b = r01_layout.random_q6k_blocks(16, rng, 224)
    vec = layout.q6k_codes(b).astype(int) - 32
    for i in range(16):
        assert [layout.expand_q6_elem(b[i], e) for e in range(256)] == vec[i].tolist()


def test_seeds_element_70_walkthrough():
    # element 70: m=6, it=0, n=70 -> ql byte 6, high nibble; qh byte 128+6, shift 4; scale 4
    assert layout.Q6K_QL_BYTE[70] == 6 and layout.Q6K_QL_SHIFT[70] == 4
    assert layout.Q6K_QH_BYTE[70] == 134 and layout.Q6K_QH_SHIFT[70] == 4
    assert layout.Q6K_SCALE_OF_ELEM[70] == 4


def test_maps_cover_each_bit_once():
    # every (ql byte, nibble) pair is used by exactly one element, every (qh byte, 2-bit field) likewise
    ql = set(zip(layout.Q6K_QL_BYTE, layout.Q6K_QL_SHIFT))
    qh = set(zip(layout.Q6K_QH_BYTE, layout.Q6K_QH_SHIFT))
    assert len(ql) == 256 and len(qh) == 256
    assert len(set(zip(layout.Q4K_QS_BYTE, layout.Q4K_QS_SHIFT))) == 256


def test_q4k_map_exhaustive_random(rng):
    r = r01_layout.verify_q4k_blocks(r01_layout.random_q4k_blocks(4000, rng))
    assert r["mismatches"] == 0 and r["naive_scale_unpack_mismatches"] > 0


def test_every_block_of_the_real_model(model_path):
    rows, extras = r01_layout.verify_model(model_path)
    totals = r01_layout.summarize(rows)
    assert set(totals) == {"q4_K", "q6_K/210", "q6_K/224"}
    assert all(v["mismatches"] == 0 for v in totals.values())
    assert totals["q6_K/210"]["tensors"] == 9 and totals["q4_K"]["tensors"] == 27
    assert extras["q6k_wrong_model_err"].size > 0


def test_layout_cli_json(model_path):
    out = subprocess.run([sys.executable, "-m", "labkernels", "layout", "--json", "--model", str(model_path)],
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["totals"]["q6_K/210"]["mismatches"] == 0
    assert data["totals"]["q4_K"]["elements"] == data["totals"]["q4_K"]["blocks"] * 256
