"""The tile skeleton (issue 14) is a refactor of the int8 GEMM sources: their machine code must be what it was
before it (commit eef6c5d), instantiation by instantiation, so that round 3 and 4's recorded numbers stand."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from labkernels import audit
from labkernels.kernels import registry
from labkernels.rounds.r07_wgmma import builds as wb

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "eef6c5d"            # the last commit before the tile skeleton
FAMILIES = ["q6k_expb", "q4k_nb", "q6k_generic", "dequant_f16", "prepass_q8_1"]


def _need_nvcc():
    if audit.nvcc_path() is None:
        if os.environ.get("LABKERNELS_REQUIRE_NVCC") == "1":
            pytest.fail("nvcc required (LABKERNELS_REQUIRE_NVCC=1) but not on PATH")
        pytest.skip("nvcc not on PATH")


def test_demangled_names_select_one_instantiation():
    k = registry.find("q6k_expb", KDR=4, STRIDE=224, EPI=1, OCC=1)
    assert audit._demangled_matches("_Z15q6k_expb_kernelILi4ELi224ELi1ELi1EEvPKhS1_PKjPfiii", k)
    assert not audit._demangled_matches("_Z15q6k_expb_kernelILi4ELi224ELi1ELi2EEvPKhS1_PKjPfiii", k)
    assert not audit._demangled_matches("_Z15q6k_expb_kernelILi4ELi210ELi1ELi1EEvPKhS1_PKjPfiii", k)
    qk = registry.find("rmsnorm_qk")
    assert audit._demangled_matches("_Z17rmsnorm_qk_kernelPKfS0_S0_S0_PfS1_iiiiif", qk)


def test_elf_text_sections_refuse_what_is_not_a_cubin():
    with pytest.raises(audit.AuditError, match="ELF64"):
        audit.elf_text_sections(b"not an elf")


def test_a_changed_source_changes_its_machine_code(tmp_path):
    """The comparison can fail: one changed constant in a copy of dequant.cu is seen, the other sources are not."""
    _need_nvcc()
    for f in registry.KERNELS_DIR.glob("*.cu*"):
        (tmp_path / f.name).write_text(f.read_text())
    src = tmp_path / "dequant.cu"
    text = src.read_text()
    assert "- 32;" in text
    src.write_text(text.replace("- 32;", "- 31;", 1))
    rows = audit.text_ab(registry.KERNELS_DIR, tmp_path, ["dequant_f16", "prepass_q8_1"])
    same = {r["kernel"]: r["same"] for r in rows}
    assert not same["dequant_f16[QT=6,STRIDE=0]"] and same["dequant_f16[QT=4,STRIDE=0]"]
    assert all(v for k, v in same.items() if k.startswith("prepass"))


def test_tile_skeleton_keeps_the_machine_code_of_every_instantiation(tmp_path):
    _need_nvcc()
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{BEFORE}^{{commit}}"], capture_output=True)
    if r.returncode:
        pytest.skip(f"commit {BEFORE} not in this clone (shallow?)")
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "labkernels/kernels"], capture_output=True,
                          check=True).stdout
    subprocess.run(["tar", "-x", "--strip-components=2", "-C", str(tmp_path)], input=arch, check=True)
    rows = audit.text_ab(tmp_path, registry.KERNELS_DIR, FAMILIES)
    assert len(rows) == sum(len(registry.family(f)) for f in FAMILIES) == 43
    moved = [r["kernel"] for r in rows if not r["same"]]
    assert not moved, f"machine code differs from {BEFORE}: {moved}"


#: the last commit before round 7's production kernel lost its exploratory forms (issue 42): every build it made
WGMMA_BEFORE = "4a8dcd9"
#: builds compared: the production one, a policy ablation (both bodies' hooks), the KPAIR form with its ablation
WGMMA_BUILDS = {"plain": (), "noconv": ("LK_ABLATE_NOCONV",),
                "fin_halfy": ("LK_ABLATE_HALFY", "LK_EXP_KPAIR", "LK_EXP_KPAIR_FIN")}


@pytest.mark.parametrize("build", list(WGMMA_BUILDS))
def test_wgmma_split_keeps_the_machine_code_of_every_instantiation(tmp_path, build):
    """Round 7's production kernel with no experiment forms (its builds by policy; the KPAIR body and the forms in
    the round's own source): every registered instantiation's machine code is what the one source with every
    #ifdef form built at 4a8dcd9 -- the production build and the exploratory builds alike, each by its -D names."""

    _need_nvcc()
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{WGMMA_BEFORE}^{{commit}}"], capture_output=True)
    if r.returncode:
        pytest.skip(f"commit {WGMMA_BEFORE} not in this clone (shallow?)")
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", WGMMA_BEFORE, "labkernels/kernels"], capture_output=True,
                          check=True).stdout
    subprocess.run(["tar", "-x", "--strip-components=2", "-C", str(tmp_path)], input=arch, check=True)
    defines = WGMMA_BUILDS[build]
    rows = audit.text_ab(tmp_path, registry.KERNELS_DIR, ["wgmma_kq", "wgmma_kqs"], "sm_90a",
                         new_source=wb.EXPERIMENTS["wgmma_kq.cu"] if defines else None,
                         flags=wb.build_flags(wb.check_defines(defines)))
    assert len(rows) == len(registry.family("wgmma_kq")) + len(registry.family("wgmma_kqs")) == 51
    moved = [r["kernel"] for r in rows if not r["same"]]
    assert not moved, f"machine code differs from {WGMMA_BEFORE}: {moved}"


#: the last commit with gemv_kq's PIPE template parameter (round 9 step 3's ring, retired)
GEMV_PIPE_HOLDER = "a1cf954"


def _gemv_kq_text(kdir: Path, exprs: dict, arch: str, tmp: Path) -> dict:
    """{key: the .text bytes of its instantiation} of gemv_kq.cu in ``kdir``, one wrapper over ``exprs`` ({key:
    (name expression, a spec-like object whose template and params select its mangled name)})."""
    w = tmp / "gemv_kq__text.cu"
    w.write_text('#include "gemv_kq.cu"\nvoid __lk_refs() {\n'
                 + "".join(f"    (void)&{e};\n" for e, _ in exprs.values()) + "}\n")
    cub = tmp / "k.cubin"
    subprocess.run([audit.nvcc_path(), "-cubin", "-std=c++17", audit.arch_flag(arch), f"-I{kdir}",
                    *registry.cuda_defines(), "-o", str(cub), str(w)], check=True, capture_output=True, cwd=tmp)
    text = audit.elf_text_sections(cub.read_bytes())
    out = {}
    for key, (_, k) in exprs.items():
        sym = [n for n in text if audit._demangled_matches(n, k)]
        assert len(sym) == 1, (key, sym)
        out[key] = text[sym[0]]
    return out


def _kernels_at(commit: str, tmp_path: Path) -> Path:
    """labkernels/kernels as commit ``commit`` had them, extracted under ``tmp_path/old`` (skips where this clone lacks
    the commit: a shallow clone)."""
    _need_nvcc()
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if r.returncode:
        pytest.skip(f"commit {commit} not in this clone (shallow?)")
    old = tmp_path / "old"
    old.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "labkernels/kernels"],
                         capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "--strip-components=2", "-C", str(old)], input=tar, check=True)
    return old


def _as_built_with(k, extra: tuple = ()):
    """Registry spec ``k`` as an older source instantiated it, with ``extra`` template parameters appended (a1cf954's
    PIPE=0, 7894b07's PF=0; none for 90fd260, before PF came and after it left): an object with its template, params,
    key and name expression."""
    import types

    params = (*k.params, *extra)
    return types.SimpleNamespace(template=k.template, params=params, key=k.key,
                                 name_expression=f"{k.template}<{','.join(str(v) for _, v in params)}>")


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_gemv_pipe_retirement_keeps_the_machine_code_of_every_instantiation(tmp_path, arch):
    """gemv_kq without its PIPE template parameter (round 9 step 3's ring, retired): every registered instantiation
    compiles to the machine code of its PIPE=0 instantiation at a1cf954, byte for byte (the kernel's name, mangled
    with one template argument fewer, aside) -- the forms that existed then (FORM 0 / 1); the later form 3 is compared
    with 90fd260 and 7894b07 below."""
    old = _kernels_at(GEMV_PIPE_HOLDER, tmp_path)
    specs = [k for k in registry.family("gemv_kq") if k.p["FORM"] < 2]      # FORM=3 (step 6) came after a1cf954
    assert len(specs) == 20 and all(n != "PIPE" for n, _ in specs[0].params)
    new = _gemv_kq_text(registry.KERNELS_DIR, {k.key: (k.name_expression, k) for k in specs}, arch, tmp_path)
    olds = {k.key: (o.name_expression, o) for k in specs for o in [_as_built_with(k, (("PIPE", 0),))]}
    was = _gemv_kq_text(old, olds, arch, tmp_path)
    moved = [k for k in new if new[k] != was[k]]
    assert not moved, f"machine code differs from {GEMV_PIPE_HOLDER}'s PIPE=0: {moved}"
    assert len({bytes(v) for v in new.values()}) == len(new)      # 20 distinct kernels: the comparison can tell


#: the last commit with gemv_kq's FORM=2 (round 9 step 5's register double buffer, retired) and gpu-check gemv_step5
GEMV_FORM2_HOLDER = "90fd260"


def _kernel_sections(blob: bytes, k) -> dict:
    """{section kind: (type, flags, link, info, alignment, entry size, size, bytes)} of one kernel's sections in a
    cubin (``.text.<name>``, ``.nv.info.<name>``, ``.nv.constant0.<name>``, ``.nv.shared.<name>``, ...: every section
    whose name ends with its mangled name), the kernel ``k``'s (a registry spec) by its template arguments."""
    import struct

    e_shoff, = struct.unpack_from("<Q", blob, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    hdr = [struct.unpack_from("<IIQQQQIIQQ", blob, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    names = blob[hdr[e_shstrndx][4]:hdr[e_shstrndx][4] + hdr[e_shstrndx][5]]
    sym = [n for n in audit.elf_text_sections(blob) if audit._demangled_matches(n, k)]
    assert len(sym) == 1, (k.key, sym)
    out = {}
    for n, typ, flags, _addr, off, size, link, info, align, entsize in hdr:
        name = names[n:names.index(b"\0", n)].decode()
        if name.endswith("." + sym[0]):
            data = b"" if typ == 8 else bytes(blob[off:off + size])        # SHT_NOBITS: no bytes in the file
            out[name[:-len(sym[0]) - 1]] = (typ, flags, link, info, align, entsize, size, data)
    assert ".text" in out and ".nv.info" in out, (k.key, sorted(out))
    return out


def _gemv_cubin(kdir: Path, tmp: Path, ks, arch: str, source: str = "gemv_kq.cu") -> bytes:
    """One cubin of ``source`` (gemv_kq.cu) in ``kdir`` holding the instantiations ``ks`` (objects with a name
    expression)."""
    tmp.mkdir()
    w = tmp / f"{Path(source).stem}__sections.cu"
    w.write_text(f'#include "{source}"\nvoid __lk_refs() {{\n'
                 + "".join(f"    (void)&{k.name_expression};\n" for k in ks) + "}\n")
    cub = tmp / "k.cubin"
    subprocess.run([audit.nvcc_path(), "-cubin", "-std=c++17", audit.arch_flag(arch), f"-I{kdir}",
                    *registry.cuda_defines(), "-o", str(cub), str(w)], check=True, capture_output=True, cwd=tmp)
    return cub.read_bytes()


def _sections_moved(old: Path, olds: dict, arch: str, tmp_path: Path, kdir: Path = registry.KERNELS_DIR) -> dict:
    """{key: the section kinds that differ} between every registered gemv_kq instantiation built from ``kdir`` and its
    twin ``olds[key]`` built from ``old`` (one cubin each); asserts the new build's kernels are distinct (so the
    comparison can tell them apart)."""
    specs = registry.family("gemv_kq")
    new = _gemv_cubin(kdir, tmp_path / "n", specs, arch)
    was = _gemv_cubin(old, tmp_path / "o", [olds[k.key] for k in specs], arch)
    moved = {}
    for k in specs:
        a, b = _kernel_sections(new, k), _kernel_sections(was, olds[k.key])
        if a != b:
            moved[k.key] = sorted(x for x in set(a) | set(b) if a.get(x) != b.get(x))
    texts = [_kernel_sections(new, k)[".text"][-1] for k in specs]
    assert len(set(texts)) == len(specs)         # distinct kernels: the comparison can tell them apart
    return moved


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_gemv_form2_retirement_keeps_the_machine_code_of_every_instantiation(tmp_path, arch):
    """gemv_kq without FORM=2 (round 9 step 5's register double buffer, retired; FORM=3 keeps its loop): every
    registered instantiation -- FORM 0 / 1 / 3, 24 of them (step 7's FORM=4 / 5 left since) -- compiles to the machine
    code of the same instantiation at 90fd260 (the last commit with FORM=2, before PF came), section by section:
    .text, .nv.info, .nv.constant0, .nv.shared and the sections' type, flags, link and info (registers, symbol), byte
    for byte."""
    old = _kernels_at(GEMV_FORM2_HOLDER, tmp_path)
    specs = registry.family("gemv_kq")
    assert len(specs) == 24 and {k.p["FORM"] for k in specs} == {0, 1, 3}
    moved = _sections_moved(old, {k.key: _as_built_with(k) for k in specs}, arch, tmp_path)
    assert not moved, f"machine code differs from {GEMV_FORM2_HOLDER}'s: {moved}"


#: the last commit with gemv_kq's FORM=4 / 5 (round 9 step 7) and its PF template parameter (step 8's L2 prefetch
#: before the PDL wait), gpu-check gemv_step7 and gemv_step8
GEMV_F45_PF_HOLDER = "7894b07"


@pytest.mark.parametrize("arch", ["sm_90a", "sm_90", "sm_80"])
def test_gemv_f45_pf_retirement_keeps_the_machine_code_of_every_instantiation(tmp_path, arch):
    """gemv_kq without FORM=4 / 5 (round 9 step 7's register caps) and without its PF template parameter (step 8's L2
    prefetch before the PDL wait), both retired: every registered instantiation -- FORM 0 / 1 / 3, 24 of them --
    compiles to the machine code of its PF=0 instantiation at 7894b07 (the last commit with them), section by section
    as above (the kernel's name, mangled with one template argument fewer, aside)."""
    old = _kernels_at(GEMV_F45_PF_HOLDER, tmp_path)
    specs = registry.family("gemv_kq")
    assert len(specs) == 24 and all(n != "PF" for n, _ in specs[0].params)
    moved = _sections_moved(old, {k.key: _as_built_with(k, (("PF", 0),)) for k in specs}, arch, tmp_path)
    assert not moved, f"machine code differs from {GEMV_F45_PF_HOLDER}'s PF=0: {moved}"


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_gemv_kq_prefetches_nothing_before_its_wait(tmp_path, arch):
    """Round 9 step 8's PF=1 build left the source: no gemv_kq instantiation issues an L2 bulk prefetch, and on sm_90
    each begins with griddepcontrol.wait (LK_PDL_ENTRY) -- the decode graph launches every one as PF=0 was; below
    sm_90 the entry is empty."""
    import re

    _need_nvcc()
    specs = registry.family("gemv_kq")
    w = tmp_path / "w.cu"
    w.write_text(audit.wrapper_source(registry.KERNELS_DIR / "gemv_kq.cu", specs))
    out = tmp_path / "w.ptx"
    subprocess.run([audit.nvcc_path(), "-ptx", "-std=c++17", f"-arch={arch}", f"-I{registry.KERNELS_DIR}",
                    *registry.cuda_defines(), "-o", str(out), str(w)], check=True, capture_output=True)
    bodies = re.split(r"\.entry\s+", out.read_text())[1:]
    assert len(bodies) == len(specs) == 24
    for body in bodies:
        assert "prefetch" not in body.split("{", 1)[1], body[:120]
        assert ("griddepcontrol.wait" in body) == (arch != "sm_80"), body[:120]


#: the last commit before add_rmsnorm's register forms (round 9 step 10: template parameter J)
NORM_J_BEFORE = "f8db0a2"


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_add_rmsnorm_loop_form_keeps_its_machine_code(tmp_path, arch):
    """add_rmsnorm's J=0 instantiations (the loop: what the prefill and, with PrefillOptions.norm_regs off, the decode
    launch) compile to the machine code of the same kernel at f8db0a2, before the J template parameter came, section
    by section (the kernel's name, mangled with one template argument more, aside): round 9 step 10's forms, not yet
    measured on a GPU, change no number of the product."""
    import types

    old = _kernels_at(NORM_J_BEFORE, tmp_path)
    loops = [k for k in registry.family("add_rmsnorm") if k.p["J"] == 0]
    assert len(loops) == 4
    twins = {}
    for k in loops:
        params = tuple((n, v) for n, v in k.params if n != "J")
        twins[k.key] = types.SimpleNamespace(template=k.template, params=params, key=k.key,
                                             name_expression=f"{k.template}<{','.join(str(v) for _, v in params)}>")
    new = _gemv_cubin(registry.KERNELS_DIR, tmp_path / "n", loops, arch, "prefill.cu")
    was = _gemv_cubin(old, tmp_path / "o", list(twins.values()), arch, "prefill.cu")
    moved = {k.key: sorted(x for x in set(a) | set(b) if a.get(x) != b.get(x))
             for k in loops for a, b in [(_kernel_sections(new, k), _kernel_sections(was, twins[k.key]))] if a != b}
    assert not moved, f"add_rmsnorm's loop form differs from {NORM_J_BEFORE}'s: {moved}"
    assert len({_kernel_sections(new, k)[".text"][-1] for k in loops}) == 4      # distinct: the check can tell them apart
