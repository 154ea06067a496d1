"""Exact FP4 numerics, the bottom floor of the package: number formats, block quantizers, the random Hadamard
transform, the training scale lifecycle, GEMM output models, their shared exact arithmetic and their kernels.

Nothing here imports the layers, models, trainer or pipeline above it (tests/test_layering.py holds that).
"""
