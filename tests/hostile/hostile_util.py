"""Helpers of the hostile-input suite (tests/hostile/): a small real GGUF, finished runs, subprocess runs with a
deadline. Every test of the suite asserts that a hostile input gets the lab's own error naming what was wrong --
never a traceback, a hang, a silent acceptance or a lost record."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tiny_gguf(path: Path) -> Path:
    """A 2-layer llama-shaped GGUF with the lab's Q4_K_M recipe (q4_K, q6_K, q8_0 / f32 tensors), written by
    gguf-py: small enough to copy and poke for every example."""
    from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config, write_gguf

    cfg = tiny_config("llama", n_layer=2)
    return write_gguf(SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=3), path)


def finished_run(root: Path, series: str = "prefill", rows: int = 3, tables=("t",)):
    from labkernels import records

    run = records.new_run(series, {"x": 1}, root=root)
    for t in tables:
        for i in range(rows):
            run.append(t, {"i": i, "v": 0.5 + i})
    run.finish()
    return run


@contextmanager
def deadline(seconds: float, what: str):
    """Fail (instead of hanging the suite) when the block runs longer than ``seconds``."""
    def alarm(signum, frame):
        raise TimeoutError(f"{what} did not return within {seconds} s (a hang)")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                LABKERNELS_ROOT=str(REPO), MPLBACKEND="Agg", **extra)


def labkernels(*args, timeout: float = 120, cwd=None, **extra_env) -> subprocess.CompletedProcess:
    """``python -m labkernels ARGS`` as a user runs it, with a deadline (a hang fails the test)."""
    return subprocess.run([sys.executable, "-m", "labkernels", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=env(**extra_env), stdin=subprocess.DEVNULL)


def assert_clean_error(r: subprocess.CompletedProcess, *fragments: str) -> None:
    """A refusal as the lab writes one: non-zero exit, no Python traceback, no error class that escaped the lab's
    checks, and every fragment in the output."""
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "Traceback" not in out, out
    assert "an unexpected error" not in out, out
    for f in fragments:
        assert f in out, (f, out)
