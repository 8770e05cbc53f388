"""The one user-facing GEMM entry: :func:`qmatmul` and the ``auto`` choice (:func:`choose`, :func:`last_choice`).

Split from ``gpu.py`` (issue 42): ``gpu`` builds and launches kernels; this module picks a family and its
parameters -- from round 7's recorded ``wgmma`` runs, round 9's recorded GEMV crossover and round 8's recorded
sweeps (read through :mod:`labkernels.recorded_tables` and the records layer), or a stated rule without them --
and calls the launcher. Callers name this module (``gpu`` no longer forwards ``qmatmul`` & co. here).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import errors, gemv, gpu, recorded_tables, wgmma
from .kernels import registry


#: what ``qmatmul(kernel=...)`` accepts: every GEMM family of the lab, or "auto"
QMATMUL_KERNELS = ("auto", "gemv_kq", "wgmma_kq", "int8", "q4k_nb", "q6k_expb", "q6k_generic")


@dataclass(frozen=True)
class Choice:
    family: str
    params: tuple      # ((name, value), ...)
    reason: str

    def describe(self) -> str:
        p = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.family}[{p}] ({self.reason})"


def _int8_default(qtype: str) -> tuple[str, dict]:
    """The int8 family of a weight type and its parameters: ``registry.default_variant(qtype)``."""
    v = registry.default_variant(qtype)
    return v.family, v.p


#: the fields of a wgmma variant (:class:`labkernels.wgmma.Variant`) a recorded choice's params may hold
_VARIANT_FIELDS = frozenset(f.name for f in dataclasses.fields(wgmma.Variant))


def choose(qtype: str, nt: int, od: int, id_: int, table=None, cc: int | None = None) -> Choice:
    """The ``auto`` choice (see :func:`_choose`); memoized per process for the recorded table, since the prefill
    asks once per weight per forward (a pandas lookup each time cost ~1 ms x 225 GEMMs = 0.17 s a 7B prefill)."""
    gpu.check_gemm_shape(qtype, nt, od, id_, "choose")
    if cc is not None and (isinstance(cc, bool) or not isinstance(cc, (int, np.integer)) or cc < 0):
        raise errors.ShapeError(f"choose: cc {cc!r} is a compute capability as an integer (90 for sm_90; 0: no GPU), "
                                "or None for this machine's")
    if table is not None:
        need = {"qtype", "family", "od", "id", "nt", "params", "run_id"}
        cols = set(getattr(table, "columns", ()))
        if not hasattr(table, "loc") or (len(table) and not need <= cols):
            raise errors.ShapeError(f"choose: table is a DataFrame with columns {sorted(need)} (wgmma.auto_table()), got "
                                    f"{type(table).__name__}" + (f" lacking {sorted(need - cols)}" if hasattr(table, 'loc') else ""))
        return _choose(qtype, nt, od, id_, table, cc)
    return _choose_cached(qtype, int(nt), int(od), int(id_), cc)


@lru_cache(maxsize=4096)
def _choose_cached(qtype, nt, od, id_, cc):
    return _choose(qtype, nt, od, id_, None, cc)


def _choose(qtype: str, nt: int, od: int, id_: int, table=None, cc: int | None = None) -> Choice:
    """The ``auto`` choice: the fastest family recorded by round 7 (``wgmma`` runs, data/07_wgmma_kquant/, latest complete) at the
    nearest recorded (od, id) shape class (log distance) and nearest nt, among those that run on this device;
    without a recorded run, a stated rule. Always says why."""
    if cc is None:
        cc = gpu.device_props()["cc"] if gpu._has_gpu() else 0
    table = wgmma.auto_table_cached() if table is None else table
    if table is not None and len(table):
        rows = table[(table.qtype == qtype)]
        if not wgmma.supported(cc):
            rows = rows[~rows.family.eq("wgmma_kq")]
        if len(rows):
            d = (np.log(rows.od / od) ** 2 + np.log(rows.id / id_) ** 2 + 0.25 * np.log(rows.nt / nt) ** 2)
            r = rows.loc[d.idxmin()]
            params = tuple((k, int(v)) for k, v in r.params.items())
            why = f"fastest at {r.od}x{r.id} nt={r.nt} in run {r.run_id}"
            sm = gpu.device_props()["sm_count"] if gpu._has_gpu() else 132
            if r.family == "wgmma_kq":
                # the recorded variant, typed (its params as auto_table read them from the name once), made to fit
                # this shape by the one table of scheduler / epilogue fit rules that gemm enforces (wgmma.FIT_RULES);
                # each fallback is said in the reason
                v = wgmma.Variant(**{k: val for k, val in params if k in _VARIANT_FIELDS})
                v, whys = wgmma.fit(v, nt, od, id_, sm)
                why += "".join(f"; {w}" for w in whys)
                params = tuple((k, int(getattr(v, k)) if k in _VARIANT_FIELDS else val) for k, val in params)
            ch = Choice(r.family, params, why)
            return ch if r.family == "wgmma_kq" else _with_sweep_variant(ch, qtype, nt, od, id_)
    if wgmma.supported(cc):
        return Choice("wgmma_kq", tuple(wgmma.default_params(qtype, nt).items()),
                      "rule (no recorded round-7 run): wgmma on sm_90, BN=256 from nt=1024")
    fam, par = _int8_default(qtype)
    where = f"sm_{cc} has no wgmma" if cc else "no GPU here to run wgmma on"
    return _with_sweep_variant(Choice(fam, tuple(par.items()), f"rule: the int8 family ({where})"),
                               qtype, nt, od, id_)


def _with_sweep_variant(ch: Choice, qtype: str, nt: int, od: int, id_: int, table=None) -> Choice:
    """An int8 family's variant from the recorded Dask sweeps (``sweeps`` runs, data/08_dask_sweeps/: best variant per GPU model, qtype,
    shape class and nt, ranked inside each task's interleaved pairs) when one covers this GPU model, family and
    shape class; the family's registry default otherwise. Which one is said in the reason."""
    if table is None and not gpu._has_gpu():
        return ch   # no device to name: the recorded tables are per GPU model
    try:
        gpu_model = gpu.device_props()["name"] if table is None else None
        df = recorded_tables.best_variants(gpu_model) if table is None else table
        df = df[df.family == ch.family] if len(df) else df
        if len(df) == 0:
            return ch            # no sweep recorded this family on this GPU model
        pick = recorded_tables.pick_variant(qtype, od, id_, nt, gpu_model or "", table=df)
    except Exception as e:   # pick_variant's "no row for this shape class" is the one expected case
        if type(e) is LookupError:
            return ch
        # a GPU query, a data folder or a table that cannot be read: say so, keep the default
            logging.getLogger("labkernels.gpu").warning("sweep best-variant table not used: %s", e)
        return Choice(ch.family, ch.params, ch.reason + f"; sweep best-variant table not used ({type(e).__name__}: {e})")
    par = {k: int(v) for k, v in pick["params"].items() if k != "STRIDE"}   # the weight's own row stride wins
    return Choice(ch.family, tuple({**dict(ch.params), **par}.items()),
                  ch.reason + f"; variant {pick['kernel']} from sweep {pick['sweep_run']} "
                              f"({pick['shape_class']}, nt={pick['nt_measured']})")


def qmatmul(x, w: gpu.QWeight, kernel: str = "auto", out=None, **params):
    """Y[nt, od] (float32) = x[nt, id] * W^T for a q4_K / q6_K ``QWeight``.

    ``x``: cupy float32 or float16 [nt, id]. ``kernel``: a family of the lab (``wgmma_kq`` -- round 7, sm_90a;
    ``q4k_nb`` / ``q6k_expb`` / ``q6k_generic`` -- the int8 q8_1 families; ``int8``: the best int8 family of the
    weight's type) or ``"auto"`` (see :func:`choose`);
    ``params`` override the family's template parameters. The choice is logged (logger ``labkernels.gpu``) and
    kept for :func:`last_choice`. Shapes or families that cannot take the input raise; nothing falls back."""
    if not isinstance(kernel, str) or kernel not in QMATMUL_KERNELS:
        raise errors.ShapeError(f"unknown kernel {kernel!r}: one of {', '.join(QMATMUL_KERNELS)}")
    if not isinstance(w, gpu.QWeight):
        raise errors.ShapeError(f"qmatmul takes a QWeight (gpu.QWeight.upload(raw, qtype)), got {type(w).__name__}")
    if kernel == "int8":
        kernel = _int8_default(w.qtype)[0]
    if isinstance(x, gpu.Q8Tiles):     # a prepass shared between calls: the int8 families only
        if kernel not in ("q4k_nb", "q6k_expb"):
            raise errors.ShapeError(f"q8_1 tiles are the input of q4k_nb / q6k_expb, not of {kernel!r}")
        if x.id != w.id:
            raise errors.ShapeError(f"inner dimensions differ: activations id={x.id}, weights id={w.id}")
        nt = x.nt
    else:
        x = gpu._check_act(x)
        if x.shape[1] != w.id:
            raise errors.ShapeError(f"inner dimensions differ: activations id={x.shape[1]}, weights id={w.id}")
        nt = x.shape[0]
    if kernel == "auto":
        ch = None
        if not isinstance(x, gpu.Q8Tiles) and gpu._has_gpu() and gpu.device_props()["cc"] >= 80:   # round 9's recorded crossover
            dec = gemv.recorded_choice(w.qtype, nt, w.od, w.id, "f16" if x.dtype == np.float16 else "f32")
            if dec is not None:
                ch = Choice("gemv_kq", tuple(dec[0].items()), dec[1])
        ch = ch or choose(w.qtype, nt, w.od, w.id)
    elif kernel == "gemv_kq":
        if isinstance(x, gpu.Q8Tiles):
            raise errors.ShapeError("gemv_kq reads float16 / float32 activations, not q8_1 tiles")
        cfg = gemv.recorded_config(w.qtype, nt, w.od, w.id, "f16" if x.dtype == np.float16 else "f32")
        ch = Choice("gemv_kq", tuple(cfg[0].items()), cfg[1])
    elif kernel == "wgmma_kq":
        ch = Choice("wgmma_kq", tuple(wgmma.default_params(w.qtype, nt).items()), "named")
    else:
        v = registry.default_variant(kernel)          # the family's default variant
        if v.qtype != w.qtype:
            raise errors.ShapeError(f"{kernel} takes {v.qtype} weights, got {w.qtype}")
        ch = Choice(kernel, v.params, f"named (variant {v.name})")
    if params:
        ch = Choice(ch.family, tuple({**dict(ch.params), **params}.items()), ch.reason + ", params overridden")
    logging.getLogger("labkernels.gpu").info("qmatmul %s x %s %dx%d nt=%d -> %s", getattr(x, "dtype", "q8_1"),
                                             w.qtype, w.od, w.id, nt, ch.describe())
    _LAST["choice"] = ch
    p = dict(ch.params)
    if ch.family == "gemv_kq":
        if isinstance(x, gpu.Q8Tiles):
            raise errors.ShapeError("gemv_kq reads float16 / float32 activations, not q8_1 tiles")
        return gemv.gemv(w, x, out=out, **p)
    if ch.family == "wgmma_kq":
        wgmma.require_sm90a()
        if w.wg is None:
            if w.host is None:   # the GGUF rows as given (a 224-byte q6_K upload keeps the 210-byte rows too)
                raise errors.ShapeError("wgmma_kq needs the GGUF rows of the weight (QWeight.upload keeps them)")
            w.wg = wgmma.WgWeight.from_gguf(np.asarray(w.host), w.qtype)
        if p.get("FORM") and w.wg.gguf is None and w.qtype == "q4_K":
            w.wg.gguf = w.raw    # the shared-memory form reads the uploaded GGUF rows as they are
        return wgmma.gemm(w.wg, x, out=out, **p)
    if ch.family == "q6k_generic":
        if x.dtype != np.float32:
            x = x.astype(gpu.cp().float32)
        return gpu.gemm_generic_q6k(w, gpu.quantize_q8_1_rows(x), nt, out=out)
    return gpu.gemm(w, x if isinstance(x, gpu.Q8Tiles) else gpu.prepass(x), ch.family, out=out, **p)


_LAST = {"choice": None}


def last_choice() -> Choice | None:
    """The family (and why) that the latest :func:`qmatmul` call ran."""
    return _LAST["choice"]
