"""The headless report pipeline: notebooks -> papermill -> HTML (code folded) -> reports/index.html.

``labkernels report run [NOTEBOOK ...] [-p name=value ...] [-f params.yaml]`` executes each round notebook
with papermill, renders ``reports/<name>.html`` with the code folded behind a "code" toggle and a
navigation bar, and updates ``reports/index.html`` / ``reports/index.json`` with the round's status, its
headline figures and provenance.

* Parameters given with -p/-f are checked against every selected notebook's ``parameters`` cell before
  any cell runs: a name no selected notebook declares, a value of the wrong type or outside the values the
  declaration allows (:func:`parse_type`: ``OneOf``, ``Range``, ``Member``, ...), or one the round says has no
  effect in the mode the page renders in (:func:`round_problems`), is an error that lists the parameters,
  their types and allowed values. A notebook that does not declare a given name ignores it, so
  ``-p mode=replay`` applies to every GPU round at once. A YAML file may also hold per-notebook sections:
  ``{"03_q6k_expanded_b": {"repeats": 50}}`` (checked strictly against that notebook).
* A failing notebook is rendered to ``reports/<name>.failed.html`` (its traceback is in the page); the
  last good ``reports/<name>.html`` stays, the index links both, and the command exits non-zero; the
  other notebooks still run.
* Every file is written under a per-process temporary name and renamed into place; the index is updated
  under a lock (read, merge this round, write), so concurrent builds cannot corrupt each other; a build that
  waits for the lock says who holds it and how long it will wait. Ctrl-C stops with exit code 130 (SIGTERM:
  143) and leaves nothing partial behind, nor does a failed write (a full disk). A corrupt ``index.json`` is an
  error, and ``report results-table --write`` reads the index file it is given and refuses one with fewer rendered
  rounds than the README's table (``--allow-fewer``: on purpose).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from . import occupancy, paths, provenance, records, report, rounds
from .paths import NOTEBOOKS_DIR, PACKAGE_DIR, REPORTS_DIR
from .kernels import registry
from .rounds import r05_wall
from .rounds.r06_forensics import forensics_driver

TEMPLATE_DIR = PACKAGE_DIR / "templates"
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
NOTE_KEY = "labkernels"  # = report.NOTE_KEY (kept literal so importing the pipeline stays light)
SCRATCH_ENV = "LABKERNELS_SCRATCH"  # = report.SCRATCH_ENV: a folder per notebook execution, removed afterwards


class PipelineError(RuntimeError):
    """Bad input to the pipeline (parameters, notebooks, a corrupt index): a clear message, exit 2."""


# ----------------------------------------------------------------------------------------- notebooks

def discover(notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The round notebooks (``NN_name.ipynb``), in order. A ``NN_name.py`` source without its paired
    ``.ipynb`` is an error (``python3 lab.py sync`` creates the pair)."""
    d = Path(notebooks_dir)
    nbs = sorted(d.glob("[0-9][0-9]_*.ipynb"))
    lonely = sorted(p.name for p in d.glob("[0-9][0-9]_*.py") if not p.with_suffix(".ipynb").exists())
    if lonely:
        raise PipelineError(f"{', '.join(lonely)} in {d} have no paired .ipynb: run `python3 lab.py sync` "
                            f"(jupytext --sync) to create it")
    return nbs


def resolve(names, notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    allnb = discover(notebooks_dir)
    if not names:
        return allnb
    out = []
    for n in names:
        p = Path(n)
        if p.suffix in (".ipynb", ".py") and p.exists():
            out.append(p.with_suffix(".ipynb").resolve())
            continue
        hits = [q for q in allnb if q.stem == n or q.stem.startswith(n) or q.name == n]
        if len(hits) != 1:
            raise PipelineError(f"notebook {n!r}: {'no match' if not hits else 'ambiguous: ' + str([h.name for h in hits])}"
                                f" among {[q.name for q in allnb]}")
        out.append(hits[0])
    return out


def pair_differences(nb_path: Path) -> list[str]:
    """How the notebook's jupytext source ``.py`` and its ``.ipynb`` differ (cell types, sources, the
    parameters tag); empty when in sync or when there is no ``.py``."""
    import jupytext
    import nbformat

    py = Path(nb_path).with_suffix(".py")
    if not py.exists():
        return []
    a = jupytext.read(py)
    b = nbformat.read(str(nb_path), as_version=4)

    def key(c):
        return c.cell_type, c.source.strip(), "parameters" in c.metadata.get("tags", [])

    ka, kb = [key(c) for c in a.cells], [key(c) for c in b.cells]
    if ka == kb:
        return []
    diffs = [f"{py.name} has {len(ka)} cells, {Path(nb_path).name} has {len(kb)}"] if len(ka) != len(kb) else []
    for i, (x, y) in enumerate(zip(ka, kb)):
        if x != y:
            diffs.append(f"cell {i}: {x[1][:60]!r} vs {y[1][:60]!r}")
    return diffs


# ---------------------------------------------------------------------------------------- parameters

def parse_value(v: str):
    """-p values: YAML scalars/lists ('3', '[64, 128]', 'true', 'replay')."""
    import yaml

    try:
        return yaml.safe_load(v)
    except yaml.YAMLError:
        return v


def load_params(pairs, files, notebooks_dir: Path = NOTEBOOKS_DIR) -> tuple[dict, dict]:
    """Global params and per-notebook params from -p pairs and -f YAML files."""
    import yaml

    glob, per = {}, {}
    for f in files or []:
        text = paths.read_small_file(f, PipelineError, "-f parameters file", limit=1 << 20)
        try:
            data = yaml.safe_load(text) or {}
        except (OSError, yaml.YAMLError) as e:
            raise PipelineError(f"-f {f}: {e}") from None
        if not isinstance(data, dict):
            raise PipelineError(f"-f {f}: expected a mapping of parameters")
        for k, v in data.items():
            if isinstance(v, dict) and (Path(notebooks_dir) / f"{k}.ipynb").exists():
                per[k] = v
            else:
                glob[k] = v
    for pair in pairs or []:
        if "=" not in pair:
            raise PipelineError(f"-p expects name=value, got {pair!r}")
        k, v = pair.split("=", 1)
        glob[k.strip()] = parse_value(v)
    return glob, per


_GENERIC = re.compile(r"^(\w+)\s*\[(.*)\]$")
#: wrappers and named types of a parameter declaration (the annotation papermill reads: word characters, brackets,
#: commas and spaces only)
_NAMED = ("Shape", "Regex", "RunId", "Cluster")


def _split_args(s: str) -> list[str]:
    """'a, List[b, c], d' -> ['a', 'List[b, c]', 'd'] (commas at bracket depth 0)."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += (ch == "[") - (ch == "]")
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _literal(word: str):
    return int(word) if re.fullmatch(r"\d+", word) else word


def parse_type(annotation: str):
    """A parameter's declared type, with its allowed values where it names them:

    * ``int`` | ``float`` | ``str`` | ``bool`` | ``list`` | ``List[T]`` | ``Optional[T]`` | ``Any``;
    * ``OneOf[a, b, ...]``: one of these values (digits: an int, words: a str), e.g. ``OneOf[auto, measure, replay]``;
    * ``Range[lo, hi]``: an int from lo to hi;
    * ``NonEmpty[List[T]]``: a list with at least one element;
    * ``Shape``: ``[od, id]`` of a weight, od in 1..65536, id a multiple of 256 up to 65536;
      ``Regex``: a regular expression that compiles; ``RunId``: a recorded run id; ``Cluster``: a Dask cluster
      (``local[:N]``, ``local-cuda[:N]``, ``tcp://HOST:PORT``);
    * ``Known[table]``: a value of one of the lab's tables (:data:`KNOWN`: device profiles, kernel families, ...);
    * ``Member[param]``: one of the elements of the notebook's list parameter ``param`` (``headline_nt: "Member[nts]"``).

    Returns a spec tuple (kind, ...)."""
    a = annotation.strip().strip("'\"")
    simple = {"int": ("int",), "float": ("float",), "str": ("str",), "bool": ("bool",),
              "list": ("list", ("any",)), "List": ("list", ("any",)), "Any": ("any",), "None": ("none",)}
    if a in simple:
        return simple[a]
    if a in _NAMED:
        return ("named", a)
    m = _GENERIC.match(a)
    if m:
        head, args = m.group(1), _split_args(m.group(2))
        if head in ("List", "list") and len(args) == 1:
            return ("list", parse_type(args[0]))
        if head == "Optional" and len(args) == 1:
            return ("optional", parse_type(args[0]))
        if head == "NonEmpty" and len(args) == 1:
            inner = parse_type(args[0])
            if inner[0] != "list":
                raise PipelineError(f"parameter annotation {annotation!r}: NonEmpty takes a List[...]")
            return ("nonempty", inner)
        if head == "OneOf" and args:
            return ("oneof", tuple(_literal(w) for w in args))
        if head == "Range" and len(args) == 2 and all(re.fullmatch(r"\d+", w) for w in args):
            lo, hi = int(args[0]), int(args[1])
            if lo > hi:
                raise PipelineError(f"parameter annotation {annotation!r}: the range is empty")
            return ("range", lo, hi)
        if head == "Known" and len(args) == 1:
            if args[0] not in KNOWN:
                raise PipelineError(f"parameter annotation {annotation!r}: no table {args[0]!r}; tables: "
                                    f"{', '.join(KNOWN)}")
            return ("known", args[0])
        if head == "Member" and len(args) == 1 and re.fullmatch(r"\w+", args[0]):
            return ("member", args[0])
    raise PipelineError(f"unsupported parameter annotation {annotation!r} (use int, float, str, bool, List[...], "
                        f"Optional[...], OneOf[...], Range[lo, hi], NonEmpty[List[...]], {', '.join(_NAMED)}, "
                        f"Known[table], Member[param])")


def infer_type(value):
    """The type spec of a parameter's default value."""
    if isinstance(value, bool):
        return ("bool",)
    if isinstance(value, int):
        return ("int",)
    if isinstance(value, float):
        return ("float",)
    if isinstance(value, str):
        return ("str",)
    if isinstance(value, (list, tuple)):
        specs = {infer_type(v) for v in value}
        if specs == {("int",), ("float",)}:
            specs = {("float",)}
        return ("list", specs.pop() if len(specs) == 1 else ("any",))
    return ("any",)


def type_name(spec) -> str:
    kind = spec[0]
    if kind == "list":
        return "list" if spec[1] == ("any",) else f"List[{type_name(spec[1])}]"
    if kind == "optional":
        return f"Optional[{type_name(spec[1])}]"
    if kind == "nonempty":
        return f"NonEmpty[{type_name(spec[1])}]"
    if kind == "oneof":
        return f"OneOf[{', '.join(map(str, spec[1]))}]"
    if kind == "range":
        return f"Range[{spec[1]}, {spec[2]}]"
    if kind == "named":
        return spec[1]
    if kind in ("known", "member"):
        return f"{kind.capitalize()}[{spec[1]}]"
    return kind


# ---- the lab's tables a parameter may name (Known[table]): name -> (allowed values, accept(value) -> bool)

def _profiles():
    return list(occupancy.load_profiles())


def _profile_ok(v) -> bool:
    try:
        occupancy.profile(v)
        return True
    except occupancy.OccupancyError:
        return False


def _kdr_families():
    return sorted({k.family for k in registry.KERNELS if "KDR" in k.p})


def _q6k_variants():
    return [v.name for v in registry.VARIANTS.values() if v.qtype == "q6_K"]


def _r05_models():
    return list(r05_wall.MODELS)


def _forensics_shapes():
    return list(forensics_driver.DEFAULT_SHAPES)


def _sweep_plans():
    return sorted(p.stem for p in paths.PLANS_DIR.glob("*.yaml"))


def _sweep_plan_ok(v) -> bool:
    return isinstance(v, str) and bool(v) and paths.plan_file(v) is not None


#: the tables ``Known[...]`` names: (the values, listed in errors; whether a value is accepted -- aliases too)
KNOWN = {
    "device_profiles": (_profiles, _profile_ok),
    "kdr_families": (_kdr_families, None),
    "q6k_variants": (_q6k_variants, None),
    "r05_models": (_r05_models, None),
    "forensics_shapes": (_forensics_shapes, None),
    "sweep_plans": (_sweep_plans, _sweep_plan_ok),
}

_CLUSTER = re.compile(r"^(local|local-cuda)(:[1-9]\d*)?$|^(tcp|tls)://[\w.\-]+:\d+$")


def _named_problem(value, name: str) -> str | None:
    if name == "Shape":
        if (not isinstance(value, list) or len(value) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
            return "not an [od, id] pair of integers"
        od, id_ = value
        if not 1 <= od <= 65536:
            return f"od = {od} is not in 1..65536"
        if not 256 <= id_ <= 65536 or id_ % 256:
            return f"id = {id_} is not a multiple of 256 in 256..65536 (whole q4_K / q6_K super-blocks)"
        return None
    if name == "Regex":
        if not isinstance(value, str) or not value:
            return "not a non-empty regular expression"
        try:
            re.compile(value)
        except re.error as e:
            return f"not a regular expression ({e})"
        return None
    if name == "RunId":
        return None if isinstance(value, str) and records.RUN_ID_RX.match(value) else \
            "not a run id (yyyymmddThhmmssZ-device-commit)"
    if name == "Cluster":
        return None if isinstance(value, str) and _CLUSTER.match(value) else \
            "not a cluster: local[:N], local-cuda[:N] or tcp://HOST:PORT"
    raise AssertionError(name)


def value_problem(value, spec, params: dict | None = None) -> str | None:
    """Why ``value`` does not fit ``spec`` (None when it does). ``params``: the notebook's parameters as they will
    be (for ``Member[...]``)."""
    kind = spec[0]
    if kind == "any":
        return None
    if kind == "none":
        return None if value is None else "must be None"
    if kind == "optional":
        return None if value is None else value_problem(value, spec[1], params)
    if kind in ("bool", "int", "float", "str", "list"):
        if not type_ok(value, (kind, ("any",)) if kind == "list" else spec):
            return f"must be {type_name(spec if kind != 'list' else ('list', ('any',)))}"
        if kind == "list":
            for i, v in enumerate(value):
                why = value_problem(v, spec[1], params)
                if why:
                    return f"element {i} ({v!r}) {why}" if why.startswith("must") else f"element {i}: {v!r}: {why}"
        return None
    if kind == "nonempty":
        why = value_problem(value, spec[1], params)
        return why or (None if value else "must not be empty")
    if kind == "oneof":
        ok = any(type(value) is type(a) and value == a for a in spec[1])
        return None if ok else f"must be one of {', '.join(map(str, spec[1]))}"
    if kind == "range":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer in {spec[1]}..{spec[2]}"
        return None if spec[1] <= value <= spec[2] else f"must be in {spec[1]}..{spec[2]}"
    if kind == "named":
        return _named_problem(value, spec[1])
    if kind == "known":
        values, accept = KNOWN[spec[1]]
        allowed = values()
        ok = accept(value) if accept else value in allowed
        return None if ok else f"must be one of {', '.join(map(str, allowed))} ({spec[1]})"
    if kind == "member":
        pool = (params or {}).get(spec[1])
        if not isinstance(pool, list):
            return f"names a parameter {spec[1]!r} that is not a list"
        return None if value in pool else f"must be one of {spec[1]} = {pool!r}"
    raise AssertionError(spec)


def type_ok(value, spec) -> bool:
    kind = spec[0]
    if kind == "any":
        return True
    if kind == "none":
        return value is None
    if kind == "optional":
        return value is None or type_ok(value, spec[1])
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "list":
        return isinstance(value, list) and all(type_ok(v, spec[1]) for v in value)
    return value_problem(value, spec) is None if kind != "member" else True


def declared_parameters(nb_path: Path) -> dict:
    """name -> {"type": spec, "default": value, "help": str} from the notebook's parameters cell, read with
    papermill's own parser. Every assignment in the cell must be parsed (papermill silently skips lines it
    cannot parse) and every default be a literal with a known type."""
    import nbformat
    from papermill.translators import PythonTranslator

    nb = nbformat.read(str(nb_path), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if not cells:
        return {}
    if len(cells) > 1:
        raise PipelineError(f"{Path(nb_path).name}: {len(cells)} cells tagged 'parameters' (one expected)")
    src = cells[0].source
    parsed = {p.name: p for p in PythonTranslator.inspect(cells[0])}
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise PipelineError(f"{Path(nb_path).name}: parameters cell does not parse: {e}") from None
    assigned = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        assigned += [t.id for t in targets if isinstance(t, ast.Name)]
    missed = [n for n in assigned if n not in parsed]
    if missed:
        raise PipelineError(f"{Path(nb_path).name}: papermill cannot parse the parameters {missed} (a line holding "
                            f"more than one '=', e.g. in its comment?)")
    out = {}
    for name, p in parsed.items():
        try:
            default = ast.literal_eval(p.default)
        except (ValueError, SyntaxError):
            raise PipelineError(f"{Path(nb_path).name}: parameter {name!r} default {p.default!r} is not a literal") from None
        if p.inferred_type_name not in ("None", ""):
            spec = parse_type(p.inferred_type_name)
        elif default is None:
            raise PipelineError(f"{Path(nb_path).name}: parameter {name!r} defaults to None: annotate its type, "
                                f"e.g. {name}: \"Optional[str]\" = None")
        else:
            spec = infer_type(default)
        out[name] = {"type": spec, "default": default, "help": p.help}
    defaults = {k: v["default"] for k, v in out.items()}
    for name, d in out.items():
        for m in _members(d["type"]):
            if m not in out:
                raise PipelineError(f"{Path(nb_path).name}: parameter {name!r}: {type_name(d['type'])} names no "
                                    f"parameter of the notebook")
        why = value_problem(d["default"], d["type"], defaults)
        if why:
            raise PipelineError(f"{Path(nb_path).name}: parameter {name!r} default {d['default']!r} is not "
                                f"{type_name(d['type'])}: {why}")
    return out


def _members(spec) -> list[str]:
    """The parameters a spec's ``Member[...]`` parts name."""
    if spec[0] == "member":
        return [spec[1]]
    return _members(spec[1]) if spec[0] in ("list", "optional", "nonempty") else []


def describe_parameters(name: str, declared: dict) -> str:
    if not declared:
        return f"{name}: no parameters"
    w = max(len(k) for k in declared)
    lines = [f"  {k:<{w}}  {type_name(v['type']):<18} = {v['default']!r}" + (f"   # {v['help']}" if v["help"] else "")
             for k, v in declared.items()]
    return f"{name}:\n" + "\n".join(lines)


def check_params(nbs: list[Path], glob: dict, per: dict) -> dict[str, dict]:
    """Per notebook, the parameters it receives; PipelineError (listing the parameters and their types)
    for a name no selected notebook declares, a per-notebook name it does not declare, or a wrong type."""
    declared = {nb.stem: declared_parameters(nb) for nb in nbs}
    errors = []
    unknown = sorted(k for k in glob if not any(k in d for d in declared.values()))
    if unknown:
        errors.append(f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
                      f"no selected notebook declares {'them' if len(unknown) > 1 else 'it'}")
    for name, extra in per.items():
        if name in declared:
            bad = sorted(set(extra) - set(declared[name]))
            if bad:
                errors.append(f"{name} does not declare {', '.join(bad)}")
    out = {}
    for nb in nbs:
        d = declared[nb.stem]
        given = {k: v for k, v in {**glob, **per.get(nb.stem, {})}.items() if k in d}
        params = {**{k: v["default"] for k, v in d.items()}, **given}
        bad = False
        for k, v in given.items():
            spec = d[k]["type"]
            why = value_problem(v, spec, params)
            if why and spec[0] in ("bool", "int", "float", "str", "list", "optional") and not type_ok(v, spec):
                errors.append(f"{nb.stem}: {k} must be {type_name(spec)}, got {v!r} ({type(v).__name__})"
                              + ("" if why.startswith("must be") else f": {why}"))
            elif why:
                errors.append(f"{nb.stem}: {k} = {v!r}: {why} (declared {type_name(spec)})")
            elif k == "mode" and v not in report.MODES:
                errors.append(f"{nb.stem}: mode must be one of {', '.join(report.MODES)}, got {v!r}")
            else:
                continue
            bad = True
        if not bad:
            errors += [f"{nb.stem}: {e}" for e in round_problems(nb, params, given, d)]
        out[nb.stem] = given
    if errors:
        listing = "\n".join(describe_parameters(n, d) for n, d in declared.items())
        raise PipelineError("bad parameters (nothing was run):\n  " + "\n  ".join(errors)
                            + f"\nparameters of the selected notebooks (name, type, default):\n{listing}")
    return out


def round_problems(nb: Path, params: dict, given: dict, declared: dict) -> list[str]:
    """What the round of notebook ``nb`` (``labkernels.rounds``; none for other notebooks) says about its
    parameters before it runs, beyond their declared types and values:

    * the mode must be one the round renders in here: ``measure`` needs a GPU on this machine (rounds that measure
      through ``open_round``); ``cpu`` is for CPU rounds (and round 8's stand-in);
    * a parameter that has effect in some modes only (a measurement plan's ``repeats`` in replay) is refused when
      it would have none -- unless the run the page replays recorded that very value;
    * in replay, a ``Member[...]`` parameter must name a value of the replayed run's plan (``headline_nt`` among
      the recorded ``nts``), and the run itself must be one replay takes (:func:`labkernels.records.replay_run`);
    * the round's own ``check_plan(params)``, where it has one (round 5: the timeline layer exists in the model)."""
    try:
        mod = rounds.module(nb.stem)
    except rounds.RoundError:
        return []
    if getattr(mod, "NOTEBOOK", None) != nb.stem:
        return []
    out = []
    check = getattr(mod, "check_plan", None)
    if check is not None:
        out += check(params)
    if "mode" not in params:
        return out
    mode = params["mode"]
    opens = bool(mod.DATA) and (getattr(mod, "measure", None) is not None or hasattr(mod, "record_runs"))
    gpu = None
    if mode == "measure" and opens:
        gpu = provenance.gpu_available()
        if not gpu:
            return out + ["mode=measure needs a CUDA GPU with cupy; this machine has none (mode=replay renders the "
                          "recorded runs)"]
    if mode == "auto":
        gpu = provenance.gpu_available() if gpu is None else gpu
        mode = "measure" if gpu else "replay"
    modes = rounds.param_modes(mod)
    run = None
    if mode == "replay" and opens:
        where = getattr(mod, "REPLAY_WHERE", {}).get(mod.DATA[0])
        plan = {**mod.PLAN, **{k: v for k, v in params.items() if k in mod.PLAN}}
        try:
            run = records.replay_run(mod.DATA[0], where=(lambda r: where(r, plan)) if where else None)
        except records.RecordError as e:
            return out + [str(e)]
        if run is None:
            return out + [f"mode=replay, but no complete recorded {mod.DATA[0]} run"
                          + (f" for {', '.join(f'{k}={plan[k]!r}' for k in getattr(mod, 'REPLAY_KEYS', ()))}"
                             if getattr(mod, "REPLAY_KEYS", ()) else "")
                          + f" under {records.data_root() / records.folder(mod.DATA[0])}"]
    recorded = dict(run.meta.get("params") or {}) if run is not None else {}
    for k, v in given.items():
        m = modes.get(k)
        if m is None or mode in m:
            continue
        if k in recorded and recorded[k] == v:
            continue            # the replayed run recorded this very value
        out.append(f"{k} = {v!r} has no effect in {mode} mode (it applies in {' / '.join(m)} mode)"
                   + (f": the page replays run {run.run_id}, recorded with {k} = {recorded[k]!r}" if k in recorded else
                      "") + "; leave it out" + (", or measure on a GPU" if "measure" in m else ""))
    if run is not None:
        for k, d in declared.items():
            for target in _members(d["type"]):
                pool = recorded.get(target)
                if isinstance(pool, list) and params.get(k) is not None and params[k] not in pool:
                    out.append(f"{k} = {params[k]!r}: the replayed run {run.run_id} recorded {target} = {pool!r}, "
                               f"which has no {params[k]!r}")
    return out


# ------------------------------------------------------------------------------------- files, index

def atomic_write(path: Path, data: str | bytes) -> None:
    """Write to a per-process temporary name in the same folder, then rename over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _tmp_name(out_dir: Path, name: str, suffix: str) -> Path:
    return Path(out_dir) / f".{name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp{suffix}"


def _sweep_tmp(out_dir: Path) -> None:
    """Remove this process's temporary files from the reports folder (``.*.<pid>-<hex>.tmp*``: the names of
    :func:`_tmp_name` and :func:`atomic_write`), e.g. after a write failed half-way on a full disk."""
    for p in Path(out_dir).glob(f".*.{os.getpid()}-*.tmp*"):
        p.unlink(missing_ok=True)


LOCK_HOLDER = ".index.lock.holder"


def lock_holder(out_dir: Path) -> str:
    """Who holds the index lock of ``out_dir``, as its holder wrote it (pid, host, command, since when), and
    whether that process still runs; 'unknown' where the holder wrote nothing."""
    p = Path(out_dir) / LOCK_HOLDER
    try:   # a regular file of at most 64 KiB only: a FIFO there must not block the waiting build
        h = json.loads(paths.read_small_file(p, OSError, "lock holder record", limit=1 << 16))
        pid = int(h["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process (it left no holder record)"
    alive = ""
    if h.get("host") == os.uname().nodename:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            alive = ", no longer running"
        except PermissionError:
            pass
    return f"pid {pid} on {h.get('host', '?')} ({h.get('command', '?')}, since {h.get('since', '?')}{alive})"


@contextmanager
def index_lock(out_dir: Path, timeout: float = 600):
    """The lock of ``out_dir``'s index (read, merge, write). A build that has to wait says who holds the lock and
    how long it will wait; past ``timeout`` it stops with a PipelineError naming the holder."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(Path(out_dir) / ".index.lock"))
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            print(f"waiting up to {timeout:.0f} s for the index lock of {out_dir}, held by {lock_holder(out_dir)}",
                  file=sys.stderr, flush=True)
            lock.acquire(timeout=timeout)
    except Timeout:
        raise PipelineError(f"{out_dir}: the index lock has been held for {timeout:.0f} s by "
                            f"{lock_holder(out_dir)}; nothing of this round was written to the index") from None
    try:
        holder = {"pid": os.getpid(), "host": os.uname().nodename, "since": provenance.utc_now(),
                  "command": " ".join(["labkernels", *sys.argv[1:]])[:200] if sys.argv else "labkernels"}
        atomic_write(Path(out_dir) / LOCK_HOLDER, json.dumps(holder))
        yield
    finally:
        (Path(out_dir) / LOCK_HOLDER).unlink(missing_ok=True)
        lock.release()


def load_state(out_dir: Path) -> dict:
    """reports/index.json, strictly: a missing file is an empty index, an unreadable one an error."""
    p = Path(out_dir) / "index.json"
    if not p.exists():
        return {}
    return read_index(p)


def read_index(p: Path) -> dict:
    """One index file, strictly: a regular file holding an object of rounds (PipelineError otherwise)."""
    import stat

    try:
        st = os.stat(p)
    except OSError as e:
        raise PipelineError(f"{p}: cannot read the index ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise PipelineError(f"{p} is not a regular file; nothing was run")
    text = paths.read_small_file(p, PipelineError, "index", binary=True)   # no FIFO, /proc file, or endless read
    try:
        state = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise PipelineError(f"{p} is corrupt (nested too deeply); nothing was run") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PipelineError(f"{p} is corrupt ({e}); nothing was run. Restore it, or delete it to start a new "
                            f"index (every round then shows 'not run' until it is rendered again)") from None
    if not isinstance(state, dict) or not all(isinstance(v, dict) for v in state.values()):
        raise PipelineError(f"{p} is not an index (expected an object of rounds); nothing was run")
    return state


def update_state(out_dir: Path, name: str, entry: dict, notebooks_dir: Path) -> dict:
    """Merge one round into index.json and rewrite index.html, under the lock, atomically."""
    with index_lock(out_dir):
        state = load_state(out_dir)
        prev = state.get(name) or {}
        if entry["status"] != "ok":
            good = prev if prev.get("status") == "ok" else prev.get("last_good")
            if good and (Path(out_dir) / f"{name}.html").exists():
                entry["last_good"] = {k: v for k, v in good.items() if k != "last_good"}
        state[name] = entry
        atomic_write(Path(out_dir) / "index.json", json.dumps(state, indent=1, default=str))
        write_index(out_dir, state, notebooks_dir)
    return state


def _title(nb: Path) -> str:
    """The notebook's title (its first markdown heading) as plain text."""
    try:
        import nbformat

        for c in nbformat.read(str(nb), as_version=4).cells:
            if c.cell_type == "markdown":
                for line in c.source.splitlines():
                    if line.startswith("#"):
                        return _plain(line.lstrip("# ").strip())
    except Exception:
        pass
    return nb.stem


def _jinja():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR / "index")),
                              autoescape=jinja2.select_autoescape(["html", "j2"]))


#: the index's abstract (and the README's first paragraph says the same): what the lab is, how it works, where
#: the results are
LAB_ABSTRACT = ("labkernels measures matrix-multiplication kernels for llama.cpp's quantized weights (GGUF q4_K and "
                "q6_K) on NVIDIA GPUs, one question per round, from int8 mma.sync kernels (rounds 3-6) to a Hopper "
                "wgmma kernel that matches cuBLAS fp16 at large batches (round 7) and a whole 7B prefill several "
                "times faster than llama.cpp's (round 5). Every number comes from a GPU run recorded under data/, "
                "gated against exact CPU references before it was timed, and every page re-renders from those "
                "records on a machine without a GPU. The table gives each round's headline; its page leads with "
                "the same figures, then the method and the detail.")


GPU_SUITE_TIERS = ("fast", "full")


def gpu_suite_rows(root: Path | None = None) -> list[dict]:
    """The index's "GPU test suite" table: per tier (fast, full), the latest recorded ``gpu_suite`` run -- its
    commit, GPU, counts and seconds -- or ``None`` where that tier has never been recorded. A run is the record
    ``labkernels gpu check --steps tests --tier T`` wrote on the GPU (:mod:`labkernels.gpu_cli`); a tier whose
    latest run failed shows that run (a red suite is news, not something to hide behind an older green one)."""
    try:
        every = records.list_runs("gpu_suite", root, status=None)
    except records.RecordError as e:    # a tampered record: the index says so rather than failing to render
        return [{"tier": tier, "run": None, "unreadable": str(e)} for tier in GPU_SUITE_TIERS]
    rows = []
    for tier in GPU_SUITE_TIERS:
        runs = [r for r in every
                if r.meta.get("status") in ("complete", "failed") and (r.meta.get("params") or {}).get("tier") == tier]
        if not runs:
            rows.append({"tier": tier, "run": None})
            continue
        rows.append(_suite_row(tier, _latest_suite_group(runs)))
    return rows


def _latest_suite_group(runs: list) -> list:
    """The runs that together make the tier's latest result: the latest run alone when it ran the whole tier, else
    the latest run of every shard I of its N at its commit (``gpu check --shard I/N``; a part re-run later replaces
    the earlier one)."""
    last = runs[-1]
    shard = (last.meta.get("params") or {}).get("shard")
    if not shard:
        return [last]
    n, commit = shard.split("/")[1], last.provenance.get("git_commit")
    parts = {}
    for r in runs:
        sh = (r.meta.get("params") or {}).get("shard") or ""
        if sh.endswith(f"/{n}") and r.provenance.get("git_commit") == commit:
            parts[sh] = r
    return [parts[k] for k in sorted(parts, key=lambda k: int(k.split("/")[0]))]


def _suite_row(tier: str, group: list) -> dict:
    """One row of the suite table from a run or a group of shards (counts and seconds summed; green only when every
    part is present and green)."""
    r = group[-1]
    prov = r.provenance
    counts = {k: sum(int((g.meta.get("summary") or {}).get(k) or 0) for g in group)
              for k in ("tests", "passed", "failed", "error", "skipped")}
    secs = [(g.meta.get("summary") or {}).get("seconds") for g in group]
    ok = all(bool((g.meta.get("summary") or {}).get("ok")) and g.meta.get("status") == "complete" for g in group)
    row = {"tier": tier, "run": ", ".join(g.run_id for g in group), "commit": prov.get("git_commit", "?"),
           "gpu": (prov.get("gpu") or {}).get("name", "?"), "date": r.meta.get("started", "?"),
           "seconds": None if None in secs else round(sum(secs), 1), "ok": ok,
           "workers": (r.meta.get("params") or {}).get("workers"), **counts}
    shard = (r.meta.get("params") or {}).get("shard")
    if shard:
        n = int(shard.split("/")[1])
        row["shards"] = f"{len(group)} of {n} parts"
        if len(group) < n:
            row["ok"] = False
            row["partial"] = True
    return row


def write_index(out_dir: Path, state: dict, notebooks_dir: Path = NOTEBOOKS_DIR, data_root: Path | None = None) -> Path:
    out_dir = Path(out_dir)
    rounds = []
    for nb in discover(notebooks_dir):
        s = state.get(nb.stem) or {}
        good = s if s.get("status") == "ok" else (s.get("last_good") or {})
        pages = [(p, _page_label(p[len(nb.stem) + 1:-5])) for p in good.get("pages") or [] if (out_dir / p).exists()]
        rounds.append({
            "name": nb.stem, "title": _title(nb), "state": s, "pages": pages,
            "page": f"{nb.stem}.html" if (out_dir / f"{nb.stem}.html").exists() else None,
            "failed_page": f"{nb.stem}.failed.html" if (out_dir / f"{nb.stem}.failed.html").exists() else None,
        })
    page = _jinja().get_template("index.html.j2").render(
        rounds=rounds, written=provenance.utc_now(), machine=provenance.describe(provenance.collect()),
        abstract=LAB_ABSTRACT, suite=gpu_suite_rows(data_root))
    p = out_dir / "index.html"
    atomic_write(p, page)
    return p


#: the statuses a round's index entry may have (``run`` writes ok or failed)
INDEX_STATUSES = ("ok", "failed")


def check_index_entry(name: str, s) -> None:
    """One round's index entry, as ``run`` writes it: a status of :data:`INDEX_STATUSES`; an ok entry has a
    headline object (or null) of one-line texts (a README row is built from them); ``mode`` is a word or null.
    PipelineError naming the round and the field otherwise -- the README is never rewritten from such an entry."""
    if not isinstance(s, dict):
        raise PipelineError(f"index entry {name!r} is {type(s).__name__}, expected an object")
    st = s.get("status")
    if st not in INDEX_STATUSES:
        raise PipelineError(f"index entry {name!r}: status {st!r} is not one of {', '.join(INDEX_STATUSES)}")
    if s.get("mode") is not None and not (isinstance(s["mode"], str) and re.fullmatch(r"[A-Za-z0-9_-]+", s["mode"])):
        raise PipelineError(f"index entry {name!r}: mode {s['mode']!r} is not a word")
    if st != "ok":
        return
    head = s.get("headline")
    if head is not None and not isinstance(head, dict):
        raise PipelineError(f"index entry {name!r}: headline {head!r:.80} is {type(head).__name__}, expected an "
                            "object of texts")
    for k, v in (head or {}).items():
        if isinstance(v, (dict, list)) or v is None:
            raise PipelineError(f"index entry {name!r}: headline {k!r} is {type(v).__name__}, expected a text or a number")
        for t in (k, str(v)):
            if "\n" in t or "\r" in t or "<!--" in t or "-->" in t:
                raise PipelineError(f"index entry {name!r}: headline {k!r} holds a line break or an HTML comment "
                                    f"marker ({t[:60]!r}): it would break the README's table")


def results_table(state: dict, notebooks_dir: Path = NOTEBOOKS_DIR) -> str:
    """The README's "where the lab stands" table, from an index: one row per round, its headline. Every entry of a
    known round is checked first (:func:`check_index_entry`)."""
    lines = ["| round | headline (from `reports/index.json`) |", "|---|---|"]
    for nb in discover(notebooks_dir):
        if nb.stem in state:
            check_index_entry(nb.stem, state[nb.stem])
        s = state.get(nb.stem) or {}
        if s.get("status") == "ok":
            head = "; ".join(f"{k}: {v}" for k, v in (s.get("headline") or {}).items()) or "-"
            mode = f" ({s['mode']})" if s.get("mode") else ""
        else:
            head, mode = "not rendered" if not s else f"{s.get('status')}: {s.get('error')}", ""
        lines.append(f"| {int(nb.stem[:2])} {_title(nb).split('—', 1)[-1].strip()}{mode} | {head.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


README_BEGIN = "<!-- results-table: generated by `labkernels report results-table --write` from reports/index.json -->"
README_END = "<!-- /results-table -->"


def table_rounds(table: str) -> dict[int, str]:
    """{round number: headline} of a results table's rows (README or :func:`results_table`)."""
    out = {}
    for line in table.splitlines():
        m = re.match(r"^\|\s*(\d+)\s[^|]*\|\s*(.*?)\s*\|\s*$", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def _check_markers(readme: str) -> None:
    """Exactly one BEGIN marker, then exactly one END marker (the table between them is the one rewritten)."""
    if README_BEGIN not in readme or README_END not in readme:
        raise PipelineError(f"README has no results-table markers ({README_BEGIN} ... {README_END})")
    if readme.count(README_BEGIN) != 1 or readme.count(README_END) != 1:
        raise PipelineError(f"README has {readme.count(README_BEGIN)} results-table begin and "
                            f"{readme.count(README_END)} end markers: exactly one of each (which table to rewrite?)")
    if readme.index(README_END) < readme.index(README_BEGIN):
        raise PipelineError("README's results-table end marker comes before its begin marker")


def readme_table(readme: str) -> str:
    """The table between the README's results-table markers."""
    _check_markers(readme)
    return readme.split(README_BEGIN, 1)[1].split(README_END, 1)[0]


def replace_readme_table(readme: str, table: str) -> str:
    _check_markers(readme)
    head, rest = readme.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_BEGIN}\n{table}{README_END}{tail}"


# ------------------------------------------------------------------------------------------- render

def collect_notes(nb) -> dict:
    """The notes (mode, run_id, provenance, headline) that labkernels.report attached to the outputs."""
    notes: dict = {}
    for c in nb.cells:
        for o in c.get("outputs", []):
            n = (o.get("metadata") or {}).get(NOTE_KEY)
            if isinstance(n, dict):
                head = {**notes.get("headline", {}), **dict(n.get("headline") or [])}
                notes.update(n)
                if head:
                    notes["headline"] = head  # the JSON index keeps insertion order
    return notes


PAGE_TAG = "page:"   # = report.PAGE_TAG: a markdown cell tagged page:NAME starts reports/<notebook>_NAME.html


def page_split(nb) -> list[tuple[str, object]]:
    """[(page name, notebook)]: the notebook itself ("" = the main page), cut where a markdown cell is tagged
    ``page:NAME`` (that cell and the ones after it up to the next such cell form page NAME). One execution,
    several pages: round 7's record page and its steps ledger."""
    import copy

    cuts = [(i, t[len(PAGE_TAG):]) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
            for t in c.metadata.get("tags", []) if t.startswith(PAGE_TAG)]
    if not cuts:
        return [("", nb)]
    bad = [n for _, n in cuts if not re.fullmatch(r"[a-z][a-z0-9-]*", n)]
    if bad or len({n for _, n in cuts}) != len(cuts):
        raise PipelineError(f"page tags must be distinct page:NAME (lowercase letters, digits, '-'): {bad or cuts}")
    bounds = [(0, "")] + cuts + [(len(nb.cells), None)]
    out = []
    for (a, name), (b, _) in zip(bounds, bounds[1:]):
        part = copy.deepcopy(nb)
        part.cells = part.cells[a:b]
        out.append((name, part))
    return out


def page_file(stem: str, page: str) -> str:
    return f"{stem}.html" if not page else f"{stem}_{page}.html"


_PNG_URI = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=\s]+)")


#: a published page's byte budget: over it, the figures are re-encoded with a 256-colour palette
PAGE_BUDGET = 1_400_000


def webp_images(page: str, budget: int = PAGE_BUDGET) -> str:
    """Every inline PNG of a page as lossless WebP (the same pixels, ~3x fewer bytes for the lab's figures). A page
    still over ``budget`` bytes (round 7's steps ledger: thirty figures) gets its figures with a 256-colour palette
    instead (median cut, no dithering: a figure of at most 256 colours is unchanged, the others lose only shades
    of their anti-aliasing), so that every page stays under 1.5 MB. PNGs that do not decode are left as they are."""
    import base64
    import io

    try:
        from PIL import Image
    except ImportError:     # pragma: no cover - Pillow comes with matplotlib
        return page

    def encoder(palette: bool):
        def conv(m):
            try:
                im = Image.open(io.BytesIO(base64.b64decode(m.group(1))))
                if palette:
                    im = im.convert("RGB").quantize(256, dither=Image.Dither.NONE).convert("RGB")
                buf = io.BytesIO()
                im.save(buf, "WEBP", lossless=True, quality=100, method=4)
            except Exception:   # not an image Pillow can re-encode: keep the PNG
                return m.group(0)
            return "data:image/webp;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
        return conv

    out = _PNG_URI.sub(encoder(False), page)
    if len(out.encode()) > budget:
        out = _PNG_URI.sub(encoder(True), page)
    return out


_STYLER_CLASSES = re.compile(r' class="(?:data row\d+ col\d+|col_heading level\d+ col\d+|row_heading level\d+ row\d+|'
                             r'index_name level\d+|blank level\d+|blank)( num)? ?"( ?)')
_STYLER_TAG_SPACE = re.compile(r"(<t[dhr](?: class=\"num\")?) >")
_STYLER_IDS = re.compile(r' id="T_[0-9a-f]+_(?:level\d+_col\d+|level\d+_row\d+|row\d+(?:_col\d+)?)"')


def slim_tables(page: str) -> str:
    """pandas Styler's per-cell class names (``data row12 col3``) and header ids, which no stylesheet of the page
    uses, taken out of its tables (``num``, which the page's stylesheet right-aligns, stays): a third of a table's
    bytes."""
    page = _STYLER_CLASSES.sub(lambda m: ' class="num"' if m.group(1) else "", page)
    return _STYLER_TAG_SPACE.sub(r"\1>", _STYLER_IDS.sub("", page))


def render_html(nb, nav: dict | None = None) -> dict[str, str]:
    """{page name: HTML} of an executed notebook ("" the main page; more where a cell is tagged page:NAME)."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="labfold", extra_template_basedirs=[str(TEMPLATE_DIR)],
                            exclude_input_prompt=True, exclude_output_prompt=True)
    nav = dict(nav or {})
    parts = page_split(nb)
    stem = nav.get("stem", "")
    pages = [(page_file(stem, name), _title_of(part) or nav.get("title", ""), _page_label(name))
             for name, part in parts]
    out = {}
    for (name, part), (_, title, _) in zip(parts, pages):
        pnav = {**nav, "title": title, "pages": pages if len(pages) > 1 else [], "here": page_file(stem, name)}
        body, _ = exporter.from_notebook_node(part, resources={"lk_nav": pnav, "metadata": {"name": title}})
        out[name] = webp_images(slim_tables(body))
    return out


def _page_label(name: str) -> str:
    """The nav bar's link to a page of a split notebook: "" -> the result page, "steps" -> "steps ledger"."""
    return {"": "result page", "steps": "steps ledger"}.get(name, name.replace("-", " "))


def _title_of(nb) -> str:
    for c in nb.cells:
        if c.cell_type == "markdown":
            for line in c.source.splitlines():
                if line.startswith("#"):
                    return _plain(line.lstrip("# ").strip())
    return ""


def _plain(title: str) -> str:
    """A title as plain text (the nav bar, the index, a browser tab): no markdown code marks."""
    return re.sub(r"`([^`]*)`", r"\1", title)


def _nav(nbs_all: list[Path], nb: Path, status: str, params: dict) -> dict:
    stems = [p.stem for p in nbs_all]
    i = stems.index(nb.stem) if nb.stem in stems else -1
    prev = (f"{stems[i - 1]}.html", _title(nbs_all[i - 1])) if i > 0 else None
    nxt = (f"{stems[i + 1]}.html", _title(nbs_all[i + 1])) if 0 <= i < len(stems) - 1 else None
    return {"index": "index.html", "prev": prev, "next": nxt, "title": _title(nb), "status": status,
            "params": report.params_text(params) if params else "", "stem": nb.stem}


_TAG = re.compile(r"<(/?)(\w+)[^>]*>")


def lead_check(page: str) -> dict:
    """Where a rendered page puts its result: what comes before the lead (``<section class='lk-lead'>``: the
    abstract, the headline table, the figure) -- images, tables, visible characters -- and what the lead holds.
    The structural form of "the headline is above the fold" (a page's first 1,500 px at 1280 px wide hold the
    title, the banner and the lead when nothing but them comes first)."""
    import html as _html

    body = page.split("<body", 1)[-1]
    body = re.sub(r"<style.*?</style>|<script.*?</script>|<details.*?</details>", "", body, flags=re.S)
    m = re.search(r"<section class=[\"']lk-lead[\"']", body)
    at = m.start() if m else -1
    res = {"lead": at >= 0}
    if at < 0:
        return res
    before, after = body[:at], body[at:]
    end = after.find("</section>")
    lead = after[:end if end >= 0 else len(after)]
    text_before = _html.unescape(re.sub(r"\s+", " ", _TAG.sub(" ", before))).strip()
    abstract = re.search(r"class=[\"']lk-abstract[\"']>(.*?)</p>", lead, flags=re.S)
    ab_text = _html.unescape(_TAG.sub("", abstract.group(1))).replace("Abstract.", "", 1).strip() if abstract else ""
    res.update({"images_before": len(re.findall(r"<img\b", before)),
                "tables_before": len(re.findall(r"<table\b", before)),
                "text_before": len(text_before), "headline": "lk-headline" in lead,
                "headline_rows": len(re.findall(r"<tr>", lead)), "figure": "<img" in lead,
                "abstract_sentences": len(report.sentences(ab_text)) if ab_text else 0,
                "pending": "lk-pending" in lead})
    return res


@contextmanager
def _kernel_env():
    """Kernel settings for one execution: figures drawn inline whatever MPLBACKEND the caller has (lab.py
    and CI set Agg, under which plt.show() draws nothing), and the kernel on IPC sockets in a private
    folder where the OS has them (no TCP port, no 'running over TCP without encryption' warning).

    Yields (config, kernel manager class). The class records every kernel manager papermill makes, so that
    a kernel still alive on the way out (a Ctrl-C while it was starting, before nbclient owned its
    shutdown) is killed before its socket folder goes: otherwise it starts after the folder is gone, prints
    a zmq traceback into the build's stderr and lives on until it notices its parent has exited."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets.config import Config

    managers: list = []

    class RecordedKernelManager(AsyncKernelManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            managers.append(self)

    saved = os.environ.get("MPLBACKEND")
    saved_scratch = os.environ.get(SCRATCH_ENV)
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    d = tempfile.mkdtemp(prefix="lk-kernel-")
    os.environ[SCRATCH_ENV] = os.path.join(d, "scratch")   # report.temp_dir: removed with d, whatever happens
    cfg = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(d, "k")}}) if os.name == "posix" else Config()
    try:
        yield cfg, RecordedKernelManager
    finally:
        for key, value in (("MPLBACKEND", saved), (SCRATCH_ENV, saved_scratch)):
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _kill_kernels(managers)
        shutil.rmtree(d, ignore_errors=True)


def _kill_kernels(managers: list) -> None:
    """Kill the kernel processes of these managers that are still running (synchronously: the event loop
    may have been left by a KeyboardInterrupt) and remove their connection files."""
    for km in managers:
        proc = getattr(km.provisioner, "process", None) if km.provisioner is not None else None
        if proc is not None and proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=10)
            except Exception:  # a process that outlives SIGKILL for 10 s: nothing more to do here
                pass
        try:
            km.cleanup_connection_file()
        except Exception:
            pass


def _same_interpreter(exe: str) -> bool:
    """Whether ``exe`` runs this Python (same path, else the same ``sys.prefix``: a venv's python is a link to its
    base interpreter, so resolving links is not enough)."""
    import shutil
    import subprocess

    path = shutil.which(exe) or exe
    if os.path.abspath(path) == os.path.abspath(sys.executable):
        return True
    try:
        r = subprocess.run([path, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and os.path.realpath(r.stdout.strip()) == os.path.realpath(sys.prefix)


def kernel_for(nb_path: Path) -> tuple[str, str]:
    """(kernel name, note) that papermill runs a notebook with: the kernelspec its metadata names (the round
    notebooks name ``labkernels``, which ``python3 lab.py lab`` registers), else -- no such kernelspec on this machine,
    e.g. CI or the GPU machine -- ``python3``, said in the note. Either way the spec must start this interpreter (the
    lab's): a user-level kernelspec naming another Python would run other packages' code, so that is a
    PipelineError naming the spec and both interpreters."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    meta = json.loads(Path(nb_path).read_text()).get("metadata", {})
    name = (meta.get("kernelspec") or {}).get("name") or "python3"
    ksm, note = KernelSpecManager(), ""
    try:
        spec = ksm.get_kernel_spec(name)
    except NoSuchKernel:
        if name == "python3":
            raise PipelineError(f"{Path(nb_path).name}: no python3 kernelspec (install ipykernel)") from None
        note = f"no {name!r} kernelspec here (python3 lab.py lab registers it): the python3 kernel ran"
        name = "python3"
        try:
            spec = ksm.get_kernel_spec(name)
        except NoSuchKernel:
            raise PipelineError(f"{Path(nb_path).name}: neither a {meta['kernelspec']['name']!r} nor a python3 "
                                "kernelspec (install ipykernel)") from None
    exe = spec.argv[0] if spec.argv else ""
    # jupyter_client starts 'python' / 'python3' / 'python3.X' as sys.executable (KernelManager.format_kernel_cmd)
    if exe not in {"python", f"python{sys.version_info[0]}", "python%d.%d" % sys.version_info[:2]} \
            and not _same_interpreter(exe):
        raise PipelineError(f"{Path(nb_path).name}: the {name!r} kernelspec ({spec.resource_dir}) starts {exe}, not "
                            f"this lab's interpreter {sys.executable}: its cells would import another environment's "
                            f"packages. Re-register it from the lab's environment (python3 lab.py lab, or "
                            f"{sys.executable} -m ipykernel install --user --name {name}) or remove it")
    return name, note


def _execute(nb: Path, out_nb: Path, params: dict, timeout: int | None, kernel: str = "python3",
             hit: dict | None = None) -> str | None:
    """Run one notebook into out_nb with the kernel ``kernel`` (:func:`kernel_for`); the error text, or None.

    ``hit`` is the state of :func:`_sigint_as_keyboardinterrupt`: while the kernel starts, a SIGINT / SIGTERM is held
    (:class:`_StartupGuard`) and delivered once nbclient owns the kernel's shutdown."""
    import asyncio

    import papermill

    try:
        from jupyter_core.utils import ensure_event_loop
    except ImportError:     # an older jupyter_core: nbclient's run_sync builds its loop (under the guard too)
        ensure_event_loop = None

    with _StartupGuard(hit) as startup:
        # the event loop that every run_sync of nbclient uses, built here, held signals and all: built by the first
        # run_sync, a KeyboardInterrupt could land half-way through its construction (its __del__ then printed a
        # traceback) or after the coroutine was made and before it ran ("coroutine ... was never awaited"). Not
        # where a loop runs already (run() called from a notebook): run_sync uses a thread of its own there
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if ensure_event_loop is not None:
                ensure_event_loop()
        with _kernel_env() as (cfg, km_class):
            try:
                papermill.execute_notebook(str(nb), str(out_nb), parameters=params, cwd=str(nb.parent),
                                           kernel_name=kernel, progress_bar=sys.stderr.isatty(), log_output=False,
                                           execution_timeout=timeout, report_mode=False, config=cfg,
                                           kernel_manager_class=km_class, on_cell_start=startup.release,
                                           shutdown_kernel="immediate")  # on Ctrl-C too: no kernel noise
            except papermill.PapermillExecutionError as e:
                return f"{e.ename}: {e.evalue}"
            except (KeyboardInterrupt, asyncio.CancelledError):
                raise       # a CancelledError is the held signal (startup.release): KeyboardInterrupt on the way out
            except Exception as e:  # kernel died, timeout, ...
                return f"{type(e).__name__}: {e}"
    return None


class _StartupGuard:
    """Holds SIGINT / SIGTERM while the kernel starts, and delivers it once the kernel's shutdown is in place.

    A KeyboardInterrupt raised wherever the signal lands during the start-up left the build half-stopped: in
    the middle of the event loop's construction (a traceback from the half-built loop's __del__), between a
    coroutine's creation and its run ("coroutine ... was never awaited"), or between the kernel's Popen and
    the provisioner recording the process (a kernel nobody kills, which prints into the build's stderr and
    lives on). nbclient only shuts the kernel down from inside ``setup_kernel``'s try, entered after the
    kernel and its client have started.

    So from the guard's entry (before the event loop and the kernel manager are built) the signal handler of
    :func:`_sigint_as_keyboardinterrupt` records the signal instead of raising. :meth:`release` is nbclient's
    ``on_cell_start`` hook, the first call inside that try: the hold ends there, and a held signal is raised as
    a CancelledError (a cancelled task, which asyncio does not report; a KeyboardInterrupt inside the task would
    be logged as 'Task exception was never retrieved'), so nbclient shuts the kernel down. A start-up that
    ends otherwise (the kernel did not start) ends the hold at the guard's exit. Either way the exit raises
    KeyboardInterrupt for a held signal, after :func:`_kernel_env` has killed any kernel still alive. A second
    signal while one is held is raised at once (Ctrl-C twice: a kernel that hangs while starting is not waited
    for)."""

    def __init__(self, hit: dict | None):
        self.hit = hit if hit is not None else {}
        self.holding = False

    def __enter__(self) -> "_StartupGuard":
        self.hit["held"] = None
        self.hit["hold"] = self.holding = True
        return self

    def release(self, **_) -> None:
        if self.holding:
            self.hit["hold"] = self.holding = False
            if self.hit.get("held") is not None:
                import asyncio

                raise asyncio.CancelledError("held signal")

    def __exit__(self, exc_type, exc, tb) -> None:
        self.hit["hold"] = self.holding = False
        if self.hit.get("held") is not None:
            self.hit["held"] = None
            raise KeyboardInterrupt from None


@contextmanager
def _sigint_as_keyboardinterrupt():
    """Ctrl-C reaches the kernel too (same process group) and may surface as a cell error: remember it. SIGTERM
    stops the build the same way (the temporary files go, the kernel is killed), with exit code 143."""
    hit = {"sigint": False, "signal": None, "hold": False, "held": None}
    if threading_main():
        old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def handler(signum, frame):
            hit["sigint"] = True
            hit["signal"] = signum
            if hit["hold"] and hit["held"] is None:   # the kernel is starting: delivered after (_StartupGuard)
                hit["held"] = signum
                return
            raise KeyboardInterrupt

        for sig in old:
            signal.signal(sig, handler)
        try:
            yield hit
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
    else:
        yield hit


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


SCRATCH = "scratch"


def scratch_dir(out_dir: Path) -> Path:
    """Where stand-in renders go: ``<out>/scratch/`` (its own index), never over a published page."""
    return Path(out_dir) / SCRATCH


def is_stand_in(nb: Path, params: dict, notes: dict) -> bool:
    """A render that must not replace the published page: the notebook said so (``report.banner(...,
    stand_in=True)``), or a round that replays GPU data was run with ``mode=cpu`` (a CPU stand-in)."""
    if notes.get("stand_in"):
        return True
    if params.get("mode") != "cpu" and notes.get("mode") != "cpu":
        return False
    try:
        return bool(rounds.module(Path(nb).stem).DATA)
    except (rounds.RoundError, ImportError):
        return False


def check_out_dir(out_dir) -> Path:
    """The output folder of ``run``: not empty, not an existing file, and not inside the data root (pages and an
    index written among the recorded runs would corrupt the record). PipelineError otherwise."""
    if out_dir is None or not str(out_dir).strip():
        raise PipelineError("--out is empty: give an output folder (default reports/)")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PipelineError(f"--out {out}: exists and is not a folder")
    data = records.data_root().resolve()
    o = out.resolve()
    if o == data or data in o.parents:
        raise PipelineError(f"--out {out}: inside the data folder {data} -- the record holds recorded runs only; "
                            "write the pages elsewhere (default reports/)")
    return out


def run(names=(), pairs=(), files=(), out_dir: Path = REPORTS_DIR, notebooks_dir: Path = NOTEBOOKS_DIR,
        timeout: int | None = None) -> int:
    import nbformat

    try:
        out_dir = check_out_dir(out_dir)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1):
            raise PipelineError(f"--timeout {timeout!r}: a per-cell timeout is a whole number of seconds >= 1 "
                                "(leave it out for no limit)")
        nbs = resolve(names, notebooks_dir)
        all_nbs = discover(notebooks_dir)
        glob, per = load_params(pairs, files, notebooks_dir)
        unsynced = {nb.name: d for nb in nbs if (d := pair_differences(nb))}
        if unsynced:
            raise PipelineError("notebook pairs out of sync (run `python3 lab.py sync`, or save in JupyterLab):\n  "
                                + "\n  ".join(f"{k}: {'; '.join(v[:3])}" for k, v in unsynced.items()))
        given = check_params(nbs, glob, per)
        kernels = {nb: kernel_for(nb) for nb in nbs}    # each runs this interpreter, checked before anything runs
        out_dir.mkdir(parents=True, exist_ok=True)
        load_state(out_dir)  # a corrupt index stops us before anything runs
    except PipelineError as e:
        print(f"labkernels report run: error: {e}", file=sys.stderr)
        return 2
    failures = standins = 0
    noted = set()
    current: list[Path] = []
    nb = nbs[0] if nbs else None
    with _sigint_as_keyboardinterrupt() as hit:
        try:
            for i, nb in enumerate(nbs, 1):
                name, params = nb.stem, given[nb.stem]
                ignored = sorted(set(glob) - set(params))
                print(f"[{i}/{len(nbs)}] {name}: running" + (f" with {params}" if params else "")
                      + (f" (not a parameter here: {', '.join(ignored)})" if ignored else ""), flush=True)
                tmp_nb = _tmp_name(out_dir, name, ".ipynb")
                current[:] = [tmp_nb]
                t0 = time.time()
                kernel, knote = kernels[nb]
                if knote and knote not in noted:
                    noted.add(knote)
                    print(f"  kernel: {knote}", flush=True)
                error = _execute(nb, tmp_nb, params, timeout, kernel, hit)
                if hit["sigint"]:
                    raise KeyboardInterrupt
                dt = time.time() - t0
                notes, pages = {}, None
                if tmp_nb.exists():
                    try:
                        ex = nbformat.read(str(tmp_nb), as_version=4)
                        notes = collect_notes(ex)
                        ex.metadata[NOTE_KEY] = notes
                        nbformat.write(ex, str(tmp_nb))
                        nav = _nav(all_nbs, nb, "failed" if error else "ok", params)
                        if error:   # the failed render is one page, whatever its tags: the traceback in it
                            for c in ex.cells:
                                c.metadata["tags"] = [t for t in c.metadata.get("tags", []) if not t.startswith(PAGE_TAG)]
                        pages = render_html(ex, nav)
                    except Exception as e:  # rendering problems are failures too
                        error = error or f"HTML rendering failed: {type(e).__name__}: {e}"
                standin = not error and is_stand_in(nb, params, notes)
                dest = scratch_dir(out_dir) if standin else out_dir
                dest.mkdir(parents=True, exist_ok=True)
                stem = name if not error else f"{name}.failed"
                if pages is not None:
                    tmp_pages = {}
                    for page, text in pages.items():
                        t = _tmp_name(dest, page_file(stem, page)[:-5], ".html")
                        current.append(t)
                        t.write_text(text, encoding="utf-8")
                        tmp_pages[page_file(stem, page)] = t
                    os.replace(tmp_nb, dest / f"{stem}.ipynb")
                    for fname, t in tmp_pages.items():
                        os.replace(t, dest / fname)
                    if not error:   # pages a split no longer makes
                        for stale in dest.glob(f"{name}_*.html"):
                            if stale.name not in tmp_pages:
                                stale.unlink(missing_ok=True)
                    notes["pages"] = [f for f in tmp_pages if f != f"{stem}.html"]
                elif error:  # nothing to show (the kernel did not start): no stale failed page either
                    for stale in (f"{name}.failed.html", f"{name}.failed.ipynb"):
                        (out_dir / stale).unlink(missing_ok=True)
                if not error:
                    for stale in (f"{name}.failed.html", f"{name}.failed.ipynb"):
                        (dest / stale).unlink(missing_ok=True)
                entry = {"status": "failed" if error else "ok", "error": error, "seconds": round(dt, 1),
                         "params": params, "kernel": kernel, "rendered": provenance.utc_now(),
                         "render_machine": provenance.describe(provenance.collect()), **notes}
                if standin:
                    entry["stand_in"] = True
                update_state(dest, name, entry, notebooks_dir)
                for p in current:
                    p.unlink(missing_ok=True)
                current.clear()
                if error:
                    failures += 1
                    print(f"[{i}/{len(nbs)}] {name}: FAILED after {dt:.1f} s: {error} -> {out_dir / (stem + '.html')}"
                          + (" (the last good page stays)" if (out_dir / f"{name}.html").exists() else ""), flush=True)
                elif standin:
                    standins += 1
                    print(f"[{i}/{len(nbs)}] {name}: ok ({dt:.1f} s, mode {notes.get('mode', '-')}): a STAND-IN render "
                          f"-> {dest / (name + '.html')} (scratch: the published page, {out_dir / 'index.json'}, "
                          f"the README and data/ are unchanged)", flush=True)
                else:
                    extra = "".join(f", {out_dir / p}" for p in notes.get("pages", []))
                    print(f"[{i}/{len(nbs)}] {name}: ok ({dt:.1f} s, mode {notes.get('mode', '-')}) -> "
                          f"{out_dir / (name + '.html')}{extra}", flush=True)
        except KeyboardInterrupt:
            import logging

            # the kernel client's tasks that were cut off (a kernel killed mid-cell: DeadKernelError) are reported by
            # asyncio as "Task exception was never retrieved" with a traceback when they are collected: noise here
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
            term = hit.get("signal") == signal.SIGTERM
            print(f"\n{'terminated (SIGTERM)' if term else 'interrupted'}: {nb.stem if nb else 'the build'} was not "
                  f"rendered and nothing of it was written; {out_dir} holds the pages finished before",
                  file=sys.stderr, flush=True)
            return 143 if term else 130
        except PipelineError as e:
            print(f"labkernels report run: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:     # a full disk, a read-only folder: said, and nothing partial left
            what = f"{e.strerror or e}" + (f": {e.filename}" if getattr(e, "filename", None) else "")
            print(f"labkernels report run: error: cannot write the reports ({what}); "
                  f"{nb.stem if nb else 'the build'} was not rendered, and no temporary file is left in {out_dir}",
                  file=sys.stderr, flush=True)
            return 2
        finally:
            for p in current:    # every way out: no hidden temporary file stays in the reports folder
                p.unlink(missing_ok=True)
            _sweep_tmp(out_dir)
    if hit["signal"] is not None:   # a signal whose KeyboardInterrupt some library code swallowed: never exit 0
        term = hit["signal"] == signal.SIGTERM
        print(f"\n{'terminated (SIGTERM)' if term else 'interrupted'} as the build finished (library code swallowed "
              f"the interrupt, so the build ran on): the pages listed above were written", file=sys.stderr, flush=True)
        return 143 if term else 130
    scratch = f"; stand-in renders: {scratch_dir(out_dir) / 'index.html'}" if standins else ""
    print(f"index: {out_dir / 'index.html'} ({len(nbs) - failures - standins} ok, {failures} failed{scratch})")
    return 1 if failures else 0


def main(args) -> int:
    if not str(args.out).strip():
        raise PipelineError("--out is empty: give an output folder (default reports/)")
    return run(args.notebooks, args.param, args.params_file, Path(args.out), timeout=args.timeout)


def _results_table_main(args) -> int:
    if args.allow_fewer and not args.write:
        raise PipelineError("--allow-fewer only means something with --write README")
    index = Path(args.index)
    if not index.exists():
        raise PipelineError(f"{index} does not exist: build the reports first (python3 lab.py reports)")
    state = read_index(index)          # the file named, never another one of its folder
    table = results_table(state)
    if args.write is not None:
        readme = Path(args.write)
        text = paths.read_small_file(readme, PipelineError, "README")   # no FIFO, device, directory or empty file
        old = {n: h for n, h in table_rounds(readme_table(text)).items() if h != "not rendered"}
        # a round counts as rendered in the index only when its entry is ok: a failed one would replace the README's
        # headline with its error
        # (and says something: an empty headline would replace the README's with '-')
        ok_rounds = {int(k[:2]) for k, v in state.items()
                     if re.match(r"\d\d_", k) and v.get("status") == "ok" and v.get("headline")}
        new = {n: h for n, h in table_rounds(table).items() if h != "not rendered" and n in ok_rounds}
        lost = sorted(set(old) - set(new))
        if lost and not args.allow_fewer:
            raise PipelineError(
                f"refusing to rewrite {readme}: {index} holds {len(new)} rendered (ok) round(s), the README's table "
                f"{len(old)}; round(s) {', '.join(map(str, lost))} would lose their headline (not rendered or failed in this index) (e.g. round {lost[0]}: "
                f"{old[lost[0]][:80]!r}). Render them into this index first, or pass --allow-fewer to drop them on "
                "purpose; nothing was written")
        atomic_write(readme, replace_readme_table(text, table))
        print(f"{readme}: results table rewritten from {index}"
              + (f" (rounds {', '.join(map(str, lost))} dropped on purpose: --allow-fewer)" if lost else ""))
    else:
        print(table, end="")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("run", help="execute round notebooks headless into reports/ (HTML + index)")
    p.add_argument("notebooks", nargs="*", help="notebook names or prefixes (default: all rounds)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="parameter for every notebook that declares it (YAML value)")
    p.add_argument("-f", "--params-file", action="append", default=[], metavar="YAML",
                   help="YAML file of parameters (top-level, or per-notebook sections)")
    p.add_argument("--out", default=str(REPORTS_DIR), help="output folder (default reports/)")
    p.add_argument("--timeout", type=int, default=None, help="per-cell timeout in seconds")
    p.set_defaults(func=main)
    p = sub.add_parser("results-table", help="the README's results table from reports/index.json")
    p.add_argument("--index", default=str(REPORTS_DIR / "index.json"), help="the reports index to read")
    p.add_argument("--write", metavar="README", default=None, help="rewrite the table in this README in place "
                   "(refused when the index has fewer rendered rounds than the README's table)")
    p.add_argument("--allow-fewer", action="store_true",
                   help="with --write: rewrite even where rounds of the README's table are not in the index")
    p.set_defaults(func=_results_table_main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(sys.argv[1:]))
