"""Launch-by-launch tracing of GPU work with CUPTI's activity API (NVIDIA's ``cupti-python``).

Every kernel a traced region launches is recorded by the driver with its name, start/end timestamps, grid
and block; the lab tags each *op* of its prefill (``with tracer.op("ffn_down", cls="gemm_q6k", ...)``) with a
CUPTI external correlation id, so each kernel record maps back to the op and weight tensor that launched it
(also kernels launched inside cuBLAS or CuPy). Without a tracer the ``op`` context is a no-op.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


class TraceError(RuntimeError):
    pass


@dataclass
class OpInfo:
    op_id: int
    name: str
    cls: str
    layer: int | None = None
    weight: str | None = None
    macs: int = 0
    flops: int = 0
    extra: dict = field(default_factory=dict)


class NullTracer:
    """The tracer used when not tracing: ops cost nothing."""
    active = False

    @contextlib.contextmanager
    def op(self, name, cls, **kw):
        yield None


class CuptiTracer:
    """Collects CONCURRENT_KERNEL, EXTERNAL_CORRELATION (and MEMSET/MEMCPY) activity records."""
    active = True

    def __init__(self):
        try:
            from cupti import cupti
        except ImportError as e:
            raise TraceError("tracing needs NVIDIA's cupti-python package (carry its wheel to the GPU machine)") from e
        self.cupti = cupti
        self.kernels: list[dict] = []
        self.other: list[dict] = []
        self.ext: dict[int, int] = {}       # CUPTI correlation id -> op id
        self.ops: list[OpInfo] = []
        self.errors: list[str] = []
        self._kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.EXTERNAL_CORRELATION,
                       cupti.ActivityKind.MEMSET, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.DRIVER,
                       cupti.ActivityKind.RUNTIME]
        self._ext_kind = cupti.ExternalCorrelationKind.CUSTOM0

    def _buffer_requested(self):
        return 8 * 1024 * 1024, 0

    def _buffer_completed(self, activities):
        # runs on CUPTI's thread: one bad record must not drop the rest of the buffer
        for a in activities:
            try:
                self._record(a)
            except Exception as e:  # pragma: no cover - depends on the CUPTI version
                self.errors.append(f"{getattr(a, 'kind', '?')}: {type(e).__name__}: {e}")

    def _record(self, a):
        c = self.cupti
        k = int(a.kind)
        if k == c.ActivityKind.CONCURRENT_KERNEL or k == c.ActivityKind.KERNEL:
            self.kernels.append({"name": a.name, "start": int(a.start), "end": int(a.end),
                                 "correlation_id": int(a.correlation_id), "grid": (a.grid_x, a.grid_y, a.grid_z),
                                 "block": (a.block_x, a.block_y, a.block_z), "stream": int(a.stream_id),
                                 "smem": int(getattr(a, "dynamic_shared_memory", 0)),
                                 "regs": int(getattr(a, "registers_per_thread", 0))})
        elif k == c.ActivityKind.EXTERNAL_CORRELATION:
            self.ext[int(a.correlation_id)] = int(a.external_id)
        elif k in (c.ActivityKind.MEMSET, c.ActivityKind.MEMCPY):
            self.other.append({"name": c.ActivityKind(k).name.lower(), "start": int(a.start), "end": int(a.end),
                               "correlation_id": int(a.correlation_id)})

    def __enter__(self):
        c = self.cupti
        c.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        for k in self._kinds:
            c.activity_enable(k)
        return self

    def __exit__(self, *exc):
        c = self.cupti
        c.activity_flush_all(1)
        for k in self._kinds:
            try:
                c.activity_disable(k)
            except Exception:
                pass
        return False

    @contextlib.contextmanager
    def op(self, name, cls, **kw):
        info = OpInfo(len(self.ops) + 1, name, cls, **kw)
        self.ops.append(info)
        self.cupti.activity_push_external_correlation_id(self._ext_kind, info.op_id)
        try:
            yield info
        finally:
            self.cupti.activity_pop_external_correlation_id(self._ext_kind)

    def records(self):
        """(kernel records with op_id attached, op table) after the traced region."""
        ops = {o.op_id: o for o in self.ops}
        out = []
        for k in self.kernels + self.other:
            oid = self.ext.get(k["correlation_id"])
            o = ops.get(oid)
            out.append({**k, "op_id": oid, "op": o.name if o else None, "cls": o.cls if o else "untagged",
                        "layer": o.layer if o else None, "weight": o.weight if o else None,
                        "duration_ns": k["end"] - k["start"]})
        return sorted(out, key=lambda r: r["start"]), self.ops
