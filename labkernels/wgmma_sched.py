"""Round 7's launch configurations and their host model (CPU only): the typed variant (:class:`Variant`, its ``name``
as runs and CSVs carry it), the tile schedulers of ``wgmma_kq`` (:func:`schedule`: data-parallel, stream-K, uniform
and tile-aligned split-k; the kernel's segments, :func:`segments`) and the one table of the scheduler x epilogue fit
rules (:data:`FIT_RULES`) that ``dispatch.choose`` falls back by and :func:`labkernels.wgmma.gemm` refuses by.
Re-exported by :mod:`labkernels.wgmma`."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import ShapeError
from .kernels import registry
from .wgmma_pack import QK

_VARIANT = re.compile(r"wgmma_bn(\d+)_s(\d+)_scl(\d)(_sku|_skt|_sk)?(?:_e([12345]))?(?:_a(4))?(?:_p([12]))?$")
_VARIANT_SMEM = re.compile(r"wgmma_smem_bn(\d+)_s(\d+)(_sku|_skt|_sk)?(_c2)?$")


#: the scheduler in a variant's name: data-parallel, stream-K, uniform split-k, tile-aligned split-k
_SK_SUFFIX = {0: "", 1: "_sk", 2: "_sku", 3: "_skt"}


def _sk_of(suffix) -> int:
    return {v: k for k, v in _SK_SUFFIX.items()}[suffix or ""]


class VariantError(ValueError):
    """A round-7 variant the family does not have: a name :meth:`Variant.parse` cannot read, or a field (BN, STAGES,
    SCL, SK, FORM, EPI, AQ, PF) outside the values it is built with."""


#: the values each field of a :class:`Variant` may take (STAGES: any count >= 1; the registry says which are built)
VARIANT_FIELDS = {"BN": (128, 256), "SCL": (0, 1, 2), "SK": (0, 1, 2, 3), "FORM": (0, 1, 2), "EPI": (0, 1, 2, 3, 4, 5),
                  "AQ": (2, 4), "PF": (0, 1, 2)}


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _positive_ints(what: str, **values) -> None:
    """ShapeError unless every value is an integer >= 1 (O(1), for the host model's public functions)."""
    for name, v in values.items():
        if not _is_int(v):
            raise ShapeError(f"{what}: {name} must be an integer, got {v!r} ({type(v).__name__})")
        if v < 1:
            raise ShapeError(f"{what}: {name} must be >= 1, got {v}")


@dataclass(frozen=True)
class Variant:
    """A round-7 launch configuration, typed end to end: tile ``BN``, ``STAGES``, scale form ``SCL``, scheduler
    ``SK`` (:func:`schedule`), ``FORM`` (0 register, 1 / 2 shared memory), epilogue ``EPI``, A-fragment sets ``AQ``,
    L2 prefetch ``PF`` -- the keywords of :func:`~labkernels.wgmma.gemm`. :attr:`name` is the one string runs,
    tables and CSVs carry (``wgmma_bn256_s4_scl0_skt_e5``); :meth:`parse` reads it back; :attr:`params` are the
    keywords as the recorded choice table (:func:`~labkernels.wgmma.auto_table`) and ``dispatch.choose`` hold them.
    The shape-dependent rules a variant must meet are :data:`FIT_RULES`; the built combinations are the registry's."""
    BN: int
    STAGES: int
    SCL: int = 0
    SK: int = 0
    FORM: int = 0
    EPI: int = 0
    AQ: int = 2
    PF: int = 0

    def __post_init__(self):
        for name in ("BN", "STAGES", *VARIANT_FIELDS):
            v = getattr(self, name)
            if not _is_int(v):
                raise VariantError(f"variant field {name} must be an integer, got {v!r} ({type(v).__name__})")
            allowed = VARIANT_FIELDS.get(name)
            if allowed is not None and v not in allowed:
                raise VariantError(f"{name} is {', '.join(map(str, allowed[:-1]))} or {allowed[-1]}, not {v!r}")
        if self.STAGES < 1:
            raise VariantError(f"STAGES must be >= 1, not {self.STAGES!r}")
        if self.FORM and (self.EPI or self.AQ != 2 or self.PF):
            raise VariantError("the shared-memory form has the plain epilogue only (EPI=0) and no register A sets (AQ)")

    @property
    def name(self) -> str:
        """The variant's name: tile, stages, scale form, then the scheduler (``_sk`` / ``_sku`` / ``_skt``), the
        epilogue form (``_e1`` ... ``_e5``; none for the plain one), the A-fragment sets (``_a4``; none for AQ=2), the L2
        prefetch distance (``_p1`` / ``_p2``; none without). The shared-memory form: ``wgmma_smem_bn{BN}_s{STAGES}``,
        the scheduler, ``_c2`` with two converter warpgroups (FORM=2)."""
        if self.FORM:
            return f"wgmma_smem_bn{self.BN}_s{self.STAGES}" + _SK_SUFFIX[int(self.SK)] + ("_c2" if self.FORM == 2 else "")
        return (f"wgmma_bn{self.BN}_s{self.STAGES}_scl{self.SCL}" + _SK_SUFFIX[int(self.SK)]
                + (f"_e{int(self.EPI)}" if self.EPI else "") + (f"_a{int(self.AQ)}" if self.AQ != 2 else "")
                + (f"_p{int(self.PF)}" if self.PF else ""))

    @classmethod
    def parse(cls, name: str) -> "Variant":
        """The variant a name (:attr:`name`) stands for; VariantError for anything else."""
        if not isinstance(name, str):
            raise VariantError(f"a round-7 variant name is a str (e.g. 'wgmma_bn128_s4_scl0'), not "
                               f"{type(name).__name__} {name!r}")
        m = _VARIANT_SMEM.match(name)
        if m:
            return cls(int(m.group(1)), int(m.group(2)), SK=_sk_of(m.group(3)), FORM=2 if m.group(4) else 1)
        m = _VARIANT.match(name)
        if not m:
            raise VariantError(f"not a round-7 variant name: {name!r} (wgmma_bn{{BN}}_s{{STAGES}}_scl{{SCL}}"
                               "[_sk|_sku|_skt][_e1.._e5][_a4][_p1|_p2] or "
                               "wgmma_smem_bn{BN}_s{STAGES}[_sk|_sku|_skt][_c2])")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), SK=_sk_of(m.group(4)),
                   EPI=int(m.group(5) or 0), AQ=int(m.group(6) or 2), PF=int(m.group(7) or 0))

    @property
    def params(self) -> dict:
        """The gemm keywords (f16): the register form's EPI / AQ / PF only where its name has them, the
        shared-memory form's FORM and no SCL -- the recorded choice table's form of them."""
        if self.FORM:
            return {"BN": self.BN, "STAGES": self.STAGES, "BF16": 0, "SK": self.SK, "FORM": self.FORM}
        p = {"BN": self.BN, "STAGES": self.STAGES, "BF16": 0, "SCL": self.SCL, "SK": self.SK}
        p.update({k: v for k, v, plain in (("EPI", self.EPI, 0), ("AQ", self.AQ, 2), ("PF", self.PF, 0)) if v != plain})
        return p

    def replace(self, **changes) -> "Variant":
        return dataclasses.replace(self, **changes)


def variant_name(BN: int, STAGES: int, SCL: int, SK: int = 0, FORM: int = 0, EPI: int = 0, AQ: int = 2,
                 PF: int = 0) -> str:
    """The one name of a round-7 variant (:attr:`Variant.name`)."""
    return Variant(BN, STAGES, SCL, SK, FORM, EPI, AQ, PF).name


def tile_count(nt: int, od: int, BN: int) -> int:
    """The output tiles of a launch: 128 weight rows x BN tokens each, tails rounded up (ShapeError unless nt, od and
    BN are integers >= 1)."""
    _positive_ints("tile_count", nt=nt, od=od, BN=BN)
    return _tiles(nt, od, BN)


def _tiles(nt: int, od: int, BN: int) -> int:
    """:func:`tile_count` of arguments already checked (the launch path)."""
    return ((od + 127) // 128) * ((nt + BN - 1) // BN)


#: the token-tile widths the wgmma kernels are built with (registry family wgmma_kq, parameter BN)
BN_VALUES = (128, 256)


def check_launch_shape(nt, od, id_, BN, sm_count, what: str = "wgmma") -> None:
    """ShapeError unless nt, od >= 1, id a positive multiple of 256, BN one of :data:`BN_VALUES` and sm_count >= 1,
    all integers (host-side, O(1): the launch paths call it)."""
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
        raise ShapeError(f"SK is 0 (data-parallel), 1 (stream-K), 2 (uniform split-k) or 3 (tile-aligned split-k), "
                         f"not {sk!r}")
    check_launch_shape(nt, od, id_, BN, sm_count, "schedule")
    tiles = _tiles(nt, od, BN)
    nsb = id_ // QK
    if tiles * nsb >= 2 ** 31 or od * nsb >= 2 ** 31:
        raise ShapeError(f"{nt} x {od} x {id_} exceeds the kernel's 32-bit iteration and block counts")
    if not sk:
        return tiles, tiles
    if sk in (2, 3):
        g = split_parts(sk, tiles, nsb, sm_count)
        if g < 2:
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
    G x ``tiles`` <= ``sm_count``; 1 where only G = 1 fits (no split), 0 where not even one wave of tiles does.
    ShapeError unless all three are integers >= 1."""
    _positive_ints("uniform_split", tiles=tiles, nsb=nsb, sm_count=sm_count)
    fit = [g for g in range(1, nsb + 1) if nsb % g == 0 and g * tiles <= sm_count]
    return max(fit) if fit else 0


def tile_split(tiles: int, nsb: int, sm_count: int) -> int:
    """G of the tile-aligned split-k grid (``SK=3``): the fewest parts per tile that give the shortest longest part
    ceil(nsb / G) the SMs allow (G x ``tiles`` <= ``sm_count``, G <= ``nsb``); fewer parts mean fewer partial tiles
    to fold for the same critical path. 1 where only one part fits, 0 where not even one wave of tiles does.
    ShapeError unless all three are integers >= 1."""
    _positive_ints("tile_split", tiles=tiles, nsb=nsb, sm_count=sm_count)
    gmax = min(int(nsb), int(sm_count) // int(tiles))
    if gmax < 1:
        return 0
    longest = -(-nsb // gmax)
    return min(g for g in range(1, gmax + 1) if -(-nsb // g) == longest)


def split_parts(sk: int, tiles: int, nsb: int, sm_count: int) -> int:
    """G, the CTAs per tile of a split-k grid: SK=2 :func:`uniform_split`, SK=3 :func:`tile_split`."""
    return uniform_split(tiles, nsb, sm_count) if sk == 2 else tile_split(tiles, nsb, sm_count)


def split_g(sk: int, nt: int, od: int, id_: int, BN: int, sm_count: int) -> int:
    """The kernel's ``split_g`` argument: SK=3's G (:func:`tile_split`), 0 for every other scheduler. ShapeError for
    an unknown scheduler or a launch shape :func:`check_launch_shape` refuses."""
    _check_sk(sk, "split_g")
    check_launch_shape(nt, od, id_, BN, sm_count, "split_g")
    return split_parts(3, _tiles(nt, od, BN), id_ // QK, sm_count) if sk == 3 else 0


def _check_sk(sk, what: str) -> None:
    if not _is_int(sk) or sk not in _SK_SUFFIX:
        raise ShapeError(f"{what}: SK is 0 (data-parallel), 1 (stream-K), 2 (uniform split-k) or 3 (tile-aligned "
                         f"split-k), not {sk!r}")


def sk_fits(sk: int, nt: int, od: int, id_: int, BN: int, sm_count: int) -> bool:
    """Whether :func:`schedule` takes this scheduler at this shape (SK=2 and SK=3 refuse shapes). ShapeError for an
    unknown scheduler or a launch shape :func:`check_launch_shape` refuses (an error, not False: no scheduler fits
    it)."""
    _check_sk(sk, "sk_fits")
    check_launch_shape(nt, od, id_, BN, sm_count, "sk_fits")
    return sk not in (2, 3) or split_parts(sk, _tiles(nt, od, BN), id_ // QK, sm_count) >= 2


def pair_fits(nt: int, od: int, id_: int, BN: int, sm_count: int) -> bool:
    """Whether EPI=3 takes this shape: SK=3 gives exactly two CTAs per tile (its 2-CTA clusters)."""
    return split_g(3, nt, od, id_, BN, sm_count) == 2


def reduce_fits(sk: int, nt: int, od: int, id_: int, BN: int, sm_count: int) -> bool:
    """Whether EPI=5 takes this launch: the scheduler's grid fits (:func:`sk_fits`) and its tiles have at most two
    CTAs each (:func:`reduce_finish_fits`)."""
    if not sk_fits(sk, nt, od, id_, BN, sm_count):
        return False
    ncta, dp = schedule(sk, nt, od, id_, BN, sm_count)
    return reduce_finish_fits(ncta, id_ // QK, _tiles(nt, od, BN), dp, split_g(sk, nt, od, id_, BN, sm_count))


@dataclass(frozen=True)
class FitRule:
    """One shape-dependent rule of the register form's scheduler x epilogue: the variants it constrains
    (``applies``), whether a launch shape takes them (``fits(v, nt, od, id, sm_count)``), what ``auto`` runs instead
    (``fallback``) and the reason it gives (``why(v, nt, od, id)``). :func:`~labkernels.wgmma.gemm` refuses a launch
    that breaks one (ShapeError); ``dispatch.choose`` falls back through :func:`fit`."""
    name: str
    applies: Callable[[Variant], bool]
    fits: Callable[[Variant, int, int, int, int], bool]
    fallback: Callable[[Variant], Variant]
    why: Callable[[Variant, int, int, int], str]


def _split_why(v: Variant, nt: int, od: int, id_: int) -> str:
    grid = {2: "uniform", 3: "tile-aligned"}[v.SK]
    why = f"its {grid} split-k grid (SK={v.SK}) does not fit {od}x{id_} nt={nt}: stream-K (SK=1)"
    if v.EPI in (1, 2, 3):     # these epilogue forms take one segment per CTA: not stream-K
        why += f" with the plain epilogue (EPI={v.EPI} takes one segment per CTA)"
    return why


#: the scheduler / epilogue fit rules, in the order ``auto`` applies them (a fallback may make a later rule moot)
FIT_RULES = (
    FitRule("split-k grid", lambda v: v.SK in (2, 3),
            lambda v, nt, od, id_, sm: sk_fits(v.SK, nt, od, id_, v.BN, sm),
            lambda v: v.replace(SK=1, EPI=0 if v.EPI in (1, 2, 3) else v.EPI), _split_why),
    FitRule("TMA store rows", lambda v: v.EPI == 2, lambda v, nt, od, id_, sm: od % 4 == 0,
            lambda v: v.replace(EPI=1),
            lambda v, nt, od, id_: f"its TMA-store epilogue (EPI=2) needs od % 4 == 0, od={od}: the bulk fold alone "
                                   "(EPI=1)"),
    FitRule("staged store rows", lambda v: v.EPI in (4, 5), lambda v, nt, od, id_, sm: od % 4 == 0,
            lambda v: v.replace(EPI=0),
            lambda v, nt, od, id_: f"its {'staged TMA store' if v.EPI == 4 else 'reduce finish'} (EPI={v.EPI}) needs "
                                   f"od % 4 == 0, od={od}: the plain epilogue (EPI=0)"),
    FitRule("pair exchange", lambda v: v.EPI == 3, lambda v, nt, od, id_, sm: pair_fits(nt, od, id_, v.BN, sm),
            lambda v: v.replace(EPI=0),
            lambda v, nt, od, id_: f"its pair exchange (EPI=3) needs two CTAs per tile, which SK=3 does not give at "
                                   f"{od}x{id_} nt={nt}: the plain epilogue (EPI=0)"),
    FitRule("reduce finish", lambda v: v.EPI == 5,
            lambda v, nt, od, id_, sm: reduce_fits(v.SK, nt, od, id_, v.BN, sm),
            lambda v: v.replace(EPI=4),
            lambda v, nt, od, id_: f"its reduce finish (EPI=5) needs at most two CTAs a tile, which SK={v.SK} does not "
                                   f"give at {od}x{id_} nt={nt}: the staged TMA store (EPI=4)"),
)


def misfit(v: Variant, nt: int, od: int, id_: int, sm_count: int) -> FitRule | None:
    """The first rule of :data:`FIT_RULES` that ``v`` breaks at this shape, or None."""
    return next((r for r in FIT_RULES if r.applies(v) and not r.fits(v, nt, od, id_, sm_count)), None)


@lru_cache(maxsize=4096)
def _launch_misfit(BN: int, STAGES: int, SK: int, EPI: int, nt: int, od: int, id_: int, sm_count: int):
    """(variant, :func:`misfit`) of a launch, cached: gemm asks per call (0.3 us, not 4 us, on the host)."""
    v = Variant(BN, STAGES, SK=SK, EPI=EPI)
    return v, misfit(v, nt, od, id_, sm_count)


def fit(v: Variant, nt: int, od: int, id_: int, sm_count: int) -> tuple[Variant, list[str]]:
    """``v`` made to fit this shape by the rules' fallbacks, in order, and the reasons (``auto``'s choice)."""
    whys = []
    for r in FIT_RULES:
        if r.applies(v) and not r.fits(v, nt, od, id_, sm_count):
            whys.append(r.why(v, nt, od, id_))
            v = r.fallback(v)
    return v, whys


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
