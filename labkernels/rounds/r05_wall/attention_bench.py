"""The attention benchmark (lab): every path checked against the fp32 baseline, then timed interleaved
(``labkernels gpu check --steps attention``, recorded as ``attention`` runs). Split from ``attention.py`` (issue 42)
so that the product's attention backends do not import the benchmark."""

from __future__ import annotations

import numpy as np

from ... import attention, attention_kinds, bench, gpu
from ...trace import NullTracer


BENCH_NTS = (512, 3325, 8192)
TORCH_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


def max_rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| in fp32 terms (both read as float64 on the host)."""
    cp = gpu.cp()
    g = cp.asnumpy(got).astype(np.float64)
    r = cp.asnumpy(ref).astype(np.float64)
    return float(np.max(np.abs(g - r)) / np.max(np.abs(r)))


def bench_point(layout: str, label: str, kind: attention_kinds.LayerKind, nt: int, dtype: str = "f16", pairs: int = 3,
                repeats: int = 10, warmup: int = 3, flush=None, seed: int = 0, progress=print) -> dict:
    """One (layout, layer kind, nt): every available path checked against the fp32 baseline, then timed interleaved
    (bench.interleaved, CUDA events, L2 flushed) at two scopes -- ``op``: the prefill's attention() from fp32 q/k/v
    to the fp16 [n, H*dv] its output GEMM reads (casts and layout copies included); ``kernel``: the attention
    kernel alone on prepared fp16 inputs (cuDNN SDPA, PyTorch SDPA per backend)."""
    cp = gpu.cp()
    tr = NullTracer()
    rng = np.random.default_rng(seed)
    H, Hk, d, dv = kind.n_head, kind.n_head_kv, kind.head_dim, kind.head_dim_v

    def act(w):   # fp16-representable fp32 activations: the comparison is about the kernels, not input rounding
        return cp.asarray(rng.standard_normal((nt, w), dtype=np.float32).astype(np.float16).astype(np.float32))

    q, k, v = act(H * d), act(Hk * d), act(Hk * dv)
    q16, k16, v16 = (attention.to_io(a, dtype) for a in (q, k, v))
    b32, b16 = attention.Baseline(None, f16=False), attention.Baseline(None, f16=True)
    ref = b32.attend(q, k, v, nt, kind, None, tr)
    op = {"baseline_f32": (lambda: b32.attend(q, k, v, nt, kind, None, tr, out16=True)),
          "baseline_f16": (lambda: b16.attend(q, k, v, nt, kind, None, tr, out16=True))}
    ker, unavailable, choice = {}, [], None
    outs = {"baseline_f16": lambda: b16.attend(q, k, v, nt, kind, None, tr)}
    try:
        c = attention.Cudnn(None, dtype)
        op["cudnn"] = lambda: c.attend(q, k, v, nt, kind, None, tr, out16=True)
        ker["cudnn"] = lambda: c.sdpa(q16, k16, v16, nt, kind.at(nt))
        outs["cudnn"] = lambda: c.attend(q, k, v, nt, kind, None, tr)
    except (attention_kinds.AttentionUnavailable, attention_kinds.AttentionError) as e:
        unavailable.append({"variant": "cudnn", "reason": str(e)})
    if not attention_kinds.lab_problems(kind) and dtype == "f16":
        la = attention.Lab(None, dtype)
        op["lab"] = lambda: la.attend(q, k, v, nt, kind, None, tr, out16=True)
        ker["lab"] = lambda: la.sdpa(q16, k16, v16, nt, kind.at(nt))
        outs["lab"] = lambda: la.attend(q, k, v, nt, kind, None, tr)
    else:
        unavailable.append({"variant": "lab", "reason": "; ".join(attention_kinds.lab_problems(kind)) or f"dtype {dtype}"})
    try:
        t_default = attention.Torch(None, dtype)
        choice = t_default.backend(nt, kind)
        op["torch"] = lambda: t_default.attend(q, k, v, nt, kind, None, tr, out16=True)
        outs["torch"] = lambda: t_default.attend(q, k, v, nt, kind, None, tr)
        for b in (None,) + TORCH_BACKENDS:
            tb = t_default if b is None else attention.Torch(None, dtype, backends=[b])
            name = "torch" if b is None else f"torch_{b.lower()}"
            views = tb._views(q16, k16, v16, nt, kind.at(nt))
            try:
                o = tb._run(*views, kind.at(nt))
                err = max_rel_err(cp.from_dlpack(o[0].transpose(0, 1).reshape(nt, H * dv).float()), ref)
            except Exception as e:   # the backend cannot take these inputs: recorded, not timed
                unavailable.append({"variant": name, "reason": f"{type(e).__name__}: {str(e)[:300]}"})
                continue
            ker[name] = (lambda tb=tb, views=views: tb._run(*views, kind.at(nt)))
            outs[f"{name}_kernel"] = err
    except attention_kinds.AttentionUnavailable as e:
        unavailable.append({"variant": "torch", "reason": str(e)})
    key = {"layout": layout, "layer": label, "mask": kind.mask, "nt": nt, "n_head": H, "n_head_kv": Hk,
           "head_dim": d, "head_dim_v": dv, "window": kind.window, "scale": kind.scale, "dtype": dtype}
    parity = []
    for name, f in outs.items():
        err = f if isinstance(f, float) else max_rel_err(f(), ref)
        tol = attention.PARITY_TOL["f16" if name.startswith("baseline") else dtype]
        parity.append({**key, "variant": name, "vs": "baseline_f32", "max_rel_err": err, "tol": tol, "ok": err <= tol})
    flops, dense = attention_kinds.attention_flops(nt, kind), attention_kinds.dense_flops(nt, kind)
    rows = []
    for scope, variants in (("op", op), ("kernel", ker)):
        res = bench.interleaved(variants, pairs=pairs, repeats=repeats, warmup=warmup, flush=flush)
        for name, per in res.items():
            for p, s in enumerate(per):
                rows.append({**key, "scope": scope, "variant": name, "pair": p, **s, "flops": flops,
                             "tflops": flops / (s["median_us"] * 1e-6) / 1e12,
                             "tflops_dense": dense / (s["median_us"] * 1e-6) / 1e12,
                             "torch_choice": choice if name.startswith("torch") else None})
    best = {}
    for r in rows:
        kk = (r["scope"], r["variant"])
        best[kk] = min(best.get(kk, np.inf), r["median_us"])
    progress(f"attention {layout} {label} nt={nt}: " + ", ".join(
        f"{s}:{n} {flops / (us * 1e-6) / 1e12:.0f} TFLOPS" for (s, n), us in sorted(best.items()))
        + (f"; torch picks {choice}" if choice else "") + "; parity " + ", ".join(
        f"{p['variant']} {p['max_rel_err']:.1e}" for p in parity))
    return {"rows": rows, "parity": parity, "unavailable": [{**key, **u} for u in unavailable], "torch_choice": choice}


def summarize(rows) -> list[dict]:
    """Per (layout, layer, nt, scope, variant): the best pair's median and TFLOPS; kernel-scope cuDNN vs the best
    PyTorch backend and op-scope cuDNN vs the baseline as ratios (>1: cuDNN faster)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    g = df.groupby(["layout", "layer", "mask", "nt", "scope", "variant"], as_index=False).agg(
        median_us=("median_us", "min"), tflops=("tflops", "max"))
    out = []
    for (lay, layer, nt), p in g.groupby(["layout", "layer", "nt"]):
        k = p[p.scope == "kernel"].set_index("variant")
        o = p[p.scope == "op"].set_index("variant")
        torch_k = k[k.index.str.startswith("torch")]
        row = {"layout": lay, "layer": layer, "mask": p["mask"].iloc[0], "nt": int(nt)}
        if "cudnn" in k.index:
            row["cudnn_kernel_tflops"] = float(k.loc["cudnn", "tflops"])
        if len(torch_k):
            row["torch_best_backend"] = str(torch_k.tflops.idxmax())
            row["torch_best_tflops"] = float(torch_k.tflops.max())
        if "cudnn" in k.index and len(torch_k):
            row["cudnn_vs_torch_best"] = row["cudnn_kernel_tflops"] / row["torch_best_tflops"]
        if "lab" in k.index:
            row["lab_kernel_tflops"] = float(k.loc["lab", "tflops"])
            if "cudnn" in k.index:      # > 1: the lab's kernel faster than cuDNN's at the same point
                row["lab_vs_cudnn"] = float(k.loc["cudnn", "median_us"] / k.loc["lab", "median_us"])
        for v in ("cudnn", "lab", "baseline_f16", "baseline_f32", "torch"):
            if v in o.index:
                row[f"op_ms_{v}"] = float(o.loc[v, "median_us"]) / 1e3
        if "cudnn" in o.index and "baseline_f16" in o.index:
            row["cudnn_vs_baseline_f16"] = float(o.loc["baseline_f16", "median_us"] / o.loc["cudnn", "median_us"])
        out.append(row)
    return out


def record_bench(run, layouts: dict | None = None, nts=BENCH_NTS, dtype: str = "f16", pairs: int = 3,
                 repeats: int = 10, progress=print) -> dict:
    """The attention benchmark recorded into ``run``: tables timings, parity, unavailable, summary."""
    layouts = layouts or attention_kinds.bench_layouts()
    flush = bench.Flusher()
    rows, parity = [], []
    for lay, kinds in layouts.items():
        for label, kind in kinds.items():
            for nt in nts:
                r = bench_point(lay, label, kind, nt, dtype=dtype, pairs=pairs, repeats=repeats, flush=flush,
                                progress=progress)
                run.append("parity", r["parity"])
                if r["unavailable"]:
                    run.append("unavailable", r["unavailable"])
                run.append("timings", r["rows"])
                rows += r["rows"]
                parity += r["parity"]
                gpu.cp().get_default_memory_pool().free_all_blocks()
    summ = summarize(rows)
    run.append("summary", summ)
    head = next((s for s in summ if s["layout"] == "synthetic-7b" and s["nt"] == 3325), {})
    ok = all(p["ok"] for p in parity)
    run.finish(parity_ok=ok, cudnn_info=attention.cudnn_info(), **{k: v for k, v in head.items() if k not in ("layout", "layer", "mask")})
    return {"ok": ok, "summary": summ}
