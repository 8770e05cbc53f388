"""labkernels.attention on CPU: FLOP counting, the option plumbing, the fallback / error paths (no cuDNN frontend,
unsupported shapes), the bf16 rounding, and the fused-path plumbing (casts, fp16 output) with a numpy SDPA stand-in
inside the CPU shim of the prefill."""
import os
import sys
import types

import numpy as np
import pytest

from labkernels import attention, attention_kinds, attention_libs
from labkernels.rounds.r05_wall import attention_bench
from labkernels.attention_kinds import AttentionError, AttentionUnavailable, LayerKind


def _exact_pairs(n, window):
    from labkernels.prefill_ref import attention_mask
    from labkernels.synthetic import tiny_config

    cfg = tiny_config("gemma3", n_layer=6, sliding_window=window or 8)
    il = 0 if window else 5                      # layer 0 slides, layer 5 is global (pattern 6)
    return int(attention_mask(cfg, il, np.arange(n)).sum())


@pytest.mark.parametrize("n,window", [(1, 0), (7, 0), (100, 0), (100, 8), (100, 99), (100, 100), (37, 200)])
def test_visible_pairs_is_the_band_area(n, window):
    """The exact pair count of llama.cpp's mask (prefill_ref) is the band area plus half the diagonal: n/2 causal,
    w/2 with a window w < n; a window >= n is plain causal."""
    exact = _exact_pairs(n, window)
    area = attention_kinds.visible_pairs(n, window)
    w = window if window and window < n else n
    assert exact == pytest.approx(area + w / 2)
    if not window or window >= n:
        assert area == n * n / 2


def test_flops():
    k = LayerKind(32, 32, 128, 128)
    n = 3325
    assert attention_kinds.attention_flops(n, k) == 2 * 32 * 256 * n * n / 2
    assert attention_kinds.dense_flops(n, k) == 2 * attention_kinds.attention_flops(n, k)        # causal counted as half
    g = LayerKind(4, 1, 256, 256, window=512)
    assert attention_kinds.attention_flops(n, g) == 2 * 4 * 512 * (n * n / 2 - (n - 512) ** 2 / 2)
    assert attention_kinds.attention_flops(300, g) == attention_kinds.attention_flops(300, LayerKind(4, 1, 256, 256))
    # the baseline's trace tags count the full n x n products: the dense FLOPs
    assert attention_kinds.dense_flops(n, k) == 2 * 32 * n * n * 128 + 2 * 32 * n * n * 128
    with pytest.raises(ValueError):
        attention_kinds.visible_pairs(-1)


def test_layer_kinds_of_the_models(model):
    """The benchmark's Gemma 3 270M layout is the real model's (heads, dims, window, scale; both layer kinds)."""
    from labkernels.arch import config_from_model
    from labkernels.synthetic import llama7b_config

    cfg = config_from_model(model)
    kinds = attention_kinds.model_kinds(cfg, scale=cfg.attn_scale)
    lay = attention_kinds.bench_layouts()
    assert set(kinds) == set(lay["gemma-3-270m"].values())
    assert [il for k, ls in kinds.items() if not k.window for il in ls] == [5, 11, 17]   # the global layers
    c7 = llama7b_config()
    assert set(attention_kinds.model_kinds(c7, scale=c7.attn_scale)) == set(lay["synthetic-7b"].values())
    assert LayerKind(4, 1, 256, 256, 512).at(400).window == 0 and LayerKind(4, 1, 256, 256, 512).at(513).window == 512


def test_options_are_checked():
    from labkernels.prefill import PrefillOptions

    assert PrefillOptions().attention == "auto"
    with pytest.raises(ValueError, match="unknown attention path 'flash'"):
        PrefillOptions(attention="flash")
    with pytest.raises(ValueError, match="attention dtype"):
        PrefillOptions(attn_dtype="fp8")
    with pytest.raises(ValueError, match="unknown attention path"):
        attention.resolve("flash", None)


def _no_frontend(monkeypatch, gpu=True):
    """A machine (with a GPU) without the cuDNN frontend (the import of 'cudnn' fails)."""
    import labkernels.provenance as prov

    if gpu:
        monkeypatch.setattr(prov, "gpu_available", lambda: True)
    monkeypatch.setitem(sys.modules, "cudnn", None)          # import cudnn -> ImportError
    monkeypatch.setattr(attention_libs, "_CUDNN", {})
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", None)    # and no cuda-pathfinder to load libcudnn


class _NotFound(RuntimeError):
    """cuda-pathfinder's DynamicLibNotFoundError (a RuntimeError)."""


def _fake_pathfinder(monkeypatch, version="1.9.0", result=None, error=None):
    """A stand-in ``cuda.pathfinder`` (its public names: __version__, load_nvidia_dynamic_lib, LoadedDL's abs_path /
    found_via, DynamicLibNotFoundError); returns the list of library names it was asked to load."""
    asked = []

    def load(libname):
        asked.append(libname)
        if error is not None:
            raise error
        return result

    m = types.ModuleType("cuda.pathfinder")
    m.__version__, m.load_nvidia_dynamic_lib, m.DynamicLibNotFoundError = version, load, _NotFound
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", m)
    monkeypatch.setattr(attention_libs, "_CUDNN", {})
    return asked


def _fake_frontend(monkeypatch):
    m = types.ModuleType("cudnn")
    m.__version__, m.backend_version = "1.32.0", lambda: 92100
    monkeypatch.setitem(sys.modules, "cudnn", m)
    return m


def test_libcudnn_found_by_pathfinder_goes_first_on_ld_library_path(monkeypatch):
    """cuda-pathfinder loads libcudnn.so.9; its folder goes first on LD_LIBRARY_PATH (where the frontend looks
    first), the path and how it was found are recorded with the frontend's versions."""
    lib = "/site/nvidia/cudnn/lib/libcudnn.so.9"
    asked = _fake_pathfinder(monkeypatch, result=types.SimpleNamespace(
        abs_path=lib, found_via="site-packages", was_already_loaded_from_elsewhere=False))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/cuda/lib64:/opt/x")
    fe = _fake_frontend(monkeypatch)
    assert attention.import_cudnn() is fe and asked == ["cudnn"]
    assert os.environ["LD_LIBRARY_PATH"] == "/site/nvidia/cudnn/lib:/usr/local/cuda/lib64:/opt/x"
    info = attention.cudnn_info()
    assert info == {"frontend": "1.32.0", "backend": 92100, "libcudnn": lib, "libcudnn_found_via": "site-packages",
                    "cuda_pathfinder": "1.9.0"}
    assert attention.status()["cudnn"] == info
    # without LD_LIBRARY_PATH it is the folder alone; a folder already first is not repeated
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert attention_libs._load_libcudnn()["path"] == lib and os.environ["LD_LIBRARY_PATH"] == "/site/nvidia/cudnn/lib"
    attention_libs._load_libcudnn()
    assert os.environ["LD_LIBRARY_PATH"] == "/site/nvidia/cudnn/lib"


def test_libcudnn_not_found_is_unavailable_with_pathfinders_reason(monkeypatch):
    """Nothing found: AttentionUnavailable naming cuda-pathfinder's reason (its first line: the rest lists folders),
    LD_LIBRARY_PATH untouched; without a frontend either, the error names both."""
    err = _NotFound('Failure finding "libcudnn.so.9": No such file: libcudnn.so.9\n  listdir("/site/nvidia"):\n    cu13')
    asked = _fake_pathfinder(monkeypatch, error=err)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/x")
    with pytest.raises(AttentionUnavailable, match=r"cuda-pathfinder 1\.9\.0 found no libcudnn\.so\.9.*_NotFound: "
                                                   r"Failure finding \"libcudnn\.so\.9\": No such file") as e:
        attention_libs._load_libcudnn()
    assert "listdir" not in str(e.value) and asked == ["cudnn"]
    assert os.environ["LD_LIBRARY_PATH"] == "/opt/x"
    monkeypatch.setitem(sys.modules, "cudnn", None)
    with pytest.raises(AttentionUnavailable) as e:
        attention.import_cudnn()
    msg = str(e.value)
    assert "nvidia-cudnn-frontend" in msg and "ModuleNotFoundError" in msg
    assert "libcudnn.so.9 was not loaded beforehand: cuda-pathfinder 1.9.0 found no libcudnn.so.9" in msg
    with pytest.raises(AttentionUnavailable, match="not loaded beforehand"):      # the error is cached
        attention.import_cudnn()


def test_libcudnn_without_pathfinder_or_too_old_says_so(monkeypatch):
    """No cuda-pathfinder (a CPU machine), one older than its cuDNN support (1.7.0: never asked), or a libcudnn it
    found but could not dlopen: each is AttentionUnavailable saying which."""
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", None)
    with pytest.raises(AttentionUnavailable, match=r"cuda-pathfinder \(Python package cuda-pathfinder, module "
                                                   r"cuda\.pathfinder\) is not installed: ModuleNotFoundError"):
        attention_libs._load_libcudnn()
    asked = _fake_pathfinder(monkeypatch, version="1.6.1")
    with pytest.raises(AttentionUnavailable, match=r"cuda-pathfinder 1\.6\.1 predates cuDNN support "
                                                   r"\(load_nvidia_dynamic_lib\('cudnn'\) since 1\.7\.0\)"):
        attention_libs._load_libcudnn()
    assert asked == []
    _fake_pathfinder(monkeypatch, version="1.7.0", error=RuntimeError("Failed to dlopen /x/libcudnn.so.9: bad ELF"))
    with pytest.raises(AttentionUnavailable, match=r"1\.7\.0 could not load libcudnn\.so\.9: RuntimeError: Failed"):
        attention_libs._load_libcudnn()
    assert attention_libs._version_tuple("1.10.2") == (1, 10, 2) and attention_libs._version_tuple("1.7.0rc1") == (1, 7, 0)


def test_a_frontend_that_finds_its_own_libcudnn_still_runs_said(monkeypatch, caplog):
    """cuda-pathfinder finds nothing but the frontend loads libcudnn itself (LD_LIBRARY_PATH, its purelib glob, the
    loader path): cuDNN is usable, the record says whose libcudnn it is and why, and a warning says so."""
    _fake_pathfinder(monkeypatch, error=_NotFound('Failure finding "libcudnn.so.9"'))
    fe = _fake_frontend(monkeypatch)
    with caplog.at_level("WARNING", logger="labkernels.attention"):
        assert attention.import_cudnn() is fe
    info = attention.cudnn_info()
    assert info["libcudnn"].startswith("the frontend's own (not loaded by cuda-pathfinder: cuda-pathfinder 1.9.0 "
                                       "found no libcudnn.so.9")
    assert info["libcudnn_found_via"] is None and info["backend"] == 92100
    assert any("found its own" in r.getMessage() for r in caplog.records)


def test_attention_re_exports_the_library_checks():
    """The library checks live in attention_libs; attention imports them at module level (resolve and the paths look
    them up in attention: a test that fakes cuDNN for resolve patches attention.import_cudnn; one that fakes the
    frontend's cache or libcudnn's loader patches attention_libs) and re-exports the public ones."""
    for name in ("import_cudnn", "cudnn_info", "status", "import_torch", "_gpu_ok"):
        assert getattr(attention, name) is getattr(attention_libs, name)


def test_the_lab_loads_no_library_through_ctypes():
    """Issue 49's bar: no module of labkernels loads a shared library through ctypes (CDLL / cdll / PyDLL /
    LibraryLoader / ctypes.util.find_library); libraries come through maintained loaders (cuda-pathfinder, CuPy,
    nvmath-python). ctypes' value holders (gpu.kernel_params) and numpy's ``a.ctypes.data`` are not loads."""
    import ast
    from pathlib import Path

    loaders = {"CDLL", "cdll", "PyDLL", "pydll", "LibraryLoader", "find_library", "WinDLL", "windll", "OleDLL"}
    hits = []
    for f in sorted((Path(attention.__file__).parent).rglob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in loaders:
                hits.append(f"{f.name}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ctypes"):
                hits += [f"{f.name}:{node.lineno} from {node.module} import {a.name}" for a in node.names
                         if a.name in loaders or node.module == "ctypes.util"]
    assert hits == []
    for mod in (attention, attention_libs):      # attention_libs loads libcudnn (through cuda-pathfinder)
        assert "import ctypes" not in Path(mod.__file__).read_text()


def test_auto_without_frontend_takes_the_lab_kernel_said(monkeypatch, caplog):
    """Without the cuDNN frontend, auto runs the lab's fused kernel where it takes every layer kind (fp16), and the
    baseline where it does not (a head dim it is not built for, bf16) -- each time with the reason, logged."""
    from labkernels.synthetic import tiny_config

    _no_frontend(monkeypatch)
    cfg = tiny_config("llama")
    with caplog.at_level("WARNING", logger="labkernels.attention"):
        name, note = attention.resolve("auto", cfg)
    assert name == "lab"
    assert "nvidia-cudnn-frontend" in note and "lab's fused kernel" in note and "ModuleNotFoundError" in note
    assert any("nvidia-cudnn-frontend" in r.getMessage() for r in caplog.records)   # said, not silent
    name, note = attention.resolve("auto", cfg, "bf16")
    assert name == "baseline" and "fp16 only, not bf16" in note and "nvidia-cudnn-frontend" in note
    name, note = attention.resolve("auto", cfg, f16=False)     # fp32 attention asked: the baseline's fp32 products
    assert name == "baseline" and "attn_f16 off" in note
    odd = tiny_config("gemma3", n_layer=2, n_embd=256, n_head=4, n_head_kv=1, head_dim=96, sliding_window=16)
    name, note = attention.resolve("auto", odd)
    assert name == "baseline" and "head dim 96 is not one the kernel is built for" in note
    b = attention.make("auto", odd, f16=True)
    assert isinstance(b, attention.Baseline) and b.f16
    assert b.describe() == {"attention": "baseline", "attention_dtype": "f16", "attention_note": note}
    # an explicit request for cuDNN is not quietly served by another path
    with pytest.raises(AttentionUnavailable, match="nvidia-cudnn-frontend"):
        attention.resolve("cudnn", cfg)


def test_auto_without_gpu_says_so(monkeypatch):
    import labkernels.provenance as prov
    from labkernels.synthetic import tiny_config

    monkeypatch.setattr(prov, "gpu_available", lambda: False)
    name, note = attention.resolve("auto", tiny_config("llama"))
    assert name == "baseline" and "no CUDA GPU" in note
    with pytest.raises(AttentionUnavailable, match="needs a CUDA GPU"):
        attention.resolve("torch", tiny_config("llama"))
    assert attention.resolve("baseline", tiny_config("llama")) == ("baseline", "requested")


def test_prefill_records_the_fallback(monkeypatch):
    """The prefill result carries which attention ran and why (GpuModel.attn), under the CPU shim."""
    from cpu_gpu_shim import install
    from labkernels.prefill import GpuModel, PrefillOptions
    from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config

    install(monkeypatch, exact=True)
    _no_frontend(monkeypatch)
    cfg = tiny_config("llama", n_layer=1, vocab=300)
    gm = GpuModel(SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=2), opts=PrefillOptions(attn_dtype="bf16"))
    d = gm.attn.describe()
    assert d["attention"] == "baseline" and "nvidia-cudnn-frontend" in d["attention_note"]
    assert "fp16 only" in d["attention_note"]
    with pytest.raises(AttentionUnavailable):
        GpuModel(SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=2), opts=PrefillOptions(attention="cudnn"))


def test_unsupported_kinds_name_layer_and_mask(monkeypatch):
    import labkernels.provenance as prov
    from labkernels.synthetic import tiny_config

    with pytest.raises(AttentionError, match=r"layer\(s\) 3 \(causal \+ sliding window 512.*head dim 512 exceeds 256"):
        attention_kinds.check_kind(LayerKind(4, 1, 512, 512, 512), "cudnn", 3)
    with pytest.raises(AttentionError, match="not multiples of 8"):
        attention_kinds.check_kind(LayerKind(4, 1, 60, 60), "cudnn", [0, 1])
    with pytest.raises(AttentionError, match="192/128"):
        attention_kinds.check_kind(LayerKind(4, 1, 128, 64), "cudnn", 0)
    assert attention_kinds.cudnn_problems(LayerKind(8, 2, 192, 128)) == []
    attention_kinds.check_kind(LayerKind(4, 1, 512, 512), "baseline", 0)          # the baseline takes any head dim
    # a frontend that imports, a model cuDNN cannot take: auto says which layers and falls back; cudnn refuses
    monkeypatch.setattr(prov, "gpu_available", lambda: True)
    monkeypatch.setattr(attention, "import_cudnn", lambda: types.SimpleNamespace())
    cfg = tiny_config("gemma3", n_layer=6, n_embd=256, n_head=1, n_head_kv=1, head_dim=320, sliding_window=16)
    name, note = attention.resolve("auto", cfg)
    assert name == "baseline" and "layer(s) 0, 1, 2, 3, 4 (causal + sliding window 16" in note and "layer(s) 5 (causal" in note
    with pytest.raises(AttentionError, match=r"layer\(s\) 0, 1, 2, 3, 4 \(causal \+ sliding window 16.*320"):
        attention.resolve("cudnn", cfg)


class _FailingGraph:
    def __init__(self, **kw):
        pass

    def tensor(self, **kw):
        return types.SimpleNamespace(**kw)

    def sdpa(self, **kw):
        raise RuntimeError("cudnnGraphNotSupportedError: No valid engine configs for SDPA")


def test_cudnn_build_failure_is_an_error_naming_the_layer(monkeypatch):
    """A graph cuDNN declines at build time is an AttentionError with the layer, mask, tokens and cuDNN's words."""
    fake = types.SimpleNamespace(
        data_type=types.SimpleNamespace(HALF="half", BFLOAT16="bf16", FLOAT="float"),
        diagonal_alignment=types.SimpleNamespace(TOP_LEFT="tl"), heur_mode=types.SimpleNamespace(A=0, FALLBACK=1),
        pygraph=_FailingGraph, create_handle=lambda: "handle")
    monkeypatch.setattr(attention, "import_cudnn", lambda: fake)
    c = attention.Cudnn(None)
    with pytest.raises(AttentionError, match=r"layer 7 \(causal \+ sliding window 512.*3325 tokens, f16\).*No valid engine"):
        c.graph(3325, LayerKind(4, 1, 256, 256, 512), 7)


def test_bf16_rounding():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -0.0, np.inf, -np.inf, 3.0e38, 1 + 2**-8 + 2**-20], np.float32)
    b = attention_kinds.bf16_bits(x)
    # halfway cases round to even; a bit above halfway rounds up; 3e38 overflows to inf (as __float2bfloat16_rn)
    assert [hex(v) for v in b] == ["0x3f80", "0x3f80", "0x3f82", "0x8000", "0x7f80", "0xff80", "0x7f62", "0x3f81"]
    nan = attention_kinds.bf16_bits(np.array([np.nan], np.float32))
    assert np.isnan(attention_kinds.bf16_to_f32(nan))[0]
    r = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    back = attention_kinds.bf16_to_f32(attention_kinds.bf16_bits(r))
    assert np.max(np.abs(back - r) / np.abs(r)) <= 2**-8                  # bf16 keeps 8 significant bits
    assert np.array_equal(attention_kinds.bf16_bits(back), attention_kinds.bf16_bits(r))


class _NumpySdpa(attention.Backend):
    """The fused path's plumbing (casts, output type, layer kinds) with a float64 numpy SDPA stand-in."""
    name = "numpy-sdpa"

    def __init__(self, cfg):
        super().__init__(cfg, "f16", "test")
        self.seen = []

    def sdpa(self, q16, k16, v16, n, kind, il=None):
        assert q16.dtype == np.float16 and k16.dtype == np.float16 and v16.dtype == np.float16
        self.seen.append((il, kind))
        return attention_kinds.sdpa_ref(q16, k16, v16, n, kind).astype(np.float16)


def test_fused_plumbing_matches_baseline_in_the_prefill(monkeypatch):
    """Through the prefill (CPU shim), a fused backend gets fp16 q/k/v and the layer's kind (window on the sliding
    layers only), and its fp16 output gives the baseline's logits to fp16 precision; the window is in effect."""
    from cpu_gpu_shim import install
    from labkernels.prefill import GpuModel
    from labkernels.synthetic import SyntheticModel, q4_k_m_recipe, tiny_config

    install(monkeypatch, exact=True)
    cfg = tiny_config("gemma3", n_layer=6, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, vocab=400, sliding_window=6)
    m = SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=9)
    toks = list(range(5, 30))
    gm = GpuModel(m)
    base = np.asarray(gm.forward(toks), np.float64)
    fused = _NumpySdpa(gm.cfg)
    gm.attn = fused
    got = np.asarray(gm.forward(toks), np.float64)
    assert [il for il, _ in fused.seen] == list(range(6))
    assert [k.window for _, k in fused.seen] == [6, 6, 6, 6, 6, 0] and {k.scale for _, k in fused.seen} == {1.0}
    rel = np.max(np.abs(got - base)) / np.max(np.abs(base))
    assert rel < 5e-3 and np.argmax(got) == np.argmax(base), rel
    # the stand-in without the window differs: the mask reaches the kernel
    fused.cfg = cfg.replace(sliding_window=None, layer_is_sliding=[False] * 6)
    nowin = np.asarray(gm.forward(toks), np.float64)
    assert np.max(np.abs(nowin - base)) / np.max(np.abs(base)) > 10 * rel


def test_baseline_scale_parameter(monkeypatch):
    """The baseline applies a layer kind's softmax scale (softmax_mask's scale argument) like pre-scaled q."""
    from cpu_gpu_shim import install
    from labkernels.trace import NullTracer

    install(monkeypatch, exact=True)
    rng = np.random.default_rng(1)
    n = 20
    q, k, v = (rng.standard_normal((n, w)).astype(np.float32) for w in (4 * 16, 2 * 16, 2 * 16))
    b = attention.Baseline(None)
    a = b.attend(q, k, v, n, LayerKind(4, 2, 16, 16, 5, 0.25), 0, NullTracer())
    c = b.attend(q * np.float32(0.25), k, v, n, LayerKind(4, 2, 16, 16, 5, 1.0), 0, NullTracer())
    assert a.shape == (n, 64) and np.allclose(a, c, rtol=1e-5, atol=1e-6)
    assert np.allclose(a, attention_kinds.sdpa_ref(q, k, v, n, LayerKind(4, 2, 16, 16, 5, 0.25)), rtol=1e-4, atol=1e-5)


def test_bench_records_what_ran_and_what_could_not(monkeypatch, tmp_path):
    """The benchmark's bookkeeping under the CPU shim (timings faked, every variant's code still executed): parity
    rows against the fp32 baseline, the unavailable paths with their reasons, TFLOPS from the useful FLOPs, the
    per-point summary, a complete recorded run."""
    from cpu_gpu_shim import install
    from labkernels import bench, records

    install(monkeypatch, exact=True)
    _no_frontend(monkeypatch, gpu=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    calls = []

    def fake_time(fn, warmup=3, repeats=20, flush=None):
        fn()
        calls.append(fn)
        return np.array([10.0, 20.0, 30.0])

    monkeypatch.setattr(bench, "time_launches", fake_time)
    monkeypatch.setattr(bench, "Flusher", lambda: None)
    lay = {"tiny": {"causal": LayerKind(2, 1, 16, 16, 0, 0.25), "sliding": LayerKind(2, 1, 16, 16, 5, 0.25)}}
    with records.recording("attention", {"test": True}, root=tmp_path) as run:
        res = attention_bench.record_bench(run, layouts=lay, nts=(12,), pairs=2, progress=lambda s: None)
    assert res["ok"] and len(calls) == 2 * 2 * 2          # 2 kinds x 2 baseline variants x 2 pairs (op scope only)
    r = records.load("attention", run.run_id, root=tmp_path)
    assert r.meta["status"] == "complete" and r.meta["summary"]["parity_ok"] is True
    t = r.table("timings")
    assert set(t.variant) == {"baseline_f32", "baseline_f16"} and set(t.scope) == {"op"}
    causal = t[t.layer == "causal"].iloc[0]
    assert causal.tflops == pytest.approx(2 * 2 * 32 * 12 * 12 / 2 / 20e-6 / 1e12)
    sliding = t[t.layer == "sliding"].iloc[0]
    assert sliding.flops == attention_kinds.attention_flops(12, LayerKind(2, 1, 16, 16, 5)) < causal.flops
    p = r.table("parity")
    assert set(p.variant) == {"baseline_f16"} and (p.max_rel_err <= p.tol).all() and p.max_rel_err.gt(0).all()
    u = r.table("unavailable")
    assert set(u.variant) == {"cudnn", "torch", "lab"}
    assert u[u.variant == "cudnn"].reason.str.contains("nvidia-cudnn-frontend").all()
    assert u[u.variant == "lab"].reason.str.contains("head dim 16 is not one the kernel is built for").all()
    s = r.table("summary")
    assert len(s) == 2 and (s.op_ms_baseline_f16 == 0.02).all() and "cudnn_vs_torch_best" not in s.columns


def test_cli_plumbing():
    """The gpu-check step and the A/B variants exist and name valid options; the CLIs take --attention."""
    import argparse

    from labkernels import gpu_cli, prefill_cli
    from labkernels.prefill import PrefillOptions
    from labkernels.rounds import r05_wall
    from labkernels.rounds.r07_wgmma import runs as r07_wgmma

    assert "attention" in r05_wall.STEPS and callable(r05_wall.step_attention)
    for name, v in r07_wgmma.PREFILL_VARIANTS.items():
        PrefillOptions(**v)
    assert r07_wgmma.PREFILL_VARIANTS["auto-attn-baseline"]["attention"] == "baseline"
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    prefill_cli.register_cli(sub)
    gpu_cli.register_cli(sub)
    assert p.parse_args(["prefill", "--model", "x", "--attention", "torch"]).attention == "torch"
    assert p.parse_args(["decompose", "--model", "x"]).attention == "auto"
    with pytest.raises(SystemExit):
        p.parse_args(["decompose", "--model", "x", "--attention", "flash"])
    a = p.parse_args(["gpu-check", "--steps", "attention", "--attention-nts", "512"])
    assert a.attention == "auto" and a.attention_nts == "512" and a.attn_dtype == "f16"


def test_gpu_check_attention_step_records(monkeypatch, tmp_path):
    """gpu-check's attention step end to end on the CPU shim (timings faked, the decomposition stubbed): the
    attention run is complete under OUT/data/05_wall_decomposition with the layouts, nts and the paths' availability."""
    import argparse

    from cpu_gpu_shim import install
    from labkernels import bench, records

    install(monkeypatch, exact=True)
    _no_frontend(monkeypatch, gpu=False)
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(bench, "time_launches", lambda fn, warmup=3, repeats=20, flush=None: (fn(), np.ones(3))[1])
    monkeypatch.setattr(bench, "Flusher", lambda: None)
    small = {"tiny": {"global": LayerKind(2, 1, 16, 16, 0, 0.25)}}
    monkeypatch.setattr(attention_kinds, "bench_layouts", lambda: small)
    decomposed = []
    from labkernels.rounds import r05_wall

    monkeypatch.setattr(r05_wall, "decompose_models",
                        lambda out, args, models: (decomposed.append(models) or ["d1"], True))
    args = argparse.Namespace(attention_nts="9,17", attn_dtype="f16", attention="auto", log=lambda s: None)
    res = r05_wall.step_attention(tmp_path, args)
    assert res["ok"] and res["decompose_runs"] == ["d1"] and decomposed == [["7b"]]
    assert "nvidia-cudnn-frontend" in res["paths"]["cudnn"]
    run = records.load("attention", res["run"], root=tmp_path / "data")
    assert run.meta["params"]["nts"] == [9, 17] and run.meta["params"]["layouts"]["tiny"]["global"]["head_dim"] == 16
    assert sorted(run.table("summary").nt) == [9, 17]


class _OffByOne(attention.Backend):
    """A fused stand-in whose window is one key too wide (the classic band-mask mistake)."""
    name = "cudnn"

    def __init__(self, cfg, dtype="f16", note="requested"):
        super().__init__(cfg, dtype, note)

    def sdpa(self, q16, k16, v16, n, kind, il=None):
        wide = LayerKind(kind.n_head, kind.n_head_kv, kind.head_dim, kind.head_dim_v,
                         kind.window + 1 if kind.window else 0, kind.scale)
        return attention_kinds.sdpa_ref(q16, k16, v16, n, wide).astype(np.float16)


def test_probe_catches_a_wrong_mask(monkeypatch):
    """Every fused path is probed per layer kind against the float64 reference when a model is set up: a correct
    one passes; a window off by one is caught -- auto then runs the baseline and says why, a requested path is an
    error naming the layers and the mask."""
    from cpu_gpu_shim import install
    import labkernels.provenance as prov
    from labkernels.synthetic import tiny_config

    install(monkeypatch, exact=True)
    cfg = tiny_config("gemma3", n_layer=6, n_embd=256, n_head=4, n_head_kv=2, sliding_window=16)
    kinds = attention_kinds.model_kinds(cfg)
    assert _NumpySdpa(cfg).probe(kinds) is None
    bad = _OffByOne(cfg).probe(kinds)
    assert bad.startswith("layer(s) 0, 1, 2, 3, 4 (causal + sliding window 16") and "float64 reference" in bad
    assert _OffByOne(cfg).probe({k: v for k, v in kinds.items() if not k.window}) is None   # causal layers are fine
    monkeypatch.setattr(prov, "gpu_available", lambda: True)
    monkeypatch.setattr(attention, "import_cudnn", lambda: types.SimpleNamespace())
    monkeypatch.setattr(attention, "Cudnn", _OffByOne)
    b = attention.make("auto", cfg)
    assert b.name == "baseline" and "probe failed" in b.note and "sliding window 16" in b.note
    with pytest.raises(AttentionError, match=r"attention='cudnn': layer\(s\) 0, 1, 2, 3, 4 \(causal \+ sliding window"):
        attention.make("cudnn", cfg)


def test_lab_split_plan():
    """The lab kernel's launch plan (host side): Gemma's 4 heads / 1 kv head at nt=512 split into 80 (query block,
    chunk) items, heaviest first, 2 key blocks a chunk, at most 4 chunks; no split where the grid fills the machine
    (nt=3325, the 7B's 32 head groups) or a query block needs one key block (nt=64); the window bounds the chunks."""
    from labkernels.attention import Lab
    from labkernels.attention_kinds import lab_heads_per_cta, lab_problems

    lab = Lab.__new__(Lab)          # no GPU needed for the plan
    Lab.__init__(lab, None)
    g = LayerKind(4, 1, 256, 256, 0, 1 / 16.0)
    p = lab.split_plan(512, g)
    assert p["grid"] == (80, 1) and p["wh"] == 4 and p["kcb"] == 2 and p["maxc"] == 4
    it = p["items"]
    assert tuple(it[0]) == (31, 0) and tuple(it[3]) == (31, 3) and tuple(it[-1]) == (0, 0)
    assert sorted(map(tuple, it)) == sorted({(b, c) for b in range(32) for c in range(-(-(b // 4 + 1) // 2))})
    assert lab.split_plan(3325, g)["items"] is None and lab.split_plan(3325, g)["grid"] == (208, 1)
    assert lab.split_plan(64, g)["items"] is None
    s7 = LayerKind(32, 32, 128, 128, 0, 1.0)
    assert lab_heads_per_cta(s7) == 1 and lab.split_plan(512, s7) == {"grid": (8, 32), "wh": 1, "items": None,
                                                                      "kcb": 0, "maxc": 1}
    w = lab.split_plan(700, LayerKind(4, 1, 256, 256, 64, 1.0))   # window 64: at most 2 key blocks per query block
    assert w["kcb"] == 1 and w["maxc"] == 2 and w["grid"][0] < 2 * 44
    assert lab_heads_per_cta(LayerKind(6, 2, 64, 64)) == 1 and lab_heads_per_cta(LayerKind(8, 2, 64, 64)) == 4
    assert lab_problems(LayerKind(4, 1, 96, 96)) == ["head dim 96 is not one the kernel is built for (64, 128, 256)"]
    assert lab_problems(LayerKind(4, 1, 128, 64))[0].startswith("q/k head dim 128 differs")
    with pytest.raises(attention_kinds.AttentionError, match="fp16 only"):
        Lab(None, "bf16")


def test_auto_picks_lab_plus_cudnn_where_both_run(monkeypatch):
    """With a frontend that imports: auto routes Gemma-like layouts to lab+cudnn (the route per launch: the lab's
    kernel where it splits over the keys, cuDNN elsewhere), a head dim only cuDNN takes to cudnn with the reason;
    an explicit lab+cudnn checks both paths' support."""
    import labkernels.provenance as prov
    from labkernels.synthetic import tiny_config

    monkeypatch.setattr(prov, "gpu_available", lambda: True)
    monkeypatch.setattr(attention, "import_cudnn", lambda: types.SimpleNamespace())
    g = tiny_config("gemma3", n_layer=6, n_embd=256, n_head=4, n_head_kv=1, head_dim=256, sliding_window=16)
    name, note = attention.resolve("auto", g)
    assert name == "lab+cudnn" and "split over the keys" in note
    c = tiny_config("gemma3", n_layer=6, n_embd=256, n_head=4, n_head_kv=1, head_dim=96, sliding_window=16)
    name, note = attention.resolve("auto", c)
    assert name == "cudnn" and "head dim 96 is not one the kernel is built for" in note
    with pytest.raises(AttentionError, match="the lab path cannot take it: head dim 96"):
        attention.resolve("lab+cudnn", c)
    r = attention.Routed.__new__(attention.Routed)
    r.lab = attention.Lab.__new__(attention.Lab)
    attention.Lab.__init__(r.lab, None)
    gk = LayerKind(4, 1, 256, 256, 0, 1.0)
    assert r.route(512, gk) == "lab" and r.route(3325, gk) == "cudnn" and r.route(64, gk) == "cudnn"
    assert r.route(512, LayerKind(32, 32, 128, 128, 0, 1.0)) == "cudnn"
    r.routes = {(512, gk): "lab", (512, LayerKind(4, 1, 256, 256, 512, 1.0)): "lab", (3325, gk): "cudnn"}
    assert r.ran(512) == "lab" and r.ran(3325) == "cudnn" and r.ran(64) == "none yet"


def test_auto_with_bf16_takes_cudnn(monkeypatch):
    """The lab kernel is fp16 only: with attn_dtype bf16, auto runs cuDNN alone and says why."""
    import labkernels.provenance as prov
    from labkernels.synthetic import tiny_config

    monkeypatch.setattr(prov, "gpu_available", lambda: True)
    monkeypatch.setattr(attention, "import_cudnn", lambda: types.SimpleNamespace())
    g = tiny_config("gemma3", n_layer=6, n_embd=256, n_head=4, n_head_kv=1, head_dim=256, sliding_window=16)
    assert attention.resolve("auto", g)[0] == "lab+cudnn"
    name, note = attention.resolve("auto", g, "bf16")
    assert name == "cudnn" and "fp16 only, not bf16" in note


def test_baseline_f32_bmm_under_capture_runs_one_gemm_dense_an_entry(monkeypatch):
    """CuPy refuses its own cuBLAS calls while a stream is captured (cupy 14, seen on an H100 in the full GPU suite):
    the fp32 baseline's batched products then go through blas.gemm_dense (capturable), one call a batch entry, with
    the same values as the batched matmul."""
    from labkernels import blas, gpu

    capturing = {"on": True}
    fake = types.SimpleNamespace(
        float32=np.float32, empty=np.empty, ascontiguousarray=np.ascontiguousarray,
        matmul=lambda a, b: (_ for _ in ()).throw(NotImplementedError("cuBLAS during stream capture")),
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(streamIsCapturing=lambda ptr: capturing["on"]),
                                   get_current_stream=lambda: types.SimpleNamespace(ptr=7)))
    monkeypatch.setattr(gpu, "cp", lambda: fake)
    calls = []

    def gemm_dense(x, w, out=None, path=None):
        assert x.flags.c_contiguous and w.flags.c_contiguous
        calls.append(x.shape)
        out[...] = x @ w.T
        return out

    monkeypatch.setattr(blas, "gemm_dense", gemm_dense)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((3, 10, 4)).astype(np.float32), rng.standard_normal((3, 4, 6)).astype(np.float32)
    b = attention.Baseline.__new__(attention.Baseline)
    b.f16 = False
    got = b._bmm(A, B)
    assert calls == [(10, 4)] * 3 and np.allclose(got, A @ B, rtol=1e-5, atol=1e-6)
    capturing["on"] = False                     # not capturing: CuPy's batched matmul, as before
    with pytest.raises(NotImplementedError):
        b._bmm(A, B)
