"""GEMM cases and the one parity gate, shared by the benchmarks (:mod:`labkernels.bench`), the forensics
driver (:mod:`labkernels.rounds.r06_forensics.forensics_driver`) and the GPU tests (``tests/gpu``).

* :func:`synthetic_weights`: realistic quantized weights fast (a few reference-quantized rows, tiled);
* :func:`references` + :func:`gate`: the parity gate -- a GPU output (all rows, optionally a subset of tokens)
  against the exact integer reference (max |y - ref| / max |ref| <= 1e-3) and the float64 dequantized one
  (NMSE <= 5e-4); :func:`check` records it in a run and raises on failure, :func:`gate_launch` poisons the
  output with NaN and launches first;
* :func:`launchers`: zero-argument launches of named kernel variants (``registry.VARIANTS``) on one weight,
  each fed the activation format its variant takes (prepass tiles or ggml q8_1 rows, made once);
* :class:`Case`: one matched-shape case (weights, activations, output, the launch of one variant).

Nothing here imports cupy at module level.
"""

from __future__ import annotations

import numpy as np

from . import gpu, quants, reference
from .kernels import registry


class GateError(AssertionError):
    """A kernel's output failed the parity gate: no timing or counter of it may be trusted."""


def synthetic_weights(qtype: str, od: int, id_: int, rng, base_rows: int = 256) -> np.ndarray:
    """Realistic quantized weights fast: quantize ``base_rows`` Gaussian rows with the reference quantizer
    and tile them to od rows (timing does not depend on which valid values the blocks hold)."""
    base = quants.quantize((rng.standard_normal((min(base_rows, od), id_)) * 0.02).astype(np.float32), qtype)
    reps = -(-od // base.shape[0])
    return np.ascontiguousarray(np.tile(base, (reps, 1))[:od])


def gate_tokens(rng, nt: int, n: int = 24) -> np.ndarray:
    """The tokens a gate checks: ``min(nt, n)`` distinct rows of the activations, drawn from ``rng``, sorted."""
    return np.sort(rng.choice(nt, size=min(nt, n), replace=False))


def point_inputs(rng, nt: int, od: int, id_: int) -> tuple:
    """A timed point's inputs, drawn from ``rng``: (x float32 [nt, id] on the host, x on the device, its fp16 copy,
    a NaN-filled float32 output [nt, od], the gate's tokens)."""
    cp = gpu.cp()
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    xg = cp.asarray(x)
    return x, xg, xg.astype(cp.float16), cp.full((nt, od), np.nan, cp.float32), gate_tokens(rng, nt)


def references(w_raw, qtype: str, x, tokens=None, stride: int | None = None, f64: str = "required") -> dict:
    """Both references of the gate, once per (weights, inputs): the exact integer one and the float64
    dequantized one of the GGUF rows ``w_raw`` (block ``stride``) on the ``tokens`` of ``x`` (all when None).
    ``f64``: "required" (needs gguf-py), or "optional" (without gguf, the integer reference alone)."""
    if f64 not in ("required", "optional"):
        raise ValueError(f"f64 must be 'required' or 'optional', got {f64!r}")
    x = np.asarray(x)
    xs = x if tokens is None else x[tokens]
    ref = reference.gemm_int_ref(w_raw, qtype, reference.quantize_activations(xs), stride=stride)
    try:
        ref64 = reference.gemm_f64_ref(w_raw, qtype, xs, stride=stride)
    except ImportError:
        if f64 == "required":
            raise
        ref64 = None
    return {"int": ref, "f64": ref64, "tokens": tokens, "od": int(np.asarray(w_raw).shape[0]), "id": int(x.shape[1]),
            "nt": int(x.shape[0])}


def gate(y, refs: dict) -> dict:
    """THE parity gate: output ``y`` [nt, od] (host or cupy; the references' tokens are taken) against
    :func:`references`: max |y - ref| / max |ref| <= 1e-3 (integer), NMSE <= 5e-4 (float64), all finite."""
    y = np.asarray(y.get() if hasattr(y, "get") else y)
    if refs["tokens"] is not None:
        y = y[refs["tokens"]]
    g = reference.parity(y, refs["int"], refs["f64"])
    g["tokens"] = int(refs["int"].shape[0])
    return g


def record_gate(run, variant: str, g: dict, refs: dict) -> None:
    """Every gate result is data: a run's benchmark tables are only written after it passed."""
    if run is not None:
        run.append("parity", {"variant": variant, "od": refs["od"], "id": refs["id"], "nt": refs["nt"],
                              "tokens_checked": g["tokens"], "rows_checked": refs["od"],
                              "max_rel_err": g["max_rel_err"], "nmse": g.get("nmse"), "nonfinite": g["nonfinite"],
                              "ok": g["ok"]})


def check(y, refs: dict, what: str, run=None, variant: str | None = None) -> dict:
    """:func:`gate`, recorded in ``run`` (table ``parity``) when ``variant`` is named; raises
    :class:`GateError` (message ``parity failed for WHAT: ...``) on a failed gate."""
    g = gate(y, refs)
    if variant is not None:
        record_gate(run, variant, g, refs)
    if not g["ok"]:
        raise GateError(f"parity failed for {what}: {g}")
    return g


def gate_launch(fn, y, refs: dict, what: str, run=None, variant: str | None = None) -> dict:
    """Fill ``y`` with NaN, launch ``fn`` once and :func:`check` its output."""
    y.fill(np.nan)
    fn()
    return check(y, refs, what, run, variant)


def launchers(w, xg, y, variants, kernels_dir=None) -> dict:
    """{variant name: zero-argument launch writing ``y``} for :class:`registry.Variant` s (or names) on the
    uploaded weight ``w`` and the cupy activations ``xg``; each activation format is made once. ``kernels_dir``:
    build the GEMMs from another folder of the same sources (:func:`labkernels.gpu.module`)."""
    vs = [registry.variant(v) if isinstance(v, str) else v for v in variants]
    nt = xg.shape[0]
    acts = {}
    for v in vs:
        if v.act not in acts:
            if v.act == "q8_1_tiles":
                acts[v.act] = gpu.prepass(xg)
            elif v.act == "q8_1_rows":
                acts[v.act] = gpu.quantize_q8_1_rows(xg)
            else:
                raise ValueError(f"{v.name}: no activation setup for format {v.act!r}")
    out = {}
    for v in vs:
        a = acts[v.act]
        if v.act == "q8_1_rows":
            out[v.name] = lambda a=a: gpu.gemm_generic_q6k(w, a, nt, out=y, kernels_dir=kernels_dir)
        else:
            out[v.name] = lambda a=a, v=v: gpu.gemm(w, a, v.name, out=y, kernels_dir=kernels_dir)
    return out


class Case:
    """A set-up case: synthetic weights of the variant's type at (od, id), activations [nt, id], a NaN output
    and ``fn``, a zero-argument launch of the variant; :meth:`gate` checks one launch on 24 tokens."""

    def __init__(self, variant: str, nt: int, od: int, id_: int, seed: int = 0, stride: int | None = None):
        import cupy as cp

        self.variant = registry.variant(variant)
        self.qtype, self.nt, self.od, self.id = self.variant.qtype, nt, od, id_
        self.rng = np.random.default_rng(seed)
        self.w_raw = synthetic_weights(self.qtype, od, id_, self.rng)
        self.stride = stride if self.qtype == "q6_K" else None
        self.w = gpu.QWeight.upload(self.w_raw, self.qtype, self.stride)
        self.x = self.rng.standard_normal((nt, id_)).astype(np.float32)
        self.y = cp.full((nt, od), np.nan, cp.float32)
        self.fn = launchers(self.w, cp.asarray(self.x), self.y, [self.variant])[self.variant.name]
        cp.cuda.runtime.deviceSynchronize()

    def gate(self, f64: str = "optional") -> dict:
        """Gate one launch's output on 24 random tokens (all rows); returns the gate (``ok`` may be False)."""
        tokens = gate_tokens(self.rng, self.nt)
        self.y.fill(np.nan)
        self.fn()
        return gate(self.y, references(self.w_raw, self.qtype, self.x, tokens, f64=f64))
