"""labkernels: a Jupyter-driven research lab for GGUF k-quant (q4_K / q6_K) int8-mma GEMM kernels.

Modules by round:
  quants, layout, quantize_ref, reference  -- formats, exact references, round 1 (layout verifier)
  occupancy, audit                         -- round 2 (smem-to-occupancy calculator, ptxas audit)
  kernels/ (CUDA), gpu, bench              -- rounds 3-4 (q6_K expanded-B, KDR sweep, q4_K)
  prefill, prefill_runs                    -- the prefill (rounds 5 and 7)
  rounds/                                  -- one module or package per round, with the code only that round uses
                                              (round 5's decomposition, round 6's forensics, round 7's experiments, ...)
  records, provenance, report, pipeline    -- recorded data, provenance, notebooks -> HTML reports
"""
__version__ = "0.1.0"
