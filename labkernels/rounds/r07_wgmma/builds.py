"""Round 7's exploratory and ablation builds of the wgmma_kq kernels, and their launcher.

A build is the registry's instantiations compiled from round 7's own source (``kernels/wgmma_kq_experiments.cu``:
the production device code with a build policy's hooks on, and the KPAIR body) with ``LK_ABLATE_*`` / ``LK_EXP_*``
-D names; its sorted names are its identity, in the cubin cache (:func:`labkernels.wgmma._cubin`) and in every
recorded run's ``defines``. :func:`gemm` is :func:`labkernels.wgmma.gemm` with a ``defines`` argument: the same checks
and schedulers on a build's kernel, the KPAIR build's own launch shape (:func:`_gemm_kpair`). ``LABKERNELS_WG_DEFINES``
names the build of the round's subprocess runs (sanitizer, Nsight Compute: :func:`build_defines`); the product's
:func:`labkernels.wgmma.kernel` never reads it."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from ... import wgmma
from ...errors import ShapeError
from ...gpu import _out
from ...kernels import registry

_DEFINE = re.compile(r"LK_(ABLATE|EXP)_\w+")


class BuildError(ValueError):
    """Build -D names round 7's source does not build: not a sequence of names, not ``LK_ABLATE_*`` / ``LK_EXP_*``,
    a retired form's or an unknown one."""

#: round 7's source of exploratory and ablation builds: the production device code (kernels/wgmma_kq.cuh) with a build
#: policy's hooks on, and the KPAIR body, each selected by its -D name. A build with ``defines`` compiles it instead of
#: the registry's source, with the same registry instantiations (the kernels' names and parameters are the same)
EXPERIMENTS = {"wgmma_kq.cu": Path(__file__).resolve().parent / "kernels" / "wgmma_kq_experiments.cu"}
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
    :data:`BUILD_NAMES` is refused (a retired form's with the commit that builds it) -- and so is a single string,
    which would be read a character at a time: BuildError, naming what was given and what is built."""
    if isinstance(defines, (str, bytes)) or not isinstance(defines, (tuple, list, set, frozenset)):
        raise BuildError(f"build defines are a tuple or list of -D names (e.g. ('LK_EXP_TRACE',)), not "
                         f"{type(defines).__name__} {defines!r}")
    bad = [d for d in defines if not isinstance(d, str) or not _DEFINE.fullmatch(d)]
    if bad:
        raise BuildError(f"build defines must be LK_ABLATE_* or LK_EXP_* names, got {bad}: this tree builds "
                         f"{', '.join(BUILD_NAMES)}")
    gone = [d for d in defines if d in RETIRED_BUILDS]
    if gone:
        raise BuildError(f"{', '.join(gone)}: a form that lost and left the kernel source; it builds at commit "
                         f"{RETIRED_BUILDS[gone[0]]} (its step and command: labkernels gpu check --round 7 --list)")
    unknown = [d for d in defines if d not in BUILD_NAMES]
    if unknown:
        raise BuildError(f"no build {unknown}: this tree builds {', '.join(BUILD_NAMES)}")
    return tuple(sorted(set(defines)))


def build_flags(defines) -> list[str]:
    """The nvcc flags of a build's -D names, and the constants they need (the KPAIR ring's stages per consumer
    warpgroup, one number for the kernel and :func:`kpair_ring_bytes`)."""
    flags = [f"-D{d}" for d in defines]
    if "LK_EXP_KPAIR" in defines:
        flags.append(f"-DLK_KPAIR_HALF_STAGES={KPAIR_HALF_STAGES}")
    return flags


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
    token tile; a padded tile computes clamped rows and stores none) x ceil(nt / 256) token tiles. ShapeError unless
    nt and od are integers >= 1."""
    wgmma._positive_ints("kpair_grid", nt=nt, od=od)
    mt = -(-int(od) // 64)
    return (mt + (mt & 1)) * -(-int(nt) // 256)


def cubin(source: str, defines: tuple = ()) -> tuple[str, dict]:
    """:func:`labkernels.wgmma._cubin` of a build: the registry's source for ``()``, else round 7's source of the
    builds (:data:`EXPERIMENTS`) with the -D names ``defines`` (unchecked: the source's own guards refuse what it
    does not build)."""
    if not defines:
        return wgmma._cubin(source)
    return wgmma._cubin(source, str(EXPERIMENTS[source]), tuple(build_flags(defines)))


@lru_cache(maxsize=None)
def kernel_built(defines: tuple, family: str = "wgmma_kq", **params) -> wgmma.WgKernel:
    """:func:`labkernels.wgmma.kernel` of an ablation / exploratory build (``defines``: ``LK_ABLATE_*`` / ``LK_EXP_*``
    names of :data:`BUILD_NAMES`). Cached by its arguments as given: a trace reads its globals from the module of the
    kernel object :func:`gemm` launches, so callers name a build's parameters as :func:`gemm` does (the register
    form's by keywords alone)."""
    spec = registry.find(family, **params)
    defines = check_defines(defines)
    if not defines:
        return wgmma.WgKernel(spec)
    return wgmma.WgKernel(spec, defines=defines, src=str(EXPERIMENTS[spec.source]),
                          extra_flags=tuple(build_flags(defines)), extra_smem=kpair_ring_bytes(spec, defines))


def gemm(w, x, out=None, BN: int = 128, STAGES: int = 4, BF16: int | None = None, SCL: int = 0, SK: int = 0,
         FORM: int = 0, EPI: int = 0, AQ: int = 2, PF: int = 0, defines: tuple = ()):
    """:func:`labkernels.wgmma.gemm` on the build ``defines`` (``LK_ABLATE_*`` / ``LK_EXP_*`` names of
    :data:`BUILD_NAMES`, e.g. ``("LK_ABLATE_NOCONV",)``; ``()`` the plain build), for A/B runs: the same checks of
    the launch, then the build's kernel -- an ``LK_EXP_KPAIR`` build on its one launch shape (:func:`_gemm_kpair`),
    every other on the plain launch's grid (``LK_ABLATE_EMPTY`` sized by the plain build's resident CTAs: it holds no
    registers, so more of it fit an SM, which would give the stream-K grid more CTAs than the launch whose floor it
    measures)."""
    defines = check_defines(defines)
    if not defines:
        return wgmma.gemm(w, x, out=out, BN=BN, STAGES=STAGES, BF16=BF16, SCL=SCL, SK=SK, FORM=FORM, EPI=EPI, AQ=AQ,
                          PF=PF)
    x16, bf16 = wgmma.activations(w, x, BF16)
    family, kp = wgmma.kernel_params(w, BN, STAGES, bf16, SCL, SK, FORM, EPI, AQ, PF)
    if family != "wgmma_kq":
        return wgmma.launch(kernel_built(defines, family, **kp), w, x16, out, BN, SK, EPI)
    k = kernel_built(defines, **kp)
    if "LK_EXP_KPAIR" in k.defines:
        return _gemm_kpair(k, w, x16, out, dict(BN=BN, STAGES=STAGES, BF16=bf16, SCL=SCL, SK=SK, EPI=EPI, AQ=AQ, PF=PF))
    res = wgmma.kernel(**kp).blocks_per_sm if "LK_ABLATE_EMPTY" in k.defines else None
    return wgmma.launch(k, w, x16, out, BN, SK, EPI, blocks_per_sm=res)


def _gemm_kpair(k, w, x16, out, prm: dict):
    """:func:`gemm` on an ``LK_EXP_KPAIR`` build: its one launch shape (:data:`KPAIR_PARAMS`; anything else is refused,
    never run another way), the activation map's box half a stage (128 tokens: each CTA of a cluster loads one half
    and multicasts it), clusters of 2."""
    if prm != KPAIR_PARAMS:
        raise ShapeError(f"LK_EXP_KPAIR is built for {KPAIR_PARAMS} only, asked {prm}")
    cp = wgmma._cp()
    nt, id_ = x16.shape
    y = _out(nt, w.od, out)
    # the stream-K workspace: unread by the build
    ws, flags = wgmma._WS.get(cp.cuda.get_current_stream().ptr, wgmma._sm_count(cp.cuda.Device().id))
    ymap = wgmma.output_map(y, 128) if "LK_EXP_KPAIR_FIN" in k.defines else wgmma.NO_MAP   # FIN: Y leaves by TMA stores
    k.launch((kpair_grid(nt, w.od), 1), (wgmma.tensor_map(x16, 128), ymap), w.packed, y, np.int32(nt), np.int32(w.od),
             np.int32(id_), ws, flags, np.int32(0), np.int32(0), cluster=2)
    return y
