"""Classes 3, 4, 7 and the seal of class 9 in the records layer: every field of run metadata and manifests is
type-checked (RecordError, never TypeError / AttributeError / RecursionError); only regular files are opened (a
FIFO or a /dev/zero symlink in place of a table is refused at once), none is read past its recorded size; replay
refuses a series whose newest run has not finished; series are known names, never paths; check-data --seal does
not re-attest a tampered file unless forced, and then records who and why."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_util import REPO, assert_clean_error, deadline, finished_run, labkernels
from labkernels import records, records_admin, rounds

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=8)


def _rewrite(path, obj):
    path.write_text(json.dumps(obj))


def _all_readers(run, root):
    """Every way the lab reads a run back; each must end in RecordError (or accept the run)."""
    with deadline(20, "reading a hostile record"):
        for fn in (lambda: records.validate_run(run.meta_path), lambda: records.list_runs(run.round, root, status=None),
                   lambda: records.latest(run.round, root), lambda: records.replay_run(run.round, root)):
            try:
                fn()
            except records.RecordError:
                pass
        n, problems = records_admin.check_data(root)      # never raises: names each bad file
        assert n >= 1


# ------------------------------------------------------------------------------------------- malformed records
@SETTINGS
@given(field=st.sampled_from(["run_id", "round", "status", "kind", "provenance", "params", "tables", "summary"]),
       value=JSON)
def test_any_value_in_any_metadata_field_is_a_record_error_or_accepted(tmp_path_factory, field, value):
    root = tmp_path_factory.mktemp("data")
    run = finished_run(root)
    meta = json.loads(run.meta_path.read_text())
    meta[field] = value
    _rewrite(run.meta_path, meta)
    _all_readers(run, root)


@SETTINGS
@given(where=st.sampled_from(["files", "entry", "sha256", "bytes", "rows", "run_id", "whole"]), value=JSON)
def test_any_value_in_any_manifest_field_is_a_record_error(tmp_path_factory, where, value):
    root = tmp_path_factory.mktemp("data")
    run = finished_run(root)
    man = json.loads(run.manifest_path.read_text())
    csv = f"{run.run_id}.t.csv"
    if where == "whole":
        man = value
    elif where in ("files", "run_id"):
        man[where] = value
    elif where == "entry":
        man["files"][csv] = value
    else:
        man["files"][csv][where] = value
    _rewrite(run.manifest_path, man)
    with deadline(20, "verifying a hostile manifest"):
        try:
            records.verify_run(run)
        except records.RecordError:
            pass
        else:   # the only accepted edits leave the manifest as it was
            assert json.loads(run.manifest_path.read_text())["files"][csv]["rows"] == 3


@pytest.mark.parametrize("edit, message", [
    (lambda m, man: man.update(files=None), r"field 'files' is null"),
    (lambda m, man: man["files"].update({next(iter(man["files"])): 7}), r"is int, expected an object"),
    (lambda m, man: m.update(tables=[1]), r"field 'tables' holds 1, not a table name"),
    (lambda m, man: m.update(tables=None), r"field 'tables' is null"),
    (lambda m, man: m.update(status="done"), r"status 'done' is not one of running, complete, failed"),
    (lambda m, man: m.update(params=[1, 2]), r"field 'params' is list"),
])
def test_the_issues_malformed_records_are_record_errors(tmp_path, edit, message):
    run = finished_run(tmp_path)
    meta, man = json.loads(run.meta_path.read_text()), json.loads(run.manifest_path.read_text())
    edit(meta, man)
    _rewrite(run.meta_path, meta)
    _rewrite(run.manifest_path, man)
    with pytest.raises(records.RecordError, match=message):
        records.validate_run(run.meta_path)
    n, problems = records_admin.check_data(tmp_path)
    assert n == 1 and len(problems) == 1 and re.search(message, problems[0]), problems


@pytest.mark.parametrize("which", ["meta", "manifest"])
def test_deeply_nested_json_is_a_record_error(tmp_path, which):
    run = finished_run(tmp_path)
    p = run.meta_path if which == "meta" else run.manifest_path
    p.write_text("[" * 200000 + "]" * 200000)
    with pytest.raises(records.RecordError, match="nested too deeply|corrupt"):
        records.validate_run(run.meta_path)


# ------------------------------------------------------------------------------------ FIFOs, devices, sizes
def _swap(run, make):
    p = run.dir / f"{run.run_id}.t.csv"
    p.unlink()
    make(p)
    return p


@pytest.mark.parametrize("kind", ["fifo", "devzero", "dir"])
def test_a_table_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    run = finished_run(tmp_path)
    make = {"fifo": os.mkfifo, "devzero": lambda p: p.symlink_to("/dev/zero"), "dir": os.mkdir}[kind]
    p = _swap(run, make)
    want = {"fifo": "is a FIFO", "devzero": "is a character device (through a symlink)", "dir": "is a directory"}[kind]
    with deadline(10, f"reading a {kind} in place of a table"):
        with pytest.raises(records.RecordError, match=re.escape(want)):
            records.validate_run(run.meta_path)
        with pytest.raises(records.RecordError, match=re.escape(want)):
            records.replay_run("prefill", tmp_path)
        n, problems = records_admin.check_data(tmp_path)
    assert n == 1 and any(str(p) in q and want in q for q in problems), problems
    r = labkernels("check-data", "--root", tmp_path, timeout=60)
    assert r.returncode == 1 and want in r.stderr and "Traceback" not in r.stderr


def test_a_file_larger_than_its_manifest_is_not_read(tmp_path):
    run = finished_run(tmp_path)
    p = run.dir / f"{run.run_id}.t.csv"
    with open(p, "r+b") as f:
        f.truncate(64 << 30)          # 64 GiB, sparse: reading it would take minutes
    with deadline(10, "verifying a huge file"):
        with pytest.raises(records.RecordError, match=r"68719476736 bytes, the manifest says \d+: the recorded file grew"):
            records.validate_run(run.meta_path)


# -------------------------------------------------------------------------------------------------- replay
def test_replay_refuses_a_series_whose_newest_run_is_still_running(tmp_path):
    done = finished_run(tmp_path)
    running = records.new_run("prefill", {"x": 2}, root=tmp_path)
    assert records.latest("prefill", tmp_path).run_id == done.run_id     # other readers still see the complete run
    with pytest.raises(records.RecordError) as e:
        records.replay_run("prefill", tmp_path)
    assert running.run_id in str(e.value) and done.run_id in str(e.value) and "'running'" in str(e.value)
    running.finish()
    assert records.replay_run("prefill", tmp_path).run_id == running.run_id


def test_a_running_run_that_the_replay_filter_cannot_read_still_blocks_replay(tmp_path):
    done = finished_run(tmp_path)
    running = records.new_run("prefill", {"x": 2}, root=tmp_path)      # no table yet: the filter cannot read it
    with pytest.raises(records.RecordError, match=rf"newest run {running.run_id}"):
        records.replay_run("prefill", tmp_path, where=lambda r: len(r.table("t")) > 0)
    assert records.latest("prefill", tmp_path, where=lambda r: len(r.table("t")) > 0).run_id == done.run_id


def test_a_round_page_refuses_to_replay_past_a_running_run(tmp_path, monkeypatch):
    """Round 3's page in replay, with a newer q6k run that never finished: refused before anything renders."""
    src = REPO / "data" / "03_q6k_expanded_b"
    shutil.copytree(src, tmp_path / src.name)
    monkeypatch.setenv("LABKERNELS_DATA_DIR", str(tmp_path))
    latest = records.latest("q6k")
    assert latest is not None
    running = records.new_run("q6k", {"shapes": [[4096, 4096]]})
    with pytest.raises(records.RecordError, match=rf"{running.run_id}.*{latest.run_id}"):
        rounds.open_round("03", "replay")


@pytest.mark.parametrize("moved_to, message", [("tile_ab", "content differs from the manifest"),
                                               ("wgmma", "lies in folder '03_q6k_expanded_b'"),
                                               ("../x", "unknown run series '../x'")])
def test_a_run_whose_round_field_moved_is_not_silently_skipped(tmp_path, moved_to, message):
    old = finished_run(tmp_path, "q6k")
    new = finished_run(tmp_path, "q6k")
    meta = json.loads(new.meta_path.read_text())
    meta["round"] = moved_to
    _rewrite(new.meta_path, meta)
    for fn in (records.latest, records.replay_run):
        with pytest.raises(records.RecordError, match=message):
            fn("q6k", tmp_path)
    assert old.run_id < new.run_id


# ------------------------------------------------------------------------------------------ series names
@pytest.mark.parametrize("name", ["../escape", "/tmp/abs", "q6k/../../x", "", ".", "..", "nope"])
def test_series_names_are_known_names_never_paths(tmp_path, name):
    root = tmp_path / "data"
    root.mkdir()
    with pytest.raises(records.RecordError, match="unknown run series"):
        records.new_run(name, {}, root=root)
    with pytest.raises(records.RecordError, match="unknown run series"):
        records.list_runs(name, root)
    assert list(tmp_path.rglob("*.json")) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["data"]


@settings(max_examples=60, deadline=None)
@given(name=st.text(max_size=12))
def test_a_series_is_accepted_only_when_known(name):
    known = name in records.known_series()
    try:
        records.check_series(name)
        assert known
    except records.RecordError:
        assert not known


# --------------------------------------------------------------------------------------------------- seal
def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=Lab Tester", "-c", "user.email=t@lab", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture
def committed(tmp_path):
    """A git checkout holding data/ with one run committed with its manifest and one committed before manifests."""
    repo = tmp_path / "repo"
    root = repo / "data"
    root.mkdir(parents=True)
    _git(repo, "init", "-q")
    sealed = finished_run(root)
    legacy = finished_run(root)
    legacy.manifest_path.unlink()        # recorded before manifests existed
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "runs")
    return repo, root, sealed, legacy


def test_seal_writes_the_manifest_of_a_run_recorded_before_manifests(committed):
    repo, root, sealed, legacy = committed
    assert records_admin.seal_runs(root) == [legacy.manifest_path]
    assert records_admin.check_data(root) == (2, [])


def test_seal_refuses_to_reattest_a_tampered_file_and_force_records_who_and_why(committed):
    repo, root, sealed, legacy = committed
    csv = sealed.dir / f"{sealed.run_id}.t.csv"
    csv.write_text(csv.read_text().replace("0.5", "9.5"))
    sealed.manifest_path.unlink()        # the repair check-data's own message suggests: --seal
    r = labkernels("check-data", "--root", root, "--seal", cwd=repo)
    assert_clean_error(r, "refusing to seal (nothing was sealed)", sealed.run_id, "was committed",
                       "differs from its committed version")
    assert not sealed.manifest_path.exists() and not legacy.manifest_path.exists()
    r = labkernels("check-data", "--root", root, "--seal", "--force", cwd=repo)
    assert_clean_error(r, "--reason")
    r = labkernels("check-data", "--root", root, "--seal", "--force", "--reason", "corrected a unit on purpose",
                   cwd=repo)
    assert r.returncode == 0, r.stderr
    forced = json.loads(sealed.manifest_path.read_text())["forced_seal"]
    assert forced["reason"] == "corrected a unit on purpose" and forced["by"] and forced["at"]
    assert any("differs from its committed version" in o for o in forced["overrode"])
    assert records_admin.check_data(root) == (2, [])


def test_seal_refuses_a_run_without_manifest_whose_table_changed_since_its_commit(committed):
    repo, root, sealed, legacy = committed
    csv = legacy.dir / f"{legacy.run_id}.t.csv"
    csv.write_text(csv.read_text() + "3,3.5\n")
    with pytest.raises(records.RecordError, match=rf"{legacy.run_id}.*differs from its committed version"):
        records_admin.seal_runs(root)
    assert not legacy.manifest_path.exists()


def test_seal_force_needs_seal(tmp_path):
    r = labkernels("check-data", "--root", tmp_path, "--force")
    assert_clean_error(r, "--force / --reason go with --seal")


# ------------------------------------------------------------------------------------------------ the lock
def test_a_build_waiting_for_the_index_lock_says_who_holds_it(tmp_path, capsys):
    from labkernels import pipeline

    code = ("import sys, time; from labkernels import pipeline\n"
            f"with pipeline.index_lock({str(tmp_path)!r}):\n    print('HELD', flush=True); time.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert holder.stdout.readline().strip() == "HELD"
        with pytest.raises(pipeline.PipelineError, match=rf"held for 1 s by pid {holder.pid} on "):
            with pipeline.index_lock(tmp_path, timeout=1):
                pass
        err = capsys.readouterr().err
        assert f"waiting up to 1 s for the index lock of {tmp_path}, held by pid {holder.pid}" in err
    finally:
        holder.kill()
        holder.wait()
    with pipeline.index_lock(tmp_path, timeout=5):      # a dead holder's lock is free again
        pass
    assert not (tmp_path / pipeline.LOCK_HOLDER).exists()
