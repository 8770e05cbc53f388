"""Issue 18, programmatic dependent launch: which kernel sources may launch programmatically (every kernel begins
with LK_PDL_ENTRY, and the entry compiles to griddepcontrol on sm_90 and to nothing below), the driver-API parameter
packing, the context switch, and the replay analysis that must not count overlapping launches twice."""
import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labkernels import audit as A
from labkernels.rounds.r05_wall import decompose as D
from labkernels import errors, gpu
from labkernels.kernels import registry
from labkernels.testing import require_tool


def test_the_forward_sources_are_pdl_capable_and_others_are_not():
    src = gpu.pdl_sources()
    assert {"prefill.cu", "wgmma_kq.cu"} <= src
    # the int8 GEMMs and the prepass do not begin with the entry: they always launch normally
    assert not ({"q4k_nb.cu", "q6k_expb.cu", "prepass.cu"} & src)
    for name in ("prefill.cu", "wgmma_kq.cu"):
        n, ok = gpu.pdl_entry_report((registry.KERNELS_DIR / name).read_text())
        assert n == ok and n >= 2, (name, n, ok)


def test_a_kernel_without_the_entry_disqualifies_its_source(tmp_path):
    good = "__global__ void a(int* x) {\n    LK_PDL_ENTRY();\n    x[0] = 1;\n}\n"
    late = "__global__ void __launch_bounds__(256) b(int* x) {\n    x[0] = 2;\n    LK_PDL_ENTRY();\n}\n"
    commented = "// __global__ void c() {}\n/* __global__ void d() { } */\n"
    assert gpu.pdl_entry_report(good) == (1, 1)
    assert gpu.pdl_entry_report(good + late) == (2, 1)          # the entry must come first, not anywhere
    assert gpu.pdl_entry_report(good + commented) == (1, 1)     # comments are no kernels
    (tmp_path / "ok.cu").write_text(good)
    (tmp_path / "bad.cu").write_text(good + late)
    (tmp_path / "none.cu").write_text("// no kernels\n")
    assert gpu.pdl_sources(str(tmp_path)) == frozenset({"ok.cu"})


def _ptx(source: str, arch: str) -> str:
    nvcc = require_tool("nvcc")
    kdir = registry.KERNELS_DIR
    specs = [k for k in registry.KERNELS if k.source == source]
    with tempfile.TemporaryDirectory() as td:
        w = Path(td) / "w.cu"
        w.write_text(A.wrapper_source(kdir / source, specs))
        out = Path(td) / "w.ptx"
        r = subprocess.run([nvcc, "-ptx", "-std=c++17", f"-arch={arch}", f"-I{kdir}", *registry.cuda_defines(),
                            "-o", str(out), str(w)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        return out.read_text()


@pytest.mark.nvcc
def test_every_prefill_kernel_waits_first_on_sm90_and_not_below():
    ptx = _ptx("prefill.cu", "sm_90")
    entries = ptx.count(".entry ")
    assert entries == len([k for k in registry.KERNELS if k.source == "prefill.cu"]) > 5
    assert ptx.count("griddepcontrol.wait") == entries
    assert ptx.count("griddepcontrol.launch_dependents") == entries
    old = _ptx("prefill.cu", "sm_80")          # no griddepcontrol before Hopper: the entry is empty there
    assert old.count(".entry ") == entries and "griddepcontrol" not in old


def test_kernel_params_pack_what_cupy_would_pass():
    class Arr:                                    # a device array as the launcher sees one: .data.ptr
        class data:
            ptr = 0x7F0012345600

    holders, params = gpu.kernel_params((Arr(), np.int32(-7), np.float32(1.5), np.int64(2**40), np.uint32(3)),
                                        prefix=(b"\x01" * 128,))
    assert params.dtype == np.uintp and len(params) == 6
    assert ctypes.string_at(int(params[0]), 128) == b"\x01" * 128
    assert ctypes.c_uint64.from_address(int(params[1])).value == 0x7F0012345600
    assert ctypes.c_int32.from_address(int(params[2])).value == -7
    assert ctypes.c_float.from_address(int(params[3])).value == 1.5
    assert ctypes.c_int64.from_address(int(params[4])).value == 2**40
    assert ctypes.c_uint32.from_address(int(params[5])).value == 3
    with pytest.raises(errors.GpuError, match="numpy scalars"):
        gpu.kernel_params((5,))                   # a Python int: its width would be a guess
    with pytest.raises(errors.GpuError, match="float16"):
        gpu.kernel_params((np.float16(1),))


def test_programmatic_launches_is_scoped():
    assert not gpu.pdl_active()
    with gpu.programmatic_launches():
        assert gpu.pdl_active()
        with gpu.programmatic_launches(False):
            assert not gpu.pdl_active()
        assert gpu.pdl_active()
    assert not gpu.pdl_active()
    with pytest.raises(KeyError):
        with gpu.programmatic_launches():
            raise KeyError("inside")
    assert not gpu.pdl_active()


def test_pdl_is_an_option_of_the_captured_forward():
    from labkernels.prefill import PrefillOptions

    a, b = PrefillOptions(), PrefillOptions(pdl=False)
    assert a.pdl and a.key() != b.key()           # on by default (20261201T20); two graphs, one per setting


def _rec(name, start, dur):
    return {"name": name, "start": start, "duration_ns": dur}


def test_busy_is_the_union_of_the_launch_intervals():
    serial = [_rec("a", 0, 100), _rec("b", 150, 50), _rec("c", 300, 10)]
    assert D.busy_union_ns(serial) == 160 == sum(r["duration_ns"] for r in serial)
    # b begins (waiting in griddepcontrol.wait) while a still runs: the overlap counts once
    overlap = [_rec("a", 0, 100), _rec("b", 60, 90), _rec("c", 200, 10), _rec("d", 205, 2)]
    assert D.busy_union_ns(overlap) == 150 + 10
    assert D.busy_union_ns([]) == 0


def test_replay_gaps_and_their_summary():
    recs = [_rec("_Z14rmsnorm_kernelILi1ELi0EEvPKfS1_Pvif", 0, 100), _rec("memset", 1100, 10),
            _rec("sm80_xmma_gemm_f32f32", 2110, 500), _rec("_Z15wgmma_kq_kernelILi4E", 2500, 400),
            _rec("_Z14rmsnorm_kernelILi1ELi0EEvPKfS1_Pvif", 3900, 50)]
    g = pd.DataFrame(D.replay_gaps(recs[::-1]))      # sorted by start whatever the record order
    assert list(g.i) == [0, 1, 2, 3, 4] and np.isnan(g.gap_before_us[0])
    assert list(g.gap_before_us[1:]) == pytest.approx([1.0, 1.0, -0.11, 1.0])
    assert g.prev[3].startswith("sm80_xmma") and g.start_us.iloc[-1] == pytest.approx(3.9)
    s = D.gap_summary(g.assign(model="m", nt=8, variant="v")).set_index("transition")
    assert s.loc["lab -> memset"].idle_us == pytest.approx(1.0)
    assert s.loc["cublas -> lab_wgmma"].idle_us == 0.0          # an overlap is no idle time
    assert s.loc["cublas -> lab_wgmma"].median_gap_us == pytest.approx(-0.11)
    assert s.boundaries.sum() == 4 and s.idle_us.sum() == pytest.approx(3.0)
    assert D.kernel_kind("cudnn_generated_fort_native_sdpa_sm90") == "cudnn"
    assert D.kernel_kind("cupy_copy__float32_float32") == "cupy"


def test_the_graph_rewrites_are_options_of_the_captured_forward():
    from labkernels.prefill import PrefillOptions

    a = PrefillOptions()
    assert a.memsets_as_kernels and a.ids_from_host              # on by default (20261201T20)
    keys = {a.key(), PrefillOptions(memsets_as_kernels=False).key(), PrefillOptions(ids_from_host=False).key()}
    assert len(keys) == 3


def test_fill_launch_is_the_memset_node():
    from types import SimpleNamespace as NS

    from labkernels import graph_nodes as G

    f = G.fill_launch(NS(dst=0x7000, value=0xABCD1234, elementSize=4, width=10, height=1, pitch=0))
    assert f["ES"] == 4 and f["grid"] == 1 and f["bytes"] == 40
    dst, val, width, height, pitch = f["args"]
    assert (int(dst), int(val), int(width), int(height), int(pitch)) == (0x7000, 0xABCD1234, 10, 1, 40)
    assert [a.dtype for a in f["args"]] == [np.uint64, np.uint32, np.uint64, np.uint64, np.uint64]
    f = G.fill_launch(NS(dst=1, value=7, elementSize=1, width=1000, height=300, pitch=1024))
    assert f["grid"] == 1024 and int(f["args"][4]) == 1024 and f["bytes"] == 300_000   # a 2-D memset keeps its pitch
    with pytest.raises(G.CaptureError, match="8-byte"):
        G.fill_launch(NS(dst=1, value=0, elementSize=8, width=1, height=1, pitch=0))


@pytest.mark.nvcc
def test_fill_kernel_is_registered_for_each_element_size():
    ptx = _ptx("prefill.cu", "sm_90")
    assert sum(1 for k in registry.KERNELS if k.family == "fill") == 3
    for es in (1, 2, 4):
        assert f"_Z11fill_kernelILi{es}EEvPhjyyy" in ptx
