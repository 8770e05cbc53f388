"""The headless pipeline: papermill -> HTML (code folded) -> index, failures isolated and reported."""
import json

import nbformat

from labkernels import pipeline


def _nb(path, cells):
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def _params(src):
    c = nbformat.v4.new_code_cell(src)
    c.metadata["tags"] = ["parameters"]
    return c


def test_run_index_failure_and_params(tmp_path):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _nb(nbd / "01_good.ipynb", [nbformat.v4.new_markdown_cell("# Good round"), _params("value = 1"),
                                nbformat.v4.new_code_cell("from labkernels import report\nreport.resolve_mode('cpu')\n"
                                                          "report.headline(doubled=value * 2)\nprint('VALUE', value)")])
    _nb(nbd / "02_bad.ipynb", [nbformat.v4.new_markdown_cell("# Bad round"),
                               nbformat.v4.new_code_cell("raise RuntimeError('gate failed on purpose')")])
    rc = pipeline.run([], ["value=21", "unused=3"], [], out_dir=out, notebooks_dir=nbd)
    assert rc == 1  # one notebook failed
    state = json.loads((out / "index.json").read_text())
    assert state["01_good"]["status"] == "ok" and state["01_good"]["headline"] == {"doubled": "42"}
    assert state["01_good"]["params"] == {"value": 21} and state["01_good"]["mode"] == "cpu"
    assert state["02_bad"]["status"] == "failed" and "gate failed on purpose" in state["02_bad"]["error"]
    html = (out / "01_good.html").read_text()
    assert "<details" in html and "VALUE 21" in html
    assert "gate failed on purpose" in (out / "02_bad.html").read_text()
    index = (out / "index.html").read_text()
    assert "01_good.html" in index and "failed" in index and "42" in index
    # the committed notebook is untouched (outputs only in out/)
    assert not nbformat.read(str(nbd / "01_good.ipynb"), as_version=4).cells[2].outputs


def test_committed_notebooks_are_clean_and_parameterized():
    from labkernels.paths import NOTEBOOKS_DIR

    nbs = pipeline.discover(NOTEBOOKS_DIR)
    assert [p.name[:2] for p in nbs][:4] == ["01", "02", "03", "04"]
    for p in nbs:
        nb = nbformat.read(str(p), as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), p
        assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1, p
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# Round")
