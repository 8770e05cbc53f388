"""CUDA sources of the lab kernels (.cu/.cuh) and their registry (registry.py)."""
