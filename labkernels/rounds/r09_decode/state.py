"""Where round 9 stands, for the top of its page: the latest measured step's best GEMV point against llama.cpp's MMVQ
on the same card, the synthetic 7B's generation against llama-bench's tg128 and the next step (:func:`state_facts`,
:func:`state_now`, the abstract :func:`abstract_now`); every figure names its run, and a ratio of runs that cannot
come from one device call says so (:func:`same_call`)."""

from __future__ import annotations

from ... import gemv
from . import tables
from .ledger import LEDGER
from .plan import TARGETS


def record_run(root=None):
    """The GEMV benchmark of record -- the run ``qmatmul(kernel="auto")`` reads its choices from
    (:func:`labkernels.gemv.auto_table`: the latest complete ``what: gemv_bench`` run that saw no power or thermal cap)
    -- and the ledger step that names it: (step or None, run), or (None, None) where none is recorded. A later step's
    A/B (a generation run, one form against another) is not the product's figure and never the headline's."""
    run = gemv.bench_of_record(root)
    if run is None:
        return None, None
    return next((s for s in LEDGER if run.run_id in (s.get("runs") or [])), None), run


def peer_mmvq_us(card: str | None, qtype: str, od: int, id_: int, n: int = 1, root=None) -> tuple[float, str] | None:
    """llama.cpp's MUL_MAT time (µs) of one shape on ``card`` from the latest peers run whose ``mmq`` table has it
    (test-backend-ops; m = od, k = id), with the run id; None where none is recorded."""
    for r in tables.peer_runs_on(card, "mmq", root):
        t = r.table("mmq")
        hit = t[(t.type == qtype) & (t.m == od) & (t.k == id_) & (t.n == n)]
        if len(hit):
            return float(hit.us_per_run.median()), r.run_id
    return None


def state_facts(root=None) -> dict:
    """The figures of :func:`state_now`, unformatted: ``gemv`` (the benchmark of record, :func:`record_run`: step,
    run, card, us, frac_copy, variant, mmvq_us, mmvq_run), ``gen`` (run, card, tok_s, frac_copy, llama_tg128, peer_run) and ``next`` (the first step without a
    run); a key is absent where its data is not recorded."""
    out = {}
    step, srun = record_run(root)
    if srun is not None:
        b = tables.best_per_point(tables.bench_table(srun))
        r = b[(b.qtype == "q4_K") & (b.od == 4096) & (b.id == 14336) & (b.nt == 1) & (b.act == "f16")]
        card = srun.gpu_name or "?"
        if len(r):
            r = r.iloc[0]
            peer = peer_mmvq_us(card, "q4_K", 4096, 14336, 1, root)
            out["gemv"] = {"step": step["step"] if step else None, "run": srun.run_id, "card": card, "us": float(r.median_us),
                           "frac_copy": float(r.frac_copy), "variant": r.variant,
                           "mmvq_us": peer[0] if peer else None, "mmvq_run": peer[1] if peer else None}
    gen = tables.generation_run(root)
    if gen is not None:
        gt = tables.generation_table(gen)
        card = gen.gpu_name or "?"
        peer = tables.peer_generation(card, root)
        row = gt[(gt.model == "synthetic-7b") & (gt.n_prompt == 512)]
        if len(row):
            row = row.iloc[0]
            tg = peer[(peer.model == "synthetic-7b") & (peer.test == "tg128") & (peer.flash_attn == 1)] \
                if len(peer) else peer
            out["gen"] = {"run": gen.run_id, "card": card, "tok_s": float(row.tok_per_s),
                          "frac_copy": float(row.frac_copy),
                          "llama_tg128": float(tg.tok_s.iloc[0]) if len(tg) else None,
                          "peer_run": tg.run.iloc[0] if len(tg) else None}
    pending = [s for s in LEDGER if not s.get("runs")]
    if pending:
        out["next"] = pending[0]
    return out


def same_call(run_a: str, run_b: str, minutes: float = 30.0) -> bool:
    """Whether two run ids can come from one device call: the same card and commit, recorded within ``minutes`` (a
    machine is held at most 30 minutes). A ratio of runs that cannot is said to be across calls on the page."""
    import datetime as dt

    try:
        (ta, ca, ka), (tb, cb, kb) = (r.split("-", 2) for r in (run_a, run_b))
        da, db = (dt.datetime.strptime(t, "%Y%m%dT%H%M%SZ") for t in (ta, tb))
    except (ValueError, AttributeError):
        return False
    return ca == cb and ka == kb and abs((da - db).total_seconds()) <= minutes * 60


def _across(run_a: str, run_b: str) -> str:
    return "" if same_call(run_a, run_b) else "; measured in another device call"


def state_now(root=None) -> dict:
    """Where the round stands, for the top of the page: the benchmark of record's (the product's) best q4_K
    4096x14336 nt=1 f16 point against llama.cpp's MMVQ on the same card, the synthetic 7B's generation against llama-bench tg128, and the
    next step; every figure names its run. Rows whose data is not recorded are left out."""
    f, out = state_facts(root), {}
    if "gemv" in f:
        g = f["gemv"]
        vs = (f"; llama.cpp MMVQ {g['mmvq_us']:.1f} us (peers run {g['mmvq_run']}{_across(g['run'], g['mmvq_run'])}): "
              f"the lab at {g['mmvq_us'] / g['us']:.2f}x its speed" if g["mmvq_us"] else "")
        at = f"step {g['step']}, run {g['run']}" if g["step"] else f"run {g['run']}"
        out[f"GEMV, benchmark of record ({at})"] = (
            f"q4_K 4096x14336 nt=1 f16 {g['us']:.1f} us = {g['frac_copy']:.0%} of the copy line "
            f"({g['variant']}, {g['card']}){vs}")
    if "gen" in f:
        g = f["gen"]
        vs = (f"; llama-bench tg128 {g['llama_tg128']:,.0f} tok/s (peers run {g['peer_run']}"
              f"{_across(g['run'], g['peer_run'])}): "
              f"{g['tok_s'] / g['llama_tg128']:.2f}x (target: {TARGETS['vs_llama_tg']:g}x)" if g["llama_tg128"] else "")
        out[f"decode, synthetic 7B Q4_K_M (run {g['run']})"] = (
            f"{g['tok_s']:,.0f} tok/s after a 512-token prompt = {g['frac_copy']:.0%} of the copy line "
            f"({g['card']}){vs}")
    if "next" in f:
        s = f["next"]
        main = next((c for c in s["prediction"] if c.get("headline")), s["prediction"][0])   # the step's main claim
        out[f"next (step {s['step']}, built at {s['commit']})"] = (
            f"{s['name']}: not measured yet; predicted {main['what']}: {main['low']:g}-{main['high']:g} "
            f"({main['metric']})")
    return out


def abstract_now(root=None) -> str:
    """The page's three-sentence abstract from :func:`state_facts`."""
    f = state_facts(root)
    parts = []
    if "gemv" in f:
        g = f["gemv"]
        parts.append(f"its best GEMV reads a q4_K 4096x14336 weight at one token in {g['us']:.1f} us, "
                     f"{g['frac_copy']:.0%} of the copy line" + (f" ({g['mmvq_us'] / g['us']:.2f}x the speed of "
                                                                 f"llama.cpp's MMVQ"
                                                                 + (")" if same_call(g.get("run", ""), g.get("mmvq_run", "")) else
                                                                    ", timed in another call on the same card model)")
                                                                 if g["mmvq_us"] else ""))
    if "gen" in f:
        g = f["gen"]
        parts.append(f"the synthetic 7B generates {g['tok_s']:,.0f} tokens/s" + (
            f" ({g['tok_s'] / g['llama_tg128']:.2f}x llama-bench's tg128)" if g["llama_tg128"] else ""))
    first = ("Round 9 builds the lab's decode — k-quant matrix-vector kernels measured against the copy bandwidth of "
             "the same card, and generation with a KV cache — each against llama.cpp on the same card and GGUF.")
    cards = {f[k]["card"] for k in ("gemv", "gen") if k in f}
    if len(cards) > 1:          # the figures came from different cards: each names its own
        parts = [f"{p} (on an {f[k]['card']})" for p, k in zip(parts, [k for k in ("gemv", "gen") if k in f])]
    mid = ((f"On an {cards.pop()}, " if len(cards) == 1 else "") + " and ".join(parts) + "."
           if parts else "Nothing is recorded yet.")
    mid = mid[0].upper() + mid[1:]
    last = (f"Both are short of their targets ({TARGETS['frac_copy_nt1']:.0%} of the copy line at one token, "
            f"{TARGETS['vs_llama_tg']:g}x llama.cpp's tokens/s)"
            + (f"; step {f['next']['step']} ({f['next']['name'].split(':')[0]}) is built and waits for its run."
               if "next" in f else "."))
    return " ".join((first, mid, last))
