"""Recorded runs: GPU measurements are data, append-only, with run ids and provenance.

Layout (one folder per round, never rewritten by later runs)::

    data/<round>/<run_id>.json            metadata: run id, round, status, provenance, params, summary
    data/<round>/<run_id>.<table>.csv     tables, rows appended as the run goes (a sweep that dies
                                          half-way keeps the points it finished)

A run id is ``<UTC yyyymmddThhmmssZ>-<gpu or cpu>-<commit10>``, so ids sort by time. A run's files
are written only while it runs (status ``running``); once ``complete`` or ``failed`` they are frozen:
:func:`new_run` refuses to reuse an id and :class:`Run` refuses writes after :meth:`Run.finish`.
Replay mode renders :func:`latest` complete run of a round.

``LABKERNELS_DATA_DIR`` moves the root (the GPU machine writes under ``$OUT`` and the results are
copied into ``data/`` here with :func:`import_runs`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import provenance
from .paths import DATA_DIR

RUN_ID_RX = re.compile(r"^\d{8}T\d{6}Z-[A-Za-z0-9_.-]+$")


class RecordError(RuntimeError):
    pass


def data_root() -> Path:
    return Path(os.environ.get("LABKERNELS_DATA_DIR", DATA_DIR))


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "", s or "")[:16] or "x"


@dataclass
class Run:
    round: str
    run_id: str
    root: Path
    meta: dict

    @property
    def dir(self) -> Path:
        return self.root / self.round

    @property
    def meta_path(self) -> Path:
        return self.dir / f"{self.run_id}.json"

    def table_path(self, table: str) -> Path:
        if not re.fullmatch(r"[a-z0-9_]+", table):
            raise RecordError(f"table name {table!r}: use lowercase letters, digits and _")
        return self.dir / f"{self.run_id}.{table}.csv"

    def _check_open(self):
        if self.meta.get("status") != "running":
            raise RecordError(f"run {self.run_id} is {self.meta.get('status')}: recorded runs are append-only")

    def append(self, table: str, rows) -> None:
        """Append rows (dict, list of dicts or DataFrame) to a table of this run, flushing to disk now."""
        self._check_open()
        df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame([rows] if isinstance(rows, dict) else rows)
        if df.empty:
            return
        p = self.table_path(table)
        header = not p.exists()
        if not header:
            cols = list(pd.read_csv(p, nrows=0).columns)
            if list(df.columns) != cols:
                missing = set(df.columns) ^ set(cols)
                if missing - set(cols):
                    raise RecordError(f"table {table}: new columns {sorted(missing - set(cols))} after rows were written")
                df = df.reindex(columns=cols)
        df.to_csv(p, mode="a", header=header, index=False)
        self.meta.setdefault("tables", [])
        if table not in self.meta["tables"]:
            self.meta["tables"].append(table)
            self._write_meta()

    def set_summary(self, **kv) -> None:
        self._check_open()
        self.meta.setdefault("summary", {}).update(kv)
        self._write_meta()

    def finish(self, status: str = "complete", **summary) -> None:
        self._check_open()
        if status not in ("complete", "failed"):
            raise RecordError(f"bad status {status}")
        self.meta.setdefault("summary", {}).update(summary)
        self.meta["status"] = status
        self.meta["finished"] = provenance.utc_now()
        if self.meta.get("provenance", {}).get("gpu"):
            # the clocks at the start may be idle clocks: record the state at the end of the work too
            self.meta["provenance"]["gpu_at_finish"] = provenance._nvidia_smi()
        self._write_meta()

    def _write_meta(self) -> None:
        tmp = self.meta_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.meta, indent=1, default=_json_default, sort_keys=False))
        tmp.replace(self.meta_path)

    # ---- reading
    def table(self, table: str) -> pd.DataFrame:
        p = self.table_path(table)
        if not p.exists():
            raise RecordError(f"run {self.run_id} of round {self.round} has no table {table!r} "
                              f"(tables: {self.meta.get('tables', [])})")
        return pd.read_csv(p)

    def has(self, table: str) -> bool:
        return self.table_path(table).exists()

    @property
    def provenance(self) -> dict:
        return self.meta.get("provenance", {})

    def describe(self) -> str:
        return f"run {self.run_id} ({self.meta.get('status')}): " + provenance.describe(self.provenance)


def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    return str(o)


def new_run(round_name: str, params: dict | None = None, root: Path | None = None, kind: str = "measure") -> Run:
    root = Path(root) if root else data_root()
    prov = provenance.collect(params)
    dev = _slug(prov["gpu"]["name"].replace("NVIDIA", "")) if prov.get("gpu") else "cpu"
    run_id = f"{prov['date'].replace('-', '').replace(':', '')}-{dev.lower()}-{provenance.short_commit()[:10]}"
    d = root / round_name
    d.mkdir(parents=True, exist_ok=True)
    base, n = run_id, 1
    while (d / f"{run_id}.json").exists():
        n += 1
        run_id = f"{base}-{n}"
    meta = {"run_id": run_id, "round": round_name, "kind": kind, "status": "running",
            "started": prov["date"], "provenance": prov, "params": params or {}, "tables": [], "summary": {}}
    run = Run(round_name, run_id, root, meta)
    run._write_meta()
    return run


@contextlib.contextmanager
def recording(round_name: str, params: dict | None = None, root: Path | None = None, kind: str = "measure"):
    """``with recording("q6k", params) as run: ...`` -- the run is finished ``complete`` when the block ends
    (unless the block finished it itself) and ``failed`` with the error when it raises; rows appended before
    a failure stay on disk."""
    run = new_run(round_name, params, root=root, kind=kind)
    try:
        yield run
    except BaseException as e:
        if run.meta.get("status") == "running":
            run.finish("failed", error=f"{type(e).__name__}: {e}"[:2000])
        raise
    if run.meta.get("status") == "running":
        run.finish()


def list_runs(round_name: str, root: Path | None = None, status: str | None = "complete") -> list[Run]:
    root = Path(root) if root else data_root()
    d = root / round_name
    runs = []
    if not d.is_dir():
        return runs
    for p in sorted(d.glob("*.json")):
        try:
            meta = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise RecordError(f"{p}: corrupt run metadata ({e})") from None
        if status and meta.get("status") != status:
            continue
        runs.append(Run(round_name, meta["run_id"], root, meta))
    return sorted(runs, key=lambda r: r.run_id)


def latest(round_name: str, root: Path | None = None, where=None) -> Run | None:
    """The most recent complete run of a round (optionally filtered by ``where(run) -> bool``)."""
    runs = [r for r in list_runs(round_name, root) if where is None or where(r)]
    return runs[-1] if runs else None


def load(round_name: str, run_id: str, root: Path | None = None) -> Run:
    for r in list_runs(round_name, root, status=None):
        if r.run_id == run_id:
            return r
    raise RecordError(f"no run {run_id} in round {round_name}")


def import_runs(src: Path, dest: Path | None = None) -> list[str]:
    """Copy recorded runs from a GPU machine's results folder into data/ (never overwriting a file)."""
    src, dest = Path(src), Path(dest) if dest else DATA_DIR
    copied = []
    for p in sorted(src.rglob("*")):
        if not p.is_file() or not (p.suffix in (".json", ".csv")):
            continue
        rel = p.relative_to(src)
        target = dest / rel
        if target.exists():
            if target.read_bytes() != p.read_bytes():
                raise RecordError(f"{target} exists with different content: recorded runs are append-only")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, target)
        copied.append(str(rel))
    return copied
