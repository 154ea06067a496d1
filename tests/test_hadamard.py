"""The 16-point RHT: orthonormal, TE's sign vector, BF16 output, and dW invariance."""

import pytest
import torch

from ue5m3.numerics.hadamard import TE_SIGNS, hadamard_matrix, random_signs, rht


def test_hadamard_matrix_is_sylvester_and_orthogonal():
    h = hadamard_matrix(16, torch.float64)
    assert torch.equal(h @ h.T, 16 * torch.eye(16, dtype=torch.float64))
    assert torch.equal(h[1], torch.tensor([1.0, -1.0] * 8, dtype=torch.float64))


def test_rht_of_a_unit_vector_is_the_signed_row_over_four():
    x = torch.zeros(1, 32)
    x[0, 3] = 1.0
    y = rht(x, out_dtype=torch.float32)
    expected = TE_SIGNS[3] * hadamard_matrix(16)[3] / 4
    assert torch.equal(y[0, :16], expected)
    assert torch.equal(y[0, 16:], torch.zeros(16))


def test_rht_output_is_bf16_rounding_of_the_fp32_transform():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(rht(x), rht(x, out_dtype=torch.float32).to(torch.bfloat16))


def test_rht_on_both_wgrad_operands_preserves_their_product():
    g = torch.Generator().manual_seed(1)
    dy_t, x_t = (
        torch.randn(32, 64, generator=g, dtype=torch.float64),
        torch.randn(48, 64, generator=g, dtype=torch.float64),
    )
    exact = dy_t @ x_t.T
    transformed = rht(dy_t, out_dtype=torch.float64) @ rht(x_t, out_dtype=torch.float64).T
    torch.testing.assert_close(transformed, exact, rtol=1e-6, atol=1e-5)  # FP32 inside the transform


def test_rht_rejects_bad_shapes_and_signs():
    with pytest.raises(ValueError, match="multiple of 16"):
        rht(torch.ones(3, 20))
    with pytest.raises(ValueError, match="16 values"):
        rht(torch.ones(16), signs=torch.ones(8))


def test_random_signs_are_plus_minus_one_and_seeded():
    a, b = random_signs(torch.Generator().manual_seed(5)), random_signs(torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and bool((a.abs() == 1).all())
