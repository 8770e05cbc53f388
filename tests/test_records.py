"""Recorded runs: append-only files with run ids and provenance."""
import json
import re

import pandas as pd
import pytest

from labkernels import records, records_admin


def test_run_lifecycle(tmp_path):
    run = records.new_run("peers", {"a": 1}, root=tmp_path)
    run.append("t", {"x": 1, "y": 2.5})
    run.append("t", [{"x": 2, "y": 3.5}])
    assert records.latest("peers", root=tmp_path) is None  # still running
    run.finish(best=3.5)
    r = records.latest("peers", root=tmp_path)
    assert r.run_id == run.run_id and r.meta["summary"]["best"] == 3.5
    assert list(r.table("t").x) == [1, 2]
    assert r.provenance["git_commit"] and r.meta["params"] == {"a": 1}
    with pytest.raises(records.RecordError, match="append-only"):
        run.append("t", {"x": 3, "y": 1})
    with pytest.raises(records.RecordError, match="no table"):
        r.table("missing")


def test_interrupted_run_keeps_points(tmp_path):
    run = records.new_run("peers", {}, root=tmp_path)
    for i in range(3):
        run.append("points", {"i": i})
    # the process dies here: rows are on disk, the run is listed as running, not complete
    again = records.list_runs("peers", root=tmp_path, status=None)[0]
    assert again.meta["status"] == "running" and len(again.table("points")) == 3
    assert records.latest("peers", root=tmp_path) is None


def test_new_column_after_rows_is_an_error(tmp_path):
    run = records.new_run("prefill", {}, root=tmp_path)
    run.append("t", {"a": 1})
    with pytest.raises(records.RecordError, match="new columns"):
        run.append("t", {"a": 1, "b": 2})


def test_import_never_overwrites(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    run = records.new_run("prefill", {}, root=src)
    run.append("t", {"a": 1}); run.finish()
    assert len(records_admin.import_runs(src, dst)) == 3  # metadata, table, manifest
    assert records_admin.import_runs(src, dst) == []  # identical files: nothing to do
    # a different run with the same id in the source: refused before anything is written
    p = next((src / "prefill").glob("*.csv"))
    p.write_text("a\n99\n")
    records.write_manifest(records.Run("prefill", run.run_id, src, run.meta))
    before = sorted((dst / "prefill").iterdir())
    with pytest.raises(records.RecordError, match="append-only"):
        records_admin.import_runs(src, dst)
    assert sorted((dst / "prefill").iterdir()) == before


def test_committed_runs_are_well_formed():
    """Every recorded run under data/ has metadata with provenance, the tables it lists, and a manifest that
    matches every file (what `labkernels data check` checks in CI)."""
    from labkernels.paths import DATA_DIR

    metas = [p for p in DATA_DIR.glob("*/*.json")]
    assert len(metas) >= 10
    for p in metas:
        m = json.loads(p.read_text())
        assert m["run_id"] in p.name and m["status"] in ("complete", "failed", "running")
        assert "provenance" in m and "date" in m["provenance"]
        for t in m.get("tables", []):
            assert (p.parent / f"{m['run_id']}.{t}.csv").exists(), (p, t)
            assert len(pd.read_csv(p.parent / f"{m['run_id']}.{t}.csv")) > 0
    n, problems = records_admin.check_data(DATA_DIR)
    assert n == len(metas) and problems == []


def test_recording_context_finishes_runs(tmp_path):
    with records.recording("prefill", {"x": 1}, root=tmp_path) as run:
        run.append("t", {"a": 1})
    assert records.latest("prefill", root=tmp_path).run_id == run.run_id
    with pytest.raises(ValueError):
        with records.recording("prefill", {}, root=tmp_path) as bad:
            bad.append("t", {"a": 2})
            raise ValueError("sweep died")
    failed = records.load("prefill", bad.run_id, root=tmp_path)
    assert failed.meta["status"] == "failed" and "sweep died" in failed.meta["summary"]["error"]
    assert len(failed.table("t")) == 1  # the points before the failure stay
    assert records.latest("prefill", root=tmp_path).run_id == run.run_id


# ------------------------------------------------------------------ integrity: manifests, validation, import
def _finished(root, round_name="prefill", rows=3, **summary):
    run = records.new_run(round_name, {"x": 1}, root=root)
    for i in range(rows):
        run.append("t", {"i": i, "ratio": 1.5 + i})
    run.append("u", {"k": "a,b", "v": 2})
    run.finish(**summary)
    return run


def test_finish_writes_the_manifest_last(tmp_path):
    run = _finished(tmp_path)
    man = json.loads(run.manifest_path.read_text())
    assert set(man["files"]) == {run.meta_path.name, run.table_path("t").name, run.table_path("u").name}
    assert man["files"][run.table_path("t").name]["rows"] == 3
    assert man["run_id"] == run.run_id and man["status"] == "complete"
    assert run.manifest_path.stat().st_mtime_ns >= run.meta_path.stat().st_mtime_ns
    assert not list(tmp_path.rglob("*.tmp"))  # the temporary files were renamed away
    records.validate_run(run.meta_path)


def test_edited_value_fails_replay_naming_the_file(tmp_path):
    run = _finished(tmp_path)
    p = run.table_path("t")
    p.write_text(p.read_text().replace("2.5", "9.5"))  # same length, same row count: only the hash knows
    with pytest.raises(records.RecordError, match=rf"{re.escape(str(p))}: content differs from the manifest"):
        records.latest("prefill", root=tmp_path)
    n, problems = records_admin.check_data(tmp_path)
    assert n == 1 and len(problems) == 1 and str(p) in problems[0]


def test_cut_last_row_fails(tmp_path):
    run = _finished(tmp_path)
    p = run.table_path("t")
    data = p.read_bytes()
    p.write_bytes(data[:-4])  # the last row loses its end
    with pytest.raises(records.RecordError, match=re.escape(str(p))):
        records.latest("prefill", root=tmp_path)
    with pytest.raises(records.RecordError, match="the last row is cut"):
        records.table_rows(p)
    p.write_bytes(data[: data.rindex(b",")] + b"\n")  # cut inside the row, newline kept
    with pytest.raises(records.RecordError, match="row 4 has 1 fields, the header has 2"):
        records.table_rows(p)


def test_missing_extra_and_unsealed_files_fail(tmp_path):
    run = _finished(tmp_path)
    stray = run.dir / f"{run.run_id}.extra.csv"
    stray.write_text("a\n1\n")
    with pytest.raises(records.RecordError, match=rf"{re.escape(str(stray))}: not part of run"):
        records.load("prefill", run.run_id, root=tmp_path)
    stray.unlink()
    run.table_path("u").unlink()
    with pytest.raises(records.RecordError, match=r"\.u\.csv: missing"):
        records.latest("prefill", root=tmp_path)
    run2 = _finished(tmp_path / "b")
    run2.manifest_path.unlink()
    with pytest.raises(records.RecordError, match="has no manifest"):
        records.latest("prefill", root=tmp_path / "b")
    assert records_admin.seal_runs(tmp_path / "b") == [run2.manifest_path]
    assert "sealed_later" in json.loads(run2.manifest_path.read_text())
    assert records.latest("prefill", root=tmp_path / "b").run_id == run2.run_id


def test_validate_run_refuses_unfinished_and_corrupt_runs(tmp_path):
    run = records.new_run("prefill", {}, root=tmp_path)
    run.append("t", {"a": 1})
    with pytest.raises(records.RecordError, match="never finished"):
        records.validate_run(run.meta_path)
    run.finish()
    run.meta_path.write_text(run.meta_path.read_text()[:50])  # a truncated run JSON
    with pytest.raises(records.RecordError, match=rf"{re.escape(str(run.meta_path))}: corrupt run metadata"):
        records.validate_run(run.meta_path)


def _gpu_results(tmp_path):
    """A GPU machine's results root: env.json, gpu-check.json and data/<round>/... runs."""
    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    (out / "env.json").write_text("{}")
    (out / "gpu-check.json").write_text("{}")
    runs = [_finished(out / "data", "q6k"), _finished(out / "data", "kdr_sweep")]
    return out, runs


def test_import_validates_whole_runs_and_is_all_or_nothing(tmp_path):
    out, runs = _gpu_results(tmp_path)
    dst = tmp_path / "dst"
    with pytest.raises(records.RecordError, match="env.json: not a recorded run") as e:
        records_admin.import_runs(out, dst)  # the results root, not its data/
    assert "gpu-check.json" in str(e.value) and not dst.exists()
    # one bad run: nothing at all is copied, the message names the file
    bad = runs[1].table_path("t")
    good = bad.read_bytes()
    for broken, match in ((good[:-3], "the last row is cut"), (good.replace(b"3.5", b"3.6"), "content differs")):
        bad.write_bytes(broken)
        with pytest.raises(records.RecordError, match=rf"{re.escape(str(bad))}: .*{match}"):
            records_admin.import_runs(out / "data", dst)
        assert not dst.exists()
    bad.write_bytes(good)
    copied = records_admin.import_runs(out / "data", dst)
    assert len(copied) == 8 and records_admin.check_data(dst) == (2, [])
    assert not [p for p in dst.rglob(".*")]  # the staging folders are gone


def test_import_conflict_copies_nothing(tmp_path):
    out, runs = _gpu_results(tmp_path)
    dst = tmp_path / "dst"
    (dst / "04_kdr_sweep").mkdir(parents=True)
    clash = dst / "04_kdr_sweep" / runs[1].manifest_path.name
    clash.write_text("{}")
    with pytest.raises(records.RecordError, match=rf"{re.escape(str(clash))} exists with different content"):
        records_admin.import_runs(out / "data", dst)
    assert not (dst / "03_q6k_expanded_b").exists() and sorted((dst / "04_kdr_sweep").iterdir()) == [clash]


def test_import_missing_or_empty_source_fails(tmp_path):
    with pytest.raises(records.RecordError, match="no such folder"):
        records_admin.import_runs(tmp_path / "nope", tmp_path / "dst")
    (tmp_path / "empty").mkdir()
    with pytest.raises(records.RecordError, match="no recorded runs"):
        records_admin.import_runs(tmp_path / "empty", tmp_path / "dst")


def test_import_runs_cli(tmp_path, monkeypatch, capsys):
    from labkernels import cli

    out, runs = _gpu_results(tmp_path)
    monkeypatch.setenv("LABKERNELS_DATA_DIR", str(tmp_path / "dd"))
    assert cli.main(["import-runs", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert cli.main(["import-runs", str(out)]) == 2
    assert "env.json" in capsys.readouterr().err and not (tmp_path / "dd").exists()
    assert cli.main(["import-runs", str(out / "data")]) == 0
    assert records.latest("q6k").run_id == runs[0].run_id  # LABKERNELS_DATA_DIR was honoured
    assert cli.main(["check-data"]) == 0
    p = runs[0].table_path("t").name
    f = tmp_path / "dd" / "03_q6k_expanded_b" / p
    f.write_text(f.read_text().replace("1.5", "1.6"))
    assert cli.main(["check-data"]) == 1
    assert str(f) in capsys.readouterr().err


def test_attachment_is_manifested_and_verified(tmp_path):
    """Run.attach keeps a file with the run (an .ncu-rep): in the metadata, in the manifest with its sha256, and
    check-data verifies it like a table; size-capped, named, append-only."""
    src = tmp_path / "x.ncu-rep"
    src.write_bytes(b"NCU-REP" * 100)
    root = tmp_path / "data"
    run = records.new_run("forensics", {}, root=root)
    run.append("t", {"x": 1})
    p = run.attach("case-a.ncu-rep", src)
    assert p.name == f"{run.run_id}.case-a.ncu-rep" and p.read_bytes() == src.read_bytes()
    with pytest.raises(records.RecordError, match="already has it"):
        run.attach("case-a.ncu-rep", src)
    assert records.check_attachment_name("case-b.ncu-rep.xz") == "case-b.ncu-rep.xz"      # kept compressed
    for bad in ("../x.ncu-rep", "a.csv", "A.ncu-rep", "noext", "m.manifest", "a.ncu-rep.gz", "a.csv.xz",
                "a.ncu-rep.xz.xz", "../a.ncu-rep.xz", "a.b.c"):
        with pytest.raises(records.RecordError, match="attachment name"):
            run.attach(bad, src)
    big = tmp_path / "big.bin"
    big.write_bytes(b"0" * 2048)
    with pytest.raises(records.RecordError, match="over the cap"):
        run.attach("big.bin", big, max_bytes=1024)
    run.finish()
    with pytest.raises(records.RecordError, match="append-only"):
        run.attach("late.ncu-rep", src)
    man = json.loads(run.manifest_path.read_text())
    entry = man["files"][p.name]
    import hashlib
    assert entry["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest() and "rows" not in entry
    r = records.latest("forensics", root=root)
    assert r.attachments() == ["case-a.ncu-rep"]
    assert records_admin.check_data(root) == (1, [])
    # imported whole, attachment included
    dest = tmp_path / "dest"
    copied = records_admin.import_runs(root, dest)
    assert any(c.endswith(".case-a.ncu-rep") for c in copied)
    # an edited attachment fails check-data, naming the file
    p.write_bytes(b"NCU-REP" * 99 + b"X" * 7)
    n, problems = records_admin.check_data(root)
    assert n == 1 and len(problems) == 1 and "case-a.ncu-rep" in problems[0] and "differs" in problems[0]
    p.unlink()
    n, problems = records_admin.check_data(root)
    assert "missing" in problems[0]
