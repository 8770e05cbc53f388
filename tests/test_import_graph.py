"""The import structure of ``labkernels`` (issue 42 item 1): a product core that never imports the lab.

Every module under ``labkernels/`` is parsed with ``ast`` (nothing is imported); its imports of other labkernels
modules -- at module level and inside functions -- make the module graph. The checks:

* no import cycle among module-level imports (``KNOWN_TOP_CYCLES`` names the exceptions, each with its reason);
* every cycle of the whole graph (function-local imports included) lies inside an entry of ``KNOWN_CYCLES``, so
  the known cycles can only shrink, and an entry no longer needed fails too;
* no core module imports a lab module at module level, and inside functions only the edges of ``KNOWN_UPWARD``
  (each with its reason; an edge gone from the code must leave the list);
* the count of function-local labkernels imports is at most ``LOCAL_IMPORT_CAP`` (the count reached: it only goes
  down).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "labkernels"

#: the product: formats, references, model loading and checks, the build cache and registry (with ptxas' report
#: parser), the launchers (int8 / dense in gpu, wgmma, gemv), attention, the prefill and decode, the dispatch, and the records layer that
#: the dispatch reads recorded tables through (records with the run identity it stamps: provenance, nvml)
CORE = frozenset({
    "labkernels", "labkernels.paths", "labkernels.quants", "labkernels.layout", "labkernels.quantize_ref",
    "labkernels.reference", "labkernels.prefill_ref", "labkernels.model", "labkernels.gguf_check", "labkernels.ptxas",
    "labkernels.arch", "labkernels.synthetic", "labkernels.kernels", "labkernels.kernels.registry",
    "labkernels.kernels.gen_wgmma", "labkernels.errors", "labkernels.gpu", "labkernels.blas", "labkernels.wgmma", "labkernels.wgmma_pack", "labkernels.wgmma_sched", "labkernels.gemv", "labkernels.dispatch", "labkernels.forward_common", "labkernels.recorded_tables",
    "labkernels.attention", "labkernels.attention_kinds", "labkernels.attention_libs", "labkernels.graph_nodes", "labkernels.trace", "labkernels.prefill", "labkernels.prefill_replay", "labkernels.decode",
    "labkernels.records", "labkernels.records_admin", "labkernels.provenance", "labkernels.nvml",
})

#: the lab: measurement, analysis, reports, rounds and command lines
LAB = frozenset({
    "labkernels.__main__", "labkernels.analysis", "labkernels.audit", "labkernels.bench", "labkernels.cases",
    "labkernels.cli", "labkernels.facts", "labkernels.gpu_checks", "labkernels.gpu_cli", "labkernels.layout_cli",
    "labkernels.ncu", "labkernels.nvbench_check", "labkernels.occupancy", "labkernels.pipeline",
    "labkernels.plotting", "labkernels.prefill_cli", "labkernels.prefill_runs", "labkernels.report", "labkernels.sanitizer",
    "labkernels.sweep", "labkernels.testing",
})
LAB_PACKAGES = ("labkernels.rounds", "labkernels.peers")      # every module of these packages is lab

#: module-level import cycles allowed, each with its reason (none)
KNOWN_TOP_CYCLES: dict[frozenset, str] = {}

#: cycles through function-local imports still allowed: a cycle must lie inside one entry (none since the core split:
#: gpu no longer forwards qmatmul & co. to dispatch, nvbench_check holds round 9's GEMV lead instead of importing the round)
KNOWN_CYCLES: dict[frozenset, str] = {}

#: function-local core -> lab imports still allowed, each with its reason
KNOWN_UPWARD: dict[tuple[str, str], str] = {}   # none since the wgmma split (its build cache reads ptxas' report
#                                                  through labkernels.ptxas, which the audit imports too)

#: function-local labkernels imports (all modules): the count reached, only to go down
LOCAL_IMPORT_CAP = 0     # 185 before the wgmma split; 156 after it and the graph_nodes / plan-lookup splits (155
#                          counted on main with the round packages); 1 after the core split (coresplit2) lifted the
#                          rest to module level (no cycle, no optional dependency needed them); 0 since
#                          plotting.smem_bars takes round 7's build labels from its caller (the shared plotting module,
#                          which every page imports, never imports a round's code)


def _modname(p: Path) -> str:
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_modname(p): p for p in sorted(PKG.rglob("*.py"))}


def _owner(name: str) -> str:
    """The module that ``name`` (a module or a name inside one) is, or lives in."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _targets(mod: str, is_pkg: bool, node) -> list[str]:
    if isinstance(node, ast.Import):
        return [_owner(a.name) for a in node.names if a.name.split(".")[0] == "labkernels"]
    if node.level:
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        src = ".".join(base + ([node.module] if node.module else []))
    else:
        src = node.module or ""
    if src.split(".")[0] != "labkernels":
        return []
    return [_owner(f"{src}.{a.name}") for a in node.names]


def _imports():
    """(module-level edges, function-local edges, [(module, line, target)] of every function-local import)."""
    top = {m: set() for m in MODULES}
    local = {m: set() for m in MODULES}
    sites = []
    for mod, path in MODULES.items():
        is_pkg = path.name == "__init__.py"

        def walk(node, depth):
            for child in ast.iter_child_nodes(node):
                d = depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    ts = [t for t in _targets(mod, is_pkg, child) if t != mod]
                    if ts:
                        (local if d else top)[mod].update(ts)
                        if d:
                            sites.append((mod, child.lineno, tuple(sorted(set(ts)))))
                walk(child, d)

        walk(ast.parse(path.read_text(encoding="utf-8")), 0)
    return top, local, sites


def _cycles(graph: dict) -> list[frozenset]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = n[0]; n[0] += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = n[0]; n[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop(); on.discard(w); comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(frozenset(comp))
    return out


TOP, LOCAL, SITES = _imports()
FULL = {m: TOP[m] | LOCAL[m] for m in MODULES}


def _is_lab(m: str) -> bool:
    return m in LAB or any(m == p or m.startswith(p + ".") for p in LAB_PACKAGES)


def numbers() -> dict:
    """The figures the commit messages and docs/developing.md quote."""
    upward = {(a, b) for a in CORE for b in FULL.get(a, ()) if _is_lab(b)}
    return {"modules": len(MODULES), "top_cycles": len(_cycles(TOP)),
            "cycles": sorted(len(c) for c in _cycles(FULL)), "upward_edges": len(upward),
            "upward_top_edges": sum(_is_lab(b) for a in CORE for b in TOP.get(a, ())), "local_imports": len(SITES)}


def test_every_module_is_core_or_lab():
    both = {m for m in CORE if _is_lab(m)}
    assert not both, f"in both CORE and LAB: {sorted(both)}"
    stray = sorted(m for m in MODULES if m not in CORE and not _is_lab(m))
    assert not stray, f"new modules: add each to CORE (the product) or LAB in this test: {stray}"
    gone = sorted((CORE | LAB) - set(MODULES))
    assert not gone, f"listed but no longer a module: {gone}"


def test_no_module_level_cycles():
    found = _cycles(TOP)
    new = [sorted(c) for c in found if c not in KNOWN_TOP_CYCLES]
    assert not new, f"module-level import cycles: {new}"
    stale = [sorted(c) for c in KNOWN_TOP_CYCLES if c not in found]
    assert not stale, f"KNOWN_TOP_CYCLES entries no longer cycles (remove them): {stale}"


def test_cycles_only_known_ones():
    found = _cycles(FULL)
    new = [sorted(c) for c in found if not any(c <= k for k in KNOWN_CYCLES)]
    assert not new, f"import cycles (function-local imports included) outside KNOWN_CYCLES: {new}"
    stale = [sorted(k) for k in KNOWN_CYCLES if not any(c <= k for c in found)]
    assert not stale, f"KNOWN_CYCLES entries with no cycle left in them (remove them): {stale}"
    shrunk = [sorted(k - c) for k in KNOWN_CYCLES for c in found if c <= k and c != k]
    assert not shrunk, f"KNOWN_CYCLES entries larger than their cycle (shrink them; not in it now): {shrunk}"


def test_core_never_imports_lab():
    top = sorted((a, b) for a in CORE for b in TOP[a] if _is_lab(b))
    assert not top, f"core modules importing lab modules at module level: {top}"
    local = {(a, b) for a in CORE for b in LOCAL[a] if _is_lab(b)}
    new = sorted(local - set(KNOWN_UPWARD))
    assert not new, f"core modules importing lab modules inside functions: {new}"
    stale = sorted(set(KNOWN_UPWARD) - local)
    assert not stale, f"KNOWN_UPWARD edges gone from the code (remove them): {stale}"


def test_function_local_import_cap():
    assert len(SITES) <= LOCAL_IMPORT_CAP, (
        f"{len(SITES)} function-local labkernels imports, cap {LOCAL_IMPORT_CAP}: import at module level "
        "(a function-local import only for an optional dependency or a cycle in KNOWN_CYCLES)")


@pytest.mark.parametrize("mod", ["labkernels.dispatch", "labkernels.prefill", "labkernels.decode"])
def test_product_entry_points_reach_no_lab_module_at_import(mod):
    """Importing the product (module-level imports, transitively) loads no lab module."""
    seen, todo = set(), [mod]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(TOP[m])
    assert not sorted(m for m in seen if _is_lab(m))


if __name__ == "__main__":
    print(numbers())
