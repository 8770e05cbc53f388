"""What a captured CUDA graph holds, node by node (issue 18: the memsets of Gemma's prefill graph).

:func:`capture` records a callable on a stream into a CUDA graph with the runtime's stream capture (CuPy's own
``Stream.end_capture`` destroys the graph once instantiated, so its nodes could not be read), :func:`census`
lists the graph's nodes (``cuGraphGetNodes`` / ``cuGraphNodeGetType`` through cuda-bindings, child graphs
included) with each kernel's name and each memset's destination and size, and :func:`summarize` counts them.

Two censuses of the calls behind the prefill's memsets, each checked against its old path:

* :func:`dense_census` -- ``gpu.gemm_dense`` on Gemma 3 270M's dense shapes (the stacked Q/K/V GEMM x [nt, 640]
  fp32 @ w [1536, 640]^T, the gate/up GEMM, the tied output head) through ``cublasGemmEx`` (the old path: cuBLAS
  splits k at some shapes and zeroes the split-K counters with a memset first) and through cuBLASLt with an
  algorithm that does not split k (:func:`labkernels.gpu.dense_plan`);
* :func:`sdpa_census` -- the prefill's cuDNN SDPA (4 query heads, 1 kv head, head_dim 256; causal and sliding
  window 512) with the plan the prefill runs, and, at the token counts asked, every candidate plan of the
  heuristics (name, workspace, nodes, time, output against the prefill's plan), to show whether any plan runs
  without the memset that precedes cuDNN's flash kernel.
"""

from __future__ import annotations

import time

import numpy as np

#: Gemma 3 270M's dense (non-k-quant) GEMMs of one layer: (rows of w, columns) -- q/k/v stacked (4x256 + 256 + 256),
#: gate and up stacked (2 x 2048), the tied output head (vocabulary x n_embd)
GEMMA_DENSE = {"attn_qkv": (1536, 640), "ffn_gate_up": (4096, 640), "output_head": (262144, 640)}
DENSE_POINTS = (("attn_qkv", 64, "f32"), ("attn_qkv", 512, "f32"), ("attn_qkv", 3325, "f32"),
                ("attn_qkv", 512, "f16"), ("ffn_gate_up", 512, "f32"), ("output_head", 1, "f32"))
#: gemm_dense's parity gate (tests/gpu/test_gemm_gpu.py): max |y - ref| <= this x max |ref| against float64
DENSE_RTOL = 1e-3
SDPA_NTS = (64, 512, 3325)
SDPA_PLAN_NTS = (512, 3325)


class CaptureError(RuntimeError):
    pass


def _rt():
    from . import gpu

    return gpu.cp().cuda.runtime


def capture(fn, stream) -> int:
    """Record ``fn()`` (work on ``stream``, the current stream inside) into a new CUDA graph; returns the
    cudaGraph_t (the caller destroys it: :func:`destroy`)."""
    rt = _rt()
    mode = getattr(rt, "streamCaptureModeRelaxed", 2)
    with stream:
        rt.streamBeginCapture(stream.ptr, mode)
        try:
            fn()
        except BaseException:
            try:
                rt.graphDestroy(rt.streamEndCapture(stream.ptr))
            except Exception:
                pass
            raise
        g = rt.streamEndCapture(stream.ptr)
    if not g:
        raise CaptureError("stream capture returned no graph")
    return g


def destroy(graph: int) -> None:
    _rt().graphDestroy(graph)


def _check(res, what: str):
    err = res[0]
    if int(err) != 0:
        raise CaptureError(f"{what} failed: {err}")
    return res[1:] if len(res) > 2 else res[1]


def _kernel_name(drv, node) -> str:
    try:
        p = _check(drv.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
        if int(getattr(p, "func", 0) or 0):
            name = _check(drv.cuFuncGetName(p.func), "cuFuncGetName")
        else:
            name = _check(drv.cuKernelGetName(p.kern), "cuKernelGetName")
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception as e:  # a name is a label: its absence is said, the node still counts
        return f"? ({type(e).__name__}: {e})"


def census(graph: int) -> list[dict]:
    """The nodes of a CUDA graph (child graphs expanded in place): [{type, name, dst, bytes}] with ``type`` the
    driver's node type without its prefix (KERNEL, MEMSET, MEMCPY, ...), a kernel's function name, a memset's
    destination address and size in bytes."""
    from cuda.bindings import driver as drv

    def walk(g) -> list[dict]:
        _, n = _check(drv.cuGraphGetNodes(g, 0), "cuGraphGetNodes")
        nodes, _ = _check(drv.cuGraphGetNodes(g, n), "cuGraphGetNodes") if n else ([], 0)
        out = []
        for node in nodes:
            t = _check(drv.cuGraphNodeGetType(node), "cuGraphNodeGetType")
            tname = str(getattr(t, "name", t)).split(".")[-1].replace("CU_GRAPH_NODE_TYPE_", "")
            row = {"type": tname, "name": "", "dst": 0, "bytes": 0}
            if tname == "KERNEL":
                row["name"] = _kernel_name(drv, node)
            elif tname == "MEMSET":
                p = _check(drv.cuGraphMemsetNodeGetParams(node), "cuGraphMemsetNodeGetParams")
                row.update(dst=int(p.dst), bytes=int(p.elementSize) * int(p.width) * max(1, int(p.height)),
                           value=int(p.value), height=int(p.height))
            elif tname == "GRAPH":
                out.extend(walk(_check(drv.cuGraphChildGraphNodeGetGraph(node), "cuGraphChildGraphNodeGetGraph")))
                continue
            out.append(row)
        return out

    return walk(drv.CUgraph(int(graph)))


def summarize(nodes: list[dict], regions: dict | None = None) -> dict:
    """Counts of a census by node type (``n_kernel``, ``n_memset``, ...; ``nodes`` in all), the kernels' names
    (in graph order, '; '-joined), the memsets' total bytes and, for ``regions`` {label: (address, bytes)}, in
    which region each memset writes ('elsewhere' if none)."""
    s = {"nodes": len(nodes)}
    for r in nodes:
        s[f"n_{r['type'].lower()}"] = s.get(f"n_{r['type'].lower()}", 0) + 1
    s.setdefault("n_kernel", 0)
    s.setdefault("n_memset", 0)
    s["kernels"] = "; ".join(r["name"] for r in nodes if r["type"] == "KERNEL")
    ms = [r for r in nodes if r["type"] == "MEMSET"]
    s["memset_bytes"] = int(sum(r["bytes"] for r in ms))
    where = []
    for r in ms:
        hit = "elsewhere"
        for label, (a, b) in (regions or {}).items():
            if a <= r["dst"] and r["dst"] + r["bytes"] <= a + b:
                hit = f"{label}+{r['dst'] - a}"
                break
        where.append(hit)
    s["memset_where"] = "; ".join(where)
    return s


def _instantiate(graph: int) -> int:
    return _rt().graphInstantiate(graph)


def time_graph(fn, stream, reps: int = 20, launches: int = 5) -> float:
    """Microseconds per call of ``fn`` from a graph of ``reps`` back-to-back calls replayed ``launches`` times
    (CUDA events, median): the node count's cost included."""
    from . import gpu

    cp = gpu.cp()
    rt = _rt()
    g = capture(lambda: [fn() for _ in range(reps)], stream)
    try:
        ge = _instantiate(g)
        try:
            rt.graphLaunch(ge, stream.ptr)
            stream.synchronize()
            ts = []
            for _ in range(launches):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(stream)
                rt.graphLaunch(ge, stream.ptr)
                b.record(stream)
                b.synchronize()
                ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / reps)
            return float(np.median(ts))
        finally:
            rt.graphExecDestroy(ge)
    finally:
        destroy(g)


def run_once(fn, stream) -> dict:
    """Capture ``fn`` once, read its census, replay it once; {nodes: census, ...}."""
    rt = _rt()
    g = capture(fn, stream)
    try:
        nodes = census(g)
        ge = _instantiate(g)
        try:
            rt.graphLaunch(ge, stream.ptr)
            stream.synchronize()
        finally:
            rt.graphExecDestroy(ge)
    finally:
        destroy(g)
    return nodes


def _region_zero(ptr: int, nbytes: int) -> bool:
    """Whether device memory [ptr, ptr + nbytes) reads all zero (after the work that used it)."""
    from . import gpu

    cp = gpu.cp()
    host = np.empty(nbytes, np.uint8)
    cp.cuda.runtime.memcpy(host.ctypes.data, ptr, nbytes, cp.cuda.runtime.memcpyDeviceToHost)
    return bool(not host.any())


def _memsets_zero_after(nodes: list[dict]) -> str:
    """Per memset of a replayed graph: whether its region reads zero again after the graph ran ('True'/'False'),
    or why it was not read (memory the graph allocates and frees itself; a 2-D memset)."""
    ms = [r for r in nodes if r["type"] == "MEMSET"]
    if not ms:
        return ""
    if any(r["type"] in ("MEM_ALLOC", "MEM_FREE") for r in nodes):
        return "; ".join("not read (graph-owned memory)" for _ in ms)
    return "; ".join(str(_region_zero(r["dst"], r["bytes"])) if r.get("height", 1) <= 1 else "not read (2-D)"
                     for r in ms)


def dense_census(points=DENSE_POINTS, reps: int = 20, launches: int = 5, progress=print) -> list[dict]:
    """Per (shape, nt, type) and path (gemm_ex, lt): the captured call's nodes, its replay against the eager call
    (bitwise), lt against gemm_ex (bitwise, max relative difference), both against float64 (``DENSE_RTOL``), the
    time per call in a graph, the cuBLASLt algorithm chosen (or why none), and whether each memset's region reads
    zero again after the GEMM (the kernel restoring its counters)."""
    from . import gpu

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
            with stream:
                gpu.gemm_dense(x, w, out=out, path=path)          # eager (plans the shape, loads the kernels)
                stream.synchronize()
            eager = cp.asnumpy(out)
            nodes = run_once(lambda: gpu.gemm_dense(x, w, out=out, path=path), stream)
            replay = cp.asnumpy(out)
            row = {"shape": label, "nt": nt, "od": od, "k": k, "dtype": dt, "path": path,
                   **summarize(nodes, {"out": (out.data.ptr, out.nbytes)}),
                   "memset_zero_after": _memsets_zero_after(nodes),
                   "graph_bitwise_eager": bool(np.array_equal(replay, eager)),
                   "us_per_call": time_graph(lambda: gpu.gemm_dense(x, w, out=out, path=path), stream, reps, launches)}
            if ref is not None:
                row["rel_err_f64"] = float(np.abs(eager - ref).max() / np.abs(ref).max())
                row["within_gate"] = bool(row["rel_err_f64"] <= DENSE_RTOL)
            if path == "lt":
                t_in = 2 if dt == "f16" else 0
                p = gpu.dense_plan(t_in, nt, od, k, align_a=gpu._align(w.data.ptr), align_b=gpu._align(x.data.ptr),
                                   align_d=gpu._align(out.data.ptr))
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


def _sdpa_inputs(kind, n: int, dtype: str, rng):
    from . import attention, gpu

    cp = gpu.cp()
    widths = (kind.n_head * kind.head_dim, kind.n_head_kv * kind.head_dim, kind.n_head_kv * kind.head_dim_v)
    return [attention.to_io(cp.asarray(rng.standard_normal((n, wd)).astype(np.float32)), dtype) for wd in widths]


def sdpa_census(nts=SDPA_NTS, plan_nts=SDPA_PLAN_NTS, dtype: str = "f16", reps: int = 20, launches: int = 5,
                budget_s: float = 25.0, progress=print) -> list[dict]:
    """Per Gemma layer kind (global causal, sliding 512) and nt: the prefill's cuDNN SDPA (``attention.Cudnn``, the
    plan it builds) captured -- nodes, where its memset writes (offset into the graph's workspace), whether that
    region reads zero again after the kernel, replay bitwise against eager, time per call; at ``plan_nts`` also
    every candidate plan of the heuristics (A, FALLBACK) while ``budget_s`` lasts: its name, workspace, nodes, time
    and output against the prefill's plan (bitwise, max relative difference)."""
    from . import attention, gpu

    cp = gpu.cp()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    b = attention.Cudnn(None, dtype, "graph_nodes census")
    kinds = attention.bench_layouts()["gemma-3-270m"]
    t0 = time.time()
    rows = []
    for label, kind0 in kinds.items():
        for n in nts:
            kind = kind0.at(n)
            q, k, v = _sdpa_inputs(kind, n, dtype, rng)
            o = cp.zeros((n, kind.n_head * kind.head_dim_v), q.dtype)
            with stream:
                b.sdpa(q, k, v, n, kind, out=o)
                stream.synchronize()
            eager = cp.asnumpy(o).copy()
            G = b.graph(n, kind)
            idx = getattr(G["graph"], "_plan_index", None)      # the frontend's selected plan (a private field)
            try:
                pname = f"#{idx} {G['graph'].get_plan_name_at_index(idx)}" if idx is not None else ""
            except Exception as e:
                pname = f"#{idx} (name: {type(e).__name__})"
            ws = G["workspace"]
            regions = {"workspace": (ws.data.ptr, ws.nbytes)} if ws is not None else {}
            nodes = run_once(lambda: b.sdpa(q, k, v, n, kind, out=o), stream)
            row = {"kind": label, "window": kind.window, "nt": n, "dtype": dtype, "plan": "prefill",
                   "plan_name": pname, "workspace_bytes": G["workspace_bytes"], **summarize(nodes, regions),
                   "memset_zero_after": _memsets_zero_after(nodes),
                   "graph_bitwise_eager": bool(np.array_equal(cp.asnumpy(o), eager)),
                   "us_per_call": time_graph(lambda: b.sdpa(q, k, v, n, kind, out=o), stream, reps, launches)}
            rows.append(row)
            progress(f"sdpa {label} nt={n}: {row['n_kernel']} kernel + {row['n_memset']} memset nodes "
                     f"(memset at {row['memset_where'] or '-'}, {row['memset_bytes']} B, zero after: "
                     f"{row['memset_zero_after'] or '-'}), {row['us_per_call']:.2f} us/call")
            if n in plan_nts:
                rows.extend(_sdpa_plans(b, label, kind, n, dtype, (q, k, v), eager, stream, reps, launches,
                                        t0 + budget_s, progress))
    return rows


def _as_f64(o: np.ndarray, dtype: str) -> np.ndarray:
    from . import attention

    return (attention.bf16_to_f32(o) if dtype == "bf16" else o).astype(np.float64)


def _sdpa_plans(b, label, kind, n, dtype, ins, eager, stream, reps, launches, deadline, progress) -> list[dict]:
    from . import gpu

    cp = gpu.cp()
    q, k, v = ins
    G = b.define(n, kind)
    g = G["graph"]
    g.create_execution_plans([b.cudnn.heur_mode.A, b.cudnn.heur_mode.FALLBACK])
    try:
        g.check_support()
    except Exception as e:
        return [{"kind": label, "nt": n, "dtype": dtype, "plan": "all", "error": f"{type(e).__name__}: {e}"}]
    rows = []
    count = int(g.get_execution_plan_count())
    for i in range(count):
        base = {"kind": label, "window": kind.window, "nt": n, "dtype": dtype, "plan": str(i), "plans": count}
        if time.time() > deadline:
            rows.append({**base, "error": "left out: the census's time budget is spent"})
            continue
        try:
            base["plan_name"] = str(g.get_plan_name_at_index(i))
            g.build_plan_at_index(i)
            wsb = int(g.get_workspace_size_plan_at_index(i))
            ws = cp.empty(wsb, cp.uint8) if wsb else None
            o = cp.zeros_like(cp.asarray(eager))
            pack = {G["Q"]: q.data.ptr, G["K"]: k.data.ptr, G["V"]: v.data.ptr, G["O"]: o.data.ptr}

            def call():
                b.cudnn.set_stream(b.handle, cp.cuda.get_current_stream().ptr)
                g.execute_plan_at_index(pack, ws, index=i, handle=b.handle)

            with stream:
                call()
                stream.synchronize()
            got = _as_f64(cp.asnumpy(o), dtype)
            nodes = run_once(call, stream)
            regions = {"workspace": (ws.data.ptr, ws.nbytes)} if ws is not None else {}
            ref = _as_f64(eager, dtype)
            row = {**base, "workspace_bytes": wsb, **summarize(nodes, regions),
                   "memset_zero_after": _memsets_zero_after(nodes),
                   "bitwise_vs_prefill": bool(np.array_equal(got, ref)),
                   "max_rel_vs_prefill": float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)),
                   "us_per_call": time_graph(call, stream, reps, launches)}
        except Exception as e:
            row = {**base, "error": f"{type(e).__name__}: {e}"[:300]}
        rows.append(row)
        progress(f"sdpa {label} nt={n} plan {i} {row.get('plan_name', '')[:60]}: "
                 + (row["error"] if "error" in row else
                    f"{row['n_kernel']} kernel + {row['n_memset']} memset, {row['us_per_call']:.2f} us/call, "
                    f"max rel vs prefill {row['max_rel_vs_prefill']:.2g}"))
    return rows


def check(dense: list[dict], sdpa: list[dict]) -> dict:
    """The census's verdict: every replay equals its eager call; every dense output within ``DENSE_RTOL`` of
    float64; the lt path has no memset node and ran cuBLASLt (no fallback) at every point; memset counts per path."""
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
        if r.get("plan") == "prefill" and not r["graph_bitwise_eager"]:
            bad.append(f"sdpa {r['kind']} nt={r['nt']}: replay differs from the eager call")
    summ = {}
    for r in dense:
        summ[f"memsets_{r['shape']}_nt{r['nt']}_{r['dtype']}_{r['path']}"] = r["n_memset"]
    for r in sdpa:
        if r.get("plan") == "prefill":
            summ[f"memsets_sdpa_{r['kind']}_nt{r['nt']}"] = r["n_memset"]
    t = {(r["shape"], r["nt"], r["dtype"], r["path"]): r.get("us_per_call") for r in dense}
    summ["dense_lt_vs_gemm_ex_time"] = {f"{a} nt={n} {d}": round(t[(a, n, d, "lt")] / t[(a, n, d, "gemm_ex")], 3)
                                        for (a, n, d, p) in t if p == "lt" and (a, n, d, "gemm_ex") in t
                                        and t[(a, n, d, "lt")] and t[(a, n, d, "gemm_ex")]}
    free = [f"{r['kind']} nt={r['nt']} plan {r['plan']} ({r.get('plan_name', '')})" for r in sdpa
            if r.get("plan") not in ("prefill", "all") and "error" not in r and r["n_memset"] == 0]
    summ["sdpa_plans_without_memset"] = free
    return {"ok": not bad, "problems": bad, **summ}
