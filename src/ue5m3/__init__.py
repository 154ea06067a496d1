"""Exact software FP4 numerics for UE5M3, NVFP4 and MXFP4 block scaling (arXiv 2609.02846)."""

__version__ = "0.1.0"
