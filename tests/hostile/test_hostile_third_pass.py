"""Findings of the held-out harness's third pass (issue 46), one regression test each: a data folder is never imported
into itself; the wgmma host model, variant names, repack and build names refuse bad arguments with the lab's own
errors (and say what is allowed); Ctrl-C on a sweep or on lab.py's set-up, and a signal whose KeyboardInterrupt some
library swallowed, end as an interrupt -- one line, exit 130 / 143, no traceback, never exit 0."""
import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hostile_util import REPO, assert_clean_error, env, finished_run, labkernels
from labkernels import records, records_admin, wgmma
from labkernels.gpu import ShapeError
from labkernels.rounds.r07_wgmma import builds


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------- class 2: import-runs
def test_import_runs_refuses_the_data_folder_itself_and_folders_around_it(tmp_path):
    root = tmp_path / "data"
    finished_run(root)
    before = _tree(root)
    for src, how in ((root, "is the data folder"), (tmp_path, "holds the data folder"),
                     (root / "r05_wall", "is inside the data folder")):
        src.mkdir(exist_ok=True)
        with pytest.raises(records.RecordError, match=how):
            records_admin.import_runs(src, root)
    r = labkernels("import-runs", root, LABKERNELS_DATA_DIR=str(root))     # the harness's case: exit 0 "imported 0"
    assert_clean_error(r, "is the data folder", "OUT/data")
    assert "imported" not in r.stdout
    assert _tree(root) == before


def test_import_runs_still_imports_from_a_folder_beside_the_data_folder(tmp_path):
    src, root = tmp_path / "gpu" / "data", tmp_path / "data"
    run = finished_run(src)
    copied = records_admin.import_runs(src, root)
    assert f"{run.dir.name}/{run.run_id}.json" in copied and (root / run.dir.name / f"{run.run_id}.json").exists()


# ---------------------------------------------------------------------------------------------- class 6: wgmma
REFUSED = [
    (lambda: wgmma.tile_count(0, 4096, 128), ShapeError, "tile_count: nt must be >= 1, got 0"),
    (lambda: wgmma.tile_count(64, 4096, 0), ShapeError, "tile_count: BN must be >= 1, got 0"),
    (lambda: wgmma.tile_count(64.0, 4096, 128), ShapeError, "nt must be an integer"),
    (lambda: wgmma.split_g(1, 512, 4096, 4096, 128, 0), ShapeError, "split_g: sm_count must be >= 1, got 0"),
    (lambda: wgmma.split_g(7, 512, 4096, 4096, 128, 132), ShapeError, "SK is 0 (data-parallel)"),
    (lambda: wgmma.sk_fits(1, 512, 4096, 4096, 128, 0), ShapeError, "sk_fits: sm_count must be >= 1"),
    (lambda: wgmma.sk_fits(2, 512, 4096, 4095, 128, 132), ShapeError, "not a multiple of 256"),
    (lambda: wgmma.uniform_split(0, 16, 132), ShapeError, "uniform_split: tiles must be >= 1, got 0"),
    (lambda: wgmma.tile_split(4, 0, 132), ShapeError, "tile_split: nsb must be >= 1, got 0"),
    (lambda: builds.kpair_grid(0, 4096), ShapeError, "kpair_grid: nt must be >= 1, got 0"),
    (lambda: builds.kpair_grid(512, -64), ShapeError, "kpair_grid: od must be >= 1"),
    (lambda: wgmma.default_params("q9_K", 64), wgmma.VariantError, "takes q4_K or q6_K weights, not 'q9_K'"),
    (lambda: wgmma.default_params("q4_K", 0), ShapeError, "default_params: nt must be >= 1, got 0"),
    (lambda: wgmma.main_scl("q4_K", 0), wgmma.VariantError, "BN is one of 128, 256"),
    (lambda: wgmma.main_scl(None, 128), wgmma.VariantError, "not None"),
    (lambda: wgmma.variant_name(BN=0, STAGES=4, SCL=0), wgmma.VariantError, "BN is 128 or 256, not 0"),
    (lambda: wgmma.variant_name(128, 0, 0), wgmma.VariantError, "STAGES must be >= 1"),
    (lambda: wgmma.variant_name(128, 4, 7), wgmma.VariantError, "SCL is 0, 1 or 2, not 7"),
    (lambda: wgmma.variant_name(128, 4, 0, SK=5), wgmma.VariantError, "SK is 0, 1, 2 or 3, not 5"),
    (lambda: wgmma.variant_params("nope", "q4_K"), wgmma.VariantError, "not a round-7 variant name: 'nope' (wgmma_bn"),
    (lambda: wgmma.variant_params("", "q4_K"), wgmma.VariantError, "not a round-7 variant name: ''"),
    (lambda: wgmma.variant_params(None, "q4_K"), wgmma.VariantError, "a variant name is a str"),
    (lambda: wgmma.Variant.parse("wgmma_bn64_s4_scl0"), wgmma.VariantError, "BN is 128 or 256, not 64"),
    (lambda: builds.check_defines(["FORM=1; rm -rf /"]), builds.BuildError, "must be LK_ABLATE_* or LK_EXP_* names"),
    (lambda: builds.check_defines("BN=128"), builds.BuildError, "a tuple or list of -D names"),
    (lambda: builds.check_defines("LK_EXP_TRACE"), builds.BuildError, "not str 'LK_EXP_TRACE'"),
    (lambda: builds.check_defines((3,)), builds.BuildError, "got [3]"),
    (lambda: builds.check_defines(("LK_EXP_NOPE",)), builds.BuildError, "no build ['LK_EXP_NOPE']"),
    (lambda: wgmma.unrepack(np.zeros(10, np.uint8), "q4_K", 4, 256), wgmma.RepackError,
     "4 x 1 blocks of 144 bytes = 576 repacked bytes, got 10"),
    (lambda: wgmma.unrepack(np.zeros(576, np.float32), "q4_K", 4, 256), wgmma.RepackError, "uint8 numpy array"),
    (lambda: wgmma.unrepack(np.zeros(576, np.uint8), "q4_K", 0, 256), wgmma.RepackError, "od must be an integer >= 1"),
    (lambda: wgmma.unrepack(np.zeros(576, np.uint8), "q8_0", 4, 256), wgmma.RepackError, "q4_K or q6_K, not 'q8_0'"),
    (lambda: wgmma.emulate_weights(np.zeros(10, np.uint8), "q6_K", 4, 256), wgmma.RepackError, "four planes"),
    (lambda: wgmma.emulate_weights(np.zeros(576, np.uint8), "q4_K", 4, 300), wgmma.RepackError,
     "not a multiple of 256"),
]


@pytest.mark.parametrize("call, error, message", REFUSED, ids=range(len(REFUSED)))
def test_wgmma_host_model_refuses_bad_arguments_with_the_lab_s_error(call, error, message):
    with pytest.raises(error) as e:
        call()
    assert message in str(e.value)
    assert type(e.value).__module__.startswith("labkernels.")     # the lab's own class, never a bare ValueError


def test_the_checks_keep_every_valid_answer():
    assert wgmma.tile_count(64, 4096, 128) == 32 and wgmma.tile_count(1, 1, 256) == 1
    assert wgmma.uniform_split(4, 16, 132) == 16 and wgmma.uniform_split(200, 16, 132) == 0   # no wave fits: 0
    assert wgmma.tile_split(128, 43, 264) == 2 and wgmma.split_g(0, 512, 4096, 4096, 128, 132) == 0
    assert wgmma.sk_fits(1, 512, 4096, 4096, 128, 132) and not wgmma.sk_fits(2, 512, 4096, 4096, 128, 132)
    assert wgmma.default_params("q6_K", 64) == {"BN": 128, "STAGES": 4, "BF16": 0, "SCL": 1, "SK": 1}
    assert wgmma.main_scl("q6_K", 256) == 0
    assert wgmma.variant_params("wgmma_smem_bn256_s3", "q4_K") == ("wgmma_kq", {"BN": 256, "STAGES": 3, "BF16": 0,
                                                                                "SK": 0, "FORM": 1})
    assert builds.check_defines(["LK_EXP_TRACE", "LK_EXP_KPAIR"]) == ("LK_EXP_KPAIR", "LK_EXP_TRACE")
    assert builds.kpair_grid(512, 4096) == 128


def test_names_that_left_wgmma_say_where_they_live_now():
    """The harness (and any old caller) still asks labkernels.wgmma for round 7's build helpers: a lab error naming
    the module they moved to, not a bare AttributeError (the product never imports the round's code)."""
    for name in ("check_defines", "kpair_grid"):
        with pytest.raises(wgmma.MovedError, match=rf"labkernels\.rounds\.r07_wgmma\.builds\.{name} now"):
            getattr(wgmma, name)
        assert getattr(builds, name)
    assert not hasattr(wgmma, "no_such_name")


def test_repack_takes_any_row_count_the_kernel_takes():
    """(3, 144) -- three q4_K rows of one super-block -- is a valid weight, not a short one: the kernel clamps tail rows
    (a 128-row tile past od computes and stores nothing there; the GPU tests run od = 77, 130, 200), so the repack takes
    it and round-trips it byte for byte. The held-out harness expected a refusal (c6-repack-03): its expectation is
    wrong. What repack cannot take -- a partial block, another dtype or type -- it refuses."""
    raw = np.random.default_rng(3).integers(0, 256, (3, 144), dtype=np.uint8)
    p = wgmma.repack(raw, "q4_K")
    assert p.shape == (3, 144) and not np.array_equal(p, raw)
    assert np.array_equal(wgmma.unrepack(p, "q4_K", 3, 256), raw)
    for bad, msg in ((np.zeros((3, 143), np.uint8), r"uint8 \[od, nsb\*144\]"),
                     (np.zeros((3, 144), np.float32), r"uint8 \[od, nsb\*144\]"),
                     (np.zeros(144, np.uint8), r"uint8 \[od, nsb\*144\]")):
        with pytest.raises(wgmma.RepackError, match=msg):
            wgmma.repack(bad, "q4_K")


# ---------------------------------------------------------------------------------------------- class 9: faults
def test_ctrl_c_on_a_local_sweep_exits_130_without_a_worker_traceback(tmp_path):
    """The Dask sweep's worker processes shared the terminal's process group: Ctrl-C stopped each in its asyncio loop
    (or while it imported) and each printed a KeyboardInterrupt traceback. Now the client alone stops (130, one line)
    and ends them, and the shutdown's own log lines stay quiet."""
    p = subprocess.Popen([sys.executable, "-m", "labkernels", "sweep", "labkernels/plans/cpu_faults_demo.yaml",
                          "--no-progress", "--workdir", str(tmp_path / "wd")], cwd=REPO, env=env(), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 60
    line = ""
    while time.time() < deadline and "dashboard" not in line:     # the cluster is up: its workers run tasks
        line = p.stdout.readline()
    time.sleep(1.0)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=90)
    assert p.returncode == 130, (p.returncode, err[-3000:])
    assert "Traceback (most recent call last)" not in err, err[-6000:]
    assert err.strip().splitlines()[-1] == "interrupted", err[-2000:]


def test_local_sweep_workers_start_with_ctrl_c_blocked():
    """The mechanism, directly: every worker of a local cluster has SIGINT blocked (inherited from the thread that
    spawned it), so a terminal's Ctrl-C reaches the client only."""
    from labkernels import sweep

    client, cl, _ = sweep.open_client("local:2")
    try:
        masks = client.run(lambda: sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    finally:
        client.close()
        cl.close()
    assert len(masks) == 2 and all(int(signal.SIGINT) in m for m in masks.values()), masks
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])    # the caller's mask is restored


def _lab_driver(tmp_path, body: str) -> Path:
    driver = tmp_path / "drive.py"
    driver.write_text("import importlib.util, pathlib, sys\n"
                      f"spec = importlib.util.spec_from_file_location('lab', {str(REPO / 'lab.py')!r})\n"
                      "lab = importlib.util.module_from_spec(spec); spec.loader.exec_module(lab)\n"
                      + textwrap.dedent(body) + "sys.exit(lab.entry(sys.argv[1:]))\n")
    return driver


def test_ctrl_c_during_lab_py_setup_hides_the_interrupted_step_s_traceback(tmp_path):
    """pip stopped by Ctrl-C while it imports prints a KeyboardInterrupt traceback of its own (found 6 s into
    `python3 lab.py reports 02` on a fresh clone): a set-up step's stderr is not shown when it was interrupted."""
    step = tmp_path / "step.py"
    step.write_text("import time\nprint('STEP STARTED', flush=True)\ntime.sleep(60)\n")   # Ctrl-C: a traceback
    driver = _lab_driver(tmp_path, f"lab.ensure_env = lambda *a, **k: lab.sh(sys.executable, {str(step)!r})\n")
    p = subprocess.Popen([sys.executable, str(driver), "reports", "02"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env(), cwd=str(tmp_path), start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and "STEP STARTED" not in p.stdout.readline():
        pass
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "interrupted", err


def test_lab_py_setup_step_that_fails_still_shows_its_error(tmp_path):
    step = tmp_path / "step.py"
    step.write_text("import sys\nsys.stderr.write('no such index: pypi-nope\\n')\nsys.exit(3)\n")
    driver = _lab_driver(tmp_path, f"lab.ensure_env = lambda *a, **k: lab.sh(sys.executable, {str(step)!r})\n")
    r = subprocess.run([sys.executable, str(driver), "reports", "02"], capture_output=True, text=True, env=env(),
                       cwd=str(tmp_path), timeout=60)
    assert r.returncode == 3
    assert "no such index: pypi-nope" in r.stderr and "failed with exit code 3" in r.stderr
    assert "Traceback" not in r.stderr


def test_lab_py_recreates_a_virtual_environment_left_without_pip(tmp_path, monkeypatch):
    """A Ctrl-C while the venv's pip was being installed (ensurepip) left .venv/bin/python without pip: every later
    `lab.py` then failed at `python -m pip`. It is re-created."""
    import venv

    spec = importlib.util.spec_from_file_location("lab_under_test", REPO / "lab.py")
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    venv.EnvBuilder(with_pip=False).create(tmp_path / ".venv")        # the interrupted creation: no pip
    made, steps = [], []

    class Builder:
        def __init__(self, **kw):
            made.append(kw)

        def create(self, path):
            pass

    monkeypatch.setattr(lab, "ROOT", tmp_path)
    monkeypatch.setattr(lab, "VENV", tmp_path / ".venv")
    monkeypatch.setattr(lab, "PY", tmp_path / ".venv" / "bin" / "python")
    monkeypatch.setattr(lab.venv, "EnvBuilder", Builder)
    monkeypatch.setattr(lab, "sh", lambda *cmd, **kw: steps.append(cmd))
    monkeypatch.setattr(lab, "install_git_filter", lambda *a, **k: False)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    lab.ensure_env("dev")
    assert made == [{"with_pip": True, "clear": True}]
    assert steps and steps[0][1:4] == ("-m", "pip", "install")


def test_a_signal_whose_keyboardinterrupt_a_library_swallowed_still_stops_the_build(tmp_path):
    """SIGTERM in the last moments of `labkernels report run 02` once exited 0 (held-out harness, second pass): its
    KeyboardInterrupt was lost on the way. Simulated here -- a SIGTERM inside code that swallows every exception --
    the build still ends 143 and says so; without the signal the same build exits 0."""
    nbd, out = tmp_path / "nb", tmp_path / "out"
    nbd.mkdir()
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# tiny"), nbformat.v4.new_code_cell("1 + 1")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(nbd / "01_tiny.ipynb"))
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from pathlib import Path
        from labkernels import pipeline
        orig = pipeline.update_state
        def update_state(*a, **k):
            if {{send}}:
                try:                      # a library that swallows everything, KeyboardInterrupt included
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.5)
                except BaseException:
                    pass
            return orig(*a, **k)
        pipeline.update_state = update_state
        sys.exit(pipeline.run(["01"], [], [], out_dir=Path({str(out)!r}), notebooks_dir=Path({str(nbd)!r})))
    """)
    for send, want in ((False, 0), (True, 143)):
        r = subprocess.run([sys.executable, "-c", code.replace("{send}", str(send))], capture_output=True, text=True,
                           env=env(), cwd=str(REPO), timeout=180)
        assert r.returncode == want, (send, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
        if send:
            assert "terminated (SIGTERM) as the build finished" in r.stderr, r.stderr
        assert [p.name for p in out.iterdir() if p.name.startswith(".") and p.name != ".index.lock"] == []
