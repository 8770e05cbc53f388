"""llama.cpp as a measured peer: a pinned build, its MUL_MAT kernels and llama-bench, and vs-llama ratios.

One module a job (this package re-exports their public names: ``peers.X`` and ``from labkernels.peers import X``):

* :mod:`.recipe` -- **the pinned recipe** (:data:`RECIPE`): the llama.cpp tree vendored in the llama-cpp-python
  0.3.36 sdist on PyPI (sha256 pinned; its ``vendor/llama.cpp`` git metadata names commit 0c1e5709...), cuBLAS
  headers and libraries from the PyPI ``nvidia-cublas`` 13.0.2.14 wheel (sha256 pinned), a generated libcuda stub,
  and the exact cmake flags of the build record. ``labkernels peers build`` reuses the prebuilt tarball in
  ``../shared/peers/`` when its BUILD record matches the recipe (:func:`record_mismatches`) and its sha256
  checks, else builds ``test-backend-ops`` + ``llama-bench`` in the background (progress from ninja's log)
  and packages ``data/cache/peers/llamacpp-sm90.tar.xz`` (binaries, own libraries, BUILD record, run.sh).
* :mod:`.run` -- **measurements** (GPU machine): ``peers mmq`` runs ``test-backend-ops perf -o MUL_MAT -b CUDA0
  --output sql`` (the tool's structured output, read through SQLite: :func:`tbo_results`) on the
  lab's shapes through ``--test-file`` (generic MUL_MAT ops: llama.cpp's own perf list holds only
  m=4096, k=14336 and a few q4_K k=4096 mat-vec cases, see :data:`BUILTIN_PERF_CASES`) plus the built-in
  q4_K/q6_K cases as a cross-check; ``peers bench`` runs ``llama-bench -o json``. Both are recorded under
  ``data/peers/`` (:mod:`labkernels.records`). :func:`llama_path` says which kernel llama.cpp takes per n.
* :mod:`.compare` -- **pairing**: :func:`mmq_vs_llama`, :func:`prefill_vs_llama` and :func:`classes_vs_llama` form
  ratios only for matched (type, m, n, k) / (model, nt) keys from one named peer run on the same GPU model, and
  return a :class:`PeerComparison` whose message says "no peer measurement: <why>" when there is none.
* :mod:`.cli` -- the ``labkernels peers build | mmq | bench | gpu-run`` command line (:func:`register_cli`).

A test that patches a function patches it on the submodule that looks it up (``peers.run.gpu_name``,
``peers.recipe._pip_download``, ``peers.cli.build_from_source``): a name re-exported here is a copy of the binding.
"""

from __future__ import annotations

from . import cli, compare, recipe, run
from .cli import bench_main, build_main, build_plan, gpu_run_main, mmq_main, register_cli
from .compare import (BENCH_NOTES, LAB_LABELS, LLAMA7B_ROLE_SHAPES, MMQ_NOTES, PeerComparison, classes_vs_llama,
                      find_peer_run, lab_labels, latest_prefill_vs_llama, mmq_vs_llama, peer_mmq_table,
                      prefill_vs_llama, run_gpu_name, with_cudnn)
from .recipe import (CMAKE_FLAGS, CUDA_ERROR_STUB_LIBRARY, NINJA_PROGRESS, PEERS_CACHE, RECIPE, RUN_SH, SHARED_PEERS,
                     TARBALL_NAME, PeerError, build_from_source, build_progress, check_prebuilt, cmake_command,
                     commit_line, cuda_driver_symbols, extract_source, fetch_pinned, format_build_record,
                     local_toolchain, make_libcuda_stub, package, parse_build_record, read_sha256_file,
                     record_mismatches, reuse_prebuilt, sha256_file, tarball_record, unpack_cublas, vendored_commit)
from .run import (ANSI, BENCH_ARGS, BENCH_PROMPTS, BUILTIN_PERF_CASES, EXTRA_NTS, GGML_MAX_OP_PARAMS_I32,
                  GGML_OP_MUL_MAT, GGML_TYPE_ID, LAB_NTS, LAB_SHAPES, MMVQ_MAX_BATCH_SIZE, PEER_TYPES, ROUND,
                  SYNTHETIC_LABELS, TBO_OUTPUT, bench_args, check_tbo_backend, gpu_cc, gpu_name, gpu_run, llama_path,
                  measure_bench, measure_mmq, model_label, parse_bench_json, parse_tbo_perf, run_peer,
                  synthetic_7b_gguf, synthetic_gguf, tbo_results, tbo_test_file, unpack_tarball)

__all__ = [
    # recipe: how llama.cpp is built, found and verified
    "PEERS_CACHE", "TARBALL_NAME", "SHARED_PEERS", "PeerError", "CMAKE_FLAGS", "RECIPE", "parse_build_record",
    "record_mismatches", "format_build_record", "sha256_file", "read_sha256_file", "tarball_record", "check_prebuilt",
    "reuse_prebuilt", "fetch_pinned", "extract_source", "vendored_commit", "commit_line", "unpack_cublas",
    "cuda_driver_symbols", "CUDA_ERROR_STUB_LIBRARY", "make_libcuda_stub", "local_toolchain", "cmake_command",
    "NINJA_PROGRESS", "build_progress", "RUN_SH", "package", "build_from_source",
    # run: running the peer tools and parsing their output
    "ROUND", "MMVQ_MAX_BATCH_SIZE", "llama_path", "LAB_SHAPES", "LAB_NTS", "EXTRA_NTS", "PEER_TYPES",
    "BUILTIN_PERF_CASES", "GGML_OP_MUL_MAT", "GGML_TYPE_ID", "GGML_MAX_OP_PARAMS_I32", "tbo_test_file", "ANSI",
    "TBO_OUTPUT", "tbo_results", "parse_tbo_perf", "BENCH_PROMPTS", "bench_args", "BENCH_ARGS", "parse_bench_json",
    "unpack_tarball", "run_peer", "gpu_name", "check_tbo_backend", "gpu_cc", "measure_mmq", "model_label",
    "SYNTHETIC_LABELS", "synthetic_gguf", "synthetic_7b_gguf", "measure_bench", "gpu_run",
    # compare: the lab against the peer
    "MMQ_NOTES", "BENCH_NOTES", "PeerComparison", "run_gpu_name", "LAB_LABELS", "lab_labels", "find_peer_run",
    "peer_mmq_table", "mmq_vs_llama", "prefill_vs_llama", "with_cudnn", "latest_prefill_vs_llama",
    "LLAMA7B_ROLE_SHAPES", "classes_vs_llama",
    # cli: the command line
    "build_plan", "build_main", "mmq_main", "bench_main", "gpu_run_main", "register_cli",
]
