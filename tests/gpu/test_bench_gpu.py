"""GPU tests of the timing harness (labkernels.bench): what the CUDA events bracket."""
import time

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.gpu_fast
def test_lead_keeps_the_host_path_out_of_the_timed_interval():
    """A call that spends 2 ms on the host before its one tiny kernel: timed right after the flush (no lead), the
    GPU waits for it inside the interval and the events read >= ~2 ms; behind a 5 ms lead they read the kernel
    only. The host times the harness records are the call's own (>= 2 ms each)."""
    cp = pytest.importorskip("cupy")
    from labkernels import bench

    a = cp.zeros(1024, cp.float32)

    def call():
        time.sleep(0.002)
        a.fill(1.0)

    flush = bench.Flusher()
    plain = np.median(bench.time_launches(call, warmup=1, repeats=5, flush=flush))
    host: list = []
    led = np.median(bench.time_launches(call, warmup=1, repeats=5, flush=flush, lead=bench.Lead(5000), host=host))
    assert plain > 1500, f"no lead: {plain:.0f} us (expected the host's 2 ms inside the interval)"
    # the fill kernel alone, plus what other processes sharing the GPU cost it (the suite runs 8-12 pytest-xdist
    # workers: 565 us seen on an H100) -- never the host's 2 ms
    assert led < min(1000, plain / 2), f"5 ms lead: {led:.0f} us against {plain:.0f} us without (expected the fill kernel alone)"
    assert len(host) == 5 and min(host) >= 2000
    assert bench.flush_us(flush, repeats=3) > 0


def test_clock_probe_reads_a_clock_the_gpu_can_have():
    """bench.ClockProbe alone and beside a launch that outlasts its window (a 300 us lead on the main stream): the
    clock64 cycles over the %globaltimer window give 0.3-2.5 GHz each time, so the probe ran its window and
    counted real cycles, whether the GPU was idle or busy."""
    pytest.importorskip("cupy")
    from labkernels import bench

    probe = bench.ClockProbe(12.0)
    lead = bench.Lead(300.0)
    for fn in (None, lead):
        mhz = probe.mhz(fn, repeats=5)
        assert len(mhz) == 5 and all(300.0 < m < 2500.0 for m in mhz), mhz
