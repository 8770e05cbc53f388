"""GPU gates of round 9's decode kernels (gemv_kq): every registered instantiation, nt = 1..16 with tails in od and
the splits, f16 and f32 activations, NaN-poisoned outputs with guard regions, fresh random inputs; the gate of
labkernels.wgmma.gate against the kernel's exact function (labkernels.gemv.emulate_weights: <= exact_gate(id), only
the f32 summation order may differ) and gguf-py's float64 dequantization (NMSE)."""
import numpy as np
import pytest

from labkernels.kernels import registry

pytestmark = [pytest.mark.gpu]

GUARD = 256
SPECS = registry.family("gemv_kq")


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


def _weights(rng, qtype, od, id_):
    from labkernels import quants

    w = rng.standard_normal((od, id_)) * 10.0 ** rng.uniform(-4, 0, (od, 1))   # rows from ~1e-4 to ~1
    w[rng.integers(0, od), rng.integers(0, id_)] *= 20                          # an outlier
    return quants.quantize(w.astype(np.float32), qtype)


def _run(cp, w, x, **kw):
    from labkernels import gemv

    nt, od = x.shape[0], w.od
    buf = cp.full(nt * od + 2 * GUARD, np.nan, dtype=cp.float32)
    y = buf[GUARD:GUARD + nt * od].reshape(nt, od)
    gemv.gemv(w, x, out=y, **kw)
    g = cp.asnumpy(buf)
    assert np.isnan(g[:GUARD]).all() and np.isnan(g[-GUARD:]).all(), "write outside the output"
    return cp.asnumpy(y)


def _x(rng, raw, qtype, nt, id_):
    """Fresh activations [nt, id] (float32) whose products with the weights do not all cancel: the gate's NMSE against
    float64 compares the outputs with their own norm, and an output ~1e-4 of its |terms| (od = 1 and one token: a
    seed of 2026-12-07, 0.0015 out of 50) fails it for any kernel, an exact one included -- such a draw is redrawn
    (at most 8 times; the condition is on the inputs, not on the kernel's output)."""
    from labkernels import gemv

    w = np.abs(gemv.emulate_weights(raw, qtype).astype(np.float64))
    for _ in range(8):
        x = (rng.standard_normal((nt, id_)) * rng.uniform(0.5, 4)).astype(np.float32)
        x16 = x.astype(np.float16).astype(np.float64)
        if np.abs(x16 @ gemv.emulate_weights(raw, qtype).astype(np.float64).T).max() >= 1e-3 * (np.abs(x16) @ w.T).max():
            return x
    return x


def _gate(y, raw, qtype, x, form=0):
    """FORM=0 against emulate_weights (its f16 weights), FORM=1 against exact_weights_v2 (gguf's d*sc*q - dmin*m in
    float64); both also against the float64 reference (NMSE)."""
    from labkernels import gemv, wgmma

    exact = gemv.emulate_weights(raw, qtype) if form == 0 else gemv.exact_weights_v2(raw, qtype)
    bound = wgmma.exact_gate(x.shape[1]) if form == 0 else gemv.form1_exact_gate(x.shape[1])
    g = wgmma.gate(y, raw, qtype, x, w16=exact, exact_bound=bound)
    assert g["nonfinite"] == 0, g
    assert g["exact_rel_terms"] <= bound, g
    assert g["ok"], g
    return g


@pytest.mark.gpu_fast
@pytest.mark.parametrize("spec", SPECS, ids=[k.key for k in SPECS])
def test_every_instantiation_passes_the_gate(cp, rng, spec):
    """Each registered instantiation once (the fast tier; both forms): nt at the top of its token tiles and a tail
    in od, NaN-poisoned output with guards, gated against its form's exact function."""
    from labkernels import gpu

    p = spec.p
    qtype = "q4_K" if p["QT"] == 4 else "q6_K"
    nt = 8 * p["NT8"] - int(rng.integers(0, 3))
    od, id_ = 16 * p["MT"] * p["WARPS"] * 2 + 13, 768
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(raw, qtype)
    xd = cp.asarray(x) if p["XF32"] else cp.asarray(x.astype(np.float16))
    y = _run(cp, w, xd, MT=p["MT"], WARPS=p["WARPS"], S=2, FORM=p["FORM"])
    _gate(y, raw, qtype, x, form=p["FORM"])


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("nt", [1, 2, 3, 5, 8, 9, 16])
@pytest.mark.parametrize("od,id_", [(1, 256), (17, 512), (130, 1024), (1000, 4352)])
@pytest.mark.parametrize("f32", [0, 1])
def test_gemv_parity(cp, rng, qtype, nt, od, id_, f32):
    from labkernels import gpu

    raw = _weights(rng, qtype, od, id_)
    x = _x(rng, raw, qtype, nt, id_)
    w = gpu.QWeight.upload(raw, qtype)
    xd = cp.asarray(x) if f32 else cp.asarray(x.astype(np.float16))
    y = _run(cp, w, xd)
    _gate(y, raw, qtype, x)


@pytest.mark.parametrize("nt", [1, 2, 3, 5, 7, 8])
@pytest.mark.parametrize("od,id_", [(1, 256), (17, 512), (130, 1024), (1000, 4352)])
@pytest.mark.parametrize("f32", [0, 1])
@pytest.mark.parametrize("mt", [1, 2])
def test_gemv_form1_parity(cp, rng, nt, od, id_, f32, mt):
    """FORM=1 (step 2: exact f16 sc*q, d and -dmin applied per super-block in f32, the min term by the indicator
    and min mma) at every nt it takes, tails in od, NaN-poisoned outputs: gated against exact_weights_v2 and the
    float64 reference; its NMSE against float64 no worse than FORM=0's f16 weights allow."""
    from labkernels import gpu

    raw = _weights(rng, "q4_K", od, id_)
    x = _x(rng, raw, "q4_K", nt, id_)
    w = gpu.QWeight.upload(raw, "q4_K")
    xd = cp.asarray(x) if f32 else cp.asarray(x.astype(np.float16))
    y1 = _run(cp, w, xd, MT=mt, FORM=1)
    g1 = _gate(y1, raw, "q4_K", x, form=1)
    g0 = _gate(_run(cp, w, xd, MT=mt, FORM=0), raw, "q4_K", x)
    assert g1["max_rel_err_in"] <= max(g0["max_rel_err_in"], 1e-5), (g1, g0)


@pytest.mark.parametrize("nt", [1, 3, 8])
@pytest.mark.parametrize("od,id_", [(1, 256), (17, 512), (130, 1024), (1000, 4352), (4096, 14336)])
@pytest.mark.parametrize("f32", [0, 1])
@pytest.mark.parametrize("warps", [4, 8])
def test_gemv_form3_is_form1_at_warps_times_the_splits(cp, rng, nt, od, id_, f32, warps):
    """FORM=3 (step 6: FORM=1's arithmetic in a register double buffer, the CTA's warps on one group of 16 rows, the
    split's super-blocks cut among them, folded in shared memory in warp order) at S=1 computes FORM=1's bits at
    split WARPS: the same super-block ranges and the same left-to-right sum of the partials (wherever FORM=1's split
    exists: at most one super-block a split; warps with no super-block, id = 256 at 4 or 8 warps, add zeros). (Step
    5's FORM=2, retired at 90fd260, stood between them: FORM=3 at S=1 was FORM=2's bits at split WARPS, and FORM=2
    FORM=1's at any split -- both passed at every case of the H200 suite run 20261207T131354Z-h200-0b009b5.) At S > 1
    the sum has two levels (the warps', then the splits'), so only the gate holds: S = 2 and the one-wave plan.
    NaN-poisoned guards (no write outside the output, none by warps 1..WARPS-1) and FORM=1's gate at every S."""
    from labkernels import gemv, gpu

    raw = _weights(rng, "q4_K", od, id_)
    x = _x(rng, raw, "q4_K", nt, id_)
    w = gpu.QWeight.upload(raw, "q4_K")
    xd = cp.asarray(x) if f32 else cp.asarray(x.astype(np.float16))
    gv, sm, nsb = gemv.prepare(w), gpu.device_props()["sm_count"], id_ // gemv.QK
    wave = gemv.launch_plan(gv, nt, f32, 1, warps, 3, "wave", sm)["S"]
    checked = 0
    for S in sorted({1, 2, wave} & set(range(1, nsb + 1))):
        y3 = _run(cp, w, xd, MT=1, WARPS=warps, FORM=3, S=S)
        _gate(y3, raw, "q4_K", x, form=3)
        if S == 1 and warps <= nsb:
            y1 = _run(cp, w, xd, MT=1, FORM=1, S=S * warps)
            assert np.array_equal(y1.view(np.uint32), y3.view(np.uint32)), S
            checked += 1
    assert checked == 1 or nsb < warps


def test_gemv_form1_extreme_scales(cp, rng):
    """FORM=1 on random q4_K bytes with extreme d / dmin (65504, subnormals, 0) and every 6-bit scale and min: no f16
    overflow (sc*q <= 945 in f16, d applied in f32), gated against its exact function."""
    from labkernels import gemv, gpu, wgmma

    od, id_, nt = 70, 1024, 6
    b = rng.integers(0, 256, (od, id_ // 256, 144), dtype=np.uint8)
    hdr = b[..., 0:4].copy().view(np.uint16)
    pick = np.array([0x7BFF, 0x0001, 0x0000, 0x3C00, 0x0400, 0x5BFF], np.uint16)
    for i in range(2):
        hdr[..., i] = np.where(rng.random(hdr.shape[:2]) < 0.5, rng.choice(pick, hdr.shape[:2]),
                               rng.integers(0, 0x7C00, hdr.shape[:2]).astype(np.uint16))
    b[..., 0:4] = hdr.view(np.uint8)
    raw = b.reshape(od, -1)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(raw, "q4_K")
    y = _run(cp, w, cp.asarray(x.astype(np.float16)), FORM=1, S=3)
    g = wgmma.gate(y, raw, "q4_K", x, w16=gemv.exact_weights_v2(raw, "q4_K"))
    assert g["nonfinite"] == 0 and g["exact_rel_terms"] <= wgmma.exact_gate(id_), g


@pytest.mark.parametrize("form", [0, 1])
def test_splits_are_deterministic_and_agree_form(cp, rng, form):
    """Both forms (q4_K): every split count gives a reproducible output within f32 summation order of S=1."""
    from labkernels import gemv, gpu, wgmma

    od, id_, nt = 300, 2304, 5
    raw = _weights(rng, "q4_K", od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(raw, "q4_K")
    xd = cp.asarray(x)
    y1 = _run(cp, w, xd, S=1, FORM=form)
    scale = float(np.abs(y1).max())
    for S in range(1, id_ // gemv.QK + 1):
        a = _run(cp, w, xd, S=S, FORM=form)
        b = _run(cp, w, xd, S=S, FORM=form)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"S={S} not reproducible"
        assert np.abs(a - y1).max() <= 2 * wgmma.exact_gate(id_) * scale, S
    _gate(y1, raw, "q4_K", x, form=form)


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
def test_splits_are_deterministic_and_agree(cp, rng, qtype):
    """Every split count S = 1..nsb: the same output bit for bit on a second launch (the partials are added in split
    order by the last CTA, whichever arrives last), within f32 summation order of S=1, and gated."""
    from labkernels import gemv, gpu, wgmma

    od, id_, nt = 300, 2304, 5
    raw = _weights(rng, qtype, od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(raw, qtype)
    xd = cp.asarray(x)
    y1 = _run(cp, w, xd, S=1)
    scale = float(np.abs(y1).max())
    for S in range(1, id_ // gemv.QK + 1):
        a = _run(cp, w, xd, S=S)
        b = _run(cp, w, xd, S=S)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"S={S} not reproducible"
        assert np.abs(a - y1).max() <= 2 * wgmma.exact_gate(id_) * scale, S
    _gate(y1, raw, qtype, x)


def test_f16_and_f32_activations_agree(cp, rng):
    """f32 activations are rounded to f16 at the fragment: the same f16 numbers, so the same output bit for bit."""
    from labkernels import gpu

    raw = _weights(rng, "q4_K", 640, 2048)
    x = rng.standard_normal((7, 2048)).astype(np.float32)
    w = gpu.QWeight.upload(raw, "q4_K")
    a = _run(cp, w, cp.asarray(x), S=3)         # the same splits (the default depends on each build's occupancy)
    b = _run(cp, w, cp.asarray(x.astype(np.float16)), S=3)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.gpu_fast
def test_gemv_in_a_captured_graph(cp, rng):
    """The decode step is replayed as a CUDA graph: a split launch captured once and replayed on new activations
    (copied into the captured input) gives the eager result, the counters left clean for the next replay."""
    from labkernels import gpu

    raw = _weights(rng, "q4_K", 512, 4096)
    w = gpu.QWeight.upload(raw, "q4_K")
    x = cp.asarray(rng.standard_normal((1, 4096)).astype(np.float16))
    y = cp.empty((1, 512), cp.float32)
    from labkernels import gemv

    for form in (0, 1, 3):      # FORM=3: the register double buffer's loop (step 5's FORM=2 left, commit 90fd260)
        kw = {"MT": 1} if form == 3 else {}
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            gemv.gemv(w, x, out=y, S=4, FORM=form, **kw)   # the stream's workspace is made outside the capture
            s.synchronize()
            s.begin_capture()
            gemv.gemv(w, x, out=y, S=4, FORM=form, **kw)
            graph = s.end_capture()
        for _ in range(3):
            xn = rng.standard_normal((1, 4096)).astype(np.float16)
            with s:       # the new activations written on the graph's own stream: a non-blocking stream does not wait
                x[...] = cp.asarray(xn)     # for the legacy default stream (the replay raced the copy on an H100)
            graph.launch(s)
            s.synchronize()
            ref = cp.asnumpy(gemv.gemv(w, cp.asarray(xn), S=4, FORM=form, **kw))
            assert np.array_equal(cp.asnumpy(y), ref), form


@pytest.mark.gpu_fast
def test_gemv_refuses_bad_inputs(cp, rng):
    from labkernels import errors, gemv, gpu

    raw = _weights(rng, "q4_K", 64, 512)
    w = gpu.QWeight.upload(raw, "q4_K")
    with pytest.raises(errors.ShapeError, match="nt = 1..16"):
        gemv.gemv(w, cp.zeros((17, 512), cp.float16))
    with pytest.raises(errors.ShapeError, match="inner dimensions"):
        gemv.gemv(w, cp.zeros((2, 256), cp.float16))
    with pytest.raises(errors.ShapeError, match="float16 or float32"):
        gemv.gemv(w, cp.zeros((2, 512), cp.float64))
    with pytest.raises(errors.ShapeError, match="splits"):
        gemv.gemv(w, cp.zeros((2, 512), cp.float16), S=3)
    with pytest.raises(errors.ShapeError, match="2-D"):
        gemv.gemv(w, cp.zeros((512,), cp.float16))
    with pytest.raises(errors.ShapeError, match="FORM=1 takes q4_K weights at nt = 1..8"):
        gemv.gemv(w, cp.zeros((9, 512), cp.float16), FORM=1)
    with pytest.raises(errors.ShapeError, match=r"FORM is one of \(0, 1, 3\)"):
        gemv.gemv(w, cp.zeros((2, 512), cp.float16), FORM=6)
    with pytest.raises(errors.ShapeError, match="FORM=3 .* MT=1 only"):
        gemv.gemv(w, cp.zeros((2, 512), cp.float16), FORM=3, MT=2)
    with pytest.raises(errors.ShapeError, match=r"FORM=3 is built with WARPS in \(4, 8\)"):
        gemv.gemv(w, cp.zeros((2, 512), cp.float16), FORM=3, MT=1, WARPS=2)
    with pytest.raises(errors.ShapeError, match=r"FORM=1 is built with WARPS in \(4,\)"):
        gemv.gemv(w, cp.zeros((2, 512), cp.float16), FORM=1, MT=1, WARPS=8)
    for kw in ({"MT": 1}, {"MT": 2}, {"MT": 1, "S": 1}):     # step 5's FORM=2 left the source: no fallback
        with pytest.raises(errors.ShapeError, match="FORM=2 .*left the source: commit 90fd260 holds it"):
            gemv.gemv(w, cp.zeros((2, 512), cp.float16), FORM=2, **kw)
    for form in (4, 5):                                      # step 7's register-capped forms left too (7894b07)
        with pytest.raises(errors.ShapeError, match=f"FORM={form} .*left the source: commit 7894b07 holds it"):
            gemv.gemv(w, cp.zeros((2, 512), cp.float16), FORM=form, MT=1)
    for kw in ({}, {"FORM": 1}, {"FORM": 3, "MT": 1}):       # step 8's PF=1 build left the source (7894b07)
        with pytest.raises(errors.ShapeError, match="PF=1 .*left the source: commit 7894b07 holds it"):
            gemv.gemv(w, cp.zeros((2, 512), cp.float16), PF=1, **kw)
    with pytest.raises(errors.ShapeError, match="FORM=1 takes q4_K"):
        gemv.gemv(gpu.QWeight.upload(_weights(rng, "q6_K", 64, 512), "q6_K"), cp.zeros((2, 512), cp.float16), FORM=1)
    with pytest.raises(TypeError, match="PIPE"):          # step 3's ring left the source (commit a1cf954)
        gemv.gemv(w, cp.zeros((2, 512), cp.float16), FORM=1, PIPE=4)
    with pytest.raises(errors.ShapeError, match="None or 'wave'"):
        gemv.gemv(w, cp.zeros((2, 512), cp.float16), S="most")
    w224 = gpu.QWeight.upload(_weights(rng, "q6_K", 64, 512), "q6_K", 224)
    y = gemv.gemv(w224, cp.zeros((2, 512), cp.float16))     # the planes are made from the GGUF rows the upload kept
    assert y.shape == (2, 64)


@pytest.mark.model
def test_gemv_real_model_tensors(cp, rng):
    """Every q4_K / q6_K tensor of Gemma 3 270M at nt = 1 and 11 (f16 and f32 activations)."""
    from labkernels import gpu, model

    n = 0
    for name, qtype, raw in model.load_kquant():
        raw = np.ascontiguousarray(raw)
        w = gpu.QWeight.upload(raw, qtype)
        for nt, f32 in ((1, 0), (11, 1)):
            x = rng.standard_normal((nt, w.id)).astype(np.float32)
            y = _run(cp, w, cp.asarray(x) if f32 else cp.asarray(x.astype(np.float16)))
            _gate(y, raw, qtype, x)
        if qtype == "q4_K":      # FORM=1 at its nt range's ends, wave and default splits
            for nt, f32, S in ((1, 0, "wave"), (8, 1, None)):
                x = rng.standard_normal((nt, w.id)).astype(np.float32)
                y = _run(cp, w, cp.asarray(x) if f32 else cp.asarray(x.astype(np.float16)), FORM=1, S=S)
                _gate(y, raw, qtype, x, form=1)
        n += 1
    assert n >= 36


@pytest.mark.gpu_fast
def test_wave_split_is_one_wave_and_gated(cp, rng):
    """S="wave": the launch plan's CTAs fit one wave of resident CTAs (the occupancy API), where the default split
    leaves a partial second wave on a 132-SM card (4096 rows at MT=1: 64 row groups; FORM=1 4 CTAs an SM: 9 splits,
    576 CTAs on 528 slots), and the output passes FORM=1's gate."""
    from labkernels import gemv, gpu

    od, id_, nt = 4096, 4096, 1
    raw = _weights(rng, "q4_K", od, id_)
    x = rng.standard_normal((nt, id_)).astype(np.float32)
    w = gpu.QWeight.upload(raw, "q4_K")
    gv = gemv.prepare(w)
    sm = gpu.device_props()["sm_count"]
    plan = gemv.launch_plan(gv, nt, 0, MT=1, WARPS=4, FORM=1, S="wave", sm_count=sm)
    assert plan["waves"] <= 1.0 or plan["S"] == 1, plan
    if sm == 132:
        assert gemv.launch_plan(gv, nt, 0, MT=1, WARPS=4, FORM=1, sm_count=sm)["waves"] > 1.0
    y = _run(cp, w, cp.asarray(x.astype(np.float16)), MT=1, FORM=1, S="wave")
    _gate(y, raw, "q4_K", x, form=1)
