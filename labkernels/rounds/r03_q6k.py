"""Round 3 -- q6_K: the generic kernel vs the expanded-B kernel, against cuBLAS fp16 (``notebooks/03_q6k_expanded_b``).

Every case is parity-gated (:mod:`labkernels.cases`) before it is timed (:mod:`labkernels.bench`): interleaved
rounds of the round's variants (``registry.VARIANTS`` names), cuBLAS fp16 on cached dequantized weights (and with
the dequant), the prepass; the int8 mma.sync ceilings; per-round A/B ratios.
"""

from __future__ import annotations

import time

import numpy as np

from .. import bench, cases

NOTEBOOK = "03_q6k_expanded_b"
DATA = ("q6k",)

#: round 3's kernels: the generic road and the two expanded-B epilogues (names of ``registry.VARIANTS``)
Q6K_VARIANTS = ("q6k_generic", "q6k_expb_epi0", "q6k_expb_epi1")

PLAN = {"shapes": [[4096, 4096], [11008, 4096], [4096, 11008]], "nts": [512, 3328, 4096],
        "variants": list(Q6K_VARIANTS), "stride": 210, "repeats": 20, "pairs": 3}

Q6K_PAIRS = (("q6k_generic", "q6k_expb_epi0"), ("q6k_generic", "q6k_expb_epi1"),
             ("cublas_f16_cached", "q6k_expb_epi0"), ("cublas_f16_cached", "q6k_expb_epi1"))


