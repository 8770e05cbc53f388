"""The product's kernels are not the experiment ledger: no source of a main-path instantiation, nor a header it
includes, names an exploratory (LK_EXP_*) or ablation (LK_ABLATE_*) build -- those live in their round's steps."""

from __future__ import annotations

import re

import pytest

from labkernels.rounds.r07_wgmma import builds as wb
from labkernels.kernels import registry

EXPERIMENT = re.compile(r"\bLK_(EXP|ABLATE)_\w*")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def production_files() -> set:
    """The sources of the registry's main-path instantiations and every header they include from the kernels
    folder, transitively."""
    todo = [registry.KERNELS_DIR / s for s in sorted({k.source for k in registry.KERNELS if k.main_path})]
    seen = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo += [registry.KERNELS_DIR / inc for inc in INCLUDE.findall(f.read_text())
                 if (registry.KERNELS_DIR / inc).exists()]
    return seen


def test_no_production_source_names_an_experiment_define():
    files = production_files()
    names = {f.name for f in files}
    assert {"wgmma_kq.cu", "wgmma_kq.cuh", "common.cuh", "tile.cuh", "q6k_expb.cu"} <= names
    found = {f.name: sorted(set(m.group(0) for m in EXPERIMENT.finditer(f.read_text()))) for f in files}
    assert not {k: v for k, v in found.items() if v}, found


def test_the_check_sees_a_define_in_an_included_header(tmp_path, monkeypatch):
    """The scan can fail: a copy of the kernels folder whose production header names a build is caught."""
    for f in registry.KERNELS_DIR.glob("*.cu*"):
        (tmp_path / f.name).write_text(f.read_text())
    h = tmp_path / "wgmma_kq.cuh"
    h.write_text(h.read_text() + "\n#ifdef LK_EXP_SOMETHING\n#endif\n")
    monkeypatch.setattr(registry, "KERNELS_DIR", tmp_path)
    with pytest.raises(AssertionError, match="LK_EXP_SOMETHING"):
        test_no_production_source_names_an_experiment_define()


def test_the_experiments_source_builds_every_name_the_launcher_takes():
    """Round 7's exploratory source names every -D name wgmma builds and refuses each retired one; the production
    source does neither."""
    src = wb.EXPERIMENTS["wgmma_kq.cu"].read_text()
    named = {m.group(0) for m in EXPERIMENT.finditer(src)}
    assert set(wb.BUILD_NAMES) <= named
    retired_here = {n for n, c in wb.RETIRED_BUILDS.items() if c == "4a8dcd9"}
    guard = src[src.index("#if defined(LK_EXP_WTMA)"):src.index("#error", src.index("#if defined(LK_EXP_WTMA)"))]
    assert retired_here <= {m.group(0) for m in EXPERIMENT.finditer(guard)}
    assert not set(wb.BUILD_NAMES) & set(wb.RETIRED_BUILDS)
