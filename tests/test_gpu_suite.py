"""The GPU suite's own rules, checked on the CPU: every test that reads the real model carries the ``model`` mark
(so ``-m "not model"`` runs without it and the tier is honest), and the fast tier covers every production kernel
family."""
import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
#: calls that read the real model's file or its tensor cache
MODEL_READS = {"load_kquant", "default_model_path", "export_kquant", "open_model"}


def _marks(dec_list) -> set:
    out = set()
    for d in dec_list:
        node = d.func if isinstance(d, ast.Call) else d
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            out.add(node.attr)
    return out


def _module_marks(tree) -> set:
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            vals = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            out |= _marks(vals)
    return out


def _model_reads_without_mark(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    mod = _module_marks(tree)
    bad = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
        args = {a.arg for a in fn.args.args}
        if args & {"model", "model_path"}:
            continue            # marked by conftest's collection hook
        calls = {c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None)
                 for c in ast.walk(fn) if isinstance(c, ast.Call)}
        reads = calls & MODEL_READS
        for name in ("open_model", "load_kquant"):   # given a path the test made, not the real model's
            calls_ = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and getattr(c.func, "attr",
                      getattr(c.func, "id", None)) == name]
            if name in reads and all(c.args for c in calls_):
                reads.discard(name)
        if reads and "model" not in (_marks(fn.decorator_list) | mod):
            bad.append(f"{path.name}::{fn.name} ({', '.join(sorted(reads))})")
    return bad


def test_every_test_reading_the_real_model_is_marked():
    bad = [b for p in sorted(TESTS.rglob("test_*.py")) for b in _model_reads_without_mark(p)]
    assert not bad, "tests that read the real model without the model mark: " + "; ".join(bad)


def test_the_checker_finds_an_unmarked_read(tmp_path):
    p = tmp_path / "test_x.py"
    p.write_text("from labkernels import model\n\ndef test_a():\n    model.load_kquant()\n\n"
                 "import pytest\n@pytest.mark.model\ndef test_b():\n    model.load_kquant()\n")
    assert _model_reads_without_mark(p) == ["test_x.py::test_a (load_kquant)"]


def test_fast_tier_covers_every_production_family():
    """``-m gpu_fast`` (gpu-check's fast tier) holds at least one test of every GPU test file, so each family the
    product runs (int8 GEMMs, wgmma, gemv, attention, the prefill and its graph) is exercised in every session."""
    missing = []
    for p in sorted((TESTS / "gpu").glob("test_*.py")):
        tree = ast.parse(p.read_text())
        marked = [fn.name for fn in tree.body if isinstance(fn, ast.FunctionDef)
                  and "gpu_fast" in _marks(fn.decorator_list)] + (["*"] if "gpu_fast" in _module_marks(tree) else [])
        if not marked:
            missing.append(p.name)
    assert not missing, f"GPU test files with no gpu_fast test: {missing}"


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1"
skipped="1" tests="4" time="3.2"><testcase classname="tests.gpu.test_a" name="test_ok" time="1.5" />
<testcase classname="tests.gpu.test_a" name="test_bad[x]" time="0.5"><failure message="AssertionError: nope
second line">trace</failure></testcase><testcase classname="tests.gpu.test_b" name="test_skip" time="0.0">
<skipped message="needs cudnn" /></testcase><testcase classname="tests.gpu.test_b" name="test_err" time="0.1">
<error message="fixture broke">x</error></testcase></testsuite></testsuites>"""


def test_junit_rows_and_the_summary_say_what_ran():
    from labkernels import gpu_checks

    rows = gpu_checks.junit_rows(JUNIT)
    assert [(r["nodeid"], r["outcome"]) for r in rows] == [
        ("tests/gpu/test_a.py::test_ok", "passed"), ("tests/gpu/test_a.py::test_bad[x]", "failed"),
        ("tests/gpu/test_b.py::test_skip", "skipped"), ("tests/gpu/test_b.py::test_err", "error")]
    assert rows[1]["message"].startswith("AssertionError: nope") and rows[0]["seconds"] == 1.5
    s = gpu_checks.suite_summary(rows, 3.2, "fast", 1)
    assert (s["passed"], s["failed"], s["error"], s["skipped"], s["ok"]) == (1, 1, 1, 1, False)


def test_a_tier_that_only_skipped_is_not_ok():
    from labkernels import gpu_checks

    rows = [{"nodeid": "t", "outcome": "skipped", "seconds": 0.0, "message": "needs a CUDA GPU"}] * 3
    assert gpu_checks.suite_summary(rows, 1.0, "fast", 0)["ok"] is False
    assert gpu_checks.suite_summary([{**rows[0], "outcome": "passed"}], 1.0, "full", 0)["ok"] is True


def test_an_interrupted_child_gets_its_grace_and_its_output_is_kept(tmp_path):
    """run_interruptible: a Ctrl-C in gpu-check while the suite runs gives pytest its own interrupt handling (the
    child here traps SIGINT, writes what it finished and exits) instead of killing it at once."""
    import os
    import signal
    import sys
    import threading

    from labkernels import gpu_checks

    child = tmp_path / "child.py"
    child.write_text("import signal, sys, time\n"
                     "def stop(*a):\n    print('finished 3 of 9', flush=True); sys.exit(2)\n"
                     "signal.signal(signal.SIGINT, stop)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    t = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    t.start()
    try:
        text, rc, interrupted = gpu_checks.run_interruptible([sys.executable, str(child)], cwd=tmp_path, grace=20)
    finally:
        t.cancel()
    assert interrupted and rc == 2 and "ready" in text and "finished 3 of 9" in text
    text, rc, interrupted = gpu_checks.run_interruptible([sys.executable, "-c", "print('x')"], cwd=tmp_path)
    assert (text.strip(), rc, interrupted) == ("x", 0, False)


def test_an_interrupted_tier_is_recorded_as_partial_and_never_green(tmp_path, monkeypatch):
    """The tests that finished before a timeout's SIGINT are recorded (status failed, interrupted, their rows); the
    interrupt then goes on (gpu-check stops), where before nothing of the tier was kept."""
    import types

    from labkernels import gpu_checks, records

    def fake(cmd, cwd):
        xml = next(a.split("=", 1)[1] for a in cmd if a.startswith("--junitxml="))
        Path(xml).write_text(JUNIT)
        return "interrupted\n", 2, True

    monkeypatch.setattr(gpu_checks, "run_interruptible", fake)
    args = types.SimpleNamespace(tier="full", shard=None, model_tests=False, fail_fast=False, workers=0)
    with pytest.raises(KeyboardInterrupt):
        gpu_checks.step_tests(tmp_path, args)
    (run,) = records.list_runs("gpu_suite", root=tmp_path / "data", status=None)
    assert run.meta["status"] == "failed" and run.meta["summary"]["interrupted"] is True
    assert run.meta["summary"]["ok"] is False and len(run.table("tests")) == 4
    assert "4 tests finished" in run.meta["summary"]["note"]
