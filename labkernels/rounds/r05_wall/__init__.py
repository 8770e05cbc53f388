"""Round 5 -- wall decomposition: a whole prefill taken apart launch by launch (``notebooks/05_wall_decomposition``):
the page measures or replays one decomposition (a ``decompose`` run of the plan's model and nt); the GPU checks record
prefill parity and throughput (``prefill`` runs, the shared folder) and the decompositions of both models.

The round's package holds what only it uses: :mod:`.decompose` (the decomposition: CUPTI trace, busy vs wall, class
table, priced queue, host overhead, the graph runs' history), its gpu check steps here (prefill, prefill7b, decompose,
attention, graph_nodes; as records, :data:`STEP_RECORDS`) and in :mod:`.prefill_graph` (the prefill without host
overhead: eager against the whole forward captured as one CUDA graph, and the small kernels fused), the benchmark of
attention alone that came with the fused attention path (:mod:`.attention_bench`) and the census of the memset nodes in
the prefill's graph (:mod:`.graph_census`)."""

from __future__ import annotations

from pathlib import Path

from ... import attention, attention_kinds, blas, facts, gpu, prefill, prefill_runs, records, synthetic
from ...model import default_model_path
from .. import NO_PREDICTION, NO_VERDICT, Step
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
    """Attention alone, the benchmark that came with the prefill's fused attention path (cuDNN fused SDPA vs the lab's
    baseline vs PyTorch SDPA per backend, the 7B and Gemma 3 270M layouts, nt 512 / 3325 / 8192, interleaved
    CUDA-event medians; parity against the fp32 baseline), recorded as an ``attention`` run
    (data/05_wall_decomposition/); then round 5's decomposition of the synthetic 7B with --attention (auto)."""
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
    """The memset nodes of the prefill's captured graph (each costs the launches around it idle time). Gemma 3 270M's
    dense GEMMs (stacked Q/K/V at nt 64 / 512 /
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


def view_throughput(run):
    """Tokens per second per model, nt and variant (the kernel, or the graph variant): medians over the rounds."""
    t = run.table("throughput")
    by = [c for c in ("model", "nt") if c in t] + [c for c in ("variant", "kernel") if c in t][:1]
    return t.groupby(by, as_index=False).tok_per_s.median()


def view_classes(run):
    """The decomposition's busy time by kernel class."""
    return run.table("classes")


def view_attention(run):
    """Attention alone: per layout, layer kind and nt, each path's time and TFLOPS and the ratios between them."""
    return run.table("summary")


def view_graph_nodes(run):
    """The dense GEMMs' census: graph nodes (memsets among them) per shape, nt, type and cuBLAS path."""
    return run.table("dense_nodes")


#: the gpu check arguments round 5's steps define (several steps read some of them; --gemma, --dense-path and
#: --cudnn-plan are gpu check's shared ones)
ARG_DECOMPOSE_NT = (("--decompose-nt",), dict(type=int, default=3325, help="prompt tokens of the decomposition steps"))
ARG_DECOMPOSE_MODELS = (("--decompose-models",), dict(default="gemma,7b", help="comma list of gemma, 7b"))
ARG_GRAPH_MODELS = (("--graph-models",), dict(default="7b,gemma", help="prefill_graph: comma list of 7b, gemma (the "
                                              "real GGUF), synthetic-gemma3 (its shapes, random weights)"))
ARG_KERNEL = (("--kernel",), dict(default="auto", help="qmatmul kernel of the decompose, attention and prefill_graph "
                                                       "steps (default auto)"))
ARG_ATTENTION = (("--attention",), dict(default="auto", help="attention path of the decompose / attention steps: "
                                                             "auto | cudnn | torch | baseline (labkernels.attention)"))
ARG_ATTN_DTYPE = (("--attn-dtype",), dict(default="f16", help="input type of the fused attention: f16 | bf16"))
ARG_ATTENTION_NTS = (("--attention-nts",), dict(default="512,3325,8192", help="token counts of the attention benchmark"))
#: the shared flags of a step that runs a forward (or the census) in this process
PATHS = ("--dense-path", "--cudnn-plan")

#: round 5's prefill_graph runs (``what: graph``, data/prefill/), in order; the last two failed
GRAPH_RUNS = (
    "20261201T114018Z-h200-b86cc82a0f", "20261201T114130Z-h200-b86cc82a0f", "20261201T114514Z-h200-e926c9faa4",
    "20261201T114708Z-h200-f321aeff3e", "20261201T124917Z-h200-866dd92a88", "20261201T125049Z-h200-866dd92a88",
    "20261201T125958Z-h200-f295dbe704", "20261201T130027Z-h200-f295dbe704", "20261201T130605Z-h200-2bbf518a50",
    "20261201T130632Z-h200-2bbf518a50", "20261201T131055Z-h200-51fd91f123", "20261201T131123Z-h200-51fd91f123",
    "20261201T132423Z-h200-34f706fcc9", "20261201T132454Z-h200-34f706fcc9", "20261201T132809Z-h200-ee1eab2fc9",
    "20261201T132916Z-h200-ee1eab2fc9", "20261201T145426Z-h200-8b88856bfa", "20261201T145453Z-h200-8b88856bfa",
    "20261201T145658Z-h200-8b88856bfa", "20261201T145736Z-h200-8b88856bfa", "20261201T145811Z-h200-8b88856bfa",
    "20261201T145843Z-h200-8b88856bfa", "20261201T160549Z-h200-bf2a4ebb7e", "20261201T161416Z-h200-47caa72e2a",
    "20261201T162640Z-h200-7a84cee2ef", "20261201T162724Z-h200-7a84cee2ef", "20261201T163230Z-h200-3b356ed330",
    "20261201T163307Z-h200-3b356ed330", "20261201T163853Z-h200-867ee232fc", "20261201T175150Z-h200-5fd9d93420",
    "20261201T180033Z-h200-f108e8f5b5", "20261201T180116Z-h200-f108e8f5b5", "20261201T180839Z-h200-d2f29dd898",
    "20261201T181810Z-h200-4380af247a", "20261201T181853Z-h200-4380af247a", "20261201T193656Z-h200-f72452be34",
    "20261201T194423Z-h200-12ab96e415", "20261201T195305Z-h200-1a431eef1d", "20261201T195405Z-h200-1a431eef1d",
    "20261201T201433Z-h200-4f0922ccf5", "20261201T201603Z-h200-4f0922ccf5", "20261201T234410Z-h200-aabdc92125",
    "20261202T004050Z-h200-1aa241b4df", "20261202T050520Z-h200-a25f3a192a", "20261202T050907Z-h200-a25f3a192a",
    "20261202T080214Z-h200-323d03dbd9", "20261202T080439Z-h200-323d03dbd9", "20261203T130924Z-h200-0c5a1a2d3c",
    "20261203T132249Z-h200-2070f2103c")


def _step(**kw) -> Step:
    return Step(**{"series": "prefill", "prediction": NO_PREDICTION, "verdict": NO_VERDICT, **kw})


#: the round's steps as records (``gpu check --round 5 --step N|NAME``), numbered in the order first recorded
STEP_RECORDS = (
    _step(number=1, name="prefill", run=step_prefill, view=view_throughput, args=PATHS,
          plan={"model": "data/models/gemma-3-270m-q4_k_m.gguf", "nts": [512, 3325]},
          title="the prefill under test: Gemma 3 270M's logits and 32-token greedy continuation against the CPU "
                "reference, and prefill throughput of Gemma 3 270M and the synthetic 7B",
          runs=("20261130T110011Z-h200-3b01744cd1",), commit="3b01744"),
    _step(number=2, name="decompose", series="decompose", run=step_decompose, view=view_classes,
          args=(ARG_DECOMPOSE_MODELS, ARG_DECOMPOSE_NT, ARG_KERNEL, ARG_ATTENTION, *PATHS), plan=PLAN,
          title="the decomposition: a prefill of Gemma 3 270M and the synthetic 7B at nt=3325 traced launch by launch "
                "with CUPTI, busy vs wall, the kernel classes, their matched-shape references and the priced queue",
          runs=("20261130T110312Z-h200-6b488c5302", "20261130T110317Z-h200-6b488c5302",
                "20261130T111147Z-h200-414d13f20b", "20261130T111424Z-h200-2fa9c55ff6",
                "20261130T112242Z-h200-74f156ae7a", "20261201T091637Z-h200-5033344a35",
                "20261201T092332Z-h200-7a22206e36", "20261201T104817Z-h200-b0b81131f1",
                "20261201T113022Z-h200-10c958662b"), commit="10c9586",
          verdict="the page's headline for the synthetic 7B at nt=3325 (run 20261201T113022Z, a graph replay traced "
                  "with CUPTI): GPU busy 101.5 ms = the wall 101.5 ms within 0.1%, so the kernel classes account for "
                  "it all; 17,927 -> 32,763 tok/s against run 20261201T104817Z (attention baseline -> cuDNN, eager -> "
                  "graph replay), attention classes 98 -> 13 ms, GEMM classes 68 -> 72 ms; principal class "
                  "gemm_q4k:ffn_gate_up, 28 ms (28% of the wall)"),
    _step(number=3, name="prefill7b", run=step_prefill7b, view=view_throughput, args=PATHS,
          plan={"model": "synthetic-7b", "nts": [512, 3325]},
          title="prefill throughput of the synthetic 7B only (no model file needed on the GPU machine)",
          runs=("20261130T111123Z-h200-414d13f20b", "20261130T111359Z-h200-2fa9c55ff6"), commit="2fa9c55"),
    _step(number=4, name="attention", series="attention", run=step_attention, view=view_attention,
          args=(ARG_ATTENTION_NTS, ARG_ATTN_DTYPE, ARG_DECOMPOSE_NT, ARG_KERNEL, ARG_ATTENTION, *PATHS),
          title="attention alone: the lab's fused kernel, cuDNN's fused SDPA, the lab's baseline and PyTorch SDPA per "
                "layer kind of the 7B and Gemma 3 270M layouts, parity-gated, interleaved; then the 7B decomposed",
          runs=("20261201T112957Z-h200-10c958662b", "20261201T193642Z-h200-f72452be34",
                "20261201T194347Z-h200-12ab96e415"), commit="12ab96e",
          verdict="the page: the lab's fused kernel takes about as long as cuDNN's at nt=512 (16.6 us against 15.8 us "
                  "plus the 0.8 us memset node, traced replays of synthetic-gemma3 run 20261201T194423Z) but is 2-3x "
                  "slower at nt=3325 (101-145 against 231-277 TFLOPS, attention run 20261201T194347Z), so auto is "
                  "lab+cudnn: the lab's kernel below 40 query-block CTAs (Gemma up to 512 tokens), cuDNN's SDPA "
                  "elsewhere"),
    _step(number=5, name="prefill_graph", what="graph", run=step_prefill_graph, view=view_throughput,
          args=(ARG_GRAPH_MODELS, "--gemma", ARG_KERNEL, *PATHS),
          title="the prefill without host overhead: eager against the whole forward captured as one CUDA graph, the "
                "small kernels fused, interleaved at nt 64..3325, with the decompositions of before and after (host "
                "overhead as a class)",
          runs=GRAPH_RUNS, commit="323d03d",
          prediction=f"the targets set with the captured-graph prefill: {facts.TARGETS['host_overhead'].what}; Gemma "
                     "3 270M at nt=512 >= 1.5x llama-bench pp512, and never below 1.0x at any nt (the page)",
          verdict="the page: the 5% target met for both models in runs 20261201T201433Z / 201603Z (commit 4f0922c), "
                  "Gemma 3 270M's nt=512 replay at 2.7% host overhead (wall 1.563 ms), the synthetic 7B's at 4.4%; "
                  "over the recorded runs 'the 5% target at nt=512 is met in some runs and not in others' (in the lt / "
                  "gemm_ex A/B of runs 20261201T145658Z-145843Z the spread between runs of one dense path, 3.5-7.4% "
                  "at nt=512, is above the difference between the paths)"),
    _step(number=6, name="graph_nodes", what="graph_nodes", run=step_graph_nodes, view=view_graph_nodes,
          args=(ARG_ATTN_DTYPE, *PATHS),
          title="the memset nodes of the prefill's graph: Gemma 3 270M's dense GEMMs and cuDNN SDPA layer kinds, each "
                "captured alone and counted node by node (cublasGemmEx against cuBLASLt without split-K; every SDPA "
                "plan)", runs=("20261201T145258Z-h200-8b88856bfa",), commit="8b88856"),
)
#: their gpu check names (``gpu check --steps prefill,decompose,...``)
STEPS = {s.name: s.run for s in STEP_RECORDS}


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
