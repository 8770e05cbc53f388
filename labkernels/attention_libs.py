"""Which attention libraries this machine can use, and what they loaded: the cuDNN frontend (libcudnn loaded first
through cuda-pathfinder, after CuPy's cuBLAS), PyTorch, and a CUDA GPU with CuPy. The imports return the module or
raise :class:`~labkernels.attention_kinds.AttentionUnavailable` with the reason (``_gpu_ok``: None, or why not); the
frontend's import is cached with its versions and libcudnn's path (:func:`cudnn_info`, :func:`status`).
:mod:`labkernels.attention` (the paths and their choice) imports these at module level and re-exports the public
names; messages go to its logger, ``labkernels.attention``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os

from packaging.version import InvalidVersion, Version

from . import gpu, provenance
from .attention_kinds import AttentionUnavailable

log = logging.getLogger("labkernels.attention")     # attention's logger: messages stay where they were

#: the first cuda-pathfinder release whose ``load_nvidia_dynamic_lib`` knows ``"cudnn"`` (libcudnn.so.9: NVIDIA's
#: wheels under nvidia/cudnn/lib, Conda, ``CUDNN_PATH``, the loader path; its release notes, PR #2680)
PATHFINDER_CUDNN_SINCE = (1, 7, 0)


def _version_tuple(v: str) -> tuple[int, ...]:
    """'1.9.0' -> (1, 9, 0): the release numbers (packaging's PEP 440 parse; a pre-release or local suffix is dropped,
    '1.7.0rc1' -> (1, 7, 0)); () for a string that is no version."""
    try:
        return Version(str(v)).release[:3]
    except InvalidVersion:
        return ()


def _load_libcudnn() -> dict:
    """Load libcudnn.so.9 through NVIDIA's ``cuda-pathfinder`` (``cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")``:
    a library already in the process, NVIDIA's wheels in the interpreter's site-packages (``site.getsitepackages()``,
    not every sys.path entry: name a ``--target`` install by ``CUDNN_PATH``), Conda, the loader path, ``CUDNN_PATH``;
    dlopen'ed RTLD_NOW | RTLD_GLOBAL, its cuBLASLt dependency first) before the frontend looks for it, and put its
    folder first on LD_LIBRARY_PATH (the frontend searches LD_LIBRARY_PATH, then globs the interpreter's purelib --
    asserting a single match -- then the loader path).
    Returns {"path", "found_via", "pathfinder"}; raises AttentionUnavailable with the reason when cuda-pathfinder is
    not installed (the gpu extra; CPU machines), predates cuDNN support (:data:`PATHFINDER_CUDNN_SINCE`) or finds no
    loadable libcudnn.so.9."""
    try:    # optional (the gpu extra): imported here, by its full name (a stand-in in sys.modules is taken as is)
        pathfinder = importlib.import_module("cuda.pathfinder")
    except ImportError as e:
        raise AttentionUnavailable(f"cuda-pathfinder (Python package cuda-pathfinder, module cuda.pathfinder) is not "
                                   f"installed: {type(e).__name__}: {e}") from None
    ver = str(getattr(pathfinder, "__version__", "") or _dist_version("cuda-pathfinder"))
    if ver and _version_tuple(ver) < PATHFINDER_CUDNN_SINCE:
        since = ".".join(map(str, PATHFINDER_CUDNN_SINCE))
        raise AttentionUnavailable(f"cuda-pathfinder {ver} predates cuDNN support "
                                   f"(load_nvidia_dynamic_lib('cudnn') since {since})")
    not_found = getattr(pathfinder, "DynamicLibNotFoundError", RuntimeError)
    _cupy_cublas_first()
    try:
        dl = pathfinder.load_nvidia_dynamic_lib("cudnn")
    except not_found as e:      # also DynamicLibUnknownError / DynamicLibNotAvailableError (its subclasses)
        raise AttentionUnavailable(f"cuda-pathfinder {ver} found no libcudnn.so.9 (or a library it needs first, "
                                   f"cuBLASLt): {type(e).__name__}: {_first_line(e)}") from None
    except (RuntimeError, OSError) as e:   # found, but its dlopen failed (pathfinder raises RuntimeError)
        raise AttentionUnavailable(f"cuda-pathfinder {ver} could not load libcudnn.so.9: {type(e).__name__}: "
                                   f"{_first_line(e)}") from None
    path = getattr(dl, "abs_path", None)
    if path:
        old, folder = os.environ.get("LD_LIBRARY_PATH", ""), os.path.dirname(path)
        if old.split(os.pathsep)[0] != folder:
            os.environ["LD_LIBRARY_PATH"] = folder + (os.pathsep + old if old else "")
    return {"path": path, "found_via": getattr(dl, "found_via", None), "pathfinder": ver}


def _cupy_cublas_first() -> None:
    """On a CUDA machine, CuPy's libcublas (and the libcublasLt it links) is loaded before cuda-pathfinder loads
    libcudnn: pathfinder loads cuDNN's cuBLASLt dependency first and takes one already in the process, so cuDNN and
    the cuBLAS yardstick (blas.py, which orders its bindings the same way) share CuPy's library instead of a second
    copy pathfinder might find elsewhere. Without a GPU (or CuPy) there is nothing to order."""
    if not provenance.gpu_available():
        return
    try:
        gpu.cp().cuda.device.get_cublas_handle()
    except Exception as e:  # CuPy's cuBLAS failing is reported where it is used; here it only orders the loads
        log.warning("CuPy's cuBLAS did not initialize before libcudnn was loaded: %s: %s", type(e).__name__, e)


def _first_line(e: BaseException, cap: int = 400) -> str:
    """An error's first line (cuda-pathfinder's not-found message goes on with directory listings), capped."""
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else "")[:cap]


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


_CUDNN: dict = {}


def import_cudnn():
    """The ``cudnn`` frontend module, or AttentionUnavailable with the reason (cached). libcudnn is loaded first
    through cuda-pathfinder (:func:`_load_libcudnn`); when that fails the frontend still searches for its own, and
    the error -- if it finds none either -- names both reasons."""
    if "module" in _CUDNN:
        return _CUDNN["module"]
    if "error" in _CUDNN:
        raise AttentionUnavailable(_CUDNN["error"])
    try:
        lib, lib_why = _load_libcudnn(), None
    except AttentionUnavailable as e:
        lib, lib_why = None, str(e)
    try:
        import cudnn  # nvidia-cudnn-frontend

        ver = cudnn.backend_version()
    except Exception as e:  # ImportError, a missing libcudnn (OSError / RuntimeError from the backend query)
        _CUDNN["error"] = (f"the cuDNN frontend (Python package nvidia-cudnn-frontend, module 'cudnn') is not usable: "
                           f"{type(e).__name__}: {e}"
                           + (f"; libcudnn.so.9 was not loaded beforehand: {lib_why}" if lib_why else ""))
        raise AttentionUnavailable(_CUDNN["error"]) from None
    if lib_why:
        log.warning("libcudnn not loaded through cuda-pathfinder (%s); the cuDNN frontend found its own", lib_why)
    _CUDNN["module"] = cudnn
    own = f"the frontend's own (not loaded by cuda-pathfinder: {lib_why})"
    _CUDNN["info"] = {"frontend": getattr(cudnn, "__version__", "?"), "backend": int(ver),
                      "libcudnn": lib["path"] if lib else own, "libcudnn_found_via": lib["found_via"] if lib else None,
                      "cuda_pathfinder": lib["pathfinder"] if lib else None}
    return cudnn


def cudnn_info() -> dict:
    """Versions of the loaded frontend / backend (empty before a successful import)."""
    return dict(_CUDNN.get("info", {}))


def status() -> dict:
    """Which fused paths this machine can run, with versions or the reason (for run parameters / logs)."""
    out = {}
    try:
        import_cudnn()
        out["cudnn"] = cudnn_info()
    except AttentionUnavailable as e:
        out["cudnn"] = f"unavailable: {e}"
    try:
        out["torch"] = import_torch().__version__
    except AttentionUnavailable as e:
        out["torch"] = f"unavailable: {e}"
    return out


def import_torch():
    try:
        import torch
        import torch.nn.functional  # noqa: F401
    except Exception as e:
        raise AttentionUnavailable(f"PyTorch is not importable: {type(e).__name__}: {e}") from None
    if not torch.cuda.is_available():
        raise AttentionUnavailable("PyTorch sees no CUDA device")
    return torch


def _gpu_ok() -> str | None:
    return None if provenance.gpu_available() else "no CUDA GPU with cupy on this machine"
