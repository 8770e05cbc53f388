"""records.new_run takes its run id by an exclusive create: two writers of one second, commit and GPU never get the
same id, and a run another writer created is never overwritten."""
import json
import os
import threading

from labkernels import provenance, records


def _same_second(monkeypatch):
    real = provenance.collect
    monkeypatch.setattr(provenance, "collect", lambda params=None: {**real(params), "date": "2026-12-08T10:00:00Z"})


def test_concurrent_writers_get_distinct_ids(monkeypatch, tmp_path):
    _same_second(monkeypatch)
    n, runs, errors = 8, [], []
    gate = threading.Barrier(n)

    def writer(i):
        gate.wait()
        try:
            runs.append(records.new_run("decode", {"writer": i}, root=tmp_path))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ids = sorted(r.run_id for r in runs)
    assert len(set(ids)) == n
    base = ids[0]
    assert set(ids) == {base} | {f"{base}-{k}" for k in range(2, n + 1)}
    for r in runs:      # each file is its own writer's, whole
        assert json.loads(r.meta_path.read_text())["params"] == r.meta["params"]
    assert not [p for p in (tmp_path / "09_decode").iterdir() if p.name.startswith(".")]   # no temporary files left


def test_an_id_taken_at_the_last_moment_is_not_overwritten(monkeypatch, tmp_path):
    """Another writer creates the first free id between any look and the create: new_run moves on to the next id and
    the other writer's file stays as it was."""
    _same_second(monkeypatch)
    first = records.new_run("decode", {"who": "first"}, root=tmp_path)
    real_link = os.link
    stolen = {}

    def link(src, dst):
        if str(dst).endswith("-2.json") and not stolen:
            stolen["path"] = dst
            with open(dst, "w") as f:
                f.write('{"run_id": "other writer"}')
        return real_link(src, dst)

    monkeypatch.setattr(records.os, "link", link)
    run = records.new_run("decode", {"who": "second"}, root=tmp_path)
    assert run.run_id == f"{first.run_id}-3"
    assert json.loads(open(stolen["path"]).read()) == {"run_id": "other writer"}


def test_without_hard_links_the_create_is_still_exclusive(monkeypatch, tmp_path):
    _same_second(monkeypatch)

    def no_links(src, dst):
        raise PermissionError("this file system has no hard links")

    monkeypatch.setattr(records.os, "link", no_links)
    a = records.new_run("decode", {}, root=tmp_path)
    b = records.new_run("decode", {}, root=tmp_path)
    assert b.run_id == f"{a.run_id}-2" and json.loads(b.meta_path.read_text())["run_id"] == b.run_id
    a.finish()
    assert records.latest("decode", root=tmp_path).run_id == a.run_id
