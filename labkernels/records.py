"""Recorded runs: GPU measurements are data, append-only, with run ids and provenance.

Layout (one folder per round, named after its notebook, never rewritten by later runs)::

    data/<folder>/<run_id>.json           metadata: run id, round (the run's series), status, provenance, params,
                                          summary
    data/<folder>/<run_id>.<table>.csv    tables, rows appended as the run goes (a sweep that dies
                                          half-way keeps the points it finished)

    data/<folder>/<run_id>.<name>.<ext>   attachments (:meth:`Run.attach`: an Nsight Compute ``.ncu-rep``...),
                                          at most :data:`MAX_ATTACH_BYTES` each, listed in the metadata's
                                          ``attachments`` and in the manifest like a table (without rows)

    data/<folder>/<run_id>.manifest       written last, atomically, by :meth:`Run.finish`: the sha256 and
                                          size of the metadata and of every table, and each table's row count

A run belongs to a *series* (``q6k``, ``kdr_sweep``, ``wgmma``, ...: the ``round`` its metadata names, and the
name every caller records and reads it by); the series' folder is :func:`folder` (the one table,
``labkernels.rounds.FOLDERS``: ``q6k`` -> ``03_q6k_expanded_b``). A round's folder holds the runs of its series
side by side (round 4's ``kdr_sweep`` and ``q4k``): a reader by series sees only its own. Runs recorded before
the folders were named after their rounds (``data/q6k/``...) are moved with :func:`labkernels.records_admin.migrate`
(``labkernels data migrate``), bytes unchanged: their metadata still names the series, which resolves to the new folder.

A run id is ``<UTC yyyymmddThhmmssZ>-<gpu or cpu>-<commit10>``, so ids sort by time. A run's files
are written only while it runs (status ``running``); once ``complete`` or ``failed`` they are frozen:
:func:`new_run` refuses to reuse an id and :class:`Run` refuses writes after :meth:`Run.finish`.
Replay mode renders :func:`latest` complete run of a round.

Integrity: every finished run that :func:`list_runs` / :func:`latest` / :func:`load` return has been checked
against its manifest (:func:`verify_run`): an edited value, a cut last row, a missing or extra table is a
:class:`RecordError` naming the file. :func:`validate_run` checks one run given its metadata path. The data folder
as a whole -- ``labkernels data check`` (every run verified), sealing runs recorded before manifests, importing a GPU
machine's runs (atomically, never overwriting), migrating the old folders -- is :mod:`labkernels.records_admin`.

``LABKERNELS_DATA_DIR`` moves the root (the GPU machine writes under ``$OUT`` and the results are
copied into ``data/`` here with :func:`labkernels.records_admin.import_runs`).
"""

from __future__ import annotations

import contextlib
import csv
import glob
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import nvml, provenance
from .paths import DATA_DIR, FOLDERS, SHARED, OpenRefused, open_regular

RUN_ID_RX = re.compile(r"^\d{8}T\d{6}Z-[A-Za-z0-9_.-]+$")
TABLE_RX = re.compile(r"[a-z0-9_]+")
SHA256_RX = re.compile(r"[0-9a-f]{64}")
MANIFEST_SUFFIX = ".manifest"
FINISHED = ("complete", "failed")
#: every status a run can have: ``running`` while it is recorded, then one of :data:`FINISHED`
STATUSES = ("running",) + FINISHED
#: what a run records: a measurement (default) or a Dask sweep's summary (``labkernels sweep``)
KINDS = ("measure", "sweep")
#: the largest file size a manifest may state (an int64 byte count; a larger one is corrupt, not a file)
MAX_MANIFEST_BYTES = 2**62
#: the largest run metadata / manifest the lab reads (a run's JSON is a few KB; this bounds a hostile file)
MAX_JSON_BYTES = 64 << 20
#: an attachment's name (:meth:`Run.attach`): a stem of lowercase letters, digits, ``_`` and ``-``, then an extension
#: that is not ``csv`` / ``json`` / ``manifest`` (a table, the metadata and the manifest keep their own names)
ATTACH_RX = re.compile(r"[a-z0-9][a-z0-9_-]{0,79}\.[a-z0-9][a-z0-9-]{0,15}(?:\.xz)?")   # .xz: kept compressed
#: the largest attachment a run keeps (data/ is in git: a ~6 MiB Nsight Compute report at most)
MAX_ATTACH_BYTES = 6 << 20


class RecordError(RuntimeError):
    pass


def data_root() -> Path:
    return Path(os.environ.get("LABKERNELS_DATA_DIR", DATA_DIR))


def known_series() -> tuple[str, ...]:
    """The names a series (or a folder) may have: the keys and folders of ``labkernels.rounds.FOLDERS`` and the
    shared folders (``prefill``, ``peers``)."""
    return tuple(dict.fromkeys([*FOLDERS, *FOLDERS.values(), *SHARED]))


def check_series(series) -> str:
    """``series`` when it is a known name (:func:`known_series`); RecordError otherwise -- a series is a name from
    the lab's table, never a path (``../escape`` would write outside the data root)."""
    known = known_series()
    if not isinstance(series, str) or series not in known:
        raise RecordError(f"unknown run series {series!r}: a series is one of {', '.join(known)} "
                          "(labkernels.rounds.FOLDERS), never a path")
    return series


def folder(series: str) -> str:
    """The data folder of a run series (``labkernels.rounds.FOLDERS``: a legacy folder name -> its round's folder;
    any other known name is its own folder). RecordError for a name that is not known (:func:`check_series`)."""
    check_series(series)
    return FOLDERS.get(series, series)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "", s or "")[:16] or "x"


@dataclass
class Run:
    round: str           # the run's series (its metadata's "round")
    run_id: str
    root: Path
    meta: dict
    folder: str | None = None   # the folder it lies in (default: its series' folder, :func:`folder`)

    @property
    def dir(self) -> Path:
        return self.root / (self.folder or folder(self.round))

    @property
    def meta_path(self) -> Path:
        return self.dir / f"{self.run_id}.json"

    @property
    def manifest_path(self) -> Path:
        return self.dir / f"{self.run_id}{MANIFEST_SUFFIX}"

    def table_path(self, table: str) -> Path:
        if not isinstance(table, str) or not TABLE_RX.fullmatch(table):
            raise RecordError(f"table name {table!r}: use lowercase letters, digits and _")
        return self.dir / f"{self.run_id}.{table}.csv"

    def _check_open(self):
        if self.meta.get("status") != "running":
            raise RecordError(f"run {self.run_id} is {self.meta.get('status')}: recorded runs are append-only")

    def append(self, table: str, rows) -> None:
        """Append rows (dict, list of dicts or DataFrame) to a table of this run, flushing to disk now."""
        self._check_open()
        if isinstance(rows, (list, tuple)) and not all(isinstance(r, dict) for r in rows):
            bad = next(r for r in rows if not isinstance(r, dict))
            raise RecordError(f"table {table!r}: rows must be dicts, got a {type(bad).__name__} in the list")
        if not isinstance(rows, (pd.DataFrame, dict, list, tuple)):
            raise RecordError(f"table {table!r}: rows are a dict, a list of dicts or a DataFrame, got "
                              f"{type(rows).__name__}")
        df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame([rows] if isinstance(rows, dict) else list(rows))
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

    def attachment_path(self, name: str) -> Path:
        check_attachment_name(name)
        return self.dir / f"{self.run_id}.{name}"

    def attach(self, name: str, src, max_bytes: int = MAX_ATTACH_BYTES) -> Path:
        """Keep a file with the run (``<run_id>.<name>``: an ``.ncu-rep``, a log): copied now, listed in the metadata's
        ``attachments`` and, at :meth:`finish`, in the manifest with its sha256 and size -- ``data check`` verifies it
        like a table. Refused (RecordError, nothing copied) over ``max_bytes`` (at most :data:`MAX_ATTACH_BYTES`),
        for a name that is taken, and after the run finished."""
        self._check_open()
        dst = self.attachment_path(name)
        src = Path(src)
        if not src.is_file():
            raise RecordError(f"attach {name!r}: {src} is not a regular file")
        n = src.stat().st_size
        cap = min(int(max_bytes), MAX_ATTACH_BYTES)
        if n > cap:
            raise RecordError(f"attach {name!r}: {src} is {n} bytes, over the cap of {cap} bytes (data/ is in git); "
                              "keep it outside the record")
        if name in self.meta.get("attachments", []) or dst.exists():
            raise RecordError(f"attach {name!r}: run {self.run_id} already has it (attachments are append-only)")
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        self.meta.setdefault("attachments", []).append(name)
        self._write_meta()
        return dst

    def attachments(self) -> list[str]:
        return list(self.meta.get("attachments", []))

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
        if "nvml_start" in self.meta.get("provenance", {}):
            # the clocks at the start may be idle clocks: NVML's state at the end of the work too, with every
            # clocks-event reason seen in between (nvml.run_end)
            self.meta["provenance"]["nvml_end"] = nvml.run_end(self.meta["provenance"]["nvml_start"])
        self._write_meta()
        write_manifest(self)

    def _write_meta(self) -> None:
        _atomic_write(self.meta_path, json.dumps(self.meta, indent=1, default=_json_default, sort_keys=False))

    # ---- reading
    def table(self, table: str) -> pd.DataFrame:
        p = self.table_path(table)
        if not p.exists():
            raise RecordError(f"run {self.run_id} of round {self.round} has no table {table!r} "
                              f"(tables: {self.meta.get('tables', [])})")
        return pd.read_csv(io.BytesIO(_read_bytes(p)))

    def has(self, table: str) -> bool:
        return self.table_path(table).exists()

    @property
    def provenance(self) -> dict:
        return self.meta.get("provenance", {})

    @property
    def gpu_name(self) -> str | None:
        """The card the run was measured on, as its provenance names it (None: not recorded)."""
        return ((self.provenance or {}).get("gpu") or {}).get("name")

    @property
    def commit(self) -> str | None:
        """The commit the run was measured at, as its provenance names it (None: not recorded)."""
        return (self.provenance or {}).get("git_commit")

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
    check_series(round_name)
    if not isinstance(kind, str) or kind not in KINDS:
        raise RecordError(f"run kind {kind!r}: one of {', '.join(KINDS)}")
    if params is not None and not isinstance(params, dict):
        raise RecordError(f"run params must be a dict, got {type(params).__name__}")
    root = Path(root) if root else data_root()
    prov = provenance.collect(params)
    dev = _slug(prov["gpu"]["name"].replace("NVIDIA", "")) if prov.get("gpu") else "cpu"
    run_id = f"{prov['date'].replace('-', '').replace(':', '')}-{dev.lower()}-{provenance.short_commit()[:10]}"
    prov["nvml_start"] = nvml.run_start(prov)
    d = root / folder(round_name)
    d.mkdir(parents=True, exist_ok=True)
    base, n = run_id, 1
    while True:     # the first free id, taken by an exclusive create: two writers never get the same one
        meta = {"run_id": run_id, "round": round_name, "kind": kind, "status": "running",
                "started": prov["date"], "provenance": prov, "params": params or {}, "tables": [], "summary": {}}
        run = Run(round_name, run_id, root, meta)
        if _create_exclusive(run.meta_path, json.dumps(meta, indent=1, default=_json_default)):
            return run
        n += 1
        run_id = f"{base}-{n}"


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
    """The runs of a series (``status=None``: all of them), oldest first, from its folder (:func:`folder`; a
    folder's name lists every run in it). Every finished run is verified against its manifest first
    (:func:`verify_run`): a tampered or incomplete one raises RecordError."""
    root = Path(root) if root else data_root()
    d = root / folder(round_name)
    runs = []
    if not d.is_dir():
        return runs
    for p in sorted(d.glob("*.json")):
        meta = read_meta(p)
        series = meta.get("round") or d.name
        check_filed(p, series, d.name)
        run = Run(series, meta["run_id"], root, meta, folder=d.name)
        if meta["status"] in FINISHED:
            verify_run(run)     # every run of the folder: an edited round field does not hide a run
        if round_name != d.name and series != round_name:
            continue            # another series of the round's folder
        if status and meta["status"] != status:
            continue
        runs.append(run)
    return sorted(runs, key=lambda r: r.run_id)


def check_filed(p: Path, series, dirname: str) -> None:
    """A run's series must be known and belong to the folder it lies in (an edited or moved round field names
    another folder, or none)."""
    try:
        f = folder(series)
    except RecordError as e:
        raise RecordError(f"{p}: {e}") from None
    if f != dirname and series != dirname:
        raise RecordError(f"{p}: run of series {series!r} lies in folder {dirname!r}, but that series' folder is "
                          f"{f!r} (a moved file, or an edited round field)")


def latest(round_name: str, root: Path | None = None, where=None) -> Run | None:
    """The most recent complete run of a round (optionally filtered by ``where(run) -> bool``)."""
    runs = [r for r in list_runs(round_name, root) if where is None or where(r)]
    return runs[-1] if runs else None


def replay_run(round_name: str, root: Path | None = None, where=None) -> Run | None:
    """The run a replayed page renders: :func:`latest` complete run of the series (``where`` as there) -- unless a
    newer run of it is not finished (status ``running``: still being recorded, or a recording that died): replay
    would then publish an older run in its place, so it refuses with a RecordError naming both runs. A newer
    ``failed`` run is final: the page keeps the latest complete one."""
    def keep(r) -> bool:
        if where is None:
            return True
        try:
            return where(r)
        except RecordError:              # a run still being recorded may lack what the filter reads: count it
            if r.meta["status"] in FINISHED:
                raise
            return True

    runs = [r for r in list_runs(round_name, root, status=None) if keep(r)]
    complete = [r for r in runs if r.meta["status"] == "complete"]
    pick = complete[-1] if complete else None
    newer = [r for r in runs if r.meta["status"] not in FINISHED and (pick is None or r.run_id > pick.run_id)]
    if newer:
        r = newer[-1]
        used = f"run {pick.run_id}, older than it" if pick else "no run (none is complete)"
        raise RecordError(f"replay of {round_name!r}: refusing -- the newest run {r.run_id} ({r.meta_path}) has status "
                          f"{r.meta['status']!r}, not a final one ({' / '.join(FINISHED)}): it is still being recorded, "
                          f"or its recording died. Replay would have used {used}, and published it over the newer "
                          "one. Let the recording finish; a dead one on this machine was never imported (imports "
                          "take finished runs only) and can be removed")
    return pick


def load(round_name: str, run_id: str, root: Path | None = None) -> Run:
    for r in list_runs(round_name, root, status=None):
        if r.run_id == run_id:
            return r
    raise RecordError(f"no run {run_id} in round {round_name}")


# ------------------------------------------------------------------------------------------------ integrity
def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` (unique per process), fsync, then rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_synced(fd: int, text: str) -> None:
    """``text`` into the open file ``fd`` (closed after), flushed to the disk."""
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _create_exclusive(path: Path, text: str) -> bool:
    """Write ``text`` as a new file at ``path`` unless a file is there (False then, the file untouched): written to
    a temporary file, then hard-linked into place (atomic and exclusive: a reader never sees it half-written);
    where the file system has no hard links, ``O_CREAT | O_EXCL``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        _write_synced(fd, text)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError:
            pass
        try:
            fd2 = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        _write_synced(fd2, text)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _open_regular(path: Path) -> tuple[int, int]:
    """(fd, size) of a regular file (:func:`labkernels.paths.open_regular`: never blocks, checked with stat before
    the open and fstat after it): a FIFO (which would block for ever), a device such as /dev/zero (endless bytes) or
    a directory is a RecordError, also behind a symlink."""
    try:
        return open_regular(path)
    except OpenRefused as e:
        if e.kind:
            raise RecordError(f"{path}: is {e.kind}{' (through a symlink)' if Path(path).is_symlink() else ''}: "
                              "a recorded file must be a regular file") from None
        if e.missing:
            raise RecordError(f"{path}: missing") from None
        raise RecordError(f"{path}: cannot open: {e.strerror or e.error}") from None


def _read_bytes(path: Path, limit: int | None = None, what: str = "") -> bytes:
    """The bytes of a regular file (:func:`_open_regular`), never more than ``limit`` (RecordError beyond)."""
    fd, size = _open_regular(path)
    with os.fdopen(fd, "rb") as f:
        if limit is not None and size > limit:
            raise RecordError(f"{path}: {size} bytes, more than {limit}{' ' + what if what else ''}")
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise RecordError(f"{path}: more than {limit} bytes{' ' + what if what else ''} (it grew while read)")
    return data


def _digest(path: Path, limit: int | None = None) -> tuple[str, int]:
    """(sha256, bytes) of a regular file, reading at most ``limit + 1`` bytes (a file larger than ``limit`` -- the
    size its manifest records -- is not read past that: the caller sees its size differ)."""
    fd, size = _open_regular(path)
    h, n = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as f:
        if limit is not None and size > limit:
            return "", size
        while True:
            chunk = f.read(1 << 20 if limit is None else min(1 << 20, limit + 1 - n))
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
            if limit is not None and n > limit:
                return "", n
    return h.hexdigest(), n


def file_sha256(path: Path) -> str:
    return _digest(path)[0]


def read_json(p: Path, what: str):
    """A JSON file of the record (metadata, manifest): regular, at most :data:`MAX_JSON_BYTES`, UTF-8, valid JSON,
    not nested beyond what the parser takes -- RecordError naming the file otherwise."""
    data = _read_bytes(p, MAX_JSON_BYTES, f"(the most a {what} may hold)")
    try:
        return json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise RecordError(f"{p}: corrupt {what} ({e})") from None
    except RecursionError:
        raise RecordError(f"{p}: corrupt {what} (nested too deeply to read)") from None


#: the fields of run metadata, their types when present (``None`` allowed where the second item is True)
_META_FIELDS = {"run_id": (str, False), "round": (str, True), "status": (str, False), "kind": (str, True),
                "started": (str, True), "finished": (str, True), "provenance": (dict, True), "params": (dict, True),
                "tables": (list, False), "summary": (dict, True)}


def _type_name(v) -> str:
    return "null" if v is None else type(v).__name__


def check_meta(p: Path, meta) -> dict:
    """Run metadata field by field: RecordError naming the file and the field for a missing or mistyped one."""
    if not isinstance(meta, dict):
        raise RecordError(f"{p}: not run metadata (a JSON {_type_name(meta)}, not an object)")
    if not isinstance(meta.get("run_id"), str):
        raise RecordError(f"{p}: not run metadata (no run_id)")
    for k, (typ, nullable) in _META_FIELDS.items():
        if k not in meta:
            if k in ("status", "tables"):
                raise RecordError(f"{p}: run metadata has no {k!r}")
            continue
        v = meta[k]
        if (v is None and not nullable) or (v is not None and not isinstance(v, typ)):
            raise RecordError(f"{p}: run metadata field {k!r} is {_type_name(v)} {v!r:.80}, expected "
                              f"{typ.__name__}{' or null' if nullable else ''}")
    if not RUN_ID_RX.match(meta["run_id"]):
        raise RecordError(f"{p}: run_id {meta['run_id']!r} is not a run id (UTC-time-device-commit)")
    if meta["status"] not in STATUSES:
        raise RecordError(f"{p}: run status {meta['status']!r} is not one of {', '.join(STATUSES)}")
    bad = [t for t in meta["tables"] if not isinstance(t, str) or not TABLE_RX.fullmatch(t)]
    if bad:
        raise RecordError(f"{p}: run metadata field 'tables' holds {bad[0]!r}, not a table name (lowercase letters, "
                          "digits and _)")
    if len(set(meta["tables"])) != len(meta["tables"]):
        raise RecordError(f"{p}: run metadata field 'tables' names a table twice: {meta['tables']}")
    att = meta.get("attachments", [])
    if not isinstance(att, list):
        raise RecordError(f"{p}: run metadata field 'attachments' is {_type_name(att)}, expected a list of names")
    for a in att:
        try:
            check_attachment_name(a)
        except RecordError as e:
            raise RecordError(f"{p}: run metadata field 'attachments': {e}") from None
    if len(set(att)) != len(att):
        raise RecordError(f"{p}: run metadata field 'attachments' names a file twice: {att}")
    return meta


def check_manifest(mp: Path, man) -> dict:
    """A manifest field by field (run_id, files: name -> sha256 / bytes / rows); returns its files."""
    if not isinstance(man, dict):
        raise RecordError(f"{mp}: corrupt manifest (a JSON {_type_name(man)}, not an object)")
    files = man.get("files")
    if not isinstance(files, dict):
        raise RecordError(f"{mp}: corrupt manifest (field 'files' is {_type_name(files)}, expected an object of "
                          "file name -> sha256, bytes, rows)")
    if not isinstance(man.get("run_id"), str):
        raise RecordError(f"{mp}: corrupt manifest (field 'run_id' is {_type_name(man.get('run_id'))})")
    for name, e in files.items():
        if not isinstance(e, dict):
            raise RecordError(f"{mp}: corrupt manifest (entry {name!r} is {_type_name(e)}, expected an object)")
        if not isinstance(e.get("sha256"), str) or not SHA256_RX.fullmatch(e["sha256"]):
            raise RecordError(f"{mp}: corrupt manifest (entry {name!r}: sha256 {e.get('sha256')!r:.80} is not 64 hex "
                              "digits)")
        for k in ("bytes",) + (("rows",) if name.endswith(".csv") else ()):
            v = e.get(k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > MAX_MANIFEST_BYTES:
                raise RecordError(f"{mp}: corrupt manifest (entry {name!r}: {k} is {_type_name(v)} {v!r:.80}, expected "
                                  f"a non-negative integer up to {MAX_MANIFEST_BYTES})")
    if "status" in man and man["status"] not in FINISHED:
        raise RecordError(f"{mp}: corrupt manifest (status {man['status']!r}: a manifest is written when a run "
                          f"finished: {' or '.join(FINISHED)})")
    return files


def read_meta(p: Path) -> dict:
    meta = check_meta(p, read_json(p, "run metadata"))
    if p.name != f"{meta['run_id']}.json":
        raise RecordError(f"{p}: the file name does not match its run_id {meta['run_id']!r}")
    return meta


def table_rows(path: Path, limit: int | None = None) -> int:
    """Data rows of a recorded table, after checking that it is a whole CSV: it ends with a newline, every
    row has the header's number of fields, and pandas reads the same number of rows. Raises RecordError.
    The file must be a regular file, read no further than ``limit`` bytes when given."""
    data = _read_bytes(Path(path), limit)
    if not data.strip():
        raise RecordError(f"{path}: empty table")
    if not data.endswith(b"\n"):
        raise RecordError(f"{path}: the last row is cut (no final newline)")
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error) as e:
        raise RecordError(f"{path}: not a readable CSV table ({e})") from None
    width = len(rows[0])
    for i, r in enumerate(rows[1:], start=2):
        if len(r) != width:
            raise RecordError(f"{path}: row {i} has {len(r)} fields, the header has {width} (a cut or edited row)")
    try:
        n = len(pd.read_csv(io.BytesIO(data)))
    except Exception as e:  # pandas' parser errors have no common base
        raise RecordError(f"{path}: pandas cannot read the table ({type(e).__name__}: {e})") from None
    if n != len(rows) - 1:
        raise RecordError(f"{path}: {len(rows) - 1} CSV rows but pandas reads {n}")
    return n


def check_attachment_name(name) -> str:
    if not isinstance(name, str) or not ATTACH_RX.fullmatch(name) or name.removesuffix(".xz").rsplit(".", 1)[1] in (
            "csv", "json", "manifest"):
        raise RecordError(f"attachment name {name!r}: use <stem>.<ext> or <stem>.<ext>.xz (lowercase letters, "
                          "digits, _ and -; the extension not csv, json or manifest)")
    return name


def run_files(run: Run) -> list[Path]:
    return [run.meta_path] + [run.table_path(t) for t in run.meta.get("tables", [])] + \
        [run.attachment_path(a) for a in run.meta.get("attachments", [])]


def write_manifest(run: Run, sealed_later: bool = False, forced: dict | None = None) -> Path:
    """Write ``<run_id>.manifest`` for a finished run (atomically; the last file of a run). ``sealed_later``
    marks a manifest written after the fact for a run recorded before manifests existed; ``forced`` records who
    sealed over a disagreement, when, why and what it overrode (``data check --seal --force``)."""
    if run.meta.get("status") not in FINISHED:
        raise RecordError(f"run {run.run_id} is {run.meta.get('status')}: only finished runs get a manifest")
    files = {}
    for p in run_files(run):
        if not p.exists():
            raise RecordError(f"{p}: listed by run {run.run_id} but missing")
        sha, n = _digest(p)
        entry = {"sha256": sha, "bytes": n}
        if p.suffix == ".csv":
            entry["rows"] = table_rows(p, n)
        files[p.name] = entry
    manifest = {"run_id": run.run_id, "round": run.round, "status": run.meta["status"],
                "written": provenance.utc_now(), "files": files}
    if sealed_later:
        manifest["sealed_later"] = ("written by `labkernels data check --seal` for a run recorded before "
                                    "manifests existed: it attests the files as they were when sealed")
    if forced:
        manifest["forced_seal"] = forced
    _atomic_write(run.manifest_path, json.dumps(manifest, indent=1))
    return run.manifest_path


def verify_run(run: Run) -> Run:
    """Check a finished run against its manifest: every file present with the recorded sha256, size and row
    count, the tables the metadata lists exactly the tables the manifest lists, no other file of the run.
    Raises RecordError naming the bad file."""
    mp = run.manifest_path
    if not mp.exists():
        raise RecordError(f"{mp}: missing: run {run.run_id} is {run.meta.get('status')} but has no manifest "
                          "(its files cannot be verified; a run written before manifests existed is sealed with "
                          "`labkernels data check --seal`)")
    man = read_json(mp, "manifest")
    files = check_manifest(mp, man)
    if man.get("run_id") != run.run_id:
        raise RecordError(f"{mp}: manifest of run {man.get('run_id')!r}, not {run.run_id!r}")
    if man.get("status") is not None and man["status"] != run.meta.get("status"):
        raise RecordError(f"{mp}: the manifest says the run is {man['status']!r}, its metadata "
                          f"{run.meta.get('status')!r}")
    want = {p.name for p in run_files(run)}
    if set(files) != want:
        extra, missing = sorted(set(files) - want), sorted(want - set(files))
        raise RecordError(f"{run.meta_path}: the run's files {sorted(want)} differ from its manifest's "
                          f"(manifest only: {extra}, metadata only: {missing})")
    for name, entry in files.items():
        p = run.dir / name
        if not p.exists() and not p.is_symlink():
            raise RecordError(f"{p}: missing (listed in {mp.name})")
        if p.suffix not in (".csv", ".json") and entry["bytes"] > MAX_ATTACH_BYTES:
            raise RecordError(f"{p}: an attachment of {entry['bytes']} bytes, over the cap of {MAX_ATTACH_BYTES}")
        sha, n = _digest(p, entry["bytes"])       # regular files only, never read past the recorded size
        if n > entry["bytes"]:
            raise RecordError(f"{p}: {n} bytes, the manifest says {entry['bytes']}: the recorded file grew (edited "
                              "or replaced)")
        if n != entry["bytes"] or sha != entry["sha256"]:
            if p.suffix == ".csv":
                table_rows(p, entry["bytes"])  # a cut or malformed table says so
            raise RecordError(f"{p}: content differs from the manifest (sha256/size): the recorded file was "
                              "edited, cut or replaced")
        if p.suffix == ".csv" and (rows := table_rows(p, entry["bytes"])) != entry["rows"]:
            raise RecordError(f"{p}: {rows} rows, the manifest says {entry['rows']}")
    stray = sorted(q.name for q in run.dir.glob(f"{glob.escape(run.run_id)}.*")
                   if q.name not in files and q.name != mp.name)
    if stray:
        raise RecordError(f"{run.dir / stray[0]}: not part of run {run.run_id} (its manifest lists "
                          f"{sorted(files)}); stray files: {stray}")
    return run


def validate_run(meta_path) -> Run:
    """Validate one recorded run given its ``<round>/<run_id>.json``: the metadata parses and matches its file
    name, the run is finished, its manifest matches every file, every table is a whole CSV. Returns the Run."""
    p = Path(meta_path)
    if not p.exists() and not p.is_symlink():
        raise RecordError(f"{p}: no such run metadata file")
    meta = read_meta(p)
    series = meta.get("round")
    if series is not None:
        check_filed(p, series, p.parent.name)
    if meta.get("status") not in FINISHED:
        raise RecordError(f"{p}: run {meta['run_id']} is {meta.get('status')!r}: it never finished")
    for key in ("provenance", "tables"):
        if key not in meta:
            raise RecordError(f"{p}: run metadata has no {key!r}")
    return verify_run(Run(series or p.parent.name, meta["run_id"], p.parent.parent, meta, folder=p.parent.name))
