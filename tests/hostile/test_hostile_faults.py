"""Class 9 (and class 2's data loss): Ctrl-C on `python3 lab.py reports 01` exits 130 without a traceback; SIGTERM
and a full disk stop a build cleanly and leave no hidden .tmp file in the reports folder; `results-table --write`
never rewrites the README from an index it did not read, or from one with fewer rounds."""
import os
import resource
import signal
import subprocess
import sys
import time

import nbformat
import pytest

from hostile_util import REPO, assert_clean_error, env, labkernels

FIGURE = ("import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(4, 3))\nax.plot([0, 1], [1, 2])\n"
          "ax.set_xlabel('x (units)')\nplt.show()")


def _nb(path, *cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {path.stem}")] +
                                  [nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def _hidden(out):
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".") and p.name != ".index.lock")


def _run_pipeline(out, nbd, names, preexec=None):
    code = ("import sys; from labkernels import pipeline; "
            f"sys.exit(pipeline.run({list(names)!r}, [], [], out_dir={str(out)!r}, notebooks_dir={str(nbd)!r}))")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(), cwd=str(REPO), start_new_session=True, preexec_fn=preexec)


def test_ctrl_c_on_lab_py_reports_exits_130_without_a_traceback(tmp_path):
    """lab.py as a user runs it (its environment set-up skipped: this checkout's Python runs labkernels)."""
    driver = tmp_path / "drive.py"
    driver.write_text("import importlib.util, pathlib, sys\n"
                      f"spec = importlib.util.spec_from_file_location('lab', {str(REPO / 'lab.py')!r})\n"
                      "lab = importlib.util.module_from_spec(spec); spec.loader.exec_module(lab)\n"
                      "lab.ensure_env = lambda *a, **k: None\nlab.PY = pathlib.Path(sys.executable)\n"
                      "sys.exit(lab.entry(sys.argv[1:]))\n")
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, str(driver), "reports", "01", "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env(), cwd=str(REPO), start_new_session=True)
    assert "01_layout_verifier: running" in p.stdout.readline()
    time.sleep(3)
    os.killpg(p.pid, signal.SIGINT)           # Ctrl-C in a terminal: the whole process group
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert not out.exists() or _hidden(out) == []


def test_sigterm_stops_a_build_and_leaves_no_temporary_file(tmp_path):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _nb(nbd / "01_slow.ipynb", "print('STA' + 'RTED', flush=True)", "import time\ntime.sleep(120)")
    p = _run_pipeline(out, nbd, ["01"])
    deadline = time.time() + 120
    while time.time() < deadline and not any("STARTED" in q.read_text() for q in out.glob(".01_slow.*.tmp.ipynb")):
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)             # the build alone, as a job scheduler stops it
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err, err
    assert _hidden(out) == [] and not (out / "01_slow.html").exists()


def _full_disk(limit):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)        # a write past the limit fails (EFBIG), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.parametrize("limit", [4_000, 30_000])   # the second past the first writes (pages are ~100 KB lighter since WebP figures)
def test_a_full_disk_is_one_clear_error_and_leaves_no_temporary_file(tmp_path, limit):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    out.mkdir()
    _nb(nbd / "01_fig.ipynb", FIGURE, "print('x' * 20000)")
    p = _run_pipeline(out, nbd, ["01"], preexec=_full_disk(limit))
    o, err = p.communicate(timeout=300)
    assert p.returncode != 0, (o, err)
    assert "Traceback" not in err, err
    assert "File too large" in err or "FAILED" in o, (o, err)
    assert _hidden(out) == [], _hidden(out)


# ------------------------------------------------------------------------------------------------ class 2
def _readme(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    return readme


@pytest.mark.parametrize("body", ["{}", "", "[]", '{"01_layout_verifier": {"status": "ok", "headline": {"a": "1"}}}'])
def test_results_table_write_never_drops_rounds_the_readme_has(tmp_path, body):
    readme = _readme(tmp_path)
    before = readme.read_bytes()
    other = tmp_path / "idx"
    other.mkdir()
    (other / "index.json").write_text('{"01_layout_verifier": {"status": "ok", "headline": {"x": "from index.json"}}}')
    copy = other / "copy.json"
    copy.write_text(body)
    r = labkernels("results-table", "--index", copy, "--write", readme)
    assert_clean_error(r, str(copy))
    assert readme.read_bytes() == before                          # the README is untouched
    assert "from index.json" not in r.stdout + r.stderr          # the file named was read, not index.json beside it


def test_results_table_reads_the_index_it_is_given_and_drops_rounds_only_on_purpose(tmp_path):
    readme = _readme(tmp_path)
    idx = tmp_path / "copy.json"
    idx.write_text('{"01_layout_verifier": {"status": "ok", "headline": {"mine": "42"}}}')
    (tmp_path / "index.json").write_text('{"01_layout_verifier": {"status": "ok", "headline": {"other": "0"}}}')
    r = labkernels("results-table", "--index", idx)
    assert r.returncode == 0 and "mine: 42" in r.stdout and "other" not in r.stdout
    r = labkernels("results-table", "--index", idx, "--write", readme, "--allow-fewer")
    assert r.returncode == 0 and "dropped on purpose" in r.stdout
    assert "| mine: 42 |" in readme.read_text()
