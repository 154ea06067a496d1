"""The 16x16 random Hadamard transform (RHT) that NVIDIA's NVFP4 recipe applies to the wgrad operands.

numerics spec section 3.2: the transform is the Sylvester Hadamard matrix H16 divided by 4 (orthonormal),
left-multiplied by diag(s) with a fixed sign vector s shared by all layers and steps; it is applied in chunks of
16 along the last dimension (the token dimension of dY^T and X^T) as y = (x * s) @ (H16 / 4), with a BF16
result. The tensor amax of an operand is taken after the transform. Because the transform is orthonormal and
applied to both wgrad operands along the reduction dimension, dW = dY^T X is unchanged in exact arithmetic.
"""

from __future__ import annotations

import torch

__all__ = ["TE_SIGNS", "hadamard_matrix", "random_signs", "rht"]

# The fixed sign vector of Transformer Engine's NVFP4 recipe.
TE_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def hadamard_matrix(n: int = 16, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sylvester Hadamard matrix of order n (a power of two), entries +-1."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard order must be a power of two, got {n!r}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def random_signs(generator: torch.Generator | None = None, n: int = 16) -> torch.Tensor:
    """A fresh +-1 sign vector (for re-randomised RHT variants)."""
    return torch.randint(0, 2, (n,), generator=generator).to(torch.float32) * 2 - 1


def rht(
    x: torch.Tensor, signs: torch.Tensor | tuple[int, ...] = TE_SIGNS, *, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Apply the 16-point RHT along the last dimension in chunks of 16.

    Args:
        x: tensor whose last dimension is a multiple of 16.
        signs: the 16 diagonal signs (default: Transformer Engine's fixed vector).
        out_dtype: result dtype (BF16 as in TE; FP32 to inspect the unrounded transform).

    Returns:
        The transformed tensor, same shape as ``x``, in ``out_dtype``. Computed as an FP32 matmul of the
        sign-flipped chunks with H16/4 (power-of-two scaling, exact) and one rounding to ``out_dtype``.
    """
    # validate on the host (signs are a tuple, or checked where they were drawn), then move: no device read-back
    host = torch.as_tensor(signs, dtype=torch.float32).cpu() if not isinstance(signs, tuple) else None
    if isinstance(signs, tuple):
        if len(signs) != 16 or any(s not in (1, -1) for s in signs):
            raise ValueError("signs must be 16 values of +-1")
    elif host.shape != (16,) or not bool((host.abs() == 1).all()):
        raise ValueError("signs must be 16 values of +-1")
    signs = torch.as_tensor(signs, dtype=torch.float32).to(x.device)
    if x.ndim == 0 or x.shape[-1] % 16:
        raise ValueError(f"RHT needs a last dimension that is a multiple of 16, got shape {tuple(x.shape)}")
    transform = hadamard_matrix(16).to(x.device) / 4
    # (..., n) -> (..., n/16, 16) chunks; each chunk times diag(s) @ H16/4
    chunks = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    y = (chunks * signs) @ transform
    return y.reshape(x.shape).to(out_dtype)
