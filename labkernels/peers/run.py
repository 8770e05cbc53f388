"""Running the peer tools on the GPU machine and parsing their output.

* **Which kernel llama.cpp takes** per n (:func:`llama_path`, transcribed from the pinned commit).
* **test-backend-ops**: ``peers mmq`` runs ``test-backend-ops perf -o MUL_MAT -b CUDA0 --output sql`` (the tool's
  structured output, read through SQLite: :func:`tbo_results`, :func:`parse_tbo_perf`) on the lab's shapes through
  ``--test-file`` (generic MUL_MAT ops, :func:`tbo_test_file`: llama.cpp's own perf list holds only m=4096, k=14336
  and a few q4_K k=4096 mat-vec cases, see :data:`BUILTIN_PERF_CASES`) plus the built-in q4_K/q6_K cases as a
  cross-check (:func:`measure_mmq`).
* **llama-bench**: ``peers bench`` runs ``llama-bench -o json`` (:func:`bench_args`, :func:`parse_bench_json`,
  :func:`measure_bench`).
* Both are recorded under ``data/peers/`` (:mod:`labkernels.records`, round :data:`ROUND`); :func:`gpu_run` is the
  one-call run of both.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tarfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .. import nvml, records, synthetic
from .recipe import PeerError, parse_build_record, read_sha256_file, record_mismatches, sha256_file

#: the round every peer run is recorded under (its runs: data/peers/)
ROUND = "peers"


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
