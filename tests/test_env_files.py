"""environment.yml holds the same packages and versions as pyproject.toml (dependencies and every extra)."""
import tomllib

import yaml
from packaging.requirements import Requirement

from labkernels.paths import REPO_ROOT


def _req(s):
    r = Requirement(s)
    return r.name.lower().replace("_", "-"), str(r.specifier)


def test_environment_yml_matches_pyproject():
    pp = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    want = {_req(s) for s in pp["dependencies"]}
    for extra in pp["optional-dependencies"].values():
        want |= {_req(s) for s in extra}
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    have, pip = set(), []
    for d in env["dependencies"]:
        if isinstance(d, dict):
            pip += d["pip"]
        elif d == "pip":
            continue
        elif d.startswith("python"):
            assert d == "python" + pp["requires-python"]
        else:
            have.add(_req(d))
    assert "-e ." in pip
    have |= {_req(s) for s in pip if s != "-e ."}
    assert have == want, (sorted(want - have), sorted(have - want))


def test_gpu_extra_has_the_tracer_dependency():
    pp = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert {_req(s)[0] for s in pp["optional-dependencies"]["gpu"]} >= {"cupy-cuda12x", "cupti-python"}
