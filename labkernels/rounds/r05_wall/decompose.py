"""Round 5: a whole prefill taken apart launch by launch (the seeds' 000 method).

1. Trace every launch of one prefill with CUPTI (``labkernels.trace``): kernel, start, end, grid, and the op /
   layer / weight tensor it served (external correlation ids).
2. Busy vs wall: GPU busy time summed over launches vs the untraced prefill's wall time; the decomposition
   is declared valid only when the gap is small (``VALID_GAP``).
3. Work normalization: each GEMM class's MACs from its shapes, us/GMAC and TOPS; attention in FLOPs.
4. Matched-shape reference per GEMM class at the same nt: cuBLAS fp16 on cached dequantized weights (and
   the mma.sync line), measured in the same process.
5. Priority queue with prices: ms recoverable if a class ran at its reference rate, and the tok/s ceiling
   ``n / (wall - recoverable)``, computed from the measured numbers.
6. Versioned: the record carries the commit and the kernel variants.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ... import bench, gpu, peers, prefill_replay, records, trace

VALID_GAP = 0.05   # busy must be within 5% of wall for the decomposition to stand for the wall


def weight_class(op: str, cls: str, qtype_of: dict | None = None, weight: str | None = None) -> str:
    """Refine GEMM classes by weight role: gemm_q6k/ffn_down, gemm_q4k/attn_q, ..."""
    if cls.startswith("gemm") or cls == "output_head":
        return f"{cls}:{op}"
    return cls


def classify(records: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(records)
    df["class"] = [weight_class(o or "", c, {}, w) for o, c, w in zip(df.op, df.cls, df.weight)]
    return df


def class_table(df: pd.DataFrame, ops, wall_ms: float, n_tokens: int) -> pd.DataFrame:
    """Busy time, share, launches, MACs and per-GMAC rate per class."""
    macs = {}
    flops = {}
    for o in ops:
        key = weight_class(o.name, o.cls, {}, o.weight)
        macs[key] = macs.get(key, 0) + (o.macs or 0)
        flops[key] = flops.get(key, 0) + (o.flops or 0)
    g = df.groupby("class")
    t = pd.DataFrame({"launches": g.size(), "busy_ms": g.duration_ns.sum() / 1e6,
                      "kernels": g.name.agg(lambda s: "; ".join(sorted(set(_short(x) for x in s))))})
    t["gmac"] = [macs.get(c, 0) / 1e9 for c in t.index]
    t["gflop_attn"] = [flops.get(c, 0) / 1e9 for c in t.index]
    busy = t.busy_ms.sum()
    t["share_busy"] = t.busy_ms / busy
    t["share_wall"] = t.busy_ms / wall_ms
    t["us_per_gmac"] = np.where(t.gmac > 0, t.busy_ms * 1e3 / t.gmac.replace(0, np.nan), np.nan)
    t["tops_eq"] = np.where(t.gmac > 0, 2 * t.gmac * 1e9 / (t.busy_ms * 1e-3) / 1e12, np.nan)
    t["tflops_attn"] = np.where(t.gflop_attn > 0, t.gflop_attn * 1e9 / (t.busy_ms * 1e-3) / 1e12, np.nan)
    return t.sort_values("busy_ms", ascending=False)


def _short(name: str) -> str:
    s = str(name)
    return s[:60]


def priority_queue(t: pd.DataFrame, ref_us_per_gmac: dict, wall_ms: float, n_tokens: int,
                   hidden_tax_ms: dict | None = None, ref_tflops: float | None = None) -> pd.DataFrame:
    """For each class with a reference rate: ms recoverable at that rate and the resulting tok/s ceiling.

    recoverable = busy - gmac * ref_us_per_gmac / 1e3 (never negative); ceiling = n / (wall - recoverable
    + hidden tax). ``hidden_tax_ms`` adds costs a change would create elsewhere (e.g. a prepass that grows
    when a class moves onto the int8 path).
    """
    rows = []
    for cls, r in t.iterrows():
        if ref_tflops and r.get("gflop_attn", 0) and not r.gmac:
            # FLOP-counted classes (attention GEMMs): priced at the matched cuBLAS fp16 GEMM rate
            at_ref = r.gflop_attn * 1e9 / (ref_tflops * 1e12) * 1e3
            rec = max(0.0, r.busy_ms - at_ref)
            tax = (hidden_tax_ms or {}).get(cls, 0.0)
            rows.append({"class": cls, "busy_ms": r.busy_ms, "gmac": r.gflop_attn / 2, "us_per_gmac": r.busy_ms * 1e3 / (r.gflop_attn / 2),
                         "ref_us_per_gmac": 2e3 / ref_tflops, "ratio_to_ref": r.busy_ms / at_ref, "ms_at_ref": at_ref,
                         "recoverable_ms": rec, "hidden_tax_ms": tax, "wall_after_ms": wall_ms - rec + tax,
                         "tok_s_now": n_tokens / (wall_ms / 1e3), "tok_s_ceiling": n_tokens / ((wall_ms - rec + tax) / 1e3),
                         "reference": f"same FLOPs at the matched cuBLAS fp16 GEMM rate ({ref_tflops:.0f} TFLOPS)"})
            continue
        ref = ref_us_per_gmac.get(cls)
        how = "cuBLAS fp16, cached dequantized weights, same (nt, od, id)"
        if ref is None and r.gmac and ref_tflops:
            ref, how = 2e3 / ref_tflops, f"no matched shape measured: the median matched cuBLAS fp16 rate ({ref_tflops:.0f} TFLOPS)"
        if ref is None or not r.gmac:
            continue
        at_ref = r.gmac * ref / 1e3
        rec = max(0.0, r.busy_ms - at_ref)
        tax = (hidden_tax_ms or {}).get(cls, 0.0)
        rows.append({"class": cls, "busy_ms": r.busy_ms, "gmac": r.gmac, "us_per_gmac": r.us_per_gmac,
                     "ref_us_per_gmac": ref, "ratio_to_ref": r.us_per_gmac / ref, "ms_at_ref": at_ref,
                     "recoverable_ms": rec, "hidden_tax_ms": tax,
                     "wall_after_ms": wall_ms - rec + tax,
                     "tok_s_now": n_tokens / (wall_ms / 1e3),
                     "tok_s_ceiling": n_tokens / ((wall_ms - rec + tax) / 1e3),
                     "reference": how})
    q = pd.DataFrame(rows)
    return q.sort_values("recoverable_ms", ascending=False) if len(q) else q


def fp16_rate_tflops(refs: pd.DataFrame, min_nt: int = 64) -> float | None:
    """Median cuBLAS fp16 rate (TFLOPS) of the matched GEMM references at prefill-sized nt."""
    if refs is None or not len(refs):
        return None
    r = refs[refs.nt >= min_nt]
    return float((2e3 / r.us_per_gmac).median()) if len(r) else None


def full_queue(classes: pd.DataFrame, refs: pd.DataFrame, wall_ms: float, n_tokens: int) -> pd.DataFrame:
    """The queue over every priced class: GEMMs at their matched references, attention at the fp16 rate."""
    t = classes.set_index("class") if "class" in classes.columns else classes
    ref = {r["class"]: r.us_per_gmac for _, r in refs.iterrows()} if refs is not None and len(refs) else {}
    return priority_queue(t, ref, wall_ms, n_tokens, ref_tflops=fp16_rate_tflops(refs))


def busy_wall(df: pd.DataFrame, wall_ms: float) -> dict:
    busy = df.duration_ns.sum() / 1e6
    span = (df.end.max() - df.start.min()) / 1e6
    return {"busy_ms": busy, "wall_ms": wall_ms, "gap_ms": wall_ms - busy, "gap_frac": (wall_ms - busy) / wall_ms,
            "traced_span_ms": span, "valid": abs(wall_ms - busy) / wall_ms <= VALID_GAP}


def busy_union_ns(recs) -> int:
    """GPU-busy time of a set of launch records (``start``, ``duration_ns``): the length of the union of their
    intervals. With programmatic dependent launch a kernel's record can begin while the one before it still runs
    (it waits in griddepcontrol.wait): summing durations would count that time twice."""
    iv = sorted((int(r["start"]), int(r["start"]) + int(r["duration_ns"])) for r in recs)
    total, cur_s, cur_e = 0, None, None
    for a, b in iv:
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def replay_gaps(recs) -> list[dict]:
    """Launch by launch in start order: name, start (us from the first), duration and the gap before it -- its start
    minus the latest end of every launch before it (negative: it began while an earlier one ran, as a programmatic
    launch may) -- the idle time a graph's node boundaries cost."""
    recs = sorted(recs, key=lambda r: int(r["start"]))
    if not recs:
        return []
    t0, last_end, prev, out = int(recs[0]["start"]), None, None, []
    for i, r in enumerate(recs):
        st, du = int(r["start"]), int(r["duration_ns"])
        out.append({"i": i, "name": str(r.get("name", ""))[:80], "prev": prev, "start_us": (st - t0) / 1e3,
                    "dur_us": du / 1e3, "gap_before_us": np.nan if last_end is None else (st - last_end) / 1e3})
        last_end = st + du if last_end is None else max(last_end, st + du)
        prev = out[-1]["name"]
    return out


def kernel_kind(name: str) -> str:
    """A short label of a launch's origin from its name: memset / memcpy, cuBLAS, cuDNN, the lab's wgmma GEMMs, the
    lab's prefill kernels (their function names), CuPy's elementwise kernels, else other."""
    n = str(name)
    if n in ("memset", "memcpy"):
        return n
    if "cudnn" in n:
        return "cudnn"
    if "wgmma_kq" in n:
        return "lab_wgmma"
    if any(k in n for k in ("gemm", "gemv", "xmma", "cublas", "sm90_", "sm80_")):
        return "cublas"
    if n.startswith("_Z") or "_kernel" in n:
        return "lab"
    if n.startswith("cupy_"):
        return "cupy"
    return "other"


def gap_summary(gaps: pd.DataFrame) -> pd.DataFrame:
    """Idle time between consecutive launches by (kind before -> kind after): boundaries, total and median gap (us),
    negative gaps (overlap) counted as zero idle time."""
    g = gaps.dropna(subset=["gap_before_us"]).copy()
    if g.empty:
        return pd.DataFrame(columns=["transition", "boundaries", "idle_us", "median_gap_us"])
    g["transition"] = g.prev.map(kernel_kind) + " -> " + g.name.map(kernel_kind)
    g["idle"] = g.gap_before_us.clip(lower=0)
    keys = [k for k in ("model", "nt", "variant") if k in g.columns]
    t = g.groupby(keys + ["transition"]).agg(boundaries=("idle", "size"), idle_us=("idle", "sum"),
                                            median_gap_us=("gap_before_us", "median")).reset_index()
    return t.sort_values(keys + ["idle_us"], ascending=[True] * len(keys) + [False]).reset_index(drop=True)


HOST = "host_overhead"


def host_overhead_table(classes: pd.DataFrame, bw: dict) -> pd.DataFrame:
    """The class table with the host's share as one more class: ``host_overhead`` = wall - GPU busy (the time
    the GPU waited for the host: Python, kernel launches, synchronization), never negative; GPU busy is that of the
    traced graph replay when the wall was a graph's (``busy_replay_ms``), else the classes' sum. ``share_wall``
    of every row is over the wall."""
    t = classes.reset_index().rename(columns={"index": "class"}) if "class" not in classes.columns else classes.copy()
    t = t[t["class"] != HOST]
    busy = bw.get("busy_replay_ms", np.nan)
    busy = float(bw["busy_ms"]) if busy is None or not np.isfinite(busy) else float(busy)
    gap = max(0.0, float(bw["wall_ms"]) - busy)
    row = {c: np.nan for c in t.columns}
    row.update({"class": HOST, "launches": 0, "busy_ms": gap, "gmac": 0.0, "gflop_attn": 0.0,
                "kernels": "wall minus GPU busy (Python, launches, synchronization)"})
    t = pd.concat([t, pd.DataFrame([row])], ignore_index=True)
    t["share_wall"] = t.busy_ms / float(bw["wall_ms"])
    return t.sort_values("busy_ms", ascending=False).reset_index(drop=True)


#: graph mode: timed replays for the wall, traced replays for the busy (medians of each)
GRAPH_WALL_REPEATS = 11
GRAPH_BUSY_REPLAYS = 5


def host_overhead_untraced(throughput: pd.DataFrame, busy_wall: pd.DataFrame) -> pd.DataFrame:
    """Host overhead of the graph forwards of a prefill_graph run, per (model, nt, variant) of the graph rows of
    ``busy_wall``: the median wall of the interleaved throughput rounds (``rounds`` of them, each a median of its
    repeats, timed before any tracing in that process) minus the median GPU busy of the traced replays (the union of
    their launch intervals), over that wall -- ``host_frac``, the issue's wall minus busy.

    Where the rows have the graph's own execution span (two event-record nodes in it, runs from 20261201T162640Z on),
    the figure splits into ``host_outside_ms`` (wall - that span, median over rounds: Python, the launch and its
    latency, the logits copy, the synchronization -- a difference within each untraced forward) and
    ``graph_idle_ms`` (that span - the traced busy: the gaps between the graph's nodes, untraced). GPU clocks can
    differ between the two phases: where the untraced GPU ran slower (the synthetic 7B's sustained runs, 5-7% at nt
    512 and 3325), ``graph_idle_ms`` and the whole figure count GPU time as host time; ``graph_idle_traced_ms`` is the
    traced replays' own gaps (span - busy in one replay; CUPTI lengthens them: Gemma 0.25 ms against 0.07 untraced
    at nt=512, run 20261201T163146Z). ``host_frac_paired`` (runs that record ``wall_paired_ms``): the same difference with the
    wall of untraced forwards each timed just before one of the traced replays, at the clocks those replays saw."""
    g = busy_wall[(busy_wall["mode"] == "graph") & busy_wall["busy_replay_ms"].notna()]
    rows = []
    for _, r in g.iterrows():
        t = throughput[(throughput["nt"] == r["nt"]) & (throughput["variant"] == r["variant"])
                       & (throughput["mode"] == "graph")]
        if "model" in throughput.columns and "model" in r:
            t = t[t["model"] == r["model"]]
        if t.empty:
            continue
        w = float(t["wall_ms"].median())
        b = float(r["busy_replay_ms"])
        wp = float(r.get("wall_paired_ms", np.nan))
        row = {"model": r.get("model"), "nt": int(r["nt"]), "variant": r["variant"], "wall_ms": w,
               "rounds": len(t), "busy_ms": b, "host_overhead_ms": w - b, "host_frac": (w - b) / w,
               "wall_paired_ms": wp, "host_frac_paired": (wp - b) / wp if np.isfinite(wp) else np.nan,
               "host_outside_ms": np.nan, "graph_idle_ms": np.nan,
               "graph_idle_traced_ms": float(r.get("idle_replay_ms", np.nan))}
        if "host_outside_ms" in t.columns and t["host_outside_ms"].notna().all():
            outside = float(t["host_outside_ms"].median())
            row.update(host_outside_ms=outside, graph_idle_ms=w - outside - b)
        rows.append(row)
    return pd.DataFrame(rows)


#: graph variants of recorded prefill_graph runs that did not measure what their name says: (commit prefix, variant)
#: -> why (left out of :func:`graph_run_history`)
SUPERSEDED = {("f108e8f", "graph-fused-f16dense"): "set other_f16 after loading: its weights stayed fp32 (fixed in "
                                                    "aefb8c4)"}
#: the graph options a history row names (runs before an option had it off)
HISTORY_OPTIONS = ("other_f16", "pdl", "memsets_as_kernels", "ids_from_host")


def _auto_attention(commit: str) -> str:
    """What ``attention="auto"`` resolved to on the GPU machine in a run whose throughput rows do not name the path
    (before 20261201T20): lab+cudnn at commit 1a431ee (runs 195305Z / 195405Z), cudnn before."""
    return "lab+cudnn" if commit.startswith("1a431ee") else "cudnn"


def graph_run_history(model: str, last: int = 4, root=None) -> pd.DataFrame:
    """The host-overhead figure (wall minus GPU busy of the captured prefill) over the latest ``last`` recorded
    prefill_graph runs of ``model`` (newest first): one row per graph variant and nt of :func:`host_overhead_untraced`,
    with the run, its GPU, its dense GEMM path and the variant's graph options (its own settings over the run's recorded defaults; the runs from 20261201T160549Z to
    163853Z had pdl / memsets_as_kernels / ids_from_host on by default and recorded no defaults; other_f16 is off in
    runs that do not name it) and the attention path (the throughput rows name it from 20261201T20, see
    :func:`_auto_attention` before; ``attention_ran``: which paths a routed backend took at that nt, in runs that
    record it, else None). Variants listed in :data:`SUPERSEDED` are left out."""
    rows, seen = [], []
    for r in records.list_runs("prefill", root)[::-1]:
        if not r.has("decompose_busy_wall") or not r.has("throughput"):
            continue
        thr = r.table("throughput")
        if "model" not in thr or model not in set(thr.model):
            continue
        h = host_overhead_untraced(thr[thr.model == model], r.table("decompose_busy_wall"))
        params = r.meta.get("params") or {}
        gr = r.table("graphs") if r.has("graphs") else pd.DataFrame()
        at = {f: False for f in HISTORY_OPTIONS}
        if "pdl" in gr.columns:
            at.update(params.get("option_defaults") or {"pdl": True, "memsets_as_kernels": "memsets_replaced" in gr.columns,
                                                       "ids_from_host": "ids_from_host" in gr.columns})
        commit = str(r.provenance.get("git_commit", ""))
        mt = thr[thr.model == model]
        ran = mt.groupby("variant").attention.first().to_dict() if "attention" in mt else {}
        took = mt.groupby(["variant", "nt"]).attention_ran.first().to_dict() if "attention_ran" in mt else {}
        for row in h.to_dict("records"):
            v = row["variant"]
            if not v.startswith("graph-") or any(commit.startswith(c) and v == sv for c, sv in SUPERSEDED):
                continue
            own = (params.get("variants") or {}).get(v, {})
            rows.append({"run": r.run_id, "gpu": peers.run_gpu_name(r), "dense_path": params.get("dense_path", "gemm_ex"),
                         **{f: bool(own.get(f, at[f])) for f in HISTORY_OPTIONS},
                         "attention": ran.get(v) or own.get("attention") or _auto_attention(commit),
                         "attention_ran": took.get((v, row["nt"])), **row})
        seen.append(r.run_id)
        if len(seen) >= last:
            break
    return pd.DataFrame(rows)


def run_decomposition(gm, tokens, repeats: int = 3, reference: bool = True, progress=print) -> dict:
    """Untraced wall timing, one traced prefill, class table, matched-shape cuBLAS references, queue.

    The wall is timed in the GpuModel's mode (``wall["mode"]``: 'graph' or 'eager'); the class table and busy
    always come from a traced eager forward (the tracer tags each op's launches); in graph mode a traced replay's
    busy (its launches untagged; the union of their intervals, :func:`busy_union_ns`) is ``busy_replay_ms`` and the
    first traced replay's launch-by-launch gaps are ``replay_gaps`` (:func:`replay_gaps`)."""
    cp = gpu.cp()
    n = len(tokens)
    graph = gm.opts.graph is not False
    # a replay is short: time more of them, so that wall - busy (a few % of the wall) is not the two medians' noise
    wall = prefill_replay.timed_prefill(gm, tokens, repeats=max(repeats, GRAPH_WALL_REPEATS) if graph else repeats)
    progress(f"prefill n={n} [{wall['mode']}]: wall {wall['wall_ms']:.1f} ms ({wall['tok_per_s']:.0f} tok/s)")
    with trace.CuptiTracer() as tr:
        gm.forward(tokens, tracer=tr)
        cp.cuda.runtime.deviceSynchronize()
    recs, ops = tr.records()
    df = classify(recs)
    bw = busy_wall(df, wall["wall_ms"])
    bw["mode"] = wall["mode"]
    bw["busy_replay_ms"] = np.nan       # graph mode: the GPU busy of a traced replay (the same kernels, untagged)
    bw["span_replay_ms"] = np.nan       # first launch's start to last launch's end of a traced replay
    bw["busy_sum_replay_ms"] = np.nan   # the replay's launch durations summed (= busy when no two overlap)
    gaps = []
    bw["idle_replay_ms"] = np.nan      # graph mode: a traced replay's span minus its GPU busy (the gaps in it)
    bw["wall_paired_ms"] = np.nan      # graph mode: untraced forwards each timed just before a traced replay
    if wall["mode"] == "graph":
        busy, bsum, span, idle, paired = [], [], [], [], []
        for i in range(GRAPH_BUSY_REPLAYS):
            # one untraced forward right before each traced replay: the two see the same GPU clocks, which the
            # sustained throughput rounds do not (the 7B's untraced walls there sit 5-7% above its traced spans)
            t0 = time.perf_counter()
            gm.forward(tokens)
            cp.cuda.runtime.deviceSynchronize()
            paired.append((time.perf_counter() - t0) * 1e3)
            with trace.CuptiTracer() as trg:
                gm.forward(tokens)
                cp.cuda.runtime.deviceSynchronize()
            if gm.last_mode != "graph":
                raise RuntimeError("the traced replay ran eager")
            recs_g = trg.records()[0]
            if recs_g:
                b = busy_union_ns(recs_g) / 1e6
                busy.append(b)
                bsum.append(sum(r["duration_ns"] for r in recs_g) / 1e6)
                span.append((max(r["start"] + r["duration_ns"] for r in recs_g) - recs_g[0]["start"]) / 1e6)
                # the idle gaps between the graph's nodes: first start to last end, not spent busy (CUPTI slows the
                # traced replay's launch, so its event span is not used)
                idle.append(span[-1] - b)
                if i == 0:
                    gaps = replay_gaps(recs_g)
        if busy:     # a traced replay's own wall is not used: CUPTI inflates it (run 20261201T132809Z: 40% at nt=512)
            bw["busy_replay_ms"] = float(np.median(busy))
            bw["busy_sum_replay_ms"] = float(np.median(bsum))
            bw["span_replay_ms"] = float(np.median(span))
            bw["idle_replay_ms"] = float(np.median(idle))
            bw["wall_paired_ms"] = float(np.median(paired))
    t = class_table(df, ops, wall["wall_ms"], n)
    progress(f"busy {bw['busy_ms']:.1f} ms vs wall {bw['wall_ms']:.1f} ms (gap {100 * bw['gap_frac']:.1f}%), "
             f"{len(df)} launches, {t.shape[0]} classes")
    # matched-shape references: cuBLAS fp16 with cached dequantized weights at the same (nt, od, id)
    refs, ref_rows = {}, []
    if reference:
        shapes: dict = {}
        for o in ops:
            if (o.cls.startswith("gemm_q") or o.cls == "output_head") and o.macs:
                w = o.weight
                key = weight_class(o.name, o.cls, {}, w)
                shapes.setdefault(key, set()).add((o.macs, w))
        flush = bench.Flusher()
        for key, items in shapes.items():
            macs, wname = sorted(items)[-1]
            wt = _find_weight(gm, wname)
            if wt is None:
                continue
            od, id_ = wt.shape
            nt_op = macs // (od * id_)
            x16 = cp.asarray(np.random.default_rng(0).standard_normal((nt_op, id_)).astype(np.float16))
            w16 = cp.asarray(np.random.default_rng(1).standard_normal((od, id_)).astype(np.float16) * 0.02)
            y16 = cp.empty((nt_op, od), cp.float16)
            s = bench.stats(bench.time_launches(lambda: cp.matmul(x16, w16.T, out=y16), 2, 10, flush))
            us_g = s["median_us"] / (nt_op * od * id_ / 1e9)
            refs[key] = us_g
            ref_rows.append({"class": key, "nt": nt_op, "od": od, "id": id_, "ref": "cublas_f16_cached",
                             **s, "us_per_gmac": us_g})
    ref_df = pd.DataFrame(ref_rows)
    q = full_queue(t, ref_df, wall["wall_ms"], n)
    return {"wall": wall, "busy_wall": bw, "classes": t, "launches": df, "ops": ops, "refs": ref_df,
            "queue": q, "replay_gaps": gaps}


def _find_weight(gm, name):
    for L in gm.layers:
        for w in L.values():
            if w.name == name:
                return w
    if gm.head is not None and gm.head.name == name:
        return gm.head
    return None


def record_decomposition(run, gm, tokens, repeats: int = 3, timeline_layer: int = 1, progress=print) -> dict:
    """Run a decomposition and record it: tables classes, queue, refs, busy_wall and one layer's launches
    (timeline); the run is finished with its validity and principal class."""
    r = run_decomposition(gm, tokens, repeats=repeats, progress=progress)
    run.append("classes", r["classes"].reset_index().rename(columns={"index": "class"}))
    run.append("queue", r["queue"])
    run.append("refs", r["refs"])
    run.append("busy_wall", [{**r["busy_wall"], **{k: v for k, v in r["wall"].items() if k != "wall_ms_all"}}])
    L = r["launches"]
    lay = L[(L.layer == timeline_layer) | L.layer.isna()]
    run.append("timeline", lay[["name", "start", "end", "duration_ns", "op", "cls", "class", "layer", "weight"]]
               .assign(name=lay.name.str.slice(0, 80)))
    run.finish(valid=bool(r["busy_wall"]["valid"]), top_class=str(r["classes"].index[0]))
    return r
