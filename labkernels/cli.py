"""The ``labkernels`` command line. Each round module registers its own subcommand."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

#: modules that contribute subcommands through register_cli(subparsers), in help order
SUBCOMMAND_MODULES = ["pipeline", "layout_cli", "occupancy", "audit", "gpu_cli", "prefill_cli", "forensics",
                      "records", "peers", "sweep"]


def _fetch_model(args) -> int:
    from .model import fetch_model

    fetch_model(args.dest)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="labkernels", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("fetch-model", help="assemble the real Gemma 3 270M Q4_K_M GGUF under data/models/")
    p.add_argument("--dest", default=None, help="output path (default data/models/gemma-3-270m-q4_k_m.gguf)")
    p.set_defaults(func=_fetch_model)
    for name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(f"labkernels.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"labkernels.{name}":
                continue  # a round that has not landed yet
            raise
        mod.register_cli(sub)
    return ap


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
            print(f"labkernels {args.command}: error: {type(e).__name__}: {e}", file=sys.stderr)
        else:
            print(f"labkernels {args.command}: error: {type(e).__name__}: {e} (an unexpected error: no check of "
                  "labkernels caught this input -- please report it; LABKERNELS_DEBUG=1 shows the traceback)",
                  file=sys.stderr)
        return 2
    return int(rc or 0)


def print_json(obj) -> None:
    print(json.dumps(obj, indent=1, default=str))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
