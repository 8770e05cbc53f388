"""CPU checks of round 9's decode kernels (labkernels.gemv): the kernel's exact function against gguf-py, the q6_K
repack, and the numpy mirror of the kernel's bit operations (lane_dequant) against the exact function, bit for bit."""
import numpy as np
import pytest

from labkernels import gemv, quants


def _raw(rng, qtype, od, id_):
    w = rng.standard_normal((od, id_)) * 10.0 ** rng.uniform(-5, 1, (od, 1))   # rows from ~1e-5 to ~10
    w[rng.integers(0, od), rng.integers(0, id_)] *= 50
    return quants.quantize(w.astype(np.float32), qtype)


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
def test_exact_function_is_gguf_dequantization_rounded_to_f16(rng, qtype):
    """The kernel's weights are gguf-py's dequantized weights up to f16 rounding of the scale and of the result:
    within a few f16 ulps of each weight's row scale, never a wrong code or scale."""
    import gguf

    raw = _raw(rng, qtype, 33, 768)
    w16 = gemv.emulate_weights(raw, qtype).astype(np.float64)
    w64 = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype.upper()]).astype(np.float64)
    row = np.abs(w64).max(axis=1, keepdims=True)
    assert (np.abs(w16 - w64) <= 4 * 2.0 ** -11 * row + 1e-30).all()
    assert np.isfinite(w16).all()


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("od,id_", [(1, 256), (17, 512), (64, 2304)])
def test_lane_layout_rebuilds_the_exact_weights(rng, qtype, od, id_):
    """What the kernel's lanes load and how they decode it (magic-exponent codes, exact subtraction, the scale
    decode's byte arithmetic, q6_K's high bits at Q6_QH_BITS) gives the exact function's weights bit for bit."""
    raw = _raw(rng, qtype, od, id_)
    data = raw if qtype == "q4_K" else gemv.repack_q6k(raw)
    got = gemv.lane_dequant(data, qtype, od, id_)
    want = gemv.emulate_weights(raw, qtype)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_wrong_bit_position_is_caught(rng):
    """The mirror is not vacuous: swapping two of q6_K's high-bit fields in the repack changes the weights."""
    raw = _raw(rng, "q6_K", 8, 256)
    bits = dict(gemv.Q6_QH_BITS)
    try:
        gemv.Q6_QH_BITS[(0, "P0")], gemv.Q6_QH_BITS[(0, "P2")] = bits[(0, "P2")], bits[(0, "P0")]
        data = gemv.repack_q6k(raw)
    finally:
        gemv.Q6_QH_BITS.clear()
        gemv.Q6_QH_BITS.update(bits)
    got = gemv.lane_dequant(data, "q6_K", 8, 256)
    assert not np.array_equal(got, gemv.emulate_weights(raw, "q6_K"))


def test_q6k_repack_is_the_same_size_and_keeps_scales(rng):
    raw = _raw(rng, "q6_K", 5, 512)
    p = gemv.repack_q6k(raw)
    assert p.dtype == np.uint8 and p.size == raw.size
    n = 5 * 2
    assert np.array_equal(p[n * 192:n * 208].reshape(5, 2, 16), raw.reshape(5, 2, 210)[..., 192:208])
    assert np.array_equal(p[n * 208:].reshape(5, 2, 2), raw.reshape(5, 2, 210)[..., 208:210])


@pytest.mark.model
def test_lane_layout_on_real_model_tensors(model_path):
    from labkernels import model

    n = 0
    for name, qtype, raw in model.load_kquant(model_path):
        od, id_ = raw.shape[0], raw.shape[1] // gemv.BLOCK_BYTES[qtype] * gemv.QK
        data = raw if qtype == "q4_K" else gemv.repack_q6k(raw)
        got = gemv.lane_dequant(data, qtype, od, id_)
        assert np.array_equal(got.view(np.uint32), gemv.emulate_weights(raw, qtype).view(np.uint32)), name
        n += 1
    assert n >= 36


@pytest.mark.parametrize("bad,match", [
    (np.zeros((4, 100), np.uint8), "whole 144-byte"),
    (np.zeros((4, 144), np.int8), "uint8"),
    (np.zeros(144, np.uint8), "uint8 GGUF rows"),
])
def test_bad_weights_are_refused(bad, match):
    with pytest.raises(gemv.GemvError, match=match):
        gemv.emulate_weights(bad, "q4_K")


def test_unknown_type_is_refused():
    with pytest.raises(gemv.GemvError, match="q4_K or q6_K"):
        gemv.emulate_weights(np.zeros((1, 34), np.uint8), "q8_0")


def test_default_splits_fill_one_wave():
    # 4096 rows in CTAs of 128: 32 groups; 132 SMs x 3 CTAs an SM want >= 396 CTAs -> 13 splits (capped at 16)
    assert gemv.default_splits(4096, 4096, 2, 4, 132, 3) == 13
    assert gemv.default_splits(4096, 1024, 2, 4, 132, 3) == 4       # never more than one super-block a split
    assert gemv.default_splits(14336, 4096, 2, 4, 132, 1) == 2
    assert gemv.default_splits(1_000_000, 4096, 2, 4, 132, 4) == 1


def _table(rows):
    import pandas as pd

    base = {"qtype": "q4_K", "act": "f16", "od": 4096, "id": 4096, "MT": 2, "WARPS": 4, "S": 0, "run_id": "r1"}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_recorded_choice_takes_gemv_where_it_was_faster_and_says_why():
    t = _table([{"nt": 1, "median_us": 5.0, "wgmma_us": 20.0}, {"nt": 16, "median_us": 9.0, "wgmma_us": 8.0,
                                                                  "S": 4}])
    params, why = gemv.recorded_choice("q4_K", 1, 4096, 4096, "f16", table=t)
    assert params == {"MT": 2, "WARPS": 4} and "5.0 us vs wgmma 20.0 us" in why and "run r1" in why
    assert gemv.recorded_choice("q4_K", 14, 4096, 4096, "f16", table=t) is None      # nearest nt=16: wgmma won
    assert gemv.recorded_choice("q4_K", 2, 11008, 4096, "f16", table=t)[0] == {"MT": 2, "WARPS": 4}


def test_recorded_choice_keeps_round_7_without_a_fair_comparison():
    t = _table([{"nt": 1, "median_us": 5.0, "wgmma_us": float("nan")}])
    assert gemv.recorded_choice("q4_K", 1, 4096, 4096, "f16", table=t) is None     # wgmma not timed: no verdict
    assert gemv.recorded_choice("q6_K", 1, 4096, 4096, "f16", table=t) is None     # no row of the type
    assert gemv.recorded_choice("q4_K", 1, 4096, 4096, "f32", table=t) is None     # nor of the activation type
    assert gemv.recorded_choice("q4_K", 17, 4096, 4096, "f16", table=t) is None    # past the family's nt
    assert gemv.recorded_choice("q4_K", 1, 4096, 4096, "f16", table=_table([]).iloc[:0]) is None


def test_an_outgrown_workspace_stays_alive_for_graphs_captured_before(monkeypatch):
    """A graph captured with the old split workspace still points at it: growing keeps it (retired), never frees it."""
    import types

    from labkernels import gpu

    class Arr:
        def __init__(self, n):
            self.size = n

    fake = types.SimpleNamespace(empty=lambda n, dt: Arr(n), zeros=lambda n, dt: Arr(n), float32="f", int32="i",
                                 cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
                                     streamIsCapturing=lambda s: False)))
    monkeypatch.setattr(gpu, "cp", lambda: fake)
    ws = gemv._Workspace()
    a, _ = ws.get(7, 100, 10)
    b, _ = ws.get(7, 1 << 20, 10)
    assert b is not a and b.size >= 1 << 20 and ws.retired and ws.retired[0][0] is a
    assert ws.get(7, 5, 5)[0] is b                 # no growth: the same buffer


def test_the_recorded_choice_reads_the_benchmark_of_record_not_an_experiment():
    """The H100 runs of 2026-12-06: the benchmark (what: gemv_bench, wgmma timed beside) is newer than nothing and
    older than the split sweep (what: gemv_split_sweep, no baselines): auto reads the benchmark."""
    from labkernels import records

    runs = records.list_runs("decode")
    if not any(gemv.is_bench_of_record(r) for r in runs):
        pytest.skip("no recorded decode benchmark")
    t = gemv.auto_table()
    rec = [r for r in runs if gemv.is_bench_of_record(r)][-1]
    assert (t.run_id == rec.run_id).all() and t.wgmma_us.notna().any()
    assert not gemv.is_bench_of_record(runs[-1]) or runs[-1].run_id == rec.run_id


# ------------------------------------------------------------------------------------------ FORM=1 (round 9 step 2)

def _extreme_q4k(rng, od, nsb):
    """q4_K blocks of random bytes with extreme scales: d and dmin from the largest finite f16 to subnormals and
    zero, every 6-bit scale and min (0 and 63 included), every code."""
    b = rng.integers(0, 256, (od, nsb, 144), dtype=np.uint8)
    pick = np.array([0x7BFF, 0x0001, 0x0000, 0x3C00, 0x0400, 0x5BFF, 0x1234], np.uint16)   # 65504, 2^-24, 0, 1 ...
    hdr = b[..., 0:4].copy().view(np.uint16)
    for i in range(2):
        sel = rng.random((od, nsb)) < 0.5
        hdr[..., i] = np.where(sel, rng.choice(pick, (od, nsb)), rng.integers(0, 0x7C00, (od, nsb)).astype(np.uint16))
    b[..., 0:4] = hdr.view(np.uint8)
    b[0, 0, 4:16] = 0xFF                              # every scale and min 63
    b[-1, -1, 4:16] = 0x00                            # every scale and min 0
    return b.reshape(od, nsb * 144)


@pytest.mark.parametrize("od,id_", [(1, 256), (17, 512), (64, 2304)])
def test_form1_lane_mirror_equals_its_exact_function(rng, od, id_):
    """FORM=1's lanes (KqRow4v2: magic-exponent codes, one HFMA2 to the exact f16 sc*q, mins as exact f16, d and dmin
    widened to f32) give exact_weights_v2 bit for bit, on quantized rows and on random bytes with extreme scales;
    the f16 products the mma sees are sc*q exactly."""
    for raw in (_raw(rng, "q4_K", od, id_), _extreme_q4k(rng, od, id_ // 256)):
        w, A, M, d, dmin = gemv.lane_dequant_v2(raw, od, id_, parts=True)
        want = gemv.exact_weights_v2(raw, "q4_K")
        assert np.array_equal(w.view(np.uint64), want.view(np.uint64))
        _, _, sc, mn, codes = gemv.q4k_fields(raw)
        assert np.array_equal(A, (codes.reshape(od, -1, 8, 32) * sc[..., None]).reshape(od, id_))
        assert np.array_equal(M, np.repeat(mn, 32, axis=-1).reshape(od, id_))
        assert A.max() <= 945 and np.isfinite(w).all()


def test_form1_exact_function_is_gguf_dequantization(rng):
    """exact_weights_v2 is gguf-py's q4_K dequantization without the f16 rounding of FORM=0's weights: equal to
    gguf-py's (float32 arithmetic) within float32 rounding, and nearer to it than FORM=0's f16 weights."""
    import gguf

    raw = _raw(rng, "q4_K", 33, 768)
    w2 = gemv.exact_weights_v2(raw, "q4_K")
    w64 = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).astype(np.float64)
    row = np.abs(w64).max(axis=1, keepdims=True)
    assert (np.abs(w2 - w64) <= 4 * 2.0 ** -24 * row + 1e-30).all()
    w16 = gemv.emulate_weights(raw, "q4_K").astype(np.float64)
    assert np.abs(w2 - w64).max() < np.abs(w16 - w64).max()


def test_form1_mirror_is_not_vacuous(rng):
    """A wrong min (sub-block 2c+1's taken for 2c) or a dropped d changes the weights."""
    raw = _raw(rng, "q4_K", 8, 512)
    w, A, M, d, dmin = gemv.lane_dequant_v2(raw, 8, 512, parts=True)
    M2 = M.reshape(8, 2, 8, 32)[:, :, [1, 0, 3, 2, 5, 4, 7, 6]].reshape(8, 512)
    bad = np.repeat(d, 256, axis=1) * A - np.repeat(dmin, 256, axis=1) * M2
    assert not np.array_equal(bad, w)
    assert not np.array_equal(A, w)
    with pytest.raises(gemv.GemvError, match="q4_K"):
        gemv.exact_weights_v2(_raw(rng, "q6_K", 2, 256), "q6_K")


def test_auto_table_takes_form_1_and_the_wave_split_but_no_pipe_form(tmp_path, monkeypatch):
    """Steps 2-3 measured FORM=1 and the one-wave split as winners: their rows feed qmatmul; the shared-memory ring
    (PIPE) lost everywhere and left the product: a faster recorded PIPE row (step 3's runs keep them) is not picked."""
    from labkernels import nvml, records

    monkeypatch.setattr(nvml, "for_verdict", lambda r: True)
    base = {"qtype": "q4_K", "act": "f16", "od": 4096, "id": 4096, "nt": 1, "family": "gemv_kq", "WARPS": 4, "S": 0,
            "pair": 0}
    with records.recording("decode", {"what": "gemv_bench"}, root=tmp_path) as run:
        run.append("gemv_bench", [{**base, "variant": "gemv_m2w4", "MT": 2, "FORM": 0, "PIPE": 0, "WAVE": 0,
                                   "median_us": 10.0},
                                  {**base, "variant": "gemv_m1w4_sw_f1", "MT": 1, "FORM": 1, "PIPE": 0, "WAVE": 1,
                                   "S": 8, "median_us": 5.0},
                                  {**base, "variant": "gemv_m1w4_sw_f1_p4", "MT": 1, "FORM": 1, "PIPE": 4, "WAVE": 1,
                                   "S": 10, "median_us": 4.0},
                                  {**base, "variant": "wgmma", "family": "wgmma_kq", "MT": 0, "WARPS": 0,
                                   "FORM": 0, "PIPE": 0, "WAVE": 0, "median_us": 20.0}])
    t = gemv.auto_table(root=tmp_path)
    assert len(t) == 1 and t.variant.iloc[0] == "gemv_m1w4_sw_f1" and t.median_us.iloc[0] == 5.0
    assert gemv.recorded_choice("q4_K", 1, 4096, 4096, "f16", table=t)[0] == {"MT": 1, "WARPS": 4, "FORM": 1,
                                                                               "S": "wave"}


def test_auto_table_reads_a_run_recorded_without_the_pipe_column(tmp_path, monkeypatch):
    """A benchmark of record made after the ring left (no PIPE column in its rows) is read like one before step 3
    (no WAVE either): the fastest gemv_kq row of each point, its split carried."""
    from labkernels import nvml, records

    monkeypatch.setattr(nvml, "for_verdict", lambda r: True)
    base = {"qtype": "q4_K", "act": "f16", "od": 4096, "id": 14336, "nt": 1, "family": "gemv_kq", "WARPS": 4,
            "pair": 0}
    with records.recording("decode", {"what": "gemv_bench"}, root=tmp_path) as run:
        run.append("gemv_bench", [{**base, "variant": "gemv_m1w4_f1", "MT": 1, "FORM": 1, "WAVE": 0, "S": 9,
                                   "median_us": 27.4},
                                  {**base, "variant": "gemv_m1w4_sw_f1", "MT": 1, "FORM": 1, "WAVE": 1, "S": 8,
                                   "median_us": 21.0},
                                  {**base, "variant": "wgmma", "family": "wgmma_kq", "MT": 0, "WARPS": 0, "S": 0,
                                   "FORM": 0, "WAVE": 0, "median_us": 40.0}])
    assert "PIPE" not in run.table("gemv_bench").columns
    t = gemv.auto_table(root=tmp_path)
    assert len(t) == 1 and t.variant.iloc[0] == "gemv_m1w4_sw_f1" and t.wgmma_us.iloc[0] == 40.0
    assert gemv.recorded_config("q4_K", 1, 4096, 14336, "f16", table=t)[0] == {"MT": 1, "WARPS": 4, "FORM": 1,
                                                                                "S": "wave"}


def test_auto_table_and_the_recorded_config_never_take_the_retired_form_2(tmp_path, monkeypatch):
    """Step 5's FORM=2 lost and left the source (commit 90fd260 holds it): a faster recorded FORM=2 row -- in a
    benchmark of record, or in a table handed to the recorded choice (one made by the auto_table of 90fd260) -- is never
    what qmatmul(auto) or a named gemv_kq runs; the fastest live form at that point is."""
    from labkernels import nvml, records

    monkeypatch.setattr(nvml, "for_verdict", lambda r: True)
    base = {"qtype": "q4_K", "act": "f16", "od": 4096, "id": 14336, "nt": 1, "family": "gemv_kq", "WARPS": 4, "MT": 1,
            "pair": 0}
    rows = [{**base, "variant": "gemv_m1w4_sw_f1", "FORM": 1, "WAVE": 1, "S": 8, "median_us": 19.1},
            {**base, "variant": "gemv_m1w4_sw_f2", "FORM": 2, "WAVE": 1, "S": 8, "median_us": 15.0},
            {**base, "variant": "gemv_m1w4_f2", "FORM": 2, "WAVE": 0, "S": 9, "median_us": 16.0},
            {**base, "variant": "wgmma", "family": "wgmma_kq", "MT": 0, "WARPS": 0, "S": 0, "FORM": 0, "WAVE": 0,
             "median_us": 40.0}]
    with records.recording("decode", {"what": "gemv_bench"}, root=tmp_path) as run:
        run.append("gemv_bench", rows)
    t = gemv.auto_table(root=tmp_path)
    assert len(t) == 1 and t.variant.iloc[0] == "gemv_m1w4_sw_f1" and (t.FORM != 2).all()
    want = {"MT": 1, "WARPS": 4, "FORM": 1, "S": "wave"}
    assert gemv.recorded_choice("q4_K", 1, 4096, 14336, "f16", table=t)[0] == want
    assert gemv.recorded_config("q4_K", 1, 4096, 14336, "f16", table=t)[0] == want
    # a table that still holds the FORM=2 rows (as 90fd260's auto_table made it): they are left out here too
    old = _table([{**r, "wgmma_us": 40.0} for r in rows if r["family"] == "gemv_kq"])
    for nt in (1, 3, 8):
        params, why = gemv.recorded_config("q4_K", nt, 4096, 14336, "f16", table=old)
        assert params == want and "gemv_m1w4_sw_f1" in why, (nt, params, why)
        assert gemv.recorded_choice("q4_K", nt, 4096, 14336, "f16", table=old)[0] == want
    only2 = _table([{**r, "wgmma_us": 40.0} for r in rows if r["FORM"] == 2])
    assert gemv.recorded_choice("q4_K", 1, 4096, 14336, "f16", table=only2) is None
    assert gemv.recorded_config("q4_K", 1, 4096, 14336, "f16", table=only2)[0] == {"MT": 2, "WARPS": 4}


@pytest.mark.parametrize("form", [4, 5])
def test_the_recorded_config_never_takes_the_retired_forms_4_and_5(form):
    """Step 7's FORM=4 / 5 lost and left the source (commit 7894b07 holds them): a faster recorded row of theirs -- in a
    table made by 7894b07's auto_table, say -- is never what qmatmul(auto) or the decode's gemv_kq runs; the fastest
    live form recorded at that point is."""
    base = {"qtype": "q4_K", "act": "f16", "od": 4096, "id": 14336, "nt": 1, "family": "gemv_kq", "WARPS": 4, "MT": 1,
            "WAVE": 1, "S": 8, "wgmma_us": 40.0}
    rows = [{**base, "variant": "gemv_m1w4_sw_f1", "FORM": 1, "median_us": 19.1},
            {**base, "variant": f"gemv_m1w4_sw_f{form}", "FORM": form, "median_us": 15.0}]
    want = {"MT": 1, "WARPS": 4, "FORM": 1, "S": "wave"}
    for nt in (1, 8):
        params, why = gemv.recorded_config("q4_K", nt, 4096, 14336, "f16", table=_table(rows))
        assert params == want and "gemv_m1w4_sw_f1" in why, (nt, params, why)
    assert gemv.recorded_choice("q4_K", 1, 4096, 14336, "f16", table=_table(rows[1:])) is None


def test_step9_is_the_benchmark_of_record_with_form3_and_its_prediction_is_written_before_its_run():
    """Round 9 step 9 records the benchmark of record again (what: gemv_bench, the run auto reads) with step 4's
    launches, FORM=3 W8 S=1 and the empty launch; every launch is a registered instantiation at every point it can
    run; the step is live, numbered 9, and its ledger entry holds a headline prediction and no measurement yet."""
    from labkernels.rounds import r09_decode as r9

    plan = r9.STEP9_PLAN
    assert plan["launches"][:-1] == r9.STEP4_PLAN["launches"] and plan["launches"][-1] == [1, 8, 3, 1]
    assert set(plan["baselines"]) == {"wgmma", "cublas", "empty"}
    assert {k: v for k, v in plan.items() if k not in ("launches", "baselines")} == \
        {k: v for k, v in r9.STEP4_PLAN.items() if k not in ("launches", "baselines")}
    reg = _registered_gemv()
    for mt, warps, form, S in plan["launches"]:
        for q in plan["qtypes"]:
            for act in plan["acts"]:
                for nt in plan["nts"]:
                    if form and (q != "q4_K" or nt > gemv.FORM1_MAX_NT):
                        continue                      # the bench leaves a form out where it cannot run
                    key = (4 if q == "q4_K" else 6, int(act == "f32"), 1 if nt <= 8 else 2, mt, warps, form)
                    assert key in reg, (key, S)
    assert [s.number for s in r9.STEP_RECORDS if s.name == "gemv_step9"] == [9] and "gemv_step9" in r9.STEPS
    led = r9.ledger._ledger("gemv_step9")
    assert led["step"] == 9 and led["measured"] is None and not led["runs"] and "prediction_written" not in led
    assert [c["check"]["num"] for c in led["prediction"] if c.get("headline")] == ["gemv_m1w8_s1_f3"]


def test_a_recorded_form3_without_a_split_keeps_it_at_every_shape():
    """Step 9's benchmark of record puts FORM=3 (WARPS=8, S=1: no split) where it won: the recorded config keeps S=1
    at the shape asked even where the nearest recorded row is another shape (no split does not depend on the shape),
    while a recorded split count S > 1 still applies only at its own shape, and the one-wave split is recomputed."""
    base = {"qtype": "q4_K", "act": "f16", "od": 4096, "id": 4096, "nt": 1, "family": "gemv_kq", "MT": 1,
            "wgmma_us": 30.0}
    f3 = [{**base, "variant": "gemv_m1w8_s1_f3", "WARPS": 8, "FORM": 3, "WAVE": 0, "S": 1, "median_us": 10.4}]
    for od, id_ in ((4096, 4096), (4096, 5120), (3584, 4096)):      # the recorded shape and two nearest to it
        params, why = gemv.recorded_config("q4_K", 1, od, id_, "f16", table=_table(f3))
        assert params == {"MT": 1, "WARPS": 8, "FORM": 3, "S": 1} and "gemv_m1w8_s1_f3" in why, (od, id_, params)
    s8 = [{**base, "variant": "gemv_m1w4_s8_f1", "WARPS": 4, "FORM": 1, "WAVE": 0, "S": 8, "median_us": 10.0}]
    assert gemv.recorded_config("q4_K", 1, 4096, 4096, "f16", table=_table(s8))[0]["S"] == 8
    assert "S" not in gemv.recorded_config("q4_K", 1, 4096, 5120, "f16", table=_table(s8))[0]


def _mma16816(A, B, C):
    """mma.m16n8k16 row.col on per-lane fragments (float64 pairs): A [32][4][2], B [32][2][2], C [32][4] -> D."""
    Am, Bm, Cm = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        for r, (row, col) in enumerate(((g, 2 * c), (g + 8, 2 * c), (g, 2 * c + 8), (g + 8, 2 * c + 8))):
            Am[row, col:col + 2] = A[lane][r]
        for r, k in enumerate((2 * c, 2 * c + 8)):
            Bm[k:k + 2, g] = B[lane][r]
        for i, (row, col) in enumerate(((g, 2 * c), (g, 2 * c + 1), (g + 8, 2 * c), (g + 8, 2 * c + 1))):
            Cm[row, col] = C[lane][i]
    D = Am @ Bm + Cm
    return [[D[g, 2 * c], D[g, 2 * c + 1], D[g + 8, 2 * c], D[g + 8, 2 * c + 1]]
            for g, c in ((lane >> 2, lane & 3) for lane in range(32))]


@pytest.mark.parametrize("nt", [1, 5, 8])
def test_form1_fragment_flow_gives_the_exact_function(rng, nt):
    """FORM=1's main loop simulated lane by lane with the mma fragment layouts (one warp, MT=1, two super-blocks):
    the weight mma on the f16 products sc*q, the indicator mma (A = step m's activation fragments b0..b3, B = the
    per-lane 0/1 indicator), the hi/lo split of the sub-block sums, the min mma (A = the lanes' (m_2c, m_2c+1) twice)
    and the f32 epilogue give x16 @ exact_weights_v2^T -- the kernel's fragment bookkeeping, not only its weights."""
    od, id_ = 16, 512
    raw = _raw(rng, "q4_K", od, id_)
    w, A, M, d, dmin = gemv.lane_dequant_v2(raw, od, id_, parts=True)
    x = rng.standard_normal((nt, id_)).astype(np.float16).astype(np.float64)
    xp = np.zeros((8, id_))
    xp[:nt] = x
    acc = [[0.0] * 4 for _ in range(32)]
    for sb in range(id_ // 256):
        part = [[0.0] * 4 for _ in range(32)]
        ind = [[0.0] * 4 for _ in range(32)]
        k0 = sb * 256
        for m in range(8):
            fa_w, fa_w2, fb, fb2, fa_x, fb_ind = [], [], [], [], [], []
            for lane in range(32):
                g, c = lane >> 2, lane & 3
                base = k0 + 64 * c + 4 * m

                def pr(row, ko):           # (k 4m + ko, 4m + ko + 2) of lane c's 64
                    return (A[row, base + ko], A[row, base + ko + 2])
                # low step: P0 (ko 0), P2 (ko 1); high step: P1 (ko 32), P3 (ko 33)
                fa_w.append([pr(g, 0), pr(g + 8, 0), pr(g, 1), pr(g + 8, 1)])
                fa_w2.append([pr(g, 32), pr(g + 8, 32), pr(g, 33), pr(g + 8, 33)])
                xs = xp[g]
                b0, b1 = (xs[base], xs[base + 2]), (xs[base + 1], xs[base + 3])
                b2, b3 = (xs[base + 32], xs[base + 34]), (xs[base + 33], xs[base + 35])
                fb.append([b0, b1])
                fb2.append([b2, b3])
                fa_x.append([b0, b1, b2, b3])
                lo, hi = (1.0, 1.0) if g == 2 * c else (0.0, 0.0), (1.0, 1.0) if g == 2 * c + 1 else (0.0, 0.0)
                fb_ind.append([lo, hi])
            ind = _mma16816(fa_x, fb_ind, ind)
            part = _mma16816(fa_w, fb, part)
            part = _mma16816(fa_w2, fb2, part)
        fa_m, fb_m = [], []
        for lane in range(32):
            g, c = lane >> 2, lane & 3
            i0, i1 = ind[lane][0] + ind[lane][2], ind[lane][1] + ind[lane][3]
            hi = np.float16(i0), np.float16(i1)
            lo = np.float16(i0 - float(hi[0])), np.float16(i1 - float(hi[1]))
            fb_m.append([(float(hi[0]), float(hi[1])), (float(lo[0]), float(lo[1]))])
            mg = (M[g, k0 + 64 * c], M[g, k0 + 64 * c + 32])            # (m_2c, m_2c+1) of rows g, g+8
            mg8 = (M[g + 8, k0 + 64 * c], M[g + 8, k0 + 64 * c + 32])
            fa_m.append([mg, mg8, mg, mg8])
        mins = _mma16816(fa_m, fb_m, [[0.0] * 4 for _ in range(32)])
        for lane in range(32):
            g = lane >> 2
            for i in range(4):
                r = g + 8 * (i >> 1)
                acc[lane][i] += d[r, sb] * part[lane][i] - dmin[r, sb] * mins[lane][i]
    y = np.zeros((8, od))
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        for i in range(4):
            y[2 * c + (i & 1), g + 8 * (i >> 1)] = acc[lane][i]
    ref = x @ gemv.exact_weights_v2(raw).T
    assert np.abs(y[:nt] - ref).max() <= 1e-6 * np.abs(ref).max()
    assert not np.any(y[nt:])


# ------------------------------------------------------------------------------------------ step 3: the one-wave split


def test_wave_splits_make_one_wave():
    """S="wave" (step 3): the most splits whose CTAs all fit the resident slots -- the baseline's default split leaves
    a second partial wave (q4_K 4096x14336 FORM=1 MT=1 f16, 4 CTAs an SM on 132 SMs: 9 splits, 576 CTAs on 528
    slots), the wave split 8 (512 CTAs, 7 super-blocks each)."""
    assert gemv.default_splits(4096, 14336, 1, 4, 132, 4) == 9
    assert gemv.wave_splits(4096, 14336, 1, 4, 132, 4) == 8
    for od, id_, mt, bps in ((4096, 14336, 1, 4), (4096, 14336, 2, 3), (14336, 4096, 1, 5), (11008, 4096, 2, 2),
                             (4096, 4096, 1, 5), (64, 512, 1, 4), (1_000_000, 4096, 2, 4)):
        groups = -(-od // gemv.rows_per_cta(mt, 4))
        S = gemv.wave_splits(od, id_, mt, 4, 132, bps)
        assert 1 <= S <= id_ // 256
        assert groups * S <= 132 * bps or S == 1               # one wave, unless the row groups alone are more
        assert S == id_ // 256 or S == 1 or groups * (S + 1) > 132 * bps    # and the most splits that fit
        assert S <= gemv.default_splits(od, id_, mt, 4, 132, bps)


def test_form3_rows_are_one_warps_and_its_splits_count_them():
    """FORM=3 (step 6): every warp of a CTA on the same 16 rows, so a CTA holds 16 x MT rows whatever WARPS, and the
    split plans count row groups of that size: q4_K 4096x14336 at 4 CTAs of 4 warps an SM (the occupancy of the f16
    build, 124 registers) is 256 row groups, one wave at S=2 (512 CTAs, 7 super-blocks a warp); at 2 CTAs of 8 warps an
    SM (120 registers) one wave at S=1 (256 CTAs, 7 super-blocks a warp: the same bytes a warp as step 3's winner,
    with no global fold)."""
    assert gemv.rows_per_cta(1, 4, 3) == gemv.rows_per_cta(1, 8, 3) == 16
    assert gemv.rows_per_cta(1, 4, 1) == 64 and gemv.rows_per_cta(2, 4) == 128
    assert gemv.wave_splits(4096, 14336, 1, 4, 132, 4, 3) == 2
    assert gemv.wave_splits(4096, 14336, 1, 8, 132, 2, 3) == 1
    assert gemv.default_splits(4096, 14336, 1, 4, 132, 4, 3) == 3      # rounds up: 768 CTAs on 528 slots
    assert gemv.wave_splits(4096, 4096, 1, 4, 132, 4, 3) == 2
    assert gemv.wave_splits(14336, 4096, 1, 4, 132, 4, 3) == 1         # 896 row groups: more than one wave anyway


def test_the_retired_pipe_form_left_the_kernel_the_registry_and_the_launcher():
    """Step 3's ring (PIPE) lost and was retired: gemv_kq's registry rows are the PIPE=0 forms only (24: FORM=0 at every
    QT, XF32, NT8, MT; FORM=1 at q4_K and one token tile; step 6's FORM=3 at MT=1), none with dynamic shared memory,
    every one on the main path (step 7's FORM=4 / 5, the ones off it, left since); the source has no PIPE parameter and
    no cp.async instruction; the launcher takes no PIPE (a TypeError names it) and keeps none of the ring's models."""
    import inspect

    from labkernels.kernels import registry

    specs = registry.family("gemv_kq")
    assert [n for n, _ in specs[0].params] == ["QT", "XF32", "NT8", "MT", "WARPS", "FORM"]
    assert len(specs) == 24 and all(k.dynamic_smem() == 0 and k.main_path for k in specs)
    assert {(k.p["QT"], k.p["NT8"]) for k in specs if k.p["FORM"] == 1} == {(4, 1)}
    # step 6's FORM=3 (the register double buffer, the split over K folded in the CTA): q4_K, one token tile, MT=1
    # (MT=2 spills), both activations, at WARPS 4 and 8; the other forms at 4
    assert sorted((k.p["QT"], k.p["NT8"], k.p["MT"], k.p["XF32"], k.p["WARPS"]) for k in specs
                  if k.p["FORM"] == 3) == [(4, 1, 1, 0, 4), (4, 1, 1, 0, 8), (4, 1, 1, 1, 4), (4, 1, 1, 1, 8)]
    assert {k.p["WARPS"] for k in specs if k.p["FORM"] != 3} == {4}
    src = (registry.KERNELS_DIR / "gemv_kq.cu").read_text()
    assert "int FORM, int PIPE" not in src and "extern __shared__" not in src
    assert "cp.async.cg" not in src and "cp.async.wait_group" not in src
    for f in (gemv.gemv, gemv.launch_plan, gemv._kernel, gemv._blocks_per_sm):
        assert "PIPE" not in inspect.signature(getattr(f, "__wrapped__", f)).parameters, f
    assert not any(hasattr(gemv, n) for n in ("PIPES", "pipe_smem", "pipe_x_bytes", "pipe_copies", "pipe_reads"))
    with pytest.raises(TypeError, match="PIPE"):
        gemv.gemv(None, None, FORM=1, PIPE=4)


def test_the_retired_form_2_left_the_kernel_the_registry_and_the_launcher():
    """Step 5's FORM=2 lost and was retired (commit 90fd260 holds it): no registry row, no branch of the kernel's
    source (FORM=3 keeps the register double buffer as its own loop), no form the launcher takes: gemv(..., FORM=2)
    and launch_plan(..., FORM=2) raise a ShapeError naming 90fd260 before anything is launched or built (no silent
    fallback to another form); an unknown form is still refused with the forms there are."""
    import re

    from labkernels import errors
    from labkernels.kernels import registry

    specs = registry.family("gemv_kq")
    fam = next(f for f in registry.FAMILIES if f["family"] == "gemv_kq")
    assert fam["params"]["FORM"] == [0, 1, 3]
    assert {k.p["FORM"] for k in specs} == {0, 1, 3} == set(gemv.FORMS) == set(gemv.FORM_WARPS)
    assert gemv.RETIRED_FORMS[2] == ("round 9 step 5's register double buffer", "90fd260", "gemv_step5")
    src = (registry.KERNELS_DIR / "gemv_kq.cu").read_text()
    code = re.sub(r"//[^\n]*", "", src)
    assert not re.search(r"FORM\s*==\s*2", code) and "FORM=2" not in code
    assert "if constexpr (KW)" in code and "fetch(sb + 1)" in code          # FORM=3's loop: the double buffer
    assert "commit 90fd260 holds it" in " ".join(src.split())
    for call in (lambda: gemv.gemv(None, None, FORM=2), lambda: gemv.gemv(None, None, MT=1, FORM=2, S=1),
                 lambda: gemv.launch_plan(None, 1, 0, MT=1, WARPS=4, FORM=2)):
        with pytest.raises(errors.ShapeError, match=r"FORM=2 .*left the source: commit 90fd260 holds it"):
            call()
    with pytest.raises(errors.ShapeError, match=r"FORM is one of \(0, 1, 3\), got 6"):
        gemv.gemv(None, None, FORM=6)
    assert gemv.check_form(3) == 3


def test_the_retired_forms_4_and_5_and_pf_left_the_kernel_the_registry_and_the_launcher():
    """Step 7's FORM=4 / 5 (FORM=1 under register caps) and step 8's PF=1 build (the weights prefetched into L2 before
    the PDL wait) lost and were retired (commit 7894b07 holds them): no registry row or parameter, no branch, register
    cap, prefetch or PF parameter in the kernel's source, no prefetch entry in common.cuh (and gpu's PDL check no
    longer takes it as an entry), no PF context in the launcher; gemv(..., FORM=4 / 5), launch_plan(..., FORM=4 / 5)
    and gemv(..., PF=1) raise a ShapeError naming 7894b07 before anything is built or launched; PF=0 / None are still
    accepted (the one build there is), any other PF refused."""
    import inspect
    import re

    from labkernels import errors, gpu, prefill
    from labkernels.kernels import registry

    fam = next(f for f in registry.FAMILIES if f["family"] == "gemv_kq")
    assert "PF" not in fam["params"] and "PF" not in fam["valid"] and fam["main_path"] is True
    assert all("PF" not in k.p for k in registry.family("gemv_kq"))
    assert gemv.RETIRED_FORMS[4][1:] == gemv.RETIRED_FORMS[5][1:] == ("7894b07", "gemv_step7")
    assert gemv.RETIRED_PF == {1: ("round 9 step 8's L2 prefetch of the CTA's weight bytes before its PDL wait",
                                   "7894b07", "gemv_step8")}
    src = (registry.KERNELS_DIR / "gemv_kq.cu").read_text()
    code = re.sub(r"//[^\n]*", "", src)
    assert not re.search(r"FORM\s*==\s*[45]", code) and not re.search(r"\bPF\b", code)
    assert "__launch_bounds__(WARPS * 32, WARPS >= 8 ? 2 : 3)" in code and "LK_PDL_ENTRY();" in code
    assert "prefetch" not in code and "commit 7894b07 holds them" in " ".join(src.split())
    common = re.sub(r"//[^\n]*", "", (registry.KERNELS_DIR / "common.cuh").read_text())
    assert "LK_PDL_ENTRY_PREFETCH" not in common and "lk_prefetch_l2" not in common
    assert gpu.pdl_entry_report("__global__ void k() { LK_PDL_ENTRY_PREFETCH(1, f()); }") == (1, 0)
    assert "gemv_kq.cu" in gpu.pdl_sources()
    assert not any(hasattr(gemv, n) for n in ("PF_FORMS", "weights_before_wait", "_PF"))
    assert "PF" not in inspect.signature(gemv._kernel.__wrapped__).parameters
    assert "gemv_pf" not in {f.name for f in __import__("dataclasses").fields(prefill.PrefillOptions)}
    with pytest.raises(TypeError, match="gemv_pf"):
        prefill.PrefillOptions(gemv_pf=True)
    for form in (4, 5):
        for call in (lambda: gemv.gemv(None, None, MT=1, FORM=form),
                     lambda: gemv.gemv(None, None, MT=1, FORM=form, S=1),
                     lambda: gemv.launch_plan(None, 1, 0, MT=1, WARPS=4, FORM=form)):
            with pytest.raises(errors.ShapeError, match=rf"FORM={form} \(round 9 step 7's .*\) lost and left the "
                                                        r"source: commit 7894b07 holds it .*--steps gemv_step7"):
                call()
    for call in (lambda: gemv.gemv(None, None, PF=1), lambda: gemv.gemv(None, None, MT=1, FORM=3, PF=1)):
        with pytest.raises(errors.ShapeError, match=r"PF=1 \(round 9 step 8's .*\) lost and left the source: commit "
                                                    r"7894b07 holds it .*--steps gemv_step8"):
            call()
    assert gemv.check_pf(None) == gemv.check_pf(0) == 0
    for bad in (2, True, "1", 1.0, [1]):
        with pytest.raises(errors.ShapeError, match="PF"):
            gemv.check_pf(bad)


def test_step4_bench_records_the_plan_and_the_typed_columns(tmp_path, monkeypatch, rng):
    """gemv_step4's path through bench_gemv on the CPU (the device, the timer and the kernel stood in: the kernel by
    each form's exact function, so every point passes the real gate): each launch of the plan gated and recorded
    under its name (``_sw`` one-wave split, ``_f1`` FORM=1), typed columns WAVE / S (the split each launch ran) and no
    PIPE, its grid in ``gemv_plan``, and the page's bench_table reads the run; the step passes its plan through.
    Step 3's launches (MT, WARPS, FORM, PIPE, S) are refused: their ring left the source."""
    import sys
    import types

    from cpu_gpu_shim import install

    from labkernels import bench as B
    from labkernels import gpu, records
    from labkernels.rounds import r09_decode as r9

    cp = install(monkeypatch)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(r9.benchmark, "copy_bandwidth", lambda: {"bytes": 2, "median_us": 1.0, "tb_per_s": 3.0})
    monkeypatch.setattr(gpu, "device_props", lambda: {"sm_count": 4, "cc": 90, "name": "fake"})
    monkeypatch.setattr(gemv, "_blocks_per_sm", lambda *a: 2 if a[3] == 1 else 3)     # (QT, XF32, NT8, MT, ..)
    monkeypatch.setattr(B, "ReadFlusher", lambda: None)
    monkeypatch.setattr(B, "Lead", lambda us: None)
    monkeypatch.setattr(B, "interleaved", lambda variants, pairs, **kw: {
        v: [{"median_us": 10.0 + i, "min_us": 9.0, "n": 20} for _ in range(pairs)] for i, v in enumerate(variants)})
    calls = []

    def fake_kernel(gv, x, out=None, S=None, MT=2, WARPS=4, FORM=0):
        calls.append((MT, FORM, S, x.shape[0]))
        raw = np.asarray(gv.data)
        w = gemv.exact_weights_v2(raw, gv.qtype) if FORM else gemv.emulate_weights(raw, gv.qtype).astype(np.float64)
        return (np.asarray(x).astype(np.float16).astype(np.float64) @ w.T).astype(np.float32)

    monkeypatch.setattr(gemv, "gemv", fake_kernel)
    launches = [tuple(v) for v in r9.STEP4_PLAN["launches"]]
    assert all(len(v) == 4 for v in launches)                    # (MT, WARPS, FORM, S): no PIPE in step 4
    with records.recording("decode", {"what": "gemv_bench"}, root=tmp_path / "data") as run:
        r9.bench_gemv(run, shapes=[(130, 1024)], nts=(1, 8), qtypes=("q4_K",), acts=("f16",), pairs=2,
                      baselines=(), launches=launches, progress=lambda *a: None)
    assert len(calls) == 2 * len(launches)
    df = run.table("gemv_bench")
    names = set(df.variant)
    assert names == {"gemv_m1w4", "gemv_m2w4", "gemv_m1w4_sw", "gemv_m2w4_sw", "gemv_m1w4_f1", "gemv_m1w4_sw_f1",
                     "gemv_m2w4_sw_f1"}
    assert len(df) == 2 * 2 * len(launches) and "PIPE" not in df.columns
    r = df[df.variant == "gemv_m1w4_sw_f1"].iloc[0]
    assert (r.WAVE, r.FORM, r.MT) == (1, 1, 1)
    # 130 rows: 3 groups of 64 at MT=1; one wave of 4 SMs x 2 CTAs -> S = 2 of the 4 super-blocks
    assert r.S == gemv.wave_splits(130, 1024, 1, 4, 4, 2) == 2
    # the default split (rounded up: 3 groups x 3 = 9 CTAs on 4 x 2 slots) recorded as the number it ran
    assert gemv.default_splits(130, 1024, 1, 4, 4, 2) == 3 and (df[df.variant == "gemv_m1w4_f1"].S == 3).all()
    plan = run.table("gemv_plan")
    assert len(plan) == 2 * len(launches) and "smem" not in plan.columns
    wave = plan[plan.variant.str.contains("_sw")]
    assert (wave.waves <= 1.0).all() and (plan.exact_rel <= 1e-5).all()
    t = r9.bench_table(run)
    assert (t.PIPE == 0).all() and (t.WAVE == t.variant.str.contains("_sw")).all() and len(t) == 2 * len(launches)
    with pytest.raises(ValueError, match="a1cf954"):
        r9.bench_gemv(None, shapes=[(130, 1024)], nts=(1,), qtypes=("q4_K",), acts=("f16",), pairs=2, baselines=(),
                      launches=[tuple(v) for v in r9.STEP3_PLAN["launches"]], progress=lambda *a: None)

    seen = {}
    monkeypatch.setattr(r9.benchmark, "bench_gemv", lambda run, **kw: seen.update(kw))   # as steps looks it up
    out = r9.step_gemv_step4(tmp_path / "out4", types.SimpleNamespace(log=lambda *a: None))
    assert out["ok"] and seen["launches"] == launches
    assert seen["baselines"] == ("wgmma", "cublas") and seen["qtypes"] == ("q4_K", "q6_K")
    run4 = records.latest("decode", root=tmp_path / "out4" / "data")
    assert run4.meta["params"]["what"] == "gemv_bench"
    assert "gemv_step4" in r9.STEPS and r9.ledger._ledger("gemv_step4")["step"] == 4


def _registered_gemv() -> set:
    """(QT, XF32, NT8, MT, WARPS, FORM) of every registered gemv_kq instantiation."""
    from labkernels.kernels import registry

    return {(k.p["QT"], k.p["XF32"], k.p["NT8"], k.p["MT"], k.p["WARPS"], k.p["FORM"]) for k in registry.family("gemv_kq")}


def _retired_gemv_step(name: str, number: int, holder: str, commit: str):
    """A retired round-9 step's record, after the checks every retired step passes: no live gpu-check step or step
    function, a record numbered ``number`` with no run, held by ``holder`` (== ``commit``), whose command reruns the
    step in a worktree of that commit."""
    from labkernels import rounds
    from labkernels.rounds import r09_decode as r9

    assert name not in r9.STEPS and not hasattr(r9, f"step_{name}") and not hasattr(r9.steps, f"step_{name}")
    mod, s = rounds.retired_step(name)
    assert mod is r9 and s.number == number and s.run is None and s.retired.commit == holder == commit
    assert s.retired.command.startswith(f"git worktree add /tmp/lk-{commit} {commit} && cd /tmp/lk-{commit} && ")
    assert f"--steps {name}" in s.retired.command
    return s


def test_step3_is_retired_with_the_commit_that_holds_it_and_its_record_kept():
    """Round 9 step 3 (gemv_step3) lost and left the source: no live gpu-check step, a retired record (number 3) with
    the commit that holds the ring and the command that reruns it there; its recorded run, analysis and ledger text
    stay, and its view reads the run, the ring's rows (PIPE 2 / 4) among them."""
    from labkernels import rounds
    from labkernels.rounds import r09_decode as r9

    s = _retired_gemv_step("gemv_step3", 3, r9.PIPE_HOLDER, "a1cf954")
    assert "28.9 us" in s.retired.why and "21.0 us" in s.retired.why
    led = next(x for x in r9.LEDGER if x.get("gpu_check") == "gemv_step3")
    assert led["analysis"] is r9.STEP3_ANALYSIS and led["verdict"] == s.verdict and tuple(led["runs"]) == s.runs
    run = s.latest()
    assert run is not None and run.run_id == "20261207T004259Z-h10080gbhbm3-2406c00"
    assert str(run.provenance["git_commit"]).startswith(s.commit)
    v = s.view(run)
    assert {0, 2, 4} <= set(v.PIPE) and (v.variant.str.endswith("_p4") == (v.PIPE == 4)).all()
    # the live steps keep their records, numbered where the ledger names them; step 3's number selects the retired one
    assert [x.name for x in rounds.select_steps(9, ["2", "gemv_step4", "decode"])] == ["gemv_step2", "gemv_step4",
                                                                                         "decode"]
    for sel in ("3", "gemv_step3"):
        with pytest.raises(rounds.RoundError, match="step 3 \\(gemv_step3\\) is retired .*commit a1cf954"):
            rounds.select_steps(9, [sel])


def test_gpu_check_refuses_gemv_step3_with_the_commit_and_command(tmp_path, capsys):
    """``labkernels gpu check --steps gemv_step3`` (and ``--round 9 --step 3``) refuses before any step runs, naming
    the commit that holds the ring and the command that reruns the step there."""
    import re

    from labkernels import cli

    for argv in (["gpu", "check", "--steps", "env,gemv_step3"], ["gpu-check", "--round", "9", "--step", "2,3"]):
        assert cli.main([*argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert re.search(r"round 9's step 3 \(gemv_step3\) is retired \(gemv_kq's PIPE ring lost at every point "
                         r"\(PIPE=4 one-wave 28\.9 us vs PIPE=0 21\.0 us, run 20261207T004259Z-h10080gbhbm3-2406c00\)"
                         r".*it runs at commit a1cf954: git worktree add /tmp/lk-a1cf954 a1cf954 .*"
                         r"gpu check --steps gemv_step3", err), (argv, err)
    assert not (tmp_path / "gpu-check.json").exists()


def test_the_sanitizer_driver_launches_every_instantiation(monkeypatch, capsys):
    """gemv_sanitizer's driver (run under compute-sanitizer on the GPU) on the CPU stand-ins: every registered gemv_kq
    instantiation once, with the arguments gemv takes."""
    import sys

    from cpu_gpu_shim import install

    from labkernels.kernels import registry
    from labkernels.rounds import r09_decode as r9

    cp = install(monkeypatch)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    exec(compile(r9.GEMV_SANITIZE_DRIVER, "<gemv sanitizer driver>", "exec"), {})
    n = len(registry.family("gemv_kq"))
    assert n == 24 and f"gemv sanitizer driver done: {n} launches" in capsys.readouterr().out
    assert "gemv_sanitizer" in r9.STEPS


def test_recorded_choice_carries_step_3s_one_wave_split_and_form_1_only_where_form_1_runs():
    t = _table([{"nt": 1, "median_us": 5.0, "wgmma_us": 20.0, "MT": 1, "FORM": 1, "WAVE": 1, "S": 8,
                 "variant": "gemv_m1w4_sw_f1"},
                {"nt": 16, "median_us": 9.0, "wgmma_us": 12.0, "FORM": 0, "WAVE": 0, "S": 4, "variant": "gemv_m2w4"}])
    # the one-wave split is recomputed for the shape asked (S='wave'), not the recorded count of another shape
    assert gemv.recorded_choice("q4_K", 1, 14336, 4096, "f16", table=t)[0] == {"MT": 1, "WARPS": 4, "FORM": 1, "S": "wave"}
    # nt=12 cannot run FORM=1 (nt <= 8): the nearest FORM=0 row, its split count only at its own shape
    assert gemv.recorded_choice("q4_K", 12, 4096, 4096, "f16", table=t)[0] == {"MT": 2, "WARPS": 4, "S": 4}
    assert gemv.recorded_choice("q4_K", 12, 14336, 4096, "f16", table=t)[0] == {"MT": 2, "WARPS": 4}
    # a named gemv_kq takes the fastest recorded configuration whatever wgmma did, and says which
    params, why = gemv.recorded_config("q4_K", 1, 4096, 14336, "f16", table=t)
    assert params == {"MT": 1, "WARPS": 4, "FORM": 1, "S": "wave"} and "gemv_m1w4_sw_f1 5.0 us" in why and "r1" in why
    q6 = _table([{"qtype": "q6_K", "nt": 1, "median_us": 5.0, "wgmma_us": 2.0, "MT": 1, "FORM": 0, "WAVE": 1, "S": 8,
                  "variant": "gemv_m1w4_sw"}])
    assert gemv.recorded_choice("q6_K", 1, 4096, 4096, "f16", table=q6) is None                # wgmma won there
    assert gemv.recorded_config("q6_K", 1, 4096, 4096, "f16", table=q6)[0] == {"MT": 1, "WARPS": 4, "S": "wave"}
    params, why = gemv.recorded_config("q6_K", 1, 4096, 4096, "f16", table=q6.iloc[:0])
    assert params == {"MT": 2, "WARPS": 4} and "no recorded" in why


def test_step5_is_retired_with_the_commit_that_holds_it_and_its_record_kept():
    """Round 9 step 5 (gemv_step5: FORM=1 against FORM=2, the register double buffer) lost and left the source: no live
    gpu-check step, a retired record (number 5) with the commit that holds FORM=2 (90fd260) and the command that
    reruns the step there; its plan (FORM=2's launches as they ran), ledger text and recorded run stay, the record's
    view and the page's tables read the run, FORM=2's rows among them, and bench_gemv refuses the plan's launches."""
    from labkernels import rounds
    from labkernels.rounds import r09_decode as r9

    s = _retired_gemv_step("gemv_step5", 5, r9.FORM2_HOLDER, "90fd260")
    assert "20.70 vs 19.12 us" in s.retired.why and r9.STEP5_RUN in s.retired.why and "0.72-0.9" in s.retired.why
    # the plan as it ran: FORM=1 against FORM=2 (MT=1), FORM=1's launches registered, FORM=2's no longer
    plan = r9.STEP5_PLAN
    assert s.plan is plan and {v[2] for v in plan["launches"]} == {1, 2}
    reg = _registered_gemv()
    for mt, warps, form, S in plan["launches"]:
        for act in plan["acts"]:
            assert ((4, int(act == "f32"), 1, mt, warps, form) in reg) == (form != 2), (mt, form, act)
    with pytest.raises(ValueError, match="90fd260"):
        r9.bench_gemv(None, shapes=[(130, 1024)], nts=(1,), qtypes=("q4_K",), acts=("f16",), pairs=2, baselines=(),
                      launches=[tuple(v) for v in plan["launches"]], progress=lambda *a: None)
    with pytest.raises(ValueError, match="90fd260"):
        r9.bench_gemv(None, shapes=[(130, 1024)], nts=(1,), qtypes=("q4_K",), acts=("f16",), forms=(1, 2),
                      progress=lambda *a: None)
    # the ledger's text stays (prediction written before the run), the record's claims are its
    led = r9.ledger._ledger("gemv_step5")
    assert led["step"] == 5 and led["commit"] == "5ce3996" and "register double buffer" in led["name"]
    assert led["runs"] == [r9.STEP5_RUN] and "20.70 us" in led["measured"] and led["verdict"].startswith("missed")
    head = [c for c in led["prediction"] if c.get("headline")]
    assert len(head) == 1 and head[0]["low"] < head[0]["high"] < 21.0 and head[0]["what"] in s.prediction
    # the recorded run: the record's view and the page's tables read it, FORM=2's rows among them
    run = s.latest()
    if run is None:
        pytest.skip(f"run {r9.STEP5_RUN} not in data/09_decode/")
    assert run.run_id == r9.STEP5_RUN and run.meta["params"]["what"] == "gemv_step5"
    assert str(run.provenance["git_commit"]).startswith(s.commit)
    v = s.view(run)
    assert {1, 2} == set(v[v.family == "gemv_kq"].FORM) and (v.variant.str.endswith("_f2") == (v.FORM == 2)).all()
    one = v[(v.od == 4096) & (v.id == 14336) & (v.nt == 1) & (v.act == "f16")].set_index("variant").median_us
    assert round(one["gemv_m1w4_sw_f2"], 2) == 20.70 and round(one["gemv_m1w4_sw_f1"], 2) == 19.12
    best = r9.best_per_point(v)
    assert len(best) == 32 and best.cublas_us.notna().all() and (best.frac_copy > 0).all()
    assert r9.headline(run)["q4_K 4096x14336 nt=1"].startswith("19.1 us")
    assert len(r9.prediction_table(run)) == len(r9.PREDICTION["claims"])
    # step 5's number and name select the retired record; the live steps keep theirs
    assert [x.name for x in rounds.select_steps(9, ["4", "gemv_step2"])] == ["gemv_step4", "gemv_step2"]
    for sel in ("5", "gemv_step5"):
        with pytest.raises(rounds.RoundError, match="step 5 \\(gemv_step5\\) is retired .*commit 90fd260"):
            rounds.select_steps(9, [sel])


def test_gpu_check_refuses_gemv_step5_with_the_commit_and_command(tmp_path, capsys):
    """``labkernels gpu check --steps gemv_step5`` (and ``--round 9 --step 5``) refuses before any step runs, naming
    the commit that holds FORM=2 and the command that reruns the step there."""
    import re

    from labkernels import cli

    for argv in (["gpu", "check", "--steps", "env,gemv_step5"], ["gpu-check", "--round", "9", "--step", "4,5"],
                 ["gpu", "check", "--round", "9", "--step", "gemv_step5"]):
        assert cli.main([*argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert re.search(r"round 9's step 5 \(gemv_step5\) is retired \(gemv_kq's FORM=2 lost almost everywhere "
                         r".*20\.70 vs 19\.12 us.*20261207T131432Z-h200-0b009b5.*\) and left the source.*"
                         r"it runs at commit 90fd260: git worktree add /tmp/lk-90fd260 90fd260 .*"
                         r"gpu check --steps gemv_step5", err), (argv, err)
    assert not (tmp_path / "gpu-check.json").exists()


def test_step_6_launches_registered_forms_and_says_when_its_prediction_was_written():
    """Round 9 step 6 (FORM=3) launches only registered instantiations at every point of its plan, times the empty
    launch beside cuBLAS, is a live numbered step, and its ledger entry holds a headline prediction, says it was
    written after unrecorded exploratory timings, and names the run that measured it (held by data/, on the card the
    entry names). (Step 7, the other step of this kind, is retired: its test is below.)"""
    from labkernels.rounds import r09_decode as r9

    name, number, forms, plan = "gemv_step6", 6, {0, 1, 3}, r9.STEP6_PLAN
    reg = _registered_gemv()
    seen = set()
    for mt, warps, form, S in plan["launches"]:
        seen.add(form)
        assert S in (None, "wave") or (isinstance(S, int) and S >= 1)
        for act in plan["acts"]:
            for nt in plan["nts"]:
                assert (4, int(act == "f32"), 1 if nt <= 8 else 2, mt, warps, form) in reg, (mt, warps, form, act, nt)
    assert seen == forms and plan["qtypes"] == ["q4_K"] and max(plan["nts"]) <= gemv.FORM1_MAX_NT
    assert "empty" in plan["baselines"] and "cublas" in plan["baselines"]
    assert name in r9.STEPS and [s.number for s in r9.STEP_RECORDS if s.name == name] == [number]
    led = r9.ledger._ledger(name)
    run = r9.tables.step_run(led)
    assert led["step"] == number and led["measured"] and run is not None and run.run_id == led["runs"][-1]
    assert run.gpu_name == led["card"] and run.meta["params"]["what"] == name and led["verdict"]
    assert "after unrecorded exploratory timings" in led["prediction_written"]
    assert len([c for c in led["prediction"] if c.get("headline")]) == 1


def test_step7_is_retired_with_the_commit_that_holds_it_and_its_record_kept():
    """Round 9 step 7 (gemv_step7: FORM=4 / FORM=5, FORM=1 under register caps, against FORM=1) lost and left the
    source: no live gpu-check step, a retired record (number 7) with the commit that holds FORM=4 / 5 (7894b07) and the
    command that reruns the step there; its plan (the launches as they ran), ledger text and recorded run stay, the
    record's view and the page's claims table read the run, FORM=4 / 5's rows among them, and bench_gemv refuses the
    plan's launches naming 7894b07."""
    from labkernels import rounds
    from labkernels.rounds import r09_decode as r9

    s = _retired_gemv_step("gemv_step7", 7, r9.FORM45_HOLDER, "7894b07")
    assert s.runs == (r9.STEP7_RUN,)
    assert "1.20" in s.retired.why and "1.31" in s.retired.why and r9.STEP7_RUN in s.retired.why
    plan = r9.STEP7_PLAN
    assert s.plan is plan and {v[2] for v in plan["launches"]} == {1, 4, 5}
    reg = _registered_gemv()
    for mt, warps, form, S in plan["launches"]:
        for act in plan["acts"]:
            assert ((4, int(act == "f32"), 1, mt, warps, form) in reg) == (form == 1), (mt, form, act)
    for kw in ({"launches": [tuple(v) for v in plan["launches"]]}, {"forms": (1, 4)}, {"forms": (5,)}):
        with pytest.raises(ValueError, match=r"FORM \[.*\] lost and left the source .*commit 7894b07 holds it"):
            r9.bench_gemv(None, shapes=[(130, 1024)], nts=(1,), qtypes=("q4_K",), acts=("f16",), pairs=2,
                          baselines=(), progress=lambda *a: None, **kw)
    led = r9.ledger._ledger("gemv_step7")
    assert led["step"] == 7 and led["runs"] == [r9.STEP7_RUN] and "commit 7894b07 holds them" in led["verdict"]
    assert s.verdict == led["verdict"] and "FORM45_HOLDER" not in led["verdict"]
    run = s.latest()
    if run is None:
        pytest.skip(f"run {r9.STEP7_RUN} not in data/09_decode/")
    assert run.run_id == r9.STEP7_RUN and run.meta["params"]["what"] == "gemv_step7"
    assert str(run.provenance["git_commit"]).startswith(s.commit) and run.gpu_name == led["card"]
    v = s.view(run)
    assert {1, 4, 5} == set(v[v.family == "gemv_kq"].FORM)
    one = v[(v.od == 4096) & (v.id == 14336) & (v.nt == 1) & (v.act == "f16")].set_index("variant").median_us
    assert round(one["gemv_m1w4_sw_f4"] / one["gemv_m1w4_sw_f1"], 2) == 1.20
    assert round(one["gemv_m1w4_sw_f5"] / one["gemv_m1w4_sw_f1"], 2) == 1.31
    claims = r9.step_claims_table(led, r9.tables.step_run(led))
    assert len(claims) == len(led["prediction"]) and "not measured" not in set(claims.verdict)
    for sel in ("7", "gemv_step7"):
        with pytest.raises(rounds.RoundError, match="step 7 \\(gemv_step7\\) is retired .*commit 7894b07"):
            rounds.select_steps(9, [sel])


@pytest.mark.parametrize("number, name, why", [
    (7, "gemv_step7", r"gemv_kq's FORM=4 and FORM=5 were slower at every f16 point .*1\.20.*1\.31.*"
                      r"20261207T195543Z-h10080gbhbm3-045babc"),
    (8, "gemv_step8", r"gemv_kq's PF=1 build made the decode slower .*0\.945.*0\.969.*"
                      r"20261207T195308Z-h10080gbhbm3-045babc")])
def test_gpu_check_refuses_gemv_steps_7_and_8_with_the_commit_and_command(tmp_path, capsys, number, name, why):
    """``labkernels gpu check --steps gemv_step7`` / ``gemv_step8`` (and ``--round 9 --step 7`` / ``8``) refuse before
    any step runs, naming the commit that holds the retired form (7894b07) and the command that reruns the step
    there."""
    import re

    from labkernels import cli

    for argv in (["gpu", "check", "--steps", f"env,{name}"], ["gpu-check", "--round", "9", "--step", f"6,{number}"],
                 ["gpu", "check", "--round", "9", "--step", name]):
        assert cli.main([*argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert re.search(rf"round 9's step {number} \({name}\) is retired \({why}.*\) and left the source.*"
                         r"it runs at commit 7894b07: git worktree add /tmp/lk-7894b07 7894b07 .*"
                         rf"gpu check --steps {name}", err), (argv, err)
    assert not (tmp_path / "gpu-check.json").exists()


def test_bench_gemv_times_the_empty_launch_as_a_zero_byte_row_and_refuses_unknown_baselines(tmp_path, monkeypatch):
    """The ``empty`` baseline (the timing's floor) is timed in the same interleaved rounds as the kernels, recorded
    as family ``empty`` with 0 bytes (no bandwidth claimed for it); a baseline the bench does not know is refused
    before any GPU work."""
    import sys

    from cpu_gpu_shim import install

    from labkernels import bench as B
    from labkernels import gpu, records
    from labkernels.rounds import r09_decode as r9

    cp = install(monkeypatch)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(r9.benchmark, "copy_bandwidth", lambda: {"bytes": 2, "median_us": 1.0, "tb_per_s": 3.0})
    monkeypatch.setattr(gpu, "device_props", lambda: {"sm_count": 4, "cc": 90, "name": "fake"})
    monkeypatch.setattr(gemv, "_blocks_per_sm", lambda *a: 2)
    monkeypatch.setattr(B, "ReadFlusher", lambda: None)
    monkeypatch.setattr(B, "Lead", lambda us: None)
    made = []
    monkeypatch.setattr(B, "EmptyLaunch", lambda grid, threads: made.append((grid, threads)) or (lambda: None))
    monkeypatch.setattr(B, "interleaved", lambda variants, pairs, **kw: {
        v: [{"median_us": 3.0 if v == "empty" else 12.0, "min_us": 2.0, "n": 20} for _ in range(pairs)]
        for v in variants})

    def fake_kernel(gv, x, out=None, S=None, MT=2, WARPS=4, FORM=0):
        w = gemv.emulate_weights(np.asarray(gv.data), gv.qtype).astype(np.float64)
        return (np.asarray(x).astype(np.float16).astype(np.float64) @ w.T).astype(np.float32)

    monkeypatch.setattr(gemv, "gemv", fake_kernel)
    with records.recording("decode", {"what": "test"}, root=tmp_path / "data") as run:
        r9.bench_gemv(run, shapes=[(130, 1024)], nts=(1,), qtypes=("q4_K",), acts=("f16",), pairs=2,
                      baselines=("empty",), launches=[(1, 4, 0, "wave")], progress=lambda *a: None)
    df = run.table("gemv_bench")
    e = df[df.variant == "empty"]
    assert made == [(16, 128)] and len(e) == 2 and (e.family == "empty").all() and (e.bytes == 0).all()
    assert (e.tb_per_s == 0).all() and (df[df.variant != "empty"].bytes == 130 * 1024 // 256 * 144).all()
    with pytest.raises(ValueError, match="not \\['cudnn'\\]"):
        r9.bench_gemv(None, shapes=[(130, 1024)], nts=(1,), qtypes=("q4_K",), acts=("f16",), pairs=2,
                      baselines=("cublas", "cudnn"), launches=[(1, 4, 0, "wave")], progress=lambda *a: None)


def test_stream_fit_recovers_the_fixed_cost_and_the_stream_and_the_floor(tmp_path):
    """tables.stream_fit: times made exactly fixed + bytes / stream at four shapes come back as that fixed cost and
    stream (and its fraction of the run's copy line); the empty launch's median is the floor and fixed - floor the
    kernel's own; a variant timed at fewer than three distinct byte counts is left out; other nt / act are not mixed
    in."""
    from labkernels import records
    from labkernels.rounds import r09_decode as r9

    shapes = [(4096, 4096), (14336, 4096), (4096, 14336), (11008, 4096)]
    rows = []
    for od, id_ in shapes:
        nb = r9.weight_bytes("q4_K", od, id_)
        for var, fam, fixed, stream in (("a", "gemv_kq", 6.0, 2.5), ("c", "cublas_f16", 7.0, 1.25)):
            for p in range(3):
                rows.append({"qtype": "q4_K", "od": od, "id": id_, "nt": 1, "act": "f16", "variant": var,
                             "family": fam, "MT": 1, "WARPS": 4, "S": 0, "FORM": 0, "WAVE": 0, "pair": p,
                             "median_us": fixed + nb / 1e6 / stream, "bytes": nb})
        rows.append({"qtype": "q4_K", "od": od, "id": id_, "nt": 1, "act": "f16", "variant": "empty", "family": "empty",
                     "MT": 0, "WARPS": 0, "S": 0, "FORM": 0, "WAVE": 0, "pair": 0, "median_us": 2.5, "bytes": 0})
        rows.append({**rows[-2], "nt": 8, "median_us": 99.0})                # another nt: not in the nt=1 fit
    rows.append({**rows[0], "od": 4096, "variant": "two", "median_us": 5.0})  # one shape only: left out
    with records.recording("decode", {"what": "test"}, root=tmp_path / "data") as run:
        run.append("copy", [{"bytes": 2, "median_us": 1.0, "tb_per_s": 3.125}])
        run.append("gemv_bench", rows)
    fit = r9.stream_fit(run).set_index("variant")
    assert set(fit.index) == {"a", "c"} and (fit.points == 4).all()
    assert fit.loc["a", "fixed_us"] == pytest.approx(6.0) and fit.loc["a", "stream_tb_per_s"] == pytest.approx(2.5)
    assert fit.loc["a", "stream_frac_copy"] == pytest.approx(0.8) and fit.loc["c", "fixed_us"] == pytest.approx(7.0)
    assert fit.loc["a", "max_resid_us"] < 1e-9 and fit.loc["a", "kernel_fixed_us"] == pytest.approx(3.5)
    assert r9.stream_fit(run, act="f32").empty


def test_generate_ab_alternates_the_option_in_every_repeat_and_reads_back(tmp_path, monkeypatch):
    """measure_generate(ab={option: [a, b]}): each repeat generates with a, then b (the option set on the model's
    options before each), the value in the row's column; generation_ab gives the medians and the ratio b / a per
    (model, prompt) with the per-repeat spread. An ab that is not one PrefillOptions field with values is refused
    before any GPU work (step 8's gemv_pf, retired with gemv_kq's PF=1 build, by the commit that holds it)."""
    import types

    from labkernels import prefill, records
    from labkernels.rounds import r09_decode as r9

    g = r9.generate
    for bad in ({"pdl": []}, {"nope": [0, 1]}, {"graph": [True, False]}, {"fuse_rope": [0], "pdl": [0]}):
        with pytest.raises(ValueError, match="ab"):
            g.measure_generate(None, models=["x"], prompts=[8], n_new=2, repeats=1, ab=bad)
    with pytest.raises(ValueError, match="gemv_pf .*lost and left PrefillOptions.*commit 7894b07 holds it"):
        g.measure_generate(None, models=["x"], prompts=[8], n_new=2, repeats=1, ab=r9.GEN_STEP8_PLAN["ab"])
    seen = []

    class FakeGM:
        def __init__(self, m):
            self.opts = prefill.PrefillOptions()

        def generate(self, toks, n):
            seen.append(self.opts.pdl)
            tps = 110.0 if self.opts.pdl else 100.0
            self.last_generate = {"mode": "graph", "replays": n - 1, "tok_per_s": tps + len(seen),
                                  "tok_per_s_wall": tps, "prefill_ms": 1.0}
            return list(range(n))

    monkeypatch.setattr(g.benchmark, "copy_bandwidth", lambda: {"bytes": 2, "median_us": 1.0, "tb_per_s": 3.0})
    monkeypatch.setattr(g.synthetic, "load_model", lambda spec: types.SimpleNamespace(name=spec))
    monkeypatch.setattr(g.arch, "config_from_model", lambda m: types.SimpleNamespace(arch="llama", n_ctx_train=4096))
    monkeypatch.setattr(g, "stored_weight_bytes", lambda m: 1000)
    monkeypatch.setattr(g, "free_for_cache", lambda: 1 << 40)
    monkeypatch.setattr(g, "plan_points", lambda cfgs, prompts, n_new, free_bytes=None: [
        {"model": k, "n_prompt": n, "status": "measured"} for k in cfgs for n in prompts])
    monkeypatch.setattr(g.prefill_runs, "prompt_tokens", lambda m, n: list(range(n)))
    monkeypatch.setattr(g.prefill, "GpuModel", FakeGM)
    monkeypatch.setattr(g.gpu, "cp", lambda: types.SimpleNamespace(
        get_default_memory_pool=lambda: types.SimpleNamespace(free_all_blocks=lambda: None)))
    with records.recording("decode", {"what": "test"}, root=tmp_path / "data") as run:
        rows = g.measure_generate(run, models=["synthetic-7b"], prompts=[512], n_new=4, repeats=3,
                                  progress=lambda *a: None, ab={"pdl": [False, True]})
    assert seen == [False, True] * 3 and [r["pdl"] for r in rows] == [False, True] * 3
    t = r9.generation_ab(run, "pdl").iloc[0]
    assert t.pairs == 3 and t["tok_per_s (pdl=False)"] == 103.0 and t["tok_per_s (pdl=True)"] == 114.0
    assert t.ratio == pytest.approx(114 / 103) and t.ratio_min == pytest.approx(116 / 105)
    assert t.ratio_max == pytest.approx(112 / 101)
    with pytest.raises(ValueError, match="not an A/B"):
        r9.generation_ab(run, "fuse_rope")


def test_step8_is_retired_with_the_commit_that_holds_it_and_its_record_kept():
    """Round 9 step 8 (gemv_step8: the decode with gemv_kq's PF=1 build against PF=0) lost and left the source: no live
    gpu-check step, a retired record (number 8) with the commit that holds PF=1 and PrefillOptions.gemv_pf (7894b07)
    and the command that reruns the step there; its plan, ledger text and recorded run stay, and the record's view is
    the run's generation A/B (PF=1 / PF=0 tokens/s: 0.945 for the synthetic 7B, 0.969 for the synthetic Gemma 3)."""
    from labkernels import rounds
    from labkernels.rounds import r09_decode as r9

    s = _retired_gemv_step("gemv_step8", 8, r9.PF_HOLDER, "7894b07")
    assert s.runs == (r9.STEP8_RUN,)
    assert "0.945" in s.retired.why and "0.969" in s.retired.why and r9.STEP8_RUN in s.retired.why
    assert s.plan is r9.GEN_STEP8_PLAN and r9.GEN_STEP8_PLAN["ab"] == {"gemv_pf": [False, True]}
    led = r9.ledger._ledger("gemv_step8")
    assert led["step"] == 8 and led["runs"] == [r9.STEP8_RUN] and led["verdict"].startswith("missed")
    assert "commit 7894b07 holds it" in led["verdict"] and "PF_HOLDER" not in led["verdict"]
    assert [c["metric"] for c in led["prediction"] if c.get("headline")] == ["ratio"]
    run = s.latest()
    if run is None:
        pytest.skip(f"run {r9.STEP8_RUN} not in data/09_decode/")
    assert run.run_id == r9.STEP8_RUN and run.meta["params"]["what"] == "gemv_step8"
    assert run.meta["params"]["ab"] == r9.GEN_STEP8_PLAN["ab"] and run.gpu_name == led["card"]
    assert str(run.provenance["git_commit"]).startswith(s.commit)
    v = s.view(run).set_index("model")
    assert round(v.loc["synthetic-7b", "ratio"], 3) == 0.945 and round(v.loc["synthetic-gemma3", "ratio"], 3) == 0.969
    claims = r9.step_claims_table(led, r9.tables.step_run(led))
    assert len(claims) == len(led["prediction"]) and "not measured" not in set(claims.verdict)
    for sel in ("8", "gemv_step8"):
        with pytest.raises(rounds.RoundError, match="step 8 \\(gemv_step8\\) is retired .*commit 7894b07"):
            rounds.select_steps(9, [sel])


def test_step10_is_planned_before_its_run():
    """Round 9 step 10 (add_rmsnorm's register form in the decode): a live step numbered 10 whose A/B varies a real
    PrefillOptions field (False, True), its ledger prediction written (headline: the 7B's tokens/s ratio) and nothing
    measured yet."""
    import dataclasses

    from labkernels.prefill import PrefillOptions
    from labkernels.rounds import r09_decode as r9

    plan = r9.GEN_STEP10_PLAN
    assert plan["ab"] == {"norm_regs": [False, True]} and "norm_regs" in {f.name for f in dataclasses.fields(PrefillOptions)}
    assert PrefillOptions().norm_regs is False                  # the product unchanged until the A/B measures it
    assert [s.number for s in r9.STEP_RECORDS if s.name == "decode_step10"] == [10] and "decode_step10" in r9.STEPS
    led = r9.ledger._ledger("decode_step10")
    assert led["step"] == 10 and led["measured"] is None and not led["runs"]
    head = [c for c in led["prediction"] if c.get("headline")]
    assert [c["check"] for c in head] == [{"kind": "gen_ratio", "option": "norm_regs", "model": "synthetic-7b",
                                           "n_prompt": 512}]
    assert all(c["low"] < c["high"] for c in led["prediction"] if c["metric"] == "ratio")
