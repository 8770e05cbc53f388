"""The ``labkernels`` command line: ``labkernels <noun> <verb>`` (each module registers its commands)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from . import model

#: modules that contribute subcommands through register_cli(subparsers), in help order
SUBCOMMAND_MODULES = ["pipeline", "layout_cli", "occupancy", "audit", "gpu_cli", "prefill_cli",
                      "rounds.r06_forensics.forensics", "records_admin", "peers", "sweep"]


def _fetch_model(args) -> int:
    model.fetch_model(args.dest)
    return 0


#: the command tree, ``labkernels <noun> <verb>``: each verb is a command a module registers under its old flat name
#: (an alias: ``labkernels gpu-check`` is ``labkernels gpu check``). ``peers`` and ``sweep`` are nouns of their own.
TREE = {
    "report": ("pages and the README's results table", {"run": "run", "results-table": "results-table"}),
    "data": ("the recorded runs under data/", {"check": "check-data", "import": "import-runs",
                                               "migrate": "migrate-data"}),
    "model": ("the GGUF model: fetch it, verify its layout, run it on the GPU",
              {"fetch": "fetch-model", "layout": "layout", "prefill": "prefill", "generate": "generate"}),
    "kernels": ("static facts of the kernels: ptxas audit, occupancy", {"audit": "audit", "occupancy": "occupancy"}),
    "gpu": ("the device: the one-call run, traces, counters", {"check": "gpu-check", "decompose": "decompose",
                                                               "forensics": "forensics"}),
}
#: nouns registered by a module as themselves (their verbs are already subcommands, or they have one action)
OWN_NOUNS = ("peers", "sweep")


class _Formatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already names it or there is none to name."""

    def _get_help_string(self, action):
        h = action.help or ""
        d = action.default
        if (not action.option_strings or d in (None, False, argparse.SUPPRESS) or "default" in h.lower()
                or "%(default)" in h or isinstance(action, argparse._HelpAction)):
            return h
        return f"{h} (default: %(default)s)" if h else "(default: %(default)s)"


_FORMATTER = _Formatter


class _Verbs:
    """The subparsers action of one noun, as the modules' ``register_cli(sub)`` see it: ``add_parser(old_name)`` of
    a command the noun holds adds it under its verb; any other command is built and dropped."""

    def __init__(self, sub, verbs: dict, hidden: bool = False):
        self.sub, self.verbs, self.hidden = sub, {old: verb for verb, old in verbs.items()}, hidden

    def add_parser(self, name, **kw):
        kw.setdefault("formatter_class", _FORMATTER)
        if name not in self.verbs:
            return argparse.ArgumentParser(**{k: v for k, v in kw.items() if k != "help"})
        if self.hidden:         # an old flat name: parses as before, not listed in the help
            kw.pop("help", None)
        return self.sub.add_parser(self.verbs[name], **kw)


def _register_all(sub) -> None:
    for name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(f"labkernels.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"labkernels.{name}":
                continue  # a round that has not landed yet
            raise
        mod.register_cli(sub)


def _fetch_model_parser(sub) -> None:
    p = sub.add_parser("fetch-model", help="assemble the real Gemma 3 270M Q4_K_M GGUF under data/models/")
    p.add_argument("--dest", default=None, help="output path (default data/models/gemma-3-270m-q4_k_m.gguf)")
    p.set_defaults(func=_fetch_model)


class _All:
    """register_cli's view of the top level: every module's command, each also added by its flat name (hidden)."""

    def __init__(self, sub):
        self.sub = sub

    def add_parser(self, name, **kw):
        kw.setdefault("formatter_class", _FORMATTER)
        if name not in OWN_NOUNS:
            kw.pop("help", None)
        return self.sub.add_parser(name, **kw)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="labkernels", description=(__doc__.splitlines()[0] if __doc__ else None),
                                 epilog="Each noun's verbs: labkernels NOUN --help. The old flat names (gpu-check, "
                                        "check-data, import-runs, run, ...) still work.",
                                 formatter_class=_FORMATTER)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for noun, (what, verbs) in TREE.items():
        g = sub.add_parser(noun, help=what, formatter_class=_FORMATTER, description=what)
        gs = g.add_subparsers(dest="verb", metavar="VERB")
        gs.required = True
        v = _Verbs(gs, verbs)
        _fetch_model_parser(v)
        _register_all(v)
    flat = _All(sub)              # the nouns of their own (listed) and the old flat names (parsed, not listed)
    _fetch_model_parser(flat)
    _register_all(flat)
    return ap


def _command(args) -> str:
    return f"{args.command} {args.verb}" if getattr(args, "verb", None) else str(args.command)


def lab_error(e: BaseException) -> bool:
    """Whether ``e`` is one of the lab's own errors (its class is defined in labkernels: ModelError, RecordError,
    PipelineError, ShapeError, ...), which name what was wrong -- as opposed to an error of Python or a library
    that escaped a check (a bug: the check is missing)."""
    return any(c.__module__.split(".")[0] == "labkernels" for c in type(e).__mro__[:-1])


def main(argv=None) -> int:
    try:   # a Ctrl-C while the subcommands' modules import (about a second) is an interrupt too, not a traceback
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        # bad input gets a clear one-line error, never a traceback; set LABKERNELS_DEBUG=1 for the traceback
        import os

        if os.environ.get("LABKERNELS_DEBUG"):
            raise
        if lab_error(e):
            print(f"labkernels {_command(args)}: error: {type(e).__name__}: {e}", file=sys.stderr)
        else:
            print(f"labkernels {_command(args)}: error: {type(e).__name__}: {e} (an unexpected error: no check of "
                  "labkernels caught this input -- please report it; LABKERNELS_DEBUG=1 shows the traceback)",
                  file=sys.stderr)
        return 2
    return int(rc or 0)


def print_json(obj) -> None:
    print(json.dumps(obj, indent=1, default=str))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
