"""Recorded tables that the product reads (issue 42): round 8's best-variant table (:func:`best_variants`,
:func:`pick_variant`), read through the records layer. Split from ``sweep.py`` (which records the table and keeps
every name) so that :mod:`labkernels.dispatch` reads it without importing the sweep machinery."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from . import records

#: the series of a sweep's summary run (tables ``tasks``, ``best_variants``)
SUMMARY_ROUND = "sweeps"


def shape_class(od: int, id_: int) -> str:
    """square (od/id within 2x), tall (od > 2 id: e.g. FFN up/gate) or deep (id > 2 od: FFN down)."""
    r = od / id_
    return "square" if 0.5 <= r <= 2 else ("tall" if r > 2 else "deep")


def best_variants(gpu_model: str | None = None, qtype: str | None = None, root=None,
                  backend: str | None = "gpu") -> pd.DataFrame:
    """The recorded best-variant table: for every (GPU model, qtype, shape class, nt) the row of the most
    recent complete sweep that measured it (with its ``sweep_run``); filtered by GPU model (substring,
    case-insensitive), qtype and backend (``gpu``; ``cpu`` for stand-in sweeps; None for both)."""
    root = Path(root) if root else records.data_root()
    frames = []
    for r in records.list_runs(SUMMARY_ROUND, root):
        if r.has("best_variants"):
            frames.append(r.table("best_variants").assign(sweep_run=r.run_id))
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True).sort_values("sweep_run")
    df = df.drop_duplicates(["gpu_model", "qtype", "shape_class", "nt", "backend"], keep="last")
    if gpu_model:
        df = df[df.gpu_model.str.lower().str.contains(gpu_model.lower(), regex=False)]
    if qtype:
        df = df[df.qtype == qtype]
    if backend:
        df = df[df.backend == backend]
    return df.sort_values(["gpu_model", "qtype", "shape_class", "nt"]).reset_index(drop=True)


def pick_variant(qtype: str, od: int, id_: int, nt: int, gpu_model: str, table: pd.DataFrame | None = None,
                 root=None) -> dict:
    """What ``kernel="auto"`` runs: the recorded best variant for this GPU model, qtype and shape class at the
    measured nt nearest to ``nt`` (in log2). Raises LookupError when nothing was recorded for it."""
    df = best_variants(gpu_model, qtype, root=root) if table is None else table
    cls = shape_class(od, id_)
    df = df[(df.qtype == qtype) & (df.shape_class == cls)] if not df.empty else df
    if gpu_model and not df.empty:
        df = df[df.gpu_model.str.lower().str.contains(gpu_model.lower(), regex=False)]
    if df.empty:
        raise LookupError(f"no recorded best variant for {gpu_model!r} {qtype} {cls} (od={od}, id={id_}); "
                          "run a sweep of that GPU model first")
    row = df.iloc[int(np.argmin(np.abs(np.log2(df.nt.to_numpy(float)) - math.log2(nt))))]
    return {"family": row.family, "params": json.loads(row.params), "kernel": row.kernel, "nt_measured": int(row.nt),
            "shape_class": cls, "gpu_model": row.gpu_model, "sweep_run": row.get("sweep_run")}
