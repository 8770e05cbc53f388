"""The graph-node censuses of the memset nodes in round 5's captured prefill (each costs its neighbours idle time),
measured by ``labkernels gpu check --steps graph_nodes``; the capture and census machinery they use is the product's
:mod:`labkernels.graph_nodes`.

* :func:`dense_census` -- ``blas.gemm_dense`` on Gemma 3 270M's dense shapes (the stacked Q/K/V GEMM x [nt, 640]
  fp32 @ w [1536, 640]^T, the gate/up GEMM, the tied output head) through ``cublasGemmEx`` (the old path: cuBLAS
  splits k at some shapes and zeroes the split-K counters with a memset first) and through cuBLASLt with an
  algorithm that does not split k (:func:`labkernels.blas.dense_plan`);
* :func:`sdpa_census` -- the prefill's cuDNN SDPA (4 query heads, 1 kv head, head_dim 256; causal and sliding
  window 512) under both plan policies of ``attention.Cudnn`` (the heuristic plan the prefill runs by default, and
  ``no_memset``: :func:`labkernels.attention.no_memset_plan`), and, at the token counts asked, every candidate plan
  of the heuristics (name, workspace, nodes, time, output against the heuristic plan), to show whether any plan
  runs without the memset that precedes cuDNN's flash kernel;
* :func:`check` -- the censuses' verdict.
"""

from __future__ import annotations

import time

import numpy as np

from ... import attention, attention_kinds, blas, gpu, graph_nodes


#: Gemma 3 270M's dense (non-k-quant) GEMMs of one layer: (rows of w, columns) -- q/k/v stacked (4x256 + 256 + 256),
#: gate and up stacked (2 x 2048), the tied output head (vocabulary x n_embd)
GEMMA_DENSE = {"attn_qkv": (1536, 640), "ffn_gate_up": (4096, 640), "output_head": (262144, 640)}


DENSE_POINTS = (("attn_qkv", 64, "f32"), ("attn_qkv", 512, "f32"), ("attn_qkv", 3325, "f32"),
                ("attn_qkv", 512, "f16"), ("ffn_gate_up", 512, "f32"), ("output_head", 1, "f32"))


#: gemm_dense's parity gate (tests/gpu/test_gemm_gpu.py): max |y - ref| <= this x max |ref| against float64
DENSE_RTOL = 1e-3


SDPA_NTS = (64, 512, 3325)


#: the SDPA census's rows per (kind, nt) that run a Cudnn backend with a plan policy (attention.CUDNN_PLANS)
POLICY_ROWS = ("heuristic", "no_memset")


SDPA_PLAN_NTS = (512, 3325)


def dense_census(points=DENSE_POINTS, reps: int = 20, launches: int = 5, progress=print) -> list[dict]:
    """Per (shape, nt, type) and path (gemm_ex, lt): the captured call's nodes, its replay against the eager call
    (bitwise), lt against gemm_ex (bitwise, max relative difference), both against float64 (``DENSE_RTOL``), the
    time per call in a graph, the cuBLASLt algorithm chosen (or why none), and whether each memset's region reads
    zero again after the GEMM (the kernel restoring its counters)."""
    cp = gpu.cp()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    for label, nt, dt in points:
        od, k = GEMMA_DENSE[label]
        npdt = np.float16 if dt == "f16" else np.float32
        x = cp.asarray(rng.standard_normal((nt, k)).astype(npdt))
        w = cp.asarray((rng.standard_normal((od, k)) * 0.05).astype(npdt))
        ref = cp.asnumpy(x).astype(np.float64) @ cp.asnumpy(w).astype(np.float64).T if od * nt <= 2**26 else None
        res = {}
        for path in ("gemm_ex", "lt"):
            out = cp.zeros((nt, od), cp.float32)
            cp.cuda.runtime.deviceSynchronize()                   # inputs made on the legacy stream: in place
            with stream:
                blas.gemm_dense(x, w, out=out, path=path)          # eager (plans the shape, loads the kernels)
                stream.synchronize()
            eager = cp.asnumpy(out)
            graph_nodes._clear(out, stream)                                   # the replay must write it again
            nodes = graph_nodes.run_once(lambda: blas.gemm_dense(x, w, out=out, path=path), stream)
            replay = cp.asnumpy(out)
            row = {"shape": label, "nt": nt, "od": od, "k": k, "dtype": dt, "path": path,
                   **graph_nodes.summarize(nodes, {"out": (out.data.ptr, out.nbytes)}),
                   "memset_zero_after": graph_nodes._memsets_zero_after(nodes),
                   "graph_bitwise_eager": bool(np.array_equal(replay, eager)),
                   "us_per_call": graph_nodes.time_graph(lambda: blas.gemm_dense(x, w, out=out, path=path), stream, reps, launches)}
            if ref is not None:
                row["rel_err_f64"] = float(np.abs(eager - ref).max() / np.abs(ref).max())
                row["within_gate"] = bool(row["rel_err_f64"] <= DENSE_RTOL)
            if path == "lt":
                t_in = blas.dense_type(np.float16 if dt == "f16" else np.float32)
                p = blas.dense_plan(t_in, nt, od, k, align_a=blas._align(w.data.ptr), align_b=blas._align(x.data.ptr),
                                    align_d=blas._align(out.data.ptr))
                row.update({"lt_note": p.note, **{f"lt_{a}": v for a, v in p.info.items()}})
                old = res["gemm_ex"]
                row["bitwise_vs_gemm_ex"] = bool(np.array_equal(eager, old))
                row["max_rel_vs_gemm_ex"] = float(np.abs(eager - old).max() / max(np.abs(old).max(), 1e-30))
            res[path] = eager
            rows.append(row)
            progress(f"dense {label} nt={nt} {dt} {path}: {row['n_kernel']} kernel + {row['n_memset']} memset nodes "
                     f"({row['kernels'][:70]}), {row['us_per_call']:.2f} us/call"
                     + (f", bitwise vs gemm_ex {row['bitwise_vs_gemm_ex']}" if path == "lt" else ""))
    return rows


def sdpa_census(nts=SDPA_NTS, plan_nts=SDPA_PLAN_NTS, dtype: str = "f16", reps: int = 20, launches: int = 5,
                budget_s: float = 20.0, progress=print) -> list[dict]:
    """Per Gemma layer kind (global causal, sliding 512) and nt, two rows: ``plan`` "heuristic" -- the prefill's cuDNN
    SDPA (``attention.Cudnn``, the frontend's plan) -- and "no_memset" (``Cudnn(plan="no_memset")``, its choice and
    why in ``plan_name``), each captured: nodes, where a memset writes (offset into the graph's workspace), whether
    that region reads zero again after the kernel, replay bitwise against eager, time per call, output against the
    heuristic plan; at ``plan_nts`` also every candidate plan of the heuristics (A, FALLBACK) while ``budget_s``
    lasts: its name, workspace, nodes, time and output against the heuristic plan."""

    cp = gpu.cp()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    backends = {p: attention.Cudnn(None, dtype, "graph_nodes census", plan=p) for p in attention.CUDNN_PLANS}
    kinds = attention_kinds.bench_layouts()["gemma-3-270m"]
    t0 = time.time()
    rows, listed = [], set()
    for label, kind0 in kinds.items():
        for n in nts:
            kind = kind0.at(n)         # a window >= n is causal: Gemma's sliding layers below 512 tokens
            ins = attention.sdpa_inputs(kind, n, dtype, rng)
            ref = None
            for p, b in backends.items():
                row, eager = _backend_row(b, kind, n, ins, stream, reps, launches)
                ref = eager if ref is None else ref
                row.update(kind=label, window=kind.window, nt=n, dtype=dtype, plan=p,
                           bitwise_vs_prefill=bool(np.array_equal(eager, ref)),
                           max_rel_vs_prefill=graph_nodes._max_rel(attention_kinds.as_f64(eager, dtype), attention_kinds.as_f64(ref, dtype)))
                rows.append(row)
                progress(f"sdpa {label} nt={n} {p}: {row['n_kernel']} kernel + {row['n_memset']} memset nodes "
                         f"(memset at {row['memset_where'] or '-'}, {row['memset_bytes']} B, zero after: "
                         f"{row['memset_zero_after'] or '-'}), {row['us_per_call']:.2f} us/call; {row['plan_name']}")
            if n in plan_nts and (n, kind) not in listed:
                listed.add((n, kind))
                rows.extend(_sdpa_plans(backends["heuristic"], label, kind, n, dtype, ins, ref, stream, reps,
                                        launches, t0 + budget_s, progress))
    return rows


def _backend_row(b, kind, n: int, ins, stream, reps: int, launches: int) -> tuple[dict, np.ndarray]:
    """One Cudnn backend's SDPA of (kind, n) run eager, then captured (census, replay) and timed in a graph:
    (row, its eager output)."""
    cp = gpu.cp()
    q, k, v = ins
    o = cp.zeros((n, kind.n_head * kind.head_dim_v), q.dtype)
    cp.cuda.runtime.deviceSynchronize()                   # inputs made on the legacy stream: in place
    with stream:
        b.sdpa(q, k, v, n, kind, out=o)
        stream.synchronize()
    eager = cp.asnumpy(o)
    graph_nodes._clear(o, stream)
    G = b.graph(n, kind)
    if G.get("plan_index") is not None:
        pname = b.plan_notes.get((n, kind, b.dtype), "")
    else:
        idx = getattr(G["graph"], "_plan_index", None)      # the frontend's selected plan (a private field)
        try:
            pname = f"#{idx} {G['graph'].get_plan_name_at_index(idx)}" if idx is not None else ""
        except Exception as e:
            pname = f"#{idx} (name: {type(e).__name__})"
        pname += f"; {b.plan_notes[(n, kind, b.dtype)]}" if (n, kind, b.dtype) in b.plan_notes else ""
    ws = G["workspace"]
    regions = {"workspace": (ws.data.ptr, ws.nbytes)} if ws is not None else {}
    nodes = graph_nodes.run_once(lambda: b.sdpa(q, k, v, n, kind, out=o), stream)
    row = {"plan_name": pname, "workspace_bytes": G["workspace_bytes"], **graph_nodes.summarize(nodes, regions),
           "memset_zero_after": graph_nodes._memsets_zero_after(nodes),
           "graph_bitwise_eager": bool(np.array_equal(cp.asnumpy(o), eager)),
           "us_per_call": graph_nodes.time_graph(lambda: b.sdpa(q, k, v, n, kind, out=o), stream, reps, launches)}
    return row, eager


def _sdpa_plans(b, label, kind, n, dtype, ins, eager, stream, reps, launches, deadline, progress) -> list[dict]:
    try:
        G, count = graph_nodes._candidates(b, n, kind)
    except Exception as e:
        return [{"kind": label, "nt": n, "dtype": dtype, "plan": "all", "error": f"{type(e).__name__}: {e}"}]
    ref = attention_kinds.as_f64(eager, dtype)
    q, k, v = ins
    out = gpu.cp().zeros(eager.shape, q.dtype)
    rows = []
    for i in range(count):
        base = {"kind": label, "window": kind.window, "nt": n, "dtype": dtype, "plans": count}
        if time.time() > deadline:
            rows.append({**base, "plan": str(i), "error": "left out: the census's time budget is spent"})
            continue
        row, got, ws = graph_nodes._plan_trial(b, G, i, ins, eager.shape[1], stream)
        got = attention_kinds.as_f64(got, dtype) if got is not None else None
        row = {**base, **row}
        if got is not None:
            row["bitwise_vs_prefill"] = bool(np.array_equal(got, ref))
            row["max_rel_vs_prefill"] = graph_nodes._max_rel(got, ref)
            row["us_per_call"] = graph_nodes.time_graph(lambda: b.execute(G, q, k, v, out, index=i, workspace=ws), stream,
                                            reps, launches)
        rows.append(row)
        progress(f"sdpa {label} nt={n} plan {i} {row.get('plan_name', '')[:60]}: "
                 + (row["error"] if "error" in row else
                    f"{row['n_kernel']} kernel + {row['n_memset']} memset, {row['us_per_call']:.2f} us/call, "
                    f"max rel vs prefill {row['max_rel_vs_prefill']:.2g}"))
    return rows


def check(dense: list[dict], sdpa: list[dict]) -> dict:
    """The census's verdict: every replay equals its eager call; every dense output within ``DENSE_RTOL`` of
    float64; the lt path has no memset node and ran cuBLASLt (no fallback) at every point; a no_memset SDPA plan is
    within 2 x the attention parity tolerance of the heuristic plan; memset counts per path."""

    bad = []
    for r in dense:
        tag = f"dense {r['shape']} nt={r['nt']} {r['dtype']} {r['path']}"
        if not r["graph_bitwise_eager"]:
            bad.append(f"{tag}: replay differs from the eager call")
        if r.get("within_gate") is False:
            bad.append(f"{tag}: {r['rel_err_f64']:.2e} from float64 (> {DENSE_RTOL})")
        if r["path"] == "lt" and (r["n_memset"] or not str(r.get("lt_note", "")).startswith("cublasLt")):
            bad.append(f"{tag}: {r['n_memset']} memset node(s); {r.get('lt_note')}")
    for r in sdpa:
        if r.get("plan") == "all" and "error" in r:
            bad.append(f"sdpa {r.get('kind')} nt={r.get('nt', '-')}: {r['error']}")
        if r.get("plan") in POLICY_ROWS and not r["graph_bitwise_eager"]:
            bad.append(f"sdpa {r['kind']} nt={r['nt']} {r['plan']}: replay differs from the eager call")
        tol = 2 * attention.PARITY_TOL[r.get("dtype", "f16")]      # as the attention probe and no_memset_plan
        if r.get("plan") == "no_memset" and not r["max_rel_vs_prefill"] <= tol:
            bad.append(f"sdpa {r['kind']} nt={r['nt']} no_memset: {r['max_rel_vs_prefill']:.2e} from the heuristic "
                       f"plan (> {tol:g})")
    summ = {}
    for r in dense:
        summ[f"memsets_{r['shape']}_nt{r['nt']}_{r['dtype']}_{r['path']}"] = r["n_memset"]
    for r in sdpa:
        if r.get("plan") in POLICY_ROWS:
            summ[f"memsets_sdpa_{r['kind']}_nt{r['nt']}_{r['plan']}"] = r["n_memset"]
    t = {(r["shape"], r["nt"], r["dtype"], r["path"]): r.get("us_per_call") for r in dense}
    summ["dense_lt_vs_gemm_ex_time"] = {f"{a} nt={n} {d}": round(t[(a, n, d, "lt")] / t[(a, n, d, "gemm_ex")], 3)
                                        for (a, n, d, p) in t if p == "lt" and (a, n, d, "gemm_ex") in t
                                        and t[(a, n, d, "lt")] and t[(a, n, d, "gemm_ex")]}
    free = [f"{r['kind']} nt={r['nt']} plan {r['plan']} ({r.get('plan_name', '')})" for r in sdpa
            if r.get("plan") not in POLICY_ROWS + ("all",) and "error" not in r and r["n_memset"] == 0]
    summ["sdpa_plans_without_memset"] = free
    return {"ok": not bad, "problems": bad, **summ}
