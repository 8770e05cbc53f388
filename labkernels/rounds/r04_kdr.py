"""Round 4 -- KDR sweep: staging depth vs occupancy vs speed, and the q4_K raw-nibble kernel
(``notebooks/04_kdr_sweep``): the sweep (table ``sweep`` of a ``kdr_sweep`` run) and the q4_K benchmark against
cuBLAS fp16 (a ``q4k`` run), every point parity-gated first (:mod:`labkernels.cases`)."""

from __future__ import annotations

import numpy as np

from .. import bench, cases

NOTEBOOK = "04_kdr_sweep"
DATA = ("kdr_sweep", "q4k")

PLAN = {"shapes": {"q6_K": [[4096, 4096], [4096, 11008]], "q4_K": [[4096, 4096], [11008, 4096]]},
        "nts": [64, 128, 256, 512, 1024, 2048, 3328, 4096], "repeats": 10,
        "q4k_nts": [512, 3328, 4096], "q4k_variant": "q4k_nb_kdr4", "q4k_repeats": 20, "q4k_pairs": 3}


