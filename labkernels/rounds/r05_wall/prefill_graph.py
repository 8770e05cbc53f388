"""Round 5's ``prefill_graph`` step, the prefill without host overhead: eager vs CUDA-graph prefill and the fusions,
interleaved in one process, with the decompositions of before and after (host overhead as a class, the replays' launch
gaps); recorded as ``prefill`` runs (the shared folder ``data/prefill/``), read by round 5's page and the prefill of
record (:func:`labkernels.prefill_runs.latest_graph_run`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import attention, attention_kinds, blas, gpu, prefill, prefill_replay, prefill_runs, records, synthetic
from ...model import default_model_path
from ...prefill import FUSIONS  # the fusion flags (prefill needs no GPU to import)
from . import decompose

#: the A/B of the prefill without host overhead: before = the round-7 prefill (eager, the small kernels unfused), the
#: fusions alone, and after = fused + CUDA-graph replay (name -> PrefillOptions fields over the base options; graph
#: None: a capture that fails runs eager with the reason in the rows' fallback column, and the step is not ok)

GRAPH_VARIANTS = {"eager-unfused": {"graph": False, **{f: False for f in FUSIONS}},
                  "eager-fused": {"graph": False},
                  # the graph with the defaults (from 20261201T20: lab+cudnn attention, PDL and the node rewrites on;
                  # the dequantized weights on fp16 cuBLAS since 20261201T18)
                  "graph-fused": {"graph": None},
                  # the same with those weights in fp32 (the default before 20261201T18): the other_f16 A/B
                  "graph-fused-f32dense": {"graph": None, "other_f16": False},
                  # the three graph options off (the default before 20261201T20) ...
                  "graph-fused-plain": {"graph": None, "pdl": False, "memsets_as_kernels": False, "ids_from_host": False},
                  # ... and only PDL off
                  "graph-fused-nodes": {"graph": None, "pdl": False},
                  # cuDNN's SDPA for every layer (auto's choice before 20261201T20), with and without the graph options:
                  # the latter is the whole default of 20261201T18
                  "graph-fused-cudnnattn": {"graph": None, "attention": "cudnn"},
                  "graph-fused-plain-cudnnattn": {"graph": None, "attention": "cudnn", "pdl": False,
                                                  "memsets_as_kernels": False, "ids_from_host": False}}
#: the graph options a variant may set (their defaults are recorded with each prefill_graph run)
GRAPH_OPTIONS = ("pdl", "memsets_as_kernels", "ids_from_host")
#: the variants whose decomposition (host overhead as a class, the replay's launch gaps) is recorded
GRAPH_DECOMPOSE_VARIANTS = ("eager-unfused", "graph-fused", "graph-fused-f32dense", "graph-fused-plain",
                            "graph-fused-nodes", "graph-fused-cudnnattn", "graph-fused-plain-cudnnattn")
#: the graph variants whose replays are stamped (replay_breakdown: where the wall outside the graph goes)
BREAKDOWN_VARIANTS = ("graph-fused", "graph-fused-plain", "graph-fused-cudnnattn")
GRAPH_BREAKDOWN_REPEATS = 11
GRAPH_NTS = (64, 128, 512, 1024, 3325)
GRAPH_DECOMPOSE_NTS = (64, 512, 3325)


def _logit_diff(a, b) -> dict:
    d = float(np.abs(a - b).max())
    return {"max_abs_diff": d, "max_rel_diff": d / float(np.abs(b).max()), "bitwise": bool(np.array_equal(a, b)),
            "top1_same": bool(a.argmax() == b.argmax())}


def graph_ab(gm, m, label: str, run, nts=GRAPH_NTS, dec_nts=GRAPH_DECOMPOSE_NTS, rounds: int = 5, repeats: int = 3,
             progress=print) -> dict:
    """The prefill_graph measurements of one model on one GpuModel (options switched per variant; the graph cache
    keys on them): per nt the logits of every variant against eager-unfused's, graph vs eager on a second prompt
    (the replay reads the new ids from its input buffer), the variants' walls interleaved round by round; the
    decompositions (host overhead as a class) of before and after, with and without programmatic launches, and the
    graph replays' launch-by-launch gaps (table replay_gaps); the captured graphs."""
    import dataclasses

    cp = gpu.cp()
    base = gm.opts

    def use(v):
        gm.opts = dataclasses.replace(base, **GRAPH_VARIANTS[v])

    names = []
    for v in GRAPH_VARIANTS:     # a variant whose attention path cannot run here is recorded with the reason, not run
        use(v)
        try:
            gm.attn
        except (attention_kinds.AttentionUnavailable, attention_kinds.AttentionError) as e:
            run.append("variants_unavailable", {"model": label, "variant": v, "reason": str(e)})
            progress(f"{label}: variant {v} left out: {e}")
            continue
        names.append(v)
    walls = {}
    for nt in nts:
        toks = prefill_runs.prompt_tokens(m, nt)
        ref = None
        for v in names:
            use(v)
            lg = cp.asnumpy(gm.forward(toks)).astype(np.float64)
            ref = lg if ref is None else ref
            run.append("logits_vs_first", {"model": label, "nt": nt, "variant": v, "mode": gm.last_mode,
                                           "first": names[0], **_logit_diff(lg, ref)})
        toks2 = prefill_runs.prompt_tokens(m, nt, seed=7)
        use("eager-fused")
        e2 = cp.asnumpy(gm.forward(toks2)).astype(np.float64)
        use("graph-fused")
        g2 = cp.asnumpy(gm.forward(toks2)).astype(np.float64)
        row = {"model": label, "nt": nt, "prompt": "second (seed 7)", "mode": gm.last_mode, **_logit_diff(g2, e2)}
        run.append("graph_vs_eager", row)
        progress(f"{label} nt={nt}: graph vs eager (2nd prompt) max rel diff {row['max_rel_diff']:.3g}, "
                 f"bitwise {row['bitwise']}")
        for rnd in range(rounds):
            for v in names:
                use(v)
                t = prefill_replay.timed_prefill(gm, toks, repeats=repeats)
                walls.setdefault((nt, v), []).append(t["wall_ms"])
                # "kernel" names the variant too: round 5's notebook groups recorded throughput rows by it
                run.append("throughput", {"model": label, "arch": gm.cfg.arch, "nt": nt, "variant": v,
                                          "kernel": f"{base.kernel} {v}",
                                          "mode": t["mode"], "fallback": t["fallback"], "round": rnd,
                                          "wall_ms": t["wall_ms"], "tok_per_s": t["tok_per_s"], "repeats": repeats,
                                          "gpu_span_ms": t["gpu_span_ms"], "host_outside_ms": t["host_outside_ms"],
                                          "attn_f16": base.attn_f16, "gemm_families": gm.families_used(),
                                          "attention": gm.attn.name, "attention_ran": gm.attn.ran(nt)})
        progress(f"{label} nt={nt}: " + ", ".join(f"{v} {np.median(walls[(nt, v)]):.2f} ms" for v in names))
    run.append("graphs", [{"model": label, **g} for g in gm.graphs()])
    for nt in nts:      # where the time outside the graph goes: host stamps and events around each replay
        toks = prefill_runs.prompt_tokens(m, nt)
        for v in (v for v in BREAKDOWN_VARIANTS if v in names):
            use(v)
            t = prefill_replay.timed_prefill(gm, toks, repeats=GRAPH_BREAKDOWN_REPEATS, breakdown=True)
            if t["breakdown"]:
                run.append("replay_breakdown", {"model": label, "nt": nt, "variant": v,
                                                "repeats": GRAPH_BREAKDOWN_REPEATS, **t["breakdown"]})
        progress(f"{label} nt={nt}: outside the graph " + ", ".join(
            f"{k[:-3]} {v:.3f}" for k, v in (t["breakdown"] or {}).items()) + " ms")
    gaps = {}
    for nt in dec_nts:
        toks = prefill_runs.prompt_tokens(m, nt)
        for v in (v for v in GRAPH_DECOMPOSE_VARIANTS if v in names):
            use(v)
            r = decompose.run_decomposition(gm, toks, repeats=repeats, reference=False, progress=progress)
            if r["replay_gaps"]:
                run.append("replay_gaps", [{"model": label, "nt": nt, "variant": v, **g} for g in r["replay_gaps"]])
            bw = r["busy_wall"]
            t = decompose.host_overhead_table(r["classes"], bw)
            host = float(t.loc[t["class"] == "host_overhead", "busy_ms"].iloc[0])
            run.append("decompose_classes", t.assign(model=label, nt=nt, variant=v, mode=bw["mode"]))
            run.append("decompose_busy_wall", [{"model": label, "nt": nt, "variant": v,
                                                **{k: bw[k] for k in ("mode", "wall_ms", "busy_ms", "gap_ms",
                                                                      "gap_frac", "busy_replay_ms",
                                                                      "busy_sum_replay_ms", "span_replay_ms",
                                                                      "idle_replay_ms", "wall_paired_ms")},
                                                "host_overhead_ms": host, "host_frac": host / bw["wall_ms"]}])
            gaps[(nt, v)] = host / bw["wall_ms"]
    gm.opts = base
    return {"walls": walls, "gaps": gaps}


def step_prefill_graph(out: Path, args) -> dict:
    """The prefill without host overhead: eager vs CUDA-graph prefill (and the fusions) at nt 64..3325 for the
    synthetic 7B and Gemma 3 270M (when its GGUF is here), interleaved in one process; logits parity; round 5's
    decomposition with host overhead as a class before (eager, unfused) and after (graph, fused) at nt 64, 512, 3325.
    One recorded run per model."""
    import gc

    want = [m for m in (getattr(args, "graph_models", None) or "7b,gemma").split(",") if m]
    models = []
    gemma = Path(args.gemma or default_model_path())
    for w in want:
        if w == "7b":
            models.append("synthetic-7b")
        elif w == "gemma" and gemma.exists():
            models.append(str(gemma))
        elif w == "gemma":
            args.log(f"prefill_graph: no Gemma GGUF at {gemma}: left out")
        elif w in synthetic.SYNTHETIC:
            models.append(w)
        else:
            raise SystemExit(f"prefill_graph: unknown model {w!r}: 7b, gemma or one of {', '.join(synthetic.SYNTHETIC)}")
    cp = gpu.cp()
    runs, summary, ok = [], {}, True
    for spec in models:
        label = spec if spec in synthetic.SYNTHETIC else "gemma-3-270m-q4_k_m"
        params = {"what": "graph", "model": label, "nts": list(GRAPH_NTS), "decompose_nts": list(GRAPH_DECOMPOSE_NTS),
                  "variants": GRAPH_VARIANTS,
                  "option_defaults": {f: getattr(prefill.PrefillOptions(), f)
                                      for f in GRAPH_OPTIONS + ("other_f16", "attention")},
                  "attn_f16": True, "kernel": args.kernel,
                  "dense_path": blas.DENSE_PATH, "cudnn_plan": attention.CUDNN_PLAN}
        with records.recording("prefill", params, root=out / "data") as run:
            m = synthetic.load_model(spec)
            gm = prefill.GpuModel(m, opts=prefill.PrefillOptions(attn_f16=True, kernel=args.kernel))
            r = graph_ab(gm, m, label, run, progress=args.log)
            w = {k: float(np.median(v)) for k, v in r["walls"].items()}
            s = {f"speedup_nt{nt}": w[(nt, "eager-unfused")] / w[(nt, "graph-fused")] for nt in GRAPH_NTS}
            s.update({f"host_frac_nt{nt}_{v}": g for (nt, v), g in r["gaps"].items()})
            s["graph_fallbacks"] = gm.graph_fallbacks
            run.finish(**s)
        summary[label] = s
        ok = ok and not gm.graph_fallbacks
        runs.append(run.run_id)
        gm.free_graphs()
        del gm, m
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
    return {"ok": ok, "runs": runs, **summary}
