"""Round 9's generation benchmark: tokens/s of the KV-cache decode (``GpuModel.generate``) per model and prompt length
(:func:`measure_generate`), with the copy line and the stored weight bytes a step reads (:func:`stored_weight_bytes`)
beside them."""

from __future__ import annotations

from ... import arch, prefill, prefill_runs, quants, synthetic
from ...peers import model_label   # a GGUF named as llama-bench's rows name it
from . import benchmark
from .plan import GEN_PLAN


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


def measure_generate(run, models=GEN_PLAN["models"], prompts=GEN_PLAN["prompts"], n_new: int = GEN_PLAN["n_new"],
                     repeats: int = GEN_PLAN["repeats"], progress=print) -> list[dict]:
    """tokens/s of ``GpuModel.generate`` (prefill then ``n_new`` greedy decode steps, one graph replay each) per model
    and prompt length: ``repeats`` generates of one decoder (the first captures the step), one row each, with the GPU
    time of the replays (CUDA events), the host's wall, the prefill and the capture check; the copy line and the
    stored weight bytes a step reads beside them (``generate`` table; ``copy`` table as the benchmark's)."""
    import cupy as cp

    cb = benchmark.copy_bandwidth()
    run.append("copy", [cb])
    rows = []
    for spec in models:
        m = synthetic.load_model(spec)
        label = model_label(spec)
        cfg = arch.config_from_model(m)
        wbytes = stored_weight_bytes(m)
        gm = prefill.GpuModel(m)
        for n in prompts:
            if n + n_new > cfg.n_ctx_train:
                progress(f"{label}: prompt {n} + {n_new} > n_ctx_train {cfg.n_ctx_train}: skipped")
                continue
            toks = prefill_runs.prompt_tokens(m, n)
            for rep in range(repeats):
                out = gm.generate(toks, n_new)
                st = dict(gm.last_generate)
                row = {"model": label, "arch": cfg.arch, "n_prompt": n, "n_new": n_new, "rep": rep,
                       "mode": st.get("mode"), "replays": st.get("replays", 0), "gpu_ms": st.get("gpu_ms"),
                       "tok_per_s": st.get("tok_per_s") or st.get("tok_per_s_eager"),
                       "tok_per_s_wall": st.get("tok_per_s_wall"), "prefill_ms": st.get("prefill_ms"),
                       "host_outside_ms": st.get("host_outside_ms"), "weight_bytes": wbytes,
                       "capture_max_rel_diff": (st.get("capture") or {}).get("max_rel_diff"),
                       "families": st.get("families"), "graph_refused": st.get("graph_refused") or "",
                       "first_tokens": " ".join(map(str, out[:8]))}
                tps = row["tok_per_s"] or 0.0
                row["frac_copy"] = wbytes * tps / 1e12 / cb["tb_per_s"]
                rows.append(row)
                progress(f"{label} prompt {n} tg{n_new} rep {rep}: {tps:.0f} tok/s ({row['mode']}; "
                         f"{row['frac_copy']:.0%} of the copy line at {wbytes / 1e9:.2f} GB a token), "
                         f"prefill {row['prefill_ms']:.1f} ms")
        run.append("generate", [r for r in rows if r["model"] == label])
        del gm
        cp.get_default_memory_pool().free_all_blocks()
    return rows
