"""Class 5: notebook parameters of the right type and a bad value. Every parameters cell declares the allowed
values next to the type (OneOf, Range, NonEmpty, Shape, Regex, Known, Member, ...); `labkernels report run` refuses a
value outside them -- and one that would have no effect in the mode the page renders in -- before any cell runs."""
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_util import assert_clean_error, labkernels
from labkernels import pipeline

NBS = {nb.stem[:2]: nb for nb in pipeline.discover()}
DECLARED = {k: pipeline.declared_parameters(nb) for k, nb in NBS.items()}


def _check(nb, *pairs):
    glob, per = pipeline.load_params(list(pairs), [])
    return pipeline.check_params([NBS[nb]], glob, per)


@pytest.mark.parametrize("nb, pair, message", [
    ("01", "strides=[]", "strides = []: must not be empty"),
    ("01", "strides=[100]", "must be one of 210, 224"),
    ("01", "tensor_filter=((", "not a regular expression"),
    ("01", "seed=-1", "seed = -1: must be in 0..4294967295"),
    ("01", "random_blocks=0", "random_blocks = 0: must be in 1..1000000"),
    ("02", "kernel_family=nope", "kernel_family = 'nope': must be one of q4k_nb, q6k_expb"),
    ("02", "device=nodevice", "device = 'nodevice': must be one of"),
    ("02", "threads=0", "threads = 0: must be in 1..1024"),
    ("02", "profiles=[]", "profiles = []: must not be empty"),
    ("03", "headline_nt=999", "headline_nt = 999: must be one of nts = [512, 3328, 4096]"),
    ("03", "headline_shape=[1,2]", "headline_shape = [1, 2]: must be one of shapes"),
    ("03", "stride=100", "stride = 100: must be one of 210, 224"),
    ("03", "mode=cpu", "mode = 'cpu': must be one of auto, measure, replay"),
    ("03", "shapes=[[4096,1000]]", "id = 1000 is not a multiple of 256"),
    ("03", "variants=[nope]", "must be one of q6k_generic"),
    ("04", "headline_nt=5", "headline_nt = 5: must be one of nts"),
    ("05", "timeline_layer=999", "timeline_layer = 999: must be in 0..255"),
    ("05", "model=llama70b", "model = 'llama70b': must be one of"),
    ("06", "shape=bogus", "shape = 'bogus': must be one of 3328x4096x4096, 3328x4096x11008"),
    ("06", "metrics_set=none", "metrics_set = 'none': must be one of full, core"),
    ("07", "headline_nt=5", "headline_nt = 5: must be one of nts"),
    ("07", "qtypes=[q9_K]", "must be one of q4_K, q6_K"),
    ("08", "cluster=nowhere", "cluster = 'nowhere': not a cluster"),
    ("08", "plan=nope", "plan = 'nope': must be one of"),
    ("08", "summary_run=x", "summary_run must be Optional[RunId], got 'x' (str): not a run id"),
])
def test_a_bad_value_is_refused_before_anything_runs(nb, pair, message):
    with pytest.raises(pipeline.PipelineError) as e:
        _check(nb, pair)
    assert message in str(e.value) and "nothing was run" in str(e.value), str(e.value)


def test_a_value_that_needs_the_other_parameters(monkeypatch):
    with pytest.raises(pipeline.PipelineError, match="timeline_layer = 20: gemma has layers 0..17"):
        pipeline.check_params([NBS["05"]], *pipeline.load_params(["model=gemma", "timeline_layer=20"], []))
    monkeypatch.setattr(pipeline, "round_problems", lambda *a: [])  # (no replay here: a value among the nts given)
    _check("03", "nts=[64, 128]", "headline_nt=64")


@pytest.mark.parametrize("pairs, message", [
    (["repeats=5"], "repeats = 5 has no effect in replay mode (it applies in measure mode): the page replays run"),
    (["mode=measure"], "mode=measure needs a CUDA GPU with cupy; this machine has none"),
    (["nts=[64]", "headline_nt=64"], "nts = [64] has no effect in replay mode"),
])
def test_a_parameter_without_effect_in_replay_is_refused(pairs, message):
    from labkernels.provenance import gpu_available

    if gpu_available():
        pytest.skip("on a GPU machine the page measures")
    with pytest.raises(pipeline.PipelineError, match=re.escape(message)):
        _check("03", *pairs)


def test_a_value_the_replayed_run_recorded_is_accepted():
    _check("03", "stride=210", "headline_nt=512")   # what run 03's replayed run recorded: no contradiction


def test_labkernels_run_exits_2_and_runs_nothing(tmp_path):
    r = labkernels("run", "03", "-p", "headline_nt=999", "-p", "stride=100", "--out", tmp_path)
    assert r.returncode == 2 and "nothing was run" in r.stderr and "Traceback" not in r.stderr
    assert "headline_nt = 999" in r.stderr and "stride = 100" in r.stderr and "running" not in r.stdout
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- properties
VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                      | st.text(max_size=8), lambda c: st.lists(c, max_size=4), max_leaves=8)
PARAMS = [(nb, k) for nb, d in DECLARED.items() for k in d]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(PARAMS), value=VALUES)
def test_any_value_of_any_parameter_is_accepted_or_a_pipeline_error(monkeypatch, target, value):
    monkeypatch.setattr(pipeline, "round_problems", lambda *a: [])
    nb, k = target
    spec = DECLARED[nb][k]["type"]
    try:
        pipeline.check_params([NBS[nb]], {k: value}, {})
    except pipeline.PipelineError as e:
        assert f"{NBS[nb].stem}: {k}" in str(e)
        return
    _oracle(value, spec, {**{n: d["default"] for n, d in DECLARED[nb].items()}, k: value})


def _oracle(value, spec, params):
    """What an accepted value must be, written from the declaration independently of pipeline.value_problem."""
    kind = spec[0]
    if kind == "optional":
        return value is None or _oracle(value, spec[1], params)
    if kind == "range":
        assert type(value) is int and spec[1] <= value <= spec[2]
    elif kind == "oneof":
        assert any(type(value) is type(a) and value == a for a in spec[1])
    elif kind == "member":
        assert value in params[spec[1]]
    elif kind == "nonempty":
        assert isinstance(value, list) and value
        _oracle(value, spec[1], params)
    elif kind == "list":
        assert isinstance(value, list)
        for v in value:
            _oracle(v, spec[1], params)
    elif kind == "int":
        assert type(value) is int
    elif kind == "bool":
        assert type(value) is bool
    elif kind == "str":
        assert isinstance(value, str)
    elif kind == "named" and spec[1] == "Shape":
        assert len(value) == 2 and 1 <= value[0] <= 65536 and value[1] % 256 == 0 and 256 <= value[1] <= 65536


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=30))
def test_any_p_text_parses_or_is_a_pipeline_error(text):
    try:
        glob, _ = pipeline.load_params([f"x={text}"], [])
    except pipeline.PipelineError:
        return
    assert "x" in glob


def test_a_parameters_file_that_is_not_a_mapping_is_refused(tmp_path):
    for body in ("[1, 2]", "!!python/object/apply:os.system ['true']", "a: [", "\x00"):
        f = tmp_path / "p.yaml"
        f.write_text(body)
        r = labkernels("run", "03", "-f", f, "--out", tmp_path / "out")
        assert_clean_error(r, "-f")


def test_a_gpu_round_opened_in_cpu_mode_is_refused_by_the_library_too():
    from labkernels import rounds

    with pytest.raises(rounds.RoundError, match="shows recorded GPU runs: mode measure, replay or auto, not cpu"):
        rounds.open_round("03", "cpu")
