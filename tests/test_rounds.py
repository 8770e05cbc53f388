"""The table of rounds: one module per round named like its notebook, its data folders, its plan, its gpu-check
steps; open_round resolves replay / cpu on this machine (no GPU)."""
import re
from pathlib import Path

import pytest

from labkernels import records, records_admin, rounds
from labkernels.paths import REPO_ROOT
from labkernels.rounds.r07_wgmma import builds as wb


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


#: every step name `labkernels gpu check --steps` has accepted (the lead's runbooks name them)
GPU_CHECK_STEPS = ("env", "tests", "sanitizer", "occupancy", "q6k", "tile_ab", "kdr", "q4k", "prefill", "prefill7b",
                   "decompose", "forensics", "wgmma", "wgmma_sanitizer", "wgmma_ncu", "wgmma_costs", "wgmma_trace",
                   "wgmma_splitfin", "wgmma_epi", "wgmma_aq", "wgmma_pf", "wgmma_pair", "wgmma_staged", "wgmma_reduce", "wgmma_lead", "wgmma_conv2", "wgmma_conv16", "wgmma_plane", "wgmma_ceiling", "wgmma_floor", "wgmma_tmapf", "wgmma_clock", "wgmma_kscan", "wgmma_kpair", "wgmma_smem", "wgmma_smemform", "wgmma_decouple", "wgmma_kpairtrace", "wgmma_kpairfin", "wgmma_kpairearly", "wgmma_halfy", "wgmma_wtma", "wgmma_wstage", "wgmma_swapred", "prefill_r7", "attention", "prefill_graph",
                   "graph_nodes", "decode", "generate", "generate_context", "decode_decomp", "gemv_step2", "gemv_step3", "gemv_step4", "gemv_step5", "gemv_step6", "gemv_step7", "gemv_step8", "gemv_step9", "decode_step10", "gemv_sanitizer",
                   "nvbench_check")
#: round 7's steps retired with the kernel's split (issue 42), and the two before it (commits 82d821d, c301da5)
RETIRED = ("wgmma_splitfin", "wgmma_conv16", "wgmma_wtma", "wgmma_tmapf", "wgmma_kpairearly", "wgmma_wstage",
           "wgmma_swapred")
#: round 9's steps retired with gemv_kq's PIPE ring (commit a1cf954 holds it), its FORM=2 (commit 90fd260), its FORM=4 /
#: 5 and its PF=1 build (commit 7894b07)
RETIRED_R9 = ("gemv_step3", "gemv_step5", "gemv_step7", "gemv_step8")


def test_gpu_check_takes_the_rounds_steps():
    steps = rounds.gpu_check_steps()
    assert {"occupancy", "q6k", "kdr", "q4k", "prefill", "prefill7b", "decompose", "forensics", "wgmma",
            "wgmma_sanitizer", "wgmma_ncu", "wgmma_costs", "prefill_r7"} <= set(steps)
    assert set(rounds.module(7).STEPS) == {s for s in GPU_CHECK_STEPS if s.startswith("wgmma") or s == "prefill_r7"
                                           } - set(RETIRED)
    from labkernels import gpu_checks

    assert not set(gpu_checks.STEPS) & set(steps)          # each step written once
    # every name gpu-check took still means something: a live step, or a retired one that says where it runs
    assert set(GPU_CHECK_STEPS) == set(gpu_checks.STEPS) | set(steps) | set(RETIRED) | set(RETIRED_R9)
    assert not (set(RETIRED) | set(RETIRED_R9)) & set(steps)
    for name in RETIRED + RETIRED_R9:
        mod, s = rounds.retired_step(name)
        assert mod is rounds.module(7 if name in RETIRED else 9) and s.run is None and len(s.retired.commit) >= 7
        assert f"--steps {name}" in s.retired.command and s.retired.commit in rounds.retired_message(name)


def test_gpu_check_refuses_an_unknown_step_before_running_any(tmp_path, capsys):
    from labkernels import cli

    assert cli.main(["gpu-check", "--out", str(tmp_path), "--steps", "env,wgmma_bogus"]) == 2
    assert re.search("gpu-check: error: GpuCheckError: unknown step 'wgmma_bogus'; steps: .*prefill_r7",
                     capsys.readouterr().err)
    assert not (tmp_path / "gpu-check.json").exists()        # env did not run either
def test_gpu_check_refuses_a_retired_step_with_the_commit_that_runs_it(tmp_path, capsys):
    from labkernels import cli

    for argv, rx in ((["--steps", "env,wgmma_wtma"], r"step 13 \(wtma\) is retired .* commit 4a8dcd9: git worktree add"),
                     (["--round", "7", "--step", "28,wstage"], r"commit 82d821d: .*--steps wgmma_wstage"),
                     (["--round", "7", "--step", "99"], "no step 99; steps 1-28"),
                     (["--step", "28"], "--round and --step together")):
        assert cli.main(["gpu-check", "--out", str(tmp_path), *argv]) == 2
        assert re.search(rx, capsys.readouterr().err), argv
    assert not (tmp_path / "gpu-check.json").exists()


def test_gpu_check_runs_a_round_step_by_number_name_or_old_name(tmp_path, monkeypatch):
    """``--round 7 --step 28`` is the twenty-eighth step's run (its old name an alias); a number shared by two records
    runs both; each ran once, in the order asked, into the results file."""
    import dataclasses
    import json

    from labkernels import cli

    r7, calls = rounds.module(7), []
    fake = [dataclasses.replace(s, run=lambda out, args, n=s.name: calls.append(n) or {"ok": True})
            if s.run is not None else s for s in r7.STEP_RECORDS]
    monkeypatch.setattr(r7, "STEP_RECORDS", tuple(fake))
    assert cli.main(["gpu-check", "--out", str(tmp_path), "--round", "7", "--step", "28,5,wgmma_epi"]) == 0
    assert calls == ["halfy", "aq", "pf", "epi"]
    assert list(json.loads((tmp_path / "gpu-check.json").read_text())) == ["halfy", "aq", "pf", "epi"]
    assert [s.name for s in rounds.select_steps(7, ["wgmma_halfy", "halfy", "28"])] == ["halfy"] * 3


def test_round_steps_declare_their_own_arguments():
    from labkernels import cli

    flags = {f for _, _, fl, _ in rounds.step_args() for f in fl}
    assert {"--ab", "--sanitizer-timeout", "--gemma"} <= flags
    a = cli.build_parser().parse_args(["gpu-check", "--round", "7", "--step", "prefill", "--ab", "int8"])
    assert (a.round, a.step, a.ab) == ("7", "prefill", "int8")


def _named_steps(text: str) -> set:
    """(round or None, step) of every ``gpu-check --steps A,B`` and ``gpu-check --round N --step A,B`` in ``text``
    (``labkernels gpu check`` too, the noun-verb name of the same command)."""
    import re

    out = set()   # (placeholders such as N or NAME are upper case: not names)
    for m in re.finditer(r"gpu[- ]check(?:\s+--\w[\w-]*(?:\s+(?!--)[^\s`)]+)?)*?\s+\[?--steps\s+([a-z0-9_][a-z0-9_,]*)",
                         text):
        out |= {(None, s) for s in m.group(1).split(",") if s}
    for m in re.finditer(r"gpu[- ]check\s+--round\s+(\d+)\s+--step\s+([a-z0-9_][a-z0-9_,]*)", text):
        out |= {(m.group(1), s) for s in m.group(2).split(",") if s}
    return out


def _doc_files() -> list:
    return (sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")) + [REPO_ROOT / "README.md"]
            + sorted((REPO_ROOT / "docs").glob("*.md")))


def test_every_step_a_notebook_or_the_readme_names_exists():
    """A page, the README or a docs/ page that tells the reader to run a step names one that exists: a live step, or a
    retired one (gpu-check then says the commit and command that run it)."""
    from labkernels import gpu_checks

    live = set(gpu_checks.STEPS) | set(rounds.gpu_check_steps())
    named = {}
    for f in _doc_files():
        for key in _named_steps(f.read_text()):
            named.setdefault(key, f.name)
    assert len(named) > 30 and (None, "wgmma_halfy") in named and (None, "wgmma_wstage") in named
    assert {(None, "occupancy"), (None, "forensics"), (None, "attention"), (None, "prefill_graph"),
            (None, "graph_nodes"), (None, "tests"), (None, "kdr")} <= set(named)   # rounds 2-6 and `gpu check` lines
    missing = []
    for (rnd, s), f in sorted(named.items(), key=str):
        if rnd is None:
            ok = s in live or rounds.retired_step(s) is not None
        else:
            try:
                rounds.select_steps(rnd, [s])
                ok = True
            except rounds.RoundError as e:
                ok = "is retired" in e.args[0]
        if not ok:
            missing.append(f"{f}: {s}")
    assert not missing, missing
    assert _named_steps("run `gpu-check --round 7 --step 28,bogus` and gpu-check --out X --steps a,b, "
                        "gpu-check --out DIR [--steps c] or gpu-check --steps NAME, labkernels gpu check --steps d") == {
        ("7", "28"), ("7", "bogus"), (None, "a"), (None, "b"), (None, "c"), (None, "d")}


def test_the_step_arguments_a_page_or_doc_gives_are_read_by_its_steps():
    """A command line in a page, the README or docs/ that gives a step argument beside ``--steps A,B`` names a step
    that reads it (gpu-check would refuse it otherwise)."""
    import re

    from labkernels import gpu_cli

    readers = gpu_cli.flag_readers()
    checked, wrong = 0, []
    for f in _doc_files():
        for line in f.read_text().splitlines():
            m = re.search(r"gpu[- ]check\b.*?--steps\s+([a-z0-9_][a-z0-9_,]*)", line)
            if not m:
                continue
            steps = set(m.group(1).split(","))
            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", line[m.end():]):
                if flag in readers:
                    checked += 1
                    if not any(r.split(" ")[0] in steps for r in readers[flag]):
                        wrong.append(f"{f.name}: {flag} with --steps {m.group(1)}")
    assert not wrong, wrong
    assert checked >= 3


def test_round7_step_records_name_their_runs_builds_and_views():
    """Every record: a unique name and old names, each listed run recorded (its params naming the step's ``what``) and
    the last listed run's commit the record's; every build's -D names buildable (a live step) or retired with the
    commit that holds them (a retired step); the view of its latest run a non-empty table."""
    from labkernels import records

    recs = rounds.module(7).STEP_RECORDS
    listed = {k: records.list_runs(k, status=None) for k in ("wgmma", "prefill")}
    names = [s.name for s in recs] + [a for s in recs for a in s.aliases]
    assert len(names) == len(set(names))
    assert sorted({s.number for s in recs if s.number is not None}) == list(range(1, 29))
    for s in recs:
        runs = s.recorded(listed=listed[s.series])
        assert runs, s.label
        whats = {(r.meta.get("params") or {}).get("what") for r in runs}
        assert s.what in whats, (s.label, whats)
        assert any(str((r.provenance or {}).get("git_commit", "")).startswith(s.commit) for r in runs), s.label
        gone = {n for d in s.builds.values() for n in d if n in wb.RETIRED_BUILDS}
        for label, d in s.builds.items():
            if not set(d) & gone:
                assert wb.check_defines(d) == tuple(sorted(d)), (s.label, label)
        if s.retired is None:
            assert not gone, s.label
        else:
            assert gone and all(wb.RETIRED_BUILDS[n] == s.retired.commit for n in gone), s.label
            assert s.retired.commit in s.retired.command and s.aliases[0] in s.retired.command
        assert s.prediction or s.number is None, s.label
        assert s.verdict or s.number is None or s.name == "bench", s.label
        v = s.view(s.latest(listed=listed[s.series]))
        assert len(v) > 0, s.label
    assert records.latest("wgmma", where=lambda r: r.has("wgmma_bench")).run_id == rounds.module(7).STEP_RECORDS[0].runs[-1]


#: rounds 2-6's steps: (round, number, name = the gpu-check name they always had)
R2_6 = ((2, 1, "occupancy"), (3, 1, "q6k"), (3, 2, "tile_ab"), (4, 1, "kdr"), (4, 2, "q4k"), (5, 1, "prefill"),
        (5, 2, "decompose"), (5, 3, "prefill7b"), (5, 4, "attention"), (5, 5, "prefill_graph"), (5, 6, "graph_nodes"),
        (6, 1, "forensics"))


def test_rounds_2_to_6_list_their_steps_as_records_by_number_and_name():
    """Every gpu-check step of rounds 2-6 is a record with a number and a name, listed by ``--round N --list`` with the
    arguments it reads, selected by number or by its gpu-check name, and the record ``--steps NAME`` runs."""
    got = {(n, s.number, s.name) for n in range(2, 7) for s in rounds.module(n).STEP_RECORDS}
    assert got == set(R2_6)
    records_of = rounds.gpu_check_records()
    for n, num, name in R2_6:
        mod = rounds.module(n)
        assert set(mod.STEPS) == {s.name for s in mod.STEP_RECORDS}        # no step outside the records
        by_num, by_name = rounds.select_steps(n, [str(num)]), rounds.select_steps(n, [name])
        assert by_num == by_name and [s.name for s in by_num] == [name]
        assert records_of[name] == (mod, by_name[0]) and mod.STEPS[name] is by_name[0].run is not None
        listed = rounds.list_steps(n)
        assert f"  {num}. {name}: " in listed, listed
        assert f"arguments: {', '.join(by_name[0].flags) or 'none'}; records {by_name[0].series} runs" in listed
    assert "arguments: --repeats, --old-kernels; records tile_ab runs" in rounds.list_steps(3)
    assert "(no gpu check steps)" in rounds.list_steps(8)
    with pytest.raises(rounds.RoundError, match="no step 7; steps 1-6"):
        rounds.select_steps(5, ["7"])


def test_an_old_step_name_resolves_to_its_record():
    """An old gpu-check name is an alias of its record: ``--steps NAME`` runs the record's ``run``, and ``--round N
    --step NAME`` selects the same record as its number."""
    recs = rounds.gpu_check_records()
    mod, s = recs["wgmma_halfy"]
    assert mod is rounds.module(7) and (s.number, s.name) == (28, "halfy") and "wgmma_halfy" in s.aliases
    assert rounds.select_steps(7, ["wgmma_halfy"]) == rounds.select_steps(7, ["28"]) == [s]
    mod, s = recs["prefill_r7"]
    assert (s.name, s.flags) == ("prefill", ("--ab", "--gemma", "--dense-path", "--cudnn-plan"))
    assert rounds.gpu_check_steps()["wgmma"] is rounds.select_steps(7, ["bench"])[0].run
    assert recs["prefill"][0] is rounds.module(5) and recs["prefill"][1].number == 1   # round 5's, not round 7's


def test_rounds_2_to_6_records_name_their_runs_prediction_and_view():
    """Each record of rounds 2-6: its listed runs are recorded (their params naming the record's ``what``), one of them
    at the record's commit, a prediction (or the words that none was written) and a verdict, and the view of its latest
    run is a non-empty table."""
    for n, num, name in R2_6:
        s = rounds.select_steps(n, [name])[0]
        listed = records.list_runs(s.series, status=None)
        runs = s.recorded(listed=listed)
        assert runs and s.what in {(r.meta.get("params") or {}).get("what") for r in runs}, s.label
        assert any(str((r.provenance or {}).get("git_commit", "")).startswith(s.commit) for r in runs), s.label
        assert s.prediction and s.verdict and s.title, s.label
        assert s.prediction == rounds.NO_PREDICTION or "target" in s.prediction or rounds.NO_PREDICTION in s.prediction
        assert len(s.view(s.latest(listed=listed))) > 0, s.label
    assert "400 TOPS-eq" in rounds.select_steps(3, ["q6k"])[0].prediction       # the target set before round 3 ran
    assert rounds.select_steps(2, ["1"])[0].prediction == rounds.NO_PREDICTION


def test_gpu_check_refuses_a_step_argument_no_chosen_step_reads(tmp_path, capsys, monkeypatch):
    """A step flag given without a chosen step that reads it is refused before any step runs, naming the flag and the
    steps that take it; given with one that reads it, it passes (the run stubbed)."""
    import dataclasses

    from labkernels import cli, gpu_cli

    gemma = tmp_path / "g.gguf"
    gemma.write_bytes(b"GGUF")
    for argv, rx in ((["--steps", "env", "--gemma", str(gemma)],
                      r"--gemma: no chosen step reads it \(chosen: env\); the steps that take it: .*prefill_graph "
                      r"\(round 5, step 5\).*prefill_r7 \(round 7, --step prefill\)"),
                     (["--steps", "env,tests", "--repeats", "5", "--tier", "full"],
                      r"--repeats: no chosen step reads it .*q6k \(round 3, step 1\); tile_ab"),
                     (["--steps", "env", "--fail-fast"], r"--fail-fast: .*the steps that take it: tests$"),
                     (["--round", "3", "--step", "1", "--old-kernels", str(tmp_path), "--sweep-repeats", "2"],
                      r"--old-kernels: no chosen step reads it \(chosen: q6k\); .*tile_ab .*also refused: --sweep-repeats"),
                     (["--round", "5", "--step", "prefill7b", "--attention", "torch"], r"--attention: .*decompose")):
        assert cli.main(["gpu", "check", "--out", str(tmp_path / "o"), *argv]) == 2, argv
        assert re.search(rx, capsys.readouterr().err.strip()), argv
    assert not (tmp_path / "o").exists()                      # nothing ran, no results folder
    r3, calls = rounds.module(3), []
    fake = tuple(dataclasses.replace(s, run=lambda out, args, n=s.name: calls.append((n, args.old_kernels, args.repeats))
                                     or {"ok": True}) for s in r3.STEP_RECORDS)
    monkeypatch.setattr(r3, "STEP_RECORDS", fake)
    assert cli.main(["gpu-check", "--out", str(tmp_path / "o"), "--round", "3", "--step", "2",
                     "--old-kernels", str(tmp_path), "--repeats", "3"]) == 0
    assert calls == [("tile_ab", str(tmp_path), 3)]
    a = cli.build_parser().parse_args(["gpu-check", "--steps", "tests", "--tier", "full", "--model-tests"])
    assert getattr(a, gpu_cli.GIVEN) == {"--tier", "--model-tests"} and a.model_tests is True and a.fail_fast is False
    gpu_cli.check_step_flags(a, gpu_cli._chosen_steps(a))                           # tests reads both


def test_every_step_argument_is_declared_by_a_step_and_in_the_help():
    """Every gpu-check flag but the choice of steps and the results folder is a step argument some live step declares;
    every argument a step declares is one gpu-check has, and the help lists each with its default."""
    import argparse

    from labkernels import cli, gpu_checks, gpu_cli

    p = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["gpu-check"]
    own = {"-h", "--out", "--steps", "--round", "--step", "--list"}
    flags = {a.option_strings[0]: a for a in p._actions if a.option_strings and a.option_strings[0] not in own}
    readers = gpu_cli.flag_readers()
    assert set(flags) == set(readers), (set(flags) ^ set(readers))
    assert set(gpu_checks.STEP_ARGS) == set(gpu_checks.STEPS)          # each machine-wide step says what it reads
    assert all(isinstance(a, gpu_cli._StepFlag) for a in flags.values())
    assert set(gpu_checks.FLAGS) <= set(flags) and {"--old-kernels", "--sweep-repeats", "--ab", "--kernel"} <= set(flags)
    text = " ".join(p.format_help().split())
    for f, a in flags.items():
        assert f in text
        if a.default not in (None, False):
            assert f"(default: {a.default})" in text or "default" in a.help.lower(), f
    for f, d in (("--repeats", 20), ("--sweep-repeats", 10), ("--decompose-nt", 3325), ("--sanitizer-timeout", 240),
                 ("--kernel", "auto"), ("--tier", "fast"), ("--attention-nts", "512,3325,8192")):
        assert flags[f].default == d, f                        # the names and defaults scripts pass


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
    from labkernels.rounds.r08_sweeps import readback

    assert r8.run.run_id == readback.latest_summary().run_id
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
    from labkernels import blas

    monkeypatch.setattr(blas, "matmul_f16", lambda a, b, out=None: a.astype(np.float32) @ b.astype(np.float32).T)
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
    assert records_admin.check_data(root) == (3, [])


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
