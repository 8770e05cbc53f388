"""The table of rounds: one module per round named like its notebook, its data folders, its plan, its gpu-check
steps; open_round resolves replay / cpu on this machine (no GPU)."""
from pathlib import Path

import pytest

from labkernels import records, rounds
from labkernels.paths import REPO_ROOT


def test_every_round_module_names_its_notebook_and_data():
    nbs = {p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")}
    for i, m in enumerate(rounds.MODULES, start=1):
        mod = rounds.module(i)
        assert mod.NOTEBOOK in nbs and mod.NOTEBOOK.startswith(f"{i:02d}_") and m.startswith(f"r{i:02d}_")
        assert rounds.module(mod.NOTEBOOK) is mod and rounds.module(m) is mod and rounds.module(f"{i:02d}") is mod
        assert mod.measure is None or callable(mod.measure)
        assert isinstance(mod.PLAN, dict) and isinstance(mod.STEPS, dict)
        for folder in mod.DATA:
            assert records.latest(folder) is not None, f"round {m}: no recorded run under data/{folder}"
    with pytest.raises(rounds.RoundError, match="no round 'r99'"):
        rounds.module("r99")


#: every step name `labkernels gpu-check --steps` has accepted (the lead's runbooks name them)
GPU_CHECK_STEPS = ("env", "tests", "sanitizer", "occupancy", "q6k", "tile_ab", "kdr", "q4k", "prefill", "prefill7b",
                   "decompose", "forensics", "wgmma", "wgmma_sanitizer", "wgmma_ncu", "wgmma_costs", "wgmma_trace",
                   "wgmma_splitfin", "wgmma_epi", "wgmma_aq", "wgmma_pf", "wgmma_pair", "wgmma_staged", "wgmma_reduce", "wgmma_lead", "wgmma_conv2", "wgmma_conv16", "wgmma_plane", "wgmma_ceiling", "wgmma_floor", "wgmma_tmapf", "wgmma_clock", "wgmma_kscan", "wgmma_kpair", "wgmma_smem", "wgmma_smemform", "wgmma_decouple", "wgmma_kpairtrace", "wgmma_kpairfin", "wgmma_kpairearly", "wgmma_halfy", "wgmma_wtma", "prefill_r7", "attention", "prefill_graph", "graph_nodes")


def test_gpu_check_takes_the_rounds_steps():
    steps = rounds.gpu_check_steps()
    assert {"occupancy", "q6k", "kdr", "q4k", "prefill", "prefill7b", "decompose", "forensics", "wgmma",
            "wgmma_sanitizer", "wgmma_ncu", "wgmma_costs", "prefill_r7"} <= set(steps)
    assert set(rounds.module(7).STEPS) == {"wgmma", "wgmma_sanitizer", "wgmma_ncu", "wgmma_costs", "wgmma_trace",
                                           "wgmma_splitfin", "wgmma_epi", "wgmma_aq", "wgmma_pf", "wgmma_pair", "wgmma_staged", "wgmma_reduce", "wgmma_lead", "wgmma_conv2", "wgmma_conv16", "wgmma_plane", "wgmma_ceiling", "wgmma_floor", "wgmma_tmapf", "wgmma_clock", "wgmma_kscan", "wgmma_kpair", "wgmma_smem", "wgmma_smemform", "wgmma_decouple", "wgmma_kpairtrace", "wgmma_kpairfin", "wgmma_kpairearly", "wgmma_halfy", "wgmma_wtma", "prefill_r7"}
    from labkernels import gpu_cli

    assert not set(gpu_cli.STEPS) & set(steps)          # each step written once
    assert set(GPU_CHECK_STEPS) == set(gpu_cli.STEPS) | set(steps)


def test_gpu_check_refuses_an_unknown_step_before_running_any(tmp_path):
    from labkernels import cli

    with pytest.raises(SystemExit, match="unknown step 'wgmma_bogus'; steps: .*prefill_r7"):
        cli.main(["gpu-check", "--out", str(tmp_path), "--steps", "env,wgmma_bogus"])
    assert not (tmp_path / "gpu-check.json").exists()        # env did not run either


def test_open_round_replays_the_latest_run_with_its_recorded_plan():
    r3 = rounds.open_round("03", "replay")
    assert r3.mode == "replay" and r3.run.run_id == records.latest("q6k").run_id
    assert r3.plan["shapes"] == r3.run.meta["params"]["shapes"]
    r4 = rounds.open_round("04_kdr_sweep", "replay")
    assert set(r4.runs) == {"kdr_sweep", "q4k"} and r4.runs["q4k"].run_id == records.latest("q4k").run_id
    assert rounds.open_round(1, "auto").mode == "cpu"
    r7 = rounds.open_round("07_wgmma_kquant", "replay")     # the benchmark, not a newer sanitizer / ncu run
    assert r7.run.has("wgmma_bench") and r7.run.run_id == records.latest("wgmma", where=lambda r: r.has("wgmma_bench")).run_id
    assert r7.plan["shapes"] == r7.run.meta["params"]["shapes"]
    r8 = rounds.open_round(8, "replay")
    from labkernels import sweep

    assert r8.run.run_id == sweep.latest_summary().run_id
    with pytest.raises(rounds.RoundError, match="no plan parameter \\['kdr'\\]"):
        rounds.open_round("03", "replay", kdr=4)


def test_open_round_replays_round5_by_its_plan_and_refuses_a_case_not_recorded():
    r5 = rounds.open_round("05_wall_decomposition", "replay", model="synthetic-7b", nt=3325)
    assert r5.run.meta["params"]["model"] == "synthetic-7b" and r5.run.meta["params"]["nt"] == 3325
    assert r5.run.run_id == records.latest("decompose", where=lambda r: rounds.module(5).same_case(r, r5.plan)).run_id
    from labkernels import report

    with pytest.raises(report.ModeError, match="no complete decompose run .* 'nt': 7"):
        rounds.open_round(5, "replay", nt=7)
    with pytest.raises(ValueError, match="round 5 decomposes .*not 'llama'"):
        rounds.module(5).gpu_model("llama")


def test_cpu_rounds_refuse_measure_or_replay():
    with pytest.raises(rounds.RoundError, match="runs on the CPU"):
        rounds.open_round(2, "replay")
    assert rounds.open_round(2, "cpu").run is None


def test_round_plans_agree_with_their_notebooks_parameters():
    """The plan a round measures by default is the one its page declares: no second, drifting copy."""
    from labkernels import pipeline
    from labkernels.paths import NOTEBOOKS_DIR

    checked = 0
    for mod in rounds.rounds():
        declared = pipeline.declared_parameters(NOTEBOOKS_DIR / f"{mod.NOTEBOOK}.ipynb")
        for k, v in mod.PLAN.items():
            if k in declared:
                assert declared[k]["default"] == v, (mod.NOTEBOOK, k)
                checked += 1
    assert checked >= 15


def test_rounds_3_and_4_measure_through_the_table_on_the_cpu_shim(monkeypatch, tmp_path):
    """gpu-check's q6k, kdr and q4k steps (the rounds' measure with their plan) end to end with the kernels' exact
    functions standing in for the GPU and the timings faked: every case parity-gated, the runs recorded under
    the rounds' folders, named by their series."""
    import argparse

    import numpy as np
    from cpu_gpu_shim import install

    from labkernels import bench

    install(monkeypatch)                     # the GEMMs: the exact integer reference, what the gates check
    from labkernels import gpu

    monkeypatch.setattr(gpu, "matmul_f16", lambda a, b, out=None: a.astype(np.float32) @ b.astype(np.float32).T)
    monkeypatch.setattr(bench, "time_launches", lambda fn, warmup=3, repeats=20, flush=None: (fn(), np.ones(3))[1])
    monkeypatch.setattr(bench, "Flusher", lambda: None)
    monkeypatch.setattr(bench, "mma_ceiling", lambda k: {"mma_k": k, "tops": 1.0})
    monkeypatch.setattr(bench, "kernel_row", lambda fam, **p: {"kernel": f"{fam}{sorted(p.items())}", "regs": 1,
                                                               "local_bytes": 0, "api_blocks_per_sm": 1})
    r3, r4 = rounds.module(3), rounds.module(4)
    monkeypatch.setitem(r3.PLAN, "shapes", [[256, 512]])
    monkeypatch.setitem(r3.PLAN, "nts", [30])
    monkeypatch.setitem(r3.PLAN, "variants", ["q6k_expb_epi0", "q6k_expb_epi1"])   # the shim has no q8_1 rows kernel
    monkeypatch.setitem(r4.PLAN, "shapes", {"q6_K": [[256, 512]], "q4_K": [[256, 512]]})
    monkeypatch.setitem(r4.PLAN, "nts", [30])
    monkeypatch.setitem(r4.PLAN, "q4k_nts", [30])
    monkeypatch.setattr(r4, "SWEEP_KDR", {"q6_K": (4,), "q4_K": (8,)})
    args = argparse.Namespace(log=lambda s: None, repeats=2, sweep_repeats=2)
    steps = rounds.gpu_check_steps()
    got = {s: steps[s](tmp_path, args) for s in ("q6k", "kdr", "q4k")}
    root = tmp_path / "data"
    assert sorted(p.name for p in root.iterdir()) == ["03_q6k_expanded_b", "04_kdr_sweep"]
    q6 = records.load("q6k", got["q6k"]["run"], root)
    assert q6.meta["round"] == "q6k" and q6.table("parity").ok.all()
    assert set(q6.table("q6k_bench").variant) >= {"q6k_expb_epi0", "q6k_expb_epi1", "cublas_f16_cached"}
    assert len(records.load("kdr_sweep", got["kdr"]["run"], root).table("sweep")) == 4 + 1   # 4 q6_K variants, q4_K
    q4 = records.load("q4k", got["q4k"]["run"], root)
    assert q4.table("parity").ok.all() and set(q4.table("q4k_bench").variant) >= {"q4k_nb_kdr4"}
    assert records.check_data(root) == (3, [])


def test_round5_says_what_changed_and_how_busy_compares_with_the_wall():
    import pandas as pd

    from labkernels import records
    from labkernels.rounds import r05_wall

    a = records.load("decompose", "20261201T104817Z-h200-b0b81131f1")
    b = records.load("decompose", "20261201T113022Z-h200-10c958662b")
    assert r05_wall.what_changed(a, b) == "attention baseline -> cudnn, eager -> graph replay"
    assert r05_wall.what_changed(b, b) == ""
    bw = lambda busy, wall, valid=True: pd.Series({"busy_ms": busy, "wall_ms": wall, "gap_frac": (wall - busy) / wall,
                                                   "valid": valid})
    t = r05_wall.busy_wall_text(bw(101.50, 101.49))
    assert "within 0.1%" in t and "-0.0" not in t
    assert "2.3% idle" in r05_wall.busy_wall_text(bw(97.7, 100.0))
    assert "do not stand" in r05_wall.busy_wall_text(bw(80.0, 100.0, valid=False))
    assert "above the" in r05_wall.busy_wall_text(bw(103.0, 100.0))
