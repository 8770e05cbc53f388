"""Round 9's decode-step decomposition and context sweep on the CPU (labkernels/rounds/r09_decode/decomp.py, .generate,
.tables): the classifier on CUPTI-like records (every class; an unknown kernel an ``unclassified`` row, never dropped),
the replay's mapping onto the eager step's classes and its exclusive times, the table's shares summing to 1, the decode
step's op labels (every launch of a step on the CPU stand-ins inside one; the logits the same with and without them),
the whole measurement on the stand-ins into a run, the plan's points (a context beyond a model reported skipped), the
page's sections on a fabricated run and on none, and the step's refusal without cupti-python. The GPU side:
tests/gpu/test_decode_gpu.py (test_decode_decomposition_on_the_device)."""
import argparse
import contextlib
import enum
import sys
import types

import numpy as np
import pandas as pd
import pytest

from cpu_gpu_shim import install, install_wgmma
from labkernels import blas, decode, gemv, gpu, records, trace
from labkernels.prefill import GpuModel, PrefillOptions
from labkernels.rounds import r09_decode as r9
from labkernels.rounds.r09_decode import decomp, generate, tables
from labkernels.synthetic import SyntheticModel, gemma3_270m_config, llama7b_config, q4_k_m_recipe, tiny_config


# ------------------------------------------------------------------------------------------------ stand-ins

class Kind(enum.IntEnum):
    MEMCPY = 1
    KERNEL = 3
    CONCURRENT_KERNEL = 10
    EXTERNAL_CORRELATION = 36
    MEMSET = 2


def _cupti_tracer():
    """A CuptiTracer without CUPTI: its record handling fed stand-in activity records (as tests/test_trace.py)."""
    tr = object.__new__(trace.CuptiTracer)
    tr.cupti = types.SimpleNamespace(ActivityKind=Kind)
    tr.kernels, tr.other, tr.ext, tr.ops, tr.errors = [], [], {}, [], []
    return tr


class FakeTracer:
    """CUPTI's stand-in for the decode step on the CPU shim: one launch record per shim kernel, GEMV and cuBLAS call,
    tagged with the innermost open op label (as the external correlation ids tag them)."""
    active = True
    current = None

    def __init__(self):
        self.stack, self.recs, self.ops, self.t = [], [], [], 0

    def __enter__(self):
        FakeTracer.current = self
        return self

    def __exit__(self, *exc):
        FakeTracer.current = None
        return False

    @contextlib.contextmanager
    def op(self, name, cls, **kw):
        self.stack.append((name, cls, kw))
        try:
            yield None
        finally:
            self.stack.pop()

    def launch(self, name, dur=1000):
        o = self.stack[-1] if self.stack else None
        self.recs.append({"name": name, "start": self.t, "end": self.t + dur, "duration_ns": dur,
                          "correlation_id": len(self.recs), "op": o[0] if o else None,
                          "cls": o[1] if o else "untagged", "layer": o[2].get("layer") if o else None,
                          "weight": o[2].get("weight") if o else None})
        self.t += dur + 200

    def records(self):
        return list(self.recs), self.ops


def _launching(monkeypatch):
    """Every shim launch also a FakeTracer record (mangled names, as CUPTI gives NVRTC's template kernels)."""
    kernel, gv, dense = gpu.kernel, gemv.gemv, blas.gemm_dense

    def wrap_kernel(family, **p):
        k = kernel(family, **p)
        real = k.launch

        def launch(grid, args):
            if FakeTracer.current:
                name = f"{family}_kernel"
                FakeTracer.current.launch(f"_Z{len(name)}{name}ILi1EEvPKf")
            return real(grid, args)

        k.launch = launch
        return k

    def wrap_gemv(*a, **kw):
        if FakeTracer.current:
            FakeTracer.current.launch("_Z14gemv_kq_kernelILi4ELi0ELi1ELi1ELi4ELi1EEvPKhPKvPfiiiiPfPi", 5000)
        return gv(*a, **kw)

    def wrap_dense(*a, **kw):
        if FakeTracer.current:
            FakeTracer.current.launch("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x64x64", 4000)
        return dense(*a, **kw)

    monkeypatch.setattr(gpu, "kernel", wrap_kernel)
    monkeypatch.setattr(gemv, "gemv", wrap_gemv)
    monkeypatch.setattr(blas, "gemm_dense", wrap_dense)


def _tiny(arch: str):
    extra = {"sliding_window": 8} if arch == "gemma3" else {}
    cfg = tiny_config(arch, n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, vocab=512, **extra)
    return SyntheticModel(cfg, q4_k_m_recipe(cfg), seed=3)


def _gm(monkeypatch, m):
    install(monkeypatch, exact=True)
    install_wgmma(monkeypatch)
    monkeypatch.setattr(gemv, "_AUTO", {"t": None})
    _launching(monkeypatch)
    return GpuModel(m, opts=PrefillOptions(attn_f16=True, kernel="wgmma_kq"))


# ------------------------------------------------------------------------------------------------ the classifier

def _k(name, corr, start, end):
    return types.SimpleNamespace(kind=int(Kind.CONCURRENT_KERNEL), name=name, start=start, end=end, correlation_id=corr,
                                 grid_x=4, grid_y=1, grid_z=1, block_x=256, block_y=1, block_z=1, stream_id=7)


#: (op name, op class, kernel name, the class the decomposition gives it): one of each the decode step pushes, and
#: launches with no label (a memset, a memcpy, a known kernel name, an unknown one)
CASES = [("embed", "embed", "_Z12embed_kernelILi0EEvPKvPKiPfif", "small:embed"),
         ("attn_norm+residual", "norm", "_Z18add_rmsnorm_kernelILi1EEvPfPKf", "small:norm"),
         ("attn_q+attn_k", "gemm_q4k", "_Z14gemv_kq_kernelILi4ELi0EEvPKh", "gemv:attn_q+attn_k"),
         ("attn_v", "gemm_q6k", "_Z14gemv_kq_kernelILi6ELi0EEvPKh", "gemv:attn_v"),
         ("decode_qkv", "rope", "_Z17decode_qkv_kernelILi0ELi1EEvPKf", "small:rope+kv_append"),
         ("attention", "attention", "_Z18decode_attn_kernelILi128ELi1EEvPKt", "attention"),
         ("attn_output", "gemm_q4k", "_Z14gemv_kq_kernelILi4ELi0EEvPKh", "gemv:attn_output"),
         ("ffn_gate_up", "gemm_other_q5_0", "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n", "gemv:ffn_gate_up"),
         ("ffn_gate_up", "gemm_other_q5_0", "cupy_copy__float32_float16", "gemv:ffn_gate_up"),
         ("ffn_act", "activation", "_Z17act_mul_gu_kernelILi0ELi1EEvPKfPvil", "small:activation"),
         ("ffn_down", "gemm_q6k", "_Z14gemv_kq_kernelILi6ELi0EEvPKh", "gemv:ffn_down"),
         ("qkv_bias", "elementwise", "cupy_add__float32_float32_float32", "small:elementwise"),
         ("output", "output_head", "_Z14gemv_kq_kernelILi6ELi0EEvPKh", "gemv:output"),
         ("argmax", "sampling", "_Z18argmax_step_kernelv", "small:sampling"),
         (None, None, "_Z18decode_attn_kernelILi64ELi4EEvPKt", "attention"),
         (None, None, "_Z11fill_kernelPhjyy", "memset"),
         (None, None, "mystery_kernel_of_a_library", "unclassified")]


def _eager_records():
    """A traced 'step' through CuptiTracer's own record handling: each CASES launch 1000 ns apart, tagged by its op,
    a memset and a memcpy record among them."""
    tr = _cupti_tracer()
    acts, t = [], 0
    for i, (op, cls, name, _) in enumerate(CASES):
        acts.append(_k(name, 100 + i, t, t + 1000 * (i + 1)))
        if op is not None:
            tr.ops.append(trace.OpInfo(len(tr.ops) + 1, op, cls, layer=0))
            acts.append(types.SimpleNamespace(kind=int(Kind.EXTERNAL_CORRELATION), correlation_id=100 + i,
                                              external_id=len(tr.ops)))
        t += 1000 * (i + 1) + 500
    acts.append(types.SimpleNamespace(kind=int(Kind.MEMSET), start=t, end=t + 700, correlation_id=900))
    acts.append(types.SimpleNamespace(kind=int(Kind.MEMCPY), start=t + 1000, end=t + 1300, correlation_id=901))
    tr._buffer_completed(acts)
    assert not tr.errors
    return tr.records()[0]


def test_every_launch_gets_its_class_and_an_unknown_one_is_unclassified():
    recs = _eager_records()
    got = {r["name"]: decomp.classify(r) for r in recs if r["name"] not in ("memset", "memcpy")}
    for op, cls, name, want in CASES:
        assert got[name] == want or (name.startswith("_Z14gemv") and got[name].startswith("gemv:")), (name, got[name])
    by_kind = {decomp.classify(r) for r in recs if r["name"] in ("memset", "memcpy")}
    assert by_kind == {"memset", "memcpy"}
    assert {decomp.group_of(c) for c in (w for *_, w in CASES)} == {"gemv", "attention", "small", "memory",
                                                                    "unclassified"}
    assert decomp.short_name("_Z14gemv_kq_kernelILi4ELi0EEvPKh") == "gemv_kq_kernel"
    assert decomp.short_name("_ZN7cutlass6KernelI7ParamsEEvT_") == "cutlass::Kernel"
    assert decomp.short_name("sm90_xmma_gemm_f16f16") == "sm90_xmma_gemm_f16f16"


def test_class_table_keeps_the_unclassified_row_and_its_shares_sum_to_one():
    recs = _eager_records()
    key = {"model": "m", "arch": "llama", "context": 512, "n_ctx": 768}
    wall = sum(r["duration_ns"] for r in recs) / 1e3 + 40.0          # 40 us of host time between the launches
    rows, s = decomp.class_rows(recs, [], None, wall, key)
    t = pd.DataFrame(rows)
    assert list(t.columns) == list(decomp.CLASS_COLUMNS)
    assert set(t["class"]) == {w for *_, w in CASES} | {"memcpy", "gaps"}
    unc = t[t["class"] == "unclassified"].iloc[0]
    assert unc.launches == 1 and unc.us == pytest.approx(len(CASES)) and "mystery_kernel" in unc.kernels
    assert t.share.sum() == pytest.approx(1.0)
    assert t[t["class"] == "gaps"].us.iloc[0] == pytest.approx(40.0)
    assert (t["mode"] == "eager").all() and t.replay_us.isna().all()
    assert s["classified_frac"] == pytest.approx(1 - len(CASES) / s["kernel_sum_eager_us"])
    assert "mystery_kernel_of_a_library" in s["unclassified_kernels"]
    assert s["step_us"] == pytest.approx(wall)
    # the figure's parts: every GEMV weight, attention, small kernels, memory, unclassified, gaps
    assert {decomp.part_of(c) for c in t["class"]} == {label for label, _ in decomp.PARTS} - {"GEMV: other"}
    with pytest.raises(decomp.DecompError, match="recorded no launch"):
        decomp.class_rows([], [], None, 1.0, key)


def test_replay_launches_take_the_eager_classes_and_their_exclusive_time():
    """The replay's kernels carry no label: each takes the class of the eager launch at its place in the sequence of
    names (a memset node turned into the fill kernel matches the eager memset; a library kernel swapped under capture,
    same count, matches pairwise); a programmatic launch that begins inside the kernel before it counts only the time
    after that kernel's end; the gaps are the replay's time minus the kernels'."""
    def rec(name, start, dur, op=None, cls="untagged"):
        return {"name": name, "start": start, "duration_ns": dur, "end": start + dur, "op": op, "cls": cls}

    eager = [rec("embed_kernel", 0, 1000, "embed", "embed"), rec("memset", 2000, 500),
             rec("gemv_kq_kernel", 3000, 10000, "attn_q+attn_k", "gemm_q4k"),
             rec("cublas_gemv_a", 14000, 4000, "ffn_gate_up", "gemm_other_q5_0"),
             rec("decode_attn_kernel", 19000, 3000, "attention", "attention")]
    replay = [rec("embed_kernel", 0, 1000), rec("fill_kernel", 1100, 400),
              rec("gemv_kq_kernel", 1500, 10000), rec("cublas_gemv_b", 11000, 4500),    # begins 500 ns early (PDL)
              rec("decode_attn_kernel", 15600, 3000)]
    cls, matched = decomp.map_replay(eager, replay)
    assert cls == ["small:embed", "memset", "gemv:attn_q+attn_k", "gemv:ffn_gate_up", "attention"] and matched == 5
    assert decomp.exclusive_ns(replay) == [1000, 400, 10000, 4000, 3000]
    key = {"model": "m", "arch": "llama", "context": 512, "n_ctx": 768}
    rows, s = decomp.class_rows(eager, [replay, replay], 20.0, 100.0, key)
    t = pd.DataFrame(rows).set_index("class")
    assert t.loc["gemv:ffn_gate_up", "replay_us"] == pytest.approx(4.0)
    assert t.loc["gemv:ffn_gate_up", "eager_us"] == pytest.approx(4.0)
    assert t.loc["gaps", "us"] == pytest.approx(20.0 - 18.4) and t.share.sum() == pytest.approx(1.0)
    assert (t["mode"] == "graph").all() and s["busy_replay_us"] == pytest.approx(18.4)
    assert s["span_replay_us"] == pytest.approx(18.6) and s["idle_replay_us"] == pytest.approx(0.2)
    assert s["replay_matched"] == 1.0 and s["launches_replay"] == 5 and s["classified_frac_replay"] == 1.0
    # a replay timed faster than its traced kernels: no negative gap row, the signed figure kept in the summary
    rows, s = decomp.class_rows(eager, [replay], 15.0, 100.0, key)
    assert pd.DataFrame(rows).set_index("class").loc["gaps", "us"] == 0.0 and s["gap_us"] == pytest.approx(-3.4)
    # replays timed but traced without records: the eager kernels against the replay's time, said in the mode
    rows, s = decomp.class_rows(eager, [[]], 20.0, 100.0, key)
    t = pd.DataFrame(rows).set_index("class")
    assert (t["mode"] == "graph, eager kernels").all() and s["graph_us"] == 20.0
    assert t.loc["gaps", "us"] == pytest.approx(20.0 - 18.5) and t.share.sum() == pytest.approx(1.0)
    # a replay kernel no eager launch matches and no name rule knows: unclassified, not dropped
    odd = replay[:2] + [rec("unknown_kernel", 1500, 10000)] + replay[3:]
    cls, matched = decomp.map_replay(eager, odd + [rec("another_unknown", 20000, 10)])
    assert "unclassified" in cls and matched < len(odd) + 1


# ------------------------------------------------------------------------------------------------ the decode step

@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_launch_of_the_decode_step_is_labelled_and_the_labels_change_no_number(monkeypatch, arch):
    gm = _gm(monkeypatch, _tiny(arch))
    dec = decode.Decoder(gm, 32)
    dec.prefill([1, 17, 300, 42, 99, 7])
    s0 = dec.state()
    with FakeTracer() as tr:
        traced = np.array(dec._step_device(tr))
    dec.set_state(s0["tok"], s0["pos"])
    plain = np.array(dec._step_device())
    assert np.array_equal(traced, plain)
    recs = tr.records()[0]
    assert recs and all(r["cls"] != "untagged" for r in recs), [r["name"] for r in recs if r["cls"] == "untagged"]
    classes = {decomp.classify(r) for r in recs}
    want = {"gemv:attn_output", "gemv:ffn_gate_up", "gemv:ffn_down", "gemv:output", "attention", "small:norm",
            "small:rope+kv_append", "small:activation", "small:embed", "small:sampling"}
    assert want <= classes and "unclassified" not in classes
    assert any(c.startswith("gemv:attn_q") for c in classes)
    assert sum(decomp.classify(r) == "attention" for r in recs) == gm.cfg.n_layer


def test_the_measurement_on_the_stand_ins_records_every_point_and_the_skipped_one(monkeypatch, tmp_path):
    """measure_decomp end to end on the CPU stand-ins (eager: no graph capture here): a row per class and point, a
    summary per point, the context the model cannot take (tiny config: n_ctx_train 2048) a skipped row with why."""
    m = _tiny("llama")
    gm = _gm(monkeypatch, m)
    monkeypatch.setattr(decomp.synthetic, "load_model", lambda spec: m)
    monkeypatch.setattr(decomp.prefill, "GpuModel", lambda model: gm)
    monkeypatch.setattr(decomp.generate, "free_for_cache", lambda: 1 << 40)
    monkeypatch.setattr(decomp.benchmark, "copy_bandwidth", lambda: {"bytes": 2, "median_us": 1.0, "tb_per_s": 3.0})
    with records.recording("decode", {"what": "decode_decomp"}, root=tmp_path) as run:
        out = decomp.measure_decomp(run, models=["tiny"], contexts=[8, 4000], repeats=2, traced_replays=1,
                                    progress=lambda s: None, tracer=FakeTracer)
    assert [r["status"] for r in out] == ["measured", "skipped"]
    assert "n_ctx_train 2048" in out[1]["why"]
    st = run.table("decode_decomp_steps")
    assert list(st.columns) == list(decomp.STEP_COLUMNS) and list(st.status) == ["measured", "skipped"]
    c = run.table("decode_decomp")
    assert set(c.context) == {8} and c.share.sum() == pytest.approx(1.0) and (c["mode"] == "eager").all()
    assert st.classified_frac.iloc[0] == 1.0 and st.read_bytes.iloc[0] > 0 and st.kv_bytes.iloc[0] > 0
    g = tables.decomp_groups(records.load("decode", run.run_id, tmp_path))
    assert list(g.status) == ["measured", "skipped"] and g.gemv_share.iloc[0] > 0


# ------------------------------------------------------------------------------------------------ the plans

def test_plan_points_report_a_context_beyond_the_model_as_skipped():
    cfgs = {"synthetic-gemma3": gemma3_270m_config(), "synthetic-7b": llama7b_config()}
    assert cfgs["synthetic-7b"].n_ctx_train == 4096 and cfgs["synthetic-gemma3"].n_ctx_train == 32768
    p = r9.GEN_CONTEXT_PLAN
    pts = generate.plan_points(cfgs, p["prompts"], p["n_new"])
    assert len(pts) == 2 * len(p["prompts"])
    skipped = [(r["model"], r["n_prompt"]) for r in pts if r["status"] == "skipped"]
    assert skipped == [("synthetic-7b", 8160)]
    why = next(r["why"] for r in pts if r["status"] == "skipped")
    assert "8192 tokens > the model's n_ctx_train 4096" in why
    top = {(r["model"], r["n_prompt"]): r for r in pts}
    assert top[("synthetic-7b", 4064)]["n_ctx"] == 4096 and top[("synthetic-gemma3", 8160)]["n_ctx"] == 8192
    assert top[("synthetic-7b", 4064)]["cache_bytes"] == 32 * 4096 * 32 * 256 * 2 < 80e9 * 0.8
    assert top[("synthetic-gemma3", 8160)]["cache_bytes"] == 18 * 8192 * 512 * 2
    assert max(p["prompts"]) + p["n_new"] == 8192 and min(p["prompts"]) == 128
    # a cache over what the card leaves free: skipped too, with the bytes
    tight = generate.plan_points({"synthetic-7b": llama7b_config()}, [2048], 32, free_bytes=1 << 30)
    assert tight[0]["status"] == "skipped" and "GiB" in tight[0]["why"]
    # the decomposition's contexts: the 7B cannot take 8192, Gemma's shapes can
    d = generate.plan_points(cfgs, r9.DECOMP_PLAN["contexts"], r9.plan.DECOMP_NEW)
    assert [(r["model"], r["n_prompt"]) for r in d if r["status"] == "skipped"] == [("synthetic-7b", 8192)]
    assert r9.GEN_PLAN == {"models": ["synthetic-gemma3", "synthetic-7b"], "prompts": [128, 512, 2048], "n_new": 128,
                           "repeats": 3}   # the recorded generation runs' plan, unchanged


def test_the_generation_records_a_prompt_the_model_cannot_take_as_skipped(monkeypatch, tmp_path):
    m = _tiny("llama")
    gm = _gm(monkeypatch, m)
    monkeypatch.setattr(generate.synthetic, "load_model", lambda spec: m)
    monkeypatch.setattr(generate.prefill, "GpuModel", lambda model: gm)
    monkeypatch.setattr(generate, "free_for_cache", lambda: 1 << 40)
    monkeypatch.setattr(generate.benchmark, "copy_bandwidth", lambda: {"bytes": 2, "median_us": 1.0, "tb_per_s": 3.0})
    with records.recording("decode", {"what": "generate_context"}, root=tmp_path) as run:
        generate.measure_generate(run, models=["tiny"], prompts=[6, 2046], n_new=4, repeats=1, progress=lambda s: None)
    t = tables.generation_table(records.load("decode", run.run_id, tmp_path))
    assert list(t.n_prompt) == [6, 2046] and t.status.iloc[0] == "measured"
    assert t.status.iloc[1].startswith("skipped: prompt 2046 + 4 new = 2050") and np.isnan(t.tok_per_s.iloc[1])


# ------------------------------------------------------------------------------------------------ the page

def _fabricated_decomp_run(root):
    """A decode_decomp run as the step records it, with made-up times: the 7B at 512 and 4032 (GEMV, attention,
    small kernels, an unclassified launch), its 8192 skipped, Gemma at 512 and 4032."""
    def recs(parts):
        out, t = [], 0
        for name, op, cls, us in parts:
            out.append({"name": name, "start": t, "duration_ns": int(us * 1e3), "end": t + int(us * 1e3), "op": op,
                        "cls": cls})
            t += int(us * 1e3) + 1000
        return out

    points = {("synthetic-7b", 512): [("gemv_kq_kernel", "ffn_gate_up", "gemm_q4k", 2800.0),
                                      ("decode_attn_kernel", "attention", "attention", 400.0),
                                      ("add_rmsnorm_kernel", "ffn_norm+residual", "norm", 300.0),
                                      ("odd_kernel", None, None, 10.0)],
              ("synthetic-7b", 4032): [("gemv_kq_kernel", "ffn_gate_up", "gemm_q4k", 2800.0),
                                       ("decode_attn_kernel", "attention", "attention", 2200.0),
                                       ("add_rmsnorm_kernel", "ffn_norm+residual", "norm", 300.0)],
              ("synthetic-gemma3", 512): [("sm90_xmma_gemm", "output", "output_head", 450.0),
                                          ("decode_attn_kernel", "attention", "attention", 80.0),
                                          ("add_rmsnorm_kernel", "ffn_norm+residual", "norm", 250.0)],
              ("synthetic-gemma3", 4032): [("sm90_xmma_gemm", "output", "output_head", 450.0),
                                           ("decode_attn_kernel", "attention", "attention", 90.0),
                                           ("add_rmsnorm_kernel", "ffn_norm+residual", "norm", 250.0)]}
    with records.recording("decode", {**r9.DECOMP_PLAN, "what": "decode_decomp"}, root=root) as run:
        run.append("copy", [{"bytes": 2, "median_us": 1.0, "tb_per_s": 3.0}])
        for (model, ctx), parts in points.items():
            e = recs(parts)
            rows, s = decomp.class_rows(e, [e], sum(p[3] for p in parts) + 150.0, 9000.0,
                                        {"model": model, "arch": "llama", "context": ctx, "n_ctx": ctx + 256})
            run.append("decode_decomp", rows)
            run.append("decode_decomp_steps", [decomp.step_row(**s, model=model, arch="llama", context=ctx,
                                                               status="measured", why="", gemv_frac_copy=0.4,
                                                               attention_frac_copy=0.3)])
        run.append("decode_decomp_steps", [decomp.step_row(model="synthetic-7b", arch="llama", context=8192,
                                                           status="skipped", why="prompt 8192 + 2 new > 4096")])
    return run


def test_the_page_renders_the_decomposition_of_a_recorded_run(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from labkernels import report

    run = _fabricated_decomp_run(tmp_path)
    sec = tables.decomp_section(tmp_path)
    assert sec["run"].run_id == run.run_id and run.run_id in sec["message"]
    assert "synthetic-7b at context 8192 (prompt 8192 + 2 new > 4096)" in sec["message"]
    g = sec["groups"]
    assert len(g) == 4 and (g.status == "measured").all()
    shares = g[[f"{x}_share" for x in ("gemv", "attention", "small", "memory", "unclassified", "gaps")]].sum(axis=1)
    assert np.allclose(shares, 1.0)
    seven = g[(g.model == "synthetic-7b") & (g.context == 512)].iloc[0]
    assert seven.step_us == pytest.approx(3660.0) and seven.gemv_share == pytest.approx(2800 / 3660)
    p = sec["prediction"].set_index("claim")
    row = p.loc["synthetic-7b, context 512: GEMV (every projection and the head)"]
    assert row.measured == pytest.approx(2800 / 3660) and row.verdict == "within"
    assert row["opening estimate"] == "0.75-0.85"
    att = p.loc["synthetic-7b, context 4032: attention (decode_attn)"]
    assert att.measured == pytest.approx(2200 / 5450) and att.verdict == "within"
    assert p.loc["synthetic-gemma3: attention at 4032 / at 512"].measured == pytest.approx(90 / 80)
    assert p.loc["every point: traced kernel time the classes name (not 'unclassified')"].measured < 1.0
    assert p.loc["synthetic-7b, context 512: graph replay / eager step (host wall)"].measured == pytest.approx(
        3660 / 9000)
    fig = sec["figure"]
    ax = fig.axes[0]
    assert ax.get_ylabel() == "time per decode step (µs)" and "context" in ax.get_xlabel()
    assert {t.get_text() for t in fig.legends[0].get_texts()} >= {"GEMV: FFN gate/up", "attention", "small kernels",
                                                                  "gaps", "unclassified"}
    html = report.table(sec["classes"]).to_html()
    assert "_Z" not in html and "odd_kernel" in html


def test_the_page_says_plainly_when_nothing_is_recorded_and_names_the_commands(tmp_path):
    (tmp_path / "09_decode").mkdir()
    sec = tables.decomp_section(tmp_path)
    assert sec["run"] is None and sec["figure"] is None
    assert "Not recorded yet" in sec["message"]
    assert "python3 -m labkernels gpu check --steps decode_decomp --out DIR" in sec["message"]
    assert (sec["prediction"].verdict == "not measured").all() and len(sec["prediction"]) == len(
        r9.DECOMP_PREDICTION["claims"])
    cs = tables.context_section(tmp_path)
    assert cs["run"] is None and "gpu check --steps generate_context --out DIR" in cs["message"]
    from labkernels import cli

    a = cli.build_parser().parse_args(["gpu", "check", "--steps", "decode_decomp", "--out", "DIR"])
    assert a.steps == "decode_decomp"


def test_the_context_section_shows_skipped_points(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    with records.recording("decode", {**r9.GEN_CONTEXT_PLAN, "what": "generate_context"}, root=tmp_path) as run:
        run.append("copy", [{"bytes": 2, "median_us": 1.0, "tb_per_s": 3.0}])
        run.append("generate", [{"model": "synthetic-7b", "arch": "llama", "n_prompt": n, "n_new": 32, "rep": 0,
                                 "mode": "graph", "tok_per_s": 300.0 - n / 40, "tok_per_s_wall": 290.0,
                                 "prefill_ms": 10.0, "weight_bytes": 3.9e9} for n in (128, 512, 4064)])
        run.append("generate_skipped", [{"model": "synthetic-7b", "arch": "llama", "n_prompt": 8160, "n_new": 32,
                                         "n_ctx_train": 4096, "n_ctx": 8192, "cache_bytes": 1, "status": "skipped",
                                         "why": "prompt 8160 + 32 new = 8192 tokens > the model's n_ctx_train 4096"}])
    cs = tables.context_section(tmp_path)
    assert cs["run"].run_id == run.run_id and "synthetic-7b at 8160" in cs["message"]
    t = cs["table"]
    assert list(t.n_prompt) == [128, 512, 4064, 8160] and t.status.iloc[-1].startswith("skipped: prompt 8160")
    ax = cs["figure"].axes[0]
    assert ax.get_ylabel() == "tokens / s" and "prompt tokens" in ax.get_xlabel()
    assert tables.generation_run(tmp_path) is None           # a context sweep is not the generation run


# ------------------------------------------------------------------------------------------------ the step

def test_the_step_fails_naming_cupti_python_without_it_and_records_nothing(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "cupti", None)          # `from cupti import cupti` raises ImportError
    loaded = []
    monkeypatch.setattr(decomp.synthetic, "load_model", lambda spec: loaded.append(spec))
    with pytest.raises(trace.TraceError, match="cupti-python"):
        r9.step_decode_decomp(tmp_path, argparse.Namespace(log=print, gemma=None))
    assert not (tmp_path / "data").exists() and not loaded
    with records.recording("decode", {"what": "decode_decomp"}, root=tmp_path / "d") as run:
        with pytest.raises(trace.TraceError, match="cupti-python"):
            decomp.measure_decomp(run, progress=lambda s: None)
    assert not loaded and not run.has("decode_decomp")
    assert "decode_decomp" in r9.STEPS and "generate_context" in r9.STEPS
    names = {s.name for s in r9.STEP_RECORDS}
    assert {"decode_decomp", "generate_context"} <= names
