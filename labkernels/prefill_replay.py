"""The prefill's CUDA graphs (split from ``prefill.py``, issue 42): :class:`GraphReplay`, the part of
:class:`labkernels.prefill.GpuModel` that captures its whole forward once per (model, nt, options) -- a private memory
pool, the token ids copied in (or read from a pinned host buffer), the memset nodes rewritten as fill kernels, the
lab's kernels launched programmatically -- checks the first replay against the eager forward and replays it, with the
replay's GPU span and host breakdown; and :func:`timed_prefill`, the wall time of whole prefills.

``GraphReplay`` holds no state of its own: it runs on the GpuModel's options (``opts``), its eager forward
(``_forward_device``), its lazily built per-weight state (``_prepare``) and the graph tables the GpuModel keeps
(``_graphs``, ``_graph_refused``, ``graph_fallbacks``, ``last_mode``, ``stamp_replays``, ``_last_stamps``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from . import gpu, graph_nodes
from .forward_common import GRAPH_RTOL, GraphCaptureError, _instantiate, graph_support
from .trace import NullTracer


@dataclass(frozen=True)
class GraphKey:
    model: int              # id() of the GpuModel's model (the graph's pointers are that GpuModel's weights)
    nt: int
    all_logits: bool
    options: tuple          # PrefillOptions.key()


@dataclass
class GraphEntry:
    """A captured forward and everything its replay touches, kept alive with it: the private memory pool that
    served every activation during warm-up and capture (never used by anything else), the token input buffer
    copied into before each replay and the logits buffer the graph writes."""
    key: GraphKey
    graph: object
    pool: object
    stream: object
    tokens: object
    out: object
    families: str
    capture_s: float
    max_rel_diff: float     # replay vs eager at capture
    bitwise: bool
    replays: int = 0
    pdl_launches: int = 0        # the capture's programmatic launches (PrefillOptions.pdl)
    memsets_replaced: int = 0    # memset nodes rewritten as fill kernels (PrefillOptions.memsets_as_kernels)
    memsets_left: int = 0        # memset nodes still in the graph (kept by the driver, or inside child graphs)
    memsets_kept_why: str = ""   # why the rewrite left memset nodes (e.g. the driver refuses node removal)
    host_tokens: object = None   # pinned host ids the graph's first node copies in (None: tokens.set per replay)
    done: object = None          # event after the latest replay: its ids were read before host_tokens is rewritten
    span: object = None          # (timing events) the graph's first and last nodes: event records inside it
    marks: object = None         # (timing events) recorded on the replay stream just before the graph's launch and


class GraphReplay:
    """GpuModel's CUDA graphs: capture (:meth:`_capture`), replay (:meth:`_forward_graph`), what was captured
    (:meth:`graphs`, :meth:`free_graphs`) and the timing of the latest replay (:meth:`last_graph_span_ms`,
    :meth:`replay_breakdown`)."""

    def graph_key(self, nt: int, all_logits: bool = False) -> GraphKey:
        return GraphKey(id(self.model), int(nt), bool(all_logits), self.opts.key())

    def _record_fallback(self, key: GraphKey, reason: str) -> None:
        """A forward that asked for a graph (auto) and ran eager: kept in the model's ``graph_fallbacks`` and logged."""
        self.graph_fallbacks.append({"nt": key.nt, "all_logits": key.all_logits, "options": dict(key.options),
                                     "reason": reason})
        self._graph_refused[key] = reason
        logging.getLogger("labkernels.prefill").warning("prefill nt=%d ran eager: %s", key.nt, reason)

    def _forward_graph(self, toks, all_logits):
        """Replay (capturing first when new) the graph of this (model, nt, options); the logits are copied out
        of the graph's buffer onto the current stream."""
        stamp = self.stamp_replays
        ta = time.perf_counter() if stamp else 0.0
        cp = gpu.cp()
        key = self.graph_key(toks.size, all_logits)
        if key in self._graph_refused:
            raise GraphCaptureError(self._graph_refused[key])
        e = self._graphs.get(key)
        if e is None:
            e = self._capture(key, toks)
            self._graphs[key] = e
        cur = cp.cuda.get_current_stream()
        tb = time.perf_counter() if stamp else 0.0
        if e.host_tokens is not None:     # the graph copies the ids in from this pinned buffer (its first node)
            if e.done is not None:
                e.done.synchronize()      # the previous replay has read them
            e.host_tokens[...] = toks
        else:
            e.tokens.set(toks, stream=cur)
        marks = None
        if stamp:
            tc = time.perf_counter()
            if e.marks is None:
                e.marks = (cp.cuda.Event(), cp.cuda.Event())
            marks = e.marks
            marks[0].record(cur)
        t1 = time.perf_counter()
        e.graph.launch(stream=cur)
        t2 = time.perf_counter()
        if e.done is not None:
            e.done.record(cur)
        self._last_graph = e
        e.replays += 1
        self._used = list(e.families)
        out = e.out.copy()
        if marks is not None:
            marks[1].record(cur)
        self._last_stamps = (ta, tb, tc, t1, t2, time.perf_counter()) if marks is not None else None
        return out

    def last_graph_span_ms(self) -> float:
        """GPU time from the latest replay's first node to its last (both event-record nodes of the graph; call
        after the replay has finished): its execution, the idle gaps between its nodes included, at the clocks that
        replay ran at. NaN when the latest forward was no graph replay."""
        e = getattr(self, "_last_graph", None)
        if self.last_mode != "graph" or e is None or e.span is None:
            return float("nan")
        return float(gpu.cp().cuda.get_elapsed_time(e.span[0], e.span[1]))

    def replay_breakdown(self, t0: float, t_end: float) -> dict:
        """Where the latest replay's wall went outside the graph's execution (call after a forward with
        ``stamp_replays`` set, timed from host clock ``t0`` before the forward to ``t_end`` after the device was
        synchronized; ms): ``py_pre`` (``t0`` to the graph's launch call: argument checks, the cache lookup, the ids'
        write), ``launch_call`` (the host's ``cudaGraphLaunch``), ``py_post`` (its return to the forward's return: the
        event record and the logits' copy launch), ``sync`` (the forward's return to the synchronization's),
        ``gpu_lead`` (on the GPU, from the event recorded just before the launch call to the graph's first node),
        ``gpu_span`` (the graph's first node to its last), ``gpu_tail`` (the last node to the event after the logits'
        copy) and ``submit_wake`` = wall - py_pre - (lead + span + tail): the latency of the first submission to an
        idle GPU and of the host's waking when the GPU has finished. ``py_pre`` splits into ``py_entry`` (``t0`` to the
        replay method: the call, the ids' checks, the mode), ``lookup`` (the graph's key and cache entry),
        ``ids`` (waiting for the previous replay's event, writing the ids) and ``mark`` (the stamp's own event
        record). NaN fields where the forward was no stamped replay."""
        keys = ("py_pre", "launch_call", "py_post", "sync", "gpu_lead", "gpu_span", "gpu_tail", "submit_wake",
                "py_entry", "lookup", "ids", "mark")
        e = getattr(self, "_last_graph", None)
        st = self._last_stamps
        if self.last_mode != "graph" or e is None or st is None or e.marks is None or e.span is None:
            return {k + "_ms": float("nan") for k in keys}
        el = gpu.cp().cuda.get_elapsed_time
        ta, tb, tc, t1, t2, t3 = st
        lead, span, tail = (float(el(e.marks[0], e.span[0])), float(el(e.span[0], e.span[1])),
                            float(el(e.span[1], e.marks[1])))
        wall = (t_end - t0) * 1e3
        pre = (t1 - t0) * 1e3
        vals = (pre, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t_end - t3) * 1e3, lead, span, tail,
                wall - pre - (lead + span + tail), (ta - t0) * 1e3, (tb - ta) * 1e3, (tc - tb) * 1e3, (t1 - tc) * 1e3)
        return {k + "_ms": v for k, v in zip(keys, vals)}

    def _capture(self, key: GraphKey, toks) -> GraphEntry:
        """Capture the forward for ``key``: every activation comes from a private memory pool that lives with the
        graph (an eager warm-up on the capture stream loads every module and fills the pool first, so capture
        allocates from the same cached blocks); the token ids are read from a persistent buffer. The first replay
        is checked against the warm-up's logits (:data:`GRAPH_RTOL`); any failure is a GraphCaptureError.

        The capture is the runtime's (``cudaStreamBeginCapture``, relaxed), so that the captured ``cudaGraph_t`` can
        be rewritten before it is instantiated (``memsets_as_kernels``); with ``ids_from_host`` the embedding reads the
        ids through the pinned buffer's device pointer instead of a copy node; with ``pdl`` the lab's kernels launch
        programmatically (:func:`labkernels.gpu.programmatic_launches`)."""
        cp = gpu.cp()
        why = graph_support()
        if why:
            raise GraphCaptureError(why)
        t0 = time.perf_counter()
        self._prepare(key.nt, key.all_logits)
        pool = cp.cuda.MemoryPool()
        stream = cp.cuda.Stream(non_blocking=True)
        n = key.nt
        host = gpu.pinned_empty((n,), np.int32)       # the ids' host side: pinned, so the copy can be a graph node
        host[...] = toks
        try:
            cp.cuda.get_current_stream().synchronize()
            with cp.cuda.using_allocator(pool.malloc), stream:
                tok_buf = cp.empty((n,), cp.int32)
                gpu.h2d_async(tok_buf, host, stream)
                self._used = []
                ref = self._forward_device(tok_buf, n, NullTracer(), key.all_logits).copy()
                stream.synchronize()
                families = list(self._used)
                self._used = []
                ids = gpu.host_device_pointer(host) if self.opts.ids_from_host else tok_buf
                span = (cp.cuda.Event(), cp.cuda.Event())
                captured = {}

                def work():
                    gpu.record_in_graph(span[0], stream)   # the first node: a timing event (last_graph_span_ms)
                    if not self.opts.ids_from_host:   # then the ids, from the pinned buffer
                        gpu.h2d_async(tok_buf, host, stream)
                    with gpu.programmatic_launches(self.opts.pdl):
                        captured["out"] = self._forward_device(ids, n, NullTracer(), key.all_logits)
                    gpu.record_in_graph(span[1], stream)   # and the last

                pdl0 = gpu.pdl_launch_count()
                try:   # the runtime's capture (relaxed): the cudaGraph_t is ours to rewrite before it is instantiated
                    graw = graph_nodes.capture(work, stream)
                except graph_nodes.CaptureError as e:
                    raise GraphCaptureError(f"stream capture of the forward at nt={n} returned no graph") from e
                out = captured["out"]
                pdl_n = gpu.pdl_launch_count() - pdl0
                try:
                    rew = graph_nodes.memsets_to_kernels(graw) if self.opts.memsets_as_kernels else \
                        {"replaced": 0, "left": sum(r["type"] == "MEMSET" for r in graph_nodes.census(graw))}
                    g = _instantiate(graw)
                except BaseException:
                    graph_nodes.destroy(graw)
                    raise
                g.launch(stream=stream)
                stream.synchronize()
            diff = float(cp.abs(out - ref).max())
            scale = float(cp.abs(ref).max())
        except GraphCaptureError:
            raise
        except Exception as e:   # (graph_nodes.capture has ended a capture that failed inside it)
            raise GraphCaptureError(f"capture of the forward at nt={n} failed: {type(e).__name__}: {e}") from e
        rel = diff / scale if scale else diff
        if not np.isfinite(rel) or rel > GRAPH_RTOL:
            raise GraphCaptureError(f"graph replay at nt={n} differs from the eager forward: max rel diff {rel:.3g} "
                                    f"> {GRAPH_RTOL:g}")
        return GraphEntry(key, g, pool, stream, tok_buf, out, tuple(families), time.perf_counter() - t0, rel,
                          diff == 0.0, pdl_launches=pdl_n, memsets_replaced=rew["replaced"],
                          memsets_left=rew["left"], memsets_kept_why=rew.get("kept_why", ""), host_tokens=host,
                          done=cp.cuda.Event(block=False, disable_timing=True), span=span)

    def graphs(self) -> list[dict]:
        """The captured graphs: key, capture seconds, replays, replay-vs-eager difference at capture, whether its lab
        kernels launched programmatically and how many did."""
        return [{"nt": e.key.nt, "all_logits": e.key.all_logits, "capture_s": e.capture_s, "replays": e.replays,
                 "max_rel_diff": e.max_rel_diff, "bitwise": e.bitwise, "pool_bytes": int(e.pool.total_bytes()),
                 "pdl": bool(dict(e.key.options).get("pdl", False)), "pdl_launches": e.pdl_launches,
                 "memsets_replaced": e.memsets_replaced, "memsets_left": e.memsets_left,
                 "memsets_kept_why": e.memsets_kept_why,
                 "ids_from_host": bool(dict(e.key.options).get("ids_from_host", False))}
                for e in self._graphs.values()]

    def free_graphs(self) -> None:
        """Drop every captured graph and give its private memory back."""
        entries = list(self._graphs.values())
        self._graphs.clear()
        self._graph_refused.clear()
        for e in entries:
            if hasattr(e.graph, "close"):
                e.graph.close()
            e.graph = e.out = e.tokens = None
            e.pool.free_all_blocks()


def timed_prefill(gm: GraphReplay, tokens, repeats: int = 3, warmup: int = 1, graph="opts",
                  breakdown: bool = False) -> dict:
    """Wall time of whole prefills (host clock around a synchronized forward), median of repeats; ``mode`` says
    what ran ('graph' | 'eager', the same for every timed forward or an error) and ``fallback`` why a forward
    that could take a graph ran eager (None otherwise). The warm-up forwards capture the graph when new.

    A graph replay also gives ``gpu_span_ms`` (median of :meth:`GraphReplay.last_graph_span_ms`: from the graph's first
    node to its last, on the GPU) and ``host_outside_ms`` = wall - that span: the time of the forward outside the
    graph's execution (Python, the graph launch and its latency, the logits copy, the synchronization), a difference
    within the same forwards, so that GPU clocks cancel out of it (the median of the per-forward differences; runs
    up to 20261201T163853Z recorded the difference of the two medians, which carries the walls' spread).

    ``breakdown``: the timed replays also stamp their host clocks and two events around the launch
    (:meth:`GraphReplay.replay_breakdown`), and ``breakdown`` holds each part's median over the repeats (ms), the
    parts' own walls included (``wall_ms``); the stamps cost the replay two event records, so a stamped forward is
    not the one the throughput figures time."""
    cp = gpu.cp()
    tokens = gm._tokens(tokens)       # the ids as an int32 array once, as a caller holding them would pass them
    for _ in range(warmup):
        gm.forward(tokens, graph=graph)
    cp.cuda.runtime.deviceSynchronize()
    walls, modes, spans, parts = [], set(), [], []
    stamp0 = getattr(gm, "stamp_replays", False)
    if breakdown:
        gm.stamp_replays = True
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            gm.forward(tokens, graph=graph)
            cp.cuda.runtime.deviceSynchronize()
            t_end = time.perf_counter()
            walls.append(t_end - t0)
            modes.add(gm.last_mode)
            spans.append(gm.last_graph_span_ms())
            if breakdown:
                parts.append({"wall_ms": (t_end - t0) * 1e3, **gm.replay_breakdown(t0, t_end)})
    finally:
        if breakdown:
            gm.stamp_replays = stamp0
    if len(modes) != 1:
        raise GraphCaptureError(f"timed forwards ran in different modes: {sorted(modes)}")
    w = float(np.median(walls))
    mode = modes.pop()
    want = gm.opts.graph if graph == "opts" else graph
    fallback = gm._graph_refused.get(gm.graph_key(len(tokens))) if (want is None and mode == "eager") else None
    graph_mode = mode == "graph"
    span = float(np.median(spans)) if graph_mode else float("nan")
    # per forward, then the median: a difference of two medians would take the spread of the walls for host time
    outside = float(np.median([x * 1e3 - sp for x, sp in zip(walls, spans)])) if graph_mode else float("nan")
    return {"n_tokens": len(tokens), "wall_ms": w * 1e3, "tok_per_s": len(tokens) / w,
            "wall_ms_all": [x * 1e3 for x in walls], "mode": mode, "fallback": fallback,
            "gpu_span_ms": span, "host_outside_ms": outside,
            "breakdown": {k: float(np.median([p[k] for p in parts])) for k in parts[0]} if parts else None}
