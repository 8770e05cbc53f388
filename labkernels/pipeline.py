"""The headless report pipeline: notebooks -> papermill -> HTML (code folded) -> reports/index.html.

``labkernels run [NOTEBOOK ...] [-p name=value ...] [-f params.yaml]`` executes each round notebook
with papermill into ``reports/<name>.ipynb``, renders ``reports/<name>.html`` with the code folded
behind a "code" toggle, and rewrites ``reports/index.html`` listing every round with its status, its
headline figures and provenance. A failing notebook is rendered too (its traceback is in the page),
marked failed on the index, and makes the command exit non-zero; the other notebooks still run.

Parameters given with -p/-f are passed to each notebook that declares them in its ``parameters``
cell (others ignore them), so ``-p mode=replay`` applies to every GPU round at once. A YAML file may
also hold per-notebook sections: ``{"03_q6k_expanded_b": {"repeats": 50}}``.
"""

from __future__ import annotations

import html
import json
import os
import sys
import time
from pathlib import Path

from . import provenance
from .paths import NOTEBOOKS_DIR, PACKAGE_DIR, REPORTS_DIR

TEMPLATE_DIR = PACKAGE_DIR / "templates"


def discover(notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    return sorted(p for p in Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb"))


def resolve(names, notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    allnb = discover(notebooks_dir)
    if not names:
        return allnb
    out = []
    for n in names:
        p = Path(n)
        if p.suffix == ".ipynb" and p.exists():
            out.append(p.resolve())
            continue
        hits = [q for q in allnb if q.stem == n or q.stem.startswith(n) or q.name == n]
        if len(hits) != 1:
            raise SystemExit(f"notebook {n!r}: {'no match' if not hits else 'ambiguous: ' + str(hits)} "
                             f"among {[q.name for q in allnb]}")
        out.append(hits[0])
    return out


def parse_value(v: str):
    """-p values: YAML scalars/lists ('3', '[64, 128]', 'true', 'replay')."""
    import yaml

    try:
        return yaml.safe_load(v)
    except yaml.YAMLError:
        return v


def load_params(pairs, files) -> tuple[dict, dict]:
    """Global params and per-notebook params from -p pairs and -f YAML files."""
    import yaml

    glob, per = {}, {}
    for f in files or []:
        data = yaml.safe_load(Path(f).read_text()) or {}
        if not isinstance(data, dict):
            raise SystemExit(f"{f}: expected a mapping of parameters")
        for k, v in data.items():
            if isinstance(v, dict) and (NOTEBOOKS_DIR / f"{k}.ipynb").exists():
                per[k] = v
            else:
                glob[k] = v
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"-p expects name=value, got {pair!r}")
        k, v = pair.split("=", 1)
        glob[k.strip()] = parse_value(v)
    return glob, per


def declared_parameters(nb_path: Path) -> dict:
    import papermill

    return papermill.inspect_notebook(str(nb_path))


def render_html(ipynb: Path, html_path: Path) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(ipynb), as_version=4)
    exporter = HTMLExporter(template_name="labfold", extra_template_basedirs=[str(TEMPLATE_DIR)])
    body, _ = exporter.from_notebook_node(nb)
    html_path.write_text(body)


def run(names=(), pairs=(), files=(), out_dir: Path = REPORTS_DIR, notebooks_dir: Path = NOTEBOOKS_DIR,
        timeout: int | None = None) -> int:
    import papermill

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nbs = resolve(names, notebooks_dir)
    glob, per = load_params(pairs, files)
    state = _load_state(out_dir)
    failures = 0
    for i, nb in enumerate(nbs, 1):
        name = nb.stem
        declared = declared_parameters(nb)
        params = {k: v for k, v in {**glob, **per.get(name, {})}.items() if k in declared}
        ignored = sorted(set(glob) - set(declared))
        print(f"[{i}/{len(nbs)}] {name}: running" + (f" with {params}" if params else "")
              + (f" (not a parameter here: {', '.join(ignored)})" if ignored else ""), flush=True)
        out_nb = out_dir / f"{name}.ipynb"
        meta_file = out_dir / f".{name}.headline.json"
        meta_file.unlink(missing_ok=True)
        os.environ["LABKERNELS_HEADLINE_FILE"] = str(meta_file)
        t0 = time.time()
        error = None
        try:
            papermill.execute_notebook(str(nb), str(out_nb), parameters=params, cwd=str(nb.parent),
                                       kernel_name="python3", progress_bar=False, log_output=False,
                                       execution_timeout=timeout, report_mode=False)
        except papermill.PapermillExecutionError as e:
            error = f"{e.ename}: {e.evalue}"
        except Exception as e:  # kernel died, bad parameters, ...
            error = f"{type(e).__name__}: {e}"
        finally:
            os.environ.pop("LABKERNELS_HEADLINE_FILE", None)
        dt = time.time() - t0
        try:
            if out_nb.exists():
                render_html(out_nb, out_dir / f"{name}.html")
        except Exception as e:  # rendering problems are failures too
            error = error or f"HTML rendering failed: {type(e).__name__}: {e}"
        head = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        meta_file.unlink(missing_ok=True)
        state[name] = {
            "status": "failed" if error else "ok", "error": error, "seconds": round(dt, 1),
            "params": params, "rendered": provenance.utc_now(),
            "render_machine": provenance.describe(provenance.collect()),
            **head,
        }
        if error:
            failures += 1
            print(f"[{i}/{len(nbs)}] {name}: FAILED after {dt:.1f} s: {error}", flush=True)
        else:
            print(f"[{i}/{len(nbs)}] {name}: ok ({dt:.1f} s, mode {head.get('mode', '-')}) -> "
                  f"{out_dir / (name + '.html')}", flush=True)
        _save_state(out_dir, state)
        write_index(out_dir, state, notebooks_dir)
    print(f"index: {out_dir / 'index.html'} ({len(nbs) - failures} ok, {failures} failed)")
    return 1 if failures else 0


def _load_state(out_dir: Path) -> dict:
    p = out_dir / "index.json"
    if p.exists():
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError:
            return {}
    return {}


def _save_state(out_dir: Path, state: dict) -> None:
    (out_dir / "index.json").write_text(json.dumps(state, indent=1, default=str))


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


def write_index(out_dir: Path, state: dict, notebooks_dir: Path = NOTEBOOKS_DIR) -> Path:
    rows = []
    for nb in discover(notebooks_dir):
        s = state.get(nb.stem)
        title = html.escape(_title(nb))
        if not s:
            rows.append(f"<tr><td>{nb.stem}</td><td>{title}</td><td class='nr'>not run</td><td></td><td></td></tr>")
            continue
        status = s["status"]
        cls = "ok" if status == "ok" else "bad"
        link = f"<a href='{nb.stem}.html'>{nb.stem}</a>" if (Path(out_dir) / f"{nb.stem}.html").exists() else nb.stem
        heads = "".join(f"<div><b>{html.escape(k)}</b>: {html.escape(str(v))}</div>"
                        for k, v in (s.get("headline") or {}).items())
        if s.get("error"):
            heads += f"<div class='err'>{html.escape(s['error'][:400])}</div>"
        mode = s.get("mode") or "-"
        prov = html.escape(s.get("provenance") or "")
        run_id = s.get("run_id")
        rendered = html.escape(f"rendered {s.get('rendered')} on {s.get('render_machine')}")
        rows.append(
            f"<tr><td>{link}</td><td>{title}</td><td class='{cls}'>{status}<br><small>{mode}</small></td>"
            f"<td>{heads}</td><td><small>{prov}" + (f"<br>run {html.escape(run_id)}" if run_id else "")
            + f"<br>{rendered}</small></td></tr>")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>labkernels reports</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}} table{{border-collapse:collapse}}
td,th{{border:1px solid #bbb;padding:6px 10px;vertical-align:top}} .ok{{background:#d1e7dd}}
.bad{{background:#f8d7da}} .nr{{color:#777}} .err{{color:#a00;font-family:monospace;font-size:0.85em}}</style>
</head><body><h1>labkernels &mdash; rounds</h1>
<p>Each round is a parameterized notebook under <code>notebooks/</code>; this index was written
{provenance.utc_now()} on {html.escape(provenance.describe(provenance.collect()))}.
Mode <b>replay</b> means the page re-renders measurements recorded on a GPU (see its banner);
<b>measure</b> means it measured while rendering; <b>cpu</b> means it needs no GPU.</p>
<table><tr><th>round</th><th>title</th><th>status</th><th>headline</th><th>provenance</th></tr>
{''.join(rows)}</table></body></html>"""
    p = Path(out_dir) / "index.html"
    p.write_text(page)
    return p


def main(args) -> int:
    return run(args.notebooks, args.param, args.params_file, Path(args.out), timeout=args.timeout)


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(sys.argv[1:]))
