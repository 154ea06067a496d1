"""The argument checks of :func:`~ue5m3.numerics.quantize.quantize` and
:func:`~ue5m3.numerics.quantize.quantize_both_axes`: everything a caller can get wrong, refused before any work.

Each check raises a ``TypeError`` (a wrong type or dtype) or a ``ValueError`` (a wrong value, shape or device) whose
message starts with the function and names the argument and what it got, e.g. ``quantize(): axis must be an int,
got str 'a'``. The checks read Python types and tensor metadata only (dtype, shape, device), never tensor values,
so they cost no host synchronisation on an accelerator. The checks that must read values stay where the values are
read: the finiteness of ``x`` and of ``tensor_amax`` (deferred to the device when the caller passes ``checks``),
the range of ``random_bits`` and the scheme's target range (:class:`~ue5m3.numerics.schemes.BlockScheme`).
"""

from __future__ import annotations

import numbers

import torch

from ue5m3.numerics.backend import Backend
from ue5m3.numerics.checks import DeferredChecks
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.philox import ElementIndex, RandomStream
from ue5m3.numerics.schemes import BlockScheme, get_scheme

__all__ = [
    "FLOATING_DTYPES",
    "check_input",
    "check_quantize_arguments",
    "check_request_fields",
    "check_backend",
    "resolve_scheme",
]

FLOATING_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# integer dtypes torch reduces (min/max) on every device: the range check of random_bits needs them
_RANDOM_BIT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _got(value: object) -> str:
    """How a message shows a wrong value: its type and, for small values, its repr."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 60 else type(value).__name__


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _dtypes(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_input(caller: str, x: object, name: object, checks: object) -> torch.Tensor:
    """``x`` a floating-point torch.Tensor, returned; ``name`` a string; ``checks`` None or a DeferredChecks, and
    given for a meta tensor."""
    if not isinstance(name, str):
        raise TypeError(f"{caller}: name must be a str, got {_got(name)}")
    x_named = "x" if name == "x" else f"x ({name!r})"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{caller}: {x_named} must be a torch.Tensor, got {_got(x)}")
    if x.dtype not in FLOATING_DTYPES:
        raise TypeError(f"{caller}: {x_named} must be floating point ({_dtypes(FLOATING_DTYPES)}), got {x.dtype}")
    _check_optional(caller, "checks", checks, DeferredChecks, "a DeferredChecks")
    if x.device.type == "meta" and checks is None:
        # A meta tensor has a shape and no values: it quantizes (shapes, dtypes, no data) when nothing is read back,
        # which the finiteness checks would do unless they are deferred.
        raise ValueError(
            f"{caller}: {x_named} is a meta tensor (a shape without values); it quantizes only with "
            "checks=DeferredChecks(), which defers the finiteness checks that would read its values"
        )
    return x


def _check_rounding(caller: str, label: str, rounding: object) -> Rounding:
    try:
        return Rounding(rounding)
    except (TypeError, ValueError):
        known = [r.value for r in Rounding]
        raise ValueError(f"{caller}: {label} must be one of {known}, got {_got(rounding)}") from None


def _check_target(caller: str, label: str, target: object) -> None:
    if target is not None and not _is_real(target):
        raise TypeError(f"{caller}: {label} must be a number or None, got {_got(target)}")


def _check_tensor_amax(caller: str, label: str, tensor_amax: object, x: torch.Tensor) -> None:
    """None, a real number, or a one-element real tensor on x's device or the CPU (its value is checked when it is
    read)."""
    if tensor_amax is None or _is_real(tensor_amax):
        return
    if not isinstance(tensor_amax, torch.Tensor):
        raise TypeError(f"{caller}: {label} must be a float, a one-element tensor or None, got {_got(tensor_amax)}")
    if tensor_amax.dtype == torch.bool or tensor_amax.dtype.is_complex:
        raise TypeError(f"{caller}: {label} must be a real tensor, got {_got(tensor_amax)}")
    if tensor_amax.numel() != 1:
        raise ValueError(f"{caller}: {label} must hold one value (a 0-dim tensor or a float), got {_got(tensor_amax)}")
    if tensor_amax.device not in (x.device, torch.device("cpu")):  # a CPU scalar combines with any device
        raise ValueError(
            f"{caller}: {label} must be on x's device {x.device} or the CPU, got {_got(tensor_amax)}; move it with "
            ".to(x.device)"
        )


def _check_optional(caller: str, label: str, value: object, kind: type, what: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{caller}: {label} must be {what} or None, got {_got(value)}")


def check_request_fields(
    caller: str,
    label: str,
    x: torch.Tensor,
    *,
    rounding: object,
    target: object,
    tensor_amax: object,
    stream: object,
    index: object,
    name: object,
) -> Rounding:
    """The per-quantization settings (those an :class:`~ue5m3.numerics.quantize.AxisQuantization` holds), named
    ``label`` + field in messages; returns the rounding."""
    if not isinstance(name, str):
        raise TypeError(f"{caller}: {label}name must be a str, got {_got(name)}")
    mode = _check_rounding(caller, f"{label}rounding", rounding)
    _check_target(caller, f"{label}target", target)
    _check_tensor_amax(caller, f"{label}tensor_amax", tensor_amax, x)
    _check_optional(caller, f"{label}stream", stream, RandomStream, "a philox.RandomStream")
    _check_optional(caller, f"{label}index", index, ElementIndex, "a philox.ElementIndex")
    return mode


def check_quantize_arguments(
    caller: str,
    x: object,
    *,
    tensor_amax: object,
    target: object,
    rounding: object,
    two_d: object,
    axis: object,
    random_bits: object,
    generator: object,
    stream: object,
    index: object,
    name: object,
    backend: object,
    checks: object,
) -> tuple[Rounding, Backend]:
    """Every argument of :func:`~ue5m3.numerics.quantize.quantize` but the scheme (which
    :func:`~ue5m3.numerics.schemes.get_scheme` checks); returns the rounding and the backend."""
    x = check_input(caller, x, name, checks)
    mode = check_request_fields(
        caller, "", x, rounding=rounding, target=target, tensor_amax=tensor_amax, stream=stream, index=index, name=name
    )
    chosen = check_backend(caller, backend)
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{caller}: axis must be an int, got {_got(axis)}")
    if not isinstance(two_d, bool):
        raise TypeError(f"{caller}: two_d must be a bool, got {_got(two_d)}")
    if random_bits is not None:
        if not isinstance(random_bits, torch.Tensor) or random_bits.dtype not in _RANDOM_BIT_DTYPES:
            allowed = _dtypes(_RANDOM_BIT_DTYPES)
            raise TypeError(f"{caller}: random_bits must be an integer tensor ({allowed}), got {_got(random_bits)}")
        if random_bits.device != x.device:
            raise ValueError(f"{caller}: random_bits must be on x's device {x.device}, got {_got(random_bits)}")
        if random_bits.device.type == "meta":
            raise ValueError(f"{caller}: random_bits on the meta device hold no values to check; pass real bits")
    _check_optional(caller, "generator", generator, torch.Generator, "a torch.Generator")
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"{caller}: generator must be a CPU torch.Generator (seeds are drawn on the host)")
    return mode, chosen


def check_backend(caller: str, backend: object) -> Backend:
    try:
        return Backend(backend)
    except (TypeError, ValueError):
        raise ValueError(
            f"{caller}: backend must be one of {[b.value for b in Backend]}, got {_got(backend)}"
        ) from None


def resolve_scheme(scheme: str | BlockScheme, *, target: float | None, tensor_amax: object, name: str) -> BlockScheme:
    """The scheme object (looked up by name) with the target override applied (the scheme checks its range); a
    tensor reference for a scheme without a tensor scale is refused, since it would be ignored."""
    resolved = get_scheme(scheme)
    if target is not None:
        resolved = resolved.with_target(target)
    if tensor_amax is not None and not resolved.uses_tensor_amax:
        raise ValueError(
            f"tensor {name!r}: scheme {resolved.name!r} ({resolved.scale_rule.value}) has no tensor scale, so a "
            "tensor_amax would be ignored; pass None"
        )
    return resolved
