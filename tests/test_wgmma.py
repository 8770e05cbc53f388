"""Round 7 on the CPU: the weight repack round-trips byte for byte, the kernel's bit extraction (emulated in numpy
on the repacked bytes) reproduces gguf-py's dequantization to fp16/bf16 rounding, and the generated wgmma header
is in sync with its generator."""

import numpy as np
import pytest

from labkernels import dispatch, errors, quants, wgmma, wgmma_pack
from labkernels.kernels import gen_wgmma, registry
from labkernels.rounds.r07_wgmma import builds as wb
from labkernels.rounds.r07_wgmma import benchmark, kpair, limits, options, tables, traces


def _weights(qtype, od, id_, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((od, id_)).astype(np.float32) * rng.uniform(0.005, 0.05, (od, 1)).astype(np.float32)
    return quants.quantize(x, qtype)


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
def test_repack_round_trip_random_bytes(qtype):
    rng = np.random.default_rng(11)
    od, nsb = 7, 3
    raw = rng.integers(0, 256, (od, nsb * wgmma.BLOCK_BYTES[qtype]), dtype=np.uint8)
    p = wgmma.repack(raw, qtype)
    assert p.nbytes == raw.nbytes                      # same bits per weight: nothing added
    assert not np.array_equal(p.ravel(), raw.ravel())  # it does permute
    back = wgmma.unrepack(p, qtype, od, nsb * 256)
    assert back.dtype == np.uint8 and np.array_equal(back, raw)


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("bf16", [False, True])
def test_emulated_kernel_weights_match_gguf_dequant(qtype, bf16):
    import gguf

    od, id_ = 24, 512
    raw = _weights(qtype, od, id_, 5 + bf16)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype.upper()]).astype(np.float64)
    emu = wgmma.emulate_weights(wgmma.repack(raw, qtype), qtype, od, id_, bf16=bf16)
    assert emu.shape == (od, id_) and np.isfinite(emu).all()
    # every value is a rounding of the exact dequantized weight: 16-bit rounding of the scale (and min) and of
    # the result, each <= 2^-11 (fp16) or 2^-8 (bf16) relative
    u = 2.0 ** (-8 if bf16 else -11)
    blocks = ref.reshape(od, id_ // 32, 32)
    scale_mag = np.abs(blocks).max(-1, keepdims=True)        # bounds |s*q| + |z| within each 32-group
    tol = np.repeat(3 * u * scale_mag, 32, axis=-1).reshape(od, id_) + 1e-12
    err = np.abs(emu - ref)
    assert (err <= tol).all(), f"max err/tol {float((err / tol).max()):.3f}"
    # and not trivially: the emulation really used the repacked bytes (a wrong permutation breaks it)
    bad = wgmma.repack(raw, qtype).copy()
    bad[..., 40] ^= 0x11 if qtype == "q4_K" else 0
    if qtype == "q6_K":
        bad[5] ^= 0x11
    assert not np.array_equal(wgmma.emulate_weights(bad, qtype, od, id_, bf16=bf16), emu)


def test_repack_rejects_bad_input():
    with pytest.raises(wgmma.RepackError, match="q4_K or q6_K"):
        wgmma.repack(np.zeros((2, 34), np.uint8), "q8_0")
    with pytest.raises(wgmma.RepackError, match=r"uint8 \[od, nsb\*144\]"):
        wgmma.repack(np.zeros((2, 100), np.uint8), "q4_K")
    with pytest.raises(wgmma.RepackError, match="planes"):
        wgmma.unrepack(np.zeros(100, np.uint8), "q6_K", 2, 256)


def test_generated_wgmma_header_in_sync():
    assert gen_wgmma.HEADER.read_text() == gen_wgmma.generate(), \
        "labkernels/kernels/wgmma_ops.cuh is stale: run python -m labkernels.kernels.gen_wgmma"


def test_registry_rows_of_round7():
    ks = registry.family("wgmma_kq")
    assert {k.p["QT"] for k in ks} == {4, 6} and all(k.archs == ("sm_90a",) for k in ks)
    assert all(k.threads == 384 for k in ks)
    for k in ks:   # the ring of STAGES activation tiles (BN tokens x 128 B) plus 1 KB of alignment slack (and
        # the 64 KB staging buffer of EPI=4 and of EPI=5, which stores through it and zeroes from it)
        assert k.dynamic_smem() == k.p["STAGES"] * k.p["BN"] * 128 + 1024 + (65536 if k.p["EPI"] >= 4 else 0)
        assert k.dynamic_smem() <= 227 * 1024
    main = sorted(k.key for k in ks if k.main_path and k.p["EPI"] == 0)
    # one scale-decode form per type and tile width on the main path, f16 (the forms ptxas pipelines without
    # spills: q6_K SCL=1 spills at BN=256); wgmma.main_scl names the same ones
    assert main == sorted(f"wgmma_kq[QT={q},BN={bn},STAGES=4,BF16=0,SCL={scl},EPI=0,AQ=2,PF=0]"
                          for q, bn, scl in ((4, 128, 0), (4, 256, 0), (6, 128, 1), (6, 256, 0)))
    from labkernels import wgmma
    assert main == sorted(f"wgmma_kq[QT={q},BN={bn},STAGES=4,BF16=0,SCL={wgmma.main_scl(t, bn)},EPI=0,AQ=2,PF=0]"
                          for q, t in ((4, "q4_K"), (6, "q6_K")) for bn in (128, 256))
    # the epilogue forms: built on the main scale form only (f16), all on the main path (0 spills: CI's audit)
    epi = {(k.p["QT"], k.p["BN"], k.p["EPI"]): k for k in ks if k.p["EPI"] in (1, 2)}
    assert all(k.p["AQ"] == 2 for k in epi.values())
    assert set(epi) == {(q, bn, e) for q in (4, 6) for bn in (128, 256) for e in (1, 2)}
    for (q, bn, e), k in epi.items():
        assert k.p["BF16"] == 0 and k.p["SCL"] == wgmma.main_scl("q4_K" if q == 4 else "q6_K", bn)
        assert k.main_path, k.key
        assert k.dynamic_smem() >= bn * 512    # the ring holds one tile of f32 partials / outputs


def test_registry_rows_of_the_shared_memory_form():
    from labkernels import wgmma

    ks = registry.family("wgmma_kqs")
    assert ks and all(k.p["QT"] == 4 and k.threads == 128 * (2 + k.p["NCV"]) and k.archs == ("sm_90a",) for k in ks)
    # two converter warpgroups (512 threads): BN=128, 4 stages, f16, off the main path
    assert [k.key for k in ks if k.p["NCV"] == 2] == ["wgmma_kqs[QT=4,BN=128,STAGES=4,BF16=0,NCV=2]"]
    assert not registry.find("wgmma_kqs", QT=4, BN=128, STAGES=4, BF16=0, NCV=2).main_path
    for k in ks:   # STAGES x (activation tile + 16 KB converted A tile) + the 3-deep raw ring (128 rows x 144 B)
        assert k.dynamic_smem() == k.p["STAGES"] * (k.p["BN"] * 128 + 16384) + 3 * 128 * 144 + 1024
        assert k.dynamic_smem() <= 227 * 1024, k.key          # the H200's opt-in cap per block
    assert ("BN", 256) not in [kv for k in ks if k.p["STAGES"] == 4 for kv in k.params]   # over the cap: not built
    assert wgmma.variant_name(128, 4, 0, 1, FORM=1) == "wgmma_smem_bn128_s4_sk"
    assert wgmma.variant_name(128, 4, 0, 1, FORM=2) == "wgmma_smem_bn128_s4_sk_c2"
    assert wgmma.variant_params("wgmma_smem_bn128_s4_sk_c2", "q4_K")[1] == {"BN": 128, "STAGES": 4, "BF16": 0,
                                                                            "SK": 1, "FORM": 2}
    assert wgmma.variant_params("wgmma_smem_bn256_s3", "q4_K") == (
        "wgmma_kq", {"BN": 256, "STAGES": 3, "BF16": 0, "SK": 0, "FORM": 1})
    assert wgmma.variant_params("wgmma_bn128_s4_scl1_sk", "q6_K")[1]["SCL"] == 1


def test_audit_reads_wgmma_serialization_and_sm90a_targets():
    from labkernels import audit

    log = ("ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
           "non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline "
           "stage in the function '_Z3fooILi1EEvv'\n"
           "ptxas info    : Compiling entry function '_Z3fooILi1EEvv' for 'sm_90a'\n"
           "ptxas info    : Function properties for _Z3fooILi1EEvv\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers, 64 bytes smem\n"
           "ptxas info    : Compiling entry function '_Z3barv' for 'sm_90a'\n"
           "ptxas info    : Used 40 registers\n")
    e = audit.parse_ptxas(log)
    assert [x["wgmma_serialized"] for x in e] == [True, False] and e[0]["regs"] == 168
    assert audit.arch_flag("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"
    assert audit.arch_flag("sm_90") == "-arch=sm_90"
    wg = registry.family("wgmma_kq")
    assert audit.source_archs(wg, ("sm_90",)) == ("sm_90a",)
    assert audit.source_archs(wg, ("sm_80",)) == ()              # wgmma does not exist there: not audited
    assert audit.source_archs(registry.family("q4k_nb"), ("sm_80", "sm_90")) == ("sm_80", "sm_90")
    row = {"main_path": True, "key": "k", "arch": "sm_90a", "source": "s.cu", "error": None, "spill_stores": 0,
           "spill_loads": 0, "stack_frame": 0, "wgmma_serialized": True}
    assert any("serialized" in m for m in audit.check([row]))


def test_auto_choice_from_a_recorded_run(tmp_path):
    """qmatmul's auto choice reads the latest recorded round-7 run: the fastest variant at the nearest shape and
    nt, only among families that run on the device; without a run it states its rule."""
    from labkernels import records

    run = records.new_run("wgmma", {"t": 1}, root=tmp_path)
    rows = []
    for nt, times in ((512, {"wgmma_bn128_s4_scl0": 30.0, "wgmma_bn256_s4_scl0": 45.0, "int8_q4k_nb": 90.0}),
                      (4096, {"wgmma_bn128_s4_scl0": 250.0, "wgmma_bn256_s4_scl0": 200.0, "int8_q4k_nb": 700.0})):
        for v, us in times.items():
            for p in range(2):
                rows.append({"qtype": "q4_K", "od": 4096, "id": 4096, "nt": nt, "variant": v, "pair": p,
                             "median_us": us + p})
    run.append("wgmma_bench", rows)
    run.finish()
    t = wgmma.auto_table(root=tmp_path)
    assert len(t) == 2
    c = dispatch.choose("q4_K", 600, 4096, 4096, table=t, cc=90)
    assert (c.family, dict(c.params)["BN"]) == ("wgmma_kq", 128) and run.run_id in c.reason
    c = dispatch.choose("q4_K", 3000, 4000, 4352, table=t, cc=90)   # id: whole super-blocks (4200 is refused)
    assert dict(c.params)["BN"] == 256
    c = dispatch.choose("q4_K", 3000, 4096, 4096, table=t, cc=80)     # no wgmma on sm_80: the int8 row
    assert c.family == "q4k_nb" and dict(c.params) == {"KDR": 8}
    c = dispatch.choose("q6_K", 512, 4096, 4096, table=t, cc=90)      # no q6_K rows recorded: the stated rule
    assert c.family == "wgmma_kq" and "rule" in c.reason
    c = dispatch.choose("q6_K", 512, 4096, 4096, table=t, cc=0)       # a CPU machine: said as such, not "sm_0"
    assert c.family == "q6k_expb" and "no GPU here" in c.reason and "sm_0" not in c.reason
    c = dispatch.choose("q6_K", 512, 4096, 4096, table=t, cc=80)
    assert "sm_80 has no wgmma" in c.reason
    with pytest.raises(ValueError, match="not a round-7 variant"):
        wgmma.variant_params("wgmma_bogus", "q4_K")


def test_qmatmul_rejects_unknown_kernels_before_touching_the_gpu():
    from labkernels import errors

    with pytest.raises(errors.ShapeError, match="unknown kernel 'cublas'"):
        dispatch.qmatmul(np.zeros((2, 256), np.float32), None, kernel="cublas")


def test_below_sm90_the_error_names_the_families_that_run(monkeypatch):
    from labkernels import gpu

    monkeypatch.setattr(gpu, "device_props", lambda: {"cc": 80, "name": "NVIDIA A100", "smem_optin": 166912})
    with pytest.raises(wgmma.WgmmaError, match=r"sm_80.*q6k_generic, q6k_expb, q4k_nb"):
        wgmma.require_sm90a()
    assert not wgmma.supported(80) and wgmma.supported(90)


def test_pair_rows_one_row_per_variant_and_round_in_column_order():
    from labkernels import bench

    res = {"a": [{"median_us": 10.0, "n": 3}, {"median_us": 12.0, "n": 3}], "b": [{"median_us": 5.0, "n": 3}]}
    rows = bench.pair_rows(res, {"qtype": "q4_K", "od": 4, "id": 256, "nt": 2}, 2, 4, 256, {"kdr": 8}, {"ok": True})
    assert [(r["variant"], r["pair"]) for r in rows] == [("a", 0), ("a", 1), ("b", 0)]
    assert list(rows[0])[:7] == ["qtype", "od", "id", "nt", "variant", "pair", "kdr"] and list(rows[0])[-1] == "ok"
    assert rows[2]["tops_eq"] == pytest.approx(2 * 2 * 4 * 256 / 5e-6 / 1e12)


@pytest.mark.parametrize("nt,od,id_,bn", [(512, 4096, 4096, 256), (512, 11008, 4096, 256), (512, 4096, 14336, 128),
                                          (4096, 4096, 4096, 256), (3325, 11008, 4096, 256), (37, 640, 2048, 128),
                                          (1, 128, 256, 128), (1100, 4096, 512, 128), (77, 200, 512, 256)])
def test_stream_k_schedule_covers_every_iteration_once(nt, od, id_, bn):
    """The launcher's schedule (and the kernel's segment rule, modelled by wgmma.segments): every (tile, k) once,
    at most one helper segment per CTA and only as its first, the owner's chain of later CTAs completes each tile,
    at most SK_MAXSEG stream-K segments, and data-parallel waves whole."""
    from labkernels import wgmma

    I = id_ // 256
    tiles = -(-od // 128) * -(-nt // bn)
    for sk in (0, 1, 2, 3):
        if not wgmma.sk_fits(sk, nt, od, id_, bn, 132):
            with pytest.raises(errors.ShapeError, match="no (uniform|tile-aligned) split-k grid"):
                wgmma.schedule(sk, nt, od, id_, bn, 132)
            continue
        ncta, dp = wgmma.schedule(sk, nt, od, id_, bn, 132)
        g = wgmma.split_g(sk, nt, od, id_, bn, 132)
        assert (g > 0) == (sk == 3)
        assert dp % ncta == 0 and ncta <= (tiles if not sk else 132)
        seen = np.zeros((tiles, I), np.int32)
        segs = [wgmma.segments(ncta, c, I, tiles, dp, g) for c in range(ncta)]
        for c, ss in enumerate(segs):
            assert len(ss) - dp // ncta <= wgmma.SK_MAXSEG
            for n, (t, lo, hi) in enumerate(ss):
                assert 0 <= lo < hi <= I
                seen[t, lo:hi] += 1
                if lo > 0:
                    assert n == dp // ncta, "a helper segment that is not the CTA first"
                else:   # the owner: its segment, then the first segments of the following CTAs, complete the tile
                    cov, cc = hi, c + 1
                    while cov < I:
                        t2, lo2, hi2 = next(s for s in segs[cc] if s[0] == t)
                        assert lo2 == cov and segs[cc].index((t2, lo2, hi2)) == dp // ncta
                        cov, cc = hi2, cc + 1
        assert (seen == 1).all()
        if not sk:
            assert ncta == tiles == dp
    with pytest.raises(ValueError, match="SK is 0"):
        wgmma.schedule(4, 1, 128, 256, 128, 132)


@pytest.mark.parametrize("nt,od,id_,bn,g", [(512, 4096, 4096, 256, 2), (512, 4096, 14336, 256, 2),
                                             (256, 4096, 4096, 256, 4), (64, 4096, 11008, 256, 1),
                                             (64, 640, 2048, 128, 8), (512, 11008, 4096, 256, 0)])
def test_uniform_split_grid_gives_every_cta_one_equal_part_of_one_tile(nt, od, id_, bn, g):
    """SK=2: G x tiles CTAs, G the largest divisor of the super-blocks per tile that fits the SMs; every CTA runs
    one segment, I/G super-blocks long and aligned to them, of one tile (so the kernel's own range split is the
    uniform split); G < 2 is refused, never run on another grid. 4096 x 11008 has 43 super-blocks (prime): G=1."""
    from labkernels import wgmma

    I = id_ // 256
    tiles = -(-od // 128) * -(-nt // bn)
    assert wgmma.uniform_split(tiles, I, 132) == g
    assert wgmma.sk_fits(2, nt, od, id_, bn, 132) == (g >= 2)
    if g < 2:
        with pytest.raises(errors.ShapeError, match=r"no uniform split-k grid \(SK=2\).*use SK=1"):
            wgmma.schedule(2, nt, od, id_, bn, 132)
        return
    ncta, dp = wgmma.schedule(2, nt, od, id_, bn, 132)
    assert (ncta, dp) == (g * tiles, 0) and ncta <= 132
    part = I // g
    for c in range(ncta):
        assert wgmma.segments(ncta, c, I, tiles, dp) == [(c // g, part * (c % g), part * (c % g) + part)]


@pytest.mark.parametrize("nt,od,id_,bn,g,parts", [
    (512, 4096, 11008, 256, 2, (21, 22)),      # 43 super-blocks (prime): SK=2 refuses it
    (512, 4096, 4096, 256, 2, (8, 8)),         # G divides I: SK=2's grid
    (64, 4096, 11008, 256, 4, (10, 11, 11, 11)),
    (300, 1000, 1792, 128, 4, (1, 2, 2, 2)),   # 24 tiles, 5 would fit: ceil(7/5) = ceil(7/4) = 2, so 4 parts
    (512, 4096, 4096, 128, 1, None),           # 128 tiles: one part only -- refused
    (512, 11008, 4096, 256, 0, None)])         # 172 tiles: not one wave -- refused
def test_tile_aligned_split_gives_every_cta_one_part_of_one_tile(nt, od, id_, bn, g, parts):
    """SK=3: G x tiles CTAs, each one tile-aligned part of floor/ceil(I/G) super-blocks (the kernel's split_g
    range rule, modelled by wgmma.sk_start), G the fewest parts with the shortest longest part; where G divides
    I it is exactly SK=2's grid and segments; G < 2 is a ShapeError."""
    from labkernels import wgmma

    I = id_ // 256
    tiles = -(-od // 128) * -(-nt // bn)
    assert wgmma.tile_split(tiles, I, 132) == g
    if g < 2:
        assert not wgmma.sk_fits(3, nt, od, id_, bn, 132)
        with pytest.raises(errors.ShapeError, match=r"no tile-aligned split-k grid \(SK=3\).*use SK=1"):
            wgmma.schedule(3, nt, od, id_, bn, 132)
        return
    ncta, dp = wgmma.schedule(3, nt, od, id_, bn, 132)
    assert (ncta, dp) == (g * tiles, 0) and wgmma.split_g(3, nt, od, id_, bn, 132) == g
    for c in range(ncta):
        segs = wgmma.segments(ncta, c, I, tiles, dp, g)
        assert len(segs) == 1 and segs[0][0] == c // g
        assert segs[0][2] - segs[0][1] == parts[c % g]
    if I % g == 0 and wgmma.sk_fits(2, nt, od, id_, bn, 132) and wgmma.uniform_split(tiles, I, 132) == g:
        assert wgmma.schedule(2, nt, od, id_, bn, 132) == (ncta, dp)
        assert all(wgmma.segments(ncta, c, I, tiles, dp, g) == wgmma.segments(ncta, c, I, tiles, dp)
                   for c in range(ncta))


def test_kernel_split_rule_matches_its_host_model():
    """The kernel's lk_sk_start (wgmma_kq.cuh) and wgmma.sk_start are one rule written twice (device, host): the
    source's G > 0 branch is the formula the host model evaluates, t I + (p I) / G with t, p = c / G, c % G."""
    from labkernels.kernels import registry
    from labkernels import wgmma

    src = (registry.KERNELS_DIR / "wgmma_kq.cuh").read_text()
    body = src[src.index("int lk_sk_start(int c, int T, int I, int G)"):]
    body = body[:body.index("\n}\n")]
    assert "const int t = c / G, p = c - t * G;" in body and "return t * I + (p * I) / G;" in body
    # the end of the last CTA is the end of the work, for every G
    for tiles, I, G in ((64, 43, 2), (24, 7, 4), (32, 16, 4)):
        assert wgmma.sk_start(G * tiles, G * tiles, I, tiles, 0, G) == tiles * I


def test_variant_names_carry_the_scheduler():
    from labkernels import wgmma

    for sk, suffix in ((0, ""), (1, "_sk"), (2, "_sku")):
        name = wgmma.variant_name(256, 4, 0, sk)
        assert name == "wgmma_bn256_s4_scl0" + suffix
        assert wgmma.variant_params(name, "q4_K") == ("wgmma_kq", {"BN": 256, "STAGES": 4, "BF16": 0, "SCL": 0,
                                                                   "SK": sk})
        smem = wgmma.variant_name(128, 4, 0, sk, FORM=1)
        assert wgmma.variant_params(smem, "q4_K")[1]["SK"] == sk and smem.startswith("wgmma_smem_bn128_s4")
    assert wgmma.variant_name(256, 4, 0, 3) == "wgmma_bn256_s4_scl0_skt"
    for epi in (1, 2, 3, 4, 5):   # the epilogue form is named after the scheduler, and only where it is not the plain one
        name = wgmma.variant_name(256, 4, 0, 2, EPI=epi)
        assert name == f"wgmma_bn256_s4_scl0_sku_e{epi}"
        assert wgmma.variant_params(name, "q4_K")[1] == {"BN": 256, "STAGES": 4, "BF16": 0, "SCL": 0, "SK": 2,
                                                         "EPI": epi}
        assert wgmma.variant_params(f"wgmma_bn128_s4_scl1_e{epi}", "q6_K")[1]["EPI"] == epi
    assert "EPI" not in wgmma.variant_params("wgmma_bn256_s4_scl0_sku", "q4_K")[1]
    with pytest.raises(ValueError, match="not a round-7 variant"):
        wgmma.variant_params("wgmma_bn256_s4_scl0_e6", "q4_K")
    with pytest.raises(ValueError, match="plain epilogue only"):
        wgmma.variant_name(128, 4, 0, 1, FORM=1, EPI=1)
    # the A-fragment sets come last, named only where they are not AQ=2, and read back
    assert wgmma.variant_name(128, 4, 1, 3, AQ=4) == "wgmma_bn128_s4_scl1_skt_a4"
    assert wgmma.variant_params("wgmma_bn128_s4_scl1_skt_a4", "q6_K")[1] == {"BN": 128, "STAGES": 4, "BF16": 0,
                                                                             "SCL": 1, "SK": 3, "AQ": 4}
    assert "AQ" not in wgmma.variant_params("wgmma_bn128_s4_scl0", "q4_K")[1]
    with pytest.raises(ValueError, match="not a round-7 variant"):
        wgmma.variant_params("wgmma_bn128_s4_scl0_a3", "q4_K")
    with pytest.raises(ValueError, match="no register A sets"):
        wgmma.variant_name(128, 4, 0, 0, FORM=1, AQ=4)
    assert wgmma.variant_name(256, 4, 0, 3, PF=2) == "wgmma_bn256_s4_scl0_skt_p2"
    assert wgmma.variant_params(wgmma.variant_name(128, 4, 0, 3, EPI=3), "q4_K")[1]["EPI"] == 3
    assert wgmma.variant_params("wgmma_bn256_s4_scl0_skt_p2", "q4_K")[1] == {"BN": 256, "STAGES": 4, "BF16": 0,
                                                                             "SCL": 0, "SK": 3, "PF": 2}


def test_registry_rows_of_the_l2_prefetch():
    """PF 1 / 2: the AQ=2 main scale forms, f16, plain epilogue, for q4_K at both tiles and q6_K at BN=128 (q6_K
    BN=256's consumers spill with it); off the main path."""
    from labkernels import wgmma

    ks = registry.family("wgmma_kq")
    pf = sorted((k.p["QT"], k.p["BN"], k.p["PF"]) for k in ks if k.p["PF"])
    assert pf == [(4, 128, 1), (4, 128, 2), (4, 256, 1), (4, 256, 2), (6, 128, 1), (6, 128, 2)]
    for k in ks:
        if k.p["PF"]:
            assert not k.main_path and k.p["AQ"] == 2 and k.p["EPI"] == 0 and k.p["BF16"] == 0
            assert k.p["SCL"] == wgmma.main_scl("q4_K" if k.p["QT"] == 4 else "q6_K", k.p["BN"])


def test_registry_rows_of_the_four_a_set_form():
    """AQ=4: BN=128 only (BN=256's consumers spill with two more sets), the plain epilogue, f16, the main scale
    form; an experiment, off the main path; every other row keeps AQ=2."""
    from labkernels import wgmma

    ks = registry.family("wgmma_kq")
    aq4 = sorted((k.p["QT"], k.p["BN"], k.p["SCL"], k.p["EPI"], k.p["BF16"]) for k in ks if k.p["AQ"] == 4)
    assert aq4 == [(4, 128, wgmma.main_scl("q4_K", 128), 0, 0), (6, 128, wgmma.main_scl("q6_K", 128), 0, 0)]
    assert not any(k.main_path for k in ks if k.p["AQ"] == 4)
    assert {k.p["AQ"] for k in ks if k.p["AQ"] != 4} == {2}


def _recorded_auto_table(root, qtype, od, id_, nt, times: dict):
    """``auto``'s table of one recorded wgmma run (under ``root``) with one pair of ``times`` (variant -> us) at one
    point."""
    from labkernels import records

    run = records.new_run("wgmma", {"t": 1}, root=root)
    run.append("wgmma_bench", [{"qtype": qtype, "od": od, "id": id_, "nt": nt, "variant": v, "pair": 0,
                                "median_us": us} for v, us in times.items()])
    run.finish()
    return wgmma.auto_table(root=root)


def test_auto_choice_leaves_the_uniform_grid_where_it_does_not_fit(tmp_path):
    """A recorded SK=2 winner at a shape class is used as it is where its grid fits, and as stream-K (SK=1), said in
    the reason, where it does not (the nearest class is 4096x4096, but 4096 x 11008 has 43 super-blocks a tile)."""
    t = _recorded_auto_table(tmp_path, "q4_K", 4096, 4096, 512, {"wgmma_bn256_s4_scl0_sku": 33.0,
                                                                 "wgmma_bn256_s4_scl0_sk": 35.0})
    c = dispatch.choose("q4_K", 512, 4096, 4096, table=t, cc=90)
    assert dict(c.params)["SK"] == 2 and "does not fit" not in c.reason
    c = dispatch.choose("q4_K", 512, 4096, 11008, table=t, cc=90)
    assert dict(c.params)["SK"] == 1 and "uniform split-k grid (SK=2) does not fit 4096x11008 nt=512" in c.reason


def test_auto_choice_keeps_a_recorded_epilogue_form_and_says_where_it_cannot(tmp_path):
    """A recorded winner with the TMA-store epilogue (EPI=2) on the tile-aligned split (SK=3) is used as recorded
    where both fit; where the split does not fit it runs stream-K with the plain epilogue, and where od is not a
    multiple of 4 (the Y map's rows) the bulk fold alone (EPI=1) -- each said in the reason."""
    t = _recorded_auto_table(tmp_path, "q4_K", 4096, 11008, 512, {"wgmma_bn256_s4_scl0_skt_e2": 60.0,
                                                                  "wgmma_bn256_s4_scl0_sk": 70.0})
    c = dispatch.choose("q4_K", 512, 4096, 11008, table=t, cc=90)
    assert dict(c.params) == {"BN": 256, "STAGES": 4, "BF16": 0, "SCL": 0, "SK": 3, "EPI": 2}
    assert "does not fit" not in c.reason and "EPI=1" not in c.reason
    c = dispatch.choose("q4_K", 512, 11008, 4096, table=t, cc=90)        # 172 tiles: no split-k grid
    assert dict(c.params)["SK"] == 1 and dict(c.params)["EPI"] == 0     # stream-K takes the plain epilogue only
    assert "tile-aligned split-k grid (SK=3) does not fit 11008x4096 nt=512" in c.reason
    assert "with the plain epilogue (EPI=2 takes one segment per CTA)" in c.reason
    c = dispatch.choose("q4_K", 512, 4094, 11008, table=t, cc=90)
    assert dict(c.params)["EPI"] == 1 and "needs od % 4 == 0, od=4094" in c.reason


def test_output_map_refuses_what_the_tma_store_cannot_describe():
    """The TMA-store epilogue's Y map is refused with the reason before any encode: not float32, not contiguous,
    od not a multiple of 4, a base not 16-byte aligned."""
    import types

    def fake(dtype=np.float32, shape=(8, 64), contig=True, ptr=1 << 20):
        return types.SimpleNamespace(dtype=np.dtype(dtype), ndim=len(shape), shape=shape,
                                     flags=types.SimpleNamespace(c_contiguous=contig),
                                     data=types.SimpleNamespace(ptr=ptr))

    for y, msg in ((fake(dtype=np.float16), "float32"), (fake(contig=False), "C-contiguous"),
                   (fake(shape=(8, 62)), "od % 4 == 0"), (fake(ptr=(1 << 20) + 4), "16-byte aligned")):
        with pytest.raises(errors.ShapeError, match=msg):
            wgmma.output_map(y, 128)


def test_epi_table_ratios_per_scheduler_and_form():
    """The notebook's A/B table: ratios of medians to the same point's cuBLAS, one row per scheduler, the forms as
    columns (plain, bulk fold, +TMA store), a form that did not run left empty."""
    import pandas as pd

    rows = []
    for pair, f in ((0, 1.0), (1, 1.1), (2, 0.9)):
        for v, us in (("cublas_f16_cached", 28.0), ("wgmma_bn256_s4_scl0_sku", 35.0), ("wgmma_bn256_s4_scl0_sku_e1", 32.0),
                      ("wgmma_bn256_s4_scl0_sku_e2", 30.0), ("wgmma_bn128_s4_scl0", 40.0),
                      ("wgmma_bn128_s4_scl0_e2", 38.0), ("int8_q4k_nb", 120.0)):
            rows.append({"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512, "variant": v, "pair": pair,
                         "median_us": us * f})
    t = tables.epi_table(pd.DataFrame(rows)).set_index("sched")
    assert list(t.columns[-3:]) == ["plain", "bulk fold", "+TMA store"]
    assert t.loc["BN=256 SK=2", "plain"] == pytest.approx(28 / 35)
    assert t.loc["BN=256 SK=2", "+TMA store"] == pytest.approx(28 / 30)
    assert t.loc["BN=128 SK=0", "plain"] == pytest.approx(28 / 40) and np.isnan(t.loc["BN=128 SK=0", "bulk fold"])
    assert len(t) == 2     # cuBLAS and the int8 kernel are the reference and not rows


def test_build_defines_are_read_at_each_build(monkeypatch):
    """An ablation or trace build made after the plain one must get its own -D flags: the environment is read at
    each call, explicit names are checked, and the cubin cache keys on them (two builds, two different cubins)."""
    import shutil

    monkeypatch.setenv("LABKERNELS_WG_DEFINES", "")
    assert wb.build_defines() == ()
    monkeypatch.setenv("LABKERNELS_WG_DEFINES", "LK_ABLATE_NOSTORE -DEVIL LK_EXP_TRACE")
    assert wb.build_defines() == ("LK_ABLATE_NOSTORE", "LK_EXP_TRACE")       # other names never reach nvcc
    assert wb.check_defines(["LK_EXP_TRACE", "LK_EXP_TRACE"]) == ("LK_EXP_TRACE",)
    with pytest.raises(ValueError, match="LK_ABLATE"):
        wb.check_defines(["NDEBUG"])
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    plain, _ = wb.cubin("wgmma_kq.cu", ())
    traced, names = wb.cubin("wgmma_kq.cu", ("LK_EXP_TRACE",))
    assert plain != traced
    from pathlib import Path
    assert Path(plain).read_bytes() != Path(traced).read_bytes()
    assert names and all(e["mangled"] for e in names.values())


def test_trace_rows_and_summary_from_stamp_arrays():
    """The -DLK_EXP_TRACE build's arrays -> rows and the per-event summary: times from the first entry and from each
    CTA's own, unstamped slots left out, the SM id from slot 15; arrays without entries are refused."""
    from labkernels import wgmma

    E = len(traces.TRACE_EVENTS)
    ns = np.zeros((3, E + 1), np.uint64)
    clk = np.zeros_like(ns)
    for c, t0 in enumerate((1_000_000, 1_000_500, 1_002_000)):   # CTAs enter 0 / 0.5 / 2 us apart
        ns[c, :3] = [t0, t0 + 1_000, t0 + 3_000]                   # setup 1 us, first tile 3 us after entry
        ns[c, 3:6] = [t0 + 1_100, t0 + 20_000, t0 + 21_000]         # one segment (its first tile arrives inside)
        clk[c, :6] = [5, 1_805, 5_405, 1_985, 36_005, 37_805]
        ns[c, E] = 7 + c
    ns[1, 6:9] = [1_021_600, 1_030_500, 1_031_000]                  # CTA 1 has a second segment
    clk[1, 6:9] = [1, 2, 3]
    rows = traces.trace_rows(ns, clk)
    assert len(rows) == 3 * 6 + 3 and {r["smid"] for r in rows} == {7, 8, 9}
    r = {(x["cta"], x["event"]): x for x in rows}
    assert r[(2, "entry")]["t_us"] == 2.0 and r[(2, "first_tile")]["cta_us"] == 3.0
    assert r[(0, "seg0_mma_end")]["cycles"] == 36_000 and (1, "seg1_done") in r and (0, "seg1_start") not in r
    s = traces.trace_summary(rows)
    assert list(s.event[:4]) == ["entry", "setup", "seg0_start", "first_tile"]     # the order a CTA passes them
    assert list(s.event).index("seg1_done") == 8
    first = s.set_index("event")
    assert first.loc["entry", "t_us_max"] == 2.0 and first.loc["first_tile", "cta_us_median"] == 3.0
    assert first.loc["seg1_start", "ctas"] == 1
    with pytest.raises(wgmma.WgmmaError, match="never stamped"):
        traces.trace_rows(np.zeros((2, E + 1), np.uint64), np.zeros((2, E + 1), np.uint64))
    with pytest.raises(ValueError, match="trace arrays"):
        traces.trace_rows(np.zeros((2, 3), np.uint64), np.zeros((2, 3), np.uint64))


def test_cost_fit_separates_per_launch_and_per_k_cost():
    import pandas as pd

    ids = [256, 1024, 4096, 14336]
    rows = [{"variant": v, "id": i, "median_us": a + b * i / 1000, "host_enqueue_us": h, "back_to_back_us": 40.0 + i}
            for v, a, b, h in (("wgmma_bn256_s4_scl0_sk", 11.8, 5.8, 45.0), ("cublas_f16_cached", 6.2, 5.3, 20.0))
            for i in ids]
    fit = benchmark.cost_fit(pd.DataFrame(rows)).set_index("variant")
    assert fit.loc["wgmma_bn256_s4_scl0_sk", "intercept_us"] == pytest.approx(11.8)
    assert fit.loc["cublas_f16_cached", "ns_per_k"] == pytest.approx(5.3)
    assert fit.loc["cublas_f16_cached", "back_to_back_us_at_min_id"] == 40.0 + 256


def test_bench_runs_end_to_end_on_the_cpu_shim(monkeypatch, tmp_path):
    """Round 7's benchmark (the gpu-check step's body) end to end with the kernel's exact function standing in
    for the GPU and the timings faked: every variant is gated on fresh inputs before it is timed, and the tables
    the notebook reads are recorded. (It guards the GPU-only code path against API drift: it once called a
    case-setup helper that had moved to labkernels.cases.)"""
    from cpu_gpu_shim import install, install_wgmma

    from labkernels import bench, records, wgmma

    cp = install(monkeypatch, exact=True)
    install_wgmma(monkeypatch, f16_only=False)
    monkeypatch.setattr(wgmma, "_cp", lambda: cp)
    monkeypatch.setattr(bench, "time_launches", lambda fn, warmup=3, repeats=20, flush=None: (fn(), np.ones(3))[1])
    monkeypatch.setattr(bench, "Flusher", lambda: None)
    variants = ((128, 4, None, 0), (256, 4, None, 1))
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        rows = benchmark.bench(shapes=[(256, 512)], nts=[8, 40], qtypes=("q4_K", "q6_K"), variants=variants, pairs=2,
                        repeats=2, run=run, progress=lambda s: None)
    run = records.load("wgmma", run.run_id, root=tmp_path)
    par = run.table("wgmma_parity")
    assert len(par) == 2 * 2 * len(variants) and par.ok.all()
    assert {"wgmma_bn128_s4_scl0", "wgmma_bn128_s4_scl1", "wgmma_bn256_s4_scl0_sk"} <= set(par.variant)
    b = run.table("wgmma_bench")
    assert len(b) == len(rows) and set(b.pair) == {0, 1}
    assert {"cublas_f16_cached", "int8_q4k_nb", "int8_q6k_expb"} <= set(b.variant)


def test_bench_with_a_lead_times_every_call_both_ways(monkeypatch, tmp_path):
    """bench(leads_us=...) on the CPU shim: every call is timed plainly and behind the lead, call by call (the lead
    handed only to the lead timing's calls), and each row says which timing, the call's host time and the flush's."""
    from cpu_gpu_shim import install, install_wgmma

    from labkernels import bench, records, wgmma

    cp = install(monkeypatch, exact=True)
    install_wgmma(monkeypatch, f16_only=False)
    monkeypatch.setattr(wgmma, "_cp", lambda: cp)
    seen = []

    def fake(fn, warmup=3, repeats=20, flush=None, lead=None, host=None):
        fn()
        seen.append(lead)
        host.extend([7.0, 9.0])
        return np.full(2, 5.0 if lead is None else 4.0)

    monkeypatch.setattr(bench, "time_launches", fake)
    monkeypatch.setattr(bench, "Flusher", lambda: None)
    monkeypatch.setattr(bench, "flush_us", lambda flush: 31.0)
    monkeypatch.setattr(bench, "Lead", lambda us: ("lead", us))
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        options.lead_ab(run, {"shapes": [[256, 512]], "nts": [40], "qtypes": ["q4_K"],
                         "variants": [[128, 4, None, 0]], "pairs": 2})
    b = records.load("wgmma", run.run_id, root=tmp_path).table("wgmma_lead_ab")
    assert set(b.timing) == {"events", "lead500"}
    assert set(b.variant) == {"wgmma_bn128_s4_scl0", "wgmma_incl_f32_to_f16", "cublas_f16_cached",
                              "cublas_f16_with_dequant"}
    assert (b.groupby(["timing", "variant"]).size() == 2).all()      # two rounds each
    assert (b[b.timing == "events"].median_us == 5.0).all() and (b[b.timing == "lead500"].median_us == 4.0).all()
    assert (b.host_us == 8.0).all() and (b.flush_us == 31.0).all()
    assert seen.count(None) == seen.count(("lead", 500.0)) == len(b) // 2    # each call once per timing per round
    v = tables.lead_view(records.load("wgmma", run.run_id, root=tmp_path))
    assert list(v.timing) == ["events", "lead500"] and (v["best launch"] == "wgmma_bn128_s4_scl0").all()
    assert list(v["wgmma us"]) == [5.0, 4.0] and (v.ratio == 1.0).all() and (v["flush us"] == 31.0).all()


def test_lead_refuses_a_nonpositive_wait():
    from labkernels import bench

    for us in (0, -5, float("nan")):
        with pytest.raises(ValueError, match="positive number of microseconds"):
            bench.Lead(us)


def test_trace_phases_roles_and_durations():
    """trace_phases on synthetic stamps of a stream-K launch: each CTA's segments get the schedule's roles (a tile's
    k = 0 holder is its owner, the rest helpers), and fill / main / finish are the differences of its stamps."""
    from labkernels import wgmma

    od, id_, nt, bn = 256, 1024, 256, 256        # 2 tiles x 4 super-blocks over 3 CTAs: ranges of 2-3 iterations
    ncta, dp = wgmma.schedule(1, nt, od, id_, bn, 3)
    assert (ncta, dp) == (3, 0)
    E = len(traces.TRACE_EVENTS)
    ns = np.zeros((ncta, E + 1), np.uint64)
    clk = np.zeros_like(ns)
    tiles = 2
    for c in range(ncta):
        segs = wgmma.segments(ncta, c, 4, tiles, dp)
        t0 = 1_000_000 + 100 * c
        ns[c, :3] = [t0, t0 + 100, t0 + 2_000]                   # entry, setup, first tile 2 us in
        clk[c, :3] = [1, 161, 3_201]
        t = t0 + 500
        for si, (tile, klo, khi) in enumerate(segs):
            e = 3 + 3 * si
            main_end = max(t, t0 + 2_000) + 1_000 * (khi - klo)   # 1 us per super-block
            ns[c, e:e + 3] = [t, main_end, main_end + (3_000 if klo == 0 else 700)]
            clk[c, e:e + 3] = [(t - t0) * 1.6 + 1, (main_end - t0) * 1.6 + 1, (main_end - t0) * 1.6 + 9]
            t = main_end + 800
    rows = [{"variant": "wgmma_bn256_s4_scl0_sk", **r} for r in traces.trace_rows(ns, clk)]
    ph = traces.trace_phases(rows, od, id_, nt)
    want = [(c, si, "owner" if klo == 0 else "helper", khi - klo) for c in range(ncta)
            for si, (_, klo, khi) in enumerate(wgmma.segments(ncta, c, 4, tiles, dp))]
    assert [(r.cta, r.seg, r.role, r.iters) for r in ph.itertuples()] == want
    first = ph[ph.seg == 0]
    assert np.allclose(first.fill_us, 1.5) and np.allclose(first.main_us, first.iters * 1.0)
    assert np.allclose(ph[ph.role == "owner"].finish_us, 3.0) and np.allclose(ph[ph.role == "helper"].finish_us, 0.7)
    assert np.allclose(first.mhz, 1600, rtol=1e-3)
    with pytest.raises(wgmma.WgmmaError, match="CTAs traced"):    # a data-parallel grid there has 2 CTAs, not 3
        traces.trace_phases([dict(r, variant="wgmma_bn256_s4_scl0") for r in rows], od, id_, nt)


def test_trace_phases_on_the_tile_aligned_split():
    """trace_phases of a tile-aligned split grid (SK=3): the schedule's G comes from the SMs the launch was scheduled
    for, each tile's part 0 is its owner and the others helpers, one segment per CTA; an SM count that gives another
    grid is refused, not read as this one."""
    from labkernels import wgmma

    od, id_, nt, bn = 256, 1024, 256, 256        # 2 tiles x 4 super-blocks; 4 SMs: G = 2, 4 CTAs of 2 super-blocks
    assert wgmma.split_g(3, nt, od, id_, bn, 4) == 2
    ncta, dp = wgmma.schedule(3, nt, od, id_, bn, 4)
    assert (ncta, dp) == (4, 0)
    E = len(traces.TRACE_EVENTS)
    ns = np.zeros((ncta, E + 1), np.uint64)
    clk = np.zeros_like(ns)
    for c in range(ncta):
        t0 = 1_000_000 + 50 * c
        ns[c, :6] = [t0, t0 + 100, t0 + 1_500, t0 + 200, t0 + 1_500 + 2_000, t0 + 1_500 + 2_000 + (4_000 if c % 2 == 0
                                                                                                     else 1_000)]
        clk[c, :6] = [1, 2, 3, 4, 5, 6]
    rows = [{"variant": "wgmma_bn256_s4_scl0_skt", **r} for r in traces.trace_rows(ns, clk)]
    ph = traces.trace_phases(rows, od, id_, nt, sm_count=4)
    assert list(ph.role) == ["owner", "helper", "owner", "helper"] and list(ph.tile) == [0, 0, 1, 1]
    assert (ph.iters == 2).all() and np.allclose(ph.fill_us, 1.3) and np.allclose(ph.main_us, 2.0)
    assert np.allclose(ph.finish_us, [4.0, 1.0, 4.0, 1.0])
    with pytest.raises(wgmma.WgmmaError, match="CTAs traced"):    # 8 SMs: G = 4, an 8-CTA grid
        traces.trace_phases(rows, od, id_, nt, sm_count=8)


def test_best_vs_cublas_names_the_best_launch_with_and_without_the_option():
    """best_vs_cublas: per point, the median over pairs of each launch; the fastest without the option's suffix and
    the fastest of all, as ratios to cuBLAS timed at that point; a point without cuBLAS is left out."""
    import pandas as pd

    rows = []
    for pair, (cb, a, b) in enumerate(((30.0, 36.0, 31.0), (30.0, 34.0, 33.0), (31.0, 35.0, 32.0))):
        for v, us in (("cublas_f16_cached", cb), ("wgmma_bn256_s4_scl0_skt", a), ("wgmma_bn256_s4_scl0_skt_e5", b)):
            rows.append({"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512, "variant": v, "median_us": us})
    rows.append({"qtype": "q6_K", "od": 4096, "id": 4096, "nt": 512, "variant": "wgmma_bn128_s4_scl1",
                 "median_us": 40.0})
    t = tables.best_vs_cublas(pd.DataFrame(rows))
    assert len(t) == 1
    r = t.iloc[0]
    assert r["best without"] == "bn256_s4_scl0_skt" and np.isclose(r["without vs cuBLAS"], 30 / 35)
    assert r["best with"] == "bn256_s4_scl0_skt_e5" and np.isclose(r["with vs cuBLAS"], 30 / 32)


def test_trace_roles_groups_every_shape_of_a_trace_table():
    """trace_roles: a recorded trace table of two shapes is split per shape before trace_phases (each has its own
    schedule) and summarized per role -- the tile-aligned split's owners with their 4 us finish and helpers with 1 us,
    the data-parallel grid's whole tiles, each role's segment count and its last end."""

    E = len(traces.TRACE_EVENTS)
    rows = []
    for od, variant, ncta in ((256, "wgmma_bn256_s4_scl0_skt", 4), (512, "wgmma_bn256_s4_scl0", 4)):
        ns = np.zeros((ncta, E + 1), np.uint64)
        clk = np.zeros_like(ns)
        for c in range(ncta):
            t0 = 1_000_000 + 50 * c
            fin = (4_000 if c % 2 == 0 else 1_000) if variant.endswith("skt") else 500
            ns[c, :6] = [t0, t0 + 100, t0 + 1_500, t0 + 200, t0 + 3_500, t0 + 3_500 + fin]
            clk[c, :6] = [1, 2, 3, 4, 5, 6]
        rows += [{"qtype": "q4_K", "od": od, "id": 1024, "nt": 256, "variant": variant, **r}
                 for r in traces.trace_rows(ns, clk)]
    t = traces.trace_roles(rows, sm_count=4).set_index(["od", "role"])
    assert sorted(t.index) == [(256, "helper"), (256, "owner"), (512, "whole")]
    assert t.loc[(256, "owner"), "segments"] == 2 and np.isclose(t.loc[(256, "owner"), "finish_us"], 4.0)
    assert np.isclose(t.loc[(256, "helper"), "finish_us"], 1.0) and t.loc[(256, "helper"), "iters"] == 2
    assert t.loc[(512, "whole"), "segments"] == 4 and t.loc[(512, "whole"), "iters"] == 4
    assert np.isclose(t.loc[(256, "owner"), "end_us_max"], 0.1 + 3.5 + 4.0)   # CTA 2 starts 100 ns after CTA 0


def test_suffix_ab_pairs_each_option_with_its_base():
    """The A/B helper pairs 'X_a4' with 'X' at the same point only, speedup = base / option time, and the ratios to
    cuBLAS of both; a point without the base gives no row."""
    import pandas as pd

    rows = []
    for pair in range(3):
        for v, us in (("wgmma_bn128_s4_scl0", 40.0), ("wgmma_bn128_s4_scl0_a4", 50.0), ("cublas_f16_cached", 30.0),
                      ("wgmma_bn256_s4_scl0_skt_p2", 20.0)):
            rows.append({"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512, "variant": v, "pair": pair,
                         "median_us": us + pair * 0.1})
    t = tables.suffix_ab(pd.DataFrame(rows))
    assert len(t) == 1 and t.option.iloc[0] == "a4" and t.base.iloc[0] == "wgmma_bn128_s4_scl0"
    assert t.launch.iloc[0] == "BN=128 data-par."   # the base's tile and scheduler, as the figures group them
    assert t.speedup.iloc[0] == pytest.approx(40.1 / 50.1)
    assert t.option_vs_cublas.iloc[0] == pytest.approx(30.1 / 50.1) and t.base_vs_cublas.iloc[0] == pytest.approx(30.1 / 40.1)


def _q4_pairs_by_byte_permutes(hdr: np.ndarray, j: int):
    """wgmma_kq.cu's q4_scales_h for one 16-byte header and chunk j, step by step in integers (byte permutes, the
    magic exponent, one f16 multiply of the exact value): the words (sp, zp) the f16 scale path builds."""
    def perm(x, y, sel):
        b = list(int(x).to_bytes(4, "little")) + list(int(y).to_bytes(4, "little"))
        return int.from_bytes(bytes(b[(sel >> (4 * n)) & 7] for n in range(4)), "little")

    x, y, z, w = (int.from_bytes(hdr[4 * i:4 * i + 4].tobytes(), "little") for i in range(4))
    b = 2 * j if j < 2 else 2 * j - 4
    sel = b | ((b + 1) << 8) | 0x4040
    if j < 2:
        scv = (perm(y, 0, sel) & 0x003F003F) | 0x64006400
        mnv = (perm(z, 0, sel) & 0x003F003F) | 0x64006400
    else:
        wp = perm(w, 0, sel)
        scv = (wp & 0x000F000F) | 0x64006400 | ((perm(y, 0, sel) >> 2) & 0x00300030)
        mnv = ((wp >> 4) & 0x000F000F) | 0x64006400 | ((perm(z, 0, sel) >> 2) & 0x00300030)

    def halves(u):
        return np.array([u & 0xFFFF, u >> 16], np.uint16).view(np.float16).astype(np.float64)

    dd, ndm = halves(perm(x, 0, 0x1010)), halves(perm(x, 0, 0x3232) ^ 0x80008000)
    sp = ((halves(scv) - 1024) * dd).astype(np.float16)      # one rounding of the exact product
    zp = ((halves(mnv) - 1024) * ndm).astype(np.float16)
    return sp.view(np.uint16), zp.view(np.uint16)


def test_scale_plane_is_the_kernels_scale_pairs():
    """The q4_K scale plane (SCL=2) holds, per row, super-block and chunk, the f16 pairs the f16 scale path builds
    from the header in the loop (q4_scales_h, emulated here in integers), and those are the fp32 path's roundings
    (_q4_scales); 32 bytes per 256 weights (+1 bit per weight)."""
    from labkernels import quants, wgmma

    rng = np.random.default_rng(7)
    w = (rng.standard_normal((6, 1024)) * 10.0 ** rng.uniform(-6, 2, (6, 1))).astype(np.float32)
    raw = quants.quantize(w, "q4_K")
    hdr = wgmma.repack(raw, "q4_K").reshape(6, 4, 144)[..., :16]
    pl = wgmma.scale_plane(hdr)
    assert pl.shape == (6, 4, wgmma.PLANE_BYTES) and pl.dtype == np.uint8
    words = pl.view(np.uint16).reshape(6, 4, 4, 2, 2)          # [row, super-block, chunk, (sp, zp), half]
    for r in range(6):
        for sb in range(4):
            for j in range(4):
                sp, zp = _q4_pairs_by_byte_permutes(hdr[r, sb], j)
                assert np.array_equal(words[r, sb, j, 0], sp) and np.array_equal(words[r, sb, j, 1], zp), (r, sb, j)
    sc, mn = wgmma_pack._q4_scales(hdr, bf16=False)
    f = words.view(np.float16).astype(np.float64)
    assert np.array_equal(f[..., 0, :].reshape(6, 4, 8), sc) and np.array_equal(f[..., 1, :].reshape(6, 4, 8), mn)
    assert 8 * wgmma.PLANE_BYTES / 256 == 1.0


def _ab_rows(variants, pairs: int = 3):
    """Benchmark rows of one point (q4_K 4096 x 4096, nt=512): each (variant, us) once per interleaved pair, the
    pair's time 0.1 us later than the one before."""
    return [{"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512, "variant": v, "pair": p, "median_us": us + p * 0.1}
            for p in range(pairs) for v, us in variants]


def test_plane_table_pairs_scl2_with_scl0_per_scheduler():
    import pandas as pd

    rows = _ab_rows((("wgmma_bn128_s4_scl0", 40.0), ("wgmma_bn128_s4_scl2", 32.0), ("wgmma_bn128_s4_scl0_skt", 30.0),
                     ("wgmma_bn128_s4_scl2_skt", 30.0), ("wgmma_bn256_s4_scl0_skt", 28.0), ("cublas_f16_cached", 36.0)))
    t = options.plane_table(pd.DataFrame(rows)).set_index("launch")
    assert sorted(t.index) == ["BN=128 data-par.", "BN=128 tile split"]
    assert t.loc["BN=128 data-par.", "plane_over_header"] == pytest.approx(40.1 / 32.1)
    assert t.loc["BN=128 tile split", "plane_over_header"] == pytest.approx(1.0)
    assert t.loc["BN=128 data-par.", "plane_vs_cublas"] == pytest.approx(36.1 / 32.1)


def test_conv16_table_is_new_over_old():
    """The 16-bit scale path's A/B table: one row per launch, new_over_old = median(old) / median(new) (> 1: the new
    conversion is faster), each build's ratio to cuBLAS; cuBLAS itself is not a launch."""
    import pandas as pd

    rows = _ab_rows((("wgmma_bn128_s4_scl0", 40.0), ("wgmma_bn128_s4_scl0_oldconv", 50.0),
                     ("wgmma_bn256_s4_scl0_sk", 30.0), ("wgmma_bn256_s4_scl0_sk_oldconv", 30.0),
                     ("cublas_f16_cached", 36.0)))
    t = limits.conv16_table(pd.DataFrame(rows)).set_index("variant")
    assert list(t.index) == ["wgmma_bn128_s4_scl0", "wgmma_bn256_s4_scl0_sk"]
    assert t.loc["wgmma_bn128_s4_scl0", "new_over_old"] == pytest.approx(50.1 / 40.1)
    assert t.loc["wgmma_bn256_s4_scl0_sk", "new_over_old"] == pytest.approx(1.0)
    assert t.loc["wgmma_bn128_s4_scl0", "new_vs_cublas"] == pytest.approx(36.1 / 40.1)
    assert t.loc["wgmma_bn128_s4_scl0", "old_vs_cublas"] == pytest.approx(36.1 / 50.1)
    assert t.loc["wgmma_bn256_s4_scl0_sk", "launch"] == "BN=256 stream-K"


def test_ceiling_table_splits_the_weights_cost_into_loads_and_conversion():
    """The ceiling A/B table: per launch, each build's ratio to cuBLAS and the loads' share of the plain launch's
    excess over the no-conversion skeleton, (t - t_noload) / (t - t_noconv); cuBLAS itself is not a launch."""
    import pandas as pd

    rows = _ab_rows((("wgmma_bn128_s4_scl0", 40.0), ("wgmma_bn128_s4_scl0_noload", 36.0),
                     ("wgmma_bn128_s4_scl0_noconv", 30.0), ("wgmma_bn256_s4_scl0_sk", 30.0),
                     ("wgmma_bn256_s4_scl0_sk_noload", 30.0), ("wgmma_bn256_s4_scl0_sk_noconv", 20.0),
                     ("cublas_f16_cached", 36.0)))
    t = limits.ceiling_table(pd.DataFrame(rows)).set_index("variant")
    assert list(t.index) == ["wgmma_bn128_s4_scl0", "wgmma_bn256_s4_scl0_sk"]
    a = t.loc["wgmma_bn128_s4_scl0"]
    assert a.launch == "BN=128 data-par."
    assert a.plain_vs_cublas == pytest.approx(36.1 / 40.1) and a.noconv_vs_cublas == pytest.approx(36.1 / 30.1)
    assert a.noload_vs_cublas == pytest.approx(36.1 / 36.1)
    assert a.loads_share == pytest.approx((40.1 - 36.1) / (40.1 - 30.1))
    assert t.loc["wgmma_bn256_s4_scl0_sk", "loads_share"] == pytest.approx(0.0, abs=1e-12)


def test_gemm_refuses_defines_outside_the_ablation_names():
    """An A/B build is named by LK_ABLATE_* / LK_EXP_* defines only; anything else is refused before any build."""

    with pytest.raises(ValueError):
        wb.check_defines(("LK_BM=32",))
    assert wb.check_defines(("LK_ABLATE_NOCONV", "LK_EXP_TRACE", "LK_EXP_TRACE")) == ("LK_ABLATE_NOCONV",
                                                                                       "LK_EXP_TRACE")
    with pytest.raises(ValueError, match=r"LK_EXP_WTMA: a form that lost .* commit 4a8dcd9"):
        wb.check_defines(("LK_EXP_TRACE", "LK_EXP_WTMA"))    # retired: the commit that builds it
    with pytest.raises(ValueError, match="LK_EXP_WSTAGE.*82d821d"):
        wb.check_defines(("LK_EXP_WSTAGE",))
    with pytest.raises(ValueError, match=r"no build \['LK_EXP_NEVER'\]: this tree builds LK_EXP_TRACE"):
        wb.check_defines(("LK_EXP_NEVER",))


def test_ncu_stalls_reads_the_raw_metrics():
    import pandas as pd

    rows = []
    for case, (lsb, gm) in enumerate(((1.5, 0.3), (0.2, 0.7))):
        for m, v in ((f"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", lsb),
                     (f"smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio", gm),
                     (f"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio", 1.0),
                     (f"smsp__average_warps_issue_stalled_drain_per_issue_active.ratio", 0.01),
                     ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "55.5"),
                     ("Duration", "30")):
            rows.append({"case": case, "kernel": f"k{case}", "sk": 0, "nt": 512, "section": "s", "metric": m,
                         "unit": "", "value": v})
    t = tables.ncu_stalls(pd.DataFrame(rows))
    assert list(t.columns) == ["case", "kernel", "sk", "nt", "tensor pipe % elapsed", "long_scoreboard", "gmma"]
    assert t["long_scoreboard"].tolist() == [1.5, 0.2] and t["tensor pipe % elapsed"].tolist() == [55.5, 55.5]
    assert tables.ncu_stalls(pd.DataFrame(rows[-1:])).empty


def test_registry_rows_and_fit_of_the_pair_exchange():
    """EPI=3 (the 2-CTA cluster pair exchange): the AQ=2 main scale forms, f16, not q6_K BN=256 (it spills in the
    main loop), off the main path; it takes only the shapes where SK=3 gives two CTAs per tile."""
    from labkernels import wgmma

    ks = [k for k in registry.family("wgmma_kq") if k.p["EPI"] == 3]
    assert sorted((k.p["QT"], k.p["BN"]) for k in ks) == [(4, 128), (4, 256), (6, 128)]
    assert all(not k.main_path and k.p["AQ"] == 2 and k.p["PF"] == 0 and k.p["BF16"] == 0 for k in ks)
    assert wgmma.pair_fits(512, 4096, 11008, 256, 132) and wgmma.pair_fits(512, 4096, 4096, 256, 132)
    assert not wgmma.pair_fits(512, 4096, 4096, 128, 132)       # 128 tiles: one CTA each
    assert not wgmma.pair_fits(512, 1000, 4096, 256, 132)       # 16 tiles: 8 CTAs each
    assert wgmma.pair_fits(77, 200, 512, 128, 132) and wgmma.pair_fits(256, 4000, 1792, 128, 132)


def test_registry_rows_and_fit_of_the_reduce_finish():
    """EPI=5 (the reduce finish: a split tile's two CTAs TMA-add into Y, zeroed by the owner's producer warps): the
    AQ=2 main scale forms of both types and tiles, f16, off the main path, EPI=4's 64 KB of staging. It takes a
    schedule only where every tile has at most two CTAs, the helper right after the owner, and no CTA owns two split
    tiles -- the bar's nt=512 BN=256 grids (the tile-aligned split at three shapes, stream-K at 11008 x 4096), not
    stream-K at 4096 x 14336 (56 super-blocks a tile, ~27 a CTA: three CTAs share a tile)."""
    from labkernels import wgmma

    ks = [k for k in registry.family("wgmma_kq") if k.p["EPI"] == 5]
    assert sorted((k.p["QT"], k.p["BN"]) for k in ks) == [(4, 128), (4, 256), (6, 128), (6, 256)]
    assert all(not k.main_path and k.p["AQ"] == 2 and k.p["PF"] == 0 and k.p["BF16"] == 0 for k in ks)
    for od, id_ in ((4096, 4096), (4096, 11008), (4096, 14336)):
        assert wgmma.reduce_fits(3, 512, od, id_, 256, 132)
    assert wgmma.reduce_fits(1, 512, 11008, 4096, 256, 132)
    assert not wgmma.reduce_fits(1, 512, 4096, 14336, 256, 132)
    assert not wgmma.reduce_fits(3, 512, 4096, 4096, 128, 132)        # no tile-aligned grid fits at all
    # the host model, directly: two CTAs a tile (G=2, owner 2t, helper 2t+1) fits; three a tile does not
    assert wgmma.reduce_finish_fits(64, 16, 32, 0, 2)
    assert not wgmma.reduce_finish_fits(96, 16, 32, 0, 3)
    # a schedule that splits no tile (one whole tile a CTA) is EPI=4's, and fits
    assert wgmma.reduce_finish_fits(32, 16, 32, 32)
    # every split tile of a fitting stream-K grid: owner from k = 0, helper the next CTA, to the end of k
    ncta, dp = wgmma.schedule(1, 512, 11008, 4096, 256, 132)
    I, tiles = 4096 // 256, wgmma.tile_count(512, 11008, 256)
    held = {}
    for c in range(ncta):
        for t, klo, khi in wgmma.segments(ncta, c, I, tiles, dp):
            held.setdefault(t, []).append((c, klo, khi))
    split = [sorted(v, key=lambda p: p[1]) for v in held.values() if len(v) > 1]
    assert split and all(a[0] + 1 == b[0] and a[1] == 0 and a[2] == b[1] and b[2] == I for a, b in split)
    # the real-model gate's nt: the fewest tokens at which some tile is split and the grid still fits
    nt = benchmark.reduce_nt(1, 640, 1024, 128, 132)
    assert nt is not None and wgmma.reduce_fits(1, nt, 640, 1024, 128, 132)

    def splits(m):   # some tile of the grid at m tokens is held by two CTAs
        ncta, dp = wgmma.schedule(1, m, 640, 1024, 128, 132)
        return any(klo > 0 for c in range(ncta)
                   for _, klo, _ in wgmma.segments(ncta, c, 1024 // 256, wgmma.tile_count(m, 640, 128), dp))

    assert splits(nt) and not any(wgmma.reduce_fits(1, m, 640, 1024, 128, 132) and splits(m) for m in range(8, nt, 8))


def test_registry_rows_and_auto_of_the_staged_store(tmp_path):
    """EPI=4 (the staged TMA store): the AQ=2 main scale forms of both types and tiles, f16, off the main path, 64 KB
    of staging beyond the ring (BN=256: 4 x 32 KB + 64 KB + alignment still one CTA under the 227 KB cap). A
    recorded EPI=4 winner keeps its epilogue on stream-K (it takes any scheduler, unlike EPI 1-3) and falls back to
    the plain one, said in the reason, where od is not a multiple of 4."""
    from labkernels import wgmma

    ks = [k for k in registry.family("wgmma_kq") if k.p["EPI"] == 4]
    assert sorted((k.p["QT"], k.p["BN"]) for k in ks) == [(4, 128), (4, 256), (6, 128), (6, 256)]
    assert all(not k.main_path and k.p["AQ"] == 2 and k.p["PF"] == 0 and k.p["BF16"] == 0 for k in ks)
    assert all(k.p["SCL"] == wgmma.main_scl("q4_K" if k.p["QT"] == 4 else "q6_K", k.p["BN"]) for k in ks)
    plain = registry.find("wgmma_kq", QT=6, BN=256, STAGES=4, BF16=0, SCL=0, EPI=0, AQ=2, PF=0)
    big = registry.find("wgmma_kq", QT=6, BN=256, STAGES=4, BF16=0, SCL=0, EPI=4, AQ=2, PF=0)
    assert big.dynamic_smem() - plain.dynamic_smem() == 65536 and big.dynamic_smem() <= 227 * 1024
    t = _recorded_auto_table(tmp_path, "q6_K", 11008, 4096, 4096, {"wgmma_bn256_s4_scl0_sk_e4": 500.0,
                                                                   "wgmma_bn256_s4_scl0_sk": 520.0})
    c = dispatch.choose("q6_K", 4096, 11008, 4096, table=t, cc=90)
    assert dict(c.params) == {"BN": 256, "STAGES": 4, "BF16": 0, "SCL": 0, "SK": 1, "EPI": 4} and "EPI=0" not in c.reason
    c = dispatch.choose("q6_K", 4096, 11006, 4096, table=t, cc=90)
    assert dict(c.params)["EPI"] == 0 and "staged TMA store (EPI=4) needs od % 4 == 0, od=11006" in c.reason


def test_pair_nt_is_the_fewest_tokens_that_pair():
    """The real-model gates run EPI=3 at pair_nt tokens: Gemma 3 270M's 640-row tensors (5 row tiles) pair at 7
    token tiles of 128 over 4 super-blocks (35 tiles x 2 CTAs <= 132 < x 3) and 9 over 8; one tile short of a
    multiple of BN (a tail); never where no nt pairs (more tiles than SMs)."""
    from labkernels import wgmma

    assert benchmark.pair_nt(640, 1024, 128, 132) == 7 * 128 - 27
    assert benchmark.pair_nt(640, 2048, 128, 132) == 9 * 128 - 27
    for od, id_, bn in ((640, 1024, 128), (640, 2048, 256), (200, 512, 128)):
        nt = benchmark.pair_nt(od, id_, bn, 132)
        assert wgmma.pair_fits(nt, od, id_, bn, 132) and nt % bn
        assert not any(wgmma.pair_fits(m * bn - 27, od, id_, bn, 132) for m in range(1, (nt + 27) // bn))
    assert benchmark.pair_nt(262144, 2048, 128, 132) is None


def test_auto_drops_a_pair_exchange_that_does_not_pair(tmp_path):
    """A recorded EPI=3 winner is used as recorded where SK=3 gives two CTAs per tile, and with the plain epilogue,
    said in the reason, where it does not."""
    import pandas as pd

    t = pd.DataFrame([{"qtype": "q4_K", "od": 4096, "id": 11008, "nt": 512, "variant": "wgmma_bn256_s4_scl0_skt_e3",
                       "median_us": 30.0, "family": "wgmma_kq",
                       "params": {"BN": 256, "STAGES": 4, "BF16": 0, "SCL": 0, "SK": 3, "EPI": 3}, "run_id": "r"}])
    c = dispatch.choose("q4_K", 512, 4096, 11008, table=t, cc=90)
    assert dict(c.params)["EPI"] == 3 and "pair exchange" not in c.reason
    c = dispatch.choose("q4_K", 512, 1000, 4096, table=t, cc=90)
    assert dict(c.params)["EPI"] == 0 and dict(c.params)["SK"] == 3 and "pair exchange (EPI=3)" in c.reason


def test_ncu_label_names_type_tile_form_and_scheduler():
    assert tables.ncu_label("wgmma_kq[QT=4,BN=256,STAGES=4,BF16=0,SCL=0,EPI=0,AQ=2,PF=0]", 3, 512) == \
        "q4_K BN=256\ntile split nt=512"
    assert tables.ncu_label("wgmma_kq[QT=6,BN=128,STAGES=4,BF16=0,SCL=1,EPI=0,AQ=4,PF=0]", 0, 512, ", ") == \
        "q6_K BN=128 AQ=4, data-par. nt=512"
    assert tables.ncu_label("wgmma_kqs[QT=4,BN=128,STAGES=4,BF16=0]", 1, 4096) == "q4_K BN=128 smem\nstream-K nt=4096"


def test_build_ab_view_reads_speedups_and_gates_of_a_build_run():
    """The page's view of a bitwise build A/B run: plain time / build time per launch and point (from the pairs'
    medians), the launch named, and the gate line saying whether every launch was bitwise and passed."""
    import pandas as pd

    class Run:
        run_id = "20261202T000000Z-h200-abc"

        def __init__(self, ab, gate):
            self.t = {"wgmma_wtma_ab": ab, "wgmma_wtma_gate": gate}

        def table(self, name):
            return self.t[name]

    ab = pd.DataFrame({"qtype": "q6_K", "od": 4096, "id": 4096, "nt": 512,
                       "variant": ["wgmma_bn128_s4_scl1", "wgmma_bn128_s4_scl1_wtma", "cublas_f16_cached"] * 2,
                       "pair": [0, 0, 0, 1, 1, 1], "median_us": [40.0, 36.0, 28.0, 42.0, 38.0, 28.0]})
    gate = pd.DataFrame({"variant": ["wgmma_bn128_s4_scl1"], "bitwise_vs_wtma": [True], "ok": [True]})
    t, line = tables.build_ab_view(Run(ab, gate), "wtma")
    assert len(t) == 1 and t.launch.iloc[0] == "BN=128 data-par."
    assert t.speedup.iloc[0] == pytest.approx(41.0 / 37.0)
    assert t.option_vs_cublas.iloc[0] == pytest.approx(28.0 / 37.0)
    assert "1 launches gated" in line and "bitwise the plain build: True" in line
    gate.loc[0, "bitwise_vs_wtma"] = False
    assert "bitwise the plain build: False" in tables.build_ab_view(Run(ab, gate), "wtma")[1]


def test_ncu_compare_pairs_the_same_kernel_and_grid_of_two_runs():
    """Two ncu runs side by side: rows only for (kernel, grid, nt) in both, each metric as plain / build columns from
    its own run, the launch named."""
    import pandas as pd

    k4 = "wgmma_kq[QT=4,BN=128,STAGES=4,BF16=0,SCL=0,EPI=0,AQ=2,PF=0]"
    k6 = "wgmma_kq[QT=6,BN=128,STAGES=4,BF16=0,SCL=1,EPI=0,AQ=2,PF=0]"

    def run(rows):
        return pd.DataFrame([{"case": c, "kernel": k, "sk": 0, "nt": 512, "od": 4096, "id": 4096, "section": "m",
                              "metric": m, "unit": "", "value": v} for c, k, m, v in rows])

    ls = "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
    tp = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
    plain = run([(0, k4, ls, "0.53"), (0, k4, tp, "68.30"), (1, k6, ls, "1.55"), (1, k6, tp, "52.42")])
    build = run([(0, k4, ls, "1.01"), (0, k4, tp, "63.56")])
    t = tables.ncu_compare(plain, build, columns=("tensor pipe % active", "long_scoreboard"))
    assert len(t) == 1 and t.kernel.iloc[0] == k4
    assert t["long_scoreboard plain"].iloc[0] == pytest.approx(0.53)
    assert t["long_scoreboard build"].iloc[0] == pytest.approx(1.01)
    assert t["tensor pipe % active build"].iloc[0] == pytest.approx(63.56)
    assert t.launch.iloc[0].startswith("q4_K BN=128")
    assert tables.ncu_compare(plain, build.iloc[0:0]).empty


def _timing_shim(monkeypatch) -> list:
    """The CPU shim for an A/B step of labkernels.wgmma: the GPU and the wgmma kernels emulated, every timing a
    constant 10 us after one call, no flush, a 132-SM device; returns the list the 1-CTA empty kernel's (grid,
    threads) are appended to when it is launched."""
    import types

    from cpu_gpu_shim import install, install_wgmma

    from labkernels import bench, wgmma

    cp = install(monkeypatch, exact=True)
    install_wgmma(monkeypatch, f16_only=False)
    monkeypatch.setattr(wgmma, "_cp", lambda: cp)

    def fake(fn, warmup=3, repeats=20, flush=None, **kw):
        fn()
        return np.full(3, 10.0)

    calls = []
    monkeypatch.setattr(bench, "time_launches", fake)
    monkeypatch.setattr(bench, "Flusher", lambda: None)
    monkeypatch.setattr(bench, "EmptyLaunch", lambda grid, threads: lambda: calls.append((grid, threads)))
    monkeypatch.setattr(cp.cuda, "Device", lambda: types.SimpleNamespace(id=0), raising=False)
    monkeypatch.setattr(wgmma, "_sm_count", lambda dev: 132)
    return calls


def test_floor_ab_times_every_launch_of_record_beside_its_empty_build(monkeypatch, tmp_path):
    """floor_ab on the CPU shim: at each point every launch of record that the grid takes is gated, then timed with
    its empty build (``<variant>_empty``), cuBLAS and the 1-CTA empty kernel; floor_view pairs each launch with its
    empty build and subtracts, and with a trace's spans says what lies outside the stamps and above the floor."""
    import pandas as pd

    from labkernels import records

    calls = _timing_shim(monkeypatch)
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        limits.floor_ab(run, {"shapes": [[256, 512]], "nts": [40], "qtypes": ["q4_K"], "pairs": 2})
    r = records.load("wgmma", run.run_id, root=tmp_path)
    ab, gate = r.table("wgmma_floor_ab"), r.table("wgmma_floor_gate")
    launches = set(gate.variant)
    assert gate.ok.all() and "wgmma_bn128_s4_scl0" in launches
    assert set(ab.variant) == launches | {v + "_empty" for v in launches} | {"cublas_f16_cached",
                                                                           limits.EMPTY_1CTA}
    assert calls and set(calls) == {(1, 32)}
    # the view on a made-up table: plain 30, empty 5, cuBLAS 27, 1-CTA 3; a trace span of 24
    df = pd.DataFrame({"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512,
                       "variant": ["wgmma_bn128_s4_scl0", "wgmma_bn128_s4_scl0_empty", "cublas_f16_cached",
                                   limits.EMPTY_1CTA] * 2, "pair": [0] * 4 + [1] * 4,
                       "median_us": [29.0, 4.0, 26.0, 2.0, 31.0, 6.0, 28.0, 4.0]})
    spans = pd.DataFrame({"qtype": ["q4_K"], "od": [4096], "id": [4096], "nt": [512],
                          "variant": ["wgmma_bn128_s4_scl0"], "span_us": [24.0]})
    v = limits.floor_view(df, spans)
    assert len(v) == 1
    row = v.iloc[0]
    assert (row.plain_us, row.empty_us, row.above_floor_us, row.cublas_us, row.empty_1cta_us) == (30, 5, 25, 27, 3)
    assert row.ratio == pytest.approx(0.9) and row.outside_us == 6.0 and row.drain_us == 1.0
    assert "outside_us" not in limits.floor_view(df).columns


def test_trace_spans_first_to_last_stamp():
    import pandas as pd

    t = pd.DataFrame({"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512, "variant": ["a", "a", "a", "b", "b"],
                      "t_us": [0.1, 5.0, 26.9, 0.0, 3.5]})
    s = traces.trace_spans(t).set_index("variant").span_us
    assert s["a"] == pytest.approx(26.8) and s["b"] == pytest.approx(3.5)


def test_empty_launch_refuses_a_shape_no_launch_has():
    from labkernels import bench

    for grid, threads in ((0, 32), (1, 0), (1, 2048), (1.5, 32)):
        with pytest.raises(ValueError, match="empty launch"):
            bench.EmptyLaunch(grid, threads)


def test_clock_ab_probes_every_launch_and_cublas_and_the_view_compares_clocks(monkeypatch, tmp_path):
    """clock_ab on the CPU shim: each launch of record that the grid takes is gated, then probed round by round with
    cuBLAS and the probe alone (the idle clock); clock_view gives each launch its clock against cuBLAS's and the
    ratio in time and in cycles."""
    import types

    import pandas as pd
    from cpu_gpu_shim import install, install_wgmma

    from labkernels import bench, records, wgmma

    cp = install(monkeypatch, exact=True)
    install_wgmma(monkeypatch, f16_only=False)
    monkeypatch.setattr(wgmma, "_cp", lambda: cp)
    monkeypatch.setattr(cp.cuda, "Device", lambda: types.SimpleNamespace(id=0), raising=False)
    monkeypatch.setattr(wgmma, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(bench, "Flusher", lambda: None)
    monkeypatch.setattr(bench, "time_launches", lambda fn, warmup=3, repeats=20, flush=None, **kw: (fn(), np.ones(3))[1])

    class Probe:
        def __init__(self, window_us):
            self.window_us = window_us

        def mhz(self, fn, flush=None, repeats=10):
            if fn is not None:
                fn()
            return [1500.0 if fn is None else 1700.0] * repeats

    monkeypatch.setattr(bench, "ClockProbe", Probe)
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        limits.clock_ab(run, {"shapes": [[256, 512]], "nts": [40], "qtypes": ["q6_K"], "pairs": 2})
    r = records.load("wgmma", run.run_id, root=tmp_path)
    c, g = r.table("wgmma_clock"), r.table("wgmma_clock_gate")
    assert g.ok.all() and set(c.variant) == set(g.variant) | {"cublas_f16_cached", "probe_alone"}
    assert (c.groupby("variant").size() == 2).all() and c.median_us.isna().sum() == 2   # the probe alone: no time
    df = pd.DataFrame({"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512,
                       "variant": ["wgmma_bn256_s4_scl0_skt_e5", "cublas_f16_cached", "probe_alone"],
                       "round": 0, "mhz_median": [1600.0, 1800.0, 1980.0], "median_us": [32.0, 27.0, np.nan]})
    v = limits.clock_view(df).set_index("variant")
    assert list(v.index) == ["wgmma_bn256_s4_scl0_skt_e5", "cublas_f16_cached"]
    w = v.loc["wgmma_bn256_s4_scl0_skt_e5"]
    assert w.mhz_vs_cublas == pytest.approx(1600 / 1800) and w.kcycles == pytest.approx(32 * 1.6)
    assert w.ratio == pytest.approx(27 / 32) and w.ratio_in_cycles == pytest.approx(27 * 1800 / (32 * 1600))
    assert w.idle_mhz == 1980.0


def test_clock_probe_refuses_a_window_it_cannot_spin():
    from labkernels import bench

    for us in (0, -1, float("inf")):
        with pytest.raises(ValueError, match="positive number of microseconds"):
            bench.ClockProbe(us)


def test_trace_cold_pairs_each_role_warm_and_from_a_flushed_l2():
    """trace_cold on the recorded trace run of the sixteenth step (data/, run 20261203T130504Z): every role of every
    traced launch appears once, both ways, its ratio of cycles per super-block is the two columns' quotient, and the
    spans are the stamps' first-to-last of each table."""
    from labkernels import records

    run = records.load("wgmma", "20261203T130504Z-h200-e9d5a870b7")
    t = traces.trace_cold(run)
    roles = traces.trace_roles(run.table("trace"), run.meta["params"]["sm_count"])
    assert len(t) == len(roles) and not t.duplicated(["qtype", "od", "id", "variant", "role"]).any()
    assert np.allclose(t.cycles_cold_over_warm, t.cycles_per_iter_cold / t.cycles_per_iter_warm)
    sp = traces.trace_spans(run.table("trace_flushed")).set_index("variant")
    q4 = t[(t.qtype == "q4_K") & (t.od == 4096) & (t.variant == "wgmma_bn256_s4_scl0_skt_e5")]
    assert set(q4.role) == {"owner", "helper"}
    assert np.allclose(q4.span_us_cold, sp[(sp.qtype == "q4_K") & (sp.od == 4096)].loc["wgmma_bn256_s4_scl0_skt_e5",
                                                                                      "span_us"])



def test_kscan_ab_gates_times_and_fits_the_fixed_cost_per_launch(monkeypatch, tmp_path):
    """kscan_ab on the CPU shim: every launch of record at every id is gated, then timed with cuBLAS and the 1-CTA
    empty kernel; cuBLAS is also timed alone at the small ids. kscan_fit recovers a made-up line's intercept and
    slope per launch and for the fastest launch per point, and kscan_points marks the fastest launch's ratio."""
    import pandas as pd

    from labkernels import blas, records

    calls, dense = _timing_shim(monkeypatch), []
    monkeypatch.setattr(blas, "gemm_dense", lambda x, w, out=None: dense.append(out))
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        limits.kscan_ab(run, {"shapes": [[256, 256], [256, 512]], "nts": [40], "qtypes": ["q4_K"], "pairs": 2,
                          "cublas_small_ids": [16, 64]})
    r = records.load("wgmma", run.run_id, root=tmp_path)
    ab, gate = r.table("wgmma_kscan_ab"), r.table("wgmma_kscan_gate")
    assert gate.ok.all() and set(gate["id"]) == {256, 512} and "wgmma_bn128_s4_scl0" in set(gate.variant)
    kq = ab[ab.qtype == "q4_K"]
    assert set(kq.variant) == set(gate.variant) | {limits.CUBLAS, limits.CUBLAS_F32OUT, limits.EMPTY_1CTA}
    alone = ab[ab.qtype == "f16"]
    assert set(alone["id"]) == {16, 64} and set(alone.variant) == {limits.CUBLAS, limits.CUBLAS_F32OUT, limits.EMPTY_1CTA}
    assert len(alone) == 2 * 3 * 2 and calls and set(calls) == {(1, 32)}
    assert dense and all(o.dtype == np.float32 and o.shape == (40, 256) for o in dense)  # fp32 out, the point's shape
    # made-up medians: launch a = 8 + 0.005 id, launch b = 3 + 0.007 id (faster below id 2500), cuBLAS 6 + 0.0055 id
    ids = [512, 1024, 4096, 8192]
    lines = {"wgmma_a": (8.0, 0.005), "wgmma_b": (3.0, 0.007), limits.CUBLAS: (6.0, 0.0055)}
    rows = [{"qtype": "q4_K", "od": 4096, "id": k, "nt": 512, "variant": v, "pair": pr,
             "median_us": a + b * k + (0.5 if pr == 1 else 0.0) - (0.5 if pr == 2 else 0.0)}
            for v, (a, b) in lines.items() for k in ids for pr in range(3)]
    rows += [{"qtype": "f16", "od": 4096, "id": k, "nt": 512, "variant": limits.CUBLAS, "pair": 0,
              "median_us": 6.0 + k * 0.001} for k in (64, 16)]
    rows += [{"qtype": "q4_K", "od": 4096, "id": 512, "nt": 512, "variant": limits.EMPTY_1CTA, "pair": 0,
              "median_us": 2.5}]
    df = pd.DataFrame(rows)
    fit = limits.kscan_fit(df).set_index("variant")
    for v, (a, b) in lines.items():
        assert fit.loc[v, "intercept_us"] == pytest.approx(a) and fit.loc[v, "ns_per_k"] == pytest.approx(b * 1e3)
        assert fit.loc[v, "max_resid_us"] < 1e-9 and fit.loc[v, "n_ids"] == 4
    best = [min(8 + 0.005 * k, 3 + 0.007 * k) for k in ids]
    slope, icpt = np.polyfit(ids, best, 1)
    assert fit.loc["best", "intercept_us"] == pytest.approx(icpt) and fit.loc["best", "ns_per_k"] == pytest.approx(slope * 1e3)
    assert fit.loc["best", "max_resid_us"] > 0.1     # the min of two lines is not a line
    assert (fit.cublas_min_k == 16).all() and fit.cublas_min_k_us.iloc[0] == pytest.approx(6.016)
    assert fit.empty_1cta_us.iloc[0] == 2.5 and fit.cublas_f32out_min_k_us.isna().all()  # none in this table
    pts = limits.kscan_points(df)
    marked = pts.dropna(subset=["ratio"]).sort_values("id")
    assert list(marked["id"]) == ids and list(marked.variant) == ["wgmma_b", "wgmma_b", "wgmma_a", "wgmma_a"]
    assert marked.ratio.iloc[0] == pytest.approx((6 + 0.0055 * 512) / (3 + 0.007 * 512))
    # kscan_compare on launches named as the main path's: split 12 + 0.005 k, BN=128 7 + 0.006 k, cuBLAS 6 + 0.005 k,
    # cuBLAS fp32 out 7 + 0.005 k
    named = {"wgmma_bn256_s4_scl0_skt_e5": (12.0, 0.005), "wgmma_bn128_s4_scl0": (7.0, 0.006),
             limits.CUBLAS: (6.0, 0.005), limits.CUBLAS_F32OUT: (7.0, 0.005)}
    df2 = pd.DataFrame([{"qtype": "q4_K", "od": 4096, "id": k, "nt": 512, "variant": v, "pair": 0,
                         "median_us": a + b * k} for v, (a, b) in named.items() for k in (512, 4096, 14336)])
    c = limits.kscan_compare(limits.kscan_fit(df2), limits.kscan_points(df2)).iloc[0]
    assert c.split_extra_us == pytest.approx(6.0) and c.split_per_k == pytest.approx(0.0, abs=1e-9)
    assert c.bn128_extra_us == pytest.approx(1.0) and c.bn128_per_k == pytest.approx(0.2)
    assert c.f32out_extra_us == pytest.approx(1.0) and c.f32out_per_k == pytest.approx(0.0, abs=1e-9)
    assert c.hybrid_us_4096 == pytest.approx(7 + 0.005 * 4096)
    assert c.hybrid_ratio_14336 == pytest.approx((6 + 0.005 * 14336) / (7 + 0.005 * 14336))
    assert limits.kscan_compare(limits.kscan_fit(df), limits.kscan_points(df)).empty   # no launch of the main path


def test_kscan_lines_draws_every_fitted_launch_with_units_and_zooms():
    """plotting.kscan_lines: one marker series and one fitted line per launch with a fit and per cuBLAS form, the
    open markers of cuBLAS alone, the empty kernel's floor; labelled axes with units; max_id zooms x and y."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkernels import plotting

    ids = [512, 1024, 4096]
    lines = {"wgmma_bn128_s4_scl0": (7.0, 0.006), "wgmma_bn256_s4_scl0_skt_e5": (12.0, 0.005),
             limits.CUBLAS: (6.0, 0.0053), limits.CUBLAS_F32OUT: (7.0, 0.0053)}
    rows = [{"qtype": "q4_K", "od": 4096, "id": k, "nt": 512, "variant": v, "pair": 0, "median_us": a + b * k}
            for v, (a, b) in lines.items() for k in ids]
    rows += [{"qtype": "q4_K", "od": 4096, "id": 512, "nt": 512, "variant": "wgmma_bn256_s4_scl0_sk_e5", "pair": 0,
              "median_us": 14.0},   # one id only: no line, not drawn
             {"qtype": "q4_K", "od": 4096, "id": 512, "nt": 512, "variant": limits.EMPTY_1CTA, "pair": 0,
              "median_us": 2.7}]
    rows += [{"qtype": "f16", "od": 4096, "id": k, "nt": 512, "variant": limits.CUBLAS, "pair": 0, "median_us": 7.0}
             for k in (16, 64)]
    df = pd.DataFrame(rows)
    pts, fit = limits.kscan_points(df), limits.kscan_fit(df)
    fig, (a, b) = plt.subplots(1, 2)
    plotting.kscan_lines(a, pts, fit, "q4_K", "full")
    plotting.kscan_lines(b, pts, fit, "q4_K", "zoom", max_id=1100)
    labels = [t.get_text() for t in a.get_legend().get_texts()]
    assert len(labels) == 4 + 2 and any(t.startswith("cuBLAS fp16, fp32 out: 7.0 us + 5.30 ns/k") for t in labels)
    assert "bn256_s4_scl0_skt_e5: 12.0 us + 5.00 ns/k" in labels and not any("sk_e5" in t for t in labels)
    assert len(a.lines) == 2 * 4 + 2        # markers + line per fit, cuBLAS alone, the empty kernel's floor
    assert "(us)" in a.get_ylabel() and "elements" in a.get_xlabel()
    assert b.get_xlim() == (0, 1100) and b.get_ylim()[1] == pytest.approx((12.0 + 5.12) * 1.15)
    plt.close(fig)


def test_kpair_grid_pairs_m_tiles_and_the_launcher_refuses_other_shapes():
    """LK_EXP_KPAIR's grid: 64-row m tiles rounded up to an even count (a cluster's two CTAs share a token tile) x
    256-token tiles; its launcher takes the one launch shape it is built for and refuses the rest before any GPU
    call."""
    assert wb.kpair_grid(512, 4096) == 64 * 2          # the bar's nt=512 at od=4096: 128 CTAs, one wave
    assert wb.kpair_grid(512, 11008) == 172 * 2
    assert wb.kpair_grid(37, 640) == 10                # Gemma's 640 rows: 10 m tiles, one token tile
    assert wb.kpair_grid(300, 130) == 4 * 2            # 3 m tiles -> 4 (one padded), 2 token tiles
    assert wb.kpair_grid(256, 64) == 2 and wb.kpair_grid(257, 64) == 4
    from labkernels.kernels import registry

    k = registry.find("wgmma_kq", QT=4, **{n: v for n, v in wb.KPAIR_PARAMS.items() if n != "SK"})
    ring = 2 * wb.KPAIR_HALF_STAGES * 256 * 64 * 2     # stages of [256 tokens x 64 k] f16, both warpgroups'
    assert k.dynamic_smem() + wb.kpair_ring_bytes(k, wb.KPAIR) == ring + 1024   # + the 1024-byte alignment
    assert wb.kpair_ring_bytes(k, ()) == 0 and wb.kpair_ring_bytes(k, ("LK_EXP_TRACE",)) == 0
    k5 = registry.find("wgmma_kq", QT=4, BN=256, STAGES=4, BF16=0, SCL=0, EPI=5, AQ=2, PF=0)
    assert wb.kpair_ring_bytes(k5, wb.KPAIR) == 0    # an instantiation the build traps in (refused first)
    assert ring + 1024 + 96 <= 232448                     # the H200's opt-in shared memory per block
    for bad in ({"BN": 128}, {"SK": 3}, {"EPI": 5}, {"AQ": 4}, {"BF16": 1}):
        with pytest.raises(errors.ShapeError, match="LK_EXP_KPAIR is built for"):
            wb._gemm_kpair(None, None, None, None, {**wb.KPAIR_PARAMS, **bad})


def test_kpair_build_compiles_its_two_instantiations_without_spills():
    """-DLK_EXP_KPAIR builds every registered instantiation (the others trap: the launcher never runs them); its
    two launch shapes (q4_K and q6_K at BN=256, the main scale form, the plain epilogue) have no spills, and round 7's
    source of exploratory builds refuses a retired form (it names the commit that builds it)."""
    import shutil

    from labkernels import wgmma
    from labkernels.kernels import registry

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    _, names = wb.cubin("wgmma_kq.cu", wb.KPAIR)
    for qt in (4, 6):
        k = registry.find("wgmma_kq", QT=qt, **{n: v for n, v in wb.KPAIR_PARAMS.items() if n != "SK"})
        e = names[k.key]
        assert e["spill_stores"] == 0 and e["spill_loads"] == 0 and e["stack_frame"] == 0, e
        assert not e["wgmma_serialized"], e
    with pytest.raises(wgmma.WgmmaError, match="a retired round-7 form: it is built at commit 4a8dcd9"):
        wb.cubin("wgmma_kq.cu", ("LK_EXP_KPAIR", "LK_EXP_WTMA"))   # past check_defines: the source's own guard
    # the trace of it builds (twenty-fifth step): q4_K without spills, q6_K's 8 B outside its main loop (the run's SASS)
    _, names = wb.cubin("wgmma_kq.cu", wb.check_defines(wb.KPAIR + ("LK_EXP_TRACE",)))
    k = registry.find("wgmma_kq", QT=4, **{n: v for n, v in wb.KPAIR_PARAMS.items() if n != "SK"})
    assert names[k.key]["spill_stores"] == 0 and not names[k.key]["wgmma_serialized"]


def _kpair_shim(monkeypatch, off: float = 1.0):
    """The timing shim, every gemm call recorded as (defines, params); the build's Y scaled by ``off`` (1: exact)
    and the model a q4_K and a q6_K synthetic tensor."""
    from labkernels import cases, model

    _timing_shim(monkeypatch)
    seen, real = [], wb.gemm

    def gemm(w, x, out=None, defines=(), **p):
        seen.append((tuple(defines), p))
        y = real(w, x, out=out, **p)
        if defines == wb.KPAIR:
            y *= off
        return y

    monkeypatch.setattr(wb, "gemm", gemm)
    rng = np.random.default_rng(5)
    monkeypatch.setattr(model, "load_kquant", lambda path=None: [
        ("blk.0.ffn_up.weight", "q4_K", cases.synthetic_weights("q4_K", 96, 512, rng)),
        ("blk.0.ffn_down.weight", "q6_K", cases.synthetic_weights("q6_K", 64, 256, rng))])
    return seen


def test_kpair_ab_gates_the_build_on_the_model_and_at_every_point_then_times_it(monkeypatch, tmp_path):
    """kpair_ab on the CPU shim: the build through every model tensor at both token counts, then at each point every
    launch of record that the grid takes and the build are gated before they are timed with cuBLAS; kpair_table
    puts the build beside the fastest launch of record."""
    import pandas as pd

    from labkernels import records

    seen = _kpair_shim(monkeypatch)
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        kpair.kpair_ab(run, {"shapes": [[256, 512]], "nts": [40], "qtypes": ["q4_K", "q6_K"], "pairs": 2})
    r = records.load("wgmma", run.run_id, root=tmp_path)
    real, ab, gate = r.table("real_model_parity"), r.table("wgmma_kpair_ab"), r.table("wgmma_kpair_gate")
    assert len(real) == 2 * len(kpair.KPAIR_REAL_NTS) and real.ok.all() and set(real.variant) == {kpair.KPAIR_VARIANT}
    assert set(real.nt) == set(kpair.KPAIR_REAL_NTS) and (real.int8_nmse > 0).all()
    assert gate.ok.all() and set(gate.qtype) == {"q4_K", "q6_K"}
    for q in ("q4_K", "q6_K"):
        v = set(gate[gate.qtype == q].variant)
        assert kpair.KPAIR_VARIANT in v and any(x.startswith("wgmma_bn128_s4_scl") for x in v) and len(v) >= 3
        assert set(ab[ab.qtype == q].variant) == v | {"cublas_f16_cached"}
    built = [p for d, p in seen if d == wb.KPAIR]
    assert built and all(p == wb.KPAIR_PARAMS for p in built)
    # made-up medians: cuBLAS 10 us, the launches of record 12 and 11, the build 9.5
    rows = [{"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512, "variant": v, "pair": p, "median_us": t}
            for v, t in (("cublas_f16_cached", 10.0), ("wgmma_bn256_s4_scl0_skt_e5", 12.0),
                         ("wgmma_bn128_s4_scl0", 11.0), (kpair.KPAIR_VARIANT, 9.5)) for p in range(3)]
    t = kpair.kpair_table(pd.DataFrame(rows)).iloc[0]
    assert t.best_record == "bn128_s4_scl0" and t.best_record_us == 11.0 and t.kpair_us == 9.5
    assert t.kpair_vs_cublas == pytest.approx(10 / 9.5) and t.best_record_vs_cublas == pytest.approx(10 / 11)
    assert t.kpair_over_best == pytest.approx(11 / 9.5)


def test_kpair_ab_stops_at_a_build_that_fails_the_model_gate(monkeypatch, tmp_path):
    from labkernels import records

    _kpair_shim(monkeypatch, off=1.01)
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        with pytest.raises(AssertionError, match="real-model gate failed: blk.0.ffn_up.weight LK_EXP_KPAIR nt=37"):
            kpair.kpair_ab(run, {"shapes": [[256, 512]], "nts": [40], "qtypes": ["q4_K"], "pairs": 2})


def test_kpair_ab_gates_a_second_form_of_the_build_and_times_it_beside(monkeypatch, tmp_path):
    """kpair_ab(builds=...): the FIN form real-model gated under its own variant and gated at every point, launched
    with its own defines and the build's one launch shape, timed beside the build; a FIN that fails its gate stops the
    A/B (here its Y made 1% off)."""
    from labkernels import records

    seen = _kpair_shim(monkeypatch)
    plan = {"shapes": [[256, 512]], "nts": [40], "qtypes": ["q4_K"], "pairs": 2}
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        kpair.kpair_ab(run, plan, builds={"_fin": wb.KPAIR_FIN})
    r = records.load("wgmma", run.run_id, root=tmp_path)
    real, ab, gate = r.table("real_model_parity"), r.table("wgmma_kpair_ab"), r.table("wgmma_kpair_gate")
    fv = kpair.KPAIR_VARIANT + "_fin"
    assert set(real.variant) == {kpair.KPAIR_VARIANT, fv} and real.ok.all()
    assert len(real[real.variant == fv]) == 2 * len(kpair.KPAIR_REAL_NTS)
    assert fv in set(gate.variant) and gate.ok.all() and len(ab[ab.variant == fv]) == 2
    fin = [p for d, p in seen if d == wb.KPAIR_FIN]
    assert fin and all(p == wb.KPAIR_PARAMS for p in fin)
    real_gemm = wb.gemm

    def gemm(w, x, out=None, defines=(), **p):
        y = real_gemm(w, x, out=out, defines=defines, **p)
        if tuple(defines) == wb.KPAIR_FIN:
            y *= 1.01
        return y

    monkeypatch.setattr(wb, "gemm", gemm)
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        with pytest.raises(AssertionError, match="real-model gate failed: .* LK_EXP_KPAIR LK_EXP_KPAIR_FIN nt=37"):
            kpair.kpair_ab(run, plan, builds={"_fin": wb.KPAIR_FIN})


def _kpair_rows(kp: float, rec: float = 11.0, cb: float = 10.0):
    """Made-up A/B rows: cuBLAS, one launch of record and the build at every point, times scaled with id."""

    return [{"qtype": q, "od": 4096, "id": i, "nt": nt, "variant": v, "pair": p, "median_us": t * (i / 4096)}
            for q in ("q4_K", "q6_K") for i in (4096, 14336) for nt in (512, 4096) for p in range(3)
            for v, t in (("cublas_f16_cached", cb), ("wgmma_bn256_s4_scl0_skt_e5", rec), (kpair.KPAIR_VARIANT, kp))]


def test_kpair_builds_and_series_bars_put_every_build_beside_the_best_launch_of_record():
    """kpair_builds labels each run's kpair_table rows by build; plotting.build_series_bars draws, per shape, the
    last run's best launch of record and one bar per build (its ratio to cuBLAS), the 1.0 line, labelled axes."""
    import types

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkernels import plotting

    runs = [(f"build {k}", types.SimpleNamespace(table=lambda name, kp=kp: pd.DataFrame(_kpair_rows(kp))))
            for k, kp in ((1, 20.0), (2, 12.5))]
    t = kpair.kpair_builds(runs)
    assert list(dict.fromkeys(t.build)) == ["build 1", "build 2"] and len(t) == 2 * 2 * 2 * 2
    b2 = t[(t.build == "build 2") & (t.qtype == "q4_K") & (t.nt == 512)]
    assert np.allclose(b2.kpair_vs_cublas, 10 / 12.5) and np.allclose(b2.best_record_vs_cublas, 10 / 11)
    fig, ax = plt.subplots()
    plotting.build_series_bars(ax, t, "q4_K", 512, "q4_K, nt=512")
    heights = [round(p.get_height(), 4) for p in ax.patches]
    assert len(ax.patches) == 3 * 2                           # best of record + 2 builds, 2 shapes
    assert heights.count(round(10 / 11, 4)) == 2 and heights.count(0.5) == 2 and heights.count(0.8) == 2
    assert [tk.get_text() for tk in ax.get_xticklabels()] == ["4096 x 4096", "4096 x 14336"]
    assert "cuBLAS" in ax.get_ylabel() and ax.get_xlabel() and any(ln.get_ydata()[0] == 1 for ln in ax.lines)
    plt.close(fig)


def test_kpair_ncu_reads_each_case_and_refuses_one_that_is_not_there():
    import pandas as pd

    key = "QT=4,BN=256,STAGES=4,BF16=0,SCL=0,EPI=0"
    rows = [{"case": c, "kernel": f"wgmma_kq[{key},AQ=2,PF=0]", "sk": sk, "nt": nt, "od": 4096, "id": 4096,
             "metric": m, "value": v}
            for c, sk, nt, mult in ((0, 0, 512, 1.0), (1, 0, 4096, 2.0), (2, 3, 512, 3.0))
            for m, v in (("L2 Cache Throughput", f"{40 * mult:.2f}"), ("Issue Slots Busy", "1,234.5"),
                         ("smsp__average_warps_issue_stalled_membar_per_issue_active.ratio", str(0.1 * mult)))]
    t = pd.DataFrame(rows)
    v = kpair.kpair_ncu([("a", t, key, 0, 4096), ("b", t, key, 3, 512)])
    assert v.loc["L2 throughput %", "a"] == 80 and v.loc["L2 throughput %", "b"] == 120
    assert v.loc["stall: membar", "a"] == pytest.approx(0.2) and v.loc["issue slots busy %", "b"] == 1234.5
    assert np.isnan(v.loc["stall: wait", "a"])                # not in the run: NaN, not a made-up number
    with pytest.raises(ValueError, match="no ncu case"):
        kpair.kpair_ncu([("c", t, key, 1, 512)])


# ---- twenty-second step: the shared-memory budget, the half-B ablation, the baseline's counters ----

def test_smem_bytes_per_clk_is_the_budget_of_each_tile_form():
    """The model: wgmma's B reads are 64 B/clk whatever the token tile; the TMA's activation writes 4096 / rows (what
    a CTA receives); the shared-memory form adds A's reads and writes, 4096 / tokens each."""

    assert kpair.smem_bytes_per_clk(128, 256)["total"] == 96 == kpair.smem_bytes_per_clk(128, 128)["total"]
    kp = kpair.smem_bytes_per_clk(64, 256)
    assert (kp["b_read"], kp["b_write"], kp["total"]) == (64, 64, 128)
    assert kpair.smem_bytes_per_clk(64, 256, recv_tokens=128)["total"] == 96          # the half-B ablation
    ss = kpair.smem_bytes_per_clk(128, 128, a_in_smem=True, a_written=True)
    assert (ss["a_read"], ss["a_write"], ss["total"]) == (32, 32, 160)
    assert kpair.smem_model("kpair", "", 256)["total"] == 128 and kpair.smem_model("halfb", "", 256)["total"] == 96
    assert kpair.smem_model("lab", "", 128)["total"] == 96


def test_cublas_tile_reads_wgmma_m_and_n_from_the_kernel_name():
    assert kpair.cublas_tile("nvjet_sm90_hsh_128x128_64x6_2x1_v_bz_TNT") == (128, 128)
    assert kpair.cublas_tile("nvjet_sm90_hsh_168x128_64x5_1x2_h_bz_TNN") == (128, 168)   # M in steps of 64
    assert kpair.cublas_tile("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT") == (256, 128)
    assert kpair.cublas_tile("sm90_gemm_kernel") is None
    m = kpair.smem_model("cublas", "nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT", 0)
    assert (m["b_read"] + m["a_read"], m["b_write"] + m["a_write"]) == (96, 48)
    assert np.isnan(kpair.smem_model("cublas", "a kernel without a tile", 0)["total"])


def _smem_ncu_rows(case, who, name, bn, tensor, reads, writes, cycles=1000.0, sm=132):
    """Made-up ncu rows of one case of the twenty-second step (its first kernel; a second kernel's rows beside)."""
    vals = {"Grid Size": "128", "Cluster Size": "2", "Duration": "25,536", "SM Frequency": "1.655e9",
            "sm__cycles_elapsed.avg": str(cycles),
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": str(tensor),
            "l1tex__data_bank_reads.sum": str(reads * sm * cycles / 4),
            "l1tex__data_bank_writes.sum": str(writes * sm * cycles / 4),
            "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed": "28.3",
            "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed": "19.0", "Issue Slots Busy": "10.8",
            "Block Size": "384", "# SMs": str(sm)}
    base = {"case": case, "who": who, "qtype": "q4_K" if who != "cublas" else "f16", "nt": 512, "od": 4096,
            "id": 4096, "BN": bn, "SK": 0, "EPI": 0, "kernel_name": name, "section": "s", "unit": ""}
    return ([{**base, "kernel_id": 0, "metric": m, "value": v} for m, v in vals.items()]
            + [{**base, "kernel_id": 1, "kernel_name": "other", "metric": "Grid Size", "value": "7"}])


def test_smem_table_turns_bank_counts_into_bytes_per_clock_beside_the_model():
    """smem_table: per case its first kernel only; bytes per SM per clock = bank accesses x 4 B / SMs / elapsed
    cycles, per tensor-active clock over the tensor pipe's share; the model's reads and writes beside; a short
    launch name; plotting.smem_bars draws both measures with the model's ticks and one label per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkernels import plotting

    rows = (_smem_ncu_rows(0, "cublas", "nvjet_sm90_hsh_128x128_64x6_2x1_v_bz_TNT", 0, 85.0, 72.25, 48.45)
            + _smem_ncu_rows(1, "kpair", "void wgmma_kq_kernel<4, 256, 4, 0, 0, 0, 2, 0>(LkTmap)", 256, 50.0, 32.0,
                             32.0))
    t = kpair.smem_table(pd.DataFrame(rows)).set_index("case")
    assert list(t.grid) == [128, 128] and t.loc[0, "duration_us"] == pytest.approx(25.536)
    assert list(t.cycles) == [1000.0, 1000.0]
    assert t.loc[0, "read_B_per_clk"] == pytest.approx(72.25) and t.loc[0, "read_per_tensor_clk"] == pytest.approx(85)
    assert t.loc[0, "write_per_tensor_clk"] == pytest.approx(57) and t.loc[0, "sm_mhz"] == pytest.approx(1655)
    assert (t.loc[0, "model_read"], t.loc[0, "model_write"]) == (96, 64)
    assert (t.loc[1, "model_read"], t.loc[1, "model_write"]) == (64, 64) and t.loc[1, "write_per_tensor_clk"] == 64
    assert t.loc[0, "launch"] == "128x128_64x6_2x1_v_bz_TNT" and t.loc[1, "launch"] == "KPAIR 64 x 256"
    assert t.loc[1, "kernel"] == "wgmma_kq_kernel<4, 256, 4, 0, 0, 0, 2, 0>"
    other = pd.DataFrame(_smem_ncu_rows(0, "lab", "k", 128, 50.0, 32.0, 16.0, sm=66))   # per SM of its own run
    assert kpair.smem_table(other).read_B_per_clk.iloc[0] == pytest.approx(32)
    with pytest.raises(ValueError, match="no '# SMs'"):
        kpair.smem_table(pd.DataFrame([x for x in rows if x["metric"] != "# SMs"]))
    fig, axs = plt.subplots(2, 1)
    plotting.smem_bars(axs, t.reset_index(), "t", labels=kpair.KPAIR_BUILD_LABELS)
    assert len(axs[0].patches) == 4 and len(axs[1].patches) == 2
    ticks = [tk.get_text() for tk in axs[1].get_xticklabels()]
    assert ticks == ["cuBLAS 4096x4096 nt=512", "q4_K KPAIR nt=512"]
    assert "tensor-active clock" in axs[0].get_ylabel() and "%" in axs[1].get_ylabel()
    assert len(axs[0].collections) == 2                      # the model's reads and writes
    plt.close(fig)


def test_halfb_builds_puts_the_ablation_beside_the_kpair_build():
    import pandas as pd

    rows = _kpair_rows(12.5) + [{**r, "variant": kpair.KPAIR_VARIANT + "_halfb", "median_us": r["median_us"] * 0.8}
                                for r in _kpair_rows(12.5) if r["variant"] == kpair.KPAIR_VARIANT]
    t = kpair.halfb_builds(pd.DataFrame(rows))
    assert list(dict.fromkeys(t.build)) == ["KPAIR", "KPAIR, half B (ablation)"] and len(t) == 2 * 8
    h = t[t.build != "KPAIR"]
    assert np.allclose(h.halfb_over_kpair, 1 / 0.8) and np.allclose(h.kpair_vs_cublas, 10 / 10)
    assert t[t.build == "KPAIR"].halfb_over_kpair.isna().all()


def test_decouple_table_and_ablation_builds_put_each_ablation_beside_the_kpair_build():
    """decouple_table's ratios to cuBLAS and its three quotients (conversion, coupling, conversion when decoupled);
    kpair_ablation_builds: one block of rows per ablation present, each with its own time in the kpair_* columns and
    over_kpair = KPAIR / ablation; build_series_bars draws every build."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkernels import plotting

    f = {"_halfb": 0.95, "_decoupled": 0.8, "_noconv": 0.9, "_decoupled_noconv": 0.64}
    assert set(kpair.DECOUPLE_ABLATIONS) == set(f)
    base = _kpair_rows(12.5)
    rows = base + [{**r, "variant": kpair.KPAIR_VARIANT + sfx, "median_us": r["median_us"] * k}
                   for sfx, k in f.items() for r in base if r["variant"] == kpair.KPAIR_VARIANT]
    t = kpair.decouple_table(pd.DataFrame(rows))
    assert len(t) == 8 and np.allclose(t.kpair_vs_cublas, 0.8) and np.allclose(t.decoupled_vs_cublas, 1.0)   # cuBLAS 10
    assert np.allclose(t.conversion, 1 / 0.9) and np.allclose(t.coupling, 0.95 / 0.8)
    assert np.allclose(t.conversion_decoupled, 0.8 / 0.64)
    assert kpair.decouple_table(pd.DataFrame([r for r in rows if r["variant"] != kpair.KPAIR_VARIANT])).empty
    labels = {k: kpair.KPAIR_BUILD_LABELS[k.lstrip("_")] for k in kpair.DECOUPLE_ABLATIONS}
    b = kpair.kpair_ablation_builds(pd.DataFrame(rows), labels)
    assert list(dict.fromkeys(b.build)) == ["KPAIR", *labels.values()] and len(b) == 5 * 8
    for sfx, k in f.items():
        g = b[b.build == labels[sfx]]
        assert np.allclose(g.over_kpair, 1 / k) and np.allclose(g.kpair_vs_cublas, 0.8 / k)
    assert b[b.build == "KPAIR"].over_kpair.isna().all()
    fig, ax = plt.subplots()
    plotting.build_series_bars(ax, b, "q4_K", 512)
    assert len(ax.patches) == 6 * 2   # best of record + 5 builds, at each of the two shapes
    plt.close(fig)
    fig = plotting.build_series_grid(b, "the builds", ncol=3)
    axs = fig.axes
    assert len(axs) == 4 and [a.get_title() for a in axs] == ["q4_K, nt=512", "q4_K, nt=4096", "q6_K, nt=512",
                                                              "q6_K, nt=4096"]
    assert all(len(a.patches) == 12 for a in axs) and fig._suptitle.get_text() == "the builds"
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == 6
    plt.close(fig)


def test_kpair_trace_phases_reads_the_kpair_bodys_stamps():
    """kpair_trace_phases: per CTA the phases between the KPAIR body's stamps (its exit in slot 6), cycles per
    super-block of warpgroup 1 (ceil(id / 512)), the SM clock; a trace without the exit stamp is refused."""
    from labkernels import wgmma

    ev = traces.KPAIR_TRACE
    stamps = {"entry": (0.0, 0), "setup": (0.5, 850), "first_tile": (2.5, 4250), "mma_end": (20.5, 34850),
              "done": (22.5, 38250), "exit": (22.75, 38675)}
    rows = [{"cta": c, "smid": c, "event": ev[k], "t_us": us + c, "cta_us": us, "cycles": cy}
            for c in range(3) for k, (us, cy) in stamps.items()]
    t = traces.kpair_trace_phases(rows, id_=4096)
    assert len(t) == 3 and np.allclose(t.setup_us, 0.5) and np.allclose(t.fill_us, 2.0)
    assert np.allclose(t.main_us, 20.0) and np.allclose(t.finish_us, 2.0) and np.allclose(t.exit_us, 0.25)
    assert list(t.end_us) == [22.75, 23.75, 24.75]
    assert np.allclose(t.cycles_per_iter, (34850 - 850) / 8) and np.allclose(t.mhz, 1700)
    assert np.allclose(traces.kpair_trace_phases(rows, id_=4352).cycles_per_iter, (34850 - 850) / 9)   # 17 sb: 9
    assert np.allclose(t.loop_cycles_per_iter, (34850 - 4250) / 8)
    with pytest.raises(wgmma.WgmmaError, match="without every stamp"):
        traces.kpair_trace_phases([r for r in rows if r["event"] != ev["exit"]], id_=4096)
    # kpair_trace_table: both builds on the same phases, from a run's tables (BN=128: the plain body's stamps)
    import pandas as pd

    bn = [{"cta": c, "smid": c, "event": e, "t_us": us, "cta_us": us, "cycles": cy}
          for c in range(2) for e, (us, cy) in {"entry": (0.0, 0), "setup": (0.1, 170), "seg0_start": (0.8, 1360),
                                                 "first_tile": (2.0, 3400), "seg0_mma_end": (22.0, 36168),
                                                 "seg0_done": (24.0, 40800)}.items()]
    key = {"qtype": "q4_K", "od": 11008, "id": 4096, "nt": 512}

    class Run:
        tabs = {"kpair_trace_flushed": pd.DataFrame([{**key, "variant": "k", **r} for r in rows]),
                "bn128_trace_flushed": pd.DataFrame([{**key, "variant": "b", **r} for r in bn])}

        def has(self, n):
            return n in self.tabs

        def table(self, n):
            return self.tabs[n]

    tt = traces.kpair_trace_table(Run()).set_index("build")
    assert list(tt.L2) == ["cold", "cold"] and list(tt.od) == [11008, 11008]
    k, b = tt.loc["KPAIR 64 x 256"], tt.loc["BN=128 data-parallel"]
    assert k.to_first_tile_us == pytest.approx(2.5) and k.loop_us == pytest.approx(18.0) and k.pipe_cycles == 4096
    assert k.loop_over_pipe == pytest.approx((34850 - 4250) / 8 / 4096) and k.end_us_max == pytest.approx(24.75)
    assert b.to_first_tile_us == pytest.approx(2.0) and b.loop_us == pytest.approx(20.0) and b.pipe_cycles == 2048
    assert b.loop_cycles_per_iter == pytest.approx((36168 - 3400) / 16) and np.isnan(b.exit_us)
    assert b.finish_us == pytest.approx(2.0) and b.end_us_max == pytest.approx(24.0) and b.mhz == pytest.approx(1700)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkernels import plotting

    fig, ax = plt.subplots()
    plotting.trace_phase_bars(ax, tt.reset_index(), "t")
    assert len(ax.patches) == 2 * len(plotting.TRACE_PHASES)   # every phase of both bars (BN=128's exit: 0 wide)
    widths = [p.get_width() for p in ax.patches]
    assert sum(widths[:2]) == pytest.approx(2.5 + 2.0) and widths[-1] == 0   # first-stage phase; BN=128 no exit
    assert "us" in ax.get_xlabel() and ax.get_yticklabels()[0].get_text() == "q4_K 11008 x 4096, KPAIR 64 x 256"
    plt.close(fig)


def test_early_table_reads_each_builds_traced_launches():
    """early_table: per traced build and shape, the cold phases as medians over CTAs, then over the build's launches
    (``rep``): setup, fill, their sum, the loop from the first stage, finish, exit, the last stamp; a run without the
    table gives an empty frame. trace_launch refuses defines that are not a KPAIR form, and defines without kpair."""
    import pandas as pd

    from labkernels import wgmma

    ev = traces.KPAIR_TRACE

    def launch(fill, rep_shift):
        st = {"entry": 0.0, "setup": 0.8, "first_tile": 0.8 + fill, "mma_end": 24.0, "done": 25.6, "exit": 26.0}
        return [{"cta": c, "smid": c, "event": ev[k], "t_us": us + 0.1 * c + rep_shift, "cta_us": us,
                 "cycles": int(us * 1700)} for c in range(4) for k, us in st.items()]

    key = {"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512}
    rows = [{**key, "variant": "fin", "rep": r, **x} for r in range(3) for x in launch(2.0, r)]
    rows += [{**key, "variant": "early", "rep": r, **x} for r in range(3) for x in launch(1.0 + 0.1 * r, 0)]

    class Run:
        def __init__(self, tabs):
            self.tabs = tabs

        def has(self, n):
            return n in self.tabs

        def table(self, n):
            return self.tabs[n]

    t = traces.early_table(Run({"kpair_trace_flushed": pd.DataFrame(rows)})).set_index("variant")
    assert list(t.launches) == [3, 3]
    f, e = t.loc["fin"], t.loc["early"]
    assert f.setup_us == pytest.approx(0.8) and f.fill_us == pytest.approx(2.0) and f.to_first_tile_us == pytest.approx(2.8)
    assert f.loop_us == pytest.approx(24.0 - 2.8) and f.finish_us == pytest.approx(1.6) and f.exit_us == pytest.approx(0.4)
    assert f.end_us_max == pytest.approx(26.0 + 0.3 + 1)   # the median launch's last CTA (rep 1: shifted by 1 us)
    assert e.fill_us == pytest.approx(1.1) and e.loop_us == pytest.approx(24.0 - 1.9)
    assert traces.early_table(Run({})).empty
    with pytest.raises(wgmma.WgmmaError, match="a form of the KPAIR build"):
        traces.trace_launch(None, None, kpair=True, defines=("LK_ABLATE_NOCONV",))
    with pytest.raises(wgmma.WgmmaError, match="only for a KPAIR trace"):
        traces.trace_launch(None, None, defines=wb.KPAIR_FIN)


KPAIR_FORMS = [  # a form of the KPAIR build: (its defines' name in builds / kpair, its guard in the source, defines refused, why)
    ("HALFB", "#if defined(LK_ABLATE_HALFB) && !defined(LK_EXP_KPAIR)", ("LK_ABLATE_HALFB",),
     "LK_ABLATE_HALFB is an ablation of the LK_EXP_KPAIR build"),
    ("DECOUPLED", "#if defined(LK_ABLATE_DECOUPLE) && !defined(LK_ABLATE_HALFB)", ("LK_ABLATE_DECOUPLE", "LK_EXP_KPAIR"),
     "LK_ABLATE_DECOUPLE is an ablation of the LK_ABLATE_HALFB build"),
    ("KPAIR_NOCONV", None, None, None), ("DECOUPLED_NOCONV", None, None, None),
    ("KPAIR_FIN", "#if defined(LK_EXP_KPAIR_FIN) && !defined(LK_EXP_KPAIR)", ("LK_EXP_KPAIR_FIN",),
     "LK_EXP_KPAIR_FIN is a form of the LK_EXP_KPAIR build only"),
    ("FIN_HALFY", "#if defined(LK_ABLATE_HALFY) && !defined(LK_EXP_KPAIR_FIN)", ("LK_EXP_KPAIR", "LK_ABLATE_HALFY"),
     "LK_ABLATE_HALFY is an ablation of the LK_EXP_KPAIR_FIN build only")]


@pytest.mark.parametrize("name,guard,refused,why", KPAIR_FORMS, ids=[f[0] for f in KPAIR_FORMS])
def test_kpair_forms_compile_without_spills_and_only_beside_their_base(name, guard, refused, why):
    """Each ablation / form of the KPAIR build: its two launch shapes compile with no spills and no serialized wgmma,
    and nvcc refuses it without the build it is a form of."""
    import shutil

    from labkernels import wgmma
    from labkernels.kernels import registry

    if guard:
        assert guard in wb.EXPERIMENTS["wgmma_kq.cu"].read_text()
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    _, names = wb.cubin("wgmma_kq.cu", wb.check_defines(getattr(wb, name, None) or getattr(kpair, name)))
    for qt in (4, 6):
        k = registry.find("wgmma_kq", QT=qt, **{n: v for n, v in wb.KPAIR_PARAMS.items() if n != "SK"})
        e = names[k.key]
        assert e["spill_stores"] == 0 and e["spill_loads"] == 0 and e["stack_frame"] == 0, e
        assert not e["wgmma_serialized"], e
    if refused:
        with pytest.raises(wgmma.WgmmaError, match=why):
            wb.cubin("wgmma_kq.cu", refused)


def test_forms_over_puts_each_form_beside_the_base_per_point():
    import pandas as pd

    key = {"qtype": "q4_K", "od": 4096, "id": 4096}
    rows = [{**key, "nt": nt, "cublas_us": 30.0 * f, "build": b, "kpair_us": us * f, "kpair_vs_cublas": 30.0 / us}
            for nt, f in ((512, 1), (4096, 8)) for b, us in (("F", 33.0), ("E", 36.0), ("O", 32.0), ("KPAIR", 34.0))]
    t = kpair.forms_over(pd.DataFrame(rows), "F", {"F": "fin", "E": "early", "O": "overlap", "X": "absent"})
    assert list(t.nt) == [512, 4096] and list(t.cublas_us) == [30.0, 240.0]
    assert t.fin_vs_cublas.tolist() == pytest.approx([30 / 33] * 2)
    assert t.early_over_fin.tolist() == pytest.approx([33 / 36] * 2) and t.overlap_over_fin.tolist() == pytest.approx([33 / 32] * 2)
    assert "absent_vs_cublas" not in t.columns and "fin_over_fin" not in t.columns and "kpair_vs_cublas" not in t.columns


def test_ratio_by_point_draws_a_bar_per_series_and_shape():
    import matplotlib
    import pandas as pd

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkernels import plotting

    t = pd.DataFrame([{"qtype": q, "od": od, "id": 4096, "nt": nt, "r": 1.0 + 0.01 * i}
                      for i, (q, od, nt) in enumerate((q, od, nt) for q in ("q4_K", "q6_K") for od in (4096, 11008)
                                                      for nt in (512, 4096))])
    fig, ax = plt.subplots()
    plotting.ratio_by_point(ax, t, "r", "ratio", "t")
    assert len(ax.patches) == 8 and [x.get_text() for x in ax.get_xticklabels()] == ["4096 x 4096", "11008 x 4096"]
    assert sorted(round(p.get_height(), 3) for p in ax.patches) == [round(1.0 + 0.01 * i, 3) for i in range(8)]
    assert [x.get_text() for x in ax.get_legend().get_texts()] == ["q4_K, nt=512", "q4_K, nt=4096", "q6_K, nt=512",
                                                                   "q6_K, nt=4096"]
    assert ax.get_ylim()[0] <= 0.98 and "od x id" in ax.get_xlabel()
    plt.close(fig)


def test_kpair_ab_times_an_ablation_beside_the_build_and_never_gates_it(monkeypatch, tmp_path):
    """kpair_ab(ablations=...): the half-B build is launched with its own defines and the build's one launch shape,
    timed beside the rest, and never gated (its Y, here all NaN, would fail any gate)."""
    from labkernels import records

    seen = _kpair_shim(monkeypatch)
    real = wb.gemm

    def gemm(w, x, out=None, defines=(), **p):
        y = real(w, x, out=out, defines=defines, **p)
        if tuple(defines) == kpair.HALFB:
            y.fill(np.nan)
        return y

    monkeypatch.setattr(wb, "gemm", gemm)
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        kpair.kpair_ab(run, {"shapes": [[256, 512]], "nts": [40], "qtypes": ["q4_K"], "pairs": 2},
                    ablations={"_halfb": kpair.HALFB})
    r = records.load("wgmma", run.run_id, root=tmp_path)
    ab, gate = r.table("wgmma_kpair_ab"), r.table("wgmma_kpair_gate")
    hv = kpair.KPAIR_VARIANT + "_halfb"
    assert hv in set(ab.variant) and len(ab[ab.variant == hv]) == 2 and hv not in set(gate.variant)
    assert gate.ok.all() and kpair.KPAIR_VARIANT in set(gate.variant)
    hb = [p for d, p in seen if d == kpair.HALFB]
    assert hb and all(p == wb.KPAIR_PARAMS for p in hb)


def _ncu_step_shim(monkeypatch, fail=lambda case: False):
    """The ncu steps' outside world on the CPU: each ``ncu`` command recorded and answered with one made-up CSV row
    and its case line (rc=1 and no output where ``fail(case)``; any other command runs for real: the recording's git
    provenance), and ``kpair.kpair_ab`` recording what it was asked. Returns (commands, kpair_ab calls)."""
    import subprocess
    import types

    cmds, ab, real_run = [], [], subprocess.run

    def run(cmd, **kw):
        if cmd[0] != "ncu":
            return real_run(cmd, **kw)
        cmds.append(cmd)
        case = cmd[-8:]
        if fail(case):
            return types.SimpleNamespace(returncode=1, stdout="", stderr="==ERROR== profiling failed")
        out = ('"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
               f'"0","k_{case[0]}","SOL","Duration","ns","1,000"\n' + "case " + " ".join(case) + "\n")
        return types.SimpleNamespace(returncode=0, stdout=out, stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(kpair, "kpair_ab", lambda run, plan=None, progress=print, builds=None, ablations=None:
                        ab.append((plan, ablations) if builds is None else (plan, ablations, builds)))
    return cmds, ab


def test_smem_step_profiles_each_case_in_its_own_process_and_records_what_ran(monkeypatch, tmp_path):
    """gpu-check's wgmma_smem: one ncu process per case, profiled from cudaProfilerStart (--profile-from-start off),
    cuBLAS's kernels unfiltered and the lab's by name, only the metrics this ncu lists; the rows of each case that
    ran (its case line printed) recorded with the case's fields; a failing case is said and left out (ok False);
    then the half-B A/B through kpair_ab with the ablation."""
    import types

    from labkernels import ncu, records
    from labkernels.rounds.r07_wgmma import runs as r7

    monkeypatch.setattr(ncu, "query_metrics", lambda: ("l1tex__data_bank_reads\nsm__pipe_tensor", {
        "sm__pipe_tensor_cycles_active", "l1tex__data_bank_reads", "sm__cycles_elapsed"}))
    cmds, ab = _ncu_step_shim(monkeypatch, fail=lambda case: case[0] == "halfb" and case[2] == "4096"
                              and case[1] == "q6_K")
    logs = []
    res = r7.step_wgmma_smem(tmp_path, types.SimpleNamespace(log=logs.append))
    assert len(cmds) == len(r7.SMEM_CASES) and all("--profile-from-start" in c and "off" in c for c in cmds)
    for c in cmds:
        assert ("-k" in c) == (c[-8] != "cublas")
        m = c[c.index("--metrics") + 1].split(",")
        assert set(m) == {"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                          "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed", "l1tex__data_bank_reads.sum",
                          "sm__cycles_elapsed.avg"}
    assert res["ok"] is False and any("failed rc=1" in x for x in logs)
    r = records.load("wgmma", res["run"], root=tmp_path / "data")
    t = r.table("smem_ncu")
    assert t.case.nunique() == len(r7.SMEM_CASES) - 1 and set(t.who) == {"cublas", "lab", "kpair", "halfb"}
    row = t[t.who == "cublas"].iloc[0]
    assert row.kernel_name == "k_cublas" and row.metric == "Duration" and row.value == "1,000" and row.od in (4096, 11008)
    assert {(c[0], c[2]) for c in r7.SMEM_CASES if c[0] == "cublas"} == {("cublas", n) for n in (512, 4096)}
    assert len([c for c in r7.SMEM_CASES if c[0] == "cublas"]) == 2 * len(benchmark.SHAPES)
    assert ab == [(kpair.HALFB_AB, {"_halfb": kpair.HALFB})]


def test_decouple_step_profiles_the_kpair_builds_and_times_every_ablation(monkeypatch, tmp_path):
    """gpu-check's wgmma_decouple: one ncu process per case of DECOUPLE_CASES (cuBLAS and each KPAIR build at the
    bar's point), the lab's cases filtered by name; the cases recorded with their fields; then the A/B through
    kpair_ab with the four ablations; the driver maps every KPAIR build name to its defines."""
    import types

    from labkernels import ncu, records
    from labkernels.rounds.r07_wgmma import runs as r7

    monkeypatch.setattr(ncu, "query_metrics", lambda: ("sm__pipe_tensor", {"sm__pipe_tensor_cycles_active"}))
    cmds, ab = _ncu_step_shim(monkeypatch)
    res = r7.step_wgmma_decouple(tmp_path, types.SimpleNamespace(log=lambda m: None))
    assert res["ok"] is True and len(cmds) == len(r7.DECOUPLE_CASES) == 1 + 2 * len(kpair.KPAIR_BUILDS)
    assert [("-k" in c) for c in cmds] == [c[-8] != "cublas" for c in cmds]
    t = records.load("wgmma", res["run"], root=tmp_path / "data").table("smem_ncu")
    assert set(t.who) == {"cublas", *kpair.KPAIR_BUILDS} and set(t.nt) == {512} and set(t.od) == {4096}
    assert ab == [(kpair.DECOUPLE_AB, kpair.DECOUPLE_ABLATIONS)]
    assert "kpair.KPAIR_BUILDS[who]" in r7.SMEM_DRIVER


def test_smemform_ab_gates_every_form_and_times_each_beside_its_no_conversion_build(monkeypatch, tmp_path):
    """smemform_ab on the CPU shim: both shared-memory forms and the register form (BN=256 too above nt=512) gated
    then timed; each BN=128 form's LK_ABLATE_NOCONV build launched with its own parameters and never gated (its Y,
    here all NaN, would fail any gate); smemform_table's ratios to cuBLAS and the conversion's cost."""
    import pandas as pd

    from labkernels import records

    _timing_shim(monkeypatch)
    seen, real = [], wb.gemm

    def gemm(w, x, out=None, defines=(), **p):
        seen.append((tuple(defines), p))
        y = real(w, x, out=out, **p)
        if tuple(defines) == kpair.NOCONV:
            y.fill(np.nan)
        return y

    monkeypatch.setattr(wb, "gemm", gemm)
    with records.recording("wgmma", {"what": "shim"}, root=tmp_path) as run:
        kpair.smemform_ab(run, {"shapes": [[256, 512]], "nts": [40, 600], "pairs": 2})
    r = records.load("wgmma", run.run_id, root=tmp_path)
    ab, gate = r.table("wgmma_smemform_ab"), r.table("wgmma_smemform_gate")
    assert gate.ok.all() and len(gate[gate.nt == 40]) == 3 and len(gate[gate.nt == 600]) == 4
    assert not any(v.endswith("_noconv") for v in gate.variant)
    nc = {v for v in ab.variant if v.endswith("_noconv")}
    assert nc == {"wgmma_smem_bn128_s4_noconv", "wgmma_smem_bn128_s4_c2_noconv", "wgmma_bn128_s4_scl0_noconv"}
    assert {p.get("FORM") for d, p in seen if d == kpair.NOCONV} == {1, 2, None}
    rows = [{"qtype": "q4_K", "od": 4096, "id": 4096, "nt": 512, "variant": v, "pair": p, "median_us": t}
            for v, t in (("cublas_f16_cached", 10.0), ("wgmma_smem_bn128_s4", 20.0),
                         ("wgmma_smem_bn128_s4_noconv", 16.0), ("wgmma_bn128_s4_scl0", 12.0),
                         ("wgmma_bn128_s4_scl0_noconv", 9.5)) for p in range(3)]
    t = kpair.smemform_table(pd.DataFrame(rows)).set_index("launch")
    assert t.loc["smem_bn128_s4", "vs_cublas"] == 0.5 and t.loc["smem_bn128_s4", "noconv_vs_cublas"] == 10 / 16
    assert t.loc["smem_bn128_s4", "conv_cost"] == 20 / 16 and t.loc["bn128_s4_scl0", "conv_cost"] == 12 / 9.5


def test_smemform_bars_draw_each_form_with_its_no_conversion_build():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkernels import plotting

    t = pd.DataFrame([{"qtype": "q4_K", "od": od, "id": 4096, "nt": 512, "launch": ln, "vs_cublas": v,
                       "noconv_vs_cublas": v + 0.2}
                      for od in (4096, 11008) for ln, v in (("smem_bn128_s4", 0.5), ("smem_bn128_s4_c2", 0.6),
                                                             ("bn128_s4_scl0", 0.8), ("bn256_s4_scl0", 0.9))])
    fig, ax = plt.subplots()
    plotting.smemform_bars(ax, t, 512, "nt=512")
    h = sorted(round(p.get_height(), 3) for p in ax.patches)
    assert len(ax.patches) == 3 * 2 * 2 and h == sorted([0.5, 0.6, 0.8, 0.7, 0.8, 1.0] * 2)   # BN=256 left out
    assert [tk.get_text() for tk in ax.get_xticklabels()] == ["4096 x 4096", "11008 x 4096"]
    assert "cuBLAS" in ax.get_ylabel() and any(ln.get_ydata()[0] == 1 for ln in ax.lines)
    assert sum("no conversion" in t_.get_text() for t_ in ax.legend().get_texts()) == 3
    plt.close(fig)


def test_variant_name_parse_and_params_round_trip():
    """wgmma.Variant is the typed form of a round-7 variant: parse(name) gives it back (name is what records and CSVs
    carry), its params are the recorded choice table's, and every register-form instantiation of the registry under
    every scheduler names and parses back to itself."""
    names = ["wgmma_bn128_s4_scl0", "wgmma_bn256_s4_scl0_sk", "wgmma_bn256_s4_scl0_skt_e5", "wgmma_bn128_s4_scl1_a4",
             "wgmma_bn128_s4_scl0_sku_p2", "wgmma_smem_bn128_s4_sk_c2", "wgmma_smem_bn256_s3"]
    for n in names:
        v = wgmma.Variant.parse(n)
        assert v.name == n and wgmma.variant_params(n, "q4_K") == ("wgmma_kq", v.params)
    assert wgmma.Variant.parse("wgmma_bn256_s4_scl0_skt_e5") == wgmma.Variant(256, 4, 0, SK=3, EPI=5)
    assert wgmma.Variant.parse("wgmma_bn256_s4_scl0_skt_e5").params == {"BN": 256, "STAGES": 4, "BF16": 0, "SCL": 0,
                                                                         "SK": 3, "EPI": 5}
    assert wgmma.Variant.parse("wgmma_smem_bn128_s4_sk_c2").params == {"BN": 128, "STAGES": 4, "BF16": 0, "SK": 1,
                                                                        "FORM": 2}
    for k in registry.family("wgmma_kq"):
        for sk in range(4):
            v = wgmma.Variant(k.p["BN"], k.p["STAGES"], k.p["SCL"], sk, 0, k.p["EPI"], k.p["AQ"], k.p["PF"])
            assert wgmma.Variant.parse(v.name) == v
            assert v.name == wgmma.variant_name(k.p["BN"], k.p["STAGES"], k.p["SCL"], sk, 0, k.p["EPI"], k.p["AQ"],
                                                k.p["PF"])
    with pytest.raises(ValueError, match="not a round-7 variant"):
        wgmma.Variant.parse("wgmma_bn128_s4")
    with pytest.raises(ValueError, match="shared-memory form"):
        wgmma.Variant(128, 4, FORM=1, EPI=2)


def test_fit_rules_are_what_auto_falls_back_by_and_gemm_refuses():
    """One table of scheduler / epilogue fit rules (wgmma.FIT_RULES): fit() applies their fallbacks in order, each with
    its reason, and what it returns breaks no rule; misfit() (what gemm refuses by) names a rule exactly where fit()
    changes the variant."""
    V = wgmma.Variant
    cases = [(V(256, 4, SK=3, EPI=2), 512, 4096, 11008), (V(256, 4, SK=3, EPI=2), 512, 11008, 4096),
             (V(256, 4, SK=3, EPI=2), 512, 4094, 11008), (V(256, 4, SK=1, EPI=4), 4096, 11006, 4096),
             (V(256, 4, SK=3, EPI=3), 512, 1000, 4096), (V(256, 4, SK=3, EPI=3), 512, 4096, 11008),
             (V(256, 4, SK=1, EPI=5), 512, 4096, 4096), (V(256, 4, SK=1, EPI=5), 512, 11008, 4096),
             (V(256, 4, SK=3, EPI=5), 512, 11008, 4096), (V(128, 4), 512, 4096, 4096)]
    for v, nt, od, id_ in cases:
        f, whys = wgmma.fit(v, nt, od, id_, 132)
        assert (wgmma.misfit(v, nt, od, id_, 132) is None) == (not whys) == (f == v), (v, nt, od, id_)
        assert wgmma.misfit(f, nt, od, id_, 132) is None, (v, f)
    f, whys = wgmma.fit(V(256, 4, SK=3, EPI=2), 512, 11008, 4096, 132)
    assert f == V(256, 4, SK=1) and "with the plain epilogue (EPI=2 takes one segment per CTA)" in whys[0]
    f, whys = wgmma.fit(V(256, 4, SK=1, EPI=5), 512, 4096, 4096, 132)
    assert f == V(256, 4, SK=1, EPI=4) and "reduce finish (EPI=5) needs at most two CTAs a tile" in whys[0]
    assert [r.name for r in wgmma.FIT_RULES] == ["split-k grid", "TMA store rows", "staged store rows",
                                                 "pair exchange", "reduce finish"]


def test_auto_drops_a_reduce_finish_that_does_not_fit(tmp_path):
    """A recorded EPI=5 winner runs as recorded where its tiles have at most two CTAs each, and as the staged TMA
    store (EPI=4), said in the reason, where they do not (before the fit table, gemm refused it there)."""
    t = _recorded_auto_table(tmp_path, "q4_K", 11008, 4096, 512, {"wgmma_bn256_s4_scl0_sk_e5": 30.0,
                                                                  "wgmma_bn256_s4_scl0_sk": 35.0})
    c = dispatch.choose("q4_K", 512, 11008, 4096, table=t, cc=90)
    assert dict(c.params)["EPI"] == 5 and "reduce finish" not in c.reason
    c = dispatch.choose("q4_K", 512, 4096, 4096, table=t, cc=90)
    assert dict(c.params) == {"BN": 256, "STAGES": 4, "BF16": 0, "SCL": 0, "SK": 1, "EPI": 4}
    assert "reduce finish (EPI=5) needs at most two CTAs a tile, which SK=1 does not give at 4096x4096 nt=512" in c.reason
