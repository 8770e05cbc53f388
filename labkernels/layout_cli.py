"""``labkernels model layout``: the round-1 verifier over a model's q4_K / q6_K tensors, per-type totals."""

from __future__ import annotations

from . import cli, model
from .layout import LayoutError
from .rounds import r01_layout


def main(args) -> int:
    if args.per_tensor and not args.json:
        raise LayoutError("--per-tensor goes with --json (the per-tensor rows are printed in the JSON)")
    rows, _ = r01_layout.verify_model(args.model, args.filter, strides=tuple(args.stride))
    totals = r01_layout.summarize(rows)
    if args.json:
        cli.print_json({"model": str(args.model), "totals": totals,
                        "tensors": rows if args.per_tensor else None})
    else:
        for k, v in totals.items():
            print(f"{k:10s} tensors {v['tensors']:4d}  blocks {v['blocks']:9d}  elements {v['elements']:11d}  "
                  f"mismatches {v['mismatches']}")
    return 0 if all(v["mismatches"] == 0 for v in totals.values()) and totals else 1


def register_cli(sub) -> None:
    p = sub.add_parser("layout", help="round 1: verify the q6_K/q4_K element maps on every block of a model")
    p.add_argument("--model", default=str(model.default_model_path()), help="GGUF path (default: the Gemma model)")
    p.add_argument("--filter", default=None, help="regex on tensor names")
    p.add_argument("--stride", type=int, action="append", default=None,
                   help="q6_K block strides to check (default 210 and 224)")
    p.add_argument("--json", action="store_true", help="print per-type totals as JSON")
    p.add_argument("--per-tensor", action="store_true", help="with --json, include the per-tensor rows")
    p.set_defaults(func=_wrap)


def _wrap(args):
    args.stride = args.stride or [210, 224]
    return main(args)
