"""GPU gates of round 7's wgmma_kq family (sm_90a): every variant, tails in nt and od, poisoned outputs with
guard regions, fresh random inputs; the gate of :func:`labkernels.wgmma.gate` (float64 gguf reference: max rel
<= 1e-3, NMSE <= 5e-4; the kernel's exact function: <= 1e-5)."""
import numpy as np
import pytest

from labkernels.kernels import registry
from labkernels.rounds.r07_wgmma import builds as wb
from labkernels.rounds.r07_wgmma import traces

pytestmark = pytest.mark.gpu

GUARD = 512


@pytest.fixture(scope="module")
def cp():
    import cupy

    from labkernels import gpu, wgmma

    if not wgmma.supported(gpu.device_props()["cc"]):
        pytest.skip("wgmma_kq needs an sm_90 GPU")
    return cupy


def _weights(rng, qtype, od, id_):
    from labkernels import quants

    w = (rng.standard_normal((od, id_)) * rng.uniform(0.01, 0.1)).astype(np.float32)
    w[rng.integers(0, od), rng.integers(0, id_)] *= 20  # an outlier
    return quants.quantize(w, qtype)


def _run(cp, raw, qtype, x, **params):
    from labkernels import wgmma

    nt, od = x.shape[0], raw.shape[0]
    w = wgmma.WgWeight.from_gguf(raw, qtype, plane=params.get("SCL") == 2)
    if params.get("FORM"):
        w.gguf = cp.asarray(np.ascontiguousarray(raw))   # the shared-memory form reads the GGUF rows as they are
    buf = cp.full(nt * od + 2 * GUARD, np.nan, dtype=cp.float32)
    y = buf[GUARD:GUARD + nt * od].reshape(nt, od)
    wb.gemm(w, cp.asarray(x), out=y, **params)   # the product's launcher, or a build's (defines=...)
    g = cp.asnumpy(buf)
    assert np.isnan(g[:GUARD]).all() and np.isnan(g[-GUARD:]).all(), "write outside the output"
    return cp.asnumpy(y), cp.asnumpy(w.packed)


VARIANTS = [k for k in registry.family("wgmma_kq")]


MAIN_PATH = [k for k in registry.family("wgmma_kq") + registry.family("wgmma_kqs") if k.main_path]


@pytest.mark.gpu_fast
@pytest.mark.parametrize("spec", MAIN_PATH, ids=[k.key for k in MAIN_PATH])
def test_every_main_path_instantiation_once(cp, rng, spec):
    """The fast tier: each production instantiation (both forms) once, tails in nt and od, on the data-parallel grid
    and on stream-K where its epilogue takes it; the gate (exact function and float64)."""
    from labkernels import wgmma

    qtype = "q4_K" if spec.p["QT"] == 4 else "q6_K"
    nt, od, id_ = 77, 200, 768
    raw = _weights(rng, qtype, od, id_)
    x = (rng.standard_normal((nt, id_)) * rng.uniform(0.5, 4)).astype(np.float32)
    if spec.family == "wgmma_kqs":
        base = dict(FORM=spec.p["NCV"], BN=spec.p["BN"], STAGES=spec.p["STAGES"], BF16=spec.p["BF16"])
    else:
        base = dict(BN=spec.p["BN"], STAGES=spec.p["STAGES"], BF16=spec.p["BF16"], SCL=spec.p["SCL"],
                    EPI=spec.p["EPI"], AQ=spec.p["AQ"], PF=spec.p["PF"])
    for sk in (0, 1):
        if sk == 1 and base.get("EPI") in (1, 2):
            continue                    # the ring epilogues take one segment per CTA (refusal: test_wgmma_parity)
        if base.get("EPI") == 2 and od % 4:
            continue
        y, packed = _run(cp, raw, qtype, x, SK=sk, **base)
        g = wgmma.gate(y, raw, qtype, x, packed=packed, bf16=bool(spec.p["BF16"]))
        assert g["nonfinite"] == 0 and g["ok"], (spec.key, sk, g)


@pytest.mark.parametrize("sk", [0, 1], ids=["dp", "sk"])
@pytest.mark.parametrize("spec", VARIANTS, ids=[k.key for k in VARIANTS])
@pytest.mark.parametrize("nt,od,id_", [(1, 128, 256), (77, 200, 512), (300, 256, 768), (520, 130, 1024)])
def test_wgmma_parity(cp, rng, spec, nt, od, id_, sk):
    from labkernels import errors, wgmma

    qtype = "q4_K" if spec.p["QT"] == 4 else "q6_K"
    raw = _weights(rng, qtype, od, id_)
    x = (rng.standard_normal((nt, id_)) * rng.uniform(0.5, 4)).astype(np.float32)
    params = dict(BN=spec.p["BN"], STAGES=spec.p["STAGES"], BF16=spec.p["BF16"], SCL=spec.p["SCL"], SK=sk,
                  EPI=spec.p["EPI"], AQ=spec.p["AQ"], PF=spec.p["PF"])
    if spec.p["EPI"] == 3:   # the pair exchange runs on SK=3 only (test_wgmma_pair_exchange_is_bitwise_the_plain_one)
        with pytest.raises(errors.ShapeError, match="stream-K|EPI=3"):
            _run(cp, _weights(rng, "q4_K" if spec.p["QT"] == 4 else "q6_K", od, id_), "q4_K" if spec.p["QT"] == 4
                 else "q6_K", np.zeros((nt, id_), np.float32), **params)
        return
    from labkernels import gpu

    epi = spec.p["EPI"]
    # refused, never run: the TMA-store forms (2, 4, 5) need rows of 16-byte multiples; the ring forms (1, 2) take one
    # segment per CTA (not stream-K); the reduce finish (5) takes grids of at most two CTAs a tile
    refuse = {"multiple of 4": epi in (2, 4, 5) and od % 4, "stream-K": epi in (1, 2) and sk == 1,
              "EPI=5 adds": epi == 5 and not wgmma.reduce_fits(sk, nt, od, id_, spec.p["BN"],
                                                              gpu.device_props()["sm_count"])}
    if any(refuse.values()):
        with pytest.raises(errors.ShapeError, match="|".join(k for k, v in refuse.items() if v)):
            _run(cp, raw, qtype, x, **params)
        return
    y, packed = _run(cp, raw, qtype, x, **params)
    g = wgmma.gate(y, raw, qtype, x, packed=packed, bf16=bool(spec.p["BF16"]))
    print(spec.key, nt, od, id_, g)
    assert g["nonfinite"] == 0
    assert g["exact_rel_terms"] <= wgmma.exact_gate(id_), g
    assert g["ok"], g
    if not spec.p["BF16"]:   # smaller than the int8 q8_1 path's error on the same inputs (bf16's 8-bit mantissa
        i8 = wgmma.int8_path_error(raw, qtype, x)            # is about as coarse as q8_1: not asserted)
        assert g["nmse"] < i8["nmse"], (g, i8)


@pytest.mark.parametrize("sk", [0, 1, 3], ids=["dp", "sk", "skt"])
@pytest.mark.parametrize("nt,od,id_", [(77, 200, 512), (300, 256, 2048), (130, 1000, 4096)])
def test_scale_plane_is_bitwise_the_header_decode(cp, rng, nt, od, id_, sk):
    """SCL=2 (q4_K BN=128: the chunk's scale pairs read from the plane written at load) against SCL=0 (decoded
    from the block headers in the loop): the same Y bit for bit, tails in nt and od, rows of weights from ~1e-5 to
    ~10; the plane sits right behind the blocks, 32 bytes per row and super-block."""
    from labkernels import errors, quants, wgmma

    w = rng.standard_normal((od, id_)) * 10.0 ** rng.uniform(-5, 1, (od, 1))
    raw = quants.quantize(w.astype(np.float32), "q4_K")
    if sk == 3 and not wgmma.sk_fits(3, nt, od, id_, 128, wgmma._sm_count(cp.cuda.Device().id)):
        with pytest.raises(errors.ShapeError):
            _run(cp, raw, "q4_K", np.zeros((nt, id_), np.float32), BN=128, SCL=2, SK=sk)
        return
    x = (rng.standard_normal((nt, id_)) * rng.uniform(0.5, 4)).astype(np.float32)
    y_plane, _ = _run(cp, raw, "q4_K", x, BN=128, SCL=2, SK=sk)
    y_hdr, _ = _run(cp, raw, "q4_K", x, BN=128, SCL=0, SK=sk)
    assert np.isfinite(y_plane).all()
    assert np.array_equal(y_plane.view(np.uint32), y_hdr.view(np.uint32))
    assert wgmma.WgWeight.from_gguf(raw, "q4_K").plane is None   # no plane unless asked (the prefill's weights)
    wg = wgmma.WgWeight.from_gguf(raw, "q4_K", plane=True)
    assert wg.plane_bytes == od * (id_ // 256) * wgmma.PLANE_BYTES
    assert wg.plane.data.ptr == wg.packed.data.ptr + wg.packed.nbytes


def test_scale_plane_refuses_what_it_was_not_built_for(cp, rng):
    """SCL=2 is the q4_K f16 BN=128 plain-epilogue build: q6_K, bf16, BN=256 and a weight without its plane get a
    clear error, never a launch."""
    from labkernels import errors, quants, wgmma

    w4 = wgmma.WgWeight.from_gguf(quants.quantize(rng.standard_normal((128, 512)).astype(np.float32), "q4_K"), "q4_K",
                                  plane=True)
    w6 = wgmma.WgWeight.from_gguf(quants.quantize(rng.standard_normal((128, 512)).astype(np.float32), "q6_K"), "q6_K")
    x = cp.asarray(rng.standard_normal((64, 512)).astype(np.float32))
    for w, p in ((w6, {}), (w4, {"BF16": 1}), (w4, {"BN": 256}), (w4, {"EPI": 4})):
        with pytest.raises(errors.ShapeError, match="SCL=2"):
            wgmma.gemm(w, x, SCL=2, **{"BN": 128, **p})
    bare = wgmma.WgWeight(cp.asarray(cp.asnumpy(w4.packed)), "q4_K", w4.od, w4.id, 0.0, w4.nbytes)
    with pytest.raises(errors.ShapeError, match="scale plane"):
        wgmma.gemm(bare, x, BN=128, SCL=2)


MAIN_LOOP_VARIANTS = [k for k in VARIANTS if k.p["EPI"] == 0]


@pytest.mark.parametrize("build", ["LK_EXP_TRACE"])
@pytest.mark.parametrize("sk", [0, 1], ids=["dp", "sk"])
@pytest.mark.parametrize("spec", MAIN_LOOP_VARIANTS, ids=[k.key for k in MAIN_LOOP_VARIANTS])
@pytest.mark.parametrize("nt,od,id_", [(77, 200, 512), (300, 256, 2048), (64, 77, 768)])
def test_exploratory_builds_are_bitwise_the_plain_one(cp, rng, spec, nt, od, id_, sk, build):
    """The A/B builds against the plain one: the same Y bit for bit at every main-loop variant (bf16, SCL=1/2, AQ=4,
    PF included), both schedulers, tails in nt and od (77 rows: a weight box mostly past od, read as zeros; 3
    super-blocks), and scales of both signs and a wide range. LK_EXP_TRACE: the per-CTA phase stamps (round 7's
    source of exploratory builds, the production body with the trace policy's hooks on). (The bitwise builds of
    the steps that lost -- LK_EXP_OLDCONV, LK_EXP_WTMA, LK_EXP_TMAPF, LK_EXP_SPLITFIN -- were checked here up to
    commit 4a8dcd9, which still builds them.)"""

    from labkernels import quants

    qtype = "q4_K" if spec.p["QT"] == 4 else "q6_K"
    w = rng.standard_normal((od, id_)) * 10.0 ** rng.uniform(-5, 1, (od, 1))   # rows from ~1e-5 to ~10
    raw = quants.quantize(w.astype(np.float32), qtype)
    x = (rng.standard_normal((nt, id_)) * rng.uniform(0.5, 4)).astype(np.float32)
    params = dict(BN=spec.p["BN"], STAGES=spec.p["STAGES"], BF16=spec.p["BF16"], SCL=spec.p["SCL"], SK=sk,
                  AQ=spec.p["AQ"], PF=spec.p["PF"])
    y_new, _ = _run(cp, raw, qtype, x, **params)
    y_old, _ = _run(cp, raw, qtype, x, defines=(build,), **params)
    assert np.isfinite(y_new).all()
    assert np.array_equal(y_new.view(np.uint32), y_old.view(np.uint32)), (
        spec.key, int((y_new.view(np.uint32) != y_old.view(np.uint32)).sum()))


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("bn", [128, 256])
@pytest.mark.parametrize("nt,od,id_", [(1100, 4096, 512), (512, 1000, 4096), (37, 640, 2048)])
def test_wgmma_stream_k(cp, rng, qtype, bn, nt, od, id_):
    """Stream-K: data-parallel waves + a stream-K region (1100 x 4096), tiles split over several CTAs (512 x 1000
    x 4096: 8 x 4 tiles of 16 iterations over 132 CTAs), every tile split (37 tokens). Gated, equal to the
    data-parallel result within fp32 summation order, bitwise reproducible, and right on a second launch (the
    owners reset the helpers' flags)."""
    from labkernels import gpu, wgmma

    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    scl = wgmma.main_scl(qtype, bn)
    ncta, dp_tiles = wgmma.schedule(1, nt, od, id_, bn, gpu.device_props()["sm_count"])
    tiles = -(-od // 128) * -(-nt // bn)
    assert ncta <= gpu.device_props()["sm_count"] and dp_tiles % ncta == 0 and dp_tiles < tiles
    _gated_reproducible_near_dp(cp, raw, qtype, x, bn, scl, 1, "stream-K")


def _gated_reproducible_near_dp(cp, raw, qtype, x, bn, scl, sk, what):
    """Scheduler ``sk``'s output: gated against the reference, bitwise equal over two launches, and equal to the
    data-parallel grid's (SK=0) within fp32 summation order."""
    from labkernels import wgmma

    nt = x.shape[0]
    y1, packed = _run(cp, raw, qtype, x, BN=bn, SCL=scl, SK=sk)
    y2, _ = _run(cp, raw, qtype, x, BN=bn, SCL=scl, SK=sk)
    y0, _ = _run(cp, raw, qtype, x, BN=bn, SCL=scl, SK=0)
    g = wgmma.gate(y1, raw, qtype, x, packed=packed, tokens=np.arange(0, nt, max(1, nt // 40)))
    assert g["ok"] and g["nonfinite"] == 0, g
    assert np.array_equal(y1, y2), f"{what} is not bitwise reproducible"
    scale = float(np.abs(y0).max())   # two fp32 summation orders: the kernel's own bound, growing like sqrt(K)
    assert np.abs(y1 - y0).max() <= 2 * wgmma.exact_gate(x.shape[1]) * scale, \
        f"{what} differs from data-parallel beyond summation order"


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("bn", [128, 256])
@pytest.mark.parametrize("nt,od,id_", [(512, 4096, 4096), (300, 1000, 4096), (37, 640, 2048), (1, 130, 1024)])
def test_wgmma_uniform_split(cp, rng, qtype, bn, nt, od, id_):
    """The uniform split-k grid (SK=2, G CTAs a tile): gated with tails in nt and od, equal to data-parallel within
    fp32 summation order, bitwise reproducible over two launches (the flags reset); where G < 2 a clear
    ShapeError before any launch (512 x 4096 at BN=128: 128 tiles)."""
    from labkernels import errors, gpu, wgmma

    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    scl = wgmma.main_scl(qtype, bn)
    if not wgmma.sk_fits(2, nt, od, id_, bn, gpu.device_props()["sm_count"]):
        w = wgmma.WgWeight.from_gguf(raw, qtype)
        with pytest.raises(errors.ShapeError, match="no uniform split-k grid"):
            wgmma.gemm(w, cp.asarray(x), BN=bn, SCL=scl, SK=2)
        return
    _gated_reproducible_near_dp(cp, raw, qtype, x, bn, scl, 2, "the uniform split")


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("bn", [128, 256])
@pytest.mark.parametrize("nt,od,id_", [(512, 4096, 11008), (300, 1000, 1792), (37, 640, 2048), (1, 132, 768)])
def test_wgmma_tile_aligned_split(cp, rng, qtype, bn, nt, od, id_):
    """The tile-aligned split-k grid (SK=3): G parts a tile of floor/ceil(I/G) super-blocks, G not dividing I
    (4096 x 11008: 43 super-blocks in 21 + 22 at BN=256; 1000 x 1792 at BN=128: 7 in 1 + 2 + 2 + 2): gated with
    tails, equal to data-parallel within fp32 summation order, bitwise reproducible; G < 2 a clear ShapeError."""
    from labkernels import errors, gpu, wgmma

    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    scl = wgmma.main_scl(qtype, bn)
    if not wgmma.sk_fits(3, nt, od, id_, bn, gpu.device_props()["sm_count"]):
        w = wgmma.WgWeight.from_gguf(raw, qtype)
        with pytest.raises(errors.ShapeError, match="no tile-aligned split-k grid"):
            wgmma.gemm(w, cp.asarray(x), BN=bn, SCL=scl, SK=3)
        return
    _gated_reproducible_near_dp(cp, raw, qtype, x, bn, scl, 3, "the tile-aligned split")


EPI_SPECS = [k for k in registry.family("wgmma_kq") if k.p["EPI"] in (1, 2)]


@pytest.mark.parametrize("sk", [0, 2, 3], ids=["dp", "sku", "skt"])
@pytest.mark.parametrize("spec", EPI_SPECS, ids=[k.key for k in EPI_SPECS])
@pytest.mark.parametrize("nt,od,id_", [(77, 200, 512), (512, 1000, 4096), (37, 640, 2048)])
def test_wgmma_epilogue_forms_are_bitwise_the_plain_one(cp, rng, spec, nt, od, id_, sk):
    """EPI=1 (the bulk fold through the idle ring) and EPI=2 (and the TMA store) sum the same partials in the same
    order as the plain epilogue: bitwise its output on the same grid, at every one-segment-per-CTA scheduler, with
    tails in nt and od (the TMA unit clips the store), NaN-poisoned outputs and untouched guard regions; twice
    (flags reset). Stream-K (SK=1) is refused before any launch."""
    from labkernels import errors, gpu, wgmma

    qtype = "q4_K" if spec.p["QT"] == 4 else "q6_K"
    bn = spec.p["BN"]
    if not wgmma.sk_fits(sk, nt, od, id_, bn, gpu.device_props()["sm_count"]):
        pytest.skip(f"SK={sk} does not fit {nt} x {od} x {id_} at BN={bn} (refusal tested elsewhere)")
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    p = dict(BN=bn, STAGES=spec.p["STAGES"], SCL=spec.p["SCL"], SK=sk)
    y0, packed = _run(cp, raw, qtype, x, EPI=0, **p)
    if sk == 0:
        with pytest.raises(errors.ShapeError, match="stream-K"):
            _run(cp, raw, qtype, x, EPI=spec.p["EPI"], **{**p, "SK": 1})
    for _ in range(2):
        y, _ = _run(cp, raw, qtype, x, EPI=spec.p["EPI"], **p)
        assert np.array_equal(y, y0), f"{spec.key} SK={sk} differs from the plain epilogue"
    g = wgmma.gate(y, raw, qtype, x, packed=packed, tokens=np.arange(0, nt, max(1, nt // 40)))
    assert g["ok"] and g["nonfinite"] == 0, g


AQ_SPECS = [k for k in registry.family("wgmma_kq") if k.p["AQ"] != 2]


@pytest.mark.parametrize("sk", [0, 1, 2, 3], ids=["dp", "sk", "sku", "skt"])
@pytest.mark.parametrize("spec", AQ_SPECS, ids=[k.key for k in AQ_SPECS])
@pytest.mark.parametrize("nt,od,id_", [(77, 200, 512), (512, 1000, 4096), (37, 640, 2048), (130, 256, 11008)])
def test_wgmma_four_a_sets_are_bitwise_two(cp, rng, spec, nt, od, id_, sk):
    """AQ=4 converts chunk q+1 before the wait for chunk q-1 into a fourth register set; the wgmmas and their order
    into each accumulator are AQ=2's, so its output is bitwise AQ=2's on the same grid, at every scheduler (segments
    starting and ending inside a super-block's chunks, stream-K fix-ups), with tails in nt and od, NaN-poisoned
    outputs and untouched guard regions; twice (ring phases and flags carried over)."""
    from labkernels import gpu, wgmma

    qtype = "q4_K" if spec.p["QT"] == 4 else "q6_K"
    if not wgmma.sk_fits(sk, nt, od, id_, 128, gpu.device_props()["sm_count"]):
        pytest.skip(f"SK={sk} does not fit {nt} x {od} x {id_} at BN=128 (refusal tested elsewhere)")
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    p = dict(BN=128, STAGES=spec.p["STAGES"], SCL=spec.p["SCL"], SK=sk)
    y0, packed = _run(cp, raw, qtype, x, AQ=2, **p)
    for _ in range(2):
        y, _ = _run(cp, raw, qtype, x, AQ=spec.p["AQ"], **p)
        assert np.array_equal(y, y0), f"{spec.key} SK={sk} differs from AQ=2"
    g = wgmma.gate(y, raw, qtype, x, packed=packed, tokens=np.arange(0, nt, max(1, nt // 40)))
    assert g["ok"] and g["nonfinite"] == 0, g


PAIR_SPECS = [k for k in registry.family("wgmma_kq") if k.p["EPI"] == 3]


@pytest.mark.parametrize("spec", PAIR_SPECS, ids=[k.key for k in PAIR_SPECS])
@pytest.mark.parametrize("nt,od,id_", [(77, 200, 512), (512, 4096, 11008), (256, 4000, 1792), (512, 1000, 4096)])
def test_wgmma_pair_exchange_is_bitwise_the_plain_one(cp, rng, spec, nt, od, id_):
    """EPI=3: a tile's two CTAs (SK=3 with G=2, one 2-CTA cluster) swap halves of their partial sums through
    distributed shared memory and each stores half the tile -- the same two numbers added per output (rank 1 in
    the other order: commutative), so bitwise the plain epilogue on the same grid; twice (the mbarriers are
    per launch), tails in nt and od, NaN-poisoned output, guard regions intact. A shape without two CTAs per tile
    is refused, and so is any other scheduler."""
    from labkernels import errors, gpu, wgmma

    qtype = "q4_K" if spec.p["QT"] == 4 else "q6_K"
    bn = spec.p["BN"]
    assert wgmma.kernel(spec.family, **spec.p).max_active_clusters(2) >= 1   # the pairs can be resident at all
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    p = dict(BN=bn, STAGES=spec.p["STAGES"], SCL=spec.p["SCL"])
    sm = gpu.device_props()["sm_count"]
    if not wgmma.sk_fits(3, nt, od, id_, bn, sm):
        with pytest.raises(errors.ShapeError, match="no tile-aligned split-k grid"):
            _run(cp, raw, qtype, x, SK=3, EPI=3, **p)
        return
    if not wgmma.pair_fits(nt, od, id_, bn, sm):
        with pytest.raises(errors.ShapeError, match="EPI=3 pairs"):
            _run(cp, raw, qtype, x, SK=3, EPI=3, **p)
        return
    with pytest.raises(errors.ShapeError, match="EPI=3 exchanges"):
        _run(cp, raw, qtype, x, SK=2 if nt == 77 else 0, EPI=3, **p)
    y0, packed = _run(cp, raw, qtype, x, SK=3, EPI=0, **p)
    for _ in range(2):
        y, _ = _run(cp, raw, qtype, x, SK=3, EPI=3, **p)
        assert np.array_equal(y, y0), f"{spec.key} differs from the plain epilogue"
    g = wgmma.gate(y, raw, qtype, x, packed=packed, tokens=np.arange(0, nt, max(1, nt // 40)))
    assert g["ok"] and g["nonfinite"] == 0, g


STAGED_SPECS = [k for k in registry.family("wgmma_kq") if k.p["EPI"] == 4]


@pytest.mark.parametrize("sk", [0, 1, 2, 3], ids=["dp", "sk", "sku", "skt"])
@pytest.mark.parametrize("spec", STAGED_SPECS, ids=[k.key for k in STAGED_SPECS])
@pytest.mark.parametrize("nt,od,id_", [(77, 200, 512), (600, 4000, 512), (1000, 1028, 1792), (300, 256, 11008)])
def test_wgmma_staged_store_is_bitwise_the_plain_one(cp, rng, spec, nt, od, id_, sk):
    """EPI=4 stores every tile through its own staging buffer and TMA stores (128 tokens a round, the next tile's
    main loop not waiting for them): the same accumulators as the plain epilogue's scalar stores, so bitwise the
    same on the same grid at every scheduler, several tiles per CTA (600 x 4000: 160 or 96 tiles; 1000 x 1028),
    tails in nt and od, NaN-poisoned output, guard regions intact (no store outside Y: the TMA unit clips), twice
    (the bulk groups drain before exit). od not a multiple of 4 is refused."""
    from labkernels import errors, gpu, wgmma

    qtype = "q4_K" if spec.p["QT"] == 4 else "q6_K"
    bn = spec.p["BN"]
    if not wgmma.sk_fits(sk, nt, od, id_, bn, gpu.device_props()["sm_count"]):
        pytest.skip(f"SK={sk} does not fit {nt} x {od} x {id_} at BN={bn} (refusal tested elsewhere)")
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    p = dict(BN=bn, STAGES=spec.p["STAGES"], SCL=spec.p["SCL"], SK=sk)
    y0, packed = _run(cp, raw, qtype, x, EPI=0, **p)
    for _ in range(2):
        y, _ = _run(cp, raw, qtype, x, EPI=4, **p)
        assert np.array_equal(y, y0), f"{spec.key} SK={sk} differs from the plain epilogue"
    g = wgmma.gate(y, raw, qtype, x, packed=packed, tokens=np.arange(0, nt, max(1, nt // 40)))
    assert g["ok"] and g["nonfinite"] == 0, g
    if sk == 0:
        raw2 = _weights(rng, qtype, 202, id_)
        with pytest.raises(errors.ShapeError, match="16-byte multiples"):
            _run(cp, raw2, qtype, x[:5], EPI=4, **p)


REDUCE_SPECS = [k for k in registry.family("wgmma_kq") if k.p["EPI"] == 5]


@pytest.mark.parametrize("sk", [1, 3], ids=["sk", "skt"])
@pytest.mark.parametrize("spec", REDUCE_SPECS, ids=[k.key for k in REDUCE_SPECS])
@pytest.mark.parametrize("nt,od,id_", [(77, 200, 512), (600, 4000, 512), (500, 4000, 4096), (900, 1500, 2048),
                                       (1000, 1028, 1792)])
def test_wgmma_reduce_finish_is_bitwise_the_plain_one(cp, rng, spec, nt, od, id_, sk):
    """EPI=5: a split tile's owner fills its tile of Y with -0.0 at its start (producer warps 1-3), and the tile's
    two CTAs each TMA-add their partial sums into it, in either order: (-0 + a) + b = a + b, so bitwise the plain
    epilogue's owner + helper on the same grid (no sum here is subnormal); tails in nt and od, NaN-poisoned output
    (every element overwritten), guard regions intact, twice (the flags are zeroed again by their readers: a plain
    launch after it still matches). A grid with three CTAs on a tile is refused (1000 x 1028 x 1792), and so is
    od not a multiple of 4."""
    from labkernels import errors, gpu, wgmma

    qtype = "q4_K" if spec.p["QT"] == 4 else "q6_K"
    bn = spec.p["BN"]
    sm = gpu.device_props()["sm_count"]
    if not wgmma.sk_fits(sk, nt, od, id_, bn, sm):
        pytest.skip(f"SK={sk} does not fit {nt} x {od} x {id_} at BN={bn} (refusal tested elsewhere)")
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    p = dict(BN=bn, STAGES=spec.p["STAGES"], SCL=spec.p["SCL"], SK=sk)
    if not wgmma.reduce_fits(sk, nt, od, id_, bn, sm):
        with pytest.raises(errors.ShapeError, match="EPI=5 adds"):
            _run(cp, raw, qtype, x, EPI=5, **p)
        return
    y0, packed = _run(cp, raw, qtype, x, EPI=0, **p)
    for _ in range(2):
        y, _ = _run(cp, raw, qtype, x, EPI=5, **p)
        assert np.array_equal(y, y0), f"{spec.key} SK={sk} differs from the plain epilogue"
    y1, _ = _run(cp, raw, qtype, x, EPI=0, **p)
    assert np.array_equal(y1, y0), "a plain launch after EPI=5 differs (flags left set?)"
    g = wgmma.gate(y, raw, qtype, x, packed=packed, tokens=np.arange(0, nt, max(1, nt // 40)))
    assert g["ok"] and g["nonfinite"] == 0, g
    if nt == 77:
        raw2 = _weights(rng, qtype, 202, id_)
        with pytest.raises(errors.ShapeError, match="16-byte multiples"):
            _run(cp, raw2, qtype, x[:5], EPI=5, **p)


PF_SPECS = [k for k in registry.family("wgmma_kq") if k.p["PF"]]


@pytest.mark.parametrize("sk", [0, 1, 3], ids=["dp", "sk", "skt"])
@pytest.mark.parametrize("spec", PF_SPECS, ids=[k.key for k in PF_SPECS])
@pytest.mark.parametrize("nt,od,id_", [(77, 200, 512), (512, 1000, 4096), (130, 256, 11008)])
def test_wgmma_l2_prefetch_is_bitwise_none(cp, rng, spec, nt, od, id_, sk):
    """PF only adds L2 prefetches (of the rows' blocks PF super-blocks ahead, clamped to the segment): bitwise the
    PF=0 build on the same grid, tails in nt and od (the tail rows' clamped addresses), guard regions intact."""
    from labkernels import gpu, wgmma

    qtype = "q4_K" if spec.p["QT"] == 4 else "q6_K"
    bn = spec.p["BN"]
    if not wgmma.sk_fits(sk, nt, od, id_, bn, gpu.device_props()["sm_count"]):
        pytest.skip(f"SK={sk} does not fit {nt} x {od} x {id_} at BN={bn}")
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    p = dict(BN=bn, STAGES=spec.p["STAGES"], SCL=spec.p["SCL"], SK=sk)
    y0, packed = _run(cp, raw, qtype, x, PF=0, **p)
    y, _ = _run(cp, raw, qtype, x, PF=spec.p["PF"], **p)
    assert np.array_equal(y, y0), f"{spec.key} SK={sk} differs from PF=0"


SMEM = registry.family("wgmma_kqs")


@pytest.mark.parametrize("sk", [0, 1], ids=["dp", "sk"])
@pytest.mark.parametrize("spec", SMEM, ids=[k.key for k in SMEM])
@pytest.mark.parametrize("nt,od,id_", [(1, 128, 256), (77, 200, 512), (300, 256, 768), (520, 130, 1024),
                                       (512, 1000, 4096)])
def test_wgmma_smem_form_parity(cp, rng, spec, nt, od, id_, sk):
    """The shared-memory form (wgmma_kqs): the gate on every variant with tails in nt and od, poisoned output with
    guards, and against the register form of the same tile: the same f16/bf16 weights (the converters' arithmetic
    is the register form's), so the two agree to fp32 summation order. Two converter warpgroups (NCV=2, FORM=2)
    write the same weights to the same places: bitwise one converter's."""
    from labkernels import wgmma

    raw = _weights(rng, "q4_K", od, id_)
    x = (rng.standard_normal((nt, id_)) * rng.uniform(0.5, 4)).astype(np.float32)
    p = dict(BN=spec.p["BN"], STAGES=spec.p["STAGES"], BF16=spec.p["BF16"], SK=sk)
    form = spec.p["NCV"]
    y, packed = _run(cp, raw, "q4_K", x, FORM=form, **p)
    if form == 2:
        y1, _ = _run(cp, raw, "q4_K", x, FORM=1, **p)
        assert np.array_equal(y, y1), "two converter warpgroups differ from one"
    g = wgmma.gate(y, raw, "q4_K", x, packed=packed, bf16=bool(spec.p["BF16"]))
    print(spec.key, nt, od, id_, sk, g)
    assert g["nonfinite"] == 0
    assert g["exact_rel_terms"] <= wgmma.exact_gate(id_), g
    assert g["ok"], g
    y_reg, _ = _run(cp, raw, "q4_K", x, SCL=0, **{**p, "STAGES": 4})
    scale = float(np.abs(y_reg).max())
    d = float(np.abs(y - y_reg).max())
    print("smem vs register form: max abs diff", d, "of", scale, "bitwise", np.array_equal(y, y_reg))
    assert d <= 1e-5 * scale, (d, scale)
    y2, _ = _run(cp, raw, "q4_K", x, FORM=form, **p)
    assert np.array_equal(y, y2), "the shared-memory form is not bitwise reproducible"


def test_wgmma_smem_form_refuses_what_it_cannot_take(cp, rng):
    from labkernels import errors, wgmma

    raw = _weights(rng, "q6_K", 128, 512)
    w = wgmma.WgWeight.from_gguf(raw, "q6_K")
    with pytest.raises(errors.ShapeError, match="takes q4_K"):
        wgmma.gemm(w, cp.zeros((4, 512), cp.float32), FORM=1)
    w4 = wgmma.WgWeight.from_gguf(_weights(rng, "q4_K", 128, 512), "q4_K")
    with pytest.raises(errors.ShapeError, match="GGUF rows"):
        wgmma.gemm(w4, cp.zeros((4, 512), cp.float32), FORM=1)
    w4.gguf = cp.zeros((128, 2 * 144), cp.uint8)
    with pytest.raises(KeyError, match="no registered kernel"):
        wgmma.gemm(w4, cp.zeros((4, 512), cp.float32), FORM=1, BN=256, STAGES=4)   # over the smem cap


def test_wgmma_rejects_bad_shapes(cp, rng):
    from labkernels import errors, wgmma

    raw = _weights(rng, "q4_K", 128, 512)
    w = wgmma.WgWeight.from_gguf(raw, "q4_K")
    with pytest.raises(errors.ShapeError, match="inner dimensions"):
        wgmma.gemm(w, cp.zeros((4, 256), cp.float32))
    with pytest.raises(errors.ShapeError, match="2-D"):
        wgmma.gemm(w, cp.zeros((512,), cp.float32))
    with pytest.raises(KeyError, match="no registered kernel"):
        wgmma.gemm(w, cp.zeros((4, 512), cp.float32), BN=96)
    with pytest.raises(ValueError, match="EPI is 0"):
        wgmma.gemm(w, cp.zeros((4, 512), cp.float32), EPI=7)
    with pytest.raises(errors.ShapeError, match=r"EPI=3 exchanges .*\(SK=3\)"):     # a form, on its own grid only
        wgmma.gemm(w, cp.zeros((4, 512), cp.float32), EPI=3)
    with pytest.raises(ValueError, match="AQ is 2 or 4"):
        wgmma.gemm(w, cp.zeros((4, 512), cp.float32), AQ=3)
    for bad in (dict(BN=256), dict(EPI=1), dict(SCL=1), dict(BF16=1)):
        with pytest.raises(errors.ShapeError, match="AQ=4 is built for"):
            wgmma.gemm(w, cp.zeros((4, 512), cp.float32), AQ=4, **bad)
    with pytest.raises(ValueError, match="PF is 0, 1 or 2"):
        wgmma.gemm(w, cp.zeros((4, 512), cp.float32), PF=3)
    for bad in (dict(AQ=4), dict(EPI=1), dict(SCL=1), dict(BF16=1)):
        with pytest.raises(errors.ShapeError, match="PF=1 is built for"):
            wgmma.gemm(w, cp.zeros((4, 512), cp.float32), PF=1, **bad)
    w6 = wgmma.WgWeight.from_gguf(_weights(rng, "q6_K", 128, 512), "q6_K")
    with pytest.raises(errors.ShapeError, match="not q6_K at BN=256"):
        wgmma.gemm(w6, cp.zeros((4, 512), cp.float32), BN=256, PF=2)
    with pytest.raises(errors.ShapeError, match="plain epilogue only"):
        wgmma.gemm(w, cp.zeros((4, 512), cp.float32), FORM=1, EPI=1)
    off = cp.full(4 * 128 + 1, np.nan, cp.float32)[1:].reshape(4, 128)    # 4 bytes past a 16-byte boundary
    with pytest.raises(errors.ShapeError, match="16-byte aligned"):
        wgmma.gemm(w, cp.zeros((4, 512), cp.float32), out=off, EPI=2)
    assert bool(cp.isnan(off).all()), "a refused launch wrote the output"


@pytest.mark.model
def test_wgmma_real_model_tensors(cp, rng):
    """Every q4_K / q6_K tensor of Gemma 3 270M (the GGUF, or its tensor cache on a GPU machine) through the main
    BN=128 variant under the three schedulers (the uniform split-k grid where it fits): all rows, 37 fresh random
    tokens."""
    from labkernels import gpu, model, wgmma

    n, n2 = 0, 0
    sm = gpu.device_props()["sm_count"]
    for name, qtype, raw in model.load_kquant():
        id_ = raw.shape[1] // wgmma.BLOCK_BYTES[qtype] * 256
        x = rng.standard_normal((37, id_)).astype(np.float32)
        for sk in (0, 1, 2):
            if not wgmma.sk_fits(sk, 37, raw.shape[0], id_, 128, sm):
                continue
            n2 += sk == 2
            y, packed = _run(cp, np.ascontiguousarray(raw), qtype, x, BN=128, STAGES=4, BF16=0,
                             SCL=wgmma.main_scl(qtype, 128), SK=sk)
            g = wgmma.gate(y, raw, qtype, x, packed=packed)
            assert g["ok"], (name, sk, g)
        n += 1
    assert n >= 36 and n2 >= 1
    print(f"{n} tensors, {n2} of them also on the uniform split-k grid")


@pytest.mark.parametrize("bn,sk,epi", [(128, 0, 0), (256, 1, 0), (256, 3, 0), (256, 1, 4)])
def test_wgmma_trace_build_stamps_every_cta_in_order(cp, rng, bn, sk, epi):
    """The exploratory -DLK_EXP_TRACE build (traces.trace_launch): every CTA stamps its entry, setup,
    its first segment's start, the first tile's arrival and the segment's ends, in that order (traces.TRACE_ORDER) in
    time and in cycles; exactly the CTAs whose stream-K range crosses a tile boundary in the host model
    (wgmma.segments) stamp a second segment (id 4352: 17 super-blocks a tile, so ranges of 2-3 cross them; at 4096
    ranges of 2 never do)."""
    import pandas as pd

    from labkernels import wgmma

    od, id_, nt = 1000, 4352, 512
    raw = _weights(rng, "q4_K", od, id_)
    w = wgmma.WgWeight.from_gguf(raw, "q4_K")
    x16 = cp.asarray(rng.standard_normal((nt, id_)).astype(np.float16))
    rows, us = traces.trace_launch(w, x16, BN=bn, SK=sk, EPI=epi, timed=3)
    df = pd.DataFrame(rows)
    sms = wgmma._sm_count(cp.cuda.Device().id)
    ncta, dp = wgmma.schedule(sk, nt, od, id_, bn, sms)
    G = wgmma.split_g(sk, nt, od, id_, bn, sms)
    assert us > df.t_us.max()           # the launch's event-timed span holds every stamp
    assert df.cta.nunique() == ncta
    for ev in ("entry", "setup", "first_tile", "seg0_start", "seg0_mma_end", "seg0_done"):
        assert (df.event == ev).sum() == ncta, ev
    for _, g in df.groupby("cta"):
        g = g.set_index("event").reindex([e for e in traces.TRACE_ORDER if e in set(g.event)])
        assert g.cta_us.is_monotonic_increasing and g.cycles.is_monotonic_increasing, g
    tiles = ((od + 127) // 128) * ((nt + bn - 1) // bn)
    two = {c for c in range(ncta) if len(wgmma.segments(ncta, c, id_ // 256, tiles, dp, G)) > 1}
    assert set(df.cta[df.event == "seg1_start"]) == two
    assert bool(two) == (sk == 1)       # stream-K here has CTAs with two segments; data-parallel and the split none
    ph = traces.trace_phases([{"variant": wgmma.variant_name(bn, 4, 0, sk, EPI=epi), **r} for r in rows], od, id_, nt, sms)
    assert len(ph) == sum(len(wgmma.segments(ncta, c, id_ // 256, tiles, dp, G)) for c in range(ncta))
    assert (ph.main_us > 0).all() and (ph.finish_us > 0).all()
    if sk == 3:                         # every tile split G ways: one owner and G - 1 helpers per tile
        assert G >= 2 and (ph.groupby("tile").role.apply(lambda r: (r == "owner").sum()) == 1).all()


@pytest.mark.parametrize("bn,sk,epi,nt,od,id_", [(256, 3, 5, 500, 4000, 4096), (256, 1, 5, 600, 4000, 512),
                                                 (128, 1, 0, 512, 1000, 4096), (128, 0, 0, 512, 1000, 4096)],
                         ids=["skt_e5", "sk_e5", "bn128_sk", "bn128_dp"])
def test_empty_build_launches_and_writes_nothing(cp, rng, bn, sk, epi, nt, od, id_, monkeypatch):
    """The launch floor's ablation (LK_ABLATE_EMPTY) on the launches of record: it launches on the plain launch's
    grid (the scheduler is handed the same CTAs per SM, although more of the empty kernel would fit) and writes
    nothing -- the NaN-poisoned Y stays NaN, guards intact -- and leaves no state behind: the plain launch right
    after it (EPI=5 reads the flags the empty build must not have set) still passes its gate."""
    from labkernels import gpu, wgmma

    qtype = "q4_K"
    sm = gpu.device_props()["sm_count"]
    assert epi != 5 or wgmma.reduce_fits(sk, nt, od, id_, bn, sm), "a shape EPI=5 takes on 132 SMs"
    grids = []          # the grids of the two launches below (reduce_fits above calls schedule too)
    real = wgmma.schedule
    monkeypatch.setattr(wgmma, "schedule", lambda *a: grids.append(real(*a)) or grids[-1])
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    p = dict(BN=bn, SCL=wgmma.main_scl(qtype, bn), SK=sk, EPI=epi)
    y_e, _ = _run(cp, raw, qtype, x, defines=("LK_ABLATE_EMPTY",), **p)
    assert np.isnan(y_e).all(), "the empty build wrote into Y"
    y, packed = _run(cp, raw, qtype, x, **p)
    assert len(grids) == 2 and grids[0] == grids[1], grids
    g = wgmma.gate(y, raw, qtype, x, packed=packed, tokens=np.arange(0, nt, 13))
    assert g["ok"] and g["nonfinite"] == 0, g


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("nt,od,id_", [(1, 128, 256), (77, 200, 512), (300, 130, 1024), (520, 4000, 2048),
                                       (256, 64, 768)])
def test_kpair_build_passes_the_gate_with_tails_and_guards(cp, rng, qtype, nt, od, id_):
    """LK_EXP_KPAIR (one 64-row tile per CTA, k split between its consumer warpgroups, 2-CTA clusters multicasting the
    activations): the gate at tails in nt (a token tile the peer's half of which lies past nt) and od (a padded m
    tile: od=130 and od=64 give an odd count, rounded up), guards intact, and within float32 rounding of the plain
    BN=256 launch on the same inputs (two partial sums over k, then one add)."""
    from labkernels import wgmma

    raw = _weights(rng, qtype, od, id_)
    x = (rng.standard_normal((nt, id_)) * rng.uniform(0.5, 4)).astype(np.float32)
    y, packed = _run(cp, raw, qtype, x, defines=wb.KPAIR, **wb.KPAIR_PARAMS)
    g = wgmma.gate(y, raw, qtype, x, packed=packed)
    assert g["nonfinite"] == 0 and g["exact_rel_terms"] <= wgmma.exact_gate(id_) and g["ok"], g
    y0, _ = _run(cp, raw, qtype, x, BN=256, SCL=0)
    assert np.abs(y - y0).max() <= 1e-5 * np.abs(y0).max()


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("nt,od,id_", [(1, 128, 256), (77, 200, 512), (300, 132, 1024), (520, 4000, 2048),
                                       (256, 64, 768)])
@pytest.mark.parametrize("form", ["KPAIR_FIN"])
def test_kpair_fin_is_bitwise_the_kpair_build(cp, rng, qtype, nt, od, id_, form):
    """LK_EXP_KPAIR_FIN (Y by TMA stores through the idle ring, the exit barrier arrived at after the main loops): the
    same sums stored, so bitwise the KPAIR build (its retired forms LK_EXP_KPAIR_EARLY / _OVERLAP were checked here up
    to commit 4a8dcd9), at tails in nt and od (132: a padded m tile; id=256: one super-block, no second to
    prefetch), guards intact; and the gate."""
    from labkernels import wgmma

    raw = _weights(rng, qtype, od, id_)
    x = (rng.standard_normal((nt, id_)) * rng.uniform(0.5, 4)).astype(np.float32)
    y0, _ = _run(cp, raw, qtype, x, defines=wb.KPAIR, **wb.KPAIR_PARAMS)
    y1, packed = _run(cp, raw, qtype, x, defines=getattr(wb, form), **wb.KPAIR_PARAMS)
    assert np.isfinite(y1).all()
    assert np.array_equal(y0.view(np.uint32), y1.view(np.uint32)), int((y0.view(np.uint32) != y1.view(np.uint32)).sum())
    g = wgmma.gate(y1, raw, qtype, x, packed=packed)
    assert g["ok"], g


def test_kpair_fin_refuses_an_output_its_tma_store_cannot_write(cp, rng):
    from labkernels import errors

    raw = _weights(rng, "q4_K", 130, 512)   # od % 4 != 0: no Y tensor map
    x = rng.standard_normal((64, 512)).astype(np.float32)
    with pytest.raises(errors.ShapeError, match="od % 4 == 0"):
        _run(cp, raw, "q4_K", x, defines=wb.KPAIR_FIN, **wb.KPAIR_PARAMS)


def test_kpair_build_refuses_every_other_launch_shape(cp, rng):
    from labkernels import errors

    raw = _weights(rng, "q4_K", 256, 512)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    for p in ({"BN": 128}, {"SK": 1}, {"EPI": 5}, {"SCL": 1}):
        with pytest.raises(errors.ShapeError, match="LK_EXP_KPAIR is built for"):
            _run(cp, raw, "q4_K", x, defines=wb.KPAIR, **{**wb.KPAIR_PARAMS, **p})
