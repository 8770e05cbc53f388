"""llama.cpp as a peer (labkernels.peers): the pinned recipe's record matching, the CUDA path rule, the output
parsers on verbatim tool output, and the pairing that forms vs-llama ratios only for matched keys.

Fixtures under tests/fixtures/peers/ are verbatim output of the prebuilt binaries of the pinned commit
(../shared/peers/llamacpp-sm90.tar.xz), run on this CPU machine with the CPU backend (the CUDA backend found
only a link-time libcuda stub): same printers as on the GPU, other device names. BUILD-prebuilt-sm90.txt is
the prebuilt tarball's BUILD record, verbatim.
"""
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from labkernels import peers, records
from labkernels.cli import main as cli_main

FIX = Path(__file__).parent / "fixtures" / "peers"
H200 = "NVIDIA H200"


def fx(name: str) -> str:
    return (FIX / name).read_text()


# ------------------------------------------------------------------------------------------------------
# BUILD record vs the pinned recipe
# ------------------------------------------------------------------------------------------------------
def test_prebuilt_record_matches_recipe():
    rec = peers.parse_build_record(fx("BUILD-prebuilt-sm90.txt"))
    assert rec["commit"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f" == peers.RECIPE["source"]["commit"]
    assert rec["source"] == {"package": "llama-cpp-python", "version": "0.3.36", "subdir": "vendor/llama.cpp"}
    assert rec["toolchain"] == {"cuda": "release 13.0, V13.0.88", "gcc": "12.2.0", "cmake": "3.25.1", "ninja": "1.11.1"}
    assert rec["cublas"] == {"package": "nvidia-cublas", "version": "13.0.2.14"}
    assert rec["cmake_flags"][:2] == ["-G", "Ninja"] and "-DGGML_CUDA_FA=ON" in rec["cmake_flags"]
    assert len(rec["cmake_flags"]) == 24 and rec["targets"] == ["test-backend-ops", "llama-bench"]
    assert peers.record_mismatches(rec) == []


@pytest.mark.parametrize("old,new,what", [
    ("Commit: 0c1e57098bba", "Commit: 1c1e57098bba", "commit"),
    ("-DGGML_CUDA_FA=ON", "-DGGML_CUDA_FA=OFF", "cmake flags"),
    ("  -DGGML_CUDA_NCCL=OFF \\\n", "", "cmake flags"),
    ("-DCMAKE_CUDA_ARCHITECTURES=90-real", "-DCMAKE_CUDA_ARCHITECTURES=90", "cmake flags"),
    ("gcc 12.2.0", "gcc 13.1.0", "toolchain"),
    ("release 13.0, V13.0.88", "release 13.1, V13.1.80", "toolchain"),
    ("llama-cpp-python 0.3.36 sdist", "llama-cpp-python 0.3.35 sdist", "source"),
    ("nvidia-cublas 13.0.2.14", "nvidia-cublas 13.1.0.3", "cuBLAS"),
    ("-j2 test-backend-ops llama-bench", "-j2 test-backend-ops", "targets"),
])
def test_record_mismatch_is_named(old, new, what):
    text = fx("BUILD-prebuilt-sm90.txt")
    assert old in text
    bad = peers.record_mismatches(peers.parse_build_record(text.replace(old, new, 1)))
    assert len(bad) == 1 and bad[0].startswith(what), bad


def test_own_record_round_trips_and_pins_the_sdist_sha():
    text = peers.format_build_record(peers.RECIPE["toolchain"], built="2026-12-01T09:00Z", host="Debian 12",
                                     commit_line=peers.RECIPE["source"]["commit"] + "  (2026-10-01)  msg")
    rec = peers.parse_build_record(text)
    assert rec["source_sha256"] == peers.RECIPE["source"]["sha256"]
    assert rec["cmake_flags"] == peers.CMAKE_FLAGS and peers.record_mismatches(rec) == []
    other = peers.format_build_record({**peers.RECIPE["toolchain"], "cmake": "3.31.0"}, built="x", host="y",
                                      commit_line=peers.RECIPE["source"]["commit"])
    assert [b.split()[0] for b in peers.record_mismatches(peers.parse_build_record(other))] == ["toolchain"]
    forged = text.replace(peers.RECIPE["source"]["sha256"], "0" * 64)
    assert peers.record_mismatches(peers.parse_build_record(forged))[0].startswith("source sha256")


def _fake_tarball(d: Path, record: str, sha_ok=True) -> Path:
    stage = d / "stage" / "llamacpp"
    stage.mkdir(parents=True)
    (stage / "BUILD.txt").write_text(record)
    (stage / "run.sh").write_text("#!/bin/bash\n")
    tb = d / peers.TARBALL_NAME
    with tarfile.open(tb, "w:xz") as tf:
        tf.add(stage, arcname="llamacpp")
    (d / (tb.name + ".sha256")).write_text(("f" * 64 if not sha_ok else peers.sha256_file(tb)) + "\n")
    (d / "BUILD.txt").write_text(record)
    return tb


def test_prebuilt_reuse_checks_sha_and_record(tmp_path, capsys):
    good = _fake_tarball(tmp_path / "good", fx("BUILD-prebuilt-sm90.txt"))
    assert peers.check_prebuilt(good) == []
    rc = cli_main(["peers", "build", "--check-only", "--prebuilt", str(good), "--dest", str(tmp_path / "cache")])
    out = capsys.readouterr().out
    assert rc == 0 and "reused the prebuilt" in out and "sha256 checks" in out
    copied = tmp_path / "cache" / peers.TARBALL_NAME
    assert copied.read_bytes() == good.read_bytes() and (tmp_path / "cache" / "BUILD.txt").is_file()

    bad_sha = _fake_tarball(tmp_path / "badsha", fx("BUILD-prebuilt-sm90.txt"), sha_ok=False)
    assert "sha256" in peers.check_prebuilt(bad_sha)[0]
    other = _fake_tarball(tmp_path / "other", fx("BUILD-prebuilt-sm90.txt").replace("-DGGML_CUDA_FA=ON", "-DGGML_CUDA_FA=OFF"))
    with pytest.raises(peers.PeerError, match="does not match the pinned recipe: cmake flags"):
        peers.reuse_prebuilt(other, tmp_path / "cache2")
    assert not (tmp_path / "cache2").exists()
    rc = cli_main(["peers", "build", "--check-only", "--prebuilt", str(other), "--dest", str(tmp_path / "c3")])
    assert rc == 1 and "not reused" in capsys.readouterr().out
    (tmp_path / "good" / (good.name + ".sha256")).unlink()
    assert "missing" in peers.check_prebuilt(good)[0]
    assert "no such file" in peers.check_prebuilt(tmp_path / "nope.tar.xz")[0]


def test_build_from_source_says_what_it_would_do_and_asks_for_yes(tmp_path, capsys, monkeypatch):
    """No prebuilt tarball: `peers build` prints the plan (downloads, ninja, ~36 min, whether this machine has a GPU)
    and starts nothing without --yes."""
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a build was started"))
    dest = tmp_path / "cache"
    rc = cli_main(["peers", "build", "--prebuilt", str(tmp_path / "none.tar.xz"), "--dest", str(dest)])
    out = capsys.readouterr().out
    assert rc == 2 and "no prebuilt tarball" in out and "about 36 minutes" in out and "ninja -j2" in out
    assert "Nothing was started. Pass --yes" in out and not dest.exists()
    rc = cli_main(["peers", "build", "--from-source", "--prebuilt", str(tmp_path / "none.tar.xz"), "--dest", str(dest)])
    assert rc == 2 and "Nothing was started" in capsys.readouterr().out


def test_shared_prebuilt_matches_recipe():
    """The real cache beside the repository (when this checkout has one) is reusable as the recipe's build."""
    tb = peers.SHARED_PEERS / peers.TARBALL_NAME
    if not tb.is_file():
        pytest.skip(f"no prebuilt peer tarball at {tb}")
    assert peers.check_prebuilt(tb) == []


def test_extract_source_checks_the_vendored_commit(tmp_path):
    """The sdist's vendor/llama.cpp carries git metadata; the recipe names its HEAD and refuses a changed tree."""
    top = tmp_path / "mk" / "llama_cpp_python-0.3.36"
    tree = top / "vendor" / "llama.cpp"
    tree.mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("project(x)\n")
    g = ["git", "-C", str(tree), "-c", "user.email=a@b", "-c", "user.name=t"]
    subprocess.run(g + ["init", "-q"], check=True)
    subprocess.run(g + ["add", "."], check=True)
    subprocess.run(g + ["commit", "-qm", "x"], check=True)
    sha = subprocess.run(g + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    sdist = tmp_path / "s.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(top, arcname=top.name)
    recipe = {**peers.RECIPE, "source": {**peers.RECIPE["source"], "commit": sha}}
    got = peers.extract_source(sdist, tmp_path / "w", recipe)
    assert peers.vendored_commit(got) == sha
    wrong = {**recipe, "source": {**recipe["source"], "commit": "0" * 40}}
    with pytest.raises(peers.PeerError, match="vendored commit .* != pinned 0000"):
        peers.extract_source(sdist, tmp_path / "w", wrong)
    (tree / "CMakeLists.txt").write_text("project(changed)\n")
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(top, arcname=top.name)
    with pytest.raises(peers.PeerError, match="differs from commit"):
        peers.extract_source(sdist, tmp_path / "w", recipe)


def test_fetch_pinned_refuses_a_wrong_sha(tmp_path, monkeypatch):
    def fake_download(spec, dest, binary, log=None):
        (dest / peers.RECIPE["source"]["sdist"]).write_bytes(b"not the sdist")
    monkeypatch.setattr(peers.recipe, "_pip_download", fake_download)
    with pytest.raises(peers.PeerError, match="sha256 .* != pinned 832db069"):
        peers.fetch_pinned("source", tmp_path)


@pytest.mark.skipif(not Path("/usr/local/cuda-13.0/include/cuda.h").is_file() or not shutil.which("gcc"),
                    reason="needs CUDA 13.0's cuda.h and gcc")
def test_libcuda_stub(tmp_path):
    names = peers.cuda_driver_symbols(Path("/usr/local/cuda-13.0/include/cuda.h"))
    # declared names and the versioned symbols the header's macros map them to
    assert {"cuInit", "cuMemAlloc", "cuMemAlloc_v2", "cuCtxCreate_v4", "cuGetProcAddress"} <= set(names)
    so = peers.make_libcuda_stub(Path("/usr/local/cuda-13.0/include/cuda.h"), tmp_path / "stubs" / "libcuda.so")
    dyn = subprocess.run(["readelf", "-d", "--dyn-syms", str(so)], capture_output=True, text=True).stdout
    assert "Library soname: [libcuda.so.1]" in dyn and re.search(r"\bcuMemAlloc_v2\b", dyn)


def test_build_progress_reads_ninja_lines():
    log = "cmake ...\n[1/212] Building C object a.o\n[57/212] Building CUDA object ggml-cuda/mmq.cu.o\nnoise\n"
    assert peers.build_progress(log) == (57, 212)
    assert peers.build_progress("configuring\n") is None


# ------------------------------------------------------------------------------------------------------
# which kernel llama.cpp takes
# ------------------------------------------------------------------------------------------------------
def test_llama_path_rule_h200():
    """ggml-cuda.cu:1862-1870 (MMVQ, then MMQ, then cuBLAS); mmvq.cu:427 with MMVQ_MAX_BATCH_SIZE=8
    (mmvq.cuh:3) for cc 900, which has no tuned branch (mmvq.cu:324-381); mmq.cu:371 turing_mma_available."""
    got = {(t, n): peers.llama_path(t, n) for t in ("q4_K", "q6_K") for n in peers.LAB_NTS + peers.EXTRA_NTS}
    assert {k for k, v in got.items() if v == "MMVQ"} == {("q4_K", 1), ("q4_K", 8), ("q6_K", 1), ("q6_K", 8)}
    assert all(v == "MMQ" for (t, n), v in got.items() if n > 8)
    assert peers.llama_path("q4_K", 9) == "MMQ"


def test_llama_path_rule_tuned_arches():
    # Blackwell (mmvq.cu:334-347): q4_K <= 5, q6_K <= 7; Orin (356-366): <= 1; Volta MMQ only below 64 (mmq.cu:380)
    assert [peers.llama_path("q4_K", n, 1200) for n in (5, 6)] == ["MMVQ", "MMQ"]
    assert [peers.llama_path("q6_K", n, 1200) for n in (7, 8)] == ["MMVQ", "MMQ"]
    assert [peers.llama_path("q6_K", n, 870) for n in (1, 2)] == ["MMVQ", "MMQ"]
    assert [peers.llama_path("q4_K", n, 700) for n in (5, 6, 64)] == ["MMVQ", "MMQ", "cuBLAS"]
    with pytest.raises(ValueError, match="q4_K and q6_K"):
        peers.llama_path("q8_0", 1)
    with pytest.raises(ValueError):
        peers.llama_path("q4_K", 0)


# ------------------------------------------------------------------------------------------------------
# test-backend-ops: cases, test file, parser
# ------------------------------------------------------------------------------------------------------
def test_builtin_perf_cases_hold_few_lab_shapes():
    lab = {(t, m, n, k) for t in peers.PEER_TYPES for m, k in peers.LAB_SHAPES for n in peers.LAB_NTS}
    inside = lab & set(peers.BUILTIN_PERF_CASES)
    assert inside == {(t, 4096, n, 14336) for t in peers.PEER_TYPES for n in (1, 8, 512)} | \
        {("q4_K", 4096, n, 4096) for n in (1, 8)}
    assert len(lab) == 56 and len(inside) == 8  # the other 48 need --test-file


def test_test_file_is_the_one_the_binary_accepted():
    """small.tbo is the file the pinned test-backend-ops read to print tbo-perf-testfile-cpu.txt / .sql."""
    assert peers.tbo_test_file(["q4_K", "q6_K"], [(256, 512)], [1, 8]) == fx("small.tbo")
    full = peers.tbo_test_file().splitlines()
    assert len(full) == 2 * 4 * 9 and full[0].split()[:2] == ["29", "0"]
    with pytest.raises(ValueError, match="multiple of the 256"):
        peers.tbo_test_file(["q4_K"], [(4096, 4000)], [1])


def _sql_row(params, us=0.0, runs=0, supported=1, backend="CUDA0", error="", flops=0.0):
    """One line as the pinned build's sql_printer writes it (every value quoted; numbers as std::to_string)."""
    vals = ["2026-12-06T00:00:00Z", "0c1e570", backend, "MUL_MAT", params, "perf", str(supported), str(supported),
            error, f"{us:f}", f"{flops:f}", "0.000000", "75", str(runs), "", ""]
    return (peers.run._TBO_INSERT + "test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, "
            "passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, "
            "backend_reg_name) VALUES (" + ", ".join(f"'{v}'" for v in vals) + ");")


def test_parse_tbo_testfile_output():
    """The pinned binary's own --output sql of small.tbo on the CPU backend (verbatim fixture)."""
    df, facts = peers.parse_tbo_perf(fx("tbo-perf-testfile-cpu.sql"))
    assert facts == {"device": None, "backends": [("CPU", "OK")], "not_supported": [], "failed": False}
    assert list(df.source.unique()) == ["testfile"]
    assert list(zip(df.type, df.m, df.n, df.k)) == [("q4_K", 256, 1, 512), ("q4_K", 256, 8, 512),
                                                    ("q6_K", 256, 1, 512), ("q6_K", 256, 8, 512)]
    assert list(df.us_per_run) == [65.839844, 616.730103, 76.178772, 803.917603]     # 6 decimals, typed REAL
    assert list(df.runs) == [16384, 8192, 16384, 8192]
    assert df.tflops.iloc[1] == pytest.approx(2 * 256 * 8 * 512 / 616.730103e-6 / 1e12)
    assert list(df.path) == ["MMVQ"] * 4
    assert peers.parse_tbo_perf(fx("tbo-perf-testfile-cpu.sql"), cc=None)[0].path.eq("").all()


def test_parse_tbo_builtin_output_agrees_with_the_tools_flops():
    text = fx("tbo-perf-builtin-cpu.sql")
    df, _ = peers.parse_tbo_perf(text)
    assert list(zip(df.source, df.type, df.m, df.n, df.k, df.us_per_run)) == [
        ("builtin", "q4_K", 4096, 1, 14336, 12360.0), ("builtin", "q4_K", 4096, 2, 14336, 18215.314286)]
    tool = peers.tbo_results(text).flops                # the tool's own rate, FLOP/s
    assert list(df.tflops * 1e12) == pytest.approx(list(tool), rel=1e-6)


def test_parse_tbo_cuda_style_rows():
    """Rows as sql_printer writes them for a CUDA0 run: batched / viewed cases dropped, not-supported listed."""
    p1 = "type_a=q6_K,type_b=f32,m=4096,n=512,k=14336,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0,m_v=0,pad=0"
    p2 = "name=lab,type=f32,ne=[11008,4096,1,1],op_params=[],sources=q4_K[4096,11008,1,1],f32[4096,4096,1,1]"
    p3 = "type_a=q4_K,type_b=f32,m=4096,n=1,k=14336,bs=[2,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0,m_v=0,pad=0"
    head = fx("tbo-perf-testfile-cpu.sql").split(");")[0] + ");\n"
    text = "\n".join([head, _sql_row(p1, 310.25, 1234), "failed to allocate tensors", _sql_row(p2, 1890.5, 100),
                      _sql_row(p3, 12.0, 10), _sql_row(p1.replace("m_v=0", "m_v=4097"), 12.0, 10),
                      _sql_row(p1.replace("q6_K", "q4_K"), supported=0, error="not supported")])
    df, facts = peers.parse_tbo_perf(text)
    assert facts["backends"] == [("CUDA0", "OK")] and len(facts["not_supported"]) == 1 and not facts["failed"]
    assert list(zip(df.source, df.type, df.m, df.n, df.k, df.path)) == [
        ("builtin", "q6_K", 4096, 512, 14336, "MMQ"), ("testfile", "q4_K", 11008, 4096, 4096, "MMQ")]
    assert df.tflops.iloc[1] == pytest.approx(2 * 11008 * 4096 * 4096 / 1890.5e-6 / 1e12)


def test_tbo_output_that_is_not_its_sql_is_an_error():
    with pytest.raises(peers.PeerError, match="no CREATE TABLE test_backend_ops"):
        peers.parse_tbo_perf(fx("tbo-perf-testfile-cpu.txt"))            # the console format
    head = fx("tbo-perf-testfile-cpu.sql").split(");")[0] + ");\n"
    with pytest.raises(peers.PeerError, match="SQL output does not load"):
        peers.parse_tbo_perf(head + _sql_row("x", error="it's broken"))   # a quote the printer does not escape


def test_tbo_without_the_cuda_device_is_an_error():
    """With no usable CUDA device test-backend-ops skips CUDA0, exits 0 and writes no row (verbatim fixture)."""
    df, facts = peers.parse_tbo_perf(fx("tbo-perf-no-cuda-device.sql"))
    assert df.empty and facts["backends"] == []
    with pytest.raises(peers.PeerError, match=r"tested no CUDA0 backend .*CUDA driver is a stub library"):
        peers.check_tbo_backend(facts, "CUDA0", fx("tbo-perf-no-cuda-device.err"))


# ------------------------------------------------------------------------------------------------------
# llama-bench parser and bad input
# ------------------------------------------------------------------------------------------------------
def test_parse_bench_json():
    df = peers.parse_bench_json(fx("bench-tiny-llama-cpu.json"))
    raw = json.loads(fx("bench-tiny-llama-cpu.json"))
    # run as -p 64,128 -n 0 -fa 1,0 -r 3: every (fa, p) combination, fa outermost
    assert list(df.flash_attn) == [1, 1, 0, 0] and list(df.n_prompt) == [64, 128, 64, 128]
    assert list(df.n_gen) == [0] * 4
    assert list(df.tok_s) == [r["avg_ts"] for r in raw] and list(df.tok_s_std) == [r["stddev_ts"] for r in raw]
    assert list(df.tok_s_min) == [min(r["samples_ts"]) for r in raw]
    assert list(df.reps) == [3] * 4 and df.n_ubatch.iloc[0] == 512 and df.build_commit.iloc[0] == "0c1e570"
    assert df.gpu_info.iloc[0] == "" and df.model_type.iloc[0] == "llama ?B Q4_K - Medium"
    g = peers.parse_bench_json(fx("bench-gemma-cpu.json"))
    assert g.model_type.iloc[0] == "gemma3 270M Q4_K - Medium" and g.reps.iloc[0] == 2


def test_llama_cpp_accepts_the_synthetic_7b():
    """llama-bench of the pinned build loaded the GGUF written by labkernels.peers.synthetic_7b_gguf (CPU run)."""
    df = peers.parse_bench_json(fx("bench-synthetic-7b-cpu.json"))
    raw = json.loads(fx("bench-synthetic-7b-cpu.json"))[0]
    assert df.model_type.iloc[0] == "llama 7B Q4_K - Medium" and raw["model_n_params"] == 6738415616
    assert df.model_filename.iloc[0].endswith(".gguf") and df.n_prompt.iloc[0] == 4


def test_bench_refusing_a_file_gives_its_message(tmp_path):
    """llama-bench prints '[' and exits 1 on a file it cannot load (verbatim stdout/stderr)."""
    with pytest.raises(peers.PeerError, match="no JSON result list"):
        peers.parse_bench_json(fx("bench-refused-file.out"))
    peer = _fake_peer(tmp_path, stdout=fx("bench-refused-file.out"), stderr=fx("bench-refused-file.err"), rc=1)
    with pytest.raises(peers.PeerError, match=r"exited 1: .*failed to load model '/tmp/peerx/trunc.gguf'"):
        peers.run_peer(peer, ["bench", "-m", "x.gguf"], tmp_path / "raw.txt")
    assert "failed to load model" in (tmp_path / "raw.txt").read_text()


def test_binary_without_cublas_gives_the_loader_line(tmp_path):
    peer = _fake_peer(tmp_path, stdout="", stderr=fx("tbo-no-cublas.err"), rc=127)
    with pytest.raises(peers.PeerError, match=r"cannot start: error while loading shared libraries: libcublas.so.13"):
        peers.run_peer(peer, ["tbo", "perf"], tmp_path / "raw.txt")


def test_missing_peer_build_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(peers.PeerError, match="no peer build at"):
        peers.unpack_tarball(tmp_path / "none.tar.xz", tmp_path / "x")
    rc = cli_main(["peers", "mmq", "--peer", str(tmp_path / "none"), "--out", str(tmp_path / "o")])
    assert rc == 2 and "not a peer build" in capsys.readouterr().err
    rc = cli_main(["peers", "bench", "--model", "synthetic-7b", "--peer", str(tmp_path / "none.tar.xz"),
                   "--out", str(tmp_path / "o")])
    assert rc == 2 and "no peer build at" in capsys.readouterr().err


def _fake_peer(d: Path, stdout: str, stderr: str, rc: int) -> Path:
    p = d / "fakepeer"
    p.mkdir(exist_ok=True)
    (p / "out.txt").write_text(stdout)
    (p / "err.txt").write_text(stderr)
    (p / "run.sh").write_text(f'#!/bin/bash\ncat "$(dirname "$0")/out.txt"\ncat "$(dirname "$0")/err.txt" >&2\nexit {rc}\n')
    return p


# ------------------------------------------------------------------------------------------------------
# the one-call GPU run, end to end with a stand-in run.sh (outputs in the tools' formats)
# ------------------------------------------------------------------------------------------------------
STANDIN_RUN_SH = r"""#!/bin/bash
# stand-in for the peer's run.sh: prints test-backend-ops / llama-bench output in their formats
mode="$1"; shift
case "$mode" in
  env) echo "== ldd bin/test-backend-ops"; echo "	libcublas.so.13 => /x/libcublas.so.13" ;;
  tbo) if [ -n "${STANDIN_NO_CUDA:-}" ]; then cat "$(dirname "$0")/nocuda.sql"; echo "ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected" >&2; exit 0; fi
       file=""; sql=""; while [ $# -gt 0 ]; do [ "$1" = --test-file ] && file="$2"; [ "$1" = --output ] && sql="$2"; shift; done
       [ "$sql" = sql ] || { echo "stand-in: only --output sql" >&2; exit 1; }
       cat "$(dirname "$0")/nocuda.sql"
       ins="INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('t', 'c', 'CUDA0', 'MUL_MAT'"
       if [ -n "$file" ]; then
         while read -r op t m n a b c ns s0 k m0 rest; do
           echo "$ins, 'name=lab,type=f32,ne=[$m,$n,1,1],op_params=[],sources=$([ $s0 = 12 ] && echo q4_K || echo q6_K)[$k,$m,1,1],f32[$k,$n,1,1]', 'perf', '1', '1', '', '$((n + 100)).000000', '0.000000', '10.22', '75', '100', '', '');"
         done < "$file"
       else
         echo "$ins, 'type_a=q4_K,type_b=f32,m=4096,n=512,k=14336,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1,src_overlap=0,m_v=0,pad=0', 'perf', '1', '1', '', '999.000000', '60.0', '0.0', '75', '10', '', '');"
       fi ;;
  bench) sed 's/"gpu_info": ""/"gpu_info": "NVIDIA H200"/' "$(dirname "$0")/bench.json" ;;
esac
"""


def _standin_tarball(tmp_path):
    stage = tmp_path / "stage" / "llamacpp"
    stage.mkdir(parents=True)
    (stage / "run.sh").write_text(STANDIN_RUN_SH)
    (stage / "BUILD.txt").write_text(fx("BUILD-prebuilt-sm90.txt"))
    (stage / "bench.json").write_text(fx("bench-tiny-llama-cpu.json"))
    (stage / "nocuda.sql").write_text(fx("tbo-perf-no-cuda-device.sql"))
    tb = tmp_path / peers.TARBALL_NAME
    with tarfile.open(tb, "w:xz") as tf:
        tf.add(stage, arcname="llamacpp")
    model = tmp_path / "tiny-llama.gguf"
    model.write_bytes(b"GGUF")
    return tb, model


def test_gpu_run_records_one_run_and_pairs(tmp_path, monkeypatch):
    tb, model = _standin_tarball(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(peers.run, "gpu_name", lambda: H200)
    monkeypatch.setattr(peers.run, "gpu_cc", lambda: 900)
    run_id = peers.gpu_run(tb, tmp_path / "out", models=[str(model)], progress=lambda m: None)
    root = tmp_path / "out" / "data"
    run = records.load(peers.ROUND, run_id, root)
    assert run.meta["status"] == "complete" and run.meta["params"]["peer_recipe_matches"] is True
    mmq = run.table("mmq")
    assert len(mmq[mmq.source == "testfile"]) == 72 and run.meta["summary"]["mmq_missing"] == []
    assert (tmp_path / "out" / "peers-raw" / "tbo-testfile.txt").is_file()
    bench = run.table("bench")
    assert set(bench.model) == {"tiny-llama"} and list(bench.flash_attn) == [1, 1, 0, 0]
    # the recorded run pairs: lab q4_K at 11008x4096, nt=512 vs the stand-in's 612 us
    lab = pd.DataFrame({"od": [11008], "id": [4096], "nt": [512], "tops_eq": [100.0]})
    res = peers.mmq_vs_llama(lab, H200, qtype="q4_K", root=root)
    llama = 2 * 11008 * 4096 * 512 / 612e-6 / 1e12
    assert res.run_id == run_id and res.table.vs_llama.iloc[0] == pytest.approx(100.0 / llama)


# ------------------------------------------------------------------------------------------------------
# pairing
# ------------------------------------------------------------------------------------------------------
def _peer_run(root, mmq=None, bench=None, gpu=H200, finish=True):
    run = records.new_run(peers.ROUND, {"gpu_name": gpu, "peer_commit": peers.RECIPE["source"]["commit"]}, root=root)
    if mmq is not None:
        run.append("mmq", mmq)
    if bench is not None:
        run.append("bench", bench)
    if finish:
        run.finish()
    return run


def _mmq_rows(rows):
    return pd.DataFrame([{"source": s, "type": t, "m": m, "n": n, "k": k, "runs": 10, "us_per_run": us,
                          "tflops": 2 * m * n * k / (us * 1e-6) / 1e12, "path": peers.llama_path(t, n)}
                         for s, t, m, n, k, us in rows])


def test_mmq_pairs_only_matched_type_shape_nt(tmp_path):
    peer = _peer_run(tmp_path, mmq=_mmq_rows([
        ("testfile", "q6_K", 4096, 512, 4096, 200.0),
        ("testfile", "q6_K", 4096, 4096, 11008, 4000.0),
        ("testfile", "q4_K", 4096, 3328, 4096, 300.0),    # other type at the lab's q6_K shape/nt: no pair
        ("builtin", "q6_K", 4096, 512, 4096, 150.0),      # same key as a testfile row: the testfile row wins
    ]))
    lab = pd.DataFrame({"od": [4096, 4096, 4096, 11008], "id": [4096, 11008, 4096, 4096],
                        "nt": [512, 4096, 3328, 512], "variant": ["expb", "expb", "expb", "generic"],
                        "tops_eq": [80.0, 90.0, 70.0, 60.0]})
    res = peers.mmq_vs_llama(lab, H200, qtype="q6_K", root=tmp_path)
    assert res.ok and res.run_id == peer.run_id and peer.run_id in res.message
    t = res.table
    assert list(zip(t.od, t.id, t.nt)) == [(4096, 4096, 512), (4096, 11008, 4096)]
    llama = [2 * 4096 * 512 * 4096 / 200e-6 / 1e12, 2 * 4096 * 4096 * 11008 / 4000e-6 / 1e12]
    assert list(t.vs_llama) == pytest.approx([80.0 / llama[0], 90.0 / llama[1]])
    assert list(t.llama_case) == ["testfile", "testfile"] and list(t.variant) == ["expb", "expb"]
    assert res.unmatched == [("q6_K", 4096, 4096, 3328), ("q6_K", 11008, 4096, 512)]
    assert "2 of 4 lab rows matched" in res.message
    # the page's line on the unmatched points names their nt and the n llama.cpp was measured at
    assert res.peer_nts == [512, 3328, 4096]
    assert res.unmatched_note() == ("no peer measurement for 2 lab point(s) at nt = 512, 3328 "
                                    "(llama.cpp measured n = 512, 3328, 4096 only)")
    full = peers.mmq_vs_llama(lab.iloc[:2], H200, qtype="q6_K", root=tmp_path)
    assert full.unmatched == [] and full.unmatched_note() == ""


def test_no_peer_measurement_never_a_stale_or_mismatched_run(tmp_path):
    lab = pd.DataFrame({"qtype": ["q4_K"], "od": [4096], "id": [4096], "nt": [512], "tops_eq": [100.0]})
    res = peers.mmq_vs_llama(lab, H200, root=tmp_path)
    assert not res.ok and res.table.empty and res.message.startswith("no peer measurement: no recorded peers run")
    other = _peer_run(tmp_path, mmq=_mmq_rows([("testfile", "q4_K", 4096, 512, 4096, 100.0)]), gpu="NVIDIA A100-SXM4-80GB")
    res = peers.mmq_vs_llama(lab, H200, root=tmp_path)
    assert not res.ok and f"run {other.run_id} ran on NVIDIA A100-SXM4-80GB, not {H200}" in res.message
    _peer_run(tmp_path, mmq=_mmq_rows([("testfile", "q4_K", 4096, 512, 4096, 100.0)]), finish=False)
    assert not peers.mmq_vs_llama(lab, H200, root=tmp_path).ok  # a run still running is never used
    assert "no peer measurement: no run nope" in peers.mmq_vs_llama(lab, H200, peer_run_id="nope", root=tmp_path).message
    assert "records no GPU model" in peers.mmq_vs_llama(lab, None, root=tmp_path).message
    _peer_run(tmp_path, mmq=_mmq_rows([("testfile", "q4_K", 4096, 64, 4096, 100.0)]))
    res = peers.mmq_vs_llama(lab, H200, root=tmp_path)  # a same-GPU run without the lab's point
    assert not res.ok and "none of the lab's" in res.message and res.unmatched == [("q4_K", 4096, 4096, 512)]
    with pytest.raises(ValueError, match="qtype"):
        peers.mmq_vs_llama(lab.drop(columns="qtype"), H200, root=tmp_path)


def test_named_peer_run_is_the_one_used(tmp_path):
    lab = pd.DataFrame({"qtype": ["q4_K"], "od": [4096], "id": [4096], "nt": [512], "tops_eq": [100.0]})
    first = _peer_run(tmp_path, mmq=_mmq_rows([("testfile", "q4_K", 4096, 512, 4096, 100.0)]))
    _peer_run(tmp_path, mmq=_mmq_rows([("testfile", "q4_K", 4096, 512, 4096, 50.0)]))
    latest = peers.mmq_vs_llama(lab, H200, root=tmp_path)
    named = peers.mmq_vs_llama(lab, H200, peer_run_id=first.run_id, root=tmp_path)
    assert named.run_id == first.run_id != latest.run_id
    assert named.table.llama_us.iloc[0] == 100.0 and latest.table.llama_us.iloc[0] == 50.0


def _bench_rows(rows):
    return pd.DataFrame([{"model": m, "model_filename": f"{m}.gguf", "n_prompt": nt, "n_gen": 0, "flash_attn": fa,
                          "n_ubatch": 512, "tok_s": ts, "tok_s_std": ts / 100, "tok_s_min": ts * 0.99,
                          "tok_s_max": ts * 1.01, "reps": 3} for m, nt, fa, ts in rows])


def test_prefill_pairs_same_file_and_nt(tmp_path):
    peer = _peer_run(tmp_path, bench=_bench_rows([("synthetic-7b", 512, 1, 9000.0), ("synthetic-7b", 512, 0, 8000.0),
                                                  ("synthetic-7b", 3325, 1, 7000.0),
                                                  ("gemma-3-270m-q4_k_m", 3325, 1, 90000.0)]))
    lab = pd.DataFrame({"model": ["synthetic-7b", "synthetic-7b", "gemma-3-270m-q4_k_m"], "nt": [512, 3325, 512],
                        "tok_per_s": [9212.2, 8472.8, 19504.5]})
    res = peers.prefill_vs_llama(lab, H200, root=tmp_path)
    assert res.run_id == peer.run_id
    t = res.table
    assert list(zip(t.model, t.nt, t.flash_attn)) == [("synthetic-7b", 512, 1), ("synthetic-7b", 512, 0),
                                                     ("synthetic-7b", 3325, 1)]
    assert list(t.vs_llama) == pytest.approx([9212.2 / 9000, 9212.2 / 8000, 8472.8 / 7000])
    assert res.unmatched == [("gemma-3-270m-q4_k_m", 512)]  # gemma measured by llama.cpp only at 3325
    fa1 = peers.prefill_vs_llama(lab, H200, root=tmp_path, flash_attn=1)
    assert list(fa1.table.flash_attn) == [1, 1]
    none = peers.prefill_vs_llama(lab[lab.model == "gemma-3-270m-q4_k_m"], H200, root=tmp_path)
    assert not none.ok and none.message.startswith("no peer measurement")
    assert peers.prefill_vs_llama(lab, "NVIDIA A100", root=tmp_path).message.startswith("no peer measurement")


def test_classes_vs_llama_per_gmac(tmp_path):
    _peer_run(tmp_path, mmq=_mmq_rows([("testfile", "q4_K", 11008, 3325, 4096, 900.0),
                                       ("testfile", "q6_K", 4096, 3325, 11008, 1200.0)]))
    classes = pd.DataFrame({"class": ["attention_gemm", "gemm_q4k:ffn_gate", "gemm_q6k:ffn_down", "gemm_q4k:attn_q"],
                            "us_per_gmac": [float("nan"), 11.17, 30.0, 12.0]})
    res = peers.classes_vs_llama(classes, 3325, H200, root=tmp_path)
    t = res.table
    assert list(t["class"]) == ["gemm_q4k:ffn_gate", "gemm_q6k:ffn_down"]  # attn_q: no llama point at 4096x4096
    gmac = 11008 * 4096 * 3325 / 1e9
    assert t.llama_us_per_gmac.iloc[0] == pytest.approx(900.0 / gmac)
    assert t.us_per_gmac_ratio.iloc[0] == pytest.approx(11.17 / (900.0 / gmac))
    assert list(t.lab_nt) == [3325, 3325] and list(t.llama_n) == [3325, 3325]
    assert "no peer measurement" in peers.classes_vs_llama(classes.iloc[:1], 3325, H200, root=tmp_path).message
    # llama.cpp's own prefill runs its GEMMs at n_ubatch=512: compare against that n when asked
    _peer_run(tmp_path, mmq=_mmq_rows([("testfile", "q4_K", 11008, 512, 4096, 150.0)]))
    at512 = peers.classes_vs_llama(classes, 3325, H200, root=tmp_path, llama_n=512)
    assert list(at512.table["class"]) == ["gemm_q4k:ffn_gate"] and list(at512.table.llama_n) == [512]
    assert at512.table.llama_us_per_gmac.iloc[0] == pytest.approx(150.0 / (11008 * 4096 * 512 / 1e9))


def test_committed_peer_runs_are_well_formed():
    """Recorded peers runs under data/ (when any) have the tables the pairing reads."""
    from labkernels.paths import DATA_DIR

    for run in records.list_runs(peers.ROUND, DATA_DIR):
        if run.has("mmq"):
            assert {"type", "m", "n", "k", "us_per_run", "tflops", "path"} <= set(run.table("mmq").columns)
        if run.has("bench"):
            assert {"model", "n_prompt", "flash_attn", "tok_s", "tok_s_std"} <= set(run.table("bench").columns)
        assert peers.run_gpu_name(run)


def test_gpu_run_keeps_the_part_that_worked(tmp_path, monkeypatch):
    """No CUDA device for test-backend-ops: the run records mmq_error and still the llama-bench table."""
    tb, model = _standin_tarball(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("STANDIN_NO_CUDA", "1")
    monkeypatch.setattr(peers.run, "gpu_name", lambda: H200)
    run_id = peers.gpu_run(tb, tmp_path / "out", models=[str(model), str(tmp_path / "missing.gguf")],
                           progress=lambda m: None)
    run = records.load(peers.ROUND, run_id, tmp_path / "out" / "data")
    s = run.meta["summary"]
    assert run.meta["status"] == "complete" and run.meta["tables"] == ["bench"]
    assert "tested no CUDA0 backend" in s["mmq_error"] and "no CUDA-capable device" in s["mmq_error"]
    assert list(s["bench_errors"]) == ["missing"] and "no model file" in s["bench_errors"]["missing"]
    lab = pd.DataFrame({"qtype": ["q4_K"], "od": [4096], "id": [4096], "nt": [512], "tops_eq": [100.0]})
    res = peers.mmq_vs_llama(lab, H200, root=tmp_path / "out" / "data")
    assert not res.ok and f"run {run_id} has no mmq table" in res.message


def test_build_status_and_worker_failure(tmp_path, monkeypatch, capsys):
    dest = tmp_path / "cache"
    assert cli_main(["peers", "build", "--status", "--dest", str(dest)]) == 0
    assert "no build log" in capsys.readouterr().out
    dest.mkdir()
    (dest / "build.log").write_text("fetching\n[3/287] Building CUDA object ggml/src/ggml-cuda/acc.cu.o\n")
    assert cli_main(["peers", "build", "--status", "--dest", str(dest)]) == 0
    assert "ninja [3/287] (1%)" in capsys.readouterr().out

    def boom(*a, **k):
        raise peers.PeerError("local toolchain {'gcc': '13'} != pinned")
    monkeypatch.setattr(peers.cli, "build_from_source", boom)
    assert cli_main(["peers", "build", "--worker", "--dest", str(dest), "--work", str(tmp_path / "w")]) == 1
    assert "BUILD FAILED: local toolchain" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").environ.get("LABKERNELS_PEERS_NETWORK"),
                    reason="downloads 500 MB from PyPI: set LABKERNELS_PEERS_NETWORK=1")
def test_recipe_first_steps_from_pypi(tmp_path):
    """The real recipe: pip download of the pinned sdist + sha256, its vendored commit, the cuBLAS wheel."""
    tree = peers.extract_source(peers.fetch_pinned("source", tmp_path), tmp_path)
    assert peers.vendored_commit(tree) == peers.RECIPE["source"]["commit"]
    assert (tree / "tests" / "test-backend-ops.cpp").is_file() and (tree / "tools" / "llama-bench").is_dir()
    prefix = peers.unpack_cublas(peers.fetch_pinned("cublas", tmp_path), tmp_path)
    assert (prefix / "lib" / "libcublasLt.so").resolve().name == "libcublasLt.so.13"


def test_prefill_vs_llama_takes_the_latest_peer_run_of_that_model(tmp_path):
    """A later llama-bench run of another model (Gemma) does not hide the latest one of this model (the 7B)."""
    import pandas as pd

    from labkernels import peers, records

    def bench_run(model, tok):
        run = records.new_run(peers.ROUND, {"what": "bench"}, root=tmp_path)
        run.meta["provenance"] = {**run.meta.get("provenance", {}), "gpu": {"name": "NVIDIA H200"}}
        run.append("bench", [{"model": model, "n_prompt": 512, "n_gen": 0, "flash_attn": 1, "n_ubatch": 512,
                              "tok_s": tok, "tok_s_std": 1.0, "tok_s_min": tok, "tok_s_max": tok}])
        run.finish()
        return run.run_id

    first = bench_run("synthetic-7b", 9000.0)
    import time
    time.sleep(1.1)
    bench_run("gemma", 50000.0)
    lab = pd.DataFrame([{"model": "synthetic-7b", "nt": 512, "tok_per_s": 18000.0}])
    pv = peers.prefill_vs_llama(lab, "NVIDIA H200", root=tmp_path)
    assert pv.ok and pv.run_id == first and float(pv.table.vs_llama.iloc[0]) == 2.0


def test_prefill_pairs_a_bench_row_by_its_model_type(tmp_path):
    """A llama-bench row labelled by the file name it was given on the GPU machine ('gemma' for /tmp/gemma.gguf)
    pairs with the lab's label of the same GGUF through llama-bench's model_type; an unknown type keeps its label."""
    rows = _bench_rows([("gemma", 512, 1, 50000.0), ("other", 512, 1, 1.0)])
    rows["model_type"] = ["gemma3 270M Q4_K - Medium", "llama 7B Q4_K - Medium"]
    _peer_run(tmp_path, bench=rows)
    lab = pd.DataFrame({"model": ["gemma-3-270m-q4_k_m", "other"], "nt": [512, 512], "tok_per_s": [300000.0, 2.0]})
    res = peers.prefill_vs_llama(lab, H200, root=tmp_path)
    assert list(zip(res.table.model, res.table.vs_llama)) == [("gemma-3-270m-q4_k_m", 6.0), ("other", 2.0)]
    assert list(peers.lab_labels(rows)) == ["gemma-3-270m-q4_k_m", "other"]


def test_latest_prefill_vs_llama_reads_the_latest_run_of_that_model(tmp_path):
    """The latest prefill throughput run of the model (medians over its rounds per nt / kernel / mode) against
    llama-bench with flash attention on; a model with no recorded throughput says so."""
    rows = _bench_rows([("gemma", 512, 1, 50000.0), ("gemma", 512, 0, 40000.0)])
    rows["model_type"] = "gemma3 270M Q4_K - Medium"
    _peer_run(tmp_path, bench=rows)
    for tok in ((100000.0, 120000.0), (300000.0, 310000.0, 290000.0)):
        r = records.new_run("prefill", {"gpu_name": H200}, root=tmp_path)
        r.append("throughput", [{"model": "gemma-3-270m-q4_k_m", "nt": 512, "kernel": "auto", "mode": "graph",
                                 "tok_per_s": t, "round": i} for i, t in enumerate(tok)])
        r.finish()
    c = peers.latest_prefill_vs_llama("gemma-3-270m-q4_k_m", root=tmp_path)
    assert c.ok and list(c.table.flash_attn) == [1] and c.table.rounds.iloc[0] == 3
    assert c.table.vs_llama.iloc[0] == pytest.approx(6.0) and r.run_id in c.message
    assert len(peers.latest_prefill_vs_llama("gemma-3-270m-q4_k_m", flash_attn=None, root=tmp_path).table) == 2
    none = peers.latest_prefill_vs_llama("synthetic-7b", root=tmp_path)
    assert not none.ok and "no recorded prefill throughput of synthetic-7b" in none.message


def test_bench_args_for_decode_add_generation_and_prompt_then_generation():
    from labkernels import peers

    assert peers.bench_args((512,), (1,), 3) == ["-p", "512", "-n", "0", "-fa", "1", "-ngl", "99", "-r", "3"]
    a = peers.bench_args((512,), (1,), 3, gen=(128,), pg=((512, 128),))
    assert a == ["-p", "512", "-n", "128", "-fa", "1", "-ngl", "99", "-r", "3", "-pg", "512,128"]
    with pytest.raises(peers.PeerError, match="positive integers"):
        peers.bench_args((512,), (1,), 3, gen=(0,))


def test_bench_json_rows_name_generation_tests():
    import json

    from labkernels import peers

    item = {"model_filename": "/m/x.gguf", "model_type": "llama 7B Q4_K - Medium", "model_size": 4080000000,
            "n_prompt": 0, "n_gen": 128, "flash_attn": 1, "n_gpu_layers": 99, "n_batch": 2048, "n_ubatch": 512,
            "backends": "CUDA", "gpu_info": "NVIDIA H100 80GB HBM3", "build_commit": "0c1e570", "avg_ts": 289.0,
            "stddev_ts": 1.5, "samples_ts": [288.0, 289.0, 290.0]}
    df = peers.parse_bench_json(json.dumps([item, {**item, "n_prompt": 512, "n_gen": 128, "avg_ts": 1500.0}]))
    assert list(zip(df.n_prompt, df.n_gen)) == [(0, 128), (512, 128)] and df.tok_s.iloc[0] == 289.0


def test_synthetic_models_llama_bench_can_be_given(tmp_path):
    """llama-bench's synthetic models are the lab's own (label kept for pairing); another name is refused, not
    looked up as a path."""
    assert peers.model_label("synthetic-gemma3") == "synthetic-gemma3"
    assert peers.model_label("llama7b") == "synthetic-7b"
    assert peers.model_label("/x/Gemma-3.gguf") == "gemma-3"
    with pytest.raises(peers.PeerError, match="no synthetic model"):
        peers.synthetic_gguf("synthetic-13b", tmp_path / "x.gguf")
