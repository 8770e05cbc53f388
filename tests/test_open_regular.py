"""``paths.open_regular``: the one way the lab opens an input that must be a regular file (records' tables and
JSON, the GGUF pre-check, ``read_small_file``'s READMEs, indexes and plans). A regular file opens; a FIFO, a
directory, a device, a socket, a dangling symlink and a missing file are refused with an :class:`OpenRefused`
naming the path and the reason -- at once, never blocking, and without leaking a descriptor."""
from __future__ import annotations

import fcntl
import os
import socket
import stat
import time

import pytest

from labkernels import paths
from labkernels.paths import OpenRefused, file_kind, open_regular

from hostile.hostile_util import deadline   # the hostile suite's guard against a blocking call


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def refused(path) -> OpenRefused:
    n = _open_fds()
    t0 = time.perf_counter()
    with deadline(5, f"open_regular({path})"), pytest.raises(OpenRefused) as e:
        open_regular(path)
    assert time.perf_counter() - t0 < 1.0
    assert _open_fds() == n, "a refused file left its descriptor open"
    assert isinstance(e.value, OSError) and e.value.path == path and e.value.filename == str(path)
    assert str(e.value) == f"{path}: {e.value.reason}"
    return e.value


def test_a_regular_file_opens_with_its_size_close_on_exec(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"12345")
    fd, size = open_regular(p)
    try:
        assert size == 5 and os.read(fd, 10) == b"12345"
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    finally:
        os.close(fd)


def test_a_symlink_to_a_regular_file_and_an_empty_file_open(tmp_path):
    (tmp_path / "f").write_text("abc")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    (tmp_path / "empty").write_text("")
    for p, n in ((tmp_path / "link", 3), (str(tmp_path / "empty"), 0)):
        fd, size = open_regular(p)
        os.close(fd)
        assert size == n


def test_a_fifo_with_no_writer_is_refused_without_blocking(tmp_path):
    p = tmp_path / "pipe"
    os.mkfifo(p)
    e = refused(p)
    assert (e.stage, e.kind, e.errno, e.missing) == ("kind", "a FIFO (named pipe)", None, False)
    assert str(e) == f"{p}: is a FIFO (named pipe)"


def test_a_fifo_behind_a_symlink_is_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "link").symlink_to(tmp_path / "pipe")
    assert refused(tmp_path / "link").kind == "a FIFO (named pipe)"


def test_a_fifo_swapped_in_after_the_stat_is_caught_by_fstat_without_blocking(tmp_path, monkeypatch):
    regular = tmp_path / "f"
    regular.write_text("x")
    p = tmp_path / "pipe"
    os.mkfifo(p)
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda q, *a, **k: real_stat(regular if str(q) == str(p) else q, *a, **k))
    e = refused(p)     # the stat saw a regular file; the open (O_NONBLOCK) got the FIFO, and fstat refused it
    assert (e.stage, e.kind) == ("kind", "a FIFO (named pipe)")


def test_a_directory_is_refused(tmp_path):
    e = refused(tmp_path)
    assert (e.stage, e.kind) == ("kind", "a directory") and str(e) == f"{tmp_path}: is a directory"


@pytest.mark.parametrize("dev", ["/dev/zero", "/dev/null"])
def test_a_character_device_is_refused_before_it_is_opened(dev, monkeypatch):
    if not os.path.exists(dev):
        pytest.skip(f"no {dev} here")
    real_open = os.open
    opened = []
    monkeypatch.setattr(os, "open", lambda q, *a, **k: opened.append(q) or real_open(q, *a, **k))
    e = refused(dev)
    assert (e.stage, e.kind) == ("kind", "a character device") and opened == []


def test_a_socket_is_refused(tmp_path):
    p = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(p))
        assert refused(p).kind == "a socket"


def test_a_missing_file_and_a_dangling_symlink_are_refused_as_missing(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for p in (tmp_path / "nope", tmp_path / "dangling"):
        e = refused(p)
        assert (e.stage, e.missing, e.kind) == ("stat", True, None) and isinstance(e.error, FileNotFoundError)
        assert str(e) == f"{p}: no such file"


def test_an_open_that_fails_names_its_stage_and_the_os_reason(tmp_path, monkeypatch):
    p = tmp_path / "f"
    p.write_text("x")
    real_open = os.open

    def denied(q, *a, **k):
        if str(q) == str(p):
            raise PermissionError(13, "Permission denied")
        return real_open(q, *a, **k)

    monkeypatch.setattr(os, "open", denied)
    e = refused(p)
    assert (e.stage, e.errno, e.strerror, e.missing) == ("open", 13, "Permission denied", False)
    assert str(e) == f"{p}: cannot open: Permission denied"


def test_a_path_through_a_file_is_a_stat_failure(tmp_path):
    (tmp_path / "f").write_text("x")
    e = refused(tmp_path / "f" / "g")
    assert e.stage == "stat" and not e.missing and isinstance(e.error, NotADirectoryError)


def test_file_kind_words():
    assert file_kind(stat.S_IFREG | 0o644) == "a regular file"
    assert file_kind(stat.S_IFDIR) == "a directory"
    assert file_kind(stat.S_IFIFO) == "a FIFO (named pipe)"
    assert file_kind(stat.S_IFCHR) == "a character device"
    assert file_kind(stat.S_IFBLK) == "a block device"
    assert file_kind(stat.S_IFSOCK) == "a socket"
    assert file_kind(stat.S_IFLNK) == "a symlink"
    assert file_kind(0) == "not a regular file"


def test_read_small_file_refuses_a_socket_as_not_a_regular_file(tmp_path):
    """Before open_regular, read_small_file opened first: a socket failed the open ('cannot open (No such device or
    address)'); now the stat refuses it like a FIFO or a device."""
    p = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(p))
        with pytest.raises(ValueError, match="plan file .*: not a regular file"):
            paths.read_small_file(p, ValueError, "plan file")
