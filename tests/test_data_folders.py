"""Data folders named after their rounds (#14): the one table of series -> folder (labkernels.rounds.FOLDERS),
recording and reading by the old names, the migration of the old folders (git mv, idempotent, refusing a
conflict), check-data over a migrated tree, and the import of a GPU results tree written with the old names."""
import shutil
import subprocess

import pytest

from labkernels import cli, records, records_admin, rounds
from labkernels.paths import DATA_DIR


def _finished(root, series, rows=2):
    run = records.new_run(series, {"x": 1}, root=root)
    run.append("t", [{"i": i, "v": 0.5 + i, "series": series} for i in range(rows)])   # no two tables alike
    run.finish()
    return run


def _legacy_tree(root):
    """Runs as the code before #14 wrote them: data/<series>/<run_id>.* (the same bytes, the old folder)."""
    runs = [_finished(root, s) for s in ("q6k", "kdr_sweep", "q4k", "prefill")]
    for r in runs:
        if r.dir.name != r.round:
            (root / r.round).mkdir(exist_ok=True)
            for f in r.dir.glob(f"{r.run_id}.*"):
                f.rename(root / r.round / f.name)
    for d in {r.dir for r in runs}:
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return runs


def _snapshot(root):
    """(file name, bytes) of every file, wherever it lies (two folders may hold the same run id)."""
    return sorted((p.name, p.read_bytes()) for p in root.rglob("*") if p.is_file())


def test_the_folder_table_agrees_with_the_rounds():
    for mod in rounds.rounds():
        for series in mod.DATA:
            assert records.folder(series) == mod.NOTEBOOK or series in rounds.SHARED, (mod.NOTEBOOK, series)
    names = {m.NOTEBOOK for m in rounds.rounds()}
    assert set(rounds.FOLDERS.values()) <= names
    assert records.folder("q6k") == "03_q6k_expanded_b" and records.folder("prefill") == "prefill"
    assert not (set(rounds.FOLDERS) & set(rounds.SHARED))


def test_recording_under_an_old_name_lands_in_the_round_folder(tmp_path):
    with records.recording("q4k", {"a": 1}, root=tmp_path) as run:
        run.append("t", {"x": 1})
    assert run.dir == tmp_path / "04_kdr_sweep" and sorted(p.parent.name for p in tmp_path.rglob("*.*")) == \
        ["04_kdr_sweep"] * 3
    assert run.meta["round"] == "q4k"               # the series, as every older run says
    sweep = _finished(tmp_path, "kdr_sweep")
    # two series share the folder: a reader by series sees its own, the folder's name lists both
    assert [r.run_id for r in records.list_runs("q4k", tmp_path)] == [run.run_id]
    assert records.latest("kdr_sweep", tmp_path).run_id == sweep.run_id
    assert len(records.list_runs("04_kdr_sweep", tmp_path)) == 2
    assert records.load("q4k", run.run_id, tmp_path).table("t").x.tolist() == [1]
    with pytest.raises(records.RecordError, match="no run"):
        records.load("q4k", sweep.run_id, tmp_path)


def test_migrate_moves_is_idempotent_and_check_data_passes(tmp_path):
    runs = _legacy_tree(tmp_path)
    before = _snapshot(tmp_path)
    n, problems = records_admin.check_data(tmp_path)
    assert n == 4 and len(problems) == 3 and all("data migrate" in p for p in problems)   # q6k, kdr_sweep, q4k
    assert records.latest("q6k", tmp_path) is None      # readers look in the round folders only
    done = records_admin.migrate(tmp_path)
    assert {how for _, _, how in done} == {"move"} and len(done) == 9        # 3 runs x (json, csv, manifest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["03_q6k_expanded_b", "04_kdr_sweep", "prefill"]
    assert _snapshot(tmp_path) == before                 # names and bytes unchanged
    assert records_admin.check_data(tmp_path) == (4, [])       # the moved JSON still says round "q6k": accepted
    for r in runs:
        got = records.latest(r.round, tmp_path)
        assert got.run_id == r.run_id and got.meta["round"] == r.round and got.dir.name == records.folder(r.round)
    assert records_admin.migrate(tmp_path) == []               # a second run moves nothing
    assert cli.main(["migrate-data", "--root", str(tmp_path)]) == 0


def test_migrate_refuses_a_conflicting_file_and_drops_an_identical_one(tmp_path):
    runs = _legacy_tree(tmp_path)
    q6 = runs[0]
    new = tmp_path / "03_q6k_expanded_b"
    new.mkdir()
    clash = new / q6.meta_path.name
    clash.write_text("{}")
    before = _snapshot(tmp_path)
    with pytest.raises(records.RecordError, match=r"refusing to migrate \(nothing was moved\): .*"
                                                  + clash.name + " exists with different content"):
        records_admin.migrate(tmp_path)
    assert _snapshot(tmp_path) == before and (tmp_path / "q6k").is_dir()
    assert cli.main(["migrate-data", "--root", str(tmp_path)]) == 2
    shutil.copy2(tmp_path / "q6k" / clash.name, clash)   # the same bytes already there (an earlier import)
    done = records_admin.migrate(tmp_path)
    assert (f"q6k/{clash.name}", f"03_q6k_expanded_b/{clash.name}", "drop (identical)") in done
    assert not (tmp_path / "q6k").exists() and records_admin.check_data(tmp_path) == (4, [])


def test_migrate_refuses_two_old_folders_giving_one_file_two_contents(tmp_path):
    """kdr_sweep and q4k both move into 04_kdr_sweep: one run id in both (recorded in the same second) with
    different bytes is refused before anything moves; the same bytes twice move once."""
    runs = _legacy_tree(tmp_path)
    sweep = runs[1]
    twin = tmp_path / "q4k" / f"{sweep.run_id}.t.csv"
    original = (tmp_path / "kdr_sweep" / twin.name).read_bytes()
    twin.write_bytes(b"i\n1\n")
    before = _snapshot(tmp_path)
    with pytest.raises(records.RecordError, match=f"would both become .*04_kdr_sweep/{sweep.run_id}.t.csv"):
        records_admin.migrate(tmp_path)
    assert _snapshot(tmp_path) == before
    shutil.copy2(tmp_path / "kdr_sweep" / twin.name, twin)
    done = records_admin.migrate(tmp_path)
    assert [how for a, _, how in done if a == f"q4k/{twin.name}"] == ["drop (identical)"]
    assert (tmp_path / "04_kdr_sweep" / twin.name).read_bytes() == original
    assert not (tmp_path / "q4k").exists()


def test_migrate_in_a_git_repo_is_git_mv(tmp_path):
    if not shutil.which("git"):
        pytest.skip("no git")
    root = tmp_path / "data"
    root.mkdir()
    _legacy_tree(root)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "data"], check=True)
    subprocess.run(git + ["commit", "-qm", "runs"], check=True)
    extra = _finished(root, "occupancy")                 # untracked: a plain move
    extra.dir.rename(root / "occupancy")
    done = records_admin.migrate(root)
    hows = {a: how for a, _, how in done}
    assert hows[f"occupancy/{extra.run_id}.json"] == "move" and list(hows.values()).count("git mv") == 9
    st = subprocess.run(git[:3] + ["status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    renames = [ln for ln in st.splitlines() if ln.startswith("R ")]
    assert len(renames) == 9 and all(" -> data/0" in ln for ln in renames)
    subprocess.run(git + ["commit", "-qm", "migrate"], check=True)
    show = subprocess.run(git[:3] + ["show", "-M", "--name-status", "--format="], capture_output=True, text=True,
                          check=True).stdout.split("\n")
    assert [ln.split("\t")[0] for ln in show if ln] == ["R100"] * 9
    assert records_admin.migrate(root) == [] and records_admin.check_data(root) == (5, [])   # 4 runs + the untracked one


def test_import_of_a_tree_with_the_old_folder_names(tmp_path):
    src, dst = tmp_path / "out" / "data", tmp_path / "dst"
    src.mkdir(parents=True)
    runs = _legacy_tree(src)
    copied = records_admin.import_runs(src, dst)
    assert sorted({c.split("/")[0] for c in copied}) == ["03_q6k_expanded_b", "04_kdr_sweep", "prefill"]
    assert len(copied) == 12 and records_admin.check_data(dst) == (4, [])
    for r in runs:
        got = records.latest(r.round, dst)
        assert got.run_id == r.run_id and (got.dir / f"{r.run_id}.t.csv").read_bytes() == \
            (src / r.round / f"{r.run_id}.t.csv").read_bytes()
    assert records_admin.import_runs(src, dst) == []           # again: identical files, nothing to do
    # a legacy-named run whose JSON names another series is refused (filed in the wrong folder)
    bad = src / "q4k" / f"{runs[0].run_id}.json"
    shutil.copy2(src / "q6k" / bad.name, bad)
    with pytest.raises(records.RecordError, match="run of series 'q6k' lies in folder 'q4k'"):
        records_admin.import_runs(src, dst)


def test_the_committed_tree_is_migrated():
    """Nothing under data/ is left in an old folder, and every round folder verifies (check-data)."""
    assert records_admin.legacy_folders(DATA_DIR) == []
    assert {p.name for p in DATA_DIR.iterdir() if p.is_dir()} - set(records_admin.NON_RUN_DIRS) <= \
        set(rounds.FOLDERS.values()) | set(rounds.SHARED)


def test_import_refuses_one_run_id_from_two_old_folders_of_one_round(tmp_path, monkeypatch):
    collect = records.provenance.collect
    monkeypatch.setattr(records.provenance, "collect",
                        lambda params=None: {**collect(params), "date": "2026-01-01T00:00:00Z"})
    src = tmp_path / "src"
    a, b = _finished(tmp_path / "a", "kdr_sweep"), _finished(tmp_path / "b", "q4k")
    assert a.run_id == b.run_id
    for r in (a, b):
        shutil.copytree(r.dir, src / r.round)
    with pytest.raises(records.RecordError, match=f"are both run {a.run_id} of folder '04_kdr_sweep'"):
        records_admin.import_runs(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()
