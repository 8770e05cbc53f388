"""The CUPTI tracer's record handling on CPU, with stand-in activity records (cupti-python is GPU-side)."""
import enum
import types

from labkernels.trace import CuptiTracer, NullTracer


class Kind(enum.IntEnum):
    MEMCPY = 1
    KERNEL = 3
    CONCURRENT_KERNEL = 10
    EXTERNAL_CORRELATION = 36
    MEMSET = 2


def _tracer():
    tr = object.__new__(CuptiTracer)
    tr.cupti = types.SimpleNamespace(ActivityKind=Kind)
    tr.kernels, tr.other, tr.ext, tr.ops, tr.errors = [], [], {}, [], []
    return tr


def _kernel(name, corr, start, end):
    return types.SimpleNamespace(kind=int(Kind.CONCURRENT_KERNEL), name=name, start=start, end=end, correlation_id=corr,
                                 grid_x=4, grid_y=1, grid_z=1, block_x=256, block_y=1, block_z=1, stream_id=7)


def test_records_map_kernels_to_ops_and_survive_bad_records():
    from labkernels.trace import OpInfo

    tr = _tracer()
    tr.ops = [OpInfo(1, "ffn_down", "gemm_q6k", 3, "blk.3.ffn_down.weight", macs=10)]
    acts = [_kernel("q6k_expb_kernel", 11, 100, 250),
            types.SimpleNamespace(kind=int(Kind.EXTERNAL_CORRELATION), correlation_id=11, external_id=1),
            types.SimpleNamespace(kind=int(Kind.MEMCPY), start=300, end=310, correlation_id=12),  # int kind, as CUPTI gives
            types.SimpleNamespace(kind=int(Kind.CONCURRENT_KERNEL)),                              # malformed: skipped
            _kernel("cupy_copy", 13, 400, 405)]
    tr._buffer_completed(acts)
    assert len(tr.errors) == 1 and len(tr.kernels) == 2 and len(tr.other) == 1
    recs, ops = tr.records()
    by = {r["name"]: r for r in recs}
    assert by["q6k_expb_kernel"]["op"] == "ffn_down" and by["q6k_expb_kernel"]["layer"] == 3
    assert by["q6k_expb_kernel"]["duration_ns"] == 150
    assert by["cupy_copy"]["cls"] == "untagged" and by["memcpy"]["cls"] == "untagged"
    assert [r["start"] for r in recs] == sorted(r["start"] for r in recs)


def test_null_tracer_is_free():
    with NullTracer().op("x", "y") as info:
        assert info is None
