"""Round 9's generation benchmark: tokens/s of the KV-cache decode (``GpuModel.generate``) per model and prompt length
(:func:`measure_generate`; the recorded runs' GEN_PLAN and the context sweep's GEN_CONTEXT_PLAN), with the copy line
and the stored weight bytes a step reads (:func:`stored_weight_bytes`) beside them, and the points a plan asks of a
model checked first (:func:`plan_points`: a prompt the model cannot take, or whose KV cache does not fit, is a skipped
point, recorded as such)."""

from __future__ import annotations

import dataclasses

from ... import arch, decode, gpu, prefill, prefill_runs, quants, synthetic
from ...peers import model_label   # a GGUF named as llama-bench's rows name it
from . import benchmark
from .ledger import PF_HOLDER
from .plan import GEN_PLAN

#: the fraction of the memory free after a model's upload that a point's KV cache may take (the prefill's activations
#: and the step's workspaces need the rest)
CACHE_FREE_FRAC = 0.8


def stored_weight_bytes(model) -> int:
    """The bytes of the weights one decode step reads, as stored in the GGUF: every tensor but the token embedding
    (one row of it is read), plus the embedding where the output head is tied to it (no ``output.weight``)."""
    names = {t.name for t in model.tensors()}
    total = 0
    for t in model.tensors():
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        if len(t.shape) < 2:
            continue          # norms: a few KB
        blk, nb = quants.BLOCK_SIZES.get(t.qtype, (1, {"f32": 4, "f16": 2, "bf16": 2}.get(t.qtype, 4)))
        total += t.rows * t.cols // blk * nb
    return int(total)


def plan_points(cfgs: dict, prompts, n_new: int, free_bytes: int | None = None) -> list[dict]:
    """The points a plan asks of each model (``cfgs``: label -> ModelConfig), in order, each with the cache generate
    would allocate (``n_ctx``: prompt + n_new rounded up, :func:`labkernels.decode.default_n_ctx`; ``cache_bytes``)
    and ``status`` "run" or "skipped" with ``why``: a context (prompt + n_new) longer than the model's n_ctx_train, or
    a KV cache over ``free_bytes`` (None: not checked). CPU only: the configs, no weights."""
    rows = []
    for label, cfg in cfgs.items():
        for n in prompts:
            need = int(n) + int(n_new)
            n_ctx = decode.default_n_ctx(cfg, need)
            kv = decode.cache_bytes(cfg, n_ctx)
            why = ""
            if cfg.n_ctx_train and need > cfg.n_ctx_train:
                why = (f"prompt {n} + {n_new} new = {need} tokens > the model's n_ctx_train {cfg.n_ctx_train}")
            elif free_bytes is not None and kv > free_bytes:
                why = (f"the KV cache of {n_ctx} positions needs {kv / 2**30:.2f} GiB, over the "
                       f"{free_bytes / 2**30:.2f} GiB it may take")
            rows.append({"model": label, "arch": cfg.arch, "n_prompt": int(n), "n_new": int(n_new),
                         "n_ctx_train": int(cfg.n_ctx_train or 0), "n_ctx": int(n_ctx), "cache_bytes": int(kv),
                         "status": "skipped" if why else "run", "why": why})
    return rows


def free_for_cache() -> int:
    """The bytes a point's KV cache may take now: CACHE_FREE_FRAC of the device memory free (after CuPy's pool gave
    its free blocks back)."""
    cp = gpu.cp()
    cp.get_default_memory_pool().free_all_blocks()
    return int(cp.cuda.runtime.memGetInfo()[0] * CACHE_FREE_FRAC)


def measure_generate(run, models=GEN_PLAN["models"], prompts=GEN_PLAN["prompts"], n_new: int = GEN_PLAN["n_new"],
                     repeats: int = GEN_PLAN["repeats"], progress=print, ab: dict | None = None) -> list[dict]:
    """tokens/s of ``GpuModel.generate`` (prefill then ``n_new`` greedy decode steps, one graph replay each) per model
    and prompt length: ``repeats`` generates of one decoder (the first captures the step), one row each, with the GPU
    time of the replays (CUDA events), the host's wall, the prefill and the capture check; the copy line and the
    stored weight bytes a step reads beside them (``generate`` table; ``copy`` table as the benchmark's). A point the
    model cannot take (:func:`plan_points`: prompt + n_new over n_ctx_train, or a cache that does not fit) is a row of
    table ``generate_skipped`` with the reason, never silently left out.
    ``ab`` ({option: [values]}, one ``PrefillOptions`` field): an A/B in one process -- every repeat generates once with
    each value in turn (A, B, A, B, ...: the decoder and its graph made anew for each, as the option is part of its
    key), the value in the row's column of that name."""
    if ab is not None:
        if len(ab) != 1 or not all(isinstance(v, (list, tuple)) and v for v in ab.values()):
            raise ValueError(f"measure_generate ab is {{option: [values]}} with one option, got {ab!r}")
        opt = next(iter(ab))
        if opt == "gemv_pf":
            raise ValueError(f"measure_generate ab: gemv_pf (round 9 step 8's PF=1 build in the decode graph) lost and "
                             f"left PrefillOptions with the build: commit {PF_HOLDER} holds it and runs step 8's A/B "
                             f"(gpu check --steps gemv_step8 there)")
        if opt not in {f.name for f in dataclasses.fields(prefill.PrefillOptions)} or opt == "graph":
            raise ValueError(f"measure_generate ab: {opt!r} is not a PrefillOptions field the decode can vary")
    variants = [(None, None)] if ab is None else [(opt, v) for v in ab[opt]]
    cp = gpu.cp()
    cb = benchmark.copy_bandwidth()
    run.append("copy", [cb])
    rows = []
    for spec in models:
        m = synthetic.load_model(spec)
        label = model_label(spec)
        cfg = arch.config_from_model(m)
        wbytes = stored_weight_bytes(m)
        gm = prefill.GpuModel(m)
        for pt in plan_points({label: cfg}, prompts, n_new, free_bytes=free_for_cache()):
            n = pt["n_prompt"]
            if pt["status"] == "skipped":
                progress(f"{label}: prompt {n}: skipped ({pt['why']})")
                run.append("generate_skipped", [pt])
                continue
            toks = prefill_runs.prompt_tokens(m, n)
            for rep, (name, value) in ((r, v) for r in range(repeats) for v in variants):
                if name is not None:
                    setattr(gm.opts, name, value)
                out = gm.generate(toks, n_new)
                st = dict(gm.last_generate)
                row = {"model": label, "arch": cfg.arch, "n_prompt": n, "n_new": n_new, "rep": rep,
                       "mode": st.get("mode"), "replays": st.get("replays", 0), "gpu_ms": st.get("gpu_ms"),
                       "tok_per_s": st.get("tok_per_s") or st.get("tok_per_s_eager"),
                       "tok_per_s_wall": st.get("tok_per_s_wall"), "prefill_ms": st.get("prefill_ms"),
                       "host_outside_ms": st.get("host_outside_ms"), "weight_bytes": wbytes,
                       "capture_max_rel_diff": (st.get("capture") or {}).get("max_rel_diff"),
                       "families": st.get("families"), "graph_refused": st.get("graph_refused") or "",
                       "first_tokens": " ".join(map(str, out[:8])), **({} if name is None else {name: value})}
                tps = row["tok_per_s"] or 0.0
                row["frac_copy"] = wbytes * tps / 1e12 / cb["tb_per_s"]
                rows.append(row)
                progress(f"{label} prompt {n} tg{n_new} rep {rep}" + ("" if name is None else f" {name}={value}")
                         + f": {tps:.0f} tok/s ({row['mode']}; "
                         f"{row['frac_copy']:.0%} of the copy line at {wbytes / 1e9:.2f} GB a token), "
                         f"prefill {row['prefill_ms']:.1f} ms")
        run.append("generate", [r for r in rows if r["model"] == label])
        del gm
        cp.get_default_memory_pool().free_all_blocks()
    return rows
