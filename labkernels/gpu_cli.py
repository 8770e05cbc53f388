"""GPU commands: ``labkernels gpu-check`` (the one-call device run) and ``labkernels bench``.

``gpu-check --out DIR`` runs, in one process tree on a GPU machine: the GPU test suite (parity gates),
compute-sanitizer memcheck + racecheck over every main-path kernel, the occupancy-API cross-check and the
round benchmarks, recording every measurement as runs under ``DIR/data`` (copy them into ``data/`` with
``labkernels import-runs DIR/data``). Steps are chosen with ``--steps``; a failing step is reported and
the others still run; the exit code is non-zero if any failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .paths import REPO_ROOT

#: the steps written here (machine-wide checks and round 7's); every round's own steps come from the table of
#: rounds (labkernels.rounds: occupancy, q6k, kdr, q4k, prefill, prefill7b, decompose, forensics)
STEPS = ("env", "tests", "sanitizer", "wgmma", "wgmma_sanitizer", "wgmma_ncu", "prefill_r7")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def step_env(out: Path, args) -> dict:
    from . import provenance

    p = provenance.collect()
    (out / "env.json").write_text(json.dumps(p, indent=1, default=str))
    _log(provenance.describe(p))
    return {"ok": p.get("gpu") is not None}


def step_tests(out: Path, args) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x" if args.fail_fast else "-q", "-m", "gpu", "tests/gpu",
           f"--junitxml={out / 'gpu-tests.xml'}", "-p", "no:cacheprovider"]
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    (out / "gpu-tests.txt").write_text(r.stdout + r.stderr)
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
    _log("gpu tests:\n" + tail)
    return {"ok": r.returncode == 0, "rc": r.returncode}


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
cp.cuda.runtime.deviceSynchronize()
print("sanitizer driver done")
"""


def step_sanitizer(out: Path, args) -> dict:
    res = {}
    ok = True
    for tool in ("memcheck", "racecheck"):
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


WGMMA_DRIVER = r"""
import sys, numpy as np, cupy as cp
from labkernels import quants, wgmma
from labkernels.kernels import registry
mode = sys.argv[1]
rng = np.random.default_rng(3)
cases = []
if mode == "sanitizer":       # tails in nt and od, every main-path variant
    for k in registry.family("wgmma_kq"):
        if k.main_path:
            cases.append((k, 77, 200, 512))
else:                         # ncu: the main variants at the 7B attention shape
    for qt in (4, 6):
        for nt, bn in ((512, 128), (4096, 128), (4096, 256)):
            scl = 0 if qt == 4 else 1
            cases.append((registry.find("wgmma_kq", QT=qt, BN=bn, STAGES=4, BF16=0, SCL=scl), nt, 4096, 4096))
for k, nt, od, id_ in cases:
    qtype = "q4_K" if k.p["QT"] == 4 else "q6_K"
    raw = quants.quantize((rng.standard_normal((min(od, 256), id_)) * .02).astype(np.float32), qtype)
    raw = np.ascontiguousarray(np.tile(raw, (-(-od // raw.shape[0]), 1))[:od])
    w = wgmma.WgWeight.from_gguf(raw, qtype)
    x = cp.asarray(rng.standard_normal((nt, id_)).astype(np.float16))
    y = cp.empty((nt, od), cp.float32)
    wgmma.gemm(w, x, out=y, **{n: v for n, v in k.params if n != "QT"})
    cp.cuda.runtime.deviceSynchronize()
    print("case", k.key, nt, od, id_, flush=True)
"""


def step_wgmma(out: Path, args) -> dict:
    """Round 7: kernel resources, real-model gates and the interleaved benchmark (labkernels.wgmma.record)."""
    from . import records, wgmma

    with records.recording("wgmma", wgmma.PLAN, root=out / "data") as run:
        wgmma.record(run, progress=_log)
    return {"ok": True, "run": run.run_id}


def step_wgmma_sanitizer(out: Path, args) -> dict:
    """compute-sanitizer memcheck, racecheck, synccheck over every main-path wgmma_kq variant (tails)."""
    from . import records

    res, ok, rows = {}, True, []
    for tool in ("memcheck", "racecheck", "synccheck"):
        # host API errors are not the kernels': cuda-bindings probes driver entry points with cuGetProcAddress,
        # which fails for symbols this driver lacks (seen: 34 such 'errors', no device-side finding)
        cmd = ["compute-sanitizer", f"--tool={tool}", "--report-api-errors", "no", "--error-exitcode=9",
               sys.executable, "-c", WGMMA_DRIVER, "sanitizer"]
        try:
            r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=args.sanitizer_timeout)
            text, rc = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = f"timeout after {args.sanitizer_timeout} s\n{e.stdout or ''}", 124
        (out / f"wgmma-sanitizer-{tool}.txt").write_text(text)
        summary = [ln for ln in text.splitlines() if "SUMMARY" in ln]
        res[tool] = {"rc": rc, "summary": summary[-1] if summary else text.strip().splitlines()[-1:],
                     "cases": sum(1 for ln in text.splitlines() if ln.startswith("case "))}
        ok = ok and rc == 0
        rows.append({"tool": tool, "rc": rc, "summary": str(res[tool]["summary"]), "cases": res[tool]["cases"],
                     "clean": rc == 0})
        _log(f"wgmma compute-sanitizer {tool}: rc={rc} {res[tool]['summary']} ({res[tool]['cases']} cases)")
    with records.recording("wgmma", {"what": "sanitizer", "tools": [r["tool"] for r in rows]},
                           root=out / "data") as run:
        run.append("sanitizer", rows)
    return {"ok": ok, **res, "run": run.run_id}


NCU_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "WarpStateStats", "SchedulerStats", "Occupancy",
                "MemoryWorkloadAnalysis")


def step_wgmma_ncu(out: Path, args) -> dict:
    """Nsight Compute sections of the main wgmma_kq variants (tensor pipe, issue, stalls), recorded."""
    import csv
    import io

    from . import records

    cmd = ["ncu", "--clock-control", "none", "-k", "regex:wgmma_kq", "--csv", "--page", "details"]
    for sname in NCU_SECTIONS:
        cmd += ["--section", sname]
    cmd += [sys.executable, "-c", WGMMA_DRIVER, "ncu"]
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    (out / "wgmma-ncu.txt").write_text(r.stdout + r.stderr)
    cases = [ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("case ")]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines)))) if lines else []
    if r.returncode != 0 or not rows:
        _log(f"ncu failed rc={r.returncode}: {(r.stdout + r.stderr)[-800:]}")
        return {"ok": False, "rc": r.returncode}
    ids = sorted({int(x["ID"]) for x in rows})
    table = []
    for x in rows:
        i = ids.index(int(x["ID"]))
        key, nt, od, id_ = cases[i] if i < len(cases) else ("?", 0, 0, 0)
        table.append({"case": i, "kernel": key, "nt": int(nt), "od": int(od), "id": int(id_),
                      "section": x.get("Section Name"), "metric": x.get("Metric Name"), "unit": x.get("Metric Unit"),
                      "value": x.get("Metric Value")})
    with records.recording("wgmma", {"what": "ncu", "sections": NCU_SECTIONS, "cases": cases}, root=out / "data") as run:
        run.append("sections", table)
    _log(f"ncu: {len(ids)} kernels x {len(NCU_SECTIONS)} sections recorded (run {run.run_id})")
    return {"ok": True, "run": run.run_id}


#: prefill variants the A/B step can compare (name -> PrefillOptions fields)
PREFILL_VARIANTS = {"int8": {"kernel": "int8"}, "auto": {"kernel": "auto"},
                    "auto-unfused": {"kernel": "auto", "fuse_f16": False}}


def step_prefill_r7(out: Path, args) -> dict:
    """Round 7 in the prefill: the synthetic 7B (and Gemma 3 270M when its GGUF is here), prefill variants
    (--ab, default int8 vs auto) interleaved in one process at nt 512 and 3325; Gemma logits parity; the logits
    of every variant against the first one's."""
    import gc

    from . import gpu, prefill_cli, records
    from .model import default_model_path
    from .prefill import GpuModel, PrefillOptions, timed_prefill

    names = [v for v in args.ab.split(",") if v]
    bad = [v for v in names if v not in PREFILL_VARIANTS]
    if bad:
        raise SystemExit(f"unknown prefill variants {bad}: {', '.join(PREFILL_VARIANTS)}")
    models = [("synthetic-7b", True)]
    if Path(args.gemma or default_model_path()).exists():
        models.append((str(args.gemma or default_model_path()), True))
    runs = []
    cp = gpu.cp()
    for spec, f16 in models:
        label = "synthetic-7b" if spec == "synthetic-7b" else "gemma-3-270m-q4_k_m"
        with records.recording("prefill", {"model": label, "nts": [512, 3325], "attn_f16": f16, "ab": names,
                                           "variants": {v: PREFILL_VARIANTS[v] for v in names}},
                               root=out / "data") as run:
            m = prefill_cli.load_model(spec)
            if label != "synthetic-7b":
                prefill_cli.parity_run(spec, run, n_new=0, progress=_log, kernel="auto")
            gms = {k: GpuModel(m, opts=PrefillOptions(attn_f16=f16, **PREFILL_VARIANTS[k])) for k in names}
            for nt in (512, 3325):
                toks = prefill_cli.prompt_tokens(m, nt)
                ref = None
                for k, gm in gms.items():        # the variants' logits against the first variant's
                    lg = cp.asnumpy(gm.forward(toks)).astype(np.float64)
                    ref = lg if ref is None else ref
                    run.append("logits_vs_first", {"model": label, "nt": nt, "variant": k, "first": names[0],
                                                   "max_abs_diff": float(np.abs(lg - ref).max()),
                                                   "max_rel_diff": float(np.abs(lg - ref).max() / np.abs(ref).max()),
                                                   "top1_same": bool(lg.argmax() == ref.argmax())})
                for rnd in range(3):
                    for k, gm in gms.items():
                        t = timed_prefill(gm, toks, repeats=3)
                        row = {"model": label, "arch": gm.cfg.arch, "nt": nt, "kernel": k, "round": rnd,
                               "wall_ms": t["wall_ms"], "tok_per_s": t["tok_per_s"], "repeats": 3, "attn_f16": f16,
                               "gemm_families": gm.families_used()}
                        run.append("throughput", row)
                        _log(f"prefill {label} nt={nt} {k} ({row['gemm_families']}): {t['wall_ms']:.1f} ms "
                             f"{t['tok_per_s']:.0f} tok/s")
        runs.append(run.run_id)
        del gms, m
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
    return {"ok": True, "runs": runs}


def main(args) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = args.steps.split(",") if args.steps else ["env", "tests", "sanitizer", "occupancy", "q6k"]
    results, failed = {}, []
    from . import rounds

    args.log = _log
    funcs = {**{k[5:]: v for k, v in globals().items() if k.startswith("step_")}, **rounds.gpu_check_steps()}
    for s in steps:
        if s not in funcs:
            raise SystemExit(f"unknown step {s!r}; steps: {', '.join(funcs)}")
        _log(f"== step {s}")
        t0 = time.time()
        try:
            r = funcs[s](out, args)
        except Exception as e:
            import traceback

            traceback.print_exc()
            r = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        r["seconds"] = round(time.time() - t0, 1)
        results[s] = r
        if not r.get("ok"):
            failed.append(s)
        (out / "gpu-check.json").write_text(json.dumps(results, indent=1, default=str))
    _log("summary: " + ", ".join(f"{k}={'ok' if v.get('ok') else 'FAILED'} ({v['seconds']} s)"
                                 for k, v in results.items()))
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
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-out"), help="results folder (default $OUT)")
    p.add_argument("--steps", default=None, help="comma list of steps (default env,tests,sanitizer,occupancy,q6k)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--sweep-repeats", type=int, default=10)
    p.add_argument("--decompose-nt", type=int, default=3325)
    p.add_argument("--decompose-models", default="gemma,7b", help="comma list of gemma, 7b")
    p.add_argument("--fail-fast", action="store_true")
    p.add_argument("--sanitizer-timeout", type=int, default=240)
    p.add_argument("--kernel", default="auto", help="qmatmul kernel of the prefill/decompose steps (default auto)")
    p.add_argument("--ab", default="int8,auto", help="prefill_r7 variants: " + ", ".join(PREFILL_VARIANTS))
    p.add_argument("--old-kernels", default=None,
                   help="tile_ab: the kernel sources before the tile skeleton (default: git archive eef6c5d)")
    p.add_argument("--gemma", default=None, help="Gemma 3 270M GGUF path for prefill_r7 (default data/models/...)")
    p.set_defaults(func=main)
    q = sub.add_parser("import-runs", help="copy recorded runs from a GPU results folder into data/")
    q.add_argument("src")
    q.set_defaults(func=import_main)
