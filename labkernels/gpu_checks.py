"""The machine-wide steps of ``labkernels gpu check`` and the run of a gpu check's steps.

The steps no round owns: ``env`` (the provenance of the machine), ``tests`` (the GPU test suite at a tier, or one
shard of it, recorded as a ``gpu_suite`` run) and ``sanitizer`` (compute-sanitizer memcheck, racecheck and synccheck
over every main-path kernel); every round's own steps come from the table of rounds
(:func:`labkernels.rounds.gpu_check_records`). :func:`run_steps` runs the chosen steps one after the other (a failing
step is reported and the others still run); the command line is :mod:`labkernels.gpu_cli`.

Every step declares the gpu check arguments it reads: the machine-wide ones here (:data:`STEP_ARGS`), a round's in its
records (:class:`labkernels.rounds.Step` ``args``). :data:`FLAGS` defines the flags several steps share (the
machine-wide steps' own among them); a flag only one round's steps read is defined in that round's records.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from . import attention, blas, provenance, records, sanitizer
from .paths import REPO_ROOT


def log(msg: str) -> None:
    """A gpu check log line: the time, then the message (the steps' ``args.log``)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class GpuCheckError(RuntimeError):
    """Bad arguments to ``labkernels gpu check`` (refused before any step runs)."""


def step_env(out: Path, args) -> dict:
    p = provenance.collect()
    (out / "env.json").write_text(json.dumps(p, indent=1, default=str))
    log(provenance.describe(p))
    return {"ok": p.get("gpu") is not None}


#: the GPU suite's tiers: fast (``-m gpu_fast``: every family and production instantiation once, the prefill and its
#: graph once; under 4 minutes, run in every session that touches GPU code) and full (every GPU test)
TIERS = {"fast": "gpu_fast", "full": "gpu"}


def parse_shard(text) -> tuple[int, int] | None:
    """``--shard I/N`` (1 <= I <= N): the I-th of N parts of the GPU suite, so that the whole suite can run over
    several device calls; None for the whole tier. Anything else raises GpuCheckError."""
    if text in (None, ""):
        return None
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise GpuCheckError(f"--shard {text!r}: give I/N, e.g. 2/3") from None
    if not 1 <= i <= n:
        raise GpuCheckError(f"--shard {text!r}: I must be in 1..N")
    return i, n


def shard_files(files, shard: tuple[int, int] | None) -> list[str]:
    """The test files of shard (I, N): the files sorted by name and dealt by size, largest first, each to the part
    holding the fewest bytes so far (ties: the lowest part), so the N parts are disjoint, cover every file and take
    about the same time; the same files at one commit always give the same parts."""
    files = sorted(str(f) for f in files)
    if shard is None:
        return files
    i, n = shard
    loads, parts = [0] * n, [[] for _ in range(n)]
    for f in sorted(files, key=lambda f: (-Path(REPO_ROOT / f).stat().st_size, f)):
        k = min(range(n), key=lambda j: (loads[j], j))
        parts[k].append(f)
        loads[k] += Path(REPO_ROOT / f).stat().st_size
    return sorted(parts[i - 1])


def junit_rows(xml_text: str) -> list[dict]:
    """One row per test case of a pytest junit XML: nodeid, outcome (passed / failed / error / skipped), seconds,
    message (the first line of a failure, error or skip reason)."""
    import xml.etree.ElementTree as ET

    rows = []
    for case in ET.fromstring(xml_text).iter("testcase"):
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                msg = (el.get("message") or el.text or "").strip().splitlines()[0][:300] if (el.get("message") or el.text) else ""
                break
        cls = case.get("classname", "")
        rows.append({"nodeid": f"{cls.replace('.', '/')}.py::{case.get('name')}" if cls else case.get("name"),
                     "outcome": outcome, "seconds": float(case.get("time") or 0.0), "message": msg})
    return rows


def suite_summary(rows: list[dict], seconds: float, tier: str, rc: int) -> dict:
    """Counts by outcome; ``ok`` only when pytest exited 0, something ran and nothing failed (a tier whose every test
    was skipped -- no GPU -- is not ok: it tested nothing)."""
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "error", "skipped")}
    return {"tier": tier, **counts, "tests": len(rows), "seconds": round(seconds, 1), "rc": rc,
            "skipped_all": len(rows) > 0 and counts["skipped"] == len(rows),
            "ok": rc == 0 and counts["passed"] > 0 and counts["failed"] == 0 and counts["error"] == 0}


def step_tests(out: Path, args) -> dict:
    """The GPU test suite at ``--tier`` (fast | full), ``--workers`` pytest-xdist processes on the one GPU (correctness
    tests only: nothing is timed in the suite), recorded as a ``gpu_suite`` run (table ``tests``: every test's outcome
    and duration; summary: counts, seconds, commit and GPU in the provenance)."""
    import importlib.util

    tier = getattr(args, "tier", "fast")
    shard = parse_shard(getattr(args, "shard", None))
    marker = TIERS[tier] + ("" if getattr(args, "model_tests", False) else " and not model")
    files = shard_files((f.relative_to(REPO_ROOT) for f in (REPO_ROOT / "tests" / "gpu").glob("test_*.py")), shard)
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", marker, *(files if shard else ["tests/gpu"]),
           f"--junitxml={out / 'gpu-tests.xml'}",
           "-p", "no:cacheprovider", "-rfE", "--durations=30"]
    if args.fail_fast:
        cmd.append("-x")
    workers = int(getattr(args, "workers", 0) or 0)
    if workers > 1 and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(workers)]
    elif workers > 1:
        log("pytest-xdist is not installed: the suite runs in one process")
    t0 = time.time()
    text, rc, interrupted = run_interruptible(cmd, cwd=REPO_ROOT)
    dt = time.time() - t0
    (out / "gpu-tests.txt").write_text(text)
    tail = "\n".join(text.strip().splitlines()[-25:])
    log(f"gpu tests ({tier} tier, -m '{marker}'){' INTERRUPTED' if interrupted else ''}:\n" + tail)
    xml = out / "gpu-tests.xml"
    try:
        rows = junit_rows(xml.read_text()) if xml.exists() else []
    except Exception:                       # a junit file cut short by the interrupt: no rows, said in the record
        rows = []
    summ = suite_summary(rows, dt, tier, rc)
    params = {"tier": tier, "marker": marker, "workers": workers, "command": " ".join(cmd[1:])}
    if shard:
        params.update(shard=f"{shard[0]}/{shard[1]}", files=files)
    with records.recording("gpu_suite", params, root=out / "data") as run:
        if rows:
            run.append("tests", rows)
        if interrupted:     # the tests that finished are kept; the run says it is partial and never counts as green
            run.finish("failed", **summ, interrupted=True,
                       note=f"interrupted after {dt:.0f} s: {len(rows)} tests finished, the rest did not run")
        else:
            run.finish("complete", **summ)
    log(f"gpu suite {tier}{f' shard {shard[0]}/{shard[1]}' if shard else ''}: {summ['passed']} passed, {summ['failed']} failed, {summ['error']} errors, "
         f"{summ['skipped']} skipped in {summ['seconds']} s (run {run.run_id}{', interrupted: partial' if interrupted else ''})")
    if interrupted:
        raise KeyboardInterrupt
    return {**summ, "run": run.run_id}


def run_interruptible(cmd: list[str], cwd: Path, grace: float = 45.0) -> tuple[str, int, bool]:
    """Run ``cmd`` to its end: (its stdout + stderr, exit code, False). On a Ctrl-C / SIGINT (``timeout -s INT`` sends
    it to the whole process group) the child is given ``grace`` seconds to finish its own interrupt handling -- pytest
    then writes the junit file of the tests that finished -- and is sent SIGINT itself if it did not get one, killed
    after that: (output, exit code, True)."""
    import signal

    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:    # with a timeout communicate reads through its selector and keeps what it read across an interrupt
        out, _ = p.communicate(timeout=7 * 24 * 3600)
        return out, p.returncode, False
    except KeyboardInterrupt:
        try:
            p.send_signal(signal.SIGINT)
            out, _ = p.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        return out or "", p.returncode, True


def junit_counts(xml: Path) -> dict:
    """tests / failures / errors / skipped of a pytest junit file, and ``skipped_all`` when every test was skipped
    (no GPU here): the summary then says the tests were skipped, not that they passed."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return {}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    n = {k: sum(int(x.get(k, 0)) for x in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {**n, "skipped_all": n["tests"] > 0 and n["skipped"] == n["tests"]}


def _state(r: dict) -> str:
    """A step's word in the summary: ok, FAILED, or skipped (every test of the step skipped)."""
    if r.get("skipped_all"):
        return f"skipped ({r['skipped']} of {r['tests']} tests skipped: no GPU here)"
    return "ok" if r.get("ok") else "FAILED"


SANITIZE_DRIVER = r"""
import numpy as np, cupy as cp
from labkernels import gpu, quants
from labkernels.kernels import registry
rng = np.random.default_rng(1)
nt, od, id_ = 70, 130, 512
x = cp.asarray(rng.standard_normal((nt, id_)).astype(np.float32))
a = gpu.prepass(x); rows = gpu.quantize_q8_1_rows(x)
w6 = quants.quantize(rng.standard_normal((od, id_)).astype(np.float32) * .02, "q6_K")
w4 = quants.quantize(rng.standard_normal((od, id_)).astype(np.float32) * .02, "q4_K")
for s in (210, 224):
    W = gpu.QWeight.upload(w6, "q6_K", s)
    gpu.gemm_generic_q6k(W, rows, nt)
    gpu.dequant_f16(W)
    for k in registry.family("q6k_expb"):
        if k.p["STRIDE"] == s and k.main_path:
            gpu.gemm(W, a, "q6k_expb", KDR=k.p["KDR"], EPI=k.p["EPI"], OCC=k.p["OCC"])
W4 = gpu.QWeight.upload(w4, "q4_K")
gpu.dequant_f16(W4)
for k in registry.family("q4k_nb"):
    gpu.gemm(W4, a, "q4k_nb", KDR=k.p["KDR"])
gpu.prepass(x.astype(cp.float16))
from labkernels import attention, attention_kinds
for n, H, Hk, d, w in ((37, 4, 1, 256, 0), (50, 4, 1, 256, 20), (33, 2, 2, 64, 0), (70, 6, 2, 128, 9)):
    kind = attention_kinds.LayerKind(H, Hk, d, d, w, 1.0 / np.sqrt(d))
    q, k, v = (cp.asarray(rng.standard_normal((n, c)).astype(np.float16)) for c in (H * d, Hk * d, Hk * d))
    attention.Lab(None).sdpa(q, k, v, n, kind)
cp.cuda.runtime.deviceSynchronize()
print("sanitizer driver done")
"""


def step_sanitizer(out: Path, args) -> dict:
    """compute-sanitizer memcheck, racecheck and synccheck over :data:`SANITIZE_DRIVER` (:mod:`labkernels.sanitizer`:
    each report kept in ``out/sanitizer-<tool>.txt`` and classed; clean when nothing but driver probes is reported)."""
    res = {}
    for tool in sanitizer.TOOLS:
        res[tool] = sanitizer.run_tool(tool, [sys.executable, "-c", SANITIZE_DRIVER], out / f"sanitizer-{tool}.txt",
                                       cwd=REPO_ROOT, timeout=args.sanitizer_timeout)
        log(sanitizer.line(tool, res[tool]))
    return {"ok": all(r["ok"] for r in res.values()), **res}


#: the machine-wide steps, by their gpu check names
STEPS = {"env": step_env, "tests": step_tests, "sanitizer": step_sanitizer}

#: the gpu check flags that several steps read (the machine-wide steps' and those read in more than one round), by
#: name -> argparse kwargs; a step names the ones it reads (:data:`STEP_ARGS`, a round step's ``args``). Names and
#: defaults are what scripts pass: keep them.
FLAGS = {
    "--repeats": dict(type=int, default=20, help="timed launches per point of the benchmark steps"),
    "--sanitizer-timeout": dict(type=int, default=240,
                                help="seconds each compute-sanitizer tool may run before it counts as failed"),
    "--gemma": dict(default=None, help="Gemma 3 270M GGUF path for the steps that load it (default data/models/...); "
                                       "round 9's generation steps measure it beside the synthetic models when given"),
    "--dense-path": dict(default=None, choices=blas.DENSE_PATHS,
                         help=f"gemm_dense's cuBLAS path for the steps that run a model's forward (or the graph census) "
                              f"in this process (default {blas.DENSE_PATH}: labkernels.blas.gemm_dense)"),
    "--cudnn-plan": dict(default=None, choices=attention.CUDNN_PLANS,
                         help=f"cuDNN SDPA plan policy for the steps that run a model's forward (or the attention "
                              f"benchmark, the graph census) in this process (default {attention.CUDNN_PLAN}: "
                              "labkernels.attention.Cudnn)"),
    "--fail-fast": dict(action="store_true", help="stop the GPU tests at the first failure (pytest -x)"),
    "--tier": dict(choices=sorted(TIERS), default="fast",
                   help="tests step: fast (-m gpu_fast, < 4 min) or full (every GPU test); default fast"),
    "--shard": dict(default=None, metavar="I/N",
                    help="tests step: run the I-th of N parts of the tier (test files dealt by size), to run the whole "
                         "suite over several calls; the index shows the full tier once every part of one commit is "
                         "recorded"),
    "--workers": dict(type=int, default=0, help="tests step: pytest-xdist processes sharing the GPU (0: one process)"),
    "--model-tests": dict(action="store_true", help="tests step: include the tests that need the real model (its GGUF "
                                                    "or tensor cache on the machine)"),
}

#: the flags each machine-wide step reads (names of :data:`FLAGS`)
STEP_ARGS = {"env": (), "tests": ("--tier", "--shard", "--workers", "--model-tests", "--fail-fast"),
             "sanitizer": ("--sanitizer-timeout",)}


def run_steps(chosen, out: Path, args) -> int:
    """Run the chosen steps [(name, fn(out, args))] in order into ``out``: each timed, a failing one reported (the
    lab's own error in one line, any other with its traceback) while the others still run, the results rewritten
    to ``out/gpu-check.json`` after every step; a summary line at the end. 1 if any step failed, else 0."""
    results, failed = {}, []
    for s, fn in chosen:
        log(f"== step {s}")
        t0 = time.time()
        try:
            r = fn(out, args)
        except Exception as e:
            import traceback

            if type(e).__module__.startswith("labkernels"):   # the lab's own error names what was wrong
                log(f"step {s}: {type(e).__name__}: {e}")
            else:
                traceback.print_exc()
            r = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        r["seconds"] = round(time.time() - t0, 1)
        results[s] = r
        if not r.get("ok"):
            failed.append(s)
        (out / "gpu-check.json").write_text(json.dumps(results, indent=1, default=str))
    log("summary: " + ", ".join(f"{k}={_state(v)} ({v['seconds']} s)" for k, v in results.items()))
    return 1 if failed else 0
