"""lab.py: nbstripout installed as the git filter, so a notebook saved with outputs is committed without them."""
import importlib.util
import shutil
import subprocess
import sys

import nbformat
import pytest

from labkernels.paths import REPO_ROOT


def _lab():
    spec = importlib.util.spec_from_file_location("lab", REPO_ROOT / "lab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not shutil.which("git"), reason="needs git")
def test_git_filter_strips_outputs_on_commit(tmp_path):
    pytest.importorskip("nbstripout")
    lab = _lab()
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout  # noqa: E731
    assert lab.install_git_filter(tmp_path, sys.executable) is False  # not a checkout: nothing done
    git("init", "-q")
    shutil.copy(REPO_ROOT / ".gitattributes", tmp_path / ".gitattributes")
    assert lab.install_git_filter(tmp_path, sys.executable) is True
    assert lab.install_git_filter(tmp_path, sys.executable) is True  # idempotent
    assert git("config", "--get", "filter.nbstripout.clean").strip() == f'"{sys.executable}" -m nbstripout'
    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells[0].execution_count = 1
    nbformat.write(nb, str(tmp_path / "notebooks" / "01_x.ipynb"))
    git("add", "notebooks/01_x.ipynb")
    staged = nbformat.reads(git("show", ":notebooks/01_x.ipynb"), as_version=4)
    assert staged.cells[0].outputs == [] and staged.cells[0].execution_count is None
    assert staged.cells[0].source == "print(1)"
    # the committed round notebooks are already what the filter produces (no churn once it is installed)
    for p in sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        out = subprocess.run([sys.executable, "-m", "nbstripout", "-t"], input=p.read_text(), capture_output=True,
                             text=True, check=True).stdout
        assert nbformat.reads(out, as_version=4) == nbformat.read(str(p), as_version=4), p.name


def test_lab_commands_are_documented():
    lab = _lab()
    assert set(lab.COMMANDS) >= {"reports", "test", "lab", "sync"}
    readme = (REPO_ROOT / "README.md").read_text()
    for cmd in ("python3 lab.py lab", "python3 lab.py sync", "## Working in JupyterLab", "## Run on your own GPU",
                "## Add a round", "## Glossary"):
        assert cmd in readme
