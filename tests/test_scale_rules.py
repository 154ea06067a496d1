"""Tests for ue5m3.numerics.scale_rules and ue5m3.numerics.encode: every scale rule is a plain function with one
signature, the registry covers every rule name, and the torch encoding uses the function it receives (the bits of
each rule against the spec and the oracles are in tests/test_quantize.py)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from ue5m3.numerics import encode, formats
from ue5m3.numerics.formats import E2M1, UE8M0, Rounding
from ue5m3.numerics.layout import BlockLayout
from ue5m3.numerics.quantize import quantize
from ue5m3.numerics.scale_rules import SCALE_RULES, BlockScales, tensor_global_scale
from ue5m3.numerics.schemes import BlockScheme, ScaleOrder, ScaleRule, get_scheme

# the named schemes, the three orders of the tensor-scaled rule and every MX rule
SCHEMES = {s.name: s for s in (get_scheme(n) for n in ("ue5m3_b16", "nvfp4", "mxfp4"))}
SCHEMES |= {f"nvfp4_{o.value}": dataclasses.replace(SCHEMES["nvfp4"], scale_order=o) for o in ScaleOrder}
SCHEMES |= {
    r.value: BlockScheme(
        name=r.value, scale=UE8M0, block_size=32, target=448.0 if r is ScaleRule.MX_ROUND_LOG2 else None, scale_rule=r
    )
    for r in (ScaleRule.MX_CEIL, ScaleRule.MX_RCEIL, ScaleRule.MX_ROUND_LOG2)
}
SCHEMES |= {n: get_scheme(n) for n in ("nvfp4_4over6_mse", "nvfp4_4over6_abs_max", "ue5m3_b16_4over6_mae")}


def test_every_scale_rule_has_one_function_with_the_rule_signature():
    assert set(SCALE_RULES) == set(ScaleRule)
    for rule, function in SCALE_RULES.items():
        parameters = inspect.signature(function).parameters
        assert list(parameters) == ["blocks", "block_amax", "tensor_amax", "global_scale", "scheme"], rule
        kinds = [p.kind for p in parameters.values()]
        assert kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 2 + [inspect.Parameter.KEYWORD_ONLY] * 3, rule


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_the_torch_path_is_the_encoding_with_the_schemes_rule(scheme):
    s = SCHEMES[scheme]
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * torch.logspace(-6, 6, 64)
    layout = BlockLayout.of(x, s.block_size, -1, False, "x")
    blocks = layout.to_blocks(x)
    q = encode.quantize_blocks(
        blocks,
        layout,
        s,
        Rounding.RNE,
        SCALE_RULES[s.scale_rule],
        tensor_amax=None,
        random_bits=None,
        name="x",
        checks=None,
    )
    reference = quantize(x, s, backend="torch")
    for field in ("payload_blocks", "scale_values", "decode_scales_blocks", "global_scale", "tensor_amax"):
        assert torch.equal(getattr(q, field), getattr(reference, field)), field


def test_a_rule_receives_the_block_values_and_its_scales_are_the_ones_encoded():
    """A rule of one's own (here: every scale 1, recording what it was given) is all a new rule needs."""
    s = get_scheme("mxfp4")  # no tensor scale: G = 1, so the payload is x rounded onto E2M1
    x = torch.linspace(-7.0, 7.0, 2 * 32).reshape(2, 32)
    layout = BlockLayout.of(x, s.block_size, -1, False, "x")
    seen = {}

    def unit_scales(blocks, block_amax, *, tensor_amax, global_scale, scheme):
        seen.update(blocks=blocks, block_amax=block_amax, global_scale=global_scale, scheme=scheme)
        ones = torch.ones_like(block_amax)
        return BlockScales(ones, torch.zeros_like(ones, dtype=torch.bool), torch.zeros_like(ones, dtype=torch.bool))

    q = encode.quantize_blocks(
        layout.to_blocks(x),
        layout,
        s,
        Rounding.RNE,
        unit_scales,
        tensor_amax=None,
        random_bits=None,
        name="x",
        checks=None,
    )
    assert torch.equal(seen["blocks"], layout.to_blocks(x)) and seen["scheme"] is s
    assert torch.equal(seen["block_amax"], layout.to_blocks(x).abs().amax(-1, keepdim=True))
    assert torch.equal(seen["global_scale"], tensor_global_scale(s, torch.tensor(7.0)))
    assert torch.equal(q.scales, torch.ones(2, 1))
    assert torch.equal(q.payload, formats.round_to_format(x, E2M1))
    assert int(q.zero_rounded_blocks) == 0 and int(q.saturated_blocks) == 0
