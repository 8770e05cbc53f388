"""The tile-skeleton refactor (one tile skeleton shared by the int8 GEMM kernels; behaviour to stay unchanged) on the
GPU: the GEMM and dequant kernels built from the sources of a reference commit (default ``eef6c5d``, before the
refactor) against the current ones, interleaved in one process at round 3's and round 4's shapes, both parity-gated on
the same inputs first.

Per (variant, shape, nt): rounds of OLD, NEW, OLD again (:func:`labkernels.bench.interleaved`); the ratio
NEW/OLD per round and the noise band, the largest |OLD'/OLD - 1| of any round (the same build timed against
itself). A point moved when its median NEW/OLD ratio is outside 1 +- max(noise, 0.5%). Recorded as a run of
``tile_ab`` (tables ``parity``, ``rounds``, ``summary``). ``labkernels gpu check --steps tile_ab``.
"""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import numpy as np

from ... import bench, cases, gpu, records
from ...paths import REPO_ROOT

#: the commit before the tile skeleton
OLD_REV = "eef6c5d"
#: round 3's and round 4's points: (variant, od, id, nt)
AB_CASES = ([(v, od, id_, nt) for v in ("q6k_generic", "q6k_expb_epi0", "q6k_expb_epi1")
             for od, id_ in ((4096, 4096), (11008, 4096), (4096, 11008)) for nt in (512, 4096)]
            + [(v, od, id_, nt) for v in ("q4k_nb_kdr4", "q4k_nb_kdr8")
               for od, id_ in ((4096, 4096), (11008, 4096)) for nt in (512, 4096)])
DEQUANT_CASES = (("q4_K", 11008, 4096), ("q6_K", 11008, 4096))
NOISE_FLOOR = 0.005


def old_kernels(dest: Path, rev: str = OLD_REV, src: Path | None = None) -> Path:
    """The kernel sources of ``rev``: a folder given (``src``, e.g. carried to a machine without git), else
    ``git archive`` of ``labkernels/kernels`` at ``rev`` into ``dest``."""
    if src is not None:
        src = Path(src)
        if not (src / "q6k_expb.cu").exists():
            raise FileNotFoundError(f"{src}: not a kernels folder (no q6k_expb.cu)")
        return src
    try:
        tar = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", rev, "labkernels/kernels"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"cannot read the kernels of {rev} with git ({e}); give --old-kernels DIR "
                           f"(git archive {rev} labkernels/kernels | tar -x --strip-components=2 -C DIR)") from None
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(dest)
    return dest / "labkernels" / "kernels"


def _rounds_rows(res, key: dict) -> list[dict]:
    rows = []
    for r, (o, n, o2) in enumerate(zip(res["old"], res["new"], res["old_again"])):
        rows.append({**key, "round": r, "old_us": o["median_us"], "new_us": n["median_us"],
                     "old_again_us": o2["median_us"], "ratio": n["median_us"] / o["median_us"],
                     "self_ratio": o2["median_us"] / o["median_us"]})
    return rows


def _summary(rows, key: dict) -> dict:
    ratio = float(np.median([r["ratio"] for r in rows]))
    noise = max(max(abs(r["self_ratio"] - 1) for r in rows), NOISE_FLOOR)
    return {**key, "median_ratio": ratio, "noise": noise, "moved": bool(abs(ratio - 1) > noise),
            "old_us": float(np.median([r["old_us"] for r in rows])),
            "new_us": float(np.median([r["new_us"] for r in rows]))}


def record(run, old_dir: Path, pairs: int = 5, repeats: int = 20, progress=print, cases_=AB_CASES) -> list[dict]:
    cp = gpu.cp()
    flush = bench.Flusher()
    out = []
    for variant, od, id_, nt in cases_:
        c = cases.Case(variant, nt, od, id_, seed=nt + od)
        old_fn = cases.launchers(c.w, cp.asarray(c.x), c.y, [variant], kernels_dir=old_dir)[variant]
        tokens = cases.gate_tokens(c.rng, nt)
        refs = cases.references(c.w_raw, c.qtype, c.x, tokens)
        for build, fn in (("old", old_fn), ("new", c.fn)):
            cases.gate_launch(fn, c.y, refs, f"{build} {variant} {od}x{id_} nt={nt}", run, f"{build}:{variant}")
        res = bench.interleaved({"old": old_fn, "new": c.fn, "old_again": old_fn}, pairs=pairs, repeats=repeats,
                                flush=flush)
        key = {"kernel": variant, "od": od, "id": id_, "nt": nt}
        rows = _rounds_rows(res, key)
        run.append("rounds", rows)
        out.append(_summary(rows, key))
        run.append("summary", out[-1])
        progress(f"tile_ab {variant} {od}x{id_} nt={nt}: new/old {out[-1]['median_ratio']:.4f} "
                 f"(noise {out[-1]['noise']:.4f}){' MOVED' if out[-1]['moved'] else ''}")
    for qtype, od, id_ in DEQUANT_CASES:
        c_raw = cases.synthetic_weights(qtype, od, id_, np.random.default_rng(od))
        w = gpu.QWeight.upload(c_raw, qtype)
        fns = {b: (lambda d=d: gpu.dequant_f16(w, kernels_dir=d)) for b, d in (("old", old_dir), ("new", None))}
        y_old, y_new = cp.asnumpy(fns["old"]()), cp.asnumpy(fns["new"]())
        same = bool(np.array_equal(y_old.view(np.uint16), y_new.view(np.uint16)))
        run.append("parity", {"variant": f"dequant_{qtype}", "od": od, "id": id_, "nt": 0, "tokens_checked": 0,
                              "rows_checked": od, "max_rel_err": 0.0 if same else float("nan"), "nmse": None,
                              "nonfinite": 0, "ok": same})
        if not same:
            raise cases.GateError(f"dequant {qtype}: the new build's fp16 output differs from the old one's")
        res = bench.interleaved({"old": fns["old"], "new": fns["new"], "old_again": fns["old"]}, pairs=pairs,
                                repeats=repeats, flush=flush)
        key = {"kernel": f"dequant_f16_{qtype}", "od": od, "id": id_, "nt": 0}
        rows = _rounds_rows(res, key)
        run.append("rounds", rows)
        out.append(_summary(rows, key))
        run.append("summary", out[-1])
        progress(f"tile_ab dequant {qtype}: new/old {out[-1]['median_ratio']:.4f} (noise {out[-1]['noise']:.4f})")
    return out


def step_tile_ab(out, args) -> dict:
    """``gpu check --steps tile_ab [--old-kernels DIR]``: old vs new kernel builds, interleaved, recorded."""
    with tempfile.TemporaryDirectory() as tmp:
        old = old_kernels(Path(tmp), src=getattr(args, "old_kernels", None))
        with records.recording("tile_ab", {"old_rev": OLD_REV, "old_kernels": str(old), "pairs": 5,
                                           "repeats": args.repeats}, root=out / "data") as run:
            summ = record(run, old, repeats=args.repeats, progress=args.log)
            moved = [s for s in summ if s["moved"]]
            run.set_summary(points=len(summ), moved=len(moved),
                            worst=max(summ, key=lambda s: abs(s["median_ratio"] - 1)))
    return {"ok": True, "run": run.run_id, "moved": [f"{s['kernel']}@{s['od']}x{s['id']} nt={s['nt']}" for s in moved]}
