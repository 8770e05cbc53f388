"""The old-vs-new kernel A/B of the tile skeleton (labkernels.rounds.r03_q6k.tile_ab, a gpu-check step): the old sources are read
from git, the verdict per point is the median ratio against the measured noise band."""
import pytest

from labkernels.rounds.r03_q6k import tile_ab


def test_old_kernels_come_from_the_reference_commit(tmp_path):
    try:
        d = tile_ab.old_kernels(tmp_path)
    except RuntimeError as e:          # a clean copy without .git: the step then needs --old-kernels
        pytest.skip(str(e))
    assert (d / "q6k_expb.cu").exists() and "#define LK_BM 64" in (d / "common.cuh").read_text()
    assert not (d / "tile.cuh").exists()                   # before the skeleton
    assert tile_ab.old_kernels(tmp_path, src=d) == d
    with pytest.raises(FileNotFoundError, match="not a kernels folder"):
        tile_ab.old_kernels(tmp_path, src=tmp_path)


def test_a_point_moves_only_beyond_the_noise_band():
    key = {"kernel": "q6k_expb_epi0", "od": 1, "id": 256, "nt": 1}
    res = {"old": [{"median_us": 100.0}] * 3, "new": [{"median_us": 100.4}] * 3,
           "old_again": [{"median_us": 100.2}, {"median_us": 99.9}, {"median_us": 100.0}]}
    s = tile_ab._summary(tile_ab._rounds_rows(res, key), key)
    assert s["median_ratio"] == pytest.approx(1.004) and s["noise"] == pytest.approx(0.005) and not s["moved"]
    res["new"] = [{"median_us": 103.0}] * 3
    assert tile_ab._summary(tile_ab._rounds_rows(res, key), key)["moved"]
