"""Benchmark harness: CUDA-event timings like the seeds measure.

* each timing: warm-up launches, then ``repeats`` launches each bracketed by CUDA events, the L2 flushed
  (a buffer of twice the L2 overwritten) before every timed launch so repeats do not measure the cache;
  reported as median with p20 / p80;
* A/B comparisons are *interleaved pairs* in one process (A, B, A, B, ...), each pair a ratio, so drift
  cannot fake a delta; the same variant timed against itself gives the noise floor;
* everything is normalized by work: us/GMAC and TOPS-equivalent (2*nt*od*id / s);
* every result row carries its shape and parameters; runs are recorded with provenance by
  :mod:`labkernels.records`.
"""

from __future__ import annotations


import numpy as np

from . import gpu, nvml, occupancy



def _cp():
    import cupy

    return cupy


class Flusher:
    """Overwrites a buffer twice the L2 size (so no operand survives in L2 between timed launches)."""

    def __init__(self):
        cp = _cp()
        self.buf = cp.empty(max(2 * gpu.device_props()["l2"], 64 << 20) // 4, dtype=cp.int32)
        self.i = 0

    def __call__(self):
        self.i += 1
        self.buf.fill(self.i)


class MemsetFlusher:
    """nvbench's cold-L2 flush as nvbench makes it (``l2flush``: ``cudaMemsetAsync`` of a buffer of the L2's size on
    the launch's stream): every L2 line left dirty, written back while the next launch runs. The nvbench cross-check
    (:mod:`labkernels.nvbench_check`) times the GEMV headline behind it too, so a difference between the two timers
    that is the flush's and not the timer's shows as such."""

    def __init__(self):
        self.n = int(gpu.device_props()["l2"])
        self.buf = _cp().empty(self.n, dtype=_cp().uint8)

    def __call__(self):
        cp = _cp()
        cp.cuda.runtime.memsetAsync(self.buf.data.ptr, 0, self.n, cp.cuda.get_current_stream().ptr)


class ReadFlusher:
    """Evicts the L2 by *reading* a buffer twice its size (a sum into a scalar): the next launch starts with no operand
    in L2 and no dirty lines to write back. :class:`Flusher` overwrites its buffer, leaving the L2 full of dirty
    lines that a memory-bound launch then competes with (measured on an H100, gemv_kq q4_K 4096x14336 nt=1: 31.0 us
    after the write flush, 27.1 us after this one, device calls 20-21 of 2026-12-06)."""

    def __init__(self):
        cp = _cp()
        self.buf = cp.ones(max(2 * gpu.device_props()["l2"], 64 << 20) // 4, dtype=cp.float32)
        self.out = cp.empty((), dtype=cp.float32)

    def __call__(self):
        _cp().sum(self.buf, out=self.out)


def _positive_us(us, what: str) -> float:
    """``us`` as a float, or a ValueError naming ``what`` when it is not a finite positive number of microseconds."""
    if not (us > 0 and np.isfinite(us)):
        raise ValueError(f"{what} is a positive number of microseconds, not {us!r}")
    return float(us)


class Lead:
    """A one-thread GPU wait of ``us`` microseconds, queued after the flush and before the start event, so that the
    host's enqueue time of the timed call (argument checks, launch setup, the driver call) passes while the GPU is
    busy: the events then bracket device work only. Without it, a call whose host path outlasts the flush leaves
    the GPU idle between the start event and its first kernel, and that idle time is timed as the call's."""

    SOURCE = r"""extern "C" __global__ void lk_lead(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}"""

    def __init__(self, us: float = 500.0):
        self.us = _positive_us(us, "a lead")
        cp = _cp()
        self._k = cp.RawKernel(self.SOURCE, "lk_lead")
        self._ns = np.uint64(round(self.us * 1e3))

    def __call__(self):
        self._k((1,), (1,), (self._ns,))


class EmptyLaunch:
    """The event timing's own floor: one launch of an empty kernel (``grid`` CTAs of ``threads`` threads, no shared
    memory), timed as any call is. What a timed launch costs before its kernel does anything: the events, the
    launch and the CTAs' start and exit."""

    SOURCE = r"""extern "C" __global__ void lk_empty() {}"""

    def __init__(self, grid: int = 1, threads: int = 32):
        if not (isinstance(grid, (int, np.integer)) and isinstance(threads, (int, np.integer))
                and grid >= 1 and 1 <= threads <= 1024):
            raise ValueError(f"an empty launch takes grid >= 1 CTAs of 1..1024 threads, not {grid!r} x {threads!r}")
        self.grid, self.threads = int(grid), int(threads)
        self._k = _cp().RawKernel(self.SOURCE, "lk_empty")

    def __call__(self):
        self._k((self.grid,), (self.threads,), ())


class ClockProbe:
    """The SM clock while a launch runs: a one-thread kernel on a second stream, started with the launch (both wait
    for the same flush), spins ``window_us`` of %globaltimer and counts clock64 cycles over it. All SMs share one
    clock, so the probe's SM tells the launch's. It takes one warp slot on one SM beside the launch's CTAs (the
    launch is not held back by it: the probe ends on its own). The window must lie inside the launch: time launches
    a few windows long (labkernels.rounds.r07_wgmma.limits.clock_ab: 12 us against nt=512 launches of >= 27 us), or idle time is mixed in."""

    SOURCE = r"""extern "C" __global__ void lk_clock_probe(unsigned long long* out, unsigned long long ns) {
    unsigned long long t0, t, c0, c;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    c0 = clock64();
    do { __nanosleep(100); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    c = clock64();
    out[0] = t - t0;
    out[1] = c - c0;
}"""

    def __init__(self, window_us: float = 12.0):
        self.window_us = _positive_us(window_us, "a clock probe's window")
        cp = _cp()
        self._k = cp.RawKernel(self.SOURCE, "lk_clock_probe")
        self._ns = np.uint64(round(self.window_us * 1e3))
        self._out = cp.zeros(2, dtype=cp.uint64)
        self._stream = cp.cuda.Stream(non_blocking=True)

    def mhz(self, fn, flush: Flusher | None = None, repeats: int = 10, warmup: int = 2) -> list[float]:
        """The SM clock (MHz) over the probe's window in each of ``repeats`` launches of ``fn`` after ``flush``;
        ``fn`` None: the probe alone (the idle clock)."""
        cp = _cp()
        main = cp.cuda.get_current_stream()
        for _ in range(warmup):
            if fn is not None:
                fn()
        main.synchronize()
        out = []
        for _ in range(repeats):
            if flush:
                flush()
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(main)
            self._stream.wait_event(ev)
            with self._stream:
                self._k((1,), (1,), (self._out, self._ns))
            if fn is not None:
                fn()
            main.synchronize()
            self._stream.synchronize()
            ns, cyc = (int(v) for v in cp.asnumpy(self._out))
            out.append(cyc / ns * 1e3)
        return out


def time_launches(fn, warmup: int = 3, repeats: int = 20, flush: Flusher | None = None, lead: Lead | None = None,
                  host: list | None = None) -> np.ndarray:
    """Per-launch device times in microseconds: each launch between two CUDA events, after ``flush`` (when given)
    and then ``lead`` (when given: :class:`Lead`). ``host``: a list that gets each timed call's host time (us, from
    its first line to its return: what it takes to enqueue, not to run)."""
    import time

    cp = _cp()
    for _ in range(warmup):
        fn()
    cp.cuda.get_current_stream().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    out = np.empty(repeats)
    for r in range(repeats):
        if flush:
            flush()
        if lead:
            lead()
        start.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        end.record()
        end.synchronize()
        out[r] = cp.cuda.get_elapsed_time(start, end) * 1e3
        if host is not None:
            host.append((t1 - t0) * 1e6)
    return out


def stats(us: np.ndarray) -> dict:
    return {"median_us": float(np.median(us)), "p20_us": float(np.percentile(us, 20)),
            "p80_us": float(np.percentile(us, 80)), "n": int(us.size)}


def work(nt: int, od: int, id_: int, us: float) -> dict:
    gmac = nt * od * id_ / 1e9
    return {"gmac": gmac, "us_per_gmac": us / gmac, "tops_eq": 2 * gmac * 1e9 / (us * 1e-6) / 1e12}


def pair_rows(res: dict, key: dict, nt: int, od: int, id_: int, params: dict | None = None,
              tail: dict | None = None) -> list[dict]:
    """One row per (variant, interleaved round) of :func:`interleaved`'s result: the point's ``key`` columns,
    variant, pair, ``params``, the timing stats, the work-normalized figures, then ``tail``."""
    return [{**key, "variant": name, "pair": p, **(params or {}), **s, **work(nt, od, id_, s["median_us"]),
             **(tail or {})} for name, per in res.items() for p, s in enumerate(per)]


def interleaved(variants: dict, pairs: int = 3, repeats: int = 20, warmup: int = 3, flush=None,
                leads: dict | None = None) -> dict:
    """Time every variant once per round, ``pairs`` rounds, in order A, B, C, A, B, C, ...

    ``leads``: {name: :class:`Lead` or None} for the variants timed behind a lead (see :func:`time_launches`); with
    it each round's stats also hold ``host_us``, the median host time of the timed calls.
    Where NVML can be read, each round's stats also hold ``nvml``: the GPU's SM clock, power, temperature and
    clocks-event reasons before and after the round (:class:`labkernels.nvml.RoundReadings`, read outside the timed
    launches, while a reading costs < 1% of a round).
    Returns {name: [stats per round]}; ratios are formed per round by the caller."""
    import time

    res = {k: [] for k in variants}
    gpu = nvml.RoundReadings()
    for _ in range(pairs):
        gpu.before()
        t0 = time.perf_counter()
        for name, fn in variants.items():
            if leads is None:
                res[name].append(stats(time_launches(fn, warmup, repeats, flush)))
                continue
            host: list = []
            s = stats(time_launches(fn, warmup, repeats, flush, leads.get(name), host))
            res[name].append({**s, "host_us": float(np.median(host))})
        text = gpu.after(time.perf_counter() - t0)
        if text is not None:
            for per in res.values():
                per[-1]["nvml"] = text
    return res


def flush_us(flush: Flusher, repeats: int = 10) -> float:
    """The flush's own device time (us, median): how long a timed call's host path may take, with no lead, before
    the GPU waits for it."""
    return float(np.median(time_launches(flush, warmup=2, repeats=repeats)))


def mma_ceiling(k: int = 16, blocks_per_sm: int = 4, iters: int = 4096) -> dict:
    """TOPS of the register-fed mma.sync probe (the physical int8 tensor-core line)."""
    cp = _cp()
    kern = gpu.kernel("mma_probe", K=k)
    chains = 8
    grid = gpu.device_props()["sm_count"] * blocks_per_sm
    out = cp.empty(grid * 256, dtype=cp.int32)
    fn = lambda: kern.launch((grid,), (out, np.int32(iters)))
    us = time_launches(fn, warmup=2, repeats=10)
    ops = grid * 8 * iters * chains * 2 * 16 * 8 * k
    s = stats(us)
    return {"k": k, "tops": ops / (s["median_us"] * 1e-6) / 1e12, **s}


def pair_ratios(rows, a: str, b: str) -> list[dict]:
    """Per-pair speed ratio time(a)/time(b) at matched shapes (> 1 means b is faster)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    out = []
    for (od, id_, nt), grp in df.groupby(["od", "id", "nt"]):
        ta = grp[grp.variant == a].set_index("pair").median_us
        tb = grp[grp.variant == b].set_index("pair").median_us
        for p in sorted(set(ta.index) & set(tb.index)):
            out.append({"od": od, "id": id_, "nt": nt, "a": a, "b": b, "pair": p, "ratio": ta[p] / tb[p]})
    return out


# ------------------------------------------------------------------ kernel resources


def kernel_row(family: str, **params) -> dict:
    """Resources of one instantiation: registers/local memory (CUDA attributes), smem, blocks/SM from the
    CUDA occupancy API and from labkernels' calculator (h200 profile)."""
    k = gpu.kernel(family, **params)
    calc = occupancy.occupancy("h200", k.spec.threads, k.regs, k.smem + k.static_smem)
    return {"kernel": k.spec.key, "regs": k.regs, "local_bytes": k.local_bytes, "dynamic_smem": k.smem,
            "api_blocks_per_sm": k.occupancy_api(), "calc_blocks_per_sm": calc["blocks_per_sm"],
            "calc_limiter": calc["limiter"], "occupancy": calc["occupancy"]}
