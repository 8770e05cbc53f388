"""The kernel papermill runs a notebook with (pipeline.kernel_for): the one its metadata names, else python3; either
way it must start the lab's interpreter -- a kernelspec naming another Python is refused before anything runs."""
import json
import sys

import nbformat
import pytest

from labkernels import pipeline


def _spec(root, name, argv0):
    d = root / "kernels" / name
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(json.dumps({"argv": [argv0, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                               "display_name": name, "language": "python"}))
    return d


def _nb(path, kernel="labkernels"):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('VALUE', 6 * 7)")])
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def specs(tmp_path, monkeypatch):
    """An empty Jupyter data dir ahead of every other (JUPYTER_PATH): the specs a test writes there win."""
    root = tmp_path / "jupyter"
    root.mkdir()
    monkeypatch.setenv("JUPYTER_PATH", str(root))
    return root


def test_the_metadata_kernel_runs_when_it_starts_this_interpreter(specs, tmp_path):
    _spec(specs, "labkernels", sys.executable)
    assert pipeline.kernel_for(_nb(tmp_path / "a.ipynb")) == ("labkernels", "")
    _spec(specs, "plain", "python3")                  # jupyter_client starts 'python3' as sys.executable
    assert pipeline.kernel_for(_nb(tmp_path / "b.ipynb", "plain")) == ("plain", "")


def test_without_the_named_kernelspec_python3_runs_and_says_so(specs, tmp_path):
    name, note = pipeline.kernel_for(_nb(tmp_path / "a.ipynb", "nowhere"))
    assert name == "python3" and "no 'nowhere' kernelspec here" in note


def test_a_kernelspec_of_another_interpreter_is_refused(specs, tmp_path):
    other = tmp_path / "other-python"
    other.write_text("#!/bin/sh\necho /some/other/prefix\n")
    other.chmod(0o755)
    _spec(specs, "labkernels", str(other))
    with pytest.raises(pipeline.PipelineError, match="starts .*other-python, not this lab's interpreter"):
        pipeline.kernel_for(_nb(tmp_path / "a.ipynb"))
    _spec(specs, "python3", str(other))               # a user-level python3 pointing elsewhere: the silent case
    with pytest.raises(pipeline.PipelineError, match="'python3' kernelspec"):
        pipeline.kernel_for(_nb(tmp_path / "b.ipynb", "python3"))


def test_another_path_to_this_interpreter_is_this_interpreter(specs, tmp_path):
    wrapper = tmp_path / "py"                         # another path that starts this Python (same sys.prefix)
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    _spec(specs, "labkernels", str(wrapper))
    assert pipeline.kernel_for(_nb(tmp_path / "a.ipynb"))[0] == "labkernels"


def test_run_refuses_a_foreign_kernel_before_anything_runs(specs, tmp_path, capsys):
    other = tmp_path / "other-python"
    other.write_text("#!/bin/sh\necho /elsewhere\n")
    other.chmod(0o755)
    _spec(specs, "labkernels", str(other))
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _nb(nbd / "01_a.ipynb")
    assert pipeline.run([], [], [], out_dir=out, notebooks_dir=nbd) == 2
    assert "not this lab's interpreter" in capsys.readouterr().err and not (out / "01_a.html").exists()


def test_run_uses_the_metadata_kernel_and_records_it(specs, tmp_path):
    _spec(specs, "labkernels", sys.executable)
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _nb(nbd / "01_a.ipynb")
    assert pipeline.run([], [], [], out_dir=out, notebooks_dir=nbd) == 0
    state = json.loads((out / "index.json").read_text())
    assert state["01_a"]["status"] == "ok" and state["01_a"]["kernel"] == "labkernels"
    assert "VALUE 42" in (out / "01_a.html").read_text()
