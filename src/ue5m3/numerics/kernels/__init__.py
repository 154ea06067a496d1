"""Compiled backends of the numerics: the fused C kernel (:mod:`ue5m3.numerics.kernels.cpu`), bit-identical to
the torch reference it accelerates."""
