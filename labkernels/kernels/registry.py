"""The kernel registry: one table, read by the build layer, the benchmark, the ptxas audit, the occupancy
round and the notebooks.

Each *family* row names a CUDA source in this folder, a ``__global__`` template, its template parameters
(ordered as in the template) with the values the lab instantiates, the block size, the tile (tokens x
output rows per block) and the launcher's dynamic shared-memory formula as an expression over the
parameters. ``KERNELS`` is the expansion of every family over its parameter grid: one entry per template
instantiation. Adding a row (or a value to a grid) is all it takes for the audit, the occupancy
cross-check and the benchmark to pick a kernel up.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass, field
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent

#: tile constants shared by the int8 GEMM kernels (tokens per block, output rows per block, threads per block):
#: the one place they are written; the CUDA sources receive them as ``-DLK_BM=.. -DLK_BN=.. -DLK_THREADS=..``
#: (:func:`cuda_defines`), and ``tile.cuh`` refuses to compile without them
BM = 64
BN = 128
THREADS = 256
#: round 7's wgmma_kq: stream-K segments a CTA's shared-memory list holds (the launcher checks a schedule against it)
SK_MAXSEG = 8
#: the largest head_dim the fused q/k-norm + RoPE kernel of the prefill stages in shared memory (one row of floats)
QKNORM_MAXHD = 512
#: add_rmsnorm's register forms (round 9 step 10): J elements of the row a thread, up to J * 256 columns; 0 the loop
NORM_J = (0, 4, 8, 16, 32)


def norm_j(ncols: int) -> int:
    """The smallest register form of add_rmsnorm that holds a row of ``ncols`` (J * 256 >= ncols), 0 (the loop) above
    the largest."""
    return next((j for j in NORM_J if j and j * THREADS >= ncols), 0)


def cuda_defines() -> tuple[str, ...]:
    """The compiler options carrying the registry's tile constants to every CUDA source (NVRTC and nvcc)."""
    return (f"-DLK_BM={BM}", f"-DLK_BN={BN}", f"-DLK_THREADS={THREADS}", f"-DLK_SK_MAXSEG={SK_MAXSEG}",
            f"-DLK_QKNORM_MAXHD={QKNORM_MAXHD}")

FAMILIES = [
    # -- activation prepass: f32 activations -> q8_1 in the tile-ordered layout of the GEMM kernels
    dict(family="prepass_q8_1", source="prepass.cu", template="prepass_q8_1_tiles",
         params={"F16": [0, 1]}, threads=THREADS, smem="0", tile=(BM, 0), main_path=True,
         doc="f32 [nt, id] -> q8_1 planes (qa8 swizzled per 32-chunk, sda d|sum) per 64-token tile"),
    # -- q8_1 in ggml's plain row-major block_q8_1 layout (input of the generic kernel)
    dict(family="quantize_q8_1_rows", source="prepass.cu", template="quantize_q8_1_rows",
         params={"F16": [0]}, threads=THREADS, smem="0", tile=(0, 0), main_path=True,
         doc="f32 [nt, id] -> ggml block_q8_1 rows (36 B per 32 values)"),
    # -- the generic q6_K kernel: the old road (seeds 000 section 3.2)
    dict(family="q6k_generic", source="q6k_generic.cu", template="q6k_generic_kernel",
         params={"STRIDE": [210, 224]}, gemm=True, threads=THREADS,
         smem="KD*BM*32 + BN*KD*32 + KD*BM*4 + 2*KD*BN*4", consts={"KD": 4}, tile=(BM, BN), main_path=True,
         doc="B re-derived from raw blocks per tile (ql/qh reassembly in staging), A reshuffled per chunk "
             "from ggml q8_1 rows, scalar fragment loads, KSPLIT=2"),
    # -- the expanded-B q6_K kernel (seeds 002)
    dict(family="q6k_expb", source="q6k_expb.cu", template="q6k_expb_kernel",
         params={"KDR": [1, 2, 4, 8], "STRIDE": [210, 224], "EPI": [0, 1], "OCC": [1, 2]}, gemm=True, threads=THREADS,
         smem="2*(KDR*BM*32 + KDR*BM*4) + BN*KDR*32 + KDR*BN*8", tile=(BM, BN),
         main_path="KDR == 4 and ((EPI == 0 and OCC == 2) or (EPI == 1 and OCC == 1))",
         doc="ql+qh expanded once per tile into a centered int8 plane, dsc float2 per (chunk,row), "
             "ldmatrix A fragments, KSPLIT=2 two m16n8k16 per 32-chunk; EPI=0 seeds' float epilogue, "
             "EPI=1 magic-number epilogue without I2F; OCC = __launch_bounds__ min blocks/SM "
             "(main path: KDR=4 with EPI=0/OCC=2 or EPI=1/OCC=1; the rest are sweep points)"),
    # -- the q4_K raw-nibble kernel (seeds 002 section 1, r28-r34 skeleton)
    dict(family="q4k_nb", source="q4k_nb.cu", template="q4k_nb_kernel",
         params={"KDR": [2, 4, 8]}, gemm=True, threads=THREADS,
         smem="2*(KDR*BM*32 + KDR*BM*4 + BN*KDR*16 + BN*16) + KDR*BN*8", tile=(BM, BN), main_path=True,
         doc="raw nibbles in smem unpacked in registers at mma time, m16n8k32, q8_1 sum term for mins"),
    # -- dequantize to fp16 for the cuBLAS baselines
    dict(family="dequant_f16", source="dequant.cu", template="dequant_f16_kernel",
         params={"QT": [4, 6], "STRIDE": [0, 224]}, threads=256, smem="0", tile=(0, 0), main_path=False,
         doc="q4_K (QT=4) / q6_K (QT=6) rows -> fp16 [od, id]; STRIDE 0 = the type's natural stride"),
    # -- the prefill's other kernels (labkernels.prefill): each is a kernel class in the wall decomposition
    dict(family="rmsnorm", source="prefill.cu", template="rmsnorm_kernel", params={"W": [0, 1], "OUT16": [0, 1]},
         threads=256, smem="0", tile=(0, 0), main_path=False,
         doc="RMSNorm rows (optionally times a weight); OUT16=1 writes fp16 for an fp16 consumer"),
    dict(family="rope", source="prefill.cu", template="rope_kernel", params={"NEOX": [0, 1]}, threads=256,
         smem="0", tile=(0, 0), main_path=False, doc="rotary embedding in place, normal or neox pairing"),
    dict(family="softmax_mask", source="prefill.cu", template="softmax_mask_kernel", params={"F16": [0, 1]},
         threads=256, smem="0", tile=(0, 0), main_path=False,
         doc="causal (+ sliding window) masked softmax of attention scores, in place"),
    dict(family="act_mul", source="prefill.cu", template="act_mul_kernel", params={"ACT": [0, 1], "OUT16": [0, 1]},
         threads=256, smem="0", tile=(0, 0), main_path=False, doc="GELU(tanh)/SiLU gate times up"),
    dict(family="act_mul_gu", source="prefill.cu", template="act_mul_gu_kernel",
         params={"ACT": [0, 1], "OUT16": [0, 1]}, threads=256, smem="0", tile=(0, 0), main_path=False,
         doc="GELU(tanh)/SiLU gate times up on the merged [gate; up] GEMM's rows"),
    dict(family="add_rmsnorm", source="prefill.cu", template="add_rmsnorm_kernel",
         params={"PRE": [0, 1], "OUT16": [0, 1], "J": list(NORM_J)}, threads=256, smem="0", tile=(0, 0),
         main_path=False,
         doc="residual add (of a delta, RMS-normed first when PRE=1) fused with the next RMSNorm; J > 0: the row "
             "from registers (J elements a thread, ncols <= 256 J), bitwise J=0's"),
    dict(family="rope_qk", source="prefill.cu", template="rope_qk_kernel", params={"NEOX": [0, 1]}, threads=256,
         smem="0", tile=(0, 0), main_path=False, doc="rotary embedding of Q and K in one launch (q scale folded in)"),
    dict(family="rmsnorm_qk", source="prefill.cu", template="rmsnorm_qk_kernel", params={}, threads=256,
         smem="0", tile=(0, 0), main_path=False,
         doc="gemma3's per-head q and k RMSNorms in one launch, reading strided rows (the stacked QKV output)"),
    dict(family="qk_norm_rope_qkv16", source="prefill.cu", template="qk_norm_rope_qkv16_kernel",
         params={"NEOX": [0, 1]}, threads=256, smem="0", tile=(0, 0), main_path=False,
         doc="gemma3's q/k RMSNorms, RoPE, the q scale and the fp16 cast of Q, K, V in one launch (strided rows)"),
    dict(family="rope_qkv16", source="prefill.cu", template="rope_qkv16_kernel", params={"NEOX": [0, 1]},
         threads=256, smem="0", tile=(0, 0), main_path=False,
         doc="rotary embedding of Q and K, the q scale and the fp16 cast of Q, K, V for an fp16 attention, one launch"),
    dict(family="embed", source="prefill.cu", template="embed_kernel", params={"F16": [0, 1]}, threads=256,
         smem="0", tile=(0, 0), main_path=False, doc="token embedding gather times a scale"),
    dict(family="fill", source="prefill.cu", template="fill_kernel", params={"ES": [1, 2, 4]}, threads=256,
         smem="0", tile=(0, 0), main_path=False,
         doc="a memset (rows of 1/2/4-byte elements) as a kernel: the captured prefill graph's memset nodes"),
    dict(family="flash_attn", source="flash_attn.cu", template="flash_attn_kernel", params={"D": [64, 128, 256]},
         threads=256, smem="(64 + 4*64) * D * 2", tile=(0, 0), main_path=True,
         doc="the lab's fused causal / sliding-window GQA attention (issue 18): 16 query rows x 4 heads sharing a kv "
             "head per CTA, 8 warps (two per row group, each half of every 64-key block, merged at the end), "
             "mma.sync m16n8k16 f16 -> f32, Q and a 2-stage cp.async ring of 64-key K/V blocks in swizzled shared "
             "memory, online softmax in base 2; one launch per layer, no workspace"),
    # -- round 7: Hopper-native k-quant GEMM, weights dequantized in registers feeding wgmma (sm_90a)
    dict(family="wgmma_kq", source="wgmma_kq.cu", template="wgmma_kq_kernel",
         params={"QT": [4, 6], "BN": [128, 256], "STAGES": [4], "BF16": [0, 1], "SCL": [0, 1, 2], "EPI": [0, 1, 2, 3, 4, 5],
                 "AQ": [2, 4], "PF": [0, 1, 2]},
         threads=384, smem="STAGES*BN*128 + 1024 + (EPI // 4) * 65536", tile=(0, 128),
         # the epilogue forms (EPI 1: bulk fold, 2: bulk fold + TMA store) are built on the main scale form, f16
         # AQ=4 (four A-fragment sets, the conversion ahead of the wait): BN=128 only (BN=256 spills), plain
         # epilogue, f16, the main scale form -- an experiment (gpu check --steps wgmma_aq), not on the main path
         valid="(EPI == 0 or (BF16 == 0 and SCL == (1 if QT == 6 and BN == 128 else 0))) and "
               "(AQ == 2 or (BN == 128 and EPI == 0 and BF16 == 0 and SCL == (1 if QT == 6 else 0) and PF == 0)) and "
               # PF > 0 (an L2 prefetch of the weights PF super-blocks ahead): the AQ=2 main scale forms, f16, plain
               # epilogue, spill-free -- not q6_K BN=256, whose consumers (at 240 registers) spill 40 B with it
               "(PF == 0 or (AQ == 2 and EPI == 0 and BF16 == 0 and SCL == (1 if QT == 6 and BN == 128 else 0) and "
               "not (QT == 6 and BN == 256))) and "
               # EPI=3 (the pair exchange through distributed shared memory, 2-CTA clusters on SK=3's G=2 grid): an
               # experiment off the main path; its epilogue spills a few bytes after the main loop, and q6_K
               # BN=256's spills inside it (not built)
               "(EPI != 3 or (AQ == 2 and PF == 0 and not (QT == 6 and BN == 256))) and "
               # EPI=4 (the staged TMA store, any scheduler; its own 64 KB staging buffer) and EPI=5 (the reduce
               # finish through the same buffer: grids of at most two CTAs a tile): experiments off the main path,
               # the AQ=2 main scale forms, f16
               "(EPI < 4 or (AQ == 2 and PF == 0)) and "
               # SCL=2 (q4_K, f16: the scale plane written at load, +1 bit per weight): BN=128 -- the tile whose
               # loop the conversion holds; BN=256 hides it and spills 12 B with the plane -- plain epilogue, AQ=2
               "(SCL < 2 or (QT == 4 and BN == 128 and BF16 == 0 and EPI == 0 and AQ == 2 and PF == 0))",
         main_path="EPI < 3 and AQ == 2 and PF == 0 and BF16 == 0 and ((QT == 4 and SCL == 0) or (QT == 6 and SCL == (1 if BN == 128 else 0)))",
         archs=("sm_90a",), gemm=True,
         doc="TMA-fed 128B-swizzled f16/bf16 activation tiles (B, STAGES-deep mbarrier ring, producer warpgroup) "
             "x q4_K/q6_K weights dequantized in registers (A, register form) by two consumer warpgroups of 64 "
             "rows, wgmma m64nBNk16 f32 accumulate; 1 CTA/SM, setmaxnreg 24/240; a data-parallel, stream-K or split-k tile scheduler (runtime SK); SCL=0 every lane decodes its rows' "
             "scales per chunk, SCL=1 each of a row's 4 lanes decodes one chunk's per super-block and shares them "
             "by shuffles, SCL=2 (q4_K f16) reads them from a scale plane written at load; EPI=0 plain epilogue, EPI=1 the owner folds helpers' partials in through bulk async "
             "copies into the idle ring, EPI=2 that and a TMA store of the tile (grids of one segment per CTA: SK=0/2/3), "
             "EPI=3 the pair exchange of SK=3's two partial sums through distributed shared memory (2-CTA clusters), "
             "EPI=4 every tile through a staging buffer of its own and TMA stores (any scheduler); EPI=5 that, and a split "
             "tile's two CTAs adding their partial sums into Y (zeroed by its owner's producer warps) with TMA "
             "reduce-adds, no fold (grids of at most two CTAs a tile); "
             "AQ=2 two A-fragment sets (convert after the wait for chunk q-1), AQ=4 four (convert chunk q+1 before "
             "that wait, so two groups stay queued); PF=1/2 an L2 prefetch of the weights 1/2 super-blocks ahead"),
    # -- round 7, the shared-memory form: a converter warpgroup dequantizes TMA-staged raw q4_K super-blocks into
    #    swizzled f16/bf16 A tiles; the consumers issue wgmma with both operands from shared memory
    dict(family="wgmma_kqs", source="wgmma_kq.cu", template="wgmma_kqs_kernel",
         params={"QT": [4], "BN": [128, 256], "STAGES": [3, 4], "BF16": [0, 1], "NCV": [1, 2]},
         threads="128 * (2 + NCV)",
         smem="STAGES*(BN*128 + 16384) + 3*18432 + 1024", tile=(0, 128),
         # NCV=2 (two converter warpgroups, 512 threads: 128 registers a thread at launch) takes BN=128 only:
         # ptxas cannot fit m64n256k16's 128 accumulators under that target (C7602)
         valid="(BN == 128 or STAGES == 3) and (NCV == 1 or (BN == 128 and STAGES == 4 and BF16 == 0))",
         main_path="BF16 == 0 and NCV == 1", archs=("sm_90a",), gemm=True,
         doc="shared-memory form of wgmma_kq: warpgroup 0 converts (thread = weight row; its thread 0 issues the "
             "TMA of the activation tiles and of the raw GGUF q4_K super-blocks, a 3-deep ring) into 128B-swizzled "
             "f16/bf16 A tiles in the same STAGES-deep ring as the activations; warpgroups 1-2 issue wgmma "
             "m64nBNk16 with A and B from shared memory; 1 CTA/SM, setmaxnreg 80/208; the same data-parallel / "
             "stream-K scheduler; NCV=2 two converter warpgroups, each half of every chunk (setmaxnreg 80/176)"),
    # -- round 9: decode -- k-quant matrix-vector / small-batch products (nt = 1..16), weights read once per launch
    dict(family="gemv_kq", source="gemv_kq.cu", template="gemv_kq_kernel",
         params={"QT": [4, 6], "XF32": [0, 1], "NT8": [1, 2], "MT": [1, 2], "WARPS": [4, 8], "FORM": [0, 1, 3]},
         valid="(FORM == 0 or (QT == 4 and NT8 == 1 and (FORM == 1 or MT == 1))) and (WARPS == 4 or FORM == 3)",
         threads="32 * WARPS", smem="0", tile=(0, 0),
         main_path=True, archs=("sm_80", "sm_90"),
         doc="q4_K (GGUF rows as uploaded) / q6_K (planes repacked once at load, same bytes) x f16 or f32 (XF32) "
             "activations read directly; weights dequantized exactly in registers (f16 code by a magic exponent, "
             "one rounding of q*S+B), mma.sync m16n8k16 f16 -> f32 with the tokens as n (NT8 tiles of 8); a lane "
             "owns 64 k of each super-block (a k permutation shared by both operands); CTA = WARPS warps x MT m16 "
             "tiles of rows, grid y = S splits of the super-blocks, partials added in split order by the last CTA; "
             "FORM=1 (q4_K, nt <= 8; round 9 step 2): the mma takes the exact f16 products sc*q (one LOP3 + one HFMA2 "
             "a pair), d applied per super-block in f32, the min term by an indicator mma (the sub-block sums of the "
             "activations) and a min mma (the exact f16 mins x those sums as hi + lo f16) scaled by -dmin in f32 "
             "(round 9 step 3's PIPE ring lost and left the source: commit a1cf954 holds it); FORM=3 (q4_K, nt <= 8, "
             "MT=1; round 9 step 6): FORM=1's arithmetic with the next super-block's weight bytes loaded into "
             "registers before the current one is computed (a register double buffer), the CTA's warps on one 16-row "
             "group, the split's super-blocks cut among them and folded in shared memory (WARPS 4 or 8) (round 9 "
             "step 5's FORM=2, the double buffer with the warps on their own rows, lost and left the source: commit "
             "90fd260 holds it; step 7's FORM=4 / 5, FORM=1 under a register cap of 6 / 8 CTAs an SM, and step 8's "
             "PF=1, each CTA's weight bytes prefetched into L2 before its PDL wait, lost and left it too: commit "
             "7894b07 holds them)"),
    # -- round 9: the decode step's own kernels (labkernels.decode): position and token read from device memory
    dict(family="decode_qkv", source="decode.cu", template="decode_qkv_kernel", params={"NEOX": [0, 1], "QKN": [0, 1]},
         threads=256, smem="0", tile=(0, 0), main_path=False, archs=("sm_80", "sm_90"),
         doc="one token's q/k RMSNorm (QKN=1, gemma3), RoPE at the position in device memory, the q scale, the fp16 "
             "casts and the append of k / v as that row of the layer's KV cache (the prefill's arithmetic: like the "
             "prefill's rope_qkv16 it has sincosf's 32-byte stack frame for large angles, hence not main path)"),
    dict(family="decode_attn", source="decode.cu", template="decode_attn_kernel",
         params={"D": [64, 128, 256], "GMAX": [1, 2, 4, 8]}, threads=128, smem="0", tile=(0, 0), main_path=True,
         archs=("sm_80", "sm_90"),
         doc="flash-decoding over the fp16 KV cache: one query per head, keys of the window (sliding layers) or "
             "0..p cut into chunks; CTA = (kv head, split, up to GMAX query heads of that kv head), fp32 softmax "
             "state per chunk to a workspace, the last-arriving CTA folds the chunks in chunk order (the same bits "
             "for any split count); CUDA cores"),
    dict(family="argmax_step", source="decode.cu", template="argmax_step_kernel", params={}, threads=256, smem="0",
         tile=(0, 0), main_path=True, archs=("sm_80", "sm_90"),
         doc="greedy sampling: argmax of the logits (ties: lowest index) by many CTAs, the last merges, writes the "
             "token into the decode state, advances the position and records the token"),
    # -- register-fed mma.sync probes: the physical ceiling line
    dict(family="mma_probe", source="mma_probe.cu", template="mma_probe_kernel",
         params={"K": [16, 32]}, threads=256, smem="0", tile=(0, 0), main_path=False,
         doc="register-fed mma.sync.m16n8k{K}.s8 loop: the int8 tensor-core ceiling"),
]


@dataclass(frozen=True)
class KernelSpec:
    family: str
    source: str
    template: str
    params: tuple                 # ((name, value), ...) in template order
    threads: int
    smem_formula: str
    tile: tuple
    main_path: bool               # the lab's main path: the audit fails on spills / local memory here
    consts: tuple = field(default=())
    doc: str = ""
    archs: tuple = ("sm_90",)     # the targets it is built for: sm_90a for wgmma / setmaxnreg kernels

    @property
    def p(self) -> dict:
        return dict(self.params)

    @property
    def name_expression(self) -> str:
        """The C++ name of this instantiation, as cupy's name_expressions / the audit want it."""
        if not self.params:
            return self.template
        return f"{self.template}<{','.join(str(v) for _, v in self.params)}>"

    @property
    def key(self) -> str:
        if not self.params:
            return self.family
        return self.family + "[" + ",".join(f"{k}={v}" for k, v in self.params) + "]"

    def dynamic_smem(self, **overrides) -> int:
        env = {"BM": BM, "BN": BN, **dict(self.consts), **dict(self.params), **overrides}
        return int(_safe_eval(self.smem_formula, env))

    @property
    def path(self) -> Path:
        return KERNELS_DIR / self.source


def _safe_eval(expr: str, env: dict):
    """Evaluate an arithmetic expression over names in env (no calls, no attributes)."""
    tree = ast.parse(expr, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load,
                                 ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Div, ast.Mod, ast.USub,
                                 ast.Pow)):
            raise ValueError(f"smem formula {expr!r}: {type(node).__name__} not allowed")
        if isinstance(node, ast.Name) and node.id not in env:
            raise ValueError(f"smem formula {expr!r}: unknown name {node.id!r}")
    return eval(compile(tree, "<smem>", "eval"), {"__builtins__": {}}, env)


def _main_path(rule, params: dict) -> bool:
    """A family's main_path is True/False or an expression over its template parameters."""
    if isinstance(rule, bool):
        return rule
    tree = ast.parse(rule, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) or isinstance(node, ast.Attribute):
            raise ValueError(f"main_path rule {rule!r}: calls/attributes not allowed")
    return bool(eval(compile(tree, "<main_path>", "eval"), {"__builtins__": {}}, dict(params)))


def _expand() -> list[KernelSpec]:
    out = []
    for fam in FAMILIES:
        names = list(fam["params"])
        grids = [fam["params"][n] for n in names]
        for values in itertools.product(*grids) if names else [()]:
            if "valid" in fam and not _main_path(fam["valid"], dict(zip(names, values))):
                continue          # a combination the template refuses (static_assert): not instantiated
            out.append(KernelSpec(
                family=fam["family"], source=fam["source"], template=fam["template"],
                params=tuple(zip(names, values)), smem_formula=fam["smem"],
                threads=(fam["threads"] if isinstance(fam["threads"], int)     # or a formula over the parameters
                         else int(_safe_eval(fam["threads"], dict(zip(names, values))))),
                tile=tuple(fam["tile"]), main_path=_main_path(fam["main_path"], dict(zip(names, values))),
                consts=tuple(sorted(fam.get("consts", {}).items())), doc=fam.get("doc", ""),
                archs=tuple(fam.get("archs", ("sm_90",)))))
    return out


KERNELS: list[KernelSpec] = _expand()


class RegistryError(KeyError):
    """An unknown family, variant or instantiation; a KeyError (callers catch it as one) whose message reads as
    written (KeyError's own str() quotes it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def find(family: str, **params) -> KernelSpec:
    """The registry entry of one instantiation, e.g. ``find('q6k_expb', KDR=4, STRIDE=210, EPI=0)``."""
    for k in KERNELS:
        if k.family == family and all(k.p.get(n) == v for n, v in params.items()):
            if set(params) == set(k.p):
                return k
    if not any(k.family == family for k in KERNELS):
        raise RegistryError(f"no kernel family {family!r}; families: "
                            + ", ".join(dict.fromkeys(k.family for k in KERNELS)))
    raise RegistryError(f"no registered kernel {family} with {params}; registered: "
                        + ", ".join(k.key for k in KERNELS if k.family == family))


def family(name: str) -> list[KernelSpec]:
    return [k for k in KERNELS if k.family == name]


def available(kernels=None) -> list[KernelSpec]:
    """Registry entries whose source file exists (rounds add sources over time)."""
    return [k for k in (kernels or KERNELS) if k.path.exists()]


# ------------------------------------------------------------------ named kernel variants


@dataclass(frozen=True)
class Variant:
    """One named GEMM kernel variant: the only name the lab gives it (benchmark rows, forensics cases, ncu
    filters, gpu check steps, notebooks, colours). ``params`` are its template parameters except the weight's
    block stride (``STRIDE`` is the uploaded weight's, added by :meth:`spec`); ``default_for`` lists what it is
    the default of: a qtype (the int8 kernel ``gpu.gemm`` / ``qmatmul(kernel="int8")`` run for that type) and/or
    a family (the parameters a family named without parameters runs with)."""
    name: str
    family: str
    params: tuple           # ((name, value), ...) in template order, without STRIDE
    qtype: str              # the weight type it takes
    act: str                # activation format: q8_1_tiles (gpu.prepass) | q8_1_rows (gpu.quantize_q8_1_rows)
    mma: str                # the warp-level instruction: mma.sync.m16n8kK (K 16 or 32)
    main_path: bool         # the lab's main path (the audit fails on spills here)
    default_for: tuple = ()
    doc: str = ""

    @property
    def p(self) -> dict:
        return dict(self.params)

    @property
    def mma_k(self) -> int:
        """K of the mma.sync.m16n8kK it issues (its IMMA instruction count is MACs / (16*8*K))."""
        return int(self.mma.rsplit("k", 1)[1])

    def spec(self, stride: int | None = None, **override) -> KernelSpec:
        """The registry instantiation at a weight block stride (q6_K: 210 or 224; q4_K has none), with
        ``override`` replacing template parameters (a sweep point of the same family)."""
        params = {**self.p, **override}
        params.pop("STRIDE", None)
        if any(n == "STRIDE" for fam in FAMILIES if fam["family"] == self.family for n in fam["params"]):
            params["STRIDE"] = 210 if stride is None else int(stride)
        return find(self.family, **params)


def _v(name, family, params, qtype, act, mma, main_path=True, default_for=(), doc=""):
    return Variant(name, family, tuple(params.items()), qtype, act, mma, main_path, tuple(default_for), doc)


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    _v("q6k_generic", "q6k_generic", {}, "q6_K", "q8_1_rows", "m16n8k16", default_for=("q6k_generic",),
       doc="the old road: B re-derived per tile, plain q8_1 rows, scalar fragments, I2F epilogue"),
    _v("q6k_expb_epi0", "q6k_expb", {"KDR": 4, "EPI": 0, "OCC": 2}, "q6_K", "q8_1_tiles", "m16n8k16",
       default_for=("q6_K", "q6k_expb"),
       doc="expanded-B q6_K, seeds' float epilogue (int32 -> float I2F per sub-block), OCC=2"),
    _v("q6k_expb_epi1", "q6k_expb", {"KDR": 4, "EPI": 1, "OCC": 1}, "q6_K", "q8_1_tiles", "m16n8k16",
       doc="expanded-B q6_K, magic-number epilogue (no I2F), OCC=1"),
    _v("q6k_expb_epi1_occ2", "q6k_expb", {"KDR": 4, "EPI": 1, "OCC": 2}, "q6_K", "q8_1_tiles", "m16n8k16",
       main_path=False, doc="expanded-B q6_K, magic-number epilogue, OCC=2: the counter-evidence variant of "
                            "q6k_expb_epi0 (only the EPI template switch differs)"),
    _v("q4k_nb_kdr4", "q4k_nb", {"KDR": 4}, "q4_K", "q8_1_tiles", "m16n8k32",
       doc="q4_K raw-nibble kernel at KDR=4 (rounds 3 and 6's measured point), m16n8k32, magic-number epilogue"),
    _v("q4k_nb_kdr8", "q4k_nb", {"KDR": 8}, "q4_K", "q8_1_tiles", "m16n8k32", default_for=("q4_K", "q4k_nb"),
       doc="q4_K raw-nibble kernel at KDR=8: round 4's best staging depth"),
]}

#: labels older recorded runs gave these variants (round 3's tables; "q4k_nb" in rounds 3-4's q4_K benchmark and
#: round 6 was KDR=4): read-compat for recorded labels only (:func:`canonical`), never written
LEGACY_NAMES = {"generic": "q6k_generic", "expb_epi0": "q6k_expb_epi0", "expb_epi1": "q6k_expb_epi1",
                "q4k_nb": "q4k_nb_kdr4"}


def variant(name: str) -> Variant:
    """The named variant (a label of an older recorded run is resolved, see :data:`LEGACY_NAMES`)."""
    v = VARIANTS.get(name) or VARIANTS.get(LEGACY_NAMES.get(name, ""))
    if v is None:
        raise RegistryError(f"unknown kernel variant {name!r}; variants: {', '.join(VARIANTS)}")
    return v


def canonical(name: str) -> str:
    """A variant's one name for any label a recorded run used; other labels (cuBLAS, prepass) unchanged."""
    return name if name in VARIANTS else LEGACY_NAMES.get(name, name)


def resolve(name: str) -> Variant:
    """What a caller names a kernel by: a family (``q4k_nb``: that family's default variant) or a variant."""
    if name in VARIANTS:
        return VARIANTS[name]
    try:
        return default_variant(name)
    except KeyError:
        raise RegistryError(f"{name!r} is neither a kernel variant ({', '.join(VARIANTS)}) nor a GEMM family with a "
                       f"default variant ({', '.join(sorted({v.family for v in VARIANTS.values()}))})") from None


def _check_names() -> None:
    for v in VARIANTS.values():
        fam = [f["family"] for f in FAMILIES]
        if v.name in fam and v.name not in v.default_for:
            raise ValueError(f"variant {v.name!r} is named like a family it is not the default of")
        if v.name in LEGACY_NAMES:
            raise ValueError(f"variant {v.name!r} is also a legacy label")


def default_variant(of: str) -> Variant:
    """The variant that is the default of a qtype (``"q4_K"``, ``"q6_K"``: the int8 GEMM for that type) or of a
    family (``"q4k_nb"``: what it runs named without parameters). Exactly one variant declares each default."""
    hits = [v for v in VARIANTS.values() if of in v.default_for]
    if len(hits) != 1:
        raise RegistryError(f"{len(hits)} variants are the default of {of!r} (need exactly one): "
                       + ", ".join(v.name for v in hits))
    return hits[0]


_check_names()
