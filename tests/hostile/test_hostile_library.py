"""Class 6: the lab's public functions check shapes, ranges and types and raise the lab's own errors (never
KeyError / IndexError / ZeroDivisionError / AttributeError, never a grid like (1, -128) or a clamped argument).
The GPU-path checks (dispatch.choose, dispatch.qmatmul) run on the host: these tests need no GPU."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkernels import cli, dispatch, errors, gpu, layout, occupancy, quantize_ref, quants, reference, wgmma
from labkernels.kernels import registry

ANY = st.one_of(st.integers(-2**40, 2**40), st.booleans(), st.floats(allow_nan=True), st.text(max_size=5),
                st.none(), st.lists(st.integers(), max_size=2))


def lab_error(e: BaseException) -> bool:
    return cli.lab_error(e)


@settings(max_examples=200, deadline=None)
@given(qtype=st.sampled_from(["q4_K", "q6_K", "q9_K", "Q4_K", "", None, 4]), nt=ANY, od=ANY, id_=ANY)
def test_choose_answers_for_a_valid_gemm_and_refuses_anything_else(qtype, nt, od, id_):
    valid = (qtype in ("q4_K", "q6_K") and all(type(v) is int and 1 <= v < 2**31 for v in (nt, od, id_))
             and id_ % 256 == 0)
    try:
        ch = dispatch.choose(qtype, nt, od, id_, cc=80)
    except errors.ShapeError as e:
        assert not valid, e
        return
    assert valid and ch.family in ("q4k_nb", "q6k_expb", "q6k_generic", "wgmma_kq") and ch.reason


@settings(max_examples=200, deadline=None)
@given(sk=st.integers(0, 3), nt=st.integers(-300, 5000), od=st.integers(-300, 20000), id_=st.integers(-512, 20000),
       bn=st.sampled_from([0, 7, 64, 128, 256, -128]), sm=st.integers(-2, 200))
def test_schedule_grids_are_positive_or_refused(sk, nt, od, id_, bn, sm):
    try:
        ncta, dp = wgmma.schedule(sk, nt, od, id_, bn, sm)
    except (errors.ShapeError, ValueError) as e:
        assert lab_error(e) or "exceeds the kernel's 32-bit" in str(e)
        assert not (nt >= 1 and od >= 1 and id_ >= 256 and id_ % 256 == 0 and bn in (128, 256) and sm >= 1) \
            or sk in (2, 3)
        return
    tiles = wgmma.tile_count(nt, od, bn)
    assert ncta >= 1 and 0 <= dp <= tiles


@settings(max_examples=100, deadline=None)
@given(n=ANY, qtype=st.sampled_from(["q4_K", "q6_K", "q8_0", "q5_0"]))
def test_row_bytes_is_positive_or_refused(n, qtype):
    qk, nbytes = quants.BLOCK_SIZES[qtype]
    try:
        b = quants.row_bytes(qtype, n)
    except quants.QuantFormatError:
        assert not (type(n) is int and n >= qk and n % qk == 0)
        return
    assert b == n // qk * nbytes and b > 0


@pytest.mark.parametrize("threads", [0, -1, 1.5, "2", True])
def test_quantizer_thread_counts_are_checked_not_clamped(threads):
    x = np.ones((2, 256), np.float32)
    for fn in (quantize_ref.quantize_q4_K, quantize_ref.quantize_q6_K):
        with pytest.raises(quantize_ref.QuantInputError, match="num_threads must be an integer >= 1"):
            fn(x, num_threads=threads)


def test_quantizer_thread_count_from_the_environment_is_checked(monkeypatch):
    monkeypatch.setenv("LABKERNELS_QUANT_THREADS", "zero")
    with pytest.raises(quantize_ref.QuantInputError, match="LABKERNELS_QUANT_THREADS='zero'"):
        quantize_ref.quantize_q6_K(np.ones((2, 256), np.float32))


@pytest.mark.parametrize("n, ok", [(256, True), (17, False), (512, False), (2.0, False), (None, True)])
def test_reference_dequantize_checks_n(n, ok, rng):
    raw = quantize_ref.quantize_q6_K(rng.standard_normal((2, 256)).astype(np.float32))
    if ok:
        assert quantize_ref.dequantize(raw, "q6_K", n=n).shape == (2, 256)
    else:
        with pytest.raises(quantize_ref.QuantInputError, match="dequantize: n"):
            quantize_ref.dequantize(raw, "q6_K", n=n)
    with pytest.raises(quantize_ref.QuantInputError, match="whole 210-byte blocks"):
        quantize_ref.dequantize(raw[:, :100], "q6_K")


@pytest.mark.parametrize("qtype, stride", [("q6_K", 100), ("q6_K", 144), ("q4_K", 210), ("q6_K", "210"),
                                           ("q6_K", True)])
def test_gemm_int_ref_refuses_a_wrong_stride(qtype, stride, rng):
    w = quants.quantize(rng.standard_normal((2, 256)).astype(np.float32), qtype)
    a = reference.quantize_activations(rng.standard_normal((1, 256)).astype(np.float32))
    with pytest.raises(reference.ShapeError, match="block stride must be"):
        reference.gemm_int_ref(w, qtype, a, stride=stride)


def _tiny_model():
    from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config

    cfg = tiny_config("llama", n_layer=1)
    return SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=1)


@pytest.mark.parametrize("tokens, match", [([1.7, 2.0], "must be integers, got float 1.7"), ([], "empty"),
                                           ([[1, 2]], "must be 1-D"), ([1, 1000], "id 1000 at position 1"),
                                           ([-1], "id -1 at position 0"), ("12", "sequence of integers"),
                                           ([True], "must be integers")])
def test_forward_ref_and_prompt_tokens_take_integer_ids_inside_the_vocabulary(tokens, match):
    from labkernels.arch import TokenError
    from labkernels.prefill_runs import prompt_tokens
    from labkernels.prefill_ref import forward_ref

    m = _tiny_model()
    with pytest.raises(TokenError, match=match):
        forward_ref(m, tokens, last_only=True)
    if tokens != []:
        with pytest.raises(TokenError, match=match):
            prompt_tokens(m, 0, tokens)
    for n in (2.5, "3", -1):
        with pytest.raises(TokenError, match="token count must be a non-negative integer"):
            prompt_tokens(m, n)


def test_qmatmul_and_kernel_refuse_before_touching_the_gpu():
    with pytest.raises(errors.ShapeError, match="qmatmul takes a QWeight .*got NoneType"):
        dispatch.qmatmul(np.zeros((2, 256), np.float32), None)
    with pytest.raises(errors.ShapeError, match="unknown kernel"):
        dispatch.qmatmul(np.zeros((2, 256), np.float32), None, kernel=["auto"])
    with pytest.raises(registry.RegistryError, match="no kernel family 'nope'; families: .*q6k_expb") as e:
        gpu.kernel("nope")
    assert isinstance(e.value, KeyError) and not str(e.value).startswith("'")
    with pytest.raises(registry.RegistryError, match="no registered kernel q6k_expb with"):
        gpu.kernel("q6k_expb", KDR=99)


@pytest.mark.parametrize("fn, nbytes", [(layout.q4k_codes, 144), (layout.q6k_codes, 210), (layout.q5_0_codes, 22)])
@pytest.mark.parametrize("shape, dtype", [("short", np.uint8), ((3,), np.uint8), ((3, 300), np.int32),
                                          ((2, 2, 300), np.uint8)])
def test_layout_codes_refuse_short_or_odd_blocks(fn, nbytes, shape, dtype):
    shape = (3, nbytes - 1) if shape == "short" else shape
    with pytest.raises(layout.LayoutError, match=rf"takes \[n, >={nbytes}\] uint8 block bytes"):
        fn(np.zeros(shape, dtype))


def test_layout_scale_min_refuses_a_wrong_width():
    with pytest.raises(layout.LayoutError, match=r"\[n, 12\]"):
        layout.q4k_scale_min(np.zeros((2, 11), np.uint8))


@pytest.mark.parametrize("device", [{}, {"key": "x"}, 42, None, ["h200"]])
def test_occupancy_refuses_an_empty_or_odd_device_profile(device):
    with pytest.raises(occupancy.OccupancyError):
        occupancy.occupancy(device, 256, 64, 0)


def test_occupancy_refuses_a_profile_dict_with_odd_values():
    p = occupancy.profile("h200")
    for k, v in (("warp_size", 0), ("max_warps_per_sm", "64"), ("carveout_steps_kb", ()), ("sm_count", -1)):
        with pytest.raises(occupancy.OccupancyError, match=k):
            occupancy.occupancy({**p, k: v}, 256, 64, 0)
    assert occupancy.occupancy(p, 256, 64, 0)["blocks_per_sm"] >= 1     # a whole profile dict still works


@settings(max_examples=100, deadline=None)
@given(w=st.one_of(st.floats(allow_nan=True), st.integers(-5, 100)), o=st.one_of(st.floats(allow_nan=True),
                                                                              st.integers(-5, 200)))
def test_max_warps_from_achieved_is_positive_or_refused(w, o):
    try:
        r = occupancy.max_warps_from_achieved(w, o)
    except occupancy.OccupancyError:
        assert not (np.isfinite(w) and np.isfinite(o) and w >= 0 and 0 < o <= 100) or \
            not np.isfinite(w / (o / 100 if o > 1 else o))
        return
    assert r >= 0 and np.isfinite(r)
