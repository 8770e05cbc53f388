"""The lab against the peer: vs-llama tables and the notes beside them.

:func:`mmq_vs_llama`, :func:`prefill_vs_llama`, :func:`latest_prefill_vs_llama` and :func:`classes_vs_llama` form
ratios only for matched (type, m, n, k) / (model, nt) keys from one named peer run (:func:`find_peer_run`) on the same
GPU model, and return a :class:`PeerComparison` whose message says "no peer measurement: <why>" when there is none.
:data:`MMQ_NOTES` and :data:`BENCH_NOTES` say what differs between llama.cpp's numbers and the lab's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from .. import records
from .run import ROUND

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
        return None, (f"no recorded {ROUND} run (labkernels peers gpu-run on the GPU machine, then labkernels data "
                      "import)")
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
