"""The data folder as a whole (split from ``records.py``, issue 42): :func:`check_data` verifies every recorded run
under a data folder (``labkernels data check``), :func:`seal_runs` writes manifests for finished runs recorded before
manifests existed (``--seal``; refused where git shows a committed manifest gone or a file changed, unless forced with
a reason), :func:`import_runs` files a GPU machine's runs into the round folders (validated whole, all or nothing,
never overwriting), :func:`migrate` moves the runs of the old per-series folders (``labkernels data migrate``, ``git
mv``, bytes unchanged); and the ``data check`` / ``data migrate`` commands. One run -- its files, its manifest, its
verification and reading -- is :mod:`labkernels.records`."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import nvml, provenance
from .paths import FOLDERS, file_kind
from .records import (FINISHED, MANIFEST_SUFFIX, RUN_ID_RX, RecordError, Run, check_manifest, data_root,
                      file_sha256, folder, read_json, read_meta, run_files, validate_run, verify_run, write_manifest)

#: folders under data/ that hold no recorded runs
NON_RUN_DIRS = ("models", "cache")


def _scan(root: Path, strict_top: bool) -> tuple[list[Path], list[str]]:
    """(metadata files of the runs under root, problems) -- every file under a round folder must belong to a
    run; with ``strict_top`` a file directly under root is a problem too (an import source)."""
    metas, problems = [], []
    try:
        top = sorted(root.iterdir())
    except OSError as e:
        raise RecordError(f"{root}: cannot list the data folder ({e.strerror or e})") from None
    for entry in top:
        if entry.name.startswith("."):
            continue
        if entry.is_file():
            if strict_top:
                problems.append(f"{entry}: not a recorded run (runs live in <round>/<run_id>.* files; give the "
                                "results' data/ folder)")
            continue
        if not entry.is_dir() or (not strict_top and entry.name in NON_RUN_DIRS):
            continue
        ids = []
        try:
            listing = sorted(entry.iterdir())
        except OSError as e:
            problems.append(f"{entry}: cannot list the folder ({e.strerror or e})")
            continue
        for q in listing:
            if q.name.startswith(".") and q.name.endswith(".tmp") and RUN_ID_RX.match(q.name[1:]):
                problems.append(f"{q}: a temporary file of the run {q.name[1:].split('.')[0]}, left by a write that was "
                                "interrupted (or is still in progress): nothing refers to it; remove it")
            if q.name.startswith("."):
                continue
            if q.is_file() and q.suffix == ".json" and RUN_ID_RX.match(q.stem):
                metas.append(q)
                ids.append(q.stem)
        for q in listing:
            if q.name.startswith(".") or q in metas:
                continue
            if not q.is_file():
                try:
                    kind = file_kind(q.stat().st_mode)
                except OSError:
                    kind = "a dangling symlink"
                problems.append(f"{q}: is {kind}: a recorded run is regular files only")
            elif not any(q.name.startswith(i + ".") for i in ids):
                problems.append(f"{q}: not part of a recorded run (no <run_id>.json beside it)")
    return metas, problems


def check_data(root: Path | None = None) -> tuple[int, list[str]]:
    """Verify every recorded run under a data folder: (runs checked, problems naming each bad file)."""
    root = Path(root) if root else data_root()
    if not root.is_dir():
        return 0, [f"{root}: no such data folder"]
    try:
        metas, problems = _scan(root, strict_top=False)
    except OSError as e:     # a folder that cannot be read (permissions): say which
        raise RecordError(f"{root}: cannot read the data folder ({e})") from None
    problems += [f"{d}: a folder of the old layout; its runs belong in {d.parent / folder(d.name)} (run `labkernels "
                 f"data migrate --root {root}`)" for d in legacy_folders(root)]
    for m in metas:
        try:
            run = validate_run(m)
        except RecordError as e:
            problems.append(str(e))
            continue
        problems += [f"{m}: {p}" for p in nvml.check_run(run.meta)]   # NVML provenance of runs after the cut-over
    return len(metas), problems


def seal_conflicts(run: Run) -> list[str]:
    """Why sealing ``run`` now would attest files that the record says otherwise about: its manifest exists and
    disagrees with the files; or (in a git checkout) a manifest of the run was committed once, or one of its files
    differs from its committed version. Empty: nothing contradicts a seal (outside git nothing can be told)."""
    out = []
    if run.manifest_path.exists() or run.manifest_path.is_symlink():
        try:
            verify_run(run)
        except RecordError as e:
            out.append(f"its manifest disagrees: {e}")
    top = _git_toplevel(run.dir)
    if top is None:
        return out
    mp = str(run.manifest_path.resolve())
    try:
        commit = _git(top, "log", "--all", "-1", "--format=%h", "--", mp).strip()
        if commit and not run.manifest_path.exists():
            out.append(f"a manifest of run {run.run_id} was committed ({commit}) and is gone: restore it "
                       f"(git checkout {commit} -- {run.manifest_path}) instead of writing a new one")
        files = [str(p.resolve()) for p in run_files(run) if p.exists()]
        changed = _git(top, "status", "--porcelain", "--untracked-files=no", "--", *files).splitlines() if files else []
    except RecordError as e:
        out.append(f"git could not say whether its files are as committed ({e})")
        return out
    out += [f"{line[3:]} differs from its committed version (git status {line[:2].strip()})" for line in changed]
    return out


def _who() -> str:
    top = _git_toplevel(Path.cwd())
    name = email = ""
    if top is not None:
        name = subprocess.run(["git", "-C", str(top), "config", "user.name"], capture_output=True, text=True).stdout.strip()
        email = subprocess.run(["git", "-C", str(top), "config", "user.email"], capture_output=True,
                               text=True).stdout.strip()
    user = os.environ.get("USER") or os.environ.get("USERNAME") or "?"
    return f"{name} <{email}>".strip() if name or email else user


def seal_runs(root: Path | None = None, force: bool = False, reason: str | None = None) -> list[Path]:
    """Write a manifest for every finished run under root that has none (runs recorded before manifests
    existed), after checking that its metadata and tables parse. Runs that have a manifest are untouched.

    Refuses (RecordError, nothing sealed) where the record contradicts a seal (:func:`seal_conflicts`: a manifest
    once committed and now gone, a file that differs from its committed version): sealing would attest a tampered
    file. ``force`` (with a ``reason``) seals those runs anyway -- and re-seals runs whose existing manifest
    disagrees -- recording in the manifest who forced it, when, why and what it overrode (the superseded
    manifest's entries included)."""
    root = Path(root) if root else data_root()
    if force and not (isinstance(reason, str) and reason.strip()):
        raise RecordError("a forced seal records why: give --reason TEXT with --force")
    todo, refused = [], []
    for m in _scan(root, strict_top=False)[0]:
        meta = read_meta(m)
        run = Run(meta.get("round") or m.parent.name, meta["run_id"], root, meta, folder=m.parent.name)
        if meta["status"] not in FINISHED:
            continue
        has = run.manifest_path.exists()
        if has and not force:
            continue
        conflicts = seal_conflicts(run)
        if has and not conflicts:
            continue            # a manifest that agrees: nothing to re-seal
        if conflicts and not force:
            refused.append(f"run {run.run_id} ({run.meta_path}): " + "; ".join(conflicts))
            continue
        todo.append((run, conflicts))
    if refused:
        raise RecordError("refusing to seal (nothing was sealed): sealing would attest files the record disagrees "
                          "with -- " + " | ".join(refused) + ". Restore the files (git checkout), or seal them on "
                          "purpose with --force --reason TEXT (recorded in the manifest)")
    sealed = []
    for run, conflicts in todo:
        forced = None
        if conflicts:
            old = None
            if run.manifest_path.exists():
                with contextlib.suppress(RecordError):
                    old = check_manifest(run.manifest_path, read_json(run.manifest_path, "manifest"))
            forced = {"by": _who(), "at": provenance.utc_now(), "reason": reason.strip(), "overrode": conflicts,
                      "superseded_files": old}
        sealed.append(write_manifest(run, sealed_later=True, forced=forced))
    return sealed


def import_runs(src: Path, dest: Path | None = None) -> list[str]:
    """Copy recorded runs from a GPU machine's results folder (its ``data/``) into ``dest`` (default: the
    data root, ``LABKERNELS_DATA_DIR`` or data/), each into its series' folder (:func:`folder`: a source tree
    written with the old folder names lands in the round folders). Returns the copied files, relative to dest.

    All or nothing, and never overwriting: the source must hold only runs (a file that is not part of a run,
    e.g. ``env.json`` of a results root, is refused); every run is validated whole (:func:`validate_run`) and
    every target checked for a conflicting file before anything is copied. Each run is copied into a
    temporary folder beside its target, checked against its manifest there, then linked into place with the
    manifest last (a run is only visible as verified once all its files are in). Files already present with
    identical content are skipped, so an import can be repeated.
    """
    src = Path(src)
    dest = Path(dest) if dest else data_root()
    if not src.is_dir():
        raise RecordError(f"{src}: no such folder (give the results' data/ folder, e.g. OUT/data)")
    s_real, d_real = src.resolve(), dest.resolve()
    if s_real == d_real or d_real in s_real.parents or s_real in d_real.parents:
        how = "is" if s_real == d_real else "is inside" if d_real in s_real.parents else "holds"
        raise RecordError(f"{src}: that folder {how} the data folder it would import into ({dest}); give "
                          "the data/ folder of a GPU run's results (e.g. OUT/data), which lies outside it")
    metas, problems = _scan(src, strict_top=True)
    runs = []
    for m in metas:
        try:
            runs.append(validate_run(m))
        except RecordError as e:
            problems.append(str(e))
    if problems:
        raise RecordError(f"refusing to import from {src}: " + "; ".join(problems))
    if not runs:
        raise RecordError(f"{src}: no recorded runs (<round>/<run_id>.json) to import")
    plan = []  # (run, names to copy)
    ids = {}
    for run in runs:                   # two source folders of one round (old names) with one run id
        other = ids.setdefault((folder(run.round), run.run_id), run)
        if other is not run:
            raise RecordError(f"{run.meta_path} and {other.meta_path} are both run {run.run_id} of folder "
                              f"{folder(run.round)!r} (nothing was imported)")
    for run in runs:
        names = [p.name for p in run_files(run)] + [run.manifest_path.name]
        todo = []
        for n in names:
            target = dest / folder(run.round) / n
            if target.exists():
                if file_sha256(target) != file_sha256(run.dir / n):
                    raise RecordError(f"{target} exists with different content: recorded runs are append-only "
                                      "(nothing was imported)")
            else:
                todo.append(n)
        if todo:
            plan.append((run, todo))
    copied = []
    for run, todo in plan:
        d = dest / folder(run.round)
        d.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=d, prefix=f".import-{run.run_id}-"))
        try:
            for n in todo:
                shutil.copy2(run.dir / n, tmp / n)
            man = check_manifest(run.manifest_path, read_json(run.manifest_path, "manifest"))
            for n in todo:
                if n in man and file_sha256(tmp / n) != man[n]["sha256"]:
                    raise RecordError(f"{tmp / n}: the copy differs from the manifest of run {run.run_id}")
            for n in sorted(todo, key=lambda n: n.endswith(MANIFEST_SUFFIX)):  # the manifest last
                try:
                    os.link(tmp / n, d / n)
                except FileExistsError:
                    if file_sha256(d / n) != file_sha256(tmp / n):
                        raise RecordError(f"{d / n} appeared with different content during the import") from None
                    continue
                except OSError:  # a file system without hard links: rename, still never over a file
                    if (d / n).exists():
                        raise RecordError(f"{d / n} appeared during the import") from None
                    os.rename(tmp / n, d / n)
                copied.append(f"{d.name}/{n}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return copied


# ------------------------------------------------------------------------------------------------ migration
def legacy_folders(root: Path | None = None) -> list[Path]:
    """The folders under root named after a series whose runs now live in a round's folder (``data/q6k``...)."""
    root = Path(root) if root else data_root()
    return [root / k for k, v in FOLDERS.items() if k != v and (root / k).is_dir()]


def _git_toplevel(path: Path) -> Path | None:
    try:
        r = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    except FileNotFoundError:
        return None
    return Path(r.stdout.strip()) if r.returncode == 0 else None


def _git(top: Path, *args) -> str:
    r = subprocess.run(["git", "-C", str(top), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RecordError(f"git {' '.join(args[:2])} failed: {r.stderr.strip()}")
    return r.stdout


def migrate(root: Path | None = None) -> list[tuple[str, str, str]]:
    """Move every file of the legacy folders under root (:func:`legacy_folders`) into its round's folder, bytes
    unchanged: ``git mv`` for files git tracks (root inside a git work tree: the commit shows 100% renames), a
    plain rename otherwise; a file already in the round folder with the same bytes is dropped from the legacy one
    (``git rm`` if tracked). All or nothing: every move is planned and checked first -- a differing file already
    in the target, or an entry that is not a plain file, refuses the whole migration naming it. Emptied legacy
    folders are removed. Idempotent: a second call finds nothing to move. Returns [(from, to, how)] relative to
    root, how = "git mv" | "move" | "git rm (identical)" | "drop (identical)"."""
    root = Path(root) if root else data_root()
    plan, problems, planned = [], [], {}      # planned: target -> the legacy file moving there
    for src_dir in legacy_folders(root):
        dst_dir = root / folder(src_dir.name)
        for f in sorted(src_dir.iterdir()):
            if not f.is_file() or f.is_symlink():
                problems.append(f"{f}: not a plain file (a recorded run is files only): move it away first")
                continue
            t = dst_dir / f.name
            first = planned.setdefault(t, f)
            if first is not f:                 # two old folders of one round hold the same file name
                if file_sha256(first) != file_sha256(f):
                    problems.append(f"{f} and {first} would both become {t}, with different content")
                plan.append((f, t, True))
                continue
            if t.exists() and (not t.is_file() or file_sha256(t) != file_sha256(f)):
                problems.append(f"{t} exists with different content from {f}: recorded runs are append-only")
            plan.append((f, t, t.exists()))
    if problems:
        raise RecordError("refusing to migrate (nothing was moved): " + "; ".join(problems))
    if not plan:
        for d in legacy_folders(root):      # an empty legacy folder
            d.rmdir()
        return []
    top = _git_toplevel(root)
    tracked = set()
    if top is not None:
        out = _git(top, "ls-files", "-z", "--", *[str(d.resolve()) for d in legacy_folders(root)])
        tracked = {(top / n).resolve() for n in out.split("\0") if n}
    git = {f: f.resolve() in tracked for f, _, _ in plan}
    for src_dir in legacy_folders(root):
        (root / folder(src_dir.name)).mkdir(exist_ok=True)
    moves = [(f, t) for f, t, same in plan if not same]
    drops = [f for f, t, same in plan if same]
    for dst_dir in sorted({t.parent for f, t in moves if git[f]}):
        srcs = [str(f.resolve()) for f, t in moves if git[f] and t.parent == dst_dir]
        for i in range(0, len(srcs), 200):      # keep command lines short
            _git(top, "mv", "--", *srcs[i:i + 200], str(dst_dir.resolve()) + "/")
    for f, t in moves:
        if not git[f]:
            os.rename(f, t)
    if any(git[f] for f in drops):
        _git(top, "rm", "-q", "--", *[str(f.resolve()) for f in drops if git[f]])
    for f in drops:
        if f.exists():
            f.unlink()
    done = [(str(f.relative_to(root)), str(t.relative_to(root)),
             ("git rm (identical)" if git[f] else "drop (identical)") if same else ("git mv" if git[f] else "move"))
            for f, t, same in plan]
    for d in {f.parent for f, _, _ in plan}:
        with contextlib.suppress(OSError):
            d.rmdir()
    return done


# ------------------------------------------------------------------------------------------------ command line
def check_data_main(args) -> int:
    if args.root is not None and not str(args.root).strip():
        raise RecordError("--root is empty: give a data folder, or leave --root out for data/")
    root = Path(args.root) if args.root else data_root()
    if (args.force or args.reason) and not args.seal:
        raise RecordError("--force / --reason go with --seal")
    if args.seal:
        for p in seal_runs(root, force=args.force, reason=args.reason):
            print(f"sealed {p}" + (" (forced: recorded in the manifest)" if args.force else ""))
    n, problems = check_data(root)
    for msg in problems:
        print(f"BAD {msg}", file=sys.stderr)
    if problems:
        print(f"labkernels data check: {len(problems)} problem(s) in {n} recorded runs under {root}", file=sys.stderr)
        return 1
    print(f"labkernels data check: {n} recorded runs under {root} verified (manifest, sha256, rows)")
    return 0


def migrate_main(args) -> int:
    if args.root is not None and not str(args.root).strip():
        raise RecordError("--root is empty: give a data folder, or leave --root out for data/")
    root = Path(args.root) if args.root else data_root()
    if not root.is_dir():
        raise RecordError(f"{root}: {'not a folder' if root.exists() else 'no such data folder'}")
    done = migrate(root)
    for a, b, how in done:
        print(f"{how}: {a} -> {b}")
    print(f"labkernels data migrate: {len(done)} file(s) moved into the round folders under {root}" if done else
          f"labkernels data migrate: nothing to move under {root}")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("check-data", help="verify every recorded run under the data folder against its manifest")
    p.add_argument("--root", default=None, help="data folder (default $LABKERNELS_DATA_DIR or data/)")
    p.add_argument("--seal", action="store_true",
                   help="first write manifests for finished runs that have none (runs recorded before manifests); "
                        "refused where git shows a committed manifest gone or a file changed")
    p.add_argument("--force", action="store_true",
                   help="with --seal: seal such runs anyway (and re-seal runs whose manifest disagrees), recording "
                        "who, when, why and what was overridden in the manifest")
    p.add_argument("--reason", default=None, metavar="TEXT", help="why a --force seal is right (required with --force)")
    p.set_defaults(func=check_data_main)
    m = sub.add_parser("migrate-data", help="move runs of the old per-series folders (data/q6k, ...) into the round "
                       "folders (data/03_q6k_expanded_b, ...): git mv, bytes unchanged, idempotent")
    m.add_argument("--root", default=None, help="data folder (default $LABKERNELS_DATA_DIR or data/)")
    m.set_defaults(func=migrate_main)
