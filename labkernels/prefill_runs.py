"""The prefill's shared runs (``data/prefill/``, recorded by rounds 5 and 7 and read by both pages): the prompts the
lab prefills (:func:`prompt_tokens`, :data:`GEMMA_PROMPT`), Gemma's parity against the CPU reference and the
throughput runs the gpu check steps record (:func:`parity_run`, :func:`throughput_run`), and the newest recorded
prefill_graph run of a model (:func:`latest_graph_run`: round 5's page, the prefill of record in
:mod:`labkernels.facts`)."""

from __future__ import annotations

import json
import time

import numpy as np

from . import arch, gpu, prefill, prefill_ref, prefill_replay, records
from .model import open_model
from .peers import with_cudnn
from .synthetic import load_model

#: a fixed English prompt as Gemma 3 token ids (bos first); checked by detokenize in the tests
GEMMA_PROMPT = [2, 818, 5279, 529, 7001, 563]


#: the longest prompt prompt_tokens makes (2^20 tokens; the lab's prompts are a few thousand)
MAX_PROMPT_TOKENS = 1 << 20


def prompt_tokens(model, n: int, prompt_ids=None, seed: int = 0) -> list[int]:
    """The given ids (the first ``n`` when n > 0), else n >= 1 tokens: a fixed prompt with deterministic random
    ids after it. Raises TokenError (a ValueError) for a negative or non-integer n, n = 0 without ids (an empty
    prompt), or ids that are not integers in the model's vocabulary."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise arch.TokenError(f"token count must be a non-negative integer, got {n!r}")
    if n > MAX_PROMPT_TOKENS:
        raise arch.TokenError(f"token count {n} is more than a prompt of the lab takes ({MAX_PROMPT_TOKENS})")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise arch.TokenError(f"seed must be a non-negative integer, got {seed!r}")
    if prompt_ids is not None and len(prompt_ids) == 0:
        raise arch.TokenError("--prompt-ids was given without any ids")
    if prompt_ids is None and n == 0:
        raise arch.TokenError("an empty prompt: give --tokens N (N >= 1) or --prompt-ids")
    if prompt_ids is not None and n and len(prompt_ids) < n:
        raise arch.TokenError(f"{len(prompt_ids)} prompt ids for a prompt of {n} tokens: give at least {n} ids, or "
                              "n = 0 for exactly the ids")
    vocab = arch.config_from_model(model).vocab
    if prompt_ids is not None:
        ids = arch.check_token_ids(prompt_ids, vocab, "prompt ids").tolist()
        return ids[:n] if n else ids
    rng = np.random.default_rng(seed)
    base = GEMMA_PROMPT if model.field("general.architecture") == "gemma3" else [1]
    ids = list(base) + rng.integers(100, min(vocab, 30000), size=max(0, n - len(base))).tolist()
    return ids[:n]


def parity_run(model_path: str, run, n_new: int = 32, progress=print, kernel: str = "auto") -> dict:
    """GPU prefill vs the CPU reference on Gemma: last-position logits (rel. error, top-k), greedy-32."""
    cp = gpu.cp()
    m = open_model(model_path)
    gm = prefill.GpuModel(m, opts=prefill.PrefillOptions(kernel=kernel))
    out = {}
    for name, toks in (("prompt", GEMMA_PROMPT), ("random64", prompt_tokens(m, 64, seed=5))):
        g = cp.asnumpy(gm.forward(toks)).astype(np.float64)
        r = prefill_ref.forward_ref(m, toks, last_only=True)
        rel = float(np.max(np.abs(g - r)) / np.max(np.abs(r)))
        top_g, top_r = np.argsort(-g)[:10], np.argsort(-r)[:10]
        row = {"case": name, "kernel": kernel, "gemm_families": gm.families_used(), "attention": gm.attn.name,
               "attention_note": gm.attn.note, "n_tokens": len(toks), "max_rel_err": rel,
               "rms_rel_err": float(np.linalg.norm(g - r) / np.linalg.norm(r)),
               "top1_same": bool(top_g[0] == top_r[0]), "top5_overlap": len(set(top_g[:5]) & set(top_r[:5])),
               "top10_overlap": len(set(top_g) & set(top_r)), "gpu_top5": top_g[:5].tolist(), "ref_top5": top_r[:5].tolist()}
        run.append("logits", row)
        out[name] = row
        progress(f"logits {name}: max rel err {rel:.2e}, top1 same {row['top1_same']}, top5 overlap {row['top5_overlap']}")
    t0 = time.time()
    gg = gm.greedy(GEMMA_PROMPT, n_new)
    tg = time.time() - t0
    t0 = time.time()
    gr = prefill_ref.greedy_ref(m, GEMMA_PROMPT, n_new)
    tr = time.time() - t0
    first_diff = next((i for i, (a, b) in enumerate(zip(gg, gr)) if a != b), None)
    row = {"prompt": json.dumps(GEMMA_PROMPT), "n_new": n_new, "gpu_ids": json.dumps(gg), "ref_ids": json.dumps(gr),
           "identical": gg == gr, "first_diff": first_diff, "gpu_text": prefill_ref.detokenize(m, gg),
           "ref_text": prefill_ref.detokenize(m, gr), "gpu_s": tg, "ref_s": tr}
    run.append("greedy", row)
    progress(f"greedy-{n_new}: identical={gg == gr} (first diff {first_diff}); GPU: {row['gpu_text']!r}")
    out["greedy"] = row
    return out


def throughput_run(spec: str, nts, run, repeats: int = 3, attn_f16: bool = True, progress=print, kernel: str = "auto",
                   model=None) -> list[dict]:
    m = model if model is not None else load_model(spec)
    gm = prefill.GpuModel(m, opts=prefill.PrefillOptions(attn_f16=attn_f16, kernel=kernel))
    rows = []
    for nt in nts:
        toks = prompt_tokens(m, nt)
        t = prefill_replay.timed_prefill(gm, toks, repeats=repeats)
        row = {"model": spec if spec == "synthetic-7b" else "gemma-3-270m-q4_k_m", "arch": gm.cfg.arch,
               "nt": nt, "wall_ms": t["wall_ms"], "tok_per_s": t["tok_per_s"], "repeats": repeats,
               "attn_f16": attn_f16, "load_s": gm.load_seconds, "kernel": kernel,
               "gemm_families": gm.families_used(), "attention": gm.attn.name, "attention_note": gm.attn.note,
               "mode": t["mode"]}
        run.append("throughput", row)
        rows.append(row)
        progress(f"prefill {row['model']} nt={nt} kernel={kernel} ({row['gemm_families']}): {t['wall_ms']:.1f} ms, "
                 f"{t['tok_per_s']:.0f} tok/s")
    return rows, gm, m


def latest_graph_run(model: str, table: str, root=None, cudnn: bool = True):
    """The newest recorded prefill_graph run (``prefill`` round) with table ``table`` whose throughput rows include
    ``model``, or None; ``cudnn``: with the cuDNN frontend (:func:`with_cudnn`; False: the newest run without it)."""
    return records.latest("prefill", root, where=lambda r: r.has(table) and r.has("throughput")
                          and "variant" in r.table("throughput")   # a graph run's rows (not the A/B step's)
                          and model in set(r.table("throughput").model) and with_cudnn(r) == cudnn)
