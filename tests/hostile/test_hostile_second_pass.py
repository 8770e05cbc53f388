"""Findings of a held-out hostile-input harness (issue 46's bar, tried from outside the project), one regression test
each: the README's table is rewritten only from ok rounds that say something, inputs that are not regular files never
block a command, the record's folders take no pages or scratch files, and public functions refuse bad arguments with
the lab's own errors."""
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from hostile_util import REPO, assert_clean_error, finished_run, labkernels, tiny_gguf
from labkernels import (arch, dispatch, errors, layout, occupancy, pipeline, prefill_ref, prefill_runs, quants,
                        records, records_admin, reference, wgmma)
from labkernels.model import ModelError


# ---------------------------------------------------------------------------------------------- class 2: the README
def _stems():
    return [p.stem for p in pipeline.discover()]


def _readme_copy(tmp_path) -> Path:
    readme = tmp_path / "README.md"
    rows = "\n".join(f"| {int(s[:2])} x | headline {s} |" for s in _stems())
    readme.write_text(f"# lab\n{pipeline.README_BEGIN}\n| round | headline |\n|---|---|\n{rows}\n{pipeline.README_END}\n")
    return readme


@pytest.mark.parametrize("entry, message", [
    ({"status": "failed", "error": "boom"}, "would lose their headline"),
    ({"status": "ok", "headline": {}}, "would lose their headline"),
    ({"status": "ok", "headline": None}, "would lose their headline"),
    ({"status": "running", "error": None}, "status 'running' is not one of ok, failed"),
    ({"headline": {"x": "y"}}, "status None is not one of ok, failed"),
    ({"status": "ok", "headline": "fast"}, "headline 'fast' is str, expected an object"),
    ({"status": "ok", "headline": [1, 2]}, "expected an object of texts"),
    ({"status": "ok", "headline": {"a": "b"}, "mode": 5}, "mode 5 is not a word"),
    ({"status": "ok", "headline": {"a": "x\n| 99 fake | row |"}}, "line break"),
    ({"status": "ok", "headline": {"a": pipeline.README_END}}, "HTML comment marker"),
])
def test_results_table_write_refuses_an_index_whose_rounds_are_not_ok_headlines(tmp_path, entry, message):
    readme = _readme_copy(tmp_path)
    before = readme.read_bytes()
    idx = tmp_path / "index.json"
    idx.write_text(json.dumps({s: entry for s in _stems()}))
    r = labkernels("results-table", "--index", idx, "--write", readme)
    assert_clean_error(r, message)
    assert readme.read_bytes() == before


def test_results_table_write_takes_a_readme_with_exactly_one_table(tmp_path):
    readme = _readme_copy(tmp_path)
    text = readme.read_text()
    readme.write_text(text + text[text.index(pipeline.README_BEGIN):])
    idx = tmp_path / "index.json"
    idx.write_text(json.dumps({s: {"status": "ok", "headline": {"h": "v"}} for s in _stems()}))
    r = labkernels("results-table", "--index", idx, "--write", readme)
    assert_clean_error(r, "exactly one of each")
    r = labkernels("results-table", "--allow-fewer")
    assert_clean_error(r, "--allow-fewer only means something with --write")


@pytest.mark.parametrize("target", ["fifo", "/dev/zero", "/dev/full", "dir", "empty"])
def test_results_table_write_never_blocks_on_a_target_that_is_not_a_regular_file(tmp_path, target):
    idx = tmp_path / "index.json"
    idx.write_text(json.dumps({s: {"status": "ok", "headline": {"h": "v"}} for s in _stems()}))
    p = {"fifo": tmp_path / "fifo", "dir": tmp_path, "empty": tmp_path / "empty"}.get(target, target)
    if target == "fifo":
        os.mkfifo(p)
    if target == "empty":
        p.write_text("")
    r = labkernels("results-table", "--index", idx, "--write", p, timeout=30)
    assert_clean_error(r, "README")


@pytest.mark.parametrize("index", ["/proc/self/mem", "/proc/kmsg"])
def test_results_table_index_from_proc_is_refused_not_read(index):
    if not Path(index).exists():
        pytest.skip(f"no {index} here")
    assert_clean_error(labkernels("results-table", "--index", index, timeout=30), "is empty")


def test_run_refuses_an_output_folder_in_the_record_a_file_or_a_bad_timeout(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for args, msg in [(["--out", root / "02_occupancy_calculator"], "inside the data folder"),
                      (["--out", root], "inside the data folder"),
                      (["--out", REPO / "README.md"], "exists and is not a folder"),
                      (["--out", ""], "--out is empty"),
                      (["--timeout", "0", "--out", tmp_path / "r"], "--timeout 0"),
                      (["--timeout", "-5", "--out", tmp_path / "r"], "--timeout -5")]:
        r = labkernels("run", "02", "-p", "run_audit=false", *args, LABKERNELS_DATA_DIR=str(root))
        assert_clean_error(r, msg)
    assert list(root.iterdir()) == [] and not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------------------------- class 3: hangs
@pytest.mark.parametrize("plan", ["fifo", "/dev/zero", "/dev/urandom", "", "dir"])
def test_sweep_plan_that_is_not_a_regular_file_is_refused_at_once(tmp_path, plan):
    p = {"fifo": tmp_path / "plan.yaml", "dir": tmp_path}.get(plan, plan)
    if plan == "fifo":
        os.mkfifo(p)
    assert_clean_error(labkernels("sweep", p, timeout=30), "plan")


def test_a_fifo_as_lock_holder_record_does_not_block_the_waiting_build(tmp_path):
    os.mkfifo(tmp_path / pipeline.LOCK_HOLDER)
    assert "unknown process" in pipeline.lock_holder(tmp_path)


def test_audit_refuses_a_source_that_is_not_a_regular_file_and_a_bad_arch_or_device(tmp_path):
    from labkernels import audit

    k = tmp_path / "k"
    shutil.copytree(REPO / "labkernels" / "kernels", k)
    (k / "q6k_expb.cu").unlink()
    os.mkfifo(k / "q6k_expb.cu")
    with pytest.raises(audit.AuditError, match="not a regular file"):
        audit.audit(kernels_dir=k)
    for a in ("sm_0", "", "sm_90; rm -rf /"):
        with pytest.raises(audit.AuditError, match="a target is sm_NN"):
            audit.audit(archs=(a,))
    with pytest.raises(audit.AuditError, match="--device: unknown device 'nope'"):
        audit.audit(device="nope")


def test_paramfile_and_profile_table_that_are_not_regular_files(tmp_path):
    os.mkfifo(tmp_path / "p.yaml")
    with pytest.raises(pipeline.PipelineError, match="not a regular file"):
        pipeline.load_params([], [tmp_path / "p.yaml"])
    occupancy._load_raw.cache_clear()
    for p, msg in (("/dev/zero", "not a regular file"), (tmp_path / "p.yaml", "not a regular file"),
                   ("/nonexistent.json", "no such file"), (tmp_path, "is a directory")):
        with pytest.raises(occupancy.OccupancyError, match=msg):
            occupancy.load_profiles(p)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(occupancy.OccupancyError, match="not valid JSON"):
        occupancy.load_profiles(bad)


# ---------------------------------------------------------------------------------------------- class 4: records
def _copy_run(tmp_path):
    run = finished_run(tmp_path / "data", "prefill")
    return run, run.manifest_path


def test_a_manifest_byte_count_beyond_int64_or_a_running_status_is_a_record_error(tmp_path):
    run, mp = _copy_run(tmp_path)
    man = json.loads(mp.read_text())
    name = next(n for n in man["files"] if n.endswith(".csv"))
    good = json.dumps(man)
    man["files"][name]["bytes"] = 10 ** 20
    mp.write_text(json.dumps(man))
    with pytest.raises(records.RecordError, match="non-negative integer up to"):
        records.verify_run(run)
    man = json.loads(good)
    man["status"] = "running"
    mp.write_text(json.dumps(man))
    with pytest.raises(records.RecordError, match="status 'running'"):
        records.verify_run(run)


def test_check_data_names_a_temporary_file_left_in_a_round_folder(tmp_path):
    run, _ = _copy_run(tmp_path)
    (run.dir / f".{run.run_id}.json.abc.tmp").write_text("{")
    n, problems = records_admin.check_data(tmp_path / "data")
    assert any("left by a write that was interrupted" in p for p in problems), problems


def test_check_data_and_migrate_refuse_an_empty_root_and_an_unlistable_one(tmp_path):
    assert_clean_error(labkernels("check-data", "--root", ""), "--root is empty")
    assert_clean_error(labkernels("migrate-data", "--root", ""), "--root is empty")
    if os.geteuid() != 0 or Path("/proc/1").is_dir():
        r = labkernels("check-data", "--root", "/proc")
        assert "Traceback" not in r.stderr and "an unexpected error" not in r.stderr, r.stderr


def test_run_kind_and_rows_are_checked(tmp_path):
    for kind in ("../x", None, 5):
        with pytest.raises(records.RecordError, match="run kind"):
            records.new_run("prefill", {}, root=tmp_path, kind=kind)
    run = records.new_run("prefill", {}, root=tmp_path)
    for rows in ("abc", 5, None, [1, 2]):
        with pytest.raises(records.RecordError, match="rows"):
            run.append("t", rows)


# ---------------------------------------------------------------------------------------------- class 1: models
def test_a_block_count_beyond_the_model_s_layers_is_a_model_error(tmp_path):
    from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config

    cfg = tiny_config("llama", n_layer=1)
    m = SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=1)
    real = m.field

    def field(key, default=None):
        return 2 ** 32 - 1 if key == "llama.block_count" else real(key, default) if default is not None else real(key)
    m.field = field
    with pytest.raises(ModelError, match="missing tensor 'blk.4294967294.attn_norm.weight': llama.block_count = 4294967295"):
        arch.config_from_model(m)


def test_the_float64_reference_refuses_a_nonfinite_scale_and_bad_activations(rng):
    w = np.array(quants.quantize(rng.standard_normal((4, 256)).astype(np.float32), "q6_K_224"))
    w.reshape(-1, 224)[2, 208:210] = np.array([0x7C00], "<u2").view(np.uint8)
    with pytest.raises(reference.ShapeError, match="non-finite scale"):
        reference.gemm_f64_ref(w, "q6_K", rng.standard_normal((2, 256)), stride=224)
    w = quants.quantize(rng.standard_normal((4, 256)).astype(np.float32), "q4_K")
    for x in (np.ones((2, 512)), np.ones(256), np.ones((2, 256), np.complex64)):
        with pytest.raises(reference.ShapeError):
            reference.gemm_f64_ref(w, "q4_K", x)
    with pytest.raises(reference.ShapeError, match="real numbers"):
        reference.quantize_activations(np.ones((2, 256), np.complex64))
    with pytest.raises(reference.ShapeError, match="block stride"):
        reference.weight_codes(w, "q4_K", stride=7)
    for bad in ((-1, 4096, 4096), (1.5, 4096, 4096)):
        with pytest.raises(reference.ShapeError, match="macs"):
            reference.macs(*bad)


@pytest.mark.parametrize("x", [np.ones((2, 256), np.complex64), np.ones((2, 2, 256)), np.array([["a"] * 256]), None,
                               np.ones(256, object), np.ones((2, 256), bool), np.array([[1e39] * 256])])
def test_quantize_refuses_with_the_lab_s_error(x):
    with pytest.raises(quants.QuantFormatError):
        quants.quantize(x, "q4_K")


# ---------------------------------------------------------------------------------------------- class 6: library
def test_choose_checks_cc_and_table():
    assert dispatch.choose("q4_K", 512, 4096, 4096, cc=0).family        # 0: no GPU, said so
    for kw, msg in [({"cc": "90"}, "compute capability"), ({"cc": -90}, "compute capability"),
                    ({"cc": True}, "compute capability"), ({"table": [1]}, "DataFrame"),
                    ({"table": {"x": 1}}, "DataFrame")]:
        with pytest.raises(errors.ShapeError, match=msg):
            dispatch.choose("q4_K", 512, 4096, 4096, **kw)


@pytest.mark.parametrize("sk", [-1, 99, "1"])
def test_schedule_refuses_an_unknown_sk_with_the_lab_s_error(sk):
    with pytest.raises(errors.ShapeError, match="SK is 0"):
        wgmma.schedule(sk, 512, 4096, 4096, 128, 132)
    with pytest.raises(errors.ShapeError, match="32-bit"):
        wgmma.schedule(0, 2 ** 62, 4096, 4096, 128, 132)


def test_reference_forward_and_greedy_check_their_arguments():
    from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config

    cfg = tiny_config("llama", n_layer=1)
    m = SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=1)
    for kw in ({"dtype": "int8"}, {"dtype": np.complex128}):
        with pytest.raises(prefill_ref.RefArgumentError, match="dtype must be float64 or float32"):
            prefill_ref.forward_ref(m, [1], **kw)
    with pytest.raises(prefill_ref.RefArgumentError, match="takes a model"):
        prefill_ref.forward_ref(None, [1])
    for n in (-1, 1.5, True):
        with pytest.raises(arch.TokenError, match="n_new"):
            prefill_ref.greedy_ref(m, [1, 2], n_new=n)
    with pytest.raises(arch.TokenError, match="stop ids"):
        prefill_ref.greedy_ref(m, [1], n_new=2, stop_ids=["x"])
    with pytest.raises(arch.TokenError, match="prompt ids"):
        prefill_ref.greedy_ref(m, [], n_new=2)
    with pytest.raises(arch.TokenError, match="vocabulary size"):
        arch.check_token_ids([1], vocab=1.5)


@pytest.mark.parametrize("kw, msg", [({"n": 4, "seed": -1}, "seed"), ({"n": 4, "seed": "x"}, "seed"),
                                     ({"n": 10 ** 12}, "more than a prompt"),
                                     ({"n": 3, "prompt_ids": [1, 2]}, "2 prompt ids for a prompt of 3")])
def test_prompt_tokens_checks_seed_length_and_ids(kw, msg):
    from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config

    cfg = tiny_config("llama", n_layer=1)
    m = SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=1)
    with pytest.raises(arch.TokenError, match=msg):
        prefill_runs.prompt_tokens(m, **kw)


@pytest.mark.parametrize("call", [lambda: layout.expand_q6_elem(bytes(210), 256), lambda: layout.expand_q6_elem(bytes(210), -1),
                                  lambda: layout.expand_q6_elem(bytes(210), 1.5), lambda: layout.expand_q6_elem(bytes(100), 3),
                                  lambda: layout.expand_q6_elem(None, 3), lambda: layout.f16_column(np.zeros(2, np.uint8)),
                                  lambda: layout.f16_column(np.zeros((2, 3), np.uint8))])
def test_layout_scalars_refuse_bad_blocks_and_elements(call):
    with pytest.raises(layout.LayoutError):
        call()


# ---------------------------------------------------------------------------------------------- class 8: the CLI
def test_cli_arguments_found_by_the_held_out_harness(tmp_path):
    g = tiny_gguf(tmp_path / "tiny.gguf")
    cases = [
        (["layout", "--model", g, "--per-tensor"], "--per-tensor goes with --json"),
        (["fetch-model", "--dest", ""], "--dest is empty"),
        (["fetch-model", "--dest", tmp_path], "is a folder"),
        (["gpu-check", "--steps", "env", "--out", g], "exists and is not a folder"),
        (["peers", "mmq", "--print-test-file", "--nts", ""], "--nts is empty"),
        (["peers", "mmq", "--print-test-file", "--shapes", ""], "--shapes is empty"),
        (["sweep", "labkernels/plans/cpu_faults_demo.yaml", "--cluster", "tcp://256.0.0.1:99999"], "port 1..65535"),
        (["sweep", "labkernels/plans/cpu_faults_demo.yaml", "--data", g], "exists and is not a folder"),
        (["sweep", "labkernels/plans/cpu_faults_demo.yaml", "--workdir", tmp_path / "data" / "w"], "inside the data folder"),
    ]
    for argv, msg in cases:
        r = labkernels(*argv, timeout=60, LABKERNELS_DATA_DIR=str(tmp_path / "data"))
        assert_clean_error(r, msg)
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------------------------------------- class 9: faults
def test_ctrl_c_while_the_cli_starts_exits_130_without_a_traceback():
    """A Ctrl-C in the first second (the subcommands' modules importing, before any command runs) is an interrupt:
    exit 130 and one line, like one during the command."""
    import signal
    import subprocess
    import sys
    import time

    from hostile_util import env

    for delay in (0.5, 1.0):
        p = subprocess.Popen([sys.executable, "-m", "labkernels", "check-data"], cwd=REPO, env=env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode in (130, 0), (p.returncode, err)     # 0: it finished first
        assert "Traceback" not in err, err
