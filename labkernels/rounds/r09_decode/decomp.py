"""Round 9's decode-step decomposition (round 5's method at one token): what one decode step spends, launch by launch.

Per model and context (the keys the step attends: a prompt of that length, then the step at its position):

1. ``GpuModel.generate(prompt, 2)``: the prefill fills the KV cache, the step is captured as a CUDA graph and its
   first replay checked (:mod:`labkernels.decode`);
2. one **eager** step at that position traced with CUPTI (:mod:`labkernels.trace`): every launch of
   ``Decoder._step_device`` runs inside an op label (embed, the norms, each projection by its weight's role,
   decode_qkv, attention, ffn_act, the head, the argmax), so each kernel record names the op that launched it --
   cuBLAS's kernels and CuPy's casts too;
3. ``repeats`` untraced eager steps (the host's wall: Python launches every kernel) and ``repeats`` graph replays of
   the same step (state reset to the same token and position) timed with CUDA events behind a GPU lead (the graph's
   enqueue not timed);
4. ``traced_replays`` replays traced: their kernels carry no labels (one graph launch), so each is given the class of
   the eager launch at the same place in the sequence of kernel names (:func:`map_replay`; the memset nodes the graph
   turned into fill kernels match the eager memsets), and its time is its *exclusive* time -- from the later of its
   start and the end of every launch before it, to its end (:func:`exclusive_ns`): a programmatic launch's record
   begins while the kernel ahead still runs, and summing durations would count that time twice.

Classes (:func:`classify`): ``gemv:<op>`` (every projection: ``attn_q+attn_k`` for a stacked group, ``attn_v``,
``attn_output``, ``ffn_gate_up``, ``ffn_down``, ``output`` the head -- gemv_kq or cuBLAS on a dequantized weight, with
the casts it needs), ``attention``, ``small:<kind>`` (``norm``: the RMSNorms with the residual adds fused in,
``rope+kv_append``: decode_qkv, ``activation``, ``embed``, ``sampling``: the argmax, ``elementwise``: unfused adds /
biases), ``memset`` / ``memcpy``, and ``unclassified`` for a launch neither a label nor a name places (a row of its
own, with its kernel names: never dropped). The step's table (:func:`class_rows`) adds ``gaps``: the graph replay's
time minus the classes' time (the idle time between the graph's nodes; in eager mode the host's wall minus the kernels:
the Python launch path), so that the shares sum to 1.
"""

from __future__ import annotations

import difflib
import re
import time

import numpy as np

from ... import arch, bench, decode, gpu, prefill, prefill_runs, synthetic, trace
from ...peers import model_label
from . import benchmark, generate
from .plan import DECOMP_NEW, DECOMP_PLAN

#: the op label classes of the decode step (``tracer.op(name, cls)``) -> the small kernels' kinds
SMALL_KINDS = {"norm": "norm", "rope": "rope+kv_append", "activation": "activation", "embed": "embed",
               "sampling": "sampling", "elementwise": "elementwise"}
#: kernel-name rules for a launch without a label (substring of the -- possibly mangled -- name, class), in order
NAME_RULES = (("decode_attn", "attention"), ("flash_attn", "attention"), ("gemv_kq", "gemv:unlabelled"),
              ("decode_qkv", "small:rope+kv_append"), ("rope", "small:rope+kv_append"), ("rmsnorm", "small:norm"),
              ("embed_kernel", "small:embed"), ("act_mul", "small:activation"), ("argmax", "small:sampling"),
              ("fill_kernel", "memset"), ("wgmma_kq", "gemv:unlabelled"), ("gemm", "gemv:unlabelled"),
              ("gemv", "gemv:unlabelled"), ("xmma", "gemv:unlabelled"), ("cutlass", "gemv:unlabelled"),
              ("cublas", "gemv:unlabelled"))
GROUPS = ("gemv", "attention", "small", "memory", "unclassified", "gaps")
#: the figure's parts, in stacking order: (label, predicate on the class)
PARTS = (("GEMV: Q/K/V", lambda c: c.startswith("gemv:attn_") and c != "gemv:attn_output"),
         ("GEMV: attention output", lambda c: c == "gemv:attn_output"),
         ("GEMV: FFN gate/up", lambda c: c.startswith("gemv:ffn_") and c != "gemv:ffn_down"),
         ("GEMV: FFN down", lambda c: c == "gemv:ffn_down"),
         ("GEMV: output head", lambda c: c == "gemv:output"),
         ("GEMV: other", lambda c: c.startswith("gemv:")),
         ("attention", lambda c: c == "attention"),
         ("small kernels", lambda c: c.startswith("small:")),
         ("memset / memcpy", lambda c: c in ("memset", "memcpy")),
         ("unclassified", lambda c: c == "unclassified"),
         ("gaps", lambda c: c == "gaps"))

#: the per-class table's columns (``decode_decomp``) and the per-point table's (``decode_decomp_steps``): every row
#: has all of them (a skipped point NaN where nothing was measured), so the first row appended fixes the columns
CLASS_COLUMNS = ("model", "arch", "context", "n_ctx", "mode", "class", "group", "part", "launches", "launches_replay",
                 "eager_us", "replay_us", "us", "share", "kernels")
STEP_COLUMNS = ("model", "arch", "context", "n_ctx", "status", "why", "mode", "graph_refused", "launches_eager",
                "launches_replay", "replay_matched", "kernel_sum_eager_us", "busy_eager_us", "eager_wall_us",
                "graph_us", "busy_replay_us", "span_replay_us", "idle_replay_us", "gap_us", "step_us",
                "classified_frac", "classified_frac_replay", "unclassified_kernels", "weight_bytes", "read_bytes",
                "kv_bytes", "gemv_us", "attention_us", "gemv_frac_copy", "attention_frac_copy", "copy_tb_per_s",
                "tok_per_s_step", "repeats", "traced_replays", "capture_max_rel_diff")


class DecompError(RuntimeError):
    """A decomposition that cannot stand: a traced step that recorded no launch."""


# ------------------------------------------------------------------------------------------------ classification

def short_name(name) -> str:
    """A kernel's name without its C++ mangling or template arguments (``_Z14gemv_kq_kernelILi1E...`` ->
    ``gemv_kq_kernel``; ``_ZN7cutlass6KernelI...`` -> ``cutlass::Kernel``), at most 60 characters."""
    s = str(name)
    if s.startswith("_Z"):
        i, parts = 2, []
        nested = s[i:i + 1] == "N"
        i += nested
        while True:
            m = re.match(r"\d+", s[i:])
            if not m:
                break
            n = int(m.group())
            i += len(m.group())
            parts.append(s[i:i + n])
            i += n
            if not nested:
                break
        if parts:
            s = "::".join(parts)
    return s.split("<")[0][:60]


def class_of_name(name) -> str:
    """The class of a launch from its kernel name alone (memset / memcpy records by their kind), else
    ``unclassified``."""
    n = str(name)
    if n in ("memset", "memcpy"):
        return n
    for key, cls in NAME_RULES:
        if key in n:
            return cls
    return "unclassified"


def class_of_op(op, cls) -> str | None:
    """The class an op label gives its launches (None: no label, or one the step does not push)."""
    if not op or cls in (None, "untagged"):
        return None
    c = str(cls)
    if c.startswith("gemm") or c == "output_head":
        return f"gemv:{op}"
    if c == "attention":
        return "attention"
    if c in SMALL_KINDS:
        return f"small:{SMALL_KINDS[c]}"
    return None


def classify(rec: dict) -> str:
    """One launch record (:meth:`labkernels.trace.CuptiTracer.records`' form) -> its class: a memset / memcpy by its
    kind; else its op label; else its kernel name; else ``unclassified``."""
    name = str(rec.get("name", ""))
    if name in ("memset", "memcpy"):
        return name
    return class_of_op(rec.get("op"), rec.get("cls")) or class_of_name(name)


def group_of(cls: str) -> str:
    if cls.startswith("gemv:"):
        return "gemv"
    if cls.startswith("small:"):
        return "small"
    if cls in ("memset", "memcpy"):
        return "memory"
    return cls if cls in GROUPS else "unclassified"


def part_of(cls: str) -> str:
    return next((label for label, pred in PARTS if pred(cls)), "unclassified")


def exclusive_ns(recs) -> list[int]:
    """Per record, in the order given (sorted by start first): its exclusive time -- from the later of its start and
    the latest end of every record before it, to its end (0 inside an earlier one). The sum is the union of the
    intervals (round 5's busy time)."""
    out, last = [], None
    for r in recs:
        s, e = int(r["start"]), int(r["start"]) + int(r["duration_ns"])
        out.append(max(0, e - (s if last is None else max(s, last))))
        last = e if last is None else max(last, e)
    return out


def _match_key(name) -> str:
    n = str(name)
    return "memset" if n == "memset" or "fill_kernel" in n else n


def map_replay(eager: list, replay: list) -> tuple[list[str], int]:
    """The classes of a traced replay's launches (both lists sorted by start): each takes the class of the eager launch
    at the same place in the sequence of kernel names (difflib's matching blocks; a replaced block of the same length
    pairwise: a library that picked another kernel under capture), else its name's (:func:`class_of_name`). Returns
    (classes, how many came from an eager launch)."""
    a = [_match_key(r["name"]) for r in eager]
    b = [_match_key(r["name"]) for r in replay]
    ecls = [r["class"] if "class" in r else classify(r) for r in eager]
    out = [class_of_name(r["name"]) for r in replay]
    matched = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for k in range(j2 - j1):
                out[j1 + k] = ecls[i1 + k]
            matched += j2 - j1
    return out, matched


def _sorted(recs) -> list[dict]:
    return sorted(recs, key=lambda r: int(r["start"]))


def class_rows(eager: list, replays: list, graph_us: float | None, eager_wall_us: float, key: dict) -> tuple:
    """The step's table: one row per class (launches in the eager step, its time there -- durations summed, no two
    eager launches overlap -- and in the traced replays: the median over replays of the classes' exclusive time) and a
    ``gaps`` row, with ``us`` the step's figure (the replay's where a graph ran and its replays were traced -- mode
    ``graph`` --, else the eager step's) and ``share`` = us / the step (the classes' us + gaps: they sum to 1).
    ``gaps``: graph_us - the classes' time (mode ``graph``: the idle time between the graph's nodes; ``graph, eager
    kernels``: a timed replay whose traced replays gave no records, against the eager kernels), or in eager mode (no
    graph) the host wall - the eager kernels (the launch path); never negative (a replay timed faster than its traced
    kernels leaves 0, the signed figure is the summary's ``gap_us``). Returns (rows, summary dict)."""
    eager = _sorted(eager)
    if not eager:
        raise DecompError(f"{key.get('model')} context {key.get('context')}: the traced decode step recorded no launch "
                          "(CUPTI gave no kernel records)")
    for r in eager:
        r["class"] = classify(r)
    per = {}
    for r in eager:
        d = per.setdefault(r["class"], {"launches": 0, "eager_ns": 0, "kernels": set()})
        d["launches"] += 1
        d["eager_ns"] += int(r["duration_ns"])
        d["kernels"].add(short_name(r["name"]))
    timed = graph_us is not None and bool(np.isfinite(graph_us))
    graph = timed and len(replays) > 0
    tots, nrep, matched, busy, span = [], {}, [], [], []
    for rp in replays if graph else []:
        rp = _sorted(rp)
        if not rp:
            continue
        cls, m = map_replay(eager, rp)
        matched.append(m / len(rp))
        ex = exclusive_ns(rp)
        busy.append(sum(ex))
        span.append(int(rp[-1]["start"]) + int(rp[-1]["duration_ns"]) - int(rp[0]["start"]))
        tot: dict = {}
        for c, e, r in zip(cls, ex, rp):
            tot[c] = tot.get(c, 0) + e
            per.setdefault(c, {"launches": 0, "eager_ns": 0, "kernels": set()})["kernels"].add(short_name(r["name"]))
            if len(tots) == 0:
                nrep[c] = nrep.get(c, 0) + 1
        tots.append(tot)
    graph = graph and bool(busy)       # the replays traced: their kernels' times; else the eager step's
    mode = "graph" if graph else "graph, eager kernels" if timed else "eager"
    rows = []
    for c, d in per.items():
        rus = float(np.median([t.get(c, 0) for t in tots])) / 1e3 if graph else np.nan
        eus = d["eager_ns"] / 1e3
        rows.append({**key, "mode": mode, "class": c, "group": group_of(c),
                     "part": part_of(c), "launches": d["launches"], "launches_replay": nrep.get(c, 0),
                     "eager_us": eus, "replay_us": rus, "us": rus if graph else eus,
                     "kernels": "; ".join(sorted(d["kernels"]))})
    kernels_us = sum(r["us"] for r in rows)
    ref = float(graph_us) if timed else float(eager_wall_us)
    gap = ref - kernels_us
    rows.append({**key, "mode": mode, "class": "gaps", "group": "gaps", "part": "gaps",
                 "launches": 0, "launches_replay": 0, "eager_us": np.nan, "replay_us": np.nan, "us": max(0.0, gap),
                 "kernels": ("graph replay time minus its kernels' (idle between nodes)" if graph else
                             "graph replay time minus the eager step's kernels (its replays not traced)" if timed else
                             "eager step's host wall minus its kernels (the Python launch path)")})
    step = sum(r["us"] for r in rows)
    for r in rows:
        r["share"] = r["us"] / step if step > 0 else np.nan
    order = {c: i for i, c in enumerate(label for label, _ in PARTS)}
    rows.sort(key=lambda r: (order[r["part"]], -r["us"]))
    rows = [{k: r.get(k, np.nan) for k in CLASS_COLUMNS} for r in rows]
    eager_sum = sum(int(r["duration_ns"]) for r in eager) / 1e3
    unc = [r for r in eager if r["class"] == "unclassified"]
    rep_unc = float(np.median([t.get("unclassified", 0) / max(1, sum(t.values())) for t in tots])) if graph else np.nan
    summary = {"mode": mode, "launches_eager": len(eager),
               "launches_replay": sum(nrep.values()) if graph else 0,
               "replay_matched": float(np.median(matched)) if matched else np.nan,
               "kernel_sum_eager_us": eager_sum,
               "busy_eager_us": sum(exclusive_ns(eager)) / 1e3, "eager_wall_us": float(eager_wall_us),
               "graph_us": float(graph_us) if timed else np.nan,
               "busy_replay_us": float(np.median(busy)) / 1e3 if graph else np.nan,
               "span_replay_us": float(np.median(span)) / 1e3 if graph else np.nan,
               "gap_us": gap, "step_us": step,
               "classified_frac": 1.0 - (sum(int(r["duration_ns"]) for r in unc) / 1e3 / eager_sum if eager_sum else 0),
               "classified_frac_replay": 1.0 - rep_unc,
               "unclassified_kernels": "; ".join(sorted({short_name(r["name"]) for r in unc}))}
    summary["idle_replay_us"] = summary["span_replay_us"] - summary["busy_replay_us"]
    return rows, summary


def read_weight_bytes(gm) -> int:
    """The weight bytes one decode step reads as the GPU holds them: a k-quant weight's blocks (q4_K 144 B, q6_K 210 B
    a 256-weight block), a dequantized one's fp16 copy with ``other_f16`` (else its f32 matrix), the tied head the
    embedding's fp16 copy (else f32) -- unlike :func:`.generate.stored_weight_bytes` (the GGUF's bytes), which counts
    Gemma's q5_0 / q8_0 weights as stored."""
    dense = 2 if gm.opts.other_f16 else 4
    ws = []
    for il, L in enumerate(gm.layers):
        ws += [w for w, _ in gm.qkv_groups(il)] + gm._ffn_in_weights(il) + [L["attn_output"], L["ffn_down"]]
    total = sum(w.od * w.id // 256 * {"q4_K": 144, "q6_K": 210}[w.qtype] if w.q is not None else w.od * w.id * dense
                for w in ws)
    c = gm.cfg
    total += (gm.head.od * gm.head.id // 256 * {"q4_K": 144, "q6_K": 210}[gm.head.qtype] if gm.head is not None
              and gm.head.q is not None else c.vocab * c.n_embd * dense)
    return int(total)


def kv_bytes(cfg, context: int) -> int:
    """The KV-cache bytes the step at position ``context`` reads: per layer keys lo..context (a sliding layer's
    window at most) x kv heads x (head_dim + head_dim_v) x 2 B."""
    total = 0
    for il in range(cfg.n_layer):
        keys = context + 1
        if cfg.is_sliding(il) and cfg.sliding_window:
            keys = min(keys, int(cfg.sliding_window))
        total += keys * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * 2
    return int(total)


# ------------------------------------------------------------------------------------------------ the measurement

def decompose_step(gm, model, label: str, context: int, repeats: int = DECOMP_PLAN["repeats"],
                   lead_us: float = DECOMP_PLAN["lead_us"], traced_replays: int = DECOMP_PLAN["traced_replays"],
                   tracer=trace.CuptiTracer, progress=print) -> tuple[list, dict]:
    """One point: the prefill of ``context`` tokens and the captured step (generate), then the traced eager step, the
    eager walls, the timed and the traced replays of the step at position ``context`` (module docstring). ``tracer``:
    the tracer's class (a CPU test's stand-in). Returns (class rows, summary)."""
    cp = gpu.cp()
    toks = prefill_runs.prompt_tokens(model, context)
    gm.generate(toks, DECOMP_NEW)
    st = dict(gm.last_generate)
    dec = gm._decoder
    tok0 = int(cp.asnumpy(dec.hist[context:context + 1])[0])     # the prefill's token: the step's input at `context`

    def reset():
        dec.set_state(tok0, context)
        decode._sync(dec.stream)

    reset()
    with tracer() as tr:
        with dec._on():
            dec._step_device(tr)
        decode._sync(dec.stream)
    eager = tr.records()[0]
    walls = []
    for _ in range(repeats):
        reset()
        t0 = time.perf_counter()
        with dec._on():
            dec._step_device()
        decode._sync(dec.stream)
        walls.append((time.perf_counter() - t0) * 1e6)
    graph_us, replays = None, []
    if dec.graph is not None:
        lead = bench.Lead(lead_us)
        ev = (cp.cuda.Event(), cp.cuda.Event())
        times = []
        for _ in range(repeats):
            reset()
            with dec.stream:
                lead()
            ev[0].record(dec.stream)
            dec.graph.graph.launch(stream=dec.stream)
            ev[1].record(dec.stream)
            dec.stream.synchronize()
            times.append(float(cp.cuda.get_elapsed_time(ev[0], ev[1])) * 1e3)
        graph_us = float(np.median(times))
        for _ in range(traced_replays):
            reset()
            with tracer() as trg:
                dec.graph.graph.launch(stream=dec.stream)
                dec.stream.synchronize()
            replays.append(trg.records()[0])
        dec.graph.replays += repeats + traced_replays
    key = {"model": label, "arch": gm.cfg.arch, "context": int(context), "n_ctx": int(dec.n_ctx)}
    rows, summ = class_rows(eager, replays, graph_us, float(np.median(walls)), key)
    summ.update(key)
    summ.update(status="measured", why="", graph_refused=st.get("graph_refused") or "", repeats=int(repeats),
                traced_replays=len(replays) if graph_us is not None else 0,
                capture_max_rel_diff=(st.get("capture") or {}).get("max_rel_diff"))
    gemv_us = sum(r["us"] for r in rows if r["group"] == "gemv")
    attn_us = sum(r["us"] for r in rows if r["group"] == "attention")
    summ.update(gemv_us=gemv_us, attention_us=attn_us, kv_bytes=kv_bytes(gm.cfg, context),
                tok_per_s_step=1e6 / summ["step_us"] if summ["step_us"] else np.nan)
    progress(f"{label} context {context} [{summ['mode']}]: step {summ['step_us']:.0f} us (graph "
             f"{summ['graph_us']:.0f} us, eager wall {summ['eager_wall_us']:.0f} us, kernels "
             f"{summ['kernel_sum_eager_us']:.0f} us eager), {summ['launches_eager']} launches; "
             + ", ".join(f"{g} {sum(r['share'] for r in rows if r['group'] == g):.0%}" for g in GROUPS
                         if any(r['group'] == g for r in rows)))
    return rows, summ


def step_row(**kw) -> dict:
    """A ``decode_decomp_steps`` row with every column (NaN where ``kw`` has none)."""
    return {k: kw.get(k, np.nan) for k in STEP_COLUMNS}


def measure_decomp(run, models=DECOMP_PLAN["models"], contexts=DECOMP_PLAN["contexts"],
                   repeats: int = DECOMP_PLAN["repeats"], lead_us: float = DECOMP_PLAN["lead_us"],
                   traced_replays: int = DECOMP_PLAN["traced_replays"], progress=print,
                   tracer=trace.CuptiTracer) -> list[dict]:
    """The decomposition into ``run``: the copy line (table ``copy``), then per model and context the class rows
    (table ``decode_decomp``) and the point's summary (table ``decode_decomp_steps``; a context the model cannot take,
    or whose cache does not fit, a ``skipped`` row with the reason). CUPTI (``cupti-python``) is required: without it
    this raises :class:`labkernels.trace.TraceError` naming the package before any model is loaded. ``tracer``: the
    tracer's class (a CPU test's stand-in)."""
    tracer()                   # the package is there (TraceError naming cupti-python otherwise), before any work
    cp = gpu.cp()
    cb = benchmark.copy_bandwidth()
    run.append("copy", [cb])
    line = cb["tb_per_s"]
    out = []
    for spec in models:
        m = synthetic.load_model(spec)
        label = model_label(spec)
        cfg = arch.config_from_model(m)
        wbytes = generate.stored_weight_bytes(m)
        gm = prefill.GpuModel(m)
        for pt in generate.plan_points({label: cfg}, contexts, DECOMP_NEW, free_bytes=generate.free_for_cache()):
            n = pt["n_prompt"]
            if pt["status"] == "skipped":
                progress(f"{label}: context {n}: skipped ({pt['why']})")
                row = step_row(model=label, arch=cfg.arch, context=n, n_ctx=pt["n_ctx"], status="skipped",
                               why=pt["why"], weight_bytes=wbytes, kv_bytes=kv_bytes(cfg, n), copy_tb_per_s=line)
                run.append("decode_decomp_steps", [row])
                out.append(row)
                continue
            rows, summ = decompose_step(gm, m, label, n, repeats=repeats, lead_us=lead_us,
                                        traced_replays=traced_replays, tracer=tracer, progress=progress)
            gemv_bytes = read_weight_bytes(gm)
            summ.update(weight_bytes=wbytes, read_bytes=gemv_bytes, copy_tb_per_s=line,
                        gemv_frac_copy=gemv_bytes / (summ["gemv_us"] * 1e-6) / 1e12 / line if summ["gemv_us"] else np.nan,
                        attention_frac_copy=(summ["kv_bytes"] / (summ["attention_us"] * 1e-6) / 1e12 / line
                                             if summ["attention_us"] else np.nan))
            run.append("decode_decomp", rows)
            row = step_row(**summ)
            run.append("decode_decomp_steps", [row])
            out.append(row)
        del gm
        cp.get_default_memory_pool().free_all_blocks()
    return out
