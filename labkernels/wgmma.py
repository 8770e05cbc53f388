"""Round 7: the Hopper-native k-quant GEMM family (``kernels/wgmma_kq.cu``) -- weight repack, its exact CPU
emulation, and the GPU launcher.

Weight layouts (same bits per weight as GGUF; :func:`repack` / :func:`unrepack` round-trip byte for byte):

* **q4_K** (4.5 bpw): each 144-byte block keeps its 16-byte header (d, dmin, 12 scale bytes); its 128 nibble
  bytes are permuted so that lane ``c`` (of the 4 lanes that share a row in the wgmma A fragment) reads its 32
  bytes at ``16 + 32c`` contiguously. Word ``(j, h)`` (chunk j of 64 k, h = 0/1) holds the GGUF bytes
  ``qs[32j + 16h + 2c + (0, 8, 1, 9)]``: its low nibbles are the A-fragment pairs of k16 step ``h`` (k ``2c, 2c+1``
  in bits 0/16 and ``2c+8, 2c+9`` in bits 8/24), its high nibbles those of step ``h + 2``.
* **q6_K** (6.5625 bpw): four planes over all ``od * nsb`` blocks, row-major: ``L`` (128 B/block) low nibbles,
  lane ``c``'s 32 bytes contiguous, word ``(j, p)`` = bytes for k offsets ``2c + (0, 8, 1, 9)`` whose low nibble
  is step ``2p`` and high nibble step ``2p + 1`` of chunk j; ``H`` (64 B/block) the 2-bit high parts, lane c's
  word j holding field ``f = 2s + t`` (step s, t = 0 for k ``2c..``, 1 for ``2c+8..``) at bits ``2f`` (lower k) and
  ``16 + 2f`` (upper k); ``SC`` (16 B/block, int8 scales) and ``D`` (2 B/block, fp16 d). The planes keep every
  16-byte load aligned, which the 210-byte GGUF stride does not.

:func:`emulate_weights` performs exactly the kernel's bit operations and fp16/bf16 roundings on the repacked
bytes in numpy, giving the weights the tensor cores see; ``X16 @ W_emulated^T`` in float64 is then the exact
reference of the kernel (up to fp32 accumulation order).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from . import gpu, model, nvml, records, reference
from .kernels import registry

QK = 256
BLOCK_BYTES = {"q4_K": 144, "q6_K": 210}
_KOFF = np.array([0, 8, 1, 9])          # byte order of a word: k offsets (2c + ...) of the A-fragment pairs


class RepackError(ValueError):
    pass


def _blocks(raw: np.ndarray, qtype: str) -> np.ndarray:
    raw = np.ascontiguousarray(raw)
    bb = BLOCK_BYTES.get(qtype)
    if bb is None:
        raise RepackError(f"the round-7 repack takes q4_K or q6_K, not {qtype}")
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] % bb:
        raise RepackError(f"{qtype} weights must be uint8 [od, nsb*{bb}], got {raw.dtype} {raw.shape}")
    return raw.reshape(raw.shape[0], raw.shape[1] // bb, bb)


# ------------------------------------------------------------------------------------------------ q4_K


def _q4_perm() -> np.ndarray:
    """perm[pos] = GGUF qs index of repacked qs byte pos (pos = 32c + 8j + 4h + b)."""
    c, j, h, b = np.meshgrid(np.arange(4), np.arange(4), np.arange(2), np.arange(4), indexing="ij")
    pos = 32 * c + 8 * j + 4 * h + b
    src = 32 * j + 16 * h + 2 * c + _KOFF[b]
    perm = np.empty(128, np.int64)
    perm[pos.ravel()] = src.ravel()
    assert sorted(perm) == list(range(128))
    return perm


_Q4_PERM = _q4_perm()
_Q4_INV = np.argsort(_Q4_PERM)

# ------------------------------------------------------------------------------------------------ q6_K


def _q6_code_index():
    """For each element e (0..255) of a block: (ql byte, ql shift, qh byte, qh shift) of its 6-bit code."""
    e = np.arange(256)
    n, r = e // 128, e % 128
    quarter, l = r // 32, r % 32
    ql = 64 * n + l + 32 * (quarter & 1)
    qls = 4 * (quarter >> 1)
    qh = 128 + 32 * n + l
    qhs = 2 * quarter
    return ql, qls, qh, qhs


_Q6_QL, _Q6_QLS, _Q6_QH, _Q6_QHS = _q6_code_index()


def _q6_codes(blk: np.ndarray) -> np.ndarray:
    """6-bit codes (0..63, before the -32) [..., 256] of q6_K blocks [..., 210]."""
    lo = (blk[..., _Q6_QL] >> _Q6_QLS) & 0xF
    hi = (blk[..., _Q6_QH] >> _Q6_QHS) & 0x3
    return (lo | (hi << 4)).astype(np.uint8)


def _q6_from_codes(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ql [..., 128], qh [..., 64] from codes [..., 256] (inverse of _q6_codes)."""
    shp = q.shape[:-1]
    ql = np.zeros(shp + (128,), np.uint8)
    qh = np.zeros(shp + (64,), np.uint8)
    for e in range(256):   # 256 vectorized column ops: fine for a load-time repack
        ql[..., _Q6_QL[e]] |= ((q[..., e] & 0xF) << _Q6_QLS[e]).astype(np.uint8)
        qh[..., _Q6_QH[e] - 128] |= (((q[..., e] >> 4) & 3) << _Q6_QHS[e]).astype(np.uint8)
    return ql, qh


def _q6_L_index():
    """L plane byte (c, j, p, b) -> (element of its low nibble, element of its high nibble)."""
    c, j, p, b = np.meshgrid(np.arange(4), np.arange(4), np.arange(2), np.arange(4), indexing="ij")
    k = 2 * c + _KOFF[b]
    s_lo = 4 * j + 2 * p
    return (16 * s_lo + k).ravel(), (16 * (s_lo + 1) + k).ravel()


def _q6_H_index():
    """H plane (c, j) word, field f = 2s+t: element at bits 2f (lower k) and 16+2f (upper k)."""
    c, j, s, t = np.meshgrid(np.arange(4), np.arange(4), np.arange(4), np.arange(2), indexing="ij")
    e_lo = 16 * (4 * j + s) + 2 * c + 8 * t
    f = 2 * s + t
    return e_lo.reshape(16, 8), (e_lo + 1).reshape(16, 8), f.reshape(16, 8)


_Q6_L_LO, _Q6_L_HI = _q6_L_index()
_Q6_H_LO, _Q6_H_HI, _Q6_H_F = _q6_H_index()


# ------------------------------------------------------------------------------------------------ API


def repack(raw: np.ndarray, qtype: str) -> np.ndarray:
    """GGUF rows [od, nsb*block] -> the round-7 layout (uint8, same byte count; 2-D [od, ...] for q4_K, 1-D planes
    for q6_K)."""
    blk = _blocks(raw, qtype)
    od, nsb, _ = blk.shape
    if qtype == "q4_K":
        out = blk.copy()
        out[..., 16:] = blk[..., 16:][..., _Q4_PERM]
        return out.reshape(od, nsb * 144)
    q = _q6_codes(blk)
    L = ((q[..., _Q6_L_LO] & 0xF) | ((q[..., _Q6_L_HI] & 0xF) << 4)).astype(np.uint8)
    hl = ((q[..., _Q6_H_LO] >> 4) & 3).astype(np.uint32) << (2 * _Q6_H_F).astype(np.uint32)
    hh = ((q[..., _Q6_H_HI] >> 4) & 3).astype(np.uint32) << (16 + 2 * _Q6_H_F).astype(np.uint32)
    H = (hl.sum(-1, dtype=np.uint32) | hh.sum(-1, dtype=np.uint32)).astype("<u4")
    return np.concatenate([L.ravel(), np.ascontiguousarray(H).view(np.uint8).ravel(), blk[..., 192:208].ravel(), blk[..., 208:210].ravel()])


def planes_q6(packed: np.ndarray, od: int, nsb: int):
    n = od * nsb
    o = np.cumsum([0, 128 * n, 64 * n, 16 * n, 2 * n])
    if packed.size != o[-1]:
        raise RepackError(f"q6_K planes of {od} x {nsb} blocks hold {o[-1]} bytes, got {packed.size}")
    return (packed[o[0]:o[1]].reshape(od, nsb, 128), packed[o[1]:o[2]].reshape(od, nsb, 64).view("<u4"),
            packed[o[2]:o[3]].reshape(od, nsb, 16), packed[o[3]:o[4]].reshape(od, nsb, 2))


def unrepack(packed: np.ndarray, qtype: str, od: int, id_: int) -> np.ndarray:
    """The inverse of :func:`repack`: the original GGUF bytes [od, nsb*block]."""
    if id_ % QK:
        raise RepackError(f"id={id_} is not a multiple of {QK}")
    nsb = id_ // QK
    if qtype == "q4_K":
        blk = np.asarray(packed, np.uint8).reshape(od, nsb, 144)
        out = blk.copy()
        out[..., 16:] = blk[..., 16:][..., _Q4_INV]
        return out.reshape(od, nsb * 144)
    if qtype != "q6_K":
        raise RepackError(f"the round-7 repack takes q4_K or q6_K, not {qtype}")
    L, H, SC, D = planes_q6(np.asarray(packed, np.uint8), od, nsb)
    q = np.zeros((od, nsb, 256), np.uint8)
    q[..., _Q6_L_LO] = L & 0xF
    q[..., _Q6_L_HI] = L >> 4
    f = (2 * _Q6_H_F).astype(np.uint32)
    q[..., _Q6_H_LO] |= (((H[..., :, None] >> f) & 3) << 4).astype(np.uint8)
    q[..., _Q6_H_HI] |= (((H[..., :, None] >> (16 + f)) & 3) << 4).astype(np.uint8)
    ql, qh = _q6_from_codes(q)
    return np.concatenate([ql, qh, SC, D], axis=-1).reshape(od, nsb * 210)


# ------------------------------------------------------------------------------------------------ emulation


def _round16(x: np.ndarray, bf16: bool) -> np.ndarray:
    """Round float64/float32 values to fp16 or bf16 (nearest even), returned as float64."""
    if not bf16:
        return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)
    f = np.asarray(x, np.float64).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def _q4_scales(hdr: np.ndarray, bf16: bool):
    """The 8 sub-block scales d*sc and negated mins -(dmin*m) of q4_K block headers [..., 16] as the kernel rounds
    them (f32 products, then one rounding to fp16/bf16), float64 [..., 8] each."""
    d = hdr[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = hdr[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sc8 = hdr[..., 4:16].astype(np.int64)
    scale = np.zeros(hdr.shape[:-1] + (8,)); mins = np.zeros(hdr.shape[:-1] + (8,))
    for i in range(8):      # get_scale_min_k4
        if i < 4:
            s_, m_ = sc8[..., i] & 63, sc8[..., i + 4] & 63
        else:
            s_ = (sc8[..., i + 4] & 0xF) | ((sc8[..., i - 4] >> 6) << 4)
            m_ = (sc8[..., i + 4] >> 4) | ((sc8[..., i] >> 6) << 4)
        scale[..., i] = _round16(d * s_.astype(np.float32), bf16)
        mins[..., i] = _round16(-(dmin * m_.astype(np.float32)), bf16)
    return scale, mins


#: the q4_K scale plane's bytes per row and super-block (SCL=2): four chunks x two f16 pairs
PLANE_BYTES = 32


def scale_plane(hdr: np.ndarray) -> np.ndarray:
    """The q4_K scale plane of the register form's SCL=2 (wgmma_kq.cuh ``q4_scales_pl``) from block headers
    [..., 16] (d, dmin, scales[12]: the GGUF header, kept by :func:`repack`): uint8 [..., 32], per super-block the
    words [sp0 zp0 sp1 zp1 sp2 zp2 sp3 zp3] -- sp_j the f16 pair (d sc_2j, d sc_2j+1), zp_j (-dmin m_2j,
    -dmin m_2j+1), each rounded once from the exact product, as the kernel's f16 scale path (``q4_scales_h``) and
    its fp32 one round them: the A fragments are bitwise SCL=0's. 32 bytes per 256 weights: +1 bit per weight over
    the 4.5 of the repacked blocks, which keep their headers (so the repack still round-trips to the GGUF bytes)."""
    scale, mins = _q4_scales(np.asarray(hdr, np.uint8), bf16=False)
    out = np.empty(scale.shape[:-1] + (4, 2, 2), np.float16)   # [..., chunk j, (sp, zp), half]
    out[..., 0, :] = scale.reshape(scale.shape[:-1] + (4, 2))
    out[..., 1, :] = mins.reshape(mins.shape[:-1] + (4, 2))
    return out.reshape(scale.shape[:-1] + (16,)).view(np.uint8)


def emulate_weights(packed: np.ndarray, qtype: str, od: int, id_: int, bf16: bool = False) -> np.ndarray:
    """The weights [od, id] (float64 holding fp16/bf16 values) that the kernel feeds the tensor cores, computed
    from the *repacked* bytes with the kernel's own bit extraction and rounding order."""
    nsb = id_ // QK
    c = np.arange(4)
    if qtype == "q4_K":
        blk = np.asarray(packed, np.uint8).reshape(od, nsb, 144)
        scale, mins = _q4_scales(blk[..., :16], bf16)
        words = blk[..., 16:].reshape(od, nsb, 4, 4, 2, 4)                      # [c, j, h, byte]
        w = words.astype(np.uint32)
        word = w[..., 0] | (w[..., 1] << 8) | (w[..., 2] << 16) | (w[..., 3] << 24)   # [od, nsb, c, j, h]
        out = np.zeros((od, nsb, 256))
        for half in range(2):
            for h in range(2):
                s = 2 * half + h
                for t in range(2):
                    v = (word[..., h] >> (4 * half + 8 * t)).astype(np.uint32)
                    lo, hi = v & 0xF, (v >> 16) & 0xF                          # [od, nsb, c, j]
                    for jj in range(4):
                        sub = 2 * jj + half
                        sc_, mn_ = scale[..., sub, None], mins[..., sub, None]
                        k = 64 * jj + 16 * s + 2 * c + 8 * t                  # [c]
                        out[..., k] = _round16(lo[..., jj] * sc_ + mn_, bf16)
                        out[..., k + 1] = _round16(hi[..., jj] * sc_ + mn_, bf16)
        return out.reshape(od, id_)
    L, H, SC, D = planes_q6(np.asarray(packed, np.uint8), od, nsb)
    d = D.copy().view(np.float16)[..., 0].astype(np.float32)
    scale = _round16(d[..., None] * SC.view(np.int8).astype(np.float32), bf16)     # [od, nsb, 16]
    Lw = L.reshape(od, nsb, 4, 4, 2, 4).astype(np.uint32)
    lword = Lw[..., 0] | (Lw[..., 1] << 8) | (Lw[..., 2] << 16) | (Lw[..., 3] << 24)  # [od, nsb, c, j, p]
    Hw = H.reshape(od, nsb, 4, 4)                                                 # [od, nsb, c, j]
    out = np.zeros((od, nsb, 256))
    for j in range(4):
        for s in range(4):
            lw = lword[..., j, s >> 1] >> (4 * (s & 1))
            for t in range(2):
                f = 2 * s + t
                hs = (Hw[..., j] << (4 - 2 * f)) if f <= 2 else (Hw[..., j] >> (2 * f - 4))
                v = ((lw >> (8 * t)) & 0x000F000F) | (hs & 0x00300030)
                lo, hi = (v & 0xFFFF).astype(np.int64) - 32, (v >> 16).astype(np.int64) - 32
                k = 64 * j + 16 * s + 2 * c + 8 * t
                sc_ = scale[..., 4 * j + s, None]
                out[..., k] = _round16(lo * sc_, bf16)
                out[..., k + 1] = _round16(hi * sc_, bf16)
    return out.reshape(od, id_)


# ------------------------------------------------------------------------------------------------ GPU


class WgmmaError(RuntimeError):
    pass


def _cp():
    from .gpu import cp

    return cp()


def supported(cc: int | None = None) -> bool:
    if cc is None:
        from .gpu import device_props

        cc = device_props()["cc"]
    return cc == 90


def require_sm90a() -> None:
    from .gpu import device_props

    p = device_props()
    if not supported(p["cc"]):
        runs = ", ".join(f["family"] for f in registry.FAMILIES if f.get("archs", ("sm_90",)) != ("sm_90a",)
                         and f.get("gemm"))
        raise WgmmaError(f"the wgmma_kq family needs an sm_90 (Hopper) GPU with the sm_90a feature set; this is "
                         f"{p['name']} (sm_{p['cc']}). GEMM families that run here: {runs}")


_DEFINE = re.compile(r"LK_(ABLATE|EXP)_\w+")

#: round 7's source of exploratory and ablation builds: the production device code (kernels/wgmma_kq.cuh) with a build
#: policy's hooks on, and the KPAIR body, each selected by its -D name. A build with ``defines`` compiles it instead of
#: the registry's source, with the same registry instantiations (the kernels' names and parameters are the same)
EXPERIMENTS = {"wgmma_kq.cu": Path(__file__).resolve().parent / "rounds" / "r07_wgmma" / "kernels"
               / "wgmma_kq_experiments.cu"}
#: the -D names that source builds (what each does: its header); a build's identity, in the cubin cache and in every
#: recorded run's ``defines``, is its sorted names
BUILD_NAMES = ("LK_EXP_TRACE", "LK_ABLATE_NOLOAD", "LK_ABLATE_NOCONV", "LK_ABLATE_NOFIX", "LK_ABLATE_NOSTORE",
               "LK_ABLATE_EMPTY", "LK_EXP_KPAIR", "LK_EXP_KPAIR_FIN", "LK_ABLATE_HALFB", "LK_ABLATE_DECOUPLE",
               "LK_ABLATE_HALFY")
#: the names of round 7's forms that lost and left the source: the commit that still builds each (its step and the
#: command that reproduces its run: labkernels.rounds.r07_wgmma.steps, the retired steps)
RETIRED_BUILDS = {"LK_EXP_WTMA": "4a8dcd9", "LK_EXP_TMAPF": "4a8dcd9", "LK_EXP_SPLITFIN": "4a8dcd9",
                  "LK_EXP_OLDCONV": "4a8dcd9", "LK_EXP_KPAIR_EARLY": "4a8dcd9", "LK_EXP_KPAIR_OVERLAP": "4a8dcd9",
                  "LK_EXP_KPAIR_REQ_PRODUCER": "4a8dcd9", "LK_EXP_KPAIR_REQ_CONSUMERS": "4a8dcd9",
                  "LK_EXP_WSTAGE": "82d821d", "LK_EXP_SWAPRED": "c301da5", "LK_EXP_ACC2": "92d328b"}


def build_defines() -> tuple[str, ...]:
    """The ablation / exploratory -D names of ``LABKERNELS_WG_DEFINES`` (``LK_ABLATE_*``, ``LK_EXP_*``), read from the
    environment at each call (a build made after the variable changes sees the change)."""
    return tuple(sorted(d for d in os.environ.get("LABKERNELS_WG_DEFINES", "").split() if _DEFINE.fullmatch(d)))


def check_defines(defines) -> tuple[str, ...]:
    """``defines`` as the sorted tuple a build is keyed by; anything but the ``LK_ABLATE_*`` / ``LK_EXP_*`` names of
    :data:`BUILD_NAMES` is refused (a retired form's with the commit that builds it)."""
    bad = [d for d in defines if not _DEFINE.fullmatch(str(d))]
    if bad:
        raise ValueError(f"build defines must be LK_ABLATE_* or LK_EXP_* names, got {bad}")
    gone = [d for d in defines if d in RETIRED_BUILDS]
    if gone:
        raise ValueError(f"{', '.join(gone)}: a form that lost and left the kernel source; it builds at commit "
                         f"{RETIRED_BUILDS[gone[0]]} (its step and command: labkernels gpu-check --round 7 --list)")
    unknown = [d for d in defines if d not in BUILD_NAMES]
    if unknown:
        raise ValueError(f"no build {unknown}: this tree builds {', '.join(BUILD_NAMES)}")
    return tuple(sorted(set(defines)))


def build_flags(defines) -> list[str]:
    """The nvcc flags of a build's -D names, and the constants they need (the KPAIR ring's stages per consumer
    warpgroup, one number for the kernel and :func:`kpair_ring_bytes`)."""
    flags = [f"-D{d}" for d in defines]
    if "LK_EXP_KPAIR" in defines:
        flags.append(f"-DLK_KPAIR_HALF_STAGES={KPAIR_HALF_STAGES}")
    return flags


@lru_cache(maxsize=None)
def _cubin(source: str, defines: tuple = ()) -> tuple[str, dict]:
    """nvcc -cubin for sm_90a of every registered instantiation of ``source`` (cached by content), and the map
    registry key -> mangled entry name (from ptxas' report, demangled with the audit's parser)."""
    from . import audit, paths

    nvcc = audit.nvcc_path()
    if not nvcc:
        raise WgmmaError("the sm_90a kernels are built with nvcc, which is not on PATH")
    specs = [k for k in registry.KERNELS if k.source == source]
    # ablation / exploratory builds (e.g. LK_ABLATE_NOFIX, LK_EXP_TRACE): round 7's source of them, its -D names an
    # argument of this cached function and part of the file cache key (twice on 2026-12-01 an ablation build made
    # after the plain one got the plain cubin: first this cache was keyed by the source alone, then the environment
    # read was cached)
    src = EXPERIMENTS[source] if defines else registry.KERNELS_DIR / source
    wrapper = audit.wrapper_source(src, specs)
    flags = ["-cubin", "-std=c++17", "-O3", "-Xptxas", "-v", "-gencode=arch=compute_90a,code=sm_90a",
             *([f"-I{src.parent}"] if defines else []), f"-I{registry.KERNELS_DIR}", *registry.cuda_defines()]
    flags += build_flags(defines)
    key = hashlib.sha256(("\n".join([wrapper, src.read_text(), audit._dir_digest(registry.KERNELS_DIR),
                                     audit._nvcc_version(nvcc), *flags])).encode()).hexdigest()[:20]
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
    entries = audit.parse_ptxas(log_file.read_text())
    dem = audit.demangle([e["mangled"] for e in entries])
    by_args = {}
    for e, d in zip(entries, dem):
        by_args[audit._split_demangled(d)] = e
    names = {}
    for k in specs:
        e = by_args.get((k.template, audit._spec_args(k)))
        if e is None:
            raise WgmmaError(f"{k.key}: not found in the ptxas report of {source}")
        names[k.key] = dict(e)
    return str(out), names


class WgKernel:
    """One compiled instantiation of the wgmma_kq family (cubin from nvcc, launched through the driver API so
    the 128-byte tensor map can be passed by value as a ``__grid_constant__`` parameter)."""

    def __init__(self, spec, defines=None):
        """``defines``: ablation / exploratory -D names of this build (default: ``LABKERNELS_WG_DEFINES``)."""
        self.defines = check_defines(build_defines() if defines is None else defines)
        cp = _cp()
        require_sm90a()
        self.spec = spec
        path, names = _cubin(spec.source, self.defines)
        self.entry = names[spec.key]
        self.module = cp.RawModule(path=path)
        self.func = self.module.get_function(self.entry["mangled"])
        self.smem = spec.dynamic_smem() + kpair_ring_bytes(spec, self.defines)
        from .gpu import SharedMemoryError, device_props

        cap = device_props()["smem_optin"]
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
        pdl = gpu.pdl_active() and self.spec.source in gpu.pdl_sources()   # the prefill's graph capture (issue 18)
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


@lru_cache(maxsize=None)
def kernel_built(defines: tuple, family: str = "wgmma_kq", **params) -> WgKernel:
    """:func:`kernel` of an ablation / exploratory build (``defines``: sorted ``LK_ABLATE_*`` / ``LK_EXP_*`` names)."""
    return WgKernel(registry.find(family, **params), defines=defines)


#: the LK_EXP_KPAIR ring: stages per consumer warpgroup (-DLK_KPAIR_HALF_STAGES to nvcc), 2 x this in all
KPAIR_HALF_STAGES = 3


def kpair_ring_bytes(spec, defines) -> int:
    """What an ``LK_EXP_KPAIR`` build's ring adds to the plain launch's shared memory: 2 x :data:`KPAIR_HALF_STAGES`
    stages of [256 tokens x 64 k] f16 where the registry's instantiation has STAGES of them (0 for any other build,
    and for the build's instantiations other than :data:`KPAIR_PARAMS`)."""
    if "LK_EXP_KPAIR" not in defines or spec.family != "wgmma_kq" or any(
            spec.p[n] != v for n, v in KPAIR_PARAMS.items() if n != "SK"):
        return 0   # the build's other instantiations trap (the launcher refuses them first)
    return (2 * KPAIR_HALF_STAGES - spec.p["STAGES"]) * spec.p["BN"] * 128


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
    from .gpu import ShapeError

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
        from .quants import normalize_qtype

        qtype = normalize_qtype(qtype)
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
    token tiles; stream-K below that, where a data-parallel grid leaves SMs idle)."""
    bn = 256 if nt >= 1024 else 128
    return {"BN": bn, "STAGES": 4, "BF16": 0, "SCL": main_scl(qtype, bn), "SK": 0 if nt >= 1024 else 1}


def main_scl(qtype: str, bn: int) -> int:
    """The registry's main-path scale form: q4_K SCL=0; q6_K SCL=1 at BN=128 and SCL=0 at BN=256 (SCL=1 spills
    there once the scheduler's state shares the consumers' registers)."""
    return 1 if qtype == "q6_K" and bn == 128 else 0


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


_VARIANT = re.compile(r"wgmma_bn(\d+)_s(\d+)_scl(\d)(_sku|_skt|_sk)?(?:_e([12345]))?(?:_a(4))?(?:_p([12]))?$")
_VARIANT_SMEM = re.compile(r"wgmma_smem_bn(\d+)_s(\d+)(_sku|_skt|_sk)?(_c2)?$")


_AUTO = {}


def auto_table_cached():
    """:func:`auto_table` of the default data folder, read once per process (the prefill asks per weight)."""
    if "t" not in _AUTO:
        _AUTO["t"] = auto_table()
    return _AUTO["t"]


#: the scheduler in a variant's name: data-parallel, stream-K, uniform split-k, tile-aligned split-k
_SK_SUFFIX = {0: "", 1: "_sk", 2: "_sku", 3: "_skt"}


def variant_name(BN: int, STAGES: int, SCL: int, SK: int = 0, FORM: int = 0, EPI: int = 0, AQ: int = 2,
                 PF: int = 0) -> str:
    """The one name of a round-7 variant: tile, stages, scale form, then the scheduler (``_sk`` / ``_sku`` /
    ``_skt``), the epilogue form (``_e1`` bulk fold, ``_e2`` bulk fold + TMA store; none for the plain one) and
    the A-fragment sets (``_a4``; none for AQ=2), the L2 prefetch distance (``_p1`` / ``_p2``; none without). The
    shared-memory form: ``wgmma_smem_bn{BN}_s{STAGES}``, the scheduler, ``_c2`` with two converter warpgroups
    (FORM=2)."""
    if FORM:
        if EPI or AQ != 2 or PF:
            raise ValueError("the shared-memory form has the plain epilogue only (EPI=0) and no register A sets (AQ)")
        return f"wgmma_smem_bn{BN}_s{STAGES}" + _SK_SUFFIX[int(SK)] + ("_c2" if FORM == 2 else "")
    return (f"wgmma_bn{BN}_s{STAGES}_scl{SCL}" + _SK_SUFFIX[int(SK)] + (f"_e{int(EPI)}" if EPI else "")
            + (f"_a{int(AQ)}" if AQ != 2 else "") + (f"_p{int(PF)}" if PF else ""))


def _sk_of(suffix) -> int:
    return {v: k for k, v in _SK_SUFFIX.items()}[suffix or ""]


def variant_params(variant: str, qtype: str) -> tuple[str, dict]:
    """A benchmark variant name -> (family, template params): 'wgmma_bn128_s4_scl0' / 'int8_q4k_nb'."""
    if variant.startswith("int8_"):
        from .gpu import _int8_default      # the registry's default int8 variant of the type

        fam = variant[5:]
        f, p = _int8_default(qtype)
        return fam, (dict(p) if f == fam else {})
    m = _VARIANT_SMEM.match(variant)
    if m:
        bn, st = map(int, m.groups()[:2])
        return "wgmma_kq", {"BN": bn, "STAGES": st, "BF16": 0, "SK": _sk_of(m.group(3)), "FORM": 2 if m.group(4) else 1}
    m = _VARIANT.match(variant)
    if not m:
        raise ValueError(f"not a round-7 variant name: {variant!r}")
    bn, st, scl = map(int, m.groups()[:3])
    p = {"BN": bn, "STAGES": st, "BF16": 0, "SCL": scl, "SK": _sk_of(m.group(4))}
    if m.group(5):                 # the epilogue form, named only where it is not the plain one
        p["EPI"] = int(m.group(5))
    if m.group(6):                 # the A-fragment sets, named only where they are not AQ=2
        p["AQ"] = int(m.group(6))
    if m.group(7):                 # the L2 prefetch distance, named only where there is one
        p["PF"] = int(m.group(7))
    return "wgmma_kq", p


def tile_count(nt: int, od: int, BN: int) -> int:
    """The output tiles of a launch: 128 weight rows x BN tokens each, tails rounded up."""
    return ((od + 127) // 128) * ((nt + BN - 1) // BN)


#: the token-tile widths the wgmma kernels are built with (registry family wgmma_kq, parameter BN)
BN_VALUES = (128, 256)


def check_launch_shape(nt, od, id_, BN, sm_count, what: str = "wgmma") -> None:
    """ShapeError unless nt, od >= 1, id a positive multiple of 256, BN one of :data:`BN_VALUES` and sm_count >= 1,
    all integers (host-side, O(1): the launch paths call it)."""
    from .gpu import ShapeError

    for name, v, lo in (("nt", nt, 1), ("od", od, 1), ("id", id_, QK), ("BN", BN, 1), ("sm_count", sm_count, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ShapeError(f"{what}: {name} must be an integer, got {v!r} ({type(v).__name__})")
        if v < lo:
            raise ShapeError(f"{what}: {name} must be >= {lo}, got {v}")
    if id_ % QK:
        raise ShapeError(f"{what}: id={id_} is not a multiple of {QK} (whole q4_K / q6_K super-blocks)")
    if BN not in BN_VALUES:
        raise ShapeError(f"{what}: BN must be one of {', '.join(map(str, BN_VALUES))}, got {BN}")


def schedule(sk: int, nt: int, od: int, id_: int, BN: int, sm_count: int) -> tuple[int, int]:
    """(ncta, dp_tiles) of the kernel's scheduler (see ``LkSched`` in wgmma_kq.cu) for ``tiles`` = 128-row x BN
    tiles of I = id/256 super-blocks each.

    * ``SK=0`` (data-parallel): one CTA per tile, the plain grid (ncta = dp_tiles = tiles).
    * ``SK=1`` (stream-K): a persistent grid of ncta = min(SMs, tiles x I) CTAs (one per SM: the kernel's owners wait on other
      CTAs, so all must be resident); whole waves of tiles go data-parallel, and the last full wave plus the
      remainder (or everything when there is less than one wave) is stream-K: split into ncta equal ranges of
      super-block iterations, partial tiles summed in a fixed order.
    * ``SK=2`` (uniform split-k): the same kernel on a grid of G x tiles CTAs, G the largest divisor of I with
      G x tiles <= SMs (:func:`uniform_split`): the kernel's range split then gives every CTA one G-th of one tile's
      k, so all CTAs finish their loops together and an owner waits for G - 1 helpers that started when it did
      (the paired grid of the split-finish experiment, run 20261201T174118Z: 5-10% faster than SK=1 at od 4096,
      nt=512). A shape with G < 2 is refused (ShapeError), never run on another grid.
    * ``SK=3`` (tile-aligned split-k): G x tiles CTAs with G from :func:`tile_split` -- every CTA one part of one
      tile, floor(I/G) or ceil(I/G) super-blocks, whether or not G divides I (the kernel's ``split_g``): the uniform
      grid for tiles whose super-block count has no divisor that fits, e.g. 4096 x 11008's 43 at nt=512 (G=2: 21 and
      22). Where G divides I it is SK=2's grid. G < 2 is refused (ShapeError)."""
    if sk not in (0, 1, 2, 3):
        raise gpu.ShapeError(f"SK is 0 (data-parallel), 1 (stream-K), 2 (uniform split-k) or 3 (tile-aligned split-k), "
                         f"not {sk!r}")
    check_launch_shape(nt, od, id_, BN, sm_count, "schedule")
    tiles = tile_count(nt, od, BN)
    nsb = id_ // QK
    if tiles * nsb >= 2 ** 31 or od * nsb >= 2 ** 31:
        raise gpu.ShapeError(f"{nt} x {od} x {id_} exceeds the kernel's 32-bit iteration and block counts")
    if not sk:
        return tiles, tiles
    if sk in (2, 3):
        g = split_parts(sk, tiles, nsb, sm_count)
        if g < 2:
            from .gpu import ShapeError

            grid, rule = ("uniform", f"no divisor G >= 2 of {nsb}") if sk == 2 else ("tile-aligned", "no G >= 2")
            raise ShapeError(f"no {grid} split-k grid (SK={sk}) at nt={nt}, od={od}, id={id_}, BN={BN}: {tiles} tiles "
                             f"of {nsb} super-blocks on {sm_count} SMs leave {rule} with G x tiles <= {sm_count} "
                             "(use SK=1)")
        return g * tiles, 0
    ncta = max(1, min(int(sm_count), tiles * (id_ // QK)))
    full, rem = divmod(tiles, ncta)
    if rem == 0:
        return ncta, tiles           # whole waves: persistent data-parallel, no partial tiles
    return ncta, max(0, full - 1) * ncta


def uniform_split(tiles: int, nsb: int, sm_count: int) -> int:
    """G of the uniform split-k grid (``SK=2``): the largest divisor of the super-blocks per tile ``nsb`` with
    G x ``tiles`` <= ``sm_count``; 1 where only G = 1 fits (no split), 0 where not even one wave of tiles does."""
    fit = [g for g in range(1, nsb + 1) if nsb % g == 0 and g * tiles <= sm_count]
    return max(fit) if fit else 0


def tile_split(tiles: int, nsb: int, sm_count: int) -> int:
    """G of the tile-aligned split-k grid (``SK=3``): the fewest parts per tile that give the shortest longest part
    ceil(nsb / G) the SMs allow (G x ``tiles`` <= ``sm_count``, G <= ``nsb``); fewer parts mean fewer partial tiles
    to fold for the same critical path. 1 where only one part fits, 0 where not even one wave of tiles does."""
    gmax = min(int(nsb), int(sm_count) // int(tiles)) if tiles else 0
    if gmax < 1:
        return 0
    longest = -(-nsb // gmax)
    return min(g for g in range(1, gmax + 1) if -(-nsb // g) == longest)


def split_parts(sk: int, tiles: int, nsb: int, sm_count: int) -> int:
    """G, the CTAs per tile of a split-k grid: SK=2 :func:`uniform_split`, SK=3 :func:`tile_split`."""
    return uniform_split(tiles, nsb, sm_count) if sk == 2 else tile_split(tiles, nsb, sm_count)


def split_g(sk: int, nt: int, od: int, id_: int, BN: int, sm_count: int) -> int:
    """The kernel's ``split_g`` argument: SK=3's G (:func:`tile_split`), 0 for every other scheduler."""
    return split_parts(3, tile_count(nt, od, BN), id_ // QK, sm_count) if sk == 3 else 0


def sk_fits(sk: int, nt: int, od: int, id_: int, BN: int, sm_count: int) -> bool:
    """Whether :func:`schedule` takes this scheduler at this shape (SK=2 and SK=3 refuse shapes)."""
    return sk not in (2, 3) or split_parts(sk, tile_count(nt, od, BN), id_ // QK, sm_count) >= 2


@lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    from .gpu import device_props

    return int(device_props()["sm_count"])


SK_MAXSEG = registry.SK_MAXSEG   # the kernel's stream-K segment list (-DLK_SK_MAXSEG, registry.cuda_defines)


def sk_start(c: int, ncta: int, I: int, tiles: int, dp_tiles: int, G: int = 0) -> int:
    """The host model of the kernel's ``lk_sk_start``: where CTA ``c``'s stream-K range begins (``c = ncta`` gives
    the end). G = 0: ncta equal ranges of the (tiles - dp_tiles) x I iterations; G > 0 (SK=3): part c % G of tile
    c // G, at floor((c % G) x I / G)."""
    if G > 0:
        t, p = divmod(c, G)
        return t * I + (p * I) // G
    base, extra = divmod((tiles - dp_tiles) * I, ncta)
    return c * base + min(c, extra)


def segments(ncta: int, cta: int, I: int, tiles: int, dp_tiles: int, G: int = 0) -> list[tuple[int, int, int]]:
    """The (tile, klo, khi) segments CTA ``cta`` runs -- the host model of the kernel's ``lk_segment`` /
    ``lk_sk_segments`` (data-parallel waves, then its stream-K range), for the launcher's bound check and tests."""
    out = [(cta + w * ncta, 0, I) for w in range(dp_tiles // ncta)]
    start = lambda c: sk_start(c, ncta, I, tiles, dp_tiles, G)
    it, it1 = start(cta), start(cta + 1)
    while it < it1:
        t = it // I
        khi = min(it1, (t + 1) * I) - t * I
        out.append((dp_tiles + t, it - t * I, khi))
        it = t * I + khi
    return out


@lru_cache(maxsize=4096)
def reduce_finish_fits(ncta: int, I: int, tiles: int, dp_tiles: int, G: int = 0) -> bool:
    """Whether EPI=5's reduce finish takes this schedule (the host model, :func:`segments`): every tile held by at
    most two CTAs, a split tile's helper the CTA right after its owner (whose flag it waits on), and no CTA holding
    two split tiles from their k = 0 (its producer zeroes one)."""
    held = {}
    for c in range(ncta):
        own = 0
        for tile, klo, khi in segments(ncta, c, I, tiles, dp_tiles, G):
            held.setdefault(tile, []).append((c, klo, khi))
            own += klo == 0 and khi < I
        if own > 1:
            return False
    for parts in held.values():
        if len(parts) > 2:
            return False
        if len(parts) == 2:
            (c0, k0, _), (c1, k1, _) = sorted(parts, key=lambda p: p[1])
            if k0 != 0 or c1 != c0 + 1:
                return False
    return True


@lru_cache(maxsize=4096)
def _check_schedule(ncta: int, I: int, tiles: int, dp_tiles: int, G: int = 0) -> None:
    for c in range(ncta):
        n = len(segments(ncta, c, I, tiles, dp_tiles, G)) - dp_tiles // ncta
        if n > SK_MAXSEG:
            raise ValueError(f"stream-K range of CTA {c} has {n} segments (the kernel holds {SK_MAXSEG})")


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
         SK: int = 0, FORM: int = 0, EPI: int = 0, AQ: int = 2, PF: int = 0, defines: tuple = ()):
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
    plain epilogue; not q6_K BN=256, which spills with it). ``defines``: an ablation / exploratory build of the
    same kernel (``LK_ABLATE_*`` / ``LK_EXP_*`` -D names of :data:`BUILD_NAMES`, e.g. ``("LK_ABLATE_NOCONV",)``;
    round 7's source of them, :data:`EXPERIMENTS`), for A/B runs; () the plain build (or ``LABKERNELS_WG_DEFINES``)."""
    from .gpu import ShapeError, _out

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
        kp = dict(QT=qt, BN=BN, STAGES=STAGES, BF16=bf16, NCV=int(FORM))
        k = kernel_built(check_defines(defines), "wgmma_kqs", **kp) if defines else kernel("wgmma_kqs", **kp)
    else:
        kp = dict(QT=qt, BN=BN, STAGES=STAGES, BF16=bf16, SCL=SCL, EPI=int(EPI), AQ=int(AQ), PF=int(PF))
        k = kernel_built(check_defines(defines), **kp) if defines else kernel(**kp)
        if "LK_EXP_KPAIR" in k.defines:
            return _gemm_kpair(k, w, x16, out, dict(BN=BN, STAGES=STAGES, BF16=bf16, SCL=SCL, SK=SK, EPI=EPI, AQ=AQ,
                                                    PF=PF))
    # resident CTAs per SM: the plain build's for the empty ablation (LK_ABLATE_EMPTY holds no registers, so more of
    # it fit an SM, which would give the stream-K grid more CTAs than the launch whose floor it measures)
    res = kernel(**kp).blocks_per_sm if not FORM and "LK_ABLATE_EMPTY" in k.defines else k.blocks_per_sm
    sms = _sm_count(cp.cuda.Device().id) * res
    ncta, dp_tiles = schedule(int(SK), nt, w.od, w.id, BN, sms)
    g = split_g(int(SK), nt, w.od, w.id, BN, sms)
    if EPI == 3 and g != 2:
        raise ShapeError(f"EPI=3 pairs a tile's two CTAs in a cluster: SK=3 gives {g} CTAs per tile at nt={nt}, "
                         f"od={w.od}, id={w.id}, BN={BN} on {sms} SMs, not 2 (use EPI=0)")
    if SK:
        _check_schedule(ncta, w.id // QK, tile_count(nt, w.od, BN), dp_tiles, g)
    if EPI == 5 and not reduce_finish_fits(ncta, w.id // QK, tile_count(nt, w.od, BN), dp_tiles, g):
        raise ShapeError(f"EPI=5 adds a split tile's partial sums into Y in either order, which is deterministic for "
                         f"two CTAs a tile (the helper the owner's next CTA) and not for more: SK={SK} at nt={nt}, "
                         f"od={w.od}, id={w.id}, BN={BN} on {sms} SMs splits a tile over more (use EPI=4)")
    y = _out(nt, w.od, out)
    tm = tensor_map(x16, BN, bool(bf16))
    ws, flags = _WS.get(cp.cuda.get_current_stream().ptr, sms)
    if FORM:
        k.launch((ncta, 1), (tm, weight_tensor_map(w.gguf)), y, np.int32(nt), np.int32(w.od), np.int32(w.id), ws,
                 flags, np.int32(dp_tiles), np.int32(g))
    else:
        ymap = output_map(y, BN) if EPI == 2 else output_map(y, 128) if EPI >= 4 else NO_MAP   # EPI=4, 5: 128 a round
        k.launch((ncta, 1), (tm, ymap), w.packed, y, np.int32(nt), np.int32(w.od), np.int32(w.id), ws, flags,
                 np.int32(dp_tiles), np.int32(g), cluster=2 if EPI == 3 else 1)
    return y


#: the exploratory build of one 64-row x 256-token tile per CTA, its two consumer warpgroups on the same rows each over
#: every other super-block, their partial sums added through shared memory, 2-CTA clusters multicasting the
#: activations (kernel: LK_EXP_KPAIR; round 7's twenty-first step)
KPAIR = ("LK_EXP_KPAIR",)
#: its form with the twenty-fifth step's two levers (kernel: LK_EXP_KPAIR_FIN): Y through the idle ring and TMA stores,
#: and the pair's exit barrier arrived at right after the main loops (round 7's twenty-sixth step); bitwise the build
KPAIR_FIN = ("LK_EXP_KPAIR", "LK_EXP_KPAIR_FIN")
#: the FIN form storing half of Y's f32 bytes (kernel: LK_ABLATE_HALFY; timing only, its Y means nothing): what a
#: 16-bit Y's bytes would cost the finish (round 7's twenty-eighth step)
FIN_HALFY = KPAIR_FIN + ("LK_ABLATE_HALFY",)
#: the one launch shape it is built for: BN=256, 4 stages, f16, the main scale form, the plain epilogue, the
#: data-parallel grid
KPAIR_PARAMS = dict(BN=256, STAGES=4, BF16=0, SCL=0, SK=0, EPI=0, AQ=2, PF=0)


def kpair_grid(nt: int, od: int) -> int:
    """CTAs of an ``LK_EXP_KPAIR`` launch: ceil(od / 64) m tiles rounded up to even (a cluster's two CTAs hold the same
    token tile; a padded tile computes clamped rows and stores none) x ceil(nt / 256) token tiles."""
    mt = -(-int(od) // 64)
    return (mt + (mt & 1)) * -(-int(nt) // 256)


def _gemm_kpair(k, w, x16, out, prm: dict):
    """:func:`gemm` on an ``LK_EXP_KPAIR`` build: its one launch shape (:data:`KPAIR_PARAMS`; anything else is refused,
    never run another way), the activation map's box half a stage (128 tokens: each CTA of a cluster loads one half
    and multicasts it), clusters of 2."""
    from .gpu import ShapeError, _out

    if prm != KPAIR_PARAMS:
        raise ShapeError(f"LK_EXP_KPAIR is built for {KPAIR_PARAMS} only, asked {prm}")
    cp = _cp()
    nt, id_ = x16.shape
    y = _out(nt, w.od, out)
    ws, flags = _WS.get(cp.cuda.get_current_stream().ptr, _sm_count(cp.cuda.Device().id))   # unread by the build
    ymap = output_map(y, 128) if "LK_EXP_KPAIR_FIN" in k.defines else NO_MAP   # FIN: Y leaves by TMA stores
    k.launch((kpair_grid(nt, w.od), 1), (tensor_map(x16, 128), ymap), w.packed, y, np.int32(nt), np.int32(w.od),
             np.int32(id_), ws, flags, np.int32(0), np.int32(0), cluster=2)
    return y


def to_bf16(x):
    """float32 cupy array -> bf16 bits (uint16), round to nearest even."""
    cp = _cp()
    u = x.view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


# ------------------------------------------------------------------------------------------------ gates


def gate(y, w_raw: np.ndarray, qtype: str, x: np.ndarray, packed: np.ndarray | None = None, bf16: bool = False,
         tokens=None, w64: np.ndarray | None = None, w16: np.ndarray | None = None) -> dict:
    """The round-7 parity gate on ``tokens`` (all rows), the lab's two gates in the form the int8 rounds use them
    (max relative error against the kernel's exact function, NMSE against the independent float64 reference):

    * ``max_rel_err`` = max|y - exact| / max|exact| <= 1e-3, exact = the kernel's own exact function computed on the
      CPU from the repacked bytes (:func:`emulate_weights`: the 16-bit weights the tensor cores see) times the
      16-bit activations, in float64 -- as the int8 rounds gate against the exact integer function of their q8_1
      activations; a second, strict bound :func:`exact_gate` (~1e-5: only fp32 accumulation order may differ)
      must hold too;
    * ``nmse`` <= 5e-4 against the pure float64 reference (gguf-py's dequantized weights, the original float
      activations).

    ``max_rel_err_f64`` (against the pure float64 reference) and ``max_rel_err_in`` (gguf-py weights times the 16-bit
    activations) are reported beside them: rounding the weights to fp16 alone puts those near 1e-3.
    ``w64`` / ``w16`` (gguf-py's dequantized / the emulated weights) may be passed in when one matrix is gated often."""
    import gguf

    x = np.asarray(x, np.float32)
    tok = np.arange(x.shape[0]) if tokens is None else np.asarray(tokens)
    y = np.asarray(y, np.float64)[tok]
    if w64 is None:
        w64 = gguf.quants.dequantize(np.ascontiguousarray(w_raw), gguf.GGMLQuantizationType[qtype.upper()])
    w64 = np.asarray(w64, np.float64)
    x16 = _round16(x[tok], bf16)
    ref64 = x[tok].astype(np.float64) @ w64.T
    ref_in = x16 @ w64.T
    finite = bool(np.isfinite(y).all())

    def rel(a, b):
        return float(np.abs(a - b).max() / (float(np.abs(b).max()) or 1.0)) if finite else float("inf")

    if w16 is None:
        if packed is None:
            raise ValueError("the gate needs the repacked bytes (packed) or the emulated weights (w16)")
        w16 = emulate_weights(packed, qtype, ref64.shape[1], x.shape[1], bf16=bf16)
    exact_rel = rel(y, x16 @ np.asarray(w16, np.float64).T)
    out = {"max_rel_err": exact_rel, "exact_rel": exact_rel, "max_rel_err_in": rel(y, ref_in),
           "max_rel_err_f64": rel(y, ref64),
           "nmse": float(((y - ref64) ** 2).sum() / max((ref64 ** 2).sum(), 1e-300)) if finite else float("inf"),
           "nonfinite": int(y.size - np.isfinite(y).sum()), "tokens_checked": int(tok.size)}
    out["ok"] = bool(finite and exact_rel <= reference.REL_ERR_GATE and exact_rel <= exact_gate(x.shape[1])
                     and out["nmse"] <= reference.NMSE_GATE)
    return out


def exact_gate(id_: int) -> float:
    """Kernel vs its own exact function (16-bit operands, float64 products): only the tensor cores' fp32
    accumulation order differs, an error growing like sqrt(K): 1e-5 up to K=1024, 3.7e-5 at K=14336. A wrong
    fragment, scale or row gives O(1)."""
    return 1e-5 * max(1.0, (id_ / 1024) ** 0.5)


def int8_path_error(w_raw: np.ndarray, qtype: str, x: np.ndarray) -> dict:
    """The error of the lab's int8 q8_1 path against the same float64 reference (its kernels equal the integer
    reference to ~1e-6, so the integer reference stands for them): for the 'smaller than int8' comparison."""
    a = reference.quantize_activations(x)
    ref = reference.gemm_int_ref(w_raw, qtype, a)
    ref64 = reference.gemm_f64_ref(w_raw, qtype, x)
    return {"max_rel_err_f64": float(np.abs(ref - ref64).max() / (float(np.abs(ref64).max()) or 1.0)),
            "nmse": float(((ref - ref64) ** 2).sum() / max((ref64 ** 2).sum(), 1e-300))}


# ------------------------------------------------------------------------------------------------ benchmark

#: the four 7B shapes of the issue (od x id) and the token counts of the nt sweep
SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008), (4096, 14336))
NTS = (64, 128, 256, 512, 1024, 2048, 4096)


def bench(shapes=SHAPES, nts=NTS, qtypes=("q4_K", "q6_K"), variants=((128, 4, None, 1), (256, 4, None, 0)), pairs: int = 3,
          repeats: int = 10, run=None, seed: int = 0, progress=print, int8: bool = True,
          table: str = "wgmma_bench", leads_us: tuple = ()) -> list[dict]:
    """Interleaved, L2-flushed CUDA-event timings of the wgmma_kq variants against cuBLAS fp16 on cached
    dequantized weights (and including the dequant), and the lab's best int8 kernel, at matched (nt, od, id).
    ``variants``: tuples (BN, STAGES, SCL or None for the main scale form, SK, FORM, EPI, AQ, PF), trailing defaults
    optional (SK, FORM, EPI 0; AQ 2; PF 0).

    Every (qtype, shape, nt) is parity-gated on 24 tokens (all rows) before it is timed; a failed gate raises.
    ``leads_us``: also time every call behind a :class:`labkernels.bench.Lead` of each of these microseconds,
    interleaved call by call with the plain timing (rows' ``timing``: ``events`` or ``lead<us>``, with ``host_us``,
    each call's host time, and ``flush_us``, the flush's device time).
    Rows (one per variant and pair) go to ``run`` tables ``table`` (``wgmma_bench``: the benchmark of record, which
    ``auto`` reads; an experiment names its own) and ``wgmma_parity``."""
    import gguf

    from . import bench as B
    from . import cases
    cp = _cp()
    rng = np.random.default_rng(seed or None)
    flush = B.Flusher()
    timings = {"events": None, **{f"lead{int(u)}": B.Lead(float(u)) for u in leads_us}}
    fl_us = B.flush_us(flush) if leads_us else None
    if leads_us:
        progress(f"flush: {fl_us:.1f} us of device time; leads {', '.join(f'{u:g}' for u in leads_us)} us")
    rows = []
    for qtype in qtypes:
        for od, id_ in shapes:
            raw = cases.synthetic_weights(qtype, od, id_, rng)
            w = WgWeight.from_gguf(raw, qtype, plane=any(len(v) > 2 and v[2] == 2 for v in variants))
            wq = gpu.QWeight.upload(raw, qtype)
            if qtype == "q4_K":
                w.gguf = wq.raw        # the shared-memory form reads the GGUF rows as uploaded
            w64 = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype.upper()])
            w16e = emulate_weights(cp.asnumpy(w.packed), qtype, od, id_)
            if run is not None:
                run.append("wgmma_repack", {"qtype": qtype, "od": od, "id": id_, "repack_s": w.repack_s,
                                            "bytes": w.nbytes, "gguf_bytes": int(raw.nbytes),
                                            "bits_per_weight": 8 * w.nbytes / (od * id_),
                                            "plane_bytes": w.plane_bytes, "plane_s": w.plane_s,   # q4_K's SCL=2 plane
                                            "bits_per_weight_with_plane": 8 * (w.nbytes + w.plane_bytes) / (od * id_)})
            w16 = gpu.dequant_f16(wq)
            fam, fpar = registry.default_variant(qtype).family, registry.default_variant(qtype).p
            for nt in nts:
                x, xg, x16, y, tok = cases.point_inputs(rng, nt, od, id_)
                vs = {}
                for v in variants:
                    bn, st, scl, sk, form, epi, aq, pf = (tuple(v) + (0, 0, 0, 0, 0, 0, 2, 0)[len(v):])[:8]
                    if form and qtype != "q4_K":
                        continue           # the shared-memory form takes q4_K
                    if pf and qtype == "q6_K" and bn == 256:
                        continue           # no q6_K BN=256 prefetch build (its consumers spill with it)
                    scl = main_scl(qtype, bn) if scl is None else scl
                    if epi == 3 and (qtype == "q6_K" and bn == 256 or not pair_fits(nt, od, id_, bn,
                                                                                      _sm_count(cp.cuda.Device().id))):
                        if run is not None:     # the pair exchange: two CTAs per tile only (no q6_K BN=256 build)
                            why = ("no q6_K BN=256 build" if qtype == "q6_K" and bn == 256
                                   else "no two-CTA-per-tile grid (SK=3, G != 2)")
                            run.append("wgmma_not_applicable", {"qtype": qtype, "od": od, "id": id_, "nt": nt, "why": why,
                                                                "variant": variant_name(bn, st, scl, sk, form, epi, aq, pf)})
                        continue
                    if epi == 5 and not reduce_fits(sk, nt, od, id_, bn, _sm_count(cp.cuda.Device().id)):
                        if run is not None:     # the reduce finish: at most two CTAs a tile
                            run.append("wgmma_not_applicable", {"qtype": qtype, "od": od, "id": id_, "nt": nt,
                                                                "variant": variant_name(bn, st, scl, sk, form, epi, aq, pf),
                                                                "why": "a tile over more than two CTAs (EPI=5)"})
                        continue
                    if sk in (2, 3) and not sk_fits(sk, nt, od, id_, bn, _sm_count(cp.cuda.Device().id)):
                        if run is not None:     # the split-k grid does not fit: not run, and said so
                            run.append("wgmma_not_applicable", {"qtype": qtype, "od": od, "id": id_, "nt": nt,
                                                                "variant": variant_name(bn, st, scl, sk, form, epi, aq, pf),
                                                                "why": f"no {'uniform' if sk == 2 else 'tile-aligned'} "
                                                                       "split-k grid (G < 2)"})
                        continue
                    y.fill(np.nan)
                    gemm(w, x16, out=y, BN=bn, STAGES=st, SCL=scl, SK=sk, FORM=form, EPI=epi, AQ=aq, PF=pf)
                    g = gate(cp.asnumpy(y), raw, qtype, x, tokens=tok, w64=w64, w16=w16e)
                    name = variant_name(bn, st, scl, sk, form, epi, aq, pf)
                    if run is not None:
                        run.append("wgmma_parity", {"qtype": qtype, "od": od, "id": id_, "nt": nt, "variant": name,
                                                    **g})
                    if not g["ok"]:
                        raise AssertionError(f"{name} parity failed: {qtype} nt={nt} od={od} id={id_}: {g}")
                    vs[name] = (lambda bn=bn, st=st, scl=scl, sk=sk, form=form, epi=epi, aq=aq, pf=pf: gemm(
                        w, x16, out=y, BN=bn, STAGES=st, SCL=scl, SK=sk, FORM=form, EPI=epi, AQ=aq, PF=pf))
                main = default_params(qtype, nt)
                vs["wgmma_incl_f32_to_f16"] = lambda: gemm(w, xg, out=y, **main)
                y16 = cp.empty((nt, od), cp.float16)
                vs["cublas_f16_cached"] = lambda: gpu.matmul_f16(x16, w16, out=y16)
                vs["cublas_f16_with_dequant"] = lambda: (gpu.dequant_f16(wq, out=w16), gpu.matmul_f16(x16, w16, out=y16))
                if int8:
                    a = gpu.prepass(xg)
                    vs[f"int8_{fam}"] = lambda: gpu.gemm(wq, a, fam, out=y, **fpar)
                t0 = time.time()
                key = {"qtype": qtype, "od": od, "id": id_, "nt": nt}
                if not leads_us:
                    res = B.interleaved(vs, pairs=pairs, repeats=repeats, flush=flush)
                    per = {"": res}
                    new = B.pair_rows(res, key, nt, od, id_)
                else:                      # each call under every timing, one after the other, round by round
                    combo = {(n, t): f for n, f in vs.items() for t in timings}
                    res = B.interleaved(combo, pairs=pairs, repeats=repeats, flush=flush,
                                        leads={k: timings[k[1]] for k in combo})
                    per = {t: {n: res[(n, t)] for n in vs} for t in timings}
                    new = [r for t in timings for r in B.pair_rows(per[t], {**key, "timing": t}, nt, od, id_,
                                                                    tail={"flush_us": fl_us})]
                rows += new
                if run is not None:
                    run.append(table, new)
                for t, rt in per.items():
                    med = {k: np.median([s["median_us"] for s in v]) for k, v in rt.items()}
                    best = min((k for k in med if k.startswith(("wgmma_bn", "wgmma_smem"))), key=med.get)
                    progress(f"{qtype} {od}x{id_} nt={nt}{' ' + t if t else ''}: " + ", ".join(
                        f"{k} {2 * nt * od * id_ / (v * 1e-6) / 1e12:.0f}" for k, v in med.items())
                        + f" TOPS-eq; best/cuBLAS {med['cublas_f16_cached'] / med[best]:.2f}x ({time.time() - t0:.1f} s)")
    return rows


def cost_scan(run=None, od: int = 4096, ids=(256, 1024, 4096, 14336), nt: int = 512, pairs: int = 3,
              repeats: int = 10, seed: int = 0, progress=print, ablate_id: int | None = 4096) -> list[dict]:
    """Where a launch's time goes at a small token count: an id (k) scan of q4_K at (nt, od) for BN 128/256 under
    both schedulers and cuBLAS fp16 (interleaved, L2 flushed, CUDA events), so that time = intercept + slope x k
    separates the per-launch cost (launch, pipeline fill, epilogue) from the main loop's; plus, per id, the
    back-to-back rate of 50 launches without a flush (host-enqueue-bound when it exceeds the kernel time) and the
    host time of one ``gemm()`` call. At ``ablate_id``, the stream-K BN=256 launch also from ablation builds
    (``LK_ABLATE_NOFIX``: no partial sums / fix-up; ``LK_ABLATE_NOSTORE``: no output store; wrong results by design,
    timing only), interleaved with the normal build: variant names end in ``[NOFIX]`` / ``[NOSTORE]``. Rows to
    ``run`` table ``cost_scan``."""
    from . import bench as B
    from . import cases

    cp = _cp()
    rng = np.random.default_rng(seed or None)
    flush = B.Flusher()
    rows = []
    for id_ in ids:
        raw = cases.synthetic_weights("q4_K", od, id_, rng)
        w = WgWeight.from_gguf(raw, "q4_K")
        x16 = cp.asarray(rng.standard_normal((nt, id_)).astype(np.float16))
        y = cp.empty((nt, od), cp.float32)
        y16 = cp.empty((nt, od), cp.float16)
        w16 = cp.asarray(rng.standard_normal((od, id_)).astype(np.float16))
        vs = {variant_name(bn, 4, 0, sk): (lambda bn=bn, sk=sk: gemm(w, x16, out=y, BN=bn, SCL=0, SK=sk))
              for bn in (128, 256) for sk in (0, 1)}
        vs["cublas_f16_cached"] = lambda: cp.matmul(x16, w16.T, out=y16)
        res = B.interleaved(vs, pairs=pairs, repeats=repeats, flush=flush)
        for name, st in res.items():
            f = vs[name]
            f()
            cp.cuda.Device().synchronize()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            t0 = time.perf_counter()
            e0.record()
            for _ in range(50):
                f()
            e1.record()
            t1 = time.perf_counter()
            e1.synchronize()
            rows.append({"qtype": "q4_K", "od": od, "id": id_, "nt": nt, "variant": name,
                         "median_us": float(np.median([r["median_us"] for r in st])),
                         "back_to_back_us": cp.cuda.get_elapsed_time(e0, e1) * 1e3 / 50,
                         "host_enqueue_us": (t1 - t0) / 50 * 1e6})
        progress(f"cost scan {od}x{id_} nt={nt}: " + ", ".join(f"{r['variant']} {r['median_us']:.1f}"
                                                            for r in rows[-len(vs):]) + " us")
        if id_ == ablate_id:
            rows += _ablation(w, x16, y, flush, pairs, repeats, {"qtype": "q4_K", "od": od, "id": id_, "nt": nt},
                              progress)
    if run is not None:
        run.append("cost_scan", rows)
    return rows


ABLATIONS = ("LK_ABLATE_NOFIX", "LK_ABLATE_NOSTORE")


def _ablation(w, x16, y, flush, pairs, repeats, key, progress) -> list[dict]:
    from . import bench as B

    spec = registry.find("wgmma_kq", QT=4, BN=256, STAGES=4, BF16=0, SCL=0, EPI=0, AQ=2, PF=0)
    base = variant_name(256, 4, 0, 1)
    ks = {base: kernel(**spec.p)}
    for d in ABLATIONS:
        ks[f"{base}[{d[len('LK_ABLATE_'):]}]"] = WgKernel(spec, defines=(d,))
    ncta, dp_tiles = schedule(1, x16.shape[0], w.od, w.id, 256, _sm_count(_cp().cuda.Device().id))
    tm = tensor_map(x16, 256)
    ws, flags = _WS.get(_cp().cuda.get_current_stream().ptr, _sm_count(_cp().cuda.Device().id) * ks[base].blocks_per_sm)
    vs = {n: (lambda k=k: k.launch((ncta, 1), (tm, NO_MAP), w.packed, y, np.int32(x16.shape[0]), np.int32(w.od),
                                   np.int32(w.id), ws, flags, np.int32(dp_tiles), np.int32(0))) for n, k in ks.items()}
    res = B.interleaved(vs, pairs=pairs, repeats=repeats, flush=flush)
    rows = [{**key, "variant": n, "median_us": float(np.median([r["median_us"] for r in st])),
             "back_to_back_us": float("nan"), "host_enqueue_us": float("nan")} for n, st in res.items()]
    progress("ablation: " + ", ".join(f"{r['variant']} {r['median_us']:.1f}" for r in rows) + " us")
    return rows


#: the phases a -DLK_EXP_TRACE build of the register form stamps per CTA (the experiments source, LK_TRACE): slot i of 15
TRACE_EVENTS = ("entry", "setup", "first_tile",
                *[f"seg{i}_{p}" for i in range(4) for p in ("start", "mma_end", "done")])
TRACE_CTAS = 1024        # LK_TRACE_CTAS
#: the same events in the order a CTA passes them: the first tile arrives inside the first segment's main loop
TRACE_ORDER = ("entry", "setup", "seg0_start", "first_tile", *TRACE_EVENTS[4:])


def trace_rows(ns, clk) -> list[dict]:
    """Rows (cta, smid, event, t_us, cta_us, cycles) from the kernel's trace arrays ``ns`` / ``clk`` [ncta, 16]
    (globaltimer ns / clock64; slot 15 of ``ns`` = the CTA's SM): ``t_us`` from the earliest entry of any CTA,
    ``cta_us`` from the CTA's own entry (globaltimer), ``cycles`` from its own entry (clock64, the SM's clock).
    Slots never written (0) are left out: a CTA with fewer segments stamps fewer events."""
    ns = np.asarray(ns, np.uint64)
    clk = np.asarray(clk, np.uint64)
    if ns.ndim != 2 or ns.shape[1] != len(TRACE_EVENTS) + 1 or clk.shape != ns.shape:
        raise ValueError(f"trace arrays must be [ncta, {len(TRACE_EVENTS) + 1}], got {ns.shape} / {clk.shape}")
    entry = ns[:, 0].astype(np.int64)
    if (entry == 0).any():
        raise WgmmaError(f"{int((entry == 0).sum())} CTA(s) never stamped their entry: not a trace build, or the "
                         "launch did not run")
    t0 = int(entry.min())
    rows = []
    for c in range(ns.shape[0]):
        for e, name in enumerate(TRACE_EVENTS):
            if ns[c, e] == 0:
                continue
            rows.append({"cta": c, "smid": int(ns[c, -1]), "event": name, "t_us": (int(ns[c, e]) - t0) / 1e3,
                         "cta_us": (int(ns[c, e]) - int(entry[c])) / 1e3,
                         "cycles": int(clk[c, e]) - int(clk[c, 0])})
    return rows


def trace_summary(rows):
    """Per event: how many CTAs stamped it, and the median / min / max over CTAs of its time from the launch's first
    entry (``t_us``) and from the CTA's own entry (``cta_us``); the entries' spread is the launch ramp."""
    import pandas as pd

    df = pd.DataFrame(rows)
    order = {e: i for i, e in enumerate(TRACE_ORDER)}
    g = df.groupby("event").agg(ctas=("cta", "nunique"), t_us_median=("t_us", "median"), t_us_min=("t_us", "min"),
                                t_us_max=("t_us", "max"), cta_us_median=("cta_us", "median"),
                                cta_us_max=("cta_us", "max"), cycles_median=("cycles", "median")).reset_index()
    return g.sort_values("event", key=lambda s: s.map(order)).reset_index(drop=True)


def trace_phases(rows, od: int, id_: int, nt: int, sm_count: int | None = None):
    """Per CTA and segment of a traced launch (:func:`trace_rows` rows, several variants allowed): its role in the
    schedule (``owner``: holds the tile's k = 0 and stores it; ``helper``: writes partial sums; ``whole``: the whole
    tile), super-block iterations, and its phases in us: ``fill`` (segment start to the first activation tile, first
    segment only), ``main`` (to the end of the main loop), ``finish`` (the fix-up and the store: partial sums written,
    or the helpers' waited for, folded in and Y stored); ``start_us`` / ``end_us`` from the launch's first entry;
    ``cycles_per_iter`` of the main loop (clock64) and the SM clock ``mhz`` over the CTA's launch (clock64 cycles per
    globaltimer us). ``sm_count``: the SMs the launch was scheduled for (the tile-aligned split's G depends on it;
    None: the traced CTAs, which is the data-parallel and stream-K grids' count)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    out = []
    for v, g in df.groupby("variant"):
        _, p = variant_params(v, "q4_K")
        bn, sk = p["BN"], p["SK"]
        ncta = g.cta.nunique()
        sms = int(sm_count) if sm_count else ncta
        I = id_ // QK
        tiles = tile_count(nt, od, bn)
        nc, dp = schedule(sk, nt, od, id_, bn, sms)
        G = split_g(sk, nt, od, id_, bn, sms)
        if nc != ncta:
            raise WgmmaError(f"{v}: {ncta} CTAs traced, the schedule at nt={nt}, od={od}, id={id_} has {nc}")
        for c, gc in g.groupby("cta"):
            ev = gc.set_index("event")
            segs = segments(ncta, int(c), I, tiles, dp, G)
            mhz = ev.loc["seg0_mma_end", "cycles"] / ev.loc["seg0_mma_end", "cta_us"] if "seg0_mma_end" in ev.index \
                else np.nan
            for si, (tile, klo, khi) in enumerate(segs):
                if f"seg{si}_done" not in ev.index:
                    break
                t0 = ev.loc[f"seg{si}_start"]
                ft = ev.loc["first_tile"] if si == 0 else t0
                me, dn = ev.loc[f"seg{si}_mma_end"], ev.loc[f"seg{si}_done"]
                owns = klo == 0
                role = "whole" if (owns and khi == I) else ("owner" if owns else "helper")
                out.append({"variant": v, "cta": int(c), "seg": si, "tile": tile, "role": role, "iters": khi - klo,
                            "start_us": t0.t_us, "end_us": dn.t_us, "fill_us": ft.cta_us - t0.cta_us,
                            "main_us": me.cta_us - ft.cta_us, "finish_us": dn.cta_us - me.cta_us,
                            "cycles_per_iter": (me.cycles - ft.cycles) / max(1, khi - klo), "mhz": mhz})
    return pd.DataFrame(out)


def trace_roles(trace, sm_count: int | None = None):
    """A recorded trace table (``wgmma_trace``'s ``trace``: several shapes, types and variants) as one row per
    (qtype, od, id, nt, variant, role) of :func:`trace_phases`: how many segments, their median iterations and
    fill / main / finish times (us), the slowest finish, the last segment's end (the stamps' span), the main loop's
    median clock64 cycles per super-block and the SM clock (MHz)."""
    import pandas as pd

    df = pd.DataFrame(trace)
    parts = []
    for (q, od, id_, nt), g in df.groupby(["qtype", "od", "id", "nt"], sort=False):
        ph = trace_phases(g.to_dict("records"), int(od), int(id_), int(nt), sm_count)
        parts.append(ph.assign(qtype=q, od=int(od), id=int(id_), nt=int(nt)))
    ph = pd.concat(parts, ignore_index=True)
    return (ph.groupby(["qtype", "od", "id", "nt", "variant", "role"], sort=False)
              .agg(segments=("cta", "size"), iters=("iters", "median"), fill_us=("fill_us", "median"),
                   main_us=("main_us", "median"), finish_us=("finish_us", "median"),
                   finish_us_max=("finish_us", "max"), end_us_max=("end_us", "max"),
                   cycles_per_iter=("cycles_per_iter", "median"), mhz=("mhz", "median")).reset_index())


def trace_launch(w: WgWeight, x16, BN: int = 128, STAGES: int = 4, SCL: int = 0, SK: int = 0, EPI: int = 0,
                 warmup: int = 2, timed: int = 0, flush=None, kpair: bool = False, defines: tuple = ()):
    """Exploratory: the per-CTA phase stamps (:func:`trace_rows`) of one register-form launch -- any scheduler and
    epilogue form :func:`gemm` takes (EPI=3's 2-CTA clusters included) -- from a ``-DLK_EXP_TRACE`` build (its own
    cubin: the plain build stays as it is), after ``warmup`` launches of it. ``x16``: float16 activations [nt, id].
    ``timed`` > 0: also the median CUDA-event time of that many launches of the trace build, returned as
    ``(rows, median_us)`` (the span of the stamps against the launch's whole time: its ramp and its drain). The trace
    build's timings include the stamps' own cost (a few global stores per CTA). ``flush``: a
    :class:`labkernels.bench.Flusher` run right before the traced launch, so that it starts from a cold L2 as every
    benchmarked launch does (without it the warm-up launches leave the weights and activations in L2). ``kpair``: the
    ``LK_EXP_KPAIR`` build's one launch shape instead (:data:`KPAIR_PARAMS`, :func:`kpair_grid` CTAs; the tile
    arguments are then not read): its stamps are read by :func:`kpair_trace_phases`; ``defines``: with ``kpair``, a
    form of that build instead (e.g. :data:`KPAIR_FIN`), traced with the same stamps."""
    if kpair and defines and "LK_EXP_KPAIR" not in defines:
        raise WgmmaError(f"a KPAIR trace takes a form of the KPAIR build, not {defines}")
    if defines and not kpair:
        raise WgmmaError("trace_launch takes other defines only for a KPAIR trace (kpair=True)")
    cp = _cp()
    qt = 4 if w.qtype == "q4_K" else 6
    nt = x16.shape[0]
    if kpair:
        defines = check_defines(tuple(defines or KPAIR) + ("LK_EXP_TRACE",))
        kw = dict(defines=defines, **KPAIR_PARAMS)
        k = kernel_built(defines, QT=qt, **{n: v for n, v in KPAIR_PARAMS.items() if n != "SK"})
        ncta = kpair_grid(nt, w.od)
    else:
        kw = dict(BN=BN, STAGES=STAGES, SCL=SCL, SK=SK, EPI=EPI, defines=("LK_EXP_TRACE",))
        k = kernel_built(("LK_EXP_TRACE",), QT=qt, BN=BN, STAGES=STAGES, BF16=0, SCL=SCL, EPI=EPI, AQ=2, PF=0)
        ncta, _ = schedule(int(SK), nt, w.od, w.id, BN, _sm_count(cp.cuda.Device().id) * k.blocks_per_sm)
    if ncta > TRACE_CTAS:
        raise WgmmaError(f"the trace build stamps {TRACE_CTAS} CTAs, this launch has {ncta}")
    n = TRACE_CTAS * (len(TRACE_EVENTS) + 1)
    ns = cp.ndarray((n,), cp.uint64, memptr=k.module.get_global("lk_trace_ns"))
    clk = cp.ndarray((n,), cp.uint64, memptr=k.module.get_global("lk_trace_clk"))
    y = cp.empty((nt, w.od), cp.float32)
    for _ in range(warmup):
        gemm(w, x16, out=y, **kw)
    ns.fill(0)
    clk.fill(0)
    if flush is not None:
        flush()
    gemm(w, x16, out=y, **kw)
    cp.cuda.get_current_stream().synchronize()
    shape = (TRACE_CTAS, len(TRACE_EVENTS) + 1)
    rows = trace_rows(cp.asnumpy(ns).reshape(shape)[:ncta], cp.asnumpy(clk).reshape(shape)[:ncta])
    if not timed:
        return rows
    ts = []
    for _ in range(int(timed)):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        gemm(w, x16, out=y, **kw)
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
    return rows, float(np.median(ts))


#: the KPAIR body's trace slots by meaning: its one segment starts at the setup stamp (a stamp of its own made q6_K's
#: consumers spill); slot 6, "seg1_start" in the plain body's naming, is its exit barrier passed
KPAIR_TRACE = {"entry": "entry", "setup": "setup", "first_tile": "first_tile", "mma_end": "seg0_mma_end",
               "done": "seg0_done", "exit": "seg1_start"}


def _trace_pivots(df):
    """A traced launch's stamps (:func:`trace_rows` rows) as three [cta x event] tables: us from the CTA's entry,
    clock64 cycles from its entry, and us from the launch's first entry."""
    return tuple(df.pivot_table(index="cta", columns="event", values=v, aggfunc="first")
                 for v in ("cta_us", "cycles", "t_us"))


def kpair_trace_phases(rows, id_: int):
    """Per CTA of a traced ``LK_EXP_KPAIR`` launch (:func:`trace_launch` with ``kpair``; warpgroup 1's first thread
    stamps): ``setup_us`` (entry to the setup stamp: barriers, cluster sync -- the consumers start right after it),
    ``fill_us`` (from there to its first activation stage landed), ``main_us`` (to the end of its main loop, the fill
    included), ``finish_us`` (the two warpgroups' exchange of partial sums and its Y stores), ``exit_us`` (waiting at
    the cluster's exit barrier), ``end_us`` (the exit from the launch's first entry), ``cycles_per_iter`` (clock64 cycles of the main loop per super-block of the warpgroup:
    ceil(id / 512) of them), ``loop_cycles_per_iter`` (the same from its first activation stage on: the fill left out)
    and ``mhz`` (clock64 cycles per globaltimer us over the CTA). A CTA without every stamp raises."""
    import pandas as pd

    need = list(KPAIR_TRACE.values())
    us, cyc, t = _trace_pivots(pd.DataFrame(rows))
    miss = [e for e in need if e not in us.columns or us[e].isna().any()]
    if miss:
        raise WgmmaError(f"a KPAIR trace without every stamp: {miss} missing (not a KPAIR trace build?)")
    e = KPAIR_TRACE
    iters = -(-(int(id_) // QK) // 2)
    out = pd.DataFrame({"cta": us.index, "setup_us": us[e["setup"]] - us[e["entry"]],
                        "fill_us": us[e["first_tile"]] - us[e["setup"]],
                        "main_us": us[e["mma_end"]] - us[e["setup"]],
                        "finish_us": us[e["done"]] - us[e["mma_end"]],
                        "exit_us": us[e["exit"]] - us[e["done"]], "end_us": t[e["exit"]],
                        "cycles_per_iter": (cyc[e["mma_end"]] - cyc[e["setup"]]) / iters,
                        "loop_cycles_per_iter": (cyc[e["mma_end"]] - cyc[e["first_tile"]]) / iters,
                        "mhz": cyc[e["exit"]] / us[e["exit"]]})
    return out.reset_index(drop=True)


def kpair_trace_table(run):
    """The twenty-fifth step's trace run as one row per (L2 state, qtype, od, id, build): the KPAIR build (tables
    ``kpair_trace[_flushed]``, :func:`kpair_trace_phases`) and the BN=128 data-parallel launch (``bn128_trace[_flushed]``)
    on the same phases, medians over CTAs: ``to_first_tile_us`` (entry to the first activation stage: setup, register
    hand-over, the first loads), ``loop_us`` (from there to the main loop's end) and its clock64 cycles per iteration
    beside the tensor pipe's (``pipe_cycles``: 2,048 per BN=128 super-block; 4,096 per KPAIR warpgroup super-block, the
    two warpgroups sharing the pipe), ``finish_us`` (the exchange and stores), ``exit_us`` (KPAIR's cluster exit
    barrier; blank for BN=128), ``end_us_max`` (the launch's last stamp from its first entry) and the SM clock."""
    import pandas as pd

    rows = []
    for state, sfx in (("warm", ""), ("cold", "_flushed")):
        for build, tab in (("KPAIR 64 x 256", "kpair_trace"), ("BN=128 data-parallel", "bn128_trace")):
            if not run.has(tab + sfx):
                continue
            d = run.table(tab + sfx)
            for (q, od, id_), g in d.groupby(["qtype", "od", "id"], sort=False):
                if build.startswith("KPAIR"):
                    ph = kpair_trace_phases(g.to_dict("records"), int(id_))
                    m = ph.median()
                    r = {"to_first_tile_us": m.setup_us + m.fill_us, "loop_us": m.main_us - m.fill_us,
                         "loop_cycles_per_iter": m.loop_cycles_per_iter, "pipe_cycles": 2 * MACS_PER_CLK,
                         "finish_us": m.finish_us, "exit_us": m.exit_us, "end_us_max": ph.end_us.max(), "mhz": m.mhz}
                else:
                    us, cyc, t = _trace_pivots(g)
                    nsb = int(id_) // QK
                    r = {"to_first_tile_us": us.first_tile.median(),
                         "loop_us": (us.seg0_mma_end - us.first_tile).median(),
                         "loop_cycles_per_iter": ((cyc.seg0_mma_end - cyc.first_tile) / nsb).median(),
                         "pipe_cycles": MACS_PER_CLK, "finish_us": (us.seg0_done - us.seg0_mma_end).median(),
                         "exit_us": np.nan, "end_us_max": t.seg0_done.max(),
                         "mhz": (cyc.seg0_done / us.seg0_done).median()}
                rows.append({"L2": state, "qtype": q, "od": int(od), "id": int(id_), "build": build, **r,
                             "loop_over_pipe": r["loop_cycles_per_iter"] / r["pipe_cycles"]})
    return pd.DataFrame(rows)


def early_table(run):
    """The twenty-seventh step's run (the FIN form with its cold start's L2 requests moved -- LK_EXP_KPAIR_EARLY,
    _OVERLAP, retired -- against :data:`KPAIR_FIN`): per traced build (its
    variant), qtype and shape, the cold-L2 phases (``kpair_trace_flushed``, :func:`kpair_trace_phases`) as medians over
    CTAs -- ``setup_us``, ``fill_us``, ``to_first_tile_us`` (their sum), ``loop_us`` (the main loop from the first
    stage), ``finish_us``, ``exit_us`` -- and ``end_us_max`` (the launch's last stamp from its first entry), each the
    median over the run's traced launches (``rep``; one launch without it). A run without the table gives an empty
    frame."""
    import pandas as pd

    if not run.has("kpair_trace_flushed"):
        return pd.DataFrame()
    t = run.table("kpair_trace_flushed")
    if "rep" not in t.columns:
        t = t.assign(rep=0)
    key = ["variant", "qtype", "od", "id"]
    rows = []
    for k, g in t.groupby(key + ["rep"]):
        ph = kpair_trace_phases(g.to_dict("records"), k[3])
        m = ph.median()
        rows.append({**dict(zip(key, k[:4])), "setup_us": m.setup_us, "fill_us": m.fill_us,
                     "to_first_tile_us": (ph.setup_us + ph.fill_us).median(),
                     "loop_us": (ph.main_us - ph.fill_us).median(), "finish_us": m.finish_us, "exit_us": m.exit_us,
                     "end_us_max": ph.end_us.max()})
    out = pd.DataFrame(rows).groupby(key, sort=False).median().reset_index()
    return out.assign(launches=pd.DataFrame(rows).groupby(key, sort=False).size().values)


def cost_fit(scan_df):
    """Per variant: time = intercept + slope x id (least squares over the scan), and the host enqueue time."""
    import pandas as pd

    out = []
    scan_df = scan_df[~scan_df.variant.str.contains(r"\[", regex=True)]   # the ablation rows are one k only
    for v, g in scan_df.groupby("variant"):
        slope, icpt = np.polyfit(g["id"].to_numpy(float), g.median_us.to_numpy(float), 1)
        out.append({"variant": v, "intercept_us": icpt, "ns_per_k": slope * 1e3,
                    "host_enqueue_us": float(g.host_enqueue_us.median()),
                    "back_to_back_us_at_min_id": float(g.sort_values("id").back_to_back_us.iloc[0])})
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------- the epilogue A/B

#: the epilogue-form and tile-aligned-split experiment (``gpu-check --steps wgmma_epi``): the one-segment-per-CTA
#: schedulers (SK 0, 2, 3) with the plain epilogue and the new forms, and the stream-K launches (plain only) that
#: the benchmark of record found best at some nt <= 1024 -- tuples (BN, STAGES, SCL or None, SK, FORM, EPI)
EPI_AB = {"shapes": [list(s) for s in SHAPES], "nts": [256, 512, 1024], "qtypes": ["q4_K", "q6_K"],
          "variants": [[256, 4, None, 2, 0, e] for e in (0, 1, 2)] + [[256, 4, None, 3, 0, e] for e in (0, 1, 2)]
          + [[128, 4, None, 0, 0, e] for e in (0, 2)] + [[256, 4, None, 0, 0, e] for e in (0, 2)]
          + [[256, 4, None, 1, 0, 0], [128, 4, None, 1, 0, 0]],     # stream-K (the plain epilogue only)
          "pairs": 3, "repeats": 10}


def option_ab(run, defaults: dict, table: str, forms, plan=None, progress=print, seed: int = 0) -> None:
    """One build-option A/B into ``run``: the real-model gates of the forms it adds (the :data:`REAL_MODEL_FORMS`
    where ``forms(f)``) on every Gemma tensor, then the plan (``defaults`` updated by ``plan``) interleaved per point
    with cuBLAS by :func:`bench` into its own ``table`` (``auto`` keeps reading the benchmark of record)."""
    p = {**defaults, **(plan or {})}
    rng = np.random.default_rng(seed or None)
    new = tuple(f for f in REAL_MODEL_FORMS if forms(f))
    run.append("real_model_parity", real_model_rows(rng, progress, forms=new))
    bench([tuple(s) for s in p["shapes"]], p["nts"], p["qtypes"], [tuple(v) for v in p["variants"]],
          pairs=p["pairs"], repeats=p["repeats"], run=run, progress=progress, table=table)


def epi_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """The epilogue forms (EPI 1 / 2) and the tile-aligned split (SK=3) against the plain launches and cuBLAS,
    interleaved per point (:func:`bench`, its own table ``wgmma_epi_ab``: ``auto`` keeps reading the benchmark of
    record), after the real-model gates of the new forms on every Gemma tensor."""
    option_ab(run, EPI_AB, "wgmma_epi_ab", lambda f: f[1] == 3 or f[3], plan, progress, seed)


# ------------------------------------------------------------------------------------- the A-fragment-set A/B

#: the four-A-set experiment (``gpu-check --steps wgmma_aq``): BN=128 with AQ 2 and 4 under the data-parallel,
#: stream-K and tile-aligned split grids, beside BN=256's best nt=512 schedulers and cuBLAS -- tuples (BN, STAGES,
#: SCL or None, SK, FORM, EPI, AQ)
AQ_AB = {"shapes": [list(s) for s in SHAPES], "nts": [256, 512, 1024], "qtypes": ["q4_K", "q6_K"],
         "variants": [[128, 4, None, sk, 0, 0, aq] for sk in (0, 1, 3) for aq in (2, 4)]
         + [[256, 4, None, 1], [256, 4, None, 3]],
         "pairs": 3, "repeats": 10}


def aq_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """AQ=4 against AQ=2 (and BN=256's nt=512 schedulers, cuBLAS), interleaved per point (:func:`bench`, its own
    table ``wgmma_aq_ab``: ``auto`` keeps reading the benchmark of record), after the real-model gates of the AQ=4
    forms on every Gemma tensor."""
    option_ab(run, AQ_AB, "wgmma_aq_ab", lambda f: len(f) > 4 and f[4] != 2, plan, progress, seed)


# ------------------------------------------------------------------------------------------- the L2-prefetch A/B

#: the L2-prefetch experiment (``gpu-check --steps wgmma_pf``; ncu run 20261202T005336Z: q6_K's consumers stall on
#: their weight loads, 1.4-2.0 warps per issued instruction in long_scoreboard): PF 0 / 1 / 2 on the nt=512 and
#: nt=4096 launches of record -- tuples (BN, STAGES, SCL or None, SK, FORM, EPI, AQ, PF)
PF_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
         "variants": [[256, 4, None, 3, 0, 0, 2, p] for p in (0, 1, 2)] + [[256, 4, None, 0, 0, 0, 2, p] for p in (0, 1, 2)]
         + [[128, 4, None, 0, 0, 0, 2, p] for p in (0, 1, 2)] + [[128, 4, None, 3, 0, 0, 2, p] for p in (0, 2)]
         + [[256, 4, None, 1]],
         "pairs": 3, "repeats": 10}


def pf_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """The L2 prefetch (PF 1 / 2) against none, interleaved per point with cuBLAS (:func:`bench`, its own table
    ``wgmma_pf_ab``), after the real-model gates of the PF forms on every Gemma tensor."""
    option_ab(run, PF_AB, "wgmma_pf_ab", lambda f: len(f) > 5 and f[5], plan, progress, seed)


# ------------------------------------------------------------------------------------------- the pair-exchange A/B

#: the pair exchange (``gpu-check --steps wgmma_pair``): EPI=3 on the tile-aligned split (SK=3) where it gives two
#: CTAs per tile, against the plain epilogue on the same grid, stream-K and cuBLAS -- tuples as in :data:`PLAN`
PAIR_AB = {"shapes": [list(s) for s in SHAPES], "nts": [256, 512, 1024], "qtypes": ["q4_K", "q6_K"],
           "variants": [[256, 4, None, 3, 0, e] for e in (0, 3)] + [[128, 4, None, 3, 0, e] for e in (0, 3)]
           + [[256, 4, None, 1], [128, 4, None, 1]],
           "pairs": 3, "repeats": 10}


def pair_fits(nt: int, od: int, id_: int, BN: int, sm_count: int) -> bool:
    """Whether EPI=3 takes this shape: SK=3 gives exactly two CTAs per tile (its 2-CTA clusters)."""
    return split_g(3, nt, od, id_, BN, sm_count) == 2


def pair_nt(od: int, id_: int, BN: int, sm_count: int, tail: int = 27, limit: int = 64) -> int | None:
    """The fewest tokens, one token tile short by ``tail`` (a tail in nt), at which EPI=3 takes od x id; None if no
    nt up to ``limit`` token tiles does. The real-model gates run EPI=3 there: at their 37 tokens the split grid gives
    a Gemma tensor's few tiles more than two CTAs each, which EPI=3 refuses."""
    for m in range(1, limit + 1):
        if pair_fits(m * BN - tail, od, id_, BN, sm_count):
            return m * BN - tail
    return None


def pair_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """EPI=3 against the plain epilogue on SK=3's grid, stream-K and cuBLAS, interleaved per point (:func:`bench`,
    its own table ``wgmma_pair_ab``; a point where SK=3 does not give two CTAs per tile is recorded as not
    applicable), after the real-model gates of the EPI=3 forms."""
    occ = [{"kernel": k.key, "cluster": 2, "max_active_clusters": kernel(k.family, **k.p).max_active_clusters(2)}
           for k in registry.family("wgmma_kq") if k.p["EPI"] == 3]
    run.append("cluster_occupancy", occ)
    progress("2-CTA clusters resident at once: " + ", ".join(f"{o['kernel']} {o['max_active_clusters']}" for o in occ))
    option_ab(run, PAIR_AB, "wgmma_pair_ab", lambda f: f[3] == 3, plan, progress, seed)


# --------------------------------------------------------------------------------------------- the staged-store A/B

#: the staged TMA store (``gpu-check --steps wgmma_staged``): EPI=4 against the plain epilogue on the same grid --
#: data-parallel and stream-K at BN=256 (nt=4096's launches of record, ~10 tiles per CTA), BN=128 data-parallel and
#: SK=3 (nt=512's), beside cuBLAS -- tuples as in :data:`PLAN`
STAGED_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 2048, 4096], "qtypes": ["q4_K", "q6_K"],
             "variants": [[256, 4, None, sk, 0, e] for sk in (0, 1) for e in (0, 4)]
             + [[128, 4, None, 0, 0, e] for e in (0, 4)] + [[256, 4, None, 3, 0, e] for e in (0, 4)],
             "pairs": 3, "repeats": 10}


def staged_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """EPI=4 against the plain epilogue, interleaved per point with cuBLAS (:func:`bench`, its own table
    ``wgmma_staged_ab``), after the real-model gates of the EPI=4 forms on every Gemma tensor."""
    option_ab(run, STAGED_AB, "wgmma_staged_ab", lambda f: f[3] == 4, plan, progress, seed)


# ------------------------------------------------------------------------------------------- the reduce-finish A/B

#: the reduce finish (``gpu-check --steps wgmma_reduce``; trace run 20261202T190840Z: on the nt=512 split grids the
#: owner's finish -- the helper's partial sums through the workspace, its flag, the fold, the store -- takes 4.7-7.0
#: us of a ~30 us launch): EPI=5 against EPI=0 and EPI=4 on the same grids (the tile-aligned split and stream-K at
#: both tiles; EPI=3 where it pairs), beside BN=128 data-parallel and cuBLAS, at the bar's nt=512 and at nt=4096 --
#: tuples as in :data:`PLAN`; a point whose grid puts three CTAs on a tile is recorded as not applicable
REDUCE_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
             "variants": [[256, 4, None, 3, 0, e] for e in (0, 3, 4, 5)] + [[256, 4, None, 1, 0, e] for e in (0, 4, 5)]
             + [[128, 4, None, 1, 0, e] for e in (0, 4, 5)] + [[128, 4, None, 0]],
             "pairs": 3, "repeats": 10}


def reduce_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """EPI=5 against the plain and staged epilogues on the same grids, interleaved per point with cuBLAS
    (:func:`bench`, its own table ``wgmma_reduce_ab``), after the real-model gates of the EPI=5 forms on every Gemma
    tensor."""
    option_ab(run, REDUCE_AB, "wgmma_reduce_ab", lambda f: f[3] == 5, plan, progress, seed)


# ------------------------------------------------------------------------------------- the timing method A/B

#: the timing A/B (``gpu-check --steps wgmma_lead``): every call of the launches of record and of cuBLAS timed as the
#: benchmark times it (events right after the flush) and behind a 500 us GPU wait (:class:`labkernels.bench.Lead`),
#: call by call, with each call's host time -- does the host path of ``gemm()`` outlast the flush, so that the GPU
#: waits inside the timed interval? Tuples as in :data:`PLAN`.
LEAD_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
           "variants": [[256, 4, None, 3, 0, 5], [256, 4, None, 1, 0, 5], [128, 4, None, 1, 0, 0],
                        [128, 4, None, 0], [256, 4, None, 0]],
           "leads_us": [500], "pairs": 3, "repeats": 10}


def lead_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """The timing A/B of :data:`LEAD_AB` into ``run`` (table ``wgmma_lead_ab``; no kernel is new, so no real-model
    gates beyond :func:`bench`'s own per point)."""
    p = {**LEAD_AB, **(plan or {})}
    bench([tuple(s) for s in p["shapes"]], p["nts"], p["qtypes"], [tuple(v) for v in p["variants"]],
          pairs=p["pairs"], repeats=p["repeats"], run=run, progress=progress, table="wgmma_lead_ab",
          leads_us=tuple(p["leads_us"]), int8=False, seed=seed)


# ------------------------------------------------------------------------------------- the two-converter A/B

#: two converter warpgroups for the shared-memory form (``gpu-check --steps wgmma_conv2``): FORM=2 against FORM=1
#: (one converter) at BN=128 under both schedulers, beside the register form's launches and cuBLAS (q4_K) --
#: tuples as in :data:`PLAN`
CONV2_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K"],
            "variants": [[128, 4, None, sk, f] for sk in (0, 1) for f in (1, 2)]
            + [[128, 4, None, 0], [256, 4, None, 0], [256, 4, None, 1], [256, 4, None, 3]],
            "pairs": 3, "repeats": 10}


def conv2_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """FORM=2 against FORM=1 and the register form, interleaved per point with cuBLAS (:func:`bench`, its own table
    ``wgmma_conv2_ab``), after the real-model gates of the FORM=2 forms on every Gemma q4_K tensor."""
    option_ab(run, CONV2_AB, "wgmma_conv2_ab", lambda f: f[2] == 2, plan, progress, seed)


def _plan_points(p: dict, rng):
    """The points of an A/B plan ``p`` (its qtypes x shapes x nts), in order: yields (qtype, od, id_, nt, pt), ``pt``
    a namespace of the point's synthetic weight (``raw``, ``w`` repacked, ``wq`` the GGUF upload, ``w16`` cuBLAS's
    fp16 copy, ``w64`` gguf-py's float64 dequantization, ``w16e`` the kernel's exact weights) and its fresh inputs
    (``x``, ``xg``, ``x16``, ``y``, ``tok``: :func:`labkernels.cases.point_inputs`)."""
    from types import SimpleNamespace

    import gguf

    from . import cases
    cp = _cp()
    for qtype in p["qtypes"]:
        for od, id_ in (tuple(s) for s in p["shapes"]):
            raw = cases.synthetic_weights(qtype, od, id_, rng)
            w = WgWeight.from_gguf(raw, qtype)
            wq = gpu.QWeight.upload(raw, qtype)
            wts = dict(raw=raw, w=w, wq=wq, w16=gpu.dequant_f16(wq),
                       w64=gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype.upper()]),
                       w16e=emulate_weights(cp.asnumpy(w.packed), qtype, od, id_))
            for nt in p["nts"]:
                x, xg, x16, y, tok = cases.point_inputs(rng, nt, od, id_)
                yield qtype, od, id_, nt, SimpleNamespace(**wts, x=x, xg=xg, x16=x16, y=y, tok=tok)


def _plan_launches(p: dict, qtype: str, nt: int, od: int, id_: int, sm: int):
    """The plan's register-form launches (BN, scheduler[, EPI]; the main scale form) that the grid takes at a point:
    (variant name, :func:`gemm` parameters). Left out: a split grid that does not fit, BN=256 data-parallel at
    nt <= 512 (one tile per two SMs: not a launch of record), EPI=5 on a grid with more than two CTAs a tile."""
    for bn, sk, epi in ((tuple(v) + (0,))[:3] for v in p["launches"]):
        if sk in (2, 3) and not sk_fits(sk, nt, od, id_, bn, sm):
            continue
        if sk == 0 and bn == 256 and nt <= 512:
            continue
        if epi == 5 and not reduce_fits(sk, nt, od, id_, bn, sm):
            continue
        prm = dict(BN=bn, SCL=main_scl(qtype, bn), SK=sk, EPI=epi)
        yield variant_name(bn, 4, prm["SCL"], sk, 0, epi), prm


def _gate_point(run, table: str, qtype: str, od: int, id_: int, nt: int, name: str, pt, extra: dict | None = None):
    """:func:`gate` of the launch's Y now in ``pt.y`` against the point's references; the row (with ``extra``) into
    ``run`` table ``table``; a failed gate raises."""
    cp = _cp()
    g = gate(cp.asnumpy(pt.y), pt.raw, qtype, pt.x, tokens=pt.tok, w64=pt.w64, w16=pt.w16e)
    if run is not None:
        run.append(table, {"qtype": qtype, "od": od, "id": id_, "nt": nt, "variant": name, **(extra or {}), **g})
    if not g["ok"]:
        raise AssertionError(f"{name} parity failed: {qtype} nt={nt} od={od} id={id_}: {g}")


def builds_ab(run, p: dict, builds: dict, name: str, rng, bitwise: bool, progress=print,
              extra: dict | None = None, per_point=None) -> list[dict]:
    """Builds of the register form against the plain one, on the plan ``p``'s launches (BN, scheduler[, EPI]; the
    main scale form) at its (qtype, shape, nt) points, same process, interleaved with cuBLAS fp16 on cached
    dequantized weights, L2 flushed. ``builds``: variant suffix -> build defines. Every plain launch is gated first
    at its point (NaN-poisoned output, :func:`gate`; a failure raises). ``bitwise``: each build's Y must be bitwise
    the plain build's (twice; else it raises) -- otherwise the builds are ablations, timed only (their Y means
    nothing). A launch whose grid does not take the scheduler or the epilogue at a point is left out there
    (:func:`_plan_launches`). ``extra``: name -> callable, timed beside them at every point (e.g.
    :class:`labkernels.bench.EmptyLaunch`); ``per_point``: a function of the point's namespace (see
    :func:`_plan_points`) giving more such name -> callable, made at each point (e.g. another cuBLAS call on its
    operands).
    Rows: ``wgmma_<name>_ab`` (a build's variant named ``<variant><suffix>``) and ``wgmma_<name>_gate``."""
    from . import bench as B

    cp = _cp()
    flush = B.Flusher()
    sm = _sm_count(cp.cuda.Device().id)
    rows = []
    for qtype, od, id_, nt, pt in _plan_points(p, rng):
        w, x16, y = pt.w, pt.x16, pt.y
        y_b = cp.empty_like(y)
        vs = {}
        for vname, prm in _plan_launches(p, qtype, nt, od, id_, sm):
            same = {}
            for _ in range(2 if bitwise else 1):   # bitwise: both builds launched twice, each pair compared
                y.fill(np.nan)
                gemm(w, x16, out=y, **prm)
                for sfx, d in builds.items():
                    y_b.fill(np.nan)
                    gemm(w, x16, out=y_b, defines=d, **prm)
                    if bitwise:
                        same[sfx] = bool(cp.array_equal(y.view(cp.uint32), y_b.view(cp.uint32)))
                        if not same[sfx]:
                            raise AssertionError(f"{vname}{sfx} differs from the plain build at {qtype} "
                                                 f"{od}x{id_} nt={nt}")
            _gate_point(run, f"wgmma_{name}_gate", qtype, od, id_, nt, vname, pt,
                        {f"bitwise_vs{k}": v for k, v in same.items()})
            vs[vname] = lambda prm=prm: gemm(w, x16, out=y, **prm)
            for sfx, d in builds.items():
                vs[vname + sfx] = lambda prm=prm, d=d: gemm(w, x16, out=y_b, defines=d, **prm)
        vs.update(extra or {})
        vs.update(per_point(pt) if per_point is not None else {})
        rows += _time_with_cublas(run, name, vs, (qtype, od, id_, nt), pt, p, flush, progress)
    return rows


def conv16_table(ab_df):
    """The 16-bit scale path's A/B as one row per (point, launch): new / old speed (median(old) / median(new) over
    the interleaved pairs: > 1, the new conversion is faster) and each build's ratio to cuBLAS fp16 (cached)."""
    t = suffix_ab(ab_df, suffixes=("_oldconv",))
    if t.empty:
        return t
    return (t.assign(new_over_old=1 / t.speedup, new_vs_cublas=t.base_vs_cublas, old_vs_cublas=t.option_vs_cublas)
            [["qtype", "od", "id", "nt", "launch", "base", "new_over_old", "new_vs_cublas", "old_vs_cublas"]]
            .rename(columns={"base": "variant"}).sort_values(["qtype", "od", "id", "nt", "launch"])
            .reset_index(drop=True))


#: the weights' share of the loop (``gpu-check --steps wgmma_ceiling``): the plain launches of record against two
#: ablation builds of themselves, timed only -- LK_ABLATE_NOLOAD (the conversion of the same registers at every
#: super-block, no weight loads in the loop) and LK_ABLATE_NOCONV (no conversion; ptxas then drops the loads as
#: dead): the skeleton's ceiling (TMA ring, wgmma, scheduler, finish) and what the loads and the conversion cost
CEILING_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
              "launches": [[128, 0], [256, 1], [256, 3], [256, 0]], "pairs": 3, "repeats": 10}
CEILING_BUILDS = {"_noload": ("LK_ABLATE_NOLOAD",), "_noconv": ("LK_ABLATE_NOCONV",)}


def ceiling_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """:func:`builds_ab` of the plain launches against their NOLOAD and NOCONV ablation builds (timing only; each
    plain launch parity-gated at its point). Rows: ``wgmma_ceiling_ab``, ``wgmma_ceiling_gate``."""
    p = {**CEILING_AB, **(plan or {})}
    return builds_ab(run, p, CEILING_BUILDS, "ceiling", np.random.default_rng(seed or None), bitwise=False,
                     progress=progress)


#: the launch floor (``gpu-check --steps wgmma_floor``): the launches of record at nt=512 -- (BN, scheduler, EPI) --
#: against an empty build of themselves (LK_ABLATE_EMPTY: the same grid, threads, dynamic shared memory and
#: parameters; every CTA returns at once), timed only, beside cuBLAS and a 1-CTA empty kernel (the events' own floor)
FLOOR_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512], "qtypes": ["q4_K", "q6_K"],
            "launches": [[256, 3, 5], [256, 1, 5], [128, 1, 0], [128, 0, 0]], "pairs": 3, "repeats": 10}
FLOOR_BUILDS = {"_empty": ("LK_ABLATE_EMPTY",)}
EMPTY_1CTA = "empty_kernel_1cta"


def floor_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """:func:`builds_ab` of the launches of record against their empty builds (timing only; each plain launch
    parity-gated at its point), with a 1-CTA empty kernel timed beside them (:data:`EMPTY_1CTA`). Rows:
    ``wgmma_floor_ab`` (``<variant>_empty``), ``wgmma_floor_gate``."""
    from . import bench as B

    p = {**FLOOR_AB, **(plan or {})}
    return builds_ab(run, p, FLOOR_BUILDS, "floor", np.random.default_rng(seed or None), bitwise=False,
                     progress=progress, extra={EMPTY_1CTA: B.EmptyLaunch(1, 32)})


def floor_view(ab_df, spans=None):
    """The launch floor per (point, launch of record): the plain launch's median time, its empty build's (the same
    launch doing nothing), what the launch spends above that floor, cuBLAS fp16 (cached) and the 1-CTA empty
    kernel, all medians over the interleaved rounds of each one's medians; ``ratio`` = cuBLAS / plain. ``spans``: a
    trace's per-launch stamp spans (columns qtype, od, id, nt, variant, span_us, e.g. :func:`trace_spans`) to add
    ``outside_us`` = plain - span (the time outside the CTAs' stamps) and ``drain_us`` = outside - empty (what of it
    the floor does not explain: after the last stamp, the stores and reduce-adds draining and the exit)."""
    import pandas as pd

    med = ab_df.groupby(["qtype", "od", "id", "nt", "variant"], as_index=False).median_us.median()
    rows = []
    for (q, od, id_, nt), g in med.groupby(["qtype", "od", "id", "nt"], sort=False):
        us = dict(zip(g.variant, g.median_us))
        for v in [v for v in g.variant if v.startswith("wgmma_bn") and not v.endswith("_empty")]:
            e = us.get(v + "_empty")
            if e is None:
                continue
            rows.append({"qtype": q, "od": od, "id": id_, "nt": nt, "variant": v, "plain_us": us[v], "empty_us": e,
                         "above_floor_us": us[v] - e, "cublas_us": us.get("cublas_f16_cached", np.nan),
                         "empty_1cta_us": us.get(EMPTY_1CTA, np.nan)})
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    t["ratio"] = t.cublas_us / t.plain_us
    if spans is not None and len(spans):
        t = t.merge(spans[["qtype", "od", "id", "nt", "variant", "span_us"]], how="left",
                    on=["qtype", "od", "id", "nt", "variant"])
        t["outside_us"] = t.plain_us - t.span_us
        t["drain_us"] = t.outside_us - t.empty_us
    return t


#: the SM clock during the launches of record and cuBLAS at nt=512 (``gpu-check --steps wgmma_clock``):
#: :class:`labkernels.bench.ClockProbe` beside every launch, after the flush, interleaved round by round
CLOCK_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512], "qtypes": ["q4_K", "q6_K"],
            "launches": [[256, 3, 5], [256, 1, 5], [128, 0, 0]], "pairs": 3, "repeats": 10, "window_us": 12.0}


def clock_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """The SM clock (MHz) over a 12 us window inside each launch: the launches of record that the grid takes at
    each point (each parity-gated first), cuBLAS fp16 (cached) and the probe alone, round by round after the L2
    flush, with each one's CUDA-event time in the same round. Rows: ``wgmma_clock`` (variant, round, mhz_median,
    mhz_mean, median_us) and ``wgmma_clock_gate``."""
    from . import bench as B
    p = {**CLOCK_AB, **(plan or {})}
    cp = _cp()
    flush = B.Flusher()
    probe = B.ClockProbe(p["window_us"])
    sm = _sm_count(cp.cuda.Device().id)
    rows = []
    for qtype, od, id_, nt, pt in _plan_points(p, np.random.default_rng(seed or None)):
        vs = {}
        for name, prm in _plan_launches(p, qtype, nt, od, id_, sm):
            pt.y.fill(np.nan)
            gemm(pt.w, pt.x16, out=pt.y, **prm)
            _gate_point(run, "wgmma_clock_gate", qtype, od, id_, nt, name, pt)
            vs[name] = lambda prm=prm: gemm(pt.w, pt.x16, out=pt.y, **prm)
        y16 = cp.empty((nt, od), cp.float16)
        vs["cublas_f16_cached"] = lambda: gpu.matmul_f16(pt.x16, pt.w16, out=y16)
        vs["probe_alone"] = None
        new = []
        for rnd in range(p["pairs"]):
            for name, fn in vs.items():
                mhz = probe.mhz(fn, flush, repeats=p["repeats"])
                us = (float(np.median(B.time_launches(fn, 2, p["repeats"], flush))) if fn is not None
                      else float("nan"))
                new.append({"qtype": qtype, "od": od, "id": id_, "nt": nt, "variant": name, "round": rnd,
                            "mhz_median": float(np.median(mhz)), "mhz_mean": float(np.mean(mhz)),
                            "median_us": us, "window_us": p["window_us"]})
        rows += new
        if run is not None:
            run.append("wgmma_clock", new)
        med = {}
        for r in new:
            med.setdefault(r["variant"], []).append(r["mhz_median"])
        progress(f"clock {qtype} {od}x{id_} nt={nt}: " + ", ".join(f"{k} {np.median(v):.0f} MHz"
                                                                   for k, v in med.items()))
    return rows


def clock_view(clock_df):
    """Per point and launch: the median over rounds of the SM clock during it (MHz) and of its time, the clock
    against cuBLAS's at the same point, and its time in cycles at that clock (us x MHz: what it would take at
    any one clock)."""
    import pandas as pd

    m = clock_df.groupby(["qtype", "od", "id", "nt", "variant"], as_index=False, sort=False).agg(
        mhz=("mhz_median", "median"), us=("median_us", "median"))
    rows = []
    for _, g in m.groupby(["qtype", "od", "id", "nt"], sort=False):
        cb = g[g.variant == "cublas_f16_cached"].iloc[0]
        idle = g[g.variant == "probe_alone"]
        for _, r in g[g.variant != "probe_alone"].iterrows():
            rows.append({**r.to_dict(), "idle_mhz": float(idle.mhz.iloc[0]) if len(idle) else np.nan,
                         "mhz_vs_cublas": r.mhz / cb.mhz, "kcycles": r.us * r.mhz / 1e3,
                         "ratio": cb.us / r.us, "ratio_in_cycles": (cb.us * cb.mhz) / (r.us * r.mhz)})
    return pd.DataFrame(rows)


def trace_cold(run):
    """A trace run's launches warm (table ``trace``: after warm-up launches) against the same launches from a flushed
    L2 (``trace_flushed``), per role (:func:`trace_roles`): medians of fill, main loop and cycles per super-block
    both ways, and each launch's stamp span both ways."""
    sm = run.meta["params"]["sm_count"]
    keys = ["qtype", "od", "id", "nt", "variant", "role"]
    cols = ["fill_us", "main_us", "cycles_per_iter"]
    warm, cold = (trace_roles(run.table(t), sm)[keys + cols] for t in ("trace", "trace_flushed"))
    m = warm.merge(cold, on=keys, suffixes=("_warm", "_cold"))
    sp = trace_spans(run.table("trace")).merge(trace_spans(run.table("trace_flushed")),
                                               on=keys[:-1], suffixes=("_warm", "_cold"))
    m = m.merge(sp, on=keys[:-1])
    m["cycles_cold_over_warm"] = m.cycles_per_iter_cold / m.cycles_per_iter_warm
    return m


def trace_spans(trace_df):
    """Per traced launch (qtype, od, id, nt, variant): the span of its CTAs' stamps, first to last (us)."""
    g = trace_df.groupby(["qtype", "od", "id", "nt", "variant"], as_index=False).t_us
    return g.agg(lambda s: s.max() - s.min()).rename(columns={"t_us": "span_us"})


#: the k scan (``gpu-check --steps wgmma_kscan``): the launches of record at nt=512 and od=4096 over id, cuBLAS fp16
#: (cached) beside them at every point and alone at small k (``cublas_small_ids``), so that time = intercept +
#: slope x id splits each one's fixed cost per launch from its main loop's cost per k
KSCAN_AB = {"shapes": [[4096, k] for k in (512, 1024, 2048, 4096, 8192, 14336)], "nts": [512],
            "qtypes": ["q4_K", "q6_K"], "launches": [[256, 3, 5], [256, 1, 5], [128, 1, 0], [128, 0, 0]],
            "pairs": 3, "repeats": 10, "cublas_small_ids": [16, 64, 256]}
CUBLAS = "cublas_f16_cached"
CUBLAS_F32OUT = "cublas_f16_f32out"   # cuBLAS fp16 operands with float32 output (cublasGemmEx): the kernel's output


def kscan_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """:func:`builds_ab` with no other build over the plan's ids (each launch of record parity-gated at its point,
    timed interleaved with cuBLAS fp16 and the 1-CTA empty kernel, L2 flushed), then cuBLAS alone (with the empty
    kernel) at each ``cublas_small_ids`` k, where its time is nearly all fixed cost. Both times cuBLAS also with
    float32 output (:data:`CUBLAS_F32OUT`, :func:`labkernels.gpu.gemm_dense`): the kernel writes float32, cuBLAS's
    baseline of record float16, half the bytes. Rows: ``wgmma_kscan_ab``, ``wgmma_kscan_gate``."""
    from . import bench as B
    p = {**KSCAN_AB, **(plan or {})}
    cp = _cp()
    rng = np.random.default_rng(seed or None)
    empty = B.EmptyLaunch(1, 32)

    def f32out(pt):
        y32 = cp.empty(pt.y.shape, cp.float32)
        return {CUBLAS_F32OUT: lambda: gpu.gemm_dense(pt.x16, pt.w16, out=y32)}

    rows = builds_ab(run, p, {}, "kscan", rng, bitwise=False, progress=progress, extra={EMPTY_1CTA: empty},
                     per_point=f32out)
    flush = B.Flusher()
    for nt in p["nts"]:
        for od in sorted({int(s[0]) for s in p["shapes"]}):
            for k in p["cublas_small_ids"]:
                x16 = cp.asarray(rng.standard_normal((nt, k)).astype(np.float16))
                w16 = cp.asarray(rng.standard_normal((od, k)).astype(np.float16))
                y16, y32 = cp.empty((nt, od), cp.float16), cp.empty((nt, od), cp.float32)
                res = B.interleaved({CUBLAS: lambda x16=x16, w16=w16, y16=y16: gpu.matmul_f16(x16, w16, out=y16),
                                     CUBLAS_F32OUT: lambda x16=x16, w16=w16, y32=y32: gpu.gemm_dense(x16, w16, out=y32),
                                     EMPTY_1CTA: empty}, pairs=p["pairs"], repeats=p["repeats"], flush=flush)
                new = B.pair_rows(res, {"qtype": "f16", "od": od, "id": k, "nt": nt}, nt, od, k)
                rows += new
                if run is not None:
                    run.append("wgmma_kscan_ab", new)
                progress(f"kscan cuBLAS alone {od}x{k} nt={nt}: "
                         f"{np.median([s['median_us'] for s in res[CUBLAS]]):.1f} us (fp16 out), "
                         f"{np.median([s['median_us'] for s in res[CUBLAS_F32OUT]]):.1f} us (fp32 out)")
    return rows


def kscan_fit(ab_df):
    """Per (qtype, od, nt, launch): time = intercept + slope x id, least squares over the point medians (the median
    over the interleaved rounds of each one's median) at the ids where the k-quant launches ran; cuBLAS fitted per
    qtype on the same points. Also the fastest launch per point fitted as one line (``best``), cuBLAS alone at its
    smallest k (``cublas_min_k_us``, ``cublas_min_k``; with float32 output ``cublas_f32out_min_k_us``) and the
    1-CTA empty kernel (``empty_1cta_us``). Columns:
    qtype, od, nt, variant, n_ids, intercept_us, ns_per_k, max_resid_us, plus the per-qtype context columns."""
    import pandas as pd

    med = medians(ab_df)
    small = med[(med.qtype == "f16") & (med.variant == CUBLAS)]
    small32 = med[(med.qtype == "f16") & (med.variant == CUBLAS_F32OUT)]
    empty = med[med.variant == EMPTY_1CTA].median_us
    rows = []

    def fit(g, q, od, nt, v):
        g = g.sort_values("id")
        if len(g) < 2:
            return
        x, y = g["id"].to_numpy(float), g.median_us.to_numpy(float)
        slope, icpt = np.polyfit(x, y, 1)
        rows.append({"qtype": q, "od": od, "nt": nt, "variant": v, "n_ids": len(g), "intercept_us": icpt,
                     "ns_per_k": slope * 1e3, "max_resid_us": float(np.abs(y - (icpt + slope * x)).max())})

    for (q, od, nt), g in med[med.qtype != "f16"].groupby(["qtype", "od", "nt"], sort=False):
        for v, gv in g[g.variant != EMPTY_1CTA].groupby("variant", sort=False):
            fit(gv, q, od, nt, v)
        k = g[g.variant.str.startswith("wgmma_")]
        fit(k.loc[k.groupby("id").median_us.idxmin()], q, od, nt, "best")
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    sm = small.sort_values("id")
    t["cublas_min_k"] = int(sm.id.iloc[0]) if len(sm) else np.nan
    t["cublas_min_k_us"] = float(sm.median_us.iloc[0]) if len(sm) else np.nan
    s32 = small32.sort_values("id")
    t["cublas_f32out_min_k_us"] = float(s32.median_us.iloc[0]) if len(s32) else np.nan
    t["empty_1cta_us"] = float(empty.median()) if len(empty) else np.nan
    return t


def kscan_points(ab_df):
    """The k scan's point medians (qtype, od, id, nt, variant, median_us) and, per k-quant point, the fastest
    launch's ratio to cuBLAS at the same point (``ratio``: cuBLAS / launch, on the rows of the fastest launch)."""
    med = medians(ab_df)[["qtype", "od", "id", "nt", "variant", "median_us"]]
    med["ratio"] = np.nan
    for _, g in med[med.qtype != "f16"].groupby(["qtype", "od", "id", "nt"]):
        k = g[g.variant.str.startswith("wgmma_")]
        cb = g[g.variant == CUBLAS]
        if len(k) and len(cb):
            i = k.median_us.idxmin()
            med.loc[i, "ratio"] = float(cb.median_us.iloc[0]) / med.loc[i, "median_us"]
    return med


def kscan_compare(fit, points, ids=(4096, 14336)):
    """Per qtype of a k scan (:func:`kscan_fit`, :func:`kscan_points`): the fixed cost (intercept, us) and the cost
    per k (slope, relative) of the BN=256 tile split (``split_*``) and of BN=128 data-parallel (``bn128_*``) over
    cuBLAS fp16's line, and of cuBLAS with fp32 output over it (``f32out_*``; NaN without it); then, at each of
    ``ids``, a launch with BN=128's intercept and the split's slope (``hybrid_us_<id>``) against cuBLAS's measured
    time there (``hybrid_ratio_<id>`` = cuBLAS / hybrid). The launches are the main scale form's (:func:`main_scl`)."""
    import pandas as pd

    f = fit.set_index(["qtype", "variant"])
    rows = []
    for q in dict.fromkeys(fit.qtype):
        split, dp = variant_name(256, 4, main_scl(q, 256), 3, 0, 5), variant_name(128, 4, main_scl(q, 128), 0)
        if not all((q, v) in f.index for v in (split, dp, CUBLAS)):
            continue
        cb, sp, d = f.loc[(q, CUBLAS)], f.loc[(q, split)], f.loc[(q, dp)]
        r = {"qtype": q,
             "split_extra_us": sp.intercept_us - cb.intercept_us, "split_per_k": sp.ns_per_k / cb.ns_per_k - 1,
             "bn128_extra_us": d.intercept_us - cb.intercept_us, "bn128_per_k": d.ns_per_k / cb.ns_per_k - 1,
             "f32out_extra_us": np.nan, "f32out_per_k": np.nan}
        if (q, CUBLAS_F32OUT) in f.index:
            c32 = f.loc[(q, CUBLAS_F32OUT)]
            r.update(f32out_extra_us=c32.intercept_us - cb.intercept_us, f32out_per_k=c32.ns_per_k / cb.ns_per_k - 1)
        for k in ids:
            hyb = d.intercept_us + sp.ns_per_k * 1e-3 * k
            meas = points[(points.qtype == q) & (points["id"] == k) & (points.variant == CUBLAS)].median_us
            r[f"hybrid_us_{k}"] = hyb
            r[f"hybrid_ratio_{k}"] = float(meas.iloc[0]) / hyb if len(meas) else np.nan
        rows.append(r)
    return pd.DataFrame(rows)


#: one 64-row x 256-token tile per CTA, k split between its two consumer warpgroups (every other super-block), 2-CTA
#: clusters multicasting the activations (``gpu-check --steps wgmma_kpair``, exploratory build -DLK_EXP_KPAIR):
#: against the launches of record (BN, scheduler, EPI) and cuBLAS fp16 at the bar's shapes, nt 512 and 4096; every
#: launch parity-gated at its point
#: LK_ABLATE_HALFB: the KPAIR build whose CTAs each receive only their own producer's half of every activation stage
#: (timing only; round 7's twenty-second step)
HALFB = ("LK_EXP_KPAIR", "LK_ABLATE_HALFB")
#: its A/B: the KPAIR build and its half-B ablation beside the launches of record and cuBLAS (od = 4096 shapes)
HALFB_AB = {"shapes": [[4096, 4096], [4096, 14336]], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
            "launches": [[256, 3, 5], [128, 0, 0], [256, 0, 0]], "pairs": 3, "repeats": 10}
#: LK_ABLATE_DECOUPLE: the half-B build whose consumers release a stage on their own CTA's empty barrier only (no
#: remote arrive): the pair's lock-step gone, the bytes received the half-B build's (timing only; round 7's
#: twenty-fourth step)
DECOUPLED = ("LK_ABLATE_DECOUPLE", "LK_ABLATE_HALFB", "LK_EXP_KPAIR")
#: LK_ABLATE_NOCONV of the KPAIR build and of the decoupled one: the consumers convert nothing (their A fragments
#: converted once before the loop; the weights' loads die): the loop's wgmmas, barriers and ring alone
KPAIR_NOCONV = ("LK_ABLATE_NOCONV", "LK_EXP_KPAIR")
DECOUPLED_NOCONV = ("LK_ABLATE_DECOUPLE", "LK_ABLATE_HALFB", "LK_ABLATE_NOCONV", "LK_EXP_KPAIR")
#: the KPAIR build and its ablations by short name (the ncu cases' ``who``, the A/B's variant suffix ``_<name>``)
KPAIR_BUILDS = {"kpair": KPAIR, "halfb": HALFB, "decoupled": DECOUPLED, "noconv": KPAIR_NOCONV,
                "decoupled_noconv": DECOUPLED_NOCONV}
#: what each ablation is, in a few words (figures and tables)
KPAIR_BUILD_LABELS = {"kpair": "KPAIR", "halfb": "KPAIR, half B", "decoupled": "KPAIR, half B, decoupled",
                      "noconv": "KPAIR, no conversion", "decoupled_noconv": "KPAIR, half B, decoupled, no conversion"}
#: the twenty-fourth step's A/B: the KPAIR build and its four ablations at the half-B step's points
DECOUPLE_AB = HALFB_AB
DECOUPLE_ABLATIONS = {f"_{k}": v for k, v in KPAIR_BUILDS.items() if k != "kpair"}
#: the twenty-third step: the shared-memory form (q4_K, data-parallel, BN=128) with one and two converter warpgroups,
#: each beside its LK_ABLATE_NOCONV build (the converters store nothing: timing only), the register form's BN=128
#: launch and its no-conversion skeleton, BN=256 at nt=4096, and cuBLAS
SMEMFORM_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K"], "pairs": 3, "repeats": 10}
NOCONV = ("LK_ABLATE_NOCONV",)


def smemform_ab(run=None, plan=None, progress=print, seed: int = 0) -> list[dict]:
    """The shared-memory form against its own no-conversion ablation (``gpu-check --steps wgmma_smemform``): at each
    point of :data:`SMEMFORM_AB`, same process, interleaved, L2 flushed, data-parallel grids: ``wgmma_smem_bn128_s4``
    (FORM=1) and ``..._c2`` (FORM=2), the register form's ``wgmma_bn128_s4_scl0`` (and ``wgmma_bn256_s4_scl0`` at
    nt > 512), each gated (NaN-poisoned output, :func:`gate`; a failure raises) before it is timed; beside them the
    ``_noconv`` builds of the three BN=128 launches (timing only) and cuBLAS fp16 on cached dequantized weights.
    Rows: ``wgmma_smemform_ab`` and ``wgmma_smemform_gate``."""
    from . import bench as B

    p = {**SMEMFORM_AB, **(plan or {})}
    rng = np.random.default_rng(seed or None)
    cp = _cp()
    flush = B.Flusher()
    rows = []
    for qtype, od, id_, nt, pt in _plan_points(p, rng):
        pt.w.gguf = pt.wq.raw   # the shared-memory form reads the GGUF rows as uploaded
        launches = {"wgmma_smem_bn128_s4": dict(BN=128, STAGES=4, FORM=1),
                    "wgmma_smem_bn128_s4_c2": dict(BN=128, STAGES=4, FORM=2),
                    "wgmma_bn128_s4_scl0": dict(BN=128, SCL=main_scl(qtype, 128))}
        if nt > 512:
            launches["wgmma_bn256_s4_scl0"] = dict(BN=256, SCL=main_scl(qtype, 256))
        calls = {}
        for v, prm in launches.items():
            pt.y.fill(np.nan)
            gemm(pt.w, pt.x16, out=pt.y, **prm)
            _gate_point(run, "wgmma_smemform_gate", qtype, od, id_, nt, v, pt)
            calls[v] = lambda prm=prm: gemm(pt.w, pt.x16, out=pt.y, **prm)
        y_x = cp.empty_like(pt.y)   # the ablations' Y: never read
        for v in ("wgmma_smem_bn128_s4", "wgmma_smem_bn128_s4_c2", "wgmma_bn128_s4_scl0"):
            calls[v + "_noconv"] = lambda prm=launches[v]: gemm(pt.w, pt.x16, out=y_x, defines=NOCONV, **prm)
        rows += _time_with_cublas(run, "smemform", calls, (qtype, od, id_, nt), pt, p, flush, progress)
    return rows


def _time_with_cublas(run, name: str, calls: dict, point, pt, p: dict, flush, progress) -> list[dict]:
    """The end of an A/B point: ``calls`` and cuBLAS fp16 on the point's cached dequantized weights timed
    interleaved (``p``'s pairs and repeats, ``flush``), the rows into ``run`` table ``wgmma_<name>_ab`` and returned,
    each call's TOPS-eq logged."""
    from . import bench as B
    qtype, od, id_, nt = point
    y16 = _cp().empty((nt, od), np.float16)
    calls = {**calls, "cublas_f16_cached": lambda: gpu.matmul_f16(pt.x16, pt.w16, out=y16)}
    res = B.interleaved(calls, pairs=p["pairs"], repeats=p["repeats"], flush=flush)
    new = B.pair_rows(res, {"qtype": qtype, "od": od, "id": id_, "nt": nt}, nt, od, id_)
    if run is not None:
        run.append(f"wgmma_{name}_ab", new)
    med = {k: np.median([s["median_us"] for s in v]) for k, v in res.items()}
    progress(f"{name} {qtype} {od}x{id_} nt={nt}: " + ", ".join(
        f"{k} {2 * nt * od * id_ / (v * 1e-6) / 1e12:.0f}" for k, v in med.items()) + " TOPS-eq")
    return new


def smemform_table(ab_df):
    """The twenty-third step's A/B per point: each launch's and each no-conversion build's ratio to cuBLAS fp16
    (cuBLAS / launch, medians over the interleaved rounds), and what the conversion costs each BN=128 form
    (``conv_cost`` = its time / its no-conversion build's time)."""
    import pandas as pd

    m = medians(ab_df)
    rows = []
    for k, g in m.groupby(["qtype", "od", "id", "nt"]):
        us = dict(zip(g.variant, g.median_us))
        cb = us.get("cublas_f16_cached")
        if cb is None:
            continue
        for v in ("wgmma_smem_bn128_s4", "wgmma_smem_bn128_s4_c2", "wgmma_bn128_s4_scl0", "wgmma_bn256_s4_scl0"):
            if v not in us:
                continue
            nc = us.get(v + "_noconv")
            rows.append({**dict(zip(["qtype", "od", "id", "nt"], k)), "launch": v.removeprefix("wgmma_"),
                         "us": us[v], "vs_cublas": cb / us[v],
                         "noconv_vs_cublas": cb / nc if nc else np.nan, "conv_cost": us[v] / nc if nc else np.nan})
    return pd.DataFrame(rows)


#: the tensor pipe's fp16 rate, MACs per SM per clock (dense, sm_90)
MACS_PER_CLK = 2048


def smem_bytes_per_clk(rows: int, tokens: int, a_in_smem: bool = False, a_written: bool = False,
                       recv_tokens: int | None = None) -> dict:
    """Shared-memory bytes per SM per clock that a CTA tile of ``rows`` weight rows x ``tokens`` tokens moves while the
    tensor pipe runs at its full fp16 rate (:data:`MACS_PER_CLK`), by source (a model, round 7's twenty-second step):

    * ``b_read``: wgmma's reads of B (the activations) -- an m64nNk16 reads N x 16 x 2 bytes for 64 N 16 MACs, 1/32
      byte per MAC whatever N, so 64 B/clk;
    * ``b_write``: the TMA's writes of the activation tile: ``recv_tokens`` (default ``tokens``) x k x 2 bytes per
      rows x tokens x k MACs;
    * ``a_read`` (``a_in_smem``: A from shared memory, the SS form): 64 x 16 x 2 bytes per wgmma, 2/tokens per MAC;
    * ``a_write`` (``a_written``: A staged through shared memory -- by TMA as fp16, or by converter warps): 2/tokens
      per MAC.
    The register form (the lab's main path) has b_read + b_write only."""
    recv = tokens if recv_tokens is None else recv_tokens
    r = {"b_read": MACS_PER_CLK / 32.0, "b_write": MACS_PER_CLK * 2.0 * recv / (rows * tokens),
         "a_read": MACS_PER_CLK * 2.0 / tokens if a_in_smem else 0.0,
         "a_write": MACS_PER_CLK * 2.0 / tokens if a_written else 0.0}
    r["total"] = sum(r.values())
    return r


KPAIR_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K", "q6_K"],
            "launches": [[256, 3, 5], [256, 1, 5], [128, 1, 0], [128, 0, 0], [256, 0, 0]], "pairs": 3, "repeats": 10}
KPAIR_VARIANT = "wgmma_kpair_bn256"
#: the real-model gates of the build: every Gemma 3 270M q4_K / q6_K tensor at these token counts (37: one token
#: tile, most of it past nt; 300: a second tile 44 tokens deep)
KPAIR_REAL_NTS = (37, 300)


def kpair_real_rows(rng, progress=print, nts=KPAIR_REAL_NTS, defines=KPAIR, variant=None) -> list[dict]:
    """Every q4_K / q6_K tensor of Gemma 3 270M (all rows, fresh random tokens at each of ``nts``) through the
    ``LK_EXP_KPAIR`` launch (or the form of it that ``defines`` name, its rows under ``variant``), NaN-poisoned output,
    :func:`gate` against gguf-py's float64 dequantization and the kernel's exact weights, the int8 q8_1 path's error on
    the same inputs beside it; a failed gate raises."""
    cp = _cp()
    rows = []
    for name, qtype, raw in model.load_kquant():
        raw = np.ascontiguousarray(raw)
        id_ = raw.shape[1] // BLOCK_BYTES[qtype] * QK
        w = WgWeight.from_gguf(raw, qtype)
        for nt in nts:
            x = rng.standard_normal((nt, id_)).astype(np.float32)
            y = cp.full((nt, raw.shape[0]), np.nan, cp.float32)
            gemm(w, cp.asarray(x), out=y, defines=defines, **KPAIR_PARAMS)
            g = gate(cp.asnumpy(y), raw, qtype, x, packed=cp.asnumpy(w.packed))
            i8 = int8_path_error(raw, qtype, x)
            rows.append({"tensor": name, "qtype": qtype, "od": raw.shape[0], "id": id_, "nt": nt,
                         "variant": variant or KPAIR_VARIANT, **g, "int8_max_rel_err_f64": i8["max_rel_err_f64"],
                         "int8_nmse": i8["nmse"]})
            if not g["ok"]:
                raise AssertionError(f"real-model gate failed: {name} {' '.join(defines)} nt={nt}: {g}")
    if not rows:
        raise AssertionError("no real-model gate ran: the model has no q4_K / q6_K tensor")
    progress(f"kpair real model ({' '.join(defines)}): {len(rows)} gates passed; max rel err vs float64 "
             f"{max(r['max_rel_err_f64'] for r in rows):.2e} (int8 q8_1 path "
             f"{max(r['int8_max_rel_err_f64'] for r in rows):.2e})")
    return rows


def kpair_ab(run=None, plan=None, progress=print, seed: int = 0, ablations: dict | None = None,
             builds: dict | None = None) -> list[dict]:
    """The ``LK_EXP_KPAIR`` build (:data:`KPAIR_PARAMS`, :func:`kpair_grid` CTAs in 2-CTA clusters) against the
    launches of record of the plan (:func:`_plan_launches`) and cuBLAS fp16 on cached dequantized weights, same
    process, interleaved, L2 flushed. First every Gemma tensor through the build (:func:`kpair_real_rows`, run table
    ``real_model_parity``); then at each point every launch -- the build's included -- is gated (NaN-poisoned output,
    :func:`gate`; a failure raises) before it is timed. ``ablations``: variant suffix -> defines of ablation builds of
    the KPAIR build (e.g. :data:`HALFB`), timed beside it as ``KPAIR_VARIANT + suffix``, never gated (timing only:
    their Y means nothing). ``builds``: variant suffix -> defines of other forms of the build that compute Y (e.g.
    :data:`KPAIR_FIN`): real-model gated as the build is (``real_model_parity``, their variant named) and gated and
    timed at every point beside it. Rows: ``wgmma_kpair_ab`` (the build's variant :data:`KPAIR_VARIANT`) and
    ``wgmma_kpair_gate``."""
    from . import bench as B

    p = {**KPAIR_AB, **(plan or {})}
    rng = np.random.default_rng(seed or None)
    if run is not None:
        run.append("real_model_parity", kpair_real_rows(rng, progress))
        for sfx, d in (builds or {}).items():
            run.append("real_model_parity", kpair_real_rows(rng, progress, defines=d, variant=KPAIR_VARIANT + sfx))
    cp = _cp()
    flush = B.Flusher()
    sm = _sm_count(cp.cuda.Device().id)
    rows = []
    for qtype, od, id_, nt, pt in _plan_points(p, rng):
        launches = dict(_plan_launches(p, qtype, nt, od, id_, sm))
        calls = {v: (lambda prm=prm: gemm(pt.w, pt.x16, out=pt.y, **prm)) for v, prm in launches.items()}
        calls[KPAIR_VARIANT] = lambda: gemm(pt.w, pt.x16, out=pt.y, defines=KPAIR, **KPAIR_PARAMS)
        for sfx, d in (builds or {}).items():
            calls[KPAIR_VARIANT + sfx] = lambda d=d: gemm(pt.w, pt.x16, out=pt.y, defines=d, **KPAIR_PARAMS)
        for v, call in calls.items():
            pt.y.fill(np.nan)
            call()
            _gate_point(run, "wgmma_kpair_gate", qtype, od, id_, nt, v, pt)
        y_x = cp.empty_like(pt.y)   # the ablations' Y: never read
        for sfx, d in (ablations or {}).items():
            calls[KPAIR_VARIANT + sfx] = lambda d=d: gemm(pt.w, pt.x16, out=y_x, defines=d, **KPAIR_PARAMS)
        rows += _time_with_cublas(run, "kpair", calls, (qtype, od, id_, nt), pt, p, flush, progress)
    return rows


def kpair_table(ab_df):
    """The build's A/B per point (qtype, od, id, nt): cuBLAS fp16 (cached), the fastest launch of record and the
    build (medians over the interleaved pairs, us), each one's ratio to cuBLAS (cuBLAS / launch: >= 1 is the nt=512
    bar) and the build's speed over the best launch of record (> 1: faster)."""
    import pandas as pd

    m = medians(ab_df)
    rows = []
    for k, g in m.groupby(["qtype", "od", "id", "nt"]):
        us = dict(zip(g.variant, g.median_us))
        rec = {v: t for v, t in us.items() if v.startswith("wgmma_bn")}
        if "cublas_f16_cached" not in us or KPAIR_VARIANT not in us or not rec:
            continue
        best = min(rec, key=rec.get)
        cb, kp = us["cublas_f16_cached"], us[KPAIR_VARIANT]
        rows.append({**dict(zip(["qtype", "od", "id", "nt"], k)), "cublas_us": cb,
                     "best_record": best.removeprefix("wgmma_"), "best_record_us": rec[best], "kpair_us": kp,
                     "best_record_vs_cublas": cb / rec[best], "kpair_vs_cublas": cb / kp,
                     "kpair_over_best": rec[best] / kp})
    return pd.DataFrame(rows)


def kpair_ablation_builds(ab_df, labels: dict):
    """A ``wgmma_kpair_ab`` run with ablation variants (``KPAIR_VARIANT + suffix``) as :func:`kpair_builds` rows: the
    KPAIR build (``build`` "KPAIR") and each ablation of ``labels`` (suffix -> its build label, in the ``kpair_*``
    columns), each against cuBLAS and the best launch of record timed beside them in the same run, for
    :func:`labkernels.plotting.build_series_bars`; plus ``over_kpair`` = the KPAIR build's time / the ablation's
    (> 1: the ablation is faster; blank on the KPAIR rows)."""
    import pandas as pd

    abl = {KPAIR_VARIANT + sfx for sfx in labels}
    kp = kpair_table(ab_df[~ab_df.variant.isin(abl)]).assign(build="KPAIR")
    key = ["qtype", "od", "id", "nt"]
    out = [kp]
    for sfx, label in labels.items():
        v = KPAIR_VARIANT + sfx
        if not (ab_df.variant == v).any():
            continue
        t = ab_df[(ab_df.variant != KPAIR_VARIANT) & (~ab_df.variant.isin(abl - {v}))]
        t = kpair_table(t.replace({"variant": {v: KPAIR_VARIANT}})).assign(build=label)
        t = t.merge(kp[key + ["kpair_us"]].rename(columns={"kpair_us": "kpair_full_us"}), on=key)
        t["over_kpair"] = t.kpair_full_us / t.kpair_us
        out.append(t.drop(columns="kpair_full_us"))
    return pd.concat(out, ignore_index=True)


def forms_over(builds, base: str, names: dict):
    """:func:`kpair_ablation_builds` rows as one row per point: cuBLAS's time, each build's ratio to cuBLAS
    (``<name>_vs_cublas``; ``names``: build label -> short name) and each other build's speed over ``base`` (a label
    of ``names``): ``<name>_over_<base name>`` = base's time / its time (> 1: faster than the base). Builds absent from
    the rows are left out."""
    key = ["qtype", "od", "id", "nt"]
    b = builds[builds.build.isin(names)]
    out = b.groupby(key).cublas_us.first().reset_index()
    us = b.pivot_table(index=key, columns="build", values="kpair_us")
    vs = b.pivot_table(index=key, columns="build", values="kpair_vs_cublas")
    bn = names[base]
    for label, n in names.items():
        if label not in us.columns:
            continue
        out[f"{n}_vs_cublas"] = vs[label].values
        if label != base:
            out[f"{n}_over_{bn}"] = (us[base] / us[label]).values
    return out


def halfb_builds(ab_df):
    """The half-B ablation's A/B (``wgmma_kpair_ab`` with the ``_halfb`` variant): :func:`kpair_ablation_builds` with
    the ablation as "KPAIR, half B (ablation)" and its ``over_kpair`` as ``halfb_over_kpair``."""
    return kpair_ablation_builds(ab_df, {"_halfb": "KPAIR, half B (ablation)"}).rename(
        columns={"over_kpair": "halfb_over_kpair"})


def decouple_table(ab_df):
    """The twenty-fourth step's A/B per point: cuBLAS fp16 (cached) and the KPAIR build (us), each build's ratio to
    cuBLAS (``<name>_vs_cublas``, cuBLAS / launch) for the KPAIR build and its ablations (:data:`KPAIR_BUILDS`), and
    three quotients of medians: ``conversion`` = KPAIR / no conversion (what converting costs the coupled loop),
    ``coupling`` = half B / half B decoupled (what the pair's lock-step costs), ``conversion_decoupled`` = decoupled /
    decoupled without conversion. Points without the KPAIR build or cuBLAS are left out."""
    import pandas as pd

    m = medians(ab_df)
    rows = []
    for k, g in m.groupby(["qtype", "od", "id", "nt"]):
        us = dict(zip(g.variant, g.median_us))
        cb, kp = us.get("cublas_f16_cached"), us.get(KPAIR_VARIANT)
        if cb is None or kp is None:
            continue
        b = {n: us.get(KPAIR_VARIANT if n == "kpair" else f"{KPAIR_VARIANT}_{n}", np.nan) for n in KPAIR_BUILDS}
        row = {**dict(zip(["qtype", "od", "id", "nt"], k)), "cublas_us": cb, "kpair_us": kp}
        row |= {f"{n}_vs_cublas": cb / t for n, t in b.items()}
        row |= {"conversion": b["kpair"] / b["noconv"], "coupling": b["halfb"] / b["decoupled"],
                "conversion_decoupled": b["decoupled"] / b["decoupled_noconv"]}
        rows.append(row)
    return pd.DataFrame(rows)


#: the twenty-second step's ncu columns: (metric, short name)
SMEM_NCU_COLUMNS = {"Grid Size": "grid", "Cluster Size": "cluster", "Duration": "duration_ns",
                    "SM Frequency": "sm_hz", "sm__cycles_elapsed.avg": "cycles",
                    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "tensor_active_pct",
                    "l1tex__data_bank_reads.sum": "bank_reads", "l1tex__data_bank_writes.sum": "bank_writes",
                    "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed": "bank_reads_pct",
                    "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed": "bank_writes_pct",
                    "Issue Slots Busy": "issue_busy_pct", "# SMs": "sms"}
#: bytes of one shared-memory data-bank access (32 banks of 4 bytes)
BANK_BYTES = 4


def cublas_tile(kernel_name: str) -> tuple[int, int] | None:
    """(M, N) of the wgmma tile that a cuBLAS ``nvjet_sm90_*_<a>x<b>_...`` kernel name gives: wgmma's M comes in
    64-row steps, so a side that is not a multiple of 64 is its N (168 x 128: M = 128, N = 168), else (a, b). None
    for a name without a tile."""
    m = re.search(r"_(\d+)x(\d+)_\d+x\d+_", str(kernel_name))
    if not m:
        return None
    a, b = int(m.group(1)), int(m.group(2))
    return (b, a) if a % 64 else (a, b)


def smem_model(who: str, kernel_name: str, BN: int) -> dict:
    """:func:`smem_bytes_per_clk` of one case of the twenty-second step: cuBLAS's shared-memory tile (both operands
    TMA-staged and wgmma-read, the tile from :func:`cublas_tile`), the register form's 128-row tile of BN tokens, the
    KPAIR build's 64-row x 256-token tile, its half-B ablation (128 of the 256 tokens received)."""
    if who == "cublas":
        t = cublas_tile(kernel_name)
        if t is None:
            return {"b_read": np.nan, "b_write": np.nan, "a_read": np.nan, "a_write": np.nan, "total": np.nan}
        m, n = t
        return smem_bytes_per_clk(m, n, a_in_smem=True, a_written=True)
    if who in ("kpair", "noconv"):
        return smem_bytes_per_clk(64, 256)
    if who in ("halfb", "decoupled", "decoupled_noconv"):   # each CTA receives its own producer's 128 tokens
        return smem_bytes_per_clk(64, 256, recv_tokens=128)
    return smem_bytes_per_clk(128, int(BN))


def smem_table(ncu_df):
    """The twenty-second step's ncu run (table ``smem_ncu``) as one row per case (the first kernel of its profiled
    range): who, shape, the kernel (its function name) and the launch in short (cuBLAS: its name's tile, stages,
    cluster and layout; the lab: tile and scheduler), grid and cluster, duration (us), SM clock (MHz) and elapsed
    cycles (per SM), the tensor
    pipe's active share, shared memory's measured bytes per SM per clock (data-bank reads and writes x
    :data:`BANK_BYTES` over the SMs of the case's LaunchStats and its elapsed cycles), the same per tensor-active clock
    beside :func:`smem_model`'s, and the banks' use in % of ncu's peak. A case without its SM count raises."""
    import pandas as pd

    d = ncu_df[ncu_df.kernel_id == ncu_df.groupby("case").kernel_id.transform("min")]
    d = d[d.metric.isin(SMEM_NCU_COLUMNS)].copy()
    d["v"] = pd.to_numeric(d.value.astype(str).str.replace(",", ""), errors="coerce")
    key = ["case", "who", "qtype", "nt", "od", "id", "BN", "SK", "EPI"]
    p = d.pivot_table(index=key, columns="metric", values="v", aggfunc="first").rename(columns=SMEM_NCU_COLUMNS)
    names = d.groupby("case").kernel_name.first()
    rows = []
    for k, r in p.iterrows():
        c = dict(zip(key, k))
        name = str(names.loc[c["case"]])
        t = r.tensor_active_pct / 100.0
        if not r.get("sms", 0) > 0:
            raise ValueError(f"smem_ncu case {c['case']} has no '# SMs' (LaunchStats): bytes per SM unknown")
        rd = r.bank_reads * BANK_BYTES / r.sms / r.cycles
        wr = r.bank_writes * BANK_BYTES / r.sms / r.cycles
        mdl = smem_model(c["who"], name, c["BN"])
        kern = name.split("(")[0].removeprefix("void ").strip()
        if c["who"] == "cublas":
            launch = kern.removeprefix("nvjet_sm90_hsh_")
        elif c["who"] in KPAIR_BUILDS:
            launch = "KPAIR 64 x 256" + KPAIR_BUILD_LABELS[c["who"]].removeprefix("KPAIR")
        else:
            launch = f"128 x {c['BN']} " + ("data-parallel" if c["SK"] == 0 else f"SK={c['SK']} EPI={c['EPI']}")
        rows.append({**c, "kernel": kern, "launch": launch,
                     "grid": int(r.grid), "cluster": int(r.cluster), "duration_us": r.duration_ns / 1e3,
                     "sm_mhz": r.sm_hz / 1e6, "cycles": r.cycles, "tensor_active_pct": r.tensor_active_pct,
                     "issue_busy_pct": r.issue_busy_pct,
                     "read_B_per_clk": rd, "write_B_per_clk": wr,
                     "read_per_tensor_clk": rd / t, "write_per_tensor_clk": wr / t,
                     "model_read": mdl["b_read"] + mdl["a_read"], "model_write": mdl["b_write"] + mdl["a_write"],
                     "bank_reads_pct": r.bank_reads_pct, "bank_writes_pct": r.bank_writes_pct})
    return pd.DataFrame(rows)


def kpair_builds(runs):
    """The builds of an ``LK_EXP_KPAIR`` series side by side: ``runs`` = [(label, run)] (each a recorded
    ``wgmma_kpair_ab`` run). One row per (label, point) of :func:`kpair_table`, with the build's label; the best
    launch of record is each run's own (timed beside that build)."""
    import pandas as pd

    parts = [kpair_table(r.table("wgmma_kpair_ab")).assign(build=label) for label, r in runs]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


#: ncu metrics of the KPAIR comparison (:func:`kpair_ncu`): throughputs, the tensor pipe and the stall reasons
#: that changed between the builds (warps stalled per issued instruction)
KPAIR_NCU_METRICS = {"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe active %",
                     "Issue Slots Busy": "issue slots busy %", "L1/TEX Cache Throughput": "L1/TEX throughput %",
                     "L2 Cache Throughput": "L2 throughput %",
                     "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio": "stall: membar",
                     "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio":
                         "stall: long scoreboard",
                     "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "stall: barrier",
                     "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "stall: wait",
                     "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio": "stall: dispatch"}


def kpair_ncu(cases):
    """Nsight Compute counters side by side: ``cases`` = [(label, sections table of an ncu run, kernel-key
    substring, sk, nt)] -> one row per :data:`KPAIR_NCU_METRICS` metric, one column per label (the first case of
    the run that matches; a metric the run lacks is NaN, a case that matches nothing raises)."""
    import pandas as pd

    cols = {}
    for label, t, key, sk, nt in cases:
        m = t[t.kernel.str.contains(key, regex=False) & (t.sk == sk) & (t.nt == nt)]
        if m.empty:
            raise ValueError(f"no ncu case {key!r} SK={sk} nt={nt} for {label!r}")
        m = m[m.case == m.case.min()]
        vals = dict(zip(m.metric, m.value))
        cols[label] = {name: pd.to_numeric(str(vals[k]).replace(",", ""), errors="coerce") if k in vals else np.nan
                       for k, name in KPAIR_NCU_METRICS.items()}
    return pd.DataFrame(cols)


def ceiling_table(ab_df):
    """The ceiling A/B as one row per (point, launch): each build's ratio to cuBLAS fp16 (cached) -- plain, without
    weight loads, without conversion (the skeleton) -- and the share of the plain launch's excess time over the
    skeleton that the loads account for: (t_plain - t_noload) / (t_plain - t_noconv)."""
    t = suffix_ab(ab_df, suffixes=tuple(CEILING_BUILDS))
    if t.empty:
        return t
    key = ["qtype", "od", "id", "nt", "launch", "base"]
    w = t.pivot_table(index=key, columns="option", values=["speedup", "option_vs_cublas", "base_vs_cublas"],
                      aggfunc="first")
    out = w.index.to_frame(index=False)
    out["plain_vs_cublas"] = w[("base_vs_cublas", "noload")].to_numpy()   # the base's: the same under both options
    out["noload_vs_cublas"] = w[("option_vs_cublas", "noload")].to_numpy()
    out["noconv_vs_cublas"] = w[("option_vs_cublas", "noconv")].to_numpy()
    # times relative to the plain launch's: 1 / speedup
    r_load, r_conv = 1 / w[("speedup", "noload")].to_numpy(), 1 / w[("speedup", "noconv")].to_numpy()
    out["loads_share"] = (1 - r_load) / (1 - r_conv)
    return out.rename(columns={"base": "variant"}).sort_values(["qtype", "od", "id", "nt", "launch"]).reset_index(drop=True)


#: the scale plane's A/B (``gpu-check --steps wgmma_plane``): q4_K BN=128 with the plane (SCL=2) against the header
#: decode (SCL=0) under three schedulers, beside the BN=256 split grids, at nt 512 and 4096
PLANE_AB = {"shapes": [list(s) for s in SHAPES], "nts": [512, 4096], "qtypes": ["q4_K"],
            "variants": [[128, 4, scl, sk] for sk in (0, 1, 3) for scl in (0, 2)] + [[256, 4, 0, 1], [256, 4, 0, 3]],
            "pairs": 3, "repeats": 10}


def plane_ab(run, plan=None, progress=print, seed: int = 0) -> None:
    """SCL=2 against SCL=0 and the BN=256 launches, interleaved per point with cuBLAS (:func:`bench`, its own table
    ``wgmma_plane_ab``), after the real-model gates of the SCL=2 forms on every Gemma q4_K tensor."""
    option_ab(run, PLANE_AB, "wgmma_plane_ab", lambda f: len(f) > 6 and f[6] == 2, plan, progress, seed)


def plane_table(ab_df):
    """The scale plane's A/B as one row per (point, scheduler): median(SCL=0) / median(SCL=2) over the interleaved
    pairs (> 1: the plane is faster) and each one's ratio to cuBLAS fp16 (cached) -- :func:`suffix_ab` with each
    SCL=2 variant named as its SCL=0 base plus ``_plane``."""
    plane = ab_df.variant.str.contains("_scl2")
    named = ab_df.assign(variant=ab_df.variant.where(~plane, ab_df.variant.str.replace("_scl2", "_scl0") + "_plane"))
    t = suffix_ab(named, suffixes=("_plane",))
    if t.empty:
        return t
    return (t.rename(columns={"speedup": "plane_over_header", "option_vs_cublas": "plane_vs_cublas",
                              "base_vs_cublas": "header_vs_cublas"})
            [["qtype", "od", "id", "nt", "launch", "plane_over_header", "plane_vs_cublas", "header_vs_cublas"]])


# ------------------------------------------------------------------------------------------------ the recorded round


#: the plan of round 7's measurement (the gpu-check step and the notebook's measure mode)
PLAN = {"shapes": [list(s) for s in SHAPES], "nts": list(NTS), "qtypes": ["q4_K", "q6_K"],
        "variants": [[128, 4, 0, 0], [128, 4, 1, 0], [256, 4, 0, 0], [256, 4, 1, 0],
                     [128, 4, 0, 1], [128, 4, 1, 1], [256, 4, 0, 1], [256, 4, 1, 1],
                     # the shared-memory form (q4_K): [BN, STAGES, -, SK, FORM=1]
                     [128, 4, 0, 0, 1], [128, 4, 0, 1, 1], [256, 3, 0, 0, 1], [256, 3, 0, 1, 1],
                     # the uniform split-k grid (SK=2), BN=256 main scale form; where it fits (G >= 2)
                     [256, 4, 0, 2], [128, 4, 0, 2], [128, 4, 1, 2],
                     # the tile-aligned split-k grid (SK=3, run 20261201T2310: 1.07-1.11x stream-K at 4096x11008)
                     [256, 4, 0, 3], [128, 4, 0, 3], [128, 4, 1, 3],
                     # the pair exchange on SK=3's grid (EPI=3; main scale form; where a tile gets two CTAs)
                     [256, 4, None, 3, 0, 3], [128, 4, None, 3, 0, 3],
                     # the staged TMA store on stream-K (EPI=4; run 20261202T030856Z: 1.015-1.028x the plain
                     # epilogue at 11008x4096, 0.96-0.99x at q6_K 4096x11008 / 4096x14336, neutral data-parallel)
                     [256, 4, None, 1, 0, 4]],
        "pairs": 3, "repeats": 10}


def kernel_rows() -> list[dict]:
    """Resources of every registered wgmma_kq instantiation as built for the device (nvcc -> cubin)."""
    from . import occupancy

    rows = []
    for spec in registry.family("wgmma_kq") + registry.family("wgmma_kqs"):
        k = kernel(spec.family, **spec.p)
        smem = k.smem + k.entry["static_smem"]
        calc = occupancy.occupancy("h200", spec.threads, k.regs, smem)
        rows.append({"kernel": spec.key, **spec.p, "main_path": spec.main_path, "regs": k.regs,
                     "local_bytes": k.local_bytes, "spill_stores": k.entry["spill_stores"],
                     "wgmma_serialized": k.entry.get("wgmma_serialized", False), "dynamic_smem": k.smem,
                     "static_smem": k.entry["static_smem"], "api_blocks_per_sm": k.occupancy_api(),
                     "calc_blocks_per_sm": calc["blocks_per_sm"]})
    return rows


#: the (BN, SK, FORM, EPI[, AQ[, PF]]) forms the real-model gates run (each where its scheduler fits the tensor at 37 tokens)
REAL_MODEL_FORMS = ((128, 0, 0, 0), (256, 0, 0, 0), (128, 1, 0, 0), (256, 1, 0, 0), (128, 2, 0, 0), (256, 2, 0, 0),
                    (128, 0, 1, 0), (128, 1, 1, 0), (256, 1, 1, 0),      # the shared-memory form (q4_K)
                    (128, 3, 0, 0), (256, 3, 0, 0),                      # the tile-aligned split-k grid
                    (256, 0, 0, 1), (256, 2, 0, 1), (128, 0, 0, 2), (256, 0, 0, 2), (256, 2, 0, 2), (256, 3, 0, 2),
                    (128, 3, 0, 1),
                    (128, 0, 0, 0, 4), (128, 1, 0, 0, 4), (128, 3, 0, 0, 4),     # four A-fragment sets (AQ=4)
                    (128, 0, 0, 0, 2, 2), (128, 1, 0, 0, 2, 1), (256, 3, 0, 0, 2, 2),   # the L2 prefetch (PF)
                    (128, 3, 0, 3), (256, 3, 0, 3),                      # the pair exchange (EPI=3)
                    (128, 0, 0, 4), (256, 0, 0, 4), (128, 1, 0, 4), (256, 1, 0, 4), (256, 3, 0, 4),   # staged (EPI=4)
                    (128, 1, 0, 5), (256, 1, 0, 5), (128, 3, 0, 5), (256, 3, 0, 5),   # the reduce finish (EPI=5)
                    (128, 0, 2, 0), (128, 1, 2, 0),                      # two converter warpgroups (FORM=2)
                    (128, 0, 0, 0, 2, 0, 2), (128, 1, 0, 0, 2, 0, 2), (128, 3, 0, 0, 2, 0, 2))   # the scale plane (SCL=2)


def reduce_fits(sk: int, nt: int, od: int, id_: int, BN: int, sm_count: int) -> bool:
    """Whether EPI=5 takes this launch: the scheduler's grid fits (:func:`sk_fits`) and its tiles have at most two
    CTAs each (:func:`reduce_finish_fits`)."""
    if not sk_fits(sk, nt, od, id_, BN, sm_count):
        return False
    ncta, dp = schedule(sk, nt, od, id_, BN, sm_count)
    return reduce_finish_fits(ncta, id_ // QK, tile_count(nt, od, BN), dp, split_g(sk, nt, od, id_, BN, sm_count))


def reduce_nt(sk: int, od: int, id_: int, BN: int, sm_count: int) -> int | None:
    """The fewest tokens (a multiple of 8 up to 4096) at which EPI=5 takes scheduler ``sk`` on this weight with some
    tile split over two CTAs -- the real-model gate's nt for the reduce finish; None where there is none."""
    I = id_ // QK
    for nt in range(8, 4097, 8):
        if not reduce_fits(sk, nt, od, id_, BN, sm_count):
            continue
        ncta, dp = schedule(sk, nt, od, id_, BN, sm_count)
        G = split_g(sk, nt, od, id_, BN, sm_count)
        if any(klo > 0 for c in range(ncta) for _, klo, _ in segments(ncta, c, I, tile_count(nt, od, BN), dp, G)):
            return nt
    return None


def real_model_rows(rng, progress=print, forms=REAL_MODEL_FORMS) -> list[dict]:
    """Every q4_K / q6_K tensor of Gemma 3 270M (all rows, 37 fresh random tokens) through the main variants
    under every scheduler and epilogue form in ``forms`` (at 37 tokens stream-K splits every tile's k over several
    CTAs: the fix-up is gated), with the int8 q8_1 path's error on the same inputs beside it. The pair exchange
    (EPI=3) runs at :func:`pair_nt` tokens instead, the fewest at which the tensor's tiles get two CTAs each."""
    cp = _cp()
    sm = _sm_count(cp.cuda.Device().id)
    rows = []
    for name, qtype, raw in model.load_kquant():
        raw = np.ascontiguousarray(raw)
        id_ = raw.shape[1] // BLOCK_BYTES[qtype] * QK
        w = WgWeight.from_gguf(raw, qtype, plane=any(len(f) > 6 and f[6] == 2 for f in forms))
        if qtype == "q4_K":
            w.gguf = cp.asarray(raw)
        inputs = {}    # nt -> (x, the int8 q8_1 path's error on x): 37 tokens, or EPI=3's pair_nt
        for f in forms:
            bn, sk, form, epi, aq, pf, scl = (tuple(f) + (2, 0, None)[len(f) - 4:])[:7]
            if scl == 2 and qtype != "q4_K":
                continue     # the scale plane is q4_K's
            if (pf or epi == 3) and qtype == "q6_K" and bn == 256:
                continue     # no q6_K BN=256 prefetch or pair-exchange build (they spill)
            if form and qtype != "q4_K":
                continue     # the shared-memory form takes q4_K
            nt = 37
            if epi == 3:
                nt = pair_nt(raw.shape[0], id_, bn, sm)
                if nt is None:
                    continue     # the pair exchange: two CTAs per tile only
            if epi == 5:
                nt = reduce_nt(sk, raw.shape[0], id_, bn, sm)
                if nt is None or raw.shape[0] % 4:
                    continue     # the reduce finish: a grid of at most two CTAs a tile, some of them split
            if not sk_fits(sk, nt, raw.shape[0], id_, bn, sm):
                continue     # a split-k grid where it fits this tensor (every Gemma tensor, at 37 tokens)
            if epi in (2, 4, 5) and raw.shape[0] % 4:
                continue     # the TMA-store epilogue's rows are 16-byte multiples
            if nt not in inputs:
                x = rng.standard_normal((nt, id_)).astype(np.float32)
                inputs[nt] = (x, int8_path_error(raw, qtype, x))
            x, i8 = inputs[nt]
            p = {"BN": bn, "STAGES": 3 if form and bn == 256 else 4, "BF16": 0,
                 "SCL": main_scl(qtype, bn) if scl is None else scl, "SK": sk,
                 "FORM": form, "EPI": epi, "AQ": aq, "PF": pf}
            y = cp.full((nt, raw.shape[0]), np.nan, cp.float32)
            gemm(w, cp.asarray(x), out=y, **p)
            g = gate(cp.asnumpy(y), raw, qtype, x, packed=cp.asnumpy(w.packed))
            rows.append({"tensor": name, "qtype": qtype, "od": raw.shape[0], "id": id_, "nt": nt,
                         "variant": variant_name(bn, p["STAGES"], p["SCL"], sk, form, epi, aq, pf), **g, "int8_max_rel_err_f64": i8["max_rel_err_f64"],
                         "int8_nmse": i8["nmse"]})
            if not g["ok"]:
                raise AssertionError(f"real-model gate failed: {name} {p}: {g}")
    if not rows:
        raise AssertionError(f"no real-model gate ran: no Gemma 3 270M tensor takes the forms {list(forms)}")
    progress(f"real model: {len(rows)} gates passed; max rel err vs float64 {max(r['max_rel_err_f64'] for r in rows):.2e} "
             f"(int8 q8_1 path {max(r['int8_max_rel_err_f64'] for r in rows):.2e}), NMSE "
             f"{max(r['nmse'] for r in rows):.1e} (int8 {max(r['int8_nmse'] for r in rows):.1e})")
    return rows


def record(run, plan=None, progress=print, seed: int = 0) -> None:
    """Round 7 into ``run``: kernel resources, real-model gates, the interleaved benchmark with its gates."""
    p = {**PLAN, **(plan or {})}
    rng = np.random.default_rng(seed or None)
    run.append("kernels", kernel_rows())
    run.append("real_model_parity", real_model_rows(rng, progress))
    bench([tuple(s) for s in p["shapes"]], p["nts"], p["qtypes"], [tuple(v) for v in p["variants"]],
          pairs=p["pairs"], repeats=p["repeats"], run=run, progress=progress)


# ------------------------------------------------------------------------------------------------ analysis (notebook)

BASELINES = ("cublas_f16_cached", "cublas_f16_with_dequant")


def medians(bench_df):
    """Median over the interleaved pairs of each (qtype, od, id, nt, variant): median_us, tops_eq, us_per_gmac."""
    import pandas as pd

    g = bench_df.groupby(["qtype", "od", "id", "nt", "variant"], as_index=False).median_us.median()
    gmac = g.nt * g.od * g.id / 1e9
    g["us_per_gmac"] = g.median_us / gmac
    g["tops_eq"] = 2 * gmac * 1e9 / (g.median_us * 1e-6) / 1e12
    return pd.DataFrame(g)


def best_vs_cublas(ab_df, option: str = "_e5"):
    """Per point (qtype, od, id, nt) of an option A/B: the fastest wgmma launch without the ``option`` suffix and the
    fastest of all (the option's launches included), each one's ratio to cuBLAS fp16 (cached) timed beside it
    (medians over the interleaved pairs) -- what the option does to the point's best, which is what the bar asks."""
    import pandas as pd

    m = medians(ab_df)
    key = ["qtype", "od", "id", "nt"]
    rows = []
    for k, g in m.groupby(key):
        cb = g[g.variant == "cublas_f16_cached"].median_us
        w = g[g.variant.str.startswith("wgmma_")]
        if cb.empty or w.empty:
            continue
        without = w[~w.variant.str.endswith(option)]
        b0 = without.loc[without.median_us.idxmin()] if len(without) else None
        b1 = w.loc[w.median_us.idxmin()]
        rows.append({**dict(zip(key, k)), "cuBLAS us": float(cb.iloc[0]),
                     "best without": b0.variant.removeprefix("wgmma_") if b0 is not None else "",
                     "without vs cuBLAS": float(cb.iloc[0] / b0.median_us) if b0 is not None else float("nan"),
                     "best with": b1.variant.removeprefix("wgmma_"),
                     "with vs cuBLAS": float(cb.iloc[0] / b1.median_us)})
    return pd.DataFrame(rows)


def epi_table(ab_df):
    """The epilogue A/B (``wgmma_epi_ab``) as the notebook shows it: per (qtype, od, id, nt) and scheduler, the
    plain / bulk-fold / TMA-store launches as ratios to cuBLAS fp16 (cached) of the same point (medians over pairs);
    a form that did not run at a point (its grid does not fit) is NaN."""
    import pandas as pd

    m = medians(ab_df)
    key = ["qtype", "od", "id", "nt"]
    cb = m[m.variant == "cublas_f16_cached"].set_index(key).median_us.rename("cublas_us")
    m = m[m.variant.str.startswith("wgmma_bn")].join(cb, on=key)
    parsed = [variant_params(v, q)[1] for v, q in zip(m.variant, m.qtype)]
    m["sched"] = [f"BN={p['BN']} " + {0: "SK=0", 1: "SK=1", 2: "SK=2", 3: "SK=3"}[p["SK"]] for p in parsed]
    m["epi"] = [{0: "plain", 1: "bulk fold", 2: "+TMA store", 3: "pair exchange", 4: "staged TMA store"}[p.get("EPI", 0)] for p in parsed]
    m["vs_cublas"] = m.cublas_us / m.median_us
    t = m.pivot_table(index=key + ["sched"], columns="epi", values="vs_cublas")
    return pd.DataFrame(t.reindex(columns=[c for c in ("plain", "bulk fold", "+TMA store", "pair exchange")
                                           if c in t.columns])
                        ).reset_index()


def summary(bench_df):
    """Per (qtype, od, id, nt): the fastest wgmma_kq variant, its TOPS-eq and us/GMAC, and time ratios
    (baseline time / wgmma time, > 1 = wgmma faster) against cuBLAS fp16 (cached weights, and including the
    dequant) and the lab's int8 family -- each ratio the median of the per-pair ratios of the interleaved rounds."""
    import pandas as pd

    rows = []
    for key, grp in bench_df.groupby(["qtype", "od", "id", "nt"]):
        per = grp.pivot_table(index="pair", columns="variant", values="median_us")
        wg = [c for c in per.columns if c.startswith(("wgmma_bn", "wgmma_smem"))]   # both forms
        best = per[wg].median().idxmin()
        q, od, id_, nt = key
        row = {"qtype": q, "od": od, "id": id_, "nt": nt, "best": best,
               "tops_eq": 2 * nt * od * id_ / (per[best].median() * 1e-6) / 1e12,
               "us_per_gmac": per[best].median() / (nt * od * id_ / 1e9)}
        for b in BASELINES:
            row[f"vs_{b}"] = float((per[b] / per[best]).median())
        i8 = [c for c in per.columns if c.startswith("int8_")]
        row["vs_int8"] = float((per[i8[0]] / per[best]).median()) if i8 else float("nan")
        row["int8_family"] = i8[0][5:] if i8 else None
        row["cublas_tops"] = 2 * nt * od * id_ / (per["cublas_f16_cached"].median() * 1e-6) / 1e12
        row["pairs"] = int(len(per))
        rows.append(row)
    return pd.DataFrame(rows)


def forms(bench_df):
    """Per (qtype, od, id, nt) where both forms ran: the best register-form and shared-memory-form variant and
    their time ratios to cuBLAS fp16 on cached weights (baseline time / form time, medians over the pairs)."""
    import pandas as pd

    med = medians(bench_df)
    rows = []
    for key, g in med.groupby(["qtype", "od", "id", "nt"]):
        t = g.set_index("variant").median_us
        reg, sm = t[t.index.str.startswith("wgmma_bn")], t[t.index.str.startswith("wgmma_smem")]
        if not len(reg) or not len(sm) or "cublas_f16_cached" not in t:
            continue
        cb = t["cublas_f16_cached"]
        rows.append(dict(zip(["qtype", "od", "id", "nt"], key), register=reg.idxmin(), register_vs_cublas=cb / reg.min(),
                         smem=sm.idxmin(), smem_vs_cublas=cb / sm.min(), smem_vs_register=reg.min() / sm.min()))
    return pd.DataFrame(rows)


def bars(s, nt_large: int = 4096, nt_small: int = 512) -> list[dict]:
    """The issue's performance bar, row by row: nt_large >= 650 TOPS-eq and >= 0.85x cuBLAS; nt_small >= 1.0x."""
    out = []
    for _, r in s[s.nt.isin([nt_large, nt_small])].iterrows():
        if r.nt == nt_large:
            ok = r.tops_eq >= 650 and r.vs_cublas_f16_cached >= 0.85
            want = ">= 650 TOPS-eq and >= 0.85x cuBLAS"
        else:
            ok = r.vs_cublas_f16_cached >= 1.0
            want = ">= 1.0x cuBLAS"
        out.append({"qtype": r.qtype, "od": r.od, "id": r.id, "nt": r.nt, "tops_eq": r.tops_eq,
                    "vs_cublas": r.vs_cublas_f16_cached, "bar": want, "met": bool(ok)})
    return out


def traffic_bytes(qtype: str, nt: int, od: int, id_: int) -> int:
    """The fewest bytes one GEMM must move through HBM: the weights once (their GGUF bytes), the 16-bit
    activations once, the f32 output once."""
    bpw = {"q4_K": 4.5, "q6_K": 6.5625}[qtype]
    return int(od * id_ * bpw / 8 + 2 * nt * id_ + 4 * nt * od)


#: the Nsight Compute metrics the round shows (section, metric name as ncu prints it)
NCU_METRICS = [("GPU Speed Of Light Throughput", "Duration"), ("GPU Speed Of Light Throughput", "SM Frequency"),
               ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
               ("GPU Speed Of Light Throughput", "SM Active Cycles"), ("GPU Speed Of Light Throughput", "Elapsed Cycles"),
               ("GPU Speed Of Light Throughput", "DRAM Throughput"), ("Compute Workload Analysis", "Issue Slots Busy"),
               ("Compute Workload Analysis", "Executed Ipc Active"), ("Scheduler Statistics", "No Eligible"),
               ("Scheduler Statistics", "Eligible Warps Per Scheduler"),
               ("Warp State Statistics", "Warp Cycles Per Issued Instruction"),
               ("Occupancy", "Achieved Active Warps Per SM"), ("Memory Workload Analysis", "L2 Hit Rate"),
               # shared memory is L1/TEX traffic: the shared-memory form's limit
               ("GPU Speed Of Light Throughput", "L1/TEX Cache Throughput"), ("Memory Workload Analysis", "Mem Pipes Busy")]


#: the tile scheduler of a profiled launch, as the Nsight Compute figures name it
SCHED_LABEL = {0: "data-par.", 1: "stream-K", 2: "split-k", 3: "tile split"}


def ncu_label(kernel_key: str, sk: int, nt: int, sep: str = "\n") -> str:
    """A profiled kernel as the Nsight Compute figures label it: type, tile, form (shared-memory, AQ=4), then
    ``sep`` and the scheduler and nt -- e.g. 'q4_K BN=256\ntile split nt=512'."""
    head = (f"{'q4_K' if 'QT=4' in kernel_key else 'q6_K'} BN={kernel_key.split('BN=')[1].split(',')[0]}"
            f"{' smem' if kernel_key.startswith('wgmma_kqs') else ''}{' AQ=4' if 'AQ=4' in kernel_key else ''}")
    return f"{head}{sep}{SCHED_LABEL[int(sk)]} nt={nt}"


def ncu_table(sections_df):
    """One row per profiled kernel (variant, nt) and one column per metric of :data:`NCU_METRICS`, numeric."""
    import pandas as pd

    want = {m for _, m in NCU_METRICS}
    d = sections_df[sections_df.metric.isin(want)].copy()
    d["value"] = pd.to_numeric(d.value.astype(str).str.replace(",", ""), errors="coerce")
    units = d.groupby("metric").unit.first().to_dict()
    if "sk" not in d:   # runs before the stream-K scheduler: data-parallel
        d["sk"] = 0
    t = d.pivot_table(index=["case", "kernel", "sk", "nt", "od", "id"], columns="metric", values="value").reset_index()
    t.columns.name = None
    t = t.rename(columns={m: f"{m} [{units[m]}]" if isinstance(units.get(m), str) and units.get(m) else m
                          for m in want})
    return t


def suffix_ab(ab_df, suffixes=("_a4", "_p1", "_p2")):
    """A build-option A/B (``wgmma_aq_ab``, ``wgmma_pf_ab``) as speedups: for every variant named ``base + suffix``
    timed beside ``base`` at the same (qtype, od, id, nt), median(base) / median(variant) over the interleaved pairs
    (> 1: the option is faster), with each one's ratio to cuBLAS fp16 (cached) at that point; ``launch`` names the
    base's tile and scheduler (e.g. 'BN=256 stream-K')."""
    import pandas as pd

    m = medians(ab_df)
    key = ["qtype", "od", "id", "nt"]
    us = m.set_index(key + ["variant"]).median_us
    rows = []
    for (q, od, id_, nt, v), t in us.items():
        for sfx in suffixes:
            if v.endswith(sfx) and (q, od, id_, nt, v[:-len(sfx)]) in us.index:
                base = us[(q, od, id_, nt, v[:-len(sfx)])]
                cb = us.get((q, od, id_, nt, "cublas_f16_cached"), np.nan)
                bp = variant_params(v[:-len(sfx)], q)[1]
                rows.append({"qtype": q, "od": od, "id": id_, "nt": nt, "option": sfx[1:], "base": v[:-len(sfx)],
                             "launch": f"BN={bp['BN']} {SCHED_LABEL[bp['SK']]}",
                             "speedup": base / t, "base_vs_cublas": cb / base, "option_vs_cublas": cb / t})
    return pd.DataFrame(rows)


def build_ab_view(run, name: str):
    """A recorded bitwise build A/B (:func:`builds_ab`'s ``wgmma_<name>_ab`` and ``wgmma_<name>_gate`` tables, the
    build's variants named ``<variant>_<name>``) as the page shows it: the per-launch speedups (:func:`suffix_ab`:
    plain time / build time, each one's ratio to cuBLAS) and one line on its gates -- how many launches, whether
    every one was bitwise the plain build and passed its parity gate."""
    t = suffix_ab(run.table(f"wgmma_{name}_ab"), suffixes=(f"_{name}",))
    g = run.table(f"wgmma_{name}_gate")
    line = (f"run {run.run_id}: {len(g)} launches gated at their points, bitwise the plain build: "
            f"{bool(g[f'bitwise_vs_{name}'].all())}, parity gates passed: {bool(g.ok.all())}")
    return t, line


def lead_view(run):
    """The timing A/B (:func:`lead_ab`'s ``wgmma_lead_ab``) per (qtype, od, id, nt): under each timing the best
    wgmma launch (median over the rounds of each launch's medians) and cuBLAS fp16 (cached), their ratio, and the
    host times of both calls, with the flush's device time -- what the page tables and plots."""
    import pandas as pd

    b = run.table("wgmma_lead_ab")
    med = b.groupby(["qtype", "od", "id", "nt", "timing", "variant"], as_index=False).agg(
        us=("median_us", "median"), host_us=("host_us", "median"), flush_us=("flush_us", "first"))
    rows = []
    for (q, od, id_, nt, t), g in med.groupby(["qtype", "od", "id", "nt", "timing"], sort=False):
        wg = g[g.variant.str.startswith("wgmma_bn")].sort_values("us").iloc[0]
        cb = g[g.variant == "cublas_f16_cached"].iloc[0]
        rows.append({"qtype": q, "od": od, "id": id_, "nt": nt, "timing": t, "best launch": wg.variant,
                     "wgmma us": wg.us, "cuBLAS us": cb.us, "ratio": cb.us / wg.us,
                     "wgmma host us": wg.host_us, "cuBLAS host us": cb.host_us, "flush us": wg.flush_us})
    return pd.DataFrame(rows)


NCU_COMPARE = ("tensor pipe % active", "long_scoreboard", "short_scoreboard", "math_pipe_throttle")


def ncu_compare(plain_sections, build_sections, columns=NCU_COMPARE):
    """Two ncu runs of the same driver cases -- the plain build's and an exploratory build's -- side by side: per
    kernel and grid present in both (:func:`ncu_stalls`), each of ``columns`` as '<column> plain' and '<column>
    build', the launch named by :func:`ncu_label`."""
    import pandas as pd

    a, b = ncu_stalls(plain_sections, 0.0), ncu_stalls(build_sections, 0.0)
    if a.empty or b.empty:
        return pd.DataFrame()
    key = ["kernel", "sk", "nt"]
    cols = [c for c in columns if c in a.columns and c in b.columns]
    m = a[key + cols].merge(b[key + cols], on=key, suffixes=(" plain", " build"))
    m.insert(0, "launch", [ncu_label(k, s, n, ", ") for k, s, n in zip(m.kernel, m.sk, m.nt)])
    return m[["launch", "kernel", "sk", "nt"] + [f"{c} {w}" for c in cols for w in ("plain", "build")]]


#: the stall reasons the ncu step records (raw metrics, warps stalled per issued instruction)
_STALL = "smsp__average_warps_issue_stalled_"


def ncu_stalls(sections_df, min_share: float = 0.1):
    """Per profiled kernel (case): each stall reason's warps per issued instruction (``--metrics`` of the ncu step;
    empty for runs without them) -- the reasons above ``min_share`` at some case, 'selected' (the issuing warp
    itself) left out -- and the tensor pipe's active cycles (% of peak over elapsed and over active cycles)."""
    import pandas as pd

    d = sections_df[sections_df.metric.astype(str).str.startswith((_STALL, "sm__pipe_tensor_cycles_active"))].copy()
    if d.empty:
        return pd.DataFrame()
    d["value"] = pd.to_numeric(d.value.astype(str).str.replace(",", ""), errors="coerce")
    d["metric"] = (d.metric.str.replace(_STALL, "", regex=False).str.replace("_per_issue_active.ratio", "", regex=False)
                   .str.replace("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_", "tensor pipe % ", regex=False))
    t = d.pivot_table(index=["case", "kernel", "sk", "nt"], columns="metric", values="value").reset_index()
    t.columns.name = None
    reasons = [c for c in t.columns if c not in ("case", "kernel", "sk", "nt", "selected")
               and not c.startswith("tensor pipe") and t[c].max() >= min_share]
    reasons.sort(key=lambda c: -t[c].mean())
    pipe = [c for c in t.columns if c.startswith("tensor pipe")]
    return t[["case", "kernel", "sk", "nt"] + pipe + reasons]
