"""Helpers the round notebooks call: mode resolution, the replay banner, headline figures, provenance.

Notebook conventions (every round notebook follows them):

* a cell tagged ``parameters`` (papermill) with at least ``mode = "auto"`` for GPU rounds;
* ``mode``: ``measure`` runs on the GPU and records a new run under ``data/<round>/``; ``replay`` renders
  the latest recorded run (a banner says so, with the run's GPU, commit and date); ``auto`` measures when
  a GPU is present and replays otherwise. CPU rounds compute everything live (mode ``cpu``);
* ``report.headline(...)`` declares the figures that ``reports/index.html`` shows for the round;
* ``report.footer(prov)`` ends the page with the provenance of every number on it.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

from . import provenance

MODES = ("auto", "measure", "replay", "cpu")


class ModeError(RuntimeError):
    pass


def resolve_mode(mode: str, round_name: str | None = None) -> str:
    """auto -> measure on a GPU machine, replay elsewhere; measure without a GPU is an error."""
    if mode not in MODES:
        raise ModeError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "auto":
        mode = "measure" if provenance.gpu_available() else "replay"
    if mode == "measure" and not provenance.gpu_available():
        raise ModeError("mode='measure' needs a CUDA GPU with cupy; this machine has none "
                        "(use mode='replay' to render recorded runs)")
    if mode == "replay" and round_name:
        from . import records

        if records.latest(round_name) is None:
            raise ModeError(f"mode='replay' but no complete recorded run of round {round_name!r} under "
                            f"{records.data_root() / round_name}; measure it on a GPU first")
    _note("mode", mode)
    return mode


def _display_html(s: str):
    try:
        from IPython.display import HTML, display

        display(HTML(s))
    except ImportError:  # plain Python
        print(s)


def banner(mode: str, run=None, note: str = "") -> None:
    """A visible banner at the top of a round's page saying where its numbers come from."""
    if mode == "replay":
        what = (f"<b>REPLAY</b> &mdash; this page was rendered on a machine without a GPU from the recorded "
                f"run <code>{html.escape(run.run_id)}</code>: {html.escape(provenance.describe(run.provenance))}."
                if run else "<b>REPLAY</b> &mdash; rendered from recorded data.")
        color = "#fff3cd"
    elif mode == "measure":
        what = ("<b>MEASURE</b> &mdash; the numbers on this page were measured while it was rendered"
                + (f" and recorded as run <code>{html.escape(run.run_id)}</code>" if run else "") + ".")
        color = "#d1e7dd"
    else:
        what = "<b>CPU</b> &mdash; everything on this page was computed while it was rendered."
        color = "#e2e3e5"
    _display_html(f'<div style="background:{color};border:1px solid #999;padding:8px 12px;'
                  f'margin:6px 0;font-size:1.05em">{what} {html.escape(note)}</div>')
    _note("run_id", run.run_id if run else None)
    if run is not None:
        _note("provenance", provenance.describe(run.provenance))


def _headline_file() -> Path | None:
    p = os.environ.get("LABKERNELS_HEADLINE_FILE")
    return Path(p) if p else None


def _note(key, value) -> None:
    p = _headline_file()
    if not p:
        return
    data = json.loads(p.read_text()) if p.exists() else {}
    data[key] = value
    p.write_text(json.dumps(data, indent=1, default=str))


def headline(**figures) -> None:
    """Declare the round's headline figures (shown on reports/index.html and in the page)."""
    p = _headline_file()
    if p:
        data = json.loads(p.read_text()) if p.exists() else {}
        data.setdefault("headline", {}).update({k: _fmt(v) for k, v in figures.items()})
        p.write_text(json.dumps(data, indent=1, default=str))
    rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>"
                   for k, v in figures.items())
    _display_html(f"<table>{rows}</table>")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def footer(prov: dict | None = None) -> None:
    """Provenance line(s) for the end of the page: this render, and the recorded run it replays if any."""
    here = provenance.collect()
    lines = [f"Rendered: {provenance.describe(here)}"]
    if prov:
        lines.append(f"Measurements: {provenance.describe(prov)}")
        if prov.get("params"):
            lines.append("Parameters: " + json.dumps(prov["params"], default=str))
    _note("provenance", provenance.describe(prov or here))
    _display_html("<hr><div style='font-size:0.85em;color:#444'>" +
                  "<br>".join(html.escape(s) for s in lines) + "</div>")
