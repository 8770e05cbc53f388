"""The GPU build layer and kernel launchers (CuPy).

CUDA sources live in ``labkernels/kernels/*.cu``; :func:`module` compiles one source with NVRTC through
``cupy.RawModule`` for the running GPU's architecture, instantiating every template the registry lists
for that source (name expressions), and caches the module per process (CuPy also caches the binary on
disk). Launchers check their inputs and raise clear errors; nothing falls back silently.

Orientation: activations ``x`` are [nt, id] row-major (token-major), weights are GGUF rows [od, id] (one
row of blocks per output feature), outputs ``Y`` are float32 [nt, od] row-major.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .kernels import registry
from .kernels.registry import BM, BN, KernelSpec


class GpuError(RuntimeError):
    pass


class ShapeError(ValueError):
    pass


class SharedMemoryError(GpuError):
    """A kernel configuration needs more shared memory per block than the device allows."""


# ------------------------------------------------------------------ programmatic dependent launch (issue 18)

_PDL = {"on": False, "launches": 0}


@contextmanager
def programmatic_launches(on: bool = True):
    """Inside this context the lab's kernels from PDL-capable sources (:func:`pdl_sources`) are launched with CUDA's
    programmatic-stream-serialization attribute (``cuLaunchKernelEx``): each may be scheduled while the kernel ahead
    of it in the stream is finishing, and waits in its ``LK_PDL_ENTRY()`` (``griddepcontrol.wait``) until that kernel
    has completed and its memory is visible. Every other launch -- cuBLAS, cuDNN, CuPy's own kernels, a lab source
    without the entry -- stays a normal stream-ordered launch. The prefill's graph capture uses it
    (``PrefillOptions.pdl``); captured, such launches become programmatic edges of the graph."""
    old = _PDL["on"]
    _PDL["on"] = bool(on)
    try:
        yield
    finally:
        _PDL["on"] = old


def pdl_active() -> bool:
    return _PDL["on"]


def pdl_launch_count() -> int:
    """Programmatic launches issued so far in this process (a capture's count is the difference around it)."""
    return _PDL["launches"]


_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_GLOBAL = re.compile(r"__global__\b[^{;]*\{")


def pdl_entry_report(text: str) -> tuple[int, int]:
    """(kernels, kernels whose body begins with ``LK_PDL_ENTRY();``) of one CUDA source text (comments ignored)."""
    s = _COMMENTS.sub("", text)
    heads = list(_GLOBAL.finditer(s))
    ok = sum(1 for m in heads if s[m.end():].lstrip().startswith("LK_PDL_ENTRY();"))
    return len(heads), ok


@lru_cache(maxsize=None)
def pdl_sources(kernels_dir=None) -> frozenset:
    """The kernel sources whose every ``__global__`` function begins with ``LK_PDL_ENTRY()`` (kernels/common.cuh):
    only their kernels are ever launched programmatically (a kernel without the wait could read its predecessor's
    output before it is written)."""
    kdir = registry.KERNELS_DIR if kernels_dir is None else Path(kernels_dir)
    out = set()
    for p in sorted(Path(kdir).glob("*.cu")):
        n, ok = pdl_entry_report(p.read_text())
        if n and ok == n:
            out.add(p.name)
    return frozenset(out)


_SCALARS = {np.dtype(np.int32): "c_int32", np.dtype(np.uint32): "c_uint32", np.dtype(np.int64): "c_int64",
            np.dtype(np.uint64): "c_uint64", np.dtype(np.float32): "c_float", np.dtype(np.float64): "c_double"}


def kernel_params(args, prefix: tuple = ()):
    """(holders, params) for a driver-API launch: ``prefix`` are raw by-value parameters (bytes, e.g. 128-byte tensor
    maps), then each argument as CuPy passes it -- a device array by its pointer, a numpy scalar by its type; anything
    else is refused (a Python int's width would be a guess). ``params`` is the array of the holders' addresses; keep
    ``holders`` alive until the launch call has returned."""
    import ctypes

    holders = [ctypes.create_string_buffer(bytes(t), len(t)) for t in prefix]
    for a in args:
        if isinstance(a, np.generic):
            t = _SCALARS.get(a.dtype)
            if t is None:
                raise GpuError(f"a driver-API launch takes int32/uint32/int64/uint64/float32/float64 scalars, got "
                               f"{a.dtype}")
            holders.append(getattr(ctypes, t)(a.item()))
        elif hasattr(a, "data") and hasattr(a.data, "ptr"):
            holders.append(ctypes.c_uint64(int(a.data.ptr)))
        else:
            raise GpuError(f"a driver-API launch takes device arrays and numpy scalars, got {type(a).__name__} "
                           f"(wrap Python numbers in np.int32 / np.float32 ...)")
    return holders, np.array([ctypes.addressof(h) for h in holders], dtype=np.uintp)


def launch_programmatic(func_ptr: int, grid, block, smem: int, params, stream_ptr: int, what: str = "kernel",
                        cluster: int = 1, programmatic: bool = True):
    """``cuLaunchKernelEx`` with the programmatic-stream-serialization attribute (see :func:`programmatic_launches`)
    and/or, ``cluster`` > 1, thread-block clusters of that many CTAs along x (round 7's pair exchange, EPI=3)."""
    from cuda.bindings import driver as drv

    g = tuple(int(v) for v in grid) + (1,) * (3 - len(grid))
    b = tuple(int(v) for v in block) + (1,) * (3 - len(block))
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g[:3]
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b[:3]
    cfg.sharedMemBytes = int(smem)
    cfg.hStream = drv.CUstream(int(stream_ptr))
    attrs = []
    if programmatic:
        at = drv.CUlaunchAttribute()
        at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        at.value.programmaticStreamSerializationAllowed = 1
        attrs.append(at)
    if cluster > 1:
        if g[0] % cluster:
            raise GpuError(f"launch of {what}: grid {g} is not a multiple of its cluster of {cluster} CTAs")
        cl = drv.CUlaunchAttribute()
        cl.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        cl.value.clusterDim.x, cl.value.clusterDim.y, cl.value.clusterDim.z = int(cluster), 1, 1
        attrs.append(cl)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    (err,) = drv.cuLaunchKernelEx(cfg, drv.CUfunction(int(func_ptr)), params, 0)
    if int(err) != 0:
        raise GpuError(f"{'programmatic ' if programmatic else ''}launch of {what} grid {g}"
                       f"{f' in clusters of {cluster}' if cluster > 1 else ''} failed: {err}")
    if programmatic:
        _PDL["launches"] += 1


def cp():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - CPU machines
        raise GpuError("labkernels.gpu needs cupy and a CUDA GPU (pip install cupy-cuda12x / cupy-cuda13x)") from e
    return cupy


@lru_cache(maxsize=1)
def device_props() -> dict:
    c = cp()
    p = c.cuda.runtime.getDeviceProperties(c.cuda.Device().id)
    return {"cc": p["major"] * 10 + p["minor"], "sm_count": p["multiProcessorCount"],
            "smem_optin": p["sharedMemPerBlockOptin"], "smem_per_sm": p["sharedMemPerMultiprocessor"],
            "l2": p["l2CacheSize"], "name": p["name"].decode() if isinstance(p["name"], bytes) else p["name"]}


def arch_option() -> str:
    return f"-arch=sm_{device_props()['cc']}"


def lineinfo_options() -> tuple:
    """``("-lineinfo",)`` when ``LABKERNELS_LINEINFO=1`` (Nsight Compute's source view: SASS mapped to .cu lines, the
    code itself unchanged), else nothing: the production builds stay as they are unless a profiling run asks."""
    return ("-lineinfo",) if os.environ.get("LABKERNELS_LINEINFO", "") not in ("", "0") else ()


def module(source: str, extra_options: tuple = (), kernels_dir=None):
    """Compile one kernel source with every registered instantiation of it (from ``kernels_dir``, default the
    lab's kernels folder: another one holds another build of the same sources, e.g. an older commit's);
    ``-lineinfo`` added under ``LABKERNELS_LINEINFO=1`` (:func:`lineinfo_options`)."""
    extra = tuple(extra_options)
    extra += tuple(o for o in lineinfo_options() if o not in extra)
    return _module(source, extra, kernels_dir)


@lru_cache(maxsize=None)
def _module(source: str, extra_options: tuple = (), kernels_dir=None):
    c = cp()
    kdir = registry.KERNELS_DIR if kernels_dir is None else kernels_dir
    path = kdir / source
    if not path.exists():
        raise GpuError(f"kernel source {path} not found")
    names = [k.name_expression for k in registry.KERNELS if k.source == source]
    opts = ("-std=c++17", arch_option(), f"-I{kdir}", *registry.cuda_defines()) + tuple(extra_options)
    try:
        mod = c.RawModule(code=path.read_text(), options=opts, name_expressions=names)
        mod.compile()
    except Exception as e:
        raise GpuError(f"compiling {source} failed: {e}") from e
    return mod


def _attr(func, name: str) -> int:
    return int(getattr(func, name))


class Kernel:
    """A compiled registry instantiation, with its resource attributes and occupancy from the CUDA API."""

    def __init__(self, spec: KernelSpec, extra_options: tuple = (), kernels_dir=None):
        self.spec = spec
        self.kernels_dir = kernels_dir
        mod = module(spec.source, tuple(extra_options), kernels_dir)
        self.func = mod.get_function(spec.name_expression)
        self.smem = spec.dynamic_smem()
        cap = device_props()["smem_optin"]
        if self.smem > cap:
            raise SharedMemoryError(f"{spec.key} needs {self.smem} B of dynamic shared memory per block; this "
                                    f"device allows {cap} B (opt-in cap)")
        if self.smem > 48 * 1024:
            self.func.max_dynamic_shared_size_bytes = self.smem

    @property
    def regs(self) -> int:
        return _attr(self.func, "num_regs")

    @property
    def local_bytes(self) -> int:
        return _attr(self.func, "local_size_bytes")

    @property
    def static_smem(self) -> int:
        return _attr(self.func, "shared_size_bytes")

    @property
    def ptr(self) -> int:
        """The CUfunction handle (cupy RawKernel -> .kernel -> Function.ptr)."""
        f = self.func
        return int(f.ptr) if hasattr(f, "ptr") else int(f.kernel.ptr)

    def _ensure_smem(self, smem: int | None) -> int:
        """``smem`` (default the registry formula's), the kernel's opt-in dynamic shared-memory limit raised to it
        where a launch sizes its own above 48 KB and above what the formula asked at load."""
        smem = self.smem if smem is None else int(smem)
        if smem > max(self.smem, 48 * 1024) and smem > getattr(self, "_smem_limit", 0):
            cap = device_props()["smem_optin"]
            if smem > cap:
                raise SharedMemoryError(f"{self.spec.key} launch needs {smem} B of dynamic shared memory per block; "
                                        f"this device allows {cap} B (opt-in cap)")
            self.func.max_dynamic_shared_size_bytes = smem
            self._smem_limit = smem
        return smem

    def occupancy_api(self, smem: int | None = None) -> int:
        """cudaOccupancyMaxActiveBlocksPerMultiprocessor for this kernel at its block size and smem (``smem``: a
        launch's own dynamic shared memory, where the launcher sizes it per call: gemv_kq PIPE > 0)."""
        c = cp()
        drv = c.cuda.driver
        smem = self._ensure_smem(smem)
        if hasattr(drv, "occupancyMaxActiveBlocksPerMultiprocessor"):
            return int(drv.occupancyMaxActiveBlocksPerMultiprocessor(self.ptr, self.spec.threads, smem))
        from cuda.bindings import driver as cdrv  # cuda-python, present on the GPU image

        err, n = cdrv.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.ptr, self.spec.threads, smem)
        if int(err) != 0:
            raise GpuError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {err}")
        return int(n)

    def launch(self, grid, args, smem: int | None = None):
        """Launch on the current stream (use ``with cupy.cuda.Stream(): ...`` for another); inside
        :func:`programmatic_launches`, a kernel of a PDL-capable source launches programmatically. ``smem``: this
        launch's dynamic shared memory where the launcher sizes it per call (default the registry formula's); the
        kernel's opt-in limit is raised to it once needed."""
        smem = self._ensure_smem(smem)
        if _PDL["on"] and self.spec.source in pdl_sources(self.kernels_dir):
            holders, params = kernel_params(args)
            launch_programmatic(self.ptr, grid, (self.spec.threads,), smem, params,
                                cp().cuda.get_current_stream().ptr, self.spec.key)
            del holders
            return
        try:
            self.func(tuple(int(g) for g in grid), (self.spec.threads,), args, shared_mem=smem)
        except Exception as e:
            raise GpuError(f"launch of {self.spec.key} grid {grid} failed: {e}") from e


@lru_cache(maxsize=None)
def kernel_of(spec: KernelSpec, kernels_dir=None) -> Kernel:
    """The compiled kernel of one registry instantiation (cached per process; ``kernels_dir``: see :func:`module`)."""
    return Kernel(spec, kernels_dir=kernels_dir)


def kernel(family: str, **params) -> Kernel:
    return kernel_of(registry.find(family, **params))


# ------------------------------------------------------------------ activations


@dataclass
class Q8Tiles:
    """q8_1 activations in the tile-ordered planes of the GEMM kernels (prepass output)."""
    qa8: object       # cupy uint8 [ntile * nchunk * 64 * 32]
    sda: object       # cupy uint32 [ntile * nchunk * 64]
    nt: int
    id: int

    @property
    def ntile(self) -> int:
        return (self.nt + BM - 1) // BM


def _check_act(x, what="activations"):
    c = cp()
    if not isinstance(x, c.ndarray):
        raise ShapeError(f"{what} must be a cupy array on the GPU, got {type(x).__name__}")
    if x.ndim != 2:
        raise ShapeError(f"{what} must be 2-D [nt, id], got shape {x.shape}")
    if x.dtype not in (np.float32, np.float16):
        raise ShapeError(f"{what} must be float32 or float16, got {x.dtype}")
    if x.shape[0] < 1:
        raise ShapeError(f"{what}: nt must be >= 1")
    if x.shape[1] % 256:
        raise ShapeError(f"{what}: inner dimension id={x.shape[1]} is not a multiple of 256 (q4_K/q6_K "
                         "super-blocks); pad the weights or use another path")
    return c.ascontiguousarray(x)


def prepass(x) -> Q8Tiles:
    """f32/f16 activations [nt, id] -> tile-ordered q8_1 planes (one launch)."""
    c = cp()
    x = _check_act(x)
    nt, id_ = x.shape
    nchunk = id_ // 32
    ntile = (nt + BM - 1) // BM
    qa8 = c.empty(ntile * nchunk * BM * 32, dtype=c.uint8)
    sda = c.empty(ntile * nchunk * BM, dtype=c.uint32)
    k = kernel("prepass_q8_1", F16=int(x.dtype == np.float16))
    k.launch((ntile * BM * nchunk // 8,), (x, qa8, sda, np.int32(nt), np.int32(id_)))
    return Q8Tiles(qa8, sda, nt, id_)


def quantize_q8_1_rows(x):
    """f32 activations [nt, id] -> ggml block_q8_1 rows, uint8 [nt, id/32*36] (the generic kernel's A)."""
    c = cp()
    x = _check_act(x)
    if x.dtype != np.float32:
        raise ShapeError("quantize_q8_1_rows takes float32 activations")
    nt, id_ = x.shape
    out = c.empty((nt, id_ // 32 * 36), dtype=c.uint8)
    k = kernel("quantize_q8_1_rows", F16=0)
    k.launch(((nt * (id_ // 32) + 7) // 8,), (x, out, np.int32(nt), np.int32(id_)))
    return out


def tiles_to_q8_1(t: Q8Tiles):
    """Decode prepass planes back to (qs int8 [nt, id], d float16 [nt, id/32], isum int [nt, id/32]) on the
    host -- for tests that compare the GPU prepass with the CPU quantizer byte for byte."""
    qa8 = cp().asnumpy(t.qa8).reshape(t.ntile, t.id // 32, BM, 2, 16)
    sda = cp().asnumpy(t.sda).reshape(t.ntile, t.id // 32, BM)
    p = np.arange(BM)
    swap = (p >> 2) & 1                                            # halves stored swapped
    halves = np.stack([qa8[:, :, p, swap, :], qa8[:, :, p, 1 - swap, :]], axis=3)  # [tile, c, p, 2, 16]
    qs = halves.reshape(t.ntile, t.id // 32, BM, 32).transpose(0, 2, 1, 3).reshape(t.ntile * BM, t.id)
    idx = (p >> 4) * 16 + (p & 7) * 2 + ((p >> 3) & 1)
    words = sda[:, :, idx].transpose(0, 2, 1).reshape(t.ntile * BM, t.id // 32)
    d = (words & 0xFFFF).astype(np.uint16).view(np.float16)
    isum = (words >> 16).astype(np.uint16).view(np.int16).astype(np.int32)
    return qs[: t.nt].view(np.int8), d[: t.nt], isum[: t.nt]


# ------------------------------------------------------------------ weights and GEMMs


@dataclass
class QWeight:
    """A q4_K / q6_K weight matrix on the GPU: raw GGUF rows [od, row_bytes] at a given block stride."""
    raw: object       # cupy uint8 [od, nsb * stride]
    qtype: str        # "q4_K" | "q6_K"
    od: int
    id: int
    stride: int
    host: object = None   # the GGUF rows on the host (kept by reference, for the round-7 repack)
    wg: object = None     # labkernels.wgmma.WgWeight, made on first use by qmatmul

    @classmethod
    def upload(cls, w_raw: np.ndarray, qtype: str, stride: int | None = None) -> "QWeight":
        """GGUF rows [od, row_bytes] of a GEMM weight type (``quants.QTYPES``: q4_K, q6_K; ``q6_K_224`` names
        q6_K at its padded stride) at one of the strides its record lists (default: the natural one)."""
        from .quants import QTYPES, normalize_qtype, pad_q6k

        qt = QTYPES[normalize_qtype(qtype)]
        if qt.name != qt.base:                    # a padded spelling: the base type at this record's stride
            qt, stride = QTYPES[qt.base], qt.nbytes
        if not qt.gemm_strides:
            raise ShapeError(f"the GEMM kernels take {' or '.join(k for k, t in QTYPES.items() if t.gemm_strides)} "
                             f"weights, not {qt.name}")
        natural = qt.nbytes
        w_raw = np.asarray(w_raw)
        if w_raw.dtype != np.uint8 or w_raw.ndim != 2:
            raise ShapeError(f"weights must be uint8 [od, row_bytes], got {w_raw.dtype} {w_raw.shape}")
        if w_raw.shape[1] % natural:
            raise ShapeError(f"{qt.name} rows of {w_raw.shape[1]} bytes are not whole {natural}-byte blocks")
        stride = stride or natural
        if stride not in qt.gemm_strides:
            raise ShapeError(f"{qt.name} block stride must be {' or '.join(map(str, qt.gemm_strides))}, got {stride}")
        od, id_ = w_raw.shape[0], w_raw.shape[1] // natural * qt.qk
        data = pad_q6k(w_raw) if stride != natural else w_raw
        return cls(cp().asarray(np.ascontiguousarray(data)), qt.name, od, id_, stride, host=w_raw)


def _out(nt, od, out):
    c = cp()
    if out is None:
        return c.empty((nt, od), dtype=c.float32)
    if out.shape != (nt, od) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ShapeError(f"out must be contiguous float32 [{nt}, {od}], got {out.dtype} {out.shape}")
    return out


def gemm(w: QWeight, a: Q8Tiles, kernel: str | None = None, out=None, kernels_dir=None, **tparams):
    """Y[nt, od] = A x W^T with a tile-ordered-A kernel. ``kernel``: a variant name of
    ``registry.VARIANTS`` (``q6k_expb_epi1``), a family (``q4k_nb``: its default variant) or None (the
    weight type's default int8 variant); ``tparams`` override template parameters (sweep points). The weight
    block stride is the uploaded weight's."""
    if a.id != w.id:
        raise ShapeError(f"inner dimensions differ: activations id={a.id}, weights id={w.id}")
    try:
        v = registry.resolve(kernel) if kernel else registry.default_variant(w.qtype)
    except KeyError as e:
        raise ShapeError(str(e)) from None
    if v.act != "q8_1_tiles":
        raise ShapeError(f"{v.name} takes {v.act} activations, not the tile-ordered q8_1 planes of gpu.prepass")
    if v.qtype != w.qtype:
        raise ShapeError(f"{v.name} takes {v.qtype} weights, got {w.qtype}")
    try:
        spec = v.spec(w.stride if v.qtype == "q6_K" else None, **tparams)
    except KeyError as e:
        raise ShapeError(str(e)) from None
    k = kernel_of(spec, kernels_dir)
    y = _out(a.nt, w.od, out)
    k.launch((a.ntile, (w.od + BN - 1) // BN),
             (w.raw, a.qa8, a.sda, y, np.int32(a.nt), np.int32(w.od), np.int32(w.id)))
    return y


def gemm_generic_q6k(w: QWeight, a_rows, nt: int, out=None, kernels_dir=None):
    """The old road: Y = A (ggml q8_1 rows from quantize_q8_1_rows) x W^T with the q6k_generic variant."""
    v = registry.variant("q6k_generic")
    if w.qtype != v.qtype:
        raise ShapeError("the generic kernel here is the q6_K one")
    if a_rows.shape != (nt, w.id // 32 * 36):
        raise ShapeError(f"q8_1 rows must be [{nt}, {w.id // 32 * 36}], got {a_rows.shape}")
    k = kernel_of(v.spec(w.stride), kernels_dir)
    y = _out(nt, w.od, out)
    k.launch(((nt + BM - 1) // BM, (w.od + BN - 1) // BN),
             (w.raw, a_rows, y, np.int32(nt), np.int32(w.od), np.int32(w.id)))
    return y


def dequant_f16(w: QWeight, out=None, kernels_dir=None):
    """Weights -> fp16 [od, id] on the GPU (for the cuBLAS baselines)."""
    c = cp()
    if out is None:
        out = c.empty((w.od, w.id), dtype=c.float16)
    qt = 4 if w.qtype == "q4_K" else 6
    stride = 0 if w.stride in (144, 210) else w.stride
    k = kernel_of(registry.find("dequant_f16", QT=qt, STRIDE=stride), kernels_dir)
    n = w.od * (w.id // 32)
    k.launch(((n + 255) // 256,), (w.raw, out, np.int32(w.od), np.int32(w.id)))
    return out


def matmul_f16(x16, w16, out=None):
    """cuBLAS fp16 through cupy.matmul: [nt, id] x [od, id]^T -> fp16 [nt, od]."""
    c = cp()
    return c.matmul(x16, w16.T, out=out)


def bmm_f16(A, B, out=None):
    """out[b] = A[b] @ B[b] for C-contiguous fp16 [batch, M, K] x [batch, K, N] -> fp16 [batch, M, N]:
    one cuBLAS strided-batched GEMM on the tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F).
    (CuPy's batched ``matmul`` upcasts fp16 operands to fp32 and runs fp32 GEMMs.)"""
    c = cp()
    from cupy.cuda import cublas

    if A.dtype != np.float16 or B.dtype != np.float16:
        raise ShapeError(f"bmm_f16 takes float16 operands, got {A.dtype} and {B.dtype}")
    if A.ndim != 3 or B.ndim != 3 or A.shape[0] != B.shape[0] or A.shape[2] != B.shape[1]:
        raise ShapeError(f"bmm_f16 shapes {A.shape} x {B.shape} do not chain")
    if not (A.flags.c_contiguous and B.flags.c_contiguous):
        raise ShapeError("bmm_f16 needs C-contiguous operands")
    batch, M, K = A.shape
    N = B.shape[2]
    if out is None:
        out = c.empty((batch, M, N), dtype=c.float16)
    elif out.shape != (batch, M, N) or out.dtype != np.float16 or not out.flags.c_contiguous:
        raise ShapeError(f"out must be C-contiguous float16 {(batch, M, N)}")
    handle = c.cuda.device.get_cublas_handle()
    cublas.setStream(handle, c.cuda.get_current_stream().ptr)   # CuPy's wrapper: refused under graph capture
    one, zero = np.array(1.0, np.float32), np.array(0.0, np.float32)
    r16 = 2                                                     # CUDA_R_16F
    compute = getattr(cublas, "CUBLAS_COMPUTE_32F", 68)
    algo = getattr(cublas, "CUBLAS_GEMM_DEFAULT", -1)
    # row-major C = A B is column-major C^T = B^T A^T: (N x K)(K x M) with leading dims N, K, N
    cublas.gemmStridedBatchedEx(handle, 0, 0, N, M, K, one.ctypes.data, B.data.ptr, r16, N, K * N,
                                A.data.ptr, r16, K, M * K, zero.ctypes.data, out.data.ptr, r16, N, M * N,
                                batch, compute, algo)
    return out


# ------------------------------------------------------------------ cuBLAS / cuBLASLt: nvmath-python's bindings

def _bindings():
    """(nvmath.bindings.cublas, nvmath.bindings.cublasLt, nvmath.CudaDataType): nvmath-python's typed bindings of
    the cuBLAS and cuBLASLt C APIs (function pointers, enums, struct types from the libraries' headers), bound to the
    libcublas CuPy loaded: CuPy's cuBLAS is initialized first, and the bindings' loader (cuda.pathfinder) takes a
    library already loaded in the process before it searches for one. They call cuBLAS directly, so a call may be
    captured into a CUDA graph (CuPy's own wrappers call ``setStream`` first, which refuses to run while a stream
    captures -- cuBLAS itself captures fine)."""
    cp().cuda.device.get_cublas_handle()          # CuPy loads and initializes its libcublas first
    try:
        import nvmath
        from nvmath.bindings import cublas, cublasLt
    except ImportError as e:
        raise GpuError(f"gemm_dense needs nvmath-python's cuBLAS bindings (pip install nvmath-python; the gpu "
                       f"extra): {e}") from None
    return cublas, cublasLt, nvmath.CudaDataType


def dense_type(dtype) -> int:
    """The ``cudaDataType`` of gemm_dense's float32 / float16 operands (:func:`dense_plan`'s ``t_in``)."""
    dt = _bindings()[2]
    return int(dt.CUDA_R_16F if np.dtype(dtype) == np.float16 else dt.CUDA_R_32F)


def cublas_libraries() -> dict:
    """Which libcublas / libcublasLt the bindings call (cuda.pathfinder's record: path and whether the library was
    in the process before it looked), and their versions."""
    from cuda.pathfinder import load_nvidia_dynamic_lib

    cublas, lt, _ = _bindings()
    out = {}
    for name in ("cublas", "cublasLt"):
        d = load_nvidia_dynamic_lib(name)
        out[name] = {"path": d.abs_path, "already_loaded": bool(d.was_already_loaded_from_elsewhere)}
    out["cublas"]["version"] = int(cublas.get_version(int(cp().cuda.device.get_cublas_handle())))
    out["cublasLt"]["version"] = int(lt.get_version())
    return out


#: alpha = 1 and beta = 0 (host scalars, read when a call is made or captured)
_ONE, _ZERO = np.ones(1, np.float32), np.zeros(1, np.float32)


def _gemm_ex_capturable(transa, transb, m, n, k, A, atype, lda, B, btype, ldb, C, ctype, ldc):
    """cublasGemmEx (alpha 1, beta 0, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) on CuPy's cuBLAS handle and the current
    stream, through :func:`_bindings` (``transa`` / ``transb``: True = transposed)."""
    cublas, _, _ = _bindings()
    c = cp()
    handle = int(c.cuda.device.get_cublas_handle())
    op = lambda t: cublas.Operation.T if t else cublas.Operation.N  # noqa: E731
    try:
        cublas.set_stream(handle, int(c.cuda.get_current_stream().ptr))
        cublas.gemm_ex(handle, op(transa), op(transb), m, n, k, _ONE.ctypes.data, A, atype, lda, B, btype, ldb,
                       _ZERO.ctypes.data, C, ctype, ldc, cublas.ComputeType.COMPUTE_32F, cublas.GemmAlgo.DEFAULT)
    except cublas.cuBLASError as e:
        raise GpuError(f"cublasGemmEx failed: {e}") from None


def pinned_empty(shape, dtype):
    """A numpy array in page-locked host memory (cupyx.empty_pinned): a copy from it is asynchronous and may be a
    node of a captured CUDA graph (a copy from pageable memory may not)."""
    import cupyx

    return cupyx.empty_pinned(shape, dtype)


def host_device_pointer(host) -> np.uint64:
    """The device-side address of a pinned numpy array (``cuMemHostGetDevicePointer``), as the kernel argument a
    kernel reads the host buffer through (the prefill graph's token ids, PrefillOptions.ids_from_host)."""
    from cuda.bindings import driver as drv

    err, ptr = drv.cuMemHostGetDevicePointer(int(host.ctypes.data), 0)
    if int(err) != 0:
        raise GpuError(f"cuMemHostGetDevicePointer failed: {err} (is the buffer pinned?)")
    return np.uint64(int(ptr))


def record_in_graph(event, stream) -> None:
    """Record a CuPy event on a capturing stream as an event-record node of the graph (``cuEventRecordWithFlags``,
    external): each replay then timestamps it, so that the elapsed time between two such events is the GPU time
    between those points of the replay."""
    from cuda.bindings import driver as drv

    (err,) = drv.cuEventRecordWithFlags(drv.CUevent(int(event.ptr)), drv.CUstream(int(stream.ptr)),
                                        drv.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL)
    if int(err) != 0:
        raise GpuError(f"cuEventRecordWithFlags (external, in a capture) failed: {err}")


def h2d_async(dst, host, stream) -> None:
    """Copy the pinned numpy array ``host`` into the C-contiguous device array ``dst`` on ``stream`` with the
    runtime's memcpyAsync (which stream capture records as a graph node; CuPy's ``ndarray.set`` refuses to run
    while a stream captures)."""
    c = cp()
    if dst.nbytes != host.nbytes or not dst.flags.c_contiguous or not host.flags.c_contiguous:
        raise ShapeError(f"h2d_async: {host.nbytes} host bytes into a {dst.nbytes}-byte device array")
    c.cuda.runtime.memcpyAsync(dst.data.ptr, host.ctypes.data, host.nbytes, c.cuda.runtime.memcpyHostToDevice,
                               stream.ptr)


#: gemm_dense's paths: "lt" = cublasLtMatmul with an algorithm chosen once per shape that does not split k (no
#: split-K reduction, so no memset of its counters before the GEMM: one graph node instead of two), "gemm_ex" =
#: cublasGemmEx with cuBLAS's own choice (which splits k at some shapes, e.g. Gemma's stacked QKV at nt=512).
#: The default is gemm_ex: in the same-session A/B on the H200 (prefill runs 20261201T145658Z..145843Z, Gemma 3 270M
#: graph replay) lt removed 18 memset nodes per forward at nt=512 (36 at nt=64) but its no-split kernels made the
#: forward slower: nt=64 1.97-1.99 vs 1.66-1.72 ms, nt=512 3.40-3.50 vs 3.29-3.37 ms
DENSE_PATHS = ("lt", "gemm_ex")
DENSE_PATH = "gemm_ex"


def gemm_dense(x, w, out=None, path: str | None = None):
    """y[n, od] = x[n, id] @ w[od, id]^T for C-contiguous float32 or float16 operands of one type (fp32 accumulate;
    float32 out) as one cuBLAS call on the current stream, through nvmath-python's cuBLAS / cuBLASLt bindings
    (:func:`_bindings`): unlike ``cupy.matmul`` it may be captured into a CUDA graph (CuPy refuses its own cuBLAS
    calls during capture).

    ``path`` (default :data:`DENSE_PATH`, ``"gemm_ex"``): ``"lt"`` runs ``cublasLtMatmul`` with the heuristic's best algorithm
    that does not split k and needs no workspace (:func:`dense_plan`, chosen once per shape and pointer alignment);
    where there is none, or cuBLASLt cannot be reached, it runs ``cublasGemmEx`` and says why in
    :func:`dense_fallbacks` (and the log). ``"gemm_ex"``: ``cublasGemmEx`` with cuBLAS's own algorithm."""
    path = DENSE_PATH if path is None else path
    if path not in DENSE_PATHS:
        raise ValueError(f"gemm_dense path must be one of {DENSE_PATHS}, got {path!r}")
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ShapeError(f"gemm_dense shapes {x.shape} x {w.shape}^T do not chain")
    if x.dtype != w.dtype or x.dtype not in (np.float32, np.float16):
        raise ShapeError(f"gemm_dense takes float32 or float16 operands of one type, got {x.dtype} and {w.dtype}")
    if not (x.flags.c_contiguous and w.flags.c_contiguous):
        raise ShapeError("gemm_dense needs C-contiguous operands")
    n, k = x.shape
    od = w.shape[0]
    if out is not None and (out.shape != (n, od) or out.dtype != np.float32 or not out.flags.c_contiguous):
        raise ShapeError(f"out must be C-contiguous float32 {(n, od)}")
    if out is None:
        out = cp().empty((n, od), dtype=np.float32)
    if n == 0 or od == 0:
        return out
    t_in, t_out = dense_type(x.dtype), dense_type(np.float32)
    if path == "lt":
        plan = dense_plan(t_in, n, od, k, align_a=_align(w.data.ptr), align_b=_align(x.data.ptr),
                          align_d=_align(out.data.ptr))
        if plan.algo is not None:
            plan.run(w.data.ptr, x.data.ptr, out.data.ptr)
            return out
    # row-major Y = X W^T is column-major Y^T (od x n) = W (od x k, stored as k x od: transposed) X^T (k x n)
    _gemm_ex_capturable(True, False, od, n, k, w.data.ptr, t_in, k, x.data.ptr, t_in, k, out.data.ptr, t_out, od)
    return out


def _align(ptr: int) -> int:
    """The largest power of two (at most 256) that divides a device address: cuBLASLt's algorithms state the
    alignment they need, and the heuristic is told what the operands have."""
    a = 256
    while a > 1 and ptr % a:
        a //= 2
    return a


def _lt_handle():
    """This device's cuBLASLt handle (``cublasLtCreate``, one per device: a handle is tied to the device current at
    its creation), made once and kept for the process."""
    return _lt_handle_of(_device_id())


@lru_cache(maxsize=None)
def _lt_handle_of(device: int) -> int:
    lt = _bindings()[1]
    try:
        return int(lt.create())
    except lt.cuBLASLtError as e:
        raise GpuError(f"cublasLtCreate failed: {e}") from None


#: what a candidate's description holds: its cublasLtMatmulAlgoConfigAttributes_t (nvmath's MatmulAlgoConfigAttribute)
_LT_CFG = {"algo_id": "ID", "tile": "TILE_ID", "splitk": "SPLITK_NUM", "reduction": "REDUCTION_SCHEME",
           "swizzle": "CTA_SWIZZLING", "custom": "CUSTOM_OPTION", "stages": "STAGES_ID"}
LT_HEURISTIC_COUNT = 16                                        # candidates asked of the heuristic


def pick_dense_algo(candidates: list[dict]) -> tuple[int | None, str]:
    """The first candidate (the heuristic's order: best estimate first) that succeeded, needs no workspace and does
    not split k (``splitk`` 0 or 1: nothing to reduce, so no zeroed counters or output before the GEMM); returns
    (its position, why) or (None, why none fits)."""
    if not candidates:
        return None, "the cuBLASLt heuristic returned no algorithm"
    why = []
    for i, c in enumerate(candidates):
        if c.get("state", 0) != 0:
            why.append(f"#{i} state {c['state']}")
        elif c.get("workspace", 0):
            why.append(f"#{i} needs {c['workspace']} B of workspace")
        elif c.get("splitk", 1) not in (0, 1, None):       # > 1, or -1 (int32_t, read as 4294967295 before)
            why.append(f"#{i} splits k {c['splitk']} ways (reduction scheme {c.get('reduction')})")
        else:
            return i, f"heuristic candidate #{i} of {len(candidates)} (the first without split-K)"
    return None, f"none of the {len(candidates)} cuBLASLt candidates runs without split-K and workspace: " + \
        "; ".join(why)


def _set_attr(set_fn, dtype_fn, obj, attr, value) -> None:
    """Set one cuBLASLt descriptor / preference attribute, typed as the binding says the attribute is."""
    buf = np.array(value, dtype=dtype_fn(attr))
    set_fn(obj, attr, buf.ctypes.data, buf.itemsize)


class DensePlan:
    """One cuBLASLt matmul (descriptors + chosen algorithm) of gemm_dense's shape, kept for the process: the
    heuristic runs once, on the host, so the plan can be made (and run) inside a CUDA-graph capture."""

    def __init__(self, t_in: int, n: int, od: int, k: int, aligns: tuple):
        self.key = (t_in, n, od, k, aligns)
        self.algo = None
        self.info: dict = {}
        try:
            cublas, lt, _ = _bindings()
            handle = _lt_handle()
        except GpuError as e:
            self.note = f"cublasGemmEx runs: {e}"
            return
        self.lt, self.handle = lt, handle           # the plan's device's (dense_plan keys plans by device)
        f32 = dense_type(np.float32)
        D, P = lt.MatmulDescAttribute, lt.MatmulPreferenceAttribute
        try:
            self.desc = lt.matmul_desc_create(cublas.ComputeType.COMPUTE_32F, f32)    # fp32 accumulate and scale
            for attr, op in ((D.TRANSA, cublas.Operation.T), (D.TRANSB, cublas.Operation.N)):   # W^T, X as stored
                _set_attr(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, self.desc, attr, int(op))
            # column-major view of gemm_dense (as in cublasGemmEx): A = W stored k x od, B = X^T stored k x n, D od x n
            self.layouts = [lt.matrix_layout_create(t, r, c, ld)
                            for t, r, c, ld in ((t_in, k, od, k), (t_in, k, n, k), (f32, od, n, od))]
            pref = lt.matmul_preference_create()
        except lt.cuBLASLtError as e:
            self.note = f"cublasGemmEx runs: a cuBLASLt descriptor could not be made: {e}"
            return
        res = lt.MatmulHeuristicResult(LT_HEURISTIC_COUNT)
        got = np.zeros(1, np.int32)
        try:
            _set_attr(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref,
                      P.MAX_WORKSPACE_BYTES, 0)                                                  # no workspace
            for attr, a in zip((P.MIN_ALIGNMENT_A_BYTES, P.MIN_ALIGNMENT_B_BYTES, P.MIN_ALIGNMENT_C_BYTES,
                                P.MIN_ALIGNMENT_D_BYTES), aligns):
                _set_attr(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref,
                          attr, a)
            A, B, Dl = self.layouts
            lt.matmul_algo_get_heuristic(handle, self.desc, A, B, Dl, Dl, pref, LT_HEURISTIC_COUNT, res.ptr,
                                         got.ctypes.data)
        except lt.cuBLASLtError as e:
            self.note = f"cublasGemmEx runs: cublasLtMatmulAlgoGetHeuristic failed: {e}"
            return
        finally:
            lt.matmul_preference_destroy(pref)
        self.candidates = [self._describe(res[i]) for i in range(int(got[0]))]
        i, why = pick_dense_algo(self.candidates)
        if i is None:
            self.note = f"cublasGemmEx runs: {why}"
            return
        self._heuristic = res                               # kept: the algorithm every matmul reads lives in it
        self._algo = res[i]["algo"]
        self.algo = int(self._algo.ctypes.data)
        self.info = self.candidates[i]
        self.note = f"cublasLt: {why}"

    def _describe(self, r) -> dict:
        lt = self.lt
        d = {"state": int(r.state), "workspace": int(r.workspace_size), "waves": float(r.waves_count)}
        algo = int(r["algo"].ctypes.data)
        for name, attr in _LT_CFG.items():
            a = lt.MatmulAlgoConfigAttribute[attr]
            buf, written = np.zeros(1, lt.get_matmul_algo_config_attribute_dtype(a)), np.zeros(1, np.uint64)
            try:
                lt.matmul_algo_config_get_attribute(algo, a, buf.ctypes.data, buf.itemsize, written.ctypes.data)
                d[name] = int(buf[0])
            except lt.cuBLASLtError:
                d[name] = None
        return d

    def run(self, w_ptr: int, x_ptr: int, out_ptr: int) -> None:
        A, B, D = self.layouts
        try:
            self.lt.matmul(self.handle, self.desc, _ONE.ctypes.data, w_ptr, A, x_ptr, B, _ZERO.ctypes.data, out_ptr, D,
                           out_ptr, D, self.algo, 0, 0, int(cp().cuda.get_current_stream().ptr))
        except self.lt.cuBLASLtError as e:
            raise GpuError(f"cublasLtMatmul failed: {e} (shape n={self.key[1]} od={self.key[2]} k={self.key[3]})") \
                from None


_DENSE_PLANS: dict = {}


def _device_id() -> int:
    return int(cp().cuda.Device().id)


def dense_plan(t_in: int, n: int, od: int, k: int, align_a: int = 256, align_b: int = 256,
               align_d: int = 256) -> DensePlan:
    """The cached :class:`DensePlan` of one gemm_dense shape (input type ``t_in``: :func:`dense_type`, x's rows n,
    w's rows od, depth k) and operand alignments in bytes (A = w, B = x, D = out) on this device; a plan that has no
    algorithm is logged once."""
    key = (_device_id(), t_in, n, od, k, align_a, align_b, align_d)
    p = _DENSE_PLANS.get(key)
    if p is None:
        p = _DENSE_PLANS[key] = DensePlan(t_in, n, od, k, (align_a, align_b, align_d, align_d))
        if p.algo is None:
            import logging

            logging.getLogger("labkernels.gpu").warning("gemm_dense n=%d od=%d k=%d: %s", n, od, k, p.note)
    return p


def dense_fallbacks() -> list[dict]:
    """Every gemm_dense shape of this process that ran cublasGemmEx instead of cuBLASLt, and why."""
    out = [(k, p) for k, p in _DENSE_PLANS.items() if p.algo is None]
    names = {dense_type(np.float16): "f16", dense_type(np.float32): "f32"} if out else {}
    return [{"device": k[0], "type": names.get(k[1], str(k[1])), "n": k[2], "od": k[3], "k": k[4], "note": p.note}
            for k, p in out]


# ------------------------------------------------------------------ shape checks shared by the launchers and the dispatch


#: the weight types the GEMM families take
GEMM_QTYPES = ("q4_K", "q6_K")
_MAX_DIM = 2 ** 31 - 1


def check_gemm_shape(qtype, nt, od, id_, what: str = "gemm") -> None:
    """ShapeError unless ``qtype`` is q4_K / q6_K and nt, od, id are integers in 1..2^31-1 with id a multiple of 256
    (host-side, O(1): :func:`choose` runs it on every call)."""
    if qtype not in GEMM_QTYPES:
        raise ShapeError(f"{what}: qtype must be {' or '.join(GEMM_QTYPES)}, got {qtype!r}")
    for name, v in (("nt", nt), ("od", od), ("id", id_)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ShapeError(f"{what}: {name} must be an integer, got {v!r} ({type(v).__name__})")
        if not 1 <= v <= _MAX_DIM:
            raise ShapeError(f"{what}: {name} must be in 1..{_MAX_DIM}, got {v}")
    if id_ % 256:
        raise ShapeError(f"{what}: id={id_} is not a multiple of 256 (whole q4_K / q6_K super-blocks)")


def _has_gpu() -> bool:
    try:
        device_props()
        return True
    except Exception:
        return False


#: names that moved to :mod:`labkernels.dispatch` (issue 42), still answered here for notebooks and callers
_DISPATCH_NAMES = frozenset({"qmatmul", "choose", "last_choice", "Choice", "QMATMUL_KERNELS", "_int8_default",
                             "_choose", "_choose_cached", "_with_sweep_variant"})


def __getattr__(name: str):
    if name in _DISPATCH_NAMES:
        from . import dispatch   # the one upward edge of gpu: dispatch imports gpu at module level

        return getattr(dispatch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
