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
  window 512) under both plan policies of ``attention.Cudnn`` (the heuristic plan the prefill runs by default, and
  ``no_memset``: :func:`no_memset_plan`), and, at the token counts asked, every candidate plan of the heuristics
  (name, workspace, nodes, time, output against the heuristic plan), to show whether any plan runs without the
  memset that precedes cuDNN's flash kernel.
"""

from __future__ import annotations

import time

import numpy as np

from . import gpu

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


class CaptureError(RuntimeError):
    pass


def _rt():
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


def _count_call(fn, node):
    """cuGraphNodeGetDependencies / cuGraphNodeGetDependentNodes across binding versions: (err, nodes, [edge data,]
    count) -- asked once for the count, then for the nodes."""
    r = fn(node, 0)
    if int(r[0]) != 0:
        raise CaptureError(f"{fn.__name__} failed: {r[0]}")
    n = int(r[-1])
    if n == 0:
        return []
    r = fn(node, n)
    if int(r[0]) != 0:
        raise CaptureError(f"{fn.__name__} failed: {r[0]}")
    return list(r[1])[:n]


def _add_edges(drv, graph, frm: list, to: list) -> None:
    if not frm:
        return
    try:
        r = drv.cuGraphAddDependencies(graph, frm, to, len(frm))
    except TypeError:                      # bindings whose call takes the edge data (None: plain edges)
        r = drv.cuGraphAddDependencies(graph, frm, to, None, len(frm))
    if int(r[0]) != 0:
        raise CaptureError(f"cuGraphAddDependencies failed: {r[0]}")


def fill_launch(p) -> dict:
    """The fill kernel launch (kernels/prefill.cu, fill_kernel) that does what a memset node with parameters ``p``
    (``dst, value, elementSize, width, height, pitch``) does: template ES, grid and arguments."""
    es, width, height = int(p.elementSize), int(p.width), max(1, int(p.height))
    if es not in (1, 2, 4):
        raise CaptureError(f"a memset of {es}-byte elements has no fill kernel")
    pitch = int(p.pitch) if height > 1 else width * es
    n = width * height
    grid = max(1, min((n + 255) // 256, 1024))
    return {"ES": es, "grid": grid, "args": (np.uint64(int(p.dst)), np.uint32(int(p.value) & 0xFFFFFFFF),
                                             np.uint64(width), np.uint64(height), np.uint64(pitch)),
            "bytes": n * es}


def memsets_to_kernels(graph: int) -> dict:
    """Replace every memset node of a captured graph's top level by a node of the lab's fill kernel with the same
    parameters and the same dependencies (issue 18: a memset node costs the boundaries around it ~5 us at Gemma's
    prefill, a kernel-to-kernel boundary well under 1 us). A memset node the driver refuses to remove stays as it
    was (its replacement is taken out again). Returns {'replaced': n, 'bytes': their total, 'left': memset nodes still
    in the graph (those kept and those inside child graphs, which are not touched), 'kept', 'kept_why'}. The graph
    must not be instantiated yet."""
    from cuda.bindings import driver as drv

    g = drv.CUgraph(int(graph))
    _, n = _check(drv.cuGraphGetNodes(g, 0), "cuGraphGetNodes")
    nodes, _ = _check(drv.cuGraphGetNodes(g, n), "cuGraphGetNodes") if n else ([], 0)
    n_memset = sum(1 for r in census(int(graph)) if r["type"] == "MEMSET")
    # can nodes of this graph be removed at all? (Gemma's graphs, with cuBLAS's nodes in them, refuse every
    # cuGraphDestroyNode: CUDA_ERROR_NOT_SUPPORTED, runs 20261201T162602Z / 163146Z) -- probed on an empty node of
    # its own, which stays behind as a harmless root when the answer is no
    probe = _check(drv.cuGraphAddEmptyNode(g, [], 0), "cuGraphAddEmptyNode")
    (err,) = drv.cuGraphDestroyNode(probe)
    if int(err) != 0:
        return {"replaced": 0, "bytes": 0, "left": n_memset, "kept": n_memset,
                "kept_why": f"cuGraphDestroyNode: {getattr(err, 'name', err)} in this graph"}
    replaced, nbytes, left, kept = 0, 0, 0, []
    for node in nodes:
        t = _check(drv.cuGraphNodeGetType(node), "cuGraphNodeGetType")
        tname = str(getattr(t, "name", t)).split(".")[-1].replace("CU_GRAPH_NODE_TYPE_", "")
        if tname == "GRAPH":
            child = _check(drv.cuGraphChildGraphNodeGetGraph(node), "cuGraphChildGraphNodeGetGraph")
            left += sum(1 for r in census(int(child)) if r["type"] == "MEMSET")
            continue
        if tname != "MEMSET":
            continue
        p = _check(drv.cuGraphMemsetNodeGetParams(node), "cuGraphMemsetNodeGetParams")
        f = fill_launch(p)
        k = gpu.kernel("fill", ES=f["ES"])
        deps = _count_call(drv.cuGraphNodeGetDependencies, node)
        outs = _count_call(drv.cuGraphNodeGetDependentNodes, node)
        holders, params = gpu.kernel_params(f["args"])
        kp = drv.CUDA_KERNEL_NODE_PARAMS()
        kp.func = drv.CUfunction(k.ptr)
        kp.gridDimX, kp.gridDimY, kp.gridDimZ = f["grid"], 1, 1
        kp.blockDimX, kp.blockDimY, kp.blockDimZ = k.spec.threads, 1, 1
        kp.sharedMemBytes = 0
        kp.kernelParams = params
        kp.extra = 0
        new = _check(drv.cuGraphAddKernelNode(g, deps, len(deps), kp), "cuGraphAddKernelNode")
        del holders
        (err,) = drv.cuGraphDestroyNode(node)
        if int(err) != 0:
            # the driver keeps some memset nodes (Gemma's cuBLAS split-K memset: CUDA_ERROR_NOT_SUPPORTED, run
            # 20261201T162602Z): take the new node out again, the memset node stays as it was
            (err2,) = drv.cuGraphDestroyNode(new)
            if int(err2) != 0:
                raise CaptureError(f"cuGraphDestroyNode of a memset failed ({err}) and its replacement could not be "
                                   f"removed ({err2})")
            kept.append(str(getattr(err, "name", err)))
            continue
        _add_edges(drv, g, [new] * len(outs), outs)
        replaced += 1
        nbytes += f["bytes"]
    return {"replaced": replaced, "bytes": nbytes, "left": left + len(kept), "kept": len(kept),
            "kept_why": "; ".join(sorted(set(kept)))}


def summarize(nodes: list[dict], regions: dict | None = None) -> dict:
    """Counts of a census by node type (``n_kernel``, ``n_memset``, ...; ``nodes`` in all), the kernels' names
    (in the census's order, '; '-joined), the memsets' total bytes and, for ``regions`` {label: (address, bytes)}, in
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


def run_once(fn, stream) -> list[dict]:
    """Capture ``fn`` once, read its census (:func:`census`), replay it once on ``stream`` and wait for it."""
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


def _clear(a, stream) -> None:
    """Zero ``a`` on ``stream`` and wait (before a replay that must write it)."""
    with stream:
        a.fill(0)
        stream.synchronize()


def _region_zero(ptr: int, nbytes: int) -> bool:
    """Whether device memory [ptr, ptr + nbytes) reads all zero (after the work that used it)."""
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
                gpu.gemm_dense(x, w, out=out, path=path)          # eager (plans the shape, loads the kernels)
                stream.synchronize()
            eager = cp.asnumpy(out)
            _clear(out, stream)                                   # the replay must write it again
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
                t_in = gpu.dense_type(np.float16 if dt == "f16" else np.float32)
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
                budget_s: float = 20.0, progress=print) -> list[dict]:
    """Per Gemma layer kind (global causal, sliding 512) and nt, two rows: ``plan`` "heuristic" -- the prefill's cuDNN
    SDPA (``attention.Cudnn``, the frontend's plan) -- and "no_memset" (``Cudnn(plan="no_memset")``, its choice and
    why in ``plan_name``), each captured: nodes, where a memset writes (offset into the graph's workspace), whether
    that region reads zero again after the kernel, replay bitwise against eager, time per call, output against the
    heuristic plan; at ``plan_nts`` also every candidate plan of the heuristics (A, FALLBACK) while ``budget_s``
    lasts: its name, workspace, nodes, time and output against the heuristic plan."""
    from . import attention, gpu

    cp = gpu.cp()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    backends = {p: attention.Cudnn(None, dtype, "graph_nodes census", plan=p) for p in attention.CUDNN_PLANS}
    kinds = attention.bench_layouts()["gemma-3-270m"]
    t0 = time.time()
    rows, listed = [], set()
    for label, kind0 in kinds.items():
        for n in nts:
            kind = kind0.at(n)         # a window >= n is causal: Gemma's sliding layers below 512 tokens
            ins = _sdpa_inputs(kind, n, dtype, rng)
            ref = None
            for p, b in backends.items():
                row, eager = _backend_row(b, kind, n, ins, stream, reps, launches)
                ref = eager if ref is None else ref
                row.update(kind=label, window=kind.window, nt=n, dtype=dtype, plan=p,
                           bitwise_vs_prefill=bool(np.array_equal(eager, ref)),
                           max_rel_vs_prefill=_max_rel(_as_f64(eager, dtype), _as_f64(ref, dtype)))
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
    _clear(o, stream)
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
    nodes = run_once(lambda: b.sdpa(q, k, v, n, kind, out=o), stream)
    row = {"plan_name": pname, "workspace_bytes": G["workspace_bytes"], **summarize(nodes, regions),
           "memset_zero_after": _memsets_zero_after(nodes),
           "graph_bitwise_eager": bool(np.array_equal(cp.asnumpy(o), eager)),
           "us_per_call": time_graph(lambda: b.sdpa(q, k, v, n, kind, out=o), stream, reps, launches)}
    return row, eager


def _as_f64(o: np.ndarray, dtype: str) -> np.ndarray:
    from . import attention

    return (attention.bf16_to_f32(o) if dtype == "bf16" else o).astype(np.float64)


def _candidates(b, n: int, kind):
    """A fresh SDPA graph of (n, kind) with every candidate plan of the heuristics (A, FALLBACK) created and
    checked, none built: (its dict as from Cudnn.define, plan count)."""
    G = b.define(n, kind)
    g = G["graph"]
    g.create_execution_plans([b.cudnn.heur_mode.A, b.cudnn.heur_mode.FALLBACK])
    g.check_support()
    return G, int(g.get_execution_plan_count())


def _plan_trial(b, G, i: int, ins, width: int, stream) -> tuple[dict, np.ndarray | None, object]:
    """Plan ``i`` of ``G``'s graph built, run once eager on ``ins`` (output [n, width]) and captured once (census,
    replay): (row with
    plan_name, workspace_bytes, the node summary, memset_zero_after, graph_bitwise_eager, or error; its eager output
    as float64; its workspace buffer)."""
    cp = gpu.cp()
    g = G["graph"]
    row = {"plan": str(i)}
    try:
        row["plan_name"] = str(g.get_plan_name_at_index(i))
        g.build_plan_at_index(i)
        wsb = int(g.get_workspace_size_plan_at_index(i))
        ws = cp.empty(wsb, cp.uint8) if wsb else None
        q, k, v = ins
        o = cp.zeros((q.shape[0], width), q.dtype)
        cp.cuda.runtime.deviceSynchronize()
        with stream:
            b.execute(G, q, k, v, o, index=i, workspace=ws)
            stream.synchronize()
        got = cp.asnumpy(o)
        _clear(o, stream)
        nodes = run_once(lambda: b.execute(G, q, k, v, o, index=i, workspace=ws), stream)
        regions = {"workspace": (ws.data.ptr, ws.nbytes)} if ws is not None else {}
        row.update({"workspace_bytes": wsb, **summarize(nodes, regions), "memset_zero_after": _memsets_zero_after(nodes),
                    "graph_bitwise_eager": bool(np.array_equal(cp.asnumpy(o), got))})
        return row, _as_f64(got, b.dtype), ws
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
        return row, None, None


def _max_rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def _sdpa_plans(b, label, kind, n, dtype, ins, eager, stream, reps, launches, deadline, progress) -> list[dict]:
    try:
        G, count = _candidates(b, n, kind)
    except Exception as e:
        return [{"kind": label, "nt": n, "dtype": dtype, "plan": "all", "error": f"{type(e).__name__}: {e}"}]
    ref = _as_f64(eager, dtype)
    q, k, v = ins
    out = gpu.cp().zeros(eager.shape, q.dtype)
    rows = []
    for i in range(count):
        base = {"kind": label, "window": kind.window, "nt": n, "dtype": dtype, "plans": count}
        if time.time() > deadline:
            rows.append({**base, "plan": str(i), "error": "left out: the census's time budget is spent"})
            continue
        row, got, ws = _plan_trial(b, G, i, ins, eager.shape[1], stream)
        row = {**base, **row}
        if got is not None:
            row["bitwise_vs_prefill"] = bool(np.array_equal(got, ref))
            row["max_rel_vs_prefill"] = _max_rel(got, ref)
            row["us_per_call"] = time_graph(lambda: b.execute(G, q, k, v, out, index=i, workspace=ws), stream,
                                            reps, launches)
        rows.append(row)
        progress(f"sdpa {label} nt={n} plan {i} {row.get('plan_name', '')[:60]}: "
                 + (row["error"] if "error" in row else
                    f"{row['n_kernel']} kernel + {row['n_memset']} memset, {row['us_per_call']:.2f} us/call, "
                    f"max rel vs prefill {row['max_rel_vs_prefill']:.2g}"))
    return rows


def no_memset_plan(b, n: int, kind, ref_G: dict, seed: int = 0) -> tuple[dict, str]:
    """For ``attention.Cudnn(plan="no_memset")``: the first candidate plan of (n, kind) in the heuristics' order
    whose captured execution has no memset node and whose output on random inputs is within 2 x PARITY_TOL of the
    heuristic plan's (``ref_G``, already built); returns (its graph dict with ``plan_index``, why) or (``ref_G``,
    why not). Plans are not tried while the current stream captures (the trial runs and captures work itself)."""
    from . import attention, gpu

    cp = gpu.cp()
    if cp.cuda.runtime.streamIsCapturing(cp.cuda.get_current_stream().ptr):
        return ref_G, "heuristic plan: plans are not tried while the stream captures a graph"
    stream = cp.cuda.Stream(non_blocking=True)
    ins = _sdpa_inputs(kind, n, b.dtype, np.random.default_rng(seed))
    q, k, v = ins
    o = cp.zeros((n, kind.n_head * kind.head_dim_v), q.dtype)
    cp.cuda.runtime.deviceSynchronize()
    with stream:
        b.execute(ref_G, q, k, v, o)
        stream.synchronize()
    ref = _as_f64(cp.asnumpy(o), b.dtype)
    try:
        G, count = _candidates(b, n, kind)
    except Exception as e:
        return ref_G, f"heuristic plan: the candidate plans could not be listed: {type(e).__name__}: {e}"
    tol = 2 * attention.PARITY_TOL[b.dtype]
    tried = []
    for i in range(min(count, attention.NO_MEMSET_MAX_PLANS)):
        row, got, ws = _plan_trial(b, G, i, ins, o.shape[1], stream)
        name = row.get("plan_name", "?")
        if got is None:
            tried.append(f"#{i} {name}: {row['error'][:120]}")
        elif row["n_memset"]:
            tried.append(f"#{i} {name}: {row['n_memset']} memset")
        elif not row["graph_bitwise_eager"]:
            tried.append(f"#{i} {name}: its replay differs from its eager run")
        elif not _max_rel(got, ref) <= tol:
            tried.append(f"#{i} {name}: {_max_rel(got, ref):.2e} from the heuristic plan (> {tol:g})")
        else:
            return ({**G, "workspace": ws, "workspace_bytes": row["workspace_bytes"], "plan_index": i},
                    f"plan #{i} of {count} ({name}): no memset node, {_max_rel(got, ref):.1e} from the heuristic plan")
    return ref_G, (f"heuristic plan: none of the first {len(tried)} of {count} candidate plans fits (no memset node, "
                   f"replay equal to its eager run, within {tol:g} of the heuristic plan): " + "; ".join(tried))


def check(dense: list[dict], sdpa: list[dict]) -> dict:
    """The census's verdict: every replay equals its eager call; every dense output within ``DENSE_RTOL`` of
    float64; the lt path has no memset node and ran cuBLASLt (no fallback) at every point; a no_memset SDPA plan is
    within 2 x the attention parity tolerance of the heuristic plan; memset counts per path."""
    from . import attention

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
