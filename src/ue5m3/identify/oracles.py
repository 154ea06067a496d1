"""Oracles: whatever computes the reference outputs of probe GEMMs, behind one interface.

* :class:`EmulatorOracle`: a software output model with hidden parameters, for self-tests and the CPU pipeline.
  Candidates that :func:`ue5m3.numerics.gemm.matmul` implements (the ``probe_matched`` family) run through it on
  the whole GEMM -- an implementation independent of the fitter's cell-wise one; others run cell-wise.
* :class:`RecordedOracle`: replays outputs saved by :func:`record` (from any oracle, e.g. on a GPU node), tied
  to the corpus by its SHA-256, so a fit is reproducible offline.
* :class:`HopperFP8Oracle`: ``torch._scaled_mm`` with FP8 E4M3 operands and unit per-tensor scales on an
  H100/H200 (compute capability 9.x), with ``use_fast_accum`` on or off. Fails closed elsewhere.
* :class:`NativeNVFP4Oracle`: Transformer Engine's NVFP4 forward GEMM on Blackwell (``te.Linear`` under an
  ``NVFP4BlockScaling`` recipe without RHT, SR or 2D blocks). The probe operands are fixed points of the NVFP4
  quantizer TE runs, so TE multiplies exactly the payloads and scales the candidates see. Fails closed elsewhere.

Every oracle returns the FP32 outputs of a probe's cells and a JSON-able ``describe()`` for provenance.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ue5m3.artifacts import atomic_path, provenance
from ue5m3.identify.candidates import Candidate, accumulate_cells, parse
from ue5m3.identify.corpus import Corpus
from ue5m3.identify.probes import FP8, Probe
from ue5m3.numerics.gemm import matmul
from ue5m3.training.checkpoint import file_sha256

__all__ = [
    "OracleConfig",
    "check_spec",
    "Oracle",
    "OracleUnavailable",
    "EmulatorOracle",
    "RecordedOracle",
    "HopperFP8Oracle",
    "NativeNVFP4Oracle",
    "record",
    "make_oracle",
]


class OracleUnavailable(RuntimeError):
    """The oracle's hardware or software is not present on this machine."""


class Oracle(Protocol):
    name: str

    def outputs(self, probe: Probe) -> torch.Tensor:
        """FP32 [C] outputs of the probe's cells."""
        ...

    def describe(self) -> dict[str, Any]:
        """What produced the outputs (kind, parameters, device, versions)."""
        ...


def _cells(full: torch.Tensor, probe: Probe) -> torch.Tensor:
    return full[probe.rows, probe.cols].to(torch.float32).cpu()


class EmulatorOracle:
    """A software output model whose parameters the fitter must recover."""

    def __init__(self, candidate: Candidate | str) -> None:
        self.candidate = parse(candidate) if isinstance(candidate, str) else candidate
        self.name = f"emulator:{self.candidate.name}"

    def _gemm_kwargs(self) -> dict[str, Any] | None:
        c = self.candidate
        if c.promotion is not None or c.slice_width is None:
            return None
        if c.partial_bits is None:
            return {
                "model": "probe_matched",
                "slice_width": c.slice_width,
                "cross_slice_rounding": c.rounding,
                "final_grid": c.final_grid,
            }
        return None  # fused candidates align on leading bits: gemm's mma_sim aligns on scale exponents

    def outputs(self, probe: Probe) -> torch.Tensor:
        kwargs = self._gemm_kwargs()
        if kwargs is not None and probe.scheme != FP8 and probe.shape[1] % kwargs["slice_width"] == 0:
            return _cells(matmul(*probe.quantized(), **kwargs), probe)
        _, _, alpha = probe.encoded()
        return accumulate_cells(probe.products(), self.candidate, block=probe.block) * alpha

    def describe(self) -> dict[str, Any]:
        return {"kind": "emulator", "hidden_candidate": self.candidate.name}


class RecordedOracle:
    """Outputs saved by :func:`record`, checked against the corpus they were recorded on."""

    def __init__(self, path: str | os.PathLike[str], corpus_path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"recorded oracle outputs {self.path} do not exist; record them with 'ue5m3 record-oracle'"
            )
        try:
            with safe_open(str(self.path), framework="pt") as handle:
                self.header = json.loads((handle.metadata() or {})["ue5m3_oracle"])
                self._outputs = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
        except Exception as err:
            raise ValueError(f"{self.path} is not a readable ue5m3 oracle recording ({err})") from err
        if corpus_path is not None:
            digest = file_sha256(corpus_path)
            if digest != self.header["corpus_sha256"]:
                raise ValueError(
                    f"{self.path} was recorded on corpus sha256 {self.header['corpus_sha256'][:12]}..., but "
                    f"{corpus_path} has sha256 {digest[:12]}...; record the oracle on this corpus"
                )
        self.name = f"recorded:{self.header['oracle']['kind']}"

    def outputs(self, probe: Probe) -> torch.Tensor:
        if probe.family not in self._outputs:
            raise KeyError(f"{self.path} holds no outputs for probe {probe.family!r}")
        out = self._outputs[probe.family]
        if out.shape != probe.rows.shape:
            raise ValueError(
                f"{self.path}: probe {probe.family!r} has {probe.rows.numel()} cells, recording {out.numel()}"
            )
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "recorded",
            "path": str(self.path),
            "recorded": self.header["oracle"],
            "corpus_sha256": self.header["corpus_sha256"],
        }


def _cuda_device(minimum: tuple[int, int], maximum_major: int | None, what: str) -> torch.device:
    if not torch.cuda.is_available():
        raise OracleUnavailable(
            f"{what} needs a CUDA GPU; none is available here. Record it on a GPU node "
            "('ue5m3 record-oracle') and fit with --oracle recorded:<file>."
        )
    capability = torch.cuda.get_device_capability()
    if capability < minimum or (maximum_major is not None and capability[0] > maximum_major):
        raise OracleUnavailable(
            f"{what} needs compute capability {minimum[0]}.{minimum[1]}"
            f"{'' if maximum_major is None else f' to {maximum_major}.x'}; this GPU "
            f"({torch.cuda.get_device_name()}) has {capability[0]}.{capability[1]}"
        )
    return torch.device("cuda")


class HopperFP8Oracle:
    """FP8 E4M3 GEMMs through ``torch._scaled_mm`` on Hopper, outputs in FP32."""

    def __init__(self, *, fast_accum: bool = False) -> None:
        self.fast_accum = fast_accum
        self.name = f"hopper_fp8{':fast' if fast_accum else ''}"
        self.device = _cuda_device((9, 0), 9, "the hopper_fp8 oracle")
        if not hasattr(torch, "_scaled_mm"):
            raise OracleUnavailable(f"torch {torch.__version__} has no torch._scaled_mm")

    def outputs(self, probe: Probe) -> torch.Tensor:
        if probe.scheme != FP8:
            raise ValueError(f"hopper_fp8 needs an fp8_e4m3 corpus, probe {probe.family!r} is {probe.scheme}")
        m, k, n = probe.shape
        pad_m, pad_n = -m % 16, -n % 16  # _scaled_mm wants multiples of 16; zero rows/cols change no cell
        a = torch.nn.functional.pad(probe.a, (0, 0, 0, pad_m)).to(self.device, torch.float8_e4m3fn)
        b = torch.nn.functional.pad(probe.b, (0, pad_n)).to(self.device)
        b = b.T.contiguous().to(torch.float8_e4m3fn).T  # column-major B, as cuBLASLt FP8 requires
        one = torch.ones((), device=self.device, dtype=torch.float32)
        out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=self.fast_accum)
        out = out[0] if isinstance(out, tuple) else out  # torch < 2.4 also returned the output amax
        return _cells(out[:m, :n], probe)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "hopper_fp8",
            "use_fast_accum": self.fast_accum,
            "device": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
            "cuda": torch.version.cuda,
        }


class NativeNVFP4Oracle:
    """Transformer Engine NVFP4 forward GEMMs on Blackwell: y = x @ W^T with x = A and W = B^T, FP32 out."""

    def __init__(self) -> None:
        from ue5m3.layers.native_te import NativeUnavailable, autocast_with, require_native  # noqa: PLC0415

        try:
            self.te = require_native()
        except NativeUnavailable as err:
            raise OracleUnavailable(f"the native_te_nvfp4 oracle cannot run here: {err}") from err
        from transformer_engine.common import recipe as te_recipes  # noqa: PLC0415

        self.recipe = te_recipes.NVFP4BlockScaling(
            disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True
        )
        self.autocast = autocast_with
        self.name = "native_te_nvfp4"

    def outputs(self, probe: Probe) -> torch.Tensor:
        if probe.scheme != "nvfp4":
            raise ValueError(f"native_te_nvfp4 needs an nvfp4 corpus, probe {probe.family!r} is {probe.scheme}")
        m, k, n = probe.shape
        # TE's FP4 GEMMs want row counts in multiples of 16 (32 to be safe); zero rows and columns change neither
        # the tensor amaxes nor any block scale, hence no cell.
        a = torch.nn.functional.pad(probe.a, (0, 0, 0, -m % 32))
        w = torch.nn.functional.pad(probe.b.T, (0, 0, 0, -n % 32))
        layer = self.te.Linear(k, w.shape[0], bias=False, params_dtype=torch.float32, device="cuda")
        with torch.no_grad():
            layer.weight.copy_(w)
        with torch.no_grad(), self.autocast(self.recipe):
            out = layer(a.cuda())
        return _cells(out[:m, :n], probe)

    def describe(self) -> dict[str, Any]:
        import transformer_engine  # noqa: PLC0415

        return {
            "kind": "native_te_nvfp4",
            "device": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
            "transformer_engine": getattr(transformer_engine, "__version__", None),
        }


ORACLE_SPELLINGS = "emulator:<candidate>, recorded:<file>, hopper_fp8[:fast] or native_te_nvfp4"


def check_spec(spec: str) -> None:
    """Refuse a malformed oracle spec (naming it and the accepted spellings) without touching any hardware: the
    pipeline checks every fit's oracle before a job starts."""
    if not isinstance(spec, str):
        raise TypeError(f"an oracle spec is a string ({ORACLE_SPELLINGS}), got {type(spec).__name__} {spec!r}")
    kind, _, arg = spec.partition(":")
    accepted = {
        "emulator": bool(arg),
        "recorded": bool(arg),
        "hopper_fp8": arg in ("", "fast"),
        "native_te_nvfp4": not arg,
    }
    if not accepted.get(kind, False):
        raise ValueError(f"unknown oracle {spec!r}; use {ORACLE_SPELLINGS}")
    if kind == "emulator":
        parse(arg)  # an unknown candidate is refused, naming it


@dataclass(frozen=True, kw_only=True)
class OracleConfig:
    """Settings of ``ue5m3 record-oracle``: which oracle computes the reference outputs.

    Attributes:
        oracle: ``emulator:<candidate>`` (a software model with hidden parameters), ``recorded:<file>``,
            ``hopper_fp8[:fast]`` (H100/H200, ``torch._scaled_mm``) or ``native_te_nvfp4`` (Blackwell + Transformer
            Engine).
    """

    oracle: str

    def __post_init__(self) -> None:
        check_spec(self.oracle)


def make_oracle(spec: str, *, corpus_path: str | os.PathLike[str] | None = None) -> Oracle:
    """An oracle from its spelling (:func:`check_spec`): ``emulator:<candidate>``, ``recorded:<file>``,
    ``hopper_fp8``, ``hopper_fp8:fast`` or ``native_te_nvfp4``."""
    check_spec(spec)
    kind, _, arg = spec.partition(":")
    if kind == "emulator":
        return EmulatorOracle(arg)
    if kind == "recorded":
        return RecordedOracle(arg, corpus_path)
    if kind == "hopper_fp8":
        return HopperFP8Oracle(fast_accum=arg == "fast")
    return NativeNVFP4Oracle()


def record(oracle: Oracle, corpus: Corpus, corpus_path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Run ``oracle`` on every probe of the corpus saved at ``corpus_path`` and save the outputs atomically."""
    outputs = {name: oracle.outputs(probe).contiguous() for name, probe in corpus.probes.items()}
    header = {
        "oracle": oracle.describe(),
        "corpus_sha256": file_sha256(corpus_path),
        "provenance": provenance("record-oracle", {"oracle": oracle.name, "corpus": str(corpus_path)}),
    }
    out = Path(out)
    with atomic_path(out) as tmp:
        save_file(outputs, str(tmp), metadata={"ue5m3_oracle": json.dumps(header, sort_keys=True)})
    return out
