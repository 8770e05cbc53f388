"""One matched-shape GEMM case per process, for Nsight Compute (``labkernels.rounds.r06_forensics.forensics``).

``python3 -m labkernels.rounds.r06_forensics.forensics_driver --case NAME [--shape NTxODxID]`` sets up one case (synthetic
weights, activations and the launch from :class:`labkernels.cases.Case`), then launches the target
kernel in a fixed, known order:

1. ``warmup`` launches (the first one's output is parity-gated against the CPU references unless
   ``--no-parity``: a counter reading of a kernel that computes wrong carries no evidence);
2. ``repeats`` launches timed with CUDA events, the L2 flushed before each (:mod:`labkernels.bench`);
3. exactly ONE target launch, inside the NVTX push/pop range ``labkernels@target`` (``nvtx`` package; without
   it the range is a no-op and the count below selects the launch).

Every other launch (prepass, q8_1 rows, the L2 flush) is another kernel, so ncu's
``--kernel-name regex:<template>`` together with ``--launch-skip warmup+repeats --launch-count 1`` picks
exactly the target launch (:func:`launch_plan`); with ``nvtx`` installed ncu's ``--nvtx-include labkernels@target/``
picks it by name instead (skip 0). The process prints one JSON line
``{"forensics_case": ...}`` with the case's nt/od/id/MACs, kernel and the event timings.

``--ab BASE VARIANT`` (no ncu) times two variants interleaved in one process (BASE, VARIANT, BASE again
per round, :func:`labkernels.bench.interleaved`) after gating both: the BASE-vs-BASE ratio of each round is
the noise band the counter-evidence verdict needs. It prints ``{"forensics_ab": ...}``.

``--describe`` prints the case spec and launch plan without touching a GPU.

Nothing here imports cupy at module level: :func:`case_spec` and :func:`launch_plan` run on any machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ... import bench, cases
from ...kernels import registry
from ...kernels.registry import BM, BN
from . import ncu_rep

#: the kernel variants of this round (names of ``registry.VARIANTS``: family, template parameters, mma shape)
CASES = ("q6k_generic", "q6k_expb_epi0", "q6k_expb_epi1_occ2", "q6k_expb_epi1", "q4k_nb_kdr4")

#: matched shapes (nt x od x id): a q-proj-class square GEMM and a down-proj-class one (id = 11008)
DEFAULT_SHAPES = ("3328x4096x4096", "3328x4096x11008")

class CaseError(ValueError):
    pass


def parse_shape(shape) -> tuple[int, int, int]:
    """'NTxODxID' (or a 3-tuple) -> (nt, od, id); id must be a multiple of 256 (k-quant super-blocks)."""
    if isinstance(shape, str):
        parts = shape.lower().replace("*", "x").split("x")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise CaseError(f"shape {shape!r}: expected NTxODxID, e.g. 3328x4096x4096")
        nt, od, id_ = (int(p) for p in parts)
    else:
        nt, od, id_ = (int(v) for v in shape)
    if min(nt, od, id_) < 1:
        raise CaseError(f"shape {shape!r}: dimensions must be >= 1")
    if id_ % 256:
        raise CaseError(f"shape {shape!r}: id={id_} is not a multiple of 256 (q4_K/q6_K super-blocks)")
    return nt, od, id_


def shape_name(nt: int, od: int, id_: int) -> str:
    return f"{nt}x{od}x{id_}"


def kernel_spec(variant: str) -> registry.KernelSpec:
    return _variant(variant).spec()        # q6_K at the natural 210-byte stride (the lab's main path)


def _variant(variant: str) -> registry.Variant:
    if variant not in CASES:
        raise CaseError(f"unknown case {variant!r}; cases: {', '.join(CASES)}")
    return registry.variant(variant)


def case_spec(variant: str, shape=DEFAULT_SHAPES[0]) -> dict:
    """Everything known about a case before it runs: shape, MACs (logical and as the tiles compute them),
    the registry instantiation, and the kernel-name regex ncu filters on (``--kernel-name-base function``:
    the bare template name; the demangled name printed in ncu's CSV carries the template arguments)."""
    v = _variant(variant)
    nt, od, id_ = parse_shape(shape)
    spec = kernel_spec(variant)
    tiles_m, tiles_n = -(-nt // BM), -(-od // BN)
    macs = nt * od * id_
    # the kernels run every mma of a tile unconditionally (only the stores are guarded), so the tensor
    # cores do the padded tiles' work: that is what the IMMA counters must equal
    macs_padded = tiles_m * BM * tiles_n * BN * id_
    return {
        "case": f"{variant}@{shape_name(nt, od, id_)}", "variant": variant, "shape": shape_name(nt, od, id_),
        "nt": nt, "od": od, "id": id_, "qtype": v.qtype, "family": v.family,
        "params": spec.p, "kernel_key": spec.key, "template": spec.template,
        "name_expression": spec.name_expression, "kernel_regex": spec.template,
        "mma_k": v.mma_k, "macs": macs, "macs_padded": macs_padded, "gmac": macs / 1e9,
        "grid": [tiles_m, tiles_n, 1], "block": [spec.threads, 1, 1], "doc": v.doc,
    }


def launch_plan(warmup: int = 2, repeats: int = 10, nvtx: bool = False) -> dict:
    """Launches of the target kernel before the profiled one (ncu --launch-skip) and the profiled count. ``nvtx``:
    the launch is selected by the NVTX range around it (``nvtx_include``), the skip is 0."""
    if warmup < 1:
        raise CaseError("warmup must be >= 1 (the first warm-up launch is the parity-gated one)")
    if repeats < 0:
        raise CaseError("repeats must be >= 0")
    if nvtx:
        return {"warmup": int(warmup), "repeats": int(repeats), "launch_skip": 0, "launch_count": 1,
                "nvtx_include": ncu_rep.target_include()}
    return {"warmup": int(warmup), "repeats": int(repeats), "launch_skip": int(warmup) + int(repeats),
            "launch_count": 1}


# ------------------------------------------------------------------ GPU side


def _case(variant: str, shape, seed: int = 0):
    spec = case_spec(variant, shape)
    c = cases.Case(variant, spec["nt"], spec["od"], spec["id"], seed=seed)
    c.spec = spec
    return c


def run_case(variant: str, shape, warmup: int = 2, repeats: int = 10, parity: bool = True,
             seed: int = 0) -> dict:
    """Warm-up (first launch parity-gated), timed launches, then exactly one target launch."""
    import cupy as cp

    plan = launch_plan(warmup, repeats)
    t0 = time.time()
    c = _case(variant, shape, seed)
    gate = None
    for i in range(warmup):
        if i == 0 and parity:
            gate = c.gate()
            if not gate["ok"]:
                raise AssertionError(f"parity failed for {c.spec['case']}: {gate}")
        else:
            c.fn()
    cp.cuda.runtime.deviceSynchronize()
    timing = None
    if repeats:
        flush = bench.Flusher()
        us = bench.time_launches(c.fn, warmup=0, repeats=repeats, flush=flush)
        timing = {**bench.stats(us), "samples_us": [round(float(u), 3) for u in us]}
        del flush
        cp.get_default_memory_pool().free_all_blocks()  # less device memory for ncu to save/restore
    cp.cuda.runtime.deviceSynchronize()
    with ncu_rep.nvtx_range(ncu_rep.NVTX_TARGET):   # ncu --nvtx-include selects it by this range (target_include)
        c.fn()  # THE profiled launch
        cp.cuda.runtime.deviceSynchronize()
    finite = bool(cp.isfinite(c.y).all())
    return {"forensics_case": c.spec["case"], **c.spec, **plan, "parity": gate, "timing": timing,
            "target_output_finite": finite, "seconds": round(time.time() - t0, 2)}


def run_ab(base: str, variant: str, shape, pairs: int = 5, repeats: int = 20, warmup: int = 3,
           seed: int = 0) -> dict:
    """Interleaved timing BASE, VARIANT, BASE' per round in one process; both parity-gated first."""
    cb, cv = _case(base, shape, seed), _case(variant, shape, seed)
    gates = {base: cb.gate(), variant: cv.gate()}
    for name, g in gates.items():
        if not g["ok"]:
            raise AssertionError(f"parity failed for {name}@{shape}: {g}")
    res = bench.interleaved({"base": cb.fn, "variant": cv.fn, "base_again": cb.fn}, pairs=pairs,
                            repeats=repeats, warmup=warmup, flush=bench.Flusher())
    rounds = []
    for r in range(pairs):
        b, v, b2 = (res[k][r]["median_us"] for k in ("base", "variant", "base_again"))
        rounds.append({"round": r, "base_us": b, "variant_us": v, "base_again_us": b2,
                       "ratio": v / b, "self_ratio": b2 / b})
    return {"forensics_ab": f"{base}->{variant}@{cb.spec['shape']}", "base": base, "variant": variant,
            "shape": cb.spec["shape"], "pairs": pairs, "repeats": repeats, "rounds": rounds,
            "parity": gates}


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m labkernels.rounds.r06_forensics.forensics_driver", description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=list(CASES), help="the kernel variant to launch")
    ap.add_argument("--ab", nargs=2, metavar=("BASE", "VARIANT"), help="interleaved A/B timing, no ncu")
    ap.add_argument("--shape", default=DEFAULT_SHAPES[0], help="NTxODxID (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=5, help="--ab rounds")
    ap.add_argument("--no-parity", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--describe", action="store_true", help="print the spec and launch plan (no GPU)")
    args = ap.parse_args(argv)
    if args.ab:
        for name in args.ab:
            _variant(name)
        out = run_ab(args.ab[0], args.ab[1], args.shape, pairs=args.pairs, repeats=args.repeats, seed=args.seed)
    elif args.case:
        if args.describe:
            out = {"forensics_case": case_spec(args.case, args.shape)["case"], **case_spec(args.case, args.shape),
                   **launch_plan(args.warmup, args.repeats)}
        else:
            out = run_case(args.case, args.shape, args.warmup, args.repeats, not args.no_parity, args.seed)
    else:
        ap.error("give --case NAME or --ab BASE VARIANT")
    print(json.dumps(out, default=_json_default), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
