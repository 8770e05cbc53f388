"""GPU commands: ``labkernels gpu-check`` (the one-call device run) and ``labkernels bench``.

``gpu-check --out DIR`` runs, in one process tree on a GPU machine: the GPU test suite (parity gates),
compute-sanitizer memcheck + racecheck over every main-path kernel, the occupancy-API cross-check and the
round benchmarks, recording every measurement as runs under ``DIR/data`` (copy them into ``data/`` with
``labkernels import-runs DIR/data``). Steps are chosen with ``--steps NAME,...`` or, for a round whose steps are
records, ``--round N --step N|NAME,...`` (``--round N --list`` lists them, retired ones with the commit and command
that reproduce them); a failing step is reported and the others still run; the exit code is non-zero if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .paths import REPO_ROOT

#: gpu-check's results folder when neither --out nor $OUT names one: inside the repository, ignored by git
DEFAULT_OUT = REPO_ROOT / ".gpu" / "gpu-check"

#: the steps written here (machine-wide checks and the prefill issues'); every round's own steps come from the
#: table of rounds (labkernels.rounds.gpu_check_steps: occupancy, q6k, tile_ab, kdr, q4k, prefill, prefill7b,
#: decompose, forensics, and round 7's by their gpu-check names, wgmma, wgmma_sanitizer, ... prefill_r7)
STEPS = ("env", "tests", "sanitizer", "attention", "prefill_graph", "graph_nodes")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def step_env(out: Path, args) -> dict:
    from . import provenance

    p = provenance.collect()
    (out / "env.json").write_text(json.dumps(p, indent=1, default=str))
    _log(provenance.describe(p))
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

    from . import records

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
        _log("pytest-xdist is not installed: the suite runs in one process")
    t0 = time.time()
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    dt = time.time() - t0
    (out / "gpu-tests.txt").write_text(r.stdout + r.stderr)
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
    _log(f"gpu tests ({tier} tier, -m '{marker}'):\n" + tail)
    xml = out / "gpu-tests.xml"
    rows = junit_rows(xml.read_text()) if xml.exists() else []
    summ = suite_summary(rows, dt, tier, r.returncode)
    params = {"tier": tier, "marker": marker, "workers": workers, "command": " ".join(cmd[1:])}
    if shard:
        params.update(shard=f"{shard[0]}/{shard[1]}", files=files)
    with records.recording("gpu_suite", params, root=out / "data") as run:
        if rows:
            run.append("tests", rows)
        run.finish("complete", **summ)
    _log(f"gpu suite {tier}{f' shard {shard[0]}/{shard[1]}' if shard else ''}: {summ['passed']} passed, {summ['failed']} failed, {summ['error']} errors, "
         f"{summ['skipped']} skipped in {summ['seconds']} s (run {run.run_id})")
    return {**summ, "run": run.run_id}


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
from labkernels import attention
for n, H, Hk, d, w in ((37, 4, 1, 256, 0), (50, 4, 1, 256, 20), (33, 2, 2, 64, 0), (70, 6, 2, 128, 9)):
    kind = attention.LayerKind(H, Hk, d, d, w, 1.0 / np.sqrt(d))
    q, k, v = (cp.asarray(rng.standard_normal((n, c)).astype(np.float16)) for c in (H * d, Hk * d, Hk * d))
    attention.Lab(None).sdpa(q, k, v, n, kind)
cp.cuda.runtime.deviceSynchronize()
print("sanitizer driver done")
"""


def step_sanitizer(out: Path, args) -> dict:
    res = {}
    ok = True
    for tool in ("memcheck", "racecheck", "synccheck"):
        cmd = ["compute-sanitizer", f"--tool={tool}", "--error-exitcode=9", sys.executable, "-c", SANITIZE_DRIVER]
        t0 = time.time()
        try:
            r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=args.sanitizer_timeout)
            text, rc = r.stdout + r.stderr, r.returncode
        except FileNotFoundError:
            text, rc = "compute-sanitizer not found", 127
        except subprocess.TimeoutExpired as e:
            text, rc = f"timeout after {args.sanitizer_timeout} s\n{e.stdout or ''}", 124
        (out / f"sanitizer-{tool}.txt").write_text(text)
        summary = [ln for ln in text.splitlines() if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln]
        res[tool] = {"rc": rc, "summary": summary[-1] if summary else text.strip().splitlines()[-1:],
                     "seconds": round(time.time() - t0, 1)}
        ok = ok and rc == 0
        _log(f"compute-sanitizer {tool}: rc={rc} {res[tool]['summary']}")
    return {"ok": ok, **res}


def step_attention(out: Path, args) -> dict:
    """Issue 17: attention alone (cuDNN fused SDPA vs the lab's baseline vs PyTorch SDPA per backend, the 7B and
    Gemma 3 270M layouts, nt 512 / 3325 / 8192, interleaved CUDA-event medians; parity against the fp32 baseline),
    recorded as an ``attention`` run (data/05_wall_decomposition/); then round 5's decomposition of the synthetic 7B with --attention (auto)."""
    from . import attention, attention_bench, records

    nts = [int(x) for x in args.attention_nts.split(",") if x]
    paths = attention.status()
    _log(f"attention paths: {paths}")
    with records.recording("attention", {"layouts": {k: {lk: vars(v) for lk, v in d.items()}
                                                     for k, d in attention.bench_layouts().items()},
                                         "nts": nts, "dtype": args.attn_dtype, "pairs": 3, "repeats": 10,
                                         "scopes": ["op", "kernel"], "paths": paths}, root=out / "data") as run:
        res = attention_bench.record_bench(run, nts=nts, dtype=args.attn_dtype, progress=_log)
    from .rounds.r05_wall import decompose_models

    runs, valid = decompose_models(out, args, ["7b"])
    return {"ok": res["ok"], "run": run.run_id, "decompose_runs": runs, "decompose_valid": valid, "paths": paths}


#: issue 18's A/B: before = the round-7 prefill (eager, the small kernels unfused), the fusions alone, and
#: after = fused + CUDA-graph replay (name -> PrefillOptions fields over the base options; graph None: a capture
#: that fails runs eager with the reason in the rows' fallback column, and the step is not ok)
from .prefill import FUSIONS  # noqa: E402  (the fusion flags; prefill needs no GPU to import)

GRAPH_VARIANTS = {"eager-unfused": {"graph": False, **{f: False for f in FUSIONS}},
                  "eager-fused": {"graph": False},
                  # the graph with the defaults (from 20261201T20: lab+cudnn attention, PDL and the node rewrites on;
                  # the dequantized weights on fp16 cuBLAS since 20261201T18)
                  "graph-fused": {"graph": None},
                  # the same with those weights in fp32 (the default before 20261201T18): the other_f16 A/B
                  "graph-fused-f32dense": {"graph": None, "other_f16": False},
                  # the three graph options off (the default before 20261201T20) ...
                  "graph-fused-plain": {"graph": None, "pdl": False, "memsets_as_kernels": False, "ids_from_host": False},
                  # ... and only PDL off
                  "graph-fused-nodes": {"graph": None, "pdl": False},
                  # cuDNN's SDPA for every layer (auto's choice before 20261201T20), with and without the graph options:
                  # the latter is the whole default of 20261201T18
                  "graph-fused-cudnnattn": {"graph": None, "attention": "cudnn"},
                  "graph-fused-plain-cudnnattn": {"graph": None, "attention": "cudnn", "pdl": False,
                                                  "memsets_as_kernels": False, "ids_from_host": False}}
#: the graph options a variant may set (their defaults are recorded with each prefill_graph run)
GRAPH_OPTIONS = ("pdl", "memsets_as_kernels", "ids_from_host")
#: the variants whose decomposition (host overhead as a class, the replay's launch gaps) is recorded
GRAPH_DECOMPOSE_VARIANTS = ("eager-unfused", "graph-fused", "graph-fused-f32dense", "graph-fused-plain",
                            "graph-fused-nodes", "graph-fused-cudnnattn", "graph-fused-plain-cudnnattn")
#: the graph variants whose replays are stamped (replay_breakdown: where the wall outside the graph goes)
BREAKDOWN_VARIANTS = ("graph-fused", "graph-fused-plain", "graph-fused-cudnnattn")
GRAPH_BREAKDOWN_REPEATS = 11
GRAPH_NTS = (64, 128, 512, 1024, 3325)
GRAPH_DECOMPOSE_NTS = (64, 512, 3325)


def _logit_diff(a, b) -> dict:
    d = float(np.abs(a - b).max())
    return {"max_abs_diff": d, "max_rel_diff": d / float(np.abs(b).max()), "bitwise": bool(np.array_equal(a, b)),
            "top1_same": bool(a.argmax() == b.argmax())}


def graph_ab(gm, m, label: str, run, nts=GRAPH_NTS, dec_nts=GRAPH_DECOMPOSE_NTS, rounds: int = 5, repeats: int = 3,
             progress=_log) -> dict:
    """The prefill_graph measurements of one model on one GpuModel (options switched per variant; the graph cache
    keys on them): per nt the logits of every variant against eager-unfused's, graph vs eager on a second prompt
    (the replay reads the new ids from its input buffer), the variants' walls interleaved round by round; the
    decompositions (host overhead as a class) of before and after, with and without programmatic launches, and the
    graph replays' launch-by-launch gaps (table replay_gaps); the captured graphs."""
    import dataclasses

    from . import attention, gpu, prefill_cli
    from .decompose import host_overhead_table, run_decomposition
    from .prefill import timed_prefill

    cp = gpu.cp()
    base = gm.opts

    def use(v):
        gm.opts = dataclasses.replace(base, **GRAPH_VARIANTS[v])

    names = []
    for v in GRAPH_VARIANTS:     # a variant whose attention path cannot run here is recorded with the reason, not run
        use(v)
        try:
            gm.attn
        except (attention.AttentionUnavailable, attention.AttentionError) as e:
            run.append("variants_unavailable", {"model": label, "variant": v, "reason": str(e)})
            progress(f"{label}: variant {v} left out: {e}")
            continue
        names.append(v)
    walls = {}
    for nt in nts:
        toks = prefill_cli.prompt_tokens(m, nt)
        ref = None
        for v in names:
            use(v)
            lg = cp.asnumpy(gm.forward(toks)).astype(np.float64)
            ref = lg if ref is None else ref
            run.append("logits_vs_first", {"model": label, "nt": nt, "variant": v, "mode": gm.last_mode,
                                           "first": names[0], **_logit_diff(lg, ref)})
        toks2 = prefill_cli.prompt_tokens(m, nt, seed=7)
        use("eager-fused")
        e2 = cp.asnumpy(gm.forward(toks2)).astype(np.float64)
        use("graph-fused")
        g2 = cp.asnumpy(gm.forward(toks2)).astype(np.float64)
        row = {"model": label, "nt": nt, "prompt": "second (seed 7)", "mode": gm.last_mode, **_logit_diff(g2, e2)}
        run.append("graph_vs_eager", row)
        progress(f"{label} nt={nt}: graph vs eager (2nd prompt) max rel diff {row['max_rel_diff']:.3g}, "
                 f"bitwise {row['bitwise']}")
        for rnd in range(rounds):
            for v in names:
                use(v)
                t = timed_prefill(gm, toks, repeats=repeats)
                walls.setdefault((nt, v), []).append(t["wall_ms"])
                # "kernel" names the variant too: round 5's notebook groups recorded throughput rows by it
                run.append("throughput", {"model": label, "arch": gm.cfg.arch, "nt": nt, "variant": v,
                                          "kernel": f"{base.kernel} {v}",
                                          "mode": t["mode"], "fallback": t["fallback"], "round": rnd,
                                          "wall_ms": t["wall_ms"], "tok_per_s": t["tok_per_s"], "repeats": repeats,
                                          "gpu_span_ms": t["gpu_span_ms"], "host_outside_ms": t["host_outside_ms"],
                                          "attn_f16": base.attn_f16, "gemm_families": gm.families_used(),
                                          "attention": gm.attn.name, "attention_ran": gm.attn.ran(nt)})
        progress(f"{label} nt={nt}: " + ", ".join(f"{v} {np.median(walls[(nt, v)]):.2f} ms" for v in names))
    run.append("graphs", [{"model": label, **g} for g in gm.graphs()])
    for nt in nts:      # where the time outside the graph goes: host stamps and events around each replay
        toks = prefill_cli.prompt_tokens(m, nt)
        for v in (v for v in BREAKDOWN_VARIANTS if v in names):
            use(v)
            t = timed_prefill(gm, toks, repeats=GRAPH_BREAKDOWN_REPEATS, breakdown=True)
            if t["breakdown"]:
                run.append("replay_breakdown", {"model": label, "nt": nt, "variant": v,
                                                "repeats": GRAPH_BREAKDOWN_REPEATS, **t["breakdown"]})
        progress(f"{label} nt={nt}: outside the graph " + ", ".join(
            f"{k[:-3]} {v:.3f}" for k, v in (t["breakdown"] or {}).items()) + " ms")
    gaps = {}
    for nt in dec_nts:
        toks = prefill_cli.prompt_tokens(m, nt)
        for v in (v for v in GRAPH_DECOMPOSE_VARIANTS if v in names):
            use(v)
            r = run_decomposition(gm, toks, repeats=repeats, reference=False, progress=progress)
            if r["replay_gaps"]:
                run.append("replay_gaps", [{"model": label, "nt": nt, "variant": v, **g} for g in r["replay_gaps"]])
            bw = r["busy_wall"]
            t = host_overhead_table(r["classes"], bw)
            host = float(t.loc[t["class"] == "host_overhead", "busy_ms"].iloc[0])
            run.append("decompose_classes", t.assign(model=label, nt=nt, variant=v, mode=bw["mode"]))
            run.append("decompose_busy_wall", [{"model": label, "nt": nt, "variant": v,
                                                **{k: bw[k] for k in ("mode", "wall_ms", "busy_ms", "gap_ms",
                                                                      "gap_frac", "busy_replay_ms",
                                                                      "busy_sum_replay_ms", "span_replay_ms",
                                                                      "idle_replay_ms", "wall_paired_ms")},
                                                "host_overhead_ms": host, "host_frac": host / bw["wall_ms"]}])
            gaps[(nt, v)] = host / bw["wall_ms"]
    gm.opts = base
    return {"walls": walls, "gaps": gaps}


def step_prefill_graph(out: Path, args) -> dict:
    """Issue 18: eager vs CUDA-graph prefill (and the fusions) at nt 64..3325 for the synthetic 7B and Gemma 3 270M
    (when its GGUF is here), interleaved in one process; logits parity; round 5's decomposition with host overhead
    as a class before (eager, unfused) and after (graph, fused) at nt 64, 512, 3325. One recorded run per model."""
    import gc

    from . import attention, gpu, prefill_cli, records
    from .model import default_model_path
    from .prefill import GpuModel, PrefillOptions

    want = [m for m in (getattr(args, "graph_models", None) or "7b,gemma").split(",") if m]
    models = []
    gemma = Path(args.gemma or default_model_path())
    for w in want:
        if w == "7b":
            models.append("synthetic-7b")
        elif w == "gemma" and gemma.exists():
            models.append(str(gemma))
        elif w == "gemma":
            _log(f"prefill_graph: no Gemma GGUF at {gemma}: left out")
        elif w in prefill_cli.SYNTHETIC:
            models.append(w)
        else:
            raise SystemExit(f"prefill_graph: unknown model {w!r}: 7b, gemma or one of {', '.join(prefill_cli.SYNTHETIC)}")
    cp = gpu.cp()
    runs, summary, ok = [], {}, True
    for spec in models:
        label = spec if spec in prefill_cli.SYNTHETIC else "gemma-3-270m-q4_k_m"
        params = {"what": "graph", "model": label, "nts": list(GRAPH_NTS), "decompose_nts": list(GRAPH_DECOMPOSE_NTS),
                  "variants": GRAPH_VARIANTS,
                  "option_defaults": {f: getattr(PrefillOptions(), f) for f in GRAPH_OPTIONS + ("other_f16", "attention")},
                  "attn_f16": True, "kernel": args.kernel,
                  "dense_path": gpu.DENSE_PATH, "cudnn_plan": attention.CUDNN_PLAN}
        with records.recording("prefill", params, root=out / "data") as run:
            m = prefill_cli.load_model(spec)
            gm = GpuModel(m, opts=PrefillOptions(attn_f16=True, kernel=args.kernel))
            r = graph_ab(gm, m, label, run)
            w = {k: float(np.median(v)) for k, v in r["walls"].items()}
            s = {f"speedup_nt{nt}": w[(nt, "eager-unfused")] / w[(nt, "graph-fused")] for nt in GRAPH_NTS}
            s.update({f"host_frac_nt{nt}_{v}": g for (nt, v), g in r["gaps"].items()})
            s["graph_fallbacks"] = gm.graph_fallbacks
            run.finish(**s)
        summary[label] = s
        ok = ok and not gm.graph_fallbacks
        runs.append(run.run_id)
        gm.free_graphs()
        del gm, m
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
    return {"ok": ok, "runs": runs, **summary}


def step_graph_nodes(out: Path, args) -> dict:
    """Issue 18: the memset nodes of the prefill's graph. Gemma 3 270M's dense GEMMs (stacked Q/K/V at nt 64 / 512 /
    3325, ...) and its cuDNN SDPA layer kinds, each captured alone into a CUDA graph and counted node by node
    (labkernels.graph_census): gemm_dense through cublasGemmEx (before) and cuBLASLt without split-K (after), outputs
    compared bitwise and to float64; the SDPA with the prefill's plan and every candidate plan. One ``prefill``
    run (tables dense_nodes, sdpa_nodes)."""
    from . import attention, gpu, graph_census, records

    params = {"what": "graph_nodes", "dense_points": [list(p) for p in graph_census.DENSE_POINTS],
              "dense_shapes": graph_census.GEMMA_DENSE, "dense_rtol": graph_census.DENSE_RTOL,
              "dense_path": gpu.DENSE_PATH, "cudnn_plan": attention.CUDNN_PLAN, "sdpa_nts": list(graph_census.SDPA_NTS),
              "sdpa_plan_nts": list(graph_census.SDPA_PLAN_NTS), "sdpa_dtype": args.attn_dtype,
              "sdpa_kinds": {k: vars(v) for k, v in attention.bench_layouts()["gemma-3-270m"].items()}}
    with records.recording("prefill", params, root=out / "data") as run:
        dense = graph_census.dense_census(progress=_log)
        run.append("dense_nodes", dense)
        try:
            sdpa = graph_census.sdpa_census(dtype=args.attn_dtype, progress=_log)
        except (attention.AttentionUnavailable, attention.AttentionError) as e:
            sdpa = [{"kind": "all", "plan": "all", "error": f"{type(e).__name__}: {e}"}]
        run.append("sdpa_nodes", sdpa)
        v = graph_census.check(dense, sdpa)
        v["dense_fallbacks"] = gpu.dense_fallbacks()
        for p in v["problems"]:
            _log(f"graph_nodes: {p}")
        run.finish(**{k: x for k, x in v.items() if k != "ok"}, ok=v["ok"])
    _log("graph_nodes: " + ", ".join(f"{k}={x}" for k, x in v.items() if k.startswith("memsets_")))
    _log(f"graph_nodes: SDPA plans without a memset: {v['sdpa_plans_without_memset'] or 'none'}")
    return {**v, "run": run.run_id}


def _set_paths(args) -> None:
    """--dense-path / --cudnn-plan: gemm_dense's path (gpu.DENSE_PATH) and the cuDNN SDPA plan policy
    (attention.CUDNN_PLAN) for every step of this gpu-check (the prefill runs record both)."""
    from . import attention, gpu

    if getattr(args, "dense_path", None):
        gpu.DENSE_PATH = args.dense_path
    if getattr(args, "cudnn_plan", None):
        attention.CUDNN_PLAN = args.cudnn_plan
    _log(f"gemm_dense path {gpu.DENSE_PATH}, cuDNN plan policy {attention.CUDNN_PLAN}")


def check_args(args) -> None:
    """The paths and lists gpu-check was given, before anything runs (GpuCheckError naming the bad one)."""
    parse_shard(getattr(args, "shard", None))
    if args.gemma is not None:
        g = Path(args.gemma)
        if not str(args.gemma).strip() or not g.is_file():
            why = "empty" if not str(args.gemma).strip() else "not a regular file" if g.exists() else "no such file"
            raise GpuCheckError(f"--gemma {args.gemma!r}: {why} (give the Gemma 3 270M GGUF, or leave it out for "
                                "data/models/)")
    if getattr(args, "old_kernels", None) and not Path(args.old_kernels).is_dir():
        raise GpuCheckError(f"--old-kernels {args.old_kernels!r}: no such folder")
    for name in ("repeats", "sweep_repeats", "decompose_nt", "sanitizer_timeout"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise GpuCheckError(f"--{name.replace('_', '-')} {v}: must be >= 1")


class GpuCheckError(RuntimeError):
    """Bad arguments to ``labkernels gpu-check`` (refused before any step runs)."""


def list_steps(round_name) -> str:
    """``gpu-check --round N --list``: the round's steps, one line each (number, name, old names, builds; a retired
    one with the commit and command that reproduce it)."""
    from . import rounds

    mod = rounds.module(round_name)
    lines = [f"round {mod.NOTEBOOK}: gpu-check --round {int(mod.NOTEBOOK[:2])} --step N|NAME"]
    for s in rounds.round_steps(mod):
        alias = f" (--steps {', '.join(s.aliases)})" if s.aliases else ""
        builds = "; builds " + ", ".join(f"{k}={'+'.join(v) or 'plain'}" for k, v in s.builds.items()) if s.builds else ""
        lines.append(f"  {s.label}{alias}: {s.title}{builds}")
        if s.retired is not None:
            lines.append(f"      retired ({s.retired.why}): at commit {s.retired.commit}: {s.retired.command}")
    return "\n".join(lines)


def _chosen_steps(args) -> list:
    """[(name, fn)] of this gpu-check, every name checked before any step runs: ``--round N --step ...`` (the round's
    records) or ``--steps`` (gpu-check names; a retired step's name is refused with its commit and command)."""
    from . import rounds

    if getattr(args, "round", None) is not None or getattr(args, "step", None) is not None:
        if args.round is None or args.step is None or args.steps:
            raise GpuCheckError("--round N --step N|NAME,... choose a round's steps (--steps the gpu-check names): "
                             "--round and --step together, without --steps")
        try:
            return [(s.name, s.run) for s in rounds.select_steps(args.round, args.step.split(","))]
        except rounds.RoundError as e:
            raise GpuCheckError(e.args[0]) from None
    steps = args.steps.split(",") if args.steps else ["env", "tests", "sanitizer", "occupancy", "q6k"]
    funcs = {**{k[5:]: v for k, v in globals().items() if k.startswith("step_")}, **rounds.gpu_check_steps()}
    for s in steps:
        if s not in funcs and rounds.retired_message(s):
            raise GpuCheckError(rounds.retired_message(s))
    bad = [s for s in steps if s not in funcs]
    if bad:
        raise GpuCheckError(f"unknown step {bad[0]!r}; steps: {', '.join(funcs)}")
    return [(s, funcs[s]) for s in steps]


def main(args) -> int:
    if getattr(args, "list", False):
        if args.round is None:
            raise GpuCheckError("--list lists the steps of a round: --round N --list")
        print(list_steps(args.round))
        return 0
    chosen = _chosen_steps(args)              # before any step runs
    check_args(args)
    if not str(args.out).strip():
        raise GpuCheckError("--out is empty: give a results folder")
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        raise GpuCheckError(f"--out {args.out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    results, failed = {}, []

    args.log = _log
    _set_paths(args)
    for s, fn in chosen:
        _log(f"== step {s}")
        t0 = time.time()
        try:
            r = fn(out, args)
        except Exception as e:
            import traceback

            if type(e).__module__.startswith("labkernels"):   # the lab's own error names what was wrong
                _log(f"step {s}: {type(e).__name__}: {e}")
            else:
                traceback.print_exc()
            r = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        r["seconds"] = round(time.time() - t0, 1)
        results[s] = r
        if not r.get("ok"):
            failed.append(s)
        (out / "gpu-check.json").write_text(json.dumps(results, indent=1, default=str))
    _log("summary: " + ", ".join(f"{k}={_state(v)} ({v['seconds']} s)" for k, v in results.items()))
    return 1 if failed else 0


def import_main(args) -> int:
    from . import records

    copied = records.import_runs(Path(args.src))
    print(f"imported {len(copied)} files into data/:")
    for c in copied:
        print("  ", c)
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("gpu-check", help="the one-call device run: GPU tests, sanitizer, occupancy API, benchmarks")
    p.add_argument("--out", default=os.environ.get("OUT") or str(DEFAULT_OUT),
                   help="results folder: the recorded runs go to OUT/data (default $OUT, else "
                        ".gpu/gpu-check/ in the repository, which git ignores)")
    p.add_argument("--steps", default=None, help="comma list of steps (default env,tests,sanitizer,occupancy,q6k; "
                                                 "every round's steps: labkernels.rounds)")
    p.add_argument("--round", default=None, help="a round whose steps are records: run --step of it, or --list them")
    p.add_argument("--step", default=None,
                   help="with --round: comma list of step numbers, names or old gpu-check names (--round 7 --step 28)")
    p.add_argument("--list", action="store_true", help="with --round: list its steps (retired ones with the commit and "
                   "command that reproduce them) and exit")
    p.add_argument("--repeats", type=int, default=20, help="timed launches per point of the benchmark steps")
    p.add_argument("--sweep-repeats", type=int, default=10, help="timed launches per point of the KDR sweep step")
    p.add_argument("--decompose-nt", type=int, default=3325, help="prompt tokens of the decomposition steps")
    p.add_argument("--decompose-models", default="gemma,7b", help="comma list of gemma, 7b")
    p.add_argument("--graph-models", default="7b,gemma", help="prefill_graph: comma list of 7b, gemma (the real GGUF), synthetic-gemma3 (its shapes, random weights)")
    p.add_argument("--fail-fast", action="store_true", help="stop the GPU tests at the first failure (pytest -x)")
    p.add_argument("--tier", choices=sorted(TIERS), default="fast",
                   help="tests step: fast (-m gpu_fast, < 4 min) or full (every GPU test); default fast")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="tests step: run the I-th of N parts of the tier (test files dealt by size), to run the whole "
                        "suite over several calls; the index shows the full tier once every part of one commit is "
                        "recorded")
    p.add_argument("--workers", type=int, default=0,
                   help="tests step: pytest-xdist processes sharing the GPU (0: one process)")
    p.add_argument("--model-tests", action="store_true",
                   help="tests step: include the tests that need the real model (its GGUF or tensor cache on the "
                        "machine)")
    p.add_argument("--sanitizer-timeout", type=int, default=240,
                   help="seconds each compute-sanitizer tool may run before it counts as failed")
    p.add_argument("--kernel", default="auto", help="qmatmul kernel of the prefill/decompose steps (default auto)")
    p.add_argument("--old-kernels", default=None,
                   help="tile_ab: the kernel sources before the tile skeleton (default: git archive eef6c5d)")
    p.add_argument("--gemma", default=None, help="Gemma 3 270M GGUF path for prefill_r7 and prefill_graph "
                   "(default data/models/...); generate measures it beside the synthetic models when given")
    p.add_argument("--attention", default="auto", help="attention path of the decompose / attention steps: "
                   "auto | cudnn | torch | baseline (labkernels.attention)")
    p.add_argument("--attn-dtype", default="f16", help="input type of the fused attention: f16 | bf16")
    p.add_argument("--attention-nts", default="512,3325,8192", help="token counts of the attention benchmark")
    from . import attention, gpu

    p.add_argument("--dense-path", default=None, choices=gpu.DENSE_PATHS,
                   help=f"gemm_dense's cuBLAS path for every step (default {gpu.DENSE_PATH}: labkernels.gpu.gemm_dense)")
    p.add_argument("--cudnn-plan", default=None, choices=attention.CUDNN_PLANS,
                   help=f"cuDNN SDPA plan policy for every step (default {attention.CUDNN_PLAN}: labkernels.attention.Cudnn)")
    from . import rounds

    groups = {}
    for nb, label, flags, kw in rounds.step_args():   # the arguments each round step declares (once per flag)
        g = groups.get(nb) or groups.setdefault(nb, p.add_argument_group(f"round {nb}'s steps"))
        try:
            g.add_argument(*flags, **{**kw, "help": f"{kw.get('help', '')} (step {label})".strip()})
        except argparse.ArgumentError:
            pass                                      # declared already (gpu-check's own, or another step's)
    p.set_defaults(func=main)
    q = sub.add_parser("import-runs", help="copy recorded runs from a GPU results folder into data/")
    q.add_argument("src", help="the folder of recorded runs to file into data/ (gpu-check's OUT/data)")
    q.set_defaults(func=import_main)
