"""Where things live. The repository root is found from this file, or LABKERNELS_ROOT."""
from __future__ import annotations

import os
import stat
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = Path(os.environ.get("LABKERNELS_ROOT", PACKAGE_DIR.parent)).resolve()
DATA_DIR = REPO_ROOT / "data"
MODELS_DIR = DATA_DIR / "models"
CACHE_DIR = DATA_DIR / "cache"
REPORTS_DIR = REPO_ROOT / "reports"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
KERNELS_DIR = PACKAGE_DIR / "kernels"
PLANS_DIR = PACKAGE_DIR / "plans"          # round 8's sweep plans (YAML)


def plan_file(name: str) -> Path | None:
    """A sweep plan by name in ``labkernels/plans/`` (``round4_kdr_h200``) or a path to a YAML file; None if
    neither exists (``sweep.plan_path`` raises the sweep's error)."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    q = PLANS_DIR / f"{p.stem if p.suffix in ('.yaml', '.yml') else name}.yaml"
    return q if q.exists() else None

#: the one table of data folders: run series (the old folder names) -> the round folder its runs live in; a series
#: not listed (``prefill``, ``peers``: shared by several rounds) is its own folder
FOLDERS = {
    "occupancy": "02_occupancy_calculator",      # the CUDA occupancy API vs the calculator
    "q6k": "03_q6k_expanded_b",
    "tile_ab": "03_q6k_expanded_b",              # the tile skeleton's old vs new builds (rounds 3 and 4's shapes)
    "kdr_sweep": "04_kdr_sweep",
    "q4k": "04_kdr_sweep",
    "decompose": "05_wall_decomposition",
    "attention": "05_wall_decomposition",        # attention alone (the fused paths' benchmark), shown by round 5's page
    "forensics": "06_counter_forensics",
    "wgmma": "07_wgmma_kquant",
    "sweeps": "08_dask_sweeps",
    "sweep_bench": "08_dask_sweeps",
    "sweep_notebooks": "08_dask_sweeps",
    "decode": "09_decode",
    "nvbench_check": "09_decode",               # nvbench vs the lab's harness on the headline ratios (rounds 7 and 9)
}
#: folders that hold the runs of several rounds (see above)
SHARED = ("prefill", "peers", "gpu_suite")   # gpu_suite: the GPU test suite's runs (gpu check's tests step), by tier


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, as words for a message: 'a regular file', 'a directory', 'a FIFO (named
    pipe)', 'a character device', 'a block device', 'a socket', 'a symlink' (an ``lstat`` mode), else 'not a regular
    file'."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


class OpenRefused(OSError):
    """:func:`open_regular` refused ``path``. ``stage`` says where: ``'stat'`` or ``'open'`` (the OS failed: ``error``
    is its OSError, ``errno`` / ``strerror`` are copied from it; ``missing`` when it was FileNotFoundError) or
    ``'kind'`` (the file is there but is not a regular file: ``kind`` is :func:`file_kind`'s word for it, ``errno``
    None). ``filename`` is the path. Each caller catches it and raises its own error with its own words."""

    def __init__(self, path, stage: str, *, error: OSError | None = None, kind: str | None = None):
        super().__init__(getattr(error, "errno", None), getattr(error, "strerror", None) or f"is {kind}", str(path))
        self.path, self.stage, self.error, self.kind = path, stage, error, kind
        self.missing = isinstance(error, FileNotFoundError)

    @property
    def reason(self) -> str:
        """Why, in words: 'is a FIFO (named pipe)', 'no such file', 'cannot open: Permission denied'."""
        if self.kind:
            return f"is {self.kind}"
        if self.missing:
            return "no such file"
        return f"cannot {self.stage}: {self.strerror or self.error}"

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def open_regular(path) -> tuple[int, int]:
    """``(fd, size)`` of the regular file at ``path`` (symlinks followed), opened read-only; the caller closes ``fd``.
    Never blocks and never opens what is not a regular file: ``stat`` first (a device, FIFO, socket or directory is
    refused before any open), then ``open(O_RDONLY | O_NONBLOCK | O_CLOEXEC)`` (a FIFO swapped in after the stat
    cannot block the open) and ``fstat`` of what was opened (a swap is refused too). ``O_NONBLOCK`` is left set (a
    regular file's reads ignore it). :class:`OpenRefused` otherwise."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise OpenRefused(path, "stat", error=e) from None
    if not stat.S_ISREG(st.st_mode):
        raise OpenRefused(path, "kind", kind=file_kind(st.st_mode))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise OpenRefused(path, "open", error=e) from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise OpenRefused(path, "stat", error=e) from None
    if not stat.S_ISREG(st.st_mode):      # replaced between the stat and the open
        os.close(fd)
        raise OpenRefused(path, "kind", kind=file_kind(st.st_mode))
    return fd, st.st_size


def read_small_file(path, error, what: str = "file", limit: int = 64 << 20, binary: bool = False):
    """The contents of a small input file (a README, an index, a parameters or plan YAML, a device profile table),
    or ``error`` naming the path and what is wrong: opened with :func:`open_regular` (never blocking, checked before
    any read) -- a FIFO (which would block for ever), a device such as /dev/zero (endless bytes), a socket, a
    directory, an empty file (the /proc files that block or fail when read report size 0) or one over ``limit``
    bytes is refused; text must be UTF-8."""
    p = Path(path)
    if not str(path).strip():
        raise error(f"{what} path is empty")
    try:
        fd, size = open_regular(p)
    except OpenRefused as e:
        if e.kind == "a directory":
            raise error(f"{what} {p}: is a directory, not a file") from None
        if e.kind:
            raise error(f"{what} {p}: not a regular file (a FIFO, a device or a socket: it could block or never end)") \
                from None
        if e.missing:
            raise error(f"{what} {p}: no such file") from None
        raise error(f"{what} {p}: cannot open ({e.strerror or e.error})") from None
    try:
        if size == 0:
            raise error(f"{what} {p}: is empty")
        if size > limit:
            raise error(f"{what} {p}: {size} bytes, more than the {limit} a {what} may hold")
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(limit + 1)
        except OSError as e:
            raise error(f"{what} {p}: cannot read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{what} {p}: more than {limit} bytes (it grew while read)")
    if binary:
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {p}: not UTF-8 text ({e})") from None
