"""Round 7's product: the Hopper-native q4_K / q6_K GEMM family (``kernels/wgmma_kq.cu``) -- its build cache, tensor
maps, the weight on the GPU (:class:`WgWeight`), variant names and parameters, the tile schedulers (data-parallel,
stream-K, split-k) and the launcher :func:`gemm`. The weight layout, its exact CPU emulation and the parity gate are
:mod:`labkernels.wgmma_pack`, the typed variant, the schedulers' host model and the fit rules
:mod:`labkernels.wgmma_sched` (both re-exported here); round 7's experiments (exploratory and ablation builds and their
launcher, the benchmark, A/Bs, traces, views) are :mod:`labkernels.rounds.r07_wgmma`."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from . import gpu, nvml, paths, ptxas, quants, records
from .errors import ShapeError, SharedMemoryError
from .kernels import registry
from .wgmma_pack import (BLOCK_BYTES, PLANE_BYTES, QK, RepackError, emulate_weights, exact_gate, gate,  # noqa: F401
                         int8_path_error, planes_q6, repack, scale_plane, unrepack)
from .wgmma_sched import (BN_VALUES, FIT_RULES, SK_MAXSEG, VARIANT_FIELDS, FitRule, Variant, VariantError,  # noqa: F401
                          _SK_SUFFIX, _VARIANT, _VARIANT_SMEM, _check_schedule, _launch_misfit, _positive_ints, _sk_of,
                          check_launch_shape, fit, misfit, pair_fits, reduce_finish_fits, reduce_fits, schedule,
                          segments, sk_fits, sk_start, split_g, split_parts, tile_count, tile_split, uniform_split,
                          variant_name)

# ------------------------------------------------------------------------------------------------ GPU


class WgmmaError(RuntimeError):
    pass


class MovedError(AttributeError):
    """A name this module no longer has because it moved out of the product (round 7's experiments and builds went to
    :mod:`labkernels.rounds.r07_wgmma`): says where it lives now."""


#: names that left this module with round 7's experiments (the wgmma split): where each lives now. Not forwarded --
#: the product never imports a round's code -- but named, so an old call learns where to go
MOVED = {n: "labkernels.rounds.r07_wgmma.builds" for n in (
    "check_defines", "build_defines", "build_flags", "kpair_grid", "kpair_ring_bytes", "kernel_built", "cubin",
    "KPAIR", "KPAIR_FIN", "KPAIR_PARAMS", "BUILD_NAMES", "RETIRED_BUILDS", "EXPERIMENTS")}


def __getattr__(name: str):
    if name in MOVED:
        raise MovedError(f"labkernels.wgmma.{name} moved with round 7's experiments: it is {MOVED[name]}.{name} now "
                         f"(from {MOVED[name]} import {name})")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _cp():
    return gpu.cp()


def supported(cc: int | None = None) -> bool:
    if cc is None:
        cc = gpu.device_props()["cc"]
    return cc == 90


def require_sm90a() -> None:
    p = gpu.device_props()
    if not supported(p["cc"]):
        runs = ", ".join(f["family"] for f in registry.FAMILIES if f.get("archs", ("sm_90",)) != ("sm_90a",)
                         and f.get("gemm"))
        raise WgmmaError(f"the wgmma_kq family needs an sm_90 (Hopper) GPU with the sm_90a feature set; this is "
                         f"{p['name']} (sm_{p['cc']}). GEMM families that run here: {runs}")


@lru_cache(maxsize=None)
def _cubin(source: str, src: str | None = None, extra_flags: tuple = ()) -> tuple[str, dict]:
    """nvcc -cubin for sm_90a of every registered instantiation of ``source`` (cached by content), and the map
    registry key -> mangled entry name (from ptxas' report, demangled with the audit's parser, :mod:`.ptxas`).
    ``src``: another file that defines the same instantiations, built instead of the registry's source with
    ``extra_flags`` (a round's exploratory / ablation builds: :mod:`labkernels.rounds.r07_wgmma.builds`, their -D
    names); both are arguments of this cached function and part of the file cache key (twice on 2026-12-01 an
    ablation build made after the plain one got the plain cubin: first this cache was keyed by the source alone,
    then the environment read was cached)."""
    nvcc = ptxas.nvcc_path()
    if not nvcc:
        raise WgmmaError("the sm_90a kernels are built with nvcc, which is not on PATH")
    specs = [k for k in registry.KERNELS if k.source == source]
    path = Path(src) if src else registry.KERNELS_DIR / source
    wrapper = ptxas.wrapper_source(path, specs)
    flags = ["-cubin", "-std=c++17", "-O3", "-Xptxas", "-v", "-gencode=arch=compute_90a,code=sm_90a",
             *([f"-I{path.parent}"] if src else []), f"-I{registry.KERNELS_DIR}", *registry.cuda_defines()]
    flags += list(extra_flags)
    key = hashlib.sha256(("\n".join([wrapper, path.read_text(), ptxas._dir_digest(registry.KERNELS_DIR),
                                     ptxas._nvcc_version(nvcc), *flags])).encode()).hexdigest()[:20]
    cache = paths.CACHE_DIR / "cubin"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        cache = Path(tempfile.gettempdir()) / "labkernels-cubin"
        cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{Path(source).stem}-{key}.cubin"
    log_file = out.with_suffix(".log")
    if not (out.exists() and log_file.exists()):
        with tempfile.TemporaryDirectory(prefix="lk-wg-") as td:
            w = Path(td) / "wrapper.cu"
            w.write_text(wrapper)
            tmp = Path(td) / "out.cubin"
            t0 = time.time()
            # the optimizer split over the machine's cores (-split-compile=0): the same machine code (.text of all 51
            # instantiations byte-identical with and without it, nvcc 13.0), 63 -> 41 s on 2 cores; not in the key
            r = subprocess.run([nvcc, *flags, "-split-compile=0", "-o", str(tmp), str(w)], capture_output=True,
                               text=True)
            if r.returncode:
                raise WgmmaError(f"nvcc failed on {source}:\n{(r.stdout + r.stderr)[-3000:]}")
            shutil.copyfile(tmp, str(out) + f".tmp{os.getpid()}")
            os.replace(str(out) + f".tmp{os.getpid()}", out)
            log_tmp = Path(str(log_file) + f".tmp{os.getpid()}")   # renamed into place: a concurrent build never
            log_tmp.write_text(r.stdout + r.stderr + f"\n# compiled in {time.time() - t0:.1f} s\n")   # reads half
            os.replace(log_tmp, log_file)
    entries = ptxas.parse_ptxas(log_file.read_text())
    dem = ptxas.demangle([e["mangled"] for e in entries])
    by_args = {}
    for e, d in zip(entries, dem):
        by_args[ptxas._split_demangled(d)] = e
    names = {}
    for k in specs:
        e = by_args.get((k.template, ptxas._spec_args(k)))
        if e is None:
            raise WgmmaError(f"{k.key}: not found in the ptxas report of {source}")
        names[k.key] = dict(e)
    return str(out), names


class WgKernel:
    """One compiled instantiation of the wgmma_kq family (cubin from nvcc, launched through the driver API so
    the 128-byte tensor map can be passed by value as a ``__grid_constant__`` parameter)."""

    def __init__(self, spec, defines: tuple = (), src: str | None = None, extra_flags: tuple = (),
                 extra_smem: int = 0):
        """The registry's build of ``spec``; or, with ``src``, a build of another source of the same instantiations
        (:func:`_cubin`) -- a round's exploratory / ablation build, whose -D names ``defines`` are its identity (in the
        cubin cache and in every recorded run) and which may need ``extra_smem`` bytes of dynamic shared memory."""
        self.defines = tuple(defines)
        cp = _cp()
        require_sm90a()
        self.spec = spec
        path, names = _cubin(spec.source, src, tuple(extra_flags)) if src else _cubin(spec.source)
        self.entry = names[spec.key]
        self.module = cp.RawModule(path=path)
        self.func = self.module.get_function(self.entry["mangled"])
        self.smem = spec.dynamic_smem() + int(extra_smem)
        cap = gpu.device_props()["smem_optin"]
        if self.smem + self.entry["static_smem"] > cap:
            built = f" built with {' '.join(self.defines)}" if self.defines else ""
            raise SharedMemoryError(f"{spec.key}{built} needs {self.smem} B of dynamic shared memory per block; this "
                                    f"device allows {cap} B")
        self.func.max_dynamic_shared_size_bytes = self.smem
        self._fptr = int(self.func.ptr) if hasattr(self.func, "ptr") else int(self.func.kernel.ptr)

    @property
    def regs(self) -> int:
        return int(self.func.num_regs)

    @property
    def local_bytes(self) -> int:
        return int(self.func.local_size_bytes)

    @property
    def blocks_per_sm(self) -> int:
        """Resident CTAs per SM (the stream-K grid may not exceed SMs x this: its owners wait on other CTAs)."""
        if not hasattr(self, "_bps"):
            self._bps = max(1, self.occupancy_api())
        return self._bps

    def occupancy_api(self) -> int:
        from cuda.bindings import driver as drv

        err, n = drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(drv.CUfunction(self._fptr), self.spec.threads,
                                                                 self.smem)
        if int(err) != 0:
            raise WgmmaError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {err}")
        return int(n)

    def max_active_clusters(self, cluster: int = 2, grid: int = 128) -> int:
        """How many clusters of ``cluster`` CTAs of this kernel the device runs at once
        (``cuOccupancyMaxActiveClusters``): EPI=3's 2-CTA pairs beyond it wait for a second wave."""
        from cuda.bindings import driver as drv

        cfg = drv.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = int(grid), 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.spec.threads, 1, 1
        cfg.sharedMemBytes = self.smem
        at = drv.CUlaunchAttribute()
        at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = int(cluster), 1, 1
        cfg.attrs = [at]
        cfg.numAttrs = 1
        err, n = drv.cuOccupancyMaxActiveClusters(drv.CUfunction(self._fptr), cfg)
        if int(err) != 0:
            raise WgmmaError(f"cuOccupancyMaxActiveClusters of {self.spec.key} failed: {err}")
        return int(n)

    def launch(self, grid, tmap, *args, cluster: int = 1):
        """``tmap``: one 128-byte CUtensorMap or a tuple of them (the kernel's leading __grid_constant__ params).
        Inside ``gpu.programmatic_launches`` the launch is programmatic (the kernels begin with LK_PDL_ENTRY);
        ``cluster`` > 1 launches clusters of that many CTAs (EPI=3's pairs)."""
        from cuda.bindings import driver as drv

        holders, params = gpu.kernel_params(args, prefix=(tmap,) if isinstance(tmap, bytes) else tuple(tmap))
        stream = _cp().cuda.get_current_stream().ptr
        pdl = gpu.pdl_active() and self.spec.source in gpu.pdl_sources()   # the prefill's graph capture (PDL boundaries)
        if pdl or cluster > 1:
            gpu.launch_programmatic(self._fptr, grid, (self.spec.threads,), self.smem, params, stream, self.spec.key,
                                    cluster=cluster, programmatic=pdl)
            return
        if not hasattr(self, "_cufn"):
            self._cufn = drv.CUfunction(self._fptr)
        (err,) = drv.cuLaunchKernel(self._cufn, int(grid[0]), int(grid[1]), 1,
                                    self.spec.threads, 1, 1, self.smem, drv.CUstream(stream), params, 0)
        del holders                        # the driver has copied the parameters
        if int(err) != 0:
            raise WgmmaError(f"launch of {self.spec.key} grid {grid} failed: {err}")


@lru_cache(maxsize=None)
def kernel(family: str = "wgmma_kq", **params) -> WgKernel:
    """A compiled round-7 kernel: ``wgmma_kq`` (register form) or ``wgmma_kqs`` (shared-memory form)."""
    return WgKernel(registry.find(family, **params))


def weight_tensor_map(rows) -> bytes:
    """CUtensorMap of raw GGUF q4_K rows (cupy uint8 [od, nsb*144]) for the shared-memory form: boxes of one
    super-block (144 bytes) x 128 rows, no swizzle; rows past od read as zeros (converted, never stored)."""
    od, nb = rows.shape
    if nb % 144:
        raise WgmmaError(f"q4_K rows of {nb} bytes are not whole 144-byte blocks")
    return _weight_map(int(rows.data.ptr), int(od), int(nb))


def _encode_2d(dtype: str, ptr: int, inner: int, outer: int, row_bytes: int, box_inner: int, box_outer: int,
               swizzle: str, what: str) -> bytes:
    """cuTensorMapEncodeTiled of a 2-D row-major array (``inner`` elements per row, ``outer`` rows, ``row_bytes``
    apart) in boxes of [box_outer x box_inner], out-of-range elements read as zeros: the map's 128 bytes."""
    from cuda.bindings import driver as drv

    err, tm = drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{dtype}"), 2, ptr,
        [drv.cuuint64_t(inner), drv.cuuint64_t(outer)], [drv.cuuint64_t(row_bytes)],
        [drv.cuuint32_t(box_inner), drv.cuuint32_t(box_outer)], [drv.cuuint32_t(1), drv.cuuint32_t(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}"),
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if int(err) != 0:
        raise WgmmaError(f"cuTensorMapEncodeTiled({what}, box {box_outer} x {box_inner}) failed: {err}")
    return np.array([int(v) for v in tm.opaque], dtype=np.uint64).tobytes()


@lru_cache(maxsize=4096)
def _weight_map(ptr: int, od: int, nb: int) -> bytes:
    if ptr % 16:
        raise WgmmaError("the weight rows must start 16-byte aligned for TMA")
    return _encode_2d("UINT8", ptr, nb, od, nb, 144, 128, "NONE", f"q4_K rows {od} x {nb} B")


def tensor_map(x16, box_n: int, bf16: bool = False) -> bytes:
    """CUtensorMap of the 16-bit activations [nt, id] (float16, or bf16 bits as uint16): boxes of
    [box_n tokens x 64 k], 128-byte swizzle, out-of-range tokens read as zeros. The 128 bytes are a function of
    (address, shape, box, type) only, so they are cached by exactly that key (encoding costs ~10 us of host time,
    a prefill asks ~200 times a forward with the same few buffers)."""
    nt, id_ = x16.shape
    return _tensor_map(int(x16.data.ptr), int(nt), int(id_), int(box_n), bool(bf16))


@lru_cache(maxsize=8192)
def _tensor_map(ptr: int, nt: int, id_: int, box_n: int, bf16: bool) -> bytes:
    return _encode_2d("BFLOAT16" if bf16 else "FLOAT16", ptr, id_, nt, id_ * 2, 64, box_n, "128B", f"{nt} x {id_}")


#: the Y map slot of a register-form launch whose epilogue does not read it (EPI 0 / 1)
NO_MAP = bytes(128)


def output_map(y, box_n: int) -> bytes:
    """CUtensorMap of the float32 output Y [nt, od] for the TMA-store epilogue (EPI=2): boxes of [box_n tokens x
    32 rows] (128 bytes of a token's row), 128-byte swizzle -- the layout the kernel stages the tile in; tokens and
    rows past the array are clipped by the TMA unit on store. Refused (ShapeError) for a Y the map cannot
    describe: not float32 C-contiguous [nt, od], od not a multiple of 4, or a base not 16-byte aligned."""
    if y.dtype != np.float32 or y.ndim != 2 or not y.flags.c_contiguous:
        raise ShapeError(f"the TMA-store epilogue writes a C-contiguous float32 [nt, od] array, not {y.dtype} "
                         f"{tuple(y.shape)} (c_contiguous={bool(y.flags.c_contiguous)})")
    nt, od = y.shape
    if od % 4 or int(y.data.ptr) % 16:
        raise ShapeError(f"the TMA-store epilogue needs od % 4 == 0 and a 16-byte aligned output (od={od}, "
                         f"address % 16 = {int(y.data.ptr) % 16})")
    return _output_map(int(y.data.ptr), int(nt), int(od), int(box_n))


@lru_cache(maxsize=8192)
def _output_map(ptr: int, nt: int, od: int, box_n: int) -> bytes:
    return _encode_2d("FLOAT32", ptr, od, nt, od * 4, 32, box_n, "128B", f"Y {nt} x {od} f32")


@dataclass
class WgWeight:
    """A q4_K / q6_K matrix on the GPU in the round-7 layout (see the module docstring)."""
    packed: object    # cupy uint8
    qtype: str
    od: int
    id: int
    repack_s: float   # host repack time
    nbytes: int
    gguf: object = None   # cupy uint8 GGUF rows [od, nsb*144] (q4_K): the shared-memory form reads them as they are
    plane: object = None  # cupy uint8 [od, nsb, 32] (q4_K): the scale plane of SCL=2, right behind ``packed``
    plane_s: float = 0.0  # host time of the plane

    @property
    def plane_bytes(self) -> int:
        return 0 if self.plane is None else int(self.plane.nbytes)

    @classmethod
    def from_gguf(cls, raw: np.ndarray, qtype: str, plane: bool = False) -> "WgWeight":
        """Repacked once (``repack_s``). ``plane`` (q4_K): also its scale plane (:func:`scale_plane`, ``plane_s``) in
        the same device allocation, right behind the blocks, where the SCL=2 kernel reads it (+1 bit per weight;
        ``nbytes`` counts the blocks, ``plane_bytes`` the plane). Off by default: SCL=2 was measured slower than the
        header decode (run 20261202T070827Z-2, 0.80-0.91x), so nothing but its A/B and tests makes one."""
        qtype = quants.normalize_qtype(qtype)
        t0 = time.perf_counter()
        p = np.ascontiguousarray(repack(np.asarray(raw), qtype))
        dt = time.perf_counter() - t0
        od = raw.shape[0]
        id_ = raw.shape[1] // BLOCK_BYTES[qtype] * QK
        cp = _cp()
        if qtype != "q4_K" or not plane:
            return cls(cp.asarray(p), qtype, od, id_, dt, int(p.nbytes))
        t1 = time.perf_counter()
        pl = scale_plane(p.reshape(od, id_ // QK, 144)[..., :16])
        ps = time.perf_counter() - t1
        buf = cp.empty(p.nbytes + pl.nbytes, cp.uint8)
        buf[:p.nbytes] = cp.asarray(p.ravel())
        buf[p.nbytes:] = cp.asarray(pl.ravel())
        return cls(buf[:p.nbytes].reshape(p.shape), qtype, od, id_, dt, int(p.nbytes),
                   plane=buf[p.nbytes:].reshape(pl.shape), plane_s=ps)


def default_params(qtype: str, nt: int) -> dict:
    """The main-path variant for a token count when no recorded run says otherwise (registry main path: the
    scale-decode form ptxas pipelines without spills for each type and tile; the wider tile once there are enough
    token tiles; stream-K below that, where a data-parallel grid leaves SMs idle). VariantError for a type the family
    does not take, ShapeError unless nt is an integer >= 1."""
    _family_qtype(qtype, "default_params")
    _positive_ints("default_params", nt=nt)
    bn = 256 if nt >= 1024 else 128
    return {"BN": bn, "STAGES": 4, "BF16": 0, "SCL": main_scl(qtype, bn), "SK": 0 if nt >= 1024 else 1}


def main_scl(qtype: str, bn: int) -> int:
    """The registry's main-path scale form: q4_K SCL=0; q6_K SCL=1 at BN=128 and SCL=0 at BN=256 (SCL=1 spills
    there once the scheduler's state shares the consumers' registers). VariantError for another type or tile."""
    _family_qtype(qtype, "main_scl")
    if isinstance(bn, bool) or bn not in BN_VALUES:
        raise VariantError(f"main_scl: BN is one of {', '.join(map(str, BN_VALUES))} (the wgmma_kq tiles), not {bn!r}")
    return 1 if qtype == "q6_K" and bn == 128 else 0


def _family_qtype(qtype, what: str) -> None:
    if not isinstance(qtype, str) or qtype not in BLOCK_BYTES:
        raise VariantError(f"{what}: the wgmma_kq family takes q4_K or q6_K weights, not {qtype!r}")


def auto_table(root=None):
    """The recorded choice table for ``dispatch.qmatmul(kernel="auto")``: per (qtype, od, id, nt) of the latest
    complete round-7 run that saw no power or thermal cap (:func:`labkernels.nvml.for_verdict`), the fastest GEMM
    family/variant measured (median over pairs). None without a run."""
    run = records.latest("wgmma", root=root, where=lambda r: r.has("wgmma_bench") and nvml.for_verdict(r))
    if run is None:
        return None
    df = run.table("wgmma_bench")
    df = df[df.variant.str.startswith(("wgmma_bn", "wgmma_smem", "int8_"))]
    med = df.groupby(["qtype", "od", "id", "nt", "variant"], as_index=False).median_us.median()
    best = med.loc[med.groupby(["qtype", "od", "id", "nt"]).median_us.idxmin()].copy()
    best["family"], best["params"] = zip(*[variant_params(v, q) for v, q in zip(best.variant, best.qtype)])
    best["run_id"] = run.run_id
    return best.reset_index(drop=True)


_AUTO = {}


def auto_table_cached():
    """:func:`auto_table` of the default data folder, read once per process (the prefill asks per weight)."""
    if "t" not in _AUTO:
        _AUTO["t"] = auto_table()
    return _AUTO["t"]


def variant_params(variant: str, qtype: str) -> tuple[str, dict]:
    """A benchmark variant name -> (family, template params): 'wgmma_bn128_s4_scl0' / 'int8_q4k_nb'. VariantError
    for a name that is neither (:meth:`Variant.parse`)."""
    if not isinstance(variant, str):
        raise VariantError(f"variant_params: a variant name is a str, not {type(variant).__name__} {variant!r}")
    if variant.startswith("int8_"):
        fam = variant[5:]
        v = registry.default_variant(qtype)       # the registry's default int8 variant of the type
        f, p = v.family, v.p
        return fam, (dict(p) if f == fam else {})
    return "wgmma_kq", Variant.parse(variant).params


@lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    return int(gpu.device_props()["sm_count"])


class _Workspace:
    """Per (device, stream): the stream-K partial-tile buffer and the helpers' flags, sized once for the largest
    stream-K grid (``max_cta`` = SMs x resident CTAs, BN=256: 256 threads x 128 floats each) so that it never
    grows -- a captured CUDA graph keeps the pointers it recorded. The flags are zero between launches (each owner
    resets the flags it consumed). Launches on one stream run in order, so one buffer per stream is enough; a
    stream gets its own. Data-parallel launches receive the same pointers and never touch them."""

    def __init__(self):
        self._by = {}

    def get(self, stream: int, max_cta: int):
        cp = _cp()
        key = (cp.cuda.Device().id, stream)
        if key not in self._by:
            self._by[key] = (cp.empty(max_cta * 256 * 128, cp.float32), cp.zeros(max_cta, cp.uint32), max_cta)
        ws, fl, n = self._by[key]
        if max_cta > n:
            raise WgmmaError(f"stream-K workspace holds {n} CTAs, a launch asks for {max_cta}")
        return ws, fl


_WS = _Workspace()


def gemm(w: WgWeight, x, out=None, BN: int = 128, STAGES: int = 4, BF16: int | None = None, SCL: int = 0,
         SK: int = 0, FORM: int = 0, EPI: int = 0, AQ: int = 2, PF: int = 0):
    """Y[nt, od] (float32) = x[nt, id] * W^T on the wgmma_kq family. x: cupy float16 / bfloat16-as-uint16 /
    float32 (converted to f16 here, or bf16 when ``BF16=1``). ``SK``: the tile scheduler, 0 data-parallel, 1
    stream-K, 2 uniform split-k, 3 tile-aligned split-k (:func:`schedule`). ``FORM``: 0 the register form
    (``wgmma_kq``, the repacked weight), 1 the shared-memory form (``wgmma_kqs``, q4_K, the GGUF rows ``w.gguf``;
    ``SCL`` does not apply), 2 the same with two converter warpgroups (BN=128, STAGES=4, f16). ``EPI`` (register form): 0 the plain epilogue, 1 the bulk fold of split-k partials,
    2 the bulk fold and a TMA store of Y (needs od % 4 == 0 and a 16-byte aligned, C-contiguous ``out``); both on
    grids of one segment per CTA (SK 0, 2, 3), refused with stream-K (SK=1); 3 the pair exchange (SK=3 with two
    CTAs per tile, 2-CTA clusters); 4 the staged TMA store (any scheduler: every tile through a staging buffer of its
    own and TMA stores the consumers do not wait for; od % 4 == 0 as EPI=2); 5 the reduce finish (EPI=4's buffer, and a split tile's two CTAs add their partial sums into Y, zeroed early by its owner, with TMA reduce-adds: grids of at most two CTAs a tile, :func:`reduce_finish_fits`). ``AQ`` (register form): the A-fragment
    sets of a consumer, 2 (convert after the wait for the previous chunk) or 4 (convert the next chunk before that
    wait; BN=128, the plain epilogue, the main scale form: the registry's rows). ``PF`` (register form): 0, or an L2
    prefetch of each row's weight bytes 1 or 2 super-blocks ahead of its loads (AQ=2 main scale forms, f16, the
    plain epilogue; not q6_K BN=256, which spills with it). Every combination
    is checked (:func:`kernel_params`) before anything is built or launched, every shape against :data:`FIT_RULES`. The registry's build only: round 7's
    exploratory and ablation builds have their own launcher (:func:`labkernels.rounds.r07_wgmma.builds.gemm`)."""
    x16, bf16 = activations(w, x, BF16)
    family, kp = kernel_params(w, BN, STAGES, bf16, SCL, SK, FORM, EPI, AQ, PF)
    # the register form by keywords alone: one cache entry of kernel() per instantiation, as every caller names it
    k = kernel(**kp) if family == "wgmma_kq" else kernel(family, **kp)
    return launch(k, w, x16, out, BN, SK, EPI)


def activations(w: WgWeight, x, BF16: int | None = None):
    """(x16, bf16): the activations as the kernel's 16-bit operands (float32 converted here; float16 or bf16 bits as
    uint16 taken as they are, made contiguous), checked against the weight (ShapeError)."""
    cp = _cp()
    if not isinstance(x, cp.ndarray) or x.ndim != 2:
        raise ShapeError(f"activations must be a 2-D cupy array [nt, id], got {type(x).__name__}")
    nt, id_ = x.shape
    if id_ != w.id:
        raise ShapeError(f"inner dimensions differ: activations id={id_}, weights id={w.id}")
    if nt < 1:
        raise ShapeError("nt must be >= 1")
    bf16 = int(BF16) if BF16 is not None else 0
    if x.dtype == np.float32:
        x16 = to_bf16(x) if bf16 else x.astype(cp.float16)
    elif x.dtype == np.float16 and not bf16:
        x16 = cp.ascontiguousarray(x)
    elif x.dtype == np.uint16 and bf16:
        x16 = cp.ascontiguousarray(x)
    else:
        raise ShapeError(f"activations dtype {x.dtype} does not match the kernel's {'bf16' if bf16 else 'f16'} "
                         "operands (pass float32, or float16 for f16 / bf16 bits as uint16 for bf16)")
    return x16, bf16


def kernel_params(w: WgWeight, BN: int = 128, STAGES: int = 4, bf16: int = 0, SCL: int = 0, SK: int = 0,
                  FORM: int = 0, EPI: int = 0, AQ: int = 2, PF: int = 0) -> tuple[str, dict]:
    """(family, registry params) of a launch of :func:`gemm` on ``w``; every combination the kernels are not built
    for is refused here (ValueError / ShapeError), before anything is built."""
    qt = 4 if w.qtype == "q4_K" else 6
    if FORM not in (0, 1, 2):
        raise ValueError(f"FORM is 0 (register), 1 (shared memory) or 2 (shared memory, two converter warpgroups), "
                         f"not {FORM!r}")
    if EPI not in (0, 1, 2, 3, 4, 5):
        raise ValueError(f"EPI is 0 (plain), 1 (bulk fold), 2 (bulk fold + TMA store), 3 (pair exchange), 4 (staged "
                         f"TMA store) or 5 (reduce finish), not {EPI!r}")
    if EPI and FORM:
        raise ShapeError("the shared-memory form (wgmma_kqs) has the plain epilogue only (EPI=0)")
    if PF not in (0, 1, 2):
        raise ValueError(f"PF is 0, 1 or 2 (L2 prefetch distance in super-blocks), not {PF!r}")
    if PF and (FORM or AQ != 2 or EPI or bf16 or SCL != main_scl(w.qtype, BN) or (w.qtype == "q6_K" and BN == 256)):
        raise ShapeError(f"PF={PF} is built for the register form with AQ=2, the plain epilogue, f16 and the main "
                         f"scale form, not q6_K at BN=256 (its consumers spill); asked: {w.qtype} FORM={FORM} BN={BN} "
                         f"AQ={AQ} EPI={EPI} BF16={bf16} SCL={SCL}")
    if AQ not in (2, 4):
        raise ValueError(f"AQ is 2 or 4 (A-fragment sets), not {AQ!r}")
    if AQ != 2 and (FORM or BN != 128 or EPI or bf16 or SCL != main_scl(w.qtype, BN)):
        raise ShapeError(f"AQ={AQ} is built for the register form at BN=128 with the plain epilogue, f16 and the "
                         f"main scale form (SCL={main_scl(w.qtype, 128)} for {w.qtype}); asked: FORM={FORM} BN={BN} "
                         f"EPI={EPI} BF16={bf16} SCL={SCL}")
    if SCL not in (0, 1, 2):
        raise ValueError(f"SCL is 0 (per-chunk scale decode), 1 (per super-block, shared by shuffles) or 2 (the q4_K "
                         f"scale plane), not {SCL!r}")
    if SCL == 2:
        if FORM or w.qtype != "q4_K" or bf16 or BN != 128 or EPI or AQ != 2 or PF:
            raise ShapeError(f"SCL=2 (the scale plane: f16 pairs) is built for the q4_K register form at BN=128, f16, "
                             f"the plain epilogue, AQ=2, no prefetch; asked: {w.qtype} FORM={FORM} BN={BN} BF16={bf16} "
                             f"EPI={EPI} AQ={AQ} PF={PF}")
        if w.plane is None or w.plane.data.ptr != w.packed.data.ptr + w.packed.nbytes:
            raise ShapeError("SCL=2 reads the scale plane right behind the repacked blocks: this weight has none "
                             "there (make it with WgWeight.from_gguf(..., plane=True))")
    if EPI in (1, 2, 3) and SK == 1:
        raise ShapeError(f"EPI={EPI} stages through the activation ring, idle only on grids of one segment per CTA "
                         "(SK=0, 2, 3): stream-K (SK=1) takes the plain epilogue (EPI=0)")
    if EPI == 3 and SK != 3:
        raise ShapeError(f"EPI=3 exchanges a tile's two partial sums inside a 2-CTA cluster: it runs on the "
                         f"tile-aligned split-k grid (SK=3) with two CTAs per tile, not SK={SK}")
    if EPI in (2, 4, 5) and w.od % 4:
        raise ShapeError(f"EPI={EPI} stores Y through a TMA map, whose rows must be 16-byte multiples: od={w.od} is "
                         f"not a multiple of 4 (use EPI={'0 or 1' if EPI == 2 else 0})")
    if FORM:
        if w.qtype != "q4_K":
            raise ShapeError(f"the shared-memory form (wgmma_kqs) takes q4_K weights, not {w.qtype}")
        if w.gguf is None:
            raise ShapeError("the shared-memory form reads the GGUF rows on the GPU (WgWeight.gguf), which this "
                             "weight does not hold")
        if FORM == 2 and (BN != 128 or STAGES != 4 or bf16):
            raise ShapeError(f"the shared-memory form with two converter warpgroups (FORM=2) is built for BN=128, "
                             f"STAGES=4, f16 (512 threads: m64n256k16 does not fit their register budget), not "
                             f"BN={BN} STAGES={STAGES} BF16={bf16}")
        return "wgmma_kqs", dict(QT=qt, BN=BN, STAGES=STAGES, BF16=bf16, NCV=int(FORM))
    return "wgmma_kq", dict(QT=qt, BN=BN, STAGES=STAGES, BF16=bf16, SCL=SCL, EPI=int(EPI), AQ=int(AQ), PF=int(PF))


def launch(k: WgKernel, w: WgWeight, x16, out, BN: int, SK: int = 0, EPI: int = 0, blocks_per_sm: int | None = None):
    """Schedule and launch ``k`` (a kernel of :func:`kernel_params`' family and params) on the 16-bit activations
    ``x16`` (:func:`activations`): the grid of scheduler ``SK`` (:func:`schedule`, its bound and epilogue checks), the
    tensor maps, the stream's workspace. ``blocks_per_sm``: resident CTAs per SM for the grid (default the kernel's
    own)."""
    cp = _cp()
    nt = x16.shape[0]
    form = k.spec.family == "wgmma_kqs"
    bf16 = int(k.spec.p["BF16"])
    res = k.blocks_per_sm if blocks_per_sm is None else int(blocks_per_sm)
    sms = _sm_count(cp.cuda.Device().id) * res
    ncta, dp_tiles = schedule(int(SK), nt, w.od, w.id, BN, sms)
    g = split_g(int(SK), nt, w.od, w.id, BN, sms)
    # the scheduler x epilogue fit rules (FIT_RULES; schedule() has refused a split-k grid that does not fit and
    # kernel_params() an epilogue whose Y map cannot describe od): those that depend on the grid
    v, bad = _launch_misfit(BN, int(k.spec.p["STAGES"]), int(SK), int(EPI), nt, w.od, w.id, sms)
    if bad is not None and bad.name == "pair exchange":
        raise ShapeError(f"EPI=3 pairs a tile's two CTAs in a cluster: SK=3 gives {g} CTAs per tile at nt={nt}, "
                         f"od={w.od}, id={w.id}, BN={BN} on {sms} SMs, not 2 (use EPI=0)")
    if bad is not None and bad.name == "reduce finish":
        raise ShapeError(f"EPI=5 adds a split tile's partial sums into Y in either order, which is deterministic for "
                         f"two CTAs a tile (the helper the owner's next CTA) and not for more: SK={SK} at nt={nt}, "
                         f"od={w.od}, id={w.id}, BN={BN} on {sms} SMs splits a tile over more (use EPI=4)")
    if bad is not None:
        raise ShapeError(f"{bad.name}: {bad.why(v, nt, w.od, w.id)}")
    if SK:
        _check_schedule(ncta, w.id // QK, tile_count(nt, w.od, BN), dp_tiles, g)
    y = gpu._out(nt, w.od, out)
    tm = tensor_map(x16, BN, bool(bf16))
    ws, flags = _WS.get(cp.cuda.get_current_stream().ptr, sms)
    if form:
        k.launch((ncta, 1), (tm, weight_tensor_map(w.gguf)), y, np.int32(nt), np.int32(w.od), np.int32(w.id), ws,
                 flags, np.int32(dp_tiles), np.int32(g))
    else:
        ymap = output_map(y, BN) if EPI == 2 else output_map(y, 128) if EPI >= 4 else NO_MAP   # EPI=4, 5: 128 a round
        k.launch((ncta, 1), (tm, ymap), w.packed, y, np.int32(nt), np.int32(w.od), np.int32(w.id), ws, flags,
                 np.int32(dp_tiles), np.int32(g), cluster=2 if EPI == 3 else 1)
    return y


def to_bf16(x):
    """float32 cupy array -> bf16 bits (uint16), round to nearest even."""
    cp = _cp()
    u = x.view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


