"""Helpers the round notebooks call: mode resolution, the replay banner, headline figures, tables, provenance.

Notebook conventions (every round notebook follows them; README "Add a round" has the template):

* one source per round: ``notebooks/NN_name.py`` (jupytext percent format) paired with ``NN_name.ipynb``;
* a cell tagged ``parameters`` (papermill) holding only ``name: "type" = literal  # help`` lines (no ``=`` in
  the help; the type may name the allowed values: ``OneOf[...]``, ``Range[lo, hi]``, ``Member[nts]``, ... see
  :func:`labkernels.pipeline.parse_type`), ``name: "Optional[str]" = None`` where the default is None, with at
  least ``mode: "OneOf[auto, measure, replay]" = "auto"`` for GPU rounds. ``labkernels report run`` checks every
  ``-p`` name, type and value against it before any cell runs;
* the first code cell calls ``report.setup()`` (inline figures, the shared style of ``labkernels.plotting``);
* ``mode``: ``measure`` runs on the GPU and records a new run under ``data/<round>/``; ``replay`` renders
  the latest recorded run (a banner says so, with the run's GPU, commit and date); ``auto`` measures when
  a GPU is present and replays otherwise. CPU rounds compute everything live (mode ``cpu``);
* tables go through ``report.table(df)`` (pandas Styler: per-column number formats, no index, no NaN
  cells, demangled kernel names, repository-relative paths);
* every page reads like a paper: its title, then ``report.lead()`` -- the place at the top of the page where the
  abstract (three sentences, :func:`abstract`), the headline table (:func:`headline`) and the one figure that
  carries the result (:func:`lead_figure`) appear -- then the method, then the detail. The figures are computed
  where the page computes them (often at its end); each call fills the lead at the top in place (an IPython
  display updated by its id, which papermill keeps in the executed notebook), so the top of the page and the
  closing headline are the same data. A notebook may split its page: a markdown cell tagged ``page:NAME``
  starts a second page ``reports/<notebook>_NAME.html`` (round 7's steps ledger);
* ``report.headline(...)`` declares the figures that ``reports/index.html`` shows for the round; a bar the
  round set itself to reach reads as a *target*, with where it came from (:data:`labkernels.facts.TARGETS`);
* ``report.footer(prov)`` ends the page with the provenance of every number on it.

Mode, run id, provenance and headline travel to the pipeline in the metadata of the HTML outputs this
module displays (key ``labkernels``); the pipeline gathers them into the executed notebook's metadata.
Nothing is written to disk from inside a notebook.
"""

from __future__ import annotations

import html
import math
import os
import re
from pathlib import Path

from . import nvml, plotting, provenance, records
from .paths import REPO_ROOT

MODES = ("auto", "measure", "replay", "cpu")
NOTE_KEY = "labkernels"

_notes: dict = {}


class ModeError(RuntimeError):
    pass


def setup() -> None:
    """First call of every round notebook: inline figures and the shared figure style."""
    plotting.setup()
    _notes.clear()
    _lead.clear()


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
        if records.replay_run(round_name) is None:
            raise ModeError(f"mode='replay' but no complete recorded run of round {round_name!r} under "
                            f"{records.data_root() / records.folder(round_name)}; measure it on a GPU first")
    _note("mode", mode)
    return mode


#: the environment variable naming a folder the pipeline gives one notebook execution and removes afterwards
SCRATCH_ENV = "LABKERNELS_SCRATCH"


def temp_dir(prefix: str = "lk-page-") -> Path:
    """A new folder for a page's own scratch data (a stand-in run's data root, never ``data/``): inside the folder
    the pipeline gives this execution (``$LABKERNELS_SCRATCH``, removed when the notebook ends, whether it
    succeeded or failed), else a temporary folder removed when this Python process exits."""
    import atexit
    import shutil
    import tempfile

    base = os.environ.get(SCRATCH_ENV)
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    d = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, d, True)
    return d


def notes() -> dict:
    """What this notebook has declared so far (mode, run_id, provenance, headline as [name, value] pairs)."""
    return dict(_notes)


def _note(key, value) -> None:
    _notes[key] = value


def _display_html(s: str) -> None:
    try:
        from IPython.display import HTML, display
    except ImportError:  # plain Python
        print(s)
        return
    display(HTML(s), metadata={NOTE_KEY: notes()})


def banner(mode: str, run=None, note: str = "", stand_in: bool = False) -> None:
    """A visible banner at the top of a round's page saying where its numbers come from. ``stand_in``: the page
    shows a CPU stand-in of a GPU round (a demonstration, not the record): ``labkernels report run`` renders it to a
    scratch folder and leaves the published page, the index and the README as they are."""
    if stand_in:
        what = ("<b>STAND-IN</b> &mdash; a demonstration computed on this machine's CPU while the page was rendered"
                + (f" (run <code>{html.escape(run.run_id)}</code>, in a temporary folder)" if run else "")
                + "; not the round's record: this page is a scratch render, the published page is unchanged.")
        color = "#f8d7da"
        _note("stand_in", True)
    elif mode == "replay":
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
    _note("mode", mode)
    _note("run_id", run.run_id if run else None)
    if run is not None:
        _note("provenance", provenance.describe(run.provenance))
    what += nvml.throttle_html(run)    # a run that saw a power or thermal cap says so (NVML clocks-event reasons)
    _display_html(f'<div style="background:{color};border:1px solid #999;padding:8px 12px;'
                  f'margin:6px 0;font-size:1.05em">{what} {html.escape(note)}</div>')


def headline(**figures) -> None:
    """Declare the round's headline figures (shown on reports/index.html, at the top of the page in the lead
    when the notebook has one, and here as the closing headline)."""
    # a list of pairs: notebook JSON is written with sorted keys, and the order of the figures matters
    head = dict(_notes.get("headline", []))
    head.update({k: _fmt(v) for k, v in figures.items()})
    _notes["headline"] = [[k, v] for k, v in head.items()]
    _update_lead()
    _display_html(_headline_table(figures))


def _headline_table(figures: dict) -> str:
    rows = "".join(f"<tr><th style='text-align:left;padding-right:1.5em'>{html.escape(k)}</th>"
                   f"<td>{html.escape(_fmt(v))}</td></tr>" for k, v in figures.items())
    return f"<table class='lk-headline'>{rows}</table>"


# ----------------------------------------------------------------------------------- the lead (top)

#: the display id of a page's lead: the abstract, the headline table and the figure at the top of the page
LEAD_ID = "lk-lead"
#: the tag of a markdown cell that starts a page of its own: ``page:steps`` -> reports/<notebook>_steps.html
PAGE_TAG = "page:"
#: the most sentences an abstract may have
ABSTRACT_SENTENCES = 3

_SENTENCE_END = re.compile(r"(?<=[.!?])[)\]\"']? +(?=[A-Z0-9(\[`*\"'])")
_INLINE_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def sentences(text: str) -> list[str]:
    """The sentences of a short prose text (a full stop, question or exclamation mark followed by a space and a
    capital, digit or opening mark ends one; "e.g." and "4.5x" do not)."""
    t = " ".join(str(text).split())
    t = re.sub(r"\b(e\.g|i\.e|cf|vs|approx|no)\.\s", lambda m: m.group(0).replace(". ", ".\u00a0"), t)
    return [x for x in _SENTENCE_END.split(t) if x.strip()]


def _prose(text: str) -> str:
    """Escaped text with `code` and **bold** (the two marks an abstract uses)."""
    t = html.escape(" ".join(str(text).split()))
    return _BOLD.sub(r"<b>\1</b>", _INLINE_CODE.sub(r"<code>\1</code>", t))


class LeadError(ValueError):
    pass


_lead: dict = {}


def lead() -> None:
    """The top of the page, right under its title: the place where the abstract, the headline table and the one
    figure that carries the result appear. It shows a placeholder until :func:`abstract`, :func:`headline` and
    :func:`lead_figure` fill it (in place, wherever in the notebook they are called)."""
    _lead.clear()
    _lead["shown"] = True
    _display_lead(update=False)


def abstract(text: str) -> None:
    """The page's abstract: what the round asked, how, and what it found, in at most three sentences (more is a
    LeadError: the detail belongs in the page)."""
    n = len(sentences(text))
    if not 1 <= n <= ABSTRACT_SENTENCES:
        raise LeadError(f"an abstract has 1-{ABSTRACT_SENTENCES} sentences, this one {n}: {text[:120]!r}")
    _lead["abstract"] = str(text)
    _update_lead()


def figure_png(fig, dpi: int | None = None) -> str:
    """A matplotlib figure as base64 PNG (the figure is closed: it is shown once, where the caller puts it)."""
    import base64
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi or fig.dpi, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def lead_figure(fig, caption: str) -> None:
    """The one figure that carries the page's result: drawn where the page computes it, shown at the top in the
    lead (not again here). ``caption`` says what it shows, with units and the run it comes from."""
    if not caption:
        raise LeadError("the lead figure needs a caption (what it shows, units, the run)")
    _lead["figure"] = figure_png(fig)
    _lead["caption"] = str(caption)
    if not _lead.get("shown"):      # no lead at the top (a notebook without one): show it here
        _display_html(_lead_figure_html())
        return
    _update_lead()
    _display_html("<p class='lk-moved'><i>The figure of this section is the one at the top of the page.</i></p>")


def _lead_figure_html() -> str:
    return (f"<figure class='lk-figure'><img src='data:image/png;base64,{_lead['figure']}' "
            f"alt='{html.escape(_lead['caption'])}' style='max-width:100%;height:auto'>"
            f"<figcaption>{_prose(_lead['caption'])}</figcaption></figure>")


def lead_html() -> str:
    """The lead as HTML: abstract, headline table, figure (a placeholder for the parts not declared yet)."""
    parts = []
    if _lead.get("abstract"):
        parts.append(f"<p class='lk-abstract'><b>Abstract.</b> {_prose(_lead['abstract'])}</p>")
    head = dict(_notes.get("headline", []))
    if head:
        parts.append(_headline_table(head))
    if _lead.get("figure"):
        parts.append(_lead_figure_html())
    if not parts:
        parts.append("<p class='lk-pending'><i>The result of this page appears here once the notebook has run to "
                     "its end.</i></p>")
    return f"<section class='lk-lead'>{''.join(parts)}</section>"


def _display_lead(update: bool) -> None:
    try:
        from IPython.display import HTML, display, update_display
    except ImportError:  # plain Python
        return
    if update:
        update_display(HTML(lead_html()), display_id=LEAD_ID, metadata={NOTE_KEY: notes()})
    else:
        display(HTML(lead_html()), display_id=LEAD_ID, metadata={NOTE_KEY: notes()})


def _update_lead() -> None:
    if _lead.get("shown"):
        _display_lead(update=True)
def step(record=None, **fields) -> None:
    """The head of one step's section on a steps ledger page: what was predicted before its GPU run, what was
    measured, the verdict and its runs -- from a record with those attributes (``labkernels.rounds.r07_wgmma.ledger.Step``)
    or keyword arguments."""
    names = (("prediction", "predicted (before the run)"), ("measured", "measured"), ("verdict", "verdict"),
             ("runs", "recorded runs"))
    vals = {k: fields.get(k, getattr(record, k, "")) for k, _ in names}
    missing = [k for k in ("prediction", "measured", "verdict") if not vals[k]]
    if missing:
        raise LeadError(f"a step needs its {', '.join(missing)}")
    rows = "".join(f"<tr><th>{label}</th><td>{_prose(vals[k])}</td></tr>" for k, label in names if vals[k])
    _display_html(f"<div class='lk-step'><table class='lk-headline'>{rows}</table></div>")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def source(run) -> str:
    """Where a figure's numbers come from, for its title: 'NVIDIA H200, run <id>, commit <10 hex>' from the
    recorded run's provenance ("no GPU recorded" / "commit ?" when the run does not record them)."""
    prov = getattr(run, "provenance", None) or {}
    gpu = (prov.get("gpu") or {}).get("name") or "no GPU recorded"
    commit = str(prov.get("git_commit") or "?")[:10]
    return f"{gpu}, run {run.run_id}, commit {commit}"


def params_text(params: dict) -> str:
    """``name = value`` pairs for a page (not raw JSON)."""
    return ", ".join(f"{k} = {relative_path(v) if isinstance(v, str) else v}" for k, v in params.items())


def footer(prov: dict | None = None) -> None:
    """Provenance line(s) for the end of the page: this render, and the recorded run it replays if any."""
    here = provenance.collect()
    lines = [f"Rendered: {provenance.describe(here)}"]
    if prov:
        lines.append(f"Measurements: {provenance.describe(prov)}")
        if prov.get("params"):
            lines.append("Parameters: " + params_text(prov["params"]))
    _note("provenance", provenance.describe(prov or here))
    _display_html("<hr><div style='font-size:0.85em;color:#444'>" +
                  "<br>".join(html.escape(s) for s in lines) + "</div>")



# --------------------------------------------------------------------------------------------- tables

_MANGLED = re.compile(r"^_Z[A-Za-z0-9_]+$")
#: integer columns that are sizes or indices, shown without thousands separators (4096, not 4,096)
DIMENSIONS = {"od", "id", "nt", "kdr", "KDR", "stride", "layer", "k", "mma_k", "repeats", "pair", "pairs", "seed",
              "threads", "EPI", "OCC", "n_tokens", "rounds"}


def _strip_signature(s: str) -> str:
    """'void k<4>(float*, int)' -> 'k<4>': drop the return type and the top-level argument list."""
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):
        if ch in "<(":
            if ch == "(" and depth == 0:
                cut = i
                break
            depth += 1
        elif ch in ">)":
            depth -= 1
    s = s[:cut]
    if s.startswith("void "):
        s = s[5:]
    return s


def _truncated_name(name: str) -> str:
    """Best reading of a mangled name cut short (profilers truncate them): the length-prefixed identifiers,
    nested names joined with '::', template arguments in <...>, and '…' where the text ends."""
    i, parts, depth, out = (3 if name.startswith("_ZN") else 2), [], 0, ""
    while i < len(name):
        if name[i].isdigit():
            j = i
            while j < len(name) and name[j].isdigit():
                j += 1
            n = int(name[i:j])
            ident = name[j:j + n]
            parts.append(ident + ("…" if j + n > len(name) else ""))
            i = j + n
        elif name[i] == "I" and parts:
            out += "::".join(parts) + "<"
            parts, depth = [], depth + 1
            i += 1
        else:
            break
    out += "::".join(parts)
    return out + ">" * depth


def kernel_name(name: str, signature: bool = False) -> str:
    """A readable kernel name: Itanium-mangled names (``_Z13q4k_nb_kernelILi4EE...``) demangled with
    cxxfilt (``q4k_nb_kernel<4>``; ``signature=True`` keeps the argument list); a name cut short by a
    profiler is read as far as it goes. Others pass through."""
    if not isinstance(name, str) or not _MANGLED.match(name):
        return name
    try:
        import cxxfilt  # the C++ runtime's own demangler (libstdc++ / libc++)

        out = cxxfilt.demangle(name)
    except (ImportError, OSError):  # no C++ runtime to load (e.g. Windows): the plain reading below
        return _truncated_name(name) or name
    except cxxfilt.InvalidName:
        return _truncated_name(name) or name
    return out if signature else _strip_signature(out)


_MANGLED_TOKEN = re.compile(r"\b_Z[A-Za-z0-9_]{4,}")


def relative_path(value: str) -> str:
    """Absolute paths inside the repository (or its data folder) become repository-relative."""
    if not isinstance(value, str) or not value.startswith(("/", "\\")) and not re.match(r"^[A-Za-z]:\\", value):
        return value
    p = Path(value)
    for root in (REPO_ROOT, REPO_ROOT.resolve()):
        try:
            return p.relative_to(root).as_posix()
        except ValueError:
            pass
    try:
        return Path(p.resolve()).relative_to(REPO_ROOT.resolve()).as_posix()
    except (ValueError, OSError):
        return p.name  # outside the repository: the machine's layout is nobody's business


def _clean_text(v):
    if isinstance(v, str):
        if _MANGLED.match(v):
            return kernel_name(v)
        return relative_path(_MANGLED_TOKEN.sub(lambda m: kernel_name(m.group(0)), v))
    if isinstance(v, (list, tuple)):
        return ", ".join(str(_clean_text(x)) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_clean_text(x)}" for k, x in v.items())
    if isinstance(v, Path):
        return relative_path(str(v))
    return v


def number_format(values) -> str:
    """One format for a float column: integers shown as counts, else decimals set by the magnitude."""
    import numpy as np

    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return "{:.3g}"
    if np.all(a == np.round(a)) and np.abs(a).max() >= 1:
        return "{:,.0f}"
    m = np.abs(a).max()
    if m >= 1000:
        return "{:,.0f}"
    if m >= 100:
        return "{:,.1f}"
    if m >= 1:
        return "{:,.2f}"
    small = np.abs(a[a != 0])
    if small.size and small.min() < 1e-4:
        return "{:.2e}"
    if small.size and small.min() >= 0.01:
        return "{:.3f}"  # the same decimals down the column (0.940, not 0.94 under 0.923)
    return "{:.3g}"


def table(df, formats: dict | None = None, *, index: bool = False, caption: str | None = None,
          percent=(), na: str = "—"):
    """A paper-grade table of a DataFrame: a pandas Styler with a number format per column (counts with
    thousands separators, never as floats; ``percent`` columns as %), the index hidden (``index=True``
    keeps it, e.g. for a transposed table), missing values as ``na`` rather than NaN, kernel names
    demangled, absolute paths made repository-relative, lists and dicts as text. ``formats`` overrides
    per column (a format string or a callable)."""
    import pandas as pd

    d = df.copy()
    if isinstance(d, pd.Series):
        d = d.to_frame()
    d.columns = [str(c) for c in d.columns]
    if d.columns.duplicated().any():
        raise ValueError(f"table: duplicate column names {sorted(set(d.columns[d.columns.duplicated()]))}")
    if not index:
        d = d.reset_index(drop=True)  # Styler needs a unique index, even a hidden one (concatenated tables)
    if index:
        d.index = d.index.map(lambda v: _clean_text(v) if not isinstance(v, tuple) else
                              " / ".join(str(_clean_text(x)) for x in v))
    fmt: dict = {}
    for c in d.columns:
        s = d[c]
        if c in percent:
            fmt[c] = "{:.1%}"
        elif pd.api.types.is_bool_dtype(s):
            fmt[c] = lambda v: "yes" if v else "no"
        elif pd.api.types.is_integer_dtype(s):
            fmt[c] = "{:d}" if c in DIMENSIONS else "{:,}"
        elif pd.api.types.is_float_dtype(s):
            fmt[c] = number_format(s.to_numpy())
            if c in DIMENSIONS and fmt[c] == "{:,.0f}":
                fmt[c] = "{:.0f}"
        else:
            d[c] = s.map(_clean_text)
            nums = pd.to_numeric(d[c], errors="coerce")
            if nums.notna().all() and len(d[c]) and not d[c].map(lambda v: isinstance(v, str)).any():
                fmt[c] = number_format(nums.to_numpy())
            else:  # mixed cells (a transposed record): numbers with 4 significant digits, the rest as text
                fmt[c] = _value_text
    fmt.update(formats or {})
    if index and all(pd.api.types.is_numeric_dtype(d[c]) for c in d.columns) and not formats:
        # transposed tables (one metric per row): format row-wise instead
        st = d.style
        for r in d.index:
            st = st.format(number_format(d.loc[[r]].to_numpy().ravel()), subset=pd.IndexSlice[[r], :], na_rep=na,
                           escape="html")
    else:
        st = d.style.format(fmt, na_rep=na, escape="html")
    # headers wrap at the underscores (api_blocks_per_sm -> "api blocks per sm"): wide tables fit the page
    st = st.format_index(lambda c: html.escape(str(c).replace("_", " ")), axis="columns")
    if index:
        st = st.format_index(escape="html", axis="index")
    if not index:
        st = st.hide(axis="index")
    num_cols = [j for j, c in enumerate(d.columns)
                if pd.api.types.is_numeric_dtype(d[c]) and not pd.api.types.is_bool_dtype(d[c])]
    st = st.set_table_attributes('class="lk-table"')
    # numbers right-aligned by the page's stylesheet (class "num"), not by a CSS rule per cell or per table, and no
    # id on every cell: a page of fifty tables stays light
    st.cell_ids = False
    if num_cols:
        import pandas as _pd

        classes = _pd.DataFrame("", index=d.index, columns=d.columns)
        classes.iloc[:, num_cols] = "num"
        st = st.set_td_classes(classes)
    if caption:
        st = st.set_caption(html.escape(caption))
    return st


def folded(obj, summary: str):
    """A long table (or any HTML, a Styler) behind a one-line disclosure the reader opens on demand (``<details>``):
    the page shows its summary and the figures, the full table stays one click away and in the file."""
    from IPython.display import HTML

    inner = obj.to_html() if hasattr(obj, "to_html") else str(obj)
    return HTML(f'<details class="lk-fold"><summary>{html.escape(summary)}</summary>\n{inner}\n</details>')


def kv_table(mapping: dict, caption: str | None = None):
    """A two-column (name, value) table of a dict: parameters of a run, one record of results."""
    import pandas as pd

    return table(pd.DataFrame({"name": list(mapping), "value": [str(v) if k in DIMENSIONS else _value_text(v)
                                                                for k, v in mapping.items()]}), caption=caption)


def _value_text(v) -> str:
    import numpy as np

    if isinstance(v, np.generic):
        v = v.item()
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, float):
        return f"{v:,.4g}" if math.isfinite(v) else "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    return str(_clean_text(v))
