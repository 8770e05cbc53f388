"""``labkernels model prefill``, ``labkernels gpu decompose`` (GPU) and ``labkernels model generate``: their arguments,
and the calls that run them (the prompts and the recorded prefill runs are :mod:`labkernels.prefill_runs`; the
decomposition is round 5's, :mod:`labkernels.rounds.r05_wall.decompose`)."""

from __future__ import annotations

import json

from . import arch, attention, decode, dispatch, gpu, prefill, prefill_ref, prefill_replay, provenance
from .prefill_runs import prompt_tokens
from .rounds.r05_wall import decompose
from .synthetic import load_model


def _need_gpu():
    if not provenance.gpu_available():
        raise SystemExit("labkernels model prefill / gpu decompose need a CUDA GPU with cupy; this machine has none "
                         "(recorded runs render in replay mode: labkernels report run 05)")


def _count(minimum: int):
    """argparse type: an integer >= minimum, with a clear message otherwise."""
    import argparse

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{v} is less than {minimum}")
        return v

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _prompt_args_error(args) -> str | None:
    """``--tokens 0`` (the default) means "the prompt ids": without them the prompt would be empty."""
    if args.prompt_ids is not None and len(args.prompt_ids) == 0:
        return "--prompt-ids needs at least one id"
    if args.tokens == 0 and not args.prompt_ids:
        return "give --tokens N (N >= 1) or --prompt-ids ID [ID ...]; --tokens 0 without prompt ids is an empty prompt"
    if args.prompt_ids and min(args.prompt_ids) < 0:
        return f"prompt ids must be non-negative, got {min(args.prompt_ids)}"
    return None


def prefill_main(args) -> int:
    err = _prompt_args_error(args)
    if err:
        import sys

        print(f"labkernels model prefill: error: {err}", file=sys.stderr)
        return 2
    _need_gpu()
    m = load_model(args.model)
    gm = prefill.GpuModel(m, opts=options_from_args(args, prefill.PrefillOptions))
    toks = prompt_tokens(m, args.tokens, args.prompt_ids)
    t = prefill_replay.timed_prefill(gm, toks, repeats=args.repeats)
    logits = gm.forward(toks)
    top = gpu.cp().asnumpy(logits).argsort()[::-1][:5]
    res = {"model": args.model, "arch": gm.cfg.arch, "n_tokens": len(toks), "wall_ms": t["wall_ms"],
           "tok_per_s": t["tok_per_s"], "top5": [int(i) for i in top], "load_s": gm.load_seconds,
           "kernel": args.kernel, "gemm_families": gm.families_used(), **gm.attn.describe(), "mode": t["mode"],
           "graph_fallback": t["fallback"], "graphs": gm.graphs()}
    try:
        res["top5_text"] = [prefill_ref.detokenize(m, [int(i)]) for i in top]
    except Exception:
        pass
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        why = f" (graph refused: {t['fallback']})" if t["fallback"] else ""
        print(f"{gm.cfg.describe()}\nprefill {len(toks)} tokens [{t['mode']}{why}]: {t['wall_ms']:.1f} ms, "
              f"{t['tok_per_s']:.0f} tok/s; top-5 next: {res['top5']} {res.get('top5_text', '')}; "
              f"GEMMs: {res['gemm_families']}; attention: {gm.attn.name} ({gm.attn.note})")
    return 0


def decompose_main(args) -> int:
    _need_gpu()
    m = load_model(args.model)
    gm = prefill.GpuModel(m, opts=options_from_args(args, prefill.PrefillOptions))
    toks = prompt_tokens(m, args.nt)
    r = decompose.run_decomposition(gm, toks, repeats=args.repeats, progress=lambda s: None if args.json else print(s))
    t = r["classes"].reset_index()
    if args.json:
        print(json.dumps({"busy_wall": r["busy_wall"], "wall": r["wall"], **gm.attn.describe(),
                          "classes": t.to_dict("records"),
                          "queue": r["queue"].to_dict("records")}, indent=1, default=str))
    else:
        print(t.to_string())
        print(r["queue"].to_string())
    return 0


def options_from_args(args, cls=None):
    """PrefillOptions from the prefill / decompose flags (--attn-f16, --kernel, --graph/--no-graph, --no-fuse)."""
    if cls is None:
        cls = prefill.PrefillOptions
    fuse = not getattr(args, "no_fuse", False)
    return cls(attn_f16=args.attn_f16, kernel=args.kernel, graph=getattr(args, "graph", None),
               attention=getattr(args, "attention", "auto"), other_f16=not getattr(args, "f32_dense", False),
               **{f: fuse for f in prefill.FUSIONS})


def _add_mode_args(p) -> None:
    import argparse

    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                   help="CUDA-graph replay of the whole forward: --graph requires it (a capture failure is an "
                        "error), --no-graph runs eager; default: graph where it captures, else eager (said why)")
    p.add_argument("--f32-dense", action="store_true",
                   help="the dequantized-once (non-k-quant) weights on fp32 cuBLAS, as exact float32 (default: an "
                        "fp16 copy on the tensor cores, PrefillOptions.other_f16)")
    p.add_argument("--no-fuse", action="store_true",
                   help="the unfused small kernels (separate residual add / norm, rope per tensor, two-pass layout, "
                        "separate gate and up GEMMs)")


def _kernels():
    return dispatch.QMATMUL_KERNELS


def _attention_paths():
    return attention.BACKENDS


def register_cli(sub) -> None:
    p = sub.add_parser("prefill", help="one prefill on the GPU: tok/s and the top-5 next tokens")
    p.add_argument("--model", required=True, help="GGUF path or 'synthetic-7b'")
    p.add_argument("--tokens", type=_count(0), default=0,
                   help="prompt length N >= 1 (0, the default: exactly the --prompt-ids)")
    p.add_argument("--prompt-ids", type=int, nargs="*", default=None,
                   help="the prompt as token ids (default: a prompt of --tokens ids)")
    p.add_argument("--repeats", type=_count(1), default=3, help="timed prefills (the median is reported)")
    p.add_argument("--attn-f16", action="store_true", help="fp16 QK^T/PV attention")
    p.add_argument("--kernel", default="auto", choices=_kernels(), help="dispatch.qmatmul kernel of the k-quant GEMMs")
    p.add_argument("--attention", default="auto", choices=_attention_paths(), help="attention path (auto: lab+cudnn "
                   "-- the lab's fused kernel where its launch splits over the keys, cuDNN elsewhere -- when the "
                   "frontend is usable; else the lab's kernel alone where it takes every layer (fp16), else the baseline, "
                   "said in the output)")
    _add_mode_args(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=prefill_main)
    q = sub.add_parser("decompose", help="round 5: a prefill traced launch by launch, by kernel class")
    q.add_argument("--model", required=True, help="GGUF path or 'synthetic-7b'")
    q.add_argument("--nt", type=_count(1), default=3325, help="prompt tokens of the traced prefill")
    q.add_argument("--repeats", type=_count(1), default=3, help="traced prefills (the median per class)")
    q.add_argument("--attn-f16", action="store_true", help="fp16 QK^T/PV attention")
    q.add_argument("--kernel", default="auto", choices=_kernels(), help="dispatch.qmatmul kernel of the k-quant GEMMs")
    q.add_argument("--attention", default="auto", choices=_attention_paths(), help="attention path")
    _add_mode_args(q)
    q.add_argument("--json", action="store_true", help="print the result as JSON")
    q.set_defaults(func=decompose_main)
    register_generate_args(sub.add_parser("generate", help="round 9: greedy generation with a KV cache (prefill, then one "
                                 "captured decode step per token): decode tok/s, the prefill's time, the tokens"))


# ------------------------------------------------------------------ labkernels model generate (round 9's decode)


def generate_main(args) -> int:
    """``labkernels model generate``: the request checked (before any GPU work), then one generate; tokens/s of the
    decode replays (CUDA events around them), the host's share beside it, the prefill's time and the tokens."""
    if args.prompt_ids is not None and len(args.prompt_ids) == 0:
        raise decode.DecodeError("--prompt-ids was given without any ids")
    if args.prompt_tokens == 0 and not args.prompt_ids:
        raise decode.DecodeError("an empty prompt: give --prompt-tokens N (N >= 1) or --prompt-ids ID [ID ...]")
    m = load_model(args.model)
    cfg = arch.config_from_model(m)
    if args.prompt_ids and min(args.prompt_ids) < 0:
        raise decode.DecodeError(f"token id {min(args.prompt_ids)} is outside the vocabulary 0..{cfg.vocab - 1}")
    toks = prompt_tokens(m, args.prompt_tokens, args.prompt_ids)
    decode.check_request(cfg, toks, args.new_tokens, "greedy", args.n_ctx)
    bad = decode.decode_problems(cfg)
    if bad:
        raise decode.DecodeError(f"the decode path cannot take {cfg.arch} ({'; '.join(bad)})")
    if not provenance.gpu_available():
        raise SystemExit("labkernels model generate needs a CUDA GPU with cupy; this machine has none")
    gm = prefill.GpuModel(m, opts=options_from_args(args))
    out = gm.generate(toks, args.new_tokens, n_ctx=args.n_ctx)
    st = dict(gm.last_generate)
    res = {"model": args.model, "arch": cfg.arch, "n_prompt": len(toks), "n_new": args.new_tokens,
           "tokens": out, "prefill_gemm_families": gm.families_used(), **gm.attn.describe(), **st}
    try:
        res["text"] = prefill_ref.detokenize(m, out)
    except Exception:
        pass
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        return 0
    if st["mode"] == "graph":
        first = "the first step eager and captured, then " if "first_step_capture_ms" in st else ""
        dec = (f"{first}{st['replays']} graph replays" + (
            f": {st['tok_per_s']:.0f} tok/s on the GPU (CUDA events, {st['gpu_ms']:.2f} ms), {st['tok_per_s_wall']:.0f} "
            f"tok/s by the host clock (host outside the GPU span {st['host_outside_ms']:.2f} ms)" if st["replays"] else ""))
    else:
        dec = f"eager steps ({st.get('graph_refused') or 'asked'})" + (
            f": {st['tok_per_s_eager']:.0f} tok/s" if st.get("tok_per_s_eager") else "")
    print(f"{cfg.describe()}\nprefill {len(toks)} tokens (eager, filling the KV cache): {st['prefill_ms']:.1f} ms; "
          f"decode {args.new_tokens} tokens: {dec}\ntokens: {out}" + (f"\ntext: {res['text']!r}" if "text" in res else ""))
    return 0


def register_generate_args(p) -> None:
    """The ``generate`` subcommand's arguments (registered beside ``prefill``; the decode is :mod:`labkernels.decode`)."""
    import argparse

    p.add_argument("--model", required=True, help="GGUF path or a synthetic model name (synthetic-7b, "
                   "synthetic-gemma3)")
    p.add_argument("--prompt-tokens", type=_count(0), default=0,
                   help="prompt length N >= 1 (0, the default: exactly the --prompt-ids)")
    p.add_argument("--prompt-ids", type=int, nargs="*", default=None,
                   help="the prompt as token ids (default: a prompt of --prompt-tokens ids)")
    p.add_argument("--new-tokens", type=_count(1), default=128, help="tokens to generate (>= 1)")
    p.add_argument("--n-ctx", type=_count(1), default=None,
                   help="the KV cache's positions (default: prompt + new tokens rounded up to 256)")
    p.add_argument("--attn-f16", action="store_true", help="the prefill's fp16 QK^T/PV attention")
    p.add_argument("--kernel", default="auto", choices=_kernels(), help="the prefill's k-quant GEMM kernel (the decode "
                   "steps run gemv_kq)")
    p.add_argument("--attention", default="auto", choices=_attention_paths(), help="the prefill's attention path")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                   help="the decode step as one captured CUDA graph replayed per token: --graph requires it (a capture "
                        "failure is an error), --no-graph runs eager steps; default: a graph where it captures, else "
                        "eager steps (said why). The prefill that fills the cache runs eager")
    p.add_argument("--f32-dense", action="store_true",
                   help="the dequantized-once (non-k-quant) weights on fp32 cuBLAS (default: their fp16 copy)")
    p.add_argument("--no-fuse", action="store_true", help="the prefill's unfused small kernels")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=generate_main)
