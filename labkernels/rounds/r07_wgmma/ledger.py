"""Round 7's steps as a ledger: for each step, what it asked, what was predicted before its GPU run, what was
measured, and the verdict. The steps ledger page (``reports/07_wgmma_kquant_steps.html``) opens with this table and
heads each step's section with its row (:func:`labkernels.report.step`); the section below it holds the figures and
tables read from the step's recorded runs. The text is the page's own summary of each step, written once here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    number: int | str      # 1..28, or a name for a measured form outside the numbered steps
    title: str             # what the step asked or built
    prediction: str        # written before its GPU run
    measured: str          # what the run(s) gave
    verdict: str           # right / wrong / partly, and what was kept
    runs: str = ""         # the recorded runs it reads

    @property
    def label(self) -> str:
        return f"step {self.number}" if isinstance(self.number, int) else str(self.number)


STEPS: tuple[Step, ...] = (
    Step(1, "the register-fed wgmma kernel: weights converted in the consumers' registers (BN=128 and BN=256)",
         "BN=128 near issue-bound at ~55-65% of the tensor line, BN=256 near cuBLAS (~80%); nt=512 ~0.8x cuBLAS",
         "51-62% (BN=128) and 80-82% (BN=256) SM throughput; nt=4096 0.92-1.01x cuBLAS, nt=512 0.65-0.82x",
         "right in size, wrong in cause: issue slots were 39-45% busy, the loss is latency; kept (the kernel)",
         "20261201T091148Z"),
    Step(2, "a stream-K tile scheduler (SK=1) for nt=512",
         "BN=256 stream-K ~1.9x BN=256 data-parallel at 4096x4096, nt=512 within +-5% of cuBLAS",
         "1.22-1.49x data-parallel (1.29x, not 1.9x); best nt=512 point 0.82-0.87x cuBLAS (q4_K), 0.69-0.75x (q6_K); "
         "a stream-K launch pays 10.8 us fixed against cuBLAS's 6.7 us",
         "wrong by the per-launch cost; kept (SK=1)", "20261201T103932Z, cost scan 20261201T143621Z"),
    Step(3, "the uniform split-k grid (SK=2): G CTAs per tile, each a G-th of its k",
         "5-10% faster than stream-K where it fits, nothing elsewhere",
         "1.06-1.11x stream-K at 4096x4096 and 4096x14336; nt=512 0.72-0.93x cuBLAS",
         "right; kept (SK=2), the target at nt=512 still not met", "20261201T174905Z"),
    Step("shared-memory form", "FORM=1 (wgmma_kqs): a converter warpgroup writes f16 weights to shared memory, the "
         "consumers only issue wgmma",
         "the consumers near cuBLAS's issue pattern, nt=512 within +-10% of cuBLAS",
         "slower at every point: ~0.70x cuBLAS at nt=512 (the register form 0.83-0.87x), 0.77-0.82x at nt=4096",
         "wrong; kept as a measured variant, auto does not pick it", "20261201T150328Z (ncu)"),
    Step(4, "the epilogue of a CTA's last segment (EPI=1 bulk fold, EPI=2 TMA store) and the tile-aligned split (SK=3)",
         "EPI=1 1-2 us off the split launches at nt=512, EPI=2 another 0.5-1.5 us; SK=3 1.06-1.11x stream-K at 4096x11008",
         "EPI=1 0-4% slower, EPI=2 0-3% slower; SK=3 1.07x (q4_K) and 1.11x (q6_K) stream-K",
         "epilogue wrong, split right; SK=3 joined the benchmark of record", "20261201T230951Z, 20261201T231237Z"),
    Step(5, "what the consumers wait on: a deeper A register queue (AQ=4) and an L2 prefetch of the weights (PF)",
         "AQ=4 within +-5% of AQ=2; PF q6_K BN=128 +3-8%, q4_K within +-3%",
         "AQ=4 4-10% slower for q4_K, 0-4% faster for q6_K; PF 0-5% slower for q4_K, -3..+2% for q6_K",
         "wrong in the direction that matters; neither kept", "20261202T003808Z, 20261202T010302Z"),
    Step(6, "the split grid's partial sums through distributed shared memory (EPI=3, 2-CTA clusters)",
         "2-4 us off the SK=3 BN=256 launches at nt=512",
         "1.00-1.01x the plain epilogue at nt=512 (~0.2 us of 34 us)",
         "wrong: the partial sums' L2 traffic is not the finish's time; kept as a variant", "20261202T024803Z"),
    Step(7, "every tile's store through a staging buffer of its own (EPI=4)",
         "+2-4% at nt=2048/4096 for BN=256 data-parallel and stream-K, +-1% at nt=512",
         "data-parallel 0.994-1.014x, stream-K 0.96-1.03x (best at 11008x4096)",
         "wrong for data-parallel; EPI=4 on stream-K joined the benchmark of record", "20261202T030856Z"),
    Step(8, "two converter warpgroups for the shared-memory form (FORM=2)",
         "1.2-1.5x FORM=1",
         "1.04-1.08x FORM=1; the form stays at 0.50-0.64x cuBLAS",
         "wrong: one converter was not what held the form; not kept", "20261202T050157Z"),
    Step(9, "the register form's conversion in 16-bit arithmetic",
         "q4_K BN=128 +8-15% at nt=512, q6_K 0-4%, q4_K BN=256 +3-8% at nt=4096",
         "q4_K BN=128 1.09-1.17x, BN=256 0.99-1.04x; q6_K 0.99-1.05x",
         "right for BN=128, wrong for BN=256; kept (the benchmark of record 20261202T053352Z)", "20261202T053352Z"),
    Step(10, "a precomputed q4_K scale plane (SCL=2)",
         "+4-8%: q4_K 4096x4096 nt=512 from 530 to 550-570 TOPS-eq",
         "0.80-0.91x SCL=0; 527 -> 437 TOPS-eq",
         "wrong in sign (the plane's loads arrive later); made opt-in", "20261202T070827Z"),
    Step(11, "what the weights cost the loop: their loads against their conversion (ceiling builds)",
         "q4_K BN=128 loads >= half of the weights' cost, q6_K >= 0.6; the skeleton >= 1.05x cuBLAS",
         "q4_K: loads 12-37%, the conversion the rest; q6_K half each; skeleton 1.03-1.11x at three shapes, 0.91x at "
         "11008x4096",
         "wrong for q4_K, right for q6_K; a measurement, nothing to keep", "20261202T075528Z"),
    Step(12, "the weights staged in shared memory per thread (cp.async, exploratory)",
         "q6_K BN=128 +8-15%, BN=256 +3-8%, q4_K BN=128 +2-5%",
         "slower at every launch: q4_K 0.64-0.96x, q6_K 0.78-1.00x",
         "wrong in sign; ruled out, left the kernel", "20261202T090329Z"),
    Step(13, "the weights through shared memory by the producer's TMA (exploratory, five builds)",
         "q6_K BN=128 +15-25% at nt=512, BN=256 +5-12%, q4_K BN=128 +2-6%",
         "q6_K BN=128 1.04-1.11x, BN=256 0.95-1.03x; q4_K 0.92-1.03x; two builds raced (caught by the bitwise gate)",
         "right in sign for q6_K, wrong in size, no gain for q4_K; not kept",
         "20261202T151044Z, 151606Z, 162332Z"),
    Step(14, "where the nt=512 split launches lose their time, and the reduce finish (EPI=5)",
         "the owner's finish 6.7 -> ~2.5 us; q4_K's tile split 0.82x -> 0.90-0.96x cuBLAS",
         "finish 6.67 -> 2.0-2.3 us, but the launch only 1.01-1.04x: 0.86x cuBLAS",
         "wrong in size: removing ~4.7 us of finish bought ~1.4 us; kept (EPI=5)",
         "20261202T230614Z, 231605Z, 20261203T055851Z"),
    Step(15, "is the time outside the trace's stamps the host's? (timing method)",
         "the nt=512 launches 2-6 us faster behind a host lead",
         "every timed call's host path is shorter than the flush; ratios within 1%",
         "wrong: the numbers are device time, the ~6 us is on the device", "20261203T114336Z"),
    Step(16, "the launch floor, and the trace from a cold L2",
         "empty build 3.5-5.0 us; cold span 1-3 us longer; drain <= 1.5 us",
         "floor 2.9-3.4 us; q4_K span +0.5-1.7 us, q6_K +3.5-7.7 us cold; drain ~1.4 us",
         "mostly right, q6_K's cold slowdown not predicted; a measurement", "20261203T130432Z, 130504Z"),
    Step(17, "the weights prefetched into L2 by the producer's TMA (exploratory)",
         "q6_K +8-15% at nt=512, q4_K 0-3%",
         "q6_K 0.97-1.05x, q4_K 0.84-1.02x",
         "wrong; not kept", "20261203T132153Z"),
    Step(18, "the SM clock during the launches, against cuBLAS's",
         "the launches of record at 1.60-1.70 GHz, cuBLAS 0-7% higher",
         "cuBLAS at the lower clock (1,657-1,684 MHz) against 1,585-1,769 MHz: in cycles the kernel is further behind",
         "wrong in sign; a measurement", "20261203T132845Z"),
    Step(19, "the helper's reduce-adds in the other order (exploratory)",
         "the EPI=5 split launches +2-4% at nt=512",
         "q4_K +0.5-1.1%, q6_K -1.7..-0.1% at nt=512; up to -4.7% at nt=4096",
         "wrong; ruled out, left the kernel", "20261203T134832Z"),
    Step(20, "what a launch pays once against what it pays per k: the k scan",
         "cuBLAS 5.0-6.5 us + 5.3-5.6 ns/k; q4_K's split all fixed cost, its loop cuBLAS's",
         "cuBLAS 6.1 us + 5.34 ns/k; q4_K split 11.6 us + 5.31 ns/k; BN=128 7.2 us + 6.26 ns/k",
         "right: no launch has both cuBLAS's fixed cost and its cost per k", "20261203T165118Z, 163237Z"),
    Step(21, "one 64-row tile per CTA, its k split between the two consumer warpgroups (KPAIR, four builds)",
         "q4_K 0.85-1.00x cuBLAS at od=4096, nt=512; q6_K 0.75-0.90x",
         "builds 1-3 0.42-0.66x (a cluster-scope fence per chunk); build 4 q4_K 0.88-0.92x, q6_K 0.81-0.84x",
         "right for build 4 at od=4096, behind elsewhere; exploratory, not used by qmatmul",
         "20261203T183132Z, 183846Z, 184426Z, 185507Z"),
    Step(22, "a shared-memory budget, and what cuBLAS runs (counters of the baseline)",
         "halving what a KPAIR CTA receives 1.04-1.18x; shared-memory banks >= 85% busy for KPAIR",
         "the ablation 0.96-1.05x; KPAIR uses 20% of each bank way; cuBLAS runs the lab's BN=128 grid at 85-95% "
         "tensor-active",
         "wrong: shared memory is not the limit; the gap is the loop on the same grid", "20261204T140317Z"),
    Step(23, "the shared-memory form without its conversion (ablation)",
         "the converters hold the form: >= 0.95x cuBLAS without them",
         "0.72-0.90x without conversion; the conversion costs it 1.44-1.78x more",
         "wrong in its either/or: both halves cost the form; ruled out as the route", "20261204T142127Z"),
    Step(24, "what holds the KPAIR loop: its pair's lock-step or its conversion (ablations)",
         "conversion q4_K 1.00-1.06x, q6_K 1.10-1.25x; lock-step 1.06-1.15x at nt=512",
         "conversion 1.02-1.07x (q4_K), 1.07-1.16x (q6_K); lock-step 1.01-1.05x; without both 0.93-0.97x cuBLAS",
         "conversion about right, lock-step wrong (small)", "20261204T163906Z"),
    Step(25, "where the 64-row CTA's time goes, stamped beside BN=128's (trace)",
         "setup 0.5-1.0 us, fill 1.5-2.5 us, loop 4,350-4,600 cycles per super-block, exit wait 0.1-0.5 us",
         "setup 0.83 us, fill 1.95 us, loop 4,393 cycles, exit wait 1.17 us: ~6.3 us around a 22 us loop",
         "right but for the exit wait; a measurement", "20261204T165923Z"),
    Step(26, "the KPAIR build's finish by TMA stores, and its exit barrier split (FIN)",
         "FIN over KPAIR 1.02-1.05x at nt=512 (od=4096), 1.04-1.08x at nt=4096",
         "1.022x / 1.025x at 4096x4096, 1.005-1.008x at the wide ids, no gain at nt=4096",
         "right at one shape, high elsewhere; exploratory", "20261204T171544Z"),
    Step(27, "the KPAIR build's cold start, overlapped with its setup (three forms)",
         "EARLY over FIN 1.01-1.03x at nt=512; then OVERLAP 1.00-1.02x; the consumers' requests alone 1.00-1.02x",
         "EARLY 0.923x, OVERLAP 0.945x, producer's requests 0.950x, consumers' 0.985x (q4_K 4096x4096)",
         "wrong three times: every form slower than FIN; none kept",
         "20261204T202619Z, 203358Z, 204433Z"),
    Step(28, "what the float32 Y costs (ablation: half of Y's bytes stored)",
         "HALFY over FIN 1.01-1.03x at 4096x4096 nt=512, 1.02-1.04x at 11008x4096",
         "1.023x (q4_K) / 1.011x (q6_K) at 4096x4096, 1.021x / 1.019x at 11008x4096",
         "right: a 16-bit Y would buy at most 2.4%, not the gap", "20261204T205701Z"),
)


def table():
    """The ledger as a DataFrame (one row per step) for the top of the steps page."""
    import pandas as pd

    return pd.DataFrame([{"step": s.label, "what it asked or built": s.title, "predicted (before the run)": s.prediction,
                          "measured": s.measured, "verdict": s.verdict} for s in STEPS])


def step(number) -> Step:
    hit = [s for s in STEPS if s.number == number]
    if not hit:
        raise KeyError(f"round 7 has no step {number!r}; steps: {', '.join(str(s.number) for s in STEPS)}")
    return hit[0]
