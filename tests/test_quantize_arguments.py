"""Tests for ue5m3.numerics.arguments: quantize() and quantize_both_axes() refuse every malformed argument up front,
with a TypeError or ValueError that names the argument; the arguments that work keep working."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from ue5m3.numerics import backend, quantized, schemes
from ue5m3.numerics import quantize as quantize_module
from ue5m3.numerics.checks import DeferredChecks
from ue5m3.numerics.philox import RandomStream
from ue5m3.numerics.quantize import AxisQuantization, quantize, quantize_both_axes

X = torch.linspace(-3.0, 3.0, 4 * 32).reshape(4, 32)

# (keyword arguments of quantize, exception type, the start of the message)
BAD_ARGUMENTS = {
    "axis_float": ({"axis": 1.0}, TypeError, "quantize(): axis must be an int, got float 1.0"),
    "axis_str": ({"axis": "a"}, TypeError, "quantize(): axis must be an int, got str 'a'"),
    "axis_bool": ({"axis": True}, TypeError, "quantize(): axis must be an int, got bool True"),
    "two_d_str": ({"two_d": "yes"}, TypeError, "quantize(): two_d must be a bool, got str 'yes'"),
    "name_int": ({"name": 3}, TypeError, "quantize(): name must be a str, got int 3"),
    "tensor_amax_two_elements": (
        {"tensor_amax": torch.tensor([1.0, 2.0])},
        ValueError,
        "quantize(): tensor_amax must hold one value",
    ),
    "tensor_amax_list": ({"tensor_amax": [1.0]}, TypeError, "quantize(): tensor_amax must be a float"),
    "tensor_amax_str": ({"tensor_amax": "1"}, TypeError, "quantize(): tensor_amax must be a float"),
    "tensor_amax_bool_tensor": (
        {"tensor_amax": torch.tensor(True)},
        TypeError,
        "quantize(): tensor_amax must be a real tensor",
    ),
    "tensor_amax_numpy": ({"tensor_amax": np.array([1.0, 2.0])}, TypeError, "quantize(): tensor_amax must be"),
    "tensor_amax_other_device": (
        {"tensor_amax": torch.ones((), device="meta")},
        ValueError,
        "quantize(): tensor_amax must be on x's device",
    ),
    "random_bits_uint32": (
        {"rounding": "sr", "random_bits": torch.zeros(4, 32, dtype=torch.uint32)},
        TypeError,
        "quantize(): random_bits must be an integer tensor",
    ),
    "random_bits_uint64": (
        {"rounding": "sr", "random_bits": torch.zeros(4, 32, dtype=torch.uint64)},
        TypeError,
        "quantize(): random_bits must be an integer tensor",
    ),
    "random_bits_float": (
        {"rounding": "sr", "random_bits": torch.zeros(4, 32)},
        TypeError,
        "quantize(): random_bits must be an integer tensor",
    ),
    "random_bits_numpy": (
        {"rounding": "sr", "random_bits": np.zeros((4, 32), dtype=np.int64)},
        TypeError,
        "quantize(): random_bits must be an integer tensor",
    ),
    "random_bits_other_device": (
        {"rounding": "sr", "random_bits": torch.zeros(4, 32, dtype=torch.int64, device="meta")},
        ValueError,
        "quantize(): random_bits must be on x's device",
    ),
    "generator_int": ({"rounding": "sr", "generator": 5}, TypeError, "quantize(): generator must be a torch.Generator"),
    "generator_int_rne": ({"generator": 5}, TypeError, "quantize(): generator must be a torch.Generator"),
    "stream_str": ({"rounding": "sr", "stream": "abc"}, TypeError, "quantize(): stream must be a philox.RandomStream"),
    "stream_str_rne": ({"stream": "abc"}, TypeError, "quantize(): stream must be a philox.RandomStream"),
    "index_str": ({"rounding": "sr", "index": "abc"}, TypeError, "quantize(): index must be a philox.ElementIndex"),
    "checks_int": ({"checks": 3}, TypeError, "quantize(): checks must be a DeferredChecks"),
    "target_str": ({"target": "448"}, TypeError, "quantize(): target must be a number or None, got str '448'"),
    "target_bool": ({"target": True}, TypeError, "quantize(): target must be a number or None, got bool True"),
    "target_nan": ({"target": float("nan")}, ValueError, "scheme 'ue5m3_b16': target must be positive and finite"),
    "rounding_unknown": ({"rounding": "nearest"}, ValueError, "quantize(): rounding must be one of ['rne'"),
    "rounding_int": ({"rounding": 3}, ValueError, "quantize(): rounding must be one of"),
    "backend_unknown": ({"backend": "cuda"}, ValueError, "quantize(): backend must be one of ['auto'"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_quantize_refuses_a_malformed_argument_naming_it(case):
    kwargs, error, message = BAD_ARGUMENTS[case]
    with pytest.raises(error, match="^" + re.escape(message)):
        quantize(X, "ue5m3_b16", **kwargs)


@pytest.mark.parametrize(
    "x, shown",
    [
        pytest.param([1.0] * 32, "got list", id="list"),
        pytest.param(None, "got NoneType None", id="None"),
        pytest.param(np.ones((2, 32), dtype=np.float32), "got ndarray", id="numpy"),
        pytest.param(3.0, "got float 3.0", id="float"),
    ],
)
def test_quantize_refuses_an_input_that_is_not_a_tensor(x, shown):
    with pytest.raises(TypeError, match=re.escape(f"quantize(): x must be a torch.Tensor, {shown}")):
        quantize(x, "nvfp4")


def test_a_numpy_input_is_told_to_be_a_tensor_not_floating_point():
    with pytest.raises(TypeError) as info:
        quantize(np.ones((2, 32), dtype=np.float32), "nvfp4", name="w")
    assert "torch.Tensor" in str(info.value) and "floating point" not in str(info.value)
    assert "'w'" in str(info.value)


def test_an_integer_tensor_is_refused_listing_the_floating_dtypes():
    with pytest.raises(TypeError, match=r"quantize\(\): x must be floating point \(float32, bfloat16.*got torch.int32"):
        quantize(torch.ones(2, 32, dtype=torch.int32), "nvfp4")


def test_a_meta_tensor_needs_deferred_checks_and_real_random_bits():
    x = torch.empty(4, 32, device="meta")
    with pytest.raises(ValueError, match=r"quantize\(\): x is a meta tensor.*checks=DeferredChecks\(\)"):
        quantize(x, "ue5m3_b16")
    bits = torch.zeros(4, 32, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match=r"quantize\(\): random_bits on the meta device"):
        quantize(x, "ue5m3_b16", rounding="sr", random_bits=bits, checks=DeferredChecks())
    # with the checks deferred nothing is read back: shapes come through
    q = quantize(x, "nvfp4", rounding="sr", stream=RandomStream(seed=1), checks=DeferredChecks())
    assert q.payload.shape == (4, 32) and q.payload.device.type == "meta"


@pytest.mark.parametrize(
    "reference",
    [
        pytest.param(2.5, id="float"),
        pytest.param(np.float32(2.5), id="numpy_scalar"),
        pytest.param(torch.tensor(2.5), id="0-dim"),
        pytest.param(torch.tensor([2.5]), id="one_element"),
        pytest.param(torch.tensor([[2.5]], dtype=torch.float64), id="one_element_float64"),
    ],
)
def test_every_form_of_a_one_value_reference_gives_the_same_bits(reference):
    expected = quantize(X, "ue5m3_b16", tensor_amax=2.5, backend="torch")
    q = quantize(X, "ue5m3_b16", tensor_amax=reference, backend="torch")
    assert torch.equal(q.payload, expected.payload) and torch.equal(q.scales, expected.scales)


def test_an_integer_target_is_a_number():
    assert torch.equal(quantize(X, "ue5m3_b16", target=448).payload, quantize(X, "ue5m3_b16").payload)


# ----- quantize_both_axes ------------------------------------------------------------------------------------

BAD_REQUESTS = {
    "last_tensor_amax_two_elements": (
        {"last": AxisQuantization(tensor_amax=torch.ones(2))},
        ValueError,
        "quantize_both_axes(): last.tensor_amax must hold one value",
    ),
    "first_target_str": (
        {"first": AxisQuantization(target="448")},
        TypeError,
        "quantize_both_axes(): first.target must be a number or None, got str '448'",
    ),
    "first_stream_str": (
        {"first": AxisQuantization(rounding="sr", stream="abc")},
        TypeError,
        "quantize_both_axes(): first.stream must be a philox.RandomStream",
    ),
    "last_rounding_unknown": (
        {"last": AxisQuantization(rounding="nearest")},
        ValueError,
        "quantize_both_axes(): last.rounding must be one of",
    ),
    "last_name_int": ({"last": AxisQuantization(name=3)}, TypeError, "quantize_both_axes(): last.name must be a str"),
    "last_not_a_request": ({"last": "abc"}, TypeError, "quantize_both_axes(): last must be an AxisQuantization"),
    "first_a_dict": ({"first": {"rounding": "sr"}}, TypeError, "quantize_both_axes(): first must be an AxisQuant"),
    "transposed_str": ({"transposed": "yes"}, TypeError, "quantize_both_axes(): transposed must be a bool"),
    "backend_unknown": ({"backend": "gpu"}, ValueError, "quantize_both_axes(): backend must be one of"),
    "checks_int": ({"checks": 3}, TypeError, "quantize_both_axes(): checks must be a DeferredChecks"),
    "x_list": ({"x": [[1.0] * 32] * 32}, TypeError, "quantize_both_axes(): x must be a torch.Tensor"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_quantize_both_axes_refuses_a_malformed_argument_naming_it(case):
    arguments = {"x": torch.ones(32, 32), "last": AxisQuantization(), "first": AxisQuantization()}
    changes, error, message = BAD_REQUESTS[case]
    arguments.update(changes)
    x, last, first = arguments.pop("x"), arguments.pop("last"), arguments.pop("first")
    with pytest.raises(error, match="^" + re.escape(message)):
        quantize_both_axes(x, "ue5m3_b16", last, first, **arguments)


# ----- the public names stay where users find them -------------------------------------------------------------


HOMES = {
    schemes: ["ScaleRule", "ScaleOrder", "DequantizeOrder", "BlockScheme", "SCHEMES", "get_scheme"],
    backend: ["Backend"],
    quantized: ["QuantizedTensor", "PackedQuantized", "pack_fp4", "unpack_fp4"],
    quantize_module: ["quantize", "AxisQuantization", "quantize_both_axes", "fake_quantize"],
}


def test_quantize_re_exports_each_public_name_from_its_home():
    assert sorted(quantize_module.__all__) == sorted(name for names in HOMES.values() for name in names)
    for home, names in HOMES.items():
        for name in names:
            assert getattr(quantize_module, name) is getattr(home, name), (name, home.__name__)
