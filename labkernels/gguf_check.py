"""A bounded pre-check of a GGUF file, run before gguf-py parses anything.

gguf-py trusts every count and length it reads: an array whose length field says 2^40 makes it read empty
arrays past the end of the file for ever (a 51-byte file hangs the loader and grows its memory without
bound), and it accepts tensors at the same or at unaligned offsets, which ggml refuses. This module walks
the header, the metadata and the tensor table itself, with every count, length and dimension bounded by the
bytes that are left in the file, so any file is accepted or refused in time linear in its header size and
with memory bounded by it.

What it checks (the rules of ggml's ``gguf.cpp`` reader, plus the lab's own):

* the path is a regular, readable file: FIFOs, devices, sockets and directories are refused without
  opening them for a blocking read (``paths.open_regular``: ``stat`` first, then ``open(O_NONBLOCK)`` and ``fstat``
  again);
* magic ``GGUF``, version 2 or 3 (little-endian);
* every string length, array length and the tensor / key counts fit in the bytes that remain; keys and tensor
  names are UTF-8, keys unique; arrays of arrays are refused (ggml does not read them);
* ``general.alignment``, when present, is a ``uint32`` power of two;
* every tensor: a non-empty name shorter than 64 bytes (``GGML_MAX_NAME``), unique; 1 to 4 dimensions
  (``GGML_MAX_DIMS``), each at least 1 (zero-sized and 0-d tensors are refused); a known GGML type whose
  block size divides the row length; data at an offset that is a multiple of the alignment, inside the file,
  and not overlapping any other tensor's data.

Every failure is a :class:`ModelError` (also ``labkernels.model.ModelError``) naming the file, the byte offset and the field,
e.g. ``h.gguf: offset 43: metadata 'arr' array length: 1099511627776 elements of uint8 need at least 1099511627776
bytes up to offset 1099511627827 but the file has 51 bytes: truncated, or a corrupt count``. Every message about
a file that ends before what its header describes says ``truncated`` and ``the file has N bytes``; no other
message does.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .paths import OpenRefused, open_regular


class ModelError(Exception):
    """A model file or tensor that the lab cannot use, with the reason."""


GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32          # GGUF_DEFAULT_ALIGNMENT
MAX_DIMS = 4                    # GGML_MAX_DIMS
MAX_NAME = 64                   # GGML_MAX_NAME: names must be shorter

# GGUFValueType -> (name, struct format) for the fixed-size scalar types
_SCALARS = {0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"), 4: ("uint32", "<I"),
            5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<B"), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
            12: ("float64", "<d")}
_STRING, _ARRAY = 8, 9
_UINT32 = 4
_MIN_KV_BYTES = 8 + 4 + 1             # key length, value type, the smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset (names and dims come on top)


@dataclass
class TensorInfo:
    name: str
    dims: tuple             # ggml order (ne0 = row length first)
    ggml_type: int
    type_name: str
    offset: int             # relative to the data section
    nbytes: int
    info_offset: int        # file offset of this tensor's entry in the tensor table


@dataclass
class GGUFLayout:
    path: Path
    size: int
    version: int
    alignment: int
    data_start: int
    keys: dict = field(default_factory=dict)      # key -> (value type, file offset of the value)
    tensors: list = field(default_factory=list)   # TensorInfo, in file order


def _open_regular(path: Path, hint: str = "") -> tuple[int, int]:
    """(fd, size) of a regular readable file (:func:`labkernels.paths.open_regular`); ModelError for anything else
    (never blocks)."""
    try:
        return open_regular(path)
    except OpenRefused as e:
        if e.kind:
            raise ModelError(f"{path}: is {e.kind}, not a GGUF file (a model must be a regular file)") from None
        if e.stage == "stat":
            if e.missing:
                raise ModelError(f"model file not found: {path}{hint}") from None
            raise ModelError(f"{path}: cannot stat the model file: {e.strerror or e.error}") from None
        if isinstance(e.error, PermissionError):
            raise ModelError(f"{path}: cannot read the model file (permission denied)") from None
        raise ModelError(f"{path}: cannot open the model file: {e.strerror or e.error}") from None


class _Cursor:
    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.off = path, buf, size, 0

    def fail(self, off: int, what: str, msg: str):
        raise ModelError(f"{self.path}: offset {off}: {what}: {msg}")

    def need(self, n: int, what: str, off: int | None = None) -> None:
        off = self.off if off is None else off
        if off + n > self.size:
            self.fail(off, what, f"truncated: needs {n} bytes up to offset {off + n} but the file has "
                                 f"{self.size} bytes")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.off)[0]
        self.off += n
        return v

    def count(self, what: str, unit: int, unit_name: str):
        """A u64 count whose ``count * unit`` bytes must still be in the file."""
        off = self.off
        n = self.unpack("<Q", what)
        left = self.size - self.off
        if n * unit > left:
            self.fail(off, what, f"{n} {unit_name} need at least {n * unit} bytes up to offset "
                                 f"{self.off + n * unit} but the file has {self.size} bytes: truncated, or a "
                                 "corrupt count")
        return n

    def string(self, what: str, decode: bool = True):
        off = self.off
        n = self.count(f"{what} length", 1, "bytes")
        raw = bytes(self.buf[self.off:self.off + n])
        self.off += n
        if not decode:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(off, what, f"not valid UTF-8 ({e.reason} at byte {e.start})")

    def skip_strings(self, n: int, what: str) -> None:
        buf, off, size = self.buf, self.off, self.size
        unpack = struct.Struct("<Q").unpack_from
        for i in range(n):
            if off + 8 > size:
                self.off = off
                self.need(8, f"{what} element {i} length")
            ln = unpack(buf, off)[0]
            if off + 8 + ln > size:
                self.fail(off, f"{what} element {i} length", f"{ln} bytes up to offset {off + 8 + ln} but the "
                                                               f"file has {size} bytes: truncated, or a corrupt length")
            off += 8 + ln
        self.off = off


def _value(c: _Cursor, vtype: int, what: str, vtype_off: int):
    """Skip (and bound) one metadata value; returns the value for scalars and strings, None for arrays."""
    if vtype in _SCALARS:
        return c.unpack(_SCALARS[vtype][1], what)
    if vtype == _STRING:
        return c.string(what)
    if vtype == _ARRAY:
        et_off = c.off
        etype = c.unpack("<I", f"{what} array element type")
        if etype == _ARRAY:
            c.fail(et_off, f"{what} array element type", "arrays of arrays are not supported (ggml refuses them)")
        if etype == _STRING:
            n = c.count(f"{what} array length", 8, "strings")
            c.skip_strings(n, what)
        elif etype in _SCALARS:
            name, fmt = _SCALARS[etype]
            size = struct.calcsize(fmt)
            n = c.count(f"{what} array length", size, f"elements of {name}")
            c.off += n * size
        else:
            c.fail(et_off, f"{what} array element type", f"unknown GGUF value type {etype}")
        return None
    c.fail(vtype_off, f"{what} value type", f"unknown GGUF value type {vtype}")


def check_gguf(path, hint: str = "") -> GGUFLayout:
    """Check ``path`` as described in the module docstring; return its layout or raise ModelError."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    fd, size = _open_regular(path, hint)
    try:
        if size < 8:
            raise ModelError(f"{path}: not a GGUF file ({size} bytes, too short for a GGUF header)")
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as buf:
            head = bytes(buf[:8])
            if head[:4] != GGUF_MAGIC:
                raise ModelError(f"{path}: not a GGUF file (magic {head[:4]!r}, {size} bytes)")
            version = struct.unpack("<I", head[4:8])[0]
            if version not in SUPPORTED_VERSIONS:
                raise ModelError(f"{path}: offset 4: version: unsupported GGUF version {version} "
                                 f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))}, little-endian)")
            c = _Cursor(path, buf, size)
            c.off = 8
            n_tensors = c.count("tensor count", _MIN_TENSOR_INFO_BYTES, "tensor entries")
            n_kv = c.count("metadata key count", _MIN_KV_BYTES, "key/value pairs")
            layout = GGUFLayout(path, size, version, DEFAULT_ALIGNMENT, 0)
            for i in range(n_kv):
                key_off = c.off
                key = c.string(f"metadata key {i}")
                if key in layout.keys:
                    c.fail(key_off, f"metadata key {key!r}", "duplicate key")
                vt_off = c.off
                vtype = c.unpack("<I", f"metadata {key!r} value type")
                v = _value(c, vtype, f"metadata {key!r}", vt_off)
                layout.keys[key] = (vtype, vt_off + 4)
                if key == "general.alignment":
                    if vtype != _UINT32:
                        c.fail(vt_off, "metadata 'general.alignment'", f"value type {vtype}, expected uint32 (4)")
                    if v == 0 or v & (v - 1):
                        c.fail(vt_off + 4, "metadata 'general.alignment'", f"{v} is not a power of two")
                    layout.alignment = v
            names = set()
            for i in range(n_tensors):
                info_off = c.off
                name = c.string(f"tensor {i} name")
                what = f"tensor {i} {name!r}"
                if not name:
                    c.fail(info_off, f"tensor {i} name", "empty tensor name")
                if len(name.encode()) >= MAX_NAME:
                    c.fail(info_off, f"{what} name", f"{len(name.encode())} bytes; ggml allows at most {MAX_NAME - 1}")
                if name in names:
                    c.fail(info_off, f"{what} name", "duplicate tensor name")
                names.add(name)
                nd_off = c.off
                n_dims = c.unpack("<I", f"{what} n_dims")
                if n_dims == 0:
                    c.fail(nd_off, f"{what} n_dims", "0-d tensor (ggml tensors have 1 to 4 dimensions)")
                if n_dims > MAX_DIMS:
                    c.fail(nd_off, f"{what} n_dims", f"{n_dims} dimensions; ggml allows at most {MAX_DIMS}")
                dims = []
                for j in range(n_dims):
                    d_off = c.off
                    d = c.unpack("<Q", f"{what} dimension {j}")
                    if d == 0:
                        c.fail(d_off, f"{what} dimension {j}", "zero-sized tensor")
                    dims.append(d)
                t_off = c.off
                gtype = c.unpack("<I", f"{what} type")
                try:
                    qt = GGMLQuantizationType(gtype)
                    blck, tsize = GGML_QUANT_SIZES[qt]
                except (ValueError, KeyError):
                    c.fail(t_off, f"{what} type", f"unknown GGML type {gtype}")
                if dims[0] % blck:
                    c.fail(t_off, f"{what} type", f"{qt.name} needs rows that are a multiple of {blck} "
                                                  f"elements; dimension 0 is {dims[0]}")
                n_elem = 1
                for d in dims:
                    n_elem *= d
                nbytes = n_elem // blck * tsize
                o_off = c.off
                offset = c.unpack("<Q", f"{what} data offset")
                if offset % layout.alignment:
                    c.fail(o_off, f"{what} data offset", f"{offset} is not a multiple of the alignment "
                                                         f"{layout.alignment}")
                layout.tensors.append(TensorInfo(name, tuple(dims), gtype, qt.name, offset, nbytes, info_off))
            pad = c.off % layout.alignment
            layout.data_start = c.off + (layout.alignment - pad if pad else 0)
            for t in layout.tensors:
                end = layout.data_start + t.offset + t.nbytes
                if end > size:
                    raise ModelError(
                        f"{path}: offset {t.info_offset}: tensor {t.name!r} data: truncated: the tensor needs bytes "
                        f"{layout.data_start + t.offset}..{end} but the file has {size} bytes")
            by_off = sorted(layout.tensors, key=lambda t: (t.offset, t.info_offset))
            for a, b in zip(by_off, by_off[1:]):
                if a.offset + a.nbytes > b.offset:
                    raise ModelError(
                        f"{path}: offset {b.info_offset}: tensor {b.name!r} data offset: {b.offset} overlaps tensor "
                        f"{a.name!r} (data {a.offset}..{a.offset + a.nbytes} of the data section)")
            return layout
    finally:
        os.close(fd)
