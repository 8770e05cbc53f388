"""The headless pipeline: papermill -> HTML (code folded, figures inline) -> index; parameters checked before
anything runs; failures on their own page; atomic files, a locked index, Ctrl-C and concurrent builds."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from labkernels import pipeline

REPO = Path(__file__).resolve().parents[1]
FIGURE = ("import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(4, 3))\nax.plot([0, 1], [value, 2])\n"
          "ax.set_xlabel('x (units)')\nplt.show()")


def _nb(path, cells):
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def _params(src):
    c = nbformat.v4.new_code_cell(src)
    c.metadata["tags"] = ["parameters"]
    return c


def _good(path, title="Good round", extra=""):
    _nb(path, [nbformat.v4.new_markdown_cell(f"# {title}"), _params("value = 1  # an int\nlabel = 'x'"),
               nbformat.v4.new_code_cell("from labkernels import report\nmode = report.resolve_mode('cpu')\n"
                                         "report.headline(doubled=value * 2)\nprint('VALUE', value)" + extra),
               nbformat.v4.new_code_cell(FIGURE)])


def _bad(path, fail=True):
    src = "raise RuntimeError('gate failed on purpose')" if fail else "from labkernels import report\nreport.headline(fine='yes')"
    _nb(path, [nbformat.v4.new_markdown_cell("# Bad round"), nbformat.v4.new_code_cell(src)])


def test_run_index_figures_failure_page_and_last_good(tmp_path):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _good(nbd / "01_good.ipynb")
    _bad(nbd / "02_bad.ipynb", fail=False)
    # MPLBACKEND=Agg here (conftest / lab.py): the pipeline still renders the figure inline
    assert os.environ.get("MPLBACKEND") == "Agg"
    assert pipeline.run([], ["value=21"], [], out_dir=out, notebooks_dir=nbd) == 0
    good_02 = (out / "02_bad.html").read_text()
    _bad(nbd / "02_bad.ipynb", fail=True)
    rc = pipeline.run([], ["value=21"], [], out_dir=out, notebooks_dir=nbd)
    assert rc == 1  # one notebook failed
    state = json.loads((out / "index.json").read_text())
    assert state["01_good"]["status"] == "ok" and state["01_good"]["headline"] == {"doubled": "42"}
    assert state["01_good"]["params"] == {"value": 21} and state["01_good"]["mode"] == "cpu"
    assert state["02_bad"]["status"] == "failed" and "gate failed on purpose" in state["02_bad"]["error"]
    assert state["02_bad"]["last_good"]["headline"] == {"fine": "yes"}
    html = (out / "01_good.html").read_text()
    assert "<details" in html and "VALUE 21" in html
    assert html.count('src="data:image/webp;base64,') == 1  # the figure is in the page (lossless WebP)
    assert "data:image/png" not in html
    # the page works offline: no script from anywhere (require.js, MathJax, mermaid were CDN scripts)
    assert not re.search(r"<script[^>]+src=", html) and "cdnjs" not in html and "mathjax" not in html.lower()
    assert not re.search(r"In&nbsp;\[\d*\]", html) and not re.search(r"Out\[\d+\]", html)  # no prompts
    assert 'href="index.html"' in html and 'href="02_bad.html"' in html  # navigation bar: index, next
    assert "value = 21" in html  # the parameters given are shown
    # the failed render has its own page; the last good page of that round is untouched
    assert "gate failed on purpose" in (out / "02_bad.failed.html").read_text()
    assert (out / "02_bad.html").read_text() == good_02
    index = (out / "index.html").read_text()
    assert "01_good.html" in index and "02_bad.failed.html" in index and "02_bad.html" in index and "42" in index
    # executed notebooks carry the notes in their metadata; no side files, no temporary files left
    ex = nbformat.read(str(out / "01_good.ipynb"), as_version=4)
    assert ex.metadata["labkernels"]["headline"] == {"doubled": "42"}
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".") and p.name != ".index.lock") == []
    # the committed notebook is untouched (outputs only in out/)
    assert not nbformat.read(str(nbd / "01_good.ipynb"), as_version=4).cells[2].outputs
    # a good render again removes the failed page
    _bad(nbd / "02_bad.ipynb", fail=False)
    assert pipeline.run(["02"], [], [], out_dir=out, notebooks_dir=nbd) == 0
    assert not (out / "02_bad.failed.html").exists()


@pytest.mark.parametrize("pairs, files, message", [
    (["bogus=1"], [], "unknown parameter bogus"),
    (["value=seven"], [], "01_good: value must be int, got 'seven' (str)"),
    (["value=1.5"], [], "value must be int"),
    (["label=3"], [], "label must be str"),
    (["mode=fast"], [], None),  # nobody declares mode here: unknown
    ([], [{"01_good": {"nope": 1}}], "01_good does not declare nope"),
    (["novalue"], [], "-p expects name=value"),
])
def test_bad_parameters_fail_before_anything_runs(tmp_path, capsys, pairs, files, message):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _good(nbd / "01_good.ipynb", extra="\nopen('RAN', 'w').write('x')")
    paths = []
    for i, f in enumerate(files):
        p = tmp_path / f"p{i}.yaml"
        p.write_text(json.dumps(f))
        paths.append(str(p))
    assert pipeline.run([], pairs, paths, out_dir=out, notebooks_dir=nbd) == 2
    err = capsys.readouterr().err
    assert (message or "unknown parameter mode") in err
    if "-p expects" not in err:
        # the error lists the parameters and their types
        assert "value  int" in err and "label  str" in err
    assert not (nbd / "RAN").exists() and not (out / "01_good.html").exists()


def test_parameter_types_from_defaults_and_annotations(tmp_path):
    nbd = tmp_path / "nb"
    nbd.mkdir()
    _nb(nbd / "01_t.ipynb", [_params('path: "Optional[str]" = None  # a file; None: the default one\n'
                                     'shapes = [[1, 2], [3, 4]]  # [od, id]\nratio = 0.5\nflag = True\nnts = [1, 2.5]')])
    d = pipeline.declared_parameters(nbd / "01_t.ipynb")
    assert {k: pipeline.type_name(v["type"]) for k, v in d.items()} == {
        "path": "Optional[str]", "shapes": "List[List[int]]", "ratio": "float", "flag": "bool", "nts": "List[float]"}
    nbs = [nbd / "01_t.ipynb"]
    assert pipeline.check_params(nbs, {"path": "/x", "ratio": 2, "nts": [3]}, {})["01_t"]["ratio"] == 2
    for bad in ({"shapes": [[1, "a"]]}, {"flag": 1}, {"ratio": True}, {"path": 3}, {"nts": 3}):
        with pytest.raises(pipeline.PipelineError, match="must be"):
            pipeline.check_params(nbs, bad, {})


@pytest.mark.parametrize("src, message", [
    ("model_path = None  # a file; None = default", "cannot parse the parameters \\['model_path'\\]"),
    ("x = None", "defaults to None: annotate"),
    ("x = len([])", "not a literal"),
])
def test_parameters_cells_papermill_cannot_read_are_errors(tmp_path, src, message):
    _nb(tmp_path / "01_t.ipynb", [_params(src)])
    with pytest.raises(pipeline.PipelineError, match=message):
        pipeline.declared_parameters(tmp_path / "01_t.ipynb")


def test_corrupt_index_is_an_error_not_empty(tmp_path, capsys):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    out.mkdir()
    _good(nbd / "01_good.ipynb")
    (out / "index.json").write_text('{"01_good": {"status": "ok", "headl')
    assert pipeline.run([], [], [], out_dir=out, notebooks_dir=nbd) == 2
    assert "index.json is corrupt" in capsys.readouterr().err
    assert (out / "index.json").read_text() == '{"01_good": {"status": "ok", "headl'  # left as found
    (out / "index.json").write_text("[1, 2]")
    with pytest.raises(pipeline.PipelineError, match="not an index"):
        pipeline.load_state(out)


def _spawn(out, nbd, names=(), session=False, tag=""):
    code = ("import sys; from labkernels import pipeline; "
            f"sys.exit(pipeline.run({list(names)!r}, [], [], out_dir={str(out)!r}, notebooks_dir={str(nbd)!r}))")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), LK_TEST_TAG=tag)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=str(REPO), start_new_session=session)


def test_two_concurrent_builds_leave_a_consistent_index(tmp_path):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    for i in range(1, 5):
        _good(nbd / f"0{i}_r{i}.ipynb", title=f"Round {i}", extra="\nimport time; time.sleep(0.3)")
    a = _spawn(out, nbd, ["01", "02", "03", "04"])
    b = _spawn(out, nbd, ["04", "03", "02", "01"])
    for p in (a, b):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    state = json.loads((out / "index.json").read_text())
    assert sorted(state) == ["01_r1", "02_r2", "03_r3", "04_r4"]
    assert all(s["status"] == "ok" and s["headline"] == {"doubled": "2"} for s in state.values())
    for i in range(1, 5):
        page = (out / f"0{i}_r{i}.html").read_text()
        assert page.rstrip().endswith("</html>") and 'src="data:image/webp;base64,' in page
        nbformat.validate(nbformat.read(str(out / f"0{i}_r{i}.ipynb"), as_version=4))
    assert [p.name for p in out.iterdir() if ".tmp" in p.name] == []


def test_sigint_stops_cleanly_and_leaves_nothing_partial(tmp_path):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _good(nbd / "01_first.ipynb")
    assert pipeline.run([], [], [], out_dir=out, notebooks_dir=nbd) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.suffix != ".lock"}
    _nb(nbd / "02_slow.ipynb", [nbformat.v4.new_markdown_cell("# Slow"),
                                nbformat.v4.new_code_cell("print('STA' + 'RTED', flush=True)"),
                                nbformat.v4.new_code_cell("import time\ntime.sleep(120)")])
    p = _spawn(out, nbd, ["02"], session=True)
    deadline = time.time() + 120
    # papermill saves the executed notebook after each cell: wait until the first cell's output is there (the
    # word is split in the source, so the notebook papermill writes before the kernel starts does not match)
    while time.time() < deadline and not any("STARTED" in q.read_text() for q in out.glob(".02_slow.*.tmp.ipynb")):
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole process group
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    after = {q.name: q.read_bytes() for q in out.iterdir() if q.is_file() and q.suffix != ".lock"}
    assert after == before  # nothing partial: no executed notebook, no page, the index as it was


def _tagged_processes(tag: str) -> list[int]:
    """Pids of the processes whose environment holds LK_TEST_TAG=tag (the kernels inherit it)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if f"LK_TEST_TAG={tag}".encode() in (d / "environ").read_bytes().split(b"\0"):
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/<pid>/environ")
@pytest.mark.parametrize("delay", [0.0, 0.15, 0.4])
def test_sigint_while_the_kernel_starts_leaves_no_kernel_and_no_traceback(tmp_path, delay):
    """Ctrl-C between papermill writing its first notebook and the kernel binding its sockets: the kernel
    is killed before its socket folder goes (it used to start after, print a zmq traceback and live on)."""
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _nb(nbd / "02_slow.ipynb", [nbformat.v4.new_markdown_cell("# Slow"),
                                nbformat.v4.new_code_cell("import time\ntime.sleep(120)")])
    tag = uuid.uuid4().hex
    p = _spawn(out, nbd, ["02"], session=True, tag=tag)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob(".02_slow.*.tmp.ipynb")):
        time.sleep(0.01)
    time.sleep(delay)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err and "Warning" not in err, err
    assert _tagged_processes(tag) == []  # no kernel outlives the build
    assert not list(out.glob(".02_slow.*")) and not (out / "02_slow.html").exists()


def test_sync_check_refuses_out_of_sync_pairs(tmp_path, capsys):
    jupytext = pytest.importorskip("jupytext")
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _good(nbd / "01_good.ipynb")
    jupytext.write(nbformat.read(str(nbd / "01_good.ipynb"), as_version=4), nbd / "01_good.py", fmt="py:percent")
    assert pipeline.pair_differences(nbd / "01_good.ipynb") == []
    (nbd / "01_good.py").write_text((nbd / "01_good.py").read_text().replace("print('VALUE', value)", "print('EDITED')"))
    assert pipeline.pair_differences(nbd / "01_good.ipynb")
    assert pipeline.run([], [], [], out_dir=out, notebooks_dir=nbd) == 2
    assert "out of sync" in capsys.readouterr().err
    (nbd / "01_good.ipynb").unlink()
    with pytest.raises(pipeline.PipelineError, match="no paired .ipynb"):
        pipeline.discover(nbd)


def test_results_table_and_readme_markers(tmp_path):
    nbd = tmp_path / "nb"
    nbd.mkdir()
    _good(nbd / "01_good.ipynb", title="Round 1 — Good things")
    _bad(nbd / "02_bad.ipynb")
    state = {"01_good": {"status": "ok", "mode": "cpu", "headline": {"a": "1", "b": "x|y"}}}
    table = pipeline.results_table(state, nbd)
    assert table.splitlines()[2] == "| 1 Good things (cpu) | a: 1; b: x/y |"
    assert table.splitlines()[3] == "| 2 Bad round | not rendered |"
    readme = f"intro\n{pipeline.README_BEGIN}\nold\n{pipeline.README_END}\nrest\n"
    assert pipeline.replace_readme_table(readme, table) == f"intro\n{pipeline.README_BEGIN}\n{table}{pipeline.README_END}\nrest\n"
    with pytest.raises(pipeline.PipelineError):
        pipeline.replace_readme_table("no markers", table)


def _paper(path):
    """A page in the paper shape: title, the lead (filled at the end), a body figure that goes to the top, a
    headline computed last, and a second page (cells from the one tagged page:steps)."""
    steps = nbformat.v4.new_markdown_cell("# Round 1 — steps ledger: one section per step\n\n## First step\n\ntext")
    steps.metadata["tags"] = ["page:steps"]
    _nb(path, [
        nbformat.v4.new_markdown_cell("# Round 1 — A paper-shaped page"), _params("value = 1  # an int"),
        nbformat.v4.new_code_cell("from labkernels import report\nreport.setup()\nmode = report.resolve_mode('cpu')\n"
                                  "report.banner(mode)\nreport.lead()"),
        nbformat.v4.new_markdown_cell("## Method\n\nHow it was done."),
        nbformat.v4.new_code_cell("import pandas as pd\ndisplay(report.table(pd.DataFrame({'a': range(30)})))"),
        nbformat.v4.new_code_cell(FIGURE.replace("plt.show()", "report.lead_figure(fig, 'x against y (units), a test')")),
        nbformat.v4.new_code_cell("report.abstract('We doubled a number. It came out even. That is the result.')\n"
                                  "report.headline(doubled=value * 2)"),
        steps, nbformat.v4.new_code_cell("print('LEDGER', value)")])


def test_lead_at_the_top_filled_at_the_end_and_a_second_page(tmp_path):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _paper(nbd / "01_paper.ipynb")
    assert pipeline.run([], ["value=21"], [], out_dir=out, notebooks_dir=nbd) == 0
    main, ledger = (out / "01_paper.html").read_text(), (out / "01_paper_steps.html").read_text()
    chk = pipeline.lead_check(main)
    # nothing but the title and the banner before the lead; the lead holds the headline computed last, the figure
    # drawn in the body and a three-sentence abstract; the body says where its figure went
    assert chk == {"lead": True, "images_before": 0, "tables_before": 0, "text_before": chk["text_before"],
                   "headline": True, "headline_rows": 1, "figure": True, "abstract_sentences": 3, "pending": False}
    assert chk["text_before"] < 400
    body = main.split("<body", 1)[1]
    assert body.index("lk-lead") < body.index("Method") < body.index("lk-moved")
    assert body.count("data:image/webp") == 1 and ">42<" in body.split("lk-lead", 1)[1].split("</section>")[0]
    assert "LEDGER" not in main and "LEDGER 21" in ledger and "steps ledger" in ledger
    assert 'href="01_paper_steps.html"' in main and 'href="01_paper.html"' in ledger   # each links the other
    assert pipeline.lead_check(ledger) == {"lead": False}
    state = pipeline.load_state(out)["01_paper"]
    assert state["headline"] == {"doubled": "42"} and state["pages"] == ["01_paper_steps.html"]
    assert "01_paper_steps.html" in (out / "index.html").read_text()


def test_lead_refuses_a_long_abstract_and_a_figure_without_caption():
    from labkernels import report

    with pytest.raises(report.LeadError, match="1-3 sentences, this one 4"):
        report.abstract("One. Two. Three. Four.")
    assert len(report.sentences("The kernel runs 4.5x faster (e.g. at nt=512). It is exact. Done.")) == 3
    with pytest.raises(report.LeadError, match="caption"):
        report.lead_figure(object(), "")


def test_a_stand_in_render_goes_to_scratch_and_leaves_the_published_page(tmp_path):
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    _good(nbd / "01_good.ipynb")
    assert pipeline.run([], [], [], out_dir=out, notebooks_dir=nbd) == 0
    published = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".index.lock"}
    _good(nbd / "01_good.ipynb", extra="\nreport.banner('cpu', stand_in=True)")
    assert pipeline.run([], [], [], out_dir=out, notebooks_dir=nbd) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".index.lock"} == published
    scratch = out / "scratch"
    page = (scratch / "01_good.html").read_text()
    assert "STAND-IN" in page and pipeline.load_state(scratch)["01_good"]["stand_in"] is True


def test_index_shows_the_latest_gpu_suite_record_per_tier(tmp_path):
    """The index's GPU-suite table: per tier the latest recorded run (a newer red run shows over an older green
    one), 'never recorded' for a tier without a run, and a tampered record said on the page, not a crash."""
    from labkernels import records

    data, out = tmp_path / "data", tmp_path / "reports"
    out.mkdir()
    html = lambda: pipeline.write_index(out, {}, data_root=data).read_text()  # noqa: E731
    assert html().count("never recorded") == 2
    for tier, failed in (("fast", 0), ("fast", 2)):
        with records.recording("gpu_suite", {"tier": tier, "workers": 8}, root=data) as run:
            run.append("tests", [{"nodeid": "t::a", "outcome": "passed", "seconds": 1.0, "message": ""}])
            run.set_summary(tier=tier, tests=40 + failed, passed=40, failed=failed, error=0, skipped=0,
                            seconds=12.5 + failed, ok=failed == 0)
    rows = {r["tier"]: r for r in pipeline.gpu_suite_rows(data)}
    assert rows["full"]["run"] is None
    assert (rows["fast"]["failed"], rows["fast"]["ok"], rows["fast"]["seconds"]) == (2, False, 14.5)
    page = html()
    assert page.count("never recorded") == 1 and ">red<" in page and "14.5" in page and ">green<" not in page
    meta = next((data / records.folder("gpu_suite")).glob("*.json"))
    meta.write_text(meta.read_text().replace('"fast"', '"full"', 1))   # tampered after sealing
    assert "record unreadable" in html()


def test_full_tier_in_shards_is_green_only_when_every_part_of_one_commit_is(tmp_path):
    """gpu-check --shard I/N: the parts are disjoint and cover every GPU test file; the index's full-tier row adds up
    the parts of one commit and says 'incomplete' until every part is recorded, green once all are and are green."""
    from labkernels import gpu_checks, records

    files = sorted(str(f.relative_to(gpu_checks.REPO_ROOT)) for f in (gpu_checks.REPO_ROOT / "tests/gpu").glob("test_*.py"))
    parts = [gpu_checks.shard_files(files, (i, 3)) for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == files and all(parts)
    assert parts == [gpu_checks.shard_files(reversed(files), (i, 3)) for i in (1, 2, 3)]   # order of discovery irrelevant
    for bad in ("0/3", "4/3", "x", "1/0", "1-3"):
        with pytest.raises(gpu_checks.GpuCheckError):
            gpu_checks.parse_shard(bad)
    data, out = tmp_path / "data", tmp_path / "reports"
    out.mkdir()

    def record(shard, failed=0):
        with records.recording("gpu_suite", {"tier": "full", "workers": 8, "shard": shard}, root=data) as run:
            run.append("tests", [{"nodeid": "t::a", "outcome": "passed", "seconds": 1.0, "message": ""}])
            run.set_summary(tier="full", tests=10 + failed, passed=10, failed=failed, error=0, skipped=0,
                            seconds=20.0, ok=failed == 0)

    full = lambda: next(r for r in pipeline.gpu_suite_rows(data) if r["tier"] == "full")  # noqa: E731
    record("1/2")
    row = full()
    assert (row["ok"], row.get("partial"), row["shards"], row["tests"]) == (False, True, "1 of 2 parts", 10)
    assert "incomplete" in pipeline.write_index(out, {}, data_root=data).read_text()
    record("2/2", failed=1)
    row = full()
    assert (row["ok"], row.get("partial"), row["tests"], row["failed"], row["seconds"]) == (False, None, 21, 1, 40.0)
    record("2/2")                                  # the part re-run green replaces its red run
    row = full()
    assert (row["ok"], row["tests"], row["failed"], row["shards"]) == (True, 20, 0, "2 of 2 parts")
