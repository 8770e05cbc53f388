"""The independent timer on the device (issue 49 item 4): nvbench (cuda-bench) and the lab's harness time the same
launches of a headline (round 7's q4_K GEMM at nt=512 vs cuBLAS fp16); the comparison is recorded and read back. The
2% agreement itself is the step's verdict (``gpu check --steps nvbench_check``), recorded on the page -- here the two
timers must measure the same thing: both ratios finite and within 10%."""
import math

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_fast]


def test_nvbench_and_the_harness_time_the_same_launches(tmp_path):
    from labkernels import nvbench_check as NB
    from labkernels import records

    NB.import_cuda_bench()           # missing: pip install cuda-bench (the gpu extra)
    res = NB.run_check(tmp_path, names=["gemm_q4k_nt512"], pairs=3, repeats=10)
    t = res["table"]
    print(t.to_string())
    r = t.iloc[0]
    for c in ("harness_lab_us", "harness_cublas_us", "nvbench_lab_us", "nvbench_cublas_us"):
        assert math.isfinite(r[c]) and r[c] > 0, (c, r[c])
    assert abs(r.ratio_diff) < 0.10, r.note
    run = records.load(NB.SERIES, res["run"], tmp_path / "data")
    assert run.table("comparison").case.tolist() == ["gemm_q4k_nt512"] and run.table("nvbench").shape[0] == 2
