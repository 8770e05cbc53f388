"""The lab's figures of record: one number per fact.

A figure that more than one page shows (or the README, or a later round) comes from one function here, which
names the recorded run it reads and how that run measured it: the synthetic 7B's prefill of record
(:func:`prefill`), each ratio against llama.cpp's prefill (:func:`prefill_vs_llama`), the GEMM benchmark of record
(:func:`gemm_run`, :func:`gemm`). Any other figure of the same quantity on a page says how it differs (eager, no
cuDNN frontend, an older run, a traced replay) -- :func:`differs` writes that label.

The *targets* (bars the lab set itself before a round) live here too, each with where it came from
(:data:`TARGETS`); a page says "target", never an issue number.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import peers, prefill_runs, records
from .rounds.r07_wgmma import tables

#: the model and prompt length of the prefill figures (llama-7B shapes, llama.cpp's Q4_K_M recipe; 3325 tokens
#: is the seeds' decomposition's prompt)
PREFILL_MODEL = "synthetic-7b"
PREFILL_NT = 3325
#: the prefill variant of record: the forward captured as one CUDA graph and replayed, with the small kernels
#: fused (what ``labkernels model prefill`` runs by default)
RECORD_VARIANT = "graph-fused"


@dataclass(frozen=True)
class Target:
    what: str          # the bar, as a reader reads it
    source: str        # where it came from

    def text(self, met: bool | None = None) -> str:
        """'>= 2x ... (where it came from): met' -- the value of a headline row named 'target ...'."""
        state = "" if met is None else (": met" if met else ": not met")
        return f"{self.what} ({self.source}){state}"


#: the lab's targets, by name: what each asked and where it came from (no page names an issue)
TARGETS = {
    "q6k_expb": Target(">= 1.6x the generic q6_K kernel and >= 400 TOPS-eq",
                       "set when round 3 was planned, from the seeds' q6_K campaign"),
    "wgmma_large": Target(">= 650 TOPS-eq and >= 0.85x cuBLAS fp16 at nt=4096",
                          "set when round 7 was planned"),
    "wgmma_small": Target(">= 1.0x cuBLAS fp16 at nt=512", "set when round 7 was planned"),
    "prefill_7b": Target(">= 2x 8,428 tok/s (16,856) for the synthetic 7B at nt=3325",
                         "set when round 7 was planned: twice the lab's int8-kernel prefill of then"),
    "host_overhead": Target("<= 5% host overhead at nt=512", "set for the captured-graph prefill (round 5)"),
    "sweep": Target("every sweep point within the serial runs' noise floor", "set when round 8 was planned"),
}
PREFILL_BASE_TOK_S = 8428      # the int8-kernel prefill the 7B target doubles


@dataclass(frozen=True)
class Fact:
    """One figure of record: its value, unit, the run it comes from and how that run measured it."""
    value: float
    unit: str
    run_id: str
    how: str
    fmt: str = "{:,.0f}"

    def __str__(self) -> str:
        return self.text()

    @property
    def shown(self) -> str:
        return self.fmt.format(self.value) + (f" {self.unit}" if self.unit and not self.unit.startswith("x") else
                                              self.unit)

    def text(self) -> str:
        return f"{self.shown} ({self.how}, run {self.run_id})"


class FactError(LookupError):
    """No recorded run holds the figure asked for (the message names what was looked for, and where)."""


def differs(how: str, run_id: str) -> str:
    """The label of a figure that is not the one of record: how it differs, and its run."""
    return f"{how}; run {run_id}, not the figure of record"


# --------------------------------------------------------------------------------------------- prefill

def prefill_run(model: str = PREFILL_MODEL, root=None):
    """The prefill run of record for ``model``: the newest prefill_graph run (eager vs graph, every fusion, the
    interleaved rounds) made with the project's whole GPU stack (the cuDNN frontend present)."""
    run = prefill_runs.latest_graph_run(model, "throughput", root=root, cudnn=True)
    if run is None:
        raise FactError(f"no prefill_graph run of {model} with the cuDNN frontend under "
                        f"{(root or records.data_root()) / records.folder('prefill')}")
    return run


def _median(run, model: str, nt: int, variant: str) -> tuple[float, int]:
    t = run.table("throughput")
    t = t[(t.model == model) & (t.nt == nt) & (t.variant == variant)]
    if t.empty:
        raise FactError(f"run {run.run_id} has no {variant} rows of {model} at nt={nt}")
    return float(t.tok_per_s.median()), len(t)


def prefill(model: str = PREFILL_MODEL, nt: int = PREFILL_NT, root=None) -> Fact:
    """The prefill of record: tok/s of the captured, fused forward (:data:`RECORD_VARIANT`), median of its run's
    interleaved rounds."""
    run = prefill_run(model, root)
    v, n = _median(run, model, nt, RECORD_VARIANT)
    return Fact(v, "tok/s", run.run_id, f"{model}, nt={nt}, captured graph with the fusions, median of {n} rounds")


def prefill_without_cudnn(model: str = PREFILL_MODEL, nt: int = PREFILL_NT, root=None) -> Fact | None:
    """The same figure from the newest run made without the cuDNN frontend (the lab's attention on every layer):
    an experiment of its own, labelled as such; None when there is none."""
    run = prefill_runs.latest_graph_run(model, "throughput", root=root, cudnn=False)
    if run is None:
        return None
    v, n = _median(run, model, nt, RECORD_VARIANT)
    return Fact(v, "tok/s", run.run_id, f"{model}, nt={nt}, graph replay without the cuDNN frontend (the lab's "
                                        f"attention on every layer), median of {n} rounds: not the figure of record")


def prefill_vs_llama(model: str = PREFILL_MODEL, flash_attn: int = 1, root=None) -> dict[int, Fact]:
    """{nt: lab tok/s / llama.cpp tok/s}: the prefill run of record's :data:`RECORD_VARIANT` against llama-bench
    on the same GGUF recipe and nt (llama.cpp's flash attention on: ``flash_attn=1``), the peers run named."""
    import pandas as pd

    run = prefill_run(model, root)
    t = run.table("throughput")
    t = t[(t.model == model) & (t.variant == RECORD_VARIANT)]
    lab = t.groupby(["model", "nt"], as_index=False).tok_per_s.median()
    c = peers.prefill_vs_llama(pd.DataFrame(lab), peers.run_gpu_name(run), root=root, flash_attn=flash_attn)
    if not c.ok:
        raise FactError(f"prefill run {run.run_id} against llama.cpp: {c.message}")
    return {int(r.nt): Fact(float(r.vs_llama), "x", run.run_id,
                            f"{RECORD_VARIANT} vs llama-bench (flash attention {'on' if flash_attn else 'off'}, "
                            f"{r.llama_tok_s:,.0f} tok/s, peers run {c.run_id})", fmt="{:.2f}")
            for r in c.table.itertuples()}


def vs_llama_text(vs: dict[int, Fact]) -> str:
    """'nt=512: 3.38x; nt=3325: 3.69x (llama-bench with flash attention on, peers run ...)': the ratios of
    :func:`prefill_vs_llama` in one line, the peers run named once."""
    peer = {f.how.rsplit("peers run ", 1)[-1].rstrip(")") for f in vs.values()}
    return "; ".join(f"nt={n}: {f.shown}" for n, f in sorted(vs.items())) + \
        f" (llama-bench with flash attention on, peers run {', '.join(sorted(peer))})"


def prefill_target(fact: Fact) -> str:
    """The 7B target, read against the prefill of record."""
    t = TARGETS["prefill_7b"]
    return t.text(fact.value >= 2 * PREFILL_BASE_TOK_S) + f" ({fact.value / PREFILL_BASE_TOK_S:.2f}x 8,428)"


# ------------------------------------------------------------------------------------------------ GEMM

def gemm_run(root=None):
    """The GEMM benchmark of record: the newest complete round-7 benchmark run (``wgmma_bench``: every shape, nt,
    type and variant interleaved with cuBLAS fp16 and the int8 kernels, parity-gated before timing)."""
    run = records.latest("wgmma", root, where=lambda r: r.has("wgmma_bench"))
    if run is None:
        raise FactError(f"no wgmma benchmark run under {(root or records.data_root()) / records.folder('wgmma')}")
    return run


def gemm_summary(root=None):
    return tables.summary(gemm_run(root).table("wgmma_bench"))


def gemm(qtype: str, od: int, id_: int, nt: int, root=None, summary=None) -> tuple[Fact, Fact]:
    """(TOPS-eq of the fastest wgmma_kq variant, its time ratio to cuBLAS fp16 on cached weights) at one point of
    the benchmark of record."""
    run = gemm_run(root)
    s = summary if summary is not None else gemm_summary(root)
    r = s[(s.qtype == qtype) & (s.od == od) & (s.id == id_) & (s.nt == nt)]
    if r.empty:
        raise FactError(f"benchmark run {run.run_id} has no point {qtype} {od}x{id_} nt={nt}")
    r = r.iloc[0]
    how = f"{qtype} {od}x{id_}, nt={nt}, fastest variant {r.best}, median of interleaved rounds"
    return (Fact(float(r.tops_eq), "TOPS-eq", run.run_id, how),
            Fact(float(r.vs_cublas_f16_cached), "x cuBLAS fp16", run.run_id, how, fmt="{:.2f}"))
