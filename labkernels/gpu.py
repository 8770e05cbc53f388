"""The GPU build layer and kernel launchers (CuPy).

CUDA sources live in ``labkernels/kernels/*.cu``; :func:`module` compiles one source with NVRTC through
``cupy.RawModule`` for the running GPU's architecture, instantiating every template the registry lists
for that source (name expressions), and caches the module per process (CuPy also caches the binary on
disk). Launchers check their inputs and raise clear errors; nothing falls back silently.

Orientation: activations ``x`` are [nt, id] row-major (token-major), weights are GGUF rows [od, id] (one
row of blocks per output feature), outputs ``Y`` are float32 [nt, od] row-major.

The errors live in :mod:`labkernels.errors`, the cuBLAS products (``gemm_dense``, ``matmul_f16``, ``bmm_f16``) in
:mod:`labkernels.blas`, the ``auto`` choice and ``qmatmul`` in :mod:`labkernels.dispatch`.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import GpuError, ShapeError, SharedMemoryError
from .kernels import registry
from .kernels.registry import BM, BN, KernelSpec
from .quants import QTYPES, normalize_qtype, pad_q6k


# ------------------------------------------------------ programmatic dependent launch (the captured prefill's boundaries)

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
    """(kernels, kernels whose body begins with ``LK_PDL_ENTRY();``) of one CUDA source text (comments ignored).
    (Round 9 step 8's ``LK_PDL_ENTRY_PREFETCH(`` entry left kernels/common.cuh with gemv_kq's PF=1 build: commit
    7894b07 holds it; a kernel beginning with it here is not PDL-capable.)"""
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


def capturing(stream_ptr: int | None = None) -> bool:
    """Whether a stream (default: the current one) is being captured into a CUDA graph; False where CuPy cannot
    say."""
    c = cp()
    rt = getattr(getattr(c, "cuda", None), "runtime", None)
    if rt is None or not hasattr(rt, "streamIsCapturing"):
        return False
    return bool(rt.streamIsCapturing(c.cuda.get_current_stream().ptr if stream_ptr is None else stream_ptr))


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

    def occupancy_api(self) -> int:
        """cudaOccupancyMaxActiveBlocksPerMultiprocessor for this kernel at its block size and smem."""
        c = cp()
        drv = c.cuda.driver
        if hasattr(drv, "occupancyMaxActiveBlocksPerMultiprocessor"):
            return int(drv.occupancyMaxActiveBlocksPerMultiprocessor(self.ptr, self.spec.threads, self.smem))
        from cuda.bindings import driver as cdrv  # cuda-python, present on the GPU image

        err, n = cdrv.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.ptr, self.spec.threads, self.smem)
        if int(err) != 0:
            raise GpuError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {err}")
        return int(n)

    def launch(self, grid, args):
        """Launch on the current stream (use ``with cupy.cuda.Stream(): ...`` for another); inside
        :func:`programmatic_launches`, a kernel of a PDL-capable source launches programmatically."""
        if _PDL["on"] and self.spec.source in pdl_sources(self.kernels_dir):
            holders, params = kernel_params(args)
            launch_programmatic(self.ptr, grid, (self.spec.threads,), self.smem, params,
                                cp().cuda.get_current_stream().ptr, self.spec.key)
            del holders
            return
        try:
            self.func(tuple(int(g) for g in grid), (self.spec.threads,), args, shared_mem=self.smem)
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


# ------------------------------------------------------------------ pinned host memory and graph-capturable copies

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


# ------------------------------------------------------------------ shape checks shared by the launchers and the dispatch


#: the weight types the GEMM families take
GEMM_QTYPES = ("q4_K", "q6_K")
_MAX_DIM = 2 ** 31 - 1


def check_gemm_shape(qtype, nt, od, id_, what: str = "gemm") -> None:
    """ShapeError unless ``qtype`` is q4_K / q6_K and nt, od, id are integers in 1..2^31-1 with id a multiple of 256
    (host-side, O(1): :func:`labkernels.dispatch.choose` runs it on every call)."""
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
