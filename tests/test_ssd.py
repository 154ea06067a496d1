"""The chunked SSD scan against the token-by-token float64 recurrence (experiments spec section 2)."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ue5m3.models.ssd import segment_sum, ssd_scan, ssd_sequential

# Both sides are float64 but sum in different orders (chunked einsums vs a running state): agreement to
# ~1e-13 is typical, 1e-10 leaves room for long sequences without hiding real errors (those are O(1)).
TOL = 1e-10


pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")


def _inputs(b=2, t=37, h=4, p=3, g=2, n=5, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    return {
        "x": randn(b, t, h, p),
        "dt": randn(b, t, h) - 1.0,
        "A": -torch.exp(randn(h)),
        "B": randn(b, t, g, n),
        "C": randn(b, t, g, n),
        "D": randn(h),
        "dt_bias": randn(h) * 0.5,
        "initial_state": randn(b, h, p, n),
    }


@pytest.mark.parametrize("chunk_size", [1, 4, 16, 37, 64])
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("with_extras", [True, False], ids=["D+bias+state", "bare"])
def test_chunked_scan_equals_sequential_recurrence(chunk_size, groups, with_extras):
    inp = _inputs(g=groups)
    if not with_extras:
        inp.update(D=None, dt_bias=None, initial_state=None)
    y, state = ssd_scan(**inp, chunk_size=chunk_size)
    y_ref, state_ref = ssd_sequential(**inp)
    assert y.dtype == state.dtype == torch.float64
    torch.testing.assert_close(y, y_ref, rtol=0, atol=TOL)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=TOL)


def test_dt_limit_clamps_the_time_step_in_both_implementations():
    inp = _inputs(t=20)
    limit = (0.05, 0.3)
    y, state = ssd_scan(**inp, chunk_size=8, dt_limit=limit)
    y_ref, state_ref = ssd_sequential(**inp, dt_limit=limit)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=TOL)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=TOL)
    y_free, _ = ssd_scan(**inp, chunk_size=8)
    assert not torch.allclose(y, y_free)


@settings(max_examples=30, deadline=None)
@given(
    t=st.integers(1, 40),
    chunk_size=st.integers(1, 24),
    groups_heads=st.sampled_from([(1, 1), (1, 3), (2, 4), (3, 6)]),
    seed=st.integers(0, 2**16),
)
def test_chunked_scan_equals_recurrence_for_any_length_and_chunk(t, chunk_size, groups_heads, seed):
    g, h = groups_heads
    inp = _inputs(b=1, t=t, h=h, p=2, g=g, n=3, seed=seed)
    y, state = ssd_scan(**inp, chunk_size=chunk_size)
    y_ref, state_ref = ssd_sequential(**inp)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=TOL)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=TOL)


def test_final_state_continues_the_scan_across_a_split():
    inp = _inputs(t=50)
    y_full, state_full = ssd_scan(**inp, chunk_size=16)
    split = 23
    first = {k: (v[:, :split] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}
    y1, s1 = ssd_scan(**first, chunk_size=16)
    second = {k: (v[:, split:] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}
    second["initial_state"] = s1
    y2, s2 = ssd_scan(**second, chunk_size=16)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y_full, rtol=0, atol=TOL)
    torch.testing.assert_close(s2, state_full, rtol=0, atol=TOL)


def test_padding_leaves_the_final_state_at_the_last_real_token():
    # 37 tokens with chunk 16 are padded to 48; the state must not move during the 11 padded steps.
    inp = _inputs(t=37)
    _, state = ssd_scan(**inp, chunk_size=16)
    _, state_exact = ssd_scan(**inp, chunk_size=37)  # one chunk, no padding
    torch.testing.assert_close(state, state_exact, rtol=0, atol=TOL)


def test_scan_is_causal():
    inp = _inputs(t=40)
    y, _ = ssd_scan(**inp, chunk_size=16)
    for key in ("x", "dt", "B", "C"):
        changed = dict(inp)
        changed[key] = inp[key].clone()
        changed[key][:, 30:] += 5.0
        y_changed, _ = ssd_scan(**changed, chunk_size=16)
        assert torch.equal(y_changed[:, :30], y[:, :30]), key
        assert not torch.allclose(y_changed[:, 30:], y[:, 30:]), key


def test_low_precision_inputs_are_scanned_in_fp32_and_returned_in_their_dtype():
    inp = _inputs(t=33)
    low = {k: v.to(torch.bfloat16) for k, v in inp.items()}
    y, state = ssd_scan(**low, chunk_size=16)
    assert y.dtype == torch.bfloat16 and state.dtype == torch.float32
    y_ref, _ = ssd_sequential(**{k: v.double() for k, v in low.items()})
    # the only differences: FP32 arithmetic, then one BF16 rounding of y (relative 2^-8)
    torch.testing.assert_close(y.double(), y_ref, rtol=2**-7, atol=1e-3)


def test_segment_sum_matches_its_definition():
    a = torch.randn(3, 9, dtype=torch.float64)
    out = segment_sum(a)
    for i in range(9):
        for j in range(9):
            expected = a[:, j + 1 : i + 1].sum(-1) if i >= j else torch.full((3,), -math.inf, dtype=torch.float64)
            torch.testing.assert_close(out[:, i, j], expected, rtol=0, atol=1e-14)


def test_softplus_time_step_matches_reference_definition():
    # The reference writes softplus out as log1p(exp(.)); cross-check it against torch's softplus once.
    dt = torch.linspace(-6, 6, 25, dtype=torch.float64)
    torch.testing.assert_close(torch.log1p(torch.exp(dt)), F.softplus(dt), rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "change",
    [
        {"x": torch.zeros(2, 10, 4)},
        {"B": torch.zeros(2, 10, 3, 5)},
        {"dt": torch.zeros(2, 9, 4)},
        {"D": torch.zeros(3)},
        {"initial_state": torch.zeros(2, 4, 3, 4)},
    ],
)
def test_inconsistent_shapes_raise_value_error(change):
    inp = _inputs(t=10)
    inp.update({k: v.double() for k, v in change.items()})
    with pytest.raises(ValueError):
        ssd_scan(**inp, chunk_size=4)


def test_nonpositive_chunk_size_raises():
    with pytest.raises(ValueError, match="chunk_size"):
        ssd_scan(**_inputs(t=4), chunk_size=0)


# ----- the scan in passes over groups of heads --------------------------------------------------------------


@pytest.mark.parametrize("groups_per_pass", [1, 2, 3])
@pytest.mark.parametrize("chunk_size", [4, 16])
def test_the_scan_in_passes_equals_the_sequential_recurrence(groups_per_pass, chunk_size):
    inp = _inputs(t=37, h=8, g=4)
    y, state = ssd_scan(**inp, chunk_size=chunk_size, groups_per_pass=groups_per_pass)
    y_ref, state_ref = ssd_sequential(**inp)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=TOL)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=TOL)


def _fp32_inputs(**shape):
    return {k: v.float().requires_grad_() for k, v in _inputs(**shape).items()}


@pytest.mark.parametrize("groups_per_pass", [1, 3])
def test_the_scan_in_passes_and_its_gradients_agree_with_one_pass_to_fp32_rounding(groups_per_pass):
    """Heads never mix: the outputs agree (here to the bit), the gradients to FP32 rounding (B's and C's go
    through batched GEMMs of fewer groups, whose kernels may order a reduction differently)."""
    inp = _fp32_inputs(b=1, t=100, h=16, p=8, g=4, n=12)
    upstream = [torch.randn(1, 100, 16, 8), torch.randn(1, 16, 8, 12)]

    def run(passes):
        y, state = ssd_scan(**inp, chunk_size=16, groups_per_pass=passes)
        grads = torch.autograd.grad((y * upstream[0]).sum() + (state * upstream[1]).sum(), list(inp.values()))
        return y.detach(), state.detach(), grads

    y1, s1, g1 = run(None)
    y2, s2, g2 = run(groups_per_pass)
    torch.testing.assert_close(y2, y1, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(s2, s1, rtol=1e-6, atol=1e-6)
    for name, a, b in zip(inp, g1, g2, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)


def test_the_scan_in_passes_saves_no_quadratic_intermediates():
    """Autograd saves the [B, H, c, L, L] forms of a one-pass scan; the passes save only their inputs (their
    checkpoints keep views of the scan's own tensors) and recompute the rest in the backward pass."""
    inp = _fp32_inputs(b=1, t=256, h=16, p=4, g=4, n=4)

    def saved(passes):
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y, _ = ssd_scan(**inp, chunk_size=128, groups_per_pass=passes)
        y.sum().backward()
        return total[0]

    quadratic = 16 * 2 * 128 * 128 * 4  # one [1, H, c, L, L] FP32 tensor (c = 2 chunks of 128)
    assert saved(None) > 2 * quadratic
    assert saved(1) < quadratic / 4


def test_a_pass_count_that_is_not_a_positive_int_is_refused():
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="groups_per_pass"):
            ssd_scan(**_inputs(t=8), chunk_size=4, groups_per_pass=bad)


def test_the_model_runs_its_scans_in_passes_when_set_from_outside():
    from ue5m3 import models

    model = models.build("nemotron_h_debug", device="cpu", generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 4096, (1, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(tokens)
        assert models.set_ssd_groups_per_pass(model, 1) == 3  # the debug model's three Mamba-2 mixers
        passes = model(tokens)
    assert "groups_per_pass=1" in repr(model)
    torch.testing.assert_close(passes, whole, rtol=1e-6, atol=1e-6)
    assert models.set_ssd_groups_per_pass(models.build("dense_debug"), 1) == 0
    with pytest.raises(ValueError, match="groups must be None or a positive int"):
        models.set_ssd_groups_per_pass(model, 0)
