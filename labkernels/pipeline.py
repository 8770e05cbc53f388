"""The headless report pipeline: notebooks -> papermill -> HTML (code folded) -> reports/index.html.

``labkernels run [NOTEBOOK ...] [-p name=value ...] [-f params.yaml]`` executes each round notebook
with papermill, renders ``reports/<name>.html`` with the code folded behind a "code" toggle and a
navigation bar, and updates ``reports/index.html`` / ``reports/index.json`` with the round's status, its
headline figures and provenance.

* Parameters given with -p/-f are checked against every selected notebook's ``parameters`` cell before
  any cell runs: a name no selected notebook declares, or a value of the wrong type, is an error that
  lists the parameters and their types. A notebook that does not declare a given name ignores it, so
  ``-p mode=replay`` applies to every GPU round at once. A YAML file may also hold per-notebook sections:
  ``{"03_q6k_expanded_b": {"repeats": 50}}`` (checked strictly against that notebook).
* A failing notebook is rendered to ``reports/<name>.failed.html`` (its traceback is in the page); the
  last good ``reports/<name>.html`` stays, the index links both, and the command exits non-zero; the
  other notebooks still run.
* Every file is written under a per-process temporary name and renamed into place; the index is updated
  under a lock (read, merge this round, write), so concurrent builds cannot corrupt each other. Ctrl-C
  stops with exit code 130 and leaves nothing partial behind. A corrupt ``index.json`` is an error.
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

from . import provenance
from .paths import NOTEBOOKS_DIR, PACKAGE_DIR, REPORTS_DIR

TEMPLATE_DIR = PACKAGE_DIR / "templates"
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
NOTE_KEY = "labkernels"  # = report.NOTE_KEY (kept literal so importing the pipeline stays light)


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
        try:
            data = yaml.safe_load(Path(f).read_text()) or {}
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


def parse_type(annotation: str):
    """'int' | 'float' | 'str' | 'bool' | 'list' | 'List[T]' | 'Optional[T]' -> a type spec tuple."""
    a = annotation.strip().strip("'\"")
    simple = {"int": ("int",), "float": ("float",), "str": ("str",), "bool": ("bool",),
              "list": ("list", ("any",)), "List": ("list", ("any",)), "Any": ("any",), "None": ("none",)}
    if a in simple:
        return simple[a]
    m = _GENERIC.match(a)
    if m and m.group(1) in ("List", "list"):
        return ("list", parse_type(m.group(2)))
    if m and m.group(1) == "Optional":
        return ("optional", parse_type(m.group(2)))
    raise PipelineError(f"unsupported parameter annotation {annotation!r} (use int, float, str, bool, "
                        f"List[...], Optional[...])")


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
    return kind


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
    raise AssertionError(spec)


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
        if not type_ok(default, spec):
            raise PipelineError(f"{Path(nb_path).name}: parameter {name!r} default {default!r} is not {type_name(spec)}")
        out[name] = {"type": spec, "default": default, "help": p.help}
    return out


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
    from .report import MODES

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
        for k, v in given.items():
            if not type_ok(v, d[k]["type"]):
                errors.append(f"{nb.stem}: {k} must be {type_name(d[k]['type'])}, got {v!r} ({type(v).__name__})")
            elif k == "mode" and v not in MODES:
                errors.append(f"{nb.stem}: mode must be one of {', '.join(MODES)}, got {v!r}")
        out[nb.stem] = given
    if errors:
        listing = "\n".join(describe_parameters(n, d) for n, d in declared.items())
        raise PipelineError("bad parameters (nothing was run):\n  " + "\n  ".join(errors)
                            + f"\nparameters of the selected notebooks (name, type, default):\n{listing}")
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


@contextmanager
def index_lock(out_dir: Path, timeout: float = 600):
    from filelock import FileLock, Timeout

    lock = FileLock(str(Path(out_dir) / ".index.lock"))
    try:
        with lock.acquire(timeout=timeout):
            yield
    except Timeout:
        raise PipelineError(f"{out_dir}: another report build has held the index lock for {timeout:.0f} s") from None


def load_state(out_dir: Path) -> dict:
    """reports/index.json, strictly: a missing file is an empty index, an unreadable one an error."""
    p = Path(out_dir) / "index.json"
    if not p.exists():
        return {}
    try:
        state = json.loads(p.read_text(encoding="utf-8"))
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
    try:
        import nbformat

        for c in nbformat.read(str(nb), as_version=4).cells:
            if c.cell_type == "markdown":
                for line in c.source.splitlines():
                    if line.startswith("#"):
                        return line.lstrip("# ").strip()
    except Exception:
        pass
    return nb.stem


def _jinja():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR / "index")),
                              autoescape=jinja2.select_autoescape(["html", "j2"]))


def write_index(out_dir: Path, state: dict, notebooks_dir: Path = NOTEBOOKS_DIR) -> Path:
    out_dir = Path(out_dir)
    rounds = []
    for nb in discover(notebooks_dir):
        s = state.get(nb.stem) or {}
        rounds.append({
            "name": nb.stem, "title": _title(nb), "state": s,
            "page": f"{nb.stem}.html" if (out_dir / f"{nb.stem}.html").exists() else None,
            "failed_page": f"{nb.stem}.failed.html" if (out_dir / f"{nb.stem}.failed.html").exists() else None,
        })
    page = _jinja().get_template("index.html.j2").render(
        rounds=rounds, written=provenance.utc_now(), machine=provenance.describe(provenance.collect()))
    p = out_dir / "index.html"
    atomic_write(p, page)
    return p


def results_table(state: dict, notebooks_dir: Path = NOTEBOOKS_DIR) -> str:
    """The README's "where the lab stands" table, from an index: one row per round, its headline."""
    lines = ["| round | headline (from `reports/index.json`) |", "|---|---|"]
    for nb in discover(notebooks_dir):
        s = state.get(nb.stem) or {}
        if s.get("status") == "ok":
            head = "; ".join(f"{k}: {v}" for k, v in (s.get("headline") or {}).items()) or "-"
            mode = f" ({s['mode']})" if s.get("mode") else ""
        else:
            head, mode = "not rendered" if not s else f"{s.get('status')}: {s.get('error')}", ""
        lines.append(f"| {int(nb.stem[:2])} {_title(nb).split('—', 1)[-1].strip()}{mode} | {head.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


README_BEGIN = "<!-- results-table: generated by `labkernels results-table --write` from reports/index.json -->"
README_END = "<!-- /results-table -->"


def replace_readme_table(readme: str, table: str) -> str:
    if README_BEGIN not in readme or README_END not in readme:
        raise PipelineError(f"README has no results-table markers ({README_BEGIN} ... {README_END})")
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


def render_html(nb, nav: dict | None = None) -> str:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="labfold", extra_template_basedirs=[str(TEMPLATE_DIR)],
                            exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"lk_nav": nav or {}})
    return body


def _nav(nbs_all: list[Path], nb: Path, status: str, params: dict) -> dict:
    stems = [p.stem for p in nbs_all]
    i = stems.index(nb.stem) if nb.stem in stems else -1
    prev = (f"{stems[i - 1]}.html", _title(nbs_all[i - 1])) if i > 0 else None
    nxt = (f"{stems[i + 1]}.html", _title(nbs_all[i + 1])) if 0 <= i < len(stems) - 1 else None
    from .report import params_text

    return {"index": "index.html", "prev": prev, "next": nxt, "title": _title(nb), "status": status,
            "params": params_text(params) if params else ""}


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
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    d = tempfile.mkdtemp(prefix="lk-kernel-")
    cfg = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(d, "k")}}) if os.name == "posix" else Config()
    try:
        yield cfg, RecordedKernelManager
    finally:
        if saved is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = saved
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


def _execute(nb: Path, out_nb: Path, params: dict, timeout: int | None, kernel: str = "python3") -> str | None:
    """Run one notebook into out_nb with the kernel ``kernel`` (:func:`kernel_for`); the error text, or None."""
    import papermill

    with _kernel_env() as (cfg, km_class):
        try:
            papermill.execute_notebook(str(nb), str(out_nb), parameters=params, cwd=str(nb.parent),
                                       kernel_name=kernel, progress_bar=sys.stderr.isatty(), log_output=False,
                                       execution_timeout=timeout, report_mode=False, config=cfg,
                                       kernel_manager_class=km_class,
                                       shutdown_kernel="immediate")  # on Ctrl-C too: no kernel noise
        except papermill.PapermillExecutionError as e:
            return f"{e.ename}: {e.evalue}"
        except KeyboardInterrupt:
            raise
        except Exception as e:  # kernel died, timeout, ...
            return f"{type(e).__name__}: {e}"
    return None


@contextmanager
def _sigint_as_keyboardinterrupt():
    """Ctrl-C reaches the kernel too (same process group) and may surface as a cell error: remember it."""
    hit = {"sigint": False}
    if threading_main():
        old = signal.getsignal(signal.SIGINT)

        def handler(signum, frame):
            hit["sigint"] = True
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, handler)
        try:
            yield hit
        finally:
            signal.signal(signal.SIGINT, old)
    else:
        yield hit


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def run(names=(), pairs=(), files=(), out_dir: Path = REPORTS_DIR, notebooks_dir: Path = NOTEBOOKS_DIR,
        timeout: int | None = None) -> int:
    import nbformat

    out_dir = Path(out_dir)
    try:
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
        print(f"labkernels run: error: {e}", file=sys.stderr)
        return 2
    failures, noted = 0, set()
    current: list[Path] = []
    nb = nbs[0] if nbs else None
    with _sigint_as_keyboardinterrupt() as hit:
        try:
            for i, nb in enumerate(nbs, 1):
                name, params = nb.stem, given[nb.stem]
                ignored = sorted(set(glob) - set(params))
                print(f"[{i}/{len(nbs)}] {name}: running" + (f" with {params}" if params else "")
                      + (f" (not a parameter here: {', '.join(ignored)})" if ignored else ""), flush=True)
                tmp_nb, tmp_html = _tmp_name(out_dir, name, ".ipynb"), _tmp_name(out_dir, name, ".html")
                current[:] = [tmp_nb, tmp_html]
                t0 = time.time()
                kernel, knote = kernels[nb]
                if knote and knote not in noted:
                    noted.add(knote)
                    print(f"  kernel: {knote}", flush=True)
                error = _execute(nb, tmp_nb, params, timeout, kernel)
                if hit["sigint"]:
                    raise KeyboardInterrupt
                dt = time.time() - t0
                notes, html_text = {}, None
                if tmp_nb.exists():
                    try:
                        ex = nbformat.read(str(tmp_nb), as_version=4)
                        notes = collect_notes(ex)
                        ex.metadata[NOTE_KEY] = notes
                        nbformat.write(ex, str(tmp_nb))
                        html_text = render_html(ex, _nav(all_nbs, nb, "failed" if error else "ok", params))
                    except Exception as e:  # rendering problems are failures too
                        error = error or f"HTML rendering failed: {type(e).__name__}: {e}"
                stem = name if not error else f"{name}.failed"
                if html_text is not None:
                    tmp_html.write_text(html_text, encoding="utf-8")
                    os.replace(tmp_nb, out_dir / f"{stem}.ipynb")
                    os.replace(tmp_html, out_dir / f"{stem}.html")
                elif error:  # nothing to show (the kernel did not start): no stale failed page either
                    for stale in (f"{name}.failed.html", f"{name}.failed.ipynb"):
                        (out_dir / stale).unlink(missing_ok=True)
                if not error:
                    for stale in (f"{name}.failed.html", f"{name}.failed.ipynb"):
                        (out_dir / stale).unlink(missing_ok=True)
                entry = {"status": "failed" if error else "ok", "error": error, "seconds": round(dt, 1),
                         "params": params, "kernel": kernel, "rendered": provenance.utc_now(),
                         "render_machine": provenance.describe(provenance.collect()), **notes}
                update_state(out_dir, name, entry, notebooks_dir)
                for p in current:
                    p.unlink(missing_ok=True)
                current.clear()
                if error:
                    failures += 1
                    print(f"[{i}/{len(nbs)}] {name}: FAILED after {dt:.1f} s: {error} -> {out_dir / (stem + '.html')}"
                          + (" (the last good page stays)" if (out_dir / f"{name}.html").exists() else ""), flush=True)
                else:
                    print(f"[{i}/{len(nbs)}] {name}: ok ({dt:.1f} s, mode {notes.get('mode', '-')}) -> "
                          f"{out_dir / (name + '.html')}", flush=True)
        except KeyboardInterrupt:
            for p in current:
                p.unlink(missing_ok=True)
            print(f"\ninterrupted: {nb.stem if nb else 'the build'} was not rendered and nothing of it was written; {out_dir} holds "
                  f"the pages finished before", file=sys.stderr, flush=True)
            return 130
        except PipelineError as e:
            print(f"labkernels run: error: {e}", file=sys.stderr)
            return 2
    print(f"index: {out_dir / 'index.html'} ({len(nbs) - failures} ok, {failures} failed)")
    return 1 if failures else 0


def main(args) -> int:
    return run(args.notebooks, args.param, args.params_file, Path(args.out), timeout=args.timeout)


def _results_table_main(args) -> int:
    index = Path(args.index)
    if not index.exists():
        raise PipelineError(f"{index} does not exist: build the reports first (python3 lab.py reports)")
    table = results_table(load_state(index.parent))
    if args.write:
        readme = Path(args.write)
        atomic_write(readme, replace_readme_table(readme.read_text(encoding="utf-8"), table))
        print(f"{readme}: results table rewritten from {index}")
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
    p.add_argument("--index", default=str(REPORTS_DIR / "index.json"))
    p.add_argument("--write", metavar="README", default=None, help="rewrite the table in this README in place")
    p.set_defaults(func=_results_table_main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(sys.argv[1:]))
