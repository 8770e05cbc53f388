"""The errors of the GPU layer, below every launcher and the dispatch (issue 42): :class:`ShapeError` (an input a
launcher or a scheduling rule refuses), :class:`GpuError` (no GPU / CuPy, a failed build or launch) and
:class:`SharedMemoryError`. Split from ``gpu.py`` so that the scheduling rules (``wgmma_sched``) refuse a shape
without importing the launch layer."""

from __future__ import annotations


class GpuError(RuntimeError):
    pass


class ShapeError(ValueError):
    pass


class SharedMemoryError(GpuError):
    """A kernel configuration needs more shared memory per block than the device allows."""
