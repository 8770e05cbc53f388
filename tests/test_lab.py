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
    assert set(lab.COMMANDS) >= {"reports", "test", "lab", "sync", "env"}
    readme = (REPO_ROOT / "README.md").read_text()
    for cmd in lab.COMMANDS:
        assert f"python3 lab.py {cmd}" in readme, cmd
    dev = (REPO_ROOT / "docs" / "developing.md").read_text()
    for part in ("## Working in JupyterLab", "## Add a round", "## Glossary", "ipykernel install --user"):
        assert part in dev
    assert "## Measure and record" in (REPO_ROOT / "docs" / "gpu-runs.md").read_text()


def _readme_snippet():
    import re

    code = re.search(r"```python\n(.*?)```", (REPO_ROOT / "README.md").read_text(), flags=re.S).group(1)
    cpu, sep, gpu = code.partition("# --- on an NVIDIA GPU")
    assert sep and "dispatch.qmatmul" in gpu and "QWeight.upload" in gpu
    return cpu, cpu + sep + gpu


@pytest.mark.model
def test_readme_example_runs_its_cpu_part(model_path, tmp_path):
    """The README's qmatmul example as written: its CPU part (load a real tensor with the lab's loader, the CPU
    references, the gate) runs here; the whole snippet runs on a GPU machine (skipped without one)."""
    from labkernels.provenance import gpu_available

    cpu, whole = _readme_snippet()
    script = tmp_path / "snippet.py"
    script.write_text(whole if gpu_available() else cpu)
    r = subprocess.run([sys.executable, str(script)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("q6_K (64, 640) q8_1 activations alone: NMSE ")
    assert float(r.stdout.split("NMSE ")[1].split()[0]) < 5e-4


def test_readme_is_a_way_in():
    """Under 1,500 words, requirements before the commands, no path outside the clone, the docs it links exist,
    and the lab.py commands it names are lab.py's."""
    import re

    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.split()) < 1500, len(text.split())
    assert text.index("## Requirements") < text.index("## The two commands") and "nvcc" in text.split("## The two")[0]
    assert not re.search(r"\.\./|/work/|/home/|/tmp/", text), "a path outside the clone"
    for link in re.findall(r"\]\((docs/[^)]+)\)", text):
        assert (REPO_ROOT / link).is_file(), link
    for doc in ("prefill", "attention", "round7-internals", "gpu-runs", "developing"):
        assert f"docs/{doc}.md" in text
    for cmd in re.findall(r"python3 lab\.py (\w+)", text):
        assert cmd in _lab().COMMANDS, cmd
    for d in (REPO_ROOT / "docs").glob("*.md"):
        assert not re.search(r"\.\./shared|/work/", d.read_text()), d.name
