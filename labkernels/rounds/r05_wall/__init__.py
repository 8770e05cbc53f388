"""Round 5 -- wall decomposition: a whole prefill taken apart launch by launch (``notebooks/05_wall_decomposition``):
the page measures or replays one decomposition (a ``decompose`` run of the plan's model and nt); the GPU checks record
prefill parity and throughput (``prefill`` runs, the shared folder) and the decompositions of both models.

The round's package holds what only it uses: :mod:`.decompose` (the decomposition: CUPTI trace, busy vs wall, class
table, priced queue, host overhead, the graph runs' history), its gpu-check steps here (prefill, prefill7b, decompose,
attention, graph_nodes) and in :mod:`.prefill_graph` (eager vs graph and the fusions, issue 18), the attention
benchmark (:mod:`.attention_bench`, issue 17) and the graph's memset census (:mod:`.graph_census`)."""

from __future__ import annotations

from pathlib import Path

from ... import attention, attention_kinds, blas, gpu, prefill, prefill_runs, records, synthetic
from ...model import default_model_path
from . import attention_bench, decompose, graph_census
from .prefill_graph import step_prefill_graph

NOTEBOOK = "05_wall_decomposition"
DATA = ("decompose", "prefill")
PLAN = {"model": "synthetic-7b", "nt": 3325, "repeats": 3, "timeline_layer": 1}


def same_case(run, plan) -> bool:
    """A decomposition of the plan's model at its nt."""
    p = run.meta.get("params") or {}
    return p.get("model") == plan["model"] and p.get("nt") == plan["nt"]


#: the page replays the latest decomposition of its plan's model and nt
REPLAY_WHERE = {"decompose": same_case}
#: the plan parameters that choose the replayed run (the others act in measure mode only)
REPLAY_KEYS = ("model", "nt")


#: the models round 5 decomposes (name -> the label its runs record)
MODELS = {"synthetic-7b": "synthetic-7b", "7b": "synthetic-7b", "gemma-3-270m-q4_k_m": "gemma-3-270m-q4_k_m",
          "gemma": "gemma-3-270m-q4_k_m"}


def layers(model: str) -> int:
    """The layer count of a model round 5 decomposes (from its config: no file is opened)."""
    cfg = synthetic.llama7b_config() if MODELS[model] == "synthetic-7b" else synthetic.gemma3_270m_config()
    return cfg.n_layer


def check_plan(params: dict) -> list[str]:
    """The page's parameters against each other (before it runs): the timeline layer exists in the model."""
    model, layer = params.get("model"), params.get("timeline_layer")
    if model in MODELS and isinstance(layer, int) and not 0 <= layer < layers(model):
        return [f"timeline_layer = {layer}: {model} has layers 0..{layers(model) - 1}"]
    return []


def gpu_model(model: str, kernel: str = "auto", attention: str = "auto"):
    """(model, GpuModel, label) of ``"synthetic-7b"`` / ``"7b"`` (attention inputs in fp16) or
    ``"gemma-3-270m-q4_k_m"`` / ``"gemma"`` (the GGUF under data/models/, fp32 attention inputs)."""
    if model not in MODELS:
        raise ValueError(f"round 5 decomposes {', '.join(MODELS)}, not {model!r}")
    f16 = MODELS[model] == "synthetic-7b"
    m = synthetic.load_model("synthetic-7b" if f16 else str(default_model_path()))
    gm = prefill.GpuModel(m, opts=prefill.PrefillOptions(attn_f16=f16, kernel=kernel, attention=attention))
    return m, gm, MODELS[model]


def measure(run, progress=print, *, model, nt, repeats, timeline_layer) -> None:
    """One decomposition of ``model`` at ``nt`` tokens into ``run`` (a new ``decompose`` run)."""
    m, gm, _ = gpu_model(model)
    decompose.record_decomposition(run, gm, prefill_runs.prompt_tokens(m, nt), repeats=repeats,
                                   timeline_layer=timeline_layer, progress=progress)


def step_prefill(out: Path, args) -> dict:
    """Gemma parity (logits, greedy-32 vs the CPU reference) and prefill throughput, Gemma and synthetic 7B."""
    with records.recording("prefill", {"model": str(default_model_path()), "nts": [512, 3325]},
                           root=out / "data") as run:
        par = prefill_runs.parity_run(str(default_model_path()), run, progress=args.log)
        prefill_runs.throughput_run(str(default_model_path()), [512, 3325], run, attn_f16=False, progress=args.log)
        prefill_runs.throughput_run("synthetic-7b", [512, 3325], run, attn_f16=True, progress=args.log)
        run.finish(greedy_identical=par["greedy"]["identical"])
    return {"ok": True, "run": run.run_id}


def step_decompose(out: Path, args) -> dict:
    """Round 5: decompositions of Gemma 3 270M and the synthetic 7B at nt=3325 (attention path: --attention)."""
    runs, ok = decompose_models(out, args, [m for m in args.decompose_models.split(",") if m])
    return {"ok": True, "valid": ok, "runs": runs}


def decompose_models(out: Path, args, models) -> tuple[list, bool]:
    """Record one decomposition per model ('gemma' | '7b'); returns (run ids, all valid)."""
    import gc

    ok = True
    runs = []
    attention = getattr(args, "attention", "auto")
    for name in models:
        m, gm, label = gpu_model(name, kernel=args.kernel, attention=attention)
        toks = prefill_runs.prompt_tokens(m, args.decompose_nt)
        args.log(f"decompose {label}: attention {gm.attn.name} ({gm.attn.note})")
        with records.recording(DATA[0], {"model": label, "nt": len(toks), "attn_f16": gm.opts.attn_f16,
                                         "kernel": args.kernel, "q6k_variant": gm.opts.q6k_variant or "gpu.gemm default",
                                         "q4k_kdr": gm.opts.q4k_kdr, "attention_requested": attention,
                                         **gm.attn.describe()}, root=out / "data") as run:
            r = decompose.record_decomposition(run, gm, toks, progress=args.log)
        ok = ok and r["busy_wall"]["valid"]
        runs.append(run.run_id)
        del gm, m
        gc.collect()
        gpu.cp().get_default_memory_pool().free_all_blocks()
    return runs, ok


def step_prefill7b(out: Path, args) -> dict:
    """Prefill throughput of the synthetic 7B only (no model file needed on the GPU machine)."""
    with records.recording("prefill", {"model": "synthetic-7b", "nts": [512, 3325]}, root=out / "data") as run:
        prefill_runs.throughput_run("synthetic-7b", [512, 3325], run, attn_f16=True, progress=args.log)
    return {"ok": True, "run": run.run_id}


def step_attention(out: Path, args) -> dict:
    """Issue 17: attention alone (cuDNN fused SDPA vs the lab's baseline vs PyTorch SDPA per backend, the 7B and
    Gemma 3 270M layouts, nt 512 / 3325 / 8192, interleaved CUDA-event medians; parity against the fp32 baseline),
    recorded as an ``attention`` run (data/05_wall_decomposition/); then round 5's decomposition of the synthetic 7B with --attention (auto)."""
    nts = [int(x) for x in args.attention_nts.split(",") if x]
    paths = attention.status()
    args.log(f"attention paths: {paths}")
    with records.recording("attention", {"layouts": {k: {lk: vars(v) for lk, v in d.items()}
                                                     for k, d in attention_kinds.bench_layouts().items()},
                                         "nts": nts, "dtype": args.attn_dtype, "pairs": 3, "repeats": 10,
                                         "scopes": ["op", "kernel"], "paths": paths}, root=out / "data") as run:
        res = attention_bench.record_bench(run, nts=nts, dtype=args.attn_dtype, progress=args.log)
    runs, valid = decompose_models(out, args, ["7b"])
    return {"ok": res["ok"], "run": run.run_id, "decompose_runs": runs, "decompose_valid": valid, "paths": paths}


def step_graph_nodes(out: Path, args) -> dict:
    """Issue 18: the memset nodes of the prefill's graph. Gemma 3 270M's dense GEMMs (stacked Q/K/V at nt 64 / 512 /
    3325, ...) and its cuDNN SDPA layer kinds, each captured alone into a CUDA graph and counted node by node
    (:mod:`.graph_census`): gemm_dense through cublasGemmEx (before) and cuBLASLt without split-K (after), outputs
    compared bitwise and to float64; the SDPA with the prefill's plan and every candidate plan. One ``prefill``
    run (tables dense_nodes, sdpa_nodes)."""
    params = {"what": "graph_nodes", "dense_points": [list(p) for p in graph_census.DENSE_POINTS],
              "dense_shapes": graph_census.GEMMA_DENSE, "dense_rtol": graph_census.DENSE_RTOL,
              "dense_path": blas.DENSE_PATH, "cudnn_plan": attention.CUDNN_PLAN, "sdpa_nts": list(graph_census.SDPA_NTS),
              "sdpa_plan_nts": list(graph_census.SDPA_PLAN_NTS), "sdpa_dtype": args.attn_dtype,
              "sdpa_kinds": {k: vars(v) for k, v in attention_kinds.bench_layouts()["gemma-3-270m"].items()}}
    with records.recording("prefill", params, root=out / "data") as run:
        dense = graph_census.dense_census(progress=args.log)
        run.append("dense_nodes", dense)
        try:
            sdpa = graph_census.sdpa_census(dtype=args.attn_dtype, progress=args.log)
        except (attention_kinds.AttentionUnavailable, attention_kinds.AttentionError) as e:
            sdpa = [{"kind": "all", "plan": "all", "error": f"{type(e).__name__}: {e}"}]
        run.append("sdpa_nodes", sdpa)
        v = graph_census.check(dense, sdpa)
        v["dense_fallbacks"] = blas.dense_fallbacks()
        for p in v["problems"]:
            args.log(f"graph_nodes: {p}")
        run.finish(**{k: x for k, x in v.items() if k != "ok"}, ok=v["ok"])
    args.log("graph_nodes: " + ", ".join(f"{k}={x}" for k, x in v.items() if k.startswith("memsets_")))
    args.log(f"graph_nodes: SDPA plans without a memset: {v['sdpa_plans_without_memset'] or 'none'}")
    return {**v, "run": run.run_id}


STEPS = {"prefill": step_prefill, "prefill7b": step_prefill7b, "decompose": step_decompose, "attention": step_attention,
         "prefill_graph": step_prefill_graph, "graph_nodes": step_graph_nodes}


def busy_wall_text(bw) -> str:
    """A decomposition's validity as a reader reads it: how the GPU's busy time compares with the wall. Busy and
    wall come from different replays (traced and untraced), so busy may exceed the wall by a hair; that is said,
    not printed as a negative gap."""
    gap, wall, busy = float(bw.gap_frac), float(bw.wall_ms), float(bw.busy_ms)
    if abs(gap) < 0.001:
        verdict = f"GPU busy {busy:.1f} ms = the wall {wall:.1f} ms within 0.1%: the kernel classes account for it all"
    elif gap > 0:
        verdict = (f"GPU busy {busy:.1f} ms of a {wall:.1f} ms wall: {100 * gap:.1f}% idle "
                   + ("(small enough: the classes stand for the wall)" if bool(bw.valid) else
                      "(too much idle: the classes do not stand for the wall)"))
    else:
        verdict = (f"GPU busy {busy:.1f} ms, {100 * -gap:.1f}% above the {wall:.1f} ms wall (busy and wall come "
                   f"from different replays)")
    return verdict


def what_changed(before, after) -> str:
    """What differs between two decompositions of the same model and nt, as a page says it: the GEMM kernel, the
    attention path (a run that names none ran the lab's baseline cuBLAS attention) and the mode (eager launches or
    one captured graph). Empty when none of these differ."""
    def facts_of(r):
        p, bw = r.meta.get("params") or {}, r.table("busy_wall").iloc[0]
        mode = bw.get("mode") if isinstance(bw.get("mode"), str) else "eager"
        return {"kernel": p.get("kernel") or "int8", "attention": p.get("attention") or "baseline",
                "mode": "graph replay" if mode == "graph" else mode}
    a, b = facts_of(before), facts_of(after)
    return ", ".join(f"{k} {a[k]} -> {b[k]}" if k != "mode" else f"{a[k]} -> {b[k]}" for k in a if a[k] != b[k])
