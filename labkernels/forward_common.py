"""What the prefill and the decode share, below both: CUDA graph capture support (:func:`graph_support`,
:class:`RawGraph`, :class:`GraphCaptureError`, :data:`GRAPH_RTOL`) and the argument check of the fused activation
kernel. Split from ``prefill.py`` (issue 42) so that the decode no longer imports the prefill; callers name this
module (``prefill`` no longer re-exports its names)."""

from __future__ import annotations

from . import errors, gpu


class GraphCaptureError(RuntimeError):
    """The forward could not be captured as a CUDA graph (or its replay disagreed with the eager forward)."""


#: graph replay vs the eager forward at capture: max |graph - eager| / max |eager| must not exceed this (the
#: kernels and pointers are the same, so it is 0 unless a library picks another algorithm under capture)
GRAPH_RTOL = 1e-4


def graph_support() -> str | None:
    """None when this CuPy can capture CUDA graphs (stream capture, private memory pools), else why not."""
    cp = gpu.cp()
    cuda = getattr(cp, "cuda", None)
    missing = [n for n in ("Stream", "MemoryPool", "using_allocator") if not hasattr(cuda, n)]
    if missing or not hasattr(getattr(cuda, "Stream", None), "begin_capture"):
        return f"this CuPy has no CUDA stream capture (missing: {', '.join(missing) or 'Stream.begin_capture'})"
    rt = getattr(cuda, "runtime", None)
    if getattr(rt, "is_hip", False) or getattr(rt, "_is_hip_environment", False):
        return "CUDA graph capture is not supported on HIP"
    return None


def _instantiate(graph):
    return RawGraph(graph)


class RawGraph:
    """A captured ``cudaGraph_t`` and its executable (instantiated here); :meth:`launch` replays it on a stream.
    Both are destroyed with this object (:meth:`close`)."""

    def __init__(self, graph: int):
        rt = gpu.cp().cuda.runtime
        ge = int(rt.graphInstantiate(int(graph)))   # first: a failure leaves the graph to the caller, not to __del__
        self.graph, self.exec = int(graph), ge

    def launch(self, stream) -> None:
        gpu.cp().cuda.runtime.graphLaunch(self.exec, stream.ptr)

    def close(self) -> None:
        rt = gpu.cp().cuda.runtime
        if getattr(self, "exec", 0):
            rt.graphExecDestroy(self.exec)
            self.exec = 0
        if getattr(self, "graph", 0):
            rt.graphDestroy(self.graph)
            self.graph = 0

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _c_contig(a) -> bool:
    return bool(a.flags.c_contiguous)


def check_act_mul_gu(gu, out, n_ff: int) -> None:
    """act_mul_gu's arguments: gu f32 [rows, 2 * n_ff] and out [rows, n_ff] (f32 or f16), C-contiguous."""
    if gu.ndim != 2 or str(gu.dtype) != "float32" or not _c_contig(gu) or gu.shape[1] != 2 * n_ff:
        raise errors.ShapeError(f"act_mul_gu: gu must be C-contiguous float32 [rows, {2 * n_ff}], got {gu.dtype} "
                                f"{tuple(gu.shape)}")
    if tuple(out.shape) != (gu.shape[0], n_ff) or str(out.dtype) not in ("float32", "float16") or not _c_contig(out):
        raise errors.ShapeError(f"act_mul_gu: out must be C-contiguous float32/float16 [{gu.shape[0]}, {n_ff}], got "
                                f"{out.dtype} {tuple(out.shape)}")
