"""Recorded runs: append-only files with run ids and provenance."""
import json

import pandas as pd
import pytest

from labkernels import records


def test_run_lifecycle(tmp_path):
    run = records.new_run("roundx", {"a": 1}, root=tmp_path)
    run.append("t", {"x": 1, "y": 2.5})
    run.append("t", [{"x": 2, "y": 3.5}])
    assert records.latest("roundx", root=tmp_path) is None  # still running
    run.finish(best=3.5)
    r = records.latest("roundx", root=tmp_path)
    assert r.run_id == run.run_id and r.meta["summary"]["best"] == 3.5
    assert list(r.table("t").x) == [1, 2]
    assert r.provenance["git_commit"] and r.meta["params"] == {"a": 1}
    with pytest.raises(records.RecordError, match="append-only"):
        run.append("t", {"x": 3, "y": 1})
    with pytest.raises(records.RecordError, match="no table"):
        r.table("missing")


def test_interrupted_run_keeps_points(tmp_path):
    run = records.new_run("sweep", {}, root=tmp_path)
    for i in range(3):
        run.append("points", {"i": i})
    # the process dies here: rows are on disk, the run is listed as running, not complete
    again = records.list_runs("sweep", root=tmp_path, status=None)[0]
    assert again.meta["status"] == "running" and len(again.table("points")) == 3
    assert records.latest("sweep", root=tmp_path) is None


def test_new_column_after_rows_is_an_error(tmp_path):
    run = records.new_run("r", {}, root=tmp_path)
    run.append("t", {"a": 1})
    with pytest.raises(records.RecordError, match="new columns"):
        run.append("t", {"a": 1, "b": 2})


def test_import_never_overwrites(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    run = records.new_run("r", {}, root=src)
    run.append("t", {"a": 1}); run.finish()
    assert len(records.import_runs(src, dst)) == 2
    assert records.import_runs(src, dst) == []  # identical files: nothing to do
    p = next((src / "r").glob("*.csv"))
    p.write_text("a\n99\n")
    with pytest.raises(records.RecordError, match="append-only"):
        records.import_runs(src, dst)


def test_committed_runs_are_well_formed():
    """Every recorded run under data/ has metadata with provenance and the tables it lists."""
    from labkernels.paths import DATA_DIR

    metas = [p for p in DATA_DIR.glob("*/*.json")]
    for p in metas:
        m = json.loads(p.read_text())
        assert m["run_id"] in p.name and m["status"] in ("complete", "failed", "running")
        assert "provenance" in m and "date" in m["provenance"]
        for t in m.get("tables", []):
            assert (p.parent / f"{m['run_id']}.{t}.csv").exists(), (p, t)
            assert len(pd.read_csv(p.parent / f"{m['run_id']}.{t}.csv")) > 0


def test_recording_context_finishes_runs(tmp_path):
    with records.recording("r", {"x": 1}, root=tmp_path) as run:
        run.append("t", {"a": 1})
    assert records.latest("r", root=tmp_path).run_id == run.run_id
    with pytest.raises(ValueError):
        with records.recording("r", {}, root=tmp_path) as bad:
            bad.append("t", {"a": 2})
            raise ValueError("sweep died")
    failed = records.load("r", bad.run_id, root=tmp_path)
    assert failed.meta["status"] == "failed" and "sweep died" in failed.meta["summary"]["error"]
    assert len(failed.table("t")) == 1  # the points before the failure stay
    assert records.latest("r", root=tmp_path).run_id == run.run_id
