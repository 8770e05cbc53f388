"""ptxas resource audit: registers, spills, stack frame and static shared memory of every kernel instantiation.

For each CUDA source of the kernels folder, a wrapper translation unit is generated that ``#include``s the source
and takes the address of every registry ``name_expression`` of that source in a host function -- which makes
nvcc instantiate exactly the template variants the lab launches -- and is compiled offline, no GPU needed:

    nvcc -cubin -arch=sm_90 -Xptxas -v -I <kernels dir> wrapper.cu

The ptxas ``-v`` report (one block per entry function: stack frame, spill stores/loads, registers, static smem)
is parsed, entry names are demangled (``cxxfilt``)
and mapped back to registry entries. With the launcher's dynamic shared-memory formula from the registry,
each row carries the full occupancy row for the arch's device profile (sm_90 -> h200).

Discovery needs no edits: the audit takes the registry entries whose source exists in the kernels folder
(``registry.available()``) and also every ``*.cu`` file there, so a non-template (or explicitly instantiated)
kernel in a new file shows up as an unregistered row. Results are cached by the hash of the wrapper, the
source, the shared headers (*.cuh) of the kernels folder, the nvcc version and the flags (data/cache/audit/), and sources are
compiled in parallel (2 workers).

``check(rows)`` lists the failures the CI gate cares about: spills, a stack frame (local memory) or a compile
error in a kernel the lab treats as its main path (registry ``main_path=True``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import occupancy as occ, paths
from .kernels import registry
from .ptxas import (_dir_digest, _nvcc_version, _spec_args, _split_demangled, demangle, nvcc_path, parse_ptxas,
                    wrapper_source)

#: the device profile each arch's occupancy row is computed for
ARCH_DEVICE = {"sm_80": "a100", "sm_86": "rtx4090", "sm_89": "l40s", "sm_90": "h200", "sm_90a": "h200", "sm_100": "h200",
               "sm_120": "rtx5090", "sm_121": "gb10"}
DEFAULT_ARCHS = ("sm_90",)
CACHE_VERSION = 1
NVCC_FLAGS = ("-cubin", "-Xptxas", "-v", "-std=c++17")


class AuditError(RuntimeError):
    """Raised by ``check(..., raise_on_failure=True)`` and for an unusable toolchain."""


# ---------------------------------------------------------------------------------------------------- discovery

def discover(kernels_dir=None, kernels=None) -> dict:
    """{source file name: [registry entries of that source]} for every registry entry whose source exists in
    ``kernels_dir`` and every other ``*.cu`` file there (with an empty list)."""
    kdir = Path(kernels_dir or registry.KERNELS_DIR)
    specs = list(kernels) if kernels is not None else list(registry.KERNELS)
    if kernels_dir is None:
        specs = registry.available(specs) if specs else []
    else:
        specs = [k for k in specs if (kdir / k.source).exists()]
    out: dict[str, list] = {}
    for k in specs:
        out.setdefault(k.source, []).append(k)
    if kernels is None:  # a full audit also takes every .cu file of the folder
        for f in sorted(kdir.glob("*.cu")):
            out.setdefault(f.name, [])
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------------------------- ptxas parsing

# ---------------------------------------------------------------------------------------------------- compiling

def arch_flag(arch: str) -> str:
    """nvcc target flag: sm_90a (wgmma, setmaxnreg) needs the -gencode form (nvcc 13.0's -arch=sm_90a shorthand
    also runs a plain sm_90 pass that rejects them)."""
    if arch.endswith("a"):
        n = arch[3:-1]
        return f"-gencode=arch=compute_{n}a,code=sm_{n}a"
    return f"-arch={arch}"


def source_archs(specs, requested) -> tuple:
    """The archs one source is audited for: its families' own targets (sm_90a kernels stand in for sm_90 and
    are skipped on other archs, where they cannot run), else the requested ones."""
    own = {a for k in specs for a in k.archs} if specs else set()
    if own and all(a.endswith("a") for a in own):
        return tuple(a for a in sorted(own) if a[:-1] in requested or a in requested)
    return tuple(requested)


def _cache_dir() -> Path:
    try:
        d = paths.CACHE_DIR / "audit"
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except Exception:  # pragma: no cover
        pass
    d = Path(tempfile.gettempdir()) / "labkernels-cache" / "audit"
    d.mkdir(parents=True, exist_ok=True)
    return d





def compile_source(src: Path, specs, arch: str, kernels_dir: Path, *, nvcc: str | None = None,
                   use_cache: bool = True, dir_digest: str | None = None, extra_flags=()) -> dict:
    """Compile one source's wrapper for one arch; returns {'ok', 'entries' (parsed), 'log', 'cmd', 'cached'}."""
    nvcc = nvcc or nvcc_path()
    if not nvcc:
        raise AuditError("nvcc not on PATH: the ptxas audit needs the CUDA toolkit (no GPU)")
    wrapper = wrapper_source(src, specs)
    flags = (list(NVCC_FLAGS) + [arch_flag(arch), f"-I{kernels_dir.resolve()}"] + list(registry.cuda_defines())
             + list(extra_flags))
    key = hashlib.sha256(json.dumps({
        "v": CACHE_VERSION, "wrapper": wrapper, "src": hashlib.sha256(src.read_bytes()).hexdigest(),
        "headers": dir_digest or _dir_digest(kernels_dir),
        "nvcc": _nvcc_version(nvcc), "flags": flags}).encode()).hexdigest()[:24]
    cache_file = _cache_dir() / f"{src.stem}-{arch}-{key}.json"
    if use_cache and cache_file.exists():
        try:
            res = json.loads(cache_file.read_text())
            res["cached"] = True
            return res
        except (OSError, ValueError):
            pass
    with tempfile.TemporaryDirectory(prefix="lk-audit-") as td:
        w = Path(td) / f"{src.stem}__audit.cu"
        w.write_text(wrapper)
        cmd = [nvcc, *flags, "-o", str(Path(td) / f"{src.stem}.cubin"), str(w)]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=td)
    log = r.stdout + r.stderr
    res = {"ok": r.returncode == 0, "entries": parse_ptxas(log) if r.returncode == 0 else [], "log": log,
           "cmd": " ".join(cmd), "cached": False}
    if use_cache and res["ok"]:
        tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(res))
        os.replace(tmp, cache_file)
    return res


# ---------------------------------------------------------------------------------------------------- machine code A/B

def elf_text_sections(blob: bytes) -> dict:
    """{function name: its machine code} of a cubin (an ELF64 file): the bytes of every ``.text.<name>`` section.
    Two builds whose sections are byte-identical run the same instructions, whatever their file offsets."""
    import struct

    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise AuditError("not an ELF64 cubin")
    e_shoff, = struct.unpack_from("<Q", blob, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", blob, 0x3A)

    def sh(i):
        name, _typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", blob, e_shoff + i * e_shentsize)
        return name, off, size

    _, str_off, str_size = sh(e_shstrndx)
    names = blob[str_off:str_off + str_size]
    out = {}
    for i in range(e_shnum):
        n, off, size = sh(i)
        name = names[n:names.index(b"\0", n)].decode()
        if name.startswith(".text."):
            out[name[len(".text."):]] = blob[off:off + size]
    return out


def text_digests(kernels_dir, families, arch: str = "sm_90", *, nvcc: str | None = None, source=None,
                 flags=()) -> dict:
    """{registry key: sha256 of its machine code} for every instantiation of ``families`` built from the sources in
    ``kernels_dir`` (the registry's instantiations and -D constants; one nvcc call per source). ``source``: a file to
    build instead of the families' registry source (an exploratory build's, e.g. round 7's experiments source, with
    ``kernels_dir``'s headers); ``flags``: more nvcc flags (an exploratory build's -D names)."""
    nvcc = nvcc or nvcc_path()
    if not nvcc:
        raise AuditError("nvcc not on PATH: the machine-code comparison needs the CUDA toolkit (no GPU)")
    kdir = Path(kernels_dir)
    specs = [k for k in registry.KERNELS if k.family in set(families)]
    unknown = set(families) - {k.family for k in specs}
    if unknown:
        raise AuditError(f"no registry family {sorted(unknown)}")
    out = {}
    by_src: dict = {}
    for k in specs:
        by_src.setdefault(k.source, []).append(k)
    for src, ks in by_src.items():
        path = Path(source) if source is not None else kdir / src
        with tempfile.TemporaryDirectory(prefix="lk-text-") as td:
            w = Path(td) / f"{Path(src).stem}__text.cu"
            w.write_text(wrapper_source(path, ks))
            cub = Path(td) / "k.cubin"
            inc = [f"-I{path.parent.resolve()}"] if source is not None else []
            cmd = [nvcc, "-cubin", "-std=c++17", arch_flag(arch), *inc, f"-I{kdir.resolve()}", *registry.cuda_defines(),
                   *flags, "-o", str(cub), str(w)]
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=td)
            if r.returncode:
                raise AuditError(f"{src} from {kdir} does not build:\n{r.stderr[-2000:]}")
            text = elf_text_sections(cub.read_bytes())
        for k in ks:
            sym = [n for n in text if _demangled_matches(n, k)]
            if len(sym) != 1:
                raise AuditError(f"{k.key}: {len(sym)} functions in the cubin match its name expression")
            out[k.key] = hashlib.sha256(text[sym[0]]).hexdigest()
    return out


def _demangled_matches(mangled: str, k) -> bool:
    """Whether a mangled kernel name is k's instantiation: the template name and its integer arguments in order
    (Itanium mangling: ``_Z<len><name>I Li<v>E ... E``; a non-template function has no ``I...E``)."""
    prefix = f"_Z{len(k.template)}{k.template}"
    if not mangled.startswith(prefix):
        return False
    m = re.match(r"I((?:Lin?\d+E)+)E", mangled[len(prefix):])
    args = re.findall(r"Li(n?\d+)E", m.group(1)) if m else []
    return args == [str(v).replace("-", "n") for _, v in k.params]


def text_ab(old_dir, new_dir, families, arch: str = "sm_90", *, old_source=None, new_source=None,
            flags=()) -> list[dict]:
    """Machine code of two source trees, instantiation by instantiation: [{key, same}] (same = byte-identical
    .text). Identical code is identical speed: the strongest 'numbers did not move' a refactor can show.
    ``old_source`` / ``new_source`` and ``flags``: an exploratory build's file on either side and its -D flags
    (:func:`text_digests`)."""
    a = text_digests(old_dir, families, arch, source=old_source, flags=flags)
    b = text_digests(new_dir, families, arch, source=new_source, flags=flags)
    return [{"kernel": k, "same": a.get(k) == b[k], "old": a.get(k, "absent")[:12], "new": b[k][:12]} for k in b]


# ---------------------------------------------------------------------------------------------------- audit

def _occupancy_row(device: str, threads, regs, smem) -> dict:
    if threads is None or regs is None:
        return {"blocks_per_sm": None, "warps_per_sm": None, "occupancy": None, "limiter": None}
    try:
        r = occ.occupancy(device, threads, regs, smem)
        return {"blocks_per_sm": r["blocks_per_sm"], "warps_per_sm": r["warps_per_sm"],
                "occupancy": r["occupancy"], "limiter": r["limiter"]}
    except occ.OccupancyError as e:
        return {"blocks_per_sm": 0, "warps_per_sm": 0, "occupancy": 0.0, "limiter": f"impossible: {e}"}


def audit(kernels=None, archs=DEFAULT_ARCHS, *, kernels_dir=None, device=None, use_cache: bool = True,
          jobs: int = 2, extra_flags=()) -> list[dict]:
    """Audit rows, one per (kernel instantiation, arch).

    ``kernels``: registry entries to audit (default: all available ones plus every .cu file's other kernels);
    ``archs``: e.g. ("sm_90",) or ("sm_80", "sm_90", "sm_120"); ``kernels_dir``: the folder of the sources
    (default labkernels/kernels; tests pass a temp copy); ``device``: the occupancy profile (default per arch:
    sm_90 -> h200, sm_80 -> a100, sm_120 -> rtx5090, sm_121 -> gb10).

    Row keys: key, family, kernel (name expression or demangled name), source, arch, registered, main_path,
    regs, spill_stores, spill_loads, stack_frame, static_smem, barriers, dynamic_smem (registry formula),
    smem (static + dynamic), threads, device, blocks_per_sm, warps_per_sm, occupancy, limiter, mangled, error.
    """
    kdir = Path(kernels_dir or registry.KERNELS_DIR)
    if isinstance(archs, str):
        archs = (archs,)
    if not kdir.is_dir():
        raise AuditError(f"kernels folder {kdir}: {'not a folder' if kdir.exists() else 'no such folder'}")
    if not any(kdir.glob("*.cu")):
        raise AuditError(f"kernels folder {kdir} holds no .cu sources")
    bad = [a for a in archs if not isinstance(a, str) or not re.fullmatch(r"sm_\d{2,3}a?", a)]
    if bad:
        raise AuditError(f"--arch {bad[0]!r}: a target is sm_NN or sm_NNa (sm_80, sm_90, sm_90a, sm_120)")
    if device is not None:
        try:
            occ.profile(device)
        except occ.OccupancyError as e:
            raise AuditError(f"--device: {e}") from None
    for f in sorted(list(kdir.glob("*.cu")) + list(kdir.glob("*.cuh")) + list(kdir.glob("*.h"))):
        if not f.is_file():   # a FIFO would block nvcc and the cache key's read for ever; a device never ends
            raise AuditError(f"{f}: not a regular file: a kernel source must be one")
    groups = discover(kdir if kernels_dir else None, kernels)
    nvcc = nvcc_path()
    if not nvcc:
        raise AuditError("nvcc not on PATH: the ptxas audit needs the CUDA toolkit (no GPU)")
    digest = _dir_digest(kdir)
    tasks = [(src, specs, arch) for src, specs in groups.items() for arch in source_archs(specs, archs)]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        results = list(ex.map(lambda t: compile_source(kdir / t[0], t[1], t[2], kdir, nvcc=nvcc,
                                                       use_cache=use_cache, dir_digest=digest,
                                                       extra_flags=extra_flags), tasks))
    rows: list[dict] = []
    for (src, specs, arch), res in zip(tasks, results):
        dev = device or ARCH_DEVICE.get(arch, "h200")
        if not res["ok"]:
            err = _first_error(res["log"])
            for k in specs:
                rows.append(_row(k, src, arch, dev, None, error=err))
            if not specs:
                rows.append(_row(None, src, arch, dev, None, error=err))
            continue
        entries = res["entries"]
        dem = demangle([e["mangled"] for e in entries])
        by_args: dict[tuple, dict] = {}
        for e, d in zip(entries, dem):
            e = dict(e, demangled=d)
            base, args = _split_demangled(d)
            e["base"], e["args"] = base, args
            by_args[(base, args)] = e
        used = set()
        for k in specs:
            e = by_args.get((k.template, _spec_args(k) if k.params else None))
            if e is None:
                rows.append(_row(k, src, arch, dev, None,
                                 error=f"instantiation {k.name_expression} not found in the ptxas report"))
                continue
            used.add(id(e))
            rows.append(_row(k, src, arch, dev, e))
        for e in by_args.values():
            if id(e) not in used:
                rows.append(_row(None, src, arch, dev, e))
    return rows


def _first_error(log: str) -> str:
    errs = [ln.strip() for ln in log.splitlines() if "error" in ln.lower()]
    return (errs[0] if errs else log.strip().splitlines()[-1] if log.strip() else "compile failed")[:400]


def _row(k, src, arch, dev, e, error=None) -> dict:
    if k is not None:
        dyn = k.dynamic_smem()
        row = {"key": k.key, "family": k.family, "kernel": k.name_expression, "registered": True,
               "main_path": k.main_path, "threads": k.threads, "dynamic_smem": dyn}
    else:
        if e:
            base, targs = _split_demangled(e["demangled"])
            name = base + (f"<{', '.join(targs)}>" if targs else "")
        else:
            name = Path(src).stem
        row = {"key": f"{Path(src).stem}:{name}", "family": None, "kernel": name, "registered": False,
               "main_path": False, "threads": None, "dynamic_smem": 0}
    row.update({"source": src, "arch": arch, "device": dev})
    for f in ("regs", "spill_stores", "spill_loads", "stack_frame", "static_smem", "barriers"):
        row[f] = e[f] if e else None
    row["wgmma_serialized"] = bool(e.get("wgmma_serialized")) if e else None
    row["smem"] = (row["static_smem"] or 0) + (row["dynamic_smem"] or 0) if e else None
    row.update(_occupancy_row(dev, row["threads"], row["regs"], row["smem"]) if e else
               {"blocks_per_sm": None, "warps_per_sm": None, "occupancy": None, "limiter": None})
    row["mangled"] = e["mangled"] if e else None
    row["error"] = error
    return row


def check(rows, *, require_archs=DEFAULT_ARCHS, raise_on_failure: bool = False) -> list[str]:
    """Failures of main-path kernels: spill stores/loads, a stack frame (local memory), or -- on the archs in
    ``require_archs`` -- a compile error / missing instantiation. Other archs' compile errors count as
    'unsupported there', not as failures. Returns the list of messages (empty = pass)."""
    fails = []
    for r in rows:
        if not r.get("main_path"):
            continue
        where = f"{r['key']} [{r['arch']}] ({r['source']})"
        if r.get("error"):
            if r["arch"] in require_archs or r["arch"].rstrip("a") in require_archs:
                fails.append(f"{where}: {r['error']}")
            continue
        if (r.get("spill_stores") or 0) > 0 or (r.get("spill_loads") or 0) > 0:
            fails.append(f"{where}: spills {r['spill_stores']} B stores / {r['spill_loads']} B loads")
        if (r.get("stack_frame") or 0) > 0:
            fails.append(f"{where}: {r['stack_frame']} B stack frame (local memory)")
        if r.get("wgmma_serialized"):
            fails.append(f"{where}: ptxas serialized its wgmma pipeline (C7515-class warning)")
    if fails and raise_on_failure:
        raise AuditError("ptxas audit failed:\n  " + "\n  ".join(fails))
    return fails


# ---------------------------------------------------------------------------------------------------- CLI

_COLS = [("key", "kernel", 40), ("arch", "arch", 6), ("regs", "regs", 4), ("spill_stores", "spSt", 4),
         ("spill_loads", "spLd", 4), ("stack_frame", "stack", 5), ("static_smem", "sSmem", 6),
         ("dynamic_smem", "dSmem", 6), ("threads", "thr", 4), ("blocks_per_sm", "blk/SM", 6),
         ("occupancy", "occ", 6), ("limiter", "limiter", 9), ("device", "device", 7), ("main_path", "main", 4),
         ("wgmma_serialized", "wgSer", 5)]


def format_table(rows) -> str:
    def cell(r, k):
        v = r.get(k)
        if v is None:
            return "-"
        if k == "occupancy":
            return f"{100 * v:.1f}%"
        if k == "main_path":
            return "yes" if v else ""
        return str(v)
    out = ["  ".join(f"{h:<{w}}" for _, h, w in _COLS)]
    for r in rows:
        line = "  ".join(f"{cell(r, k):<{w}}" for k, _, w in _COLS)
        if r.get("error"):
            line += f"  ERROR: {r['error']}"
        out.append(line)
    return "\n".join(out)


def _add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--arch", action="append", dest="archs", metavar="SM",
                   help="target arch (repeatable), default sm_90; e.g. --arch sm_80 --arch sm_90 --arch sm_120")
    p.add_argument("--kernels-dir", default=None, help="folder of the CUDA sources (default labkernels/kernels)")
    p.add_argument("--family", action="append", default=None, help="audit only these registry families")
    p.add_argument("--device", default=None, help="occupancy profile for every row (default per arch)")
    p.add_argument("--no-cache", action="store_true", help="recompile even if a cached ptxas report exists")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a main-path kernel spills, uses local memory or fails to compile")
    return p


def register_cli(subparsers):
    """Add the ``audit`` subcommand to an argparse subparsers object (labkernels/cli.py calls this)."""
    p = subparsers.add_parser("audit", help="ptxas resource audit of every kernel instantiation (no GPU)",
                              description=__doc__.split("\n\n")[0])
    _add_args(p)
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    """Handler of ``labkernels kernels audit``: the table (or JSON); with --check exit 1 on main-path failures."""
    kernels = None
    if getattr(args, "family", None):
        families = list(dict.fromkeys(k.family for k in registry.KERNELS))
        unknown = [f for f in args.family if f not in families]
        if unknown:
            print(f"labkernels kernels audit: error: unknown famil{'ies' if len(unknown) > 1 else 'y'} "
                  f"{', '.join(unknown)}; registry families: {', '.join(families)}", file=sys.stderr)
            return 2
        kernels = [k for k in registry.KERNELS if k.family in set(args.family)]
    archs = tuple(args.archs or DEFAULT_ARCHS)
    try:
        rows = audit(kernels, archs, kernels_dir=args.kernels_dir, device=args.device,
                     use_cache=not args.no_cache)
    except AuditError as e:
        print(f"labkernels kernels audit: error: {e}", file=sys.stderr)
        return 2
    fails = check(rows, require_archs=archs if "sm_90" not in archs else ("sm_90",))
    if args.json:
        print(json.dumps({"rows": rows, "failures": fails}, indent=2))
    else:
        print(format_table(rows))
        if fails:
            print("\nmain-path failures:\n  " + "\n  ".join(fails))
    return 1 if (fails and args.check) else 0


if __name__ == "__main__":
    _p = _add_args(argparse.ArgumentParser(prog="python -m labkernels.audit", description=__doc__.split("\n\n")[0]))
    sys.exit(main(_p.parse_args()))
