"""The round notebooks: one source each (jupytext .py paired with the .ipynb, in sync), committed without
outputs (what the nbstripout filter commits), a parameters cell papermill's own parser reads completely."""
import logging
import subprocess

import nbformat
import pytest

from labkernels import pipeline
from labkernels.paths import NOTEBOOKS_DIR, REPO_ROOT

NBS = pipeline.discover(NOTEBOOKS_DIR)


def test_every_round_has_one_source_and_a_pair_in_sync():
    assert [p.name[:2] for p in NBS][:6] == ["01", "02", "03", "04", "05", "06"]
    sources = sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.py"))
    assert sources == [p.stem for p in NBS]  # every .ipynb has its .py and vice versa
    for p in NBS:
        assert pipeline.pair_differences(p) == [], p
    assert not (REPO_ROOT / "tools" / "notebooks").exists()  # the string generators are gone
    cfg = (NOTEBOOKS_DIR / "jupytext.toml").read_text()
    assert 'formats = "ipynb,py:percent"' in cfg


def _committed(p):
    """The notebook as git will commit it (the index, after the clean filter), else the file."""
    rel = p.relative_to(REPO_ROOT).as_posix()
    r = subprocess.run(["git", "show", f":{rel}"], cwd=REPO_ROOT, capture_output=True, text=True)
    return nbformat.reads(r.stdout, as_version=4) if r.returncode == 0 else nbformat.read(str(p), as_version=4)


@pytest.mark.parametrize("p", NBS, ids=[p.stem for p in NBS])
def test_committed_notebook_is_clean_and_conventional(p):
    nb = _committed(p)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), p
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1, p
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# Round")
    assert nb.metadata["kernelspec"]["name"] == "labkernels"
    # the first code cell after the parameters sets up inline figures and the shared style
    first = code[[i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", [])][0] + 1]
    assert "report.setup()" in first.source, p


@pytest.mark.parametrize("p", NBS, ids=[p.stem for p in NBS])
def test_papermill_parses_every_parameter(p, caplog):
    from papermill.translators import PythonTranslator

    cell = [c for c in nbformat.read(str(p), as_version=4).cells if "parameters" in c.metadata.get("tags", [])][0]
    with caplog.at_level(logging.WARNING, logger="papermill"):
        parsed = PythonTranslator.inspect(cell)
    assert not [r for r in caplog.records if "Unable to parse" in r.getMessage()], caplog.text
    assigned = [line.split("=")[0].split(":")[0].strip() for line in cell.source.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert [q.name for q in parsed] == assigned
    declared = pipeline.declared_parameters(p)  # also: every default a literal of a known type
    assert list(declared) == assigned
    for name, d in declared.items():
        assert pipeline.type_ok(d["default"], d["type"]) and d["help"], (p.name, name)


def test_round1_seed_model_path_and_filter_are_parameters():
    d = pipeline.declared_parameters([p for p in NBS if p.stem.startswith("01")][0])
    assert pipeline.type_name(d["seed"]["type"]) == "Range[0, 4294967295]"
    assert pipeline.type_name(d["model_path"]["type"]) == "Optional[str]"
    assert pipeline.type_name(d["tensor_filter"]["type"]) == "Optional[Regex]"


def test_unknown_and_ill_typed_parameters_exit_before_executing(tmp_path):
    import sys

    for args, msg in ((["01", "-p", "bogus=1"], "unknown parameter bogus"),
                      (["03", "-p", "nts=512"], "nts = 512: must be list (declared NonEmpty[List[Range[1, 65536]]])"),
                      (["03", "-p", "headline_nt=seven"], "headline_nt = 'seven': must be one of nts = [512, 3328, 4096]"),
                      (["03", "-p", "mode=fast"], "mode = 'fast': must be one of auto, measure, replay")):
        r = subprocess.run([sys.executable, "-m", "labkernels", "run", *args, "--out", str(tmp_path)],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
        assert "nothing was run" in r.stderr and "running" not in r.stdout
    assert list(tmp_path.iterdir()) == []
