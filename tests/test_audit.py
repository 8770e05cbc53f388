"""The ptxas resource audit: finds every registry instantiation, discovers kernels in new files, flags spills and
local memory in main-path kernels. Compiles with nvcc -cubin on the CPU (marked nvcc: skipped without nvcc
unless LABKERNELS_REQUIRE_NVCC=1)."""
import json
import shutil
import subprocess
import sys

import pytest

from labkernels import audit as A
from labkernels import occupancy as O
from labkernels.kernels import registry
from labkernels.testing import require_tool

SPILL_SRC = r"""
// test-only: a kernel forced to spill (32 registers for 96 live values) and one with a runtime-indexed array
__global__ void __launch_bounds__(1024, 2) spill_regs(float* out, const float* in, int n) {
    float v[96];
#pragma unroll
    for (int i = 0; i < 96; ++i) v[i] = in[i * n + threadIdx.x];
    float s = 0.f;
#pragma unroll
    for (int j = 1; j < 6; ++j) {
#pragma unroll
        for (int i = 0; i < 96; ++i) s += v[i] * v[(i * j + 7) % 96];
    }
    out[threadIdx.x] = s;
}
__global__ void local_array(float* out, const int* idx, int n) {
    float buf[256];
    for (int i = 0; i < 256; ++i) buf[(i * 7 + idx[i]) & 255] = out[i * n];
    float s = 0.f;
    for (int i = 0; i < n; ++i) s += buf[idx[i] & 255];
    out[threadIdx.x] = s;
}
"""

NEW_SRC = r"""
// a kernel file no registry row knows about
__global__ void brand_new_plain(float* x, int n) { if (threadIdx.x < n) x[threadIdx.x] *= 2.f; }
extern "C" __global__ void brand_new_c(float* x) { __shared__ float s[64]; s[threadIdx.x & 63] = x[threadIdx.x];
                                                   __syncthreads(); x[threadIdx.x] = s[(threadIdx.x + 1) & 63]; }
template <int N> __global__ void brand_new_tpl(int* x) { x[threadIdx.x] += N; }
template __global__ void brand_new_tpl<3>(int*);
"""


def _spec(family, source, template, main_path=True, params=(), threads=256, smem="0"):
    return registry.KernelSpec(family=family, source=source, template=template, params=tuple(params),
                               threads=threads, smem_formula=smem, tile=(0, 0), main_path=main_path)


# ------------------------------------------------------------------------------------------------ no nvcc needed

PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z15q6k_expb_kernelILi4ELi210ELi0EEvPKvS1_Pfiii' for 'sm_90'
ptxas info    : Function properties for _Z15q6k_expb_kernelILi4ELi210ELi0EEvPKvS1_Pfiii
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 85 registers, used 1 barriers, 8192 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 20.1 ms
ptxas info    : Function properties for helper_device_fn
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'spill_c' for 'sm_90'
ptxas info    : Function properties for spill_c
    1088 bytes stack frame, 1084 bytes spill stores, 2452 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 1088 bytes cumulative stack size
"""


def test_parse_ptxas_log():
    e = A.parse_ptxas(PTXAS_LOG)
    assert [x["mangled"] for x in e] == ["_Z15q6k_expb_kernelILi4ELi210ELi0EEvPKvS1_Pfiii", "spill_c"]
    assert (e[0]["regs"], e[0]["static_smem"], e[0]["barriers"], e[0]["stack_frame"], e[0]["spill_stores"]) == \
        (85, 8192, 1, 0, 0)
    assert (e[1]["regs"], e[1]["stack_frame"], e[1]["spill_stores"], e[1]["spill_loads"]) == (32, 1088, 1084, 2452)
    assert all(x["arch"] == "sm_90" for x in e)


def test_demangle_and_matching():
    assert A.demangle(["_Z16mma_probe_kernelILi16EEvPii", "_Z15q6k_expb_kernelILi4ELi210ELi0EEvPKvS1_Pfiii",
                       "_Z1fILin3ELb1ELj7EEvv", "_Znot_a_name", "plain_c_kernel"]) == [
        "void mma_probe_kernel<16>(int*, int)", "void q6k_expb_kernel<4, 210, 0>(void const*, void const*, float*, int, "
        "int, int)", "void f<-3, true, 7u>()", "_Znot_a_name", "plain_c_kernel"]
    assert A._split_demangled(A.demangle(["_Z1fILin3ELb1ELj7EEvv"])[0]) == ("f", ("-3", "1", "7"))
    assert A._split_demangled("void q6k_expb_kernel<4, 210, 0>(void const*, float*)") == \
        ("q6k_expb_kernel", ("4", "210", "0"))
    assert A._split_demangled("void f<(char)3, true>(int)") == ("f", ("3", "1"))
    assert A._split_demangled("cplain") == ("cplain", None)
    k = _spec("q6k_expb", "q6k_expb.cu", "q6k_expb_kernel", params=(("KDR", 4), ("STRIDE", 210), ("EPI", 0)))
    assert A._spec_args(k) == ("4", "210", "0")
    assert A._spec_args(_spec("f", "f.cu", "f", params=(("B", True),))) == ("1",)


def test_wrapper_only_references_instantiations():
    specs = registry.family("mma_probe")
    w = A.wrapper_source(registry.KERNELS_DIR / "mma_probe.cu", specs)
    assert '#include "mma_probe.cu"' in w
    assert "(void)&mma_probe_kernel<16>;" in w and "(void)&mma_probe_kernel<32>;" in w
    assert "<cstdio>" not in w and "<stdio" not in w  # nothing host-only added to the kernel sources


def test_discovery_takes_registry_and_every_cu_file():
    groups = A.discover()
    on_disk = {p.name for p in registry.KERNELS_DIR.glob("*.cu")}
    assert set(groups) == on_disk
    avail = registry.available()
    assert sum(len(v) for v in groups.values()) == len(avail)
    assert {k.key for k in groups["mma_probe.cu"]} == {"mma_probe[K=16]", "mma_probe[K=32]"}


def test_check_logic_on_synthetic_rows():
    base = {"key": "x", "arch": "sm_90", "source": "x.cu", "main_path": True, "error": None,
            "spill_stores": 0, "spill_loads": 0, "stack_frame": 0}
    assert A.check([base]) == []
    assert A.check([dict(base, spill_stores=8)])
    assert A.check([dict(base, stack_frame=16)])
    assert A.check([dict(base, error="boom")])
    assert A.check([dict(base, error="boom", arch="sm_80")]) == []  # unsupported there: not a failure
    assert A.check([dict(base, spill_loads=4, main_path=False)]) == []
    with pytest.raises(A.AuditError, match="spills"):
        A.check([dict(base, spill_loads=4)], raise_on_failure=True)


# ------------------------------------------------------------------------------------------------ nvcc

@pytest.fixture(scope="module")
def probe_rows():
    require_tool("nvcc")
    return A.audit(registry.family("mma_probe"), archs=("sm_90",))


@pytest.mark.nvcc
def test_mma_probe_instantiations_audited(probe_rows):
    rows = {r["key"]: r for r in probe_rows}
    assert set(rows) == {"mma_probe[K=16]", "mma_probe[K=32]"}
    for r in rows.values():
        assert r["error"] is None and r["arch"] == "sm_90" and r["device"] == "h200"
        assert r["regs"] > 0
        assert (r["spill_stores"], r["spill_loads"], r["stack_frame"], r["static_smem"]) == (0, 0, 0, 0)
        assert r["dynamic_smem"] == 0 and r["threads"] == 256
        o = O.occupancy("h200", 256, r["regs"], 0)
        assert (r["blocks_per_sm"], r["limiter"]) == (o["blocks_per_sm"], o["limiter"])
        assert r["mangled"].startswith("_Z16mma_probe_kernelILi")
    # K=32 carries twice the A/B fragment registers of K=16
    assert rows["mma_probe[K=32]"]["regs"] >= rows["mma_probe[K=16]"]["regs"]


@pytest.mark.nvcc
def test_mma_probe_other_archs():
    require_tool("nvcc")
    rows = A.audit(registry.family("mma_probe"), archs=("sm_80", "sm_120"))
    assert {(r["key"], r["arch"]) for r in rows} == {(f"mma_probe[K={k}]", a) for k in (16, 32)
                                                     for a in ("sm_80", "sm_120")}
    for r in rows:
        assert r["error"] is None and r["regs"] > 0 and r["spill_stores"] == 0 and r["stack_frame"] == 0
        assert r["device"] == {"sm_80": "a100", "sm_120": "rtx5090"}[r["arch"]]


@pytest.mark.nvcc
def test_cache_hits_second_time(probe_rows):
    kdir = registry.KERNELS_DIR
    res = A.compile_source(kdir / "mma_probe.cu", registry.family("mma_probe"), "sm_90", kdir)
    assert res["ok"] and res["cached"]


@pytest.mark.nvcc
def test_discovers_kernels_in_a_new_file(tmp_path):
    require_tool("nvcc")
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    shutil.copy(registry.KERNELS_DIR / "mma_probe.cu", kdir)
    for h in registry.KERNELS_DIR.glob("*.cuh"):
        shutil.copy(h, kdir)
    (kdir / "brand_new.cu").write_text(NEW_SRC)
    rows = A.audit(archs=("sm_90",), kernels_dir=kdir)
    by_key = {r["key"]: r for r in rows}
    # registry entries whose source exists in this folder, and nothing of the absent sources
    assert {"mma_probe[K=16]", "mma_probe[K=32]"} <= set(by_key)
    assert not any(r["family"] in ("q6k_expb", "q4k_nb") for r in rows)
    new = {r["kernel"]: r for r in rows if r["source"] == "brand_new.cu"}
    assert set(new) == {"brand_new_plain", "brand_new_c", "brand_new_tpl<3>"}
    for r in new.values():
        assert not r["registered"] and not r["main_path"] and r["error"] is None and r["regs"] > 0
    assert new["brand_new_c"]["static_smem"] == 256
    assert A.check(rows) == []


@pytest.mark.nvcc
def test_check_flags_spills_and_local_memory(tmp_path):
    require_tool("nvcc")
    (tmp_path / "spill_test.cu").write_text(SPILL_SRC)
    specs = [_spec("spilltest", "spill_test.cu", "spill_regs", threads=1024),
             _spec("spilltest_local", "spill_test.cu", "local_array")]
    rows = A.audit(specs, archs=("sm_90",), kernels_dir=tmp_path)
    by = {r["kernel"]: r for r in rows}
    assert by["spill_regs"]["spill_stores"] > 0 and by["spill_regs"]["spill_loads"] > 0
    assert by["spill_regs"]["regs"] <= 32
    assert by["local_array"]["stack_frame"] >= 1024 and by["local_array"]["spill_stores"] == 0
    fails = A.check(rows)
    assert any(f.startswith("spilltest [sm_90]") and "spills" in f for f in fails), fails
    assert any(f.startswith("spilltest_local [sm_90]") and "stack frame" in f for f in fails), fails
    with pytest.raises(A.AuditError):
        A.check(rows, raise_on_failure=True)
    # the same kernels off the main path are reported, not failed
    off = [dict(r, main_path=False) for r in rows]
    assert A.check(off) == []


@pytest.mark.nvcc
def test_compile_error_is_a_main_path_failure(tmp_path):
    require_tool("nvcc")
    (tmp_path / "broken.cu").write_text("__global__ void broken_kernel(int* x) { x[0] = undefined_name; }\n")
    rows = A.audit([_spec("broken", "broken.cu", "broken_kernel")], archs=("sm_90",), kernels_dir=tmp_path)
    assert len(rows) == 1 and rows[0]["error"] and "undefined_name" in rows[0]["error"]
    assert A.check(rows) and "broken" in A.check(rows)[0]


@pytest.mark.nvcc
def test_main_path_kernels_have_no_spills_or_local_memory():
    """The CI gate: every registry instantiation whose source exists compiles for sm_90 with no spills and no
    stack frame if it is on the lab's main path."""
    require_tool("nvcc")
    rows = A.audit(archs=("sm_90",))
    keys = {r["key"] for r in rows}
    assert {k.key for k in registry.available()} <= keys
    assert A.check(rows) == []


@pytest.mark.nvcc
def test_cli_json():
    require_tool("nvcc")
    r = subprocess.run([sys.executable, "-m", "labkernels.audit", "--json", "--family", "mma_probe"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {x["key"] for x in out["rows"]} == {"mma_probe[K=16]", "mma_probe[K=32]"}
    assert out["failures"] == []
    r = subprocess.run([sys.executable, "-m", "labkernels.audit", "--family", "mma_probe"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "mma_probe[K=16]" in r.stdout and "blk/SM" in r.stdout


def test_register_cli_wires_a_subcommand():
    import argparse

    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command")
    A.register_cli(sub)
    args = ap.parse_args(["audit", "--json", "--arch", "sm_80", "--arch", "sm_90", "--check"])
    assert args.func is A.main and args.archs == ["sm_80", "sm_90"] and args.json and args.check

