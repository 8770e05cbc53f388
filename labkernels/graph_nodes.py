"""What a captured CUDA graph holds, node by node (first asked of the memset nodes in Gemma's captured prefill graph).

:func:`capture` records a callable on a stream into a CUDA graph with the runtime's stream capture (CuPy's own
``Stream.end_capture`` destroys the graph once instantiated, so its nodes could not be read), :func:`census`
lists the graph's nodes (``cuGraphGetNodes`` / ``cuGraphNodeGetType`` through cuda-bindings, child graphs
included) with each kernel's name and each memset's destination and size, and :func:`summarize` counts them.

The censuses that measure the prefill's memsets with it are the lab's (:mod:`labkernels.rounds.r05_wall.graph_census`); the
product uses :func:`capture`, :func:`census`, :func:`memsets_to_kernels` (the prefill's and the decode's graphs) and
the plan trials of ``attention.no_memset_plan`` (:func:`_candidates`, :func:`_plan_trial`).
"""

from __future__ import annotations

import numpy as np

from . import gpu


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
    parameters and the same dependencies (for the prefill without host overhead: a memset node costs the boundaries
    around it ~5 us at Gemma's prefill, a kernel-to-kernel boundary well under 1 us). A memset node the driver refuses
    to remove stays as it was (its replacement is taken out again). Returns {'replaced': n, 'bytes': their total, 'left': memset nodes still
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
    as captured (the caller converts it); its workspace buffer)."""
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
        return row, got, ws
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
        return row, None, None


def _max_rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


